/* Helpers of the two-process sidecar tests: start a real `openinfer serve`
 * (the tools/openinfer executable, path in argv[1]) on a socket in a private
 * temporary directory, stop or kill it; a test layout with patterns that
 * depend on (logical block, arena, segment, byte); and a raw wire client
 * for what the public API never sends (bad input, Stats, Hello's epoch). */
#ifndef OI_SIDECAR_UTIL_H
#define OI_SIDECAR_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/wire.h"
#include "rig.h"
#include "testutil.h"

/* Each test uses some of these helpers. */
#pragma GCC diagnostic ignored "-Wunused-function"

/* A fatal handler for tests in which the connection must never be lost. */
static void ts_fatal_is_a_failure(void *ctx, const char *reason) {
  (void)ctx;
  fprintf(stderr, "unexpected fatal handler call: %s\n", reason);
  _exit(3);
}

/* Counters that a test's log handler bumps under ts_log_lock. */
static pthread_mutex_t ts_log_lock __attribute__((unused)) = PTHREAD_MUTEX_INITIALIZER;
static int ts_log_count(int *which) {
  pthread_mutex_lock(&ts_log_lock);
  int n = *which;
  pthread_mutex_unlock(&ts_log_lock);
  return n;
}

/* ---- the server process ---------------------------------------------------------------- */

typedef struct test_server {
  pid_t pid;
  char dir[64];
  char socket[128];
  char log[128];
  const char *exe;
} test_server;

static void ts_dump_log(const test_server *ts) {
  FILE *f = fopen(ts->log, "r");
  if (!f) return;
  char line[1024];
  fprintf(stderr, "---- server log (%s) ----\n", ts->log);
  while (fgets(line, sizeof line, f))
    fputs(line, stderr);
  fprintf(stderr, "---- end of server log ----\n");
  fclose(f);
}

static bool ts_log_contains(const test_server *ts, const char *needle) {
  return tr_file_contains(ts->log, needle);
}

static test_server *ts_registered[4];
static pid_t ts_main_pid;

/* A REQUIRE that exits must not leave servers behind. */
static void ts_atexit(void) {
  if (getpid() != ts_main_pid) return;
  for (int i = 0; i < 4; i++)
    if (ts_registered[i] && ts_registered[i]->pid) {
      kill(ts_registered[i]->pid, SIGKILL);
      waitpid(ts_registered[i]->pid, NULL, 0);
      ts_registered[i]->pid = 0;
    }
}

static void ts_init(test_server *ts, const char *exe) {
  memset(ts, 0, sizeof *ts);
  if (!ts_main_pid) {
    ts_main_pid = getpid();
    atexit(ts_atexit);
  }
  for (int i = 0; i < 4; i++)
    if (!ts_registered[i]) {
      ts_registered[i] = ts;
      break;
    }
  ts->exe = exe;
  snprintf(ts->dir, sizeof ts->dir, "/tmp/oi-sidecar-XXXXXX");
  REQUIRE(mkdtemp(ts->dir) != NULL);
  snprintf(ts->socket, sizeof ts->socket, "%s/oi.sock", ts->dir);
}

/* Starts `openinfer serve --socket S --pool 64M --log-level info [extra...]`
 * and waits for its ready line. @return false if it exited or never got
 * ready (its log is printed). */
