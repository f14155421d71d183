/* oi_server_fetch_stats: a running server's figures, for tools and
 * dashboards that must not speak the wire protocol themselves. One
 * connection, Hello then Stats (no instance is registered), one reply each. */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/core.h"
#include "openinfer/experimental.h"
#include "openinfer/server.h"
#include "proto/wire.h"

/* One request, one reply (nothing else is in flight on this connection). */
static oi_status round_trip(int fd, oiwire_Envelope *env, uint8_t **buf, size_t *cap,
                            oi_wire_arrays *arrays) {
  uint8_t *frame;
  size_t len;
  oi_status st = oi__wire_encode(env, NULL, &frame, &len);
  if (st != OI_OK) return st;
  st = oi__wire_send(fd, frame, len);
  oi__free(frame);
  if (st != OI_OK) return st;
  if ((st = oi__wire_recv(fd, OI_WIRE_MAX_FRAME, buf, cap, &len)) != OI_OK) return st;
  if ((st = oi__wire_decode(*buf, len, env, arrays)) != OI_OK) return st;
  if (env->which_body == oiwire_Envelope_result_tag && env->body.result.status != OI_OK)
    return oi__fail(env->body.result.status, "%s", env->body.result.message);
  return OI_OK;
}

static void copy_buckets(uint64_t *dst, const uint64_t *src, pb_size_t n) {
  for (pb_size_t i = 0; i < n && i < OI_LATENCY_BUCKETS; i++)
    dst[i] = src[i];
}

static void host_from_wire(oi_host_stats *h, const oiwire_HostStats *w) {
  memset(h, 0, sizeof *h);
  h->struct_size = sizeof *h;
  h->size_classes = w->size_classes;
  h->capacity_bytes = w->capacity_bytes;
  h->used_bytes = w->used_bytes;
  h->free_bytes = w->free_bytes;
  h->block_bytes_resident = w->block_bytes_resident;
  h->blocks_free = w->blocks_free;
  h->blocks_in_flight = w->blocks_in_flight;
  h->blocks_sealed = w->blocks_sealed;
  h->blocks_leased = w->blocks_leased;
  h->blocks_loading = w->blocks_loading;
  h->saves_submitted = w->saves_submitted;
  h->saves_completed = w->saves_completed;
  h->saves_deduplicated = w->saves_deduplicated;
  h->saves_dropped = w->saves_dropped;
  h->saves_failed = w->saves_failed;
  h->bytes_saved = w->bytes_saved;
  h->bytes_loaded = w->bytes_loaded;
  h->loads_completed = w->loads_completed;
  h->loads_failed = w->loads_failed;
  h->query_hit_blocks = w->query_hit_blocks;
  h->query_miss_blocks = w->query_miss_blocks;
  h->leases_active = w->leases_active;
  h->leases_expired = w->leases_expired;
  h->leases_released = w->leases_released;
  h->evictions = w->evictions;
  h->loads_submitted = w->loads_submitted;
  h->blocks_loaded = w->blocks_loaded;
  h->blocks_pinned = w->blocks_pinned;
  h->pool_setup_ns = w->pool_setup_ns;
  h->namespaces = w->namespaces;
  h->latency_buckets = OI_LATENCY_BUCKETS;
  copy_buckets(h->save_latency_us, w->save_latency_us, w->save_latency_us_count);
  h->save_latency_sum_us = w->save_latency_sum_us;
  copy_buckets(h->load_latency_us, w->load_latency_us, w->load_latency_us_count);
  h->load_latency_sum_us = w->load_latency_sum_us;
  h->link_bytes_per_s = w->link_bytes_per_s;
  h->disk_bytes_per_s = w->disk_bytes_per_s;
  h->remote_bytes_per_s = w->remote_bytes_per_s;
  h->link_samples = w->link_samples;
  h->disk_samples = w->disk_samples;
  h->remote_samples = w->remote_samples;
}

static void cluster_from_wire(oi_host_cluster_stats *c, const oiwire_ClusterStats *w) {
  memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->directory_connected = w->directory_connected;
  c->published = w->published;
  c->unpublished = w->unpublished;
  c->lookups = w->lookups;
  c->remote_blocks = w->remote_blocks;
  c->remote_failed = w->remote_failed;
  c->stale_removed = w->stale_removed;
  c->served_blocks = w->served_blocks;
  c->peers_refused = w->peers_refused;
  c->bytes_fetched = w->bytes_fetched;
  c->bytes_served = w->bytes_served;
  c->port = (uint16_t)w->port;
  c->fetches = w->fetches;
  c->fetch_ns = w->fetch_ns;
  c->holders_up = w->holders_up;
  c->holders_down = w->holders_down;
  c->holders_marked_down = w->holders_marked_down;
  c->directory_errors = w->directory_errors;
  c->directory_dropped = w->directory_dropped;
  c->directory_rejected = w->directory_rejected;
  c->handshakes_failed = w->handshakes_failed;
}

