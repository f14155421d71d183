/* The copy pipeline's saves for a device that makes frames
 * (dev_ops.stream_encode: the cuda backend's, docs/codecs.md "Saves on the
 * GPU"), run without a GPU. A test backend wraps the cpu one with a
 * stream_encode that does, on the stream's worker and in the stream's
 * order, what the GPU does: the blocks gathered by the copies the pipeline
 * planned, each framed (lib/codec's encoder: the GPU's frames are its,
 * byte for byte, tests/gpu/test_codec_frames), a frame past its slot marked
 * (the slot then holds junk), the statuses handed back. So the pipeline's
 * own part is checked here byte for byte: which namespaces qualify (blocks
 * whose streams are all wide, the lossy codecs; OI_CODEC_ENCODE=host), the
 * gather planned from
 * the layout (two arenas, blocks in groups), the frames and the zeros behind
 * them in the slots, the statuses turned into the blocks not kept, and a
 * device that refuses a batch. The real corpus (argv[1]). */
#include <stdatomic.h>
#include <unistd.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "core/fault.h"
#include "device/device.h"
#include "engine/layout.h"
#include "rig.h"
#include "testutil.h"
#include "transfer/transfer.h"
#include "wrapped_cpu.h"

#define HALF 32768u /* an arena's bytes of a block: 16 tokens x 8 heads x 128 bf16 */
#define BLOCK (2 * HALF)
enum { N = 24, GROUP = 5 };

static uint8_t *corpus;
static size_t corpus_len;

/* Block b's half h (K: 0, V: 1) of the corpus, tiled from an element. */
static void half_of(size_t b, int h, uint8_t *out, size_t half) {
  size_t at = (b * 2 + (size_t)h) * half;
  for (size_t i = 0; i < half; i++)
    out[i] = corpus[(at + i) % corpus_len];
}

/* ---- the test backend: the cpu one, and an encode of its own ---- */

typedef struct encode_call {
  oi_encode_batch b;
  oi_encode_plan plan;
  uint8_t **slots;
  oi_copy_desc *descs;
} encode_call;

static atomic_int encodes; /* batches the backend framed */
static atomic_int slow_ms; /* each batch's framing takes this long more */
static atomic_int refuse;  /* the next stream_encode calls to refuse */

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* On the stream's worker: what the GPU does with the batch. */
static void run_encode(void *arg, oi_status st) {
  OI_UNUSED(st); /* (nothing of the pipeline's runs on the stream before a batch) */
  encode_call *c = arg;
  oi_encode_batch *b = &c->b;
  if (atomic_load(&slow_ms)) usleep((useconds_t)atomic_load(&slow_ms) * 1000);
  uint8_t *blocks = calloc(b->n ? b->n : 1, b->block_bytes);
  uint8_t *frame = malloc(2 * b->block_bytes + 64);
  REQUIRE(blocks && frame);
  for (size_t i = 0; i < b->ndescs; i++)
    memcpy(blocks + c->descs[i].dst, (const void *)c->descs[i].src, c->descs[i].bytes);
  const uint8_t *h = c->plan.header; /* the shape the frames carry */
  oi_codec_shape sh = {.dtype = h[6],
                       .parts = get16(h + 16),
                       .tokens = get16(h + 18),
                       .heads = get16(h + 20),
                       .head_dim = get16(h + 22)};
  int codec = h[5]; /* the frame's codec */
  REQUIRE((codec == OI_CODEC_LOSSLESS) == (c->plan.kind == OI_ENCODE_LOSSLESS));
  for (size_t i = 0; i < b->n; i++) {
    size_t out = 0;
    oi_status est = c->plan.planes
                        ? oi__codec_encode_planes(&sh, blocks + i * b->block_bytes, b->block_bytes,
                                                  frame, 2 * b->block_bytes + 64, &out)
                        : oi__codec_encode(codec, &sh, blocks + i * b->block_bytes, b->block_bytes,
                                           frame, 2 * b->block_bytes + 64, &out);
    if (est != OI_OK) { /* a lossy codec refuses the block: the slot holds junk */
      REQUIRE(codec != OI_CODEC_LOSSLESS);
      memset(c->slots[i], 0xa5, b->frame_bytes);
      b->status[i] = OI_ENCODE_REFUSED;
      continue;
    }
    if (out > b->frame_bytes) { /* the GPU's slot holds a partial frame: junk */
      memset(c->slots[i], 0xa5, b->frame_bytes);
      b->status[i] = OI_ENCODE_PAST_SLOT;
      continue;
    }
    memcpy(c->slots[i], frame, out);
    memset(c->slots[i] + out, 0, b->frame_bytes - out);
    b->status[i] = 0;
  }
  free(frame);
  free(blocks);
  free(c->slots);
  free(c->descs);
  free(c);
  atomic_fetch_add(&encodes, 1);
}

