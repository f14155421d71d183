/* `openinfer stats`: asks a running `openinfer serve` for its figures over
 * the wire protocol (Hello, then Stats) and prints a summary, or JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "cli.h"
#include "openinfer/openinfer.h"
#include "proto/wire.h"

static void stats_usage(FILE *f) {
  fprintf(f,
          "usage: openinfer stats [options]\n"
          "\n"
          "Prints the figures of a running sidecar server (openinfer serve): pool use, blocks\n"
          "by state, saves, loads, queries, leases, latencies, namespaces.\n"
          "\n"
          "options:\n"
          "  --socket PATH   the server's socket (default $XDG_RUNTIME_DIR/openinfer.sock,\n"
          "                  or /tmp/openinfer-$UID.sock)\n"
          "  --json          one JSON object instead of the summary\n"
          "  -h, --help      this text\n");
}

/* One request, one reply (the server answers in order here: nothing else is
 * in flight). */
static oi_status round_trip(int fd, oiwire_Envelope *env, uint8_t **buf, size_t *cap,
                            oi_wire_arrays *arrays) {
  uint8_t *frame;
  size_t len;
  oi_status st = oi__wire_encode(env, NULL, &frame, &len);
  if (st != OI_OK) return st;
  st = oi__wire_send(fd, frame, len);
  oi__free(frame);
  if (st != OI_OK) return st;
  if ((st = oi__wire_recv(fd, OI_WIRE_MAX_FRAME, buf, cap, &len)) != OI_OK) return st;
  if ((st = oi__wire_decode(*buf, len, env, arrays)) != OI_OK) return st;
  if (env->which_body == oiwire_Envelope_result_tag && env->body.result.status != OI_OK)
    return oi__fail(env->body.result.status, "%s", env->body.result.message);
  return OI_OK;
}

static void human_bytes(char *out, size_t cap, uint64_t b) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(out, cap, u ? "%.2f %s" : "%.0f %s", v, units[u]);
}

/* The upper bound of the bucket holding quantile q, as text. */
static void quantile(char *out, size_t cap, const uint64_t *b, pb_size_t n, double q) {
  uint64_t total = 0;
  for (pb_size_t i = 0; i < n; i++) total += b[i];
  if (!total) {
    snprintf(out, cap, "-");
    return;
  }
  uint64_t want = (uint64_t)((double)total * q + 0.999999), cum = 0;
  for (pb_size_t i = 0; i < n; i++) {
    cum += b[i];
    if (cum >= want) {
      if (i + 1 == n) {
        snprintf(out, cap, "> %.0f s", (double)(1ull << (n - 2)) / 1e6);
      } else {
        double us = (double)(1ull << i);
        if (us < 1000)
          snprintf(out, cap, "<= %.0f us", us);
        else if (us < 1e6)
          snprintf(out, cap, "<= %.3g ms", us / 1e3);
        else
          snprintf(out, cap, "<= %.3g s", us / 1e6);
      }
      return;
    }
  }
  snprintf(out, cap, "-");
}

static void print_latency(const char *what, const uint64_t *b, pb_size_t n, uint64_t sum_us) {
  uint64_t total = 0;
  for (pb_size_t i = 0; i < n; i++) total += b[i];
  char p50[32], p99[32];
  quantile(p50, sizeof p50, b, n, 0.5);
  quantile(p99, sizeof p99, b, n, 0.99);
  printf("%-14s %llu operations, mean %.3f ms, p50 %s, p99 %s\n", what, (unsigned long long)total,
         total ? (double)sum_us / (double)total / 1e3 : 0.0, p50, p99);
}

static void json_string(const char *s) {
  putchar('"');
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\')
      printf("\\%c", *c);
    else if (*c < 0x20)
      printf("\\u%04x", *c);
    else
      putchar(*c);
  }
  putchar('"');
}

static void json_array(const char *name, const uint64_t *v, pb_size_t n) {
  printf("\"%s\": [", name);
  for (pb_size_t i = 0; i < n; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)v[i]);
  printf("]");
}

#define J(name, v) printf("    \"%s\": %llu,\n", name, (unsigned long long)(v))

