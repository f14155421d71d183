/* The reference model through its oi_model_ops, on an arena this test
 * allocates: deterministic, and batch-invariant (a sequence's KV bytes and
 * logits are identical alone or batched with others, and whether its prompt
 * is prefilled in one chunk, several chunks, or token by token). */
#include "testutil.h"

#define OI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#define PAGE 4
#define BLOCKS 64
#define VOCAB 512

static oi_model_ops ops;
static void *ctx;
static oi_model_desc desc;

typedef struct arena {
  oi_kv_layout kv;
  uint8_t *mem;
} arena;

static void arena_init(arena *a, uint32_t rank) {
  memset(a, 0, sizeof *a);
  oi_kv_layout *kv = &a->kv;
  kv->struct_size = sizeof *kv;
  kv->device = -1;
  kv->num_layers = desc.num_layers;
  kv->page_size = PAGE;
  kv->num_blocks = BLOCKS;
  kv->token_stride = (uint64_t)desc.num_kv_heads * desc.head_dim * desc.dtype_bytes;
  kv->segment_stride = kv->token_stride * PAGE;
  kv->block_stride = 2 * kv->segment_stride;
  kv->layer_stride = kv->block_stride * BLOCKS;
  kv->bytes = kv->layer_stride * kv->num_layers;
  a->mem = calloc(1, kv->bytes);
  REQUIRE(a->mem);
  kv->base = a->mem;
  REQUIRE(ops.bind(ctx, rank, kv) == OI_OK);
}

static void arena_fini(arena *a, uint32_t rank) {
  ops.unbind(ctx, rank);
  free(a->mem);
}

/* The bytes of positions [0, n) of a sequence whose block table is `table`,
 * every layer, K then V, gathered in position order. */
static void gather(const arena *a, const int64_t *table, uint32_t n, uint8_t *out) {
  const oi_kv_layout *kv = &a->kv;
  for (uint32_t l = 0; l < kv->num_layers; l++)
    for (uint32_t seg = 0; seg < 2; seg++)
      for (uint32_t p = 0; p < n; p++) {
        memcpy(out,
               a->mem + l * kv->layer_stride + table[p / PAGE] * kv->block_stride +
                   seg * kv->segment_stride + (p % PAGE) * kv->token_stride,
               kv->token_stride);
        out += kv->token_stride;
      }
}

static void make_tokens(uint32_t *t, uint32_t n, uint32_t seed) {
  for (uint32_t i = 0; i < n; i++)
    t[i] = (seed * 131u + i * 7919u + (i * i) % 97u) % VOCAB;
}

/* Runs `chunks` over one sequence on rank 0 and returns the argmax and
 * logits after the last token. */
static uint32_t run_chunked(arena *a, const uint32_t *tokens, uint32_t n, const int64_t *table,
                            const uint32_t *chunk_sizes, float *logits) {
  (void)a;
  uint32_t pos = 0, next = 0;
  for (uint32_t c = 0; pos < n; c++) {
    uint32_t len = chunk_sizes[c];
    if (pos + len > n) len = n - pos;
    oi_model_seq s = {.request_id = 1,
                      .tokens = tokens + pos,
                      .n_tokens = len,
                      .position = pos,
                      .block_table = table,
                      .n_blocks = (n + PAGE - 1) / PAGE,
                      .want_token = pos + len == n,
                      .logits = logits};
    oi_model_batch b = {.struct_size = sizeof b, .rank = 0, .n_seqs = 1, .seqs = &s};
    CHECK_OK(ops.forward(ctx, &b));
    pos += len;
    next = s.next_token;
  }
  return next;
}

static void test_chunking_does_not_change_kv_or_logits(void) {
  enum { N = 37 };
  uint32_t tokens[N];
  make_tokens(tokens, N, 3);
  int64_t table[(N + PAGE - 1) / PAGE];
  for (uint32_t i = 0; i < OI_ARRAY_LEN(table); i++)
    table[i] = 5 + 3 * i; /* scattered */
  static const uint32_t one[] = {N}, several[] = {5, 11, 3, 18},
                        single[N] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  const uint32_t *plans[] = {one, several, single};
  size_t kv_bytes = (size_t)2 * desc.num_layers * N * desc.num_kv_heads * desc.head_dim * 4;
  uint8_t *ref = malloc(kv_bytes), *got = malloc(kv_bytes);
  float ref_logits[VOCAB], logits[VOCAB];
  uint32_t ref_next = 0;
  for (int p = 0; p < 3; p++) {
    arena a;
    arena_init(&a, 0);
    uint32_t next = run_chunked(&a, tokens, N, table, plans[p], p ? logits : ref_logits);
    gather(&a, table, N, p ? got : ref);
    if (p == 0) {
      ref_next = next;
    } else {
      CHECK(next == ref_next);
      CHECK(!memcmp(ref, got, kv_bytes));
      CHECK(!memcmp(ref_logits, logits, sizeof logits));
    }
    arena_fini(&a, 0);
  }
  free(ref);
  free(got);
}

