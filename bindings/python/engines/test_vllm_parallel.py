"""openinfer.vllm under tensor and pipeline parallelism, against the real vLLM
on the CPU.

vLLM's own ``Scheduler`` with a VllmConfig of tensor_parallel_size and
pipeline_parallel_size > 1, and one worker-side connector per rank, each made
from a copy of the config with ``parallel_config.rank`` set as vLLM's worker
sets it, over KV tensors of its own from vLLM's ``allocate_kv_cache`` (a
pipeline stage holds only its layers). Every rank is driven through vLLM's
``KVConnectorModelRunnerMixin`` (its KV transfer group is that rank's
connector while it runs), and the ranks' outputs are combined by vLLM's
``KVOutputAggregator`` as vLLM's multiprocess executor combines them, then
fed to the scheduler. The stand-in model writes KV that differs per rank
(each rank has its own shard of every block), so a shard loaded into the
wrong rank would show.

Shown (embedded and through the sidecar): a prefix saved by one TP=2 (and
PP=2, and TP=2 x PP=2) instance loads byte-equal into every rank of another;
each rank redeems its lease once; a block one rank's shard of which is
missing is never promised (the shortest common prefix is, and nothing when
a rank holds nothing); a load that fails on one rank is recomputed on every
rank. An MLA model (vLLM's MLAAttentionSpec: one latent per token, the same
on every TP rank) is written once per pipeline stage, by TP rank 0, and
every TP rank loads that copy. Data parallel replicas (two engines with
vLLM's data_parallel settings) share the namespace through the sidecar."""
import copy
import gc
import os
import time

import pytest
import torch

import openinfer as oi

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         ParallelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config)
import vllm.distributed.kv_transfer.kv_transfer_state as kts
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MLAAttentionSpec)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
from vllm.v1.worker.utils import allocate_kv_cache

TINY = os.environ.get("OPENINFER_TINY_MODEL",
                      os.path.join(os.path.dirname(__file__), "tiny-model"))
BS = 16
NUM_BLOCKS = 48
LAYERS = 4
KV_HEADS, HEAD = 1, 16  # per rank
MLA_DIM = 40  # an MLA model's latent per token (kv_lora_rank + rope dims), every rank
LAYER_NAMES = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]
PROMPT = list(range(2000, 2000 + 5 * BS + 3))  # 5 full blocks and a tail


def vllm_config(extra, tp, pp, load_async=False, dp=None, backend="auto"):
    """dp: (data_parallel_size, data_parallel_rank) of a replica; backend:
    distributed_executor_backend ('auto': 'uni' embedded, 'mp' sidecar;
    None: vLLM's own default)."""
    extra = dict({"load_async": load_async}, **extra)
    if backend == "auto":
        backend = "uni" if "socket" not in extra else "mp"
    dp_kw = {} if dp is None else dict(data_parallel_size=dp[0], data_parallel_rank=dp[1])
    model = ModelConfig(model=TINY, tokenizer=TINY, skip_tokenizer_init=True, dtype="bfloat16",
                        max_model_len=1024, seed=0)
    cfg = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BS, enable_prefix_caching=True),
        parallel_config=ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                       distributed_executor_backend=backend, **dp_kw),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024,
                                         max_model_len=1024, is_encoder_decoder=False),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OpenInferConnector", kv_connector_module_path="openinfer.vllm",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config=extra),
    )
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    return cfg


def kv_cache_config(layer_names, mla=False):
    """One group of these layers: full attention of KV_HEADS heads per rank,
    or (mla) vLLM's MLAAttentionSpec: one latent of MLA_DIM per token, no K/V
    split, views of [blocks, 1, tokens, MLA_DIM]."""
    if mla:
        spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=MLA_DIM,
                                dtype=torch.bfloat16)
    else:
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD,
                                 dtype=torch.bfloat16)
    page = spec.page_size_bytes
    n = len(layer_names)
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[KVCacheTensor(size=n * NUM_BLOCKS * page, layers=list(layer_names),
                                        layer_stride=NUM_BLOCKS * page, block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(list(layer_names), spec)],
    )


