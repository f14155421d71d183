/* The hash chain (oi_hash_blocks) against a tiny independent
 * reimplementation (one-shot XXH3-128 over parent || tokens || salt, then the
 * canonical big-endian bytes written by hand), plus the chain's properties:
 * a prefix of the tokens hashes to a prefix of the hashes; hashing a suffix
 * from block j with parent = hash j-1 continues the chain; a short out_cap
 * writes that many, reports the full count and fails; argument errors. */
#include <xxhash.h>

#include "fuzz_util.h"
#include "openinfer/hash.h"

#define MAX_TOKENS 512

static void reference(const uint32_t *tokens, size_t n_tokens, uint32_t bs, const uint8_t *salt,
                      size_t salt_len, const oi_block_hash *parent, oi_block_hash *out) {
  uint8_t buf[16 + 4 * MAX_TOKENS + 64];
  oi_block_hash prev;
  memset(&prev, 0, sizeof prev);
  if (parent) prev = *parent;
  for (size_t b = 0; b < n_tokens / bs; b++) {
    size_t k = 0;
    memcpy(buf, prev.bytes, 16);
    k = 16;
    for (size_t i = 0; i < bs; i++) {
      uint32_t t = tokens[b * bs + i];
      buf[k++] = (uint8_t)t;
      buf[k++] = (uint8_t)(t >> 8);
      buf[k++] = (uint8_t)(t >> 16);
      buf[k++] = (uint8_t)(t >> 24);
    }
    memcpy(buf + k, salt, salt_len);
    k += salt_len;
    XXH128_hash_t v = XXH3_128bits(buf, k);
    for (int i = 0; i < 8; i++) {
      out[b].bytes[i] = (uint8_t)(v.high64 >> (56 - 8 * i));
      out[b].bytes[8 + i] = (uint8_t)(v.low64 >> (56 - 8 * i));
    }
    prev = out[b];
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f = {data, size, 0};
  uint32_t bs = 1 + fz_u8(&f) % 32;
  size_t salt_len = fz_u8(&f) % 65;
  uint8_t flags = fz_u8(&f);
  uint8_t salt[64];
  for (size_t i = 0; i < salt_len; i++)
    salt[i] = fz_u8(&f);
  oi_block_hash parent;
  for (int i = 0; i < 16; i++)
    parent.bytes[i] = fz_u8(&f);
  const oi_block_hash *par = (flags & 1) ? &parent : NULL;
  uint32_t tokens[MAX_TOKENS];
  size_t n = 0;
  while (!fz_done(&f) && n < MAX_TOKENS)
    tokens[n++] = (flags & 2) ? fz_u32(&f) : fz_u8(&f);
  size_t full = n / bs;

  oi_block_hash got[MAX_TOKENS], want[MAX_TOKENS];
  size_t n_out = 12345;
  oi_status st = oi_hash_blocks(n ? tokens : NULL, n, bs, salt_len ? salt : NULL, salt_len, par,
                                got, MAX_TOKENS, &n_out);
  FZ_ASSERT(st == OI_OK && n_out == full, "status %s, n_out %zu of %zu", oi_status_str(st), n_out,
            full);
  reference(tokens, n, bs, salt, salt_len, par, want);
  FZ_ASSERT(!full || !memcmp(got, want, full * sizeof *got), "differs from the reference");

  /* A prefix of the tokens gives a prefix of the chain. */
  size_t cut = full ? fz_u8(&f) % (n + 1) : 0;
  oi_block_hash pre[MAX_TOKENS];
  FZ_ASSERT(oi_hash_blocks(tokens, cut, bs, salt, salt_len, par, pre, MAX_TOKENS, &n_out) ==
                    OI_OK &&
                n_out == cut / bs,
            "prefix");
  FZ_ASSERT(!n_out || !memcmp(pre, got, n_out * sizeof *pre), "a prefix's chain differs");

  /* Continuing from block j with its parent continues the chain. */
  if (full > 1) {
    size_t j = 1 + (flags >> 2) % (full - 1);
    FZ_ASSERT(oi_hash_blocks(tokens + j * bs, n - j * bs, bs, salt, salt_len, &got[j - 1], pre,
                             MAX_TOKENS, &n_out) == OI_OK &&
                  n_out == full - j,
              "suffix");
    FZ_ASSERT(!memcmp(pre, got + j, (full - j) * sizeof *pre), "the continued chain differs");
  }

  /* A short out_cap: that many written, the full count reported, an error. */
  if (full > 0) {
    size_t cap = (flags >> 4) % full;
    oi_block_hash few[MAX_TOKENS];
    memset(few, 0xEE, sizeof few);
    st = oi_hash_blocks(tokens, n, bs, salt, salt_len, par, few, cap, &n_out);
    FZ_ASSERT(st == OI_ERR_INVALID_ARGUMENT && n_out == full, "short out_cap: %s",
              oi_status_str(st));
    FZ_ASSERT(!cap || !memcmp(few, got, cap * sizeof *few), "short out_cap wrote other hashes");
    FZ_ASSERT(few[cap].bytes[0] == 0xEE && few[cap].bytes[15] == 0xEE, "wrote past out_cap");
  }

  /* Argument errors. */
  FZ_ASSERT(oi_hash_blocks(tokens, n, 0, NULL, 0, NULL, got, MAX_TOKENS, &n_out) ==
                OI_ERR_INVALID_ARGUMENT,
            "block_size 0");
  FZ_ASSERT(oi_hash_blocks(tokens, n, bs, NULL, 0, NULL, got, MAX_TOKENS, NULL) ==
                OI_ERR_INVALID_ARGUMENT,
            "n_out NULL");
  if (n)
    FZ_ASSERT(oi_hash_blocks(NULL, n, bs, NULL, 0, NULL, got, MAX_TOKENS, &n_out) ==
                  OI_ERR_INVALID_ARGUMENT,
              "tokens NULL");
  if (salt_len)
    FZ_ASSERT(oi_hash_blocks(tokens, n, bs, NULL, salt_len, NULL, got, MAX_TOKENS, &n_out) ==
                  OI_ERR_INVALID_ARGUMENT,
              "salt NULL");
  oi_clear_error();
  return 0;
}
