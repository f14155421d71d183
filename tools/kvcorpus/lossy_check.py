#!/usr/bin/env python3
"""The lossy codecs checked on the real model: SmolLM2-135M's prefix KV put
through this library's int8, int8-hadamard and fp8 codecs (the codec_roundtrip helper of
tests/codec, so the bytes are the ones lib/codec writes and reads), then the
next 64 tokens computed on top of it; their next-token logits compared with
the exact pass (float32 KV throughout) over 6 texts x 4 prefix lengths x 64
positions = 1,536 positions: top-1 agreement and KL(exact || codec).

    lossy_check.py [--roundtrip build/tests/codec/codec_roundtrip] [--out FILE]

Prints a table; --out writes the figures as JSON (docs/codecs.md quotes the
committed tools/kvcorpus/lossy_check.json). Needs the venv of docs/codecs.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

import smollm2
from generate import SOURCES, TOKENS, BLOCK, read_text

PREFIXES = (128, 256, 384, 512)
EVAL = 64


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def through_codec(tool, codec, K, V):
    """K, V: (L, T, H, D) float32 -> the bf16 values after codec `codec`
    (None: bf16 rounding only), as float32. Pages of [K|V][16][H][D]."""
    L, T, H, D = K.shape
    kb, vb = smollm2.bf16_bits(K), smollm2.bf16_bits(V)
    if codec is None:
        return smollm2.bf16_value(kb), smollm2.bf16_value(vb)
    pages = np.stack([kb.reshape(L, T // BLOCK, BLOCK, H, D), vb.reshape(L, T // BLOCK, BLOCK, H, D)], 2)
    r = subprocess.run([tool, codec, "2", str(BLOCK), str(H), str(D)], input=pages.astype("<u2").tobytes(),
                       capture_output=True, check=True)
    sys.stderr.write(r.stderr.decode())
    back = np.frombuffer(r.stdout, "<u2").reshape(pages.shape)
    return (smollm2.bf16_value(back[:, :, 0].reshape(L, T, H, D)),
            smollm2.bf16_value(back[:, :, 1].reshape(L, T, H, D)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--roundtrip", default=os.path.join(here, "..", "..", "build", "tests", "codec", "codec_roundtrip"))
    ap.add_argument("--out")
    a = ap.parse_args()
    path = smollm2.gguf_path()
    m = smollm2.Model(path)
    tk = smollm2.tokenizer(path)
    variants = {"bf16": None, "int8": "int8", "int8-hadamard": "int8-hadamard", "fp8": "fp8"}
    res = {v: {"top1": [], "top1_vs_bf16": [], "kl": []} for v in variants}
    t0 = time.time()
    for name, src, _ in SOURCES:
        ids = tk.encode(read_text(src)[1]).ids[:TOKENS]
        ref, kv = m.forward(ids, logits_for=list(range(TOKENS)))
        lp_ref = log_softmax(ref.astype(np.float64))
        K = np.stack([k for k, _ in kv])
        V = np.stack([v for _, v in kv])
        coded = {v: through_codec(a.roundtrip, c, K, V) for v, c in variants.items()}
        for P in PREFIXES:
            pos = np.arange(P, P + EVAL)
            bf16_top = None
            for v in variants:
                Kq, Vq = coded[v]
                past = [(Kq[l, :P], Vq[l, :P]) for l in range(m.n_layer)]
                lg, _ = m.forward(ids[P:P + EVAL], pos0=P, past=past, logits_for=list(range(EVAL)))
                lp = log_softmax(lg.astype(np.float64))
                top = lp.argmax(-1)
                if v == "bf16":
                    bf16_top = top
                res[v]["top1"] += (top == lp_ref[pos].argmax(-1)).tolist()
                res[v]["top1_vs_bf16"] += (top == bf16_top).tolist()
                res[v]["kl"] += (np.exp(lp_ref[pos]) * (lp_ref[pos] - lp)).sum(-1).tolist()
        print(f"{name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    n = len(res["bf16"]["kl"])
    out = {"positions": n, "texts": [s[0] for s in SOURCES], "prefixes": PREFIXES, "eval_tokens": EVAL,
           "reference": "the same model with float32 KV throughout (the full prefill's logits)",
           "results": {}}
    print(f"{n} positions: {len(SOURCES)} texts x prefixes {PREFIXES} x {EVAL} tokens after each")
    print(f"{'prefix KV':14} {'top-1 vs exact':>15} {'top-1 vs bf16':>14} {'mean KL':>10} {'p99 KL':>10} {'max KL':>10}")
    for v in variants:
        r = res[v]
        kl = np.array(r["kl"])
        row = {"top1": float(np.mean(r["top1"])), "top1_vs_bf16": float(np.mean(r["top1_vs_bf16"])),
               "mean_kl": float(kl.mean()), "p99_kl": float(np.quantile(kl, 0.99)), "max_kl": float(kl.max())}
        out["results"][v] = row
        print(f"{v:14} {100 * row['top1']:14.2f}% {100 * row['top1_vs_bf16']:13.2f}% {row['mean_kl']:10.2e} "
              f"{row['p99_kl']:10.2e} {row['max_kl']:10.2e}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
