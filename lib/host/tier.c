/* The tier chain (tier.h): attaching tiers in rank order, telling them of
 * seals and evictions, ending their promotions, their keys, and their
 * destroy at the host's. The query's walk of the chain is query.c's; the
 * spill queue is spill.c's. */
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "host_private.h"

#define TIER_MAX 8 /* tiers in one chain */

void oi__tier_init(oi_host *h) {
  pthread_mutex_init(&h->tier_lock, NULL);
  pthread_rwlock_init(&h->tier_notify_lock, NULL);
  atomic_store(&h->chain, NULL);
  atomic_store(&h->notifying, false);
  atomic_store(&h->spill_tier, NULL);
  oi__spill_init(h);
}

static bool listens(const oi_tier *t) { return t->ops->sealed || t->ops->evicted; }

/* Publishes `links` (k of them, in rank order) as the chain; the snapshot
 * it replaces is kept until the host's destroy (a query may read it).
 * tier_lock held. */
static oi_status publish_locked(oi_host *h, oi_tier *const *links, size_t k) {
  tier_chain *c = NULL;
  if (k) {
    c = oi__malloc(sizeof *c + k * sizeof c->links[0]);
    if (!c) return oi__fail(OI_ERR_OUT_OF_MEMORY, "tier chain: out of memory");
    c->older = NULL;
    c->n = k;
    memcpy(c->links, links, k * sizeof links[0]);
  }
  tier_chain *old = atomic_exchange_explicit(&h->chain, c, memory_order_acq_rel);
  if (old) {
    old->older = h->chains_old;
    h->chains_old = old;
  }
  return OI_OK;
}

oi_status oi__host_tier_attach(oi_host *h, const oi_tier_ops *ops, void *self, oi_tier **out) {
  pthread_mutex_lock(&h->tier_lock);
  tier_chain *c = atomic_load_explicit(&h->chain, memory_order_relaxed);
  size_t n = c ? c->n : 0;
  oi_status st = OI_OK;
  for (size_t i = 0; i < n && st == OI_OK; i++) {
    if (c->links[i]->ops == ops)
      st = oi__fail(OI_ERR_STATE, "a %s tier is attached to this host already", ops->name);
    else if ((ops->flags & OI_TIER_SPILLS) && (c->links[i]->ops->flags & OI_TIER_SPILLS))
      st = oi__fail(OI_ERR_STATE, "a tier that takes spills (%s) is attached to this host already",
                    c->links[i]->ops->name);
  }
  if (st == OI_OK && n == TIER_MAX)
    st = oi__fail(OI_ERR_STATE, "this host has %d tiers attached already", TIER_MAX);
  oi_tier *t = st == OI_OK ? oi__calloc(1, sizeof *t) : NULL;
  if (st == OI_OK && !t) st = oi__fail(OI_ERR_OUT_OF_MEMORY, "tier attach: out of memory");
  if (st != OI_OK) {
    pthread_mutex_unlock(&h->tier_lock);
    return st;
  }
  *t = (oi_tier){.host = h, .ops = ops, .self = self};
  oi_tier *links[TIER_MAX];
  size_t k = 0, i = 0;
  for (; i < n && c->links[i]->ops->rank <= ops->rank; i++)
    links[k++] = c->links[i];
  links[k++] = t;
  for (; i < n; i++)
    links[k++] = c->links[i];
  if ((st = publish_locked(h, links, k)) != OI_OK) {
    pthread_mutex_unlock(&h->tier_lock);
    oi__free(t);
    return st;
  }
  t->next_link = h->tier_links;
  h->tier_links = t;
  if (ops->flags & OI_TIER_SPILLS) {
    pthread_mutex_lock(&h->spill_lock);
    atomic_store_explicit(&h->spill_tier, t, memory_order_release);
    pthread_mutex_unlock(&h->spill_lock);
  }
  if (listens(t)) {
    pthread_rwlock_wrlock(&h->tier_notify_lock);
    t->notify = true;
    atomic_store(&h->notifying, true);
    pthread_rwlock_unlock(&h->tier_notify_lock);
  }
  pthread_mutex_unlock(&h->tier_lock);
  if (out) *out = t;
  return OI_OK;
}

