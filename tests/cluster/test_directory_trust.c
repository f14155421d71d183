/* The block directory against writers that are not the cluster, with real
 * redis-server processes (one plain, one with a password and an ACL user):
 *  - a node with another secret publishes: a good reader believes none of
 *    it (0 hits) and counts every entry it rejects;
 *  - a raw Redis writer forges entries and node records (made up, copied
 *    from another key or another cluster, expired, a believed record with
 *    one field edited, node records pointing elsewhere): none believed,
 *    each counted; a value signed with the
 *    secret as docs/cluster.md describes it (computed here) is believed;
 *  - a good node's own withdrawal still works; a reader's withdrawal
 *    removes only the very record it read;
 *  - AUTH: a password from a file (an ACL user) and from the environment
 *    (the default user) work; a wrong or missing password is a clear
 *    error at open; bad auth files are refused;
 *  - two cluster names on one Redis do not see each other's entries;
 *  - entries of a holder that cannot be reached are dropped after one
 *    failure (oi__dir_drop), and the holder, told by a marker, publishes
 *    again at its next beat.
 * Skips (77) when redis-server is not on PATH. */
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "cluster/directory.h"
#include "cluster_util.h"

#define SECRET "the good cluster's secret"
#define OTHER "another cluster's secret!"

static int g_port, g_auth_port;
static pid_t g_redis, g_auth_redis;
static char g_url[64], g_auth_url[64], g_dir[128];

static oi_tier_key key_of(uint32_t i) {
  oi_tier_key k = {.ns_fp = 0x5151515151515151ull, .layout_fp = 0x0102030405060708ull};
  memcpy(k.hash, &i, sizeof i);
  return k;
}

typedef struct dir_args {
  const char *url, *id, *secret, *name, *user, *password;
  uint64_t epoch;
  uint32_t node_ttl_ms;
  void (*on_reconnect)(void *);
} dir_args;

static oi_status try_open(const dir_args *a, oi_dir **out) {
  oi_dir_options o;
  oi__dir_options_init(&o);
  o.url = a->url ? a->url : g_url;
  o.node_id = a->id;
  o.epoch = a->epoch;
  o.secret = a->secret ? a->secret : SECRET;
  o.secret_len = strlen(o.secret);
  o.cluster_name = a->name;
  o.user = a->user;
  o.password = a->password;
  o.node_ttl_ms = a->node_ttl_ms;
  o.on_reconnect = a->on_reconnect;
  o.timeout_ms = 1000;
  *out = NULL;
  return oi__dir_open(&o, out);
}

static oi_dir *open_dir(dir_args a) {
  oi_dir *d = NULL;
  oi_status st = try_open(&a, &d);
  if (st != OI_OK) fprintf(stderr, "open: %s\n", oi_last_error());
  REQUIRE(st == OI_OK && d);
  return d;
}

static oi_dir_stats stats_of(oi_dir *d) {
  oi_dir_stats s;
  oi__dir_stats(d, &s);
  return s;
}

static void raw_set(const char *key, const char *val) {
  redisContext *c = raw(g_port);
  REQUIRE(c);
  redisReply *r = redisCommand(c, "SET %s %s", key, val);
  REQUIRE(r && r->type == REDIS_REPLY_STATUS);
  freeReplyObject(r);
  redisFree(c);
}

static size_t hits(oi_dir *d, const oi_tier_key *k, size_t n, oi_dir_holder *h) {
  size_t got = 99;
  CHECK_OK(oi__dir_lookup(d, k, n, h, &got));
  return got;
}

/* ---- tests ---- */

