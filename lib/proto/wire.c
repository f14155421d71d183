/* Framing and Envelope codecs of the sidecar protocol (see wire.h). */
#include "proto/wire.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <pb_decode.h>
#include <pb_encode.h>

#include "core/fault.h"

/* ---- decoding -------------------------------------------------------------- */

static void mark_bad(oi_wire_arrays *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mark_bad(oi_wire_arrays *a, const char *fmt, ...) {
  if (a->bad != OI_OK) return; /* keep the first */
  a->bad = OI_ERR_INVALID_ARGUMENT;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a->bad_msg, sizeof a->bad_msg, fmt, ap);
  va_end(ap);
}

static bool skip_rest(pb_istream_t *s) { return pb_read(s, NULL, s->bytes_left); }

/* Packed (or not) repeated sint64: the callback gets the whole packed run,
 * or one element per call. */
static bool decode_ids(pb_istream_t *s, const pb_field_t *f, void **arg) {
  OI_UNUSED(f);
  oi_wire_arrays *a = *arg;
  while (s->bytes_left) {
    int64_t v;
    if (!pb_decode_svarint(s, &v)) return false;
    if (a->n_ids >= OI_WIRE_MAX_BLOCKS) {
      mark_bad(a, "more than %u block ids in one request", OI_WIRE_MAX_BLOCKS);
      return skip_rest(s);
    }
    if (!oi__grow((void **)&a->ids, &a->cap_ids, a->n_ids + 1, sizeof *a->ids, OI_WIRE_MAX_BLOCKS))
      PB_RETURN_ERROR(s, "out of memory");
    a->ids[a->n_ids++] = v;
  }
  return true;
}

static bool decode_hash(pb_istream_t *s, const pb_field_t *f, void **arg) {
  OI_UNUSED(f);
  oi_wire_arrays *a = *arg;
  if (s->bytes_left != sizeof(oi_block_hash)) {
    mark_bad(a, "hash %zu is %zu bytes (16 expected)", a->n_hashes, (size_t)s->bytes_left);
    return skip_rest(s);
  }
  if (a->n_hashes >= OI_WIRE_MAX_BLOCKS) {
    mark_bad(a, "more than %u hashes in one request", OI_WIRE_MAX_BLOCKS);
    return skip_rest(s);
  }
  if (!oi__grow((void **)&a->hashes, &a->cap_hashes, a->n_hashes + 1, sizeof *a->hashes,
                OI_WIRE_MAX_BLOCKS))
    PB_RETURN_ERROR(s, "out of memory");
  return pb_read(s, a->hashes[a->n_hashes++].bytes, sizeof(oi_block_hash));
}

static bool decode_present(pb_istream_t *s, const pb_field_t *f, void **arg) {
  OI_UNUSED(f);
  oi_wire_arrays *a = *arg;
  size_t n = s->bytes_left;
  if (n == 0) return true; /* (found by fuzz_frame: NULL + 0 below is undefined) */
  if (a->n_present + n > OI_WIRE_MAX_BLOCKS) {
    mark_bad(a, "more than %u membership bytes", OI_WIRE_MAX_BLOCKS);
    return skip_rest(s);
  }
  if (!oi__grow((void **)&a->present, &a->cap_present, a->n_present + n, 1, OI_WIRE_MAX_BLOCKS))
    PB_RETURN_ERROR(s, "out of memory");
  if (!pb_read(s, a->present + a->n_present, n)) return false;
  a->n_present += n;
  return true;
}

static bool decode_arena(pb_istream_t *s, const pb_field_t *f, void **arg) {
  OI_UNUSED(f);
  oi_wire_arrays *a = *arg;
  if (a->n_arenas >= OI_WIRE_MAX_ARENAS) {
    mark_bad(a, "more than %u arenas in one layout", OI_WIRE_MAX_ARENAS);
    return skip_rest(s);
  }
  if (!oi__grow((void **)&a->arenas, &a->cap_arenas, a->n_arenas + 1, sizeof *a->arenas,
                OI_WIRE_MAX_ARENAS))
    PB_RETURN_ERROR(s, "out of memory");
  oiwire_Arena *dst = &a->arenas[a->n_arenas];
  memset(dst, 0, sizeof *dst);
  if (!pb_decode(s, oiwire_Arena_fields, dst)) return false;
  a->n_arenas++;
  return true;
}

