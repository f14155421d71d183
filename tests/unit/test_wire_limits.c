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
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "core/fault.h"
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

/* Encodes an envelope of body `tag` with *out, whose array (its count at
 * *count) holds one item more than the decoder takes, and decodes it into
 * *a: refused, the message naming `refusal`. Then with one item less:
 * accepted (the caller checks the arrays and frees them). */
static void check_one_over_the_limit(pb_size_t tag, oi_wire_out *out, size_t *count,
                                     const char *refusal, oi_wire_arrays *a) {
  static oiwire_Envelope env, back;
  memset(a, 0, sizeof *a);
  memset(&env, 0, sizeof env);
  env.which_body = tag;
  CHECK_OK(round_trip(&env, out, &back, a));
  CHECK(a->bad == OI_ERR_INVALID_ARGUMENT && strstr(a->bad_msg, refusal));
  (*count)--;
  CHECK_OK(round_trip(&env, out, &back, a));
  CHECK(a->bad == OI_OK);
}

/* A zeroed array of one item more than `limit`: *n = limit + 1 items of
 * `size` bytes. */
static void *one_over(size_t limit, size_t size, size_t *n) {
  *n = limit + 1;
  void *p = calloc(*n, size);
  REQUIRE(p);
  return p;
}

static void test_hashes_and_ids_over_the_limit(void) {
  size_t n;
  oi_block_hash *hs = one_over(OI_WIRE_MAX_BLOCKS, sizeof *hs, &n);
  int64_t *ids = one_over(OI_WIRE_MAX_BLOCKS, sizeof *ids, &n);
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
  size_t n;
  uint8_t *present = one_over(OI_WIRE_MAX_BLOCKS, 1, &n);
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
  size_t n;
  oi_arena_desc *ad = one_over(OI_WIRE_MAX_ARENAS, sizeof *ad, &n);
  for (size_t i = 0; i < n; i++)
    ad[i] = (oi_arena_desc){
        .name = "a", .num_blocks = 1, .bytes_per_block = 64, .block_stride = 64, .segments = 1};
  oi_wire_arrays a;
  oi_wire_out out = {.arenas = ad, .n_arenas = n};
  check_one_over_the_limit(oiwire_Envelope_register_instance_tag, &out, &out.n_arenas,
                           "more than 4096 arenas", &a);
  CHECK(a.n_arenas == OI_WIRE_MAX_ARENAS && a.arenas[n - 2].bytes_per_block == 64);
  oi__wire_arrays_free(&a);
  free(ad);
}

static void test_namespaces_over_the_limit(void) {
  size_t n;
  oiwire_NamespaceStats *ns = one_over(OI_WIRE_MAX_NAMESPACES, sizeof *ns, &n);
  for (size_t i = 0; i < n; i++) {
    snprintf(ns[i].name, sizeof ns[i].name, "ns%zu", i);
    ns[i].block_bytes = 4096;
  }
  oi_wire_arrays a;
  oi_wire_out out = {.namespaces = ns, .n_namespaces = n};
  check_one_over_the_limit(oiwire_Envelope_stats_reply_tag, &out, &out.n_namespaces,
                           "more than 4096 namespaces", &a);
  CHECK(a.n_namespaces == OI_WIRE_MAX_NAMESPACES);
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
  /* The peer closed with bytes it never read (the kernel resets the
   * connection: ECONNRESET): CLOSED, not an I/O error; sends after it too. */
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  CHECK_OK(oi__wire_send(sv[1], msg, sizeof msg));
  close(sv[0]);
  CHECK_ST(oi__wire_recv(sv[1], 1024, &buf, &cap, &len), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "closed the connection"));
  CHECK_ST(oi__wire_send(sv[1], msg, sizeof msg), OI_ERR_CLOSED);
  close(sv[1]);
  /* Injected faults (fault-injection builds): sends of one byte at a time
   * (sock_short with no size) still deliver the frame whole; a reset after
   * more bytes than the frame has sends it whole, then fails CLOSED. */
  if (oi__fault_available()) {
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    REQUIRE(oi__fault_arm(OI_FAULT_SOCK_SHORT, 0, 1, 0) == OI_OK);
    CHECK_OK(oi__wire_send(sv[0], msg, sizeof msg));
    CHECK(oi__fault_fired(OI_FAULT_SOCK_SHORT) == 1);
    CHECK_OK(oi__wire_recv(sv[1], 1024, &buf, &cap, &len));
    CHECK(len == 4 && buf[0] == 1 && buf[3] == 4);
    REQUIRE(oi__fault_arm(OI_FAULT_SOCK_RESET, 0, 1, 1000) == OI_OK);
    CHECK_ST(oi__wire_send(sv[0], msg, sizeof msg), OI_ERR_CLOSED);
    CHECK(strstr(oi_last_error(), "connection reset (injected fault)"));
    CHECK_OK(oi__wire_recv(sv[1], 1024, &buf, &cap, &len));
    CHECK(len == 4 && buf[3] == 4);
    CHECK_ST(oi__wire_recv(sv[1], 1024, &buf, &cap, &len), OI_ERR_CLOSED);
    oi__fault_disarm_all();
    close(sv[0]);
    close(sv[1]);
  }
  /* A stream socket never connected (ENOTCONN): CLOSED, with and without
   * a descriptor to pass. */
  int lone = socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(lone >= 0);
  CHECK_ST(oi__wire_send(lone, msg, sizeof msg), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "the peer closed the connection"));
  CHECK_ST(oi__wire_send_fd(lone, msg, sizeof msg, 0), OI_ERR_CLOSED);
  close(lone);
  oi__free(buf);
}

