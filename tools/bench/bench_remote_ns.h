/* `openinfer bench remote`, part 1 between two network namespaces: the
 * cross-node restore with one `openinfer serve --cluster` in each of two
 * namespaces joined by a veth pair (redis-server in the first), against a
 * plain TCP stream between the same namespaces. Needs root and ip. */
#ifndef OI_TOOLS_BENCH_REMOTE_NS_H
#define OI_TOOLS_BENCH_REMOTE_NS_H

#include <stdbool.h>
#include <stdint.h>

#include "openinfer/openinfer.h"

typedef struct remote_ns_params {
  const char *openinfer;    /* the openinfer executable (its serve) */
  const char *dir;          /* scratch directory: sockets, logs */
  const char *secret;       /* the cluster secret's file */
  const char *namespace_id; /* the engines' namespace */
  uint64_t block, nblocks, pool;
  uint64_t ns_fp, layout_fp; /* the directory keys' (from an in-process node of that shape) */
  oi_block_hash (*hash)(uint64_t i);
} remote_ns_params;

typedef struct remote_ns_result {
  bool used;     /* the namespaces were made */
  bool verified; /* every byte restored matched */
  uint64_t fetched;
  double restore_gbps, restore_s, first_fetch_s, plain_gbps, plain_hot_gbps;
  char why[300]; /* when it failed */
} remote_ns_result;

/* Node B's restore of blocks hash(0..nblocks-1) from node A, by queries
 * that wait for the fetches (at most 1024 blocks each, the directory's
 * lookup cap per fetch). Block 0 alone first: the first fetch from a holder
 * opens the peer connection to it (TCP, the handshake, UCX workers and
 * endpoints), a one-time cost timed apart as first_s; then the other
 * blocks, timed as rest_s. Each query's lease and block count in leases
 * and counts (at most REMOTE_MAX_LEASES). */
#define REMOTE_MAX_LEASES 65
typedef struct remote_restore_run {
  oi_lease leases[REMOTE_MAX_LEASES];
  uint64_t counts[REMOTE_MAX_LEASES];
  int n;
  uint64_t hits;
  double first_s, rest_s;
} remote_restore_run;
void remote_restore(oi_engine *e, uint64_t nblocks, oi_block_hash (*hash)(uint64_t i),
                    remote_restore_run *run);
/* Loads what run leased into B's arena, block i into slot i; true when
 * every load completed. */
bool remote_restore_load(oi_engine *e, const remote_restore_run *run);

/* Whether this process can run part 1 between namespaces (why not, if not). */
bool remote_ns_possible(const char *openinfer, char *why, size_t cap);
/* @return 0, or -1 with r->why. */
int remote_ns_restore(const remote_ns_params *p, remote_ns_result *r);

/* The plain TCP stream baseline: `bytes` from src, sent by a thread in
 * namespace send_ns, into as much memory (touched first) received in
 * namespace recv_ns on to_addr (-1: this process's namespace, e.g. with
 * "127.0.0.1"), the median of three runs, 0 unless the bytes arrived
 * intact; and the cached ceiling (one 1 MiB buffer sent over and over into
 * another). GB/s. @return -1 when out of memory. */
int remote_stream_baseline(int send_ns, int recv_ns, const char *to_addr, const uint8_t *src,
                           uint64_t bytes, double *gbps, double *cached_gbps);

#endif
