/* Observability of the embeddable pieces, in one process:
 *  - oi_server with metrics_addr "127.0.0.1:0": the port is reported,
 *    /healthz answers 503 before oi_server_run, 200 while it runs, 503 once
 *    stopped; /metrics parses as lines of "name{labels} value";
 *  - the appended oi_host_stats / oi_engine_stats fields on an embedded host
 *    (loads, pinned-for-load blocks, namespaces, latency histograms) and an
 *    old caller's smaller struct_size;
 *  - the host's progress hook;
 *  - log lines carry instance=N for engine events;
 *  - oi_server_fetch_stats against a live server with one client: argument
 *    errors, a missing server, every field, an old caller's smaller structs
 *    (and the namespaces' stride);
 *  - the read-rate estimates over the wire and in /metrics: the configured
 *    seeds, then a 2 MiB load's link sample, equal to the server host's own. */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/core.h"
#include "openinfer/disk.h"
#include "rig.h"
#include "server/server_internal.h"
#include "testutil.h"

/* ---- a plain HTTP/1.0 client --------------------------------------------------- */

/* An HTTP request of any method and path; the status code. */
static int http_req(uint16_t port, const char *method, const char *path, const char *extra,
                    char *body, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  char req[512];
  int n =
      snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%s\r\n", method, path, extra);
  REQUIRE(write(fd, req, (size_t)n) == n);
  static char resp[1 << 20];
  size_t len = 0;
  ssize_t r;
  while ((r = read(fd, resp + len, sizeof resp - 1 - len)) > 0)
    len += (size_t)r;
  close(fd);
  resp[len] = '\0';
  int code = 0;
  if (sscanf(resp, "HTTP/1.%*d %d", &code) != 1) return -2;
  const char *b = strstr(resp, "\r\n\r\n");
  snprintf(body, cap, "%s", b ? b + 4 : "");
  return code;
}

static int http_get(uint16_t port, const char *path, char *body, size_t cap) {
  return http_req(port, "GET", path, "", body, cap);
}

/* ---- a server and a client engine ------------------------------------------------ */

/* Makes the scratch directory `dir` (a mkdtemp template) and names the
 * server's socket in it: "<dir>/s". */
static void scratch_dir(char *dir, char *sock, size_t cap) {
  REQUIRE(mkdtemp(dir));
  snprintf(sock, cap, "%s/s", dir);
}

/* Server options at `sock` over host options *ho: a 16 MiB pool, not pinned. */
static oi_server_options server_options(const char *sock, oi_host_options *ho) {
  *ho = tr_host_options(16 << 20);
  ho->flags = OI_HOST_NO_PIN;
  oi_server_options so;
  oi_server_options_init(&so);
  so.socket_path = sock;
  so.host = ho;
  return so;
}

/* A client engine of namespace `ns` over one arena *ad of 4 blocks of 256
 * bytes (its options in *eo), connected to the server at `sock`, retried
 * while the server is not up yet; REQUIREs success. */
static oi_engine *connect_kv(const char *sock, const char *ns, oi_arena_desc *ad,
                             oi_engine_options *eo, oi_imported_arena **ia) {
  *ad = tr_arena("kv", NULL, 4, 256);
  *eo = tr_engine_options(ns, ad, 1);
  oi_engine *e = NULL;
  oi_status st = OI_ERR_NOT_FOUND;
  for (int i = 0; i < 500 && st == OI_ERR_NOT_FOUND; i++) {
    st = oi_engine_connect(sock, eo, &e, ia);
    if (st == OI_ERR_NOT_FOUND) usleep(10000);
  }
  REQUIRE(st == OI_OK);
  return e;
}

/* Closes the client engine, stops the server (run on thread th) and destroys it. */
static void disconnect_and_stop(oi_engine *e, oi_imported_arena *ia, oi_server *srv, pthread_t th) {
  oi_imported_arena_close(ia);
  oi_engine_destroy(e);
  oi_server_stop(srv);
  pthread_join(th, NULL);
  oi_server_destroy(srv);
}

static void *run_server(void *arg) {
  oi_server_run(arg);
  return NULL;
}

/* Runs the server on a thread of its own. @return the thread. */
static pthread_t serve(oi_server *srv) {
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, run_server, srv) == 0);
  return th;
}

