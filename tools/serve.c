/* `openinfer serve`: runs the sidecar server (oi_server) until SIGTERM or
 * SIGINT. Prints one line on stderr once it accepts connections:
 *   openinfer serve: listening on PATH (pool X GiB, epoch Y)
 * so scripts and tests can wait for it. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "openinfer/openinfer.h"

#define MAX_IDS 64
/* The metrics endpoint when no --metrics-addr is given: loopback only. */
#define DEFAULT_METRICS_ADDR "127.0.0.1:9464"

static oi_server *volatile g_server;

static void on_signal(int sig) {
  (void)sig;
  oi_server *s = g_server;
  if (s) oi_server_stop(s);
}

static void serve_usage(FILE *f) {
  fprintf(
      f,
      "usage: openinfer serve [options]\n"
      "\n"
      "Runs the sidecar server: owns the host tier (pinned pool) and allocates each\n"
      "client's KV arena. Stops cleanly on SIGTERM or SIGINT.\n"
      "\n"
      "options:\n"
      "  --socket PATH       Unix socket to listen on (default $XDG_RUNTIME_DIR/openinfer.sock,\n"
      "                      or /tmp/openinfer-$UID.sock)\n"
      "  --socket-mode MODE  permission bits of the socket, octal (default 0600)\n"
      "  --allow-uid UID     also accept peers with this uid (repeatable; the server's\n"
      "                      own uid is always accepted)\n"
      "  --allow-gid GID     also accept peers whose primary gid is this (repeatable)\n"
      "  --pool SIZE         host pool size, e.g. 64G (default 1G)\n"
      "  --disk DIR[,DIR]    a disk tier under the pool: one preallocated file per\n"
      "                      directory (owned by this user, mode 0700); blocks are\n"
      "                      written behind and promoted back on a hit, and survive\n"
      "                      a restart (docs/disk.md). With --disk-size\n"
      "  --disk-size SIZE    disk tier capacity, all directories together (e.g. 500G)\n"
      "  --cluster URL       join a cluster (docs/cluster.md): publish this node's blocks\n"
      "                      in the Redis directory at URL (redis://HOST:PORT, or a\n"
      "                      Redis Cluster: redis+cluster://HOST:PORT[,HOST:PORT...];\n"
      "                      rediss:// and rediss+cluster:// over TLS)\n"
      "                      and fetch what other nodes hold. With --node-id and\n"
      "                      --cluster-secret\n"
      "  --node-id ID        this node's id in the cluster ([A-Za-z0-9._-], at most 64)\n"
      "  --cluster-secret F  file with the cluster's shared secret (16..1024 bytes, mode 0600)\n"
      "  --cluster-name NAME the cluster's name: its directory keys start oi:NAME: (default\n"
      "                      oi:); clusters that share a Redis need different names\n"
      "  --redis-auth-file F Redis AUTH: a file (mode 0600) of lines user=NAME (optional)\n"
      "                      and password=SECRET (default: OI_REDIS_USER and\n"
      "                      OI_REDIS_PASSWORD from the environment, if set)\n"
      "  --redis-tls-ca F    TLS to Redis (rediss://): the CA file (PEM) that signs its\n"
      "                      certificate (default: the system's trusted CAs)\n"
      "  --redis-tls-cert F  this node's certificate (PEM), for a Redis that asks\n"
      "                      clients for one; with --redis-tls-key F (mode 0600)\n"
      "  --listen IP:PORT    where peers connect, with --cluster (required): an address\n"
      "                      of this host the other nodes reach (port 0: a free one;\n"
      "                      127.0.0.1:PORT only for a cluster on this host)\n"
      "  --advertise IP:PORT the address peers dial (default: --listen's, bound port)\n"
      "  --hugepages         back the pool with 2 MiB hugepages\n"
      "  --no-pin            pageable pool memory (no pinning)\n"
      "  --device N|cpu      device the pool is mapped for (default cpu)\n"
      "  --arena-devices L   devices clients may register arenas on, comma separated\n"
      "                      (e.g. cpu,0,1; default: any)\n"
      "  --max-sessions N    concurrent client connections (default 256)\n"
      "  --handshake-timeout MS  close a connection that sends no Hello within MS\n"
      "                      milliseconds (default 10000; 'none': never)\n"
      "  --log-level LEVEL   trace|debug|info|warn|error|off (default info)\n"
      "  --metrics-addr A    serve /metrics (Prometheus) and /healthz on HOST:PORT\n"
      "                      (PORT alone: 127.0.0.1; port 0: a free one). Default\n"
      "                      " DEFAULT_METRICS_ADDR ", skipped with a warning if busy\n"
      "  --no-metrics        no HTTP endpoint\n"
      "  -h, --help          this text\n");
}

