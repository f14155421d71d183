"""Typed, checked options of the engine connectors (docs/vllm.md,
docs/sglang.md): one table of keys per connector, each key with its type,
its range, its default and its meaning, and one parser for both.

A value is checked when the connector is made: a bad one raises
``ConfigError`` (a ValueError) that names the key, the value and what is
allowed, so a typo or an out-of-range number fails at start-up and never
reaches the library (where cffi would refuse it with an OverflowError) or a
later request. ``None`` (JSON ``null``) stands for the key's default.

Importable without vLLM, SGLang or torch."""
import math
import re

__all__ = ["ConfigError", "Key", "parse", "parse_size", "parse_bool", "MS_MAX", "CODECS",
           "VLLM_KEYS", "SGLANG_KEYS", "SGLANG_OWN_KEYS", "NAMESPACE_MAX_BYTES", "PLAN_KEYS",
           "DEFAULT_PREFILL_TOKENS_PER_S"]

#: The longest deadline or interval in milliseconds: the library's fields are
#: uint32_t and UINT32_MAX means "forever" in some of them.
MS_MAX = (1 << 32) - 2
#: The library's bound on a namespace (oi_engine_options.namespace_id).
NAMESPACE_MAX_BYTES = 255
_U64_MAX = (1 << 64) - 1

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class ConfigError(ValueError):
    """A connector option that is unknown or has a value its key does not
    allow. ``key`` and ``value`` name it; the message says what is allowed."""

    def __init__(self, message, key=None, value=None):
        super().__init__(message)
        self.key = key
        self.value = value


class _Refused(Exception):
    """Raised by a kind's parser: the value is not allowed."""


class _Kind:
    """A value type: its parser (value -> parsed value, or _Refused) and a
    phrase that says what it allows."""

    def __init__(self, name, allowed, fn):
        self.name = name
        self.allowed = allowed
        self.fn = fn


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _int_of(v):
    """An int from an int or an integer string (decimal, an optional sign)."""
    if _is_int(v):
        return v
    if isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d+\s*", v):
        return int(v)
    raise _Refused()


def boolean():
    def fn(v):
        if isinstance(v, bool):
            return v
        if isinstance(v, str):
            s = v.strip().lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
        raise _Refused()
    return _Kind("bool", "true or false (a boolean, or one of the strings "
                 "true/false, 1/0, yes/no, on/off, any case)", fn)


def integer(lo, hi, unit=""):
    def fn(v):
        n = _int_of(v)
        if not lo <= n <= hi:
            raise _Refused()
        return n
    return _Kind("int", "an integer%s from %d to %d (an int or an integer string)"
                 % (unit, lo, hi), fn)


def ms(lo=1):
    """Milliseconds, lo .. MS_MAX."""
    k = integer(lo, MS_MAX, " of milliseconds")
    k.name = "int (ms)"
    return k


def number(lo, hi, lo_open=False, unit=""):
    def fn(v):
        if isinstance(v, bool):
            raise _Refused()
        if _is_int(v) or isinstance(v, float):
            x = float(v)
        elif isinstance(v, str):
            try:
                x = float(v.strip())
            except ValueError:
                raise _Refused() from None
        else:
            raise _Refused()
        if not math.isfinite(x) or x > hi or x < lo or (lo_open and x == lo):
            raise _Refused()
        return x
    return _Kind("float", "a number%s %s %g and at most %g" % (
        unit, "greater than" if lo_open else "of at least", lo, hi), fn)


_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)


def _size_of(v):
    if _is_int(v):
        n = v
    elif isinstance(v, str):
        m = _SIZE_RE.fullmatch(v)
        if m is None:
            raise _Refused()
        num, unit = m.group(1), m.group(2).upper()
        if "." in num:
            n = float(num) * _SUFFIX[unit]
            if n != int(n):
                raise _Refused()
            n = int(n)
        else:
            n = int(num) * _SUFFIX[unit]
    else:
        raise _Refused()
    if not 0 < n <= _U64_MAX:
        raise _Refused()
    return n


def size():
    return _Kind("size", "a size in bytes greater than 0: an int, or a string such as "
                 "\"512M\", \"4G\", \"1.5G\" (K, M, G, T: powers of 1024)", _size_of)


def choice(values):
    """One of a mapping's keys (strings, any case) -> its value."""
    def fn(v):
        if isinstance(v, str) and v.strip().lower() in values:
            return values[v.strip().lower()]
        raise _Refused()
    return _Kind("choice", "one of %s" % ", ".join(repr(k) for k in values), fn)


def text():
    def fn(v):
        if isinstance(v, str) and v and "\x00" not in v:
            return v
        raise _Refused()
    return _Kind("str", "a non-empty string", fn)


