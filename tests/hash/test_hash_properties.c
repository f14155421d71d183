/* Properties of oi_hash_blocks: salting, prefix sharing, chaining, the
 * parent parameter, partial tail blocks, out_cap truncation and argument
 * validation. Bit-exact values are checked by test_hash_vectors.py. */
#include <stdbool.h>
#include <stdint.h>

#include "rig.h"
#include "testutil.h"

#define BS 16u
#define NBLK 8u
#define NTOK (BS * NBLK)
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static bool hash_eq(const oi_block_hash *a, const oi_block_hash *b) {
  return memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0;
}

static bool hash_is_zero(const oi_block_hash *h) {
  static const oi_block_hash zero;
  return hash_eq(h, &zero);
}

/* Hashes all NTOK tokens with the given salt; requires success. */
static void hash_all(const uint32_t *tokens, size_t n_tokens, const void *salt, size_t salt_len,
                     const oi_block_hash *parent, oi_block_hash *out, size_t out_cap,
                     size_t *n_out) {
  oi_status st = oi_hash_blocks(tokens, n_tokens, BS, salt, salt_len, parent, out, out_cap, n_out);
  if (st != OI_OK) {
    fprintf(stderr, "oi_hash_blocks: %s (%s)\n", oi_status_str(st), oi_last_error());
    exit(1);
  }
}

/* Fills tok[NTOK] with the tokens of `seed` and hashes them all, unsalted,
 * into out[NBLK]. @return the number of hashes. */
static size_t hash_seeded(uint32_t *tok, uint32_t seed, oi_block_hash *out) {
  tr_fill_tokens(tok, NTOK, seed);
  size_t n = 0;
  hash_all(tok, NTOK, NULL, 0, NULL, out, NBLK, &n);
  return n;
}

static void test_deterministic(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 1);
  oi_block_hash a[NBLK], b[NBLK];
  size_t na = 0, nb = 0;
  hash_all(tok, NTOK, NULL, 0, NULL, a, NBLK, &na);
  hash_all(tok, NTOK, NULL, 0, NULL, b, NBLK, &nb);
  CHECK(na == NBLK && nb == NBLK);
  CHECK(memcmp(a, b, sizeof a) == 0);
  for (unsigned i = 0; i < NBLK; i++)
    CHECK(!hash_is_zero(&a[i]));
  /* All block hashes of one sequence are distinct (they chain). */
  for (unsigned i = 0; i < NBLK; i++)
    for (unsigned j = i + 1; j < NBLK; j++)
      CHECK(!hash_eq(&a[i], &a[j]));
}

static void test_salt(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 2);
  oi_block_hash none[NBLK], s1[NBLK], s2[NBLK], s3[NBLK];
  size_t n = 0;
  const char salt1[] = "lora-1";
  const char salt2[] = "lora-2";
  const uint8_t salt3[1] = {0};
  hash_all(tok, NTOK, NULL, 0, NULL, none, NBLK, &n);
  hash_all(tok, NTOK, salt1, sizeof salt1 - 1, NULL, s1, NBLK, &n);
  hash_all(tok, NTOK, salt2, sizeof salt2 - 1, NULL, s2, NBLK, &n);
  hash_all(tok, NTOK, salt3, sizeof salt3, NULL, s3, NBLK, &n);
  for (unsigned i = 0; i < NBLK; i++) {
    CHECK(!hash_eq(&none[i], &s1[i]));
    CHECK(!hash_eq(&s1[i], &s2[i]));
    CHECK(!hash_eq(&none[i], &s3[i])); /* a single zero byte still counts */
    CHECK(!hash_eq(&s2[i], &s3[i]));
  }
  /* A non-NULL salt pointer with salt_len 0 is the same as no salt. */
  oi_block_hash empty[NBLK];
  hash_all(tok, NTOK, salt1, 0, NULL, empty, NBLK, &n);
  CHECK(memcmp(empty, none, sizeof none) == 0);
}

