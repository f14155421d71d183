/* The device backend interface: the only place that knows CUDA exists.
 *
 * One oi_dev per (ordinal, user); backends are stateless between instances.
 * Streams execute copies and host callbacks in submission order; a callback
 * receives the first error of the work queued on its stream since the
 * previous callback, so a failed copy is never reported as done. */
#ifndef OI_DEVICE_DEVICE_H
#define OI_DEVICE_DEVICE_H

#include "core/core.h"
#include "openinfer/device.h"

typedef struct oi_dev oi_dev;
typedef struct oi_stream oi_stream;

/* mem_alloc flags */
enum { OI_MEM_SHAREABLE = 1u << 0 }; /* may be exported with mem_export */

/* pinned_alloc flags */
enum {
  OI_PIN_HUGEPAGES = 1u << 0, /* back with 2 MiB hugepages (mmap MAP_HUGETLB) */
  OI_PIN_NO_PIN = 1u << 1,    /* plain pageable memory (cpu, tests) */
};

typedef enum oi_copy_dir { OI_COPY_D2H = 0, OI_COPY_H2D = 1 } oi_copy_dir;

/* One contiguous piece of a copy. Addresses are as the backend sees them:
 * device pointers and host pointers of a pinned region. */
typedef struct oi_copy_desc {
  uintptr_t src;
  uintptr_t dst;
  uint64_t bytes;
} oi_copy_desc;

/* Pinned host memory. `device` is the address kernels use for `host`
 * (equal to host on cpu and with unified addressing); NULL when device
 * kernels cannot address it (pageable memory). */
typedef struct oi_pinned {
  void *host;
  void *device;
  size_t bytes;
  uint32_t flags;
  int how; /* backend-private: how to free */
} oi_pinned;

typedef void (*oi_stream_fn)(void *arg, oi_status st);

/* How a stream moves a batch (values match oi_copy_mode). Which one a
 * batch should use is the transfer layer's policy (lib/transfer); AUTO here
 * is only a fallback for direct callers. */
enum {
  OI_XFER_AUTO = 0,
  OI_XFER_KERNEL = 1,
  OI_XFER_DMA = 2,
  OI_XFER_STAGED = 3, /* copy engines between host blocks and device staging slots,
                         a device-side gather/scatter kernel between slots and arenas */
};

typedef struct oi_copy_params {
  uint32_t mode;          /* OI_XFER_* */
  uint32_t cta_limit;     /* kernel copies: most CTAs a batch may use; 0 = backend default */
  bool host_mapped;       /* the host side is pinned memory kernels may address; without it
                             only DMA is used */
  uint64_t staging_bytes; /* staged copies: device memory of the stream's staging slots,
                             allocated at its first staged copy; 0 = OI_STAGING_BYTES */
} oi_copy_params;

/* Default CTA limit of copy kernels: enough for the PCIe limit, few enough to
 * leave the model most SMs (see docs/benchmarks.md). */
#define OI_DEFAULT_CTA_LIMIT 32

/* Device memory of one stream's staging slots (oi_copy_params.staging_bytes
 * of the first staged copy on the stream overrides it). */
#define OI_STAGING_BYTES (32ull << 20)
#define OI_STAGING_SLOTS 4

/* A GPU decode of codec frames (stream_decode; the frame format and its
 * pieces are lib/codec's, which this layer does not read: a piece is
 * oi_codec_piece's fields, of frame `frame` of the batch). */
enum { /* oi_decode_piece.kind: lib/codec's oi_codec_piece_kind, the same values */
       OI_DECODE_RANS = 1,
       OI_DECODE_RAW_EXP = 2,
       OI_DECODE_BYTES = 3,
       OI_DECODE_INT8 = 4,
       OI_DECODE_FP8 = 5,
       OI_DECODE_RANS32 = 6,
       OI_DECODE_INT8H = 7,
       OI_DECODE_PLANES = 8,
};
enum {                           /* a frame's status after stream_decode: why it did not decode */
       OI_DECODE_BAD_STREAM = 1, /* a rANS stream (its table, a read past its end, end states) */
       OI_DECODE_BAD_SCALE = 2,  /* a lossy scale that is not finite */
       OI_DECODE_NAN_CODE = 3,   /* an fp8 NaN code */
};

typedef struct oi_decode_piece {
  uint32_t frame, kind;
  uint32_t src, aux, dst; /* src, aux: from the frame's first byte; dst: from its block's */
  uint32_t len, count;
  uint16_t tokens, heads, head_dim;
} oi_decode_piece;

