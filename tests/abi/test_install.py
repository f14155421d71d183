#!/usr/bin/env python3
"""Installs the build into a temporary DESTDIR and uses it the way a user does.

    test_install.py MESON BUILD_DIR PREFIX LIBDIR INCLUDEDIR SOURCE_INCLUDE_DIR VERSION

1. meson install -C BUILD_DIR --no-rebuild --destdir TMP
2. checks the installed tree: libopeninfer.so -> libopeninfer.so.0 ->
   libopeninfer.so.VERSION, libopeninfer.a, every public header of
   SOURCE_INCLUDE_DIR/openinfer, and pkgconfig/openinfer.pc;
3. compiles a small program outside the source tree with
   cc $(pkg-config --cflags --libs openinfer) (PKG_CONFIG_PATH and
   PKG_CONFIG_SYSROOT_DIR pointing into TMP), runs it with LD_LIBRARY_PATH at
   the installed lib dir and checks its output;
4. links the same program against libopeninfer.a with
   pkg-config --cflags --libs openinfer-static (the archive's own module:
   with both libraries installed, -lopeninfer would take the .so), checks
   it does not need libopeninfer.so, runs it and compares the output; the
   same with --static added.

(tests/abi/install_walkthrough.py runs the documented install commands
themselves in a scratch copy of the repository: ./dev install-check.)

Exit 0 pass, 1 fail, 77 skip (no C compiler or pkg-config).
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

PROGRAM = r"""
#include <openinfer/openinfer.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  printf("version=%s\n", oi_version_string());
  printf("version_number=%u\n", (unsigned)oi_version());
  printf("header_version_number=%u\n", (unsigned)OI_VERSION_NUMBER);
  printf("status=%s\n", oi_status_str(OI_ERR_TIMEOUT));
  printf("status_unknown=%s\n", oi_status_str(-1000));

  uint32_t tokens[32];
  for (uint32_t i = 0; i < 32; i++) tokens[i] = i * 7919u;
  const char salt[] = "install-test";
  oi_block_hash out[2];
  size_t n = 0;
  oi_status st = oi_hash_blocks(tokens, 32, 16, salt, strlen(salt), NULL, out, 2, &n);
  if (st != OI_OK) {
    fprintf(stderr, "oi_hash_blocks: %s: %s\n", oi_status_str(st), oi_last_error());
    return 1;
  }
  printf("n_out=%zu\n", n);
  for (size_t i = 0; i < n; i++) {
    printf("hash%zu=", i);
    for (size_t j = 0; j < sizeof out[i].bytes; j++) printf("%02x", out[i].bytes[j]);
    printf("\n");
  }
  /* An error path: a message is recorded. */
  st = oi_hash_blocks(tokens, 32, 0, NULL, 0, NULL, out, 2, &n);
  printf("error=%s\n", oi_status_str(st));
  printf("last_error_set=%d\n", oi_last_error()[0] != '\0');
  return 0;
}
"""

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg, file=sys.stderr)


def run(cmd, env=None, check=True, timeout=120):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, env=env, timeout=timeout)
    if check and res.returncode != 0:
        print(res.stdout, file=sys.stderr)
        raise SystemExit("FAIL: %s exited %d" % (" ".join(shlex.quote(c) for c in cmd),
                                                 res.returncode))
    return res


def expected_hashes():
    """The program's two hashes, computed independently (None without xxhash)."""
    try:
        import struct
        import xxhash
    except ImportError:
        return None
    tokens = [(i * 7919) & 0xFFFFFFFF for i in range(32)]
    prev, out = bytes(16), []
    for b in range(2):
        data = prev + struct.pack("<16I", *tokens[b * 16:(b + 1) * 16]) + b"install-test"
        prev = xxhash.xxh3_128_digest(data)
        out.append(prev.hex())
    return out


