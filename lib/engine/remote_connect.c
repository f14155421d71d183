/* The sidecar engine's handshake (Hello, Register), the reconnect of
 * engine-owned memory and oi__remote_engine_connect.
 * The invariants: remote_internal.h. */

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

static bool layout_extent(const oi_engine_options *o, uint64_t *out) {
  uint64_t end = 0, k = 0; /* k: the arena's first segment offset */
  for (uint32_t i = 0; i < o->num_arenas; i++) {
    const oi_arena_desc *a = &o->arenas[i];
    uint64_t span = 0, seg = 0, last = 0;
    if (o->segment_offsets && a->segments) {
      /* Separate regions: the farthest segment start (a count that does not
       * match is refused by the layout checks that follow). */
      for (uint32_t s = 0; s < a->segments && k + s < o->num_segment_offsets; s++)
        seg = OI_MAX(seg, o->segment_offsets[k + s]);
      k += a->segments;
    }
    if (a->num_blocks && a->segments) {
      if (__builtin_mul_overflow(a->num_blocks - 1, a->block_stride, &last) ||
          (!o->segment_offsets &&
           __builtin_mul_overflow((uint64_t)(a->segments - 1), a->segment_stride, &seg)) ||
          __builtin_add_overflow(last, seg, &span) ||
          __builtin_add_overflow(span, a->bytes_per_block, &span))
        return false;
    }
    uint64_t a_end;
    if (__builtin_add_overflow(a->offset, span, &a_end)) return false;
    if (a_end > end) end = a_end;
  }
  *out = end;
  return true;
}

static void fill_hello(remote_engine *e, oiwire_Envelope *env) {
  memset(env, 0, sizeof *env);
  env->which_body = oiwire_Envelope_hello_tag;
  env->body.hello.protocol_version = OI_WIRE_PROTOCOL_VERSION;
  env->body.hello.capabilities =
      OI_WIRE_CAP_PIPELINED | OI_WIRE_CAP_MEMBERSHIP | (e->owned ? OI_WIRE_CAP_OWNED_ARENA : 0);
  snprintf(env->body.hello.client_name, sizeof env->body.hello.client_name, "%s (pid %d)",
           e->base.instance_name[0] ? e->base.instance_name : "engine", (int)getpid());
}

static oi_status check_hello_reply(remote_engine *e, const oiwire_Envelope *r, const char *what) {
  if (r->which_body != oiwire_Envelope_hello_reply_tag)
    return oi__fail(OI_ERR_PROTOCOL, "%s: the server answered with message type %u", what,
                    r->which_body);
  if (r->body.hello_reply.protocol_version != OI_WIRE_PROTOCOL_VERSION)
    return oi__fail(OI_ERR_VERSION, "%s: the server speaks protocol %u, this library %u", what,
                    r->body.hello_reply.protocol_version, OI_WIRE_PROTOCOL_VERSION);
  if (e->owned && !(r->body.hello_reply.capabilities & OI_WIRE_CAP_OWNED_ARENA))
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "%s: the server does not take engine-owned memory (an older version): "
                    "connect with arena_base NULL",
                    what);
  if (e->base.codec.id != OI_CODEC_NONE && !(r->body.hello_reply.capabilities & OI_WIRE_CAP_CODEC))
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "%s: the server stores no codec's frames (an older version): connect with "
                    "codec none, not %s",
                    what, oi__codec_name(e->base.codec.id));
  return OI_OK;
}

oi_status oi__remote_hello(remote_engine *e) {
  oiwire_Envelope env;
  fill_hello(e, &env);
  pending p;
  memset(&p, 0, sizeof p);
  oi_status st = oi__remote_call(e, &env, NULL, &p, e->control_ms, "connect: hello");
  if (st != OI_OK) return st;
  if ((st = check_hello_reply(e, &p.reply, "connect: hello")) != OI_OK) return st;
  pthread_mutex_lock(&e->lock);
  e->server_epoch = p.reply.body.hello_reply.server_epoch;
  e->server_caps = p.reply.body.hello_reply.capabilities;
  pthread_mutex_unlock(&e->lock);
  return OI_OK;
}