/* Descriptors passed with a frame: one is kept; more in one message are
 * closed and counted; more than the receiver has room for are cut by the
 * kernel and counted too. Passing one to a closed peer is CLOSED. */
static void send_fds(int sock, const void *bytes, size_t n, const int *fds, int nfds) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(8 * sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = (void *)bytes, .iov_len = n};
  struct msghdr m = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = ctl.buf,
                     .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int))};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
  memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
  REQUIRE(sendmsg(sock, &m, 0) == (ssize_t)n);
}

static bool fd_open(int fd) { return fcntl(fd, F_GETFD) >= 0; }

static void test_descriptors_with_a_frame(void) {
  uint8_t msg[8] = {4, 0, 0, 0, 9, 8, 7, 6};
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  int p[2];
  REQUIRE(pipe(p) == 0);
  uint8_t *buf = NULL;
  size_t cap = 0, len = 0;
  int got = -2, extra = -2;
  /* One descriptor (oi__wire_send_fd): kept. */
  CHECK_OK(oi__wire_send_fd(sv[0], msg, sizeof msg, p[0]));
  CHECK_OK(oi__wire_recv_fd(sv[1], 1024, &buf, &cap, &len, &got, &extra));
  CHECK(len == 4 && buf[0] == 9 && got >= 0 && extra == 0);
  CHECK(got != p[0] && fd_open(got));
  close(got);
  /* A frame without one: -1, nothing extra. */
  CHECK_OK(oi__wire_send(sv[0], msg, sizeof msg));
  CHECK_OK(oi__wire_recv_fd(sv[1], 1024, &buf, &cap, &len, &got, &extra));
  CHECK(got == -1 && extra == 0);
  /* Three in one message: the first kept, two closed and counted. */
  int three[3] = {p[0], p[1], p[0]};
  send_fds(sv[0], msg, sizeof msg, three, 3);
  CHECK_OK(oi__wire_recv_fd(sv[1], 1024, &buf, &cap, &len, &got, &extra));
  CHECK(got >= 0 && extra == 2 && len == 4 && buf[3] == 6);
  close(got);
  /* Eight: the receiver has room for four; the kernel cuts the rest
   * (MSG_CTRUNC), which counts as one more. */
  int eight[8];
  for (int i = 0; i < 8; i++)
    eight[i] = p[i % 2];
  send_fds(sv[0], msg, sizeof msg, eight, 8);
  CHECK_OK(oi__wire_recv_fd(sv[1], 1024, &buf, &cap, &len, &got, &extra));
  CHECK(got >= 0 && extra == 4); /* 3 closed + the truncation */
  close(got);
  /* A receiver with SO_PASSCRED: the credentials message comes first and
   * is skipped; it fills the room, so the kernel cuts the descriptor
   * (counted). The frame arrives whole. */
  int one = 1, zero = 0;
  REQUIRE(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) == 0);
  CHECK_OK(oi__wire_send_fd(sv[0], msg, sizeof msg, p[0]));
  CHECK_OK(oi__wire_recv_fd(sv[1], 1024, &buf, &cap, &len, &got, &extra));
  CHECK(len == 4 && buf[0] == 9 && buf[3] == 6);
  CHECK(got == -1 && extra == 1);
  REQUIRE(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &zero, sizeof zero) == 0);
  /* Descriptors on a frame over the limit: PROTOCOL, the one taken is the
   * caller's to close. */
  uint8_t big[4] = {0, 0, 1, 0}; /* 65536 bytes announced */
  CHECK_OK(oi__wire_send_fd(sv[0], big, sizeof big, p[1]));
  CHECK_ST(oi__wire_recv_fd(sv[1], 1024, &buf, &cap, &len, &got, &extra), OI_ERR_PROTOCOL);
  CHECK(got >= 0);
  close(got);
  /* Nothing to send: nothing sent, no descriptor passed. */
  CHECK_OK(oi__wire_send_fd(sv[0], msg, 0, p[1]));
  /* The peer gone: CLOSED. */
  close(sv[1]);
  CHECK_ST(oi__wire_send_fd(sv[0], msg, sizeof msg, p[1]), OI_ERR_CLOSED);
  close(sv[0]);
  close(p[0]);
  close(p[1]);
  oi__free(buf);
}

