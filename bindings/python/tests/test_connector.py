"""The connector calls (issue 18): shared leases across engines of a
namespace, lookups without a layout (host and sidecar LookupClient), pending
blocks in query answers, and per-call save results."""
import array
import os
import tempfile

import pytest

import openinfer as oi
from conftest import BPB, LAYOUT_BYTES, expected, fill, layout, read_block


def hashes(n, start):
    """n block hashes (BlockHashes) of the tokens start, start + 1, ..."""
    return oi.hash_blocks_buffer(array.array("I", range(start, start + 16 * n)), 16)


def saved(host, ns, n, start, seed, world_size=1):
    """An engine of `ns` that saved n blocks (seed) under hashes(n, start)."""
    buf = bytearray(LAYOUT_BYTES)
    e = oi.OffloadEngine(host, ns, layout(), buffer=buf, world_size=world_size)
    for b in range(n):
        fill(buf, b, seed=seed, block=b)
    hs = hashes(n, start)
    e.save(array.array("q", range(n)), hs).wait(10)
    e.flush(10)
    return e, buf, hs


def test_shared_lease_loaded_and_released_by_other_engines(host):
    sched, _, hs = saved(host, "py/shared", 3, 10_000, seed=5, world_size=2)
    b1, b2 = bytearray(LAYOUT_BYTES), bytearray(LAYOUT_BYTES)
    w1 = oi.OffloadEngine(host, "py/shared", layout(), buffer=b1, world_size=2)
    w2 = oi.OffloadEngine(host, "py/shared", layout(), buffer=b2, world_size=2)
    q = sched.query(hs, req_id="sched-1")
    assert q.hit_blocks == 3 and q.pending_blocks == 0 and q.lease is not None
    # two workers (world_size 2) load the scheduler's lease, byte-exact
    w1.load(q.lease, [4, 5, 6]).wait(10)
    w2.load(q.lease.raw, [9, 1, 2]).wait(10)  # its 16 raw bytes work as well
    for block in range(3):
        assert read_block(b1, 4 + block) == expected(5, block)
        assert read_block(b2, [9, 1, 2][block]) == expected(5, block)
    # the budget is kept across instances: a third load is refused, whoever makes it
    with pytest.raises(oi.LeaseExpiredError) as ei:
        sched.load(q.lease.raw, [0, 1, 2]).wait(10)
    assert ei.value.status == -9 and ei.value.message

    # another engine releases the scheduler's lease; then it is gone for everyone
    q2 = sched.query(hs)
    w2.release(q2.lease)
    with pytest.raises(oi.LeaseExpiredError):
        w1.release(q2.lease.raw)
    with pytest.raises(oi.LeaseExpiredError):
        w1.load(q2.lease.raw, [0, 1, 2]).wait(10)

    # another namespace may not redeem it, and the refusal consumes nothing
    other = oi.OffloadEngine(host, "py/other", layout(), buffer=bytearray(LAYOUT_BYTES))
    q3 = sched.query(hs)
    with pytest.raises(oi.PermissionError) as ei:
        other.load(q3.lease, [0, 1, 2]).wait(10)
    assert ei.value.status_name == "OI_ERR_PERMISSION" and "namespace" in ei.value.message
    with pytest.raises(oi.PermissionError):
        other.release(q3.lease.raw)
    b1[:] = bytes(LAYOUT_BYTES)
    w1.load(q3.lease.raw, [0, 1, 2]).wait(10)
    assert [read_block(b1, s) for s in range(3)] == [expected(5, b) for b in range(3)]
    sched.release(q3.lease.raw)  # one share was left


