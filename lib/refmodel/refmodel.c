/* The reference model: a small decoder-only transformer with deterministic
 * pseudo-random weights, implementing oi_model_ops on the cpu backend.
 *
 * Batch invariance is by construction: a batch is processed one row at a
 * time, in sequence order, each row through every layer; every reduction
 * (matrix-vector products, norms, softmax, the attention sum) runs over its
 * elements in one fixed order that depends on nothing but the row. A row at
 * position p writes its K/V into its slot, then attends over positions
 * [0, p], reading them back from the arena, so a row sees exactly the same
 * bytes whether earlier positions were computed in this call, an earlier
 * chunk, by another request, or restored from the host tier. Weights are
 * read-only after create; per-rank scratch makes forward calls of different
 * ranks independent. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "openinfer/experimental.h"
#include "openinfer/model.h"
#include "refmodel/refmodel_cuda.h"

#define REFMODEL_MAX_RANKS 1024

typedef struct layer_weights {
  float *attn_norm; /* [hidden] */
  float *wq;        /* [q_heads*head_dim][hidden] */
  float *wk;        /* [kv_heads*head_dim][hidden] */
  float *wv;        /* [kv_heads*head_dim][hidden] */
  float *wo;        /* [hidden][q_heads*head_dim] */
  float *mlp_norm;  /* [hidden] */
  float *w_gate;    /* [intermediate][hidden] */
  float *w_up;      /* [intermediate][hidden] */
  float *w_down;    /* [hidden][intermediate] */
} layer_weights;

/* Scratch of one rank: one row's activations. */
typedef struct rank_state {
  bool bound;
  oi_kv_layout kv;
  float *x, *h, *q, *k, *v, *attn, *o, *gate, *up, *scores, *logits;
} rank_state;

typedef struct refmodel {
  oi_refmodel_options o;
  uint32_t q_dim, kv_dim;
  char model_id[192];
  float *weights;   /* one allocation */
  float *embedding; /* [vocab][hidden] */
  layer_weights *layers;
  float *final_norm;          /* [hidden] */
  float *lm_head;             /* [vocab][hidden] */
  float *rope_cos, *rope_sin; /* [max_positions][head_dim/2] */
  pthread_mutex_t lock;       /* bind/unbind */
  rank_state *ranks[REFMODEL_MAX_RANKS];
  oi_rm_cuda *cuda; /* options.device >= 0: the CUDA model (no cpu weights) */
} refmodel;

/* ---- weights ---------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [-scale, scale), from the top 24 bits (exact in a float). */
static void fill_uniform(float *w, size_t n, float scale, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) {
    float u = (float)(splitmix64(rng) >> 40) * (1.0f / 16777216.0f);
    w[i] = (2.0f * u - 1.0f) * scale;
  }
}

static void fill_norm(float *w, size_t n, uint64_t *rng) {
  fill_uniform(w, n, 0.1f, rng);
  for (size_t i = 0; i < n; i++)
    w[i] += 1.0f;
}

/* ---- kernels (one row; fixed summation order) ------------------------------------- */

/* out[j] = sum_i w[j][i] * x[i], i ascending. */
static void matvec(float *out, const float *w, const float *x, uint32_t rows, uint32_t cols) {
  for (uint32_t j = 0; j < rows; j++) {
    const float *wj = w + (size_t)j * cols;
    float acc = 0.0f;
    for (uint32_t i = 0; i < cols; i++)
      acc += wj[i] * x[i];
    out[j] = acc;
  }
}

static void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps) {
  float ss = 0.0f;
  for (uint32_t i = 0; i < n; i++)
    ss += x[i] * x[i];
  float inv = 1.0f / sqrtf(ss / (float)n + eps);
  for (uint32_t i = 0; i < n; i++)
    out[i] = x[i] * inv * w[i];
}

