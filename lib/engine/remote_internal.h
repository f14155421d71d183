/* The sidecar engine (lib/engine/remote_*.c; internal to lib/engine): every operation is a request
 * over the server's Unix socket (lib/proto framing), executed by the server on memory it owns.
 *
 * One connection (session) per engine. Requests carry ids; replies may come
 * out of order and complete the waiting call or the operation's ticket.
 * The reader thread is the watchdog: if the connection breaks while the
 * engine is live, the server that owns the memory this process maps is
 * gone, and the fatal handler runs.
 *
 * The read side (who reads the socket). Frames are read through one
 * buffer (oi_wire_reader: one recv takes every frame the socket holds), by
 * exactly one thread at a time: the one that holds the read side
 * (`reading`, taken and released under e->lock; the buffer, e->env and
 * e->arrays are its). A call waiting for its reply takes the read side
 * itself when no one holds it (lead: poll, recv, deliver), so its reply
 * needs no other thread's wake-up; other replies it reads are delivered
 * as the reader would deliver them: a call's to its waiter (done under the
 * lock, cv broadcast), an asynchronous operation's final reply taken out of
 * the table and handed to the reader (`handed`, in arrival order; the
 * reader completes it, so on_done and tickets complete on the reader
 * thread as always), LoadProgress and SaveCounts in place. Calls that find
 * the read side taken wait on cv (`waiting`) and take it when it is
 * released, so a leader that gives up at its deadline leaves the reading to
 * the next waiter. The reader thread takes the read side only when the
 * socket has something and no one holds it; while a caller leads it polls
 * for the end of the stream only (POLLRDHUP, `watching`: replies wake only
 * the leader), and a leader that lets go while asynchronous operations are
 * outstanding, or hands one over, wakes it (`kick_fd`). Deadline sweeps run
 * on the reader every 250 ms, whoever reads. A leader that meets the end of
 * the stream, or bytes that are not a frame, does not handle it: it sets
 * `read_failed` (with why), lets go and wakes the reader, which takes the
 * read side and runs connection_lost (fatal handler, or degrade and
 * reconnect) exactly as when it met the end itself; no call leads while
 * `read_failed` is set or the connection is not usable. The reader keeps the
 * read side through connection_lost and the reconnect, and releases it
 * with an empty buffer for the new connection.
 *
 * Engine-owned memory (arena_base set at connect): the arena is ours and the
 * server only maps it, so a dead server costs only the cache. The reader
 * then degrades the engine (queries miss, saves drop, loads fail) and
 * reconnects: it registers the layout and the memory again on a new
 * connection (a new generation: requests of the old one are never sent on
 * the new one) and the engine is live again, with a new instance id and
 * epoch.
 *
 * Teardown needs two events, in either order: the caller destroys the engine
 * and the caller closes the imported arena (the hook in device.c tells us).
 * Whichever comes second runs it: retire the watchdog, flush, unregister,
 * close the socket. So the server frees the arena only after this process
 * unmapped it. */
#ifndef OI_ENGINE_REMOTE_INTERNAL_H
#define OI_ENGINE_REMOTE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "device/device.h"
#include "engine/query.h"
#include "engine_internal.h"
#include "proto/wire.h"

#define PENDING_BUCKETS 256

typedef enum conn_state {
  CONN_CONNECTING, /* connect in progress: failures are errors, not fatal */
  CONN_LIVE,       /* the watchdog is armed */
  CONN_RETIRED,    /* clean teardown: the connection may end */
  CONN_DEAD,       /* the connection ended */
  CONN_DEGRADED,   /* engine-owned: the connection ended while live; the reader reconnects */
} conn_state;

/* PEND_PROBE: the breaker's health probe (an Envelope with no body; every
 * server answers it at once, without touching the pool). */
typedef enum pending_kind { PEND_CALL, PEND_SAVE, PEND_LOAD, PEND_PROBE } pending_kind;

/* A save's counts (SaveCounts), awaited by the submitter on its stack. It is
 * touched only under e->lock, and only while the save's record names it:
 * whoever takes the record out of the table, or delivers the counts, marks
 * it done and unlinks it. */
typedef struct counts_wait {
  bool done, received;
  uint64_t accepted, deduplicated, dropped;
} counts_wait;

