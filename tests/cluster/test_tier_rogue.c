/* The cluster tier against peers that misbehave (a private redis-server;
 * the peer transport over TCP on 127.0.0.1):
 *  - a holder (a real node) gets a malformed request, a LEASE for a
 *    namespace it does not have, a RELEASE of a lease it never gave: it
 *    refuses the first (OI_ERR_PROTOCOL), leases nothing for the second,
 *    answers the third, and keeps serving;
 *  - a reader (a real node) finds in the directory a rogue holder (a bare
 *    peer net with the cluster's secret, whose entries the test writes)
 *    that answers a LEASE with an error, with bytes that are no reply,
 *    with more blocks than asked, with another block size, with offsets
 *    outside its region, with checksums its bytes do not match, then
 *    correctly: the reader never serves a byte it did not verify (every
 *    misbehaviour is a miss, and the stale entries go), and serves the
 *    correct answer byte-exact; entries naming another incarnation of a
 *    holder, a holder with no liveness key, or one that cannot be reached
 *    ask no lease (the first two are removed as stale).
 * Skips (77) when redis-server is not on PATH. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "cluster/peer.h"
#include "cluster/tier_wire.h"
#include "cluster/ucx.h"
#include "cluster_util.h"
#include "host/host.h"
#include "host/tier.h"
#include "openinfer/openinfer.h"

#define NB 8
#define BLOCK (64 * 1024)
#define HASH_TAG 0xC7
#include "node_rig.h"
#define SECRET_TEXT "a-cluster-secret-of-32-bytes-000"

static int g_port;
static pid_t g_redis;
static char g_url[64];
static char g_dir[256];
static char g_secret_path[512];

static void node_open(node *n, const char *id) {
  REQUIRE(rig_open(n, "rogue-model", g_url, id, g_secret_path, 2000) == OI_OK);
}

/* ---- a holder's refusals ---- */

static void test_holder_refuses_bad_requests(void) {
  node a;
  node_open(&a, "holder-a");
  save(&a, 0, NB);
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = "asker",
                           .secret = (const uint8_t *)SECRET_TEXT,
                           .secret_len = strlen(SECRET_TEXT),
                           .timeout_ms = 3000};
  oi_peer_net *net = NULL;
  REQUIRE(oi__peer_net_create(&o, &net) == OI_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", cstats(&a).port);
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(net, addr, &p) == OI_OK);
  void *rep = NULL;
  size_t rl = 0;
  /* Bytes that are no request. */
  CHECK_ST(oi__peer_call(p, "not a request", 13, &rep, &rl, 0), OI_ERR_PROTOCOL);
  /* A LEASE for a namespace the holder does not have: nothing leased. */
  uint8_t req[LEASE_BYTES(2)];
  put_hdr(req, MSG_LEASE);
  put64(req + HDR_BYTES, 0x1234);
  put64(req + HDR_BYTES + 8, 0x5678);
  put32(req + HDR_BYTES + 16, 2);
  put32(req + HDR_BYTES + 20, 0);
  for (int i = 0; i < 2; i++) {
    oi_block_hash h = hash_of((uint64_t)i);
    memcpy(req + HDR_BYTES + 24 + 16 * i, h.bytes, 16);
  }
  REQUIRE(oi__peer_call(p, req, sizeof req, &rep, &rl, 0) == OI_OK);
  CHECK(rl == LEASE_REPLY_BYTES(0) && get32((uint8_t *)rep + HDR_BYTES + 8) == 0);
  oi__free(rep);
  /* A RELEASE of a lease never given: answered, nothing else happens. */
  uint8_t rel[HDR_BYTES + 8];
  put_hdr(rel, MSG_RELEASE);
  put64(rel + HDR_BYTES, 987654321);
  REQUIRE(oi__peer_call(p, rel, sizeof rel, &rep, &rl, 0) == OI_OK);
  CHECK(rl == HDR_BYTES);
  oi__free(rep);
  CHECK(cstats(&a).served_blocks == 0);
  oi__peer_net_destroy(net);
  /* And it still serves a real node. */
  node b;
  node_open(&b, "reader-b");
  for (int i = 0; i < 300 && cstats(&a).published < NB; i++)
    sleep_ms(10);
  sleep_ms(50);
  CHECK(fetch_check(&b, 0, NB, 4000) == NB);
  CHECK(cstats(&a).served_blocks == NB);
  node_close(&b);
  node_close(&a);
}

