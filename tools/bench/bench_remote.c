/* `openinfer bench remote`: the cluster tier between two nodes on this
 * machine (a private redis-server, two hosts with cpu pools joined to it,
 * the peer transport over TCP on 127.0.0.1), in one run:
 *  1. cross-node restore throughput: node A holds --bytes of blocks; node B
 *     queries them all (OI_QUERY_WAIT_PENDING) and they come over from A,
 *     verified: the first block alone (its fetch opens the peer connection,
 *     a one-time cost reported in ms), then the rest, in GB/s against a
 *     plain TCP socket stream of the same bytes from A's memory into as much
 *     memory at B, in the same run (the median of three; target >= 0.9),
 *     and, for reference, the loopback's ceiling (one cache-resident 1 MiB
 *     buffer sent into another);
 *  2. directory lookup latency for a 64-block prefix: p50 and p99;
 *  3. the cost a node pays per evicted block to keep the directory true:
 *     evict_all with the cluster attached against the same eviction on a
 *     host without it (the watcher's note per block), and the time the
 *     directory takes to withdraw them in Redis (per block).
 * Nodes A and B live in one process (two pools, two peer nets); the plain
 * stream is between two threads of the same process over 127.0.0.1, so
 * both move bytes through the kernel's loopback the same way. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_remote_ns.h"
#include "cli.h"
#include "cluster/directory.h"
#include "core/core.h"
#include "host/host.h"
#include "openinfer/openinfer.h"

#define BENCH_SECRET "bench-remote-secret-0123456789ab" /* 32 bytes */

#define LOOKUPS 2000

typedef struct rnode {
  oi_host *h;
  oi_engine *e;
  uint8_t *mem;
  oi_arena_desc arena;
} rnode;

static void nap_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static oi_block_hash rhash(uint64_t i) {
  oi_block_hash h;
  memset(&h, 0, sizeof h);
  memcpy(h.bytes, &i, sizeof i);
  h.bytes[14] = 0xBE;
  return h;
}

static int node_open(rnode *n, uint64_t pool, uint64_t block, uint64_t nblocks, const char *url,
                     const char *id, const char *secret) {
  memset(n, 0, sizeof *n);
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.pool_bytes = pool;
  ho.flags = OI_HOST_NO_PIN;
  if (oi_host_create(&ho, &n->h) != OI_OK) return -1;
  if (url) {
    oi_host_cluster_options co;
    oi_host_cluster_options_init(&co);
    co.redis_url = url;
    co.node_id = id;
    co.listen_addr = "127.0.0.1:0";
    co.secret_file = secret;
    co.timeout_ms = 30000;
    if (oi_host_attach_cluster(n->h, &co) != OI_OK) return -1;
  }
  n->mem = aligned_alloc(4096, nblocks * block);
  if (!n->mem) return -1;
  memset(n->mem, 0, nblocks * block);
  n->arena = (oi_arena_desc){.name = "kv",
                             .base = n->mem,
                             .num_blocks = nblocks,
                             .bytes_per_block = block,
                             .block_stride = block,
                             .segments = 1};
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.namespace_id = "bench-remote";
  eo.arenas = &n->arena;
  eo.num_arenas = 1;
  return oi_engine_create(n->h, &eo, &n->e) == OI_OK ? 0 : -1;
}

static void node_close(rnode *n) {
  if (n->e) oi_engine_destroy(n->e);
  if (n->h) oi_host_destroy(n->h);
  free(n->mem);
  memset(n, 0, sizeof *n);
}

static int save_all(rnode *n, uint64_t first, uint64_t count) {
  enum { BATCH = 256 };
  int64_t ids[BATCH];
  oi_block_hash hs[BATCH];
  for (uint64_t b = 0; b < count; b += BATCH) {
    uint64_t k = count - b < BATCH ? count - b : BATCH;
    for (uint64_t i = 0; i < k; i++) {
      ids[i] = (int64_t)(b + i);
      hs[i] = rhash(first + b + i);
    }
    oi_ticket *t = NULL;
    if (oi_engine_save(n->e, ids, hs, k, NULL, &t) != OI_OK) return -1;
    oi_status st = oi_ticket_wait(t, 60000);
    oi_ticket_release(t);
    if (st != OI_OK) return -1;
  }
  return 0;
}

