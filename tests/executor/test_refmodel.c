/* The reference model through its oi_model_ops, on an arena this test
 * allocates: deterministic, and batch-invariant (a sequence's KV bytes and
 * logits are identical alone or batched with others, and whether its prompt
 * is prefilled in one chunk, several chunks, or token by token). */
#include <math.h>

#include "refmodel/kernels/refmodel_gen.h"
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

/* Bad options are refused at create with a message naming what is wrong,
 * and nothing is returned. */
static void test_bad_options_are_refused(void) {
  oi_model_ops o2 = {.struct_size = sizeof o2};
  void *c2 = (void *)&o2;
  CHECK_ST(oi_refmodel_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_refmodel_create(NULL, NULL, &c2), OI_ERR_INVALID_ARGUMENT);
  CHECK(c2 == NULL && strstr(oi_last_error(), "ops_out is NULL"));
  CHECK_ST(oi_refmodel_create(NULL, &o2, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "ctx_out is NULL"));
  /* NULL options: the defaults. */
  CHECK_OK(oi_refmodel_create(NULL, &o2, &c2));
  REQUIRE(c2);
  oi_model_desc d2 = {.struct_size = sizeof d2};
  CHECK_OK(o2.describe(c2, &d2));
  CHECK(d2.num_layers == 2 && d2.vocab_size == 512 && d2.max_positions == 4096 &&
        d2.dtype_bytes == 4 && d2.flags == 0);
  /* describe into a struct too small: refused. */
  oi_model_desc tiny = {.struct_size = 2};
  CHECK_ST(o2.describe(c2, &tiny), OI_ERR_INVALID_ARGUMENT);
  oi_refmodel_destroy(c2);

  /* One bad field at a time: the status and a word of the message. */
  static const struct {
    oi_status st;
    const char *msg;
  } want[] = {
      {OI_ERR_INVALID_ARGUMENT, "struct_size 0 is too small"},
      {OI_ERR_INVALID_ARGUMENT, "a size is 0"},
      {OI_ERR_INVALID_ARGUMENT, "a size is 0"},
      {OI_ERR_INVALID_ARGUMENT, "does not divide"},
      {OI_ERR_INVALID_ARGUMENT, "head_dim 15 is odd"},
      {OI_ERR_INVALID_ARGUMENT, "out of range"},
      {OI_ERR_INVALID_ARGUMENT, "out of range"},
      {OI_ERR_INVALID_ARGUMENT, "rope_theta or rms_eps"},
      {OI_ERR_INVALID_ARGUMENT, "rope_theta or rms_eps"},
      {OI_ERR_INVALID_ARGUMENT, "rope_theta or rms_eps"},
      {OI_ERR_INVALID_ARGUMENT, "device -2"},
      {OI_ERR_UNSUPPORTED, "no CUDA backend"},
      {OI_ERR_INVALID_ARGUMENT, "ops_out->struct_size"},
  };
  for (size_t i = 0; i < OI_ARRAY_LEN(want); i++) {
#ifdef OI_HAVE_CUDA
    if (i == 11) continue; /* a CUDA build makes the CUDA model (gpu/test_refmodel_cuda) */
#endif
    oi_refmodel_options ro;
    oi_refmodel_options_init(&ro);
    oi_model_ops o3 = {.struct_size = sizeof o3};
    switch (i) {
    case 0: ro.struct_size = 0; break;
    case 1: ro.hidden = 0; break;
    case 2: ro.max_positions = 0; break;
    case 3: ro.num_q_heads = 6, ro.num_kv_heads = 4; break;
    case 4: ro.head_dim = 15; break;
    case 5: ro.hidden = 65537; break;
    case 6: ro.vocab_size = (1u << 22) + 1; break;
    case 7: ro.rope_theta = 1.0f; break;
    case 8: ro.rms_eps = 0.0f; break;
    case 9: ro.rms_eps = NAN; break;
    case 10: ro.device = -2; break;
    case 11: ro.device = 0; break;
    case 12: o3.struct_size = 0; break;
    }
    c2 = (void *)&o2;
    oi_status st = oi_refmodel_create(&ro, &o3, &c2);
    if (st != want[i].st || !strstr(oi_last_error(), want[i].msg) || c2 != NULL) {
      fprintf(stderr, "case %zu: %s '%s', expected %s '%s'\n", i, oi_status_str(st),
              oi_last_error(), oi_status_str(want[i].st), want[i].msg);
      CHECK(0);
    }
    if (st == OI_OK) oi_refmodel_destroy(c2);
  }
}

/* A layout that does not fit the model, a rank out of range and a forward
 * with bad sequences are refused with a message; the bound ranks keep
 * working and their KV is not touched by a refused row. */
