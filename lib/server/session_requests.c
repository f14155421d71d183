/* The handlers of a session's requests (session_internal.h): Hello,
 * Register (the arena allocated or imported, the engine created), Save and
 * Load (replied when their ticket completes; a layered load through the
 * progress worker), Query (an instance's, or a lookup's), Release, Flush
 * and Unregister (on the aux worker). Every field is validated first
 * (request.c). */
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h" /* the engine's principal and layout */
#include "engine/query.h"
#include "session_internal.h"

void oi__session_hello(srv_session *s, uint64_t req, const oiwire_Hello *h) {
  char msg[512];
  oi_status st = oi__req_check_hello(h, msg, sizeof msg);
  if (st != OI_OK) return oi__session_reply(s, req, st, msg);
  s->hello_done = true;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_hello_reply_tag;
  env.body.hello_reply.protocol_version = OI_WIRE_PROTOCOL_VERSION;
  env.body.hello_reply.capabilities = OI_WIRE_CAP_PIPELINED | OI_WIRE_CAP_MEMBERSHIP |
                                      OI_WIRE_CAP_LOOKUP | OI_WIRE_CAP_SAVE_COUNTS |
                                      OI_WIRE_CAP_LAYERWISE | OI_WIRE_CAP_OWNED_ARENA |
                                      OI_WIRE_CAP_LOAD_PROGRESS | OI_WIRE_CAP_CODEC;
  env.body.hello_reply.server_epoch = s->server->epoch;
  snprintf(env.body.hello_reply.server_version, sizeof env.body.hello_reply.server_version, "%s",
           oi_version_string());
  OI_LOG(OI_LOG_INFO, "server", "session=%llu hello from '%s' (pid %d, uid %u)",
         (unsigned long long)s->id, h->client_name, (int)s->peer_pid, (unsigned)s->peer_uid);
  oi__session_send(s, &env, NULL);
}

static bool device_served(const oi_server *srv, int32_t device) {
  if (srv->opts.num_devices == 0) return true;
  for (uint32_t i = 0; i < srv->opts.num_devices; i++)
    if (srv->devices[i] == device) return true;
  return false;
}

