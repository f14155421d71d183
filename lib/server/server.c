/* The sidecar server's lifecycle: options, the host pool, the listening
 * socket (mode, stale-socket replacement, SO_PEERCRED checks), the accept
 * loop and shutdown. Sessions live in session.c. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "server/server_internal.h"

OI_API oi_status oi_server_options_init(oi_server_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->socket_mode = 0600;
  o->log_level = -1;
  o->max_sessions = 256;
  o->handshake_timeout_ms = 10000;
  return OI_OK;
}

static bool peer_allowed(const oi_server *s, uid_t uid, gid_t gid) {
  if (uid == geteuid()) return true;
  for (uint32_t i = 0; i < s->opts.num_allowed_uids; i++)
    if (s->allowed_uids[i] == uid) return true;
  for (uint32_t i = 0; i < s->opts.num_allowed_gids; i++)
    if (s->allowed_gids[i] == gid) return true;
  return false;
}

static uint64_t random_epoch(void) {
  uint64_t v = 0;
  while (v == 0) {
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
      v = oi__now_ns() ^ ((uint64_t)getpid() << 32); /* no entropy source: still changes */
  }
  return v;
}

/* Is something accepting connections on `path`? */
static bool socket_is_live(const char *path) {
  int fd;
  oi_status st = oi__wire_connect(path, &fd);
  if (st != OI_OK) {
    oi_clear_error();
    return st == OI_ERR_PERMISSION; /* someone's, and not ours to remove */
  }
  close(fd);
  return true;
}

/* The socket's owner file, `<socket>.pid`: the pid of the server that
 * listens there. A later server that finds the socket stale reads it to
 * clean up what a killed server left (its cpu arenas' shared memory). */
static void owner_path(const char *socket_path, char *out, size_t cap) {
  snprintf(out, cap, "%s.pid", socket_path);
}