/* The Register request (the same at connect and at every reconnect). */
static void fill_register(remote_engine *e, oiwire_Envelope *env, oi_wire_out *out) {
  memset(env, 0, sizeof *env);
  env->which_body = oiwire_Envelope_register_instance_tag;
  oiwire_Register *r = &env->body.register_instance;
  snprintf(r->namespace_id, sizeof r->namespace_id, "%s", e->base.namespace_id);
  snprintf(r->instance_name, sizeof r->instance_name, "%s", e->base.instance_name);
  r->device = e->base.opts.device;
  r->world_size = e->base.opts.world_size;
  r->arena_size = e->arena_size;
  r->copy_mode = e->base.opts.copy_mode;
  r->copy_cta_limit = e->base.opts.copy_cta_limit;
  if (e->base.codec.id != OI_CODEC_NONE) {
    snprintf(r->codec, sizeof r->codec, "%s", oi__codec_name(e->base.codec.id));
    r->codec_tokens = e->base.opts.codec_tokens;
    r->codec_heads = e->base.opts.codec_heads;
    r->codec_head_dim = e->base.opts.codec_head_dim;
    r->codec_slot_bytes = e->base.codec.slot_bytes;
  }
  if (e->owned) {
    r->client_owned = true;
    if (e->owned_fd < 0) { /* cuda: the IPC handle; cpu: the fd rides with the frame */
      r->client_handle.size = OI_WIRE_HANDLE_BYTES;
      memcpy(r->client_handle.bytes, e->owned_handle.bytes, OI_WIRE_HANDLE_BYTES);
      r->client_offset = e->owned_offset;
    }
  }
  memset(out, 0, sizeof *out);
  out->arenas = e->reg_arenas;
  out->n_arenas = e->base.opts.num_arenas;
  out->segment_offsets = e->reg_segment_offsets;
  out->n_segment_offsets = e->reg_segment_offsets ? e->n_reg_segment_offsets : 0;
}

static oi_status check_register_reply(remote_engine *e, const oiwire_RegisterReply *rr,
                                      const char *what) {
  uint32_t want = e->owned ? 0 : OI_WIRE_HANDLE_BYTES;
  if (rr->instance_id == 0 || rr->arena_handle.size != want)
    return oi__fail(OI_ERR_PROTOCOL, "%s: register reply has instance %u and a %u-byte handle",
                    what, rr->instance_id, (unsigned)rr->arena_handle.size);
  if (rr->arena_bytes < e->arena_size)
    return oi__fail(OI_ERR_PROTOCOL, "%s: the server %s %llu bytes, %llu asked for", what,
                    e->owned ? "mapped" : "allocated", (unsigned long long)rr->arena_bytes,
                    (unsigned long long)e->arena_size);
  return OI_OK;
}

static oi_status register_layout(remote_engine *e, oi_arena_handle *handle) {
  oiwire_Envelope env;
  oi_wire_out out;
  fill_register(e, &env, &out);
  pending p;
  memset(&p, 0, sizeof p);
  oi_status st = oi__remote_call(e, &env, &out, &p, e->control_ms, "connect: register");
  if (st != OI_OK) return st;
  if (p.reply.which_body != oiwire_Envelope_register_reply_tag)
    return oi__remote_unexpected_reply(&p, "connect: register");
  const oiwire_RegisterReply *rr = &p.reply.body.register_reply;
  if (rr->instance_id) {
    pthread_mutex_lock(&e->lock);
    e->base.instance_id = rr->instance_id;
    pthread_mutex_unlock(&e->lock);
  }
  if ((st = check_register_reply(e, rr, "connect")) != OI_OK) return st;
  if (!e->owned) memcpy(handle->bytes, rr->arena_handle.bytes, OI_WIRE_HANDLE_BYTES);
  return OI_OK;
}

/* ---- reconnecting (engine-owned memory) ---------------------------------------------- */

/* One request and its reply on a connection the reader has not installed
 * yet (reader thread only: it uses the reader's buffers). */
