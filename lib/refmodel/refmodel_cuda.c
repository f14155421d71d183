/* The reference model on a CUDA device: the architecture of refmodel.c (token
 * embedding, RMSNorm, fused Q/K/V projection, RoPE, grouped-query attention
 * over the paged arena, output projection, SwiGLU MLP, final RMSNorm, LM
 * head, greedy argmax) with bf16 weights, activations and KV and fp32
 * accumulation and residual stream. A forward batch runs as one flattened
 * set of rows through every layer; each kernel is batch-invariant (see
 * kernels/refmodel_kernels.h; CUDA runtime calls through
 * kernels/refmodel_runtime.h), so a row's KV bytes and logits do not depend
 * on the other rows or on chunking. forward returns after the stream drained,
 * so the KV it wrote is complete when the executor saves it. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refmodel/kernels/refmodel_gen.h"
#include "refmodel/kernels/refmodel_kernels.h"
#include "refmodel/kernels/refmodel_runtime.h"
#include "refmodel/refmodel_cuda.h"

#define RM_MAX_RANKS 1024

typedef struct rm_layer {
  float *attn_norm, *mlp_norm;
  uint16_t *wqkv, *wo, *wgu, *wd;
} rm_layer;

typedef struct rm_rank {
  oi_kv_layout kv;
  oi_rmk_stream stream;
  uint32_t cap_t, cap_r, cap_seg;
  size_t cap_meta;
  float *x, *part_o, *part_ml, *logits;
  uint16_t *h, *qkv, *attn, *act, *hl;
  uint32_t *next;
  uint8_t *meta_d, *meta_h; /* device / pinned host */
  float *logits_h;
  uint32_t *next_h;
} rm_rank;

struct oi_rm_cuda {
  oi_refmodel_options o;
  int dev;
  uint32_t H, Q, KVD, F, V, L, hd, qh, kvh, QKV;
  void *wmem;
  uint16_t *emb, *lm_head;
  float *final_norm, *rope_cos, *rope_sin;
  rm_layer *layers;
  pthread_mutex_t lock;
  rm_rank *ranks[RM_MAX_RANKS];
};

static oi_status cu_fail(int err, const char *what) {
  oi_rmk_get_last_error();
  return oi__fail(OI_ERR_CUDA, "refmodel cuda: %s: %s", what, oi_rmk_error_string(err));
}

oi_status oi__rm_cuda_check(const oi_refmodel_options *o) {
  if (o->head_dim != 64 && o->head_dim != 128)
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "refmodel: the CUDA kernels take head_dim 64 or 128 (asked for %u)",
                    o->head_dim);
  if (o->hidden % 64 || (o->num_q_heads * o->head_dim) % 64 || o->intermediate % 64 ||
      o->vocab_size % 2)
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "refmodel: the CUDA kernels need hidden, q_heads*head_dim and intermediate "
                    "to be multiples of 64 and an even vocab");
  return OI_OK;
}

void oi__rm_cuda_destroy(oi_rm_cuda *m) {
  if (!m) return;
  oi_rmk_set_device(m->dev);
  for (uint32_t i = 0; i < RM_MAX_RANKS; i++)
    if (m->ranks[i]) oi__rm_cuda_unbind(m, i);
  if (m->wmem) oi_rmk_free(m->wmem);
  oi__free(m->layers);
  pthread_mutex_destroy(&m->lock);
  oi__free(m);
}

