/* The copy pipeline's loads for a device that decodes codec frames
 * (dev_ops.stream_decode: the cuda backend's, docs/codecs.md "On the GPU"),
 * run without a GPU. A test backend wraps the cpu one with a stream_decode
 * that does, on the stream's worker and in the stream's order, what the
 * GPU does: each piece of each frame decoded into a block of its own, the
 * blocks of frames that failed zeroed, the blocks scattered by the copies
 * the pipeline planned, the statuses handed back. So the pipeline's own
 * part is checked here byte for byte: the slots cut into pieces, the scatter
 * planned from the layout (two arenas, blocks in groups), the statuses
 * turned into the load's outcome (OI_ERR_PROTOCOL naming the block and why,
 * the block landing as zeros), a layered load's arenas reported. The real
 * corpus (argv[1]): lossless and int8. */
#include <stdatomic.h>

#include "../codec/codec_testutil.h"
#include "codec/codec.h"
#include "device/device.h"
#include "engine/layout.h"
#include "rig.h"
#include "testutil.h"
#include "transfer/transfer.h"
#include "wrapped_cpu.h"

#define PAGE CORPUS_PAGE_BYTES
#define HALF (PAGE / 2)
enum { N = 40, GROUP = 7 };

static uint8_t *corpus;
static size_t corpus_len;

/* Page b of the corpus, tiled. */
static const uint8_t *page_of(size_t b) { return corpus + b % (corpus_len / PAGE) * PAGE; }

/* ---- the test backend: the cpu one, and a decode of its own ---- */

typedef struct decode_call {
  oi_decode_batch b;
  const uint8_t **frames;
  uint32_t *frame_bytes;
  oi_decode_piece *pieces;
  oi_copy_desc *descs;
} decode_call;

static atomic_int decodes; /* batches the backend decoded */

/* On the stream's worker: what the GPU does with the batch. */
static void run_decode(void *arg, oi_status st) {
  OI_UNUSED(st);
  decode_call *c = arg;
  oi_decode_batch *b = &c->b;
  uint8_t *blocks = calloc(b->n ? b->n : 1, b->block_bytes);
  REQUIRE(blocks);
  for (size_t k = 0; k < b->npieces; k++) {
    const oi_decode_piece *p = &c->pieces[k];
    if (b->status[p->frame]) continue; /* refused by the host */
    oi_codec_piece cp = {.kind = p->kind,
                         .src = p->src,
                         .aux = p->aux,
                         .dst = p->dst,
                         .len = p->len,
                         .count = p->count,
                         .tokens = p->tokens,
                         .heads = p->heads,
                         .head_dim = p->head_dim};
    int rc = ct_decode_piece(c->frames[p->frame], &cp, blocks + p->frame * b->block_bytes,
                             b->block_bytes);
    int32_t bad = rc == -1 ? OI_DECODE_BAD_STREAM
                  : rc == -2
                      ? (strstr(oi_last_error(), "NaN") ? OI_DECODE_NAN_CODE : OI_DECODE_BAD_SCALE)
                      : 0;
    if (bad && !b->status[p->frame]) b->status[p->frame] = bad;
  }
  for (size_t i = 0; i < b->n; i++) /* what failed lands as zeros */
    if (b->status[i]) memset(blocks + i * b->block_bytes, 0, b->block_bytes);
  for (size_t i = 0; i < b->ndescs; i++)
    memcpy((void *)c->descs[i].dst, blocks + c->descs[i].src, c->descs[i].bytes);
  free(blocks);
  free(c->frames);
  free(c->frame_bytes);
  free(c->pieces);
  free(c->descs);
  free(c);
  atomic_fetch_add(&decodes, 1);
}

static atomic_int refuse; /* the next stream_decode calls to refuse */

