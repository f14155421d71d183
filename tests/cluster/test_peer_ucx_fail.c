/* The peer transport when UCX calls fail (lib/cluster/peer*.c). The test
 * puts stand-ins into the table of UCX functions (oi__ucx, lib/cluster/ucx.h)
 * once, before its first net; each forwards to UCX unless the test has
 * armed it (`fail`, a mask), and then returns the status UCX gives for such
 * a failure. Covered: every step of creating a net (configuration read and
 * modified, init) and of a connection's own worker (created, message
 * handlers, event fd, address), an endpoint that cannot be created, a
 * send that fails, a
 * worker that cannot be armed, a region that cannot be registered (mapped,
 * its key packed, a key too large), a region key that does not unpack,
 * one-sided and served reads that fail. Each ends with the status and the
 * message the transport documents, and the net works afterwards.
 */
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cluster/peer.h"
#include "cluster/peer_wire.h"
#include "cluster/ucx.h"
#include "core/core.h"
#include "testutil.h"

static const uint8_t SECRET[] = "cluster secret: thirty-two bytes";

enum {
  F_CONFIG_READ = 1 << 0,
  F_CONFIG_MODIFY = 1 << 1,
  F_INIT = 1 << 2,
  F_WORKER = 1 << 3,
  F_HANDLER = 1 << 4, /* the handler of OI_PEER_AM_AUTH (after two were set) */
  F_EFD = 1 << 5,
  F_WORKER_ADDR = 1 << 6,
  F_CONNECT_EP = 1 << 7, /* every endpoint: `fail_status` */
  F_SEND_REQ = 1 << 10,
  F_ARM = 1 << 11,
  F_ARM_BUSY = 1 << 12,
  F_RKEY_UNPACK = 1 << 13,
  F_MEM_MAP = 1 << 14,
  F_RKEY_PACK = 1 << 15,
  F_RKEY_BIG = 1 << 16,
  F_GET = 1 << 17,
  F_RECV_DATA = 1 << 18,
};

static oi_ucx_api real;
static atomic_uint fail;
static _Atomic ucs_status_t fail_status;
static atomic_uint arm_calls, recv_data_calls;

static bool armed(unsigned f) { return (atomic_load(&fail) & f) != 0; }

static ucs_status_t st_config_read(const char *prefix, const char *file, ucp_config_t **cfg) {
  if (armed(F_CONFIG_READ)) return UCS_ERR_NO_MEMORY;
  return real.ucp_config_read(prefix, file, cfg);
}

static ucs_status_t st_config_modify(ucp_config_t *cfg, const char *name, const char *value) {
  if (armed(F_CONFIG_MODIFY)) return UCS_ERR_NO_ELEM;
  return real.ucp_config_modify(cfg, name, value);
}

static ucs_status_t st_init_version(unsigned major, unsigned minor, const ucp_params_t *params,
                                    const ucp_config_t *cfg, ucp_context_h *ctx) {
  if (armed(F_INIT)) return UCS_ERR_UNSUPPORTED;
  return real.ucp_init_version(major, minor, params, cfg, ctx);
}

static atomic_uint worker_tries; /* ucp_worker_create calls, failed or not */

static ucs_status_t st_worker_create(ucp_context_h ctx, const ucp_worker_params_t *p,
                                     ucp_worker_h *w) {
  atomic_fetch_add(&worker_tries, 1);
  if (armed(F_WORKER)) return UCS_ERR_NO_RESOURCE;
  return real.ucp_worker_create(ctx, p, w);
}

static ucs_status_t st_set_handler(ucp_worker_h w, const ucp_am_handler_param_t *p) {
  if (armed(F_HANDLER) && p->id == OI_PEER_AM_AUTH) return UCS_ERR_INVALID_PARAM;
  return real.ucp_worker_set_am_recv_handler(w, p);
}

static ucs_status_t st_get_efd(ucp_worker_h w, int *fd) {
  if (armed(F_EFD)) return UCS_ERR_IO_ERROR;
  return real.ucp_worker_get_efd(w, fd);
}

static ucs_status_t st_ep_create(ucp_worker_h w, const ucp_ep_params_t *p, ucp_ep_h *ep) {
  if (armed(F_CONNECT_EP)) return atomic_load(&fail_status);
  return real.ucp_ep_create(w, p, ep);
}

