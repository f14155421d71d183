/* Resolving UCX's functions (lib/cluster/ucx.c) against stand-ins that lack
 * some (tests/cluster/ucp_stub.c): a libucp without ucs_status_string, with
 * libucs named (found there), not named, or not there; a libucp without
 * ucp_worker_arm. Each failure is OI_ERR_UNSUPPORTED naming the library and
 * the missing function, with the table left empty.
 * Arguments: the paths of the two stand-ins (full, lacking ucp_worker_arm). */
#include <dlfcn.h>

#include "cluster/ucx.h"
#include "testutil.h"

static const char *stub_full, *stub_no_arm;

/* Whether every entry of the table is NULL. */
static bool table_empty(const oi_ucx_api *api) {
  void *fns[sizeof(*api) / sizeof(void *)];
  memcpy(fns, api, sizeof fns);
  for (size_t i = 0; i < OI_ARRAY_LEN(fns); i++)
    if (fns[i]) return false;
  return true;
}

static void test_lacks_ucs_status_string(void) {
  oi_ucx_api api;
  /* No libucs to fall back to: the last function is missing. */
  memset(&api, 0x5a, sizeof api);
  CHECK_ST(oi__ucx_open(stub_full, NULL, &api), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), stub_full) != NULL);
  CHECK(strstr(oi_last_error(), "lacks ucs_status_string") != NULL);
  CHECK(strstr(oi_last_error(), "1.13 or later") != NULL);
  CHECK(table_empty(&api));
  /* A libucs that is not there: the same, with the loader's reason. */
  memset(&api, 0x5a, sizeof api);
  CHECK_ST(oi__ucx_open(stub_full, "libucs-absent.so.0", &api), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), "lacks ucs_status_string") != NULL);
  CHECK(strstr(oi_last_error(), "libucs-absent.so.0") != NULL);
  CHECK(table_empty(&api));
}

static void test_ucs_fallback(void) {
  /* libucs named: ucs_status_string comes from it, every ucp_* from the
   * stand-in. */
  void *ucs = dlopen(OI_UCS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (!ucs) {
    fprintf(stderr, "(no %s here: the fallback is not tried)\n", OI_UCS_LIBRARY);
    return;
  }
  oi_ucx_api api;
  REQUIRE(oi__ucx_open(stub_full, OI_UCS_LIBRARY, &api) == OI_OK);
  void *stub = dlopen(stub_full, RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(stub);
  void *got;
  memcpy(&got, &api.ucp_cleanup, sizeof got);
  CHECK(got == dlsym(stub, "ucp_cleanup"));
  memcpy(&got, &api.ucp_worker_set_am_recv_handler, sizeof got);
  CHECK(got == dlsym(stub, "ucp_worker_set_am_recv_handler"));
  memcpy(&got, &api.ucs_status_string, sizeof got);
  CHECK(got == dlsym(ucs, "ucs_status_string"));
  CHECK(strcmp(api.ucs_status_string(UCS_ERR_NO_MEMORY), "Out of memory") == 0);
  dlclose(stub);
  dlclose(ucs);
}

static void test_lacks_a_ucp_function(void) {
  /* One function in the middle of the list missing: named, and only it. */
  oi_ucx_api api;
  memset(&api, 0x5a, sizeof api);
  CHECK_ST(oi__ucx_open(stub_no_arm, OI_UCS_LIBRARY, &api), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), stub_no_arm) != NULL);
  CHECK(strstr(oi_last_error(), "lacks ucp_worker_arm (") != NULL);
  CHECK(strstr(oi_last_error(), "ucp_worker_create") == NULL);
  CHECK(table_empty(&api));
}

int main(int argc, char **argv) {
  REQUIRE(argc == 3);
  stub_full = argv[1];
  stub_no_arm = argv[2];
  RUN_TEST(test_lacks_ucs_status_string);
  RUN_TEST(test_ucs_fallback);
  RUN_TEST(test_lacks_a_ucp_function);
  TEST_EXIT();
}
