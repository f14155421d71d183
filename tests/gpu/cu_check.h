/* The GPU tests' check of a CUDA runtime call: on an error, the call, its
 * place and the runtime's message, then exit(1). */
#ifndef OI_TESTS_GPU_CU_CHECK_H
#define OI_TESTS_GPU_CU_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CU(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#endif
