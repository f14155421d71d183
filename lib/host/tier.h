/* The tier chain: stores under a host's pool (the disk, the cluster, ...),
 * each behind one ops table, attached to the host in a fixed order, nearest
 * the pool first. The host drives them; a tier reaches the host only
 * through this header and host.h, and never another tier.
 *
 * What the host does with its chain:
 * - a query (oi__host_query) probes the pool once; past the pool's sealed
 *   prefix and the run in flight after it, it asks each tier in order for
 *   the leading run of the rest it holds (`lookup`), reserves pool slots for
 *   that run and hands them to the tier (`promote`), which fills them
 *   asynchronously and ends each with oi__tier_promote_end (the block seals,
 *   or its slot goes: a miss). The next tier starts past that run. A
 *   membership query ORs each tier's `contains` into the pool's answer.
 * - every block that seals and every sealed block the pool evicts is told
 *   to the tiers that listen (`sealed`, `evicted`);
 * - the one tier that takes spills (OI_TIER_SPILLS) is fed the pool's sealed
 *   blocks through the spill queue (oi__host_spill_take / _end), oldest seal
 *   first, and blocks it promoted or holds are not queued again;
 * - its stats and destroy (tiers that do not take spills go first, farthest
 *   first, at the host's destroy; the spilling tier last, once the host's
 *   maintenance thread stopped, so that it can drain its queue).
 *
 * Adding a tier is one new folder of lib/ that fills an oi_tier_ops and
 * calls oi__host_tier_attach from its public attach function. */
#ifndef OI_HOST_TIER_H
#define OI_HOST_TIER_H

#include "host/host.h"

/* A block's identity across processes and nodes, the one key of every
 * tier: its namespace by name (XXH3 of the name: namespace ids are this
 * process's own), its hash, and its layout's fingerprint (oi__host_namespace_fps). */
typedef struct oi_tier_key {
  uint64_t ns_fp;
  uint8_t hash[16];
  uint64_t layout_fp;
} oi_tier_key;

/* A tier's link in a host's chain (the host's; stable until the host is
 * destroyed). */
typedef struct oi_tier oi_tier;

/* A pool slot the host reserved, in flight, for keys[idx] of a promotion:
 * its block (for oi__tier_promote_end) and where its bytes go. */
typedef struct oi_tier_slot {
  size_t idx;
  host_block *block;
  uint8_t *data;
} oi_tier_slot;

/* The tier takes the pool's sealed blocks (the spill queue): one per host. */
#define OI_TIER_SPILLS 1u

/* What a tier implements. Every operation but destroy may run on any thread,
 * concurrently with the others. */
typedef struct oi_tier_ops {
  const char *name; /* "disk", "cluster": messages */
  uint32_t rank;    /* its place in the chain: a lower rank is nearer the pool */
  uint32_t flags;   /* OI_TIER_SPILLS */
  /* Where its blocks are, as queries answer it (oi_block_where: DISK,
   * REMOTE), and whose read-rate estimate its promotions feed. */
  uint32_t where;
  /* Membership of a batch: for each i with present[i] == 0 that the tier
   * holds, sets present[i] = 1. @return how many it set. NULL: a
   * membership query does not ask this tier (an answer would cost a round
   * trip). */
  uint64_t (*contains)(void *self, const oi_tier_key *keys, size_t n, uint8_t *present);
  /* The leading run of keys[0..n) the tier can promote now (it may cap n).
   * With a run, *claim may carry what promote needs of this lookup (who
   * holds each block); promote always follows a run, and takes the claim.
   * NULL: the tier never promotes. */
  size_t (*lookup)(void *self, const oi_tier_key *keys, size_t n, void **claim);
  /* Starts filling slots[0..k) (in flight in the pool, in prefix order) of
   * namespace `ns` with the blocks keys[slots[j].idx] of block_bytes each,
   * keys being the run its lookup answered (k may be 0: pool slots ran out,
   * or the pool got the blocks meanwhile). Each slot ends, on any thread,
   * now or later, with exactly one oi__tier_promote_end. Frees claim.
   * @return how many it started (the others it ended already). */
  size_t (*promote)(void *self, void *claim, oi_host_ns ns, uint64_t block_bytes,
                    const oi_tier_key *keys, const oi_tier_slot *slots, size_t k);
  /* Told of a block that sealed / a sealed block the pool evicted, with
   * host locks held, on the thread that sealed or evicted: note the fact
   * (copy it into a queue of the tier's own) and return. NULL: not told. */
  void (*sealed)(void *self, uint32_t ns, const oi_block_hash *hash);
  void (*evicted)(void *self, uint32_t ns, const oi_block_hash *hash);
  /* Writes the tier's public statistics into *out (the struct its public
   * stats call names, whole: the caller copies it out). May be NULL. */
  oi_status (*stats)(void *self, void *out);
  /* At the host's destroy, after the tier stopped being told of seals and
   * evictions: stops using the host (ends every promotion it started),
   * frees the tier. May be NULL. */
  void (*destroy)(void *self);
} oi_tier_ops;

