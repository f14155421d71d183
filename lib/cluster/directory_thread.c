/* The block directory's background thread: it publishes and unpublishes
 * the queued keys and renews the node's liveness. See
 * directory_internal.h. */
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

/* ---- the background thread ---- */

static bool reply_ok(redisReply *r) {
  return r && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING);
}

/* The hint an error reply earns when the url names a single instance. */
const char *oi__dir_cluster_hint(oi_dir *d, const char *e) {
  if (!d->cluster && (strncmp(e, "MOVED", 5) == 0 || strncmp(e, "ASK", 3) == 0 ||
                      strncmp(e, "CROSSSLOT", 9) == 0 || strncmp(e, "CLUSTERDOWN", 11) == 0))
    return " (a Redis Cluster: use redis+cluster://)";
  return "";
}

typedef struct bg_ctx {
  const qent *batch;
  char ttl[16];
  uint64_t expiry_ms; /* of the entries published */
  size_t answered;
} bg_ctx;

static const char *bg_key(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_MAX + 24]) {
  oi__dir_key_format(d->prefix, &((bg_ctx *)ctx)->batch[i].key, buf);
  return buf;
}

static void bg_append(oi_dir *d, void *ctx, size_t i, redisContext *c) {
  bg_ctx *b = ctx;
  char key[OI_DIR_KEY_MAX + 1];
  size_t kl = oi__dir_key_format(d->prefix, &b->batch[i].key, key);
  if (b->batch[i].op == Q_PUBLISH) {
    char val[OI_DIR_VALUE_MAX + 1];
    oi__dir_entry_value(d, key, kl, d->node_id, d->o.epoch, b->expiry_ms, val);
    redisAppendCommand(c, "SET %s %s PX %s", key, val, b->ttl);
  } else if (d->sha[0])
    redisAppendCommand(c, "EVALSHA %s 1 %s %s", d->sha, key, d->self_val);
  else
    redisAppendCommand(c, "EVAL %s 1 %s %s", oi__dir_cas_del, key, d->self_val);
}

static int bg_reply(oi_dir *d, void *ctx, size_t i, redisReply *r) {
  bg_ctx *b = ctx;
  if (b->batch[i].op == Q_PUBLISH) {
    if (reply_ok(r))
      ADD(published, 1);
    else if (r)
      oi__dir_note_error(d, "publish: %s%s",
                         r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply",
                         r->type == REDIS_REPLY_ERROR ? oi__dir_cluster_hint(d, r->str) : "");
  } else if (r && oi__dir_is_err(r, "NOSCRIPT")) {
    d->sha[0] = '\0'; /* a script cache was flushed (or this master never had it): EVAL */
    return R_RETRY;
  } else if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
    ADD(unpublished, 1);
  } else if (r && r->type == REDIS_REPLY_INTEGER) {
    ADD(unpublish_missed, 1);
  } else if (r) {
    oi__dir_note_error(d, "unpublish: %s%s",
                       r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply",
                       r->type == REDIS_REPLY_ERROR ? oi__dir_cluster_hint(d, r->str) : "");
  }
  b->answered++;
  return R_DONE;
}

/* Sends `n` queued entries in pipelined chunks. false when a connection
 * failed or the cluster is down (what was not answered is counted as
 * dropped). */
static bool bg_flush(oi_dir *d, const qent *batch, size_t n) {
  for (size_t i = 0; i < n; i += PIPELINE) {
    size_t m = OI_MIN((size_t)PIPELINE, n - i);
    bg_ctx b = {.batch = batch + i};
    snprintf(b.ttl, sizeof b.ttl, "%u", d->o.block_ttl_ms);
    b.expiry_ms = oi__dir_wall_ms() + d->o.block_ttl_ms;
    xops x = {bg_key, bg_append, bg_reply, &b};
    char err[128];
    int rc = oi__dir_side_exec(d, &d->bs, m, &x, err, sizeof err);
    if (rc != XR_OK) {
      oi__dir_note_error(d, "sending publishes: %s", err);
      ADD(queue_dropped, n - i - b.answered);
      return false;
    }
  }
  return true;
}

static const char *one_key(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_MAX + 24]) {
  (void)d, (void)i, (void)buf;
  return ((one_ctx *)ctx)->key;
}

static void one_append(oi_dir *d, void *ctx, size_t i, redisContext *c) {
  (void)d, (void)i;
  one_ctx *o = ctx;
  if (o->pre)
    redisAppendCommand(c, o->cmd, o->pre, o->key, o->arg);
  else if (o->arg)
    redisAppendCommand(c, o->cmd, o->key, o->arg);
  else
    redisAppendCommand(c, o->cmd, o->key);
}

static int one_reply(oi_dir *d, void *ctx, size_t i, redisReply *r) {
  (void)d, (void)i;
  ((one_ctx *)ctx)->r = r;
  return R_KEPT;
}

/* One command on the side's master of `key` (redirections followed).
 * XR_OK with o->r the reply (NULL when redirections did not settle). */