/* Whether any link of the chain still listens (tier_notify_lock held). */
static bool any_listens(const tier_chain *c) {
  for (size_t i = 0; c && i < c->n; i++)
    if (c->links[i]->notify) return true;
  return false;
}

/* Stops telling `t` of seals and evictions; waits for calls in progress. */
static void mute(oi_host *h, oi_tier *t) {
  pthread_rwlock_wrlock(&h->tier_notify_lock);
  t->notify = false;
  atomic_store(&h->notifying, any_listens(atomic_load(&h->chain)));
  pthread_rwlock_unlock(&h->tier_notify_lock);
}

void oi__host_tier_detach(oi_host *h, oi_tier *t) {
  pthread_mutex_lock(&h->tier_lock);
  tier_chain *c = atomic_load_explicit(&h->chain, memory_order_relaxed);
  oi_tier *links[TIER_MAX];
  size_t k = 0;
  for (size_t i = 0; c && i < c->n; i++)
    if (c->links[i] != t) links[k++] = c->links[i];
  if (c && k < c->n && publish_locked(h, links, k) == OI_OK) {
    mute(h, t);
    if (atomic_load(&h->spill_tier) == t) {
      pthread_mutex_lock(&h->spill_lock);
      atomic_store(&h->spill_tier, NULL);
      pthread_mutex_unlock(&h->spill_lock);
    }
  }
  pthread_mutex_unlock(&h->tier_lock);
}

void *oi__host_tier_find(const oi_host *h, const oi_tier_ops *ops) {
  const tier_chain *c = atomic_load_explicit(&((oi_host *)h)->chain, memory_order_acquire);
  for (size_t i = 0; c && i < c->n; i++)
    if (c->links[i]->ops == ops) return c->links[i]->self;
  return NULL;
}

oi_status oi__host_tier_stats(const oi_host *h, const oi_tier_ops *ops, void *out,
                              const char *what) {
  void *self = oi__host_tier_find(h, ops);
  if (!self) return oi__fail(OI_ERR_NOT_FOUND, "%s: no %s tier is attached", what, ops->name);
  if (!ops->stats)
    return oi__fail(OI_ERR_UNSUPPORTED, "%s: the %s tier keeps no statistics", what, ops->name);
  return ops->stats(self, out);
}

/* ---- notifications ---- */

static void note(oi_host *h, host_block *const *blocks, size_t n, bool sealed) {
  if (!n || !atomic_load_explicit(&h->notifying, memory_order_relaxed)) return;
  pthread_rwlock_rdlock(&h->tier_notify_lock);
  const tier_chain *c = atomic_load_explicit(&h->chain, memory_order_acquire);
  for (size_t t = 0; c && t < c->n; t++) {
    const oi_tier *l = c->links[t];
    void (*fn)(void *, uint32_t, const oi_block_hash *) = sealed ? l->ops->sealed : l->ops->evicted;
    if (!l->notify || !fn) continue;
    for (size_t i = 0; i < n; i++)
      fn(l->self, blocks[i]->ns, &blocks[i]->hash);
  }
  pthread_rwlock_unlock(&h->tier_notify_lock);
}

void oi__tier_note_sealed(oi_host *h, host_block *const *blocks, size_t n) {
  note(h, blocks, n, true);
}

void oi__tier_note_evicted(oi_host *h, host_block *const *blocks, size_t n) {
  note(h, blocks, n, false);
}

/* ---- promotions ---- */

void oi__tier_promote_end(oi_tier *t, oi_host_ns ns, host_block *block, bool ok, uint64_t bytes,
                          uint64_t latency_ns) {
  oi_host *h = t->host;
  if (ok && (t->ops->flags & OI_TIER_SPILLS)) { /* it holds the block: not written back again */
    index_shard *s = oi__block_shard(h, block);
    pthread_mutex_lock(&s->lock);
    block->lower = 1;
    pthread_mutex_unlock(&s->lock);
  }
  /* The tier counts its own bytes (a promotion is no save); the host's
   * estimate of the tier's read rate takes them. */
  (void)latency_ns;
  int rate = oi__rate_of_where(t->ops->where);
  if (rate >= 0) oi__rate_busy_end(h, rate, bytes, ok);
  oi__host_promote_end(h, ns, &block, 1, ok);
}

