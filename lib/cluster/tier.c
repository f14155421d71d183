/* The cluster tier under a host (tier.h): publishing sealed blocks in the
 * directory, fetching blocks other nodes hold, and answering their fetches.
 *
 * Threads: the tier's sealed and evicted ops only queue notes;
 * one worker thread turns notes into directory publishes and withdrawals,
 * republishes, and ends the leases peers did not release in time;
 * FETCHERS threads run fetch jobs (connect, LEASE, read, verify, RELEASE
 * sent without waiting for its answer, seal), about FETCH_JOB_BYTES each,
 * sharing the connections to holders.
 * SERVERS threads answer peers' LEASEs (pins, and a checksum of every block
 * leased), so that the peer transport's progress thread, which moves every
 * byte this node serves, never waits for them; RELEASEs are answered on the
 * progress thread (a lock and a list).
 *
 * Keys: a block is known across nodes by its namespace's name (hashed), its
 * hash and its layout fingerprint, as on disk: namespace ids are this
 * process's own.
 *
 * Files (tier_internal.h): this one attaches, destroys and reports the
 * tier, and queues and publishes the notes; tier_msg.c checks the
 * messages, tier_serve.c answers peers, tier_fetch.c fetches. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/tier_internal.h"
#include "openinfer/experimental.h"

static const oi_tier_ops cluster_tier_ops;

cluster_tier *oi__cluster_tier_of(oi_host *h) { return oi__host_tier_find(h, &cluster_tier_ops); }

/* ---- notes: seals and evictions ---- */

static void note_add(cluster_tier *t, uint32_t ns, const oi_block_hash *hash, bool sealed) {
  pthread_mutex_lock(&t->lock);
  if (t->count == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 4096;
    note *r = cap <= NOTE_RING_MAX ? oi__malloc(cap * sizeof *r) : NULL;
    if (!r) {
      pthread_mutex_unlock(&t->lock);
      atomic_fetch_add(&t->notes_dropped, 1); /* the entry expires by its TTL */
      return;
    }
    for (size_t i = 0; i < t->count; i++)
      r[i] = t->ring[(t->head + i) % t->cap];
    oi__free(t->ring);
    t->ring = r;
    t->cap = cap;
    t->head = 0;
  }
  t->ring[(t->head + t->count++) % t->cap] = (note){.ns = ns, .sealed = sealed, .hash = *hash};
  if (t->count == 1) pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->lock);
}

static void on_sealed(void *ctx, uint32_t ns, const oi_block_hash *hash) {
  note_add(ctx, ns, hash, true);
}
static void on_evicted(void *ctx, uint32_t ns, const oi_block_hash *hash) {
  note_add(ctx, ns, hash, false);
}

/* The directory connected again (Redis may have restarted empty, and
 * batches in flight when it was lost are gone): the worker publishes every
 * block this node holds. */
static void on_reconnect(void *ctx) {
  cluster_tier *t = ctx;
  atomic_store(&t->republish, true);
  pthread_mutex_lock(&t->lock);
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->lock);
}

/* Publishes and withdraws a batch of notes (the worker). */
/* Runs of notes of one kind go to the directory in one call; a namespace's
 * fingerprints are looked up once per run of its notes. */
static void send_keys(cluster_tier *t, bool sealed, const oi_tier_key *keys, size_t n) {
  if (n == 0) return;
  oi_status st = sealed ? oi__dir_publish(t->dir, keys, n) : oi__dir_unpublish(t->dir, keys, n);
  if (st != OI_OK)
    atomic_fetch_add(&t->publish_failures, n); /* the entries expire by their TTL */
  else
    atomic_fetch_add(sealed ? &t->published : &t->unpublished, n);
}

