/* TLS to Redis: the handshake in the caller, then a pump thread per
 * connection between a socket pair (hiredis's end) and the TLS session
 * (redis_tls.h says why). */
#include "cluster/redis_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"

#define PUMP_BUF 16384
#define DESTROY_WAIT_MS 2000

struct oi_redis_tls {
  SSL_CTX *ctx;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  unsigned pumps; /* running, started from this one */
};

static atomic_uint g_pumps;

unsigned oi__redis_tls_pumps(void) { return atomic_load(&g_pumps); }

/* OpenSSL's first queued reason (or errno's), the queue emptied. */
static const char *ssl_reason(char *buf, size_t cap) {
  unsigned long e = ERR_get_error();
  if (e)
    ERR_error_string_n(e, buf, cap);
  else
    snprintf(buf, cap, "%s", errno ? strerror(errno) : "the connection closed");
  ERR_clear_error();
  return buf;
}

static oi_status readable(const char *what, const char *path, bool secret) {
  struct stat st;
  if (stat(path, &st) != 0 || access(path, R_OK) != 0)
    return oi__fail(errno == ENOENT ? OI_ERR_NOT_FOUND : OI_ERR_PERMISSION,
                    "directory TLS: cannot read the %s file %s: %s", what, path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory TLS: the %s file %s is not a regular file",
                    what, path);
  if (secret && (st.st_mode & 077))
    return oi__fail(OI_ERR_PERMISSION,
                    "directory TLS: the %s file %s is readable by group or others (mode %03o); "
                    "chmod 600 it",
                    what, path, (unsigned)(st.st_mode & 0777));
  return OI_OK;
}

oi_status oi__redis_tls_create(const char *ca_file, const char *cert_file, const char *key_file,
                               oi_redis_tls **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory TLS: out is NULL");
  *out = NULL;
  if (!cert_file != !key_file)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory TLS: a client certificate needs its key and a key its "
                    "certificate: give both (redis_tls_cert_file, redis_tls_key_file) or neither");
  oi_status st;
  if ((ca_file && (st = readable("CA", ca_file, false)) != OI_OK) ||
      (cert_file && (st = readable("certificate", cert_file, false)) != OI_OK) ||
      (key_file && (st = readable("key", key_file, true)) != OI_OK))
    return st;
  char why[256];
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx)
    return oi__fail(OI_ERR_INTERNAL, "directory TLS: cannot make a TLS context: %s",
                    ssl_reason(why, sizeof why));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1
              : SSL_CTX_set_default_verify_paths(ctx) != 1) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT, "directory TLS: %s%s: %s",
                  ca_file ? "no usable CA certificate in " : "the system's trusted CAs",
                  ca_file ? ca_file : "", ssl_reason(why, sizeof why));
    goto fail;
  }
  if (cert_file && SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT, "directory TLS: no usable certificate in %s: %s",
                  cert_file, ssl_reason(why, sizeof why));
    goto fail;
  }
  if (key_file && (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1 ||
                   SSL_CTX_check_private_key(ctx) != 1)) {
    st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "directory TLS: the key in %s is not usable or not the certificate's (%s): %s",
                  key_file, cert_file, ssl_reason(why, sizeof why));
    goto fail;
  }
  oi_redis_tls *t = oi__calloc(1, sizeof *t);
  if (!t) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "directory TLS: out of memory");
    goto fail;
  }
  t->ctx = ctx;
  pthread_mutex_init(&t->lock, NULL);
  oi__cond_init_monotonic(&t->cv);
  *out = t;
  return OI_OK;
fail:
  SSL_CTX_free(ctx);
  return st;
}

void oi__redis_tls_destroy(oi_redis_tls *t) {
  if (!t) return;
  struct timespec until = oi__timespec(oi__deadline_ns(DESTROY_WAIT_MS));
  pthread_mutex_lock(&t->lock);
  while (t->pumps && pthread_cond_timedwait(&t->cv, &t->lock, &until) != ETIMEDOUT) {
  }
  unsigned left = t->pumps;
  pthread_mutex_unlock(&t->lock);
  if (left) { /* they hold the context; it outlives them by its count */
    OI_LOG(OI_LOG_WARN, "cluster", "directory TLS: %u connection(s) still closing", left);
    SSL_CTX_free(t->ctx);
    return; /* t stays: the pumps still signal it */
  }
  SSL_CTX_free(t->ctx);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->lock);
  oi__free(t);
}

