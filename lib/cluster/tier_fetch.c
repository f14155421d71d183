/* The cluster tier's reader side (tier_internal.h): the tier's lookup (who
 * holds the leading run, one directory round trip) and promote (fetch jobs
 * for the slots the host reserved), and the FETCHERS threads that run them:
 * connect, LEASE, read, verify, RELEASE sent without waiting for its
 * answer, seal; the connections to holders are shared. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cluster/tier_internal.h"

/* ---- reader: fetching ---- */

/* Closes a dead slot's connection once nobody uses it (peer_lock held). */
static void slot_reap_locked(peer_slot *s) {
  if (s->peer && s->dead && s->users == 0) {
    oi__peer_close(s->peer);
    memset(s, 0, sizeof *s);
  }
}

/* ---- holders down ---- */

/* The record of holder `h` in t->down, or NULL (peer_lock held). */
static down_holder *down_find_locked(cluster_tier *t, const char *node_id) {
  for (int i = 0; i < MAX_DOWN; i++)
    if (t->down[i].node_id[0] && !strcmp(t->down[i].node_id, node_id)) return &t->down[i];
  return NULL;
}

/* Whether holder `h` (this incarnation) is down (peer_lock held). */
static bool is_down_locked(cluster_tier *t, const oi_dir_holder *h) {
  down_holder *d = down_find_locked(t, h->node_id);
  return d && d->epoch == h->epoch;
}

static bool is_down(cluster_tier *t, const oi_dir_holder *h) {
  if (atomic_load(&t->ndown) == 0) return false;
  pthread_mutex_lock(&t->peer_lock);
  bool down = is_down_locked(t, h);
  pthread_mutex_unlock(&t->peer_lock);
  return down;
}

/* Holder `h` failed (`st`, what it did): down for every fetch of it, in
 * flight or to come, until a probe reaches it; its connections end now, so
 * that the fetches waiting on them end at once. */
static void peer_put(cluster_tier *t, int slot, bool failed);

static void mark_down(cluster_tier *t, const oi_dir_holder *h, oi_status st) {
  int ended[MAX_PEERS];
  int nended = 0;
  bool fresh = false;
  pthread_mutex_lock(&t->peer_lock);
  down_holder *d = down_find_locked(t, h->node_id);
  if (!d)
    for (int i = 0; i < MAX_DOWN && !d; i++)
      if (!t->down[i].node_id[0]) d = &t->down[i];
  if (d && !(d->node_id[0] && d->epoch == h->epoch)) {
    if (!d->node_id[0]) atomic_fetch_add(&t->ndown, 1);
    snprintf(d->node_id, sizeof d->node_id, "%s", h->node_id);
    d->epoch = h->epoch;
    d->probe_ms = PROBE_MS;
    d->next_probe_ns = oi__now_ns() + (uint64_t)PROBE_MS * 1000000u;
    fresh = true;
  }
  /* Every connection to it ends (other fetchers' too: held here meanwhile,
   * so that none is freed under the abort): calls and reads in flight on
   * it end now rather than at their own timeouts. */
  for (int i = 0; i < MAX_PEERS; i++) {
    peer_slot *s = &t->peers[i];
    if (!s->peer || strcmp(s->node_id, h->node_id) || s->epoch != h->epoch) continue;
    s->dead = true;
    s->users++;
    ended[nended++] = i;
  }
  pthread_mutex_unlock(&t->peer_lock);
  if (fresh) {
    atomic_fetch_add(&t->holders_marked_down, 1);
    OI_LOG(OI_LOG_WARN, "cluster",
           "node '%s' does not answer (%s): down, its blocks miss until it answers again",
           h->node_id, oi_status_str(st));
    pthread_mutex_lock(&t->lock);
    pthread_cond_signal(&t->pcv);
    pthread_mutex_unlock(&t->lock);
  }
  for (int i = 0; i < nended; i++) {
    oi__peer_abort(t->peers[ended[i]].peer);
    peer_put(t, ended[i], true);
  }
}

