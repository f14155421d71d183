/* The cluster tier's block directory (docs/cluster.md, "Directory"): which
 * node holds which block, kept in Redis. Each node publishes the blocks it
 * holds under keys built from the block's identity (namespace fingerprint,
 * block hash, layout fingerprint); a node whose query misses asks the
 * directory for the holders of the rest of a prefix in one round trip.
 *
 * Every value written (block entries, node records) carries a MAC under the
 * cluster secret over its key and fields (docs/cluster.md, "Keys and
 * values"); a reader believes no other value: one that does not parse,
 * fails its MAC or expired is absent and counted (rejected_entries).
 *
 * Internal (names oi__dir_*). This file includes core only; the module links
 * hiredis.
 *
 * Every function may be called from any thread concurrently, except
 * oi__dir_close, which must be the last call. Two Redis connections (on a
 * Redis Cluster, two per master): one for a background thread (publishes,
 * unpublishes, the node's liveness key, reconnection), one under a mutex for
 * the synchronous calls (lookups, node lookups, stale removals). Each Redis
 * round trip is bounded by timeout_ms.
 *
 * Redis Cluster (a redis+cluster:// url): each command goes to the master
 * of its key's slot, pipelined per master with every master's commands
 * written before a reply is read; MOVED, ASK and TRYAGAIN are followed. A
 * master that cannot be reached, or a cluster that is not ok, degrades the
 * whole directory as a single instance down does.
 *
 * Degraded: while Redis cannot be reached, synchronous calls fail at once
 * with OI_ERR_CLOSED (no wait for the timeout) so that a node runs
 * local-only; publishes keep being queued (bounded); the background thread
 * reconnects with a backoff of 100 ms doubling to 2 s. Each successful
 * connect increments the generation (oi__dir_generation): a Redis that
 * restarted empty no longer knows what this node holds, so the caller
 * republishes when the generation changes (or from on_reconnect). */
#ifndef OI_CLUSTER_DIRECTORY_H
#define OI_CLUSTER_DIRECTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "host/tier.h"

#define OI_DIR_NODE_ID_MAX 64u      /* node ids: [A-Za-z0-9._-]{1,64} */
#define OI_DIR_ADDR_MAX 1024u       /* advertised addresses: printable, no spaces */
#define OI_DIR_LOOKUP_MAX 65536u    /* keys in one oi__dir_lookup */
#define OI_DIR_QUEUE_MAX (1u << 20) /* queued publishes and unpublishes */
#define OI_DIR_BLOCK_TTL_MS 600000u /* block_ttl_ms 0 */
#define OI_DIR_NODE_TTL_MS 10000u   /* node_ttl_ms 0 */
#define OI_DIR_TIMEOUT_MS 500u      /* timeout_ms 0 */
#define OI_DIR_ERROR_TEXT 160u
#define OI_DIR_SECRET_MIN 16u /* bytes of the cluster secret (as the peer transport's) */
#define OI_DIR_SECRET_MAX 1024u
#define OI_DIR_MAC_LEN 16u  /* HMAC-SHA256 cut to 128 bits, 32 hex digits in a value */
#define OI_DIR_NAME_MAX 32u /* cluster names: [A-Za-z0-9._-]{1,32} */
#define OI_DIR_PREFIX_MAX (OI_DIR_NAME_MAX + 4u) /* "oi:" or "oi:<name>:" */
#define OI_DIR_CLOCK_SKEW_MS 30000u /* a record is believed this long past its expiry */
#define OI_DIR_USER_MAX 256u        /* Redis AUTH user name */
#define OI_DIR_PASSWORD_MAX 512u    /* Redis AUTH password */

typedef struct oi_dir oi_dir;

/* A block's identity is the tiers' key (host/tier.h). */

/* The node that published an entry, and its incarnation; the entry's
 * expiry (wall clock, ms since 1970) and MAC, which a withdrawal of the
 * entry by a reader (oi__dir_remove_stale, oi__dir_drop) compares. */
