/* Engine round trips on the cuda backend, in every copy mode: save -> flush ->
 * query -> load into different block ids -> every (block, arena, segment)
 * byte matches, blocks not loaded stay zero. Layouts: 99 GLM5.2-shaped arenas,
 * a page-first Qwen3-4B-shaped one, split K/V, and uneven sizes at unaligned
 * offsets (exercising the kernel's vector heads and tails). Staged copies run
 * with the default slots and with 1 MiB slots (pieces straddle slots, the
 * ring wraps). Also: a load's
 * ticket carries a CUDA event, and a save waits on the caller's event.
 * Skips (77) without a GPU. */
#include "device/device.h"
#include "rig.h"
#include "testutil.h"

static oi_dev *dev;

typedef struct arena_spec {
  uint64_t offset, bpb, stride, seg_stride;
  uint32_t segments;
} arena_spec;

typedef struct layout_case {
  const char *name;
  uint64_t blocks;
  uint32_t narenas;
  arena_spec *arenas;
  uint64_t region_bytes;
  /* NULL, or per arena where its V segment starts (segments as separate
   * regions: oi_engine_options.segment_offsets, K at 0) */
  const uint64_t *v_off;
} layout_case;

static uint64_t seg_at(const layout_case *lc, uint32_t a, uint32_t s) {
  return lc->v_off ? (s ? lc->v_off[a] : 0) : s * lc->arenas[a].seg_stride;
}

/* Byte of (logical block, arena, segment, offset): a swapped or shifted copy fails. */
static uint8_t expected_byte(uint64_t logical, uint32_t arena, uint32_t seg, uint64_t off) {
  uint64_t seed = logical * 1000003ull + arena * 7919ull + seg * 31ull + 1;
  return oi__pattern_byte(seed, off);
}