static void remote_usage(FILE *f) {
  fprintf(f, "usage: openinfer bench remote [--bytes SIZE] [--block-bytes SIZE] [--redis URL]\n"
             "                             [--loopback] [--json]\n"
             "\n"
             "The cluster tier between two nodes on this machine (a private redis-server,\n"
             "cpu pools, the peer transport over TCP):\n"
             "  1. cross-node restore: node B queries --bytes of blocks node A holds (the\n"
             "     first block alone: its fetch opens the peer connection, reported in ms);\n"
             "     GB/s of the rest against a plain TCP stream of the same bytes from A's\n"
             "     memory into as much memory, in the same run (>= 0.9); and the link's\n"
             "     ceiling\n"
             "  2. directory lookup of a 64-block prefix: p50, p99\n"
             "  3. per evicted block: evict_all with the cluster attached against without,\n"
             "     and the directory's withdrawal in Redis\n"
             "Part 1 runs between two network namespaces (one openinfer serve in each, a\n"
             "veth pair between them) where this process may make them (root, ip); else,\n"
             "and with --loopback or --redis, between two nodes in this process.\n"
             "Needs redis-server on PATH, unless --redis names a directory to use.\n"
             "\n"
             "  --bytes SIZE        bytes restored across nodes (default 256M)\n"
             "  --block-bytes SIZE  the block (default 1M)\n"
             "  --loopback          part 1 in this process on 127.0.0.1, not in namespaces\n"
             "  --redis URL         an existing directory instead of a private redis-server:\n"
             "                      redis://HOST:PORT, or a Redis Cluster as\n"
             "                      redis+cluster://HOST:PORT[,HOST:PORT...] (entries are\n"
             "                      written there and expire by their TTL)\n");
}