typedef struct oi_dir_holder {
  char node_id[OI_DIR_NODE_ID_MAX + 1];
  uint64_t epoch;
  uint64_t expiry_ms;
  uint8_t mac[OI_DIR_MAC_LEN];
} oi_dir_holder;

typedef struct oi_dir_options {
  /* "redis://HOST[:PORT][/DB]" (PORT 6379 when absent, DB 0; an IPv6 HOST in
   * brackets), "unix:/PATH[?db=DB]", or a Redis Cluster:
   * "redis+cluster://HOST[:PORT][,HOST[:PORT]...]" (up to 16 addresses of
   * its nodes, tried in order to read the slot map; database 0); over TLS,
   * "rediss://..." and "rediss+cluster://...". */
  const char *url;
  const char *node_id;   /* [A-Za-z0-9._-]{1,64}, unique in the cluster */
  uint64_t epoch;        /* the node's incarnation (changes at each start) */
  uint32_t block_ttl_ms; /* entries expire unless republished (0: 600000) */
  uint32_t node_ttl_ms;  /* the liveness key's TTL; refreshed every third (0: 10000) */
  uint32_t timeout_ms;   /* each connect and each Redis round trip (0: 500) */
  /* Called from the background thread after each successful connect it
   * makes (not the one inside oi__dir_open), once the generation was
   * incremented: republish then. May call every function but oi__dir_close;
   * must not block for long. NULL: none. */
  void (*on_reconnect)(void *ctx);
  void *on_reconnect_ctx;
  /* The cluster's shared secret (OI_DIR_SECRET_MIN..OI_DIR_SECRET_MAX
   * bytes, required; copied): every value written carries an HMAC-SHA256
   * under it, and values that fail it are not believed (rejected_entries). */
  const void *secret;
  size_t secret_len;
  /* The cluster's name, [A-Za-z0-9._-]{1,32}: keys start "oi:<name>:"
   * (NULL or "": "oi:", as before names existed). Clusters that share a
   * Redis need different names. */
  const char *cluster_name;
  /* Redis AUTH on every connection (a Redis Cluster's too): NULL or ""
   * password: none; NULL or "" user: the default user. Copied. See
   * oi__dir_auth_load. */
  const char *user;
  const char *password;
  /* TLS (a rediss:// or rediss+cluster:// url): the CA that signs Redis's
   * certificate (PEM; NULL: the system's trusted CAs), and this node's
   * certificate and key (PEM, both or neither) for a Redis that asks
   * clients for one (tls-auth-clients). Ignored without TLS. */
  const char *tls_ca_file;
  const char *tls_cert_file;
  const char *tls_key_file;
} oi_dir_options;

typedef struct oi_dir_stats {
  bool connected;                                 /* false: degraded (local only) */
  uint64_t generation;                            /* successful connects so far */
  uint64_t reconnects;                            /* connects after a lost or failed one */
  uint64_t published;                             /* entries Redis acknowledged (SET) */
  uint64_t unpublished;                           /* compare-and-deletes that removed our entry */
  uint64_t unpublish_missed;                      /* ... that found no entry, or another node's */
  uint64_t stale_removed;                         /* oi__dir_remove_stale that removed an entry */
  uint64_t lookups;                               /* oi__dir_lookup round trips that answered */
  uint64_t lookup_keys;                           /* keys asked for by those */
  uint64_t entries_found;                         /* keys in the leading runs returned */
  uint64_t parse_failures;                        /* entries whose value did not parse (absent) */
  uint64_t rejected_entries;                      /* entries and node records not believed: they
                                                     did not parse, failed their MAC or expired */
  uint64_t dropped;                               /* entries withdrawn by oi__dir_drop */
  uint64_t queue_depth;                           /* queued, not yet sent */
  uint64_t queue_dropped;                         /* publishes and unpublishes dropped: queue full,
                                                     or lost with a connection mid-batch */
  uint64_t errors;                                /* failed connects, round trips and replies */
  uint64_t lookup_ns_sum;                         /* time in lookups that answered */
  uint64_t redirects;                             /* MOVED and ASK replies followed (cluster) */
  uint64_t lookup_latency_us[OI_LATENCY_BUCKETS]; /* oi_latency_hist buckets */
  char last_error[OI_DIR_ERROR_TEXT];             /* "" when none */
} oi_dir_stats;

