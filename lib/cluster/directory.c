/* The cluster tier's block directory in Redis: see directory.h and
 * docs/cluster.md.
 *
 * Locks: `lock` guards the queue, the advertised address, the thread's
 * wake-up flags and last_error; `sync_lock` guards the synchronous
 * connection and its argument buffers. sync_lock may be held while taking
 * lock, never the reverse. The background connection `bg` and the script's
 * sha are the background thread's alone (and oi__dir_open's before it starts,
 * oi__dir_close's after it ended). Counters are relaxed atomics.
 *
 * hiredis writes with write(2): a peer that went away raises SIGPIPE. Every
 * round trip runs with SIGPIPE blocked in the calling thread, and a SIGPIPE
 * it raised is consumed before the mask is restored. */
#include "cluster/directory.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 2000u
#define PIPELINE 1024u /* commands appended before their replies are read */

/* KEYS[1]: the entry; ARGV[1]: the value it must still hold to be deleted. */
static const char CAS_DEL[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

enum { Q_PUBLISH = 1, Q_UNPUBLISH = 2 };

typedef struct qent {
  oi_dir_key key;
  uint8_t op;
} qent;

struct oi_dir {
  oi_dir_options o; /* url and node_id point at the copies below */
  char *url, *node_id;
  char host[256];
  int port;
  char unix_path[108];
  uint32_t db;
  char self_val[OI_DIR_NODE_ID_MAX + 24]; /* "<node_id> <epoch>" */
  char node_key[OI_DIR_NODE_ID_MAX + 16]; /* "oi:node:<node_id>" */

  pthread_mutex_t lock;
  pthread_cond_t cv;      /* wakes the thread (CLOCK_MONOTONIC) */
  pthread_cond_t done_cv; /* q_done advanced */
  qent *q, *q2;           /* q: producers append; q2: the thread's batch */
  size_t q_len, q_cap, q2_cap;
  uint64_t q_seq, q_done; /* entries given; entries sent, lost or dropped */
  char *advertise;
  bool advertise_dirty, check, stop;
  char last_error[OI_DIR_ERROR_TEXT];
  pthread_t thread;
  bool thread_ok;

  redisContext *bg;
  char sha[41];

  pthread_mutex_t sync_lock;
  redisContext *sync;
  uint64_t sync_gen; /* the generation `sync` was opened in */
  char *keybuf;
  size_t keybuf_cap;
  const char **argv;
  size_t *argvlen;
  size_t argv_cap, argvlen_cap;

  _Atomic bool connected;
  _Atomic uint64_t generation, reconnects, published, unpublished, unpublish_missed, stale_removed,
      lookups, lookup_keys, entries_found, parse_failures, queue_dropped, errors, lookup_ns_sum;
  oi_latency_hist lookup_hist;
};

#define ADD(field, v) atomic_fetch_add_explicit(&d->field, (v), memory_order_relaxed)

/* ---- formats ---- */

static bool node_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

static bool node_id_valid(const char *s, size_t len) {
  if (len == 0 || len > OI_DIR_NODE_ID_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if (!node_id_char(s[i])) return false;
  return true;
}

static bool addr_valid(const char *s, size_t len) {
  if (len == 0 || len > OI_DIR_ADDR_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) return false;
  return true;
}

/* Decimal digits of a uint64_t (no sign, no leading '+', no overflow). */
static bool parse_u64(const char *s, size_t len, uint64_t *out) {
  if (len == 0 || len > 20) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    uint64_t digit = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

void oi__dir_key_format(const oi_dir_key *key, char out[OI_DIR_KEY_CHARS + 1]) {
  static const char hex[] = "0123456789abcdef";
  char *p = out;
  memcpy(p, "oi:b:", 5);
  p += 5;
  for (int i = 15; i >= 0; i--)
    *p++ = hex[(key->ns_fp >> (4 * i)) & 15];
  *p++ = ':';
  for (int i = 0; i < 16; i++) {
    *p++ = hex[key->hash[i] >> 4];
    *p++ = hex[key->hash[i] & 15];
  }
  *p++ = ':';
  for (int i = 15; i >= 0; i--)
    *p++ = hex[(key->layout_fp >> (4 * i)) & 15];
  *p = '\0';
}

bool oi__dir_holder_parse(const char *s, size_t len, oi_dir_holder *out) {
  if (!s) return false;
  const char *sp = memchr(s, ' ', len);
  if (!sp) return false;
  size_t id_len = (size_t)(sp - s);
  if (!node_id_valid(s, id_len)) return false;
  uint64_t epoch;
  if (!parse_u64(sp + 1, len - id_len - 1, &epoch)) return false;
  memcpy(out->node_id, s, id_len);
  out->node_id[id_len] = '\0';
  out->epoch = epoch;
  return true;
}

bool oi__dir_liveness_parse(const char *s, size_t len, uint64_t *epoch, size_t *addr_off,
                            size_t *addr_len) {
  if (!s) return false;
  const char *sp = memchr(s, ' ', len);
  uint64_t e;
  size_t alen = sp ? len - (size_t)(sp - s) - 1 : 0;
  if (!sp || !parse_u64(s, (size_t)(sp - s), &e) || !addr_valid(sp + 1, alen)) return false;
  *epoch = e;
  *addr_off = (size_t)(sp - s) + 1;
  *addr_len = alen;
  return true;
}

/* "redis://HOST[:PORT][/DB]" or "unix:/PATH[?db=DB]" into d. */
static oi_status parse_url(oi_dir *d, const char *url) {
  static const char help[] = "expected redis://HOST[:PORT][/DB] or unix:/PATH[?db=DB]";
  const char *p;
  if (strncmp(url, "unix:", 5) == 0) {
    p = url + 5;
    const char *q = strchr(p, '?');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    if (len < 2 || p[0] != '/')
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the socket path must be absolute (%s)", url, help);
    if (len >= sizeof(d->unix_path))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the socket path is longer than %zu bytes", url,
                      sizeof(d->unix_path) - 1);
    memcpy(d->unix_path, p, len);
    d->unix_path[len] = '\0';
    if (q) {
      uint64_t db;
      if (strncmp(q, "?db=", 4) != 0 || !parse_u64(q + 4, strlen(q + 4), &db) || db > 1000000)
        return oi__fail(OI_ERR_INVALID_ARGUMENT,
                        "directory url '%s': '%s' is not ?db=N with N a database number (%s)", url,
                        q, help);
      d->db = (uint32_t)db;
    }
    return OI_OK;
  }
  if (strncmp(url, "redis://", 8) != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': unknown scheme (%s)", url, help);
  p = url + 8;
  if (strchr(p, '@'))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory url '%s': credentials in the url are not supported; protect "
                    "Redis by network (bind, firewall)",
                    url);
  const char *host = p, *host_end;
  if (*p == '[') {
    host = p + 1;
    host_end = strchr(host, ']');
    if (!host_end)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': '[' without ']' (%s)", url,
                      help);
    p = host_end + 1;
  } else {
    host_end = p + strcspn(p, ":/");
    p = host_end;
  }
  size_t host_len = (size_t)(host_end - host);
  if (host_len == 0 || host_len >= sizeof(d->host))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': %s host (%s)", url,
                    host_len ? "an overlong" : "no", help);
  for (size_t i = 0; i < host_len; i++)
    if (!node_id_char(host[i]) && host[i] != ':')
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the host has a character '%c' no host name or "
                      "address has (%s)",
                      url, host[i], help);
  memcpy(d->host, host, host_len);
  d->host[host_len] = '\0';
  d->port = 6379;
  if (*p == ':') {
    p++;
    size_t len = strcspn(p, "/");
    uint64_t port;
    if (!parse_u64(p, len, &port) || port == 0 || port > 65535)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the port is not a number in 1..65535 (%s)", url, help);
    d->port = (int)port;
    p += len;
  }
  if (*p == '/') {
    p++;
    uint64_t db = 0;
    if (*p && (!parse_u64(p, strlen(p), &db) || db > 1000000))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': '%s' is not a database number (%s)", url, p, help);
    d->db = (uint32_t)db;
  } else if (*p) {
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': unexpected '%s' (%s)", url, p,
                    help);
  }
  return OI_OK;
}

