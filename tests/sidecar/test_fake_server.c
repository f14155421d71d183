/* Every reply check and deadline of the sidecar client (lib/engine/remote_*.c),
 * driven through the public API against a scripted fake server
 * (fake_server.h) that speaks the real wire protocol: no reply, a late
 * reply, a wrong protocol version, a bad register reply, a lease of the
 * wrong size, more hits than hashes, a refused session, an early close,
 * bytes that do not decode. For each: the status, a specific last error,
 * a failed asynchronous save or load completing its ticket with an error
 * (once, never OK), no wait past its deadline, and the client usable
 * afterwards or reporting its closed connection clearly. */
#include <pthread.h>
#include <sys/mman.h>

#include "fake_server.h"
#include "sidecar_util.h"

#define CONTROL_MS 300 /* control_deadline_ms of every engine here */
#define ASYNC_MS 400   /* save_deadline_ms and load_deadline_ms */
#define LOOKUP_MS 150  /* lookup_deadline_ms: membership queries, the lookup client's */
#define SLACK_MS 1500  /* a shared 2-core machine; the reader sweeps deadlines every 250 ms */

static fake_server *fs;
static char child_socket[128]; /* a forked client's: its parent's fake server */

static const char *socket_of(void) { return child_socket[0] ? child_socket : fs_socket(fs); }

static uint64_t ms_since(uint64_t t0) { return (oi__now_ns() - t0) / 1000000ull; }

#define CHECK_ERR(needle)                                                                          \
  do {                                                                                             \
    if (!strstr(oi_last_error(), (needle))) {                                                      \
      fprintf(stderr, "%s:%d: last error \"%s\" does not say \"%s\"\n", __FILE__, __LINE__,        \
              oi_last_error(), (needle));                                                          \
      oi_test_failures++;                                                                          \
    }                                                                                              \
  } while (0)

/* lo <= elapsed ms < hi */
#define CHECK_ELAPSED(t0, lo, hi)                                                                  \
  do {                                                                                             \
    int64_t ms_ = (int64_t)ms_since(t0);                                                           \
    if (ms_ < (int64_t)(lo) || ms_ >= (int64_t)(hi)) {                                             \
      fprintf(stderr, "%s:%d: took %llu ms, expected [%llu, %llu)\n", __FILE__, __LINE__,          \
              (unsigned long long)ms_, (unsigned long long)(lo), (unsigned long long)(hi));        \
      oi_test_failures++;                                                                          \
    }                                                                                              \
  } while (0)

/* ---- clients ------------------------------------------------------------------------------ */

typedef struct client {
  oi_engine *e;
  oi_imported_arena *arena;
  bool owned;
  uint8_t *base; /* engine-owned: a sealed memfd, mapped */
  uint64_t size;
  int fd;
} client;

static void options_of(oi_engine_options *o, oi_arena_desc a[TL_ARENAS], client *c) {
  tl_options(o, a, "fake");
  o->control_deadline_ms = CONTROL_MS;
  o->lookup_deadline_ms = LOOKUP_MS;
  o->save_deadline_ms = ASYNC_MS;
  o->load_deadline_ms = ASYNC_MS;
  if (!c->owned) return;
  uint64_t total;
  tl_arenas(a, &total);
  c->size = (total + 4095) & ~4095ull;
  c->fd = memfd_create("oi-fake-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(c->fd >= 0);
  REQUIRE(ftruncate(c->fd, (off_t)c->size) == 0);
  REQUIRE(fcntl(c->fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  c->base = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
  REQUIRE(c->base != MAP_FAILED);
  o->arena_base = c->base;
  o->arena_size = c->size;
  o->arena_fd = c->fd;
}

static void client_memory_free(client *c) {
  if (!c->owned || !c->base) return;
  munmap(c->base, c->size);
  close(c->fd);
  c->base = NULL;
}

static oi_status client_connect(client *c, bool owned) {
  memset(c, 0, sizeof *c);
  c->owned = owned;
  c->fd = -1;
  oi_arena_desc a[TL_ARENAS];
  oi_engine_options o;
  options_of(&o, a, c);
  c->e = (oi_engine *)(uintptr_t)1; /* must be reset by the call */
  c->arena = (oi_imported_arena *)(uintptr_t)1;
  oi_status st = oi_engine_connect(socket_of(), &o, &c->e, owned ? NULL : &c->arena);
  if (owned) c->arena = NULL;
  return st;
}

static void client_close(client *c) {
  if (c->arena) oi_imported_arena_close(c->arena);
  if (c->e) oi_engine_destroy(c->e);
  c->e = NULL;
  c->arena = NULL;
  client_memory_free(c);
}

/* A connect the fake's script makes fail: the status, the message, nothing
 * returned, within max_ms, and the client closed its connection. */
static void expect_connect_fails(bool owned, oi_status want, const char *needle, uint64_t min_ms,
                                 uint64_t max_ms) {
  client c;
  uint64_t t0 = oi__now_ns();
  CHECK_ST(client_connect(&c, owned), want);
  CHECK_ELAPSED(t0, min_ms, max_ms);
  CHECK_ERR(needle);
  CHECK(c.e == NULL);
  CHECK(owned || c.arena == NULL);
  CHECK(fs_wait_no_connections(fs, 3000));
  client_memory_free(&c);
}

/* ---- tickets -------------------------------------------------------------------------- */

/* Every completion an operation reported, by its ticket and by on_done. */
typedef struct completions {
  pthread_mutex_t lock;
  int ticket_calls, done_calls;
  oi_status ticket_st, done_st;
} completions;

static void on_ticket(void *ctx, oi_ticket *t, oi_status st) {
  (void)t;
  completions *c = ctx;
  pthread_mutex_lock(&c->lock);
  c->ticket_calls++;
  c->ticket_st = st;
  pthread_mutex_unlock(&c->lock);
}

static void on_done(void *ctx, oi_status st) {
  completions *c = ctx;
  pthread_mutex_lock(&c->lock);
  c->done_calls++;
  c->done_st = st;
  pthread_mutex_unlock(&c->lock);
}

static void completions_init(completions *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->lock, NULL);
  c->ticket_st = c->done_st = OI_PENDING;
}

/* A consistent copy of what was reported so far. */
static completions got(completions *k) {
  pthread_mutex_lock(&k->lock);
  completions c = *k;
  pthread_mutex_unlock(&k->lock);
  return c;
}

/* Polls until the ticket completes (up to limit_ms); @return its status. */
static oi_status ticket_end(oi_ticket *t, uint32_t limit_ms) {
  uint64_t t0 = oi__now_ns();
  oi_status st;
  while ((st = oi_ticket_poll(t)) == OI_PENDING && ms_since(t0) < limit_ms)
    usleep(2000);
  return st;
}

/* Its status once final (not pending, not fencing), or its last status
 * after limit_ms: a late answer the fake server has sent reaches the
 * client's reader thread a moment later. */
static oi_status ticket_final(oi_ticket *t, uint32_t limit_ms) {
  uint64_t t0 = oi__now_ns();
  oi_status st;
  while ((st = oi_ticket_poll(t)) > 0 && ms_since(t0) < limit_ms)
    usleep(2000);
  return st;
}

/* A save of `n` blocks with a ticket and on_done (result: optional counts). */
static oi_status save_n(client *c, size_t n, completions *k, oi_save_result *result,
                        oi_ticket **t) {
  int64_t ids[8];
  oi_block_hash h[8];
  REQUIRE(n <= 8);
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    h[i] = tl_hash(24, i);
  }
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_done;
  so.on_done_ctx = k;
  so.result = result;
  *t = NULL;
  oi_status st = oi_engine_save(c->e, ids, h, n, &so, t);
  if (st == OI_OK && *t) REQUIRE(oi_ticket_set_callback(*t, on_ticket, k) == OI_OK);
  return st;
}

static oi_status load_n(client *c, size_t n, completions *k, oi_ticket **t) {
  int64_t ids[8];
  REQUIRE(n <= 8);
  for (size_t i = 0; i < n; i++)
    ids[i] = (int64_t)i;
  oi_lease lease;
  memset(lease.bytes, 0xAB, sizeof lease.bytes);
  *t = NULL;
  oi_status st = oi_engine_load(c->e, lease, ids, n, NULL, t);
  if (st == OI_OK && *t) REQUIRE(oi_ticket_set_callback(*t, on_ticket, k) == OI_OK);
  return st;
}

static oi_status query_n(client *c, size_t n, uint32_t flags, uint8_t *present,
                         oi_query_result *r) {
  oi_block_hash h[8];
  REQUIRE(n <= 8);
  for (size_t i = 0; i < n; i++)
    h[i] = tl_hash(24, i);
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->present = present;
  return oi_engine_query(c->e, NULL, h, n, flags, r);
}

/* The client still works: a query answered with `hits` hits of 4. */
/* After a deadline miss the breaker is open until the server answers a
 * probe (the fake server answers at once): waits until the engine is
 * connected and used again. */
static void await_live(client *c) {
  oi_engine_stats s;
  for (int i = 0; i < 400; i++) {
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    if (oi_engine_get_stats(c->e, &s) == OI_OK && s.connection == OI_CONNECTION_CONNECTED) return;
    usleep(5000);
  }
  CHECK(!"the breaker did not close within 2 s");
}

static void check_usable(client *c, uint64_t hits) {
  await_live(c);
  fs_set_hits(fs, hits);
  oi_query_result r;
  CHECK_OK(query_n(c, 4, 0, NULL, &r));
  CHECK(r.hit_blocks == hits);
  fs_set_hits(fs, 0);
}

/* ---- edits of the correct reply ------------------------------------------------------- */

static void hello_version_2(fs_reply *r) { r->env.body.hello_reply.protocol_version = 2; }
static void reply_as_query_reply(fs_reply *r) {
  memset(&r->env.body, 0, sizeof r->env.body);
  r->env.which_body = oiwire_Envelope_query_reply_tag;
}
static void reply_as_stats_reply(fs_reply *r) {
  memset(&r->env.body, 0, sizeof r->env.body);
  r->env.which_body = oiwire_Envelope_stats_reply_tag;
}
static void register_instance_0(fs_reply *r) { r->env.body.register_reply.instance_id = 0; }
static void register_short_handle(fs_reply *r) {
  r->env.body.register_reply.instance_id = 7;
  r->env.body.register_reply.arena_handle.size = 10;
}
static void register_small_arena(fs_reply *r) { r->env.body.register_reply.arena_bytes = 100; }
static void register_bad_handle(fs_reply *r) {
  memset(r->env.body.register_reply.arena_handle.bytes, 0x5A, 8); /* not the cpu magic */
}
static void register_owned_handle(fs_reply *r) {
  r->env.body.register_reply.arena_handle.size = OI_WIRE_HANDLE_BYTES; /* owned: must be empty */
}
static void query_lease_8(fs_reply *r) { r->env.body.query_reply.lease.size = 8; }
static void query_5_hits(fs_reply *r) { r->env.body.query_reply.hit_blocks = 5; }
static void query_3_pending(fs_reply *r) {
  r->env.body.query_reply.hit_blocks = 2;
  r->env.body.query_reply.pending_blocks = 3;
}
static void query_3_present(fs_reply *r) { r->out.n_present = 3; }
static void query_1_hit(fs_reply *r) {
  r->env.body.query_reply.hit_blocks = 1;
  r->env.body.query_reply.lease.size = OI_WIRE_LEASE_BYTES;
}
static void result_pending(fs_reply *r) { r->env.body.result.status = OI_PENDING; }

/* ---- connect ---------------------------------------------------------------------------- */

static void test_nothing_listens(void) {
  client c;
  memset(&c, 0, sizeof c);
  oi_arena_desc a[TL_ARENAS];
  oi_engine_options o;
  options_of(&o, a, &c);
  oi_engine *e = NULL;
  oi_imported_arena *ar = NULL;
  CHECK_ST(oi_engine_connect("/tmp/oi-no-such-dir/none.sock", &o, &e, &ar), OI_ERR_NOT_FOUND);
  CHECK_ERR("no openinfer server listens on /tmp/oi-no-such-dir/none.sock");
  CHECK(e == NULL && ar == NULL);
}

static void test_hello_replies(void) {
  fs = fs_start();
  /* No reply: the control deadline. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.action = FS_SILENT});
  expect_connect_fails(false, OI_ERR_TIMEOUT,
                       "connect: hello: no reply from the openinfer server within 300 ms",
                       CONTROL_MS - 20, CONTROL_MS + SLACK_MS);
  /* A reply after the deadline changes nothing: the connect already failed. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.action = FS_REPLY, .delay_ms = 600});
  expect_connect_fails(false, OI_ERR_TIMEOUT, "connect: hello: no reply", CONTROL_MS - 20,
                       CONTROL_MS + SLACK_MS);
  /* Another protocol version. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.edit = hello_version_2});
  expect_connect_fails(false, OI_ERR_VERSION, "the server speaks protocol 2, this library 1", 0,
                       SLACK_MS);
  /* Not a HelloReply. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.edit = reply_as_query_reply});
  expect_connect_fails(false, OI_ERR_PROTOCOL,
                       "connect: hello: the server answered with message type 8", 0, SLACK_MS);
  /* An error Result: its status and message. */
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_PERMISSION,
                      .message = "hello: peers of uid 4242 are not served here"});
  expect_connect_fails(false, OI_ERR_PERMISSION, "peers of uid 4242 are not served here", 0,
                       SLACK_MS);
  /* A Result OI_ERR_CLOSED while the server keeps the session open: the
   * connect fails with it at once (it waited for an end of stream that
   * never came). */
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_CLOSED,
                      .message = "hello: this server is shutting down"});
  expect_connect_fails(false, OI_ERR_CLOSED, "hello: this server is shutting down", 0,
                       CONTROL_MS + SLACK_MS);
  /* A Result OI_PENDING is no final answer. */
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_RESULT, .status = OI_PENDING, .message = "later"});
  expect_connect_fails(false, OI_ERR_PROTOCOL, "later", 0, SLACK_MS);
  /* Engine-owned memory needs the server's capability. */
  fs_set_caps(fs, OI_WIRE_CAP_PIPELINED | OI_WIRE_CAP_MEMBERSHIP);
  expect_connect_fails(true, OI_ERR_UNSUPPORTED, "does not take engine-owned memory", 0, SLACK_MS);
  CHECK(fs_seen(fs, oiwire_Envelope_register_instance_tag) == 0);
  fs_stop(fs);
}

