/* Public engine functions: argument validation shared by every engine kind,
 * then dispatch. Bad input is refused here, before any state changes. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/query.h"

/* Bounds of the tuning fields of oi_engine_options (docs/api.md). */
#define OI_MIN_SUBMIT_GROUP_BYTES (64ull << 10)
#define OI_MIN_STAGING_BYTES (4ull << 20)
#define OI_MAX_STAGING_BYTES (4ull << 30)

OI_API oi_status oi_engine_options_init(oi_engine_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "engine_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->device = OI_DEVICE_CPU;
  o->world_size = 1;
  o->save_deadline_ms = 120000;
  o->load_deadline_ms = 120000;
  o->copy_mode = OI_COPY_AUTO;
  o->control_deadline_ms = 30000;
  o->arena_fd = -1;
  o->lookup_deadline_ms = 50;
  o->probe_interval_ms = 100;
  return OI_OK;
}

OI_API oi_status oi_save_options_init(oi_save_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "save_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  return OI_OK;
}

OI_API oi_status oi_load_options_init(oi_load_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "load_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  return OI_OK;
}

oi_status oi__engine_init_common(oi_engine *e, const oi_engine_options *o, const char *what) {
  oi_engine_options opts;
  oi_engine_options_init(&opts);
  oi_status st = oi__struct_in_min(&opts, sizeof opts, o, OI_FLOOR_ENGINE_OPTIONS, what);
  if (st != OI_OK) return st;
  if (!opts.namespace_id || !opts.namespace_id[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: namespace_id is empty", what);
  if (strlen(opts.namespace_id) > 255)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: namespace_id is longer than 255 bytes", what);
  if (opts.world_size == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: world_size is 0 (leases need a consumer)", what);
  if (opts.copy_mode > OI_COPY_STAGED)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: copy_mode %u is not an oi_copy_mode", what,
                    opts.copy_mode);
  if (opts.device < -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: device %d is not an ordinal", what, opts.device);
  if (opts.lookup_deadline_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: lookup_deadline_ms is 0", what);
  if (opts.probe_interval_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: probe_interval_ms is 0", what);
  if (opts.submit_group_bytes && opts.submit_group_bytes < OI_MIN_SUBMIT_GROUP_BYTES)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: submit_group_bytes %llu is below 64 KiB (0: the copy mode's default)",
                    what, (unsigned long long)opts.submit_group_bytes);
  if (opts.staging_bytes &&
      (opts.staging_bytes < OI_MIN_STAGING_BYTES || opts.staging_bytes > OI_MAX_STAGING_BYTES))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: staging_bytes %llu is outside [4 MiB, 4 GiB] (0: the default, 32 MiB)",
                    what, (unsigned long long)opts.staging_bytes);
  if ((st = oi__layout_build(&opts, what, &e->layout)) != OI_OK) return st;
  if ((st = oi__engine_codec_resolve(&opts, &e->layout, what, &e->codec)) != OI_OK) {
    oi__layout_free(&e->layout);
    return st;
  }
  e->namespace_id = oi__strdup(opts.namespace_id);
  e->instance_name = oi__strdup(opts.instance_name ? opts.instance_name : "");
  if (!e->namespace_id || !e->instance_name) {
    oi__engine_fini_common(e);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
  opts.namespace_id = e->namespace_id;
  opts.instance_name = e->instance_name;
  opts.arenas = NULL; /* the validated copy lives in e->layout */
  opts.segment_offsets = NULL;
  opts.num_segment_offsets = 0;
  opts.codec = oi__codec_name(e->codec.id); /* static */
  e->opts = opts;
  return OI_OK;
}

void oi__engine_fini_common(oi_engine *e) {
  oi__layout_free(&e->layout);
  oi__free(e->namespace_id);
  oi__free(e->instance_name);
  e->namespace_id = e->instance_name = NULL;
}

oi_status oi__engine_init_unmapped(oi_engine *e, const oi_engine_options *o, const char *what) {
  oi_engine_options opts = *o; /* (struct_size: the caller's copy is current) */
  opts.arena_base = (void *)OI_ENGINE_STANDIN_BASE;
  oi_status st = oi__engine_init_common(e, &opts, what);
  if (st != OI_OK) {
    oi__engine_fini_common(e);
    return st;
  }
  e->opts.arena_base = NULL;
  return OI_OK;
}

void oi__engine_rebase(oi_engine *e, void *base, uint64_t size) {
  for (uint32_t i = 0; i < e->layout.num_arenas; i++)
    e->layout.arenas[i].base = e->layout.arenas[i].base - OI_ENGINE_STANDIN_BASE + (uintptr_t)base;
  e->opts.arena_size = size;
}

oi_status oi__engine_validate_unmapped(const oi_engine_options *o, const char *what) {
  oi_engine probe;
  memset(&probe, 0, sizeof probe);
  oi_status st = oi__engine_init_unmapped(&probe, o, what);
  if (st == OI_OK) oi__engine_fini_common(&probe);
  return st;
}

OI_API oi_status oi_engine_create(oi_host *h, const oi_engine_options *o, oi_engine **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "register: out is NULL");
  *out = NULL;
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "register: host is NULL");
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "register: options is NULL");
  oi_engine_options opts;
  oi_engine_options_init(&opts);
  oi_status st = oi__struct_in_min(&opts, sizeof opts, o, OI_FLOOR_ENGINE_OPTIONS, "register");
  if (st != OI_OK) return st;
  if (opts.arena_fd != -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "register: arena_fd %d is for oi_engine_connect (an engine-owned "
                    "sidecar arena); an embedded engine takes -1",
                    opts.arena_fd);
  return oi__local_engine_create(h, o, out);
}

OI_API oi_status oi_engine_connect(const char *socket_path, const oi_engine_options *o,
                                   oi_engine **out, oi_imported_arena **arena_out) {
  if (out) *out = NULL;
  if (arena_out) *arena_out = NULL;
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: out is NULL");
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "connect: options is NULL");
  /* arena_out is optional with engine-owned memory (arena_base set): checked
   * once the options are read (remote_connect.c). */
  return oi__remote_engine_connect(socket_path, o, out, arena_out);
}

OI_API void oi_engine_destroy(oi_engine *e) {
  if (e) e->ops->destroy(e);
}

static oi_status check_ids(const oi_engine *e, const char *what, const int64_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || (uint64_t)ids[i] >= e->layout.num_blocks)
      return oi__fail(
          OI_ERR_INVALID_ARGUMENT,
          "%s: block id %lld (position %zu) out of range for arena '%s' with %llu blocks", what,
          (long long)ids[i], i, e->layout.arenas[0].name, (unsigned long long)e->layout.num_blocks);
  return OI_OK;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static oi_status twice(const char *what, int64_t id) {
  return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: destination block id %lld appears twice", what,
                  (long long)id);
}