static ucs_status_t st_worker_address(ucp_worker_h w, ucp_address_t **a, size_t *len) {
  if (armed(F_WORKER_ADDR)) return UCS_ERR_NO_MEMORY;
  return real.ucp_worker_get_address(w, a, len);
}

static ucs_status_ptr_t st_am_send(ucp_ep_h ep, unsigned id, const void *hdr, size_t hlen,
                                   const void *buf, size_t len, const ucp_request_param_t *p) {
  if (armed(F_SEND_REQ) && id == OI_PEER_AM_REQ) return UCS_STATUS_PTR(UCS_ERR_CONNECTION_RESET);
  return real.ucp_am_send_nbx(ep, id, hdr, hlen, buf, len, p);
}

static ucs_status_t st_worker_arm(ucp_worker_h w) {
  if (armed(F_ARM | F_ARM_BUSY)) {
    atomic_fetch_add(&arm_calls, 1);
    return armed(F_ARM) ? UCS_ERR_IO_ERROR : UCS_ERR_BUSY;
  }
  return real.ucp_worker_arm(w);
}

static ucs_status_t st_rkey_unpack(ucp_ep_h ep, const void *buf, ucp_rkey_h *rkey) {
  if (armed(F_RKEY_UNPACK)) return UCS_ERR_INVALID_PARAM;
  return real.ucp_ep_rkey_unpack(ep, buf, rkey);
}

static ucs_status_t st_mem_map(ucp_context_h ctx, const ucp_mem_map_params_t *p, ucp_mem_h *m) {
  if (armed(F_MEM_MAP)) return UCS_ERR_NO_MEMORY;
  return real.ucp_mem_map(ctx, p, m);
}

static ucs_status_t st_rkey_pack(ucp_context_h ctx, ucp_mem_h m, void **buf, size_t *len) {
  if (armed(F_RKEY_PACK)) return UCS_ERR_UNSUPPORTED;
  ucs_status_t s = real.ucp_rkey_pack(ctx, m, buf, len);
  if (s == UCS_OK && armed(F_RKEY_BIG)) *len = OI_PEER_MAX_RKEY + 1;
  return s;
}

static ucs_status_ptr_t st_get(ucp_ep_h ep, void *buf, size_t n, uint64_t raddr, ucp_rkey_h rkey,
                               const ucp_request_param_t *p) {
  if (armed(F_GET)) return UCS_STATUS_PTR(UCS_ERR_NO_MEMORY);
  return real.ucp_get_nbx(ep, buf, n, raddr, rkey, p);
}

static atomic_uint unseen; /* receives the stand-in made, still in flight */

static void unseen_cb(void *request, ucs_status_t status, size_t length, void *user) {
  OI_UNUSED(status);
  OI_UNUSED(length);
  OI_UNUSED(user);
  real.ucp_request_free(request);
  atomic_fetch_sub(&unseen, 1);
}

static ucs_status_ptr_t st_recv_data(ucp_worker_h w, void *desc, void *buf, size_t n,
                                     const ucp_request_param_t *p) {
  atomic_fetch_add(&recv_data_calls, 1);
  if (armed(F_RECV_DATA)) {
    /* The receive goes ahead unseen by the transport (UCX releases the
     * message when it ends), which is told it failed. */
    ucp_request_param_t q = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.recv_am = unseen_cb};
    atomic_fetch_add(&unseen, 1);
    ucs_status_ptr_t r = real.ucp_am_recv_data_nbx(w, desc, buf, n, &q);
    if (!UCS_PTR_IS_PTR(r)) atomic_fetch_sub(&unseen, 1);
    return UCS_STATUS_PTR(UCS_ERR_IO_ERROR);
  }
  return real.ucp_am_recv_data_nbx(w, desc, buf, n, p);
}

static void install(void) {
  REQUIRE(oi__ucx_load() == OI_OK);
  real = oi__ucx;
  /* No net exists yet: nothing reads the table while it changes. */
  oi__ucx.ucp_config_read = st_config_read;
  oi__ucx.ucp_config_modify = st_config_modify;
  oi__ucx.ucp_init_version = st_init_version;
  oi__ucx.ucp_worker_create = st_worker_create;
  oi__ucx.ucp_worker_set_am_recv_handler = st_set_handler;
  oi__ucx.ucp_worker_get_efd = st_get_efd;
  oi__ucx.ucp_worker_get_address = st_worker_address;
  oi__ucx.ucp_ep_create = st_ep_create;
  oi__ucx.ucp_am_send_nbx = st_am_send;
  oi__ucx.ucp_worker_arm = st_worker_arm;
  oi__ucx.ucp_ep_rkey_unpack = st_rkey_unpack;
  oi__ucx.ucp_mem_map = st_mem_map;
  oi__ucx.ucp_rkey_pack = st_rkey_pack;
  oi__ucx.ucp_get_nbx = st_get;
  oi__ucx.ucp_am_recv_data_nbx = st_recv_data;
}

