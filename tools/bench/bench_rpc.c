/* `openinfer bench rpc`: the sidecar's request round trip over its Unix
 * socket, against the same operations on an embedded engine, in one run.
 * An embeddable oi_server runs in this process on a private socket; the
 * client side is a real oi_engine_connect engine. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/core.h"
#include "openinfer/openinfer.h"

#define RPC_BLOCKS 64
#define ARENA_BLOCKS 4096
#define BLOCK_BYTES 4096

typedef struct rpc_lat {
  double p50_us, p99_us;
} rpc_lat;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static rpc_lat summarize(uint64_t *ns, size_t n) {
  qsort(ns, n, sizeof *ns, cmp_u64);
  return (rpc_lat){(double)ns[n / 2] / 1e3, (double)ns[n * 99 / 100] / 1e3};
}

static void make_hashes(oi_block_hash *h, size_t n, uint64_t salt) {
  for (size_t i = 0; i < n; i++) {
    uint64_t a = (salt << 32) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0x1234, b = a * 0xBF58476D1CE4E5B9ull;
    memcpy(h[i].bytes, &a, 8);
    memcpy(h[i].bytes + 8, &b, 8);
  }
}

/* Query (hits, lease released outside the timing) and save (call + completion). */
static bool measure(oi_engine *e, uint32_t samples, rpc_lat *query, rpc_lat *save, uint64_t salt) {
  uint64_t *ns = calloc(samples, sizeof *ns);
  oi_block_hash h[RPC_BLOCKS];
  int64_t ids[RPC_BLOCKS];
  for (int i = 0; i < RPC_BLOCKS; i++)
    ids[i] = i;
  if (!ns) return false;
  make_hashes(h, RPC_BLOCKS, salt);
  oi_ticket *t = NULL;
  if (oi_engine_save(e, ids, h, RPC_BLOCKS, NULL, &t) != OI_OK || oi_ticket_wait(t, 30000) != OI_OK)
    return false;
  oi_ticket_release(t);
  for (uint32_t i = 0; i < samples; i++) {
    oi_query_result q = {.struct_size = sizeof q};
    uint64_t t0 = oi__now_ns();
    oi_status st = oi_engine_query(e, NULL, h, RPC_BLOCKS, 0, &q);
    ns[i] = oi__now_ns() - t0;
    if (st != OI_OK || q.hit_blocks != RPC_BLOCKS) return false;
    oi_engine_release(e, q.lease);
  }
  *query = summarize(ns, samples);
  for (uint32_t i = 0; i < samples; i++) {
    make_hashes(h, RPC_BLOCKS, salt * 1000003 + i + 1);
    uint64_t t0 = oi__now_ns();
    oi_status st = oi_engine_save(e, ids, h, RPC_BLOCKS, NULL, &t);
    if (st == OI_OK) st = oi_ticket_wait(t, 30000);
    ns[i] = oi__now_ns() - t0;
    oi_ticket_release(t);
    if (st != OI_OK) return false;
  }
  *save = summarize(ns, samples);
  free(ns);
  return true;
}

static void *serve_main(void *arg) {
  oi_server_run(arg);
  return NULL;
}

