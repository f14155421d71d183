/* The KV block codecs (lib/codec) on arbitrary bytes. The first byte picks:
 *   0: the rest as a frame through oi__codec_decode (checksums and all),
 *      then oi__codec_info_of; an accepted lossless frame decodes to bytes
 *      whose checksum is the frame's, and re-encodes to a frame decoding
 *      to them again;
 *   1: the payload decoders without the checksum (oi__codec_decode_payload):
 *      a codec, a shape and a logical size from the next bytes, the rest
 *      the payload;
 *   2: the rest as a block to encode: lossless decodes to the same bytes;
 *      int8 / fp8 (the shape from the next bytes) encode finite blocks,
 *      refuse others with OI_ERR_INVALID_ARGUMENT, and decode what they wrote.
 * Inputs and outputs are exact-size heap copies, so a read or write past
 * either is an ASan report. */
#include <xxhash.h>

#include "codec/codec.h"
#include "fuzz_util.h"
#include "openinfer/openinfer.h"

#define MAX_LOGICAL (256u * 1024u)

static void decode_frame(const uint8_t *p, size_t n) {
  uint8_t *in = malloc(n ? n : 1);
  memcpy(in, p, n);
  uint8_t *out = malloc(MAX_LOGICAL);
  size_t got = 0;
  oi_status st = oi__codec_decode(in, n, out, MAX_LOGICAL, &got);
  FZ_ASSERT(st == OI_OK || st == OI_ERR_PROTOCOL || st == OI_ERR_VERSION ||
                st == OI_ERR_INVALID_ARGUMENT || st == OI_ERR_OUT_OF_MEMORY,
            "status %d", st);
  oi_codec_info info;
  oi_status st2 = oi__codec_info_of(in, n, &info);
  if (st == OI_OK) {
    FZ_ASSERT(st2 == OI_OK && got == info.logical_bytes, "info %d", st2);
    if (info.codec == OI_CODEC_LOSSLESS) {
      FZ_ASSERT(XXH3_64bits(out, got) == info.data_xxh, "lossless checksum");
      size_t cap = oi__codec_bound(OI_CODEC_LOSSLESS, NULL, got), fb = 0, got2 = 0;
      uint8_t *frame = malloc(cap), *back = malloc(got ? got : 1);
      FZ_ASSERT(oi__codec_encode(OI_CODEC_LOSSLESS, &info.shape, out, got, frame, cap, &fb) ==
                    OI_OK,
                "re-encode");
      FZ_ASSERT(oi__codec_decode(frame, fb, back, got, &got2) == OI_OK && got2 == got &&
                    !memcmp(back, out, got),
                "re-decode");
      free(frame);
      free(back);
    }
  }
  free(in);
  free(out);
}

static void decode_payload(fz *f) {
  int codec = fz_u8(f) % (OI_CODEC_COUNT + 1); /* (one past the codecs: refused) */
  oi_codec_shape sh = {.dtype = fz_u8(f) % 3,
                       .parts = (uint16_t)fz_size(f, 4),
                       .tokens = (uint16_t)fz_size(f, 32),
                       .heads = (uint16_t)fz_size(f, 8),
                       .head_dim = (uint16_t)fz_size(f, 128)};
  size_t logical = fz_size(f, 4096) % MAX_LOGICAL;
  size_t n = f->n - (f->i < f->n ? f->i : f->n);
  uint8_t *in = malloc(n ? n : 1), *out = malloc(logical ? logical : 1);
  memcpy(in, f->p + f->i, n);
  oi_status st = oi__codec_decode_payload(codec, &sh, in, n, out, logical);
  FZ_ASSERT(st == OI_OK || st == OI_ERR_PROTOCOL || st == OI_ERR_INVALID_ARGUMENT ||
                st == OI_ERR_OUT_OF_MEMORY,
            "status %d", st);
  free(in);
  free(out);
}

static void encode_block(fz *f) {
  int codec = 1 + fz_u8(f) % (OI_CODEC_COUNT - 1);
  oi_codec_shape sh = {.dtype = OI_CODEC_DTYPE_BF16,
                       .parts = (uint16_t)(1 + fz_u8(f) % 2),
                       .tokens = (uint16_t)(1 + fz_u8(f) % 16),
                       .heads = (uint16_t)(1 + fz_u8(f) % 4),
                       .head_dim = (uint16_t)(1 + fz_u8(f) % 64)};
  size_t n = f->n - (f->i < f->n ? f->i : f->n);
  if (codec != OI_CODEC_LOSSLESS) {
    size_t need = (size_t)sh.parts * sh.tokens * sh.heads * sh.head_dim * 2;
    if (n < need) return;
    n = need;
  }
  uint8_t *in = malloc(n ? n : 1), *back = malloc(n ? n : 1);
  memcpy(in, f->p + f->i, n);
  size_t cap = oi__codec_bound(codec, &sh, n), fb = 0, got = 0;
  FZ_ASSERT(cap > 0, "bound");
  uint8_t *frame = malloc(cap);
  oi_status st = oi__codec_encode(codec, &sh, in, n, frame, cap, &fb);
  if (codec == OI_CODEC_LOSSLESS) FZ_ASSERT(st == OI_OK, "lossless encode %d", st);
  FZ_ASSERT(st == OI_OK || st == OI_ERR_INVALID_ARGUMENT, "encode %d", st);
  if (st == OI_OK) {
    FZ_ASSERT(fb <= cap, "frame past the bound");
    FZ_ASSERT(oi__codec_decode(frame, fb, back, n, &got) == OI_OK && got == n, "decode");
    if (codec == OI_CODEC_LOSSLESS) FZ_ASSERT(!memcmp(back, in, n), "lossless not exact");
  }
  free(in);
  free(back);
  free(frame);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!size) return 0;
  fz f = {data + 1, size - 1, 0};
  switch (data[0] % 3) {
  case 0: decode_frame(data + 1, size - 1); break;
  case 1: decode_payload(&f); break;
  default: encode_block(&f); break;
  }
  return 0;
}
