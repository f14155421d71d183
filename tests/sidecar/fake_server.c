/* The scriptable fake server of the client error-path tests (fake_server.h). */
#include "fake_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/device.h"
#include "openinfer/engine.h"

/* Stops the test: the fake server cannot go on. */
#define REQUIRE(cond)                                                                              \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: fake server: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond);      \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#define FS_MAX_CONNS 8
#define FS_MAX_STEPS 32
#define FS_MAX_HELD 64
#define FS_MAX_ARENAS 64

typedef struct fs_queued {
  fs_step step;
  char message[256];
} fs_queued;

typedef struct fs_conn {
  int fd;       /* -1: free */
  uint64_t gen; /* held replies name the connection they were made for */
} fs_conn;

typedef struct fs_held {
  bool used;
  int conn;
  uint64_t gen;
  uint64_t due_ns;
  uint8_t *frame; /* with its length prefix */
  size_t len;
} fs_held;

struct fake_server {
  char dir[64];
  char path[96];
  int listen_fd;
  int wake[2]; /* the test thread wakes the server thread */
  pthread_t thread;

  pthread_mutex_t lock;
  pthread_cond_t cv;
  bool stop;
  fs_queued steps[FS_TYPES][FS_MAX_STEPS];
  uint32_t n_steps[FS_TYPES], next_step[FS_TYPES];
  uint32_t seen[FS_TYPES];
  bool have_last[FS_TYPES];
  oiwire_Envelope last[FS_TYPES];
  uint64_t caps, hits, epoch;
  uint32_t next_instance;
  uint32_t open_conns, client_closes, fds_received, late_sent;
  /* fs_close_all's request, done by the server thread */
  bool close_req;
  oi_status close_status;
  char close_reason[256];
  uint64_t close_done;

  /* The server thread's own (no lock needed). */
  fs_conn conns[FS_MAX_CONNS];
  uint64_t next_gen;
  fs_held held[FS_MAX_HELD];
  uint8_t *buf;
  size_t cap;
  oi_wire_arrays arrays;
  oiwire_Envelope env;
  fs_reply reply;
  oi_dev *dev;
  void *arenas[FS_MAX_ARENAS];
  uint32_t n_arenas;
};

/* ---- sending ------------------------------------------------------------------------- */

static void conn_close(fake_server *fs, int i) {
  if (fs->conns[i].fd < 0) return;
  close(fs->conns[i].fd);
  fs->conns[i].fd = -1;
  pthread_mutex_lock(&fs->lock);
  fs->open_conns--;
  pthread_cond_broadcast(&fs->cv);
  pthread_mutex_unlock(&fs->lock);
}

/* Sends `env` on connection i now, or holds it delay_ms. */
static void send_env(fake_server *fs, int i, const oiwire_Envelope *env, const oi_wire_out *out,
                     uint32_t delay_ms) {
  uint8_t *frame;
  size_t len;
  REQUIRE(oi__wire_encode(env, out, &frame, &len) == OI_OK);
  if (delay_ms == 0) {
    (void)oi__wire_send(fs->conns[i].fd, frame, len); /* a client that left: nothing to do */
    oi__free(frame);
    return;
  }
  for (int h = 0; h < FS_MAX_HELD; h++)
    if (!fs->held[h].used) {
      fs->held[h] = (fs_held){.used = true,
                              .conn = i,
                              .gen = fs->conns[i].gen,
                              .due_ns = oi__now_ns() + (uint64_t)delay_ms * 1000000ull,
                              .frame = frame,
                              .len = len};
      return;
    }
  REQUIRE(!"the fake server holds too many replies");
}

static void send_result(fake_server *fs, int i, uint64_t req, oi_status st, const char *msg,
                        uint32_t delay_ms) {
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  oi__wire_set_result(&env, req, st, msg ? msg : "");
  send_env(fs, i, &env, NULL, delay_ms);
}

