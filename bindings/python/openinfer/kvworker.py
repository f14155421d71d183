"""The byte-moving half of an engine connector, on torch tensors, without vLLM.

A ``KVWorker`` registers an engine's paged KV tensors with libopeninfer (one
arena per layer tensor), saves a layer's blocks as soon as that layer is
written (a layerwise save, with a CUDA event per layer on a GPU), and loads
leased blocks back arena by arena so that each layer can wait for its own
bytes. ``openinfer.vllm`` drives it from vLLM's connector calls; anything
else that holds ``{layer name: tensor}`` can drive it too (the GPU check
``tests/gpu/python_vllm_layout.py`` does, on a machine without vLLM).

Tensor layouts (``KVLayout.from_tensors``), per layer, in the tensor's
logical shape, with any strides whose per-block part is dense:

* ``[2, num_blocks, ...]`` (vLLM's flash-attention and CPU layout, K then V):
  ONE arena with two segments, at byte offsets ``0`` and ``stride(0)`` from
  the tensor's data pointer (``segment_offsets``), ``block_stride`` =
  ``stride(1)`` bytes;
* ``[num_blocks, 2, ...]`` (flashinfer): one arena, two segments at ``0``
  and ``stride(1)``;
* ``[num_blocks, ...]`` (MLA: no K/V split): one arena, one segment.

Layers whose tensors are the same memory (vLLM's KV sharing) are registered
once. Torch is imported lazily: only the calls that touch tensors need it.

A namespace with a codec (``codec=``, docs/codecs.md) stores each block as
one frame, and is saved and loaded the same way: ``save_layer`` saves a
layer's arena as it is written (the library gathers the block's arenas and
encodes it once the last one landed), and a load reports each arena as it
lands. ``codec_shape_of`` gives the lossy codecs' block shape of a layout.
"""
import logging
import threading
import time

import openinfer as oi

__all__ = ["KVLayout", "KVWorker", "shared_kv_tensors", "codec_shape_of", "DEFAULT_DEADLINE_MS"]

logger = logging.getLogger("openinfer.kvworker")

# The library's default save and load deadlines (include/openinfer/engine.h):
# a wait that names no timeout waits at most this long.
DEFAULT_DEADLINE_MS = 120000

# Engines, tensors and tickets that close() could not end (a load that may
# still land in the tensors): kept alive for the life of the process, so
# that no late copy writes into memory given back to the allocator.
_abandoned = []


def wait_final(ticket, timeout):
    """Waits up to `timeout` seconds until the ticket is final (``done()``:
    for a load, no byte can land any more), also through a fence (a load
    past its deadline whose copies may still land; ``Ticket.wait`` returns
    at once then). True once final, False when the time ran out."""
    end = time.monotonic() + max(0.0, timeout)
    while True:
        if ticket.done():
            return True
        left = end - time.monotonic()
        if left <= 0:
            return False
        if not ticket.fencing:
            try:
                ticket.wait(left)
                return True
            except oi.TimeoutError:
                if ticket.done():
                    return True
                continue  # ran out, or turned fencing: the loop decides
            except oi.Error:
                return True
        time.sleep(min(left, 0.001))


def _address_of(shared):
    """The address of a SharedBuffer's mapping."""
    view = shared.view
    c = oi.ffi.from_buffer(view)
    try:
        return int(oi.ffi.cast("uintptr_t", c))
    finally:
        oi.ffi.release(c)
        view.release()


def _torch():
    import torch
    return torch


class _Region:
    """One registered tensor: where it is and how its blocks lie."""

    __slots__ = ("names", "ptr", "extent", "num_blocks", "block_stride", "chunk", "segments")

    def __init__(self, name, ptr, extent, num_blocks, block_stride, chunk, segments):
        self.names = [name]
        self.ptr = ptr
        self.extent = extent  # bytes from ptr to the end of the last byte of any block
        self.num_blocks = num_blocks
        self.block_stride = block_stride
        self.chunk = chunk  # bytes of one segment of one block
        self.segments = segments  # byte offsets of the segments from ptr


