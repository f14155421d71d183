/* The cpu backend: "device" memory is host memory, copies are memcpy on one
 * worker thread per stream, and an arena is exported as a POSIX shared-memory
 * object whose name and size travel in the 64-byte handle. A supported mode
 * (CPU inference engines, machines without a GPU), not a mock. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "core/fault.h"
#include "device/device.h"
#include "device/hostmem.h"

#define CPU_HANDLE_MAGIC "OISHM\x01\0\0"
#define CPU_HANDLE_NAME_OFF 16
#define CPU_HANDLE_NAME_MAX (64 - CPU_HANDLE_NAME_OFF)

/* One device allocation: an anonymous mapping, or a shared-memory object when
 * it may be exported. */
typedef struct cpu_alloc {
  struct cpu_alloc *next;
  void *ptr;
  size_t bytes;
  char shm_name[CPU_HANDLE_NAME_MAX];
} cpu_alloc;

typedef struct cpu_dev {
  oi_dev base;
  pthread_mutex_t lock;
  cpu_alloc *allocs;
} cpu_dev;

static atomic_uint shm_counter;

/* Shareable arenas are named /openinfer-<pid>-<n>-<time>. */
int oi__cpu_remove_orphan_arenas(int pid) {
  if (pid <= 0 || pid == (int)getpid()) return 0;
  char prefix[32];
  snprintf(prefix, sizeof prefix, "openinfer-%d-", pid);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, prefix, strlen(prefix)) != 0) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", de->d_name);
    if (shm_unlink(name) == 0) n++;
  }
  closedir(d);
  return n;
}

/* ---- memory ------------------------------------------------------------ */

static oi_status cpu_mem_alloc(oi_dev *d, size_t bytes, uint32_t flags, void **out) {
  cpu_dev *cd = (cpu_dev *)d;
  if (!out || bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "cpu mem_alloc: %s",
                    out ? "bytes is 0" : "out is NULL");
  cpu_alloc *a = oi__calloc(1, sizeof *a);
  if (!a) return oi__fail(OI_ERR_OUT_OF_MEMORY, "cpu mem_alloc: out of memory");
  int fd = -1;
  if (flags & OI_MEM_SHAREABLE) {
    snprintf(a->shm_name, sizeof a->shm_name, "/openinfer-%d-%u-%08x", (int)getpid(),
             atomic_fetch_add(&shm_counter, 1), (unsigned)(oi__now_ns() & 0xffffffffu));
    fd = shm_open(a->shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      int e = errno;
      oi_status st =
          oi__fail(OI_ERR_IO, "cpu mem_alloc: shm_open(%s) failed: %s", a->shm_name, strerror(e));
      oi__free(a); /* after the message, which names it */
      return st;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
      int e = errno;
      close(fd);
      shm_unlink(a->shm_name);
      oi__free(a);
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "cpu mem_alloc: ftruncate(%zu) failed: %s", bytes,
                      strerror(e));
    }
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 fd >= 0 ? MAP_SHARED : (MAP_PRIVATE | MAP_ANONYMOUS), fd, 0);
  int e = errno;
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) {
    if (a->shm_name[0]) shm_unlink(a->shm_name);
    oi__free(a);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "cpu mem_alloc: mmap of %zu bytes failed: %s", bytes,
                    strerror(e));
  }
  a->ptr = p;
  a->bytes = bytes;
  pthread_mutex_lock(&cd->lock);
  a->next = cd->allocs;
  cd->allocs = a;
  pthread_mutex_unlock(&cd->lock);
  *out = p;
  return OI_OK;
}

static cpu_alloc *find_alloc_locked(cpu_dev *cd, void *p, cpu_alloc ***link_out) {
  cpu_alloc **link = &cd->allocs;
  for (; *link; link = &(*link)->next)
    if ((*link)->ptr == p) {
      if (link_out) *link_out = link;
      return *link;
    }
  return NULL;
}

