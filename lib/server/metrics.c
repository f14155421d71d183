/* The server's HTTP endpoint: /metrics in the Prometheus text exposition
 * format (version 0.0.4) and /healthz, served by libmicrohttpd on its own
 * thread. Every figure is read on demand from the host's and the server's
 * counters (atomics): scraping costs the data path nothing.
 *
 * Bound to loopback unless the address says otherwise. A build without
 * libmicrohttpd compiles the renderer and the health check but refuses to
 * start the endpoint (OI_ERR_UNSUPPORTED, with the reason). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host/host.h"
#include "server_internal.h"

#ifdef OI_HAVE_MICROHTTPD
#include <microhttpd.h>
#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif
#endif

struct oi_metrics_http {
  int fd;
  uint16_t port;
#ifdef OI_HAVE_MICROHTTPD
  struct MHD_Daemon *daemon;
#endif
};

/* ---- rendering ------------------------------------------------------------------ */

typedef struct out_buf {
  char *p;
  size_t len, cap;
  bool oom;
} out_buf;

static void put(out_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_buf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = true;
      return;
    }
    if ((size_t)n < b->cap - b->len) {
      b->len += (size_t)n;
      return;
    }
    size_t ncap = b->cap * 2 + (size_t)n + 1;
    char *np = realloc(b->p, ncap); /* libc: libmicrohttpd frees it */
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = ncap;
  }
}

