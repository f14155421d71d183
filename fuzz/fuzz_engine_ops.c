/* Engine operation sequences on the cpu backend, checked against a reference
 * model: the input picks a layout, a world size, a pool that fits every key
 * (exact mode) or one that must evict, and then a sequence of saves, prefix
 * and membership queries, loads (good, with a wrong count, duplicate or
 * out-of-range destinations, stale or forged leases), releases, flushes and
 * evictions. After every operation:
 *   - every byte of the device arena equals the model's (each loaded block
 *     holds exactly its key's pattern; blocks not loaded and the gaps between
 *     slices are untouched);
 *   - hits, lease creation and every status match the model (exact mode), or
 *     are bounded by it (eviction mode: hits never exceed what was saved,
 *     leased blocks are never evicted);
 *   - the host's accounting agrees: nothing in flight or loading, sealed,
 *     leased and lease counts as modelled, used + free == capacity. */
#include "engine/engine_internal.h"
#include "fuzz_util.h"
#include "host/host.h"

#define BLOCKS 8 /* device blocks */
#define KEYS 12  /* distinct block contents (hash i <-> pattern i) */
#define LEASES 4 /* lease slots of the model */
#define MAX_OPS 48

typedef struct shape {
  uint32_t n;
  oi_arena_desc a[2];
  uint64_t size;
} shape;

static const shape shapes[3] = {
    {1,
     {{.name = "kv",
       .offset = 0,
       .num_blocks = BLOCKS,
       .bytes_per_block = 64,
       .block_stride = 64,
       .segments = 1}},
     BLOCKS * 64},
    {1,
     {{.name = "kv",
       .offset = 0,
       .num_blocks = BLOCKS,
       .bytes_per_block = 32,
       .block_stride = 112,
       .segments = 2,
       .segment_stride = 48}},
     BLOCKS * 112},
    {2,
     {{.name = "k",
       .offset = 0,
       .num_blocks = BLOCKS,
       .bytes_per_block = 40,
       .block_stride = 40,
       .segments = 1},
      {.name = "v",
       .offset = BLOCKS * 40 + 8,
       .num_blocks = BLOCKS,
       .bytes_per_block = 24,
       .block_stride = 32,
       .segments = 1}},
     BLOCKS * 40 + 8 + BLOCKS * 32},
};

static uint8_t pat(int key, uint32_t arena, uint32_t seg, uint64_t i) {
  uint64_t x = (uint64_t)(key + 1) * 0x9E3779B97F4A7C15ull ^ (arena + 1) * 0xBF58476D1CE4E5B9ull ^
               (seg + 1) * 0x94D049BB133111EBull ^ (i + 1) * 0x2545F4914F6CDD1Dull;
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 17) ^ (x >> 41));
}

/* Writes key's pattern (or zeros, key < 0) into device block b of `buf`. */
static void put_block(const shape *sh, uint8_t *buf, int b, int key) {
  for (uint32_t a = 0; a < sh->n; a++)
    for (uint32_t s = 0; s < sh->a[a].segments; s++) {
      uint8_t *p =
          buf + sh->a[a].offset + (uint64_t)b * sh->a[a].block_stride + s * sh->a[a].segment_stride;
      for (uint64_t i = 0; i < sh->a[a].bytes_per_block; i++)
        p[i] = key < 0 ? 0 : pat(key, a, s, i);
    }
}

static oi_block_hash key_hash(int key) {
  oi_block_hash h;
  memset(&h, 0, sizeof h);
  h.bytes[0] = (uint8_t)key;
  h.bytes[7] = 0x5a;
  h.bytes[15] = 0xc3;
  return h;
}

typedef struct model_lease {
  bool live;
  oi_lease lease;
  int keys[KEYS];
  size_t n;
  uint32_t shares;
} model_lease;

typedef struct model {
  const shape *sh;
  bool exact;
  uint32_t world;
  int dev[BLOCKS];     /* key in each device block, -1 zeros */
  bool present[KEYS];  /* exact: sealed in the host; eviction mode: saved, maybe evicted */
  uint32_t pins[KEYS]; /* live leases naming the key */
  model_lease leases[LEASES];
  uint8_t *expect; /* the arena the model predicts */
} model;

static void check_arena(const model *m, const uint8_t *arena) {
  if (memcmp(arena, m->expect, m->sh->size) == 0) return;
  for (uint64_t i = 0; i < m->sh->size; i++)
    FZ_ASSERT(arena[i] == m->expect[i], "arena byte %llu is 0x%02x, the model says 0x%02x",
              (unsigned long long)i, arena[i], m->expect[i]);
}