/* Rotates pairs (2i, 2i+1) of each head by position `pos`. */
static void rope(const refmodel *m, float *vec, uint32_t heads, uint32_t pos) {
  uint32_t hd = m->o.head_dim, half = hd / 2;
  const float *c = m->rope_cos + (size_t)pos * half, *s = m->rope_sin + (size_t)pos * half;
  for (uint32_t h = 0; h < heads; h++) {
    float *v = vec + (size_t)h * hd;
    for (uint32_t i = 0; i < half; i++) {
      float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * c[i] - b * s[i];
      v[2 * i + 1] = a * s[i] + b * c[i];
    }
  }
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

static uint8_t *kv_slot(const oi_kv_layout *kv, uint32_t layer, int64_t block, uint32_t slot) {
  return (uint8_t *)kv->base + layer * kv->layer_stride + (uint64_t)block * kv->block_stride +
         slot * kv->token_stride;
}

/* One row of one sequence through the whole model. */
static oi_status forward_row(refmodel *m, rank_state *r, const oi_model_seq *s, uint32_t row,
                             bool last) {
  const oi_refmodel_options *o = &m->o;
  const oi_kv_layout *kv = &r->kv;
  uint32_t hidden = o->hidden, hd = o->head_dim, pos = s->position + row;
  uint32_t group = o->num_q_heads / o->num_kv_heads, page = kv->page_size;
  uint32_t token = s->tokens[row];
  if (token >= o->vocab_size)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel: token %u is not below vocab_size %u", token,
                    o->vocab_size);
  if (pos >= o->max_positions)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel: position %u is not below max_positions %u",
                    pos, o->max_positions);
  if (pos / page >= s->n_blocks)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "refmodel: request %llu position %u has no block (block table of %u)",
                    (unsigned long long)s->request_id, pos, s->n_blocks);
  for (uint32_t b = 0; b <= pos / page; b++)
    if (s->block_table[b] < 0 || (uint64_t)s->block_table[b] >= kv->num_blocks)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel: block id %lld out of range (%llu blocks)",
                      (long long)s->block_table[b], (unsigned long long)kv->num_blocks);
  float scale = 1.0f / sqrtf((float)hd);

  memcpy(r->x, m->embedding + (size_t)token * hidden, hidden * sizeof(float));
  for (uint32_t l = 0; l < o->num_layers; l++) {
    const layer_weights *w = &m->layers[l];
    rmsnorm(r->h, r->x, w->attn_norm, hidden, o->rms_eps);
    matvec(r->q, w->wq, r->h, m->q_dim, hidden);
    matvec(r->k, w->wk, r->h, m->kv_dim, hidden);
    matvec(r->v, w->wv, r->h, m->kv_dim, hidden);
    rope(m, r->q, o->num_q_heads, pos);
    rope(m, r->k, o->num_kv_heads, pos);
    uint8_t *slot = kv_slot(kv, l, s->block_table[pos / page], pos % page);
    memcpy(slot, r->k, m->kv_dim * sizeof(float));
    memcpy(slot + kv->segment_stride, r->v, m->kv_dim * sizeof(float));

    /* Attention over [0, pos], keys and values read back from the arena. */
    for (uint32_t h = 0; h < o->num_q_heads; h++) {
      const float *qh = r->q + (size_t)h * hd;
      uint32_t g = h / group;
      float maxs = -INFINITY;
      for (uint32_t j = 0; j <= pos; j++) {
        const float *kj =
            (const float *)kv_slot(kv, l, s->block_table[j / page], j % page) + (size_t)g * hd;
        float d = 0.0f;
        for (uint32_t i = 0; i < hd; i++)
          d += qh[i] * kj[i];
        d *= scale;
        r->scores[j] = d;
        if (d > maxs) maxs = d;
      }
      float sum = 0.0f;
      for (uint32_t j = 0; j <= pos; j++) {
        r->scores[j] = expf(r->scores[j] - maxs);
        sum += r->scores[j];
      }
      float inv = 1.0f / sum;
      float *out = r->attn + (size_t)h * hd;
      for (uint32_t i = 0; i < hd; i++)
        out[i] = 0.0f;
      for (uint32_t j = 0; j <= pos; j++) {
        const float *vj = (const float *)(kv_slot(kv, l, s->block_table[j / page], j % page) +
                                          kv->segment_stride) +
                          (size_t)g * hd;
        float p = r->scores[j] * inv;
        for (uint32_t i = 0; i < hd; i++)
          out[i] += p * vj[i];
      }
    }
    matvec(r->o, w->wo, r->attn, hidden, m->q_dim);
    for (uint32_t i = 0; i < hidden; i++)
      r->x[i] += r->o[i];

    rmsnorm(r->h, r->x, w->mlp_norm, hidden, o->rms_eps);
    matvec(r->gate, w->w_gate, r->h, o->intermediate, hidden);
    matvec(r->up, w->w_up, r->h, o->intermediate, hidden);
    for (uint32_t i = 0; i < o->intermediate; i++)
      r->gate[i] = silu(r->gate[i]) * r->up[i];
    matvec(r->o, w->w_down, r->gate, hidden, o->intermediate);
    for (uint32_t i = 0; i < hidden; i++)
      r->x[i] += r->o[i];
  }
  if (!last) return OI_OK;
  rmsnorm(r->h, r->x, m->final_norm, hidden, o->rms_eps);
  matvec(r->logits, m->lm_head, r->h, o->vocab_size, hidden);
  uint32_t best = 0;
  for (uint32_t i = 1; i < o->vocab_size; i++)
    if (r->logits[i] > r->logits[best]) best = i; /* the first of equal maxima */
  ((oi_model_seq *)s)->next_token = best;
  if (s->logits) memcpy(s->logits, r->logits, o->vocab_size * sizeof(float));
  return OI_OK;
}

