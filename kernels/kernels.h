/* Launchers of the CUDA kernels (extern "C", called only from lib/device/cuda.c
 * and benchmarks). Each returns a cudaError_t as int. */
#ifndef OI_KERNELS_H
#define OI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes oi__pattern_byte(seed, i) to dst[i] for i in [0, bytes) on `stream`. */
int oi_kernel_fill_pattern(void *dst, size_t bytes, uint64_t seed, void *stream);

/* One entry of a batch copy: at most OI_KCOPY_CHUNK bytes. */
typedef struct oi_kcopy_entry {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
} oi_kcopy_entry;

#define OI_KCOPY_CHUNK (128u << 10)
#define OI_KCOPY_THREADS 512

/* Copies every entry with at most `ctas` CTAs. The table may be in device
 * memory or in mapped pinned host memory (it is read one entry ahead). */
int oi_kernel_batch_copy(const oi_kcopy_entry *entries, uint32_t n, uint32_t ctas, void *stream);

/* Pieces averaging less than this go one warp per entry (entries of at most
 * OI_KCOPY_WARP_CHUNK bytes): a CTA then has OI_KCOPY_THREADS / 32 pieces in
 * flight, where the CTA-wide copy has one. */
#define OI_KCOPY_WARP_BELOW (64u << 10)
#define OI_KCOPY_WARP_CHUNK (32u << 10)

/* As oi_kernel_batch_copy, one warp per entry. */
int oi_kernel_batch_copy_warps(const oi_kcopy_entry *entries, uint32_t n, uint32_t ctas,
                               void *stream);

#ifdef __cplusplus
}
#endif
#endif