static void test_refused_and_closed_sessions(void) {
  fs = fs_start();
  /* Refused at once, before the Hello is read (the real server when full). */
  fs_script(fs, FS_ACCEPT,
            (fs_step){.action = FS_REFUSE,
                      .status = OI_ERR_BUSY,
                      .message = "the server has 2 sessions (--max-sessions 2)"});
  expect_connect_fails(false, OI_ERR_BUSY, "the server has 2 sessions (--max-sessions 2)", 0,
                       SLACK_MS);
  /* Refused in answer to the Hello. */
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_REFUSE,
                      .status = OI_ERR_PERMISSION,
                      .message = "uid 4242 is not allowed"});
  expect_connect_fails(false, OI_ERR_PERMISSION, "uid 4242 is not allowed", 0, SLACK_MS);
  /* A session-ending Result without an error status is a protocol error. */
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_REFUSE, .status = OI_OK, .message = "bye for no reason"});
  expect_connect_fails(false, OI_ERR_PROTOCOL, "bye for no reason", 0, SLACK_MS);
  /* Closed without a word, at once (the Hello may find the connection
   * closed already, or be sent and see it end) and at the Hello. */
  fs_script(fs, FS_ACCEPT, (fs_step){.action = FS_CLOSE});
  expect_connect_fails(false, OI_ERR_CLOSED, "the peer closed the connection", 0, SLACK_MS);
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.action = FS_CLOSE});
  expect_connect_fails(false, OI_ERR_CLOSED,
                       "the connection to the openinfer server ended: the peer closed the "
                       "connection",
                       0, SLACK_MS);
  /* Bytes that are no Envelope end the connection. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.action = FS_GARBAGE});
  expect_connect_fails(false, OI_ERR_CLOSED, "the connection to the openinfer server ended", 0,
                       SLACK_MS);
  /* Refused at the Register, with a reason. */
  fs_script(fs, oiwire_Envelope_register_instance_tag,
            (fs_step){.action = FS_REFUSE,
                      .status = OI_ERR_OUT_OF_MEMORY,
                      .message = "no room for another arena"});
  expect_connect_fails(false, OI_ERR_OUT_OF_MEMORY, "no room for another arena", 0, SLACK_MS);
  /* The fake is fine: a plain connect works. */
  client c;
  CHECK_OK(client_connect(&c, false));
  if (c.e) check_usable(&c, 2);
  client_close(&c);
  fs_stop(fs);
}

static void test_register_replies(void) {
  fs = fs_start();
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.action = FS_SILENT});
  expect_connect_fails(false, OI_ERR_TIMEOUT,
                       "connect: register: no reply from the openinfer server within 300 ms",
                       CONTROL_MS - 20, CONTROL_MS + SLACK_MS);
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = reply_as_stats_reply});
  expect_connect_fails(false, OI_ERR_PROTOCOL,
                       "connect: register: the server answered with message type 14", 0, SLACK_MS);
  fs_script(fs, oiwire_Envelope_register_instance_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_INVALID_ARGUMENT,
                      .message = "register: arena 1 overlaps arena 0"});
  expect_connect_fails(false, OI_ERR_INVALID_ARGUMENT, "register: arena 1 overlaps arena 0", 0,
                       SLACK_MS);
  fs_script(fs, oiwire_Envelope_register_instance_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_CLOSED,
                      .message = "register: the server is shutting down"});
  expect_connect_fails(false, OI_ERR_CLOSED, "register: the server is shutting down", 0,
                       CONTROL_MS + SLACK_MS);
  /* Instance 0: nothing was registered, so nothing is unregistered. */
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = register_instance_0});
  expect_connect_fails(false, OI_ERR_PROTOCOL, "register reply has instance 0 and a 64-byte handle",
                       0, SLACK_MS);
  CHECK(fs_seen(fs, oiwire_Envelope_unregister_tag) == 0);
  /* A registered instance with a bad reply is unregistered before the
   * connection closes (the server may free its arena). */
  oiwire_Envelope last;
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = register_short_handle});
  expect_connect_fails(false, OI_ERR_PROTOCOL, "register reply has instance 7 and a 10-byte handle",
                       0, SLACK_MS);
  CHECK(fs_seen(fs, oiwire_Envelope_unregister_tag) == 1);
  CHECK(fs_last(fs, oiwire_Envelope_unregister_tag, &last) &&
        last.body.unregister.instance_id == 7);
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = register_small_arena});
  expect_connect_fails(false, OI_ERR_PROTOCOL, "connect: the server allocated 100 bytes", 0,
                       SLACK_MS);
  CHECK(fs_seen(fs, oiwire_Envelope_unregister_tag) == 2);
  /* A handle that does not import. */
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = register_bad_handle});
  expect_connect_fails(false, OI_ERR_INVALID_ARGUMENT,
                       "connect: importing the server's arena: arena import: not a cpu arena "
                       "handle",
                       0, SLACK_MS);
  CHECK(fs_seen(fs, oiwire_Envelope_unregister_tag) == 3);
  /* ...and the unregister itself unanswered: still the import's error, once
   * the unregister's own deadline passed. */
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = register_bad_handle});
  fs_script(fs, oiwire_Envelope_unregister_tag, (fs_step){.action = FS_SILENT});
  expect_connect_fails(false, OI_ERR_INVALID_ARGUMENT, "importing the server's arena",
                       CONTROL_MS - 20, CONTROL_MS + SLACK_MS);
  /* Engine-owned memory: the server must not send an arena handle. */
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = register_owned_handle});
  expect_connect_fails(true, OI_ERR_PROTOCOL, "and a 64-byte handle", 0, SLACK_MS);
  CHECK(fs_fds_received(fs) == 1); /* the memfd travelled with the Register */
  fs_stop(fs);
}

