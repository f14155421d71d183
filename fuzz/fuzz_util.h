/* Shared by the fuzz targets: a cursor over the input that never reads past
 * its end (missing bytes read as zero), and a check that aborts (so libFuzzer
 * and the replay driver report it) with a message. */
#ifndef OI_FUZZ_UTIL_H
#define OI_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fz {
  const uint8_t *p;
  size_t n, i;
} fz;

static inline uint8_t fz_u8(fz *f) { return f->i < f->n ? f->p[f->i++] : 0; }
static inline uint16_t fz_u16(fz *f) { return (uint16_t)(fz_u8(f) | fz_u8(f) << 8); }
static inline uint32_t fz_u32(fz *f) { return fz_u16(f) | (uint32_t)fz_u16(f) << 16; }
static inline uint64_t fz_u64(fz *f) { return fz_u32(f) | (uint64_t)fz_u32(f) << 32; }
static inline int fz_done(const fz *f) { return f->i >= f->n; }
/* Mostly small values, sometimes anything: the shapes that find edge cases. */
static inline uint64_t fz_size(fz *f, uint64_t small_max) {
  uint8_t k = fz_u8(f);
  switch (k >> 6) {
  case 0:
  case 1: return small_max ? (uint64_t)(k & 63) % (small_max + 1) : 0;
  case 2: return fz_u16(f) % (small_max * 16 + 1);
  default: return fz_u64(f);
  }
}

#define FZ_ASSERT(cond, ...)                                                                       \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: fuzz property failed: %s: ", __FILE__, __LINE__, #cond);             \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