static void test_bad_bind_and_forward_are_refused(void) {
  arena a;
  arena_init(&a, 0);
  oi_kv_layout kv = a.kv;
  CHECK_ST(ops.bind(ctx, 0, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "layout is NULL"));
  CHECK_ST(ops.bind(ctx, 1024, &kv), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "rank 1024 (at most 1024)"));
  kv.struct_size = 3;
  CHECK_ST(ops.bind(ctx, 1, &kv), OI_ERR_INVALID_ARGUMENT);
  kv = a.kv;
  kv.num_layers = 3;
  CHECK_ST(ops.bind(ctx, 1, &kv), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "does not fit the model (3 layers"));
  kv = a.kv;
  kv.base = NULL;
  CHECK_ST(ops.bind(ctx, 1, &kv), OI_ERR_INVALID_ARGUMENT);
  kv = a.kv;
  kv.page_size = 0;
  CHECK_ST(ops.bind(ctx, 1, &kv), OI_ERR_INVALID_ARGUMENT);
  kv = a.kv;
  kv.token_stride = a.kv.token_stride - 4; /* one float short */
  CHECK_ST(ops.bind(ctx, 1, &kv), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "token stride"));
  ops.unbind(ctx, 1024); /* out of range: nothing to do */
  ops.unbind(ctx, 5);    /* never bound: nothing to do */

  /* Forward: no batch, sequences missing, an unbound rank. */
  CHECK_ST(ops.forward(ctx, NULL), OI_ERR_INVALID_ARGUMENT);
  oi_model_batch b = {.struct_size = sizeof b, .rank = 0, .n_seqs = 1, .seqs = NULL};
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "batch is NULL"));
  uint32_t tokens[PAGE + 1] = {1, 2, 3, 4, 5};
  int64_t table[2] = {3, 4};
  oi_model_seq s = {.request_id = 9,
                    .tokens = tokens,
                    .n_tokens = 1,
                    .block_table = table,
                    .n_blocks = 2,
                    .want_token = 1};
  b.seqs = &s;
  b.rank = 7;
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_STATE);
  CHECK(strstr(oi_last_error(), "rank 7 is not bound"));
  b.rank = 1024;
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_STATE);
  b.rank = 0;
  /* Rows that cannot run; none writes a byte of KV. */
  uint8_t *before = malloc(a.kv.bytes);
  REQUIRE(before);
  memcpy(before, a.mem, a.kv.bytes);
  s.tokens = NULL;
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "sequence 0 has no tokens"));
  s.tokens = tokens;
  tokens[0] = VOCAB;
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "token 512 is not below vocab_size 512"));
  tokens[0] = 1;
  s.position = 4096;
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "position 4096 is not below max_positions 4096"));
  s.position = 2 * PAGE; /* past the 2-block table */
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "request 9 position 8 has no block (block table of 2)"));
  s.position = PAGE;
  table[0] = -1; /* every block up to the row's is checked */
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "block id -1 out of range (64 blocks)"));
  table[0] = BLOCKS;
  CHECK_ST(ops.forward(ctx, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "block id 64 out of range"));
  CHECK(!memcmp(before, a.mem, a.kv.bytes));
  /* The rank still works: a good row writes its slot and samples. */
  table[0] = 3;
  s.position = 0;
  s.n_tokens = PAGE + 1;
  CHECK_OK(ops.forward(ctx, &b));
  CHECK(s.next_token < VOCAB);
  CHECK(memcmp(before, a.mem, a.kv.bytes) != 0);
  free(before);
  arena_fini(&a, 0);
}

/* The CUDA model's weight generator (refmodel_gen.h), which the GPU tests
 * also run on the host to recompute the model: bf16 conversion rounds to
 * nearest even and is exact on bf16 values; weights are uniform in
 * [-scale, scale), a function of (seed, tensor, index) alone. */
static void test_cuda_weight_generator_on_the_host(void) {
  CHECK(oi_rm_f2bf(1.0f) == 0x3F80 && oi_rm_bf2f(0x3F80) == 1.0f);
  CHECK(oi_rm_f2bf(-2.0f) == 0xC000 && oi_rm_bf2f(0xC000) == -2.0f);
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one (1). */
  CHECK(oi_rm_f2bf(1.0f + 1.0f / 256) == 0x3F80);
  /* 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up. */
  CHECK(oi_rm_f2bf(1.0f + 3.0f / 256) == 0x3F82);
  /* Just over halfway rounds up; just under, down. */
  CHECK(oi_rm_f2bf(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3F81);
  CHECK(oi_rm_f2bf(1.0f + 1.0f / 256 - 1.0f / 65536) == 0x3F80);
  for (uint32_t b = 0; b < 0x7F80; b += 37) /* finite positive bf16 values round-trip */
    CHECK(oi_rm_f2bf(oi_rm_bf2f((uint16_t)b)) == b);
  CHECK(oi_rm_mix64(0) == 0 && oi_rm_mix64(1) != oi_rm_mix64(2));
  float lo = 1.0f, hi = -1.0f;
  double sum = 0;
  for (uint64_t i = 0; i < 100000; i++) {
    float u = oi_rm_uniform(7, 3, i, 0.5f);
    CHECK(u >= -0.5f && u < 0.5f);
    lo = u < lo ? u : lo;
    hi = u > hi ? u : hi;
    sum += u;
  }
  CHECK(lo < -0.49f && hi > 0.49f && sum / 100000 > -0.01 && sum / 100000 < 0.01);
  CHECK(oi_rm_uniform(7, 3, 12345, 1.0f) == oi_rm_uniform(7, 3, 12345, 1.0f));
  CHECK(oi_rm_uniform(7, 3, 12345, 1.0f) != oi_rm_uniform(8, 3, 12345, 1.0f));
  CHECK(oi_rm_uniform(7, 3, 12345, 1.0f) != oi_rm_uniform(7, 4, 12345, 1.0f));
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
  RUN_TEST(test_bad_options_are_refused);
  RUN_TEST(test_bad_bind_and_forward_are_refused);
  RUN_TEST(test_cuda_weight_generator_on_the_host);
  oi_refmodel_destroy(ctx);
  TEST_EXIT();
}
