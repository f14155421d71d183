#include "core/core.h"

OI_API uint32_t oi_version(void) { return OI_VERSION_NUMBER; }

#define OI_STR2(x) #x
#define OI_STR(x) OI_STR2(x)

OI_API const char *oi_version_string(void) {
#if defined(OI_HAVE_CUDA)
  return OI_STR(OI_VERSION_MAJOR) "." OI_STR(OI_VERSION_MINOR) "." OI_STR(
      OI_VERSION_PATCH) " (cpu, cuda)";
#else
  return OI_STR(OI_VERSION_MAJOR) "." OI_STR(OI_VERSION_MINOR) "." OI_STR(
      OI_VERSION_PATCH) " (cpu)";
#endif
}
