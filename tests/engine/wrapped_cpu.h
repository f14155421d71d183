/* A test backend for the copy pipeline's device paths without a GPU: the
 * cpu backend's ops, with the pinned memory and streams its own, to which
 * a test adds the op it plays (stream_decode, stream_encode) before making
 * a pipeline on `wrapped`. The ops the pipeline does not call are NULL. */
#ifndef OI_TESTS_ENGINE_WRAPPED_CPU_H
#define OI_TESTS_ENGINE_WRAPPED_CPU_H

#include "device/device.h"
#include "testutil.h"

static oi_dev *cpu;
static oi_dev_ops wrapped_ops;
static oi_dev wrapped;

static oi_status w_pinned_alloc(oi_dev *d, size_t b, uint32_t f, int numa, oi_pinned *out) {
  OI_UNUSED(d);
  return cpu->ops->pinned_alloc(cpu, b, f, numa, out);
}
static void w_pinned_free(oi_dev *d, oi_pinned *p) {
  OI_UNUSED(d);
  cpu->ops->pinned_free(cpu, p);
}
static oi_status w_stream_create(oi_dev *d, int prio, oi_stream **out) {
  OI_UNUSED(d);
  return cpu->ops->stream_create(cpu, prio, out);
}

/* Opens the cpu backend and makes `wrapped` its copy, named `name`. */
static void wrap_cpu(const char *name) {
  REQUIRE(oi__dev_open(OI_DEVICE_CPU, &cpu) == OI_OK);
  wrapped_ops = *cpu->ops;
  wrapped_ops.name = name;
  wrapped_ops.pinned_alloc = w_pinned_alloc;
  wrapped_ops.pinned_free = w_pinned_free;
  wrapped_ops.stream_create = w_stream_create;
  wrapped_ops.close = NULL;
  wrapped_ops.mem_alloc = NULL;
  wrapped_ops.mem_copy = NULL;
  wrapped = (oi_dev){.ops = &wrapped_ops, .ordinal = OI_DEVICE_CPU};
}

#endif
