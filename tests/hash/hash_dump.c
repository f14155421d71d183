/* Helper for test_hash_vectors.py (not a test by itself).
 *
 *   hash_dump BLOCK_SIZE SALT_HEX PARENT_HEX|- [TOKEN...]
 *
 * SALT_HEX is the salt as hex ("" or "-" for none), PARENT_HEX the 32 hex
 * digits of the parent hash or "-" for none. Tokens are decimal (or 0x hex)
 * u32 values; a single argument "@FILE" instead reads whitespace-separated
 * tokens from FILE (for long sequences). Prints the hex of every full block's
 * hash, one per line.
 *
 *   hash_dump ex BLOCK_SIZE SALT_HEX|- PARENT_HEX|- EXTRAS|- [TOKEN... | @FILE]
 *
 * The same through oi_hash_blocks_ex; EXTRAS is "-" for no extra keys or a
 * comma-separated list of hex extra keys, one per block ("" for a block
 * without one: "aabb,,01" is three entries, the second of length 0).
 *
 *   hash_dump key KEY_HEX...      oi_block_key_from_bytes of each key
 *   hash_dump keys KEY_LEN HEX    oi_block_keys_from_bytes of the packed keys
 *
 * Exit 0 on success, 2 on bad usage, 1 on a library error. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openinfer/openinfer.h"

static void usage(void) {
  fprintf(stderr, "usage: hash_dump [ex] BLOCK_SIZE SALT_HEX|- PARENT_HEX|- [EXTRAS|-] "
                  "[TOKEN... | @FILE]\n"
                  "       hash_dump key KEY_HEX...\n"
                  "       hash_dump keys KEY_LEN HEX\n");
  exit(2);
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* Decodes hex into a malloc'ed buffer; *len receives the byte count. */
static uint8_t *parse_hex(const char *s, size_t *len) {
  size_t n = strlen(s);
  if (n % 2) {
    fprintf(stderr, "hash_dump: odd-length hex '%s'\n", s);
    usage();
  }
  uint8_t *out = malloc(n / 2 + 1);
  if (!out) exit(1);
  for (size_t i = 0; i < n / 2; i++) {
    int hi = hexval((unsigned char)s[2 * i]), lo = hexval((unsigned char)s[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      fprintf(stderr, "hash_dump: bad hex '%s'\n", s);
      usage();
    }
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  *len = n / 2;
  return out;
}

static uint32_t parse_u32(const char *s) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || !end || *end || end == s || v > UINT32_MAX || s[0] == '-') {
    fprintf(stderr, "hash_dump: bad u32 '%s'\n", s);
    usage();
  }
  return (uint32_t)v;
}

/* Appends a token, growing the array. */
static void push(uint32_t **tok, size_t *n, size_t *cap, uint32_t v) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 64;
    uint32_t *p = realloc(*tok, *cap * sizeof **tok);
    if (!p) exit(1);
    *tok = p;
  }
  (*tok)[(*n)++] = v;
}

static void print_hashes(const oi_block_hash *h, size_t n) {
  for (size_t i = 0; i < n; i++) {
    for (size_t j = 0; j < sizeof h[i].bytes; j++)
      printf("%02x", h[i].bytes[j]);
    putchar('\n');
  }
}

/* Parses "-" (none) or a comma-separated list of hex keys. */
static oi_block_extra_key *parse_extras(const char *s, size_t *n) {
  *n = 0;
  if (strcmp(s, "-") == 0) return NULL;
  size_t cap = 1;
  for (const char *p = s; *p; p++)
    cap += *p == ',';
  oi_block_extra_key *x = calloc(cap, sizeof *x);
  char *copy = strdup(s);
  if (!x || !copy) exit(1);
  char *rest = copy;
  for (size_t i = 0; i < cap; i++) {
    char *comma = strchr(rest, ',');
    if (comma) *comma = '\0';
    size_t len = 0;
    uint8_t *bytes = parse_hex(rest, &len);
    x[i].bytes = len ? bytes : NULL;
    x[i].len = len;
    if (!len) free(bytes);
    rest = comma ? comma + 1 : rest + strlen(rest);
  }
  free(copy);
  *n = cap;
  return x;
}

