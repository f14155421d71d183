/* The host tier as the layers above it see it: whole operations on a host's
 * blocks. Callers name blocks by (namespace, hash) and get back opaque
 * host_block handles; the locks, the index, the LRU lists, pins, counters
 * and instance ids stay inside lib/host (host_private.h, which nothing
 * outside lib/host includes).
 *
 * A save reserves slots (oi__host_reserve), copies into them, then ends
 * them (oi__host_save_end: sealed and visible, or aborted and freed). A
 * restore pins a prefix under a lease (oi__host_lease_prefix), takes the
 * lease for a load (oi__host_load_begin: the blocks are marked loading) and
 * ends the load (oi__host_load_end). Every host counter a step changes is
 * changed by that step. */
#ifndef OI_HOST_HOST_H
#define OI_HOST_HOST_H

#include "core/core.h"
#include "openinfer/host.h"

/* Slots are carved in multiples of this many bytes (a block of b bytes
 * takes b rounded up). */
#define OI_SLOT_ALIGN 256
#define OI_SECTOR_BYTES 4096u /* see oi__host_sector_slots */
#define OI_SECTOR_SLOT_MIN (64u * 1024u)

/* One slot of the pool (opaque here). */
typedef struct host_block host_block;

/* A namespace bound on a host: pass it back as it came. */
typedef struct oi_host_ns {
  uint32_t id;  /* 1-based */
  uint32_t cls; /* the size class of its blocks */
} oi_host_ns;

/* ---- instances and namespaces ---- */

/* A new instance id (never 0) for an engine registering on `h`; the host
 * counts it live until oi__host_instance_remove. */
uint32_t oi__host_instance_add(oi_offload_host *h);
/* Drops the instance's leases and its live mark. */
void oi__host_instance_remove(oi_offload_host *h, uint32_t instance);
/* Binds `name` to blocks of `block_bytes` and a layout shape (a namespace
 * keeps the first layout bound to it). Messages start with "register". */
oi_status oi__host_bind_namespace(oi_offload_host *h, const char *name, uint64_t block_bytes,
                                  uint64_t shape_hash, oi_host_ns *out);
/* The namespace bound to `name`, if any (nothing is bound). */
bool oi__host_find_namespace(oi_offload_host *h, const char *name, oi_host_ns *out);
/* Blocks of namespace `ns` in flight or sealed. */
uint64_t oi__host_ns_resident(const oi_offload_host *h, oi_host_ns ns);

/* ---- saves ---- */

/* Hashes (or blocks) per batch: each shard a batch touches is locked once. */
#define OI_BATCH 64

/* Where oi__host_reserve hands each outcome, as it goes (no host lock is
 * held during a call). */
typedef struct oi_host_reserve_sink {
  /* Slots in flight now hold hashes[idx[j]] for j < k (k <= OI_BATCH, in
   * the order of the hashes): blocks[j], whose bytes start at data[j]. Told
   * a batch at a time (a save appends a batch to its job at once). */
  void (*accepted)(void *ctx, const size_t *idx, host_block *const *blocks, uint8_t *const *data,
                   size_t k);
  /* hashes[i] deduplicated against a block still in flight (another save):
   * a flush should wait for it. May be NULL. */
  void (*in_flight)(void *ctx, size_t i);
  void *ctx;
} oi_host_reserve_sink;

typedef struct oi_host_reserved {
  size_t accepted;       /* slots reserved (in flight) */
  uint64_t deduplicated; /* hashes already held (sealed or in flight) */
  uint64_t dropped;      /* hashes without a slot (the pool is full of pinned blocks) */
} oi_host_reserved;

/* Reserves a slot in flight for each hash of `hashes` the namespace does not
 * hold yet, evicting least recently used blocks when the free slots run out.
 * A re-saved sealed block counts as a use. In-flight slots are invisible to
 * queries until sealed. */
void oi__host_reserve(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                      const oi_host_reserve_sink *sink, oi_host_reserved *out);
/* Ends reserved slots: ok, they are sealed (visible, evictable); otherwise
 * they are removed and freed (nothing partial is ever served). `bytes` and
 * `latency_ns` feed the statistics (latency only when n > 0). Wakes flushes
 * waiting in oi__host_wait_not_in_flight. */
void oi__host_save_end(oi_offload_host *h, oi_host_ns ns, host_block *const *blocks, size_t n,
                       bool ok, uint64_t bytes, uint64_t latency_ns);
