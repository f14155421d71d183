/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the peer transport's
 * challenge-response authentication (docs/cluster.md, "Peer transport"). */
#ifndef OI_CLUSTER_SHA256_H
#define OI_CLUSTER_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OI_SHA256_LEN 32
#define OI_SHA256_BLOCK 64

typedef struct oi_sha256 {
  uint32_t h[8];
  uint64_t bytes; /* message bytes so far */
  uint8_t buf[OI_SHA256_BLOCK];
  size_t fill;
} oi_sha256;

/* Whether the compression function runs on the CPU's SHA extensions.
 * force: -1 asks; 0 makes it use the portable code; 1 the extensions when
 * the CPU has them (the tests compare the two). */
bool oi__sha256_accelerated(int force);

void oi__sha256_init(oi_sha256 *s);
void oi__sha256_update(oi_sha256 *s, const void *data, size_t len);
void oi__sha256_final(oi_sha256 *s, uint8_t out[OI_SHA256_LEN]);
void oi__sha256(const void *data, size_t len, uint8_t out[OI_SHA256_LEN]);

/* HMAC-SHA256, incremental: init with the key, update with the message
 * parts, final. */
typedef struct oi_hmac_sha256 {
  oi_sha256 inner, outer;
} oi_hmac_sha256;

void oi__hmac_sha256_init(oi_hmac_sha256 *h, const void *key, size_t key_len);
void oi__hmac_sha256_update(oi_hmac_sha256 *h, const void *data, size_t len);
void oi__hmac_sha256_final(oi_hmac_sha256 *h, uint8_t out[OI_SHA256_LEN]);
void oi__hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
                     uint8_t out[OI_SHA256_LEN]);

/* Compares n bytes in time independent of where they differ: true when equal. */
int oi__ct_equal(const void *a, const void *b, size_t n);

#endif