static void echo(void *ctx, const char *peer_id, const void *req, size_t len, oi_peer_reply *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(peer_id);
  oi__peer_reply_set(r, req, len);
}

static oi_peer_net_options opts_of(const char *id, int reads, uint32_t timeout_ms) {
  return (oi_peer_net_options){.listen_addr = "127.0.0.1:0",
                               .node_id = id,
                               .secret = SECRET,
                               .secret_len = 32,
                               .timeout_ms = timeout_ms,
                               .on_request = echo,
                               .reads = reads};
}

static oi_peer_net *make_net(const char *id, int reads, uint32_t timeout_ms) {
  oi_peer_net_options o = opts_of(id, reads, timeout_ms);
  oi_peer_net *n = NULL;
  oi_status st = oi__peer_net_create(&o, &n);
  if (st) fprintf(stderr, "net %s: %s\n", id, oi_last_error());
  REQUIRE(st == OI_OK && n);
  return n;
}

static oi_peer *connect_to(oi_peer_net *from, oi_peer_net *to) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(to));
  oi_peer *p = NULL;
  oi_status st = oi__peer_connect(from, addr, &p);
  if (st) fprintf(stderr, "connect: %s\n", oi_last_error());
  REQUIRE(st == OI_OK && p);
  return p;
}

/* A call that must be echoed. */
static bool echoed(oi_peer *p, const char *what) {
  void *rep = NULL;
  size_t rl = 0;
  oi_status st = oi__peer_call(p, what, strlen(what), &rep, &rl, 0);
  bool ok = st == OI_OK && rl == strlen(what) && memcmp(rep, what, rl) == 0;
  if (!ok) fprintf(stderr, "call '%s': %s (%s)\n", what, oi_status_str(st), oi_last_error());
  oi__free(rep);
  return ok;
}

static oi_peer_stats stats_of(oi_peer_net *n) {
  oi_peer_stats s;
  oi__peer_net_stats(n, &s);
  return s;
}

