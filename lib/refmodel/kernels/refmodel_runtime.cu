// The CUDA runtime calls of the reference model's host code, behind the C
// interface of refmodel_runtime.h (lib/refmodel's C files include no CUDA
// header). Each wrapper is the runtime function of the same name.
#include <cuda_runtime.h>

#include "refmodel_runtime.h"

static_assert(OI_RMK_SUCCESS == (int)cudaSuccess, "cudaSuccess");
static_assert(OI_RMK_HOST_TO_DEVICE == (int)cudaMemcpyHostToDevice, "cudaMemcpyHostToDevice");
static_assert(OI_RMK_DEVICE_TO_HOST == (int)cudaMemcpyDeviceToHost, "cudaMemcpyDeviceToHost");
static_assert(OI_RMK_HOST_ALLOC_PORTABLE == cudaHostAllocPortable, "cudaHostAllocPortable");
static_assert(OI_RMK_STREAM_NON_BLOCKING == cudaStreamNonBlocking, "cudaStreamNonBlocking");

extern "C" {

const char *oi_rmk_error_string(int err) { return cudaGetErrorString((cudaError_t)err); }
int oi_rmk_get_last_error(void) { return (int)cudaGetLastError(); }
int oi_rmk_get_device_count(int *n) { return (int)cudaGetDeviceCount(n); }
int oi_rmk_set_device(int device) { return (int)cudaSetDevice(device); }
int oi_rmk_device_synchronize(void) { return (int)cudaDeviceSynchronize(); }
int oi_rmk_malloc(void **p, size_t bytes) { return (int)cudaMalloc(p, bytes); }
int oi_rmk_free(void *p) { return (int)cudaFree(p); }
int oi_rmk_host_alloc(void **p, size_t bytes, unsigned flags) {
  return (int)cudaHostAlloc(p, bytes, flags);
}
int oi_rmk_free_host(void *p) { return (int)cudaFreeHost(p); }
int oi_rmk_memcpy(void *dst, const void *src, size_t bytes, int kind) {
  return (int)cudaMemcpy(dst, src, bytes, (cudaMemcpyKind)kind);
}
int oi_rmk_memcpy_async(void *dst, const void *src, size_t bytes, int kind, oi_rmk_stream s) {
  return (int)cudaMemcpyAsync(dst, src, bytes, (cudaMemcpyKind)kind, (cudaStream_t)s);
}
int oi_rmk_stream_create(oi_rmk_stream *s, unsigned flags) {
  cudaStream_t cs = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&cs, flags);
  *s = cs;
  return (int)e;
}
int oi_rmk_stream_destroy(oi_rmk_stream s) { return (int)cudaStreamDestroy((cudaStream_t)s); }
int oi_rmk_stream_synchronize(oi_rmk_stream s) {
  return (int)cudaStreamSynchronize((cudaStream_t)s);
}
int oi_rmk_stream_wait_event(oi_rmk_stream s, oi_rmk_event e, unsigned flags) {
  return (int)cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, flags);
}
int oi_rmk_event_create(oi_rmk_event *e) {
  cudaEvent_t ce = NULL;
  cudaError_t r = cudaEventCreate(&ce);
  *e = ce;
  return (int)r;
}
int oi_rmk_event_destroy(oi_rmk_event e) { return (int)cudaEventDestroy((cudaEvent_t)e); }
int oi_rmk_event_record(oi_rmk_event e, oi_rmk_stream s) {
  return (int)cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s);
}
int oi_rmk_event_synchronize(oi_rmk_event e) { return (int)cudaEventSynchronize((cudaEvent_t)e); }
int oi_rmk_event_elapsed_time(float *ms, oi_rmk_event start, oi_rmk_event end) {
  return (int)cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end);
}

} // extern "C"
