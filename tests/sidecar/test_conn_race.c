/* Many threads of one sidecar client submit saves, loads, queries and
 * control calls while the connection to the server is cut at a random point
 * (issue: a send that fails while the reader fails every pending record must
 * never touch a record the reader already freed).
 *
 * The parent runs a real `openinfer serve` and, in front of it, a cutting
 * proxy (a single-threaded poll loop, so forking clients from it is safe).
 * Each round forks one client process that connects through the proxy and
 * starts WORKERS threads; the proxy forwards both ways and then, at a random
 * time after the connect completed (the server's register reply passed),
 * ends the link in one of several ways:
 *   CUT_CLOSE    close both sides between reads (before or after a frame)
 *   CUT_PARTIAL  forward only a random prefix of the next chunk (in either
 *                direction), then close: a frame cut in the middle
 *   CUT_STALL    stop reading the client (its sends block, then fail) and
 *                hold the server's replies for a while, deliver them late
 *                (calls and asynchronous deadlines expire first), then close
 * With fault injection compiled in, some clients also reset their own
 * connection in the middle of one of their sends (sock_reset).
 *
 * Every loaded block is checked byte for byte. A client ends with exit 0 (it
 * finished before its cut), 42 (its fatal handler: the server went away
 * while it mapped the arena; the handler waits for the other threads to stop
 * so their sanitizer reports, if any, finish) or 3 (the cut came during
 * connect, which failed with an error). Anything else (a signal: ASan aborts;
 * TSan's exit 66; a mismatch, exit 4) fails the test.
 *
 * Rounds: --rounds N or OI_RACE_ROUNDS (default 40). */
#include <pthread.h>
#include <stdatomic.h>

#include "core/core.h"
#include "core/fault.h"
#include "sidecar_util.h"

enum { WORKERS = 8, PER_WORKER = 48, NBLOCKS = WORKERS * PER_WORKER, BLOCK = 256 };
enum { CUT_CLOSE, CUT_PARTIAL, CUT_STALL, CUT_KINDS };

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* ---- the client process ------------------------------------------------------------------ */

static oi_engine *ce;
static uint8_t *cbase;
static atomic_bool c_stop, c_fatal;
static atomic_uint_fast64_t c_mismatches;

static uint8_t pat(uint64_t logical, uint64_t i) {
  uint64_t x = (logical + 1) * 0x9E3779B97F4A7C15ull ^ (i + 7) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return (uint8_t)(x ^ (x >> 11));
}

static oi_block_hash lhash(uint64_t logical) { return tr_hash(logical, 15, 0xC7); }

/* The fatal handler runs on the reader thread once the connection is lost
 * with the arena mapped. It must not return (the library aborts then): it
 * tells the main thread, which stops and joins every worker (their calls now
 * fail fast) before it exits, so a racing thread's sanitizer report is
 * written whole instead of being cut by an early _exit. */
static void fatal_quiesce(void *ctx, const char *reason) {
  (void)ctx;
  (void)reason;
  atomic_store(&c_fatal, true);
  for (;;)
    pause();
}

