#!/usr/bin/env python3
"""The openinfer command line: help, version, dispatch, exit codes, demo."""
import os
import re
import subprocess
import sys

from cli_check import check, finish

exe = sys.argv[1]


def run(*args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=100)


p = run("--help")
check(p.returncode == 0 and "usage: openinfer" in p.stdout and "demo" in p.stdout, "--help", p)
p = run("--version")
check(p.returncode == 0 and p.stdout.startswith("openinfer 0.1.0"), "--version", p)
p = run()
check(p.returncode == 2 and "usage" in p.stderr, "no command exits 2 with usage", p)
p = run("frobnicate")
check(p.returncode == 2 and "'frobnicate' is not a command" in p.stderr, "unknown command exits 2", p)
p = run("info")
check(p.returncode == 0 and "libopeninfer 0.1.0" in p.stdout and "RDMA devices (libibverbs)" in p.stdout
      and "locked-memory limit" in p.stdout and "GPUDirect RDMA" in p.stdout, "info", p)
if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
    check("RDMA devices (libibverbs): none." in p.stdout, "info says plainly there is no RDMA device", p)
import json
p = run("info", "--json")
try:
    j = json.loads(p.stdout)
    check(p.returncode == 0 and j["version"].startswith("0.1.0") and isinstance(j["rdma_devices"], list)
          and isinstance(j["gpus"], list), "info --json", p)
except ValueError:
    check(False, "info --json is JSON", p)
# libibverbs is loaded with dlopen: with it unreadable (a mount namespace
# binds /dev/null over it; root only), info still runs and says why it lists
# nothing, and the command did not need it to start.
verbs = os.path.realpath("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
if os.geteuid() == 0 and os.path.exists(verbs) and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0:
    p = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind /dev/null "$1" && exec "$2" info',
                        "sh", verbs, exe], capture_output=True, text=True, timeout=100)
    check(p.returncode == 0 and "RDMA devices (libibverbs): none." in p.stdout
          and "libibverbs.so.1 could not be loaded" in p.stdout,
          "info without a loadable libibverbs runs and says so", p)
p = run("info", "extra")
check(p.returncode == 2 and "unexpected argument" in p.stderr, "info rejects a stray argument", p)
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
# Prefill/decode across two cluster nodes (a private redis-server, two
# `openinfer serve` processes): every prefix restored on the decode node.
import shutil
if shutil.which("redis-server"):
    p = run("demo", "pd", "--prompts", "3", "--prompt-tokens", "200", "--new-tokens", "8")
    check(p.returncode == 0 and "demo OK" in p.stdout, "demo pd", p)
    rows = [l.split() for l in p.stdout.splitlines() if re.match(r"\s+\d+\s+[\d.]+ ms", l)]
    check(len(rows) == 3 and all(r[-1] == "same" and r[-2] == "192/192" for r in rows),
          "demo pd: one row per prompt, the prefix restored across nodes, outputs the same", p)
p = run("demo", "pd", "--prompts", "0")
check(p.returncode == 2 and "--prompts" in p.stderr, "demo pd rejects a bad value", p)
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

# ---- the first hour of a user and an operator (early, clear errors) ----
import os
import tempfile
import time

p = run("--help")
check(all(b in p.stdout for b in ("host", "transfer", "rpc", "ttft", "disk", "remote")), "--help names every benchmark", p)
p = run("bench", "rpc", "--help")
check(p.returncode == 0 and "--json" in p.stdout and "default 20000" in p.stdout,
      "bench rpc --help lists --json and the default of --samples", p)

with tempfile.TemporaryDirectory(prefix="oi-cli-") as d:
    sock = os.path.join(d, "s.sock")
    # A pool larger than the machine is refused at once, pinned or not, with
    # what is available; T is a size suffix.
    for extra in ((), ("--no-pin",)):
        t0 = time.monotonic()
        p = run("serve", "--socket", sock, "--pool", "10T", "--no-metrics", *extra)
        check(p.returncode == 1 and "10240.00 GiB asked for" in p.stderr and "available" in p.stderr
              and time.monotonic() - t0 < 10, f"serve --pool 10T {' '.join(extra)} is refused at once", p)
        check(not os.path.exists(sock), "no socket is left by a refused serve")
    p = run("demo", "tier", "--device", "cpu", "--pool", "10240G")
    check(p.returncode == 1 and "available" in p.stderr, "demo tier --pool 10240G is refused", p)
    p = run("bench", "host", "--batch-bytes", "10240G")
    check(p.returncode == 2 and "available" in p.stderr, "bench host --batch-bytes 10240G is refused at once", p)
    # A pool too small for the demo is refused, not silently raised.
    p = run("demo", "tier", "--device", "cpu", "--pool", "1K")
    check(p.returncode == 2 and "too small" in p.stderr and "demo OK" not in p.stdout,
          "demo tier --pool 1K is refused with the minimum", p)
    # Socket errors come before the pool is set up.
    p = run("serve", "--socket", "", "--pool", "64M", "--no-metrics")
    check(p.returncode == 1 and "socket path is empty" in p.stderr and "pool ready" not in p.stderr,
          "serve --socket '' says the path is empty", p)
    p = run("serve", "--socket", os.path.join(d, "missing", "x.sock"), "--pool", "64M", "--no-metrics")
    check(p.returncode == 1 and "missing" in p.stderr and "pool ready" not in p.stderr,
          "serve on a missing directory fails before the pool", p)
    # --no-pin never says pinning; each ready line is printed once.
    proc = subprocess.Popen([exe, "serve", "--socket", sock, "--pool", "64M", "--no-pin", "--no-metrics"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = ""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "listening on" not in out:
        line = proc.stdout.readline()
        if not line:
            break
        out += line
    proc.terminate()
    out += proc.communicate(timeout=20)[0]
    check("pinning" not in out and "pinned" not in out, f"serve --no-pin never says pinning: {out!r}")
    check(out.count("listening on") == 1 and out.count("pool ready") == 1,
          f"serve prints its ready lines once: {out!r}")

# The bench rpc table's columns line up.
p = run("bench", "rpc", "--samples", "200")
rows = [l for l in p.stdout.splitlines() if re.search(r"\d+\.\d\d\s+\d+\.\d\d", l)]
ends = {m.end() for l in rows for m in [re.search(r"\d+\.\d\d", l)]}
check(p.returncode == 0 and len(rows) == 4 and len(ends) == 1, "bench rpc's p50 column is aligned", p)

finish("test_cli")
