/*
 * libopeninfer — block hashing.
 *
 * Blocks are keyed by 16-byte hashes chosen by the caller; these helpers
 * compute the usual choice: a chain where each full block's hash covers its
 * parent's hash, the block's tokens and a salt, so equal hashes mean equal
 * prefixes. oi_hash_blocks_ex adds a per-block extra key (an image's content
 * hash, a LoRA id); oi_block_key_from_bytes maps keys an engine computed
 * itself (vLLM's block hashes) to block hashes.
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

/* External keys.
 *
 * An engine that already names its blocks (vLLM's request.block_hashes: 32-byte
 * sha256 digests, 16-byte xxh3-128 digests, or Python hash ints) maps each of
 * its keys to an oi_block_hash with these calls and uses the result wherever a
 * hash is expected (save, query). The mapping is XXH3-128 of the key bytes
 * with the seed OI_BLOCK_KEY_SEED, canonical (big-endian) output: another
 * function than oi_hash_blocks' seed-0 XXH3-128, so a mapped key and a chain
 * hash of the same bytes are unrelated values. The length is part of the
 * input (XXH3 mixes it in): "ab" and "ab\0" map apart.
 * External keys that are already chained (each covers its prefix, as vLLM's
 * do) stay chained: equal mapped hashes mean equal external keys, up to a
 * 128-bit collision (docs/api.md). */

/* Longest external key oi_block_key_from_bytes accepts, in bytes. */
#define OI_BLOCK_KEY_MAX 64
/* The XXH3 seed of the external-key mapping ("oi-key-1" read big-endian). */
#define OI_BLOCK_KEY_SEED 0x6F692D6B65792D31ull

/* Maps one external key of 1..OI_BLOCK_KEY_MAX bytes to an oi_block_hash.
 * @return OI_OK; OI_ERR_INVALID_ARGUMENT on a NULL key or out, len 0 or
 *         len > OI_BLOCK_KEY_MAX (out untouched). */
OI_API oi_status oi_block_key_from_bytes(const void *key, size_t len, oi_block_hash *out);

/* Maps n keys of key_len bytes each, packed back to back in `keys`
 * (n * key_len bytes), to out[0..n): out[i] is oi_block_key_from_bytes of key
 * i. n 0 (with a valid key_len) is OI_OK; keys and out may then be NULL.
 * @return OI_OK; OI_ERR_INVALID_ARGUMENT on key_len 0 or > OI_BLOCK_KEY_MAX,
 *         or a NULL keys or out with n > 0 (out untouched). */
OI_API oi_status oi_block_keys_from_bytes(const void *keys, size_t key_len, size_t n,
                                          oi_block_hash *out);

/* Per-block extra keys.
 *
 * One block's extra key: `len` bytes at `bytes` (the content hash of an image
 * whose tokens the block covers, a LoRA id, ...). len 0 means none (bytes may
 * then be NULL). */
typedef struct oi_block_extra_key {
  const void *bytes;
  size_t len;
} oi_block_extra_key;

/* The arguments of oi_hash_blocks_ex (struct_size-versioned: fill with
 * oi_hash_blocks_args_init, then set the fields). */
typedef struct oi_hash_blocks_args {
  uint32_t struct_size;
  /* Tokens per block, > 0 (the default 0 is refused). */
  uint32_t block_size;
  /* n_tokens token ids (NULL when n_tokens is 0). */
  const uint32_t *tokens;
  size_t n_tokens;
  /* Optional bytes mixed into every block; NULL with salt_len 0 for none. */
  const void *salt;
  size_t salt_len;
  /* Hash of the block before tokens[0], or NULL at a start. */
  const oi_block_hash *parent;
  /* NULL, or n_extra_keys entries: entry i is full block i's (of this call). */
  const oi_block_extra_key *extra_keys;
  size_t n_extra_keys;
} oi_hash_blocks_args;

/* The XXH3 seed of a block hashed with an extra key ("oi-xkey1" read
 * big-endian). */
#define OI_BLOCK_EXTRA_KEY_SEED 0x6F692D786B657931ull

/* Fills *args with defaults (no tokens, block_size 0, no salt, no parent, no
 * extra keys) and sets struct_size. NULL is ignored. */
OI_API void oi_hash_blocks_args_init(oi_hash_blocks_args *args);

/* Chained hashes of the full blocks of a token sequence, with an optional
 * extra key per block.
 *
 * A block without an extra key (index >= n_extra_keys, or an entry of len 0)
 * hashes exactly as in oi_hash_blocks. Block i with extra key E (len > 0) is
 * XXH3-128 with seed OI_BLOCK_EXTRA_KEY_SEED over
 *   parent_i (16) || block i's tokens as little-endian u32 || salt || E
 *     || salt_len as little-endian u64 || len(E) as little-endian u64
 * canonical (big-endian) output. parent_i chains as in oi_hash_blocks, so a
 * block's extra key reaches every later block's hash. Entries at or past the
 * full-block count (a partial tail's) are validated and otherwise ignored.
 * With no extra keys the result equals oi_hash_blocks'.
 *
 * @param out    receives min(full blocks, out_cap) hashes
 * @param n_out  receives the full-block count, even when out_cap is smaller
 * @return OI_OK; OI_ERR_INVALID_ARGUMENT on a NULL args or n_out, a
 *         struct_size below 4, block_size 0 (fields past the caller's
 *         struct_size keep their defaults), NULL tokens /
 *         salt / out / extra_keys with a non-zero count, an extra key with
 *         NULL bytes and len > 0 (nothing written); when out_cap is smaller
 *         than the full-block count, the first out_cap hashes are written and
 *         OI_ERR_INVALID_ARGUMENT is returned with *n_out set, as
 *         oi_hash_blocks does. OI_ERR_UNSUPPORTED when the caller's struct
 *         is larger than this library's and sets fields it does not know. */
OI_API oi_status oi_hash_blocks_ex(const oi_hash_blocks_args *args, oi_block_hash *out,
                                   size_t out_cap, size_t *n_out);

#ifdef __cplusplus
}
#endif
#endif