static void test_create_fails(void) {
  const struct {
    unsigned f;
    ucs_status_t st; /* the one the stand-in returns */
    const char *why;
  } cases[] = {
      {F_CONFIG_READ, UCS_ERR_NO_MEMORY, "reading the UCX configuration"},
      {F_INIT, UCS_ERR_UNSUPPORTED, "initializing UCX"},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    atomic_store(&fail, cases[i].f);
    oi_peer_net_options o = opts_of("node-a", OI_PEER_READS_AM, 1000);
    oi_peer_net *n = (oi_peer_net *)1;
    oi_status st = oi__peer_net_create(&o, &n);
    atomic_store(&fail, 0);
    const char *e = oi_last_error();
    if (st != OI_ERR_IO || n != NULL || !strstr(e, cases[i].why) ||
        !strstr(e, real.ucs_status_string(cases[i].st))) {
      fprintf(stderr, "case %zu: %s (%s)\n", i, oi_status_str(st), e);
      CHECK(false);
    }
  }
  /* Nothing was left behind: a net is made and answers (these two make
   * each connection's worker when it is made, not ahead). */
  oi_peer_net_options oa = opts_of("node-a", OI_PEER_READS_AM, 2000),
                      ob = opts_of("node-b", OI_PEER_READS_AM, 2000);
  oa.no_spare_worker = ob.no_spare_worker = true;
  oi_peer_net *a = NULL, *b = NULL;
  REQUIRE(oi__peer_net_create(&oa, &a) == OI_OK && oi__peer_net_create(&ob, &b) == OI_OK);
  CHECK(echoed(connect_to(b, a), "after"));
  /* A connection's own worker (each side makes one once authenticated)
   * fails at each step: the connect fails naming it, the next one works. */
  const unsigned wcases[] = {F_WORKER, F_HANDLER, F_EFD, F_WORKER_ADDR};
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  /* (The server makes its worker first: it refuses, counted, and resets
   * the client's socket.) */
  for (size_t i = 0; i < OI_ARRAY_LEN(wcases); i++) {
    uint64_t refused = stats_of(a).refused;
    atomic_store(&fail, wcases[i]);
    oi_peer *p = (oi_peer *)1;
    oi_status st = oi__peer_connect(b, addr, &p);
    atomic_store(&fail, 0);
    const char *e = oi_last_error();
    if (st != OI_ERR_IO || p != NULL || stats_of(a).refused != refused + 1) {
      fprintf(stderr, "worker case %zu: %s (%s)\n", i, oi_status_str(st), e);
      CHECK(false);
    }
    CHECK(echoed(connect_to(b, a), "again"));
  }
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The worker each net makes ahead while idle: a connection takes one on
 * each side (so it connects while making workers fails); the next spare
 * fails and is tried again a second later, and a connection meanwhile makes
 * its own (and fails, naming it); once workers can be made, spares come
 * back and connections work. */
static void test_spare_workers(void) {
  unsigned before = atomic_load(&worker_tries);
  oi_peer_net *a = make_net("node-a", OI_PEER_READS_AM, 2000);
  oi_peer_net *b = make_net("node-b", OI_PEER_READS_AM, 2000);
  for (int i = 0; i < 300 && atomic_load(&worker_tries) < before + 2; i++)
    sleep_ms(10);
  sleep_ms(50);
  CHECK(atomic_load(&worker_tries) == before + 2); /* one spare each, made while idle */
  atomic_store(&fail, F_WORKER);
  oi_peer *p = connect_to(b, a); /* the spares: nothing made now */
  CHECK(echoed(p, "on the spares"));
  for (int i = 0; i < 300 && atomic_load(&worker_tries) < before + 4; i++)
    sleep_ms(10);
  CHECK(atomic_load(&worker_tries) >= before + 4); /* the next spares tried, and failed */
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  oi_peer *q = (oi_peer *)1;
  CHECK(oi__peer_connect(b, addr, &q) == OI_ERR_IO && q == NULL);
  CHECK(echoed(p, "still"));
  atomic_store(&fail, 0);
  sleep_ms(1300); /* past the retry: spares again */
  oi_peer *r = connect_to(b, a);
  CHECK(echoed(r, "again"));
  oi__peer_close(r);
  oi__peer_close(p);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
}

static void test_config_modify_fails(void) {
  /* UCX refuses every setting (TCP put off, segment sizes): a warning each,
   * and a net that works with UCX's defaults. With the environment's
   * segment size and OI_PEER_TCP_PUT=1 nothing is asked of UCX for those. */
  /* The environment changes while net a runs: neither net makes a spare
   * worker ahead, since a worker reads UCX_* variables on its thread while
   * setenv may move them (a race tsan saw). Workers are made at connect,
   * after the last change. */
  atomic_store(&fail, F_CONFIG_MODIFY);
  oi_peer_net_options oa = opts_of("node-a", OI_PEER_READS_AM, 2000),
                      ob = opts_of("node-b", OI_PEER_READS_AM, 2000);
  oa.no_spare_worker = ob.no_spare_worker = true;
  oi_peer_net *a = NULL, *b = NULL;
  REQUIRE(oi__peer_net_create(&oa, &a) == OI_OK);
  setenv("UCX_TCP_TX_SEG_SIZE", "64k", 1);
  setenv("OI_PEER_TCP_PUT", "1", 1);
  REQUIRE(oi__peer_net_create(&ob, &b) == OI_OK);
  unsetenv("UCX_TCP_TX_SEG_SIZE");
  unsetenv("OI_PEER_TCP_PUT");
  atomic_store(&fail, 0);
  oi_peer *p = connect_to(b, a);
  CHECK(echoed(p, "defaults"));
  static uint8_t region[1 << 16], dst[1 << 16];
  for (size_t i = 0; i < sizeof region; i++)
    region[i] = (uint8_t)(i * 13 + 1);
  CHECK_OK(oi__peer_net_register(a, region, sizeof region));
  oi__peer_close(p);
  p = connect_to(b, a);
  oi_peer_read r = {.remote_offset = 0, .len = sizeof dst, .local_dst = dst};
  CHECK_OK(oi__peer_get(p, &r, 1, 0));
  CHECK(memcmp(dst, region, sizeof dst) == 0);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
}

static void test_endpoint_fails(void) {
  oi_peer_net *a = make_net("node-a", OI_PEER_READS_AM, 2000);
  oi_peer_net *b = make_net("node-b", OI_PEER_READS_AM, 300);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  /* Outbound: UCX's status, mapped. */
  const struct {
    ucs_status_t ucs;
    oi_status want;
  } cases[] = {{UCS_ERR_NO_MEMORY, OI_ERR_OUT_OF_MEMORY},
               {UCS_ERR_TIMED_OUT, OI_ERR_TIMEOUT},
               {UCS_ERR_CANCELED, OI_ERR_CLOSED},
               {UCS_ERR_UNREACHABLE, OI_ERR_IO}};
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    atomic_store(&fail_status, cases[i].ucs);
    atomic_store(&fail, F_CONNECT_EP);
    oi_peer *p = (oi_peer *)1;
    oi_status st = oi__peer_connect(b, addr, &p);
    atomic_store(&fail, 0);
    const char *e = oi_last_error();
    if (st != cases[i].want || p != NULL || !strstr(e, "creating an endpoint") ||
        !strstr(e, real.ucs_status_string(cases[i].ucs)) || !strstr(e, addr)) {
      fprintf(stderr, "case %zu: %s (%s)\n", i, oi_status_str(st), e);
      CHECK(false);
    }
  }
  CHECK(stats_of(b).connect_fails == OI_ARRAY_LEN(cases));
  CHECK(stats_of(a).accepted == 0);
  oi_peer *p = connect_to(b, a);
  CHECK(echoed(p, "accepted"));
  CHECK(stats_of(a).accepted == 1);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
}