def _dense_chunk(sizes_strides):
    """Elements of the dense chunk that (size, stride) pairs span, or None
    when they do not tile one contiguous run."""
    expected = 1
    for size, stride in sorted(sizes_strides, key=lambda p: (p[1], p[0])):
        if size == 1:
            continue
        if stride != expected:
            return None
        expected *= size
    return expected


def _describe(name, t, num_blocks, kv_dim):
    """A _Region for tensor t, whose block dimension holds num_blocks."""
    shape, strides, es = tuple(t.shape), tuple(t.stride()), t.element_size()
    if len(shape) < 2:
        raise oi.InvalidArgumentError("layer %r: a KV tensor of shape %s has no block dimension"
                                      % (name, list(shape)))
    if kv_dim == "auto":
        if num_blocks is None:
            num_blocks = shape[1] if shape[0] == 2 else shape[0]
        if shape[0] == 2 and shape[1] == num_blocks:
            kv_dim, block_dim = 0, 1
        elif shape[0] == num_blocks and shape[1] == 2 and len(shape) > 2:
            kv_dim, block_dim = 1, 0
        elif shape[0] == num_blocks:
            kv_dim, block_dim = None, 0
        else:
            raise oi.InvalidArgumentError(
                "layer %r: shape %s matches none of [2, %d, ...], [%d, 2, ...], [%d, ...]"
                % (name, list(shape), num_blocks, num_blocks, num_blocks))
    elif kv_dim is None:
        block_dim = 0
    else:
        block_dim = 1 - kv_dim
    if num_blocks is None:
        num_blocks = shape[block_dim]
    if shape[block_dim] != num_blocks:
        raise oi.InvalidArgumentError("layer %r: %d blocks in dimension %d, expected %d"
                                      % (name, shape[block_dim], block_dim, num_blocks))
    rest = [(shape[d], strides[d]) for d in range(len(shape)) if d not in (kv_dim, block_dim)]
    elems = _dense_chunk(rest)
    if elems is None:
        raise oi.InvalidArgumentError(
            "layer %r: a block of shape %s with strides %s is not one contiguous run of bytes"
            % (name, [s for s, _ in rest], [st for _, st in rest]))
    chunk = elems * es
    block_stride = strides[block_dim] * es
    if kv_dim is None:
        segments = [0]
    else:
        segments = [i * strides[kv_dim] * es for i in range(shape[kv_dim])]
    extent = max(segments) + (num_blocks - 1) * block_stride + chunk
    return _Region(name, int(t.data_ptr()), extent, num_blocks, block_stride, chunk, segments)


class KVLayout:
    """The arenas of an engine's KV tensors, in the order the layers were
    given (layer i's arena is i, unless it shares another layer's memory).

    ``regions``: one per distinct tensor; ``arena_of``: layer name -> arena
    index; ``device``: -1 (cpu) or the CUDA device of the tensors;
    ``num_blocks``; ``block_bytes``: bytes of one block in the host tier
    (every arena's segments)."""

    def __init__(self, regions, arena_of, device, num_blocks):
        self.regions = regions
        self.arena_of = arena_of
        self.device = device
        self.num_blocks = num_blocks

    @classmethod
    def from_tensors(cls, kv_caches, num_blocks=None, kv_dim="auto"):
        """kv_caches: {layer name: tensor}, every tensor on one device with
        the same number of blocks. kv_dim: "auto" (the shapes above), 0, 1 or
        None (no K/V dimension: the block dimension is 0)."""
        if not kv_caches:
            raise oi.InvalidArgumentError("no KV tensors to register")
        regions, arena_of, by_ptr = [], {}, {}
        device = None
        for name, t in kv_caches.items():
            dev = -1 if t.device.type == "cpu" else (t.device.index or 0)
            if t.device.type not in ("cpu", "cuda"):
                raise oi.InvalidArgumentError("layer %r: tensors on %s are not supported"
                                              % (name, t.device))
            if device is None:
                device = dev
            elif dev != device:
                raise oi.InvalidArgumentError("layer %r is on device %s, the others on %s"
                                              % (name, dev, device))
            r = _describe(name, t, num_blocks, kv_dim)
            num_blocks = r.num_blocks
            key = (r.ptr, r.block_stride, tuple(r.segments), r.chunk)
            if key in by_ptr:  # the same memory as an earlier layer (KV sharing)
                i = by_ptr[key]
                regions[i].names.append(name)
                arena_of[name] = i
                continue
            by_ptr[key] = len(regions)
            arena_of[name] = len(regions)
            regions.append(r)
        return cls(regions, arena_of, device, num_blocks)

    @property
    def block_bytes(self):
        return sum(r.chunk * len(r.segments) for r in self.regions)

    def arenas(self, base=None):
        """(arenas, segment_offsets): each arena at its tensor's address, or,
        with `base` (an int address), at offset ptr - base from it."""
        arenas, offsets = [], []
        for i, r in enumerate(self.regions):
            name = r.names[0]
            if len(name.encode()) > 255:
                name = "arena%d" % i
            if base is None:
                a = oi.Arena(name, r.num_blocks, r.chunk, block_stride=r.block_stride,
                             segments=len(r.segments), base=r.ptr)
            else:
                if r.ptr < base:
                    raise oi.InvalidArgumentError("layer %r lies before the buffer" % name)
                a = oi.Arena(name, r.num_blocks, r.chunk, block_stride=r.block_stride,
                             segments=len(r.segments), offset=r.ptr - base)
            arenas.append(a)
            offsets.extend(r.segments)
        return arenas, offsets

    def span(self):
        """(lowest address, bytes up to the highest end) of every region."""
        lo = min(r.ptr for r in self.regions)
        hi = max(r.ptr + r.extent for r in self.regions)
        return lo, hi - lo


