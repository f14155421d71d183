/* Host mappings for the pool, shared by both backends: anonymous memory,
 * optionally on 2 MiB hugepages, bound to a NUMA node when asked, and touched
 * up front by several threads so the first save does not pay for page faults
 * and large pools set up at memory speed. Progress is logged for long setups. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "core/fault.h"
#include "device/hostmem.h"

#define TOUCH_SLICE (64ull << 20) /* work unit handed to touch threads */
#define MAX_TOUCH_THREADS 64

static unsigned long read_sysctl_ulong(const char *path) {
  unsigned long v = 0;
  FILE *f = fopen(path, "r");
  if (f) {
    if (fscanf(f, "%lu", &v) != 1) v = 0;
    fclose(f);
  }
  return v;
}

/* Reads a number (bytes) from a one-value file; false if absent or "max". */
static bool read_u64_file(const char *path, uint64_t *out) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  unsigned long long v;
  bool ok = fscanf(f, "%llu", &v) == 1;
  fclose(f);
  if (ok) *out = v;
  return ok;
}

/* Bytes the kernel reports it can hand out without swapping (MemAvailable),
 * capped by the memory cgroup's limit less its usage. *why names the bound
 * that decided. */
uint64_t oi__host_memory_available(const char **why) {
  uint64_t avail = UINT64_MAX;
  *why = "unknown";
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        avail = kb * 1024ull;
        *why = "MemAvailable in /proc/meminfo";
        break;
      }
    fclose(f);
  }
  uint64_t limit, usage;
  if ((read_u64_file("/sys/fs/cgroup/memory.max", &limit) &&
       read_u64_file("/sys/fs/cgroup/memory.current", &usage)) ||
      (read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", &limit) &&
       read_u64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes", &usage))) {
    uint64_t room = limit > usage ? limit - usage : 0;
    if (room < avail) {
      avail = room;
      *why = "the memory cgroup's limit less its usage";
    }
  }
  return avail;
}

static unsigned long free_hugepages(void) {
  return read_sysctl_ulong("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
}

static _Thread_local void (*progress_fn)(void *ctx, uint64_t done, uint64_t total);
static _Thread_local void *progress_ctx;

void oi__host_map_set_progress(void (*fn)(void *ctx, uint64_t done, uint64_t total), void *ctx) {
  progress_fn = fn;
  progress_ctx = ctx;
}

typedef struct touch_job {
  uint8_t *base;
  size_t len;
  size_t page;
  atomic_size_t next;    /* next slice offset */
  atomic_size_t touched; /* bytes done */
} touch_job;

static void *touch_main(void *arg) {
  touch_job *j = arg;
  for (;;) {
    size_t off = atomic_fetch_add(&j->next, TOUCH_SLICE);
    if (off >= j->len) return NULL;
    size_t end = off + TOUCH_SLICE < j->len ? off + TOUCH_SLICE : j->len;
    for (size_t p = off; p < end; p += j->page)
      ((volatile uint8_t *)j->base)[p] = 0;
    atomic_fetch_add(&j->touched, end - off);
  }
}

/* Binds [p, p+len) to `node` (MPOL_BIND) before the first touch. Best effort:
 * a failure is logged and the memory stays wherever the kernel puts it. */
static void bind_to_node(void *p, size_t len, int node) {
  if (node < 0 || node >= 64) return;
  unsigned long mask = 1ul << node;
  const int MPOL_BIND_ = 2;
  if (syscall(SYS_mbind, p, len, MPOL_BIND_, &mask, 64, 0) != 0)
    OI_LOG(OI_LOG_WARN, "host", "mbind to NUMA node %d failed: %s (pool left unbound)", node,
           strerror(errno));
}

oi_status oi__host_map(size_t bytes, uint32_t flags, int numa_node, void **out, size_t *mapped) {
  int mflags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  size_t len = bytes;
  /* Every page is touched below: a pool larger than the memory the machine
   * can give would be touched until the kernel kills the process. Refuse it
   * before touching anything. (Hugepages come from their own reserve, which
   * mmap checks.) */
  if (!(flags & OI_PIN_HUGEPAGES)) {
    const char *why;
    uint64_t avail = oi__host_memory_available(&why);
    if ((uint64_t)bytes > avail)
      return oi__fail(OI_ERR_OUT_OF_MEMORY,
                      "host pool: %.2f GiB asked for, but only %.2f GiB of memory is available "
                      "(%s); choose a smaller pool",
                      (double)bytes / (1ull << 30), (double)avail / (1ull << 30), why);
  }
  if (flags & OI_PIN_HUGEPAGES) {
    /* Hugepages are reserved at mmap, so a shortage fails here with ENOMEM;
     * with MAP_NORESERVE it would surface as SIGBUS on the first touch. */
    mflags = (mflags & ~MAP_NORESERVE) | MAP_HUGETLB;
    len = (bytes + OI_HUGEPAGE_BYTES - 1) & ~(OI_HUGEPAGE_BYTES - 1);
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, mflags, -1, 0);
  if (p != MAP_FAILED && OI_FAULT(OI_FAULT_PINNED_ALLOC, NULL)) {
    munmap(p, len);
    p = MAP_FAILED;
    errno = ENOMEM;
  }
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
  bind_to_node(p, len, numa_node);

  touch_job job = {.base = p,
                   .len = len,
                   .page = (flags & OI_PIN_HUGEPAGES) ? OI_HUGEPAGE_BYTES
                                                      : (size_t)sysconf(_SC_PAGESIZE)};
  int nthreads = get_nprocs();
  if (nthreads > MAX_TOUCH_THREADS) nthreads = MAX_TOUCH_THREADS;
  if ((size_t)nthreads > len / TOUCH_SLICE) nthreads = (int)(len / TOUCH_SLICE);
  pthread_t threads[MAX_TOUCH_THREADS];
  int started = 0;
  for (; started < nthreads - 1; started++) /* the calling thread is one of them */
    if (pthread_create(&threads[started], NULL, touch_main, &job) != 0) break;
  uint64_t t0 = oi__now_ns(), last_log = t0, last_progress = t0;
  void (*fn)(void *, uint64_t, uint64_t) = progress_fn;
  void *fn_ctx = progress_ctx;
  if (started == 0 || (len < (1ull << 30) && !fn)) {
    touch_main(&job);
  } else {
    /* Report progress while the workers touch: to the caller's hook about
     * every 100 ms, or in the log every second. */
    for (;;) {
      size_t done = atomic_load(&job.touched);
      if (done >= len) break;
      uint64_t now = oi__now_ns();
      if (fn && now - last_progress >= 100000000ull) {
        fn(fn_ctx, done, len);
        last_progress = now;
      } else if (!fn && now - last_log > 1000000000ull) {
        OI_LOG(OI_LOG_INFO, "host", "pool setup: %.0f%% (%.1f of %.1f GiB, %.2f GB/s)",
               100.0 * (double)done / (double)len, (double)done / (1ull << 30),
               (double)len / (1ull << 30), (double)done / (double)(now - t0));
        last_log = now;
      }
      usleep(20000);
    }
  }
  for (int i = 0; i < started; i++)
    pthread_join(threads[i], NULL);
  *out = p;
  *mapped = len;
  return OI_OK;
}

void oi__host_unmap(void *p, size_t mapped) {
  if (p) munmap(p, mapped);
}
