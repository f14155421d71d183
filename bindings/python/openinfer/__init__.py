"""Python binding of libopeninfer (cffi, out-of-line API mode).

Objects own their C handle and free it in ``close()`` (also called by ``with``
and, as a last resort, by the garbage collector). Teardown follows the
library's drop order: an engine closes its imported arena mapping before it
unregisters, and a host closes the engines still registered with it before it
frees its pool. Calling a method of a closed object raises ``ClosedError``.

Errors raise a subclass of ``openinfer.Error`` per ``oi_status`` carrying
``.status`` (the code), ``.status_name`` and ``.message`` (``oi_last_error()``).

Memory: on the cpu backend arenas are given as objects supporting the writable
buffer protocol (``bytearray``, ``mmap``, a writable ``memoryview``...), which
the engine keeps referenced for its whole life; on cuda as integer device
pointers (``tensor.data_ptr()``), which the caller keeps alive.

Hot-path calls take and return buffers, passed to C in place: tokens as a
buffer of uint32 (``hash_blocks_buffer``, which returns ``BlockHashes`` over
n*16 bytes), hashes as one buffer of n*16 bytes, block ids as a buffer of
int64, present flags written into a buffer (``query_membership``). The list
forms (``hash_blocks``, lists of ids and hashes) still work.
"""
import array
import asyncio
import fcntl
import mmap
import os
import threading
import weakref

from ._native import ffi, lib

__all__ = [
    "Error", "InvalidArgumentError", "NotFoundError", "OutOfMemoryError", "TimeoutError",
    "CudaError", "IOError", "ProtocolError", "StateError", "LeaseExpiredError", "ClosedError",
    "UnsupportedError", "PermissionError", "VersionError", "InternalError", "NoDeviceError",
    "BusyError", "UnknownError",
    "OffloadHost", "OffloadEngine", "Arena", "Ticket", "Lease", "QueryResult", "ImportedArena",
    "Server", "LookupClient", "SaveResult", "hash_blocks", "hash_blocks_buffer", "BlockHashes", "hash_blocks_ex", "block_key",
    "block_keys", "BLOCK_KEY_MAX", "version", "version_string", "device_count", "device_info",
    "set_log_level", "get_log_level", "set_log_handler", "status_name", "DEVICE_CPU",
    "FOREVER", "SharedBuffer", "CONNECTION_EMBEDDED", "CONNECTION_CONNECTED",
    "CONNECTION_DEGRADED",
]

DEVICE_CPU = lib.OI_DEVICE_CPU
BLOCK_KEY_MAX = lib.OI_BLOCK_KEY_MAX
FOREVER = None  # a timeout of None waits forever
# oi_engine_stats.connection (OffloadEngine.stats()["connection"])
CONNECTION_EMBEDDED = lib.OI_CONNECTION_EMBEDDED    # an embedded engine
CONNECTION_CONNECTED = lib.OI_CONNECTION_CONNECTED  # a sidecar engine with a live server
CONNECTION_DEGRADED = lib.OI_CONNECTION_DEGRADED    # engine-owned sidecar, server gone
_U32_MAX = 0xFFFFFFFF

# --------------------------------------------------------------------------- errors


class Error(Exception):
    """A libopeninfer call failed. ``status`` is the oi_status code,
    ``status_name`` its name and ``message`` the library's oi_last_error()."""

    status = None

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        self.status_name = status_name(self.status) if self.status is not None else "OI_ERR_UNKNOWN"
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message) if message else self.status_name)


def _err(name, code, doc):
    return type(name, (Error,), {"status": code, "__doc__": doc, "__module__": __name__})


InvalidArgumentError = _err("InvalidArgumentError", lib.OI_ERR_INVALID_ARGUMENT, "A NULL, a bad size, an id out of range; nothing changed.")
NotFoundError = _err("NotFoundError", lib.OI_ERR_NOT_FOUND, "The named object does not exist.")
OutOfMemoryError = _err("OutOfMemoryError", lib.OI_ERR_OUT_OF_MEMORY, "Host or device memory ran out.")
TimeoutError = _err("TimeoutError", lib.OI_ERR_TIMEOUT, "A wait ran out; the operation is still pending.")  # noqa: A001
CudaError = _err("CudaError", lib.OI_ERR_CUDA, "The CUDA runtime or driver failed.")
IOError = _err("IOError", lib.OI_ERR_IO, "A system call failed.")  # noqa: A001
ProtocolError = _err("ProtocolError", lib.OI_ERR_PROTOCOL, "A peer sent something inconsistent.")
StateError = _err("StateError", lib.OI_ERR_STATE, "The object is not in a state that allows the call.")
LeaseExpiredError = _err("LeaseExpiredError", lib.OI_ERR_LEASE_EXPIRED, "The lease was released, consumed or expired.")
ClosedError = _err("ClosedError", lib.OI_ERR_CLOSED, "The object was closed.")
UnsupportedError = _err("UnsupportedError", lib.OI_ERR_UNSUPPORTED, "Not available in this build or with these options.")
PermissionError = _err("PermissionError", lib.OI_ERR_PERMISSION, "The OS or the server refused access.")  # noqa: A001
VersionError = _err("VersionError", lib.OI_ERR_VERSION, "Peers speak incompatible versions.")
InternalError = _err("InternalError", lib.OI_ERR_INTERNAL, "A bug in libopeninfer.")
NoDeviceError = _err("NoDeviceError", lib.OI_ERR_NO_DEVICE, "The device ordinal does not exist.")
BusyError = _err("BusyError", lib.OI_ERR_BUSY, "The object is in use.")
DeadlineError = _err("DeadlineError", lib.OI_ERR_DEADLINE, "A load missed its deadline; no copy can still land in its destination.")
UnknownError = _err("UnknownError", None, "A status this binding does not know.")

_BY_STATUS = {c.status: c for c in (
    InvalidArgumentError, NotFoundError, OutOfMemoryError, TimeoutError, CudaError, IOError,
    ProtocolError, StateError, LeaseExpiredError, ClosedError, UnsupportedError,
    PermissionError, VersionError, InternalError, NoDeviceError, BusyError, DeadlineError)}


def status_name(st):
    """oi_status_str: "OI_ERR_TIMEOUT", "OI_ERR_UNKNOWN" for unknown codes."""
    return ffi.string(lib.oi_status_str(st)).decode()


def _error_for(st, message=None):
    if message is None:
        message = ffi.string(lib.oi_last_error()).decode(errors="replace")
    cls = _BY_STATUS.get(st)
    if cls is None:
        return UnknownError(message, status=st)
    return cls(message)


def _check(st):
    if st < 0:
        raise _error_for(st)
    return st


def _closed(what):
    return ClosedError("%s is closed" % what)


# --------------------------------------------------------------------------- misc


def version():
    """OI_VERSION_NUMBER of the loaded library: (major << 16) | (minor << 8) | patch."""
    return lib.oi_version()


def version_string():
    return ffi.string(lib.oi_version_string()).decode()


def device_count():
    n = ffi.new("int *")
    _check(lib.oi_device_count(n))
    return n[0]


def device_info(device=DEVICE_CPU):
    """A dict describing `device` (-1: the cpu backend)."""
    info = ffi.new("oi_device_info *")
    info.struct_size = ffi.sizeof("oi_device_info")
    _check(lib.oi_device_get_info(device, info))
    return {
        "device": info.device,
        "backend": "cuda" if info.backend == lib.OI_BACKEND_CUDA else "cpu",
        "name": ffi.string(info.name).decode(),
        "total_memory": info.total_memory,
        "numa_node": info.numa_node,
        "compute_capability": info.compute_capability,
        "can_map_host_memory": bool(info.can_map_host_memory),
        "multiprocessors": info.multiprocessors,
        "pci_bus_id": ffi.string(info.pci_bus_id).decode(),
    }


