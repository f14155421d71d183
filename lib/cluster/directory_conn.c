/* The block directory's connections: a side's nodes (one instance, or a
 * Redis Cluster's masters and slot map) and rounds of pipelined commands
 * over them, following redirections. See directory_internal.h. */
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

/* KEYS[1]: the entry; ARGV[1]: how the value must still start to be
 * deleted ("<node_id> <epoch> " for a node's own withdrawal, the whole
 * record a reader read for a reader's). */
const char oi__dir_cas_del[] =
    "local v = redis.call('GET', KEYS[1]) if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0";

/* ---- errors, signals ---- */

void oi__dir_note_error(oi_dir *d, const char *fmt, ...) {
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

void oi__dir_sigpipe_block(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
  sigpending(&pending);
  g->pending_before = sigismember(&pending, SIGPIPE) == 1;
}

void oi__dir_sigpipe_restore(sigpipe_guard *g) {
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

/* The reason of a failure, cut to cap bytes. */
static void errf(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
}

static struct timeval ms_tv(uint32_t ms) {
  struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* A connection to host:port (port 0: the socket path `host`; over TLS with
 * a rediss url) with the timeouts set, AUTH given and the database
 * selected; NULL with the reason in err.
 * SIGPIPE must be blocked. */
redisContext *oi__dir_connect(oi_dir *d, const char *host, int port, char *err, size_t cap) {
  struct timeval tv = ms_tv(d->o.timeout_ms);
  redisContext *c;
  if (d->tls) {
    bool refused = false;
    c = oi__redis_tls_connect(d->tls_ctx, host, port, d->o.timeout_ms, &refused, err, cap);
    atomic_store(&d->auth_refused, refused);
    if (!c) return NULL;
  } else {
    c = port ? redisConnectWithTimeout(host, port, tv) : redisConnectUnixWithTimeout(host, tv);
  }
  if (!c) {
    errf(err, cap, "connect: out of memory");
    return NULL;
  }
  if (c->err) {
    errf(err, cap, "connect %.60s:%d: %.60s", host, port, c->errstr);
    redisFree(c);
    return NULL;
  }
  if (redisSetTimeout(c, tv) != REDIS_OK) {
    errf(err, cap, "setting the socket timeout: %.80s", c->errstr);
    redisFree(c);
    return NULL;
  }
  if (d->password) {
    redisReply *r = d->user ? redisCommand(c, "AUTH %s %s", d->user, d->password)
                            : redisCommand(c, "AUTH %s", d->password);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok)
      errf(err, cap, "AUTH as %s%.40s%s refused: %.80s", d->user ? "user '" : "",
           d->user ? d->user : "the default user", d->user ? "'" : "",
           r ? (r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply") : c->errstr);
    atomic_store(&d->auth_refused, r && !ok);
    if (r) freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      return NULL;
    }
  }
  if (d->db) {
    redisReply *r = redisCommand(c, "SELECT %u", d->db);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok)
      errf(err, cap, "SELECT %u: %.80s", d->db,
           r ? (r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply") : c->errstr);
    if (r) freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      return NULL;
    }
  }
  return c;
}

/* Closes every connection of the side (the slot map stays). */
void oi__dir_side_drop(side *s) {
  for (size_t i = 0; i < s->n_nodes; i++)
    if (s->nodes[i].c) {
      redisFree(s->nodes[i].c);
      s->nodes[i].c = NULL;
    }
  s->up = false;
}

void oi__dir_side_free(side *s) {
  oi__dir_side_drop(s);
  oi__free(s->nodes);
  oi__free(s->slots);
  oi__free(s->it);
  oi__free(s->it2);
  memset(s, 0, sizeof *s);
}

/* The index of node host:port, added when new; -1 when the table is full. */
static int node_index(side *s, const char *host, int port) {
  for (size_t i = 0; i < s->n_nodes; i++)
    if (s->nodes[i].port == port && strcmp(s->nodes[i].host, host) == 0) return (int)i;
  if (s->n_nodes >= NODES_MAX ||
      !oi__grow((void **)&s->nodes, &s->nodes_cap, s->n_nodes + 1, sizeof(rnode), NODES_MAX))
    return -1;
  rnode *n = &s->nodes[s->n_nodes];
  memset(n, 0, sizeof *n);
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  return (int)s->n_nodes++;
}

/* Reads the slot map with CLUSTER SLOTS on `c` (connected to `host`, which
 * stands for an empty address in the reply). Masters that still serve a
 * slot keep their connection; the others are closed and forgotten. */
static bool side_load_map(oi_dir *d, side *s, redisContext *c, const char *via, char *err,
                          size_t cap) {
  char host[256]; /* `via` may be a node's, which the table's growth moves */
  snprintf(host, sizeof host, "%s", via);
  redisReply *r = redisCommand(c, "CLUSTER SLOTS");
  if (!r) {
    errf(err, cap, "CLUSTER SLOTS: %.100s", c->errstr);
    return false;
  }
  if (r->type != REDIS_REPLY_ARRAY) {
    errf(err, cap, "CLUSTER SLOTS: %.100s",
         r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    freeReplyObject(r);
    return false;
  }
  if (!s->slots) {
    s->slots = oi__malloc(OI_DIR_SLOTS * sizeof *s->slots);
    if (!s->slots) {
      errf(err, cap, "out of memory");
      freeReplyObject(r);
      return false;
    }
  }
  /* Mark the nodes the new map names, then compact the table. */
  size_t old_n = s->n_nodes;
  bool *used = oi__calloc(NODES_MAX, sizeof *used);
  int16_t *map = oi__malloc(OI_DIR_SLOTS * sizeof *map);
  bool ok = used && map;
  if (!ok) errf(err, cap, "out of memory");
  for (size_t i = 0; i < OI_DIR_SLOTS && map; i++)
    map[i] = -1;
  for (size_t i = 0; ok && i < r->elements; i++) {
    redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
        e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
        e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      errf(err, cap, "CLUSTER SLOTS: an entry that is not [start, end, [host, port, ...]]");
      ok = false;
      break;
    }
    long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    const char *h = e->element[2]->element[0]->str;
    long long port = e->element[2]->element[1]->integer;
    if (lo < 0 || hi >= OI_DIR_SLOTS || lo > hi || port <= 0 || port > 65535) {
      errf(err, cap, "CLUSTER SLOTS: a range or port out of bounds");
      ok = false;
      break;
    }
    int idx = node_index(s, h[0] ? h : host, (int)port);
    if (idx < 0) {
      errf(err, cap, "CLUSTER SLOTS: more than %u masters", NODES_MAX);
      ok = false;
      break;
    }
    used[idx] = true;
    for (long long k = lo; k <= hi; k++)
      map[k] = (int16_t)idx;
  }
  freeReplyObject(r);
  if (!ok) {
    /* forget nodes the failed read added */
    for (size_t i = old_n; i < s->n_nodes; i++)
      if (s->nodes[i].c) redisFree(s->nodes[i].c);
    s->n_nodes = old_n;
    oi__free(used);
    oi__free(map);
    return false;
  }
  int16_t remap[NODES_MAX];
  size_t w = 0;
  for (size_t i = 0; i < s->n_nodes; i++) {
    if (!used[i]) {
      if (s->nodes[i].c) redisFree(s->nodes[i].c);
      remap[i] = -1;
      continue;
    }
    remap[i] = (int16_t)w;
    if (w != i) s->nodes[w] = s->nodes[i];
    w++;
  }
  s->n_nodes = w;
  for (size_t k = 0; k < OI_DIR_SLOTS; k++)
    s->slots[k] = map[k] < 0 ? -1 : remap[map[k]];
  oi__free(used);
  oi__free(map);
  s->stale = false;
  (void)d;
  return true;
}

/* Loads the compare-and-delete script on `c` into d->sha. false when the
 * connection failed (an error reply leaves sha empty: EVAL then). */
static bool load_script(oi_dir *d, redisContext *c, char *err, size_t cap) {
  redisReply *r = redisCommand(c, "SCRIPT LOAD %s", oi__dir_cas_del);
  if (!r) {
    errf(err, cap, "SCRIPT LOAD: %.100s", c->errstr);
    return false;
  }
  if (r->type == REDIS_REPLY_STRING && r->len == 40) {
    memcpy(d->sha, r->str, 40);
    d->sha[40] = '\0';
  }
  if (oi__dir_is_err(r, "NOAUTH")) { /* a password is needed, and none was given */
    errf(err, cap, "%.60s: give the Redis password in a Redis auth file or OI_REDIS_PASSWORD",
         r->str);
    atomic_store(&d->auth_refused, true);
    freeReplyObject(r);
    return false;
  }
  freeReplyObject(r);
  return true;
}

/* Whether node n's CLUSTER INFO says cluster_state:ok (why not in err). */
static bool cluster_ok(rnode *n, char *err, size_t cap) {
  redisReply *r = redisCommand(n->c, "CLUSTER INFO");
  bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
  if (!r)
    errf(err, cap, "CLUSTER INFO at %.60s:%d: %.60s", n->host, n->port, n->c->errstr);
  else if (r->type == REDIS_REPLY_ERROR)
    errf(err, cap, "CLUSTER INFO at %.60s:%d: %.60s%s", n->host, n->port, r->str,
         strncmp(r->str, "NOAUTH", 6) == 0 ? " (give the Redis password in a Redis auth file or "
                                             "OI_REDIS_PASSWORD)"
                                           : " (not a Redis Cluster?)");
  else if (!ok)
    errf(err, cap, "%.60s:%d: the cluster is not ok (cluster_state is not ok)", n->host, n->port);
  if (r) freeReplyObject(r);
  return ok;
}

/* Opens the side: a single instance's connection, or (cluster) the slot map
 * read from the first address of the url or of the masters known before
 * that answers with cluster_state:ok, then a connection to every master.
 * `script`: load the compare-and-delete script on each. SIGPIPE must be
 * blocked. */
bool oi__dir_side_open(oi_dir *d, side *s, bool script, char *err, size_t cap) {
  oi__dir_side_drop(s);
  if (script) d->sha[0] = '\0';
  if (!d->cluster) {
    if (s->n_nodes == 0) {
      int idx = d->unix_path[0] ? node_index(s, d->unix_path, 0) : node_index(s, d->host, d->port);
      if (idx < 0) {
        errf(err, cap, "out of memory");
        return false;
      }
    }
    rnode *n = &s->nodes[0];
    n->c = oi__dir_connect(d, n->host, n->port, err, cap);
    if (!n->c) return false;
    if (script && !load_script(d, n->c, err, cap)) {
      oi__dir_side_drop(s);
      return false;
    }
    s->up = true;
    return true;
  }
  /* the candidates: the url's addresses, then the masters known before */
  size_t n_cand = d->n_seeds + OI_MIN(s->n_nodes, (size_t)NODES_MAX);
  struct cand {
    char host[256];
    int port;
  } *cand = oi__malloc(n_cand * sizeof *cand);
  if (!cand) {
    errf(err, cap, "out of memory");
    return false;
  }
  for (size_t i = 0; i < d->n_seeds; i++) {
    memcpy(cand[i].host, d->seeds[i].host, sizeof cand[i].host);
    cand[i].port = d->seeds[i].port;
  }
  for (size_t i = d->n_seeds; i < n_cand; i++) {
    memcpy(cand[i].host, s->nodes[i - d->n_seeds].host, sizeof cand[i].host);
    cand[i].port = s->nodes[i - d->n_seeds].port;
  }
  bool mapped = false;
  for (size_t i = 0; i < n_cand && !mapped; i++) {
    redisContext *c = oi__dir_connect(d, cand[i].host, cand[i].port, err, cap);
    if (!c) continue;
    rnode probe = {.port = cand[i].port, .c = c};
    memcpy(probe.host, cand[i].host, sizeof probe.host);
    if (!cluster_ok(&probe, err, cap)) {
      redisFree(c);
      continue;
    }
    mapped = side_load_map(d, s, c, cand[i].host, err, cap);
    if (mapped) { /* keep the connection when it is a master's */
      int idx = -1;
      for (size_t k = 0; k < s->n_nodes; k++)
        if (s->nodes[k].port == cand[i].port && strcmp(s->nodes[k].host, cand[i].host) == 0)
          idx = (int)k;
      if (idx >= 0 && !s->nodes[idx].c) {
        s->nodes[idx].c = c;
        c = NULL;
      }
    }
    if (c) redisFree(c);
  }
  oi__free(cand);
  if (!mapped) return false;
  if (s->n_nodes == 0) {
    errf(err, cap, "CLUSTER SLOTS: no slot is served");
    return false;
  }
  /* Every master must say the cluster is ok, as the background beat
   * checks: masters that disagree for a while (a master back from a
   * failure) would otherwise make the directory connect and degrade in
   * turn, each connect a new generation. */
  for (size_t k = 0; k < s->n_nodes; k++) {
    rnode *n = &s->nodes[k];
    if (!n->c) n->c = oi__dir_connect(d, n->host, n->port, err, cap);
    if (!n->c || !cluster_ok(n, err, cap) || (script && !load_script(d, n->c, err, cap))) {
      oi__dir_side_drop(s);
      return false;
    }
  }
  s->up = true;
  return true;
}

static bool parse_redirect(const char *s, uint16_t *slot, char *host, size_t cap, int *port,
                           const char *deflt) {
  const char *sp = strchr(s, ' ');
  if (!sp) return false;
  const char *sp2 = strchr(sp + 1, ' ');
  if (!sp2) return false;
  uint64_t v, p;
  if (!oi__dir_parse_u64(sp + 1, (size_t)(sp2 - sp - 1), &v) || v >= OI_DIR_SLOTS) return false;
  const char *colon = strrchr(sp2 + 1, ':');
  if (!colon || !oi__dir_parse_u64(colon + 1, strlen(colon + 1), &p) || p == 0 || p > 65535)
    return false;
  size_t hl = (size_t)(colon - sp2 - 1);
  if (hl >= cap) return false;
  if (hl == 0)
    snprintf(host, cap, "%s", deflt);
  else {
    memcpy(host, sp2 + 1, hl);
    host[hl] = '\0';
  }
  *slot = (uint16_t)v;
  *port = (int)p;
  return true;
}

bool oi__dir_is_err(redisReply *r, const char *prefix) {
  return r->type == REDIS_REPLY_ERROR && strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/* Sends commands 0..n-1, each to the master of its key's slot (a single
 * instance: its one node), pipelined: every node's commands are written
 * before any reply is read, so a round costs one round trip however many
 * nodes it spans. MOVED updates the slot map (reloaded at the end) and
 * sends the command again where it points; ASK sends ASKING and the command
 * there; TRYAGAIN sends it again after 10 ms; at most REDIRECT_ROUNDS
 * rounds. XR_LOST: a connection failed (the side must be dropped; what was
 * not answered is not given to ops->reply). XR_DOWN: CLUSTERDOWN, or a slot
 * no master serves. err: the reason. SIGPIPE must be blocked. */
int oi__dir_side_exec(oi_dir *d, side *s, size_t n, const xops *x, char *err, size_t cap) {
  if (!oi__grow((void **)&s->it, &s->it_cap, n, sizeof(xitem), SIZE_MAX / sizeof(xitem)) ||
      !oi__grow((void **)&s->it2, &s->it2_cap, n, sizeof(xitem), SIZE_MAX / sizeof(xitem))) {
    errf(err, cap, "out of memory");
    return XR_LOST;
  }
  int rc = XR_OK;
  for (size_t k = 0; k < n; k++) {
    uint16_t slot = 0;
    int node = 0;
    if (s->slots) {
      char buf[OI_DIR_KEY_CHARS + 24];
      const char *key = x->key(d, x->ctx, k, buf);
      slot = oi__dir_key_slot(key, strlen(key));
      node = s->slots[slot];
      if (node < 0) {
        errf(err, cap, "no master serves slot %u", slot);
        return XR_DOWN;
      }
    }
    s->it[k] = (xitem){.i = (uint32_t)k, .slot = slot, .node = (int16_t)node};
  }
  size_t pend = n;
  bool tryagain = false;
  for (int round = 0; pend && round <= REDIRECT_ROUNDS; round++) {
    if (tryagain) {
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
      tryagain = false;
    }
    for (size_t k = 0; k < pend; k++) {
      rnode *nd = &s->nodes[s->it[k].node];
      if (!nd->c) {
        nd->c = oi__dir_connect(d, nd->host, nd->port, err, cap);
        if (!nd->c) return XR_LOST;
      }
    }
    for (size_t k = 0; k < s->n_nodes; k++)
      s->nodes[k].sent = 0;
    for (size_t k = 0; k < pend; k++) {
      rnode *nd = &s->nodes[s->it[k].node];
      if (s->it[k].asking) redisAppendCommand(nd->c, "ASKING");
      x->append(d, x->ctx, s->it[k].i, nd->c);
      nd->sent++;
    }
    for (size_t k = 0; k < s->n_nodes; k++) {
      rnode *nd = &s->nodes[k];
      int done = 0;
      while (nd->sent && !done)
        if (redisBufferWrite(nd->c, &done) != REDIS_OK) {
          errf(err, cap, "%.60s:%d: %.80s", nd->host, nd->port, nd->c->errstr);
          return XR_LOST;
        }
    }
    size_t next = 0;
    for (size_t k = 0; k < pend; k++) {
      xitem it = s->it[k];
      rnode *nd = &s->nodes[it.node];
      void *v = NULL;
      if (it.asking) {
        if (redisGetReply(nd->c, &v) != REDIS_OK || !v) goto lost;
        freeReplyObject(v);
        v = NULL;
      }
      if (redisGetReply(nd->c, &v) != REDIS_OK || !v) goto lost;
      redisReply *r = v;
      if (s->slots && (oi__dir_is_err(r, "MOVED ") || oi__dir_is_err(r, "ASK "))) {
        bool ask = oi__dir_is_err(r, "ASK ");
        char host[256];
        int port;
        uint16_t slot;
        int idx = -1;
        if (parse_redirect(r->str, &slot, host, sizeof host, &port, nd->host))
          idx = node_index(s, host, port);
        if (idx < 0) {
          errf(err, cap, "a redirection that does not parse or leads too far: %.80s", r->str);
          freeReplyObject(r);
          rc = XR_DOWN;
          continue;
        }
        ADD(redirects, 1);
        if (!ask) {
          s->slots[slot] = (int16_t)idx;
          s->stale = true;
        }
        s->it2[next++] = (xitem){.i = it.i, .slot = it.slot, .node = (int16_t)idx, .asking = ask};
        freeReplyObject(r);
        continue;
      }
      if (s->slots && oi__dir_is_err(r, "TRYAGAIN")) {
        tryagain = true;
        s->it2[next++] = it;
        freeReplyObject(r);
        continue;
      }
      if (oi__dir_is_err(r, "CLUSTERDOWN")) {
        errf(err, cap, "%.60s:%d: %.80s", nd->host, nd->port, r->str);
        freeReplyObject(r);
        rc = XR_DOWN;
        continue;
      }
      int what = x->reply(d, x->ctx, it.i, r);
      if (what == R_RETRY) s->it2[next++] = (xitem){.i = it.i, .slot = it.slot, .node = it.node};
      if (what != R_KEPT) freeReplyObject(r);
      continue;
    lost:
      errf(err, cap, "%.60s:%d: %.80s", nd->host, nd->port,
           nd->c->errstr[0] ? nd->c->errstr : "no reply");
      return XR_LOST;
    }
    xitem *t = s->it;
    s->it = s->it2;
    s->it2 = t;
    size_t tc = s->it_cap;
    s->it_cap = s->it2_cap;
    s->it2_cap = tc;
    pend = next;
  }
  if (pend) {
    oi__dir_note_error(d, "%zu commands still redirected after %d rounds", pend,
                       REDIRECT_ROUNDS + 1);
    for (size_t k = 0; k < pend; k++)
      x->reply(d, x->ctx, s->it[k].i, NULL);
  }
  if (s->stale && rc == XR_OK) { /* a MOVED was followed: the map changed */
    for (size_t k = 0; k < s->n_nodes; k++)
      if (s->nodes[k].c) {
        char e2[128];
        if (!side_load_map(d, s, s->nodes[k].c, s->nodes[k].host, e2, sizeof e2))
          oi__dir_note_error(d, "reloading the slot map: %s", e2);
        break;
      }
  }
  return rc;
}

/* Connects the background side and loads the compare-and-delete script.
 * SIGPIPE must be blocked. */
bool oi__dir_bg_connect(oi_dir *d) {
  char err[128];
  if (!oi__dir_side_open(d, &d->bs, true, err, sizeof err)) {
    oi__dir_note_error(d, "%s", err);
    return false;
  }
  atomic_fetch_add(&d->generation, 1);
  atomic_store(&d->connected, true);
  return true;
}
