/* Chained XXH3-128 block hashes (see include/openinfer/hash.h). */
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

OI_API oi_status oi_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                                const void *salt, size_t salt_len, const oi_block_hash *parent,
                                oi_block_hash *out, size_t out_cap, size_t *n_out) {
  if (!n_out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks: n_out is NULL");
  *n_out = 0;
  if (block_size == 0) return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks: block_size is 0");
  if (n_tokens > 0 && !tokens)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks: tokens is NULL with n_tokens %zu",
                    n_tokens);
  if (salt_len > 0 && !salt)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks: salt is NULL with salt_len %zu",
                    salt_len);
  size_t full = n_tokens / block_size;
  if (full > 0 && out_cap > 0 && !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "hash_blocks: out is NULL with out_cap %zu", out_cap);
  *n_out = full;

  oi_block_hash prev;
  if (parent)
    prev = *parent;
  else
    memset(&prev, 0, sizeof prev);
  size_t n = OI_MIN(full, out_cap);
  XXH3_state_t state;
  for (size_t i = 0; i < n; i++) {
    XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, prev.bytes, sizeof prev.bytes);
    XXH3_128bits_update(&state, tokens + i * block_size, (size_t)block_size * sizeof(uint32_t));
    if (salt_len) XXH3_128bits_update(&state, salt, salt_len);
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&state));
    memcpy(out[i].bytes, canon.digest, sizeof out[i].bytes);
    prev = out[i];
  }
  if (n < full)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "hash_blocks: out_cap %zu is smaller than the %zu full blocks", out_cap, full);
  return OI_OK;
}
