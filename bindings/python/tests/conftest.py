import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import openinfer as oi

BLOCKS = 16
BPB = 4096  # bytes per block per arena
LAYOUT_BYTES = 2 * BLOCKS * BPB


def layout():
    """Two arenas ("k", "v") by offset in one buffer."""
    return [oi.Arena("k", BLOCKS, BPB, offset=0),
            oi.Arena("v", BLOCKS, BPB, offset=BLOCKS * BPB)]


def pattern(seed, block, arena):
    """4096 bytes that depend on (seed, logical block, arena)."""
    b = bytes(((seed * 131 + block * 31 + arena * 7 + i) * 2654435761 >> 13) & 0xFF
              for i in range(256))
    return b * (BPB // 256)


def fill(buf, slot, seed, block, write=None):
    for a in range(2):
        off = a * BLOCKS * BPB + slot * BPB
        data = pattern(seed, block, a)
        if write is not None:
            write(off, data)
        else:
            buf[off:off + BPB] = data


def read_block(buf, slot, read=None):
    out = b""
    for a in range(2):
        off = a * BLOCKS * BPB + slot * BPB
        out += read(off, BPB) if read is not None else bytes(buf[off:off + BPB])
    return out


def expected(seed, block):
    return pattern(seed, block, 0) + pattern(seed, block, 1)


@pytest.fixture
def host():
    h = oi.OffloadHost(16 << 20)
    yield h
    h.close()


@pytest.fixture
def serve():
    """A real `openinfer serve` subprocess on a private socket; yields the path."""
    exe = os.environ.get("OPENINFER_EXE")
    if not exe or not os.path.exists(exe):
        pytest.skip("OPENINFER_EXE (the openinfer tool) is not set")
    d = tempfile.mkdtemp(prefix="oi-py-")
    sock = os.path.join(d, "oi.sock")
    log = open(os.path.join(d, "server.log"), "w+")
    p = subprocess.Popen([exe, "serve", "--socket", sock, "--pool", "64M", "--log-level", "info"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 10
        while True:
            log.seek(0)
            if "listening on" in log.read():
                break
            if p.poll() is not None or time.time() > deadline:
                log.seek(0)
                pytest.fail("openinfer serve did not start:\n" + log.read())
            time.sleep(0.01)
        yield sock
    finally:
        p.terminate()
        try:
            rc = p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        log.seek(0)
        text = log.read()
        log.close()
        shutil.rmtree(d, ignore_errors=True)
        assert rc == 0, "openinfer serve exited with %s:\n%s" % (rc, text)


@pytest.fixture(autouse=True, scope="session")
def _private_tempdir():
    """Every temporary directory the tests make (tempfile.mkdtemp) lives in
    one that is removed when the session ends, also when a test failed
    before its own clean-up: runs leave no /tmp/oi-py-* behind."""
    root = tempfile.mkdtemp(prefix="oi-pytest-")
    saved = tempfile.tempdir
    tempfile.tempdir = root
    try:
        yield root
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(root, ignore_errors=True)