/* ---- operations on a live engine -------------------------------------------------------- */

static void test_async_deadlines(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, false) == OI_OK);
  completions k;
  oi_ticket *t;

  /* A save never answered: the ticket and on_done say TIMEOUT, once, at
   * the save deadline. */
  completions_init(&k);
  fs_script(fs, oiwire_Envelope_save_tag, (fs_step){.action = FS_SILENT});
  uint64_t t0 = oi__now_ns();
  CHECK_OK(save_n(&c, 4, &k, NULL, &t));
  CHECK_ST(ticket_end(t, ASYNC_MS + 5000), OI_ERR_TIMEOUT);
  CHECK_ELAPSED(t0, ASYNC_MS - 20, ASYNC_MS + SLACK_MS);
  usleep(300000);
  CHECK(got(&k).ticket_calls == 1 && got(&k).ticket_st == OI_ERR_TIMEOUT);
  CHECK(got(&k).done_calls == 1 && got(&k).done_st == OI_ERR_TIMEOUT);
  oi_ticket_release(t);

  /* Answered OK, but after the deadline: the late reply is dropped, the
   * ticket stays TIMEOUT. */
  completions_init(&k);
  uint32_t late = fs_late_sent(fs);
  fs_script(fs, oiwire_Envelope_save_tag, (fs_step){.delay_ms = ASYNC_MS + 600});
  t0 = oi__now_ns();
  CHECK_OK(save_n(&c, 2, &k, NULL, &t));
  CHECK_ST(ticket_end(t, ASYNC_MS + 5000), OI_ERR_TIMEOUT);
  CHECK_ELAPSED(t0, ASYNC_MS - 20, ASYNC_MS + 600);
  for (int i = 0; i < 300 && fs_late_sent(fs) == late; i++)
    usleep(10000);
  CHECK(fs_late_sent(fs) == late + 1);
  usleep(100000);
  CHECK(oi_ticket_poll(t) == OI_ERR_TIMEOUT);
  CHECK(got(&k).ticket_calls == 1 && got(&k).done_calls == 1 && got(&k).done_st == OI_ERR_TIMEOUT);
  oi_ticket_release(t);
  check_usable(&c, 3);

  /* A load never answered; a load answered late. */
  completions_init(&k);
  fs_script(fs, oiwire_Envelope_load_tag, (fs_step){.action = FS_SILENT});
  t0 = oi__now_ns();
  CHECK_OK(load_n(&c, 3, &k, &t));
  /* Past its deadline the load is fencing, not final: the server may still
   * copy into its blocks. Unanswered, it stays so while the server lives
   * (here: until teardown, after the unregister is answered). */
  CHECK_ST(ticket_end(t, ASYNC_MS + 5000), OI_FENCING);
  CHECK_ELAPSED(t0, ASYNC_MS - 20, ASYNC_MS + SLACK_MS);
  CHECK_ST(oi_ticket_arena_wait(t, 0, 0), OI_ERR_TIMEOUT);
  CHECK_ST(oi_ticket_wait(t, 60000), OI_ERR_TIMEOUT); /* at once */
  usleep(100000);
  CHECK(got(&k).ticket_calls == 0 && oi_ticket_poll(t) == OI_FENCING);
  oi_ticket *unanswered = t;
  await_live(&c);
  /* Answered late: fenced until the answer, then OI_ERR_DEADLINE (never OK). */
  completions_init(&k);
  late = fs_late_sent(fs);
  fs_script(fs, oiwire_Envelope_load_tag, (fs_step){.delay_ms = ASYNC_MS + 600});
  CHECK_OK(load_n(&c, 3, &k, &t));
  CHECK_ST(ticket_end(t, ASYNC_MS + 5000), OI_FENCING);
  for (int i = 0; i < 300 && fs_late_sent(fs) == late; i++)
    usleep(10000);
  CHECK_ST(ticket_final(t, 5000), OI_ERR_DEADLINE);
  CHECK(got(&k).ticket_calls == 1 && got(&k).ticket_st == OI_ERR_DEADLINE);
  oi_ticket_release(t);
  check_usable(&c, 1);

  /* A save asking for its counts: none come within the control deadline,
   * so save returns (counts unknown) and the ticket times out later. */
  completions_init(&k);
  fs_script(fs, oiwire_Envelope_save_tag, (fs_step){.action = FS_SILENT});
  oi_save_result res = {.struct_size = sizeof res};
  t0 = oi__now_ns();
  CHECK_OK(save_n(&c, 4, &k, &res, &t));
  CHECK_ELAPSED(t0, CONTROL_MS - 20, CONTROL_MS + SLACK_MS);
  CHECK(res.accepted == UINT64_MAX && res.deduplicated == UINT64_MAX && res.dropped == UINT64_MAX);
  CHECK_ST(ticket_end(t, ASYNC_MS + 5000), OI_ERR_TIMEOUT);
  CHECK(got(&k).done_calls == 1 && got(&k).done_st == OI_ERR_TIMEOUT);
  oi_ticket_release(t);
  await_live(&c);
  /* Counts, but never the Result: the counts are reported, the ticket
   * times out. */
  completions_init(&k);
  fs_script(fs, oiwire_Envelope_save_tag, (fs_step){.action = FS_COUNTS_ONLY});
  memset(&res, 0, sizeof res);
  res.struct_size = sizeof res;
  t0 = oi__now_ns();
  CHECK_OK(save_n(&c, 4, &k, &res, &t));
  CHECK_ELAPSED(t0, 0, CONTROL_MS);
  CHECK(res.accepted == 4 && res.deduplicated == 0 && res.dropped == 0);
  CHECK_ST(ticket_end(t, ASYNC_MS + 5000), OI_ERR_TIMEOUT);
  CHECK(got(&k).done_calls == 1 && got(&k).done_st == OI_ERR_TIMEOUT);
  oi_ticket_release(t);

  check_usable(&c, 4);
  client_close(&c);
  CHECK(fs_seen(fs, oiwire_Envelope_unregister_tag) == 1);
  CHECK(fs_wait_no_connections(fs, 3000));
  /* The unanswered load: the server answered the unregister (its copies
   * ended before), so it ends now, with OI_ERR_DEADLINE. */
  CHECK_ST(oi_ticket_poll(unanswered), OI_ERR_DEADLINE);
  oi_ticket_release(unanswered);
  fs_stop(fs);
}