static void test_send_fails(void) {
  /* The request's send fails: the call fails OI_ERR_IO naming UCX's
   * reason, the connection is dead, a new one works. */
  oi_peer_net *a = make_net("node-a", OI_PEER_READS_AM, 2000);
  oi_peer_net *b = make_net("node-b", OI_PEER_READS_AM, 2000);
  oi_peer *p = connect_to(b, a);
  CHECK(echoed(p, "before"));
  atomic_store(&fail, F_SEND_REQ);
  void *rep = NULL;
  size_t rl = 0;
  CHECK_ST(oi__peer_call(p, "lost", 4, &rep, &rl, 0), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "sending") &&
        strstr(oi_last_error(), real.ucs_status_string(UCS_ERR_CONNECTION_RESET)));
  CHECK(rep == NULL && rl == 0);
  atomic_store(&fail, 0);
  CHECK_ST(oi__peer_call(p, "after", 5, &rep, &rl, 0), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "closed"));
  CHECK(stats_of(b).errors >= 1);
  oi__peer_close(p);
  CHECK(echoed(connect_to(b, a), "new"));
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
}

static atomic_uint arm_lines;

static void count_arm_lines(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  (void)level;
  if (strstr(line, "arming the worker")) atomic_fetch_add(&arm_lines, 1);
}