def shared_kv_tensors(shapes, dtype, *, name="openinfer-kv"):
    """CPU KV tensors for an engine-owned sidecar engine: one SharedBuffer
    (a sealed memfd, which the server maps) holding a tensor of each shape,
    each aligned to 4 KiB. Returns (buffer, [tensors]); keep the buffer
    alive as long as the tensors (KVWorker(..., buffer=buffer) does)."""
    torch = _torch()
    es = torch.empty((), dtype=dtype).element_size()
    sizes = []
    for s in shapes:
        n = es
        for d in s:
            n *= d
        sizes.append((n + 4095) & ~4095)
    buf = oi.SharedBuffer(max(sum(sizes), 4096), name=name)
    raw = torch.frombuffer(buf.view, dtype=torch.uint8)
    out, off = [], 0
    for s, n in zip(shapes, sizes):
        nbytes = es
        for d in s:
            nbytes *= d
        out.append(raw[off:off + nbytes].view(dtype).view(tuple(s)))
        off += n
    return buf, out


def lossless_refusal(dtype):
    """Why the lossless codec is refused for a KV cache of this dtype (a
    torch dtype or its name), or None for bfloat16. Its exponent plane is a
    bf16 element's bits 7..14: on the real-KV corpus (docs/codecs.md) bf16
    KV compresses 1.47x, the same KV as float16 1.14x and as fp8 e4m3
    1.05x, past the frame slot (74 % of the block): every save would be
    dropped, not stored."""
    name = str(dtype).replace("torch.", "")
    if name == "bfloat16":
        return None
    return ("the KV cache is %s; the lossless codec compresses bfloat16 KV (1.47x on the real-KV "
            "corpus), while the same KV as float16 compresses 1.14x and as fp8 1.05x, less than "
            "its frame slot (74 %% of the block) needs: every save would be dropped" % name)


