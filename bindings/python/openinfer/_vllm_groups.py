"""Hybrid KV cache groups for openinfer.vllm (docs/vllm.md, "Hybrid KV cache
groups").

vLLM's hybrid KV cache manager gives a model whose layers attend differently
(full attention beside sliding-window attention) one KV cache group per kind,
each with block ids of its own. The connector keeps each group's blocks in a
namespace of its own (``<shard namespace>/g<i>of<G>-<kind>``, beside the
tensor/pipeline shard suffix), so a group's block is a block of its own,
sealed by the rank that writes it.

* A full-attention group saves every full block and a lookup needs the whole
  prefix of it.
* A sliding-window group of window W tokens saves, at each point the request
  reaches in a step, only the blocks vLLM keeps for attention there (those
  holding the last W - 1 tokens and the one being computed, as vLLM's
  SlidingWindowManager frees the rest); a lookup ending at block n needs
  exactly those blocks before n, and the blocks before them are never
  loaded (vLLM gives them the null block).

The scheduler promises the longest prefix n that every group of every shard
can serve: each namespace is asked for the blocks its group needs for n, and
a group that lacks one shortens n to before it (no shorter n whose window
held that block can be served either), until every namespace holds a lease
for exactly what n needs.

vLLM can only recompute a failed load of several groups through
``failed_recving`` (block ids are not unique across groups), which only
asynchronous loads have: hybrid groups need ``load_async``.
"""
import openinfer as oi
from openinfer import _config

from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

# spec classes that are a full-attention or a sliding-window group but whose
# blocks this connector cannot serve as such
_REFUSED = ("SinkFullAttentionSpec", "ChunkedLocalAttentionSpec", "CrossAttentionSpec",
            "EncoderOnlyAttentionSpec", "MambaSpec", "UniformTypeKVCacheSpecs")