static void test_arm_fails(void) {
  /* The worker cannot be armed (an error, or busy every time): the progress
   * thread polls; calls are answered all the same. An error is logged at
   * its first failure and then at most once a second, not once a loop. */
  const unsigned modes[] = {F_ARM, F_ARM_BUSY};
  oi_set_log_handler(count_arm_lines, NULL);
  for (size_t m = 0; m < OI_ARRAY_LEN(modes); m++) {
    oi_peer_net *a = make_net("node-a", OI_PEER_READS_AM, 2000);
    oi_peer_net *b = make_net("node-b", OI_PEER_READS_AM, 2000);
    oi_peer *p = connect_to(b, a);
    atomic_store(&arm_calls, 0);
    atomic_store(&arm_lines, 0);
    atomic_store(&fail, modes[m]);
    uint64_t t0 = oi__now_ns();
    for (int i = 0; i < 10; i++) {
      char msg[16];
      snprintf(msg, sizeof msg, "call %d", i);
      CHECK(echoed(p, msg));
    }
    while (oi__now_ns() - t0 < 300000000ull) { /* a few hundred failed arms */
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
    atomic_store(&fail, 0);
    uint64_t secs = (oi__now_ns() - t0) / 1000000000ull;
    CHECK(atomic_load(&arm_calls) > 20);
    if (modes[m] == F_ARM) { /* one line at first, then one a second at most (each net) */
      CHECK(atomic_load(&arm_lines) >= 1);
      CHECK(atomic_load(&arm_lines) <= 2 * (secs + 2));
    } else {
      CHECK(atomic_load(&arm_lines) == 0); /* busy is not an error */
    }
    oi__peer_net_destroy(b);
    oi__peer_net_destroy(a);
  }
  oi_set_log_handler(NULL, NULL);
}

static void test_region_fails(void) {
  oi_peer_net *a = make_net("node-a", OI_PEER_READS_RMA, 2000);
  oi_peer_net *b = make_net("node-b", OI_PEER_READS_RMA, 2000);
  static uint8_t region[1 << 16];
  for (size_t i = 0; i < sizeof region; i++)
    region[i] = (uint8_t)(i * 5 + 7);
  /* Registering: mapping fails, packing the key fails, a key too large. */
  const struct {
    unsigned f;
    oi_status want;
    ucs_status_t ucs;
  } cases[] = {{F_MEM_MAP, OI_ERR_OUT_OF_MEMORY, UCS_ERR_NO_MEMORY},
               {F_RKEY_PACK, OI_ERR_IO, UCS_ERR_UNSUPPORTED},
               {F_RKEY_BIG, OI_ERR_IO, UCS_ERR_EXCEEDS_LIMIT}};
  for (size_t i = 0; i < OI_ARRAY_LEN(cases); i++) {
    atomic_store(&fail, cases[i].f);
    oi_status st = oi__peer_net_register(a, region, sizeof region);
    atomic_store(&fail, 0);
    const char *e = oi_last_error();
    if (st != cases[i].want || !strstr(e, "registering 65536 bytes") ||
        !strstr(e, real.ucs_status_string(cases[i].ucs))) {
      fprintf(stderr, "case %zu: %s (%s)\n", i, oi_status_str(st), e);
      CHECK(false);
    }
  }
  /* Nothing stayed registered: now it is. */
  CHECK_OK(oi__peer_net_register(a, region, sizeof region));
  /* The holder's key does not unpack at the reader: the connect fails. */
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(a));
  atomic_store(&fail, F_RKEY_UNPACK);
  oi_peer *p = (oi_peer *)1;
  CHECK_ST(oi__peer_connect(b, addr, &p), OI_ERR_PROTOCOL);
  atomic_store(&fail, 0);
  CHECK(p == NULL && strstr(oi_last_error(), "unpacking the region key"));
  /* One-sided reads that UCX refuses to issue: the get fails with UCX's
   * status, mapped; the connection still reads afterwards. */
  p = connect_to(b, a);
  static uint8_t dst[2][4096];
  oi_peer_read r[2] = {{0, 4096, dst[0]}, {8192, 4096, dst[1]}};
  atomic_store(&fail, F_GET);
  CHECK_ST(oi__peer_get(p, r, 2, 0), OI_ERR_OUT_OF_MEMORY);
  atomic_store(&fail, 0);
  CHECK(strstr(oi_last_error(), "read failed") &&
        strstr(oi_last_error(), real.ucs_status_string(UCS_ERR_NO_MEMORY)));
  CHECK_OK(oi__peer_get(p, r, 2, 0));
  CHECK(memcmp(dst[0], region, 4096) == 0 && memcmp(dst[1], region + 8192, 4096) == 0);
  /* An empty read among one-sided ones: nothing asked of UCX for it (with
   * gets refused, a get of empty reads alone succeeds). */
  oi_peer_read empty[2] = {{4096, 0, NULL}, {0, 0, NULL}};
  atomic_store(&fail, F_GET);
  CHECK_OK(oi__peer_get(p, empty, 2, 0));
  atomic_store(&fail, 0);
  /* A reader without one-sided reads (OI_PEER_READS_AM) of a holder that
   * offers them: it asks the holder, which serves them, byte-exact, and
   * refused one-sided gets do not matter. */
  oi_peer_net *c = make_net("node-c", OI_PEER_READS_AM, 2000);
  oi_peer *q = connect_to(c, a);
  memset(dst, 0, sizeof dst);
  atomic_store(&fail, F_GET);
  CHECK_OK(oi__peer_get(q, r, 2, 0));
  atomic_store(&fail, 0);
  CHECK(memcmp(dst[0], region, 4096) == 0 && memcmp(dst[1], region + 8192, 4096) == 0);
  CHECK(stats_of(a).bytes_served == 8192);
  oi__peer_net_destroy(c);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
}