static void header(out_buf *b, const char *name, const char *type, const char *help) {
  put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric(out_buf *b, const char *name, const char *type, const char *help, uint64_t v) {
  header(b, name, type, help);
  put(b, "%s %llu\n", name, (unsigned long long)v);
}

/* A metric in seconds, from nanoseconds (six decimals). */
static void metric_seconds(out_buf *b, const char *name, const char *type, const char *help,
                           uint64_t ns) {
  header(b, name, type, help);
  put(b, "%s %.6f\n", name, (double)ns / 1e9);
}

/* A label value: backslash, double quote and newline escaped. */
static void put_label_value(out_buf *b, const char *v) {
  for (const char *c = v; *c; c++) {
    if (*c == '\\')
      put(b, "\\\\");
    else if (*c == '"')
      put(b, "\\\"");
    else if (*c == '\n')
      put(b, "\\n");
    else
      put(b, "%c", *c);
  }
}

/* A histogram in seconds from OI_LATENCY_BUCKETS buckets of microseconds. */
static void histogram(out_buf *b, const char *name, const char *help, const uint64_t *buckets,
                      uint64_t sum_us) {
  header(b, name, "histogram", help);
  uint64_t cum = 0;
  for (uint32_t i = 0; i < OI_LATENCY_BUCKETS - 1; i++) {
    cum += buckets[i];
    put(b, "%s_bucket{le=\"%.6g\"} %llu\n", name, (double)(1ull << i) / 1e6,
        (unsigned long long)cum);
  }
  cum += buckets[OI_LATENCY_BUCKETS - 1];
  put(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
  put(b, "%s_sum %.6f\n", name, (double)sum_us / 1e6);
  put(b, "%s_count %llu\n", name, (unsigned long long)cum);
}

bool oi__metrics_render(oi_server *srv, char **buf, size_t *len, size_t *cap) {
  out_buf b = {.p = *buf, .len = *len, .cap = *cap};
  if (!b.p) {
    b.cap = 16384;
    if (!(b.p = malloc(b.cap))) return false;
  }
  oi_host *host = __atomic_load_n(&srv->host, __ATOMIC_ACQUIRE); /* NULL while it is set up */
  oi_host_stats hs;
  memset(&hs, 0, sizeof hs);
  hs.struct_size = sizeof hs;
  if (host) oi_host_get_stats(host, &hs);

  header(&b, "openinfer_info", "gauge", "Library version and server epoch (always 1).");
  put(&b, "openinfer_info{version=\"");
  put_label_value(&b, oi_version_string());
  put(&b, "\",epoch=\"%016llx\"} 1\n", (unsigned long long)srv->epoch);
  put(&b,
      "# HELP openinfer_uptime_seconds Seconds since the server started.\n"
      "# TYPE openinfer_uptime_seconds gauge\nopeninfer_uptime_seconds %.3f\n",
      (double)(oi__now_ns() - srv->start_ns) / 1e9);

  /* Saves (blocks). */
  metric(&b, "openinfer_save_blocks_submitted_total", "counter", "Blocks offered to save.",
         hs.saves_submitted);
  metric(&b, "openinfer_save_blocks_completed_total", "counter",
         "Blocks saved and sealed (visible to queries).", hs.saves_completed);
  metric(&b, "openinfer_save_blocks_deduplicated_total", "counter",
         "Blocks offered to save that were already sealed or in flight.", hs.saves_deduplicated);
  metric(&b, "openinfer_save_blocks_dropped_total", "counter",
         "Blocks offered to save that got no pool memory.", hs.saves_dropped);
  metric(&b, "openinfer_save_blocks_failed_total", "counter",
         "Blocks whose save copy failed or missed its deadline (never made visible).",
         hs.saves_failed);
  metric(&b, "openinfer_saved_bytes_total", "counter", "Bytes copied device to host.",
         hs.bytes_saved);
  /* Loads. */
  metric(&b, "openinfer_loads_submitted_total", "counter",
         "Load operations accepted (each consumed a lease share).", hs.loads_submitted);
  metric(&b, "openinfer_loads_completed_total", "counter", "Load operations completed.",
         hs.loads_completed);
  metric(&b, "openinfer_loads_failed_total", "counter",
         "Load operations that failed (copy error, deadline, unknown or expired lease).",
         hs.loads_failed);
  metric(&b, "openinfer_loaded_blocks_total", "counter", "Blocks copied host to device.",
         hs.blocks_loaded);
  metric(&b, "openinfer_loaded_bytes_total", "counter", "Bytes copied host to device.",
         hs.bytes_loaded);
  /* Queries. */
  metric(&b, "openinfer_query_hit_blocks_total", "counter", "Queried blocks reported as hits.",
         hs.query_hit_blocks);
  metric(&b, "openinfer_query_miss_blocks_total", "counter",
         "Queried blocks past the hit prefix (misses).", hs.query_miss_blocks);
  /* Leases. */
  metric(&b, "openinfer_leases_active", "gauge", "Live leases.", hs.leases_active);
  metric(&b, "openinfer_leases_released_total", "counter",
         "Leases released explicitly, fully consumed by loads, or dropped with their instance.",
         hs.leases_released);
  metric(&b, "openinfer_leases_expired_total", "counter", "Leases expired by their TTL.",
         hs.leases_expired);
  metric(&b, "openinfer_evicted_blocks_total", "counter", "Blocks evicted from the pool.",
         hs.evictions);
  /* Pool. */
  metric(&b, "openinfer_pool_capacity_bytes", "gauge", "Size of the host pool.", hs.capacity_bytes);
  metric(&b, "openinfer_pool_used_bytes", "gauge",
         "Pool bytes in chunks carved for a block size (used + free = capacity).", hs.used_bytes);
  metric(&b, "openinfer_pool_free_bytes", "gauge", "Pool bytes not carved for any block size.",
         hs.free_bytes);
  metric(&b, "openinfer_pool_resident_bytes", "gauge",
         "Bytes of the blocks the pool holds (in flight or sealed).", hs.block_bytes_resident);
  metric(&b, "openinfer_pool_size_classes", "gauge", "Distinct block sizes in use.",
         hs.size_classes);
  metric_seconds(&b, "openinfer_pool_setup_seconds", "gauge",
                 "Time the pool took to map, touch and pin at start.", hs.pool_setup_ns);
  header(&b, "openinfer_blocks", "gauge",
         "Host blocks by state: free (carved, empty), in_flight (being saved), sealed (visible; "
         "includes leased and loading), leased (pinned by a lease), loading (read by a load).");
  put(&b, "openinfer_blocks{state=\"free\"} %llu\n", (unsigned long long)hs.blocks_free);
  put(&b, "openinfer_blocks{state=\"in_flight\"} %llu\n", (unsigned long long)hs.blocks_in_flight);
  put(&b, "openinfer_blocks{state=\"sealed\"} %llu\n", (unsigned long long)hs.blocks_sealed);
  put(&b, "openinfer_blocks{state=\"leased\"} %llu\n", (unsigned long long)hs.blocks_leased);
  put(&b, "openinfer_blocks{state=\"loading\"} %llu\n", (unsigned long long)hs.blocks_loading);
  metric(&b, "openinfer_blocks_pinned_for_load", "gauge",
         "Sealed blocks a lease or a load holds (not evictable).", hs.blocks_pinned);
  header(&b, "openinfer_namespace_resident_blocks", "gauge",
         "Blocks in flight or sealed, per namespace.");
  for (uint32_t i = 0; i < hs.namespaces; i++) {
    oi_host_namespace_stats ns;
    memset(&ns, 0, sizeof ns);
    ns.struct_size = sizeof ns;
    if (oi_host_get_namespace_stats(host, i, &ns) != OI_OK) break;
    put(&b, "openinfer_namespace_resident_blocks{namespace=\"");
    put_label_value(&b, ns.name);
    put(&b, "\"} %llu\n", (unsigned long long)ns.blocks_resident);
  }
  header(&b, "openinfer_namespace_bytes", "gauge",
         "Bytes of the blocks resident per namespace: logical (decoded) and physical (the pool "
         "slots they take; smaller under a codec, docs/codecs.md).");
  for (uint32_t i = 0; i < hs.namespaces; i++) {
    oi_host_namespace_stats ns;
    memset(&ns, 0, sizeof ns);
    ns.struct_size = sizeof ns;
    if (oi_host_get_namespace_stats(host, i, &ns) != OI_OK) break;
    for (int kind = 0; kind < 2; kind++) {
      put(&b, "openinfer_namespace_bytes{namespace=\"");
      put_label_value(&b, ns.name);
      put(&b, "\",codec=\"%s\",kind=\"%s\"} %llu\n", ns.codec, kind ? "physical" : "logical",
          (unsigned long long)(kind ? ns.physical_bytes : ns.logical_bytes));
    }
  }
  oi_clear_error();
  /* Latency. */
  histogram(&b, "openinfer_save_duration_seconds",
            "Save operations (that copied at least one block): from the request to every "
            "accepted block sealed or failed.",
            hs.save_latency_us, hs.save_latency_sum_us);
  histogram(&b, "openinfer_load_duration_seconds",
            "Load operations: from the request to the last block landed.", hs.load_latency_us,
            hs.load_latency_sum_us);
  /* The read-rate estimates the restore plan costs a load with
   * (docs/planner.md): host -> device, and the disk and cluster tiers'
   * reads into the pool. */
  static const char *const paths[3] = {"link", "disk", "remote"};
  const uint64_t rate[3] = {hs.link_bytes_per_s, hs.disk_bytes_per_s, hs.remote_bytes_per_s};
  const uint64_t samples[3] = {hs.link_samples, hs.disk_samples, hs.remote_samples};
  header(&b, "openinfer_read_rate_bytes_per_second", "gauge",
         "Read-rate estimates: host to device (link), the disk tier's and the cluster tier's "
         "reads into the pool (disk, remote); the seed, then an EWMA of the transfers.");
  for (int i = 0; i < 3; i++)
    put(&b, "openinfer_read_rate_bytes_per_second{path=\"%s\"} %llu\n", paths[i],
        (unsigned long long)rate[i]);
  header(&b, "openinfer_read_rate_samples_total", "counter",
         "Transfers of 1 MiB or more that moved the read-rate estimates.");
  for (int i = 0; i < 3; i++)
    put(&b, "openinfer_read_rate_samples_total{path=\"%s\"} %llu\n", paths[i],
        (unsigned long long)samples[i]);
  /* The disk tier, when one is attached. */
  oi_host_disk_stats ds;
  memset(&ds, 0, sizeof ds);
  ds.struct_size = sizeof ds;
  if (host && oi_host_get_disk_stats(host, &ds) == OI_OK) {
    metric(&b, "openinfer_disk_blocks", "gauge", "Blocks the disk tier holds.", ds.blocks);
    metric(&b, "openinfer_disk_used_bytes", "gauge",
           "Disk bytes the stored blocks take (headers and padding included).", ds.bytes_used);
    metric(&b, "openinfer_disk_capacity_bytes", "gauge", "Disk tier capacity.", ds.capacity_bytes);
    metric(&b, "openinfer_disk_spilled_blocks_total", "counter", "Blocks written to disk.",
           ds.spills);
    metric(&b, "openinfer_disk_spills_failed_total", "counter",
           "Disk writes that failed (the pool copy stayed the only one).", ds.spills_failed);
    metric(&b, "openinfer_disk_spills_skipped_total", "counter",
           "Blocks not written: the disk had them, or its queue was full.", ds.spills_skipped);
    metric(&b, "openinfer_disk_promoted_blocks_total", "counter",
           "Blocks read back from disk into the pool, verified.", ds.promotions);
    metric(&b, "openinfer_disk_reads_failed_total", "counter",
           "Disk reads that failed (I/O error or checksum): a miss.", ds.promote_failed);
    metric(&b, "openinfer_disk_checksum_failures_total", "counter",
           "Blocks caught by their checksum, removed and never served.", ds.checksum_failures);
    metric(&b, "openinfer_disk_evicted_blocks_total", "counter",
           "Blocks the disk tier evicted for room.", ds.evictions);
    metric(&b, "openinfer_disk_lost_queue_full_total", "counter",
           "Blocks the pool evicted that never reached the disk: the spill queue was full.",
           ds.lost_queue_full);
    metric(&b, "openinfer_disk_lost_unwritten_total", "counter",
           "Blocks the pool evicted before their disk write.", ds.lost_unwritten);
    metric(&b, "openinfer_disk_lost_write_failed_total", "counter",
           "Blocks the pool evicted whose disk write had failed.", ds.lost_write_failed);
    metric(&b, "openinfer_disk_lost_no_room_total", "counter",
           "Blocks the pool evicted that the disk had no room for.", ds.lost_no_room);
    metric(&b, "openinfer_disk_full", "gauge",
           "1 while the disk tier's file system is full (spills stopped).", ds.disk_full);
    metric(&b, "openinfer_disk_full_events_total", "counter",
           "Times the disk tier found its file system full.", ds.full_events);
    metric(&b, "openinfer_disk_spills_refused_full_total", "counter",
           "Blocks not written (or not kept) because the file system was full.",
           ds.spills_refused_full);
    histogram(&b, "openinfer_disk_read_duration_seconds", "Disk reads of one block.",
              ds.read_latency_us, ds.read_latency_sum_us);
  }
  /* The cluster tier, when one is attached. */
  oi_host_cluster_stats cs;
  memset(&cs, 0, sizeof cs);
  cs.struct_size = sizeof cs;
  if (host && oi_host_get_cluster_stats(host, &cs) == OI_OK) {
    metric(&b, "openinfer_cluster_directory_connected", "gauge",
           "1 while the cluster's directory (Redis) answers; 0: local only.",
           cs.directory_connected);
    metric(&b, "openinfer_cluster_fetches_total", "counter",
           "Fetch operations from holders (a lease and its reads, one holder each).", cs.fetches);
    metric(&b, "openinfer_cluster_fetched_blocks_total", "counter",
           "Blocks fetched from other nodes, verified and sealed here.", cs.remote_blocks);
    metric(&b, "openinfer_cluster_fetched_bytes_total", "counter",
           "Bytes of the blocks fetched from other nodes.", cs.bytes_fetched);
    metric_seconds(&b, "openinfer_cluster_fetch_seconds_total", "counter",
                   "Time with a fetch in flight (fetched bytes over it: the fetch rate).",
                   cs.fetch_ns);
    metric(&b, "openinfer_cluster_fetch_failed_blocks_total", "counter",
           "Blocks whose fetch failed (holder down or gone, refused, timeout, checksum): misses.",
           cs.remote_failed);
    metric(&b, "openinfer_cluster_lookups_total", "counter",
           "Directory lookups (queries past the pool and the disk).", cs.lookups);
    metric(&b, "openinfer_cluster_stale_entries_removed_total", "counter",
           "Directory entries whose holder no longer had the block: removed.", cs.stale_removed);
    metric(&b, "openinfer_cluster_served_blocks_total", "counter", "Blocks leased to other nodes.",
           cs.served_blocks);
    metric(&b, "openinfer_cluster_served_bytes_total", "counter",
           "Bytes of blocks other nodes read from this one.", cs.bytes_served);
    header(&b, "openinfer_cluster_holders", "gauge",
           "Holders this node has a connection to (up) and holders that did not answer, probed "
           "until they do (down).");
    put(&b, "openinfer_cluster_holders{state=\"up\"} %llu\n", (unsigned long long)cs.holders_up);
    put(&b, "openinfer_cluster_holders{state=\"down\"} %llu\n",
        (unsigned long long)cs.holders_down);
    metric(&b, "openinfer_cluster_holders_marked_down_total", "counter",
           "Times a holder went down (its blocks miss at once until it answers).",
           cs.holders_marked_down);
    metric(&b, "openinfer_cluster_directory_published_total", "counter",
           "Directory entries written (sealed blocks).", cs.published);
    metric(&b, "openinfer_cluster_directory_withdrawn_total", "counter",
           "Directory entries withdrawn (evicted blocks).", cs.unpublished);
    metric(&b, "openinfer_cluster_directory_dropped_total", "counter",
           "Publishes and withdrawals lost (queue full, connection lost): they expire by TTL.",
           cs.directory_dropped);
    metric(&b, "openinfer_cluster_directory_errors_total", "counter",
           "Failed connects, round trips and replies to the directory.", cs.directory_errors);
    metric(&b, "openinfer_cluster_directory_rejected_entries_total", "counter",
           "Directory entries and node records not believed (malformed, failed MAC, expired).",
           cs.directory_rejected);
    metric(&b, "openinfer_cluster_handshakes_refused_total", "counter",
           "Inbound peer connections refused (failed or abandoned authentication).",
           cs.peers_refused);
    metric(&b, "openinfer_cluster_handshakes_failed_total", "counter",
           "Outbound peer connections that did not authenticate.", cs.handshakes_failed);
  }
  oi_clear_error();
  /* The server. */
  pthread_mutex_lock(&srv->lock);
  uint32_t sessions = srv->num_sessions;
  pthread_mutex_unlock(&srv->lock);
  metric(&b, "openinfer_sessions", "gauge", "Connected client sessions.", sessions);
  metric(&b, "openinfer_instances", "gauge", "Registered instances (client layouts).",
         atomic_load(&srv->instances));
  metric(&b, "openinfer_arena_bytes", "gauge",
         "Device memory allocated for the live instances' KV arenas.",
         atomic_load(&srv->arena_bytes));
  metric(&b, "openinfer_instances_cleaned_up_total", "counter",
         "Instances freed because their session ended without unregistering.",
         atomic_load(&srv->instances_cleaned_up));
  *buf = b.p;
  *len = b.len;
  *cap = b.cap;
  return !b.oom;
}

/* ---- health ---------------------------------------------------------------------- */

static bool device_answers(int ordinal, char *why, size_t cap) {
  oi_dev *d = NULL;
  oi_status st = oi__dev_open(ordinal, &d);
  if (st == OI_OK) {
    oi_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    st = d->ops->info(d, &info);
    oi__dev_close(d);
  }
  if (st != OI_OK) {
    snprintf(why, cap, "device %d does not answer: %s (%s)", ordinal, oi_last_error(),
             oi_status_str(st));
    oi_clear_error();
    return false;
  }
  return true;
}

bool oi__server_healthy(oi_server *srv, char *why, size_t cap) {
  if (atomic_load(&srv->state) != 1 || atomic_load(&srv->stop_requested)) {
    snprintf(why, cap, "the server is not serving (%s)",
             atomic_load(&srv->state) == 0 ? "not started" : "stopping or stopped");
    return false;
  }
  const oi_host *h = __atomic_load_n(&srv->host, __ATOMIC_ACQUIRE);
  oi_host_pool_info pool = {0};
  if (h) oi__host_pool_info(h, &pool);
  if (!pool.ready) {
    snprintf(why, cap, "the host pool is not set up");
    return false;
  }
  bool want_pin = pool.pin_requested;
  if (want_pin && pool.device >= 0 && !pool.device_mapped) {
    snprintf(why, cap, "the host pool is not pinned for device %d", pool.device);
    return false;
  }
  /* The devices served: the pool's, the configured ones, and those of the
   * live instances (when any device is allowed). */
  int devs[64];
  size_t n = 0;
  devs[n++] = pool.device;
  for (uint32_t i = 0; i < srv->opts.num_devices && n < OI_ARRAY_LEN(devs); i++)
    devs[n++] = srv->devices[i];
  pthread_mutex_lock(&srv->lock);
  for (srv_session *ss = srv->sessions; ss; ss = ss->next)
    for (srv_instance *in = ss->instances; in && n < OI_ARRAY_LEN(devs); in = in->next)
      devs[n++] = in->dev->ordinal;
  pthread_mutex_unlock(&srv->lock);
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i; j++)
      seen |= devs[j] == devs[i];
    if (!seen && !device_answers(devs[i], why, cap)) return false;
  }
  snprintf(why, cap, "ok: pool of %.2f GiB %s, %zu device(s) answer",
           (double)pool.capacity_bytes / (double)(1ull << 30),
           want_pin ? "pinned" : "set up (not pinned: --no-pin)", n);
  return true;
}

