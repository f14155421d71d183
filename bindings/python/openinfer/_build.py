"""cffi builder of openinfer._native (out-of-line API mode).

The declarations below mirror include/openinfer/*.h. In API mode the C
compiler compiles them against the real headers, so a signature that drifts
from the header fails the build (warnings are errors), and structs are
declared with "..." so their layout always comes from the headers.

Where the headers and the library are found (first match wins):
  OPENINFER_INCLUDE_DIR / OPENINFER_LIB_DIR   environment (a build tree, a prefix)
  pkg-config openinfer                        an installed library (PKG_CONFIG_PATH)
  /usr/local/include, /usr/local/lib[/<multiarch>]   the default prefix
The library directory found is recorded as the module's RUNPATH (unless it is
one the dynamic loader searches anyway), so the module loads the
libopeninfer.so it was built against without LD_LIBRARY_PATH.
OPENINFER_RUNPATH, when set, is recorded instead (the wheel, tools/wheel:
`$ORIGIN/lib`, the library shipped inside the package).
"""
import os
import shlex
import subprocess

from cffi import FFI

CDEF = r"""
typedef int32_t oi_status;
#define OI_OK ...
#define OI_PENDING ...
#define OI_FENCING ...
#define OI_ERR_INVALID_ARGUMENT ...
#define OI_ERR_NOT_FOUND ...
#define OI_ERR_OUT_OF_MEMORY ...
#define OI_ERR_TIMEOUT ...
#define OI_ERR_CUDA ...
#define OI_ERR_IO ...
#define OI_ERR_PROTOCOL ...
#define OI_ERR_STATE ...
#define OI_ERR_LEASE_EXPIRED ...
#define OI_ERR_CLOSED ...
#define OI_ERR_UNSUPPORTED ...
#define OI_ERR_PERMISSION ...
#define OI_ERR_VERSION ...
#define OI_ERR_INTERNAL ...
#define OI_ERR_NO_DEVICE ...
#define OI_ERR_BUSY ...
#define OI_ERR_DEADLINE ...
#define OI_VERSION_NUMBER ...
#define OI_DEVICE_CPU ...
#define OI_HOST_HUGEPAGES ...
#define OI_HOST_NO_PIN ...
#define OI_QUERY_MEMBERSHIP ...
#define OI_QUERY_WAIT_PENDING ...
#define OI_LOAD_ARENA_EVENTS ...
#define OI_MODEL_KV_EVENTS ...

const char *oi_status_str(oi_status st);
const char *oi_last_error(void);
void oi_clear_error(void);
uint32_t oi_version(void);
const char *oi_version_string(void);

typedef enum oi_log_level {
  OI_LOG_TRACE, OI_LOG_DEBUG, OI_LOG_INFO, OI_LOG_WARN, OI_LOG_ERROR, OI_LOG_OFF, ...
} oi_log_level;
typedef void (*oi_log_fn)(void *ctx, oi_log_level level, const char *line);
void oi_set_log_handler(oi_log_fn fn, void *ctx);
oi_status oi_set_log_level(oi_log_level level);
oi_log_level oi_get_log_level(void);
typedef void (*oi_fatal_fn)(void *ctx, const char *reason);
void oi_set_fatal_handler(oi_fatal_fn fn, void *ctx);

typedef struct oi_block_hash { uint8_t bytes[16]; } oi_block_hash;
typedef struct oi_lease { uint8_t bytes[16]; } oi_lease;
typedef struct oi_arena_handle { uint8_t bytes[64]; } oi_arena_handle;

typedef struct oi_ticket oi_ticket;
typedef void (*oi_ticket_fn)(void *ctx, oi_ticket *t, oi_status st);
oi_status oi_ticket_poll(oi_ticket *t);
oi_status oi_ticket_wait(oi_ticket *t, uint32_t timeout_ms);
int oi_ticket_fd(oi_ticket *t);
void *oi_ticket_cuda_event(oi_ticket *t);
void *oi_ticket_arena_event(oi_ticket *t, uint32_t arena);
oi_status oi_ticket_arena_wait(oi_ticket *t, uint32_t arena, uint32_t timeout_ms);
oi_status oi_ticket_arena_poll(oi_ticket *t, uint32_t arena);
oi_status oi_ticket_set_callback(oi_ticket *t, oi_ticket_fn fn, void *ctx);
void oi_ticket_release(oi_ticket *t);

/* device.h */
typedef enum oi_backend_kind { OI_BACKEND_CPU, OI_BACKEND_CUDA, ... } oi_backend_kind;
typedef struct oi_device_info {
  uint32_t struct_size;
  int32_t device;
  uint32_t backend;
  char name[96];
  uint64_t total_memory;
  int32_t numa_node;
  uint32_t compute_capability;
  uint32_t can_map_host_memory;
  uint32_t multiprocessors;
  char pci_bus_id[16];
  ...;
} oi_device_info;
oi_status oi_device_count(int *count);
oi_status oi_device_get_info(int device, oi_device_info *info);
typedef struct oi_imported_arena oi_imported_arena;
oi_status oi_imported_arena_open(const oi_arena_handle *handle, uint64_t expected_bytes,
                                 int device, oi_imported_arena **out);
void *oi_imported_arena_ptr(const oi_imported_arena *a);
uint64_t oi_imported_arena_size(const oi_imported_arena *a);
void oi_imported_arena_close(oi_imported_arena *a);

/* hash.h */
oi_status oi_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                         const void *salt, size_t salt_len, const oi_block_hash *parent,
                         oi_block_hash *out, size_t out_cap, size_t *n_out);
#define OI_BLOCK_KEY_MAX ...
#define OI_BLOCK_KEY_SEED ...
#define OI_BLOCK_EXTRA_KEY_SEED ...
oi_status oi_block_key_from_bytes(const void *key, size_t len, oi_block_hash *out);
oi_status oi_block_keys_from_bytes(const void *keys, size_t key_len, size_t n,
                                   oi_block_hash *out);
typedef struct oi_block_extra_key {
  const void *bytes;
  size_t len;
  ...;
} oi_block_extra_key;
typedef struct oi_hash_blocks_args {
  uint32_t struct_size;
  uint32_t block_size;
  const uint32_t *tokens;
  size_t n_tokens;
  const void *salt;
  size_t salt_len;
  const oi_block_hash *parent;
  const oi_block_extra_key *extra_keys;
  size_t n_extra_keys;
  ...;
} oi_hash_blocks_args;
void oi_hash_blocks_args_init(oi_hash_blocks_args *args);
oi_status oi_hash_blocks_ex(const oi_hash_blocks_args *args, oi_block_hash *out, size_t out_cap,
                            size_t *n_out);

/* host.h */
typedef struct oi_host oi_host;
typedef struct oi_host_options {
  uint32_t struct_size;
  uint32_t flags;
  uint64_t pool_bytes;
  int32_t device;
  int32_t numa_node;
  uint32_t lease_ttl_ms;
  uint32_t index_shards;
  uint64_t chunk_bytes;
  float high_watermark;
  float low_watermark;
  uint64_t link_bytes_per_s;
  uint64_t disk_bytes_per_s;
  uint64_t remote_bytes_per_s;
  ...;
} oi_host_options;
typedef struct oi_host_stats {
  uint32_t struct_size;
  uint32_t size_classes;
  uint64_t capacity_bytes;
  uint64_t used_bytes;
  uint64_t free_bytes;
  uint64_t block_bytes_resident;
  uint64_t blocks_free;
  uint64_t blocks_in_flight;
  uint64_t blocks_sealed;
  uint64_t blocks_leased;
  uint64_t blocks_loading;
  uint64_t saves_submitted;
  uint64_t saves_completed;
  uint64_t saves_deduplicated;
  uint64_t saves_dropped;
  uint64_t saves_failed;
  uint64_t bytes_saved;
  uint64_t bytes_loaded;
  uint64_t loads_completed;
  uint64_t loads_failed;
  uint64_t query_hit_blocks;
  uint64_t query_miss_blocks;
  uint64_t leases_active;
  uint64_t leases_expired;
  uint64_t leases_released;
  uint64_t evictions;
  uint64_t link_bytes_per_s;
  uint64_t disk_bytes_per_s;
  uint64_t remote_bytes_per_s;
  uint64_t link_samples;
  uint64_t disk_samples;
  uint64_t remote_samples;
  ...;
} oi_host_stats;
oi_status oi_host_options_init(oi_host_options *o);
oi_status oi_host_create(const oi_host_options *o, oi_host **out);
void oi_host_destroy(oi_host *h);
oi_status oi_host_get_stats(const oi_host *h, oi_host_stats *out);
oi_status oi_host_evict_all(oi_host *h, uint64_t *evicted_blocks);
typedef enum oi_block_where {
  OI_WHERE_NONE, OI_WHERE_POOL, OI_WHERE_DISK, OI_WHERE_REMOTE, OI_WHERE_UNKNOWN, ...
} oi_block_where;
#define OI_PLAN_LAYERWISE ...
#define OI_PLAN_NO_SPLIT ...
#define OI_PLAN_STAGED ...
typedef struct oi_restore_plan_args {
  uint32_t struct_size;
  uint32_t flags;
  uint64_t prompt_tokens;
  uint64_t start_tokens;
  uint64_t n_blocks;
  const uint8_t *where;
  uint64_t block_tokens;
  uint64_t block_bytes;
  uint32_t num_layers;
  uint64_t link_bytes_per_s;
  uint64_t disk_bytes_per_s;
  uint64_t remote_bytes_per_s;
  double prefill_ns_per_token;
  double prefill_ns_per_token_ctx;
  uint64_t load_overhead_ns;
  ...;
} oi_restore_plan_args;
typedef struct oi_restore_plan {
  uint32_t struct_size;
  uint64_t compute_head_blocks;
  uint64_t load_blocks;
  uint64_t load_tokens;
  uint64_t compute_tokens;
  uint64_t est_ns;
  uint64_t est_cold_ns;
  uint64_t est_load_all_ns;
  ...;
} oi_restore_plan;
oi_status oi_restore_plan_args_init(oi_restore_plan_args *a);
oi_status oi_plan_restore(const oi_restore_plan_args *a, oi_restore_plan *out);

typedef struct oi_host_disk_options {
  uint32_t struct_size;
  uint32_t num_dirs;
  const char *const *dirs;
  uint64_t capacity_bytes;
  uint32_t queue_depth;
  uint32_t reserved;
} oi_host_disk_options;
typedef struct oi_host_disk_stats {
  uint32_t struct_size;
  uint32_t latency_buckets;
  uint64_t blocks;
  uint64_t bytes_used;
  uint64_t capacity_bytes;
  uint64_t spills;
  uint64_t spills_failed;
  uint64_t spills_skipped;
  uint64_t spill_overflow;
  uint64_t promotions;
  uint64_t promote_failed;
  uint64_t checksum_failures;
  uint64_t evictions;
  uint64_t torn_records_cut;
  uint64_t replay_ns;
  uint64_t read_latency_us[28];
  uint64_t read_latency_sum_us;
  uint64_t lost_queue_full;
  uint64_t lost_unwritten;
  uint64_t lost_write_failed;
  uint64_t lost_no_room;
  uint64_t disk_full;
  uint64_t full_events;
  uint64_t spills_refused_full;
} oi_host_disk_stats;
oi_status oi_host_disk_options_init(oi_host_disk_options *o);
oi_status oi_host_disk_options_check(const oi_host_disk_options *o);
oi_status oi_host_attach_disk(oi_host *h, const oi_host_disk_options *o);
oi_status oi_host_get_disk_stats(const oi_host *h, oi_host_disk_stats *out);

/* engine.h */
typedef struct oi_engine oi_engine;
typedef struct oi_arena_desc {
  const char *name;
  uint64_t offset;
  void *base;
  uint64_t num_blocks;
  uint64_t bytes_per_block;
  uint64_t block_stride;
  uint32_t segments;
  uint64_t segment_stride;
  ...;
} oi_arena_desc;
typedef enum oi_copy_mode { OI_COPY_AUTO, OI_COPY_KERNEL, OI_COPY_DMA, OI_COPY_STAGED, ... } oi_copy_mode;
typedef struct oi_engine_options {
  uint32_t struct_size;
  int32_t device;
  const char *namespace_id;
  const char *instance_name;
  uint32_t world_size;
  uint32_t num_arenas;
  const oi_arena_desc *arenas;
  void *arena_base;
  uint64_t arena_size;
  uint32_t save_deadline_ms;
  uint32_t load_deadline_ms;
  uint32_t copy_mode;
  uint32_t copy_cta_limit;
  uint32_t control_deadline_ms;
  const uint64_t *segment_offsets;
  uint32_t num_segment_offsets;
  int32_t arena_fd;
  uint32_t lookup_deadline_ms;
  uint32_t probe_interval_ms;
  const char *codec;
  uint32_t codec_tokens;
  uint32_t codec_heads;
  uint32_t codec_head_dim;
  uint64_t codec_slot_bytes;
  ...;
} oi_engine_options;
typedef void (*oi_save_done_fn)(void *ctx, oi_status st);
typedef struct oi_save_result {
  uint32_t struct_size;
  uint32_t reserved;
  uint64_t accepted;
  uint64_t deduplicated;
  uint64_t dropped;
  ...;
} oi_save_result;
typedef struct oi_save_options {
  uint32_t struct_size;
  uint32_t flags;
  void *wait_event;
  oi_save_done_fn on_done;
  void *on_done_ctx;
  oi_save_result *result;
  uint32_t arena_first;
  uint32_t arena_count;
  ...;
} oi_save_options;
typedef struct oi_load_options {
  uint32_t struct_size;
  uint32_t flags;
  ...;
} oi_load_options;
typedef enum oi_query_state { OI_QUERY_READY, OI_QUERY_LOADING, ... } oi_query_state;
typedef struct oi_query_result {
  uint32_t struct_size;
  uint32_t state;
  uint64_t hit_blocks;
  oi_lease lease;
  uint8_t *present;
  uint64_t pending_blocks;
  uint32_t wait_ms;
  uint8_t *where;
  ...;
} oi_query_result;
typedef struct oi_engine_stats {
  uint32_t struct_size;
  uint32_t instance_id;
  uint64_t block_bytes;
  uint64_t num_blocks;
  uint64_t saves_submitted;
  uint64_t saves_completed;
  uint64_t saves_deduplicated;
  uint64_t saves_dropped;
  uint64_t saves_failed;
  uint64_t loads_completed;
  uint64_t loads_failed;
  uint64_t blocks_loaded;
  uint64_t bytes_saved;
  uint64_t bytes_loaded;
  uint64_t query_hit_blocks;
  uint64_t query_miss_blocks;
  uint64_t saves_pending;
  uint64_t loads_submitted;
  uint64_t namespace_blocks_resident;
  uint32_t latency_buckets;
  uint64_t save_latency_us[...];
  uint64_t save_latency_sum_us;
  uint64_t load_latency_us[...];
  uint64_t load_latency_sum_us;
  uint64_t server_epoch;
  uint32_t connection;
  uint32_t reconnects;
  uint64_t disconnected_saves;
  uint64_t disconnected_query_misses;
  uint64_t saves_not_encoded;
  ...;
} oi_engine_stats;
typedef enum oi_connection_state { OI_CONNECTION_EMBEDDED, OI_CONNECTION_CONNECTED, OI_CONNECTION_DEGRADED, ... } oi_connection_state;
oi_status oi_engine_options_init(oi_engine_options *o);
oi_status oi_save_options_init(oi_save_options *o);
oi_status oi_load_options_init(oi_load_options *o);
oi_status oi_engine_create(oi_host *h, const oi_engine_options *o,
                                   oi_engine **out);
oi_status oi_engine_connect(const char *socket_path, const oi_engine_options *o,
                                    oi_engine **out, oi_imported_arena **arena_out);
void oi_engine_destroy(oi_engine *e);
oi_status oi_engine_save(oi_engine *e, const int64_t *block_ids,
                                 const oi_block_hash *hashes, size_t n,
                                 const oi_save_options *opt, oi_ticket **ticket_out);
oi_status oi_engine_query(oi_engine *e, const char *req_id,
                                  const oi_block_hash *hashes, size_t n, uint32_t flags,
                                  oi_query_result *out);
oi_status oi_engine_load(oi_engine *e, oi_lease lease,
                                 const int64_t *dst_block_ids, size_t n,
                                 const oi_load_options *opt, oi_ticket **ticket_out);
oi_status oi_engine_release(oi_engine *e, oi_lease lease);
oi_status oi_engine_flush(oi_engine *e, uint32_t timeout_ms);
oi_status oi_engine_get_stats(const oi_engine *e, oi_engine_stats *out);
typedef struct oi_lookup_options {
  uint32_t struct_size;
  const char *namespace_id;
  uint32_t world_size;
  uint32_t control_deadline_ms;
  const char *client_name;
  uint32_t lookup_deadline_ms;
  uint32_t probe_interval_ms;
  ...;
} oi_lookup_options;
oi_status oi_lookup_options_init(oi_lookup_options *o);
oi_status oi_host_query(oi_host *h, const oi_lookup_options *o,
                                const char *req_id, const oi_block_hash *hashes, size_t n,
                                uint32_t flags, oi_query_result *out);
oi_status oi_host_release(oi_host *h, const char *namespace_id, oi_lease lease);
typedef struct oi_lookup oi_lookup;
oi_status oi_lookup_connect(const char *socket_path, const oi_lookup_options *o,
                                    oi_lookup **out);
oi_status oi_lookup_query(oi_lookup *c, const char *req_id,
                                  const oi_block_hash *hashes, size_t n, uint32_t flags,
                                  oi_query_result *out);
oi_status oi_lookup_release(oi_lookup *c, oi_lease lease);
void oi_lookup_destroy(oi_lookup *c);

/* server.h */
typedef struct oi_server oi_server;
typedef struct oi_server_options {
  uint32_t struct_size;
  const char *socket_path;
  uint32_t socket_mode;
  uint32_t num_allowed_uids;
  const uint32_t *allowed_uids;
  uint32_t num_allowed_gids;
  const uint32_t *allowed_gids;
  const oi_host_options *host;
  uint32_t num_devices;
  const int32_t *devices;
  int32_t log_level;
  uint32_t max_sessions;
  ...;
} oi_server_options;
oi_status oi_server_options_init(oi_server_options *o);
oi_status oi_server_create(const oi_server_options *o, oi_server **out);
oi_status oi_server_run(oi_server *s);
oi_status oi_server_stop(oi_server *s);
uint64_t oi_server_epoch(const oi_server *s);
const char *oi_server_socket_path(const oi_server *s);
void oi_server_destroy(oi_server *s);
typedef struct oi_server_stats {
  uint32_t struct_size;
  uint32_t namespaces;
  char server_version[64];
  uint64_t epoch;
  uint64_t uptime_ns;
  uint64_t sessions;
  uint64_t instances;
  uint64_t arena_bytes;
  uint64_t instances_cleaned_up;
  char socket_path[108];
  ...;
} oi_server_stats;
typedef struct oi_host_namespace_stats oi_host_namespace_stats;
oi_status oi_server_fetch_stats(const char *socket_path, uint32_t timeout_ms,
                                oi_server_stats *out, oi_host_stats *host,
                                oi_host_namespace_stats *namespaces, uint32_t cap);

/* executor.h */
typedef struct oi_executor oi_executor;
typedef struct oi_model_desc {
  uint32_t struct_size;
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype_bytes;
  uint32_t vocab_size;
  uint32_t max_positions;
  const char *model_id;
  uint32_t flags;
  ...;
} oi_model_desc;
typedef struct oi_kv_layout {
  uint32_t struct_size;
  int32_t device;
  void *base;
  uint64_t bytes;
  uint32_t num_layers;
  uint32_t page_size;
  uint64_t num_blocks;
  uint64_t layer_stride;
  uint64_t block_stride;
  uint64_t segment_stride;
  uint64_t token_stride;
  ...;
} oi_kv_layout;
typedef struct oi_model_seq {
  uint64_t request_id;
  const uint32_t *tokens;
  uint32_t n_tokens;
  uint32_t position;
  const int64_t *block_table;
  uint32_t n_blocks;
  uint32_t want_token;
  uint32_t next_token;
  float *logits;
  ...;
} oi_model_seq;
typedef struct oi_model_batch {
  uint32_t struct_size;
  uint32_t rank;
  uint32_t n_seqs;
  oi_model_seq *seqs;
  uint32_t n_kv_waits;
  void *const *kv_events;
  ...;
} oi_model_batch;
typedef struct oi_model_ops {
  uint32_t struct_size;
  oi_status (*describe)(void *ctx, oi_model_desc *out);
  oi_status (*bind)(void *ctx, uint32_t rank, const oi_kv_layout *layout);
  oi_status (*forward)(void *ctx, const oi_model_batch *batch);
  void (*unbind)(void *ctx, uint32_t rank);
  ...;
} oi_model_ops;
typedef struct oi_refmodel_options {
  uint32_t struct_size;
  uint64_t seed;
  uint32_t num_layers;
  uint32_t hidden;
  uint32_t num_q_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t intermediate;
  uint32_t vocab_size;
  uint32_t max_positions;
  float rope_theta;
  float rms_eps;
  ...;
} oi_refmodel_options;
oi_status oi_refmodel_options_init(oi_refmodel_options *o);
oi_status oi_refmodel_create(const oi_refmodel_options *o, oi_model_ops *ops_out, void **ctx_out);
void oi_refmodel_destroy(void *ctx);
oi_status oi_set_last_error(oi_status st, const char *msg);
typedef struct oi_device_buffer oi_device_buffer;
oi_status oi_device_buffer_alloc(int device, uint64_t bytes, oi_device_buffer **out);
void *oi_device_buffer_ptr(const oi_device_buffer *b);
oi_status oi_device_buffer_copy(oi_device_buffer *b, void *dst, const void *src, uint64_t bytes);
void oi_device_buffer_free(oi_device_buffer *b);
typedef struct oi_host_cluster_options {
  uint32_t struct_size;
  uint32_t timeout_ms;
  const char *redis_url;
  const char *node_id;
  const char *listen_addr;
  const char *advertise_addr;
  const char *secret_file;
  const char *cluster_name;
  const char *redis_auth_file;
  const char *redis_tls_ca_file;
  const char *redis_tls_cert_file;
  const char *redis_tls_key_file;
} oi_host_cluster_options;
typedef struct oi_host_cluster_stats {
  uint32_t struct_size;
  uint32_t directory_connected;
  uint64_t published;
  uint64_t unpublished;
  uint64_t lookups;
  uint64_t remote_blocks;
  uint64_t remote_failed;
  uint64_t stale_removed;
  uint64_t served_blocks;
  uint64_t peers_refused;
  uint64_t bytes_fetched;
  uint64_t bytes_served;
  uint16_t port;
  uint16_t reserved[3];
  uint64_t fetches;
  uint64_t fetch_ns;
  uint32_t holders_up;
  uint32_t holders_down;
  uint64_t holders_marked_down;
  uint64_t directory_errors;
  uint64_t directory_dropped;
  uint64_t directory_rejected;
  uint64_t handshakes_failed;
} oi_host_cluster_stats;
oi_status oi_host_cluster_options_init(oi_host_cluster_options *o);
oi_status oi_host_cluster_options_check(const oi_host_cluster_options *o);
oi_status oi_host_attach_cluster(oi_host *h, const oi_host_cluster_options *o);
oi_status oi_host_get_cluster_stats(const oi_host *h, oi_host_cluster_stats *out);
oi_status oi_server_attach_cluster(oi_server *s, const oi_host_cluster_options *o);
oi_status oi_server_fetch_cluster_stats(const char *socket_path, uint32_t timeout_ms,
                                        oi_host_cluster_stats *out);
typedef enum oi_offload_mode { OI_OFFLOAD_NONE, OI_OFFLOAD_EMBEDDED, OI_OFFLOAD_SIDECAR, ... } oi_offload_mode;
typedef enum oi_restore_overlap { OI_RESTORE_OVERLAP_AUTO, OI_RESTORE_OVERLAP_OFF, OI_RESTORE_OVERLAP_HOST, ... } oi_restore_overlap;
typedef enum oi_restore_plan_mode { OI_RESTORE_PLAN_AUTO, OI_RESTORE_PLAN_OFF, ... } oi_restore_plan_mode;
typedef void (*oi_token_fn)(void *ctx, uint64_t request_id, uint32_t token, uint32_t index,
                            int finished);
typedef int (*oi_executor_fault_fn)(void *ctx, uint32_t rank, uint64_t request_id, uint32_t fault);
typedef struct oi_executor_options {
  uint32_t struct_size;
  const oi_model_ops *model;
  void *model_ctx;
  uint32_t ranks;
  const int32_t *devices;
  uint32_t page_size;
  uint32_t gpu_blocks;
  uint32_t offload;
  oi_host *host;
  const oi_host_options *host_options;
  const char *socket_path;
  const char *namespace_id;
  uint32_t max_batch_tokens;
  uint32_t max_batch_seqs;
  uint32_t prefix_cache;
  oi_token_fn on_token;
  void *on_token_ctx;
  uint32_t restore_timeout_ms;
  uint32_t flush_timeout_ms;
  oi_executor_fault_fn fault_hook;
  void *fault_ctx;
  uint32_t restore_overlap;
  uint32_t restore_plan;
  double prefill_ns_per_token;
  double prefill_ns_per_token_ctx;
  uint64_t link_bytes_per_s;
  uint64_t disk_bytes_per_s;
  uint64_t remote_bytes_per_s;
  const char *codec;
  uint64_t codec_slot_bytes;
  ...;
} oi_executor_options;
typedef struct oi_request {
  uint32_t struct_size;
  const uint32_t *prompt;
  uint32_t prompt_len;
  uint32_t max_new_tokens;
  int32_t rank;
  const void *salt;
  uint32_t salt_len;
  ...;
} oi_request;
typedef enum oi_request_state {
  OI_REQUEST_WAITING, OI_REQUEST_RESTORING, OI_REQUEST_RUNNING, OI_REQUEST_FINISHED,
  OI_REQUEST_FAILED, ...
} oi_request_state;
typedef struct oi_request_result {
  uint32_t struct_size;
  uint32_t state;
  oi_status status;
  uint32_t rank;
  const uint32_t *tokens;
  uint32_t n_tokens;
  uint32_t prompt_len;
  uint32_t cached_tokens;
  uint32_t restored_tokens;
  uint32_t computed_tokens;
  uint64_t ttft_ns;
  uint64_t latency_ns;
  ...;
} oi_request_result;
typedef struct oi_executor_stats {
  uint32_t struct_size;
  uint32_t ranks;
  uint64_t steps;
  uint64_t requests_submitted;
  uint64_t requests_finished;
  uint64_t requests_failed;
  uint64_t prefill_tokens;
  uint64_t decode_tokens;
  uint64_t cached_tokens;
  uint64_t restored_tokens;
  uint64_t restores_started;
  uint64_t restores_completed;
  uint64_t restores_failed;
  uint64_t saves_submitted;
  uint64_t save_blocks_pending;
  uint64_t blocks_total;
  uint64_t blocks_free;
  uint64_t blocks_cached;
  uint64_t blocks_active;
  uint64_t leases_held;
  uint64_t restores_overlapped;
  uint64_t restores_waited;
  uint64_t plans;
  uint64_t plans_compute;
  uint64_t plans_split;
  uint64_t plans_partial;
  uint64_t plan_ns;
  double prefill_ns_per_token;
  double prefill_ns_per_token_ctx;
  uint64_t prefill_samples;
  ...;
} oi_executor_stats;
oi_status oi_executor_options_init(oi_executor_options *o);
oi_status oi_request_init(oi_request *r);
oi_status oi_executor_create(const oi_executor_options *o, oi_executor **out);
oi_status oi_executor_submit(oi_executor *x, const oi_request *r, uint64_t *request_id);
oi_status oi_executor_step(oi_executor *x, uint32_t *finished);
oi_status oi_executor_run_until_idle(oi_executor *x);
oi_status oi_executor_get_result(oi_executor *x, uint64_t request_id, oi_request_result *out);
oi_status oi_executor_flush(oi_executor *x, uint32_t timeout_ms);
oi_status oi_executor_evict_gpu_cache(oi_executor *x, uint64_t *evicted);
oi_status oi_executor_get_stats(const oi_executor *x, oi_executor_stats *out);
oi_status oi_executor_get_kv_layout(const oi_executor *x, uint32_t rank, oi_kv_layout *out);
oi_status oi_executor_request_blocks(const oi_executor *x, uint64_t request_id, int64_t *out,
                                     size_t cap, size_t *n);
void oi_executor_destroy(oi_executor *x);

/* Python-side trampolines (cffi "extern Python"). */
extern "Python" void _oi_py_ticket_cb(void *ctx, oi_ticket *t, oi_status st);
extern "Python" void _oi_py_save_done(void *ctx, oi_status st);
extern "Python" void _oi_py_log(void *ctx, oi_log_level level, const char *line);
extern "Python" void _oi_py_token(void *ctx, uint64_t request_id, uint32_t token, uint32_t index,
                                  int finished);
"""