void oi__session_register(srv_session *s, uint64_t req, const oiwire_Register *r) {
  oi_server *srv = s->server;
  oi_wire_arrays *a = &s->arrays;
  char msg[512];
  oi_status st = oi__req_check_arrays(a, "register", msg, sizeof msg);
  if (st != OI_OK) return oi__session_reply(s, req, st, msg);
  if (!device_served(srv, r->device))
    return oi__session_reply_fmt(s, req, OI_ERR_PERMISSION,
                                 "register: this server does not serve device %d", (int)r->device);
  /* Validate everything before allocating anything (request.c). */
  oi_engine_options eo;
  oi_arena_desc *descs;
  if ((st = oi__req_register_options(r, a, &eo, &descs, msg, sizeof msg)) != OI_OK)
    return oi__session_reply(s, req, st, msg);

  srv_instance *inst = NULL;
  oi_dev *dev = NULL;
  void *region = NULL, *map = NULL;
  uint64_t map_bytes = 0;
  oi_arena_handle handle;
  bool owned = r->client_owned;
  if (owned && r->device == OI_DEVICE_CPU && (s->recv_fd < 0 || s->recv_extra)) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "register: an engine-owned cpu arena needs exactly one memfd sent with the "
                  "request (SCM_RIGHTS); %s",
                  s->recv_fd < 0 ? "none came" : "more came");
    goto fail;
  }
  if (owned && r->device != OI_DEVICE_CPU && s->recv_fd >= 0) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "register: a device arena travels as an IPC handle, not a file descriptor");
    goto fail;
  }
  if ((st = oi__dev_open(r->device, &dev)) != OI_OK) goto fail;
  if (owned && r->device == OI_DEVICE_CPU) {
    /* The client's memfd: checked (sealed against shrinking, large enough,
     * writable) and mapped; the descriptor is closed after the dispatch. */
    if ((st = oi__fd_arena_map(s->recv_fd, r->arena_size, &map, &map_bytes, "register")) != OI_OK)
      goto fail;
    region = map;
  } else if (owned) {
    /* The client's cudaMalloc allocation: imported, its size checked. */
    memcpy(handle.bytes, r->client_handle.bytes, OI_WIRE_HANDLE_BYTES);
    uint64_t need = r->client_offset + r->arena_size;
    if ((st = dev->ops->mem_import(dev, &handle, need, &map, &map_bytes)) != OI_OK) {
      char m[384];
      snprintf(m, sizeof m, "%s", oi_last_error());
      st = oi__fail(st, "register: importing the client's arena: %s", m);
      goto fail;
    }
    region = (uint8_t *)map + r->client_offset;
  } else {
    if ((st = dev->ops->mem_alloc(dev, r->arena_size, OI_MEM_SHAREABLE, &region)) != OI_OK)
      goto fail;
    if ((st = dev->ops->mem_export(dev, region, &handle)) != OI_OK) goto fail;
  }
  inst = oi__calloc(1, sizeof *inst);
  if (!inst) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
    goto fail;
  }
  eo.arena_base = region;
  if ((st = oi_engine_create(srv->host, &eo, &inst->engine)) != OI_OK) goto fail;
  inst->engine->principal = oi__session_principal(s); /* before the client learns its id */
  oi__free(descs);
  descs = NULL;
  oi_engine_stats es = {.struct_size = sizeof es};
  oi_engine_get_stats(inst->engine, &es); /* (cannot fail on a local engine) */
  atomic_init(&inst->refs, 1);
  inst->id = es.instance_id;
  inst->server = srv;
  inst->dev = dev;
  inst->arena = region;
  inst->arena_bytes = r->arena_size;
  inst->owned = owned;
  inst->map = map;
  inst->map_bytes = map_bytes;
  pthread_mutex_lock(&srv->lock);
  inst->next = s->instances;
  s->instances = inst;
  pthread_mutex_unlock(&srv->lock);
  atomic_fetch_add(&srv->instances, 1);
  if (!owned) atomic_fetch_add(&srv->arena_bytes, r->arena_size);
  OI_LOG_I(OI_LOG_INFO, "server", inst->id,
           "session=%llu registered '%s' namespace '%s' on device %d: %llu-byte %s arena",
           (unsigned long long)s->id, r->instance_name, r->namespace_id, (int)r->device,
           (unsigned long long)r->arena_size, owned ? "engine-owned" : "server-allocated");

  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_register_reply_tag;
  oiwire_RegisterReply *rr = &env.body.register_reply;
  rr->instance_id = inst->id;
  if (!owned) {
    rr->arena_handle.size = OI_WIRE_HANDLE_BYTES;
    memcpy(rr->arena_handle.bytes, handle.bytes, OI_WIRE_HANDLE_BYTES);
  }
  rr->arena_bytes = r->arena_size;
  rr->block_bytes = es.block_bytes;
  rr->num_blocks = es.num_blocks;
  oi__session_send(s, &env, NULL);
  return;

fail:
  oi__session_reply_failure(s, req, st);
  oi__free(inst);
  if (owned && map && r->device == OI_DEVICE_CPU)
    oi__fd_arena_unmap(map, map_bytes);
  else if (owned && map)
    dev->ops->mem_close_import(dev, map, map_bytes);
  else if (region)
    dev->ops->mem_free(dev, region);
  oi__dev_close(dev);
  oi__free(descs);
}

typedef struct ticket_reply {
  srv_session *s;
  uint64_t request_id;
  const char *what;
  size_t n;
  uint32_t instance;
} ticket_reply;

static void on_ticket_done(void *ctx, oi_ticket *t, oi_status st) {
  OI_UNUSED(t);
  ticket_reply *p = ctx;
  if (st == OI_OK)
    oi__session_reply(p->s, p->request_id, OI_OK, "");
  else
    oi__session_reply_async_failure(p->s, p->request_id, st, p->what, p->n, p->instance);
  oi__free(p);
}

/* Replies when `t` (a save or load of n blocks on `inst`) completes, then
 * drops the observer reference. */
static void reply_on_completion(srv_session *s, uint64_t req, oi_ticket *t, const char *what,
                                size_t n, const srv_instance *inst) {
  ticket_reply *p = oi__malloc(sizeof *p);
  if (p) {
    *p = (ticket_reply){.s = s, .request_id = req, .what = what, .n = n, .instance = inst->id};
    if (oi_ticket_set_callback(t, on_ticket_done, p) == OI_OK) {
      oi_ticket_release(t);
      return;
    }
    oi__free(p);
  }
  oi_status st = oi__ticket_wait_final(t);
  if (st == OI_OK)
    oi__session_reply(s, req, OI_OK, "");
  else
    oi__session_reply_async_failure(s, req, st, what, n, inst->id);
  oi_ticket_release(t);
}

