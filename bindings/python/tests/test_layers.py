"""Layer-shaped layouts on the embedded cpu engine: segment_offsets (vLLM's
[2, num_blocks, block_bytes] layer per arena), layerwise saves
(arena_first / arena_count) and per-arena load progress (arena_wait /
arena_poll), every one checked on real bytes."""
import array

import pytest

import openinfer as oi

np = pytest.importorskip("numpy")  # python3-numpy (./dev deps)

LAYERS = 3
NUM_BLOCKS = 8
BLOCK_BYTES = 2048  # one K (or V) block of one layer


def vllm_layers():
    """One [2, NUM_BLOCKS, BLOCK_BYTES] uint8 buffer per layer, an arena per
    layer whose two segments are the K half and the V half."""
    kv = [np.zeros((2, NUM_BLOCKS, BLOCK_BYTES), dtype=np.uint8) for _ in range(LAYERS)]
    arenas = [oi.Arena("layer%d" % i, NUM_BLOCKS, BLOCK_BYTES, segments=2,
                       block_stride=BLOCK_BYTES, base=kv[i]) for i in range(LAYERS)]
    offsets = np.array([0, NUM_BLOCKS * BLOCK_BYTES] * LAYERS, dtype=np.uint64)
    return kv, arenas, offsets


def write_block(kv, slot, seed, layers=range(LAYERS)):
    rng = np.random.default_rng(seed)
    for layer in range(LAYERS):
        data = rng.integers(0, 256, size=(2, BLOCK_BYTES), dtype=np.uint8)
        if layer in layers:
            kv[layer][:, slot, :] = data


def block_bytes(kv, slot, layer):
    return kv[layer][:, slot, :].tobytes()


def expected_block(seed, layer):
    kv = [np.zeros((2, NUM_BLOCKS, BLOCK_BYTES), dtype=np.uint8) for _ in range(LAYERS)]
    write_block(kv, 0, seed)
    return kv[layer][:, 0, :].tobytes()


@pytest.fixture
def host():
    h = oi.OffloadHost(32 << 20)
    yield h
    h.close()


@pytest.mark.parametrize("kind", ["numpy", "array", "list"])
def test_segment_offsets_vllm_layer_round_trip(host, kind):
    kv, arenas, offsets = vllm_layers()
    so = {"numpy": offsets, "array": array.array("Q", offsets.tolist()),
          "list": offsets.tolist()}[kind]
    hs = oi.hash_blocks(range(3 * 16), 16)
    with oi.OffloadEngine(host, "py/seg/" + kind, arenas, segment_offsets=so) as e:
        for b in range(3):
            write_block(kv, b, seed=100 + b)
        e.save([0, 1, 2], hs).wait(10)
        e.flush(10)
        for layer in kv:
            layer[...] = 0
        q = e.query(hs)
        assert q.hit_blocks == 3
        e.load(q.lease, [5, 3, 7]).wait(10)
        for b, slot in enumerate([5, 3, 7]):
            for layer in range(LAYERS):
                assert block_bytes(kv, slot, layer) == expected_block(100 + b, layer)
                # the K half and the V half are far apart: both came back
                assert kv[layer][0, slot].any() and kv[layer][1, slot].any()
        for slot in (0, 1, 2, 4, 6):
            assert not any(kv[layer][:, slot].any() for layer in range(LAYERS))


def test_segment_offsets_host_copy_is_k_then_v(host):
    """The host block of a one-layer layout is the K half then the V half of
    the block: saving with segment_offsets and loading it into a plain
    (segment_stride) layout of the same shape reorders nothing."""
    kv = np.zeros((2, NUM_BLOCKS, BLOCK_BYTES), dtype=np.uint8)
    kv[0, 2] = 0x11
    kv[1, 2] = 0x22
    seg = oi.Arena("l", NUM_BLOCKS, BLOCK_BYTES, segments=2, block_stride=BLOCK_BYTES, base=kv)
    flat = bytearray(NUM_BLOCKS * 2 * BLOCK_BYTES)
    plain = oi.Arena("l", NUM_BLOCKS, BLOCK_BYTES, segments=2, base=flat)
    hs = oi.hash_blocks(range(16), 16)
    with oi.OffloadEngine(host, "py/seg/order", [seg],
                          segment_offsets=[0, NUM_BLOCKS * BLOCK_BYTES]) as e, \
            oi.OffloadEngine(host, "py/seg/order", [plain]) as e2:
        e.save([2], hs).wait(10)
        q = e2.query(hs)
        assert q.hit_blocks == 1
        e2.load(q.lease, [1]).wait(10)
    off = 1 * 2 * BLOCK_BYTES
    assert flat[off:off + BLOCK_BYTES] == b"\x11" * BLOCK_BYTES
    assert flat[off + BLOCK_BYTES:off + 2 * BLOCK_BYTES] == b"\x22" * BLOCK_BYTES


