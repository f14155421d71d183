/* The checks a request gets before it touches an instance or the host,
 * shared by the session (session.c runs each one where its handler needs it)
 * and the frame fuzzer (fuzz/fuzz_frame.c), which feeds bytes through the
 * same framing, decoding and validation without a socket. */
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "server_internal.h"

static oi_status fail_msg(oi_status st, char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static oi_status fail_msg(oi_status st, char *msg, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, cap, fmt, ap);
  va_end(ap);
  return st;
}

oi_status oi__req_check_hello(const oiwire_Hello *h, char *msg, size_t cap) {
  if (h->protocol_version != OI_WIRE_PROTOCOL_VERSION)
    return fail_msg(OI_ERR_VERSION, msg, cap,
                    "hello: protocol version %u is not supported (server speaks %u)",
                    h->protocol_version, OI_WIRE_PROTOCOL_VERSION);
  return OI_OK;
}

oi_status oi__req_check_arrays(const oi_wire_arrays *a, const char *what, char *msg, size_t cap) {
  if (a->bad == OI_OK) return OI_OK;
  return fail_msg(a->bad, msg, cap, "%s: %s", what, a->bad_msg);
}

oi_status oi__req_check_save(const oi_wire_arrays *a, char *msg, size_t cap) {
  oi_status st = oi__req_check_arrays(a, "save", msg, cap);
  if (st != OI_OK) return st;
  if (a->n_ids != a->n_hashes)
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap, "save: %zu block ids but %zu hashes",
                    a->n_ids, a->n_hashes);
  return OI_OK;
}

oi_status oi__req_lease(const char *what, const uint8_t *bytes, size_t size, oi_lease *lease,
                        char *msg, size_t cap) {
  if (size != OI_WIRE_LEASE_BYTES)
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap, "%s: lease is %zu bytes (16 expected)", what,
                    size);
  memcpy(lease->bytes, bytes, OI_WIRE_LEASE_BYTES);
  return OI_OK;
}

/* Bytes the server will allocate for one arena at most (a sanity bound; the
 * device refuses what it cannot hold anyway). */
#define MAX_ARENA_BYTES (1ull << 48)