static void test_server_health(void) {
  char dir[] = "/tmp/oi-obs-XXXXXX";
  char sock[128];
  scratch_dir(dir, sock, sizeof sock);
  oi_host_options ho;
  oi_server_options so = server_options(sock, &ho);
  so.metrics_addr = "127.0.0.1:0";
  oi_server *srv;
  oi_status st = oi_server_create(&so, &srv);
  if (st == OI_ERR_UNSUPPORTED) { /* a build without libmicrohttpd */
    fprintf(stderr, "no metrics endpoint in this build: %s\n", oi_last_error());
    rmdir(dir);
    return;
  }
  REQUIRE(st == OI_OK);
  uint16_t port = oi_server_metrics_port(srv);
  CHECK(port != 0);
  static char body[1 << 20];
  CHECK(http_get(port, "/healthz", body, sizeof body) == 503); /* not serving yet */
  CHECK(strstr(body, "not started") != NULL);
  pthread_t th = serve(srv);
  int code = 0;
  for (int i = 0; i < 500 && code != 200; i++) {
    code = http_get(port, "/healthz", body, sizeof body);
    if (code != 200) usleep(10000);
  }
  CHECK(code == 200);
  CHECK(strncmp(body, "ok", 2) == 0);
  CHECK(http_get(port, "/metrics", body, sizeof body) == 200);
  /* Every line: a comment, or "name{labels} value". */
  size_t samples = 0;
  for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
    if (line[0] == '#') continue;
    char *sp = strrchr(line, ' ');
    CHECK(sp && sp[1]);
    char *end;
    strtod(sp + 1, &end);
    CHECK(*end == '\0');
    samples++;
  }
  CHECK(samples > 40);
  oi_server_stop(srv);
  pthread_join(th, NULL);
  CHECK(http_get(port, "/healthz", body, sizeof body) == 503); /* stopped */
  oi_server_destroy(srv);
  CHECK(http_get(port, "/healthz", body, sizeof body) == -1); /* the endpoint is gone */
  CHECK(rmdir(dir) == 0); /* the server removed its socket: no /tmp/oi-obs-* left behind */

  /* A second server cannot take a port in use; a bad address is refused. */
  oi_server_options_init(&so);
  so.host = &ho;
  so.socket_path = sock;
  so.metrics_addr = "[::1:80";
  CHECK_ST(oi_server_create(&so, &srv), OI_ERR_INVALID_ARGUMENT);
  so.metrics_addr = "127.0.0.1:99999";
  CHECK_ST(oi_server_create(&so, &srv), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi_server_metrics_port(NULL) == 0);
}

/* The endpoint of a server with a disk tier, an arena device list and a
 * namespace whose name needs escaping: the disk figures and the escaped
 * label appear; /healthz counts the devices it asked; other methods and
 * paths are refused; the port in use and malformed addresses are refused
 * at create. */