static void check_stats(const model *m, oi_host *h) {
  oi_host_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  FZ_ASSERT(oi_host_get_stats(h, &s) == OI_OK, "stats");
  FZ_ASSERT(s.blocks_in_flight == 0 && s.blocks_loading == 0, "in flight %llu, loading %llu",
            (unsigned long long)s.blocks_in_flight, (unsigned long long)s.blocks_loading);
  FZ_ASSERT(s.used_bytes + s.free_bytes == s.capacity_bytes, "used + free != capacity");
  uint64_t present = 0, leased = 0, leases = 0;
  for (int k = 0; k < KEYS; k++) {
    present += m->present[k];
    leased += m->pins[k] > 0;
  }
  for (int i = 0; i < LEASES; i++)
    leases += m->leases[i].live;
  FZ_ASSERT(s.blocks_leased == leased, "leased %llu, model %llu",
            (unsigned long long)s.blocks_leased, (unsigned long long)leased);
  FZ_ASSERT(s.leases_active == leases, "leases %llu, model %llu",
            (unsigned long long)s.leases_active, (unsigned long long)leases);
  if (m->exact)
    FZ_ASSERT(s.blocks_sealed == present, "sealed %llu, model %llu",
              (unsigned long long)s.blocks_sealed, (unsigned long long)present);
  else
    FZ_ASSERT(s.blocks_sealed <= present && s.blocks_sealed >= leased,
              "sealed %llu, model <= %llu, >= %llu", (unsigned long long)s.blocks_sealed,
              (unsigned long long)present, (unsigned long long)leased);
  uint64_t block_bytes = 0;
  for (uint32_t a = 0; a < m->sh->n; a++)
    block_bytes += m->sh->a[a].segments * m->sh->a[a].bytes_per_block;
  FZ_ASSERT(s.block_bytes_resident == s.blocks_sealed * block_bytes,
            "resident bytes %llu for %llu blocks", (unsigned long long)s.block_bytes_resident,
            (unsigned long long)s.blocks_sealed);
}

static void unpin(model *m, model_lease *l) {
  for (size_t i = 0; i < l->n; i++)
    m->pins[l->keys[i]]--;
  l->live = false;
}

