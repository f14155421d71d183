/* The cluster tier's node-to-node messages (tier_internal.h, docs/cluster.md):
 * the checks a holder makes of a request and a reader of a reply before
 * reading their fields. */
#include "cluster/tier_internal.h"

/* The type of a well-formed message of `len` bytes, or 0 (with a message). */
int oi__cluster_msg_type(const uint8_t *m, size_t len, bool reply) {
  if (len < HDR_BYTES) return oi__fail(OI_ERR_PROTOCOL, "cluster: a message of %zu bytes", len), 0;
  if (get32(m) != MSG_MAGIC) return oi__fail(OI_ERR_PROTOCOL, "cluster: bad magic"), 0;
  if (get16(m + 4) != MSG_VERSION)
    return oi__fail(OI_ERR_PROTOCOL, "cluster: version %u (this node speaks %u)", get16(m + 4),
                    MSG_VERSION),
           0;
  int type = get16(m + 6);
  switch (type) {
  case MSG_LEASE: {
    if (reply || len < LEASE_BYTES(0)) break;
    uint32_t n = get32(m + HDR_BYTES + 16);
    if (n == 0 || n > OI_CLUSTER_MAX_LEASE || get32(m + HDR_BYTES + 20) != 0 ||
        len != LEASE_BYTES(n))
      return oi__fail(OI_ERR_PROTOCOL, "cluster: a LEASE of %u hashes in %zu bytes", n, len), 0;
    return type;
  }
  case MSG_RELEASE:
    if (reply || len != RELEASE_BYTES) break;
    return type;
  case MSG_LEASE_REPLY: {
    if (!reply || len < LEASE_REPLY_BYTES(0)) break;
    uint32_t m_ = get32(m + HDR_BYTES + 8);
    if (m_ > OI_CLUSTER_MAX_LEASE || get32(m + HDR_BYTES + 12) != 0 || len != LEASE_REPLY_BYTES(m_))
      return oi__fail(OI_ERR_PROTOCOL, "cluster: a lease reply of %u blocks in %zu bytes", m_, len),
             0;
    return type;
  }
  case MSG_RELEASE_REPLY:
    if (!reply || len != HDR_BYTES) break;
    return type;
  default: break;
  }
  return oi__fail(OI_ERR_PROTOCOL, "cluster: unexpected message type %d of %zu bytes", type, len),
         0;
}

oi_status oi__cluster_msg_check(const void *msg, size_t len) {
  if (!msg) return oi__fail(OI_ERR_PROTOCOL, "cluster: no message");
  return oi__cluster_msg_type(msg, len, false) ? OI_OK : OI_ERR_PROTOCOL;
}

oi_status oi__cluster_reply_check(const void *msg, size_t len) {
  if (!msg) return oi__fail(OI_ERR_PROTOCOL, "cluster: no reply");
  return oi__cluster_msg_type(msg, len, true) ? OI_OK : OI_ERR_PROTOCOL;
}