def codec_shape_of(tensors, roles):
    """The lossy codecs' block shape (tokens, heads, head_dim) of KV tensors
    registered as KVLayout registers them: a host block holds, arena after
    arena, each arena's segments, each segment one dense run of its tensor's
    per-block dimensions in memory order. The codecs take a block's bf16
    elements as [parts][tokens][heads][head_dim]: int8 scales each run of
    head_dim elements (one token's K or V of one head), fp8 each (part,
    head) over the tokens. So head_dim must be the innermost dimension (one
    head's K or V), the tokens the next dimension out that is not a head or
    K/V dimension; what lies between them are the heads, what lies outside
    the tokens the parts.

    tensors: {name: tensor}; roles: one letter per dimension of every tensor:
    ``b`` the block dimension, ``s`` the segment dimension (K/V halves, each
    a segment of its own: a part), ``t`` tokens, ``d`` head_dim, any other
    letter a dimension of heads (``h``), K/V inside a page (``k``) or groups
    of them (``g``). Raises InvalidArgumentError naming the tensor and why
    when the layout is not such a block, when the tensors disagree, or when
    they are not bfloat16 (the lossy codecs' only dtype)."""
    torch = _torch()
    shape = None
    for name, t in tensors.items():
        if len(roles) != t.dim() or roles.count("t") != 1 or roles.count("d") != 1:
            raise oi.InvalidArgumentError(
                "layer %r: roles %r do not name one tokens (t) and one head_dim (d) dimension "
                "of a tensor of shape %s" % (name, roles, list(t.shape)))
        if t.dtype != torch.bfloat16:
            raise oi.InvalidArgumentError(
                "layer %r: the KV cache is %s; the lossy codecs (int8, int8-hadamard, fp8) take bfloat16 "
                "only" % (name, str(t.dtype).replace("torch.", "")))
        dims = [(r, int(n), int(st)) for r, n, st in zip(roles, t.shape, t.stride())
                if r not in "bs" and (n != 1 or r in "td")]
        dims.sort(key=lambda x: -x[2])  # memory order, outermost first
        order = "".join(r for r, _, _ in dims)
        if dims[-1][0] != "d" or dims[-1][2] != 1:
            raise oi.InvalidArgumentError(
                "layer %r: head_dim is not the innermost dense dimension of a block (its "
                "dimensions in memory order: %s, strides %s): no lossy codec shape"
                % (name, order, [st for _, _, st in dims]))
        i = order.index("t")
        heads = 1
        for _, n, _ in dims[i + 1:-1]:
            heads *= n
        got = (dims[i][1], heads, dims[-1][1])
        if shape is not None and got != shape:
            raise oi.InvalidArgumentError(
                "layer %r: block shape (tokens, heads, head_dim) %s, another layer's is %s: "
                "one codec shape cannot describe both" % (name, got, shape))
        shape = got
    if shape is None:
        raise oi.InvalidArgumentError("no KV tensors to derive a codec shape from")
    return shape


