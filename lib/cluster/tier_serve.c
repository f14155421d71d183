/* The cluster tier's holder side (tier_internal.h): answering peers' LEASEs
 * (on SERVERS threads: pins, and a checksum of every block leased) and
 * RELEASEs (on the peer transport's progress thread), and ending the leases
 * peers did not release in time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cluster/tier_internal.h"

/* The local namespace whose name and layout have these fingerprints. */
static bool find_ns(cluster_tier *t, uint64_t ns_fp, uint64_t layout_fp, oi_host_ns *out,
                    uint64_t *block_bytes) {
  char name[256];
  for (uint32_t id = 1;; id++) {
    uint64_t nf, lf, bb;
    if (!oi__host_namespace_fps(t->host, id, &nf, &lf, &bb)) return false;
    if (nf != ns_fp || lf != layout_fp) continue;
    if (!oi__host_namespace_info(t->host, id, name, sizeof name, NULL, NULL) ||
        !oi__host_find_namespace(t->host, name, out))
      return false;
    *block_bytes = bb;
    return true;
  }
}

/* ---- holder: answering peers ---- */

static void lease_end(cluster_tier *t, remote_lease *l, bool ok) {
  oi__host_load_end(t->host, l->blocks, l->n, ok, ok ? l->bytes : 0, 0);
  oi__free(l->blocks);
  oi__free(l);
}

static void answer_lease(cluster_tier *t, const char *peer, const uint8_t *m, oi_peer_reply *r) {
  uint64_t ns_fp = get64(m + HDR_BYTES), layout_fp = get64(m + HDR_BYTES + 8);
  uint32_t n = get32(m + HDR_BYTES + 16);
  const uint8_t *hp = m + HDR_BYTES + 24;
  oi_block_hash hashes[OI_CLUSTER_MAX_LEASE];
  for (uint32_t i = 0; i < n; i++)
    memcpy(hashes[i].bytes, hp + 16 * (size_t)i, 16);
  oi_host_ns ns;
  uint64_t bb = 0, hits = 0;
  oi_lease lease;
  host_block **blocks = NULL;
  remote_lease *l = NULL;
  uint8_t *out = NULL;
  /* Namespaces are enforced here: only blocks of the namespace and layout
   * named, and only the leading run this node holds sealed. */
  if (find_ns(t, ns_fp, layout_fp, &ns, &bb) &&
      oi__host_lease_prefix(t->host, ns, 0, CLUSTER_PRINCIPAL, 1, hashes, n, &hits, NULL, &lease) ==
          OI_OK &&
      hits > 0) {
    blocks = oi__malloc(hits * sizeof *blocks);
    l = oi__calloc(1, sizeof *l);
    if (!blocks || !l ||
        oi__host_load_begin(t->host, ns, CLUSTER_PRINCIPAL, lease, hits, blocks, NULL) != OI_OK) {
      oi__host_release(t->host, ns, CLUSTER_PRINCIPAL, lease);
      oi__free(blocks);
      oi__free(l);
      blocks = NULL;
      l = NULL;
      hits = 0;
    }
  } else {
    hits = 0;
  }
  size_t len = LEASE_REPLY_BYTES(hits);
  out = oi__malloc(len);
  if (!out) {
    if (l) {
      l->blocks = blocks;
      l->n = hits;
      lease_end(t, l, false);
    }
    oi__peer_reply_status(r, OI_ERR_OUT_OF_MEMORY);
    return;
  }
  put_hdr(out, MSG_LEASE_REPLY);
  uint64_t id = 0;
  if (l) {
    pthread_mutex_lock(&t->lease_lock);
    id = ++t->next_lease;
    pthread_mutex_unlock(&t->lease_lock);
  }
  put64(out + HDR_BYTES, id);
  put32(out + HDR_BYTES + 8, (uint32_t)hits);
  put32(out + HDR_BYTES + 12, 0);
  for (uint64_t i = 0; i < hits; i++) {
    uint8_t *data = oi__host_block_data(t->host, blocks[i]);
    uint8_t *e = out + LEASE_REPLY_BYTES(i);
    put64(e, (uint64_t)(data - t->pool_base));
    put64(e + 8, bb);
    put64(e + 16, XXH3_64bits(data, bb));
  }
  if (l) {
    *l = (remote_lease){.id = id,
                        .deadline_ns = oi__deadline_ns(4 * t->timeout_ms),
                        .bytes = hits * bb,
                        .n = hits,
                        .blocks = blocks};
    snprintf(l->peer, sizeof l->peer, "%s", peer);
    pthread_mutex_lock(&t->lease_lock);
    l->next = t->leases;
    t->leases = l;
    pthread_mutex_unlock(&t->lease_lock);
    atomic_fetch_add(&t->served_blocks, hits);
    atomic_fetch_add(&t->bytes_served, hits * bb);
  }
  if (oi__peer_reply_set(r, out, len) != OI_OK) oi__peer_reply_status(r, OI_ERR_OUT_OF_MEMORY);
  oi__free(out);
}

