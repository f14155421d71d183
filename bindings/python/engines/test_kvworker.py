"""openinfer.kvworker on CPU torch tensors: vLLM's per-layer layouts (the
[2, num_blocks, block, heads, dim] K/V halves and vLLM 0.33's
[num_blocks, heads, block, K||V] pages in one backing allocation), layerwise
saves, per-layer load waits, embedded and against a real sidecar."""
import os
import time

import pytest
import torch

import openinfer as oi
from openinfer.kvworker import KVLayout, KVWorker, shared_kv_tensors

LAYERS, BLOCKS, BS, HEADS, DIM = 4, 12, 16, 2, 32


def kv_halves(dtype=torch.bfloat16):
    return {"layer.%d" % i: torch.zeros((2, BLOCKS, BS, HEADS, DIM), dtype=dtype)
            for i in range(LAYERS)}


def kv_pages(dtype=torch.bfloat16):
    """vLLM 0.33 (LBHNC): one backing allocation, layer l at l * layer_stride."""
    raw = torch.zeros(LAYERS * BLOCKS * HEADS * BS * 2 * DIM, dtype=dtype)
    v = raw.view(LAYERS, BLOCKS, HEADS, BS, 2 * DIM)
    return {"layer.%d" % i: v[i] for i in range(LAYERS)}


def hashes(n, start):
    return oi.hash_blocks_buffer(list(range(start, start + BS * n)), BS)


def fill(kv, ids, seed):
    g = torch.Generator().manual_seed(seed)
    for t in kv.values():
        for b in ids:
            if t.shape[0] == 2 and t.dim() == 5:
                t[:, b] = torch.randn(t[:, b].shape, generator=g).to(t.dtype)
            else:
                t[b] = torch.randn(t[b].shape, generator=g).to(t.dtype)


def block(t, b):
    return (t[:, b] if t.dim() == 5 and t.shape[0] == 2 else t[b]).clone()


def test_layouts():
    lay = KVLayout.from_tensors(kv_halves(), num_blocks=BLOCKS)
    assert len(lay.regions) == LAYERS
    r = lay.regions[0]
    chunk = BS * HEADS * DIM * 2
    assert (r.chunk, r.block_stride, r.segments) == (chunk, chunk, [0, BLOCKS * chunk])
    arenas, offsets = lay.arenas()
    assert [a.segments for a in arenas] == [2] * LAYERS and offsets == [0, BLOCKS * chunk] * LAYERS
    assert lay.block_bytes == LAYERS * 2 * chunk
    lay = KVLayout.from_tensors(kv_pages(), num_blocks=BLOCKS, kv_dim=None)
    r = lay.regions[1]
    page = HEADS * BS * 2 * DIM * 2
    assert (r.chunk, r.block_stride, r.segments) == (page, page, [0])
    # a shared layer (vLLM's KV sharing) is registered once
    kv = kv_halves()
    kv["layer.shared"] = kv["layer.1"]
    lay = KVLayout.from_tensors(kv, num_blocks=BLOCKS)
    assert len(lay.regions) == LAYERS and lay.arena_of["layer.shared"] == 1
    # HND pages permuted to NHD logically: still one dense page per block
    raw = torch.zeros(BLOCKS, HEADS, BS, DIM)
    lay = KVLayout.from_tensors({"x": raw.permute(0, 2, 1, 3)}, num_blocks=BLOCKS, kv_dim=None)
    assert lay.regions[0].chunk == HEADS * BS * DIM * 4
    with pytest.raises(oi.InvalidArgumentError):  # every other token: not a dense block
        KVLayout.from_tensors({"x": torch.zeros(BLOCKS, 2 * BS, DIM)[:, ::2]},
                              num_blocks=BLOCKS, kv_dim=None)
    with pytest.raises(oi.InvalidArgumentError):
        KVLayout.from_tensors({"x": torch.zeros(3, 5, 7)}, num_blocks=BLOCKS)