static int dump_keys(int argc, char **argv) {
  if (strcmp(argv[1], "key") == 0) {
    for (int i = 2; i < argc; i++) {
      size_t len = 0;
      uint8_t *k = parse_hex(argv[i], &len);
      oi_block_hash h;
      oi_status st = oi_block_key_from_bytes(k, len, &h);
      free(k);
      if (st != OI_OK) {
        fprintf(stderr, "hash_dump: oi_block_key_from_bytes: %s: %s\n", oi_status_str(st),
                oi_last_error());
        return 1;
      }
      print_hashes(&h, 1);
    }
    return 0;
  }
  if (argc != 4) usage();
  size_t key_len = parse_u32(argv[2]), len = 0;
  uint8_t *k = parse_hex(argv[3], &len);
  size_t n = key_len ? len / key_len : 0;
  if (key_len && len % key_len) {
    fprintf(stderr, "hash_dump: %zu bytes are not a whole number of %zu-byte keys\n", len, key_len);
    usage();
  }
  oi_block_hash *out = malloc((n ? n : 1) * sizeof *out);
  if (!out) return 1;
  oi_status st = oi_block_keys_from_bytes(k, key_len, n, out);
  if (st != OI_OK) {
    fprintf(stderr, "hash_dump: oi_block_keys_from_bytes: %s: %s\n", oi_status_str(st),
            oi_last_error());
    free(out);
    free(k);
    return 1;
  }
  print_hashes(out, n);
  free(out);
  free(k);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && (strcmp(argv[1], "key") == 0 || strcmp(argv[1], "keys") == 0))
    return dump_keys(argc, argv);
  /* a: the index of BLOCK_SIZE; the "ex" form has EXTRAS after PARENT. */
  bool ex = argc >= 2 && strcmp(argv[1], "ex") == 0;
  int a = ex ? 2 : 1;
  int first_token = a + (ex ? 4 : 3);
  if (argc < first_token) usage();
  uint32_t block_size = parse_u32(argv[a]);

  size_t salt_len = 0;
  uint8_t *salt = NULL;
  if (strcmp(argv[a + 1], "-") != 0) salt = parse_hex(argv[a + 1], &salt_len);

  oi_block_hash parent;
  const oi_block_hash *parent_p = NULL;
  if (strcmp(argv[a + 2], "-") != 0) {
    size_t plen = 0;
    uint8_t *p = parse_hex(argv[a + 2], &plen);
    if (plen != sizeof parent.bytes) {
      fprintf(stderr, "hash_dump: parent must be 16 bytes, got %zu\n", plen);
      usage();
    }
    memcpy(parent.bytes, p, sizeof parent.bytes);
    free(p);
    parent_p = &parent;
  }

  size_t n_extras = 0;
  oi_block_extra_key *extras = ex ? parse_extras(argv[a + 3], &n_extras) : NULL;

  uint32_t *tokens = NULL;
  size_t n_tokens = 0, cap = 0;
  if (argc == first_token + 1 && argv[first_token][0] == '@') {
    FILE *f = fopen(argv[first_token] + 1, "r");
    if (!f) {
      perror(argv[first_token] + 1);
      return 2;
    }
    char word[64];
    while (fscanf(f, "%63s", word) == 1)
      push(&tokens, &n_tokens, &cap, parse_u32(word));
    fclose(f);
  } else {
    for (int i = first_token; i < argc; i++)
      push(&tokens, &n_tokens, &cap, parse_u32(argv[i]));
  }

  size_t n_out = 0;
  size_t out_cap = block_size ? n_tokens / block_size : 0;
  oi_block_hash *out = malloc((out_cap ? out_cap : 1) * sizeof *out);
  if (!out) return 1;
  oi_status st;
  if (ex) {
    oi_hash_blocks_args args;
    oi_hash_blocks_args_init(&args);
    args.block_size = block_size;
    args.tokens = tokens;
    args.n_tokens = n_tokens;
    args.salt = salt_len ? salt : NULL;
    args.salt_len = salt_len;
    args.parent = parent_p;
    args.extra_keys = extras;
    args.n_extra_keys = n_extras;
    st = oi_hash_blocks_ex(&args, out, out_cap, &n_out);
  } else {
    st = oi_hash_blocks(tokens, n_tokens, block_size, salt_len ? salt : NULL, salt_len, parent_p,
                        out, out_cap, &n_out);
  }
  int rc = 0;
  if (st != OI_OK) {
    fprintf(stderr, "hash_dump: %s: %s: %s\n", ex ? "oi_hash_blocks_ex" : "oi_hash_blocks",
            oi_status_str(st), oi_last_error());
    rc = 1;
  } else {
    print_hashes(out, n_out);
    rc = fflush(stdout) == 0 ? 0 : 1;
  }
  for (size_t i = 0; i < n_extras; i++)
    free((void *)extras[i].bytes);
  free(extras);
  free(out);
  free(tokens);
  free(salt);
  return rc;
}