static void answer_release(cluster_tier *t, const char *peer, const uint8_t *m, oi_peer_reply *r) {
  uint64_t id = get64(m + HDR_BYTES);
  remote_lease *found = NULL;
  pthread_mutex_lock(&t->lease_lock);
  for (remote_lease **p = &t->leases; *p; p = &(*p)->next)
    if ((*p)->id == id && !strcmp((*p)->peer, peer)) { /* another node's: not found */
      found = *p;
      *p = found->next;
      break;
    }
  pthread_mutex_unlock(&t->lease_lock);
  if (found) lease_end(t, found, true);
  uint8_t out[HDR_BYTES];
  put_hdr(out, MSG_RELEASE_REPLY);
  if (oi__peer_reply_set(r, out, sizeof out) != OI_OK)
    oi__peer_reply_status(r, OI_ERR_OUT_OF_MEMORY);
}

/* Hands a LEASE to the server threads (false: answer it here). */
static bool serve_later(cluster_tier *t, const char *peer, const void *req, size_t len,
                        oi_peer_reply *r) {
  serve_job *sj = oi__malloc(sizeof *sj + len);
  if (!sj) return false;
  bool queued = false;
  pthread_mutex_lock(&t->slock);
  if (!t->sstop && t->nservers > 0 && t->sq_len < SERVE_QUEUE_MAX &&
      (sj->ticket = oi__peer_defer(r)) != NULL) {
    sj->next = NULL;
    snprintf(sj->peer, sizeof sj->peer, "%s", peer);
    sj->len = len;
    memcpy(sj->msg, req, len);
    if (t->sq_tail)
      t->sq_tail->next = sj;
    else
      t->sq = sj;
    t->sq_tail = sj;
    t->sq_len++;
    pthread_cond_signal(&t->scv);
    queued = true;
  }
  pthread_mutex_unlock(&t->slock);
  if (!queued) oi__free(sj);
  return queued;
}

void oi__cluster_on_request(void *ctx, const char *peer_node_id, const void *req, size_t len,
                            oi_peer_reply *r) {
  cluster_tier *t = ctx;
  int type = oi__cluster_msg_type(req, len, false);
  if (!type) {
    OI_LOG(OI_LOG_WARN, "cluster", "refusing a request from node '%s': %s", peer_node_id,
           oi_last_error());
    oi__peer_reply_status(r, OI_ERR_PROTOCOL);
    return;
  }
  if (type == MSG_LEASE) {
    if (!serve_later(t, peer_node_id, req, len, r)) answer_lease(t, peer_node_id, req, r);
  } else {
    answer_release(t, peer_node_id, req, r);
  }
}

/* A server: answers queued LEASEs; when stopping, refuses what is queued. */
void *oi__cluster_server_main(void *arg) {
  cluster_tier *t = arg;
  for (;;) {
    pthread_mutex_lock(&t->slock);
    while (!t->sstop && !t->sq)
      pthread_cond_wait(&t->scv, &t->slock);
    serve_job *sj = t->sq;
    if (sj) {
      t->sq = sj->next;
      if (!t->sq) t->sq_tail = NULL;
      t->sq_len--;
    }
    bool stop = t->sstop;
    pthread_mutex_unlock(&t->slock);
    if (!sj) return NULL; /* stopping, nothing queued */
    oi_peer_reply *r = oi__peer_ticket_reply(sj->ticket);
    if (stop)
      oi__peer_reply_status(r, OI_ERR_CLOSED);
    else
      answer_lease(t, sj->peer, sj->msg, r);
    oi__peer_answer(sj->ticket);
    oi__free(sj);
  }
}

/* Ends the leases peers did not release in time (a reader that died). A
 * late read of such a block may see its slot reused: the reader's checksum
 * catches that, and it is a miss there. */
void oi__cluster_expire_leases(cluster_tier *t, bool all) {
  uint64_t now = oi__now_ns();
  remote_lease *done = NULL;
  pthread_mutex_lock(&t->lease_lock);
  for (remote_lease **p = &t->leases; *p;) {
    remote_lease *l = *p;
    if (all || l->deadline_ns <= now) {
      *p = l->next;
      l->next = done;
      done = l;
    } else {
      p = &l->next;
    }
  }
  pthread_mutex_unlock(&t->lease_lock);
  while (done) {
    remote_lease *l = done;
    done = l->next;
    lease_end(t, l, false);
  }
}
