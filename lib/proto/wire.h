/* The sidecar wire protocol: framing over a Unix stream socket and the
 * codecs of openinfer.proto's Envelope (nanopb, generated at build time).
 *
 * A frame is a 4-byte little-endian payload length followed by one encoded
 * Envelope. Lengths over the receiver's limit are refused before anything of
 * the payload is read. The large repeated fields (block ids, hashes, arenas,
 * the membership bytes) are nanopb callbacks: the decoder fills growable
 * buffers bounded by OI_WIRE_MAX_*, and records the first malformed element
 * (a 15-byte hash, a 65537th id) instead of failing, so the receiver can
 * answer with an error and keep the session. Anything else malformed fails
 * the decode: that is garbage, and the session ends.
 *
 * Used by the server (lib/server) and the remote engine (lib/engine/remote_*.c)
 * and by nothing below them. */
#ifndef OI_PROTO_WIRE_H
#define OI_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "openinfer/common.h"
#include "proto/openinfer.pb.h"

#define OI_WIRE_PROTOCOL_VERSION 1u
#define OI_WIRE_MAX_FRAME (8u << 20) /* bytes of one frame's payload */
#define OI_WIRE_MAX_BLOCKS 65536u    /* block ids or hashes in one request */
#define OI_WIRE_MAX_ARENAS 4096u     /* arenas of one layout */
#define OI_WIRE_HANDLE_BYTES 64u
#define OI_WIRE_LEASE_BYTES 16u
#define OI_WIRE_MAX_NAMESPACES 4096u /* namespaces listed in one StatsReply */

/* HelloReply/Hello.capabilities */
enum {
  OI_WIRE_CAP_PIPELINED = 1u << 0,     /* replies may come out of order */
  OI_WIRE_CAP_MEMBERSHIP = 1u << 1,    /* Query.flags OI_QUERY_MEMBERSHIP */
  OI_WIRE_CAP_LOOKUP = 1u << 2,        /* Query / Release with instance 0 and a namespace */
  OI_WIRE_CAP_SAVE_COUNTS = 1u << 3,   /* Save.want_counts, SaveCounts, QueryReply.pending_blocks */
  OI_WIRE_CAP_LAYERWISE = 1u << 4,     /* Save.arena_first / arena_count (a server that
                                          lacks it would save whole blocks) */
  OI_WIRE_CAP_OWNED_ARENA = 1u << 5,   /* Register.client_owned: engine-owned memory */
  OI_WIRE_CAP_LOAD_PROGRESS = 1u << 6, /* Load.flags OI_LOAD_ARENA_EVENTS, LoadProgress */
  OI_WIRE_CAP_CODEC = 1u << 7,         /* Register.codec and its shape (docs/codecs.md) */
};

/* The callback fields of one decoded Envelope. Buffers grow on demand up to
 * the OI_WIRE_MAX_* bounds and are reused across frames. */
typedef struct oi_wire_arrays {
  int64_t *ids;
  size_t n_ids, cap_ids;
  oi_block_hash *hashes;
  size_t n_hashes, cap_hashes;
  uint8_t *present;
  size_t n_present, cap_present;
  oiwire_Arena *arenas;
  size_t n_arenas, cap_arenas;
  oiwire_NamespaceStats *namespaces;
  size_t n_namespaces, cap_namespaces;
  /* The first malformed element; the Envelope still decoded. OI_OK if none. */
  oi_status bad;
  char bad_msg[160];
} oi_wire_arrays;

/* The callback fields to encode (only those of the Envelope's body). */
typedef struct oi_wire_out {
  const int64_t *ids;
  size_t n_ids;
  const oi_block_hash *hashes;
  size_t n_hashes;
  const uint8_t *present;
  size_t n_present;
  const oi_arena_desc *arenas;
  size_t n_arenas;
  /* NULL, or every arena's segment offsets in order (oi_engine_options). */
  const uint64_t *segment_offsets;
  size_t n_segment_offsets;
  const oiwire_NamespaceStats *namespaces;
  size_t n_namespaces;
} oi_wire_out;

/* Encodes `env` (callback fields from `out`, may be NULL when the body has
 * none) as one frame, length prefix included. *frame is oi__malloc'ed. */
oi_status oi__wire_encode(const oiwire_Envelope *env, const oi_wire_out *out, uint8_t **frame,
                          size_t *frame_len);

/* Decodes one payload (without the length prefix). `arrays` is reset first.
 * @return OI_ERR_PROTOCOL with a message when the bytes are not an Envelope. */
oi_status oi__wire_decode(const uint8_t *payload, size_t len, oiwire_Envelope *env,
                          oi_wire_arrays *arrays);
void oi__wire_arrays_free(oi_wire_arrays *a);

/* Writes all of `len` bytes (MSG_NOSIGNAL; retries EINTR and short writes).
 * @return OI_ERR_CLOSED when the peer is gone, OI_ERR_IO otherwise. */
oi_status oi__wire_send(int fd, const void *buf, size_t len);