static bool ts_start(test_server *ts, const char *const *extra) {
  static int generation;
  snprintf(ts->log, sizeof ts->log, "%s/server-%d.log", ts->dir, generation++);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = open(ts->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
      close(fd);
    }
    const char *argv[32];
    int n = 0;
    argv[n++] = ts->exe;
    argv[n++] = "serve";
    argv[n++] = "--socket";
    argv[n++] = ts->socket;
    argv[n++] = "--pool";
    argv[n++] = "64M";
    argv[n++] = "--log-level";
    argv[n++] = "info";
    for (int i = 0; extra && extra[i] && n < 31; i++)
      argv[n++] = extra[i];
    argv[n] = NULL;
    execv(ts->exe, (char *const *)argv);
    _exit(127);
  }
  ts->pid = pid;
  for (int i = 0; i < 1000; i++) { /* 10 s */
    if (ts_log_contains(ts, "openinfer serve: listening on")) return true;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      ts->pid = 0;
      fprintf(stderr, "the server exited before it was ready (status 0x%x)\n", status);
      ts_dump_log(ts);
      return false;
    }
    usleep(10000);
  }
  fprintf(stderr, "the server did not get ready in 10 s\n");
  ts_dump_log(ts);
  return false;
}

/* The start of a GPU sidecar test: @return false without a CUDA device (the
 * caller skips); otherwise a lost connection is made a failure and the
 * server (argv[1]) is started with `extra`, both REQUIREd. */
static bool ts_gpu_open(test_server *ts, int argc, char **argv, const char *const *extra) {
  int n = 0;
  oi_device_count(&n);
  if (n == 0) return false;
  REQUIRE(argc >= 2);
  oi_set_fatal_handler(ts_fatal_is_a_failure, NULL);
  ts_init(ts, argv[1]);
  REQUIRE(ts_start(ts, extra));
  return true;
}

/* Waits for the server to exit (after a signal); @return its wait status. */
static int ts_wait(test_server *ts) {
  int status = -1;
  for (int i = 0; i < 2000 && ts->pid; i++) { /* 20 s */
    if (waitpid(ts->pid, &status, WNOHANG) == ts->pid) {
      ts->pid = 0;
      return status;
    }
    usleep(10000);
  }
  if (ts->pid) {
    kill(ts->pid, SIGKILL);
    waitpid(ts->pid, &status, 0);
    ts->pid = 0;
    fprintf(stderr, "the server did not exit in 20 s (killed)\n");
    return -1;
  }
  return status;
}

/* SIGTERM; @return true when it exited cleanly with status 0. */
static bool ts_stop(test_server *ts) {
  if (!ts->pid) return false;
  kill(ts->pid, SIGTERM);
  /* Under ThreadSanitizer an asynchronous signal can be deferred and lost;
   * repeat SIGTERM every 2 s (a clean stop is idempotent) before giving up. */
  int status = -1;
  for (int i = 1; i <= 2000 && ts->pid; i++) {
    if (waitpid(ts->pid, &status, WNOHANG) == ts->pid) {
      ts->pid = 0;
      break;
    }
    usleep(10000);
    if (i % 200 == 0) {
      fprintf(stderr, "the server is still running %d s after SIGTERM: sending it again\n",
              i / 100);
      kill(ts->pid, SIGTERM);
    }
  }
  if (ts->pid) status = ts_wait(ts); /* kills it and reports */
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!ok) {
    fprintf(stderr, "the server's exit status is 0x%x\n", status);
    ts_dump_log(ts);
  }
  return ok;
}

/* A SIGKILLed server cannot unlink its arenas' shared-memory objects: remove
 * them, so a later server that gets the same pid starts clean. */
static void ts_unlink_shm_of(pid_t pid) {
  char prefix[64], name[300];
  snprintf(prefix, sizeof prefix, "openinfer-%d-", (int)pid);
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *de;
  while ((de = readdir(d)))
    if (!strncmp(de->d_name, prefix, strlen(prefix))) {
      snprintf(name, sizeof name, "/%s", de->d_name);
      shm_unlink(name);
    }
  closedir(d);
}

static void ts_kill(test_server *ts) {
  if (!ts->pid) return;
  pid_t pid = ts->pid;
  kill(pid, SIGKILL);
  ts_wait(ts);
  ts_unlink_shm_of(pid);
}

static void ts_cleanup(test_server *ts) {
  if (ts->pid) ts_kill(ts);
  tu_remove_dir(ts->dir);
}