static void print_json(const char *socket, const oiwire_HelloReply *hello,
                       const oiwire_StatsReply *r, const oi_wire_arrays *a) {
  const oiwire_HostStats *h = &r->host;
  printf("{\n  \"socket\": ");
  json_string(socket);
  printf(",\n  \"server_version\": ");
  json_string(hello->server_version);
  printf(",\n  \"epoch\": \"%016llx\",\n", (unsigned long long)hello->server_epoch);
  printf("  \"uptime_seconds\": %.3f,\n", (double)r->uptime_ns / 1e9);
  printf("  \"server\": {\n");
  J("sessions", r->sessions);
  J("instances", r->instances);
  J("arena_bytes", r->arena_bytes);
  printf("    \"instances_cleaned_up\": %llu\n  },\n", (unsigned long long)r->instances_cleaned_up);
  printf("  \"host\": {\n");
  J("capacity_bytes", h->capacity_bytes);
  J("used_bytes", h->used_bytes);
  J("free_bytes", h->free_bytes);
  J("block_bytes_resident", h->block_bytes_resident);
  J("size_classes", h->size_classes);
  J("pool_setup_ns", h->pool_setup_ns);
  J("blocks_free", h->blocks_free);
  J("blocks_in_flight", h->blocks_in_flight);
  J("blocks_sealed", h->blocks_sealed);
  J("blocks_leased", h->blocks_leased);
  J("blocks_loading", h->blocks_loading);
  J("blocks_pinned", h->blocks_pinned);
  J("saves_submitted", h->saves_submitted);
  J("saves_completed", h->saves_completed);
  J("saves_deduplicated", h->saves_deduplicated);
  J("saves_dropped", h->saves_dropped);
  J("saves_failed", h->saves_failed);
  J("bytes_saved", h->bytes_saved);
  J("loads_submitted", h->loads_submitted);
  J("loads_completed", h->loads_completed);
  J("loads_failed", h->loads_failed);
  J("blocks_loaded", h->blocks_loaded);
  J("bytes_loaded", h->bytes_loaded);
  J("query_hit_blocks", h->query_hit_blocks);
  J("query_miss_blocks", h->query_miss_blocks);
  J("leases_active", h->leases_active);
  J("leases_released", h->leases_released);
  J("leases_expired", h->leases_expired);
  J("evictions", h->evictions);
  J("namespaces", h->namespaces);
  printf("    ");
  json_array("save_latency_us", h->save_latency_us, h->save_latency_us_count);
  printf(",\n");
  J("save_latency_sum_us", h->save_latency_sum_us);
  printf("    ");
  json_array("load_latency_us", h->load_latency_us, h->load_latency_us_count);
  printf(",\n    \"load_latency_sum_us\": %llu\n  },\n", (unsigned long long)h->load_latency_sum_us);
  printf("  \"namespaces\": [");
  for (size_t i = 0; i < a->n_namespaces; i++) {
    printf("%s\n    {\"name\": ", i ? "," : "");
    json_string(a->namespaces[i].name);
    printf(", \"block_bytes\": %llu, \"blocks_resident\": %llu}",
           (unsigned long long)a->namespaces[i].block_bytes,
           (unsigned long long)a->namespaces[i].blocks_resident);
  }
  printf("%s]\n}\n", a->n_namespaces ? "\n  " : "");
}

static void print_summary(const char *socket, const oiwire_HelloReply *hello,
                          const oiwire_StatsReply *r, const oi_wire_arrays *a) {
  const oiwire_HostStats *h = &r->host;
  char b1[32], b2[32], b3[32], b4[32];
  printf("openinfer server on %s: %s, epoch %016llx, up %.0f s\n", socket, hello->server_version,
         (unsigned long long)hello->server_epoch, (double)r->uptime_ns / 1e9);
  human_bytes(b1, sizeof b1, r->arena_bytes);
  printf("%-14s %llu sessions, %llu instances (%s of arenas), %llu cleaned up\n", "clients:",
         (unsigned long long)r->sessions, (unsigned long long)r->instances, b1,
         (unsigned long long)r->instances_cleaned_up);
  human_bytes(b1, sizeof b1, h->capacity_bytes);
  human_bytes(b2, sizeof b2, h->used_bytes);
  human_bytes(b3, sizeof b3, h->free_bytes);
  human_bytes(b4, sizeof b4, h->block_bytes_resident);
  printf("%-14s %s: %s carved (%.1f%%), %s uncarved; %s resident; set up in %.2f s\n", "pool:", b1,
         b2, h->capacity_bytes ? 100.0 * (double)h->used_bytes / (double)h->capacity_bytes : 0.0,
         b3, b4, (double)h->pool_setup_ns / 1e9);
  printf("%-14s %llu sealed (%llu leased, %llu loading, %llu pinned for load), %llu in flight, "
         "%llu free\n",
         "blocks:", (unsigned long long)h->blocks_sealed, (unsigned long long)h->blocks_leased,
         (unsigned long long)h->blocks_loading, (unsigned long long)h->blocks_pinned,
         (unsigned long long)h->blocks_in_flight, (unsigned long long)h->blocks_free);
  human_bytes(b1, sizeof b1, h->bytes_saved);
  printf("%-14s %llu blocks submitted, %llu completed, %llu deduplicated, %llu dropped, %llu failed; "
         "%s saved\n",
         "saves:", (unsigned long long)h->saves_submitted, (unsigned long long)h->saves_completed,
         (unsigned long long)h->saves_deduplicated, (unsigned long long)h->saves_dropped,
         (unsigned long long)h->saves_failed, b1);
  human_bytes(b1, sizeof b1, h->bytes_loaded);
  printf("%-14s %llu submitted, %llu completed, %llu failed; %llu blocks, %s loaded\n", "loads:",
         (unsigned long long)h->loads_submitted, (unsigned long long)h->loads_completed,
         (unsigned long long)h->loads_failed, (unsigned long long)h->blocks_loaded, b1);
  uint64_t q = h->query_hit_blocks + h->query_miss_blocks;
  printf("%-14s %llu hit blocks, %llu missed (hit rate %.1f%%)\n", "queries:",
         (unsigned long long)h->query_hit_blocks, (unsigned long long)h->query_miss_blocks,
         q ? 100.0 * (double)h->query_hit_blocks / (double)q : 0.0);
  printf("%-14s %llu active, %llu released, %llu expired; %llu blocks evicted\n", "leases:",
         (unsigned long long)h->leases_active, (unsigned long long)h->leases_released,
         (unsigned long long)h->leases_expired, (unsigned long long)h->evictions);
  print_latency("save latency:", h->save_latency_us, h->save_latency_us_count, h->save_latency_sum_us);
  print_latency("load latency:", h->load_latency_us, h->load_latency_us_count, h->load_latency_sum_us);
  printf("namespaces:    %u\n", (unsigned)h->namespaces);
  for (size_t i = 0; i < a->n_namespaces; i++) {
    human_bytes(b1, sizeof b1, a->namespaces[i].blocks_resident * a->namespaces[i].block_bytes);
    printf("  %-40s %llu blocks resident (%s)\n", a->namespaces[i].name,
           (unsigned long long)a->namespaces[i].blocks_resident, b1);
  }
}

