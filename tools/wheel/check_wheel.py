#!/usr/bin/env python3
"""The wheel, installed the way a user installs it (./dev wheel-check; a CI stage).

    check_wheel.py WHEEL REPO VENVS TOOLS_PIP

WHEEL is ./dev wheel's output, REPO the checkout (only its tests and the
README's C example are read), VENVS the engines' venvs ($VENVS/vllm,
$VENVS/sglang, made by ./dev), TOOLS_PIP the pip of the wheel tools' venv,
which downloads the wheel's one dependency (cffi, pinned in
tools/wheel/wheelhouse.txt) into a wheelhouse first. Then:

1. the wheel's name (cp39-abi3, manylinux_<this machine's glibc>), size
   (<= 25 MB) and contents (the library, the command, the libraries
   auditwheel copied in; not the CUDA driver, not UCX, not libibverbs);
2. a clean venv (/usr/bin/python3 -m venv, no system site packages):
   pip install --no-index --only-binary :all: --find-links WHEELHOUSE WHEEL,
   in under 10 s: nothing is downloaded and nothing is compiled;
3. from a scratch directory, with no PYTHONPATH, LD_LIBRARY_PATH or
   OPENINFER_* set: `openinfer --version`, `info`, `demo`; a Python round
   trip whose restored bytes are compared and whose process maps
   libopeninfer and the bundled libraries from the venv, nothing from the
   checkout; `openinfer serve` (the console script execs the bundled
   program: same pid) with /healthz answered and a sidecar round trip from
   Python, byte for byte, and `openinfer stats` counting its saves;
4. C: the README's example and docs/bindings.md's round trip compiled with
   `python -m openinfer --cflags --libs`, and with pkg-config on
   `--pkgconfigdir`, run without LD_LIBRARY_PATH;
5. the same wheel in venvs of other CPython versions (python3.12, python3.9,
   when found on PATH or in pyenv: abi3), with their own cffi;
6. the vLLM connector's tests (bindings/python/engines, run_engines.py
   --installed) in a venv holding the wheel, layered on $VENVS/vllm's
   packages (a .pth line), so `kv_connector_module_path="openinfer.vllm"`
   loads the installed package; `import openinfer.sglang` likewise on
   $VENVS/sglang.

Every check prints "ok:" or "FAILED:" and the last line is "N passed, N
failed, N skipped"; a missing engine venv or a failed download fails (only
an absent extra CPython skips). OI_KEEP_TMP=1 keeps the scratch directory."""
import glob
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile

results = []
# The bundled libraries the library and the command load (auditwheel's copies).
BUNDLED = ("libmimalloc", "libxxhash", "liburing", "libhiredis", "libmicrohttpd")
# vLLM connector tests run against the installed wheel (a part of the engines
# stage's suite: the round trips embedded and through the sidecar, sync and
# async, a sidecar restart, the option checks) and the KV worker's tests.
VLLM_TESTS = ("prefix_saved_by_one_request or sidecar_restart or bad_option "
              "or test_kvworker")


def check(name, ok, detail=""):
    results.append(ok)
    print("%s: %s%s" % ("ok" if ok else "FAILED", name, (": " + detail) if detail and not ok else ""),
          flush=True)
    return ok


def skip(name, why):
    results.append(None)
    print("skipped: %s: %s" % (name, why), flush=True)


def run(cmd, env=None, cwd=None, timeout=600, **kw):
    return subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, **kw)


def glibc_tag():
    v = os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # "glibc 2.36"
    return "manylinux_%s_%s" % (v.replace(".", "_"), platform.machine())


def site_packages(venv):
    found = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    return found[0] if found else None