/* Shared-memory objects the server `pid` created (cpu arenas are named
 * /openinfer-<pid>-...). */
static int shm_objects_of(pid_t pid) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "openinfer-%d-", (int)pid);
  DIR *d = opendir("/dev/shm");
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (!strncmp(de->d_name, prefix, strlen(prefix))) n++;
  closedir(d);
  return n;
}

/* ---- a test layout ------------------------------------------------------------------------ */

/* ---- engine-owned cpu memory -------------------------------------------------- */

typedef struct owned_mem {
  int fd;
  uint8_t *base;
  uint64_t size;
} owned_mem;

/* A memfd of `size` bytes, sealed against shrinking (unless `seal` is false),
 * mapped shared. */
static void om_alloc(owned_mem *m, uint64_t size, bool seal) {
  m->size = size;
  m->fd = memfd_create("oi-test-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(m->fd >= 0);
  REQUIRE(ftruncate(m->fd, (off_t)size) == 0);
  if (seal) REQUIRE(fcntl(m->fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  m->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
  REQUIRE(m->base != MAP_FAILED);
}

static void om_free(owned_mem *m) {
  munmap(m->base, m->size);
  close(m->fd);
}

#define TL_BLOCKS 32
#define TL_ARENAS 3

/* Arena 0: 2 segments (split K/V) of 256 B at stride 512 in blocks of 1024;
 * arena 1: 384 B blocks; arena 2: 96 B blocks after a gap. By offsets. */
static void tl_arenas(oi_arena_desc a[TL_ARENAS], uint64_t *total) {
  memset(a, 0, sizeof(oi_arena_desc) * TL_ARENAS);
  a[0] = (oi_arena_desc){.name = "kv",
                         .offset = 0,
                         .num_blocks = TL_BLOCKS,
                         .bytes_per_block = 256,
                         .block_stride = 1024,
                         .segments = 2,
                         .segment_stride = 512};
  uint64_t off1 = TL_BLOCKS * 1024;
  a[1] = (oi_arena_desc){.name = "mla",
                         .offset = off1,
                         .num_blocks = TL_BLOCKS,
                         .bytes_per_block = 384,
                         .block_stride = 384,
                         .segments = 1};
  uint64_t off2 = off1 + TL_BLOCKS * 384 + 4096;
  a[2] = (oi_arena_desc){.name = "idx",
                         .offset = off2,
                         .num_blocks = TL_BLOCKS,
                         .bytes_per_block = 96,
                         .block_stride = 128,
                         .segments = 1};
  *total = off2 + (TL_BLOCKS - 1) * 128 + 96;
}

static void tl_options(oi_engine_options *o, oi_arena_desc a[TL_ARENAS], const char *ns) {
  uint64_t total;
  tl_arenas(a, &total);
  oi_engine_options_init(o);
  o->namespace_id = ns;
  o->instance_name = "test";
  o->device = OI_DEVICE_CPU;
  o->num_arenas = TL_ARENAS;
  o->arenas = a;
  o->arena_size = 0; /* computed */
}

/* Declares a test-layout client's arenas, options, engine and imported arena. */
#define TL_CLIENT(a, o, e, arena)                                                                  \
  oi_arena_desc a[TL_ARENAS];                                                                      \
  oi_engine_options o;                                                                             \
  oi_engine *e;                                                                                    \
  oi_imported_arena *arena

/* Connects a client of the test layout in namespace `ns` to the server at
 * `socket` (options in *o over a): the connect CHECKed, the engine and the
 * imported arena REQUIREd. @return the arena's mapping. */
static uint8_t *tl_connect(const char *socket, const char *ns, oi_arena_desc a[TL_ARENAS],
                           oi_engine_options *o, oi_engine **e, oi_imported_arena **arena) {
  tl_options(o, a, ns);
  *e = NULL;
  *arena = NULL;
  CHECK_OK(oi_engine_connect(socket, o, e, arena));
  REQUIRE(*e && *arena);
  return oi_imported_arena_ptr(*arena);
}

static uint8_t tl_byte(uint64_t logical, uint32_t arena, uint32_t seg, uint64_t i) {
  uint64_t x = (logical + 1) * 0x9E3779B97F4A7C15ull ^ (arena + 1) * 0xBF58476D1CE4E5B9ull ^
               (seg + 1) * 0x94D049BB133111EBull ^ i * 0x2545F4914F6CDD1Dull;
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 17));
}

/* Writes logical block `logical`'s pattern into device block `id`. */
static void tl_fill(uint8_t *base, const oi_arena_desc *a, int64_t id, uint64_t logical) {
  for (uint32_t ar = 0; ar < TL_ARENAS; ar++)
    for (uint32_t s = 0; s < a[ar].segments; s++) {
      uint8_t *p =
          base + a[ar].offset + (uint64_t)id * a[ar].block_stride + s * a[ar].segment_stride;
      for (uint64_t i = 0; i < a[ar].bytes_per_block; i++)
        p[i] = tl_byte(logical, ar, s, i);
    }
}

/* Does device block `id` hold logical block `logical`'s pattern? */
static bool tl_check(const uint8_t *base, const oi_arena_desc *a, int64_t id, uint64_t logical) {
  for (uint32_t ar = 0; ar < TL_ARENAS; ar++)
    for (uint32_t s = 0; s < a[ar].segments; s++) {
      const uint8_t *p =
          base + a[ar].offset + (uint64_t)id * a[ar].block_stride + s * a[ar].segment_stride;
      for (uint64_t i = 0; i < a[ar].bytes_per_block; i++)
        if (p[i] != tl_byte(logical, ar, s, i)) {
          fprintf(stderr, "block %lld arena %u seg %u byte %llu: 0x%02x, expected 0x%02x\n",
                  (long long)id, ar, s, (unsigned long long)i, p[i], tl_byte(logical, ar, s, i));
          return false;
        }
    }
  return true;
}

static bool tl_is_zero(const uint8_t *base, const oi_arena_desc *a, int64_t id) {
  for (uint32_t ar = 0; ar < TL_ARENAS; ar++)
    for (uint32_t s = 0; s < a[ar].segments; s++) {
      const uint8_t *p =
          base + a[ar].offset + (uint64_t)id * a[ar].block_stride + s * a[ar].segment_stride;
      for (uint64_t i = 0; i < a[ar].bytes_per_block; i++)
        if (p[i]) return false;
    }
  return true;
}

static oi_block_hash tl_hash(uint32_t salt, uint64_t logical) {
  oi_block_hash h;
  memset(&h, 0, sizeof h);
  memcpy(h.bytes, &salt, sizeof salt);
  memcpy(h.bytes + 8, &logical, sizeof logical);
  h.bytes[4] = 0xA5;
  return h;
}

/* Device blocks 0..n-1 take logical blocks 0..n-1 (hashes of `salt`): ids,
 * hashes and patterns. */
static void tl_fill_n(uint8_t *base, const oi_arena_desc *a, uint32_t salt, int64_t *ids,
                      oi_block_hash *hs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)i;
    hs[i] = tl_hash(salt, (uint64_t)i);
    tl_fill(base, a, ids[i], (uint64_t)i);
  }
}