static bool decode_namespace(pb_istream_t *s, const pb_field_t *f, void **arg) {
  OI_UNUSED(f);
  oi_wire_arrays *a = *arg;
  if (a->n_namespaces >= OI_WIRE_MAX_NAMESPACES) {
    mark_bad(a, "more than %u namespaces in one reply", OI_WIRE_MAX_NAMESPACES);
    return skip_rest(s);
  }
  if (!oi__grow((void **)&a->namespaces, &a->cap_namespaces, a->n_namespaces + 1,
                sizeof *a->namespaces, OI_WIRE_MAX_NAMESPACES))
    PB_RETURN_ERROR(s, "out of memory");
  oiwire_NamespaceStats *dst = &a->namespaces[a->n_namespaces];
  memset(dst, 0, sizeof *dst);
  if (!pb_decode(s, oiwire_NamespaceStats_fields, dst)) return false;
  a->n_namespaces++;
  return true;
}

_Static_assert(sizeof(((oiwire_HostStats *)0)->save_latency_us) / sizeof(uint64_t) ==
                   OI_LATENCY_BUCKETS,
               "openinfer.options: the latency histograms' max_count must be OI_LATENCY_BUCKETS");
_Static_assert(sizeof(((oiwire_StatsReply *)0)->load_latency_us) / sizeof(uint64_t) ==
                   OI_LATENCY_BUCKETS,
               "openinfer.options: the latency histograms' max_count must be OI_LATENCY_BUCKETS");

/* Called before a body submessage is decoded: points its callback fields at
 * the arrays. */
static bool decode_body(pb_istream_t *s, const pb_field_t *f, void **arg) {
  OI_UNUSED(s);
  oi_wire_arrays *a = *arg;
  switch (f->tag) {
  case oiwire_Envelope_register_instance_tag: {
    oiwire_Register *m = f->pData;
    m->arenas.funcs.decode = decode_arena;
    m->arenas.arg = a;
    break;
  }
  case oiwire_Envelope_save_tag: {
    oiwire_Save *m = f->pData;
    m->block_ids.funcs.decode = decode_ids;
    m->block_ids.arg = a;
    m->hashes.funcs.decode = decode_hash;
    m->hashes.arg = a;
    break;
  }
  case oiwire_Envelope_query_tag: {
    oiwire_Query *m = f->pData;
    m->hashes.funcs.decode = decode_hash;
    m->hashes.arg = a;
    break;
  }
  case oiwire_Envelope_query_reply_tag: {
    oiwire_QueryReply *m = f->pData;
    m->present.funcs.decode = decode_present;
    m->present.arg = a;
    break;
  }
  case oiwire_Envelope_load_tag: {
    oiwire_Load *m = f->pData;
    m->dst_block_ids.funcs.decode = decode_ids;
    m->dst_block_ids.arg = a;
    break;
  }
  case oiwire_Envelope_stats_reply_tag: {
    oiwire_StatsReply *m = f->pData;
    m->namespaces.funcs.decode = decode_namespace;
    m->namespaces.arg = a;
    break;
  }
  default: break;
  }
  /* A body that appears again (or a second body) starts from empty arrays:
   * only the last body counts, as protobuf's merge rules say for oneofs. */
  a->n_ids = a->n_hashes = a->n_present = a->n_arenas = a->n_namespaces = 0;
  a->bad = OI_OK;
  a->bad_msg[0] = '\0';
  return true;
}

