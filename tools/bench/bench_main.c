/* `openinfer-bench`: the benchmarks (bench.c), an uninstalled target that
 * links the library's internals. `openinfer bench ARGS` runs
 * `openinfer-bench bench ARGS`; `openinfer-bench ARGS` works as well. */
#include <string.h>

#include "cli.h"

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
  argv[0] = (char *)"bench";
  return cmd_bench(argc, argv);
}
