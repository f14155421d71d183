/* The peer transport's handshake messages (peer_wire.h): their parsers,
 * which the tests drive directly, and the MAC that proves the secret. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cluster/peer_internal.h"

void oi__peer_handshake_mac(const oi_peer_net *net, const oi_peer *p, bool client_proof,
                            uint8_t out[OI_SHA256_LEN]) {
  static const char client_label[] = "openinfer peer v1 client";
  static const char server_label[] = "openinfer peer v1 server";
  const uint8_t *nc = p->outbound ? p->nonce_mine : p->nonce_theirs;
  const uint8_t *ns = p->outbound ? p->nonce_theirs : p->nonce_mine;
  const char *idc = p->outbound ? net->node_id : p->id;
  uint8_t lc = p->outbound ? net->id_len : p->id_len;
  const char *ids = p->outbound ? p->id : net->node_id;
  uint8_t ls = p->outbound ? p->id_len : net->id_len;
  oi_hmac_sha256 h;
  oi__hmac_sha256_init(&h, net->secret, net->secret_len);
  if (client_proof)
    oi__hmac_sha256_update(&h, client_label, sizeof(client_label));
  else
    oi__hmac_sha256_update(&h, server_label, sizeof(server_label));
  oi__hmac_sha256_update(&h, nc, NONCE);
  oi__hmac_sha256_update(&h, ns, NONCE);
  oi__hmac_sha256_update(&h, &lc, 1);
  oi__hmac_sha256_update(&h, idc, lc);
  oi__hmac_sha256_update(&h, &ls, 1);
  oi__hmac_sha256_update(&h, ids, ls);
  oi__hmac_sha256_final(&h, out);
}

oi_status oi__peer_parse_hello(const uint8_t *d, size_t len, uint8_t nonce[OI_PEER_NONCE],
                               char id[OI_PEER_MAX_NODE_ID + 1], size_t *id_len) {
  if (len < OI_PEER_HELLO_FIXED)
    return oi__fail(OI_ERR_PROTOCOL, "short handshake message (%zu bytes)", len);
  if (get32(d) != OI_PEER_MAGIC)
    return oi__fail(OI_ERR_PROTOCOL, "bad handshake magic 0x%08x", get32(d));
  if (get16(d + 4) != OI_PEER_VERSION)
    return oi__fail(OI_ERR_VERSION, "peer protocol version %u, this node speaks %u", get16(d + 4),
                    OI_PEER_VERSION);
  size_t idl = get16(d + 6);
  if (idl == 0 || idl > OI_PEER_MAX_NODE_ID || len != OI_PEER_HELLO_FIXED + idl ||
      memchr(d + OI_PEER_HELLO_FIXED, 0, idl))
    return oi__fail(OI_ERR_PROTOCOL, "bad node id (length %zu, message %zu bytes)", idl, len);
  memcpy(nonce, d + 8, NONCE);
  memcpy(id, d + OI_PEER_HELLO_FIXED, idl);
  id[idl] = 0;
  *id_len = idl;
  return OI_OK;
}

oi_status oi__peer_parse_auth(const uint8_t *d, size_t len, const uint8_t **mac) {
  if (len != 4 + OI_SHA256_LEN || get32(d) != OI_PEER_MAGIC)
    return oi__fail(OI_ERR_PROTOCOL, "bad authentication message (%zu bytes)", len);
  *mac = d + 4;
  return OI_OK;
}

oi_status oi__peer_parse_welcome(const uint8_t *d, size_t len,
                                 const uint8_t want_mac[OI_PEER_MAC_LEN], oi_peer_welcome *out) {
  if (len < OI_PEER_WELCOME_FIXED || get32(d) != OI_PEER_MAGIC)
    return oi__fail(OI_ERR_PROTOCOL, "bad welcome message (%zu bytes)", len);
  if (want_mac && !oi__ct_equal(want_mac, d + 4, OI_SHA256_LEN))
    return oi__fail(OI_ERR_PERMISSION, "the welcome's MAC does not prove the cluster secret");
  uint64_t base = get64(d + 4 + OI_SHA256_LEN), rlen = get64(d + 12 + OI_SHA256_LEN);
  uint32_t klen = get32(d + 20 + OI_SHA256_LEN), flags = get32(d + 24 + OI_SHA256_LEN);
  if (klen > MAX_RKEY || len != OI_PEER_WELCOME_FIXED + klen || (flags & ~OI_PEER_WELCOME_RMA) ||
      !(flags & OI_PEER_WELCOME_RMA) != !klen || base + rlen < base)
    return oi__fail(OI_ERR_PROTOCOL, "bad region descriptor (base 0x%llx, %llu bytes, key %u)",
                    (unsigned long long)base, (unsigned long long)rlen, klen);
  *out = (oi_peer_welcome){.mac = d + 4,
                           .base = base,
                           .len = rlen,
                           .rkey = d + OI_PEER_WELCOME_FIXED,
                           .rkey_len = klen,
                           .flags = flags};
  return OI_OK;
}