int bench_remote(int argc, char **argv) {
  static const struct option lo[] = {{"bytes", required_argument, 0, 'b'},
                                     {"block-bytes", required_argument, 0, 'k'},
                                     {"json", no_argument, 0, 'j'},
                                     {"redis", required_argument, 0, 'r'},
                                     {"loopback", no_argument, 0, 'l'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  uint64_t bytes = 256ull << 20, block = 1ull << 20;
  bool json = false, loopback = false;
  const char *given_url = NULL;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'b':
      if (!cli_parse_size(optarg, &bytes) || bytes < (1u << 20)) {
        cli_bad_value("openinfer bench remote", lo, c, optarg);
        return CLI_USAGE;
      }
      break;
    case 'k':
      if (!cli_parse_size(optarg, &block) || block < 4096 || block > (64u << 20)) {
        cli_bad_value("openinfer bench remote", lo, c, optarg);
        return CLI_USAGE;
      }
      break;
    case 'j': json = true; break;
    case 'l': loopback = true; break;
    case 'r':
      if (strlen(optarg) >= 256) {
        cli_bad_value("openinfer bench remote", lo, c, optarg);
        return CLI_USAGE;
      }
      given_url = optarg;
      break;
    case 'h': remote_usage(stdout); return CLI_OK;
    default: remote_usage(stderr); return CLI_USAGE;
    }
  }
  if (!given_url && !cli_on_path("redis-server")) {
    fprintf(stderr, "openinfer bench remote: needs redis-server (Debian: redis-server)\n");
    return CLI_FAILED;
  }
  uint64_t nblocks = bytes / block;
  if (nblocks > 4096) nblocks = 4096;
  if (nblocks == 0) nblocks = 1;
  bytes = nblocks * block;
  uint64_t pool = bytes + bytes / 4 + (64ull << 20);

  char dir[256], secret[300], rlog[300], url[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/openinfer-bench-remote-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return CLI_FAILED;
  snprintf(secret, sizeof secret, "%s/secret", dir);
  snprintf(rlog, sizeof rlog, "%s/redis.log", dir);
  int fd = open(secret, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || write(fd, BENCH_SECRET, 32) != 32) return CLI_FAILED;
  close(fd);
  int rport = cli_free_port();
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", rport);
  if (given_url) snprintf(url, sizeof url, "%s", given_url);
  char port_s[16];
  snprintf(port_s, sizeof port_s, "%d", rport);
  pid_t redis = given_url ? 0 : fork();
  if (redis < 0) return CLI_FAILED;
  if (redis == 0 && !given_url) {
    int lf = open(rlog, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (lf >= 0) {
      dup2(lf, 1);
      dup2(lf, 2);
    }
    execlp("redis-server", "redis-server", "--port", port_s, "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", (char *)NULL);
    _exit(127);
  }
  if (!given_url) nap_ms(300);
  /* Part 1 between two network namespaces where this process may make
   * them (root, ip, openinfer beside this benchmark), else in-process. */
  char self[PATH_MAX] = "", exe[PATH_MAX + 16] = "", ns_why[320] = "";
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl > 0) {
    self[sl] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(exe, sizeof exe, "%s/openinfer", self);
  }
  bool netns = false;
  if (loopback)
    snprintf(ns_why, sizeof ns_why, "--loopback");
  else if (given_url)
    snprintf(ns_why, sizeof ns_why, "--redis names the directory");
  else
    netns = remote_ns_possible(exe, ns_why, sizeof ns_why);
  remote_ns_result nsr;
  memset(&nsr, 0, sizeof nsr);
  int rc = CLI_FAILED;
  rnode a = {0}, b = {0}, plain = {0};
  oi_dir *d = NULL;
  uint64_t lat[LOOKUPS];
  double restore_gbps = 0, plain_gbps = 0, plain_hot_gbps = 0, restore_s = 0, first_fetch_s = 0;
  double lookup_p50 = 0, lookup_p99 = 0, evict_with_ns = 0, evict_without_ns = 0, withdraw_ns = 0;
  oi_host_cluster_stats sa = {.struct_size = sizeof sa}, sb = {.struct_size = sizeof sb};
  bool verified = false;
  size_t lookup_found = 0;

  fprintf(stderr, "bench remote: two nodes, %llu blocks of %llu B...\n",
          (unsigned long long)nblocks, (unsigned long long)block);
  if (node_open(&a, pool, block, nblocks, url, "bench-a", secret) != 0 ||
      node_open(&b, pool, block, nblocks, url, "bench-b", secret) != 0) {
    fprintf(stderr, "openinfer bench remote: %s\n", oi_last_error());
    goto out;
  }
  for (uint64_t i = 0; i < nblocks * block; i++)
    a.mem[i] = (uint8_t)(i * 131 + i / block);
  if (save_all(&a, 0, nblocks) != 0) goto api_fail;
  for (int i = 0; i < 1000; i++) { /* every entry published */
    oi_host_get_cluster_stats(a.h, &sa);
    if (sa.published >= nblocks) break;
    nap_ms(10);
  }
  nap_ms(200);

  /* 1. restore across nodes */
  fprintf(stderr, "bench remote: restore of %.0f MiB across nodes%s...\n",
          (double)bytes / (1 << 20), netns ? " in two network namespaces" : "");
  if (netns) {
    oi_host_ns hns;
    remote_ns_params np = {.openinfer = exe,
                           .dir = dir,
                           .secret = secret,
                           .namespace_id = "bench-remote",
                           .block = block,
                           .nblocks = nblocks,
                           .pool = pool,
                           .hash = rhash};
    if (!oi__host_find_namespace(a.h, "bench-remote", &hns) ||
        !oi__host_namespace_fps(a.h, hns.id, &np.ns_fp, &np.layout_fp, NULL))
      goto out;
    if (remote_ns_restore(&np, &nsr) != 0) {
      if (nsr.used) {
        fprintf(stderr, "openinfer bench remote: between network namespaces: %s\n", nsr.why);
        goto out;
      }
      /* (a container without CAP_NET_ADMIN, say): the in-process nodes */
      snprintf(ns_why, sizeof ns_why, "%s", nsr.why);
      netns = false;
      fprintf(stderr, "bench remote: %s; on 127.0.0.1 instead\n", ns_why);
    } else {
      restore_gbps = nsr.restore_gbps;
      restore_s = nsr.restore_s;
      first_fetch_s = nsr.first_fetch_s;
      plain_gbps = nsr.plain_gbps;
      plain_hot_gbps = nsr.plain_hot_gbps;
      verified = nsr.verified;
    }
  }
  if (!netns) {
    remote_restore_run run;
    remote_restore(b.e, nblocks, rhash, &run);
    first_fetch_s = run.first_s;
    restore_s = run.rest_s;
    restore_gbps =
        run.hits == nblocks && run.rest_s > 0 ? (double)(bytes - block) / (run.rest_s * 1e9) : 0;
    /* every byte checked, through loads into B's arena (untimed) */
    verified = run.hits == nblocks && remote_restore_load(b.e, &run);
    for (uint64_t i = 0; verified && i < nblocks * block; i++)
      verified = b.mem[i] == (uint8_t)(i * 131 + i / block);
    fprintf(stderr, "bench remote: plain TCP stream of the same bytes...\n");
    /* The same bytes from node A's memory into as much memory, two threads
     * of this process over 127.0.0.1 (as the nodes' bytes go). */
    if (remote_stream_baseline(-1, -1, "127.0.0.1", a.mem, bytes, &plain_gbps, &plain_hot_gbps))
      goto out;
  }

  /* 2. lookups of a 64-block prefix */
  {
    oi_dir_options dopt;
    oi__dir_options_init(&dopt);
    dopt.url = url;
    dopt.node_id = "bench-probe";
    dopt.epoch = 1;
    dopt.secret = BENCH_SECRET; /* the nodes' entries carry MACs under it */
    dopt.secret_len = 32;
    if (oi__dir_open(&dopt, &d) != OI_OK) goto api_fail;
    /* The keys the nodes published: the namespace's name and layout
     * fingerprints, as the tier makes them (docs/cluster.md). */
    oi_tier_key keys[64];
    oi_dir_holder holders[64];
    oi_host_ns ns;
    uint64_t ns_fp = 0, layout_fp = 0;
    if (!oi__host_find_namespace(a.h, "bench-remote", &ns) ||
        !oi__host_namespace_fps(a.h, ns.id, &ns_fp, &layout_fp, NULL))
      goto out;
    for (int i = 0; i < 64; i++) {
      oi_block_hash h = rhash((uint64_t)i);
      keys[i].ns_fp = ns_fp;
      memcpy(keys[i].hash, h.bytes, 16);
      keys[i].layout_fp = layout_fp;
    }
    size_t found = 0;
    for (int i = 0; i < LOOKUPS; i++) {
      size_t got = 0;
      uint64_t t0 = oi__now_ns();
      oi__dir_lookup(d, keys, 64, holders, &got);
      lat[i] = oi__now_ns() - t0;
      found += got;
    }
    lookup_found = found / LOOKUPS;
    qsort(lat, LOOKUPS, sizeof lat[0], cmp_u64);
    lookup_p50 = (double)lat[LOOKUPS / 2] / 1e3;
    lookup_p99 = (double)lat[LOOKUPS * 99 / 100] / 1e3;
  }

  /* 3. eviction: with the cluster (A, its blocks published) vs without */
  {
    oi_host_get_cluster_stats(a.h, &sa);
    uint64_t unpub0 = sa.unpublished, ev = 0;
    uint64_t t0 = oi__now_ns();
    if (oi_host_evict_all(a.h, &ev) != OI_OK || ev == 0) goto api_fail;
    evict_with_ns = (double)(oi__now_ns() - t0) / (double)ev;
    /* the directory's withdrawal: until A's worker has queued them all */
    uint64_t t1 = oi__now_ns();
    for (int i = 0; i < 3000; i++) {
      oi_host_get_cluster_stats(a.h, &sa);
      if (sa.unpublished - unpub0 >= ev) break;
      nap_ms(1);
    }
    withdraw_ns = (double)(oi__now_ns() - t1) / (double)ev;
    if (node_open(&plain, pool, block, nblocks, NULL, NULL, NULL) != 0) goto api_fail;
    if (save_all(&plain, 0, nblocks) != 0) goto api_fail;
    uint64_t ev2 = 0;
    t0 = oi__now_ns();
    if (oi_host_evict_all(plain.h, &ev2) != OI_OK || ev2 == 0) goto api_fail;
    evict_without_ns = (double)(oi__now_ns() - t0) / (double)ev2;
  }
  oi_host_get_cluster_stats(a.h, &sa);
  oi_host_get_cluster_stats(b.h, &sb);
  double ratio = plain_gbps > 0 ? restore_gbps / plain_gbps : 0;
  if (json) {
    printf("{\"bench\":\"remote\",\"blocks\":%llu,\"block_bytes\":%llu,\"restore_gbps\":%.4f,"
           "\"restore_s\":%.4f,\"first_fetch_ms\":%.3f,\"plain_stream_gbps\":%.4f,\"plain_stream_"
           "cached_gbps\":%.4f,"
           "\"ratio\":%.4f,\"verified\":%s,"
           "\"lookup64_p50_us\":%.2f,\"lookup64_p99_us\":%.2f,\"lookup64_found\":%zu,"
           "\"evict_ns_per_block_cluster\":%.1f,"
           "\"evict_ns_per_block_plain\":%.1f,\"withdraw_queue_ns_per_block\":%.1f,"
           "\"remote_blocks\":%llu,\"remote_failed\":%llu,\"served_blocks\":%llu,"
           "\"netns\":%s}\n",
           (unsigned long long)nblocks, (unsigned long long)block, restore_gbps, restore_s,
           first_fetch_s * 1e3, plain_gbps, plain_hot_gbps, ratio, verified ? "true" : "false",
           lookup_p50, lookup_p99, lookup_found, evict_with_ns, evict_without_ns, withdraw_ns,
           (unsigned long long)(netns ? nsr.fetched : sb.remote_blocks),
           (unsigned long long)sb.remote_failed, (unsigned long long)sa.served_blocks,
           netns ? "true" : "false");
  } else {
    printf("openinfer bench remote — libopeninfer %s; %s%s\n", oi_version_string(),
           given_url ? "the directory at " : "a private redis-server", given_url ? given_url : "");
    if (netns)
      printf("part 1: two openinfer serve, each in its own network namespace (a veth pair);\n"
             "parts 2 and 3: two nodes in this process on 127.0.0.1\n\n");
    else
      printf("two nodes in this process on 127.0.0.1 (not namespaces: %s)\n\n", ns_why);
    printf("  1. first block across nodes (opens the peer connection)  %.1f ms\n",
           first_fetch_s * 1e3);
    printf("  then restore across nodes, %llu blocks of %llu B  %7.3f GB/s  (%.2f s; every byte "
           "%s)\n",
           (unsigned long long)(nblocks - 1), (unsigned long long)block, restore_gbps, restore_s,
           verified ? "verified" : "NOT verified");
    printf("     plain TCP stream, same bytes, same run      %7.3f GB/s  (A's memory into as much "
           "at B; median of 3)\n",
           plain_gbps);
    printf("     (one 1 MiB buffer into one 1 MiB buffer      %7.3f GB/s: the link's "
           "ceiling)\n",
           plain_hot_gbps);
    printf("     ratio                                        %7.2fx   target >= 0.9   %s\n", ratio,
           ratio >= 0.9 && verified ? "PASS" : "MISS");
    printf("  2. directory lookup, 64-block prefix           p50 %.1f us, p99 %.1f us (%d "
           "lookups, %zu of 64 found)\n",
           lookup_p50, lookup_p99, LOOKUPS, lookup_found);
    printf("  3. per evicted block: evict_all %.0f ns with the cluster, %.0f ns without;\n"
           "     the withdrawals queued after %.0f ns per block\n",
           evict_with_ns, evict_without_ns, withdraw_ns);
    if (netns)
      printf("\nnode B (its namespace): %llu blocks fetched\n", (unsigned long long)nsr.fetched);
    else
      printf("\nnode B: %llu blocks fetched, %llu failed; node A: %llu blocks served\n",
             (unsigned long long)sb.remote_blocks, (unsigned long long)sb.remote_failed,
             (unsigned long long)sa.served_blocks);
  }
  rc = verified ? CLI_OK : CLI_FAILED;
  goto out;
api_fail:
  fprintf(stderr, "openinfer bench remote: %s\n", oi_last_error());
out:
  if (d) oi__dir_close(d);
  node_close(&plain);
  node_close(&b);
  node_close(&a);
  if (redis > 0) {
    kill(redis, SIGKILL);
    waitpid(redis, NULL, 0);
  }
  unlink(secret);
  unlink(rlog);
  rmdir(dir);
  return rc;
}