static bool parse_device(const char *s, int32_t *out) {
  if (!strcmp(s, "cpu")) {
    *out = OI_DEVICE_CPU;
    return true;
  }
  long v;
  if (!cli_parse_int(s, -1, 1024, &v)) return false;
  *out = (int32_t)v;
  return true;
}

/* Pool setup progress: a bar on a terminal, a line every 2 s otherwise. */
typedef struct progress_state {
  bool tty, drawn, no_pin;
  uint64_t t0, last;
} progress_state;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
  progress_state *p = ctx;
  uint64_t now = now_ns();
  if (done == 0 && !p->t0) {
    p->t0 = p->last = now;
    return;
  }
  double gib = (double)(1ull << 30), secs = (double)(now - p->t0) / 1e9;
  double frac = total ? (double)done / (double)total : 1.0;
  double rate = secs > 0 ? (double)done / secs / 1e9 : 0.0;
  if (done >= total) {
    if (p->tty && p->drawn) fprintf(stderr, "\r\033[K");
    fprintf(stderr, "openinfer serve: pool ready: %.2f GiB %s in %.2f s (%.2f GB/s)\n",
            (double)total / gib, p->no_pin ? "set up (pageable, --no-pin)" : "pinned", secs, rate);
    fflush(stderr);
    return;
  }
  if (p->tty) {
    char bar[41];
    int full = (int)(frac * 40);
    for (int i = 0; i < 40; i++)
      bar[i] = i < full ? '#' : '.';
    bar[40] = '\0';
    fprintf(stderr, "\r\033[K%s the pool [%s] %3.0f%% %.1f/%.1f GiB %.2f GB/s",
            p->no_pin ? "setting up" : "pinning", bar, frac * 100, (double)done / gib,
            (double)total / gib, rate);
    p->drawn = true;
  } else if (now - p->last >= 2000000000ull) {
    fprintf(stderr, "openinfer serve: %s the pool: %.0f%% (%.1f of %.1f GiB, %.2f GB/s)\n",
            p->no_pin ? "setting up" : "pinning", frac * 100, (double)done / gib,
            (double)total / gib, rate);
    p->last = now;
  }
  fflush(stderr);
}