/* ---- the chain ---- */

/* Links a tier into `h`'s chain at its rank (*out, optional: its link).
 * From now on queries walk it and it hears of seals and evictions. @return
 * OI_ERR_STATE when a tier of the same ops, or a second tier that takes
 * spills, is attached already; OI_ERR_OUT_OF_MEMORY. */
oi_status oi__host_tier_attach(oi_host *h, const oi_tier_ops *ops, void *self, oi_tier **out);
/* Unlinks a tier without destroying it (tests): from its return on it hears
 * of no seal or eviction; a query already walking may still call it, so the
 * caller keeps it alive until no query can be in progress. */
void oi__host_tier_detach(oi_host *h, oi_tier *t);
/* The `self` of the tier of `ops` attached to `h` (NULL: none). */
void *oi__host_tier_find(const oi_host *h, const oi_tier_ops *ops);
/* The tier of `ops`'s statistics into *out through its stats op. @return
 * OI_ERR_NOT_FOUND ("<what>: no <name> tier is attached") when none is. */
oi_status oi__host_tier_stats(const oi_host *h, const oi_tier_ops *ops, void *out,
                              const char *what);

/* Ends a promotion's slot: ok, the block seals (visible to queries; a
 * tier that takes spills holds it, so it is not queued for it); otherwise
 * its slot goes. A promotion is no save: the host counts the block sealed,
 * not among its saves; the tier counts `bytes` and `latency_ns` in its own
 * statistics (the host ignores them). */
void oi__tier_promote_end(oi_tier *t, oi_host_ns ns, host_block *block, bool ok, uint64_t bytes,
                          uint64_t latency_ns);

/* The keys of hashes[0..n) in namespace id `ns` (its fingerprints looked
 * up once), and its block bytes (optional). @return false when the
 * namespace is unknown. */
bool oi__tier_make_keys(oi_host *h, uint32_t ns, const oi_block_hash *hashes, size_t n,
                        oi_tier_key *keys, uint64_t *block_bytes);

/* A namespace's fingerprints across processes and nodes (its id is this
 * process's own): XXH3 of its name, and of its layout (the shape hash and
 * the block bytes). @return false when the namespace is unknown. */
bool oi__host_namespace_fps(oi_host *h, uint32_t ns_id, uint64_t *ns_fp, uint64_t *layout_fp,
                            uint64_t *block_bytes);
/* The name, block bytes and layout fingerprint of namespace `ns_id`; the
 * name is written into name[cap] (truncated). false: no such namespace. */
bool oi__host_namespace_info(oi_host *h, uint32_t ns_id, char *name, size_t cap,
                             uint64_t *block_bytes, uint64_t *shape_hash);
