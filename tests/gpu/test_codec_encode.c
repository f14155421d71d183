/* The GPU encoder of the wide rANS stream (kernels/codec_encode.cu)
 * against the cpu's (lib/codec/rans32.c): every stream the GPU writes must
 * be the cpu's, byte for byte, and so must its refusals:
 *  - a GLM5.2-sized block of the committed real-KV corpus (argv[1]) cut
 *    into the encoder's streams of 32,768 exponents;
 *  - lengths that fill no round, one round, part of the last round;
 *  - one symbol (zeros), uniform random exponents (with room, and with a
 *    cap they do not fit: length 0 from both);
 * and every GPU stream decodes (oi__rans32_decode) to its exponents.
 * `--rates`: the encoder's rate over 256 GLM5.2 blocks' streams, in
 * logical bytes, beside a bulk D2H of the same bytes in the same run.
 * Skips (77) without a GPU. */
#include <cuda_runtime.h>

#include "../codec/codec_testutil.h"
#include "codec/rans.h"
#include "core/core.h"
#include "cu_check.h"
#include "kernels/kernels.h"
#include "testutil.h"

static uint8_t *corpus;
static size_t corpus_len;

/* One stream to encode: `count` bf16 elements of `elems` from `first`. */
typedef struct enc_case {
  size_t first, count;
  uint32_t cap;
} enc_case;

