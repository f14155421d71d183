/* Bad input over the wire: truncated and oversized frames, unknown message
 * types, wrong hash and lease lengths, counts that do not match, block ids
 * out of range, another session's instance, garbage bytes. Each gets an
 * error reply (the session continues) or drops only that session; a good
 * client keeps working, byte-exact, after every case. */
#include "sidecar_util.h"

static test_server ts;
static oi_engine *good;
static oi_imported_arena *good_arena;
static oi_arena_desc good_layout[TL_ARENAS];
static uint64_t good_round; /* logical blocks used so far */

/* An Arena message: "a", 4 blocks of 1024 bytes, stride 1024, one segment. */
static pbw *one_arena(void) {
  pbw *arena = pbw_new();
  pbw_bytes(arena, 1, "a", 1);
  pbw_uint(arena, 3, 4);
  pbw_uint(arena, 4, 1024);
  pbw_uint(arena, 5, 1024);
  pbw_uint(arena, 6, 1);
  return arena;
}

/* The good client saves a fresh block and restores it elsewhere. */
static void good_client_works(const char *after) {
  uint8_t *base = oi_imported_arena_ptr(good_arena);
  uint64_t logical = 1000 + good_round++;
  int64_t src = (int64_t)(good_round % 8), dst = 8 + (int64_t)(good_round % 8);
  oi_block_hash h = tl_hash(7, logical);
  tl_fill(base, good_layout, src, logical);
  oi_ticket *t = NULL;
  oi_status st = oi_engine_save(good, &src, &h, 1, NULL, &t);
  if (st == OI_OK) st = oi_ticket_wait(t, 10000);
  oi_ticket_release(t);
  oi_query_result qr = {.struct_size = sizeof qr};
  if (st == OI_OK) st = oi_engine_query(good, NULL, &h, 1, 0, &qr);
  if (st == OI_OK && qr.hit_blocks != 1) st = OI_ERR_NOT_FOUND;
  t = NULL;
  if (st == OI_OK) st = oi_engine_load(good, qr.lease, &dst, 1, NULL, &t);
  if (st == OI_OK) st = oi_ticket_wait(t, 10000);
  oi_ticket_release(t);
  if (st != OI_OK || !tl_check(base, good_layout, dst, logical)) {
    fprintf(stderr, "the good client failed after '%s': %s %s\n", after, oi_status_str(st),
            oi_last_error());
    oi_test_failures++;
  }
}

static void hello_client(wire_client *c) {
  REQUIRE(wc_connect(c, ts.socket));
  REQUIRE(wc_hello(c, NULL));
}

/* Expects a Result for request `id` with `st` whose message contains `needle`. */
static void expect_error(wire_client *c, uint64_t id, oi_status st, const char *needle,
                         const char *what) {
  oi_status rs = wc_recv(c, 5000);
  bool ok = rs == OI_OK && c->env.request_id == id &&
            c->env.which_body == oiwire_Envelope_result_tag && c->env.body.result.status == st &&
            (!needle || strstr(c->env.body.result.message, needle));
  if (!ok) {
    fprintf(stderr,
            "%s: expected %s containing '%s' for request %llu; got %s, request %llu, body %u, "
            "status %s, message '%s'\n",
            what, oi_status_str(st), needle ? needle : "", (unsigned long long)id,
            oi_status_str(rs), (unsigned long long)c->env.request_id, c->env.which_body,
            oi_status_str(c->env.body.result.status), c->env.body.result.message);
    oi_test_failures++;
  }
}

/* The session still answers. */
static void still_served(wire_client *c, const char *what) {
  if (!wc_hello(c, NULL)) {
    fprintf(stderr, "%s: the session no longer answers\n", what);
    oi_test_failures++;
  }
}

