"""openinfer.vllm against the real vLLM (the version pinned in
requirements-vllm.txt), on the CPU.

The scheduler side is vLLM's own v1 ``Scheduler`` (DeviceConfig("cpu"), the
committed tiny model config, no weights, HF_HUB_OFFLINE=1) with the
connector loaded by ``kv_connector_module_path``. The worker side is the same
connector class in the worker role over KV tensors that vLLM's
``allocate_kv_cache`` made, driven by vLLM's ``KVConnectorModelRunnerMixin``
inside a forward context; a stand-in "model" writes each layer's KV for the
scheduled tokens (a pattern of the token ids and positions, so equal
prefixes have equal KV) between ``wait_for_layer_load`` and
``save_kv_layer``, as vLLM's attention layers call them.

Shown: a prefix saved by one request is loaded for another with the bytes
equal (sync and async loads, embedded and sidecar); a failed load becomes
recompute through vLLM's load-error path (``get_block_ids_with_load_errors``
-> ``invalid_block_ids`` -> the scheduler rolls ``num_computed_tokens``
back); a sidecar restart in engine-owned mode degrades (misses, dropped
saves) and recovers (hits again); with kv_connector_extra_config codec
(lossless, int8, fp8) a prefix saved layer by layer loads into another
instance layer by layer, byte-equal or within the codec's bound, and the
default namespace names the codec."""
import gc
import os
import re
import time

import pytest
import torch

import openinfer as oi

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig, set_current_vllm_config)
import vllm.distributed.kv_transfer.kv_transfer_state as kts
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.parallel_state import (destroy_distributed_environment,
                                             destroy_model_parallel,
                                             init_distributed_environment,
                                             initialize_model_parallel)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
from vllm.v1.worker.utils import allocate_kv_cache

TINY = os.environ.get("OPENINFER_TINY_MODEL",
                      os.path.join(os.path.dirname(__file__), "tiny-model"))
BS = 16          # tokens per block
NUM_BLOCKS = 64  # vLLM's KV blocks
LAYERS = 4       # of the tiny model
KV_HEADS, HEAD = 2, 16
LAYER_NAMES = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]


# ----------------------------------------------------------------------------- set-up


def vllm_config(extra, load_async=False, policy="recompute", **model_kw):
    """A VllmConfig of the tiny model; model_kw: more ModelConfig arguments
    (revision, hf_overrides, ...)."""
    extra = dict({"load_async": load_async}, **extra)
    model = ModelConfig(model=TINY, tokenizer=TINY, skip_tokenizer_init=True, dtype="bfloat16",
                        max_model_len=1024, seed=0, **model_kw)
    cfg = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BS, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024,
                                         max_model_len=1024, is_encoder_decoder=False),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OpenInferConnector", kv_connector_module_path="openinfer.vllm",
            kv_role="kv_both", kv_load_failure_policy=policy,
            kv_connector_extra_config=extra),
    )
    cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
    return cfg


def kv_cache_config():
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD,
                             dtype=torch.bfloat16)
    page = spec.page_size_bytes
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[KVCacheTensor(size=LAYERS * NUM_BLOCKS * page, layers=LAYER_NAMES,
                                        layer_stride=NUM_BLOCKS * page, block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, spec)],
    )


class Engine:
    """vLLM's scheduler and one worker, each with its own OpenInferConnector
    (the scheduler's made by vLLM itself), and a stand-in model."""

    def __init__(self, extra, load_async=False, policy="recompute", shared_kv=False, **model_kw):
        self.cfg = vllm_config(extra, load_async, policy, **model_kw)
        self.kvc = kv_cache_config()
        self._ctx = set_current_vllm_config(self.cfg)
        self._ctx.__enter__()
        hash_fn = get_hash_fn_by_name(self.cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(BS, hash_fn)
        self.scheduler = Scheduler(vllm_config=self.cfg, kv_cache_config=self.kvc,
                                   structured_output_manager=StructuredOutputManager(self.cfg),
                                   block_size=BS, log_stats=True)
        assert type(self.scheduler.connector).__module__ == "openinfer.vllm"
        # the worker's connector, as vLLM's worker makes it (the factory, by
        # kv_connector_module_path), the process's KV transfer group
        kts.ensure_kv_transfer_initialized(self.cfg, self.kvc)
        self.worker = kts.get_kv_transfer_group()
        assert type(self.worker).__name__ == "OpenInferConnector"
        assert self.worker.role == KVConnectorRole.WORKER
        if shared_kv:
            from openinfer.kvworker import shared_kv_tensors
            page = self.kvc.kv_cache_groups[0].kv_cache_spec.page_size_bytes
            self.buffer, (raw,) = shared_kv_tensors([(LAYERS * NUM_BLOCKS * page,)], torch.int8)
            from vllm.v1.kv_cache_interface import create_kv_cache_views
            views = create_kv_cache_views(raw, self.kvc.kv_cache_groups[0].kv_cache_spec,
                                          NUM_BLOCKS, KVCacheLayout.LBHNC,
                                          self.kvc.kv_cache_tensors[0])
            self.kv = dict(zip(LAYER_NAMES, views))
            self.worker.set_shared_buffer(self.buffer)
        else:
            self.kv = allocate_kv_cache(self.kvc, torch.device("cpu"), KVCacheLayout.LBHNC)
        self.worker.register_kv_caches(self.kv)
        self.requests = {}
        self.stats_payloads = []  # the connector stats of each step, as the scheduler sends them
        self.block_table = {}  # req id -> the block ids the worker knows
        self.tokens = {}

    # -- requests
    def add(self, req_id, prompt, max_tokens=2):
        r = Request(req_id, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0),
                    None, block_hasher=self.hasher)
        self.requests[req_id] = r
        self.tokens[req_id] = list(prompt)
        self.scheduler.add_request(r)
        return r

    # -- the model
    @staticmethod
    def value(token, pos, layer):
        """The KV this stand-in model writes for a token at a position."""
        return ((token * 31 + pos * 7 + layer * 13) % 251) - 125

    def write_layer(self, layer, sched_out):
        t = self.kv[LAYER_NAMES[layer]]  # [blocks, heads, tokens, K||V]
        for req_id, start, n in self._scheduled(sched_out):
            blocks = self.block_table[req_id]
            toks = self.tokens[req_id]
            for pos in range(start, start + n):
                b, off = blocks[pos // BS], pos % BS
                t[b, :, off, :] = float(self.value(toks[pos], pos, layer))

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

    def step(self):
        """One engine step: schedule, run the worker side through vLLM's
        mixin (layer by layer: wait for the layer's load, write, save),
        feed the output back. Returns (scheduler output, connector output)."""
        from vllm.forward_context import set_forward_context
        so = self.scheduler.schedule()
        conn = self.worker
        with set_forward_context(None, self.cfg):
            with KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(so) as kvo:
                if so.total_num_scheduled_tokens:
                    self._scheduled(so)  # refresh the block table first
                    for layer in range(LAYERS):
                        conn.wait_for_layer_load(LAYER_NAMES[layer])
                        self.write_layer(layer, so)
                        conn.save_kv_layer(LAYER_NAMES[layer], self.kv[LAYER_NAMES[layer]],
                                           None)
        # a token for every request whose prompt is done
        req_ids, tokens = [], []
        for req_id, start, n in self._scheduled(so):
            req_ids.append(req_id)
            r = self.requests[req_id]
            if start + n >= r.num_tokens:
                tok = 3 + (sum(self.tokens[req_id]) % 500)
                tokens.append([tok])
                self.tokens[req_id].append(tok)
            else:
                tokens.append([])
        out = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=tokens, logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[],
                                kv_connector_output=kvo)
        for eco in self.scheduler.update_from_output(so, out).values():
            st = eco.scheduler_stats
            if st is not None and st.kv_connector_stats:  # what vLLM's stat loggers get
                self.stats_payloads.append(st.kv_connector_stats)
        return so, kvo

    def run(self, timeout=60):
        """Steps until every request finished; a step that scheduled nothing
        (an async load still moving) is followed by a short sleep."""
        outs = []
        deadline = time.time() + timeout
        while self.scheduler.has_unfinished_requests():
            assert time.time() < deadline, "requests still unfinished after %d s" % timeout
            so, kvo = self.step()
            outs.append((so, kvo))
            if not so.total_num_scheduled_tokens:
                time.sleep(0.002)
        return outs

    def expected_block(self, req_id, b_index, layer):
        toks = self.tokens[req_id]
        want = torch.empty(KV_HEADS, BS, 2 * HEAD, dtype=torch.bfloat16)
        for off in range(BS):
            pos = b_index * BS + off
            want[:, off, :] = float(self.value(toks[pos], pos, layer))
        return want

    def close(self):
        self.worker.shutdown()
        self.scheduler.connector.shutdown()
        kts._KV_CONNECTOR_AGENT = None  # the next test's engine makes its own
        self._ctx.__exit__(None, None, None)
        gc.collect()


