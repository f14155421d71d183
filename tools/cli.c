/* Helpers shared by `openinfer` and `openinfer-bench` (cli.h). */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "openinfer/openinfer.h"

bool cli_parse_size(const char *s, uint64_t *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || s[0] == '-') return false;
  unsigned shift = 0;
  switch (*end) {
  case '\0': break;
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  case 't':
  case 'T':
    shift = 40;
    end++;
    break;
  default: return false;
  }
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end) return false;
  if (shift && v > (UINT64_MAX >> shift)) return false;
  *out = (uint64_t)v << shift;
  return true;
}

void cli_bad_value(const char *cmd, const struct option *longopts, int c, const char *arg) {
  const char *name = "?";
  for (const struct option *lo = longopts; lo->name; lo++)
    if (lo->val == c) name = lo->name;
  fprintf(stderr, "%s: bad value '%s' for --%s\n", cmd, arg, name);
}

bool cli_parse_int(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

uint32_t cli_restore_overlap_env(void) {
  const char *ov = getenv("OI_RESTORE_OVERLAP");
  if (ov && (!strcmp(ov, "0") || !strcmp(ov, "off"))) return OI_RESTORE_OVERLAP_OFF;
  if (ov && !strcmp(ov, "host")) return OI_RESTORE_OVERLAP_HOST;
  return OI_RESTORE_OVERLAP_AUTO;
}

uint32_t cli_restore_plan_env(void) {
  const char *p = getenv("OI_RESTORE_PLAN");
  if (p && (!strcmp(p, "0") || !strcmp(p, "off"))) return OI_RESTORE_PLAN_OFF;
  return OI_RESTORE_PLAN_AUTO;
}

uint64_t cli_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint8_t cli_pattern_byte(uint64_t seed, uint64_t offset) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + (offset >> 3) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (uint8_t)(x >> ((offset & 7) * 8));
}

bool cli_on_path(const char *prog) {
  const char *path = getenv("PATH");
  char buf[4096];
  for (const char *p = path ? path : ""; *p;) {
    size_t len = strcspn(p, ":");
    snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, prog);
    if (access(buf, X_OK) == 0) return true;
    p += len + (p[len] == ':');
  }
  return false;
}

int cli_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}
