/* Built in place of the cluster tier (directory.c, peer.c, tier.c, ...)
 * when the library is configured with -Dcluster=disabled: the public
 * functions exist and refuse with OI_ERR_UNSUPPORTED, naming the option; no
 * host has a cluster tier, so the engine's query never fetches through the
 * internal call below. */
#include "cluster/tier.h"
#include "openinfer/experimental.h"

#define UNBUILT(fn)                                                                                \
  oi__fail(OI_ERR_UNSUPPORTED, fn ": built without the cluster tier (-Dcluster=disabled)")

OI_API oi_status oi_host_cluster_options_init(oi_host_cluster_options *o) {
  OI_UNUSED(o);
  return UNBUILT("oi_host_cluster_options_init");
}

OI_API oi_status oi_host_cluster_options_check(const oi_host_cluster_options *o) {
  OI_UNUSED(o);
  return UNBUILT("oi_host_cluster_options_check");
}

OI_API oi_status oi_host_attach_cluster(oi_host *h, const oi_host_cluster_options *o) {
  OI_UNUSED(h);
  OI_UNUSED(o);
  return UNBUILT("oi_host_attach_cluster");
}

OI_API oi_status oi_host_get_cluster_stats(const oi_host *h, oi_host_cluster_stats *out) {
  OI_UNUSED(h);
  OI_UNUSED(out);
  return UNBUILT("oi_host_get_cluster_stats");
}

cluster_tier *oi__cluster_tier_of(oi_host *h) {
  OI_UNUSED(h);
  return NULL;
}

size_t oi__cluster_tier_fetch(cluster_tier *t, oi_host_ns ns, const oi_block_hash *hashes,
                              size_t n) {
  OI_UNUSED(t);
  OI_UNUSED(ns);
  OI_UNUSED(hashes);
  OI_UNUSED(n);
  return 0;
}
