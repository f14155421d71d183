/* A session's Stats request (session_internal.h): an instance's engine
 * statistics, the server's, the host pool's and its namespaces', and the
 * disk and cluster tiers'. */
#include <stdio.h>
#include <string.h>

#include "session_internal.h"

void oi__wire_host_stats(const oi_host_stats *hs, oiwire_HostStats *w) {
  w->size_classes = hs->size_classes;
  w->capacity_bytes = hs->capacity_bytes;
  w->used_bytes = hs->used_bytes;
  w->free_bytes = hs->free_bytes;
  w->block_bytes_resident = hs->block_bytes_resident;
  w->blocks_free = hs->blocks_free;
  w->blocks_in_flight = hs->blocks_in_flight;
  w->blocks_sealed = hs->blocks_sealed;
  w->blocks_leased = hs->blocks_leased;
  w->blocks_loading = hs->blocks_loading;
  w->saves_submitted = hs->saves_submitted;
  w->saves_completed = hs->saves_completed;
  w->saves_deduplicated = hs->saves_deduplicated;
  w->saves_dropped = hs->saves_dropped;
  w->saves_failed = hs->saves_failed;
  w->bytes_saved = hs->bytes_saved;
  w->bytes_loaded = hs->bytes_loaded;
  w->loads_completed = hs->loads_completed;
  w->loads_failed = hs->loads_failed;
  w->query_hit_blocks = hs->query_hit_blocks;
  w->query_miss_blocks = hs->query_miss_blocks;
  w->leases_active = hs->leases_active;
  w->leases_expired = hs->leases_expired;
  w->leases_released = hs->leases_released;
  w->evictions = hs->evictions;
  w->loads_submitted = hs->loads_submitted;
  w->blocks_loaded = hs->blocks_loaded;
  w->blocks_pinned = hs->blocks_pinned;
  w->pool_setup_ns = hs->pool_setup_ns;
  w->namespaces = hs->namespaces;
  w->save_latency_us_count = OI_LATENCY_BUCKETS;
  memcpy(w->save_latency_us, hs->save_latency_us, sizeof w->save_latency_us);
  w->save_latency_sum_us = hs->save_latency_sum_us;
  w->load_latency_us_count = OI_LATENCY_BUCKETS;
  memcpy(w->load_latency_us, hs->load_latency_us, sizeof w->load_latency_us);
  w->load_latency_sum_us = hs->load_latency_sum_us;
  w->link_bytes_per_s = hs->link_bytes_per_s;
  w->disk_bytes_per_s = hs->disk_bytes_per_s;
  w->remote_bytes_per_s = hs->remote_bytes_per_s;
  w->link_samples = hs->link_samples;
  w->disk_samples = hs->disk_samples;
  w->remote_samples = hs->remote_samples;
}

void oi__wire_cluster_stats(const oi_host_cluster_stats *cs, oiwire_ClusterStats *w) {
  w->directory_connected = cs->directory_connected != 0;
  w->published = cs->published;
  w->unpublished = cs->unpublished;
  w->lookups = cs->lookups;
  w->remote_blocks = cs->remote_blocks;
  w->remote_failed = cs->remote_failed;
  w->stale_removed = cs->stale_removed;
  w->served_blocks = cs->served_blocks;
  w->peers_refused = cs->peers_refused;
  w->bytes_fetched = cs->bytes_fetched;
  w->bytes_served = cs->bytes_served;
  w->port = cs->port;
  w->fetches = cs->fetches;
  w->fetch_ns = cs->fetch_ns;
  w->holders_up = cs->holders_up;
  w->holders_down = cs->holders_down;
  w->holders_marked_down = cs->holders_marked_down;
  w->directory_errors = cs->directory_errors;
  w->directory_dropped = cs->directory_dropped;
  w->directory_rejected = cs->directory_rejected;
  w->handshakes_failed = cs->handshakes_failed;
}