static oi_status w_stream_decode(oi_stream *s, const oi_decode_batch *b) {
  if (atomic_load(&refuse) > 0) {
    atomic_fetch_sub(&refuse, 1);
    return oi__fail(OI_ERR_CUDA, "decode: queuing a batch (the test's refusal)");
  }
  decode_call *c = calloc(1, sizeof *c);
  REQUIRE(c);
  c->b = *b;
  c->frames = malloc((b->n + 1) * sizeof *c->frames);
  c->frame_bytes = malloc((b->n + 1) * sizeof *c->frame_bytes);
  c->pieces = malloc((b->npieces + 1) * sizeof *c->pieces);
  c->descs = malloc((b->ndescs + 1) * sizeof *c->descs);
  REQUIRE(c->frames && c->frame_bytes && c->pieces && c->descs);
  memcpy(c->frames, b->frames, b->n * sizeof *c->frames);
  memcpy(c->frame_bytes, b->frame_bytes, b->n * sizeof *c->frame_bytes);
  memcpy(c->pieces, b->pieces, b->npieces * sizeof *c->pieces);
  memcpy(c->descs, b->descs, b->ndescs * sizeof *c->descs);
  return cpu->ops->stream_call(s, run_decode, c);
}

static atomic_int host_calls; /* the pipeline's host functions on its streams */

static oi_status w_stream_call(oi_stream *s, oi_stream_fn fn, void *arg) {
  atomic_fetch_add(&host_calls, 1);
  return cpu->ops->stream_call(s, fn, arg);
}

/* ---- a pipeline over two arenas (K and V halves of a corpus page) ---- */

typedef struct rigp {
  uint8_t *mem; /* arena K then arena V, 2N blocks of HALF bytes each */
  oi_arena_desc ad[2];
  oi_layout layout;
  oi_xfer *x;
  uint8_t *slots; /* n frame slots */
  uint64_t slot;
  int codec;
  size_t n; /* blocks loaded: slots [0, n) into blocks [n, 2n) */
} rigp;

static void done_fn(void *ctx, void *user, const oi_xfer_result *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(user);
  OI_UNUSED(r);
}

static bool planes; /* lossless slots hold frames of the planes code */

/* n corpus pages (tiled), in groups of `group_bytes` (0: the mode's). */
static void rig_open_with(rigp *r, int codec, size_t n, uint32_t copy_mode, uint64_t group_bytes) {
  memset(r, 0, sizeof *r);
  r->codec = codec;
  r->n = n;
  r->mem = calloc(2, (size_t)2 * n * HALF);
  REQUIRE(r->mem);
  r->ad[0] = tr_arena("k", r->mem, 2 * n, HALF);
  r->ad[1] = tr_arena("v", r->mem + (size_t)2 * n * HALF, 2 * n, HALF);
  oi_engine_options o = tr_engine_options("decode", r->ad, 2);
  REQUIRE(oi__layout_build(&o, "test", &r->layout) == OI_OK);
  oi_codec_shape sh = CORPUS_SHAPE_KV;
  r->slot = codec == OI_CODEC_LOSSLESS ? 8960 : oi__codec_bound(codec, &sh, PAGE);
  r->slots = calloc(n, r->slot);
  REQUIRE(r->slots);
  for (size_t b = 0; b < n; b++) {
    size_t fb = 0;
    uint8_t frame[2 * PAGE];
    REQUIRE((planes && codec == OI_CODEC_LOSSLESS
                 ? oi__codec_encode_planes(&sh, page_of(b), PAGE, frame, sizeof frame, &fb)
                 : oi__codec_encode(codec, &sh, page_of(b), PAGE, frame, sizeof frame, &fb)) ==
            OI_OK);
    REQUIRE(fb <= r->slot);
    memcpy(r->slots + b * r->slot, frame, fb);
  }
  oi_xfer_config xc = {.device = OI_DEVICE_CPU,
                       .dev = &wrapped,
                       .layout = &r->layout,
                       .copy_mode = copy_mode,
                       .group_bytes = group_bytes,
                       .codec = codec,
                       .codec_shape = codec == OI_CODEC_LOSSLESS ? (oi_codec_shape){0} : sh,
                       .frame_bytes = r->slot,
                       .codec_planes = planes,
                       .done = done_fn};
  REQUIRE(oi__xfer_create(&xc, &r->x) == OI_OK);
}

