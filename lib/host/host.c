/* oi_host: creation, namespaces, statistics, eviction and the
 * maintenance thread (lease expiry, size-class rebalancing, watermark
 * eviction). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "codec/codec.h"
#include "device/hostmem.h"
#include "host_private.h"

#define MAINT_PERIOD_MS 20

OI_API oi_status oi_host_options_init(oi_host_options *o) {
  if (!o) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_options_init: options is NULL");
  memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->device = OI_DEVICE_CPU;
  o->numa_node = -1;
  o->lease_ttl_ms = 600000;
  o->index_shards = 64;
  o->high_watermark = 0.95f;
  o->low_watermark = 0.90f;
  return OI_OK;
}

static void *maint_main(void *arg);

static uint64_t resident_bytes(const oi_host *h) {
  uint64_t r = 0;
  uint32_t n = atomic_load(&h->nclasses);
  for (uint32_t i = 0; i < n; i++)
    r += atomic_load(&h->classes[i].resident) * h->classes[i].slot_bytes;
  return r;
}

OI_API oi_status oi_host_create(const oi_host_options *o, oi_host **out) {
  if (!out) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_create: out is NULL");
  *out = NULL;
  oi_host_options opts;
  oi_host_options_init(&opts);
  oi_status st = oi__struct_in(&opts, sizeof opts, o, "host_create");
  if (st != OI_OK) return st;
  if (opts.pool_bytes == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_create: pool_bytes is 0");
  if (opts.index_shards == 0 || (opts.index_shards & (opts.index_shards - 1)) ||
      opts.index_shards > 65536)
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "host_create: index_shards %u is not a power of two in [1, 65536]",
                    opts.index_shards);
  if (!(opts.low_watermark >= 0.0f && opts.low_watermark <= opts.high_watermark &&
        opts.high_watermark <= 1.0f))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "host_create: watermarks must satisfy 0 <= low (%g) <= high (%g) <= 1",
                    (double)opts.low_watermark, (double)opts.high_watermark);
  if (opts.flags & ~(uint32_t)(OI_HOST_HUGEPAGES | OI_HOST_NO_PIN))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_create: unknown flags 0x%x", opts.flags);
  if (opts.lease_ttl_ms == 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_create: lease_ttl_ms is 0");

  oi_host *h = oi__calloc(1, sizeof *h);
  if (!h) return oi__fail(OI_ERR_OUT_OF_MEMORY, "host_create: out of memory");
  h->opts = opts;
  h->capacity = opts.pool_bytes;
  pthread_mutex_init(&h->ns_lock, NULL);
  oi__tier_init(h);
  oi__rates_init(h);
  pthread_mutex_init(&h->maint_lock, NULL);
  pthread_mutex_init(&h->seal_lock, NULL);
  oi__cond_init_monotonic(&h->maint_cv);
  oi__cond_init_monotonic(&h->seal_cv);

  if ((st = oi__dev_open(opts.device, &h->dev)) != OI_OK) goto fail;
  uint32_t pin_flags = ((opts.flags & OI_HOST_HUGEPAGES) ? OI_PIN_HUGEPAGES : 0) |
                       ((opts.flags & OI_HOST_NO_PIN) ? OI_PIN_NO_PIN : 0);
  uint64_t t0 = oi__now_ns();
  /* With a progress hook the caller reports the setup itself. */
  OI_LOG(opts.progress ? OI_LOG_DEBUG : OI_LOG_INFO, "host", "%s a %.2f GiB pool on %s",
         (opts.flags & OI_HOST_NO_PIN) ? "setting up (pageable, not pinned)" : "pinning",
         (double)h->capacity / (1ull << 30), h->dev->ops->name);
  if (opts.progress) opts.progress(opts.progress_ctx, 0, h->capacity);
  oi__host_map_set_progress(opts.progress, opts.progress_ctx);
  st = h->dev->ops->pinned_alloc(h->dev, h->capacity, pin_flags, opts.numa_node, &h->pool);
  oi__host_map_set_progress(NULL, NULL);
  if (st != OI_OK) goto fail;
  uint64_t dt = oi__now_ns() - t0;
  h->pool_setup_ns = dt;
  OI_LOG(opts.progress ? OI_LOG_DEBUG : OI_LOG_INFO, "host",
         "pool ready: %.2f GiB in %.3f s (%.2f GB/s)", (double)h->capacity / (1ull << 30),
         (double)dt / 1e9, dt ? (double)h->capacity / (double)dt : 0.0);
  if (opts.progress) opts.progress(opts.progress_ctx, h->capacity, h->capacity);
  if ((st = oi__pool_init(h)) != OI_OK) goto fail;
  if ((st = oi__index_init(h)) != OI_OK) goto fail;
  if ((st = oi__lease_init(h)) != OI_OK) goto fail;
  int rc = pthread_create(&h->maint_thread, NULL, maint_main, h);
  if (rc != 0) {
    st = oi__fail(OI_ERR_INTERNAL, "host_create: cannot start the maintenance thread: %s",
                  strerror(rc));
    goto fail;
  }
  pthread_setname_np(h->maint_thread, "oi-host-maint");
  h->maint_started = true;
  *out = h;
  return OI_OK;