_LEVELS = {"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 4, "off": 5}


def set_log_level(level):
    """level: "trace".."off" or an oi_log_level int."""
    _check(lib.oi_set_log_level(_LEVELS[level] if isinstance(level, str) else level))


def get_log_level():
    return lib.oi_get_log_level()


_log_state = {"fn": None, "handle": None}


@ffi.def_extern()
def _oi_py_log(ctx, level, line):
    fn = _log_state["fn"]
    if fn is not None:
        try:
            fn(int(level), ffi.string(line).decode(errors="replace"))
        except Exception:  # a handler must never raise into C
            pass


def set_log_handler(fn):
    """Routes library log lines to fn(level, line) (from any thread); None
    restores the default (stderr)."""
    _log_state["fn"] = fn
    lib.oi_set_log_handler(lib._oi_py_log if fn is not None else ffi.NULL, ffi.NULL)


def _timeout_ms(timeout):
    if timeout is None:
        return _U32_MAX
    ms = int(timeout * 1000)
    return max(0, min(ms, _U32_MAX - 1))


# --------------------------------------------------------------------------- buffers
#
# The hot-path calls take and return buffers: hashes travel as one buffer of
# n*16 bytes, block ids as one buffer of int64, tokens as one buffer of uint32,
# present flags as one buffer of n bytes. cffi's from_buffer hands the C call
# a pointer into the caller's object (no copy, no per-block Python loop);
# lists and other iterables are still accepted and converted in C (array).

_RAW_FORMATS = ("B", "b", "c")  # a plain byte buffer: the items' little-endian bytes


def _memoryview(obj, what):
    """A memoryview of obj, or None when obj does not support the buffer protocol."""
    if isinstance(obj, (str, list, tuple, range)):
        return None
    try:
        mv = memoryview(obj)
    except TypeError:
        return None
    if not mv.c_contiguous:
        raise InvalidArgumentError("%s: the buffer is not C-contiguous" % what)
    return mv


def _typed_buffer(obj, ctype, itemsize, formats, what):
    """(cdata ctype[], n) pointing into obj, a contiguous buffer of items of
    `itemsize` bytes (format in `formats`) or a byte buffer of n*itemsize
    bytes; None when obj is not a buffer."""
    mv = _memoryview(obj, what)
    if mv is None:
        return None
    fmt = mv.format.lstrip("@=<")
    if mv.format[:1] in (">", "!") and mv.itemsize != 1:
        raise InvalidArgumentError("%s: big-endian buffers are not supported" % what)
    if not ((mv.itemsize == itemsize and fmt in formats) or
            (mv.itemsize == 1 and fmt in _RAW_FORMATS)):
        raise InvalidArgumentError(
            "%s: a buffer of format %r (%d-byte items); need %s (or raw bytes)"
            % (what, mv.format, mv.itemsize, ctype))
    if mv.nbytes % itemsize:
        raise InvalidArgumentError("%s: %d bytes is not a multiple of %d"
                                   % (what, mv.nbytes, itemsize))
    return ffi.from_buffer(ctype + "[]", obj), mv.nbytes // itemsize


_U32_FORMATS = ("I", "i", "L", "l")  # with 4-byte items


def _u32_in(tokens, what="tokens", raw_bytes=True):
    """(cdata uint32_t[], n, keep) for tokens: a buffer of 4-byte integers
    (array('I'), a numpy uint32/int32 array, a memoryview) used in place, a
    byte buffer read as little-endian uint32 (raw_bytes), or else any
    iterable of ints (converted by array('I'))."""
    mv = _memoryview(tokens, what)
    if mv is not None and (raw_bytes or (mv.itemsize == 4 and mv.format.lstrip("@=<")
                                         in _U32_FORMATS)):
        return _typed_buffer(tokens, "uint32_t", 4, _U32_FORMATS, what) + (tokens,)
    try:  # (iter: array() would take a bytes object's raw bytes)
        arr = array.array("I", iter(tokens))
    except (TypeError, OverflowError, ValueError) as e:
        raise InvalidArgumentError("%s: %s" % (what, e)) from None
    return ffi.from_buffer("uint32_t[]", arr), len(arr), arr


_INT_FORMATS = ("b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "n", "N")


def _ids_in(ids, what="block ids"):
    """(cdata int64_t[], n, keep) for block ids: a buffer of int64 (array('q'),
    numpy int64) or a byte buffer of n*8 bytes, used in place; a 1-D buffer
    of other integers, or any iterable of ints, is converted (a copy)."""
    mv = _memoryview(ids, what)
    if mv is not None:
        fmt = mv.format.lstrip("@=<")
        if (mv.itemsize == 8 and fmt in ("q", "l")) or (mv.itemsize == 1 and fmt in _RAW_FORMATS):
            return _typed_buffer(ids, "int64_t", 8, ("q", "l"), what) + (ids,)
        if fmt not in _INT_FORMATS or mv.format[:1] in (">", "!") or mv.ndim != 1:
            raise InvalidArgumentError("%s: a buffer of format %r and %d dimension(s); need "
                                       "int64 (or integers in one dimension)"
                                       % (what, mv.format, mv.ndim))
        ids = mv.tolist()
    try:
        arr = array.array("q", ids)
    except (TypeError, OverflowError, ValueError) as e:
        raise InvalidArgumentError("%s: %s" % (what, e)) from None
    return ffi.from_buffer("int64_t[]", arr), len(arr), arr


_U64_FORMATS = ("Q", "L")  # with 8-byte items


def _u64_in(values, what):
    """(cdata uint64_t[], n, keep) for a buffer of uint64 (array('Q'), a numpy
    uint64 array) or a byte buffer of n*8 bytes, used in place; any other
    iterable of non-negative ints is converted (array('Q'))."""
    mv = _memoryview(values, what)
    if mv is not None:
        fmt = mv.format.lstrip("@=<")
        if (mv.itemsize == 8 and fmt in _U64_FORMATS) or (mv.itemsize == 1 and fmt in _RAW_FORMATS):
            return _typed_buffer(values, "uint64_t", 8, _U64_FORMATS, what) + (values,)
        if fmt not in _INT_FORMATS or mv.format[:1] in (">", "!") or mv.ndim != 1:
            raise InvalidArgumentError("%s: a buffer of format %r and %d dimension(s); need "
                                       "uint64 (or integers in one dimension)"
                                       % (what, mv.format, mv.ndim))
        values = mv.tolist()
    try:
        arr = array.array("Q", values)
    except (TypeError, OverflowError, ValueError) as e:
        raise InvalidArgumentError("%s: %s" % (what, e)) from None
    return ffi.from_buffer("uint64_t[]", arr), len(arr), arr


class BlockHashes:
    """n 16-byte block hashes in one buffer of n*16 bytes, indexed lazily.

    ``len(h)`` is n; ``h[i]`` is the i-th hash as ``bytes`` (made when asked
    for); ``h[a:b]`` is a BlockHashes view of the same bytes; ``bytes(h)`` /
    ``h.tobytes()`` are the n*16 bytes and ``h.buffer`` a memoryview of them
    (zero copy). Every call that takes hashes accepts it as it is. Equal to
    another BlockHashes or bytes-like object with the same bytes, and to a
    list of the same 16-byte hashes."""

    __slots__ = ("_mv",)

    def __init__(self, data=b""):
        if isinstance(data, BlockHashes):
            mv = data._mv
        else:
            mv = _memoryview(data, "hashes")
            if mv is None:
                raise InvalidArgumentError("hashes: need a bytes-like object of n*16 bytes")
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
        if mv.nbytes % 16:
            raise InvalidArgumentError("hashes: %d bytes is not a multiple of 16" % mv.nbytes)
        self._mv = mv

    @property
    def buffer(self):
        """A read-only memoryview of the n*16 bytes."""
        return self._mv.toreadonly()

    def __len__(self):
        return self._mv.nbytes // 16

    def __getitem__(self, i):
        n = self._mv.nbytes // 16
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step == 1:
                return BlockHashes(self._mv[16 * start:16 * max(start, stop)])
            return BlockHashes(b"".join(self[j] for j in range(start, stop, step)))
        i = i.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("hash index out of range")
        return self._mv[16 * i:16 * i + 16].tobytes()

    def __iter__(self):
        raw = self._mv.tobytes()
        return (raw[i:i + 16] for i in range(0, len(raw), 16))

    def tobytes(self):
        return self._mv.tobytes()

    __bytes__ = tobytes

    def tolist(self):
        """The hashes as a list of 16-byte ``bytes``."""
        return list(self)

    def __eq__(self, other):
        if isinstance(other, BlockHashes):
            return self._mv == other._mv
        if isinstance(other, (list, tuple)):
            return self.tolist() == [bytes(h) for h in other]
        try:
            return self._mv == memoryview(other).cast("B")
        except TypeError:
            return NotImplemented

    __hash__ = None

    def __repr__(self):
        n = len(self)
        head = ", ".join(self[i].hex() for i in range(min(n, 2)))
        return "BlockHashes(%d: %s%s)" % (n, head, ", ..." if n > 2 else "")


def _hashes_in(hashes):
    """(cdata oi_block_hash[], n, keep) for hashes: a BlockHashes, one
    bytes-like object of n*16 bytes (exactly 16 bytes is one hash; numpy
    uint8 arrays of shape (n, 16) too), or a sequence of 16-byte objects."""
    if isinstance(hashes, BlockHashes):
        keep = hashes._mv
    else:
        mv = _memoryview(hashes, "hashes")
        if mv is not None:
            if mv.nbytes % 16:
                raise InvalidArgumentError("hashes: %d bytes is not a multiple of 16"
                                           % mv.nbytes)
            keep = mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")
        else:  # a sequence of 16-byte objects
            hashes = [bytes(h) for h in hashes]
            for i, h in enumerate(hashes):
                if len(h) != 16:
                    raise InvalidArgumentError("hash %d is %d bytes, not 16" % (i, len(h)))
            keep = b"".join(hashes)
    return ffi.from_buffer("oi_block_hash[]", keep), len(keep) // 16, keep


def _writable_out(out, nbytes, what):
    """(cdata char[], keep) for an output buffer of at least nbytes (a new
    bytearray when out is None)."""
    if out is None:
        out = bytearray(nbytes)
    mv = _memoryview(out, what)
    if mv is None or mv.readonly:
        raise InvalidArgumentError("%s: need a writable buffer" % what)
    if mv.nbytes < nbytes:
        raise InvalidArgumentError("%s: %d bytes, need %d" % (what, mv.nbytes, nbytes))
    return ffi.from_buffer("char[]", out, require_writable=True), out


def hash_blocks_buffer(tokens, block_size, salt=b"", parent=None, *, out=None):
    """Chained 16-byte hashes of the full blocks of `tokens`, as BlockHashes.

    tokens: any buffer of uint32 (``array('I')``, a numpy uint32 or int32
    array, a memoryview, or bytes read as little-endian uint32), used in place;
    an iterable of ints is converted first. out: optional writable buffer of
    at least n*16 bytes to write the hashes into (else a new bytearray); the
    result views it."""
    toks, n_tokens, _keep_tokens = _u32_in(tokens)
    cap = n_tokens // block_size if block_size > 0 else 0
    outp, out = _writable_out(out, 16 * cap, "out")
    n_out = ffi.new("size_t *")
    par = ffi.NULL
    if parent is not None:
        p = bytes(parent)
        if len(p) != 16:
            raise InvalidArgumentError("parent is %d bytes, not 16" % len(p))
        par = ffi.from_buffer("oi_block_hash[]", p)
    salt = bytes(salt)
    _check(lib.oi_hash_blocks(toks, n_tokens, block_size, salt if salt else ffi.NULL, len(salt),
                              par, ffi.cast("oi_block_hash *", outp), cap, n_out))
    mv = memoryview(out)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return BlockHashes(mv[:16 * n_out[0]])


def hash_blocks(tokens, block_size, salt=b"", parent=None):
    """Chained 16-byte hashes (a list of bytes) of the full blocks of `tokens`
    (an iterable of ints, or a buffer of uint32). The list-based form of
    hash_blocks_buffer."""
    toks, _, keep = _u32_in(tokens, raw_bytes=False)
    return hash_blocks_buffer(keep, block_size, salt, parent).tolist()


def hash_blocks_ex(tokens, block_size, salt=b"", parent=None, extra_keys=()):
    """As hash_blocks, where block i also covers extra_keys[i] (bytes-like;
    b"" or None: none; entries past the full blocks are ignored). With no
    extra keys it equals hash_blocks (see oi_hash_blocks_ex)."""
    tokens = list(tokens)
    toks = ffi.new("uint32_t[]", max(len(tokens), 1))
    for i, t in enumerate(tokens):
        toks[i] = t
    cap = len(tokens) // block_size if block_size > 0 else 0
    out = ffi.new("oi_block_hash[]", max(cap, 1))
    n_out = ffi.new("size_t *")
    args = ffi.new("oi_hash_blocks_args *")
    lib.oi_hash_blocks_args_init(args)
    args.block_size = block_size
    args.tokens = toks
    args.n_tokens = len(tokens)
    salt = bytes(salt)
    salt_buf = ffi.from_buffer(salt) if salt else ffi.NULL
    args.salt = salt_buf
    args.salt_len = len(salt)
    if parent is not None:
        par = ffi.new("oi_block_hash *")
        p = bytes(parent)
        if len(p) != 16:
            raise InvalidArgumentError("parent is %d bytes, not 16" % len(p))
        ffi.memmove(par.bytes, p, 16)
        args.parent = par
    keep = []  # the key buffers live until the call returns
    extra_keys = list(extra_keys)
    xs = ffi.new("oi_block_extra_key[]", max(len(extra_keys), 1))
    for i, k in enumerate(extra_keys):
        k = bytes(k) if k is not None else b""
        if k:
            buf = ffi.from_buffer(k)
            keep.append(buf)
            xs[i].bytes = buf
        xs[i].len = len(k)
    if extra_keys:
        args.extra_keys = xs
        args.n_extra_keys = len(extra_keys)
    _check(lib.oi_hash_blocks_ex(args, out, cap, n_out))
    return [bytes(ffi.buffer(out[i].bytes, 16)) for i in range(n_out[0])]


def block_key(key):
    """The 16-byte block hash (bytes) of an engine's own block key of 1..64
    bytes, e.g. a vLLM block hash (see oi_block_key_from_bytes)."""
    key = bytes(key)
    out = ffi.new("oi_block_hash *")
    _check(lib.oi_block_key_from_bytes(ffi.from_buffer(key) if key else ffi.NULL, len(key), out))
    return bytes(ffi.buffer(out.bytes, 16))


def block_keys(keys, key_len=None):
    """block_key of every key in one call: `keys` is a sequence of bytes-like
    keys of one length, or one bytes-like buffer of keys of `key_len` bytes
    packed back to back. Returns a list of 16-byte hashes."""
    if key_len is None:
        keys = [bytes(k) for k in keys]
        if not keys:
            return []
        key_len = len(keys[0])
        if any(len(k) != key_len for k in keys):
            raise InvalidArgumentError("block_keys: keys of different lengths")
        packed = b"".join(keys)
    else:
        packed = bytes(keys)
        if key_len <= 0 or len(packed) % key_len:
            raise InvalidArgumentError("block_keys: %d bytes are not keys of %d bytes"
                                       % (len(packed), key_len))
    n = len(packed) // key_len
    out = ffi.new("oi_block_hash[]", max(n, 1))
    _check(lib.oi_block_keys_from_bytes(ffi.from_buffer(packed) if packed else ffi.NULL,
                                        key_len, n, out))
    return [bytes(ffi.buffer(out[i].bytes, 16)) for i in range(n)]


# --------------------------------------------------------------------------- tickets

_callbacks = {}
_callbacks_lock = threading.Lock()


@ffi.def_extern()
def _oi_py_ticket_cb(ctx, t, st):
    with _callbacks_lock:
        entry = _callbacks.pop(ctx, None)
    if entry is None:
        return
    ticket, fn = entry[0](), entry[1]
    try:
        fn(ticket, int(st))
    except Exception:  # never raise into a library thread
        pass


@ffi.def_extern()
def _oi_py_save_done(ctx, st):
    with _callbacks_lock:
        entry = _callbacks.pop(ctx, None)
    if entry is None:
        return
    try:
        entry[1](int(st))
    except Exception:
        pass


class _Handle:
    """Owns one C object (a ticket or a handle); subclasses implement close()."""

    _what = "object"

    def __init__(self):
        self._ptr = None
        self._lock = threading.RLock()

    def _p(self):
        p = self._ptr
        if p is None:
            raise _closed(self._what)
        return p

    @property
    def closed(self):
        return self._ptr is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Ticket(_Handle):
    """Completion of an asynchronous save, load or flush.

    ``wait(timeout)`` returns on success and raises the operation's error (or
    ``TimeoutError``, which leaves the ticket pending); ``poll()`` returns
    False while pending and True on success; ``fd`` is an eventfd that turns
    readable on completion (selectors, asyncio); ``await ticket`` works in
    asyncio. ``close()`` drops this reference; it never cancels the I/O."""

    _what = "ticket"
    save_result = None  # a save with counts=True: its SaveResult

    def __init__(self, ptr):
        super().__init__()
        self._ptr = ptr

    def poll(self):
        """False while not final (pending, or fencing), True on success;
        raises the operation's error."""
        st = lib.oi_ticket_poll(self._p())
        if st > 0:
            return False
        _check(st)
        return True

    def wait(self, timeout=None):
        """Waits up to `timeout` seconds (None: forever). Raises
        ``TimeoutError`` (the ticket stays pending) when the wait runs out,
        and at once when a load missed its deadline while its copies may
        still land (``fencing``); ``DeadlineError`` once such a load is
        final."""
        _check(lib.oi_ticket_wait(self._p(), _timeout_ms(timeout)))

    def status(self):
        """The raw status: OI_PENDING (1) or OI_FENCING (2) while not final,
        then OI_OK (0) or a negative error."""
        return lib.oi_ticket_poll(self._p())

    def done(self):
        """True once final: for a load, no byte can land in its destination
        any more."""
        return self.status() <= 0

    @property
    def fencing(self):
        """True while a load that missed its deadline may still have copies
        landing in its destination blocks (OI_FENCING): they are not the
        caller's until ``done()``; the load has failed either way."""
        return self.status() == lib.OI_FENCING

    def fileno(self):
        fd = lib.oi_ticket_fd(self._p())
        if fd < 0:
            raise _error_for(lib.OI_ERR_IO)
        return fd

    @property
    def fd(self):
        """The eventfd (owned by the ticket: do not close it)."""
        return self.fileno()

    @property
    def cuda_event(self):
        """The cudaEvent_t as an int (0 on the cpu backend)."""
        return int(ffi.cast("uintptr_t", lib.oi_ticket_cuda_event(self._p())))

    def arena_event(self, arena):
        """A load with arena_events: the cudaEvent_t recorded after arena
        `arena`'s copies, as an int (0: none -- cpu backend, remote engine,
        not layered, or out of range)."""
        return int(ffi.cast("uintptr_t", lib.oi_ticket_arena_event(self._p(), arena)))

    def arena_wait(self, arena, timeout=None):
        """Waits up to `timeout` seconds (None: forever) until arena `arena`
        (its index in the layout) of a load landed (oi_ticket_arena_wait).

        A load with ``arena_events=True`` (embedded engines, cpu or cuda, and
        sidecar engines, whose server reports each arena as it lands) reports
        its arenas one by one, in the layout's order: this returns as
        soon as that arena's bytes are in place. Raises the load's error when
        it failed at this arena or an earlier one (or failed at all: bytes of
        a failed load must not be used), ``TimeoutError`` when the wait ran
        out (the ticket stays usable), ``InvalidArgumentError`` for an arena
        past the layout's count. Any other ticket (a save, a load without
        arena_events, a sidecar load from a server without load progress)
        waits for the whole ticket, whatever `arena`."""
        if arena < 0:
            raise InvalidArgumentError("arena %d is negative" % arena)
        with self._lock:
            p = self._p()
        _check(lib.oi_ticket_arena_wait(p, arena, _timeout_ms(timeout)))

    def arena_poll(self, arena):
        """arena_wait without blocking (oi_ticket_arena_poll): False while
        arena `arena` is still moving, True once it landed; raises the
        load's error as arena_wait does."""
        if arena < 0:
            raise InvalidArgumentError("arena %d is negative" % arena)
        st = lib.oi_ticket_arena_poll(self._p(), arena)
        if st > 0:  # pending, or fencing
            return False
        _check(st)
        return True

    def set_callback(self, fn):
        """fn(ticket, status) is called once on completion, on a library thread
        (or right here when already complete)."""
        key = ffi.new_handle(self)
        with _callbacks_lock:
            _callbacks[key] = (weakref.ref(self), fn, key)
        st = lib.oi_ticket_set_callback(self._p(), lib._oi_py_ticket_cb, key)
        if st < 0:
            with _callbacks_lock:
                _callbacks.pop(key, None)
            raise _error_for(st)

    async def wait_async(self):
        """Waits in asyncio through the ticket's fd."""
        loop = asyncio.get_running_loop()
        fd = self.fileno()
        if not self.done():
            fut = loop.create_future()

            def ready():
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(fd, ready)
            try:
                await fut
            finally:
                loop.remove_reader(fd)
        self.wait(0)

    def __await__(self):
        return self.wait_async().__await__()

    def close(self):
        with self._lock:
            p, self._ptr = self._ptr, None
        if p is not None:
            lib.oi_ticket_release(p)


# --------------------------------------------------------------------------- host


def _stats_dict(cdata, fields):
    return {f: getattr(cdata, f) for f in fields}


_HOST_STATS = [
    "size_classes", "capacity_bytes", "used_bytes", "free_bytes", "block_bytes_resident",
    "blocks_free", "blocks_in_flight", "blocks_sealed", "blocks_leased", "blocks_loading",
    "saves_submitted", "saves_completed", "saves_deduplicated", "saves_dropped", "saves_failed",
    "bytes_saved", "bytes_loaded", "loads_completed", "loads_failed", "query_hit_blocks",
    "query_miss_blocks", "leases_active", "leases_expired", "leases_released", "evictions",
    "link_bytes_per_s", "disk_bytes_per_s", "remote_bytes_per_s", "link_samples", "disk_samples",
    "remote_samples"]
_DISK_STATS = [
    "blocks", "bytes_used", "capacity_bytes", "spills", "spills_failed", "spills_skipped",
    "spill_overflow", "promotions", "promote_failed", "checksum_failures", "evictions",
    "torn_records_cut", "replay_ns", "read_latency_sum_us", "lost_queue_full", "lost_unwritten",
    "lost_write_failed", "lost_no_room", "disk_full", "full_events", "spills_refused_full"]

_ENGINE_STATS = [
    "instance_id", "block_bytes", "num_blocks", "saves_submitted", "saves_completed",
    "saves_deduplicated", "saves_dropped", "saves_failed", "loads_completed", "loads_failed",
    "blocks_loaded", "bytes_saved", "bytes_loaded", "query_hit_blocks", "query_miss_blocks",
    "saves_pending", "loads_submitted", "namespace_blocks_resident", "latency_buckets",
    "save_latency_sum_us", "load_latency_sum_us", "server_epoch", "connection", "reconnects",
    "disconnected_saves", "disconnected_query_misses", "saves_not_encoded"]


def _host_options(pool_bytes, device, hugepages, pin, lease_ttl_ms, index_shards, chunk_bytes,
                  high_watermark, low_watermark, numa_node):
    o = ffi.new("oi_host_options *")
    _check(lib.oi_host_options_init(o))
    o.pool_bytes = pool_bytes
    o.device = device
    o.flags = (lib.OI_HOST_HUGEPAGES if hugepages else 0) | (0 if pin else lib.OI_HOST_NO_PIN)
    if lease_ttl_ms is not None:
        o.lease_ttl_ms = lease_ttl_ms
    if index_shards is not None:
        o.index_shards = index_shards
    if chunk_bytes is not None:
        o.chunk_bytes = chunk_bytes
    if high_watermark is not None:
        o.high_watermark = high_watermark
    if low_watermark is not None:
        o.low_watermark = low_watermark
    if numa_node is not None:
        o.numa_node = numa_node
    return o


class OffloadHost(_Handle):
    """The host tier: a pool of (pinned) host memory shared by the engines of
    this process. ``close()`` closes the engines still registered first."""

    _what = "host"

    def __init__(self, pool_bytes, device=DEVICE_CPU, *, hugepages=False, pin=None,
                 lease_ttl_ms=None, index_shards=None, chunk_bytes=None, high_watermark=None,
                 low_watermark=None, numa_node=None, link_bytes_per_s=None,
                 disk_bytes_per_s=None, remote_bytes_per_s=None):
        """link/disk/remote_bytes_per_s: the seeds of the read-rate estimates
        (None: the library's defaults; stats() reports the estimates)."""
        super().__init__()
        if pin is None:
            pin = device != DEVICE_CPU
        o = _host_options(pool_bytes, device, hugepages, pin, lease_ttl_ms, index_shards,
                          chunk_bytes, high_watermark, low_watermark, numa_node)
        for field, v in (("link_bytes_per_s", link_bytes_per_s),
                         ("disk_bytes_per_s", disk_bytes_per_s),
                         ("remote_bytes_per_s", remote_bytes_per_s)):
            if v is not None:
                setattr(o, field, v)
        out = ffi.new("oi_host **")
        _check(lib.oi_host_create(o, out))
        self._ptr = out[0]
        self._engines = weakref.WeakSet()

    def engine(self, namespace, arenas, **kw):
        """Shorthand for OffloadEngine(self, namespace, arenas, **kw)."""
        return OffloadEngine(self, namespace, arenas, **kw)

    def stats(self):
        s = ffi.new("oi_host_stats *")
        s.struct_size = ffi.sizeof("oi_host_stats")
        with self._lock:
            _check(lib.oi_host_get_stats(self._p(), s))
        return _stats_dict(s, _HOST_STATS)

    def attach_disk(self, dirs, capacity_bytes, *, queue_depth=None):
        """Attaches a disk tier under the pool (oi_host_attach_disk):
        `dirs` a directory or a list of them (each owned by this user, not
        writable by others; one preallocated file per directory),
        `capacity_bytes` in all. Sealed blocks are written behind; a query
        past the pool's prefix promotes what the disk holds (pending, then
        hits: query with wait_pending). An earlier run's blocks are hits
        again. docs/disk.md."""
        if isinstance(dirs, (str, bytes, os.PathLike)):
            dirs = [dirs]
        keep = [ffi.new("char[]", os.fsencode(d)) for d in dirs]
        arr = ffi.new("const char *[]", keep)
        o = ffi.new("oi_host_disk_options *")
        _check(lib.oi_host_disk_options_init(o))
        o.dirs = arr
        o.num_dirs = len(keep)
        o.capacity_bytes = capacity_bytes
        if queue_depth is not None:
            o.queue_depth = queue_depth
        with self._lock:
            _check(lib.oi_host_attach_disk(self._p(), o))

    def disk_stats(self):
        """The disk tier's counters (oi_host_disk_stats) as a dict;
        NotFoundError without a disk tier."""
        s = ffi.new("oi_host_disk_stats *")
        s.struct_size = ffi.sizeof("oi_host_disk_stats")
        with self._lock:
            _check(lib.oi_host_get_disk_stats(self._p(), s))
        out = _stats_dict(s, _DISK_STATS)
        out["read_latency_us"] = list(s.read_latency_us)
        return out

    def evict_all(self):
        n = ffi.new("uint64_t *")
        with self._lock:
            _check(lib.oi_host_evict_all(self._p(), n))
        return n[0]

    def query(self, namespace, hashes, req_id=None, *, world_size=1, membership=False,
              wait_pending=None):
        """A lookup without a layout (oi_host_query): queries
        namespace `namespace` as OffloadEngine.query does, with no engine. A
        namespace no engine has registered yet holds nothing (every block
        misses). The lease belongs to no engine: any engine of the namespace
        may load it (`world_size` loads) or release it, and ``lease.release()``
        drops it through this host; it lives until consumed, released or
        expired."""
        o, keep = _lookup_options(namespace, world_size, None, None)
        with self._lock:
            p = self._p()
            res, present = _do_query(
                _HostLookup(self, namespace),
                lambda rid, hs, n, flags, r: lib.oi_host_query(p, o, rid, hs, n, flags, r),
                hashes, req_id, membership, None, wait_pending)
        del keep
        return _membership_result(res, present) if membership else res

    def query_membership(self, namespace, hashes, out=None):
        """OffloadEngine.query_membership without an engine: the n present
        flags of `hashes` in `namespace`, written into `out` (or a new
        bytearray)."""
        o, keep = _lookup_options(namespace, 1, None, None)
        with self._lock:
            p = self._p()
            out = _do_query(
                None,
                lambda rid, hs, n, flags, r: lib.oi_host_query(p, o, rid, hs, n, flags, r),
                hashes, None, True, out, None)[1]
        del keep
        return out

    def release(self, namespace, lease):
        """Drops a lease (a Lease or its 16 raw bytes) of namespace `namespace`
        (oi_host_release)."""
        raw = lease.raw if isinstance(lease, Lease) else bytes(lease)
        if isinstance(lease, Lease):
            lease._done = True
        self._release_ns(namespace, raw)

    def _release_ns(self, namespace, raw):
        if len(raw) != 16:
            raise InvalidArgumentError("a lease is 16 bytes")
        cl = ffi.new("oi_lease *")
        ffi.memmove(cl.bytes, raw, 16)
        with self._lock:
            _check(lib.oi_host_release(self._p(), namespace.encode(), cl[0]))

    def close(self):
        with self._lock:
            if self._ptr is None:
                return
            for e in list(self._engines):
                e.close()
            p, self._ptr = self._ptr, None
        lib.oi_host_destroy(p)


def _lookup_options(namespace, world_size, control_deadline_ms, client_name,
                    lookup_deadline_ms=None, probe_interval_ms=None):
    """(oi_lookup_options *, keep) for a lookup."""
    if not isinstance(namespace, str) or not namespace:
        raise InvalidArgumentError("namespace: need a non-empty str")
    o = ffi.new("oi_lookup_options *")
    _check(lib.oi_lookup_options_init(o))
    ns = ffi.new("char[]", namespace.encode())
    keep = [ns]
    o.namespace_id = ns
    o.world_size = world_size
    if control_deadline_ms is not None:
        o.control_deadline_ms = control_deadline_ms
    if lookup_deadline_ms is not None:
        o.lookup_deadline_ms = lookup_deadline_ms
    if probe_interval_ms is not None:
        o.probe_interval_ms = probe_interval_ms
    if client_name is not None:
        cn = ffi.new("char[]", client_name.encode())
        keep.append(cn)
        o.client_name = cn
    return o, keep


class _HostLookup:
    """The owner of a lease taken by OffloadHost.query: releases it through
    the host."""

    def __init__(self, host, namespace):
        self._host = host
        self._namespace = namespace

    @property
    def closed(self):
        return self._host.closed

    def _release(self, raw):
        self._host._release_ns(self._namespace, raw)


class LookupClient(_Handle):
    """A sidecar session that only looks up (oi_lookup_*): it
    registers no layout and maps no arena, so a scheduler process that holds
    no KV memory can ask. ``LookupClient(socket_path, namespace)`` connects
    (socket_path None: the default socket); ``query`` and
    ``query_membership`` work as OffloadEngine's; its leases may be loaded or
    released by any engine of the namespace connected with the same user id.
    ``close()`` (or the end of a ``with``) closes the session, and the server
    drops the leases it created. A dead server is not fatal: calls raise
    ClosedError. A query waits at most ``lookup_deadline_ms`` (default 50);
    one that gets no reply in time raises TimeoutError and marks the server
    unresponsive: later queries miss at once (no hits) until it answers a
    probe, sent every ``probe_interval_ms`` (default 100)."""

    _what = "lookup client"

    def __init__(self, socket_path, namespace, *, world_size=1, control_deadline_ms=None,
                 client_name=None, lookup_deadline_ms=None, probe_interval_ms=None):
        super().__init__()
        self.namespace = namespace
        o, keep = _lookup_options(namespace, world_size, control_deadline_ms, client_name,
                                  lookup_deadline_ms, probe_interval_ms)
        out = ffi.new("oi_lookup **")
        sock = str(socket_path).encode() if socket_path else ffi.NULL
        _check(lib.oi_lookup_connect(sock, o, out))
        del keep
        self._ptr = out[0]

    def _query_call(self):
        p = self._p()
        return lambda rid, hs, n, flags, r: lib.oi_lookup_query(p, rid, hs, n, flags, r)

    def query(self, hashes, req_id=None, *, membership=False, wait_pending=None):
        """As OffloadEngine.query (the server waits up to wait_pending seconds
        for blocks in flight; the client waits for its answer up to
        control_deadline_ms plus that)."""
        with self._lock:
            res, present = _do_query(self, self._query_call(), hashes, req_id, membership, None,
                                     wait_pending)
        return _membership_result(res, present) if membership else res

    def query_membership(self, hashes, out=None):
        """As OffloadEngine.query_membership."""
        with self._lock:
            return _do_query(self, self._query_call(), hashes, None, True, out, None)[1]

    def release(self, lease):
        """Drops a lease (a Lease or its 16 raw bytes) of this namespace."""
        if isinstance(lease, Lease):
            lease._done = True
            lease = lease.raw
        self._release(bytes(lease))

    def _release(self, raw):
        if len(raw) != 16:
            raise InvalidArgumentError("a lease is 16 bytes")
        cl = ffi.new("oi_lease *")
        ffi.memmove(cl.bytes, raw, 16)
        with self._lock:
            _check(lib.oi_lookup_release(self._p(), cl[0]))

    def close(self):
        with self._lock:
            p, self._ptr = self._ptr, None
        if p is not None:
            lib.oi_lookup_destroy(p)


# --------------------------------------------------------------------------- engine


class Arena:
    """One arena of a layout. Block b, segment s lives at
    base + b*block_stride + s*segment_stride (bytes_per_block bytes).

    base: None (the arena lies at `offset` in the engine's `buffer`), an object
    supporting the writable buffer protocol (cpu), or an int address (cuda
    device pointer, e.g. tensor.data_ptr())."""

    def __init__(self, name, num_blocks, bytes_per_block, *, block_stride=None, segments=1,
                 segment_stride=None, offset=0, base=None):
        self.name = name
        self.num_blocks = num_blocks
        self.bytes_per_block = bytes_per_block
        self.segments = segments
        self.segment_stride = bytes_per_block if segment_stride is None else segment_stride
        if block_stride is None:
            block_stride = (segments - 1) * self.segment_stride + bytes_per_block
        self.block_stride = block_stride
        self.offset = offset
        self.base = base

    @property
    def nbytes(self):
        """Bytes the arena spans."""
        return (self.num_blocks - 1) * self.block_stride + (self.segments - 1) * \
            self.segment_stride + self.bytes_per_block if self.num_blocks else 0

    def __repr__(self):
        return "Arena(%r, num_blocks=%d, bytes_per_block=%d)" % (
            self.name, self.num_blocks, self.bytes_per_block)


def _address(obj, keep, writable=True):
    """An address for `obj`: an int (device pointer) or a buffer object."""
    if obj is None:
        return ffi.NULL
    if isinstance(obj, int):
        return ffi.cast("void *", obj)
    buf = ffi.from_buffer(obj, require_writable=writable)
    keep.append(obj)
    keep.append(buf)
    return ffi.cast("void *", buf)


_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)


class SharedBuffer:
    """nbytes of shared memory for an engine-owned sidecar arena (cpu): a
    memfd (memfd_create with MFD_CLOEXEC | MFD_ALLOW_SEALING), sized with
    ftruncate, sealed with F_SEAL_SHRINK and mapped MAP_SHARED from offset 0
    -- what oi_engine_options.arena_fd asks for.

    ``OffloadEngine.connect(sock, ns, arenas, buffer=sb)`` sends ``sb.fd`` to
    the server and keeps ``sb`` alive while the engine lives. ``fd`` and
    ``nbytes`` describe it; ``view`` is a writable memoryview of the whole
    mapping (``numpy.frombuffer(sb.view, dtype)`` works; ``sb.view[a:b] =
    data`` writes); ``len(sb)`` is nbytes. ``close()`` (also the end of a
    ``with``) unmaps and closes the fd; it raises BufferError while a view
    or an engine still uses the mapping (close the engine first)."""

    def __init__(self, nbytes, name="openinfer-arena"):
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise InvalidArgumentError("SharedBuffer: nbytes must be positive, not %d" % nbytes)
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_SHRINK)
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._mm = mm
        self.nbytes = nbytes

    def _map(self):
        if self._mm is None:
            raise _closed("shared buffer")
        return self._mm

    @property
    def fd(self):
        """The memfd (owned by this object: do not close it)."""
        if self._fd is None:
            raise _closed("shared buffer")
        return self._fd

    @property
    def view(self):
        """A writable memoryview of the nbytes (a new one each time)."""
        return memoryview(self._map())

    def __buffer__(self, flags):  # Python >= 3.12: memoryview(sb), numpy.frombuffer(sb)
        return memoryview(self._map())

    def __len__(self):
        return self.nbytes

    @property
    def closed(self):
        return self._mm is None

    def close(self):
        if self._mm is not None:
            self._mm.close()  # BufferError while exported (a view, an engine)
            self._mm = None
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # a view outlives us: it keeps the mapping; the fd goes
            fd, self._fd = getattr(self, "_fd", None), None
            if fd is not None:
                os.close(fd)

    def __repr__(self):
        return "SharedBuffer(%d bytes, fd=%r)" % (self.nbytes, self._fd)