static void test_shared_prefix(void) {
  uint32_t a[NTOK], b[NTOK];
  tr_fill_tokens(a, NTOK, 3);
  memcpy(b, a, sizeof a);
  /* b diverges in the middle of block 5: blocks 0..4 are common. */
  const unsigned diverge = 5 * BS + 7;
  tr_fill_tokens(b + diverge, NTOK - diverge, 33);
  REQUIRE(a[diverge] != b[diverge]);
  oi_block_hash ha[NBLK], hb[NBLK];
  size_t n = 0;
  hash_all(a, NTOK, NULL, 0, NULL, ha, NBLK, &n);
  hash_all(b, NTOK, NULL, 0, NULL, hb, NBLK, &n);
  for (unsigned i = 0; i < NBLK; i++) {
    if (i < diverge / BS)
      CHECK(hash_eq(&ha[i], &hb[i]));
    else
      CHECK(!hash_eq(&ha[i], &hb[i]));
  }
  /* A shorter sequence that is a prefix of another shares all its full blocks. */
  oi_block_hash hs[NBLK];
  hash_all(a, 3 * BS + 5, NULL, 0, NULL, hs, NBLK, &n);
  CHECK(n == 3);
  for (unsigned i = 0; i < 3; i++)
    CHECK(hash_eq(&hs[i], &ha[i]));
}

static void test_one_token_change(void) {
  uint32_t base[NTOK];
  oi_block_hash hbase[NBLK];
  size_t n = hash_seeded(base, 4, hbase);
  /* For every block, flip the first, a middle and the last token of it. */
  const unsigned offsets[] = {0, BS / 2, BS - 1};
  for (unsigned blk = 0; blk < NBLK; blk++) {
    for (unsigned k = 0; k < ARRAY_LEN(offsets); k++) {
      uint32_t tok[NTOK];
      memcpy(tok, base, sizeof tok);
      tok[blk * BS + offsets[k]] ^= 1u;
      oi_block_hash h[NBLK];
      hash_all(tok, NTOK, NULL, 0, NULL, h, NBLK, &n);
      for (unsigned i = 0; i < NBLK; i++) {
        if (i < blk)
          CHECK(hash_eq(&h[i], &hbase[i]));
        else
          CHECK(!hash_eq(&h[i], &hbase[i]));
      }
    }
  }
}

static void test_token_order_matters(void) {
  uint32_t a[BS], b[BS];
  for (unsigned i = 0; i < BS; i++)
    a[i] = b[i] = i;
  b[0] = 1;
  b[1] = 0;
  oi_block_hash ha, hb;
  size_t n = 0;
  hash_all(a, BS, NULL, 0, NULL, &ha, 1, &n);
  hash_all(b, BS, NULL, 0, NULL, &hb, 1, &n);
  CHECK(!hash_eq(&ha, &hb));
}

static void test_partial_tail(void) {
  uint32_t tok[NTOK];
  oi_block_hash full[NBLK];
  size_t n = hash_seeded(tok, 5, full);
  CHECK(n == NBLK);
  /* Every length from 0 to NTOK: n_out = floor(n / BS), and the hashes are
   * those of the full sequence (the tail never influences them). */
  for (size_t len = 0; len <= NTOK; len++) {
    oi_block_hash h[NBLK + 1];
    memset(h, 0xAB, sizeof h);
    size_t got = 12345;
    hash_all(tok, len, NULL, 0, NULL, h, NBLK + 1, &got);
    CHECK(got == len / BS);
    for (size_t i = 0; i < got && i < NBLK; i++)
      CHECK(hash_eq(&h[i], &full[i]));
    /* Entries past the full-block count are untouched. */
    for (size_t i = got; i < NBLK + 1; i++) {
      oi_block_hash marker;
      memset(&marker, 0xAB, sizeof marker);
      CHECK(hash_eq(&h[i], &marker));
    }
  }
  /* Fewer tokens than one block: nothing hashed, OK. */
  size_t none = 99;
  CHECK_OK(oi_hash_blocks(tok, BS - 1, BS, NULL, 0, NULL, NULL, 0, &none));
  CHECK(none == 0);
}

