/* The disk tier's block store (docs/disk.md): KV blocks kept in preallocated
 * data files, one per directory, written and read through io_uring, with an
 * in-memory index persisted as an append-only log plus periodic checkpoints.
 *
 * Internal (names oi__disk_*): the disk tier (tier.c) spills sealed blocks
 * here and promotes them back on a hit. It includes core, and the host's
 * tier.h for the key every tier shares (oi_tier_key).
 *
 * Asynchronous calls (oi__disk_write, oi__disk_read) return OI_OK when the
 * operation was queued, and then call cb(ctx, status) exactly once, from the
 * store's completion thread; any other return means the callback will not
 * run. Callbacks must not block for long and must not call oi__disk_close or
 * oi__disk_register_buffers (both wait for the operations in flight); they
 * may call every other function here. */
#ifndef OI_DISK_DISK_H
#define OI_DISK_DISK_H

#include <stdint.h>
#include <sys/uio.h>

#include "core/core.h"
#include "host/tier.h"

#define OI_DISK_SECTOR 4096u

typedef struct oi_disk oi_disk;

typedef struct oi_disk_options {
  const char *const *dirs; /* one data file (and index files) per directory */
  uint32_t num_dirs;
  uint64_t capacity_bytes;   /* total across dirs, split evenly (4 KiB units) */
  uint32_t queue_depth;      /* operations in flight (0: 32) */
  uint32_t checkpoint_every; /* log records between checkpoints (0: 65536) */
} oi_disk_options;

/* A block's identity is the tiers' key (host/tier.h): namespace
 * fingerprint, block hash, layout fingerprint. */

typedef void (*oi_disk_cb)(void *ctx, oi_status st);

typedef struct oi_disk_stats {
  uint64_t blocks;              /* sealed blocks in the index */
  uint64_t bytes_used;          /* data-file bytes they hold (headers and padding included) */
  uint64_t capacity_bytes;      /* usable data-file bytes, all dirs */
  uint64_t spills_ok;           /* writes that completed */
  uint64_t spills_failed;       /* writes that failed (I/O error, no room) */
  uint64_t spills_busy;         /* writes refused with OI_ERR_BUSY (queue full, from a callback) */
  uint64_t reads_ok;            /* reads that served a verified block */
  uint64_t reads_failed;        /* reads that ended with an error (checksum failures too) */
  uint64_t checksum_failures;   /* header, payload or key mismatches found at read */
  uint64_t evictions;           /* blocks evicted to make room */
  uint64_t torn_records_cut;    /* log/checkpoint records cut or dropped at open */
  uint64_t bad_extents_dropped; /* records pointing outside a file or overlapping */
  uint64_t replay_ns;           /* time oi__disk_open spent loading the index */
  uint64_t checkpoints;         /* checkpoints written since open */
  uint64_t fixed_ops;           /* reads and writes whose payload was in a registered range */
  uint64_t full;                /* 1 while the file system is full: writes refused */
  uint64_t full_events;         /* times the store found its file system full */
  uint64_t
      writes_refused_full; /* writes refused (or undone: their record did not land) while full */
  uint64_t read_latency_us[OI_LATENCY_BUCKETS]; /* oi_latency_hist buckets */
  uint64_t read_latency_sum_us;
} oi_disk_stats;

/* Opens (creating when absent) the store in opts->dirs. Each directory must
 * exist or be creatable (0700), be owned by the effective uid and not be
 * writable by group or others (OI_ERR_PERMISSION otherwise). Data files are
 * preallocated to their share of capacity_bytes (OI_ERR_OUT_OF_MEMORY when
 * the file system has no room). Loads the last checkpoint and replays the
 * log; blocks are not read. */
oi_status oi__disk_open(const oi_disk_options *opts, oi_disk **out);
/* What oi__disk_open would refuse before it reads a file, checked without
 * opening the store: the options, each directory (created when absent, as
 * open does), its lock (not held by another store: probed, not kept), and
 * room on its file system for the data file. */
oi_status oi__disk_check(const oi_disk_options *opts);
/* Waits for the operations in flight (their callbacks run), writes a
 * checkpoint, syncs and closes. Accepts NULL. */
void oi__disk_close(oi_disk *d);

/* Registers memory the caller's buffers live in (e.g. the host pool) with
 * the ring: reads and writes whose buffer lies inside one range then use the
 * fixed-buffer operations. Replaces an earlier registration; waits for the
 * operations in flight. n == 0 drops the registration. Registration refused
 * by the kernel (memlock limits) is not an error: plain operations are used
 * (logged). */
oi_status oi__disk_register_buffers(oi_disk *d, const struct iovec *iov, uint32_t n);

