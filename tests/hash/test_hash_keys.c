/* External keys (oi_block_key_from_bytes, oi_block_keys_from_bytes) and
 * per-block extra keys (oi_hash_blocks_ex): properties, struct_size
 * versioning and argument validation. Bit-exact values are checked by
 * test_hash_vectors.py against python3-xxhash. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rig.h"
#include "testutil.h"

#define BS 16u
#define NBLK 8u
#define NTOK (BS * NBLK)

static bool hash_eq(const oi_block_hash *a, const oi_block_hash *b) {
  return memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0;
}

static void fill_bytes(uint8_t *p, size_t n, uint32_t seed) {
  uint32_t x = seed;
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(tr_xorshift32(&x) >> 11);
}

static oi_block_hash key_of(const void *k, size_t len) {
  oi_block_hash h;
  memset(&h, 0, sizeof h);
  oi_status st = oi_block_key_from_bytes(k, len, &h);
  if (st != OI_OK) {
    fprintf(stderr, "oi_block_key_from_bytes(len %zu): %s (%s)\n", len, oi_status_str(st),
            oi_last_error());
    exit(1);
  }
  return h;
}

static void expect_status(oi_status got, oi_status want, const char *what) {
  if (got != want) {
    fprintf(stderr, "%s: got %s, expected %s\n", what, oi_status_str(got), oi_status_str(want));
    oi_test_failures++;
  }
  if (want != OI_OK && oi_last_error()[0] == '\0') {
    fprintf(stderr, "%s: oi_last_error() is empty\n", what);
    oi_test_failures++;
  }
}

/* ---- external keys ---- */

static void test_key_basics(void) {
  uint8_t k[OI_BLOCK_KEY_MAX];
  fill_bytes(k, sizeof k, 1);
  /* Deterministic, and not the key itself. */
  oi_block_hash a = key_of(k, 32), b = key_of(k, 32);
  CHECK(hash_eq(&a, &b));
  CHECK(memcmp(a.bytes, k, 16) != 0);
  oi_block_hash k16 = key_of(k, 16);
  CHECK(memcmp(k16.bytes, k, 16) != 0);
  /* Every length 1..64 of the same bytes maps to a different hash (so a key
   * and its prefix never meet), and so does each one-bit change. */
  oi_block_hash by_len[OI_BLOCK_KEY_MAX + 1];
  for (size_t len = 1; len <= OI_BLOCK_KEY_MAX; len++) {
    by_len[len] = key_of(k, len);
    for (size_t j = 1; j < len; j++)
      CHECK(!hash_eq(&by_len[len], &by_len[j]));
    for (size_t bit = 0; bit < 8 * len; bit += 7) {
      uint8_t m[OI_BLOCK_KEY_MAX];
      memcpy(m, k, len);
      m[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      oi_block_hash h = key_of(m, len);
      CHECK(!hash_eq(&h, &by_len[len]));
    }
  }
  /* Trailing zero bytes count: "\0" and "\0\0", "ab" and "ab\0" differ. */
  const uint8_t zeros[2] = {0, 0};
  oi_block_hash z1 = key_of(zeros, 1), z2 = key_of(zeros, 2);
  CHECK(!hash_eq(&z1, &z2));
  oi_block_hash ab = key_of("ab", 2), ab0 = key_of("ab\0", 3);
  CHECK(!hash_eq(&ab, &ab0));
  /* The mapping is apart from oi_hash_blocks': the chain of one block
   * (block_size 1, parent = the key's first 16 bytes, token "abcd") hashes
   * the same 20 input bytes as the 20-byte key, with another seed. */
  oi_block_hash parent;
  memcpy(parent.bytes, k, 16);
  uint32_t tok = 0x64636261u; /* "abcd" as little-endian u32 */
  oi_block_hash chain;
  size_t n = 0;
  CHECK_OK(oi_hash_blocks(&tok, 1, 1, NULL, 0, &parent, &chain, 1, &n));
  uint8_t as_key[20];
  memcpy(as_key, k, 16);
  memcpy(as_key + 16, "abcd", 4);
  oi_block_hash mapped = key_of(as_key, sizeof as_key);
  CHECK(!hash_eq(&chain, &mapped)); /* same input bytes, another seed */
}

static void test_key_invalid(void) {
  uint8_t k[OI_BLOCK_KEY_MAX + 1];
  fill_bytes(k, sizeof k, 2);
  oi_block_hash out, marker;
  memset(&marker, 0x5A, sizeof marker);
  out = marker;
  oi_clear_error();
  expect_status(oi_block_key_from_bytes(k, 0, &out), OI_ERR_INVALID_ARGUMENT, "len 0");
  CHECK(hash_eq(&out, &marker));
  oi_clear_error();
  expect_status(oi_block_key_from_bytes(k, OI_BLOCK_KEY_MAX + 1, &out), OI_ERR_INVALID_ARGUMENT,
                "len 65");
  CHECK(strstr(oi_last_error(), "65") != NULL);
  CHECK(hash_eq(&out, &marker));
  oi_clear_error();
  expect_status(oi_block_key_from_bytes(NULL, 32, &out), OI_ERR_INVALID_ARGUMENT, "key NULL");
  CHECK(hash_eq(&out, &marker));
  oi_clear_error();
  expect_status(oi_block_key_from_bytes(k, 32, NULL), OI_ERR_INVALID_ARGUMENT, "out NULL");
  /* The largest key is accepted. */
  CHECK_OK(oi_block_key_from_bytes(k, OI_BLOCK_KEY_MAX, &out));
  CHECK(!hash_eq(&out, &marker));
}

static void test_keys_batch(void) {
  enum { N = 100 };
  static uint8_t keys[N * OI_BLOCK_KEY_MAX];
  fill_bytes(keys, sizeof keys, 3);
  const size_t lens[] = {1, 8, 16, 32, 36, OI_BLOCK_KEY_MAX};
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    size_t len = lens[li];
    oi_block_hash batch[N + 1];
    memset(batch, 0x77, sizeof batch);
    CHECK_OK(oi_block_keys_from_bytes(keys, len, N, batch));
    for (size_t i = 0; i < N; i++) {
      oi_block_hash one = key_of(keys + i * len, len);
      CHECK(hash_eq(&batch[i], &one));
      for (size_t j = 0; j < i; j++) /* equal iff the keys are (1-byte keys repeat) */
        CHECK(hash_eq(&batch[i], &batch[j]) == (memcmp(keys + i * len, keys + j * len, len) == 0));
    }
    oi_block_hash marker;
    memset(&marker, 0x77, sizeof marker);
    CHECK(hash_eq(&batch[N], &marker)); /* nothing past n */
  }
  /* Equal keys in one batch map equally. */
  uint8_t twice[64];
  memcpy(twice, keys, 32);
  memcpy(twice + 32, keys, 32);
  oi_block_hash two[2];
  CHECK_OK(oi_block_keys_from_bytes(twice, 32, 2, two));
  CHECK(hash_eq(&two[0], &two[1]));
}

