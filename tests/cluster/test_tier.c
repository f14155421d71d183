/* The cluster tier under hosts, through the public API (cpu backend), with
 * a private redis-server and the peer transport over TCP on 127.0.0.1:
 *  - node A saves blocks; they are published; node B's query finds them in
 *    the directory, fetches them (pending, LOADING; hits with
 *    OI_QUERY_WAIT_PENDING) and a load is byte-exact; B now holds them too;
 *  - A evicts its blocks: B's query for others of A's misses and the stale
 *    entries are removed (B keeps serving what it fetched);
 *  - a node with another secret (C) does not believe A's entries (their
 *    MACs fail): its query misses without asking A; a peer with that
 *    secret dialing A is refused; A keeps serving B;
 *  - Redis killed: queries degrade to local only (no hang); restarted: a
 *    new save is published and fetched again;
 *  - a codec namespace's frames cross nodes as they are: node B loads node
 *    A's lossless frames byte-exact; a node whose namespace of that name has
 *    no codec never gets them (another layout fingerprint);
 *  - bad options are refused with a message and attach nothing.
 * Skips (77) when redis-server is not on PATH. */
#include <fcntl.h>
#include <sys/stat.h>

#include "cluster/peer.h"
#include "cluster_util.h"
#include "openinfer/openinfer.h"

#define NB 16
#define BLOCK (64 * 1024)
#define HASH_TAG 0xC1
#include "node_rig.h"

static int g_port;
static pid_t g_redis;
static char g_url[64];
static char g_dir[256];

static void write_secret(const char *name, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
}

static oi_status node_open(node *n, const char *id, const char *secret, bool with_cluster) {
  char sp[512];
  snprintf(sp, sizeof sp, "%s/%s", g_dir, secret);
  return rig_open(n, "cluster-model", with_cluster ? g_url : NULL, id, sp, 3000);
}

/* Waits until `n` has published at least `want` entries. */
static void wait_published(node *n, uint64_t want) {
  for (int i = 0; i < 500 && cstats(n).published < want; i++)
    sleep_ms(10);
  CHECK(cstats(n).published >= want);
  sleep_ms(50); /* the directory's batch reaches Redis */
}

static void test_cross_node_round_trip(void) {
  node a, b;
  CHECK_OK(node_open(&a, "node-a", "secret", true));
  CHECK_OK(node_open(&b, "node-b", "secret", true));
  save(&a, 0, NB);
  wait_published(&a, NB);
  uint64_t t0 = oi__now_ns();
  CHECK(fetch_check(&b, 0, NB, 5000) == NB);
  fprintf(stderr, "  %d blocks of %d KiB fetched from node-a in %.2f ms\n", NB, BLOCK / 1024,
          ms_since(t0));
  oi_host_cluster_stats sb = cstats(&b), sa = cstats(&a);
  CHECK(sb.remote_blocks == NB && sb.remote_failed == 0 && sb.lookups >= 1);
  CHECK(sa.served_blocks == NB && sa.bytes_served == (uint64_t)NB * BLOCK);
  CHECK(sb.directory_connected == 1 && sa.port > 0);
  /* B holds them now: a second query is local (no new fetch). */
  CHECK(fetch_check(&b, 0, NB, 5000) == NB);
  CHECK(cstats(&b).remote_blocks == NB);

  /* A evicts everything: B asks for blocks only A had (never fetched by B):
   * misses, and their entries are removed as stale. */
  save(&a, 100, 4);
  wait_published(&a, NB + 4);
  uint64_t ev = 0;
  CHECK_OK(oi_engine_flush(a.e, 10000));
  CHECK_OK(oi_host_evict_all(a.h, &ev));
  CHECK(ev >= 4);
  /* (A's withdrawals may race B's lookup: either way B never gets bytes.) */
  CHECK(fetch_check(&b, 100, 4, 3000) == 0);
  CHECK(fetch_check(&b, 0, NB, 3000) == NB); /* what B fetched stays served */
  node_close(&b);
  node_close(&a);
}

