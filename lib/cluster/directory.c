/* The cluster tier's block directory in Redis: see directory.h and
 * docs/cluster.md; its files, sides and locks: directory_internal.h. This
 * file: open, close, publishing, the synchronous calls and the stats. */
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

#include "cluster/directory_internal.h"

/* ---- open, close ---- */

static void free_auth(oi_dir *d) {
  if (d->password) memset(d->password, 0, strlen(d->password));
  oi__free(d->password);
  oi__free(d->user);
  d->password = d->user = NULL;
}

void oi__dir_options_init(oi_dir_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
}

oi_status oi__dir_check(const oi_dir_options *o) {
  const char *url = o->url, *node_id = o->node_id;
  if (!url || !url[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: no url (redis://HOST[:PORT][/DB] or unix:/PATH)");
  if (!node_id || !oi__dir_node_id_valid(node_id, strlen(node_id)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: node id '%s' is not 1 to %u characters of A-Z a-z 0-9 . _ -",
                    node_id ? node_id : "(null)", OI_DIR_NODE_ID_MAX);
  oi_dir *d = oi__calloc(1, sizeof *d);
  if (!d) return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  oi_status st = oi__dir_parse_url(d, url);
  if (st == OI_OK) st = oi__dir_tls_open(d, o);
  oi__redis_tls_destroy(d->tls_ctx);
  oi__free(d);
  return st;
}

/* The TLS context of a rediss url (its files loaded and checked); files
 * given for a url without TLS are refused, not ignored. */
oi_status oi__dir_tls_open(oi_dir *d, const oi_dir_options *opts) {
  bool files = opts->tls_ca_file || opts->tls_cert_file || opts->tls_key_file;
  if (!d->tls && files)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory url %s: TLS files were given but the url asks for no TLS (give "
                    "rediss://... or rediss+cluster://...)",
                    opts->url);
  if (d->tls && d->unix_path[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory url %s: TLS over a Unix socket is not "
                    "supported",
                    opts->url);
  return d->tls ? oi__redis_tls_create(opts->tls_ca_file, opts->tls_cert_file, opts->tls_key_file,
                                       &d->tls_ctx)
                : OI_OK;
}

oi_status oi__dir_open(const oi_dir_options *opts, oi_dir **out) {
  if (!opts || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_open: opts and out must not be NULL");
  *out = NULL;
  if (!opts->url || !opts->url[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: no url (redis://HOST[:PORT][/DB] or unix:/PATH)");
  if (!opts->node_id || !oi__dir_node_id_valid(opts->node_id, strlen(opts->node_id)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: node id '%s' is not 1 to %u characters of A-Z a-z 0-9 . _ -",
                    opts->node_id ? opts->node_id : "(null)", OI_DIR_NODE_ID_MAX);
  if (!opts->secret || opts->secret_len < OI_DIR_SECRET_MIN || opts->secret_len > OI_DIR_SECRET_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: the cluster secret must be %u to %u bytes (every entry carries "
                    "a MAC under it)",
                    OI_DIR_SECRET_MIN, OI_DIR_SECRET_MAX);
  char prefix[OI_DIR_PREFIX_MAX + 1];
  if (!oi__dir_prefix(opts->cluster_name, prefix))
    return oi__fail(
        OI_ERR_INVALID_ARGUMENT,
        "directory: cluster name '%.40s' is not 1 to %u characters of A-Z a-z 0-9 . _ -",
        opts->cluster_name, OI_DIR_NAME_MAX);
  bool auth = opts->password && opts->password[0];
  if ((auth && strlen(opts->password) > OI_DIR_PASSWORD_MAX) ||
      (opts->user && strlen(opts->user) > OI_DIR_USER_MAX))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: the Redis user or password is longer than %u or %u bytes",
                    OI_DIR_USER_MAX, OI_DIR_PASSWORD_MAX);
  if (!auth && opts->user && opts->user[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory: a Redis user '%.40s' without a password",
                    opts->user);
  oi_dir *d = oi__calloc(1, sizeof *d);
  if (!d) return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  d->o = *opts;
  d->o.secret = NULL; /* only the keyed state is kept */
  d->o.user = d->o.password = d->o.cluster_name = NULL;
  d->o.tls_ca_file = d->o.tls_cert_file = d->o.tls_key_file = NULL; /* loaded at open */
  memcpy(d->prefix, prefix, sizeof prefix);
  oi__hmac_sha256_init(&d->mac0, opts->secret, opts->secret_len);
  if (!d->o.block_ttl_ms) d->o.block_ttl_ms = OI_DIR_BLOCK_TTL_MS;
  if (!d->o.node_ttl_ms) d->o.node_ttl_ms = OI_DIR_NODE_TTL_MS;
  if (!d->o.timeout_ms) d->o.timeout_ms = OI_DIR_TIMEOUT_MS;
  oi_status st = oi__dir_parse_url(d, opts->url);
  if (st == OI_OK) st = oi__dir_tls_open(d, opts);
  if (st != OI_OK) {
    oi__free(d);
    return st;
  }
  d->url = oi__strdup(opts->url);
  d->node_id = oi__strdup(opts->node_id);
  if (auth) {
    d->password = oi__strdup(opts->password);
    d->user = opts->user && opts->user[0] ? oi__strdup(opts->user) : NULL;
  }
  if (!d->url || !d->node_id ||
      (auth && (!d->password || (opts->user && opts->user[0] && !d->user)))) {
    free_auth(d);
    oi__redis_tls_destroy(d->tls_ctx);
    oi__free(d->url);
    oi__free(d->node_id);
    oi__free(d);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  }
  d->o.url = d->url;
  d->o.node_id = d->node_id;
  snprintf(d->self_val, sizeof d->self_val, "%s %" PRIu64 " ", d->node_id, d->o.epoch);
  snprintf(d->node_key, sizeof d->node_key, "%snode:%s", d->prefix, d->node_id);
  snprintf(d->dropped_key, sizeof d->dropped_key, "%sdropped:%s", d->prefix, d->node_id);

  pthread_mutex_init(&d->lock, NULL);
  pthread_mutex_init(&d->sync_lock, NULL);
  oi__cond_init_monotonic(&d->cv);
  oi__cond_init_monotonic(&d->done_cv);

  sigpipe_guard g;
  oi__dir_sigpipe_block(&g);
  bool ok = oi__dir_bg_connect(d);
  oi__dir_sigpipe_restore(&g);
  if (!ok && atomic_load(&d->auth_refused)) { /* not a Redis down: the operator's to fix */
    char e[OI_DIR_ERROR_TEXT];
    memcpy(e, d->last_error, sizeof e);
    bool d_tls = d->tls;
    oi__dir_close(d);
    return oi__fail(OI_ERR_PERMISSION, "directory %s: %s (%s)", opts->url, e,
                    d_tls ? "TLS: the CA, certificate and key files; AUTH: the Redis auth file, "
                            "or OI_REDIS_USER and OI_REDIS_PASSWORD"
                          : "the user and password come from the Redis auth file, or "
                            "OI_REDIS_USER and OI_REDIS_PASSWORD");
  }
  if (ok)
    OI_LOG(OI_LOG_INFO, "cluster",
           "directory %s: connected as node '%s' epoch %" PRIu64 " (keys %s*%s%s)", d->url,
           d->node_id, d->o.epoch, d->prefix, d->password ? ", AUTH" : "", d->tls ? ", TLS" : "");
  else
    OI_LOG(OI_LOG_WARN, "cluster",
           "directory %s unreachable at open (%s); degraded (local only), reconnecting in the "
           "background",
           d->url, d->last_error);

  if (pthread_create(&d->thread, NULL, oi__dir_thread_main, d) != 0) {
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
  oi__dir_sigpipe_block(&g);
  if (d->bs.up && d->advertise) { /* a clean leave: the node is gone now, not after its TTL */
    char val[OI_DIR_ADDR_MAX + 24], err[128]; /* our record starts so */
    snprintf(val, sizeof val, "%" PRIu64 " %s ", d->o.epoch, d->advertise);
    one_ctx o = {.pre = oi__dir_cas_del, .key = d->node_key, .cmd = "EVAL %s 1 %s %s", .arg = val};
    if (oi__dir_side_one(d, &d->bs, &o, err, sizeof err) == XR_OK && o.r) freeReplyObject(o.r);
  }
  oi__dir_side_free(&d->bs);
  oi__dir_side_free(&d->ss);
  oi__dir_sigpipe_restore(&g);
  oi__redis_tls_destroy(d->tls_ctx); /* after its connections */
  pthread_cond_destroy(&d->cv);
  pthread_cond_destroy(&d->done_cv);
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->sync_lock);
  oi__free(d->q);
  oi__free(d->q2);
  oi__free(d->advertise);
  oi__free(d->keybuf);
  oi__free(d->seen);
  oi__free(d->argv);
  oi__free(d->argvlen);
  oi__free(d->found);
  oi__free(d->url);
  oi__free(d->node_id);
  free_auth(d);
  memset(&d->mac0, 0, sizeof d->mac0);
  oi__free(d);
}

/* ---- publishing ---- */

oi_status oi__dir_set_advertise(oi_dir *d, const char *addr) {
  if (!d) return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_set_advertise: d must not be NULL");
  char *copy = NULL;
  if (addr) {
    if (!oi__dir_addr_valid(addr, strnlen(addr, OI_DIR_ADDR_MAX + 1)))
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

static oi_status enqueue(oi_dir *d, const oi_tier_key *keys, size_t n, uint8_t op,
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

oi_status oi__dir_publish(oi_dir *d, const oi_tier_key *keys, size_t n) {
  return enqueue(d, keys, n, Q_PUBLISH, "oi__dir_publish");
}

oi_status oi__dir_unpublish(oi_dir *d, const oi_tier_key *keys, size_t n) {
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

/* The directory is degraded: have the background thread check its own
 * connections (lock not held). */
static void degrade(oi_dir *d) {
  atomic_store(&d->connected, false);
  pthread_mutex_lock(&d->lock);
  d->check = true;
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->lock);
}

/* Makes the synchronous side ready (sync_lock held). SIGPIPE must be
 * blocked. */
static oi_status sync_ready(oi_dir *d, const char *what) {
  uint64_t gen = atomic_load(&d->generation);
  if (!atomic_load(&d->connected)) {
    oi__dir_side_drop(&d->ss);
    return oi__fail(OI_ERR_CLOSED,
                    "%s: directory %s is unreachable (degraded: local only); it reconnects in "
                    "the background",
                    what, d->url);
  }
  if (d->ss.up && d->sync_gen != gen)
    oi__dir_side_drop(&d->ss); /* Redis was lost since: start afresh */
  if (!d->ss.up) {
    char err[128];
    if (!oi__dir_side_open(d, &d->ss, false, err, sizeof err)) {
      oi__dir_note_error(d, "%s", err);
      degrade(d);
      return oi__fail(OI_ERR_CLOSED, "%s: directory %s: %s", what, d->url, err);
    }
    d->sync_gen = gen;
  }
  return OI_OK;
}

/* A synchronous round failed (sync_lock held): drop the side, degrade and
 * have the background thread check its own. */
static oi_status sync_lost(oi_dir *d, const char *what, const char *err) {
  oi__dir_side_drop(&d->ss);
  oi__dir_note_error(d, "%s: %s", what, err);
  degrade(d);
  OI_LOG(OI_LOG_WARN, "cluster", "directory %s: %s failed (%s); degraded (local only)", d->url,
         what, err);
  return oi__fail(OI_ERR_CLOSED, "%s: directory %s: %s; degraded (local only)", what, d->url, err);
}

typedef struct look_ctx {
  oi_dir_holder *out;
  char err[96]; /* the first error reply */
} look_ctx;

#define KEY_STRIDE (OI_DIR_KEY_MAX + 1)

static const char *look_key(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_MAX + 24]) {
  (void)ctx, (void)buf;
  return d->keybuf + i * KEY_STRIDE;
}

static void look_append(oi_dir *d, void *ctx, size_t i, redisContext *c) {
  (void)ctx;
  const char *argv[2] = {"GET", d->keybuf + i * KEY_STRIDE};
  size_t len[2] = {3, strlen(argv[1])};
  redisAppendCommandArgv(c, 2, argv, len);
}

enum { F_ABSENT, F_FOUND, F_BAD, F_ERROR };

static int look_reply(oi_dir *d, void *ctx, size_t i, redisReply *r) {
  look_ctx *l = ctx;
  uint8_t f = F_ABSENT;
  if (r && oi__dir_is_err(r, "WRONGTYPE")) {
    f = F_ABSENT; /* a key of another type: absent, as MGET answers */
  } else if (!r || r->type == REDIS_REPLY_ERROR) {
    f = F_ERROR;
    if (!l->err[0]) snprintf(l->err, sizeof l->err, "%s", r ? r->str : "redirected too often");
  } else if (r->type == REDIS_REPLY_STRING) {
    const char *k = d->keybuf + i * KEY_STRIDE;
    f = oi__dir_entry_check(d, k, strlen(k), r->str, r->len, &l->out[i]) ? F_FOUND : F_BAD;
  }
  d->found[i] = f;
  return R_DONE;
}

oi_status oi__dir_lookup(oi_dir *d, const oi_tier_key *keys, size_t n, oi_dir_holder *out,
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
  sigpipe_guard g;
  oi__dir_sigpipe_block(&g);
  oi_status st = sync_ready(d, "oi__dir_lookup");
  if (st != OI_OK) goto out;
  if (!oi__grow((void **)&d->keybuf, &d->keybuf_cap, n * KEY_STRIDE, 1,
                (size_t)OI_DIR_LOOKUP_MAX * KEY_STRIDE) ||
      !oi__grow((void **)&d->argv, &d->argv_cap, n + 1, sizeof(char *), OI_DIR_LOOKUP_MAX + 1) ||
      !oi__grow((void **)&d->argvlen, &d->argvlen_cap, n + 1, sizeof(size_t),
                OI_DIR_LOOKUP_MAX + 1) ||
      !oi__grow((void **)&d->found, &d->found_cap, n, 1, OI_DIR_LOOKUP_MAX)) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "oi__dir_lookup: out of memory for %zu keys", n);
    goto out;
  }
  size_t klen = 0;
  for (size_t i = 0; i < n; i++)
    klen = oi__dir_key_format(d->prefix, &keys[i], d->keybuf + i * KEY_STRIDE);
  uint64_t t0 = oi__now_ns();
  size_t found = 0;
  if (d->cluster) {
    /* A cluster's MGET takes keys of one slot only, and a prefix's keys
     * spread over all slots: one GET per key instead, pipelined to the
     * keys' masters, every master's GETs written before any reply is read
     * (one round trip, and one more per redirection). */
    look_ctx l = {.out = out};
    xops x = {look_key, look_append, look_reply, &l};
    char err[128];
    int rc = oi__dir_side_exec(d, &d->ss, n, &x, err, sizeof err);
    if (rc != XR_OK) {
      st = sync_lost(d, "GET", err);
      goto out;
    }
    for (; found < n; found++) {
      if (d->found[found] == F_FOUND) continue;
      if (d->found[found] == F_ERROR) {
        oi__dir_note_error(d, "GET: %s", l.err);
        st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_lookup: directory %s answered GET with %s", d->url,
                      l.err);
        goto out;
      }
      break;
    }
  } else {
    d->argv[0] = "MGET";
    d->argvlen[0] = 4;
    for (size_t i = 0; i < n; i++) {
      d->argv[i + 1] = d->keybuf + i * KEY_STRIDE;
      d->argvlen[i + 1] = klen;
    }
    redisContext *c = d->ss.nodes[0].c;
    redisReply *r = redisCommandArgv(c, (int)(n + 1), d->argv, d->argvlen);
    if (!r) {
      char err[128];
      snprintf(err, sizeof err, "%s", c->errstr[0] ? c->errstr : "no reply");
      st = sync_lost(d, "MGET", err);
      goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
      bool e = r->type == REDIS_REPLY_ERROR;
      oi__dir_note_error(d, "MGET: %s%s", e ? r->str : "unexpected reply",
                         e ? oi__dir_cluster_hint(d, r->str) : "");
      st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_lookup: directory %s answered MGET with %s%s", d->url,
                    e ? r->str : "an unexpected reply", e ? oi__dir_cluster_hint(d, r->str) : "");
      freeReplyObject(r);
      goto out;
    }
    for (; found < n; found++) {
      redisReply *e = r->element[found];
      if (e->type != REDIS_REPLY_STRING) break;
      if (!oi__dir_entry_check(d, d->argv[found + 1], klen, e->str, e->len, &out[found])) break;
    }
    freeReplyObject(r);
  }
  uint64_t dt = oi__now_ns() - t0;
  *n_out = found;
  ADD(lookups, 1);
  ADD(lookup_keys, n);
  ADD(entries_found, found);
  ADD(lookup_ns_sum, dt);
  oi__hist_record(&d->lookup_hist, dt);
out:
  oi__dir_sigpipe_restore(&g);
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

oi_status oi__dir_node_lookup(oi_dir *d, const char *node_id, char *addr, size_t cap,
                              uint64_t *epoch) {
  if (!d || !node_id || !addr)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_node_lookup: d, node_id and addr must not be NULL");
  if (!oi__dir_node_id_valid(node_id, strnlen(node_id, OI_DIR_NODE_ID_MAX + 1)))
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
  char key[OI_DIR_NODE_ID_MAX + OI_DIR_PREFIX_MAX + 8];
  snprintf(key, sizeof key, "%snode:%s", d->prefix, node_id);
  pthread_mutex_lock(&d->sync_lock);
  sigpipe_guard g;
  oi__dir_sigpipe_block(&g);
  oi_status st = sync_ready(d, "oi__dir_node_lookup");
  if (st != OI_OK) goto out;
  one_ctx o = {.key = key, .cmd = "GET %s"};
  char err[128];
  if (oi__dir_side_one(d, &d->ss, &o, err, sizeof err) != XR_OK) {
    st = sync_lost(d, "GET", err);
    goto out;
  }
  redisReply *r = o.r;
  if (!r) {
    st = oi__fail(OI_ERR_CLOSED, "oi__dir_node_lookup: directory %s: redirected too often", d->url);
  } else if (r->type == REDIS_REPLY_NIL) {
    st = oi__fail(OI_ERR_NOT_FOUND, "node '%s' is not live in directory %s (no liveness key)",
                  node_id, d->url);
  } else if (r->type != REDIS_REPLY_STRING) {
    st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_node_lookup: directory %s answered GET with %s", d->url,
                  r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
  } else {
    uint64_t e = 0, expiry = 0;
    size_t aoff = 0, alen = 0;
    uint8_t mac[OI_DIR_MAC_LEN], want[OI_DIR_MAC_LEN];
    bool parsed = oi__dir_liveness_parse(r->str, r->len, &e, &aoff, &alen, &expiry, mac);
    if (parsed) /* the MAC covers the fields before it, as written */
      oi__dir_mac(d, OI_DIR_TAG_NODE, key, strlen(key), r->str, r->len - 2 * OI_DIR_MAC_LEN - 1,
                  want);
    if (!parsed) {
      ADD(parse_failures, 1);
      oi__dir_reject(d, key, "does not parse as '<epoch> <address> <expiry> <mac>'");
      st = oi__fail(OI_ERR_PROTOCOL,
                    "node '%s' in directory %s: the node record is not '<epoch> <address> "
                    "<expiry> <mac>'; not believed",
                    node_id, d->url);
    } else if (!oi__ct_equal(mac, want, OI_DIR_MAC_LEN) ||
               expiry + OI_DIR_CLOCK_SKEW_MS < oi__dir_wall_ms()) {
      oi__dir_reject(d, key, "fails its MAC or expired");
      st = oi__fail(OI_ERR_PROTOCOL, "node '%s' in directory %s: the node record %s; not believed",
                    node_id, d->url,
                    !oi__ct_equal(mac, want, OI_DIR_MAC_LEN)
                        ? "fails its MAC (written without this cluster's secret)"
                        : "expired (a replay, or clocks more than 30 s apart)");
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
  if (r) freeReplyObject(r);
out:
  oi__dir_sigpipe_restore(&g);
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

/* The value a lookup read as holder h of key k: the record a reader's
 * compare-and-delete must still find (the same fields and MAC). */
static void record_of(const oi_dir *d, const char *k, size_t kl, const oi_dir_holder *h,
                      char val[OI_DIR_VALUE_MAX + 1]) {
  (void)d, (void)k, (void)kl;
  int n = snprintf(val, OI_DIR_VALUE_MAX + 1, "%s %" PRIu64 " %" PRIu64 " ", h->node_id, h->epoch,
                   h->expiry_ms);
  for (size_t i = 0; i < OI_DIR_MAC_LEN; i++)
    snprintf(val + n + 2 * i, 3, "%02x", h->mac[i]);
}

oi_status oi__dir_remove_stale(oi_dir *d, const oi_tier_key *key, const oi_dir_holder *h) {
  if (!d || !key || !h)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_remove_stale: d, key and h must not be NULL");
  if (!oi__dir_node_id_valid(h->node_id, strnlen(h->node_id, sizeof h->node_id)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_remove_stale: the holder's node id is not 1 to %u characters of A-Z "
                    "a-z 0-9 . _ -",
                    OI_DIR_NODE_ID_MAX);
  if (!atomic_load(&d->connected))
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_remove_stale: directory %s is unreachable (degraded: local only)",
                    d->url);
  char k[OI_DIR_KEY_MAX + 1], val[OI_DIR_VALUE_MAX + 1];
  size_t kl = oi__dir_key_format(d->prefix, key, k);
  record_of(d, k, kl, h, val);
  pthread_mutex_lock(&d->sync_lock);
  sigpipe_guard g;
  oi__dir_sigpipe_block(&g);
  oi_status st = sync_ready(d, "oi__dir_remove_stale");
  if (st != OI_OK) goto out;
  one_ctx o = {.pre = oi__dir_cas_del, .key = k, .cmd = "EVAL %s 1 %s %s", .arg = val};
  char err[128];
  if (oi__dir_side_one(d, &d->ss, &o, err, sizeof err) != XR_OK) {
    st = sync_lost(d, "EVAL", err);
    goto out;
  }
  redisReply *r = o.r;
  if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
    ADD(stale_removed, 1);
  } else if (r && r->type == REDIS_REPLY_INTEGER) {
    st = oi__fail(OI_ERR_NOT_FOUND,
                  "oi__dir_remove_stale: %s does not name %s %" PRIu64 " (any more)", k, h->node_id,
                  h->epoch);
  } else {
    const char *e = !r                             ? "redirected too often"
                    : r->type == REDIS_REPLY_ERROR ? r->str
                                                   : "an unexpected reply";
    oi__dir_note_error(d, "remove stale: %s", e);
    st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_remove_stale: directory %s answered EVAL with %s",
                  d->url, e);
  }
  if (r) freeReplyObject(r);
out:
  oi__dir_sigpipe_restore(&g);
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

typedef struct drop_ctx {
  const oi_tier_key *keys;
  const oi_dir_holder *h;
  size_t removed;
  uint8_t *hit; /* hit[i]: entry i was removed */
  char err[96];
} drop_ctx;

static const char *drop_key(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_MAX + 24]) {
  oi__dir_key_format(d->prefix, &((drop_ctx *)ctx)->keys[i], buf);
  return buf;
}

static void drop_append(oi_dir *d, void *ctx, size_t i, redisContext *c) {
  drop_ctx *x = ctx;
  char k[OI_DIR_KEY_MAX + 1], val[OI_DIR_VALUE_MAX + 1];
  size_t kl = oi__dir_key_format(d->prefix, &x->keys[i], k);
  record_of(d, k, kl, &x->h[i], val);
  redisAppendCommand(c, "EVAL %s 1 %s %s", oi__dir_cas_del, k, val);
}

static int drop_reply(oi_dir *d, void *ctx, size_t i, redisReply *r) {
  (void)d, (void)i;
  drop_ctx *x = ctx;
  if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
    x->removed++;
    x->hit[i] = 1;
  } else if ((!r || r->type == REDIS_REPLY_ERROR) && !x->err[0])
    snprintf(x->err, sizeof x->err, "%s", r ? r->str : "redirected too often");
  return R_DONE;
}

oi_status oi__dir_drop(oi_dir *d, const oi_tier_key *keys, const oi_dir_holder *h, size_t n,
                       size_t *removed) {
  if (removed) *removed = 0;
  if (!d || (n && (!keys || !h)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_drop: d, keys and h must not be NULL");
  if (n == 0) return OI_OK;
  if (n > OI_DIR_LOOKUP_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_drop: %zu entries; at most %u", n,
                    OI_DIR_LOOKUP_MAX);
  for (size_t i = 0; i < n; i++)
    if (!oi__dir_node_id_valid(h[i].node_id, strnlen(h[i].node_id, sizeof h[i].node_id)))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "oi__dir_drop: holder %zu's node id is not 1 to %u characters of A-Z a-z "
                      "0-9 . _ -",
                      i, OI_DIR_NODE_ID_MAX);
  if (!atomic_load(&d->connected))
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_drop: directory %s is unreachable (degraded: local only)", d->url);
  pthread_mutex_lock(&d->sync_lock);
  sigpipe_guard g;
  oi__dir_sigpipe_block(&g);
  oi_status st = sync_ready(d, "oi__dir_drop");
  if (st != OI_OK) goto out;
  if (!oi__grow((void **)&d->found, &d->found_cap, n, 1, OI_DIR_LOOKUP_MAX)) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "oi__dir_drop: out of memory for %zu entries", n);
    goto out;
  }
  memset(d->found, 0, n);
  drop_ctx x = {.keys = keys, .h = h, .hit = d->found};
  xops ops = {drop_key, drop_append, drop_reply, &x};
  char err[128];
  if (oi__dir_side_exec(d, &d->ss, n, &ops, err, sizeof err) != XR_OK) {
    st = sync_lost(d, "EVAL", err);
    goto out;
  }
  if (x.err[0]) oi__dir_note_error(d, "drop: %s", x.err);
  /* Tell each holder whose entries went (its beat reads the marker and
   * publishes again once it is reachable). */
  for (size_t i = 0; i < n; i++) {
    if (!x.hit[i] || (i > 0 && x.hit[i - 1] && !strcmp(h[i].node_id, h[i - 1].node_id) &&
                      h[i].epoch == h[i - 1].epoch))
      continue;
    char mk[OI_DIR_NODE_ID_MAX + OI_DIR_PREFIX_MAX + 12], ep[24], cmd[48];
    snprintf(mk, sizeof mk, "%sdropped:%s", d->prefix, h[i].node_id);
    snprintf(ep, sizeof ep, "%" PRIu64, h[i].epoch);
    snprintf(cmd, sizeof cmd, "SET %%s %%s PX %u", d->o.block_ttl_ms);
    one_ctx o = {.key = mk, .cmd = cmd, .arg = ep};
    if (oi__dir_side_one(d, &d->ss, &o, err, sizeof err) != XR_OK) {
      st = sync_lost(d, "SET", err);
      goto out;
    }
    if (o.r) freeReplyObject(o.r);
  }
  ADD(dropped, x.removed);
  if (removed) *removed = x.removed;
out:
  oi__dir_sigpipe_restore(&g);
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
  out->redirects = GET(redirects);
  out->rejected_entries = GET(rejected_entries);
  out->dropped = GET(dropped);
#undef GET
  uint64_t sum_us;
  oi__hist_read(&d->lookup_hist, out->lookup_latency_us, &sum_us);
  pthread_mutex_lock(&d->lock);
  out->queue_depth = d->q_len;
  memcpy(out->last_error, d->last_error, sizeof out->last_error);
  pthread_mutex_unlock(&d->lock);
}