static void cpu_mem_free(oi_dev *d, void *p) {
  cpu_dev *cd = (cpu_dev *)d;
  if (!p) return;
  cpu_alloc **link;
  pthread_mutex_lock(&cd->lock);
  cpu_alloc *a = find_alloc_locked(cd, p, &link);
  if (a) *link = a->next;
  pthread_mutex_unlock(&cd->lock);
  if (!a) {
    OI_LOG(OI_LOG_ERROR, "device", "cpu mem_free: %p was not allocated by this device", p);
    return;
  }
  munmap(a->ptr, a->bytes);
  if (a->shm_name[0]) shm_unlink(a->shm_name);
  oi__free(a);
}

static oi_status cpu_mem_copy(oi_dev *d, void *dst, const void *src, size_t bytes) {
  OI_UNUSED(d);
  if (bytes && (!dst || !src))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "cpu mem_copy: NULL pointer");
  if (bytes) memmove(dst, src, bytes); /* (memmove of NULL is undefined even for 0 bytes) */
  return OI_OK;
}

static oi_status cpu_mem_fill_pattern(oi_dev *d, void *dst, size_t bytes, uint64_t seed) {
  OI_UNUSED(d);
  if (bytes && !dst) return oi__fail(OI_ERR_INVALID_ARGUMENT, "cpu fill_pattern: dst is NULL");
  uint8_t *p = dst;
  for (size_t i = 0; i < bytes; i++)
    p[i] = oi__pattern_byte(seed, i);
  return OI_OK;
}

static oi_status cpu_mem_export(oi_dev *d, void *p, oi_arena_handle *out) {
  cpu_dev *cd = (cpu_dev *)d;
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "cpu mem_export: out is NULL");
  pthread_mutex_lock(&cd->lock);
  cpu_alloc *a = find_alloc_locked(cd, p, NULL);
  oi_arena_handle h;
  memset(&h, 0, sizeof h);
  bool ok = a && a->shm_name[0];
  if (ok) {
    uint64_t size = a->bytes;
    memcpy(h.bytes, CPU_HANDLE_MAGIC, 8);
    memcpy(h.bytes + 8, &size, sizeof size);
    memcpy(h.bytes + CPU_HANDLE_NAME_OFF, a->shm_name, strlen(a->shm_name));
  }
  pthread_mutex_unlock(&cd->lock);
  if (!ok)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "cpu mem_export: %p is not a shareable allocation of this device", p);
  *out = h;
  return OI_OK;
}

static oi_status cpu_mem_import(oi_dev *d, const oi_arena_handle *h, uint64_t expected, void **ptr,
                                uint64_t *size) {
  OI_UNUSED(d);
  if (memcmp(h->bytes, CPU_HANDLE_MAGIC, 8) != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "arena import: not a cpu arena handle (bad magic)");
  uint64_t claimed;
  memcpy(&claimed, h->bytes + 8, sizeof claimed);
  char name[CPU_HANDLE_NAME_MAX + 1];
  memcpy(name, h->bytes + CPU_HANDLE_NAME_OFF, CPU_HANDLE_NAME_MAX);
  name[CPU_HANDLE_NAME_MAX] = '\0';
  if (name[0] != '/' || strchr(name + 1, '/'))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "arena import: malformed shared-memory name");
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    return oi__fail(errno == EACCES ? OI_ERR_PERMISSION : OI_ERR_NOT_FOUND,
                    "arena import: shm_open(%s) failed: %s", name, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return oi__fail(OI_ERR_IO, "arena import: fstat(%s) failed: %s", name, strerror(e));
  }
  uint64_t real = (uint64_t)st.st_size;
  if (real != claimed || real < expected) {
    close(fd);
    return oi__fail(
        OI_ERR_PROTOCOL, "arena import: %s holds %llu bytes (handle says %llu), %llu expected",
        name, (unsigned long long)real, (unsigned long long)claimed, (unsigned long long)expected);
  }
  void *p = mmap(NULL, real, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "arena import: mmap(%s) failed: %s", name, strerror(e));
  *ptr = p;
  *size = real;
  return OI_OK;
}

