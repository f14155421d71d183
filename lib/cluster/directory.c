/* The cluster tier's block directory in Redis: see directory.h and
 * docs/cluster.md.
 *
 * Connections come in two sides (`side`): the background thread's `bs` and
 * the synchronous calls' `ss`. A side holds one node for a single instance,
 * or a Redis Cluster's masters and its slot map; side_exec runs a round of
 * commands over a side, each to the master of its key's slot, pipelined,
 * following redirections.
 *
 * Locks: `lock` guards the queue, the advertised address, the thread's
 * wake-up flags and last_error; `sync_lock` guards the synchronous side
 * and its argument buffers. sync_lock may be held while taking lock, never
 * the reverse. The background side `bs` and the script's sha are the
 * background thread's alone (and oi__dir_open's before it starts,
 * oi__dir_close's after it ended). Counters are relaxed atomics.
 *
 * hiredis writes with write(2): a peer that went away raises SIGPIPE. Every
 * round trip runs with SIGPIPE blocked in the calling thread, and a SIGPIPE
 * it raised is consumed before the mask is restored. */
#include "cluster/directory.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 2000u
#define PIPELINE 1024u /* commands appended before their replies are read */

/* KEYS[1]: the entry; ARGV[1]: the value it must still hold to be deleted. */
static const char CAS_DEL[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

enum { Q_PUBLISH = 1, Q_UNPUBLISH = 2 };

typedef struct qent {
  oi_tier_key key;
  uint8_t op;
} qent;

/* One Redis server the directory talks to: the single instance, or one
 * master of a Redis Cluster. */
typedef struct rnode {
  char host[256]; /* or the socket path when port is 0 */
  int port;
  redisContext *c; /* NULL: not connected */
  uint32_t sent;   /* commands appended in the current round */
} rnode;

/* A command of a round (side_exec): the caller's index, its key's slot, the
 * node it goes to, whether ASKING goes first. */
typedef struct xitem {
  uint32_t i;
  uint16_t slot;
  int16_t node;
  uint8_t asking;
} xitem;

/* One set of connections: the background thread's or the synchronous
 * calls'. Single instance: one node, no slot map. Cluster: the masters, and
 * slots[s] the index of the master serving slot s (-1: none known). */
typedef struct side {
  rnode *nodes;
  size_t n_nodes, nodes_cap;
  int16_t *slots; /* OI_DIR_SLOTS entries; NULL for a single instance */
  bool up;        /* opened (side_open) and not lost since */
  bool stale;     /* a MOVED was followed: reload the slot map */
  xitem *it, *it2;
  size_t it_cap, it2_cap;
} side;

#define SEEDS_MAX 16u
#define NODES_MAX 1024u
#define REDIRECT_ROUNDS 5

struct oi_dir {
  oi_dir_options o; /* url and node_id point at the copies below */
  char *url, *node_id;
  bool cluster; /* redis+cluster:// */
  char host[256];
  int port;
  char unix_path[108];
  uint32_t db;
  struct {
    char host[256];
    int port;
  } seeds[SEEDS_MAX]; /* cluster: the addresses of the url */
  size_t n_seeds;
  char self_val[OI_DIR_NODE_ID_MAX + 24]; /* "<node_id> <epoch>" */
  char node_key[OI_DIR_NODE_ID_MAX + 16]; /* "oi:node:<node_id>" */

  pthread_mutex_t lock;
  pthread_cond_t cv;      /* wakes the thread (CLOCK_MONOTONIC) */
  pthread_cond_t done_cv; /* q_done advanced */
  qent *q, *q2;           /* q: producers append; q2: the thread's batch */
  size_t q_len, q_cap, q2_cap;
  uint64_t q_seq, q_done; /* entries given; entries sent, lost or dropped */
  char *advertise;
  bool advertise_dirty, check, stop;
  char last_error[OI_DIR_ERROR_TEXT];
  pthread_t thread;
  bool thread_ok;

  side bs; /* the background thread's */
  char sha[41];

  pthread_mutex_t sync_lock;
  side ss;           /* the synchronous calls' */
  uint64_t sync_gen; /* the generation `ss` was opened in */
  char *keybuf;
  size_t keybuf_cap;
  const char **argv;
  size_t *argvlen;
  size_t argv_cap, argvlen_cap;
  uint8_t *found;
  size_t found_cap;

  _Atomic bool connected;
  _Atomic uint64_t generation, reconnects, published, unpublished, unpublish_missed, stale_removed,
      lookups, lookup_keys, entries_found, parse_failures, queue_dropped, errors, lookup_ns_sum,
      redirects;
  oi_latency_hist lookup_hist;
};

#define ADD(field, v) atomic_fetch_add_explicit(&d->field, (v), memory_order_relaxed)

/* ---- formats ---- */

static bool node_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

static bool node_id_valid(const char *s, size_t len) {
  if (len == 0 || len > OI_DIR_NODE_ID_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if (!node_id_char(s[i])) return false;
  return true;
}

static bool addr_valid(const char *s, size_t len) {
  if (len == 0 || len > OI_DIR_ADDR_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) return false;
  return true;
}

/* Decimal digits of a uint64_t (no sign, no leading '+', no overflow). */
static bool parse_u64(const char *s, size_t len, uint64_t *out) {
  if (len == 0 || len > 20) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    uint64_t digit = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

void oi__dir_key_format(const oi_tier_key *key, char out[OI_DIR_KEY_CHARS + 1]) {
  static const char hex[] = "0123456789abcdef";
  char *p = out;
  memcpy(p, "oi:b:", 5);
  p += 5;
  for (int i = 15; i >= 0; i--)
    *p++ = hex[(key->ns_fp >> (4 * i)) & 15];
  *p++ = ':';
  for (int i = 0; i < 16; i++) {
    *p++ = hex[key->hash[i] >> 4];
    *p++ = hex[key->hash[i] & 15];
  }
  *p++ = ':';
  for (int i = 15; i >= 0; i--)
    *p++ = hex[(key->layout_fp >> (4 * i)) & 15];
  *p = '\0';
}

bool oi__dir_holder_parse(const char *s, size_t len, oi_dir_holder *out) {
  if (!s) return false;
  const char *sp = memchr(s, ' ', len);
  if (!sp) return false;
  size_t id_len = (size_t)(sp - s);
  if (!node_id_valid(s, id_len)) return false;
  uint64_t epoch;
  if (!parse_u64(sp + 1, len - id_len - 1, &epoch)) return false;
  memcpy(out->node_id, s, id_len);
  out->node_id[id_len] = '\0';
  out->epoch = epoch;
  return true;
}

bool oi__dir_liveness_parse(const char *s, size_t len, uint64_t *epoch, size_t *addr_off,
                            size_t *addr_len) {
  if (!s) return false;
  const char *sp = memchr(s, ' ', len);
  uint64_t e;
  size_t alen = sp ? len - (size_t)(sp - s) - 1 : 0;
  if (!sp || !parse_u64(s, (size_t)(sp - s), &e) || !addr_valid(sp + 1, alen)) return false;
  *epoch = e;
  *addr_off = (size_t)(sp - s) + 1;
  *addr_len = alen;
  return true;
}

/* "HOST[:PORT]" at p, ending at '/', ',' or the end (*endp: there). */
static oi_status parse_hostport(const char *url, const char *p, const char **endp, char *hostbuf,
                                size_t cap, int *port_out, const char *help) {
  const char *host = p, *host_end;
  if (*p == '[') {
    host = p + 1;
    host_end = strchr(host, ']');
    if (!host_end)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': '[' without ']' (%s)", url,
                      help);
    p = host_end + 1;
  } else {
    host_end = p + strcspn(p, ":/,");
    p = host_end;
  }
  size_t host_len = (size_t)(host_end - host);
  if (host_len == 0 || host_len >= cap)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': %s host (%s)", url,
                    host_len ? "an overlong" : "no", help);
  for (size_t i = 0; i < host_len; i++)
    if (!node_id_char(host[i]) && host[i] != ':')
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the host has a character '%c' no host name or "
                      "address has (%s)",
                      url, host[i], help);
  memcpy(hostbuf, host, host_len);
  hostbuf[host_len] = '\0';
  *port_out = 6379;
  if (*p == ':') {
    p++;
    size_t len = strcspn(p, "/,");
    uint64_t port;
    if (!parse_u64(p, len, &port) || port == 0 || port > 65535)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the port is not a number in 1..65535 (%s)", url, help);
    *port_out = (int)port;
    p += len;
  }
  *endp = p;
  return OI_OK;
}