def check_output(what, text, version):
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    major, minor, patch = (int(x) for x in version.split("."))
    number = str((major << 16) | (minor << 8) | patch)
    if not kv.get("version", "").startswith(version):
        fail("%s: oi_version_string() is %r, expected it to start with %s"
             % (what, kv.get("version"), version))
    if kv.get("version_number") != number or kv.get("header_version_number") != number:
        fail("%s: version numbers %r / %r, expected %s"
             % (what, kv.get("version_number"), kv.get("header_version_number"), number))
    if kv.get("status") != "OI_ERR_TIMEOUT":
        fail("%s: oi_status_str(OI_ERR_TIMEOUT) is %r" % (what, kv.get("status")))
    if kv.get("status_unknown") != "OI_ERR_UNKNOWN":
        fail("%s: oi_status_str(-1000) is %r" % (what, kv.get("status_unknown")))
    if kv.get("n_out") != "2":
        fail("%s: n_out is %r, expected 2" % (what, kv.get("n_out")))
    hashes = [kv.get("hash0"), kv.get("hash1")]
    for h in hashes:
        if not h or not re.fullmatch(r"[0-9a-f]{32}", h):
            fail("%s: bad hash line %r" % (what, h))
    want = expected_hashes()
    if want is not None and hashes != want:
        fail("%s: hashes %s, expected %s" % (what, hashes, want))
    if kv.get("error") != "OI_ERR_INVALID_ARGUMENT" or kv.get("last_error_set") != "1":
        fail("%s: error path gave %r, last_error_set %r"
             % (what, kv.get("error"), kv.get("last_error_set")))
    return hashes