/* A lease given to one node is released by that node only: a RELEASE of
 * its id from another node is answered and changes nothing. */
static void test_release_only_by_its_reader(void) {
  node a;
  node_open(&a, "holder-r");
  save(&a, 0, NB);
  uint64_t ns_fp = 0, layout_fp = 0, bb = 0;
  REQUIRE(oi__host_namespace_fps(a.h, 1, &ns_fp, &layout_fp, &bb) && bb == BLOCK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", cstats(&a).port);
  oi_peer_net *nets[2] = {NULL, NULL};
  oi_peer *peers[2] = {NULL, NULL};
  const char *ids[2] = {"asker", "other"};
  for (int i = 0; i < 2; i++) {
    oi_peer_net_options o = {.node_id = ids[i],
                             .secret = (const uint8_t *)SECRET_TEXT,
                             .secret_len = strlen(SECRET_TEXT),
                             .timeout_ms = 3000};
    REQUIRE(oi__peer_net_create(&o, &nets[i]) == OI_OK);
    REQUIRE(oi__peer_connect(nets[i], addr, &peers[i]) == OI_OK);
  }
  uint8_t req[LEASE_BYTES(NB)];
  put_hdr(req, MSG_LEASE);
  put64(req + HDR_BYTES, ns_fp);
  put64(req + HDR_BYTES + 8, layout_fp);
  put32(req + HDR_BYTES + 16, NB);
  put32(req + HDR_BYTES + 20, 0);
  for (int i = 0; i < NB; i++) {
    oi_block_hash h = hash_of((uint64_t)i);
    memcpy(req + HDR_BYTES + 24 + 16 * i, h.bytes, 16);
  }
  void *rep = NULL;
  size_t rl = 0;
  REQUIRE(oi__peer_call(peers[0], req, sizeof req, &rep, &rl, 0) == OI_OK);
  REQUIRE(rl == LEASE_REPLY_BYTES(NB) && get32((uint8_t *)rep + HDR_BYTES + 8) == NB);
  uint64_t lease = get64((uint8_t *)rep + HDR_BYTES);
  oi__free(rep);
  CHECK(lease != 0 && cstats(&a).served_blocks == NB);
  oi_host_stats hs = {.struct_size = sizeof hs};
  CHECK_OK(oi_host_get_stats(a.h, &hs));
  CHECK(hs.blocks_pinned == NB);
  uint8_t rel[HDR_BYTES + 8];
  put_hdr(rel, MSG_RELEASE);
  put64(rel + HDR_BYTES, lease);
  /* The other node: answered, the blocks stay pinned. */
  REQUIRE(oi__peer_call(peers[1], rel, sizeof rel, &rep, &rl, 0) == OI_OK);
  CHECK(rl == HDR_BYTES);
  oi__free(rep);
  CHECK_OK(oi_host_get_stats(a.h, &hs));
  CHECK(hs.blocks_pinned == NB);
  /* The reader it was given to: released. */
  REQUIRE(oi__peer_call(peers[0], rel, sizeof rel, &rep, &rl, 0) == OI_OK);
  CHECK(rl == HDR_BYTES);
  oi__free(rep);
  CHECK_OK(oi_host_get_stats(a.h, &hs));
  CHECK(hs.blocks_pinned == 0);
  oi__peer_net_destroy(nets[1]);
  oi__peer_net_destroy(nets[0]);
  node_close(&a);
}

/* ---- a rogue holder ---- */

enum { R_ERROR, R_GARBAGE, R_TOO_MANY, R_OTHER_SIZE, R_OUTSIDE, R_BAD_SUM, R_GOOD };
static int g_mode;
static uint8_t *g_region; /* NB blocks, block i holding pattern(i) */
static atomic_int g_leases;
static uint8_t g_lease_req[LEASE_BYTES(NB)]; /* the first LEASE a reader sent (real ids) */
static size_t g_lease_len;

static void rogue_answer(void *ctx, const char *peer, const void *req, size_t len,
                         oi_peer_reply *r) {
  OI_UNUSED(ctx);
  OI_UNUSED(peer);
  const uint8_t *m = req;
  if (len < HDR_BYTES || m[6] != 1) { /* a RELEASE: answered */
    uint8_t out[HDR_BYTES];
    put_hdr(out, MSG_RELEASE_REPLY);
    oi__peer_reply_set(r, out, sizeof out);
    return;
  }
  if (atomic_fetch_add(&g_leases, 1) == 0 && len <= sizeof g_lease_req) {
    memcpy(g_lease_req, req, len);
    g_lease_len = len;
  }
  uint32_t n = get32(m + HDR_BYTES + 16);
  if (g_mode == R_ERROR) {
    oi__peer_reply_status(r, OI_ERR_NOT_FOUND);
    return;
  }
  if (g_mode == R_GARBAGE) {
    oi__peer_reply_set(r, "garbage!", 8);
    return;
  }
  uint32_t mcount = g_mode == R_TOO_MANY ? n + 1 : n;
  size_t rl = LEASE_REPLY_BYTES(mcount);
  uint8_t *out = calloc(1, rl);
  REQUIRE(out);
  put_hdr(out, MSG_LEASE_REPLY);
  put64(out + HDR_BYTES, 42);
  put32(out + HDR_BYTES + 8, mcount);
  for (uint32_t i = 0; i < mcount; i++) {
    uint64_t logical = 0;
    if (i < n) memcpy(&logical, m + HDR_BYTES + 24 + 16 * i, sizeof logical);
    uint8_t *e = out + LEASE_REPLY_BYTES(i);
    uint64_t off = logical * BLOCK, blen = BLOCK;
    if (g_mode == R_OUTSIDE) off = (uint64_t)NB * BLOCK; /* past the region */
    if (g_mode == R_OTHER_SIZE) blen = BLOCK / 2;
    uint64_t sum = logical < NB ? XXH3_64bits(g_region + logical * BLOCK, BLOCK) : 0;
    if (g_mode == R_BAD_SUM) sum ^= 1;
    put64(e, off);
    put64(e + 8, blen);
    put64(e + 16, sum);
  }
  oi__peer_reply_set(r, out, rl);
  free(out);
}

/* Every entry of `keys` names node/epoch, signed with the cluster's secret
 * (the rogue knows it: the test is about what it answers). */
static void set_entries(redisContext *c, redisReply *keys, const char *node, uint64_t epoch) {
  for (size_t i = 0; i < keys->elements; i++) {
    char v[256];
    dir_entry(SECRET_TEXT, keys->element[i]->str, node, epoch, 60000, v, sizeof v);
    freeReplyObject(redisCommand(c, "SET %s %s", keys->element[i]->str, v));
  }
}

static void test_rogue_holder(void) {
  /* A real node saves the blocks so that the directory has their keys,
   * then goes: its entries are rewritten to name the rogue. */
  node a;
  node_open(&a, "origin");
  save(&a, 0, NB);
  for (int i = 0; i < 300 && cstats(&a).published < NB; i++)
    sleep_ms(10);
  sleep_ms(100);
  redisContext *c = raw(g_port);
  REQUIRE(c);
  redisReply *keys = redisCommand(c, "KEYS oi:b:*");
  REQUIRE(keys && keys->type == REDIS_REPLY_ARRAY && keys->elements == NB);
  node_close(&a);

  g_region = malloc((size_t)NB * BLOCK);
  REQUIRE(g_region);
  for (uint64_t b = 0; b < NB; b++)
    for (uint64_t i = 0; i < BLOCK; i++)
      g_region[b * BLOCK + i] = pattern(b, i);
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = "rogue",
                           .secret = (const uint8_t *)SECRET_TEXT,
                           .secret_len = strlen(SECRET_TEXT),
                           .timeout_ms = 3000,
                           .on_request = rogue_answer,
                           .reads = OI_PEER_READS_AM};
  oi_peer_net *rogue = NULL;
  REQUIRE(oi__peer_net_create(&o, &rogue) == OI_OK);
  REQUIRE(oi__peer_net_register(rogue, g_region, (size_t)NB * BLOCK) == OI_OK);
  redisReply *r;
  char addr[64], live[256];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", oi__peer_net_port(rogue));
  dir_node(SECRET_TEXT, "oi:node:rogue", 1, addr, 600000, live, sizeof live);
  r = redisCommand(c, "SET oi:node:rogue %b", live, strlen(live));
  REQUIRE(r && r->type == REDIS_REPLY_STATUS);
  freeReplyObject(r);

  node b;
  node_open(&b, "reader");
  const struct {
    int mode;
    const char *what;
  } modes[] = {{R_ERROR, "an error"},
               {R_GARBAGE, "no reply"},
               {R_TOO_MANY, "more blocks"},
               {R_OTHER_SIZE, "another block size"},
               {R_OUTSIDE, "outside its region"},
               {R_BAD_SUM, "checksums that do not match"}};
  for (size_t k = 0; k < OI_ARRAY_LEN(modes); k++) {
    set_entries(c, keys, "rogue", 1);
    g_mode = modes[k].mode;
    int before = atomic_load(&g_leases);
    uint64_t failed = cstats(&b).remote_failed;
    uint64_t hits = fetch_check(&b, 0, NB, 4000);
    if (hits != 0 || atomic_load(&g_leases) == before || cstats(&b).remote_failed <= failed) {
      fprintf(stderr, "a rogue answering with %s: %llu hits, %d leases asked\n", modes[k].what,
              (unsigned long long)hits, atomic_load(&g_leases) - before);
      CHECK(false);
    }
  }
  /* Holders that cannot serve, no lease asked: another incarnation than
   * the entries name (the entries are stale: removed), a node with no
   * liveness key (stale: removed), a node that cannot be reached (removed
   * after this first failure: later queries do not try it again). */
  const struct {
    const char *node;
    uint64_t epoch;
    const char *node_key, *addr;
    bool removed;
  } gone[] = {{"rogue", 2, "oi:node:rogue", NULL, true},
              {"ghost", 1, NULL, NULL, true},
              {"far", 3, "oi:node:far", "127.0.0.1:1", true}};
  for (size_t k = 0; k < OI_ARRAY_LEN(gone); k++) {
    set_entries(c, keys, gone[k].node, gone[k].epoch);
    if (gone[k].addr) {
      char v[256];
      dir_node(SECRET_TEXT, gone[k].node_key, gone[k].epoch, gone[k].addr, 600000, v, sizeof v);
      r = redisCommand(c, "SET %s %s", gone[k].node_key, v);
      freeReplyObject(r);
    }
    int before = atomic_load(&g_leases);
    CHECK(fetch_check(&b, 0, NB, 4000) == 0);
    CHECK(atomic_load(&g_leases) == before);
    /* (the fetcher removes stale entries right after it ends the slots the
     * query waits for: allow it a moment) */
    bool exists = true;
    for (int i = 0; i < 200 && exists; i++) {
      r = redisCommand(c, "EXISTS %s", keys->element[0]->str);
      exists = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
      if (r) freeReplyObject(r);
      if (exists && gone[k].removed)
        sleep_ms(10);
      else
        break;
    }
    if (exists == gone[k].removed) {
      fprintf(stderr, "holder '%s': its entry %s\n", gone[k].node,
              exists ? "was kept" : "was removed");
      CHECK(false);
    }
  }
  /* Answered correctly: fetched, verified, served byte-exact. */
  set_entries(c, keys, "rogue", 1);
  g_mode = R_GOOD;
  CHECK(fetch_check(&b, 0, NB, 4000) == NB);
  /* (the fetcher counts a block just after it seals it, which ends the
   * query's wait: the count may come a moment later) */
  for (int i = 0; i < 200 && cstats(&b).remote_blocks < NB; i++)
    sleep_ms(10);
  CHECK(cstats(&b).remote_blocks == NB);
  node_close(&b);
  oi__peer_net_destroy(rogue);
  freeReplyObject(keys);
  redisFree(c);
  free(g_region);
}