/* "redis://HOST[:PORT][/DB]", "unix:/PATH[?db=DB]" or
 * "redis+cluster://HOST[:PORT][,HOST[:PORT]...]" into d. */
static oi_status parse_url(oi_dir *d, const char *url) {
  static const char help[] = "expected redis://HOST[:PORT][/DB], unix:/PATH[?db=DB] or "
                             "redis+cluster://HOST[:PORT][,HOST[:PORT]...]";
  const char *p;
  if (strncmp(url, "unix:", 5) == 0) {
    p = url + 5;
    const char *q = strchr(p, '?');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    if (len < 2 || p[0] != '/')
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the socket path must be absolute (%s)", url, help);
    if (len >= sizeof(d->unix_path))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the socket path is longer than %zu bytes", url,
                      sizeof(d->unix_path) - 1);
    memcpy(d->unix_path, p, len);
    d->unix_path[len] = '\0';
    if (q) {
      uint64_t db;
      if (strncmp(q, "?db=", 4) != 0 || !parse_u64(q + 4, strlen(q + 4), &db) || db > 1000000)
        return oi__fail(OI_ERR_INVALID_ARGUMENT,
                        "directory url '%s': '%s' is not ?db=N with N a database number (%s)", url,
                        q, help);
      d->db = (uint32_t)db;
    }
    return OI_OK;
  }
  if (strncmp(url, "redis+cluster://", 16) == 0) {
    d->cluster = true;
    p = url + 16;
    if (strchr(p, '@'))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': credentials in the url are not supported; protect "
                      "Redis by network (bind, firewall)",
                      url);
    for (;;) {
      if (d->n_seeds == SEEDS_MAX)
        return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': more than %u addresses", url,
                        SEEDS_MAX);
      oi_status st = parse_hostport(url, p, &p, d->seeds[d->n_seeds].host, sizeof d->seeds[0].host,
                                    &d->seeds[d->n_seeds].port, help);
      if (st != OI_OK) return st;
      d->n_seeds++;
      if (*p != ',') break;
      p++;
    }
    if (*p == '/' && (p[1] == '\0' || strcmp(p + 1, "0") == 0)) p += strlen(p);
    if (*p)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': unexpected '%s' (a Redis Cluster has database 0 "
                      "only; %s)",
                      url, p, help);
    return OI_OK;
  }
  if (strncmp(url, "redis://", 8) != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': unknown scheme (%s)", url, help);
  p = url + 8;
  if (strchr(p, '@'))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory url '%s': credentials in the url are not supported; protect "
                    "Redis by network (bind, firewall)",
                    url);
  oi_status st = parse_hostport(url, p, &p, d->host, sizeof d->host, &d->port, help);
  if (st != OI_OK) return st;
  if (*p == '/') {
    p++;
    uint64_t db = 0;
    if (*p && (!parse_u64(p, strlen(p), &db) || db > 1000000))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': '%s' is not a database number (%s)", url, p, help);
    d->db = (uint32_t)db;
  } else if (*p) {
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': unexpected '%s' (%s)", url, p,
                    help);
  }
  return OI_OK;
}

/* ---- Redis Cluster slots ---- */