/* ---- the HTTP endpoint ------------------------------------------------------------ */

#ifdef OI_HAVE_MICROHTTPD
/* Splits "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT" (host: 127.0.0.1). */
static oi_status parse_addr(const char *addr, char *host, size_t hcap, char *port, size_t pcap) {
  const char *colon = strrchr(addr, ':');
  const char *p = colon ? colon + 1 : addr;
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  const char *h = addr;
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  } else if (colon && memchr(addr, ':', hl)) {
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "metrics_addr '%s': write an IPv6 address in brackets ([::1]:9464)", addr);
  }
  if (hl == 0) {
    h = "127.0.0.1";
    hl = strlen(h);
  }
  char *end;
  long v = strtol(p, &end, 10);
  if (!*p || *end || v < 0 || v > 65535 || hl >= hcap || strlen(p) >= pcap)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "metrics_addr '%s' is not HOST:PORT (port 0-65535, e.g. 127.0.0.1:9464)", addr);
  memcpy(host, h, hl);
  host[hl] = '\0';
  snprintf(port, pcap, "%ld", v);
  return OI_OK;
}

static mhd_result send_text(struct MHD_Connection *c, unsigned code, const char *ctype, char *body,
                            size_t len, bool owned) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
  if (!r) {
    if (owned) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", ctype);
  MHD_add_response_header(r, "Cache-Control", "no-store");
  mhd_result ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ret;
}

