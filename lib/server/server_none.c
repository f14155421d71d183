/* Built in place of the sidecar server (server.c, session.c, request.c,
 * metrics.c) when the library is configured with -Dserver=disabled: the
 * public functions exist and refuse with OI_ERR_UNSUPPORTED, naming the
 * option; the accessors of a server answer as for NULL. The client's
 * oi_server_fetch_stats (stats_fetch.c) stays: it asks a sidecar that
 * another build runs. */
#include "core/core.h"
#include "openinfer/experimental.h"
#include "openinfer/server.h"

#define UNBUILT(fn)                                                                                \
  oi__fail(OI_ERR_UNSUPPORTED, fn ": built without the sidecar server (-Dserver=disabled)")

OI_API oi_status oi_server_options_init(oi_server_options *o) {
  OI_UNUSED(o);
  return UNBUILT("oi_server_options_init");
}

OI_API oi_status oi_server_create(const oi_server_options *o, oi_server **out) {
  OI_UNUSED(o);
  if (out) *out = NULL;
  return UNBUILT("oi_server_create");
}

OI_API oi_status oi_server_run(oi_server *s) {
  OI_UNUSED(s);
  return UNBUILT("oi_server_run");
}

OI_API oi_status oi_server_stop(oi_server *s) {
  OI_UNUSED(s);
  return UNBUILT("oi_server_stop");
}

OI_API oi_status oi_server_attach_cluster(oi_server *s, const oi_host_cluster_options *o) {
  OI_UNUSED(s);
  OI_UNUSED(o);
  return UNBUILT("oi_server_attach_cluster");
}

OI_API uint64_t oi_server_epoch(const oi_server *s) {
  OI_UNUSED(s);
  return 0;
}

OI_API const char *oi_server_socket_path(const oi_server *s) {
  OI_UNUSED(s);
  return NULL;
}

OI_API uint16_t oi_server_metrics_port(const oi_server *s) {
  OI_UNUSED(s);
  return 0;
}

OI_API void oi_server_destroy(oi_server *s) { OI_UNUSED(s); }