static void test_async_error_replies(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, false) == OI_OK);
  completions k;
  oi_ticket *t;
  struct {
    uint32_t type;
    fs_step step;
    oi_status want;
  } cases[] = {
      {oiwire_Envelope_save_tag,
       {.action = FS_RESULT, .status = OI_ERR_IO, .message = "save: copy failed"},
       OI_ERR_IO},
      {oiwire_Envelope_save_tag, {.edit = reply_as_query_reply}, OI_ERR_PROTOCOL},
      {oiwire_Envelope_save_tag, {.edit = result_pending}, OI_ERR_PROTOCOL},
      {oiwire_Envelope_load_tag,
       {.action = FS_RESULT, .status = OI_ERR_LEASE_EXPIRED, .message = "load: lease expired"},
       OI_ERR_LEASE_EXPIRED},
      {oiwire_Envelope_load_tag, {.edit = reply_as_stats_reply}, OI_ERR_PROTOCOL},
      {oiwire_Envelope_load_tag, {.edit = result_pending}, OI_ERR_PROTOCOL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    completions_init(&k);
    fs_script(fs, cases[i].type, cases[i].step);
    bool save = cases[i].type == oiwire_Envelope_save_tag;
    uint64_t t0 = oi__now_ns();
    CHECK_OK(save ? save_n(&c, 2, &k, NULL, &t) : load_n(&c, 2, &k, &t));
    oi_status st = ticket_end(t, 5000);
    if (st != cases[i].want) {
      fprintf(stderr, "case %zu: ticket %s, expected %s\n", i, oi_status_str(st),
              oi_status_str(cases[i].want));
      oi_test_failures++;
    }
    CHECK_ELAPSED(t0, 0, ASYNC_MS); /* the reply ended it, not the deadline */
    usleep(50000);
    CHECK(got(&k).ticket_calls == 1 && got(&k).ticket_st == cases[i].want);
    CHECK(!save || (got(&k).done_calls == 1 && got(&k).done_st == cases[i].want));
    oi_ticket_release(t);
  }
  /* A save waiting for its counts whose Result (an error) comes first: save
   * returns at once with the counts unknown, not at the control deadline. */
  completions_init(&k);
  fs_script(fs, oiwire_Envelope_save_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_OUT_OF_MEMORY,
                      .message = "save: no host memory"});
  oi_save_result res = {.struct_size = sizeof res};
  uint64_t t0 = oi__now_ns();
  CHECK_OK(save_n(&c, 3, &k, &res, &t));
  CHECK_ELAPSED(t0, 0, CONTROL_MS - 50);
  CHECK(res.accepted == UINT64_MAX && res.dropped == UINT64_MAX);
  CHECK_ST(ticket_end(t, 5000), OI_ERR_OUT_OF_MEMORY);
  usleep(50000);
  CHECK(got(&k).done_calls == 1 && got(&k).done_st == OI_ERR_OUT_OF_MEMORY);
  oi_ticket_release(t);
  /* A stats call answered with an error. */
  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  fs_script(fs, oiwire_Envelope_stats_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_NOT_FOUND,
                      .message = "stats: no instance 1 in this session"});
  CHECK_ST(oi_engine_get_stats(c.e, &s), OI_ERR_NOT_FOUND);
  CHECK_ERR("stats: no instance 1 in this session");
  /* A layerwise save to a server without the capability never leaves. */
  client_close(&c);
  fs_set_caps(fs, OI_WIRE_CAP_PIPELINED | OI_WIRE_CAP_MEMBERSHIP);
  REQUIRE(client_connect(&c, false) == OI_OK);
  uint32_t saves = fs_seen(fs, oiwire_Envelope_save_tag);
  int64_t id = 0;
  oi_block_hash h = tl_hash(24, 0);
  oi_save_options so;
  oi_save_options_init(&so);
  so.arena_first = 0;
  so.arena_count = 1;
  oi_ticket *lt = NULL;
  CHECK_ST(oi_engine_save(c.e, &id, &h, 1, &so, &lt), OI_ERR_UNSUPPORTED);
  CHECK_ERR("this server does not support layerwise saves");
  CHECK(lt == NULL);
  usleep(50000);
  CHECK(fs_seen(fs, oiwire_Envelope_save_tag) == saves);
  check_usable(&c, 2);
  client_close(&c);
  fs_stop(fs);
}

static void test_control_replies(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, false) == OI_OK);
  oi_query_result r;
  uint8_t present[8];

  /* No reply: the control deadline, plus the query's wait. */
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = FS_SILENT});
  uint64_t t0 = oi__now_ns();
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_TIMEOUT);
  CHECK_ELAPSED(t0, CONTROL_MS - 20, CONTROL_MS + SLACK_MS);
  CHECK_ERR("query of 4 hashes: no reply from the openinfer server within 300 ms");
  /* The breaker is open: the next query misses at once, unsent... */
  t0 = oi__now_ns();
  CHECK_OK(query_n(&c, 4, 0, NULL, &r));
  CHECK(r.hit_blocks == 0);
  CHECK_ELAPSED(t0, 0, SLACK_MS);
  await_live(&c); /* ...until the server answers a probe */
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = FS_SILENT});
  oi_block_hash hw[2] = {tl_hash(24, 0), tl_hash(24, 1)};
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.wait_ms = 400;
  t0 = oi__now_ns();
  CHECK_ST(oi_engine_query(c.e, NULL, hw, 2, OI_QUERY_WAIT_PENDING, &r), OI_ERR_TIMEOUT);
  CHECK_ELAPSED(t0, CONTROL_MS + 400 - 20, CONTROL_MS + 400 + SLACK_MS);
  CHECK_ERR("query of 2 hashes: no reply from the openinfer server within 700 ms");
  await_live(&c);

  /* A late reply (1 hit) is dropped: the next query gets its own (3 hits). */
  uint32_t late = fs_late_sent(fs);
  fs_script(fs, oiwire_Envelope_query_tag,
            (fs_step){.delay_ms = CONTROL_MS + 400, .edit = query_1_hit});
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_TIMEOUT);
  for (int i = 0; i < 300 && fs_late_sent(fs) == late; i++)
    usleep(10000);
  CHECK(fs_late_sent(fs) == late + 1);
  check_usable(&c, 3);
  /* A membership query (the scheduler's path) has the short lookup deadline. */
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = FS_SILENT});
  t0 = oi__now_ns();
  CHECK_ST(query_n(&c, 4, OI_QUERY_MEMBERSHIP, present, &r), OI_ERR_TIMEOUT);
  CHECK_ELAPSED(t0, LOOKUP_MS - 20, LOOKUP_MS + SLACK_MS);
  CHECK_ERR("membership query of 4 hashes: no reply from the openinfer server within");
  await_live(&c);

  /* Bad replies. */
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.edit = query_lease_8});
  fs_set_hits(fs, 2);
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("query: the server sent a 8-byte lease");
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.edit = query_5_hits});
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("query: the server reported 5 hits and 0 pending for 4 hashes");
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.edit = query_3_pending});
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("query: the server reported 2 hits and 3 pending for 4 hashes");
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.edit = query_3_present});
  CHECK_ST(query_n(&c, 4, OI_QUERY_MEMBERSHIP, present, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("query: the server answered 3 membership bytes for 4 hashes");
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.edit = query_5_hits});
  CHECK_ST(query_n(&c, 4, OI_QUERY_MEMBERSHIP, present, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("reported 5 hits");
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.edit = reply_as_stats_reply});
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("query: the server answered with message type 14");
  fs_script(fs, oiwire_Envelope_query_tag,
            (fs_step){.action = FS_RESULT, .status = OI_PENDING, .message = "still looking"});
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("still looking");
  fs_script(fs, oiwire_Envelope_query_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_INVALID_ARGUMENT,
                      .message = "query: namespace 'fake' is read-only for you"});
  CHECK_ST(query_n(&c, 4, 0, NULL, &r), OI_ERR_INVALID_ARGUMENT);
  CHECK_ERR("namespace 'fake' is read-only for you");
  /* The good membership answer still arrives whole. */
  fs_set_hits(fs, 2);
  memset(present, 0xEE, sizeof present);
  CHECK_OK(query_n(&c, 4, OI_QUERY_MEMBERSHIP, present, &r));
  CHECK(present[0] == 1 && present[1] == 1 && present[2] == 0 && present[3] == 0);
  fs_set_hits(fs, 0);

  /* Release, flush and stats: no reply, an error, a wrong type. */
  oi_lease lease;
  memset(lease.bytes, 0xAB, sizeof lease.bytes);
  fs_script(fs, oiwire_Envelope_release_tag, (fs_step){.action = FS_SILENT});
  t0 = oi__now_ns();
  CHECK_ST(oi_engine_release(c.e, lease), OI_ERR_TIMEOUT);
  CHECK_ELAPSED(t0, CONTROL_MS - 20, CONTROL_MS + SLACK_MS);
  CHECK_ERR("release: no reply from the openinfer server within 300 ms");
  await_live(&c);
  fs_script(fs, oiwire_Envelope_release_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_LEASE_EXPIRED,
                      .message = "release: the lease expired"});
  CHECK_ST(oi_engine_release(c.e, lease), OI_ERR_LEASE_EXPIRED);
  CHECK_ERR("release: the lease expired");
  fs_script(fs, oiwire_Envelope_flush_tag, (fs_step){.action = FS_SILENT});
  t0 = oi__now_ns();
  CHECK_ST(oi_engine_flush(c.e, 100), OI_ERR_TIMEOUT);
  CHECK_ELAPSED(t0, 100 + CONTROL_MS - 20, 100 + CONTROL_MS + SLACK_MS);
  CHECK_ERR("flush: no reply from the openinfer server within 400 ms");
  await_live(&c);
  fs_script(fs, oiwire_Envelope_flush_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_TIMEOUT,
                      .message = "flush: 3 saves still in flight after 100 ms"});
  CHECK_ST(oi_engine_flush(c.e, 100), OI_ERR_TIMEOUT);
  CHECK_ERR("3 saves still in flight");
  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.action = FS_SILENT});
  t0 = oi__now_ns();
  /* Unanswered stats: this side's figures, the engine not connected (the
   * breaker opened). */
  CHECK_OK(oi_engine_get_stats(c.e, &s));
  CHECK_ELAPSED(t0, CONTROL_MS - 20, CONTROL_MS + SLACK_MS);
  CHECK(s.connection == OI_CONNECTION_DEGRADED);
  await_live(&c);
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.edit = reply_as_query_reply});
  CHECK_ST(oi_engine_get_stats(c.e, &s), OI_ERR_PROTOCOL);
  CHECK_ERR("engine_stats: the server answered with message type 8");
  CHECK_OK(oi_engine_get_stats(c.e, &s));
  CHECK(s.connection == OI_CONNECTION_CONNECTED && s.server_epoch == 0xFA4E000000000001ull);

  check_usable(&c, 4);
  client_close(&c);
  CHECK(fs_wait_no_connections(fs, 3000));
  CHECK(fs_client_closes(fs) == 1);
  fs_stop(fs);
}