static void run_case(const layout_case *lc, uint32_t mode, uint32_t ctas, uint32_t staging_mb,
                     bool layered) {
  uint8_t *region = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, lc->region_bytes, 0, (void **)&region) == OI_OK);
  uint8_t *host = calloc(1, lc->region_bytes);
  REQUIRE(host);
  const uint64_t half =
      lc->blocks / 2; /* save blocks [0, half), load into [half, 2*half) reversed */
  for (uint64_t b = 0; b < half; b++)
    for (uint32_t a = 0; a < lc->narenas; a++)
      for (uint32_t s = 0; s < lc->arenas[a].segments; s++) {
        const arena_spec *as = &lc->arenas[a];
        uint8_t *p = host + as->offset + b * as->stride + seg_at(lc, a, s);
        for (uint64_t i = 0; i < as->bpb; i++)
          p[i] = expected_byte(b, a, s, i);
      }
  REQUIRE(dev->ops->mem_copy(dev, region, host, lc->region_bytes) == OI_OK);

  oi_host_options ho = tr_host_options(256ull << 20);
  ho.chunk_bytes = 32ull << 20;
  ho.device = 0;
  oi_host *h = tr_host_new(&ho);
  oi_arena_desc *ad = calloc(lc->narenas, sizeof *ad);
  char(*names)[16] = calloc(lc->narenas, sizeof *names);
  REQUIRE(ad && names);
  for (uint32_t a = 0; a < lc->narenas; a++) {
    snprintf(names[a], sizeof names[a], "a%u", a);
    ad[a] = (oi_arena_desc){.name = names[a],
                            .offset = lc->arenas[a].offset,
                            .num_blocks = lc->blocks,
                            .bytes_per_block = lc->arenas[a].bpb,
                            .block_stride = lc->arenas[a].stride,
                            .segments = lc->arenas[a].segments,
                            .segment_stride = lc->arenas[a].seg_stride};
  }
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.device = 0;
  eo.namespace_id = lc->name;
  eo.arenas = ad;
  eo.num_arenas = lc->narenas;
  eo.arena_base = region;
  eo.arena_size = lc->region_bytes;
  eo.copy_mode = mode;
  eo.copy_cta_limit = ctas;
  eo.staging_bytes = (uint64_t)staging_mb << 20;
  uint64_t offs[2 * 64];
  if (lc->v_off) {
    REQUIRE(lc->narenas <= 64);
    for (uint32_t a = 0; a < lc->narenas; a++) {
      offs[2 * a] = 0;
      offs[2 * a + 1] = lc->v_off[a];
    }
    eo.segment_offsets = offs;
    eo.num_segment_offsets = 2 * lc->narenas;
  }
  oi_engine *e = tr_engine_new(h, &eo);

  int64_t *ids = calloc(half, sizeof *ids), *dst = calloc(half, sizeof *dst);
  oi_block_hash *hs = calloc(half, sizeof *hs);
  REQUIRE(ids && dst && hs);
  for (uint64_t b = 0; b < half; b++) {
    ids[b] = (int64_t)b;
    dst[b] = (int64_t)(lc->blocks - 1 - b);
    memcpy(hs[b].bytes, &b, sizeof b);
    hs[b].bytes[15] = 0x5a;
  }
  /* The save waits on an event the "model" recorded after writing the KV. */
  oi_stream *compute = NULL;
  void *kv_written = NULL;
  REQUIRE(dev->ops->stream_create(dev, 0, &compute) == OI_OK);
  REQUIRE(dev->ops->stream_record_event(compute, &kv_written) == OI_OK && kv_written);
  oi_save_options so;
  oi_save_options_init(&so);
  so.wait_event = kv_written;
  oi_ticket *t = NULL;
  CHECK_OK(oi_engine_save(e, ids, hs, half, &so, &t));
  CHECK_OK(oi_ticket_wait(t, 60000));
  oi_ticket_release(t);
  CHECK_OK(oi_engine_flush(e, 60000));
  oi_query_result q = {.struct_size = sizeof q};
  CHECK_OK(oi_engine_query(e, "r", hs, half, 0, &q));
  CHECK(q.hit_blocks == half);
  oi_load_options lo;
  oi_load_options_init(&lo);
  if (layered) lo.flags = OI_LOAD_ARENA_EVENTS;
  CHECK_OK(oi_engine_load(e, q.lease, dst, half, &lo, &t));
  CHECK(oi_ticket_cuda_event(t) != NULL);
  /* Layered: one event per arena (the model waits on each), none past them. */
  uint32_t events = 0;
  for (uint32_t a = 0; a < lc->narenas; a++) {
    void *ev = oi_ticket_arena_event(t, a);
    events += ev != NULL;
    if (ev) CHECK_OK(dev->ops->stream_wait_event(compute, ev));
  }
  CHECK(events == (layered ? lc->narenas : 0));
  CHECK(oi_ticket_arena_event(t, lc->narenas) == NULL);
  /* Per-arena completion (every mode's oi_ticket_arena_wait): in order, OK. */
  for (uint32_t a = 0; layered && a < lc->narenas; a++) {
    CHECK_OK(oi_ticket_arena_wait(t, a, 60000));
    CHECK_OK(oi_ticket_arena_poll(t, a));
  }
  CHECK_OK(dev->ops->stream_sync(compute));
  CHECK_OK(oi_ticket_wait(t, 60000));
  oi_ticket_release(t);

  REQUIRE(dev->ops->mem_copy(dev, host, region, lc->region_bytes) == OI_OK);
  uint64_t bad = 0, untouched_bad = 0;
  for (uint64_t b = 0; b < half; b++)
    for (uint32_t a = 0; a < lc->narenas; a++)
      for (uint32_t s = 0; s < lc->arenas[a].segments; s++) {
        const arena_spec *as = &lc->arenas[a];
        const uint8_t *p = host + as->offset + (uint64_t)dst[b] * as->stride + seg_at(lc, a, s);
        for (uint64_t i = 0; i < as->bpb; i++)
          bad += p[i] != expected_byte(b, a, s, i);
      }
  /* Blocks between the saved and the loaded range (odd block counts) stay zero. */
  if (lc->blocks % 2)
    for (uint32_t a = 0; a < lc->narenas; a++) {
      const arena_spec *as = &lc->arenas[a];
      const uint8_t *p = host + as->offset + half * as->stride;
      for (uint64_t i = 0; i < as->bpb; i++)
        untouched_bad += p[i] != 0;
    }
  CHECK(bad == 0);
  CHECK(untouched_bad == 0);
  fprintf(stderr, "  %-22s mode %u ctas %3u%s: %s\n", lc->name, mode, ctas,
          layered ? " layered" : "", bad || untouched_bad ? "MISMATCH" : "bytes match");
  dev->ops->event_destroy(kv_written);
  dev->ops->stream_destroy(compute);
  oi_engine_destroy(e);
  oi_host_destroy(h);
  dev->ops->mem_free(dev, region);
  free(host);
  free(ad);
  free(names);
  free(ids);
  free(dst);
  free(hs);
}

