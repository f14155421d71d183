"""SGLang HiCache storage backend over libopeninfer (docs/sglang.md).

Loaded by SGLang's storage factory as its ``dynamic`` backend::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "openinfer",
        "module_path": "openinfer.sglang", "class_name": "OpenInferStorage",
        "interface_v1": 1}'

SGLang's HiCache host pool (its L2, a CPU tensor) is made of pages; each page
is one block of the library's host tier. ``register_mem_pool_host`` reads the
pool's layout and registers it:

* embedded (the default): an OffloadEngine of this process whose arenas are
  the host pool's own pages, so ``batch_set_v1`` / ``batch_get_v1`` copy
  between the pool and the host tier with no intermediate buffer, and a
  second engine of the same namespace over a small staging buffer serves the
  copying calls (get, set, batch_get, batch_set);
* sidecar (``"mode": "sidecar"``): an engine of an ``openinfer serve`` process
  with engine-owned memory, a staging SharedBuffer of ``staging_pages`` pages
  (a sealed memfd, which the server maps); pages are gathered from the pool
  into it before a save and scattered from it after a load. SGLang's pool is
  an anonymous mapping or a memfd created without MFD_ALLOW_SEALING, which
  the server refuses to map, hence the copy.

Page keys (SGLang's 64-hex-digit sha256 strings) map to block hashes with
``page_hashes``: a 64-hex-digit key is decoded to its 32 bytes and mapped
with ``block_keys``; any other key is mapped as ``b"\\x00" + sha256(utf8)``
(33 bytes, so it never equals a decoded key).

Failures during SGLang's calls (the pool full, the sidecar gone, a timeout)
are logged and reported as SGLang's API expects them: False, None or a miss,
never an exception. A layout this module cannot describe is refused when the
pool is registered, with a ValueError that names it.
"""

import hashlib
import json
import logging
import threading
import time

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

import openinfer as oi
from openinfer import _config
from openinfer._native import ffi, lib
from openinfer.kvworker import codec_shape_of, lossless_refusal, wait_final

logger = logging.getLogger(__name__)

__all__ = ["OpenInferStorage", "page_hashes", "describe_host_pool", "PoolGeometry"]

_HEX = frozenset("0123456789abcdefABCDEF")

#: extra_config keys this backend reads and their defaults (the types, ranges
#: and meanings: openinfer._config.SGLANG_KEYS; SGLang's own keys pass through).
OPTIONS = {k.name: k.default for k in _config.SGLANG_KEYS}


def page_hashes(keys):
    """The 16-byte block hashes of SGLang page keys, as one buffer of
    len(keys) * 16 bytes (hash i at [16 i, 16 i + 16)). Keys of 64 hex digits
    (SGLang's) are decoded and mapped in one oi_block_keys_from_bytes call,
    with no Python loop per key."""
    n = len(keys)
    if n == 0:
        return b""
    packed = None
    if set(map(len, keys)) == {64}:
        try:
            packed = bytes.fromhex("".join(keys))
        except ValueError:
            packed = None
        if packed is not None and len(packed) != 32 * n:  # fromhex skips whitespace
            packed = None
    if packed is not None:
        out = bytearray(16 * n)
        oi._check(lib.oi_block_keys_from_bytes(ffi.from_buffer(packed), 32, n,
                                               ffi.cast("oi_block_hash *", ffi.from_buffer(out))))
        return bytes(out)
    parts = []
    for k in keys:
        if len(k) == 64 and _HEX.issuperset(k):
            parts.append(oi.block_key(bytes.fromhex(k)))
        else:
            parts.append(oi.block_key(b"\x00" + hashlib.sha256(k.encode()).digest()))
    return b"".join(parts)


