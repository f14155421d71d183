/* The cpu device backend: memory, pinned pool memory, streams (copies and
 * ordered callbacks), and arena export/import between two processes. */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device/device.h"
#include "testutil.h"

static oi_dev *dev;

static bool is_pattern(const uint8_t *p, size_t n, uint64_t seed, uint64_t base_off) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != oi__pattern_byte(seed, base_off + i)) return false;
  return true;
}

static void test_device_memory_is_zeroed_and_fillable(void) {
  void *p = NULL;
  CHECK_OK(dev->ops->mem_alloc(dev, 1 << 20, 0, &p));
  REQUIRE(p);
  const uint8_t *b = p;
  size_t nonzero = 0;
  for (size_t i = 0; i < (1 << 20); i++)
    nonzero += b[i] != 0;
  CHECK(nonzero == 0);
  CHECK_OK(dev->ops->mem_fill_pattern(dev, p, (1 << 20) - 3, 9));
  CHECK(is_pattern(p, (1 << 20) - 3, 9, 0));
  CHECK(b[(1 << 20) - 1] == 0);
  dev->ops->mem_free(dev, p);
  CHECK_ST(dev->ops->mem_alloc(dev, 0, 0, &p), OI_ERR_INVALID_ARGUMENT);
}

typedef struct order_log {
  pthread_mutex_t lock;
  int calls[8];
  int n;
  const uint8_t *watch;
  uint8_t seen_at_call;
} order_log;

typedef struct call_arg {
  order_log *log;
  int id;
} call_arg;

static void record_call(void *p, oi_status st) {
  call_arg *a = p;
  pthread_mutex_lock(&a->log->lock);
  if (st == OI_OK) a->log->calls[a->log->n++] = a->id;
  if (a->id == 1) a->log->seen_at_call = a->log->watch[0];
  pthread_mutex_unlock(&a->log->lock);
}

static void test_stream_copies_pieces_both_ways_and_calls_in_order(void) {
  enum { BLOCKS = 64, PIECE = 4096 + 13 };
  void *arena = NULL;
  oi_pinned pool;
  oi_stream *s = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, 2 * BLOCKS * PIECE, 0, &arena) == OI_OK);
  REQUIRE(dev->ops->pinned_alloc(dev, BLOCKS * PIECE, 0, -1, &pool) == OI_OK);
  REQUIRE(pool.bytes >= BLOCKS * PIECE && pool.host && pool.device == pool.host);
  REQUIRE(dev->ops->stream_create(dev, 1, &s) == OI_OK);
  CHECK_OK(dev->ops->mem_fill_pattern(dev, arena, BLOCKS * PIECE, 5));

  /* D2H: device block b -> host slot (BLOCKS-1-b) (reversed, so a shifted copy fails). */
  oi_copy_desc d[BLOCKS];
  uint8_t *a = arena, *h = pool.host;
  for (int b = 0; b < BLOCKS; b++)
    d[b] = (oi_copy_desc){(uintptr_t)(a + b * PIECE), (uintptr_t)(h + (BLOCKS - 1 - b) * PIECE),
                          PIECE};
  order_log log = {.lock = PTHREAD_MUTEX_INITIALIZER, .watch = h + (BLOCKS - 1) * PIECE};
  call_arg c1 = {&log, 1}, c2 = {&log, 2};
  CHECK_OK(dev->ops->stream_copy(s, OI_COPY_D2H, d, BLOCKS, NULL));
  memset(d, 0xEE, sizeof d); /* the stream copied the descriptors */
  CHECK_OK(dev->ops->stream_call(s, record_call, &c1));
  /* H2D: host slot k -> device block BLOCKS + k. */
  for (int k = 0; k < BLOCKS; k++)
    d[k] = (oi_copy_desc){(uintptr_t)(h + k * PIECE), (uintptr_t)(a + (BLOCKS + k) * PIECE), PIECE};
  CHECK_OK(dev->ops->stream_copy(s, OI_COPY_H2D, d, BLOCKS, NULL));
  CHECK_OK(dev->ops->stream_call(s, record_call, &c2));
  CHECK_OK(dev->ops->stream_sync(s));

  CHECK(log.n == 2 && log.calls[0] == 1 && log.calls[1] == 2);
  CHECK(log.seen_at_call == oi__pattern_byte(5, 0)); /* call 1 ran after the D2H landed */
  for (int b = 0; b < BLOCKS; b++) {
    CHECK(is_pattern(h + (BLOCKS - 1 - b) * PIECE, PIECE, 5, (uint64_t)b * PIECE));
    CHECK(is_pattern(a + (BLOCKS + (BLOCKS - 1 - b)) * PIECE, PIECE, 5, (uint64_t)b * PIECE));
  }
  dev->ops->stream_destroy(s);
  dev->ops->pinned_free(dev, &pool);
  CHECK(pool.host == NULL);
  dev->ops->mem_free(dev, arena);
}

