/* `openinfer stats`: asks a running `openinfer serve` for its figures
 * (oi_server_fetch_stats, and oi_server_fetch_cluster_stats for its
 * cluster tier) and prints a summary, or JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "openinfer/openinfer.h"

static void stats_usage(FILE *f) {
  fprintf(f, "usage: openinfer stats [options]\n"
             "\n"
             "Prints the figures of a running sidecar server (openinfer serve): pool use, blocks\n"
             "by state, saves, loads, queries, leases, the read-rate estimates (host -> device,\n"
             "disk, cluster: what the restore plan costs a load with), latencies, namespaces,\n"
             "and its disk and cluster tiers.\n"
             "\n"
             "options:\n"
             "  --socket PATH   the server's socket (default $XDG_RUNTIME_DIR/openinfer.sock,\n"
             "                  or /tmp/openinfer-$UID.sock)\n"
             "  --json          one JSON object instead of the summary\n"
             "  -h, --help      this text\n");
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
static void quantile(char *out, size_t cap, const uint64_t *b, uint32_t n, double q) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++)
    total += b[i];
  if (!total) {
    snprintf(out, cap, "-");
    return;
  }
  uint64_t want = (uint64_t)((double)total * q + 0.999999), cum = 0;
  for (uint32_t i = 0; i < n; i++) {
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

static void print_latency(const char *what, const uint64_t *b, uint32_t n, uint64_t sum_us) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; i++)
    total += b[i];
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

static void json_array(const char *name, const uint64_t *v, uint32_t n) {
  printf("\"%s\": [", name);
  for (uint32_t i = 0; i < n; i++)
    printf("%s%llu", i ? ", " : "", (unsigned long long)v[i]);
  printf("]");
}

#define J(name, v) printf("    \"%s\": %llu,\n", name, (unsigned long long)(v))

/* GB/s of `bytes` moved in `ns` (0 when no time was spent). */
static double gbps(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes / (double)ns : 0.0; }

static void print_json_cluster(const oi_host_cluster_stats *c) {
  printf("  \"cluster\": {\n");
  J("directory_connected", c->directory_connected);
  J("port", c->port);
  J("fetches", c->fetches);
  J("fetched_blocks", c->remote_blocks);
  J("fetched_bytes", c->bytes_fetched);
  J("fetch_ns", c->fetch_ns);
  printf("    \"fetch_gbps\": %.3f,\n", gbps(c->bytes_fetched, c->fetch_ns));
  J("fetch_failed_blocks", c->remote_failed);
  J("lookups", c->lookups);
  J("stale_removed", c->stale_removed);
  J("served_blocks", c->served_blocks);
  J("served_bytes", c->bytes_served);
  J("holders_up", c->holders_up);
  J("holders_down", c->holders_down);
  J("holders_marked_down", c->holders_marked_down);
  J("directory_published", c->published);
  J("directory_withdrawn", c->unpublished);
  J("directory_errors", c->directory_errors);
  J("directory_dropped", c->directory_dropped);
  J("directory_rejected", c->directory_rejected);
  J("handshakes_refused", c->peers_refused);
  printf("    \"handshakes_failed\": %llu\n  },\n", (unsigned long long)c->handshakes_failed);
}

static void print_json(const char *socket, const oi_server_stats *r, const oi_host_stats *h,
                       const oi_host_namespace_stats *ns, uint32_t n_ns,
                       const oi_host_cluster_stats *c) {
  printf("{\n  \"socket\": ");
  json_string(socket);
  printf(",\n  \"server_version\": ");
  json_string(r->server_version);
  printf(",\n  \"epoch\": \"%016llx\",\n", (unsigned long long)r->epoch);
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
  J("link_bytes_per_s", h->link_bytes_per_s);
  J("link_samples", h->link_samples);
  J("disk_bytes_per_s", h->disk_bytes_per_s);
  J("disk_samples", h->disk_samples);
  J("remote_bytes_per_s", h->remote_bytes_per_s);
  J("remote_samples", h->remote_samples);
  printf("    ");
  json_array("save_latency_us", h->save_latency_us, h->latency_buckets);
  printf(",\n");
  J("save_latency_sum_us", h->save_latency_sum_us);
  printf("    ");
  json_array("load_latency_us", h->load_latency_us, h->latency_buckets);
  printf(",\n    \"load_latency_sum_us\": %llu\n  },\n",
         (unsigned long long)h->load_latency_sum_us);
  if (r->disk_attached) {
    const oi_host_disk_stats *d = &r->disk;
    printf("  \"disk\": {\n");
    J("blocks", d->blocks);
    J("bytes_used", d->bytes_used);
    J("capacity_bytes", d->capacity_bytes);
    J("spills", d->spills);
    J("spills_failed", d->spills_failed);
    J("spills_skipped", d->spills_skipped);
    J("spill_overflow", d->spill_overflow);
    J("promotions", d->promotions);
    J("promote_failed", d->promote_failed);
    J("checksum_failures", d->checksum_failures);
    J("evictions", d->evictions);
    J("torn_records_cut", d->torn_records_cut);
    J("replay_ns", d->replay_ns);
    J("lost_queue_full", d->lost_queue_full);
    J("lost_unwritten", d->lost_unwritten);
    J("lost_write_failed", d->lost_write_failed);
    J("lost_no_room", d->lost_no_room);
    J("disk_full", d->disk_full);
    J("full_events", d->full_events);
    J("spills_refused_full", d->spills_refused_full);
    printf("    ");
    json_array("read_latency_us", d->read_latency_us, d->latency_buckets);
    printf(",\n    \"read_latency_sum_us\": %llu\n  },\n",
           (unsigned long long)d->read_latency_sum_us);
  }
  if (c) print_json_cluster(c);
  printf("  \"namespaces\": [");
  for (size_t i = 0; i < n_ns; i++) {
    printf("%s\n    {\"name\": ", i ? "," : "");
    json_string(ns[i].name);
    printf(", \"block_bytes\": %llu, \"blocks_resident\": %llu, \"codec\": ",
           (unsigned long long)ns[i].block_bytes, (unsigned long long)ns[i].blocks_resident);
    json_string(ns[i].codec);
    printf(", \"stored_bytes\": %llu, \"logical_bytes\": %llu, \"physical_bytes\": %llu}",
           (unsigned long long)ns[i].stored_bytes, (unsigned long long)ns[i].logical_bytes,
           (unsigned long long)ns[i].physical_bytes);
  }
  printf("%s]\n}\n", n_ns ? "\n  " : "");
}