def clean_env(venv, work):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PKG_CONFIG_PATH",
                        "PYTHONHOME", "LIBOPENINFER_DIR") and not k.startswith("OPENINFER_")}
    env["PATH"] = os.path.join(venv, "bin") + ":/usr/bin:/bin"
    env["HOME"] = work
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def make_venv(python, venv, wheel, house, extra_pth=None):
    """venv with the wheel installed offline; (ok, detail, seconds)."""
    r = run([python, "-m", "venv", venv])
    if r.returncode != 0:
        return False, "python -m venv: " + r.stdout[-1500:], 0
    t0 = time.time()
    r = run([os.path.join(venv, "bin", "pip"), "install", "-q", "--no-index", "--only-binary", ":all:",
             "--disable-pip-version-check", "--find-links", house, wheel])
    secs = time.time() - t0
    if r.returncode != 0:
        return False, "pip install --no-index: " + r.stdout[-2000:], secs
    if extra_pth:
        with open(os.path.join(site_packages(venv), "_openinfer_engine_site.pth"), "w") as f:
            f.write(extra_pth + "\n")
    return True, "", secs


def download(tools_pip, req, house, pyver=None):
    """req: a requirements file, or a list of requirements."""
    args = [tools_pip, "download", "-q", "--disable-pip-version-check", "--only-binary", ":all:",
            "-d", house] + (["-r", req] if isinstance(req, str) else list(req))
    if pyver:
        args += ["--python-version", pyver]
    r = run(args, timeout=300)
    return r.returncode == 0, r.stdout[-1500:]


ROUND_TRIP = r'''
import os, sys
import openinfer as oi
kv = bytearray(2 * 8 * 4096)
for i in range(3 * 4096):
    kv[i] = (i * 7 + i // 4096) & 0xFF                 # k's blocks 0..2
arenas = [oi.Arena("k", 8, 4096, offset=0), oi.Arena("v", 8, 4096, offset=8 * 4096)]
hashes = oi.hash_blocks(range(1000, 1048), 16)
with oi.OffloadHost(16 << 20, pin=False) as host, \
        oi.OffloadEngine(host, "wheel-check/fp16", arenas, buffer=kv) as engine:
    engine.save([0, 1, 2], hashes).wait(30)
    q = engine.query(hashes)
    engine.load(q.lease, [5, 6, 7]).wait(30)
assert q.hit_blocks == 3, q.hit_blocks
assert kv[5 * 4096:8 * 4096] == kv[:3 * 4096] and any(kv[5 * 4096:8 * 4096]), "bytes differ"
print("module", oi.__file__)
print("version", oi.version_string())
for line in open("/proc/self/maps"):
    f = line.split()[-1]
    if ".so" in f:
        print("mapped", f)
print("round trip OK")
'''

