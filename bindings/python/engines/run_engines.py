#!/usr/bin/env python3
"""Builds openinfer._native with THIS interpreter (an engine's venv) against a
build tree and runs the engine tests of this directory.

usage: run_engines.py ENGINE SOURCE_DIR INCLUDE_DIR LIB_DIR OPENINFER_EXE WORK_DIR [pytest args]

ENGINE is vllm (test_kvworker.py, test_vllm_connector.py) or sglang (the
sglang/ folder). Unlike run_tests.py this never skips: a missing engine,
torch, cffi or pytest is a failure (the CI stage must not pass silently
without its engine). Ends with the line .ci/run counts: "N passed, N failed,
N skipped"."""
import os
import shutil
import subprocess
import sys

# Each engine's tests, relative to this directory.
FILES = {"vllm": ["test_kvworker.py", "test_vllm_connector.py", "test_vllm_parallel.py"], "sglang": ["sglang"]}


def main():
    engine = sys.argv[1]
    src, inc, libdir, exe, work = [os.path.abspath(a) for a in sys.argv[2:7]]
    if engine not in FILES:
        print("run_engines.py: unknown engine %r (known: %s)" % (engine, ", ".join(FILES)))
        return 2
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
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = work
    env["OPENINFER_EXE"] = exe
    env["OPENINFER_PY_SOURCE"] = src
    env["OPENINFER_TINY_MODEL"] = os.path.join(here, "tiny-model")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    junit = os.path.join(work, "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", work,
           "--junitxml", junit] + [os.path.join(here, f) for f in FILES[engine]] + sys.argv[7:]
    rc = subprocess.run(cmd, env=env, cwd=work).returncode
    # the closing line .ci/run's stages count: N passed, N failed, N skipped
    passed = failed = skipped = 0
    try:
        import xml.etree.ElementTree as ET
        for suite in ET.parse(junit).getroot().iter("testsuite"):
            n = int(suite.get("tests", 0))
            f = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            s = int(suite.get("skipped", 0))
            passed += n - f - s
            failed += f
            skipped += s
    except (OSError, ValueError, SyntaxError) as e:  # (ET.ParseError is a SyntaxError)
        print("run_engines.py: no pytest report (%s)" % e)
    if rc != 0 and failed == 0:
        failed = 1  # pytest itself failed (collection, no tests, a crash)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
