/* `openinfer info`: what this machine offers the library, in one screen:
 * the library and its backends, the GPUs (public API), host memory and the
 * locked-memory limit (what a pinned pool may take), and the RDMA devices
 * the cluster tier's transfers could use, listed through libibverbs
 * directly: each device's ports and link state, and whether GPUDirect RDMA
 * is possible (nvidia-peermem loaded, or dma-buf: the NVIDIA open kernel
 * module and libibverbs' ibv_reg_dmabuf_mr). It says plainly when there is
 * none. --json prints the same as one JSON object. */
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
  struct ibv_device **list = ibv_get_device_list(&nib);

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
    printf(",\"nvidia_module\":%s%s%s,\"nvidia_peermem\":%s,\"dmabuf\":%s,\"rdma_devices\":[",
           nv ? "\"" : "", nv ? nv : "null", nv ? "\"" : "", peermem ? "true" : "false",
           dmabuf ? "true" : "false");
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
    struct ibv_context *ctx = ibv_open_device(list[d]);
    const char *name = ibv_get_device_name(list[d]);
    struct ibv_device_attr attr;
    bool have_attr = ctx && ibv_query_device(ctx, &attr) == 0;
    if (json)
      printf("%s{\"name\":\"%s\",\"ports\":[", shown ? "," : "", name ? name : "?");
    else
      printf("%s  %s%s\n", shown ? "" : "\n", name ? name : "?", ctx ? "" : " (cannot open it)");
    shown++;
    for (int p = 1; have_attr && p <= attr.phys_port_cnt; p++) {
      struct ibv_port_attr pa;
      if (ibv_query_port(ctx, (uint8_t)p, &pa) != 0) continue;
      if (json)
        printf("%s{\"port\":%d,\"state\":\"%s\",\"link_layer\":\"%s\"}", p > 1 ? "," : "", p,
               port_state(pa.state), link_layer(pa.link_layer));
      else
        printf("    port %d: %s, %s\n", p, port_state(pa.state), link_layer(pa.link_layer));
    }
    if (json) printf("]}");
    if (ctx) ibv_close_device(ctx);
  }
  if (list) ibv_free_device_list(list);
  if (json) {
    printf("]}\n");
    return CLI_OK;
  }
  if (!shown)
    printf("none. The cluster tier's transfers run over TCP (UCX picks RDMA verbs only where an "
           "HCA is present).\n");
  printf("GPUDirect RDMA: %s\n",
         peermem  ? "nvidia-peermem is loaded"
         : dmabuf ? "possible through dma-buf (the NVIDIA open kernel module; libibverbs has "
                    "ibv_reg_dmabuf_mr)"
         : nv     ? "no (nvidia-peermem is not loaded and the NVIDIA kernel module is not the open "
                    "one, which dma-buf needs)"
                  : "no (no NVIDIA driver)");
  return CLI_OK;
}