def value(token, pos, layer, rank):
    """The KV the stand-in model writes on a rank (each rank its own shard;
    an MLA model's latent is the same on every rank: rank None)."""
    return ((token * 31 + pos * 7 + layer * 13 + (rank or 0) * 57) % 251) - 125


class Rank:
    """One worker: its connector (the worker role, made from a copy of the
    config with parallel_config.rank set, as vLLM's worker does) and its KV
    tensors (a pipeline stage: only its layers)."""

    def __init__(self, cfg, rank, tp, pp, shared_kv, mla=False):
        self.rank = rank
        self.shard = None if mla else rank  # the KV it writes: MLA's is every rank's
        self.cfg = copy.deepcopy(cfg)
        self.cfg.parallel_config.rank = rank
        per_stage = LAYERS // pp
        stage = rank // tp
        self.layers = list(range(stage * per_stage, (stage + 1) * per_stage))
        names = [LAYER_NAMES[i] for i in self.layers]
        self.kvc = kv_cache_config(names, mla)
        from openinfer.vllm import OpenInferConnector
        with set_current_vllm_config(self.cfg):
            self.conn = OpenInferConnector(self.cfg, KVConnectorRole.WORKER, self.kvc)
        if shared_kv:
            from openinfer.kvworker import shared_kv_tensors
            from vllm.v1.kv_cache_interface import create_kv_cache_views
            spec = self.kvc.kv_cache_groups[0].kv_cache_spec
            self.buffer, (raw,) = shared_kv_tensors(
                [(len(names) * NUM_BLOCKS * spec.page_size_bytes,)], torch.int8)
            views = create_kv_cache_views(raw, spec, NUM_BLOCKS, KVCacheLayout.LBHNC,
                                          self.kvc.kv_cache_tensors[0])
            self.kv = dict(zip(names, views))
            self.conn.set_shared_buffer(self.buffer)
        else:
            self.kv = allocate_kv_cache(self.kvc, torch.device("cpu"), KVCacheLayout.LBHNC)
        self.conn.register_kv_caches(self.kv)