/* ---- oi_model_ops ------------------------------------------------------------- */

static oi_status rm_describe(void *ctx, oi_model_desc *out) {
  refmodel *m = ctx;
  oi_model_desc d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  d.num_layers = m->o.num_layers;
  d.num_kv_heads = m->o.num_kv_heads;
  d.head_dim = m->o.head_dim;
  d.dtype_bytes = m->cuda ? 2 : sizeof(float);
  d.vocab_size = m->o.vocab_size;
  d.max_positions = m->o.max_positions;
  d.model_id = m->model_id;
  d.flags = m->cuda ? OI_MODEL_KV_EVENTS : 0; /* the CUDA forward waits per layer */
  return oi__struct_out(out, &d, sizeof d, "refmodel describe");
}

static void rank_state_free(rank_state *r) {
  if (!r) return;
  oi__free(r->x);
  oi__free(r);
}

static oi_status rm_bind(void *ctx, uint32_t rank, const oi_kv_layout *layout) {
  refmodel *m = ctx;
  if (!layout) return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel bind: layout is NULL");
  if (rank >= REFMODEL_MAX_RANKS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel bind: rank %u (at most %u)", rank,
                    REFMODEL_MAX_RANKS);
  oi_kv_layout kv;
  memset(&kv, 0, sizeof kv);
  oi_status st = oi__struct_in(&kv, sizeof kv, layout, "refmodel bind");
  if (st != OI_OK) return st;
  if (m->cuda) return oi__rm_cuda_bind(m->cuda, rank, &kv);
  if (kv.device != -1)
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "refmodel bind: rank %u is on CUDA device %d but this model was created for "
                    "the cpu (oi_refmodel_options.device -1); create it with that device",
                    rank, kv.device);
  if (kv.num_layers != m->o.num_layers || !kv.base || kv.page_size == 0 ||
      kv.token_stride < m->kv_dim * sizeof(float))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "refmodel bind: layout does not fit the model (%u layers, token stride %llu, "
                    "the model has %u layers of %u floats per token)",
                    kv.num_layers, (unsigned long long)kv.token_stride, m->o.num_layers, m->kv_dim);
  rank_state *r = oi__calloc(1, sizeof *r);
  if (!r) return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel bind: out of memory");
  const oi_refmodel_options *o = &m->o;
  size_t floats = (size_t)o->hidden * 3 + m->q_dim * 2 + m->kv_dim * 2 + o->intermediate * 2 +
                  o->max_positions + o->vocab_size;
  float *p = oi__calloc(floats, sizeof(float));
  if (!p) {
    oi__free(r);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel bind: out of memory for scratch");
  }
  r->x = p;
  p += o->hidden;
  r->h = p;
  p += o->hidden;
  r->o = p;
  p += o->hidden;
  r->q = p;
  p += m->q_dim;
  r->attn = p;
  p += m->q_dim;
  r->k = p;
  p += m->kv_dim;
  r->v = p;
  p += m->kv_dim;
  r->gate = p;
  p += o->intermediate;
  r->up = p;
  p += o->intermediate;
  r->scores = p;
  p += o->max_positions;
  r->logits = p;
  r->kv = kv;
  r->bound = true;
  pthread_mutex_lock(&m->lock);
  rank_state *old = m->ranks[rank];
  m->ranks[rank] = r;
  pthread_mutex_unlock(&m->lock);
  rank_state_free(old);
  return OI_OK;
}

