/* The cuda backend's private declarations, shared by its files: cuda.c (the
 * device, its memory, pinned host memory, IPC export and import; the ops
 * table), cuda_stream.c (streams: the kernel and DMA copy paths, host
 * calls, events) and cuda_stage.c (staged copies through device slots).
 * Compiled only with the cuda backend (cuda_none.c otherwise); included by
 * no file outside lib/device. */
#ifndef OI_DEVICE_CUDA_INTERNAL_H
#define OI_DEVICE_CUDA_INTERNAL_H

#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>

#include "device.h"
#include "kernels/kernels.h"

typedef CUresult (*pfn_ipc_open)(CUdeviceptr *, CUipcMemHandle, unsigned int);
typedef CUresult (*pfn_ipc_close)(CUdeviceptr);
typedef CUresult (*pfn_addr_range)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*pfn_host_register)(void *, size_t, unsigned int);
typedef CUresult (*pfn_host_unregister)(void *);
typedef CUresult (*pfn_error_string)(CUresult, const char **);

typedef struct driver_api {
  pfn_ipc_open ipc_open;
  pfn_ipc_close ipc_close;
  pfn_addr_range addr_range;
  pfn_host_register host_register;
  pfn_host_unregister host_unregister;
  pfn_error_string error_string;
} driver_api;

typedef struct cuda_dev {
  oi_dev base;
  driver_api drv;
} cuda_dev;

/* A failed CUDA runtime call: clears a non-sticky error, fails with OI_ERR_CUDA. */
oi_status oi__cuda_fail(cudaError_t err, const char *what);
/* cudaSetDevice for d. */
oi_status oi__cuda_use_device(const oi_dev *d);

/* ---- streams (cuda_stream.c) ---- */

/* A mapped pinned buffer holding one batch's kernel descriptor table. It may
 * be reused once `done` (recorded after the kernel that reads it) completed:
 * an event, not a host callback, so the stream never stalls on the CPU
 * between batches. */
typedef struct table_buf {
  struct table_buf *next;
  cudaEvent_t done;
  oi_kcopy_entry *host;
  oi_kcopy_entry *device;   /* the same memory as the kernel addresses it */
  oi_kcopy_entry *resident; /* staged copies: a device-memory copy (cap entries), made
                               lazily; the kernels read it there, not across PCIe */
  size_t cap;               /* entries */
} table_buf;

/* Staged copies (OI_XFER_STAGED). A ring of device staging slots sits
 * between the host blocks and the arenas. The copy engines move host bytes
 * in large contiguous runs on `aux`; a gather/scatter kernel on the main
 * stream moves the scattered pieces between slots and arenas at device
 * memory speed. Events hand each slot back and forth, so the DMA of one slot
 * overlaps the kernel of another:
 *   load:  aux  [wait free[j]] DMA host -> slot j [record full[j]]
 *          main [wait full[j]] scatter slot j -> arenas [record free[j]]
 *   save:  main [wait free[j]] gather arenas -> slot j [record full[j]]
 *          aux  [wait full[j]] DMA slot j -> host [record free[j]]
 * A save's last DMA runs on aux, so everything that observes the main
 * stream (stream_call, record_event, sync) first joins aux into it. */
typedef struct stage_seg {
  uint64_t host, off, bytes;
} stage_seg;

typedef struct stage_slot { /* one slot's share of a batch */
  size_t first_entry, n_entries, first_seg, n_segs;
} stage_slot;

typedef struct stage_ring {
  uint8_t *mem; /* nslots * slot_bytes of device memory */
  uint64_t slot_bytes;
  uint32_t nslots, next;
  cudaStream_t aux;
  cudaEvent_t full[OI_STAGING_SLOTS], free_[OI_STAGING_SLOTS], join;
  bool ready, failed, join_needed;
  /* the plan of the batch being queued: host runs and slot shares */
  stage_seg *segs;
  size_t nsegs, segs_cap;
  stage_slot *slots;
  size_t nslots_used, slots_cap;
} stage_ring;