typedef struct oi_decode_batch {
  size_t n;                     /* frames */
  const uint8_t *const *frames; /* each in pinned host memory */
  const uint32_t *frame_bytes;  /* the bytes of each that cross the link */
  uint64_t block_bytes;         /* a frame's decoded block */
  const oi_decode_piece *pieces;
  size_t npieces;
  uint64_t max_lossy_elems; /* the most elements of a lossy piece; 0: none */
  /* From the decoded blocks to the arenas: src is an offset in the batch's
   * decoded bytes (block i at i * block_bytes), dst a device address. */
  const oi_copy_desc *descs;
  size_t ndescs;
  /* n entries. In: nonzero for a frame not to decode (its block goes out as
   * zeros). Out: 0 for a frame decoded, else why not (OI_DECODE_BAD_*),
   * written before the function of the next stream_call runs;
   * the caller keeps it until then. A frame that did not decode reaches the
   * arenas as zeros, never as other bytes. */
  int32_t *status;
} oi_decode_batch;

/* Frames made on the GPU (stream_encode; kernels/codec_frame.cu and
 * codec_lossy.cu make each block's frame as lib/codec's encoder does, byte
 * for byte). kind OI_ENCODE_LOSSLESS: the fields up to secret are lib/codec's
 * oi_lossless_gpu_plan, field for field. The lossy kinds: lib/codec's
 * oi_lossy_gpu_plan (header, secret, and the rest from payload_bytes on;
 * parts is the shape's). */
enum { OI_ENCODE_LOSSLESS = 0, OI_ENCODE_INT8 = 1, OI_ENCODE_INT8H = 2, OI_ENCODE_FP8 = 3 };
/* The widest head an int8-hadamard encode on the device takes. */
#define OI_ENCODE_LOSSY_MAX_DIM 1024u

typedef struct oi_encode_plan {
  uint32_t parts, segs_parts, segs_whole, max_segs, stream_cap;
  uint8_t header[24];
  uint8_t secret[192];
  uint32_t kind; /* OI_ENCODE_* */
  uint32_t payload_bytes, tokens, heads, head_dim, rot_block;
  float down;
  uint64_t seed;
  uint32_t planes; /* OI_ENCODE_LOSSLESS: the planes code's streams (frames of format 4) */
} oi_encode_plan;

/* A block's status: its frame does not fit its slot; the codec refuses a
 * value of it (a lossy codec: non-finite, or past its scales' range). */
enum { OI_ENCODE_PAST_SLOT = 1, OI_ENCODE_REFUSED = 2 };

typedef struct oi_encode_batch {
  size_t n;              /* blocks */
  uint8_t *const *slots; /* each frame_bytes of pinned host memory: gets the frame, zeros
                          * behind it */
  uint64_t block_bytes, frame_bytes;
  const oi_encode_plan *plan;
  /* From the arenas to the batch's blocks: src a device address, dst an
   * offset in the blocks (block i at i * block_bytes). */
  const oi_copy_desc *descs;
  size_t ndescs;
  /* n entries, out: 0 for a frame in its slot, else OI_ENCODE_PAST_SLOT or
   * OI_ENCODE_REFUSED (the slot's bytes are no frame), written before the function of the
   * next stream_call runs; the caller keeps it until then. */
  int32_t *status;
} oi_encode_batch;

