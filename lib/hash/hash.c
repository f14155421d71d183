/* Chained XXH3-128 block hashes and the external-key mapping (see
 * include/openinfer/hash.h). */
#include <stdbool.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "core/core.h"
#include "openinfer/hash.h"

/* Tokens are hashed as little-endian u32; on a big-endian host they would be
 * byte-swapped here. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "oi_hash_blocks assumes a little-endian host"
#endif

/* One XXH128 value as the 16 canonical (big-endian) bytes of a block hash. */
static void canonical(XXH128_hash_t v, oi_block_hash *out) {
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, v);
  memcpy(out->bytes, canon.digest, sizeof out->bytes);
}

/* The argument checks oi_hash_blocks and oi_hash_blocks_ex share; `what`
 * names the call in the message. Sets *n_out to the full-block count on
 * success. */
static oi_status check_chain(const char *what, const uint32_t *tokens, size_t n_tokens,
                             uint32_t block_size, const void *salt, size_t salt_len,
                             const oi_block_hash *out, size_t out_cap, size_t *full) {
  if (block_size == 0) return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: block_size is 0", what);
  if (n_tokens > 0 && !tokens)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: tokens is NULL with n_tokens %zu", what,
                    n_tokens);
  if (salt_len > 0 && !salt)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: salt is NULL with salt_len %zu", what, salt_len);
  *full = n_tokens / block_size;
  if (*full > 0 && out_cap > 0 && !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: out is NULL with out_cap %zu", what, out_cap);
  return OI_OK;
}

/* Hashes the first n full blocks into out (arguments already checked). Block
 * i takes extra key i when i < n_extra and its len > 0. */
static void chain(const uint32_t *tokens, uint32_t block_size, const void *salt, size_t salt_len,
                  const oi_block_hash *parent, const oi_block_extra_key *extra, size_t n_extra,
                  oi_block_hash *out, size_t n) {
  oi_block_hash prev;
  if (parent)
    prev = *parent;
  else
    memset(&prev, 0, sizeof prev);
  XXH3_state_t state;
  for (size_t i = 0; i < n; i++) {
    const oi_block_extra_key *x = i < n_extra && extra[i].len > 0 ? &extra[i] : NULL;
    if (x)
      XXH3_128bits_reset_withSeed(&state, OI_BLOCK_EXTRA_KEY_SEED);
    else
      XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, prev.bytes, sizeof prev.bytes);
    XXH3_128bits_update(&state, tokens + i * block_size, (size_t)block_size * sizeof(uint32_t));
    if (salt_len) XXH3_128bits_update(&state, salt, salt_len);
    if (x) {
      /* The two lengths, little-endian u64, make the encoding injective. */
      uint64_t lens[2] = {(uint64_t)salt_len, (uint64_t)x->len};
      XXH3_128bits_update(&state, x->bytes, x->len);
      XXH3_128bits_update(&state, lens, sizeof lens);
    }
    canonical(XXH3_128bits_digest(&state), &out[i]);
    prev = out[i];
  }
}

OI_API oi_status oi_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                                const void *salt, size_t salt_len, const oi_block_hash *parent,
                                oi_block_hash *out, size_t out_cap, size_t *n_out) {
  if (!n_out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks: n_out is NULL");
  *n_out = 0;
  size_t full = 0;
  oi_status st =
      check_chain("hash_blocks", tokens, n_tokens, block_size, salt, salt_len, out, out_cap, &full);
  if (st != OI_OK) return st;
  *n_out = full;
  size_t n = OI_MIN(full, out_cap);
  chain(tokens, block_size, salt, salt_len, parent, NULL, 0, out, n);
  if (n < full)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "hash_blocks: out_cap %zu is smaller than the %zu full blocks", out_cap, full);
  return OI_OK;
}

OI_API void oi_hash_blocks_args_init(oi_hash_blocks_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  args->struct_size = (uint32_t)sizeof *args;
}

OI_API oi_status oi_hash_blocks_ex(const oi_hash_blocks_args *args, oi_block_hash *out,
                                   size_t out_cap, size_t *n_out) {
  if (!n_out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks_ex: n_out is NULL");
  *n_out = 0;
  oi_hash_blocks_args a;
  oi_hash_blocks_args_init(&a);
  oi_status st = oi__struct_in(&a, sizeof a, args, "hash_blocks_ex");
  if (st != OI_OK) return st;
  size_t full = 0;
  st = check_chain("hash_blocks_ex", a.tokens, a.n_tokens, a.block_size, a.salt, a.salt_len, out,
                   out_cap, &full);
  if (st != OI_OK) return st;
  if (a.n_extra_keys > 0 && !a.extra_keys)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks_ex: extra_keys is NULL with %zu entries",
                    a.n_extra_keys);
  for (size_t i = 0; i < a.n_extra_keys; i++)
    if (a.extra_keys[i].len > 0 && !a.extra_keys[i].bytes)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "hash_blocks_ex: extra key %zu has NULL bytes with len %zu", i,
                      a.extra_keys[i].len);
  *n_out = full;
  size_t n = OI_MIN(full, out_cap);
  chain(a.tokens, a.block_size, a.salt, a.salt_len, a.parent, a.extra_keys, a.n_extra_keys, out, n);
  if (n < full)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "hash_blocks_ex: out_cap %zu is smaller than the %zu full blocks", out_cap,
                    full);
  return OI_OK;
}

OI_API oi_status oi_block_key_from_bytes(const void *key, size_t len, oi_block_hash *out) {
  if (len == 0 || len > OI_BLOCK_KEY_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "block_key_from_bytes: length %zu is not 1..%d", len,
                    OI_BLOCK_KEY_MAX);
  if (!key) return oi__fail(OI_ERR_INVALID_ARGUMENT, "block_key_from_bytes: key is NULL");
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "block_key_from_bytes: out is NULL");
  canonical(XXH3_128bits_withSeed(key, len, OI_BLOCK_KEY_SEED), out);
  return OI_OK;
}

OI_API oi_status oi_block_keys_from_bytes(const void *keys, size_t key_len, size_t n,
                                          oi_block_hash *out) {
  if (key_len == 0 || key_len > OI_BLOCK_KEY_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "block_keys_from_bytes: key_len %zu is not 1..%d",
                    key_len, OI_BLOCK_KEY_MAX);
  if (n == 0) return OI_OK;
  if (!keys)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "block_keys_from_bytes: keys is NULL with n %zu", n);
  if (!out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "block_keys_from_bytes: out is NULL with n %zu", n);
  if (n > SIZE_MAX / key_len)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "block_keys_from_bytes: n %zu keys of %zu bytes overflow the address space", n,
                    key_len);
  const uint8_t *k = keys;
  for (size_t i = 0; i < n; i++, k += key_len)
    canonical(XXH3_128bits_withSeed(k, key_len, OI_BLOCK_KEY_SEED), &out[i]);
  return OI_OK;
}