static void write_owner(const char *socket_path) {
  char path[4200], tmp[4300];
  owner_path(socket_path, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) {
    OI_LOG(OI_LOG_WARN, "server",
           "cannot write %s: %s (a later server cannot clean up after this "
           "one if it is killed)",
           path, strerror(errno));
    return;
  }
  fprintf(f, "%d\n", (int)getpid());
  bool ok = fclose(f) == 0;
  if (!ok || rename(tmp, path) != 0) {
    OI_LOG(OI_LOG_WARN, "server", "cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
  }
}

static int read_owner(const char *socket_path) {
  char path[4200];
  owner_path(socket_path, path, sizeof path);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int pid = 0;
  if (fscanf(f, "%d", &pid) != 1) pid = 0;
  fclose(f);
  return pid;
}

/* The socket at `path` is stale: if the server that listened there died
 * (SIGKILL, a crash), remove the shared-memory arenas it could not. */
static void clean_dead_owner(const char *path) {
  int pid = read_owner(path);
  if (pid <= 0 || pid == (int)getpid()) return;
  if (kill(pid, 0) == 0 || errno != ESRCH) {
    OI_LOG(OI_LOG_INFO, "server",
           "the stale socket's server (pid %d) still exists: leaving its "
           "arenas alone",
           pid);
    return;
  }
  int n = oi__cpu_remove_orphan_arenas(pid);
  if (n)
    OI_LOG(OI_LOG_WARN, "server",
           "removed %d shared-memory arena%s that a dead server (pid %d) "
           "left behind",
           n, n == 1 ? "" : "s", pid);
}

/* What is at `path` already: nothing, or a socket nobody listens on (then
 * *stale is set, when stale is not NULL); anything else is refused. */
static oi_status check_existing(const char *path, bool *stale) {
  struct stat st;
  if (lstat(path, &st) != 0) return OI_OK;
  if (!S_ISSOCK(st.st_mode))
    return oi__fail(OI_ERR_STATE, "server: %s exists and is not a socket (not removing it)", path);
  if (socket_is_live(path))
    return oi__fail(OI_ERR_BUSY, "server: another server listens on %s", path);
  if (stale) *stale = true;
  return OI_OK;
}

/* Checks everything about the socket path that can be checked without
 * binding it, so a bad path fails before the pool is set up. */
static oi_status check_socket_path(const char *path) {
  struct sockaddr_un sa;
  if (!path[0]) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server: the socket path is empty");
  if (strlen(path) >= sizeof sa.sun_path)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "server: socket path '%s' is longer than %zu bytes",
                    path, sizeof sa.sun_path - 1);
  char dir[sizeof sa.sun_path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    dir[1] = 0;
  else
    *slash = 0;
  struct stat st;
  if (stat(dir, &st) != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "server: cannot listen on %s: the directory %s: %s",
                    path, dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "server: cannot listen on %s: %s is not a directory",
                    path, dir);
  if (access(dir, W_OK | X_OK) != 0)
    return oi__fail(OI_ERR_PERMISSION,
                    "server: cannot listen on %s: no permission to create a "
                    "socket in %s",
                    path, dir);
  return check_existing(path, NULL);
}

/* Binds and listens on `path` with mode `mode`. The socket is bound under a
 * temporary name, given its mode, then renamed into place, so it is never
 * reachable with a wider mode than asked for, and a stale socket file is
 * replaced atomically. */
static oi_status listen_on(oi_server *s, const char *path, uint32_t mode) {
  struct sockaddr_un sa;
  if (strlen(path) >= sizeof sa.sun_path)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "server: socket path '%s' is longer than %zu bytes",
                    path, sizeof sa.sun_path - 1);
  bool stale = false;
  oi_status rc = check_existing(path, &stale);
  if (rc != OI_OK) return rc;
  if (stale) {
    OI_LOG(OI_LOG_INFO, "server", "replacing the stale socket %s", path);
    clean_dead_owner(path);
  }
  char tmp[sizeof sa.sun_path];
  int n = snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  bool direct = n < 0 || (size_t)n >= sizeof tmp;
  const char *bind_path = direct ? path : tmp;
  if (!direct)
    unlink(tmp);
  else
    unlink(path); /* stale (checked above) */

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return oi__fail(OI_ERR_IO, "server: socket: %s", strerror(errno));
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, bind_path, strlen(bind_path));
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    close(fd);
    return oi__fail(e == EACCES ? OI_ERR_PERMISSION : OI_ERR_IO, "server: bind %s: %s", bind_path,
                    strerror(e));
  }
  if (chmod(bind_path, mode) != 0 || (!direct && rename(tmp, path) != 0)) {
    int e = errno;
    unlink(bind_path);
    close(fd);
    return oi__fail(OI_ERR_IO, "server: cannot set up %s: %s", path, strerror(e));
  }
  if (listen(fd, 128) != 0) {
    int e = errno;
    unlink(path);
    close(fd);
    return oi__fail(OI_ERR_IO, "server: listen %s: %s", path, strerror(e));
  }
  struct stat st;
  if (lstat(path, &st) == 0) {
    s->sock_dev = st.st_dev;
    s->sock_ino = st.st_ino;
  }
  s->listen_fd = fd;
  write_owner(path);
  return OI_OK;
}

