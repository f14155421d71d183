/* The sidecar protocol's codec at its bounds: a request one element over a
 * limit (block ids, hashes, membership bytes, arenas, namespaces) still
 * decodes but is marked bad with a message naming the limit (the server
 * answers it with an error and keeps the session); exactly at the limit it
 * is whole. The encoder refuses a frame over OI_WIRE_MAX_FRAME. Sending and
 * receiving fail with OI_ERR_IO (not CLOSED) on errors other than a closed
 * connection, and with PROTOCOL on a frame cut short or over the limit. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/core.h"
#include "proto/wire.h"
#include "testutil.h"

/* Encodes `env` with `out`, decodes it back into `a`. */
static oi_status round_trip(const oiwire_Envelope *env, const oi_wire_out *out,
                            oiwire_Envelope *back, oi_wire_arrays *a) {
  uint8_t *frame = NULL;
  size_t len = 0;
  oi_status st = oi__wire_encode(env, out, &frame, &len);
  if (st != OI_OK) return st;
  st = oi__wire_decode(frame + 4, len - 4, back, a);
  oi__free(frame);
  return st;
}

static void test_hashes_and_ids_over_the_limit(void) {
  size_t n = OI_WIRE_MAX_BLOCKS + 1;
  oi_block_hash *hs = calloc(n, sizeof *hs);
  int64_t *ids = calloc(n, sizeof *ids);
  REQUIRE(hs && ids);
  static oiwire_Envelope env, back;
  oi_wire_arrays a;
  memset(&a, 0, sizeof a);
  for (int over = 0; over < 2; over++) {
    size_t k = over ? n : n - 1;
    /* a Query's hashes */
    memset(&env, 0, sizeof env);
    env.which_body = oiwire_Envelope_query_tag;
    oi_wire_out out = {.hashes = hs, .n_hashes = k};
    CHECK_OK(round_trip(&env, &out, &back, &a));
    CHECK(back.which_body == oiwire_Envelope_query_tag);
    if (over) {
      CHECK(a.bad == OI_ERR_INVALID_ARGUMENT && a.n_hashes == OI_WIRE_MAX_BLOCKS);
      CHECK(strstr(a.bad_msg, "more than 65536 hashes"));
    } else {
      CHECK(a.bad == OI_OK && a.n_hashes == OI_WIRE_MAX_BLOCKS);
    }
    /* a Save's block ids (the hashes within the limit) */
    memset(&env, 0, sizeof env);
    env.which_body = oiwire_Envelope_save_tag;
    oi_wire_out sv = {.ids = ids, .n_ids = k, .hashes = hs, .n_hashes = 1};
    CHECK_OK(round_trip(&env, &sv, &back, &a));
    if (over) {
      CHECK(a.bad == OI_ERR_INVALID_ARGUMENT && strstr(a.bad_msg, "more than 65536 block ids"));
    } else {
      CHECK(a.bad == OI_OK && a.n_ids == OI_WIRE_MAX_BLOCKS && a.n_hashes == 1);
    }
  }
  oi__wire_arrays_free(&a);
  free(hs);
  free(ids);
}

static void test_membership_bytes_over_the_limit(void) {
  size_t n = OI_WIRE_MAX_BLOCKS + 1;
  uint8_t *present = malloc(n);
  REQUIRE(present);
  memset(present, 1, n);
  static oiwire_Envelope env, back;
  oi_wire_arrays a;
  memset(&a, 0, sizeof a);
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_query_reply_tag;
  oi_wire_out out = {.present = present, .n_present = n};
  CHECK_OK(round_trip(&env, &out, &back, &a));
  CHECK(a.bad == OI_ERR_INVALID_ARGUMENT && strstr(a.bad_msg, "more than 65536 membership bytes"));
  CHECK(a.n_present == 0); /* none of the oversized run was taken */
  out.n_present = n - 1;
  CHECK_OK(round_trip(&env, &out, &back, &a));
  CHECK(a.bad == OI_OK && a.n_present == OI_WIRE_MAX_BLOCKS && a.present[n - 2] == 1);
  oi__wire_arrays_free(&a);
  free(present);
}

static void test_arenas_over_the_limit(void) {
  size_t n = OI_WIRE_MAX_ARENAS + 1;
  oi_arena_desc *ad = calloc(n, sizeof *ad);
  REQUIRE(ad);
  for (size_t i = 0; i < n; i++)
    ad[i] = (oi_arena_desc){
        .name = "a", .num_blocks = 1, .bytes_per_block = 64, .block_stride = 64, .segments = 1};
  static oiwire_Envelope env, back;
  oi_wire_arrays a;
  memset(&a, 0, sizeof a);
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_register_instance_tag;
  oi_wire_out out = {.arenas = ad, .n_arenas = n};
  CHECK_OK(round_trip(&env, &out, &back, &a));
  CHECK(a.bad == OI_ERR_INVALID_ARGUMENT && strstr(a.bad_msg, "more than 4096 arenas"));
  out.n_arenas = n - 1;
  CHECK_OK(round_trip(&env, &out, &back, &a));
  CHECK(a.bad == OI_OK && a.n_arenas == OI_WIRE_MAX_ARENAS &&
        a.arenas[n - 2].bytes_per_block == 64);
  oi__wire_arrays_free(&a);
  free(ad);
}