oi_status oi__req_register_options(const oiwire_Register *r, const oi_wire_arrays *a,
                                   oi_engine_options *eo, oi_arena_desc **descs_out, char *msg,
                                   size_t cap) {
  *descs_out = NULL;
  if (r->arena_size == 0 || r->arena_size > MAX_ARENA_BYTES)
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap, "register: arena_size %llu is %s",
                    (unsigned long long)r->arena_size, r->arena_size ? "too large" : "0");
  if (a->n_arenas == 0)
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap, "register: layout has no arenas");
  if (!r->client_owned && (r->client_handle.size || r->client_offset))
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap,
                    "register: client_handle and client_offset are for engine-owned memory "
                    "(client_owned)");
  if (r->client_owned && r->device == OI_DEVICE_CPU && (r->client_handle.size || r->client_offset))
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap,
                    "register: an engine-owned cpu arena is a memfd sent with the request "
                    "(SCM_RIGHTS), mapped from offset 0: client_handle must be empty and "
                    "client_offset 0");
  if (r->client_owned && r->device != OI_DEVICE_CPU &&
      r->client_handle.size != OI_WIRE_HANDLE_BYTES)
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap,
                    "register: an engine-owned device arena needs its %u-byte IPC handle (got %u "
                    "bytes)",
                    OI_WIRE_HANDLE_BYTES, (unsigned)r->client_handle.size);
  if (r->client_owned && r->client_offset > MAX_ARENA_BYTES)
    return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap, "register: client_offset %llu is too large",
                    (unsigned long long)r->client_offset);
  /* Segment offsets: none, or one per segment of every arena. */
  size_t n_offs = 0;
  bool with_offs = false;
  for (size_t i = 0; i < a->n_arenas; i++) {
    with_offs |= a->arenas[i].segment_offsets_count > 0;
    n_offs += a->arenas[i].segment_offsets_count;
  }
  for (size_t i = 0; with_offs && i < a->n_arenas; i++)
    if (a->arenas[i].segment_offsets_count != a->arenas[i].segments)
      return fail_msg(OI_ERR_INVALID_ARGUMENT, msg, cap,
                      "register: arena '%s' has %u segment offsets for %u segments (every arena "
                      "gives one per segment, or none does)",
                      a->arenas[i].name, (unsigned)a->arenas[i].segment_offsets_count,
                      a->arenas[i].segments);
  /* One allocation: the descriptors, then the offsets (freed together). */
  oi_arena_desc *descs = oi__calloc(1, a->n_arenas * sizeof *descs + n_offs * sizeof(uint64_t));
  if (!descs) return fail_msg(OI_ERR_OUT_OF_MEMORY, msg, cap, "register: out of memory");
  uint64_t *offs = (uint64_t *)(descs + a->n_arenas);
  for (size_t i = 0, k = 0; i < a->n_arenas; i++) {
    const oiwire_Arena *w = &a->arenas[i];
    for (pb_size_t s = 0; s < w->segment_offsets_count; s++)
      offs[k++] = w->segment_offsets[s];
    descs[i] = (oi_arena_desc){.name = w->name,
                               .offset = w->offset,
                               .num_blocks = w->num_blocks,
                               .bytes_per_block = w->bytes_per_block,
                               .block_stride = w->block_stride,
                               .segments = w->segments,
                               .segment_stride = w->segment_stride};
  }
  oi_engine_options_init(eo);
  eo->device = r->device;
  eo->namespace_id = r->namespace_id;
  eo->instance_name = r->instance_name;
  eo->world_size = r->world_size;
  eo->num_arenas = (uint32_t)a->n_arenas;
  eo->arenas = descs;
  eo->segment_offsets = with_offs ? offs : NULL;
  eo->num_segment_offsets = (uint32_t)n_offs;
  /* The sidecar copies by DMA unless asked otherwise: its copy kernels would
   * time-slice with the client's model (docs/server.md). */
  eo->copy_mode = r->copy_mode == OI_COPY_AUTO ? OI_COPY_DMA : r->copy_mode;
  eo->copy_cta_limit = r->copy_cta_limit;
  eo->arena_size = r->arena_size;
  eo->codec = r->codec[0] ? r->codec : NULL;
  eo->codec_tokens = r->codec_tokens;
  eo->codec_heads = r->codec_heads;
  eo->codec_head_dim = r->codec_head_dim;
  eo->codec_slot_bytes = r->codec_slot_bytes;
  /* Validate everything before anything is allocated. */
  oi_status st = oi__engine_validate_unmapped(eo, "register");
  if (st != OI_OK) {
    snprintf(msg, cap, "%s", oi_last_error());
    oi__free(descs);
    return st;
  }
  *descs_out = descs;
  return OI_OK;
}

oi_status oi__request_check(const oiwire_Envelope *env, const oi_wire_arrays *a, char *msg,
                            size_t cap) {
  msg[0] = '\0';
  oi_lease lease;
  oi_status st;
  switch (env->which_body) {
  case oiwire_Envelope_hello_tag: return oi__req_check_hello(&env->body.hello, msg, cap);
  case oiwire_Envelope_register_instance_tag: {
    if ((st = oi__req_check_arrays(a, "register", msg, cap)) != OI_OK) return st;
    oi_engine_options eo;
    oi_arena_desc *descs;
    st = oi__req_register_options(&env->body.register_instance, a, &eo, &descs, msg, cap);
    oi__free(descs);
    return st;
  }
  case oiwire_Envelope_save_tag: return oi__req_check_save(a, msg, cap);
  case oiwire_Envelope_query_tag: return oi__req_check_arrays(a, "query", msg, cap);
  case oiwire_Envelope_load_tag:
    if ((st = oi__req_check_arrays(a, "load", msg, cap)) != OI_OK) return st;
    return oi__req_lease("load", env->body.load.lease.bytes, env->body.load.lease.size, &lease, msg,
                         cap);
  case oiwire_Envelope_release_tag:
    return oi__req_lease("release", env->body.release.lease.bytes, env->body.release.lease.size,
                         &lease, msg, cap);
  case oiwire_Envelope_flush_tag:
  case oiwire_Envelope_unregister_tag:
  case oiwire_Envelope_stats_tag: return OI_OK;
  case 0:
    return fail_msg(OI_ERR_UNSUPPORTED, msg, cap,
                    "unknown message type (the envelope has no body this server knows)");
  default:
    return fail_msg(OI_ERR_UNSUPPORTED, msg, cap, "message type %u is a reply, not a request",
                    env->which_body);
  }
}