/* Destroy against a server that answers neither the flush nor the
 * unregister: it waits each one's deadline (flush: the save deadline plus
 * the control deadline) and no longer, then closes the connection. */
static void test_destroy_unanswered(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, false) == OI_OK);
  fs_script(fs, oiwire_Envelope_flush_tag, (fs_step){.action = FS_SILENT});
  fs_script(fs, oiwire_Envelope_unregister_tag, (fs_step){.action = FS_SILENT});
  uint64_t t0 = oi__now_ns();
  client_close(&c);
  CHECK_ELAPSED(t0, ASYNC_MS + 2 * CONTROL_MS - 20, ASYNC_MS + 2 * CONTROL_MS + SLACK_MS);
  CHECK(fs_seen(fs, oiwire_Envelope_flush_tag) == 1);
  CHECK(fs_seen(fs, oiwire_Envelope_unregister_tag) == 1);
  CHECK(fs_wait_no_connections(fs, 3000));
  CHECK(fs_client_closes(fs) == 1);
  fs_stop(fs);
}

/* ---- the connection ends ----------------------------------------------------------------- */

static int fatal_pipe = -1;

static void fatal_to_pipe(void *ctx, const char *reason) {
  (void)ctx;
  ssize_t w = write(fatal_pipe, reason, strlen(reason));
  (void)w;
  _exit(0);
}

static int child_go = -1;

/* Forks a client child before the fake server starts (a child of a
 * process with threads must not start threads under TSan), then starts
 * the fake server; go_child() hands the child its socket path (after the
 * test scripted the fake). The child's fatal handler writes its reason to
 * *reason_fd. */
static pid_t fork_client(int *reason_fd) {
  int go[2], p[2];
  REQUIRE(pipe(go) == 0 && pipe(p) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(go[1]);
    close(p[0]);
    fatal_pipe = p[1];
    size_t n = 0;
    for (;;) {
      ssize_t k = read(go[0], child_socket + n, sizeof child_socket - 1 - n);
      if (k <= 0) break;
      n += (size_t)k;
    }
    close(go[0]);
    if (n == 0) _exit(9);
    oi_set_fatal_handler(fatal_to_pipe, NULL);
    return 0;
  }
  close(go[0]);
  close(p[1]);
  fs = fs_start();
  child_go = go[1];
  *reason_fd = p[0];
  return child;
}

static void go_child(void) {
  const char *path = fs_socket(fs);
  REQUIRE(write(child_go, path, strlen(path)) == (ssize_t)strlen(path));
  close(child_go);
  child_go = -1;
}

/* Reads what the child's fatal handler wrote (until the child exits). */
static void read_reason(int fd, char *reason, size_t cap) {
  size_t n = 0;
  memset(reason, 0, cap);
  for (;;) {
    ssize_t k = read(fd, reason + n, cap - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
  }
  close(fd);
}

/* Server-allocated memory: a server that ends the session under a live
 * engine takes the arena with it: the fatal handler runs, with the reason. */
static void test_closed_under_server_allocated_engine(void) {
  int rfd;
  pid_t child = fork_client(&rfd);
  if (child == 0) {
    client c;
    if (client_connect(&c, false) != OI_OK) _exit(2);
    oi_query_result r;
    if (query_n(&c, 4, 0, NULL, &r) != OI_OK) _exit(3);
    sleep(20); /* the watchdog fires long before */
    _exit(4);
  }
  go_child();
  CHECK(fs_wait_seen(fs, oiwire_Envelope_query_tag, 1, 10000));
  usleep(50000);
  uint64_t t0 = oi__now_ns();
  fs_close_all(fs, OI_ERR_INTERNAL, "the fake server stops for the test");
  char reason[1024];
  read_reason(rfd, reason, sizeof reason);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_ELAPSED(t0, 0, SLACK_MS);
  CHECK(strstr(reason, "died while this process maps the KV arena") != NULL);
  CHECK(strstr(reason, "the fake server stops for the test") != NULL);
  if (!strstr(reason, "the fake server stops for the test"))
    fprintf(stderr, "fatal reason: %s\n", reason);
  fs_stop(fs);
}

/* Engine-owned memory: what is in flight fails with OI_ERR_CLOSED (never
 * OK, never at its deadline), the engine degrades with the reason, and it
 * registers again once the server answers. */
static void test_closed_under_owned_engine(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, true) == OI_OK);
  completions ks, kl;
  completions_init(&ks);
  completions_init(&kl);
  oi_ticket *ts_, *tl;
  fs_script(fs, oiwire_Envelope_save_tag, (fs_step){.action = FS_SILENT});
  fs_script(fs, oiwire_Envelope_load_tag, (fs_step){.action = FS_SILENT});
  CHECK_OK(save_n(&c, 4, &ks, NULL, &ts_));
  CHECK_OK(load_n(&c, 2, &kl, &tl));
  REQUIRE(fs_wait_seen(fs, oiwire_Envelope_load_tag, 1, 5000));
  /* The reconnects' Hellos are cut until the test lets one through. */
  for (int i = 0; i < 30; i++)
    fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.action = FS_CLOSE});
  uint64_t t0 = oi__now_ns();
  fs_close_all(fs, OI_ERR_INTERNAL, "the fake server restarts");
  CHECK_ST(ticket_end(ts_, 5000), OI_ERR_CLOSED);
  CHECK_ELAPSED(t0, 0, ASYNC_MS); /* not the deadline: the end of the connection */
  /* The load is not final: its server (this process) still runs and may
   * still copy into its blocks. It can no longer be answered: fencing at
   * once (a wait returns at once). */
  CHECK_ST(ticket_end(tl, 5000), OI_FENCING);
  CHECK_ELAPSED(t0, 0, ASYNC_MS);
  CHECK_ST(oi_ticket_wait(tl, 60000), OI_ERR_TIMEOUT);
  usleep(50000);
  CHECK(got(&ks).ticket_calls == 1 && got(&ks).done_calls == 1 &&
        got(&ks).done_st == OI_ERR_CLOSED);
  CHECK(got(&kl).ticket_calls == 0 && oi_ticket_poll(tl) == OI_FENCING);
  oi_ticket_release(ts_);
  oi_ticket *fenced = tl;

  /* Degraded: queries miss, saves drop, loads and releases fail clearly. */
  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_OK(oi_engine_get_stats(c.e, &s));
  CHECK(s.connection == OI_CONNECTION_DEGRADED && s.reconnects == 0 && s.server_epoch == 0);
  oi_query_result r;
  fs_set_hits(fs, 4);
  CHECK_OK(query_n(&c, 4, 0, NULL, &r));
  CHECK(r.hit_blocks == 0);
  oi_save_result res = {.struct_size = sizeof res};
  completions_init(&ks);
  CHECK_OK(save_n(&c, 3, &ks, &res, &ts_));
  CHECK(res.dropped == 3 && res.accepted == 0);
  CHECK(oi_ticket_poll(ts_) == OI_OK); /* dropped, as a full pool drops: not an error */
  oi_ticket_release(ts_);
  completions_init(&kl);
  CHECK_ST(load_n(&c, 2, &kl, &tl), OI_ERR_CLOSED);
  CHECK_ERR("load: no openinfer server is connected");
  CHECK(tl == NULL);
  oi_lease lease;
  memset(lease.bytes, 0xAB, sizeof lease.bytes);
  CHECK_ST(oi_engine_release(c.e, lease), OI_ERR_LEASE_EXPIRED);
  CHECK_ERR("the server that issued this lease went away");
  CHECK_OK(oi_engine_flush(c.e, 100));

  /* The reconnect attempts were refused; now let one through. */
  CHECK(fs_wait_seen(fs, oiwire_Envelope_hello_tag, 1 + 3, 10000));
  CHECK_OK(oi_engine_get_stats(c.e, &s));
  CHECK(s.connection == OI_CONNECTION_DEGRADED && s.reconnects == 0);
  fs_clear_script(fs, oiwire_Envelope_hello_tag);
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  for (int i = 0; i < 500; i++) { /* the next attempt comes within 2 s */
    CHECK_OK(oi_engine_get_stats(c.e, &s));
    if (s.connection == OI_CONNECTION_CONNECTED) break;
    usleep(10000);
  }
  CHECK(s.connection == OI_CONNECTION_CONNECTED && s.reconnects == 1);
  CHECK(s.instance_id == 2); /* registered again */
  CHECK(fs_fds_received(fs) == 2);
  check_usable(&c, 2);
  CHECK(oi_ticket_poll(fenced) == OI_FENCING); /* the reconnect did not end it */
  client_close(&c);
  /* The same server (pid) answered the unregister: it ends, fenced. */
  CHECK_ST(oi_ticket_poll(fenced), OI_ERR_DEADLINE);
  oi_ticket_release(fenced);
  fs_stop(fs);
}

/* ---- the read side: a waiting caller reads the replies (lib/engine/remote_*.c) ------------ */

/* A query of 4 hashes whose deadline is the control deadline plus wait_ms,
 * run on its own thread: its status, hits, last error and end time. */
typedef struct query_job {
  client *c;
  uint32_t wait_ms;
  uint64_t t0;
  pthread_t thread;
  oi_status st;
  uint64_t hits, ended_ms;
  char error[512];
} query_job;