static void test_keys_batch_invalid(void) {
  uint8_t keys[4 * 32];
  fill_bytes(keys, sizeof keys, 4);
  oi_block_hash out[4], marker[4];
  memset(marker, 0x3C, sizeof marker);
  /* n 0: nothing to do, NULL pointers allowed. */
  CHECK_OK(oi_block_keys_from_bytes(NULL, 32, 0, NULL));
  struct {
    const void *keys;
    size_t key_len, n;
    oi_block_hash *out;
    const char *what;
  } bad[] = {
      {keys, 0, 4, out, "key_len 0"},
      {keys, OI_BLOCK_KEY_MAX + 1, 1, out, "key_len 65"},
      {NULL, 32, 4, out, "keys NULL"},
      {keys, 32, 4, NULL, "out NULL"},
      {keys, 64, SIZE_MAX / 32, out, "n * key_len overflows"},
      {NULL, 0, 0, NULL, "key_len 0 with n 0"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(out, marker, sizeof out);
    oi_clear_error();
    expect_status(oi_block_keys_from_bytes(bad[i].keys, bad[i].key_len, bad[i].n, bad[i].out),
                  OI_ERR_INVALID_ARGUMENT, bad[i].what);
    CHECK(memcmp(out, marker, sizeof out) == 0);
  }
}

/* ---- per-block extra keys ---- */

static oi_hash_blocks_args args_of(const uint32_t *tok, size_t n, const void *salt, size_t salt_len,
                                   const oi_block_hash *parent) {
  oi_hash_blocks_args a;
  oi_hash_blocks_args_init(&a);
  a.block_size = BS;
  a.tokens = tok;
  a.n_tokens = n;
  a.salt = salt;
  a.salt_len = salt_len;
  a.parent = parent;
  return a;
}

static void ex_all(const oi_hash_blocks_args *a, oi_block_hash *out, size_t cap, size_t *n) {
  oi_status st = oi_hash_blocks_ex(a, out, cap, n);
  if (st != OI_OK) {
    fprintf(stderr, "oi_hash_blocks_ex: %s (%s)\n", oi_status_str(st), oi_last_error());
    exit(1);
  }
}

static void test_args_init(void) {
  oi_hash_blocks_args a;
  memset(&a, 0xFF, sizeof a);
  oi_hash_blocks_args_init(&a);
  CHECK(a.struct_size == sizeof a);
  CHECK(a.block_size == 0 && a.tokens == NULL && a.n_tokens == 0);
  CHECK(a.salt == NULL && a.salt_len == 0 && a.parent == NULL);
  CHECK(a.extra_keys == NULL && a.n_extra_keys == 0);
  oi_hash_blocks_args_init(NULL); /* ignored */
}

/* Without extra keys (none given, all empty, or only past the full blocks)
 * the chain is oi_hash_blocks'. */
static void test_ex_equals_plain(void) {
  uint32_t tok[NTOK + 5];
  tr_fill_tokens(tok, NTOK + 5, 5);
  oi_block_hash parent;
  fill_bytes(parent.bytes, 16, 55);
  const char salt[] = "model-x";
  const void *salts[] = {NULL, salt};
  const size_t salt_lens[] = {0, sizeof salt - 1};
  const oi_block_hash *parents[] = {NULL, &parent};
  static const uint8_t dummy[1] = {9};
  oi_block_extra_key empty[NBLK + 1];
  for (unsigned i = 0; i <= NBLK; i++) {
    empty[i].bytes = i % 2 ? dummy : NULL; /* len 0: bytes may be anything */
    empty[i].len = 0;
  }
  oi_block_extra_key tail_only[NBLK + 1];
  memcpy(tail_only, empty, sizeof empty);
  tail_only[NBLK].bytes = "image";
  tail_only[NBLK].len = 5;
  for (int s = 0; s < 2; s++)
    for (int p = 0; p < 2; p++)
      for (size_t len = 0; len <= NTOK + 5; len += 7) {
        oi_block_hash want[NBLK], got[NBLK];
        size_t nw = 0, ng = 0;
        CHECK_OK(oi_hash_blocks(tok, len, BS, salts[s], salt_lens[s], parents[p], want, NBLK, &nw));
        oi_hash_blocks_args a = args_of(tok, len, salts[s], salt_lens[s], parents[p]);
        ex_all(&a, got, NBLK, &ng);
        CHECK(ng == nw && memcmp(got, want, nw * sizeof *got) == 0);
        a.extra_keys = empty;
        a.n_extra_keys = NBLK + 1;
        ex_all(&a, got, NBLK, &ng);
        CHECK(ng == nw && memcmp(got, want, nw * sizeof *got) == 0);
        /* An extra key for the partial tail's block is ignored. */
        a.extra_keys = tail_only;
        ex_all(&a, got, NBLK, &ng);
        CHECK(ng == nw && memcmp(got, want, nw * sizeof *got) == 0);
        /* Fewer entries than blocks: the rest have none. */
        a.extra_keys = empty;
        a.n_extra_keys = 2;
        ex_all(&a, got, NBLK, &ng);
        CHECK(ng == nw && memcmp(got, want, nw * sizeof *got) == 0);
      }
}

/* An extra key on block k changes block k and, through the chain, every
 * later block; blocks before k are unchanged. */
static void test_ex_extra_key_chains(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 6);
  oi_block_hash plain[NBLK];
  size_t n = 0;
  CHECK_OK(oi_hash_blocks(tok, NTOK, BS, "s", 1, NULL, plain, NBLK, &n));
  for (unsigned k = 0; k < NBLK; k++) {
    oi_block_extra_key x[NBLK];
    memset(x, 0, sizeof x);
    x[k].bytes = "img:7f3a";
    x[k].len = 8;
    oi_hash_blocks_args a = args_of(tok, NTOK, "s", 1, NULL);
    a.extra_keys = x;
    a.n_extra_keys = NBLK;
    oi_block_hash h[NBLK];
    ex_all(&a, h, NBLK, &n);
    CHECK(n == NBLK);
    for (unsigned i = 0; i < NBLK; i++)
      CHECK(hash_eq(&h[i], &plain[i]) == (i < k));
  }
}

