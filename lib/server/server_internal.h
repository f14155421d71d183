/* The sidecar server: the listener and lifecycle (server.c) and the sessions
 * that serve one client connection each (session.c).
 *
 * Ownership: the server owns the host tier and its sessions; a session owns
 * its instances; an instance owns a local engine over the server's host and
 * the device arena that engine copies from and to. An instance is destroyed
 * (engine drained and destroyed, then the arena freed) when its last
 * reference goes: the session's table holds one, each queued worker job
 * (flush, unregister, layered load) one. Replies of asynchronous operations
 * are written by ticket callbacks on engine threads; they always run before
 * the engine's destroy returns, so a session outlives every callback that
 * names it. A session's workers are joined before its instances go. */
#ifndef OI_SERVER_INTERNAL_H
#define OI_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "core/core.h"
#include "device/device.h"
#include "host/host.h"
#include "openinfer/engine.h"
#include "openinfer/experimental.h"
#include "openinfer/host.h"
#include "openinfer/server.h"
#include "proto/wire.h"

typedef struct srv_session srv_session;

typedef struct srv_instance {
  struct srv_instance *next; /* in its session's table */
  atomic_int refs;
  uint32_t id;
  oi_server *server;
  oi_engine *engine;
  oi_dev *dev; /* the device the arena lives on */
  void *arena;
  uint64_t arena_bytes;
  bool by_session_end; /* destroyed because its session ended (not unregistered) */
  /* Engine-owned memory (Register.client_owned): the client's arena, mapped
   * here at `map` (map_bytes long; the arena is at map + the client's
   * offset), unmapped after the engine drained; never freed here. */
  bool owned;
  void *map;
  uint64_t map_bytes;
} srv_instance;

typedef enum aux_kind { AUX_FLUSH, AUX_UNREGISTER, AUX_LOAD_PROGRESS } aux_kind;

/* Work a session hands to one of its worker threads because it blocks: a
 * flush, an unregister that must wait behind a flush (the aux worker), a
 * layered load whose arenas are reported as they land (the progress
 * worker). */
typedef struct aux_job {
  struct aux_job *next;
  aux_kind kind;
  uint64_t request_id;
  srv_instance *inst; /* one reference */
  uint32_t timeout_ms;
  oi_ticket *ticket; /* AUX_LOAD_PROGRESS: the load's observer reference */
  uint32_t n_arenas; /* AUX_LOAD_PROGRESS: the layout's arenas */
  size_t n_blocks;   /* AUX_LOAD_PROGRESS: the load's blocks (for its failure's message) */
} aux_job;

/* A session's worker thread and its queue (started at the first job). Jobs
 * queued before stop are still run (a stopping flush reply is not sent). */
typedef struct srv_worker {
  srv_session *session;
  const char *name; /* thread name */
  pthread_t thread;
  bool started;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  aux_job *head, *tail;
  bool stop;
} srv_worker;

struct srv_session {
  srv_session *next; /* in the server's list */
  oi_server *server;
  uint64_t id;
  int fd;
  pid_t peer_pid;
  uid_t peer_uid;
  gid_t peer_gid;
  pthread_t thread;
  _Atomic bool hello_done;        /* set by the session thread; read by the run loop */
  _Atomic bool handshake_expired; /* the run loop cut a session that sent no Hello in time */
  uint64_t start_ns;
  bool finished; /* the thread is about to return: join it */

  pthread_mutex_t write_lock; /* one frame at a time on fd */
  bool write_broken;

  srv_instance *instances;  /* written by the session thread under the server lock */
  uint32_t lookup_instance; /* the host instance of its lookups' leases (0: none yet) */

  srv_worker aux;      /* flush, unregister */
  srv_worker progress; /* layered loads (per-arena LoadProgress, then the Result) */

  oi_wire_reader rd; /* the session thread's buffered read side */
  oi_wire_arrays arrays;
  int recv_fd;      /* a descriptor that came with the current frame (SCM_RIGHTS), or -1 */
  int recv_extra;   /* more descriptors came with it (closed) */
  uint8_t *present; /* membership answers */
  oiwire_Envelope env;
};