static void *worker(void *arg) {
  int w = (int)(intptr_t)arg;
  uint64_t rng = 0x2545F4914F6CDD1Dull * (uint64_t)(w + 1) ^ (uint64_t)getpid() << 20;
  int64_t first = (int64_t)w * PER_WORKER; /* this thread's own device blocks */
  bool quiet = false;
  while (!atomic_load(&c_stop) && !atomic_load(&c_fatal)) {
    uint64_t op = rng_next(&rng) % 16;
    /* After a save or load that did not end OK (deadline, cut), the server
     * may still copy it later: this thread stops writing and loading its
     * blocks, so a late copy cannot be mistaken for a wrong byte. */
    if (quiet && (op < 10 || op >= 14)) op = 10 + op % 4;
    if (op < 5) { /* save 1..24 blocks; sometimes without waiting (many in flight at the cut) */
      size_t n = 1 + rng_next(&rng) % 24;
      int64_t ids[24];
      oi_block_hash hs[24];
      for (size_t i = 0; i < n; i++) {
        uint64_t logical = (uint64_t)w * 1000 + rng_next(&rng) % 64;
        ids[i] = first + (int64_t)i;
        hs[i] = lhash(logical);
        for (uint64_t b = 0; b < BLOCK; b++)
          cbase[(uint64_t)ids[i] * BLOCK + b] = pat(logical, b);
      }
      oi_ticket *t = NULL;
      if (oi_engine_save(ce, ids, hs, n, NULL, &t) == OI_OK) {
        if (oi_ticket_wait(t, 5000) != OI_OK) quiet = true;
        oi_ticket_release(t);
      }
    } else if (op < 10) { /* query a run; load what hit into this thread's blocks; check */
      size_t n = 1 + rng_next(&rng) % 24;
      oi_block_hash hs[24];
      uint64_t logical[24];
      uint64_t start = rng_next(&rng) % 64;
      for (size_t i = 0; i < n; i++) {
        logical[i] = (uint64_t)w * 1000 + (start + i) % 64;
        hs[i] = lhash(logical[i]);
      }
      uint8_t present[24];
      oi_query_result q = {.struct_size = sizeof q, .present = present};
      uint32_t flags = rng_next(&rng) % 4 == 0 ? OI_QUERY_MEMBERSHIP : 0;
      if (oi_engine_query(ce, NULL, hs, n, flags, &q) != OI_OK || q.hit_blocks == 0 ||
          (flags & OI_QUERY_MEMBERSHIP))
        continue;
      if (rng_next(&rng) % 6 == 0) {
        oi_engine_release(ce, q.lease);
        continue;
      }
      int64_t dst[24];
      for (size_t i = 0; i < q.hit_blocks; i++)
        dst[i] = first + 24 + (int64_t)i;
      oi_ticket *t = NULL;
      if (oi_engine_load(ce, q.lease, dst, q.hit_blocks, NULL, &t) != OI_OK) continue;
      oi_status st = oi_ticket_wait(t, 5000);
      oi_ticket_release(t);
      if (st != OI_OK) {
        quiet = true;
        continue;
      }
      for (size_t i = 0; i < q.hit_blocks; i++)
        for (uint64_t b = 0; b < BLOCK; b++)
          if (cbase[(uint64_t)dst[i] * BLOCK + b] != pat(logical[i], b)) {
            if (atomic_fetch_add(&c_mismatches, 1) == 0)
              fprintf(stderr, "client %d: block %lld byte %llu is not logical %llu's\n",
                      (int)getpid(), (long long)dst[i], (unsigned long long)b,
                      (unsigned long long)logical[i]);
            break;
          }
    } else if (op < 12) {
      oi_engine_flush(ce, (uint32_t)(rng_next(&rng) % 300));
    } else if (op < 14) {
      oi_engine_stats s = {.struct_size = sizeof s};
      oi_engine_get_stats(ce, &s);
    } else { /* a save nobody waits for: the reader alone completes it */
      int64_t id = first + (int64_t)(rng_next(&rng) % 24);
      oi_block_hash h = lhash((uint64_t)w * 1000 + 500 + rng_next(&rng) % 64);
      oi_engine_save(ce, &id, &h, 1, NULL, NULL);
    }
  }
  return NULL;
}

static int client_main(const char *socket, uint64_t seed) {
  signal(SIGPIPE, SIG_IGN);
  oi_set_log_level(OI_LOG_ERROR);
  oi_set_fatal_handler(fatal_quiesce, NULL);
  uint64_t rng = seed | 1;
  if (oi__fault_available() && rng_next(&rng) % 3 == 0) /* a reset in the middle of a send */
    oi__fault_arm(OI_FAULT_SOCK_RESET, 4 + rng_next(&rng) % 200, 1, 1 + rng_next(&rng) % 64);
  oi_arena_desc a = tr_arena("kv", NULL, NBLOCKS, BLOCK);
  oi_engine_options o;
  oi_engine_options_init(&o);
  char ns[32];
  snprintf(ns, sizeof ns, "race-%llx", (unsigned long long)seed); /* nothing from earlier rounds */
  o.namespace_id = ns;
  o.instance_name = "race";
  o.device = OI_DEVICE_CPU;
  o.arenas = &a;
  o.num_arenas = 1;
  o.save_deadline_ms = 150; /* a stalled link expires asynchronous operations... */
  o.load_deadline_ms = 150;
  o.control_deadline_ms = 200; /* ...and calls, whose replies then arrive late */
  oi_imported_arena *ar = NULL;
  if (oi_engine_connect(socket, &o, &ce, &ar) != OI_OK) return 3;
  cbase = oi_imported_arena_ptr(ar);
  pthread_t th[WORKERS];
  for (int i = 0; i < WORKERS; i++)
    pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < 150 && !atomic_load(&c_fatal); i++)
    usleep(10000); /* the cut comes sooner */
  atomic_store(&c_stop, true);
  for (int i = 0; i < WORKERS; i++)
    pthread_join(th[i], NULL);
  if (atomic_load(&c_fatal)) {
    /* Cut while live: the handler is parked on the reader thread; exit for it. */
    _exit(atomic_load(&c_mismatches) ? 4 : 42);
  }
  oi_engine_destroy(ce);
  oi_imported_arena_close(ar);
  return atomic_load(&c_mismatches) ? 4 : 0;
}

