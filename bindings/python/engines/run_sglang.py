#!/usr/bin/env python3
"""Builds openinfer._native with THIS interpreter (the SGLang venv) against a
build tree and runs the SGLang storage tests (bindings/python/engines/sglang).

usage: run_sglang.py SOURCE_DIR INCLUDE_DIR LIB_DIR OPENINFER_EXE WORK_DIR [pytest args]

Never skips: a missing sglang, torch, cffi or pytest is a failure, so the CI
stage cannot pass without its engine. Ends with the line .ci/run counts:
"N passed, N failed, N skipped"."""
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET


def main():
    src, inc, libdir, exe, work = [os.path.abspath(a) for a in sys.argv[1:6]]
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.join(here, "sglang")
    pkg = os.path.join(work, "openinfer")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(pkg)
    for f in os.listdir(os.path.join(src, "openinfer")):
        if f.endswith(".py"):
            shutil.copy(os.path.join(src, "openinfer", f), pkg)
    env = dict(os.environ, OPENINFER_INCLUDE_DIR=inc, OPENINFER_LIB_DIR=libdir)
    r = subprocess.run([sys.executable, os.path.join(pkg, "_build.py"), work], env=env)
    if r.returncode != 0:
        print("FAILED: building openinfer._native with %s" % sys.executable)
        print("0 passed, 1 failed, 0 skipped")
        return 1
    env["PYTHONPATH"] = work
    env["OPENINFER_EXE"] = exe
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    junit = os.path.join(work, "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", work,
           "--junitxml", junit, tests] + sys.argv[6:]
    rc = subprocess.run(cmd, env=env, cwd=work).returncode
    passed = failed = skipped = 0
    try:
        for suite in ET.parse(junit).getroot().iter("testsuite"):
            n = int(suite.get("tests", 0))
            f = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            s = int(suite.get("skipped", 0))
            passed += n - f - s
            failed += f
            skipped += s
    except (OSError, ValueError, ET.ParseError) as e:
        print("run_sglang.py: no pytest report (%s)" % e)
    if rc != 0 and failed == 0:
        failed = 1  # pytest itself failed (collection, no tests, a crash)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