/* ---- a raw wire client --------------------------------------------------------------------- */

typedef struct wire_client {
  int fd;
  uint8_t *buf;
  size_t cap;
  oi_wire_arrays arrays;
  oiwire_Envelope env; /* the last reply */
  uint64_t next_id;
} wire_client;

static bool wc_connect(wire_client *c, const char *path) {
  memset(c, 0, sizeof *c);
  c->fd = -1;
  return oi__wire_connect(path, &c->fd) == OI_OK;
}

static void wc_close(wire_client *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  oi__wire_arrays_free(&c->arrays);
  oi__free(c->buf);
  c->buf = NULL;
}

static bool wc_send_raw(wire_client *c, const void *bytes, size_t n) {
  return oi__wire_send(c->fd, bytes, n) == OI_OK;
}

/* Sends `env` (request id assigned unless already set). */
static bool wc_send(wire_client *c, oiwire_Envelope *env, const oi_wire_out *out) {
  if (!env->request_id) env->request_id = ++c->next_id;
  uint8_t *frame;
  size_t len;
  if (oi__wire_encode(env, out, &frame, &len) != OI_OK) return false;
  bool ok = wc_send_raw(c, frame, len);
  oi__free(frame);
  return ok;
}

/* Receives one frame into c->env within timeout_ms. @return OI_OK,
 * OI_ERR_CLOSED when the server closed the session, OI_ERR_TIMEOUT. */
