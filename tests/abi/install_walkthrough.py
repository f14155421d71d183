#!/usr/bin/env python3
"""The documented install, run from the documents' own commands.

    install_walkthrough.py SOURCE_DIR        (./dev install-check; CI stage 5)

A new user on a fresh clone, following only docs/building.md, README.md and
docs/bindings.md:

1. copies the repository's files (git ls-files: tracked and untracked, not
   ignored, as they are in the working tree) to TMP/libopeninfer, and, to
   start from a used state, configures build-install/ there for another
   prefix;
2. with HOME=TMP/home and no PKG_CONFIG_PATH, LD_LIBRARY_PATH,
   LIBOPENINFER_DIR or OPENINFER_* set, runs, in one bash (set -euo
   pipefail), every fenced block of docs/building.md, then of README.md,
   then of docs/bindings.md that follows a "<!-- install-test -->" line, each from
   the copy's root; a "<!-- install-test: file PATH -->" line writes the next
   fenced block to PATH (~ is HOME; /path/to/libopeninfer becomes the copy),
   "<!-- install-test: file PATH from DOC -->" writes DOC's C example (the
   block after its "<!-- snippet -->" line);
3. checks what the blocks did: the install under $PREFIX/lib (not the old
   prefix, not the multiarch directory), the installed `openinfer` running
   without LD_LIBRARY_PATH (its RUNPATH, $ORIGIN/../lib) from $PREFIX and
   from a copy of the prefix moved elsewhere, the C program's output, that it
   runs without LD_LIBRARY_PATH, that the static one does not need
   libopeninfer.so, the Python and Rust examples' output and the RUNPATH of
   the Python module and the Rust program;
4. a second pip install of the same tree (its bindings/python/build/ is
   left from the first) against a copy of the library in another directory:
   the module must record and load that one;
5. ./dev gpu-bundle on build-install: every library a bundled program loads
   comes from the bundle but the C/C++ runtimes and the driver's.

pip runs with PIP_NO_INDEX=1 and cargo with CARGO_NET_OFFLINE=true: nothing
is downloaded. Prints one line per check and "N passed, N failed, N skipped";
exits 1 when a check failed. A block that fails is named by its file and line.
OI_KEEP_TMP=1 keeps the scratch directory.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_install import needed_libs  # noqa: E402
from test_readme_snippet import extract_snippet  # noqa: E402

# In this order: README.md's compile line needs building.md's install.
DOCS = ["docs/building.md", "README.md", "docs/bindings.md"]
# A mark is a line of its own.
MARK = re.compile(r"^\s*<!--\s*install-test(?::\s*(.*?))?\s*-->\s*$")
FILE_FROM = re.compile(r"file\s+(\S+)\s+from\s+(\S+)$")
FILE = re.compile(r"file\s+(\S+)$")
CLONE_PLACEHOLDER = "/path/to/libopeninfer"
# What a stock machine has; everything else must come from the bundle.
SYSTEM_LIBS = re.compile(r"^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|"
                         r"libpthread\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libnvidia-)")

results = []


def check(name, ok, detail=""):
    results.append((name, ok))
    print("%s: %s%s" % ("ok" if ok else "FAILED", name, (": " + detail) if detail and not ok else ""),
          flush=True)
    return ok


def skip(name, why):
    results.append((name, None))
    print("skipped: %s: %s" % (name, why), flush=True)


def fenced_block(lines, i, where):
    """The fenced block starting at or after line i: (body, first body line, next i)."""
    while i < len(lines) and not lines[i].strip().startswith("```"):
        if lines[i].strip() and not MARK.match(lines[i]):
            raise ValueError("%s:%d: text between an install-test mark and its block" % (where, i + 1))
        i += 1
    if i == len(lines):
        raise ValueError("%s: an install-test mark has no block after it" % where)
    start = i + 1
    for j in range(start, len(lines)):
        if lines[j].strip() == "```":
            return "\n".join(lines[start:j]) + "\n", start + 1, j + 1
    raise ValueError("%s:%d: the block is not closed" % (where, i + 1))


def parse(src, doc):
    """The steps of one document: ("run", text, line) and ("file", path, text)."""
    where = doc
    lines = open(os.path.join(src, doc)).read().splitlines()
    steps, i = [], 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if not m:
            i += 1
            continue
        arg = (m.group(1) or "").strip()
        if not arg:
            body, line, i = fenced_block(lines, i + 1, where)
            steps.append(("run", body, "%s:%d" % (doc, line)))
            continue
        mf = FILE_FROM.match(arg)
        if mf:
            with open(os.path.join(src, mf.group(2))) as f:
                body, _ = extract_snippet(f.read())
            steps.append(("file", mf.group(1), body))
            i += 1
            continue
        mf = FILE.match(arg)
        if mf:
            body, _, i = fenced_block(lines, i + 1, where)
            steps.append(("file", mf.group(1), body))
            continue
        raise ValueError("%s:%d: unknown install-test mark %r" % (doc, i + 1, arg))
    return steps


def copy_repository(src, dst):
    out = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], stdout=subprocess.PIPE, check=True).stdout
    n = 0
    for rel in sorted(set(p for p in out.decode().split("\0") if p)):
        s = os.path.join(src, rel)
        if not os.path.lexists(s):
            continue  # deleted in the working tree
        d = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        if os.path.islink(s):
            os.symlink(os.readlink(s), d)
        elif os.path.isfile(s):
            shutil.copy2(s, d)
            n += 1
    return n


def runpath(path):
    out = subprocess.run(["readelf", "-d", "-W", path], stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", out)
    return m.group(1).split(":") if m else []


def bash_script(clone, steps, home):
    """One bash program: each "run" step from the clone's root, files written
    before the steps that follow them, "@@step N@@" before each step."""
    out = ["set -euo pipefail"]
    for n, step in enumerate(steps):
        if step[0] == "file":
            path = step[1].replace("~", home, 1) if step[1].startswith("~") \
                else os.path.join(clone, step[1])
            out.append("mkdir -p %s" % shlex.quote(os.path.dirname(path)))
            out.append("cat > %s <<'INSTALL_TEST_EOF'\n%sINSTALL_TEST_EOF"
                       % (shlex.quote(path), step[2].replace(CLONE_PLACEHOLDER, clone)))
        else:
            out.append("echo '@@step %d@@'" % n)
            out.append("cd %s" % shlex.quote(clone))
            out.append(step[1])
    out.append("echo '@@done@@'")
    return "\n".join(out) + "\n"


def split_output(text):
    parts, cur = {}, None
    for line in text.splitlines():
        m = re.fullmatch(r"@@step (\d+)@@", line)
        if m:
            cur = int(m.group(1))
            parts[cur] = []
        elif cur is not None:
            parts[cur].append(line)
    return {k: "\n".join(v) for k, v in parts.items()}


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = os.path.abspath(sys.argv[1])
    for tool in ("git", "meson", "ninja", "pkg-config", "cc", "readelf"):
        if not shutil.which(tool):
            print("skipped: %s is not installed\n0 passed, 0 failed, 1 skipped" % tool)
            return 0
    tmp = tempfile.mkdtemp(prefix="oi-install-walk-")
    try:
        walk(src, tmp)
    except Exception as e:  # a broken document: one failure, said plainly
        check("the walkthrough", False, "%s: %s" % (type(e).__name__, e))
    finally:
        failed = any(ok is False for _, ok in results)
        if failed and os.environ.get("OI_KEEP_TMP"):
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    p = sum(1 for _, ok in results if ok)
    f = sum(1 for _, ok in results if ok is False)
    s = sum(1 for _, ok in results if ok is None)
    print("%d passed, %d failed, %d skipped" % (p, f, s))
    return 1 if f else 0


def walk(src, tmp):
    clone = os.path.join(tmp, "libopeninfer")
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    n = copy_repository(src, clone)
    print("copied %d files to %s" % (n, clone), flush=True)

    steps = []
    for doc in DOCS:
        steps += parse(clone, doc)
    runs = [s for s in steps if s[0] == "run"]
    if not check("the documents mark their install commands",
                 len(runs) >= 4 and any(s[0] == "file" for s in steps),
                 "%d marked blocks" % len(runs)):
        return

    env = {k: v for k, v in os.environ.items()
           if k not in ("PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR",
                        "LD_LIBRARY_PATH", "LIBOPENINFER_DIR", "CARGO_TARGET_DIR",
                        "PYTHONPATH", "VIRTUAL_ENV", "PREFIX")
           and not k.startswith("OPENINFER_")}
    real_home = os.path.expanduser("~")
    # A rustup toolchain lives under the real HOME: keep finding it.
    if os.path.isdir(os.path.join(real_home, ".rustup")):
        env.setdefault("RUSTUP_HOME", os.path.join(real_home, ".rustup"))
    if os.path.isdir(os.path.join(real_home, ".cargo")):
        env.setdefault("CARGO_HOME", os.path.join(real_home, ".cargo"))
    env.update(HOME=home, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               CARGO_NET_OFFLINE="true", PYTHONDONTWRITEBYTECODE="1")
    have_cargo = shutil.which("cargo", path=env.get("PATH")) is not None
    if not have_cargo:
        skip("the Rust example", "cargo is not installed")
        steps = [s for s in steps if not (s[0] == "run" and "cargo " in s[1])
                 and not (s[0] == "file" and "myapp" in s[1])]

    # A used state: build-install/ already configured for another prefix.
    wrong = os.path.join(tmp, "wrong-prefix")
    r = subprocess.run(["meson", "setup", "build-install", "--prefix=" + wrong, "-Dtests=false"],
                       cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    check("set up the used state (build-install/ for another prefix)", r.returncode == 0,
          r.stdout[-2000:])

    script = bash_script(clone, steps, home)
    with open(os.path.join(tmp, "walkthrough.sh"), "w") as f:
        f.write(script)
    print("running %d documented blocks (%s)" % (len([s for s in steps if s[0] == "run"]),
                                                  ", ".join(s[2] for s in steps if s[0] == "run")),
          flush=True)
    r = subprocess.run(["bash", os.path.join(tmp, "walkthrough.sh")], cwd=clone, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=1200)
    out = split_output(r.stdout)
    if r.returncode != 0 or "@@done@@" not in r.stdout:
        last = max(out) if out else None
        where = steps[last][2] if last is not None else "before the first block"
        print(r.stdout[-6000:])
        check("every documented block runs", False,
              "the block at %s exited with status %d" % (where, r.returncode))
        return
    check("every documented block runs", True)

    def output_of(needle):
        """The output of the block whose text contains needle."""
        for k, v in out.items():
            if needle in steps[k][1]:
                return v
        return ""

    prefix = os.path.join(home, "opt", "openinfer")
    lib = os.path.join(prefix, "lib")
    real = os.path.join(lib, "libopeninfer.so.0")
    check("installed into $PREFIX/lib (--libdir=lib), not the old prefix",
          os.path.exists(real) and os.path.exists(os.path.join(lib, "pkgconfig", "openinfer.pc"))
          and os.path.exists(os.path.join(lib, "pkgconfig", "openinfer-static.pc"))
          and not os.path.exists(wrong),
          "%s exists: %s; %s exists: %s" % (real, os.path.exists(real), wrong, os.path.exists(wrong)))

    # The installed command: its RUNPATH finds the prefix's libraries, from
    # any prefix (meson's install_rpath, tools/meson.build)
    plain = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
    exe = os.path.join(prefix, "bin", "openinfer")
    rp = runpath(exe) if os.path.exists(exe) else None
    info = subprocess.run([exe, "info"], env=plain, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True) if rp is not None else None
    check("the installed openinfer runs without LD_LIBRARY_PATH (RUNPATH $ORIGIN/../lib)",
          rp == ["$ORIGIN/../lib"] and info.returncode == 0 and "libopeninfer 0.1.0" in info.stdout,
          "runpath %s; %s" % (rp, info.stdout[-800:] if info else "not installed"))
    info_out = output_of('"$PREFIX/bin/openinfer" info')
    check("building.md's `openinfer info` after the install prints the library",
          "libopeninfer 0.1.0" in info_out, info_out[-800:])
    moved = os.path.join(tmp, "moved-prefix")
    if os.path.isdir(prefix):
        shutil.copytree(prefix, moved, symlinks=True)
    mexe = os.path.join(moved, "bin", "openinfer")
    r = subprocess.run(["ldd", mexe], env=plain, stdout=subprocess.PIPE, universal_newlines=True) \
        if os.path.exists(mexe) else None
    loads = [line.split()[2] for line in (r.stdout.splitlines() if r else [])
             if line.split()[:1] and line.split()[0].startswith("libopeninfer") and "=>" in line]
    v = subprocess.run([mexe, "--version"], env=plain, stdout=subprocess.PIPE,
                       universal_newlines=True) if r else None
    check("the installed tree moved elsewhere: openinfer loads the moved libraries and runs",
          len(loads) == 2 and all(os.path.normpath(x).startswith(moved + "/lib/") for x in loads)
          and v.returncode == 0 and "0.1.0" in v.stdout,
          "loads %s; %s" % (loads, v.stdout if v else "not installed"))

    # C: the README's program, shared (rpath) and static
    app, app_static = os.path.join(home, "app"), os.path.join(home, "app-static")
    readme_out = "\n".join(v for k, v in out.items() if steps[k][2].startswith("README.md"))
    check("README.md's compile line builds a program that runs", "libopeninfer 0.1.0" in readme_out,
          readme_out)
    c_out = output_of("~/app-static")
    check("the C example prints its version and two blocks",
          "libopeninfer 0.1.0" in c_out and c_out.count("block 0:") == 2
          and c_out.count("block 1:") == 2, c_out)
    ok = os.path.exists(app) and subprocess.run([app], env=plain, stdout=subprocess.PIPE).returncode == 0
    needed = needed_libs(app) if os.path.exists(app) else []
    check("the shared C program needs libopeninfer.so.0 and finds it by its RUNPATH",
          ok and "libopeninfer.so.0" in needed and lib in runpath(app),
          "needed %s, runpath %s" % (needed, runpath(app) if os.path.exists(app) else None))
    needed = needed_libs(app_static) if os.path.exists(app_static) else ["(missing)"]
    check("the static C program does not need libopeninfer.so",
          not any(n.startswith("libopeninfer") for n in needed), "needed %s" % needed)

    # Python: the documented install and example
    py_out = output_of("~/example.py")
    check("the Python example restores its blocks", "hits 3 restored True" in py_out, py_out)
    mods = [os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(home, "venv"))
            for f in fs if f.startswith("_native") and f.endswith(".so")]
    check("the Python module records $PREFIX/lib as its RUNPATH",
          len(mods) == 1 and lib in runpath(mods[0]),
          "modules %s, runpath %s" % (mods, runpath(mods[0]) if mods else None))

    # Python again: other variables, same tree (bindings/python/build/ is there)
    other = os.path.join(tmp, "other-lib")
    shutil.copytree(lib, other, symlinks=True)
    target = os.path.join(tmp, "site2")
    env2 = dict(env, OPENINFER_INCLUDE_DIR=os.path.join(prefix, "include"), OPENINFER_LIB_DIR=other)
    r = subprocess.run([os.path.join(home, "venv", "bin", "pip"), "install", "--no-deps", "-q",
                        "--target", target, "./bindings/python"], cwd=clone, env=env2,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    mods = [os.path.join(dp, f) for dp, _, fs in os.walk(target)
            for f in fs if f.startswith("_native") and f.endswith(".so")]
    loaded = ""
    if r.returncode == 0 and mods:
        probe = ("import openinfer, re; print([l.split()[-1] for l in open('/proc/self/maps') "
                 "if 'libopeninfer.so' in l][0])")
        loaded = subprocess.run([os.path.join(home, "venv", "bin", "python"), "-c", probe],
                                env=dict(env, PYTHONPATH=target), cwd=tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, universal_newlines=True).stdout.strip()
    check("a second pip install with other variables rebuilds (no stale build/)",
          r.returncode == 0 and len(mods) == 1 and runpath(mods[0]) == [other]
          and loaded.startswith(other + "/"),
          "pip exit %d %s; runpath %s; loaded %r" % (r.returncode, r.stdout[-1500:],
                                                     runpath(mods[0]) if mods else None, loaded))

    # Rust: the project next to the clone
    if have_cargo:
        rs_out = output_of("cargo run")
        check("the Rust example restores its blocks", "hits 3 restored true" in rs_out, rs_out)
        exe = os.path.join(home, "myapp", "target", "debug", "myapp")
        rp = runpath(exe) if os.path.exists(exe) else None
        ok = rp is not None and lib in rp and subprocess.run(
            [exe], env=plain, stdout=subprocess.PIPE).returncode == 0
        check("the Rust program records $PREFIX/lib as its RUNPATH and runs", ok, "runpath %s" % rp)

    # ./dev gpu-bundle on the installed build
    bundle = os.path.join(tmp, "bundle")
    r = subprocess.run(["./dev", "gpu-bundle", "build-install", bundle], cwd=clone, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    problems = []
    if r.returncode != 0:
        problems.append("exit %d: %s" % (r.returncode, r.stdout[-1500:]))
    else:
        exe = os.path.join(bundle, "tools", "openinfer")
        res = subprocess.run([os.path.join(bundle, "run"), exe, "--version"], env=plain,
                             stdout=subprocess.PIPE, universal_newlines=True)
        if res.returncode != 0 or "0.1.0" not in res.stdout:
            problems.append("run tools/openinfer --version: %d %r" % (res.returncode, res.stdout))
        for dp, _, fs in os.walk(bundle):
            for f in fs:
                path = os.path.join(dp, f)
                if f == "run" or not os.access(path, os.X_OK) and ".so" not in f:
                    continue
                res = subprocess.run([os.path.join(bundle, "run"), "ldd", path], env=plain,
                                     stdout=subprocess.PIPE, universal_newlines=True)
                for line in res.stdout.splitlines():
                    parts = line.split()
                    if len(parts) >= 3 and parts[1] == "=>":
                        if parts[2] == "not":
                            problems.append("%s: %s not found" % (path, parts[0]))
                        elif not parts[2].startswith(bundle + "/") and not SYSTEM_LIBS.match(parts[0]):
                            problems.append("%s loads %s from %s" % (path, parts[0], parts[2]))
    check("./dev gpu-bundle: the bundle's programs load only its libraries and the system's runtimes",
          not problems, "; ".join(problems[:5]))


if __name__ == "__main__":
    sys.exit(main())
