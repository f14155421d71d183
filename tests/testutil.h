/* Minimal test harness: each test is a standalone program, exit 0 = pass,
 * 1 = fail, 77 = skip (meson and automake convention). */
#ifndef OI_TESTUTIL_H
#define OI_TESTUTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "openinfer/openinfer.h"

static int oi_test_failures;

/* Removes a test's scratch directory and what it holds, its
 * subdirectories' too (names starting with '.' are left: rmdir then
 * fails). @return rmdir's result (0: gone). */
static inline int tu_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *de;
    char p[1024];
    while ((de = readdir(d)))
      if (de->d_name[0] != '.') {
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= sizeof p) continue;
        if (de->d_type == DT_DIR)
          tu_remove_dir(p);
        else
          unlink(p);
      }
    closedir(d);
  }
  return rmdir(dir);
}

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond,     \
              oi_last_error());                                                                    \
      oi_test_failures++;                                                                          \
    }                                                                                              \
  } while (0)

#define CHECK_ST(expr, expected)                                                                   \
  do {                                                                                             \
    oi_status st_ = (expr);                                                                        \
    if (st_ != (expected)) {                                                                       \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, __LINE__, \
              #expr, oi_status_str(st_), oi_status_str(expected), oi_last_error());                \
      oi_test_failures++;                                                                          \
    }                                                                                              \
  } while (0)

#define CHECK_OK(expr) CHECK_ST(expr, OI_OK)

/* Fatal variant: stops the test when a precondition fails. */
#define REQUIRE(cond)                                                                              \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond,   \
              oi_last_error());                                                                    \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#define RUN_TEST(fn)                                                                               \
  do {                                                                                             \
    int before_ = oi_test_failures;                                                                \
    fn();                                                                                          \
    fprintf(stderr, "%-60s %s\n", #fn, oi_test_failures == before_ ? "ok" : "FAILED");             \
  } while (0)

#define TEST_EXIT() return oi_test_failures ? 1 : 0
#define TEST_SKIP(why)                                                                             \
  do {                                                                                             \
    fprintf(stderr, "SKIP: %s\n", why);                                                            \
    return 77;                                                                                     \
  } while (0)

#endif