/* Waits until (ns, hash) is no longer in flight (sealed, or dropped), or the
 * deadline passes. @return true when it is no longer in flight. */
bool oi__host_wait_not_in_flight(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hash,
                                 uint64_t deadline_ns);

/* ---- queries ---- */

/* Who may redeem a lease: any caller of the lease's namespace with the same
 * principal (0: the embedding process; the sidecar uses its peers' uids). */
typedef uint64_t oi_host_principal;

/* present[i] = whether hashes[i] is sealed; *hits counts them, *pending
 * (optional) the positions still in flight. No pins. */
void oi__host_membership(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                         uint8_t *present, uint64_t *hits, uint64_t *pending);
/* The longest sealed prefix of `hashes` and the run of blocks in flight
 * right after it, without pins or counters. */
void oi__host_prefix_probe(oi_offload_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                           uint64_t *sealed, uint64_t *pending);
/* Pins the longest sealed prefix of `hashes` under a lease created by
 * `instance` (0: none; the lease then lives until consumed, released or
 * expired) for `principal`, with `shares` consumers (*lease untouched when
 * *hits is 0). *pending (optional): the run of blocks in flight right after
 * the prefix. On failure nothing stays pinned and nothing is counted. */
oi_status oi__host_lease_prefix(oi_offload_host *h, oi_host_ns ns, uint32_t instance,
                                oi_host_principal principal, uint32_t shares,
                                const oi_block_hash *hashes, size_t n, uint64_t *hits,
                                uint64_t *pending, oi_lease *lease);
/* Drops a lease of namespace `ns` held for `principal` (PERMISSION when it
 * is another namespace's or another principal's). */
oi_status oi__host_release(oi_offload_host *h, oi_host_ns ns, oi_host_principal principal,
                           oi_lease lease);

/* ---- loads ---- */

/* Where oi__host_load_begin reports its progress (a load's copies can start
 * while later blocks are still being marked). */
typedef struct oi_host_load_sink {
  uint8_t **data; /* receives each block's bytes' address (read with its record) */
  /* Blocks [0, done) are marked loading and their addresses written. Runs
   * under the host's lease lock: it must not call into the host. May be NULL. */
  void (*ready)(void *ctx, size_t done);
  void *ctx;
} oi_host_load_sink;

/* Takes one share of `lease` for a load of n blocks by a caller of
 * namespace `ns` and `principal`: marks them loading (not evictable) and
 * writes them to out[0..n); with a sink, their addresses to sink->data as
 * it goes, telling sink->ready after every 1,024 blocks and at the end. */
oi_status oi__host_load_begin(oi_offload_host *h, oi_host_ns ns, oi_host_principal principal,
                              oi_lease lease, size_t n, host_block **out,
                              const oi_host_load_sink *sink);
/* Ends a load begun with oi__host_load_begin (drops the loading marks). */
void oi__host_load_end(oi_offload_host *h, host_block *const *blocks, size_t n, bool ok,
                       uint64_t bytes, uint64_t latency_ns);

/* Where a block's bytes live in the pool. */
uint8_t *oi__host_block_data(const oi_offload_host *h, const host_block *b);

/* ---- a lower tier (lib/disk, above this layer) ---- */

/* Attaches a lower tier to `h` (one per host): from now on every block
 * that seals is queued for it (oi__host_spill_take), and `destroy(ctx)`
 * runs first at the host's destroy (it must stop using the host). @return
 * OI_ERR_STATE when one is attached already. */
oi_status oi__host_attach_lower(oi_offload_host *h, void *ctx, void (*destroy)(void *ctx));
/* The attached lower tier's context (NULL: none). */
void *oi__host_lower(const oi_offload_host *h);

/* A sealed block handed to the lower tier: held (not evictable, its bytes
 * stable) until oi__host_spill_end. */
typedef struct oi_host_spill {
  host_block *block;
  uint32_t ns; /* namespace id (oi_host_ns.id) */
  oi_block_hash hash;
  const uint8_t *data;
  uint64_t bytes; /* the namespace's block bytes */
} oi_host_spill;

/* Takes up to `max` queued blocks, oldest seal first, waiting up to
 * timeout_ms for the first (0: no wait). Blocks evicted or already held by
 * the lower tier since they were queued are skipped. */
size_t oi__host_spill_take(oi_offload_host *h, oi_host_spill *out, size_t max, uint32_t timeout_ms);
/* Ends spills: ok[i], the lower tier holds spills[i]'s block now. The
 * blocks become evictable again at their place in LRU order (a spill is
 * not a use). */
