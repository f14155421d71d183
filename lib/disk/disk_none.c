/* Built in place of the disk tier (disk.c, tier.c) when the library is
 * configured with -Ddisk=disabled: the public functions exist and refuse
 * with OI_ERR_UNSUPPORTED, naming the option; no host has a disk tier, so
 * the engine's query never reaches the internal calls below. */
#include "disk/tier.h"

#define UNBUILT(fn)                                                                                \
  oi__fail(OI_ERR_UNSUPPORTED, fn ": built without the disk tier (-Ddisk=disabled)")

OI_API oi_status oi_host_disk_options_init(oi_host_disk_options *o) {
  OI_UNUSED(o);
  return UNBUILT("oi_host_disk_options_init");
}

OI_API oi_status oi_host_attach_disk(oi_host *h, const oi_host_disk_options *o) {
  OI_UNUSED(h);
  OI_UNUSED(o);
  return UNBUILT("oi_host_attach_disk");
}

OI_API oi_status oi_host_get_disk_stats(const oi_host *h, oi_host_disk_stats *out) {
  OI_UNUSED(h);
  OI_UNUSED(out);
  return UNBUILT("oi_host_get_disk_stats");
}

OI_API oi_status oi_host_disk_options_check(const oi_host_disk_options *o) {
  OI_UNUSED(o);
  return UNBUILT("oi_host_disk_options_check");
}

disk_tier *oi__disk_tier_of(const oi_host *h) {
  OI_UNUSED(h);
  return NULL;
}

size_t oi__disk_tier_promote(disk_tier *t, oi_host_ns ns, const oi_block_hash *hashes, size_t n) {
  OI_UNUSED(t);
  OI_UNUSED(ns);
  OI_UNUSED(hashes);
  OI_UNUSED(n);
  return 0;
}

uint64_t oi__disk_tier_membership(disk_tier *t, oi_host_ns ns, const oi_block_hash *hashes,
                                  size_t n, uint8_t *present) {
  OI_UNUSED(t);
  OI_UNUSED(ns);
  OI_UNUSED(hashes);
  OI_UNUSED(n);
  OI_UNUSED(present);
  return 0;
}