fail:
  oi_host_destroy(h);
  return st;
}

OI_API void oi_host_destroy(oi_host *h) {
  if (!h) return;
  int live = atomic_load(&h->live_engines);
  if (live > 0) {
    OI_LOG(OI_LOG_ERROR, "host",
           "host_destroy: %d engine(s) still registered; destroy engines first (host not freed)",
           live);
    return;
  }
  oi__tier_fini_upper(h); /* the tiers that take no spills stop using the host first; */
  /* the maintenance thread next: its watermark eviction would drop blocks
   * still queued for the spilling tier while that tier drains its queue (a
   * clean shutdown writes every one of them); */
  if (h->maint_started) {
    pthread_mutex_lock(&h->maint_lock);
    h->stopping = true;
    pthread_cond_broadcast(&h->maint_cv);
    pthread_mutex_unlock(&h->maint_lock);
    pthread_join(h->maint_thread, NULL);
  }
  oi__tier_fini(h); /* then the one that takes spills */
  oi__rates_fini(h);
  oi__lease_fini(h);
  oi__index_fini(h);
  oi__pool_fini(h);
  if (h->dev) {
    if (h->pool.host) h->dev->ops->pinned_free(h->dev, &h->pool);
    oi__dev_close(h->dev);
  }
  for (uint32_t i = 0; i < h->nns; i++)
    oi__free(h->ns[i].name);
  oi__free(h->ns);
  for (uint32_t i = 0; i < OI_NS_PAGES; i++)
    oi__free((void *)atomic_load(&h->ns_resident[i]));
  pthread_cond_destroy(&h->maint_cv);
  pthread_mutex_destroy(&h->maint_lock);
  pthread_cond_destroy(&h->seal_cv);
  pthread_mutex_destroy(&h->seal_lock);
  pthread_mutex_destroy(&h->ns_lock);
  oi__free(h);
}

bool oi__host_find_namespace(oi_host *h, const char *name, oi_host_ns *out) {
  bool found = false;
  pthread_mutex_lock(&h->ns_lock);
  for (uint32_t i = 0; i < h->nns && !found; i++)
    if (strcmp(h->ns[i].name, name) == 0) {
      *out = (oi_host_ns){.id = i + 1, .cls = h->ns[i].cls};
      found = true;
    }
  pthread_mutex_unlock(&h->ns_lock);
  return found;
}

