/* The CUDA runtime calls the reference model's host code needs (its memory,
 * streams, events and copies), as a C interface compiled by nvcc
 * (refmodel_runtime.cu), so that lib/refmodel's C files never include a CUDA
 * header. Each call is the runtime function of the same name; errors are
 * cudaError_t values as int (0: success). Streams and events are opaque
 * pointers (cudaStream_t, cudaEvent_t). */
#ifndef OI_REFMODEL_RUNTIME_H
#define OI_REFMODEL_RUNTIME_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *oi_rmk_stream; /* cudaStream_t */
typedef void *oi_rmk_event;  /* cudaEvent_t */

/* The runtime's values (checked against cuda_runtime.h in refmodel_runtime.cu). */
enum {
  OI_RMK_SUCCESS = 0,             /* cudaSuccess */
  OI_RMK_HOST_TO_DEVICE = 1,      /* cudaMemcpyHostToDevice */
  OI_RMK_DEVICE_TO_HOST = 2,      /* cudaMemcpyDeviceToHost */
  OI_RMK_HOST_ALLOC_PORTABLE = 1, /* cudaHostAllocPortable */
  OI_RMK_STREAM_NON_BLOCKING = 1, /* cudaStreamNonBlocking */
};

const char *oi_rmk_error_string(int err);
int oi_rmk_get_last_error(void);
int oi_rmk_get_device_count(int *n);
int oi_rmk_set_device(int device);
int oi_rmk_device_synchronize(void);
int oi_rmk_malloc(void **p, size_t bytes);
int oi_rmk_free(void *p);
int oi_rmk_host_alloc(void **p, size_t bytes, unsigned flags);
int oi_rmk_free_host(void *p);
int oi_rmk_memcpy(void *dst, const void *src, size_t bytes, int kind);
int oi_rmk_memcpy_async(void *dst, const void *src, size_t bytes, int kind, oi_rmk_stream s);
int oi_rmk_stream_create(oi_rmk_stream *s, unsigned flags);
int oi_rmk_stream_destroy(oi_rmk_stream s);
int oi_rmk_stream_synchronize(oi_rmk_stream s);
int oi_rmk_stream_wait_event(oi_rmk_stream s, oi_rmk_event e, unsigned flags);
int oi_rmk_event_create(oi_rmk_event *e);
int oi_rmk_event_destroy(oi_rmk_event e);
int oi_rmk_event_record(oi_rmk_event e, oi_rmk_stream s);
int oi_rmk_event_synchronize(oi_rmk_event e);
int oi_rmk_event_elapsed_time(float *ms, oi_rmk_event start, oi_rmk_event end);

#ifdef __cplusplus
}
#endif
#endif
