/* Helper for test_hash_vectors.py (not a test by itself).
 *
 *   hash_dump BLOCK_SIZE SALT_HEX PARENT_HEX|- [TOKEN...]
 *
 * SALT_HEX is the salt as hex ("" or "-" for none), PARENT_HEX the 32 hex
 * digits of the parent hash or "-" for none. Tokens are decimal (or 0x hex)
 * u32 values; a single argument "@FILE" instead reads whitespace-separated
 * tokens from FILE (for long sequences). Prints the hex of every full block's
 * hash, one per line. Exit 0 on success, 2 on bad usage, 1 on a library
 * error. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openinfer/openinfer.h"

static void usage(void) {
  fprintf(stderr, "usage: hash_dump BLOCK_SIZE SALT_HEX|- PARENT_HEX|- [TOKEN... | @FILE]\n");
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

int main(int argc, char **argv) {
  if (argc < 4) usage();
  uint32_t block_size = parse_u32(argv[1]);

  size_t salt_len = 0;
  uint8_t *salt = NULL;
  if (strcmp(argv[2], "-") != 0) salt = parse_hex(argv[2], &salt_len);

  oi_block_hash parent;
  const oi_block_hash *parent_p = NULL;
  if (strcmp(argv[3], "-") != 0) {
    size_t plen = 0;
    uint8_t *p = parse_hex(argv[3], &plen);
    if (plen != sizeof parent.bytes) {
      fprintf(stderr, "hash_dump: parent must be 16 bytes, got %zu\n", plen);
      usage();
    }
    memcpy(parent.bytes, p, sizeof parent.bytes);
    free(p);
    parent_p = &parent;
  }

  uint32_t *tokens = NULL;
  size_t n_tokens = 0, cap = 0;
  if (argc == 5 && argv[4][0] == '@') {
    FILE *f = fopen(argv[4] + 1, "r");
    if (!f) {
      perror(argv[4] + 1);
      return 2;
    }
    char word[64];
    while (fscanf(f, "%63s", word) == 1)
      push(&tokens, &n_tokens, &cap, parse_u32(word));
    fclose(f);
  } else {
    for (int i = 4; i < argc; i++)
      push(&tokens, &n_tokens, &cap, parse_u32(argv[i]));
  }

  size_t n_out = 0;
  size_t out_cap = block_size ? n_tokens / block_size : 0;
  oi_block_hash *out = malloc((out_cap ? out_cap : 1) * sizeof *out);
  if (!out) return 1;
  oi_status st = oi_hash_blocks(tokens, n_tokens, block_size, salt_len ? salt : NULL, salt_len,
                                parent_p, out, out_cap, &n_out);
  if (st != OI_OK) {
    fprintf(stderr, "hash_dump: oi_hash_blocks: %s: %s\n", oi_status_str(st), oi_last_error());
    return 1;
  }
  for (size_t i = 0; i < n_out; i++) {
    for (size_t j = 0; j < sizeof out[i].bytes; j++)
      printf("%02x", out[i].bytes[j]);
    putchar('\n');
  }
  free(out);
  free(tokens);
  free(salt);
  return fflush(stdout) == 0 ? 0 : 1;
}