void oi__session_stats(srv_session *s, uint64_t req, const oiwire_Stats *m) {
  oi_server *srv = s->server;
  oiwire_Envelope env;
  memset(&env, 0, sizeof env);
  env.request_id = req;
  env.which_body = oiwire_Envelope_stats_reply_tag;
  oiwire_StatsReply *r = &env.body.stats_reply;
  if (m->instance_id) {
    srv_instance *inst = oi__session_lookup(s, req, m->instance_id, "stats");
    if (!inst) return;
    oi_engine_stats es;
    memset(&es, 0, sizeof es);
    es.struct_size = sizeof es;
    oi_status st = oi_engine_get_stats(inst->engine, &es);
    if (st != OI_OK) return oi__session_reply_failure(s, req, st);
    r->instance_id = es.instance_id;
    r->block_bytes = es.block_bytes;
    r->num_blocks = es.num_blocks;
    r->saves_submitted = es.saves_submitted;
    r->saves_completed = es.saves_completed;
    r->saves_deduplicated = es.saves_deduplicated;
    r->saves_dropped = es.saves_dropped;
    r->saves_failed = es.saves_failed;
    r->saves_not_encoded = es.saves_not_encoded;
    r->loads_completed = es.loads_completed;
    r->loads_failed = es.loads_failed;
    r->blocks_loaded = es.blocks_loaded;
    r->bytes_saved = es.bytes_saved;
    r->bytes_loaded = es.bytes_loaded;
    r->query_hit_blocks = es.query_hit_blocks;
    r->query_miss_blocks = es.query_miss_blocks;
    r->saves_pending = es.saves_pending;
    r->loads_submitted = es.loads_submitted;
    r->namespace_blocks_resident = es.namespace_blocks_resident;
    r->save_latency_us_count = OI_LATENCY_BUCKETS;
    memcpy(r->save_latency_us, es.save_latency_us, sizeof r->save_latency_us);
    r->save_latency_sum_us = es.save_latency_sum_us;
    r->load_latency_us_count = OI_LATENCY_BUCKETS;
    memcpy(r->load_latency_us, es.load_latency_us, sizeof r->load_latency_us);
    r->load_latency_sum_us = es.load_latency_sum_us;
  }
  pthread_mutex_lock(&srv->lock);
  r->sessions = srv->num_sessions;
  pthread_mutex_unlock(&srv->lock);
  r->instances = atomic_load(&srv->instances);
  r->arena_bytes = atomic_load(&srv->arena_bytes);
  r->instances_cleaned_up = atomic_load(&srv->instances_cleaned_up);
  r->server_epoch = srv->epoch;
  r->uptime_ns = oi__now_ns() - srv->start_ns;
  oi_host_stats hs;
  memset(&hs, 0, sizeof hs);
  hs.struct_size = sizeof hs;
  oiwire_NamespaceStats *nss = NULL;
  oi_wire_out out = {0};
  oi_host_disk_stats ds;
  memset(&ds, 0, sizeof ds);
  ds.struct_size = sizeof ds;
  if (oi_host_get_disk_stats(srv->host, &ds) == OI_OK) {
    oiwire_DiskStats *w = &r->disk;
    r->has_disk = true;
    w->blocks = ds.blocks;
    w->bytes_used = ds.bytes_used;
    w->capacity_bytes = ds.capacity_bytes;
    w->spills = ds.spills;
    w->spills_failed = ds.spills_failed;
    w->spills_skipped = ds.spills_skipped;
    w->spill_overflow = ds.spill_overflow;
    w->promotions = ds.promotions;
    w->promote_failed = ds.promote_failed;
    w->checksum_failures = ds.checksum_failures;
    w->evictions = ds.evictions;
    w->torn_records_cut = ds.torn_records_cut;
    w->replay_ns = ds.replay_ns;
    w->read_latency_us_count = OI_LATENCY_BUCKETS;
    memcpy(w->read_latency_us, ds.read_latency_us, sizeof w->read_latency_us);
    w->read_latency_sum_us = ds.read_latency_sum_us;
    w->lost_queue_full = ds.lost_queue_full;
    w->lost_unwritten = ds.lost_unwritten;
    w->lost_write_failed = ds.lost_write_failed;
    w->lost_no_room = ds.lost_no_room;
    w->disk_full = ds.disk_full;
    w->full_events = ds.full_events;
    w->spills_refused_full = ds.spills_refused_full;
  }
  oi_host_cluster_stats cs;
  memset(&cs, 0, sizeof cs);
  cs.struct_size = sizeof cs;
  if (oi_host_get_cluster_stats(srv->host, &cs) == OI_OK) {
    r->has_cluster = true;
    oi__wire_cluster_stats(&cs, &r->cluster);
  }
  oi_clear_error();
  if (oi_host_get_stats(srv->host, &hs) == OI_OK) {
    r->host_blocks_sealed = hs.blocks_sealed;
    r->host_capacity_bytes = hs.capacity_bytes;
    r->has_host = true;
    oi__wire_host_stats(&hs, &r->host);
    uint32_t n = OI_MIN(hs.namespaces, OI_WIRE_MAX_NAMESPACES);
    if (n && (nss = oi__calloc(n, sizeof *nss))) {
      size_t k = 0;
      for (uint32_t i = 0; i < n; i++) {
        oi_host_namespace_stats ns;
        memset(&ns, 0, sizeof ns);
        ns.struct_size = sizeof ns;
        if (oi_host_get_namespace_stats(srv->host, i, &ns) != OI_OK) break;
        snprintf(nss[k].name, sizeof nss[k].name, "%s", ns.name);
        nss[k].block_bytes = ns.block_bytes;
        nss[k].blocks_resident = ns.blocks_resident;
        snprintf(nss[k].codec, sizeof nss[k].codec, "%s", ns.codec);
        nss[k].stored_bytes = ns.stored_bytes;
        nss[k].logical_bytes = ns.logical_bytes;
        nss[k].physical_bytes = ns.physical_bytes;
        k++;
      }
      out.namespaces = nss;
      out.n_namespaces = k;
    }
  }
  oi_clear_error();
  oi__session_send(s, &env, &out);
  oi__free(nss);
}
