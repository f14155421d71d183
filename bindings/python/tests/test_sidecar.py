"""Sidecar mode against a real `openinfer serve` subprocess, and the embeddable
Server in a thread."""
import os
import tempfile

import pytest

import openinfer as oi
from conftest import BPB, LAYOUT_BYTES, expected, fill, layout, read_block


def round_trip(sock, ns):
    hs = oi.hash_blocks(range(3 * 16), 16)
    e, arena = oi.OffloadEngine.connect(sock, ns, layout(), instance_name="py-client")
    with e:
        assert arena.size >= LAYOUT_BYTES
        assert e.imported_arena is arena
        for b in range(3):
            fill(None, b, seed=7, block=b, write=arena.write)
        e.save([0, 1, 2], hs).wait(30)
        e.flush(30)
        st = e.stats()
        assert st["saves_completed"] == 3
    assert arena.closed and e.closed  # the engine closed its mapping first
    with pytest.raises(oi.ClosedError):
        arena.read(0, 1)

    # a second client (a restarted engine) restores the prefix
    e2, arena2 = oi.OffloadEngine.connect(sock, ns, layout())
    try:
        assert arena2.read(0, LAYOUT_BYTES) == bytes(LAYOUT_BYTES)  # zeroed by the server
        q = e2.query(hs + oi.hash_blocks(range(100, 116), 16))
        assert q.hit_blocks == 3
        e2.load(q.lease, [9, 4, 13]).wait(30)
        for block, slot in enumerate([9, 4, 13]):
            assert read_block(None, slot, read=arena2.read) == expected(7, block)
        # errors only the server can see complete the ticket
        t = e2.load(q.lease, [0, 1, 2])
        with pytest.raises(oi.LeaseExpiredError) as ei:
            t.wait(30)
        assert ei.value.status == -9
        # sidecar: save's wait_event is unsupported
        with pytest.raises(oi.UnsupportedError):
            e2.save([0], hs[:1], wait_event=0x1234)
    finally:
        arena2.close()  # the documented order: mapping first...
        e2.close()      # ...then flush and unregister


def test_sidecar_round_trip_real_server(serve):
    round_trip(serve, "py/sidecar")


def test_sidecar_against_embedded_server():
    d = tempfile.mkdtemp(prefix="oi-py-")
    sock = os.path.join(d, "oi.sock")
    with oi.Server(sock, 32 << 20) as s:
        assert s.socket_path == sock and s.epoch != 0
        s.start()
        with pytest.raises(oi.StateError):
            s.start()
        round_trip(sock, "py/embedded-server")
    assert not os.path.exists(sock)
    os.rmdir(d)


def test_connect_refused_without_server():
    d = tempfile.mkdtemp(prefix="oi-py-")
    with pytest.raises(oi.Error) as ei:
        oi.OffloadEngine.connect(os.path.join(d, "none.sock"), "py/x", layout())
    assert isinstance(ei.value, (oi.IOError, oi.NotFoundError))
    os.rmdir(d)