static layout_case glm(void) {
  static arena_spec a[99];
  uint64_t off = 0, blocks = 9;
  for (int i = 0; i < 99; i++) {
    uint64_t bpb = i < 78 ? 41984 : 8448;
    a[i] = (arena_spec){off, bpb, bpb, 0, 1};
    off += bpb * blocks;
  }
  return (layout_case){"glm5.2", blocks, 99, a, off, NULL};
}

static layout_case qwen(void) {
  static arena_spec a[36];
  uint64_t page = 36ull * 65536, blocks = 6;
  for (int i = 0; i < 36; i++)
    a[i] = (arena_spec){(uint64_t)i * 65536, 65536, page, 0, 1};
  return (layout_case){"qwen3-4b-page-first", blocks, 36, a, page * blocks, NULL};
}

static layout_case split_kv(void) {
  /* K and V of one layer in one arena: segment_stride > bytes_per_block. */
  static arena_spec a[2] = {{0, 12288, 3 * 12288 + 512, 12288 + 512, 2},
                            {64 * (3 * 12288 + 512), 4096, 2 * 4096 + 64, 4096 + 32, 2}};
  return (layout_case){"split-kv", 64, 2, a, 64 * (3 * 12288 + 512) + 64 * (2 * 4096 + 64), NULL};
}

static layout_case uneven(void) {
  /* Sizes and offsets that are not multiples of 16 (or even 2). */
  static arena_spec a[4] = {{3, 100, 113, 0, 1},
                            {3 + 113 * 17 + 5, 4099, 4099, 0, 1},
                            {3 + 113 * 17 + 5 + 4099 * 17 + 9, 17, 29, 0, 1},
                            {3 + 113 * 17 + 5 + 4099 * 17 + 9 + 29 * 17 + 1, 200003, 200008, 0, 1}};
  return (layout_case){"uneven-unaligned",
                       17,
                       4,
                       a,
                       3 + 113 * 17 + 5 + 4099 * 17 + 9 + 29 * 17 + 1 + 200008 * 17,
                       NULL};
}

static layout_case vllm_halves(void) {
  /* vLLM's [2, num_blocks, 16, 8, 128] bf16 layer: one arena per layer, its K
   * half then its V half (32 KiB pieces), 36 layers. */
  static arena_spec a[36];
  static uint64_t v[36];
  uint64_t blocks = 8, bpb = 32768;
  for (int i = 0; i < 36; i++) {
    a[i] = (arena_spec){(uint64_t)i * 2 * blocks * bpb, bpb, bpb, 0, 2};
    v[i] = blocks * bpb;
  }
  return (layout_case){"vllm-kv-halves", blocks, 36, a, 36 * 2 * blocks * bpb, v};
}

int main(void) {
  int n = 0;
  oi_device_count(&n);
  if (n == 0) TEST_SKIP("no CUDA device");
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  layout_case cases[] = {glm(), qwen(), split_kv(), uneven(), vllm_halves()};
  /* staging_mb: 0 = the default staging (32 MiB); 4 = 1 MiB slots, so the
   * batch wraps the slot ring many times and pieces straddle slots. */
  /* layered: loads with OI_LOAD_ARENA_EVENTS (arena by arena; staged
   * becomes DMA). */
  struct {
    uint32_t mode, ctas, staging_mb;
    bool layered;
  } modes[] = {{OI_COPY_KERNEL, 0, 0, false},   {OI_COPY_KERNEL, 1, 0, false},
               {OI_COPY_KERNEL, 132, 0, false}, {OI_COPY_DMA, 0, 0, false},
               {OI_COPY_AUTO, 0, 0, false},     {OI_COPY_STAGED, 0, 0, false},
               {OI_COPY_STAGED, 1, 4, false},   {OI_COPY_STAGED, 132, 4, false},
               {OI_COPY_AUTO, 0, 0, true},      {OI_COPY_KERNEL, 16, 0, true},
               {OI_COPY_DMA, 0, 0, true}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
      run_case(&cases[c], modes[m].mode, modes[m].ctas, modes[m].staging_mb, modes[m].layered);
    }
  oi__dev_close(dev);
  fprintf(stderr, "%-60s %s\n", "test_engine_round_trips_on_cuda_in_every_copy_mode",
          oi_test_failures ? "FAILED" : "ok");
  TEST_EXIT();
}