void oi__dir_options_init(oi_dir_options *o);

/* Checks a directory URL, node id and TLS files (tls_* of the options) as
 * oi__dir_open would, without connecting.
 * @return OI_ERR_INVALID_ARGUMENT (or OI_ERR_NOT_FOUND, OI_ERR_PERMISSION
 * for a TLS file) naming what is wrong. */
oi_status oi__dir_check(const oi_dir_options *o);
/* Validates the options (OI_ERR_INVALID_ARGUMENT with what is wrong), then
 * connects with timeout_ms. A Redis that cannot be reached is not an error:
 * the directory opens degraded (logged) and the background thread keeps
 * trying. The url and node_id strings are copied. */
oi_status oi__dir_open(const oi_dir_options *opts, oi_dir **out);
/* Stops the background thread (queued publishes are dropped: entries expire
 * by their TTL), deletes this node's liveness key if it is still ours (one
 * round trip, best effort) and frees. Accepts NULL. */
void oi__dir_close(oi_dir *d);

/* Advertises `addr` (how peers reach this node): the background thread SETs
 * <prefix>node:<node_id> = "<epoch> <addr> <expiry_ms> <mac>" with PX
 * node_ttl_ms at once and every node_ttl_ms / 3. NULL stops the refresh
 * (the key expires). */
oi_status oi__dir_set_advertise(oi_dir *d, const char *addr);
/* The live node `node_id`: its address (NUL-terminated, into addr[cap]) and
 * epoch (may be NULL). @return OI_OK, OI_ERR_NOT_FOUND (no live node),
 * OI_ERR_CLOSED (degraded, or the round trip failed), OI_ERR_PROTOCOL (the
 * value does not parse, fails its MAC or expired: not believed, counted in
 * rejected_entries), OI_ERR_INVALID_ARGUMENT (cap too small too). */
oi_status oi__dir_node_lookup(oi_dir *d, const char *node_id, char *addr, size_t cap,
                              uint64_t *epoch);

/* Queue entries SET <prefix>b:<key> "<node_id> <epoch> <expiry_ms> <mac>"
 * PX block_ttl_ms (publish) or remove them if they still name this node and
 * epoch (unpublish: a compare-and-delete of the value's start). Never wait for
 * Redis: the background thread sends the queue in pipelined batches. A full
 * queue drops what does not fit (counted in queue_dropped; still OI_OK).
 * @return OI_OK, OI_ERR_INVALID_ARGUMENT. */
oi_status oi__dir_publish(oi_dir *d, const oi_tier_key *keys, size_t n);
oi_status oi__dir_unpublish(oi_dir *d, const oi_tier_key *keys, size_t n);
/* Waits until what was queued before this call was sent and answered.
 * @return OI_OK, OI_ERR_CLOSED (degraded), OI_ERR_TIMEOUT. */
oi_status oi__dir_flush(oi_dir *d, uint32_t timeout_ms);

/* One round trip (MGET of the n keys; on a Redis Cluster, a GET per key,
 * pipelined to their masters): out[i] is the holder of keys[i] for
 * the leading run of keys that have an entry; *n_out is that run's length
 * (the prefix rule: the first key without an entry ends it). An entry whose
 * value does not parse, fails its MAC or expired counts as absent (and in
 * rejected_entries). out holds n entries.
 * @return OI_OK (also when *n_out is 0), OI_ERR_CLOSED (degraded, or the round
 * trip failed: *n_out is 0), OI_ERR_INVALID_ARGUMENT (NULL, n 0 or above
 * OI_DIR_LOOKUP_MAX). */
oi_status oi__dir_lookup(oi_dir *d, const oi_tier_key *keys, size_t n, oi_dir_holder *out,
                         size_t *n_out);