/* GPU decodes of codec frames (cuda_decode.c): two slots of device memory,
 * each a group's frames and its decoded blocks. The frames cross the link
 * on `aux` while the main stream decodes and scatters the other slot:
 *   aux  [wait free[j]] DMA frames -> slot j [record full[j]]
 *   main [wait full[j]] decode, zero failed blocks, scatter to the arenas
 *        [record free[j]] status -> host, a host call hands it over */
#define OI_DECODE_SLOTS 2
typedef struct decode_ring {
  uint8_t *frames[OI_DECODE_SLOTS], *blocks[OI_DECODE_SLOTS];
  uint64_t frames_cap, blocks_cap; /* bytes of each slot's */
  cudaEvent_t full[OI_DECODE_SLOTS], free_[OI_DECODE_SLOTS];
  cudaStream_t aux;
  uint32_t next;
  bool ready;
  /* OI_DECODE_TRACE: per slot, events around its last batch (aux's frames,
   * main's decode and scatter) and when the host queued it */
  bool trace, traced[OI_DECODE_SLOTS];
  cudaEvent_t tev[OI_DECODE_SLOTS][4], tbase;
  uint64_t tqueued[OI_DECODE_SLOTS], tbase_ns, tgroup;
  uint64_t tcalled[OI_DECODE_SLOTS],
      tcall_ns;                      /* stream_decode's entry (the next batch's: tcall_ns) */
  uint32_t ttables[OI_DECODE_SLOTS]; /* the stream's tables made so far */
} decode_ring;

/* GPU encodes of lossless frames (cuda_encode.c): the blocks are gathered
 * and framed on `aux` while the main stream moves the other slot's frames
 * to their host slots:
 *   aux  [wait go] [wait free[j]] table; gather; frames -> slot j [record full[j]]
 *   main [wait full[j]] DMA slot j's frames -> host slots; status -> host
 *        [record free[j]] a host call hands the statuses over
 * `go` is recorded on main when the main stream waited on an event since
 * the last one (stream_wait_event: the engine's "the KV is written"), so
 * aux reads the arenas only after what main waited on. One gather and
 * framing runs at a time (aux is in order): the blocks and the kernels'
 * scratch are one, the frames two. */
#define OI_ENCODE_SLOTS 2
typedef struct encode_ring {
  uint8_t *frames[OI_ENCODE_SLOTS];
  uint8_t *blocks, *work, *secret; /* work: the kernels' scratch (oi_kframe_args) */
  uint64_t frames_cap, blocks_cap, work_cap;
  cudaEvent_t full[OI_ENCODE_SLOTS], free_[OI_ENCODE_SLOTS], go;
  cudaStream_t aux;
  cudaStream_t side; /* the data checksums, beside the encode (fork, join) */
  cudaEvent_t fork, join;
  /* OI_ENCODE_TRACE=1: each group's times on stderr (measuring only) */
  bool trace, traced[OI_ENCODE_SLOTS];
  cudaEvent_t tev[OI_ENCODE_SLOTS][4], tbase;
  uint64_t tgroup;
  uint64_t waits_seen; /* s->waits when go was last recorded (go_set) */
  bool go_set;
  uint32_t next;
  bool ready, secret_set;
} encode_ring;

struct oi_stream {
  cudaStream_t stream;
  int ordinal;
  bool can_map; /* kernels may use host pointers of registered memory */
  uint32_t sms; /* multiprocessors: staged kernels use them all unless limited */
  pthread_mutex_t lock;
  pthread_mutex_t copy_lock; /* one stream_copy at a time: tables and DMA arrays are shared */
  oi_status pending;         /* first enqueue error since the last stream_call */
  table_buf *tables;         /* every table of this stream, least recently taken first */
  uint32_t tables_made;      /* how many (OI_DECODE_TRACE reports it) */
  /* DMA argument arrays, reused (the batch API reads them during the call) */
  void **dma_dst;
  const void **dma_src;
  size_t *dma_size;
  size_t dma_cap;
  bool batch_api_broken;      /* cudaMemcpyBatchAsync failed once: use the fallback */
  stage_ring stg;             /* staged copies; set up on first use */
  decode_ring dec;            /* GPU decodes; set up on first use */
  encode_ring enc;            /* GPU encodes; set up on first use */
  atomic_uint_fast64_t waits; /* stream_wait_event calls (encode_ring's go) */
};