OI_API oi_status oi_server_create(const oi_server_options *o, oi_server **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_create: out is NULL");
  *out = NULL;
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_create: options is NULL");
  oi_server_options opts;
  oi_server_options_init(&opts);
  oi_status st = oi__struct_in_min(&opts, sizeof opts, o, OI_FLOOR_SERVER_OPTIONS, "server_create");
  if (st != OI_OK) return st;
  if (!opts.host)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "server_create: host options are NULL (pool_bytes is required)");
  if (opts.socket_mode > 0777)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "server_create: socket_mode %o is not a permission mode", opts.socket_mode);
  if ((opts.num_allowed_uids && !opts.allowed_uids) ||
      (opts.num_allowed_gids && !opts.allowed_gids) || (opts.num_devices && !opts.devices))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_create: a list has a count but no array");
  if (opts.max_sessions == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_create: max_sessions is 0");
  if (opts.handshake_timeout_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "server_create: handshake_timeout_ms is 0 (UINT32_MAX: no deadline)");
  if (opts.log_level != -1 && (opts.log_level < OI_LOG_TRACE || opts.log_level > OI_LOG_OFF))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_create: log_level %d is not an oi_log_level",
                    opts.log_level);
  for (uint32_t i = 0; i < opts.num_devices; i++) {
    oi_dev *d;
    if ((st = oi__dev_open(opts.devices[i], &d)) != OI_OK)
      return oi__fail(st, "server_create: device %d: %s", opts.devices[i], oi_last_error());
    oi__dev_close(d);
  }

  oi_server *s = oi__calloc(1, sizeof *s);
  if (!s) return oi__fail(OI_ERR_OUT_OF_MEMORY, "server_create: out of memory");
  s->listen_fd = s->wake_fds[0] = s->wake_fds[1] = -1;
  s->start_ns = oi__now_ns();
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->sessions_cv, NULL);
  oi_host_options_init(&s->host_opts);
  if ((st = oi__struct_in(&s->host_opts, sizeof s->host_opts, opts.host, "server_create host")) !=
      OI_OK)
    goto fail;
  char def[108];
  if (!opts.socket_path && (st = oi__wire_default_socket_path(def, sizeof def)) != OI_OK) goto fail;
  s->socket_path = oi__strdup(opts.socket_path ? opts.socket_path : def);
  s->allowed_uids = oi__calloc(opts.num_allowed_uids + 1, sizeof(uint32_t));
  s->allowed_gids = oi__calloc(opts.num_allowed_gids + 1, sizeof(uint32_t));
  s->devices = oi__calloc(opts.num_devices + 1, sizeof(int32_t));
  if (!s->socket_path || !s->allowed_uids || !s->allowed_gids || !s->devices) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "server_create: out of memory");
    goto fail;
  }
  if (opts.num_allowed_uids)
    memcpy(s->allowed_uids, opts.allowed_uids, opts.num_allowed_uids * sizeof(uint32_t));
  if (opts.num_allowed_gids)
    memcpy(s->allowed_gids, opts.allowed_gids, opts.num_allowed_gids * sizeof(uint32_t));
  if (opts.num_devices) memcpy(s->devices, opts.devices, opts.num_devices * sizeof(int32_t));
  opts.socket_path = s->socket_path;
  opts.allowed_uids = s->allowed_uids;
  opts.allowed_gids = s->allowed_gids;
  opts.devices = s->devices;
  opts.host = &s->host_opts;
  s->opts = opts;
  if (opts.log_level != -1) oi_set_log_level((oi_log_level)opts.log_level);
  s->epoch = random_epoch();
  if (pipe2(s->wake_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    st = oi__fail(OI_ERR_IO, "server_create: pipe: %s", strerror(errno));
    goto fail;
  }
  /* The socket path and the HTTP endpoint first: a bad path or a busy port
   * fails before the pool is pinned (which takes seconds for a large pool),
   * and /healthz answers 503 while the pool is set up. */
  if ((st = check_socket_path(s->socket_path)) != OI_OK) goto fail;
  if (opts.metrics_addr && (st = oi__metrics_start(s, opts.metrics_addr)) != OI_OK) goto fail;
  s->opts.metrics_addr = NULL; /* the caller's string: not kept */
  /* The disk tier's options next (directories, a directory in use, room
   * for its files): a bad one fails before the pool is pinned, too. */
  if (opts.disk && (st = oi_host_disk_options_check(opts.disk)) != OI_OK) goto fail;
  oi_host *host = NULL;
  if ((st = oi_host_create(&s->host_opts, &host)) != OI_OK) goto fail;
  __atomic_store_n(&s->host, host, __ATOMIC_RELEASE); /* the endpoint's thread reads it */
  if (opts.disk && (st = oi_host_attach_disk(host, opts.disk)) != OI_OK) goto fail;
  s->opts.disk = NULL; /* the caller's: not kept */
  if ((st = listen_on(s, s->socket_path, opts.socket_mode)) != OI_OK) goto fail;
  /* DEBUG: oi_server_create's caller reports it (oi_server_socket_path,
   * oi_server_epoch); `openinfer serve` prints its own ready line. */
  OI_LOG(OI_LOG_DEBUG, "server", "listening on %s (mode %o, epoch %016llx)", s->socket_path,
         opts.socket_mode, (unsigned long long)s->epoch);
  *out = s;
  return OI_OK;
fail:
  oi_server_destroy(s);
  return st;
}