/* The default socket path, and connect's errors by cause. */
static void test_socket_paths_and_connect_errors(void) {
  char out[108], want[64];
  const char *saved = getenv("XDG_RUNTIME_DIR");
  char *keep = saved ? strdup(saved) : NULL;
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  CHECK_OK(oi__wire_default_socket_path(out, sizeof out));
  CHECK(!strcmp(out, "/run/user/4242/openinfer.sock"));
  snprintf(want, sizeof want, "/tmp/openinfer-%u.sock", (unsigned)getuid());
  setenv("XDG_RUNTIME_DIR", "relative/dir", 1); /* not absolute: ignored */
  CHECK_OK(oi__wire_default_socket_path(out, sizeof out));
  CHECK(!strcmp(out, want));
  unsetenv("XDG_RUNTIME_DIR");
  CHECK_OK(oi__wire_default_socket_path(out, sizeof out));
  CHECK(!strcmp(out, want));
  CHECK_ST(oi__wire_default_socket_path(out, 8), OI_ERR_INVALID_ARGUMENT);
  char longdir[120];
  memset(longdir, 'd', sizeof longdir);
  longdir[0] = '/';
  longdir[sizeof longdir - 1] = '\0';
  setenv("XDG_RUNTIME_DIR", longdir, 1);
  char roomy[256];
  CHECK_ST(oi__wire_default_socket_path(roomy, sizeof roomy), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "too long"));
  if (keep)
    setenv("XDG_RUNTIME_DIR", keep, 1);
  else
    unsetenv("XDG_RUNTIME_DIR");
  free(keep);

  int fd = 7;
  CHECK_ST(oi__wire_connect(longdir, &fd), OI_ERR_INVALID_ARGUMENT);
  CHECK(fd == -1 && strstr(oi_last_error(), "is longer than 107 bytes"));
  char dir[] = "/tmp/oi-wire-XXXXXX";
  REQUIRE(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/none.sock", dir);
  CHECK_ST(oi__wire_connect(path, &fd), OI_ERR_NOT_FOUND); /* nothing there */
  CHECK(strstr(oi_last_error(), "no openinfer server listens"));
  /* A socket file nobody listens on (stale): NOT_FOUND too. */
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  REQUIRE(s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
  CHECK_ST(oi__wire_connect(path, &fd), OI_ERR_NOT_FOUND);
  CHECK(strstr(oi_last_error(), "Connection refused"));
  close(s);
  unlink(path);
  /* A path through a regular file: another error, OI_ERR_IO. */
  char file[128], through[160];
  snprintf(file, sizeof file, "%s/file", dir);
  snprintf(through, sizeof through, "%s/x.sock", file);
  FILE *f = fopen(file, "w");
  REQUIRE(f);
  fclose(f);
  CHECK_ST(oi__wire_connect(through, &fd), OI_ERR_IO);
  CHECK(fd == -1 && strstr(oi_last_error(), "Not a directory"));
  unlink(file);
  CHECK(rmdir(dir) == 0);
}

/* Decoding: a second body replaces the first (protobuf's oneof rule) and
 * its arrays start empty; an empty membership run adds nothing; a nested
 * message that does not decode is PROTOCOL. */
static void test_decode_edge_cases(void) {
  static oiwire_Envelope env, back;
  oi_wire_arrays a;
  memset(&a, 0, sizeof a);
  oi_block_hash hs[3];
  memset(hs, 0x11, sizeof hs);
  int64_t ids[3] = {1, 2, 3};
  uint8_t *f1 = NULL, *f2 = NULL;
  size_t l1 = 0, l2 = 0;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_save_tag;
  oi_wire_out sv = {.ids = ids, .n_ids = 3, .hashes = hs, .n_hashes = 3};
  CHECK_OK(oi__wire_encode(&env, &sv, &f1, &l1));
  memset(&env, 0, sizeof env);
  env.request_id = 5;
  env.which_body = oiwire_Envelope_query_tag;
  oi_wire_out qv = {.hashes = hs, .n_hashes = 1};
  CHECK_OK(oi__wire_encode(&env, &qv, &f2, &l2));
  uint8_t both[1024];
  REQUIRE(l1 + l2 - 8 <= sizeof both);
  memcpy(both, f1 + 4, l1 - 4);
  memcpy(both + l1 - 4, f2 + 4, l2 - 4);
  CHECK_OK(oi__wire_decode(both, l1 + l2 - 8, &back, &a));
  CHECK(back.which_body == oiwire_Envelope_query_tag && back.request_id == 5);
  CHECK(a.n_hashes == 1 && a.n_ids == 0 && a.bad == OI_OK);
  /* The same with a bad first body: its mark does not outlive it. */
  uint8_t bad_first[64] = {0};
  size_t n = 0;
  bad_first[n++] = (oiwire_Envelope_query_tag << 3) | 2; /* the body */
  bad_first[n++] = 4;
  bad_first[n++] = (oiwire_Query_hashes_tag << 3) | 2; /* a 2-byte hash */
  bad_first[n++] = 2;
  bad_first[n++] = 0xAA;
  bad_first[n++] = 0xBB;
  memcpy(bad_first + n, f2 + 4, l2 - 4);
  CHECK_OK(oi__wire_decode(bad_first, 6, &back, &a));
  CHECK(a.bad == OI_ERR_INVALID_ARGUMENT && strstr(a.bad_msg, "hash 0 is 2 bytes (16 expected)"));
  CHECK_OK(oi__wire_decode(bad_first, n + l2 - 4, &back, &a));
  CHECK(a.bad == OI_OK && a.n_hashes == 1);
  oi__free(f1);
  oi__free(f2);
  /* QueryReply.present of 0 bytes, then of 2. */
  uint8_t qr[16];
  n = 0;
  qr[n++] = (oiwire_Envelope_query_reply_tag << 3) | 2;
  qr[n++] = 0; /* length, set below */
  size_t body = n;
  const uint32_t present_field = oiwire_QueryReply_present_tag;
  qr[n++] = (uint8_t)(present_field << 3 | 2);
  qr[n++] = 0;
  qr[n++] = (uint8_t)(present_field << 3 | 2);
  qr[n++] = 2;
  qr[n++] = 1;
  qr[n++] = 0;
  qr[body - 1] = (uint8_t)(n - body);
  CHECK_OK(oi__wire_decode(qr, n, &back, &a));
  CHECK(back.which_body == oiwire_Envelope_query_reply_tag && a.n_present == 2);
  CHECK(a.present[0] == 1 && a.present[1] == 0 && a.bad == OI_OK);
  /* Two bad hashes: the first one is named. */
  const uint8_t two_bad[] = {
      (oiwire_Envelope_query_tag << 3) | 2, 7,             /* a Query of 7 bytes: */
      (oiwire_Query_hashes_tag << 3) | 2,   1, 0xAA,       /* a hash of 1 byte */
      (oiwire_Query_hashes_tag << 3) | 2,   2, 0xBB, 0xCC, /* a hash of 2 bytes */
  };
  CHECK_OK(oi__wire_decode(two_bad, sizeof two_bad, &back, &a));
  CHECK(a.bad == OI_ERR_INVALID_ARGUMENT && strstr(a.bad_msg, "hash 0 is 1 bytes"));
  /* Packed block ids that end inside a varint: PROTOCOL. */
  const uint8_t ids_cut[] = {
      (oiwire_Envelope_load_tag << 3) | 2,
      4,
      (oiwire_Load_dst_block_ids_tag << 3) | 2,
      2,
      0x02, /* id 1 */
      0x80, /* a varint cut by the field's end */
  };
  CHECK_ST(oi__wire_decode(ids_cut, sizeof ids_cut, &back, &a), OI_ERR_PROTOCOL);
  /* A Register whose arena does not decode (a truncated varint). */
  uint8_t reg[8];
  n = 0;
  reg[n++] = (oiwire_Envelope_register_instance_tag << 3) | 2;
  reg[n++] = 4;
  reg[n++] = (oiwire_Register_arenas_tag << 3) | 2;
  reg[n++] = 2;
  reg[n++] = (oiwire_Arena_num_blocks_tag << 3) | 0;
  reg[n++] = 0x80; /* a varint that never ends */
  CHECK_ST(oi__wire_decode(reg, n, &back, &a), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "malformed message (6 bytes)"));
  /* A Result's message: none is empty, a long one is cut to the field. */
  oi__wire_set_result(&env, 9, OI_ERR_IO, NULL);
  CHECK(env.request_id == 9 && env.body.result.status == OI_ERR_IO &&
        env.body.result.message[0] == '\0');
  char longmsg[2000];
  memset(longmsg, 'm', sizeof longmsg - 1);
  longmsg[sizeof longmsg - 1] = '\0';
  oi__wire_set_result(&env, 9, OI_ERR_IO, longmsg);
  CHECK(strlen(env.body.result.message) == sizeof env.body.result.message - 1);
  /* Arenas with segment offsets: each arena takes its own; given fewer
   * than the segments need, the encoder never reads past them (the last
   * arena gets none). */
  oi_arena_desc ad[2] = {
      {.name = "k", .num_blocks = 2, .bytes_per_block = 64, .block_stride = 256, .segments = 2},
      {.name = "v", .num_blocks = 2, .bytes_per_block = 64, .block_stride = 256, .segments = 2}};
  uint64_t offs[3] = {0, 128, 64};
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_register_instance_tag;
  oi_wire_out ao = {.arenas = ad, .n_arenas = 2, .segment_offsets = offs, .n_segment_offsets = 3};
  uint8_t *fr = NULL;
  size_t fl = 0;
  CHECK_OK(oi__wire_encode(&env, &ao, &fr, &fl));
  CHECK_OK(oi__wire_decode(fr + 4, fl - 4, &back, &a));
  CHECK(a.n_arenas == 2 && a.arenas[0].segment_offsets_count == 2 &&
        a.arenas[0].segment_offsets[1] == 128);
  CHECK(a.arenas[1].segment_offsets_count == 1 && a.arenas[1].segment_offsets[0] == 64);
  oi__free(fr);
  ao.n_segment_offsets = 2; /* none left for the second arena */
  CHECK_OK(oi__wire_encode(&env, &ao, &fr, &fl));
  CHECK_OK(oi__wire_decode(fr + 4, fl - 4, &back, &a));
  CHECK(a.arenas[0].segment_offsets_count == 2 && a.arenas[1].segment_offsets_count == 0);
  oi__free(fr);
  oi__wire_arrays_free(&a);
  oi__wire_arrays_free(NULL);
}

