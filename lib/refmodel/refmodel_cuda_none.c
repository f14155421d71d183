/* The reference model's CUDA path when the library is built without CUDA. */
#include "refmodel/refmodel_cuda.h"

oi_status oi__rm_cuda_check(const oi_refmodel_options *o) {
  OI_UNUSED(o);
  return oi__fail(OI_ERR_UNSUPPORTED, "refmodel: this build has no CUDA backend");
}
/* Unreachable: refmodel.c asks oi__rm_cuda_check first, which refuses.
 * (Left out of the coverage figures.) */
// GCOVR_EXCL_START
oi_status oi__rm_cuda_create(const oi_refmodel_options *o, oi_rm_cuda **out) {
  OI_UNUSED(o);
  *out = NULL;
  return oi__fail(OI_ERR_UNSUPPORTED, "refmodel: this build has no CUDA backend");
}
void oi__rm_cuda_destroy(oi_rm_cuda *m) { OI_UNUSED(m); }
oi_status oi__rm_cuda_bind(oi_rm_cuda *m, uint32_t rank, const oi_kv_layout *kv) {
  OI_UNUSED(m);
  OI_UNUSED(rank);
  OI_UNUSED(kv);
  return oi__fail(OI_ERR_UNSUPPORTED, "refmodel: this build has no CUDA backend");
}
void oi__rm_cuda_unbind(oi_rm_cuda *m, uint32_t rank) {
  OI_UNUSED(m);
  OI_UNUSED(rank);
}
oi_status oi__rm_cuda_forward(oi_rm_cuda *m, const oi_model_batch *b) {
  OI_UNUSED(m);
  OI_UNUSED(b);
  return oi__fail(OI_ERR_UNSUPPORTED, "refmodel: this build has no CUDA backend");
}
// GCOVR_EXCL_STOP