/* Holder `h` answered: up again. */
static void mark_up(cluster_tier *t, const oi_dir_holder *h) {
  if (atomic_load(&t->ndown) == 0) return;
  pthread_mutex_lock(&t->peer_lock);
  down_holder *d = down_find_locked(t, h->node_id);
  bool was = d != NULL;
  if (d) {
    memset(d, 0, sizeof *d);
    atomic_fetch_sub(&t->ndown, 1);
  }
  pthread_mutex_unlock(&t->peer_lock);
  if (was) OI_LOG(OI_LOG_INFO, "cluster", "node '%s' answers again", h->node_id);
}

/* A connection to holder `h` (connecting when there is none), held until
 * peer_put. @return its slot, or -1 with *why: OI_OK when the holder is not
 * to blame (the directory did not answer, every slot busy; or *stale: the
 * holder is gone or is another incarnation), else how connecting to it
 * failed. */
static int peer_get(cluster_tier *t, const oi_dir_holder *h, bool *stale, oi_status *why) {
  *stale = false;
  *why = OI_OK;
  pthread_mutex_lock(&t->peer_lock);
  for (int i = 0; i < MAX_PEERS; i++) {
    peer_slot *s = &t->peers[i];
    if (!s->peer || s->dead || strcmp(s->node_id, h->node_id)) continue;
    if (s->epoch == h->epoch) {
      s->users++;
      pthread_mutex_unlock(&t->peer_lock);
      return i;
    }
    s->dead = true; /* the node restarted since */
    slot_reap_locked(s);
  }
  pthread_mutex_unlock(&t->peer_lock);
  char addr[128];
  uint64_t epoch = 0;
  oi_status st = oi__dir_node_lookup(t->dir, h->node_id, addr, sizeof addr, &epoch);
  if (st == OI_ERR_NOT_FOUND || (st == OI_OK && epoch != h->epoch)) {
    *stale = true;
    return -1;
  }
  if (st != OI_OK) return -1;
  oi_peer *p = NULL;
  if ((st = oi__peer_connect(t->net, addr, &p)) != OI_OK) {
    OI_LOG(OI_LOG_INFO, "cluster", "cannot reach node '%s' at %s: %s", h->node_id, addr,
           oi_last_error());
    *why = st;
    return -1;
  }
  pthread_mutex_lock(&t->peer_lock);
  int slot = -1;
  for (int i = 0; i < MAX_PEERS && slot < 0; i++)
    if (!t->peers[i].peer) slot = i;
  if (slot < 0) { /* full: an idle slot goes */
    for (int i = 0; i < MAX_PEERS && slot < 0; i++)
      if (t->peers[i].users == 0) {
        oi__peer_close(t->peers[i].peer);
        slot = i;
      }
  }
  if (slot < 0) { /* every slot busy: this fetch goes without caching */
    pthread_mutex_unlock(&t->peer_lock);
    oi__peer_close(p);
    return -1;
  }
  t->peers[slot] = (peer_slot){.epoch = h->epoch, .peer = p, .users = 1};
  snprintf(t->peers[slot].node_id, sizeof t->peers[slot].node_id, "%s", h->node_id);
  pthread_mutex_unlock(&t->peer_lock);
  return slot;
}

/* Gives a connection back; `failed`: it is not to be used again. */
static void peer_put(cluster_tier *t, int slot, bool failed) {
  pthread_mutex_lock(&t->peer_lock);
  peer_slot *s = &t->peers[slot];
  s->users--;
  if (failed) s->dead = true;
  slot_reap_locked(s);
  pthread_mutex_unlock(&t->peer_lock);
}

void oi__cluster_holder_counts(cluster_tier *t, uint64_t *up, uint64_t *down) {
  *up = *down = 0;
  pthread_mutex_lock(&t->peer_lock);
  for (int i = 0; i < MAX_PEERS; i++) {
    const peer_slot *s = &t->peers[i];
    if (!s->peer || s->dead) continue;
    bool seen = false; /* one holder, one count */
    for (int j = 0; j < i && !seen; j++)
      seen = t->peers[j].peer && !t->peers[j].dead && !strcmp(t->peers[j].node_id, s->node_id);
    *up += !seen;
  }
  for (int i = 0; i < MAX_DOWN; i++)
    *down += t->down[i].node_id[0] != 0;
  pthread_mutex_unlock(&t->peer_lock);
}