/* Compressible bf16 (a narrow range of exponents, as KV has): element j of
 * codec block `logical`. */
static uint16_t kv_elem(uint64_t logical, uint64_t j) {
  float f = ((float)(pattern(logical, j) & 0xff) - 127.5f) / 64.0f;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* An engine of namespace "cluster-codec" on node n's host, codec `codec`,
 * over 2 * NB blocks of BLOCK bytes at mem. */
static oi_engine *codec_engine(node *n, const char *codec, uint16_t *mem) {
  oi_arena_desc ad = tr_arena("kv", mem, 2 * NB, BLOCK);
  oi_engine_options eo = tr_engine_options("cluster-codec", &ad, 1);
  eo.codec = codec;
  return tr_engine_new(n->h, &eo);
}

static void test_codec_frames_cross_nodes(void) {
  node a, b, c;
  CHECK_OK(node_open(&a, "node-a4", "secret", true));
  CHECK_OK(node_open(&b, "node-b4", "secret", true));
  CHECK_OK(node_open(&c, "node-c4", "secret", true));
  size_t elems = (size_t)2 * NB * BLOCK / 2;
  uint16_t *ma = calloc(elems, 2), *mb = calloc(elems, 2), *mc = calloc(elems, 2);
  REQUIRE(ma && mb && mc);
  oi_engine *ea = codec_engine(&a, "lossless", ma), *eb = codec_engine(&b, "lossless", mb);
  oi_engine *ec = codec_engine(&c, "none", mc);
  int64_t ids[NB], dst[NB];
  oi_block_hash hs[NB];
  for (int k = 0; k < NB; k++) {
    ids[k] = k;
    dst[k] = NB + k;
    hs[k] = hash_of(500 + (uint64_t)k);
    for (uint64_t j = 0; j < BLOCK / 2; j++)
      ma[(uint64_t)k * BLOCK / 2 + j] = kv_elem(500 + (uint64_t)k, j);
  }
  uint64_t before = cstats(&a).published;
  CHECK_OK(tr_save(ea, ids, hs, NB, 10000));
  CHECK(tr_engine_stats(ea).saves_completed == NB);
  wait_published(&a, before + NB);
  oi_query_result q = {.struct_size = sizeof q, .wait_ms = 5000};
  CHECK_OK(oi_engine_query(eb, NULL, hs, NB, OI_QUERY_WAIT_PENDING, &q));
  CHECK(q.hit_blocks == NB);
  if (q.hit_blocks) CHECK_OK(tr_load(eb, q.lease, dst, q.hit_blocks, 10000));
  CHECK(memcmp(mb + (size_t)NB * BLOCK / 2, ma, (size_t)NB * BLOCK) == 0);
  /* What crossed: frames (the slots' bytes), fewer than the blocks. */
  oi_host_cluster_stats sa = cstats(&a);
  fprintf(stderr, "  %d lossless frames fetched: %llu bytes served for %d logical\n", NB,
          (unsigned long long)sa.bytes_served, NB * BLOCK);
  CHECK(sa.bytes_served < (uint64_t)NB * BLOCK * 3 / 4 + 1);
  /* Another codec under the same name: A's frames are not its blocks. */
  oi_query_result qc = {.struct_size = sizeof qc, .wait_ms = 2000};
  CHECK_OK(oi_engine_query(ec, NULL, hs, NB, OI_QUERY_WAIT_PENDING, &qc));
  CHECK(qc.hit_blocks == 0);
  oi_engine_destroy(ec);
  oi_engine_destroy(eb);
  oi_engine_destroy(ea);
  node_close(&c);
  node_close(&b);
  node_close(&a);
  free(ma);
  free(mb);
  free(mc);
}

static void test_wrong_secret_is_refused(void) {
  node a, b, c;
  CHECK_OK(node_open(&a, "node-a2", "secret", true));
  CHECK_OK(node_open(&b, "node-b2", "secret", true));
  CHECK_OK(node_open(&c, "node-c2", "other-secret", true));
  save(&a, 200, 8);
  wait_published(&a, 8);
  /* C does not believe A's entries (their MACs are under another secret):
   * a miss without asking A */
  CHECK(fetch_check(&c, 200, 8, 3000) == 0);
  CHECK(cstats(&c).remote_failed == 0);
  CHECK(fetch_check(&b, 200, 8, 5000) == 8); /* A still serves others */
  /* A peer with another secret that dials A anyway is refused. */
  oi_peer_net_options po = {.listen_addr = "127.0.0.1:0",
                            .node_id = "node-c3",
                            .secret = (const uint8_t *)"other-secret-000000",
                            .secret_len = 19,
                            .timeout_ms = 2000};
  oi_peer_net *pn = NULL;
  REQUIRE(oi__peer_net_create(&po, &pn) == OI_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", cstats(&a).port);
  oi_peer *p = NULL;
  CHECK(oi__peer_connect(pn, addr, &p) != OI_OK);
  if (p) oi__peer_close(p);
  oi__peer_net_destroy(pn);
  for (int i = 0; i < 200 && cstats(&a).peers_refused < 1; i++)
    sleep_ms(10);
  CHECK(cstats(&a).peers_refused >= 1);
  node_close(&c);
  node_close(&b);
  node_close(&a);
}

static void test_redis_down_and_back(void) {
  node a, b;
  CHECK_OK(node_open(&a, "node-a3", "secret", true));
  CHECK_OK(node_open(&b, "node-b3", "secret", true));
  save(&a, 300, 4);
  wait_published(&a, 4);
  redis_stop(g_redis);
  uint64_t t0 = oi__now_ns();
  CHECK(fetch_check(&b, 300, 4, 2000) == 0); /* local only: a miss, quickly */
  CHECK(ms_since(t0) < 2500);
  g_redis = redis_start(g_port);
  for (int i = 0; i < 300 && !cstats(&a).directory_connected; i++)
    sleep_ms(10);
  for (int i = 0; i < 300 && !cstats(&b).directory_connected; i++)
    sleep_ms(10);
  CHECK(cstats(&a).directory_connected && cstats(&b).directory_connected);
  uint64_t before = cstats(&a).published;
  save(&a, 400, 4);
  wait_published(&a, before + 4);
  /* A may learn only now that its connection died (a batch lost with it):
   * it reconnects and publishes everything it holds again. */
  uint64_t got = 0;
  for (int i = 0; i < 100 && (got = fetch_check(&b, 400, 4, 5000)) < 4; i++)
    sleep_ms(50);
  CHECK(got == 4);
  CHECK(fetch_check(&b, 300, 4, 5000) == 4); /* saved before Redis died: published again */
  node_close(&b);
  node_close(&a);
}

static void test_bad_options(void) {
  oi_host_options ho = tr_host_options(1 << 20);
  ho.flags = OI_HOST_NO_PIN;
  oi_host *h = tr_host_new(&ho);
  oi_host_cluster_options co;
  oi_host_cluster_options_init(&co);
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "required") != NULL);
  char sp[512];
  snprintf(sp, sizeof sp, "%s/secret", g_dir);
  co.redis_url = g_url;
  co.node_id = "bad node id";
  co.listen_addr = "127.0.0.1:0";
  co.secret_file = sp;
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_INVALID_ARGUMENT);
  co.node_id = "node-x";
  write_secret("short", "tooshort");
  char shortp[512];
  snprintf(shortp, sizeof shortp, "%s/short", g_dir);
  co.secret_file = shortp;
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "bytes") != NULL);
  char open_p[512];
  snprintf(open_p, sizeof open_p, "%s/open", g_dir);
  write_secret("open", "0123456789abcdef0123");
  REQUIRE(chmod(open_p, 0644) == 0);
  co.secret_file = open_p;
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_PERMISSION);
  CHECK(strstr(oi_last_error(), "chmod 600") != NULL);
  co.secret_file = sp;
  co.listen_addr = "0.0.0.0:0";
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "advertise_addr") != NULL);
  /* Each required option missing alone; a struct_size no init wrote. */
  oi_host_cluster_options good = co;
  good.listen_addr = "127.0.0.1:0";
  for (int i = 0; i < 4; i++) {
    oi_host_cluster_options c = good;
    const char **field[] = {&c.redis_url, &c.node_id, &c.listen_addr, &c.secret_file};
    *field[i] = NULL;
    CHECK_ST(oi_host_attach_cluster(h, &c), OI_ERR_INVALID_ARGUMENT);
    CHECK(strstr(oi_last_error(), "required") != NULL);
  }
  oi_host_cluster_options c = good;
  c.struct_size = 2;
  CHECK_ST(oi_host_attach_cluster(h, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "struct_size") != NULL);
  /* A secret over the limit (a CRLF ending is no part of a secret: one of
   * exactly the limit is taken below); a listen address with no port; an
   * address to advertise that is none. Each refused before anything is set
   * up (oi_host_cluster_options_check's checks). */
  enum { SECRET_MAX = 1024 }; /* the longest secret (docs/cluster.md) */
  static char big[SECRET_MAX + 3];
  memset(big, 's', SECRET_MAX + 1);
  write_secret("long", big);
  char longp[512];
  snprintf(longp, sizeof longp, "%s/long", g_dir);
  c = good;
  c.secret_file = longp;
  CHECK_ST(oi_host_attach_cluster(h, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "bytes") != NULL);
  c = good;
  c.listen_addr = "127.0.0.1";
  CHECK_ST(oi_host_attach_cluster(h, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "IP:PORT") != NULL);
  c = good;
  c.advertise_addr = "has space:1";
  CHECK_ST(oi_host_attach_cluster(h, &c), OI_ERR_INVALID_ARGUMENT);
  CHECK(strstr(oi_last_error(), "advertise_addr") != NULL);
  oi_host_cluster_stats none = {.struct_size = sizeof none};
  CHECK_ST(oi_host_get_cluster_stats(h, &none), OI_ERR_NOT_FOUND);
  big[SECRET_MAX] = '\r';
  big[SECRET_MAX + 1] = '\n';
  write_secret("long", big);
  c = good;
  c.secret_file = longp;
  CHECK_OK(oi_host_attach_cluster(h, &c));
  oi_host_destroy(h);
  h = NULL;
  h = tr_host_new(&ho);
  oi_host_cluster_stats s = {.struct_size = sizeof s};
  CHECK_ST(oi_host_get_cluster_stats(h, &s), OI_ERR_NOT_FOUND); /* nothing attached */
  co.listen_addr = "127.0.0.1:0";
  CHECK_OK(oi_host_attach_cluster(h, &co));
  CHECK_ST(oi_host_attach_cluster(h, &co), OI_ERR_STATE);
  oi_host_destroy(h);
}

int main(void) {
  if (!on_path("redis-server")) TEST_SKIP("redis-server is not on PATH");
  signal(SIGPIPE, SIG_IGN);
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/oi-cluster-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  REQUIRE(mkdtemp(g_dir));
  write_secret("secret", "a-cluster-secret-of-32-bytes-000\n");
  write_secret("other-secret", "another-secret-nobody-else-has-0");
  g_port = free_port();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", g_port);
  g_redis = redis_start(g_port);
  RUN_TEST(test_cross_node_round_trip);
  RUN_TEST(test_codec_frames_cross_nodes);
  RUN_TEST(test_wrong_secret_is_refused);
  RUN_TEST(test_redis_down_and_back);
  RUN_TEST(test_bad_options);
  redis_stop(g_redis);
  static const char *files[] = {"secret", "other-secret", "short", "open", "long"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, files[i]);
    unlink(p);
  }
  rmdir(g_dir);
  TEST_EXIT();
}