/* Sends the held replies that are due; @return ms to the next one (-1: none). */
static int send_due(fake_server *fs) {
  uint64_t now = oi__now_ns();
  int64_t next = -1;
  for (int h = 0; h < FS_MAX_HELD; h++) {
    fs_held *x = &fs->held[h];
    if (!x->used) continue;
    if (x->due_ns <= now) {
      if (fs->conns[x->conn].fd >= 0 && fs->conns[x->conn].gen == x->gen) {
        (void)oi__wire_send(fs->conns[x->conn].fd, x->frame, x->len);
        pthread_mutex_lock(&fs->lock);
        fs->late_sent++;
        pthread_cond_broadcast(&fs->cv);
        pthread_mutex_unlock(&fs->lock);
      }
      oi__free(x->frame);
      x->used = false;
      continue;
    }
    int64_t ms = (int64_t)((x->due_ns - now) / 1000000ull) + 1;
    if (next < 0 || ms < next) next = ms;
  }
  return (int)next;
}

/* ---- the default replies --------------------------------------------------------------- */

/* Fills fs->reply with the correct answer to fs->env; false when the request
 * gets no reply body (there is none to edit). */
static bool default_reply(fake_server *fs, uint64_t caps, uint64_t hits) {
  const oiwire_Envelope *rq = &fs->env;
  fs_reply *r = &fs->reply;
  memset(&r->env, 0, sizeof r->env);
  memset(&r->out, 0, sizeof r->out);
  r->env.request_id = rq->request_id;
  r->n_hashes = 0;
  switch (rq->which_body) {
  case oiwire_Envelope_hello_tag:
    r->env.which_body = oiwire_Envelope_hello_reply_tag;
    r->env.body.hello_reply.protocol_version = OI_WIRE_PROTOCOL_VERSION;
    r->env.body.hello_reply.capabilities = caps;
    r->env.body.hello_reply.server_epoch = fs->epoch;
    snprintf(r->env.body.hello_reply.server_version, sizeof r->env.body.hello_reply.server_version,
             "fake");
    return true;
  case oiwire_Envelope_register_instance_tag: {
    const oiwire_Register *g = &rq->body.register_instance;
    oiwire_RegisterReply *rr = &r->env.body.register_reply;
    r->env.which_body = oiwire_Envelope_register_reply_tag;
    pthread_mutex_lock(&fs->lock);
    rr->instance_id = ++fs->next_instance;
    pthread_mutex_unlock(&fs->lock);
    rr->arena_bytes = g->arena_size;
    rr->block_bytes = 1;
    rr->num_blocks = 1;
    if (!g->client_owned) { /* a real cpu arena the client can import */
      void *region = NULL;
      oi_arena_handle h;
      REQUIRE(fs->n_arenas < FS_MAX_ARENAS);
      REQUIRE(fs->dev->ops->mem_alloc(fs->dev, g->arena_size, OI_MEM_SHAREABLE, &region) == OI_OK);
      fs->arenas[fs->n_arenas++] = region;
      REQUIRE(fs->dev->ops->mem_export(fs->dev, region, &h) == OI_OK);
      rr->arena_handle.size = OI_WIRE_HANDLE_BYTES;
      memcpy(rr->arena_handle.bytes, h.bytes, OI_WIRE_HANDLE_BYTES);
    }
    return true;
  }
  case oiwire_Envelope_save_tag:
    r->n_hashes = fs->arrays.n_hashes;
    oi__wire_set_result(&r->env, rq->request_id, OI_OK, "");
    return true;
  case oiwire_Envelope_query_tag: {
    size_t n = fs->arrays.n_hashes;
    oiwire_QueryReply *qr = &r->env.body.query_reply;
    r->n_hashes = n;
    r->env.which_body = oiwire_Envelope_query_reply_tag;
    qr->state = OI_QUERY_READY;
    uint64_t h = hits < n ? hits : n;
    if (rq->body.query.flags & OI_QUERY_MEMBERSHIP) {
      for (size_t i = 0; i < n; i++)
        r->present[i] = i < h;
      r->out.present = r->present;
      r->out.n_present = n;
    } else if (h) {
      qr->lease.size = OI_WIRE_LEASE_BYTES;
      memset(qr->lease.bytes, 0xAB, OI_WIRE_LEASE_BYTES);
    }
    qr->hit_blocks = h;
    return true;
  }
  case oiwire_Envelope_stats_tag:
    r->env.which_body = oiwire_Envelope_stats_reply_tag;
    r->env.body.stats_reply.instance_id = rq->body.stats.instance_id;
    r->env.body.stats_reply.block_bytes = 1;
    r->env.body.stats_reply.num_blocks = 1;
    return true;
  case oiwire_Envelope_load_tag:
    r->n_hashes = fs->arrays.n_ids;
    oi__wire_set_result(&r->env, rq->request_id, OI_OK, "");
    return true;
  case oiwire_Envelope_release_tag:
  case oiwire_Envelope_flush_tag:
  case oiwire_Envelope_unregister_tag:
    oi__wire_set_result(&r->env, rq->request_id, OI_OK, "");
    return true;
  default:
    oi__wire_set_result(&r->env, rq->request_id, OI_ERR_UNSUPPORTED,
                        "the fake server does not know this request");
    return true;
  }
}

