/* A scriptable fake `openinfer serve` for the client's error paths: a thread
 * of the test process that listens on a Unix socket in a private temporary
 * directory and speaks the real wire protocol (lib/proto: 4-byte length,
 * one Envelope), so lib/engine/remote_*.c is driven through the public API
 * exactly as against the real server.
 *
 * Every request is answered with the correct reply (a HelloReply of
 * protocol 1, a RegisterReply with a real cpu shared-memory arena or, for
 * engine-owned memory, none; SaveCounts and a Result for a save; a
 * QueryReply with fs_set_hits hits; Result OK for the rest), unless the
 * test queued a step for that request type: the next request of the type
 * takes the next step. A step can hold the reply back (delay_ms, other
 * requests are served meanwhile), never answer, answer a Result with any
 * status, end the session with a reason (a Result with request id 0, as the
 * real server does), close the connection, send bytes that do not decode,
 * or edit the correct reply before it goes (a wrong protocol version, a
 * register reply with a bad handle, a lease of the wrong size, more hits
 * than hashes...). FS_ACCEPT is the pseudo type of a new connection.
 *
 * Several connections may be open at once (a reconnecting engine opens a
 * new one); requests are counted per type over all of them. */
#ifndef OI_FAKE_SERVER_H
#define OI_FAKE_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/wire.h"

/* The pseudo request type of a new connection (no Envelope body has tag 0). */
#define FS_ACCEPT 0
#define FS_TYPES 18 /* Envelope body tags are below this */

typedef enum fs_action {
  FS_REPLY = 0,   /* the correct reply (edited by `edit`, if set), after delay_ms */
  FS_SILENT,      /* no reply, ever (the connection stays open) */
  FS_RESULT,      /* a Result with `status` and `message` instead, after delay_ms */
  FS_REFUSE,      /* a session-ending Result (request id 0) with status and message, then close */
  FS_CLOSE,       /* close the connection without a word */
  FS_GARBAGE,     /* a frame whose payload is not an Envelope */
  FS_COUNTS_ONLY, /* Save with want_counts: SaveCounts, but never the Result */
  FS_OVERSIZE,    /* a length prefix past OI_WIRE_MAX_FRAME */
  FS_TRUNCATED,   /* half a frame, then close */
} fs_action;

/* The reply the fake is about to send, for a step's `edit`. */
typedef struct fs_reply {
  oiwire_Envelope env; /* the reply; anything may be changed */
  oi_wire_out out;     /* its callback fields (QueryReply.present) */
  uint8_t *present;    /* room for OI_WIRE_MAX_BLOCKS membership bytes (out.present) */
  size_t n_hashes;     /* hashes (Query, Save) or block ids (Load) of the request */
} fs_reply;

typedef void (*fs_edit_fn)(fs_reply *r);

typedef struct fs_step {
  fs_action action;
  uint32_t delay_ms;
  oi_status status;    /* FS_RESULT, FS_REFUSE */
  const char *message; /* FS_RESULT, FS_REFUSE (copied) */
  fs_edit_fn edit;     /* FS_REPLY */
  uint32_t progress;   /* Load: LoadProgress frames (arenas_done 1..progress) first, at once */
  bool close_after;    /* FS_REPLY: close the connection right after the reply */
} fs_step;

typedef struct fake_server fake_server;

/* Starts listening; REQUIREs success. */
fake_server *fs_start(void);
/* Stops the thread, closes every connection, frees the arenas it made and
 * removes the directory. */
void fs_stop(fake_server *fs);
const char *fs_socket(const fake_server *fs);

/* Queues `step` for the next request of `type` (an oiwire_Envelope_*_tag,
 * or FS_ACCEPT) that has no step yet. */
void fs_script(fake_server *fs, uint32_t type, fs_step step);
/* Drops the steps of `type` not taken yet (its requests get the correct
 * reply again). */
void fs_clear_script(fake_server *fs, uint32_t type);
/* Capabilities of the HelloReply (default: every OI_WIRE_CAP_*). */
void fs_set_caps(fake_server *fs, uint64_t caps);
/* Hits of the default QueryReply (at most the request's hashes; default 0). */
void fs_set_hits(fake_server *fs, uint64_t hits);

/* Requests of `type` received so far (FS_ACCEPT: connections accepted). */
uint32_t fs_seen(fake_server *fs, uint32_t type);
/* Waits up to timeout_ms until fs_seen(type) >= n. */
bool fs_wait_seen(fake_server *fs, uint32_t type, uint32_t n, uint32_t timeout_ms);
/* The last request of `type` (false if none came). */
bool fs_last(fake_server *fs, uint32_t type, oiwire_Envelope *out);
/* Connections open now, and connections the client closed (end of stream
 * seen by the fake, not closed by a step). */
uint32_t fs_open_connections(fake_server *fs);
uint32_t fs_client_closes(fake_server *fs);
/* Waits up to timeout_ms until no connection is open. */
bool fs_wait_no_connections(fake_server *fs, uint32_t timeout_ms);
/* Descriptors received with Register frames (engine-owned cpu memory). */
uint32_t fs_fds_received(fake_server *fs);
/* Replies held by delay_ms that have been sent by now. */
uint32_t fs_late_sent(fake_server *fs);

/* Ends every open connection now: with a session-ending Result when
 * `status` is not OI_OK (`reason` its message), then closes. Returns after
 * the fake did it. */
void fs_close_all(fake_server *fs, oi_status status, const char *reason);

#endif