SIDECAR = r'''
import sys
import openinfer as oi
sock = sys.argv[1]
ns = "wheel-check/sidecar"
arenas = [oi.Arena("k", 8, 4096, offset=0), oi.Arena("v", 8, 4096, offset=8 * 4096)]
hashes = oi.hash_blocks(range(2000, 2048), 16)
pattern = bytes((i * 13 + 5) & 0xFF for i in range(3 * 4096))
e, arena = oi.OffloadEngine.connect(sock, ns, arenas)
with e:
    arena.write(0, pattern)                          # k's blocks 0..2 in the server's arena
    e.save([0, 1, 2], hashes).wait(30)
    e.flush(30)
e2, arena2 = oi.OffloadEngine.connect(sock, ns, arenas)   # a restarted engine
try:
    q = e2.query(hashes)
    assert q.hit_blocks == 3, q.hit_blocks
    e2.load(q.lease, [5, 6, 7]).wait(30)
    got = arena2.read(5 * 4096, 3 * 4096)
    assert got == pattern, "restored bytes differ"
finally:
    arena2.close()
    e2.close()
print("sidecar round trip OK")
'''


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def check_contents(wheel):
    name = os.path.basename(wheel)
    tag = glibc_tag()
    check("the wheel is tagged cp39-abi3 and %s (this machine's glibc)" % tag,
          name.endswith("-cp39-abi3-%s.whl" % tag), name)
    size = os.path.getsize(wheel)
    print("wheel: %s, %d bytes (%.1f MB)" % (name, size, size / 1e6), flush=True)
    check("the wheel is at most 25 MB", size <= 25e6, "%d bytes" % size)
    names = zipfile.ZipFile(wheel).namelist()
    want = ["openinfer/_native.abi3.so", "openinfer/bin/openinfer", "openinfer/lib/libopeninfer.so.0",
            "openinfer/lib/libopeninfer-refmodel.so.0", "openinfer/lib/libopeninfer.so",
            "openinfer/lib/pkgconfig/openinfer.pc", "openinfer/include/openinfer/openinfer.h",
            "openinfer/vllm.py", "openinfer/_vllm_groups.py", "openinfer/sglang.py",
            "openinfer/kvworker.py"]
    missing = [w for w in want if w not in names]
    libs = [os.path.basename(n) for n in names if n.startswith("openinfer.libs/") and not n.endswith("/")]
    missing += [b for b in BUNDLED if not any(lib.startswith(b + "-") for lib in libs)]
    check("the wheel holds the library, the command, the headers and the libraries they load",
          not missing, "missing %s" % missing)
    unwanted = [n for n in names if re.search(r"/lib(cuda|nvidia-|ucp|ucs|uct|ibverbs)[.-]", n)]
    check("the wheel holds no CUDA driver library, no UCX and no libibverbs (the machine's)",
          not unwanted, "%s" % unwanted)
    print("bundled: %s" % ", ".join(sorted(libs)), flush=True)


