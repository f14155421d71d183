/* Allocation through mimalloc, and the monotonic clock helpers. */
#include <mimalloc.h>
#include <stdint.h>
#include <time.h>

#include "core/core.h"
#include "testutil.h"

/* Under AddressSanitizer mimalloc cannot map its segments in its preferred
 * low address range (ASan's shadow memory lives there), so its segment map,
 * which mi_is_in_heap_region consults, does not cover them and that function
 * answers false for genuine mimalloc memory. mi_check_owned (a walk of the
 * calling thread's default heap) works in both builds, so ownership is checked
 * with it always and with mi_is_in_heap_region where that is meaningful. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* Builds with allocator=libc (sanitizer and fuzz builds, where ASan and TSan
 * must see the heap; -DOI_ALLOC_LIBC) use the C library's allocator: there
 * the checks say the memory is not mimalloc's. */
#ifdef OI_ALLOC_LIBC
#include <malloc.h>
#define CHECK_MIMALLOC_OWNS(p) CHECK(!mi_check_owned(p))
#define USABLE_SIZE(p) malloc_usable_size(p)
#else
#define CHECK_MIMALLOC_OWNS(p)                                                                     \
  do {                                                                                             \
    CHECK(mi_check_owned(p));                                                                      \
    if (!UNDER_ASAN) CHECK(mi_is_in_heap_region(p));                                               \
  } while (0)
#define USABLE_SIZE(p) mi_usable_size(p)
#endif

/* ---- allocation ----------------------------------------------------------- */

static void mimalloc_ownership_check_can_say_no(void) {
  /* Control for the tests below: memory mimalloc does not own is reported so. */
  int on_stack = 0;
  static int in_data;
  CHECK(!mi_is_in_heap_region(&on_stack));
  CHECK(!mi_is_in_heap_region(&in_data));
  CHECK(!mi_check_owned(&on_stack));
  CHECK(!mi_check_owned(&in_data));
}

static void malloc_returns_mimalloc_memory(void) {
  const size_t sizes[] = {1, 16, 1000, 1 << 20};
  for (size_t i = 0; i < OI_ARRAY_LEN(sizes); i++) {
    unsigned char *p = oi__malloc(sizes[i]);
    REQUIRE(p != NULL);
    CHECK_MIMALLOC_OWNS(p);
    CHECK(USABLE_SIZE(p) >= sizes[i]);
    memset(p, 0x5A, sizes[i]);
    oi__free(p);
  }
}

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

static void calloc_returns_zeroed_mimalloc_memory(void) {
  const size_t counts[] = {1, 100, 4096, 1 << 18};
  for (size_t i = 0; i < OI_ARRAY_LEN(counts); i++) {
    size_t bytes = counts[i] * 4;
    /* Dirty a block of the same size first so that calloc likely reuses it. */
    unsigned char *dirty = oi__malloc(bytes);
    REQUIRE(dirty != NULL);
    memset(dirty, 0xFF, bytes);
    oi__free(dirty);

    unsigned char *p = oi__calloc(counts[i], 4);
    REQUIRE(p != NULL);
    CHECK_MIMALLOC_OWNS(p);
    CHECK(all_zero(p, bytes));
    oi__free(p);
  }
}

/* Tables read at random: zeroed at every size, aligned to 2 MiB from 2 MiB
 * (their whole huge pages advised), freed with oi__free; memory dirtied and
 * freed comes back zeroed. */
static void calloc_table_is_zeroed_and_aligned_when_large(void) {
  const size_t sizes[] = {1, 4096, (2u << 20) - 8, 2u << 20, (3u << 20) + 24, 12u << 20};
  for (int round = 0; round < 2; round++)
    for (size_t i = 0; i < OI_ARRAY_LEN(sizes); i++) {
      unsigned char *p = oi__calloc_table(sizes[i]);
      REQUIRE(p != NULL);
      CHECK(all_zero(p, sizes[i]));
      if (sizes[i] >= (2u << 20)) CHECK(((uintptr_t)p & ((2u << 20) - 1)) == 0);
      CHECK(USABLE_SIZE(p) >= sizes[i]);
      memset(p, 0xA5, sizes[i]); /* the next round must get zeroes again */
      oi__free(p);
    }
}

static void calloc_overflow_fails(void) { CHECK(oi__calloc(SIZE_MAX / 2, 4) == NULL); }

