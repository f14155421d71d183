/*
 * libopeninfer — the model interface: what the executor (executor.h) asks of
 * the model it drives. A model is a vtable (oi_model_ops) and a context; it
 * describes its KV needs, is bound to each rank's KV arena, and runs forward
 * batches over it.
 *
 * Stability: part of the OPENINFER_0.1 ABI. This header declares types only
 * (no exported function): a model is implemented by the caller, or by the
 * experimental reference model (experimental.h).
 */
#ifndef OPENINFER_MODEL_H
#define OPENINFER_MODEL_H

#include "openinfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a model needs in the KV arena, per layer and token. Output struct of
 * oi_model_ops.describe (the executor sets struct_size). */
typedef struct oi_model_desc {
  uint32_t struct_size;
  uint32_t num_layers; /* one arena per layer */
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype_bytes; /* bytes of one K or V element (4: float32, 2: bf16/fp16) */
  uint32_t vocab_size;
  uint32_t max_positions; /* longest sequence the model accepts (prompt + generated) */
  /* Names the weights and KV format, e.g. "refmodel-v1 seed=1 L2 d64 ...":
   * the executor's default namespace is derived from it, so two models whose
   * KV bytes differ must never report the same id. Owned by the model; valid
   * while its ctx lives. */
  const char *model_id;
  uint32_t flags; /* OI_MODEL_* capabilities */
} oi_model_desc;

/* oi_model_desc.flags */
enum {
  /* forward honours oi_model_batch.kv_events: it makes its CUDA stream wait
   * for layer l's events before it reads layer l's KV. The executor then
   * queues the forward of a restored prompt's last tokens while the restore
   * is still loading (layer by layer), instead of after it. */
  OI_MODEL_KV_EVENTS = 1u << 0,
};

/* Where a rank's KV lives. One arena per layer; in each arena a block is its
 * K page followed by its V page (the [num_blocks, 2, page, kv_heads,
 * head_dim] shape; the offload engine sees it as 2 segments). The element (head h, dim d) of token
 * slot t of block b, layer l is K: base + l*layer_stride + b*block_stride + t*token_stride +
 * (h*head_dim + d)*dtype_bytes V: the same + segment_stride A token at position p of a sequence
 * lives in block block_table[p / page_size], slot p % page_size (the slot mapping is implied by the
 * block table). */
typedef struct oi_kv_layout {
  uint32_t struct_size;
  int32_t device; /* -1 cpu (base is host memory); else a CUDA device pointer */
  void *base;
  uint64_t bytes; /* of the whole region */
  uint32_t num_layers;
  uint32_t page_size;      /* tokens per block */
  uint64_t num_blocks;     /* blocks per arena */
  uint64_t layer_stride;   /* bytes between two layers' arenas */
  uint64_t block_stride;   /* bytes between two blocks of one arena (a K page + a V page) */
  uint64_t segment_stride; /* bytes from a block's K page to its V page */
  uint64_t token_stride;   /* bytes between two token slots of a page */
} oi_kv_layout;

/* One sequence of a forward batch. */
typedef struct oi_model_seq {
  uint64_t request_id;    /* for logs */
  const uint32_t *tokens; /* the n_tokens new tokens */
  uint32_t n_tokens;
  uint32_t position;          /* position of tokens[0]: KV of [0, position) is in the arena */
  const int64_t *block_table; /* n_blocks ids covering at least [0, position + n_tokens) */
  uint32_t n_blocks;
  uint32_t want_token; /* 1: sample after the last new token */
  uint32_t next_token; /* out (want_token): greedy argmax of the last row's logits */
  float *logits;       /* optional out (want_token): vocab_size floats of the last row */
} oi_model_seq;

typedef struct oi_model_batch {
  uint32_t struct_size;
  uint32_t rank;
  uint32_t n_seqs;
  oi_model_seq *seqs;
  /* Restores still loading (models with OI_MODEL_KV_EVENTS; 0 otherwise).
   * kv_events[i * num_layers + l] is a CUDA event (cudaEvent_t) after which
   * restore i's blocks of layer l are in the arena; NULL: nothing to wait
   * for. Before the forward reads layer l's KV it makes its stream wait for
   * every restore's layer-l event. If a load then fails, the executor
   * discards what the forward computed for that sequence and recomputes it.
   * Valid during the call (the model reads these fields only when
   * struct_size covers them). */
  uint32_t n_kv_waits;
  void *const *kv_events;
} oi_model_batch;

/* The model vtable. The executor calls describe once, bind once per rank
 * (from the thread that creates the executor, after the rank's arena exists
 * and before any forward), forward from the rank's worker thread (ranks run
 * concurrently; calls for one rank never overlap), and unbind per rank before
 * that rank's arena goes away.
 *
 * forward must write the K and V of every new token into its slot and must
 * be batch-invariant for the executor's guarantees to hold: a row's result
 * (its KV bytes and logits) may not depend on the other rows of the batch,
 * nor on how a sequence's tokens were split into chunks. */
typedef struct oi_model_ops {
  uint32_t struct_size;
  oi_status (*describe)(void *ctx, oi_model_desc *out);
  oi_status (*bind)(void *ctx, uint32_t rank, const oi_kv_layout *layout);
  oi_status (*forward)(void *ctx, const oi_model_batch *batch);
  void (*unbind)(void *ctx, uint32_t rank); /* optional */
} oi_model_ops;

#ifdef __cplusplus
}
#endif
#endif /* OPENINFER_MODEL_H */
