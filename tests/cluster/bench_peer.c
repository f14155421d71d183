/* Throughput of the peer transport against a plain TCP stream, between two
 * processes over loopback: a holder process exposes a region of SIZE_MIB
 * (default 1024) MiB; the reader reads it all in 1 MiB reads, DEPTH (32) in
 * flight, then receives the same bytes over a plain TCP socket from the same
 * process. Not a test (meson builds it; run it by hand):
 *   build/tests/cluster/cluster_bench_peer [am|rma] [SIZE_MIB] [DEPTH] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

int main(int argc, char **argv) {
  int reads = argc > 1 && strcmp(argv[1], "rma") == 0 ? OI_PEER_READS_RMA : OI_PEER_READS_AM;
  uint64_t size = (argc > 2 ? strtoull(argv[2], NULL, 10) : 1024) * MiB;
  size_t depth = argc > 3 ? strtoul(argv[3], NULL, 10) : 32;
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
  oi_peer_net_options o = {
      .node_id = "reader", .secret = SECRET, .secret_len = 32, .timeout_ms = 30000, .reads = reads};
  oi_peer_net *n;
  REQUIRE(oi__peer_net_create(&o, &n) == OI_OK);
  char addr[64];
  sprintf(addr, "127.0.0.1:%u", ports[0]);
  oi_peer *p;
  REQUIRE(oi__peer_connect(n, addr, &p) == OI_OK);
  uint8_t *dst = oi__aligned_alloc(4096, size);
  memset(dst, 1, size);
  oi_peer_read *rs = malloc(depth * sizeof(*rs));
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now_s();
    for (uint64_t off = 0; off < size; off += depth * MiB) {
      size_t k = 0;
      for (; k < depth && off + k * MiB < size; k++)
        rs[k] = (oi_peer_read){off + k * MiB, MiB, dst + off + k * MiB};
      REQUIRE(oi__peer_get(p, rs, k, 0) == OI_OK);
    }
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
  printf("%s reads, %llu MiB in 1 MiB reads, %zu in flight: %.2f GB/s; plain TCP stream: %.2f "
         "GB/s; ratio %.2f\n",
         reads == OI_PEER_READS_RMA ? "one-sided (UCX RMA)" : "served (AM)",
         (unsigned long long)(size / MiB), depth, best, best_tcp, best / best_tcp);
  oi__peer_close(p);
  oi__peer_net_destroy(n);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  oi__free(dst);
  free(rs);
  TEST_EXIT();
}