static oi_status sync_call(remote_engine *e, int fd, oiwire_Envelope *env, const oi_wire_out *out,
                           const char *what) {
  uint8_t *frame;
  size_t len;
  oi_status st = oi__wire_encode(env, out, &frame, &len);
  if (st != OI_OK) return st;
  if (env->which_body == oiwire_Envelope_register_instance_tag && e->owned_fd >= 0)
    st = oi__wire_send_fd(fd, frame, len, e->owned_fd);
  else
    st = oi__wire_send(fd, frame, len);
  oi__free(frame);
  if (st != OI_OK) return st;
  uint64_t deadline = oi__deadline_ns(e->control_ms);
  for (;;) {
    uint64_t now = oi__now_ns();
    if (now >= deadline)
      return oi__fail(OI_ERR_TIMEOUT, "%s: no reply within %u ms", what, e->control_ms);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc = poll(&pfd, 1, (int)OI_MIN((deadline - now) / 1000000u + 1, 1000u));
    if (rc < 0 && errno != EINTR) return oi__fail(OI_ERR_IO, "%s: poll: %s", what, strerror(errno));
    if (rc <= 0) continue;
    if ((st = oi__wire_recv(fd, OI_WIRE_MAX_FRAME, &e->frame, &e->frame_cap, &len)) != OI_OK ||
        (st = oi__wire_decode(e->frame, len, &e->env, &e->arrays)) != OI_OK) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s", oi_last_error());
      return oi__fail(st, "%s: %s", what, msg);
    }
    bool mine = e->env.request_id == env->request_id;
    if (e->env.which_body == oiwire_Envelope_result_tag && (mine || e->env.request_id == 0)) {
      oi_status rs = e->env.body.result.status;
      if (rs != OI_OK)
        return oi__fail(rs < 0 ? rs : OI_ERR_PROTOCOL, "%s: %s", what, e->env.body.result.message);
    }
    if (mine) return OI_OK;
  }
}

/* Connects, says Hello and registers the layout and memory again; on
 * success installs the new connection (a new generation). Reader thread. */
oi_status oi__remote_reconnect(remote_engine *e) {
  int fd = -1;
  oi_status st = oi__wire_connect(e->socket_path, &fd);
  if (st != OI_OK) return st;
  pthread_mutex_lock(&e->lock);
  bool stop = e->stop;
  if (!stop) e->connecting_fd = fd;
  pthread_mutex_unlock(&e->lock);
  if (stop) {
    close(fd);
    return oi__fail(OI_ERR_CLOSED, "reconnect: the engine is being destroyed");
  }
  oiwire_Envelope env;
  oi_wire_out out;
  uint64_t epoch = 0;
  uint32_t id = 0;
  fill_hello(e, &env);
  env.request_id = 1;
  if ((st = sync_call(e, fd, &env, NULL, "reconnect: hello")) != OI_OK) goto fail;
  if ((st = check_hello_reply(e, &e->env, "reconnect: hello")) != OI_OK) goto fail;
  epoch = e->env.body.hello_reply.server_epoch;
  uint64_t caps = e->env.body.hello_reply.capabilities;
  fill_register(e, &env, &out);
  env.request_id = 2;
  if ((st = sync_call(e, fd, &env, &out, "reconnect: register")) != OI_OK) goto fail;
  if (e->env.which_body != oiwire_Envelope_register_reply_tag) {
    st = oi__fail(OI_ERR_PROTOCOL, "reconnect: register: the server answered with message type %u",
                  e->env.which_body);
    goto fail;
  }
  if ((st = check_register_reply(e, &e->env.body.register_reply, "reconnect")) != OI_OK) goto fail;
  id = e->env.body.register_reply.instance_id;

  pthread_mutex_lock(&e->write_lock);
  pthread_mutex_lock(&e->lock);
  e->connecting_fd = -1;
  if (e->stop) {
    pthread_mutex_unlock(&e->lock);
    pthread_mutex_unlock(&e->write_lock);
    close(fd); /* the server cleans the instance up with the session */
    return oi__fail(OI_ERR_CLOSED, "reconnect: the engine is being destroyed");
  }
  int old_fd = e->fd;
  uint64_t old_epoch = e->server_epoch;
  uint32_t old_id = e->base.instance_id;
  e->fd = fd;
  e->gen++;
  e->base.instance_id = id;
  e->server_epoch = epoch;
  e->server_caps = caps;
  e->server_pid = oi__wire_peer_pid(fd);
  atomic_store(&e->unresponsive, false); /* a server that registered us answers */
  e->probe_id = 0;
  e->state = CONN_LIVE;
  e->conn_msg[0] = '\0';
  e->conn_status = 0;
  uint32_t n = ++e->reconnects;
  pthread_mutex_unlock(&e->lock);
  pthread_mutex_unlock(&e->write_lock);
  close(old_fd);
  OI_LOG_I(OI_LOG_WARN, "engine", id,
           "reconnected to %s: epoch %016llx (was %016llx), instance %u (was %u), reconnect %u; "
           "the layout and memory are registered again, leases of the old epoch are invalid",
           e->socket_path, (unsigned long long)epoch, (unsigned long long)old_epoch, id, old_id, n);
  return OI_OK;

fail:
  pthread_mutex_lock(&e->lock);
  e->connecting_fd = -1;
  pthread_mutex_unlock(&e->lock);
  close(fd);
  return st;
}