static oi_status w_stream_encode(oi_stream *s, const oi_encode_batch *b) {
  if (atomic_load(&refuse) > 0) {
    atomic_fetch_sub(&refuse, 1);
    return oi__fail(OI_ERR_CUDA, "encode: queuing a batch (the test's refusal)");
  }
  encode_call *c = calloc(1, sizeof *c);
  REQUIRE(c);
  c->b = *b;
  c->plan = *b->plan;
  c->b.plan = &c->plan;
  c->slots = malloc((b->n + 1) * sizeof *c->slots);
  c->descs = malloc((b->ndescs + 1) * sizeof *c->descs);
  REQUIRE(c->slots && c->descs);
  memcpy(c->slots, b->slots, b->n * sizeof *c->slots);
  memcpy(c->descs, b->descs, b->ndescs * sizeof *c->descs);
  oi_status st = cpu->ops->stream_call(s, run_encode, c);
  if (st != OI_OK) return st;
  /* then a byte copied on the stream, standing for the frames' DMA: a
   * failed copy (OI_FAULT_COPY_FAIL) is the device failing after the batch
   * was queued, which the stream reports to the pipeline's next call */
  static uint8_t probe[2];
  oi_copy_desc d = {.src = (uintptr_t)&probe[0], .dst = (uintptr_t)&probe[1], .bytes = 1};
  oi_copy_params cp = {.mode = OI_XFER_DMA};
  return cpu->ops->stream_copy(s, OI_COPY_D2H, &d, 1, &cp);
}

/* ---- a pipeline over two arenas (K and V halves) ---- */

typedef struct rigp {
  uint8_t *mem; /* arena K then arena V, N blocks of `half` bytes each */
  size_t half;
  oi_arena_desc ad[2];
  oi_layout layout;
  oi_xfer *x;
  uint8_t *slots; /* N frame slots */
  uint64_t slot;
} rigp;

static size_t last_failed;
static atomic_int ended;         /* jobs the pipeline ended (its done callback) */
static atomic_int framed_at_end; /* `encodes` when the last one ended */
static oi_status last_status;
static uint32_t save_deadline_ms; /* the next rig's */
static char last_why[256];

static void done_fn(void *ctx, void *user, const oi_xfer_result *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(user);
  last_failed = r->nfailed;
  last_status = r->status;
  atomic_store(&framed_at_end, atomic_load(&encodes));
  atomic_fetch_add(&ended, 1);
  snprintf(last_why, sizeof last_why, "%s", r->failed_why ? r->failed_why : "");
}

static oi_codec_shape wide_heads; /* when set (dtype bf16): the next rigs' shape */
static bool planes_code;          /* the next rigs: lossless frames of the planes code */

/* The namespace's shape: parts of 16 tokens x 8 heads x 128 bf16 where
 * halves are whole parts, else none (lossless needs none). */
static oi_codec_shape shape_of(size_t half) {
  if (wide_heads.dtype) return wide_heads;
  if (half % HALF) return (oi_codec_shape){0};
  return (oi_codec_shape){.dtype = OI_CODEC_DTYPE_BF16,
                          .parts = (uint16_t)(2 * half / HALF),
                          .tokens = 16,
                          .heads = 8,
                          .head_dim = 128};
}

/* Blocks of 2 x `half` bytes (the corpus), slots of `slot_pct` % of a
 * block; host_encode: OI_CODEC_ENCODE=host's setting. */