OI_API uint64_t oi_server_epoch(const oi_server *s) { return s ? s->epoch : 0; }

OI_API const char *oi_server_socket_path(const oi_server *s) { return s ? s->socket_path : NULL; }

OI_API uint16_t oi_server_metrics_port(const oi_server *s) { return s ? oi__metrics_port(s) : 0; }

OI_API oi_status oi_server_stop(oi_server *s) {
  if (!s) return OI_ERR_INVALID_ARGUMENT; /* no oi__fail: it is not async-signal-safe */
  atomic_store(&s->stop_requested, true);
  int saved = errno;
  ssize_t w = write(s->wake_fds[1], "s", 1);
  OI_UNUSED(w);
  errno = saved;
  return OI_OK;
}

/* Cuts the sessions that sent no Hello within the handshake deadline: their
 * read side is shut, so the session thread sees the end of its stream, tells
 * the peer why and ends (then it is reaped like any other). Server lock
 * held. */
static void expire_handshakes_locked(oi_server *s) {
  if (s->opts.handshake_timeout_ms == UINT32_MAX) return;
  uint64_t now = oi__now_ns(), limit = (uint64_t)s->opts.handshake_timeout_ms * 1000000ull;
  for (srv_session *ss = s->sessions; ss; ss = ss->next)
    if (!ss->finished && !atomic_load(&ss->hello_done) && !atomic_load(&ss->handshake_expired) &&
        now - ss->start_ns >= limit) {
      atomic_store(&ss->handshake_expired, true);
      shutdown(ss->fd, SHUT_RD);
    }
}

/* Joins and frees the sessions whose threads finished. Server lock held. */
static void reap_finished_locked(oi_server *s) {
  for (srv_session **l = &s->sessions; *l;) {
    srv_session *ss = *l;
    if (!ss->finished) {
      l = &ss->next;
      continue;
    }
    *l = ss->next;
    s->num_sessions--;
    pthread_mutex_unlock(&s->lock);
    oi__session_reap(ss);
    pthread_mutex_lock(&s->lock);
    l = &s->sessions; /* the list may have changed while unlocked */
  }
}