static void apply_notes(cluster_tier *t, const note *notes, size_t n) {
  oi_tier_key keys[256];
  size_t nk = 0;
  bool kind = false;
  uint32_t ns = 0; /* ns ids start at 1 */
  uint64_t ns_fp = 0, layout_fp = 0;
  bool known = false;
  for (size_t i = 0; i < n; i++) {
    if (notes[i].ns != ns) {
      ns = notes[i].ns;
      known = oi__host_namespace_fps(t->host, ns, &ns_fp, &layout_fp, NULL);
    }
    if (!known) continue;
    if (nk && (notes[i].sealed != kind || nk == OI_ARRAY_LEN(keys))) {
      send_keys(t, kind, keys, nk);
      nk = 0;
    }
    kind = notes[i].sealed;
    keys[nk].ns_fp = ns_fp;
    memcpy(keys[nk].hash, notes[i].hash.bytes, sizeof keys[nk].hash);
    keys[nk].layout_fp = layout_fp;
    nk++;
  }
  send_keys(t, kind, keys, nk);
}

/* ---- the worker ---- */

static void *worker_main(void *arg) {
  cluster_tier *t = arg;
  note batch[256];
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (!t->stop && t->count == 0 && !atomic_load(&t->republish)) {
      struct timespec ts = oi__timespec(oi__deadline_ns(100));
      pthread_cond_timedwait(&t->cv, &t->lock, &ts);
      if (t->count == 0) break; /* time to look at the leases */
    }
    size_t k = OI_MIN(t->count, OI_ARRAY_LEN(batch));
    for (size_t i = 0; i < k; i++)
      batch[i] = t->ring[(t->head + i) % t->cap];
    if (k) {
      t->head = (t->head + k) % t->cap;
      t->count -= k;
    }
    bool stop = t->stop;
    pthread_mutex_unlock(&t->lock);
    bool refresh = oi__now_ns() >= t->next_refresh_ns;
    if (!stop && (atomic_exchange(&t->republish, false) || refresh)) {
      /* Entries expire unless refreshed, and one entry names one holder:
       * when the node it names evicts the block, the entry goes although
       * an earlier holder may still have it. Republishing all we hold
       * every half TTL keeps the directory true within that time. */
      size_t n = oi__host_foreach_sealed(t->host, on_sealed, t);
      t->next_refresh_ns = oi__now_ns() + t->refresh_ns;
      OI_LOG(refresh ? OI_LOG_DEBUG : OI_LOG_INFO, "cluster", "publishing the %zu blocks held%s", n,
             refresh ? " (refresh)" : " (the directory reconnected)");
    }
    if (k) apply_notes(t, batch, k);
    oi__cluster_expire_leases(t, false);
    if (stop && !k) return NULL;
  }
}

/* ---- attach, destroy, stats ---- */

static void tier_free(cluster_tier *t) {
  if (!t) return;
  /* Fetches in progress end within timeout_ms; queued ones are dropped. */
  pthread_mutex_lock(&t->lock);
  t->stop = true;
  pthread_cond_broadcast(&t->cv);
  pthread_cond_broadcast(&t->jcv);
  pthread_cond_broadcast(&t->pcv);
  pthread_mutex_unlock(&t->lock);
  for (int i = 0; i < t->nfetchers; i++)
    pthread_join(t->fetchers[i], NULL);
  if (t->prober_started) pthread_join(t->prober, NULL);
  if (t->worker_started) pthread_join(t->worker, NULL);
  /* Every deferred LEASE is answered (refused) before the net goes; LEASEs
   * that come meanwhile are answered on the progress thread. */
  pthread_mutex_lock(&t->slock);
  t->sstop = true;
  pthread_cond_broadcast(&t->scv);
  pthread_mutex_unlock(&t->slock);
  for (int i = 0; i < t->nservers; i++)
    pthread_join(t->servers[i], NULL);
  oi__peer_net_destroy(t->net); /* frees our peers; no request is answered after this */
  for (int i = 0; i < MAX_PEERS; i++)
    t->peers[i].peer = NULL;
  oi__cluster_expire_leases(t, true);
  oi__dir_close(t->dir);
  oi__free(t->ring);
  pthread_mutex_destroy(&t->lock);
  pthread_cond_destroy(&t->cv);
  pthread_cond_destroy(&t->jcv);
  pthread_mutex_destroy(&t->peer_lock);
  pthread_mutex_destroy(&t->busy_lock);
  pthread_cond_destroy(&t->pcv);
  pthread_mutex_destroy(&t->lease_lock);
  pthread_mutex_destroy(&t->slock);
  pthread_cond_destroy(&t->scv);
  oi__free(t);
}