static void print_summary(const char *socket, const oi_server_stats *r, const oi_host_stats *h,
                          const oi_host_namespace_stats *ns, uint32_t n_ns,
                          const oi_host_cluster_stats *c) {
  char b1[32], b2[32], b3[32], b4[32];
  printf("openinfer server on %s: %s, epoch %016llx, up %.0f s\n", socket, r->server_version,
         (unsigned long long)r->epoch, (double)r->uptime_ns / 1e9);
  human_bytes(b1, sizeof b1, r->arena_bytes);
  printf("%-14s %llu sessions, %llu instances (%s of arenas), %llu cleaned up\n",
         "clients:", (unsigned long long)r->sessions, (unsigned long long)r->instances, b1,
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
  printf(
      "%-14s %llu blocks submitted, %llu completed, %llu deduplicated, %llu dropped, %llu failed; "
      "%s saved\n",
      "saves:", (unsigned long long)h->saves_submitted, (unsigned long long)h->saves_completed,
      (unsigned long long)h->saves_deduplicated, (unsigned long long)h->saves_dropped,
      (unsigned long long)h->saves_failed, b1);
  human_bytes(b1, sizeof b1, h->bytes_loaded);
  printf("%-14s %llu submitted, %llu completed, %llu failed; %llu blocks, %s loaded\n",
         "loads:", (unsigned long long)h->loads_submitted, (unsigned long long)h->loads_completed,
         (unsigned long long)h->loads_failed, (unsigned long long)h->blocks_loaded, b1);
  uint64_t q = h->query_hit_blocks + h->query_miss_blocks;
  printf("%-14s %llu hit blocks, %llu missed (hit rate %.1f%%)\n",
         "queries:", (unsigned long long)h->query_hit_blocks,
         (unsigned long long)h->query_miss_blocks,
         q ? 100.0 * (double)h->query_hit_blocks / (double)q : 0.0);
  printf("%-14s %llu active, %llu released, %llu expired; %llu blocks evicted\n",
         "leases:", (unsigned long long)h->leases_active, (unsigned long long)h->leases_released,
         (unsigned long long)h->leases_expired, (unsigned long long)h->evictions);
  /* 0: an older server, which sends no estimates. */
  if (h->link_bytes_per_s || h->disk_bytes_per_s || h->remote_bytes_per_s)
    printf("%-14s link %.2f GB/s (%llu samples), disk %.2f GB/s (%llu), remote %.2f GB/s (%llu)\n",
           "read rates:", (double)h->link_bytes_per_s / 1e9, (unsigned long long)h->link_samples,
           (double)h->disk_bytes_per_s / 1e9, (unsigned long long)h->disk_samples,
           (double)h->remote_bytes_per_s / 1e9, (unsigned long long)h->remote_samples);
  else
    printf("%-14s not reported (an older server)\n", "read rates:");
  print_latency("save latency:", h->save_latency_us, h->latency_buckets, h->save_latency_sum_us);
  print_latency("load latency:", h->load_latency_us, h->latency_buckets, h->load_latency_sum_us);
  if (r->disk_attached) {
    const oi_host_disk_stats *d = &r->disk;
    human_bytes(b1, sizeof b1, d->capacity_bytes);
    human_bytes(b2, sizeof b2, d->bytes_used);
    printf("%-14s %s: %llu blocks (%s); %llu spilled, %llu failed, %llu skipped, %llu never "
           "queued; %llu promoted, %llu failed reads, %llu checksum failures; %llu evicted\n",
           "disk:", b1, (unsigned long long)d->blocks, b2, (unsigned long long)d->spills,
           (unsigned long long)d->spills_failed, (unsigned long long)d->spills_skipped,
           (unsigned long long)d->spill_overflow, (unsigned long long)d->promotions,
           (unsigned long long)d->promote_failed, (unsigned long long)d->checksum_failures,
           (unsigned long long)d->evictions);
    printf("%-14s %llu blocks evicted from the pool unwritten: %llu queue full, %llu before "
           "their write, %llu write failed, %llu no room\n",
           "disk lost:",
           (unsigned long long)(d->lost_queue_full + d->lost_unwritten + d->lost_write_failed +
                                d->lost_no_room),
           (unsigned long long)d->lost_queue_full, (unsigned long long)d->lost_unwritten,
           (unsigned long long)d->lost_write_failed, (unsigned long long)d->lost_no_room);
    printf("%-14s %s; found full %llu times; %llu spills refused while full\n",
           "disk full:", d->disk_full ? "FULL (spills stopped)" : "no",
           (unsigned long long)d->full_events, (unsigned long long)d->spills_refused_full);
    print_latency("disk reads:", d->read_latency_us, d->latency_buckets, d->read_latency_sum_us);
  } else {
    printf("%-14s none\n", "disk:");
  }
  if (c) {
    human_bytes(b1, sizeof b1, c->bytes_fetched);
    human_bytes(b2, sizeof b2, c->bytes_served);
    printf("%-14s directory %s, peer port %u; %llu holders up, %llu down (%llu times down)\n",
           "cluster:", c->directory_connected ? "connected" : "NOT connected (local only)",
           (unsigned)c->port, (unsigned long long)c->holders_up,
           (unsigned long long)c->holders_down, (unsigned long long)c->holders_marked_down);
    printf("%-14s %llu blocks (%s) in %llu fetches, %.2f GB/s; %llu blocks failed; %llu "
           "lookups, %llu stale entries removed\n",
           "  fetched:", (unsigned long long)c->remote_blocks, b1, (unsigned long long)c->fetches,
           gbps(c->bytes_fetched, c->fetch_ns), (unsigned long long)c->remote_failed,
           (unsigned long long)c->lookups, (unsigned long long)c->stale_removed);
    printf("%-14s %llu blocks (%s) to peers; handshakes: %llu refused (inbound), %llu failed "
           "(outbound)\n",
           "  served:", (unsigned long long)c->served_blocks, b2,
           (unsigned long long)c->peers_refused, (unsigned long long)c->handshakes_failed);
    printf("%-14s %llu published, %llu withdrawn, %llu lost, %llu errors, %llu entries "
           "rejected\n",
           "  directory:", (unsigned long long)c->published, (unsigned long long)c->unpublished,
           (unsigned long long)c->directory_dropped, (unsigned long long)c->directory_errors,
           (unsigned long long)c->directory_rejected);
  } else {
    printf("%-14s none\n", "cluster:");
  }
  printf("namespaces:    %u\n", (unsigned)h->namespaces);
  for (size_t i = 0; i < n_ns; i++) {
    human_bytes(b1, sizeof b1, ns[i].logical_bytes);
    printf("  %-40s %llu blocks resident (%s)", ns[i].name,
           (unsigned long long)ns[i].blocks_resident, b1);
    if (strcmp(ns[i].codec, "none") != 0 && ns[i].physical_bytes) {
      char b2[32];
      human_bytes(b2, sizeof b2, ns[i].physical_bytes);
      printf(", codec %s: %s in the pool (%.2fx)", ns[i].codec, b2,
             (double)ns[i].logical_bytes / (double)ns[i].physical_bytes);
    }
    printf("\n");
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
  /* Every namespace the server lists (at most OI_WIRE's 4096 per reply). */
  enum { MAX_NS = 4096 };
  oi_host_namespace_stats *ns = calloc(MAX_NS, sizeof *ns);
  if (!ns) {
    fprintf(stderr, "openinfer stats: out of memory\n");
    return CLI_FAILED;
  }
  ns[0].struct_size = sizeof *ns;
  oi_server_stats r = {.struct_size = sizeof r};
  oi_host_stats h = {.struct_size = sizeof h};
  oi_status st = oi_server_fetch_stats(socket, 10000, &r, &h, ns, MAX_NS);
  const char *where = st == OI_OK ? r.socket_path : socket ? socket : "the default socket";
  int rc = CLI_OK;
  uint32_t n_ns = r.namespaces < MAX_NS ? r.namespaces : MAX_NS;
  /* The cluster tier's figures, when the server has one (a second
   * exchange: they are experimental). */
  oi_host_cluster_stats cs = {.struct_size = sizeof cs};
  bool cluster = st == OI_OK && oi_server_fetch_cluster_stats(r.socket_path, 10000, &cs) == OI_OK;
  if (st != OI_OK) {
    fprintf(stderr, "openinfer stats: %s: %s (%s)\n", where, oi_last_error(), oi_status_str(st));
    rc = CLI_FAILED;
  } else if (json) {
    print_json(where, &r, &h, ns, n_ns, cluster ? &cs : NULL);
  } else {
    print_summary(where, &r, &h, ns, n_ns, cluster ? &cs : NULL);
  }
  free(ns);
  return rc;
}
