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
uint32_t oi__host_instance_add(oi_host *h);
/* Drops the instance's leases and its live mark. */
void oi__host_instance_remove(oi_host *h, uint32_t instance);
/* Binds `name` to blocks of `block_bytes` and a layout shape (a namespace
 * keeps the first layout bound to it). `block_bytes` are what the pool
 * stores per block; `logical_bytes` what a block is once decoded (a codec's
 * namespace stores frames of codec `codec`, an oi_codec_id: docs/codecs.md),
 * 0 for the same. Messages start with "register". */
oi_status oi__host_bind_namespace(oi_host *h, const char *name, uint64_t block_bytes,
                                  uint64_t shape_hash, uint64_t logical_bytes, int codec,
                                  oi_host_ns *out);
/* The namespace bound to `name`, if any (nothing is bound). */
bool oi__host_find_namespace(oi_host *h, const char *name, oi_host_ns *out);
/* Blocks of namespace `ns` in flight or sealed. */
uint64_t oi__host_ns_resident(const oi_host *h, oi_host_ns ns);

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
  /* Slots for a tier's promotion (tier.h), not a save: not counted among
   * the saves (submitted, deduplicated, dropped); they end with
   * oi__host_promote_end. */
  bool promotion;
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
void oi__host_reserve(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                      const oi_host_reserve_sink *sink, oi_host_reserved *out);
/* Ends reserved slots: ok, they are sealed (visible, evictable); otherwise
 * they are removed and freed (nothing partial is ever served). `bytes` and
 * `latency_ns` feed the statistics (latency only when n > 0). Wakes flushes
 * waiting in oi__host_wait_not_in_flight. */
void oi__host_save_end(oi_host *h, oi_host_ns ns, host_block *const *blocks, size_t n, bool ok,
                       uint64_t bytes, uint64_t latency_ns);
/* oi__host_save_end for slots a promotion reserved: sealed blocks count as
 * sealed, not as saves (completed, failed, bytes saved, save latency). */
void oi__host_promote_end(oi_host *h, oi_host_ns ns, host_block *const *blocks, size_t n, bool ok);
/* Waits until (ns, hash) is no longer in flight (sealed, or dropped), or the
 * deadline passes. @return true when it is no longer in flight. */
bool oi__host_wait_not_in_flight(oi_host *h, oi_host_ns ns, const oi_block_hash *hash,
                                 uint64_t deadline_ns);

/* ---- queries ---- */

/* Who may redeem a lease: any caller of the lease's namespace with the same
 * principal (0: the embedding process; the sidecar uses its peers' uids). */
typedef uint64_t oi_host_principal;

/* present[i] = whether hashes[i] is sealed; *hits counts them, *pending
 * (optional) the positions still in flight. No pins. */
void oi__host_membership(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                         uint8_t *present, uint64_t *hits, uint64_t *pending);
/* The longest sealed prefix of `hashes` and the run of blocks in flight
 * right after it, without pins or counters. */
void oi__host_prefix_probe(oi_host *h, oi_host_ns ns, const oi_block_hash *hashes, size_t n,
                           uint64_t *sealed, uint64_t *pending);
/* Pins the longest sealed prefix of `hashes` under a lease created by
 * `instance` (0: none; the lease then lives until consumed, released or
 * expired) for `principal`, with `shares` consumers (*lease untouched when
 * *hits is 0). *pending (optional): the run of blocks in flight right after
 * the prefix. On failure nothing stays pinned and nothing is counted. */
oi_status oi__host_lease_prefix(oi_host *h, oi_host_ns ns, uint32_t instance,
                                oi_host_principal principal, uint32_t shares,
                                const oi_block_hash *hashes, size_t n, uint64_t *hits,
                                uint64_t *pending, oi_lease *lease);
/* Drops a lease of namespace `ns` held for `principal` (PERMISSION when it
 * is another namespace's or another principal's). */
oi_status oi__host_release(oi_host *h, oi_host_ns ns, oi_host_principal principal, oi_lease lease);

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
oi_status oi__host_load_begin(oi_host *h, oi_host_ns ns, oi_host_principal principal,
                              oi_lease lease, size_t n, host_block **out,
                              const oi_host_load_sink *sink);
/* Ends a load begun with oi__host_load_begin (drops the loading marks). */
void oi__host_load_end(oi_host *h, host_block *const *blocks, size_t n, bool ok, uint64_t bytes,
                       uint64_t latency_ns);

/* Where a block's bytes live in the pool. */
uint8_t *oi__host_block_data(const oi_host *h, const host_block *b);

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

void oi__host_pool_info(const oi_host *h, oi_host_pool_info *out);

/* ---- queries over the tier chain (query.c) ---- */

/* A query of a host (a local engine's, oi_host_query's, the
 * server's lookups): the lease is created by `instance` (0: none) for
 * `principal` with `shares` consumers. */
typedef struct oi_host_query_args {
  uint32_t instance;
  oi_host_principal principal;
  uint32_t shares;
  bool membership;  /* present[i] for each hash, no lease (else the prefix) */
  uint8_t *present; /* n bytes, for a membership query */
  uint32_t wait_ms; /* a prefix query waits up to this long for the blocks in flight after
                     * its sealed prefix (0: no wait) */
  uint8_t *where;   /* optional, n bytes: where each block was found (oi_block_where) */
} oi_host_query_args;

typedef struct oi_host_answer {
  uint64_t hit_blocks;     /* the prefix leased (membership: the hashes present) */
  uint64_t pending_blocks; /* in flight right after the prefix (membership: anywhere) */
  oi_lease lease;          /* when hit_blocks > 0 (prefix queries) */
  bool loading;            /* a tier is promoting blocks of the pending run */
} oi_host_answer;

/* A query of namespace `ns`. Past the pool's sealed prefix and its run in
 * flight, each tier of the chain in order promotes the leading run it
 * holds of the rest (the pool probed once): those blocks are in flight in
 * the pool now (pending), and `loading` says so. With wait_ms, it then
 * waits (no pins held) until no block right after the sealed prefix is in
 * flight or wait_ms passes, and leases the prefix. A membership query
 * counts a block a tier holds (those with `contains`) as present. */
oi_status oi__host_query_ns(oi_host *h, oi_host_ns ns, const oi_host_query_args *a,
                            const oi_block_hash *hashes, size_t n, oi_host_answer *out);
/* As oi__host_query_ns by the namespace's name (one never bound misses
 * every block). */
oi_status oi__host_query(oi_host *h, const char *namespace_id, const oi_host_query_args *a,
                         const oi_block_hash *hashes, size_t n, oi_host_answer *out);
/* Releases a lease of `namespace_id` held for `principal`. */
oi_status oi__host_lookup_release(oi_host *h, const char *namespace_id, oi_host_principal principal,
                                  oi_lease lease);

#endif