/* The buffered read side: frames that arrive together come out of one
 * recv one by one; a frame split over several sends is handed out whole
 * once complete; a frame larger than the buffer grows it; a descriptor
 * belongs to the frame whose first byte carried it, even when an earlier
 * frame's bytes share the recv; an oversized length, a stream ending
 * inside a frame or a header, and a clean end say so as oi__wire_recv. */
static void test_buffered_reader(void) {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  oi_wire_reader r;
  oi__wire_reader_init(&r);
  const uint8_t *pl = NULL;
  size_t len = 0;
  int got = -2, extra = -2;
  CHECK_ST(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL), OI_PENDING);
  CHECK_ST(oi__wire_reader_fill(&r, sv[1], 1024, false, true), OI_PENDING); /* nothing yet */
  /* Three frames in one send: one recv, three frames, then PENDING. */
  uint8_t three[] = {1, 0, 0, 0, 0xA1, 2, 0, 0, 0, 0xB1, 0xB2, 0, 0, 0, 0};
  CHECK_OK(oi__wire_send(sv[0], three, sizeof three));
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, false, false));
  CHECK(r.end - r.start == sizeof three);
  CHECK_OK(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL));
  CHECK(len == 1 && pl[0] == 0xA1);
  CHECK_OK(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL));
  CHECK(len == 2 && pl[0] == 0xB1 && pl[1] == 0xB2);
  CHECK_OK(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL));
  CHECK(len == 0);
  CHECK_ST(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL), OI_PENDING);
  /* A frame in three pieces (header split too): whole only at the end. */
  uint8_t f[7] = {3, 0, 0, 0, 7, 8, 9};
  CHECK_OK(oi__wire_send(sv[0], f, 2));
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, false, false));
  CHECK_ST(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL), OI_PENDING);
  CHECK_OK(oi__wire_send(sv[0], f + 2, 3));
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, false, false));
  CHECK_ST(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL), OI_PENDING);
  CHECK_OK(oi__wire_send(sv[0], f + 5, 2));
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, false, false));
  CHECK_OK(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL));
  CHECK(len == 3 && pl[0] == 7 && pl[2] == 9);
  /* A frame of 200 KiB (over the 64 KiB buffer), written from a thread
   * side by side: read whole, byte-exact. */
  size_t big_n = 200u << 10;
  uint8_t *big = malloc(big_n + 4);
  REQUIRE(big);
  big[0] = (uint8_t)big_n;
  big[1] = (uint8_t)(big_n >> 8);
  big[2] = (uint8_t)(big_n >> 16);
  big[3] = 0;
  for (size_t i = 0; i < big_n; i++)
    big[4 + i] = (uint8_t)(i * 7);
  int one = 1 << 20;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &one, sizeof one);
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &one, sizeof one);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    _exit(oi__wire_send(sv[0], big, big_n + 4) == OI_OK ? 0 : 1);
  }
  oi_status st;
  while ((st = oi__wire_reader_next(&r, OI_WIRE_MAX_FRAME, &pl, &len, NULL, NULL)) == OI_PENDING)
    REQUIRE(oi__wire_reader_fill(&r, sv[1], OI_WIRE_MAX_FRAME, false, false) == OI_OK);
  CHECK_OK(st);
  CHECK(len == big_n && memcmp(pl, big + 4, big_n) == 0);
  CHECK(r.cap >= big_n + 4);
  int wst = 0;
  REQUIRE(waitpid(child, &wst, 0) == child);
  CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
  free(big);
  /* Descriptors: a plain frame, then one whose first byte carries one,
   * read together (want_fds): the first frame has none, the second has it. */
  int p[2];
  REQUIRE(pipe(p) == 0);
  uint8_t plain[5] = {1, 0, 0, 0, 0x11}, withfd[6] = {2, 0, 0, 0, 0x22, 0x23};
  CHECK_OK(oi__wire_send(sv[0], plain, sizeof plain));
  CHECK_OK(oi__wire_send_fd(sv[0], withfd, sizeof withfd, p[0]));
  while (r.end - r.start < sizeof plain + sizeof withfd)
    REQUIRE(oi__wire_reader_fill(&r, sv[1], 1024, true, false) == OI_OK);
  CHECK_OK(oi__wire_reader_next(&r, 1024, &pl, &len, &got, &extra));
  CHECK(len == 1 && pl[0] == 0x11 && got == -1 && extra == 0);
  CHECK_OK(oi__wire_reader_next(&r, 1024, &pl, &len, &got, &extra));
  CHECK(len == 2 && pl[0] == 0x22 && got >= 0 && got != p[0] && extra == 0 && fd_open(got));
  if (got >= 0) close(got);
  /* A descriptor left pending when the reader is reset is closed. */
  CHECK_OK(oi__wire_send_fd(sv[0], plain, 1, p[1])); /* only the first header byte */
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, true, false));
  CHECK(r.fd_pending && r.fd >= 0);
  int pending_fd = r.fd;
  oi__wire_reader_reset(&r);
  CHECK(!r.fd_pending && r.fd == -1 && !fd_open(pending_fd));
  close(p[0]);
  close(p[1]);
  /* An oversized length: PROTOCOL from the prefix. */
  uint8_t over[4] = {0, 8, 0, 0}; /* 2048 */
  CHECK_OK(oi__wire_send(sv[0], over, sizeof over));
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, false, false));
  CHECK_ST(oi__wire_reader_next(&r, 1024, &pl, &len, NULL, NULL), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "exceeds the 1024-byte limit"));
  oi__wire_reader_reset(&r);
  /* The stream ends inside a frame, inside a header, at a boundary. */
  CHECK_OK(oi__wire_send(sv[0], f, 5));
  shutdown(sv[0], SHUT_WR);
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, false, false));
  CHECK_ST(oi__wire_reader_fill(&r, sv[1], 1024, false, false), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "the stream ended inside a frame (1 of 3 bytes)"));
  oi__wire_reader_reset(&r);
  close(sv[0]);
  close(sv[1]);
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  CHECK_OK(oi__wire_send(sv[0], f, 2));
  close(sv[0]);
  CHECK_OK(oi__wire_reader_fill(&r, sv[1], 1024, false, false));
  CHECK_ST(oi__wire_reader_fill(&r, sv[1], 1024, false, false), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "inside a frame header"));
  oi__wire_reader_reset(&r);
  CHECK_ST(oi__wire_reader_fill(&r, sv[1], 1024, false, false), OI_ERR_CLOSED);
  CHECK(strstr(oi_last_error(), "the peer closed the connection"));
  close(sv[1]);
  CHECK_ST(oi__wire_reader_fill(&r, -1, 1024, false, false), OI_ERR_IO);
  oi__wire_reader_free(&r);
}

