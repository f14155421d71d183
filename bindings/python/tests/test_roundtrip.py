"""Embedded host + engine on the cpu backend: save -> query -> load, bytes compared."""
import mmap
import threading

import pytest

import openinfer as oi
from conftest import BLOCKS, BPB, LAYOUT_BYTES, expected, fill, layout, read_block


def tokens(n, start=1000):
    return list(range(start, start + n))


def test_version_and_device():
    assert oi.version() >> 16 == 0
    assert oi.version_string().startswith("0.1.0")
    assert oi.device_count() >= 0
    info = oi.device_info(oi.DEVICE_CPU)
    assert info["backend"] == "cpu" and info["name"] == "cpu"


def test_hash_blocks_chain():
    hs = oi.hash_blocks(tokens(40), 16)
    assert len(hs) == 2 and all(len(h) == 16 for h in hs)
    # the chain: block 1 hashed alone with block 0 as parent gives the same
    assert oi.hash_blocks(tokens(16, 1016), 16, parent=hs[0]) == [hs[1]]
    assert oi.hash_blocks(tokens(40), 16, salt=b"lora-1") != hs
    with pytest.raises(oi.InvalidArgumentError):
        oi.hash_blocks(tokens(4), 0)


@pytest.mark.parametrize("make", [bytearray, lambda n: mmap.mmap(-1, n)])
def test_round_trip_bytes(host, make):
    buf = make(LAYOUT_BYTES)
    hs = oi.hash_blocks(tokens(3 * 16), 16)
    with oi.OffloadEngine(host, "py/test", layout(), buffer=buf, instance_name="r0") as e:
        for b in range(3):
            fill(buf, b, seed=1, block=b)
        done = []
        t = e.save([0, 1, 2], hs, on_done=done.append)
        t.wait(10)
        assert t.poll() is True
        e.flush(10)
        assert done == [0]
        st = host.stats()
        assert st["blocks_sealed"] == 3 and st["saves_completed"] == 3

        # forget the device copy, then restore into other slots
        buf[:] = bytes(LAYOUT_BYTES)
        q = e.query(hs, req_id="req-1")
        assert q.hit_blocks == 3 and q.lease is not None and not q.loading
        with e.load(q.lease, [7, 3, 11]) as lt:
            lt.wait(10)
        for block, slot in enumerate([7, 3, 11]):
            assert read_block(buf, slot) == expected(1, block)
        assert read_block(buf, 0) == bytes(2 * BPB)
        es = e.stats()
        assert es["blocks_loaded"] == 3 and es["bytes_loaded"] == 3 * 2 * BPB
    # the engine is closed after the with block
    with pytest.raises(oi.ClosedError):
        e.query(hs)


def test_prefix_semantics(host):
    buf = bytearray(LAYOUT_BYTES)
    hs = oi.hash_blocks(tokens(4 * 16), 16)
    with host.engine("py/prefix", layout(), buffer=buf) as e:
        e.save([0, 1, 2, 3], hs).wait(10)
        other = oi.hash_blocks(tokens(16, 5), 16)[0]
        q = e.query([hs[0], hs[1], other, hs[3]])
        assert q.hit_blocks == 2  # the leading run only
        q.lease.release()
        q = e.query([other] + hs)
        assert q.hit_blocks == 0 and q.lease is None
        m = e.query([hs[0], other, hs[3]], membership=True)
        assert m.present == [True, False, True] and m.lease is None
        # another engine on the same namespace sees the blocks; another namespace does not
        with host.engine("py/prefix", layout(), buffer=bytearray(LAYOUT_BYTES)) as e2:
            with e2.query(hs).lease as lease:
                assert lease.blocks == 4
        with host.engine("py/other", layout(), buffer=bytearray(LAYOUT_BYTES)) as e3:
            assert e3.query(hs).hit_blocks == 0


def test_lease_exhaustion_and_expiry():
    with oi.OffloadHost(16 << 20, lease_ttl_ms=100) as h:
        buf = bytearray(LAYOUT_BYTES)
        hs = oi.hash_blocks(tokens(2 * 16), 16)
        with h.engine("py/lease", layout(), buffer=buf, world_size=2) as e:
            e.save([0, 1], hs).wait(10)
            # world_size 2: two loads consume the two shares, a third is refused
            q = e.query(hs)
            e.load(q.lease, [2, 3]).wait(10)
            # a layered load on the cpu backend is a plain load: no arena events
            t = e.load(q.lease.raw, [4, 5], arena_events=True)
            assert t.arena_event(0) == 0
            t.wait(10)
            with pytest.raises(oi.LeaseExpiredError) as ei:
                e.load(q.lease.raw, [6, 7])
            assert ei.value.status == -9 and ei.value.message
            with pytest.raises(oi.LeaseExpiredError):
                e.release(q.lease.raw)
            # a lease of the wrong block count
            q = e.query(hs)
            with pytest.raises(oi.Error):
                e.load(q.lease.raw, [2])
            # expiry by TTL
            q = e.query(hs)
            import time
            time.sleep(0.4)
            with pytest.raises(oi.LeaseExpiredError):
                q.lease.release()
            assert h.stats()["leases_expired"] >= 1
            # release twice
            q = e.query(hs)
            q.lease.release()
            with pytest.raises(oi.LeaseExpiredError):
                e.release(q.lease)


def test_ticket_callback_and_threads(host):
    buf = bytearray(LAYOUT_BYTES)
    hs = oi.hash_blocks(tokens(8 * 16), 16)
    with host.engine("py/threads", layout(), buffer=buf) as e:
        got = threading.Event()
        seen = []
        t = e.save(list(range(8)), hs)
        t.set_callback(lambda ticket, st: (seen.append((ticket is t, st)), got.set()))
        assert got.wait(10)
        assert seen == [(True, 0)]
        with pytest.raises(oi.StateError):
            t.set_callback(lambda *a: None)
        t.close()
        with pytest.raises(oi.ClosedError):
            t.poll()
        t.close()  # idempotent

        errors = []

        def worker(i):
            try:
                for _ in range(20):
                    q = e.query(hs[: 1 + i])
                    q.lease.release()
            except Exception as ex:  # pragma: no cover
                errors.append(ex)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []


def test_host_close_closes_engines_first():
    h = oi.OffloadHost(16 << 20)
    e = h.engine("py/order", layout(), buffer=bytearray(LAYOUT_BYTES))
    h.close()
    assert e.closed and h.closed
    with pytest.raises(oi.ClosedError):
        e.stats()
    with pytest.raises(oi.ClosedError):
        h.stats()
    with pytest.raises(oi.ClosedError):
        oi.OffloadEngine(h, "py/order", layout(), buffer=bytearray(LAYOUT_BYTES))
    e.close()
    h.close()
