#!/usr/bin/env python3
"""The vectorised calls of the Python binding against the old per-block path,
measured in the same run on the cpu backend:

* hashing a 128K-token prompt (16-token blocks: 8,192 hashes), target <= 1 ms;
* a membership query of 8,192 hashes (half of them present), target <= 0.5 ms.

The baseline is the binding's previous implementation (kept below as
``legacy_*``): tokens copied into a cdata array one by one, hashes sliced
and copied one by one, results built as Python lists. The vectorised calls
hand cffi the caller's buffers (``ffi.from_buffer``) and return buffers.

usage: bench_vectorised.py [--reps N] [--check]
  (with PYTHONPATH pointing at a built openinfer package, as run_tests.py
  arranges). --check exits 1 when a vectorised figure misses its target.
Each figure is the best of N runs (and the median in brackets), in ms."""
import argparse
import array
import os
import statistics
import sys
import time

if __name__ == "__main__":
    # This folder holds the package's sources, without the built module: take
    # openinfer from PYTHONPATH or the installed one instead.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import openinfer as oi  # noqa: E402
from openinfer._native import ffi, lib  # noqa: E402

TOKENS = 128 * 1024
BLOCK = 16
MEMBERSHIP = 8192
HASH_TARGET_MS = 1.0
MEMBERSHIP_TARGET_MS = 0.5

# --------------------------------------------------------------------------- the old path


def legacy_hash_blocks(tokens, block_size, salt=b"", parent=None):
    """The binding's previous hash_blocks: one Python step per token and per hash."""
    tokens = list(tokens)
    toks = ffi.new("uint32_t[]", max(len(tokens), 1))
    for i, t in enumerate(tokens):
        toks[i] = t
    cap = len(tokens) // block_size if block_size > 0 else 0
    out = ffi.new("oi_block_hash[]", max(cap, 1))
    n_out = ffi.new("size_t *")
    par = ffi.NULL
    if parent is not None:
        par = ffi.new("oi_block_hash *")
        ffi.memmove(par.bytes, bytes(parent), 16)
    salt = bytes(salt)
    st = lib.oi_hash_blocks(toks, len(tokens), block_size, salt if salt else ffi.NULL,
                            len(salt), par, out, cap, n_out)
    if st < 0:
        raise oi.Error("oi_hash_blocks failed", st)
    return [bytes(ffi.buffer(out[i].bytes, 16)) for i in range(n_out[0])]


def legacy_hash_array(hashes):
    """The binding's previous conversion of hashes: one memmove per hash."""
    if isinstance(hashes, (bytes, bytearray, memoryview)) and len(hashes) % 16 == 0 \
            and len(hashes) != 16:
        raw = bytes(hashes)
        hashes = [raw[i:i + 16] for i in range(0, len(raw), 16)]
    n = len(hashes)
    arr = ffi.new("oi_block_hash[]", max(n, 1))
    for i, h in enumerate(hashes):
        ffi.memmove(arr[i].bytes, bytes(h), 16)
    return arr, n


def legacy_membership(engine, hashes):
    """The binding's previous query(hashes, membership=True): a list of bools."""
    hs, n = legacy_hash_array(hashes)
    r = ffi.new("oi_query_result *")
    r.struct_size = ffi.sizeof("oi_query_result")
    present = ffi.new("uint8_t[]", max(n, 1))
    r.present = present
    st = lib.oi_engine_query(engine._p(), ffi.NULL, hs, n, lib.OI_QUERY_MEMBERSHIP, r)
    if st < 0:
        raise oi.Error("query failed", st)
    return [bool(present[i]) for i in range(n)]


# --------------------------------------------------------------------------- measuring


def timed(fn, reps):
    """(best, median) wall time of fn() in ms over reps runs, and its last result."""
    times = []
    result = None
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        result = fn()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return min(times), statistics.median(times), result


