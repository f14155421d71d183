/* The struct_size pattern: oi__struct_in / oi__struct_out, their floors
 * (oi__struct_in_min / oi__struct_out_min and the public structs reordered
 * in 0.1), and oi_device_get_info with older and current callers. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/core.h"
#include "openinfer/openinfer.h"
#include "testutil.h"

/* The library's current struct ... */
struct opts_v2 {
  uint32_t struct_size;
  uint32_t a;
  uint64_t b;
  uint64_t c_new;
};
/* ... an older caller's ... */
struct opts_v1 {
  uint32_t struct_size;
  uint32_t a;
  uint64_t b;
};
/* ... and a newer caller's. */
struct opts_v3 {
  uint32_t struct_size;
  uint32_t a;
  uint64_t b;
  uint64_t c_new;
  uint64_t d_newer;
};

#define GUARD 0xAB

static struct opts_v2 defaults(void) {
  struct opts_v2 d = {.struct_size = sizeof(struct opts_v2), .a = 1, .b = 2, .c_new = 777};
  return d;
}

static int all_bytes_are(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return 0;
  return 1;
}

/* ---- oi__struct_in ------------------------------------------------------- */

static void older_caller_keeps_defaults_for_new_fields(void) {
  struct opts_v2 dst = defaults();
  struct opts_v1 src = {.struct_size = sizeof src, .a = 10, .b = 20};
  CHECK_OK(oi__struct_in(&dst, sizeof dst, &src, "opts"));
  CHECK(dst.a == 10);
  CHECK(dst.b == 20);
  CHECK(dst.c_new == 777);
}

static void older_caller_struct_is_not_read_past_its_size(void) {
  /* Put the v1 struct at the very end of a page followed by an inaccessible
   * page: reading one byte more than struct_size would crash. */
  long page = sysconf(_SC_PAGESIZE);
  REQUIRE(page > 0);
  unsigned char *map =
      mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  REQUIRE(mprotect(map + page, (size_t)page, PROT_NONE) == 0);
  struct opts_v1 *src = (struct opts_v1 *)(void *)(map + page - sizeof(struct opts_v1));
  src->struct_size = sizeof *src;
  src->a = 11;
  src->b = 22;
  struct opts_v2 dst = defaults();
  CHECK_OK(oi__struct_in(&dst, sizeof dst, src, "opts"));
  CHECK(dst.a == 11 && dst.b == 22 && dst.c_new == 777);

  /* Smallest legal caller: only struct_size itself, at the end of the page. */
  uint32_t *tiny = (uint32_t *)(void *)(map + page - sizeof(uint32_t));
  *tiny = OI_STRUCT_MIN_SIZE;
  dst = defaults();
  CHECK_OK(oi__struct_in(&dst, sizeof dst, tiny, "opts"));
  CHECK(dst.a == 1 && dst.b == 2 && dst.c_new == 777);
  munmap(map, (size_t)page * 2);
}

static void same_size_caller_copies_everything(void) {
  struct opts_v2 dst = defaults();
  struct opts_v2 src = {.struct_size = sizeof src, .a = 3, .b = 4, .c_new = 5};
  CHECK_OK(oi__struct_in(&dst, sizeof dst, &src, "opts"));
  CHECK(dst.a == 3 && dst.b == 4 && dst.c_new == 5);
}

static void newer_caller_with_zero_tail_is_accepted(void) {
  struct opts_v2 dst = defaults();
  struct opts_v3 src = {.struct_size = sizeof src, .a = 7, .b = 8, .c_new = 9, .d_newer = 0};
  CHECK_OK(oi__struct_in(&dst, sizeof dst, &src, "opts"));
  CHECK(dst.a == 7 && dst.b == 8 && dst.c_new == 9);
}

static void newer_caller_with_nonzero_tail_is_unsupported(void) {
  struct opts_v2 dst = defaults();
  struct opts_v3 src = {.struct_size = sizeof src, .a = 7, .b = 8, .c_new = 9, .d_newer = 1};
  oi_clear_error();
  CHECK_ST(oi__struct_in(&dst, sizeof dst, &src, "opts"), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), "opts") != NULL); /* `what` names the struct */
  /* A refused struct is not half applied. */
  CHECK(dst.a == 1 && dst.b == 2 && dst.c_new == 777);

  /* Only the last tail byte set. */
  src.d_newer = (uint64_t)1 << 63;
  CHECK_ST(oi__struct_in(&dst, sizeof dst, &src, "opts"), OI_ERR_UNSUPPORTED);
  oi_clear_error();
}

