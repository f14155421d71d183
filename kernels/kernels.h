/* Launchers of the CUDA kernels (extern "C", called only from lib/device/cuda.c). */
#ifndef OI_KERNELS_H
#define OI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes oi__pattern_byte(seed, i) to dst[i] for i in [0, bytes) on `stream`
 * (a cudaStream_t). Returns a cudaError_t as int. */
int oi_kernel_fill_pattern(void *dst, size_t bytes, uint64_t seed, void *stream);

#ifdef __cplusplus
}
#endif
#endif
