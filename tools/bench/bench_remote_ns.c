/* `openinfer bench remote`, part 1 between two network namespaces (see
 * bench_remote_ns.h): two namespaces joined by a veth pair, redis-server
 * and one `openinfer serve --cluster` in the first, another in the second;
 * this process stays in the root namespace and talks to both servers over
 * their Unix sockets (sidecar engines), as an engine would. The plain
 * stream runs between a thread in each namespace (a socket belongs to the
 * namespace of the thread that made it). */
#include "bench/bench_remote_ns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cluster/directory.h"
#include "core/core.h"

#define REDIS_PORT 6379 /* the namespace is private: no other Redis there */
#define MAX_QUERY 1024  /* blocks per query (a fetch's directory lookup cap) */

/* What the namespaces need removing at exit (also from a signal). */
static struct {
  pid_t main_pid;
  bool made[2];
  char ns[2][40];
  pid_t pids[3]; /* redis, node A, node B */
} g_rig;

static int run_quiet(char *const argv[]) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execvp(argv[0], argv);
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* `ip ARGS...`, split at spaces. */
static bool ipcmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static bool ipcmd(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  char *argv[32];
  int n = 0;
  argv[n++] = "ip";
  for (char *save = NULL, *tok = strtok_r(line, " ", &save); tok && n < 31;
       tok = strtok_r(NULL, " ", &save))
    argv[n++] = tok;
  argv[n] = NULL;
  return run_quiet(argv) == 0;
}

static void rig_down(void) {
  if (getpid() != g_rig.main_pid) return;
  for (int i = 0; i < 3; i++)
    if (g_rig.pids[i] > 0) {
      kill(g_rig.pids[i], SIGKILL);
      waitpid(g_rig.pids[i], NULL, 0);
      g_rig.pids[i] = 0;
    }
  for (int i = 0; i < 2; i++)
    if (g_rig.made[i]) {
      char *argv[] = {"ip", "netns", "del", g_rig.ns[i], NULL};
      run_quiet(argv);
      g_rig.made[i] = false;
    }
}

static void on_signal(int sig) {
  rig_down();
  signal(sig, SIG_DFL);
  raise(sig);
}

static bool rig_up(char addr[2][20]) {
  int pid = getpid();
  g_rig.main_pid = pid;
  atexit(rig_down);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  signal(SIGHUP, on_signal);
  int x = 64 + (pid >> 8) % 128, y = pid & 255;
  for (int i = 0; i < 2; i++) {
    snprintf(g_rig.ns[i], sizeof g_rig.ns[i], "oibench%d-%c", pid, 'a' + i);
    snprintf(addr[i], 20, "10.%d.%d.%d", x, y, i + 1);
    if (!(g_rig.made[i] = ipcmd("netns add %s", g_rig.ns[i]))) return false;
  }
  return ipcmd("link add va netns %s type veth peer name vb netns %s", g_rig.ns[0], g_rig.ns[1]) &&
         ipcmd("-n %s addr add %s/24 dev va", g_rig.ns[0], addr[0]) &&
         ipcmd("-n %s addr add %s/24 dev vb", g_rig.ns[1], addr[1]) &&
         ipcmd("-n %s link set va up", g_rig.ns[0]) && ipcmd("-n %s link set vb up", g_rig.ns[1]) &&
         ipcmd("-n %s link set lo up", g_rig.ns[0]) && ipcmd("-n %s link set lo up", g_rig.ns[1]);
}

/* Starts argv in namespace i with `ip netns exec` (which also mounts the
 * namespace's /sys, where UCX finds its network devices), output to log. */
static pid_t spawn_in(int i, const char *const args[], const char *log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  const char *argv[40] = {"ip", "netns", "exec", g_rig.ns[i]};
  for (int k = 0; args[k] && k < 35; k++)
    argv[4 + k] = args[k];
  execvp("ip", (char *const *)argv);
  _exit(127);
}