@pytest.mark.parametrize("make", [kv_halves, kv_pages])
def test_layerwise_save_and_per_layer_load_embedded(make):
    kv = make()
    kv_dim = None if make is kv_pages else "auto"
    with oi.OffloadHost(32 << 20) as host:
        w = KVWorker(kv, "eng/kvworker/" + make.__name__, host=host, num_blocks=BLOCKS,
                     kv_dim=kv_dim)
        fill(kv, [1, 2, 3], seed=7)
        want = {n: [block(t, b) for b in (1, 2, 3)] for n, t in kv.items()}
        hs = hashes(3, 1000)
        w.begin_step([1, 2, 3], hs)
        for i, name in enumerate(kv):
            assert w.save_layer(name) is not None
            assert w.save_layer(name) is None  # once per step
            if i < LAYERS - 1:  # not sealed before its last layer
                assert w.query(hs).hit_blocks == 0
        assert w.finish_step() == []  # every layer was saved
        assert w.wait_saves(10) == []
        q = w.query(hs)
        assert q.hit_blocks == 3
        for t in kv.values():
            t.zero_()
        t = w.load(q.lease, [9, 5, 7])
        for name in kv:
            w.wait_layer(t, name, 10)
            for j, dst in enumerate((9, 5, 7)):
                assert torch.equal(block(kv[name], dst), want[name][j])
        t.wait(10)
        for name, tensor in kv.items():  # nothing else was written
            for b in (0, 1, 2, 3, 4, 6, 8, 10, 11):
                assert not block(tensor, b).any()
        # a step whose layers were not saved one by one: finish_step saves them all
        fill(kv, [4], seed=9)
        w.begin_step([4], hashes(1, 5000))
        w.save_layer("layer.0")
        assert len(w.finish_step()) == 1
        assert w.wait_saves(10) == []
        assert w.query(hashes(1, 5000)).hit_blocks == 1
        w.close()


def test_sidecar_engine_owned_degrades_and_recovers(serve):
    shapes = [(2, BLOCKS, BS, HEADS, DIM)] * LAYERS
    buf, tensors = shared_kv_tensors(shapes, torch.bfloat16)
    kv = {"layer.%d" % i: t for i, t in enumerate(tensors)}
    w = KVWorker(kv, "eng/kvworker/sidecar", socket=serve.socket, buffer=buf,
                 num_blocks=BLOCKS)
    assert w.stats()["connection"] == oi.CONNECTION_CONNECTED
    fill(kv, [0, 1], seed=3)
    want = {n: [block(t, b) for b in (0, 1)] for n, t in kv.items()}
    hs = hashes(2, 100)
    w.begin_step([0, 1], hs)
    for name in kv:
        w.save_layer(name)
    assert w.wait_saves(30) == []
    with oi.LookupClient(serve.socket, "eng/kvworker/sidecar") as look:
        q = look.query(hs)
        assert q.hit_blocks == 2
        for t in kv.values():
            t.zero_()
        t = w.load(q.lease, [10, 11])
        for name in kv:
            w.wait_layer(t, name, 30)
            assert torch.equal(block(kv[name], 10), want[name][0])
            assert torch.equal(block(kv[name], 11), want[name][1])
    epoch = w.stats()["server_epoch"]
    assert serve.stop() == 0
    deadline = time.time() + 20
    while w.stats()["connection"] != oi.CONNECTION_DEGRADED:
        assert time.time() < deadline
        time.sleep(0.05)
    assert w.query(hs).hit_blocks == 0  # a miss, not an error
    w.begin_step([2], hashes(1, 200))
    for name in kv:
        w.save_layer(name)  # dropped
    assert w.wait_saves(10) == []
    assert w.stats()["disconnected_saves"] >= 1
    serve.start()
    while w.stats()["connection"] != oi.CONNECTION_CONNECTED:
        assert time.time() < deadline + 20
        time.sleep(0.05)
    st = w.stats()
    assert st["reconnects"] == 1 and st["server_epoch"] != epoch
    fill(kv, [0, 1], seed=3)  # the new server's pool is empty: save again, load again
    w.begin_step([0, 1], hs)
    for name in kv:
        w.save_layer(name)
    assert w.wait_saves(30) == []
    q = w.query(hs)
    assert q.hit_blocks == 2
    w.load(q.lease, [4, 5]).wait(30)
    for name in kv:
        assert torch.equal(block(kv[name], 5), want[name][1])
    w.close()
    tensors.clear()
    kv.clear()


def test_sidecar_cpu_needs_a_shared_buffer(serve):
    with pytest.raises(oi.InvalidArgumentError):
        KVWorker(kv_halves(), "eng/kvworker/x", socket=serve.socket, num_blocks=BLOCKS)