static void accept_one(oi_server *s) {
  int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
      OI_LOG(OI_LOG_WARN, "server", "accept: %s", strerror(errno));
    if (errno == EMFILE || errno == ENFILE) usleep(10000); /* do not spin */
    return;
  }
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    OI_LOG(OI_LOG_WARN, "server", "SO_PEERCRED: %s (connection refused)", strerror(errno));
    close(fd);
    return;
  }
  if (!peer_allowed(s, cred.uid, cred.gid)) {
    OI_LOG(OI_LOG_WARN, "server", "refused a connection from pid %d uid %u gid %u (not allowed)",
           (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
    char msg[128];
    snprintf(msg, sizeof msg, "uid %u is not allowed to use this openinfer server",
             (unsigned)cred.uid);
    oi__send_refusal(fd, OI_ERR_PERMISSION, msg);
    close(fd);
    return;
  }
  pthread_mutex_lock(&s->lock);
  bool full = s->num_sessions >= s->opts.max_sessions;
  pthread_mutex_unlock(&s->lock);
  if (full) {
    OI_LOG(OI_LOG_WARN, "server", "refused a connection from pid %d: %u sessions already",
           (int)cred.pid, s->opts.max_sessions);
    oi__send_refusal(fd, OI_ERR_BUSY, "the server has reached its session limit");
    close(fd);
    return;
  }
  srv_session *ss;
  if (oi__session_start(s, fd, cred.pid, cred.uid, cred.gid, &ss) != OI_OK) {
    OI_LOG(OI_LOG_ERROR, "server", "%s", oi_last_error());
    oi__send_refusal(fd, OI_ERR_INTERNAL, oi_last_error());
    close(fd);
  }
}

OI_API oi_status oi_server_attach_cluster(oi_server *s, const oi_host_cluster_options *o) {
  if (!s) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_attach_cluster: server is NULL");
  if (atomic_load(&s->state) != 0)
    return oi__fail(OI_ERR_STATE, "server_attach_cluster: the server runs already");
  return oi_host_attach_cluster(s->host, o);
}

OI_API oi_status oi_server_run(oi_server *s) {
  if (!s) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_run: server is NULL");
  int expected = 0;
  if (!atomic_compare_exchange_strong(&s->state, &expected, 1))
    return oi__fail(OI_ERR_STATE, "server_run: the server %s",
                    expected == 1 ? "is running" : "already ran");
  while (!atomic_load(&s->stop_requested)) {
    struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN},
                          {.fd = s->wake_fds[0], .events = POLLIN}};
    /* Wake up now and then to cut connections that never said Hello. */
    int rc = poll(p, 2, s->opts.handshake_timeout_ms == UINT32_MAX ? -1 : 250);
    if (rc < 0) {
      if (errno == EINTR) continue;
      OI_LOG(OI_LOG_ERROR, "server", "poll: %s", strerror(errno));
      break;
    }
    pthread_mutex_lock(&s->lock);
    expire_handshakes_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (p[1].revents) {
      char buf[64];
      while (read(s->wake_fds[0], buf, sizeof buf) > 0) {
      }
      pthread_mutex_lock(&s->lock);
      reap_finished_locked(s);
      pthread_mutex_unlock(&s->lock);
    }
    if (atomic_load(&s->stop_requested)) break;
    if (p[0].revents & POLLIN) accept_one(s);
  }
  OI_LOG(OI_LOG_INFO, "server", "stopping: closing every session");
  pthread_mutex_lock(&s->lock);
  for (srv_session *ss = s->sessions; ss; ss = ss->next)
    shutdown(ss->fd, SHUT_RDWR);
  while (s->sessions) {
    reap_finished_locked(s);
    if (s->sessions) pthread_cond_wait(&s->sessions_cv, &s->lock);
  }
  pthread_mutex_unlock(&s->lock);
  atomic_store(&s->state, 2);
  return OI_OK;
}

OI_API void oi_server_destroy(oi_server *s) {
  if (!s) return;
  if (atomic_load(&s->state) == 1) {
    OI_LOG(OI_LOG_ERROR, "server",
           "server_destroy while oi_server_run runs: refused (stop it first)");
    return;
  }
  oi__metrics_stop(s); /* its handler reads the host */
  if (s->listen_fd >= 0) {
    struct stat st;
    /* Only our own socket file: a newer server may have replaced it. */
    if (lstat(s->socket_path, &st) == 0 && st.st_dev == s->sock_dev && st.st_ino == s->sock_ino) {
      unlink(s->socket_path);
      char owner[4200];
      owner_path(s->socket_path, owner, sizeof owner);
      if (read_owner(s->socket_path) == (int)getpid()) unlink(owner);
    }
    close(s->listen_fd);
  }
  oi_host_destroy(s->host);
  if (s->wake_fds[0] >= 0) close(s->wake_fds[0]);
  if (s->wake_fds[1] >= 0) close(s->wake_fds[1]);
  pthread_cond_destroy(&s->sessions_cv);
  pthread_mutex_destroy(&s->lock);
  oi__free(s->socket_path);
  oi__free(s->allowed_uids);
  oi__free(s->allowed_gids);
  oi__free(s->devices);
  oi__free(s);
}