/* ids[0..n) are in range (check_ids): a bitmap of the arena's blocks finds a
 * repeat in one pass when it is small against the call (a sort otherwise). */
static oi_status check_distinct(const oi_engine *e, const char *what, const int64_t *ids,
                                size_t n) {
  if (n < 2) return OI_OK;
  uint64_t words = (e->layout.num_blocks + 63) / 64;
  if (words <= 64 || words <= (uint64_t)n) {
    uint64_t stack_bits[64], *bits = words <= 64 ? stack_bits : oi__calloc(words, 8);
    if (!bits) return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    if (bits == stack_bits) memset(stack_bits, 0, sizeof stack_bits);
    oi_status st = OI_OK;
    for (size_t i = 0; i < n; i++) {
      uint64_t b = (uint64_t)ids[i], m = 1ull << (b & 63);
      if (bits[b >> 6] & m) {
        st = twice(what, ids[i]);
        break;
      }
      bits[b >> 6] |= m;
    }
    if (bits != stack_bits) oi__free(bits);
    return st;
  }
  int64_t stack[256], *sorted = n <= 256 ? stack : oi__malloc(n * sizeof *sorted);
  if (!sorted) return oi__fail(OI_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
  memcpy(sorted, ids, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cmp_i64);
  oi_status st = OI_OK;
  for (size_t i = 1; i < n && st == OI_OK; i++)
    if (sorted[i] == sorted[i - 1]) st = twice(what, sorted[i]);
  if (sorted != stack) oi__free(sorted);
  return st;
}

OI_API oi_status oi_engine_save(oi_engine *e, const int64_t *block_ids, const oi_block_hash *hashes,
                                size_t n, const oi_save_options *opt, oi_ticket **ticket_out) {
  if (ticket_out) *ticket_out = NULL;
  if (!e) return oi__fail(OI_ERR_INVALID_ARGUMENT, "save: engine is NULL");
  if (n == 0) return oi__fail(OI_ERR_INVALID_ARGUMENT, "save: no blocks (n = 0)");
  if (!block_ids || !hashes)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "save: %s is NULL",
                    block_ids ? "hashes" : "block_ids");
  oi_status st = check_ids(e, "save", block_ids, n);
  if (st != OI_OK) return st;
  oi_save_options so;
  oi_save_options_init(&so);
  if (opt && (st = oi__struct_in_min(&so, sizeof so, opt, OI_FLOOR_SAVE_OPTIONS, "save")) != OI_OK)
    return st;
  if (so.result) {
    if (so.result->struct_size < sizeof(oi_save_result))
      return oi__fail(
          OI_ERR_INVALID_ARGUMENT,
          "save: result->struct_size %u is too small (set it to sizeof(oi_save_result))",
          so.result->struct_size);
    so.result->accepted = so.result->deduplicated = so.result->dropped = 0;
  }
  if (so.arena_count == 0 && so.arena_first != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "save: arena_first %u without arena_count",
                    so.arena_first);
  if (so.arena_count && (so.arena_first >= e->layout.num_arenas ||
                         so.arena_count > e->layout.num_arenas - so.arena_first))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "save: arenas %u..%u are outside the layout's %u arenas", so.arena_first,
                    so.arena_first + so.arena_count - 1, e->layout.num_arenas);
  if (so.arena_count && (st = check_distinct(e, "save", block_ids, n)) != OI_OK) return st;
  return e->ops->save(e, block_ids, hashes, n, &so, ticket_out);
}