def test_segment_offsets_bad_input(host):
    kv, arenas, offsets = vllm_layers()
    with pytest.raises(oi.InvalidArgumentError):  # one entry short: the C call refuses
        oi.OffloadEngine(host, "py/seg/bad", arenas, segment_offsets=offsets[:-1])
    with pytest.raises(oi.InvalidArgumentError):  # one too many
        oi.OffloadEngine(host, "py/seg/bad", arenas,
                         segment_offsets=list(offsets.tolist()) + [0])
    with pytest.raises(oi.InvalidArgumentError):  # K and V overlap
        oi.OffloadEngine(host, "py/seg/bad", arenas, segment_offsets=[0, 0] * LAYERS)
    with pytest.raises(oi.InvalidArgumentError):  # not integers
        oi.OffloadEngine(host, "py/seg/bad", arenas, segment_offsets=["x"] * 2 * LAYERS)
    with pytest.raises(oi.InvalidArgumentError):  # negative
        oi.OffloadEngine(host, "py/seg/bad", arenas, segment_offsets=[-1] * 2 * LAYERS)
    with pytest.raises(oi.InvalidArgumentError):  # a float buffer
        oi.OffloadEngine(host, "py/seg/bad", arenas,
                         segment_offsets=offsets.astype(np.float64))
    # the namespace was never bound: a good layout still registers
    with oi.OffloadEngine(host, "py/seg/bad", arenas, segment_offsets=offsets) as e:
        assert e.stats()["num_blocks"] == NUM_BLOCKS


def test_layerwise_save(host):
    kv, arenas, offsets = vllm_layers()
    hs = oi.hash_blocks(range(2 * 16), 16)
    with oi.OffloadEngine(host, "py/layerwise", arenas, segment_offsets=offsets) as e:
        for b in range(2):
            write_block(kv, b, seed=200 + b)
        first = e.save([0, 1], hs, arena_first=0, arena_count=1, counts=True)
        first.wait(10)
        assert first.save_result == (2, 0, 0)  # the first layer decides the blocks
        for layer in range(1, LAYERS - 1):
            t = e.save([0, 1], hs, arena_first=layer, arena_count=1, counts=True)
            t.wait(10)
            assert t.save_result == (0, 0, 0)  # later layers count 0
        # every layer but the last arrived: not a hit (pending at most)
        q = e.query(hs)
        assert q.hit_blocks == 0 and q.lease is None
        assert q.pending_blocks in (0, 2)
        m = e.query_membership(hs)
        assert bytes(m) == b"\x00\x00"
        assert host.stats()["blocks_sealed"] == 0
        e.save([0, 1], hs, arena_first=LAYERS - 1, arena_count=1).wait(10)
        e.flush(10)
        q = e.query(hs)
        assert q.hit_blocks == 2
        for layer in kv:
            layer[...] = 0
        e.load(q.lease, [6, 4]).wait(10)
        for b, slot in enumerate([6, 4]):
            for layer in range(LAYERS):
                assert block_bytes(kv, slot, layer) == expected_block(200 + b, layer)
        st = e.stats()
        assert st["saves_completed"] == 2 and st["saves_failed"] == 0
        # a range past the layout is refused
        with pytest.raises(oi.InvalidArgumentError):
            e.save([2], oi.hash_blocks(range(500, 516), 16), arena_first=LAYERS,
                   arena_count=1)
        with pytest.raises(oi.InvalidArgumentError):
            e.save([2], oi.hash_blocks(range(500, 516), 16), arena_first=0, arena_count=-1)


def test_load_arena_wait_in_order(host):
    kv, arenas, offsets = vllm_layers()
    hs = oi.hash_blocks(range(4 * 16), 16)
    with oi.OffloadEngine(host, "py/arena-wait", arenas, segment_offsets=offsets) as e:
        for b in range(4):
            write_block(kv, b, seed=300 + b)
        e.save([0, 1, 2, 3], hs).wait(10)
        for layer in kv:
            layer[...] = 0
        q = e.query(hs)
        assert q.hit_blocks == 4
        dst = [7, 6, 5, 4]
        t = e.load(q.lease, dst, arena_events=True)
        for layer in range(LAYERS):
            t.arena_wait(layer, timeout=10)
            assert t.arena_poll(layer) is True
            for b, slot in enumerate(dst):
                assert block_bytes(kv, slot, layer) == expected_block(300 + b, layer)
        t.wait(10)
        assert t.arena_event(0) == 0  # cpu: no CUDA events
        with pytest.raises(oi.InvalidArgumentError):  # past the layout's arenas
            t.arena_wait(LAYERS, timeout=1)
        with pytest.raises(oi.InvalidArgumentError):
            t.arena_poll(LAYERS)


def test_arena_wait_without_arena_events_waits_for_the_ticket(host):
    kv, arenas, offsets = vllm_layers()
    hs = oi.hash_blocks(range(16), 16)
    with oi.OffloadEngine(host, "py/arena-plain", arenas, segment_offsets=offsets) as e:
        write_block(kv, 0, seed=9)
        t = e.save([0], hs)
        t.arena_wait(0, timeout=10)  # a save: the whole ticket
        assert t.poll() is True
        for layer in kv:
            layer[...] = 0
        q = e.query(hs)
        t = e.load(q.lease, [3])
        t.arena_wait(LAYERS + 5, timeout=10)  # no per-arena progress: any arena waits for all
        assert t.done()
        for layer in range(LAYERS):
            assert block_bytes(kv, 3, layer) == expected_block(9, layer)