static oi_status query_wait(client *c, uint32_t wait_ms, oi_query_result *r) {
  oi_block_hash h[4];
  for (size_t i = 0; i < 4; i++)
    h[i] = tl_hash(24, i);
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;
  r->wait_ms = wait_ms;
  return oi_engine_query(c->e, NULL, h, 4, wait_ms ? OI_QUERY_WAIT_PENDING : 0, r);
}

static void *query_job_main(void *arg) {
  query_job *j = arg;
  oi_query_result r;
  j->st = query_wait(j->c, j->wait_ms, &r);
  j->ended_ms = ms_since(j->t0);
  j->hits = r.hit_blocks;
  snprintf(j->error, sizeof j->error, "%s", oi_last_error());
  return NULL;
}

static void query_job_start(query_job *j, client *c, uint32_t wait_ms, uint64_t t0) {
  memset(j, 0, sizeof *j);
  j->c = c;
  j->wait_ms = wait_ms;
  j->t0 = t0;
  REQUIRE(pthread_create(&j->thread, NULL, query_job_main, j) == 0);
}

/* on_done's thread and time. */
typedef struct done_where {
  pthread_mutex_t lock;
  int calls;
  oi_status st;
  pthread_t thread;
  uint64_t t0, at_ms;
} done_where;

static void on_done_where(void *ctx, oi_status st) {
  done_where *d = ctx;
  pthread_mutex_lock(&d->lock);
  d->calls++;
  d->st = st;
  d->thread = pthread_self();
  d->at_ms = ms_since(d->t0);
  pthread_mutex_unlock(&d->lock);
}

/* One caller waits (and so reads the connection) while others call: their
 * replies, which it reads, reach them at once; when it gives up at its
 * deadline another waiter reads on; an asynchronous completion it reads
 * still runs on the reader thread, not on the caller's; and when the
 * connection ends under it, every waiter is told at once (the reader
 * handles the end: the engine-owned one degrades and reconnects). */
static void test_caller_reads_replies(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, true) == OI_OK);
  fs_set_hits(fs, 3);

  /* A waits 800 ms for its reply (1 hit); B's reply (3 hits) comes at once
   * and A, the one reading, hands it over: B does not wait for A's. */
  uint32_t seen = fs_seen(fs, oiwire_Envelope_query_tag);
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.delay_ms = 800, .edit = query_1_hit});
  uint64_t t0 = oi__now_ns();
  query_job a;
  query_job_start(&a, &c, 2000, t0);
  REQUIRE(fs_wait_seen(fs, oiwire_Envelope_query_tag, seen + 1, 5000));
  usleep(20000); /* A is in its wait */
  oi_query_result r;
  uint64_t tb = oi__now_ns();
  CHECK_OK(query_wait(&c, 0, &r));
  CHECK(r.hit_blocks == 3);
  CHECK_ELAPSED(tb, 0, 700); /* before A's reply (800 ms after A began) */
  pthread_join(a.thread, NULL);
  CHECK_ST(a.st, OI_OK);
  CHECK(a.hits == 1);
  CHECK(a.ended_ms >= 800 - 20);

  /* A's reply never comes: it gives up at its deadline (300 ms) while B
   * (deadline 2.3 s) still waits for a reply due at about 700 ms; B reads
   * on and gets it. */
  seen = fs_seen(fs, oiwire_Envelope_query_tag);
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = FS_SILENT});
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.delay_ms = 650, .edit = query_1_hit});
  t0 = oi__now_ns();
  query_job_start(&a, &c, 0, t0);
  REQUIRE(fs_wait_seen(fs, oiwire_Envelope_query_tag, seen + 1, 5000));
  query_job b;
  query_job_start(&b, &c, 2000, t0);
  pthread_join(a.thread, NULL);
  pthread_join(b.thread, NULL);
  CHECK_ST(a.st, OI_ERR_TIMEOUT);
  CHECK(strstr(a.error, "query of 4 hashes: no reply from the openinfer server within 300 ms") !=
        NULL);
  CHECK(a.ended_ms >= CONTROL_MS - 20 && a.ended_ms < CONTROL_MS + SLACK_MS);
  CHECK_ST(b.st, OI_OK);
  CHECK(b.hits == 1);
  CHECK(b.ended_ms >= 650 && b.ended_ms < 2000); /* its reply, not its deadline */

  /* A save's Result (at 200 ms) arrives while the main thread waits for a
   * query reply (at 600 ms): the save completes then, on another thread. */
  done_where d;
  memset(&d, 0, sizeof d);
  pthread_mutex_init(&d.lock, NULL);
  fs_script(fs, oiwire_Envelope_save_tag, (fs_step){.delay_ms = 200});
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.delay_ms = 600});
  int64_t ids[2] = {0, 1};
  oi_block_hash h[2] = {tl_hash(25, 0), tl_hash(25, 1)};
  oi_save_options so;
  oi_save_options_init(&so);
  so.on_done = on_done_where;
  so.on_done_ctx = &d;
  d.t0 = oi__now_ns();
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(c.e, ids, h, 2, &so, &t));
  CHECK_OK(query_wait(&c, 3000, &r)); /* (slack for a loaded ThreadSanitizer run) */
  uint64_t query_ms = ms_since(d.t0);
  CHECK(query_ms >= 600 - 20);
  CHECK_ST(ticket_end(t, 5000), OI_OK);
  oi_ticket_release(t);
  pthread_mutex_lock(&d.lock);
  CHECK(d.calls == 1 && d.st == OI_OK);
  CHECK(!pthread_equal(d.thread, pthread_self()));
  CHECK(d.at_ms >= 200 - 20 && d.at_ms + 100 < query_ms);
  pthread_mutex_unlock(&d.lock);

  /* The connection ends while A waits (deadline 2.3 s) and B follows:
   * both are told at once; the engine degrades, reconnects and works. */
  seen = fs_seen(fs, oiwire_Envelope_query_tag);
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = FS_SILENT});
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = FS_SILENT});
  t0 = oi__now_ns();
  query_job_start(&a, &c, 2000, t0);
  REQUIRE(fs_wait_seen(fs, oiwire_Envelope_query_tag, seen + 1, 5000));
  query_job_start(&b, &c, 2000, t0);
  REQUIRE(fs_wait_seen(fs, oiwire_Envelope_query_tag, seen + 2, 5000));
  fs_close_all(fs, OI_ERR_INTERNAL, "the fake server restarts");
  pthread_join(a.thread, NULL);
  pthread_join(b.thread, NULL);
  for (query_job *j = &a; j; j = j == &a ? &b : NULL) {
    CHECK_ST(j->st, OI_ERR_INTERNAL);
    CHECK(strstr(j->error, "the connection to the openinfer server ended") != NULL);
    CHECK(strstr(j->error, "the fake server restarts") != NULL);
    CHECK(j->ended_ms < 1500);
  }
  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  for (int i = 0; i < 500; i++) {
    CHECK_OK(oi_engine_get_stats(c.e, &s));
    if (s.connection == OI_CONNECTION_CONNECTED) break;
    usleep(10000);
  }
  CHECK(s.connection == OI_CONNECTION_CONNECTED && s.reconnects == 1);
  check_usable(&c, 2);
  client_close(&c);
  fs_stop(fs);
}

/* Log lines, to see why a reconnect failed. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[1 << 16];
static size_t log_len;

static void log_keep(void *ctx, oi_log_level level, const char *line) {
  (void)ctx;
  (void)level;
  pthread_mutex_lock(&log_lock);
  size_t n = strlen(line);
  if (log_len + n + 2 < sizeof log_text) {
    memcpy(log_text + log_len, line, n);
    log_len += n;
    log_text[log_len++] = '\n';
    log_text[log_len] = '\0';
  }
  pthread_mutex_unlock(&log_lock);
}

static bool log_says(const char *needle) {
  pthread_mutex_lock(&log_lock);
  bool yes = strstr(log_text, needle) != NULL;
  pthread_mutex_unlock(&log_lock);
  return yes;
}

/* A reconnect (engine-owned) checks the new server's answers as a connect
 * does: each bad answer is one failed attempt, and the engine stays
 * degraded until an attempt succeeds. */
static void test_reconnect_replies(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, true) == OI_OK);
  log_len = 0;
  log_text[0] = '\0';
  oi_log_level level = oi_get_log_level();
  int failures = oi_test_failures;
  oi_set_log_handler(log_keep, NULL);
  oi_set_log_level(OI_LOG_DEBUG);
  /* Attempt 1: another protocol; 2: a Result error to the Hello; 3: a
   * register reply with an arena handle; 4: a register never answered; 5:
   * a register answered with the wrong type; then a good one. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.edit = hello_version_2});
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_RESULT, .status = OI_ERR_BUSY, .message = "busy restarting"});
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = register_owned_handle});
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.action = FS_SILENT});
  fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.edit = reply_as_stats_reply});
  fs_close_all(fs, OI_OK, NULL);
  oi_engine_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  uint64_t t0 = oi__now_ns();
  bool degraded_seen = false;
  for (int i = 0; i < 2000; i++) { /* 20 s: backoff 100, 200, 400, 800, 1600 ms + the silence */
    CHECK_OK(oi_engine_get_stats(c.e, &s));
    if (s.connection == OI_CONNECTION_DEGRADED) degraded_seen = true;
    if (s.connection == OI_CONNECTION_CONNECTED && degraded_seen) break;
    CHECK(s.reconnects == 0);
    usleep(10000);
  }
  CHECK(degraded_seen);
  CHECK(s.connection == OI_CONNECTION_CONNECTED && s.reconnects == 1);
  CHECK_ELAPSED(t0, 100 + 200 + 400 + 800 + CONTROL_MS, 20000);
  CHECK(fs_seen(fs, oiwire_Envelope_hello_tag) == 1 + 6);
  oi_set_log_handler(NULL, NULL);
  oi_set_log_level(level);
  CHECK(log_says("reconnect: hello: the server speaks protocol 2, this library 1"));
  CHECK(log_says("reconnect: hello: busy restarting"));
  CHECK(log_says("reconnect: register reply has instance 2 and a 64-byte handle"));
  CHECK(log_says("reconnect: register: no reply within 300 ms"));
  CHECK(log_says("reconnect: register: the server answered with message type 14"));
  if (oi_test_failures != failures) fprintf(stderr, "---- log ----\n%s---- end ----\n", log_text);
  check_usable(&c, 1);
  client_close(&c);
  fs_stop(fs);
}