oi_status oi__wire_decode(const uint8_t *payload, size_t len, oiwire_Envelope *env,
                          oi_wire_arrays *arrays) {
  memset(env, 0, sizeof *env);
  arrays->n_ids = arrays->n_hashes = arrays->n_present = arrays->n_arenas = 0;
  arrays->n_namespaces = 0;
  arrays->bad = OI_OK;
  arrays->bad_msg[0] = '\0';
  env->cb_body.funcs.decode = decode_body;
  env->cb_body.arg = arrays;
  pb_istream_t s = pb_istream_from_buffer(payload, len);
  if (!pb_decode(&s, oiwire_Envelope_fields, env))
    return oi__fail(OI_ERR_PROTOCOL, "malformed message (%zu bytes): %s", len, PB_GET_ERROR(&s));
  return OI_OK;
}

void oi__wire_arrays_free(oi_wire_arrays *a) {
  if (!a) return;
  oi__free(a->ids);
  oi__free(a->hashes);
  oi__free(a->present);
  oi__free(a->arenas);
  oi__free(a->namespaces);
  memset(a, 0, sizeof *a);
}

/* ---- encoding -------------------------------------------------------------- */

static bool encode_ids(pb_ostream_t *s, const pb_field_t *f, void *const *arg) {
  const oi_wire_out *o = *arg;
  if (o->n_ids == 0) return true;
  pb_ostream_t sizing = PB_OSTREAM_SIZING;
  for (size_t i = 0; i < o->n_ids; i++)
    if (!pb_encode_svarint(&sizing, o->ids[i])) return false;
  if (!pb_encode_tag(s, PB_WT_STRING, f->tag) || !pb_encode_varint(s, sizing.bytes_written))
    return false;
  for (size_t i = 0; i < o->n_ids; i++)
    if (!pb_encode_svarint(s, o->ids[i])) return false;
  return true;
}

static bool encode_hashes(pb_ostream_t *s, const pb_field_t *f, void *const *arg) {
  const oi_wire_out *o = *arg;
  for (size_t i = 0; i < o->n_hashes; i++)
    if (!pb_encode_tag_for_field(s, f) ||
        !pb_encode_string(s, o->hashes[i].bytes, sizeof o->hashes[i].bytes))
      return false;
  return true;
}

static bool encode_present(pb_ostream_t *s, const pb_field_t *f, void *const *arg) {
  const oi_wire_out *o = *arg;
  if (o->n_present == 0) return true;
  return pb_encode_tag_for_field(s, f) && pb_encode_string(s, o->present, o->n_present);
}

static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap) n = cap - 1;
  if (n) memcpy(dst, src, n);
  dst[n] = '\0';
}

static bool encode_arenas(pb_ostream_t *s, const pb_field_t *f, void *const *arg) {
  const oi_wire_out *o = *arg;
  size_t k = 0; /* the next arena's first segment offset */
  for (size_t i = 0; i < o->n_arenas; i++) {
    const oi_arena_desc *d = &o->arenas[i];
    oiwire_Arena a;
    memset(&a, 0, sizeof a);
    copy_str(a.name, sizeof a.name, d->name);
    a.offset = d->offset;
    a.num_blocks = d->num_blocks;
    a.bytes_per_block = d->bytes_per_block;
    a.block_stride = d->block_stride;
    a.segments = d->segments;
    a.segment_stride = d->segment_stride;
    if (o->segment_offsets) {
      /* The caller validated the counts; stay inside both arrays regardless. */
      size_t n = OI_MIN((size_t)d->segments, OI_ARRAY_LEN(a.segment_offsets));
      n = k < o->n_segment_offsets ? OI_MIN(n, o->n_segment_offsets - k) : 0;
      memcpy(a.segment_offsets, o->segment_offsets + k, n * sizeof *a.segment_offsets);
      a.segment_offsets_count = (pb_size_t)n;
      k += d->segments;
    }
    if (!pb_encode_tag_for_field(s, f) || !pb_encode_submessage(s, oiwire_Arena_fields, &a))
      return false;
  }
  return true;
}