static void rig_open(rigp *r, int codec) {
  rig_open_with(r, codec, N, OI_COPY_KERNEL, (GROUP - 1) * (uint64_t)PAGE);
}

static void rig_close(rigp *r) {
  oi__xfer_destroy(r->x);
  oi__layout_free(&r->layout);
  free(r->slots);
  free(r->mem);
}

/* Loads slots [0, n) into blocks [n, 2n); the ticket's outcome. */
static oi_status load(rigp *r, bool layered) {
  size_t n = r->n;
  memset(r->mem + n * HALF, 0x5a, n * HALF);
  memset(r->mem + 3 * n * HALF, 0x5a, n * HALF);
  oi_xfer_job *job = oi__xfer_job_new(r->x, OI_COPY_H2D, n,
                                      OI_XFER_JOB_TICKET | (layered ? OI_XFER_JOB_LAYERED : 0), 0);
  REQUIRE(job);
  oi_ticket *t = oi__xfer_job_ticket(job);
  for (size_t b = 0; b < n; b++)
    oi__xfer_add(job, (int64_t)(n + b), r->slots + b * r->slot);
  oi_status st = oi__xfer_submit(job, "load");
  if (st != OI_OK) return st;
  if (layered) {
    oi_status a0 = oi_ticket_arena_wait(t, 0, 30000), a1 = oi_ticket_arena_wait(t, 1, 30000);
    CHECK(a0 == a1);
  }
  st = oi_ticket_wait(t, 30000);
  oi_ticket_release(t);
  return st;
}

/* Block b as loaded (its K and V halves, where the layout put them). */
static void loaded(const rigp *r, size_t b, uint8_t *out) {
  memcpy(out, r->mem + (r->n + b) * HALF, HALF);
  memcpy(out + HALF, r->mem + 2 * r->n * HALF + (r->n + b) * HALF, HALF);
}

/* Blocks that differ from the codec's round trip; `zero` (or SIZE_MAX):
 * the block that must be zeros. */
static size_t differ(const rigp *r, size_t zero) {
  size_t bad = 0;
  uint8_t got[PAGE], want[PAGE];
  for (size_t b = 0; b < r->n; b++) {
    loaded(r, b, got);
    if (b == zero)
      memset(want, 0, PAGE);
    else
      ct_expected_of(r->codec, page_of(b), want);
    bad += memcmp(got, want, PAGE) != 0;
  }
  return bad;
}

/* Every codec's load decoded by the device, a batch per group. A layered
 * load's arenas all land with its last group's scatter: they are reported
 * by one host function on the stream more than a whole load's, not one an
 * arena (each would hold the load stream). */
static void test_loads(void) {
  for (int codec = OI_CODEC_LOSSLESS; codec < OI_CODEC_COUNT; codec++) {
    int calls[2];
    for (int layered = 0; layered < 2; layered++) {
      rigp r;
      rig_open(&r, codec);
      int before = atomic_load(&decodes), calls_before = atomic_load(&host_calls);
      CHECK_OK(load(&r, layered));
      size_t bad = differ(&r, SIZE_MAX);
      int batches = atomic_load(&decodes) - before;
      calls[layered] = atomic_load(&host_calls) - calls_before;
      printf("%-13s %s load of %d blocks in two arenas: %d batches decoded by the device, %d "
             "host calls, %zu blocks differ\n",
             oi__codec_name(codec), layered ? "layered" : "whole", N, batches, calls[layered], bad);
      CHECK(bad == 0);
      CHECK(batches == (N + GROUP - 1) / GROUP);
      rig_close(&r);
    }
    CHECK(calls[1] == calls[0] + 1);
  }
  /* lossless frames of the planes code (format 4): their streams' pieces */
  planes = true;
  rigp r;
  rig_open(&r, OI_CODEC_LOSSLESS);
  CHECK_OK(load(&r, true));
  size_t bad = differ(&r, SIZE_MAX);
  printf("lossless (planes code) layered load of %d blocks: %zu blocks differ\n", N, bad);
  CHECK(bad == 0);
  rig_close(&r);
  planes = false;
}

