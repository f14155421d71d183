/* oi_engine_connect and oi_lookup_connect refuse bad
 * options before they talk to any server: too many arenas, an arena with
 * an absolute base, a layout past the address space, names over 255 bytes, control_deadline_ms 0,
 * an arena_size no address holds, an arena whose end wraps, arena_fd for device memory, a device
 * that is not there (engine-owned memory), a socket path too long; and with good options and no
 * server listening (the default socket path too), the connect fails with a message and returns
 * nothing. No server runs in this test. */
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "openinfer/openinfer.h"
#include "testutil.h"

static char g_sock[128]; /* a path where no server listens */

static void opts_for(oi_engine_options *o, oi_arena_desc *a) {
  REQUIRE(oi_engine_options_init(o) == OI_OK);
  memset(a, 0, sizeof *a);
  a->name = "kv";
  a->num_blocks = 8;
  a->bytes_per_block = 4096;
  a->block_stride = 4096;
  a->segments = 1;
  o->namespace_id = "connect-validation";
  o->arenas = a;
  o->num_arenas = 1;
}

/* The call is refused with `want` and a message containing `why`; nothing
 * comes back. */
static void refused(const char *sock, const oi_engine_options *o, bool with_arena, oi_status want,
                    const char *why, int line) {
  oi_engine *e = (oi_engine *)1;
  oi_imported_arena *a = (oi_imported_arena *)1;
  oi_clear_error();
  oi_status st = oi_engine_connect(sock, o, &e, with_arena ? &a : NULL);
  if (st != want || e != NULL || (with_arena && a != NULL) || !strstr(oi_last_error(), why)) {
    fprintf(stderr, "  line %d: connect returned %s (want %s), message \"%s\" (want \"%s\")\n",
            line, oi_status_str(st), oi_status_str(want), oi_last_error(), why);
    oi_test_failures++;
  }
}
#define REFUSED(o, why) refused(g_sock, o, true, OI_ERR_INVALID_ARGUMENT, why, __LINE__)

static void test_bad_options(void) {
  oi_engine_options o, x;
  oi_arena_desc a;
  opts_for(&o, &a);
  x = o, x.num_arenas = 4097;
  REFUSED(&x, "4097 arenas");
  x = o, x.arenas = NULL;
  REFUSED(&x, "no arenas");
  char long_name[258];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  oi_arena_desc b = a;
  b.name = long_name;
  x = o, x.arenas = &b;
  REFUSED(&x, "name is longer than 255 bytes");
  static uint8_t mem[8 * 4096];
  b = a;
  b.base = mem;
  x = o, x.arenas = &b;
  REFUSED(&x, "sets base; a sidecar layout is given by offsets");
  b = a;
  b.num_blocks = UINT64_MAX / 4096 + 2;
  x = o, x.arenas = &b;
  REFUSED(&x, "spans more than the address space");
  /* Past the address space by its offset, by its segment stride, or by a
   * segment offset (separate regions). */
  b = a;
  b.offset = UINT64_MAX - 4096;
  x = o, x.arenas = &b;
  REFUSED(&x, "spans more than the address space");
  b = a;
  b.segments = 3;
  b.segment_stride = UINT64_MAX / 2;
  x = o, x.arenas = &b;
  REFUSED(&x, "spans more than the address space");
  b = a;
  b.segments = 2;
  uint64_t seg_offsets[2] = {0, UINT64_MAX - 100};
  x = o, x.arenas = &b, x.segment_offsets = seg_offsets, x.num_segment_offsets = 2;
  REFUSED(&x, "spans more than the address space");
  x = o, x.instance_name = long_name;
  REFUSED(&x, "instance_name is longer than 255 bytes");
  x = o, x.control_deadline_ms = 0;
  REFUSED(&x, "control_deadline_ms is 0");
  x = o, x.arena_size = UINT64_MAX - 100;
  REFUSED(&x, "is too large");
  /* Engine-owned memory whose end wraps the address space. */
  x = o, x.arena_base = (void *)(UINTPTR_MAX - 4095), x.arena_size = 8 * 4096;
  refused(g_sock, &x, false, OI_ERR_INVALID_ARGUMENT, "wraps around", __LINE__);
  /* arena_fd is cpu memory's way: refused with device memory. */
  x = o, x.arena_base = mem, x.arena_size = sizeof mem, x.device = 0, x.arena_fd = 3;
  refused(g_sock, &x, false, OI_ERR_INVALID_ARGUMENT, "arena_fd is for cpu memory", __LINE__);
  /* Device memory of a device that is not there (no cuda here, or too
   * high an ordinal): its export fails, and so does the connect. */
  int count = 0;
  CHECK_OK(oi_device_count(&count));
  x = o, x.arena_base = mem, x.arena_size = sizeof mem, x.device = count + 2;
  oi_engine *e = (oi_engine *)1;
  CHECK(oi_engine_connect(g_sock, &x, &e, NULL) != OI_OK);
  CHECK(e == NULL && strlen(oi_last_error()) > 0);
  /* A socket path longer than a unix socket's. */
  char long_path[200];
  memset(long_path, 'p', sizeof long_path - 1);
  long_path[0] = '/';
  long_path[sizeof long_path - 1] = '\0';
  refused(long_path, &o, true, OI_ERR_INVALID_ARGUMENT, "longer than", __LINE__);
}

static void test_no_server(void) {
  oi_engine_options o;
  oi_arena_desc a;
  opts_for(&o, &a);
  oi_engine *e = (oi_engine *)1;
  oi_imported_arena *ar = (oi_imported_arena *)1;
  oi_status st = oi_engine_connect(g_sock, &o, &e, &ar);
  CHECK(st != OI_OK && e == NULL && ar == NULL);
  CHECK(strstr(oi_last_error(), g_sock) != NULL);
  /* NULL: the default path ($XDG_RUNTIME_DIR/openinfer.sock), where no
   * server listens either. */
  e = (oi_engine *)1;
  CHECK(oi_engine_connect(NULL, &o, &e, &ar) != OI_OK);
  CHECK(e == NULL && strstr(oi_last_error(), "openinfer.sock") != NULL);

  /* A lookup client: its options first, then no server. */
  oi_lookup_options lo;
  REQUIRE(oi_lookup_options_init(&lo) == OI_OK);
  oi_lookup *c = (oi_lookup *)1;
  CHECK_ST(oi_lookup_connect(g_sock, &lo, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_lookup_connect(g_sock, &lo, &c), OI_ERR_INVALID_ARGUMENT); /* no namespace */
  CHECK(c == NULL);
  lo.namespace_id = "connect-validation";
  lo.control_deadline_ms = 0;
  CHECK_ST(oi_lookup_connect(g_sock, &lo, &c), OI_ERR_INVALID_ARGUMENT);
  lo.control_deadline_ms = 1000;
  CHECK(oi_lookup_connect(g_sock, &lo, &c) != OI_OK);
  CHECK(c == NULL);
  CHECK(oi_lookup_connect(NULL, &lo, &c) != OI_OK);
  CHECK(c == NULL && strstr(oi_last_error(), "openinfer.sock") != NULL);
}

int main(void) {
  char dir[] = "/tmp/oi-connect-XXXXXX";
  REQUIRE(mkdtemp(dir));
  snprintf(g_sock, sizeof g_sock, "%s/none.sock", dir);
  setenv("XDG_RUNTIME_DIR", dir, 1); /* the default path: in this empty directory */
  RUN_TEST(test_bad_options);
  RUN_TEST(test_no_server);
  rmdir(dir);
  TEST_EXIT();
}
