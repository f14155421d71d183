/* The sessions' private declarations, shared by their files: session.c
 * (the session thread, its dispatch, replies, instances and worker
 * threads), session_requests.c (the handlers of Hello, Register, Save,
 * Query, Load, Release, Flush, Unregister) and session_stats.c (Stats).
 * Included by no file outside lib/server. */
#ifndef OI_SERVER_SESSION_INTERNAL_H
#define OI_SERVER_SESSION_INTERNAL_H

#include "server_internal.h"

/* ---- session.c ---- */

/* Encodes and sends one frame (a failure to send ends the session). */
void oi__session_send(srv_session *s, const oiwire_Envelope *env, const oi_wire_out *out);
/* A Result: `st` and `msg`. */
void oi__session_reply(srv_session *s, uint64_t req, oi_status st, const char *msg);
/* Replies with `st` and the calling thread's last error message. */
void oi__session_reply_failure(srv_session *s, uint64_t req, oi_status st);
void oi__session_reply_fmt(srv_session *s, uint64_t req, oi_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The Result of a failed save or load: what, how many blocks, which
 * instance, the status and its cause. */
void oi__session_reply_async_failure(srv_session *s, uint64_t req, oi_status st, const char *what,
                                     size_t n, uint32_t instance);

/* The principal (host/host.h) of a session's leases: its peer's uid, so that
 * a lease is redeemable by every session of the same user in its namespace
 * and by no other user's. */
static inline uint64_t oi__session_principal(const srv_session *s) {
  return (1ull << 32) | (uint64_t)s->peer_uid;
}
/* Drops a reference; the last destroys the engine and frees the arena. */
void oi__session_instance_put(srv_instance *inst);
/* The instance `id` of this session, or NULL after replying with why not. */
srv_instance *oi__session_lookup(srv_session *s, uint64_t req, uint32_t id, const char *what);
void oi__session_unlink_instance(srv_session *s, srv_instance *inst);
/* Queues `job` (filled by the caller; the worker frees it). On failure the
 * caller keeps the job and everything it names. */
oi_status oi__session_worker_enqueue(srv_worker *w, aux_job *job);
oi_status oi__session_aux_enqueue(srv_session *s, aux_kind kind, uint64_t req, srv_instance *inst,
                                  uint32_t timeout_ms);

/* ---- session_requests.c, session_stats.c: the handlers (session.c dispatches) ---- */

void oi__session_hello(srv_session *s, uint64_t req, const oiwire_Hello *h);
void oi__session_register(srv_session *s, uint64_t req, const oiwire_Register *r);
void oi__session_save(srv_session *s, uint64_t req, const oiwire_Save *m);
void oi__session_query(srv_session *s, uint64_t req, const oiwire_Query *m);
void oi__session_load(srv_session *s, uint64_t req, const oiwire_Load *m);
void oi__session_release(srv_session *s, uint64_t req, const oiwire_Release *m);
void oi__session_flush(srv_session *s, uint64_t req, const oiwire_Flush *m);
void oi__session_unregister(srv_session *s, uint64_t req, const oiwire_Unregister *m);
void oi__session_stats(srv_session *s, uint64_t req, const oiwire_Stats *m);

#endif
