/* The disk tier under a host's pool (tier.c): an implementation of the
 * host's tier interface (host/tier.h), nearest the pool, the one that takes
 * its spills. The block store (disk.h) keeps blocks in files; this glue
 * feeds it from the host (a spiller thread writes sealed blocks, oldest
 * first, straight from their pool slots), answers membership, and promotes
 * stored blocks into the pool slots the host reserves when a query reaches
 * past the pool's prefix.
 *
 * Write-behind, not write-on-evict: eviction never waits for a disk write.
 * A block is spilled some time after it seals; if the pool evicts it before
 * that (a burst of saves faster than the disk), its only copy is gone and
 * the disk simply does not have it (counted by the host as spill overflow
 * when the queue itself overflowed). */
#ifndef OI_DISK_TIER_H
#define OI_DISK_TIER_H

#include "disk/disk.h"
#include "host/tier.h"
#include "openinfer/disk.h"

typedef struct disk_tier disk_tier;

/* The disk tier attached to `h` (NULL: none). */
disk_tier *oi__disk_tier_of(const oi_host *h);

/* The block store under `t` (tests peek at what it holds: oi__disk_foreach,
 * oi__disk_contains). */
oi_disk *oi__disk_tier_store(disk_tier *t);

/* Waits until every block the pool queued for the disk so far has had its
 * turn (written, or skipped), up to timeout_ms. For tools and tests that
 * want "what the pool holds is on disk" before they evict it.
 * @return OI_OK, or OI_ERR_TIMEOUT with the backlog in the message. */
oi_status oi__disk_tier_settle(disk_tier *t, uint32_t timeout_ms);

#endif
