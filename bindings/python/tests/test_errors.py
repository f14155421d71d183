"""Every oi_status maps to its own openinfer.Error subclass with the status and
oi_last_error() text; the reachable ones are triggered for real."""
import os
import tempfile

import pytest

import openinfer as oi
from conftest import LAYOUT_BYTES, layout

ALL = {
    -1: oi.InvalidArgumentError, -2: oi.NotFoundError, -3: oi.OutOfMemoryError,
    -4: oi.TimeoutError, -5: oi.CudaError, -6: oi.IOError, -7: oi.ProtocolError,
    -8: oi.StateError, -9: oi.LeaseExpiredError, -10: oi.ClosedError,
    -11: oi.UnsupportedError, -12: oi.PermissionError, -13: oi.VersionError,
    -14: oi.InternalError, -15: oi.NoDeviceError, -16: oi.BusyError,
    -17: oi.DeadlineError,
}


@pytest.mark.parametrize("status", sorted(ALL))
def test_every_status_has_its_class(status):
    cls = ALL[status]
    assert issubclass(cls, oi.Error) and cls.status == status
    err = oi._error_for(status, "what went wrong")
    assert type(err) is cls
    assert err.status == status and err.message == "what went wrong"
    assert err.status_name == oi.status_name(status) != "OI_ERR_UNKNOWN"
    assert str(err) == err.status_name + ": what went wrong"
    assert len(set(ALL.values())) == len(ALL)


def test_unknown_status():
    err = oi._error_for(-999, "x")
    assert type(err) is oi.UnknownError and err.status == -999
    assert err.status_name == "OI_ERR_UNKNOWN"


def test_invalid_argument_with_message(host):
    with pytest.raises(oi.InvalidArgumentError) as ei:
        host.engine("py/err", [oi.Arena("k", 4, 0, offset=0)], buffer=bytearray(4096))
    assert ei.value.status == -1 and ei.value.message
    with host.engine("py/err", layout(), buffer=bytearray(LAYOUT_BYTES)) as e:
        with pytest.raises(oi.InvalidArgumentError) as ei:
            e.save([10 ** 6], [bytes(16)])
        assert "out of range" in ei.value.message
        with pytest.raises(oi.InvalidArgumentError):
            e.save([0], [b"short"])


def test_no_device():
    with pytest.raises(oi.NoDeviceError) as ei:
        oi.device_info(4096)
    assert ei.value.message


def test_out_of_memory_or_invalid_pool():
    with pytest.raises((oi.OutOfMemoryError, oi.InvalidArgumentError)):
        oi.OffloadHost(1 << 62)
    with pytest.raises(oi.InvalidArgumentError):
        oi.OffloadHost(0)


def test_state_and_closed(host):
    with host.engine("py/err2", layout(), buffer=bytearray(LAYOUT_BYTES)) as e:
        t = e.save([0], oi.hash_blocks(range(16), 16))
        t.wait(10)
        t.set_callback(lambda *a: None)
        with pytest.raises(oi.StateError):
            t.set_callback(lambda *a: None)
    with pytest.raises(oi.ClosedError) as ei:
        e.flush()
    assert ei.value.status == -10


def test_timeout_on_pending_ticket():
    """A ticket that cannot finish: the sidecar save whose reply the test
    holds back is hard to arrange, so wait(0) on a fresh ticket is raced: it
    either finished (fine) or raises TimeoutError and stays usable."""
    with oi.OffloadHost(64 << 20) as h:
        big = 64
        arenas = [oi.Arena("k", big, 256 << 10, offset=0)]
        buf = bytearray(big * (256 << 10))
        with h.engine("py/timeout", arenas, buffer=buf) as e:
            hs = oi.hash_blocks(range(big * 16), 16)
            t = e.save(range(big), hs)
            try:
                t.wait(0)
            except oi.TimeoutError as ex:
                assert ex.status == -4
            t.wait(10)
            assert t.poll()


def cpu_handle(name, size):
    """A cpu arena handle as lib/device/cpu.c lays it out: magic, size, name."""
    return b"OISHM\x01\0\0" + size.to_bytes(8, "little") + name.encode().ljust(48, b"\0")


def test_protocol_not_found_and_bad_handle_on_import():
    name = "/oi-py-test-%d" % os.getpid()
    path = "/dev/shm" + name
    with open(path, "wb") as f:
        f.write(bytes(4096))
    try:
        a = oi.ImportedArena.open(cpu_handle(name, 4096), 4096)
        assert a.size == 4096 and a.ptr != 0
        a.write(0, b"abc")
        assert a.read(0, 3) == b"abc"
        with open(path, "rb") as f:
            assert f.read(3) == b"abc"
        with pytest.raises(oi.InvalidArgumentError):
            a.read(4095, 2)
        a.close()
        with pytest.raises(oi.ClosedError):
            a.read(0, 1)
        # the real allocation is smaller than what the handle promises
        with pytest.raises(oi.ProtocolError) as ei:
            oi.ImportedArena.open(cpu_handle(name, 4096), 1 << 20)
        assert "expected" in ei.value.message
    finally:
        os.unlink(path)
    with pytest.raises(oi.NotFoundError):
        oi.ImportedArena.open(cpu_handle("/oi-py-missing-%d" % os.getpid(), 4096), 4096)
    with pytest.raises(oi.InvalidArgumentError):
        oi.ImportedArena.open(bytes(64), 1)


def test_busy_on_live_socket():
    d = tempfile.mkdtemp(prefix="oi-py-")
    sock = os.path.join(d, "s.sock")
    with oi.Server(sock, 16 << 20).start():
        with pytest.raises(oi.BusyError) as ei:
            oi.Server(sock, 16 << 20)
        assert ei.value.message
    os.rmdir(d)


def test_closed_objects_never_crash(host):
    e = host.engine("py/closed", layout(), buffer=bytearray(LAYOUT_BYTES))
    e.close()
    for call in (lambda: e.save([0], [bytes(16)]), lambda: e.query([bytes(16)]),
                 lambda: e.load(bytes(16), [0]), lambda: e.release(bytes(16)),
                 lambda: e.flush(0), e.stats):
        with pytest.raises(oi.ClosedError):
            call()
    s = oi.Server(os.path.join(tempfile.mkdtemp(prefix="oi-py-"), "s.sock"), 16 << 20)
    s.close()
    with pytest.raises(oi.ClosedError):
        s.start()
    with pytest.raises(oi.ClosedError):
        s.epoch