class Setup:
    """A prompt of TOKENS tokens and an engine whose host tier holds every
    other one of MEMBERSHIP hashes."""

    def __init__(self):
        self.tokens_list = [(i * 2654435761 >> 7) % 151936 for i in range(TOKENS)]
        self.tokens = array.array("I", self.tokens_list)
        self.host = oi.OffloadHost(16 << 20)
        self.kv = bytearray(MEMBERSHIP * 64)
        self.engine = oi.OffloadEngine(self.host, "bench/vectorised",
                                       [oi.Arena("k", MEMBERSHIP, 64)], buffer=self.kv)
        self.hashes = oi.hash_blocks_buffer(self.tokens, BLOCK)  # 8,192 hashes
        assert len(self.hashes) == MEMBERSHIP
        ids = array.array("q", range(0, MEMBERSHIP, 2))
        self.engine.save(ids, self.hashes[::2]).wait(30)
        self.engine.flush(30)
        self.hashes_bytes = self.hashes.tobytes()
        self.hashes_list = self.hashes.tolist()

    def close(self):
        self.engine.close()
        self.host.close()


def run(reps=50, setup=None):
    """Measures every figure; returns a dict of name -> (best_ms, median_ms)
    and the results of both paths (for the byte-for-byte check)."""
    own = setup is None
    s = setup or Setup()
    try:
        fig, res = {}, {}
        out = bytearray(16 * MEMBERSHIP)
        present = bytearray(MEMBERSHIP)
        cases = [
            ("hash 128K tokens: hash_blocks_buffer(array('I'))",
             lambda: oi.hash_blocks_buffer(s.tokens, BLOCK)),
            ("hash 128K tokens: hash_blocks_buffer(array('I'), out=)",
             lambda: oi.hash_blocks_buffer(s.tokens, BLOCK, out=out)),
            ("hash 128K tokens: hash_blocks(list) (list wrapper)",
             lambda: oi.hash_blocks(s.tokens_list, BLOCK)),
            ("hash 128K tokens: old per-block path (baseline)",
             lambda: legacy_hash_blocks(s.tokens_list, BLOCK)),
            ("membership 8192: query_membership(BlockHashes)",
             lambda: s.engine.query_membership(s.hashes)),
            ("membership 8192: query_membership(bytes, out=)",
             lambda: s.engine.query_membership(s.hashes_bytes, out=present)),
            ("membership 8192: query(list, membership=True) (list wrapper)",
             lambda: s.engine.query(s.hashes_list, membership=True).present),
            ("membership 8192: old per-block path (baseline)",
             lambda: legacy_membership(s.engine, s.hashes_list)),
        ]
        for name, fn in cases:
            best, median, result = timed(fn, reps)
            fig[name] = (best, median)
            res[name] = result
        return fig, res
    finally:
        if own:
            s.close()


def targets(fig):
    """(hash_ms, membership_ms): the best vectorised figures against the targets."""
    h = fig["hash 128K tokens: hash_blocks_buffer(array('I'))"][0]
    m = fig["membership 8192: query_membership(BlockHashes)"][0]
    return h, m


def report(fig, out=None):
    out = out or sys.stdout
    width = max(len(k) for k in fig)
    for k, (best, median) in fig.items():
        print("%-*s %8.3f ms  [%8.3f]" % (width, k, best, median), file=out)
    h, m = targets(fig)
    hb = fig["hash 128K tokens: old per-block path (baseline)"][0]
    mb = fig["membership 8192: old per-block path (baseline)"][0]
    print("hash: %.3f ms (target <= %.1f ms, %.0fx faster than the old path); "
          "membership: %.3f ms (target <= %.1f ms, %.0fx faster)"
          % (h, HASH_TARGET_MS, hb / h, m, MEMBERSHIP_TARGET_MS, mb / m), file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a vectorised figure misses its target")
    a = ap.parse_args()
    print("libopeninfer", oi.version_string(), "- cpu backend, best of %d [median]" % a.reps)
    fig, res = run(a.reps)
    report(fig)
    vals = list(res.values())
    same = (vals[0] == vals[3] and vals[2] == vals[3] and bytes(vals[1]) == bytes(vals[0])
            and list(map(bool, vals[4])) == vals[7] and vals[6] == vals[7])
    print("results equal to the old path's:", same)
    h, m = targets(fig)
    if not same or (a.check and (h > HASH_TARGET_MS or m > MEMBERSHIP_TARGET_MS)):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