static void test_stream_destroy_finishes_queued_work(void) {
  enum { N = 256, PIECE = 1 << 16 };
  void *src = NULL, *dst = NULL;
  oi_stream *s = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, N * PIECE, 0, &src) == OI_OK);
  REQUIRE(dev->ops->mem_alloc(dev, N * PIECE, 0, &dst) == OI_OK);
  REQUIRE(dev->ops->stream_create(dev, 0, &s) == OI_OK);
  CHECK_OK(dev->ops->mem_fill_pattern(dev, src, N * PIECE, 77));
  for (int i = 0; i < N; i++) {
    oi_copy_desc d = {(uintptr_t)src + (uintptr_t)i * PIECE, (uintptr_t)dst + (uintptr_t)i * PIECE,
                      PIECE};
    CHECK_OK(dev->ops->stream_copy(s, OI_COPY_D2H, &d, 1, NULL));
  }
  dev->ops->stream_destroy(s);
  CHECK(memcmp(src, dst, (size_t)N * PIECE) == 0);
  dev->ops->mem_free(dev, src);
  dev->ops->mem_free(dev, dst);
}

static void test_arena_export_import_across_processes(void) {
  const size_t size = (8 << 20) + 123;
  void *arena = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, size, OI_MEM_SHAREABLE, &arena) == OI_OK);
  CHECK_OK(dev->ops->mem_fill_pattern(dev, arena, size, 11));
  oi_arena_handle h;
  CHECK_OK(dev->ops->mem_export(dev, arena, &h));

  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    oi_imported_arena *imp = NULL;
    if (oi_imported_arena_open(&h, size + 1, OI_DEVICE_CPU, &imp) != OI_ERR_PROTOCOL) _exit(10);
    if (imp) _exit(11);
    if (oi_imported_arena_open(&h, size, OI_DEVICE_CPU, &imp) != OI_OK) _exit(12);
    if (oi_imported_arena_size(imp) != size) _exit(13);
    uint8_t *p = oi_imported_arena_ptr(imp);
    if (!is_pattern(p, size, 11, 0)) _exit(14);
    for (size_t i = 0; i < 4096; i++)
      p[i] = oi__pattern_byte(12, i); /* visible to the owner */
    oi_imported_arena_close(imp);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (WIFEXITED(status) && WEXITSTATUS(status))
    fprintf(stderr, "child step %d failed\n", WEXITSTATUS(status));
  CHECK(is_pattern(arena, 4096, 12, 0));
  CHECK(is_pattern((uint8_t *)arena + 4096, size - 4096, 11, 4096));

  /* A handle with a corrupted magic is refused; a freed arena is gone. */
  oi_arena_handle bad = h;
  bad.bytes[0] ^= 0xff;
  oi_imported_arena *imp = NULL;
  CHECK_ST(oi_imported_arena_open(&bad, size, OI_DEVICE_CPU, &imp), OI_ERR_INVALID_ARGUMENT);
  CHECK(strlen(oi_last_error()) > 0);
  dev->ops->mem_free(dev, arena);
  CHECK_ST(oi_imported_arena_open(&h, size, OI_DEVICE_CPU, &imp), OI_ERR_NOT_FOUND);
  CHECK(imp == NULL);
  CHECK_ST(oi_imported_arena_open(NULL, size, OI_DEVICE_CPU, &imp), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_imported_arena_open(&h, 0, OI_DEVICE_CPU, &imp), OI_ERR_INVALID_ARGUMENT);
  oi_imported_arena_close(NULL);
}

static void test_export_needs_a_shareable_allocation(void) {
  void *p = NULL;
  REQUIRE(dev->ops->mem_alloc(dev, 4096, 0, &p) == OI_OK);
  oi_arena_handle h;
  CHECK_ST(dev->ops->mem_export(dev, p, &h), OI_ERR_INVALID_ARGUMENT);
  dev->ops->mem_free(dev, p);
}

static void test_missing_hugepages_say_how_many_are_needed(void) {
  FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
  unsigned long free_pages = 0;
  if (f) {
    if (fscanf(f, "%lu", &free_pages) != 1) free_pages = 0;
    fclose(f);
  }
  if (free_pages >= 64) return; /* the machine has them: nothing to prove here */
  oi_pinned pool;
  CHECK_ST(dev->ops->pinned_alloc(dev, 128ull << 20, OI_PIN_HUGEPAGES, -1, &pool),
           OI_ERR_OUT_OF_MEMORY);
  CHECK(strstr(oi_last_error(), "64 hugepages") != NULL);
  CHECK(strstr(oi_last_error(), "free") != NULL);
}

int main(void) {
  REQUIRE(oi__dev_open(OI_DEVICE_CPU, &dev) == OI_OK);
  CHECK(strcmp(dev->ops->name, "cpu") == 0);
  RUN_TEST(test_device_memory_is_zeroed_and_fillable);
  RUN_TEST(test_stream_copies_pieces_both_ways_and_calls_in_order);
  RUN_TEST(test_stream_destroy_finishes_queued_work);
  RUN_TEST(test_arena_export_import_across_processes);
  RUN_TEST(test_export_needs_a_shareable_allocation);
  RUN_TEST(test_missing_hugepages_say_how_many_are_needed);
  oi__dev_close(dev);
  TEST_EXIT();
}