class PoolGeometry:
    """How a HiCache host pool's pages lie in its tensor.

    arenas: (name, byte offset of page 0, bytes of the page in this arena);
    page p of arena i is at offset_i + p * bytes_i of ``data`` (a flat uint8
    view of the pool). A page's bytes, arena after arena, are SGLang's flat
    data page (get_data_page(index, flat=True))."""

    def __init__(self, kind, layout, data, num_pages, page_size, arenas, ident, codec_view=None,
                 dtype="bfloat16"):
        self.kind = kind
        self.dtype = dtype  # the pool's element type, by name
        # MHA: (the pool viewed per page, roles) for kvworker.codec_shape_of
        self.codec_view = codec_view
        self.layout = layout
        self.data = data
        self.num_pages = num_pages
        self.page_size = page_size
        self.arenas = arenas
        self.page_bytes = sum(a[2] for a in arenas)
        self.ident = ident

    def views(self):
        """Per arena, a (num_pages, bytes) uint8 view of the pool."""
        return [self.data[off:off + self.num_pages * n].view(self.num_pages, n)
                for _, off, n in self.arenas]


def describe_host_pool(pool):
    """The PoolGeometry of an SGLang host KV pool (MHATokenToKVPoolHost or
    MLATokenToKVPoolHost, layouts layer_first, page_first, page_first_direct
    and page_head). Anything else raises ValueError naming what it is."""
    name = type(pool).__name__
    layout = getattr(pool, "layout", None)
    buf = getattr(pool, "kv_buffer", None)
    if not isinstance(buf, torch.Tensor):
        raise ValueError("openinfer: host pool %s has no single kv_buffer tensor "
                         "(hybrid or split pools are not supported)" % name)
    if buf.device.type != "cpu" or not buf.is_contiguous():
        raise ValueError("openinfer: host pool %s: kv_buffer must be a contiguous CPU tensor" % name)
    if getattr(pool, "dcp_size", 1) != 1:
        raise ValueError("openinfer: host pool %s: decode context parallelism is not supported" % name)
    ps = int(pool.page_size)
    size = int(pool.size)
    if size % ps:
        raise ValueError("openinfer: host pool %s: size %d is not a multiple of page_size %d"
                         % (name, size, ps))
    pages = size // ps
    L = int(pool.layer_num)
    isz = buf.element_size()
    if hasattr(pool, "kv_cache_dim") and not hasattr(pool, "head_num"):
        kind = "mla"
        if type(pool).get_data_page is not _mla_get_data_page() or \
                getattr(pool, "_layer_shard_enabled", False):
            raise ValueError("openinfer: host pool %s is a specialised or layer-sharded MLA "
                             "pool; only MLATokenToKVPoolHost is supported" % name)
        tok = int(pool.kv_cache_dim) * isz
        parts = ("kv",)
        ident = "mla-d%d" % int(pool.kv_cache_dim)
    elif hasattr(pool, "head_num") and hasattr(pool, "head_dim"):
        kind = "mha"
        if int(getattr(pool, "v_head_dim", pool.head_dim)) != int(pool.head_dim):
            raise ValueError("openinfer: host pool %s: K and V head sizes differ" % name)
        if type(pool).get_data_page is not _mha_get_data_page():
            raise ValueError("openinfer: host pool %s is a specialised MHA pool; "
                             "only MHATokenToKVPoolHost is supported" % name)
        tok = int(pool.head_num) * int(pool.head_dim) * isz
        parts = ("k", "v")
        ident = "mha-h%d-d%d" % (int(pool.head_num), int(pool.head_dim))
    else:
        raise ValueError("openinfer: host pool %s is not an MHA or MLA token pool" % name)
    arenas = []
    if layout in ("page_first", "page_first_direct", "page_head") and \
            not (kind == "mla" and layout == "page_head"):
        n = ps * L * tok
        for i, part in enumerate(parts):
            arenas.append((part, i * pages * n, n))
    elif layout == "layer_first":
        n = ps * tok
        for i, part in enumerate(parts):
            for layer in range(L):
                arenas.append(("%s%d" % (part, layer), (i * L + layer) * size * tok, n))
    else:
        raise ValueError("openinfer: host pool %s: layout %r is not supported (supported: "
                         "page_first, page_first_direct, page_head, layer_first)" % (name, layout))
    total = buf.numel() * isz
    if sum(n for _, _, n in arenas) * pages != total:
        raise ValueError("openinfer: host pool %s (%s): kv_buffer holds %d bytes, the layout "
                         "describes %d" % (name, layout, total, sum(n for _, _, n in arenas) * pages))
    codec_view = None
    if kind == "mha" and layout in _MHA_PAGE_VIEWS:
        H, D = int(pool.head_num), int(pool.head_dim)
        dims, roles = _MHA_PAGE_VIEWS[layout]
        sizes = {"P": pages, "p": ps, "L": L, "H": H, "D": D}
        codec_view = (buf.view(2, *[sizes[c] for c in dims]), roles)
    data = buf.view(-1).view(torch.uint8)
    dtype = str(buf.dtype).replace("torch.", "")
    ident = "%s-L%d-p%d-%s-%s" % (ident, L, ps, dtype, layout)
    return PoolGeometry(kind, layout, data, pages, ps, arenas, ident, codec_view, dtype)


