// CUDA work of the benchmarks (bench_cuda.h): kept in the uninstalled
// benchmark target, out of libopeninfer.so.
#include <cuda_runtime.h>

#include "bench_cuda.h"

// A compute-bound kernel for interference measurements: FMA chains on every
// thread of every SM for a fixed number of iterations.
__global__ static void spin_fma_kernel(float *out, uint32_t iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f;
  for (uint32_t i = 0; i < iters; i++) {
    a = fmaf(a, b, c);
    b = fmaf(b, c, a * 1e-9f);
  }
  if (a == 12345.0f) out[blockIdx.x] = a + b; // keeps the loop alive
}

extern "C" int bench_cuda_spin(int device, uint32_t ctas, uint32_t iters, uint32_t count) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return (int)err;
  cudaStream_t s;
  float *scratch = NULL;
  err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) return (int)err;
  err = cudaMalloc((void **)&scratch, (size_t)ctas * sizeof(float));
  for (uint32_t i = 0; i < count && err == cudaSuccess; i++) {
    spin_fma_kernel<<<ctas, 256, 0, s>>>(scratch, iters);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  cudaFree(scratch);
  cudaStreamDestroy(s);
  cudaGetLastError();
  return (int)err;
}

extern "C" int bench_cuda_stream_create(int device, void **stream) {
  *stream = NULL;
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return (int)err;
  int least = 0, greatest = 0;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);
  cudaStream_t s = NULL;
  err = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest);
  *stream = s;
  return (int)err;
}

extern "C" int bench_cuda_piecewise(void *stream, const bench_piece *pieces, size_t n) {
  cudaStream_t s = (cudaStream_t)stream;
  for (size_t i = 0; i < n; i++) {
    cudaError_t err = cudaMemcpyAsync((void *)pieces[i].dst, (const void *)pieces[i].src,
                                      pieces[i].bytes, cudaMemcpyDefault, s);
    if (err != cudaSuccess) return (int)err;
  }
  return (int)cudaStreamSynchronize(s);
}

extern "C" void bench_cuda_stream_destroy(void *stream) {
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
}
