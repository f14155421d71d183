/* All small allocations go through mimalloc (thread-local free lists, no
 * global lock on the hot path). Large pinned pools are mapped by lib/device.
 *
 * ThreadSanitizer builds use the C library's allocator instead: TSan cannot
 * see the synchronisation inside an uninstrumented mimalloc, so memory freed
 * on one thread and reused on another reads as a data race. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OI_ALLOC_LIBC 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define OI_ALLOC_LIBC 1
#endif

#include "core/core.h"

#ifdef OI_ALLOC_LIBC
#include <stdlib.h>
#include <string.h>

void *oi__malloc(size_t bytes) { return malloc(bytes); }
void *oi__calloc(size_t count, size_t size) { return calloc(count, size); }
void *oi__realloc(void *p, size_t bytes) { return realloc(p, bytes); }
void *oi__aligned_alloc(size_t alignment, size_t bytes) {
  void *p = NULL;
  return posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, bytes) == 0
             ? p
             : NULL;
}
char *oi__strdup(const char *s) { return s ? strdup(s) : NULL; }
void oi__free(void *p) { free(p); }
#else
#include <mimalloc.h>

void *oi__malloc(size_t bytes) { return mi_malloc(bytes); }
void *oi__calloc(size_t count, size_t size) { return mi_calloc(count, size); }
void *oi__realloc(void *p, size_t bytes) { return mi_realloc(p, bytes); }
void *oi__aligned_alloc(size_t alignment, size_t bytes) {
  return mi_malloc_aligned(bytes, alignment);
}
char *oi__strdup(const char *s) { return s ? mi_strdup(s) : NULL; }
void oi__free(void *p) { mi_free(p); }
#endif

#include <string.h>
#include <sys/mman.h>

#define TABLE_HUGE (2u << 20)

void *oi__calloc_table(size_t bytes) {
  if (bytes < TABLE_HUGE) return oi__calloc(1, bytes ? bytes : 1);
  void *p = oi__aligned_alloc(TABLE_HUGE, bytes);
  if (!p) return NULL;
#ifdef MADV_HUGEPAGE
  /* Only the huge pages the array fills: a partly used one at its end would
   * be resident whole. A hint: where it fails, small pages. */
  madvise(p, bytes & ~(size_t)(TABLE_HUGE - 1), MADV_HUGEPAGE);
#endif
  memset(p, 0, bytes);
  return p;
}

bool oi__grow(void **buf, size_t *cap, size_t need, size_t elem, size_t max) {
  if (need <= *cap) return true;
  if (need > max) return false;
  size_t ncap = *cap ? *cap : 64;
  while (ncap < need)
    ncap *= 2;
  if (ncap > max) ncap = max;
  void *p = oi__realloc(*buf, ncap * elem);
  if (!p) return false;
  *buf = p;
  *cap = ncap;
  return true;
}