/* The server ended the session (after a Result with request id 0). */
static void dropped(wire_client *c, const char *what) {
  bool saw_reason = false;
  for (;;) {
    oi_status st = wc_recv(c, 5000);
    if (st == OI_OK && c->env.request_id == 0 && c->env.which_body == oiwire_Envelope_result_tag)
      saw_reason = true;
    if (st != OI_OK) {
      if (st != OI_ERR_CLOSED) {
        fprintf(stderr, "%s: the session was not closed (%s)\n", what, oi_status_str(st));
        oi_test_failures++;
      }
      break;
    }
  }
  (void)saw_reason;
}

static pbw *save_body(uint32_t instance, const int64_t *ids, size_t n_ids, size_t n_hashes,
                      size_t hash_len) {
  pbw *b = pbw_new();
  pbw_uint(b, 1, instance);
  if (n_ids) pbw_ids(b, 2, ids, n_ids);
  uint8_t h[64];
  memset(h, 0x5a, sizeof h);
  for (size_t i = 0; i < n_hashes; i++)
    pbw_bytes(b, 3, h, hash_len);
  return b;
}

static void send_env(wire_client *c, uint64_t id, uint32_t field, pbw *body) {
  pbw *env = pbw_envelope(id, field, body);
  REQUIRE(wc_send_payload(c, env->b, env->n));
  free(env);
  free(body);
}

static void test_frames(void) {
  wire_client c;
  /* truncated: a header promising 100 bytes, 50 sent, then the end */
  hello_client(&c);
  uint8_t hdr[4] = {100, 0, 0, 0}, half[50] = {0};
  CHECK(wc_send_raw(&c, hdr, 4) && wc_send_raw(&c, half, sizeof half));
  shutdown(c.fd, SHUT_WR);
  dropped(&c, "truncated frame");
  wc_close(&c);
  good_client_works("truncated frame");

  /* oversized: refused from the header alone */
  hello_client(&c);
  uint32_t big = OI_WIRE_MAX_FRAME + 1;
  uint8_t bh[4] = {(uint8_t)big, (uint8_t)(big >> 8), (uint8_t)(big >> 16), (uint8_t)(big >> 24)};
  CHECK(wc_send_raw(&c, bh, 4));
  expect_error(&c, 0, OI_ERR_PROTOCOL, "exceeds", "oversized frame");
  dropped(&c, "oversized frame");
  wc_close(&c);
  good_client_works("oversized frame");

  /* garbage inside a well-formed frame */
  hello_client(&c);
  uint8_t junk[32];
  memset(junk, 0xff, sizeof junk);
  CHECK(wc_send_payload(&c, junk, sizeof junk));
  expect_error(&c, 0, OI_ERR_PROTOCOL, "malformed", "garbage payload");
  dropped(&c, "garbage payload");
  wc_close(&c);
  good_client_works("garbage payload");

  /* not our protocol at all */
  REQUIRE(wc_connect(&c, ts.socket));
  const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  CHECK(wc_send_raw(&c, http, strlen(http)));
  dropped(&c, "HTTP request");
  wc_close(&c);
  good_client_works("HTTP request");

  /* an empty frame is an Envelope with no body: an error, not a drop */
  hello_client(&c);
  CHECK(wc_send_payload(&c, NULL, 0));
  expect_error(&c, 0, OI_ERR_UNSUPPORTED, "unknown message type", "empty frame");
  still_served(&c, "empty frame");
  wc_close(&c);
}

