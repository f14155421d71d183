/* The CUDA reference model's weight generator, shared by the kernels (which
 * generate the weights on the GPU) and the host (tests that recompute the
 * model on the cpu). Counter based: element i of tensor t is a function of
 * (seed, t, i) alone, so any element can be generated anywhere, in any order. */
#ifndef OI_REFMODEL_GEN_H
#define OI_REFMODEL_GEN_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define OI_RM_HD __host__ __device__ __forceinline__
#else
#define OI_RM_HD static inline
#endif

/* Tensor ids: global tensors, then 16 per layer. */
enum {
  OI_RM_T_EMBED = 1,
  OI_RM_T_FINAL_NORM = 2,
  OI_RM_T_LM_HEAD = 3,
  OI_RM_T_LAYER0 = 16,
  OI_RM_T_ATTN_NORM = 0, /* + OI_RM_T_LAYER0 + 16 * layer */
  OI_RM_T_WQ = 1,
  OI_RM_T_WK = 2,
  OI_RM_T_WV = 3,
  OI_RM_T_WO = 4,
  OI_RM_T_MLP_NORM = 5,
  OI_RM_T_GATE = 6,
  OI_RM_T_UP = 7,
  OI_RM_T_DOWN = 8,
};

OI_RM_HD uint64_t oi_rm_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [-scale, scale), from the top 24 bits (exact in a float). */
OI_RM_HD float oi_rm_uniform(uint64_t seed, uint32_t tensor, uint64_t i, float scale) {
  uint64_t h = oi_rm_mix64(seed * 0x9E3779B97F4A7C15ull + (uint64_t)tensor * 0xD1B54A32D192ED03ull +
                           i * 0x9E3779B97F4A7C15ull + 0x6F70656E696E6665ull);
  float u = (float)(h >> 40) * (1.0f / 16777216.0f);
  return (2.0f * u - 1.0f) * scale;
}

/* float -> bf16 bits, round to nearest even (finite inputs). */
OI_RM_HD uint16_t oi_rm_f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

OI_RM_HD float oi_rm_bf2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
