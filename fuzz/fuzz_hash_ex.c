/* oi_hash_blocks_ex and the external-key mapping against a tiny independent
 * reimplementation (one-shot XXH3-128 over the documented input, canonical
 * bytes written by hand), plus their properties: with no extra key in reach
 * the chain is oi_hash_blocks'; an extra key on block k leaves blocks < k
 * alone and changes block k; continuing from block j with its parent and
 * the rest of the extra keys continues the chain; a struct_size that ends
 * before extra_keys ignores them; the batch mapping equals the single one;
 * argument errors write nothing.
 *
 * Input: block_size-1, salt_len, flags, n_extra, key_len, salt, parent (16),
 * then n_extra extra keys (a length byte % 17, then its bytes), then tokens
 * (u8 or u32 per flags). */
#include <stddef.h>
#include <xxhash.h>

#include "fuzz_util.h"
#include "openinfer/hash.h"

#define MAX_TOKENS 256
#define MAX_EXTRA 32
#define MAX_XLEN 16

static void canon(XXH128_hash_t v, oi_block_hash *out) {
  for (int i = 0; i < 8; i++) {
    out->bytes[i] = (uint8_t)(v.high64 >> (56 - 8 * i));
    out->bytes[8 + i] = (uint8_t)(v.low64 >> (56 - 8 * i));
  }
}