def test_host_lookup_without_a_layout(host):
    hs = hashes(4, 20_000)
    # a namespace no engine has registered holds nothing
    q = host.query("py/lookup", hs)
    assert q.hit_blocks == 0 and q.lease is None and q.pending_blocks == 0
    e, buf, hs = saved(host, "py/lookup", 3, 20_000, seed=9)
    four = oi.BlockHashes(hs.tobytes() + hashes(4, 20_000)[3])  # 3 saved, 1 not
    q = host.query("py/lookup", four, req_id="sched", world_size=1)
    assert q.hit_blocks == 3 and q.lease is not None
    buf[:] = bytes(LAYOUT_BYTES)
    e.load(q.lease, [7, 8, 9]).wait(10)  # the engine loads the host lookup's lease
    for block in range(3):
        assert read_block(buf, 7 + block) == expected(9, block)
    with pytest.raises(oi.LeaseExpiredError):  # world_size 1: consumed
        host.release("py/lookup", q.lease)
    # membership, vectorised: the flags land in the caller's buffer
    flags = bytearray(4)
    assert host.query_membership("py/lookup", four, out=flags) is flags
    assert flags == b"\x01\x01\x01\x00"
    m = host.query("py/lookup", four, membership=True)
    assert m.present == [True, True, True, False] and m.lease is None
    # release through the host; a lease of the wrong namespace is refused there
    q = host.query("py/lookup", four)
    with pytest.raises(oi.LeaseExpiredError) as ei:  # a namespace that holds nothing
        host.release("py/elsewhere", q.lease.raw)
    assert "holds nothing" in ei.value.message
    with oi.OffloadEngine(host, "py/elsewhere", layout(), buffer=bytearray(LAYOUT_BYTES)):
        with pytest.raises(oi.PermissionError):
            host.release("py/elsewhere", q.lease.raw)
    host.release("py/lookup", q.lease)
    with pytest.raises(oi.LeaseExpiredError):
        e.release(q.lease.raw)
    # a with block releases a lease no load consumed
    with host.query("py/lookup", four).lease as lease:
        assert lease.blocks == 3
        assert host.stats()["leases_active"] >= 1
    with pytest.raises(oi.LeaseExpiredError):
        e.release(lease.raw)
    with pytest.raises(oi.InvalidArgumentError):
        host.query("", four)
    e.close()


def test_pending_blocks_and_wait_pending(host):
    """Whatever the timing, a block the namespace holds is sealed or in
    flight: a query without waiting counts hits + pending <= n, and with
    wait_pending every block that sealed in time is a hit. The deterministic
    in-flight case (a slowed copy) is the C test test_pending_fault."""
    big = 1 << 20  # 1 MiB per block: copies that take a while
    arenas = [oi.Arena("kv", 8, big)]
    buf = bytearray(8 * big)
    for b in range(8):
        buf[b * big:(b + 1) * big] = bytes([b + 1]) * big
    with oi.OffloadHost(64 << 20) as h:
        e = oi.OffloadEngine(h, "py/pending", arenas, buffer=buf)
        rbuf = bytearray(8 * big)
        reader = oi.OffloadEngine(h, "py/pending", arenas, buffer=rbuf)
        hs = hashes(8, 30_000)
        t = e.save(list(range(8)), hs)
        q = reader.query(hs)
        assert 0 <= q.hit_blocks + q.pending_blocks <= 8
        if q.lease is not None:
            reader.release(q.lease)
        m = h.query("py/pending", hs, membership=True)
        assert sum(m.present) + m.pending_blocks <= 8
        q = reader.query(hs, wait_pending=30)
        assert q.hit_blocks == 8 and q.pending_blocks == 0
        t.wait(10)
        reader.load(q.lease, list(range(8))).wait(10)
        assert rbuf == buf
        # the lookup waits too
        q = h.query("py/pending", hs, wait_pending=0)
        assert q.hit_blocks == 8 and q.pending_blocks == 0
        h.release("py/pending", q.lease)
        # WAIT_PENDING is refused with membership; a negative wait is refused here
        with pytest.raises(oi.InvalidArgumentError) as ei:
            reader.query(hs, membership=True, wait_pending=1)
        assert ei.value.status == -1
        with pytest.raises(oi.InvalidArgumentError):
            reader.query(hs, wait_pending=-1)
        e.close()
        reader.close()


def test_save_counts_and_a_full_pool_of_pinned_blocks():
    block = 2 * BPB  # one host block of the two-arena layout
    with oi.OffloadHost(16 * block, chunk_bytes=16 * block, high_watermark=1.0,
                        low_watermark=1.0) as h:
        buf = bytearray(LAYOUT_BYTES)
        e = oi.OffloadEngine(h, "py/counts", layout(), buffer=buf)
        for b in range(16):
            fill(buf, b, seed=3, block=b)
        hs = hashes(40, 40_000)
        t = e.save(list(range(8)), hs[:8], counts=True)
        assert t.save_result == oi.SaveResult(8, 0, 0) and t.save_result.known
        t.wait(10)
        t = e.save(list(range(4, 12)), hs[4:12], counts=True)
        assert (t.save_result.accepted, t.save_result.deduplicated, t.save_result.dropped) == \
            (4, 4, 0)
        t.wait(10)
        e.flush(10)
        assert e.save([0], hs[:1]).save_result is None  # not asked for
        # pin the 12 sealed blocks, then offer 10 more: 4 slots are left
        q = e.query(hs[:12])
        assert q.hit_blocks == 12
        t = e.save(list(range(12, 16)) + list(range(6)), hs[12:22], counts=True)
        assert t.save_result == (4, 0, 6)
        t.wait(10)  # the drops never fail the ticket
        assert t.poll() is True
        e.flush(10)
        q2 = e.query(hs[12:16])
        assert q2.hit_blocks == 4
        # every slot pinned: a whole save drops, the ticket is still OK
        t = e.save([0, 1, 2], hs[30:33], counts=True)
        assert t.save_result == oi.SaveResult(0, 0, 3)
        t.wait(10)
        assert bytes(e.query_membership(hs[30:33])) == bytes(3)
        # what was accepted loads byte-exact
        buf[:] = bytes(LAYOUT_BYTES)
        e.load(q2.lease, [0, 1, 2, 3]).wait(10)
        for i in range(4):
            assert read_block(buf, i) == expected(3, 12 + i)
        e.release(q.lease)
        e.close()


