/*
 * libopeninfer — the disk tier: a directory (or several, one per device or
 * mount point) of preallocated files under a host's pinned pool. Sealed
 * blocks are written behind to disk (oldest first, straight from their pool
 * slots); a query whose prefix reaches past the pool finds the rest on disk
 * and promotes it back into the pool, verified by checksum; the disk's
 * index survives a restart. docs/disk.md has the format and the rules.
 *
 * Thread-safety: every function may be called from any thread.
 */
#ifndef OPENINFER_DISK_H
#define OPENINFER_DISK_H

#include "openinfer/common.h"
#include "openinfer/host.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oi_host_disk_options {
  uint32_t struct_size;
  uint32_t num_dirs;
  const char *const *dirs; /* each: exists (or is created 0700), owned by this user, not
                              writable by group or others; one data file per directory */
  uint64_t capacity_bytes; /* disk bytes in all, split evenly across dirs (required) */
  uint32_t queue_depth;    /* I/O operations in flight; 0 = 32 */
  uint32_t reserved;
} oi_host_disk_options;

typedef struct oi_host_disk_stats {
  uint32_t struct_size;
  uint32_t latency_buckets; /* OI_LATENCY_BUCKETS */
  uint64_t blocks;          /* blocks stored */
  uint64_t bytes_used;      /* file bytes they take (headers and padding included) */
  uint64_t capacity_bytes;
  uint64_t spills;            /* blocks written */
  uint64_t spills_failed;     /* writes that failed (I/O error, no room): the pool copy stays */
  uint64_t spills_skipped;    /* blocks not written: the disk had them, or its queue was full */
  uint64_t spill_overflow;    /* sealed blocks never queued for the disk (queue overflow) */
  uint64_t promotions;        /* blocks read back into the pool, verified */
  uint64_t promote_failed;    /* reads that failed (I/O, checksum): a miss */
  uint64_t checksum_failures; /* blocks caught by their checksum, removed, never served */
  uint64_t evictions;         /* blocks the disk evicted for room (least recently used) */
  uint64_t torn_records_cut;  /* index records cut or dropped when the index was replayed */
  uint64_t replay_ns;         /* time the index replay took at attach */
  uint64_t read_latency_us[OI_LATENCY_BUCKETS]; /* disk reads, as in oi_host_stats */
  uint64_t read_latency_sum_us;
  /* Blocks the pool evicted that never reached the disk, by cause (none is
   * lost silently; eviction takes blocks the disk holds first): */
  uint64_t lost_queue_full;   /* never queued: the spill queue was full */
  uint64_t lost_unwritten;    /* evicted before their write */
  uint64_t lost_write_failed; /* their write failed (I/O error) */
  uint64_t lost_no_room;      /* the disk had no room for them (full, or a block too large) */
  /* A full file system is a state (docs/disk.md, "A full disk"): */
  uint64_t disk_full;           /* 1 while it is full: spills stop */
  uint64_t full_events;         /* times it was found full */
  uint64_t spills_refused_full; /* blocks not written (or not kept) because it was full */
} oi_host_disk_stats;

OI_API oi_status oi_host_disk_options_init(oi_host_disk_options *o);
/* Checks `o` as oi_host_attach_disk would before it opens anything, with
 * no host: the options, each directory (created 0700 when absent), that no
 * other disk tier holds it, and room for the data file on its file system.
 * A server calls it before it pins its pool, so a bad disk option fails in
 * milliseconds. The attach checks again (and takes the lock). Returns what
 * oi_host_attach_disk would: OI_ERR_INVALID_ARGUMENT, OI_ERR_PERMISSION,
 * OI_ERR_BUSY (the directory is in use: the holder's pid in the message),
 * OI_ERR_OUT_OF_MEMORY (no room on the file system). */
OI_API oi_status oi_host_disk_options_check(const oi_host_disk_options *o);
/* Attaches a disk tier to `h` (one per host; blocks sealed before this are
 * not written to it). Opens or creates the files and replays the index of
 * an earlier run (blocks saved under the same namespace and layout are
 * hits again). OI_ERR_PERMISSION for a directory another user owns or
 * others may write; OI_ERR_STATE when one is attached already. */
OI_API oi_status oi_host_attach_disk(oi_host *h, const oi_host_disk_options *o);
/* OI_ERR_NOT_FOUND when no disk tier is attached. */
OI_API oi_status oi_host_get_disk_stats(const oi_host *h, oi_host_disk_stats *out);

#ifdef __cplusplus
}
#endif

#endif
