/* Restore or recompute (host.h, oi_plan_restore): the cost model of a
 * prompt's time to first token when its leading held blocks are loaded,
 * computed, or both at once, and the search for the cheapest split. The
 * model and its derivation: docs/planner.md. A pure function. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "openinfer/host.h"

#define GRID 256 /* candidate load ends tried in full below this many blocks */

typedef struct plan_model {
  double a, b;             /* prefill: a + b * position ns per token */
  double s, p, bt;         /* start and prompt tokens, tokens per block */
  double t_link;           /* ns to copy one block host -> device */
  double t_disk, t_remote; /* ns to read one block into the pool */
  double overhead;
  double layers;                     /* > 1: the load runs layer by layer under the suffix */
  bool staged;                       /* the tiers' reads end before the link copy starts */
  const uint64_t *n_disk, *n_remote; /* prefix counts of disk and remote blocks */
} plan_model;

/* Prefill of positions [p0, p1): sum over p of a + b p. */
static double compute_ns(const plan_model *m, double p0, double p1) {
  if (p1 <= p0) return 0;
  double n = p1 - p0;
  return m->a * n + m->b * n * (p0 + p1 - 1) / 2;
}

/* Loading blocks [c, e): the tiers read into the pool while earlier blocks
 * cross the link (a pipeline of two stages per block: the slower stage's
 * total, plus the one block the other stage adds at an end). */
static double load_ns(const plan_model *m, uint64_t c, uint64_t e) {
  double link = (double)(e - c) * m->t_link;
  double disk = (double)(m->n_disk[e] - m->n_disk[c]) * m->t_disk;
  double remote = (double)(m->n_remote[e] - m->n_remote[c]) * m->t_remote;
  if (m->staged) return m->overhead + fmax(disk, remote) + link;
  double t = link;
  if (disk > 0 && disk + m->t_link > t) t = disk + m->t_link;
  if (remote > 0 && remote + m->t_link > t) t = remote + m->t_link;
  return m->overhead + t;
}

/* The load of duration tl with the forward of the suffix (tx): after it,
 * or layer by layer under it. */
static double combine(const plan_model *m, double tl, double tx) {
  if (m->layers <= 1) return tl + tx;
  return fmax(tl, tx) + fmin(tl, tx) / m->layers;
}

/* Time to first token: compute blocks [0, c) while [c, e) load, then the
 * rest; e == c: compute everything. */
static double total_ns(const plan_model *m, uint64_t c, uint64_t e) {
  if (e == c) return compute_ns(m, m->s, m->p);
  double head_end = m->s + (double)c * m->bt, load_end = m->s + (double)e * m->bt;
  double head = compute_ns(m, m->s, head_end), sfx = compute_ns(m, load_end, m->p);
  return fmax(head + sfx, combine(m, load_ns(m, c, e), sfx));
}

/* The best head for load end e: the head's compute grows with c and the
 * load shrinks, so the total is lowest where they cross. */
static double best_head(const plan_model *m, uint64_t e, bool split, uint64_t *c_out) {
  uint64_t lo = 0, hi = split ? e - 1 : 0; /* find the first c where the head outlasts the load */
  double sfx = compute_ns(m, m->s + (double)e * m->bt, m->p);
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    double head = compute_ns(m, m->s, m->s + (double)mid * m->bt) + sfx;
    if (head >= combine(m, load_ns(m, mid, e), sfx))
      hi = mid;
    else
      lo = mid + 1;
  }
  uint64_t best = lo;
  double t = total_ns(m, lo, e);
  if (lo > 0) {
    double t2 = total_ns(m, lo - 1, e);
    if (t2 < t) {
      t = t2;
      best = lo - 1;
    }
  }
  *c_out = best;
  return t;
}

/* Keeps end e (with its best head) when it beats the best so far. */
static void consider(const plan_model *m, uint64_t e, bool split, double *best, uint64_t *best_c,
                     uint64_t *best_e) {
  uint64_t c;
  double t = best_head(m, e, split, &c);
  if (t < *best) {
    *best = t;
    *best_c = c;
    *best_e = e;
  }
}

OI_API oi_status oi_restore_plan_args_init(oi_restore_plan_args *a) {
  if (!a) return oi__fail(OI_ERR_INVALID_ARGUMENT, "restore_plan_args_init: args is NULL");
  memset(a, 0, sizeof *a);
  a->struct_size = sizeof *a;
  return OI_OK;
}

static double ns_per_block(uint64_t bytes, uint64_t per_s) {
  return per_s ? (double)bytes * 1e9 / (double)per_s : 0;
}