static mhd_result on_request(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls) {
  OI_UNUSED(version);
  OI_UNUSED(upload);
  oi_server *srv = cls;
  if (!*con_cls) { /* first call: headers only */
    *con_cls = (void *)1;
    return MHD_YES;
  }
  if (*upload_size) { /* no request bodies here */
    *upload_size = 0;
    return MHD_YES;
  }
  bool head = !strcmp(method, "HEAD");
  if (strcmp(method, "GET") != 0 && !head) {
    static char msg[] = "only GET and HEAD\n";
    return send_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", msg, strlen(msg), false);
  }
  if (!strcmp(url, "/metrics")) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (!oi__metrics_render(srv, &buf, &len, &cap)) {
      free(buf);
      static char msg[] = "out of memory\n";
      return send_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain", msg, strlen(msg), false);
    }
    return send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", buf, len, true);
  }
  if (!strcmp(url, "/healthz")) {
    char why[512];
    bool ok = oi__server_healthy(srv, why, sizeof why - 1);
    strcat(why, "\n");
    return send_text(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", why,
                     strlen(why), false);
  }
  static char msg[] = "not found: try /metrics or /healthz\n";
  return send_text(c, MHD_HTTP_NOT_FOUND, "text/plain", msg, strlen(msg), false);
}
#endif