static void test_server_metrics_details(void) {
  char dir[] = "/tmp/oi-obs-XXXXXX";
  char sock[128], disk_dir[128];
  scratch_dir(dir, sock, sizeof sock);
  snprintf(disk_dir, sizeof disk_dir, "%s/disk", dir);
  const char *dirs[1] = {disk_dir};
  oi_host_disk_options dopt = {
      .struct_size = sizeof dopt, .num_dirs = 1, .dirs = dirs, .capacity_bytes = 8 << 20};
  int32_t cpu = OI_DEVICE_CPU;
  oi_host_options ho;
  oi_server_options so = server_options(sock, &ho);
  so.disk = &dopt;
  so.devices = &cpu;
  so.num_devices = 1;
  so.metrics_addr = ":0"; /* no host: 127.0.0.1 */
  oi_server *srv;
  oi_status st = oi_server_create(&so, &srv);
  if (st == OI_ERR_UNSUPPORTED) { /* no libmicrohttpd, or no disk tier in this build */
    fprintf(stderr, "skipped: %s\n", oi_last_error());
    rmdir(dir);
    return;
  }
  REQUIRE(st == OI_OK);
  uint16_t port = oi_server_metrics_port(srv);
  pthread_t th = serve(srv);
  oi_engine_options eo;
  oi_arena_desc ad;
  oi_imported_arena *ia = NULL;
  oi_engine *e = connect_kv(sock, "we\"ird\\ns\nname", &ad, &eo, &ia);
  static char body[1 << 20];
  CHECK(http_get(port, "/metrics", body, sizeof body) == 200);
  char want[128];
  snprintf(want, sizeof want, "openinfer_disk_capacity_bytes %u\n", 8u << 20);
  CHECK(strstr(body, want) != NULL);
  CHECK(strstr(body, "openinfer_disk_read_duration_seconds_count 0") != NULL);
  CHECK(strstr(body, "openinfer_disk_lost_unwritten_total 0\n") != NULL);
  CHECK(strstr(body, "openinfer_disk_lost_queue_full_total 0\n") != NULL);
  CHECK(strstr(body, "openinfer_disk_lost_write_failed_total 0\n") != NULL);
  CHECK(strstr(body, "openinfer_disk_lost_no_room_total 0\n") != NULL);
  CHECK(strstr(body, "openinfer_disk_full 0\n") != NULL);
  CHECK(strstr(body, "openinfer_disk_full_events_total 0\n") != NULL);
  CHECK(
      strstr(body, "openinfer_namespace_resident_blocks{namespace=\"we\\\"ird\\\\ns\\nname\"} 0") !=
      NULL);
  CHECK(strstr(body,
               "openinfer_namespace_bytes{namespace=\"we\\\"ird\\\\ns\\nname\",codec=\"none\","
               "kind=\"physical\"} 0\n") != NULL);
  /* 80 more namespaces: the exposition outgrows the renderer's first
   * 16 KiB buffer, and every namespace is in it. */
  for (int i = 0; i < 80; i++) {
    char name[32];
    snprintf(name, sizeof name, "metrics-ns-%02d", i);
    oi_engine_options e2 = eo;
    e2.namespace_id = name;
    oi_engine *x2 = NULL;
    oi_imported_arena *a2 = NULL;
    CHECK_OK(oi_engine_connect(sock, &e2, &x2, &a2));
    oi_imported_arena_close(a2);
    oi_engine_destroy(x2);
  }
  CHECK(http_get(port, "/metrics", body, sizeof body) == 200);
  CHECK(strlen(body) > 16384);
  for (int i = 0; i < 80; i++) {
    char line[96];
    snprintf(line, sizeof line,
             "openinfer_namespace_resident_blocks{namespace=\"metrics-ns-%02d\"} 0\n", i);
    CHECK(strstr(body, line) != NULL);
  }
  CHECK(strstr(body, "openinfer_instances_cleaned_up_total") != NULL); /* the last metric */
  /* The pool's device, the listed one and the instance's: all the cpu. */
  CHECK(http_get(port, "/healthz", body, sizeof body) == 200);
  CHECK(strstr(body, "3 device(s) answer") != NULL);
  CHECK(http_req(port, "POST", "/metrics", "Content-Length: 3\r\n\r\nabc", body, sizeof body) ==
        405);
  CHECK(strstr(body, "only GET and HEAD") != NULL);
  CHECK(http_req(port, "HEAD", "/healthz", "", body, sizeof body) == 200);
  CHECK(http_req(port, "GET", "/nope", "", body, sizeof body) == 404);
  CHECK(strstr(body, "try /metrics") != NULL);

  /* The port in use: BUSY at create; malformed addresses refused. */
  char addr[32];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
  char sock2[128];
  snprintf(sock2, sizeof sock2, "%s/s2", dir);
  oi_server_options s2;
  oi_server_options_init(&s2);
  s2.socket_path = sock2;
  s2.host = &ho;
  s2.metrics_addr = addr;
  oi_server *other = NULL;
  CHECK_ST(oi_server_create(&s2, &other), OI_ERR_BUSY);
  CHECK(other == NULL && strstr(oi_last_error(), "cannot listen on"));
  s2.metrics_addr = "::1:80";
  CHECK_ST(oi_server_create(&s2, &other), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "write an IPv6 address in brackets"));
  static const char *const bad_addrs[] = {"127.0.0.1:", "127.0.0.1:12a", "127.0.0.1:-1", "[::1]:"};
  for (size_t i = 0; i < sizeof bad_addrs / sizeof bad_addrs[0]; i++) {
    s2.metrics_addr = bad_addrs[i];
    CHECK_ST(oi_server_create(&s2, &other), OI_ERR_INVALID_ARGUMENT);
    CHECK(other == NULL && strstr(oi_last_error(), bad_addrs[i]));
  }
  s2.metrics_addr = "[::1]:0"; /* IPv6 loopback: served where the host has it */
  st = oi_server_create(&s2, &other);
  CHECK(st == OI_OK || st == OI_ERR_IO);
  if (st == OI_OK) {
    CHECK(oi_server_metrics_port(other) != 0);
    oi_server_destroy(other);
  }

  disconnect_and_stop(e, ia, srv, th);
  /* The disk tier's directory and files. */
  tu_remove_dir(disk_dir);
  CHECK(rmdir(dir) == 0);
}