oi_status oi__rm_cuda_create(const oi_refmodel_options *o, oi_rm_cuda **out) {
  *out = NULL;
  oi_status st = oi__rm_cuda_check(o);
  if (st != OI_OK) return st;
  int n = 0;
  if (oi_rmk_get_device_count(&n) != OI_RMK_SUCCESS || o->device >= n) {
    oi_rmk_get_last_error();
    return oi__fail(OI_ERR_NO_DEVICE, "refmodel: CUDA device %d: %d device(s) visible", o->device,
                    n);
  }
  oi_rm_cuda *m = oi__calloc(1, sizeof *m);
  if (!m) return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel: out of memory");
  pthread_mutex_init(&m->lock, NULL);
  m->o = *o;
  m->dev = o->device;
  m->H = o->hidden, m->hd = o->head_dim, m->qh = o->num_q_heads, m->kvh = o->num_kv_heads;
  m->Q = m->qh * m->hd, m->KVD = m->kvh * m->hd, m->F = o->intermediate, m->V = o->vocab_size;
  m->L = o->num_layers, m->QKV = m->Q + 2 * m->KVD;
  m->layers = oi__calloc(m->L, sizeof *m->layers);
  if (!m->layers) {
    oi__rm_cuda_destroy(m);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel: out of memory");
  }
  size_t H = m->H, Q = m->Q, F = m->F, V = m->V, QKV = m->QKV, half = m->hd / 2;
  /* Every tensor at a 256-byte boundary. */
#define RM_AL(b) (((b) + 255) & ~(size_t)255)
  size_t per_layer = 2 * RM_AL(H * 4) + RM_AL(QKV * H * 2) + RM_AL(H * Q * 2) +
                     RM_AL(2 * F * H * 2) + RM_AL(H * F * 2);
  size_t total = 2 * RM_AL(V * H * 2) + RM_AL(H * 4) + m->L * per_layer +
                 2 * RM_AL((size_t)o->max_positions * half * 4);
  oi_rmk_set_device(m->dev);
  int e = oi_rmk_malloc(&m->wmem, total);
  if (e != OI_RMK_SUCCESS) {
    oi_rmk_get_last_error();
    m->wmem = NULL;
    oi__rm_cuda_destroy(m);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel: cudaMalloc of %zu bytes of weights: %s", total,
                    oi_rmk_error_string(e));
  }
  uint8_t *p = m->wmem;
#define RM_TAKE(ptr, type, bytes) (ptr = (type *)p, p += RM_AL(bytes))
  RM_TAKE(m->emb, uint16_t, V * H * 2);
  RM_TAKE(m->lm_head, uint16_t, V * H * 2);
  RM_TAKE(m->final_norm, float, H * 4);
  for (uint32_t l = 0; l < m->L; l++) {
    rm_layer *w = &m->layers[l];
    RM_TAKE(w->attn_norm, float, H * 4);
    RM_TAKE(w->mlp_norm, float, H * 4);
    RM_TAKE(w->wqkv, uint16_t, QKV * H * 2);
    RM_TAKE(w->wo, uint16_t, H * Q * 2);
    RM_TAKE(w->wgu, uint16_t, 2 * F * H * 2);
    RM_TAKE(w->wd, uint16_t, H * F * 2);
  }
  RM_TAKE(m->rope_cos, float, (size_t)o->max_positions *half * 4);
  RM_TAKE(m->rope_sin, float, (size_t)o->max_positions *half * 4);
