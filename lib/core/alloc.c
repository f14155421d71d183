/* All small allocations go through mimalloc (thread-local free lists, no
 * global lock on the hot path). Large pinned pools are mapped by lib/device. */
#include <mimalloc.h>

#include "core.h"

void *oi__malloc(size_t bytes) { return mi_malloc(bytes); }
void *oi__calloc(size_t count, size_t size) { return mi_calloc(count, size); }
void *oi__realloc(void *p, size_t bytes) { return mi_realloc(p, bytes); }
void *oi__aligned_alloc(size_t alignment, size_t bytes) { return mi_malloc_aligned(bytes, alignment); }
char *oi__strdup(const char *s) { return s ? mi_strdup(s) : NULL; }
void oi__free(void *p) { mi_free(p); }