/* Encodes every case on the GPU and the cpu; returns the cases that differ. */
static size_t check_cases(const char *what, const uint16_t *elems, size_t nelems,
                          const enc_case *cs, size_t n) {
  uint16_t *d_elems = NULL;
  CU(cudaMalloc((void **)&d_elems, nelems * 2));
  CU(cudaMemcpy(d_elems, elems, nelems * 2, cudaMemcpyHostToDevice));
  size_t total = 0;
  for (size_t k = 0; k < n; k++)
    total += cs[k].cap;
  uint8_t *d_out = NULL, *d_scratch = NULL;
  uint32_t *d_lens = NULL;
  oi_kenc_item *items = calloc(n, sizeof *items), *d_items = NULL;
  REQUIRE(items);
  CU(cudaMalloc((void **)&d_out, total));
  CU(cudaMalloc((void **)&d_scratch, total));
  CU(cudaMalloc((void **)&d_lens, n * 4));
  CU(cudaMalloc((void **)&d_items, n * sizeof *items));
  for (size_t k = 0, at = 0; k < n; at += cs[k].cap, k++)
    items[k] = (oi_kenc_item){.src = (uint64_t)(uintptr_t)(d_elems + cs[k].first),
                              .dst = (uint64_t)(uintptr_t)(d_out + at),
                              .scratch = (uint64_t)(uintptr_t)(d_scratch + at),
                              .count = (uint32_t)cs[k].count,
                              .cap = cs[k].cap};
  CU(cudaMemcpy(d_items, items, n * sizeof *items, cudaMemcpyHostToDevice));
  CU((cudaError_t)oi_kernel_rans32_encode(d_items, (uint32_t)n, d_lens, NULL));
  CU(cudaDeviceSynchronize());
  uint8_t *gpu = malloc(total), *cpu = malloc(total);
  uint32_t *lens = malloc(n * 4);
  REQUIRE(gpu && cpu && lens);
  CU(cudaMemcpy(gpu, d_out, total, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(lens, d_lens, n * 4, cudaMemcpyDeviceToHost));
  size_t bad = 0, fitted = 0;
  for (size_t k = 0, at = 0; k < n; at += cs[k].cap, k++) {
    uint8_t *exp = malloc(cs[k].count + 1), *back = malloc(cs[k].count + 1);
    REQUIRE(exp && back);
    for (size_t i = 0; i < cs[k].count; i++)
      exp[i] = (uint8_t)(elems[cs[k].first + i] >> 7);
    size_t c = oi__rans32_encode(exp, cs[k].count, cpu + at, cs[k].cap);
    bool same = c == lens[k] && (c == 0 || !memcmp(cpu + at, gpu + at, c));
    if (same && c)
      same =
          oi__rans32_decode(gpu + at, c, back, cs[k].count) == 0 && !memcmp(back, exp, cs[k].count);
    if (!same) {
      fprintf(stderr, "%s: stream %zu (%zu exponents, cap %u): gpu %u bytes, cpu %zu\n", what, k,
              cs[k].count, cs[k].cap, lens[k], c);
      bad++;
    }
    fitted += c != 0;
    free(exp);
    free(back);
  }
  printf("%-44s %6zu streams (%zu coded), %zu differ\n", what, n, fitted, bad);
  free(gpu);
  free(cpu);
  free(lens);
  free(items);
  cudaFree(d_elems);
  cudaFree(d_out);
  cudaFree(d_scratch);
  cudaFree(d_lens);
  cudaFree(d_items);
  return bad;
}

static uint32_t room_for(size_t count) { return (uint32_t)(2 + 2 * 256 + 128 + 2 * count + 64); }

static void test_corpus_block(void) {
  size_t nel = 3452160 / 2;
  uint16_t *el = malloc(nel * 2);
  REQUIRE(el);
  for (size_t i = 0; i < nel * 2; i++)
    ((uint8_t *)el)[i] = corpus[i % corpus_len];
  size_t n = (nel + OI_LOSSLESS_SEGMENT_MAX - 1) / OI_LOSSLESS_SEGMENT_MAX;
  enc_case *cs = calloc(n, sizeof *cs);
  REQUIRE(cs);
  for (size_t k = 0; k < n; k++) {
    cs[k].first = k * OI_LOSSLESS_SEGMENT_MAX;
    cs[k].count = OI_MIN((size_t)OI_LOSSLESS_SEGMENT_MAX, nel - cs[k].first);
    cs[k].cap = room_for(cs[k].count);
  }
  CHECK(check_cases("a GLM5.2-sized block of the corpus", el, nel, cs, n) == 0);
  /* lengths around a round */
  const size_t lens[] = {1, 31, 32, 33, 8192, 70000};
  enc_case c2[6];
  for (size_t k = 0; k < 6; k++)
    c2[k] = (enc_case){.first = 1000 * k, .count = lens[k], .cap = room_for(lens[k])};
  CHECK(check_cases("the corpus, 1 to 70,000 exponents", el, nel, c2, 6) == 0);
  free(cs);
  free(el);
}

static void test_edges(void) {
  size_t nel = 40000;
  uint16_t *el = calloc(2 * nel, 2);
  REQUIRE(el);
  uint64_t seed = 5;
  for (size_t i = nel; i < 2 * nel; i++) /* the second half: uniform random */
    el[i] = (uint16_t)ct_rand(&seed);
  enc_case cs[] = {{0, 20000, 0}, {nel, 20000, 0}, {nel, 20000, 20000}, {nel, 64, 100}};
  cs[0].cap = room_for(20000);
  cs[1].cap = room_for(20000);
  CHECK(check_cases("zeros; random, with room and without", el, 2 * nel, cs, 4) == 0);
  free(el);
}

/* The encoder's rate over 256 GLM5.2 blocks' streams, beside a bulk D2H of
 * the same bytes. */
static void rates(void) {
  size_t blocks = 256, nel = (size_t)blocks * 3452160 / 2, bytes = nel * 2;
  uint16_t *el = NULL, *d_el = NULL;
  CU(cudaMallocHost((void **)&el, bytes));
  for (size_t i = 0; i < bytes; i++)
    ((uint8_t *)el)[i] = corpus[i % corpus_len];
  size_t n = nel / OI_LOSSLESS_SEGMENT_MAX;
  uint32_t cap = room_for(OI_LOSSLESS_SEGMENT_MAX);
  uint8_t *d_out = NULL, *d_scratch = NULL;
  uint32_t *d_lens = NULL;
  oi_kenc_item *items = calloc(n, sizeof *items), *d_items = NULL;
  REQUIRE(items);
  CU(cudaMalloc((void **)&d_el, bytes));
  CU(cudaMemcpy(d_el, el, bytes, cudaMemcpyHostToDevice));
  CU(cudaMalloc((void **)&d_out, n * cap));
  CU(cudaMalloc((void **)&d_scratch, n * cap));
  CU(cudaMalloc((void **)&d_lens, n * 4));
  CU(cudaMalloc((void **)&d_items, n * sizeof *items));
  for (size_t k = 0; k < n; k++)
    items[k] = (oi_kenc_item){.src = (uint64_t)(uintptr_t)(d_el + k * OI_LOSSLESS_SEGMENT_MAX),
                              .dst = (uint64_t)(uintptr_t)(d_out + k * cap),
                              .scratch = (uint64_t)(uintptr_t)(d_scratch + k * cap),
                              .count = OI_LOSSLESS_SEGMENT_MAX,
                              .cap = cap};
  CU(cudaMemcpy(d_items, items, n * sizeof *items, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  float best_enc = 1e30f, best_d2h = 1e30f;
  for (int rep = 0; rep < 5; rep++) {
    float ms = 0;
    CU(cudaEventRecord(a, NULL));
    CU((cudaError_t)oi_kernel_rans32_encode(d_items, (uint32_t)n, d_lens, NULL));
    CU(cudaEventRecord(b, NULL));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&ms, a, b));
    if (ms < best_enc) best_enc = ms;
    CU(cudaEventRecord(a, NULL));
    CU(cudaMemcpyAsync(el, d_el, bytes, cudaMemcpyDeviceToHost, NULL));
    CU(cudaEventRecord(b, NULL));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&ms, a, b));
    if (ms < best_d2h) best_d2h = ms;
  }
  printf("wide-stream encode, 256 GLM5.2 blocks (%zu streams): %.1f GB/s of logical bytes "
         "(%.0f us); bulk D2H of them %.1f GB/s: %.2fx\n",
         n, (double)bytes / best_enc / 1e6, best_enc * 1e3, (double)bytes / best_d2h / 1e6,
         best_d2h / best_enc);
  free(items);
  cudaFreeHost(el);
  cudaFree(d_el);
  cudaFree(d_out);
  cudaFree(d_scratch);
  cudaFree(d_lens);
  cudaFree(d_items);
}

int main(int argc, char **argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) TEST_SKIP("no CUDA device");
  REQUIRE(argc >= 2);
  corpus = ct_read_file(argv[1], &corpus_len);
  REQUIRE(corpus && corpus_len % CORPUS_PAGE_BYTES == 0);
  test_corpus_block();
  test_edges();
  if (argc >= 3 && strcmp(argv[2], "--rates") == 0) rates();
  free(corpus);
  fprintf(stderr, "%-60s %s\n", "test_codec_encode", oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