/* ---- connect ------------------------------------------------------------------------- */

/* Engine-owned memory: what travels to the server (cpu: a duplicate of the
 * memfd; cuda: the allocation's IPC handle and the arena's offset in it). */
static oi_status prepare_owned(remote_engine *e, const oi_engine_options *o) {
  if (o->device == OI_DEVICE_CPU) {
    if (o->arena_fd < 0)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "connect: engine-owned cpu memory (arena_base set) needs arena_fd, a memfd "
                      "sealed with F_SEAL_SHRINK that arena_base maps");
    oi_status st = oi__fd_arena_check(o->arena_fd, e->arena_size, "connect");
    if (st == OI_OK)
      st = oi__fd_arena_check_mapping(o->arena_fd, o->arena_base, e->arena_size, "connect");
    if (st != OI_OK) return st;
    e->owned_fd = fcntl(o->arena_fd, F_DUPFD_CLOEXEC, 0);
    if (e->owned_fd < 0) return oi__fail(OI_ERR_IO, "connect: dup(arena_fd): %s", strerror(errno));
    return OI_OK;
  }
  if (o->arena_fd != -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_fd is for cpu memory; device %d's memory is exported with "
                    "CUDA IPC (arena_fd must be -1)",
                    o->device);
  oi_dev *dev = NULL;
  oi_status st = oi__dev_open(o->device, &dev);
  if (st != OI_OK) return st;
  st = dev->ops->mem_export_range(dev, o->arena_base, e->arena_size, &e->owned_handle,
                                  &e->owned_offset);
  oi__dev_close(dev);
  if (st != OI_OK) {
    char msg[384];
    snprintf(msg, sizeof msg, "%s", oi_last_error());
    return oi__fail(st, "connect: %s", msg);
  }
  return OI_OK;
}

/* A copy of the layout by offsets, to register it again after a reconnect. */
static oi_status keep_layout(remote_engine *e, const oi_engine_options *o) {
  e->reg_arenas = oi__calloc(o->num_arenas ? o->num_arenas : 1, sizeof *e->reg_arenas);
  e->reg_names = oi__calloc(o->num_arenas ? o->num_arenas : 1, sizeof *e->reg_names);
  if (!e->reg_arenas || !e->reg_names)
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
  for (uint32_t i = 0; i < o->num_arenas; i++) {
    e->reg_arenas[i] = o->arenas[i];
    if (o->arenas[i].name && !(e->reg_names[i] = oi__strdup(o->arenas[i].name)))
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
    e->reg_arenas[i].name = e->reg_names[i];
  }
  if (o->segment_offsets && o->num_segment_offsets) {
    e->reg_segment_offsets = oi__calloc(o->num_segment_offsets, sizeof(uint64_t));
    if (!e->reg_segment_offsets) return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
    memcpy(e->reg_segment_offsets, o->segment_offsets, o->num_segment_offsets * sizeof(uint64_t));
    e->n_reg_segment_offsets = o->num_segment_offsets;
  }
  return OI_OK;
}