static void rig_open_with(rigp *r, size_t half, int codec, uint64_t slot, bool host_encode) {
  memset(r, 0, sizeof *r);
  r->half = half;
  r->mem = calloc(2, N * half);
  REQUIRE(r->mem);
  for (size_t b = 0; b < N; b++) {
    half_of(b, 0, r->mem + b * half, half);
    half_of(b, 1, r->mem + (N + b) * half, half);
  }
  r->ad[0] = tr_arena("k", r->mem, N, half);
  r->ad[1] = tr_arena("v", r->mem + N * half, N, half);
  oi_engine_options o = tr_engine_options("encode", r->ad, 2);
  REQUIRE(oi__layout_build(&o, "test", &r->layout) == OI_OK);
  r->slot = slot;
  r->slots = calloc(N, r->slot);
  REQUIRE(r->slots);
  oi_xfer_config xc = {.device = OI_DEVICE_CPU,
                       .dev = &wrapped,
                       .layout = &r->layout,
                       .copy_mode = OI_COPY_KERNEL,
                       .group_bytes = (GROUP - 1) * 2 * (uint64_t)half,
                       .codec = codec,
                       .codec_shape = shape_of(half),
                       .frame_bytes = r->slot,
                       .codec_host_encode = host_encode,
                       .codec_planes = planes_code,
                       .deadline_ms = {[OI_COPY_D2H] = save_deadline_ms},
                       .done = done_fn};
  REQUIRE(oi__xfer_create(&xc, &r->x) == OI_OK);
}

/* A lossless pipeline, slots of `slot_pct` % of a block. */
static void rig_open(rigp *r, size_t half, unsigned slot_pct, bool host_encode) {
  rig_open_with(r, half, OI_CODEC_LOSSLESS, (2 * half * slot_pct / 100) & ~(uint64_t)255,
                host_encode);
}

static void rig_close(rigp *r) {
  oi__xfer_destroy(r->x);
  oi__layout_free(&r->layout);
  free(r->slots);
  free(r->mem);
}

/* Saves blocks [0, N) into the slots; the ticket's outcome. */
static oi_status save(rigp *r) {
  memset(r->slots, 0x5a, N * r->slot);
  oi_xfer_job *job = oi__xfer_job_new(r->x, OI_COPY_D2H, N, OI_XFER_JOB_TICKET, 0);
  REQUIRE(job);
  oi_ticket *t = oi__xfer_job_ticket(job);
  for (size_t b = 0; b < N; b++)
    oi__xfer_add(job, (int64_t)b, r->slots + b * r->slot);
  oi_status st = oi__xfer_submit(job, "save");
  if (st != OI_OK) return st;
  st = oi_ticket_wait(t, 30000);
  oi_ticket_release(t);
  return st;
}

/* Slots that are not their block's frame (`codec`'s) with zeros behind it. */
static size_t wrong_slots_of(const rigp *r, int codec) {
  size_t bad = 0, half = r->half;
  uint8_t *block = malloc(2 * half), *want = calloc(1, 2 * half + 64);
  REQUIRE(block && want);
  oi_codec_shape shape = shape_of(half);
  for (size_t b = 0; b < N; b++) {
    half_of(b, 0, block, half);
    half_of(b, 1, block + half, half);
    size_t out = 0;
    memset(want, 0, 2 * half + 64);
    REQUIRE((planes_code
                 ? oi__codec_encode_planes(&shape, block, 2 * half, want, 2 * half + 64, &out)
                 : oi__codec_encode(codec, &shape, block, 2 * half, want, 2 * half + 64, &out)) ==
            OI_OK);
    REQUIRE(out <= r->slot);
    memset(want + out, 0, r->slot - out);
    size_t got = 0;
    bad += memcmp(r->slots + b * r->slot, want, r->slot) != 0 ||
           oi__codec_decode(r->slots + b * r->slot, r->slot, want, 2 * half, &got) != OI_OK ||
           (codec == OI_CODEC_LOSSLESS && memcmp(want, block, 2 * half) != 0);
  }
  free(block);
  free(want);
  return bad;
}

static size_t wrong_slots(const rigp *r) { return wrong_slots_of(r, OI_CODEC_LOSSLESS); }

static void test_saves(void) {
  rigp r;
  rig_open(&r, HALF, 80, false);
  int before = atomic_load(&encodes);
  CHECK_OK(save(&r));
  int batches = atomic_load(&encodes) - before;
  size_t bad = wrong_slots(&r);
  printf("lossless save of %d blocks in two arenas: %d batches framed by the device, %zu slots "
         "wrong, %zu blocks not kept\n",
         N, batches, bad, last_failed);
  CHECK(batches == (N + GROUP - 1) / GROUP);
  CHECK(bad == 0 && last_failed == 0);
  rig_close(&r);
}

/* OI_CODEC_ENCODE=host, and blocks whose streams would not be wide (6 KiB
 * halves: 6,144 exponents a block): the host encodes, the same frames. */