/* The prober: a connect to each down holder whose time came (PROBE_MS
 * after it went down, then backing off to PROBE_MAX_MS); one that authenticates is up (its
 * connection stays for the fetches), one the directory no longer names (it left, or restarted: its
 * entries are stale) is forgotten. */
void *oi__cluster_prober_main(void *arg) {
  cluster_tier *t = arg;
  for (;;) {
    pthread_mutex_lock(&t->lock);
    if (!t->stop) {
      struct timespec ts =
          oi__timespec(oi__deadline_ns(atomic_load(&t->ndown) ? PROBE_MS / 5 : 1000));
      pthread_cond_timedwait(&t->pcv, &t->lock, &ts);
    }
    bool stop = t->stop;
    pthread_mutex_unlock(&t->lock);
    if (stop) return NULL;
    if (atomic_load(&t->ndown) == 0) continue;
    oi_dir_holder due[MAX_DOWN];
    size_t n = 0;
    uint64_t now = oi__now_ns();
    pthread_mutex_lock(&t->peer_lock);
    for (int i = 0; i < MAX_DOWN; i++)
      if (t->down[i].node_id[0] && t->down[i].next_probe_ns <= now) {
        snprintf(due[n].node_id, sizeof due[n].node_id, "%s", t->down[i].node_id);
        due[n++].epoch = t->down[i].epoch;
      }
    pthread_mutex_unlock(&t->peer_lock);
    for (size_t i = 0; i < n; i++) {
      bool stale = false;
      oi_status why = OI_OK;
      int slot = peer_get(t, &due[i], &stale, &why);
      if (slot >= 0) {
        peer_put(t, slot, false);
        mark_up(t, &due[i]);
        continue;
      }
      if (stale) { /* gone or restarted: its entries fail as stale, at once */
        mark_up(t, &due[i]);
        continue;
      }
      pthread_mutex_lock(&t->peer_lock);
      down_holder *d = down_find_locked(t, due[i].node_id);
      if (d && d->epoch == due[i].epoch) {
        d->probe_ms = OI_MIN(2 * d->probe_ms, (uint32_t)PROBE_MAX_MS);
        d->next_probe_ns = oi__now_ns() + (uint64_t)d->probe_ms * 1000000u;
      }
      pthread_mutex_unlock(&t->peer_lock);
    }
  }
}

/* A holder fails a fetch (it is down from now on) on these. */
static bool holder_failure(oi_status st) {
  return st == OI_ERR_TIMEOUT || st == OI_ERR_CLOSED || st == OI_ERR_IO ||
         st == OI_ERR_PERMISSION || st == OI_ERR_PROTOCOL || st == OI_ERR_VERSION;
}

/* Fetches going on: their busy time (some fetch in flight) over the bytes
 * is the rate the stats report. */
static void busy_begin(cluster_tier *t) {
  pthread_mutex_lock(&t->busy_lock);
  if (t->busy++ == 0) t->busy_since_ns = oi__now_ns();
  pthread_mutex_unlock(&t->busy_lock);
}

static void busy_end(cluster_tier *t) {
  pthread_mutex_lock(&t->busy_lock);
  if (--t->busy == 0) atomic_fetch_add(&t->fetch_ns, oi__now_ns() - t->busy_since_ns);
  pthread_mutex_unlock(&t->busy_lock);
}