void oi__session_save(srv_session *s, uint64_t req, const oiwire_Save *m) {
  oi_wire_arrays *a = &s->arrays;
  srv_instance *inst = oi__session_lookup(s, req, m->instance_id, "save");
  if (!inst) return;
  char msg[512];
  oi_status st = oi__req_check_save(a, msg, sizeof msg);
  if (st != OI_OK) return oi__session_reply(s, req, st, msg);
  oi_ticket *t = NULL;
  oi_save_result counts = {.struct_size = sizeof counts};
  oi_save_options so;
  oi_save_options_init(&so);
  so.result = m->want_counts ? &counts : NULL;
  so.arena_first = m->arena_first; /* a layerwise save; validated by the engine */
  so.arena_count = m->arena_count;
  st = oi_engine_save(inst->engine, a->ids, a->hashes, a->n_ids, &so, &t);
  if (st != OI_OK) return oi__session_reply_failure(s, req, st);
  if (m->want_counts) { /* before the final Result, which the ticket's callback sends */
    oiwire_Envelope env;
    memset(&env, 0, sizeof env);
    env.request_id = req;
    env.which_body = oiwire_Envelope_save_counts_tag;
    env.body.save_counts.accepted = counts.accepted;
    env.body.save_counts.deduplicated = counts.deduplicated;
    env.body.save_counts.dropped = counts.dropped;
    oi__session_send(s, &env, NULL);
  }
  reply_on_completion(s, req, t, "save", a->n_ids, inst);
}

/* A oi__session_lookup (Query with instance 0 and a namespace): no instance, the lease
 * created by the session's lookup instance for the session's principal. */
static oi_status lookup_query(srv_session *s, const oiwire_Query *m, size_t n,
                              oi_query_result *qr) {
  if (!s->lookup_instance) s->lookup_instance = oi__host_instance_add(s->server->host);
  oi_host_query_args qa = {.instance = s->lookup_instance,
                           .principal = oi__session_principal(s),
                           .shares = m->world_size ? m->world_size : 1,
                           .membership = (m->flags & OI_QUERY_MEMBERSHIP) != 0,
                           .present = qr->present,
                           .wait_ms = (m->flags & OI_QUERY_WAIT_PENDING) ? m->wait_ms : 0};
  oi_status st =
      oi__query_check("query", s->arrays.hashes, n, m->flags, qr, &qa.present, &qa.wait_ms);
  if (st != OI_OK) return st;
  qa.where = oi__query_where(qr);
  oi_host_answer ans;
  if ((st = oi__host_query(s->server->host, m->namespace_id, &qa, s->arrays.hashes, n, &ans)) !=
      OI_OK)
    return st;
  return oi__query_result_out(&qa, &ans, qr, "query");
}

void oi__session_query(srv_session *s, uint64_t req, const oiwire_Query *m) {
  oi_wire_arrays *a = &s->arrays;
  bool is_lookup = m->instance_id == 0 && m->namespace_id[0];
  srv_instance *inst = NULL;
  if (!is_lookup && !(inst = oi__session_lookup(s, req, m->instance_id, "query"))) return;
  char msg[512];
  if (oi__req_check_arrays(a, "query", msg, sizeof msg) != OI_OK)
    return oi__session_reply(s, req, a->bad, msg);
  size_t n = a->n_hashes;
  oi_query_result qr;
  memset(&qr, 0, sizeof qr);
  qr.struct_size = sizeof qr;
  qr.wait_ms = m->wait_ms;
  if ((m->flags & OI_QUERY_MEMBERSHIP) && n > 0) {
    if (!s->present && !(s->present = oi__malloc(OI_WIRE_MAX_BLOCKS)))
      return oi__session_reply_fmt(s, req, OI_ERR_OUT_OF_MEMORY, "query: out of memory");
    qr.present = s->present;
  }
  /* (A WAIT_PENDING query holds this session's requests for up to wait_ms.) */
  oi_status st = is_lookup ? lookup_query(s, m, n, &qr)
                           : oi_engine_query(inst->engine, m->req_id[0] ? m->req_id : NULL,
                                             a->hashes, n, m->flags, &qr);
  if (st != OI_OK) return oi__session_reply_failure(s, req, st);
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_query_reply_tag;
  env.body.query_reply.state = qr.state;
  env.body.query_reply.hit_blocks = qr.hit_blocks;
  env.body.query_reply.pending_blocks = qr.pending_blocks;
  static const oi_lease no_lease;
  if (memcmp(&qr.lease, &no_lease, sizeof no_lease) != 0) {
    env.body.query_reply.lease.size = OI_WIRE_LEASE_BYTES;
    memcpy(env.body.query_reply.lease.bytes, qr.lease.bytes, OI_WIRE_LEASE_BYTES);
  }
  oi_wire_out out = {.present = qr.present, .n_present = qr.present ? n : 0};
  oi__session_send(s, &env, &out);
}