def check_runpaths(venv):
    """Every ELF file the wheel installed finds its libraries relative to
    itself: RUNPATH entries start with $ORIGIN (no build or staging path)."""
    site = site_packages(venv)
    bad, n = [], 0
    for top in ("openinfer", "openinfer.libs"):
        for dp, _, fs in os.walk(os.path.join(site, top)):
            for f in fs:
                path = os.path.join(dp, f)
                with open(path, "rb") as fh:
                    if fh.read(4) != b"\x7fELF":
                        continue
                n += 1
                out = run(["readelf", "-d", "-W", path]).stdout
                for m in re.finditer(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", out):
                    bad += ["%s: %s" % (os.path.relpath(path, site), e)
                            for e in m.group(1).split(":") if not e.startswith("$ORIGIN")]
    check("the %d ELF files installed have only $ORIGIN-relative RUNPATHs" % n, n > 10 and not bad,
          "; ".join(bad[:5]))


def check_venv_tools(venv, work, repo, version):
    env = clean_env(venv, work)
    exe = os.path.join(venv, "bin", "openinfer")
    r = run([exe, "--version"], env=env, cwd=work)
    check("openinfer --version (the console script)", r.returncode == 0 and version in r.stdout,
          r.stdout[-500:])
    r = run([exe, "info"], env=env, cwd=work)
    check("openinfer info", r.returncode == 0 and "libopeninfer %s" % version in r.stdout,
          r.stdout[-1000:])
    r = run([exe, "demo"], env=env, cwd=work, timeout=300)
    check("openinfer demo (the executor and the reference model, cpu)",
          r.returncode == 0 and "demo OK" in r.stdout, r.stdout[-1500:])
    r = run([os.path.join(venv, "bin", "python"), "-m", "openinfer", "--modversion"], env=env, cwd=work)
    check("python -m openinfer --modversion", r.stdout.strip() == version, r.stdout[-500:])


def check_round_trip(venv, work, repo, label):
    env = clean_env(venv, work)
    script = os.path.join(work, "roundtrip.py")
    with open(script, "w") as f:
        f.write(ROUND_TRIP)
    r = run([os.path.join(venv, "bin", "python"), script], env=env, cwd=work)
    ok = r.returncode == 0 and "round trip OK" in r.stdout
    check("%s: a Python round trip (save, query, load; bytes compared)" % label, ok, r.stdout[-2000:])
    if not ok:
        return
    site = os.path.realpath(site_packages(venv))
    mapped = [line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("mapped ")]
    mod = next(line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("module "))
    problems = []
    if not os.path.realpath(mod).startswith(site + "/openinfer/"):
        problems.append("openinfer imported from %s" % mod)
    ours = [m for m in mapped if os.path.basename(m).startswith(("libopeninfer",) + BUNDLED)]
    for b in ("libopeninfer.so.0", "libopeninfer-refmodel.so.0") + BUNDLED:
        hits = [m for m in ours if os.path.basename(m).startswith(b.split(".so")[0])]
        if not hits:
            problems.append("%s is not loaded" % b)
    for m in ours:
        if not os.path.realpath(m).startswith(site + "/"):
            problems.append("%s is loaded from outside the venv" % m)
    for m in mapped:
        if os.path.realpath(m).startswith(os.path.realpath(repo) + "/"):
            problems.append("%s is loaded from the checkout" % m)
    check("%s: libopeninfer and its libraries are loaded from the installed wheel" % label,
          not problems, "; ".join(problems[:6]))


def check_sidecar(venv, work):
    env = clean_env(venv, work)
    exe = os.path.join(venv, "bin", "openinfer")
    sock = os.path.join(work, "oi.sock")
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w+")
    proc = subprocess.Popen([exe, "serve", "--socket", sock, "--pool", "64M", "--no-pin",
                             "--metrics-addr", "127.0.0.1:%d" % port], env=env, cwd=work,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            log.seek(0)
            text = log.read()
            if "listening on" in text or proc.poll() is not None or time.time() > deadline:
                break
            time.sleep(0.05)
        if not check("openinfer serve starts (the console script)", "listening on" in text, text[-1500:]):
            return
        target = os.path.realpath("/proc/%d/exe" % proc.pid)
        check("the console script execs the bundled program (same pid: signals reach the server)",
              target == os.path.realpath(os.path.join(site_packages(venv), "openinfer", "bin", "openinfer")),
              "pid %d runs %s" % (proc.pid, target))
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=10) as resp:
                health = (resp.status, resp.read().decode(errors="replace"))
        except OSError as e:
            health = (None, str(e))
        check("the server's /healthz answers (libmicrohttpd from the wheel)", health[0] == 200,
              "%s" % (health,))
        script = os.path.join(work, "sidecar.py")
        with open(script, "w") as f:
            f.write(SIDECAR)
        r = run([os.path.join(venv, "bin", "python"), script, sock], env=env, cwd=work)
        check("a sidecar round trip through `openinfer serve` (bytes compared)",
              r.returncode == 0 and "sidecar round trip OK" in r.stdout, r.stdout[-2000:])
        r = run([exe, "stats", "--socket", sock], env=env, cwd=work)
        check("openinfer stats shows the server's saves",
              r.returncode == 0 and "wheel-check/sidecar" in r.stdout, r.stdout[-1500:])
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        check("openinfer serve stops on SIGTERM with status 0", rc == 0, "exit %s" % rc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def check_c(venv, work, repo):
    sys.path.insert(0, os.path.join(repo, "tests", "abi"))
    from test_readme_snippet import extract_snippet
    env = clean_env(venv, work)
    cc = shutil.which("cc")
    if not cc:
        check("C: a compiler to build the examples", False, "cc is not installed")
        return
    py = os.path.join(venv, "bin", "python")
    r = run([py, "-m", "openinfer", "--cflags", "--libs"], env=env, cwd=work)
    flags = r.stdout.split()
    if not check("python -m openinfer --cflags --libs", r.returncode == 0 and "-lopeninfer" in flags,
                 r.stdout[-500:]):
        return
    pcdir = run([py, "-m", "openinfer", "--pkgconfigdir"], env=env, cwd=work).stdout.strip()
    pc = run(["pkg-config", "--cflags", "--libs", "openinfer"], env=dict(env, PKG_CONFIG_PATH=pcdir),
             cwd=work)
    for doc, want, how, fl in (
            ("README.md", "block 1:", "python -m openinfer --cflags --libs", flags),
            ("docs/bindings.md", "bytes identical", "pkg-config on --pkgconfigdir", pc.stdout.split())):
        src = os.path.join(work, os.path.basename(doc) + ".c")
        with open(src, "w") as f:
            f.write(extract_snippet(open(os.path.join(repo, doc)).read())[0])
        app = src[:-2]
        r = run([cc, src, "-o", app] + fl, env=env, cwd=work)
        ok = r.returncode == 0
        if ok:
            r = run([app], env=env, cwd=work)
            ok = r.returncode == 0 and want in r.stdout
        check("C: %s's example built with %s runs without LD_LIBRARY_PATH" % (doc, how), ok,
              r.stdout[-1500:])


def find_python(ver):
    """A CPython ver that runs (a pyenv shim on PATH may name one that is not
    selected: it is tried, not trusted)."""
    cands = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/%s.*/bin/python%s" % (ver, ver))))
    if shutil.which("python" + ver):
        cands.append(shutil.which("python" + ver))
    for cand in cands:
        r = run([cand, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"])
        if r.returncode == 0 and r.stdout.strip() == ver:
            return cand
    return None


def requires_dist(wheel):
    """The wheel's own Requires-Dist lines (its METADATA)."""
    z = zipfile.ZipFile(wheel)
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    return [line.split(":", 1)[1].strip() for line in z.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")]


def main():
    if len(sys.argv) != 5:
        sys.stderr.write(__doc__)
        return 2
    wheel, repo, venvs, tools_pip = [os.path.abspath(a) for a in sys.argv[1:]]
    repo_home = os.environ.get("HOME")
    work = tempfile.mkdtemp(prefix="oi-wheel-check-")
    try:
        run_checks(wheel, repo, venvs, tools_pip, work, repo_home)
    except Exception as e:  # one failure, said plainly
        check("the wheel check", False, "%s: %s" % (type(e).__name__, e))
    finally:
        if any(r is False for r in results) and os.environ.get("OI_KEEP_TMP"):
            print("kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    p = sum(1 for r in results if r)
    f = sum(1 for r in results if r is False)
    s = sum(1 for r in results if r is None)
    print("%d passed, %d failed, %d skipped" % (p, f, s))
    return 1 if f else 0


def engine_tests(venv, work, repo, engine, args):
    """run_engines.py --installed in venv: its pytest counts join this stage's."""
    env = clean_env(venv, work)
    r = run([os.path.join(venv, "bin", "python"), os.path.join(repo, "bindings", "python", "engines",
                                                             "run_engines.py"),
             engine, "--installed", os.path.join(work, "engines-" + engine)] + args,
            env=env, cwd=work, timeout=1500)
    print("\n".join("  " + line for line in r.stdout.splitlines()[-40:]), flush=True)
    m = re.findall(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", r.stdout, re.M)
    if not m:
        check("the %s tests against the installed wheel" % engine, False, "no summary (exit %d)" % r.returncode)
        return
    p, f, s = (int(x) for x in m[-1])
    results.extend([True] * p + [False] * f + [None] * s)
    print("%s tests against the installed wheel: %d passed, %d failed, %d skipped" % (engine, p, f, s))
    if r.returncode != 0 and f == 0:
        check("the %s tests against the installed wheel" % engine, False, "exit %d" % r.returncode)


def run_checks(wheel, repo, venvs, tools_pip, work, repo_home):
    t0 = time.time()
    check_contents(wheel)
    version = os.path.basename(wheel).split("-")[1]
    req = os.path.join(repo, "tools", "wheel", "wheelhouse.txt")
    house = os.path.join(work, "wheelhouse")
    ok, out = download(tools_pip, req, house)
    if not check("the wheelhouse: the wheel's dependencies downloaded as wheels (%s)" % req, ok, out):
        return
    venv = os.path.join(work, "venv")
    ok, out, secs = make_venv("/usr/bin/python3", venv, wheel, house)
    print("install: %.1f s" % secs, flush=True)
    if not check("pip install --no-index --only-binary :all: into a clean venv", ok, out):
        return
    check("the install takes at most 10 s", secs <= 10, "%.1f s" % secs)
    check_runpaths(venv)
    home = os.path.join(work, "home")
    os.makedirs(home)
    check_venv_tools(venv, home, repo, version)
    check_round_trip(venv, home, repo, "python %s" % platform.python_version())
    check_sidecar(venv, home)
    check_c(venv, home, repo)

    # abi3: the same file under other CPython versions
    for ver in ("3.12", "3.9"):
        py = find_python(ver)
        if not py:
            skip("the wheel under python %s (abi3)" % ver, "no python%s on PATH or in pyenv" % ver)
            continue
        # (the wheel's own requirement: the pin of wheelhouse.txt may not
        # exist for that version)
        h = os.path.join(work, "wheelhouse-" + ver)
        ok, out = download(tools_pip, requires_dist(wheel), h, pyver=ver)
        if not check("python %s: its wheelhouse (%s)" % (ver, ", ".join(requires_dist(wheel))), ok, out):
            continue
        v = os.path.join(work, "venv-" + ver)
        ok, out, _ = make_venv(py, v, wheel, h)
        if check("python %s (%s): pip install --no-index of the same wheel" % (ver, py), ok, out):
            check_round_trip(v, home, repo, "python %s" % ver)

    # the engines: the wheel in a venv layered on each engine's packages
    for engine in ("vllm", "sglang"):
        base = os.path.join(venvs, engine)
        base_site = site_packages(base) if os.path.isdir(base) else None
        if not check("the %s venv is there (%s)" % (engine, base), base_site is not None,
                     "./dev engines %s makes it" % engine):
            continue
        cfg = open(os.path.join(base, "pyvenv.cfg")).read()
        py = re.search(r"^executable\s*=\s*(\S+)", cfg, re.M)
        py = py.group(1) if py else "/usr/bin/python3"
        v = os.path.join(work, "venv-" + engine)
        ok, out, _ = make_venv(py, v, wheel, house, extra_pth=base_site)
        if not check("%s: the wheel installed into a venv on %s's packages" % (engine, engine), ok, out):
            continue
        env = clean_env(v, home)
        # openinfer loaded first brings libstdc++ into the process itself; torch
        # (and numpy's C++) then free through it (lib/meson.build, oi_deps)
        r = run([os.path.join(v, "bin", "python"), "-c",
                 "import openinfer, torch, numpy; print(torch.zeros(1000).sum().item())"],
                env=env, cwd=home)
        check("%s: import openinfer, then torch and numpy" % engine,
              r.returncode == 0 and r.stdout.strip().endswith("0.0"), r.stdout[-1500:])
        if engine == "vllm":
            engine_tests(v, home, repo, "vllm", ["-k", VLLM_TESTS])
        else:
            r = run([os.path.join(v, "bin", "python"), "-c",
                     "import openinfer.sglang as s, openinfer; print(s.__file__); "
                     "print(s.OpenInferStorage.__name__ if hasattr(s, 'OpenInferStorage') else "
                     "[n for n in dir(s) if 'Storage' in n])"], env=env, cwd=home)
            site = os.path.realpath(site_packages(v))
            check("import openinfer.sglang (the SGLang storage backend) from the installed wheel",
                  r.returncode == 0 and os.path.realpath(r.stdout.splitlines()[0]).startswith(site + "/"),
                  r.stdout[-1500:])
    print("wheel check: %.0f s" % (time.time() - t0), flush=True)


if __name__ == "__main__":
    sys.exit(main())
