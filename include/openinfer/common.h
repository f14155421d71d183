/*
 * libopeninfer — common definitions: export macro, status codes, versions,
 * last-error, logging and fatal handlers, core value types (block hashes,
 * leases, arena handles, arena descriptors) and tickets.
 *
 * Stability: everything in this header is part of the OPENINFER_0.1 ABI.
 * Status codes are stable once released: new codes are only ever added.
 */
#ifndef OPENINFER_COMMON_H
#define OPENINFER_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(OI_BUILDING_LIBRARY)
#define OI_API __attribute__((visibility("default")))
#else
#define OI_API
#endif

#define OI_VERSION_MAJOR 0
#define OI_VERSION_MINOR 1
#define OI_VERSION_PATCH 0
/* (major << 16) | (minor << 8) | patch, comparable as an integer. */
#define OI_VERSION_NUMBER ((OI_VERSION_MAJOR << 16) | (OI_VERSION_MINOR << 8) | OI_VERSION_PATCH)

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* Every fallible function returns an oi_status. OI_OK is 0, OI_PENDING is 1,
 * errors are negative. Values never change once released. A ticket's poll
 * answers OI_PENDING or OI_FENCING (2) while it is not final. */
typedef int32_t oi_status;
enum {
  OI_OK = 0,
  OI_PENDING = 1,
  /* Not final (oi_ticket_poll, oi_ticket_arena_poll): a load missed its
   * deadline and has failed, but a copy into its destination blocks may
   * still land, so they stay the library's until the ticket completes
   * (then with OI_ERR_DEADLINE). */
  OI_FENCING = 2,
  OI_ERR_INVALID_ARGUMENT = -1,
  OI_ERR_NOT_FOUND = -2,
  OI_ERR_OUT_OF_MEMORY = -3,
  OI_ERR_TIMEOUT = -4,
  OI_ERR_CUDA = -5,
  OI_ERR_IO = -6,
  OI_ERR_PROTOCOL = -7,
  OI_ERR_STATE = -8,
  OI_ERR_LEASE_EXPIRED = -9,
  OI_ERR_CLOSED = -10,
  OI_ERR_UNSUPPORTED = -11,
  OI_ERR_PERMISSION = -12,
  OI_ERR_VERSION = -13,
  OI_ERR_INTERNAL = -14,
  OI_ERR_NO_DEVICE = -15,
  OI_ERR_BUSY = -16,
  /* A load missed its deadline; final only once no copy can still land in
   * its destination (then the blocks are the caller's again). */
  OI_ERR_DEADLINE = -17,
};

/* Static name of a status ("OI_ERR_TIMEOUT"); "OI_ERR_UNKNOWN" for values
 * this library does not know. Never NULL. */
OI_API const char *oi_status_str(oi_status st);

/* Human-readable message of the last failure on the calling thread
 * ("save: block id 4097 out of range ..."). Valid until the next library call
 * on this thread. Empty string when nothing failed. Never NULL. */
OI_API const char *oi_last_error(void);

/* Clears the calling thread's last error. */
OI_API void oi_clear_error(void);

/* ------------------------------------------------------------------------ */
/* Version                                                                   */
/* ------------------------------------------------------------------------ */

/* OI_VERSION_NUMBER of the library actually loaded (may differ from the
 * header the caller compiled against). */
OI_API uint32_t oi_version(void);
/* "0.1.0 (cpu)" or "0.1.0 (cpu, cuda)": the version and the compiled backends. */
OI_API const char *oi_version_string(void);

/* ------------------------------------------------------------------------ */
/* Logging and fatal conditions                                              */
/* ------------------------------------------------------------------------ */

typedef enum oi_log_level {
  OI_LOG_TRACE = 0,
  OI_LOG_DEBUG = 1,
  OI_LOG_INFO = 2,
  OI_LOG_WARN = 3,
  OI_LOG_ERROR = 4,
  OI_LOG_OFF = 5,
} oi_log_level;