int bench_rpc(int argc, char **argv) {
  bool json = false;
  long samples = 20000;
  static const struct option longopts[] = {{"samples", required_argument, 0, 's'},
                                           {"json", no_argument, 0, 'j'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 's':
      if (!cli_parse_int(optarg, 100, 10000000, &samples)) {
        fprintf(stderr, "openinfer bench rpc: bad value '%s' for --samples\n", optarg);
        return CLI_USAGE;
      }
      break;
    case 'j': json = true; break;
    case 'h':
      printf("usage: openinfer bench rpc [--samples N] [--json]\n\n"
             "Query of %d hashes and save of %d blocks (call + completion) over the sidecar's\n"
             "socket, beside the same calls on an embedded engine, p50/p99 (cpu backend).\n\n"
             "  --samples N  calls of each kind (default %ld)\n"
             "  --json       one JSON object instead of the table\n",
             RPC_BLOCKS, RPC_BLOCKS, samples);
      return CLI_OK;
    default: return CLI_USAGE;
    }
  }
  char dir[] = "/tmp/openinfer-bench-rpc-XXXXXX", sock[128];
  if (!mkdtemp(dir)) {
    perror("openinfer bench rpc: mkdtemp");
    return CLI_FAILED;
  }
  snprintf(sock, sizeof sock, "%s/s.sock", dir);
  int rc = CLI_FAILED;
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.pool_bytes = 256ull << 20;
  oi_server_options so;
  oi_server_options_init(&so);
  so.socket_path = sock;
  so.host = &ho;
  oi_server *srv = NULL;
  oi_host *host = NULL;
  oi_engine *local = NULL, *remote = NULL;
  oi_imported_arena *arena = NULL;
  uint8_t *local_arena = NULL;
  pthread_t th;
  bool serving = false;
  if (oi_server_create(&so, &srv) != OI_OK) goto fail;
  if (pthread_create(&th, NULL, serve_main, srv) != 0) goto fail;
  serving = true;

  oi_arena_desc ad = {.name = "kv",
                      .num_blocks = ARENA_BLOCKS,
                      .bytes_per_block = BLOCK_BYTES,
                      .block_stride = BLOCK_BYTES,
                      .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.namespace_id = "bench-rpc";
  eo.arenas = &ad;
  eo.num_arenas = 1;
  for (int tries = 0; oi_engine_connect(sock, &eo, &remote, &arena) != OI_OK; tries++) {
    if (tries > 200) goto fail; /* the server thread may still be starting */
    usleep(10000);
  }
  if (oi_host_create(&ho, &host) != OI_OK) goto fail;
  local_arena = calloc(ARENA_BLOCKS, BLOCK_BYTES);
  if (!local_arena) goto fail;
  ad.base = local_arena;
  if (oi_engine_create(host, &eo, &local) != OI_OK) goto fail;

  rpc_lat lq, ls, rq, rs;
  if (!measure(local, (uint32_t)samples, &lq, &ls, 1) ||
      !measure(remote, (uint32_t)samples, &rq, &rs, 2))
    goto fail;
  bool q_ok = rq.p50_us <= 25.0 && rq.p99_us <= 100.0; /* issue #22 */
  if (json) {
    printf("{\"bench\":\"rpc\",\"blocks\":%d,\"samples\":%ld,\"query_local_p50_us\":%.2f,\"query_"
           "local_p99_us\":%.2f,"
           "\"query_rpc_p50_us\":%.2f,\"query_rpc_p99_us\":%.2f,\"save_local_p50_us\":%.2f,\"save_"
           "local_p99_us\":%.2f,"
           "\"save_rpc_p50_us\":%.2f,\"save_rpc_p99_us\":%.2f,\"query_rpc_target_met\":%s}\n",
           RPC_BLOCKS, samples, lq.p50_us, lq.p99_us, rq.p50_us, rq.p99_us, ls.p50_us, ls.p99_us,
           rs.p50_us, rs.p99_us, q_ok ? "true" : "false");
  } else {
    printf("openinfer bench rpc — %d hashes / blocks of %d B per call, %ld calls each\n\n",
           RPC_BLOCKS, BLOCK_BYTES, samples);
    printf("  %-44s %10s %10s   %s\n", "", "p50 us", "p99 us", "target");
    printf("  %-44s %10.2f %10.2f\n", "query, embedded engine", lq.p50_us, lq.p99_us);
    printf("  %-44s %10.2f %10.2f   p50 <= 25, p99 <= 100: %s\n", "query, over the sidecar socket",
           rq.p50_us, rq.p99_us, q_ok ? "met" : "MISSED");
    printf("  %-44s %10.2f %10.2f\n", "save + completion, embedded engine", ls.p50_us, ls.p99_us);
    printf("  %-44s %10.2f %10.2f\n", "save + completion, over the sidecar socket", rs.p50_us,
           rs.p99_us);
  }
  rc = CLI_OK;
  goto done;
fail:
  fprintf(stderr, "openinfer bench rpc: %s\n", oi_last_error());
done:
  if (arena) oi_imported_arena_close(arena);
  oi_engine_destroy(remote);
  oi_engine_destroy(local);
  oi_host_destroy(host);
  free(local_arena);
  if (serving) {
    oi_server_stop(srv);
    pthread_join(th, NULL);
  }
  oi_server_destroy(srv);
  rmdir(dir);
  return rc;
}