static void test_host_encodes(void) {
  const struct {
    size_t half;
    bool host;
    const char *what;
  } cases[] = {{HALF, true, "OI_CODEC_ENCODE=host"}, {6144, false, "12 KiB blocks"}};
  for (size_t k = 0; k < OI_ARRAY_LEN(cases); k++) {
    rigp r;
    rig_open(&r, cases[k].half, 90, cases[k].host);
    int before = atomic_load(&encodes);
    CHECK_OK(save(&r));
    CHECK(atomic_load(&encodes) == before);
    size_t bad = wrong_slots(&r);
    printf("%-22s: encoded on the host, %zu slots wrong\n", cases[k].what, bad);
    CHECK(bad == 0 && last_failed == 0);
    rig_close(&r);
  }
  /* the planes code (OI_LOSSLESS_CODE=planes): frames of format 4, made by
   * the device (a plan that says so) and with OI_CODEC_ENCODE=host by the
   * host */
  planes_code = true;
  for (int host = 0; host < 2; host++) {
    rigp r;
    rig_open(&r, HALF, 90, host);
    int before = atomic_load(&encodes);
    CHECK_OK(save(&r));
    int batches = atomic_load(&encodes) - before;
    CHECK(host ? batches == 0 : batches == (N + GROUP - 1) / GROUP);
    size_t bad = wrong_slots(&r), format4 = 0;
    for (size_t b = 0; b < N; b++)
      format4 += r.slots[b * r.slot + 4] == OI_LOSSLESS_PLANES_VERSION;
    printf("the planes code, %-6s: %d batches by the device, %zu slots wrong, %zu of %d frames of "
           "format 4\n",
           host ? "host" : "device", batches, bad, format4, N);
    CHECK(bad == 0 && last_failed == 0 && format4 == N);
    rig_close(&r);
  }
  planes_code = false;
}

/* The lossy codecs' namespaces: the device frames them too, the cpu's
 * frames; a block the codec refuses (a NaN) is not kept, saying why, its
 * neighbours are. OI_CODEC_ENCODE=host,
 * int8-hadamard heads past 1,024 channels and lossless slots whose size is not a multiple of 8 (the
 * frames' checksums are 8-byte words): the host encodes, the same frames. */
static void test_other_namespaces(void) {
  rigp r;
  oi_codec_shape sh = shape_of(HALF);
  static const int lossy[] = {OI_CODEC_INT8, OI_CODEC_INT8_HADAMARD, OI_CODEC_FP8};
  for (size_t k = 0; k < OI_ARRAY_LEN(lossy); k++) {
    for (int host = 0; host < 2; host++) {
      rig_open_with(&r, HALF, lossy[k], oi__codec_bound(lossy[k], &sh, BLOCK), host);
      int before = atomic_load(&encodes);
      CHECK_OK(save(&r));
      int batches = atomic_load(&encodes) - before;
      CHECK(batches == (host ? 0 : (N + GROUP - 1) / GROUP));
      size_t bad = wrong_slots_of(&r, lossy[k]);
      printf("%-14s save of %d blocks, %s: %d batches framed by the device, %zu slots wrong\n",
             oi__codec_name(lossy[k]), N, host ? "OI_CODEC_ENCODE=host" : "device", batches, bad);
      CHECK(bad == 0 && last_failed == 0);
      rig_close(&r);
    }
    rig_open_with(&r, HALF, lossy[k], oi__codec_bound(lossy[k], &sh, BLOCK), false);
    uint16_t nan = 0x7fc0;
    memcpy(r.mem + 3 * HALF + 100, &nan, 2); /* in block 3's K */
    CHECK_OK(save(&r));
    CHECK(last_failed == 1);
    CHECK(strstr(last_why, "non-finite value") != NULL);
    rig_close(&r);
  }
  /* int8-hadamard heads wider than the device encoder takes: the host */
  wide_heads = (oi_codec_shape){OI_CODEC_DTYPE_BF16, 4, 1, 1, HALF / 4}; /* slots of 8n bytes */
  int before = atomic_load(&encodes);
  REQUIRE(oi__codec_bound(OI_CODEC_INT8_HADAMARD, &wide_heads, BLOCK) % 8 == 0);
  rig_open_with(&r, HALF, OI_CODEC_INT8_HADAMARD,
                oi__codec_bound(OI_CODEC_INT8_HADAMARD, &wide_heads, BLOCK), false);
  CHECK_OK(save(&r));
  CHECK(atomic_load(&encodes) == before);
  CHECK(wrong_slots_of(&r, OI_CODEC_INT8_HADAMARD) == 0 && last_failed == 0);
  rig_close(&r);
  wide_heads = (oi_codec_shape){0};
  rig_open_with(&r, HALF, OI_CODEC_LOSSLESS, (BLOCK * 8 / 10 & ~(uint64_t)255) + 4, false);
  CHECK_OK(save(&r));
  CHECK(atomic_load(&encodes) == before);
  CHECK(wrong_slots(&r) == 0 && last_failed == 0);
  rig_close(&r);
}

