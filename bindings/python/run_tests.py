#!/usr/bin/env python3
"""Builds openinfer._native against a build tree and runs the pytest suite.

usage: run_tests.py SOURCE_DIR INCLUDE_DIR LIB_DIR OPENINFER_EXE WORK_DIR [pytest args]

Exits 77 (skipped) when cffi, pytest or a C compiler is missing."""
import os
import shutil
import subprocess
import sys


def main():
    src, inc, libdir, exe, work = [os.path.abspath(a) for a in sys.argv[1:6]]
    try:
        import cffi  # noqa: F401
        import pytest  # noqa: F401
    except ImportError as e:
        print("skip: %s (install python3-cffi and python3-pytest)" % e)
        return 77
    if not shutil.which(os.environ.get("CC", "cc")):
        print("skip: no C compiler")
        return 77
    pkg = os.path.join(work, "openinfer")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(pkg)
    for f in os.listdir(os.path.join(src, "openinfer")):
        if f.endswith(".py"):
            shutil.copy(os.path.join(src, "openinfer", f), pkg)
    env = dict(os.environ, OPENINFER_INCLUDE_DIR=inc, OPENINFER_LIB_DIR=libdir)
    r = subprocess.run([sys.executable, os.path.join(pkg, "_build.py"), work], env=env)
    if r.returncode != 0:
        print("building openinfer._native failed")
        return 1
    env["PYTHONPATH"] = work
    env["OPENINFER_EXE"] = exe
    env["OPENINFER_PY_SOURCE"] = src
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "--rootdir", work, os.path.join(src, "tests")] + sys.argv[6:]
    return subprocess.run(cmd, env=env, cwd=work).returncode


if __name__ == "__main__":
    sys.exit(main())