static bool encode_namespaces(pb_ostream_t *s, const pb_field_t *f, void *const *arg) {
  const oi_wire_out *o = *arg;
  for (size_t i = 0; i < o->n_namespaces; i++)
    if (!pb_encode_tag_for_field(s, f) ||
        !pb_encode_submessage(s, oiwire_NamespaceStats_fields, &o->namespaces[i]))
      return false;
  return true;
}

oi_status oi__wire_encode(const oiwire_Envelope *env_in, const oi_wire_out *out, uint8_t **frame,
                          size_t *frame_len) {
  *frame = NULL;
  *frame_len = 0;
  static const oi_wire_out none;
  if (!out) out = &none;
  oiwire_Envelope env = *env_in;
  void *arg = (void *)out;
  switch (env.which_body) {
  case oiwire_Envelope_register_instance_tag:
    env.body.register_instance.arenas.funcs.encode = encode_arenas;
    env.body.register_instance.arenas.arg = arg;
    break;
  case oiwire_Envelope_save_tag:
    env.body.save.block_ids.funcs.encode = encode_ids;
    env.body.save.block_ids.arg = arg;
    env.body.save.hashes.funcs.encode = encode_hashes;
    env.body.save.hashes.arg = arg;
    break;
  case oiwire_Envelope_query_tag:
    env.body.query.hashes.funcs.encode = encode_hashes;
    env.body.query.hashes.arg = arg;
    break;
  case oiwire_Envelope_query_reply_tag:
    env.body.query_reply.present.funcs.encode = encode_present;
    env.body.query_reply.present.arg = arg;
    break;
  case oiwire_Envelope_load_tag:
    env.body.load.dst_block_ids.funcs.encode = encode_ids;
    env.body.load.dst_block_ids.arg = arg;
    break;
  case oiwire_Envelope_stats_reply_tag:
    env.body.stats_reply.namespaces.funcs.encode = encode_namespaces;
    env.body.stats_reply.namespaces.arg = arg;
    break;
  default: break;
  }
  env.cb_body.funcs.encode = NULL;
  size_t size = 0;
  if (!pb_get_encoded_size(&size, oiwire_Envelope_fields, &env))
    return oi__fail(OI_ERR_INTERNAL, "cannot size a message of type %u", env.which_body);
  if (size > OI_WIRE_MAX_FRAME)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "a message of %zu bytes exceeds the %u-byte frame limit", size,
                    OI_WIRE_MAX_FRAME);
  uint8_t *buf = oi__malloc(size + 4);
  if (!buf) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte message", size);
  buf[0] = (uint8_t)size;
  buf[1] = (uint8_t)(size >> 8);
  buf[2] = (uint8_t)(size >> 16);
  buf[3] = (uint8_t)(size >> 24);
  pb_ostream_t s = pb_ostream_from_buffer(buf + 4, size);
  if (!pb_encode(&s, oiwire_Envelope_fields, &env) || s.bytes_written != size) {
    oi__free(buf);
    return oi__fail(OI_ERR_INTERNAL, "cannot encode a message of type %u: %s", env.which_body,
                    PB_GET_ERROR(&s));
  }
  *frame = buf;
  *frame_len = size + 4;
  return OI_OK;
}

void oi__wire_set_result(oiwire_Envelope *env, uint64_t request_id, oi_status st,
                         const char *message) {
  memset(env, 0, sizeof *env);
  env->request_id = request_id;
  env->which_body = oiwire_Envelope_result_tag;
  env->body.result.status = st;
  copy_str(env->body.result.message, sizeof env->body.result.message, message);
}

/* ---- framing ---------------------------------------------------------------- */