/* Slots smaller than the frames: every block marked, none kept, saying
 * why; a device that refuses a batch: the save fails with its reason, and
 * the next save is whole. */
static void test_past_slots_and_refusals(void) {
  rigp r;
  rig_open(&r, HALF, 50, false);
  CHECK_OK(save(&r));
  CHECK(last_failed == N);
  CHECK(strstr(last_why, "a frame made on the device is past its") != NULL);
  rig_close(&r);
  rig_open(&r, HALF, 80, false);
  atomic_store(&refuse, 1);
  oi_status st = save(&r);
  CHECK(st == OI_ERR_CUDA && strstr(oi_last_error(), "the test's refusal"));
  CHECK(atomic_load(&refuse) == 0);
  CHECK_OK(save(&r));
  CHECK(wrong_slots(&r) == 0 && last_failed == 0);
#ifdef OI_FAULT_INJECTION
  /* queuing the group fails (an injected fault): the save fails, saying so */
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_SUBMIT, 0, 1, 0) == OI_OK);
  int before = atomic_load(&encodes);
  st = save(&r);
  CHECK(st == OI_ERR_IO && strstr(oi_last_error(), "injected fault"));
  CHECK(atomic_load(&encodes) == before);
  oi__fault_disarm_all();
  /* the device fails after the group was queued: the save fails with it */
  REQUIRE(oi__fault_arm(OI_FAULT_COPY_FAIL, 0, 1, 0) == OI_OK);
  before = atomic_load(&encodes);
  st = save(&r);
  CHECK(st == OI_ERR_IO);
  CHECK(atomic_load(&encodes) == before + (N + GROUP - 1) / GROUP);
  oi__fault_disarm_all();
  CHECK_OK(save(&r));
  CHECK(wrong_slots(&r) == 0);
#endif
  rig_close(&r);
}

/* A save past its deadline: its ticket ends OI_ERR_TIMEOUT while the
 * device still frames (it waits for nothing), but the pipeline ends the
 * job, whose end gives the slots back, only once the device wrote every
 * frame into them. */
static void test_deadline_waits_for_frames(void) {
  rigp r;
  save_deadline_ms = 30;
  rig_open(&r, HALF, 80, false);
  save_deadline_ms = 0;
  atomic_store(&slow_ms, 100);
  int before = atomic_load(&encodes), ends = atomic_load(&ended);
  const int groups = (N + GROUP - 1) / GROUP;
  CHECK_ST(save(&r), OI_ERR_TIMEOUT);
  for (int i = 0; i < 1000 && atomic_load(&ended) == ends; i++)
    usleep(10000);
  CHECK(atomic_load(&ended) == ends + 1);
  CHECK(atomic_load(&framed_at_end) == before + groups);
  CHECK(last_status == OI_ERR_TIMEOUT);
  printf("a save past its 30 ms deadline: ticket OI_ERR_TIMEOUT, the job ended after %d of %d "
         "batches were framed\n",
         atomic_load(&framed_at_end) - before, groups);
  atomic_store(&slow_ms, 0);
  rig_close(&r);
}

int main(int argc, char **argv) {
  REQUIRE(argc >= 2);
  corpus = ct_read_file(argv[1], &corpus_len);
  REQUIRE(corpus && corpus_len >= (size_t)N * BLOCK);
  wrap_cpu("cpu with an encode of the test's");
  wrapped_ops.stream_encode = w_stream_encode;
  RUN_TEST(test_saves);
  RUN_TEST(test_host_encodes);
  RUN_TEST(test_other_namespaces);
  RUN_TEST(test_past_slots_and_refusals);
  RUN_TEST(test_deadline_waits_for_frames);
  oi__dev_close(cpu);
  free(corpus);
  TEST_EXIT();
}