static void bad_struct_size_or_null_is_invalid(void) {
  struct opts_v2 dst = defaults();
  struct opts_v1 src = {.struct_size = 0, .a = 10, .b = 20};
  CHECK_ST(oi__struct_in(&dst, sizeof dst, &src, "opts"), OI_ERR_INVALID_ARGUMENT);
  src.struct_size = OI_STRUCT_MIN_SIZE - 1;
  CHECK_ST(oi__struct_in(&dst, sizeof dst, &src, "opts"), OI_ERR_INVALID_ARGUMENT);
  CHECK(dst.a == 1 && dst.b == 2 && dst.c_new == 777);
  CHECK_ST(oi__struct_in(&dst, sizeof dst, NULL, "opts"), OI_ERR_INVALID_ARGUMENT);
  CHECK(dst.a == 1 && dst.b == 2 && dst.c_new == 777);
  oi_clear_error();
}

/* ---- oi__struct_out ------------------------------------------------------ */

static void output_to_older_caller_stays_within_its_size(void) {
  _Alignas(8) unsigned char buf[sizeof(struct opts_v1) + 64];
  memset(buf, GUARD, sizeof buf);
  struct opts_v1 caller = {.struct_size = sizeof caller, .a = 0, .b = 0};
  memcpy(buf, &caller, sizeof caller);

  struct opts_v2 lib = {.struct_size = sizeof lib, .a = 41, .b = 42, .c_new = 43};
  CHECK_OK(oi__struct_out(buf, &lib, sizeof lib, "opts"));
  memcpy(&caller, buf, sizeof caller);
  CHECK(caller.struct_size == sizeof(struct opts_v1)); /* the caller's size is kept */
  CHECK(caller.a == 41);
  CHECK(caller.b == 42);
  CHECK(all_bytes_are(buf + sizeof caller, sizeof buf - sizeof caller, GUARD));
}

static void output_to_newer_caller_leaves_unknown_fields_alone(void) {
  struct opts_v3 caller;
  memset(&caller, GUARD, sizeof caller);
  caller.struct_size = sizeof caller;
  struct opts_v2 lib = {.struct_size = sizeof lib, .a = 41, .b = 42, .c_new = 43};
  CHECK_OK(oi__struct_out(&caller, &lib, sizeof lib, "opts"));
  CHECK(caller.struct_size == sizeof(struct opts_v3));
  CHECK(caller.a == 41 && caller.b == 42 && caller.c_new == 43);
  CHECK(all_bytes_are((const unsigned char *)&caller.d_newer, sizeof caller.d_newer, GUARD));
}

static void output_with_bad_struct_size_or_null_is_invalid(void) {
  _Alignas(8) unsigned char buf[64];
  memset(buf, GUARD, sizeof buf);
  uint32_t zero = 0;
  memcpy(buf, &zero, sizeof zero);
  struct opts_v2 lib = {.struct_size = sizeof lib, .a = 41, .b = 42, .c_new = 43};
  CHECK_ST(oi__struct_out(buf, &lib, sizeof lib, "opts"), OI_ERR_INVALID_ARGUMENT);
  CHECK(all_bytes_are(buf + sizeof zero, sizeof buf - sizeof zero, GUARD));
  uint32_t too_small = OI_STRUCT_MIN_SIZE - 1;
  memcpy(buf, &too_small, sizeof too_small);
  CHECK_ST(oi__struct_out(buf, &lib, sizeof lib, "opts"), OI_ERR_INVALID_ARGUMENT);
  CHECK(all_bytes_are(buf + sizeof too_small, sizeof buf - sizeof too_small, GUARD));
  CHECK_ST(oi__struct_out(NULL, &lib, sizeof lib, "opts"), OI_ERR_INVALID_ARGUMENT);

  /* struct_size == OI_STRUCT_MIN_SIZE: valid, nothing beyond it is written. */
  uint32_t min = OI_STRUCT_MIN_SIZE;
  memcpy(buf, &min, sizeof min);
  CHECK_OK(oi__struct_out(buf, &lib, sizeof lib, "opts"));
  CHECK(all_bytes_are(buf + sizeof min, sizeof buf - sizeof min, GUARD));
  oi_clear_error();
}

/* ---- public API: oi_device_get_info -------------------------------------- */

/* An older caller's oi_device_info: fields up to and including `name`. */
struct old_device_info {
  uint32_t struct_size;
  int32_t device;
  uint32_t backend;
  char name[96];
};