/* Stores `len` bytes of `payload` (4 KiB aligned, readable up to
 * round_up(len, 4096)) under `key`. Allocates room, evicting the least
 * recently used sealed blocks that are neither pinned nor being read.
 * A key already stored is not written again: cb(ctx, OI_OK) runs at once,
 * on the calling thread, before this returns OI_OK. Waits for a queue slot
 * when the queue is full, as a read does.
 * @return OI_OK (queued; cb follows), OI_ERR_BUSY (the key is being written,
 * or the queue is full and the caller is a callback, which may not wait:
 * the spill is dropped), OI_ERR_OUT_OF_MEMORY (no room even after
 * eviction), OI_ERR_INVALID_ARGUMENT, OI_ERR_CLOSED. */
oi_status oi__disk_write(oi_disk *d, const oi_tier_key *key, const void *payload, uint64_t len,
                         oi_disk_cb cb, void *ctx);
/* Reads the block under `key` into `dst` (4 KiB aligned, `cap` bytes, at
 * least round_up(length, 4096)); waits for a queue slot when the queue is
 * full. The callback gets OI_OK only when the header, the key and the
 * payload's checksum all verified; a mismatch removes the block and ends
 * with OI_ERR_IO.
 * @return OI_OK (queued), OI_ERR_NOT_FOUND, OI_ERR_INVALID_ARGUMENT (cap too
 * small, misaligned), OI_ERR_CLOSED. */
oi_status oi__disk_read(oi_disk *d, const oi_tier_key *key, void *dst, uint64_t cap, oi_disk_cb cb,
                        void *ctx);
/* present[i] = 1 when keys[i] is stored (sealed), else 0. */
void oi__disk_contains(oi_disk *d, const oi_tier_key *keys, uint32_t n, uint8_t *present);
/* The payload length of a stored block. @return OI_ERR_NOT_FOUND. */
oi_status oi__disk_length(oi_disk *d, const oi_tier_key *key, uint64_t *len);
/* A pinned block is never evicted (pins count). @return OI_ERR_NOT_FOUND;
 * unpin of an unpinned block: OI_ERR_STATE. */
oi_status oi__disk_pin(oi_disk *d, const oi_tier_key *key);
oi_status oi__disk_unpin(oi_disk *d, const oi_tier_key *key);
/* Forgets the block; its room is reused once no read touches it.
 * @return OI_ERR_NOT_FOUND. */
oi_status oi__disk_remove(oi_disk *d, const oi_tier_key *key);
/* Makes the data written and the log records appended so far durable
 * (fdatasync of every file). */
oi_status oi__disk_sync(oi_disk *d);
/* Writes a checkpoint of every directory's index now and truncates the logs. */
oi_status oi__disk_checkpoint(oi_disk *d);
void oi__disk_stats_get(oi_disk *d, oi_disk_stats *out);
/* Whether the store is in its full state (docs/disk.md, "A full disk"):
 * a log or checkpoint write found no room; writes are refused with
 * OI_ERR_OUT_OF_MEMORY until a checkpoint (tried once a second, at a
 * write) succeeds again. */
bool oi__disk_full(oi_disk *d);
/* Calls fn for every stored (sealed) block, least recently used first,
 * under the store's lock: fn must not call into the store. */
void oi__disk_foreach(oi_disk *d, void (*fn)(void *ctx, const oi_tier_key *key, uint64_t len),
                      void *ctx);

/* ---- the on-disk formats (docs/disk.md), shared with the fuzz target ---- */

#define OI_DISK_BLOCK_MAGIC 0x314b4c4253494f4fULL /* "OOISBLK1" little-endian */
#define OI_DISK_CKPT_MAGIC 0x3154504b4349444fULL  /* "ODICKPT1" */
#define OI_DISK_RECORD_MAGIC 0x524c494fu          /* "OILR" */
#define OI_DISK_VERSION 1u
#define OI_DISK_RECORD_BYTES 80u
#define OI_DISK_CKPT_HEADER_BYTES 64u

enum { OI_DISK_REC_HEADER = 1, OI_DISK_REC_ADD = 2, OI_DISK_REC_REMOVE = 3 };

/* One log or checkpoint record, decoded. */
typedef struct oi_disk_record {
  uint32_t type;
  oi_tier_key key;
  uint64_t seq;    /* block sequence number (HEADER: the log's generation) */
  uint64_t offset; /* ADD: the header sector's byte offset in the data file */
  uint64_t length; /* ADD: payload bytes */
  uint64_t payload_xxh;
} oi_disk_record;

void oi__disk_record_encode(const oi_disk_record *r, uint8_t out[OI_DISK_RECORD_BYTES]);
/* false when the magic, type or checksum do not verify. */
bool oi__disk_record_decode(const uint8_t in[OI_DISK_RECORD_BYTES], oi_disk_record *r);

#endif