static oi_status wait_ticket(oi_ticket *t) {
  oi_status st = oi_ticket_wait(t, 60000);
  oi_ticket_release(t);
  return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz f = {data, size, 0};
  uint8_t cfg = fz_u8(&f);
  model m;
  memset(&m, 0, sizeof m);
  m.sh = &shapes[cfg % 3];
  m.exact = !(cfg & 4);
  m.world = 1 + (cfg >> 3) % 3;
  for (int b = 0; b < BLOCKS; b++)
    m.dev[b] = -1;

  oi_host_options ho;
  oi_host_options_init(&ho);
  ho.chunk_bytes = 4 * OI_SLOT_ALIGN;                 /* every shape's block fits one slot */
  ho.pool_bytes = (m.exact ? 4 : 1) * ho.chunk_bytes; /* 16 slots >= KEYS, or 4 */
  ho.index_shards = 1u << (cfg >> 5 & 3);
  ho.high_watermark = 1.0f; /* no background eviction: the model decides */
  ho.lease_ttl_ms = 3600000;
  oi_host *h = NULL;
  FZ_ASSERT(oi_host_create(&ho, &h) == OI_OK, "host_create: %s", oi_last_error());
  uint8_t *arena = calloc(1, m.sh->size);
  m.expect = calloc(1, m.sh->size);
  FZ_ASSERT(arena && m.expect, "out of memory");
  oi_engine_options eo;
  oi_engine_options_init(&eo);
  eo.namespace_id = "fuzz";
  eo.world_size = m.world;
  eo.num_arenas = m.sh->n;
  eo.arenas = m.sh->a;
  eo.arena_base = arena;
  eo.arena_size = m.sh->size;
  oi_engine *e = NULL;
  FZ_ASSERT(oi_engine_create(h, &eo, &e) == OI_OK, "engine_create: %s", oi_last_error());

  for (int op = 0; op < MAX_OPS && !fz_done(&f); op++) {
    uint8_t code = fz_u8(&f);
    switch (code % 9) {
    case 0: { /* save n distinct device blocks, each filled with its key's pattern */
      size_t n = 1 + fz_u8(&f) % BLOCKS;
      int64_t ids[BLOCKS];
      oi_block_hash hs[BLOCKS];
      int keys[BLOCKS];
      uint8_t start = fz_u8(&f);
      for (size_t i = 0; i < n; i++) {
        ids[i] = (int64_t)((start + i) % BLOCKS);
        keys[i] = fz_u8(&f) % KEYS;
        hs[i] = key_hash(keys[i]);
        put_block(m.sh, arena, (int)ids[i], keys[i]);
        put_block(m.sh, m.expect, (int)ids[i], keys[i]);
        m.dev[ids[i]] = keys[i];
      }
      oi_ticket *t = NULL;
      oi_status st = oi_engine_save(e, ids, hs, n, NULL, &t);
      FZ_ASSERT(st == OI_OK, "save: %s", oi_last_error());
      FZ_ASSERT(wait_ticket(t) == OI_OK, "save ticket");
      for (size_t i = 0; i < n; i++)
        m.present[keys[i]] = true;
      break;
    }
    case 1: { /* prefix query */
      size_t n = fz_u8(&f) % 7;
      oi_block_hash hs[8];
      int keys[8];
      for (size_t i = 0; i < n; i++)
        hs[i] = key_hash(keys[i] = fz_u8(&f) % KEYS);
      oi_query_result q;
      memset(&q, 0, sizeof q);
      q.struct_size = sizeof q;
      int slot = -1;
      for (int i = 0; i < LEASES && slot < 0; i++)
        if (!m.leases[i].live) slot = i;
      if (slot < 0) { /* keep the model's slots: release one first */
        FZ_ASSERT(oi_engine_release(e, m.leases[0].lease) == OI_OK, "release: %s", oi_last_error());
        unpin(&m, &m.leases[0]);
        slot = 0;
      }
      FZ_ASSERT(oi_engine_query(e, NULL, hs, n, 0, &q) == OI_OK, "query: %s", oi_last_error());
      size_t expect = 0;
      while (expect < n && (m.present[keys[expect]] || m.pins[keys[expect]]))
        expect++;
      if (m.exact)
        FZ_ASSERT(q.hit_blocks == expect, "hits %llu, model %zu", (unsigned long long)q.hit_blocks,
                  expect);
      else
        FZ_ASSERT(q.hit_blocks <= expect, "hits %llu, model at most %zu",
                  (unsigned long long)q.hit_blocks, expect);
      static const oi_lease none;
      FZ_ASSERT((q.hit_blocks > 0) == (memcmp(&q.lease, &none, sizeof none) != 0),
                "lease iff hits");
      for (size_t i = 0; i < q.hit_blocks; i++)
        FZ_ASSERT(m.pins[keys[i]] || m.present[keys[i]], "a hit for key %d never saved", keys[i]);
      if (q.hit_blocks) {
        model_lease *l = &m.leases[slot];
        l->live = true;
        l->lease = q.lease;
        l->n = q.hit_blocks;
        l->shares = m.world;
        for (size_t i = 0; i < l->n; i++)
          m.pins[l->keys[i] = keys[i]]++;
      }
      break;
    }
    case 2: { /* membership */
      size_t n = 1 + fz_u8(&f) % 7;
      oi_block_hash hs[8];
      int keys[8];
      uint8_t present[8];
      for (size_t i = 0; i < n; i++)
        hs[i] = key_hash(keys[i] = fz_u8(&f) % KEYS);
      oi_query_result q;
      memset(&q, 0, sizeof q);
      q.struct_size = sizeof q;
      q.present = present;
      FZ_ASSERT(oi_engine_query(e, NULL, hs, n, OI_QUERY_MEMBERSHIP, &q) == OI_OK, "membership");
      for (size_t i = 0; i < n; i++) {
        if (m.exact)
          FZ_ASSERT(present[i] == m.present[keys[i]], "key %d present %u", keys[i], present[i]);
        if (m.pins[keys[i]]) FZ_ASSERT(present[i], "leased key %d was evicted", keys[i]);
        if (!m.present[keys[i]]) FZ_ASSERT(!present[i], "key %d never saved", keys[i]);
      }
      break;
    }
    case 3: { /* load a live lease (or a spent one) into distinct destinations */
      model_lease *l = &m.leases[fz_u8(&f) % LEASES];
      uint8_t how = fz_u8(&f);
      size_t n = l->n ? l->n : 1;
      int64_t dst[KEYS];
      uint8_t start = fz_u8(&f);
      if (n > BLOCKS) n = BLOCKS; /* (a lease holds at most 6) */
      for (size_t i = 0; i < n; i++)
        dst[i] = (int64_t)((start + i * 3) % BLOCKS);
      /* i*3 mod 8 is distinct for i < 8 */
      oi_ticket *t = NULL;
      if (how % 8 == 1 && n > 1) { /* a duplicate destination: refused, lease intact */
        dst[1] = dst[0];
        FZ_ASSERT(oi_engine_load(e, l->lease, dst, n, NULL, &t) == OI_ERR_INVALID_ARGUMENT, "dup");
        break;
      }
      if (how % 8 == 2) { /* out of range */
        dst[0] = (how & 0x80) ? -1 : BLOCKS;
        FZ_ASSERT(oi_engine_load(e, l->lease, dst, n, NULL, &t) == OI_ERR_INVALID_ARGUMENT,
                  "range");
        break;
      }
      if (how % 8 == 3 && l->live && n < BLOCKS) { /* a count that differs from the lease */
        dst[n] = (int64_t)((start + n * 3) % BLOCKS);
        FZ_ASSERT(oi_engine_load(e, l->lease, dst, n + 1, NULL, &t) == OI_ERR_INVALID_ARGUMENT,
                  "count mismatch: %s", oi_last_error());
        break;
      }
      oi_status st = oi_engine_load(e, l->lease, dst, n, NULL, &t);
      if (!l->live) {
        FZ_ASSERT(st == OI_ERR_LEASE_EXPIRED, "a spent lease loaded: %s", oi_status_str(st));
        break;
      }
      FZ_ASSERT(st == OI_OK, "load: %s", oi_last_error());
      FZ_ASSERT(wait_ticket(t) == OI_OK, "load ticket");
      for (size_t i = 0; i < n; i++) {
        put_block(m.sh, m.expect, (int)dst[i], l->keys[i]);
        m.dev[dst[i]] = l->keys[i];
      }
      if (--l->shares == 0) unpin(&m, l);
      break;
    }
    case 4: { /* release */
      model_lease *l = &m.leases[fz_u8(&f) % LEASES];
      oi_status st = oi_engine_release(e, l->lease);
      FZ_ASSERT(st == (l->live ? OI_OK : OI_ERR_LEASE_EXPIRED), "release: %s", oi_status_str(st));
      if (l->live) unpin(&m, l);
      break;
    }
    case 5: FZ_ASSERT(oi_engine_flush(e, 60000) == OI_OK, "flush"); break;
    case 6: { /* evict everything evictable */
      uint64_t n = 0, expect = 0;
      FZ_ASSERT(oi_host_evict_all(h, &n) == OI_OK, "evict_all");
      for (int k = 0; k < KEYS; k++)
        if (m.present[k] && !m.pins[k]) {
          expect++;
          m.present[k] = false;
        }
      if (m.exact)
        FZ_ASSERT(n == expect, "evicted %llu, model %llu", (unsigned long long)n,
                  (unsigned long long)expect);
      else
        FZ_ASSERT(n <= expect, "evicted %llu, model at most %llu", (unsigned long long)n,
                  (unsigned long long)expect);
      break;
    }
    case 7: { /* a save with a block id out of range changes nothing */
      int64_t id = (fz_u8(&f) & 1) ? -1 - (int64_t)fz_u8(&f) : BLOCKS + (int64_t)fz_u8(&f);
      oi_block_hash hs = key_hash(fz_u8(&f) % KEYS);
      FZ_ASSERT(oi_engine_save(e, &id, &hs, 1, NULL, NULL) == OI_ERR_INVALID_ARGUMENT, "bad id");
      break;
    }
    case 8: { /* a forged lease */
      oi_lease fl;
      for (int i = 0; i < 16; i++)
        fl.bytes[i] = fz_u8(&f);
      int64_t dst = 0;
      bool real = false;
      for (int i = 0; i < LEASES; i++)
        real |= m.leases[i].live && !memcmp(&fl, &m.leases[i].lease, sizeof fl);
      if (real) break;
      FZ_ASSERT(oi_engine_load(e, fl, &dst, 1, NULL, NULL) == OI_ERR_LEASE_EXPIRED, "forged lease");
      break;
    }
    }
    check_arena(&m, arena);
    check_stats(&m, h);
  }
  oi_engine_destroy(e);
  oi_host_destroy(h);
  free(arena);
  free(m.expect);
  oi_clear_error();
  return 0;
}
