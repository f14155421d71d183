/* The test rig: the set-up and checking code that every suite building a
 * host, an arena, an engine or a sidecar client repeats. Header-only (each
 * test is one program and counts its failures in testutil.h's static
 * oi_test_failures), reached through `test_inc` by every suite's meson.build.
 *
 * Everything here is a thin wrapper: it builds the same options and calls
 * the same public functions the tests called by hand, and it REQUIREs
 * (stops the test) where they REQUIREd. Names start with `tr_`; the suites'
 * own rigs (fault_util.h's `rig`, disk's `rig`, cluster's `node`) are built
 * from these. */
#ifndef OI_TEST_RIG_H
#define OI_TEST_RIG_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "openinfer/openinfer.h"
#include "testutil.h"

#define TR_UNUSED __attribute__((unused))

/* ---- hosts ------------------------------------------------------------------------------ */

/* Host options with the defaults but a pool of `pool_bytes`. */
static TR_UNUSED oi_host_options tr_host_options(uint64_t pool_bytes) {
  oi_host_options o;
  REQUIRE(oi_host_options_init(&o) == OI_OK);
  o.pool_bytes = pool_bytes;
  return o;
}

/* Creates a host (REQUIREs success, printing the error otherwise). */
static TR_UNUSED oi_host *tr_host_new(const oi_host_options *o) {
  oi_host *h = NULL;
  oi_status st = oi_host_create(o, &h);
  if (st != OI_OK)
    fprintf(stderr, "host_create(pool %" PRIu64 ", chunk %" PRIu64 "): %s: %s\n", o->pool_bytes,
            o->chunk_bytes, oi_status_str(st), oi_last_error());
  REQUIRE(st == OI_OK && h);
  return h;
}

/* A host with default options but the pool. */
static TR_UNUSED oi_host *tr_host(uint64_t pool_bytes) {
  oi_host_options o = tr_host_options(pool_bytes);
  return tr_host_new(&o);
}

/* Attaches a disk tier in one directory of `capacity_bytes` (0: default).
 * @return the attach call's status. */
static TR_UNUSED oi_status tr_attach_disk(oi_host *h, const char *dir, uint64_t capacity_bytes) {
  oi_host_disk_options d;
  oi_host_disk_options_init(&d);
  const char *dirs[1] = {dir};
  d.dirs = dirs;
  d.num_dirs = 1;
  if (capacity_bytes) d.capacity_bytes = capacity_bytes;
  return oi_host_attach_disk(h, &d);
}

/* tr_host_stats(h), tr_engine_stats(e): a fresh stats struct filled by the
 * call (REQUIRE'd, printing the error otherwise). */