def lookup_round_trip(sock, ns):
    hs = hashes(3, 50_000)
    e, arena = oi.OffloadEngine.connect(sock, ns, layout(), world_size=1)
    with e, oi.LookupClient(sock, ns, client_name="py-scheduler") as client:
        for b in range(3):
            fill(None, b, seed=11, block=b, write=arena.write)
        t = e.save([0, 1, 2], hs, counts=True)
        assert t.save_result == (3, 0, 0)  # the server's counts, before the copy ends
        t.wait(30)
        t = e.save([0, 1, 2], hs, counts=True)
        assert t.save_result == oi.SaveResult(0, 3, 0)
        t.wait(30)
        e.flush(30)
        # the scheduler (no layout, no arena) queries; the worker loads its lease
        four = oi.BlockHashes(hs.tobytes() + hashes(4, 50_000)[3])
        q = client.query(four, req_id="r1", wait_pending=5)
        assert q.hit_blocks == 3 and q.pending_blocks == 0 and q.lease is not None
        arena.write(0, bytes(LAYOUT_BYTES))
        e.load(q.lease, [12, 13, 14]).wait(30)
        for b in range(3):
            assert read_block(None, 12 + b, read=arena.read) == expected(11, b)
        flags = bytearray(4)
        client.query_membership(four, out=flags)
        assert flags == b"\x01\x01\x01\x00"
        q = client.query(four)
        client.release(q.lease)
        with pytest.raises(oi.LeaseExpiredError) as ei:
            client.release(q.lease.raw)
        assert ei.value.status_name == "OI_ERR_LEASE_EXPIRED"
        # a lease the client keeps is dropped when it closes
        kept = client.query(hs).lease
    with pytest.raises(oi.ClosedError):
        client.query(hs)
    e2, arena2 = oi.OffloadEngine.connect(sock, ns, layout())
    with e2:
        t = e2.load(kept, [0, 1, 2])
        with pytest.raises(oi.LeaseExpiredError):
            t.wait(30)
        arena2.close()


def test_lookup_client_against_real_server(serve):
    lookup_round_trip(serve, "py/lookup-serve")


def test_lookup_client_against_embedded_server():
    d = tempfile.mkdtemp(prefix="oi-py-")
    sock = os.path.join(d, "oi.sock")
    with oi.Server(sock, 32 << 20) as s:
        s.start()
        lookup_round_trip(sock, "py/lookup-embedded")
        # the server's death is not fatal to a lookup client: calls fail
        client = oi.LookupClient(sock, "py/lookup-embedded", control_deadline_ms=2000)
    with pytest.raises(oi.ClosedError) as ei:
        client.query(hashes(1, 1))
    assert ei.value.status_name == "OI_ERR_CLOSED"
    client.close()
    with pytest.raises(oi.Error):
        oi.LookupClient(sock, "py/x")


def test_breaker_options_pass_through():
    d = tempfile.mkdtemp(prefix="oi-py-")
    sock = os.path.join(d, "oi.sock")
    with oi.Server(sock, 32 << 20) as s:
        s.start()
        with oi.LookupClient(sock, "py/breaker", lookup_deadline_ms=5000,
                             probe_interval_ms=20) as client:
            res = client.query(hashes(1, 2))
            assert res.hit_blocks == 0
        for field in ("lookup_deadline_ms", "probe_interval_ms"):
            with pytest.raises(oi.InvalidArgumentError) as ei:
                oi.LookupClient(sock, "py/breaker", **{field: 0})
            assert field + " is 0" in str(ei.value)
            with pytest.raises(oi.InvalidArgumentError) as ei:
                oi.OffloadEngine.connect(sock, "py/breaker", [oi.Arena("kv", 4, 64)],
                                         **{field: 0})
            assert field + " is 0" in str(ei.value)
