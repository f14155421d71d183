"""Restore or recompute in the engine connectors (docs/planner.md, "The
connectors"): how many of a lookup's hit blocks a connector promises.

The connector knows the hit run (a prefix, the shortest common one over its
shard namespaces), where each block is, the bytes of one block (one rank's
shard) and the context before the run; the engine's prefill rate is
configured (a connector cannot time the engine's forward) and the tiers'
rates are the library's estimates (an embedded host's stats, a sidecar's
through oi_server_fetch_stats), taken again at most every
``plan_rates_refresh_ms``. The plan is ``oi_plan_restore`` with
``OI_PLAN_NO_SPLIT``: the engine computes what follows the loaded blocks,
never a head before them, so the answer is a prefix of whole blocks.

Importable without vLLM, SGLang or torch."""
import threading
import time

import openinfer as oi
from openinfer import _config

__all__ = ["PlanOptions", "Planner", "merge_where", "fetch_server_rates"]

_RATE_KEYS = ("link_bytes_per_s", "disk_bytes_per_s", "remote_bytes_per_s")
# the library's seeds (OI_RATE_DEFAULT_*): what a sidecar's plan uses until
# the server's estimates arrive
_DEFAULT_RATES = {"link_bytes_per_s": 16e9, "disk_bytes_per_s": 2e9, "remote_bytes_per_s": 1e9}
# a block read from a slower place costs more: the shards' run takes, per
# block, the slowest place any shard named
_SLOWNESS = {None: -1, "pool": 0, "unknown": 0, "disk": 1, "remote": 2}


class PlanOptions:
    """The PLAN_KEYS of a connector's options (openinfer._config)."""

    def __init__(self, enabled=True, ns_per_token=None, ns_per_token_ctx=0.0, rates=None,
                 refresh_ms=1000):
        self.enabled = enabled
        self.ns_per_token = (1e9 / _config.DEFAULT_PREFILL_TOKENS_PER_S
                             if ns_per_token is None else ns_per_token)
        self.ns_per_token_ctx = ns_per_token_ctx
        self.rates = dict(rates or {})  # configured rates: they replace the estimates
        self.refresh_ms = refresh_ms

    @classmethod
    def pop(cls, values, where):
        """Takes the plan's keys out of parsed options (a dict from
        _config.parse); ConfigError when both prefill rates are set."""
        v = {k.name: values.pop(k.name) for k in _config.PLAN_KEYS}
        tps, ns = v["prefill_tokens_per_s"], v["prefill_ns_per_token"]
        if tps is not None and ns is not None:
            raise _config.ConfigError(
                "%s: options 'prefill_tokens_per_s' (%r) and 'prefill_ns_per_token' (%r) are "
                "both set; allowed: one of them" % (where, tps, ns), "prefill_ns_per_token", ns)
        if tps is not None:
            ns = 1e9 / tps
        return cls(v["restore_plan"], ns, v["prefill_ns_per_token_ctx"],
                   {k: v[k] for k in _RATE_KEYS if v[k] is not None}, v["plan_rates_refresh_ms"])


def merge_where(lists, n):
    """Per block of the first n, the slowest place any shard's answer named
    (each list: QueryResult.where, or None: every block in the pool)."""
    out = ["pool"] * n
    for w in lists:
        if w is None:
            continue
        for i in range(min(n, len(w))):
            if _SLOWNESS.get(w[i], 0) > _SLOWNESS[out[i]]:
                out[i] = w[i]
    return out


def fetch_server_rates(socket_path, timeout_ms):
    """The read-rate estimates of the server at socket_path (its host's
    stats through oi_server_fetch_stats, one connection of its own)."""
    ffi, lib = oi.ffi, oi.lib
    out = ffi.new("oi_server_stats *")
    out.struct_size = ffi.sizeof("oi_server_stats")
    host = ffi.new("oi_host_stats *")
    host.struct_size = ffi.sizeof("oi_host_stats")
    sock = socket_path.encode() if socket_path is not None else ffi.NULL
    oi._check(lib.oi_server_fetch_stats(sock, timeout_ms, out, host, ffi.NULL, 0))
    return {k: float(getattr(host, k)) for k in _RATE_KEYS}


def _bps(x):
    """A rate as the library's field takes it (whole bytes per second, >= 1)."""
    return max(1, int(round(x)))