#: An MHA pool's kv_buffer [2, ...] per layout, with its pages split out
#: (P pages, p tokens of a page, L layers, H heads, D head_dim), and the
#: roles of those dimensions for kvworker.codec_shape_of (s: K/V, a part;
#: b: the page; t: tokens; d: head_dim; g, h: layers and heads).
_MHA_PAGE_VIEWS = {
    "page_first": ("PpLHD", "sbtghd"),        # a page: [tokens][layers][heads][dim]
    "page_first_direct": ("PLpHD", "sbgthd"),  # [layers][tokens][heads][dim]
    "page_head": ("PHpLD", "sbhtgd"),         # [heads][tokens][layers][dim]
    "layer_first": ("LPpHD", "sgbthd"),       # an arena per (K/V, layer): [tokens][heads][dim]
}


def _mha_get_data_page():
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    return MHATokenToKVPoolHost.get_data_page


def _mla_get_data_page():
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    return MLATokenToKVPoolHost.get_data_page


def _page_ids(host_indices, page_size, n):
    """The page numbers of n pages given by their token indices."""
    t = host_indices[: n * page_size : page_size]
    if t.device.type != "cpu":
        t = t.cpu()
    return (t.to(torch.int64) // page_size).contiguous()


def _server_args():
    """SGLang's published server arguments, or None (not published: the
    backend was built outside a running server, as in the tests)."""
    try:
        from sglang.srt.runtime_context import get_server_args
        return get_server_args()
    except Exception:  # noqa: BLE001 -- any failure: nothing published
        return None


def _plain(v):
    """A server argument as JSON-able data (dtypes and enums by name)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v).replace("torch.", "")


class _Staging:
    """A buffer of `pages` pages laid out page after page (each page its
    arenas' bytes back to back: SGLang's flat data page) and the arenas that
    describe it."""

    def __init__(self, geom, pages, shared):
        self.pages = pages
        self.page_bytes = geom.page_bytes
        nbytes = pages * geom.page_bytes
        self.shared = oi.SharedBuffer(nbytes, "openinfer-sglang") if shared else None
        self.buffer = self.shared if shared else bytearray(nbytes)
        raw = self.shared.view if shared else self.buffer
        self.tensor = torch.frombuffer(raw, dtype=torch.uint8).view(pages, geom.page_bytes)
        self.arenas = []
        off = 0
        for name, _, n in geom.arenas:
            self.arenas.append(oi.Arena(name, pages, n, block_stride=geom.page_bytes, offset=off))
            off += n
        self.cols = []
        off = 0
        for _, _, n in geom.arenas:
            self.cols.append((off, off + n))
            off += n

    def close(self):
        self.tensor = None
        if self.shared is not None:
            self.shared.close()


class OpenInferStorage(HiCacheStorage):
    """HiCacheStorage over libopeninfer's host tier (see the module doc).

    ``OpenInferStorage(storage_config, kwargs)`` is how SGLang's factory
    builds a dynamic backend; options come from
    ``storage_config.extra_config`` (OPTIONS lists them with their defaults).
    The engines are made by ``register_mem_pool_host``."""

    def __init__(self, storage_config, kwargs=None):
        self.storage_config = storage_config
        extra = getattr(storage_config, "extra_config", None)
        # a bad or unknown key fails here, naming the key, the value and what
        # is allowed (openinfer._config.SGLANG_KEYS)
        self.options = _config.parse(_config.SGLANG_KEYS, extra,
                                     "openinfer.sglang: extra_config",
                                     ignore=_config.SGLANG_OWN_KEYS)
        self.mode = self.options["mode"]
        self.timeout = self.options["timeout_s"]
        self.staging_pages = self.options["staging_pages"]
        self._codec = {}
        self.geom = None
        self.namespace = None
        self.host = None
        self.engine = None      # embedded: over the host pool itself
        self.staged = None      # over the staging buffer (sidecar: the only engine)
        self.staging = None
        self._views = None
        self._lock = threading.Lock()     # the staging buffer and (re)connects
        self._next_connect = 0.0
        self.mem_pool_host = None
        self._counts_lock = threading.Lock()
        self._counts = dict(loads_submitted=0, loads_refused=0, loads_completed=0,
                            loads_failed=0, loads_fenced=0, pages_loaded=0, pages_failed=0,
                            saves_submitted=0, saves_completed=0, saves_failed=0,
                            saves_dropped=0)
        # SGLang's storage metrics (get_stats): pages and GB/s per batch
        # since its last call
        self._io = dict(prefetch_pgs=[], prefetch_bandwidth=[], backup_pgs=[],
                        backup_bandwidth=[])

    # ---------------------------------------------------------------- setup

    def _identity(self):
        """What determines the bytes of a page, as (name, value) pairs: the
        model path as SGLang gives it, what the server's arguments say of the
        model when SGLang has published them (revision, dtype, KV cache
        dtype, quantization, config overrides), the pool's geometry (MHA or
        MLA, heads, head size or latent width, layers, page size, dtype,
        layout) and the shard (TP, PP and CP rank and size)."""
        c = self.storage_config
        ident = [("model", getattr(c, "model_name", None))]
        args = _server_args()
        for k in ("revision", "dtype", "kv_cache_dtype", "quantization",
                  "json_model_override_args"):
            ident.append((k, None if args is None else _plain(getattr(args, k, None))))
        ident.append(("pool", self.geom.ident))
        ident.extend(self._shard())
        if self.options["codec"] != "none":
            ident.append(("codec", self.options["codec"]))
        return ident

    def _shard(self):
        """The shard's (name, value) pairs; an MLA model leaves out the TP
        rank (every rank holds the same KV)."""
        c = self.storage_config
        out = []
        if not getattr(c, "is_mla_model", False):
            out.append(("tp", "%d-%d" % (c.tp_rank, c.tp_size)))
        if getattr(c, "pp_size", 1) > 1:
            out.append(("pp", "%d-%d" % (c.pp_rank, c.pp_size)))
        if getattr(c, "attn_cp_size", 1) > 1:
            out.append(("cp", "%d-%d" % (c.attn_cp_rank, c.attn_cp_size)))
        return out

    def _derive_namespace(self):
        """sglang/BASE-DIGEST/POOL/tpRANK-SIZE[/ppRANK-SIZE][/cpRANK-SIZE][/CODEC]:
        BASE is the model path's last part (readable only), DIGEST the first
        16 hex digits of the sha256 of the whole identity (_identity), so two
        model paths that read alike (acme/llama-3-8b, acme-llama/3-8b) never
        share a namespace. The namespace option replaces sglang/BASE-DIGEST;
        the pool, shard and codec (when not none) parts are still appended.
        A result longer than
        255 bytes (a long namespace option) is replaced by sglang/ and the
        sha256 of it."""
        shard = ["%s%s" % kv for kv in self._shard()]
        if self.options["namespace"] is not None:
            head = self.options["namespace"]
        else:
            ident = self._identity()
            digest = hashlib.sha256(json.dumps(ident, separators=(",", ":"), default=str)
                                    .encode()).hexdigest()[:16]
            model = str(getattr(self.storage_config, "model_name", None) or "model")
            base = model.rstrip("/").rsplit("/", 1)[-1] or "model"
            base = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in base)[:64]
            head = "sglang/%s-%s" % (base, digest)
        codec = [] if self.options["codec"] == "none" else [self.options["codec"]]
        ns = "/".join([head, self.geom.ident] + shard + codec)
        if len(ns.encode()) > _config.NAMESPACE_MAX_BYTES:
            ns = "sglang/" + hashlib.sha256(ns.encode()).hexdigest()
        return ns

    def register_mem_pool_host(self, mem_pool_host):
        if self.geom is not None:
            self.close()          # registered again: drop the previous engines
        geom = describe_host_pool(mem_pool_host)
        c = self.storage_config
        if (self.mode == "embedded" and getattr(c, "is_mla_model", False)
                and getattr(c, "tp_size", 1) > 1):
            raise ValueError("openinfer: an MLA model with tp_size > 1 needs mode 'sidecar' "
                             "(only rank 0 writes; the other ranks read its pages through "
                             "the shared server)")
        self._codec = self._codec_options(geom)
        super().register_mem_pool_host(mem_pool_host)
        self.geom = geom
        self.namespace = self._derive_namespace()
        if self.mode == "embedded":
            self.host = oi.OffloadHost(self.options["pool_bytes"])
            self.engine = oi.OffloadEngine(
                self.host, self.namespace,
                [oi.Arena(n, self.geom.num_pages, b, offset=off) for n, off, b in self.geom.arenas],
                buffer=self.geom.data.numpy(), **self._codec)
            self.staging = _Staging(self.geom, self.staging_pages, shared=False)
            self.staged = oi.OffloadEngine(self.host, self.namespace, self.staging.arenas,
                                           buffer=self.staging.buffer, **self._codec)
        else:
            self.staging = _Staging(self.geom, self.staging_pages, shared=True)
            self._views = self.geom.views()
            with self._lock:
                self._connect(log_failure=True)
        logger.info("openinfer: %s storage, namespace %s (%s), %d pages of %d bytes (%s, "
                    "codec %s)", self.mode, self.namespace,
                    "the namespace option" if self.options["namespace"] is not None else
                    "derived from " + ", ".join("%s=%r" % kv for kv in self._identity()),
                    self.geom.num_pages, self.geom.page_bytes, self.geom.layout,
                    self.options["codec"])

    def _codec_options(self, geom):
        """The engines' codec options (docs/sglang.md, "Codecs"): {} for
        none; lossless: the codec; int8, fp8: also the page's shape, from
        the pool's layout (kvworker.codec_shape_of). A lossy codec for a pool
        it cannot take raises ValueError (ConfigError) naming the option."""
        codec = self.options["codec"]
        if codec == "none":
            return {}
        if codec == "lossless":
            why = lossless_refusal(geom.dtype)
            if why is not None:
                raise _config.ConfigError(
                    "openinfer.sglang: extra_config: option 'codec' is 'lossless' but %s; "
                    "allowed here: 'none'" % why, "codec", codec)
            return {"codec": codec}
        why = None
        if geom.codec_view is None:
            why = ("an MLA pool (one latent per token, no K/V heads), whose scales the lossy "
                   "codecs were not measured on" if geom.kind == "mla" else
                   "a pool of layout %r" % geom.layout)
        else:
            try:
                view, roles = geom.codec_view
                shape = codec_shape_of({"kv_buffer": view}, roles)
            except oi.Error as e:
                why = str(e)
        if why is not None:
            allowed = ("'none'" if lossless_refusal(geom.dtype) is not None else
                       "'none' or 'lossless' (byte-exact, any bfloat16 pool)")
            raise _config.ConfigError(
                "openinfer.sglang: extra_config: option 'codec' is %r but the host pool is %s; "
                "allowed here: %s" % (codec, why, allowed), "codec", codec)
        return {"codec": codec, "codec_shape": shape}

    def _connect(self, log_failure=False):
        """Sidecar: (re)connects; with self._lock held. Returns the engine or None."""
        if self.staged is not None:
            return self.staged
        now = time.monotonic()
        if now < self._next_connect:
            return None
        self._next_connect = now + self.options["retry_s"]
        kw = {}
        for k in ("control_deadline_ms", "lookup_deadline_ms", "probe_interval_ms"):
            if self.options[k] is not None:
                kw[k] = self.options[k]
        try:
            self.staged, _ = oi.OffloadEngine.connect(
                self.options["socket"], self.namespace, self.staging.arenas,
                buffer=self.staging.shared, **kw, **self._codec)
        except oi.Error as e:
            (logger.error if log_failure else logger.debug)(
                "openinfer: cannot connect to the sidecar at %s: %s (every lookup misses; "
                "retrying every %s s)", self.options["socket"] or "the default socket", e,
                self.options["retry_s"])
            return None
        return self.staged

    def _reset_sidecar(self):
        """After a timeout (with self._lock held): drop the engine and take a
        new staging buffer, since the server may still copy into the old one;
        the next call connects again."""
        engine, self.staged = self.staged, None
        if engine is not None:
            # its destroy flushes, which waits for a hung server up to the save
            # deadline: not on SGLang's thread
            threading.Thread(target=self._close_quietly, args=(engine,), daemon=True,
                             name="openinfer-sglang-close").start()
        self.staging = _Staging(self.geom, self.staging_pages, shared=True)
        self._next_connect = 0.0

    @staticmethod
    def _close_quietly(engine):
        try:
            engine.close()
        except oi.Error as e:
            logger.warning("openinfer: closing the sidecar engine: %s", e)

    def _staged_engine(self):
        if self.mode == "embedded":
            return self.staged
        return self._connect()

    def close(self):
        with self._lock:
            for attr in ("staged", "engine"):
                e = getattr(self, attr)
                setattr(self, attr, None)
                if e is not None:
                    try:
                        e.close()
                    except oi.Error as err:
                        logger.warning("openinfer: closing an engine: %s", err)
            if self.host is not None:
                self.host.close()
                self.host = None
            if self.staging is not None:
                try:
                    self.staging.close()
                except BufferError:  # a view still alive: the GC unmaps it
                    pass
                self.staging = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------------- helpers

    def _ready(self, what):
        if self.geom is None:
            logger.error("openinfer: %s before register_mem_pool_host", what)
            return False
        return True

    def _wait(self, ticket, what):
        """Waits for a ticket; False (logged) when it failed or timed out.

        Never returns while a load may still land in SGLang's host pages:
        embedded, a load writes the pool's pages themselves, and SGLang frees
        the pages of a failed get at once, so a load that missed its deadline
        (fencing) is waited for until no copy can land (its copies end: the
        fence of an embedded engine is bounded by the copy itself). Sidecar,
        a load writes the staging buffer only: on a timeout the engine and
        the staging buffer are dropped (a late copy lands in the old one,
        which nothing reads), so failing at once is safe."""
        load = what.startswith("load")
        try:
            ticket.wait(self.timeout)
            self._tally("loads_completed" if load else "saves_completed")
            return True
        except oi.TimeoutError:
            fencing = ticket.fencing
            if self.mode == "embedded" and load and not ticket.done():
                # the copy writes SGLang's pages: do not return before it ends
                logger.error("openinfer: %s: %s after %s s; waiting until its copies end "
                             "(they write SGLang's host pages)", what,
                             "past its deadline" if fencing else "not done", self.timeout)
                if fencing:
                    self._tally("loads_fenced")
                while not wait_final(ticket, 1.0):
                    if ticket.fencing and not fencing:
                        fencing = True
                        self._tally("loads_fenced")
            elif self.mode != "embedded":
                logger.error("openinfer: %s did not complete in %s s: dropping the sidecar "
                             "engine and its staging buffer", what, self.timeout)
                if load and fencing:
                    self._tally("loads_fenced")
                self._reset_sidecar()
            else:
                logger.error("openinfer: %s did not complete in %s s", what, self.timeout)
            self._tally("loads_failed" if load else
                        ("saves_failed" if ticket.done() else "saves_dropped"))
            return False
        except oi.Error as e:
            logger.warning("openinfer: %s failed: %s", what, e)
            if isinstance(e, oi.DeadlineError):
                self._tally("loads_fenced")
            self._tally("loads_failed" if load else "saves_failed")
            return False

    def _tally(self, key, n=1):
        with self._counts_lock:
            self._counts[key] += n

    def _present(self, engine, hashes):
        flags = engine.query_membership(hashes)
        return [b == 1 for b in flags]

    def _save(self, engine, ids, hashes, n, what):
        """Saves n blocks and answers, key by key, whether each is stored."""
        self._tally("saves_submitted")
        try:
            t = engine.save(ids, hashes)
        except oi.Error as e:
            logger.warning("openinfer: %s refused: %s", what, e)
            self._tally("saves_failed")
            return [False] * n
        if not self._wait(t, what):
            return [False] * n
        ok = self._present(engine, hashes)
        if not all(ok):
            logger.warning("openinfer: %s: %d of %d pages not stored (the pool is full of "
                           "pinned blocks, or the server is gone)", what, n - sum(ok), n)
        return ok

    def _load(self, engine, hashes, ids, n, what):
        """Queries the prefix of hashes and loads it into ids; the hits loaded."""
        q = engine.query(hashes)
        h = q.hit_blocks
        if h == 0:
            return 0
        self._tally("loads_submitted")
        try:
            t = engine.load(q.lease, ids[:h])
        except oi.Error as e:
            logger.warning("openinfer: %s refused: %s", what, e)
            self._tally("loads_refused")
            self._tally("loads_failed")
            return 0
        if self._wait(t, what):
            self._tally("pages_loaded", h)
            return h
        self._tally("pages_failed", h)
        return 0

    def _safe(self, what, fn, fail):
        try:
            return fn()
        except Exception as e:  # never raise into SGLang's storage threads
            logger.error("openinfer: %s failed: %s: %s", what, type(e).__name__, e)
            return fail

    # ---------------------------------------------------------------- zero copy

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        n = len(keys)
        if n == 0:
            return []
        if not self._ready("batch_set_v1"):
            return [False] * n
        t0 = time.perf_counter()
        out = self._safe("batch_set_v1", lambda: self._batch_set_v1(keys, host_indices),
                         [False] * n)
        self._note_io("backup", sum(1 for x in out if x), t0)
        return out

    def _batch_set_v1(self, keys, host_indices):
        n = len(keys)
        ids = _page_ids(host_indices, self.geom.page_size, n)
        hashes = page_hashes(keys)
        if self.mode == "embedded":
            return self._save(self.engine, ids.numpy(), hashes, n, "save")
        out = []
        with self._lock:
            for a in range(0, n, self.staging.pages):
                m = min(self.staging.pages, n - a)
                engine = self._connect()
                if engine is None:
                    return out + [False] * (n - a)
                chunk = ids[a:a + m]
                for (lo, hi), view in zip(self.staging.cols, self._views):
                    self.staging.tensor[:m, lo:hi].copy_(view[chunk])
                out += self._save(engine, list(range(m)), hashes[16 * a:16 * (a + m)], m, "save")
        return out

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        n = len(keys)
        if n == 0:
            return []
        if not self._ready("batch_get_v1"):
            return [False] * n
        t0 = time.perf_counter()
        h = self._safe("batch_get_v1", lambda: self._batch_get_v1(keys, host_indices), 0)
        self._note_io("prefetch", h, t0)
        return [True] * h + [False] * (n - h)

    def _note_io(self, kind, pages, t0):
        """One batch's pages and GB/s for SGLang's storage metrics."""
        dt = time.perf_counter() - t0
        if pages <= 0 or dt <= 0 or self.geom is None:
            return
        with self._counts_lock:
            self._io[kind + "_pgs"].append(pages)
            self._io[kind + "_bandwidth"].append(pages * self.geom.page_bytes / dt / 1e9)

    def get_stats(self):
        """SGLang's storage metrics (with --enable-storage-metrics its
        collector logs them as sglang:prefetched_tokens_total,
        sglang:backuped_tokens_total, sglang:prefetch_bandwidth and
        sglang:backup_bandwidth): the pages each batch moved and its GB/s
        since the last call; None where this SGLang has no StorageMetrics."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            return None
        with self._counts_lock:
            io, self._io = self._io, {k: [] for k in self._io}
        return StorageMetrics(**io)

    def _batch_get_v1(self, keys, host_indices):
        n = len(keys)
        ids = _page_ids(host_indices, self.geom.page_size, n)
        hashes = page_hashes(keys)
        if self.mode == "embedded":
            return self._load(self.engine, hashes, ids.numpy(), n, "load")
        done = 0
        with self._lock:
            while done < n:
                engine = self._connect()
                if engine is None:
                    break
                m = min(self.staging.pages, n - done)
                h = self._load(engine, hashes[16 * done:16 * (done + m)], list(range(m)), m,
                               "load")
                if h:
                    chunk = ids[done:done + h]
                    for (lo, hi), view in zip(self.staging.cols, self._views):
                        view[chunk] = self.staging.tensor[:h, lo:hi]
                done += h
                if h < m:
                    break
        return done

    # ---------------------------------------------------------------- lookups

    def exists(self, key):
        if not self._ready("exists"):
            return False
        return self._safe("exists", lambda: self._count([key]) == 1, False)

    def batch_exists(self, keys, extra_info=None):
        if not keys or not self._ready("batch_exists"):
            return 0
        return self._safe("batch_exists", lambda: self._count(keys), 0)

    def _count(self, keys):
        """The leading run of keys present (one membership query)."""
        if self.mode == "embedded":
            engine = self.engine
        else:  # the lock only to connect: a lookup does not wait for a save
            engine = self.staged or self._locked_engine()
        if engine is None:
            return 0
        flags = engine.query_membership(page_hashes(keys))
        i = flags.find(b"\x00")
        return len(keys) if i < 0 else i

    def _locked_engine(self):
        with self._lock:
            return self._connect()

    # ---------------------------------------------------------------- copying calls

    def _value_bytes(self, value):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().view(-1)
        return t.view(torch.uint8)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        if not keys:
            return True
        if not self._ready("batch_set") or values is None or len(values) != len(keys):
            return False
        return self._safe("batch_set", lambda: all(self._batch_set(keys, values)), False)

    def _batch_set(self, keys, values):
        n = len(keys)
        hashes = page_hashes(keys)
        out = []
        with self._lock:
            for a in range(0, n, self.staging.pages):
                m = min(self.staging.pages, n - a)
                engine = self._staged_engine()
                if engine is None:
                    return out + [False] * (n - a)
                for j in range(m):
                    b = self._value_bytes(values[a + j])
                    if b.numel() != self.staging.page_bytes:
                        logger.error("openinfer: set: a value of %d bytes, a page is %d",
                                     b.numel(), self.staging.page_bytes)
                        return out + [False] * (n - a)
                    self.staging.tensor[j].copy_(b)
                out += self._save(engine, list(range(m)), hashes[16 * a:16 * (a + m)], m, "save")
        return out

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        n = len(keys)
        if n == 0:
            return []
        if not self._ready("batch_get"):
            return [None] * n
        if target_locations is None:
            target_locations = [None] * n
        return self._safe("batch_get", lambda: self._batch_get(keys, target_locations),
                          [None] * n)

    def _batch_get(self, keys, targets):
        n = len(keys)
        hashes = page_hashes(keys)
        out = []
        with self._lock:
            while len(out) < n:
                a = len(out)
                engine = self._staged_engine()
                if engine is None:
                    break
                m = min(self.staging.pages, n - a)
                h = self._load(engine, hashes[16 * a:16 * (a + m)], list(range(m)), m, "load")
                for j in range(h):
                    out.append(self._deliver(self.staging.tensor[j], targets[a + j]))
                if h < m:
                    break
        return out + [None] * (n - len(out))

    def _deliver(self, page, target):
        """Copies a staged page into target (a tensor of page_bytes bytes) or
        a new flat tensor of the pool's dtype."""
        if target is None:
            dtype = self.mem_pool_host.dtype
            target = torch.empty(self.staging.page_bytes // torch.empty((), dtype=dtype)
                                 .element_size(), dtype=dtype)
        if target.numel() * target.element_size() != self.staging.page_bytes:
            logger.error("openinfer: get: a target of %d bytes, a page is %d",
                         target.numel() * target.element_size(), self.staging.page_bytes)
            return None
        if target.is_contiguous() and target.device.type == "cpu":
            target.view(-1).view(torch.uint8).copy_(page)
        else:
            target.copy_(page.clone().view(target.dtype).view(target.shape))
        return target

    def clear(self):
        """Embedded: drops every block of the host tier. Sidecar: nothing (the
        server's pool is shared; its blocks age out)."""
        if self.host is not None:
            self._safe("clear", self.host.evict_all, 0)

    def stats(self):
        """The engine's oi_engine_stats as a dict (None before registration
        or while the sidecar is unreachable)."""
        e = self.engine if self.mode == "embedded" else self.staged
        return e.stats() if e is not None else None

    def counters(self):
        """What this backend reported to SGLang: loads submitted / refused
        (at submit) / completed / failed (refused and fenced ones included)
        / fenced (missed their deadline while copies could still land;
        failed, never completed), pages loaded / failed; saves submitted /
        completed / failed / dropped (not done when the wait gave up)."""
        with self._counts_lock:
            return dict(self._counts)

