/* Host mappings for the pool, shared by both backends: anonymous memory,
 * optionally on 2 MiB hugepages, touched up front so the first save does not
 * pay for page faults. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hostmem.h"

static unsigned long read_sysctl_ulong(const char *path) {
  unsigned long v = 0;
  FILE *f = fopen(path, "r");
  if (f) {
    if (fscanf(f, "%lu", &v) != 1) v = 0;
    fclose(f);
  }
  return v;
}

static unsigned long free_hugepages(void) {
  return read_sysctl_ulong("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
}

oi_status oi__host_map(size_t bytes, uint32_t flags, void **out, size_t *mapped) {
  int mflags = MAP_PRIVATE | MAP_ANONYMOUS;
  size_t len = bytes;
  if (flags & OI_PIN_HUGEPAGES) {
    mflags |= MAP_HUGETLB;
    len = (bytes + OI_HUGEPAGE_BYTES - 1) & ~(OI_HUGEPAGE_BYTES - 1);
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, mflags, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    if (flags & OI_PIN_HUGEPAGES)
      return oi__fail(OI_ERR_OUT_OF_MEMORY,
                      "host pool: %zu hugepages of 2 MiB needed, %lu free (raise "
                      "/proc/sys/vm/nr_hugepages, or drop OI_HOST_HUGEPAGES): %s",
                      (size_t)(len / OI_HUGEPAGE_BYTES), free_hugepages(), strerror(e));
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "host pool: mmap of %zu bytes failed: %s", len,
                    strerror(e));
  }
  long page = (flags & OI_PIN_HUGEPAGES) ? (long)OI_HUGEPAGE_BYTES : sysconf(_SC_PAGESIZE);
  for (size_t off = 0; off < len; off += (size_t)page) ((volatile uint8_t *)p)[off] = 0;
  *out = p;
  *mapped = len;
  return OI_OK;
}

void oi__host_unmap(void *p, size_t mapped) {
  if (p) munmap(p, mapped);
}