int oi__dir_side_one(oi_dir *d, side *s, one_ctx *o, char *err, size_t cap) {
  xops x = {one_key, one_append, one_reply, o};
  o->r = NULL;
  int rc = oi__dir_side_exec(d, s, 1, &x, err, cap);
  if (rc != XR_OK && o->r) {
    freeReplyObject(o->r);
    o->r = NULL;
  }
  return rc;
}

/* Refreshes the liveness key and, with nothing advertised, PINGs; a cluster
 * checks every master's CLUSTER INFO. */
static bool bg_beat(oi_dir *d, const char *adv) {
  char err[128];
  if (adv) {
    char val[OI_DIR_VALUE_MAX + 1]; /* one argument: hiredis splits a format at spaces */
    oi__dir_node_value(d, adv, oi__dir_wall_ms() + d->o.node_ttl_ms, val);
    char cmd[48];
    snprintf(cmd, sizeof cmd, "SET %%s %%s PX %u", d->o.node_ttl_ms);
    one_ctx o = {.key = d->node_key, .cmd = cmd, .arg = val};
    int rc = oi__dir_side_one(d, &d->bs, &o, err, sizeof err);
    if (rc != XR_OK) {
      oi__dir_note_error(d, "refreshing the node key: %s", err);
      return false;
    }
    if (o.r && !reply_ok(o.r))
      oi__dir_note_error(d, "refreshing the node key: %s",
                         o.r->type == REDIS_REPLY_ERROR ? o.r->str : "unexpected reply");
    if (o.r) freeReplyObject(o.r);
    /* A reader that could not reach this node withdrew entries of it and
     * said so (oi__dir_drop): publish everything again now that it is
     * reachable (a marker anyone could write costs a republish, no more). */
    one_ctx g = {.key = d->dropped_key, .cmd = "GET %s"};
    if (oi__dir_side_one(d, &d->bs, &g, err, sizeof err) != XR_OK) {
      oi__dir_note_error(d, "reading the withdrawal marker: %s", err);
      return false;
    }
    char epoch[24];
    snprintf(epoch, sizeof epoch, "%" PRIu64, d->o.epoch);
    bool ours = g.r && g.r->type == REDIS_REPLY_STRING && strcmp(g.r->str, epoch) == 0;
    if (g.r) freeReplyObject(g.r);
    if (ours) {
      one_ctx x = {.key = d->dropped_key, .cmd = "DEL %s"};
      if (oi__dir_side_one(d, &d->bs, &x, err, sizeof err) != XR_OK) return false;
      if (x.r) freeReplyObject(x.r);
      OI_LOG(OI_LOG_INFO, "cluster",
             "directory %s: a reader withdrew entries of this node (it could not reach it); "
             "publishing again",
             d->url);
      if (d->o.on_reconnect) d->o.on_reconnect(d->o.on_reconnect_ctx);
    }
    /* an error reply is Redis answering: the connection is fine */
    if (!d->cluster) return true;
  }
  /* A cluster: every master must answer, and say the cluster is ok, so
   * that a master that went down, or a cluster that stopped serving,
   * degrades the directory here rather than at each lookup. */
  for (size_t k = 0; k < d->bs.n_nodes; k++) {
    rnode *n = &d->bs.nodes[k];
    if (!n->c) n->c = oi__dir_connect(d, n->host, n->port, err, sizeof err);
    redisReply *r = n->c ? redisCommand(n->c, d->cluster ? "CLUSTER INFO" : "PING") : NULL;
    if (!r) {
      oi__dir_note_error(d, "%s %s:%d: %s", d->cluster ? "CLUSTER INFO" : "PING", n->host, n->port,
                         n->c ? n->c->errstr : err);
      return false;
    }
    bool down =
        d->cluster && (r->type != REDIS_REPLY_STRING || !strstr(r->str, "cluster_state:ok"));
    if (down)
      oi__dir_note_error(d, "%s:%d: the cluster is not ok (cluster_state is not ok)", n->host,
                         n->port);
    else if (!reply_ok(r))
      oi__dir_note_error(d, "PING: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    freeReplyObject(r);
    if (down) return false;
  }
  return true;
}

static void timed_wait(oi_dir *d, uint64_t deadline_ns) {
  struct timespec ts = oi__timespec(deadline_ns);
  pthread_cond_timedwait(&d->cv, &d->lock, &ts);
}

void *oi__dir_thread_main(void *arg) {
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
    if (!d->bs.up) {
      pthread_mutex_unlock(&d->lock);
      bool ok = oi__dir_bg_connect(d);
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
      oi__dir_side_drop(&d->bs);
      char why[sizeof d->last_error]; /* written under the lock by any thread */
      pthread_mutex_lock(&d->lock);
      memcpy(why, d->last_error, sizeof why);
      pthread_mutex_unlock(&d->lock);
      OI_LOG(OI_LOG_WARN, "cluster",
             "directory %s: connection lost (%s); degraded (local only), reconnecting", d->url,
             why);
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