/* ---- keys ---- */

bool oi__tier_make_keys(oi_host *h, uint32_t ns, const oi_block_hash *hashes, size_t n,
                        oi_tier_key *keys, uint64_t *block_bytes) {
  uint64_t ns_fp, layout_fp;
  if (!oi__host_namespace_fps(h, ns, &ns_fp, &layout_fp, block_bytes)) return false;
  for (size_t i = 0; i < n; i++) {
    keys[i].ns_fp = ns_fp;
    memcpy(keys[i].hash, hashes[i].bytes, sizeof keys[i].hash);
    keys[i].layout_fp = layout_fp;
  }
  return true;
}

bool oi__host_namespace_fps(oi_host *h, uint32_t ns_id, uint64_t *ns_fp, uint64_t *layout_fp,
                            uint64_t *block_bytes) {
  char name[256];
  uint64_t bb, shape;
  if (!oi__host_namespace_info(h, ns_id, name, sizeof name, &bb, &shape)) return false;
  if (ns_fp) *ns_fp = XXH3_64bits(name, strlen(name));
  if (layout_fp) *layout_fp = shape ^ (bb * 0x9E3779B97F4A7C15ull);
  if (block_bytes) *block_bytes = bb;
  return true;
}

bool oi__host_namespace_info(oi_host *h, uint32_t ns_id, char *name, size_t cap,
                             uint64_t *block_bytes, uint64_t *shape_hash) {
  pthread_mutex_lock(&h->ns_lock);
  bool ok = ns_id >= 1 && ns_id <= h->nns;
  if (ok) {
    const ns_entry *e = &h->ns[ns_id - 1];
    if (name && cap) snprintf(name, cap, "%s", e->name);
    if (block_bytes) *block_bytes = e->block_bytes;
    if (shape_hash) *shape_hash = e->shape_hash;
  }
  pthread_mutex_unlock(&h->ns_lock);
  return ok;
}

/* ---- destroy ---- */

/* Destroys the chain's tiers that do (not) take spills, farthest first. */
static void destroy_tiers(oi_host *h, bool spilling) {
  pthread_mutex_lock(&h->tier_lock);
  tier_chain *c = atomic_load(&h->chain);
  size_t n = c ? c->n : 0;
  pthread_mutex_unlock(&h->tier_lock);
  for (size_t i = n; i-- > 0;) {
    oi_tier *t = c->links[i];
    if (t->destroyed || !!(t->ops->flags & OI_TIER_SPILLS) != spilling) continue;
    t->destroyed = true;
    if (t->ops->destroy)
      t->ops->destroy(t->self); /* stops its threads: nothing uses the host after */
    if (spilling) {
      pthread_mutex_lock(&h->spill_lock);
      atomic_store(&h->spill_tier, NULL);
      pthread_mutex_unlock(&h->spill_lock);
    }
  }
}

void oi__tier_fini_upper(oi_host *h) {
  pthread_rwlock_wrlock(&h->tier_notify_lock);
  const tier_chain *c = atomic_load(&h->chain);
  for (size_t i = 0; c && i < c->n; i++)
    c->links[i]->notify = false;
  atomic_store(&h->notifying, false);
  pthread_rwlock_unlock(&h->tier_notify_lock);
  destroy_tiers(h, false);
}

void oi__tier_fini(oi_host *h) {
  destroy_tiers(h, false); /* none left unless oi__tier_fini_upper was skipped */
  destroy_tiers(h, true);
  oi__spill_fini(h);
  tier_chain *c = atomic_exchange(&h->chain, NULL);
  oi__free(c);
  while (h->chains_old) {
    c = h->chains_old;
    h->chains_old = c->older;
    oi__free(c);
  }
  while (h->tier_links) {
    oi_tier *t = h->tier_links;
    h->tier_links = t->next_link;
    oi__free(t);
  }
  pthread_rwlock_destroy(&h->tier_notify_lock);
  pthread_mutex_destroy(&h->tier_lock);
}