int cmd_stats(int argc, char **argv) {
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *socket = NULL;
  bool json = false;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 's': socket = optarg; break;
    case 'j': json = true; break;
    case 'h': stats_usage(stdout); return CLI_OK;
    default: stats_usage(stderr); return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer stats: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }
  char def[108];
  if (!socket) {
    if (oi__wire_default_socket_path(def, sizeof def) != OI_OK) {
      fprintf(stderr, "openinfer stats: %s\n", oi_last_error());
      return CLI_FAILED;
    }
    socket = def;
  }
  int fd;
  oi_status st = oi__wire_connect(socket, &fd);
  if (st != OI_OK) {
    fprintf(stderr, "openinfer stats: %s\n", oi_last_error());
    return CLI_FAILED;
  }
  /* A stuck server must not hang the tool. */
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  uint8_t *buf = NULL;
  size_t cap = 0;
  oi_wire_arrays arrays;
  memset(&arrays, 0, sizeof arrays);
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = 1;
  env.which_body = oiwire_Envelope_hello_tag;
  env.body.hello.protocol_version = OI_WIRE_PROTOCOL_VERSION;
  env.body.hello.capabilities = OI_WIRE_CAP_PIPELINED;
  snprintf(env.body.hello.client_name, sizeof env.body.hello.client_name, "openinfer stats (pid %d)",
           (int)getpid());
  oiwire_HelloReply hello;
  memset(&hello, 0, sizeof hello);
  st = round_trip(fd, &env, &buf, &cap, &arrays);
  if (st == OI_OK && env.which_body != oiwire_Envelope_hello_reply_tag)
    st = oi__fail(OI_ERR_PROTOCOL, "hello: the server answered with message type %u", env.which_body);
  if (st == OI_OK) {
    hello = env.body.hello_reply;
    memset(&env, 0, sizeof env);
    env.request_id = 2;
    env.which_body = oiwire_Envelope_stats_tag;
    st = round_trip(fd, &env, &buf, &cap, &arrays);
    if (st == OI_OK && env.which_body != oiwire_Envelope_stats_reply_tag)
      st = oi__fail(OI_ERR_PROTOCOL, "stats: the server answered with message type %u",
                    env.which_body);
  }
  close(fd);
  int rc = CLI_OK;
  if (st != OI_OK) {
    fprintf(stderr, "openinfer stats: %s: %s (%s)\n", socket, oi_last_error(), oi_status_str(st));
    rc = CLI_FAILED;
  } else if (!env.body.stats_reply.has_host) {
    fprintf(stderr, "openinfer stats: %s: the server sent no host figures (an older server?)\n",
            socket);
    rc = CLI_FAILED;
  } else if (json) {
    print_json(socket, &hello, &env.body.stats_reply, &arrays);
  } else {
    print_summary(socket, &hello, &env.body.stats_reply, &arrays);
  }
  oi__wire_arrays_free(&arrays);
  oi__free(buf);
  return rc;
}