/* ---- requests ------------------------------------------------------------------------- */

/* Takes the next step for `type` (FS_REPLY when none is queued). */
static fs_queued take_step(fake_server *fs, uint32_t type) {
  fs_queued q;
  memset(&q, 0, sizeof q);
  pthread_mutex_lock(&fs->lock);
  if (fs->next_step[type] < fs->n_steps[type]) q = fs->steps[type][fs->next_step[type]++];
  pthread_mutex_unlock(&fs->lock);
  q.step.message = q.message;
  return q;
}

/* A step that is not a reply; @return true when it was one of those. */
static bool common_step(fake_server *fs, int i, uint64_t req, const fs_queued *q) {
  switch (q->step.action) {
  case FS_SILENT: return true;
  case FS_RESULT:
    send_result(fs, i, req, q->step.status, q->message, q->step.delay_ms);
    return true;
  case FS_REFUSE:
    send_result(fs, i, 0, q->step.status, q->message, 0);
    conn_close(fs, i);
    return true;
  case FS_CLOSE: conn_close(fs, i); return true;
  case FS_GARBAGE: {
    /* A field of wire type 7, which does not exist. */
    static const uint8_t junk[] = {5, 0, 0, 0, 0x0f, 0xff, 0xff, 0xff, 0xff};
    (void)oi__wire_send(fs->conns[i].fd, junk, sizeof junk);
    return true;
  }
  case FS_OVERSIZE: {
    static const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3};
    (void)oi__wire_send(fs->conns[i].fd, huge, sizeof huge);
    return true;
  }
  case FS_TRUNCATED: {
    static const uint8_t half[] = {40, 0, 0, 0, 0x08, 0x01, 0x7a, 0x05};
    (void)oi__wire_send(fs->conns[i].fd, half, sizeof half);
    conn_close(fs, i);
    return true;
  }
  default: return false;
  }
}