/* Different extra keys give different hashes, including the shapes where
 * bytes move between the salt and the extra key, or into a longer key. */
static void test_ex_extra_key_distinct(void) {
  uint32_t tok[BS];
  tr_fill_tokens(tok, BS, 7);
  struct {
    const char *salt, *extra;
  } cases[] = {{"", NULL},   {"", "a"},     {"", "b"},      {"", "ab"},    {"a", "b"},
               {"ab", NULL}, {"", "ab\0"},  {"", "\0"},     {"b", "a"},    {"ab", "c"},
               {"a", "bc"},  {"abc", NULL}, {"", "lora-1"}, {"lora-1", ""}};
  const size_t lens[][2] = {{0, 0}, {0, 1}, {0, 1}, {0, 2}, {1, 1}, {2, 0}, {0, 3},
                            {0, 1}, {1, 1}, {2, 1}, {1, 2}, {3, 0}, {0, 6}, {6, 0}};
  enum { NC = sizeof cases / sizeof cases[0] };
  oi_block_hash h[NC];
  for (size_t c = 0; c < NC; c++) {
    oi_block_extra_key x = {cases[c].extra, lens[c][1]};
    oi_hash_blocks_args a = args_of(tok, BS, cases[c].salt, lens[c][0], NULL);
    a.extra_keys = &x;
    a.n_extra_keys = 1;
    size_t n = 0;
    ex_all(&a, &h[c], 1, &n);
    CHECK(n == 1);
  }
  /* {"lora-1", ""} (an empty extra key) is the plain salted chain; all other
   * pairs are distinct from each other. */
  for (size_t i = 0; i < NC; i++)
    for (size_t j = i + 1; j < NC; j++)
      if (hash_eq(&h[i], &h[j])) {
        fprintf(stderr, "cases %zu and %zu collide\n", i, j);
        oi_test_failures++;
      }
}

