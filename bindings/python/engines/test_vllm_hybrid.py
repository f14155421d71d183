"""openinfer.vllm with hybrid KV cache groups (full attention beside sliding
window attention), against the real vLLM on the CPU.

vLLM's own ``Scheduler`` over a KVCacheConfig of two groups as vLLM's hybrid
KV cache manager lays them out (group 0: full attention, layers 0 and 2;
group 1: a sliding window of WINDOW tokens, layers 1 and 3; the groups
overlay one backing allocation and share one block pool, so a block id is
one group's at a time), and the worker-side connector over KV tensors from
vLLM's ``allocate_kv_cache``, driven through vLLM's
``KVConnectorModelRunnerMixin``. The stand-in model writes each layer's KV
into its own group's blocks.

Shown: each group's blocks round-trip byte-equal into another instance (the
full group's whole prefix, the sliding-window group's window, which is all
it saved); a block a group lacks is never promised (the longest prefix
whose every group's blocks are held is); a load that fails is recomputed
through failed_recving; shapes the connector cannot serve are refused at
start, naming them."""
import gc
import os
import time

import pytest
import torch


from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         ParallelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config)
import vllm.distributed.kv_transfer.kv_transfer_state as kts
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MambaSpec, SlidingWindowSpec)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
from vllm.v1.worker.utils import allocate_kv_cache

TINY = os.environ.get("OPENINFER_TINY_MODEL",
                      os.path.join(os.path.dirname(__file__), "tiny-model"))
BS = 16
NUM_BLOCKS = 64
KV_HEADS, HEAD = 1, 16
WINDOW = 40  # tokens: a prefix of n blocks keeps blocks (n*16 - 39) // 16 .. n-1
LAYER_NAMES = ["model.layers.%d.self_attn.attn" % i for i in range(4)]
FULL_LAYERS = [0, 2]
SWA_LAYERS = [1, 3]
PROMPT = list(range(3000, 3000 + 8 * BS + 3))  # 8 full blocks and a tail


def vllm_config(extra, tp=1):
    extra = dict({"load_async": True}, **extra)
    model = ModelConfig(model=TINY, tokenizer=TINY, skip_tokenizer_init=True, dtype="bfloat16",
                        max_model_len=1024, seed=0)
    cfg = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BS, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024,
                                         max_model_len=1024, is_encoder_decoder=False),
        parallel_config=ParallelConfig(tensor_parallel_size=tp,
                                       distributed_executor_backend="uni"
                                       if "socket" not in extra else "mp"),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OpenInferConnector", kv_connector_module_path="openinfer.vllm",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config=extra),
    )
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    return cfg


def specs():
    full = FullAttentionSpec(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD,
                             dtype=torch.bfloat16)
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD,
                            dtype=torch.bfloat16, sliding_window=WINDOW)
    return full, swa


def kv_cache_config(second=None):
    """Two groups overlaid on one allocation, as vLLM's hybrid manager lays
    them out (a KVCacheTensor per group over the same bytes)."""
    full, swa = specs()
    second = second or swa
    page = full.page_size_bytes
    size = 2 * NUM_BLOCKS * page
    g0 = [LAYER_NAMES[i] for i in FULL_LAYERS]
    g1 = [LAYER_NAMES[i] for i in SWA_LAYERS]
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[KVCacheTensor(size=size, layers=g0, layer_stride=NUM_BLOCKS * page,
                                        block_stride=page),
                          KVCacheTensor(size=size, layers=g1, layer_stride=NUM_BLOCKS * page,
                                        block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(g0, full), KVCacheGroupSpec(g1, second)],
    )


def value(token, pos, layer, rank=0):
    """The KV the stand-in model writes (each tensor-parallel rank its own
    shard)."""
    return ((token * 31 + pos * 7 + layer * 13 + rank * 57) % 251) - 125