oi_status oi__wire_send(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  uint64_t fault_short = 0, fault_reset = UINT64_MAX;
  if (OI_FAULT(OI_FAULT_SOCK_SHORT, &fault_short) && fault_short == 0) fault_short = 1;
  if (OI_FAULT(OI_FAULT_SOCK_RESET, &fault_reset) && fault_reset < len) len = fault_reset;
  while (len) {
    ssize_t w = send(fd, p, fault_short ? OI_MIN(len, fault_short) : len, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
        return oi__fail(OI_ERR_CLOSED, "send: the peer closed the connection");
      return oi__fail(OI_ERR_IO, "send: %s", strerror(errno));
    }
    p += w;
    len -= (size_t)w;
  }
  if (fault_reset != UINT64_MAX) {
    shutdown(fd, SHUT_RDWR);
    return oi__fail(OI_ERR_CLOSED, "send: connection reset (injected fault)");
  }
  return OI_OK;
}

oi_status oi__wire_try_send(int fd, const void *buf, size_t len) {
  ssize_t w;
  do
    w = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (w < 0 && errno == EINTR);
  if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return OI_PENDING;
  if (w < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN))
    return oi__fail(OI_ERR_CLOSED, "send: the peer closed the connection");
  if (w < 0) return oi__fail(OI_ERR_IO, "send: %s", strerror(errno));
  if ((size_t)w != len)
    return oi__fail(OI_ERR_IO, "send: %zd of a %zu-byte frame (no room for the rest)", w, len);
  return OI_OK;
}

oi_status oi__wire_send_fd(int fd, const void *buf, size_t len, int pass_fd) {
  if (len == 0) return OI_OK;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = 1}; /* the fd rides on byte 0 */
  struct msghdr m = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &pass_fd, sizeof pass_fd);
  ssize_t w;
  do
    w = sendmsg(fd, &m, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w < 0) {
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
      return oi__fail(OI_ERR_CLOSED, "send: the peer closed the connection");
    return oi__fail(OI_ERR_IO, "sendmsg (SCM_RIGHTS): %s", strerror(errno));
  }
  return oi__wire_send(fd, (const uint8_t *)buf + 1, len - 1);
}

/* Takes the descriptors of one received control message. */
static void take_fds(struct msghdr *m, int *fd_out, int *extra) {
  if (m->msg_flags & MSG_CTRUNC) (*extra)++;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int got;
      memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
      if (*fd_out < 0) {
        *fd_out = got;
      } else {
        close(got);
        (*extra)++;
      }
    }
  }
}

/* Reads exactly `len` bytes. *got tells how many arrived before an error.
 * With fd_out, descriptors that arrive are taken (take_fds); without, the
 * kernel discards them. */
static oi_status read_full_fds(int fd, void *buf, size_t len, size_t *got, int *fd_out,
                               int *extra) {
  uint8_t *p = buf;
  *got = 0;
  while (*got < len) {
    ssize_t r;
    if (fd_out) {
      union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(4 * sizeof(int))];
      } ctl;
      struct iovec iov = {.iov_base = p + *got, .iov_len = len - *got};
      struct msghdr m = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
      r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
      if (r >= 0) take_fds(&m, fd_out, extra);
    } else {
      r = recv(fd, p + *got, len - *got, 0);
    }
    if (r == 0) return OI_ERR_CLOSED;
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return OI_ERR_CLOSED;
      return oi__fail(OI_ERR_IO, "recv: %s", strerror(errno));
    }
    *got += (size_t)r;
  }
  return OI_OK;
}