static void tier_destroy(void *self) { tier_free(self); }

/* Reads the cluster's secret: a regular file of this user, private. */
static oi_status read_secret(const char *who, const char *path, uint8_t *buf, size_t cap,
                             size_t *len) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return oi__fail(errno == ENOENT ? OI_ERR_NOT_FOUND : OI_ERR_PERMISSION,
                    "%s: cannot open the secret file %s: %s", who, path, strerror(errno));
  struct stat st;
  oi_status s = OI_OK;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    s = oi__fail(OI_ERR_PERMISSION, "%s: %s is not a regular file", who, path);
  else if (st.st_uid != geteuid() || (st.st_mode & 077))
    s = oi__fail(OI_ERR_PERMISSION,
                 "%s: the secret file %s must belong to this user and be "
                 "readable by no one else (chmod 600 %s)",
                 who, path, path);
  ssize_t n = s == OI_OK ? read(fd, buf, cap) : 0;
  close(fd);
  if (s != OI_OK) return s;
  if (n < 0) return oi__fail(OI_ERR_IO, "%s: reading %s: %s", who, path, strerror(errno));
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    n--;
  if (n < (ssize_t)OI_PEER_MIN_SECRET || (size_t)n >= cap)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "%s: the secret in %s has %zd bytes (%u to %u)", who,
                    path, n, OI_PEER_MIN_SECRET, OI_PEER_MAX_SECRET);
  *len = (size_t)n;
  return OI_OK;
}

static bool is_loopback(const struct sockaddr_in *sin) {
  return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
}

/* Every option of a cluster attach, checked before anything is set up (a
 * sidecar server checks them before it pins its pool, through
 * oi_host_cluster_options_check): the required ones given, the node id, the
 * directory URL, the listen and advertise addresses, and the secret file,
 * read into secret (zeroed on failure). A node never advertises a loopback
 * address unless it listens on one: other hosts could not reach it. */
