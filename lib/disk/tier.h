/* The disk tier attached under a host's pool (tier.c), as the engine and the
 * server see it. The block store (disk.h) keeps blocks in files; this glue
 * feeds it from the host (a spiller thread writes sealed blocks, oldest
 * first, straight from their pool slots) and promotes stored blocks back
 * into pool slots when a query reaches past the pool's prefix.
 *
 * Write-behind, not write-on-evict: eviction never waits for a disk write.
 * A block is spilled some time after it seals; if the pool evicts it before
 * that (a burst of saves faster than the disk), its only copy is gone and
 * the disk simply does not have it (counted by the host as spill overflow
 * when the queue itself overflowed). */
#ifndef OI_DISK_TIER_H
#define OI_DISK_TIER_H

#include "disk/disk.h"
#include "host/host.h"
#include "openinfer/disk.h"

typedef struct disk_tier disk_tier;

/* The disk tier attached to `h` (NULL: none). */
disk_tier *oi__disk_tier_of(const oi_offload_host *h);

/* The block store under `t` (tests peek at what it holds: oi__disk_foreach,
 * oi__disk_contains). */
oi_disk *oi__disk_tier_store(disk_tier *t);

/* Starts reading the leading run of hashes[0..n) that the disk holds (and
 * the pool does not) into new pool slots of namespace `ns`, in order: those
 * blocks are in flight in the pool (a query sees them pending) and seal as
 * their reads verify; a block whose read fails is dropped (a miss).
 * @return how many reads started. */
size_t oi__disk_tier_promote(disk_tier *t, oi_host_ns ns, const oi_block_hash *hashes, size_t n);

/* present[i] |= whether the disk holds hashes[i] (sealed) in namespace `ns`;
 * @return how many positions it set that were 0. */
uint64_t oi__disk_tier_membership(disk_tier *t, oi_host_ns ns, const oi_block_hash *hashes,
                                  size_t n, uint8_t *present);

/* Waits until every block the pool queued for the disk so far has had its
 * turn (written, or skipped), up to timeout_ms. For tools and tests that
 * want "what the pool holds is on disk" before they evict it.
 * @return OI_OK, or OI_ERR_TIMEOUT with the backlog in the message. */
oi_status oi__disk_tier_settle(disk_tier *t, uint32_t timeout_ms);

#endif