static void device_info_for_older_caller_writes_only_its_fields(void) {
  _Alignas(oi_device_info) unsigned char buf[sizeof(oi_device_info) + 64];
  memset(buf, GUARD, sizeof buf);
  struct old_device_info old;
  memset(&old, 0, sizeof old);
  old.struct_size = sizeof old;
  old.backend = 99;
  memcpy(buf, &old, sizeof old);

  CHECK_OK(oi_device_get_info(OI_DEVICE_CPU, (oi_device_info *)(void *)buf));
  memcpy(&old, buf, sizeof old);
  CHECK(old.struct_size == sizeof(struct old_device_info));
  CHECK(old.device == OI_DEVICE_CPU);
  CHECK(old.backend == OI_BACKEND_CPU);
  CHECK(memchr(old.name, '\0', sizeof old.name) != NULL);
  CHECK(strcmp(old.name, "cpu") == 0);
  CHECK(all_bytes_are(buf + sizeof old, sizeof buf - sizeof old, GUARD));
}

static void device_info_for_current_caller_is_complete(void) {
  oi_device_info info;
  memset(&info, GUARD, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(oi_device_get_info(OI_DEVICE_CPU, &info));
  CHECK(info.struct_size == sizeof(oi_device_info));
  CHECK(info.device == OI_DEVICE_CPU);
  CHECK(info.backend == OI_BACKEND_CPU);
  CHECK(strcmp(info.name, "cpu") == 0);
  CHECK(info.total_memory > 0);
  CHECK(info.multiprocessors > 0);
  CHECK(info.compute_capability == 0);
  CHECK(info.numa_node == -1);
  CHECK(memchr(info.pci_bus_id, '\0', sizeof info.pci_bus_id) != NULL);
  CHECK(strcmp(info.pci_bus_id, "") == 0);
}

static void device_info_rejects_bad_ordinals_and_arguments(void) {
  oi_device_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_ST(oi_device_get_info(-5, &info), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_device_get_info(OI_DEVICE_CPU, NULL), OI_ERR_INVALID_ARGUMENT);
  info.struct_size = 0;
  CHECK_ST(oi_device_get_info(OI_DEVICE_CPU, &info), OI_ERR_INVALID_ARGUMENT);
  info.struct_size = sizeof info;

  int count = -1;
  CHECK_OK(oi_device_count(&count));
  CHECK(count >= 0);
  if (count < 1000)
    CHECK_ST(oi_device_get_info(1000, &info), OI_ERR_NO_DEVICE);
  else
    fprintf(stderr, "  (%d devices: ordinal 1000 check skipped)\n", count);
  oi_clear_error();
}

/* ---- floors: the structs reordered in 0.1 --------------------------------- */

static void below_the_floor_is_refused_and_nothing_moves(void) {
  size_t floor = offsetof(struct opts_v2, c_new) + sizeof(uint64_t); /* the whole v2 */
  struct opts_v2 dst = defaults();
  struct opts_v1 src = {.struct_size = sizeof src, .a = 10, .b = 20};
  oi_clear_error();
  CHECK_ST(oi__struct_in_min(&dst, sizeof dst, &src, floor, "opts"), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "rebuild") != NULL);
  CHECK(dst.a == 1 && dst.b == 2 && dst.c_new == 777);
  /* At the floor and above (a newer caller's zero tail) it is accepted. */
  struct opts_v2 same = {.struct_size = sizeof same, .a = 3, .b = 4, .c_new = 5};
  CHECK_OK(oi__struct_in_min(&dst, sizeof dst, &same, floor, "opts"));
  CHECK(dst.a == 3 && dst.b == 4 && dst.c_new == 5);
  struct opts_v3 newer = {.struct_size = sizeof newer, .a = 6, .b = 7, .c_new = 8};
  CHECK_OK(oi__struct_in_min(&dst, sizeof dst, &newer, floor, "opts"));
  CHECK(dst.a == 6 && dst.c_new == 8);

  _Alignas(8) unsigned char buf[sizeof(struct opts_v2) + 16];
  memset(buf, GUARD, sizeof buf);
  uint32_t older = sizeof(struct opts_v1);
  memcpy(buf, &older, sizeof older);
  struct opts_v2 lib = {.struct_size = sizeof lib, .a = 41, .b = 42, .c_new = 43};
  CHECK_ST(oi__struct_out_min(buf, &lib, sizeof lib, floor, "opts"), OI_ERR_INVALID_ARGUMENT);
  CHECK(all_bytes_are(buf + sizeof(uint32_t), sizeof buf - sizeof(uint32_t), GUARD));
  uint32_t full = sizeof(struct opts_v2);
  memcpy(buf, &full, sizeof full);
  CHECK_OK(oi__struct_out_min(buf, &lib, sizeof lib, floor, "opts"));
  CHECK(all_bytes_are(buf + sizeof lib, sizeof buf - sizeof lib, GUARD));
  oi_clear_error();
}