class QueryResult:
    """hit_blocks: the leading run found; lease: a Lease pinning them (None
    when nothing hit or for membership queries); loading: a deeper tier is
    bringing more; present: per-position booleans (membership queries);
    pending_blocks: the blocks right after the hit prefix whose save is still
    in flight, not leased (membership: the positions in flight)."""

    def __init__(self, hit_blocks, lease, loading, present=None, pending_blocks=0, where=None):
        self.hit_blocks = hit_blocks
        self.lease = lease
        self.loading = loading
        self.present = present
        self.pending_blocks = pending_blocks
        self._where = where

    @property
    def where(self):
        """Where each queried block was found: "pool", "disk", "remote",
        "unknown" (a sidecar's pending blocks) or None (not found). Named on
        first use from the library's codes: a membership query of thousands
        of hashes pays no Python step per hash unless it asks."""
        if isinstance(self._where, (bytes, bytearray)):
            self._where = [_WHERE_NAMES.get(c) for c in self._where]
        return self._where

    def __repr__(self):
        return "QueryResult(hit_blocks=%d, pending_blocks=%d, lease=%r)" % (
            self.hit_blocks, self.pending_blocks, self.lease)


class Lease:
    """A pin on the blocks a query reported; ``release()`` drops it through
    the object that queried (also at the end of a ``with``, unless a load
    consumed it). Any engine of the lease's namespace may load it
    (``engine.load(lease, ...)``) or release it (``engine.release(lease)``),
    not only the one that queried; ``raw`` is its 16 bytes, which may be
    handed to another process of the same namespace."""

    def __init__(self, owner, raw, n):
        self._engine = owner  # an OffloadEngine, LookupClient or _HostLookup
        self.raw = raw
        self.blocks = n
        self._done = False

    def release(self):
        self._done = True
        self._engine._release(self.raw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._done and not self._engine.closed:
            try:
                self.release()
            except LeaseExpiredError:
                pass

    def __repr__(self):
        return "Lease(%s, blocks=%d)" % (self.raw.hex(), self.blocks)


_U64_MAX = 0xFFFFFFFFFFFFFFFF


class SaveResult:
    """What one save call did with its n blocks (oi_save_result): accepted
    (being copied; the ticket reports their end), deduplicated (the namespace
    already held them, sealed or in flight) and dropped (no memory: the pool
    is full of pinned blocks); accepted + deduplicated + dropped == n. A
    dropped block never fails the ticket. In sidecar mode, when the server's
    counts could not come (it refused the save, which the ticket reports, or
    they did not arrive within control_deadline_ms), ``known`` is False and
    the three counts are None."""

    __slots__ = ("accepted", "deduplicated", "dropped")

    def __init__(self, accepted, deduplicated, dropped):
        self.accepted = accepted
        self.deduplicated = deduplicated
        self.dropped = dropped

    @classmethod
    def _from_c(cls, r):
        vals = [None if v == _U64_MAX else int(v) for v in (r.accepted, r.deduplicated, r.dropped)]
        return cls(*vals)

    @property
    def known(self):
        return self.accepted is not None

    def __eq__(self, other):
        if isinstance(other, SaveResult):
            other = (other.accepted, other.deduplicated, other.dropped)
        if isinstance(other, tuple):
            return (self.accepted, self.deduplicated, self.dropped) == other
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return "SaveResult(accepted=%r, deduplicated=%r, dropped=%r)" % (
            self.accepted, self.deduplicated, self.dropped)


def _wait_ms(wait_pending):
    """(flags, wait_ms) for a query's wait_pending (seconds; None: no wait)."""
    if wait_pending is None:
        return 0, 0
    if wait_pending < 0:
        raise InvalidArgumentError("wait_pending: %r seconds is negative" % (wait_pending,))
    return lib.OI_QUERY_WAIT_PENDING, max(0, min(int(wait_pending * 1000), _U32_MAX))


def _do_query(owner, call, hashes, req_id, membership, out, wait_pending):
    """One oi_*_query through call(rid, hashes, n, flags, result) (the
    owner's lock held by the caller); returns a QueryResult whose lease
    belongs to `owner`, plus the present buffer for membership."""
    flags, wait_ms = _wait_ms(wait_pending)
    r = ffi.new("oi_query_result *")
    r.struct_size = ffi.sizeof("oi_query_result")
    r.wait_ms = wait_ms
    rid = req_id.encode() if req_id is not None else ffi.NULL
    hs, n, _keep = _hashes_in(hashes)
    where = ffi.new("uint8_t[]", max(n, 1))
    r.where = where
    outp = None
    try:
        if membership:
            outp, out = _writable_out(out, n, "out")
            r.present = ffi.cast("uint8_t *", outp)
            flags |= lib.OI_QUERY_MEMBERSHIP
        st = call(rid, hs, n, flags, r)
    finally:
        # Let go of the buffers now: an exception's traceback would otherwise
        # keep these exports alive into a garbage cycle with their memoryviews.
        ffi.release(hs)
        if outp is not None:
            ffi.release(outp)
    _check(st)
    loading = r.state == lib.OI_QUERY_LOADING
    places = bytes(ffi.buffer(where, n))  # named by QueryResult.where when read
    if membership:
        return QueryResult(r.hit_blocks, None, loading, None, r.pending_blocks, places), out
    raw = bytes(ffi.buffer(r.lease.bytes, 16))
    lease = Lease(owner, raw, r.hit_blocks) if any(raw) else None
    return QueryResult(r.hit_blocks, lease, loading, None, r.pending_blocks, places), None


_WHERE_NAMES = {1: "pool", 2: "disk", 3: "remote", 4: "unknown"}
_WHERE_CODES = {None: 0, "none": 0, "pool": 1, "disk": 2, "remote": 3, "unknown": 4}


def plan_restore(*, prompt_tokens, n_blocks, block_tokens, block_bytes, link_bytes_per_s,
                 prefill_ns_per_token, prefill_ns_per_token_ctx=0.0, where=None,
                 start_tokens=0, disk_bytes_per_s=0, remote_bytes_per_s=0, num_layers=0,
                 layerwise=False, split=True, staged=False, load_overhead_ns=0):
    """Restore or recompute (oi_plan_restore, docs/planner.md): how many of
    the n_blocks held blocks after start_tokens to compute first
    (compute_head_blocks), to load next (load_blocks), and the model's
    estimates (est_ns, est_cold_ns, est_load_all_ns), as a dict. where: a
    list of "pool"/"disk"/"remote"/"unknown"/None per block (None: every
    block in the pool); the rates are bytes per second (an OffloadHost's
    stats() has the library's estimates)."""
    a = ffi.new("oi_restore_plan_args *")
    _check(lib.oi_restore_plan_args_init(a))
    keep = None
    if where is not None:
        try:
            codes = [_WHERE_CODES[w] for w in where]
        except KeyError as e:
            raise InvalidArgumentError("plan_restore: where holds %r (no such place)" % (e.args[0],))
        if len(codes) != n_blocks:
            raise InvalidArgumentError("plan_restore: where has %d entries for %d blocks"
                                       % (len(codes), n_blocks))
        keep = ffi.new("uint8_t[]", codes or [0])
        a.where = keep
    a.flags = ((lib.OI_PLAN_LAYERWISE if layerwise else 0) | (0 if split else lib.OI_PLAN_NO_SPLIT)
               | (lib.OI_PLAN_STAGED if staged else 0))
    a.prompt_tokens = prompt_tokens
    a.start_tokens = start_tokens
    a.n_blocks = n_blocks
    a.block_tokens = block_tokens
    a.block_bytes = block_bytes
    a.num_layers = num_layers
    a.link_bytes_per_s = link_bytes_per_s
    a.disk_bytes_per_s = disk_bytes_per_s
    a.remote_bytes_per_s = remote_bytes_per_s
    a.prefill_ns_per_token = prefill_ns_per_token
    a.prefill_ns_per_token_ctx = prefill_ns_per_token_ctx
    a.load_overhead_ns = load_overhead_ns
    p = ffi.new("oi_restore_plan *")
    p.struct_size = ffi.sizeof("oi_restore_plan")
    _check(lib.oi_plan_restore(a, p))
    return _stats_dict(p, ["compute_head_blocks", "load_blocks", "load_tokens", "compute_tokens",
                           "est_ns", "est_cold_ns", "est_load_all_ns"])


def _membership_result(res, present):
    res.present = list(map(bool, present))
    return res


class OffloadEngine(_Handle):
    """One rank's offload engine.

    Embedded: ``OffloadEngine(host, namespace, arenas, buffer=..., device=-1)``.
    Sidecar: ``engine, arena = OffloadEngine.connect(socket, namespace, arenas)``
    (server-allocated memory) or ``engine, None = OffloadEngine.connect(socket,
    namespace, arenas, buffer=SharedBuffer(n))`` (engine-owned memory).

    segment_offsets (optional): where each arena's segments start
    (oi_engine_options.segment_offsets), a buffer of uint64 (array('Q'), a
    numpy uint64 array) or an iterable of ints: arena by arena in the
    layout's order, ``arenas[i].segments`` entries each; block b, segment s
    of arena i then lives at (arena i's base or offset) + its segment's entry
    + b * block_stride, so one segment may be a separate region (vLLM's
    ``[2, num_blocks, ...]`` layer: the K half, then the V half) and
    segment_stride is ignored. The wrong number of entries raises
    InvalidArgumentError (the C call's). None: segment s at s *
    segment_stride.

    ``close()`` follows the drop order: a sidecar engine closes its imported
    arena mapping first, then flushes and unregisters."""

    _what = "engine"

    def __init__(self, host, namespace, arenas, *, buffer=None, buffer_size=None,
                 device=DEVICE_CPU, instance_name=None, world_size=1, save_deadline_ms=None,
                 load_deadline_ms=None, control_deadline_ms=None, copy_mode=None,
                 segment_offsets=None, arena_fd=None, lookup_deadline_ms=None,
                 probe_interval_ms=None, codec=None, codec_shape=None, codec_slot_bytes=None,
                 _connect=None):
        super().__init__()
        self._keep = []
        self._host = host
        self._arena = None
        self.arenas = list(arenas)
        self.device = device
        o = self._options(namespace, self.arenas, buffer, buffer_size, device, instance_name,
                          world_size, save_deadline_ms, load_deadline_ms, control_deadline_ms,
                          copy_mode, segment_offsets, arena_fd, sidecar=_connect is not None,
                          lookup_deadline_ms=lookup_deadline_ms,
                          probe_interval_ms=probe_interval_ms)
        self._codec_options(o, codec, codec_shape, codec_slot_bytes)
        out = ffi.new("oi_engine **")
        try:
            if _connect is None:
                if not isinstance(host, OffloadHost):
                    raise InvalidArgumentError("host must be an OffloadHost")
                with host._lock:
                    _check(lib.oi_engine_create(host._p(), o, out))
                    self._ptr = out[0]
                    host._engines.add(self)
            else:
                aout = ffi.new("oi_imported_arena **")
                sock = _connect.encode() if _connect else ffi.NULL
                _check(lib.oi_engine_connect(sock, o, out, aout))
                self._ptr = out[0]
                if aout[0] != ffi.NULL:  # engine-owned memory imports nothing
                    self._arena = ImportedArena(aout[0], device, owner=self)
        except BaseException:
            self._keep = []  # let go of the buffers now (a SharedBuffer may then close)
            raise
        self._keep_opts = o

    def _codec_options(self, o, codec, codec_shape, codec_slot_bytes):
        """The namespace's codec (oi_engine_options.codec, docs/codecs.md):
        codec "none", "lossless", "int8", "int8-hadamard" or "fp8";
        codec_shape (tokens, heads, head_dim) of a host block's bf16
        elements, required by the lossy three; codec_slot_bytes, a lossless frame's slot. The C call
        checks them (InvalidArgumentError naming the field)."""
        if codec is not None:
            c = ffi.new("char[]", str(codec).encode())
            self._keep.append(c)
            o.codec = c
        if codec_shape is not None:
            try:
                o.codec_tokens, o.codec_heads, o.codec_head_dim = (int(v) for v in codec_shape)
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidArgumentError(
                    f"codec_shape must be (tokens, heads, head_dim), each 1..65535: "
                    f"{codec_shape!r}") from exc
        if codec_slot_bytes is not None:
            o.codec_slot_bytes = codec_slot_bytes

    def _options(self, namespace, arenas, buffer, buffer_size, device, instance_name, world_size,
                 save_deadline_ms, load_deadline_ms, control_deadline_ms, copy_mode,
                 segment_offsets, arena_fd, sidecar, lookup_deadline_ms=None,
                 probe_interval_ms=None):
        keep = self._keep
        o = ffi.new("oi_engine_options *")
        _check(lib.oi_engine_options_init(o))
        o.device = device
        ns = ffi.new("char[]", namespace.encode())
        keep.append(ns)
        o.namespace_id = ns
        if instance_name:
            inst = ffi.new("char[]", instance_name.encode())
            keep.append(inst)
            o.instance_name = inst
        o.world_size = world_size
        descs = ffi.new("oi_arena_desc[]", max(len(arenas), 1))
        keep.append(descs)
        for i, a in enumerate(arenas):
            name = ffi.new("char[]", a.name.encode())
            keep.append(name)
            d = descs[i]
            d.name = name
            d.offset = a.offset
            d.base = _address(a.base, keep)
            d.num_blocks = a.num_blocks
            d.bytes_per_block = a.bytes_per_block
            d.block_stride = a.block_stride
            d.segments = a.segments
            d.segment_stride = a.segment_stride
        o.arenas = descs
        o.num_arenas = len(arenas)
        if segment_offsets is not None:
            so, nso, so_keep = _u64_in(segment_offsets, "segment_offsets")
            keep.append(so_keep)
            keep.append(so)
            o.segment_offsets = so
            o.num_segment_offsets = nso
        if isinstance(buffer, SharedBuffer):
            keep.append(buffer)  # the engine keeps the mapping (and the memfd) alive
            if arena_fd is None and sidecar:  # an embedded engine takes its memory only
                arena_fd = buffer.fd
            buffer = buffer._map()
        if buffer is not None:
            o.arena_base = _address(buffer, keep)
            if buffer_size is None:
                if isinstance(buffer, int):
                    raise InvalidArgumentError("a device pointer buffer needs buffer_size")
                buffer_size = memoryview(buffer).nbytes
            o.arena_size = buffer_size
        elif buffer_size is not None:
            o.arena_size = buffer_size
        if arena_fd is not None:
            o.arena_fd = arena_fd
        for field, v in (("save_deadline_ms", save_deadline_ms),
                         ("load_deadline_ms", load_deadline_ms),
                         ("control_deadline_ms", control_deadline_ms),
                         ("lookup_deadline_ms", lookup_deadline_ms),
                         ("probe_interval_ms", probe_interval_ms),
                         ("copy_mode", copy_mode)):
            if v is not None:
                setattr(o, field, v)
        return o

    @classmethod
    def connect(cls, socket_path, namespace, arenas, *, device=DEVICE_CPU, buffer=None,
                buffer_size=None, arena_fd=None, segment_offsets=None, arena_size=None, **kw):
        """Connects to an `openinfer serve` (socket_path None: the default
        socket) and registers the layout (arenas by offset). Two modes
        (oi_engine_connect, docs/server.md):

        Server-allocated (buffer None): the server allocates the arena
        (zeroed) and this process maps it. Returns (engine, ImportedArena).
        buffer_size (or its older name arena_size) is the arena's size; None:
        the largest end of any arena. If the server dies the fatal handler
        runs (the memory is gone).

        Engine-owned (buffer given): the arena is this process's memory,
        which the server maps. Returns (engine, None). cpu: a SharedBuffer
        (its fd is sent as arena_fd unless arena_fd is given), or another
        buffer that is the MAP_SHARED mapping from offset 0 of the sealed
        memfd given as arena_fd. cuda (device >= 0): an int device pointer
        from cudaMalloc, with buffer_size required and no arena_fd. The
        engine keeps a buffer object alive until it is closed. If the server
        goes away the engine degrades instead (stats()["connection"] ==
        CONNECTION_DEGRADED: queries miss, saves drop, loads raise
        ClosedError) and reconnects in the background when a server listens
        on the socket again (``reconnects`` grows, a new ``server_epoch``;
        old leases are invalid). Free the memory only after close().

        segment_offsets: as in OffloadEngine()."""
        if buffer_size is None:
            buffer_size = arena_size
        e = cls(None, namespace, arenas, device=device, buffer=buffer, buffer_size=buffer_size,
                arena_fd=arena_fd, segment_offsets=segment_offsets,
                _connect=str(socket_path) if socket_path else "", **kw)
        return e, e._arena

    @property
    def imported_arena(self):
        """The ImportedArena of a sidecar engine (None when embedded)."""
        return self._arena

    def save(self, block_ids, hashes, *, on_done=None, wait_event=None, counts=False,
             arena_first=0, arena_count=0):
        """Saves block_ids[i] under hashes[i]; returns a Ticket. on_done(status)
        is called on a library thread once the blocks may be reused.
        counts=True: the ticket's ``save_result`` is this call's SaveResult
        (accepted / deduplicated / dropped), filled before save returns
        (sidecar: one round trip to the server); else it is None.

        Layerwise save: arena_count 0 (the default) saves whole blocks;
        otherwise this call copies only arenas [arena_first, arena_first +
        arena_count) of each block (a layer's arenas, as soon as that layer
        is written, each call with its own wait_event and ticket). A block's
        host copy seals -- and queries see it -- only once every arena of the
        layout arrived and landed; until then it is pending. A failed arena
        aborts the whole block. With counts=True the first call naming a hash
        counts it; later layers of the same blocks count 0.

        block_ids: a buffer of int64 (array('q'), numpy int64) or an iterable
        of ints; hashes: a BlockHashes, one buffer of n*16 bytes, or a
        sequence of 16-byte hashes. Buffers are passed to C in place (the
        library copies both before save returns)."""
        ids, n, _keep_ids = _ids_in(block_ids)
        hs, nh, _keep_hs = _hashes_in(hashes)
        if n != nh:
            ffi.release(ids)
            ffi.release(hs)
            raise InvalidArgumentError("%d block ids but %d hashes" % (n, nh))
        opt = ffi.new("oi_save_options *")
        _check(lib.oi_save_options_init(opt))
        res = None
        if counts:
            res = ffi.new("oi_save_result *")
            res.struct_size = ffi.sizeof("oi_save_result")
            opt.result = res
        if wait_event:
            opt.wait_event = ffi.cast("void *", wait_event)
        if arena_first < 0 or arena_count < 0:
            ffi.release(ids)
            ffi.release(hs)
            raise InvalidArgumentError("arena_first and arena_count must not be negative")
        opt.arena_first = arena_first
        opt.arena_count = arena_count
        key = None
        if on_done is not None:
            key = ffi.new_handle(on_done)
            with _callbacks_lock:
                _callbacks[key] = (None, on_done, key)
            opt.on_done = lib._oi_py_save_done
            opt.on_done_ctx = key
        t = ffi.new("oi_ticket **")
        with self._lock:
            try:
                st = lib.oi_engine_save(self._p(), ids, hs, n, opt, t)
            finally:  # the library copied both; an exception must not keep the exports
                ffi.release(ids)
                ffi.release(hs)
        if st < 0:
            err = _error_for(st)
            if key is not None:
                with _callbacks_lock:
                    _callbacks.pop(key, None)
            raise err
        ticket = Ticket(t[0])
        ticket.save_result = SaveResult._from_c(res) if res is not None else None
        return ticket

    def _query_call(self):
        p = self._p()
        return lambda rid, hs, n, flags, r: lib.oi_engine_query(p, rid, hs, n, flags, r)

    def query(self, hashes, req_id=None, *, membership=False, wait_pending=None):
        """Counts the leading run of `hashes` (as in save) in the host tier and
        leases it. QueryResult.pending_blocks counts the blocks right after
        that run whose save is still in flight (not leased: a miss).
        wait_pending: seconds to wait for those blocks to seal first
        (OI_QUERY_WAIT_PENDING; blocks that sealed count as hits); None does
        not wait. membership=True: see query_membership (QueryResult.present
        is then a list of bools)."""
        with self._lock:
            res, present = _do_query(self, self._query_call(), hashes, req_id, membership, None,
                                     wait_pending)
        return _membership_result(res, present) if membership else res

    def query_membership(self, hashes, out=None):
        """Which of `hashes` (a BlockHashes or one buffer of n*16 bytes; a
        sequence of 16-byte hashes also works) are present, each on its own:
        no prefix rule, no lease. Returns the n present flags (1 present, 0
        not) written into `out` (a writable buffer of at least n bytes: a
        bytearray, a numpy uint8/bool array) or into a new bytearray."""
        with self._lock:
            return _do_query(self, self._query_call(), hashes, None, True, out, None)[1]

    def load(self, lease, dst_block_ids, arena_events=False):
        """Copies the leased blocks into dst_block_ids; consumes one share of
        the lease (even on failure). Returns a Ticket. arena_events: copy
        arena by arena in the layout's order, reporting each arena as it lands
        (Ticket.arena_wait / Ticket.arena_poll; every mode: a sidecar
        engine's server reports each arena as it lands) and, on an embedded
        cuda engine, recording an event after each (Ticket.arena_event)."""
        raw = lease.raw if isinstance(lease, Lease) else bytes(lease)
        if len(raw) != 16:
            raise InvalidArgumentError("a lease is 16 bytes")
        ids, n, _keep = _ids_in(dst_block_ids)
        cl = ffi.new("oi_lease *")
        ffi.memmove(cl.bytes, raw, 16)
        opt = ffi.new("oi_load_options *")
        _check(lib.oi_load_options_init(opt))
        if arena_events:
            opt.flags = lib.OI_LOAD_ARENA_EVENTS
        t = ffi.new("oi_ticket **")
        if isinstance(lease, Lease):
            lease._done = True
        with self._lock:
            try:
                st = lib.oi_engine_load(self._p(), cl[0], ids, n, opt, t)
            finally:  # the library copied the ids
                ffi.release(ids)
        _check(st)
        return Ticket(t[0])

    def release(self, lease):
        """Drops a lease (Lease or its 16 raw bytes) of this engine's
        namespace, whichever engine or lookup took it."""
        if isinstance(lease, Lease):
            lease._done = True
            lease = lease.raw
        self._release(bytes(lease))

    def _release(self, raw):
        if len(raw) != 16:
            raise InvalidArgumentError("a lease is 16 bytes")
        cl = ffi.new("oi_lease *")
        ffi.memmove(cl.bytes, raw, 16)
        with self._lock:
            _check(lib.oi_engine_release(self._p(), cl[0]))

    def flush(self, timeout=None):
        with self._lock:
            p = self._p()
        _check(lib.oi_engine_flush(p, _timeout_ms(timeout)))

    def stats(self):
        """Every field of oi_engine_stats as a dict: the counters
        (saves_*, loads_*, blocks_loaded, bytes_*, query_*_blocks,
        saves_pending, loads_submitted, namespace_blocks_resident), the
        latency histograms save_latency_us / load_latency_us (lists of
        latency_buckets counts) with their *_sum_us, and the sidecar
        connection: server_epoch, connection (CONNECTION_EMBEDDED,
        CONNECTION_CONNECTED or CONNECTION_DEGRADED), reconnects,
        disconnected_saves, disconnected_query_misses."""
        s = ffi.new("oi_engine_stats *")
        s.struct_size = ffi.sizeof("oi_engine_stats")
        with self._lock:
            _check(lib.oi_engine_get_stats(self._p(), s))
        d = _stats_dict(s, _ENGINE_STATS)
        n = min(s.latency_buckets, len(s.save_latency_us))
        d["save_latency_us"] = [s.save_latency_us[i] for i in range(n)]
        d["load_latency_us"] = [s.load_latency_us[i] for i in range(n)]
        return d

    def close(self):
        """Drop order: close the imported arena mapping (sidecar), then flush
        and unregister."""
        with self._lock:
            if self._ptr is None:
                return
            if self._arena is not None:
                self._arena.close()
            p, self._ptr = self._ptr, None
        lib.oi_engine_destroy(p)
        self._keep = []
        self._host = None


# --------------------------------------------------------------------------- imported arena


class ImportedArena(_Handle):
    """An arena another process exported, mapped here. ``ptr`` is its base
    address (a device pointer on cuda); on the cpu backend ``read``/``write``
    copy bytes in and out (checked against the size and against close).

    Close it before its owner frees the memory; an engine's close() closes the
    arena it imported first."""

    _what = "imported arena"

    def __init__(self, ptr, device=DEVICE_CPU, owner=None):
        super().__init__()
        self._ptr = ptr
        self.device = device
        self._owner = weakref.ref(owner) if owner is not None else None

    @classmethod
    def open(cls, handle, expected_bytes, device=DEVICE_CPU):
        """Maps the 64-byte oi_arena_handle `handle`; the real allocation must
        hold at least expected_bytes (else ProtocolError)."""
        h = ffi.new("oi_arena_handle *")
        raw = bytes(handle)
        if len(raw) != 64:
            raise InvalidArgumentError("an arena handle is 64 bytes")
        ffi.memmove(h.bytes, raw, 64)
        out = ffi.new("oi_imported_arena **")
        _check(lib.oi_imported_arena_open(h, expected_bytes, device, out))
        return cls(out[0], device)

    @property
    def ptr(self):
        return int(ffi.cast("uintptr_t", lib.oi_imported_arena_ptr(self._p())))

    @property
    def size(self):
        return lib.oi_imported_arena_size(self._p())

    def __len__(self):
        return self.size

    def _span(self, offset, n):
        size = self.size
        if offset < 0 or n < 0 or offset + n > size:
            raise InvalidArgumentError("[%d, %d) is outside the arena of %d bytes"
                                       % (offset, offset + n, size))
        if self.device != DEVICE_CPU:
            raise UnsupportedError("read/write need a cpu arena; use .ptr on cuda")

    def read(self, offset, n):
        with self._lock:
            self._span(offset, n)
            return bytes(ffi.buffer(ffi.cast("char *", lib.oi_imported_arena_ptr(self._ptr))
                                    + offset, n))

    def write(self, offset, data):
        data = memoryview(data).cast("B")
        with self._lock:
            self._span(offset, data.nbytes)
            ffi.memmove(ffi.cast("char *", lib.oi_imported_arena_ptr(self._ptr)) + offset,
                        data, data.nbytes)

    def memoryview(self):
        """A writable memoryview of the whole arena (cpu). Unlike read/write it
        is not checked: do not use it after close()."""
        with self._lock:
            self._span(0, 0)
            return memoryview(ffi.buffer(lib.oi_imported_arena_ptr(self._p()), self.size))

    def close(self):
        with self._lock:
            p, self._ptr = self._ptr, None
        if p is not None:
            lib.oi_imported_arena_close(p)


# --------------------------------------------------------------------------- server


class Server(_Handle):
    """The embeddable sidecar server. ``start()`` serves on a background
    thread; ``stop()`` makes it return; ``close()`` stops, joins and frees."""

    _what = "server"

    def __init__(self, socket_path=None, pool_bytes=1 << 30, *, device=DEVICE_CPU,
                 hugepages=False, pin=None, socket_mode=None, allowed_uids=(), allowed_gids=(),
                 arena_devices=None, max_sessions=None, log_level=None, lease_ttl_ms=None):
        super().__init__()
        keep = []
        if pin is None:
            pin = device != DEVICE_CPU
        ho = _host_options(pool_bytes, device, hugepages, pin, lease_ttl_ms, None, None, None,
                           None, None)
        keep.append(ho)
        o = ffi.new("oi_server_options *")
        _check(lib.oi_server_options_init(o))
        o.host = ho
        if socket_path is not None:
            sp = ffi.new("char[]", str(socket_path).encode())
            keep.append(sp)
            o.socket_path = sp
        if socket_mode is not None:
            o.socket_mode = socket_mode
        if allowed_uids:
            u = ffi.new("uint32_t[]", list(allowed_uids))
            keep.append(u)
            o.allowed_uids, o.num_allowed_uids = u, len(allowed_uids)
        if allowed_gids:
            g = ffi.new("uint32_t[]", list(allowed_gids))
            keep.append(g)
            o.allowed_gids, o.num_allowed_gids = g, len(allowed_gids)
        if arena_devices:
            d = ffi.new("int32_t[]", list(arena_devices))
            keep.append(d)
            o.devices, o.num_devices = d, len(arena_devices)
        if max_sessions is not None:
            o.max_sessions = max_sessions
        if log_level is not None:
            o.log_level = _LEVELS[log_level] if isinstance(log_level, str) else log_level
        out = ffi.new("oi_server **")
        _check(lib.oi_server_create(o, out))
        self._ptr = out[0]
        self._thread = None
        self._result = None

    @property
    def socket_path(self):
        return ffi.string(lib.oi_server_socket_path(self._p())).decode()

    @property
    def epoch(self):
        return lib.oi_server_epoch(self._p())

    def run(self):
        """Serves on the calling thread until stop() (from another thread)."""
        with self._lock:
            p = self._p()
        _check(lib.oi_server_run(p))

    def start(self):
        """Serves on a daemon thread; returns self."""
        with self._lock:
            p = self._p()
            if self._thread is not None:
                raise StateError("the server was already started")

            def serve():
                self._result = lib.oi_server_run(p)

            self._thread = threading.Thread(target=serve, name="openinfer-server", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        with self._lock:
            _check(lib.oi_server_stop(self._p()))

    def close(self):
        with self._lock:
            if self._ptr is None:
                return
            lib.oi_server_stop(self._ptr)
            if self._thread is not None:
                self._thread.join()
            p, self._ptr = self._ptr, None
        lib.oi_server_destroy(p)
        if self._result is not None and self._result < 0:
            st, self._result = self._result, None
            raise _error_for(st, "server run failed")


# --------------------------------------------------------------------------- executor

__all__ += ["RefModel", "Executor", "RequestResult", "plan_restore"]


class RefModel(_Handle):
    """The library's reference model (cpu, deterministic weights): the model
    an Executor runs. Must outlive its executors: ``close()`` closes them first."""

    _what = "reference model"

    def __init__(self, *, seed=None, num_layers=None, hidden=None, num_q_heads=None,
                 num_kv_heads=None, head_dim=None, intermediate=None, vocab_size=None,
                 max_positions=None):
        super().__init__()
        o = ffi.new("oi_refmodel_options *")
        _check(lib.oi_refmodel_options_init(o))
        for field, v in (("seed", seed), ("num_layers", num_layers), ("hidden", hidden),
                         ("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads),
                         ("head_dim", head_dim), ("intermediate", intermediate),
                         ("vocab_size", vocab_size), ("max_positions", max_positions)):
            if v is not None:
                setattr(o, field, v)
        self._ops = ffi.new("oi_model_ops *")
        self._ops.struct_size = ffi.sizeof("oi_model_ops")
        ctx = ffi.new("void **")
        _check(lib.oi_refmodel_create(o, self._ops, ctx))
        self._ptr = ctx[0]
        self._executors = weakref.WeakSet()

    def close(self):
        with self._lock:
            if self._ptr is None:
                return
            for x in list(self._executors):
                x.close()
            p, self._ptr = self._ptr, None
        lib.oi_refmodel_destroy(p)


_REQUEST_STATES = {0: "waiting", 1: "restoring", 2: "running", 3: "finished", 4: "failed"}


class RequestResult:
    """state ("waiting", "restoring", "running", "finished", "failed"),
    status, error (an Error or None), tokens (list), rank, prompt_len,
    cached_tokens, restored_tokens, computed_tokens, ttft_ns, latency_ns."""

    def __init__(self, r):
        self.state = _REQUEST_STATES.get(r.state, str(r.state))
        self.status = r.status
        self.error = _error_for(r.status, "request failed") if r.status < 0 else None
        self.tokens = [r.tokens[i] for i in range(r.n_tokens)]
        for f in ("rank", "prompt_len", "cached_tokens", "restored_tokens", "computed_tokens",
                  "ttft_ns", "latency_ns"):
            setattr(self, f, getattr(r, f))

    @property
    def finished(self):
        return self.state == "finished"

    def __repr__(self):
        return "RequestResult(%s, %d tokens, restored=%d)" % (self.state, len(self.tokens),
                                                             self.restored_tokens)


_EXEC_STATS = [
    "ranks", "steps", "requests_submitted", "requests_finished", "requests_failed",
    "prefill_tokens", "decode_tokens", "cached_tokens", "restored_tokens", "restores_started",
    "restores_completed", "restores_failed", "saves_submitted", "save_blocks_pending",
    "blocks_total", "blocks_free", "blocks_cached", "blocks_active", "leases_held",
    "restores_overlapped", "restores_waited", "plans", "plans_compute", "plans_split",
    "plans_partial", "plan_ns", "prefill_ns_per_token", "prefill_ns_per_token_ctx",
    "prefill_samples"]

_OFFLOAD = {"none": 0, "embedded": 1, "sidecar": 2}


@ffi.def_extern()
def _oi_py_token(ctx, request_id, token, index, finished):
    x = ffi.from_handle(ctx)
    fn = x._on_token
    if fn is not None:
        try:
            fn(int(request_id), int(token), int(index), bool(finished))
        except Exception as e:  # re-raised by the step that called it
            x._token_error = e


class Executor(_Handle):
    """The KV runtime: rank workers, a GPU block pool with a prefix cache, the
    offload engines and a scheduler, running `model` (a RefModel).

    offload: "none", "embedded" (host: an OffloadHost to share, which must
    outlive the executor, or None for a private one) or "sidecar"
    (socket_path). codec (with offload): the namespace's codec, "none",
    "lossless", "int8", "int8-hadamard" or "fp8", and codec_slot_bytes its frame slot
    (docs/codecs.md). Driven from one thread at a time (calls are
    serialized). on_token(request_id, token, index, finished) runs inside
    step()."""

    _what = "executor"

    def __init__(self, model, *, ranks=1, devices=None, page_size=None, gpu_blocks=None,
                 offload="none", host=None, host_pool_bytes=None, socket_path=None,
                 namespace=None, max_batch_tokens=None, max_batch_seqs=None, prefix_cache=True,
                 restore_timeout_ms=None, flush_timeout_ms=None, on_token=None,
                 restore_plan="auto", prefill_ns_per_token=None, prefill_ns_per_token_ctx=None,
                 link_bytes_per_s=None, disk_bytes_per_s=None, remote_bytes_per_s=None,
                 codec=None, codec_slot_bytes=None):
        super().__init__()
        if not isinstance(model, RefModel):
            raise InvalidArgumentError("model must be a RefModel")
        keep = self._keep = []
        o = ffi.new("oi_executor_options *")
        _check(lib.oi_executor_options_init(o))
        o.model = model._ops
        o.model_ctx = model._p()
        o.ranks = ranks
        if devices is not None:
            d = ffi.new("int32_t[]", list(devices))
            keep.append(d)
            o.devices = d
        for field, v in (("page_size", page_size), ("gpu_blocks", gpu_blocks),
                         ("max_batch_tokens", max_batch_tokens),
                         ("max_batch_seqs", max_batch_seqs),
                         ("restore_timeout_ms", restore_timeout_ms),
                         ("flush_timeout_ms", flush_timeout_ms),
                         ("prefill_ns_per_token", prefill_ns_per_token),
                         ("prefill_ns_per_token_ctx", prefill_ns_per_token_ctx),
                         ("link_bytes_per_s", link_bytes_per_s),
                         ("disk_bytes_per_s", disk_bytes_per_s),
                         ("remote_bytes_per_s", remote_bytes_per_s),
                         ("codec_slot_bytes", codec_slot_bytes)):
            if v is not None:
                setattr(o, field, v)
        if codec is not None:
            if not isinstance(codec, str):
                raise InvalidArgumentError("codec: %r (a codec's name, docs/codecs.md)" % (codec,))
            c = ffi.new("char[]", codec.encode())
            keep.append(c)
            o.codec = c
        plans = {"auto": lib.OI_RESTORE_PLAN_AUTO, "off": lib.OI_RESTORE_PLAN_OFF}
        if restore_plan not in plans:
            raise InvalidArgumentError("restore_plan: %r (\"auto\" or \"off\")" % (restore_plan,))
        o.restore_plan = plans[restore_plan]
        o.prefix_cache = 1 if prefix_cache else 0
        o.offload = _OFFLOAD[offload] if isinstance(offload, str) else offload
        if host is not None:
            o.host = host._p()
        elif host_pool_bytes is not None:
            ho = _host_options(host_pool_bytes, DEVICE_CPU, False, False, None, None, None, None,
                               None, None)
            keep.append(ho)
            o.host_options = ho
        if socket_path is not None:
            sp = ffi.new("char[]", str(socket_path).encode())
            keep.append(sp)
            o.socket_path = sp
        if namespace is not None:
            ns = ffi.new("char[]", namespace.encode())
            keep.append(ns)
            o.namespace_id = ns
        self._on_token = on_token
        self._token_error = None
        self._handle = ffi.new_handle(self)
        if on_token is not None:
            o.on_token = lib._oi_py_token
            o.on_token_ctx = self._handle
        out = ffi.new("oi_executor **")
        _check(lib.oi_executor_create(o, out))
        self._ptr = out[0]
        self._model = model
        self._host = host
        model._executors.add(self)
        if host is not None:
            host._engines.add(self)  # the host closes its executors before itself

    def _reraise_token_error(self):
        e, self._token_error = self._token_error, None
        if e is not None:
            raise e

    def submit(self, prompt, max_new_tokens, *, rank=-1, salt=b""):
        """Queues a request; returns its id."""
        prompt = list(prompt)
        r = ffi.new("oi_request *")
        _check(lib.oi_request_init(r))
        p = ffi.new("uint32_t[]", prompt or [0])
        r.prompt = p
        r.prompt_len = len(prompt)
        r.max_new_tokens = max_new_tokens
        r.rank = rank
        salt = bytes(salt)
        s = ffi.new("char[]", salt) if salt else ffi.NULL
        if salt:
            r.salt = s
            r.salt_len = len(salt)
        rid = ffi.new("uint64_t *")
        with self._lock:
            _check(lib.oi_executor_submit(self._p(), r, rid))
        return rid[0]

    def step(self):
        """One scheduler step; returns the number of requests that finished."""
        n = ffi.new("uint32_t *")
        with self._lock:
            _check(lib.oi_executor_step(self._p(), n))
        self._reraise_token_error()
        return n[0]

    def run_until_idle(self):
        with self._lock:
            _check(lib.oi_executor_run_until_idle(self._p()))
        self._reraise_token_error()

    def result(self, request_id):
        r = ffi.new("oi_request_result *")
        r.struct_size = ffi.sizeof("oi_request_result")
        with self._lock:
            _check(lib.oi_executor_get_result(self._p(), request_id, r))
            return RequestResult(r)

    def generate(self, prompt, max_new_tokens, **kw):
        """submit + run_until_idle + the generated tokens."""
        rid = self.submit(prompt, max_new_tokens, **kw)
        self.run_until_idle()
        res = self.result(rid)
        if res.error is not None:
            raise res.error
        return res.tokens

    def flush(self, timeout=None):
        with self._lock:
            _check(lib.oi_executor_flush(self._p(), _timeout_ms(timeout)))

    def evict_gpu_cache(self):
        n = ffi.new("uint64_t *")
        with self._lock:
            _check(lib.oi_executor_evict_gpu_cache(self._p(), n))
        return n[0]

    def stats(self):
        s = ffi.new("oi_executor_stats *")
        s.struct_size = ffi.sizeof("oi_executor_stats")
        with self._lock:
            _check(lib.oi_executor_get_stats(self._p(), s))
        return _stats_dict(s, _EXEC_STATS)

    def kv_layout(self, rank=0):
        k = ffi.new("oi_kv_layout *")
        k.struct_size = ffi.sizeof("oi_kv_layout")
        with self._lock:
            _check(lib.oi_executor_get_kv_layout(self._p(), rank, k))
        d = {f: getattr(k, f) for f in ("device", "bytes", "num_layers", "page_size",
                                         "num_blocks", "layer_stride", "block_stride",
                                         "segment_stride", "token_stride")}
        d["base"] = int(ffi.cast("uintptr_t", k.base))
        return d

    def request_blocks(self, request_id):
        n = ffi.new("size_t *")
        with self._lock:
            p = self._p()
            _check(lib.oi_executor_request_blocks(p, request_id, ffi.NULL, 0, n))
            out = ffi.new("int64_t[]", max(n[0], 1))
            _check(lib.oi_executor_request_blocks(p, request_id, out, n[0], n))
        return [out[i] for i in range(n[0])]

    def close(self):
        """Workers -> drain loads -> close the arena mapping -> flush -> unregister
        (oi_executor_destroy does it in that order)."""
        with self._lock:
            if self._ptr is None:
                return
            p, self._ptr = self._ptr, None
        lib.oi_executor_destroy(p)
        self._keep = []