/* A codec's groups are its bounce's in every copy mode: a load of 1,400
 * pages (16.4 MiB) goes in the same batches in DMA and kernel mode (a first
 * group of 8 MiB, then the rest: 2), where DMA mode's own 8 MiB groups
 * would give 3. */
static void test_dma_groups_are_the_bounce(void) {
  const uint32_t modes[2] = {OI_COPY_DMA, OI_COPY_KERNEL};
  int batches[2];
  for (int m = 0; m < 2; m++) {
    rigp r;
    rig_open_with(&r, OI_CODEC_LOSSLESS, 1400, modes[m], 0);
    int before = atomic_load(&decodes);
    CHECK_OK(load(&r, false));
    batches[m] = atomic_load(&decodes) - before;
    CHECK(differ(&r, SIZE_MAX) == 0);
    rig_close(&r);
  }
  printf("1,400 pages, lossless: %d batches in DMA mode, %d in kernel mode\n", batches[0],
         batches[1]);
  CHECK(batches[0] == 2 && batches[1] == 2);
}

/* Loads of the planes code decoded by the device go in groups of 16 MiB
 * (OI_PLANES_LOAD_GROUP_BYTES), rANS's in groups of 32: 2,800 pages (32.8
 * MiB) after the first group of 8 MiB are one batch of rANS frames and two
 * of the planes code's. */
static void test_planes_load_groups(void) {
  int batches[2];
  for (int code = 0; code < 2; code++) {
    planes = code == 1;
    rigp r;
    rig_open_with(&r, OI_CODEC_LOSSLESS, 2800, OI_COPY_KERNEL, 0);
    int before = atomic_load(&decodes);
    CHECK_OK(load(&r, false));
    batches[code] = atomic_load(&decodes) - before;
    CHECK(differ(&r, SIZE_MAX) == 0);
    rig_close(&r);
  }
  planes = false;
  printf("2,800 pages, lossless: %d batches of rANS frames, %d of the planes code's\n", batches[0],
         batches[1]);
  CHECK(batches[0] == 2 && batches[1] == 3);
}

/* A frame whose stream does not end as encoded (lossless: state 0 of its
 * first stream zeroed; int8: a scale made infinite; fp8: a NaN code), and a
 * slot that is not a frame: each fails the load naming its block, which
 * lands as zeros. */