/* The lookup client: never fatal; a lost server fails its calls with
 * OI_ERR_CLOSED and the reason, at once. */
static void test_lookup_client(void) {
  fs = fs_start();
  oi_lookup_options lo;
  oi_lookup_options_init(&lo);
  lo.namespace_id = "fake";
  lo.control_deadline_ms = 5000;
  /* replies, closes and garbage here, not deadlines: a loaded machine may
   * take longer than the default 50 ms to deliver them */
  lo.lookup_deadline_ms = 5000;
  oi_lookup *lc = NULL;
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_REFUSE, .status = OI_ERR_BUSY, .message = "full up"});
  CHECK_ST(oi_lookup_connect(fs_socket(fs), &lo, &lc), OI_ERR_BUSY);
  CHECK_ERR("full up");
  CHECK(lc == NULL);
  CHECK_OK(oi_lookup_connect(fs_socket(fs), &lo, &lc));
  REQUIRE(lc != NULL);
  oi_block_hash h[4];
  for (int i = 0; i < 4; i++)
    h[i] = tl_hash(24, (uint64_t)i);
  oi_query_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.edit = query_5_hits});
  CHECK_ST(oi_lookup_query(lc, NULL, h, 4, 0, &r), OI_ERR_PROTOCOL);
  CHECK_ERR("reported 5 hits and 0 pending for 4 hashes");
  /* A query in flight when the server ends the session: the waiter is
   * woken with the server's reason, long before its 5 s deadline. */
  fs_script(fs, oiwire_Envelope_query_tag,
            (fs_step){.action = FS_REFUSE,
                      .status = OI_ERR_INTERNAL,
                      .message = "the fake server shuts down"});
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi_lookup_query(lc, NULL, h, 4, 0, &r), OI_ERR_INTERNAL);
  CHECK_ELAPSED(t0, 0, 1000);
  CHECK_ERR("the connection to the openinfer server ended");
  CHECK_ERR("the fake server shuts down");
  /* Later calls fail at once, saying why. */
  t0 = oi__now_ns();
  CHECK_ST(oi_lookup_query(lc, NULL, h, 4, 0, &r), OI_ERR_CLOSED);
  CHECK_ELAPSED(t0, 0, 100);
  CHECK_ERR("lookup of 4 hashes: the connection to the openinfer server is closed");
  CHECK_ERR("the fake server shuts down");
  oi_lease lease;
  memset(lease.bytes, 0xAB, sizeof lease.bytes);
  CHECK_ST(oi_lookup_release(lc, lease), OI_ERR_CLOSED);
  CHECK_ERR("release: the connection to the openinfer server is closed");
  oi_lookup_destroy(lc);

  /* Garbage from the server ends the connection too; the decode error is the reason. */
  lc = NULL;
  CHECK_OK(oi_lookup_connect(fs_socket(fs), &lo, &lc));
  REQUIRE(lc != NULL);
  fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = FS_GARBAGE});
  t0 = oi__now_ns();
  CHECK_ST(oi_lookup_query(lc, NULL, h, 4, 0, &r), OI_ERR_CLOSED);
  CHECK_ELAPSED(t0, 0, 1000);
  CHECK_ERR("the connection to the openinfer server ended");
  CHECK_ST(oi_lookup_query(lc, NULL, h, 4, 0, &r), OI_ERR_CLOSED);
  CHECK_ERR("the connection to the openinfer server is closed");
  oi_lookup_destroy(lc);

  /* A frame longer than the limit, and a stream that ends inside a frame. */
  fs_action bad[] = {FS_OVERSIZE, FS_TRUNCATED};
  const char *why[] = {"exceeds", "inside a frame"};
  for (int i = 0; i < 2; i++) {
    lc = NULL;
    CHECK_OK(oi_lookup_connect(fs_socket(fs), &lo, &lc));
    REQUIRE(lc != NULL);
    fs_script(fs, oiwire_Envelope_query_tag, (fs_step){.action = bad[i]});
    t0 = oi__now_ns();
    CHECK_ST(oi_lookup_query(lc, NULL, h, 4, 0, &r), OI_ERR_CLOSED);
    CHECK_ELAPSED(t0, 0, 1000);
    CHECK_ERR("the connection to the openinfer server ended");
    CHECK_ERR(why[i]);
    oi_lookup_destroy(lc);
  }
  CHECK(fs_wait_no_connections(fs, 3000));
  fs_stop(fs);
}

/* A layered load: the arenas the server reported landed are ready at once;
 * a load that then fails (or times out) fails every arena's wait, even
 * those that had landed; progress past the layout's arenas is ignored. */
static void test_load_progress(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, false) == OI_OK);
  int64_t ids[2] = {0, 1};
  oi_lease lease;
  memset(lease.bytes, 0xAB, sizeof lease.bytes);
  oi_load_options lo;
  oi_load_options_init(&lo);
  lo.flags = OI_LOAD_ARENA_EVENTS;
  oi_ticket *t = NULL;
  fs_script(fs, oiwire_Envelope_load_tag, (fs_step){.action = FS_SILENT, .progress = 1});
  uint64_t t0 = oi__now_ns();
  CHECK_OK(oi_engine_load(c.e, lease, ids, 2, &lo, &t));
  REQUIRE(t != NULL);
  CHECK_OK(oi_ticket_arena_wait(t, 0, 2000));
  CHECK_ST(oi_ticket_arena_poll(t, 1), OI_PENDING);
  CHECK_ST(ticket_end(t, ASYNC_MS + 5000), OI_FENCING); /* unanswered: fencing */
  CHECK_ELAPSED(t0, ASYNC_MS - 20, ASYNC_MS + SLACK_MS);
  CHECK_ST(oi_ticket_arena_poll(t, 0), OI_FENCING);
  CHECK_ST(oi_ticket_arena_wait(t, 2, 0), OI_ERR_TIMEOUT);
  oi_ticket_release(t);
  await_live(&c);
  fs_script(fs, oiwire_Envelope_load_tag,
            (fs_step){.action = FS_RESULT,
                      .status = OI_ERR_IO,
                      .message = "load: copy failed at arena 2",
                      .progress = 2});
  CHECK_OK(oi_engine_load(c.e, lease, ids, 2, &lo, &t));
  CHECK_ST(ticket_end(t, 5000), OI_ERR_IO);
  CHECK_ST(oi_ticket_arena_poll(t, 0), OI_ERR_IO);
  CHECK_ST(oi_ticket_arena_poll(t, 2), OI_ERR_IO);
  oi_ticket_release(t);
  fs_script(fs, oiwire_Envelope_load_tag, (fs_step){.progress = TL_ARENAS + 5});
  CHECK_OK(oi_engine_load(c.e, lease, ids, 2, &lo, &t));
  CHECK_ST(ticket_end(t, 5000), OI_OK);
  CHECK_OK(oi_ticket_arena_poll(t, TL_ARENAS - 1));
  oi_ticket_release(t);
  check_usable(&c, 1);
  client_close(&c);
  fs_stop(fs);
}

/* The connection ends right after the register reply, while the client
 * imports the arena: connect fails with OI_ERR_CLOSED, or (when the
 * engine went live first) the fatal handler runs; it never hangs and never
 * returns an engine whose server is gone. In a child, for the fatal case. */
static void test_closed_after_register(void) {
  for (int round = 0; round < 3; round++) {
    int rfd;
    uint64_t t0 = oi__now_ns();
    pid_t child = fork_client(&rfd);
    if (child == 0) {
      client c;
      oi_status st = client_connect(&c, false);
      if (st == OI_ERR_CLOSED &&
          strstr(oi_last_error(), "connect: the connection to the openinfer server is closed"))
        _exit(10);
      if (st == OI_OK) sleep(10); /* live: the watchdog fires */
      fprintf(stderr, "connect: %s: %s\n", oi_status_str(st), oi_last_error());
      _exit(11);
    }
    fs_script(fs, oiwire_Envelope_register_instance_tag, (fs_step){.close_after = true});
    go_child();
    char reason[1024];
    read_reason(rfd, reason, sizeof reason);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status));
    bool refused = WEXITSTATUS(status) == 10;
    bool fatal = WEXITSTATUS(status) == 0 && strstr(reason, "died while this process");
    CHECK(refused || fatal);
    CHECK_ELAPSED(t0, 0, SLACK_MS + 1000);
    CHECK(fs_wait_no_connections(fs, 3000));
    fs_stop(fs);
  }
}

/* ---- oi_server_fetch_stats ------------------------------------------------------------- */