oi_status oi__query_check(const char *what, const oi_block_hash *hashes, size_t n, uint32_t flags,
                          const oi_query_result *out, uint8_t **present, uint32_t *wait_ms) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: out is NULL", what);
  if (out->struct_size < OI_FLOOR_QUERY_RESULT)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: out->struct_size %u is smaller than this struct's 0.1 layout (%zu bytes): "
                    "rebuild against the current headers",
                    what, out->struct_size, (size_t)OI_FLOOR_QUERY_RESULT);
  if (n > 0 && !hashes) return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: hashes is NULL", what);
  const uint32_t known = OI_QUERY_MEMBERSHIP | OI_QUERY_WAIT_PENDING;
  if (flags & ~known)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", what, flags & ~known);
  if ((flags & OI_QUERY_MEMBERSHIP) && (flags & OI_QUERY_WAIT_PENDING))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: OI_QUERY_WAIT_PENDING applies to prefix queries, not membership", what);
  *present = out->present;
  *wait_ms = (flags & OI_QUERY_WAIT_PENDING) ? out->wait_ms : 0;
  if ((flags & OI_QUERY_MEMBERSHIP) && n > 0 && !*present)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: membership needs out->present (n bytes)", what);
  return OI_OK;
}

uint8_t *oi__query_where(const oi_query_result *out) {
  return out->struct_size >= OI_STRUCT_END(oi_query_result, where) ? out->where : NULL;
}

oi_status oi__query_result_out(const oi_host_query_args *a, const oi_host_answer *ans,
                               oi_query_result *out, const char *what) {
  oi_query_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.state = ans->loading ? OI_QUERY_LOADING : OI_QUERY_READY;
  r.hit_blocks = ans->hit_blocks;
  r.pending_blocks = ans->pending_blocks;
  r.lease = ans->lease;
  r.present = a->present;
  r.wait_ms = a->wait_ms;
  r.where = a->where;
  return oi__struct_out_min(out, &r, sizeof r, OI_FLOOR_QUERY_RESULT, what);
}

OI_API oi_status oi_engine_query(oi_engine *e, const char *req_id, const oi_block_hash *hashes,
                                 size_t n, uint32_t flags, oi_query_result *out) {
  if (!e) return oi__fail(OI_ERR_INVALID_ARGUMENT, "query: engine is NULL");
  uint8_t *present;
  uint32_t wait_ms;
  oi_status st = oi__query_check("query", hashes, n, flags, out, &present, &wait_ms);
  if (st != OI_OK) return st;
  return e->ops->query(e, req_id, hashes, n, flags, present, wait_ms, out);
}