static void test_batching_does_not_change_a_sequence(void) {
  enum { NA = 22, NB = 9, NC = 30 };
  uint32_t ta[NA], tb[NB], tc[NC];
  make_tokens(ta, NA, 10);
  make_tokens(tb, NB, 11);
  make_tokens(tc, NC, 12);
  int64_t table_a[8] = {0, 1, 2, 3, 4, 5, 6, 7}, table_b[8] = {20, 21, 22, 23, 24, 25, 26, 27},
          table_c[8] = {40, 41, 42, 43, 44, 45, 46, 47};
  size_t a_bytes = (size_t)2 * desc.num_layers * NA * desc.num_kv_heads * desc.head_dim * 4;
  uint8_t *alone = malloc(a_bytes), *batched = malloc(a_bytes);
  float l_alone[VOCAB], l_batched[VOCAB];

  /* Alone. */
  arena a;
  arena_init(&a, 0);
  oi_model_seq s = {.tokens = ta,
                    .n_tokens = NA,
                    .block_table = table_a,
                    .n_blocks = 8,
                    .want_token = 1,
                    .logits = l_alone};
  oi_model_batch b = {.struct_size = sizeof b, .rank = 0, .n_seqs = 1, .seqs = &s};
  CHECK_OK(ops.forward(ctx, &b));
  uint32_t next_alone = s.next_token;
  gather(&a, table_a, NA, alone);
  arena_fini(&a, 0);

  /* In a batch: B's prefill first, then A, then C (already half prefilled). */
  arena_init(&a, 1);
  oi_model_seq pre = {.tokens = tc, .n_tokens = 13, .block_table = table_c, .n_blocks = 8};
  oi_model_batch pb = {.struct_size = sizeof pb, .rank = 1, .n_seqs = 1, .seqs = &pre};
  CHECK_OK(ops.forward(ctx, &pb));
  oi_model_seq seqs[3] = {
      {.tokens = tb, .n_tokens = NB, .block_table = table_b, .n_blocks = 8, .want_token = 1},
      {.tokens = ta,
       .n_tokens = NA,
       .block_table = table_a,
       .n_blocks = 8,
       .want_token = 1,
       .logits = l_batched},
      {.tokens = tc + 13,
       .n_tokens = NC - 13,
       .position = 13,
       .block_table = table_c,
       .n_blocks = 8,
       .want_token = 1},
  };
  oi_model_batch bb = {.struct_size = sizeof bb, .rank = 1, .n_seqs = 3, .seqs = seqs};
  CHECK_OK(ops.forward(ctx, &bb));
  CHECK(seqs[1].next_token == next_alone);
  gather(&a, table_a, NA, batched);
  CHECK(!memcmp(alone, batched, a_bytes));
  CHECK(!memcmp(l_alone, l_batched, sizeof l_alone));
  arena_fini(&a, 1);
  free(alone);
  free(batched);
}

static void test_deterministic_across_instances_and_seeds(void) {
  oi_refmodel_options ro;
  oi_refmodel_options_init(&ro);
  ro.seed = 7;
  oi_model_ops o2 = {.struct_size = sizeof o2};
  void *c2 = NULL;
  CHECK_OK(oi_refmodel_create(&ro, &o2, &c2));
  oi_model_desc d2 = {.struct_size = sizeof d2};
  CHECK_OK(o2.describe(c2, &d2));
  CHECK(!strcmp(d2.model_id, desc.model_id)); /* same options, same id */
  oi_refmodel_destroy(c2);
  ro.seed = 8;
  CHECK_OK(oi_refmodel_create(&ro, &o2, &c2));
  CHECK_OK(o2.describe(c2, &d2));
  CHECK(strcmp(d2.model_id, desc.model_id) != 0);
  /* A cuda rank is refused, not run on device memory. */
  oi_kv_layout kv = {.struct_size = sizeof kv,
                     .device = 0,
                     .base = &kv,
                     .num_layers = 2,
                     .page_size = 4,
                     .num_blocks = 1,
                     .token_stride = 1024};
  CHECK_ST(o2.bind(c2, 0, &kv), OI_ERR_UNSUPPORTED);
  oi_refmodel_destroy(c2);
  oi_refmodel_destroy(NULL);
  ro.num_kv_heads = 3;
  CHECK_ST(oi_refmodel_create(&ro, &o2, &c2), OI_ERR_INVALID_ARGUMENT);
}

int main(void) {
  oi_refmodel_options ro;
  oi_refmodel_options_init(&ro);
  ro.seed = 7;
  ops.struct_size = sizeof ops;
  REQUIRE(oi_refmodel_create(&ro, &ops, &ctx) == OI_OK);
  desc.struct_size = sizeof desc;
  REQUIRE(ops.describe(ctx, &desc) == OI_OK);
  REQUIRE(desc.vocab_size == VOCAB && desc.dtype_bytes == 4);
  RUN_TEST(test_chunking_does_not_change_kv_or_logits);
  RUN_TEST(test_batching_does_not_change_a_sequence);
  RUN_TEST(test_deterministic_across_instances_and_seeds);
  oi_refmodel_destroy(ctx);
  TEST_EXIT();
}