static void cpu_mem_close_import(oi_dev *d, void *ptr, uint64_t size) {
  OI_UNUSED(d);
  if (ptr) munmap(ptr, size);
}

static oi_status cpu_mem_export_range(oi_dev *d, void *p, uint64_t bytes, oi_arena_handle *out,
                                      uint64_t *offset) {
  OI_UNUSED(d);
  OI_UNUSED(p);
  OI_UNUSED(bytes);
  OI_UNUSED(out);
  OI_UNUSED(offset);
  return oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "an engine-owned cpu arena travels as a memfd: set arena_fd");
}

/* ---- engine-owned cpu arenas (a memfd passed over the socket) ----------- */

oi_status oi__fd_arena_check(int fd, uint64_t bytes, const char *what) {
  if (fd < 0) return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: no arena file descriptor", what);
  struct stat st;
  if (fstat(fd, &st) != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena fd %d: %s", what, fd, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: the arena fd is not a memfd (not a regular file)",
                    what);
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: the arena fd is not a memfd that accepts seals (memfd_create with "
                    "MFD_ALLOW_SEALING): %s",
                    what, strerror(errno));
  if (!(seals & F_SEAL_SHRINK))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: the arena memfd is not sealed against shrinking (add F_SEAL_SHRINK)",
                    what);
#ifdef F_SEAL_FUTURE_WRITE
  if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))
#else
  if (seals & F_SEAL_WRITE)
#endif
    return oi__fail(OI_ERR_PERMISSION, "%s: the arena memfd is sealed against writes", what);
  if ((uint64_t)st.st_size < bytes)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: the arena memfd holds %llu bytes, %llu needed",
                    what, (unsigned long long)st.st_size, (unsigned long long)bytes);
  return OI_OK;
}

oi_status oi__fd_arena_map(int fd, uint64_t bytes, void **ptr, uint64_t *mapped, const char *what) {
  *ptr = NULL;
  *mapped = 0;
  if (bytes == 0 || bytes > SIZE_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena size %llu", what,
                    (unsigned long long)bytes);
  oi_status st = oi__fd_arena_check(fd, bytes, what);
  if (st != OI_OK) return st;
  void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    return oi__fail(e == EACCES || e == EPERM ? OI_ERR_PERMISSION : OI_ERR_OUT_OF_MEMORY,
                    "%s: mapping the arena memfd (%llu bytes, read-write) failed: %s", what,
                    (unsigned long long)bytes, strerror(e));
  }
  *ptr = p;
  *mapped = bytes;
  return OI_OK;
}

oi_status oi__fd_arena_check_mapping(int fd, const void *base, uint64_t bytes, const char *what) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: arena fd %d: %s", what, fd, strerror(errno));
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return oi__fail(OI_ERR_IO, "%s: /proc/self/maps: %s", what, strerror(errno));
  /* Walk the mappings in address order: [base, base + bytes) must be
   * covered, without a gap, by mappings of this file at the matching offsets
   * (file offset 0 at base). */
  uintptr_t want = (uintptr_t)base, end = (uintptr_t)base + bytes;
  char line[512];
  oi_status rc = OI_ERR_INVALID_ARGUMENT;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi, off, ino;
    unsigned dmaj, dmin;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &dmaj, &dmin, &ino) != 7)
      continue;
    if (hi <= want || lo > want) continue;
    if (ino != (unsigned long)st.st_ino || makedev(dmaj, dmin) != st.st_dev || perms[3] != 's' ||
        perms[0] != 'r' || perms[1] != 'w' || off + (want - lo) != want - (uintptr_t)base)
      break;
    want = hi;
    if (want >= end) {
      rc = OI_OK;
      break;
    }
  }
  fclose(f);
  if (rc != OI_OK)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: [arena_base, arena_base + %llu) is not a read-write MAP_SHARED mapping of "
                    "arena_fd from its offset 0 (at %p)",
                    what, (unsigned long long)bytes, (void *)want);
  return OI_OK;
}