/* Withdraws the directory entries of the items not fetched (ok[i] false). */
static void drop_entries(cluster_tier *t, const fetch_item *items, size_t n, const bool *ok) {
  oi_tier_key *keys = oi__malloc(n * sizeof *keys);
  oi_dir_holder *hs = oi__malloc(n * sizeof *hs);
  size_t k = 0, removed = 0;
  for (size_t i = 0; keys && hs && i < n; i++)
    if (!ok || !ok[i]) {
      keys[k] = items[i].key;
      hs[k++] = items[i].holder;
    }
  if (k && oi__dir_drop(t->dir, keys, hs, k, &removed) == OI_OK)
    atomic_fetch_add(&t->stale_removed, removed);
  oi__free(keys);
  oi__free(hs);
}

/* Fetches items[0..n) (one holder) into their slots; seals what verified. */
static void fetch_from(cluster_tier *t, fetch_job *j, fetch_item *items, size_t n) {
  bool *ok = oi__calloc(n, sizeof *ok);
  uint8_t *req = oi__malloc(LEASE_BYTES(n));
  oi_peer_read *reads = oi__malloc(n * sizeof *reads);
  uint64_t *sums = oi__malloc(n * sizeof *sums);
  void *reply = NULL;
  size_t rlen = 0, m = 0;
  uint64_t lease_id = 0;
  bool stale = false, failed = false, busy = false;
  oi_status down = OI_OK; /* a holder failure: it is down */
  oi_peer *p = NULL;
  int slot = -1;
  if (!ok || !req || !reads || !sums) goto end;
  if (is_down(t, &items[0].holder)) goto end; /* queued before it went down: misses now */
  busy_begin(t);
  busy = true;
  atomic_fetch_add(&t->fetches, 1);
  slot = peer_get(t, &items[0].holder, &stale, &down);
  if (slot < 0) goto end;
  p = t->peers[slot].peer; /* stable while we hold the slot */
  put_hdr(req, MSG_LEASE);
  put64(req + HDR_BYTES, items[0].key.ns_fp);
  put64(req + HDR_BYTES + 8, items[0].key.layout_fp);
  put32(req + HDR_BYTES + 16, (uint32_t)n);
  put32(req + HDR_BYTES + 20, 0);
  for (size_t i = 0; i < n; i++)
    memcpy(req + HDR_BYTES + 24 + 16 * i, items[i].key.hash, 16);
  oi_status st = oi__peer_call(p, req, LEASE_BYTES(n), &reply, &rlen, t->timeout_ms);
  if (st != OI_OK) {
    OI_LOG(OI_LOG_INFO, "cluster", "lease from node '%s': %s", items[0].holder.node_id,
           oi_last_error());
    failed = st == OI_ERR_CLOSED || st == OI_ERR_IO;
    down = st; /* refused, gone or silent: its entries go (below) */
    goto end;
  }
  if (oi__cluster_msg_type(reply, rlen, true) != MSG_LEASE_REPLY) {
    OI_LOG(OI_LOG_WARN, "cluster", "node '%s' answered a lease badly: %s", items[0].holder.node_id,
           oi_last_error());
    goto end;
  }
  const uint8_t *rp = reply;
  lease_id = get64(rp + HDR_BYTES);
  m = get32(rp + HDR_BYTES + 8);
  if (m > n) m = 0; /* more than asked for: not believed */
  for (size_t i = 0; i < m; i++) {
    const uint8_t *e = rp + LEASE_REPLY_BYTES(i);
    uint64_t len = get64(e + 8);
    if (len != j->block_bytes) { /* another layout after all: none of it */
      m = i;
      break;
    }
    reads[i] = (oi_peer_read){.remote_offset = get64(e), .len = len, .local_dst = items[i].data};
    sums[i] = get64(e + 16);
  }
  if (m) {
    st = oi__peer_get(p, reads, m, t->timeout_ms);
    if (st == OI_OK) {
      for (size_t i = 0; i < m; i++)
        ok[i] = XXH3_64bits(items[i].data, j->block_bytes) == sums[i];
    } else {
      OI_LOG(OI_LOG_INFO, "cluster", "reading %zu blocks from node '%s': %s", m,
             items[0].holder.node_id, oi_last_error());
      failed = st != OI_ERR_INVALID_ARGUMENT; /* the connection is dead after a failed read */
      if (holder_failure(st)) down = st;
    }
  }
  if (!failed && lease_id) {
    /* Best effort, and not waited for: the holder's lease expires anyway,
     * and its answer says nothing the reader needs. */
    uint8_t rel[RELEASE_BYTES];
    put_hdr(rel, MSG_RELEASE);
    put64(rel + HDR_BYTES, lease_id);
    if (oi__peer_send(p, rel, sizeof rel, t->timeout_ms) != OI_OK)
      OI_LOG(OI_LOG_DEBUG, "cluster", "release at node '%s': %s", items[0].holder.node_id,
             oi_last_error());
  }
  /* The holder leases the leading run it holds: the first block past it is
   * not there (its entry is stale); the ones after may be, and just miss. */
  stale = stale || m < n;
end:
  /* The first failure marks the holder down: the other fetches of it in
   * flight end now, the queued ones and later queries miss at once. */
  if (down != OI_OK && holder_failure(down)) mark_down(t, &items[0].holder, down);
  if (slot >= 0) peer_put(t, slot, failed);
  if (busy) busy_end(t);
  for (size_t i = 0; i < n; i++) {
    bool good = ok && ok[i];
    if (good) { /* counted before the seal, which may end a query's wait */
      atomic_fetch_add(&t->remote_blocks, 1);
      atomic_fetch_add(&t->bytes_fetched, j->block_bytes);
    }
    oi__tier_promote_end(t->link, j->ns, items[i].b, good, good ? j->block_bytes : 0, 0);
    if (!good) {
      atomic_fetch_add(&t->remote_failed, 1);
      bool holder_gone = slot < 0; /* no connection: every entry of it is stale */
      if (stale && (holder_gone || i == m) &&
          oi__dir_remove_stale(t->dir, &items[i].key, &items[i].holder) == OI_OK)
        atomic_fetch_add(&t->stale_removed, 1);
    }
  }
  /* A holder that could not be reached or refused: its entries are
   * withdrawn (each only while it is still the record read), so that the
   * next queries miss at once instead of trying it again. */
  if (down != OI_OK || failed) drop_entries(t, items, n, ok);
  oi__free(ok);
  oi__free(req);
  oi__free(reads);
  oi__free(sums);
  oi__free(reply);
}

