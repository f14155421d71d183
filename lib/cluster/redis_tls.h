/* TLS to Redis for the directory (rediss://), with OpenSSL.
 *
 * The directory speaks to Redis through hiredis's blocking API, and this
 * system's hiredis (0.14) has no TLS of its own. So a TLS connection is a
 * hiredis context on one end of a socket pair (redisConnectFd) and a pump
 * thread on the other: it carries the plain bytes both ways between that
 * end and a TLS session over TCP to Redis. The TCP connect and the TLS
 * handshake (the server's certificate checked against the CA and the host
 * name or IP the node dials; the client's certificate shown when given)
 * run in the caller, within the directory's timeout, so a failure comes
 * back as a reason. The pump ends when either side closes: hiredis sees
 * the end of its stream as a lost connection, as with plain TCP; freeing
 * the context (redisFree) closes its end and so ends the pump. */
#ifndef OI_CLUSTER_REDIS_TLS_H
#define OI_CLUSTER_REDIS_TLS_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdint.h>

#include "openinfer/common.h"

typedef struct oi_redis_tls oi_redis_tls;

/* The TLS settings of one directory: ca_file (PEM; NULL: the system's
 * trusted CAs), cert_file and key_file (PEM; both or neither: the client's
 * certificate, for a Redis with tls-auth-clients). Loads and checks them
 * now. OI_ERR_INVALID_ARGUMENT or OI_ERR_NOT_FOUND naming the file. */
oi_status oi__redis_tls_create(const char *ca_file, const char *cert_file, const char *key_file,
                               oi_redis_tls **out);
/* Waits (at most 2 s) for the pumps it started to end, then frees it. Every
 * context it made must be freed first. Accepts NULL. */
void oi__redis_tls_destroy(oi_redis_tls *t);

/* A hiredis context over TLS to host:port, connected and past the handshake
 * within timeout_ms; NULL with the reason in err, and *refused true when
 * Redis answered but the handshake failed (a certificate refused on either
 * side, no common protocol): the operator's to fix, not an outage. */
redisContext *oi__redis_tls_connect(oi_redis_tls *t, const char *host, int port,
                                    uint32_t timeout_ms, bool *refused, char *err, size_t cap);

/* Pumps running now, in every directory (for the tests). */
unsigned oi__redis_tls_pumps(void);

#endif
