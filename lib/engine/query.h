/* The public query's contract beside the host's query (host/host.h): the
 * checks of its flags and result struct, and the result it fills, shared by
 * the engines, oi_host_query and the server's lookups. */
#ifndef OI_ENGINE_QUERY_H
#define OI_ENGINE_QUERY_H

#include "host/host.h"
#include "openinfer/engine.h"

/* Checks a query's flags, result struct (struct_size at least its 0.1
 * layout, OI_FLOOR_QUERY_RESULT) and membership array. *present and
 * *wait_ms receive what the caller's result carries (wait_ms: 0 unless
 * OI_QUERY_WAIT_PENDING). */
oi_status oi__query_check(const char *what, const oi_block_hash *hashes, size_t n, uint32_t flags,
                          const oi_query_result *out, uint8_t **present, uint32_t *wait_ms);

/* The caller's where array (oi_query_result.where), when its struct_size
 * covers the field; else NULL. */
uint8_t *oi__query_where(const oi_query_result *out);

/* The host's answer to a query of `a` as the caller's result (as much of
 * it as out->struct_size holds, at least OI_FLOOR_QUERY_RESULT). */
oi_status oi__query_result_out(const oi_host_query_args *a, const oi_host_answer *ans,
                               oi_query_result *out, const char *what);

#endif