/* Removes the entry of `key` if it is still the very record `h` that a
 * lookup returned (same holder, epoch, expiry and MAC: a compare-and-delete;
 * a reader found it stale: the holder did not have the block, or is dead).
 * One round trip.
 * @return OI_OK (removed), OI_ERR_NOT_FOUND (no entry, or another record),
 * OI_ERR_CLOSED, OI_ERR_INVALID_ARGUMENT. */
oi_status oi__dir_remove_stale(oi_dir *d, const oi_tier_key *key, const oi_dir_holder *h);
/* The same for n entries whose holders could not be reached or refused (a
 * reader drops them after the first failure, so that later queries do not
 * try them again): one pipelined round trip; each is removed only if it is
 * still the record h[i] a lookup returned. *removed (may be NULL): how many
 * were (counted in dropped). @return OI_OK, OI_ERR_CLOSED,
 * OI_ERR_INVALID_ARGUMENT. */
oi_status oi__dir_drop(oi_dir *d, const oi_tier_key *keys, const oi_dir_holder *h, size_t n,
                       size_t *removed);

/* Successful connects so far (0 while never connected). */
uint64_t oi__dir_generation(oi_dir *d);
void oi__dir_stats(oi_dir *d, oi_dir_stats *out);

/* The Redis key of a block: "<prefix>b:<ns_fp hex16>:<hash hex32>:<layout_fp
 * hex16>" (lowercase), NUL-terminated; prefix "oi:" (NULL) or "oi:<name>:"
 * (oi__dir_prefix). @return its length (OI_DIR_KEY_CHARS with "oi:"). */
#define OI_DIR_KEY_CHARS 71u
#define OI_DIR_KEY_MAX (OI_DIR_KEY_CHARS - 3u + OI_DIR_PREFIX_MAX)
size_t oi__dir_key_format(const char *prefix, const oi_tier_key *key, char out[OI_DIR_KEY_MAX + 1]);
/* The key prefix of cluster `name` (NULL or "": "oi:") into out.
 * false when the name is not [A-Za-z0-9._-]{1,OI_DIR_NAME_MAX}. */
bool oi__dir_prefix(const char *name, char out[OI_DIR_PREFIX_MAX + 1]);
/* Parses an entry's value "<node_id> <epoch> <expiry_ms> <mac hex32>" (len
 * bytes, no NUL needed; the MAC is not checked here). false when it is not
 * exactly that. */
bool oi__dir_holder_parse(const char *s, size_t len, oi_dir_holder *out);
/* Parses a node's liveness value "<epoch> <address> <expiry_ms> <mac
 * hex32>" (len bytes, no NUL needed; the MAC is not checked here): on true
 * the address is s[*addr_off..*addr_off + *addr_len), 1..OI_DIR_ADDR_MAX
 * printable bytes without spaces. false when it is not exactly that. */
bool oi__dir_liveness_parse(const char *s, size_t len, uint64_t *epoch, size_t *addr_off,
                            size_t *addr_len, uint64_t *expiry_ms, uint8_t mac[OI_DIR_MAC_LEN]);

/* The Redis user and password for oi_dir_options: from `file` when not NULL
 * (a regular file of this user, mode 0600 or stricter, of lines
 * "user=NAME" (optional) and "password=SECRET"; '#' comments), else from
 * the environment (OI_REDIS_PASSWORD, and OI_REDIS_USER), else none (both
 * ""). @return OI_OK, OI_ERR_NOT_FOUND, OI_ERR_PERMISSION,
 * OI_ERR_INVALID_ARGUMENT (with what is wrong). */
oi_status oi__dir_auth_load(const char *file, char user[OI_DIR_USER_MAX + 1],
                            char password[OI_DIR_PASSWORD_MAX + 1]);

/* Redis Cluster's key slots: CRC-16/XMODEM of the key, or of its hash tag
 * (the bytes between the first '{' and the next '}', when not empty), mod
 * OI_DIR_SLOTS. */
#define OI_DIR_SLOTS 16384u
uint16_t oi__dir_crc16(const char *s, size_t len);
uint16_t oi__dir_key_slot(const char *key, size_t len);

#endif