static bool log_has(const char *log, const char *needle) {
  FILE *f = fopen(log, "r");
  if (!f) return false;
  char line[1024];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static void nap_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Waits up to 10 s for `needle` in the log of process pid. */
static bool wait_ready(pid_t pid, const char *log, const char *needle, char *why, size_t cap) {
  for (int i = 0; i < 1000; i++) {
    if (log_has(log, needle)) return true;
    if (waitpid(pid, NULL, WNOHANG) == pid) {
      snprintf(why, cap, "a process exited before it was ready (its log: %s)", log);
      return false;
    }
    nap_ms(10);
  }
  snprintf(why, cap, "a process was not ready within 10 s (its log: %s)", log);
  return false;
}

/* Runs fn(arg) on a thread inside namespace i: what it creates (sockets)
 * belongs to that namespace. */
typedef struct in_ns {
  int ns;
  void *(*fn)(void *);
  void *arg;
  void *ret;
  bool entered;
} in_ns;

static bool enter(int i) {
  char p[160];
  snprintf(p, sizeof p, "/run/netns/%s", g_rig.ns[i]);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  bool ok = fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

static void *in_ns_main(void *p) {
  in_ns *a = p;
  a->entered = enter(a->ns);
  if (a->entered) a->ret = a->fn(a->arg);
  return NULL;
}

/* Runs fn(arg) on a thread inside namespace i (i < 0: on this thread, in
 * its own namespace). */
static bool run_in(int i, void *(*fn)(void *), void *arg, void **ret) {
  if (i < 0) {
    void *r = fn(arg);
    if (ret) *ret = r;
    return true;
  }
  in_ns a = {.ns = i, .fn = fn, .arg = arg};
  pthread_t th;
  if (pthread_create(&th, NULL, in_ns_main, &a) != 0) return false;
  pthread_join(th, NULL);
  if (ret) *ret = a.ret;
  return a.entered;
}

/* Whether this thread's namespace has link `name` running (carrier up):
 * UCX takes only running interfaces when its net starts, and a veth's
 * carrier comes a moment after `ip link set up`. */
static void *link_running_here(void *name) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", (const char *)name);
  bool running = fd >= 0 && ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 &&
                 (ifr.ifr_flags & (IFF_UP | IFF_RUNNING)) == (IFF_UP | IFF_RUNNING);
  if (fd >= 0) close(fd);
  return running ? name : NULL;
}

static bool links_running(void) {
  static const char *const names[2] = {"va", "vb"};
  for (int tries = 0; tries < 500; tries++) { /* 5 s */
    void *r0 = NULL, *r1 = NULL;
    if (!run_in(0, link_running_here, (void *)names[0], &r0) ||
        !run_in(1, link_running_here, (void *)names[1], &r1))
      return false;
    if (r0 && r1) return true;
    nap_ms(10);
  }
  return false;
}

/* ---- the plain stream between the namespaces ---- */

typedef struct stream {
  int send_ns, recv_ns; /* -1: this process's namespace */
  const char *to_addr;
  int port;
  const uint8_t *src; /* NULL: one cached 1 MiB buffer over and over */
  uint64_t bytes;
  int listen_fd;
  int rc;
} stream;

static void *listen_here(void *p) {
  stream *s = p;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, s->to_addr, &a.sin_addr);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  s->listen_fd = fd;
  s->port = fd >= 0 ? ntohs(a.sin_port) : 0;
  return NULL;
}

static void *send_here(void *p) {
  stream *s = p;
  static char buf[1 << 20];
  s->rc = -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
  inet_pton(AF_INET, s->to_addr, &a.sin_addr);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
    uint64_t left = s->bytes;
    while (left) {
      const void *from = s->src ? (const void *)(s->src + (s->bytes - left)) : (const void *)buf;
      ssize_t w = send(fd, from, left < sizeof buf ? left : sizeof buf, 0);
      if (w <= 0) break;
      left -= (uint64_t)w;
    }
    s->rc = left ? -1 : 0;
  }
  if (fd >= 0) close(fd);
  return NULL;
}

static void *send_main(void *p) {
  run_in(((stream *)p)->send_ns, send_here, p, NULL);
  return NULL;
}

/* `bytes` from src (a thread in namespace send_ns) into dst (this thread,
 * the socket made in namespace recv_ns, listening on to_addr); src and dst
 * NULL: one 1 MiB buffer each. GB/s, 0 on failure. */
static double stream_gbps(int send_ns, int recv_ns, const char *to_addr, const uint8_t *src,
                          uint8_t *dst, uint64_t bytes) {
  stream s = {.send_ns = send_ns,
              .recv_ns = recv_ns,
              .to_addr = to_addr,
              .src = src,
              .bytes = bytes,
              .listen_fd = -1};
  if (!run_in(recv_ns, listen_here, &s, NULL) || s.listen_fd < 0) return 0;
  pthread_t th;
  uint64_t t0 = oi__now_ns();
  if (pthread_create(&th, NULL, send_main, &s) != 0) {
    close(s.listen_fd);
    return 0;
  }
  int cfd = accept(s.listen_fd, NULL, NULL);
  uint64_t got = 0;
  uint8_t *ring = dst ? NULL : malloc(1 << 20);
  while (cfd >= 0 && (dst || ring) && got < bytes) {
    size_t want = bytes - got < (1u << 20) ? (size_t)(bytes - got) : (1u << 20);
    ssize_t r = recv(cfd, dst ? dst + got : ring, want, 0);
    if (r <= 0) break;
    got += (uint64_t)r;
  }
  uint64_t t1 = oi__now_ns();
  pthread_join(th, NULL);
  free(ring);
  if (cfd >= 0) close(cfd);
  close(s.listen_fd);
  return got == bytes && s.rc == 0 ? (double)bytes / (double)(t1 - t0) : 0;
}