static void put_u64le(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static void reference(const uint32_t *tokens, size_t n_tokens, uint32_t bs, const uint8_t *salt,
                      size_t salt_len, const oi_block_hash *parent, const oi_block_extra_key *x,
                      size_t n_x, oi_block_hash *out) {
  uint8_t buf[16 + 4 * MAX_TOKENS + 64 + MAX_XLEN + 16];
  oi_block_hash prev;
  memset(&prev, 0, sizeof prev);
  if (parent) prev = *parent;
  for (size_t b = 0; b < n_tokens / bs; b++) {
    size_t k = 16;
    memcpy(buf, prev.bytes, 16);
    for (size_t i = 0; i < bs; i++) {
      uint32_t t = tokens[b * bs + i];
      buf[k++] = (uint8_t)t;
      buf[k++] = (uint8_t)(t >> 8);
      buf[k++] = (uint8_t)(t >> 16);
      buf[k++] = (uint8_t)(t >> 24);
    }
    memcpy(buf + k, salt, salt_len);
    k += salt_len;
    size_t xl = b < n_x ? x[b].len : 0;
    if (xl) {
      memcpy(buf + k, x[b].bytes, xl);
      k += xl;
      put_u64le(buf + k, salt_len);
      put_u64le(buf + k + 8, xl);
      k += 16;
      canon(XXH3_128bits_withSeed(buf, k, 0x6F692D786B657931ull), &out[b]);
    } else {
      canon(XXH3_128bits(buf, k), &out[b]);
    }
    prev = out[b];
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f = {data, size, 0};
  uint32_t bs = 1 + fz_u8(&f) % 16;
  size_t salt_len = fz_u8(&f) % 65;
  uint8_t flags = fz_u8(&f);
  size_t n_x = fz_u8(&f) % (MAX_EXTRA + 1);
  size_t key_len = fz_u8(&f) % (OI_BLOCK_KEY_MAX + 1);
  uint8_t salt[64];
  for (size_t i = 0; i < salt_len; i++)
    salt[i] = fz_u8(&f);
  oi_block_hash parent;
  for (int i = 0; i < 16; i++)
    parent.bytes[i] = fz_u8(&f);
  const oi_block_hash *par = (flags & 1) ? &parent : NULL;
  uint8_t xbytes[MAX_EXTRA][MAX_XLEN];
  oi_block_extra_key x[MAX_EXTRA];
  for (size_t i = 0; i < n_x; i++) {
    x[i].len = fz_u8(&f) % (MAX_XLEN + 1);
    for (size_t j = 0; j < x[i].len; j++)
      xbytes[i][j] = fz_u8(&f);
    /* len 0 with NULL or non-NULL bytes: both mean none. */
    x[i].bytes = x[i].len || (flags & 8) ? xbytes[i] : NULL;
  }
  size_t data_start = f.i;
  uint32_t tokens[MAX_TOKENS];
  size_t n = 0;
  while (!fz_done(&f) && n < MAX_TOKENS)
    tokens[n++] = (flags & 2) ? fz_u32(&f) : fz_u8(&f);
  size_t full = n / bs;

  oi_hash_blocks_args a;
  oi_hash_blocks_args_init(&a);
  a.block_size = bs;
  a.tokens = n ? tokens : NULL;
  a.n_tokens = n;
  a.salt = salt_len ? salt : NULL;
  a.salt_len = salt_len;
  a.parent = par;
  a.extra_keys = n_x ? x : NULL;
  a.n_extra_keys = n_x;

  oi_block_hash got[MAX_TOKENS], want[MAX_TOKENS], plain[MAX_TOKENS];
  size_t n_out = 12345;
  oi_status st = oi_hash_blocks_ex(&a, got, MAX_TOKENS, &n_out);
  FZ_ASSERT(st == OI_OK && n_out == full, "status %s, n_out %zu of %zu", oi_status_str(st), n_out,
            full);
  reference(tokens, n, bs, salt, salt_len, par, x, n_x, want);
  FZ_ASSERT(!full || !memcmp(got, want, full * sizeof *got), "differs from the reference");

  /* Blocks before the first extra key are oi_hash_blocks'; the first keyed
   * block differs from it (a 2^-128 chance aside). */
  FZ_ASSERT(oi_hash_blocks(a.tokens, n, bs, a.salt, salt_len, par, plain, MAX_TOKENS, &n_out) ==
                    OI_OK &&
                n_out == full,
            "plain");
  size_t first = 0;
  while (first < full && (first >= n_x || x[first].len == 0))
    first++;
  FZ_ASSERT(!first || !memcmp(got, plain, first * sizeof *got), "unkeyed prefix differs");
  if (first < full)
    FZ_ASSERT(memcmp(&got[first], &plain[first], sizeof *got) != 0, "extra key changed nothing");

  /* A caller struct that ends before extra_keys hashes as oi_hash_blocks. */
  oi_hash_blocks_args old = a;
  old.struct_size = (uint32_t)offsetof(oi_hash_blocks_args, extra_keys);
  oi_block_hash h[MAX_TOKENS];
  FZ_ASSERT(oi_hash_blocks_ex(&old, h, MAX_TOKENS, &n_out) == OI_OK && n_out == full, "old");
  FZ_ASSERT(!full || !memcmp(h, plain, full * sizeof *h), "an old struct differs from plain");

  /* Continuing from block j with its parent and extra keys j.. */
  if (full > 1) {
    size_t j = 1 + (flags >> 4) % (full - 1);
    oi_hash_blocks_args c = a;
    c.tokens = tokens + j * bs;
    c.n_tokens = n - j * bs;
    c.parent = &got[j - 1];
    c.extra_keys = j < n_x ? x + j : NULL;
    c.n_extra_keys = j < n_x ? n_x - j : 0;
    FZ_ASSERT(oi_hash_blocks_ex(&c, h, MAX_TOKENS, &n_out) == OI_OK && n_out == full - j, "suffix");
    FZ_ASSERT(!memcmp(h, got + j, (full - j) * sizeof *h), "the continued chain differs");
  }

  /* An extra key with NULL bytes is refused and nothing is written. */
  if (n_x && x[n_x - 1].len) {
    oi_block_extra_key saved = x[n_x - 1];
    x[n_x - 1].bytes = NULL;
    memset(h, 0xEE, sizeof h);
    n_out = 7;
    FZ_ASSERT(oi_hash_blocks_ex(&a, h, MAX_TOKENS, &n_out) == OI_ERR_INVALID_ARGUMENT &&
                  n_out == 0 && h[0].bytes[0] == 0xEE && h[0].bytes[15] == 0xEE,
              "NULL extra key bytes");
    x[n_x - 1] = saved;
  }

  /* The external-key mapping: the token bytes read as keys of key_len. */
  const uint8_t *kb = data + data_start;
  size_t avail = size - data_start;
  if (key_len == 0) {
    oi_block_hash one;
    FZ_ASSERT(oi_block_key_from_bytes(kb, 0, &one) == OI_ERR_INVALID_ARGUMENT, "key_len 0");
    FZ_ASSERT(oi_block_keys_from_bytes(kb, 0, 1, &one) == OI_ERR_INVALID_ARGUMENT, "keys 0");
  } else {
    size_t nk = avail / key_len < MAX_TOKENS ? avail / key_len : MAX_TOKENS;
    FZ_ASSERT(oi_block_keys_from_bytes(nk ? kb : NULL, key_len, nk, h) == OI_OK, "keys");
    for (size_t i = 0; i < nk; i++) {
      oi_block_hash one, ref;
      FZ_ASSERT(oi_block_key_from_bytes(kb + i * key_len, key_len, &one) == OI_OK, "key");
      canon(XXH3_128bits_withSeed(kb + i * key_len, key_len, 0x6F692D6B65792D31ull), &ref);
      FZ_ASSERT(!memcmp(&one, &ref, sizeof one), "key %zu differs from the reference", i);
      FZ_ASSERT(!memcmp(&h[i], &one, sizeof one), "batch key %zu differs from single", i);
    }
  }
  oi_clear_error();
  return 0;
}