static void test_failures(void) {
  for (int codec = OI_CODEC_LOSSLESS; codec <= OI_CODEC_FP8; codec++) {
    rigp r;
    rig_open(&r, codec);
    uint8_t *f = r.slots + 9 * r.slot;
    oi_codec_info in;
    oi_codec_piece pc[8];
    size_t k = 0;
    REQUIRE(oi__codec_pieces(f, r.slot, true, &in, pc, 8, &k) == OI_OK);
    const char *why;
    if (codec == OI_CODEC_LOSSLESS) {
      uint8_t *s = f + pc[0].src;
      size_t t = 2;
      for (int sym = s[0]; sym <= s[1]; sym++)
        while (s[t++] & 0x80) {
        }
      memset(s + t, 0, 4);
      why = "block 9: a rANS stream that does not decode";
    } else if (codec == OI_CODEC_INT8) {
      f[pc[0].src + 2 * 4] = 0x00, f[pc[0].src + 2 * 4 + 1] = 0x7c;
      why = "block 9: a scale that is not finite";
    } else {
      f[pc[0].src + (size_t)pc[0].count * pc[0].heads * 4 + 77] = 0x7f;
      why = "block 9: an fp8 NaN code";
    }
    CHECK_ST(load(&r, false), OI_ERR_PROTOCOL);
    CHECK(strstr(oi_last_error(), "did not decode on the device") && strstr(oi_last_error(), why));
    CHECK(differ(&r, 9) == 0);
    /* the slot of block 30 is not a frame: refused by the host */
    memcpy(f, r.slots + 10 * r.slot, r.slot); /* block 9 mended: block 10's frame */
    r.slots[30 * r.slot] ^= 0xff;
    CHECK_ST(load(&r, true), OI_ERR_PROTOCOL);
    CHECK(strstr(oi_last_error(), "block 30") && strstr(oi_last_error(), "not a frame"));
    uint8_t got[PAGE], want[PAGE], zeros[PAGE] = {0};
    loaded(&r, 30, got);
    CHECK(memcmp(got, zeros, PAGE) == 0);
    loaded(&r, 9, got); /* block 10's bytes now */
    ct_expected_of(codec, corpus + 10 * PAGE, want);
    CHECK(memcmp(got, want, PAGE) == 0);
    rig_close(&r);
  }
}

/* Slots whose frames are whole but not this namespace's: one of another
 * codec, one of another block size (their checksums hold); and a device
 * that refuses a batch: the load fails with its reason, nothing waits. */
static void test_foreign_frames_and_refusals(void) {
  rigp r;
  rig_open(&r, OI_CODEC_LOSSLESS);
  oi_codec_shape kv = CORPUS_SHAPE_KV;
  size_t fb = 0;
  uint8_t frame[2 * PAGE];
  REQUIRE(oi__codec_encode(OI_CODEC_INT8, &kv, corpus, PAGE, frame, sizeof frame, &fb) == OI_OK);
  memset(r.slots + 12 * r.slot, 0, r.slot);
  memcpy(r.slots + 12 * r.slot, frame, fb);
  CHECK_ST(load(&r, false), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "block 12: a frame of codec 2"));
  CHECK(differ(&r, 12) == 0);
  REQUIRE(oi__codec_encode(OI_CODEC_LOSSLESS, NULL, corpus, PAGE / 2, frame, sizeof frame, &fb) ==
          OI_OK);
  memset(r.slots + 12 * r.slot, 0, r.slot);
  memcpy(r.slots + 12 * r.slot, frame, fb);
  CHECK_ST(load(&r, false), OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "block 12: a frame of codec 1 and 6144 bytes for blocks of 12288"));
  CHECK(differ(&r, 12) == 0);
  rig_close(&r);
  /* the device refuses the first batch of a load */
  rig_open(&r, OI_CODEC_LOSSLESS);
  atomic_store(&refuse, 1);
  oi_status st = load(&r, false);
  CHECK(st == OI_ERR_CUDA && strstr(oi_last_error(), "the test's refusal"));
  CHECK(atomic_load(&refuse) == 0);
  CHECK_OK(load(&r, false)); /* the next load is whole */
  CHECK(differ(&r, SIZE_MAX) == 0);
  rig_close(&r);
}

int main(int argc, char **argv) {
  REQUIRE(argc >= 2);
  corpus = ct_read_file(argv[1], &corpus_len);
  REQUIRE(corpus && corpus_len >= (size_t)N * PAGE);
  wrap_cpu("cpu with a decode of the test's");
  wrapped_ops.stream_decode = w_stream_decode;
  wrapped_ops.stream_call = w_stream_call;
  RUN_TEST(test_loads);
  RUN_TEST(test_dma_groups_are_the_bounce);
  RUN_TEST(test_planes_load_groups);
  RUN_TEST(test_failures);
  RUN_TEST(test_foreign_frames_and_refusals);
  oi__dev_close(cpu);
  free(corpus);
  TEST_EXIT();
}