static void test_wrong_secret_node(void) {
  oi_dir *good = open_dir((dir_args){.id = "good", .epoch = 1});
  oi_dir *bad = open_dir((dir_args){.id = "intruder", .epoch = 2, .secret = OTHER});
  oi_tier_key k[8];
  for (uint32_t i = 0; i < 8; i++)
    k[i] = key_of(100 + i);
  CHECK_OK(oi__dir_publish(good, k, 8));
  CHECK_OK(oi__dir_flush(good, 2000));
  oi_dir_holder h[8];
  CHECK(hits(good, k, 8, h) == 8);
  /* the intruder publishes the same blocks (its SETs land: Redis cannot
   * tell) and a node record of its own */
  CHECK_OK(oi__dir_publish(bad, k, 8));
  CHECK_OK(oi__dir_set_advertise(bad, "127.0.0.1:9"));
  CHECK_OK(oi__dir_flush(bad, 2000));
  uint64_t before = stats_of(good).rejected_entries;
  CHECK(hits(good, k, 8, h) == 0); /* not believed: a miss, never a fetch from it */
  CHECK(stats_of(good).rejected_entries == before + 1); /* the first ends the run */
  for (uint32_t i = 0; i < 8; i++)
    CHECK(hits(good, &k[i], 1, h) == 0);
  CHECK(stats_of(good).rejected_entries == before + 9);
  char addr[64];
  oi_status st = OI_ERR_NOT_FOUND;
  for (int i = 0; i < 100 && st == OI_ERR_NOT_FOUND; i++) {
    st = oi__dir_node_lookup(good, "intruder", addr, sizeof addr, NULL);
    if (st == OI_ERR_NOT_FOUND) sleep_ms(10);
  }
  CHECK_ST(st, OI_ERR_PROTOCOL);
  CHECK(strstr(oi_last_error(), "MAC") != NULL);
  CHECK(stats_of(good).rejected_entries == before + 10);
  /* the intruder believes nothing of the good node's either */
  CHECK_OK(oi__dir_publish(good, k, 8));
  CHECK_OK(oi__dir_flush(good, 2000));
  CHECK(hits(bad, k, 8, h) == 0 && stats_of(bad).rejected_entries >= 1);
  CHECK(hits(good, k, 8, h) == 8); /* republished: believed again */
  oi__dir_close(bad);
  oi__dir_close(good);
}

