"""The disk tier from Python (cpu backend): blocks written behind to disk,
promoted back after the pool evicted them, and found again by a new host on
the same directory (a restart); bytes compared."""
import os
import time

import pytest

import openinfer as oi

BLOCK = 16384
N = 12


def _rig(disk_dir):
    host = oi.OffloadHost(4 << 20, pin=False)
    host.attach_disk([disk_dir], 32 << 20)
    buf = bytearray(2 * N * BLOCK)
    eng = oi.OffloadEngine(host, "py/disk", [oi.Arena("kv", 2 * N, BLOCK)], buffer=buf)
    return host, eng, buf


def _pattern(b):
    return bytes((b * 31 + i * 7) & 0xFF for i in range(BLOCK))


def _load_and_check(eng, hs):
    q = eng.query(hs, wait_pending=10)
    assert q.hit_blocks == N
    dst = list(range(N, 2 * N))
    eng.load(q.lease, dst).wait(10)
    return dst


def test_disk_round_trip_and_restart(tmp_path):
    disk_dir = str(tmp_path / "disk")
    os.mkdir(disk_dir, 0o700)
    hs = oi.hash_blocks(list(range(N * 16)), 16)
    host, eng, buf = _rig(disk_dir)
    for b in range(N):
        buf[b * BLOCK:(b + 1) * BLOCK] = _pattern(b)
    eng.save(list(range(N)), hs).wait(10)
    eng.flush(10)
    deadline = time.monotonic() + 10
    while host.disk_stats()["spills"] < N and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host.disk_stats()["spills"] == N
    host.evict_all()
    assert host.stats()["blocks_sealed"] == 0
    assert eng.query_membership(hs) == bytearray([1] * N)  # on disk counts as present
    for b, d in enumerate(_load_and_check(eng, hs)):
        assert bytes(buf[d * BLOCK:(d + 1) * BLOCK]) == _pattern(b)
    st = host.disk_stats()
    assert st["promotions"] == N and st["checksum_failures"] == 0
    eng.close()
    host.close()

    host, eng, buf = _rig(disk_dir)  # a restart on the same directory
    assert host.disk_stats()["blocks"] == N
    for b, d in enumerate(_load_and_check(eng, hs)):
        assert bytes(buf[d * BLOCK:(d + 1) * BLOCK]) == _pattern(b)
    eng.close()
    host.close()


def test_disk_refusals(tmp_path):
    host = oi.OffloadHost(1 << 20, pin=False)
    with pytest.raises(oi.NotFoundError):
        host.disk_stats()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(oi.PermissionError) as e:
        host.attach_disk(str(open_dir), 8 << 20)
    assert "writable" in str(e.value) or "others" in str(e.value)
    with pytest.raises(oi.InvalidArgumentError):
        host.attach_disk([], 8 << 20)
    host.close()