typedef struct oi_dev_ops {
  const char *name;
  void (*close)(oi_dev *d);
  oi_status (*info)(oi_dev *d, oi_device_info *out);

  /* Device memory, zero-filled. */
  oi_status (*mem_alloc)(oi_dev *d, size_t bytes, uint32_t flags, void **out);
  void (*mem_free)(oi_dev *d, void *p);
  /* Blocking copies and fills for setup and tests (either direction). */
  oi_status (*mem_copy)(oi_dev *d, void *dst, const void *src, size_t bytes);
  /* Writes oi__pattern_byte(seed, i) at dst[i] for i in [0, bytes). */
  oi_status (*mem_fill_pattern)(oi_dev *d, void *dst, size_t bytes, uint64_t seed);

  /* Arena export/import (64-byte handle). */
  oi_status (*mem_export)(oi_dev *d, void *p, oi_arena_handle *out);
  oi_status (*mem_import)(oi_dev *d, const oi_arena_handle *h, uint64_t expected, void **ptr,
                          uint64_t *size);
  void (*mem_close_import)(oi_dev *d, void *ptr, uint64_t size);
  /* An engine-owned arena (the client's own memory, registered with the
   * sidecar): the handle of the allocation that holds [p, p + bytes) on this
   * device, and p's offset from that allocation's base (the importer maps
   * the base with mem_import and adds the offset). cuda only: a cpu arena
   * travels as a memfd (oi__fd_arena_*). */
  oi_status (*mem_export_range)(oi_dev *d, void *p, uint64_t bytes, oi_arena_handle *out,
                                uint64_t *offset);

  /* Pinned host memory for the host pool. */
  oi_status (*pinned_alloc)(oi_dev *d, size_t bytes, uint32_t flags, int numa_node, oi_pinned *out);
  void (*pinned_free)(oi_dev *d, oi_pinned *p);

  /* Streams. priority: 0 normal (saves), 1 high (loads). */
  oi_status (*stream_create)(oi_dev *d, int priority, oi_stream **out);
  /* Waits for queued work, then frees. Accepts NULL. */
  void (*stream_destroy)(oi_stream *s);
  /* Queues copies; `descs` is copied before return. `p` may be NULL (AUTO). */
  oi_status (*stream_copy)(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
                           const oi_copy_params *p);
  /* Queues `fn(arg, status)` after everything queued before it. `fn` must not
   * call into the backend (it may run on a driver thread). */
  oi_status (*stream_call)(oi_stream *s, oi_stream_fn fn, void *arg);
  /* Makes later work on `s` wait for an external event (a cudaEvent_t the
   * caller recorded after writing KV); NULL is a no-op. */
  oi_status (*stream_wait_event)(oi_stream *s, void *event);
  /* Records an event after the work queued so far (*event: a cudaEvent_t the
   * caller frees with event_destroy; NULL on cpu, where callbacks suffice). */
  oi_status (*stream_record_event)(oi_stream *s, void **event);
  void (*event_destroy)(void *event);
  /* Has the work before `event` ended? OI_OK, OI_PENDING, or the error. */
  oi_status (*event_query)(void *event);
  /* Blocks until everything queued so far finished. */
  oi_status (*stream_sync)(oi_stream *s);

  /* Moves the frames over the link, decodes them on the device and copies
   * the decoded bytes to the arenas, in the stream's order (loads of a codec
   * namespace, docs/codecs.md). The arrays are read during the call (but
   * `status`). NULL on backends that decode on the host. */
  oi_status (*stream_decode)(oi_stream *s, const oi_decode_batch *b);
  /* Copies the blocks from the arenas, makes their lossless frames on the
   * device and moves the frames into their slots, in the stream's order
   * (saves of a lossless namespace, docs/codecs.md). The arrays are read
   * during the call (but `status`). NULL on backends that encode on the
   * host. */
  oi_status (*stream_encode)(oi_stream *s, const oi_encode_batch *b);

} oi_dev_ops;

struct oi_dev {
  const oi_dev_ops *ops;
  int ordinal;
};

/* Opens the backend for `ordinal` (-1 cpu). */
oi_status oi__dev_open(int ordinal, oi_dev **out);
void oi__dev_close(oi_dev *d);

/* Lets the owner of an imported arena (the remote engine that returned it
 * from oi_engine_connect) learn that the caller closed it: `fn(ctx)`
 * runs inside oi_imported_arena_close, after the memory is unmapped, so the
 * owner may then unregister (and let the server free the memory). */
void oi__imported_arena_on_close(oi_imported_arena *a, void (*fn)(void *ctx), void *ctx);

/* Engine-owned cpu arenas travel as a file descriptor (SCM_RIGHTS): a
 * memfd sealed against shrinking (F_SEAL_SHRINK), so no client can make a
 * mapping of the server's fault, not sealed against writes, holding at least
 * `bytes`. oi__fd_arena_check is that check alone (the client runs it before
 * it sends the fd); oi__fd_arena_map runs it and maps [0, bytes) shared and
 * read-write (*mapped: the length to unmap). Failures: OI_ERR_INVALID_ARGUMENT
 * (not a sealed memfd, too small), OI_ERR_PERMISSION (opened read-only),
 * OI_ERR_OUT_OF_MEMORY (mmap). */
oi_status oi__fd_arena_check(int fd, uint64_t bytes, const char *what);
oi_status oi__fd_arena_map(int fd, uint64_t bytes, void **ptr, uint64_t *mapped, const char *what);
void oi__fd_arena_unmap(void *ptr, uint64_t mapped);
/* The client's side: is [base, base + bytes) this process's read-write
 * MAP_SHARED mapping of `fd`, base at file offset 0 (/proc/self/maps)? So
 * what the server copies is what the engine reads and writes.
 * OI_ERR_INVALID_ARGUMENT when it is not. */
oi_status oi__fd_arena_check_mapping(int fd, const void *base, uint64_t bytes, const char *what);

/* Removes the shared-memory objects that cpu-backend arenas of process
 * `pid` left behind (a process killed before it could unlink them). Only
 * for a pid that no longer exists. @return how many were removed. */
int oi__cpu_remove_orphan_arenas(int pid);

/* Backend constructors. */
oi_status oi__cpu_dev_open(oi_dev **out);
oi_status oi__cuda_dev_open(int ordinal, oi_dev **out);
int oi__cuda_device_count(void);

/* The deterministic test pattern both backends write. */
static inline uint8_t oi__pattern_byte(uint64_t seed, uint64_t offset) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + (offset >> 3) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (uint8_t)(x >> ((offset & 7) * 8));
}

#endif