static void test_namespaces_over_the_limit(void) {
  size_t n = OI_WIRE_MAX_NAMESPACES + 1;
  oiwire_NamespaceStats *ns = calloc(n, sizeof *ns);
  REQUIRE(ns);
  for (size_t i = 0; i < n; i++) {
    snprintf(ns[i].name, sizeof ns[i].name, "ns%zu", i);
    ns[i].block_bytes = 4096;
  }
  static oiwire_Envelope env, back;
  oi_wire_arrays a;
  memset(&a, 0, sizeof a);
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_stats_reply_tag;
  oi_wire_out out = {.namespaces = ns, .n_namespaces = n};
  CHECK_OK(round_trip(&env, &out, &back, &a));
  CHECK(a.bad == OI_ERR_INVALID_ARGUMENT && strstr(a.bad_msg, "more than 4096 namespaces"));
  out.n_namespaces = n - 1;
  CHECK_OK(round_trip(&env, &out, &back, &a));
  CHECK(a.bad == OI_OK && a.n_namespaces == OI_WIRE_MAX_NAMESPACES);
  CHECK(!strcmp(a.namespaces[n - 2].name, "ns4095"));
  oi__wire_arrays_free(&a);
  free(ns);
}

/* 18 bytes a hash on the wire: 500000 of them are over the 8 MiB frame. */
static void test_the_encoder_refuses_an_oversized_frame(void) {
  size_t n = 500000;
  oi_block_hash *hs = calloc(n, sizeof *hs);
  REQUIRE(hs);
  static oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_query_tag;
  oi_wire_out out = {.hashes = hs, .n_hashes = n};
  uint8_t *frame = (uint8_t *)&env;
  size_t len = 1;
  CHECK_ST(oi__wire_encode(&env, &out, &frame, &len), OI_ERR_INVALID_ARGUMENT);
  CHECK(frame == NULL && len == 0);
  CHECK(strstr(oi_last_error(), "exceeds the 8388608-byte frame limit"));
  out.n_hashes = 1000; /* well within: encodes */
  CHECK_OK(oi__wire_encode(&env, &out, &frame, &len));
  CHECK(frame && len > 4 && len - 4 <= OI_WIRE_MAX_FRAME);
  oi__free(frame);
  free(hs);
}

static void test_send_and_recv_errors(void) {
  uint8_t msg[8] = {4, 0, 0, 0, 1, 2, 3, 4};
  /* Not a socket, and no descriptor at all: I/O errors, not CLOSED. */
  int p[2];
  REQUIRE(pipe(p) == 0);
  CHECK_ST(oi__wire_send(p[1], msg, sizeof msg), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "send: "));
  CHECK_ST(oi__wire_send(-1, msg, sizeof msg), OI_ERR_IO);
  uint8_t *buf = NULL;
  size_t cap = 0, len = 0;
  CHECK_ST(oi__wire_recv(-1, 1024, &buf, &cap, &len), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "recv: "));
  close(p[0]);
  close(p[1]);
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  /* Passing a descriptor that is not open: sendmsg fails, OI_ERR_IO. */
  CHECK_ST(oi__wire_send_fd(sv[0], msg, sizeof msg, -1), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "SCM_RIGHTS"));
  /* A frame over the receiver's limit: PROTOCOL, its bytes left unread. */
  CHECK_OK(oi__wire_send(sv[0], msg, sizeof msg));
  CHECK_ST(oi__wire_recv(sv[1], 3, &buf, &cap, &len), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "exceeds the 3-byte limit"));
  uint8_t rest[4];
  CHECK(recv(sv[1], rest, sizeof rest, 0) == 4 && rest[0] == 1); /* only the header was read */
  /* A whole frame arrives; a frame cut short ends in PROTOCOL. */
  CHECK_OK(oi__wire_send(sv[0], msg, sizeof msg));
  CHECK_OK(oi__wire_recv(sv[1], 1024, &buf, &cap, &len));
  CHECK(len == 4 && buf[0] == 1 && buf[3] == 4);
  CHECK_OK(oi__wire_send(sv[0], msg, 6));
  shutdown(sv[0], SHUT_WR);
  CHECK_ST(oi__wire_recv(sv[1], 1024, &buf, &cap, &len), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "inside a frame"));
  /* The peer gone: CLOSED both ways. */
  close(sv[1]);
  CHECK_ST(oi__wire_send(sv[0], msg, sizeof msg), OI_ERR_CLOSED);
  close(sv[0]);
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  close(sv[0]);
  CHECK_ST(oi__wire_recv(sv[1], 1024, &buf, &cap, &len), OI_ERR_CLOSED);
  close(sv[1]);
  oi__free(buf);
}

int main(void) {
  RUN_TEST(test_hashes_and_ids_over_the_limit);
  RUN_TEST(test_membership_bytes_over_the_limit);
  RUN_TEST(test_arenas_over_the_limit);
  RUN_TEST(test_namespaces_over_the_limit);
  RUN_TEST(test_the_encoder_refuses_an_oversized_frame);
  RUN_TEST(test_send_and_recv_errors);
  TEST_EXIT();
}