static void run_job(cluster_tier *t, fetch_job *j) {
  /* Runs of one holder, in prefix order. */
  for (size_t a = 0; a < j->n;) {
    size_t b = a + 1;
    while (b < j->n && !strcmp(j->items[b].holder.node_id, j->items[a].holder.node_id) &&
           j->items[b].holder.epoch == j->items[a].holder.epoch)
      b++;
    fetch_from(t, j, j->items + a, b - a);
    a = b;
  }
}

/* The tier's lookup: who holds the leading run of keys (one directory round
 * trip); *claim: their holders, for promote. */
size_t oi__cluster_tier_lookup(void *self, const oi_tier_key *keys, size_t n, void **claim) {
  cluster_tier *t = self;
  if (n == 0) return 0;
  n = OI_MIN(n, (size_t)OI_CLUSTER_MAX_LEASE);
  oi_dir_holder *holders = oi__malloc(n * sizeof *holders);
  size_t run = 0;
  if (!holders) return 0;
  atomic_fetch_add(&t->lookups, 1);
  if (oi__dir_lookup(t->dir, keys, n, holders, &run) != OI_OK) run = 0; /* degraded: local only */
  for (size_t i = 0; i < run; i++)
    if (!strcmp(holders[i].node_id, t->node_id)) { /* ours, yet not here: gone since */
      run = i;
      break;
    }
  if (run && atomic_load(&t->ndown)) { /* a down holder's blocks miss now, not in a deadline */
    pthread_mutex_lock(&t->peer_lock);
    for (size_t i = 0; i < run; i++)
      if ((i == 0 || strcmp(holders[i].node_id, holders[i - 1].node_id) ||
           holders[i].epoch != holders[i - 1].epoch) &&
          is_down_locked(t, &holders[i])) {
        run = i;
        break;
      }
    pthread_mutex_unlock(&t->peer_lock);
  }
  if (run == 0) {
    oi__free(holders);
    return 0;
  }
  *claim = holders;
  return run;
}