static void handle_request(fake_server *fs, int i) {
  uint32_t type = fs->env.which_body < FS_TYPES ? fs->env.which_body : 0;
  pthread_mutex_lock(&fs->lock);
  fs->seen[type]++;
  fs->last[type] = fs->env;
  fs->have_last[type] = true;
  uint64_t caps = fs->caps, hits = fs->hits;
  pthread_cond_broadcast(&fs->cv);
  pthread_mutex_unlock(&fs->lock);
  fs_queued q = take_step(fs, type);
  uint64_t req = fs->env.request_id;
  for (uint32_t k = 1; type == oiwire_Envelope_load_tag && k <= q.step.progress; k++) {
    oiwire_Envelope pe;
    memset(&pe, 0, sizeof pe);
    pe.request_id = req;
    pe.which_body = oiwire_Envelope_load_progress_tag;
    pe.body.load_progress.arenas_done = k;
    send_env(fs, i, &pe, NULL, 0);
  }
  if (common_step(fs, i, req, &q)) return;
  if (!default_reply(fs, caps, hits)) return;
  bool counts = type == oiwire_Envelope_save_tag && fs->env.body.save.want_counts;
  if (counts) { /* SaveCounts first, as the real server does */
    oiwire_Envelope c;
    memset(&c, 0, sizeof c);
    c.request_id = req;
    c.which_body = oiwire_Envelope_save_counts_tag;
    c.body.save_counts.accepted = fs->reply.n_hashes;
    send_env(fs, i, &c, NULL, q.step.delay_ms);
    if (q.step.action == FS_COUNTS_ONLY) return;
  }
  if (q.step.edit) q.step.edit(&fs->reply);
  send_env(fs, i, &fs->reply.env, &fs->reply.out, q.step.delay_ms);
  if (q.step.close_after) conn_close(fs, i);
}

static void accept_one(fake_server *fs) {
  int fd = accept4(fs->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) return;
  int i = 0;
  while (i < FS_MAX_CONNS && fs->conns[i].fd >= 0)
    i++;
  REQUIRE(i < FS_MAX_CONNS);
  fs->conns[i] = (fs_conn){.fd = fd, .gen = ++fs->next_gen};
  pthread_mutex_lock(&fs->lock);
  fs->seen[FS_ACCEPT]++;
  fs->open_conns++;
  pthread_cond_broadcast(&fs->cv);
  pthread_mutex_unlock(&fs->lock);
  fs_queued q = take_step(fs, FS_ACCEPT);
  common_step(fs, i, 0, &q); /* FS_REPLY: nothing to say before the Hello */
}

static void read_one(fake_server *fs, int i) {
  size_t len = 0;
  int passed = -1, extra = 0;
  oi_status st = oi__wire_recv_fd(fs->conns[i].fd, OI_WIRE_MAX_FRAME, &fs->buf, &fs->cap, &len,
                                  &passed, &extra);
  if (passed >= 0) {
    close(passed);
    pthread_mutex_lock(&fs->lock);
    fs->fds_received++;
    pthread_mutex_unlock(&fs->lock);
  }
  if (st == OI_OK) st = oi__wire_decode(fs->buf, len, &fs->env, &fs->arrays);
  if (st != OI_OK) { /* the client left (or sent garbage: the fake never does that) */
    pthread_mutex_lock(&fs->lock);
    fs->client_closes++;
    pthread_mutex_unlock(&fs->lock);
    conn_close(fs, i);
    return;
  }
  handle_request(fs, i);
}

static void close_all(fake_server *fs, oi_status st, const char *reason) {
  for (int i = 0; i < FS_MAX_CONNS; i++) {
    if (fs->conns[i].fd < 0) continue;
    if (st != OI_OK) send_result(fs, i, 0, st, reason, 0);
    conn_close(fs, i);
  }
}

