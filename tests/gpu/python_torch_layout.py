#!/usr/bin/env python3
"""The Python binding on torch CUDA tensors in vLLM's KV layout (GPU machine).

Each of 36 layers is one tensor [2, num_blocks, 16, 8, 128] of bfloat16 (K
half, then V half), registered as one arena with two segments
(segment_offsets). Checked byte-exact with torch.equal on the GPU:

  embedded engine: a whole-block save with a wait event, then a layerwise
  save (each layer's arena with its own CUDA event, nothing visible before
  the last layer), a query, and a layered load whose arenas are waited for
  one by one (arena_wait) and whose per-arena CUDA events order a torch
  stream;
  sidecar (when OPENINFER_EXE names `openinfer`): engine-owned memory, one
  cudaMalloc'd tensor holding every layer, handed to `openinfer serve`;
  a save, a lookup, and a layered load reported arena by arena through the
  server's LoadProgress frames.

Exits 77 without torch or a CUDA device. Prints one line per check."""
import ctypes
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch
except ImportError:
    print("skip: no torch")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skip: no CUDA device")
    sys.exit(77)

import openinfer as oi

LAYERS, BLOCK_TOKENS, HEADS, HEAD_DIM = 36, 16, 8, 128
NUM_BLOCKS = 128
PIECE = BLOCK_TOKENS * HEADS * HEAD_DIM * 2  # bytes of one block's K (or V) in one layer
failures = 0


def check(ok, what):
    global failures
    print("%s: %s" % ("ok" if ok else "FAIL", what), flush=True)
    if not ok:
        failures += 1


def _cudart():
    """The CUDA runtime this process already loaded (the library's)."""
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcudart.so" in line:
                return ctypes.CDLL(line.split()[-1])
    return ctypes.CDLL("libcudart.so")


def event_handle(ev):
    """The cudaEvent_t of a recorded torch event, as an int."""
    h = getattr(ev, "cuda_event", None)
    if h is None:
        h = ev._as_parameter_.value
    return int(h)


def layer_arenas(bases):
    arenas = [oi.Arena("layer%d" % i, NUM_BLOCKS, PIECE, block_stride=PIECE, segments=2,
                       base=b) for i, b in enumerate(bases)]
    offsets = [0, NUM_BLOCKS * PIECE] * len(bases)  # K half, then V half
    return arenas, offsets