/* oi__wire_try_send (the breaker's probe: never blocks): a frame sent whole;
 * a socket with no room answers OI_PENDING and sends nothing; a frame only
 * partly taken is OI_ERR_IO; a closed peer OI_ERR_CLOSED; a bad descriptor
 * OI_ERR_IO. oi__wire_peer_pid and oi__wire_peer_gone (the sidecar fence's
 * "the server is gone"): the peer's pid from the socket; a live process is
 * not gone, an unreaped zombie and a pid that does not exist are. */
static void test_try_send_and_peer_gone(void) {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  int sndbuf = 4096;
  REQUIRE(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) == 0);
  uint8_t small[64] = {1, 2, 3};
  CHECK_OK(oi__wire_try_send(sv[0], small, sizeof small));
  uint8_t got[64];
  CHECK(recv(sv[1], got, sizeof got, MSG_WAITALL) == (ssize_t)sizeof got);
  CHECK(memcmp(got, small, sizeof small) == 0);
  /* fill the socket until it takes no more */
  static uint8_t big[1 << 16];
  oi_status st = OI_OK;
  for (int i = 0; i < 10000 && st == OI_OK; i++)
    st = oi__wire_try_send(sv[0], small, sizeof small);
  CHECK_ST(st, OI_PENDING);
  /* room for part of a large frame only: drain a little, then send it */
  CHECK(recv(sv[1], got, sizeof got, 0) > 0);
  CHECK_ST(oi__wire_try_send(sv[0], big, sizeof big), OI_ERR_IO);
  CHECK(strstr(oi_last_error(), "no room for the rest") != NULL);
  CHECK(oi__wire_peer_pid(sv[0]) == (int)getpid());
  CHECK(!oi__wire_peer_gone(getpid()));
  CHECK(!oi__wire_peer_gone(0));
  close(sv[1]);
  CHECK_ST(oi__wire_try_send(sv[0], small, sizeof small), OI_ERR_CLOSED);
  close(sv[0]);
  CHECK_ST(oi__wire_try_send(sv[0], small, sizeof small), OI_ERR_IO);
  CHECK(oi__wire_peer_pid(sv[0]) == 0);
  /* a child that exited and is not reaped yet, then one reaped */
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  bool zombie = false;
  for (int i = 0; i < 500 && !zombie; i++) {
    zombie = oi__wire_peer_gone((int)child);
    if (!zombie) usleep(2000);
  }
  CHECK(zombie);
  REQUIRE(waitpid(child, NULL, 0) == child);
  CHECK(oi__wire_peer_gone((int)child));
}

int main(void) {
  RUN_TEST(test_hashes_and_ids_over_the_limit);
  RUN_TEST(test_membership_bytes_over_the_limit);
  RUN_TEST(test_arenas_over_the_limit);
  RUN_TEST(test_namespaces_over_the_limit);
  RUN_TEST(test_the_encoder_refuses_an_oversized_frame);
  RUN_TEST(test_send_and_recv_errors);
  RUN_TEST(test_descriptors_with_a_frame);
  RUN_TEST(test_buffered_reader);
  RUN_TEST(test_socket_paths_and_connect_errors);
  RUN_TEST(test_decode_edge_cases);
  RUN_TEST(test_try_send_and_peer_gone);
  TEST_EXIT();
}
