/* The cuda device backend on a real GPU: memory, pinned memory (cudaHostAlloc,
 * registered mmap, hugepages when available), stream copies with ordered
 * callbacks, and arena export/import over CUDA IPC between two processes with
 * the size check. Skips (77) without a GPU. */
#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device/device.h"
#include "testutil.h"

extern char **environ;
static oi_dev *dev;

static bool host_is_pattern(const uint8_t *p, size_t n, uint64_t seed, uint64_t base) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != oi__pattern_byte(seed, base + i)) return false;
  return true;
}

static bool dev_is_pattern(void *dptr, size_t n, uint64_t seed, uint64_t base) {
  uint8_t *h = malloc(n);
  REQUIRE(h);
  bool ok = dev->ops->mem_copy(dev, h, dptr, n) == OI_OK && host_is_pattern(h, n, seed, base);
  free(h);
  return ok;
}

static void test_info_describes_the_gpu(void) {
  oi_device_info info = {.struct_size = sizeof info};
  CHECK_OK(oi_device_get_info(0, &info));
  CHECK(info.backend == OI_BACKEND_CUDA);
  CHECK(info.compute_capability >= 70);
  CHECK(info.name[0] != '\0' && info.total_memory > (1ull << 30) && info.multiprocessors > 0);
  fprintf(stderr, "  gpu 0: %s, cc %u, %u SMs, %.1f GiB, pci %s, numa %d, map host %u\n", info.name,
          info.compute_capability, info.multiprocessors, (double)info.total_memory / (1 << 30),
          info.pci_bus_id, info.numa_node, info.can_map_host_memory);
}

static void test_device_memory_zeroed_and_pattern_kernel_matches_host(void) {
  const size_t n = (16 << 20) + 5;
  void *p = NULL;
  CHECK_OK(dev->ops->mem_alloc(dev, n, 0, &p));
  REQUIRE(p);
  uint8_t *h = calloc(1, n);
  REQUIRE(h);
  memset(h, 0xAA, n);
  CHECK_OK(dev->ops->mem_copy(dev, h, p, n));
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i++)
    nonzero += h[i] != 0;
  CHECK(nonzero == 0);
  CHECK_OK(dev->ops->mem_fill_pattern(dev, p, n, 1234));
  CHECK(dev_is_pattern(p, n, 1234, 0));
  free(h);
  dev->ops->mem_free(dev, p);
}

typedef struct call_log {
  pthread_mutex_t lock;
  int order[4];
  int n;
  oi_status st[4];
} call_log;
typedef struct call_arg {
  call_log *log;
  int id;
} call_arg;

static void on_call(void *p, oi_status st) {
  call_arg *a = p;
  pthread_mutex_lock(&a->log->lock);
  a->log->st[a->log->n] = st;
  a->log->order[a->log->n++] = a->id;
  pthread_mutex_unlock(&a->log->lock);
}

static void round_trip_through_pinned(uint32_t flags, const char *what) {
  enum { BLOCKS = 128, PIECE = (64 << 10) + 48 };
  oi_pinned pool;
  oi_status st = dev->ops->pinned_alloc(dev, (size_t)BLOCKS * PIECE, flags, -1, &pool);
  if (flags & OI_PIN_HUGEPAGES && st == OI_ERR_OUT_OF_MEMORY) {
    fprintf(stderr, "  %s: no hugepages here (%s), skipped\n", what, oi_last_error());
    return;
  }
  CHECK_OK(st);
  if (st != OI_OK) return;
  void *arena = NULL;
  oi_stream *s = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, 2ull * BLOCKS * PIECE, 0, &arena) == OI_OK);
  REQUIRE(dev->ops->stream_create(dev, 1, &s) == OI_OK);
  CHECK_OK(dev->ops->mem_fill_pattern(dev, arena, (size_t)BLOCKS * PIECE, 21));
  oi_copy_desc d[BLOCKS];
  uint8_t *a = arena, *h = pool.host;
  for (int b = 0; b < BLOCKS; b++)
    d[b] = (oi_copy_desc){(uintptr_t)(a + (size_t)b * PIECE),
                          (uintptr_t)(h + (size_t)(BLOCKS - 1 - b) * PIECE), PIECE};
  call_log log = {.lock = PTHREAD_MUTEX_INITIALIZER};
  call_arg c1 = {&log, 1}, c2 = {&log, 2};
  /* The copy kernel where the pool is mapped; pageable memory falls back to DMA. */
  oi_copy_params kp = {.mode = OI_XFER_KERNEL, .host_mapped = pool.device != NULL};
  CHECK_OK(dev->ops->stream_copy(s, OI_COPY_D2H, d, BLOCKS, &kp));
  CHECK_OK(dev->ops->stream_call(s, on_call, &c1));
  for (int k = 0; k < BLOCKS; k++)
    d[k] = (oi_copy_desc){(uintptr_t)(h + (size_t)k * PIECE),
                          (uintptr_t)(a + (size_t)(BLOCKS + k) * PIECE), PIECE};
  CHECK_OK(dev->ops->stream_copy(s, OI_COPY_H2D, d, BLOCKS, &kp));
  CHECK_OK(dev->ops->stream_call(s, on_call, &c2));
  CHECK_OK(dev->ops->stream_sync(s));
  CHECK(log.n == 2 && log.order[0] == 1 && log.order[1] == 2 && log.st[0] == OI_OK &&
        log.st[1] == OI_OK);
  bool ok = true;
  for (int b = 0; b < BLOCKS && ok; b++) {
    ok = host_is_pattern(h + (size_t)(BLOCKS - 1 - b) * PIECE, PIECE, 21, (uint64_t)b * PIECE) &&
         dev_is_pattern(a + (size_t)(BLOCKS + (BLOCKS - 1 - b)) * PIECE, PIECE, 21,
                        (uint64_t)b * PIECE);
  }
  CHECK(ok);
  fprintf(stderr, "  %s: %s (device view %s)\n", what, ok ? "bytes match" : "MISMATCH",
          pool.device ? "present" : "absent");
  CHECK((flags & OI_PIN_NO_PIN) ? pool.device == NULL : pool.device != NULL);
  dev->ops->stream_destroy(s);
  dev->ops->mem_free(dev, arena);
  dev->ops->pinned_free(dev, &pool);
}

