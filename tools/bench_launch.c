/* `openinfer bench`: the benchmarks measure internals (the host index, the
 * device copy paths, the executor's restore timing), so they are not built
 * into the installed command: they are `openinfer-bench`, an uninstalled
 * target of the build tree (tools/bench/). This runs it from beside this
 * executable, with the same arguments. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cmd_bench_launch(int argc, char **argv) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    fprintf(stderr, "openinfer bench: cannot find this executable (/proc/self/exe)\n");
    return CLI_FAILED;
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (slash) slash[1] = '\0';
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%sopeninfer-bench", slash ? self : "./");
  if (access(path, X_OK) != 0) {
    fprintf(stderr,
            "openinfer bench: the benchmarks are not installed: run them from a build tree\n"
            "  (build/tools/openinfer bench ..., or build/tools/openinfer-bench ...)\n");
    return CLI_FAILED;
  }
  char **args = calloc((size_t)argc + 2, sizeof *args);
  if (!args) return CLI_FAILED;
  args[0] = path;
  for (int i = 0; i < argc; i++)
    args[i + 1] = argv[i]; /* argv[0] is "bench" */
  fflush(NULL);
  execv(path, args);
  perror("openinfer bench: exec openinfer-bench");
  free(args);
  return CLI_FAILED;
}
