/* `openinfer bench disk`: what its phases share (bench_disk.c) and the
 * codec rows (bench_disk_codec.c: --codec, --content corpus). */
#ifndef OI_TOOLS_BENCH_DISK_H
#define OI_TOOLS_BENCH_DISK_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "openinfer/openinfer.h"

#define BENCH_DISK_WAIT_MS 600000u
#define BENCH_DISK_CODECS 4 /* none, lossless, int8, fp8 (oi_codec_id order) */

/* ---- bench_disk.c: each prints its reason on stderr and returns -1 on failure ---- */

int bench_disk_stats(oi_host *h, oi_host_disk_stats *s);
/* Waits until the disk tier has written `target` blocks (disk_stats.spills);
 * *t_done is the time it saw them. */
int bench_disk_wait_spilled(oi_host *h, uint64_t target, uint64_t *t_done);
/* evict_all, and checks that no block is left sealed. */
int bench_disk_empty_pool(oi_host *h);
/* Saves blocks id0.. of hs[0..n), 64 a call, without waiting. */
int bench_disk_save_all(oi_engine *e, const oi_block_hash *hs, uint64_t n, uint64_t id0);
/* Queries with OI_QUERY_WAIT_PENDING until all n hashes hit; the number of
 * queries, the lease of all n in *lease. */
int bench_disk_query_all(oi_engine *e, const oi_block_hash *hs, uint64_t n, oi_lease *lease);
oi_block_hash bench_disk_hash(uint64_t stream, uint64_t i);
/* Removes a disk store's files from dir. */
void bench_disk_remove_store(const char *dir);

/* ---- bench_disk_codec.c: the codec rows ---- */

/* The real-KV corpus (tests/data/kvcorpus): kv.bin, and the page shape its
 * manifest.json (beside it) gives: pages of [K|V][tokens][heads][head_dim] bf16. */
typedef struct bench_disk_corpus {
  char path[PATH_MAX + 64];
  char manifest[PATH_MAX + 80];
  uint8_t *data;
  size_t bytes;
  uint32_t page_bytes, tokens, heads, head_dim;
} bench_disk_corpus;

typedef struct bench_disk_codec_row {
  int codec; /* oi_codec_id */
  uint64_t blocks, logical_bytes;
  uint64_t stored_bytes;   /* the namespace's slot for one block (its frame slot; the block) */
  uint64_t physical_bytes; /* the disk tier's bytes_used: extents with their headers, padding */
  double spill_s, restore_s, load_s;
  double spill_gbps;        /* logical bytes: first save until every block is on disk */
  double restore_gbps;      /* logical bytes: query(wait) until every block is in the pool */
  double restore_load_gbps; /* logical bytes: the same, then the load into the arena (decoded) */
  uint64_t blocks_per_gib;  /* blocks 1 GiB of disk tier holds, from physical_bytes / blocks */
  uint64_t checked_blocks, wrong_blocks;
  uint64_t elements_past_bound; /* int8, fp8: elements past the format's bound or not finite */
  double rel_rms;               /* int8, fp8: relative RMS error over every element */
  uint64_t promote_failed, checksum_failures;
} bench_disk_codec_row;

/* Parses --codec's comma list into want[] (none is always the baseline).
 * @return 0, or -1 with the bad name on stderr. */
int bench_disk_codec_list(const char *list, bool want[BENCH_DISK_CODECS]);
/* Reads the corpus at `path` (NULL: the default place) and its manifest.
 * @return 0, or -1 with the path and what is wrong on stderr. */
int bench_disk_corpus_load(const char *path, bench_disk_corpus *c);
void bench_disk_corpus_free(bench_disk_corpus *c);
/* For none and each wanted codec: a cpu host with a disk tier in dir/codec,
 * `bytes` of blocks of `block_bytes` (whole corpus pages) tiled from the
 * corpus, spilled, evicted, restored and loaded; every block checked.
 * rows[0..*nrows) in codec order, none first. @return 0, or -1 on a failed
 * phase (a wrong block is not a failure here: see wrong_blocks). */
int bench_disk_codec_run(const char *dir, uint64_t bytes, uint64_t block_bytes,
                         const bench_disk_corpus *c, const bool want[BENCH_DISK_CODECS],
                         bench_disk_codec_row rows[BENCH_DISK_CODECS], int *nrows);
void bench_disk_codec_print_table(const bench_disk_corpus *c, uint64_t block_bytes,
                                  const bench_disk_codec_row *rows, int n);
/* The codec fields of the JSON line, each starting with ','. */
void bench_disk_codec_print_json(const bench_disk_corpus *c, uint64_t block_bytes,
                                 const bench_disk_codec_row *rows, int n);

#endif
