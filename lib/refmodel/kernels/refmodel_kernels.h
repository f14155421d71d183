/* Launchers of the CUDA reference model's kernels (extern "C", called only
 * from lib/refmodel). bf16 weights, activations and KV; fp32 accumulation and
 * residual stream. Every kernel is batch-invariant: a row's result depends on
 * that row alone (no split-K, one fixed reduction order per output element),
 * so a sequence's KV bytes and logits do not depend on batching or chunking.
 * Each returns a cudaError_t as int. */
#ifndef OI_REFMODEL_KERNELS_H
#define OI_REFMODEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Attention reduces keys in fixed segments of this many positions (partials
 * merged in segment order), the same for prefill and decode. */
#define OI_RM_ATTN_SEG 2048u
#define OI_RM_ATTN_QTILE 64u

/* GEMM epilogues: C = A[M][K] . W[N][K]^T */
enum {
  OI_RM_EPI_BF16 = 0,   /* C (bf16 [M][N]) = acc */
  OI_RM_EPI_RESID = 1,  /* C (fp32 [M][N]) += acc */
  OI_RM_EPI_SWIGLU = 2, /* W rows interleave gate/up: C (bf16 [M][N/2]) = silu(g) * u */
  OI_RM_EPI_F32 = 3,    /* C (fp32 [M][N]) = acc */
};

/* K must be a multiple of 64, N even. */
int oi_rm_gemm(int epi, const uint16_t *A, const uint16_t *W, void *C, uint32_t M, uint32_t N,
               uint32_t K, void *stream);

int oi_rm_gen_bf16(uint16_t *dst, uint64_t n, uint64_t seed, uint32_t tensor, float scale,
                   void *stream);
/* [2F][H]: row 2i is gate row i, row 2i+1 up row i. */
int oi_rm_gen_gate_up(uint16_t *dst, uint32_t F, uint32_t H, uint64_t seed, uint32_t t_gate,
                      uint32_t t_up, float scale, void *stream);
/* 1 + uniform(0.1), fp32 */
int oi_rm_gen_norm(float *dst, uint32_t n, uint64_t seed, uint32_t tensor, void *stream);
/* Fills bf16 uniform(-1, 1) values from a seed (benchmarks). */
int oi_rm_fill_random(uint16_t *dst, uint64_t n, uint64_t seed, void *stream);

int oi_rm_embed(const uint32_t *tokens, uint32_t T, const uint16_t *emb, uint32_t H, float *x,
                void *stream);
/* out[r] = bf16(rmsnorm(x[rows ? rows[r] : r]) * w), r in [0, R). */
int oi_rm_rmsnorm(const float *x, const uint32_t *rows, uint32_t R, uint32_t H, const float *w,
                  float eps, uint16_t *out, void *stream);

/* RoPE on q and k of each row (in place in qkv [T][(qh + 2 kvh) hd]), then
 * K and V into the row's slot: layer_base + slot_off[r] (+ seg_stride for V). */
int oi_rm_rope_kv(uint16_t *qkv, const uint32_t *pos, const uint64_t *slot_off, uint32_t T,
                  uint32_t qh, uint32_t kvh, uint32_t hd, const float *rope_cos,
                  const float *rope_sin, uint8_t *layer_base, uint64_t seg_stride, void *stream);

/* A query tile: rows [row0, row0 + nrows) of one sequence, positions pos0.. */
typedef struct oi_rm_item {
  uint32_t row0, nrows, pos0, table_off, n_blocks, pad;
} oi_rm_item;

typedef struct oi_rm_attn_params {
  const uint16_t *q; /* row r, head h at q + r * q_ld + h * hd */
  uint32_t q_ld;
  const uint8_t *layer_base;
  uint64_t block_stride, seg_stride, token_stride;
  uint32_t page_size;
  const int32_t *tables; /* block ids of every sequence, concatenated */
  const oi_rm_item *items;
  uint32_t n_items;
  uint32_t q_heads, kv_heads, head_dim; /* head_dim 64 or 128 */
  uint32_t nseg;                        /* segments of the longest sequence */
  uint32_t max_rows;                    /* the most rows of one item (<= OI_RM_ATTN_QTILE) */
  float scale_log2;                     /* log2(e) / sqrt(head_dim) */
  float *part_o;                        /* [T][q_heads][nseg][head_dim] */
  float *part_ml;                       /* [T][q_heads][nseg][2] */
} oi_rm_attn_params;

int oi_rm_attention(const oi_rm_attn_params *p, void *stream);
/* Merges the segments of each (row, head) in segment order: out bf16 [T][q_heads * hd]. */
int oi_rm_attn_combine(const float *part_o, const float *part_ml, const uint32_t *pos, uint32_t T,
                       uint32_t q_heads, uint32_t hd, uint32_t nseg, uint16_t *out, void *stream);

/* out[r] = the first index of the maximum of logits[r][0, V). */
int oi_rm_argmax(const float *logits, uint32_t R, uint32_t V, uint32_t *out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
