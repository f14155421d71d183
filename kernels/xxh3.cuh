// XXH3-64 of long inputs (over 240 bytes) on the GPU, equal to libxxhash's
// XXH3_64bits and XXH3_64bits_withSeed (the format is XXH3's specification:
// stripes of 64 bytes, blocks of 16 stripes, eight 64-bit accumulators
// scrambled after each block).
//
// A block's sum for each accumulator does not depend on the accumulators:
// a warp reads a 1 KiB block in four coalesced loads a lane (lane L the
// words L, L+32, L+64, L+96: word L & 7 of four stripes), each lane adds its
// data words and products, and seven shuffles give lane a (a < 8, and its
// copies at a + 8, a + 16, a + 24) accumulator a's sum. So every block's
// sums are computed at once, by as many warps as there are blocks, and only
// the scramble is a chain: a lane-local multiply per block.
#pragma once
#include <stdint.h>

#define OI_XXH_SECRET_BYTES 192
#define OI_XXH_P32_1 0x9E3779B1u
#define OI_XXH_P32_2 0x85EBCA77u
#define OI_XXH_P32_3 0xC2B2AE3Du
#define OI_XXH_P64_1 0x9E3779B185EBCA87ull
#define OI_XXH_P64_2 0xC2B2AE3D27D4EB4Full
#define OI_XXH_P64_3 0x165667B19E3779F9ull
#define OI_XXH_P64_4 0x85EBCA77C2B2AE63ull
#define OI_XXH_P64_5 0x27D4EB2F165667C5ull

__device__ static inline uint64_t xxh_rd64u(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

__device__ static inline uint64_t xxh_fold64(uint64_t a, uint64_t b) {
  return a * b ^ __umul64hi(a, b);
}

__device__ static inline uint64_t xxh_avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ull;
  return h ^ h >> 32;
}

// XXH3-64 of 32 bytes (8-byte aligned), the default secret, seed 0.
__device__ static inline uint64_t xxh3_32(const uint8_t *in, const uint8_t *sec) {
  const uint64_t *w = reinterpret_cast<const uint64_t *>(in);
  uint64_t acc = 32 * OI_XXH_P64_1;
  acc += xxh_fold64(w[0] ^ xxh_rd64u(sec), w[1] ^ xxh_rd64u(sec + 8));
  acc += xxh_fold64(w[2] ^ xxh_rd64u(sec + 16), w[3] ^ xxh_rd64u(sec + 24));
  return xxh_avalanche(acc);
}

// The secret of a seed: XXH3_initCustomSecret (even words + seed, odd words
// - seed). The warp writes `out` (192 bytes, 8-byte aligned).
__device__ static inline void xxh3_seed_secret(const uint8_t *def, uint64_t seed, uint8_t *out,
                                               unsigned lane) {
  if (lane < OI_XXH_SECRET_BYTES / 8) {
    uint64_t v = xxh_rd64u(def + 8 * lane);
    reinterpret_cast<uint64_t *>(out)[lane] = lane & 1 ? v - seed : v + seed;
  }
  __syncwarp();
}

// One lane's part of stripes' accumulation: `mine` to accumulator L & 7,
// `swap` to accumulator (L & 7) ^ 1.
__device__ static inline void xxh_word(uint64_t dv, uint64_t key, uint64_t &mine, uint64_t &swap) {
  uint64_t dk = dv ^ key;
  swap += dv;
  mine += (uint64_t)(uint32_t)dk * (dk >> 32);
}

// Lane a of each group of 8 gets accumulator a's sum of the warp's parts.
__device__ static inline uint64_t xxh_sum(uint64_t mine, uint64_t swap) {
  mine += __shfl_xor_sync(0xffffffffu, mine, 8);
  mine += __shfl_xor_sync(0xffffffffu, mine, 16);
  swap += __shfl_xor_sync(0xffffffffu, swap, 8);
  swap += __shfl_xor_sync(0xffffffffu, swap, 16);
  return mine + __shfl_xor_sync(0xffffffffu, swap, 1);
}

// A long input's hash in two steps, so that many warps share one input:
// xxh3_block_sums (a warp a 1 KiB block, any number at once) writes each
// whole block's eight accumulator sums, then xxh3_finish (a warp an input)
// runs the scramble chain over them, the last partial block and the last
// stripe, and merges. An input: len > 240 bytes at src (8-byte aligned),
// its secret (192 bytes, 8-byte aligned: the default one or a seed's), its
// sums (64 bytes per whole block: (len - 1) / 1024 of them).
struct xxh_job {
  const uint8_t *src, *secret;
  uint64_t *sums;
  uint64_t len;
};