/* Receives one complete line (no trailing newline), one event per line,
 * already formatted as "level=... component=... msg=..." (logfmt), with
 * "instance=N" after the component when the event concerns one engine
 * instance. May be called from any library thread. */
typedef void (*oi_log_fn)(void *ctx, oi_log_level level, const char *line);

/* Installs a process-wide log handler; NULL restores the default (stderr).
 * Thread-safe. */
OI_API void oi_set_log_handler(oi_log_fn fn, void *ctx);
/* Messages below `level` are discarded. Default OI_LOG_WARN (or the value of
 * the environment variable OI_LOG_LEVEL: trace|debug|info|warn|error|off). */
OI_API oi_status oi_set_log_level(oi_log_level level);
OI_API oi_log_level oi_get_log_level(void);

/* Called on conditions the process cannot survive safely (the sidecar died
 * while this process still uses memory it owned). The default handler logs
 * and calls abort(). A handler that returns lets the library abort(). */
typedef void (*oi_fatal_fn)(void *ctx, const char *reason);
OI_API void oi_set_fatal_handler(oi_fatal_fn fn, void *ctx);

/* ------------------------------------------------------------------------ */
/* Value types                                                               */
/* ------------------------------------------------------------------------ */

/* 16 opaque bytes naming a block's content (see oi_hash_blocks). */
typedef struct oi_block_hash {
  uint8_t bytes[16];
} oi_block_hash;

/* A pin on the blocks a query reported; all-zero means "no lease". */
typedef struct oi_lease {
  uint8_t bytes[16];
} oi_lease;

/* An exported arena: a CUDA IPC handle (cuda) or a shared-memory object
 * name and size (cpu). */
typedef struct oi_arena_handle {
  uint8_t bytes[64];
} oi_arena_handle;

/* One arena: a region holding one slice of every block (one layer's K+V, an
 * MLA layer, ...). Block b, segment s of this arena lives at
 *   base + b * block_stride + s * segment_stride, bytes_per_block bytes.
 * Every arena of a layout has the same num_blocks. The host block is the
 * concatenation, in arena then segment order, of these slices. */
typedef struct oi_arena_desc {
  const char *name; /* unique within the layout */
  uint64_t offset;  /* from the layout's arena_base (when set) */
  void *base;       /* absolute address (when arena_base is NULL) */
  uint64_t num_blocks;
  uint64_t bytes_per_block; /* copy unit of one segment */
  uint64_t block_stride;    /* >= (segments-1)*segment_stride + bytes_per_block */
  uint32_t segments;        /* 1, or 2 for split K/V (at most 8) */
  uint64_t segment_stride;  /* bytes between segments (>= bytes_per_block) */
} oi_arena_desc;

/* Latency histograms (oi_host_stats, oi_engine_stats): OI_LATENCY_BUCKETS
 * fixed log-scale buckets, not cumulative. Bucket i < OI_LATENCY_BUCKETS - 1
 * counts operations that took at most 2^i microseconds (and more than
 * 2^(i-1)); bucket 0 counts those of at most 1 us; the last bucket counts
 * everything slower than 2^(OI_LATENCY_BUCKETS - 2) us (about 67 s). */
#define OI_LATENCY_BUCKETS 28

/* ------------------------------------------------------------------------ */
/* Tickets                                                                   */
/* ------------------------------------------------------------------------ */

/* The completion object of an asynchronous operation (save, load, flush).
 * Thread-safe. The caller owns one reference (the observer) and drops it with
 * oi_ticket_release; the I/O behind a ticket keeps its own reference, so
 * releasing a pending ticket never frees memory the operation still writes. */
typedef struct oi_ticket oi_ticket;

/* Called once, on completion, with the final status; from a library thread,
 * or from oi_ticket_set_callback itself when the ticket already completed. */
typedef void (*oi_ticket_fn)(void *ctx, oi_ticket *t, oi_status st);

/* @return OI_PENDING while the operation runs, then OI_OK or its error.
 * A load past its deadline whose copies may still land answers OI_FENCING
 * (not final: its destination blocks are not the caller's yet) until they
 * are fenced; then it completes with OI_ERR_DEADLINE. */