class Group:
    """One KV cache group: its index, kind, window (tokens; None: full
    attention), the tokens vLLM keeps past the window, and its layers."""
    __slots__ = ("index", "kind", "window", "extra", "layers")

    def __init__(self, index, kind, window, extra, layers):
        self.index, self.kind, self.window, self.extra = index, kind, window, extra
        self.layers = list(layers)

    @property
    def suffix(self):
        return "full" if self.window is None else "swa%d" % self.window

    def first_needed(self, end_block, block_size):
        """The first block vLLM keeps (and a load must fill) for a prefix of
        end_block blocks: 0 for full attention; for a sliding window the
        block of the first token not skipped (vLLM's
        SlidingWindowManager.get_num_skipped_tokens)."""
        if self.window is None:
            return 0
        skipped = max(0, end_block * block_size - self.window + 1 - self.extra)
        return min(end_block, skipped // block_size)


def groups_of(kv_cache_config, block_size):
    """The groups of a KVCacheConfig (None or one group: one full group,
    the connector's single-group path). A group the connector cannot serve is
    refused (NotImplementedError naming the group, its spec and layers)."""
    gs = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    out = []
    for i, g in enumerate(gs):
        spec = g.kv_cache_spec
        name = type(spec).__name__
        layers = list(g.layer_names)

        def refuse(why):
            raise NotImplementedError(
                "openinfer.vllm: KV cache group %d of %d (%s, layers %s): %s; served: groups of "
                "full attention (FullAttentionSpec, MLAAttentionSpec) and sliding-window "
                "attention (SlidingWindowSpec) with the block size of cache_config (%d)"
                % (i, len(gs), name, ", ".join(layers[:3]) + (", ..." if len(layers) > 3
                                                              else ""), why, block_size))
        if name in _REFUSED or not isinstance(spec, (FullAttentionSpec, SlidingWindowSpec)):
            refuse("this kind of group is not supported")
        if getattr(spec, "block_size", block_size) != block_size:
            refuse("its block size is %d, not cache_config's %d (the block hashes are per "
                   "%d tokens)" % (spec.block_size, block_size, block_size))
        if isinstance(spec, SlidingWindowSpec):
            out.append(Group(i, "sliding_window", int(spec.sliding_window),
                             int(getattr(spec, "extra_retained_tokens", 0) or 0), layers))
        else:
            out.append(Group(i, "full", None, 0, layers))
    if len(out) <= 1:
        return None
    return out


def namespaces(shards, groups):
    """The namespace of every (shard, group), shard-major (index shard * G +
    group): ``<shard namespace>/g<i>of<G>-<full|swa<W>>``."""
    out = []
    for s in shards:
        for g in groups:
            ns = "%s/g%dof%d-%s" % (s, g.index, len(groups), g.suffix)
            if len(ns.encode()) > _config.NAMESPACE_MAX_BYTES:
                raise _config.ConfigError(
                    "openinfer.vllm: kv_connector_extra_config: option 'namespace' gives %r; "
                    "allowed: at most %d bytes with the KV cache group suffix (%r) that "
                    "hybrid models append: use a shorter namespace"
                    % (ns, _config.NAMESPACE_MAX_BYTES, ns[len(s):]), "namespace", s)
            out.append(ns)
    return out


def check_options(opts, given):
    """Options a hybrid model cannot be served with (ValueError naming it).
    load_async not given (`given`: kv_connector_extra_config as written):
    true for a hybrid model, so a configuration that served it before
    hybrid groups existed (as one group) still starts."""
    if "load_async" not in (given or {}):
        opts.load_async = True
        return
    if not opts.load_async:
        raise ValueError(
            "openinfer.vllm: kv_connector_extra_config: option 'load_async' is false but the "
            "model has several KV cache groups (hybrid); allowed: true -- vLLM recomputes a "
            "failed load of several groups only through failed_recving, which synchronous "
            "loads do not have (or turn vLLM's hybrid KV cache manager off, "
            "--disable-hybrid-kv-cache-manager, for one group of every layer)")


def lookup(conn, block_hashes, first, req_id, keys):
    """The longest prefix of block_hashes (which start at block `first` of
    the request) that every (shard, group) namespace can serve, leased in
    each: (n, [raw lease per namespace, shard-major]) or (0, None); raises
    what conn._query_shard raises (the caller's lookup-failure handling).
    Leases taken for a longer prefix are released."""
    groups, bs = conn._groups, conn._block_size
    G = len(groups)
    total = len(conn._shards)
    n = len(block_hashes)
    held = [None] * total  # (lo, hi, raw): the lease covers block_hashes[lo:hi]

    def rel_lo(g, n):
        return max(0, g.first_needed(first + n, bs) - first)

    try:
        while n > 0:
            short = False
            for i in range(total):
                g = groups[i % G]
                lo = rel_lo(g, n)
                if held[i] is not None and held[i][:2] == (lo, n):
                    continue
                if held[i] is not None:
                    conn._release_shard(i, held[i][2])
                    held[i] = None
                hit, raw = conn._query_shard(i, keys(block_hashes[lo:n]), req_id)
                where = getattr(conn, "_where", None)
                if lo and where is not None and where[i] is not None:
                    # the restore plan reads where each block of the prefix is, from
                    # block 0: the blocks before a window are none of this group's
                    where[i] = ["pool"] * lo + list(where[i])
                if raw is not None:
                    held[i] = (lo, lo + hit, raw)
                if hit < n - lo:  # block lo + hit is missing: no n' > lo + hit is served
                    n, short = lo + hit, True
                    if n == 0:
                        break
            if not short:
                break
    except BaseException:
        release(conn, [h[2] if h else None for h in held])
        raise
    if n == 0:
        release(conn, [h[2] if h else None for h in held])
        return 0, None
    return n, [h[2] for h in held]


def release(conn, leases):
    for i, raw in enumerate(leases or ()):
        if raw is not None:
            conn._release_shard(i, raw)


def load_targets(groups, group_ids, first, n, block_size):
    """Per group, the block ids a load of blocks [first, first + n) fills
    (a sliding-window group: only those vLLM keeps), or None when vLLM did
    not give a block one of them needs (a null or missing block)."""
    out = []
    for g in groups:
        ids = group_ids[g.index] if g.index < len(group_ids) else []
        lo = max(first, g.first_needed(first + n, block_size))
        dst = list(ids[lo:first + n])
        if len(dst) != first + n - lo or any(b == 0 for b in dst):  # 0: vLLM's null block
            return None
        out.append(dst)
    return out


def save_plan(groups, group_ids, hashes, saved_upto, full, block_size):
    """Per group, (block ids, keys) of the blocks [saved_upto, full) to save
    this step: every block of a full group; of a sliding-window group only
    those vLLM keeps at `full` (the window the next token attends to)."""
    out = []
    for g in groups:
        ids = group_ids[g.index] if g.index < len(group_ids) else []
        lo = max(saved_upto, g.first_needed(full, block_size))
        hi = min(full, len(ids))
        sel = [(ids[b], hashes[b]) for b in range(lo, hi) if ids[b] != 0]
        out.append(([b for b, _ in sel], [h for _, h in sel]))
    return out


class GroupTicket:
    """A load over several groups: one ticket per group's worker."""

    def __init__(self, tickets):
        self.tickets = tickets  # [(worker, ticket)]
        self.results = {}  # index -> a settled group's result (its ticket is closed)

    def done(self):
        return all(i in self.results or t.done() for i, (_, t) in enumerate(self.tickets))

    @property
    def fencing(self):
        return any(i not in self.results and t.fencing
                   for i, (_, t) in enumerate(self.tickets))


class GroupWorkers:
    """A KVWorker per group of one rank, with the one KVWorker's interface
    that the connector uses (a layer is routed to its group's worker)."""

    def __init__(self, workers, groups):
        self.workers = workers  # one per group, in group order
        self.groups = groups
        self._of_layer = {}
        for w, g in zip(workers, groups):
            for name in g.layers:
                self._of_layer[name] = w
        self._step_bytes = 0
        self._step_blocks = 0

    @property
    def num_arenas(self):
        return sum(w.num_arenas for w in self.workers)

    @property
    def codec(self):
        """The groups' codec: one for the connector (its `codec` option)."""
        return self.workers[0].codec if self.workers else "none"

    def stats(self):
        """The groups' engines' counters, summed (the connector reads their
        saves_not_encoded after each step's saves)."""
        out = {}
        for w in self.workers:
            for k, v in w.stats().items():
                if isinstance(v, int) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        return out

    @property
    def load_deadline_s(self):
        return max(w.load_deadline_s for w in self.workers)

    @property
    def save_deadline_s(self):
        return max(w.save_deadline_s for w in self.workers)

    def begin_groups(self, saves):
        """saves: per group (block ids, 16-byte keys as bytes)."""
        self._step_bytes = self._step_blocks = 0
        for w, (ids, hs) in zip(self.workers, saves):
            w.begin_step(ids, oi.BlockHashes(hs))
            batch = w._save_batch
            if batch:
                self._step_blocks += len(batch[0])
                self._step_bytes += len(batch[0]) * w.layout.block_bytes

    def step_saves(self):
        """(blocks, bytes) the step's saves cover (one group's block each)."""
        return self._step_blocks, self._step_bytes

    def save_layer(self, name):
        w = self._of_layer.get(name)
        if w is not None:
            w.save_layer(name)

    def finish_step(self):
        err = None
        for w in self.workers:
            try:
                w.finish_step()
            except oi.Error as e:
                err = err or e
        if err is not None:
            raise err

    def wait_saves(self):
        errors = []
        for w in self.workers:
            errors.extend(w.wait_saves())
        return errors

    def counters(self):
        out = {}
        for w in self.workers:
            for k, v in w.counters().items():
                out[k] = out.get(k, 0) + v if isinstance(v, (int, float)) else v
        return out

    def load(self, leases, group_block_ids):
        """A load of each group's leased blocks into its block ids; one group
        refused at submit refuses the whole load (the others are settled)."""
        started = []
        try:
            for w, lease, ids in zip(self.workers, leases, group_block_ids):
                started.append((w, w.load(lease, ids)))
        except oi.Error:
            for w, t in started:
                w.settle_load(t, w.load_deadline_s)
            raise
        return GroupTicket(started)

    def load_bytes(self, group_block_ids):
        return sum(len(ids) * w.layout.block_bytes
                   for w, ids in zip(self.workers, group_block_ids))

    def wait_layer(self, ticket, name, timeout=None):
        w = self._of_layer.get(name)
        for i, (tw, t) in enumerate(ticket.tickets):
            if tw is w and i not in ticket.results:
                w.wait_layer(t, name, timeout)

    def settle_load(self, ticket, timeout=0):
        """None while any group's load is not final; else True when every
        group's landed, or the first error."""
        import time
        end = time.monotonic() + (timeout or 0)
        out = True
        for i, (w, t) in enumerate(ticket.tickets):
            res = ticket.results.get(i)
            if res is None:
                res = w.settle_load(t, max(0.0, end - time.monotonic()))
                if res is None:
                    return None
                ticket.results[i] = res
            if res is not True and out is True:
                out = res
        return out

    def close(self, timeout=None):
        for w in self.workers:
            w.close(timeout=timeout)