static void test_reads_by_environment(void) {
  /* OI_PEER_READS=rma makes an AUTO net read one-sided (refused gets fail
   * its reads); an unknown value leaves AUTO (no RDMA device here: served
   * reads, which refused gets do not touch). */
  static uint8_t region[1 << 14];
  for (size_t i = 0; i < sizeof region; i++)
    region[i] = (uint8_t)(i * 3 + 1);
  const char *modes[] = {"rma", "bogus"};
  for (size_t m = 0; m < OI_ARRAY_LEN(modes); m++) {
    /* (Changed only while no net runs: a net's thread reads UCX_*
     * variables while it makes a worker.) */
    setenv("OI_PEER_READS", modes[m], 1);
    oi_peer_net *a = make_net("node-a", OI_PEER_READS_AUTO, 2000);
    oi_peer_net *b = make_net("node-b", OI_PEER_READS_AUTO, 2000);
    CHECK_OK(oi__peer_net_register(a, region, sizeof region));
    oi_peer *p = connect_to(b, a);
    static uint8_t dst[1 << 14];
    memset(dst, 0, sizeof dst);
    oi_peer_read r = {.remote_offset = 0, .len = sizeof dst, .local_dst = dst};
    atomic_store(&fail, F_GET);
    oi_status st = oi__peer_get(p, &r, 1, 0);
    atomic_store(&fail, 0);
    if (m == 0) {
      CHECK_ST(st, OI_ERR_OUT_OF_MEMORY);
      CHECK(stats_of(a).bytes_served == 0);
    } else {
      CHECK_OK(st);
      CHECK(memcmp(dst, region, sizeof dst) == 0 && stats_of(a).bytes_served == sizeof dst);
    }
    oi__peer_net_destroy(b);
    oi__peer_net_destroy(a);
    unsetenv("OI_PEER_READS");
  }
}

static void test_served_read_fails(void) {
  /* A served read large enough to come by rendezvous, whose receive UCX
   * refuses: the get fails OI_ERR_IO; the next one lands byte-exact. */
  oi_peer_net *a = make_net("node-a", OI_PEER_READS_AM, 2000);
  oi_peer_net *b = make_net("node-b", OI_PEER_READS_AM, 2000);
  enum { LEN = 4 << 20 };
  uint8_t *region = malloc(LEN), *dst = malloc(LEN);
  REQUIRE(region && dst);
  for (size_t i = 0; i < LEN; i++)
    region[i] = (uint8_t)(i * 11 + 3);
  CHECK_OK(oi__peer_net_register(a, region, LEN));
  oi_peer *p = connect_to(b, a);
  oi_peer_read r = {.remote_offset = 0, .len = LEN, .local_dst = dst};
  atomic_store(&recv_data_calls, 0);
  atomic_store(&fail, F_RECV_DATA);
  oi_status st = oi__peer_get(p, &r, 1, 0);
  atomic_store(&fail, 0);
  REQUIRE(atomic_load(&recv_data_calls) > 0); /* it came by rendezvous */
  CHECK_ST(st, OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "read failed") &&
        strstr(oi_last_error(), real.ucs_status_string(UCS_ERR_IO_ERROR)));
  for (int i = 0; i < 3000 && atomic_load(&unseen); i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  REQUIRE(atomic_load(&unseen) == 0);
  memset(dst, 0, LEN);
  CHECK_OK(oi__peer_get(p, &r, 1, 0));
  CHECK(memcmp(dst, region, LEN) == 0);
  oi__peer_net_destroy(b);
  oi__peer_net_destroy(a);
  free(region);
  free(dst);
}

int main(void) {
  if (oi__ucx_load() != OI_OK) TEST_SKIP("UCX is not installed");
  install();
  RUN_TEST(test_create_fails);
  RUN_TEST(test_spare_workers);
  RUN_TEST(test_config_modify_fails);
  RUN_TEST(test_endpoint_fails);
  RUN_TEST(test_send_fails);
  RUN_TEST(test_arm_fails);
  RUN_TEST(test_region_fails);
  RUN_TEST(test_served_read_fails);
  RUN_TEST(test_reads_by_environment);
  TEST_EXIT();
}