int remote_stream_baseline(int send_ns, int recv_ns, const char *to_addr, const uint8_t *src,
                           uint64_t bytes, double *gbps, double *cached_gbps) {
  *gbps = *cached_gbps = 0;
  uint8_t *land = malloc(bytes);
  if (!land) return -1;
  memset(land, 0, bytes); /* touched first, as a pool is */
  double runs[3];
  for (int i = 0; i < 3; i++)
    runs[i] = stream_gbps(send_ns, recv_ns, to_addr, src, land, bytes);
  *gbps = OI_MAX(OI_MIN(runs[0], runs[1]), OI_MIN(OI_MAX(runs[0], runs[1]), runs[2]));
  if (memcmp(land, src, bytes) != 0) *gbps = 0; /* not the same bytes: no baseline */
  free(land);
  *cached_gbps = stream_gbps(send_ns, recv_ns, to_addr, NULL, NULL, bytes);
  return 0;
}

/* ---- the directory, seen from namespace A ---- */

/* Waits (10 s at most) until the directory names a holder for every block:
 * run inside namespace A, where Redis listens (the directory's connections
 * are made by the threads that use it, and by the threads they start). */
typedef struct published {
  const remote_ns_params *p;
  const char *url;
  bool all;
  char why[200];
} published;

static void *wait_published_here(void *arg) {
  published *w = arg;
  const remote_ns_params *p = w->p;
  oi_dir_options dopt;
  oi__dir_options_init(&dopt);
  dopt.url = w->url;
  dopt.node_id = "bench-ns-probe";
  dopt.epoch = 1;
  /* the nodes' entries carry MACs under the cluster secret: read it as
   * they do (its file, a trailing newline ignored) */
  char secret[1100];
  ssize_t sl = -1;
  int sfd = open(p->secret, O_RDONLY | O_CLOEXEC);
  if (sfd >= 0) {
    sl = read(sfd, secret, sizeof secret);
    close(sfd);
  }
  while (sl > 0 && (secret[sl - 1] == '\n' || secret[sl - 1] == '\r'))
    sl--;
  if (sl <= 0) {
    snprintf(w->why, sizeof w->why, "cannot read the secret %s", p->secret);
    return NULL;
  }
  dopt.secret = secret;
  dopt.secret_len = (size_t)sl;
  oi_dir *d = NULL;
  if (oi__dir_open(&dopt, &d) != OI_OK) {
    snprintf(w->why, sizeof w->why, "the directory in namespace A: %s", oi_last_error());
    return NULL;
  }
  static oi_tier_key keys[MAX_QUERY];
  static oi_dir_holder holders[MAX_QUERY];
  for (int tries = 0; tries < 1000 && !w->all; tries++) {
    w->all = true;
    for (uint64_t first = 0; w->all && first < p->nblocks; first += MAX_QUERY) {
      size_t n = (size_t)(p->nblocks - first < MAX_QUERY ? p->nblocks - first : MAX_QUERY), got;
      for (size_t i = 0; i < n; i++) {
        oi_block_hash h = p->hash(first + i);
        keys[i] = (oi_tier_key){.ns_fp = p->ns_fp, .layout_fp = p->layout_fp};
        memcpy(keys[i].hash, h.bytes, 16);
      }
      w->all = oi__dir_lookup(d, keys, n, holders, &got) == OI_OK && got == n;
    }
    if (!w->all) nap_ms(10);
  }
  if (!w->all)
    snprintf(w->why, sizeof w->why, "node A's blocks were not all in the directory within 10 s");
  oi__dir_close(d);
  return NULL;
}

/* ---- part 1 ---- */

static void fill(uint8_t *mem, uint64_t bytes, uint64_t block) {
  for (uint64_t i = 0; i < bytes; i++)
    mem[i] = (uint8_t)(i * 131 + i / block);
}