static void rm_unbind(void *ctx, uint32_t rank) {
  refmodel *m = ctx;
  if (rank >= REFMODEL_MAX_RANKS) return;
  if (m->cuda) {
    oi__rm_cuda_unbind(m->cuda, rank);
    return;
  }
  pthread_mutex_lock(&m->lock);
  rank_state *r = m->ranks[rank];
  m->ranks[rank] = NULL;
  pthread_mutex_unlock(&m->lock);
  rank_state_free(r);
}

static oi_status rm_forward(void *ctx, const oi_model_batch *b) {
  refmodel *m = ctx;
  if (!b || (b->n_seqs && !b->seqs))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel forward: batch is NULL");
  if (m->cuda) return oi__rm_cuda_forward(m->cuda, b);
  if (b->rank >= REFMODEL_MAX_RANKS || !m->ranks[b->rank])
    return oi__fail(OI_ERR_STATE, "refmodel forward: rank %u is not bound", b->rank);
  rank_state *r = m->ranks[b->rank];
  for (uint32_t i = 0; i < b->n_seqs; i++) {
    const oi_model_seq *s = &b->seqs[i];
    if (s->n_tokens && !s->tokens)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel forward: sequence %u has no tokens", i);
    for (uint32_t t = 0; t < s->n_tokens; t++) {
      oi_status st = forward_row(m, r, s, t, s->want_token && t + 1 == s->n_tokens);
      if (st != OI_OK) return st;
    }
  }
  return OI_OK;
}

/* ---- create / destroy ----------------------------------------------------------- */

OI_API oi_status oi_refmodel_options_init(oi_refmodel_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->seed = 1;
  o->num_layers = 2;
  o->hidden = 64;
  o->num_q_heads = 4;
  o->num_kv_heads = 2;
  o->head_dim = 16;
  o->intermediate = 128;
  o->vocab_size = 512;
  o->max_positions = 4096;
  o->rope_theta = 10000.0f;
  o->rms_eps = 1e-5f;
  o->device = -1;
  return OI_OK;
}

OI_API void oi_refmodel_destroy(void *ctx) {
  refmodel *m = ctx;
  if (!m) return;
  for (uint32_t i = 0; i < REFMODEL_MAX_RANKS; i++)
    rank_state_free(m->ranks[i]);
  oi__rm_cuda_destroy(m->cuda);
  pthread_mutex_destroy(&m->lock);
  oi__free(m->layers);
  oi__free(m->weights);
  oi__free(m);
}

