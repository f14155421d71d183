/* The cpu device backend's bad inputs and failures: allocations it cannot
 * make, pointers it does not own, handles and arena fds it must refuse,
 * device events it does not have, the leaks it frees at close, and shared
 * memory a dead process left. Each
 * case checks the status and that nothing changed or leaked. */
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "device/device.h"
#include "openinfer/device.h"
#include "testutil.h"

static oi_dev *open_cpu(void) {
  oi_dev *d = NULL;
  REQUIRE(oi__dev_open(OI_DEVICE_CPU, &d) == OI_OK && d);
  return d;
}

/* Allocations: bad sizes, sizes no mapping can hold, pointers not owned. */
static void test_alloc_refusals(void) {
  oi_dev *d = open_cpu();
  void *p = (void *)1;
  CHECK_ST(d->ops->mem_alloc(d, 0, 0, &p), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "bytes is 0"));
  CHECK_ST(d->ops->mem_alloc(d, 64, 0, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "out is NULL"));
  /* More than an address space holds: mmap refuses, nothing is kept. */
  p = NULL;
  CHECK_ST(d->ops->mem_alloc(d, SIZE_MAX / 2, 0, &p), OI_ERR_OUT_OF_MEMORY);
  CHECK(strstr(oi_last_error(), "mmap"));
  CHECK(p == NULL);
  /* Shareable: the shared-memory file cannot be that large (ftruncate) or
   * cannot be mapped (mmap); either way it is refused and unlinked. */
  CHECK_ST(d->ops->mem_alloc(d, SIZE_MAX / 2, OI_MEM_SHAREABLE, &p), OI_ERR_OUT_OF_MEMORY);
  CHECK(p == NULL);

  /* A pointer the device did not allocate: logged, nothing freed. */
  char local[16] = "untouched";
  d->ops->mem_free(d, local);
  d->ops->mem_free(d, NULL);
  CHECK(strcmp(local, "untouched") == 0);

  /* Copies and fills with NULL pointers (0 bytes is a no-op). */
  CHECK_ST(d->ops->mem_copy(d, NULL, local, 4), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(d->ops->mem_copy(d, local, NULL, 4), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(d->ops->mem_copy(d, NULL, NULL, 0));
  CHECK_ST(d->ops->mem_fill_pattern(d, NULL, 4, 1), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(d->ops->mem_fill_pattern(d, NULL, 0, 1));
  CHECK(strcmp(local, "untouched") == 0);

  /* Export: only a shareable allocation of this device has a handle. */
  oi_arena_handle h;
  memset(&h, 0xab, sizeof h);
  CHECK_ST(d->ops->mem_export(d, local, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(d->ops->mem_export(d, local, &h), OI_ERR_INVALID_ARGUMENT);
  void *priv = NULL;
  REQUIRE(d->ops->mem_alloc(d, 4096, 0, &priv) == OI_OK);
  CHECK_ST(d->ops->mem_export(d, priv, &h), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "not a shareable allocation"));
  CHECK(h.bytes[0] == 0xab); /* left as it was */
  /* A range export is cuda's: the cpu backend refuses it. */
  uint64_t off = 7;
  CHECK_ST(d->ops->mem_export_range(d, priv, 4096, &h, &off), OI_ERR_INVALID_ARGUMENT);
  CHECK(off == 7);
  d->ops->mem_free(d, priv);
  oi__dev_close(d);
}

/* Imports: a malformed name in an otherwise cpu handle, a name that does
 * not exist, and the public wrapper's argument checks. */
static void test_import_refusals(void) {
  oi_dev *d = open_cpu();
  void *shared = NULL;
  REQUIRE(d->ops->mem_alloc(d, 8192, OI_MEM_SHAREABLE, &shared) == OI_OK);
  oi_arena_handle good;
  REQUIRE(d->ops->mem_export(d, shared, &good) == OI_OK);

  /* The name field starts at the first '/' of the handle. */
  size_t name_off = 0;
  for (size_t i = 16; i < sizeof good.bytes; i++)
    if (good.bytes[i] == '/') {
      name_off = i;
      break;
    }
  REQUIRE(name_off);
  void *p = NULL;
  uint64_t size = 0;
  oi_arena_handle h = good;
  h.bytes[name_off] = 'x'; /* not absolute */
  CHECK_ST(d->ops->mem_import(d, &h, 8192, &p, &size), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "malformed"));
  h = good;
  h.bytes[name_off + 3] = '/'; /* a second '/' */
  CHECK_ST(d->ops->mem_import(d, &h, 8192, &p, &size), OI_ERR_INVALID_ARGUMENT);
  CHECK(p == NULL && size == 0);

  /* Well formed, but gone once the owner frees it. */
  d->ops->mem_free(d, shared);
  CHECK_ST(d->ops->mem_import(d, &good, 8192, &p, &size), OI_ERR_NOT_FOUND);
  CHECK(p == NULL);

  oi_imported_arena *a = (oi_imported_arena *)1;
  CHECK_ST(oi_imported_arena_open(&good, 8192, OI_DEVICE_CPU, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_imported_arena_open(NULL, 8192, OI_DEVICE_CPU, &a), OI_ERR_INVALID_ARGUMENT);
  CHECK(a == NULL);
  CHECK_ST(oi_imported_arena_open(&good, 0, OI_DEVICE_CPU, &a), OI_ERR_INVALID_ARGUMENT);
  CHECK(oi_imported_arena_ptr(NULL) == NULL);
  CHECK(oi_imported_arena_size(NULL) == 0);
  oi_imported_arena_close(NULL);
  oi__dev_close(d);
}

/* Engine-owned arenas (memfds): every fd the server must not map. */
static void test_fd_arena_refusals(void) {
  void *p = (void *)1;
  uint64_t mapped = 1;
  CHECK_ST(oi__fd_arena_check(-1, 4096, "t"), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "no arena file descriptor"));
  /* A closed descriptor: fstat fails. */
  int fd = memfd_create("oi-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  int closed = dup(fd);
  REQUIRE(closed >= 0);
  close(closed);
  CHECK_ST(oi__fd_arena_check(closed, 4096, "t"), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi__fd_arena_check_mapping(closed, NULL, 4096, "t"), OI_ERR_INVALID_ARGUMENT);
  /* Not a regular file: a pipe. */
  int pp[2];
  REQUIRE(pipe(pp) == 0);
  CHECK_ST(oi__fd_arena_check(pp[0], 4096, "t"), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "not a memfd"));
  close(pp[0]);
  close(pp[1]);
  /* A regular file of a disk file system (no seals at all: F_GET_SEALS
   * fails). */
  char file_tmpl[] = "/var/tmp/oi-test-arena-XXXXXX";
  int file = mkstemp(file_tmpl);
  if (file >= 0) {
    unlink(file_tmpl);
    REQUIRE(ftruncate(file, 4096) == 0);
    if (fcntl(file, F_GET_SEALS) < 0) {
      CHECK_ST(oi__fd_arena_check(file, 4096, "t"), OI_ERR_INVALID_ARGUMENT);
      CHECK(strstr(oi_last_error(), "not a memfd that accepts seals"));
    }
    close(file);
  }
  /* A memfd that takes no seals. */
  int plain = memfd_create("oi-test-plain", MFD_CLOEXEC);
  REQUIRE(plain >= 0 && ftruncate(plain, 4096) == 0);
  CHECK_ST(oi__fd_arena_check(plain, 4096, "t"), OI_ERR_INVALID_ARGUMENT);
  close(plain);
  /* Sealing allowed but not sealed against shrinking. */
  REQUIRE(ftruncate(fd, 8192) == 0);
  CHECK_ST(oi__fd_arena_check(fd, 4096, "t"), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "F_SEAL_SHRINK"));
  /* Sealed against shrinking: accepted up to its size, refused beyond. */
  REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  CHECK_OK(oi__fd_arena_check(fd, 8192, "t"));
  CHECK_ST(oi__fd_arena_check(fd, 8193, "t"), OI_ERR_INVALID_ARGUMENT);
  /* Map: a size of 0, then a good map whose bytes the fd holds. */
  CHECK_ST(oi__fd_arena_map(fd, 0, &p, &mapped, "t"), OI_ERR_INVALID_ARGUMENT);
  CHECK(p == NULL && mapped == 0);
  REQUIRE(oi__fd_arena_map(fd, 8192, &p, &mapped, "t") == OI_OK && mapped == 8192);
  memset(p, 0x5a, 8192);
  unsigned char back = 0;
  CHECK(pread(fd, &back, 1, 8191) == 1 && back == 0x5a);
  CHECK_OK(oi__fd_arena_check_mapping(fd, p, 8192, "t"));
  /* A private copy of the same bytes is not the engine's mapping. */
  void *priv = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  REQUIRE(priv != MAP_FAILED);
  CHECK_ST(oi__fd_arena_check_mapping(fd, priv, 8192, "t"), OI_ERR_INVALID_ARGUMENT);
  munmap(priv, 8192);
  /* Nor is a read-only shared mapping, one from offset 4096, a range past
   * the mapping's end, or a shared mapping of another memfd. */
  void *ro_map = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(ro_map != MAP_FAILED);
  CHECK_ST(oi__fd_arena_check_mapping(fd, ro_map, 8192, "t"), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "is not a read-write MAP_SHARED mapping of arena_fd"));
  munmap(ro_map, 8192);
  void *off_map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4096);
  REQUIRE(off_map != MAP_FAILED);
  CHECK_ST(oi__fd_arena_check_mapping(fd, off_map, 4096, "t"), OI_ERR_INVALID_ARGUMENT);
  munmap(off_map, 4096);
  CHECK_ST(oi__fd_arena_check_mapping(fd, p, 3 * 8192, "t"), OI_ERR_INVALID_ARGUMENT);
  int other = memfd_create("oi-test-other", MFD_CLOEXEC);
  REQUIRE(other >= 0 && ftruncate(other, 8192) == 0);
  void *other_map = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, other, 0);
  REQUIRE(other_map != MAP_FAILED);
  CHECK_ST(oi__fd_arena_check_mapping(fd, other_map, 8192, "t"), OI_ERR_INVALID_ARGUMENT);
  munmap(other_map, 8192);
  close(other);
  CHECK_OK(oi__fd_arena_check_mapping(fd, p, 8192, "t")); /* the good one still passes */
  oi__fd_arena_unmap(p, mapped);
  oi__fd_arena_unmap(NULL, 0);
  /* Sealed against writes: the server could not write KV into it. */
  REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0);
  CHECK_ST(oi__fd_arena_check(fd, 4096, "t"), OI_ERR_PERMISSION);
  CHECK_ST(oi__fd_arena_map(fd, 4096, &p, &mapped, "t"), OI_ERR_PERMISSION);
  CHECK(p == NULL);
  close(fd);
  /* Opened read-only: the check passes (a memfd, sealed, large enough) but
   * a read-write shared mapping is refused. */
  int rw = memfd_create("oi-test-ro", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(rw >= 0 && ftruncate(rw, 4096) == 0 && fcntl(rw, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", rw);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  REQUIRE(ro >= 0);
  CHECK_ST(oi__fd_arena_map(ro, 4096, &p, &mapped, "t"), OI_ERR_PERMISSION);
  CHECK(p == NULL && mapped == 0);
  close(ro);
  close(rw);
}

static void note_call(void *arg, oi_status st) { *(oi_status *)arg = st; }

/* Pinned memory and streams: bad arguments and the events cpu lacks. */
static void test_streams_and_pinned(void) {
  oi_dev *d = open_cpu();
  oi_pinned pin;
  memset(&pin, 0, sizeof pin);
  CHECK_ST(d->ops->pinned_alloc(d, 0, OI_PIN_NO_PIN, -1, &pin), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(d->ops->pinned_alloc(d, 4096, OI_PIN_NO_PIN, -1, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK(pin.host == NULL);
  d->ops->pinned_free(d, NULL);
  /* Bound to NUMA node 0 (best effort: where the kernel refuses mbind the
   * pool is left unbound, with a warning); either way the memory works. */
  CHECK_OK(d->ops->pinned_alloc(d, 1 << 20, OI_PIN_NO_PIN, 0, &pin));
  REQUIRE(pin.host && pin.bytes >= (1 << 20));
  memset(pin.host, 0x6b, 1 << 20);
  CHECK(((uint8_t *)pin.host)[(1 << 20) - 1] == 0x6b);
  d->ops->pinned_free(d, &pin);
  CHECK(pin.host == NULL);

  oi_stream *s = NULL;
  REQUIRE(d->ops->stream_create(d, 0, &s) == OI_OK);
  CHECK_OK(d->ops->stream_copy(s, OI_COPY_H2D, NULL, 0, NULL)); /* nothing to do */
  CHECK_ST(d->ops->stream_copy(s, OI_COPY_H2D, NULL, 1, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(d->ops->stream_call(s, NULL, NULL), OI_ERR_INVALID_ARGUMENT);
  /* No device events on cpu: waiting on one is refused, none is a no-op. */
  int fake_event;
  CHECK_ST(d->ops->stream_wait_event(s, &fake_event), OI_ERR_UNSUPPORTED);
  CHECK(strstr(oi_last_error(), "no device events"));
  CHECK_OK(d->ops->stream_wait_event(s, NULL));
  void *ev = &fake_event;
  CHECK_OK(d->ops->stream_record_event(s, &ev));
  CHECK(ev == NULL);
  d->ops->event_destroy(ev);
  CHECK_OK(d->ops->event_query(ev));
  /* The stream still works after the refusals: a copy, then a callback. */
  char src[64], dst[64];
  memset(src, 0x3c, sizeof src);
  memset(dst, 0, sizeof dst);
  oi_copy_desc desc = {.src = (uintptr_t)src, .dst = (uintptr_t)dst, .bytes = sizeof src};
  oi_status seen = OI_PENDING;
  CHECK_OK(d->ops->stream_copy(s, OI_COPY_H2D, &desc, 1, NULL));
  CHECK_OK(d->ops->stream_call(s, note_call, &seen));
  CHECK_OK(d->ops->stream_sync(s));
  CHECK(seen == OI_OK);
  CHECK(memcmp(src, dst, sizeof src) == 0);
  d->ops->stream_destroy(s);
  d->ops->stream_destroy(NULL);
  oi__dev_close(d);
}

/* Close frees what the caller leaked, shared memory included (its name
 * no longer imports). */
static void test_close_frees_leaks(void) {
  oi_dev *d = open_cpu();
  void *a = NULL, *b = NULL;
  REQUIRE(d->ops->mem_alloc(d, 4096, 0, &a) == OI_OK);
  REQUIRE(d->ops->mem_alloc(d, 4096, OI_MEM_SHAREABLE, &b) == OI_OK);
  oi_arena_handle h;
  REQUIRE(d->ops->mem_export(d, b, &h) == OI_OK);
  oi__dev_close(d);
  oi_imported_arena *imp = NULL;
  CHECK_ST(oi_imported_arena_open(&h, 4096, OI_DEVICE_CPU, &imp), OI_ERR_NOT_FOUND);
  CHECK(imp == NULL);
}

/* The experimental device buffers: bad arguments, a device that is not
 * there, and a round trip. */
static void test_device_buffers(void) {
  oi_device_buffer *b = (oi_device_buffer *)1;
  CHECK_ST(oi_device_buffer_alloc(OI_DEVICE_CPU, 64, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_device_buffer_alloc(OI_DEVICE_CPU, 0, &b), OI_ERR_INVALID_ARGUMENT);
  CHECK(b == NULL);
  int count = 0;
  CHECK_OK(oi_device_count(&count));
  CHECK(oi_device_buffer_alloc(count + 3, 64, &b) != OI_OK); /* no such device */
  CHECK(b == NULL);
  REQUIRE(oi_device_buffer_alloc(OI_DEVICE_CPU, 64, &b) == OI_OK);
  char in[64], out[64];
  memset(in, 0x71, sizeof in);
  CHECK_ST(oi_device_buffer_copy(NULL, oi_device_buffer_ptr(b), in, 64), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_device_buffer_copy(b, NULL, in, 64), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_device_buffer_copy(b, out, NULL, 64), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi_device_buffer_copy(b, oi_device_buffer_ptr(b), in, 64));
  CHECK_OK(oi_device_buffer_copy(b, out, oi_device_buffer_ptr(b), 64));
  CHECK(memcmp(in, out, 64) == 0);
  CHECK(oi_device_buffer_ptr(NULL) == NULL);
  oi_device_buffer_free(b);
  oi_device_buffer_free(NULL);
}

/* Shared memory a dead process left (a server reaps a client's): removed
 * by that process's id only. */
static void test_orphan_arenas_removed(void) {
  CHECK(oi__cpu_remove_orphan_arenas(0) == 0);
  CHECK(oi__cpu_remove_orphan_arenas(-5) == 0);
  oi_dev *d = open_cpu();
  void *mine = NULL;
  REQUIRE(d->ops->mem_alloc(d, 4096, OI_MEM_SHAREABLE, &mine) == OI_OK);
  oi_arena_handle own;
  REQUIRE(d->ops->mem_export(d, mine, &own) == OI_OK);
  CHECK(oi__cpu_remove_orphan_arenas((int)getpid()) == 0); /* never this process's own */
  int pp[2];
  REQUIRE(pipe(pp) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) { /* two shared arenas, left behind */
    oi_dev *cd = NULL;
    void *a = NULL, *b = NULL;
    oi_arena_handle h[2];
    if (oi__dev_open(OI_DEVICE_CPU, &cd) != OI_OK ||
        cd->ops->mem_alloc(cd, 4096, OI_MEM_SHAREABLE, &a) != OI_OK ||
        cd->ops->mem_alloc(cd, 8192, OI_MEM_SHAREABLE, &b) != OI_OK ||
        cd->ops->mem_export(cd, a, &h[0]) != OI_OK || cd->ops->mem_export(cd, b, &h[1]) != OI_OK)
      _exit(2);
    _exit(write(pp[1], h, sizeof h) == (ssize_t)sizeof h ? 0 : 3);
  }
  close(pp[1]);
  oi_arena_handle left[2];
  CHECK(read(pp[0], left, sizeof left) == (ssize_t)sizeof left);
  close(pp[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  oi_imported_arena *imp = NULL;
  CHECK_OK(oi_imported_arena_open(&left[1], 8192, OI_DEVICE_CPU, &imp)); /* still there */
  oi_imported_arena_close(imp);
  CHECK(oi__cpu_remove_orphan_arenas((int)pid) == 2);
  imp = NULL;
  CHECK_ST(oi_imported_arena_open(&left[0], 4096, OI_DEVICE_CPU, &imp), OI_ERR_NOT_FOUND);
  CHECK_ST(oi_imported_arena_open(&left[1], 8192, OI_DEVICE_CPU, &imp), OI_ERR_NOT_FOUND);
  CHECK(oi__cpu_remove_orphan_arenas((int)pid) == 0);
  /* This process's own arena was not touched. */
  CHECK_OK(oi_imported_arena_open(&own, 4096, OI_DEVICE_CPU, &imp));
  oi_imported_arena_close(imp);
  d->ops->mem_free(d, mine);
  oi__dev_close(d);
}

int main(void) {
  RUN_TEST(test_alloc_refusals);
  RUN_TEST(test_import_refusals);
  RUN_TEST(test_fd_arena_refusals);
  RUN_TEST(test_streams_and_pinned);
  RUN_TEST(test_close_frees_leaks);
  RUN_TEST(test_device_buffers);
  RUN_TEST(test_orphan_arenas_removed);
  TEST_EXIT();
}