def unit_value(token, pos, layer, rank=0):
    """+1 or -1 (value()'s sign): KV whose exponents are one symbol."""
    return 1 if value(token, pos, layer, rank) >= 0 else -1


def group_of(layer):
    return 0 if layer in FULL_LAYERS else 1


class Rank:
    """One worker: its connector (from a copy of the config with
    parallel_config.rank set, as vLLM's worker makes it) and its KV."""

    def __init__(self, cfg, rank, extra):
        import copy
        self.rank = rank
        self.cfg = copy.deepcopy(cfg)
        self.cfg.parallel_config.rank = rank
        self.kvc = kv_cache_config()
        from openinfer.vllm import OpenInferConnector
        with set_current_vllm_config(self.cfg):
            self.conn = OpenInferConnector(self.cfg, KVConnectorRole.WORKER, self.kvc)
        if "socket" in extra:  # the sidecar maps the engine's KV: one shared allocation
            from openinfer.kvworker import shared_kv_tensors
            from vllm.v1.kv_cache_interface import create_kv_cache_views
            self.buffer, (raw,) = shared_kv_tensors([(self.kvc.kv_cache_tensors[0].size,)],
                                                    torch.int8)
            self.kv = {}
            for g, kt in zip(self.kvc.kv_cache_groups, self.kvc.kv_cache_tensors):
                views = create_kv_cache_views(raw, g.kv_cache_spec, NUM_BLOCKS,
                                              KVCacheLayout.LBHNC, kt)
                self.kv.update(zip(kt.layers, views))
            self.conn.set_shared_buffer(self.buffer)
        else:
            self.kv = allocate_kv_cache(self.kvc, torch.device("cpu"), KVCacheLayout.LBHNC)
        # the groups overlay: layer 1's block b is layer 0's block b
        assert self.kv[LAYER_NAMES[0]].data_ptr() == self.kv[LAYER_NAMES[1]].data_ptr()
        self.conn.register_kv_caches(self.kv)