OI_API oi_status oi_engine_load(oi_engine *e, oi_lease lease, const int64_t *dst_block_ids,
                                size_t n, const oi_load_options *opt, oi_ticket **ticket_out) {
  if (ticket_out) *ticket_out = NULL;
  if (!e) return oi__fail(OI_ERR_INVALID_ARGUMENT, "load: engine is NULL");
  if (n == 0) return oi__fail(OI_ERR_INVALID_ARGUMENT, "load: no blocks (n = 0)");
  if (!dst_block_ids) return oi__fail(OI_ERR_INVALID_ARGUMENT, "load: dst_block_ids is NULL");
  oi_status st = check_ids(e, "load", dst_block_ids, n);
  if (st == OI_OK) st = check_distinct(e, "load", dst_block_ids, n);
  if (st != OI_OK) return st;
  oi_load_options lo;
  oi_load_options_init(&lo);
  if (opt && (st = oi__struct_in(&lo, sizeof lo, opt, "load")) != OI_OK) return st;
  if (lo.flags & ~(uint32_t)OI_LOAD_ARENA_EVENTS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "load: unknown flags 0x%x",
                    lo.flags & ~(uint32_t)OI_LOAD_ARENA_EVENTS);
  return e->ops->load(e, lease, dst_block_ids, n, &lo, ticket_out);
}

OI_API oi_status oi_engine_release(oi_engine *e, oi_lease lease) {
  if (!e) return oi__fail(OI_ERR_INVALID_ARGUMENT, "release: engine is NULL");
  return e->ops->release(e, lease);
}

OI_API oi_status oi_engine_flush(oi_engine *e, uint32_t timeout_ms) {
  if (!e) return oi__fail(OI_ERR_INVALID_ARGUMENT, "flush: engine is NULL");
  return e->ops->flush(e, timeout_ms);
}

OI_API oi_status oi_engine_get_stats(const oi_engine *e, oi_engine_stats *out) {
  if (!e) return oi__fail(OI_ERR_INVALID_ARGUMENT, "engine_stats: engine is NULL");
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "engine_stats: out is NULL");
  return e->ops->stats(e, out);
}

/* ---- lookups without a layout ---- */

OI_API oi_status oi_lookup_options_init(oi_lookup_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "lookup_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->world_size = 1;
  o->control_deadline_ms = 30000;
  o->lookup_deadline_ms = 50;
  o->probe_interval_ms = 100;
  return OI_OK;
}

oi_status oi__lookup_options_check(const oi_lookup_options *o, const char *what,
                                   oi_lookup_options *lo) {
  oi_lookup_options_init(lo);
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: options is NULL", what);
  oi_status st = oi__struct_in_min(lo, sizeof *lo, o, OI_FLOOR_LOOKUP_OPTIONS, what);
  if (st != OI_OK) return st;
  if (!lo->namespace_id || !lo->namespace_id[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: namespace_id is empty", what);
  if (strlen(lo->namespace_id) > 255)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: namespace_id is longer than 255 bytes", what);
  if (lo->world_size == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: world_size is 0 (leases need a consumer)", what);
  if (lo->control_deadline_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: control_deadline_ms is 0", what);
  if (lo->lookup_deadline_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: lookup_deadline_ms is 0", what);
  if (lo->probe_interval_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: probe_interval_ms is 0", what);
  if (lo->client_name && strlen(lo->client_name) > 255)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: client_name is longer than 255 bytes", what);
  return OI_OK;
}

OI_API oi_status oi_host_query(oi_host *h, const oi_lookup_options *o, const char *req_id,
                               const oi_block_hash *hashes, size_t n, uint32_t flags,
                               oi_query_result *out) {
  OI_UNUSED(
      req_id); /* the answer depends on the hashes alone (a disk promotion is keyed by them) */
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_query: host is NULL");
  oi_lookup_options lo;
  oi_status st = oi__lookup_options_check(o, "host_query", &lo);
  if (st != OI_OK) return st;
  oi_host_query_args a = {.shares = lo.world_size,
                          .membership = (flags & OI_QUERY_MEMBERSHIP) != 0};
  if ((st = oi__query_check("host_query", hashes, n, flags, out, &a.present, &a.wait_ms)) != OI_OK)
    return st;
  a.where = oi__query_where(out);
  oi_host_answer ans;
  if ((st = oi__host_query(h, lo.namespace_id, &a, hashes, n, &ans)) != OI_OK) return st;
  return oi__query_result_out(&a, &ans, out, "host_query");
}

OI_API oi_status oi_host_release(oi_host *h, const char *namespace_id, oi_lease lease) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_release: host is NULL");
  if (!namespace_id || !namespace_id[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_release: namespace_id is empty");
  return oi__host_lookup_release(h, namespace_id, 0, lease);
}