OI_API oi_status oi_ticket_poll(oi_ticket *t);
/* Waits up to timeout_ms (UINT32_MAX = forever). @return the final status,
 * or OI_ERR_TIMEOUT, which leaves the ticket pending and usable: when the
 * wait ran out, and at once when the operation missed its own deadline but
 * is not final yet (poll answers OI_FENCING), so no wait outlasts the
 * operation's deadline. A load's destination blocks are the caller's again
 * only once the ticket is final: no byte lands in them after that. When the
 * library knows why an operation failed (a frame that did not verify,
 * docs/codecs.md), a wait or poll returning that error sets it as the
 * caller's oi_last_error(). */
OI_API oi_status oi_ticket_wait(oi_ticket *t, uint32_t timeout_ms);
/* An eventfd that becomes readable when the ticket completes (and stays
 * readable). Owned by the ticket: do not close it. -1 on failure. */
OI_API int oi_ticket_fd(oi_ticket *t);
/* The cudaEvent_t recorded after the operation's copies (cuda backend), so a
 * compute stream can wait on it; NULL on the cpu backend. */
OI_API void *oi_ticket_cuda_event(oi_ticket *t);
/* A load submitted with OI_LOAD_ARENA_EVENTS: the CUDA event (cudaEvent_t)
 * recorded after arena `arena`'s copies, in the layout's arena order, so a
 * compute stream can wait (cudaStreamWaitEvent) for one arena's bytes while
 * the later arenas are still moving. NULL when the load has none (not
 * layered, no CUDA, the remote engine) or `arena` is out of range: then wait
 * for the ticket. Owned by the ticket (valid until oi_ticket_release). The
 * event only orders the device work; whether the load succeeded is still
 * the ticket's status, so work that used the bytes before the ticket
 * completed must be discarded if it completes with an error. */
OI_API void *oi_ticket_arena_event(oi_ticket *t, uint32_t arena);
/* Per-arena completion of a load, in every mode. A load submitted with
 * OI_LOAD_ARENA_EVENTS (an embedded engine, cpu or CUDA, or a sidecar engine
 * whose server reports load progress) reports each arena
 * as its copies land, in the layout's arena order: oi_ticket_arena_wait
 * returns OI_OK once arena `arena`'s bytes are in place in device memory (on
 * CUDA: its copies completed, not only queued), or the load's error as soon
 * as the load failed at this arena or an earlier one, or the ticket completed
 * with an error (then every wait, of any arena, returns the error: bytes of a
 * failed load are never to be used). OI_ERR_TIMEOUT after timeout_ms
 * (UINT32_MAX: forever) leaves the ticket usable. A ticket without per-arena
 * progress (any other operation, a load without the flag, a sidecar load
 * from an older server) waits for the whole ticket, whatever `arena`; with per-arena
 * progress, an arena past the layout's count is OI_ERR_INVALID_ARGUMENT.
 * oi_ticket_arena_poll answers the same without blocking (OI_PENDING while
 * the arena is still moving). While the load is fencing (past its deadline,
 * copies may still land) every arena's poll answers OI_FENCING and its wait
 * OI_ERR_TIMEOUT at once, as oi_ticket_poll / oi_ticket_wait do. */
OI_API oi_status oi_ticket_arena_wait(oi_ticket *t, uint32_t arena, uint32_t timeout_ms);
OI_API oi_status oi_ticket_arena_poll(oi_ticket *t, uint32_t arena);
/* Registers the completion callback (at most one per ticket).
 * @return OI_ERR_STATE if one is already set. */
OI_API oi_status oi_ticket_set_callback(oi_ticket *t, oi_ticket_fn fn, void *ctx);
/* Drops the caller's reference. Accepts NULL. Never cancels the I/O. */
OI_API void oi_ticket_release(oi_ticket *t);

#ifdef __cplusplus
}
#endif
#endif /* OPENINFER_COMMON_H */