/* ---- the handshake ---- */

/* Waits for fd to be ready for `events` until the deadline. */
static bool wait_fd(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    uint64_t now = oi__now_ns();
    if (now >= deadline_ns) return false;
    struct pollfd p = {.fd = fd, .events = events};
    int ms = (int)((deadline_ns - now + 999999) / 1000000);
    int r = poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

static int tcp_connect(const char *host, int port, uint64_t deadline_ns, char *err, size_t cap) {
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  int rc = getaddrinfo(host, ps, &hints, &ai);
  if (rc != 0) {
    snprintf(err, cap, "connect %.60s:%d: %s", host, port, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int e = 0;
    socklen_t el = sizeof e;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 &&
        (errno != EINPROGRESS || !wait_fd(fd, POLLOUT, deadline_ns) ||
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 || e != 0)) {
      snprintf(err, cap, "connect %.60s:%d: %s", host, port,
               e                      ? strerror(e)
               : errno == EINPROGRESS ? "timed out"
                                      : strerror(errno));
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

static bool handshake(SSL *s, int fd, const char *host, int port, uint64_t deadline_ns,
                      bool *refused, char *err, size_t cap) {
  for (;;) {
    ERR_clear_error();
    errno = 0;
    int r = SSL_connect(s);
    if (r == 1) return true;
    int e = SSL_get_error(s, r);
    if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) &&
        wait_fd(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ns))
      continue;
    long v = SSL_get_verify_result(s);
    char why[256];
    /* An answer that ended the handshake (not silence, not a reset). */
    *refused = e == SSL_ERROR_SSL;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
      snprintf(err, cap,
               "TLS handshake with %.60s:%d: no answer within the timeout (is it a TLS port?)",
               host, port);
    else if (v != X509_V_OK)
      snprintf(err, cap, "TLS handshake with %.60s:%d: its certificate is refused: %s", host, port,
               X509_verify_cert_error_string(v));
    else
      snprintf(err, cap, "TLS handshake with %.60s:%d: %s", host, port,
               ssl_reason(why, sizeof why));
    return false;
  }
}

/* ---- the pump ---- */

typedef struct pump {
  oi_redis_tls *t;
  char peer[80]; /* "host:port", for the log */
  SSL *ssl;
  int fd;   /* TCP to Redis, non-blocking */
  int side; /* this end of the socket pair, non-blocking */
} pump;

/* After an SSL_read or SSL_write that returned r <= 0: whether to go on
 * (want: the socket event it waits for). A TLS error (not a close, nor
 * Redis gone without closing TLS) is logged with OpenSSL's reason: a refused client certificate
 * surfaces here, as an alert after the handshake. */
static bool ssl_step(const pump *p, int r, short *want) {
  int e = SSL_get_error(p->ssl, r);
  if (e == SSL_ERROR_WANT_READ)
    *want |= POLLIN;
  else if (e == SSL_ERROR_WANT_WRITE)
    *want |= POLLOUT;
  else {
    if (e == SSL_ERROR_SSL &&
        ERR_GET_REASON(ERR_peek_error()) != SSL_R_UNEXPECTED_EOF_WHILE_READING) {
      char why[256];
      OI_LOG(OI_LOG_WARN, "cluster", "directory TLS connection to %s ended: %s", p->peer,
             ssl_reason(why, sizeof why));
    }
    return false; /* closed, or an error: the connection ends */
  }
  return true;
}

static void *pump_main(void *arg) {
  pump *p = arg;
  uint8_t up[PUMP_BUF], down[PUMP_BUF];
  size_t up_len = 0, up_off = 0, down_len = 0, down_off = 0;
  for (;;) {
    short tcp_want = 0;
    bool moved = true;
    while (moved) {
      moved = false;
      tcp_want = 0;
      if (up_len == 0) { /* hiredis -> Redis */
        ssize_t n = recv(p->side, up, sizeof up, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) goto done;
        if (n > 0) up_len = (size_t)n, up_off = 0, moved = true;
      }
      if (up_len) {
        ERR_clear_error();
        int r = SSL_write(p->ssl, up + up_off, (int)(up_len - up_off));
        if (r > 0) {
          up_off += (size_t)r;
          if (up_off == up_len) up_len = 0;
          moved = true;
        } else if (!ssl_step(p, r, &tcp_want)) {
          goto done;
        }
      }
      if (down_len == 0) { /* Redis -> hiredis */
        ERR_clear_error();
        int r = SSL_read(p->ssl, down, (int)sizeof down);
        if (r > 0)
          down_len = (size_t)r, down_off = 0, moved = true;
        else if (!ssl_step(p, r, &tcp_want))
          goto done;
      }
      if (down_len) {
        ssize_t n =
            send(p->side, down + down_off, down_len - down_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) goto done;
        if (n > 0) {
          down_off += (size_t)n;
          if (down_off == down_len) down_len = 0;
          moved = true;
        }
      }
    }
    struct pollfd f[2] = {
        {.fd = p->side, .events = (short)((up_len ? 0 : POLLIN) | (down_len ? POLLOUT : 0))},
        {.fd = p->fd, .events = tcp_want}};
    int r = poll(f, 2, -1);
    if (r < 0 && errno != EINTR) goto done;
    if (r > 0 && (f[0].revents & (POLLHUP | POLLERR)) && !(f[0].revents & POLLIN))
      goto done; /* hiredis closed its end: nobody reads what comes */
  }
done:
  ERR_clear_error();
  SSL_shutdown(p->ssl); /* best effort: the socket is non-blocking */
  SSL_free(p->ssl);
  close(p->fd);
  close(p->side);
  ERR_clear_error();
  oi_redis_tls *t = p->t;
  oi__free(p);
  atomic_fetch_sub(&g_pumps, 1);
  pthread_mutex_lock(&t->lock);
  t->pumps--;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->lock);
  return NULL;
}

static bool is_ip(const char *host) {
  struct in6_addr a;
  return inet_pton(AF_INET, host, &a) == 1 || inet_pton(AF_INET6, host, &a) == 1;
}

redisContext *oi__redis_tls_connect(oi_redis_tls *t, const char *host, int port,
                                    uint32_t timeout_ms, bool *refused, char *err, size_t cap) {
  *refused = false;
  uint64_t deadline = oi__now_ns() + (uint64_t)timeout_ms * 1000000u;
  int fd = tcp_connect(host, port, deadline, err, cap);
  if (fd < 0) return NULL;
  SSL *s = SSL_new(t->ctx);
  int sp[2] = {-1, -1};
  pump *p = NULL;
  if (!s) {
    snprintf(err, cap, "TLS: out of memory");
    goto fail;
  }
  SSL_set_fd(s, fd);
  X509_VERIFY_PARAM *vp = SSL_get0_param(s);
  if (is_ip(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(vp, host);
  } else {
    SSL_set_tlsext_host_name(s, host);
    X509_VERIFY_PARAM_set1_host(vp, host, 0);
  }
  if (!handshake(s, fd, host, port, deadline, refused, err, cap)) goto fail;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0 ||
      fcntl(sp[1], F_SETFL, fcntl(sp[1], F_GETFL) | O_NONBLOCK) != 0) {
    snprintf(err, cap, "TLS: socketpair: %s", strerror(errno));
    goto fail;
  }
  p = oi__calloc(1, sizeof *p);
  redisContext *c = p ? redisConnectFd(sp[0]) : NULL;
  if (!c || c->err) {
    snprintf(err, cap, "TLS: out of memory");
    if (c)
      redisFree(c); /* closes sp[0] */
    else
      close(sp[0]);
    sp[0] = -1;
    goto fail;
  }
  *p = (pump){.t = t, .ssl = s, .fd = fd, .side = sp[1]};
  snprintf(p->peer, sizeof p->peer, "%.60s:%d", host, port);
  pthread_mutex_lock(&t->lock);
  t->pumps++;
  pthread_mutex_unlock(&t->lock);
  atomic_fetch_add(&g_pumps, 1);
  /* Every signal blocked in the pump (a write to a closed socket is EPIPE
   * there, never SIGPIPE in the process). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t th;
  int rc = pthread_create(&th, &attr, pump_main, p);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    atomic_fetch_sub(&g_pumps, 1);
    pthread_mutex_lock(&t->lock);
    t->pumps--;
    pthread_mutex_unlock(&t->lock);
    snprintf(err, cap, "TLS: cannot start its thread: %s", strerror(rc));
    redisFree(c);
    sp[0] = -1;
    goto fail;
  }
  return c;
fail:
  oi__free(p);
  if (s) SSL_free(s);
  if (sp[0] >= 0) close(sp[0]);
  if (sp[1] >= 0) close(sp[1]);
  close(fd);
  return NULL;
}