class HybridEngine:
    """vLLM's scheduler and tp workers over a full + sliding-window model
    (the model writes kv(token, pos, layer, rank), or random bits: noise)."""

    def __init__(self, extra, tp=1, noise=False, kv=value):
        self.noise, self.kv_of = noise, kv
        self.cfg = vllm_config(extra, tp)
        self._ctx = set_current_vllm_config(self.cfg)
        self._ctx.__enter__()
        hash_fn = get_hash_fn_by_name(self.cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(BS, hash_fn)
        self.ranks = [Rank(self.cfg, r, extra) for r in range(tp)]
        self.conn, self.kv = self.ranks[0].conn, self.ranks[0].kv
        self.aggregator = KVOutputAggregator(tp)
        self.scheduler = Scheduler(vllm_config=self.cfg, kv_cache_config=kv_cache_config(),
                                   structured_output_manager=StructuredOutputManager(self.cfg),
                                   block_size=BS, log_stats=True)
        assert type(self.scheduler.connector).__module__ == "openinfer.vllm"
        self.requests, self.tables, self.tokens = {}, {}, {}

    def add(self, req_id, prompt, max_tokens=2):
        r = Request(req_id, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0),
                    None, block_hasher=self.hasher)
        self.requests[req_id] = r
        self.tokens[req_id] = list(prompt)
        self.scheduler.add_request(r)
        return r

    def _scheduled(self, so):
        out = []
        for nr in so.scheduled_new_reqs:
            self.tables[nr.req_id] = [list(g) for g in nr.block_ids]
            out.append((nr.req_id, nr.num_computed_tokens, so.num_scheduled_tokens[nr.req_id]))
        cr = so.scheduled_cached_reqs
        for i, req_id in enumerate(cr.req_ids):
            new = cr.new_block_ids[i]
            if req_id in cr.resumed_req_ids:
                self.tables[req_id] = [list(g) for g in new]
            elif new is not None:
                for have, add in zip(self.tables[req_id], new):
                    have.extend(add)
            out.append((req_id, cr.num_computed_tokens[i], so.num_scheduled_tokens[req_id]))
        return out

    def step(self):
        from vllm.forward_context import set_forward_context
        so = self.scheduler.schedule()
        sched = self._scheduled(so)
        kvos = [self._run_rank(rk, so, sched) for rk in self.ranks]
        req_ids, tokens = [], []
        for req_id, start, n in sched:
            req_ids.append(req_id)
            if start + n >= self.requests[req_id].num_tokens:
                tokens.append([3 + (sum(self.tokens[req_id]) % 500)])
            else:
                tokens.append([])
        outs = [ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[list(t) for t in tokens], logprobs=None,
            prompt_logprobs_dict={}, pooler_output=[], kv_connector_output=kvo)
            for kvo in kvos]
        for req_id, tok in zip(req_ids, tokens):
            self.tokens[req_id].extend(tok)
        out = self.aggregator.aggregate(outs)  # as vLLM's multiprocess executor does
        self.scheduler.update_from_output(so, out)
        return so, out.kv_connector_output

    def _run_rank(self, rk, so, sched):
        from vllm.forward_context import set_forward_context
        kts._KV_CONNECTOR_AGENT = rk.conn  # this rank's KV transfer group
        with set_forward_context(None, rk.cfg):
            with KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(so) as kvo:
                if so.total_num_scheduled_tokens:
                    for layer, name in enumerate(LAYER_NAMES):
                        rk.conn.wait_for_layer_load(name)
                        t = rk.kv[name]
                        for req_id, start, n in sched:
                            blocks, toks = self.tables[req_id][group_of(layer)], \
                                self.tokens[req_id]
                            for pos in range(start, start + n):
                                assert blocks[pos // BS] != 0, (req_id, pos, layer)
                                if self.noise:  # random bits: nothing a codec compresses
                                    t[blocks[pos // BS], :, pos % BS, :] = torch.randint(
                                        -32768, 32767, t.shape[1:2] + t.shape[3:],
                                        dtype=torch.int16).view(torch.bfloat16)
                                    continue
                                t[blocks[pos // BS], :, pos % BS, :] = float(
                                    self.kv_of(toks[pos], pos, layer, rk.rank))
                        rk.conn.save_kv_layer(name, t, None)
        return kvo

    def run(self, timeout=60):
        steps = []
        deadline = time.time() + timeout
        while self.scheduler.has_unfinished_requests():
            assert time.time() < deadline, "requests still unfinished after %d s" % timeout
            steps.append(self.step())
            if not steps[-1][0].total_num_scheduled_tokens:
                time.sleep(0.002)
        return steps

    def check_block(self, req_id, i, b, layers):
        toks = self.tokens[req_id]
        for rk in self.ranks:
            for layer in layers:
                want = torch.empty(KV_HEADS, BS, 2 * HEAD, dtype=torch.bfloat16)
                for off in range(BS):
                    pos = i * BS + off
                    want[:, off, :] = float(self.kv_of(toks[pos], pos, layer, rk.rank))
                got = rk.kv[LAYER_NAMES[layer]][b]
                assert torch.equal(got, want), (req_id, i, b, rk.rank, layer)

    def check_loaded(self, req_id, full_ids, swa_ids, first_swa):
        """The full group's blocks 0.. and the window's blocks from first_swa
        on, loaded into full_ids and swa_ids, hold the request's KV."""
        for i, blk in enumerate(full_ids):
            self.check_block(req_id, i, blk, FULL_LAYERS)
        for i, blk in enumerate(swa_ids, first_swa):
            self.check_block(req_id, i, blk, SWA_LAYERS)

    def held(self, group, hashes, rank=0):
        """How many leading blocks of `hashes` a rank's namespace of a group
        holds (through the scheduler's own query of that namespace)."""
        from openinfer.vllm import _keys
        conn = self.scheduler.connector
        i = rank * len(conn._groups) + group
        hit, raw = conn._query_shard(i, _keys(hashes), "probe")
        if raw is not None:
            conn._release_shard(i, raw)
        return hit

    def close(self):
        for rk in self.ranks:
            rk.conn.shutdown()
        self.scheduler.connector.shutdown()
        kts._KV_CONNECTOR_AGENT = None
        self._ctx.__exit__(None, None, None)
        gc.collect()


def saved_blocks(w):
    """Blocks a group's KVWorker saved (its engine's bytes saved / block)."""
    st = w.stats()
    assert st["bytes_saved"] % w.layout.block_bytes == 0
    return st["bytes_saved"] // w.layout.block_bytes


def loads_of(steps, req_id):
    return [ld for so, _ in steps for ld in so.kv_connector_metadata.loads
            if ld.req_id == req_id]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def first_kept(n):
    """The first block vLLM keeps for a sliding-window prefix of n blocks."""
    return max(0, n * BS - WINDOW + 1) // BS


def extra_of(mode, ns, request):
    if mode == "embedded":
        return {"pool_size": "64M", "namespace": ns}
    return {"socket": request.getfixturevalue("serve").socket, "namespace": ns}


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_hybrid_groups_round_trip_byte_equal_into_another_instance(tp, mode, request):
    """Instance A computes a prompt of 8 full blocks in one step: the full
    group saves all 8, the sliding-window group only the 3 its window keeps
    at the prompt's end (5, 6, 7). Instance B (new scheduler, new worker,
    empty KV) is promised all 8 blocks and loads the full group's 8 and the
    window's 3 byte-equal into the blocks vLLM gave each group; the blocks
    before the window are vLLM's null block and are never written. At
    TP = 2 every rank does so with its own shard of each group's blocks."""
    ns = "t/hybrid-rt-%s-%d" % (mode, tp)
    extra = extra_of(mode, ns, request)
    a = HybridEngine(extra, tp)
    try:
        conn = a.scheduler.connector
        assert supports_hma(conn) and len(conn._groups) == 2
        shards = [ns] if tp == 1 else [ns + "/tp%dof2-pp0of1" % r for r in range(tp)]
        assert conn._shards == [s + g for s in shards
                                for g in ("/g0of2-full", "/g1of2-swa%d" % WINDOW)]
        ra = a.add("a", PROMPT)
        a.run()
        hashes = ra.block_hashes[:8]
        assert first_kept(8) == 5
        for r in range(tp):
            assert a.held(0, hashes, r) == 8
            assert a.held(1, hashes, r) == 0  # block 0 is outside every window: never saved
            assert a.held(1, hashes[5:8], r) == 3
            for i in range(5):  # no block before the window was saved
                assert a.held(1, hashes[i:i + 1], r) == 0, i
            ws = a.ranks[r].conn.worker.workers
            assert [saved_blocks(w) for w in ws] == [8, 3]
    finally:
        a.close()
    b = HybridEngine(extra, tp)
    try:
        b.add("b", PROMPT[:8 * BS] + [7, 8, 9])
        steps = b.run()
        (ld,) = loads_of(steps, "b")
        full_ids, swa_ids = ld.group_block_ids
        assert len(ld.leases) == 2 * tp
        assert full_ids == b.tables["b"][0][:8]
        assert swa_ids == b.tables["b"][1][5:8]
        assert b.tables["b"][1][:5] == [0] * 5  # vLLM's null block: nothing loaded there
        b.check_loaded("b", full_ids, swa_ids, 5)
        for rk in b.ranks:
            st = rk.conn.stats()
            assert (st["loads_submitted"], st["loads_completed"], st["loads_failed"]) == \
                (1, 1, 0), (rk.rank, st)
            assert [w.stats()["blocks_loaded"] for w in rk.conn.worker.workers] == [8, 3]
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _ in steps) == 3 + 1
        assert not any(kvo and (kvo.invalid_block_ids or kvo.failed_recving)
                       for _, kvo in steps)
        loaded = [kvo.kv_connector_stats.data for _, kvo in steps
                  if kvo and kvo.kv_connector_stats]
        assert sum(d["loaded_blocks"] for d in loaded) == 11 * tp
        page = specs()[0].page_size_bytes * 2  # a group's block: its two layers
        assert sum(d["loaded_bytes"] for d in loaded) == 11 * page * tp
    finally:
        b.close()


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
def test_hybrid_groups_under_a_codec(mode, request):
    """Under codec lossless each group's namespace stores frames: KV that
    compresses into the slot of these small blocks (2 KiB: a 1,280-byte
    slot; the model writes +1 or -1) round-trips byte-equal into another
    instance (8 full blocks, the window's 3); random bits are not stored:
    the groups' 11 blocks are the failure save_not_encoded, not saved
    blocks, and a later instance computes them again."""
    extra = dict(extra_of(mode, "t/hybrid-codec-" + mode, request), codec="lossless")
    if mode == "embedded":  # a host of its own: the process's shared one serves 8 block sizes
        extra["pool_size"] = "48M"
    a = HybridEngine(extra, kv=unit_value)
    try:
        ra = a.add("a", PROMPT)
        a.run()
        hashes = ra.block_hashes[:8]
        ws = a.ranks[0].conn.worker.workers
        assert a.held(0, hashes) == 8 and a.held(1, hashes[5:8]) == 3
        assert [saved_blocks(w) for w in ws] == [8, 3]
        assert [w.codec for w in ws] == ["lossless", "lossless"]
    finally:
        a.close()
    b = HybridEngine(extra, kv=unit_value)
    try:
        b.add("b", PROMPT[:8 * BS] + [7, 8, 9])
        steps = b.run()
        (ld,) = loads_of(steps, "b")
        full_ids, swa_ids = ld.group_block_ids
        b.check_loaded("b", full_ids, swa_ids, 5)
    finally:
        b.close()
    noisy = list(range(6000, 6000 + 8 * BS + 3))
    c = HybridEngine(dict(extra, namespace="t/hybrid-codec-noise-" + mode), noise=True)
    try:
        c.add("c", noisy)
        steps = c.run()
        ws = c.ranks[0].conn.worker.workers
        assert [w.stats()["saves_not_encoded"] for w in ws] == [8, 3]
        stats = [kvo.kv_connector_stats.data for _, kvo in steps
                 if kvo and kvo.kv_connector_stats]
        assert sum(d.get("failures", {}).get("save_not_encoded", 0) for d in stats) == 11, stats
        assert sum(d.get("saved_blocks", 0) for d in stats) == 0, stats
    finally:
        c.close()
    d = HybridEngine(dict(extra, namespace="t/hybrid-codec-noise-" + mode))
    try:
        d.add("d", noisy[:8 * BS] + [7])
        steps = d.run()
        assert loads_of(steps, "d") == []  # nothing stored: computed again
    finally:
        d.close()


def test_a_block_a_group_lacks_is_never_promised():
    """The prompt's first 4 blocks are computed by one request, the next 4
    by another (vLLM's own prefix cache serves it the first 4): the
    sliding-window group saves blocks 1-3 (the window at block 4) and 5-7
    (the window at block 8), never block 4. With block 6 of the window lost,
    another instance is promised 4 blocks, not 8 nor 6 (whose window needs
    block 4): the full group's 0-3 and the window's 1-3, byte-equal. With
    the window's blocks all lost, nothing is promised."""
    ns = "t/hybrid-lack"
    a = HybridEngine({"pool_size": "64M", "namespace": ns})
    try:
        ws = a.conn.worker.workers
        orig = a.conn.worker.begin_groups
        lost = []

        def lose_block_6(saves):
            (ids0, h0), (ids1, h1) = saves
            keys = [h1[i:i + 16] for i in range(0, len(h1), 16)]
            keep = [i for i, k in enumerate(keys) if k != want6]
            lost.extend(i for i in range(len(keys)) if i not in keep)
            return orig([(ids0, h0), ([ids1[i] for i in keep],
                                      b"".join(keys[i] for i in keep))])
        from openinfer.vllm import _keys
        probe = Request("p", list(PROMPT), SamplingParams(max_tokens=1), None,
                        block_hasher=a.hasher)
        want6 = _keys(probe.block_hashes[6:7]).tobytes()
        a.conn.worker.begin_groups = lose_block_6
        a.add("a1", PROMPT[:4 * BS] + [1])
        a.run()
        assert [saved_blocks(w) for w in ws] == [4, 3]
        a.add("a2", PROMPT)
        a.run()
        assert len(lost) == 1
        hashes = probe.block_hashes[:8]
        assert a.held(0, hashes) == 8
        assert a.held(1, hashes[1:4]) == 3 and a.held(1, hashes[4:5]) == 0
        assert a.held(1, hashes[5:6]) == 1 and a.held(1, hashes[6:7]) == 0
        assert a.held(1, hashes[7:8]) == 1
    finally:
        a.close()
    b = HybridEngine({"pool_size": "64M", "namespace": ns})
    try:
        b.add("b", PROMPT)
        steps = b.run()
        (ld,) = loads_of(steps, "b")
        full_ids, swa_ids = ld.group_block_ids
        assert len(full_ids) == 4 and len(swa_ids) == 3, ld
        b.check_loaded("b", full_ids, swa_ids, 1)
        # blocks 4.. were computed, and hold what the model wrote
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _ in steps) >= len(PROMPT) - 4 * BS
        for i in range(4, 8):
            b.check_block("b", i, b.tables["b"][0][i], FULL_LAYERS)
    finally:
        b.close()

    c = HybridEngine({"pool_size": "64M", "namespace": ns + "-nowindow"})
    try:
        orig = c.conn.worker.begin_groups
        c.conn.worker.begin_groups = lambda saves: orig([saves[0], ([], b"")])
        c.add("a", PROMPT)
        c.run()
        assert saved_blocks(c.conn.worker.workers[0]) == 8
        assert c.scheduler.reset_prefix_cache()
        probe = Request("probe", list(PROMPT), SamplingParams(max_tokens=2, temperature=0),
                        None, block_hasher=c.hasher)
        assert c.scheduler.connector.get_num_new_matched_tokens(probe, 0) == (0, False)
        c.add("b", PROMPT)
        assert not loads_of(c.run(), "b")
    finally:
        c.close()


def test_a_restore_plan_of_fewer_blocks_gets_a_prefix_every_group_serves():
    """The sliding-window group holds the windows at blocks 4 and 8 (1-3,
    5-7) and the restore plan chooses to load 6 of the 8 blocks: 6 would
    need window blocks 3-5, and block 4 is not held, so the scheduler
    promises 4 (window 1-3), leased again for exactly that, and the load
    lands byte-equal instead of failing."""
    ns = "t/hybrid-plan"
    a = HybridEngine({"pool_size": "64M", "namespace": ns})
    try:
        a.add("a1", PROMPT[:4 * BS] + [1])
        a.run()
        a.add("a2", PROMPT)
        a.run()
    finally:
        a.close()
    b = HybridEngine({"pool_size": "64M", "namespace": ns})
    try:
        conn = b.scheduler.connector
        asked = []

        def six(start, num_tokens, hit, where):
            asked.append(hit)
            return min(hit, 6)
        conn._planner.blocks = six
        b.add("b", PROMPT)
        steps = b.run()
        assert asked == [8]
        (ld,) = loads_of(steps, "b")
        full_ids, swa_ids = ld.group_block_ids
        assert len(full_ids) == 4 and len(swa_ids) == 3, ld
        assert not any(kvo and (kvo.invalid_block_ids or kvo.failed_recving)
                       for _, kvo in steps)
        assert b.conn.stats()["loads_completed"] == 1
        b.check_loaded("b", full_ids, swa_ids, 1)
    finally:
        b.close()


def test_a_failed_hybrid_load_is_recomputed_through_failed_recving():
    """The sliding-window group's lease is gone before the worker loads: the
    load fails, the request is named in failed_recving (block ids are per
    group), and vLLM recomputes it; every group's blocks then hold what the
    model computed."""
    ns = "t/hybrid-fail"
    eng = HybridEngine({"pool_size": "64M", "namespace": ns})
    try:
        eng.add("a", PROMPT)
        eng.run()
        assert eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        conn = eng.scheduler.connector
        orig = conn.build_connector_meta

        def drop_window_lease(so):
            meta = orig(so)
            for ld in meta.loads:
                conn._release_shard(1, ld.leases[1])
            return meta
        conn.build_connector_meta = drop_window_lease
        eng.add("b", PROMPT)
        steps = eng.run()
        (ld,) = loads_of(steps, "b")
        assert {r for _, kvo in steps if kvo for r in kvo.failed_recving} == {"b"}
        assert not any(kvo and kvo.invalid_block_ids for _, kvo in steps)
        st = eng.conn.stats()
        assert (st["loads_completed"], st["loads_failed"]) == (0, 1), st
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _ in steps) >= len(PROMPT)
        for i in range(8):
            eng.check_block("b", i, eng.tables["b"][0][i], FULL_LAYERS)
        for i in range(first_kept(8), 8):
            eng.check_block("b", i, eng.tables["b"][1][i], SWA_LAYERS)
    finally:
        eng.close()