/* ---- a flood of LEASEs ---- */

typedef struct flooder {
  oi_peer *p;
  int calls, valid, closed;
} flooder;

static void *flood_main(void *arg) {
  flooder *f = arg;
  uint32_t n = get32(g_lease_req + HDR_BYTES + 16);
  for (int i = 0; i < f->calls; i++) {
    void *rep = NULL;
    size_t rl = 0;
    oi_status st = oi__peer_call(f->p, g_lease_req, g_lease_len, &rep, &rl, 0);
    if (st == OI_OK && rl == LEASE_REPLY_BYTES(n) && get32((uint8_t *)rep + HDR_BYTES + 8) == n)
      f->valid++;
    else if (st == OI_ERR_CLOSED || st == OI_ERR_IO)
      f->closed++;
    oi__free(rep);
  }
  return NULL;
}

/* A holder flooded with LEASEs (the LEASE a real reader sent, its blocks
 * all there): thousands sent without waiting and calls from four threads
 * meanwhile, more than its server threads' queue holds. Every call gets a
 * full, valid lease (its blocks counted served); and destroyed with LEASEs queued and leases
 * outstanding, it ends cleanly, its calls ending OI_ERR_CLOSED or answered. */
static void test_lease_flood(void) {
  REQUIRE(g_lease_len >= LEASE_BYTES(1)); /* test_rogue_holder captured one */
  node a;
  node_open(&a, "flooded");
  save(&a, 0, NB);
  oi_peer_net_options o = {.listen_addr = "127.0.0.1:0",
                           .node_id = "flooder",
                           .secret = (const uint8_t *)SECRET_TEXT,
                           .secret_len = strlen(SECRET_TEXT),
                           .timeout_ms = 10000};
  oi_peer_net *net = NULL;
  REQUIRE(oi__peer_net_create(&o, &net) == OI_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", cstats(&a).port);
  oi_peer *p = NULL;
  REQUIRE(oi__peer_connect(net, addr, &p) == OI_OK);
  for (int round = 0; round < 2; round++) {
    flooder f[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
      f[i] = (flooder){.p = p, .calls = 50};
      REQUIRE(pthread_create(&th[i], NULL, flood_main, &f[i]) == 0);
    }
    for (int i = 0; i < 2000; i++)
      CHECK_OK(oi__peer_send(p, g_lease_req, g_lease_len, 0));
    if (round == 1) {
      /* Destroyed under the flood: LEASEs queued for its servers are
       * refused, the ones still coming answered on the progress thread. */
      node_close(&a);
    }
    for (int i = 0; i < 4; i++) {
      pthread_join(th[i], NULL);
      if (round == 0) {
        CHECK(f[i].valid == f[i].calls);
      } else if (f[i].valid + f[i].closed != f[i].calls) {
        fprintf(stderr, "flooder %d: %d valid, %d closed of %d\n", i, f[i].valid, f[i].closed,
                f[i].calls);
        CHECK(false);
      }
    }
    if (round == 0) CHECK(cstats(&a).served_blocks >= 200u * get32(g_lease_req + HDR_BYTES + 16));
  }
  oi__peer_net_destroy(net);
}

/* ---- notes: publishes and withdrawals in batches ---- */

/* 300 blocks of 4 KiB saved in one call and evicted at once: the worker
 * sends their keys to the directory in runs of at most 256, a run ending
 * where sealed notes give way to evictions. Every block is published and
 * withdrawn (300 withdrawals), and Redis ends with none of their entries. */
static void test_notes_in_batches(void) {
  enum { N = 300, B = 4096 };
  redisContext *c = raw(g_port);
  REQUIRE(c);
  redisReply *r = redisCommand(c, "DBSIZE");
  REQUIRE(r && r->type == REDIS_REPLY_INTEGER);
  long long before = r->integer;
  freeReplyObject(r);
  oi_host_options ho = tr_host_options(4ull << 20);
  ho.flags = OI_HOST_NO_PIN;
  oi_host *h = tr_host_new(&ho);
  oi_host_cluster_options co;
  oi_host_cluster_options_init(&co);
  co.redis_url = g_url;
  co.node_id = "batcher";
  co.listen_addr = "127.0.0.1:0";
  co.secret_file = g_secret_path;
  co.timeout_ms = 2000;
  REQUIRE(oi_host_attach_cluster(h, &co) == OI_OK);
  uint8_t *mem = calloc(N, B);
  REQUIRE(mem);
  oi_arena_desc ad = tr_arena("kv", mem, N, B);
  oi_engine_options eo = tr_engine_options("batches", &ad, 1);
  oi_engine *e = tr_engine_new(h, &eo);
  int64_t ids[N];
  oi_block_hash hs[N];
  for (int i = 0; i < N; i++) {
    ids[i] = i;
    hs[i] = hash_of(100000 + (uint64_t)i);
    memset(mem + (size_t)i * B, i & 0xff, B);
  }
  CHECK_OK(tr_save(e, ids, hs, N, 10000));
  uint64_t ev = 0;
  CHECK_OK(oi_host_evict_all(h, &ev));
  CHECK(ev == N);
  oi_host_cluster_stats st = {.struct_size = sizeof st};
  for (int i = 0; i < 500; i++) {
    CHECK_OK(oi_host_get_cluster_stats(h, &st));
    if (st.published >= N && st.unpublished == N) break;
    sleep_ms(10);
  }
  /* (published may count a block twice: the directory's first connection
   * republishes what the pool holds) */
  if (st.published < N || st.unpublished != N)
    fprintf(stderr, "published %llu, unpublished %llu\n", (unsigned long long)st.published,
            (unsigned long long)st.unpublished);
  CHECK(st.published >= N && st.unpublished == N);
  long long after = -1;
  for (int i = 0; i < 300 && after != before + 1; i++) { /* + this node's liveness key */
    r = redisCommand(c, "DBSIZE");
    after = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r) freeReplyObject(r);
    if (after != before + 1) sleep_ms(10);
  }
  if (after != before + 1) {
    fprintf(stderr, "redis holds %lld keys, %lld before\n", after, before);
    CHECK(false);
  }
  oi_engine_destroy(e);
  oi_host_destroy(h);
  free(mem);
  redisFree(c);
}

