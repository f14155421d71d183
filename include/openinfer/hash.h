/*
 * libopeninfer — block hashing.
 *
 * Blocks are keyed by 16-byte hashes chosen by the caller; these helpers
 * compute the usual choice: a chain where each full block's hash covers its
 * parent's hash, the block's tokens and a salt, so equal hashes mean equal
 * prefixes.
 */
#ifndef OPENINFER_HASH_H
#define OPENINFER_HASH_H

#include "openinfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Chained hashes of the full blocks of a token sequence.
 *
 * Block i's hash is XXH3-128 over
 *   parent_i (16 bytes) || tokens[i*block_size .. (i+1)*block_size) as little-endian u32 || salt
 * where parent_0 is `parent` (or 16 zero bytes when NULL) and parent_i is
 * block i-1's hash. The 16 output bytes are the canonical (big-endian) form of
 * the XXH128 value. A partial tail block is not hashed.
 *
 * @param tokens      n_tokens token ids (may be NULL when n_tokens is 0)
 * @param block_size  tokens per block, > 0
 * @param salt        optional bytes mixed into every block (e.g. a LoRA or
 *                    model id); NULL with salt_len 0 for none
 * @param parent      hash of the block before tokens[0], or NULL at a start
 * @param out         receives min(n_tokens / block_size, out_cap) hashes
 * @param n_out       receives n_tokens / block_size (the full-block count),
 *                    even when out_cap is smaller
 * @return OI_OK; OI_ERR_INVALID_ARGUMENT on a NULL pointer or zero
 *         block_size; OI_ERR_OUT_OF_MEMORY never.
 *         When out_cap < the full-block count, the first out_cap hashes are
 *         written and OI_ERR_INVALID_ARGUMENT is returned with *n_out set. */
OI_API oi_status oi_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                                const void *salt, size_t salt_len, const oi_block_hash *parent,
                                oi_block_hash *out, size_t out_cap, size_t *n_out);

#ifdef __cplusplus
}
#endif
#endif