#undef RM_TAKE
  uint64_t seed = o->seed;
  float in_h = 1.0f / sqrtf((float)H), in_q = 1.0f / sqrtf((float)Q), in_f = 1.0f / sqrtf((float)F);
  int err = oi_rm_gen_bf16(m->emb, V * H, seed, OI_RM_T_EMBED, 1.0f, NULL);
  if (!err) err = oi_rm_gen_bf16(m->lm_head, V * H, seed, OI_RM_T_LM_HEAD, in_h, NULL);
  if (!err) err = oi_rm_gen_norm(m->final_norm, (uint32_t)H, seed, OI_RM_T_FINAL_NORM, NULL);
  for (uint32_t l = 0; l < m->L && !err; l++) {
    rm_layer *w = &m->layers[l];
    uint32_t t = OI_RM_T_LAYER0 + 16 * l;
    err = oi_rm_gen_norm(w->attn_norm, (uint32_t)H, seed, t + OI_RM_T_ATTN_NORM, NULL);
    if (!err) err = oi_rm_gen_norm(w->mlp_norm, (uint32_t)H, seed, t + OI_RM_T_MLP_NORM, NULL);
    /* wqkv rows: q, then k, then v; each tensor indexed from 0. */
    if (!err) err = oi_rm_gen_bf16(w->wqkv, Q * H, seed, t + OI_RM_T_WQ, in_h, NULL);
    if (!err) err = oi_rm_gen_bf16(w->wqkv + Q * H, m->KVD * H, seed, t + OI_RM_T_WK, in_h, NULL);
    if (!err)
      err =
          oi_rm_gen_bf16(w->wqkv + (Q + m->KVD) * H, m->KVD * H, seed, t + OI_RM_T_WV, in_h, NULL);
    if (!err) err = oi_rm_gen_bf16(w->wo, H * Q, seed, t + OI_RM_T_WO, in_q, NULL);
    if (!err)
      err = oi_rm_gen_gate_up(w->wgu, (uint32_t)F, (uint32_t)H, seed, t + OI_RM_T_GATE,
                              t + OI_RM_T_UP, in_h, NULL);
    if (!err) err = oi_rm_gen_bf16(w->wd, H * F, seed, t + OI_RM_T_DOWN, in_f, NULL);
  }
  if (!err) {
    size_t n_rope = (size_t)o->max_positions * half;
    float *c = malloc(n_rope * 4), *s = malloc(n_rope * 4);
    if (!c || !s) {
      free(c);
      free(s);
      oi__rm_cuda_destroy(m);
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel: out of memory for RoPE tables");
    }
    for (uint32_t pos = 0; pos < o->max_positions; pos++)
      for (size_t i = 0; i < half; i++) {
        double freq = pow((double)o->rope_theta, -2.0 * (double)i / (double)m->hd);
        double a = (double)pos * freq;
        c[pos * half + i] = (float)cos(a);
        s[pos * half + i] = (float)sin(a);
      }
    err = (int)oi_rmk_memcpy(m->rope_cos, c, n_rope * 4, OI_RMK_HOST_TO_DEVICE);
    if (!err) err = (int)oi_rmk_memcpy(m->rope_sin, s, n_rope * 4, OI_RMK_HOST_TO_DEVICE);
    free(c);
    free(s);
  }
  if (!err) err = (int)oi_rmk_device_synchronize();
  if (err) {
    oi_status fs = cu_fail(err, "generating the weights");
    oi__rm_cuda_destroy(m);
    return fs;
  }
  OI_LOG(OI_LOG_INFO, "refmodel", "CUDA weights on device %d: %.2f GiB (bf16)", m->dev,
         (double)total / (1ull << 30));
  *out = m;
  return OI_OK;
}

/* ---- ranks ----------------------------------------------------------------------- */

static void free_scratch(rm_rank *r) {
  void *dev_ptrs[] = {r->x,    r->part_o, r->part_ml, r->logits, r->h,     r->qkv,
                      r->attn, r->act,    r->hl,      r->next,   r->meta_d};
  for (size_t i = 0; i < sizeof dev_ptrs / sizeof dev_ptrs[0]; i++)
    if (dev_ptrs[i]) oi_rmk_free(dev_ptrs[i]);
  if (r->meta_h) oi_rmk_free_host(r->meta_h);
  if (r->logits_h) oi_rmk_free_host(r->logits_h);
  if (r->next_h) oi_rmk_free_host(r->next_h);
  r->x = r->part_o = r->part_ml = r->logits = NULL;
  r->h = r->qkv = r->attn = r->act = r->hl = NULL;
  r->next = NULL;
  r->meta_d = r->meta_h = NULL;
  r->logits_h = NULL;
  r->next_h = NULL;
  r->cap_t = r->cap_r = r->cap_seg = 0;
  r->cap_meta = 0;
}

static size_t meta_bytes(uint32_t T, uint32_t R, uint32_t items, uint64_t tables) {
  return (size_t)T * 16 + (size_t)R * 4 + (size_t)items * sizeof(oi_rm_item) + tables * 4 + 256;
}

