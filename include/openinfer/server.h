/*
 * libopeninfer — the sidecar server, embeddable (`openinfer serve` wraps it).
 *
 * The server owns a host tier (the pinned pool) and, for every client that
 * registers a layout, allocates that client's KV arena on the client's
 * device, exports it (CUDA IPC handle, or a shared-memory object on the cpu
 * backend) and performs the client's saves and loads on memory it owns.
 * Clients connect with oi_engine_connect over a Unix stream socket.
 * See docs/server.md for the protocol, the security model and the failure
 * policy.
 *
 * Thread-safety: oi_server_stop may be called from any thread and from a
 * signal handler; the other functions from one thread at a time.
 */
#ifndef OPENINFER_SERVER_H
#define OPENINFER_SERVER_H

#include "openinfer/common.h"
#include "openinfer/disk.h"
#include "openinfer/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oi_server oi_server;

typedef struct oi_server_options {
  uint32_t struct_size;
  uint32_t socket_mode; /* permission bits of the socket file; default 0600 */
  /* Where to listen. NULL (default): $XDG_RUNTIME_DIR/openinfer.sock, or
   * /tmp/openinfer-$UID.sock. A stale socket file (nothing listens) is
   * replaced; a live one makes create fail with OI_ERR_BUSY. */
  const char *socket_path;
  /* ---- sessions ---- */
  uint32_t max_sessions; /* concurrent client connections; default 256 */
  /* A connection that has not completed its Hello within this many ms is
   * refused (OI_ERR_TIMEOUT, with a reason) and closed, so silent
   * connections cannot hold the session slots (max_sessions). Sessions past
   * their Hello (registered, idle engines) stay connected however long they
   * are idle. Default 10000; UINT32_MAX: no deadline; 0 is refused. */
  uint32_t handshake_timeout_ms;
  /* Peers are checked with SO_PEERCRED: the server's own uid is always
   * allowed; besides it, any uid listed here and any peer whose primary gid
   * is listed here. Nothing else (root included) is. Default: none. */
  uint32_t num_allowed_uids;
  const uint32_t *allowed_uids;
  uint32_t num_allowed_gids;
  const uint32_t *allowed_gids;
  /* ---- the tiers and the devices ---- */
  /* The host tier (pool size, hugepages, the pool's device...). Required:
   * host->pool_bytes > 0. Copied at create. */
  const oi_host_options *host;
  /* A disk tier under the server's pool (openinfer/disk.h), attached at
   * create (its index of an earlier run replayed before the socket
   * listens); NULL (default): none. Not kept after create. */
  const oi_host_disk_options *disk;
  /* Devices clients may register arenas on (-1: cpu). NULL/0 (default): any. */
  uint32_t num_devices;
  const int32_t *devices;
  /* ---- observability ---- */
  int32_t log_level; /* oi_log_level to set at create; -1 (default): leave it */
  /* Where to serve /metrics (Prometheus text format) and /healthz over HTTP:
   * "HOST:PORT" ("[::1]:PORT" for IPv6); "PORT" or ":PORT" bind to 127.0.0.1.
   * Port 0 picks a free port (oi_server_metrics_port tells which). NULL
   * (default): no HTTP endpoint. A build without libmicrohttpd refuses a
   * non-NULL address with OI_ERR_UNSUPPORTED. See docs/server.md. */
  const char *metrics_addr;
} oi_server_options;

/* Fills defaults. @return OI_ERR_INVALID_ARGUMENT on NULL. */
OI_API oi_status oi_server_options_init(oi_server_options *o);

/* Creates the host pool, then binds and listens on the socket (created with
 * socket_mode). Nothing is served until oi_server_run. */
OI_API oi_status oi_server_create(const oi_server_options *o, oi_server **out);

/* Serves clients (one thread per session) until oi_server_stop; then closes
 * every session (their instances are destroyed and their arenas freed) and
 * returns OI_OK. @return OI_ERR_STATE if already running or already run. */
OI_API oi_status oi_server_run(oi_server *s);

/* Makes oi_server_run return. Async-signal-safe; may be called before run
 * (run then returns at once). */
OI_API oi_status oi_server_stop(oi_server *s);

/* Random 64-bit value chosen at create: a restarted server has another. */
OI_API uint64_t oi_server_epoch(const oi_server *s);

/* The path the server listens on (owned by the server). */
OI_API const char *oi_server_socket_path(const oi_server *s);

/* The TCP port the metrics endpoint listens on (the one picked for port 0),
 * or 0 when the server has none. */
OI_API uint16_t oi_server_metrics_port(const oi_server *s);

/* ------------------------------------------------------------------------ */
/* A running server's figures (client side)                                  */
/* ------------------------------------------------------------------------ */

/* Output struct of oi_server_fetch_stats: set struct_size first. */
typedef struct oi_server_stats {
  uint32_t struct_size;
  uint32_t namespaces;           /* namespaces the server listed */
  char server_version[64];       /* the server's oi_version_string(), NUL-terminated */
  uint64_t epoch;                /* the server's oi_server_epoch */
  uint64_t uptime_ns;            /* since the server was created */
  uint64_t sessions;             /* client connections now */
  uint64_t instances;            /* engines registered now */
  uint64_t arena_bytes;          /* device memory allocated for live instances */
  uint64_t instances_cleaned_up; /* freed because their session ended */
  char socket_path[108];         /* the socket asked (the default path for NULL) */
  /* The disk tier's figures. */
  uint32_t disk_attached; /* 1: the server has a disk tier, `disk` holds its figures */
  uint32_t reserved;
  oi_host_disk_stats disk;
} oi_server_stats;

/* Asks the server listening on `socket_path` (NULL: the default path, as in
 * oi_engine_connect) for its figures, over a connection of its own
 * (no instance is registered), and fills:
 *   - *out (required; struct_size set first);
 *   - *host (optional, NULL: not wanted): the server's host tier, as
 *     oi_host_get_stats would report it there;
 *   - namespaces[0 .. min(cap, out->namespaces)) (optional, cap 0: not
 *     wanted): the array's stride is namespaces[0].struct_size, which every
 *     entry must carry.
 * Each reply is awaited at most timeout_ms (0: 10000; UINT32_MAX: forever).
 * @return OI_ERR_NOT_FOUND when nothing listens at the path,
 * OI_ERR_PERMISSION when the socket refuses this user, OI_ERR_IO (a reply
 * later than timeout_ms included), OI_ERR_CLOSED or OI_ERR_PROTOCOL when the
 * exchange fails. */
OI_API oi_status oi_server_fetch_stats(const char *socket_path, uint32_t timeout_ms,
                                       oi_server_stats *out, oi_host_stats *host,
                                       oi_host_namespace_stats *namespaces, uint32_t cap);

/* Removes the socket file, frees the pool. Must not race oi_server_run:
 * stop it and let run return first. Accepts NULL. */
OI_API void oi_server_destroy(oi_server *s);

#ifdef __cplusplus
}
#endif
#endif
