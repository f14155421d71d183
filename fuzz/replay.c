/* The regression driver of the fuzz targets: runs LLVMFuzzerTestOneInput
 * over every file of the corpus directories (and files) given as arguments,
 * with the normal compiler, as part of the test suite (suite fuzz-replay).
 * A target's property failure aborts, which fails the test. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    fclose(f);
    free(buf);
    return 1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  return 0;
}

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  size_t files = 0;
  int errors = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      errors += run_file(argv[i]);
      files++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (!d) return 1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
      if (de->d_name[0] == '.') continue;
      if (n == cap) {
        cap = cap ? 2 * cap : 64;
        names = realloc(names, cap * sizeof *names);
        if (!names) return 1;
      }
      size_t len = strlen(argv[i]) + strlen(de->d_name) + 2;
      names[n] = malloc(len);
      if (!names[n]) return 1;
      snprintf(names[n++], len, "%s/%s", argv[i], de->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp); /* a stable order: failures reproduce */
    for (size_t k = 0; k < n; k++) {
      errors += run_file(names[k]);
      free(names[k]);
    }
    free(names);
    files += n;
  }
  /* An empty run is no test: a corpus went missing. */
  fprintf(stderr, "replay: %zu inputs, %d unreadable\n", files, errors);
  return files == 0 || errors ? 1 : 0;
}