static void test_stream_round_trip_cuda_host_alloc(void) {
  round_trip_through_pinned(0, "cudaHostAlloc");
}
static void test_stream_round_trip_pageable(void) {
  round_trip_through_pinned(OI_PIN_NO_PIN, "pageable");
}
static void test_stream_round_trip_registered_hugepages(void) {
  round_trip_through_pinned(OI_PIN_HUGEPAGES, "mmap+hugepages+cuMemHostRegister");
}

/* ---- IPC across processes ---- */

static void to_hex(const uint8_t *b, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", b[i]);
}
static void from_hex(const char *s, uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    sscanf(s + 2 * i, "%2x", &v);
    b[i] = (uint8_t)v;
  }
}

/* Child: import, check the size check, verify the owner's bytes, write ours. */
static int child_main(const char *hex, size_t size) {
  oi_arena_handle h;
  from_hex(hex, h.bytes, sizeof h.bytes);
  oi_imported_arena *imp = NULL;
  if (oi_imported_arena_open(&h, size + (64ull << 20), 0, &imp) != OI_ERR_PROTOCOL || imp)
    return 10;
  fprintf(stderr, "  child: oversized expectation refused: %s\n", oi_last_error());
  if (oi_imported_arena_open(&h, size, 0, &imp) != OI_OK) {
    fprintf(stderr, "  child: import failed: %s\n", oi_last_error());
    return 11;
  }
  if (oi_imported_arena_size(imp) < size) return 12;
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  if (!dev_is_pattern(oi_imported_arena_ptr(imp), size, 31, 0)) return 13;
  if (dev->ops->mem_fill_pattern(dev, oi_imported_arena_ptr(imp), 1 << 20, 32) != OI_OK) return 14;
  oi_imported_arena_close(imp);
  oi__dev_close(dev);
  return 0;
}

static void test_arena_ipc_between_processes_with_size_check(const char *self) {
  const size_t size = (96ull << 20) + 4096;
  void *arena = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, size, OI_MEM_SHAREABLE, &arena) == OI_OK);
  CHECK_OK(dev->ops->mem_fill_pattern(dev, arena, size, 31));
  oi_arena_handle h;
  CHECK_OK(dev->ops->mem_export(dev, arena, &h));
  char hex[129], size_s[32];
  to_hex(h.bytes, sizeof h.bytes, hex);
  snprintf(size_s, sizeof size_s, "%zu", size);
  char *args[] = {(char *)self, "--child", hex, size_s, NULL};
  pid_t pid;
  REQUIRE(posix_spawn(&pid, self, NULL, NULL, args, environ) == 0);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status))
    fprintf(stderr, "  child failed: status %d\n", status);
  CHECK(dev_is_pattern(arena, 1 << 20, 32, 0));
  CHECK(dev_is_pattern((uint8_t *)arena + (1 << 20), size - (1 << 20), 31, 1 << 20));
  dev->ops->mem_free(dev, arena);
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--child"))
    return child_main(argv[2], strtoull(argv[3], NULL, 10));
  int n = 0;
  oi_device_count(&n);
  if (n == 0) TEST_SKIP("no CUDA device");
  REQUIRE(oi__dev_open(0, &dev) == OI_OK);
  CHECK(strcmp(dev->ops->name, "cuda") == 0);
  RUN_TEST(test_info_describes_the_gpu);
  RUN_TEST(test_device_memory_zeroed_and_pattern_kernel_matches_host);
  RUN_TEST(test_stream_round_trip_cuda_host_alloc);
  RUN_TEST(test_stream_round_trip_pageable);
  RUN_TEST(test_stream_round_trip_registered_hugepages);
  test_arena_ipc_between_processes_with_size_check(argv[0]);
  fprintf(stderr, "%-60s %s\n", "test_arena_ipc_between_processes_with_size_check",
          oi_test_failures ? "?" : "ok");
  oi__dev_close(dev);
  TEST_EXIT();
}