class Planner:
    """Plans a connector's restores. block_bytes: one block of one rank's
    shard (None: unknown, every hit is promised); num_layers and layerwise:
    the load runs layer by layer under the forward of the computed part
    (OI_PLAN_LAYERWISE); rates_fn: returns the tier's estimates (a dict with
    _RATE_KEYS); background: call rates_fn on a thread of its own (a
    sidecar's fetch is a round trip: the scheduler never waits for it)."""

    def __init__(self, opts, block_tokens, block_bytes, num_layers=0, layerwise=False,
                 rates_fn=None, background=False):
        self.opts = opts
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.num_layers = num_layers
        self.layerwise = layerwise and num_layers > 0
        self._rates_fn = rates_fn
        self._background = background
        self._rates = dict(_DEFAULT_RATES)
        self._rates_at = None  # time.monotonic() of the last refresh
        self._fetching = False
        self._lock = threading.Lock()
        self.last = None  # the last plan (a dict of plan_restore), for tests and logs
        self.counts = dict(plans=0, plans_all=0, plans_partial=0, plans_compute=0)

    @property
    def active(self):
        return self.opts.enabled and bool(self.block_bytes)

    def _refresh(self):
        try:
            got = self._rates_fn()
        except Exception:  # noqa: BLE001 -- the estimates stay as they were
            got = None
        with self._lock:
            if got:
                for k in _RATE_KEYS:
                    if got.get(k):
                        self._rates[k] = float(got[k])
            self._rates_at = time.monotonic()
            self._fetching = False

    def rates(self):
        """The rates the plan uses: the configured ones, else the last
        estimates (refreshed when older than plan_rates_refresh_ms)."""
        if self._rates_fn is not None:
            now = time.monotonic()
            stale = self._rates_at is None or \
                (now - self._rates_at) * 1000.0 >= self.opts.refresh_ms
            if stale and not self._fetching:
                if self._background:
                    self._fetching = True
                    threading.Thread(target=self._refresh, name="openinfer-plan-rates",
                                     daemon=True).start()
                else:
                    self._refresh()
        with self._lock:
            r = dict(self._rates)
        r.update(self.opts.rates)
        return r

    def blocks(self, start_tokens, prompt_tokens, hit, where=None):
        """How many of the `hit` blocks after start_tokens (a prompt of
        prompt_tokens) to promise: a prefix; every hit when planning is off
        or cannot be done."""
        if hit <= 0 or not self.active:
            return hit
        r = self.rates()
        p = oi.plan_restore(
            prompt_tokens=prompt_tokens, start_tokens=start_tokens, n_blocks=hit,
            block_tokens=self.block_tokens, block_bytes=self.block_bytes,
            link_bytes_per_s=_bps(r["link_bytes_per_s"]),
            disk_bytes_per_s=_bps(r["disk_bytes_per_s"]),
            remote_bytes_per_s=_bps(r["remote_bytes_per_s"]),
            prefill_ns_per_token=self.opts.ns_per_token,
            prefill_ns_per_token_ctx=self.opts.ns_per_token_ctx, where=where,
            num_layers=self.num_layers, layerwise=self.layerwise, split=False)
        self.last = p
        n = p["load_blocks"] if p["compute_head_blocks"] == 0 else 0
        self.counts["plans"] += 1
        key = "plans_all" if n == hit else "plans_compute" if n == 0 else "plans_partial"
        self.counts[key] += 1
        return n


def kv_block_bytes(kv_cache_config):
    """(bytes of one block over every layer of one rank, layers) from vLLM's
    KVCacheConfig; (None, 0) when it is not given."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or ()
    total, layers = 0, 0
    for g in groups:
        names = list(getattr(g, "layer_names", ()) or ())
        total += len(names) * int(g.kv_cache_spec.page_size_bytes)
        layers += len(names)
    return (total or None), layers


def vllm_planner(opts, vllm_config, kv_cache_config, host):
    """The vLLM scheduler connector's Planner: the block's bytes from the
    scheduler's KVCacheConfig, layerwise unless load_async (an async load
    ends before the request computes), the rates from the embedded host's
    stats or the sidecar's server (fetched on a thread of its own)."""
    block_bytes, layers = kv_block_bytes(kv_cache_config)
    if host is not None:
        rates_fn, background = host.stats, False
    else:
        sock, deadline = opts.socket, opts.lookup_deadline_ms
        rates_fn, background = (lambda: fetch_server_rates(sock, max(deadline, 1000))), True
    return Planner(opts.plan, vllm_config.cache_config.block_size, block_bytes, layers,
                   layerwise=not opts.load_async, rates_fn=rates_fn, background=background)