oi_status oi__host_bind_namespace(oi_host *h, const char *name, uint64_t block_bytes,
                                  uint64_t shape_hash, uint64_t logical_bytes, int codec,
                                  oi_host_ns *out) {
  if (!logical_bytes) logical_bytes = block_bytes;
  pthread_mutex_lock(&h->ns_lock);
  for (uint32_t i = 0; i < h->nns; i++) {
    ns_entry *e = &h->ns[i];
    if (strcmp(e->name, name) != 0) continue;
    oi_status st = OI_OK;
    if (e->codec != codec)
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "register: namespace '%s' holds blocks of codec %s; this engine's codec is %s",
                    name, oi__codec_name(e->codec), oi__codec_name(codec));
    else if (e->block_bytes != block_bytes)
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "register: namespace '%s' holds blocks of %llu bytes; this layout's blocks are "
                    "%llu bytes",
                    name, (unsigned long long)e->block_bytes, (unsigned long long)block_bytes);
    else if (e->shape_hash != shape_hash || e->logical_bytes != logical_bytes)
      st = oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "register: namespace '%s' is bound to a layout of another shape or codec "
                    "(same stored block size, different arenas, codec or codec shape)",
                    name);
    *out = (oi_host_ns){.id = i + 1, .cls = e->cls};
    pthread_mutex_unlock(&h->ns_lock);
    return st;
  }
  uint32_t c;
  oi_status st = oi__pool_class_for(h, block_bytes, &c);
  if (st != OI_OK) {
    pthread_mutex_unlock(&h->ns_lock);
    return st;
  }
  if (h->nns == h->ns_cap) {
    uint32_t cap = h->ns_cap ? 2 * h->ns_cap : 8;
    ns_entry *n = oi__realloc(h->ns, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&h->ns_lock);
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
    }
    h->ns = n;
    h->ns_cap = cap;
  }
  char *copy = oi__strdup(name);
  if (!copy) {
    pthread_mutex_unlock(&h->ns_lock);
    return oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
  }
  uint32_t idx = h->nns; /* the new namespace's id is idx + 1 */
  if (idx < OI_NS_COUNTED && !atomic_load(&h->ns_resident[idx / OI_NS_PAGE])) {
    atomic_uint_fast64_t *page = oi__calloc(OI_NS_PAGE, sizeof *page);
    if (!page) {
      oi__free(copy);
      pthread_mutex_unlock(&h->ns_lock);
      return oi__fail(OI_ERR_OUT_OF_MEMORY, "register: out of memory");
    }
    atomic_store_explicit(&h->ns_resident[idx / OI_NS_PAGE], page, memory_order_release);
  }
  h->ns[h->nns] = (ns_entry){.name = copy,
                             .block_bytes = block_bytes,
                             .logical_bytes = logical_bytes,
                             .codec = codec,
                             .shape_hash = shape_hash,
                             .cls = c};
  *out = (oi_host_ns){.id = ++h->nns, .cls = c};
  pthread_mutex_unlock(&h->ns_lock);
  return OI_OK;
}

void oi__host_notify_sealed(oi_host *h) {
  pthread_mutex_lock(&h->seal_lock);
  if (h->seal_waiters) pthread_cond_broadcast(&h->seal_cv);
  pthread_mutex_unlock(&h->seal_lock);
}

bool oi__host_wait_not_in_flight(oi_host *h, oi_host_ns ns, const oi_block_hash *hash,
                                 uint64_t deadline_ns) {
  index_shard *s = oi__index_shard(h, ns.id, hash);
  struct timespec ts = oi__timespec(deadline_ns);
  bool settled = false;
  pthread_mutex_lock(&h->seal_lock); /* before the check: no seal is missed */
  for (;;) {
    pthread_mutex_lock(&s->lock);
    host_block *b = oi__index_find_locked(s, ns.id, hash);
    settled = !b || b->state != BLOCK_IN_FLIGHT;
    pthread_mutex_unlock(&s->lock);
    if (settled) break;
    h->seal_waiters++;
    int rc = deadline_ns == UINT64_MAX ? pthread_cond_wait(&h->seal_cv, &h->seal_lock)
                                       : pthread_cond_timedwait(&h->seal_cv, &h->seal_lock, &ts);
    h->seal_waiters--;
    if (rc == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&h->seal_lock);
  return settled;
}

/* spare_only: blocks awaiting their spill stay (oi__index_evict_batch_spared). */
static uint64_t evict_until(oi_host *h, uint64_t target_bytes, bool spare_only) {
  uint64_t n = 0;
  int empty_passes = 0;
  host_block *batch[64];
  uint64_t largest_slot = 1;
  uint32_t ncls = atomic_load(&h->nclasses);
  for (uint32_t i = 0; i < ncls; i++)
    largest_slot = OI_MAX(largest_slot, h->classes[i].slot_bytes);
  /* An empty batch while another thread evicts (the maintenance thread) may
   * be that thread holding the tails this pass looked at, not an empty LRU:
   * then look again (a bounded number of times). Alone, stop at once. */
  atomic_fetch_add(&h->evicters, 1);
  for (uint64_t r; (r = resident_bytes(h)) > target_bytes;) {
    /* No more than the excess needs (at least one block): stop at the target. */
    size_t want =
        (size_t)OI_MIN((r - target_bytes + largest_slot - 1) / largest_slot, OI_ARRAY_LEN(batch));
    size_t got = oi__index_evict_batch_spared(h, -1, want ? want : 1, batch, spare_only);
    if (!got) {
      if (atomic_load(&h->evicters) < 2 || ++empty_passes >= 64) break;
      sched_yield();
      continue;
    }
    empty_passes = 0;
    oi__pool_free_batch(h, batch, got);
    n += got;
  }
  atomic_fetch_sub(&h->evicters, 1);
  return n;
}

OI_API oi_status oi_host_evict_all(oi_host *h, uint64_t *evicted_blocks) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_evict_all: host is NULL");
  uint64_t n = evict_until(h, 0, false);
  if (evicted_blocks) *evicted_blocks = n;
  return OI_OK;
}

