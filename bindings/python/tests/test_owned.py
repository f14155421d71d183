"""Engine-owned sidecar memory: OffloadEngine.connect(buffer=SharedBuffer)
against a real `openinfer serve` subprocess, which is SIGKILLed under the
engine (it degrades: queries miss, saves drop, loads fail) and restarted on
the same socket (the engine reconnects and round trips again)."""
import fcntl
import gc
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import openinfer as oi
from conftest import BPB, LAYOUT_BYTES, expected, fill, layout, read_block

F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)


class ServeProcess:
    """`openinfer serve` on `sock`, started and (SIG)killed by the test."""

    def __init__(self, sock):
        exe = os.environ.get("OPENINFER_EXE")
        if not exe or not os.path.exists(exe):
            pytest.skip("OPENINFER_EXE (the openinfer tool) is not set")
        self.sock = sock
        self.log = open(sock + ".log", "w+")
        self.p = subprocess.Popen([exe, "serve", "--socket", sock, "--pool", "64M",
                                   "--log-level", "info"],
                                  stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while True:
            self.log.seek(0)
            if "listening on" in self.log.read():
                break
            if self.p.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                text = self.log.read()
                self.kill()
                pytest.fail("openinfer serve did not start:\n" + text)
            time.sleep(0.01)

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self.log.close()
        # a SIGKILLed server cannot unlink its shared-memory objects
        prefix = "openinfer-%d-" % self.p.pid
        for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else ():
            if name.startswith(prefix):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(prefix="oi-py-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def wait_for(cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_shared_buffer():
    np = pytest.importorskip("numpy")  # python3-numpy (./dev deps)
    with oi.SharedBuffer(3 * 4096) as sb:
        assert sb.nbytes == len(sb) == 3 * 4096 and sb.fd >= 0
        assert os.fstat(sb.fd).st_size == 3 * 4096
        assert fcntl.fcntl(sb.fd, F_GET_SEALS) & F_SEAL_SHRINK
        with pytest.raises(OSError):  # sealed against shrinking
            os.ftruncate(sb.fd, 4096)
        a = np.frombuffer(sb.view, dtype=np.uint32)
        a[:] = np.arange(a.size, dtype=np.uint32)
        # the mapping is the memfd's: the file sees the writes
        assert os.pread(sb.fd, 8, 4) == bytes(sb.view[4:12]) == \
            np.array([1, 2], dtype=np.uint32).tobytes()
        with pytest.raises(BufferError):  # a view is still exported
            sb.close()
        del a
        fd = sb.fd
    assert sb.closed
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(oi.ClosedError):
        sb.view
    with pytest.raises(oi.InvalidArgumentError):
        oi.SharedBuffer(0)


def test_shared_buffer_as_embedded_memory():
    """An embedded engine takes a SharedBuffer as plain memory (no fd), keeps
    it alive, and lets it close once the engine is closed."""
    with oi.OffloadHost(16 << 20) as host, oi.SharedBuffer(LAYOUT_BYTES) as sb:
        hs = oi.hash_blocks(range(2 * 16), 16)
        kv = sb.view
        with host.engine("py/owned/embedded", layout(), buffer=sb) as e:
            fill(kv, 0, seed=3, block=0)
            fill(kv, 1, seed=3, block=1)
            e.save([0, 1], hs).wait(10)
            kv[:] = bytes(LAYOUT_BYTES)
            q = e.query(hs)
            assert q.hit_blocks == 2
            e.load(q.lease, [3, 2]).wait(10)
            assert read_block(kv, 3) == expected(3, 0)
            assert read_block(kv, 2) == expected(3, 1)
            assert e.stats()["connection"] == oi.CONNECTION_EMBEDDED
            kv.release()
            with pytest.raises(BufferError):  # the engine still uses the mapping
                sb.close()
        sb.close()
        assert sb.closed


def test_connect_bad_owned_buffers(sockdir):
    sock = os.path.join(sockdir, "oi.sock")
    srv = ServeProcess(sock)
    try:
        # cuda: a device pointer needs buffer_size (checked before any call)
        with pytest.raises(oi.InvalidArgumentError):
            oi.OffloadEngine.connect(sock, "py/owned/bad", layout(), device=0, buffer=0x10000)
        # a memory that is not a sealed memfd's mapping: no fd
        with pytest.raises(oi.InvalidArgumentError):
            oi.OffloadEngine.connect(sock, "py/owned/bad", layout(),
                                     buffer=bytearray(LAYOUT_BYTES))
        # the layout reaches past the buffer
        with oi.SharedBuffer(LAYOUT_BYTES // 2) as small:
            with pytest.raises(oi.InvalidArgumentError):
                oi.OffloadEngine.connect(sock, "py/owned/bad", layout(), buffer=small)
        # segment_offsets of the wrong length
        with oi.SharedBuffer(LAYOUT_BYTES) as sb:
            with pytest.raises(oi.InvalidArgumentError):
                oi.OffloadEngine.connect(sock, "py/owned/bad", layout(), buffer=sb,
                                         segment_offsets=[0, 0, 0])
    finally:
        srv.kill()


def test_owned_round_trip_degrade_and_reconnect(sockdir):
    sock = os.path.join(sockdir, "oi.sock")
    ns = "py/owned"
    srv = ServeProcess(sock)
    hs = oi.hash_blocks(range(3 * 16), 16)
    # the engine keeps the SharedBuffer alive: no reference is kept here but a view
    sb = oi.SharedBuffer(LAYOUT_BYTES)
    kv = sb.view
    e, arena = oi.OffloadEngine.connect(sock, ns, layout(), buffer=sb, instance_name="owned")
    del sb
    gc.collect()
    try:
        assert arena is None and e.imported_arena is None
        st = e.stats()
        assert st["connection"] == oi.CONNECTION_CONNECTED
        assert st["server_epoch"] != 0 and st["reconnects"] == 0
        epoch1 = st["server_epoch"]

        for b in range(3):
            fill(kv, b, seed=11, block=b)
        t = e.save([0, 1, 2], hs, counts=True)
        t.wait(30)
        assert t.save_result == (3, 0, 0)
        e.flush(30)
        kv[:] = bytes(LAYOUT_BYTES)
        q = e.query(hs)
        assert q.hit_blocks == 3
        e.load(q.lease, [9, 4, 13]).wait(30)
        for block, slot in enumerate([9, 4, 13]):
            assert read_block(kv, slot) == expected(11, block)
        st = e.stats()
        assert st["saves_completed"] == 3 and st["blocks_loaded"] == 3
        assert st["loads_submitted"] == 1 and st["namespace_blocks_resident"] == 3

        # a sidecar load has no per-arena progress: arena_wait waits for the
        # whole ticket and raises the error only the server sees
        t = e.load(q.lease, [0, 1, 2], arena_events=True)
        with pytest.raises(oi.LeaseExpiredError):
            t.arena_wait(1, timeout=30)
        with pytest.raises(oi.LeaseExpiredError):
            t.arena_poll(0)
        held = e.query(hs[:2])  # a lease taken before the server dies
        assert held.hit_blocks == 2

        srv.kill()
        # the engine notices and degrades: queries miss...
        assert wait_for(lambda: e.query(hs).hit_blocks == 0 and
                        e.stats()["connection"] == oi.CONNECTION_DEGRADED), e.stats()
        st = e.stats()
        assert st["server_epoch"] == 0
        misses = st["disconnected_query_misses"]
        assert misses >= 3
        assert e.query(hs).hit_blocks == 0
        assert e.stats()["disconnected_query_misses"] == misses + 3
        # ...saves are dropped (the ticket completes OK at once)...
        dropped = st["disconnected_saves"]
        hs2 = oi.hash_blocks(range(1000, 1000 + 2 * 16), 16)
        for b in range(2):
            fill(kv, 5 + b, seed=22, block=b)
        e.save([5, 6], hs2).wait(10)
        assert e.stats()["disconnected_saves"] == dropped + 2
        # ...loads fail
        with pytest.raises(oi.ClosedError):
            e.load(held.lease, [0, 1]).wait(10)
        e.flush(10)

        # a server comes back on the same socket: the engine registers again
        srv = ServeProcess(sock)
        assert wait_for(lambda: e.stats()["connection"] == oi.CONNECTION_CONNECTED and
                        e.stats()["reconnects"] >= 1), e.stats()
        st = e.stats()
        assert st["server_epoch"] not in (0, epoch1)
        # the new server holds nothing; a round trip works again
        assert e.query(hs).hit_blocks == 0
        e.save([5, 6], hs2).wait(30)
        e.flush(30)
        kv[:] = bytes(LAYOUT_BYTES)
        q = e.query(hs2)
        assert q.hit_blocks == 2
        e.load(q.lease, [1, 0]).wait(30)
        assert read_block(kv, 1) == expected(22, 0)
        assert read_block(kv, 0) == expected(22, 1)
    finally:
        e.close()
        srv.kill()
    kv.release()
    gc.collect()