uint16_t oi__dir_crc16(const char *s, size_t len) {
  uint16_t crc = 0; /* CRC-16/XMODEM: polynomial 0x1021, initial 0, no reflection */
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((uint16_t)(unsigned char)s[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (uint16_t)((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

uint16_t oi__dir_key_slot(const char *key, size_t len) {
  const char *open = memchr(key, '{', len);
  if (open) { /* a hash tag: the bytes between the first '{' and the next '}', when not empty */
    size_t off = (size_t)(open - key) + 1;
    const char *close = memchr(key + off, '}', len - off);
    if (close && close > key + off)
      return oi__dir_crc16(key + off, (size_t)(close - key - off)) & (OI_DIR_SLOTS - 1);
  }
  return oi__dir_crc16(key, len) & (OI_DIR_SLOTS - 1);
}

/* ---- errors, signals ---- */

static void note_error(oi_dir *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(oi_dir *d, const char *fmt, ...) {
  char buf[OI_DIR_ERROR_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  ADD(errors, 1);
  pthread_mutex_lock(&d->lock);
  memcpy(d->last_error, buf, sizeof buf);
  pthread_mutex_unlock(&d->lock);
}

typedef struct sigpipe_guard {
  sigset_t old;
  bool pending_before;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
  sigpending(&pending);
  g->pending_before = sigismember(&pending, SIGPIPE) == 1;
}

static void sigpipe_restore(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigpending(&pending);
  if (!g->pending_before && sigismember(&pending, SIGPIPE) == 1) {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---- connections ---- */

/* The reason of a failure, cut to cap bytes. */
static void errf(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
}

static struct timeval ms_tv(uint32_t ms) {
  struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* A connection to host:port (port 0: the socket path `host`) with the
 * timeouts set and the database selected; NULL with the reason in err.
 * SIGPIPE must be blocked. */
static redisContext *dir_connect(oi_dir *d, const char *host, int port, char *err, size_t cap) {
  struct timeval tv = ms_tv(d->o.timeout_ms);
  redisContext *c =
      port ? redisConnectWithTimeout(host, port, tv) : redisConnectUnixWithTimeout(host, tv);
  if (!c) {
    errf(err, cap, "connect: out of memory");
    return NULL;
  }
  if (c->err) {
    errf(err, cap, "connect %.60s:%d: %.60s", host, port, c->errstr);
    redisFree(c);
    return NULL;
  }
  if (redisSetTimeout(c, tv) != REDIS_OK) {
    errf(err, cap, "setting the socket timeout: %.80s", c->errstr);
    redisFree(c);
    return NULL;
  }
  if (d->db) {
    redisReply *r = redisCommand(c, "SELECT %u", d->db);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok)
      errf(err, cap, "SELECT %u: %.80s", d->db,
           r ? (r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply") : c->errstr);
    if (r) freeReplyObject(r);
    if (!ok) {
      redisFree(c);
      return NULL;
    }
  }
  return c;
}

/* Closes every connection of the side (the slot map stays). */
static void side_drop(side *s) {
  for (size_t i = 0; i < s->n_nodes; i++)
    if (s->nodes[i].c) {
      redisFree(s->nodes[i].c);
      s->nodes[i].c = NULL;
    }
  s->up = false;
}

static void side_free(side *s) {
  side_drop(s);
  oi__free(s->nodes);
  oi__free(s->slots);
  oi__free(s->it);
  oi__free(s->it2);
  memset(s, 0, sizeof *s);
}

/* The index of node host:port, added when new; -1 when the table is full. */
static int node_index(side *s, const char *host, int port) {
  for (size_t i = 0; i < s->n_nodes; i++)
    if (s->nodes[i].port == port && strcmp(s->nodes[i].host, host) == 0) return (int)i;
  if (s->n_nodes >= NODES_MAX ||
      !oi__grow((void **)&s->nodes, &s->nodes_cap, s->n_nodes + 1, sizeof(rnode), NODES_MAX))
    return -1;
  rnode *n = &s->nodes[s->n_nodes];
  memset(n, 0, sizeof *n);
  snprintf(n->host, sizeof n->host, "%s", host);
  n->port = port;
  return (int)s->n_nodes++;
}

/* Reads the slot map with CLUSTER SLOTS on `c` (connected to `host`, which
 * stands for an empty address in the reply). Masters that still serve a
 * slot keep their connection; the others are closed and forgotten. */
static bool side_load_map(oi_dir *d, side *s, redisContext *c, const char *via, char *err,
                          size_t cap) {
  char host[256]; /* `via` may be a node's, which the table's growth moves */
  snprintf(host, sizeof host, "%s", via);
  redisReply *r = redisCommand(c, "CLUSTER SLOTS");
  if (!r) {
    errf(err, cap, "CLUSTER SLOTS: %.100s", c->errstr);
    return false;
  }
  if (r->type != REDIS_REPLY_ARRAY) {
    errf(err, cap, "CLUSTER SLOTS: %.100s",
         r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    freeReplyObject(r);
    return false;
  }
  if (!s->slots) {
    s->slots = oi__malloc(OI_DIR_SLOTS * sizeof *s->slots);
    if (!s->slots) {
      errf(err, cap, "out of memory");
      freeReplyObject(r);
      return false;
    }
  }
  /* Mark the nodes the new map names, then compact the table. */
  size_t old_n = s->n_nodes;
  bool *used = oi__calloc(NODES_MAX, sizeof *used);
  int16_t *map = oi__malloc(OI_DIR_SLOTS * sizeof *map);
  bool ok = used && map;
  if (!ok) errf(err, cap, "out of memory");
  for (size_t i = 0; i < OI_DIR_SLOTS && map; i++)
    map[i] = -1;
  for (size_t i = 0; ok && i < r->elements; i++) {
    redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
        e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
        e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        e->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      errf(err, cap, "CLUSTER SLOTS: an entry that is not [start, end, [host, port, ...]]");
      ok = false;
      break;
    }
    long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    const char *h = e->element[2]->element[0]->str;
    long long port = e->element[2]->element[1]->integer;
    if (lo < 0 || hi >= OI_DIR_SLOTS || lo > hi || port <= 0 || port > 65535) {
      errf(err, cap, "CLUSTER SLOTS: a range or port out of bounds");
      ok = false;
      break;
    }
    int idx = node_index(s, h[0] ? h : host, (int)port);
    if (idx < 0) {
      errf(err, cap, "CLUSTER SLOTS: more than %u masters", NODES_MAX);
      ok = false;
      break;
    }
    used[idx] = true;
    for (long long k = lo; k <= hi; k++)
      map[k] = (int16_t)idx;
  }
  freeReplyObject(r);
  if (!ok) {
    /* forget nodes the failed read added */
    for (size_t i = old_n; i < s->n_nodes; i++)
      if (s->nodes[i].c) redisFree(s->nodes[i].c);
    s->n_nodes = old_n;
    oi__free(used);
    oi__free(map);
    return false;
  }
  int16_t remap[NODES_MAX];
  size_t w = 0;
  for (size_t i = 0; i < s->n_nodes; i++) {
    if (!used[i]) {
      if (s->nodes[i].c) redisFree(s->nodes[i].c);
      remap[i] = -1;
      continue;
    }
    remap[i] = (int16_t)w;
    if (w != i) s->nodes[w] = s->nodes[i];
    w++;
  }
  s->n_nodes = w;
  for (size_t k = 0; k < OI_DIR_SLOTS; k++)
    s->slots[k] = map[k] < 0 ? -1 : remap[map[k]];
  oi__free(used);
  oi__free(map);
  s->stale = false;
  (void)d;
  return true;
}

/* Loads the compare-and-delete script on `c` into d->sha. false when the
 * connection failed (an error reply leaves sha empty: EVAL then). */
static bool load_script(oi_dir *d, redisContext *c, char *err, size_t cap) {
  redisReply *r = redisCommand(c, "SCRIPT LOAD %s", CAS_DEL);
  if (!r) {
    errf(err, cap, "SCRIPT LOAD: %.100s", c->errstr);
    return false;
  }
  if (r->type == REDIS_REPLY_STRING && r->len == 40) {
    memcpy(d->sha, r->str, 40);
    d->sha[40] = '\0';
  }
  freeReplyObject(r);
  return true;
}

/* Whether node n's CLUSTER INFO says cluster_state:ok (why not in err). */
static bool cluster_ok(rnode *n, char *err, size_t cap) {
  redisReply *r = redisCommand(n->c, "CLUSTER INFO");
  bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
  if (!r)
    errf(err, cap, "CLUSTER INFO at %.60s:%d: %.60s", n->host, n->port, n->c->errstr);
  else if (r->type == REDIS_REPLY_ERROR)
    errf(err, cap, "CLUSTER INFO at %.60s:%d: %.60s (not a Redis Cluster?)", n->host, n->port,
         r->str);
  else if (!ok)
    errf(err, cap, "%.60s:%d: the cluster is not ok (cluster_state is not ok)", n->host, n->port);
  if (r) freeReplyObject(r);
  return ok;
}

/* Opens the side: a single instance's connection, or (cluster) the slot map
 * read from the first address of the url or of the masters known before
 * that answers with cluster_state:ok, then a connection to every master.
 * `script`: load the compare-and-delete script on each. SIGPIPE must be
 * blocked. */
static bool side_open(oi_dir *d, side *s, bool script, char *err, size_t cap) {
  side_drop(s);
  if (script) d->sha[0] = '\0';
  if (!d->cluster) {
    if (s->n_nodes == 0) {
      int idx = d->unix_path[0] ? node_index(s, d->unix_path, 0) : node_index(s, d->host, d->port);
      if (idx < 0) {
        errf(err, cap, "out of memory");
        return false;
      }
    }
    rnode *n = &s->nodes[0];
    n->c = dir_connect(d, n->host, n->port, err, cap);
    if (!n->c) return false;
    if (script && !load_script(d, n->c, err, cap)) {
      side_drop(s);
      return false;
    }
    s->up = true;
    return true;
  }
  /* the candidates: the url's addresses, then the masters known before */
  size_t n_cand = d->n_seeds + OI_MIN(s->n_nodes, (size_t)NODES_MAX);
  struct cand {
    char host[256];
    int port;
  } *cand = oi__malloc(n_cand * sizeof *cand);
  if (!cand) {
    errf(err, cap, "out of memory");
    return false;
  }
  for (size_t i = 0; i < d->n_seeds; i++) {
    memcpy(cand[i].host, d->seeds[i].host, sizeof cand[i].host);
    cand[i].port = d->seeds[i].port;
  }
  for (size_t i = d->n_seeds; i < n_cand; i++) {
    memcpy(cand[i].host, s->nodes[i - d->n_seeds].host, sizeof cand[i].host);
    cand[i].port = s->nodes[i - d->n_seeds].port;
  }
  bool mapped = false;
  for (size_t i = 0; i < n_cand && !mapped; i++) {
    redisContext *c = dir_connect(d, cand[i].host, cand[i].port, err, cap);
    if (!c) continue;
    rnode probe = {.port = cand[i].port, .c = c};
    memcpy(probe.host, cand[i].host, sizeof probe.host);
    if (!cluster_ok(&probe, err, cap)) {
      redisFree(c);
      continue;
    }
    mapped = side_load_map(d, s, c, cand[i].host, err, cap);
    if (mapped) { /* keep the connection when it is a master's */
      int idx = -1;
      for (size_t k = 0; k < s->n_nodes; k++)
        if (s->nodes[k].port == cand[i].port && strcmp(s->nodes[k].host, cand[i].host) == 0)
          idx = (int)k;
      if (idx >= 0 && !s->nodes[idx].c) {
        s->nodes[idx].c = c;
        c = NULL;
      }
    }
    if (c) redisFree(c);
  }
  oi__free(cand);
  if (!mapped) return false;
  if (s->n_nodes == 0) {
    errf(err, cap, "CLUSTER SLOTS: no slot is served");
    return false;
  }
  /* Every master must say the cluster is ok, as the background beat
   * checks: masters that disagree for a while (a master back from a
   * failure) would otherwise make the directory connect and degrade in
   * turn, each connect a new generation. */
  for (size_t k = 0; k < s->n_nodes; k++) {
    rnode *n = &s->nodes[k];
    if (!n->c) n->c = dir_connect(d, n->host, n->port, err, cap);
    if (!n->c || !cluster_ok(n, err, cap) || (script && !load_script(d, n->c, err, cap))) {
      side_drop(s);
      return false;
    }
  }
  s->up = true;
  return true;
}

/* ---- rounds of pipelined commands over the side's nodes ---- */

enum { XR_OK, XR_LOST, XR_DOWN };
enum { R_DONE, R_RETRY, R_KEPT };

typedef struct xops {
  /* The key of command i (its slot picks the node). */
  const char *(*key)(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_CHARS + 24]);
  /* Appends command i to c. */
  void (*append)(oi_dir *d, void *ctx, size_t i, redisContext *c);
  /* The final reply of command i (NULL: redirections did not settle; the
   * error is noted). R_RETRY sends it again (NOSCRIPT), R_KEPT keeps r. */
  int (*reply)(oi_dir *d, void *ctx, size_t i, redisReply *r);
  void *ctx;
} xops;

/* "MOVED|ASK <slot> <host>:<port>" into slot, host, port; an empty host is
 * `deflt`. */
static bool parse_redirect(const char *s, uint16_t *slot, char *host, size_t cap, int *port,
                           const char *deflt) {
  const char *sp = strchr(s, ' ');
  if (!sp) return false;
  const char *sp2 = strchr(sp + 1, ' ');
  if (!sp2) return false;
  uint64_t v, p;
  if (!parse_u64(sp + 1, (size_t)(sp2 - sp - 1), &v) || v >= OI_DIR_SLOTS) return false;
  const char *colon = strrchr(sp2 + 1, ':');
  if (!colon || !parse_u64(colon + 1, strlen(colon + 1), &p) || p == 0 || p > 65535) return false;
  size_t hl = (size_t)(colon - sp2 - 1);
  if (hl >= cap) return false;
  if (hl == 0)
    snprintf(host, cap, "%s", deflt);
  else {
    memcpy(host, sp2 + 1, hl);
    host[hl] = '\0';
  }
  *slot = (uint16_t)v;
  *port = (int)p;
  return true;
}

static bool is_err(redisReply *r, const char *prefix) {
  return r->type == REDIS_REPLY_ERROR && strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/* Sends commands 0..n-1, each to the master of its key's slot (a single
 * instance: its one node), pipelined: every node's commands are written
 * before any reply is read, so a round costs one round trip however many
 * nodes it spans. MOVED updates the slot map (reloaded at the end) and
 * sends the command again where it points; ASK sends ASKING and the command
 * there; TRYAGAIN sends it again after 10 ms; at most REDIRECT_ROUNDS
 * rounds. XR_LOST: a connection failed (the side must be dropped; what was
 * not answered is not given to ops->reply). XR_DOWN: CLUSTERDOWN, or a slot
 * no master serves. err: the reason. SIGPIPE must be blocked. */
static int side_exec(oi_dir *d, side *s, size_t n, const xops *x, char *err, size_t cap) {
  if (!oi__grow((void **)&s->it, &s->it_cap, n, sizeof(xitem), SIZE_MAX / sizeof(xitem)) ||
      !oi__grow((void **)&s->it2, &s->it2_cap, n, sizeof(xitem), SIZE_MAX / sizeof(xitem))) {
    errf(err, cap, "out of memory");
    return XR_LOST;
  }
  int rc = XR_OK;
  for (size_t k = 0; k < n; k++) {
    uint16_t slot = 0;
    int node = 0;
    if (s->slots) {
      char buf[OI_DIR_KEY_CHARS + 24];
      const char *key = x->key(d, x->ctx, k, buf);
      slot = oi__dir_key_slot(key, strlen(key));
      node = s->slots[slot];
      if (node < 0) {
        errf(err, cap, "no master serves slot %u", slot);
        return XR_DOWN;
      }
    }
    s->it[k] = (xitem){.i = (uint32_t)k, .slot = slot, .node = (int16_t)node};
  }
  size_t pend = n;
  bool tryagain = false;
  for (int round = 0; pend && round <= REDIRECT_ROUNDS; round++) {
    if (tryagain) {
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
      tryagain = false;
    }
    for (size_t k = 0; k < pend; k++) {
      rnode *nd = &s->nodes[s->it[k].node];
      if (!nd->c) {
        nd->c = dir_connect(d, nd->host, nd->port, err, cap);
        if (!nd->c) return XR_LOST;
      }
    }
    for (size_t k = 0; k < s->n_nodes; k++)
      s->nodes[k].sent = 0;
    for (size_t k = 0; k < pend; k++) {
      rnode *nd = &s->nodes[s->it[k].node];
      if (s->it[k].asking) redisAppendCommand(nd->c, "ASKING");
      x->append(d, x->ctx, s->it[k].i, nd->c);
      nd->sent++;
    }
    for (size_t k = 0; k < s->n_nodes; k++) {
      rnode *nd = &s->nodes[k];
      int done = 0;
      while (nd->sent && !done)
        if (redisBufferWrite(nd->c, &done) != REDIS_OK) {
          errf(err, cap, "%.60s:%d: %.80s", nd->host, nd->port, nd->c->errstr);
          return XR_LOST;
        }
    }
    size_t next = 0;
    for (size_t k = 0; k < pend; k++) {
      xitem it = s->it[k];
      rnode *nd = &s->nodes[it.node];
      void *v = NULL;
      if (it.asking) {
        if (redisGetReply(nd->c, &v) != REDIS_OK || !v) goto lost;
        freeReplyObject(v);
        v = NULL;
      }
      if (redisGetReply(nd->c, &v) != REDIS_OK || !v) goto lost;
      redisReply *r = v;
      if (s->slots && (is_err(r, "MOVED ") || is_err(r, "ASK "))) {
        bool ask = is_err(r, "ASK ");
        char host[256];
        int port;
        uint16_t slot;
        int idx = -1;
        if (parse_redirect(r->str, &slot, host, sizeof host, &port, nd->host))
          idx = node_index(s, host, port);
        if (idx < 0) {
          errf(err, cap, "a redirection that does not parse or leads too far: %.80s", r->str);
          freeReplyObject(r);
          rc = XR_DOWN;
          continue;
        }
        ADD(redirects, 1);
        if (!ask) {
          s->slots[slot] = (int16_t)idx;
          s->stale = true;
        }
        s->it2[next++] = (xitem){.i = it.i, .slot = it.slot, .node = (int16_t)idx, .asking = ask};
        freeReplyObject(r);
        continue;
      }
      if (s->slots && is_err(r, "TRYAGAIN")) {
        tryagain = true;
        s->it2[next++] = it;
        freeReplyObject(r);
        continue;
      }
      if (is_err(r, "CLUSTERDOWN")) {
        errf(err, cap, "%.60s:%d: %.80s", nd->host, nd->port, r->str);
        freeReplyObject(r);
        rc = XR_DOWN;
        continue;
      }
      int what = x->reply(d, x->ctx, it.i, r);
      if (what == R_RETRY) s->it2[next++] = (xitem){.i = it.i, .slot = it.slot, .node = it.node};
      if (what != R_KEPT) freeReplyObject(r);
      continue;
    lost:
      errf(err, cap, "%.60s:%d: %.80s", nd->host, nd->port,
           nd->c->errstr[0] ? nd->c->errstr : "no reply");
      return XR_LOST;
    }
    xitem *t = s->it;
    s->it = s->it2;
    s->it2 = t;
    size_t tc = s->it_cap;
    s->it_cap = s->it2_cap;
    s->it2_cap = tc;
    pend = next;
  }
  if (pend) {
    note_error(d, "%zu commands still redirected after %d rounds", pend, REDIRECT_ROUNDS + 1);
    for (size_t k = 0; k < pend; k++)
      x->reply(d, x->ctx, s->it[k].i, NULL);
  }
  if (s->stale && rc == XR_OK) { /* a MOVED was followed: the map changed */
    for (size_t k = 0; k < s->n_nodes; k++)
      if (s->nodes[k].c) {
        char e2[128];
        if (!side_load_map(d, s, s->nodes[k].c, s->nodes[k].host, e2, sizeof e2))
          note_error(d, "reloading the slot map: %s", e2);
        break;
      }
  }
  return rc;
}

/* Connects the background side and loads the compare-and-delete script.
 * SIGPIPE must be blocked. */
static bool bg_connect(oi_dir *d) {
  char err[128];
  if (!side_open(d, &d->bs, true, err, sizeof err)) {
    note_error(d, "%s", err);
    return false;
  }
  atomic_fetch_add(&d->generation, 1);
  atomic_store(&d->connected, true);
  return true;
}

/* ---- the background thread ---- */

static bool reply_ok(redisReply *r) {
  return r && (r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_STRING);
}

/* The hint an error reply earns when the url names a single instance. */
static const char *cluster_hint(oi_dir *d, const char *e) {
  if (!d->cluster && (strncmp(e, "MOVED", 5) == 0 || strncmp(e, "ASK", 3) == 0 ||
                      strncmp(e, "CROSSSLOT", 9) == 0 || strncmp(e, "CLUSTERDOWN", 11) == 0))
    return " (a Redis Cluster: use redis+cluster://)";
  return "";
}

typedef struct bg_ctx {
  const qent *batch;
  char ttl[16];
  size_t answered;
} bg_ctx;

static const char *bg_key(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_CHARS + 24]) {
  (void)d;
  oi__dir_key_format(&((bg_ctx *)ctx)->batch[i].key, buf);
  return buf;
}

static void bg_append(oi_dir *d, void *ctx, size_t i, redisContext *c) {
  bg_ctx *b = ctx;
  char key[OI_DIR_KEY_CHARS + 1];
  oi__dir_key_format(&b->batch[i].key, key);
  if (b->batch[i].op == Q_PUBLISH)
    redisAppendCommand(c, "SET %s %s PX %s", key, d->self_val, b->ttl);
  else if (d->sha[0])
    redisAppendCommand(c, "EVALSHA %s 1 %s %s", d->sha, key, d->self_val);
  else
    redisAppendCommand(c, "EVAL %s 1 %s %s", CAS_DEL, key, d->self_val);
}

static int bg_reply(oi_dir *d, void *ctx, size_t i, redisReply *r) {
  bg_ctx *b = ctx;
  if (b->batch[i].op == Q_PUBLISH) {
    if (reply_ok(r))
      ADD(published, 1);
    else if (r)
      note_error(d, "publish: %s%s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply",
                 r->type == REDIS_REPLY_ERROR ? cluster_hint(d, r->str) : "");
  } else if (r && is_err(r, "NOSCRIPT")) {
    d->sha[0] = '\0'; /* a script cache was flushed (or this master never had it): EVAL */
    return R_RETRY;
  } else if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
    ADD(unpublished, 1);
  } else if (r && r->type == REDIS_REPLY_INTEGER) {
    ADD(unpublish_missed, 1);
  } else if (r) {
    note_error(d, "unpublish: %s%s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply",
               r->type == REDIS_REPLY_ERROR ? cluster_hint(d, r->str) : "");
  }
  b->answered++;
  return R_DONE;
}

/* Sends `n` queued entries in pipelined chunks. false when a connection
 * failed or the cluster is down (what was not answered is counted as
 * dropped). */
static bool bg_flush(oi_dir *d, const qent *batch, size_t n) {
  for (size_t i = 0; i < n; i += PIPELINE) {
    size_t m = OI_MIN((size_t)PIPELINE, n - i);
    bg_ctx b = {.batch = batch + i};
    snprintf(b.ttl, sizeof b.ttl, "%u", d->o.block_ttl_ms);
    xops x = {bg_key, bg_append, bg_reply, &b};
    char err[128];
    int rc = side_exec(d, &d->bs, m, &x, err, sizeof err);
    if (rc != XR_OK) {
      note_error(d, "sending publishes: %s", err);
      ADD(queue_dropped, n - i - b.answered);
      return false;
    }
  }
  return true;
}

typedef struct one_ctx {
  const char *pre; /* NULL, or an argument before the key */
  const char *key;
  const char *cmd; /* a format of [pre,] key [and arg] */
  const char *arg;
  redisReply *r; /* the reply, kept */
} one_ctx;

static const char *one_key(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_CHARS + 24]) {
  (void)d, (void)i, (void)buf;
  return ((one_ctx *)ctx)->key;
}

static void one_append(oi_dir *d, void *ctx, size_t i, redisContext *c) {
  (void)d, (void)i;
  one_ctx *o = ctx;
  if (o->pre)
    redisAppendCommand(c, o->cmd, o->pre, o->key, o->arg);
  else if (o->arg)
    redisAppendCommand(c, o->cmd, o->key, o->arg);
  else
    redisAppendCommand(c, o->cmd, o->key);
}

static int one_reply(oi_dir *d, void *ctx, size_t i, redisReply *r) {
  (void)d, (void)i;
  ((one_ctx *)ctx)->r = r;
  return R_KEPT;
}

/* One command on the side's master of `key` (redirections followed).
 * XR_OK with o->r the reply (NULL when redirections did not settle). */
static int side_one(oi_dir *d, side *s, one_ctx *o, char *err, size_t cap) {
  xops x = {one_key, one_append, one_reply, o};
  o->r = NULL;
  int rc = side_exec(d, s, 1, &x, err, cap);
  if (rc != XR_OK && o->r) {
    freeReplyObject(o->r);
    o->r = NULL;
  }
  return rc;
}

/* Refreshes the liveness key and, with nothing advertised, PINGs; a cluster
 * checks every master's CLUSTER INFO. */
static bool bg_beat(oi_dir *d, const char *adv) {
  char err[128];
  if (adv) {
    char val[OI_DIR_ADDR_MAX + 24]; /* one argument: hiredis splits a format at spaces */
    snprintf(val, sizeof val, "%" PRIu64 " %s", d->o.epoch, adv);
    char cmd[48];
    snprintf(cmd, sizeof cmd, "SET %%s %%s PX %u", d->o.node_ttl_ms);
    one_ctx o = {.key = d->node_key, .cmd = cmd, .arg = val};
    int rc = side_one(d, &d->bs, &o, err, sizeof err);
    if (rc != XR_OK) {
      note_error(d, "refreshing the node key: %s", err);
      return false;
    }
    if (o.r && !reply_ok(o.r))
      note_error(d, "refreshing the node key: %s",
                 o.r->type == REDIS_REPLY_ERROR ? o.r->str : "unexpected reply");
    if (o.r) freeReplyObject(o.r);
    /* an error reply is Redis answering: the connection is fine */
    if (!d->cluster) return true;
  }
  /* A cluster: every master must answer, and say the cluster is ok, so
   * that a master that went down, or a cluster that stopped serving,
   * degrades the directory here rather than at each lookup. */
  for (size_t k = 0; k < d->bs.n_nodes; k++) {
    rnode *n = &d->bs.nodes[k];
    if (!n->c) n->c = dir_connect(d, n->host, n->port, err, sizeof err);
    redisReply *r = n->c ? redisCommand(n->c, d->cluster ? "CLUSTER INFO" : "PING") : NULL;
    if (!r) {
      note_error(d, "%s %s:%d: %s", d->cluster ? "CLUSTER INFO" : "PING", n->host, n->port,
                 n->c ? n->c->errstr : err);
      return false;
    }
    bool down =
        d->cluster && (r->type != REDIS_REPLY_STRING || !strstr(r->str, "cluster_state:ok"));
    if (down)
      note_error(d, "%s:%d: the cluster is not ok (cluster_state is not ok)", n->host, n->port);
    else if (!reply_ok(r))
      note_error(d, "PING: %s", r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    freeReplyObject(r);
    if (down) return false;
  }
  return true;
}

static void timed_wait(oi_dir *d, uint64_t deadline_ns) {
  struct timespec ts = oi__timespec(deadline_ns);
  pthread_cond_timedwait(&d->cv, &d->lock, &ts);
}

static void *dir_thread(void *arg) {
  oi_dir *d = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  struct timespec zero = {0, 0};

  uint32_t backoff = BACKOFF_MIN_MS;
  uint64_t interval_ns = (uint64_t)OI_MAX(d->o.node_ttl_ms / 3u, 1u) * 1000000u;
  uint64_t next_beat = 0;
  pthread_mutex_lock(&d->lock);
  while (!d->stop) {
    if (!d->bs.up) {
      pthread_mutex_unlock(&d->lock);
      bool ok = bg_connect(d);
      while (sigtimedwait(&set, NULL, &zero) > 0) {
      }
      if (ok) {
        ADD(reconnects, 1);
        OI_LOG(OI_LOG_INFO, "cluster", "directory %s: connected (generation %" PRIu64 ")", d->url,
               atomic_load(&d->generation));
        if (d->o.on_reconnect) d->o.on_reconnect(d->o.on_reconnect_ctx);
      }
      pthread_mutex_lock(&d->lock);
      if (ok) {
        backoff = BACKOFF_MIN_MS;
        next_beat = 0;
      } else if (!d->stop) {
        timed_wait(d, oi__now_ns() + (uint64_t)backoff * 1000000u);
        backoff = OI_MIN(backoff * 2, BACKOFF_MAX_MS);
      }
      continue;
    }
    uint64_t now = oi__now_ns();
    bool beat = now >= next_beat || d->advertise_dirty || d->check;
    if (d->q_len == 0 && !beat) {
      timed_wait(d, next_beat);
      continue;
    }
    qent *batch = d->q;
    size_t n = d->q_len, batch_cap = d->q_cap;
    d->q = d->q2;
    d->q_cap = d->q2_cap;
    d->q_len = 0;
    d->q2 = NULL;
    d->q2_cap = 0;
    char *adv = d->advertise ? oi__strdup(d->advertise) : NULL;
    d->advertise_dirty = false;
    d->check = false;
    pthread_mutex_unlock(&d->lock);

    bool ok = n ? bg_flush(d, batch, n) : true;
    if (ok && beat) {
      ok = bg_beat(d, adv);
      next_beat = oi__now_ns() + interval_ns;
    }
    if (ok)
      atomic_store(&d->connected, true);
    else {
      atomic_store(&d->connected, false);
      side_drop(&d->bs);
      OI_LOG(OI_LOG_WARN, "cluster",
             "directory %s: connection lost (%s); degraded (local only), reconnecting", d->url,
             d->last_error);
    }
    while (sigtimedwait(&set, NULL, &zero) > 0) {
    }
    oi__free(adv);

    pthread_mutex_lock(&d->lock);
    d->q2 = batch;
    d->q2_cap = batch_cap;
    d->q_done += n;
    pthread_cond_broadcast(&d->done_cv);
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

/* ---- open, close ---- */

void oi__dir_options_init(oi_dir_options *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
}

oi_status oi__dir_open(const oi_dir_options *opts, oi_dir **out) {
  if (!opts || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_open: opts and out must not be NULL");
  *out = NULL;
  if (!opts->url || !opts->url[0])
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: no url (redis://HOST[:PORT][/DB] or unix:/PATH)");
  if (!opts->node_id || !node_id_valid(opts->node_id, strlen(opts->node_id)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: node id '%s' is not 1 to %u characters of A-Z a-z 0-9 . _ -",
                    opts->node_id ? opts->node_id : "(null)", OI_DIR_NODE_ID_MAX);
  oi_dir *d = oi__calloc(1, sizeof *d);
  if (!d) return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  d->o = *opts;
  if (!d->o.block_ttl_ms) d->o.block_ttl_ms = OI_DIR_BLOCK_TTL_MS;
  if (!d->o.node_ttl_ms) d->o.node_ttl_ms = OI_DIR_NODE_TTL_MS;
  if (!d->o.timeout_ms) d->o.timeout_ms = OI_DIR_TIMEOUT_MS;
  oi_status st = parse_url(d, opts->url);
  if (st != OI_OK) {
    oi__free(d);
    return st;
  }
  d->url = oi__strdup(opts->url);
  d->node_id = oi__strdup(opts->node_id);
  if (!d->url || !d->node_id) {
    oi__free(d->url);
    oi__free(d->node_id);
    oi__free(d);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  }
  d->o.url = d->url;
  d->o.node_id = d->node_id;
  snprintf(d->self_val, sizeof d->self_val, "%s %" PRIu64, d->node_id, d->o.epoch);
  snprintf(d->node_key, sizeof d->node_key, "oi:node:%s", d->node_id);

  pthread_mutex_init(&d->lock, NULL);
  pthread_mutex_init(&d->sync_lock, NULL);
  oi__cond_init_monotonic(&d->cv);
  oi__cond_init_monotonic(&d->done_cv);

  sigpipe_guard g;
  sigpipe_block(&g);
  bool ok = bg_connect(d);
  sigpipe_restore(&g);
  if (ok)
    OI_LOG(OI_LOG_INFO, "cluster", "directory %s: connected as node '%s' epoch %" PRIu64, d->url,
           d->node_id, d->o.epoch);
  else
    OI_LOG(OI_LOG_WARN, "cluster",
           "directory %s unreachable at open (%s); degraded (local only), reconnecting in the "
           "background",
           d->url, d->last_error);

  if (pthread_create(&d->thread, NULL, dir_thread, d) != 0) {
    oi__dir_close(d);
    return oi__fail(OI_ERR_INTERNAL, "directory: cannot start its thread");
  }
  d->thread_ok = true;
  pthread_setname_np(d->thread, "oi-directory");
  *out = d;
  return OI_OK;
}

void oi__dir_close(oi_dir *d) {
  if (!d) return;
  if (d->thread_ok) {
    pthread_mutex_lock(&d->lock);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->lock);
    pthread_join(d->thread, NULL);
  }
  sigpipe_guard g;
  sigpipe_block(&g);
  if (d->bs.up && d->advertise) { /* a clean leave: the node is gone now, not after its TTL */
    char val[OI_DIR_ADDR_MAX + 24], err[128];
    snprintf(val, sizeof val, "%" PRIu64 " %s", d->o.epoch, d->advertise);
    one_ctx o = {.pre = CAS_DEL, .key = d->node_key, .cmd = "EVAL %s 1 %s %s", .arg = val};
    if (side_one(d, &d->bs, &o, err, sizeof err) == XR_OK && o.r) freeReplyObject(o.r);
  }
  side_free(&d->bs);
  side_free(&d->ss);
  sigpipe_restore(&g);
  pthread_cond_destroy(&d->cv);
  pthread_cond_destroy(&d->done_cv);
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->sync_lock);
  oi__free(d->q);
  oi__free(d->q2);
  oi__free(d->advertise);
  oi__free(d->keybuf);
  oi__free(d->argv);
  oi__free(d->argvlen);
  oi__free(d->found);
  oi__free(d->url);
  oi__free(d->node_id);
  oi__free(d);
}

/* ---- publishing ---- */

oi_status oi__dir_set_advertise(oi_dir *d, const char *addr) {
  if (!d) return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_set_advertise: d must not be NULL");
  char *copy = NULL;
  if (addr) {
    if (!addr_valid(addr, strnlen(addr, OI_DIR_ADDR_MAX + 1)))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory: advertised address '%.64s' is not 1 to %u printable characters "
                      "without spaces",
                      addr, OI_DIR_ADDR_MAX);
    copy = oi__strdup(addr);
    if (!copy) return oi__fail(OI_ERR_OUT_OF_MEMORY, "directory: out of memory");
  }
  pthread_mutex_lock(&d->lock);
  oi__free(d->advertise);
  d->advertise = copy;
  d->advertise_dirty = copy != NULL;
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->lock);
  return OI_OK;
}

static oi_status enqueue(oi_dir *d, const oi_tier_key *keys, size_t n, uint8_t op,
                         const char *what) {
  if (!d || (!keys && n))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: d and keys must not be NULL", what);
  if (n == 0) return OI_OK;
  pthread_mutex_lock(&d->lock);
  size_t room = OI_DIR_QUEUE_MAX - OI_MIN(d->q_len, (size_t)OI_DIR_QUEUE_MAX);
  size_t take = OI_MIN(n, room);
  if (take && !oi__grow((void **)&d->q, &d->q_cap, d->q_len + take, sizeof(qent), OI_DIR_QUEUE_MAX))
    take = 0;
  for (size_t i = 0; i < take; i++) {
    d->q[d->q_len + i].key = keys[i];
    d->q[d->q_len + i].op = op;
  }
  d->q_len += take;
  d->q_seq += n;
  d->q_done += n - take; /* a flush does not wait for what was dropped */
  if (take) pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->lock);
  if (take < n) {
    ADD(queue_dropped, n - take);
    OI_LOG(OI_LOG_DEBUG, "cluster", "directory: queue full, %zu entries dropped", n - take);
  }
  return OI_OK;
}

oi_status oi__dir_publish(oi_dir *d, const oi_tier_key *keys, size_t n) {
  return enqueue(d, keys, n, Q_PUBLISH, "oi__dir_publish");
}

oi_status oi__dir_unpublish(oi_dir *d, const oi_tier_key *keys, size_t n) {
  return enqueue(d, keys, n, Q_UNPUBLISH, "oi__dir_unpublish");
}

oi_status oi__dir_flush(oi_dir *d, uint32_t timeout_ms) {
  if (!d) return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_flush: d must not be NULL");
  uint64_t deadline = oi__deadline_ns(timeout_ms);
  oi_status st = OI_OK;
  pthread_mutex_lock(&d->lock);
  uint64_t target = d->q_seq;
  while (d->q_done < target) {
    if (!atomic_load(&d->connected)) {
      st = oi__fail(OI_ERR_CLOSED, "directory %s is unreachable (degraded); nothing was flushed",
                    d->url);
      break;
    }
    if (oi__now_ns() >= deadline) {
      st = oi__fail(OI_ERR_TIMEOUT, "directory %s: the queue was not sent within %u ms", d->url,
                    timeout_ms);
      break;
    }
    struct timespec ts = oi__timespec(OI_MIN(deadline, oi__now_ns() + 50000000u));
    pthread_cond_timedwait(&d->done_cv, &d->lock, &ts);
  }
  pthread_mutex_unlock(&d->lock);
  if (st == OI_OK && !atomic_load(&d->connected))
    st = oi__fail(OI_ERR_CLOSED, "directory %s is unreachable (degraded)", d->url);
  return st;
}

/* ---- synchronous calls ---- */

/* The directory is degraded: have the background thread check its own
 * connections (lock not held). */
static void degrade(oi_dir *d) {
  atomic_store(&d->connected, false);
  pthread_mutex_lock(&d->lock);
  d->check = true;
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->lock);
}

/* Makes the synchronous side ready (sync_lock held). SIGPIPE must be
 * blocked. */
static oi_status sync_ready(oi_dir *d, const char *what) {
  uint64_t gen = atomic_load(&d->generation);
  if (!atomic_load(&d->connected)) {
    side_drop(&d->ss);
    return oi__fail(OI_ERR_CLOSED,
                    "%s: directory %s is unreachable (degraded: local only); it reconnects in "
                    "the background",
                    what, d->url);
  }
  if (d->ss.up && d->sync_gen != gen) side_drop(&d->ss); /* Redis was lost since: start afresh */
  if (!d->ss.up) {
    char err[128];
    if (!side_open(d, &d->ss, false, err, sizeof err)) {
      note_error(d, "%s", err);
      degrade(d);
      return oi__fail(OI_ERR_CLOSED, "%s: directory %s: %s", what, d->url, err);
    }
    d->sync_gen = gen;
  }
  return OI_OK;
}

/* A synchronous round failed (sync_lock held): drop the side, degrade and
 * have the background thread check its own. */
static oi_status sync_lost(oi_dir *d, const char *what, const char *err) {
  side_drop(&d->ss);
  note_error(d, "%s: %s", what, err);
  degrade(d);
  OI_LOG(OI_LOG_WARN, "cluster", "directory %s: %s failed (%s); degraded (local only)", d->url,
         what, err);
  return oi__fail(OI_ERR_CLOSED, "%s: directory %s: %s; degraded (local only)", what, d->url, err);
}

typedef struct look_ctx {
  oi_dir_holder *out;
  char err[96]; /* the first error reply */
} look_ctx;

static const char *look_key(oi_dir *d, void *ctx, size_t i, char buf[OI_DIR_KEY_CHARS + 24]) {
  (void)ctx, (void)buf;
  return d->keybuf + i * (OI_DIR_KEY_CHARS + 1);
}

static void look_append(oi_dir *d, void *ctx, size_t i, redisContext *c) {
  (void)ctx;
  const char *argv[2] = {"GET", d->keybuf + i * (OI_DIR_KEY_CHARS + 1)};
  size_t len[2] = {3, OI_DIR_KEY_CHARS};
  redisAppendCommandArgv(c, 2, argv, len);
}

enum { F_ABSENT, F_FOUND, F_BAD, F_ERROR };

static int look_reply(oi_dir *d, void *ctx, size_t i, redisReply *r) {
  look_ctx *l = ctx;
  uint8_t f = F_ABSENT;
  if (r && is_err(r, "WRONGTYPE")) {
    f = F_ABSENT; /* a key of another type: absent, as MGET answers */
  } else if (!r || r->type == REDIS_REPLY_ERROR) {
    f = F_ERROR;
    if (!l->err[0]) snprintf(l->err, sizeof l->err, "%s", r ? r->str : "redirected too often");
  } else if (r->type == REDIS_REPLY_STRING) {
    f = oi__dir_holder_parse(r->str, r->len, &l->out[i]) ? F_FOUND : F_BAD;
  }
  d->found[i] = f;
  return R_DONE;
}

oi_status oi__dir_lookup(oi_dir *d, const oi_tier_key *keys, size_t n, oi_dir_holder *out,
                         size_t *n_out) {
  if (n_out) *n_out = 0;
  if (!d || !keys || !out || !n_out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_lookup: d, keys, out and n_out must not "
                                             "be NULL");
  if (n == 0 || n > OI_DIR_LOOKUP_MAX)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_lookup: %zu keys; one lookup asks for 1 to %u (split the prefix)", n,
                    OI_DIR_LOOKUP_MAX);
  if (!atomic_load(&d->connected)) /* fast path: no lock, no wait */
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_lookup: directory %s is unreachable (degraded: local only)", d->url);
  pthread_mutex_lock(&d->sync_lock);
  sigpipe_guard g;
  sigpipe_block(&g);
  oi_status st = sync_ready(d, "oi__dir_lookup");
  if (st != OI_OK) goto out;
  if (!oi__grow((void **)&d->keybuf, &d->keybuf_cap, n * (OI_DIR_KEY_CHARS + 1), 1,
                (size_t)OI_DIR_LOOKUP_MAX * (OI_DIR_KEY_CHARS + 1)) ||
      !oi__grow((void **)&d->argv, &d->argv_cap, n + 1, sizeof(char *), OI_DIR_LOOKUP_MAX + 1) ||
      !oi__grow((void **)&d->argvlen, &d->argvlen_cap, n + 1, sizeof(size_t),
                OI_DIR_LOOKUP_MAX + 1) ||
      !oi__grow((void **)&d->found, &d->found_cap, n, 1, OI_DIR_LOOKUP_MAX)) {
    st = oi__fail(OI_ERR_OUT_OF_MEMORY, "oi__dir_lookup: out of memory for %zu keys", n);
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    oi__dir_key_format(&keys[i], d->keybuf + i * (OI_DIR_KEY_CHARS + 1));
  uint64_t t0 = oi__now_ns();
  size_t found = 0;
  if (d->cluster) {
    /* A cluster's MGET takes keys of one slot only, and a prefix's keys
     * spread over all slots: one GET per key instead, pipelined to the
     * keys' masters, every master's GETs written before any reply is read
     * (one round trip, and one more per redirection). */
    look_ctx l = {.out = out};
    xops x = {look_key, look_append, look_reply, &l};
    char err[128];
    int rc = side_exec(d, &d->ss, n, &x, err, sizeof err);
    if (rc != XR_OK) {
      st = sync_lost(d, "GET", err);
      goto out;
    }
    for (; found < n; found++) {
      if (d->found[found] == F_FOUND) continue;
      if (d->found[found] == F_BAD) ADD(parse_failures, 1);
      if (d->found[found] == F_ERROR) {
        note_error(d, "GET: %s", l.err);
        st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_lookup: directory %s answered GET with %s", d->url,
                      l.err);
        goto out;
      }
      break;
    }
  } else {
    d->argv[0] = "MGET";
    d->argvlen[0] = 4;
    for (size_t i = 0; i < n; i++) {
      d->argv[i + 1] = d->keybuf + i * (OI_DIR_KEY_CHARS + 1);
      d->argvlen[i + 1] = OI_DIR_KEY_CHARS;
    }
    redisContext *c = d->ss.nodes[0].c;
    redisReply *r = redisCommandArgv(c, (int)(n + 1), d->argv, d->argvlen);
    if (!r) {
      char err[128];
      snprintf(err, sizeof err, "%s", c->errstr[0] ? c->errstr : "no reply");
      st = sync_lost(d, "MGET", err);
      goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
      bool e = r->type == REDIS_REPLY_ERROR;
      note_error(d, "MGET: %s%s", e ? r->str : "unexpected reply",
                 e ? cluster_hint(d, r->str) : "");
      st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_lookup: directory %s answered MGET with %s%s", d->url,
                    e ? r->str : "an unexpected reply", e ? cluster_hint(d, r->str) : "");
      freeReplyObject(r);
      goto out;
    }
    for (; found < n; found++) {
      redisReply *e = r->element[found];
      if (e->type != REDIS_REPLY_STRING) break;
      if (!oi__dir_holder_parse(e->str, e->len, &out[found])) {
        ADD(parse_failures, 1);
        break;
      }
    }
    freeReplyObject(r);
  }
  uint64_t dt = oi__now_ns() - t0;
  *n_out = found;
  ADD(lookups, 1);
  ADD(lookup_keys, n);
  ADD(entries_found, found);
  ADD(lookup_ns_sum, dt);
  oi__hist_record(&d->lookup_hist, dt);
out:
  sigpipe_restore(&g);
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

oi_status oi__dir_node_lookup(oi_dir *d, const char *node_id, char *addr, size_t cap,
                              uint64_t *epoch) {
  if (!d || !node_id || !addr)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_node_lookup: d, node_id and addr must not be NULL");
  if (!node_id_valid(node_id, strnlen(node_id, OI_DIR_NODE_ID_MAX + 1)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_node_lookup: node id '%.64s' is not 1 to %u characters of A-Z a-z "
                    "0-9 . _ -",
                    node_id, OI_DIR_NODE_ID_MAX);
  if (cap == 0) return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_node_lookup: cap is 0");
  addr[0] = '\0';
  if (!atomic_load(&d->connected))
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_node_lookup: directory %s is unreachable (degraded: local only)",
                    d->url);
  char key[OI_DIR_NODE_ID_MAX + 16];
  snprintf(key, sizeof key, "oi:node:%s", node_id);
  pthread_mutex_lock(&d->sync_lock);
  sigpipe_guard g;
  sigpipe_block(&g);
  oi_status st = sync_ready(d, "oi__dir_node_lookup");
  if (st != OI_OK) goto out;
  one_ctx o = {.key = key, .cmd = "GET %s"};
  char err[128];
  if (side_one(d, &d->ss, &o, err, sizeof err) != XR_OK) {
    st = sync_lost(d, "GET", err);
    goto out;
  }
  redisReply *r = o.r;
  if (!r) {
    st = oi__fail(OI_ERR_CLOSED, "oi__dir_node_lookup: directory %s: redirected too often", d->url);
  } else if (r->type == REDIS_REPLY_NIL) {
    st = oi__fail(OI_ERR_NOT_FOUND, "node '%s' is not live in directory %s (no liveness key)",
                  node_id, d->url);
  } else if (r->type != REDIS_REPLY_STRING) {
    st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_node_lookup: directory %s answered GET with %s", d->url,
                  r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
  } else {
    uint64_t e = 0;
    size_t aoff = 0, alen = 0;
    if (!oi__dir_liveness_parse(r->str, r->len, &e, &aoff, &alen)) {
      ADD(parse_failures, 1);
      st = oi__fail(OI_ERR_PROTOCOL,
                    "node '%s' in directory %s: the liveness value is not '<epoch> <address>'",
                    node_id, d->url);
    } else if (alen + 1 > cap) {
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_node_lookup: node '%s' has a %zu-byte address; addr holds %zu "
                    "(give it %u)",
                    node_id, alen, cap, OI_DIR_ADDR_MAX + 1);
    } else {
      memcpy(addr, r->str + aoff, alen);
      addr[alen] = '\0';
      if (epoch) *epoch = e;
    }
  }
  if (r) freeReplyObject(r);
out:
  sigpipe_restore(&g);
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

oi_status oi__dir_remove_stale(oi_dir *d, const oi_tier_key *key, const oi_dir_holder *h) {
  if (!d || !key || !h)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_remove_stale: d, key and h must not be NULL");
  if (!node_id_valid(h->node_id, strnlen(h->node_id, sizeof h->node_id)))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "oi__dir_remove_stale: the holder's node id is not 1 to %u characters of A-Z "
                    "a-z 0-9 . _ -",
                    OI_DIR_NODE_ID_MAX);
  if (!atomic_load(&d->connected))
    return oi__fail(OI_ERR_CLOSED,
                    "oi__dir_remove_stale: directory %s is unreachable (degraded: local only)",
                    d->url);
  char k[OI_DIR_KEY_CHARS + 1], val[OI_DIR_NODE_ID_MAX + 24];
  oi__dir_key_format(key, k);
  snprintf(val, sizeof val, "%s %" PRIu64, h->node_id, h->epoch);
  pthread_mutex_lock(&d->sync_lock);
  sigpipe_guard g;
  sigpipe_block(&g);
  oi_status st = sync_ready(d, "oi__dir_remove_stale");
  if (st != OI_OK) goto out;
  one_ctx o = {.pre = CAS_DEL, .key = k, .cmd = "EVAL %s 1 %s %s", .arg = val};
  char err[128];
  if (side_one(d, &d->ss, &o, err, sizeof err) != XR_OK) {
    st = sync_lost(d, "EVAL", err);
    goto out;
  }
  redisReply *r = o.r;
  if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
    ADD(stale_removed, 1);
  } else if (r && r->type == REDIS_REPLY_INTEGER) {
    st = oi__fail(OI_ERR_NOT_FOUND, "oi__dir_remove_stale: %s does not name %s (any more)", k, val);
  } else {
    const char *e = !r                             ? "redirected too often"
                    : r->type == REDIS_REPLY_ERROR ? r->str
                                                   : "an unexpected reply";
    note_error(d, "remove stale: %s", e);
    st = oi__fail(OI_ERR_PROTOCOL, "oi__dir_remove_stale: directory %s answered EVAL with %s",
                  d->url, e);
  }
  if (r) freeReplyObject(r);
out:
  sigpipe_restore(&g);
  pthread_mutex_unlock(&d->sync_lock);
  return st;
}

/* ---- observing ---- */

uint64_t oi__dir_generation(oi_dir *d) { return d ? atomic_load(&d->generation) : 0; }

void oi__dir_stats(oi_dir *d, oi_dir_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!d) return;
#define GET(field) atomic_load_explicit(&d->field, memory_order_relaxed)
  out->connected = atomic_load(&d->connected);
  out->generation = GET(generation);
  out->reconnects = GET(reconnects);
  out->published = GET(published);
  out->unpublished = GET(unpublished);
  out->unpublish_missed = GET(unpublish_missed);
  out->stale_removed = GET(stale_removed);
  out->lookups = GET(lookups);
  out->lookup_keys = GET(lookup_keys);
  out->entries_found = GET(entries_found);
  out->parse_failures = GET(parse_failures);
  out->queue_dropped = GET(queue_dropped);
  out->errors = GET(errors);
  out->lookup_ns_sum = GET(lookup_ns_sum);
  out->redirects = GET(redirects);
#undef GET
  uint64_t sum_us;
  oi__hist_read(&d->lookup_hist, out->lookup_latency_us, &sum_us);
  pthread_mutex_lock(&d->lock);
  out->queue_depth = d->q_len;
  memcpy(out->last_error, d->last_error, sizeof out->last_error);
  pthread_mutex_unlock(&d->lock);
}