static void stats_with_host(fs_reply *r) {
  r->env.body.stats_reply.has_host = true;
  r->env.body.stats_reply.host.capacity_bytes = 12345;
  r->env.body.stats_reply.host.save_latency_us_count = 3;
  r->env.body.stats_reply.host.save_latency_us[2] = 9;
  r->env.body.stats_reply.sessions = 4;
}

/* The stats tool's client (lib/server/stats_fetch.c) against each bad
 * answer: the status and a message naming it, never figures made up. */
static void test_stats_fetch_replies(void) {
  fs = fs_start();
  oi_server_stats ss = {.struct_size = sizeof ss};
  oi_host_stats hs = {.struct_size = sizeof hs};
  /* Bad output structs: refused before anything is sent. */
  oi_host_stats small = {.struct_size = 2};
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &small, NULL, 0),
           OI_ERR_INVALID_ARGUMENT);
  CHECK_ERR("host struct_size 2 is too small");
  oi_host_namespace_stats ns[1] = {{.struct_size = 3}};
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, NULL, ns, 1), OI_ERR_INVALID_ARGUMENT);
  CHECK_ERR("namespaces[0].struct_size 3 is too small");
  CHECK(fs_seen(fs, FS_ACCEPT) == 0);
  /* A server without host figures (an older one). */
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0), OI_ERR_VERSION);
  CHECK_ERR("the server sent no host figures");
  /* With them: the figures as sent. */
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.edit = stats_with_host});
  CHECK_OK(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0));
  CHECK(ss.sessions == 4 && hs.capacity_bytes == 12345 && hs.save_latency_us[2] == 9);
  CHECK(ss.disk_attached == 0 && !strcmp(ss.socket_path, fs_socket(fs)));
  /* Timeout 0 (the default, 10 s) and UINT32_MAX (none) work the same. */
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.edit = stats_with_host});
  CHECK_OK(oi_server_fetch_stats(fs_socket(fs), 0, &ss, &hs, NULL, 0));
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.edit = stats_with_host});
  CHECK_OK(oi_server_fetch_stats(fs_socket(fs), UINT32_MAX, &ss, &hs, NULL, 0));
  CHECK(hs.capacity_bytes == 12345);
  /* A Result OK is no HelloReply. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.action = FS_RESULT, .status = OI_OK});
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0), OI_ERR_PROTOCOL);
  CHECK_ERR("hello: the server answered with message type");
  /* The Hello answered with another message, or an error. */
  fs_script(fs, oiwire_Envelope_hello_tag, (fs_step){.edit = reply_as_query_reply});
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0), OI_ERR_PROTOCOL);
  CHECK_ERR("hello: the server answered with message type 8");
  fs_script(fs, oiwire_Envelope_hello_tag,
            (fs_step){.action = FS_RESULT, .status = OI_ERR_PERMISSION, .message = "go away"});
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0), OI_ERR_PERMISSION);
  CHECK_ERR("go away");
  /* The Stats answered with another message, or an error. */
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.edit = reply_as_query_reply});
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0), OI_ERR_PROTOCOL);
  CHECK_ERR("stats: the server answered with message type 8");
  fs_script(fs, oiwire_Envelope_stats_tag,
            (fs_step){.action = FS_RESULT, .status = OI_ERR_INTERNAL, .message = "stats broke"});
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0), OI_ERR_INTERNAL);
  CHECK_ERR("stats broke");
  /* No answer: the caller's timeout, not a hang. */
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.action = FS_SILENT});
  uint64_t t0 = oi__now_ns();
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 200, &ss, &hs, NULL, 0), OI_ERR_IO);
  CHECK_ELAPSED(t0, 180, 200 + SLACK_MS);
  CHECK_ERR("recv: ");
  /* Bytes that are no Envelope. */
  fs_script(fs, oiwire_Envelope_stats_tag, (fs_step){.action = FS_GARBAGE});
  CHECK_ST(oi_server_fetch_stats(fs_socket(fs), 1000, &ss, &hs, NULL, 0), OI_ERR_PROTOCOL);
  CHECK_ERR("malformed message");
  /* No socket path: the default one (nothing listens there). */
  const char *saved = getenv("XDG_RUNTIME_DIR");
  char *keep = saved ? strdup(saved) : NULL;
  setenv("XDG_RUNTIME_DIR", "/tmp/oi-no-such-dir", 1);
  CHECK_ST(oi_server_fetch_stats(NULL, 1000, &ss, &hs, NULL, 0), OI_ERR_NOT_FOUND);
  CHECK_ERR("/tmp/oi-no-such-dir/openinfer.sock");
  char longdir[120];
  memset(longdir, 'd', sizeof longdir);
  longdir[0] = '/';
  longdir[sizeof longdir - 1] = '\0';
  setenv("XDG_RUNTIME_DIR", longdir, 1);
  CHECK_ST(oi_server_fetch_stats(NULL, 1000, &ss, &hs, NULL, 0), OI_ERR_INVALID_ARGUMENT);
  if (keep)
    setenv("XDG_RUNTIME_DIR", keep, 1);
  else
    unsetenv("XDG_RUNTIME_DIR");
  free(keep);
  fs_stop(fs);
}

/* Requests the client refuses before anything is sent: a save and a query
 * of one block more than a request carries, a query whose req_id is
 * 256 bytes. Each OI_ERR_INVALID_ARGUMENT naming the limit, the fake saw
 * none of them, and the client keeps working. A membership query of no
 * hashes is answered (0 hits); an error Result without a message reads as
 * its status's name. */
static void test_requests_refused_before_sending(void) {
  fs = fs_start();
  client c;
  REQUIRE(client_connect(&c, false) == OI_OK);
  const size_t n = OI_WIRE_MAX_BLOCKS + 1;
  int64_t *ids = calloc(n, sizeof *ids);
  oi_block_hash *h = calloc(n, sizeof *h);
  REQUIRE(ids && h);
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)(i % 8);
    h[i] = tl_hash(25, i);
  }
  uint32_t saves = fs_seen(fs, oiwire_Envelope_save_tag),
           queries = fs_seen(fs, oiwire_Envelope_query_tag);
  oi_ticket *t = (oi_ticket *)(uintptr_t)1;
  CHECK_ST(oi_engine_save(c.e, ids, h, n, NULL, &t), OI_ERR_INVALID_ARGUMENT);
  CHECK_ERR("save: 65537 blocks (a sidecar request carries at most 65536)");
  CHECK(t == NULL);
  oi_lease lease;
  memset(lease.bytes, 0xAB, sizeof lease.bytes);
  oi_query_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  CHECK_ST(oi_engine_query(c.e, NULL, h, n, 0, &r), OI_ERR_INVALID_ARGUMENT);
  CHECK_ERR("query: 65537 blocks");
  char long_id[257];
  memset(long_id, 'r', 256);
  long_id[256] = '\0';
  CHECK_ST(oi_engine_query(c.e, long_id, h, 4, 0, &r), OI_ERR_INVALID_ARGUMENT);
  CHECK_ERR("req_id is longer than 255 bytes");
  CHECK(fs_seen(fs, oiwire_Envelope_save_tag) == saves);
  CHECK(fs_seen(fs, oiwire_Envelope_query_tag) == queries);
  /* 255 bytes is fine; so is a membership query of nothing. */
  long_id[255] = '\0';
  fs_set_hits(fs, 2);
  CHECK_OK(oi_engine_query(c.e, long_id, h, 4, 0, &r));
  CHECK(r.hit_blocks == 2);
  CHECK_OK(oi_engine_release(c.e, r.lease));
  oiwire_Envelope last;
  CHECK(fs_last(fs, oiwire_Envelope_query_tag, &last) && strlen(last.body.query.req_id) == 255);
  uint8_t present[1] = {7};
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.present = present;
  CHECK_OK(oi_engine_query(c.e, NULL, h, 0, OI_QUERY_MEMBERSHIP, &r));
  CHECK(r.hit_blocks == 0 && present[0] == 7);
  fs_set_hits(fs, 0);
  /* An error without a message: its status's name stands in. */
  fs_script(fs, oiwire_Envelope_release_tag,
            (fs_step){.action = FS_RESULT, .status = OI_ERR_INTERNAL, .message = ""});
  CHECK_ST(oi_engine_release(c.e, lease), OI_ERR_INTERNAL);
  CHECK_ERR("OI_ERR_INTERNAL");
  check_usable(&c, 3);
  free(ids);
  free(h);
  client_close(&c);
  CHECK(fs_wait_no_connections(fs, 3000));
  fs_stop(fs);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  oi_set_log_level(OI_LOG_OFF);
  RUN_TEST(test_nothing_listens);
  RUN_TEST(test_hello_replies);
  RUN_TEST(test_refused_and_closed_sessions);
  RUN_TEST(test_register_replies);
  RUN_TEST(test_async_deadlines);
  RUN_TEST(test_async_error_replies);
  RUN_TEST(test_control_replies);
  RUN_TEST(test_destroy_unanswered);
  RUN_TEST(test_closed_under_server_allocated_engine);
  RUN_TEST(test_closed_under_owned_engine);
  RUN_TEST(test_reconnect_replies);
  RUN_TEST(test_lookup_client);
  RUN_TEST(test_load_progress);
  RUN_TEST(test_closed_after_register);
  RUN_TEST(test_stats_fetch_replies);
  RUN_TEST(test_caller_reads_replies);
  RUN_TEST(test_requests_refused_before_sending);
  TEST_EXIT();
}