/* Calls fn for every sealed block, one shard at a time under its lock (fn
 * must only note the block). @return how many. */
size_t oi__host_foreach_sealed(oi_host *h,
                               void (*fn)(void *ctx, uint32_t ns, const oi_block_hash *hash),
                               void *ctx);

/* ---- the spill queue (the tier that takes spills) ---- */

/* Why a sealed block is not (yet) held by the spilling tier: kept on the
 * block, counted under it when the pool evicts the block (no silent loss). */
typedef enum oi_spill_fate {
  OI_SPILL_NONE = 0,         /* not for the tier (sealed before it was attached) */
  OI_SPILL_UNWRITTEN = 1,    /* queued: its write has not come (or was given back) */
  OI_SPILL_QUEUE_FULL = 2,   /* never queued: the spill queue was full */
  OI_SPILL_WRITE_FAILED = 3, /* its write failed (I/O error) */
  OI_SPILL_NO_ROOM = 4,      /* the tier had no room for it */
  OI_SPILL_FATES = 5
} oi_spill_fate;

/* A sealed block handed to the spilling tier: held (not evictable, its
 * bytes stable) until oi__host_spill_end. */
typedef struct oi_host_spill {
  host_block *block;
  uint32_t ns; /* namespace id (oi_host_ns.id) */
  oi_block_hash hash;
  const uint8_t *data;
  uint64_t bytes; /* the namespace's block bytes */
} oi_host_spill;

/* Takes up to `max` queued blocks, oldest seal first, waiting up to
 * timeout_ms for the first (0: no wait). Blocks evicted or already held by
 * the spilling tier since they were queued are skipped. */
size_t oi__host_spill_take(oi_host *h, oi_host_spill *out, size_t max, uint32_t timeout_ms);
/* Ends spills: ok[i], the spilling tier holds spills[i]'s block now. The
 * blocks become evictable again at their place in LRU order (a spill is
 * not a use). One not ok stays OI_SPILL_UNWRITTEN (see below). */
void oi__host_spill_end(oi_host *h, const oi_host_spill *spills, size_t n, const bool *ok);
/* Ends one spill that was not written, saying why (OI_SPILL_WRITE_FAILED,
 * OI_SPILL_NO_ROOM, OI_SPILL_UNWRITTEN): the cause it is counted under if
 * the pool evicts the block before another write reaches the tier. */
void oi__host_spill_end_unwritten(oi_host *h, const oi_host_spill *spill, oi_spill_fate why);
/* Blocks the pool evicted that the spilling tier never held, by cause:
 * lost[OI_SPILL_QUEUE_FULL] .. lost[OI_SPILL_NO_ROOM] (lost[0] is 0). */
void oi__host_spill_lost(const oi_host *h, uint64_t lost[OI_SPILL_FATES]);
/* Wakes oi__host_spill_take waiters (the spilling tier is stopping). */
void oi__host_spill_wake(oi_host *h);
/* Blocks queued for the spilling tier that were dropped because the queue
 * was full (their pool copy is the only one). */
uint64_t oi__host_spill_overflow(const oi_host *h);
/* Blocks queued for the spilling tier or taken and not ended yet: 0 means
 * every block queued so far has had its turn (written, or skipped). */
size_t oi__host_spill_backlog(oi_host *h);
/* Size classes created from now on give blocks of OI_SECTOR_SLOT_MIN bytes
 * or more slots that start and end on OI_SECTOR_BYTES boundaries (relative
 * to the pool's base), so a tier's O_DIRECT I/O can use the slot itself,
 * padding included, with no bounce copy. */
void oi__host_sector_slots(oi_host *h);
/* The slot bytes of namespace ns_id's blocks (>= its block bytes; the bytes
 * past the block are the slot's own, unused by loads); 0 when unknown. */
uint64_t oi__host_slot_bytes(oi_host *h, uint32_t ns_id);

#endif
