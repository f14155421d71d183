/* Built in place of the executor (executor.c, scheduler.c, block_pool.c)
 * when the library is configured with -Dexecutor=disabled: the public
 * functions exist and refuse with OI_ERR_UNSUPPORTED, naming the option. */
#include "core/core.h"
#include "openinfer/executor.h"

#define UNBUILT(fn)                                                                                \
  oi__fail(OI_ERR_UNSUPPORTED, fn ": built without the executor (-Dexecutor=disabled)")

OI_API oi_status oi_executor_options_init(oi_executor_options *o) {
  OI_UNUSED(o);
  return UNBUILT("oi_executor_options_init");
}

OI_API oi_status oi_request_init(oi_request *r) {
  OI_UNUSED(r);
  return UNBUILT("oi_request_init");
}

OI_API oi_status oi_executor_create(const oi_executor_options *o, oi_executor **out) {
  OI_UNUSED(o);
  if (out) *out = NULL;
  return UNBUILT("oi_executor_create");
}

OI_API oi_status oi_executor_submit(oi_executor *x, const oi_request *r, uint64_t *request_id) {
  OI_UNUSED(x);
  OI_UNUSED(r);
  OI_UNUSED(request_id);
  return UNBUILT("oi_executor_submit");
}

OI_API oi_status oi_executor_step(oi_executor *x, uint32_t *finished) {
  OI_UNUSED(x);
  OI_UNUSED(finished);
  return UNBUILT("oi_executor_step");
}

OI_API oi_status oi_executor_run_until_idle(oi_executor *x) {
  OI_UNUSED(x);
  return UNBUILT("oi_executor_run_until_idle");
}

OI_API oi_status oi_executor_get_result(oi_executor *x, uint64_t request_id,
                                        oi_request_result *out) {
  OI_UNUSED(x);
  OI_UNUSED(request_id);
  OI_UNUSED(out);
  return UNBUILT("oi_executor_get_result");
}

OI_API oi_status oi_executor_flush(oi_executor *x, uint32_t timeout_ms) {
  OI_UNUSED(x);
  OI_UNUSED(timeout_ms);
  return UNBUILT("oi_executor_flush");
}

OI_API oi_status oi_executor_evict_gpu_cache(oi_executor *x, uint64_t *evicted) {
  OI_UNUSED(x);
  OI_UNUSED(evicted);
  return UNBUILT("oi_executor_evict_gpu_cache");
}

OI_API oi_status oi_executor_get_stats(const oi_executor *x, oi_executor_stats *out) {
  OI_UNUSED(x);
  OI_UNUSED(out);
  return UNBUILT("oi_executor_get_stats");
}

OI_API oi_status oi_executor_get_kv_layout(const oi_executor *x, uint32_t rank, oi_kv_layout *out) {
  OI_UNUSED(x);
  OI_UNUSED(rank);
  OI_UNUSED(out);
  return UNBUILT("oi_executor_get_kv_layout");
}

OI_API oi_status oi_executor_request_blocks(const oi_executor *x, uint64_t request_id, int64_t *out,
                                            size_t cap, size_t *n) {
  OI_UNUSED(x);
  OI_UNUSED(request_id);
  OI_UNUSED(out);
  OI_UNUSED(cap);
  OI_UNUSED(n);
  return UNBUILT("oi_executor_request_blocks");
}

OI_API void oi_executor_destroy(oi_executor *x) { OI_UNUSED(x); }