#define TR_STATS_FN(name, type, obj_type, call)                                                    \
  static TR_UNUSED type name(const obj_type *obj) {                                                \
    type s;                                                                                        \
    memset(&s, 0, sizeof s);                                                                       \
    s.struct_size = sizeof s;                                                                      \
    oi_status st = call(obj, &s);                                                                  \
    if (st != OI_OK) fprintf(stderr, #call ": %s: %s\n", oi_status_str(st), oi_last_error());      \
    REQUIRE(st == OI_OK);                                                                          \
    return s;                                                                                      \
  }
TR_STATS_FN(tr_host_stats, oi_host_stats, oi_host, oi_host_get_stats)
TR_STATS_FN(tr_engine_stats, oi_engine_stats, oi_engine, oi_engine_get_stats)

/* ---- arenas ----------------------------------------------------------------------------- */

/* One dense arena (block_stride = bytes_per_block, one segment) of `blocks`
 * blocks of `bytes` at `base` (NULL: by offset, 0). */
static TR_UNUSED oi_arena_desc tr_arena(const char *name, void *base, uint64_t blocks,
                                        uint64_t bytes) {
  return (oi_arena_desc){.name = name,
                         .base = base,
                         .num_blocks = blocks,
                         .bytes_per_block = bytes,
                         .block_stride = bytes,
                         .segments = 1};
}

/* n dense arenas (layers) one after another: arena a named names[a] at
 * mem + a * blocks * bytes, or by that offset when mem is NULL. */
static TR_UNUSED void tr_layers(oi_arena_desc *ad, uint32_t n, const char *const *names,
                                uint8_t *mem, uint64_t blocks, uint64_t bytes) {
  for (uint32_t a = 0; a < n; a++) {
    uint64_t off = (uint64_t)a * blocks * bytes;
    ad[a] = tr_arena(names[a], mem ? mem + off : NULL, blocks, bytes);
    if (!mem) ad[a].offset = off;
  }
}

/* Layer names of tr_layers: "l0", "l1", ... */
static const char *const tr_layer_names[8] = {"l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7"};

/* ---- engines ---------------------------------------------------------------------------- */

/* Engine options with the defaults, namespace `ns` and the arenas. */
static TR_UNUSED oi_engine_options tr_engine_options(const char *ns, const oi_arena_desc *ad,
                                                     uint32_t n) {
  oi_engine_options o;
  REQUIRE(oi_engine_options_init(&o) == OI_OK);
  o.namespace_id = ns;
  o.arenas = ad;
  o.num_arenas = n;
  return o;
}

/* Creates an embedded engine (REQUIREs success, printing the error otherwise). */
static TR_UNUSED oi_engine *tr_engine_new(oi_host *h, const oi_engine_options *o) {
  oi_engine *e = NULL;
  oi_status st = oi_engine_create(h, o, &e);
  if (st != OI_OK)
    fprintf(stderr, "engine_create(ns %s, %u arenas): %s: %s\n", o->namespace_id, o->num_arenas,
            oi_status_str(st), oi_last_error());
  REQUIRE(st == OI_OK && e);
  return e;
}

/* An engine of namespace `ns` over the arenas, with default options. */
static TR_UNUSED oi_engine *tr_engine(oi_host *h, const char *ns, const oi_arena_desc *ad,
                                      uint32_t n) {
  oi_engine_options o = tr_engine_options(ns, ad, n);
  return tr_engine_new(h, &o);
}

/* ---- hashes ----------------------------------------------------------------------------- */

/* The hash whose first 8 bytes are i, byte `at` is `tag`, the rest zero. */
static TR_UNUSED oi_block_hash tr_hash(uint64_t i, unsigned at, uint8_t tag) {
  oi_block_hash h;
  memset(&h, 0, sizeof h);
  memcpy(h.bytes, &i, sizeof i);
  h.bytes[at] = tag;
  return h;
}

/* ---- tickets, saves, loads, queries ----------------------------------------------------- */

/* Waits up to `ms` for a ticket and releases it. @return the wait's status. */
static TR_UNUSED oi_status tr_wait(oi_ticket *t, uint32_t ms) {
  oi_status st = oi_ticket_wait(t, ms);
  oi_ticket_release(t);
  return st;
}

/* What save + wait and load + wait return: the call's error (the ticket, if
 * any, released), or else the wait's status. */
static TR_UNUSED oi_status tr_then_wait(oi_status call, oi_ticket *t, uint32_t ms) {
  if (call != OI_OK) {
    oi_ticket_release(t);
    return call;
  }
  return tr_wait(t, ms);
}

/* save + wait up to `ms`. */
static TR_UNUSED oi_status tr_save(oi_engine *e, const int64_t *ids, const oi_block_hash *hs,
                                   size_t n, uint32_t ms) {
  oi_ticket *t = NULL;
  oi_status st = oi_engine_save(e, ids, hs, n, NULL, &t);
  return tr_then_wait(st, t, ms);
}

/* A layerwise save of arenas [first, first + count) of each block, then a
 * wait up to `ms`. */
static TR_UNUSED oi_status tr_save_arenas(oi_engine *e, const int64_t *ids, const oi_block_hash *hs,
                                          size_t n, uint32_t first, uint32_t count, uint32_t ms) {
  oi_save_options so;
  REQUIRE(oi_save_options_init(&so) == OI_OK);
  so.arena_first = first;
  so.arena_count = count;
  oi_ticket *t = NULL;
  oi_status st = oi_engine_save(e, ids, hs, n, &so, &t);
  return tr_then_wait(st, t, ms);
}

/* load + wait up to `ms`. */
static TR_UNUSED oi_status tr_load(oi_engine *e, oi_lease lease, const int64_t *ids, size_t n,
                                   uint32_t ms) {
  oi_ticket *t = NULL;
  oi_status st = oi_engine_load(e, lease, ids, n, NULL, &t);
  return tr_then_wait(st, t, ms);
}

/* A query (flags 0: prefix, with a lease) into a fresh result (present as
 * given, for membership). @return the call's status. */
static TR_UNUSED oi_status tr_query(oi_engine *e, const char *req, const oi_block_hash *hs,
                                    size_t n, uint32_t flags, uint8_t *present,
                                    oi_query_result *out) {
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  out->present = present;
  return oi_engine_query(e, req, hs, n, flags, out);
}

/* ---- executors ------------------------------------------------------------------------- */

/* Submits a request of the n tokens at p for `max_new` new ones on `rank`
 * (-1: round robin); the submit is CHECKed. @return the request's id. */
static TR_UNUSED uint64_t tr_submit(oi_executor *x, const uint32_t *p, uint32_t n, uint32_t max_new,
                                    int32_t rank) {
  oi_request r;
  oi_request_init(&r);
  r.prompt = p;
  r.prompt_len = n;
  r.max_new_tokens = max_new;
  r.rank = rank;
  uint64_t id = 0;
  CHECK_OK(oi_executor_submit(x, &r, &id));
  return id;
}

/* ---- pseudo-random data ---------------------------------------------------------------- */

/* One step of xorshift32 (a zero state starts from the golden-ratio seed).
 * @return the new state. */
static TR_UNUSED uint32_t tr_xorshift32(uint32_t *x) {
  if (!*x) *x = 0x9e3779b9u;
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  return *x;
}

/* Deterministic pseudo-random tokens (xorshift32 from `seed`), covering the
 * full u32 range. */
static TR_UNUSED void tr_fill_tokens(uint32_t *t, size_t n, uint32_t seed) {
  uint32_t x = seed;
  for (size_t i = 0; i < n; i++)
    t[i] = tr_xorshift32(&x);
}

/* ---- processes and files ---------------------------------------------------------------- */

/* pipe + fork. In the child p[0] is closed, in the parent p[1]; both
 * REQUIRE'd. @return fork's pid (0 in the child). */
static TR_UNUSED pid_t tr_fork_pipe(int p[2]) {
  REQUIRE(pipe(p) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  close(child == 0 ? p[0] : p[1]);
  return child;
}

/* @return whether a line of the file at `path` contains `needle`. */
static TR_UNUSED bool tr_file_contains(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

#endif
