#!/usr/bin/env python3
"""The openinfer command line: help, version, dispatch, exit codes, demo."""
import re
import subprocess
import sys

exe = sys.argv[1]
failures = 0


def run(*args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=100)


def check(cond, what, proc=None):
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)
        if proc is not None:
            print(f"  rc={proc.returncode}\n  stdout={proc.stdout!r}\n  stderr={proc.stderr!r}", file=sys.stderr)


p = run("--help")
check(p.returncode == 0 and "usage: openinfer" in p.stdout and "demo" in p.stdout, "--help", p)
p = run("--version")
check(p.returncode == 0 and p.stdout.startswith("openinfer 0.1.0"), "--version", p)
p = run()
check(p.returncode == 2 and "usage" in p.stderr, "no command exits 2 with usage", p)
p = run("frobnicate")
check(p.returncode == 2 and "'frobnicate' is not a command" in p.stderr, "unknown command exits 2", p)
p = run("demo", "--help")
check(p.returncode == 0 and "--conversations" in p.stdout and "demo tier" in p.stdout, "demo --help", p)
p = run("demo", "--ranks", "zero")
check(p.returncode == 2 and "--ranks" in p.stderr, "demo rejects a bad value", p)
p = run("demo", "extra")
check(p.returncode == 2, "demo rejects a stray argument", p)
# The main job: the executor restores each turn's prefix from the host tier
# and its completions match a cold executor's byte for byte.
p = run("demo", "--ranks", "2", "--conversations", "2", "--turns", "3", "--system-tokens", "48",
        "--turn-tokens", "24", "--new-tokens", "4", "--layers", "2", "--hidden", "64", "--vocab", "512")
check(p.returncode == 0 and "demo OK" in p.stdout and "DIFFERS" not in p.stdout, "executor demo", p)
rows = [l.split() for l in p.stdout.splitlines() if re.match(r"\s+\d+\s+[\d.]+ ms", l)]
check(len(rows) == 3 and all(r[-1] == "same" for r in rows), "one row per turn, outputs the same", p)
check(len(rows) == 3 and all(int(r[-3]) > 0 for r in rows[1:]), "later turns restore tokens from the host tier", p)
p = run("demo", "tier", "--help")
check(p.returncode == 0 and "--ranks" in p.stdout, "demo tier --help", p)
p = run("demo", "tier", "--device", "cpu", "--ranks", "3", "--conversations", "8", "--turns", "3",
        "--layers", "3", "--block-bytes", "4100")
check(p.returncode == 0 and "demo OK" in p.stdout and re.search(r"restored bytes that differ +0\n", p.stdout),
      "demo on cpu", p)
check("blocks evicted" in p.stdout and "restore latency p50" in p.stdout, "demo prints its table", p)
p = run("demo", "tier", "--device", "cpu")
check(p.returncode == 0 and "demo OK" in p.stdout, "demo tier defaults on cpu", p)
p = run("demo", "tier", "--device", "999")
check(p.returncode == 1 and "device 999" in p.stderr, "demo tier on a missing device fails clearly", p)

print("test_cli:", "ok" if failures == 0 else f"{failures} failure(s)")
sys.exit(1 if failures else 0)
