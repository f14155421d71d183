#!/usr/bin/env python3
"""Builds openinfer._native with THIS interpreter (an engine's venv) against a
build tree and runs the engine tests of this directory.

usage: run_engines.py ENGINE SOURCE_DIR INCLUDE_DIR LIB_DIR OPENINFER_EXE WORK_DIR [pytest args]
       run_engines.py ENGINE --installed WORK_DIR [pytest args]

ENGINE is vllm (test_kvworker.py, test_vllm_connector.py) or sglang (the
sglang/ folder). With --installed nothing is built: the tests use the
openinfer package this interpreter already imports (the wheel installed into
its environment: ./dev wheel-check) and the `openinfer` command beside this
interpreter (the wheel's console script); either missing, or a package that
is not installed in the environment (a source tree on sys.path), is a
failure. Unlike run_tests.py this never skips: a missing engine,
torch, cffi or pytest is a failure (the CI stage must not pass silently
without its engine). Ends with the line .ci/run counts: "N passed, N failed,
N skipped"."""
import os
import shutil
import subprocess
import sys

# Each engine's tests, relative to this directory.
FILES = {"vllm": ["test_kvworker.py", "test_vllm_connector.py", "test_vllm_parallel.py",
                  "test_vllm_plan.py", "test_vllm_hybrid.py"], "sglang": ["sglang"]}


def installed(work):
    """--installed: the environment's own openinfer package and command
    (an error message, or None and the command's path)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH") and not k.startswith("OPENINFER_")}
    r = subprocess.run([sys.executable, "-c", "import openinfer, sys; print(openinfer.__file__); "
                        "print(openinfer.version_string())"], env=env, cwd=work,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        return "import openinfer with %s failed: %s" % (sys.executable, r.stdout[-2000:]), None, env
    where = os.path.realpath(r.stdout.splitlines()[0])
    site = [os.path.realpath(p) for p in sys.path if p.endswith("site-packages")]
    if not any(where.startswith(p + os.sep) for p in site):
        return "openinfer is imported from %s, not from an installed package" % where, None, env
    exe = os.path.join(os.path.dirname(sys.executable), "openinfer")
    if not os.access(exe, os.X_OK):
        return "no openinfer command beside %s (the wheel's console script)" % sys.executable, None, env
    print("run_engines.py: openinfer %s from %s, command %s" % (r.stdout.splitlines()[1], where, exe))
    return None, exe, env


def main():
    engine = sys.argv[1]
    if engine not in FILES:
        print("run_engines.py: unknown engine %r (known: %s)" % (engine, ", ".join(FILES)))
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.argv[2] == "--installed":
        work = os.path.abspath(sys.argv[3])
        pytest_args = sys.argv[4:]
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        err, exe, env = installed(work)
        if err:
            print("FAILED: %s" % err)
            print("0 passed, 1 failed, 0 skipped")
            return 1
        env["OPENINFER_EXE"] = exe
    else:
        src, inc, libdir, exe, work = [os.path.abspath(a) for a in sys.argv[2:7]]
        pytest_args = sys.argv[7:]
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
        env["OPENINFER_PY_SOURCE"] = src
    env["OPENINFER_TINY_MODEL"] = os.path.join(here, "tiny-model")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    junit = os.path.join(work, "junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", work,
           "--junitxml", junit] + [os.path.join(here, f) for f in FILES[engine]] + pytest_args
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