static void test_parent(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 6);
  const char salt[] = "model-x";
  oi_block_hash all[NBLK];
  size_t n = 0;
  hash_all(tok, NTOK, salt, sizeof salt - 1, NULL, all, NBLK, &n);

  /* Hashing tokens[B..] with parent = hash of block 0 gives block 1.. */
  oi_block_hash rest[NBLK];
  size_t nr = 0;
  hash_all(tok + BS, NTOK - BS, salt, sizeof salt - 1, &all[0], rest, NBLK, &nr);
  CHECK(nr == NBLK - 1);
  for (unsigned i = 0; i + 1 < NBLK; i++)
    CHECK(hash_eq(&rest[i], &all[i + 1]));

  /* Resuming at any block boundary continues the chain. */
  for (unsigned k = 1; k < NBLK; k++) {
    oi_block_hash h[NBLK];
    size_t nh = 0;
    hash_all(tok + k * BS, NTOK - k * BS, salt, sizeof salt - 1, &all[k - 1], h, NBLK, &nh);
    CHECK(nh == NBLK - k);
    for (unsigned i = 0; i < nh; i++)
      CHECK(hash_eq(&h[i], &all[k + i]));
  }

  /* An explicit all-zero parent equals parent == NULL. */
  static const oi_block_hash zero;
  oi_block_hash hz[NBLK];
  hash_all(tok, NTOK, salt, sizeof salt - 1, &zero, hz, NBLK, &n);
  CHECK(memcmp(hz, all, sizeof all) == 0);

  /* A different parent changes every block. */
  oi_block_hash other = all[3];
  oi_block_hash ho[NBLK];
  hash_all(tok, NTOK, salt, sizeof salt - 1, &other, ho, NBLK, &n);
  for (unsigned i = 0; i < NBLK; i++)
    CHECK(!hash_eq(&ho[i], &all[i]));
}

static void test_out_cap(void) {
  uint32_t tok[NTOK];
  oi_block_hash all[NBLK];
  CHECK(hash_seeded(tok, 7, all) == NBLK);

  for (size_t cap = 0; cap < NBLK; cap++) {
    oi_block_hash h[NBLK];
    memset(h, 0xCD, sizeof h);
    size_t got = 0;
    oi_clear_error();
    CHECK_ST(oi_hash_blocks(tok, NTOK, BS, NULL, 0, NULL, h, cap, &got), OI_ERR_INVALID_ARGUMENT);
    CHECK(got == NBLK);
    CHECK(oi_last_error()[0] != '\0');
    for (size_t i = 0; i < cap; i++)
      CHECK(hash_eq(&h[i], &all[i]));
    for (size_t i = cap; i < NBLK; i++) {
      oi_block_hash marker;
      memset(&marker, 0xCD, sizeof marker);
      CHECK(hash_eq(&h[i], &marker)); /* nothing written past out_cap */
    }
  }
  /* out == NULL with out_cap 0 is a size query. */
  size_t got = 0;
  CHECK_ST(oi_hash_blocks(tok, NTOK, BS, NULL, 0, NULL, NULL, 0, &got), OI_ERR_INVALID_ARGUMENT);
  CHECK(got == NBLK);
  /* A larger out_cap than needed is fine. */
  oi_block_hash big[NBLK + 4];
  CHECK_OK(oi_hash_blocks(tok, NTOK, BS, NULL, 0, NULL, big, NBLK + 4, &got));
  CHECK(got == NBLK);
  CHECK(memcmp(big, all, sizeof all) == 0);
}

static void expect_invalid(oi_status st, const char *what) {
  if (st != OI_ERR_INVALID_ARGUMENT) {
    fprintf(stderr, "%s: got %s, expected OI_ERR_INVALID_ARGUMENT\n", what, oi_status_str(st));
    oi_test_failures++;
  }
  if (oi_last_error()[0] == '\0') {
    fprintf(stderr, "%s: oi_last_error() is empty\n", what);
    oi_test_failures++;
  }
}