def fill(layers, ids, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for t in layers:
        for b in ids:
            r = torch.randint(-32768, 32767, (2, BLOCK_TOKENS, HEADS, HEAD_DIM),
                              dtype=torch.int16, device="cuda", generator=g)
            t[:, b].copy_(r.view(torch.bfloat16))


def same(layers, src, dst, layer=None):
    ls = range(len(layers)) if layer is None else [layer]
    return all(torch.equal(layers[i][:, s].view(torch.int16), layers[i][:, d].view(torch.int16))
               for i in ls for s, d in zip(src, dst))


def embedded():
    layers = [torch.zeros((2, NUM_BLOCKS, BLOCK_TOKENS, HEADS, HEAD_DIM), dtype=torch.bfloat16,
                          device="cuda") for _ in range(LAYERS)]
    arenas, offsets = layer_arenas([t.data_ptr() for t in layers])
    host = oi.OffloadHost(1 << 30, device=0)
    eng = oi.OffloadEngine(host, "torch-vllm", arenas, device=0, segment_offsets=offsets)
    whole, layered = list(range(0, 16)), list(range(16, 32))
    hs_whole = oi.hash_blocks(list(range(16 * BLOCK_TOKENS)), BLOCK_TOKENS)
    hs_layer = oi.hash_blocks(list(range(10**6, 10**6 + 16 * BLOCK_TOKENS)), BLOCK_TOKENS)

    # A whole-block save ordered after the writes by a CUDA event.
    fill(layers, whole, 1)
    ev = torch.cuda.Event()
    ev.record()
    t = eng.save(whole, hs_whole, wait_event=event_handle(ev), counts=True)
    t.wait(60)
    check(t.save_result.accepted == 16, "whole-block save accepted 16 blocks")

    # Layerwise: each layer written on a side stream, saved after its event.
    fill(layers, layered, 2)
    side = torch.cuda.Stream()
    tickets = []
    for i in range(LAYERS):
        with torch.cuda.stream(side):
            layers[i][:, layered].mul_(1)  # the "forward" that wrote the layer
            lev = torch.cuda.Event()
            lev.record(side)
        tickets.append(eng.save(layered, hs_layer, wait_event=event_handle(lev), arena_first=i,
                                arena_count=1))
        if i == LAYERS - 2:
            for tk in tickets:
                tk.wait(60)
            q = eng.query(hs_layer)
            check(q.hit_blocks == 0, "layerwise: nothing visible before the last layer "
                  "(pending %d)" % q.pending_blocks)
            if q.lease is not None:
                eng.release(q.lease)
    for tk in tickets:
        tk.wait(60)
    eng.flush(60)

    # Query both prefixes, load into other blocks, layer by layer.
    for name, src, hs in (("whole", whole, hs_whole), ("layerwise", layered, hs_layer)):
        q = eng.query(hs)
        check(q.hit_blocks == 16, "%s: query hits 16" % name)
        dst = list(range(NUM_BLOCKS - 16, NUM_BLOCKS))
        for tsr in layers:
            tsr[:, dst].zero_()
        torch.cuda.synchronize()
        t = eng.load(q.lease, dst, arena_events=True)
        consumer = torch.cuda.Stream()
        in_order = True
        for i in range(LAYERS):
            t.arena_wait(i, 60)
            in_order &= same(layers, src, dst, layer=i)
            if i in (0, LAYERS - 1):
                check(t.arena_event(i) != 0, "%s: layer %d has a CUDA event" % (name, i))
        t.wait(60)
        check(in_order, "%s: each layer byte-exact once its arena_wait returned" % name)
        # The per-arena events order a torch stream (cudaStreamWaitEvent).
        cudart = _cudart()
        for i in range(LAYERS):
            rc = cudart.cudaStreamWaitEvent(ctypes.c_void_p(consumer.cuda_stream),
                                            ctypes.c_void_p(t.arena_event(i)), 0)
            if rc != 0:
                check(False, "cudaStreamWaitEvent on layer %d's event: error %d" % (i, rc))
        with torch.cuda.stream(consumer):
            ok = same(layers, src, dst)
        check(ok, "%s: all layers byte-exact (K and V halves)" % name)
    st = eng.stats()
    check(st["saves_failed"] == 0 and st["loads_failed"] == 0, "no failed saves or loads")
    eng.close()
    host.close()


def sidecar(exe):
    sock = os.path.join(tempfile.mkdtemp(prefix="oi-torch-"), "oi.sock")
    log = open(sock + ".log", "w")
    srv = subprocess.Popen([exe, "serve", "--socket", sock, "--pool", "1G", "--device", "0",
                            "--no-metrics"],
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        # One allocation holds every layer (the server imports it by IPC).
        kv = torch.zeros((LAYERS, 2, NUM_BLOCKS, BLOCK_TOKENS, HEADS, HEAD_DIM),
                         dtype=torch.bfloat16, device="cuda")
        layers = [kv[i] for i in range(LAYERS)]
        base = kv.data_ptr()
        per_layer = 2 * NUM_BLOCKS * PIECE
        arenas = [oi.Arena("layer%d" % i, NUM_BLOCKS, PIECE, block_stride=PIECE, segments=2,
                           offset=i * per_layer) for i in range(LAYERS)]
        offsets = [0, NUM_BLOCKS * PIECE] * LAYERS
        eng, imported = oi.OffloadEngine.connect(sock, "torch-sidecar", arenas, device=0,
                                                 buffer=base, buffer_size=kv.numel() * 2,
                                                 segment_offsets=offsets)
        check(imported is None, "sidecar: engine-owned (no imported arena)")
        n = NUM_BLOCKS // 2  # 36 layers x 64 blocks x 64 KiB: 144 MiB, long enough to overlap
        src, dst = list(range(n)), list(range(n, 2 * n))
        hs = oi.hash_blocks(list(range(5 * 10**6, 5 * 10**6 + n * BLOCK_TOKENS)), BLOCK_TOKENS)
        fill(layers, src, 3)
        torch.cuda.synchronize()
        eng.save(src, hs).wait(60)
        look = oi.LookupClient(sock, "torch-sidecar")
        q = look.query(hs)
        check(q.hit_blocks == n, "sidecar: a lookup without a layout hits %d" % n)
        t = eng.load(q.lease, dst, arena_events=True)
        progressed = False
        in_order = True
        for i in range(LAYERS):
            t.arena_wait(i, 60)
            in_order &= same(layers, src, dst, layer=i)
            if i == 0 and not t.done():
                progressed = True
        t.wait(60)
        check(in_order, "sidecar: each layer byte-exact once its arena_wait returned")
        print("info: sidecar arena 0 reported before the whole load: %s" % progressed)
        check(same(layers, src, dst), "sidecar: all layers byte-exact")
        st = eng.stats()
        check(st["connection"] == oi.CONNECTION_CONNECTED, "sidecar: connected")
        look.close()
        eng.close()
    finally:
        srv.terminate()
        srv.wait(30)
        log.close()


embedded()
exe = os.environ.get("OPENINFER_EXE")
if exe:
    sidecar(exe)
else:
    print("info: OPENINFER_EXE not set: sidecar part skipped")
print("%d failed" % failures)
sys.exit(1 if failures else 0)