/* As oi__wire_send, with the descriptor `pass_fd` attached to the frame's
 * first byte (SCM_RIGHTS), so it arrives with this frame. */
oi_status oi__wire_send_fd(int fd, const void *buf, size_t len, int pass_fd);

/* The payload length a frame's 4-byte prefix announces. @return
 * OI_ERR_PROTOCOL (with a message) when it exceeds `max`. oi__wire_recv's
 * check, for callers that hold the bytes already (the frame fuzzer). */
oi_status oi__wire_frame_length(const uint8_t hdr[4], uint32_t max, uint32_t *len);

/* Reads one frame's payload into *buf (grown with oi__realloc as needed).
 * @return OI_OK; OI_ERR_CLOSED on end of stream at a frame boundary;
 * OI_ERR_PROTOCOL for a frame longer than `max` (nothing of it is read) or a
 * stream that ends inside a frame; OI_ERR_IO on a socket error. */
oi_status oi__wire_recv(int fd, uint32_t max, uint8_t **buf, size_t *cap, size_t *len);

/* As oi__wire_recv, also taking the descriptors that arrived (SCM_RIGHTS)
 * with the frame's bytes: the first is kept in *fd_out (-1 if none; the
 * caller owns and closes it, whatever the status), any others are closed and counted in *extra
 * (as are those the kernel dropped for lack of room). */
oi_status oi__wire_recv_fd(int fd, uint32_t max, uint8_t **buf, size_t *cap, size_t *len,
                           int *fd_out, int *extra);

/* A connection's buffered read side: one recv takes whatever the socket
 * holds (several frames, or part of one) and frames are handed out whole
 * from the buffer, so a frame costs one call instead of a length read and
 * a body read. Used by one thread at a time. */
typedef struct oi_wire_reader {
  uint8_t *buf;
  size_t cap, start, end; /* the unread bytes are buf[start, end) */
  /* Descriptors (SCM_RIGHTS, oi__wire_reader_fill with want_fds): the kernel
   * ends a recvmsg with the bytes that carried them, so they belong to the
   * frame holding the last byte of that call (at buf[fd_at]). */
  bool fd_pending;
  int fd, fd_extra;
  size_t fd_at;
} oi_wire_reader;

void oi__wire_reader_init(oi_wire_reader *r);
/* Drops the buffered bytes and a pending descriptor (keeps the buffer). */
void oi__wire_reader_reset(oi_wire_reader *r);
void oi__wire_reader_free(oi_wire_reader *r);

/* The next whole frame already buffered: OI_OK with its payload (valid until
 * the next call on `r`), OI_PENDING when more bytes are needed, or
 * OI_ERR_PROTOCOL (with a message) for a frame longer than `max`. With
 * fd_out, the descriptor that came with this frame (-1 if none; the caller
 * owns it) and the count of others closed, as oi__wire_recv_fd. */
oi_status oi__wire_reader_next(oi_wire_reader *r, uint32_t max, const uint8_t **payload,
                               size_t *len, int *fd_out, int *extra);

/* One recv (recvmsg taking descriptors with want_fds) of what the socket
 * holds, blocking or not. @return OI_OK (bytes arrived), OI_PENDING (none
 * yet, non-blocking), OI_ERR_CLOSED at the end of the stream at a frame
 * boundary, OI_ERR_PROTOCOL when it ends inside a frame, OI_ERR_IO, or
 * OI_ERR_OUT_OF_MEMORY; the messages are oi__wire_recv's. */
oi_status oi__wire_reader_fill(oi_wire_reader *r, int fd, uint32_t max, bool want_fds,
                               bool nonblock);

/* The default socket path: $XDG_RUNTIME_DIR/openinfer.sock, or
 * /tmp/openinfer-$UID.sock without it. */
oi_status oi__wire_default_socket_path(char *out, size_t cap);

/* Connects a stream socket to `path`. NOT_FOUND when nothing listens there,
 * PERMISSION when the socket file refuses us. */
oi_status oi__wire_connect(const char *path, int *fd_out);

/* Sends a whole frame without blocking: OI_OK, OI_PENDING when the socket
 * has no room for any of it (nothing was sent), OI_ERR_CLOSED when the peer
 * closed; a frame that went out in part leaves the stream unusable
 * (OI_ERR_IO; the caller shuts it). */
oi_status oi__wire_try_send(int fd, const void *buf, size_t len);

/* The process at the other end of a connected Unix socket (SO_PEERCRED);
 * 0 when the kernel does not say (another pid namespace). */
int oi__wire_peer_pid(int fd);

/* Whether process `pid` (from oi__wire_peer_pid) no longer runs: it does not
 * exist, or it is a zombie (it has exited; its parent has not reaped it).
 * A process that ended can no longer write into memory it had mapped. */
bool oi__wire_peer_gone(int pid);

/* Fills a Result body (status + message, truncated to fit). */
void oi__wire_set_result(oiwire_Envelope *env, uint64_t request_id, oi_status st,
                         const char *message);

#endif