def test_a_step_naming_a_block_twice_saves_it_once():
    kv = kv_pages()
    with oi.OffloadHost(16 << 20) as host:
        w = KVWorker(kv, "eng/kvworker/dup", host=host, num_blocks=BLOCKS, kv_dim=None)
        fill(kv, [3], seed=1)
        hs = hashes(2, 7000)
        w.begin_step([3, 3], hs)  # the library refuses a block id twice in one call
        for name in kv:
            w.save_layer(name)
        assert w.wait_saves(10) == []
        assert w.query(hs[:1]).hit_blocks == 1
        w.close()


def test_a_load_past_its_deadline_is_held_until_fenced():
    """A load whose 1 ms deadline passes while its copies (160 MiB) still
    run: settle_load says nothing (None) while it is fencing, the counters
    hold its 20 blocks as fencing, then it ends failed (DeadlineError),
    counted failed and fenced, never completed; bytes written into its
    blocks after that never change (every byte checked). The fencing lasts
    as long as the copies (tens of ms): a poller kept off a busy machine's
    cores for all of it sees only the end, so the load is tried again (up
    to three times); every try checks the end state."""
    for attempt in range(3):
        if fenced_load_is_seen_fencing():
            return
    raise AssertionError("the load never showed as fencing (3 tries)")


def fenced_load_is_seen_fencing():
    """One load of test_a_load_past_its_deadline_is_held_until_fenced;
    whether its poller saw it fencing, counted as such."""
    layers, nb, n, elems = 4, 24, 20, 1 << 20  # 2 MiB of bf16 per layer and block
    raw = torch.zeros(layers * nb * elems, dtype=torch.bfloat16)
    pages = raw.view(layers, nb, elems)
    kv = {"layer.%d" % i: pages[i] for i in range(layers)}
    with oi.OffloadHost(256 << 20) as host:
        w = KVWorker(kv, "eng/kvworker/fence", host=host, num_blocks=nb, kv_dim=None,
                     load_deadline_ms=1)
        pages[:, :n] = torch.arange(n, dtype=torch.bfloat16).view(1, n, 1) + 1
        hs = hashes(n, 7000)
        w.begin_step(list(range(n)), hs)
        w.finish_step()
        assert w.wait_saves(60) == []
        q = w.query(hs)
        assert q.hit_blocks == n
        raw.zero_()
        t = w.load(q.lease, list(range(n)))
        seen_fencing = seen_counted = False
        deadline = time.monotonic() + 60
        while True:
            r = w.settle_load(t, 0)
            if r is not None:
                break
            c = w.counters()
            assert c["loads_in_flight"] == 1 and c["loads_completed"] == 0
            assert c["loads_failed"] == 0  # not reported before it is final
            if t.fencing:
                seen_fencing = True
                seen_counted |= (c["blocks_fencing"], c["loads_fencing"]) == (n, 1)
            assert time.monotonic() < deadline
        assert isinstance(r, oi.DeadlineError), r
        c = w.counters()
        assert (c["loads_submitted"], c["loads_completed"], c["loads_failed"],
                c["loads_fenced"], c["loads_in_flight"], c["blocks_fencing"]) == (1, 0, 1, 1, 0, 0)
        # the blocks are the caller's again: nothing lands in them any more
        pages[:, :n] = -3
        snap = raw.clone()
        time.sleep(0.5)
        assert torch.equal(raw.view(torch.int16), snap.view(torch.int16))
        w.close()
    return seen_fencing and seen_counted


# ----------------------------------------------------------------------------- codecs

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "data", "kvcorpus",
                      "kv.bin")


def kv_pages_lbnhc(dtype=torch.bfloat16):
    """vLLM 0.33 with VLLM_KV_CACHE_LAYOUT LBNHC: the logical [blocks, heads,
    tokens, K||V] views of memory laid out [blocks, tokens, heads, K||V]."""
    raw = torch.zeros(LAYERS * BLOCKS * BS * HEADS * 2 * DIM, dtype=dtype)
    v = raw.view(LAYERS, BLOCKS, BS, HEADS, 2 * DIM).permute(0, 1, 3, 2, 4)
    return {"layer.%d" % i: v[i] for i in range(LAYERS)}


