#!/usr/bin/env python3
"""openinfer bench: dispatch and exit codes, and `bench host --quick --json`
produces one JSON line whose figures exist, are positive and agree."""
import json
import math
import subprocess
import sys

exe = sys.argv[1]
failures = 0


def run(*args, timeout=100):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def check(cond, what, proc=None):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)
        if proc is not None:
            print(f"  rc={proc.returncode}\n  stdout={proc.stdout!r}\n  stderr={proc.stderr[-4000:]!r}",
                  file=sys.stderr)


def close(a, b, rel=0.01, abs_=1e-3):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


p = run("--help")
check(p.returncode == 0 and "bench" in p.stdout, "top-level help lists bench", p)
p = run("bench")
check(p.returncode == 2 and "usage: openinfer bench" in p.stderr, "bench alone exits 2 with usage", p)
p = run("bench", "nope")
check(p.returncode == 2 and "'nope' is not a benchmark" in p.stderr, "unknown benchmark exits 2", p)
p = run("bench", "--help")
check(p.returncode == 0 and "host" in p.stdout, "bench --help", p)
p = run("bench", "host", "--help")
check(p.returncode == 0 and all(o in p.stdout for o in ("--index-blocks", "--batch-bytes", "--quick", "--json")),
      "bench host --help documents its options", p)
p = run("bench", "host", "--index-blocks", "lots")
check(p.returncode == 2 and "--index-blocks" in p.stderr, "bench host rejects a bad count", p)
p = run("bench", "host", "--batch-bytes", "1K")
check(p.returncode == 2 and "--batch-bytes" in p.stderr, "bench host rejects a tiny batch", p)
p = run("bench", "host", "--frobnicate")
check(p.returncode == 2, "bench host rejects an unknown option", p)
p = run("bench", "host", "extra")
check(p.returncode == 2, "bench host rejects a stray argument", p)

p = run("bench", "host", "--quick", "--json", timeout=280)
check(p.returncode == 0, "bench host --quick --json runs", p)
lines = [l for l in p.stdout.splitlines() if l.strip()]
check(len(lines) == 1, "exactly one line on stdout", p)
r = {}
try:
    r = json.loads(lines[0]) if lines else {}
except ValueError as e:
    check(False, f"stdout is JSON ({e})", p)
check("filling index:" in p.stderr and "%" in p.stderr, "fill progress on stderr", p)

positive = [
    "cpus", "index_blocks", "index_block_bytes", "index_fill_s", "index_fill_blocks_per_s",
    "index_lookups", "index_lookups_per_s", "index_overhead_bytes_per_block", "index_record_bytes",
    "index_slots_carved", "index_buckets", "index_bucket_bytes", "index_shards", "query_blocks", "query_samples",
    "save_call_blocks", "save_block_bytes", "save_samples", "batch_bytes", "batch_blocks",
    "batch_arenas", "batch_arena_block_bytes", "batch_save_gbps", "batch_load_gbps",
    "memcpy_to_host_gbps", "memcpy_from_host_gbps", "memcpy_pieces_to_host_gbps",
    "memcpy_pieces_from_host_gbps", "save_ratio", "load_ratio",
]
for name in ("query_hit_run", "query_hit_scattered", "query_miss", "query_membership_miss",
             "save_enqueue_idle", "save_enqueue_burst"):
    positive += [f"{name}_p50_us", f"{name}_p99_us"]