static bool parse_level(const char *s, int32_t *out) {
  static const char *names[] = {"trace", "debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 6; i++)
    if (!strcmp(s, names[i])) {
      *out = i;
      return true;
    }
  return false;
}

/* Long options without a short letter. */
enum { OPT_TLS_CA = 256, OPT_TLS_CERT, OPT_TLS_KEY };

int cmd_serve(int argc, char **argv) {
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},
      {"socket-mode", required_argument, NULL, 'm'},
      {"allow-uid", required_argument, NULL, 'u'},
      {"allow-gid", required_argument, NULL, 'g'},
      {"pool", required_argument, NULL, 'p'},
      {"hugepages", no_argument, NULL, 'H'},
      {"no-pin", no_argument, NULL, 'N'},
      {"device", required_argument, NULL, 'd'},
      {"arena-devices", required_argument, NULL, 'a'},
      {"max-sessions", required_argument, NULL, 'S'},
      {"handshake-timeout", required_argument, NULL, 'T'},
      {"log-level", required_argument, NULL, 'l'},
      {"help", no_argument, NULL, 'h'},
      {"metrics-addr", required_argument, NULL, 'M'},
      {"no-metrics", no_argument, NULL, 'n'},
      {"disk", required_argument, NULL, 'D'},
      {"disk-size", required_argument, NULL, 'Z'},
      {"cluster", required_argument, NULL, 'C'},
      {"node-id", required_argument, NULL, 'I'},
      {"cluster-secret", required_argument, NULL, 'K'},
      {"cluster-name", required_argument, NULL, 'G'},
      {"redis-auth-file", required_argument, NULL, 'U'},
      {"redis-tls-ca", required_argument, NULL, OPT_TLS_CA},
      {"redis-tls-cert", required_argument, NULL, OPT_TLS_CERT},
      {"redis-tls-key", required_argument, NULL, OPT_TLS_KEY},
      {"listen", required_argument, NULL, 'L'},
      {"advertise", required_argument, NULL, 'A'},
      {NULL, 0, NULL, 0},
  };
  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.pool_bytes = 1ull << 30;
  oi_host_cluster_options co;
  oi_host_cluster_options_init(&co);
  oi_server_options so;
  oi_server_options_init(&so);
  so.log_level = OI_LOG_INFO;
  uint32_t uids[MAX_IDS], gids[MAX_IDS];
  int32_t devices[MAX_IDS];
  uint32_t nuids = 0, ngids = 0, ndevices = 0;
  const char *metrics_addr = DEFAULT_METRICS_ADDR;
  char *disk_list = NULL; /* --disk DIR[,DIR...] */
  const char *disk_dirs[MAX_IDS];
  uint32_t ndisk = 0;
  oi_host_disk_options dopts;
  oi_host_disk_options_init(&dopts);
  bool metrics_explicit = false;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    long v;
    char *end;
    switch (c) {
    case 's': so.socket_path = optarg; break;
    case 'm':
      v = strtol(optarg, &end, 8);
      if (*end || end == optarg || v < 0 || v > 0777) {
        fprintf(stderr, "openinfer serve: --socket-mode '%s' is not an octal mode\n", optarg);
        return CLI_USAGE;
      }
      so.socket_mode = (uint32_t)v;
      break;
    case 'u':
    case 'g':
      if (!cli_parse_int(optarg, 0, 0xfffffffeL, &v) || (c == 'u' ? nuids : ngids) >= MAX_IDS) {
        fprintf(stderr, "openinfer serve: bad --allow-%s '%s'\n", c == 'u' ? "uid" : "gid", optarg);
        return CLI_USAGE;
      }
      if (c == 'u')
        uids[nuids++] = (uint32_t)v;
      else
        gids[ngids++] = (uint32_t)v;
      break;
    case 'p':
      if (!cli_parse_size(optarg, &ho.pool_bytes) || ho.pool_bytes == 0) {
        fprintf(stderr, "openinfer serve: --pool '%s' is not a size (e.g. 64G)\n", optarg);
        return CLI_USAGE;
      }
      break;
    case 'H': ho.flags |= OI_HOST_HUGEPAGES; break;
    case 'N': ho.flags |= OI_HOST_NO_PIN; break;
    case 'd':
      if (!parse_device(optarg, &ho.device)) {
        fprintf(stderr, "openinfer serve: --device '%s' is not a device (N or cpu)\n", optarg);
        return CLI_USAGE;
      }
      break;
    case 'a': {
      char *list = strdup(optarg), *save = NULL;
      for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (ndevices >= MAX_IDS || !parse_device(tok, &devices[ndevices])) {
          fprintf(stderr, "openinfer serve: --arena-devices: '%s' is not a device\n", tok);
          free(list);
          return CLI_USAGE;
        }
        ndevices++;
      }
      free(list);
      break;
    }
    case 'S':
      if (!cli_parse_int(optarg, 1, 1 << 20, &v)) {
        fprintf(stderr, "openinfer serve: bad --max-sessions '%s'\n", optarg);
        return CLI_USAGE;
      }
      so.max_sessions = (uint32_t)v;
      break;
    case 'T':
      if (!strcmp(optarg, "none")) {
        so.handshake_timeout_ms = UINT32_MAX;
      } else if (!cli_parse_int(optarg, 1, 86400000L, &v)) {
        fprintf(stderr,
                "openinfer serve: --handshake-timeout '%s' is not 1..86400000 ms or 'none'\n",
                optarg);
        return CLI_USAGE;
      } else {
        so.handshake_timeout_ms = (uint32_t)v;
      }
      break;
    case 'l':
      if (!parse_level(optarg, &so.log_level)) {
        fprintf(stderr, "openinfer serve: --log-level '%s' is not a level\n", optarg);
        return CLI_USAGE;
      }
      break;
    case 'M':
      metrics_addr = optarg;
      metrics_explicit = true;
      break;
    case 'n':
      metrics_addr = NULL;
      metrics_explicit = true;
      break;
    case 'D': {
      free(disk_list);
      disk_list = strdup(optarg);
      ndisk = 0;
      char *save = NULL;
      for (char *tok = strtok_r(disk_list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (ndisk >= MAX_IDS) {
          fprintf(stderr, "openinfer serve: --disk: more than %d directories\n", MAX_IDS);
          free(disk_list);
          return CLI_USAGE;
        }
        disk_dirs[ndisk++] = tok;
      }
      break;
    }
    case 'Z':
      if (!cli_parse_size(optarg, &dopts.capacity_bytes) || dopts.capacity_bytes == 0) {
        fprintf(stderr, "openinfer serve: --disk-size '%s' is not a size (e.g. 500G)\n", optarg);
        free(disk_list);
        return CLI_USAGE;
      }
      break;
    case 'C': co.redis_url = optarg; break;
    case 'I': co.node_id = optarg; break;
    case 'K': co.secret_file = optarg; break;
    case 'G': co.cluster_name = optarg; break;
    case 'U': co.redis_auth_file = optarg; break;
    case OPT_TLS_CA: co.redis_tls_ca_file = optarg; break;
    case OPT_TLS_CERT: co.redis_tls_cert_file = optarg; break;
    case OPT_TLS_KEY: co.redis_tls_key_file = optarg; break;
    case 'L': co.listen_addr = optarg; break;
    case 'A': co.advertise_addr = optarg; break;
    case 'h': serve_usage(stdout); return CLI_OK;
    default: serve_usage(stderr); return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer serve: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }
  so.host = &ho;
  so.allowed_uids = uids;
  so.num_allowed_uids = nuids;
  so.allowed_gids = gids;
  so.num_allowed_gids = ngids;
  so.devices = devices;
  so.num_devices = ndevices;
  if (ndisk || dopts.capacity_bytes) {
    if (!ndisk || !dopts.capacity_bytes) {
      fprintf(stderr, "openinfer serve: --disk and --disk-size go together\n");
      free(disk_list);
      return CLI_USAGE;
    }
    dopts.dirs = disk_dirs;
    dopts.num_dirs = ndisk;
    so.disk = &dopts;
  }

  if ((co.node_id || co.secret_file || co.advertise_addr || co.listen_addr || co.cluster_name ||
       co.redis_auth_file || co.redis_tls_ca_file || co.redis_tls_cert_file ||
       co.redis_tls_key_file) &&
      !co.redis_url) {
    fprintf(stderr, "openinfer serve: --node-id, --cluster-secret, --listen, --advertise, "
                    "--cluster-name, --redis-auth-file and --redis-tls-* need --cluster\n");
    free(disk_list);
    return CLI_USAGE;
  }
  if (co.redis_url && (!co.node_id || !co.secret_file || !co.listen_addr)) {
    fprintf(stderr, "openinfer serve: --cluster needs --node-id, --cluster-secret and --listen%s\n",
            co.listen_addr ? ""
                           : " (--listen IP:PORT: an address of this host the other nodes "
                             "reach, e.g. --listen 10.0.0.5:7470; 127.0.0.1:PORT only for a "
                             "cluster on this host)");
    free(disk_list);
    return CLI_USAGE;
  }
  /* Every cluster option, the secret file included, before the pool is
   * pinned (which can take minutes). */
  if (co.redis_url && oi_host_cluster_options_check(&co) != OI_OK) {
    fprintf(stderr, "openinfer serve: --cluster: %s\n", oi_last_error());
    free(disk_list);
    return CLI_USAGE;
  }

  progress_state prog = {.tty = isatty(2) == 1, .no_pin = (ho.flags & OI_HOST_NO_PIN) != 0};
  ho.progress = on_progress;
  ho.progress_ctx = &prog;
  so.metrics_addr = metrics_addr;

  oi_server *srv;
  oi_status st = oi_server_create(&so, &srv);
  if (st != OI_OK && metrics_addr && !metrics_explicit &&
      (st == OI_ERR_BUSY || st == OI_ERR_UNSUPPORTED || st == OI_ERR_PERMISSION ||
       st == OI_ERR_IO) &&
      strstr(oi_last_error(), "metrics endpoint")) {
    /* The default endpoint is a convenience: without it the server still
     * serves. An address given with --metrics-addr is a requirement. */
    fprintf(stderr, "openinfer serve: warning: %s; serving without /metrics\n", oi_last_error());
    so.metrics_addr = NULL;
    prog = (progress_state){.tty = prog.tty, .no_pin = prog.no_pin};
    st = oi_server_create(&so, &srv);
  }
  free(disk_list); /* (the server does not keep the directory names) */
  if (st == OI_OK && co.redis_url && (st = oi_server_attach_cluster(srv, &co)) != OI_OK) {
    fprintf(stderr, "openinfer serve: --cluster: %s (%s)\n", oi_last_error(), oi_status_str(st));
    oi_server_destroy(srv);
    return CLI_FAILED;
  }
  if (st != OI_OK) {
    fprintf(stderr, "openinfer serve: %s (%s)\n", oi_last_error(), oi_status_str(st));
    return CLI_FAILED;
  }
  g_server = srv;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  fprintf(stderr, "openinfer serve: listening on %s (pool %.2f GiB, epoch %016llx)\n",
          oi_server_socket_path(srv), (double)ho.pool_bytes / (double)(1ull << 30),
          (unsigned long long)oi_server_epoch(srv));
  if (oi_server_metrics_port(srv)) {
    /* The address as given, with the port actually bound (port 0 picks one). */
    const char *colon = strrchr(so.metrics_addr, ':');
    int hl = colon ? (int)(colon - so.metrics_addr) : 0;
    fprintf(stderr, "openinfer serve: metrics on http://%.*s:%u/metrics (and /healthz)\n",
            hl ? hl : 9, hl ? so.metrics_addr : "127.0.0.1", (unsigned)oi_server_metrics_port(srv));
  }
  fflush(stderr);
  st = oi_server_run(srv);
  g_server = NULL;
  if (st != OI_OK) fprintf(stderr, "openinfer serve: %s\n", oi_last_error());
  oi_server_destroy(srv);
  fprintf(stderr, "openinfer serve: stopped\n");
  return st == OI_OK ? CLI_OK : CLI_FAILED;
}
