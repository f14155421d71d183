/* Shared by the cluster tier's tests: private redis-server processes on
 * free loopback ports. */
#ifndef OI_TEST_CLUSTER_UTIL_H
#define OI_TEST_CLUSTER_UTIL_H

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "rig.h"
#include "testutil.h"

static inline bool on_path(const char *prog) {
  const char *path = getenv("PATH");
  if (!path) return false;
  char buf[4096];
  for (const char *p = path; *p;) {
    size_t len = strcspn(p, ":");
    snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, prog);
    if (access(buf, X_OK) == 0) return true;
    p += len;
    if (*p == ':') p++;
  }
  return false;
}

static inline int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

static inline void sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static inline double ms_since(uint64_t t0) { return (double)(oi__now_ns() - t0) / 1e6; }

static inline redisContext *raw(int port) {
  struct timeval tv = {1, 0};
  redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c && c->err) {
    redisFree(c);
    return NULL;
  }
  return c;
}

/* Starts redis-server on `port` and waits until it answers PING. */
static inline pid_t redis_start(int port) {
  char p[16];
  snprintf(p, sizeof p, "%d", port);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    freopen("/dev/null", "w", stdout);
    execlp("redis-server", "redis-server", "--port", p, "--save", "", "--appendonly", "no",
           "--bind", "127.0.0.1", "--daemonize", "no", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    redisContext *c = raw(port);
    if (c) {
      redisReply *r = redisCommand(c, "PING");
      bool ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
      redisFree(c);
      if (ok) return pid;
    }
    sleep_ms(10);
  }
  fprintf(stderr, "redis-server on port %d did not answer PING within 5 s\n", port);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  exit(1);
}

static inline void redis_stop(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

#endif
