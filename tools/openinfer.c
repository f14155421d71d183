/* `openinfer`: the command-line front end (demo, bench, serve, stats, info).
 * Subcommands dispatch from a table; unknown ones exit 2. Built on the public
 * (and experimental) API only: the benchmarks, which measure internals, are
 * the uninstalled `openinfer-bench` that `openinfer bench` runs. */
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
    {"bench",
     "benchmarks (build tree only): host (host tier), transfer (GPU copies), rpc (sidecar\n"
     "           round trip), ttft (time to first token of the reference model), disk (the\n"
     "           disk tier against fio), remote (the cluster tier between two nodes)",
     cmd_bench_launch},
    {"serve", "run the sidecar server (host pool + client KV arenas over a Unix socket)",
     cmd_serve},
    {"stats", "print a running server's figures (pool, blocks, saves, loads, latencies)",
     cmd_stats},
    {"info", "what this machine offers: GPUs, host and locked memory, RDMA devices (libibverbs)",
     cmd_info},
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
