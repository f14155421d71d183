#!/usr/bin/env python3
"""The committed real-KV corpus is what its manifest says (tools/kvcorpus/generate.py):
its sha256 and length, one page per entry in per-layer order with every layer present,
pages of finite bf16 values, K and V not identical, no page repeated.

    test_corpus_manifest.py CORPUS_DIR
"""
import hashlib
import json
import os
import sys

import numpy as np


def main():
    d = sys.argv[1]
    man = json.load(open(os.path.join(d, "manifest.json")))
    blob = open(os.path.join(d, man["layout"]["file"]), "rb").read()
    fails = []
    if hashlib.sha256(blob).hexdigest() != man["sha256"]:
        fails.append("kv.bin's sha256 is not the manifest's")
    if len(blob) != man["bytes"] or len(blob) > 4 * 1024 * 1024:
        fails.append(f"kv.bin is {len(blob)} bytes (manifest {man['bytes']}, limit 4 MiB)")
    mo, lay = man["model"], man["layout"]
    page = 2 * lay["block_tokens"] * mo["kv_heads"] * mo["head_dim"] * 2
    if page != lay["page_bytes"] or len(blob) != page * len(man["pages"]) or lay["pages"] != len(man["pages"]):
        fails.append("pages and bytes disagree")
    layers = [p["layer"] for p in man["pages"]]
    if layers != sorted(layers) or set(layers) != set(range(mo["layers"])):
        fails.append("pages are not in per-layer order with every layer present")
    if [p["offset"] for p in man["pages"]] != [i * page for i in range(len(man["pages"]))]:
        fails.append("page offsets are not consecutive")
    if len({(p["text"], p["block"]) for p in man["pages"]}) != len(man["pages"]):
        fails.append("a block appears twice")
    x = np.frombuffer(blob, "<u2").reshape(len(man["pages"]), 2, -1)
    if np.any((x & 0x7F80) == 0x7F80):
        fails.append("a non-finite bf16 value")
    if np.any(np.all(x[:, 0] == x[:, 1], axis=1)) or np.any(np.all(x == 0, axis=2)):
        fails.append("a page whose K equals its V, or an all-zero half")
    if len({bytes(p) for p in x}) != len(x):
        fails.append("two identical pages")
    for f in fails:
        print("FAIL:", f)
    print(f"corpus: {len(man['pages'])} pages of {page} B, {len(blob)} B, {len(man['texts'])} texts, "
          f"{mo['name']}: {'ok' if not fails else 'FAILED'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