/* Grows the scratch to T rows (nseg segments), R logit rows. */
static oi_status ensure_scratch(oi_rm_cuda *m, rm_rank *r, uint32_t T, uint32_t R, uint32_t nseg,
                                size_t meta) {
  if (T <= r->cap_t && R <= r->cap_r && nseg <= r->cap_seg && meta <= r->cap_meta) return OI_OK;
  uint32_t t = T > r->cap_t ? OI_MAX(T, r->cap_t + r->cap_t / 2) : r->cap_t;
  uint32_t rr = OI_MAX(OI_MAX(R, r->cap_r), 8);
  uint32_t ns = OI_MAX(nseg, r->cap_seg);
  size_t mb = OI_MAX(meta, r->cap_meta + r->cap_meta / 2);
  mb = OI_MAX(mb, meta_bytes(t, rr, t + 1024, 65536));
  oi_rmk_stream_synchronize(r->stream);
  free_scratch(r);
  size_t H = m->H;
  int e = OI_RMK_SUCCESS;
#define RM_DM(ptr, bytes)                                                                          \
  if (e == OI_RMK_SUCCESS) e = oi_rmk_malloc((void **)&(ptr), (bytes))
  RM_DM(r->x, (size_t)t * H * 4);
  RM_DM(r->h, (size_t)t * H * 2);
  RM_DM(r->qkv, (size_t)t * m->QKV * 2);
  RM_DM(r->attn, (size_t)t * m->Q * 2);
  RM_DM(r->act, (size_t)t * m->F * 2);
  RM_DM(r->part_o, (size_t)t * m->qh * ns * m->hd * 4);
  RM_DM(r->part_ml, (size_t)t * m->qh * ns * 2 * 4);
  RM_DM(r->hl, (size_t)rr * H * 2);
  RM_DM(r->logits, (size_t)rr * m->V * 4);
  RM_DM(r->next, (size_t)rr * 4);
  RM_DM(r->meta_d, mb);
#undef RM_DM
  if (e == OI_RMK_SUCCESS)
    e = oi_rmk_host_alloc((void **)&r->meta_h, mb, OI_RMK_HOST_ALLOC_PORTABLE);
  if (e == OI_RMK_SUCCESS)
    e = oi_rmk_host_alloc((void **)&r->logits_h, (size_t)rr * m->V * 4, OI_RMK_HOST_ALLOC_PORTABLE);
  if (e == OI_RMK_SUCCESS)
    e = oi_rmk_host_alloc((void **)&r->next_h, (size_t)rr * 4, OI_RMK_HOST_ALLOC_PORTABLE);
  if (e != OI_RMK_SUCCESS) {
    oi_rmk_get_last_error();
    free_scratch(r);
    return oi__fail(OI_ERR_OUT_OF_MEMORY,
                    "refmodel cuda: no memory for the scratch of %u rows (%u segments): %s", t, ns,
                    oi_rmk_error_string(e));
  }
  r->cap_t = t, r->cap_r = rr, r->cap_seg = ns, r->cap_meta = mb;
  return OI_OK;
}

oi_status oi__rm_cuda_bind(oi_rm_cuda *m, uint32_t rank, const oi_kv_layout *kv) {
  if (rank >= RM_MAX_RANKS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel bind: rank %u (at most %u)", rank,
                    RM_MAX_RANKS);
  if (kv->device != m->dev)
    return oi__fail(OI_ERR_UNSUPPORTED,
                    "refmodel bind: rank %u is on device %d; this model's weights live on CUDA "
                    "device %d",
                    rank, kv->device, m->dev);
  if (kv->num_layers != m->L || !kv->base || kv->page_size == 0 ||
      kv->token_stride < (uint64_t)m->KVD * 2 || kv->token_stride % 16 || kv->segment_stride % 16 ||
      kv->block_stride % 16 || kv->num_blocks > 0x7FFFFFFF)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "refmodel bind: layout does not fit the model (%u layers, token stride %llu; "
                    "the model has %u layers of %u bf16 per token, 16-byte aligned strides)",
                    kv->num_layers, (unsigned long long)kv->token_stride, m->L, m->KVD);
  rm_rank *r = oi__calloc(1, sizeof *r);
  if (!r) return oi__fail(OI_ERR_OUT_OF_MEMORY, "refmodel bind: out of memory");
  r->kv = *kv;
  oi_rmk_set_device(m->dev);
  int e = oi_rmk_stream_create(&r->stream, OI_RMK_STREAM_NON_BLOCKING);
  if (e != OI_RMK_SUCCESS) {
    oi__free(r);
    return cu_fail((int)e, "bind: stream");
  }
  oi_status st = ensure_scratch(m, r, 256, 8, 1, 0);
  if (st != OI_OK) {
    oi_rmk_stream_destroy(r->stream);
    oi__free(r);
    return st;
  }
  pthread_mutex_lock(&m->lock);
  rm_rank *old = m->ranks[rank];
  m->ranks[rank] = r;
  pthread_mutex_unlock(&m->lock);
  if (old) {
    oi_rmk_stream_synchronize(old->stream);
    free_scratch(old);
    oi_rmk_stream_destroy(old->stream);
    oi__free(old);
  }
  return OI_OK;
}

