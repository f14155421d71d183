/* `openinfer demo`: the main job on one machine. Builds a KV arena shaped
 * like a small model (several layers, one slice of every block per layer),
 * hashes a synthetic prompt into block hashes, saves every block to pinned
 * host memory through the device backend, wipes the arena, restores the
 * blocks into different block ids, and verifies every byte. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "device/device.h"
#include "openinfer/openinfer.h"

typedef struct demo_opts {
  long device; /* -2: auto (GPU 0 when present, else cpu) */
  long layers;
  long blocks;
  uint64_t block_bytes;
  long page_tokens;
} demo_opts;

static void demo_usage(FILE *f) {
  fprintf(f,
          "usage: openinfer demo [--device N|cpu] [--layers N] [--blocks N] [--block-bytes SIZE]\n"
          "\n"
          "  --device N|cpu     CUDA device ordinal, or cpu (default: GPU 0 if present, else cpu)\n"
          "  --layers N         arenas, one per layer (default 8)\n"
          "  --blocks N         KV blocks to save and restore (default 256)\n"
          "  --block-bytes SIZE bytes of one block in one layer (default 32K)\n"
          "  --page-tokens N    tokens per block, for hashing (default 16)\n");
}

static double gbps(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes / (double)ns : 0.0; }

static void complete_ticket(void *arg, oi_status st) { oi__ticket_complete(arg, st); }

/* Queues the copies plus a completion marker and waits for it. */
static oi_status run_copies(oi_dev *dev, oi_stream *s, oi_copy_dir dir, const oi_copy_desc *d,
                            size_t n) {
  oi_ticket *t = oi__ticket_new();
  if (!t) return OI_ERR_OUT_OF_MEMORY;
  oi_status st = dev->ops->stream_copy(s, dir, d, n);
  if (st == OI_OK) st = dev->ops->stream_call(s, complete_ticket, t);
  if (st != OI_OK) {
    oi__ticket_complete(t, st);
    oi_ticket_release(t);
    return st;
  }
  st = oi_ticket_wait(t, 120000);
  oi_ticket_release(t);
  return st;
}