static bool engine_save(oi_engine *e, uint64_t nblocks, oi_block_hash (*hash)(uint64_t)) {
  int64_t ids[256];
  oi_block_hash hs[256];
  for (uint64_t b = 0; b < nblocks; b += 256) {
    uint64_t k = nblocks - b < 256 ? nblocks - b : 256;
    for (uint64_t i = 0; i < k; i++) {
      ids[i] = (int64_t)(b + i);
      hs[i] = hash(b + i);
    }
    oi_ticket *t = NULL;
    if (oi_engine_save(e, ids, hs, k, NULL, &t) != OI_OK) return false;
    oi_status st = oi_ticket_wait(t, 60000);
    oi_ticket_release(t);
    if (st != OI_OK) return false;
  }
  return oi_engine_flush(e, 60000) == OI_OK;
}

bool remote_ns_possible(const char *openinfer, char *why, size_t cap) {
  if (geteuid() != 0) {
    snprintf(why, cap, "network namespaces need root");
    return false;
  }
  if (!cli_on_path("ip")) {
    snprintf(why, cap, "network namespaces need ip (Debian: iproute2)");
    return false;
  }
  if (access(openinfer, X_OK) != 0) {
    snprintf(why, cap, "no openinfer beside this benchmark (%s)", openinfer);
    return false;
  }
  return true;
}

static bool restore_query(oi_engine *e, uint64_t first, uint64_t n,
                          oi_block_hash (*hash)(uint64_t i), remote_restore_run *run) {
  oi_block_hash hs[MAX_QUERY];
  for (uint64_t i = 0; i < n; i++)
    hs[i] = hash(first + i);
  oi_query_result q = {.struct_size = sizeof q, .wait_ms = 60000};
  if (oi_engine_query(e, NULL, hs, n, OI_QUERY_WAIT_PENDING, &q) != OI_OK) return false;
  run->hits += q.hit_blocks;
  if (q.hit_blocks && run->n < REMOTE_MAX_LEASES) {
    run->leases[run->n] = q.lease;
    run->counts[run->n++] = q.hit_blocks;
  }
  return q.hit_blocks == n;
}

void remote_restore(oi_engine *e, uint64_t nblocks, oi_block_hash (*hash)(uint64_t i),
                    remote_restore_run *run) {
  memset(run, 0, sizeof *run);
  uint64_t t0 = oi__now_ns();
  bool ok = nblocks > 0 && restore_query(e, 0, 1, hash, run);
  uint64_t t1 = oi__now_ns();
  for (uint64_t first = 1; ok && first < nblocks;) {
    uint64_t n = nblocks - first < MAX_QUERY ? nblocks - first : MAX_QUERY;
    ok = restore_query(e, first, n, hash, run);
    first += n;
  }
  uint64_t t2 = oi__now_ns();
  run->first_s = (double)(t1 - t0) / 1e9;
  run->rest_s = (double)(t2 - t1) / 1e9;
}

bool remote_restore_load(oi_engine *e, const remote_restore_run *run) {
  int64_t dst[MAX_QUERY];
  uint64_t done = 0;
  for (int i = 0; i < run->n; i++) {
    for (uint64_t k = 0; k < run->counts[i]; k++)
      dst[k] = (int64_t)(done + k);
    oi_ticket *t = NULL;
    bool ok = oi_engine_load(e, run->leases[i], dst, run->counts[i], NULL, &t) == OI_OK &&
              oi_ticket_wait(t, 60000) == OI_OK;
    oi_ticket_release(t);
    if (!ok) return false;
    done += run->counts[i];
  }
  return done == run->hits;
}

