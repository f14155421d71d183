/* A stand-in for libucp that only has the names: every function the peer
 * transport resolves (lib/cluster/ucx.h, OI_UCX_FUNCS) but ucs_status_string
 * (libucs's), and, built with OI_STUB_LACKS_WORKER_ARM, not ucp_worker_arm
 * either. Never called: test_ucx_symbols only loads it through
 * oi__ucx_open and compares addresses. Not declared with UCX's types (this
 * file does not include the UCX headers): a symbol is all dlsym sees, and it
 * must be exported (the build hides symbols by default). */
#define STUB(name)                                                                                 \
  __attribute__((visibility("default"))) void name(void);                                          \
  void name(void) {}

STUB(ucp_am_recv_data_nbx)
STUB(ucp_am_send_nbx)
STUB(ucp_cleanup)
STUB(ucp_config_modify)
STUB(ucp_config_read)
STUB(ucp_config_release)
STUB(ucp_ep_close_nbx)
STUB(ucp_ep_create)
STUB(ucp_ep_rkey_unpack)
STUB(ucp_get_nbx)
STUB(ucp_init_version)
STUB(ucp_mem_map)
STUB(ucp_mem_unmap)
STUB(ucp_request_check_status)
STUB(ucp_request_free)
STUB(ucp_rkey_buffer_release)
STUB(ucp_rkey_destroy)
STUB(ucp_rkey_pack)
#ifndef OI_STUB_LACKS_WORKER_ARM
STUB(ucp_worker_arm)
#endif
STUB(ucp_worker_create)
STUB(ucp_worker_destroy)
STUB(ucp_worker_get_address)
STUB(ucp_worker_get_efd)
STUB(ucp_worker_progress)
STUB(ucp_worker_release_address)
STUB(ucp_worker_set_am_recv_handler)
