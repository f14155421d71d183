/* The arena import verifies the real size of the allocation: a handle whose
 * allocation is smaller than expected is refused (OI_ERR_PROTOCOL) and
 * nothing stays mapped. Against the real server, and against a fake server
 * that hands out an under-sized arena: connect fails, and unregisters. */
#include <pthread.h>

#include "device/device.h"
#include "sidecar_util.h"

static test_server ts;

static void test_import_checks_the_real_size(void) {
  wire_client c;
  REQUIRE(wc_connect(&c, ts.socket) && wc_hello(&c, NULL));
  oi_arena_handle h;
  uint64_t bytes = 0;
  uint32_t inst = wc_register(&c, "import-size", &h, &bytes);
  REQUIRE(inst != 0 && bytes > 0);
  oi_imported_arena *a = NULL;
  CHECK_ST(oi_imported_arena_open(&h, bytes + 1, OI_DEVICE_CPU, &a), OI_ERR_PROTOCOL);
  CHECK(a == NULL);
  CHECK_ST(oi_imported_arena_open(&h, bytes * 2, OI_DEVICE_CPU, &a), OI_ERR_PROTOCOL);
  /* a handle claiming more than the object holds */
  oi_arena_handle lie = h;
  uint64_t claimed;
  memcpy(&claimed, lie.bytes + 8, 8);
  claimed += 4096;
  memcpy(lie.bytes + 8, &claimed, 8);
  CHECK_ST(oi_imported_arena_open(&lie, bytes, OI_DEVICE_CPU, &a), OI_ERR_PROTOCOL);
  CHECK_OK(oi_imported_arena_open(&h, bytes, OI_DEVICE_CPU, &a));
  CHECK(oi_imported_arena_size(a) == bytes);
  oi_imported_arena_close(a);
  wc_close(&c);
}

/* ---- a fake server that allocates too little ------------------------------------------ */

typedef struct fake {
  char path[100];
  int listen_fd;
  bool saw_unregister;
  uint64_t asked;
} fake;

static void *fake_main(void *arg) {
  fake *f = arg;
  int fd = accept(f->listen_fd, NULL, NULL);
  if (fd < 0) return NULL;
  wire_client c;
  memset(&c, 0, sizeof c);
  c.fd = fd;
  oi_dev *dev = NULL;
  void *small = NULL;
  oi__dev_open(OI_DEVICE_CPU, &dev);
  while (wc_recv(&c, 10000) == OI_OK) {
    oiwire_Envelope r;
    memset(&r, 0, sizeof r);
    r.request_id = c.env.request_id;
    switch (c.env.which_body) {
    case oiwire_Envelope_hello_tag:
      r.which_body = oiwire_Envelope_hello_reply_tag;
      r.body.hello_reply.protocol_version = OI_WIRE_PROTOCOL_VERSION;
      r.body.hello_reply.server_epoch = 42;
      break;
    case oiwire_Envelope_register_instance_tag: {
      f->asked = c.env.body.register_instance.arena_size;
      oi_arena_handle h;
      dev->ops->mem_alloc(dev, 4096, OI_MEM_SHAREABLE, &small); /* far too small */
      dev->ops->mem_export(dev, small, &h);
      r.which_body = oiwire_Envelope_register_reply_tag;
      r.body.register_reply.instance_id = 7;
      r.body.register_reply.arena_handle.size = 64;
      memcpy(r.body.register_reply.arena_handle.bytes, h.bytes, 64);
      r.body.register_reply.arena_bytes = f->asked; /* the lie */
      break;
    }
    case oiwire_Envelope_unregister_tag:
      f->saw_unregister = c.env.body.unregister.instance_id == 7;
      oi__wire_set_result(&r, c.env.request_id, OI_OK, "");
      break;
    default: oi__wire_set_result(&r, c.env.request_id, OI_OK, ""); break;
    }
    wc_send(&c, &r, NULL);
  }
  if (small) dev->ops->mem_free(dev, small);
  oi__dev_close(dev);
  wc_close(&c);
  return NULL;
}

static void test_connect_refuses_an_undersized_arena(void) {
  fake f;
  memset(&f, 0, sizeof f);
  snprintf(f.path, sizeof f.path, "%s/fake.sock", ts.dir);
  f.listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", f.path);
  REQUIRE(bind(f.listen_fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  REQUIRE(listen(f.listen_fd, 4) == 0);
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, fake_main, &f) == 0);

  oi_arena_desc a[TL_ARENAS];
  oi_engine_options o;
  tl_options(&o, a, "import-size");
  oi_engine *e = (void *)1;
  oi_imported_arena *arena = (void *)1;
  CHECK_ST(oi_engine_connect(f.path, &o, &e, &arena), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "import") != NULL);
  CHECK(e == NULL && arena == NULL);
  pthread_join(th, NULL);
  CHECK(f.asked > 4096);
  CHECK(f.saw_unregister); /* nothing maps it: the server may free it */
  close(f.listen_fd);
  unlink(f.path);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_import_size OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  REQUIRE(ts_start(&ts, NULL));
  RUN_TEST(test_import_checks_the_real_size);
  RUN_TEST(test_connect_refuses_an_undersized_arena);
  CHECK(ts_stop(&ts));
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