static void aligned_alloc_is_aligned_mimalloc_memory(void) {
  const size_t aligns[] = {8, 64, 256, 4096, 65536};
  const size_t sizes[] = {1, 100, 4096, 12345};
  for (size_t a = 0; a < OI_ARRAY_LEN(aligns); a++) {
    for (size_t s = 0; s < OI_ARRAY_LEN(sizes); s++) {
      unsigned char *p = oi__aligned_alloc(aligns[a], sizes[s]);
      REQUIRE(p != NULL);
      CHECK_MIMALLOC_OWNS(p);
      CHECK(((uintptr_t)p % aligns[a]) == 0);
      CHECK(USABLE_SIZE(p) >= sizes[s]);
      memset(p, 0x33, sizes[s]);
      oi__free(p);
    }
  }
  /* The call the brief names: 4096-byte alignment. */
  void *p = oi__aligned_alloc(4096, 3 * 4096 + 1);
  REQUIRE(p != NULL);
  CHECK(((uintptr_t)p & 4095u) == 0);
  CHECK_MIMALLOC_OWNS(p);
  oi__free(p);
}

static void realloc_keeps_contents(void) {
  unsigned char *p = oi__malloc(64);
  REQUIRE(p != NULL);
  for (int i = 0; i < 64; i++)
    p[i] = (unsigned char)i;
  p = oi__realloc(p, 1 << 20);
  REQUIRE(p != NULL);
  CHECK_MIMALLOC_OWNS(p);
  int same = 1;
  for (int i = 0; i < 64; i++)
    same &= p[i] == (unsigned char)i;
  CHECK(same);
  oi__free(p);
}

static void strdup_copies_and_accepts_null(void) {
  char *s = oi__strdup("hello block");
  REQUIRE(s != NULL);
  CHECK(strcmp(s, "hello block") == 0);
  CHECK_MIMALLOC_OWNS(s);
  oi__free(s);
  CHECK(oi__strdup(NULL) == NULL);
}

static void free_accepts_null(void) {
  oi__free(NULL); /* must not crash */
  CHECK(1);
}

/* ---- clock ---------------------------------------------------------------- */

static uint64_t raw_monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void now_is_monotonic(void) {
  uint64_t prev = oi__now_ns();
  CHECK(prev > 0);
  int backwards = 0;
  for (int i = 0; i < 100000; i++) {
    uint64_t now = oi__now_ns();
    if (now < prev) backwards++;
    prev = now;
  }
  CHECK(backwards == 0);
}

static void now_is_the_monotonic_clock(void) {
  uint64_t before = raw_monotonic_ns();
  uint64_t now = oi__now_ns();
  uint64_t after = raw_monotonic_ns();
  CHECK(before <= now && now <= after);
}

static void now_advances_across_a_sleep(void) {
  uint64_t t0 = oi__now_ns();
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
  uint64_t t1 = oi__now_ns();
  CHECK(t1 - t0 >= 10ull * 1000000ull);
  CHECK(t1 - t0 < 10ull * 1000000000ull); /* and not absurdly far (unit sanity) */
}

static void deadline_is_now_plus_timeout(void) {
  CHECK(oi__deadline_ns(UINT32_MAX) == UINT64_MAX);

  uint64_t before = oi__now_ns();
  uint64_t d0 = oi__deadline_ns(0);
  uint64_t d1 = oi__deadline_ns(1000);
  uint64_t after = oi__now_ns();
  CHECK(before <= d0 && d0 <= after);
  CHECK(before + 1000000000ull <= d1 && d1 <= after + 1000000000ull);

  /* The largest finite timeout is still finite and in the future. */
  uint64_t big = oi__deadline_ns(UINT32_MAX - 1);
  CHECK(big != UINT64_MAX);
  CHECK(big >= before + (uint64_t)(UINT32_MAX - 1) * 1000000ull);
}

int main(void) {
  RUN_TEST(mimalloc_ownership_check_can_say_no);
  RUN_TEST(malloc_returns_mimalloc_memory);
  RUN_TEST(calloc_returns_zeroed_mimalloc_memory);
  RUN_TEST(calloc_table_is_zeroed_and_aligned_when_large);
  RUN_TEST(calloc_overflow_fails);
  RUN_TEST(aligned_alloc_is_aligned_mimalloc_memory);
  RUN_TEST(realloc_keeps_contents);
  RUN_TEST(strdup_copies_and_accepts_null);
  RUN_TEST(free_accepts_null);
  RUN_TEST(now_is_monotonic);
  RUN_TEST(now_is_the_monotonic_clock);
  RUN_TEST(now_advances_across_a_sleep);
  RUN_TEST(deadline_is_now_plus_timeout);
  TEST_EXIT();
}