static oi_status check_options(const oi_host_cluster_options *o, const char *who, uint8_t *secret,
                               size_t cap, size_t *secret_len) {
  if (!o->redis_url || !o->node_id || !o->listen_addr || !o->secret_file)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: redis_url, node_id, listen_addr and secret_file are required (%s is "
                    "missing)",
                    who,
                    !o->redis_url     ? "redis_url"
                    : !o->node_id     ? "node_id"
                    : !o->listen_addr ? "listen_addr: the IP:PORT other nodes reach this one at"
                                      : "secret_file");
  char why[256]; /* oi_last_error() copied: oi__fail writes where it reads */
  oi_dir_options dopt;
  oi__dir_options_init(&dopt);
  dopt.url = o->redis_url;
  dopt.node_id = o->node_id;
  dopt.tls_ca_file = o->redis_tls_ca_file;
  dopt.tls_cert_file = o->redis_tls_cert_file;
  dopt.tls_key_file = o->redis_tls_key_file;
  oi_status st = oi__dir_check(&dopt);
  if (st != OI_OK) {
    snprintf(why, sizeof why, "%s", oi_last_error());
    return oi__fail(st, "%s: %s", who, why);
  }
  struct sockaddr_in lsin, asin;
  if ((st = oi__peer_parse_addr(o->listen_addr, &lsin)) != OI_OK) {
    snprintf(why, sizeof why, "%s", oi_last_error());
    return oi__fail(st, "%s: listen_addr: %s", who, why);
  }
  if (o->advertise_addr) {
    if ((st = oi__peer_parse_addr(o->advertise_addr, &asin)) != OI_OK) {
      snprintf(why, sizeof why, "%s", oi_last_error());
      return oi__fail(st, "%s: advertise_addr: %s", who, why);
    }
    if (asin.sin_port == 0 || asin.sin_addr.s_addr == htonl(INADDR_ANY))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "%s: advertise_addr %s is not an address peers can dial (an IP other "
                      "than 0.0.0.0 and a port other than 0)",
                      who, o->advertise_addr);
  } else if (lsin.sin_addr.s_addr == htonl(INADDR_ANY)) {
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: listening on 0.0.0.0 needs an advertise_addr (the IP:PORT peers dial)",
                    who);
  } else {
    asin = lsin;
  }
  if (is_loopback(&asin) && !is_loopback(&lsin))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: the advertised address %s is a loopback address but the node listens "
                    "on %s: no other host could reach it (advertise the IP:PORT other nodes dial)",
                    who, o->advertise_addr, o->listen_addr);
  char prefix[OI_DIR_PREFIX_MAX + 1];
  if (!oi__dir_prefix(o->cluster_name, prefix))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "%s: cluster_name '%.40s' is not 1 to %u characters of A-Z a-z 0-9 . _ -", who,
                    o->cluster_name, OI_DIR_NAME_MAX);
  if (o->redis_auth_file) { /* its owner, mode and lines; the password is not kept */
    char user[OI_DIR_USER_MAX + 1], password[OI_DIR_PASSWORD_MAX + 1];
    st = oi__dir_auth_load(o->redis_auth_file, user, password);
    memset(password, 0, sizeof password);
    if (st != OI_OK) return st;
  }
  return read_secret(who, o->secret_file, secret, cap, secret_len);
}

OI_API oi_status oi_host_cluster_options_check(const oi_host_cluster_options *o) {
  oi_host_cluster_options opts;
  oi_host_cluster_options_init(&opts);
  oi_status st = oi__struct_in(&opts, sizeof opts, o, "host_cluster_options_check");
  if (st != OI_OK) return st;
  uint8_t secret[OI_PEER_MAX_SECRET + 1];
  size_t secret_len = 0;
  st = check_options(&opts, "host_cluster_options_check", secret, sizeof secret, &secret_len);
  memset(secret, 0, sizeof secret);
  return st;
}

OI_API oi_status oi_host_cluster_options_init(oi_host_cluster_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_cluster_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  return OI_OK;
}