static void test_invalid_arguments(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 8);
  oi_block_hash h[NBLK];
  size_t got;

  oi_clear_error();
  CHECK(oi_last_error()[0] == '\0');
  got = 77;
  expect_invalid(oi_hash_blocks(tok, NTOK, 0, NULL, 0, NULL, h, NBLK, &got), "block_size 0");
  CHECK(got == 0);

  oi_clear_error();
  expect_invalid(oi_hash_blocks(tok, NTOK, BS, NULL, 0, NULL, h, NBLK, NULL), "n_out NULL");

  oi_clear_error();
  got = 77;
  expect_invalid(oi_hash_blocks(NULL, NTOK, BS, NULL, 0, NULL, h, NBLK, &got),
                 "tokens NULL with n_tokens > 0");
  CHECK(got == 0);

  /* A partial block's worth of NULL tokens is still rejected. */
  oi_clear_error();
  expect_invalid(oi_hash_blocks(NULL, 1, BS, NULL, 0, NULL, h, NBLK, &got),
                 "tokens NULL with n_tokens 1");

  oi_clear_error();
  expect_invalid(oi_hash_blocks(tok, NTOK, BS, NULL, 4, NULL, h, NBLK, &got),
                 "salt NULL with salt_len > 0");

  oi_clear_error();
  expect_invalid(oi_hash_blocks(tok, NTOK, BS, NULL, 0, NULL, NULL, NBLK, &got),
                 "out NULL with out_cap > 0");
}

static void test_empty(void) {
  size_t got = 123;
  CHECK_OK(oi_hash_blocks(NULL, 0, BS, NULL, 0, NULL, NULL, 0, &got));
  CHECK(got == 0);
  uint32_t tok[1] = {42};
  oi_block_hash h;
  memset(&h, 0xEE, sizeof h);
  got = 123;
  CHECK_OK(oi_hash_blocks(tok, 0, BS, NULL, 0, NULL, &h, 1, &got));
  CHECK(got == 0);
  oi_block_hash marker;
  memset(&marker, 0xEE, sizeof marker);
  CHECK(hash_eq(&h, &marker));
}

static void test_block_size_one(void) {
  uint32_t tok[4] = {0, 1, UINT32_MAX, 0x80000000u};
  oi_block_hash h[4];
  size_t got = 0;
  CHECK_OK(oi_hash_blocks(tok, 4, 1, NULL, 0, NULL, h, 4, &got));
  CHECK(got == 4);
  for (unsigned i = 0; i < 4; i++)
    for (unsigned j = i + 1; j < 4; j++)
      CHECK(!hash_eq(&h[i], &h[j]));
  /* Same token at different positions of a chain gives different hashes. */
  uint32_t same[3] = {7, 7, 7};
  oi_block_hash hs[3];
  CHECK_OK(oi_hash_blocks(same, 3, 1, NULL, 0, NULL, hs, 3, &got));
  CHECK(!hash_eq(&hs[0], &hs[1]) && !hash_eq(&hs[1], &hs[2]));
}

/* The block boundary is part of the key: the same tokens in blocks of 8 and
 * of 16 give different hashes. */
static void test_block_size_matters(void) {
  uint32_t tok[NTOK];
  tr_fill_tokens(tok, NTOK, 9);
  oi_block_hash h8[2 * NBLK], h16[NBLK];
  size_t n8 = 0, n16 = 0;
  CHECK_OK(oi_hash_blocks(tok, NTOK, BS / 2, NULL, 0, NULL, h8, 2 * NBLK, &n8));
  CHECK_OK(oi_hash_blocks(tok, NTOK, BS, NULL, 0, NULL, h16, NBLK, &n16));
  CHECK(n8 == 2 * NBLK && n16 == NBLK);
  for (unsigned i = 0; i < NBLK; i++)
    CHECK(!hash_eq(&h16[i], &h8[2 * i + 1]));
}

int main(void) {
  RUN_TEST(test_deterministic);
  RUN_TEST(test_salt);
  RUN_TEST(test_shared_prefix);
  RUN_TEST(test_one_token_change);
  RUN_TEST(test_token_order_matters);
  RUN_TEST(test_partial_tail);
  RUN_TEST(test_parent);
  RUN_TEST(test_out_cap);
  RUN_TEST(test_invalid_arguments);
  RUN_TEST(test_empty);
  RUN_TEST(test_block_size_one);
  RUN_TEST(test_block_size_matters);
  TEST_EXIT();
}