static void *fs_main(void *arg) {
  fake_server *fs = arg;
  for (;;) {
    pthread_mutex_lock(&fs->lock);
    bool stop = fs->stop, close_req = fs->close_req;
    oi_status close_st = fs->close_status;
    char reason[256];
    snprintf(reason, sizeof reason, "%s", fs->close_reason);
    pthread_mutex_unlock(&fs->lock);
    if (stop) break;
    if (close_req) {
      close_all(fs, close_st, reason);
      pthread_mutex_lock(&fs->lock);
      fs->close_req = false;
      fs->close_done++;
      pthread_cond_broadcast(&fs->cv);
      pthread_mutex_unlock(&fs->lock);
    }
    int timeout = send_due(fs);
    if (timeout < 0 || timeout > 100) timeout = 100;
    struct pollfd p[FS_MAX_CONNS + 2];
    int who[FS_MAX_CONNS + 2];
    int n = 0;
    p[n] = (struct pollfd){.fd = fs->wake[0], .events = POLLIN};
    who[n++] = -2;
    p[n] = (struct pollfd){.fd = fs->listen_fd, .events = POLLIN};
    who[n++] = -1;
    for (int i = 0; i < FS_MAX_CONNS; i++)
      if (fs->conns[i].fd >= 0) {
        p[n] = (struct pollfd){.fd = fs->conns[i].fd, .events = POLLIN};
        who[n++] = i;
      }
    int rc = poll(p, (nfds_t)n, timeout);
    if (rc <= 0) continue;
    for (int k = 0; k < n; k++) {
      if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (who[k] == -2) {
        char b[64];
        (void)!read(fs->wake[0], b, sizeof b);
      } else if (who[k] == -1) {
        accept_one(fs);
      } else if (fs->conns[who[k]].fd == p[k].fd) {
        read_one(fs, who[k]);
      }
    }
  }
  close_all(fs, OI_OK, NULL);
  for (int h = 0; h < FS_MAX_HELD; h++)
    if (fs->held[h].used) oi__free(fs->held[h].frame);
  return NULL;
}

/* ---- the test's side ------------------------------------------------------------------- */

static void wake(fake_server *fs) { (void)!write(fs->wake[1], "w", 1); }

fake_server *fs_start(void) {
  fake_server *fs = calloc(1, sizeof *fs);
  REQUIRE(fs != NULL);
  snprintf(fs->dir, sizeof fs->dir, "/tmp/oi-fake-XXXXXX");
  REQUIRE(mkdtemp(fs->dir) != NULL);
  snprintf(fs->path, sizeof fs->path, "%s/fake.sock", fs->dir);
  fs->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fs->listen_fd >= 0);
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", fs->path);
  REQUIRE(bind(fs->listen_fd, (struct sockaddr *)&a, sizeof a) == 0);
  REQUIRE(listen(fs->listen_fd, 16) == 0);
  REQUIRE(pipe2(fs->wake, O_CLOEXEC | O_NONBLOCK) == 0);
  for (int i = 0; i < FS_MAX_CONNS; i++)
    fs->conns[i].fd = -1;
  fs->caps = OI_WIRE_CAP_PIPELINED | OI_WIRE_CAP_MEMBERSHIP | OI_WIRE_CAP_LOOKUP |
             OI_WIRE_CAP_SAVE_COUNTS | OI_WIRE_CAP_LAYERWISE | OI_WIRE_CAP_OWNED_ARENA |
             OI_WIRE_CAP_LOAD_PROGRESS;
  fs->epoch = 0xFA4E000000000001ull;
  fs->reply.present = calloc(OI_WIRE_MAX_BLOCKS, 1);
  REQUIRE(fs->reply.present != NULL);
  REQUIRE(oi__dev_open(OI_DEVICE_CPU, &fs->dev) == OI_OK);
  pthread_mutex_init(&fs->lock, NULL);
  pthread_cond_init(&fs->cv, NULL);
  REQUIRE(pthread_create(&fs->thread, NULL, fs_main, fs) == 0);
  return fs;
}

void fs_stop(fake_server *fs) {
  pthread_mutex_lock(&fs->lock);
  fs->stop = true;
  pthread_mutex_unlock(&fs->lock);
  wake(fs);
  pthread_join(fs->thread, NULL);
  for (uint32_t i = 0; i < fs->n_arenas; i++)
    fs->dev->ops->mem_free(fs->dev, fs->arenas[i]);
  oi__dev_close(fs->dev);
  close(fs->listen_fd);
  close(fs->wake[0]);
  close(fs->wake[1]);
  unlink(fs->path);
  rmdir(fs->dir);
  oi__wire_arrays_free(&fs->arrays);
  oi__free(fs->buf);
  free(fs->reply.present);
  pthread_cond_destroy(&fs->cv);
  pthread_mutex_destroy(&fs->lock);
  free(fs);
}

const char *fs_socket(const fake_server *fs) { return fs->path; }

