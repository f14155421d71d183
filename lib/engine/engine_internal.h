/* The engine object: argument checks common to every kind of engine live in
 * engine.c; the embedded (local) engine implements the operations over a host
 * in this process, the remote one over the sidecar's socket. */
#ifndef OI_ENGINE_INTERNAL_H
#define OI_ENGINE_INTERNAL_H

#include "engine/codec.h"
#include "engine/layout.h"
#include "openinfer/engine.h"

typedef struct engine_ops {
  oi_status (*save)(oi_engine *e, const int64_t *ids, const oi_block_hash *hashes, size_t n,
                    const oi_save_options *opt, oi_ticket **ticket_out);
  /* `present`: out->present when the caller's result has the field, else NULL
   * (never NULL for a membership query of n > 0 blocks). */
  /* wait_ms: OI_QUERY_WAIT_PENDING's limit (0 when the flag is not set). */
  oi_status (*query)(oi_engine *e, const char *req_id, const oi_block_hash *hashes, size_t n,
                     uint32_t flags, uint8_t *present, uint32_t wait_ms, oi_query_result *out);
  oi_status (*load)(oi_engine *e, oi_lease lease, const int64_t *ids, size_t n,
                    const oi_load_options *opt, oi_ticket **ticket_out);
  oi_status (*release)(oi_engine *e, oi_lease lease);
  oi_status (*flush)(oi_engine *e, uint32_t timeout_ms);
  oi_status (*stats)(const oi_engine *e, oi_engine_stats *out);
  void (*destroy)(oi_engine *e);
} engine_ops;

struct oi_engine {
  const engine_ops *ops;
  oi_engine_options opts; /* namespace_id / instance_name / arenas point into owned copies */
  char *namespace_id;
  char *instance_name;
  oi_layout layout;
  engine_codec codec; /* the namespace's codec (oi_engine_options.codec) */
  uint32_t instance_id;
  /* Who may redeem this engine's leases besides it (host/host.h's
   * principal): 0 for embedded engines; the server sets its peer's uid. */
  uint64_t principal;
};

/* Checks lookup options into *lo (struct_size at least
 * OI_FLOOR_LOOKUP_OPTIONS; a newer caller's zero tail is ignored). */
oi_status oi__lookup_options_check(const oi_lookup_options *o, const char *what,
                                   oi_lookup_options *lo);

/* Fills the common part (options copy, layout) of a new engine. */
oi_status oi__engine_init_common(oi_engine *e, const oi_engine_options *o, const char *what);
void oi__engine_fini_common(oi_engine *e);

/* Layouts given by offset into an arena that is not mapped yet (a sidecar's
 * arena, allocated by the server): every layout rule is checked against a
 * stand-in base, so the checks are the same as at the real one. */
#define OI_ENGINE_STANDIN_BASE ((uintptr_t)4096)
/* As oi__engine_init_common for options whose arena_base is NULL and whose
 * arenas are given by offset within arena_size; the layout sits at the
 * stand-in base until oi__engine_rebase. */
oi_status oi__engine_init_unmapped(oi_engine *e, const oi_engine_options *o, const char *what);
/* Moves the layout of an engine made by oi__engine_init_unmapped onto the
 * mapped arena [base, base + size). */
void oi__engine_rebase(oi_engine *e, void *base, uint64_t size);
/* Checks what oi__engine_init_unmapped would, keeping nothing. */
oi_status oi__engine_validate_unmapped(const oi_engine_options *o, const char *what);

oi_status oi__local_engine_create(oi_host *h, const oi_engine_options *o, oi_engine **out);

/* The sidecar engine (remote_*.c): requests over the server's socket. */
oi_status oi__remote_engine_connect(const char *socket_path, const oi_engine_options *o,
                                    oi_engine **out, oi_imported_arena **arena_out);

#endif
