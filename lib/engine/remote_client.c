/* The lookup client (oi_lookup_*): a sidecar session that
 * registers nothing. The invariants: remote_internal.h. */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "remote_internal.h"

/* ---- the lookup client ----------------------------------------------------------------
 * A session that registers nothing: a remote_engine without a layout or an
 * arena, whose connection is never live in the watchdog's sense (nothing it
 * maps can go away), so a lost server fails its calls with OI_ERR_CLOSED. */

struct oi_lookup {
  remote_engine *e;
  uint32_t world_size;
};

OI_API oi_status oi_lookup_connect(const char *socket_path, const oi_lookup_options *o,
                                   oi_lookup **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "client_connect: out is NULL");
  *out = NULL;
  oi_lookup_options lo;
  oi_status st = oi__lookup_options_check(o, "client_connect", &lo);
  if (st != OI_OK) return st;
  char def[108];
  if (!socket_path) {
    if ((st = oi__wire_default_socket_path(def, sizeof def)) != OI_OK) return st;
    socket_path = def;
  }
  oi_lookup *c = oi__calloc(1, sizeof *c);
  remote_engine *e = oi__calloc(1, sizeof *e);
  if (!c || !e) {
    oi__free(c);
    oi__free(e);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "client_connect: out of memory");
  }
  c->e = e;
  c->world_size = lo.world_size;
  e->base.ops = &oi__remote_ops; /* (only query and release are used) */
  e->fd = -1;
  e->owned_fd = -1;
  e->connecting_fd = -1;
  e->state = CONN_RETIRED; /* never armed: the connection may end without harm */
  oi__remote_init_sync(e);
  e->control_ms = lo.control_deadline_ms;
  e->lookup_ms = lo.lookup_deadline_ms;
  e->probe_ms = lo.probe_interval_ms;
  e->base.namespace_id = oi__strdup(lo.namespace_id);
  e->base.instance_name = oi__strdup(lo.client_name ? lo.client_name : "lookup client");
  e->socket_path = oi__strdup(socket_path);
  if (!e->base.namespace_id || !e->base.instance_name || !e->socket_path) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "client_connect: out of memory");
    goto fail;
  }
  if (e->kick_fd < 0) {
    st = oi__fail(OI_ERR_INTERNAL, "client_connect: eventfd: %s", strerror(errno));
    goto fail;
  }
  if ((st = oi__wire_connect(socket_path, &e->fd)) != OI_OK) goto fail;
  int rc = pthread_create(&e->reader, NULL, oi__remote_reader_main, e);
  if (rc != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "client_connect: cannot start the reader thread: %s",
                  strerror(rc));
    goto fail;
  }
  pthread_setname_np(e->reader, "oi-client-read");
  e->reader_started = true;
  if ((st = oi__remote_hello(e)) != OI_OK) goto fail;
  OI_LOG(OI_LOG_INFO, "engine", "lookup client of namespace '%s' connected to %s (epoch %016llx)",
         lo.namespace_id, socket_path, (unsigned long long)e->server_epoch);
  *out = c;
  return OI_OK;
fail : {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  oi__remote_free_engine(e);
  oi__free(c);
  return oi__fail(st, "%s", msg);
}
}

OI_API oi_status oi_lookup_query(oi_lookup *c, const char *req_id, const oi_block_hash *hashes,
                                 size_t n, uint32_t flags, oi_query_result *out) {
  if (!c) return oi__fail(OI_ERR_INVALID_ARGUMENT, "client_query: client is NULL");
  uint8_t *present;
  uint32_t wait_ms;
  oi_status st = oi__query_check("client_query", hashes, n, flags, out, &present, &wait_ms);
  if (st != OI_OK) return st;
  return oi__remote_query_call(c->e, 0, c->e->base.namespace_id, c->world_size, req_id, hashes, n,
                               flags, present, wait_ms, out);
}

OI_API oi_status oi_lookup_release(oi_lookup *c, oi_lease lease) {
  if (!c) return oi__fail(OI_ERR_INVALID_ARGUMENT, "client_release: client is NULL");
  return oi__remote_release_call(c->e, 0, c->e->base.namespace_id, lease);
}

OI_API void oi_lookup_destroy(oi_lookup *c) {
  if (!c) return;
  oi__remote_free_engine(c->e);
  oi__free(c);
}
