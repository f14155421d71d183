/* `openinfer bench`: what the benchmarks measure and report. The
 * measurements live in bench_host.c; bench.c parses options and prints. */
#ifndef OI_TOOLS_BENCH_H
#define OI_TOOLS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/codec.h"

/* Targets of docs PERFORMANCE.md for the host tier. */
#define BENCH_LOOKUPS_TARGET 10e6     /* lookups / s / thread, at least */
#define BENCH_OVERHEAD_TARGET 64.0    /* index bytes per resident block, at most */
#define BENCH_QUERY_P50_TARGET_US 5.0 /* query of 64 hashes, p50, at most */
#define BENCH_SAVE_P50_TARGET_US 5.0  /* save call of 64 blocks, p50, at most */
#define BENCH_BATCH_RATIO_TARGET 0.8  /* save / load vs single-thread memcpy, at least */

typedef struct bench_host_config {
  uint64_t index_blocks; /* resident blocks of the index-scale phase */
  uint64_t batch_bytes;  /* requested bytes of the save/load batch */
  bool quick;            /* fewer samples (tests) */
} bench_host_config;

typedef struct bench_latency {
  double p50_us, p99_us;
} bench_latency;

typedef struct bench_host_result {
  /* 1. index scale */
  uint64_t index_blocks;
  uint64_t index_block_bytes;
  double fill_s;
  double fill_blocks_per_s;
  double lookups_per_s;        /* one thread, in batches of 64 (as queries look up) */
  double lookups_single_per_s; /* one thread, one hash and one lock at a time */
  uint64_t lookups;            /* performed while measuring */
  uint64_t slots_carved;
  uint64_t buckets; /* over every shard */
  uint32_t shards;
  size_t record_bytes;       /* sizeof(host_block) */
  size_t bucket_bytes;       /* bytes of one table slot */
  double overhead_per_block; /* (records + free bits + table slots) / resident blocks */
  /* 2. query */
  uint32_t query_blocks;
  uint32_t query_samples;
  bench_latency query_hit_run;         /* 64 blocks saved by one call */
  bench_latency query_hit_scattered;   /* 64 random resident blocks */
  bench_latency query_miss;            /* prefix rule: stops at the first miss */
  bench_latency query_membership_miss; /* OI_QUERY_MEMBERSHIP: 64 lookups, all miss */
  /* 3. save enqueue */
  uint32_t save_call_blocks;
  uint64_t save_block_bytes;
  uint32_t save_samples;
  bench_latency save_idle;  /* a flush between calls: the engine is idle at each call */
  bench_latency save_burst; /* calls back to back */
  /* Diagnostic: the host tier's part of a call, oi__host_reserve of 64
   * fresh hashes (slots and index entries), without the copy pipeline. */
  bench_latency save_reserve;
  /* 4. batch */
  uint64_t batch_bytes;
  uint32_t batch_blocks;
  uint32_t batch_arenas;
  uint64_t batch_arena_block_bytes;
  double save_gbps, load_gbps;  /* best of 3 */
  double memcpy_to_host_gbps;   /* arena -> pool, best of 3 */
  double memcpy_from_host_gbps; /* pool -> arena, best of 3 */
  /* Diagnostics: the same bytes copied in the copy plan's pieces (one memcpy
   * per arena slice), which is what the cpu backend's stream does. */
  double memcpy_pieces_to_host_gbps, memcpy_pieces_from_host_gbps;
} bench_host_result;

/* Runs every phase; progress goes to stderr. @return 0, or -1 with a message
 * on stderr. */
int bench_host_run(const bench_host_config *cfg, bench_host_result *out);

/* ---- openinfer bench codec: the pool phase (bench_codec_pool.c) ---- */

typedef struct bench_codec_pool_row {
  int codec;                   /* oi_codec_id: none first, the baseline */
  double save_gbps, load_gbps; /* logical bytes, best of the repetitions */
  uint64_t stored_bytes;       /* a block's slot */
  double ratio;                /* the namespace's logical / physical bytes */
  size_t loaded, wrong;        /* pages loaded; of them, not the codec's round trip */
  uint64_t capacity_blocks;    /* blocks a pool of half the working set holds */
} bench_codec_pool_row;

/* The codecs through an embedded cpu engine: work_bytes of 12,288-byte
 * corpus pages (corpus[0..clen) tiled) saved and loaded, then a pool of half
 * that filled past it. @return 0, or -1 with a message on stderr. */
int bench_codec_pool(const uint8_t *corpus, size_t clen, uint64_t work_bytes, int reps,
                     bench_codec_pool_row rows[OI_CODEC_COUNT]);

/* The committed real-KV corpus (bench_codec.c): tests/data/kvcorpus/kv.bin
 * under the current directory, else under the source tree of this build
 * (<src>/<build>/tools/openinfer-bench); NULL when neither is readable. */
const char *bench_corpus_default(char *buf, size_t cap);
/* A whole file, malloc'd; NULL when it cannot be read or is empty. */
uint8_t *bench_read_file(const char *path, size_t *len);

#endif
