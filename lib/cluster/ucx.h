/* UCX, loaded at run time (docs/cluster.md, "Loading UCX"). The library is
 * not linked against libucp/libucs: UCX installs memory hooks (mmap, munmap,
 * brk) in whatever process loads it, so loading it with libopeninfer would
 * put them into every program that uses the library, cluster or not (under
 * TSan they crash the program). The peer transport loads it instead, with
 * dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL), when its first net is
 * created, and calls UCX only through the table below. The UCX headers are
 * used at build time for the types and constants alone. */
#ifndef OI_CLUSTER_UCX_H
#define OI_CLUSTER_UCX_H

#include <ucp/api/ucp.h>

#include "core/core.h"

#define OI_UCX_LIBRARY "libucp.so.0"
#define OI_UCS_LIBRARY "libucs.so.0"

/* The UCX functions the peer transport calls, each with the type of its
 * declaration in the headers. ucp_init is an inline in ucp.h: callers use
 * ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, ...). */
#define OI_UCX_FUNCS(X)                                                                            \
  X(ucp_am_recv_data_nbx)                                                                          \
  X(ucp_am_send_nbx)                                                                               \
  X(ucp_cleanup)                                                                                   \
  X(ucp_config_modify)                                                                             \
  X(ucp_config_read)                                                                               \
  X(ucp_config_release)                                                                            \
  X(ucp_ep_close_nbx)                                                                              \
  X(ucp_ep_create)                                                                                 \
  X(ucp_ep_rkey_unpack)                                                                            \
  X(ucp_get_nbx)                                                                                   \
  X(ucp_init_version)                                                                              \
  X(ucp_mem_map)                                                                                   \
  X(ucp_mem_unmap)                                                                                 \
  X(ucp_request_check_status)                                                                      \
  X(ucp_request_free)                                                                              \
  X(ucp_rkey_buffer_release)                                                                       \
  X(ucp_rkey_destroy)                                                                              \
  X(ucp_rkey_pack)                                                                                 \
  X(ucp_worker_arm)                                                                                \
  X(ucp_worker_create)                                                                             \
  X(ucp_worker_destroy)                                                                            \
  X(ucp_worker_get_address)                                                                        \
  X(ucp_worker_get_efd)                                                                            \
  X(ucp_worker_progress)                                                                           \
  X(ucp_worker_release_address)                                                                    \
  X(ucp_worker_set_am_recv_handler)                                                                \
  X(ucs_status_string)

typedef struct oi_ucx_api {
#define OI_UCX_MEMBER(name) __typeof__(name) *name;
  OI_UCX_FUNCS(OI_UCX_MEMBER)
#undef OI_UCX_MEMBER
} oi_ucx_api;

/* The table, filled by the first successful oi__ucx_load and never changed
 * afterwards: read it only after oi__ucx_load returned OI_OK (in this thread,
 * or in one that thread started or handed work to). A test may put stand-ins
 * into it after loading and before its first net is created (no thread reads
 * it then): tests/cluster/test_peer_ucx_fail.c makes UCX calls fail that way. */
extern oi_ucx_api oi__ucx;

/* Loads UCX once per process (later calls return the first outcome; a
 * failure is retried). UCX stays loaded until the process exits.
 * @return OI_ERR_UNSUPPORTED, with an oi_last_error() message naming the
 *         library and dlerror(), when libucp cannot be loaded or lacks a
 *         function. */
oi_status oi__ucx_load(void);

/* Opens `ucp_soname` (and `ucs_soname` where libucp's dependencies do not
 * provide ucs_status_string) and fills *api, without caching anything: the
 * worker behind oi__ucx_load, and the tests' way to see a failure.
 * @return as oi__ucx_load. */
oi_status oi__ucx_open(const char *ucp_soname, const char *ucs_soname, oi_ucx_api *api);

#endif