/* ---- oi_server_fetch_stats ------------------------------------------------------- */

static void test_server_stats_fetch(void) {
  char dir[] = "/tmp/oi-obs-XXXXXX";
  char sock[128];
  scratch_dir(dir, sock, sizeof sock);
  char none[128]; /* where no server listens */
  snprintf(none, sizeof none, "%s/nothing", dir);
  oi_server_stats ss = {.struct_size = sizeof ss};
  oi_host_stats hs = {.struct_size = sizeof hs};
  CHECK_ST(oi_server_fetch_stats(sock, 0, NULL, NULL, NULL, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_server_fetch_stats(sock, 0, &ss, NULL, NULL, 4), OI_ERR_INVALID_ARGUMENT);
  oi_server_stats bad = {.struct_size = 0};
  CHECK_ST(oi_server_fetch_stats(sock, 0, &bad, NULL, NULL, 0), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_server_fetch_stats(none, 0, &ss, NULL, NULL, 0), OI_ERR_NOT_FOUND);

  oi_host_options ho;
  oi_server_options so = server_options(sock, &ho);
  oi_server *srv;
  REQUIRE(oi_server_create(&so, &srv) == OI_OK);
  pthread_t th = serve(srv);
  /* A namespace, so the list has an entry: one client engine, registered. */
  oi_engine_options eo;
  oi_arena_desc ad;
  oi_imported_arena *ia = NULL;
  oi_engine *e = connect_kv(sock, "fetch-ns", &ad, &eo, &ia);

  oi_host_namespace_stats ns[2];
  memset(ns, 0, sizeof ns);
  ns[0].struct_size = sizeof ns[0];
  CHECK_OK(oi_server_fetch_stats(sock, 5000, &ss, &hs, ns, 2));
  CHECK(ss.struct_size == sizeof ss);
  CHECK(ss.epoch == oi_server_epoch(srv));
  CHECK(strcmp(ss.server_version, oi_version_string()) == 0);
  CHECK(strcmp(ss.socket_path, sock) == 0);
  CHECK(ss.sessions >= 1 && ss.instances == 1 && ss.arena_bytes >= 4 * 256);
  CHECK(ss.uptime_ns > 0);
  CHECK(ss.namespaces == 1);
  CHECK(hs.capacity_bytes == 16 << 20 && hs.latency_buckets == OI_LATENCY_BUCKETS);
  CHECK(hs.namespaces == 1);
  CHECK(strcmp(ns[0].name, "fetch-ns") == 0 && ns[0].index == 0 && ns[0].block_bytes == 256);
  CHECK(ns[1].struct_size == 0); /* past the server's list: untouched */

  /* An older caller: smaller structs (the stride follows namespaces[0]). */
  struct {
    uint32_t struct_size, namespaces;
  } old = {.struct_size = sizeof old};
  struct {
    uint32_t struct_size, index;
    char name[256];
  } old_ns[1] = {{.struct_size = sizeof old_ns[0]}};
  CHECK_OK(oi_server_fetch_stats(sock, 5000, (oi_server_stats *)&old, NULL,
                                 (oi_host_namespace_stats *)old_ns, 1));
  CHECK(old.struct_size == sizeof old && old.namespaces == 1);
  CHECK(old_ns[0].struct_size == sizeof old_ns[0] && strcmp(old_ns[0].name, "fetch-ns") == 0);

  disconnect_and_stop(e, ia, srv, th);
  rmdir(dir);
}

/* ---- the read-rate estimates over the wire --------------------------------------- */

/* The value of the sample `line` ("name{labels}") in a /metrics body, or -1. */
static double metric_value(const char *body, const char *line) {
  char want[160];
  snprintf(want, sizeof want, "\n%s ", line);
  const char *p = strstr(body, want);
  return p ? strtod(p + strlen(want), NULL) : -1;
}

/* The six rate fields of a and b are equal. */
static bool rates_equal(const oi_host_stats *a, const oi_host_stats *b) {
  return a->link_bytes_per_s == b->link_bytes_per_s && a->disk_bytes_per_s == b->disk_bytes_per_s &&
         a->remote_bytes_per_s == b->remote_bytes_per_s && a->link_samples == b->link_samples &&
         a->disk_samples == b->disk_samples && a->remote_samples == b->remote_samples;
}

/* A server whose host is seeded with odd rates: oi_server_fetch_stats and
 * /metrics report the seeds and no samples; after a client loads 2 MiB
 * (one load, above the 1 MiB a sample needs), the link's estimate is that
 * load's rate and one sample, the same over the wire as the host's own
 * oi_host_get_stats, and /metrics says the same. */
static void test_server_rates(void) {
  const uint64_t LINK = 12345678901ull, DISK = 2345678901ull, REMOTE = 345678901ull;
  char dir[] = "/tmp/oi-obs-XXXXXX";
  char sock[128];
  scratch_dir(dir, sock, sizeof sock);
  oi_host_options ho;
  oi_server_options so = server_options(sock, &ho);
  ho.link_bytes_per_s = LINK;
  ho.disk_bytes_per_s = DISK;
  ho.remote_bytes_per_s = REMOTE;
  so.metrics_addr = "127.0.0.1:0";
  oi_server *srv;
  oi_status st = oi_server_create(&so, &srv);
  bool http = st == OI_OK;
  if (st == OI_ERR_UNSUPPORTED) { /* a build without libmicrohttpd: the wire only */
    so.metrics_addr = NULL;
    st = oi_server_create(&so, &srv);
  }
  REQUIRE(st == OI_OK);
  pthread_t th = serve(srv);
  enum { BLOCKS = 4, BLOCK_BYTES = 512 << 10 };
  oi_arena_desc ad = tr_arena("kv", NULL, 2 * BLOCKS, BLOCK_BYTES);
  oi_engine_options eo = tr_engine_options("rates-ns", &ad, 1);
  oi_engine *e = NULL;
  oi_imported_arena *ia = NULL;
  st = OI_ERR_NOT_FOUND;
  for (int i = 0; i < 500 && st == OI_ERR_NOT_FOUND; i++) {
    st = oi_engine_connect(sock, &eo, &e, &ia);
    if (st == OI_ERR_NOT_FOUND) usleep(10000);
  }
  REQUIRE(st == OI_OK);

  oi_server_stats ss = {.struct_size = sizeof ss};
  oi_host_stats hs = {.struct_size = sizeof hs}, own = {.struct_size = sizeof own};
  CHECK_OK(oi_server_fetch_stats(sock, 5000, &ss, &hs, NULL, 0));
  CHECK(hs.link_bytes_per_s == LINK && hs.disk_bytes_per_s == DISK &&
        hs.remote_bytes_per_s == REMOTE);
  CHECK(hs.link_samples == 0 && hs.disk_samples == 0 && hs.remote_samples == 0);
  static char body[1 << 20];
  if (http) {
    uint16_t port = oi_server_metrics_port(srv);
    CHECK(http_get(port, "/metrics", body, sizeof body) == 200);
    CHECK(metric_value(body, "openinfer_read_rate_bytes_per_second{path=\"link\"}") == LINK);
    CHECK(metric_value(body, "openinfer_read_rate_bytes_per_second{path=\"disk\"}") == DISK);
    CHECK(metric_value(body, "openinfer_read_rate_bytes_per_second{path=\"remote\"}") == REMOTE);
    CHECK(metric_value(body, "openinfer_read_rate_samples_total{path=\"link\"}") == 0);
    CHECK(strstr(body, "# TYPE openinfer_read_rate_samples_total counter\n") != NULL);
  }

  /* Blocks 0..3 saved, then loaded into blocks 4..7: 2 MiB in one load. */
  uint8_t *kv = oi_imported_arena_ptr(ia);
  for (size_t i = 0; i < (size_t)BLOCKS * BLOCK_BYTES; i++)
    kv[i] = (uint8_t)(i * 13 + 1);
  int64_t ids[BLOCKS], dst[BLOCKS];
  oi_block_hash hashes[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    ids[i] = i;
    dst[i] = BLOCKS + i;
    memset(&hashes[i], 0, sizeof hashes[i]);
    hashes[i].bytes[0] = 0x5a;
    hashes[i].bytes[15] = (uint8_t)(i + 1);
  }
  CHECK_OK(tr_save(e, ids, hashes, BLOCKS, 30000));
  CHECK_OK(oi_engine_flush(e, 30000));
  oi_query_result qr;
  CHECK_OK(tr_query(e, "rates", hashes, BLOCKS, 0, NULL, &qr));
  CHECK(qr.hit_blocks == BLOCKS);
  CHECK_OK(tr_load(e, qr.lease, dst, BLOCKS, 30000));
  CHECK(memcmp(kv + (size_t)BLOCKS * BLOCK_BYTES, kv, (size_t)BLOCKS * BLOCK_BYTES) == 0);

  CHECK_OK(oi_server_fetch_stats(sock, 5000, &ss, &hs, NULL, 0));
  CHECK_OK(oi_host_get_stats(srv->host, &own));
  CHECK(hs.link_samples == 1);
  CHECK(hs.link_bytes_per_s > 0 && hs.link_bytes_per_s != LINK); /* the load's rate */
  CHECK(hs.disk_bytes_per_s == DISK && hs.remote_bytes_per_s == REMOTE);
  CHECK(rates_equal(&hs, &own));
  if (http) {
    uint16_t port = oi_server_metrics_port(srv);
    CHECK(http_get(port, "/metrics", body, sizeof body) == 200);
    CHECK(metric_value(body, "openinfer_read_rate_bytes_per_second{path=\"link\"}") ==
          (double)own.link_bytes_per_s);
    CHECK(metric_value(body, "openinfer_read_rate_samples_total{path=\"link\"}") == 1);
    CHECK(metric_value(body, "openinfer_read_rate_samples_total{path=\"disk\"}") == 0);
  }

  /* An old caller's oi_host_stats (its 0.1 layout) gets no rates, and no
   * bytes past its struct_size. */
  struct {
    oi_host_stats s;
    uint8_t guard[64];
  } old;
  memset(&old, 0xee, sizeof old);
  old.s.struct_size = (uint32_t)OI_FLOOR_HOST_STATS;
  CHECK_OK(oi_server_fetch_stats(sock, 5000, &ss, &old.s, NULL, 0));
  CHECK(old.s.capacity_bytes == 16 << 20);
  const uint8_t *tail = (const uint8_t *)&old.s + OI_FLOOR_HOST_STATS;
  bool untouched = true;
  for (size_t i = 0; i < sizeof old - OI_FLOOR_HOST_STATS; i++)
    untouched = untouched && tail[i] == 0xee;
  CHECK(untouched);

  disconnect_and_stop(e, ia, srv, th);
  CHECK(rmdir(dir) == 0);
}

/* ---- embedded stats ------------------------------------------------------------- */

typedef struct progress_log {
  int calls;
  uint64_t first_done, last_done, total;
} progress_log;

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
  progress_log *p = ctx;
  if (p->calls++ == 0) p->first_done = done;
  p->last_done = done;
  p->total = total;
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_lines[64][1024];
static int nlog;

static void capture(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  (void)level;
  pthread_mutex_lock(&log_lock);
  if (nlog < 64) snprintf(log_lines[nlog++], sizeof log_lines[0], "%s", line);
  pthread_mutex_unlock(&log_lock);
}

#define NB 16
#define BB 1024

static void test_embedded_stats(void) {
  oi_set_log_handler(capture, NULL);
  oi_set_log_level(OI_LOG_INFO);
  progress_log prog = {0};
  oi_host_options ho = tr_host_options(4 << 20);
  ho.flags = OI_HOST_NO_PIN;
  ho.progress = on_progress;
  ho.progress_ctx = &prog;
  oi_host *h = tr_host_new(&ho);
  CHECK(prog.calls >= 2 && prog.first_done == 0 && prog.last_done == prog.total &&
        prog.total == 4 << 20);

  static uint8_t kv[NB * BB];
  for (size_t i = 0; i < sizeof kv; i++)
    kv[i] = (uint8_t)i;
  oi_arena_desc a = tr_arena("kv", kv, NB, BB);
  oi_engine *e = tr_engine(h, "ns-a", &a, 1);

  int64_t ids[NB];
  oi_block_hash hs[NB];
  for (int i = 0; i < NB; i++) {
    ids[i] = i;
    hs[i] = tr_hash(0, 0, (uint8_t)(i + 1)); /* zeros but byte 0 */
  }
  CHECK_OK(tr_save(e, ids, hs, 8, 10000));
  oi_query_result qr = {.struct_size = sizeof qr};
  CHECK_OK(oi_engine_query(e, NULL, hs, 10, 0, &qr));
  CHECK(qr.hit_blocks == 8);

  oi_host_stats s = tr_host_stats(h);
  CHECK(s.blocks_pinned == 8 && s.blocks_leased == 8);
  CHECK(s.namespaces == 1 && s.latency_buckets == OI_LATENCY_BUCKETS);
  CHECK(s.pool_setup_ns > 0);
  uint64_t nsave = 0;
  for (int i = 0; i < OI_LATENCY_BUCKETS; i++)
    nsave += s.save_latency_us[i];
  CHECK(nsave == 1);

  int64_t dst[8] = {8, 9, 10, 11, 12, 13, 14, 15};
  CHECK_OK(tr_load(e, qr.lease, dst, 8, 10000));
  CHECK(memcmp(kv + 8 * BB, kv, 8 * BB) == 0);
  s = tr_host_stats(h);
  CHECK(s.blocks_pinned == 0 && s.blocks_loading == 0 && s.blocks_leased == 0);
  CHECK(s.loads_submitted == 1 && s.loads_completed == 1 && s.blocks_loaded == 8);
  uint64_t nload = 0;
  for (int i = 0; i < OI_LATENCY_BUCKETS; i++)
    nload += s.load_latency_us[i];
  CHECK(nload == 1);

  oi_host_namespace_stats ns;
  memset(&ns, 0, sizeof ns);
  ns.struct_size = sizeof ns;
  CHECK_OK(oi_host_get_namespace_stats(h, 0, &ns));
  CHECK(!strcmp(ns.name, "ns-a") && ns.blocks_resident == 8 && ns.block_bytes == BB);
  CHECK_ST(oi_host_get_namespace_stats(h, 1, &ns), OI_ERR_NOT_FOUND);

  /* A struct smaller than the 0.1 layout (a caller built before the fields
   * were put in their place) is refused, and nothing is written. */
  oi_host_stats old;
  memset(&old, 0xab, sizeof old);
  old.struct_size = (uint32_t)offsetof(oi_host_stats, latency_buckets);
  CHECK_ST(oi_host_get_stats(h, &old), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "rebuild") != NULL);
  CHECK(old.saves_completed == 0xababababababababull);
  oi_clear_error();
  oi_engine_stats es = tr_engine_stats(e);
  CHECK(es.loads_submitted == 1 && es.namespace_blocks_resident == 8);
  CHECK(es.save_latency_sum_us == s.save_latency_sum_us);

  /* Evicting drops the namespace's resident count. */
  uint64_t evicted = 0;
  CHECK_OK(oi_host_evict_all(h, &evicted));
  CHECK(evicted == 8);
  CHECK_OK(oi_host_get_namespace_stats(h, 0, &ns));
  CHECK(ns.blocks_resident == 0);

  uint32_t inst = es.instance_id;
  oi_engine_destroy(e);
  oi_host_destroy(h);
  oi_set_log_handler(NULL, NULL);
  oi_set_log_level(OI_LOG_WARN);
  char want[64];
  snprintf(want, sizeof want, "level=info component=engine instance=%u msg=\"registered", inst);
  bool found = false;
  for (int i = 0; i < nlog; i++)
    found |= strncmp(log_lines[i], want, strlen(want)) == 0;
  CHECK(found);
}

static void test_histogram_buckets(void) {
  CHECK(oi__latency_bucket(0) == 0 && oi__latency_bucket(1) == 0);
  CHECK(oi__latency_bucket(2) == 1 && oi__latency_bucket(3) == 2 && oi__latency_bucket(4) == 2);
  CHECK(oi__latency_bucket(1000) == 10 && oi__latency_bucket(1024) == 10);
  CHECK(oi__latency_bucket(1ull << 26) == 26);
  CHECK(oi__latency_bucket((1ull << 26) + 1) == OI_LATENCY_BUCKETS - 1);
  CHECK(oi__latency_bucket(UINT64_MAX) == OI_LATENCY_BUCKETS - 1);
}

int main(void) {
  RUN_TEST(test_histogram_buckets);
  RUN_TEST(test_embedded_stats);
  RUN_TEST(test_server_health);
  RUN_TEST(test_server_metrics_details);
  RUN_TEST(test_server_stats_fetch);
  RUN_TEST(test_server_rates);
  TEST_EXIT();
}