def namespace():
    def fn(v):
        if isinstance(v, str) and v and "\x00" not in v and \
                len(v.encode("utf-8", "surrogatepass")) <= NAMESPACE_MAX_BYTES:
            return v
        raise _Refused()
    return _Kind("str", "a non-empty string of at most %d bytes (UTF-8) without NUL"
                 % NAMESPACE_MAX_BYTES, fn)


def _show(v):
    """repr(v), shortened past 80 characters."""
    r = repr(v)
    if len(r) > 80:
        r = "%s...%s (%d characters)" % (r[:60], r[-10:], len(v) if hasattr(v, "__len__")
                                         else len(r))
    return r


class Key:
    """One option: its name, kind, default (None: unset, the library's or the
    connector's own choice) and meaning (docs)."""

    def __init__(self, name, kind, default, meaning):
        self.name = name
        self.kind = kind
        self.default = default
        self.meaning = meaning

    def parse(self, value, where):
        if value is None:
            return self.default
        try:
            return self.kind.fn(value)
        except _Refused:
            raise ConfigError("%s: option %r is %s; allowed: %s"
                              % (where, self.name, _show(value), self.kind.allowed),
                              self.name, value) from None


def parse(keys, config, where, ignore=(), unknown="error", warn=None):
    """The options of `config` (a mapping) by `keys` (a list of Key): a dict
    of every key's parsed value or its default. A key in `ignore` is skipped
    (another component's). An unknown key raises ConfigError, or with
    unknown="warn" is passed to warn(message) and ignored."""
    if config is None:
        config = {}
    if not hasattr(config, "items"):
        raise ConfigError("%s: the options must be a mapping of keys to values, not %r"
                          % (where, config), None, config)
    table = {k.name: k for k in keys}
    bad = sorted(str(k) for k in config if k not in table and k not in ignore)
    if bad:
        msg = "%s: unknown option%s %s (known: %s)" % (
            where, "s" if len(bad) > 1 else "", ", ".join(repr(k) for k in bad),
            ", ".join(sorted(table)))
        if unknown == "warn":
            if warn is not None:
                warn(msg)
        else:
            raise ConfigError(msg, bad[0], config[bad[0]] if bad[0] in config else None)
    return {name: k.parse(config.get(name), where) for name, k in table.items()}


def _one(kind, v, what):
    try:
        return kind.fn(v)
    except _Refused:
        raise ConfigError("openinfer: %s %s is not allowed; allowed: %s"
                          % (what, _show(v), kind.allowed), what, v) from None


def parse_size(v, what="size"):
    """Bytes from an int or a string such as "512M", "4G", "1.5G" (powers of
    1024); ConfigError when it is not a size greater than 0."""
    return _one(size(), v, what)


def parse_bool(v, what="value"):
    """A bool from a bool or one of the spellings true/false, 1/0, yes/no,
    on/off (any case); ConfigError otherwise."""
    return _one(boolean(), v, what)


# ----------------------------------------------------------------------------- the tables

COPY_MODES = {"auto": 0, "kernel": 1, "dma": 2, "staged": 3}
#: A namespace's codec (docs/codecs.md, "Codec namespaces").
CODECS = {"none": "none", "lossless": "lossless", "int8": "int8", "int8-hadamard": "int8-hadamard",
          "fp8": "fp8"}

LOOKUP_DEADLINE = Key(
    "lookup_deadline_ms", ms(), 50,
    "the deadline of scheduler-path calls (lookups, membership queries)")
PROBE_INTERVAL = Key(
    "probe_interval_ms", ms(), 100,
    "how often a degraded engine probes the tier's health (the circuit breaker's "
    "health probe interval)")

#: kv_connector_extra_config of openinfer.vllm (docs/vllm.md, "Options").
VLLM_KEYS = [
    Key("mode", choice({"embedded": "embedded", "sidecar": "sidecar"}), None,
        "`embedded`: the pool lives in vLLM's process; `sidecar`: an `openinfer serve` "
        "owns it (default: `sidecar` when `socket` is set, else `embedded`)"),
    Key("socket", text(), None,
        "the sidecar's socket (`openinfer serve --socket`); required for `sidecar`"),
    Key("namespace", namespace(), None,
        "the content domain; replaces the derived one (below)"),
    Key("pool_size", size(), 1 << 30,
        "embedded: the host pool; sidecar: the server's `--pool` decides"),
    Key("pin", boolean(), None,
        "embedded: `false` for a pageable pool (machines without a GPU); default: the "
        "library's (pinned)"),
    Key("lease_ttl_ms", ms(), None,
        "embedded: how long a lease pins the blocks the scheduler found before the worker "
        "loads them; default: the library's (600000)"),
    Key("load_async", boolean(), False,
        "`true`: loads run between steps; `false`: in the step, each layer waiting for its "
        "own bytes; `true` is required with hybrid KV cache groups"),
    Key("wait_pending_ms", ms(lo=0), None,
        "the scheduler's lookup waits up to this long for blocks whose save is in flight "
        "(`OI_QUERY_WAIT_PENDING`); unset: it does not wait"),
    Key("copy_mode", choice(COPY_MODES), None,
        "embedded: the engine's copy mode (docs/api.md); default: `auto`"),
    Key("codec", choice(CODECS), "none",
        "the namespace's codec (docs/codecs.md): `lossless` (byte-exact), `int8`, "
        "`int8-hadamard` or `fp8` (lossy, bf16 K/V only); saves and loads stay layer by layer"),
    Key("control_deadline_ms", ms(), None,
        "the engine's control deadline (docs/api.md); default: the library's (30000)"),
    Key("save_deadline_ms", ms(), None,
        "the engine's save deadline; default: the library's (120000)"),
    Key("load_deadline_ms", ms(), None,
        "the engine's load deadline; default: the library's (120000)"),
    Key("lookup_retry_s", number(0.0, 86400.0, unit=" of seconds"), 1.0,
        "sidecar: after the scheduler's lookup session failed, how long its lookups miss "
        "before it connects again"),
    LOOKUP_DEADLINE,
    PROBE_INTERVAL,
]