void oi__fd_arena_unmap(void *ptr, uint64_t mapped) {
  if (ptr) munmap(ptr, (size_t)mapped);
}

/* ---- pinned host memory -------------------------------------------------- */

static oi_status cpu_pinned_alloc(oi_dev *d, size_t bytes, uint32_t flags, int numa_node,
                                  oi_pinned *out) {
  OI_UNUSED(d);
  if (!out || bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "pinned_alloc: %s",
                    out ? "bytes is 0" : "out is NULL");
  size_t mapped;
  oi_status st = oi__host_map(bytes, flags, numa_node, &out->host, &mapped);
  if (st != OI_OK) return st;
  if (OI_FAULT(OI_FAULT_PIN_REGISTER, NULL)) {
    oi__host_unmap(out->host, mapped);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "pinned_alloc: pinning failed (injected fault)");
  }
  out->device = out->host;
  out->bytes = mapped;
  out->flags = flags;
  out->how = 0;
  return OI_OK;
}

static void cpu_pinned_free(oi_dev *d, oi_pinned *p) {
  OI_UNUSED(d);
  if (!p) return;
  oi__host_unmap(p->host, p->bytes);
  memset(p, 0, sizeof *p);
}

/* ---- streams --------------------------------------------------------------- */

typedef enum { ITEM_COPY, ITEM_CALL, ITEM_STOP } item_kind;

typedef struct stream_item {
  struct stream_item *next;
  item_kind kind;
  oi_stream_fn fn;
  void *arg;
  size_t n;
  oi_copy_desc descs[];
} stream_item;

struct oi_stream {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cv;      /* work arrived (the worker waits on it) */
  pthread_cond_t done_cv; /* work finished (stream_sync waits on it) */
  stream_item *head, *tail;
  uint64_t submitted, completed;
  bool idle;     /* the worker sleeps on cv: only then does a push need a wake-up */
  int syncers;   /* threads in stream_sync */
  oi_status err; /* first copy error since the last callback (worker thread only) */
};

/* Large pieces are copied with non-temporal stores: the destination is not
 * read again soon (a host block until it is loaded, an arena page until the
 * model runs), and streaming stores reach memory bandwidth where cached
 * stores of pieces below the C library's own non-temporal threshold do not. */
#define NT_COPY_MIN (256u << 10)
#define COPY_PREFETCH 1024

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
static void copy_piece(uint8_t *dst, const uint8_t *src, size_t n) {
  if (n < NT_COPY_MIN) {
    memcpy(dst, src, n);
    return;
  }
  size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
  memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    /* The source a kilobyte ahead: one thread's streaming copy is bound by
     * the loads in flight, and the hardware prefetcher alone keeps too few
     * (a prefetch past the end of the source is harmless: it never faults). */
    _mm_prefetch((const char *)src + i + COPY_PREFETCH, _MM_HINT_T0);
    __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
    _mm_stream_si128((__m128i *)(dst + i), a);
    _mm_stream_si128((__m128i *)(dst + i + 16), b);
    _mm_stream_si128((__m128i *)(dst + i + 32), c);
    _mm_stream_si128((__m128i *)(dst + i + 48), d);
  }
  memcpy(dst + body, src + body, n - body);
}
static void copy_fence(void) { _mm_sfence(); }
#else
static void copy_piece(uint8_t *dst, const uint8_t *src, size_t n) { memcpy(dst, src, n); }
static void copy_fence(void) {}
#endif

/* One queued copy. Fault points (lib/core/fault.h): copy_slow sleeps first;
 * copy_fail moves nothing; copy_partial moves about half the bytes. */