OI_API oi_status oi_host_attach_cluster(oi_host *h, const oi_host_cluster_options *o) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_attach_cluster: host is NULL");
  oi_host_cluster_options opts;
  oi_host_cluster_options_init(&opts);
  oi_status st = oi__struct_in(&opts, sizeof opts, o, "host_attach_cluster");
  if (st != OI_OK) return st;
  uint8_t secret[OI_PEER_MAX_SECRET + 1];
  size_t secret_len = 0;
  if ((st = check_options(&opts, "host_attach_cluster", secret, sizeof secret, &secret_len)) !=
      OI_OK)
    return st;
  oi_host_pool_info pool;
  oi__host_pool_info(h, &pool);
  if (oi__cluster_tier_of(h) || !pool.base) {
    memset(secret, 0, sizeof secret);
    return oi__cluster_tier_of(h)
               ? oi__fail(OI_ERR_STATE, "host_attach_cluster: a cluster tier is attached already")
               : oi__fail(OI_ERR_STATE, "host_attach_cluster: the host's pool is not ready");
  }
  char redis_user[OI_DIR_USER_MAX + 1], redis_password[OI_DIR_PASSWORD_MAX + 1];
  if ((st = oi__dir_auth_load(opts.redis_auth_file, redis_user, redis_password)) != OI_OK) {
    memset(secret, 0, sizeof secret);
    return st;
  }

  cluster_tier *t = oi__calloc(1, sizeof *t);
  if (!t) return oi__fail(OI_ERR_OUT_OF_MEMORY, "host_attach_cluster: out of memory");
  t->host = h;
  t->timeout_ms = opts.timeout_ms ? opts.timeout_ms : 2000;
  t->pool_base = pool.base;
  t->pool_bytes = pool.bytes;
  snprintf(t->node_id, sizeof t->node_id, "%s", opts.node_id);
  pthread_mutex_init(&t->lock, NULL);
  pthread_mutex_init(&t->lease_lock, NULL);
  pthread_mutex_init(&t->peer_lock, NULL);
  pthread_mutex_init(&t->busy_lock, NULL);
  oi__cond_init_monotonic(&t->pcv);
  pthread_mutex_init(&t->slock, NULL);
  pthread_cond_init(&t->scv, NULL);
  pthread_cond_init(&t->jcv, NULL);
  oi__cond_init_monotonic(&t->cv);

  oi_dir_options dopt;
  oi__dir_options_init(&dopt);
  dopt.url = opts.redis_url;
  dopt.node_id = opts.node_id;
  dopt.secret = secret;
  dopt.secret_len = secret_len;
  dopt.cluster_name = opts.cluster_name;
  dopt.user = redis_user;
  dopt.password = redis_password;
  dopt.tls_ca_file = opts.redis_tls_ca_file;
  dopt.tls_cert_file = opts.redis_tls_cert_file;
  dopt.tls_key_file = opts.redis_tls_key_file;
  dopt.epoch = oi__now_ns() ^ ((uint64_t)getpid() << 40);
  dopt.on_reconnect = on_reconnect;
  dopt.on_reconnect_ctx = t;
  t->refresh_ns = (uint64_t)(dopt.block_ttl_ms ? dopt.block_ttl_ms : 600000) * 1000000ull / 2;
  t->next_refresh_ns = oi__now_ns() + t->refresh_ns;
  st = oi__dir_open(&dopt, &t->dir);
  memset(redis_password, 0, sizeof redis_password);
  if (st != OI_OK) goto fail;
  int rc;
  for (int i = 0; i < SERVERS; i++) { /* before the net: it may be asked at once */
    if ((rc = pthread_create(&t->servers[i], NULL, oi__cluster_server_main, t)) != 0) {
      st = oi__fail(OI_ERR_INTERNAL, "host_attach_cluster: cannot start its threads: %s",
                    strerror(rc));
      goto fail;
    }
    t->nservers++;
  }

  oi_peer_net_options popt = {.listen_addr = opts.listen_addr,
                              .node_id = opts.node_id,
                              .secret = secret,
                              .secret_len = secret_len,
                              .timeout_ms = t->timeout_ms,
                              .on_request = oi__cluster_on_request,
                              .on_request_ctx = t};
  st = oi__peer_net_create(&popt, &t->net);
  memset(secret, 0, sizeof secret);
  if (st != OI_OK) goto fail;
  if ((st = oi__peer_net_register(t->net, pool.base, pool.bytes)) != OI_OK) goto fail;
  char adv[128];
  if (opts.advertise_addr) {
    snprintf(adv, sizeof adv, "%s", opts.advertise_addr);
  } else { /* check_options: not 0.0.0.0 */
    const char *colon = strrchr(opts.listen_addr, ':');
    int iplen = (int)(colon - opts.listen_addr);
    snprintf(adv, sizeof adv, "%.*s:%u", iplen, opts.listen_addr, oi__peer_net_port(t->net));
  }
  if ((st = oi__dir_set_advertise(t->dir, adv)) != OI_OK) goto fail;
  rc = pthread_create(&t->worker, NULL, worker_main, t);
  if (rc != 0) {
    st =
        oi__fail(OI_ERR_INTERNAL, "host_attach_cluster: cannot start its thread: %s", strerror(rc));
    goto fail;
  }
  t->worker_started = true;
  for (int i = 0; i < FETCHERS; i++) {
    if ((rc = pthread_create(&t->fetchers[i], NULL, oi__cluster_fetcher_main, t)) != 0) {
      st = oi__fail(OI_ERR_INTERNAL, "host_attach_cluster: cannot start its threads: %s",
                    strerror(rc));
      goto fail;
    }
    t->nfetchers++;
  }
  if ((rc = pthread_create(&t->prober, NULL, oi__cluster_prober_main, t)) != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "host_attach_cluster: cannot start its threads: %s",
                  strerror(rc));
    goto fail;
  }
  t->prober_started = true;
  atomic_store(&t->republish, true); /* blocks sealed before the attach */
  if ((st = oi__host_tier_attach(h, &cluster_tier_ops, t, &t->link)) != OI_OK) goto fail;
  OI_LOG(OI_LOG_INFO, "cluster", "node '%s' joined the cluster at %s; peers dial %s", opts.node_id,
         opts.redis_url, adv);
  return OI_OK;