oi_status oi__remote_engine_connect(const char *socket_path, const oi_engine_options *o,
                                    oi_engine **out, oi_imported_arena **arena_out) {
  oi_engine_options opts;
  oi_engine_options_init(&opts);
  oi_status st = oi__struct_in_min(&opts, sizeof opts, o, OI_FLOOR_ENGINE_OPTIONS, "connect");
  if (st != OI_OK) return st;
  bool owned = opts.arena_base != NULL;
  if (!owned && !arena_out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_out is NULL (the server allocates the arena; it is optional "
                    "only with engine-owned memory, arena_base set)");
  if (!owned && opts.arena_fd != -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_fd %d without arena_base (engine-owned cpu memory is "
                    "arena_base, mapped from arena_fd)",
                    opts.arena_fd);
  if (opts.num_arenas && !opts.arenas)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: layout has no arenas");
  if (opts.num_arenas > OI_WIRE_MAX_ARENAS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: %u arenas (at most %u)", opts.num_arenas,
                    OI_WIRE_MAX_ARENAS);
  for (uint32_t i = 0; i < opts.num_arenas; i++) {
    if (opts.arenas[i].base)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "connect: arena %u sets base; a sidecar layout is given by offsets", i);
    if (opts.arenas[i].name && strlen(opts.arenas[i].name) > 255)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: arena %u's name is longer than 255 bytes",
                      i);
  }
  if (opts.instance_name && strlen(opts.instance_name) > 255)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: instance_name is longer than 255 bytes");
  if (opts.control_deadline_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: control_deadline_ms is 0");
  uint64_t extent = 0;
  if (opts.num_arenas && opts.arenas && !layout_extent(&opts, &extent))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: the layout spans more than the address space");
  uint64_t arena_size = opts.arena_size ? opts.arena_size : extent;
  if (arena_size > UINT64_MAX - OI_ENGINE_STANDIN_BASE)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: arena_size %llu is too large",
                    (unsigned long long)arena_size);
  if (owned && (uintptr_t)opts.arena_base > UINTPTR_MAX - arena_size)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "connect: arena_base + arena_size wraps around the address space");
  char def[108];
  if (!socket_path) {
    if ((st = oi__wire_default_socket_path(def, sizeof def)) != OI_OK) return st;
    socket_path = def;
  }

  remote_engine *e = oi__calloc(1, sizeof *e);
  if (!e) return oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
  e->base.ops = &oi__remote_ops;
  e->fd = -1;
  e->owned_fd = -1;
  e->connecting_fd = -1;
  e->owned = owned;
  e->arena_size = arena_size;
  e->state = CONN_CONNECTING;
  oi__remote_init_sync(e);
  /* Validate the whole layout before talking to the server; the real base
   * is known after the import (or is the caller's, engine-owned). */
  void *owned_base = opts.arena_base;
  opts.arena_base = NULL;
  opts.arena_size = arena_size;
  if ((st = oi__engine_init_unmapped(&e->base, &opts, "connect")) != OI_OK) {
    if (e->kick_fd >= 0) close(e->kick_fd);
    pthread_mutex_destroy(&e->teardown_lock);
    pthread_mutex_destroy(&e->write_lock);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->lock);
    oi__free(e);
    return st;
  }
  e->control_ms = opts.control_deadline_ms;
  e->lookup_ms = opts.lookup_deadline_ms;
  e->probe_ms = opts.probe_interval_ms;
  e->socket_path = oi__strdup(socket_path);
  if (!e->socket_path) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "connect: out of memory");
    goto fail;
  }
  if ((st = keep_layout(e, &opts)) != OI_OK) goto fail;
  if (owned) {
    opts.arena_base = owned_base;
    st = prepare_owned(e, &opts);
    opts.arena_base = NULL;
    if (st != OI_OK) goto fail;
  }
  if (e->kick_fd < 0) {
    st = oi__fail(OI_ERR_INTERNAL, "connect: eventfd: %s", strerror(errno));
    goto fail;
  }
  if ((st = oi__wire_connect(socket_path, &e->fd)) != OI_OK) goto fail;
  e->server_pid = oi__wire_peer_pid(e->fd);
  int rc = pthread_create(&e->reader, NULL, oi__remote_reader_main, e);
  if (rc != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "connect: cannot start the reader thread: %s", strerror(rc));
    goto fail;
  }
  pthread_setname_np(e->reader, "oi-remote-read");
  e->reader_started = true;
  if ((st = oi__remote_hello(e)) != OI_OK) goto fail;
  oi_arena_handle handle;
  if ((st = register_layout(e, &handle)) != OI_OK) {
    if (oi__remote_instance_of(e)) goto fail_registered;
    goto fail;
  }
  oi_imported_arena *arena = NULL;
  if (owned) {
    oi__engine_rebase(&e->base, owned_base, arena_size);
  } else {
    if ((st = oi_imported_arena_open(&handle, arena_size, opts.device, &arena)) != OI_OK) {
      char msg[384];
      snprintf(msg, sizeof msg, "%s", oi_last_error());
      oi__fail(st, "connect: importing the server's arena: %s", msg);
      goto fail_registered;
    }
    oi__engine_rebase(&e->base, oi_imported_arena_ptr(arena), oi_imported_arena_size(arena));
    e->arena = arena;
    e->arena_open = true;
    oi__imported_arena_on_close(arena, oi__remote_on_arena_closed, e);
  }
  pthread_mutex_lock(&e->lock);
  bool alive = e->state == CONN_CONNECTING;
  if (alive) e->state = CONN_LIVE; /* the watchdog is armed */
  uint64_t epoch = e->server_epoch;
  pthread_mutex_unlock(&e->lock);
  if (!alive) {
    if (arena) {
      oi__imported_arena_on_close(arena, NULL, NULL);
      oi_imported_arena_close(arena);
    }
    st = oi__remote_closed_error(e, "connect");
    goto fail;
  }
  OI_LOG_I(OI_LOG_INFO, "engine", oi__remote_instance_of(e),
           "connected to %s (epoch %016llx): %u arenas, %llu blocks, %llu-byte %s arena",
           socket_path, (unsigned long long)epoch, e->base.layout.num_arenas,
           (unsigned long long)e->base.layout.num_blocks, (unsigned long long)arena_size,
           owned ? "engine-owned" : "server-allocated");
  *out = &e->base;
  if (arena_out) *arena_out = arena;
  return OI_OK;