class ParallelEngine:
    """vLLM's scheduler and tp x pp worker ranks, each with its connector."""

    def __init__(self, extra, tp, pp, load_async=False, mla=False, dp=None, backend="auto"):
        self.tp, self.pp, self.mla = tp, pp, mla
        self.shared_kv = "socket" in extra
        self.cfg = vllm_config(extra, tp, pp, load_async, dp, backend)
        self._ctx = set_current_vllm_config(self.cfg)
        self._ctx.__enter__()
        hash_fn = get_hash_fn_by_name(self.cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(BS, hash_fn)
        self.scheduler = Scheduler(vllm_config=self.cfg, kv_cache_config=kv_cache_config(
            LAYER_NAMES, mla), structured_output_manager=StructuredOutputManager(self.cfg),
            block_size=BS, log_stats=True)
        assert type(self.scheduler.connector).__module__ == "openinfer.vllm"
        self.ranks = [Rank(self.cfg, r, tp, pp, self.shared_kv, mla) for r in range(tp * pp)]
        self.aggregator = KVOutputAggregator(tp * pp)
        self.requests, self.block_table, self.tokens = {}, {}, {}

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
            self.block_table[nr.req_id] = list(nr.block_ids[0])
            out.append((nr.req_id, nr.num_computed_tokens, so.num_scheduled_tokens[nr.req_id]))
        cr = so.scheduled_cached_reqs
        for i, req_id in enumerate(cr.req_ids):
            new = cr.new_block_ids[i]
            if req_id in cr.resumed_req_ids:
                self.block_table[req_id] = list(new[0])
            elif new is not None:
                self.block_table[req_id].extend(new[0])
            out.append((req_id, cr.num_computed_tokens[i], so.num_scheduled_tokens[req_id]))
        return out

    def _run_rank(self, rk, so, sched):
        from vllm.forward_context import set_forward_context
        kts._KV_CONNECTOR_AGENT = rk.conn  # this rank's KV transfer group
        with set_forward_context(None, rk.cfg):
            with KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(so) as kvo:
                if so.total_num_scheduled_tokens:
                    for layer in rk.layers:
                        name = LAYER_NAMES[layer]
                        rk.conn.wait_for_layer_load(name)
                        t = rk.kv[name]
                        for req_id, start, n in sched:
                            blocks, toks = self.block_table[req_id], self.tokens[req_id]
                            for pos in range(start, start + n):
                                t[blocks[pos // BS], :, pos % BS, :] = float(
                                    value(toks[pos], pos, layer, rk.shard))
                        rk.conn.save_kv_layer(name, t, None)
        return kvo

    def step(self):
        so = self.scheduler.schedule()
        sched = self._scheduled(so)
        req_ids, tokens = [], []
        for req_id, start, n in sched:
            req_ids.append(req_id)
            if start + n >= self.requests[req_id].num_tokens:
                tok = 3 + (sum(self.tokens[req_id]) % 500)
                tokens.append([tok])
            else:
                tokens.append([])
        outs = []
        for rk in self.ranks:
            kvo = self._run_rank(rk, so, sched)
            outs.append(ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[list(t) for t in tokens], logprobs=None,
                prompt_logprobs_dict={}, pooler_output=[], kv_connector_output=kvo))
        for req_id, tok in zip(req_ids, tokens):
            self.tokens[req_id].extend(tok)
        out = self.aggregator.aggregate(outs)  # as vLLM's multiprocess executor does
        self.scheduler.update_from_output(so, out)
        return so, out.kv_connector_output, [o.kv_connector_output for o in outs]

    def run(self, timeout=60):
        steps = []
        deadline = time.time() + timeout
        while self.scheduler.has_unfinished_requests():
            assert time.time() < deadline, "requests still unfinished after %d s" % timeout
            steps.append(self.step())
            if not steps[-1][0].total_num_scheduled_tokens:
                time.sleep(0.002)
        return steps

    def reset(self):
        """Empties vLLM's own prefix cache and every KV tensor, so that a
        later hit must come from the tier."""
        assert self.scheduler.reset_prefix_cache()
        for rk in self.ranks:
            for t in rk.kv.values():
                t.zero_()

    def check_block(self, req_id, i, b):
        """Block b holds the i-th block of req_id on every rank, byte for byte."""
        toks = self.tokens[req_id]
        for rk in self.ranks:
            for layer in rk.layers:
                want = torch.empty(*((1, BS, MLA_DIM) if self.mla else
                                     (KV_HEADS, BS, 2 * HEAD)), dtype=torch.bfloat16)
                for off in range(BS):
                    pos = i * BS + off
                    want[:, off, :] = float(value(toks[pos], pos, layer, rk.shard))
                got = rk.kv[LAYER_NAMES[layer]][b]
                assert torch.equal(got, want), (req_id, i, b, rk.rank, layer)

    def close(self):
        for rk in self.ranks:
            rk.conn.shutdown()
        self.scheduler.connector.shutdown()
        kts._KV_CONNECTOR_AGENT = None
        self._ctx.__exit__(None, None, None)
        gc.collect()


def loads_of(steps, req_id):
    return [ld for so, _, _ in steps for ld in so.kv_connector_metadata.loads
            if ld.req_id == req_id]


def check_loaded(eng, steps, req_id, blocks, leases=None):
    """req_id's one load: `blocks` blocks (and `leases` leases when given),
    each byte-equal to the prompt's KV. @return the load."""
    (ld,) = loads_of(steps, req_id)
    assert len(ld.block_ids) == blocks, ld
    if leases is not None:
        assert len(ld.leases) == leases, ld
    for i, blk in enumerate(ld.block_ids):
        eng.check_block(req_id, i, blk)
    return ld


def check_every_rank_loaded(eng, steps, blocks, loads):
    """Each rank of eng loaded `blocks` blocks in one load, none invalid, and
    vLLM's aggregation of the ranks' connector stats counts `loads` blocks."""
    for rk in eng.ranks:
        st = rk.conn.stats()
        assert (st["loads_submitted"], st["loads_completed"], st["loads_failed"]) == \
            (1, 1, 0), (rk.rank, st)
        assert rk.conn.worker.stats()["blocks_loaded"] == blocks
    assert not any(kvo and kvo.invalid_block_ids for _, kvo, _ in steps)
    loaded = sum(kvo.kv_connector_stats.data["loaded_blocks"] for _, kvo, _ in steps
                 if kvo and kvo.kv_connector_stats)
    assert loaded == loads


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def extra_of(mode, ns, request):
    if mode == "embedded":
        return {"pool_size": "64M", "namespace": ns}
    return {"socket": request.getfixturevalue("serve").socket, "namespace": ns}


SHAPES = [(2, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
@pytest.mark.parametrize("tp,pp", SHAPES, ids=["tp2", "pp2", "tp2pp2"])
def test_a_prefix_saved_at_tp_pp_loads_byte_equal_into_another_instance(tp, pp, mode,
                                                                         request):
    """Instance A (tp x pp ranks) computes and saves a prompt; instance B, a
    new scheduler and new workers of the same shape over empty KV tensors,
    is promised its 5 full blocks and every rank loads its own shard of
    each, byte for byte; each rank's lease is redeemed exactly once."""
    ns = "t/par-%s-%d-%d" % (mode, tp, pp)
    extra = extra_of(mode, ns, request)
    a = ParallelEngine(extra, tp, pp)
    try:
        shards = a.scheduler.connector._shards
        assert len(shards) == tp * pp and len(set(shards)) == tp * pp
        assert [rk.conn._shard_namespace for rk in a.ranks] == shards
        a.add("a", PROMPT)
        a.run()
        for rk in a.ranks:
            assert rk.conn.worker.stats()["saves_completed"] >= 5
    finally:
        a.close()
    b = ParallelEngine(extra, tp, pp)
    try:
        b.add("b", PROMPT[:5 * BS] + [7, 8, 9])
        steps = b.run()
        ld = check_loaded(b, steps, "b", 5, leases=tp * pp)
        # vLLM's aggregation of the ranks' connector stats: every rank's shards
        check_every_rank_loaded(b, steps, 5, 5 * tp * pp)
        computed = sum(so.num_scheduled_tokens.get("b", 0) for so, _, _ in steps)
        assert computed < len(PROMPT)
        if mode == "embedded":  # each shard's lease was consumed by its one load
            host = b.scheduler.connector._host
            for ns_r, raw in zip(b.scheduler.connector._shards, ld.leases):
                with pytest.raises(oi.LeaseExpiredError):
                    host.release(ns_r, raw)
    finally:
        b.close()


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
def test_a_block_one_rank_lacks_is_never_promised(mode, request):
    """TP=2; rank 1's save of the third block is lost (as when its save
    fails). Another instance is promised only the first two blocks -- the
    prefix every rank holds -- and loads them byte-equal on both ranks.
    When rank 1 saved nothing at all, nothing is promised."""
    ns = "t/missing-%s" % mode
    extra = extra_of(mode, ns, request)
    a = ParallelEngine(extra, 2, 1)
    try:
        w1 = a.ranks[1].conn.worker
        orig = w1.begin_step

        def lose_third(ids, hashes):  # rank 1 never saves block 2 of the prompt
            keep = [i for i in range(len(ids)) if i != 2]
            return orig([ids[i] for i in keep], oi.BlockHashes(b"".join(
                hashes[i] for i in keep)))
        w1.begin_step = lose_third
        a.add("a", PROMPT)
        a.run()
    finally:
        a.close()
    b = ParallelEngine(extra, 2, 1)
    try:
        b.add("b", PROMPT)
        steps = b.run()
        check_loaded(b, steps, "b", 2)  # not 5: rank 1 lacks block 2
        # the rest of the prompt was computed
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _, _ in steps) >= \
            len(PROMPT) - 2 * BS
    finally:
        b.close()

    c = ParallelEngine(dict(extra, namespace=ns + "-none"), 2, 1)
    try:
        c.ranks[1].conn.worker.begin_step = lambda ids, hashes: None  # rank 1 saves nothing
        c.add("a", PROMPT)
        c.run()
        assert c.ranks[0].conn.worker.stats()["saves_completed"] >= 5
        c.reset()
        probe = Request("probe", list(PROMPT), SamplingParams(max_tokens=2, temperature=0),
                        None, block_hasher=c.hasher)
        assert c.scheduler.connector.get_num_new_matched_tokens(probe, 0) == (0, False)
        c.add("b", PROMPT)
        assert not loads_of(c.run(), "b")
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_a_load_that_fails_on_one_rank_is_recomputed_on_every_rank(load_async, mode, request):
    """TP=2: rank 1's lease is gone before it loads (released behind its
    back: in the embedded pool, or through the scheduler's lookup session
    with the sidecar). Rank 0's load lands, rank 1's fails; vLLM's
    aggregation reports the blocks invalid for the instance, the scheduler
    recomputes them, and afterwards every rank's blocks hold what the model
    computed."""
    ns = "t/fail-one-%s-%s" % (mode, load_async)
    eng = ParallelEngine(extra_of(mode, ns, request), 2, 1, load_async)
    try:
        eng.add("a", PROMPT)
        eng.run()
        eng.reset()
        conn = eng.scheduler.connector
        orig = conn.build_connector_meta

        def drop_rank1(so):
            meta = orig(so)
            for ld in meta.loads:  # rank 1's shard lease released: its load fails
                conn._release_shard(1, ld.leases[1])
            return meta
        conn.build_connector_meta = drop_rank1
        eng.add("b", PROMPT)
        steps = eng.run()
        (ld,) = loads_of(steps, "b")
        assert len(ld.block_ids) == 5
        failed = set().union(*[kvo.invalid_block_ids for _, kvo, _ in steps if kvo])
        assert failed == set(ld.block_ids)
        r0 = eng.ranks[0].conn.stats()
        r1 = eng.ranks[1].conn.stats()
        assert (r0["loads_completed"], r0["loads_failed"]) == (1, 0), r0
        assert (r1["loads_completed"], r1["loads_failed"]) == (0, 1), r1
        # recomputed on both ranks (rank 0's landed bytes were overwritten by
        # the same values, rank 1's zeros by the model's)
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _, _ in steps) >= len(PROMPT)
        for i, blk in enumerate(eng.block_table["b"][:5]):
            eng.check_block("b", i, blk)
    finally:
        eng.close()


MLA_SHAPES = [(1, 1), (2, 1), (2, 2)]


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
@pytest.mark.parametrize("tp,pp", MLA_SHAPES, ids=["tp1", "tp2", "tp2pp2"])
def test_an_mla_prefix_is_written_once_and_loads_byte_equal_into_another_instance(tp, pp, mode,
                                                                                   request):
    """An MLA model (vLLM's MLAAttentionSpec; the latent is the same on every
    TP rank): instance A saves a prompt, instance B (new scheduler, new
    workers over empty KV tensors, same shape) is promised its 5 full blocks
    and every rank loads them byte for byte. Each pipeline stage has one
    namespace (no TP rank in it), written by its TP rank 0 only (the other
    TP ranks submit no save: 5 blocks per stage, not per rank); the
    scheduler takes one lease per stage with tp shares, each TP rank of the
    stage redeems one, and no more load of it is possible."""
    ns = "t/mla-%s-%d-%d" % (mode, tp, pp)
    extra = extra_of(mode, ns, request)
    a = ParallelEngine(extra, tp, pp, mla=True)
    try:
        conn = a.scheduler.connector
        assert conn._latent and conn._consumers == tp
        want = [ns] if pp == 1 else ["%s/pp%dof%d" % (ns, p, pp) for p in range(pp)]
        assert conn._shards == want
        assert [rk.conn._shard_namespace for rk in a.ranks] == \
            [want[r // tp] for r in range(tp * pp)]
        a.add("a", PROMPT)
        steps = a.run()
        for rk in a.ranks:
            st = rk.conn.worker.stats()
            if rk.rank % tp == 0:  # the stage's writer
                assert st["saves_completed"] >= 5, (rk.rank, st)
            else:
                assert st["saves_submitted"] == 0, (rk.rank, st)
        saved = sum(kvo.kv_connector_stats.data["saved_blocks"] for _, kvo, _ in steps
                    if kvo and kvo.kv_connector_stats)
        assert saved == 5 * pp  # once per stage, whatever tp is
    finally:
        a.close()
    b = ParallelEngine(extra, tp, pp, mla=True)
    try:
        conn = b.scheduler.connector
        if mode == "embedded":  # each stage's latent is held, in its one namespace
            for ns_p in want:
                assert list(conn._host.query_membership(
                    ns_p, _block_keys(b, PROMPT[:5 * BS]))) == [1] * 5
        b.add("b", PROMPT[:5 * BS] + [7, 8, 9])
        steps = b.run()
        ld = check_loaded(b, steps, "b", 5, leases=pp)
        check_every_rank_loaded(b, steps, 5, 5 * tp * pp)  # every rank: the stage's one copy
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _, _ in steps) < len(PROMPT)
        if mode == "embedded":  # each stage's lease: tp loads, then spent
            host = conn._host
            for ns_p, raw in zip(want, ld.leases):
                with pytest.raises(oi.LeaseExpiredError):
                    host.release(ns_p, raw)
    finally:
        b.close()


def _block_keys(eng, prompt):
    """The tier's keys of a prompt's full blocks (vLLM's block hashes)."""
    from openinfer.vllm import _keys
    r = Request("keys", list(prompt), SamplingParams(max_tokens=1), None,
                block_hasher=eng.hasher)
    return _keys(r.block_hashes)


def test_mla_kv_tensors_of_three_dimensions_register_as_the_views():
    """vLLM 0.33 hands the connector MLA layers as [blocks, 1, tokens,
    latent] views; older MLA backends' shape is [blocks, tokens, latent].
    Both register as one segment per block over the same bytes."""
    from openinfer.kvworker import KVLayout
    kvc = kv_cache_config(LAYER_NAMES, mla=True)
    kv = allocate_kv_cache(kvc, torch.device("cpu"), KVCacheLayout.LBHNC)
    assert next(iter(kv.values())).shape == (NUM_BLOCKS, 1, BS, MLA_DIM)
    four = KVLayout.from_tensors(kv, NUM_BLOCKS)
    three = KVLayout.from_tensors({n: t.squeeze(1) for n, t in kv.items()}, NUM_BLOCKS)
    page = kvc.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    assert four.block_bytes == three.block_bytes == LAYERS * page
    for x, y in zip(four.regions, three.regions):
        assert (x.ptr, x.extent, x.block_stride, x.chunk, x.segments) == \
            (y.ptr, y.extent, y.block_stride, y.chunk, y.segments)
        assert x.segments == [0] and x.chunk == page


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_dp_replicas_share_the_namespace_through_the_sidecar(tp, serve):
    """Data parallelism: two replicas (each its own scheduler and workers,
    as vLLM's DP engine cores are), data_parallel_size 2 and ranks 0 and 1,
    both up at once on one sidecar. They derive the same namespace (the DP
    rank is not in it: replicas compute the same KV); a prompt replica 0
    computed is promised to replica 1 and every rank of replica 1 loads
    replica 0's bytes of its shard, then the other way round."""
    extra = {"socket": serve.socket}
    r0 = ParallelEngine(extra, tp, 1, dp=(2, 0))
    r1 = ParallelEngine(extra, tp, 1, dp=(2, 1))
    try:
        assert r0.cfg.parallel_config.data_parallel_rank == 0
        assert r1.cfg.parallel_config.data_parallel_rank == 1
        assert r0.scheduler.connector._shards == r1.scheduler.connector._shards
        assert r0.scheduler.connector._namespace.startswith("vllm/tiny-model/")
        r0.add("a", PROMPT)
        r0.run()
        r1.add("b", PROMPT[:5 * BS] + [7, 8, 9])
        steps = r1.run()
        check_loaded(r1, steps, "b", 5)
        # the 3 tokens past the 5 blocks, then one decode step
        assert [so.num_scheduled_tokens["b"] for so, _, _ in steps
                if "b" in so.num_scheduled_tokens] == [3, 1]
        other = list(range(4000, 4000 + 3 * BS + 1))
        r1.add("c", other)
        r1.run()
        r0.add("d", other[:3 * BS] + [5])
        steps = r0.run()
        check_loaded(r0, steps, "d", 3)
    finally:
        r1.close()
        r0.close()


def test_dp_replicas_embedded():
    """Data parallelism, embedded: vLLM's default executor for a replica of
    data_parallel_size > 1 is 'mp' (the worker is another process), which
    the embedded scheduler refuses naming the sidecar; with
    distributed_executor_backend 'uni' a replica runs, its pool its own
    (each DP engine core is its own process): a prefix it saved loads
    byte-equal into its own later request."""
    from openinfer.vllm import OpenInferConnector
    cfg = vllm_config({"pool_size": "64M"}, 1, 1, dp=(2, 1), backend=None)
    assert cfg.parallel_config.distributed_executor_backend == "mp"  # vLLM's default for DP
    with pytest.raises(ValueError, match="'mp' use the sidecar"):
        OpenInferConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config(LAYER_NAMES))
    eng = ParallelEngine({"pool_size": "64M", "namespace": "t/dp-uni"}, 1, 1, dp=(2, 1),
                         backend="uni")
    try:
        eng.add("a", PROMPT)
        eng.run()
        eng.reset()
        eng.add("b", PROMPT[:5 * BS] + [7, 8, 9])
        steps = eng.run()
        check_loaded(eng, steps, "b", 5)
    finally:
        eng.close()


def test_shard_namespaces_and_ranks():
    """The shard namespaces are in vLLM's rank order, the rank comes from
    parallel_config.rank, an over-long namespace is refused naming the
    option, and context parallelism is refused."""
    from openinfer import _config
    from openinfer.vllm import _shard_namespaces, _worker_rank, OpenInferConnector
    assert _shard_namespaces("n", 1, 1) == ["n"]
    assert _shard_namespaces("n", 2, 2) == ["n/tp0of2-pp0of2", "n/tp1of2-pp0of2",
                                            "n/tp0of2-pp1of2", "n/tp1of2-pp1of2"]
    # MLA: a namespace per stage, shared by its TP ranks
    assert _shard_namespaces("n", 2, 1, latent=True) == ["n"]
    assert _shard_namespaces("n", 2, 2, latent=True) == ["n/pp0of2", "n/pp1of2"]
    cfg = vllm_config({"pool_size": "16M"}, 2, 2)
    for rank, want in [(0, (0, 0)), (1, (1, 0)), (2, (0, 1)), (3, (1, 1)), (5, (1, 0))]:
        cfg.parallel_config.rank = rank
        assert _worker_rank(cfg, 2, 2) == want
    with pytest.raises(_config.ConfigError) as ei:
        _shard_namespaces("x" * 250, 2, 1)
    assert "'namespace'" in str(ei.value) and "/tp0of2-pp0of1" in str(ei.value)
    cfg = vllm_config({"pool_size": "16M"}, 2, 1)
    cfg.parallel_config.decode_context_parallel_size = 2
    with pytest.raises(NotImplementedError, match="decode_context_parallel_size"):
        OpenInferConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config(LAYER_NAMES))
    # embedded with ranks in other processes: refused, naming the sidecar
    cfg = vllm_config({"pool_size": "16M"}, 2, 1)
    cfg.parallel_config.distributed_executor_backend = "mp"
    with pytest.raises(ValueError, match="sidecar"):
        OpenInferConnector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config(LAYER_NAMES))