def test_hybrid_shapes_the_connector_cannot_serve_are_refused_at_start():
    """A Mamba group, sync loads with several groups, pipeline parallelism
    with several groups: refused when the connector is made, naming what."""
    from openinfer.vllm import OpenInferConnector
    cfg = vllm_config({"pool_size": "16M"})
    mamba = MambaSpec(block_size=BS, shapes=((4, 4),), dtypes=(torch.bfloat16,))
    with pytest.raises(NotImplementedError, match="group 1 of 2 \\(MambaSpec"):
        OpenInferConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config(mamba))
    full, _ = specs()
    other_bs = SlidingWindowSpec(block_size=2 * BS, num_kv_heads=KV_HEADS, head_size=HEAD,
                                 dtype=torch.bfloat16, sliding_window=WINDOW)
    with pytest.raises(NotImplementedError, match="block size is 32"):
        OpenInferConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config(other_bs))
    sync = vllm_config({"pool_size": "16M", "load_async": False})
    with pytest.raises(ValueError, match="'load_async' is false.*several KV cache groups"):
        OpenInferConnector(sync, KVConnectorRole.SCHEDULER, kv_cache_config())
    # load_async not given: a hybrid model gets asynchronous loads (the
    # configuration that served it as one group before still starts)
    unset = vllm_config({"pool_size": "16M"})
    del unset.kv_transfer_config.kv_connector_extra_config["load_async"]
    c = OpenInferConnector(unset, KVConnectorRole.SCHEDULER, kv_cache_config())
    assert c._groups is not None and c._opts.load_async is True
    c.shutdown()
    # one group: the single-group path, sync loads allowed
    one = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(list(LAYER_NAMES), full)])
    c = OpenInferConnector(sync, KVConnectorRole.SCHEDULER, one)
    assert c._groups is None and c._shards == [c._namespace]
    c.shutdown()
    pp = vllm_config({"pool_size": "16M", "socket": "/nonexistent.sock"})
    pp.parallel_config.pipeline_parallel_size = 2
    with pytest.raises(NotImplementedError, match="pipeline_parallel_size is 2 with 2 KV"):
        OpenInferConnector(pp, KVConnectorRole.SCHEDULER, kv_cache_config())