/* ---- the cutting proxy (parent) ------------------------------------------------------------ */

typedef struct proxy_link {
  int c, s; /* client side, server side; -1 when closed */
  int kind;
  uint64_t cut_ns;   /* when the link is cut (CUT_STALL: when the stall starts) */
  uint64_t late_ns;  /* CUT_STALL: when the held replies are delivered */
  uint64_t close_ns; /* CUT_STALL: when the link is closed */
  uint8_t *held;     /* CUT_STALL: server bytes held back */
  size_t held_n, held_cap;
  /* The server's frames seen so far: the clock of the cut starts once the
   * second (the register reply) has passed, so the cut finds a live client
   * however slowly the machine connects. */
  uint32_t s2c_frames;
  uint64_t s2c_left; /* bytes left of the current frame's body */
  uint8_t hdr[4];
  size_t hdr_n;
} proxy_link;

/* Counts the server's frames in bytes forwarded to the client; starts the
 * cut's clock after the register reply. */
static void track_s2c(proxy_link *l, const uint8_t *p, size_t n, uint64_t *rng) {
  while (n && l->s2c_frames < 2) {
    if (l->s2c_left) {
      size_t k = n < l->s2c_left ? n : (size_t)l->s2c_left;
      l->s2c_left -= k;
      p += k;
      n -= k;
    } else {
      l->hdr[l->hdr_n++] = *p++;
      n--;
      if (l->hdr_n < 4) continue;
      uint32_t len = 0;
      REQUIRE(oi__wire_frame_length(l->hdr, OI_WIRE_MAX_FRAME, &len) == OI_OK);
      l->hdr_n = 0;
      l->s2c_left = len;
    }
    if (!l->s2c_left && !l->hdr_n) l->s2c_frames++;
  }
  if (l->s2c_frames == 2 && l->cut_ns == UINT64_MAX) {
    uint64_t now = oi__now_ns();
    l->cut_ns = now + (5 + rng_next(rng) % 400) * 1000000ull;
    l->late_ns = l->cut_ns + (250 + rng_next(rng) % 200) * 1000000ull;
    l->close_ns = l->late_ns + (rng_next(rng) % 100) * 1000000ull;
  }
}

static void link_close(proxy_link *l) {
  if (l->c >= 0) close(l->c);
  if (l->s >= 0) close(l->s);
  l->c = l->s = -1;
  free(l->held);
  l->held = NULL;
  l->held_n = l->held_cap = 0;
}

static bool write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= (size_t)k;
  }
  return true;
}

/* Forwards one chunk from `from` to `to`; at or past the cut, a random prefix
 * of it and then the end. @return false when the link ended. */
static bool pump(proxy_link *l, int from, int to, bool to_client, uint64_t *rng) {
  static uint8_t buf[1 << 16];
  ssize_t k = recv(from, buf, sizeof buf, 0);
  if (k <= 0) return false;
  uint64_t now = oi__now_ns();
  if (l->kind == CUT_STALL && to_client && now >= l->cut_ns && now < l->late_ns) {
    if (l->held_n + (size_t)k > l->held_cap) {
      l->held_cap = (l->held_n + (size_t)k) * 2;
      l->held = realloc(l->held, l->held_cap);
      REQUIRE(l->held);
    }
    memcpy(l->held + l->held_n, buf, (size_t)k);
    l->held_n += (size_t)k;
    return true;
  }
  if (l->kind == CUT_PARTIAL && now >= l->cut_ns) {
    write_all(to, buf, (size_t)(rng_next(rng) % (uint64_t)k));
    return false;
  }
  if (to_client) track_s2c(l, buf, (size_t)k, rng);
  return write_all(to, buf, (size_t)k);
}