__host__ __device__ static inline uint64_t xxh3_whole_blocks(uint64_t len) {
  return (len - 1) / 1024;
}

// The sums of whole block j of the input (every lane of the warp calls it).
__device__ static inline void xxh3_block_sums(const xxh_job &jb, uint64_t j, unsigned lane) {
  const uint64_t *sw = reinterpret_cast<const uint64_t *>(jb.secret);
  const unsigned a = lane & 7, s0 = lane >> 3; // word a of stripes s0, s0 + 4, s0 + 8, s0 + 12
  const uint64_t *w = reinterpret_cast<const uint64_t *>(jb.src) + j * 128;
  uint64_t v[4], mine = 0, swap = 0;
#pragma unroll
  for (int k = 0; k < 4; k++)
    v[k] = w[lane + 32 * k];
#pragma unroll
  for (int k = 0; k < 4; k++)
    xxh_word(v[k], sw[s0 + 4 * k + a], mine, swap);
  const uint64_t sum = xxh_sum(mine, swap);
  if (lane < 8) jb.sums[j * 8 + lane] = sum;
}

__device__ static inline uint64_t xxh_scramble(uint64_t acc, uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * OI_XXH_P32_1;
}

#define XXH_AHEAD 16

// The input's hash, its whole blocks' sums written (every lane of the warp
// calls it and gets the hash).
__device__ static uint64_t xxh3_finish(const xxh_job &jb, unsigned lane) {
  const uint64_t *sw = reinterpret_cast<const uint64_t *>(jb.secret);
  const unsigned a = lane & 7, s0 = lane >> 3;
  const uint64_t init[8] = {OI_XXH_P32_3, OI_XXH_P64_1, OI_XXH_P64_2, OI_XXH_P64_3,
                            OI_XXH_P64_4, OI_XXH_P32_2, OI_XXH_P64_5, OI_XXH_P32_1};
  uint64_t acc = init[a];
  const uint64_t scramble = sw[16 + a], nb = xxh3_whole_blocks(jb.len);
  // the chain, each lane accumulator a's, loads XXH_AHEAD blocks ahead
  const uint64_t *sp = jb.sums + a;
  uint64_t cur[XXH_AHEAD];
#pragma unroll
  for (int t = 0; t < XXH_AHEAD; t++)
    cur[t] = (uint64_t)t < nb ? sp[t * 8] : 0;
  for (uint64_t j = 0; j < nb; j += XXH_AHEAD) {
    uint64_t nxt[XXH_AHEAD];
#pragma unroll
    for (int t = 0; t < XXH_AHEAD; t++)
      nxt[t] = j + XXH_AHEAD + t < nb ? sp[(j + XXH_AHEAD + t) * 8] : 0;
#pragma unroll
    for (int t = 0; t < XXH_AHEAD; t++)
      if (j + t < nb) acc = xxh_scramble(acc + cur[t], scramble);
#pragma unroll
    for (int t = 0; t < XXH_AHEAD; t++)
      cur[t] = nxt[t];
  }
  // the last block: its whole stripes, then the input's last 64 bytes
  {
    const uint64_t *w = reinterpret_cast<const uint64_t *>(jb.src);
    const uint64_t stripes = ((jb.len - 1) - 1024 * nb) / 64;
    uint64_t mine = 0, swap = 0;
    for (int k = 0; k < 4; k++)
      if (s0 + 4 * k < stripes)
        xxh_word(w[nb * 128 + lane + 32 * k], sw[s0 + 4 * k + a], mine, swap);
    if (lane < 8)
      xxh_word(xxh_rd64u(jb.src + jb.len - 64 + 8 * a),
               xxh_rd64u(jb.secret + OI_XXH_SECRET_BYTES - 64 - 7 + 8 * a), mine, swap);
    acc += xxh_sum(mine, swap);
  }
  // merge: every lane gathers the accumulators
  uint64_t accs[8];
  for (int i = 0; i < 8; i++)
    accs[i] = __shfl_sync(0xffffffffu, acc, i);
  uint64_t h = jb.len * OI_XXH_P64_1;
  for (int i = 0; i < 4; i++)
    h += xxh_fold64(accs[2 * i] ^ xxh_rd64u(jb.secret + 11 + 16 * i),
                    accs[2 * i + 1] ^ xxh_rd64u(jb.secret + 11 + 16 * i + 8));
  return xxh_avalanche(h);
}
