/* The CUDA reference model on a GPU:
 *  1. kernel self-check: one forward of a 300-token prompt against a cpu
 *     recomputation of the same model (same generated bf16 weights, bf16
 *     rounding at the same points), logits and KV within tolerance;
 *  2. batch invariance at the model: the prompt in uneven chunks, and beside
 *     another sequence, gives byte-identical KV and logits;
 *  3. executor byte parity: greedy completions of 64 tokens (a 2,300-token
 *     prompt, so attention spans two key segments) are identical cold, as a
 *     GPU prefix hit and restored from the host tier after the GPU cache was
 *     evicted, and the restored KV bytes equal the cold KV bytes.
 * Skips (77) without a GPU. */
#include <math.h>

#include "device/device.h"
#include "refmodel/kernels/refmodel_gen.h"
#include "rig.h"
#include "testutil.h"

#define L_ 2
#define H_ 256
#define QH 4
#define KVH 2
#define HD 128
#define F_ 512
#define V_ 1024
#define PAGE 16
#define QD (QH * HD)
#define KD (KVH * HD)

static oi_dev *dev;
static oi_model_ops ops;
static void *ctx;
static const uint64_t SEED = 5;

static void opts(oi_refmodel_options *ro) {
  oi_refmodel_options_init(ro);
  ro->seed = SEED;
  ro->num_layers = L_;
  ro->hidden = H_;
  ro->num_q_heads = QH;
  ro->num_kv_heads = KVH;
  ro->head_dim = HD;
  ro->intermediate = F_;
  ro->vocab_size = V_;
  ro->max_positions = 8192;
  ro->device = 0;
}

/* ---- cpu recomputation ------------------------------------------------------- */

static float bfr(float x) { return oi_rm_bf2f(oi_rm_f2bf(x)); }
static float *gen(uint32_t tensor, size_t n, float scale) {
  float *w = malloc(n * sizeof *w);
  REQUIRE(w);
  for (size_t i = 0; i < n; i++)
    w[i] = bfr(oi_rm_uniform(SEED, tensor, i, scale));
  return w;
}
static float *gen_norm(uint32_t tensor, size_t n) {
  float *w = malloc(n * sizeof *w);
  REQUIRE(w);
  for (size_t i = 0; i < n; i++)
    w[i] = 1.0f + oi_rm_uniform(SEED, tensor, i, 0.1f);
  return w;
}
static void matvec(float *out, const float *w, const float *x, int rows, int cols) {
  for (int j = 0; j < rows; j++) {
    double a = 0;
    for (int i = 0; i < cols; i++)
      a += (double)w[(size_t)j * cols + i] * x[i];
    out[j] = (float)a;
  }
}
static void rmsnorm_bf(float *out, const float *x, const float *w, int n) {
  double ss = 0;
  for (int i = 0; i < n; i++)
    ss += (double)x[i] * x[i];
  float inv = 1.0f / sqrtf((float)(ss / n) + 1e-5f);
  for (int i = 0; i < n; i++)
    out[i] = bfr(x[i] * inv * w[i]);
}

/* Recomputes n tokens from position 0: logits of the last row, K of every
 * (layer, position) in kcache[l][p][KD]. */