if r:
    check(r.get("bench") == "host" and r.get("quick") is True and r.get("backend") == "cpu",
          f"identity fields: {r.get('bench')!r} {r.get('quick')!r} {r.get('backend')!r}")
    for k in positive:
        v = r.get(k)
        check(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
              f"{k} is a positive number (got {v!r})")
    if all(isinstance(r.get(k), (int, float)) and r.get(k) > 0 for k in positive):
        check(r["index_blocks"] == 200000, f"--quick indexes 200000 blocks (got {r['index_blocks']})")
        check(r["batch_bytes"] == 64 << 20, f"--quick batch is 64 MiB (got {r['batch_bytes']})")
        check(r["query_blocks"] == 64 and r["save_call_blocks"] == 64, "calls of 64 hashes / blocks")
        check(r["batch_bytes"] == r["batch_blocks"] * r["batch_arenas"] * r["batch_arena_block_bytes"],
              "batch bytes = blocks x arenas x slice")
        check(close(r["save_ratio"], r["batch_save_gbps"] / r["memcpy_to_host_gbps"]),
              f"save_ratio {r['save_ratio']} == save / memcpy "
              f"{r['batch_save_gbps'] / r['memcpy_to_host_gbps']:.4f}")
        check(close(r["load_ratio"], r["batch_load_gbps"] / r["memcpy_from_host_gbps"]),
              f"load_ratio {r['load_ratio']} == load / memcpy "
              f"{r['batch_load_gbps'] / r['memcpy_from_host_gbps']:.4f}")
        check(close(r["index_fill_blocks_per_s"], r["index_blocks"] / r["index_fill_s"], rel=0.01, abs_=1),
              "fill rate = blocks / seconds")
        check(r["index_slots_carved"] >= r["index_blocks"], "at least one carved slot per resident block")
        # The overhead figure is its definition applied to the reported parts.
        want = (r["index_record_bytes"] * r["index_slots_carved"] + r["index_bucket_bytes"] * r["index_buckets"]) / r["index_blocks"]
        check(close(r["index_overhead_bytes_per_block"], want),
              f"overhead {r['index_overhead_bytes_per_block']} == (records + buckets) / blocks {want:.3f}")
        for name in ("query_hit_run", "query_hit_scattered", "query_miss", "query_membership_miss",
                     "save_enqueue_idle", "save_enqueue_burst"):
            check(r[f"{name}_p50_us"] <= r[f"{name}_p99_us"], f"{name}: p50 <= p99")
        t = r.get("targets", {})
        passes = r.get("pass", {})
        check(isinstance(passes, dict) and len(passes) == 10 and all(isinstance(v, bool) for v in passes.values()),
              f"pass holds 10 verdicts (got {passes!r})")
        if isinstance(passes, dict) and t:
            check(passes.get("index_lookups") == (r["index_lookups_per_s"] >= t["index_lookups_per_s"]),
                  "lookup verdict agrees with the figure")
            check(passes.get("index_overhead") == (r["index_overhead_bytes_per_block"] <= t["index_overhead_bytes_per_block"]),
                  "overhead verdict agrees with the figure")
            check(passes.get("batch_save") == (r["batch_save_gbps"] / r["memcpy_to_host_gbps"] >= t["batch_ratio"]),
                  "batch save verdict agrees with the figures")

# bench rpc: a real in-process server; the socket round trip costs more than
# the embedded call, and both figures are ordered.
p = subprocess.run([exe, "bench", "rpc", "--samples", "300", "--json"], capture_output=True, text=True, timeout=120)
check(p.returncode == 0, f"bench rpc exits 0 (rc={p.returncode}, stderr={p.stderr[-400:]!r})")
if p.returncode == 0:
    lines = [l for l in p.stdout.splitlines() if l.strip()]
    check(len(lines) == 1, "bench rpc --json prints one line")
    r = json.loads(lines[-1])
    for k in ("query_local", "query_rpc", "save_local", "save_rpc"):
        check(0 < r[f"{k}_p50_us"] <= r[f"{k}_p99_us"], f"rpc {k}: 0 < p50 <= p99")
    check(r["query_rpc_p50_us"] > r["query_local_p50_us"], "a socket round trip costs more than an in-process query")
    check(r["query_rpc_target_met"] == (r["query_rpc_p50_us"] <= 30 and r["query_rpc_p99_us"] <= 100),
          "rpc verdict agrees with the figures")

print("test_bench:", "ok" if failures == 0 else f"{failures} failure(s)")
sys.exit(1 if failures else 0)