static oi_status wc_recv(wire_client *c, int timeout_ms) {
  struct pollfd p = {.fd = c->fd, .events = POLLIN};
  if (poll(&p, 1, timeout_ms) <= 0) return OI_ERR_TIMEOUT;
  size_t len;
  oi_status st = oi__wire_recv(c->fd, OI_WIRE_MAX_FRAME, &c->buf, &c->cap, &len);
  if (st != OI_OK) return OI_ERR_CLOSED;
  return oi__wire_decode(c->buf, len, &c->env, &c->arrays);
}

/* Is the session closed (end of stream within timeout_ms, after any frames
 * still queued)? */
static bool wc_closed(wire_client *c, int timeout_ms) {
  for (;;) {
    oi_status st = wc_recv(c, timeout_ms);
    if (st == OI_ERR_CLOSED) return true;
    if (st == OI_ERR_TIMEOUT) return false;
  }
}

/* Sends a request and waits for the reply with the same id (5 s). */
static bool wc_call(wire_client *c, oiwire_Envelope *env, const oi_wire_out *out) {
  env->request_id = 0;
  if (!wc_send(c, env, out)) return false;
  uint64_t id = env->request_id;
  for (;;) {
    if (wc_recv(c, 5000) != OI_OK) return false;
    if (c->env.request_id == id) return true;
  }
}

/* The status of the last reply (OI_OK for a non-Result body). */
static oi_status wc_status(const wire_client *c) {
  return c->env.which_body == oiwire_Envelope_result_tag ? c->env.body.result.status : OI_OK;
}

static bool wc_hello(wire_client *c, uint64_t *epoch) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_hello_tag;
  env.body.hello.protocol_version = OI_WIRE_PROTOCOL_VERSION;
  snprintf(env.body.hello.client_name, sizeof env.body.hello.client_name, "wire test");
  if (!wc_call(c, &env, NULL) || c->env.which_body != oiwire_Envelope_hello_reply_tag) return false;
  if (epoch) *epoch = c->env.body.hello_reply.server_epoch;
  return true;
}

/* Server totals (Stats with instance 0). */
static bool wc_server_stats(wire_client *c, oiwire_StatsReply *out) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_stats_tag;
  if (!wc_call(c, &env, NULL) || c->env.which_body != oiwire_Envelope_stats_reply_tag) return false;
  *out = c->env.body.stats_reply;
  return true;
}

/* Sends a Register of the test layout in namespace `ns` on `device` (world
 * size 1). @return whether a reply came (in c->env: a RegisterReply or an
 * error). */
static bool wc_call_register(wire_client *c, const char *ns, int32_t device) {
  oi_arena_desc a[TL_ARENAS];
  uint64_t total;
  tl_arenas(a, &total);
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.which_body = oiwire_Envelope_register_instance_tag;
  snprintf(env.body.register_instance.namespace_id, sizeof env.body.register_instance.namespace_id,
           "%s", ns);
  env.body.register_instance.device = device;
  env.body.register_instance.world_size = 1;
  env.body.register_instance.arena_size = total;
  oi_wire_out out = {.arenas = a, .n_arenas = TL_ARENAS};
  return wc_call(c, &env, &out);
}