oi_status oi__wire_frame_length(const uint8_t hdr[4], uint32_t max, uint32_t *len) {
  uint32_t n =
      (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
  if (n > max)
    return oi__fail(OI_ERR_PROTOCOL, "a frame of %u bytes exceeds the %u-byte limit", n, max);
  *len = n;
  return OI_OK;
}

static oi_status recv_frame(int fd, uint32_t max, uint8_t **buf, size_t *cap, size_t *len,
                            int *fd_out, int *extra) {
  uint8_t hdr[4];
  size_t got;
  oi_status st = read_full_fds(fd, hdr, sizeof hdr, &got, fd_out, extra);
  if (st == OI_ERR_CLOSED)
    return got ? oi__fail(OI_ERR_PROTOCOL, "the stream ended inside a frame header")
               : oi__fail(OI_ERR_CLOSED, "the peer closed the connection");
  if (st != OI_OK) return st;
  uint32_t n = 0;
  if ((st = oi__wire_frame_length(hdr, max, &n)) != OI_OK) return st;
  if (n > *cap) {
    uint8_t *p = oi__realloc(*buf, n);
    if (!p) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory for a %u-byte frame", n);
    *buf = p;
    *cap = n;
  }
  st = read_full_fds(fd, *buf, n, &got, fd_out, extra);
  if (st == OI_ERR_CLOSED)
    return oi__fail(OI_ERR_PROTOCOL, "the stream ended inside a frame (%zu of %u bytes)", got, n);
  if (st != OI_OK) return st;
  *len = n;
  return OI_OK;
}

oi_status oi__wire_recv(int fd, uint32_t max, uint8_t **buf, size_t *cap, size_t *len) {
  return recv_frame(fd, max, buf, cap, len, NULL, NULL);
}

oi_status oi__wire_recv_fd(int fd, uint32_t max, uint8_t **buf, size_t *cap, size_t *len,
                           int *fd_out, int *extra) {
  *fd_out = -1;
  *extra = 0;
  return recv_frame(fd, max, buf, cap, len, fd_out, extra);
}

/* ---- the buffered reader ------------------------------------------------------ */

#define READER_MIN_CAP (64u << 10)
#define READER_KEEP_CAP (1u << 20) /* a larger buffer is freed once empty */

void oi__wire_reader_init(oi_wire_reader *r) {
  memset(r, 0, sizeof *r);
  r->fd = -1;
}

void oi__wire_reader_reset(oi_wire_reader *r) {
  r->start = r->end = 0;
  if (r->fd >= 0) close(r->fd);
  r->fd = -1;
  r->fd_extra = 0;
  r->fd_pending = false;
}

void oi__wire_reader_free(oi_wire_reader *r) {
  oi__wire_reader_reset(r);
  oi__free(r->buf);
  r->buf = NULL;
  r->cap = 0;
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

oi_status oi__wire_reader_next(oi_wire_reader *r, uint32_t max, const uint8_t **payload,
                               size_t *len, int *fd_out, int *extra) {
  if (fd_out) {
    *fd_out = -1;
    *extra = 0;
  }
  size_t have = r->end - r->start;
  if (have < 4) return OI_PENDING;
  uint32_t n = 0;
  oi_status st = oi__wire_frame_length(r->buf + r->start, max, &n);
  if (st != OI_OK) return st;
  if (have - 4 < n) return OI_PENDING;
  size_t first = r->start, past = r->start + 4 + (size_t)n;
  *payload = r->buf + first + 4;
  *len = n;
  r->start = past;
  if (r->fd_pending && r->fd_at < past) { /* (fd_at >= first: earlier frames took theirs) */
    if (fd_out) {
      *fd_out = r->fd;
      *extra = r->fd_extra;
    } else if (r->fd >= 0) {
      close(r->fd);
    }
    r->fd = -1;
    r->fd_extra = 0;
    r->fd_pending = false;
  }
  return OI_OK;
}

/* Room for the next recv: the rest of a frame whose length is known fits
 * whole (up to max + 4 bytes), else at least a few KiB. */
static oi_status reader_room(oi_wire_reader *r, uint32_t max) {
  size_t have = r->end - r->start;
  if (have == 0) {
    r->start = r->end = 0;
    if (r->cap > READER_KEEP_CAP) { /* large frames do not pin memory */
      oi__free(r->buf);
      r->buf = NULL;
      r->cap = 0;
    }
  }
  size_t need = READER_MIN_CAP;
  if (have >= 4) {
    uint32_t n = le32(r->buf + r->start);
    if (n <= max && (size_t)n + 4 > need) need = (size_t)n + 4;
  }
  if (r->cap - r->start >= need && r->end < r->cap) return OI_OK;
  if (r->start > 0) { /* move the unread bytes to the front */
    memmove(r->buf, r->buf + r->start, have);
    if (r->fd_pending) r->fd_at -= r->start;
    r->start = 0;
    r->end = have;
  }
  if (r->cap < need) {
    uint8_t *p = oi__realloc(r->buf, need);
    if (!p) return oi__fail(OI_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte frame", need - 4);
    r->buf = p;
    r->cap = need;
  }
  return OI_OK;
}

oi_status oi__wire_reader_fill(oi_wire_reader *r, int fd, uint32_t max, bool want_fds,
                               bool nonblock) {
  oi_status st = reader_room(r, max);
  if (st != OI_OK) return st;
  int flags = nonblock ? MSG_DONTWAIT : 0;
  for (;;) {
    ssize_t got;
    if (want_fds) {
      union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(4 * sizeof(int))];
      } ctl;
      struct iovec iov = {.iov_base = r->buf + r->end, .iov_len = r->cap - r->end};
      struct msghdr m = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
      got = recvmsg(fd, &m, flags | MSG_CMSG_CLOEXEC);
      if (got > 0 && (m.msg_controllen > 0 || (m.msg_flags & MSG_CTRUNC))) {
        int one = -1, more = 0;
        take_fds(&m, &one, &more);
        if (one >= 0 || more) {
          if (r->fd_pending) { /* one frame's descriptors at a time: close the newcomers */
            if (one >= 0) close(one);
            r->fd_extra += more + (one >= 0);
          } else {
            r->fd_pending = true;
            r->fd = one;
            r->fd_extra = more;
            r->fd_at = r->end + (size_t)got - 1;
          }
        }
      }
    } else {
      got = recv(fd, r->buf + r->end, r->cap - r->end, flags);
    }
    if (got > 0) {
      r->end += (size_t)got;
      return OI_OK;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return OI_PENDING;
    if (got < 0 && errno != ECONNRESET) return oi__fail(OI_ERR_IO, "recv: %s", strerror(errno));
    /* The end of the stream (or a reset). */
    size_t have = r->end - r->start;
    if (have == 0) return oi__fail(OI_ERR_CLOSED, "the peer closed the connection");
    if (have < 4) return oi__fail(OI_ERR_PROTOCOL, "the stream ended inside a frame header");
    return oi__fail(OI_ERR_PROTOCOL, "the stream ended inside a frame (%zu of %u bytes)", have - 4,
                    le32(r->buf + r->start));
  }
}

/* ---- sockets ---------------------------------------------------------------- */

oi_status oi__wire_default_socket_path(char *out, size_t cap) {
  const char *dir = getenv("XDG_RUNTIME_DIR");
  int n = dir && dir[0] == '/' ? snprintf(out, cap, "%s/openinfer.sock", dir)
                               : snprintf(out, cap, "/tmp/openinfer-%u.sock", (unsigned)getuid());
  if (n < 0 || (size_t)n >= cap || (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "the default socket path is too long");
  return OI_OK;
}

oi_status oi__wire_connect(const char *path, int *fd_out) {
  *fd_out = -1;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "socket path '%s' is longer than %zu bytes", path,
                    sizeof sa.sun_path - 1);
  memcpy(sa.sun_path, path, strlen(path));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return oi__fail(OI_ERR_IO, "socket: %s", strerror(errno));
  int rc;
  do
    rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int e = errno;
    close(fd);
    if (e == ENOENT || e == ECONNREFUSED)
      return oi__fail(OI_ERR_NOT_FOUND, "no openinfer server listens on %s: %s", path, strerror(e));
    if (e == EACCES || e == EPERM)
      return oi__fail(OI_ERR_PERMISSION, "connect to %s: %s", path, strerror(e));
    return oi__fail(OI_ERR_IO, "connect to %s: %s", path, strerror(e));
  }
  *fd_out = fd;
  return OI_OK;
}

int oi__wire_peer_pid(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) return 0;
  return (int)cred.pid;
}

bool oi__wire_peer_gone(int pid) {
  if (pid <= 0) return false;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return errno == ENOENT;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}