# The public headers this module binds. RefModel needs the experimental API
# (experimental.h: the reference model), visible with OI_EXPERIMENTAL.
HEADERS = ["common.h", "device.h", "hash.h", "host.h", "engine.h", "server.h", "model.h",
           "executor.h", "experimental.h"]

SOURCE = "#define OI_EXPERIMENTAL 1\n" + "\n".join('#include <openinfer/%s>' % h for h in HEADERS) + "\n"


# Directories the dynamic loader searches without being told: no RUNPATH.
_SYSTEM_LIB_DIRS = {"/lib", "/lib64", "/usr/lib", "/usr/lib64"}


def _multiarch():
    import sysconfig
    return sysconfig.get_config_var("MULTIARCH") or ""


def _pkg_config(*args):
    try:
        return subprocess.run(["pkg-config"] + list(args) + ["openinfer"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _is_system_dir(d):
    d = os.path.normpath(d)
    arch = _multiarch()
    return d in _SYSTEM_LIB_DIRS or (arch and d in ("/lib/" + arch, "/usr/lib/" + arch))


def _locate():
    inc = os.environ.get("OPENINFER_INCLUDE_DIR")
    lib = os.environ.get("OPENINFER_LIB_DIR")
    inc = os.path.abspath(inc) if inc else None
    lib = os.path.abspath(lib) if lib else None
    cflags, libdirs = [], []
    incdirs = [inc] if inc else []
    if lib:
        libdirs = [lib]
    if not inc or not lib:
        out = _pkg_config("--cflags", "--libs-only-L")
        if out is not None:
            for flag in shlex.split(out):
                if flag.startswith("-I") and not inc:
                    incdirs.append(flag[2:])
                elif flag.startswith("-L") and not lib:
                    libdirs.append(flag[2:])
            # pkg-config leaves out -L for the system's own directories.
            pc_libdir = _pkg_config("--variable=libdir")
            if not lib and not libdirs and pc_libdir:
                libdirs.append(pc_libdir)
        else:
            if not inc:
                incdirs.append("/usr/local/include")
            if not lib:
                arch = _multiarch()
                cands = (["/usr/local/lib/" + arch] if arch else []) + ["/usr/local/lib"]
                libdirs.append(next((d for d in cands
                                     if os.path.exists(os.path.join(d, "libopeninfer.so"))),
                                    "/usr/local/lib"))
    rpath = [d for d in libdirs if not _is_system_dir(d)]
    if os.environ.get("OPENINFER_RUNPATH"):
        rpath = os.environ["OPENINFER_RUNPATH"].split(":")
    return incdirs, libdirs, rpath, cflags


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
_inc, _libdirs, _rpath, _cflags = _locate()
ffibuilder.set_source(
    "openinfer._native",
    SOURCE,
    include_dirs=_inc,
    library_dirs=_libdirs,
    runtime_library_dirs=_rpath,
    # (the reference model, oi_refmodel_*, is libopeninfer-refmodel.so, installed
    # beside libopeninfer.so)
    libraries=["openinfer", "openinfer-refmodel"],
    # The declarations above are checked by the compiler: any mismatch with
    # the headers is an error. (cffi's own generated code is not -Wextra
    # clean, so only the warnings that catch a wrong declaration are errors.)
    extra_compile_args=["-std=gnu11", "-Werror", "-Wall", "-Wno-unused-function",
                        "-Wno-unused-variable", "-Wno-unused-but-set-variable",
                        "-Werror=incompatible-pointer-types", "-Werror=int-conversion"] + _cflags,
)

if __name__ == "__main__":
    import sys
    tmp = sys.argv[1] if len(sys.argv) > 1 else "."
    ffibuilder.compile(tmpdir=tmp, verbose=False)