/* Registers the test layout; @return the instance id (0 on failure). */
static uint32_t wc_register(wire_client *c, const char *ns, oi_arena_handle *handle,
                            uint64_t *arena_bytes) {
  if (!wc_call_register(c, ns, OI_DEVICE_CPU) ||
      c->env.which_body != oiwire_Envelope_register_reply_tag)
    return 0;
  if (handle) memcpy(handle->bytes, c->env.body.register_reply.arena_handle.bytes, 64);
  if (arena_bytes) *arena_bytes = c->env.body.register_reply.arena_bytes;
  return c->env.body.register_reply.instance_id;
}

/* Polls the server's totals until `pred` holds (5 s). */
#define WAIT_FOR_STATS(client, stats, pred)                                                        \
  ({                                                                                               \
    bool ok_ = false;                                                                              \
    for (int i_ = 0; i_ < 500 && !ok_; i_++) {                                                     \
      if (!wc_server_stats(client, &(stats))) break;                                               \
      ok_ = (pred);                                                                                \
      if (!ok_) usleep(10000);                                                                     \
    }                                                                                              \
    ok_;                                                                                           \
  })

/* The server at ts went back to no instance, no arena bytes and no shared
 * memory object, and serves: a new client's session is then its only one
 * (all CHECKed). */
static void check_server_clean(const test_server *ts) {
  wire_client c;
  oiwire_StatsReply sr;
  memset(&sr, 0, sizeof sr);
  REQUIRE(wc_connect(&c, ts->socket) && wc_hello(&c, NULL));
  CHECK(WAIT_FOR_STATS(&c, sr, sr.instances == 0 && sr.sessions == 1));
  CHECK(sr.arena_bytes == 0);
  CHECK(shm_objects_of(ts->pid) == 0);
  wc_close(&c);
}

/* ---- hand-made protobuf, for frames the encoder would never produce ------------------- */

typedef struct pbw {
  size_t n;
  uint8_t b[1 << 20];
} pbw;

static pbw *pbw_new(void) {
  pbw *w = calloc(1, sizeof *w);
  REQUIRE(w != NULL);
  return w;
}
static void pbw_varint(pbw *w, uint64_t v) {
  while (v >= 0x80) {
    w->b[w->n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  w->b[w->n++] = (uint8_t)v;
}
static void pbw_tag(pbw *w, uint32_t field, uint32_t wire_type) {
  pbw_varint(w, (uint64_t)field << 3 | wire_type);
}
static void pbw_uint(pbw *w, uint32_t field, uint64_t v) {
  pbw_tag(w, field, 0);
  pbw_varint(w, v);
}
static void pbw_bytes(pbw *w, uint32_t field, const void *p, size_t n) {
  pbw_tag(w, field, 2);
  pbw_varint(w, n);
  memcpy(w->b + w->n, p, n);
  w->n += n;
}
static uint64_t pbw_zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }
/* packed sint64 */
static void pbw_ids(pbw *w, uint32_t field, const int64_t *ids, size_t n) {
  pbw *tmp = pbw_new();
  for (size_t i = 0; i < n; i++)
    pbw_varint(tmp, pbw_zigzag(ids[i]));
  pbw_bytes(w, field, tmp->b, tmp->n);
  free(tmp);
}
/* An Envelope {request_id, body field = message} */
static pbw *pbw_envelope(uint64_t request_id, uint32_t body_field, const pbw *body) {
  pbw *w = pbw_new();
  pbw_uint(w, 1, request_id);
  pbw_bytes(w, body_field, body->b, body->n);
  return w;
}
/* Sends a payload as one frame. */
static bool wc_send_payload(wire_client *c, const void *p, size_t n) {
  uint8_t hdr[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
  return wc_send_raw(c, hdr, 4) && (n == 0 || wc_send_raw(c, p, n));
}

#endif