OI_API oi_status oi_plan_restore(const oi_restore_plan_args *args, oi_restore_plan *out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "plan_restore: out is NULL");
  oi_restore_plan_args a;
  oi_restore_plan_args_init(&a);
  oi_status st = oi__struct_in(&a, sizeof a, args, "plan_restore args");
  if (st != OI_OK) return st;
  const uint32_t known = OI_PLAN_LAYERWISE | OI_PLAN_NO_SPLIT | OI_PLAN_STAGED;
  if (a.flags & ~known)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "plan_restore: unknown flags 0x%x", a.flags & ~known);
  if (a.block_tokens == 0 || a.block_bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "plan_restore: block_tokens and block_bytes must be > 0");
  if (a.prompt_tokens <= a.start_tokens)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "plan_restore: prompt_tokens (%llu) must exceed start_tokens (%llu)",
                    (unsigned long long)a.prompt_tokens, (unsigned long long)a.start_tokens);
  if (a.n_blocks > (a.prompt_tokens - a.start_tokens - 1) / a.block_tokens)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "plan_restore: %llu blocks of %llu tokens leave no prompt token to compute "
                    "past start_tokens %llu of %llu",
                    (unsigned long long)a.n_blocks, (unsigned long long)a.block_tokens,
                    (unsigned long long)a.start_tokens, (unsigned long long)a.prompt_tokens);
  if (!(a.prefill_ns_per_token >= 0) || !(a.prefill_ns_per_token_ctx >= 0) ||
      !(a.prefill_ns_per_token + a.prefill_ns_per_token_ctx > 0) || isinf(a.prefill_ns_per_token) ||
      isinf(a.prefill_ns_per_token_ctx))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "plan_restore: the prefill cost (prefill_ns_per_token %g, "
                    "prefill_ns_per_token_ctx %g) must be finite, >= 0, and not both 0",
                    a.prefill_ns_per_token, a.prefill_ns_per_token_ctx);
  /* The leading run of held blocks, and where each is. */
  uint64_t n = a.n_blocks;
  for (uint64_t i = 0; a.where && i < n; i++) {
    if (a.where[i] > OI_WHERE_UNKNOWN)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "plan_restore: where[%llu] is %u (no such place)",
                      (unsigned long long)i, a.where[i]);
    if (a.where[i] == OI_WHERE_NONE) n = i;
  }
  uint64_t *counts = oi__malloc(2 * (n + 1) * sizeof *counts);
  if (!counts) return oi__fail(OI_ERR_OUT_OF_MEMORY, "plan_restore: out of memory");
  uint64_t *nd = counts, *nr = counts + n + 1;
  nd[0] = nr[0] = 0;
  for (uint64_t i = 0; i < n; i++) {
    uint8_t w = a.where ? a.where[i] : OI_WHERE_POOL;
    nd[i + 1] = nd[i] + (w == OI_WHERE_DISK);
    nr[i + 1] = nr[i] + (w == OI_WHERE_REMOTE);
  }
  const char *missing = n && !a.link_bytes_per_s         ? "link_bytes_per_s"
                        : nd[n] && !a.disk_bytes_per_s   ? "disk_bytes_per_s"
                        : nr[n] && !a.remote_bytes_per_s ? "remote_bytes_per_s"
                                                         : NULL;
  if (missing) {
    oi__free(counts);
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "plan_restore: %s is 0 and blocks need it", missing);
  }
  plan_model m = {
      .a = a.prefill_ns_per_token,
      .b = a.prefill_ns_per_token_ctx,
      .s = (double)a.start_tokens,
      .p = (double)a.prompt_tokens,
      .bt = (double)a.block_tokens,
      .t_link = ns_per_block(a.block_bytes, a.link_bytes_per_s),
      .t_disk = ns_per_block(a.block_bytes, a.disk_bytes_per_s),
      .t_remote = ns_per_block(a.block_bytes, a.remote_bytes_per_s),
      .overhead = (double)a.load_overhead_ns,
      .layers = (a.flags & OI_PLAN_LAYERWISE) ? (double)a.num_layers : 1,
      .staged = (a.flags & OI_PLAN_STAGED) != 0,
      .n_disk = nd,
      .n_remote = nr,
  };
  bool split = !(a.flags & OI_PLAN_NO_SPLIT);
  double cold = total_ns(&m, 0, 0), best = cold;
  uint64_t best_c = 0, best_e = 0;
  double load_all = n ? total_ns(&m, 0, n) : cold;
  if (n && load_all < best) {
    best = load_all;
    best_e = n;
  }
  /* Load ends: every one up to GRID blocks; past that a grid, every end of
   * a run of one place, then the neighbourhood of the best. */
  uint64_t step = n <= GRID ? 1 : (n + GRID - 1) / GRID;
  for (int pass = 0; pass < 2 && n; pass++) {
    uint64_t from = 1, to = n;
    if (pass == 1) {
      if (step == 1) break;
      from = best_e > step ? best_e - step : 1;
      to = best_e + step < n ? best_e + step : n;
      step = 1;
    }
    for (uint64_t e = from; e <= to; e += step)
      consider(&m, e, split, &best, &best_c, &best_e);
    if (pass == 0 && step > 1) /* the ends of each place's run */
      for (uint64_t e = 1; e <= n; e++) {
        if (e < n && (nd[e] - nd[e - 1]) == (nd[e + 1] - nd[e]) &&
            (nr[e] - nr[e - 1]) == (nr[e + 1] - nr[e]))
          continue;
        consider(&m, e, split, &best, &best_c, &best_e);
      }
  }
  oi__free(counts);
  oi_restore_plan r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.compute_head_blocks = best_e > best_c ? best_c : 0;
  r.load_blocks = best_e - r.compute_head_blocks;
  if (r.load_blocks == 0) r.compute_head_blocks = 0;
  r.load_tokens = r.load_blocks * a.block_tokens;
  r.compute_tokens = a.prompt_tokens - a.start_tokens - r.load_tokens;
  r.est_ns = (uint64_t)llround(best);
  r.est_cold_ns = (uint64_t)llround(cold);
  r.est_load_all_ns = (uint64_t)llround(load_all);
  return oi__struct_out(out, &r, sizeof r, "plan_restore");
}