int cmd_demo(int argc, char **argv) {
  demo_opts o = {.device = -2, .layers = 8, .blocks = 256, .block_bytes = 32 << 10, .page_tokens = 16};
  static const struct option longopts[] = {
      {"device", required_argument, 0, 'd'},      {"layers", required_argument, 0, 'l'},
      {"blocks", required_argument, 0, 'b'},      {"block-bytes", required_argument, 0, 'B'},
      {"page-tokens", required_argument, 0, 'p'}, {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'd':
      if (!strcmp(optarg, "cpu"))
        o.device = -1;
      else
        ok = cli_parse_int(optarg, -1, 1023, &o.device);
      break;
    case 'l': ok = cli_parse_int(optarg, 1, 4096, &o.layers); break;
    case 'b': ok = cli_parse_int(optarg, 1, 1 << 20, &o.blocks); break;
    case 'B': ok = cli_parse_size(optarg, &o.block_bytes) && o.block_bytes > 0; break;
    case 'p': ok = cli_parse_int(optarg, 1, 1 << 16, &o.page_tokens); break;
    case 'h': demo_usage(stdout); return CLI_OK;
    default: demo_usage(stderr); return CLI_USAGE;
    }
    if (!ok) {
      const char *name = "?";
      for (const struct option *lo = longopts; lo->name; lo++)
        if (lo->val == c) name = lo->name;
      fprintf(stderr, "openinfer demo: bad value '%s' for --%s\n", optarg, name);
      return CLI_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "openinfer demo: unexpected argument '%s'\n", argv[optind]);
    return CLI_USAGE;
  }
  if (o.device == -2) {
    int n = 0;
    oi_device_count(&n);
    o.device = n > 0 ? 0 : -1;
  }

  int rc = CLI_FAILED;
  oi_dev *dev = NULL;
  oi_stream *stream = NULL;
  void *arena = NULL;
  oi_pinned pool = {0};
  oi_copy_desc *descs = NULL;
  uint32_t *tokens = NULL;
  oi_block_hash *hashes = NULL;
  uint8_t *check = NULL;
  const uint64_t nblocks = (uint64_t)o.blocks, nlayers = (uint64_t)o.layers;
  const uint64_t layer_bytes = nblocks * o.block_bytes;
  const uint64_t total = layer_bytes * nlayers;

  oi_device_info info = {.struct_size = sizeof info};
  if (oi_device_get_info((int)o.device, &info) != OI_OK) goto fail;
  printf("openinfer demo — libopeninfer %s\n", oi_version_string());
  printf("device: %s (%s), %ld layers x %ld blocks x %llu B = %.1f MiB of KV\n", info.name,
         o.device < 0 ? "cpu backend" : "cuda backend", o.layers, o.blocks,
         (unsigned long long)o.block_bytes, (double)total / (1 << 20));

  /* Block hashes of a synthetic prompt: one full page of tokens per block. */
  size_t ntok = (size_t)nblocks * (size_t)o.page_tokens, nh = 0;
  tokens = oi__malloc(ntok * sizeof *tokens);
  hashes = oi__malloc(nblocks * sizeof *hashes);
  if (!tokens || !hashes) goto oom;
  for (size_t i = 0; i < ntok; i++) tokens[i] = (uint32_t)(i * 2654435761u % 151936u);
  if (oi_hash_blocks(tokens, ntok, (uint32_t)o.page_tokens, "demo", 4, NULL, hashes, nblocks, &nh) !=
      OI_OK)
    goto fail;
  printf("hashed %zu tokens into %zu block hashes (first %02x%02x%02x%02x...)\n", ntok, nh,
         hashes[0].bytes[0], hashes[0].bytes[1], hashes[0].bytes[2], hashes[0].bytes[3]);

  if (oi__dev_open((int)o.device, &dev) != OI_OK) goto fail;
  /* Twice the blocks: restored blocks land in the upper half (different ids). */
  if (dev->ops->mem_alloc(dev, 2 * total, 0, &arena) != OI_OK) goto fail;
  if (dev->ops->mem_fill_pattern(dev, arena, 2 * total, 42) != OI_OK) goto fail;
  if (dev->ops->pinned_alloc(dev, total, 0, -1, &pool) != OI_OK) goto fail;
  if (dev->ops->stream_create(dev, 0, &stream) != OI_OK) goto fail;

  /* Arena l holds blocks [0, 2*nblocks); host block b holds every layer's slice. */
  descs = oi__malloc(nblocks * nlayers * sizeof *descs);
  if (!descs) goto oom;
  uint8_t *abase = arena, *hbase = pool.host;
  size_t nd = 0;
  for (uint64_t b = 0; b < nblocks; b++)
    for (uint64_t l = 0; l < nlayers; l++)
      descs[nd++] = (oi_copy_desc){.src = (uintptr_t)(abase + l * 2 * layer_bytes + b * o.block_bytes),
                                   .dst = (uintptr_t)(hbase + (b * nlayers + l) * o.block_bytes),
                                   .bytes = o.block_bytes};
  uint64_t t0 = oi__now_ns();
  if (run_copies(dev, stream, OI_COPY_D2H, descs, nd) != OI_OK) goto fail;
  uint64_t t_save = oi__now_ns() - t0;
  printf("saved   %4llu blocks (%zu pieces) to the host tier in %8.3f ms  (%.2f GB/s)\n",
         (unsigned long long)nblocks, nd, (double)t_save / 1e6, gbps(total, t_save));

  /* Restore block b into block nblocks + (nblocks - 1 - b): different ids, reversed. */
  for (size_t i = 0; i < nd; i++) {
    uint64_t b = i / nlayers, l = i % nlayers, dst_block = nblocks + (nblocks - 1 - b);
    descs[i] = (oi_copy_desc){.src = descs[i].dst,
                              .dst = (uintptr_t)(abase + l * 2 * layer_bytes + dst_block * o.block_bytes),
                              .bytes = o.block_bytes};
  }
  t0 = oi__now_ns();
  if (run_copies(dev, stream, OI_COPY_H2D, descs, nd) != OI_OK) goto fail;
  uint64_t t_load = oi__now_ns() - t0;
  printf("restored %4llu blocks into different block ids in %8.3f ms  (%.2f GB/s)\n",
         (unsigned long long)nblocks, (double)t_load / 1e6, gbps(total, t_load));

  /* Verify: every restored (block, layer) slice equals the saved one. */
  check = oi__malloc(2 * total);
  if (!check) goto oom;
  if (dev->ops->mem_copy(dev, check, arena, 2 * total) != OI_OK) goto fail;
  uint64_t bad = 0;
  for (uint64_t b = 0; b < nblocks; b++)
    for (uint64_t l = 0; l < nlayers; l++) {
      uint64_t src_off = l * 2 * layer_bytes + b * o.block_bytes;
      uint64_t dst_off = l * 2 * layer_bytes + (2 * nblocks - 1 - b) * o.block_bytes;
      for (uint64_t i = 0; i < o.block_bytes; i++)
        if (check[dst_off + i] != oi__pattern_byte(42, src_off + i)) {
          bad++;
          break;
        }
    }
  if (bad) {
    fprintf(stderr, "openinfer demo: %llu of %llu restored slices differ from what was saved\n",
            (unsigned long long)bad, (unsigned long long)(nblocks * nlayers));
    goto done;
  }
  printf("verified %llu slices byte for byte: demo OK\n", (unsigned long long)(nblocks * nlayers));
  rc = CLI_OK;
  goto done;
oom:
  fprintf(stderr, "openinfer demo: out of memory\n");
  goto done;
fail:
  fprintf(stderr, "openinfer demo: %s\n", oi_last_error());
done:
  oi__free(check);
  oi__free(descs);
  if (dev) {
    if (stream) dev->ops->stream_destroy(stream);
    if (pool.host) dev->ops->pinned_free(dev, &pool);
    if (arena) dev->ops->mem_free(dev, arena);
    oi__dev_close(dev);
  }
  oi__free(hashes);
  oi__free(tokens);
  return rc;
}
