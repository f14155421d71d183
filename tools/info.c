/* `openinfer info`: what this machine offers the library, in one screen:
 * the library and its backends, the GPUs (public API), host memory and the
 * locked-memory limit (what a pinned pool may take), and the RDMA devices
 * the cluster tier's transfers could use, listed through libibverbs
 * directly: each device's ports and link state, and whether GPUDirect RDMA
 * is possible (nvidia-peermem loaded, or dma-buf: the NVIDIA open kernel
 * module and libibverbs' ibv_reg_dmabuf_mr). It says plainly when there is
 * none. --json prints the same as one JSON object.
 *
 * libibverbs is loaded with dlopen when `info` runs, as the cluster tier
 * loads UCX (lib/cluster/ucx.h): the command starts on machines without
 * rdma-core, and it always uses the machine's own libibverbs, which finds
 * the machine's RDMA providers (a copy carried elsewhere, as in a wheel,
 * would look for them where its build machine keeps them). The header only
 * gives the types. */
#include <dlfcn.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "openinfer/openinfer.h"

static bool path_exists(const char *p) { return access(p, F_OK) == 0; }

/* The NVIDIA kernel module's kind: "open", "proprietary" or NULL (none). */
static const char *nvidia_module_kind(void) {
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  if (!f) return NULL;
  char line[512] = "";
  const char *kind = "proprietary";
  while (fgets(line, sizeof line, f))
    if (strstr(line, "Open Kernel Module")) kind = "open";
  fclose(f);
  return kind;
}

static const char *port_state(enum ibv_port_state s) {
  switch (s) {
  case IBV_PORT_DOWN: return "down";
  case IBV_PORT_INIT: return "init";
  case IBV_PORT_ARMED: return "armed";
  case IBV_PORT_ACTIVE: return "active";
  case IBV_PORT_ACTIVE_DEFER: return "active (defer)";
  default: return "unknown";
  }
}

static const char *link_layer(uint8_t l) {
  switch (l) {
  case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
  case IBV_LINK_LAYER_ETHERNET: return "Ethernet (RoCE)";
  default: return "unspecified";
  }
}

/* The libibverbs calls `info` makes, from dlopen. */
struct verbs_fns {
  void *handle;
  struct ibv_device **(*get_device_list)(int *num);
  void (*free_device_list)(struct ibv_device **list);
  struct ibv_context *(*open_device)(struct ibv_device *dev);
  int (*close_device)(struct ibv_context *ctx);
  const char *(*get_device_name)(struct ibv_device *dev);
  int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
  int (*query_port)(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr);
};

/* Loads libibverbs.so.1; NULL, or why it could not (into why). */
static const char *load_verbs(struct verbs_fns *v, char *why, size_t cap) {
  memset(v, 0, sizeof *v);
  v->handle = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!v->handle) {
    const char *e = dlerror();
    snprintf(why, cap, "libibverbs.so.1 could not be loaded (rdma-core is not installed?): %s",
             e ? e : "?");
    return why;
  }
  static const char *const names[] = {
      "ibv_get_device_list", "ibv_free_device_list", "ibv_open_device", "ibv_close_device",
      "ibv_get_device_name", "ibv_query_device",     "ibv_query_port"};
  void *f[7];
  for (int i = 0; i < 7; i++) {
    f[i] = dlsym(v->handle, names[i]);
    if (!f[i]) {
      snprintf(why, cap, "libibverbs.so.1 has no %s", names[i]);
      dlclose(v->handle);
      v->handle = NULL;
      return why;
    }
  }
  /* (POSIX: a data pointer from dlsym converts to a function pointer) */
  memcpy(&v->get_device_list, &f[0], sizeof f[0]);
  memcpy(&v->free_device_list, &f[1], sizeof f[1]);
  memcpy(&v->open_device, &f[2], sizeof f[2]);
  memcpy(&v->close_device, &f[3], sizeof f[3]);
  memcpy(&v->get_device_name, &f[4], sizeof f[4]);
  memcpy(&v->query_device, &f[5], sizeof f[5]);
  memcpy(&v->query_port, &f[6], sizeof f[6]);
  return NULL;
}

/* verbs.h's ibv_query_port, which is inline: the context's own op when the
 * provider has one, else the exported compatibility call. */
static int verbs_query_port(const struct verbs_fns *v, struct ibv_context *ctx, uint8_t port,
                            struct ibv_port_attr *pa) {
  struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx) return vctx->query_port(ctx, port, pa, sizeof *pa);
  memset(pa, 0, sizeof *pa);
  return v->query_port(ctx, port, (struct _compat_ibv_port_attr *)pa);
}

static void usage(FILE *f) {
  fprintf(f, "usage: openinfer info [--json]\n"
             "\n"
             "What this machine offers libopeninfer: the library and its backends, the GPUs, host\n"
             "memory and the locked-memory limit (a pinned pool's ceiling), and the RDMA devices\n"
             "the cluster tier could use (through libibverbs: ports, link state, GPUDirect RDMA\n"
             "by nvidia-peermem or dma-buf). Exits 0 whatever it finds.\n");
}