PROMPT = list(range(100, 100 + 5 * BS + 3))  # 5 full blocks and a tail


def first_load(outs):
    """The scheduler output and meta of the first step that loaded."""
    for so, kvo in outs:
        if so.kv_connector_metadata.loads:
            return so, so.kv_connector_metadata
    return None, None


def check_loaded(eng, req_id, meta):
    """The blocks a load named hold the KV of the prompt they stand for."""
    (ld,) = [ld for ld in meta.loads if ld.req_id == req_id]
    for i, b in enumerate(ld.block_ids):
        for layer in range(LAYERS):
            got = eng.kv[LAYER_NAMES[layer]][b]
            assert torch.equal(got, eng.expected_block(req_id, i, layer)), (req_id, i, layer)
    return ld


# ----------------------------------------------------------------------------- tests


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def _distributed():
    """One rank over gloo, as a CPU worker has it (the KV transfer group
    syncs its engine id over the TP group)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vllm_config({})):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="tcp://127.0.0.1:%d" % port)
        initialize_model_parallel(1, 1)
    yield
    destroy_model_parallel()
    destroy_distributed_environment()


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_prefix_saved_by_one_request_is_loaded_for_another(load_async, mode, request):
    ns = "t/prefix-%s-%s" % (mode, load_async)
    if mode == "embedded":
        eng = Engine({"pool_size": "64M", "namespace": ns}, load_async)
    else:
        serve = request.getfixturevalue("serve")
        eng = Engine({"socket": serve.socket, "namespace": ns}, load_async, shared_kv=True)
    try:
        eng.add("a", PROMPT)
        eng.run()
        w = eng.worker.worker
        st = w.stats()
        assert st["saves_completed"] >= 5 and st["saves_failed"] == 0
        # vLLM's own prefix cache would serve "b" from the GPU: empty it, so
        # the blocks must come back from the host tier
        assert eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        eng.add("b", PROMPT[:5 * BS] + [7, 8, 9, 10])  # the same 5 blocks, another tail
        outs = eng.run()
        so, meta = first_load(outs)
        assert meta is not None, "nothing was loaded"
        ld = check_loaded(eng, "b", meta)
        assert len(ld.block_ids) == 5 and ld.is_async == load_async
        assert w.stats()["blocks_loaded"] == 5
        # the request then computed only its tail
        computed = [so.num_scheduled_tokens.get("b", 0) for so, _ in outs]
        assert sum(computed) < len(PROMPT), computed
        if load_async:
            assert any(kvo and kvo.finished_recving == {"b"} for _, kvo in outs)
        assert not any(kvo and kvo.invalid_block_ids for _, kvo in outs)
    finally:
        eng.close()


@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_a_failed_load_is_recomputed(load_async):
    """The lease expires between the scheduler's query and the worker's load:
    the load fails, the worker reports the blocks through
    get_block_ids_with_load_errors, and vLLM recomputes them."""
    eng = Engine({"pool_size": "64M", "namespace": "t/fail-%s" % load_async,
                  "lease_ttl_ms": 1}, load_async)
    try:
        eng.add("a", PROMPT)
        eng.run()
        assert eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        eng.add("b", PROMPT)
        time.sleep(0.01)
        outs = []
        orig = eng.scheduler.connector.update_state_after_alloc

        def slow(*a, **kw):  # the lease (1 ms) expires before the worker loads
            orig(*a, **kw)
            time.sleep(0.05)
        eng.scheduler.connector.update_state_after_alloc = slow
        outs = eng.run()
        so, meta = first_load(outs)
        assert meta is not None
        (ld,) = meta.loads
        failed = set().union(*[kvo.invalid_block_ids for _, kvo in outs if kvo])
        assert failed == set(ld.block_ids)
        # recomputed: every prompt token was scheduled after all, and the
        # request's blocks (an async failure frees the load's blocks and
        # allocates again) hold the right KV
        computed = sum(so.num_scheduled_tokens.get("b", 0) for so, _ in outs)
        assert computed >= len(PROMPT)
        for i, b in enumerate(eng.block_table["b"][:len(ld.block_ids)]):
            for layer in range(LAYERS):
                assert torch.equal(eng.kv[LAYER_NAMES[layer]][b],
                                   eng.expected_block("b", i, layer))
        assert eng.worker.worker.stats()["loads_failed"] == 1
    finally:
        eng.close()


def test_sidecar_restart_degrades_and_recovers(serve):
    eng = Engine({"socket": serve.socket, "namespace": "t/sidecar"}, shared_kv=True)
    try:
        w = eng.worker.worker
        assert w.stats()["connection"] == oi.CONNECTION_CONNECTED
        eng.add("a", PROMPT)
        eng.run()
        assert eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        eng.add("b", PROMPT)
        so, meta = first_load(eng.run())
        assert meta is not None
        check_loaded(eng, "b", meta)

        # the server goes away: the worker degrades, the scheduler misses
        assert serve.stop() == 0
        deadline = time.time() + 20
        while w.stats()["connection"] != oi.CONNECTION_DEGRADED:
            assert time.time() < deadline
            time.sleep(0.05)
        assert eng.scheduler.reset_prefix_cache()
        eng.add("c", PROMPT)
        outs = eng.run()
        assert first_load(outs)[1] is None  # recomputed, served nothing
        assert w.stats()["disconnected_saves"] >= 1
        # vLLM's connector stats say so: the tier is degraded, the lookup failed
        degraded = [p["degraded"] for p in eng.stats_payloads if "degraded" in p]
        assert degraded[-1] == 1, degraded
        assert sum(p["failures"].get("lookup", 0) for p in eng.stats_payloads) >= 1

        # a server is back: the worker reconnects, the lookups find it again
        serve.start()
        while w.stats()["connection"] != oi.CONNECTION_CONNECTED:
            assert time.time() < deadline + 20
            time.sleep(0.05)
        assert w.stats()["reconnects"] == 1
        eng.scheduler.connector._opts.lookup_retry_s = 0
        assert eng.scheduler.reset_prefix_cache()
        eng.add("d", PROMPT)
        eng.run()  # the new server's pool was empty: this saves again
        assert eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        eng.add("e", PROMPT)
        so, meta = first_load(eng.run())
        assert meta is not None
        check_loaded(eng, "e", meta)
        degraded = [p["degraded"] for p in eng.stats_payloads if "degraded" in p]
        assert degraded[-1] == 0, degraded  # back
    finally:
        eng.close()


def test_options_and_layouts():
    """kv_connector_extra_config is checked when the connector is made; the
    worker's layout is one arena per layer of one dense page per block, also
    when vLLM splits its blocks into smaller kernel blocks."""
    from openinfer.vllm import OpenInferConnector, _Options, parse_size
    assert parse_size("64M") == 64 << 20 and parse_size("1.5G") == 3 << 29 and parse_size(5) == 5
    o = _Options.from_config({"pool_size": "2G", "load_async": "true", "copy_mode": "dma",
                              "socket": "/x.sock"})
    assert (o.pool_size, o.load_async, o.copy_mode, o.socket) == (2 << 30, True, 2, "/x.sock")
    assert (o.lookup_deadline_ms, o.probe_interval_ms) == (50, 100)
    assert _Options.from_config({"mode": "embedded", "socket": "/x.sock"}).socket is None
    for bad in ({"pool_sise": "1G"}, {"mode": "remote"}, {"mode": "sidecar"},
                {"copy_mode": "fast"}):
        with pytest.raises(ValueError):
            _Options.from_config(bad)
    with pytest.raises(ValueError):  # the connector refuses the typo too
        OpenInferConnector(vllm_config({"pool_sise": "1G"}), KVConnectorRole.SCHEDULER,
                           kv_cache_config())

    from openinfer.vllm import _default_namespace
    ns, ident = _default_namespace(vllm_config({}))
    assert re.fullmatch(r"vllm/tiny-model/bfloat16/kv-auto/bs16/[0-9a-f]{24}", ns), ns
    fields = dict(ident)
    assert (fields["model"], fields["dtype"], fields["kv_cache_dtype"], fields["block_size"],
            fields["tensor_parallel_size"], fields["pipeline_parallel_size"]) == \
        (TINY, "bfloat16", "auto", BS, 1, 1)
    long_cfg = vllm_config({})
    long_cfg.model_config.model = "m" * 400
    long_ns, _ = _default_namespace(long_cfg)
    assert len(long_ns.encode()) <= 255 and long_ns != ns

    kvc = kv_cache_config()
    page = kvc.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    cfg = vllm_config({"pool_size": "16M", "namespace": "t/layout"})
    with set_current_vllm_config(cfg):
        for kernel_bs in (BS, BS // 2):
            kv = allocate_kv_cache(kvc, torch.device("cpu"), KVCacheLayout.LBHNC, [kernel_bs])
            assert next(iter(kv.values())).shape[0] == NUM_BLOCKS * BS // kernel_bs
            c = OpenInferConnector(cfg, KVConnectorRole.WORKER, kvc)
            c.register_kv_caches(kv)
            lay = c.worker.layout
            assert lay.num_blocks == NUM_BLOCKS and len(lay.regions) == LAYERS
            assert {(r.chunk, r.block_stride, tuple(r.segments)) for r in lay.regions} == \
                {(page, page, (0,))}
            assert [r.ptr for r in lay.regions] == \
                [kv[n].data_ptr() for n in LAYER_NAMES]
            c.shutdown()


# ----------------------------------------------------------------------------- namespaces


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
@pytest.mark.parametrize("change", ["revision", "hf_overrides"])
def test_namespace_follows_the_model_identity(change, mode, request):
    """The derived namespace changes with the model's revision and its
    hf_overrides: blocks saved under one config are never found under the
    other (0 hits), while the identical config finds them again."""
    other = {"revision": {"revision": "other-revision"},
             "hf_overrides": {"hf_overrides": {"rope_theta": 5000}}}[change]
    # a prompt of this test alone (the embedded pool outlives a test)
    base = 1000 + 100 * ["revision", "hf_overrides"].index(change) + \
        50 * ["embedded", "sidecar"].index(mode)
    prompt = list(range(base, base + 5 * BS + 3))
    if mode == "embedded":
        extra, kw = {"pool_size": "64M"}, {}
    else:
        extra, kw = {"socket": request.getfixturevalue("serve").socket}, {"shared_kv": True}

    a = Engine(extra, **kw)
    try:
        ns_a = a.scheduler.connector._namespace
        assert a.worker._namespace == ns_a  # scheduler and worker agree
        a.add("a", prompt)
        a.run()
        assert a.worker.worker.stats()["saves_completed"] >= 5
    finally:
        a.close()

    b = Engine(extra, **kw, **other)
    try:
        ns_b = b.scheduler.connector._namespace
        assert b.worker._namespace == ns_b
        assert ns_b != ns_a and ns_b.rsplit("/", 1)[0] == ns_a.rsplit("/", 1)[0]
        b.add("b", prompt)
        outs = b.run()
        assert first_load(outs)[1] is None  # 0 cross hits
        assert b.worker.worker.stats()["blocks_loaded"] == 0
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _ in outs) >= len(prompt)
    finally:
        b.close()

    c = Engine(extra, **kw)  # the same config as a: the same namespace, hits
    try:
        assert c.scheduler.connector._namespace == ns_a
        c.add("c", prompt)
        so, meta = first_load(c.run())
        assert meta is not None, "the identical config found nothing"
        ld = check_loaded(c, "c", meta)
        assert len(ld.block_ids) == 5
        assert c.worker.worker.stats()["blocks_loaded"] == 5
    finally:
        c.close()


# ----------------------------------------------------------------------------- bad options

BAD_OPTIONS = [
    ({"pool_size": "-1G"}, "pool_size", "'-1G'"),
    ({"pool_size": "lots"}, "pool_size", "'lots'"),
    ({"pool_size": 0}, "pool_size", "is 0;"),
    ({"lease_ttl_ms": -5}, "lease_ttl_ms", "is -5;"),
    ({"lease_ttl_ms": "abc"}, "lease_ttl_ms", "'abc'"),
    ({"wait_pending_ms": "x"}, "wait_pending_ms", "'x'"),
    ({"load_async": "maybe"}, "load_async", "'maybe'"),
    ({"namespace": ""}, "namespace", "is '';"),
    ({"lookup_deadline_ms": 0}, "lookup_deadline_ms", "is 0;"),
    ({"codec": "zstd"}, "codec", "'zstd'"),
    ({"codec": 8}, "codec", "is 8;"),
    ({"pool_sise": "1G"}, "pool_sise", "unknown option"),
]


@pytest.mark.parametrize("extra,key,shown", BAD_OPTIONS,
                         ids=["%s=%r" % next(iter(b[0].items())) for b in BAD_OPTIONS])
def test_a_bad_option_fails_when_the_connector_is_made(extra, key, shown):
    """Each bad value fails in both roles as vLLM makes the connector (its
    Scheduler; the worker's KV transfer group), with an error that names the
    key and the value."""
    from openinfer._config import ConfigError
    cfg = vllm_config(extra)
    kvc = kv_cache_config()
    with set_current_vllm_config(cfg):
        with pytest.raises(ConfigError) as ei:
            Scheduler(vllm_config=cfg, kv_cache_config=kvc,
                      structured_output_manager=StructuredOutputManager(cfg), block_size=BS,
                      log_stats=True)
        msg = str(ei.value)
        assert "'%s'" % key in msg and shown in msg, msg
        assert ei.value.key == key
        assert ("allowed:" in msg) != (shown == "unknown option"), msg
        with pytest.raises(ConfigError) as ei:
            kts.ensure_kv_transfer_initialized(cfg, kvc)
        assert str(ei.value) == msg
        assert kts._KV_CONNECTOR_AGENT is None


def _big_kv(monkeypatch):
    """Heads large enough that a load of 40 blocks (80 MiB) takes far
    longer than a 1 ms load deadline: the deadline passes while its copies
    still run (the load is fencing), without fault injection."""
    import sys
    mod = sys.modules[__name__]
    monkeypatch.setattr(mod, "KV_HEADS", 32)
    monkeypatch.setattr(mod, "HEAD", 256)


LONG_PROMPT = list(range(300, 300 + 40 * BS + 3))  # 40 full blocks and a tail


def assert_recomputed_and_unchanged(eng, req_id, n_blocks):
    """The first n_blocks of req_id hold what the stand-in model computed,
    every (block, layer) byte for byte, and no byte of the KV cache changes
    in the next 0.5 s (no late copy lands)."""
    ids = eng.block_table[req_id][:n_blocks]
    for i, b in enumerate(ids):
        for layer in range(LAYERS):
            assert torch.equal(eng.kv[LAYER_NAMES[layer]][b],
                               eng.expected_block(req_id, i, layer)), (i, layer)
    snap = {n: t.clone() for n, t in eng.kv.items()}
    time.sleep(0.5)
    for n, t in eng.kv.items():
        assert torch.equal(t.view(torch.int16), snap[n].view(torch.int16)), n


@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_a_load_past_its_deadline_is_reported_only_once_fenced(load_async, monkeypatch):
    """Embedded, load_deadline_ms 1: the load of 40 blocks misses its
    deadline while its copies still run. Its blocks are neither reported
    finished nor failed while it is fencing (async: the request stays
    WAITING_FOR_REMOTE_KVS with its blocks; sync: the step itself waits for
    the fence); then they are reported failed (invalid_block_ids), vLLM
    recomputes them, and the bytes the stand-in model writes there never
    change afterwards (every byte, after a pause)."""
    _big_kv(monkeypatch)
    eng = Engine({"pool_size": "256M", "namespace": "t/fence-%s" % load_async,
                  "load_deadline_ms": 1}, load_async)
    try:
        eng.add("a", LONG_PROMPT)
        eng.run()
        assert eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        # b's recomputed KV differs from what the tier holds: a late copy
        # landing after the recompute would show in the final check
        monkeypatch.setattr(Engine, "value", staticmethod(
            lambda token, pos, layer: ((token * 31 + pos * 7 + layer * 13 + 5) % 251) - 125))
        eng.add("b", LONG_PROMPT)
        conn = eng.worker
        load, reported, deadline = None, None, time.time() + 60
        while eng.scheduler.has_unfinished_requests():
            assert time.time() < deadline
            so, kvo = eng.step()
            if so.kv_connector_metadata.loads:
                (load,) = so.kv_connector_metadata.loads
            st = conn.stats()
            got = bool(kvo and (kvo.invalid_block_ids or kvo.finished_recving))
            if st["loads_fencing"]:
                assert st["blocks_fencing"] == len(load.block_ids)
                assert not got, "reported while its copies may still land"
                req = eng.scheduler.requests["b"]
                assert req.status.name == "WAITING_FOR_REMOTE_KVS"
                assert eng.scheduler.kv_cache_manager.get_block_ids("b")[0][:len(
                    load.block_ids)] == load.block_ids
            if got and reported is None:
                reported = kvo
                assert st["loads_in_flight"] == 0  # final when reported
            if not so.total_num_scheduled_tokens:
                time.sleep(0.001)
        assert load is not None and len(load.block_ids) == 40
        assert reported is not None and reported.invalid_block_ids == set(load.block_ids)
        if load_async:
            # the steps above saw it fencing unless the copies ended between
            # two of them (a loaded machine); loads_fenced below says it fenced
            assert reported.finished_recving == {"b"}
        st = conn.stats()
        assert (st["loads_submitted"], st["loads_completed"], st["loads_failed"],
                st["blocks_failed"], st["blocks_fencing"]) == (1, 0, 1, 40, 0), st
        assert st["worker"]["loads_fenced"] == 1 and st["worker"]["loads_completed"] == 0
        # recomputed into its blocks; nothing lands there any more
        assert_recomputed_and_unchanged(eng, "b", 40)
    finally:
        eng.close()


def test_a_stopped_server_holds_the_blocks_until_fenced(serve, monkeypatch):
    """Sidecar, load_deadline_ms 300, async: the server is stopped (SIGSTOP)
    as the worker starts a load. Past the deadline the load is fencing: the
    connector reports nothing and vLLM keeps the request waiting with its
    blocks; after SIGCONT the server answers, the load is final, reported,
    vLLM recomputes into its blocks, and their bytes never change after."""
    import signal
    eng = Engine({"socket": serve.socket, "namespace": "t/stop-fence", "load_deadline_ms": 300},
                 load_async=True, shared_kv=True)
    stopped = []
    try:
        eng.add("a", PROMPT)
        eng.run()
        assert eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        conn = eng.worker
        orig = conn.start_load_kv

        def stop_then_load(*a, **kw):  # the server stops as the load is sent
            if conn._get_connector_metadata().loads and not stopped:
                serve.pause()
                stopped.append(time.monotonic())
            return orig(*a, **kw)
        conn.start_load_kv = stop_then_load
        # b's recomputed KV differs from the tier's: a late copy would show
        monkeypatch.setattr(Engine, "value", staticmethod(
            lambda token, pos, layer: ((token * 31 + pos * 7 + layer * 13 + 5) % 251) - 125))
        eng.add("b", PROMPT)
        load, reported, held, deadline = None, None, False, time.time() + 60
        while eng.scheduler.has_unfinished_requests():
            assert time.time() < deadline
            so, kvo = eng.step()
            if so.kv_connector_metadata.loads:
                (load,) = so.kv_connector_metadata.loads
            got = bool(kvo and (kvo.invalid_block_ids or kvo.finished_recving))
            if stopped and serve.proc is not None and len(stopped) == 1:
                if time.monotonic() - stopped[0] < 1.5:
                    assert not got, "reported while the stopped server may still copy"
                    st = conn.stats()
                    if st["loads_fencing"]:
                        held = True
                        assert eng.scheduler.requests["b"].status.name == \
                            "WAITING_FOR_REMOTE_KVS"
                else:
                    os.kill(serve.proc.pid, signal.SIGCONT)
                    stopped.append(time.monotonic())
            if got and reported is None:
                reported = kvo
            time.sleep(0.005)
        assert held, "the load never showed as fencing while the server was stopped"
        assert reported is not None
        st = conn.stats()
        assert st["loads_in_flight"] == 0 and st["blocks_fencing"] == 0
        assert st["loads_completed"] + st["loads_failed"] == st["loads_submitted"] == 1
        assert_recomputed_and_unchanged(eng, "b", 5)
    finally:
        if serve.proc is not None:
            os.kill(serve.proc.pid, signal.SIGCONT)
        eng.close()


def test_a_stopped_server_does_not_hold_wait_for_save(serve):
    """Sidecar with the server stopped (SIGSTOP): a step's wait_for_save
    returns within the save deadline (300 ms), the unfinished saves dropped
    and counted, never waited for again."""
    import signal
    eng = Engine({"socket": serve.socket, "namespace": "t/stop-save", "save_deadline_ms": 300,
                  "control_deadline_ms": 200}, shared_kv=True)
    try:
        eng.add("a", PROMPT)
        conn = eng.worker
        orig = conn.wait_for_save
        took = []

        def timed():
            t0 = time.monotonic()
            try:
                return orig()
            finally:
                took.append(time.monotonic() - t0)
        conn.wait_for_save = timed
        serve.pause()
        try:
            so, _ = eng.step()
            assert so.kv_connector_metadata.save_ids, "the step saved nothing"
        finally:
            os.kill(serve.proc.pid, signal.SIGCONT)
        assert took and took[0] < 0.3 + 0.25, took
        st = conn.stats()
        assert st["saves_dropped"] + st["saves_failed"] >= 1, st
    finally:
        eng.close()


def test_a_stopped_server_costs_the_scheduler_one_lookup_deadline(serve):
    """Sidecar, the server stopped (SIGSTOP): vLLM's scheduler asks the
    connector for matched tokens (get_num_new_matched_tokens, the lookup
    client's membership query). The first call misses after about the
    lookup deadline (50 ms, the default), the next ones miss in at most 1 ms
    each (the circuit breaker), and once the server runs again (SIGCONT)
    the prefix hits within 1 s."""
    import signal
    eng = Engine({"socket": serve.socket, "namespace": "t/stop-lookup"}, shared_kv=True)
    stopped = False
    try:
        eng.add("a", PROMPT)
        eng.run()
        conn = eng.scheduler.connector

        def request(i):
            return Request("probe-%d" % i, list(PROMPT),
                           SamplingParams(max_tokens=2, temperature=0), None,
                           block_hasher=eng.hasher)

        hit, _ = conn.get_num_new_matched_tokens(request(0), 0)
        assert hit == 5 * BS, hit
        serve.pause()
        stopped = True
        t0 = time.monotonic()
        hit, _ = conn.get_num_new_matched_tokens(request(1), 0)
        first = time.monotonic() - t0
        assert hit == 0 and first < 0.05 + 0.1, first
        later = []
        for i in range(2, 102):
            t0 = time.monotonic()
            hit, _ = conn.get_num_new_matched_tokens(request(i), 0)
            later.append(time.monotonic() - t0)
            assert hit == 0
        later.sort()
        assert later[94] <= 0.001, later[94:]  # 95th percentile of 100
        os.kill(serve.proc.pid, signal.SIGCONT)
        stopped = False
        t0, back = time.monotonic(), None
        for i in range(200, 700):
            if conn.get_num_new_matched_tokens(request(i), 0)[0] == 5 * BS:
                back = time.monotonic() - t0
                break
            time.sleep(0.01)
        assert back is not None and back < 1.0, back
        print("first miss %.1f ms, later p95 %.3f ms, hits again after %.1f ms"
              % (first * 1e3, later[94] * 1e3, back * 1e3))
    finally:
        if stopped:
            os.kill(serve.proc.pid, signal.SIGCONT)
        eng.close()


# ----------------------------------------------------------------------------- metrics


def test_the_tiers_figures_reach_vllms_metrics():
    """Embedded: a prompt is saved, loaded for another request, and a third
    load fails (its lease released behind the worker's back). The connector
    stats that vLLM's scheduler hands its stat loggers (the scheduler
    outputs' scheduler_stats.kv_connector_stats) are fed to vLLM's own
    KVConnectorProm and KVConnectorLogging, as its Prometheus and logging
    stat loggers do; vLLM's /metrics text (prometheus_client) then shows the
    tier's counters, the load latency histogram and the failure by cause."""
    from prometheus_client import REGISTRY, generate_latest
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorLogging,
                                                                       KVConnectorProm)
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics
    prompt = list(range(4000, 4000 + 5 * BS + 3))
    eng = Engine({"pool_size": "64M", "namespace": "t/metrics"})
    try:
        eng.add("a", prompt)
        eng.run()
        eng.scheduler.reset_prefix_cache()
        for t in eng.kv.values():
            t.zero_()
        eng.add("b", prompt)
        so, meta = first_load(eng.run())
        check_loaded(eng, "b", meta)
        eng.scheduler.reset_prefix_cache()
        conn = eng.scheduler.connector
        orig = conn.build_connector_meta

        def drop(so):
            m = orig(so)
            for ld in m.loads:
                conn._release_shard(0, ld.leases[0])
            return m
        conn.build_connector_meta = drop
        eng.add("c", prompt)
        eng.run()
        block_bytes = eng.worker.worker.layout.block_bytes
        payloads = eng.stats_payloads
        assert payloads
        unregister_vllm_metrics()
        prom = KVConnectorProm(eng.cfg, ["model_name", "engine"], {0: ["tiny", "0"]})
        logging_ = KVConnectorLogging(eng.cfg.kv_transfer_config)
        for p in payloads:
            prom.observe(p, 0)
            logging_.observe(p)
        reduced = logging_.transfer_stats_accumulator.reduce()
        text = generate_latest(REGISTRY).decode()

        def metric(name, labels='engine="0",model_name="tiny"'):
            m = re.search(r"^%s\{%s\} ([0-9.e+-]+)$" % (re.escape(name), re.escape(labels)),
                          text, re.M)
            assert m, "%s{%s} not in vLLM's metrics" % (name, labels)
            return float(m.group(1))
        assert metric("vllm:openinfer_saved_blocks_total") == 5
        assert metric("vllm:openinfer_saved_bytes_total") == 5 * block_bytes
        assert metric("vllm:openinfer_loaded_blocks_total") == 5
        assert metric("vllm:openinfer_loaded_bytes_total") == 5 * block_bytes
        assert metric("vllm:openinfer_lookup_hit_blocks_total") == 10  # b's and c's
        assert metric("vllm:openinfer_lookup_miss_blocks_total") >= 5  # a's
        assert metric("vllm:openinfer_lookups_total") >= 3
        assert metric("vllm:openinfer_load_seconds_count") == 1
        assert 0 < metric("vllm:openinfer_load_seconds_sum") < 5
        failed = sum(metric("vllm:openinfer_failures_total",
                            'cause="%s",engine="0",model_name="tiny"' % c)
                     for c in ("load_refused", "load_failed"))
        assert failed == 1
        assert metric("vllm:openinfer_failures_total",
                      'cause="save_failed",engine="0",model_name="tiny"') == 0
        assert metric("vllm:openinfer_degraded") == 0
        assert (reduced["saved_blocks"], reduced["loaded_blocks"], reduced["hit_blocks"],
                reduced["failures"]) == (5, 5, 10, 1), reduced
        unregister_vllm_metrics()
    finally:
        eng.close()


# ----------------------------------------------------------------------------- codecs

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "data", "kvcorpus",
                      "kv.bin")
_corpus = []


def corpus_vectors():
    """The real-KV corpus (tests/data/kvcorpus, docs/codecs.md) as vectors of
    KV_HEADS x 2 x HEAD bf16 values (64: one of the corpus's head vectors)."""
    if not _corpus:
        with open(CORPUS, "rb") as f:
            v = torch.frombuffer(bytearray(f.read()), dtype=torch.bfloat16)
        n = KV_HEADS * 2 * HEAD
        _corpus.append(v[:v.numel() // n * n].view(-1, KV_HEADS, 2 * HEAD))
    return _corpus[0]


class CodecEngine(Engine):
    """The stand-in model writes real KV: each (token, position, layer) a
    vector of the corpus, every head and K||V channel its own value. skew:
    every head and K or V scaled by its own power of two (exact), so that a
    codec scale taken over the wrong elements breaks the bound."""

    skew = False

    def token_kv(self, token, pos, layer):
        vecs = corpus_vectors()
        v = vecs[(token * 131 + pos * 7 + layer * 977) % vecs.shape[0]].float()
        if self.skew:
            v = v.view(KV_HEADS, 2, HEAD)
            v = v * torch.tensor([2.0 ** (3 * h) for h in range(KV_HEADS)]).view(-1, 1, 1)
            v = (v * torch.tensor([1.0, 1 / 64]).view(1, 2, 1)).view(KV_HEADS, 2 * HEAD)
        return v.to(torch.bfloat16)

    def write_layer(self, layer, sched_out):
        t = self.kv[LAYER_NAMES[layer]]  # [blocks, heads, tokens, K||V]
        for req_id, start, n in self._scheduled(sched_out):
            blocks = self.block_table[req_id]
            toks = self.tokens[req_id]
            for pos in range(start, start + n):
                t[blocks[pos // BS], :, pos % BS, :] = self.token_kv(toks[pos], pos, layer)

    def expected_block(self, req_id, b_index, layer):
        toks = self.tokens[req_id]
        want = torch.empty(KV_HEADS, BS, 2 * HEAD, dtype=torch.bfloat16)
        for off in range(BS):
            pos = b_index * BS + off
            want[:, off, :] = self.token_kv(toks[pos], pos, layer)
        return want


class NoiseEngine(CodecEngine):
    """KV of random bits, which no lossless frame of the default slot holds."""

    def token_kv(self, token, pos, layer):
        g = torch.Generator().manual_seed(token * 1000003 + pos * 131 + layer)
        bits = torch.randint(-32768, 32768, (KV_HEADS, 2 * HEAD), generator=g, dtype=torch.int32)
        return bits.to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
def test_blocks_the_codec_did_not_store_are_failures_not_saved_blocks(mode, request):
    """Under codec lossless, KV that does not compress (random bits) is not
    stored: the save call succeeds, the engine counts the blocks in
    saves_not_encoded, and the connector reports them as the failure
    save_not_encoded, not as saved blocks; a later instance misses them."""
    if mode == "embedded":
        extra, kw = {"pool_size": "64M"}, {}
    else:
        serve = request.getfixturevalue("serve")
        extra, kw = {"socket": serve.socket}, {"shared_kv": True}
    extra["codec"] = "lossless"
    prompt = list(range(9000, 9000 + 5 * BS + 3))
    a = NoiseEngine(extra, False, **kw)
    try:
        w = a.worker.worker
        made = spy_saves(w)
        a.add("a", prompt)
        a.run()
        # saved layer by layer: each block known not encoded once its last layer landed
        assert [m[:3] for m in made] == [(i, 1, 5) for i in range(LAYERS)], made
        st = w.stats()
        assert (st["saves_not_encoded"], st["saves_failed"], st["saves_completed"]) == \
            (5, 5, 0), st
        assert w.counters()["saves_completed"] == LAYERS  # the calls themselves
        payloads = a.stats_payloads
        assert sum(p.get("failures", {}).get("save_not_encoded", 0) for p in payloads) == 5, \
            payloads
        assert sum(p.get("saved_blocks", 0) for p in payloads) == 0, payloads
    finally:
        a.close()
    b = NoiseEngine(extra, False, **kw)
    try:
        b.add("b", prompt[:5 * BS] + [7])
        outs = b.run()
        assert first_load(outs)[1] is None  # nothing stored: computed again
    finally:
        b.close()


def int8_within_bound(got, want):
    """Every token's K or V of every head (HEAD values) within half its scale
    step (amax / 127), plus the bf16 rounding of the decoded value."""
    g = got.float().unflatten(-1, (2, HEAD))
    w = want.float().unflatten(-1, (2, HEAD))
    step = w.abs().amax(dim=-1, keepdim=True) / 127
    return bool(((g - w).abs() <= step / 2 + w.abs() / 128 + 1e-30).all())


def int8_hadamard_within_bound(got, want):
    """int8-hadamard: every token's K or V of every head (HEAD values, one
    transform block) within its bound in L2: the codes are within half a step
    (amax |y| / 127) of y = H x / 2^k (H the Sylvester Hadamard matrix, k =
    floor(log2(HEAD) / 2)), which H / 2^(log2(HEAD) - k) takes back at 2^k
    times their norm, plus the bf16 rounding."""
    lg = HEAD.bit_length() - 1
    assert 1 << lg == HEAD
    H = torch.ones(1, 1)
    while H.shape[0] < HEAD:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    g = got.double().unflatten(-1, (2, HEAD))
    w = want.double().unflatten(-1, (2, HEAD))
    step = (w @ H.double().T / 2 ** (lg // 2)).abs().amax(dim=-1) / 127
    err = (g - w).norm(dim=-1)
    return bool((err <= 2 ** (lg // 2) * step / 2 * 1.001 + g.norm(dim=-1) / 256 + 1e-30).all())


def fp8_within_bound(got, want):
    """Every value within half a unit in the last of e4m3's 3 mantissa bits,
    or half the smallest subnormal step of its head's K or V scale (amax over
    the block's tokens / 448), plus the bf16 rounding of the decoded value."""
    g = got.float().unflatten(-1, (2, HEAD))  # [heads, tokens, K/V, HEAD]
    w = want.float().unflatten(-1, (2, HEAD))
    scale = w.abs().amax(dim=(1, 3), keepdim=True) / 448
    return bool(((g - w).abs() <= w.abs() / 16 + scale * 2.0 ** -10 + w.abs() / 128
                 + 1e-30).all())


def spy_saves(w):
    """Records each save call of a KVWorker (first arena, arena count,
    blocks) and, as it is made, how many of its blocks are visible already
    (a query by membership: no lease)."""
    made = []
    orig = w._save_arenas

    def spy(first, count, ids, hs):
        visible = sum(w.engine.query_membership(hs))
        made.append((first, count, len(ids), visible))
        return orig(first, count, ids, hs)
    w._save_arenas = spy
    return made


def watch_layer_waits(eng, check):
    """Wraps the worker connector's KVWorker.wait_layer (what its
    wait_for_layer_load calls for each sync load): records, as each wait
    returns, the layer, whether the load's blocks hold that layer's KV then
    (check(got, want) on every block; the loaded prefix's blocks are the
    request's first) and which layers the load's ticket had reported landed
    (arena_poll)."""
    conn = eng.worker
    w = conn.worker
    orig = w.wait_layer
    seen = []

    def wait_layer(ticket, layer_name, timeout=None):
        orig(ticket, layer_name, timeout)
        (req_id, ld), = [(r, ld) for r, ld in conn._loads.items() if ld.ticket is ticket]
        layer = LAYER_NAMES.index(layer_name)
        landed = [ticket.arena_poll(w.arena(n)) for n in LAYER_NAMES]
        ok = all(check(eng.kv[layer_name][b], eng.expected_block(req_id, j, layer))
                 for j, b in enumerate(ld.block_ids))
        seen.append((layer, ok, landed))
    w.wait_layer = wait_layer
    return seen


def server_namespaces(serve):
    import json
    import subprocess
    out = subprocess.run([os.environ["OPENINFER_EXE"], "stats", "--socket", serve.socket,
                          "--json"], check=True, capture_output=True, text=True).stdout
    return {n["name"]: n for n in json.loads(out)["namespaces"]}


CODEC_CASES = [("lossless", "embedded", False), ("lossless", "embedded", True),
               ("lossless", "sidecar", False), ("lossless", "sidecar", True),
               ("int8", "embedded", False), ("int8", "sidecar", True),
               ("fp8", "embedded", False), ("int8-hadamard", "embedded", False)]


@pytest.mark.parametrize("codec,mode,load_async", CODEC_CASES,
                         ids=["%s-%s-%s" % (c, m, "async" if a else "sync")
                              for c, m, a in CODEC_CASES])
def test_a_codec_prefix_loads_into_another_instance(codec, mode, load_async, request):
    """kv_connector_extra_config codec: one instance saves a prompt's 5 blocks
    layer by layer (a save call per layer as save_kv_layer is called, none
    at wait_for_save; no block visible before its last layer) under the
    default namespace, which names the codec; another instance of the same
    config loads them, sync (layer by layer: each layer's wait returns with
    that layer's bytes in place) or async: lossless byte-equal, int8 every
    token's K or V of every head within half its scale step (amax / 127),
    fp8 within its bound, real KV values throughout."""
    i = CODEC_CASES.index((codec, mode, load_async))
    prompt = list(range(6000 + 200 * i, 6000 + 200 * i + 5 * BS + 3))
    if mode == "embedded":
        extra, kw = {"pool_size": "64M"}, {}
    else:
        serve = request.getfixturevalue("serve")
        extra, kw = {"socket": serve.socket}, {"shared_kv": True}
    extra["codec"] = codec
    CodecEngine.skew = codec != "lossless"
    a = CodecEngine(extra, load_async, **kw)
    try:
        ns = a.scheduler.connector._namespace
        assert a.worker._namespace == ns and "/%s/" % codec in ns, ns
        w = a.worker.worker
        assert w.codec == codec
        made = spy_saves(w)
        a.add("a", prompt)
        a.run()
        # a save of the 5 full blocks per layer, as it was written; none visible before
        # its last layer
        assert made == [(i, 1, 5, 0) for i in range(LAYERS)], made
        c = w.counters()
        assert (c["saves_completed"], c["saves_failed"], c["saves_dropped"]) == (LAYERS, 0, 0)
        st = w.stats()
        assert (st["saves_completed"], st["saves_not_encoded"]) == (5, 0), st
        if mode == "sidecar":
            st = server_namespaces(serve)[ns]
            assert st["codec"] == codec and st["blocks_resident"] == 5
            assert st["logical_bytes"] == 5 * w.layout.block_bytes
            assert st["logical_bytes"] / st["physical_bytes"] > 1.3, st
    finally:
        a.close()

    b = CodecEngine(extra, load_async, **kw)  # another instance, the same config
    try:
        assert b.scheduler.connector._namespace == ns
        for t in b.kv.values():
            t.zero_()
        seen = watch_layer_waits(b, {
            "lossless": lambda got, want: torch.equal(got.view(torch.int16),
                                                      want.view(torch.int16)),
            "int8": int8_within_bound, "fp8": fp8_within_bound,
            "int8-hadamard": int8_hadamard_within_bound}[codec])
        b.add("b", prompt[:5 * BS] + [7, 8, 9])
        outs = b.run()
        so, meta = first_load(outs)
        assert meta is not None, "nothing was loaded"
        (ld,) = [ld for ld in meta.loads if ld.req_id == "b"]
        assert len(ld.block_ids) == 5 and ld.is_async == load_async
        if not load_async:  # each layer's wait returned with that layer in place
            assert [(layer, ok, landed[layer]) for layer, ok, landed in seen] == \
                [(i, True, True) for i in range(LAYERS)], seen
        differs = 0
        for j, blk in enumerate(ld.block_ids):
            for layer in range(LAYERS):
                got = b.kv[LAYER_NAMES[layer]][blk]
                want = b.expected_block("b", j, layer)
                if codec == "lossless":
                    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (j, layer)
                elif codec == "int8":
                    assert int8_within_bound(got, want), (j, layer)
                elif codec == "int8-hadamard":
                    assert int8_hadamard_within_bound(got, want), (j, layer)
                else:
                    assert fp8_within_bound(got, want), (j, layer)
                differs += not torch.equal(got, want)
        assert codec == "lossless" or differs, "the lossy codec changed nothing"
        st = b.worker.worker.stats()
        assert st["blocks_loaded"] == 5 and st["loads_failed"] == 0
        assert not any(kvo and kvo.invalid_block_ids for _, kvo in outs)
        assert sum(so.num_scheduled_tokens.get("b", 0) for so, _ in outs) < len(prompt)
    finally:
        b.close()
        CodecEngine.skew = False


@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
def test_the_default_namespace_differs_by_codec(mode, request):
    """The codec is in the default namespace's identity (none keeps the
    namespace it had): a prompt saved under lossless gets 0 hits under codec
    none and under int8, and hits again under lossless."""
    from openinfer.vllm import _default_namespace
    cfg = vllm_config({})
    names = {c: _default_namespace(cfg, c)[0] for c in ("none", "lossless", "int8", "fp8")}
    assert names["none"] == _default_namespace(cfg)[0]
    assert len(set(names.values())) == 4, names
    assert re.fullmatch(r"vllm/tiny-model/bfloat16/kv-auto/bs16/[0-9a-f]{24}", names["none"])
    for c in ("lossless", "int8", "fp8"):
        assert re.fullmatch(r"vllm/tiny-model/bfloat16/kv-auto/bs16/%s/[0-9a-f]{24}" % c,
                            names[c]), names[c]
        assert dict(_default_namespace(cfg, c)[1])["codec"] == c
    assert "codec" not in dict(_default_namespace(cfg)[1])

    base = 8000 + 100 * ["embedded", "sidecar"].index(mode)
    prompt = list(range(base, base + 5 * BS + 3))
    if mode == "embedded":
        extra, kw = {"pool_size": "64M"}, {}
    else:
        extra, kw = {"socket": request.getfixturevalue("serve").socket}, {"shared_kv": True}
    a = CodecEngine(dict(extra, codec="lossless"), **kw)
    try:
        assert a.scheduler.connector._namespace == names["lossless"]
        a.add("a", prompt)
        a.run()
        assert a.worker.worker.counters()["saves_completed"] == LAYERS  # a save per layer
    finally:
        a.close()
    for other in ("none", "int8"):
        e = CodecEngine(dict(extra, codec=other), **kw)
        try:
            assert e.scheduler.connector._namespace == names[other]
            assert e.worker._namespace == names[other]
            e.add("x", prompt)
            outs = e.run()
            assert first_load(outs)[1] is None  # 0 cross hits
            assert e.worker.worker.stats()["blocks_loaded"] == 0
        finally:
            e.close()
    c = CodecEngine(dict(extra, codec="lossless"), **kw)
    try:
        c.add("c", prompt)
        so, meta = first_load(c.run())
        assert meta is not None, "the same codec found nothing"
        ld = check_loaded(c, "c", meta)
        assert len(ld.block_ids) == 5
    finally:
        c.close()


def test_a_lossy_codec_is_refused_for_pages_it_cannot_take():
    """int8 and fp8 need bf16 K and V heads: an MLA latent, an fp16 cache
    and K and V of other head sizes are refused as vLLM makes the connector
    (both roles), naming the option, the group, the layer and why; lossless
    takes the bf16 ones and refuses the fp16 cache (it compresses less than
    the slot needs: every save would be dropped). A user-given namespace is
    kept as it is, whatever the codec."""
    from openinfer._config import ConfigError
    from openinfer.vllm import OpenInferConnector
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    def kvc_of(spec):
        page = spec.page_size_bytes
        return KVCacheConfig(
            num_blocks=NUM_BLOCKS,
            kv_cache_tensors=[KVCacheTensor(size=LAYERS * NUM_BLOCKS * page, layers=LAYER_NAMES,
                                            layer_stride=NUM_BLOCKS * page, block_stride=page)],
            kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, spec)])
    cases = [
        (MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=72, dtype=torch.bfloat16),
         "an MLA latent"),
        (FullAttentionSpec(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD,
                           dtype=torch.float16), "the KV cache is float16"),
        (FullAttentionSpec(block_size=BS, num_kv_heads=KV_HEADS, head_size=HEAD,
                           head_size_v=HEAD // 2, dtype=torch.bfloat16),
         "K heads of 16 and V heads of 8"),
    ]
    for spec, why in cases:
        kvc = kvc_of(spec)
        bf16 = spec.dtype == torch.bfloat16
        allowed = "allowed here: 'none' or 'lossless'" if bf16 else "allowed here: 'none'"
        lossy = ("int8", "fp8", "int8-hadamard")
        for codec in lossy if bf16 else lossy + ("lossless",):
            cfg = vllm_config({"pool_size": "16M", "codec": codec})
            with set_current_vllm_config(cfg):
                for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
                    with pytest.raises(ConfigError) as ei:
                        OpenInferConnector(cfg, role, kvc)
                    msg = str(ei.value)
                    assert ei.value.key == "codec" and "option 'codec' is %r" % codec in msg
                    assert why in msg and "KV cache group 0 (layer %s)" % LAYER_NAMES[0] in msg, \
                        msg
                    assert allowed in msg, msg
                    if codec == "lossless":
                        assert "compresses bfloat16 KV" in msg and "1.14x" in msg, msg
        if not bf16:
            continue
        cfg = vllm_config({"pool_size": "16M", "codec": "lossless", "namespace": "t/given"})
        with set_current_vllm_config(cfg):
            c = OpenInferConnector(cfg, KVConnectorRole.WORKER, kvc)
            assert c._namespace == "t/given" and c._opts.codec == "lossless"
            c.shutdown()


def test_a_mla_prefix_round_trips_under_lossless():
    """An MLA latent ([blocks, 1, tokens, latent] views) under codec
    lossless: saved layer by layer (nothing visible before the last layer),
    loaded layer by layer byte-equal."""
    from openinfer.vllm import OpenInferConnector
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    page = spec.page_size_bytes
    kvc = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[KVCacheTensor(size=LAYERS * NUM_BLOCKS * page, layers=LAYER_NAMES,
                                        layer_stride=NUM_BLOCKS * page, block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, spec)])
    cfg = vllm_config({"pool_size": "16M", "codec": "lossless", "namespace": "t/mla-lossless"})
    with set_current_vllm_config(cfg):
        kv = allocate_kv_cache(kvc, torch.device("cpu"), KVCacheLayout.LBHNC)
        assert next(iter(kv.values())).shape == (NUM_BLOCKS, 1, BS, 64)
        c = OpenInferConnector(cfg, KVConnectorRole.WORKER, kvc)
        c.register_kv_caches(kv)
        w = c.worker
        assert w.codec == "lossless"
        vecs = corpus_vectors().view(-1, 64)  # vectors of the corpus's layers and texts
        for i, t in enumerate(kv.values()):
            pick = (torch.arange(3 * BS) * 131 + i * 977) % vecs.shape[0]
            t[2:5] = vecs[pick].view(3, 1, BS, 64)
        want = {n: t[2:5].clone() for n, t in kv.items()}
        hs = oi.hash_blocks_buffer(list(range(9000, 9000 + 3 * BS)), BS)
        w.begin_step([2, 3, 4], hs)
        for name in LAYER_NAMES:
            assert w.query(hs).hit_blocks == 0
            assert w.save_layer(name) is not None
        assert w.finish_step() == [] and w.wait_saves(30) == []
        q = w.query(hs)
        assert q.hit_blocks == 3, w.stats()["saves_failed"]
        t = w.load(q.lease, [10, 11, 12])
        for n in LAYER_NAMES:
            w.wait_layer(t, n, 30)
            assert torch.equal(kv[n][10:13].view(torch.int16), want[n].view(torch.int16)), n
        assert w.settle_load(t, 30) is True
        c.shutdown()
