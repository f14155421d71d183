/* Status names, the thread-local last error, and the version functions. */
#include <pthread.h>
#include <stdint.h>

#include "core/core.h"
#include "testutil.h"

#define STATUS(x)                                                                                  \
  { x, #x }
static const struct {
  oi_status st;
  const char *name;
} all_statuses[] = {
    STATUS(OI_OK),
    STATUS(OI_PENDING),
    STATUS(OI_FENCING),
    STATUS(OI_ERR_INVALID_ARGUMENT),
    STATUS(OI_ERR_NOT_FOUND),
    STATUS(OI_ERR_OUT_OF_MEMORY),
    STATUS(OI_ERR_TIMEOUT),
    STATUS(OI_ERR_CUDA),
    STATUS(OI_ERR_IO),
    STATUS(OI_ERR_PROTOCOL),
    STATUS(OI_ERR_STATE),
    STATUS(OI_ERR_LEASE_EXPIRED),
    STATUS(OI_ERR_CLOSED),
    STATUS(OI_ERR_UNSUPPORTED),
    STATUS(OI_ERR_PERMISSION),
    STATUS(OI_ERR_VERSION),
    STATUS(OI_ERR_INTERNAL),
    STATUS(OI_ERR_NO_DEVICE),
    STATUS(OI_ERR_BUSY),
    STATUS(OI_ERR_DEADLINE),
};

static void every_status_code_has_its_own_name(void) {
  /* The enum is dense from OI_ERR_DEADLINE to OI_FENCING: the table covers it. */
  CHECK(OI_ARRAY_LEN(all_statuses) == (size_t)(OI_FENCING - OI_ERR_DEADLINE + 1));
  for (size_t i = 0; i < OI_ARRAY_LEN(all_statuses); i++) {
    const char *name = oi_status_str(all_statuses[i].st);
    REQUIRE(name != NULL);
    if (strcmp(name, all_statuses[i].name) != 0) {
      fprintf(stderr, "status %d: name \"%s\", expected \"%s\"\n", (int)all_statuses[i].st, name,
              all_statuses[i].name);
      oi_test_failures++;
    }
    CHECK(strcmp(name, "OI_ERR_UNKNOWN") != 0);
    for (size_t j = 0; j < i; j++)
      CHECK(strcmp(name, oi_status_str(all_statuses[j].st)) != 0);
  }
}

static void unknown_status_values_are_named_unknown(void) {
  const oi_status unknown[] = {3, 4, 100, OI_ERR_DEADLINE - 1, -100, INT32_MAX, INT32_MIN};
  for (size_t i = 0; i < OI_ARRAY_LEN(unknown); i++) {
    const char *name = oi_status_str(unknown[i]);
    REQUIRE(name != NULL);
    CHECK(strcmp(name, "OI_ERR_UNKNOWN") == 0);
  }
}

static void fail_records_the_message_and_returns_the_status(void) {
  oi_clear_error();
  CHECK(strcmp(oi_last_error(), "") == 0);
  CHECK_ST(oi__fail(OI_ERR_IO, "read %s: %d bytes short", "blk", 42), OI_ERR_IO);
  CHECK(strcmp(oi_last_error(), "read blk: 42 bytes short") == 0);
  /* A later failure replaces the message. */
  CHECK_ST(oi__fail(OI_ERR_PROTOCOL, "second"), OI_ERR_PROTOCOL);
  CHECK(strcmp(oi_last_error(), "second") == 0);
}

static void clear_error_empties_the_last_error(void) {
  oi__fail(OI_ERR_STATE, "something went wrong");
  REQUIRE(oi_last_error()[0] != '\0');
  oi_clear_error();
  CHECK(oi_last_error() != NULL);
  CHECK(strcmp(oi_last_error(), "") == 0);
}

static void overlong_message_is_truncated_not_overflowed(void) {
  char big[4096];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  CHECK_ST(oi__fail(OI_ERR_INTERNAL, "%s", big), OI_ERR_INTERNAL);
  size_t len = strlen(oi_last_error());
  CHECK(len > 0 && len < sizeof big - 1);
  CHECK(strncmp(oi_last_error(), big, len) == 0);
  oi_clear_error();
}

/* ---- thread-local last error --------------------------------------------- */

static pthread_barrier_t barrier;

struct thread_result {
  const char *msg;     /* what this thread sets */
  int empty_at_start;  /* a new thread starts with no last error */
  int returned_status; /* oi__fail's return value */
  char seen[256];      /* what it reads back after the other thread set its own */
};

static void *set_and_read(void *arg) {
  struct thread_result *r = arg;
  r->empty_at_start = strcmp(oi_last_error(), "") == 0;
  r->returned_status = oi__fail(OI_ERR_BUSY, "%s", r->msg);
  /* Both threads have set their message before either reads it back. */
  pthread_barrier_wait(&barrier);
  snprintf(r->seen, sizeof r->seen, "%s", oi_last_error());
  return NULL;
}

static void last_error_is_thread_local(void) {
  oi__fail(OI_ERR_IO, "main thread message");
  REQUIRE(pthread_barrier_init(&barrier, NULL, 2) == 0);
  struct thread_result r1 = {.msg = "thread one failed"}, r2 = {.msg = "thread two failed"};
  pthread_t t1, t2;
  REQUIRE(pthread_create(&t1, NULL, set_and_read, &r1) == 0);
  REQUIRE(pthread_create(&t2, NULL, set_and_read, &r2) == 0);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  pthread_barrier_destroy(&barrier);

  CHECK(r1.empty_at_start);
  CHECK(r2.empty_at_start);
  CHECK(r1.returned_status == OI_ERR_BUSY);
  CHECK(r2.returned_status == OI_ERR_BUSY);
  CHECK(strcmp(r1.seen, "thread one failed") == 0);
  CHECK(strcmp(r2.seen, "thread two failed") == 0);
  CHECK(strcmp(oi_last_error(), "main thread message") == 0);
  oi_clear_error();
}

/* ---- version -------------------------------------------------------------- */

static void version_matches_the_header(void) {
  CHECK(oi_version() == (uint32_t)OI_VERSION_NUMBER);
  CHECK(oi_version() == (((uint32_t)OI_VERSION_MAJOR << 16) | ((uint32_t)OI_VERSION_MINOR << 8) |
                         (uint32_t)OI_VERSION_PATCH));

  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", OI_VERSION_MAJOR, OI_VERSION_MINOR,
           OI_VERSION_PATCH);
  const char *vs = oi_version_string();
  REQUIRE(vs != NULL);
  size_t n = strlen(expected);
  CHECK(strncmp(vs, expected, n) == 0);
  /* Then " (<backends>)": "0.1.0" must not be the prefix of a longer number
   * such as "0.1.01". */
  size_t len = strlen(vs);
  CHECK(len > n + 3 && vs[n] == ' ' && vs[n + 1] == '(' && vs[len - 1] == ')');
}

int main(void) {
  RUN_TEST(every_status_code_has_its_own_name);
  RUN_TEST(unknown_status_values_are_named_unknown);
  RUN_TEST(fail_records_the_message_and_returns_the_status);
  RUN_TEST(clear_error_empties_the_last_error);
  RUN_TEST(overlong_message_is_truncated_not_overflowed);
  RUN_TEST(last_error_is_thread_local);
  RUN_TEST(version_matches_the_header);
  TEST_EXIT();
}
