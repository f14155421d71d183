/* codec_roundtrip CODEC PARTS TOKENS HEADS HEAD_DIM < blocks > decoded
 *
 * Encodes each block of stdin (PARTS*TOKENS*HEADS*HEAD_DIM bf16 values)
 * with CODEC (lossless, int8, int8-hadamard, fp8), decodes the frame and writes the
 * decoded block to stdout; stderr gets the blocks, logical and frame bytes.
 * The helper through which tools/kvcorpus/lossy_check.py runs the model on
 * KV that went through this library's codecs. Exit 0, or 1 on any error. */
#include <stdio.h>
#include <stdlib.h>

#include "codec/codec.h"
#include "openinfer/openinfer.h"

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: codec_roundtrip CODEC PARTS TOKENS HEADS HEAD_DIM < in > out\n");
    return 1;
  }
  int codec = oi__codec_from_name(argv[1]);
  oi_codec_shape sh = {OI_CODEC_DTYPE_BF16, (uint16_t)atoi(argv[2]), (uint16_t)atoi(argv[3]),
                       (uint16_t)atoi(argv[4]), (uint16_t)atoi(argv[5])};
  size_t block = (size_t)sh.parts * sh.tokens * sh.heads * sh.head_dim * 2;
  size_t cap = oi__codec_bound(codec, &sh, block);
  if (codec <= 0 || !block || !cap) {
    fprintf(stderr, "codec_roundtrip: bad codec or shape\n");
    return 1;
  }
  uint16_t *in = malloc(block), *out = malloc(block);
  uint8_t *frame = malloc(cap);
  if (!in || !out || !frame) return 1;
  size_t blocks = 0, frames = 0, got;
  while ((got = fread(in, 1, block, stdin)) == block) {
    size_t fb, ob;
    if (oi__codec_encode(codec, &sh, in, block, frame, cap, &fb) != OI_OK ||
        oi__codec_decode(frame, fb, out, block, &ob) != OI_OK || ob != block) {
      fprintf(stderr, "codec_roundtrip: block %zu: %s\n", blocks, oi_last_error());
      return 1;
    }
    if (fwrite(out, 1, block, stdout) != block) return 1;
    blocks++;
    frames += fb;
  }
  if (got) {
    fprintf(stderr, "codec_roundtrip: %zu trailing bytes\n", got);
    return 1;
  }
  fprintf(stderr, "%s: %zu blocks, %zu logical bytes, %zu frame bytes (ratio %.4f)\n", argv[1],
          blocks, blocks * block, frames, frames ? (double)(blocks * block) / frames : 0.0);
  free(in);
  free(out);
  free(frame);
  return 0;
}