def kv_halves_hnd(dtype=torch.bfloat16):
    """K/V halves whose memory is [2, blocks, heads, tokens, dim] (HND),
    viewed as [2, blocks, tokens, heads, dim]."""
    return {"layer.%d" % i: torch.zeros((2, BLOCKS, HEADS, BS, DIM), dtype=dtype)
            .permute(0, 1, 3, 2, 4) for i in range(LAYERS)}


def roles_of(make):
    return "sbthd" if make in (kv_halves, kv_halves_hnd) else "bhtkd"


def split_pages(kv):
    """Page tensors with K||V split into [K, V] of DIM (what the connector hands
    codec_shape_of)."""
    return {n: t.unflatten(-1, (2, DIM)) for n, t in kv.items()}


def test_codec_shape_of_the_layouts():
    """The lossy codecs' (tokens, heads, head_dim) of each layout: the
    K/V halves are 2 x layers parts of [tokens][heads][dim] (HND memory: 2 x
    layers x heads parts of [tokens][1][dim]); vLLM 0.33's LBHNC pages are
    layers x heads parts of [tokens][K, V][dim], LBNHC pages layers parts of
    [tokens][heads x K, V][dim]."""
    from openinfer.kvworker import codec_shape_of
    assert codec_shape_of(kv_halves(), "sbthd") == (BS, HEADS, DIM)
    assert codec_shape_of(kv_halves_hnd(), "sbthd") == (BS, 1, DIM)
    assert codec_shape_of(split_pages(kv_pages()), "bhtkd") == (BS, 2, DIM)
    assert codec_shape_of(split_pages(kv_pages_lbnhc()), "bhtkd") == (BS, 2 * HEADS, DIM)
    with pytest.raises(oi.InvalidArgumentError, match="float16; the lossy codecs"):
        codec_shape_of(kv_halves(torch.float16), "sbthd")
    # head_dim not innermost ([.., dim, heads] in memory): no shape
    odd = {"x": torch.zeros((2, BLOCKS, BS, DIM, HEADS), dtype=torch.bfloat16)
           .transpose(3, 4)}
    with pytest.raises(oi.InvalidArgumentError, match="head_dim is not the innermost"):
        codec_shape_of(odd, "sbthd")
    mixed = dict(kv_halves())
    mixed["layer.hnd"] = kv_halves_hnd()["layer.0"]
    with pytest.raises(oi.InvalidArgumentError, match="another layer's is"):
        codec_shape_of(mixed, "sbthd")


def canonical(t, b):
    """Block b of a layer tensor as [K/V, tokens, heads, dim] float32."""
    if t.dim() == 5:  # halves: [2, blocks, tokens, heads, dim]
        return t[:, b].float()
    return t[b].unflatten(-1, (2, DIM)).permute(2, 1, 0, 3).float()  # [heads, tokens, 2, dim]


def fill_corpus(kv, ids, skew):
    """Each block of every layer filled with real KV values of the corpus
    (bf16, taken in order); skew: K/V and every head scaled by its own power
    of two (exact), so that a scale taken over the wrong elements breaks the
    codecs' bounds."""
    with open(CORPUS, "rb") as f:
        corpus = torch.frombuffer(bytearray(f.read()), dtype=torch.bfloat16)
    off = 0
    for t in kv.values():
        for b in ids:
            c = canonical(t, b)
            n = c.numel()
            vals = corpus[off:off + n].float().view(c.shape)
            off += n
            if skew:
                f = torch.tensor([2.0 ** (3 * h) for h in range(HEADS)]).view(1, 1, HEADS, 1)
                vals = vals * f * torch.tensor([1.0, 1 / 64]).view(2, 1, 1, 1)
            vals = vals.to(torch.bfloat16)
            if t.dim() == 5:
                t[:, b] = vals
            else:
                t[b] = vals.permute(2, 1, 0, 3).flatten(-2)
    return off


def within_codec_bound(codec, got, want):
    """got, want: [K/V, tokens, heads, dim] float32. int8: every (K/V, token,
    head) vector within half its scale step (amax / 127); fp8: every value
    within half a unit in the last of 3 mantissa bits, or half the smallest
    subnormal step of its (K/V, head) scale (amax over the tokens / 448); both
    plus the bf16 rounding of the decoded value."""
    err = (got - want).abs()
    bf16 = want.abs() / 128
    if codec == "int8":
        step = want.abs().amax(dim=-1, keepdim=True) / 127
        return bool((err <= step / 2 + bf16 + 1e-30).all())
    scale = want.abs().amax(dim=(1, 3), keepdim=True) / 448
    return bool((err <= want.abs() / 16 + scale * 2.0 ** -10 + bf16 + 1e-30).all())


