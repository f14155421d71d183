/* Throughput of the peer transport against a plain TCP stream, between two
 * processes over loopback: a holder process exposes a region of SIZE_MIB
 * (default 1024) MiB; the reader reads it all in 1 MiB reads, DEPTH (32) in
 * flight, then receives the same bytes over a plain TCP socket from the same
 * process. With LANES > 1 the reader splits the region over that many nets
 * (each its own UCX worker, progress thread and connection), one thread
 * each. Not a test (meson builds it; run it by hand):
 *   build/tests/cluster/cluster_bench_peer [am|rma] [SIZE_MIB] [DEPTH] [LANES] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster/peer.h"
#include "core/core.h"
#include "testutil.h"

#define MiB (1024ull * 1024)

static const uint8_t SECRET[] = "cluster secret: thirty-two bytes";

static double now_s(void) { return (double)oi__now_ns() / 1e9; }

#define MAX_LANES 16

typedef struct lane {
  oi_peer_net *n;
  oi_peer *p;
  uint8_t *dst;
  uint64_t begin, end;
  size_t depth;
} lane;

/* Reads [begin, end) of the region into dst, depth reads of 1 MiB at a time. */
static void *lane_main(void *arg) {
  lane *l = arg;
  oi_peer_read *rs = malloc(l->depth * sizeof(*rs));
  REQUIRE(rs);
  for (uint64_t off = l->begin; off < l->end; off += l->depth * MiB) {
    size_t k = 0;
    for (; k < l->depth && off + k * MiB < l->end; k++)
      rs[k] = (oi_peer_read){off + k * MiB, OI_MIN(MiB, l->end - off - k * MiB),
                             l->dst + off + k * MiB};
    REQUIRE(oi__peer_get(l->p, rs, k, 0) == OI_OK);
  }
  free(rs);
  return NULL;
}

int main(int argc, char **argv) {
  int reads = argc > 1 && strcmp(argv[1], "rma") == 0 ? OI_PEER_READS_RMA : OI_PEER_READS_AM;
  uint64_t size = (argc > 2 ? strtoull(argv[2], NULL, 10) : 1024) * MiB;
  size_t depth = argc > 3 ? strtoul(argv[3], NULL, 10) : 32;
  size_t lanes = argc > 4 ? strtoul(argv[4], NULL, 10) : 1;
  REQUIRE(depth >= 1 && lanes >= 1 && lanes <= MAX_LANES && size >= lanes * MiB);
  signal(SIGPIPE, SIG_IGN);
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    uint8_t *region = oi__aligned_alloc(4096, size);
    for (uint64_t i = 0; i < size; i += 8) {
      uint64_t v = i * 0x9e3779b97f4a7c15ull;
      memcpy(region + i, &v, 8);
    }
    oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                             .node_id = "holder",
                             .secret = SECRET,
                             .secret_len = 32,
                             .reads = reads};
    oi_peer_net *n;
    REQUIRE(oi__peer_net_create(&o, &n) == OI_OK);
    REQUIRE(oi__peer_net_register(n, region, size) == OI_OK);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sin);
    REQUIRE(bind(ls, (struct sockaddr *)&sin, sizeof(sin)) == 0 && listen(ls, 1) == 0);
    getsockname(ls, (struct sockaddr *)&sin, &sl);
    uint16_t ports[2] = {oi__peer_net_port(n), ntohs(sin.sin_port)};
    REQUIRE(write(fds[1], ports, sizeof(ports)) == sizeof(ports));
    for (;;) {
      int c = accept(ls, NULL, NULL);
      if (c < 0) continue;
      for (uint64_t off = 0; off < size;) {
        ssize_t w = send(c, region + off, OI_MIN(size - off, 4 * MiB), 0);
        if (w <= 0) break;
        off += (uint64_t)w;
      }
      close(c);
    }
  }
  uint16_t ports[2];
  REQUIRE(read(fds[0], ports, sizeof(ports)) == sizeof(ports));
  uint8_t *dst = oi__aligned_alloc(4096, size);
  memset(dst, 1, size);
  char addr[64];
  sprintf(addr, "127.0.0.1:%u", ports[0]);
  lane ls[MAX_LANES];
  uint64_t per = size / lanes / MiB * MiB;
  for (size_t l = 0; l < lanes; l++) {
    oi_peer_net_options o = {.node_id = "reader",
                             .secret = SECRET,
                             .secret_len = 32,
                             .timeout_ms = 30000,
                             .reads = reads};
    ls[l] = (lane){
        .dst = dst, .begin = l * per, .end = l + 1 == lanes ? size : (l + 1) * per, .depth = depth};
    REQUIRE(oi__peer_net_create(&o, &ls[l].n) == OI_OK);
    REQUIRE(oi__peer_connect(ls[l].n, addr, &ls[l].p) == OI_OK);
  }
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    pthread_t th[MAX_LANES];
    double t0 = now_s();
    for (size_t l = 0; l < lanes; l++)
      REQUIRE(pthread_create(&th[l], NULL, lane_main, &ls[l]) == 0);
    for (size_t l = 0; l < lanes; l++)
      pthread_join(th[l], NULL);
    double gbs = (double)size / (now_s() - t0) / 1e9;
    best = OI_MAX(best, gbs);
  }
  for (uint64_t i = 0; i < size; i += 8) {
    uint64_t v = i * 0x9e3779b97f4a7c15ull;
    REQUIRE(memcmp(dst + i, &v, 8) == 0);
  }
  double best_tcp = 0;
  for (int rep = 0; rep < 3; rep++) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(ports[1])};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(s, (struct sockaddr *)&sin, sizeof(sin)) == 0);
    double t0 = now_s();
    uint64_t got = 0;
    while (got < size) {
      ssize_t r = recv(s, dst + got, OI_MIN(size - got, 4 * MiB), 0);
      REQUIRE(r > 0);
      got += (uint64_t)r;
    }
    best_tcp = OI_MAX(best_tcp, (double)size / (now_s() - t0) / 1e9);
    close(s);
  }
  printf("%s reads, %llu MiB in 1 MiB reads, %zu in flight on each of %zu lanes: %.2f GB/s; plain "
         "TCP stream: %.2f GB/s; ratio %.2f\n",
         reads == OI_PEER_READS_RMA ? "one-sided (UCX RMA)" : "served (AM)",
         (unsigned long long)(size / MiB), depth, lanes, best, best_tcp, best / best_tcp);
  for (size_t l = 0; l < lanes; l++) {
    oi__peer_close(ls[l].p);
    oi__peer_net_destroy(ls[l].n);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  oi__free(dst);
  TEST_EXIT();
}