/* ---- attach: secret files, an advertised address ---- */

static void test_secret_files_and_advertise(void) {
  oi_host_options ho = tr_host_options(1 << 20);
  ho.flags = OI_HOST_NO_PIN;
  oi_host *h = tr_host_new(&ho);
  oi_host_cluster_options co;
  CHECK_ST(oi_host_cluster_options_init(NULL), OI_ERR_INVALID_ARGUMENT);
  oi_host_cluster_options_init(&co);
  co.redis_url = g_url;
  co.node_id = "secret-test";
  co.listen_addr = "127.0.0.1:0";
  char p[600];
  /* Missing; a directory; a symbolic link to a good secret. */
  snprintf(p, sizeof p, "%s/missing", g_dir);
  co.secret_file = p;
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_NOT_FOUND);
  CHECK(strstr(oi_last_error(), "missing"));
  snprintf(p, sizeof p, "%s/adir", g_dir);
  REQUIRE(mkdir(p, 0700) == 0);
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_PERMISSION);
  CHECK(strstr(oi_last_error(), "not a regular file"));
  rmdir(p);
  snprintf(p, sizeof p, "%s/link", g_dir);
  REQUIRE(symlink(g_secret_path, p) == 0);
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_PERMISSION);
  unlink(p);
  CHECK_ST(oi_host_attach_cluster(NULL, &co), OI_ERR_INVALID_ARGUMENT);
  oi_host_cluster_stats cs = {.struct_size = sizeof cs};
  CHECK_ST(oi_host_get_cluster_stats(NULL, &cs), OI_ERR_INVALID_ARGUMENT);
  CHECK_ST(oi_host_get_cluster_stats(h, NULL), OI_ERR_INVALID_ARGUMENT);
  /* An address to advertise instead of the listener's: it is what peers
   * find in the directory. */
  co.secret_file = g_secret_path;
  co.advertise_addr = "10.1.2.3:4567";
  CHECK_OK(oi_host_attach_cluster(h, &co));
  redisContext *c = raw(g_port);
  REQUIRE(c);
  bool seen = false;
  for (int i = 0; i < 300 && !seen; i++) {
    redisReply *r = redisCommand(c, "GET oi:node:secret-test");
    seen = r && r->type == REDIS_REPLY_STRING && strstr(r->str, " 10.1.2.3:4567");
    if (r) freeReplyObject(r);
    if (!seen) sleep_ms(10);
  }
  CHECK(seen);
  redisFree(c);
  oi_host_destroy(h);
}

int main(void) {
  if (!on_path("redis-server")) TEST_SKIP("redis-server is not on PATH");
  if (oi__ucx_load() != OI_OK) TEST_SKIP("UCX is not installed");
  signal(SIGPIPE, SIG_IGN);
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/oi-rogue-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  REQUIRE(mkdtemp(g_dir));
  snprintf(g_secret_path, sizeof g_secret_path, "%s/secret", g_dir);
  int fd = open(g_secret_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0 && write(fd, SECRET_TEXT "\n", strlen(SECRET_TEXT) + 1) > 0);
  close(fd);
  g_port = free_port();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", g_port);
  g_redis = redis_start(g_port);
  RUN_TEST(test_holder_refuses_bad_requests);
  RUN_TEST(test_release_only_by_its_reader);
  RUN_TEST(test_rogue_holder);
  RUN_TEST(test_lease_flood);
  RUN_TEST(test_notes_in_batches);
  RUN_TEST(test_secret_files_and_advertise);
  redis_stop(g_redis);
  unlink(g_secret_path);
  rmdir(g_dir);
  TEST_EXIT();
}