/* ---- errors, signals ---- */

static void note_error(oi_dir *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(oi_dir *d, const char *fmt, ...) {
  char buf[OI_DIR_ERROR_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ADD(errors, 1);
  pthread_mutex_lock(&d->lock);
  memcpy(d->last_error, buf, sizeof buf);
  pthread_mutex_unlock(&d->lock);
}

typedef struct sigpipe_guard {
  sigset_t old;
  bool pending_before;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
  sigpending(&pending);
  g->pending_before = sigismember(&pending, SIGPIPE) == 1;
}

static void sigpipe_restore(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigpending(&pending);
  if (!g->pending_before && sigismember(&pending, SIGPIPE) == 1) {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- connections ---- */

static struct timeval ms_tv(uint32_t ms) {
  struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* A connection with the timeouts set and the database selected; NULL with
 * the reason in err. SIGPIPE must be blocked. */
static redisContext *dir_connect(oi_dir *d, char *err, size_t cap) {
  struct timeval tv = ms_tv(d->o.timeout_ms);
  redisContext *c = d->unix_path[0] ? redisConnectUnixWithTimeout(d->unix_path, tv)
                                    : redisConnectWithTimeout(d->host, d->port, tv);
  if (!c) {
    snprintf(err, cap, "connect: out of memory");
    return NULL;
  }
  if (c->err) {
    snprintf(err, cap, "connect: %.90s", c->errstr);
    redisFree(c);
    return NULL;
  }
  if (redisSetTimeout(c, tv) != REDIS_OK) {
    snprintf(err, cap, "setting the socket timeout: %.80s", c->errstr);
    redisFree(c);
    return NULL;
  }
  if (d->db) {
    redisReply *r = redisCommand(c, "SELECT %u", d->db);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok)
      snprintf(err, cap, "SELECT %u: %.80s", d->db,
               r ? (r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply") : c->errstr);
    if (r) freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      return NULL;
    }
  }
  return c;
}

/* Connects the background connection and loads the compare-and-delete
 * script. SIGPIPE must be blocked. */
static bool bg_connect(oi_dir *d) {
  char err[128];
  redisContext *c = dir_connect(d, err, sizeof err);
  if (!c) {
    note_error(d, "%s", err);
    return false;
  }
  d->sha[0] = '\0';
  redisReply *r = redisCommand(c, "SCRIPT LOAD %s", CAS_DEL);
  if (r && r->type == REDIS_REPLY_STRING && r->len == 40) {
    memcpy(d->sha, r->str, 40);
    d->sha[40] = '\0';
  } else if (!r) {
    note_error(d, "SCRIPT LOAD: %s", c->errstr);
    redisFree(c);
    return false;
  } /* else: unpublish falls back to EVAL */
  if (r) freeReplyObject(r);
  d->bg = c;
  atomic_fetch_add(&d->generation, 1);
  atomic_store(&d->connected, true);
  return true;
}

/* ---- the background thread ---- */

static bool reply_ok(redisReply *r) {
  return r && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING);
}

static void append_cas_del(oi_dir *d, const char *key, const char *val) {
  if (d->sha[0])
    redisAppendCommand(d->bg, "EVALSHA %s 1 %s %s", d->sha, key, val);
  else
    redisAppendCommand(d->bg, "EVAL %s 1 %s %s", CAS_DEL, key, val);
}

static void count_cas_del(oi_dir *d, redisReply *r) {
  if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
    ADD(unpublished, 1);
  else if (r->type == REDIS_REPLY_INTEGER)
    ADD(unpublish_missed, 1);
  else
    note_error(d, "unpublish: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
}

/* Sends `n` queued entries in pipelined chunks. false when the connection
 * failed (what was not answered is counted as dropped). */
static bool bg_flush(oi_dir *d, const qent *batch, size_t n) {
  char pub_ttl[16];
  snprintf(pub_ttl, sizeof pub_ttl, "%u", d->o.block_ttl_ms);
  uint16_t retry[PIPELINE];
  for (size_t i = 0; i < n; i += PIPELINE) {
    size_t m = OI_MIN((size_t)PIPELINE, n - i);
    for (size_t j = 0; j < m; j++) {
      char key[OI_DIR_KEY_CHARS + 1];
      oi__dir_key_format(&batch[i + j].key, key);
      if (batch[i + j].op == Q_PUBLISH)
        redisAppendCommand(d->bg, "SET %s %s PX %s", key, d->self_val, pub_ttl);
      else
        append_cas_del(d, key, d->self_val);
    }
    size_t nretry = 0;
    for (size_t j = 0; j < m; j++) {
      void *v = NULL;
      if (redisGetReply(d->bg, &v) != REDIS_OK || !v) {
        note_error(d, "sending publishes: %s", d->bg->errstr[0] ? d->bg->errstr : "no reply");
        ADD(queue_dropped, n - i - j);
        return false;
      }
      redisReply *r = v;
      if (batch[i + j].op == Q_PUBLISH) {
        if (reply_ok(r))
          ADD(published, 1);
        else
          note_error(d, "publish: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
      } else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        retry[nretry++] = (uint16_t)j;
      } else {
        count_cas_del(d, r);
      }
      freeReplyObject(r);
    }
    if (nretry) { /* the script cache was flushed: send the script itself */
      d->sha[0] = '\0';
      for (size_t k = 0; k < nretry; k++) {
        char key[OI_DIR_KEY_CHARS + 1];
        oi__dir_key_format(&batch[i + retry[k]].key, key);
        append_cas_del(d, key, d->self_val);
      }
      for (size_t k = 0; k < nretry; k++) {
        void *v = NULL;
        if (redisGetReply(d->bg, &v) != REDIS_OK || !v) {
          note_error(d, "sending unpublishes: %s", d->bg->errstr[0] ? d->bg->errstr : "no reply");
          ADD(queue_dropped, n - i - m + nretry - k);
          return false;
        }
        count_cas_del(d, v);
        freeReplyObject(v);
      }
    }
  }
  return true;
}

/* Refreshes the liveness key (or PINGs when nothing is advertised). */
static bool bg_beat(oi_dir *d, const char *adv) {
  redisReply *r;
  if (adv) {
    char val[OI_DIR_ADDR_MAX + 24]; /* one argument: hiredis splits a format at spaces */
    snprintf(val, sizeof val, "%" PRIu64 " %s", d->o.epoch, adv);
    r = redisCommand(d->bg, "SET %s %s PX %u", d->node_key, val, d->o.node_ttl_ms);
  } else {
    r = redisCommand(d->bg, "PING");
  }
  if (!r) {
    note_error(d, "%s: %s", adv ? "refreshing the node key" : "PING", d->bg->errstr);
    return false;
  }
  bool ok = reply_ok(r);
  if (!ok)
    note_error(d, "%s: %s", adv ? "refreshing the node key" : "PING",
               r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
  freeReplyObject(r);
  return true; /* an error reply is Redis answering: the connection is fine */
}

static void timed_wait(oi_dir *d, uint64_t deadline_ns) {
  struct timespec ts = oi__timespec(deadline_ns);
  pthread_cond_timedwait(&d->cv, &d->lock, &ts);
}

static void *dir_thread(void *arg) {
  oi_dir *d = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  struct timespec zero = {0, 0};

  uint32_t backoff = BACKOFF_MIN_MS;
  uint64_t interval_ns = (uint64_t)OI_MAX(d->o.node_ttl_ms / 3u, 1u) * 1000000u;
  uint64_t next_beat = 0;
  pthread_mutex_lock(&d->lock);
  while (!d->stop) {
    if (!d->bg) {
      pthread_mutex_unlock(&d->lock);
      bool ok = bg_connect(d);
      while (sigtimedwait(&set, NULL, &zero) > 0) {
      }
      if (ok) {
        ADD(reconnects, 1);
        OI_LOG(OI_LOG_INFO, "cluster", "directory %s: connected (generation %" PRIu64 ")", d->url,
               atomic_load(&d->generation));
        if (d->o.on_reconnect) d->o.on_reconnect(d->o.on_reconnect_ctx);
      }
      pthread_mutex_lock(&d->lock);
      if (ok) {
        backoff = BACKOFF_MIN_MS;
        next_beat = 0;
      } else if (!d->stop) {
        timed_wait(d, oi__now_ns() + (uint64_t)backoff * 1000000u);
        backoff = OI_MIN(backoff * 2, BACKOFF_MAX_MS);
      }
      continue;
    }
    uint64_t now = oi__now_ns();
    bool beat = now >= next_beat || d->advertise_dirty || d->check;
    if (d->q_len == 0 && !beat) {
      timed_wait(d, next_beat);
      continue;
    }
    qent *batch = d->q;
    size_t n = d->q_len, batch_cap = d->q_cap;
    d->q = d->q2;
    d->q_cap = d->q2_cap;
    d->q_len = 0;
    d->q2 = NULL;
    d->q2_cap = 0;
    char *adv = d->advertise ? oi__strdup(d->advertise) : NULL;
    d->advertise_dirty = false;
    d->check = false;
    pthread_mutex_unlock(&d->lock);

    bool ok = n ? bg_flush(d, batch, n) : true;
    if (ok && beat) {
      ok = bg_beat(d, adv);
      next_beat = oi__now_ns() + interval_ns;
    }
    if (ok)
      atomic_store(&d->connected, true);
    else {
      atomic_store(&d->connected, false);
      redisFree(d->bg);
      d->bg = NULL;
      OI_LOG(OI_LOG_WARN, "cluster",
             "directory %s: connection lost (%s); degraded (local only), reconnecting", d->url,
             d->last_error);
    }
    while (sigtimedwait(&set, NULL, &zero) > 0) {
    }
    oi__free(adv);

    pthread_mutex_lock(&d->lock);
    d->q2 = batch;
    d->q2_cap = batch_cap;
    d->q_done += n;
    pthread_cond_broadcast(&d->done_cv);
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

/* ---- open, close ---- */

void oi__dir_options_init(oi_dir_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
}

oi_status oi__dir_open(const oi_dir_options *opts, oi_dir **out) {
  if (!opts || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_open: opts and out must not be NULL");
  *out = NULL;
  if (!opts->url || !opts->url[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: no url (redis://HOST[:PORT][/DB] or unix:/PATH)");
  if (!opts->node_id || !node_id_valid(opts->node_id, strlen(opts->node_id)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: node id '%s' is not 1 to %u characters of A-Z a-z 0-9 . _ -",
                    opts->node_id ? opts->node_id : "(null)", OI_DIR_NODE_ID_MAX);
  oi_dir *d = oi__calloc(1, sizeof *d);
  if (!d) return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  d->o = *opts;
  if (!d->o.block_ttl_ms) d->o.block_ttl_ms = OI_DIR_BLOCK_TTL_MS;
  if (!d->o.node_ttl_ms) d->o.node_ttl_ms = OI_DIR_NODE_TTL_MS;
  if (!d->o.timeout_ms) d->o.timeout_ms = OI_DIR_TIMEOUT_MS;
  oi_status st = parse_url(d, opts->url);
  if (st != OI_OK) {
    oi__free(d);
    return st;
  }
  d->url = oi__strdup(opts->url);
  d->node_id = oi__strdup(opts->node_id);
  if (!d->url || !d->node_id) {
    oi__free(d->url);
    oi__free(d->node_id);
    oi__free(d);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  }
  d->o.url = d->url;
  d->o.node_id = d->node_id;
  snprintf(d->self_val, sizeof d->self_val, "%s %" PRIu64, d->node_id, d->o.epoch);
  snprintf(d->node_key, sizeof d->node_key, "oi:node:%s", d->node_id);

  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&d->lock, NULL);
  pthread_mutex_init(&d->sync_lock, NULL);
  pthread_cond_init(&d->cv, &ca);
  pthread_cond_init(&d->done_cv, &ca);
  pthread_condattr_destroy(&ca);

  sigpipe_guard g;
  sigpipe_block(&g);
  bool ok = bg_connect(d);
  sigpipe_restore(&g);
  if (ok)
    OI_LOG(OI_LOG_INFO, "cluster", "directory %s: connected as node '%s' epoch %" PRIu64, d->url,
           d->node_id, d->o.epoch);
  else
    OI_LOG(OI_LOG_WARN, "cluster",
           "directory %s unreachable at open (%s); degraded (local only), reconnecting in the "
           "background",
           d->url, d->last_error);

  if (pthread_create(&d->thread, NULL, dir_thread, d) != 0) {
    oi__dir_close(d);
    return oi__fail(OI_ERR_INTERNAL, "directory: cannot start its thread");
  }
  d->thread_ok = true;
  pthread_setname_np(d->thread, "oi-directory");
  *out = d;
  return OI_OK;
}

void oi__dir_close(oi_dir *d) {
  if (!d) return;
  if (d->thread_ok) {
    pthread_mutex_lock(&d->lock);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->lock);
    pthread_join(d->thread, NULL);
  }
  sigpipe_guard g;
  sigpipe_block(&g);
  if (d->bg && d->advertise) { /* a clean leave: the node is gone now, not after its TTL */
    char val[OI_DIR_ADDR_MAX + 24];
    snprintf(val, sizeof val, "%" PRIu64 " %s", d->o.epoch, d->advertise);
    redisReply *r = redisCommand(d->bg, "EVAL %s 1 %s %s", CAS_DEL, d->node_key, val);
    if (r) freeReplyObject(r);
  }
  if (d->bg) redisFree(d->bg);
  if (d->sync) redisFree(d->sync);
  sigpipe_restore(&g);
  pthread_cond_destroy(&d->cv);
  pthread_cond_destroy(&d->done_cv);
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->sync_lock);
  oi__free(d->q);
  oi__free(d->q2);
  oi__free(d->advertise);
  oi__free(d->keybuf);
  oi__free(d->argv);
  oi__free(d->argvlen);
  oi__free(d->url);
  oi__free(d->node_id);
  oi__free(d);
}

/* ---- publishing ---- */

oi_status oi__dir_set_advertise(oi_dir *d, const char *addr) {
  if (!d) return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_set_advertise: d must not be NULL");
  char *copy = NULL;
  if (addr) {
    if (!addr_valid(addr, strnlen(addr, OI_DIR_ADDR_MAX + 1)))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory: advertised address '%.64s' is not 1 to %u printable characters "
                      "without spaces",
                      addr, OI_DIR_ADDR_MAX);
    copy = oi__strdup(addr);
    if (!copy) return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  }
  pthread_mutex_lock(&d->lock);
  oi__free(d->advertise);
  d->advertise = copy;
  d->advertise_dirty = copy != NULL;
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->lock);
  return OI_OK;
}

static oi_status enqueue(oi_dir *d, const oi_dir_key *keys, size_t n, uint8_t op,
                         const char *what) {
  if (!d || (!keys && n))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: d and keys must not be NULL", what);
  if (n == 0) return OI_OK;
  pthread_mutex_lock(&d->lock);
  size_t room = OI_DIR_QUEUE_MAX - OI_MIN(d->q_len, (size_t)OI_DIR_QUEUE_MAX);
  size_t take = OI_MIN(n, room);
  if (take && !oi__grow((void **)&d->q, &d->q_cap, d->q_len + take, sizeof(qent), OI_DIR_QUEUE_MAX))
    take = 0;
  for (size_t i = 0; i < take; i++) {
    d->q[d->q_len + i].key = keys[i];
    d->q[d->q_len + i].op = op;
  }
  d->q_len += take;
  d->q_seq += n;
  d->q_done += n - take; /* a flush does not wait for what was dropped */
  if (take) pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->lock);
  if (take < n) {
    ADD(queue_dropped, n - take);
    OI_LOG(OI_LOG_DEBUG, "cluster", "directory: queue full, %zu entries dropped", n - take);
  }
  return OI_OK;
}

oi_status oi__dir_publish(oi_dir *d, const oi_dir_key *keys, size_t n) {
  return enqueue(d, keys, n, Q_PUBLISH, "oi__dir_publish");
}

oi_status oi__dir_unpublish(oi_dir *d, const oi_dir_key *keys, size_t n) {
  return enqueue(d, keys, n, Q_UNPUBLISH, "oi__dir_unpublish");
}

oi_status oi__dir_flush(oi_dir *d, uint32_t timeout_ms) {
  if (!d) return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_flush: d must not be NULL");
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  oi_status st = OI_OK;
  pthread_mutex_lock(&d->lock);
  uint64_t target = d->q_seq;
  while (d->q_done < target) {
    if (!atomic_load(&d->connected)) {
      st = oi__fail(OI_ERR_CLOSED, "directory %s is unreachable (degraded); nothing was flushed",
                    d->url);
      break;
    }
    if (oi__now_ns() >= deadline) {
      st = oi__fail(OI_ERR_TIMEOUT, "directory %s: the queue was not sent within %u ms", d->url,
                    timeout_ms);
      break;
    }
    struct timespec ts = oi__timespec(OI_MIN(deadline, oi__now_ns() + 50000000u));
    pthread_cond_timedwait(&d->done_cv, &d->lock, &ts);
  }
  pthread_mutex_unlock(&d->lock);
  if (st == OI_OK && !atomic_load(&d->connected))
    st = oi__fail(OI_ERR_CLOSED, "directory %s is unreachable (degraded)", d->url);
  return st;
}

/* ---- synchronous calls ---- */

/* Makes the synchronous connection ready (sync_lock held). */
static oi_status sync_ready(oi_dir *d, const char *what) {
  uint64_t gen = atomic_load(&d->generation);
  if (!atomic_load(&d->connected)) {
    if (d->sync) {
      redisFree(d->sync);
      d->sync = NULL;
    }
    return oi__fail(OI_ERR_CLOSED,
                    "%s: directory %s is unreachable (degraded: local only); it reconnects in "
                    "the background",
                    what, d->url);
  }
  if (d->sync && d->sync_gen != gen) { /* Redis was lost since: start afresh */
    redisFree(d->sync);
    d->sync = NULL;
  }
  if (!d->sync) {
    char err[128];
    d->sync = dir_connect(d, err, sizeof err);
    if (!d->sync) {
      note_error(d, "%s", err);
      atomic_store(&d->connected, false);
      pthread_mutex_lock(&d->lock);
      d->check = true;
      pthread_cond_signal(&d->cv);
      pthread_mutex_unlock(&d->lock);
      return oi__fail(OI_ERR_CLOSED, "%s: directory %s: %s", what, d->url, err);
    }
    d->sync_gen = gen;
  }
  return OI_OK;
}

/* The synchronous connection failed (sync_lock held): drop it, degrade and
 * have the background thread check its own. */
static oi_status sync_lost(oi_dir *d, const char *what) {
  char err[128];
  snprintf(err, sizeof err, "%s", d->sync->errstr[0] ? d->sync->errstr : "no reply");
  redisFree(d->sync);
  d->sync = NULL;
  note_error(d, "%s: %s", what, err);
  atomic_store(&d->connected, false);
  pthread_mutex_lock(&d->lock);
  d->check = true;
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->lock);
  OI_LOG(OI_LOG_WARN, "cluster", "directory %s: %s failed (%s); degraded (local only)", d->url,
         what, err);
  return oi__fail(OI_ERR_CLOSED, "%s: directory %s: %s; degraded (local only)", what, d->url, err);
}

oi_status oi__dir_lookup(oi_dir *d, const oi_dir_key *keys, size_t n, oi_dir_holder *out,
                         size_t *n_out) {
  if (n_out) *n_out = 0;
  if (!d || !keys || !out || !n_out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_lookup: d, keys, out and n_out must not "
                                             "be NULL");
  if (n == 0 || n > OI_DIR_LOOKUP_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_lookup: %zu keys; one lookup asks for 1 to %u (split the prefix)", n,
                    OI_DIR_LOOKUP_MAX);
  if (!atomic_load(&d->connected)) /* fast path: no lock, no wait */
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_lookup: directory %s is unreachable (degraded: local only)", d->url);
  pthread_mutex_lock(&d->sync_lock);
  oi_status st = sync_ready(d, "oi__dir_lookup");
  if (st != OI_OK) goto out;
  if (!oi__grow((void **)&d->keybuf, &d->keybuf_cap, n * (OI_DIR_KEY_CHARS + 1), 1,
                (size_t)OI_DIR_LOOKUP_MAX * (OI_DIR_KEY_CHARS + 1)) ||
      !oi__grow((void **)&d->argv, &d->argv_cap, n + 1, sizeof(char *), OI_DIR_LOOKUP_MAX + 1) ||
      !oi__grow((void **)&d->argvlen, &d->argvlen_cap, n + 1, sizeof(size_t),
                OI_DIR_LOOKUP_MAX + 1)) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "oi__dir_lookup: out of memory for %zu keys", n);
    goto out;
  }
  d->argv[0] = "MGET";
  d->argvlen[0] = 4;
  for (size_t i = 0; i < n; i++) {
    char *k = d->keybuf + i * (OI_DIR_KEY_CHARS + 1);
    oi__dir_key_format(&keys[i], k);
    d->argv[i + 1] = k;
    d->argvlen[i + 1] = OI_DIR_KEY_CHARS;
  }
  uint64_t t0 = oi__now_ns();
  sigpipe_guard g;
  sigpipe_block(&g);
  redisReply *r = redisCommandArgv(d->sync, (int)(n + 1), d->argv, d->argvlen);
  sigpipe_restore(&g);
  if (!r) {
    st = sync_lost(d, "MGET");
    goto out;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
    note_error(d, "MGET: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_lookup: directory %s answered MGET with %s", d->url,
                  r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
    freeReplyObject(r);
    goto out;
  }
  size_t found = 0;
  for (; found < n; found++) {
    redisReply *e = r->element[found];
    if (e->type != REDIS_REPLY_STRING) break;
    if (!oi__dir_holder_parse(e->str, e->len, &out[found])) {
      ADD(parse_failures, 1);
      break;
    }
  }
  freeReplyObject(r);
  uint64_t dt = oi__now_ns() - t0;
  *n_out = found;
  ADD(lookups, 1);
  ADD(lookup_keys, n);
  ADD(entries_found, found);
  ADD(lookup_ns_sum, dt);
  oi__hist_record(&d->lookup_hist, dt);
out:
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

oi_status oi__dir_node_lookup(oi_dir *d, const char *node_id, char *addr, size_t cap,
                              uint64_t *epoch) {
  if (!d || !node_id || !addr)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_node_lookup: d, node_id and addr must not be NULL");
  if (!node_id_valid(node_id, strnlen(node_id, OI_DIR_NODE_ID_MAX + 1)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_node_lookup: node id '%.64s' is not 1 to %u characters of A-Z a-z "
                    "0-9 . _ -",
                    node_id, OI_DIR_NODE_ID_MAX);
  if (cap == 0) return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_node_lookup: cap is 0");
  addr[0] = '\0';
  if (!atomic_load(&d->connected))
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_node_lookup: directory %s is unreachable (degraded: local only)",
                    d->url);
  pthread_mutex_lock(&d->sync_lock);
  oi_status st = sync_ready(d, "oi__dir_node_lookup");
  if (st != OI_OK) goto out;
  sigpipe_guard g;
  sigpipe_block(&g);
  redisReply *r = redisCommand(d->sync, "GET oi:node:%s", node_id);
  sigpipe_restore(&g);
  if (!r) {
    st = sync_lost(d, "GET");
    goto out;
  }
  if (r->type == REDIS_REPLY_NIL) {
    st = oi__fail(OI_ERR_NOT_FOUND, "node '%s' is not live in directory %s (no liveness key)",
                  node_id, d->url);
  } else if (r->type != REDIS_REPLY_STRING) {
    st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_node_lookup: directory %s answered GET with %s", d->url,
                  r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
  } else {
    uint64_t e = 0;
    size_t aoff = 0, alen = 0;
    if (!oi__dir_liveness_parse(r->str, r->len, &e, &aoff, &alen)) {
      ADD(parse_failures, 1);
      st = oi__fail(OI_ERR_PROTOCOL,
                    "node '%s' in directory %s: the liveness value is not '<epoch> <address>'",
                    node_id, d->url);
    } else if (alen + 1 > cap) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_node_lookup: node '%s' has a %zu-byte address; addr holds %zu "
                    "(give it %u)",
                    node_id, alen, cap, OI_DIR_ADDR_MAX + 1);
    } else {
      memcpy(addr, r->str + aoff, alen);
      addr[alen] = '\0';
      if (epoch) *epoch = e;
    }
  }
  freeReplyObject(r);
out:
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

oi_status oi__dir_remove_stale(oi_dir *d, const oi_dir_key *key, const oi_dir_holder *h) {
  if (!d || !key || !h)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_remove_stale: d, key and h must not be NULL");
  if (!node_id_valid(h->node_id, strnlen(h->node_id, sizeof h->node_id)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_remove_stale: the holder's node id is not 1 to %u characters of A-Z "
                    "a-z 0-9 . _ -",
                    OI_DIR_NODE_ID_MAX);
  if (!atomic_load(&d->connected))
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_remove_stale: directory %s is unreachable (degraded: local only)",
                    d->url);
  char k[OI_DIR_KEY_CHARS + 1], val[OI_DIR_NODE_ID_MAX + 24];
  oi__dir_key_format(key, k);
  snprintf(val, sizeof val, "%s %" PRIu64, h->node_id, h->epoch);
  pthread_mutex_lock(&d->sync_lock);
  oi_status st = sync_ready(d, "oi__dir_remove_stale");
  if (st != OI_OK) goto out;
  sigpipe_guard g;
  sigpipe_block(&g);
  redisReply *r = redisCommand(d->sync, "EVAL %s 1 %s %s", CAS_DEL, k, val);
  sigpipe_restore(&g);
  if (!r) {
    st = sync_lost(d, "EVAL");
    goto out;
  }
  if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
    ADD(stale_removed, 1);
  } else if (r->type == REDIS_REPLY_INTEGER) {
    st = oi__fail(OI_ERR_NOT_FOUND, "oi__dir_remove_stale: %s does not name %s (any more)", k, val);
  } else {
    note_error(d, "remove stale: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_remove_stale: directory %s answered EVAL with %s",
                  d->url, r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
  }
  freeReplyObject(r);
out:
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

/* ---- observing ---- */

uint64_t oi__dir_generation(oi_dir *d) { return d ? atomic_load(&d->generation) : 0; }

void oi__dir_stats(oi_dir *d, oi_dir_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!d) return;
#define GET(field) atomic_load_explicit(&d->field, memory_order_relaxed)
  out->connected = atomic_load(&d->connected);
  out->generation = GET(generation);
  out->reconnects = GET(reconnects);
  out->published = GET(published);
  out->unpublished = GET(unpublished);
  out->unpublish_missed = GET(unpublish_missed);
  out->stale_removed = GET(stale_removed);
  out->lookups = GET(lookups);
  out->lookup_keys = GET(lookup_keys);
  out->entries_found = GET(entries_found);
  out->parse_failures = GET(parse_failures);
  out->queue_dropped = GET(queue_dropped);
  out->errors = GET(errors);
  out->lookup_ns_sum = GET(lookup_ns_sum);
#undef GET
  uint64_t sum_us;
  oi__hist_read(&d->lookup_hist, out->lookup_latency_us, &sum_us);
  pthread_mutex_lock(&d->lock);
  out->queue_depth = d->q_len;
  memcpy(out->last_error, d->last_error, sizeof out->last_error);
  pthread_mutex_unlock(&d->lock);
}