@pytest.mark.parametrize("codec", ["lossless", "int8", "fp8"])
@pytest.mark.parametrize("make", [kv_halves, kv_halves_hnd, kv_pages, kv_pages_lbnhc])
def test_a_codec_worker_saves_and_loads_layer_by_layer(make, codec):
    """A codec namespace is saved and loaded as one without a codec:
    save_layer saves each layer's arena as it is written (a save call per
    layer), no block is visible before its last layer's save, finish_step
    has nothing left to save; the load reports each layer with its bytes in
    place when its wait returns, lossless byte-equal, int8 and fp8 within
    their bounds on every (K/V, token, head) of real KV values."""
    from openinfer.kvworker import codec_shape_of
    kv = make()
    kv_dim = None if make in (kv_pages, kv_pages_lbnhc) else "auto"
    views = kv if kv_dim else split_pages(kv)
    shape = codec_shape_of(views, roles_of(make)) if codec != "lossless" else None
    ns = "eng/kvworker/codec/%s/%s" % (make.__name__, codec)
    with oi.OffloadHost(32 << 20) as host:
        w = KVWorker(kv, ns, host=host, num_blocks=BLOCKS, kv_dim=kv_dim, codec=codec,
                     codec_shape=shape)
        assert w.codec == codec
        fill_corpus(kv, [1, 2, 3], skew=codec != "lossless")
        want = {n: [canonical(t, b) for b in (1, 2, 3)] for n, t in kv.items()}
        hs = hashes(3, 11000)
        w.begin_step([1, 2, 3], hs)
        for i, name in enumerate(kv):
            assert w.query(hs).hit_blocks == 0  # not sealed before its last layer
            assert w.save_layer(name) is not None
            assert w.save_layer(name) is None  # once per step
        assert w.finish_step() == []  # every layer was saved
        assert w.wait_saves(30) == []
        assert w.counters()["saves_completed"] == LAYERS
        st = w.stats()
        assert (st["saves_completed"], st["saves_failed"], st["saves_not_encoded"]) == (3, 0, 0)
        q = w.query(hs)
        assert q.hit_blocks == 3
        for t in kv.values():
            t.zero_()
        t = w.load(q.lease, [9, 5, 7])
        lossy_differs = False
        for name, tensor in kv.items():
            w.wait_layer(t, name, 30)
            for j, dst in enumerate((9, 5, 7)):  # this layer's bytes are in place
                got = canonical(tensor, dst)
                if codec == "lossless":
                    assert torch.equal(got, want[name][j]), (name, j)
                else:
                    assert within_codec_bound(codec, got, want[name][j]), (name, j)
                    lossy_differs |= not torch.equal(got, want[name][j])
        assert w.settle_load(t, 30) is True
        for tensor in kv.values():
            for b in (0, 1, 2, 3, 4, 6, 8, 10, 11):  # nothing else was written
                assert not canonical(tensor, b).any()
        assert codec == "lossless" or lossy_differs, "the lossy codec changed nothing"
        # the namespace is bound to its codec: an engine without it is refused
        with pytest.raises(oi.InvalidArgumentError, match="codec %s" % codec):
            KVWorker(kv, ns, host=host, num_blocks=BLOCKS, kv_dim=kv_dim)
        w.close()


def layer_reports(w, ticket, names, check):
    """Waits for each layer of a load in order (KVWorker.wait_layer, as the
    vLLM connector's wait_for_layer_load does), calling check(name) as soon
    as its wait returned; returns, per layer, which layers the ticket had
    reported landed at that moment (arena_poll)."""
    out = []
    for name in names:
        w.wait_layer(ticket, name, 30)
        out.append([ticket.arena_poll(w.arena(n)) for n in names])
        check(name)
    return out