static bool lease_from_wire(srv_session *s, uint64_t req, const char *what, const uint8_t *bytes,
                            size_t size, oi_lease *lease) {
  char msg[256];
  oi_status st = oi__req_lease(what, bytes, size, lease, msg, sizeof msg);
  if (st != OI_OK) oi__session_reply(s, req, st, msg);
  return st == OI_OK;
}

void oi__session_load(srv_session *s, uint64_t req, const oiwire_Load *m) {
  oi_wire_arrays *a = &s->arrays;
  srv_instance *inst = oi__session_lookup(s, req, m->instance_id, "load");
  if (!inst) return;
  char msg[512];
  if (oi__req_check_arrays(a, "load", msg, sizeof msg) != OI_OK)
    return oi__session_reply(s, req, a->bad, msg);
  oi_lease lease;
  if (!lease_from_wire(s, req, "load", m->lease.bytes, m->lease.size, &lease)) return;
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = m->flags; /* validated by the engine */
  oi_ticket *t = NULL;
  oi_status st = oi_engine_load(inst->engine, lease, a->ids, a->n_ids, &lo, &t);
  if (st != OI_OK) return oi__session_reply_failure(s, req, st);
  if (!(m->flags & OI_LOAD_ARENA_EVENTS))
    return reply_on_completion(s, req, t, "load", a->n_ids, inst);
  /* Layered: the progress worker reports each arena, then the Result. */
  aux_job *job = oi__calloc(1, sizeof *job);
  if (job) {
    job->kind = AUX_LOAD_PROGRESS;
    job->request_id = req;
    job->inst = inst;
    job->ticket = t;
    job->n_arenas = inst->engine->layout.num_arenas;
    job->n_blocks = a->n_ids;
    atomic_fetch_add(&inst->refs, 1);
    if (oi__session_worker_enqueue(&s->progress, job) == OI_OK) return;
    oi__session_instance_put(inst);
    oi__free(job);
  }
  reply_on_completion(s, req, t, "load", a->n_ids, inst); /* no progress frames: the Result alone */
}

void oi__session_release(srv_session *s, uint64_t req, const oiwire_Release *m) {
  bool is_lookup = m->instance_id == 0 && m->namespace_id[0];
  srv_instance *inst = NULL;
  if (!is_lookup && !(inst = oi__session_lookup(s, req, m->instance_id, "release"))) return;
  oi_lease lease;
  if (!lease_from_wire(s, req, "release", m->lease.bytes, m->lease.size, &lease)) return;
  oi_status st = is_lookup ? oi__host_lookup_release(s->server->host, m->namespace_id,
                                                     oi__session_principal(s), lease)
                           : oi_engine_release(inst->engine, lease);
  if (st != OI_OK) return oi__session_reply_failure(s, req, st);
  oi__session_reply(s, req, OI_OK, "");
}

void oi__session_flush(srv_session *s, uint64_t req, const oiwire_Flush *m) {
  srv_instance *inst = oi__session_lookup(s, req, m->instance_id, "flush");
  if (!inst) return;
  atomic_fetch_add(&inst->refs, 1);
  oi_status st = oi__session_aux_enqueue(s, AUX_FLUSH, req, inst, m->timeout_ms);
  if (st != OI_OK) {
    oi__session_instance_put(inst);
    oi__session_reply_failure(s, req, st);
  }
}

void oi__session_unregister(srv_session *s, uint64_t req, const oiwire_Unregister *m) {
  srv_instance *inst = NULL;
  for (srv_instance *i = s->instances; i; i = i->next)
    if (i->id == m->instance_id) inst = i;
  if (!inst) {
    if (m->instance_id && oi__server_instance_elsewhere(s->server, s, m->instance_id))
      return oi__session_reply_fmt(s, req, OI_ERR_PERMISSION,
                                   "unregister: instance %u belongs to another session",
                                   m->instance_id);
    /* Already cleaned up (or never was): what the caller wants is true. */
    return oi__session_reply(s, req, OI_OK, "");
  }
  oi__session_unlink_instance(
      s, inst); /* later requests naming it fail; queued flushes finish first */
  oi_status st = oi__session_aux_enqueue(s, AUX_UNREGISTER, req, inst, 0);
  if (st != OI_OK) {
    oi__session_instance_put(inst);
    oi__session_reply(s, req, OI_OK, "");
  }
}
