"""vLLM's KV connector (v1) on libopeninfer: a host-memory tier for vLLM's
paged KV cache. docs/vllm.md has the options and the failure behaviour.

Enable it with::

    KVTransferConfig(kv_connector="OpenInferConnector",
                     kv_connector_module_path="openinfer.vllm",
                     kv_role="kv_both", kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"socket": "/run/openinfer.sock"})

The scheduler-side connector asks the tier how many of a request's next
blocks it holds (by vLLM's own block hashes, ``request.block_hashes``,
mapped with ``openinfer.block_keys``), takes a lease on them and tells the
worker where to load them; it also tells the worker which newly computed
full blocks to save. The worker-side connector registers vLLM's KV tensors
(``openinfer.kvworker``), saves each layer's new blocks as soon as the layer
is written and loads leased blocks layer by layer (or between steps, with
``load_async``). A load that fails reports its blocks through
``get_block_ids_with_load_errors`` (sync) or ``failed_recving`` (async): with
``kv_load_failure_policy="recompute"`` vLLM recomputes them.

With the ``codec`` option (docs/vllm.md, "Codecs") the namespace stores
compressed frames: blocks are still saved layer by layer and loaded with a
wait per layer (the library encodes a block once its last layer landed),
the lossy codecs' block shape is derived from the layout registered, and
the codec is part of the default namespace.

Two modes:

* ``embedded`` (no ``socket``): the pinned pool lives in this process (one
  ``OffloadHost`` per process, shared by the scheduler and the worker
  connector, which vLLM runs in one process with one GPU and the in-process
  executor).
* ``sidecar`` (``socket``): an ``openinfer serve`` owns the pool; the
  scheduler looks up through a ``LookupClient`` (no layout, no memory), the
  worker registers its own KV memory with the server (engine-owned); if the
  server goes away the worker degrades (misses, dropped saves) and
  reconnects, and the scheduler's lookups miss until the server is back.
"""
import logging
import threading
import time
from dataclasses import dataclass, field


import openinfer as oi
from openinfer import _config, _plan
from openinfer import _vllm_groups as _groups
from openinfer.kvworker import KVWorker, codec_shape_of, lossless_refusal

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

logger = logging.getLogger("openinfer.vllm")

__all__ = ["OpenInferConnector", "OpenInferConnectorMetadata", "OpenInferConnectorStats",
           "OpenInferPromMetrics", "parse_size"]


def parse_size(v):
    """Bytes from an int or a string such as "512M", "4G" (powers of 1024);
    ValueError (openinfer._config.ConfigError) when it is not a size > 0."""
    return _config.parse_size(v)


@dataclass
class _Options:
    """kv_connector_extra_config, checked (openinfer._config.VLLM_KEYS has
    every key's type, range, default and meaning; docs/vllm.md the table)."""
    mode: str = None
    socket: str = None
    namespace: str = None
    pool_size: int = 1 << 30
    pin: bool = None
    lease_ttl_ms: int = None
    load_async: bool = False
    wait_pending_ms: int = None
    control_deadline_ms: int = None
    save_deadline_ms: int = None
    load_deadline_ms: int = None
    copy_mode: int = None
    codec: str = "none"
    lookup_retry_s: float = 1.0
    lookup_deadline_ms: int = 50
    probe_interval_ms: int = 100
    plan: object = None  # openinfer._plan.PlanOptions

    @classmethod
    def from_config(cls, extra):
        """The options of a kv_connector_extra_config; a bad key or value
        raises ConfigError (a ValueError) naming it and what is allowed."""
        where = "openinfer.vllm: kv_connector_extra_config"
        values = _config.parse(_config.VLLM_KEYS, extra, where)
        plan = _plan.PlanOptions.pop(values, where)
        o = cls(plan=plan, **values)
        if o.mode == "sidecar" and not o.socket:
            raise _config.ConfigError("%s: option 'mode' is 'sidecar' but 'socket' is not set "
                                      "(the sidecar's socket is required)" % where,
                                      "mode", "sidecar")
        if o.mode == "embedded":
            o.socket = None
        return o


# ---------------------------------------------------------------------------- metadata


@dataclass
class _Load:
    req_id: str
    leases: list  # 16 raw bytes per shard namespace (docs/vllm.md, "Tensor and pipeline
    #               parallelism"); empty: nothing to load (vLLM recomputes the blocks)
    block_ids: list
    is_async: bool
    group_block_ids: list = None  # hybrid: per KV cache group, the block ids to fill


@dataclass
class _Loading:
    """A worker's load not yet reported to vLLM."""
    ticket: object
    block_ids: list
    is_async: bool
    started: float  # time.monotonic() at submission
    landed: float = None  # when a layer wait last saw bytes land (sync loads)
    nbytes: int = None  # hybrid: the bytes of every group's blocks


# the library's deadline thread reports a missed deadline a little late
_DEADLINE_SLACK_S = 0.05
# a sync load past its deadline: the least time the step waits for its fence
_FENCE_WAIT_MIN_S = 1.0


@dataclass
class OpenInferConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers for one step: the loads to start
    and, per request, the full blocks computed this step to save."""
    loads: list = field(default_factory=list)  # [_Load]
    save_ids: list = field(default_factory=list)  # block ids
    save_hashes: bytes = b""  # 16 bytes per block id
    save_reqs: list = field(default_factory=list)  # request ids with saves this step
    group_saves: list = None  # hybrid: per KV cache group (block ids, 16-byte keys)


# ---------------------------------------------------------------------------- embedded hosts

_hosts = {}
_hosts_lock = threading.Lock()


def _host_device(vllm_config):
    """The device the embedded pool is set up for: vLLM's CUDA device (the
    pool is pinned for it), else the cpu."""
    dc = getattr(vllm_config, "device_config", None)
    if getattr(dc, "device_type", "cpu") != "cuda":
        return oi.DEVICE_CPU
    try:
        import torch
        return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 -- no usable CUDA here: the library says why later
        return 0


def _embedded_host(opts, device):
    """The process's OffloadHost for these options (shared by the scheduler
    and the worker connector of one process). The first connector to ask
    sets its device: vLLM registers the worker's KV caches before it makes
    the scheduler, so that is the worker's device."""
    key = (opts.pool_size, opts.pin, opts.lease_ttl_ms)
    with _hosts_lock:
        h = _hosts.get(key)
        if h is None or h.closed:
            kw = {"device": device}
            if opts.pin is not None:
                kw["pin"] = opts.pin
            if opts.lease_ttl_ms is not None:
                kw["lease_ttl_ms"] = opts.lease_ttl_ms
            h = oi.OffloadHost(opts.pool_size, **kw)
            _hosts[key] = h
        return h