#: --hicache-storage-backend-extra-config keys of openinfer.sglang
#: (docs/sglang.md, "Options").
SGLANG_KEYS = [
    Key("mode", choice({"embedded": "embedded", "sidecar": "sidecar"}), "embedded",
        "`embedded`: a host tier in this process; `sidecar`: an `openinfer serve`"),
    Key("pool_bytes", size(), 1 << 30,
        "embedded: the host tier's size"),
    Key("socket", text(), None,
        "sidecar: the server's socket path; default: the server's default"),
    Key("namespace", namespace(), None,
        "replaces the derived namespace (below)"),
    Key("codec", choice(CODECS), "none",
        "the namespace's codec (docs/codecs.md): `lossless` (byte-exact), `int8`, "
        "`int8-hadamard` or `fp8` (lossy, bf16 MHA pools only)"),
    Key("staging_pages", integer(1, 1 << 20), 16,
        "pages of the staging buffer (copying calls; every call in sidecar mode)"),
    Key("timeout_s", number(0.0, MS_MAX / 1000.0, lo_open=True, unit=" of seconds"), 60.0,
        "how long a save or a load may take before the call reports failure"),
    Key("retry_s", number(0.0, 86400.0, unit=" of seconds"), 5.0,
        "sidecar: least time between two attempts to connect"),
    Key("control_deadline_ms", ms(), None,
        "sidecar: the engine's control deadline; default: the library's (30000)"),
    LOOKUP_DEADLINE,
    PROBE_INTERVAL,
]

#: The prefill rate a connector plans with when none is configured: a
#: mid-size model on a current GPU (docs/planner.md, "The connectors"). Slow
#: enough that the pool's hits load; set the engine's own rate.
DEFAULT_PREFILL_TOKENS_PER_S = 10000.0
_RATE = number(0.0, 1e15, lo_open=True, unit=" of bytes per second")

#: The restore plan's keys, in both connectors' tables (openinfer._plan).
PLAN_KEYS = [
    Key("restore_plan", boolean(), True,
        "`true`: promise the number of hit tokens the restore plan loads (the rest are "
        "computed); `false`: promise every hit (docs/planner.md)"),
    Key("prefill_tokens_per_s", number(0.0, 1e12, lo_open=True, unit=" of tokens per second"),
        None, "the engine's prefill rate for the plan; default %g (or `prefill_ns_per_token`)"
        % DEFAULT_PREFILL_TOKENS_PER_S),
    Key("prefill_ns_per_token", number(0.0, 1e12, lo_open=True, unit=" of nanoseconds"), None,
        "the prefill cost per token instead of `prefill_tokens_per_s` (not both)"),
    Key("prefill_ns_per_token_ctx", number(0.0, 1e9, unit=" of nanoseconds"), 0.0,
        "the prefill cost's growth per token of context (attention's share)"),
    Key("link_bytes_per_s", _RATE, None,
        "the plan's host-to-device rate; default: the tier's estimate"),
    Key("disk_bytes_per_s", _RATE, None,
        "the plan's disk read rate; default: the tier's estimate"),
    Key("remote_bytes_per_s", _RATE, None,
        "the plan's remote read rate; default: the tier's estimate"),
    Key("plan_rates_refresh_ms", ms(), 1000,
        "how often the plan takes the tier's rate estimates again"),
]
VLLM_KEYS += PLAN_KEYS

#: SGLang's own keys of the same extra_config (its storage factory and
#: controller read them; this backend ignores them).
SGLANG_OWN_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "allocator",
    "enable_metadata_cache", "metadata_ttl", "file_storage_path", "tp_lcm_size",
    "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys"})