/* One request waiting for its reply. PEND_CALL lives on the calling thread's
 * stack; PEND_SAVE and PEND_LOAD are heap-allocated.
 *
 * Ownership (the rule every path below follows):
 *  - A record in the table (inserted under e->lock) belongs to the table.
 *    Exactly one thread takes it out, under e->lock: the holder of the read
 *    side (its reply arrived: deliver; a leader hands an asynchronous one to
 *    the reader, which owns it from then), the reader's deadline sweep
 *    (expire), the reader when the connection ends (connection_lost), or
 *    the submitter itself, looking it up BY ID (oi__remote_pending_take_locked), never
 *    by pointer, after a failed send or an expired call. Whoever takes it
 *    owns it from then on.
 *  - Once the submitter has released e->lock after inserting, it never reads
 *    an asynchronous record again: the reader (or a leader, for the
 *    reader) may already have taken it, and the reader freed it. It keeps
 *    the request id (copied under the lock) instead, and gets the record
 *    back only if oi__remote_pending_take_locked still finds that id.
 *  - An asynchronous record is completed and freed (oi__remote_finish_async) only by the
 *    reader thread, outside the lock: the one that took it out of the
 *    table, or the one a leader handed it to. Ids are never reused, so a
 *    late reply or a late lookup cannot reach another record.
 *  - A PEND_CALL's owner is always its waiter (the record is on its stack);
 *    the holder of the read side (the reader, or a leader: possibly the
 *    waiter itself) writes into it only under e->lock while it is in the
 *    table, and marks it done as it takes it out; the waiter reads it
 *    after seeing done, or after taking it back by id. */
typedef struct pending {
  struct pending *prev, *next; /* in submission order */
  struct pending *hnext;       /* hash chain */
  uint64_t id;
  pending_kind kind;
  /* PEND_CALL */
  bool done;
  oi_status status;
  char message[512];
  oiwire_Envelope reply;
  uint8_t *present; /* membership answers go here... */
  size_t present_n; /* ...exactly this many */
  /* PEND_SAVE / PEND_LOAD */
  uint64_t deadline_ns; /* UINT64_MAX: none */
  oi_ticket *ticket;    /* producer reference, or NULL */
  oi_save_done_fn on_done;
  void *on_done_ctx;
  counts_wait *counts; /* PEND_SAVE: the submitter's, while it waits (see counts_wait) */
  oi_status result;    /* handed to the reader (see `handed`): how it ends */
  uint32_t n_blocks;   /* for the logs */
  /* PEND_LOAD: its deadline passed (`late`) or its connection ended while
   * the server may still copy into its destination: the ticket is fencing
   * (OI_FENCING, `fenced`) and completes when the server answers or is gone
   * (the load fence), with OI_ERR_DEADLINE if it was late. */
  bool fenced, late;
  int server_pid; /* an orphan (its connection ended unanswered): the server it waits on */
} pending;

typedef struct remote_engine {
  oi_engine base;
  char *socket_path;
  int fd;
  uint64_t server_epoch;
  uint64_t server_caps; /* HelloReply.capabilities */
  uint32_t control_ms;

  pthread_mutex_t lock; /* pending table and connection state */
  pthread_cond_t cv;    /* a call completed, or the connection ended */
  pending *buckets[PENDING_BUCKETS];
  pending *head, *tail;
  uint64_t next_id;
  conn_state state;
  char conn_msg[640];    /* why the connection ended */
  oi_status conn_status; /* the server's reason, when it closed the session itself */

  pthread_mutex_t write_lock; /* one frame at a time */

  pthread_t reader;
  bool reader_started;
  uint8_t *frame; /* the reconnect's handshake (reader thread) */
  size_t frame_cap;
  /* The read side: whoever holds it (`reading`) reads and decodes frames
   * with these. Under `lock`: */
  bool reading;        /* the read side is held... */
  bool reading_caller; /* ...by a calling thread (the leader), not the reader */
  uint32_t waiting;    /* threads waiting on cv for the read side to be released */
  uint32_t n_async;    /* asynchronous records in the table */
  bool read_failed;    /* a leader met the connection's end: the reader takes over */
  char read_why[256];  /* ...and why */
  bool watching;       /* the reader polls for the end of the stream, not for data */
  bool kicked;         /* a wake of the reader (kick_fd) is pending */
  pending *handed;     /* asynchronous replies a leader read: the reader completes them */
  pending **handed_tail;
  int kick_fd;           /* eventfd in the reader's poll */
  oi_wire_reader rd;     /* the connection's buffered read side (its holder's) */
  oi_wire_arrays arrays; /* (the holder's, and the reconnect's) */
  oiwire_Envelope env;

  pthread_mutex_t teardown_lock;
  bool destroy_requested, arena_open;
  oi_imported_arena *arena;

  /* Engine-owned memory (set at connect, then read-only): */
  bool owned;
  int owned_fd;                 /* cpu: our duplicate of arena_fd; -1 otherwise */
  oi_arena_handle owned_handle; /* cuda: the allocation's IPC handle... */
  uint64_t owned_offset;        /* ...and the arena's offset in it */
  uint64_t arena_size;
  oi_arena_desc *reg_arenas;     /* the layout by offsets, to register again */
  uint64_t *reg_segment_offsets; /* and its segment offsets (NULL: none) */
  uint32_t n_reg_segment_offsets;
  char **reg_names;
  /* Under `lock` (and `write_lock` too where the connection changes): */
  uint64_t gen;      /* connection generation, bumped at each reconnect */
  bool stop;         /* teardown: the reader stops reconnecting */
  int connecting_fd; /* the reader's reconnect attempt (teardown shuts it) */
  uint32_t reconnects;
  atomic_uint_fast64_t disconnected_saves, disconnected_misses;
  /* The load fence. Under `lock`: */
  int server_pid;   /* the server of this connection (SO_PEERCRED; 0: unknown) */
  pending *orphans; /* loads whose connection ended unanswered: they complete when
                       their server is gone (a list through `next`) */
  /* The caller's view of its loads (oi_engine_stats): */
  atomic_uint_fast64_t loads_completed, loads_failed;
  /* The circuit breaker (docs/api.md): open while the server is marked
   * unresponsive. `unresponsive` is read without the lock by the calls'
   * fast path; set and cleared under `lock`. */
  uint32_t lookup_ms, probe_ms;
  atomic_bool unresponsive;
  uint64_t probe_id;      /* the probe in flight (0: none), under `lock` */
  bool unregistered;      /* teardown: the server answered the unregister (its copies ended) */
  uint64_t next_probe_ns; /* when the reader sends the next one */
} remote_engine;

