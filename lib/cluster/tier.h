/* The cluster tier under a host (tier.c), an implementation of the host's
 * tier interface (host/tier.h), past the disk: every block the host seals
 * is published in the directory (directory.h) and withdrawn when evicted; a
 * query that reaches past the pool (and the disk) asks the directory who
 * holds the rest of its prefix (the tier's lookup) and fetches those blocks
 * from their holders over the peer transport (peer.h) into the pool slots
 * the host reserved (its promote), which seal only once each block's
 * checksum verified.
 *
 * Node to node, a holder answers two requests (little-endian, docs/cluster.md):
 * LEASE (a namespace by fingerprints, up to OI_CLUSTER_MAX_LEASE hashes) ->
 * the leading run it holds, pinned for the reader (offset in its pool,
 * length, XXH3 of the bytes) under a lease that expires on its own; and
 * RELEASE. The reader reads the bytes from the holder's pool. */
#ifndef OI_CLUSTER_TIER_H
#define OI_CLUSTER_TIER_H

#include "host/tier.h"

#define OI_CLUSTER_MAX_LEASE 1024u /* hashes in one LEASE */

typedef struct cluster_tier cluster_tier;

/* The cluster tier attached to `h` (NULL: none). */
cluster_tier *oi__cluster_tier_of(oi_host *h);

/* Message parsing, for the fuzz target and the tests: validates one
 * node-to-node request as the holder does before acting on it.
 * @return OI_OK, or OI_ERR_PROTOCOL with what is wrong. */
oi_status oi__cluster_msg_check(const void *msg, size_t len);
/* Likewise one reply (LEASE_REPLY, RELEASE_REPLY) as the reader does before
 * reading its fields: a LEASE_REPLY that passes is exactly 24 + 24 * m bytes
 * for its count m (at most OI_CLUSTER_MAX_LEASE), so the lease id, m and
 * every block's offset, length and XXH3 lie within len.
 * @return OI_OK, or OI_ERR_PROTOCOL with what is wrong. */
oi_status oi__cluster_reply_check(const void *msg, size_t len);

#endif
