/* Built when the cuda backend is not compiled: every CUDA ordinal is absent. */
#include "device/device.h"

int oi__cuda_device_count(void) { return 0; }

oi_status oi__cuda_dev_open(int ordinal, oi_dev **out) {
  *out = NULL;
  return oi__fail(OI_ERR_NO_DEVICE,
                  "device %d: this libopeninfer was built without the cuda backend", ordinal);
}