def needed_libs(binary):
    if not shutil.which("readelf"):
        return None
    out = run(["readelf", "-d", "-W", binary]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def main():
    if len(sys.argv) != 8:
        print(__doc__, file=sys.stderr)
        return 2
    meson, build_dir, prefix, libdir, includedir, src_include, version = sys.argv[1:]
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(shlex.split(cc)[0]):
        print("SKIP: no C compiler", file=sys.stderr)
        return 77
    if not shutil.which("pkg-config"):
        print("SKIP: no pkg-config", file=sys.stderr)
        return 77
    cc = shlex.split(cc)

    tmp = tempfile.mkdtemp(prefix="oi-install-test-")
    try:
        return run_checks(meson, build_dir, prefix, libdir, includedir, src_include, version,
                          cc, tmp)
    finally:
        if failures and os.environ.get("OI_KEEP_TMP"):
            print("kept %s" % tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_checks(meson, build_dir, prefix, libdir, includedir, src_include, version, cc, tmp):
    destdir = os.path.join(tmp, "destdir")
    work = os.path.join(tmp, "work")
    os.makedirs(work)

    # 1. install
    res = run([meson, "install", "-C", build_dir, "--no-rebuild", "--destdir", destdir],
              check=False, timeout=300)
    if res.returncode != 0:
        print(res.stdout, file=sys.stderr)
        fail("meson install exited %d" % res.returncode)
        return 1

    def staged(path):
        path = os.path.join(prefix, path)  # an absolute libdir/includedir wins
        return destdir + path

    lib_dir = staged(libdir)
    inc_dir = staged(includedir)
    print("installed into %s (lib %s, include %s)" % (destdir, lib_dir, inc_dir))

    # 2. the installed tree
    real = os.path.join(lib_dir, "libopeninfer.so." + version)
    so0 = os.path.join(lib_dir, "libopeninfer.so.0")
    dev = os.path.join(lib_dir, "libopeninfer.so")
    if not os.path.isfile(real) or os.path.islink(real):
        fail("%s is missing or not a regular file" % real)
    if not os.path.islink(so0):
        fail("%s is missing or not a symlink" % so0)
    elif os.path.realpath(so0) != os.path.realpath(real):
        fail("%s -> %s, expected it to resolve to %s" % (so0, os.readlink(so0), real))
    if not os.path.islink(dev):
        fail("%s is missing or not a symlink" % dev)
    elif os.readlink(dev) != "libopeninfer.so.0" and os.path.realpath(dev) != os.path.realpath(real):
        fail("%s -> %s" % (dev, os.readlink(dev)))
    static_lib = os.path.join(lib_dir, "libopeninfer.a")
    if not os.path.isfile(static_lib):
        fail("%s is missing" % static_lib)
    for name in ("openinfer.pc", "openinfer-static.pc"):
        pc = os.path.join(lib_dir, "pkgconfig", name)
        if not os.path.isfile(pc):
            fail("%s is missing" % pc)
    for hdr in sorted(glob.glob(os.path.join(src_include, "openinfer", "*.h"))):
        inst = os.path.join(inc_dir, "openinfer", os.path.basename(hdr))
        if not os.path.isfile(inst):
            fail("public header %s is not installed (%s)" % (os.path.basename(hdr), inst))
        else:
            with open(hdr, "rb") as a, open(inst, "rb") as b:
                if a.read() != b.read():
                    fail("installed %s differs from the source" % inst)
    if failures:
        return 1

    # 3. a user's program, linked against the shared library
    prog = os.path.join(work, "user.c")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    env = dict(os.environ)
    env.pop("PKG_CONFIG_LIBDIR", None)
    env["PKG_CONFIG_PATH"] = os.path.join(lib_dir, "pkgconfig")
    env["PKG_CONFIG_SYSROOT_DIR"] = destdir
    modversion = run(["pkg-config", "--modversion", "openinfer"], env=env).stdout.strip()
    if modversion != version:
        fail("pkg-config --modversion openinfer is %s, expected %s" % (modversion, version))
    flags = shlex.split(run(["pkg-config", "--cflags", "--libs", "openinfer"], env=env).stdout)
    print("pkg-config --cflags --libs openinfer: %s" % " ".join(flags))
    strict = ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
    exe = os.path.join(work, "user-shared")
    run(cc + strict + ["-o", exe, prog] + flags, env=env)
    needed = needed_libs(exe)
    if needed is not None and "libopeninfer.so.0" not in needed:
        fail("the shared build does not need libopeninfer.so.0 (NEEDED: %s)" % needed)
    run_env = dict(os.environ)
    run_env["LD_LIBRARY_PATH"] = lib_dir
    # What the dynamic loader resolves (ldd's mechanism): the installed copy,
    # not the build tree's.
    trace_env = dict(run_env, LD_TRACE_LOADED_OBJECTS="1")
    trace = run([exe], env=trace_env, check=False).stdout
    m = re.search(r"libopeninfer\.so\.0 => (\S+)", trace)
    if not m or os.path.realpath(m.group(1)) != os.path.realpath(real):
        fail("the shared program loads %s, expected %s"
             % (m.group(1) if m else "(nothing)", real))
    res = run([exe], env=run_env, check=False)
    print("shared program output:\n" + res.stdout)
    if res.returncode != 0:
        fail("the shared program exited %d" % res.returncode)
        return 1
    shared_hashes = check_output("shared", res.stdout, version)

    # 4. the same program linked statically against libopeninfer.a, through
    # openinfer-static.pc (with and without --static). pkg-config prepends
    # the sysroot to the -I/-L flags of every package, also to those that
    # point outside the install (the CUDA toolkit, system libraries): such a
    # path, when it does not exist under the DESTDIR, is taken without it.
    for query in (["--cflags", "--libs"], ["--static", "--cflags", "--libs"]):
        what = "pkg-config %s openinfer-static" % " ".join(query)
        raw = shlex.split(run(["pkg-config"] + query + ["openinfer-static"], env=env).stdout)
        print("%s: %s" % (what, " ".join(raw)))
        sflags = []
        for f in raw:
            flag, path = f[:2], f[2:]
            if flag in ("-I", "-L") and path.startswith(destdir + "/") and not os.path.isdir(path):
                outside = path[len(destdir):]
                if not os.path.isdir(outside):
                    continue  # exists nowhere: drop it
                f = flag + outside
            sflags.append(f)
        if "-lopeninfer" in sflags or "-l:libopeninfer.a" not in sflags:
            fail("%s does not name the archive (-l:libopeninfer.a)" % what)
            return 1
        sexe = os.path.join(work, "user-static")
        res = run(cc + strict + ["-o", sexe, prog] + sflags, env=env, check=False)
        if res.returncode != 0:
            print(res.stdout, file=sys.stderr)
            fail("linking with %s failed" % what)
            return 1
        needed = needed_libs(sexe)
        if needed is not None and any(n.startswith("libopeninfer") for n in needed):
            fail("the program linked with %s still needs %s" % (what, needed))
        res = run([sexe], check=False)  # no LD_LIBRARY_PATH: nothing of ours to find
        print("static program output (%s):\n%s" % (what, res.stdout))
        if res.returncode != 0:
            fail("the static program (%s) exited %d" % (what, res.returncode))
            return 1
        static_hashes = check_output("static", res.stdout, version)
        if static_hashes != shared_hashes:
            fail("static and shared builds disagree: %s vs %s" % (static_hashes, shared_hashes))

    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