int cmd_info(int argc, char **argv) {
  static const struct option lo[] = {
      {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  bool json = false;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    if (c == 'j')
      json = true;
    else if (c == 'h') {
      usage(stdout);
      return CLI_OK;
    } else {
      usage(stderr);
      return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer info: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }

  /* GPUs */
  int ndev = 0;
  if (oi_device_count(&ndev) != OI_OK) ndev = 0;
  /* host memory and the locked-memory limit */
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double mem_gib = pages > 0 && page > 0 ? (double)pages * (double)page / (1 << 30) : 0;
  struct rlimit ml;
  bool ml_ok = getrlimit(RLIMIT_MEMLOCK, &ml) == 0;
  bool ml_unlimited = ml_ok && ml.rlim_cur == RLIM_INFINITY;
  double ml_gib = ml_ok && !ml_unlimited ? (double)ml.rlim_cur / (1 << 30) : 0;
  /* GPUDirect RDMA */
  bool peermem = path_exists("/sys/module/nvidia_peermem");
  const char *nv = nvidia_module_kind();
  bool dmabuf = nv && !strcmp(nv, "open"); /* libibverbs here has ibv_reg_dmabuf_mr */

  int nib = 0;
  struct verbs_fns vf;
  char verbs_why[512];
  const char *verbs_err = load_verbs(&vf, verbs_why, sizeof verbs_why);
  struct ibv_device **list = verbs_err ? NULL : vf.get_device_list(&nib);

  if (json)
    printf("{\"version\":\"%s\",\"gpus\":[", oi_version_string());
  else
    printf("libopeninfer %s\n\nGPUs: %s\n", oi_version_string(),
           ndev ? "" : "none (the cpu backend serves; a GPU needs the CUDA backend and a driver)");
  for (int i = 0; i < ndev; i++) {
    oi_device_info di = {.struct_size = sizeof di};
    if (oi_device_get_info(i, &di) != OI_OK) continue;
    if (json)
      printf("%s{\"index\":%d,\"name\":\"%s\",\"memory_bytes\":%llu,\"pci\":\"%s\",\"numa\":%d}",
             i ? "," : "", i, di.name, (unsigned long long)di.total_memory, di.pci_bus_id,
             di.numa_node);
    else
      printf("  %d  %s, %.1f GiB, PCI %s, NUMA node %d\n", i, di.name,
             (double)di.total_memory / (1 << 30), di.pci_bus_id, di.numa_node);
  }
  if (json) {
    printf("],\"host_memory_gib\":%.1f,\"memlock_limit_gib\":", mem_gib);
    if (ml_unlimited)
      printf("null");
    else
      printf("%.3f", ml_gib);
    printf(",\"nvidia_module\":%s%s%s,\"nvidia_peermem\":%s,\"dmabuf\":%s,\"libibverbs\":%s,"
           "\"rdma_devices\":[",
           nv ? "\"" : "", nv ? nv : "null", nv ? "\"" : "", peermem ? "true" : "false",
           dmabuf ? "true" : "false", verbs_err ? "false" : "true");
  } else {
    printf("\nhost memory: %.1f GiB; locked-memory limit: ", mem_gib);
    if (ml_unlimited)
      printf("unlimited\n");
    else if (geteuid() == 0)
      printf("%.3f GiB (not enforced: running as root)\n", ml_gib);
    else
      printf("%.3f GiB (a pinned pool larger than this fails: raise it, or --no-pin)\n", ml_gib);
    printf("\nRDMA devices (libibverbs): ");
  }
  int shown = 0;
  for (int d = 0; list && d < nib; d++) {
    struct ibv_context *ctx = vf.open_device(list[d]);
    const char *name = vf.get_device_name(list[d]);
    struct ibv_device_attr attr;
    bool have_attr = ctx && vf.query_device(ctx, &attr) == 0;
    if (json)
      printf("%s{\"name\":\"%s\",\"ports\":[", shown ? "," : "", name ? name : "?");
    else
      printf("%s  %s%s\n", shown ? "" : "\n", name ? name : "?", ctx ? "" : " (cannot open it)");
    shown++;
    for (int p = 1; have_attr && p <= attr.phys_port_cnt; p++) {
      struct ibv_port_attr pa;
      if (verbs_query_port(&vf, ctx, (uint8_t)p, &pa) != 0) continue;
      if (json)
        printf("%s{\"port\":%d,\"state\":\"%s\",\"link_layer\":\"%s\"}", p > 1 ? "," : "", p,
               port_state(pa.state), link_layer(pa.link_layer));
      else
        printf("    port %d: %s, %s\n", p, port_state(pa.state), link_layer(pa.link_layer));
    }
    if (json) printf("]}");
    if (ctx) vf.close_device(ctx);
  }
  if (list) vf.free_device_list(list);
  if (vf.handle) dlclose(vf.handle);
  if (json) {
    printf("]}\n");
    return CLI_OK;
  }
  if (!shown)
    printf("none. The cluster tier's transfers run over TCP (UCX picks RDMA verbs only where an "
           "HCA is present).\n");
  if (verbs_err) printf("  (%s)\n", verbs_err);
  printf("GPUDirect RDMA: %s\n",
         peermem  ? "nvidia-peermem is loaded"
         : dmabuf ? "possible through dma-buf (the NVIDIA open kernel module; libibverbs has "
                    "ibv_reg_dmabuf_mr)"
         : nv     ? "no (nvidia-peermem is not loaded and the NVIDIA kernel module is not the open "
                    "one, which dma-buf needs)"
                  : "no (no NVIDIA driver)");
  return CLI_OK;
}