struct oi_server {
  oi_server_options opts; /* arrays and strings point into the owned copies below */
  char *socket_path;
  uint32_t *allowed_uids, *allowed_gids;
  int32_t *devices;
  oi_host_options host_opts;
  oi_host *host;
  uint64_t epoch;

  int listen_fd;
  int wake_fds[2]; /* self-pipe: oi_server_stop and finishing sessions write */
  dev_t sock_dev;
  ino_t sock_ino;
  atomic_bool stop_requested;
  atomic_int state; /* 0 created, 1 running, 2 done */

  pthread_mutex_t lock;
  pthread_cond_t sessions_cv; /* a session finished */
  srv_session *sessions;
  uint32_t num_sessions;
  uint64_t next_session_id;

  atomic_uint_fast64_t instances, arena_bytes, instances_cleaned_up;
  uint64_t start_ns;               /* oi__now_ns() at create */
  struct oi_metrics_http *metrics; /* the /metrics endpoint (metrics.c), or NULL */
};

/* session.c */
oi_status oi__session_start(oi_server *srv, int fd, pid_t pid, uid_t uid, gid_t gid,
                            srv_session **out);
/* Joins a finished session's thread and frees it. */
void oi__session_reap(srv_session *s);
/* Sends a session-level error (request id 0) on a fresh connection. */
void oi__send_refusal(int fd, oi_status st, const char *msg);
/* Does another session own instance `id`? (server lock taken inside) */
bool oi__server_instance_elsewhere(oi_server *srv, const srv_session *self, uint32_t id);
/* request.c: the checks of a decoded request that need no instance (the
 * session runs them in its handlers; the frame fuzzer runs them all through
 * oi__request_check). Each returns OI_OK, or a status with a message in msg. */
oi_status oi__req_check_hello(const oiwire_Hello *h, char *msg, size_t cap);
oi_status oi__req_check_arrays(const oi_wire_arrays *a, const char *what, char *msg, size_t cap);
oi_status oi__req_check_save(const oi_wire_arrays *a, char *msg, size_t cap);
oi_status oi__req_lease(const char *what, const uint8_t *bytes, size_t size, oi_lease *lease,
                        char *msg, size_t cap);
/* Register: arena_size and arena count, then the engine options (*descs is
 * oi__calloc'ed; names point into `a`, strings into `r`; arena_base NULL)
 * validated against a stand-in base. On error *descs is NULL. */
oi_status oi__req_register_options(const oiwire_Register *r, const oi_wire_arrays *a,
                                   oi_engine_options *eo, oi_arena_desc **descs, char *msg,
                                   size_t cap);
/* Every check above that applies to the request's type (and the type itself). */
oi_status oi__request_check(const oiwire_Envelope *env, const oi_wire_arrays *a, char *msg,
                            size_t cap);
/* Copies oi_host_stats into its wire form. */
void oi__wire_host_stats(const oi_host_stats *hs, oiwire_HostStats *w);

/* metrics.c: the HTTP endpoint (/metrics in the Prometheus text format,
 * /healthz), served by libmicrohttpd on its own thread. `addr` is
 * "HOST:PORT" ("[v6]:PORT"; "PORT" or ":PORT" bind to 127.0.0.1). Fails
 * with OI_ERR_UNSUPPORTED in a build without libmicrohttpd. */
oi_status oi__metrics_start(oi_server *srv, const char *addr);
uint16_t oi__metrics_port(const oi_server *srv);
void oi__metrics_stop(oi_server *srv);
/* Appends the Prometheus text exposition of the server's metrics to a
 * growable buffer (libc malloc: libmicrohttpd frees it). @return false when
 * out of memory. */
bool oi__metrics_render(oi_server *srv, char **buf, size_t *len, size_t *cap);
/* Health: true when the server runs, its pool is set up (pinned unless
 * OI_HOST_NO_PIN) and every device it serves answers; else false with why. */
bool oi__server_healthy(oi_server *srv, char *why, size_t cap);

#endif