/* The engine ops (remote_ops.c), also the lookup client's. */
extern const engine_ops oi__remote_ops;

/* ---- The pending table, the read side's hand-offs, sending, the circuit breaker and a call
 * waiting for its reply (remote_call.c) */
void oi__remote_pending_insert_locked(remote_engine *e, pending *p);
void oi__remote_pending_unlink_locked(remote_engine *e, pending *p);
void oi__remote_counts_abandon_locked(remote_engine *e, pending *p);
pending *oi__remote_pending_take_locked(remote_engine *e, uint64_t id);
void oi__remote_finish_async(remote_engine *e, pending *p, oi_status st);
void oi__remote_kick_locked(remote_engine *e);
void oi__remote_release_read_side_locked(remote_engine *e);
void oi__remote_finish_handed(remote_engine *e);
void oi__remote_init_sync(remote_engine *e);
uint32_t oi__remote_instance_of(remote_engine *e);
bool oi__remote_degraded(remote_engine *e);
oi_status oi__remote_closed_error(remote_engine *e, const char *what);
struct timespec oi__remote_abs_timespec(uint64_t deadline_ns);
bool oi__remote_breaker_open(remote_engine *e);
void oi__remote_trip(remote_engine *e, const char *op, const char *why);
oi_status oi__remote_unresponsive_error(remote_engine *e, const char *what);
oi_status oi__remote_send_pending(remote_engine *e, oiwire_Envelope *env, const oi_wire_out *out,
                                  pending *p, const char *what, bool *taken, uint64_t *id_out);
oi_status oi__remote_call(remote_engine *e, oiwire_Envelope *env, const oi_wire_out *out,
                          pending *p, uint32_t timeout_ms, const char *what);
oi_status oi__remote_unexpected_reply(const pending *p, const char *what);

/* ---- The reader thread and watchdog: delivery, deadline sweeps, the breaker's probe, a lost
 * connection (remote_reader.c) */
oi_status oi__remote_serve_frames(remote_engine *e, bool on_reader);
void *oi__remote_reader_main(void *arg);

/* ---- The operations and the engine's teardown (remote_ops.c) */
oi_status oi__remote_query_call(remote_engine *e, uint32_t instance, const char *namespace_id,
                                uint32_t world_size, const char *req_id,
                                const oi_block_hash *hashes, size_t n, uint32_t flags,
                                uint8_t *present, uint32_t wait_ms, oi_query_result *out);
oi_status oi__remote_release_call(remote_engine *e, uint32_t instance, const char *namespace_id,
                                  oi_lease lease);
oi_status oi__remote_send_unregister(remote_engine *e);
void oi__remote_free_engine(remote_engine *e);
void oi__remote_on_arena_closed(void *ctx);

/* ---- Hello, Register, the reconnect and connect (remote_connect.c) */
oi_status oi__remote_hello(remote_engine *e);
oi_status oi__remote_reconnect(remote_engine *e);

#endif /* OI_ENGINE_REMOTE_INTERNAL_H */