static void test_raw_writer(void) {
  oi_dir *a = open_dir((dir_args){.id = "node-a", .epoch = 7});
  oi_dir *r = open_dir((dir_args){.id = "reader", .epoch = 1});
  oi_tier_key k = key_of(200), k2 = key_of(201);
  char key[OI_DIR_KEY_MAX + 1], key2[OI_DIR_KEY_MAX + 1], v[256], good_v[256];
  oi__dir_key_format(NULL, &k, key);
  oi__dir_key_format(NULL, &k2, key2);
  CHECK_OK(oi__dir_publish(a, &k, 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  redis_get(g_port, key, good_v, sizeof good_v);
  oi_dir_holder h[2];
  CHECK(hits(r, &k, 1, h) == 1);

  /* Entries a node never wrote. */
  char future[64];
  snprintf(future, sizeof future, "%llu", (unsigned long long)(wall_ms() + 600000));
  char made_up[256], other_secret[256], expired[256], wrong_tag[256];
  snprintf(made_up, sizeof made_up, "node-b 3 %s 0123456789abcdef0123456789abcdef", future);
  dir_entry(OTHER, key, "node-b", 3, 600000, other_secret, sizeof other_secret);
  dir_sign(SECRET, DIR_TAG_BLOCK, key, "node-b 3", wall_ms() - OI_DIR_CLOCK_SKEW_MS - 5000, expired,
           sizeof expired);
  dir_sign(SECRET, DIR_TAG_NODE, key, "node-b 3", wall_ms() + 600000, wrong_tag, sizeof wrong_tag);
  /* The good record the reader believed (and keeps, not to check its MAC
   * again) with one field edited, its MAC kept: the holder, the expiry. */
  char edited_node[256], edited_expiry[256];
  snprintf(edited_node, sizeof edited_node, "%s", good_v);
  edited_node[5] = 'b'; /* "node-a ..." -> "node-b ..." */
  snprintf(edited_expiry, sizeof edited_expiry, "%s", good_v);
  char *sp = strchr(strchr(edited_expiry, ' ') + 1, ' ') + 1; /* the expiry's first digit */
  *sp = *sp == '9' ? '8' : (char)(*sp + 1);
  const char *forged[] = {"node-b 3", /* the format before MACs */
                          made_up,     other_secret,  expired, wrong_tag,
                          edited_node, edited_expiry, good_v /* below: on key2 */};
  for (size_t i = 0; i < OI_ARRAY_LEN(forged); i++) {
    bool copied = forged[i] == good_v; /* a good record copied to another key */
    raw_set(copied ? key2 : key, forged[i]);
    uint64_t before = stats_of(r).rejected_entries;
    size_t n = hits(r, copied ? &k2 : &k, 1, h);
    if (n != 0 || stats_of(r).rejected_entries != before + 1) {
      fprintf(stderr, "forged entry '%s': %zu hits, %llu rejected\n", forged[i], n,
              (unsigned long long)(stats_of(r).rejected_entries - before));
      oi_test_failures++;
    }
  }
  /* The good record again: believed (the very bytes checked before). */
  raw_set(key, good_v);
  CHECK(hits(r, &k, 1, h) == 1 && strcmp(h[0].node_id, "node-a") == 0 && h[0].epoch == 7);
  /* A record signed as the docs say (computed here, not by the library):
   * believed, and it names what it says. */
  dir_entry(SECRET, key, "node-b", 3, 600000, v, sizeof v);
  raw_set(key, v);
  CHECK(hits(r, &k, 1, h) == 1 && strcmp(h[0].node_id, "node-b") == 0 && h[0].epoch == 3);

  /* Node records: made up, pointed elsewhere under another secret, a good
   * one copied to another node's key, expired. */
  CHECK_OK(oi__dir_set_advertise(a, "10.0.0.1:4000"));
  char addr[64];
  oi_status st = OI_ERR_NOT_FOUND;
  for (int i = 0; i < 100 && st != OI_OK; i++) {
    st = oi__dir_node_lookup(r, "node-a", addr, sizeof addr, NULL);
    if (st != OI_OK) sleep_ms(10);
  }
  CHECK_OK(st);
  char good_node[256], n1[256], n2[256], n3[256];
  redis_get(g_port, "oi:node:node-a", good_node, sizeof good_node);
  snprintf(n1, sizeof n1, "7 10.6.6.6:4000 %s 0123456789abcdef0123456789abcdef", future);
  dir_node(OTHER, "oi:node:node-b", 3, "10.6.6.6:4000", 600000, n2, sizeof n2);
  dir_sign(SECRET, DIR_TAG_NODE, "oi:node:node-b", "3 10.0.0.2:4000",
           wall_ms() - OI_DIR_CLOCK_SKEW_MS - 5000, n3, sizeof n3);
  const char *nodes[] = {"3 10.6.6.6:4000", n1, n2, good_node, n3};
  for (size_t i = 0; i < OI_ARRAY_LEN(nodes); i++) {
    raw_set("oi:node:node-b", nodes[i]);
    uint64_t before = stats_of(r).rejected_entries;
    st = oi__dir_node_lookup(r, "node-b", addr, sizeof addr, NULL);
    if (st != OI_ERR_PROTOCOL || stats_of(r).rejected_entries != before + 1) {
      fprintf(stderr, "forged node record '%s': %s (%s), %s\n", nodes[i], oi_status_str(st),
              oi_last_error(), addr);
      oi_test_failures++;
    }
  }
  dir_node(SECRET, "oi:node:node-b", 3, "10.0.0.2:4000", 10000, v, sizeof v);
  raw_set("oi:node:node-b", v);
  uint64_t epoch = 0;
  CHECK_OK(oi__dir_node_lookup(r, "node-b", addr, sizeof addr, &epoch));
  CHECK(strcmp(addr, "10.0.0.2:4000") == 0 && epoch == 3);

  /* Withdrawals. A good node withdraws its own entry (a compare-and-delete
   * of "<node> <epoch> "); a forged entry naming another node is not its
   * to remove. */
  CHECK_OK(oi__dir_publish(a, &k, 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  CHECK(hits(r, &k, 1, h) == 1);
  oi_dir_holder read = h[0];
  CHECK_OK(oi__dir_unpublish(a, &k, 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  redis_get(g_port, key, v, sizeof v);
  CHECK(v[0] == '\0' && stats_of(a).unpublished >= 1);
  raw_set(key, made_up); /* names node-b */
  uint64_t missed = stats_of(a).unpublish_missed;
  CHECK_OK(oi__dir_unpublish(a, &k, 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  redis_get(g_port, key, v, sizeof v);
  CHECK(strcmp(v, made_up) == 0 && stats_of(a).unpublish_missed == missed + 1);
  /* A reader removes only the very record it read: not a newer one of the
   * same holder, not a forged one. */
  CHECK_ST(oi__dir_remove_stale(r, &k, &read), OI_ERR_NOT_FOUND);
  CHECK_OK(oi__dir_publish(a, &k, 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  sleep_ms(5); /* a new expiry: another record */
  CHECK_OK(oi__dir_publish(a, &k, 1));
  CHECK_OK(oi__dir_flush(a, 2000));
  CHECK_ST(oi__dir_remove_stale(r, &k, &read), OI_ERR_NOT_FOUND);
  CHECK(hits(r, &k, 1, h) == 1);
  CHECK_OK(oi__dir_remove_stale(r, &k, &h[0]));
  CHECK(hits(r, &k, 1, h) == 0);
  oi__dir_close(r);
  oi__dir_close(a);
}

static void test_prefixes(void) {
  oi_dir *a = open_dir((dir_args){.id = "n1", .epoch = 1, .name = "alpha"});
  oi_dir *b = open_dir((dir_args){.id = "n1", .epoch = 1, .name = "beta"});
  oi_dir *plain = open_dir((dir_args){.id = "n1", .epoch = 1});
  oi_tier_key k[4];
  for (uint32_t i = 0; i < 4; i++)
    k[i] = key_of(300 + i);
  CHECK_OK(oi__dir_publish(a, k, 4));
  CHECK_OK(oi__dir_flush(a, 2000));
  CHECK_OK(oi__dir_set_advertise(a, "10.0.0.9:1"));
  oi_dir_holder h[4];
  CHECK(hits(a, k, 4, h) == 4);
  CHECK(hits(b, k, 4, h) == 0 && hits(plain, k, 4, h) == 0);
  CHECK(stats_of(b).rejected_entries == 0); /* other keys, not rejected ones */
  char key[OI_DIR_KEY_MAX + 1], v[256];
  oi__dir_key_format("oi:alpha:", &k[0], key);
  redis_get(g_port, key, v, sizeof v);
  CHECK(strncmp(v, "n1 1 ", 5) == 0);
  char addr[64];
  oi_status st = OI_ERR_NOT_FOUND;
  for (int i = 0; i < 100 && st != OI_OK; i++) {
    st = oi__dir_node_lookup(a, "n1", addr, sizeof addr, NULL);
    if (st != OI_OK) sleep_ms(10);
  }
  CHECK_OK(st);
  CHECK_ST(oi__dir_node_lookup(b, "n1", addr, sizeof addr, NULL), OI_ERR_NOT_FOUND);
  /* beta publishes the same blocks: each cluster sees its own */
  CHECK_OK(oi__dir_publish(b, k, 2));
  CHECK_OK(oi__dir_flush(b, 2000));
  CHECK(hits(b, k, 4, h) == 2 && hits(a, k, 4, h) == 4);
  /* alpha's record copied into beta's key (same secret): not believed, the
   * key is under the MAC */
  char bkey[OI_DIR_KEY_MAX + 1];
  oi__dir_key_format("oi:beta:", &k[2], bkey);
  oi__dir_key_format("oi:alpha:", &k[2], key);
  redis_get(g_port, key, v, sizeof v);
  raw_set(bkey, v);
  uint64_t before = stats_of(b).rejected_entries;
  CHECK(hits(b, k, 4, h) == 2 && stats_of(b).rejected_entries == before + 1);
  oi__dir_close(plain);
  oi__dir_close(b);
  oi__dir_close(a);
}

static _Atomic int g_republish;
static void on_republish(void *ctx) {
  OI_UNUSED(ctx);
  atomic_fetch_add(&g_republish, 1);
}

static void test_drop(void) {
  oi_dir *hd = open_dir(
      (dir_args){.id = "far", .epoch = 5, .node_ttl_ms = 300, .on_reconnect = on_republish});
  oi_dir *other = open_dir((dir_args){.id = "near", .epoch = 1});
  oi_dir *r = open_dir((dir_args){.id = "reader", .epoch = 1});
  CHECK_OK(oi__dir_set_advertise(hd, "127.0.0.1:1"));
  oi_tier_key k[6];
  for (uint32_t i = 0; i < 6; i++)
    k[i] = key_of(400 + i);
  CHECK_OK(oi__dir_publish(hd, k, 4));
  CHECK_OK(oi__dir_flush(hd, 2000));
  CHECK_OK(oi__dir_publish(other, k + 4, 2));
  CHECK_OK(oi__dir_flush(other, 2000));
  oi_dir_holder h[6];
  CHECK(hits(r, k, 6, h) == 6);
  /* k[3] republished by its holder after the read: a newer record stays */
  sleep_ms(5);
  CHECK_OK(oi__dir_publish(hd, k + 3, 1));
  CHECK_OK(oi__dir_flush(hd, 2000));
  atomic_store(&g_republish, 0);
  /* the reader could not reach "far": one call drops what it read of it
   * (not near's, even when asked: those records are near's) */
  size_t removed = 0;
  CHECK_OK(oi__dir_drop(r, k, h, 6, &removed));
  CHECK(removed == 5); /* k[0..2] of far, k[4..5] as read (they are near's records) */
  oi_dir_holder h2[6];
  CHECK(hits(r, k, 6, h2) == 0);
  CHECK(hits(r, k + 3, 1, h2) == 1 && strcmp(h2[0].node_id, "far") == 0);
  CHECK(stats_of(r).dropped == 5);
  /* a holder that comes back reads the marker at its next beat and
   * publishes again */
  for (int i = 0; i < 200 && atomic_load(&g_republish) == 0; i++)
    sleep_ms(10);
  CHECK(atomic_load(&g_republish) >= 1);
  char v[64];
  redis_get(g_port, "oi:dropped:far", v, sizeof v);
  CHECK(v[0] == '\0'); /* taken */
  CHECK_ST(oi__dir_drop(r, NULL, h, 1, NULL), OI_ERR_INVALID_ARGUMENT);
  CHECK_OK(oi__dir_drop(r, k, h, 0, NULL));
  oi_dir_holder bad = {.node_id = "a b"};
  CHECK_ST(oi__dir_drop(r, k, &bad, 1, NULL), OI_ERR_INVALID_ARGUMENT);
  oi__dir_close(r);
  oi__dir_close(other);
  oi__dir_close(hd);
}

/* ---- AUTH ---- */

static void write_file(const char *path, const char *text, mode_t mode) {
  unlink(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  REQUIRE(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  fchmod(fd, mode);
  close(fd);
}

static void auth_round_trip(const char *user, const char *password, const char *id) {
  oi_dir *d = open_dir((dir_args){.url = g_auth_url,
                                  .id = id,
                                  .epoch = 1,
                                  .user = user[0] ? user : NULL,
                                  .password = password});
  oi_tier_key k = key_of(500);
  CHECK_OK(oi__dir_publish(d, &k, 1));
  CHECK_OK(oi__dir_flush(d, 2000));
  oi_dir_holder h;
  CHECK(hits(d, &k, 1, &h) == 1 && strcmp(h.node_id, id) == 0);
  oi_dir_stats s = stats_of(d);
  CHECK(s.connected && s.errors == 0);
  oi__dir_close(d);
}

static void test_auth(void) {
  char user[OI_DIR_USER_MAX + 1], pw[OI_DIR_PASSWORD_MAX + 1], path[256];
  unsetenv("OI_REDIS_USER");
  unsetenv("OI_REDIS_PASSWORD");
  CHECK_OK(oi__dir_auth_load(NULL, user, pw));
  CHECK(user[0] == '\0' && pw[0] == '\0'); /* none asked for: no AUTH */

  /* from a file: an ACL user */
  snprintf(path, sizeof path, "%s/redis-auth", g_dir);
  write_file(path, "# the directory's Redis user\nuser=alice\npassword=alice-pw\n", 0600);
  CHECK_OK(oi__dir_auth_load(path, user, pw));
  CHECK(strcmp(user, "alice") == 0 && strcmp(pw, "alice-pw") == 0);
  auth_round_trip(user, pw, "from-file");

  /* from the environment: the default user */
  setenv("OI_REDIS_PASSWORD", "server pw", 1);
  CHECK_OK(oi__dir_auth_load(NULL, user, pw));
  CHECK(user[0] == '\0' && strcmp(pw, "server pw") == 0);
  auth_round_trip(user, pw, "from-env");
  setenv("OI_REDIS_USER", "alice", 1);
  setenv("OI_REDIS_PASSWORD", "alice-pw", 1);
  CHECK_OK(oi__dir_auth_load(NULL, user, pw));
  auth_round_trip(user, pw, "from-env-user");
  unsetenv("OI_REDIS_PASSWORD");
  CHECK_ST(oi__dir_auth_load(NULL, user, pw), OI_ERR_INVALID_ARGUMENT);
  unsetenv("OI_REDIS_USER");

  /* a wrong password, a wrong user, none: refused at open, saying so */
  const struct {
    const char *user, *password, *says;
  } wrong[] = {{NULL, "not it", "WRONGPASS"},
               {"alice", "server pw", "WRONGPASS"},
               {"bob", "alice-pw", "user 'bob'"},
               {NULL, NULL, "NOAUTH"}};
  for (size_t i = 0; i < OI_ARRAY_LEN(wrong); i++) {
    oi_dir *d = NULL;
    dir_args a = {.url = g_auth_url,
                  .id = "w",
                  .epoch = 1,
                  .user = wrong[i].user,
                  .password = wrong[i].password};
    oi_status st = try_open(&a, &d);
    if (st != OI_ERR_PERMISSION || d || !strstr(oi_last_error(), wrong[i].says) ||
        !strstr(oi_last_error(), "OI_REDIS_PASSWORD") ||
        (wrong[i].password && strstr(oi_last_error(), wrong[i].password))) {
      fprintf(stderr, "wrong auth %zu: %s (%s)\n", i, oi_status_str(st), oi_last_error());
      oi_test_failures++;
    }
    oi__dir_close(d);
  }
  /* a password given to a Redis that has none: refused too */
  oi_dir *d = NULL;
  dir_args a = {.id = "w", .epoch = 1, .password = "unneeded"};
  CHECK_ST(try_open(&a, &d), OI_ERR_PERMISSION);
  CHECK(!d && strstr(oi_last_error(), "AUTH"));

  /* auth files that are refused */
  write_file(path, "password=x\n", 0644);
  CHECK_ST(oi__dir_auth_load(path, user, pw), OI_ERR_PERMISSION);
  CHECK(strstr(oi_last_error(), "chmod 600") != NULL);
  const char *bad[] = {"user=alice\n", "passwd=x\n", "password=\n", "password\n"};
  for (size_t i = 0; i < OI_ARRAY_LEN(bad); i++) {
    write_file(path, bad[i], 0600);
    CHECK_ST(oi__dir_auth_load(path, user, pw), OI_ERR_INVALID_ARGUMENT);
    CHECK(pw[0] == '\0');
  }
  write_file(path, "password=p w\r\n", 0600); /* CRLF, a space inside */
  CHECK_OK(oi__dir_auth_load(path, user, pw));
  CHECK(strcmp(pw, "p w") == 0 && user[0] == '\0');
  char missing[300];
  snprintf(missing, sizeof missing, "%s/none", g_dir);
  CHECK_ST(oi__dir_auth_load(missing, user, pw), OI_ERR_NOT_FOUND);
  CHECK_ST(oi__dir_auth_load(g_dir, user, pw), OI_ERR_PERMISSION); /* a directory */
  /* a user without a password */
  a = (dir_args){.id = "w", .epoch = 1, .user = "alice"};
  CHECK_ST(try_open(&a, &d), OI_ERR_INVALID_ARGUMENT);
  unlink(path);
}

int main(void) {
  signal(SIGPIPE, SIG_DFL);
  if (!on_path("redis-server")) TEST_SKIP("redis-server is not on PATH");
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/oi-trust-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  REQUIRE(mkdtemp(g_dir));
  g_port = free_port();
  snprintf(g_url, sizeof g_url, "redis://127.0.0.1:%d", g_port);
  g_redis = redis_start(g_port);
  g_auth_port = free_port();
  snprintf(g_auth_url, sizeof g_auth_url, "redis://127.0.0.1:%d", g_auth_port);
  g_auth_redis = redis_start_auth(g_auth_port, "server pw");
  { /* an ACL user too */
    redisContext *c = raw(g_auth_port);
    REQUIRE(c);
    redisReply *r = redisCommand(c, "AUTH %s", "server pw");
    REQUIRE(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = redisCommand(c, "ACL SETUSER alice on >alice-pw ~* &* +@all");
    REQUIRE(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    redisFree(c);
  }
  RUN_TEST(test_wrong_secret_node);
  RUN_TEST(test_raw_writer);
  RUN_TEST(test_prefixes);
  RUN_TEST(test_drop);
  RUN_TEST(test_auth);
  redis_stop(g_auth_redis);
  redis_stop(g_redis);
  rmdir(g_dir);
  TEST_EXIT();
}