int remote_ns_restore(const remote_ns_params *p, remote_ns_result *r) {
  memset(r, 0, sizeof *r);
  char addr[2][20], url[64], pool_s[32], listen[2][40];
  char log[3][400] = {{0}}, sock[2][400] = {{0}};
  uint64_t bytes = p->nblocks * p->block;
  oi_engine *e[2] = {NULL, NULL};
  oi_imported_arena *ar[2] = {NULL, NULL};
  int rc = -1;
  if (!rig_up(addr)) {
    snprintf(r->why, sizeof r->why, "making the network namespaces failed");
    goto out;
  }
  r->used = true;
  if (!links_running()) {
    snprintf(r->why, sizeof r->why, "the veth pair did not come up within 5 s");
    goto out;
  }
  snprintf(url, sizeof url, "redis://%s:%d", addr[0], REDIS_PORT);
  snprintf(pool_s, sizeof pool_s, "%lluM", (unsigned long long)(p->pool >> 20) + 1);
  snprintf(log[2], sizeof log[2], "%s/redis-ns.log", p->dir);
  char port_s[16];
  snprintf(port_s, sizeof port_s, "%d", REDIS_PORT);
  const char *redis_args[] = {"redis-server", "--port",           port_s, "--bind",
                              addr[0],        "--save",           "",     "--appendonly",
                              "no",           "--protected-mode", "no",   NULL};
  if ((g_rig.pids[0] = spawn_in(0, redis_args, log[2])) < 0 ||
      !wait_ready(g_rig.pids[0], log[2], "Ready to accept connections", r->why, sizeof r->why))
    goto out;
  for (int i = 0; i < 2; i++) {
    char id[32];
    snprintf(id, sizeof id, "bench-ns-%c", 'a' + i);
    snprintf(log[i], sizeof log[i], "%s/node-%c.log", p->dir, 'a' + i);
    snprintf(sock[i], sizeof sock[i], "%s/node-%c.sock", p->dir, 'a' + i);
    snprintf(listen[i], sizeof listen[i], "%s:0", addr[i]);
    const char *args[] = {p->openinfer,
                          "serve",
                          "--socket",
                          sock[i],
                          "--pool",
                          pool_s,
                          "--no-pin",
                          "--no-metrics",
                          "--log-level",
                          "info",
                          "--cluster",
                          url,
                          "--node-id",
                          id,
                          "--cluster-secret",
                          p->secret,
                          "--listen",
                          listen[i],
                          NULL};
    if ((g_rig.pids[1 + i] = spawn_in(i, args, log[i])) < 0 ||
        !wait_ready(g_rig.pids[1 + i], log[i], "openinfer serve: listening on", r->why,
                    sizeof r->why))
      goto out;
  }
  /* A sidecar engine on each node, the same namespace and layout as the
   * in-process nodes (so the same directory keys). */
  for (int i = 0; i < 2; i++) {
    oi_arena_desc a = {.name = "kv",
                       .num_blocks = p->nblocks,
                       .bytes_per_block = p->block,
                       .block_stride = p->block,
                       .segments = 1};
    oi_engine_options eo;
    oi_engine_options_init(&eo);
    eo.namespace_id = p->namespace_id;
    eo.device = OI_DEVICE_CPU;
    eo.arenas = &a;
    eo.num_arenas = 1;
    if (oi_engine_connect(sock[i], &eo, &e[i], &ar[i]) != OI_OK) {
      snprintf(r->why, sizeof r->why, "connecting to node %c: %s", 'A' + i, oi_last_error());
      goto out;
    }
  }
  uint8_t *mem[2] = {oi_imported_arena_ptr(ar[0]), oi_imported_arena_ptr(ar[1])};
  fill(mem[0], bytes, p->block);
  memset(mem[1], 0, bytes);
  if (!engine_save(e[0], p->nblocks, p->hash)) {
    snprintf(r->why, sizeof r->why, "saving on node A: %s", oi_last_error());
    goto out;
  }
  published w = {.p = p, .url = url};
  if (!run_in(0, wait_published_here, &w, NULL) || !w.all) {
    snprintf(r->why, sizeof r->why, "%s", w.why[0] ? w.why : "cannot enter namespace A");
    goto out;
  }
  /* The restore: node B queries them all and waits for them to come over;
   * then every byte, loaded into B's arena (untimed). */
  remote_restore_run run;
  remote_restore(e[1], p->nblocks, p->hash, &run);
  r->fetched = run.hits;
  r->first_fetch_s = run.first_s;
  r->restore_s = run.rest_s;
  r->restore_gbps = run.hits == p->nblocks && run.rest_s > 0
                        ? (double)(bytes - p->block) / (run.rest_s * 1e9)
                        : 0;
  bool ok = run.hits == p->nblocks && remote_restore_load(e[1], &run);
  r->verified = ok && memcmp(mem[0], mem[1], bytes) == 0;
  /* The baseline, a thread in each namespace. */
  if (remote_stream_baseline(0, 1, addr[1], mem[0], bytes, &r->plain_gbps, &r->plain_hot_gbps))
    goto out;
  rc = 0;
out:
  for (int i = 0; i < 2; i++) { /* the mapping first, then the engine (as it expects) */
    if (ar[i]) oi_imported_arena_close(ar[i]);
    if (e[i]) oi_engine_destroy(e[i]);
  }
  rig_down();
  for (int i = 0; i < 3; i++) {
    if (i < 2 && sock[i][0]) {
      char pidf[sizeof sock + 8];
      snprintf(pidf, sizeof pidf, "%s.pid", sock[i]);
      unlink(sock[i]);
      unlink(pidf);
    }
    if (rc == 0 && r->verified && log[i][0]) unlink(log[i]); /* kept otherwise */
  }
  return rc;
}