/* oi_server_fetch_stats, and with `cluster` (NULL: not wanted) the
 * server's cluster tier: OI_ERR_NOT_FOUND when it has none. */
static oi_status stats_fetch(const char *socket_path, uint32_t timeout_ms, oi_server_stats *out,
                             oi_host_stats *host, oi_host_namespace_stats *namespaces, uint32_t cap,
                             oi_host_cluster_stats *cluster) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_stats_fetch: out is NULL");
  uint32_t stride = 0;
  if (cap) {
    if (!namespaces)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_stats_fetch: namespaces is NULL, cap %u",
                      cap);
    stride = namespaces[0].struct_size;
    if (stride < OI_STRUCT_MIN_SIZE)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "server_stats_fetch: namespaces[0].struct_size %u is too small", stride);
  }
  /* Refuse a bad output struct before any I/O. */
  oi_server_stats so;
  memset(&so, 0, sizeof so);
  so.struct_size = sizeof so;
  oi_status st = oi__struct_out(out, &so, sizeof so, "server_stats_fetch");
  if (st != OI_OK) return st;
  if (host && host->struct_size < OI_FLOOR_HOST_STATS)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "server_stats_fetch: host struct_size %u is too small (its 0.1 layout is %zu "
                    "bytes)",
                    host->struct_size, (size_t)OI_FLOOR_HOST_STATS);

  char def[108];
  if (!socket_path) {
    if ((st = oi__wire_default_socket_path(def, sizeof def)) != OI_OK) return st;
    socket_path = def;
  }
  int fd;
  if ((st = oi__wire_connect(socket_path, &fd)) != OI_OK) return st;
  /* A stuck server must not hang the caller. */
  if (timeout_ms != UINT32_MAX) {
    uint32_t ms = timeout_ms ? timeout_ms : 10000;
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  uint8_t *buf = NULL;
  size_t bufcap = 0;
  oi_wire_arrays arrays;
  memset(&arrays, 0, sizeof arrays);
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = 1;
  env.which_body = oiwire_Envelope_hello_tag;
  env.body.hello.protocol_version = OI_WIRE_PROTOCOL_VERSION;
  env.body.hello.capabilities = OI_WIRE_CAP_PIPELINED;
  snprintf(env.body.hello.client_name, sizeof env.body.hello.client_name,
           "openinfer stats (pid %d)", (int)getpid());
  oiwire_HelloReply hello;
  memset(&hello, 0, sizeof hello);
  st = round_trip(fd, &env, &buf, &bufcap, &arrays);
  if (st == OI_OK && env.which_body != oiwire_Envelope_hello_reply_tag)
    st = oi__fail(OI_ERR_PROTOCOL, "hello: the server answered with message type %u",
                  env.which_body);
  if (st == OI_OK) {
    hello = env.body.hello_reply;
    memset(&env, 0, sizeof env);
    env.request_id = 2;
    env.which_body = oiwire_Envelope_stats_tag;
    st = round_trip(fd, &env, &buf, &bufcap, &arrays);
    if (st == OI_OK && env.which_body != oiwire_Envelope_stats_reply_tag)
      st = oi__fail(OI_ERR_PROTOCOL, "stats: the server answered with message type %u",
                    env.which_body);
  }
  close(fd);
  if (st == OI_OK && !env.body.stats_reply.has_host)
    st = oi__fail(OI_ERR_VERSION, "the server sent no host figures (an older server?)");
  if (st == OI_OK) {
    const oiwire_StatsReply *r = &env.body.stats_reply;
    so.namespaces = (uint32_t)arrays.n_namespaces;
    snprintf(so.server_version, sizeof so.server_version, "%s", hello.server_version);
    so.epoch = hello.server_epoch;
    so.uptime_ns = r->uptime_ns;
    so.sessions = r->sessions;
    so.instances = r->instances;
    so.arena_bytes = r->arena_bytes;
    so.instances_cleaned_up = r->instances_cleaned_up;
    snprintf(so.socket_path, sizeof so.socket_path, "%s", socket_path);
    if (r->has_disk) {
      const oiwire_DiskStats *w = &r->disk;
      so.disk_attached = 1;
      so.disk.struct_size = sizeof so.disk;
      so.disk.latency_buckets = OI_LATENCY_BUCKETS;
      so.disk.blocks = w->blocks;
      so.disk.bytes_used = w->bytes_used;
      so.disk.capacity_bytes = w->capacity_bytes;
      so.disk.spills = w->spills;
      so.disk.spills_failed = w->spills_failed;
      so.disk.spills_skipped = w->spills_skipped;
      so.disk.spill_overflow = w->spill_overflow;
      so.disk.promotions = w->promotions;
      so.disk.promote_failed = w->promote_failed;
      so.disk.checksum_failures = w->checksum_failures;
      so.disk.evictions = w->evictions;
      so.disk.torn_records_cut = w->torn_records_cut;
      so.disk.replay_ns = w->replay_ns;
      copy_buckets(so.disk.read_latency_us, w->read_latency_us, w->read_latency_us_count);
      so.disk.read_latency_sum_us = w->read_latency_sum_us;
      so.disk.lost_queue_full = w->lost_queue_full;
      so.disk.lost_unwritten = w->lost_unwritten;
      so.disk.lost_write_failed = w->lost_write_failed;
      so.disk.lost_no_room = w->lost_no_room;
      so.disk.disk_full = w->disk_full;
      so.disk.full_events = w->full_events;
      so.disk.spills_refused_full = w->spills_refused_full;
    }
    oi__struct_out(out, &so, sizeof so, "server_stats_fetch");
    if (cluster && r->has_cluster) {
      oi_host_cluster_stats cs;
      cluster_from_wire(&cs, &r->cluster);
      oi__struct_out(cluster, &cs, sizeof cs, "server_cluster_stats_fetch");
    }
    if (host) {
      oi_host_stats hs;
      host_from_wire(&hs, &r->host);
      oi__struct_out_min(host, &hs, sizeof hs, OI_FLOOR_HOST_STATS, "server_stats_fetch host");
    }
    for (uint32_t i = 0; i < cap && i < so.namespaces; i++) {
      oi_host_namespace_stats ns;
      memset(&ns, 0, sizeof ns);
      ns.struct_size = sizeof ns;
      ns.index = i;
      snprintf(ns.name, sizeof ns.name, "%s", arrays.namespaces[i].name);
      ns.block_bytes = arrays.namespaces[i].block_bytes;
      ns.blocks_resident = arrays.namespaces[i].blocks_resident;
      const oiwire_NamespaceStats *w = &arrays.namespaces[i];
      snprintf(ns.codec, sizeof ns.codec, "%s", w->codec[0] ? w->codec : "none");
      /* An older server says nothing of them: no codec, all logical. */
      ns.stored_bytes = w->stored_bytes ? w->stored_bytes : w->block_bytes;
      ns.logical_bytes = w->codec[0] ? w->logical_bytes : w->blocks_resident * w->block_bytes;
      ns.physical_bytes = w->codec[0] ? w->physical_bytes : ns.logical_bytes;
      oi_host_namespace_stats *dst =
          (oi_host_namespace_stats *)((uint8_t *)namespaces + (size_t)i * stride);
      dst->struct_size = stride;
      oi__struct_out(dst, &ns, sizeof ns, "server_stats_fetch namespaces");
    }
  }
  if (st == OI_OK && cluster && !env.body.stats_reply.has_cluster)
    st = oi__fail(OI_ERR_NOT_FOUND,
                  "server_cluster_stats_fetch: the server has no cluster tier (or is older)");
  oi__wire_arrays_free(&arrays);
  oi__free(buf);
  return st;
}

OI_API oi_status oi_server_fetch_stats(const char *socket_path, uint32_t timeout_ms,
                                       oi_server_stats *out, oi_host_stats *host,
                                       oi_host_namespace_stats *namespaces, uint32_t cap) {
  return stats_fetch(socket_path, timeout_ms, out, host, namespaces, cap, NULL);
}

OI_API oi_status oi_server_fetch_cluster_stats(const char *socket_path, uint32_t timeout_ms,
                                               oi_host_cluster_stats *out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "server_cluster_stats_fetch: out is NULL");
  oi_host_cluster_stats cs;
  memset(&cs, 0, sizeof cs);
  cs.struct_size = sizeof cs;
  oi_status st = oi__struct_out(out, &cs, sizeof cs, "server_cluster_stats_fetch");
  if (st != OI_OK) return st;
  oi_server_stats so = {.struct_size = sizeof so};
  return stats_fetch(socket_path, timeout_ms, &so, NULL, NULL, 0, out);
}