static void test_requests(void) {
  oi_engine_stats gs = {.struct_size = sizeof gs};
  CHECK_OK(oi_engine_get_stats(good, &gs));
  uint32_t other = gs.instance_id;

  wire_client c;
  REQUIRE(wc_connect(&c, ts.socket));
  /* before Hello: an empty frame is still an unknown type, not a Hello miss */
  CHECK(wc_send_payload(&c, NULL, 0));
  expect_error(&c, 0, OI_ERR_UNSUPPORTED, "unknown message type", "empty frame before hello");
  pbw *b = pbw_new();
  pbw_uint(b, 1, 0);
  send_env(&c, 41, oiwire_Envelope_stats_tag, b);
  expect_error(&c, 41, OI_ERR_STATE, "Hello", "request before hello");
  CHECK(wc_hello(&c, NULL));

  /* unknown message type (field 40 of the envelope) */
  uint8_t unknown[] = {0x08, 0x07, 0xC2, 0x02, 0x00};
  CHECK(wc_send_payload(&c, unknown, sizeof unknown));
  expect_error(&c, 7, OI_ERR_UNSUPPORTED, "unknown message type", "unknown message type");
  /* a reply type sent as a request */
  b = pbw_new();
  pbw_uint(b, 1, 0);
  send_env(&c, 8, oiwire_Envelope_result_tag, b);
  expect_error(&c, 8, OI_ERR_UNSUPPORTED, "not a request", "reply as request");
  still_served(&c, "unknown message type");

  uint32_t mine = wc_register(&c, "bad-input", NULL, NULL);
  CHECK(mine != 0);
  int64_t ids[3] = {0, 1, 2};
  send_env(&c, 10, oiwire_Envelope_save_tag, save_body(mine, ids, 1, 1, 15));
  expect_error(&c, 10, OI_ERR_INVALID_ARGUMENT, "15 bytes (16 expected)", "short hash");
  send_env(&c, 11, oiwire_Envelope_save_tag, save_body(mine, ids, 1, 1, 17));
  expect_error(&c, 11, OI_ERR_INVALID_ARGUMENT, "17 bytes", "long hash");
  send_env(&c, 12, oiwire_Envelope_save_tag, save_body(mine, ids, 2, 1, 16));
  expect_error(&c, 12, OI_ERR_INVALID_ARGUMENT, "2 block ids but 1 hashes", "count mismatch");
  send_env(&c, 13, oiwire_Envelope_save_tag, save_body(mine, ids, 0, 0, 16));
  expect_error(&c, 13, OI_ERR_INVALID_ARGUMENT, "n = 0", "empty save");
  int64_t out_of_range[1] = {TL_BLOCKS}, negative[1] = {-1};
  send_env(&c, 14, oiwire_Envelope_save_tag, save_body(mine, out_of_range, 1, 1, 16));
  expect_error(&c, 14, OI_ERR_INVALID_ARGUMENT, "out of range", "block id out of range");
  send_env(&c, 15, oiwire_Envelope_save_tag, save_body(mine, negative, 1, 1, 16));
  expect_error(&c, 15, OI_ERR_INVALID_ARGUMENT, "out of range", "negative block id");
  /* a layerwise save naming arenas past the layout (Save.arena_first = 20,
   * arena_count = 21), and arena_first without arena_count */
  pbw *lw = save_body(mine, ids, 1, 1, 16);
  pbw_uint(lw, 20, TL_ARENAS);
  pbw_uint(lw, 21, 1);
  send_env(&c, 95, oiwire_Envelope_save_tag, lw);
  expect_error(&c, 95, OI_ERR_INVALID_ARGUMENT, "outside the layout", "layers past the layout");
  lw = save_body(mine, ids, 1, 1, 16);
  pbw_uint(lw, 20, 1);
  send_env(&c, 96, oiwire_Envelope_save_tag, lw);
  expect_error(&c, 96, OI_ERR_INVALID_ARGUMENT, "without arena_count", "arena_first alone");
  /* more ids than one request may carry */
  int64_t *many = calloc(OI_WIRE_MAX_BLOCKS + 1, sizeof *many);
  send_env(&c, 16, oiwire_Envelope_save_tag, save_body(mine, many, OI_WIRE_MAX_BLOCKS + 1, 0, 16));
  free(many);
  expect_error(&c, 16, OI_ERR_INVALID_ARGUMENT, "more than 65536", "too many ids");
  /* more hashes than one query may carry, and more arenas than one layout */
  {
    oi_block_hash *hs = calloc(OI_WIRE_MAX_BLOCKS + 1, sizeof *hs);
    REQUIRE(hs);
    static oiwire_Envelope env;
    memset(&env, 0, sizeof env);
    env.request_id = 97;
    env.which_body = oiwire_Envelope_query_tag;
    env.body.query.instance_id = mine;
    oi_wire_out out = {.hashes = hs, .n_hashes = OI_WIRE_MAX_BLOCKS + 1};
    REQUIRE(wc_send(&c, &env, &out));
    free(hs);
    expect_error(&c, 97, OI_ERR_INVALID_ARGUMENT, "more than 65536 hashes", "too many hashes");
    oi_arena_desc *ad = calloc(OI_WIRE_MAX_ARENAS + 1, sizeof *ad);
    REQUIRE(ad);
    for (size_t i = 0; i <= OI_WIRE_MAX_ARENAS; i++)
      ad[i] = (oi_arena_desc){
          .name = "a", .num_blocks = 1, .bytes_per_block = 64, .block_stride = 64, .segments = 1};
    memset(&env, 0, sizeof env);
    env.request_id = 98;
    env.which_body = oiwire_Envelope_register_instance_tag;
    snprintf(env.body.register_instance.namespace_id,
             sizeof env.body.register_instance.namespace_id, "too-many-arenas");
    env.body.register_instance.device = OI_DEVICE_CPU;
    env.body.register_instance.world_size = 1;
    env.body.register_instance.arena_size = 1 << 20;
    oi_wire_out ao = {.arenas = ad, .n_arenas = OI_WIRE_MAX_ARENAS + 1};
    REQUIRE(wc_send(&c, &env, &ao));
    free(ad);
    expect_error(&c, 98, OI_ERR_INVALID_ARGUMENT, "more than 4096 arenas", "too many arenas");
    still_served(&c, "requests over the limits");
  }
  /* unknown and foreign instances */
  send_env(&c, 17, oiwire_Envelope_save_tag, save_body(4000000, ids, 1, 1, 16));
  expect_error(&c, 17, OI_ERR_NOT_FOUND, "not registered", "unknown instance");
  send_env(&c, 18, oiwire_Envelope_save_tag, save_body(other, ids, 1, 1, 16));
  expect_error(&c, 18, OI_ERR_PERMISSION, "another session", "foreign save");
  b = pbw_new();
  pbw_uint(b, 1, other);
  send_env(&c, 19, oiwire_Envelope_unregister_tag, b);
  expect_error(&c, 19, OI_ERR_PERMISSION, "another session", "foreign unregister");
  b = pbw_new();
  pbw_uint(b, 1, other);
  send_env(&c, 20, oiwire_Envelope_flush_tag, b);
  expect_error(&c, 20, OI_ERR_PERMISSION, "another session", "foreign flush");
  /* a load with a lease of the wrong length, and with duplicate ids */
  b = pbw_new();
  pbw_uint(b, 1, mine);
  pbw_bytes(b, 2, "short", 5);
  pbw_ids(b, 3, ids, 1);
  send_env(&c, 21, oiwire_Envelope_load_tag, b);
  expect_error(&c, 21, OI_ERR_INVALID_ARGUMENT, "lease is 5 bytes", "short lease");
  uint8_t lease[16] = {1};
  int64_t dup[2] = {3, 3};
  b = pbw_new();
  pbw_uint(b, 1, mine);
  pbw_bytes(b, 2, lease, 16);
  pbw_ids(b, 3, dup, 2);
  send_env(&c, 22, oiwire_Envelope_load_tag, b);
  expect_error(&c, 22, OI_ERR_INVALID_ARGUMENT, "twice", "duplicate destination");
  /* an unknown lease: the load is refused, not run */
  b = pbw_new();
  pbw_uint(b, 1, mine);
  pbw_bytes(b, 2, lease, 16);
  pbw_ids(b, 3, ids, 1);
  send_env(&c, 23, oiwire_Envelope_load_tag, b);
  expect_error(&c, 23, OI_ERR_LEASE_EXPIRED, NULL, "unknown lease");
  /* a bad layout, and a layout without a size */
  b = pbw_new();
  pbw_bytes(b, 1, "ns", 2);
  pbw_uint(b, 3, pbw_zigzag(OI_DEVICE_CPU));
  pbw_uint(b, 4, 1);
  pbw_uint(b, 5, 4096);
  pbw *arena = pbw_new();
  pbw_bytes(arena, 1, "a", 1);
  pbw_uint(arena, 3, 4);    /* num_blocks */
  pbw_uint(arena, 4, 1024); /* bytes_per_block */
  pbw_uint(arena, 5, 512);  /* block_stride < bytes_per_block */
  pbw_uint(arena, 6, 1);
  pbw_bytes(b, 6, arena->b, arena->n);
  send_env(&c, 24, oiwire_Envelope_register_instance_tag, b);
  expect_error(&c, 24, OI_ERR_INVALID_ARGUMENT, "block_stride", "bad layout");
  b = pbw_new();
  pbw_bytes(b, 1, "ns", 2);
  pbw_bytes(b, 6, arena->b, arena->n);
  send_env(&c, 25, oiwire_Envelope_register_instance_tag, b);
  expect_error(&c, 25, OI_ERR_INVALID_ARGUMENT, "arena_size", "no arena_size");
  free(arena);
  /* segment offsets (K and V halves): one offset for two segments; halves
   * that overlap; one arena with offsets beside one without */
  for (int k = 0; k < 3; k++) {
    b = pbw_new();
    pbw_bytes(b, 1, "ns-halves", 9);
    pbw_uint(b, 3, pbw_zigzag(OI_DEVICE_CPU));
    pbw_uint(b, 4, 1);
    pbw_uint(b, 5, 1 << 20);
    for (int a = 0; a < (k == 2 ? 2 : 1); a++) {
      arena = pbw_new();
      pbw_bytes(arena, 1, a ? "b" : "a", 1);
      pbw_uint(arena, 2, (uint64_t)a * 65536); /* offset */
      pbw_uint(arena, 3, 8);                   /* num_blocks */
      pbw_uint(arena, 4, 1024);                /* bytes_per_block */
      pbw_uint(arena, 5, 1024);                /* block_stride */
      pbw_uint(arena, 6, 2);                   /* segments */
      if (a == 0) {
        pbw_uint(arena, 8, 0);
        if (k != 0) pbw_uint(arena, 8, k == 1 ? 7 * 1024 : 8 * 1024);
      }
      pbw_bytes(b, 6, arena->b, arena->n);
      free(arena);
    }
    send_env(&c, 90 + (uint64_t)k, oiwire_Envelope_register_instance_tag, b);
    expect_error(&c, 90 + (uint64_t)k, OI_ERR_INVALID_ARGUMENT,
                 k == 1 ? "segments 0 and 1 overlap" : "segment offsets",
                 k == 0   ? "one offset for two segments"
                 : k == 1 ? "overlapping halves"
                          : "offsets for one arena only");
  }
  /* a device this server does not serve / that does not exist */
  b = pbw_new();
  pbw_bytes(b, 1, "ns", 2);
  pbw_uint(b, 3, pbw_zigzag(77));
  pbw_uint(b, 5, 4096);
  send_env(&c, 26, oiwire_Envelope_register_instance_tag, b);
  oi_status rs = wc_recv(&c, 5000);
  CHECK(rs == OI_OK && c.env.request_id == 26 && c.env.which_body == oiwire_Envelope_result_tag &&
        c.env.body.result.status < 0);
  still_served(&c, "bad requests");
  good_client_works("bad requests");

  /* unregister of an unknown instance succeeds; the session's own works */
  b = pbw_new();
  pbw_uint(b, 1, 3999999);
  send_env(&c, 27, oiwire_Envelope_unregister_tag, b);
  expect_error(&c, 27, OI_OK, NULL, "unregister unknown");
  b = pbw_new();
  pbw_uint(b, 1, mine);
  send_env(&c, 28, oiwire_Envelope_unregister_tag, b);
  expect_error(&c, 28, OI_OK, NULL, "unregister");
  send_env(&c, 29, oiwire_Envelope_save_tag, save_body(mine, ids, 1, 1, 16));
  expect_error(&c, 29, OI_ERR_NOT_FOUND, "not registered", "save after unregister");

  /* a load with more block ids than one request may carry */
  {
    wire_client d;
    hello_client(&d);
    uint32_t inst = wc_register(&d, "bad-input-load", NULL, NULL);
    CHECK(inst != 0);
    int64_t *many = calloc(OI_WIRE_MAX_BLOCKS + 1, sizeof *many);
    REQUIRE(many);
    b = pbw_new();
    pbw_uint(b, 1, inst);
    pbw_bytes(b, 2, lease, 16);
    pbw_ids(b, 3, many, OI_WIRE_MAX_BLOCKS + 1);
    free(many);
    send_env(&d, 31, oiwire_Envelope_load_tag, b);
    expect_error(&d, 31, OI_ERR_INVALID_ARGUMENT, "load: more than 65536 block ids",
                 "load with too many ids");
    /* an engine-owned device arena sent with a file descriptor: a device
     * arena travels as an IPC handle */
    b = pbw_new();
    pbw_bytes(b, 1, "owned-dev", 9);
    pbw_uint(b, 3, pbw_zigzag(0)); /* device 0 */
    pbw_uint(b, 4, 1);
    pbw_uint(b, 5, 4096);
    arena = one_arena();
    pbw_bytes(b, 6, arena->b, arena->n);
    free(arena);
    uint8_t handle[OI_WIRE_HANDLE_BYTES] = {1};
    pbw_uint(b, oiwire_Register_client_owned_tag, 1);
    pbw_bytes(b, oiwire_Register_client_handle_tag, handle, sizeof handle);
    pbw *env = pbw_envelope(32, oiwire_Envelope_register_instance_tag, b);
    uint8_t *frame = malloc(env->n + 4);
    REQUIRE(frame);
    frame[0] = (uint8_t)env->n;
    frame[1] = (uint8_t)(env->n >> 8);
    frame[2] = (uint8_t)(env->n >> 16);
    frame[3] = (uint8_t)(env->n >> 24);
    memcpy(frame + 4, env->b, env->n);
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    CHECK_OK(oi__wire_send_fd(d.fd, frame, env->n + 4, pfd[0]));
    free(frame);
    free(env);
    free(b);
    expect_error(&d, 32, OI_ERR_INVALID_ARGUMENT, "travels as an IPC handle, not a file descriptor",
                 "device arena with a descriptor");
    /* an engine-owned device arena with a short handle, or an offset past
     * any arena; a Hello of another protocol version */
    for (int k = 0; k < 4; k++) {
      b = pbw_new();
      pbw_bytes(b, oiwire_Register_namespace_id_tag, "owned-dev", 9);
      pbw_uint(b, oiwire_Register_device_tag, pbw_zigzag(k >= 2 ? OI_DEVICE_CPU : 0));
      pbw_uint(b, oiwire_Register_world_size_tag, 1);
      pbw_uint(b, oiwire_Register_arena_size_tag, 4096);
      arena = one_arena();
      pbw_bytes(b, oiwire_Register_arenas_tag, arena->b, arena->n);
      free(arena);
      if (k != 3) pbw_uint(b, oiwire_Register_client_owned_tag, 1);
      if (k < 2)
        pbw_bytes(b, oiwire_Register_client_handle_tag, handle, k == 0 ? 10 : sizeof handle);
      if (k >= 1) pbw_uint(b, oiwire_Register_client_offset_tag, k == 1 ? 1ull << 49 : 4096);
      static const char *const why[4] = {"needs its 64-byte IPC handle (got 10 bytes)",
                                         "client_offset 562949953421312 is too large",
                                         "mapped from offset 0", "are for engine-owned memory"};
      static const char *const what[4] = {"short device handle", "offset past any arena",
                                          "an owned cpu arena at an offset",
                                          "an offset without client_owned"};
      send_env(&d, 40 + (uint64_t)k, oiwire_Envelope_register_instance_tag, b);
      expect_error(&d, 40 + (uint64_t)k, OI_ERR_INVALID_ARGUMENT, why[k], what[k]);
    }
    b = pbw_new();
    pbw_uint(b, oiwire_Hello_protocol_version_tag, 2);
    send_env(&d, 35, oiwire_Envelope_hello_tag, b);
    expect_error(&d, 35, OI_ERR_VERSION, "protocol version 2 is not supported (server speaks 1)",
                 "hello of protocol 2");
    /* requests naming no instance, an unknown one, or with bad flags or
     * leases: each its error, the session stays */
    uint8_t h16[16];
    memset(h16, 0x33, sizeof h16);
    b = pbw_new(); /* instance 0 and no namespace: no lookup */
    pbw_bytes(b, oiwire_Query_hashes_tag, h16, 16);
    send_env(&d, 50, oiwire_Envelope_query_tag, b);
    expect_error(&d, 50, OI_ERR_NOT_FOUND, "query: instance 0 is not registered", "query of 0");
    for (int lk = 0; lk < 2; lk++) { /* membership with a wait: refused (engine, lookup) */
      b = pbw_new();
      if (!lk) pbw_uint(b, oiwire_Query_instance_id_tag, inst);
      pbw_bytes(b, oiwire_Query_hashes_tag, h16, 16);
      pbw_uint(b, oiwire_Query_flags_tag, OI_QUERY_MEMBERSHIP | OI_QUERY_WAIT_PENDING);
      if (lk) pbw_bytes(b, oiwire_Query_namespace_id_tag, "bad-input-load", 14);
      send_env(&d, 51 + (uint64_t)lk, oiwire_Envelope_query_tag, b);
      expect_error(&d, 51 + (uint64_t)lk, OI_ERR_INVALID_ARGUMENT,
                   "applies to prefix queries, not membership", "membership with a wait");
    }
    b = pbw_new(); /* membership of no hashes: an empty answer */
    pbw_uint(b, oiwire_Query_instance_id_tag, inst);
    pbw_uint(b, oiwire_Query_flags_tag, OI_QUERY_MEMBERSHIP);
    send_env(&d, 53, oiwire_Envelope_query_tag, b);
    CHECK(wc_recv(&d, 5000) == OI_OK && d.env.request_id == 53 &&
          d.env.which_body == oiwire_Envelope_query_reply_tag &&
          d.env.body.query_reply.hit_blocks == 0 && d.arrays.n_present == 0);
    b = pbw_new();
    pbw_uint(b, oiwire_Load_instance_id_tag, 4000000);
    pbw_bytes(b, oiwire_Load_lease_tag, lease, 16);
    pbw_ids(b, oiwire_Load_dst_block_ids_tag, ids, 1);
    send_env(&d, 54, oiwire_Envelope_load_tag, b);
    expect_error(&d, 54, OI_ERR_NOT_FOUND, "load: instance 4000000", "load of an unknown instance");
    b = pbw_new();
    pbw_uint(b, oiwire_Release_instance_id_tag, inst);
    pbw_bytes(b, oiwire_Release_lease_tag, "short", 5);
    send_env(&d, 55, oiwire_Envelope_release_tag, b);
    expect_error(&d, 55, OI_ERR_INVALID_ARGUMENT, "release: lease is 5 bytes", "short release");
    b = pbw_new();
    pbw_uint(b, oiwire_Release_instance_id_tag, inst);
    pbw_bytes(b, oiwire_Release_lease_tag, lease, 16);
    send_env(&d, 56, oiwire_Envelope_release_tag, b);
    expect_error(&d, 56, OI_ERR_LEASE_EXPIRED, NULL, "release of an unknown lease");
    b = pbw_new(); /* instance 0 and no namespace: no lookup release either */
    pbw_bytes(b, oiwire_Release_lease_tag, lease, 16);
    send_env(&d, 59, oiwire_Envelope_release_tag, b);
    expect_error(&d, 59, OI_ERR_NOT_FOUND, "release: instance 0 is not registered", "release of 0");
    b = pbw_new();
    pbw_uint(b, oiwire_Stats_instance_id_tag, 4000000);
    send_env(&d, 57, oiwire_Envelope_stats_tag, b);
    expect_error(&d, 57, OI_ERR_NOT_FOUND, "stats: instance 4000000",
                 "stats of an unknown instance");
    b = pbw_new(); /* unregister of instance 0: nothing to do */
    send_env(&d, 58, oiwire_Envelope_unregister_tag, b);
    expect_error(&d, 58, OI_OK, NULL, "unregister of 0");
    still_served(&d, "load and register refused");
    /* a descriptor on a frame over the size limit: the session is dropped
     * and the descriptor closed by the server (the pipe's read end, passed,
     * is its last reader once ours is closed: writing fails) */
    uint32_t big = OI_WIRE_MAX_FRAME + 1;
    uint8_t bh[4] = {(uint8_t)big, (uint8_t)(big >> 8), (uint8_t)(big >> 16), (uint8_t)(big >> 24)};
    CHECK_OK(oi__wire_send_fd(d.fd, bh, sizeof bh, pfd[0]));
    close(pfd[0]);
    expect_error(&d, 0, OI_ERR_PROTOCOL, "exceeds", "oversized frame with a descriptor");
    dropped(&d, "oversized frame with a descriptor");
    wc_close(&d);
    signal(SIGPIPE, SIG_IGN);
    bool reader_gone = false;
    for (int i = 0; i < 500 && !reader_gone; i++) {
      reader_gone = write(pfd[1], "x", 1) < 0 && errno == EPIPE;
      if (!reader_gone) usleep(10000);
    }
    CHECK(reader_gone);
    close(pfd[1]);
    good_client_works("descriptors with bad frames");
  }

  /* a string longer than its bound does not decode: the session is dropped */
  b = pbw_new();
  char longns[300];
  memset(longns, 'n', sizeof longns);
  pbw_bytes(b, 1, longns, sizeof longns);
  send_env(&c, 30, oiwire_Envelope_register_instance_tag, b);
  expect_error(&c, 0, OI_ERR_PROTOCOL, "malformed", "over-long namespace");
  dropped(&c, "over-long namespace");
  wc_close(&c);
  good_client_works("over-long namespace");
}

static void test_server_state_after_abuse(void) {
  wire_client c;
  hello_client(&c);
  oiwire_StatsReply sr;
  /* only the good client's instance remains; dropped sessions freed theirs */
  CHECK(WAIT_FOR_STATS(&c, sr, sr.instances == 1 && sr.sessions == 2));
  wc_close(&c);
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_bad_input OPENINFER_EXE");
  ts_init(&ts, argv[1]);
  REQUIRE(ts_start(&ts, NULL));
  oi_engine_options o;
  tl_options(&o, good_layout, "bad-input");
  CHECK_OK(oi_engine_connect(ts.socket, &o, &good, &good_arena));
  REQUIRE(good && good_arena);
  good_client_works("start");
  RUN_TEST(test_frames);
  RUN_TEST(test_requests);
  RUN_TEST(test_server_state_after_abuse);
  oi_imported_arena_close(good_arena);
  oi_engine_destroy(good);
  CHECK(ts_stop(&ts));
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