/* The floors are the whole 0.1 layouts as they were fixed (the end of each
 * struct's last field then); fields appended since come after the cut. */
static void public_floors_are_the_whole_structs(void) {
  CHECK(OI_FLOOR_ENGINE_OPTIONS > offsetof(oi_engine_options, probe_interval_ms));
  CHECK(offsetof(oi_engine_options, codec) - OI_FLOOR_ENGINE_OPTIONS < 8); /* codec: appended */
  CHECK(sizeof(oi_save_options) - OI_FLOOR_SAVE_OPTIONS < 8);
  CHECK(offsetof(oi_query_result, where) - OI_FLOOR_QUERY_RESULT < 8); /* where: appended */
  CHECK(offsetof(oi_engine_stats, saves_not_encoded) == OI_FLOOR_ENGINE_STATS); /* appended */
  CHECK(sizeof(oi_lookup_options) - OI_FLOOR_LOOKUP_OPTIONS < 8);
  CHECK(offsetof(oi_host_stats, link_bytes_per_s) == OI_FLOOR_HOST_STATS); /* rates: appended */
  CHECK(sizeof(oi_server_options) - OI_FLOOR_SERVER_OPTIONS < 8);
  CHECK(offsetof(oi_executor_options, restore_plan) - OI_FLOOR_EXECUTOR_OPTIONS < 8); /* appended */
}

/* Through the public API: a lookup's options and a host's stats smaller than
 * their 0.1 layouts are refused; whole ones work. */
static void public_structs_below_the_floor_are_refused(void) {
  oi_host_options ho;
  CHECK_OK(oi_host_options_init(&ho));
  ho.pool_bytes = 4u << 20;
  ho.flags = OI_HOST_NO_PIN;
  oi_host *h = NULL;
  REQUIRE(oi_host_create(&ho, &h) == OI_OK);
  oi_lookup_options lo;
  CHECK_OK(oi_lookup_options_init(&lo));
  lo.namespace_id = "floors";
  oi_block_hash hash;
  memset(&hash, 7, sizeof hash);
  oi_query_result q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  CHECK_OK(oi_host_query(h, &lo, NULL, &hash, 1, 0, &q));
  CHECK(q.hit_blocks == 0);
  lo.struct_size = (uint32_t)offsetof(oi_lookup_options, lookup_deadline_ms);
  CHECK_ST(oi_host_query(h, &lo, NULL, &hash, 1, 0, &q), OI_ERR_INVALID_ARGUMENT);
  oi_host_stats hs;
  memset(&hs, 0, sizeof hs);
  hs.struct_size = (uint32_t)offsetof(oi_host_stats, save_latency_us);
  CHECK_ST(oi_host_get_stats(h, &hs), OI_ERR_INVALID_ARGUMENT);
  hs.struct_size = sizeof hs;
  CHECK_OK(oi_host_get_stats(h, &hs));
  CHECK(hs.capacity_bytes > 0);
  oi_host_destroy(h);
  oi_clear_error();
}

int main(void) {
  RUN_TEST(older_caller_keeps_defaults_for_new_fields);
  RUN_TEST(older_caller_struct_is_not_read_past_its_size);
  RUN_TEST(same_size_caller_copies_everything);
  RUN_TEST(newer_caller_with_zero_tail_is_accepted);
  RUN_TEST(newer_caller_with_nonzero_tail_is_unsupported);
  RUN_TEST(bad_struct_size_or_null_is_invalid);
  RUN_TEST(output_to_older_caller_stays_within_its_size);
  RUN_TEST(output_to_newer_caller_leaves_unknown_fields_alone);
  RUN_TEST(output_with_bad_struct_size_or_null_is_invalid);
  RUN_TEST(below_the_floor_is_refused_and_nothing_moves);
  RUN_TEST(public_floors_are_the_whole_structs);
  RUN_TEST(public_structs_below_the_floor_are_refused);
  RUN_TEST(device_info_for_older_caller_writes_only_its_fields);
  RUN_TEST(device_info_for_current_caller_is_complete);
  RUN_TEST(device_info_rejects_bad_ordinals_and_arguments);
  TEST_EXIT();
}