void oi__host_spill_end(oi_offload_host *h, const oi_host_spill *spills, size_t n, const bool *ok);
/* Wakes oi__host_spill_take waiters (the lower tier is stopping). */
void oi__host_spill_wake(oi_offload_host *h);
/* In-flight blocks whose bytes come from the lower tier (a promotion): once
 * sealed they are not queued for it again. */
void oi__host_mark_lower(oi_offload_host *h, host_block *const *blocks, size_t n);
/* Blocks queued for the lower tier that were dropped because the queue was
 * full (their pool copy is the only one). */
uint64_t oi__host_spill_overflow(const oi_offload_host *h);
/* Blocks queued for the lower tier or taken and not ended yet: 0 means
 * every block queued so far has had its turn (written, or skipped). */
size_t oi__host_spill_backlog(oi_offload_host *h);
/* Size classes created from now on give blocks of OI_SECTOR_SLOT_MIN bytes
 * or more slots that start and end on OI_SECTOR_BYTES boundaries (relative
 * to the pool's base), so a lower tier's O_DIRECT I/O can use the slot
 * itself, padding included, with no bounce copy. */
void oi__host_sector_slots(oi_offload_host *h);
/* The slot bytes of namespace ns_id's blocks (>= its block bytes; the bytes
 * past the block are the slot's own, unused by loads); 0 when unknown. */
uint64_t oi__host_slot_bytes(oi_offload_host *h, uint32_t ns_id);

/* The name, block bytes and layout fingerprint of namespace `ns_id`; the
 * name is written into name[cap] (truncated). false: no such namespace. */
bool oi__host_namespace_info(oi_offload_host *h, uint32_t ns_id, char *name, size_t cap,
                             uint64_t *block_bytes, uint64_t *shape_hash);

/* ---- the pool ---- */

typedef struct oi_host_pool_info {
  uint64_t capacity_bytes;
  int device;          /* the pool's device ordinal (-1 cpu) */
  bool ready;          /* the pool's memory is set up */
  bool pin_requested;  /* created without OI_HOST_NO_PIN */
  bool device_mapped;  /* on a CUDA device, with a device address for the pool */
  void *base;          /* the pool's host memory (NULL until ready) */
  uint64_t bytes;      /* ...and its length */
  uint64_t slot_align; /* every slot starts at a multiple of this from base */
} oi_host_pool_info;

void oi__host_pool_info(const oi_offload_host *h, oi_host_pool_info *out);

/* A namespace's fingerprints across processes and nodes (its id is this
 * process's own): XXH3 of its name, and of its layout (the shape hash and
 * the block bytes). The disk and cluster tiers key blocks by them.
 * @return false when the namespace is unknown. */
bool oi__host_namespace_fps(oi_offload_host *h, uint32_t ns_id, uint64_t *ns_fp,
                            uint64_t *layout_fp, uint64_t *block_bytes);

/* ---- a watcher (lib/cluster, above this layer) ---- */

/* Told of every block that seals (visible to queries from now on) and of
 * every sealed block the pool evicts. Both run with host locks held, on
 * the thread that sealed or evicted: they must only note the fact (copy it
 * into a queue of their own) and return. */
typedef struct oi_host_watch {
  void (*sealed)(void *ctx, uint32_t ns, const oi_block_hash *hash);
  void (*evicted)(void *ctx, uint32_t ns, const oi_block_hash *hash);
  /* Runs first at the host's destroy (before the lower tier stops), after
   * the watcher was cleared: it must stop using the host. May be NULL. */
  void (*destroy)(void *ctx);
  void *ctx;
} oi_host_watch;

/* Sets the host's one watcher (copied), or clears it with NULL. @return
 * OI_ERR_STATE when setting one while another is set. Clearing waits for
 * calls in progress: after it returns none runs. */
oi_status oi__host_set_watch(oi_offload_host *h, const oi_host_watch *w);
/* The watcher's context (NULL: none). */
void *oi__host_watcher(oi_offload_host *h);
/* Calls fn for every sealed block, one shard at a time under its lock (fn
 * must only note the block). @return how many. */
size_t oi__host_foreach_sealed(oi_offload_host *h,
                               void (*fn)(void *ctx, uint32_t ns, const oi_block_hash *hash),
                               void *ctx);

#endif
