#!/usr/bin/env python3
"""Runs `cargo test` (unit, integration, doc tests, the bindings regeneration
check) and the example against a build tree, offline.

usage: run_tests.py RUST_DIR INCLUDE_DIR LIB_DIR OPENINFER_EXE TARGET_DIR
Exits 77 (skipped) when cargo is not installed."""
import os
import shutil
import subprocess
import sys


def main():
    src, inc, libdir, exe, target = [os.path.abspath(a) for a in sys.argv[1:6]]
    cargo = shutil.which("cargo")
    if not cargo:
        print("skip: cargo is not installed")
        return 77
    env = dict(os.environ, LIBOPENINFER_DIR=libdir, OPENINFER_INCLUDE_DIR=inc,
               OPENINFER_EXE=exe, CARGO_TARGET_DIR=target, CARGO_NET_OFFLINE="true")
    env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    for cmd in ([cargo, "test", "--offline", "--workspace"],
                [cargo, "run", "--offline", "-p", "openinfer", "--example", "roundtrip"]):
        print("+", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, cwd=src, env=env)
        if r.returncode != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