/* The tier's promote: fetch jobs for the slots, from their holders. */
size_t oi__cluster_tier_promote(void *self, void *claim, oi_host_ns ns, uint64_t bb,
                                const oi_tier_key *keys, const oi_tier_slot *slots, size_t k) {
  cluster_tier *t = self;
  oi_dir_holder *holders = claim;
  fetch_job *j = NULL;
  size_t started = 0;
  if (k == 0) goto out;
  j = oi__calloc(1, sizeof *j + k * sizeof j->items[0]);
  if (!j) { /* the slots go: misses */
    for (size_t i = 0; i < k; i++)
      oi__tier_promote_end(t->link, ns, slots[i].block, false, 0, 0);
    goto out;
  }
  j->ns = ns;
  j->block_bytes = bb;
  for (size_t i = 0; i < k; i++)
    j->items[j->n++] = (fetch_item){.b = slots[i].block,
                                    .data = slots[i].data,
                                    .key = keys[slots[i].idx],
                                    .holder = holders[slots[i].idx]};
  started = j->n;
  /* Jobs of about FETCH_JOB_BYTES, in prefix order: the fetchers take them
   * in parallel, so one job's lease, reads and checksums overlap another's. */
  size_t chunk = (size_t)OI_MAX(1u, OI_MIN(FETCH_JOB_BYTES / bb, OI_CLUSTER_MAX_LEASE));
  fetch_job *first = NULL, **tail = &first;
  for (size_t a = 0; a < j->n; a += chunk) {
    size_t k = OI_MIN(chunk, j->n - a);
    fetch_job *cj = oi__malloc(sizeof *cj + k * sizeof cj->items[0]);
    if (!cj) { /* the rest of the run goes: slots freed, misses */
      for (size_t i = a; i < j->n; i++)
        oi__tier_promote_end(t->link, ns, j->items[i].b, false, 0, 0);
      started = a;
      break;
    }
    cj->next = NULL;
    cj->ns = ns;
    cj->block_bytes = bb;
    cj->n = k;
    memcpy(cj->items, j->items + a, k * sizeof cj->items[0]);
    *tail = cj;
    tail = &cj->next;
  }
  pthread_mutex_lock(&t->lock);
  if (t->stop) { /* stopping: nothing starts now */
    pthread_mutex_unlock(&t->lock);
    while (first) {
      fetch_job *cj = first;
      first = cj->next;
      for (size_t i = 0; i < cj->n; i++)
        oi__tier_promote_end(t->link, ns, cj->items[i].b, false, 0, 0);
      oi__free(cj);
    }
    started = 0;
    goto out;
  }
  if (first) {
    if (t->jobs_tail)
      t->jobs_tail->next = first;
    else
      t->jobs = first;
    fetch_job *last = first;
    while (last->next)
      last = last->next;
    t->jobs_tail = last;
    pthread_cond_broadcast(&t->jcv);
  }
  pthread_mutex_unlock(&t->lock);
out:
  oi__free(j);
  oi__free(holders);
  return started;
}

/* A fetcher: runs fetch jobs; when stopping, drops what is queued. */
void *oi__cluster_fetcher_main(void *arg) {
  cluster_tier *t = arg;
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (!t->stop && !t->jobs)
      pthread_cond_wait(&t->jcv, &t->lock);
    fetch_job *j = t->jobs;
    if (j) {
      t->jobs = j->next;
      if (!t->jobs) t->jobs_tail = NULL;
    }
    bool stop = t->stop;
    pthread_mutex_unlock(&t->lock);
    if (!j) return NULL; /* stopping, nothing queued */
    if (stop)
      for (size_t i = 0; i < j->n; i++)
        oi__tier_promote_end(t->link, j->ns, j->items[i].b, false, 0, 0);
    else
      run_job(t, j);
    oi__free(j);
  }
}
