/* The query (host.h): the pool, then the tier chain (tier.h) in order, with
 * one probe of the pool; then, for a prefix query, the wait for what is in
 * flight and the lease. */
#include <string.h>

#include "host_private.h"

/* Reserves pool slots for hashes[0..n) of a promotion (a reserve sink). */
typedef struct promote_slots {
  oi_tier_slot *slots;
  size_t k;
} promote_slots;

static void slots_accepted(void *ctx, const size_t *idx, host_block *const *blocks,
                           uint8_t *const *data, size_t k) {
  promote_slots *p = ctx;
  for (size_t j = 0; j < k; j++)
    p->slots[p->k++] = (oi_tier_slot){.idx = idx[j], .block = blocks[j], .data = data[j]};
}

/* Walks the chain past position `pos` (the pool's sealed prefix and its run
 * in flight): each tier promotes the leading run it holds of what is left,
 * and the next one starts past that run. @return the blocks being
 * promoted; *end: the position past the last run. */
static size_t walk(oi_host *h, const tier_chain *c, oi_host_ns ns, const oi_block_hash *hashes,
                   size_t n, size_t pos, size_t *end, uint8_t *where) {
  size_t promoted = 0, from = pos; /* keys[i] is the key of hashes[from + i] */
  uint64_t block_bytes = 0;
  oi_tier_key *keys = oi__malloc((n - from) * sizeof *keys);
  oi_tier_slot *slots = oi__malloc((n - from) * sizeof *slots);
  if (!keys || !slots || !oi__tier_make_keys(h, ns.id, hashes + from, n - from, keys, &block_bytes))
    goto out;
  for (size_t i = 0; i < c->n && pos < n; i++) {
    const oi_tier *t = c->links[i];
    if (!t->ops->lookup) continue;
    const oi_tier_key *k = keys + (pos - from);
    void *claim = NULL;
    size_t run = t->ops->lookup(t->self, k, n - pos, &claim);
    if (run == 0) continue;
    /* Pool slots in flight for the run (blocks the pool got meanwhile are
     * deduplicated), filled by the tier in prefix order. */
    promote_slots ps = {.slots = slots};
    oi_host_reserve_sink sink = {.accepted = slots_accepted, .ctx = &ps, .promotion = true};
    oi_host_reserved r;
    oi__host_reserve(h, ns, hashes + pos, run, &sink, &r);
    int rate = oi__rate_of_where(t->ops->where);
    if (rate >= 0) oi__rate_busy_begin(h, rate, ps.k); /* each slot ends once */
    promoted += t->ops->promote(t->self, claim, ns, block_bytes, k, ps.slots, ps.k);
    if (where) memset(where + pos, (int)t->ops->where, run);
    pos += run;
  }
out:
  oi__free(keys);
  oi__free(slots);
  *end = pos;
  return promoted;
}

/* Membership: the pool's, then each tier's that answers it. */
static void membership(oi_host *h, const tier_chain *c, oi_host_ns ns, const oi_host_query_args *a,
                       const oi_block_hash *hashes, size_t n, oi_host_answer *r) {
  oi__host_membership(h, ns, hashes, n, a->present, &r->hit_blocks, &r->pending_blocks);
  uint8_t *where = a->where;
  for (size_t i = 0; where && i < n; i++)
    where[i] = a->present[i] ? OI_WHERE_POOL : OI_WHERE_NONE;
  if (!c || r->hit_blocks >= n) return;
  oi_tier_key *keys = oi__malloc(n * sizeof *keys);
  if (keys && oi__tier_make_keys(h, ns.id, hashes, n, keys, NULL))
    for (size_t i = 0; i < c->n && r->hit_blocks < n; i++) {
      const oi_tier *t = c->links[i];
      if (!t->ops->contains) continue;
      r->hit_blocks += t->ops->contains(t->self, keys, n, a->present);
      for (size_t j = 0; where && j < n; j++) /* what this tier added is its */
        if (a->present[j] && where[j] == OI_WHERE_NONE) where[j] = (uint8_t)t->ops->where;
    }
  oi__free(keys);
}

oi_status oi__host_query_ns(oi_host *h, oi_host_ns ns, const oi_host_query_args *a,
                            const oi_block_hash *hashes, size_t n, oi_host_answer *r) {
  memset(r, 0, sizeof *r);
  const tier_chain *c = atomic_load_explicit(&h->chain, memory_order_acquire);
  if (a->where && n) memset(a->where, OI_WHERE_NONE, n);
  if (a->membership) {
    membership(h, c, ns, a, hashes, n, r);
    return OI_OK;
  }
  size_t promoted = 0;
  uint64_t sealed = 0, pending = 0;
  bool probed = false;
  if (c) { /* the query's one probe of the pool */
    oi__host_prefix_probe(h, ns, hashes, n, &sealed, &pending);
    probed = true;
    size_t end = (size_t)(sealed + pending);
    if (end < n) promoted = walk(h, c, ns, hashes, n, end, &end, a->where);
    pending = end - sealed; /* what the promotions put in flight joins the pending run */
  }
  if (a->wait_ms) {
    uint64_t deadline = oi__deadline_ns(a->wait_ms);
    for (;;) {
      if (!probed) oi__host_prefix_probe(h, ns, hashes, n, &sealed, &pending);
      probed = false;
      if (pending == 0 || oi__now_ns() >= deadline) break;
      bool sealed_all = true;
      for (uint64_t i = sealed; i < sealed + pending && sealed_all; i++)
        sealed_all = oi__host_wait_not_in_flight(h, ns, &hashes[i], deadline);
      if (!sealed_all) break; /* wait_ms passed: what is still in flight stays pending */
    }
  }
  oi_status st = oi__host_lease_prefix(h, ns, a->instance, a->principal, a->shares, hashes, n,
                                       &r->hit_blocks, &r->pending_blocks, &r->lease);
  r->loading = st == OI_OK && promoted && r->pending_blocks;
  /* The pool's runs: the hits and what is in flight there (the runs the
   * tiers promote were named by the walk). */
  uint64_t held = st == OI_OK ? r->hit_blocks + r->pending_blocks : 0;
  for (uint64_t i = 0; a->where && i < n; i++)
    if (i >= held)
      a->where[i] = OI_WHERE_NONE;
    else if (a->where[i] == OI_WHERE_NONE)
      a->where[i] = OI_WHERE_POOL;
  return st;
}

oi_status oi__host_query(oi_host *h, const char *namespace_id, const oi_host_query_args *a,
                         const oi_block_hash *hashes, size_t n, oi_host_answer *r) {
  oi_host_ns ns;
  if (!oi__host_find_namespace(h, namespace_id, &ns)) {
    /* Nothing was ever saved there: every block misses. */
    memset(r, 0, sizeof *r);
    if (a->membership && n) memset(a->present, 0, n);
    if (a->where && n) memset(a->where, OI_WHERE_NONE, n);
    return OI_OK;
  }
  return oi__host_query_ns(h, ns, a, hashes, n, r);
}

oi_status oi__host_lookup_release(oi_host *h, const char *namespace_id, oi_host_principal principal,
                                  oi_lease lease) {
  oi_host_ns ns;
  if (!oi__host_find_namespace(h, namespace_id, &ns))
    return oi__fail(OI_ERR_LEASE_EXPIRED,
                    "release: lease unknown (namespace '%s' holds nothing on this host)",
                    namespace_id);
  return oi__host_release(h, ns, principal, lease);
}