static void cpu_forward(const uint32_t *tok, int n, float *logits, float *kcache) {
  float in_h = 1.0f / sqrtf(H_), in_q = 1.0f / sqrtf(QD), in_f = 1.0f / sqrtf(F_);
  float *emb = gen(OI_RM_T_EMBED, (size_t)V_ * H_, 1.0f);
  float *lm = gen(OI_RM_T_LM_HEAD, (size_t)V_ * H_, in_h);
  float *fnorm = gen_norm(OI_RM_T_FINAL_NORM, H_);
  float *x = calloc((size_t)n * H_, 4), *vcache = calloc((size_t)L_ * n * KD, 4);
  float *q = calloc((size_t)n * QD, 4);
  float h[H_], tmp[QD + 2 * KD], att[QD], o[H_], g[F_], u[F_], act[F_], sc[8192];
  for (int r = 0; r < n; r++)
    for (int i = 0; i < H_; i++)
      x[(size_t)r * H_ + i] = emb[(size_t)tok[r] * H_ + i];
  for (int l = 0; l < L_; l++) {
    uint32_t t = OI_RM_T_LAYER0 + 16 * l;
    float *an = gen_norm(t + OI_RM_T_ATTN_NORM, H_), *mn = gen_norm(t + OI_RM_T_MLP_NORM, H_);
    float *wq = gen(t + OI_RM_T_WQ, (size_t)QD * H_, in_h),
          *wk = gen(t + OI_RM_T_WK, (size_t)KD * H_, in_h);
    float *wv = gen(t + OI_RM_T_WV, (size_t)KD * H_, in_h),
          *wo = gen(t + OI_RM_T_WO, (size_t)H_ * QD, in_q);
    float *wg = gen(t + OI_RM_T_GATE, (size_t)F_ * H_, in_h),
          *wu = gen(t + OI_RM_T_UP, (size_t)F_ * H_, in_h);
    float *wd = gen(t + OI_RM_T_DOWN, (size_t)H_ * F_, in_f);
    for (int r = 0; r < n; r++) {
      rmsnorm_bf(h, x + (size_t)r * H_, an, H_);
      matvec(tmp, wq, h, QD, H_);
      matvec(tmp + QD, wk, h, KD, H_);
      matvec(tmp + QD + KD, wv, h, KD, H_);
      for (int i = 0; i < QD + 2 * KD; i++)
        tmp[i] = bfr(tmp[i]);
      for (int hh = 0; hh < QH + KVH; hh++)
        for (int i = 0; i < HD / 2; i++) {
          double freq = pow(10000.0, -2.0 * i / HD), a = (double)r * freq;
          float c = (float)cos(a), s = (float)sin(a);
          float *v = tmp + hh * HD;
          float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = bfr(x0 * c - x1 * s);
          v[2 * i + 1] = bfr(x0 * s + x1 * c);
        }
      memcpy(q + (size_t)r * QD, tmp, QD * 4);
      memcpy(kcache + ((size_t)l * n + r) * KD, tmp + QD, KD * 4);
      memcpy(vcache + ((size_t)l * n + r) * KD, tmp + QD + KD, KD * 4);
    }
    for (int r = 0; r < n; r++) {
      for (int hh = 0; hh < QH; hh++) {
        int gk = hh / (QH / KVH);
        float mx = -INFINITY;
        for (int j = 0; j <= r; j++) {
          double d = 0;
          for (int i = 0; i < HD; i++)
            d += (double)q[(size_t)r * QD + hh * HD + i] *
                 kcache[((size_t)l * n + j) * KD + gk * HD + i];
          sc[j] = (float)(d / sqrt(HD));
          mx = fmaxf(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= r; j++)
          sum += sc[j] = expf(sc[j] - mx);
        for (int i = 0; i < HD; i++) {
          double a = 0;
          for (int j = 0; j <= r; j++)
            a += sc[j] * vcache[((size_t)l * n + j) * KD + gk * HD + i];
          att[hh * HD + i] = bfr((float)(a / sum));
        }
      }
      matvec(o, wo, att, H_, QD);
      for (int i = 0; i < H_; i++)
        x[(size_t)r * H_ + i] += o[i];
      rmsnorm_bf(h, x + (size_t)r * H_, mn, H_);
      matvec(g, wg, h, F_, H_);
      matvec(u, wu, h, F_, H_);
      for (int i = 0; i < F_; i++)
        act[i] = bfr(g[i] / (1.0f + expf(-g[i])) * u[i]);
      matvec(o, wd, act, H_, F_);
      for (int i = 0; i < H_; i++)
        x[(size_t)r * H_ + i] += o[i];
    }
    free(an), free(mn), free(wq), free(wk), free(wv), free(wo), free(wg), free(wu), free(wd);
  }
  rmsnorm_bf(h, x + (size_t)(n - 1) * H_, fnorm, H_);
  matvec(logits, lm, h, V_, H_);
  free(emb), free(lm), free(fnorm), free(x), free(vcache), free(q);
}

/* ---- a private arena ------------------------------------------------------------ */

typedef struct arena {
  oi_kv_layout kv;
  uint8_t *base;
} arena;

static void arena_init(arena *a, uint64_t blocks) {
  memset(a, 0, sizeof *a);
  a->kv.struct_size = sizeof a->kv;
  a->kv.device = 0;
  a->kv.num_layers = L_;
  a->kv.page_size = PAGE;
  a->kv.num_blocks = blocks;
  a->kv.token_stride = KD * 2;
  a->kv.segment_stride = a->kv.token_stride * PAGE;
  a->kv.block_stride = 2 * a->kv.segment_stride;
  a->kv.layer_stride = a->kv.block_stride * blocks;
  a->kv.bytes = a->kv.layer_stride * L_;
  REQUIRE(dev->ops->mem_alloc(dev, a->kv.bytes, 0, (void **)&a->base) == OI_OK);
  a->kv.base = a->base;
}

/* The K/V pages of `n` blocks of every layer, in table order, into host memory. */
static uint8_t *download_blocks(const oi_kv_layout *kv, const int64_t *ids, size_t n) {
  uint8_t *out = malloc(n * L_ * kv->block_stride);
  REQUIRE(out);
  for (uint32_t l = 0; l < L_; l++)
    for (size_t b = 0; b < n; b++)
      REQUIRE(
          dev->ops->mem_copy(dev, out + (l * n + b) * kv->block_stride,
                             (uint8_t *)kv->base + l * kv->layer_stride + ids[b] * kv->block_stride,
                             kv->block_stride) == OI_OK);
  return out;
}

static uint32_t *prompt(uint32_t n, uint64_t seed) {
  uint32_t *p = malloc(n * sizeof *p);
  REQUIRE(p);
  for (uint32_t i = 0; i < n; i++)
    p[i] = (uint32_t)(oi_rm_mix64(seed * 1000003 + i) % V_);
  return p;
}

/* ---- 1 + 2 ------------------------------------------------------------------------ */

static void test_kernels_against_cpu_and_chunking(void) {
  const int N = 300;
  uint32_t *tok = prompt(N, 1);
  arena a;
  arena_init(&a, 64);
  REQUIRE(ops.bind(ctx, 0, &a.kv) == OI_OK);
  int64_t t1[19], t2[19];
  for (int i = 0; i < 19; i++)
    t1[i] = i, t2[i] = 40 - i; /* t2 reversed, disjoint from t1 */
  float *lg = malloc(V_ * 4), *lg2 = malloc(V_ * 4), *ref = malloc(V_ * 4);
  oi_model_seq s = {.request_id = 1,
                    .tokens = tok,
                    .n_tokens = N,
                    .position = 0,
                    .block_table = t1,
                    .n_blocks = 19,
                    .want_token = 1,
                    .logits = lg};
  oi_model_batch b = {.struct_size = sizeof b, .rank = 0, .n_seqs = 1, .seqs = &s};
  CHECK_OK(ops.forward(ctx, &b));

  float *kref = malloc((size_t)L_ * N * KD * 4);
  REQUIRE(kref);
  cpu_forward(tok, N, ref, kref);
  double mx = 0, md = 0;
  int best_ref = 0;
  for (int i = 0; i < V_; i++) {
    mx = fmax(mx, fabs(ref[i]));
    md = fmax(md, fabs((double)lg[i] - ref[i]));
    if (ref[i] > ref[best_ref]) best_ref = i;
  }
  printf("  self-check: logits max |gpu - cpu| = %.4g (max |logit| %.4g, rel %.4g); gpu argmax %u, "
         "cpu argmax %d (gpu logit there %.5g vs its max %.5g)\n",
         md, mx, md / mx, s.next_token, best_ref, lg[best_ref], lg[s.next_token]);
  CHECK(md / mx < 0.05);
  CHECK(lg[best_ref] >= lg[s.next_token] - 0.05 * mx);
  /* K of every layer and position within bf16 noise of the cpu's. */
  uint8_t *kv1 = download_blocks(&a.kv, t1, 19);
  double kd = 0, km = 0;
  for (int l = 0; l < L_; l++)
    for (int p = 0; p < N; p++)
      for (int i = 0; i < KD; i++) {
        uint16_t bits;
        memcpy(&bits,
               kv1 + ((size_t)l * 19 + p / PAGE) * a.kv.block_stride +
                   (p % PAGE) * a.kv.token_stride + i * 2,
               2);
        float gk = oi_rm_bf2f(bits), ck = kref[((size_t)l * N + p) * KD + i];
        km = fmax(km, fabs(ck));
        kd = fmax(kd, fabs(gk - ck));
      }
  printf("  self-check: K max |gpu - cpu| = %.4g (max |k| %.4g)\n", kd, km);
  CHECK(kd / km < 0.05);

  /* 2. Chunks 1, 63, 64, 100, 72 beside another sequence: the same bytes. */
  uint32_t *other = prompt(150, 2);
  int64_t t3[10];
  for (int i = 0; i < 10; i++)
    t3[i] = 50 + i;
  const uint32_t chunks[] = {1, 63, 64, 100, 72};
  uint32_t pos = 0;
  for (size_t c = 0; c < 5; c++) {
    oi_model_seq ss[2] = {{.request_id = 2,
                           .tokens = tok + pos,
                           .n_tokens = chunks[c],
                           .position = pos,
                           .block_table = t2,
                           .n_blocks = 19,
                           .want_token = c == 4,
                           .logits = lg2},
                          {.request_id = 3,
                           .tokens = other + c * 30,
                           .n_tokens = 30,
                           .position = (uint32_t)c * 30,
                           .block_table = t3,
                           .n_blocks = 10,
                           .want_token = 1}};
    oi_model_batch bb = {.struct_size = sizeof bb, .rank = 0, .n_seqs = 2, .seqs = ss};
    CHECK_OK(ops.forward(ctx, &bb));
    pos += chunks[c];
    if (c == 4) CHECK(ss[0].next_token == s.next_token);
  }
  uint8_t *kv2 = download_blocks(&a.kv, t2, 19);
  /* The last block is partial: compare the whole blocks and the written slots. */
  size_t full = (size_t)(N / PAGE) * a.kv.block_stride;
  bool same = true;
  for (int l = 0; l < L_; l++) {
    same &= !memcmp(kv1 + (size_t)l * 19 * a.kv.block_stride,
                    kv2 + (size_t)l * 19 * a.kv.block_stride, full);
    for (uint32_t seg = 0; seg < 2; seg++)
      same &= !memcmp(kv1 + ((size_t)l * 19 + 18) * a.kv.block_stride + seg * a.kv.segment_stride,
                      kv2 + ((size_t)l * 19 + 18) * a.kv.block_stride + seg * a.kv.segment_stride,
                      (N % PAGE) * a.kv.token_stride);
  }
  CHECK(same);
  CHECK(!memcmp(lg, lg2, V_ * 4));
  printf("  chunked + batched vs one chunk alone: KV %s, logits %s\n",
         same ? "identical" : "DIFFER", memcmp(lg, lg2, V_ * 4) ? "DIFFER" : "identical");
  ops.unbind(ctx, 0);
  dev->ops->mem_free(dev, a.base);
  free(kv1), free(kv2), free(kref), free(lg), free(lg2), free(ref), free(tok), free(other);
}

/* ---- 3 ------------------------------------------------------------------------------ */

static uint64_t submit(oi_executor *x, const uint32_t *p, uint32_t n, uint32_t gen) {
  oi_request r;
  oi_request_init(&r);
  r.prompt = p;
  r.prompt_len = n;
  r.max_new_tokens = gen;
  uint64_t id = 0;
  CHECK_OK(oi_executor_submit(x, &r, &id));
  return id;
}

static int inject_load_failure; /* fail the next restore's load at completion */
static int fault_hook(void *c, uint32_t rank, uint64_t id, uint32_t fault) {
  (void)c, (void)rank, (void)id;
  if (fault != OI_FAULT_LOAD_COMPLETE || !inject_load_failure) return 0;
  inject_load_failure = 0;
  return 1;
}

static void test_executor_parity(void) {
  oi_host_options ho = tr_host_options(512ull << 20);
  ho.device = 0;
  oi_executor_options o;
  oi_executor_options_init(&o);
  int32_t devs[1] = {0};
  o.model = &ops;
  o.model_ctx = ctx;
  o.devices = devs;
  o.gpu_blocks = 512;
  o.max_batch_tokens = 256;
  o.offload = OI_OFFLOAD_EMBEDDED;
  o.host_options = &ho;
  o.fault_hook = fault_hook;
  /* Parity of a whole-prefix restore that overlaps its forward: the plan is
   * off (on an H200 it computes a head of a few blocks while the rest loads,
   * which the planner's own tests and bench ttft cover). */
  o.restore_plan = OI_RESTORE_PLAN_OFF;
  oi_executor *x = NULL;
  CHECK_OK(oi_executor_create(&o, &x));
  REQUIRE(x);
  const uint32_t N = 2300, GEN = 64, NB = (N - 1) / PAGE;
  uint32_t *p = prompt(N, 3), *p2 = prompt(700, 4);
  oi_kv_layout kv = {.struct_size = sizeof kv};
  CHECK_OK(oi_executor_get_kv_layout(x, 0, &kv));

  uint64_t cold = submit(x, p, N, GEN);
  submit(x, p2, 700, 20); /* shares the batches */
  CHECK_OK(oi_executor_run_until_idle(x));
  oi_request_result rc = {.struct_size = sizeof rc};
  CHECK_OK(oi_executor_get_result(x, cold, &rc));
  CHECK(rc.state == OI_REQUEST_FINISHED && rc.n_tokens == GEN);
  uint32_t *tok_cold = malloc(GEN * 4);
  memcpy(tok_cold, rc.tokens, GEN * 4);
  int64_t ids[200];
  size_t nb = 0;
  CHECK_OK(oi_executor_request_blocks(x, cold, ids, 200, &nb));
  uint8_t *kv_cold = download_blocks(&kv, ids, NB);
  CHECK_OK(oi_executor_flush(x, 30000));

  uint64_t hit = submit(x, p, N, GEN);
  CHECK_OK(oi_executor_run_until_idle(x));
  oi_request_result rh = {.struct_size = sizeof rh};
  CHECK_OK(oi_executor_get_result(x, hit, &rh));
  CHECK(rh.cached_tokens == NB * PAGE);
  CHECK(rh.n_tokens == GEN && !memcmp(rh.tokens, tok_cold, GEN * 4));
  CHECK_OK(oi_executor_flush(x, 30000));

  uint64_t ev = 0;
  CHECK_OK(oi_executor_evict_gpu_cache(x, &ev));
  uint64_t rest = submit(x, p, N, GEN);
  uint32_t *p3 = prompt(500, 5);
  submit(x, p3, 500, 8); /* its prefill shares the overlapped step */
  CHECK_OK(oi_executor_run_until_idle(x));
  oi_executor_stats es = {.struct_size = sizeof es};
  CHECK_OK(oi_executor_get_stats(x, &es));
  /* The CUDA model waits per layer: the restore overlapped its forward. */
  CHECK(es.restores_overlapped == 1 && es.restores_completed == 1);
  oi_request_result rr = {.struct_size = sizeof rr};
  CHECK_OK(oi_executor_get_result(x, rest, &rr));
  CHECK(rr.restored_tokens == NB * PAGE);
  CHECK(rr.n_tokens == GEN && !memcmp(rr.tokens, tok_cold, GEN * 4));
  CHECK_OK(oi_executor_request_blocks(x, rest, ids, 200, &nb));
  uint8_t *kv_rest = download_blocks(&kv, ids, NB);
  bool kv_same = !memcmp(kv_cold, kv_rest, (size_t)NB * L_ * kv.block_stride);
  CHECK(kv_same);
  /* A load that fails after the overlapped forward was queued: that forward
   * is discarded and the prompt prefilled; the tokens still match. */
  CHECK_OK(oi_executor_flush(x, 30000));
  CHECK_OK(oi_executor_evict_gpu_cache(x, NULL));
  inject_load_failure = 1;
  uint64_t failed = submit(x, p, N, GEN);
  CHECK_OK(oi_executor_run_until_idle(x));
  oi_request_result rf = {.struct_size = sizeof rf};
  CHECK_OK(oi_executor_get_result(x, failed, &rf));
  oi_executor_stats es2 = {.struct_size = sizeof es2};
  CHECK_OK(oi_executor_get_stats(x, &es2));
  CHECK(es2.restores_overlapped == 2 && es2.restores_failed == es.restores_failed + 1);
  CHECK(rf.restored_tokens == 0 && rf.computed_tokens == N);
  CHECK(rf.n_tokens == GEN && !memcmp(rf.tokens, tok_cold, GEN * 4));
  printf("  overlapped restores: %llu; a load failed after its forward was queued -> prefilled "
         "%u tokens, tokens %s\n",
         (unsigned long long)es2.restores_overlapped, rf.computed_tokens,
         rf.n_tokens == GEN && !memcmp(rf.tokens, tok_cold, GEN * 4) ? "identical" : "DIFFER");
  int same_hit = !memcmp(rh.tokens, tok_cold, GEN * 4),
      same_rest = !memcmp(rr.tokens, tok_cold, GEN * 4);
  printf(
      "  executor parity (%u-token prompt, %u generated): cold computed %u; prefix hit cached %u "
      "-> tokens %s; evicted %llu blocks, restored %u -> tokens %s; restored KV (%u blocks x %u "
      "layers) %s cold KV\n",
      N, GEN, rc.computed_tokens, rh.cached_tokens, same_hit ? "identical" : "DIFFER",
      (unsigned long long)ev, rr.restored_tokens, same_rest ? "identical" : "DIFFER", NB, L_,
      kv_same ? "==" : "!=");
  printf("  first tokens:");
  for (int i = 0; i < 12; i++)
    printf(" %u", tok_cold[i]);
  printf("\n");
  oi_executor_destroy(x);
  free(kv_cold), free(kv_rest), free(tok_cold), free(p), free(p2), free(p3);
}

int main(void) {
  int n = 0;
  if (oi_device_count(&n) != OI_OK || n == 0) TEST_SKIP("no CUDA device");
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  oi_refmodel_options ro;
  opts(&ro);
  ops.struct_size = sizeof ops;
  REQUIRE(oi_refmodel_create(&ro, &ops, &ctx) == OI_OK);
  oi_model_desc d = {.struct_size = sizeof d};
  REQUIRE(ops.describe(ctx, &d) == OI_OK && d.dtype_bytes == 2);
  RUN_TEST(test_kernels_against_cpu_and_chunking);
  RUN_TEST(test_executor_parity);
  oi_refmodel_destroy(ctx);
  TEST_EXIT();
}