/* Hashing a suffix with parent = the hash before it and the suffix's extra
 * keys continues the chain; a short out_cap writes that many and fails. */
static void test_ex_continue_and_out_cap(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 8);
  oi_block_extra_key x[NBLK];
  uint8_t img[NBLK][32];
  for (unsigned i = 0; i < NBLK; i++) {
    fill_bytes(img[i], 32, 100 + i);
    x[i].bytes = img[i];
    x[i].len = i % 3 == 1 ? 0 : 1 + i * 4;
  }
  oi_hash_blocks_args a = args_of(tok, NTOK, "lora", 4, NULL);
  a.extra_keys = x;
  a.n_extra_keys = NBLK;
  oi_block_hash all[NBLK];
  size_t n = 0;
  ex_all(&a, all, NBLK, &n);
  for (unsigned k = 1; k < NBLK; k++) {
    oi_hash_blocks_args b = args_of(tok + k * BS, NTOK - k * BS, "lora", 4, &all[k - 1]);
    b.extra_keys = x + k;
    b.n_extra_keys = NBLK - k;
    oi_block_hash h[NBLK];
    ex_all(&b, h, NBLK, &n);
    CHECK(n == NBLK - k && memcmp(h, all + k, n * sizeof *h) == 0);
  }
  for (size_t cap = 0; cap < NBLK; cap++) {
    oi_block_hash h[NBLK];
    memset(h, 0xCD, sizeof h);
    oi_clear_error();
    expect_status(oi_hash_blocks_ex(&a, h, cap, &n), OI_ERR_INVALID_ARGUMENT, "short out_cap");
    CHECK(n == NBLK);
    CHECK(memcmp(h, all, cap * sizeof *h) == 0);
    CHECK(h[cap].bytes[0] == 0xCD && h[cap].bytes[15] == 0xCD);
  }
}

/* struct_size: an older, smaller struct keeps the defaults of the fields it
 * does not cover; a larger one is accepted when its tail is zero. */