fail:
  memset(secret, 0, sizeof secret);
  memset(redis_password, 0, sizeof redis_password);
  tier_free(t);
  return st;
}

/* The tier's stats: *out is an oi_host_cluster_stats. */
static oi_status tier_stats(void *self, void *out) {
  cluster_tier *t = self;
  oi_dir_stats ds;
  oi__dir_stats(t->dir, &ds);
  oi_peer_stats ps;
  oi__peer_net_stats(t->net, &ps);
  oi_host_cluster_stats *s = out;
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->directory_connected = ds.connected;
  s->published = atomic_load(&t->published);
  s->unpublished = atomic_load(&t->unpublished);
  s->lookups = atomic_load(&t->lookups);
  s->remote_blocks = atomic_load(&t->remote_blocks);
  s->remote_failed = atomic_load(&t->remote_failed);
  s->stale_removed = atomic_load(&t->stale_removed);
  s->served_blocks = atomic_load(&t->served_blocks);
  s->peers_refused = ps.refused;
  s->bytes_fetched = atomic_load(&t->bytes_fetched);
  s->bytes_served = atomic_load(&t->bytes_served);
  s->port = oi__peer_net_port(t->net);
  s->fetches = atomic_load(&t->fetches);
  s->fetch_ns = atomic_load(&t->fetch_ns);
  uint64_t up = 0, down = 0;
  oi__cluster_holder_counts(t, &up, &down);
  s->holders_up = (uint32_t)up;
  s->holders_down = (uint32_t)down;
  s->holders_marked_down = atomic_load(&t->holders_marked_down);
  s->directory_errors = ds.errors;
  s->directory_dropped = ds.queue_dropped + atomic_load(&t->publish_failures);
  s->directory_rejected = ds.rejected_entries; /* malformed ones included */
  s->handshakes_failed = ps.connect_fails;
  return OI_OK;
}

/* Past the pool and the disk; it publishes what the pool seals and
 * withdraws what it evicts. */
static const oi_tier_ops cluster_tier_ops = {.name = "cluster",
                                             .rank = 20,
                                             .where = OI_WHERE_REMOTE,
                                             .lookup = oi__cluster_tier_lookup,
                                             .promote = oi__cluster_tier_promote,
                                             .sealed = on_sealed,
                                             .evicted = on_evicted,
                                             .stats = tier_stats,
                                             .destroy = tier_destroy};

OI_API oi_status oi_host_get_cluster_stats(const oi_host *h, oi_host_cluster_stats *out) {
  if (!h || !out)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_cluster_stats: %s is NULL", h ? "out" : "host");
  oi_host_cluster_stats s;
  oi_status st = oi__host_tier_stats(h, &cluster_tier_ops, &s, "host_cluster_stats");
  if (st != OI_OK) return st;
  return oi__struct_out(out, &s, sizeof s, "host_cluster_stats");
}
