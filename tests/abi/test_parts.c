/* The optional parts of libopeninfer.so (meson_options.txt: disk, cluster,
 * server, executor), through the shared library as a caller sees it. In a
 * build where a part is disabled, each of its public functions still exists
 * and returns OI_ERR_UNSUPPORTED with oi_last_error() naming the function
 * and the build option ("oi_host_attach_disk: built without the
 * disk tier (-Ddisk=disabled)"); the accessors answer as for NULL. In a
 * build where it is enabled, the same calls do not answer UNSUPPORTED. The
 * host and its embedded engine work either way (the round-trip test).
 *
 * Built with -DHAVE_DISK=0|1, -DHAVE_CLUSTER=, -DHAVE_SERVER=,
 * -DHAVE_EXECUTOR= from the build's options. Exit 0 pass, 1 fail. */
#include <stdio.h>
#include <string.h>

#include "openinfer/openinfer.h"

static int failures;

/* One call's answer: in a build without the part, UNSUPPORTED naming `fn`
 * and `option`; with it, anything but UNSUPPORTED. */
static void check(const char *fn, oi_status st, int built, const char *option) {
  const char *msg = oi_last_error();
  if (built) {
    if (st == OI_ERR_UNSUPPORTED) {
      printf("FAIL: %s answers UNSUPPORTED in a build with its part: %s\n", fn, msg);
      failures++;
    }
    return;
  }
  char want[128];
  snprintf(want, sizeof want, "%s: built without the ", fn);
  if (st != OI_ERR_UNSUPPORTED || strncmp(msg, want, strlen(want)) != 0 || !strstr(msg, option)) {
    printf("FAIL: %s: %s \"%s\", want OI_ERR_UNSUPPORTED \"%s... (%s)\"\n", fn, oi_status_str(st),
           msg, want, option);
    failures++;
    return;
  }
  printf("ok   %s: %s\n", fn, msg);
}

static oi_host *make_host(void) {
  oi_host_options o;
  oi_host_options_init(&o);
  o.pool_bytes = 8u << 20;
  o.device = -1;
  oi_host *h = NULL;
  if (oi_host_create(&o, &h) != OI_OK) {
    printf("FAIL: oi_host_create: %s\n", oi_last_error());
    failures++;
  }
  return h;
}

static void disk(oi_host *h) {
  const char *opt = "(-Ddisk=disabled)";
  oi_host_disk_options o;
  memset(&o, 0, sizeof o);
  check("oi_host_disk_options_init", oi_host_disk_options_init(&o), HAVE_DISK, opt);
  if (!HAVE_DISK) check("oi_host_attach_disk", oi_host_attach_disk(h, &o), 0, opt);
  if (!HAVE_DISK) check("oi_host_disk_options_check", oi_host_disk_options_check(&o), 0, opt);
  oi_host_disk_stats s = {.struct_size = sizeof s};
  check("oi_host_get_disk_stats", oi_host_get_disk_stats(h, &s), HAVE_DISK, opt);
}

static void cluster(oi_host *h) {
  const char *opt = "(-Dcluster=disabled)";
  oi_host_cluster_options o;
  memset(&o, 0, sizeof o);
  check("oi_host_cluster_options_init", oi_host_cluster_options_init(&o), HAVE_CLUSTER, opt);
  if (!HAVE_CLUSTER) {
    check("oi_host_cluster_options_check", oi_host_cluster_options_check(&o), 0, opt);
    check("oi_host_attach_cluster", oi_host_attach_cluster(h, &o), 0, opt);
  }
  oi_host_cluster_stats s = {.struct_size = sizeof s};
  check("oi_host_get_cluster_stats", oi_host_get_cluster_stats(h, &s), HAVE_CLUSTER, opt);
}

static void server(void) {
  const char *opt = "(-Dserver=disabled)";
  oi_server_options o;
  memset(&o, 0, sizeof o);
  check("oi_server_options_init", oi_server_options_init(&o), HAVE_SERVER, opt);
  if (HAVE_SERVER) return;
  oi_server *s = (oi_server *)1;
  check("oi_server_create", oi_server_create(&o, &s), 0, opt);
  if (s != NULL) {
    printf("FAIL: oi_server_create left *out set\n");
    failures++;
  }
  check("oi_server_run", oi_server_run(NULL), 0, opt);
  check("oi_server_stop", oi_server_stop(NULL), 0, opt);
  check("oi_server_attach_cluster", oi_server_attach_cluster(NULL, NULL), 0, opt);
  if (oi_server_epoch(NULL) != 0 || oi_server_socket_path(NULL) != NULL ||
      oi_server_metrics_port(NULL) != 0) {
    printf("FAIL: a server's accessors answer other than for NULL\n");
    failures++;
  }
  oi_server_destroy(NULL);
}

static void executor(void) {
  const char *opt = "(-Dexecutor=disabled)";
  oi_executor_options o;
  memset(&o, 0, sizeof o);
  check("oi_executor_options_init", oi_executor_options_init(&o), HAVE_EXECUTOR, opt);
  oi_request r;
  memset(&r, 0, sizeof r);
  check("oi_request_init", oi_request_init(&r), HAVE_EXECUTOR, opt);
  if (HAVE_EXECUTOR) return;
  oi_executor *x = (oi_executor *)1;
  check("oi_executor_create", oi_executor_create(&o, &x), 0, opt);
  if (x != NULL) {
    printf("FAIL: oi_executor_create left *out set\n");
    failures++;
  }
  uint64_t id = 0;
  uint32_t finished = 0;
  size_t n = 0;
  oi_request_result res;
  oi_executor_stats stats;
  oi_kv_layout kv;
  check("oi_executor_submit", oi_executor_submit(NULL, &r, &id), 0, opt);
  check("oi_executor_step", oi_executor_step(NULL, &finished), 0, opt);
  check("oi_executor_run_until_idle", oi_executor_run_until_idle(NULL), 0, opt);
  check("oi_executor_get_result", oi_executor_get_result(NULL, 1, &res), 0, opt);
  check("oi_executor_flush", oi_executor_flush(NULL, 0), 0, opt);
  check("oi_executor_evict_gpu_cache", oi_executor_evict_gpu_cache(NULL, &id), 0, opt);
  check("oi_executor_get_stats", oi_executor_get_stats(NULL, &stats), 0, opt);
  check("oi_executor_get_kv_layout", oi_executor_get_kv_layout(NULL, 0, &kv), 0, opt);
  check("oi_executor_request_blocks", oi_executor_request_blocks(NULL, 1, NULL, 0, &n), 0, opt);
  oi_executor_destroy(NULL);
}

int main(void) {
  printf("parts built: disk %d, cluster %d, server %d, executor %d\n", HAVE_DISK, HAVE_CLUSTER,
         HAVE_SERVER, HAVE_EXECUTOR);
  oi_host *h = make_host();
  if (h) {
    disk(h);
    cluster(h);
    oi_host_destroy(h);
  }
  server();
  executor();
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("all parts answer as built\n");
  return 0;
}