static void test_ex_struct_size(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 9);
  oi_block_hash plain[NBLK], h[NBLK];
  size_t n = 0;
  CHECK_OK(oi_hash_blocks(tok, NTOK, BS, NULL, 0, NULL, plain, NBLK, &n));
  oi_block_extra_key x[1] = {{"img", 3}};
  oi_hash_blocks_args a = args_of(tok, NTOK, NULL, 0, NULL);
  a.extra_keys = x;
  a.n_extra_keys = 1;
  /* A caller whose struct ends before extra_keys: no extra keys. */
  a.struct_size = (uint32_t)offsetof(oi_hash_blocks_args, extra_keys);
  ex_all(&a, h, NBLK, &n);
  CHECK(n == NBLK && memcmp(h, plain, sizeof plain) == 0);
  /* The whole struct: block 0 has its key. */
  a.struct_size = sizeof a;
  ex_all(&a, h, NBLK, &n);
  CHECK(!hash_eq(&h[0], &plain[0]));
  oi_block_hash with_key = h[0];
  /* A struct that ends before block_size: block_size keeps its default 0. */
  a.struct_size = (uint32_t)offsetof(oi_hash_blocks_args, block_size);
  oi_clear_error();
  expect_status(oi_hash_blocks_ex(&a, h, NBLK, &n), OI_ERR_INVALID_ARGUMENT, "no block_size");
  a.struct_size = 0;
  oi_clear_error();
  expect_status(oi_hash_blocks_ex(&a, h, NBLK, &n), OI_ERR_INVALID_ARGUMENT, "struct_size 0");
  /* A newer caller's larger struct: a zero tail is fine, a set one is not. */
  struct {
    oi_hash_blocks_args a;
    uint64_t future;
  } big;
  memset(&big, 0, sizeof big);
  big.a = a;
  big.a.struct_size = sizeof big;
  ex_all(&big.a, h, NBLK, &n);
  CHECK(hash_eq(&h[0], &with_key));
  big.future = 1;
  oi_clear_error();
  expect_status(oi_hash_blocks_ex(&big.a, h, NBLK, &n), OI_ERR_UNSUPPORTED, "future field set");
}

typedef struct bad_case {
  oi_hash_blocks_args a;
  oi_block_hash *out;
  const char *what;
} bad_case;

static void test_ex_invalid(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 10);
  oi_block_hash h[NBLK], marker[NBLK];
  memset(marker, 0x42, sizeof marker);
  size_t n = 0;
  oi_clear_error();
  expect_status(oi_hash_blocks_ex(NULL, h, NBLK, &n), OI_ERR_INVALID_ARGUMENT, "args NULL");
  oi_hash_blocks_args ok = args_of(tok, NTOK, NULL, 0, NULL);
  oi_clear_error();
  expect_status(oi_hash_blocks_ex(&ok, h, NBLK, NULL), OI_ERR_INVALID_ARGUMENT, "n_out NULL");

  oi_block_extra_key null_bytes[NBLK + 2];
  memset(null_bytes, 0, sizeof null_bytes);
  null_bytes[NBLK + 1].len = 4; /* past the full blocks: still refused */
  oi_block_extra_key mid[NBLK];
  memset(mid, 0, sizeof mid);
  mid[0].bytes = "x";
  mid[0].len = 1;
  mid[5].len = 2;
  bad_case bad[8];
  size_t nb = 0;
  bad[nb] = (bad_case){ok, h, "block_size 0"};
  bad[nb++].a.block_size = 0;
  bad[nb] = (bad_case){ok, h, "tokens NULL"};
  bad[nb++].a.tokens = NULL;
  bad[nb] = (bad_case){ok, h, "salt NULL"};
  bad[nb++].a.salt_len = 3;
  bad[nb++] = (bad_case){ok, NULL, "out NULL"};
  bad[nb] = (bad_case){ok, h, "extra_keys NULL"};
  bad[nb++].a.n_extra_keys = 2;
  bad[nb] = (bad_case){ok, h, "extra key bytes NULL past the blocks"};
  bad[nb].a.extra_keys = null_bytes;
  bad[nb++].a.n_extra_keys = NBLK + 2;
  bad[nb] = (bad_case){ok, h, "extra key 5 bytes NULL"};
  bad[nb].a.extra_keys = mid;
  bad[nb++].a.n_extra_keys = NBLK;
  for (size_t i = 0; i < nb; i++) {
    memcpy(h, marker, sizeof h);
    n = 12345;
    oi_clear_error();
    expect_status(oi_hash_blocks_ex(&bad[i].a, bad[i].out, NBLK, &n), OI_ERR_INVALID_ARGUMENT,
                  bad[i].what);
    CHECK(n == 0);
    CHECK(memcmp(h, marker, sizeof h) == 0); /* nothing written */
  }
  CHECK(strstr(oi_last_error(), "extra key 5") != NULL);
}

int main(void) {
  RUN_TEST(test_key_basics);
  RUN_TEST(test_key_invalid);
  RUN_TEST(test_keys_batch);
  RUN_TEST(test_keys_batch_invalid);
  RUN_TEST(test_args_init);
  RUN_TEST(test_ex_equals_plain);
  RUN_TEST(test_ex_extra_key_chains);
  RUN_TEST(test_ex_extra_key_distinct);
  RUN_TEST(test_ex_continue_and_out_cap);
  RUN_TEST(test_ex_struct_size);
  RUN_TEST(test_ex_invalid);
  TEST_EXIT();
}