static int proxy_listen(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  REQUIRE(strlen(path) < sizeof sa.sun_path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  unlink(path);
  REQUIRE(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  REQUIRE(listen(fd, 8) == 0);
  return fd;
}

/* Serves the link of one client until the client process exits. @return its
 * wait status. */
static int run_round(int lfd, const char *server_socket, pid_t child, uint64_t *rng,
                     int *kind_out) {
  proxy_link l = {.c = -1, .s = -1};
  int status = 0;
  bool exited = false;
  uint64_t deadline = oi__now_ns() + 60ull * 1000000000ull;
  while (!exited) {
    if (waitpid(child, &status, WNOHANG) == child) exited = true;
    if (oi__now_ns() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      fprintf(stderr, "client %d did not end in 60 s (killed)\n", (int)child);
      break;
    }
    struct pollfd p[3] = {{.fd = lfd, .events = POLLIN},
                          {.fd = l.c, .events = POLLIN},
                          {.fd = l.s, .events = POLLIN}};
    uint64_t now = oi__now_ns();
    if (l.kind == CUT_STALL && l.c >= 0 && now >= l.cut_ns && now < l.late_ns)
      p[1].fd = -1; /* the client's sends fill the socket and block */
    poll(p, 3, 5);
    now = oi__now_ns();
    if (p[0].revents & POLLIN) {
      int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
      if (c >= 0 && l.c >= 0) {
        close(c); /* one link per round */
      } else if (c >= 0) {
        int s = -1;
        if (oi__wire_connect(server_socket, &s) != OI_OK) {
          close(c);
        } else {
          l.c = c;
          l.s = s;
          l.kind = (int)(rng_next(rng) % CUT_KINDS);
          *kind_out = l.kind;
          l.cut_ns = l.late_ns = l.close_ns = UINT64_MAX; /* set once connected */
        }
      }
    }
    if (l.c < 0) continue;
    bool alive = true;
    if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) alive = pump(&l, l.c, l.s, false, rng);
    if (alive && (p[2].revents & (POLLIN | POLLHUP | POLLERR)))
      alive = pump(&l, l.s, l.c, true, rng);
    if (alive && l.kind == CUT_STALL && now >= l.late_ns && l.held_n) {
      alive = write_all(l.c, l.held, l.held_n); /* late replies */
      l.held_n = 0;
    }
    if (alive && l.kind == CUT_CLOSE && now >= l.cut_ns) alive = false;
    if (alive && l.kind == CUT_PARTIAL && l.cut_ns != UINT64_MAX && now >= l.cut_ns + 50000000ull)
      alive = false;
    if (alive && l.kind == CUT_STALL && now >= l.close_ns) alive = false;
    if (!alive) link_close(&l);
  }
  link_close(&l);
  return status;
}

static test_server ts; /* static: ts_atexit reads it after main returns */

static const char *describe(int status, char *buf, size_t cap) {
  if (WIFSIGNALED(status))
    snprintf(buf, cap, "died of signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else if (WIFEXITED(status))
    snprintf(buf, cap, "exited with %d", WEXITSTATUS(status));
  else
    snprintf(buf, cap, "wait status 0x%x", status);
  return buf;
}

int main(int argc, char **argv) {
  if (argc < 2) TEST_SKIP("usage: test_conn_race OPENINFER_EXE [--rounds N]");
  unsetenv("OI_FAULTS");
  int rounds = 40;
  const char *env = getenv("OI_RACE_ROUNDS");
  if (env && *env) rounds = atoi(env);
  for (int i = 2; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
  ts_init(&ts, argv[1]);
  const char *extra[] = {"--log-level", "warn", NULL};
  REQUIRE(ts_start(&ts, extra));
  char proxy[160];
  snprintf(proxy, sizeof proxy, "%s/proxy.sock", ts.dir);
  int lfd = proxy_listen(proxy);

  uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 16 ^ oi__now_ns();
  int outcomes[5] = {0}; /* 0, 42, 3, other */
  int by_kind[CUT_KINDS] = {0};
  for (int r = 0; r < rounds; r++) {
    uint64_t seed = rng_next(&rng);
    fflush(NULL);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(lfd);
      _exit(client_main(proxy, seed));
    }
    int kind = -1;
    int status = run_round(lfd, ts.socket, child, &rng, &kind);
    if (kind >= 0) by_kind[kind]++;
    char why[96];
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      outcomes[0]++;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 42) {
      outcomes[1]++;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
      outcomes[2]++;
    } else {
      outcomes[3]++;
      fprintf(stderr, "round %d (seed %llu, cut %d): the client %s\n", r, (unsigned long long)seed,
              kind, describe(status, why, sizeof why));
      CHECK(!"a client ended other than by finishing, its fatal handler or a failed connect");
    }
    CHECK(kill(ts.pid, 0) == 0); /* the server lives */
  }
  close(lfd);
  unlink(proxy);
  fprintf(stderr,
          "conn race: %d rounds (cuts: %d close, %d partial frame, %d stall + late replies): %d "
          "finished, %d fatal handler after the cut, %d connect failed, %d other\n",
          rounds, by_kind[CUT_CLOSE], by_kind[CUT_PARTIAL], by_kind[CUT_STALL], outcomes[0],
          outcomes[1], outcomes[2], outcomes[3]);
  /* Most rounds must have cut a live, busy client. */
  CHECK(outcomes[1] * 2 >= rounds);

  /* The server cleaned every session and still serves. */
  check_server_clean(&ts);
  CHECK(ts_stop(&ts));
  if (oi_test_failures) ts_dump_log(&ts);
  ts_cleanup(&ts);
  TEST_EXIT();
}