@pytest.mark.parametrize("codec", ["none", "lossless"])
@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
def test_a_load_reports_layer_0_before_the_last_layer_lands(codec, mode, request):
    """A load of 64 blocks of 16 layers of 64 KiB (an arena's copies take a
    millisecond or more, so the last layer lands well after the first, even
    through the sidecar's two wakeups per report): the first layer's wait
    returns while the last layer is still moving (in some of up to 16
    rounds: the waiting thread may be descheduled), with or without a codec,
    embedded and through the sidecar; each layer's bytes are in place when
    its own wait returns. The blocks were saved layer by layer, 8 blocks a
    step (a codec's per-block bounces hold 4 MiB at least)."""
    layers, nb, elems = 16, 64, 32768  # 64 KiB of bf16 per layer and block
    with open(CORPUS, "rb") as f:
        corpus = torch.frombuffer(bytearray(f.read()), dtype=torch.bfloat16)
    total = layers * nb * elems
    content = corpus.repeat(total // corpus.numel() + 1)[:total].view(layers, nb, elems)
    if mode == "embedded":
        raw = torch.zeros(total, dtype=torch.bfloat16)
        buf = None
    else:
        serve = request.getfixturevalue("serve_big")  # 64 MiB of KV
        buf, (raw,) = shared_kv_tensors([(total,)], torch.bfloat16)
    pages = raw.view(layers, nb, elems)
    kv = {"layer.%d" % i: pages[i] for i in range(layers)}
    names = list(kv)
    ns = "eng/kvworker/layered/%s/%s" % (codec, mode)
    host = oi.OffloadHost(192 << 20) if mode == "embedded" else None
    try:
        if host is not None:
            w = KVWorker(kv, ns, host=host, num_blocks=nb, kv_dim=None, codec=codec)
        else:
            w = KVWorker(kv, ns, socket=serve.socket, buffer=buf, num_blocks=nb, kv_dim=None,
                         codec=codec)
        pages.copy_(content)
        hs = hashes(nb, 20000 + 1000 * (codec != "none"))
        for s in range(0, nb, 8):
            w.begin_step(list(range(s, s + 8)), hs[s:s + 8])
            for name in names:
                assert w.save_layer(name) is not None
            assert w.wait_saves(60) == []
        assert w.stats()["saves_not_encoded"] == 0
        early = rounds = 0
        while rounds < 3 or (rounds < 16 and not early):
            rounds += 1
            raw.zero_()
            q = w.query(hs)
            assert q.hit_blocks == nb
            t = w.load(q.lease, list(range(nb)))

            def check(name):
                i = names.index(name)
                assert torch.equal(pages[i].view(torch.int16), content[i].view(torch.int16)), \
                    (name, rounds)
            seen = layer_reports(w, t, names, check)
            assert all(seen[i][i] for i in range(layers))
            early += not seen[0][-1]
            assert w.settle_load(t, 30) is True
        print("%s %s: %d of %d rounds reported layer 0 before layer %d landed"
              % (codec, mode, early, rounds, layers - 1))
        assert early, "every round's first layer waited for the last"
        w.close()
    finally:
        if host is not None:
            host.close()
        kv.clear()


def test_a_codec_sidecar_worker_round_trips_lossless(serve):
    shapes = [(2, BLOCKS, BS, HEADS, DIM)] * LAYERS
    buf, tensors = shared_kv_tensors(shapes, torch.bfloat16)
    kv = {"layer.%d" % i: t for i, t in enumerate(tensors)}
    w = KVWorker(kv, "eng/kvworker/codec-sidecar", socket=serve.socket, buffer=buf,
                 num_blocks=BLOCKS, codec="lossless")
    fill_corpus(kv, [0, 1], skew=False)
    want = {n: [canonical(t, b) for b in (0, 1)] for n, t in kv.items()}
    hs = hashes(2, 12000)
    w.begin_step([0, 1], hs)
    for name in kv:
        assert w.query(hs).hit_blocks == 0  # not sealed before its last layer
        assert w.save_layer(name) is not None
    assert w.finish_step() == []
    assert w.wait_saves(30) == []
    assert w.counters()["saves_completed"] == LAYERS
    q = w.query(hs)
    assert q.hit_blocks == 2
    for t in kv.values():
        t.zero_()
    t = w.load(q.lease, [10, 11])
    for name in kv:
        w.wait_layer(t, name, 30)
        assert torch.equal(canonical(kv[name], 10), want[name][0])
        assert torch.equal(canonical(kv[name], 11), want[name][1])
    assert w.settle_load(t, 30) is True
    w.close()
    tensors.clear()
    kv.clear()
