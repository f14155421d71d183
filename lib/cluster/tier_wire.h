/* The cluster tier's node-to-node messages (docs/cluster.md, "Under a
 * host"): a header of "OICL", the version and the type, then LEASE,
 * RELEASE and their replies. Described once, here: the tier (tier_msg.c,
 * tier_serve.c, tier_fetch.c) and the tests that speak it raw include it. */
#ifndef OI_CLUSTER_TIER_WIRE_H
#define OI_CLUSTER_TIER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "core/le_bytes.h"

#define MSG_MAGIC 0x4c43494fu /* "OICL" */
#define MSG_VERSION 1u
enum { MSG_LEASE = 1, MSG_RELEASE = 2, MSG_LEASE_REPLY = 0x81, MSG_RELEASE_REPLY = 0x82 };
#define HDR_BYTES 8u
#define LEASE_BYTES(n) (HDR_BYTES + 24u + 16u * (size_t)(n))
#define LEASE_REPLY_BYTES(m) (HDR_BYTES + 16u + 24u * (size_t)(m))
#define RELEASE_BYTES (HDR_BYTES + 8u)

static inline void put_hdr(uint8_t *p, uint16_t type) {
  put32(p, MSG_MAGIC);
  put16(p + 4, MSG_VERSION);
  put16(p + 6, type);
}

#endif
