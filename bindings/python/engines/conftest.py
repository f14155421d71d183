"""Fixtures of the engine tests: a real `openinfer serve` that a test may stop
and start again on the same socket."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest


class Serve:
    """An `openinfer serve` subprocess on a private socket."""

    def __init__(self, exe, pool="64M"):
        self.exe = exe
        self.pool = pool
        self.dir = tempfile.mkdtemp(prefix="oi-eng-")
        self.socket = os.path.join(self.dir, "oi.sock")
        self.proc = None
        self.logs = []

    def start(self):
        log = open(os.path.join(self.dir, "server-%d.log" % len(self.logs)), "w+")
        self.logs.append(log)
        self.proc = subprocess.Popen(
            [self.exe, "serve", "--socket", self.socket, "--pool", self.pool, "--no-pin",
             "--no-metrics", "--log-level", "info"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while True:
            log.seek(0)
            if "listening on" in log.read():
                return self
            if self.proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                raise RuntimeError("openinfer serve did not start:\n" + log.read())
            time.sleep(0.01)

    def pause(self):
        """SIGSTOP, returning once every thread of the server is stopped (the
        signal is delivered asynchronously: a thread still on a CPU could
        answer one more request)."""
        self.proc.send_signal(signal.SIGSTOP)
        task = "/proc/%d/task" % self.proc.pid
        deadline = time.time() + 5
        while time.time() < deadline:
            states = []
            for t in os.listdir(task):
                try:
                    with open(os.path.join(task, t, "stat")) as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass
            if states and all(s in ("T", "t") for s in states):
                return
            time.sleep(0.001)
        raise RuntimeError("openinfer serve (pid %d) did not stop within 5 s" % self.proc.pid)

    def stop(self, sig=signal.SIGTERM):
        p, self.proc = self.proc, None
        if p is None:
            return 0
        p.send_signal(sig)
        try:
            return p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()

    def log_text(self):
        out = ""
        for log in self.logs:
            log.seek(0)
            out += log.read()
        return out

    def close(self):
        self.stop()
        for log in self.logs:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _serve_exe():
    exe = os.environ.get("OPENINFER_EXE")
    if not exe or not os.path.exists(exe):
        pytest.fail("OPENINFER_EXE (the openinfer tool) is not set")
    return exe


@pytest.fixture
def serve():
    s = Serve(_serve_exe()).start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def serve_big():
    """A server whose pool holds 192 MiB (the default fixture's: 64 MiB)."""
    s = Serve(_serve_exe(), pool="192M").start()
    try:
        yield s
    finally:
        s.close()