static oi_status run_copy(const stream_item *it) {
  uint64_t ms = 0, limit = UINT64_MAX;
  if (OI_FAULT(OI_FAULT_COPY_SLOW, &ms)) usleep((useconds_t)(ms * 1000));
  if (OI_FAULT(OI_FAULT_COPY_FAIL, NULL))
    return oi__fail(OI_ERR_IO, "copy failed (injected fault)");
  if (OI_FAULT(OI_FAULT_COPY_PARTIAL, NULL)) {
    limit = 0;
    for (size_t i = 0; i < it->n; i++)
      limit += it->descs[i].bytes;
    limit /= 2;
  }
  for (size_t i = 0; i < it->n && limit; i++) {
    uint64_t n = OI_MIN(it->descs[i].bytes, limit);
    copy_piece((uint8_t *)it->descs[i].dst, (const uint8_t *)it->descs[i].src, n);
    if (limit != UINT64_MAX) limit -= n;
  }
  copy_fence(); /* streaming stores are visible before anything that follows */
  return limit == UINT64_MAX ? OI_OK : oi__fail(OI_ERR_IO, "copy failed midway (injected fault)");
}

static void *stream_main(void *arg) {
  oi_stream *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->lock);
    while (!s->head) {
      s->idle = true;
      pthread_cond_wait(&s->cv, &s->lock);
    }
    s->idle = false;
    stream_item *it = s->head;
    pthread_mutex_unlock(&s->lock);

    bool stop = it->kind == ITEM_STOP;
    if (it->kind == ITEM_COPY) {
      oi_status st = run_copy(it);
      if (s->err == OI_OK) s->err = st;
    } else if (it->kind == ITEM_CALL) {
      oi_status st = s->err; /* the first error since the previous callback */
      s->err = OI_OK;
      it->fn(it->arg, st);
    }

    pthread_mutex_lock(&s->lock);
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    s->completed++;
    if (s->syncers) pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->lock);
    oi__free(it);
    if (stop) return NULL;
  }
}

static oi_status stream_push(oi_stream *s, stream_item *it) {
  pthread_mutex_lock(&s->lock);
  it->next = NULL;
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  s->submitted++;
  bool wake = s->idle;
  s->idle = false; /* one wake-up per sleep */
  pthread_mutex_unlock(&s->lock);
  /* Signalled after the unlock: the worker does not wake only to wait for
   * the lock this thread still holds. The stream outlives every push. */
  if (wake) pthread_cond_signal(&s->cv);
  return OI_OK;
}

static oi_status cpu_stream_create(oi_dev *d, int priority, oi_stream **out) {
  OI_UNUSED(d);
  OI_UNUSED(priority);
  oi_stream *s = oi__calloc(1, sizeof *s);
  if (!s) return oi__fail(OI_ERR_OUT_OF_MEMORY, "stream_create: out of memory");
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  int rc = pthread_create(&s->thread, NULL, stream_main, s);
  if (rc != 0) {
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->lock);
    oi__free(s);
    return oi__fail(OI_ERR_INTERNAL, "stream_create: pthread_create failed: %s", strerror(rc));
  }
  pthread_setname_np(s->thread, "oi-cpu-stream");
  *out = s;
  return OI_OK;
}

static void cpu_stream_destroy(oi_stream *s) {
  if (!s) return;
  stream_item *stop = oi__calloc(1, sizeof *stop);
  if (!stop) oi__fatal("cpu stream_destroy: out of memory while stopping a stream");
  stop->kind = ITEM_STOP;
  stream_push(s, stop);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->done_cv);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->lock);
  oi__free(s);
}

static oi_status cpu_stream_copy(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
                                 const oi_copy_params *p) {
  OI_UNUSED(dir);
  OI_UNUSED(p); /* memcpy is the only way to copy here */
  if (n == 0) return OI_OK;
  if (!descs) return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_copy: descs is NULL");
  stream_item *it = oi__malloc(sizeof *it + n * sizeof(oi_copy_desc));
  if (!it) return oi__fail(OI_ERR_OUT_OF_MEMORY, "stream_copy: out of memory for %zu pieces", n);
  it->kind = ITEM_COPY;
  it->n = n;
  memcpy(it->descs, descs, n * sizeof *descs);
  return stream_push(s, it);
}

