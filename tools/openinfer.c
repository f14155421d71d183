/* `openinfer`: the command-line front end (demo, bench, and later serve,
 * stats). Subcommands dispatch from a table; unknown ones exit 2. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "openinfer/openinfer.h"

typedef struct command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"demo", "save KV blocks to the host tier and restore them, verifying every byte", cmd_demo},
    {"bench", "measure the host tier (bench host)", cmd_bench},
    {"serve", "run the sidecar server (host pool + client KV arenas over a Unix socket)", cmd_serve},
    {"stats", "print a running server's figures (pool, blocks, saves, loads, latencies)", cmd_stats},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: openinfer [--help] [--version] <command> [<args>]\n"
          "\n"
          "libopeninfer %s: a host-memory tier for the paged KV cache of LLM inference engines.\n"
          "\n"
          "commands:\n",
          oi_version_string());
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\nRun 'openinfer <command> --help' for a command's options.\n");
}

bool cli_parse_size(const char *s, uint64_t *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || s[0] == '-') return false;
  unsigned shift = 0;
  switch (*end) {
  case '\0': break;
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
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

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CLI_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return CLI_OK;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
    printf("openinfer %s\n", oi_version_string());
    return CLI_OK;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(cmd, commands[i].name)) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "openinfer: '%s' is not a command (see 'openinfer --help')\n", cmd);
  return CLI_USAGE;
}