/* The stream ops of the ops table. */
oi_status oi__cuda_stream_create(oi_dev *d, int priority, oi_stream **out);
void oi__cuda_stream_destroy(oi_stream *s);
oi_status oi__cuda_stream_copy(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
                               const oi_copy_params *p);
oi_status oi__cuda_stream_call(oi_stream *s, oi_stream_fn fn, void *arg);
oi_status oi__cuda_stream_wait_event(oi_stream *s, void *event);
oi_status oi__cuda_stream_record_event(oi_stream *s, void **event);
void oi__cuda_event_destroy(void *event);
oi_status oi__cuda_event_query(void *event);
oi_status oi__cuda_stream_sync(oi_stream *s);

/* A table of at least `entries` that no queued kernel still reads, or a
 * new one (NULL: out of memory). */
table_buf *oi__cuda_take_table(oi_stream *s, size_t entries);
/* Grows s->dma_* to n entries (false: out of memory). */
bool oi__cuda_grow_dma_arrays(oi_stream *s, size_t n);
/* One cudaMemcpyBatchAsync of the n copies in s->dma_* on `stream` (false:
 * refused; the caller queues them one by one). */
bool oi__cuda_dma_batch(oi_stream *s, size_t n, cudaStream_t stream);

/* A kernel copy's entries (descs cut in chunks) into out (NULL: count
 * them); *warps: the warp-per-entry kernel suits them. @return the count. */
size_t oi__cuda_kcopy_plan(const oi_copy_desc *descs, size_t n, bool *warps, oi_kcopy_entry *out);
/* Launches the batch copy kernel `warps` chose over a table of n entries. */
cudaError_t oi__cuda_kcopy_launch(bool warps, const oi_kcopy_entry *table, size_t n, uint32_t ctas,
                                  cudaStream_t stream);

/* ---- GPU decodes (cuda_decode.c) ---- */

oi_status oi__cuda_stream_decode(oi_stream *s, const oi_decode_batch *b);
/* A table (oi__cuda_take_table) of at least `bytes`, with its device copy
 * (t->resident); NULL with oi_last_error() set ("<what>: ..."). */
table_buf *oi__cuda_take_resident_table(oi_stream *s, size_t bytes, const char *what);

/* Hands a batch's statuses (in its table's pinned memory) to the caller: a
 * host function on the stream (cudaLaunchHostFunc), which frees h. */
typedef struct oi_status_handoff {
  const int32_t *from;
  int32_t *to;
  size_t n;
} oi_status_handoff;
void CUDART_CB oi__cuda_hand_over(void *h);

void oi__cuda_decode_free(decode_ring *r);
void oi__cuda_encode_free(encode_ring *r);
oi_status oi__cuda_stream_encode(oi_stream *s, const oi_encode_batch *b);

/* ---- staged copies (cuda_stage.c) ---- */

void oi__cuda_stage_free(stage_ring *g);
/* Sets up s's ring on first use (false: unavailable; copy another way). */
bool oi__cuda_stage_setup(oi_stream *s, uint64_t staging_bytes);
/* Makes later work on the main stream wait for the staged DMA queued on aux. */
cudaError_t oi__cuda_stage_join(oi_stream *s);
/* The staged path of a batch (under s->copy_lock). */
oi_status oi__cuda_copy_staged(oi_stream *s, oi_copy_dir dir, const oi_copy_desc *descs, size_t n,
                               uint32_t ctas);

#endif
