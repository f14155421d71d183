/* Restore or recompute in the executor (docs/planner.md): the prefill cost
 * fitted to the forwards, and the plan of each admission restore (the held
 * blocks located by a membership query, oi_plan_restore, and the restore it
 * chooses: all, a leading part, a part behind a computed head, or none). */
#include <math.h>
#include <string.h>

#include "executor/executor_internal.h"

#define PREFILL_DECAY 0.9 /* each sample's weight, per later sample */

void oi__exec_prefill_init(oi_executor *x) {
  memset(&x->fit, 0, sizeof x->fit);
  x->fit.a = x->o.prefill_ns_per_token;
  x->fit.b = x->o.prefill_ns_per_token_ctx;
  x->fit.given = x->fit.a > 0 || x->fit.b > 0;
}

/* A forward of `tokens` tokens whose positions sum to `positions` took
 * `ns`: the least-squares fit of ns = a * tokens + b * positions over the
 * decayed samples; a coefficient that comes out negative is dropped (the
 * other one alone fits). */
void oi__exec_prefill_sample(oi_executor *x, double tokens, double positions, double ns) {
  prefill_fit *f = &x->fit;
  if (tokens <= 0 || ns <= 0) return;
  f->samples++;
  if (f->given) return;
  f->sxx = PREFILL_DECAY * f->sxx + tokens * tokens;
  f->sxy = PREFILL_DECAY * f->sxy + tokens * positions;
  f->syy = PREFILL_DECAY * f->syy + positions * positions;
  f->st_x = PREFILL_DECAY * f->st_x + ns * tokens;
  f->st_y = PREFILL_DECAY * f->st_y + ns * positions;
  double det = f->sxx * f->syy - f->sxy * f->sxy;
  double a = -1, b = -1;
  if (det > 1e-9 * f->sxx * f->syy) {
    a = (f->st_x * f->syy - f->st_y * f->sxy) / det;
    b = (f->sxx * f->st_y - f->sxy * f->st_x) / det;
  }
  if (a < 0 || b < 0) { /* one coefficient: tokens alone, or (a < 0) positions alone */
    bool by_positions = a < 0 && b > 0 && f->syy > 0;
    a = by_positions ? 0 : f->st_x / f->sxx;
    b = by_positions ? f->st_y / f->syy : 0;
  }
  f->a = a;
  f->b = b;
}

oi_status oi__executor_set_restore_plan(oi_executor *x, uint32_t mode) {
  if (!x || mode > OI_RESTORE_PLAN_OFF)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "set_restore_plan: %u is not an oi_restore_plan_mode",
                    mode);
  x->o.restore_plan = mode;
  return OI_OK;
}

/* The read rates of the plan: the options', else the host's estimates,
 * else (a sidecar executor) the defaults. */
static void plan_rates(const oi_executor *x, oi_restore_plan_args *a) {
  oi_host_stats hs;
  memset(&hs, 0, sizeof hs);
  hs.struct_size = sizeof hs;
  if (!x->host || oi_host_get_stats(x->host, &hs) != OI_OK) {
    hs.link_bytes_per_s = OI_RATE_DEFAULT_LINK;
    hs.disk_bytes_per_s = OI_RATE_DEFAULT_DISK;
    hs.remote_bytes_per_s = OI_RATE_DEFAULT_REMOTE;
  }
  a->link_bytes_per_s = x->o.link_bytes_per_s ? x->o.link_bytes_per_s : hs.link_bytes_per_s;
  a->disk_bytes_per_s = x->o.disk_bytes_per_s ? x->o.disk_bytes_per_s : hs.disk_bytes_per_s;
  a->remote_bytes_per_s = x->o.remote_bytes_per_s ? x->o.remote_bytes_per_s : hs.remote_bytes_per_s;
}

/* Where blocks [g, limit) of q are: the leading run held somewhere (the
 * pool or a tier with a membership: the disk) into where[0..). @return its
 * length; 0 when none, or the query failed. */