def _canonical(v):
    """A value of the namespace identity as JSON-able data that is equal
    exactly when the values are: dicts with sorted keys, a torch dtype or an
    enum by name, a callable (hf_overrides may be one) by its qualified name."""
    if isinstance(v, dict):
        return {str(k): _canonical(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if callable(v) and hasattr(v, "__qualname__"):
        return "callable:%s.%s" % (getattr(v, "__module__", "?"), v.__qualname__)
    if hasattr(v, "to_dict"):  # a quantization config object
        return _canonical(v.to_dict())
    return str(v).replace("torch.", "")


def _namespace_identity(vllm_config, codec="none"):
    """The fields that determine the KV bytes of a block, as (name, value)
    pairs in a fixed order (docs/vllm.md, "The default namespace"); a codec
    other than "none" (the bytes the tier stores) is the last field, so a
    configuration without one keeps its namespace.

    vLLM's own ModelConfig.compute_hash is not used: it leaves out
    hf_overrides (which can change the KV, e.g. rope_theta) and covers fields
    that do not change it (max_model_len, max_logprobs, generation_config,
    sleep mode, ...), so engines that could share would not. The tokenizer is
    left out too: a block is keyed by its token ids (vLLM's block hashes), and
    the KV of given token ids does not depend on the tokenizer that made them.
    The parallel rank is not here: it is appended to each rank's shard
    namespace (_shard_namespaces)."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    fields = [
        ("model", getattr(mc, "model", None)),
        ("model_weights", getattr(mc, "model_weights", None) or None),
        ("revision", getattr(mc, "revision", None)),
        ("code_revision", getattr(mc, "code_revision", None)),
        ("hf_config_path", getattr(mc, "hf_config_path", None)),
        ("dtype", getattr(mc, "dtype", None)),
        ("quantization", getattr(mc, "quantization", None)),
        ("quantization_config", getattr(mc, "quantization_config", None)),
        ("hf_overrides", getattr(mc, "hf_overrides", None) or None),
        ("model_class_overrides", getattr(mc, "model_class_overrides", None) or None),
        ("disable_sliding_window", getattr(mc, "disable_sliding_window", False)),
        ("kv_cache_dtype", getattr(cc, "cache_dtype", "auto")),
        ("kv_cache_dtype_skip_layers", getattr(cc, "kv_cache_dtype_skip_layers", None) or None),
        ("block_size", cc.block_size),
        ("kv_cache_layout", getattr(cc, "kv_cache_layout", None)),
        ("tensor_parallel_size", getattr(pc, "tensor_parallel_size", 1)),
        ("pipeline_parallel_size", getattr(pc, "pipeline_parallel_size", 1)),
        ("prefill_context_parallel_size", getattr(pc, "prefill_context_parallel_size", 1)),
        ("decode_context_parallel_size", getattr(pc, "decode_context_parallel_size", 1)),
    ]
    if codec != "none":
        fields.append(("codec", codec))
    return [(k, _canonical(v)) for k, v in fields]


def _default_namespace(vllm_config, codec="none"):
    """vllm/<model basename>/<dtype>/kv-<kv cache dtype>/bs<block size>[/<codec>]/<digest>:
    a readable prefix and the first 24 hex digits of the sha256 of the whole
    identity (_namespace_identity), at most 255 bytes; the codec's part only
    when it is not "none". Returns (namespace, identity)."""
    import hashlib
    import json
    ident = _namespace_identity(vllm_config, codec)
    f = dict(ident)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":"))
                            .encode()).hexdigest()[:24]
    base = str(f["model"] or "model").rstrip("/").rsplit("/", 1)[-1] or "model"
    base = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)[:64]
    ns = "vllm/%s/%s/kv-%s/bs%d/%s%s" % (base, str(f["dtype"])[:16],
                                         str(f["kv_cache_dtype"])[:16], f["block_size"],
                                         "" if codec == "none" else codec + "/", digest)
    return ns, ident


_LOSSY = ("int8", "int8-hadamard", "fp8")
_CODEC_WHERE = "openinfer.vllm: kv_connector_extra_config"


def _layer_specs(group):
    """The KV cache spec of each layer of a KVCacheGroupSpec ({name: spec})."""
    spec = group.kv_cache_spec
    per = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    return {n: (per.get(n, spec) if per else spec) for n in group.layer_names}


def _lossy_refusal(spec):
    """Why a lossy codec cannot take the pages of this KV cache spec, or None.
    int8 and fp8 scale one head's K or V (docs/codecs.md): the pages must
    hold bf16 K and V of equal head sizes, one slot per KV head, a state
    per token."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MLAAttentionSpec
    name = type(spec).__name__
    if isinstance(spec, MLAAttentionSpec):
        return ("%s: an MLA latent (one latent vector per token, no K/V heads), whose scales "
                "the lossy codecs were not measured on" % name)
    if not isinstance(spec, AttentionSpec):
        return "%s: not an attention spec of K/V heads" % name
    import torch
    if spec.dtype != torch.bfloat16:
        return "%s: the KV cache is %s, the lossy codecs take bfloat16 only" % (
            name, str(spec.dtype).replace("torch.", ""))
    if spec.head_size_v != spec.head_size:
        return "%s: K heads of %d and V heads of %d elements" % (name, spec.head_size,
                                                                  spec.head_size_v)
    for field, plain in (("state_content_bytes", None), ("num_head_slots", None),
                         ("page_size_padded", None), ("tokens_per_state", 1)):
        v = getattr(spec, field, plain)
        if v != plain:
            return "%s: %s is %r (packed or padded pages)" % (name, field, v)
    mode = getattr(spec, "kv_quant_mode", None)
    if mode is not None and getattr(mode, "name", str(mode)) != "NONE":
        return "%s: the KV cache is quantized (%s)" % (name, mode)
    return None


def _check_codec(opts, kv_cache_config):
    """A codec with KV cache groups it cannot take is refused when the
    connector is made (ConfigError naming the option, the group and why):
    a lossy codec needs bf16 K/V heads, lossless a bf16 cache."""
    if opts.codec == "none" or kv_cache_config is None:
        return
    for i, g in enumerate(getattr(kv_cache_config, "kv_cache_groups", None) or ()):
        for layer, spec in _layer_specs(g).items():
            dtype = getattr(spec, "dtype", None)
            lossless_why = None if dtype is None else lossless_refusal(dtype)
            why = _lossy_refusal(spec) if opts.codec in _LOSSY else lossless_why
            allowed = ("'none'" if lossless_why is not None else
                       "'none' or 'lossless' (byte-exact, any bfloat16 layout)")
            if why is not None:
                raise _config.ConfigError(
                    "%s: option 'codec' is %r but KV cache group %d (layer %s) is %s; allowed "
                    "here: %s" % (_CODEC_WHERE, opts.codec, i, layer, why, allowed), "codec",
                    opts.codec)


def _codec_options(opts, tensors, specs, pages):
    """The KVWorker's codec options for these KV tensors: {} without a
    codec; lossless: the codec; int8 and fp8: also the block shape, derived
    from the layout registered (openinfer.kvworker.codec_shape_of):

    * vLLM 0.33's pages, ``[blocks, heads, tokens, K||V]`` views (possibly
      ``[blocks, kernel blocks, heads, tokens, K||V]``), in the memory order
      of the cache layout: K||V is split into its K and V heads of
      head_size, so a block is (layers x heads) parts of [tokens][K, V]
      [head_size] (LBHNC) or layers parts of [tokens][heads x K, V]
      [head_size] (LBNHC);
    * the halves, ``[2, blocks, tokens, heads, head_size]`` (and
      ``[blocks, 2, ...]``): 2 x layers parts of [tokens][heads][head_size].

    specs: {layer: KV cache spec} (None: not known)."""
    if opts.codec == "none":
        return {}
    if opts.codec not in _LOSSY:
        return {"codec": opts.codec}
    views, roles = {}, None
    for name, t in tensors.items():
        spec = (specs or {}).get(name)
        why = "vLLM gave no KV cache spec for it" if spec is None else _lossy_refusal(spec)
        if why is not None:
            raise _config.ConfigError("%s: option 'codec' is %r but layer %s is %s; allowed "
                                      "here: 'none' or 'lossless'"
                                      % (_CODEC_WHERE, opts.codec, name, why), "codec",
                                      opts.codec)
        d = int(spec.head_size)
        shape = list(t.shape)
        if pages and shape[-1] == 2 * d:
            views[name] = t.unflatten(-1, (2, d))
            r = "b" + "g" * (t.dim() - 4) + "htkd"
        elif not pages and t.dim() == 5 and shape[0] == 2 and shape[-1] == d:
            views[name], r = t, "sbthd"
        elif not pages and t.dim() == 5 and shape[1] == 2 and shape[-1] == d:
            views[name], r = t, "bsthd"
        else:
            raise _config.ConfigError(
                "%s: option 'codec' is %r but layer %s has a KV tensor of shape %s, a layout "
                "of which no lossy codec shape is derived here (pages [blocks, heads, tokens, "
                "2 x %d] or halves [2, blocks, tokens, heads, %d]); allowed here: 'none' or "
                "'lossless'" % (_CODEC_WHERE, opts.codec, name, shape, d, d), "codec",
                opts.codec)
        if roles is not None and r != roles:
            raise _config.ConfigError("%s: option 'codec' is %r but the layers' KV tensors have "
                                      "different layouts" % (_CODEC_WHERE, opts.codec), "codec",
                                      opts.codec)
        roles = r
    try:
        shape = codec_shape_of(views, roles)
    except oi.Error as e:
        raise _config.ConfigError("%s: option 'codec' is %r but %s; allowed here: 'none' or "
                                  "'lossless'" % (_CODEC_WHERE, opts.codec, e), "codec",
                                  opts.codec) from None
    return {"codec": opts.codec, "codec_shape": shape}


def _parallel_sizes(vllm_config):
    """(tensor, pipeline) parallel sizes; context parallelism is refused
    (its ranks split a block's tokens, which the shard namespaces do not
    describe)."""
    pc = vllm_config.parallel_config
    for name in ("prefill_context_parallel_size", "decode_context_parallel_size"):
        if getattr(pc, name, 1) > 1:
            raise NotImplementedError(
                "openinfer.vllm: %s is %d: context parallelism is not supported (a block's "
                "tokens are split across ranks); tensor and pipeline parallelism are"
                % (name, getattr(pc, name)))
    return int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)


def _shard_namespaces(namespace, tp, pp, latent=False):
    """The namespace of every rank's shard, in rank order (pp-major, as vLLM
    numbers its workers: rank = pp_rank * tp + tp_rank). One rank: the
    namespace itself. Several: ``<namespace>/tp<t>of<T>-pp<p>of<P>``, so that
    each rank's shard of a block is a block of its own, sealed by that rank
    alone (docs/vllm.md, "Tensor and pipeline parallelism").

    latent (an MLA model: every TP rank holds the same latent): one
    namespace per pipeline stage, shared by the stage's TP ranks -- the
    namespace itself at pp = 1, else ``<namespace>/pp<p>of<P>`` -- which
    the stage's TP rank 0 writes and every TP rank of the stage loads
    (docs/vllm.md, "MLA")."""
    if tp * pp == 1 or (latent and pp == 1):
        return [namespace]
    out = []
    for p in range(pp):
        for t in range(1 if latent else tp):
            ns = "%s/pp%dof%d" % (namespace, p, pp) if latent else \
                "%s/tp%dof%d-pp%dof%d" % (namespace, t, tp, p, pp)
            if len(ns.encode()) > _config.NAMESPACE_MAX_BYTES:
                raise _config.ConfigError(
                    "openinfer.vllm: kv_connector_extra_config: option 'namespace' is %r; "
                    "allowed: at most %d bytes with the rank suffix (%r) that tensor/pipeline "
                    "parallelism appends: use a shorter namespace"
                    % (namespace, _config.NAMESPACE_MAX_BYTES, ns[len(namespace):]),
                    "namespace", namespace)
            out.append(ns)
    return out


def _latent_replicated(vllm_config, kv_cache_config):
    """True for an MLA model's one KV cache group: vLLM's MLA attention keeps
    a single latent per token ([blocks, 1, tokens, latent] per layer, no K/V
    split) and every TP rank holds the same latent (MLA's KV heads are one
    head, replicated). Several groups (hybrid) are served per rank."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if groups:  # vLLM 0.33 gives the scheduler and the workers the KVCacheConfig
        if len(groups) != 1:
            return False
        from vllm.v1.kv_cache_interface import MLAAttentionSpec
        return isinstance(groups[0].kv_cache_spec, MLAAttentionSpec)
    return bool(getattr(vllm_config.model_config, "use_mla", False))


def _worker_rank(vllm_config, tp, pp):
    """(tp_rank, pp_rank) of this worker from vLLM's global rank
    (parallel_config.rank, which vLLM's worker sets before it makes the KV
    transfer group; vLLM orders ranks (dp, pp, tp), tp fastest). Checked
    against vLLM's parallel groups when they are set up at these sizes."""
    rank = int(getattr(vllm_config.parallel_config, "rank", 0))
    t, p = rank % tp, (rank // tp) % pp
    try:
        from vllm.distributed import parallel_state as ps
        if ps.model_parallel_is_initialized():
            g_tp, g_pp = ps.get_tp_group(), ps.get_pp_group()
            if g_tp.world_size == tp and g_pp.world_size == pp and \
                    (g_tp.rank_in_group, g_pp.rank_in_group) != (t, p):
                raise RuntimeError(
                    "openinfer.vllm: parallel_config.rank %d gives tp rank %d, pp rank %d but "
                    "vLLM's groups say tp rank %d, pp rank %d" % (rank, t, p, g_tp.rank_in_group,
                                                                  g_pp.rank_in_group))
    except (ImportError, AttributeError):  # another vLLM's parallel state: the rank alone
        pass
    return t, p


def _keys(block_hashes):
    """vLLM block hashes (bytes, or ints from older hashers) -> BlockHashes."""
    keys = [h if isinstance(h, (bytes, bytearray)) else
            int(h).to_bytes(8, "little", signed=True) for h in block_hashes]
    if not keys:
        return oi.BlockHashes(b"")
    if all(len(k) == len(keys[0]) for k in keys):
        return oi.BlockHashes(b"".join(oi.block_keys(keys)))
    return oi.BlockHashes(b"".join(oi.block_key(k) for k in keys))


def _new_sched_counts():
    return dict(lookups=0, hit_blocks=0, miss_blocks=0, failures={"lookup": 0})


class _LookupFailed(Exception):
    """A lookup the tier could not answer (args[0]: what to log, or None)."""

    def __init__(self, msg, degraded=False):
        super().__init__(msg)
        self.degraded = degraded


class _ReqState:
    __slots__ = ("request", "lease", "lease_owner", "start_block", "hit_blocks",
                 "block_ids", "saved_upto", "pending_load", "loading", "group_ids")

    def __init__(self, request):
        self.request = request
        self.lease = None  # raw 16 bytes per shard: leases not yet handed to a worker
        self.lease_owner = None
        self.start_block = 0
        self.hit_blocks = 0
        self.block_ids = []
        self.saved_upto = 0
        self.pending_load = None
        self.loading = False
        self.group_ids = None  # hybrid: every KV cache group's block ids


# ---------------------------------------------------------------------------- metrics

#: The counters of OpenInferConnectorStats: (payload key, Prometheus name,
#: help). Prometheus adds ``_total`` to each (docs/vllm.md, "Metrics").
_COUNTERS = [
    ("lookups", "vllm:openinfer_lookups",
     "Lookups of the openinfer host tier by the scheduler"),
    ("hit_blocks", "vllm:openinfer_lookup_hit_blocks",
     "Blocks the openinfer tier held for a lookup (promised to vLLM)"),
    ("miss_blocks", "vllm:openinfer_lookup_miss_blocks",
     "Blocks a lookup asked the openinfer tier for and did not get"),
    ("saved_blocks", "vllm:openinfer_saved_blocks",
     "Blocks (one rank's shard each) whose save to the openinfer tier completed, "
     "blocks the tier already held included"),
    ("saved_bytes", "vllm:openinfer_saved_bytes",
     "Bytes of the blocks counted in vllm:openinfer_saved_blocks"),
    ("loaded_blocks", "vllm:openinfer_loaded_blocks",
     "Blocks (one rank's shard each) loaded from the openinfer tier into vLLM's KV cache"),
    ("loaded_bytes", "vllm:openinfer_loaded_bytes",
     "Bytes loaded from the openinfer tier into vLLM's KV cache"),
]
#: Causes of vllm:openinfer_failures_total.
FAILURE_CAUSES = ("lookup", "load_refused", "load_failed", "load_fenced", "save_failed",
                  "save_dropped", "save_not_encoded")
_LOAD_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0, 30.0, 120.0]


def _empty_payload():
    d = {k: 0 for k, _, _ in _COUNTERS}
    d["failures"] = {}
    d["load_seconds"] = []
    return d


@dataclass
class OpenInferConnectorStats(KVConnectorStats):
    """The tier's figures of one interval, as vLLM's connector-stats hooks
    move them (worker ranks -> KVOutputAggregator -> scheduler -> stat
    loggers): the counters of _COUNTERS, ``failures`` by cause,
    ``load_seconds`` (one observation per load, from its submission to when
    the connector saw it land) and ``degraded`` (the scheduler's view: 1
    while its lookups find the tier unreachable; present only when it
    changed). Counts of several ranks add up (a block at TP = 2 is two
    shards)."""

    def __post_init__(self):
        base = _empty_payload()
        base.update(self.data or {})
        self.data = base

    def reset(self):
        self.data = _empty_payload()

    def aggregate(self, other):
        d, o = self.data, other.data
        out = _empty_payload()
        for k, _, _ in _COUNTERS:
            out[k] = d.get(k, 0) + o.get(k, 0)
        for src in (d, o):
            for cause, n in src.get("failures", {}).items():
                out["failures"][cause] = out["failures"].get(cause, 0) + n
        out["load_seconds"] = list(d.get("load_seconds", [])) + list(o.get("load_seconds", []))
        deg = [x["degraded"] for x in (d, o) if x.get("degraded") is not None]
        if deg:
            out["degraded"] = o["degraded"] if o.get("degraded") is not None else deg[0]
        return OpenInferConnectorStats(data=out)

    def reduce(self):
        d = self.data
        out = {k: d.get(k, 0) for k, _, _ in _COUNTERS}
        asked = out["hit_blocks"] + out["miss_blocks"]
        out["hit_rate"] = round(out["hit_blocks"] / asked, 4) if asked else 0.0
        lat = sorted(d.get("load_seconds", []))
        if lat:
            out["load_p50_ms"] = round(lat[len(lat) // 2] * 1e3, 3)
            out["load_max_ms"] = round(lat[-1] * 1e3, 3)
        out["failures"] = sum(d.get("failures", {}).values())
        if d.get("degraded") is not None:
            out["degraded"] = d["degraded"]
        return out

    def is_empty(self):
        d = self.data
        return not (any(d.get(k, 0) for k, _, _ in _COUNTERS) or any(d.get("failures", {})
                    .values()) or d.get("load_seconds") or d.get("degraded") is not None)


class OpenInferPromMetrics(KVConnectorPromMetrics):
    """The tier's Prometheus metrics in vLLM's /metrics (docs/vllm.md,
    "Metrics"): the counters of _COUNTERS, vllm:openinfer_failures_total by
    cause, the histogram vllm:openinfer_load_seconds and the gauge
    vllm:openinfer_degraded, each with vLLM's engine labels."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {}
        for key, name, doc in _COUNTERS:
            m = self._counter_cls(name=name, documentation=doc, labelnames=labelnames)
            self._counters[key] = {i: m.labels(*v) for i, v in per_engine_labelvalues.items()}
        fail = self._counter_cls(
            name="vllm:openinfer_failures",
            documentation="Failures of the openinfer tier by cause (%s); each costs a miss or "
                          "a recompute, never wrong bytes" % ", ".join(FAILURE_CAUSES),
            labelnames=labelnames + ["cause"])
        self._failures = {(i, c): fail.labels(*(v + [c]))
                          for i, v in per_engine_labelvalues.items() for c in FAILURE_CAUSES}
        lat = self._histogram_cls(
            name="vllm:openinfer_load_seconds",
            documentation="Load latency from the openinfer tier: from the load's submission to "
                          "when the connector saw its last byte land",
            labelnames=labelnames, buckets=_LOAD_BUCKETS)
        self._load_seconds = {i: lat.labels(*v) for i, v in per_engine_labelvalues.items()}
        deg = self._gauge_cls(
            name="vllm:openinfer_degraded",
            documentation="1 while the scheduler's lookups find the openinfer tier "
                          "unreachable (sidecar gone or not answering), else 0",
            labelnames=labelnames, multiprocess_mode="mostrecent")
        self._degraded = {i: deg.labels(*v) for i, v in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        d = transfer_stats_data
        for key, _, _ in _COUNTERS:
            n = d.get(key, 0)
            if n:
                self._counters[key][engine_idx].inc(n)
        for cause, n in d.get("failures", {}).items():
            m = self._failures.get((engine_idx, cause))
            if m is not None and n:
                m.inc(n)
        h = self._load_seconds[engine_idx]
        for x in d.get("load_seconds", ()):
            h.observe(x)
        if d.get("degraded") is not None:
            self._degraded[engine_idx].set(d["degraded"])


# ---------------------------------------------------------------------------- the connector


class OpenInferConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector over libopeninfer's host tier (docs/vllm.md)."""

    _cache_hit_source = CacheHitSource.HOST

    @property
    def requires_kv_delivery(self):
        return False  # a cache: a save that does not happen is a later miss

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        # wait_for_layer_load / save_kv_layer run between the layers: a full
        # CUDA graph would skip them on replay
        return True

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._opts = _Options.from_config(self._kv_transfer_config.kv_connector_extra_config)
        _check_codec(self._opts, kv_cache_config)
        pc = vllm_config.parallel_config
        self._tp, self._pp = _parallel_sizes(vllm_config)
        self._block_size = vllm_config.cache_config.block_size
        if self._opts.namespace is not None:
            self._namespace = self._opts.namespace
            logger.info("openinfer.vllm: %s connector, namespace %r (kv_connector_extra_config)",
                        role.name.lower(), self._namespace)
        else:
            self._namespace, ident = _default_namespace(vllm_config, self._opts.codec)
            logger.info("openinfer.vllm: %s connector, namespace %r derived from %s",
                        role.name.lower(), self._namespace,
                        ", ".join("%s=%r" % kv for kv in ident))
        # MLA: the latent is replicated on every TP rank, so it is written once
        # per pipeline stage and loaded by each of the stage's TP ranks from
        # one lease of tp shares (docs/vllm.md, "MLA")
        self._latent = _latent_replicated(vllm_config, kv_cache_config)
        self._consumers = self._tp if self._latent else 1
        self._shards = _shard_namespaces(self._namespace, self._tp, self._pp, self._latent)
        self._groups = self._hybrid_groups(kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:
            self._reqs = {}
            self._lookups = [None] * len(self._shards)  # sidecar: a session per shard
            self._where = [None] * len(self._shards)  # each shard's last answer's places
            self._lookup_failed_at = 0.0
            self._degraded = False  # the last lookup found the tier unreachable
            self._sched_counts = _new_sched_counts()
            self._host = None
            if self._opts.socket is None:
                backend = getattr(pc, "distributed_executor_backend", None)
                if backend in ("mp", "ray") or (backend == "external_launcher" and
                                                self._tp * self._pp > 1):
                    raise ValueError(
                        "openinfer.vllm: embedded mode needs the scheduler and the worker in one "
                        "process (distributed_executor_backend 'uni'); with %r use the sidecar "
                        "(kv_connector_extra_config 'socket')" % backend)
                self._host = _embedded_host(self._opts, _host_device(vllm_config))
            self._planner = _plan.vllm_planner(self._opts, vllm_config, kv_cache_config,
                                               self._host)
            if self._kv_transfer_config.kv_load_failure_policy != "recompute":
                logger.warning("openinfer.vllm: kv_load_failure_policy is %r: a block the tier "
                               "fails to load fails its request; 'recompute' recomputes it",
                               self._kv_transfer_config.kv_load_failure_policy)
        else:
            t, p = _worker_rank(vllm_config, self._tp, self._pp)
            # the index of this rank's namespace (and lease) among the shards;
            # MLA: the stage's, which only its TP rank 0 saves to
            self._shard = p if self._latent else p * self._tp + t
            self._saves = not self._latent or t == 0
            self._shard_namespace = self._shards[self._shard * len(self._groups or [0])]
            if self._tp * self._pp > 1:
                logger.info("openinfer.vllm: worker tp rank %d of %d, pp rank %d of %d: shard "
                            "namespace %r%s", t, self._tp, p, self._pp, self._shard_namespace,
                            "" if self._saves else " (MLA: loads only; tp rank 0 saves the "
                            "stage's latent)")
            self._worker = None
            self._num_blocks = kv_cache_config.num_blocks if kv_cache_config else None
            self._loads = {}  # req_id -> _Loading (not yet reported to vLLM)
            self._failed_blocks = set()
            self._finished_recving = set()
            self._failed_recving = set()  # hybrid: loads failed (block ids are per group)
            self._counts = dict(loads_submitted=0, loads_refused=0, loads_completed=0,
                                loads_failed=0, blocks_failed=0, saves_dropped=0,
                                saves_failed=0, saves_not_encoded=0)
            self._not_encoded_seen = 0  # the engine's saves_not_encoded at the last step
            self._interval = _empty_payload()  # get_kv_connector_stats's, since its last call
            self._step_save_blocks = 0
            self._step_save_bytes = 0

    # ================================================================ hybrid groups

    def _hybrid_groups(self, kv_cache_config):
        """The model's KV cache groups when there are several (None: one),
        each in a namespace of its own per shard (self._shards becomes every
        (shard, group) namespace, shard-major); a shape this connector
        cannot serve is refused here (openinfer._vllm_groups)."""
        groups = _groups.groups_of(kv_cache_config, self._block_size)
        if groups is None:
            return None
        _groups.check_options(self._opts, self._kv_transfer_config.kv_connector_extra_config)
        if self._pp > 1:
            raise NotImplementedError(
                "openinfer.vllm: pipeline_parallel_size is %d with %d KV cache groups (hybrid): "
                "hybrid models are supported at pipeline_parallel_size 1 (tensor parallelism "
                "is)" % (self._pp, len(groups)))
        self._shards = _groups.namespaces(self._shards, groups)
        logger.info("openinfer.vllm: %d KV cache groups (%s): a namespace per group",
                    len(groups), ", ".join("%d: %s" % (g.index, g.suffix) for g in groups))
        return groups

    def _group_lookup(self, block_hashes, req_id, count, first):
        """_lookup_query for several KV cache groups (openinfer._vllm_groups.lookup)."""
        try:
            n, leases = _groups.lookup(self, block_hashes, first, req_id, _keys)
        except _LookupFailed as e:
            if e.args[0]:
                logger.warning("openinfer.vllm: %s", e.args[0])
            if count:
                self._stats_lookup_failed(e.degraded)
            n, leases = 0, None
        else:
            self._degraded = False
        if count:
            self._stats_hits(n, len(block_hashes))
        return n, leases

    def _group_load(self, st, request, n):
        """The pending load of a request's n leased blocks into every group's
        blocks (vLLM recomputes them when a group lacks a block to fill)."""
        ids = _groups.load_targets(self._groups, st.group_ids or [], st.start_block, n,
                                   self._block_size)
        if ids is None:
            logger.warning("openinfer.vllm: %s: vLLM gave no block for part of the %d blocks "
                           "to load: they are recomputed", request.request_id, n)
            self._release(st)
            return _Load(request.request_id, [], [], self._opts.load_async)
        return _Load(request.request_id, st.lease, [b for g in ids for b in g],
                     self._opts.load_async, ids)

    def _group_block_ids(self, st, block_ids, resumed):
        """Keeps every group's block ids of a request from vLLM's scheduler
        output (new: the whole table; cached: the new ones, or the whole
        table when resumed)."""
        if block_ids is None:
            if resumed:
                st.group_ids = [[] for _ in self._groups]
            return
        if st.group_ids is None or resumed:
            st.group_ids = [list(x) for x in block_ids]
        else:
            for have, new in zip(st.group_ids, block_ids):
                have.extend(new)

    def _group_saves(self, done):
        """Per group, the blocks computed this step to save (a sliding-window
        group: only those its window keeps); advances each request's
        saved_upto."""
        saves = [([], []) for _ in self._groups]
        reqs = []
        for st, computed in done:
            st.loading = False
            full = min(computed // self._block_size, len(st.request.block_hashes),
                       len(st.block_ids))
            if full <= st.saved_upto:
                continue
            plan = _groups.save_plan(self._groups, st.group_ids or [],
                                     st.request.block_hashes, st.saved_upto, full,
                                     self._block_size)
            for (ids, keys), (gi, gk) in zip(saves, plan):
                ids.extend(gi)
                keys.extend(gk)
            reqs.append(st.request.request_id)
            st.saved_upto = full
        return [(ids, _keys(keys).tobytes() if keys else b"") for ids, keys in saves], reqs

    def _group_plan_prefix(self, st, request, n):
        """The restore plan chose the first n of the leased blocks: with
        several groups a sliding window's blocks for n are not those for the
        whole hit, so the prefix every group can serve within n is leased
        (the lease of the whole hit released); returns its length."""
        self._release(st)
        m, lease = self._lookup_query(
            request.block_hashes[st.start_block:st.start_block + n], request.request_id,
            count=False, first=st.start_block)
        st.lease, st.hit_blocks = (lease, m) if m else (None, 0)
        return m

    def request_finished_all_groups(self, request, block_ids):
        """SupportsHMA: a request finished in every KV cache group; its
        leases not handed to a worker are released (saves are made as its
        blocks fill, so nothing is held back)."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    # ================================================================ scheduler

    def _stats_hits(self, hit, asked):
        self._sched_counts["lookups"] += 1
        self._sched_counts["hit_blocks"] += hit
        self._sched_counts["miss_blocks"] += asked - hit

    def _stats_lookup_failed(self, degraded):
        self._sched_counts["failures"]["lookup"] += 1
        if degraded:
            self._degraded = True

    def _query_shard(self, i, hashes, req_id):
        """A prefix query of shard namespace i: (hit_blocks, raw lease or
        None); raises _LookupFailed when the tier could not answer."""
        o = self._opts
        kw = {}
        if o.wait_pending_ms is not None:
            kw["wait_pending"] = o.wait_pending_ms / 1000.0
        if self._host is not None:
            try:
                q = self._host.query(self._shards[i], hashes, req_id,
                                     world_size=self._consumers, **kw)
            except oi.Error as e:  # a lookup that fails is a miss
                raise _LookupFailed("lookup failed (%s): a miss" % e)
        else:
            lk = self._lookups[i]
            if lk is None:
                if time.monotonic() - self._lookup_failed_at < o.lookup_retry_s:
                    raise _LookupFailed(None)
                try:
                    lk = self._lookups[i] = oi.LookupClient(
                        o.socket, self._shards[i], world_size=self._consumers,
                        control_deadline_ms=o.control_deadline_ms,
                        lookup_deadline_ms=o.lookup_deadline_ms,
                        probe_interval_ms=o.probe_interval_ms, client_name="vllm-scheduler")
                except oi.Error as e:
                    self._lookup_down()
                    raise _LookupFailed("no lookup session with %s (%s): misses until it "
                                        "answers" % (o.socket, e), degraded=True)
            try:
                q = lk.query(hashes, req_id, **kw)
            except oi.ClosedError as e:
                self._lookup_down()
                raise _LookupFailed("the openinfer server went away (%s): misses until it "
                                    "is back" % e, degraded=True)
            except oi.Error as e:  # a deadline, a refusal: this lookup is a miss
                raise _LookupFailed("lookup failed (%s): a miss" % e)
        self._where[i] = q.where  # where each block is, for the restore plan
        if not q.hit_blocks:
            return 0, None
        return q.hit_blocks, q.lease.raw

    def _lookup_down(self):
        """The sidecar's lookup sessions failed: closed, reopened after
        lookup_retry_s (every shard's: they share the server)."""
        for i, lk in enumerate(self._lookups):
            if lk is not None:
                lk.close()
                self._lookups[i] = None
        self._lookup_failed_at = time.monotonic()

    def _release_shard(self, i, raw):
        try:
            if self._host is not None:
                self._host.release(self._shards[i], raw)
            elif self._lookups[i] is not None:
                self._lookups[i].release(raw)
        except oi.Error:
            pass  # expired, or the server went away with it

    def _lookup_query(self, block_hashes, req_id, count=True, first=0):
        """The leading run of blocks whose shard every rank holds, leased in
        every shard namespace: (hit_blocks, [raw lease per shard] or None).

        One rank (one namespace): its hits. Several: each shard namespace
        is asked for the run the earlier ones had; a shorter answer shortens
        the run, and a lease longer than the final run is released and taken
        again for exactly that run (a lease is loaded whole), until every
        shard holds a lease of the same length -- the shortest common
        prefix. A lookup that fails in any shard is a miss for all.
        Several KV cache groups: _group_lookup (first: the request's block
        that block_hashes start at)."""
        if self._groups:
            return self._group_lookup(block_hashes, req_id, count, first)
        n = len(block_hashes)
        held = [None] * len(self._shards)  # (blocks, raw)
        try:
            while n > 0:
                short = False
                for i in range(len(self._shards)):
                    if held[i] is not None and held[i][0] == n:
                        continue
                    if held[i] is not None:
                        self._release_shard(i, held[i][1])
                        held[i] = None
                    hit, raw = self._query_shard(i, _keys(block_hashes[:n]), req_id)
                    if raw is not None:
                        held[i] = (hit, raw)
                    if hit < n:
                        n, short = hit, True
                        if n == 0:
                            break
                if not short:
                    break
        except _LookupFailed as e:
            if e.args[0]:
                logger.warning("openinfer.vllm: %s", e.args[0])
            if count:
                self._stats_lookup_failed(e.degraded)
            n = 0
        else:
            self._degraded = False
        if n == 0:
            for i, h in enumerate(held):
                if h is not None:
                    self._release_shard(i, h[1])
            if count:
                self._stats_hits(0, len(block_hashes))
            return 0, None
        if count:
            self._stats_hits(n, len(block_hashes))
        return n, [h[1] for h in held]

    def _release(self, st):
        leases, st.lease = st.lease, None
        for i, raw in enumerate(leases or ()):
            self._release_shard(i, raw)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        bs = self._block_size
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(request)
        if st.loading:
            return 0, False
        self._release(st)
        first = num_computed_tokens // bs
        st.start_block = first
        # at least one token is left for vLLM to compute
        last = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        if last <= first:
            return 0, False
        hit, lease = self._lookup_query(request.block_hashes[first:last],
                                        request.request_id, first=first)
        if not hit:
            return 0, False
        st.lease, st.start_block, st.hit_blocks = lease, first, hit
        # restore or recompute (docs/planner.md): a prefix of the common run;
        # fewer than leased: update_state_after_alloc leases exactly those
        n = self._planner.blocks(first * bs, request.num_tokens, hit,
                                 _plan.merge_where(self._where, hit))
        if self._groups and 0 < n < hit:
            n = self._group_plan_prefix(st, request, n)
        if n == 0:
            self._release(st)
            return 0, False
        return n * bs, self._opts.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(request)
        bs = self._block_size
        ids = list(blocks.get_block_ids()[0]) if blocks is not None else []
        if ids:
            st.block_ids = ids
            if self._groups:
                st.group_ids = [list(x) for x in blocks.get_block_ids()]
        if num_external_tokens == 0:
            if not st.loading:
                self._release(st)
                st.saved_upto = max(st.saved_upto, st.start_block)
            return
        n = num_external_tokens // bs
        if st.lease is None or n <= 0:
            return
        if n != st.hit_blocks:  # vLLM took fewer: lease exactly those
            self._release(st)
            hit, lease = self._lookup_query(
                request.block_hashes[st.start_block:st.start_block + n], request.request_id,
                count=False, first=st.start_block)
            if hit != n:
                if lease is not None:
                    st.lease = lease
                    self._release(st)
                # nothing to load: vLLM recomputes these through the load-error path
                st.pending_load = _Load(request.request_id, [], ids[st.start_block:
                                                                      st.start_block + n],
                                        self._opts.load_async)
                st.loading = True
                return
            st.lease = lease
        dst = ids[st.start_block:st.start_block + n]
        st.pending_load = _Load(request.request_id, st.lease, dst, self._opts.load_async) \
            if not self._groups else self._group_load(st, request, n)
        st.lease = None  # handed to the worker, which consumes it
        st.loading = True
        st.saved_upto = st.start_block + n

    def build_connector_meta(self, scheduler_output):
        meta = OpenInferConnectorMetadata()
        for st in self._reqs.values():
            if st.pending_load is not None:
                meta.loads.append(st.pending_load)
                st.pending_load = None
        sched = scheduler_output.num_scheduled_tokens
        done = []
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(nr.req_id)
            if st is None:
                continue
            st.block_ids = list(nr.block_ids[0])
            if self._groups:
                self._group_block_ids(st, nr.block_ids, True)
            done.append((st, nr.num_computed_tokens + sched.get(nr.req_id, 0)))
        cr = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cr.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new = cr.new_block_ids[i]
            if req_id in cr.resumed_req_ids:
                st.block_ids = list(new[0]) if new is not None else []
            elif new is not None:
                st.block_ids.extend(new[0])
            if self._groups:
                self._group_block_ids(st, new, req_id in cr.resumed_req_ids)
            done.append((st, cr.num_computed_tokens[i] + sched.get(req_id, 0)))
        if self._groups:
            meta.group_saves, meta.save_reqs = self._group_saves(done)
            return meta
        ids, keys = [], []
        for st, computed in done:
            st.loading = False
            full = min(computed // self._block_size, len(st.request.block_hashes),
                       len(st.block_ids))
            if full > st.saved_upto:
                ids.extend(st.block_ids[st.saved_upto:full])
                keys.extend(st.request.block_hashes[st.saved_upto:full])
                meta.save_reqs.append(st.request.request_id)
                st.saved_upto = full
        if ids:
            meta.save_ids = ids
            meta.save_hashes = _keys(keys).tobytes()
        return meta

    def request_finished(self, request, block_ids):
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._release(st)
        return False, None

    # ================================================================ worker

    def register_kv_caches(self, kv_caches):
        o = self._opts
        tensors = {}
        nb = self._num_blocks
        # vLLM >= 0.33: [blocks, heads, tokens, K||V] views, one dense page per
        # block (no K/V dimension); older: [2, blocks, tokens, heads, dim]
        pages = all(t.dim() == 4 for t in kv_caches.values())
        kv_dim = None if pages else "auto"
        for name, t in kv_caches.items():
            if pages and nb and t.shape[0] != nb and t.shape[0] % nb == 0:
                t = t.unflatten(0, (nb, -1))  # kernel blocks grouped into vLLM's blocks
            tensors[name] = t
        kw = dict(world_size=1, instance_name="vllm-worker",
                  control_deadline_ms=o.control_deadline_ms, save_deadline_ms=o.save_deadline_ms,
                  load_deadline_ms=o.load_deadline_ms, copy_mode=o.copy_mode)
        if o.socket is not None:  # the sidecar client's: its breaker and its scheduler-path calls
            kw.update(lookup_deadline_ms=o.lookup_deadline_ms,
                      probe_interval_ms=o.probe_interval_ms)

        kvc = self._kv_cache_config
        specs = {}
        for g in getattr(kvc, "kv_cache_groups", None) or ():
            specs.update(_layer_specs(g))

        def make(tensors, namespace):
            ckw = _codec_options(o, tensors, specs, pages)
            if o.socket is None:
                dev = next(iter(tensors.values())).device
                host = _embedded_host(o, oi.DEVICE_CPU if dev.type == "cpu" else
                                      (dev.index or 0))
                return KVWorker(tensors, namespace, host=host, num_blocks=nb, kv_dim=kv_dim,
                                **kw, **ckw)
            buf = getattr(self, "_shared_buffer", None)
            return KVWorker(tensors, namespace, socket=o.socket, buffer=buf, num_blocks=nb,
                            kv_dim=kv_dim, **kw, **ckw)
        if self._groups:
            self._worker = self._group_workers(tensors, make)
            return
        self._worker = make(tensors, self._shard_namespace)
        logger.info("openinfer.vllm: registered %d layers (%d arenas, %d blocks of %d bytes) "
                    "in namespace %r (%s, codec %s)", len(kv_caches), self._worker.num_arenas,
                    self._worker.layout.num_blocks, self._worker.layout.block_bytes,
                    self._shard_namespace, "sidecar " + o.socket if o.socket else "embedded",
                    o.codec)

    def _group_workers(self, tensors, make):
        """Hybrid: a KVWorker per KV cache group over that group's layers, in
        the group's namespace of this rank's shard."""
        G = len(self._groups)
        workers = []
        for g in self._groups:
            mine = {n: tensors[n] for n in g.layers if n in tensors}
            if not mine:
                raise ValueError("openinfer.vllm: KV cache group %d (%s): none of its layers "
                                 "(%s) is among the KV caches vLLM registered"
                                 % (g.index, g.suffix, ", ".join(g.layers[:3])))
            ns = self._shards[self._shard * G + g.index]
            workers.append(make(mine, ns))
            logger.info("openinfer.vllm: KV cache group %d (%s): %d layers, blocks of %d bytes "
                        "in namespace %r", g.index, g.suffix, len(mine),
                        workers[-1].layout.block_bytes, ns)
        return _groups.GroupWorkers(workers, self._groups)

    def set_shared_buffer(self, buffer):
        """Sidecar on cpu: the SharedBuffer that holds vLLM's KV tensors (the
        server maps it). Call before register_kv_caches."""
        self._shared_buffer = buffer

    @property
    def worker(self):
        """The KVWorker (None before register_kv_caches)."""
        return self._worker

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        w = self._worker
        if w is not None and isinstance(connector_metadata, OpenInferConnectorMetadata) \
                and self._groups:
            w.begin_groups(connector_metadata.group_saves or [([], b"")] * len(self._groups))
            self._step_save_blocks, self._step_save_bytes = w.step_saves()
        elif w is not None and isinstance(connector_metadata, OpenInferConnectorMetadata):
            # the blocks each layer saves once it is written (save_kv_layer);
            # MLA at TP > 1: only TP rank 0 saves the stage's latent
            if self._saves:
                w.begin_step(connector_metadata.save_ids,
                             oi.BlockHashes(connector_metadata.save_hashes))
            else:
                w.begin_step([], oi.BlockHashes(b""))
            batch = getattr(w, "_save_batch", None)
            self._step_save_blocks = len(batch[0]) if batch else 0
            self._step_save_bytes = self._step_save_blocks * w.layout.block_bytes

    def _fail_load(self, req_id, block_ids, is_async, err, cause="load_failed"):
        """Reports a load failed to vLLM (its blocks through
        get_block_ids_with_load_errors, an async one also as received), only
        ever once no byte of it can land any more."""
        logger.warning("openinfer.vllm: load of %d blocks of %s failed (%s): vLLM recomputes "
                       "them", len(block_ids), req_id, err)
        self._counts["loads_failed"] += 1
        self._counts["blocks_failed"] += len(block_ids)
        f = self._interval["failures"]
        f[cause] = f.get(cause, 0) + 1
        if self._groups:  # block ids are per group: vLLM takes the request (async loads only)
            self._failed_recving.add(req_id)
        else:
            self._failed_blocks.update(block_ids)
        if is_async:  # reported as received, its blocks as failed: vLLM recomputes them
            self._finished_recving.add(req_id)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        w = self._worker
        for ld in meta.loads:
            self._counts["loads_submitted"] += 1
            if self._groups:
                G = len(self._groups)
                lease = ld.leases[self._shard * G:(self._shard + 1) * G] \
                    if len(ld.leases) == len(self._shards) and ld.group_block_ids else None
                target = ld.group_block_ids
            else:
                lease = ld.leases[self._shard] if len(ld.leases) == len(self._shards) else None
                target = ld.block_ids
            if w is None or not lease:
                self._counts["loads_refused"] += 1
                self._fail_load(ld.req_id, ld.block_ids, ld.is_async, "no lease",
                                "load_refused")
                continue
            try:
                t = w.load(lease, target)
            except oi.Error as e:  # refused at submit: nothing was started
                self._counts["loads_refused"] += 1
                self._fail_load(ld.req_id, ld.block_ids, ld.is_async, "load refused: %s" % e,
                                "load_refused")
                continue
            self._loads[ld.req_id] = _Loading(
                t, ld.block_ids, ld.is_async, time.monotonic(),
                nbytes=w.load_bytes(target) if self._groups else None)

    def _settled(self, req_id, ld, result):
        """A load became final (result True or its error): report it."""
        del self._loads[req_id]
        if result is True:
            self._counts["loads_completed"] += 1
            n = len(ld.block_ids)
            iv = self._interval
            iv["loaded_blocks"] += n
            iv["loaded_bytes"] += ld.nbytes if ld.nbytes is not None else \
                n * self._worker.layout.block_bytes
            iv["load_seconds"].append((ld.landed or time.monotonic()) - ld.started)
            if ld.is_async:
                self._finished_recving.add(req_id)
        else:
            self._fail_load(req_id, ld.block_ids, ld.is_async, "load: %s" % (result,),
                            "load_fenced" if isinstance(result, oi.DeadlineError)
                            else "load_failed")

    def _sync_limit(self, ld):
        """When a sync load's wait gives up: its deadline (plus the deadline
        thread's slack), counted from its submission."""
        return ld.started + self._worker.load_deadline_s + _DEADLINE_SLACK_S

    def _fence_sync(self, req_id, ld):
        """A sync load that did not land by its deadline. Its blocks are read
        by this very step's forward and, reported failed, recomputed by vLLM
        into the same block ids: while one of its copies may still land
        (fencing), no outcome may be reported and the step may not go on.
        Waits for the fence at most another load deadline (at least
        _FENCE_WAIT_MIN_S: the copies of a load given a short deadline end
        soon after it); the load is then
        reported failed (vLLM recomputes its blocks). A fence that does not
        come then (a server that hangs with our memory mapped) leaves no
        safe way on for this step: the step fails (RuntimeError) rather than
        let vLLM reuse blocks a late copy could overwrite. load_async avoids
        this (docs/vllm.md)."""
        w = self._worker
        t0 = time.monotonic()
        res = w.settle_load(ld.ticket, max(w.load_deadline_s, _FENCE_WAIT_MIN_S))
        if res is None:
            logger.error("openinfer.vllm: load of %d blocks of %s: still not fenced %.1f s "
                         "after its deadline (the tier does not answer); failing the step so "
                         "that vLLM cannot reuse blocks a late copy may overwrite",
                         len(ld.block_ids), req_id, time.monotonic() - t0)
            raise RuntimeError("openinfer.vllm: a sync load of %d blocks of %s may still land "
                               "after its deadline (the tier does not answer); its blocks "
                               "cannot be given back to vLLM safely" % (len(ld.block_ids),
                                                                       req_id))
        if res is not True:
            logger.warning("openinfer.vllm: load of %s missed its deadline; fenced after "
                           "%.3f s more", req_id, time.monotonic() - t0)
        self._settled(req_id, ld, res)

    def wait_for_layer_load(self, layer_name):
        w = self._worker
        if w is None:
            return
        for req_id, ld in list(self._loads.items()):
            if ld.is_async:
                continue
            try:
                w.wait_layer(ld.ticket, layer_name,
                             max(0.0, self._sync_limit(ld) - time.monotonic()))
                ld.landed = time.monotonic()
            except oi.TimeoutError:
                if ld.ticket.done():  # final after all: settle it
                    self._settled(req_id, ld, w.settle_load(ld.ticket, 0))
                else:  # past its deadline, maybe fencing
                    self._fence_sync(req_id, ld)
            except oi.Error:  # failed and final (a load error is final): report it
                res = w.settle_load(ld.ticket, 0)
                if res is None:
                    self._fence_sync(req_id, ld)
                else:
                    self._settled(req_id, ld, res)

    def _finish_sync_loads(self):
        w = self._worker
        for req_id, ld in list(self._loads.items()):
            if ld.is_async:
                continue
            res = w.settle_load(ld.ticket, max(0.0, self._sync_limit(ld) - time.monotonic()))
            if res is None:
                self._fence_sync(req_id, ld)
            else:
                self._settled(req_id, ld, res)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        # a codec namespace too: the library gathers the block's layers and
        # encodes it once its last layer landed
        w = self._worker
        if w is None or not self.has_connector_metadata():
            return
        try:
            w.save_layer(layer_name)
        except oi.Error as e:  # a save that cannot start is a later miss, never an error
            logger.warning("openinfer.vllm: saving layer %s failed: %s", layer_name, e)

    def _not_encoded_since(self, w):
        """Blocks of this worker's saves that the codec did not store since
        the last step (a frame past the namespace's slot; the library's
        oi_engine_stats.saves_not_encoded): 0 without a codec. Its save
        calls succeed, so only the engine's counter tells them apart. A
        block saved layer by layer is encoded once its last layer landed,
        before that layer's save call completes, so after wait_saves the
        counter holds every block of the step's saves that ended."""
        if getattr(w, "codec", "none") == "none":
            return 0
        try:
            n = w.stats()["saves_not_encoded"]
        except oi.Error:  # a sidecar that is not answering: counted when it is back
            return 0
        new, self._not_encoded_seen = n - self._not_encoded_seen, n
        return max(new, 0)

    def wait_for_save(self):
        w = self._worker
        if w is None:
            return
        # every sync load of the step is final before its blocks are read again
        self._finish_sync_loads()
        try:
            w.finish_step()
        except oi.Error as e:
            logger.warning("openinfer.vllm: save of the step's blocks could not start: %s", e)
        # at most the save deadline: a save still running then is dropped
        # (a later miss), its ticket closed once final
        before = w.counters()
        errors = w.wait_saves()
        after = w.counters()
        dropped = after["saves_dropped"] - before["saves_dropped"]
        failed = after["saves_failed"] - before["saves_failed"]
        not_encoded = self._not_encoded_since(w)
        self._counts["saves_dropped"] += dropped
        self._counts["saves_failed"] += failed
        self._counts["saves_not_encoded"] += not_encoded
        iv = self._interval
        for cause, n in (("save_dropped", dropped), ("save_failed", failed),
                         ("save_not_encoded", not_encoded)):
            if n:
                iv["failures"][cause] = iv["failures"].get(cause, 0) + n
        if not errors and self._step_save_blocks:
            # a block the codec did not store is no saved block (its save call succeeded)
            kept = max(self._step_save_blocks - not_encoded, 0)
            iv["saved_blocks"] += kept
            iv["saved_bytes"] += self._step_save_bytes * kept // self._step_save_blocks
        self._step_save_blocks = self._step_save_bytes = 0
        if errors:
            logger.warning("openinfer.vllm: save: %d of this step's save calls failed, %d "
                           "dropped unfinished after the %.0f ms save deadline (%s): the blocks "
                           "stay uncached", failed, dropped, w.save_deadline_s * 1000,
                           errors[0])

    def get_finished(self, finished_req_ids):
        w = self._worker
        for req_id, ld in list(self._loads.items()):
            if not ld.is_async:
                continue
            # never reported before it is final: a load past its deadline
            # may still land in its blocks (fencing); vLLM keeps them (the
            # request stays WAITING_FOR_REMOTE_KVS) until it is reported
            res = w.settle_load(ld.ticket, 0)
            if res is not None:
                self._settled(req_id, ld, res)
        recving, self._finished_recving = self._finished_recving, set()
        return None, (recving or None)

    def get_transfer_results(self, finished_req_ids):
        # a failed async load is reported as received and its blocks through
        # get_block_ids_with_load_errors (one KV cache group: block ids are
        # unique), so vLLM keeps the valid prefix and recomputes the rest
        # (several KV cache groups: block ids are per group, so a failed
        # load names its request in failed_recving instead)
        _, recving = self.get_finished(finished_req_ids)
        failed, self._failed_recving = self._failed_recving, set()
        return KVConnectorTransferResults(finished_sending=set(),
                                          finished_recving=set(recving or ()),
                                          failed_recving=failed)

    # ================================================================ metrics

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return OpenInferConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return OpenInferPromMetrics(vllm_config, metric_types, labelnames,
                                    per_engine_labelvalues)

    def get_kv_connector_stats(self):
        """The figures since the last call (vLLM calls it every step, on the
        workers and on the scheduler): the worker's saves and loads, the
        scheduler's lookups, hits, misses and its degraded state (only when
        it changed). None when there is nothing to report."""
        if self._role == KVConnectorRole.SCHEDULER:
            c, self._sched_counts = self._sched_counts, _new_sched_counts()
            data = _empty_payload()
            data["lookups"], data["hit_blocks"], data["miss_blocks"] = \
                c["lookups"], c["hit_blocks"], c["miss_blocks"]
            data["failures"] = {k: v for k, v in c["failures"].items() if v}
            if self._degraded != getattr(self, "_degraded_reported", None):
                data["degraded"] = int(self._degraded)
                self._degraded_reported = self._degraded
        else:
            data, self._interval = self._interval, _empty_payload()
        out = OpenInferConnectorStats(data=data)
        return None if out.is_empty() else out

    def stats(self):
        """Worker side: what this connector reported to vLLM -- loads
        submitted / refused at submit / completed / failed (refused and
        fenced late loads included; a fenced load is never completed),
        blocks reported failed, loads in flight (not reported yet) and of
        them the loads and blocks held fencing; saves dropped (unfinished at
        the save deadline) and failed -- with the KVWorker's own counts
        (``worker``). Asks nothing of the tier (never blocks on a hung
        server); the engine's own figures are ``worker.stats()``."""
        out = dict(self._counts)
        loading = list(self._loads.values())
        out["loads_in_flight"] = len(loading)
        fencing = [ld for ld in loading if ld.ticket.fencing]
        out["loads_fencing"] = len(fencing)
        out["blocks_fencing"] = sum(len(ld.block_ids) for ld in fencing)
        w = self._worker
        if w is not None:
            out["worker"] = w.counters()
        return out

    def get_block_ids_with_load_errors(self):
        out, self._failed_blocks = self._failed_blocks, set()
        return out

    def shutdown(self):
        if self._role == KVConnectorRole.WORKER:
            if self._worker is not None:
                # bounded: the loads have their deadline and one more for the
                # fence; one still not final (a hung server) keeps the engine
                # and the KV memory alive rather than freeing them under it
                self._loads = {}
                self._worker.close(timeout=self._worker.load_deadline_s)
                self._worker = None
        else:
            for st in self._reqs.values():
                self._release(st)
            self._reqs = {}
            for lk in self._lookups:
                if lk is not None:
                    lk.close()
            self._lookups = [None] * len(self._shards)