OI_API oi_status oi_refmodel_create(const oi_refmodel_options *opts, oi_model_ops *ops_out,
                                    void **ctx_out) {
  if (ctx_out) *ctx_out = NULL;
  if (!ops_out || !ctx_out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel_create: %s is NULL",
                    ops_out ? "ctx_out" : "ops_out");
  oi_refmodel_options o;
  oi_refmodel_options_init(&o);
  oi_status st;
  if (opts && (st = oi__struct_in(&o, sizeof o, opts, "refmodel_create")) != OI_OK) return st;
  if (!o.num_layers || !o.hidden || !o.num_q_heads || !o.num_kv_heads || !o.head_dim ||
      !o.intermediate || !o.vocab_size || !o.max_positions)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel_create: a size is 0");
  if (o.num_q_heads % o.num_kv_heads)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "refmodel_create: num_kv_heads %u does not divide num_q_heads %u",
                    o.num_kv_heads, o.num_q_heads);
  if (o.head_dim % 2)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel_create: head_dim %u is odd (RoPE pairs)",
                    o.head_dim);
  if (o.hidden > 65536 || o.intermediate > 262144 || o.head_dim > 1024 || o.num_q_heads > 1024 ||
      o.num_layers > 1024 || o.vocab_size > (1u << 22) || o.max_positions > (1u << 22))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel_create: a size is out of range");
  if (!(o.rope_theta > 1.0f) || !(o.rms_eps > 0.0f))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel_create: rope_theta or rms_eps is invalid");
  if (o.device < -1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel_create: device %d", o.device);
  if (o.device >= 0 && (st = oi__rm_cuda_check(&o)) != OI_OK) return st;
  if (ops_out->struct_size < OI_STRUCT_MIN_SIZE)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "refmodel_create: set ops_out->struct_size = sizeof(oi_model_ops) first");

  refmodel *m = oi__calloc(1, sizeof *m);
  if (!m) return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel_create: out of memory");
  pthread_mutex_init(&m->lock, NULL);
  m->o = o;
  m->q_dim = o.num_q_heads * o.head_dim;
  m->kv_dim = o.num_kv_heads * o.head_dim;
  if (o.device >= 0) {
    /* The CUDA model: weights on the GPU only; a distinct id (bf16 KV). */
    snprintf(m->model_id, sizeof m->model_id,
             "refmodel-cuda-v1 seed=%llu L%u d%u q%u kv%u hd%u ff%u v%u theta=%g eps=%g bf16",
             (unsigned long long)o.seed, o.num_layers, o.hidden, o.num_q_heads, o.num_kv_heads,
             o.head_dim, o.intermediate, o.vocab_size, (double)o.rope_theta, (double)o.rms_eps);
    if ((st = oi__rm_cuda_create(&o, &m->cuda)) != OI_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", oi_last_error());
      oi_refmodel_destroy(m);
      return oi__fail(st, "%s", msg);
    }
    goto ops;
  }
  snprintf(m->model_id, sizeof m->model_id,
           "refmodel-v1 seed=%llu L%u d%u q%u kv%u hd%u ff%u v%u theta=%g eps=%g f32",
           (unsigned long long)o.seed, o.num_layers, o.hidden, o.num_q_heads, o.num_kv_heads,
           o.head_dim, o.intermediate, o.vocab_size, (double)o.rope_theta, (double)o.rms_eps);
  size_t H = o.hidden, F = o.intermediate, V = o.vocab_size, Q = m->q_dim, K = m->kv_dim;
  size_t per_layer = 2 * H + Q * H + 2 * K * H + H * Q + 3 * F * H;
  size_t half = o.head_dim / 2;
  size_t total = V * H + o.num_layers * per_layer + H + V * H + 2 * (size_t)o.max_positions * half;
  m->weights = oi__malloc(total * sizeof(float));
  m->layers = oi__calloc(o.num_layers, sizeof *m->layers);
  if (!m->weights || !m->layers) {
    oi_refmodel_destroy(m);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel_create: out of memory for %zu weights", total);
  }
  uint64_t rng = o.seed ^ 0x6F70656E696E6665ull; /* "openinfe" */
  float *p = m->weights;
  m->embedding = p;
  fill_uniform(p, V * H, 1.0f, &rng);
  p += V * H;
  for (uint32_t l = 0; l < o.num_layers; l++) {
    layer_weights *w = &m->layers[l];
    float in_h = 1.0f / sqrtf((float)H), in_q = 1.0f / sqrtf((float)Q),
          in_f = 1.0f / sqrtf((float)F);
    w->attn_norm = p, fill_norm(p, H, &rng), p += H;
    w->wq = p, fill_uniform(p, Q * H, in_h, &rng), p += Q * H;
    w->wk = p, fill_uniform(p, K * H, in_h, &rng), p += K * H;
    w->wv = p, fill_uniform(p, K * H, in_h, &rng), p += K * H;
    w->wo = p, fill_uniform(p, H * Q, in_q, &rng), p += H * Q;
    w->mlp_norm = p, fill_norm(p, H, &rng), p += H;
    w->w_gate = p, fill_uniform(p, F * H, in_h, &rng), p += F * H;
    w->w_up = p, fill_uniform(p, F * H, in_h, &rng), p += F * H;
    w->w_down = p, fill_uniform(p, H * F, in_f, &rng), p += H * F;
  }
  m->final_norm = p, fill_norm(p, H, &rng), p += H;
  m->lm_head = p, fill_uniform(p, V * H, 1.0f / sqrtf((float)H), &rng), p += V * H;
  m->rope_cos = p, p += (size_t)o.max_positions * half;
  m->rope_sin = p;
  for (uint32_t pos = 0; pos < o.max_positions; pos++)
    for (size_t i = 0; i < half; i++) {
      double freq = pow((double)o.rope_theta, -2.0 * (double)i / (double)o.head_dim);
      double a = (double)pos * freq;
      m->rope_cos[pos * half + i] = (float)cos(a);
      m->rope_sin[pos * half + i] = (float)sin(a);
    }

ops:;
  oi_model_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  ops.describe = rm_describe;
  ops.bind = rm_bind;
  ops.forward = rm_forward;
  ops.unbind = rm_unbind;
  if ((st = oi__struct_out(ops_out, &ops, sizeof ops, "refmodel_create")) != OI_OK) {
    oi_refmodel_destroy(m);
    return st;
  }
  *ctx_out = m;
  return OI_OK;
}