static uint32_t locate(exec_rank *r, request *q, uint32_t g, uint32_t limit, uint8_t *where,
                       uint8_t *present) {
  oi_query_result qr;
  memset(&qr, 0, sizeof qr);
  qr.struct_size = sizeof qr;
  qr.present = present;
  qr.where = where;
  if (oi_engine_query(r->engine, NULL, q->hashes + g, limit - g, OI_QUERY_MEMBERSHIP, &qr) !=
      OI_OK) {
    OI_LOG(OI_LOG_INFO, "executor", "request %llu: locating its blocks failed: %s",
           (unsigned long long)q->id, oi_last_error());
    return 0;
  }
  uint32_t held = 0;
  while (held < limit - g && where[held] != OI_WHERE_NONE)
    held++;
  return held;
}

void oi__exec_plan_restore(exec_rank *r, request *q, uint32_t g, uint32_t limit) {
  oi_executor *x = r->x;
  bool known = x->fit.given || (x->fit.samples && (x->fit.a > 0 || x->fit.b > 0));
  if (x->o.restore_plan == OI_RESTORE_PLAN_OFF || !known) {
    oi__exec_start_restore(r, q, g, limit);
    return;
  }
  uint64_t t0 = oi__now_ns();
  uint32_t n = limit - g, page = r->kv.page_size;
  uint8_t *buf = oi__malloc(2 * (size_t)n);
  uint32_t held = buf ? locate(r, q, g, limit, buf, buf + n) : 0;
  oi_restore_plan plan = {.struct_size = sizeof plan};
  oi_status st = OI_ERR_NOT_FOUND;
  if (held) {
    oi_restore_plan_args a;
    oi_restore_plan_args_init(&a);
    a.flags = OI_PLAN_STAGED | (x->overlap_mode == OVERLAP_DEVICE ? OI_PLAN_LAYERWISE : 0);
    a.prompt_tokens = q->prompt_len;
    a.start_tokens = (uint64_t)g * page;
    a.n_blocks = held;
    a.where = buf;
    a.block_tokens = page;
    a.block_bytes = x->block_bytes;
    a.num_layers = r->kv.num_layers;
    plan_rates(x, &a);
    a.prefill_ns_per_token = x->fit.a;
    a.prefill_ns_per_token_ctx = x->fit.b;
    st = oi_plan_restore(&a, &plan);
    if (st != OI_OK)
      OI_LOG(OI_LOG_INFO, "executor", "request %llu: no plan (%s): every hit loads",
             (unsigned long long)q->id, oi_last_error());
  }
  oi__free(buf);
  if (st != OI_OK) { /* nothing located (the cluster answers no membership), or no plan */
    oi__exec_start_restore(r, q, g, limit);
    return;
  }
  x->c.plans++;
  x->c.plan_ns += oi__now_ns() - t0;
  uint32_t c = (uint32_t)plan.compute_head_blocks, e = c + (uint32_t)plan.load_blocks;
  OI_LOG(OI_LOG_DEBUG, "executor",
         "request %llu: %u blocks held: compute %u, load %u, compute the rest (est %.3f ms, "
         "cold %.3f, load all %.3f)",
         (unsigned long long)q->id, held, c, e - c, plan.est_ns / 1e6, plan.est_cold_ns / 1e6,
         plan.est_load_all_ns / 1e6);
  if (plan.load_blocks == 0) { /* compute them all */
    x->c.plans_compute++;
    return;
  }
  if (c) x->c.plans_split++;
  if (e < held) x->c.plans_partial++;
  /* Every held block loads: past them a tier without a membership (the
   * cluster) may bring more, as without a plan. */
  uint32_t to = e == held ? limit : g + e;
  q->split = c > 0;
  if (!oi__exec_start_restore(r, q, g + c, to)) q->split = false;
}