void oi__rm_cuda_unbind(oi_rm_cuda *m, uint32_t rank) {
  if (rank >= RM_MAX_RANKS) return;
  pthread_mutex_lock(&m->lock);
  rm_rank *r = m->ranks[rank];
  m->ranks[rank] = NULL;
  pthread_mutex_unlock(&m->lock);
  if (!r) return;
  oi_rmk_set_device(m->dev);
  oi_rmk_stream_synchronize(r->stream);
  free_scratch(r);
  oi_rmk_stream_destroy(r->stream);
  oi__free(r);
}

/* ---- forward ------------------------------------------------------------------------ */

oi_status oi__rm_cuda_forward(oi_rm_cuda *m, const oi_model_batch *b) {
  if (b->rank >= RM_MAX_RANKS || !m->ranks[b->rank])
    return oi__fail(OI_ERR_STATE, "refmodel forward: rank %u is not bound", b->rank);
  rm_rank *r = m->ranks[b->rank];
  const oi_kv_layout *kv = &r->kv;
  uint32_t page = kv->page_size;
  uint64_t T64 = 0, tab = 0;
  uint32_t R = 0, items = 0, nseg = 1;
  bool want_logits = false;
  for (uint32_t i = 0; i < b->n_seqs; i++) {
    const oi_model_seq *s = &b->seqs[i];
    if (!s->n_tokens) continue;
    if (!s->tokens || !s->block_table)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel forward: sequence %u has no tokens", i);
    uint64_t end = (uint64_t)s->position + s->n_tokens; /* exclusive */
    if (end > m->o.max_positions)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "refmodel: position %llu is not below max_positions %u",
                      (unsigned long long)(end - 1), m->o.max_positions);
    uint64_t nb = (end - 1) / page + 1;
    if (nb > s->n_blocks)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "refmodel: request %llu position %llu has no block (block table of %u)",
                      (unsigned long long)s->request_id, (unsigned long long)(end - 1),
                      s->n_blocks);
    for (uint64_t k = 0; k < nb; k++)
      if (s->block_table[k] < 0 || (uint64_t)s->block_table[k] >= kv->num_blocks)
        return oi__fail(OI_ERR_INVALID_ARGUMENT,
                        "refmodel: block id %lld out of range (%llu blocks)",
                        (long long)s->block_table[k], (unsigned long long)kv->num_blocks);
    for (uint32_t t = 0; t < s->n_tokens; t++)
      if (s->tokens[t] >= m->V)
        return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel: token %u is not below vocab_size %u",
                        s->tokens[t], m->V);
    T64 += s->n_tokens;
    tab += nb;
    items += (s->n_tokens + OI_RM_ATTN_QTILE - 1) / OI_RM_ATTN_QTILE;
    nseg = OI_MAX(nseg, (uint32_t)((end - 1) / OI_RM_ATTN_SEG + 1));
    if (s->want_token) {
      R++;
      if (s->logits) want_logits = true;
    }
  }
  if (T64 == 0) return OI_OK;
  if (T64 > (1u << 24)) return oi__fail(OI_ERR_INVALID_ARGUMENT, "refmodel: batch too large");
  uint32_t T = (uint32_t)T64;
  oi_rmk_set_device(m->dev);
  size_t mb = meta_bytes(T, R, items, tab);
  oi_status st = ensure_scratch(m, r, T, R, nseg, mb);
  if (st != OI_OK) return st;

  /* Metadata: tokens[T] pos[T] slot_off[T] (u64) lrows[R] items[] tables[] */
  uint8_t *hp = r->meta_h;
  size_t o_tok = 0, o_pos = o_tok + (size_t)T * 4,
         o_slot = (o_pos + (size_t)T * 4 + 7) & ~(size_t)7;
  size_t o_lrow = o_slot + (size_t)T * 8, o_items = (o_lrow + (size_t)R * 4 + 7) & ~(size_t)7;
  size_t o_tab = o_items + (size_t)items * sizeof(oi_rm_item), o_end = o_tab + tab * 4;
  uint32_t *tok = (uint32_t *)(hp + o_tok), *pos = (uint32_t *)(hp + o_pos);
  uint64_t *slot = (uint64_t *)(hp + o_slot);
  uint32_t *lrow = (uint32_t *)(hp + o_lrow);
  oi_rm_item *it = (oi_rm_item *)(hp + o_items);
  int32_t *tables = (int32_t *)(hp + o_tab);
  uint32_t row = 0, ri = 0, ii = 0, to = 0, max_rows = 0;
  for (uint32_t i = 0; i < b->n_seqs; i++) {
    const oi_model_seq *s = &b->seqs[i];
    if (!s->n_tokens) continue;
    uint32_t nb = (s->position + s->n_tokens - 1) / page + 1;
    for (uint32_t k = 0; k < nb; k++)
      tables[to + k] = (int32_t)s->block_table[k];
    for (uint32_t t = 0; t < s->n_tokens; t++) {
      uint32_t p = s->position + t;
      tok[row + t] = s->tokens[t];
      pos[row + t] = p;
      slot[row + t] = (uint64_t)s->block_table[p / page] * kv->block_stride +
                      (uint64_t)(p % page) * kv->token_stride;
    }
    for (uint32_t t0 = 0; t0 < s->n_tokens; t0 += OI_RM_ATTN_QTILE) {
      oi_rm_item x = {
          row + t0, OI_MIN(OI_RM_ATTN_QTILE, s->n_tokens - t0), s->position + t0, to, nb, 0};
      max_rows = OI_MAX(max_rows, x.nrows);
      it[ii++] = x;
    }
    if (s->want_token) lrow[ri++] = row + s->n_tokens - 1;
    row += s->n_tokens;
    to += nb;
  }
  oi_rmk_stream cs = r->stream;
  uint8_t *dp = r->meta_d;
  int err = (int)oi_rmk_memcpy_async(dp, hp, o_end, OI_RMK_HOST_TO_DEVICE, cs);
  const uint32_t *d_tok = (const uint32_t *)(dp + o_tok), *d_pos = (const uint32_t *)(dp + o_pos);
  const uint64_t *d_slot = (const uint64_t *)(dp + o_slot);
  const uint32_t *d_lrow = (const uint32_t *)(dp + o_lrow);
  oi_rm_attn_params ap;
  memset(&ap, 0, sizeof ap);
  ap.q = r->qkv;
  ap.q_ld = m->QKV;
  ap.block_stride = kv->block_stride;
  ap.seg_stride = kv->segment_stride;
  ap.token_stride = kv->token_stride;
  ap.page_size = page;
  ap.tables = (const int32_t *)(dp + o_tab);
  ap.items = (const oi_rm_item *)(dp + o_items);
  ap.n_items = items;
  ap.q_heads = m->qh;
  ap.kv_heads = m->kvh;
  ap.head_dim = m->hd;
  ap.nseg = nseg;
  ap.max_rows = max_rows;
  ap.scale_log2 = 1.4426950408889634f / sqrtf((float)m->hd);
  ap.part_o = r->part_o;
  ap.part_ml = r->part_ml;
  float eps = m->o.rms_eps;
  /* Restores still loading: layer l's attention waits for their layer-l
   * events (the embedding and every layer's QKV GEMM before it do not read
   * the arena). */
  uint32_t n_waits = 0;
  void *const *kv_events = NULL;
  if (b->struct_size >= offsetof(oi_model_batch, kv_events) + sizeof b->kv_events &&
      b->n_kv_waits && b->kv_events) {
    n_waits = b->n_kv_waits;
    kv_events = b->kv_events;
  }
  const char *what = "metadata copy";
  if (!err) what = "embed", err = oi_rm_embed(d_tok, T, m->emb, m->H, r->x, cs);
  for (uint32_t l = 0; l < m->L && !err; l++) {
    const rm_layer *w = &m->layers[l];
    uint8_t *base = (uint8_t *)kv->base + (uint64_t)l * kv->layer_stride;
    ap.layer_base = base;
    what = "attn rmsnorm", err = oi_rm_rmsnorm(r->x, NULL, T, m->H, w->attn_norm, eps, r->h, cs);
    if (!err)
      what = "qkv gemm",
      err = oi_rm_gemm(OI_RM_EPI_BF16, r->h, w->wqkv, r->qkv, T, m->QKV, m->H, cs);
    for (uint32_t i = 0; i < n_waits && !err; i++) {
      void *ev = kv_events[(size_t)i * m->L + l];
      if (ev) what = "restore wait", err = (int)oi_rmk_stream_wait_event(cs, ev, 0);
    }
    if (!err)
      what = "rope", err = oi_rm_rope_kv(r->qkv, d_pos, d_slot, T, m->qh, m->kvh, m->hd,
                                         m->rope_cos, m->rope_sin, base, kv->segment_stride, cs);
    if (!err) what = "attention", err = oi_rm_attention(&ap, cs);
    if (!err)
      what = "attention combine",
      err = oi_rm_attn_combine(r->part_o, r->part_ml, d_pos, T, m->qh, m->hd, nseg, r->attn, cs);
    if (!err)
      what = "o gemm", err = oi_rm_gemm(OI_RM_EPI_RESID, r->attn, w->wo, r->x, T, m->H, m->Q, cs);
    if (!err)
      what = "mlp rmsnorm", err = oi_rm_rmsnorm(r->x, NULL, T, m->H, w->mlp_norm, eps, r->h, cs);
    if (!err)
      what = "gate/up gemm",
      err = oi_rm_gemm(OI_RM_EPI_SWIGLU, r->h, w->wgu, r->act, T, 2 * m->F, m->H, cs);
    if (!err)
      what = "down gemm", err = oi_rm_gemm(OI_RM_EPI_RESID, r->act, w->wd, r->x, T, m->H, m->F, cs);
  }
  if (!err && R) {
    what = "final rmsnorm",
    err = oi_rm_rmsnorm(r->x, d_lrow, R, m->H, m->final_norm, eps, r->hl, cs);
    if (!err)
      what = "lm head",
      err = oi_rm_gemm(OI_RM_EPI_F32, r->hl, m->lm_head, r->logits, R, m->V, m->H, cs);
    if (!err) what = "argmax", err = oi_rm_argmax(r->logits, R, m->V, r->next, cs);
    if (!err)
      what = "token copy",
      err = (int)oi_rmk_memcpy_async(r->next_h, r->next, (size_t)R * 4, OI_RMK_DEVICE_TO_HOST, cs);
    if (!err && want_logits)
      what = "logits copy",
      err = (int)oi_rmk_memcpy_async(r->logits_h, r->logits, (size_t)R * m->V * 4,
                                     OI_RMK_DEVICE_TO_HOST, cs);
  }
  int se = oi_rmk_stream_synchronize(cs);
  if (!err && se != OI_RMK_SUCCESS) what = "forward", err = (int)se;
  if (err) return cu_fail(err, what);
  ri = 0;
  for (uint32_t i = 0; i < b->n_seqs; i++) {
    oi_model_seq *s = &b->seqs[i];
    if (!s->n_tokens || !s->want_token) continue;
    s->next_token = r->next_h[ri];
    if (s->logits) memcpy(s->logits, r->logits_h + (size_t)ri * m->V, (size_t)m->V * sizeof(float));
    ri++;
  }
  return OI_OK;
}