class KVWorker:
    """One rank's engine over its KV tensors.

    Embedded: ``KVWorker(kv_caches, namespace, host=OffloadHost(...))``: the
    arenas are the tensors themselves (any allocations).

    Sidecar, engine-owned: ``KVWorker(kv_caches, namespace, socket=path,
    buffer=...)``: the server maps this process's memory. cpu: ``buffer`` is
    the SharedBuffer that holds every tensor (``shared_kv_tensors``); cuda:
    ``buffer`` None, the tensors must lie in one ``cudaMalloc`` allocation
    (the library checks it at connect). The engine degrades while the server
    is away (queries miss, saves drop, loads fail) and reconnects.

    Saves: ``save_layer(name, ids, hashes)`` once per layer after the layer's
    KV is written (cuda: a CUDA event recorded on the current stream orders
    the copy after the writes; a sidecar engine synchronizes the event
    instead, the server cannot wait on it); ``wait_saves()`` at the end of a
    step. Loads: ``load(lease, ids)`` then ``wait_layer(ticket, name)`` per
    layer (every engine reports arenas as they land; a sidecar engine from
    the server's progress frames).

    ``codec`` (``"none"``, ``"lossless"``, ``"int8"``, ``"int8-hadamard"``, ``"fp8"``; with
    ``codec_shape`` for the lossy ones, ``codec_shape_of``, and
    ``codec_slot_bytes``): the namespace's codec (docs/codecs.md). Saves and
    loads are layer by layer as without a codec: the library gathers a
    block's arenas in a bounce and encodes it into its slot once its last
    arena landed (a block the codec does not store is then counted in the
    engine's ``saves_not_encoded``; the save calls succeed), and decodes a
    load's frames before reporting its arenas one by one."""

    def __init__(self, kv_caches, namespace, *, host=None, socket=None, buffer=None,
                 num_blocks=None, kv_dim="auto", world_size=1, instance_name=None,
                 save_deadline_ms=None, load_deadline_ms=None, control_deadline_ms=None,
                 copy_mode=None, lookup_deadline_ms=None, probe_interval_ms=None,
                 codec=None, codec_shape=None, codec_slot_bytes=None):
        self.layout = KVLayout.from_tensors(kv_caches, num_blocks, kv_dim)
        self.namespace = namespace
        self.codec = codec or "none"
        self.device = self.layout.device
        self.sidecar = socket is not None
        self._tensors = dict(kv_caches)  # keeps the memory alive as long as the engine
        self._lock = threading.Lock()
        self._saves = []  # (ticket, event) of saves not yet waited for
        self._dropped = []  # tickets of saves a wait gave up on: closed once final
        self._loads = {}  # id(ticket) -> (ticket, blocks) of loads not yet settled
        self._counts = dict(loads_submitted=0, loads_refused=0, loads_completed=0,
                            loads_failed=0, loads_fenced=0, saves_submitted=0,
                            saves_completed=0, saves_failed=0, saves_dropped=0)
        self._fenced = set()  # id(ticket) of loads seen fencing
        self.save_deadline_s = (save_deadline_ms or DEFAULT_DEADLINE_MS) / 1000.0
        self.load_deadline_s = (load_deadline_ms or DEFAULT_DEADLINE_MS) / 1000.0
        self._layers_saved = set()  # arenas saved since the last wait_saves
        self._save_batch = None
        kw = dict(world_size=world_size, instance_name=instance_name,
                  save_deadline_ms=save_deadline_ms, load_deadline_ms=load_deadline_ms,
                  control_deadline_ms=control_deadline_ms, copy_mode=copy_mode,
                  lookup_deadline_ms=lookup_deadline_ms, probe_interval_ms=probe_interval_ms)
        if self.codec != "none":
            kw.update(codec=self.codec, codec_shape=codec_shape,
                      codec_slot_bytes=codec_slot_bytes)
        kw = {k: v for k, v in kw.items() if v is not None}
        if socket is None:
            if host is None:
                raise oi.InvalidArgumentError("KVWorker: give a host (embedded) or a socket")
            arenas, offsets = self.layout.arenas()
            self.engine = oi.OffloadEngine(host, namespace, arenas, device=self.device,
                                           segment_offsets=offsets, **kw)
        else:
            if self.device < 0:
                if not isinstance(buffer, oi.SharedBuffer):
                    raise oi.InvalidArgumentError(
                        "KVWorker: a sidecar engine on cpu needs its KV tensors in a "
                        "SharedBuffer (openinfer.kvworker.shared_kv_tensors), given as buffer=")
                base = _address_of(buffer)
                lo, size = self.layout.span()
                if lo < base or lo + size > base + buffer.nbytes:
                    raise oi.InvalidArgumentError("KVWorker: the KV tensors are not inside "
                                                  "the SharedBuffer given as buffer=")
                arenas, offsets = self.layout.arenas(base)
                self.engine, _ = oi.OffloadEngine.connect(socket, namespace, arenas,
                                                          device=self.device, buffer=buffer,
                                                          segment_offsets=offsets, **kw)
            else:
                lo, size = self.layout.span()
                arenas, offsets = self.layout.arenas(lo)
                self.engine, _ = oi.OffloadEngine.connect(socket, namespace, arenas,
                                                          device=self.device, buffer=lo,
                                                          buffer_size=size,
                                                          segment_offsets=offsets, **kw)
            self._buffer = buffer

    # ---------------------------------------------------------------- layers

    @property
    def num_arenas(self):
        return len(self.layout.regions)

    def arena(self, layer_name):
        """The arena index of a layer (None for a layer not registered)."""
        return self.layout.arena_of.get(layer_name)

    def _event(self):
        """A CUDA event recorded on the current stream of our device (None on cpu)."""
        if self.device < 0:
            return None
        torch = _torch()
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    # ---------------------------------------------------------------- saves

    def begin_step(self, block_ids, hashes):
        """The blocks this step's layers will save (ids and 16-byte hashes, as
        for OffloadEngine.save). save_layer without ids uses them."""
        ids = [int(b) for b in block_ids]
        hs = hashes if isinstance(hashes, oi.BlockHashes) else \
            oi.BlockHashes(b"".join(bytes(h) for h in hashes))
        if len(ids) != len(hs):
            raise oi.InvalidArgumentError("%d block ids but %d hashes" % (len(ids), len(hs)))
        if len(set(ids)) != len(ids):  # one call may not name a block twice: keep the first
            seen, keep = set(), []
            for i, b in enumerate(ids):
                if b not in seen:
                    seen.add(b)
                    keep.append(i)
            ids = [ids[i] for i in keep]
            hs = oi.BlockHashes(b"".join(hs[i] for i in keep))
        self._save_batch = (ids, hs) if ids else None
        self._layers_saved = set()

    def save_layer(self, layer_name, block_ids=None, hashes=None):
        """Saves arena(layer_name) of the blocks (default: begin_step's) as
        soon as the work queued so far on the current stream is done. Returns
        the Ticket, or None when there is nothing to save (no blocks, a layer
        not registered, an arena already saved this step)."""
        a = self.arena(layer_name)
        if a is None:
            return None
        if block_ids is None:
            if self._save_batch is None:
                return None
            block_ids, hashes = self._save_batch
        if a in self._layers_saved or not len(block_ids):
            return None
        return self._save_arenas(a, 1, block_ids, hashes)

    def _save_arenas(self, first, count, block_ids, hashes):
        ev = self._event()
        wait_event = None
        if ev is not None:
            if self.sidecar:
                ev.synchronize()  # the server cannot wait on our event
                ev = None
            else:
                wait_event = ev.cuda_event
        t = self.engine.save(block_ids, hashes, wait_event=wait_event, arena_first=first,
                             arena_count=count)
        with self._lock:
            self._saves.append((t, ev))
            self._layers_saved.update(range(first, first + count))
            self._counts["saves_submitted"] += 1
        return t

    def finish_step(self):
        """Saves the arenas of begin_step's blocks that no save_layer call
        saved (a block seals only once every arena arrived; in a codec
        namespace it is encoded then), then forgets the batch. Returns the
        tickets it made."""
        out = []
        if self._save_batch is not None:
            ids, hs = self._save_batch
            a = 0
            while a < self.num_arenas:
                if a in self._layers_saved:
                    a += 1
                    continue
                b = a
                while b < self.num_arenas and b not in self._layers_saved:
                    b += 1
                out.append(self._save_arenas(a, b - a, ids, hs))
                a = b
        self._save_batch = None
        self._layers_saved = set()
        return out

    def wait_saves(self, timeout=None):
        """Waits for every save made so far, all together at most `timeout`
        seconds (None: the save deadline); returns the errors (a list of
        openinfer.Error). A save still running when the time runs out is
        dropped: counted (``saves_dropped``), its ticket kept and closed once
        final, never waited for again. A failed or dropped save is a cache
        miss later, never wrong bytes (a save seals its blocks only once
        every copy landed)."""
        if timeout is None:
            timeout = self.save_deadline_s
        end = time.monotonic() + max(0.0, timeout)
        with self._lock:
            saves, self._saves = self._saves, []
        errors = []
        for t, _ev in saves:
            try:
                t.wait(max(0.0, end - time.monotonic()))
            except oi.TimeoutError as e:
                if not t.done():  # still running: dropped, closed later
                    with self._lock:
                        self._counts["saves_dropped"] += 1
                        self._dropped.append(t)
                    errors.append(e)
                    continue
                errors.append(e)
                self._count("saves_failed")
            except oi.Error as e:
                errors.append(e)
                self._count("saves_failed")
            else:
                self._count("saves_completed")
            t.close()
        self._reap_dropped()
        return errors

    def _count(self, key, n=1):
        with self._lock:
            self._counts[key] += n

    def _reap_dropped(self):
        with self._lock:
            dropped, self._dropped = self._dropped, []
        keep = []
        for t in dropped:
            if t.done():
                t.close()
            else:
                keep.append(t)
        with self._lock:
            self._dropped.extend(keep)

    # ---------------------------------------------------------------- loads

    def load(self, lease, block_ids):
        """Loads the leased blocks into block_ids, arena by arena; returns the
        Ticket (raises at once when the engine refuses: a degraded sidecar
        engine raises ClosedError; counted as refused and failed).

        The blocks are not the caller's again until the load is settled
        (``settle_load`` returned something other than None): a load past
        its deadline may still land (``ticket.fencing``)."""
        n = len(block_ids)
        self._count("loads_submitted")
        try:
            t = self.engine.load(lease, block_ids, arena_events=True)
        except oi.Error:
            with self._lock:
                self._counts["loads_refused"] += 1
                self._counts["loads_failed"] += 1
            raise
        with self._lock:
            self._loads[id(t)] = (t, n)
        return t

    def wait_layer(self, ticket, layer_name, timeout=None):
        """Waits until the layer's bytes of a load landed; raises the load's
        error (``TimeoutError``: not landed yet, or fencing -- the load is
        not final, its blocks are not the caller's)."""
        a = self.arena(layer_name)
        if a is None:
            return
        ticket.arena_wait(a, timeout)

    def settle_load(self, ticket, timeout=0):
        """Waits up to `timeout` seconds (through a fence: see wait_final)
        for a load to be final. Returns None while it is not (pending or
        fencing: keep it, its blocks may still be written), else True (every
        byte landed) or the load's error (it failed; no byte can land any
        more); either way the ticket is then closed and counted."""
        if not wait_final(ticket, timeout):
            if ticket.fencing:
                with self._lock:
                    if id(ticket) not in self._fenced:
                        self._fenced.add(id(ticket))
                        self._counts["loads_fenced"] += 1
            return None
        try:
            ticket.wait(0)
            out = True
        except oi.Error as e:
            out = e
        with self._lock:
            self._loads.pop(id(ticket), None)
            if isinstance(out, oi.DeadlineError) and id(ticket) not in self._fenced:
                self._counts["loads_fenced"] += 1  # fenced between two looks
            self._fenced.discard(id(ticket))
            self._counts["loads_completed" if out is True else "loads_failed"] += 1
        ticket.close()
        return out

    def counters(self):
        """This worker's own counts: loads submitted / refused (at submit) /
        completed / failed (refused ones included) / fenced (went past their
        deadline while copies could still land; failed once final, never
        completed), loads in flight, and of those the loads and blocks still
        fencing; saves submitted / completed / failed / dropped (still
        running when a wait gave up on them)."""
        with self._lock:
            out = dict(self._counts)
            loads = list(self._loads.values())
            out["saves_dropped_running"] = len(self._dropped)
        out["loads_in_flight"] = len(loads)
        fencing = [n for t, n in loads if t.fencing]
        out["loads_fencing"] = len(fencing)
        out["blocks_fencing"] = sum(fencing)
        return out

    # ---------------------------------------------------------------- misc

    def query(self, hashes, **kw):
        return self.engine.query(hashes, **kw)

    def stats(self):
        return self.engine.stats()

    def close(self, timeout=None):
        """Waits for the saves (at most the save deadline) and for every load
        to be final (at most `timeout` seconds, None: the load deadline),
        then closes the engine. A load still not final then (a hung server
        holds it) may yet land in the tensors: the engine, the tensors and
        the tickets are kept alive for the life of the process (logged)
        instead of being freed under it."""
        try:
            self.wait_saves()
        except oi.ClosedError:
            pass
        if timeout is None:
            timeout = self.load_deadline_s
        end = time.monotonic() + max(0.0, timeout)
        with self._lock:
            loads = list(self._loads.values())
        stuck = [(t, n) for t, n in loads
                 if self.settle_load(t, max(0.0, end - time.monotonic())) is None]
        self._reap_dropped()
        if stuck:
            logger.warning("openinfer: close: %d load(s) of %d blocks still not final after "
                           "%.1f s (the tier does not answer): keeping the engine and its KV "
                           "memory alive, not closing it", len(stuck),
                           sum(n for _, n in stuck), timeout)
            _abandoned.append((self.engine, self._tensors, getattr(self, "_buffer", None),
                               stuck, list(self._dropped)))
        else:
            self.engine.close()
        self._tensors = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