fail_registered : {
  /* Nothing maps the arena here: the server may free it. */
  char msg[512];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  if (oi__remote_send_unregister(e) != OI_OK)
    OI_LOG(OI_LOG_WARN, "engine", "connect: unregister after a failed import: %s", oi_last_error());
  oi__fail(st, "%s", msg);
}
fail : {
  char msg[512];
  snprintf(msg, sizeof msg, "%s", oi_last_error());
  pthread_mutex_lock(&e->lock);
  if (e->state != CONN_DEAD) e->state = CONN_RETIRED;
  pthread_mutex_unlock(&e->lock);
  if (st == OI_ERR_CLOSED && e->reader_started) {
    /* The server closed the session (EPIPE on our send): its reason, if it
     * sent one, arrives before the end of stream. Wait for that end up to
     * the control deadline, not for good: OI_ERR_CLOSED may also be a
     * reply's status on a connection that stays open (oi__remote_free_engine cuts it). */
    struct timespec ts = oi__remote_abs_timespec(oi__deadline_ns(e->control_ms));
    pthread_mutex_lock(&e->lock);
    while (e->state != CONN_DEAD && pthread_cond_timedwait(&e->cv, &e->lock, &ts) != ETIMEDOUT) {
    }
    if (e->state == CONN_DEAD && e->conn_status) {
      st = e->conn_status;
      snprintf(msg, sizeof msg, "connect: the server refused the session: %.400s", e->conn_msg);
    }
    pthread_mutex_unlock(&e->lock);
  }
  oi__remote_free_engine(e);
  return oi__fail(st, "%s", msg);
}
}