static void *maint_main(void *arg) {
  oi_host *h = arg;
  uint64_t high = (uint64_t)((double)h->capacity * h->opts.high_watermark);
  uint64_t low = (uint64_t)((double)h->capacity * h->opts.low_watermark);
  pthread_mutex_lock(&h->maint_lock);
  while (!h->stopping) {
    /* The period on the real monotonic clock (the condition variable's),
     * not the library clock, which a clock_jump fault moves forward: a
     * deadline read from it would sleep for the jump. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += MAINT_PERIOD_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&h->maint_cv, &h->maint_lock, &ts);
    if (h->stopping) break;
    pthread_mutex_unlock(&h->maint_lock);
    oi__lease_expire(h, oi__now_ns());
    if (atomic_load(&h->rebalance_want) || h->drain.chunk != OI_NIL) oi__rebalance_run(h);
    if (h->opts.high_watermark < 1.0f && resident_bytes(h) > high) {
      uint64_t n = evict_until(h, low, true);
      OI_LOG(OI_LOG_DEBUG, "host", "background eviction: %llu blocks", (unsigned long long)n);
    }
    pthread_mutex_lock(&h->maint_lock);
  }
  pthread_mutex_unlock(&h->maint_lock);
  return NULL;
}

OI_API oi_status oi_host_get_stats(const oi_host *h, oi_host_stats *out) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_stats: host is NULL");
  oi_host_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  oi_host *mh = (oi_host *)h; /* locks only; the host is not modified */
  uint32_t ncls = atomic_load(&h->nclasses);
  s.size_classes = ncls;
  s.capacity_bytes = h->capacity;
  uint64_t carved_chunks = 0;
  pthread_mutex_lock(&mh->chunk_lock);
  for (uint32_t i = 0; i < ncls; i++) {
    size_class *c = &mh->classes[i];
    pthread_mutex_lock(&c->lock);
    s.blocks_free += c->nfree;
    pthread_mutex_unlock(&c->lock);
  }
  for (uint32_t k = 0; k < h->nchunks; k++)
    carved_chunks += h->chunks[k].cls >= 0;
  pthread_mutex_unlock(&mh->chunk_lock);
  /* used: chunks carved for a size class (their slots hold blocks or are
   * free for that size); free: uncarved chunks and the tail too small for a
   * chunk. */
  s.used_bytes = carved_chunks * h->chunk_bytes;
  s.free_bytes = h->capacity - s.used_bytes;
  for (uint32_t i = 0; i < ncls; i++)
    s.block_bytes_resident += atomic_load(&h->classes[i].resident) * h->classes[i].block_bytes;
  const host_counters *c = &h->c;
  s.blocks_in_flight = atomic_load(&c->blocks_in_flight);
  s.blocks_sealed = atomic_load(&c->blocks_sealed);
  s.blocks_leased = atomic_load(&c->blocks_leased);
  s.blocks_loading = atomic_load(&c->blocks_loading);
  s.saves_submitted = atomic_load(&c->saves_submitted);
  s.saves_completed = atomic_load(&c->saves_completed);
  s.saves_deduplicated = atomic_load(&c->saves_deduplicated);
  s.saves_dropped = atomic_load(&c->saves_dropped);
  s.saves_failed = atomic_load(&c->saves_failed);
  s.bytes_saved = atomic_load(&c->bytes_saved);
  s.bytes_loaded = atomic_load(&c->bytes_loaded);
  s.loads_completed = atomic_load(&c->loads_completed);
  s.loads_failed = atomic_load(&c->loads_failed);
  s.query_hit_blocks = atomic_load(&c->query_hit_blocks);
  s.query_miss_blocks = atomic_load(&c->query_miss_blocks);
  s.leases_active = atomic_load(&c->leases_active);
  s.leases_expired = atomic_load(&c->leases_expired);
  s.leases_released = atomic_load(&c->leases_released);
  s.evictions = atomic_load(&c->evictions);
  s.loads_submitted = atomic_load(&c->loads_submitted);
  s.blocks_loaded = atomic_load(&c->blocks_loaded);
  s.blocks_pinned = atomic_load(&c->blocks_pinned);
  s.pool_setup_ns = h->pool_setup_ns;
  pthread_mutex_lock(&mh->ns_lock);
  s.namespaces = h->nns;
  pthread_mutex_unlock(&mh->ns_lock);
  s.latency_buckets = OI_LATENCY_BUCKETS;
  oi__hist_read(&c->save_latency, s.save_latency_us, &s.save_latency_sum_us);
  oi__hist_read(&c->load_latency, s.load_latency_us, &s.load_latency_sum_us);
  uint64_t rate[OI_RATES], samples[OI_RATES];
  oi__rates_read(h, rate, samples);
  s.link_bytes_per_s = rate[OI_RATE_LINK];
  s.disk_bytes_per_s = rate[OI_RATE_DISK];
  s.remote_bytes_per_s = rate[OI_RATE_REMOTE];
  s.link_samples = samples[OI_RATE_LINK];
  s.disk_samples = samples[OI_RATE_DISK];
  s.remote_samples = samples[OI_RATE_REMOTE];
  return oi__struct_out_min(out, &s, sizeof s, OI_FLOOR_HOST_STATS, "host_stats");
}

uint64_t oi__host_ns_resident(const oi_host *h, oi_host_ns ns) {
  return oi__ns_resident_get(h, ns.id);
}

void oi__host_pool_info(const oi_host *h, oi_host_pool_info *out) {
  *out =
      (oi_host_pool_info){.capacity_bytes = h->capacity,
                          .device = h->dev ? h->dev->ordinal : OI_DEVICE_CPU,
                          .ready = h->pool.host != NULL,
                          .pin_requested = !(h->opts.flags & OI_HOST_NO_PIN),
                          .device_mapped = h->pool.device != NULL && h->dev && h->dev->ordinal >= 0,
                          .base = h->pool.host,
                          .bytes = h->pool.host ? h->capacity : 0,
                          .slot_align = OI_SLOT_ALIGN};
}

uint64_t oi__ns_resident_get(const oi_host *h, uint32_t ns) {
  uint32_t i = ns - 1;
  if (ns == 0 || i >= OI_NS_COUNTED) return 0;
  atomic_uint_fast64_t *page =
      atomic_load_explicit(&((oi_host *)h)->ns_resident[i / OI_NS_PAGE], memory_order_acquire);
  return page ? atomic_load_explicit(&page[i % OI_NS_PAGE], memory_order_relaxed) : 0;
}

OI_API oi_status oi_host_get_namespace_stats(const oi_host *h, uint32_t index,
                                             oi_host_namespace_stats *out) {
  if (!h) return oi__fail(OI_ERR_INVALID_ARGUMENT, "host_namespace_stats: host is NULL");
  oi_host_namespace_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.index = index;
  oi_host *mh = (oi_host *)h; /* locks only */
  pthread_mutex_lock(&mh->ns_lock);
  if (index >= h->nns) {
    uint32_t n = h->nns;
    pthread_mutex_unlock(&mh->ns_lock);
    return oi__fail(OI_ERR_NOT_FOUND, "host_namespace_stats: index %u, but %u namespace(s)", index,
                    n);
  }
  snprintf(s.name, sizeof s.name, "%s", h->ns[index].name);
  const ns_entry *e = &h->ns[index];
  s.block_bytes = e->logical_bytes;
  s.stored_bytes = e->block_bytes;
  snprintf(s.codec, sizeof s.codec, "%s", oi__codec_name(e->codec));
  uint64_t slot = h->classes[e->cls].slot_bytes;
  pthread_mutex_unlock(&mh->ns_lock);
  s.blocks_resident = oi__ns_resident_get(h, index + 1);
  s.logical_bytes = s.blocks_resident * s.block_bytes;
  s.physical_bytes = s.blocks_resident * slot;
  return oi__struct_out(out, &s, sizeof s, "host_namespace_stats");
}