oi_status oi__metrics_start(oi_server *srv, const char *addr) {
#ifndef OI_HAVE_MICROHTTPD
  OI_UNUSED(srv);
  return oi__fail(OI_ERR_UNSUPPORTED,
                  "metrics endpoint %s: this build of libopeninfer has no HTTP endpoint "
                  "(libmicrohttpd was not found at build time: install libmicrohttpd-dev and "
                  "rebuild)",
                  addr);
#else
  char host[256], port[16];
  oi_status st = parse_addr(addr, host, sizeof host, port, sizeof port);
  if (st != OI_OK) return st;
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "metrics_addr '%s': %s", addr, gai_strerror(rc));
  int fd = -1, err = 0;
  bool v6 = false;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      err = errno;
      close(fd);
      fd = -1;
      continue;
    }
    v6 = ai->ai_family == AF_INET6;
  }
  freeaddrinfo(res);
  if (fd < 0)
    return oi__fail(err == EADDRINUSE ? OI_ERR_BUSY
                    : err == EACCES   ? OI_ERR_PERMISSION
                                      : OI_ERR_IO,
                    "metrics endpoint: cannot listen on %s: %s", addr, strerror(err));
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  uint16_t bound = 0;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
    bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
  struct oi_metrics_http *m = oi__calloc(1, sizeof *m);
  if (!m) {
    close(fd);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "metrics endpoint: out of memory");
  }
  m->fd = fd;
  m->port = bound;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | (v6 ? MHD_USE_IPv6 : 0);
  m->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_LISTEN_SOCKET, fd,
                               MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
  if (!m->daemon) {
    close(fd);
    oi__free(m);
    return oi__fail(OI_ERR_INTERNAL, "metrics endpoint: libmicrohttpd did not start on %s", addr);
  }
  srv->metrics = m;
  /* (debug: `openinfer serve` prints its own line; oi_server_metrics_port tells embedders) */
  OI_LOG(OI_LOG_DEBUG, "server", "metrics on http://%s%s%s:%u/metrics (and /healthz)",
         v6 ? "[" : "", host, v6 ? "]" : "", (unsigned)bound);
  return OI_OK;
#endif
}

uint16_t oi__metrics_port(const oi_server *srv) { return srv->metrics ? srv->metrics->port : 0; }

void oi__metrics_stop(oi_server *srv) {
  struct oi_metrics_http *m = srv->metrics;
  if (!m) return;
#ifdef OI_HAVE_MICROHTTPD
  MHD_stop_daemon(m->daemon); /* closes the listening socket too */
#endif
  oi__free(m);
  srv->metrics = NULL;
}