void fs_script(fake_server *fs, uint32_t type, fs_step step) {
  REQUIRE(type < FS_TYPES);
  pthread_mutex_lock(&fs->lock);
  REQUIRE(fs->n_steps[type] < FS_MAX_STEPS);
  fs_queued *q = &fs->steps[type][fs->n_steps[type]++];
  q->step = step;
  snprintf(q->message, sizeof q->message, "%s", step.message ? step.message : "");
  pthread_mutex_unlock(&fs->lock);
}

void fs_clear_script(fake_server *fs, uint32_t type) {
  REQUIRE(type < FS_TYPES);
  pthread_mutex_lock(&fs->lock);
  fs->n_steps[type] = fs->next_step[type] = 0;
  pthread_mutex_unlock(&fs->lock);
}

void fs_set_caps(fake_server *fs, uint64_t caps) {
  pthread_mutex_lock(&fs->lock);
  fs->caps = caps;
  pthread_mutex_unlock(&fs->lock);
}

void fs_set_hits(fake_server *fs, uint64_t hits) {
  pthread_mutex_lock(&fs->lock);
  fs->hits = hits;
  pthread_mutex_unlock(&fs->lock);
}

#define FS_GET(field)                                                                              \
  ({                                                                                               \
    pthread_mutex_lock(&fs->lock);                                                                 \
    uint32_t v_ = (field);                                                                         \
    pthread_mutex_unlock(&fs->lock);                                                               \
    v_;                                                                                            \
  })

uint32_t fs_seen(fake_server *fs, uint32_t type) {
  REQUIRE(type < FS_TYPES);
  return FS_GET(fs->seen[type]);
}
uint32_t fs_open_connections(fake_server *fs) { return FS_GET(fs->open_conns); }
uint32_t fs_client_closes(fake_server *fs) { return FS_GET(fs->client_closes); }
uint32_t fs_fds_received(fake_server *fs) { return FS_GET(fs->fds_received); }
uint32_t fs_late_sent(fake_server *fs) { return FS_GET(fs->late_sent); }

bool fs_last(fake_server *fs, uint32_t type, oiwire_Envelope *out) {
  REQUIRE(type < FS_TYPES);
  pthread_mutex_lock(&fs->lock);
  bool have = fs->have_last[type];
  if (have) *out = fs->last[type];
  pthread_mutex_unlock(&fs->lock);
  return have;
}

/* Waits (lock held) until `cond` or timeout_ms passed. */
#define FS_WAIT(cond, timeout_ms)                                                                  \
  ({                                                                                               \
    uint64_t end_ = oi__now_ns() + (uint64_t)(timeout_ms)*1000000ull;                              \
    pthread_mutex_lock(&fs->lock);                                                                 \
    while (!(cond) && oi__now_ns() < end_) {                                                       \
      pthread_mutex_unlock(&fs->lock);                                                             \
      usleep(2000);                                                                                \
      pthread_mutex_lock(&fs->lock);                                                               \
    }                                                                                              \
    bool ok_ = (cond);                                                                             \
    pthread_mutex_unlock(&fs->lock);                                                               \
    ok_;                                                                                           \
  })

bool fs_wait_seen(fake_server *fs, uint32_t type, uint32_t n, uint32_t timeout_ms) {
  REQUIRE(type < FS_TYPES);
  return FS_WAIT(fs->seen[type] >= n, timeout_ms);
}

bool fs_wait_no_connections(fake_server *fs, uint32_t timeout_ms) {
  return FS_WAIT(fs->open_conns == 0, timeout_ms);
}

void fs_close_all(fake_server *fs, oi_status status, const char *reason) {
  pthread_mutex_lock(&fs->lock);
  uint64_t want = fs->close_done + 1;
  fs->close_req = true;
  fs->close_status = status;
  snprintf(fs->close_reason, sizeof fs->close_reason, "%s", reason ? reason : "");
  pthread_mutex_unlock(&fs->lock);
  wake(fs);
  REQUIRE(FS_WAIT(fs->close_done >= want, 5000));
}
