#!/usr/bin/env python3
"""openinfer.kvworker on a GPU with vLLM's KV layouts, without vLLM.

Allocates vLLM-layout KV tensors on CUDA (36 layers, blocks of 16 tokens x 8
KV heads x head dim 128, bf16, K and V), drives the KVWorker as the vLLM
connector does -- register, a layerwise save of every layer after its
"attention" wrote it (a CUDA event per layer orders each save after the
writes), query, a load with a wait per layer -- and checks every byte.

Two layouts:
  halves  one [2, num_blocks, 16, 8, 128] tensor per layer (K half, V half:
          one arena with two segments);
  pages   vLLM 0.33's single backing allocation viewed per layer as
          [num_blocks, 8, 16, 256] (K||V in the last dimension; one arena,
          one segment, layers one layer_stride apart).

usage: python_vllm_layout.py [--blocks N] [--save-blocks N] [--layout halves|pages|both]
Needs torch with CUDA and openinfer importable (PYTHONPATH at a directory with
openinfer/ and its built _native, e.g. build/bindings/python/pytest-work, and a
libopeninfer built with CUDA). Exits 77 (skipped) without torch or a CUDA
device, 1 on any difference."""
import argparse
import sys
import time

LAYERS, BS, HEADS, DIM = 36, 16, 8, 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=512)
    ap.add_argument("--save-blocks", type=int, default=128)
    ap.add_argument("--layout", choices=["halves", "pages", "both"], default="both")
    ap.add_argument("--pool", type=int, default=4 << 30)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("skip: no torch")
        return 77
    if not torch.cuda.is_available():
        print("skip: torch sees no CUDA device")
        return 77
    import openinfer as oi
    from openinfer.kvworker import KVWorker

    if oi.device_count() < 1:
        print("skip: libopeninfer sees no CUDA device (%s)" % oi.version_string())
        return 77
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    n, m = args.blocks, args.save_blocks
    assert 2 * m <= n
    layouts = ["halves", "pages"] if args.layout == "both" else [args.layout]
    failures = 0
    with oi.OffloadHost(args.pool, device=0) as host:
        for layout in layouts:
            if layout == "halves":
                kv = {"model.layers.%d.self_attn.attn" % i:
                      torch.zeros((2, n, BS, HEADS, DIM), dtype=torch.bfloat16, device=dev)
                      for i in range(LAYERS)}
                kv_dim = "auto"

                def blk(t, ids):
                    return t[:, ids]

                def write(t, ids, g):
                    t[:, ids] = torch.randn((2, len(ids), BS, HEADS, DIM), generator=g,
                                            device=dev).to(torch.bfloat16)
            else:
                raw = torch.zeros(LAYERS * n * HEADS * BS * 2 * DIM, dtype=torch.bfloat16,
                                  device=dev)
                v = raw.view(LAYERS, n, HEADS, BS, 2 * DIM)
                kv = {"model.layers.%d.self_attn.attn" % i: v[i] for i in range(LAYERS)}
                kv_dim = None

                def blk(t, ids):
                    return t[ids]

                def write(t, ids, g):
                    t[ids] = torch.randn((len(ids), HEADS, BS, 2 * DIM), generator=g,
                                         device=dev).to(torch.bfloat16)

            ns = "gpu/vllm-layout/" + layout
            w = KVWorker(kv, ns, host=host, num_blocks=n, kv_dim=kv_dim)
            print("%s: %d arenas, %d blocks of %d bytes in the host tier"
                  % (layout, w.num_arenas, n, w.layout.block_bytes))
            src = list(range(m))
            dst = list(range(n - 1, n - 1 - m, -1))
            hs = oi.hash_blocks_buffer(list(range(1, 1 + BS * m)), BS)
            g = torch.Generator(device=dev).manual_seed(1)
            # the forward: each layer writes its KV, then saves it (an event per layer)
            w.begin_step(src, hs)
            t0 = time.perf_counter()
            for name, t in kv.items():
                write(t, src, g)
                w.save_layer(name)
            errors = w.wait_saves(60)
            t_save = time.perf_counter() - t0
            if errors:
                print("FAIL %s: saves failed: %s" % (layout, errors))
                failures += 1
                w.close()
                continue
            want = {name: blk(t, src).clone() for name, t in kv.items()}
            q = w.query(hs)
            if q.hit_blocks != m:
                print("FAIL %s: %d of %d blocks hit" % (layout, q.hit_blocks, m))
                failures += 1
                w.close()
                continue
            t0 = time.perf_counter()
            tk = w.load(q.lease, dst)
            first = None
            for name, t in kv.items():
                w.wait_layer(tk, name, 60)
                if first is None:
                    first = time.perf_counter() - t0
                if not torch.equal(blk(t, dst), want[name]):
                    print("FAIL %s: layer %s differs after its wait" % (layout, name))
                    failures += 1
                    break
            tk.wait(60)
            t_load = time.perf_counter() - t0
            torch.cuda.synchronize()
            untouched = [b for b in range(m, n - m)]
            for name, t in kv.items():
                if blk(t, untouched).any():
                    print("FAIL %s: layer %s: a block outside the load changed" % (layout, name))
                    failures += 1
                    break
            gb = m * w.layout.block_bytes / 1e9
            print("%s: save %.2f GB in %.1f ms, load %.1f ms (first layer after %.2f ms): %s"
                  % (layout, gb, t_save * 1e3, t_load * 1e3, first * 1e3,
                     "bytes equal" if not failures else "DIFFER"))
            w.close()
    print("%d passed, %d failed" % (len(layouts) - min(failures, len(layouts)),
                                    min(failures, len(layouts))))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