static oi_status cpu_stream_call(oi_stream *s, oi_stream_fn fn, void *arg) {
  if (!fn) return oi__fail(OI_ERR_INVALID_ARGUMENT, "stream_call: fn is NULL");
  stream_item *it = oi__calloc(1, sizeof *it);
  if (!it) return oi__fail(OI_ERR_OUT_OF_MEMORY, "stream_call: out of memory");
  it->kind = ITEM_CALL;
  it->fn = fn;
  it->arg = arg;
  return stream_push(s, it);
}

static oi_status cpu_stream_wait_event(oi_stream *s, void *event) {
  OI_UNUSED(s);
  if (event)
    return oi__fail(OI_ERR_UNSUPPORTED, "stream_wait_event: the cpu backend has no device events");
  return OI_OK;
}

static oi_status cpu_stream_record_event(oi_stream *s, void **event) {
  OI_UNUSED(s);
  *event = NULL;
  return OI_OK;
}

static void cpu_event_destroy(void *event) { OI_UNUSED(event); }

static oi_status cpu_event_query(void *event) {
  OI_UNUSED(event); /* cpu streams record no events: arena progress comes by callbacks */
  return OI_OK;
}

static oi_status cpu_stream_sync(oi_stream *s) {
  pthread_mutex_lock(&s->lock);
  uint64_t target = s->submitted;
  s->syncers++;
  while (s->completed < target)
    pthread_cond_wait(&s->done_cv, &s->lock);
  s->syncers--;
  pthread_mutex_unlock(&s->lock);
  return OI_OK;
}

/* ---- device -------------------------------------------------------------- */

static oi_status cpu_info(oi_dev *d, oi_device_info *out) {
  OI_UNUSED(d);
  snprintf(out->name, sizeof out->name, "cpu");
  out->backend = OI_BACKEND_CPU;
  struct sysinfo si;
  if (sysinfo(&si) == 0) out->total_memory = (uint64_t)si.totalram * si.mem_unit;
  out->numa_node = -1;
  out->can_map_host_memory = 1;
  out->multiprocessors = (uint32_t)get_nprocs();
  return OI_OK;
}

static void cpu_close(oi_dev *d) {
  cpu_dev *cd = (cpu_dev *)d;
  /* Allocations outlive nothing: free what the user leaked. */
  while (cd->allocs)
    cpu_mem_free(d, cd->allocs->ptr);
  pthread_mutex_destroy(&cd->lock);
  oi__free(cd);
}

static const oi_dev_ops cpu_ops = {
    .name = "cpu",
    .close = cpu_close,
    .info = cpu_info,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .mem_copy = cpu_mem_copy,
    .mem_fill_pattern = cpu_mem_fill_pattern,
    .mem_export = cpu_mem_export,
    .mem_import = cpu_mem_import,
    .mem_close_import = cpu_mem_close_import,
    .mem_export_range = cpu_mem_export_range,
    .pinned_alloc = cpu_pinned_alloc,
    .pinned_free = cpu_pinned_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_copy = cpu_stream_copy,
    .stream_call = cpu_stream_call,
    .stream_wait_event = cpu_stream_wait_event,
    .stream_record_event = cpu_stream_record_event,
    .event_destroy = cpu_event_destroy,
    .event_query = cpu_event_query,
    .stream_sync = cpu_stream_sync,
};

oi_status oi__cpu_dev_open(oi_dev **out) {
  cpu_dev *cd = oi__calloc(1, sizeof *cd);
  if (!cd) return oi__fail(OI_ERR_OUT_OF_MEMORY, "cpu device: out of memory");
  cd->base.ops = &cpu_ops;
  cd->base.ordinal = OI_DEVICE_CPU;
  pthread_mutex_init(&cd->lock, NULL);
  *out = &cd->base;
  return OI_OK;
}
