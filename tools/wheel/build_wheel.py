#!/usr/bin/env python3
"""Builds the openinfer wheel, before auditwheel (./dev wheel runs both).

    build_wheel.py PREFIX PY_SOURCE OUT_DIR

PREFIX is a `meson install` of the library (bin/openinfer, lib/, include/;
./dev wheel installs build-wheel with DESTDIR), PY_SOURCE the Python binding
(bindings/python). Writes OUT_DIR/openinfer-VERSION-cp39-abi3-linux_ARCH.whl
with this layout, a prefix inside the package:

    openinfer/*.py                  the binding (not _build.py, its build script)
    openinfer/_native.abi3.so       the cffi module (out-of-line API mode, the
                                    limited API: one build for CPython >= 3.9),
                                    RUNPATH $ORIGIN/lib
    openinfer/bin/openinfer         the command (RUNPATH $ORIGIN/../lib, meson's
                                    install_rpath), run by the console script
                                    `openinfer` (openinfer._cli)
    openinfer/lib/libopeninfer.so.0, libopeninfer-refmodel.so.0
                                    the libraries, under their SONAME
    openinfer/lib/libopeninfer.so, libopeninfer-refmodel.so
                                    GNU ld scripts (INPUT(...so.0)): a wheel
                                    holds no symlinks, and -lopeninfer needs
                                    a libopeninfer.so
    openinfer/lib/pkgconfig/openinfer.pc   relocatable (${pcfiledir})
    openinfer/include/openinfer/*.h the public headers

auditwheel then copies in the libraries these load that a manylinux system
lacks (openinfer.libs/) and sets the platform tag. The static archive is not
shipped (its dependencies would have to be too)."""
import base64
import csv
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile

PY_TAG = "cp39"  # python_requires >= 3.9; the module uses the limited API (abi3)
LIBS = ["libopeninfer.so.0", "libopeninfer-refmodel.so.0"]


def fail(msg):
    sys.stderr.write("build_wheel.py: %s\n" % msg)
    sys.exit(1)


def pc_version(prefix):
    pc = os.path.join(prefix, "lib", "pkgconfig", "openinfer.pc")
    for line in open(pc):
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    fail("%s has no Version line" % pc)


def stage_package(prefix, py_src, pkg):
    os.makedirs(pkg)
    for f in sorted(os.listdir(os.path.join(py_src, "openinfer"))):
        if f.endswith(".py") and f != "_build.py":
            shutil.copy(os.path.join(py_src, "openinfer", f), pkg)
    os.makedirs(os.path.join(pkg, "bin"))
    exe = os.path.join(prefix, "bin", "openinfer")
    if not os.path.isfile(exe):
        fail("%s is missing (meson install of a build with the tools)" % exe)
    shutil.copy(exe, os.path.join(pkg, "bin", "openinfer"))
    lib = os.path.join(pkg, "lib")
    os.makedirs(os.path.join(lib, "pkgconfig"))
    for so in LIBS:
        src = os.path.join(prefix, "lib", so)
        if not os.path.exists(src):
            fail("%s is missing" % src)
        shutil.copy(os.path.realpath(src), os.path.join(lib, so))
        with open(os.path.join(lib, so[:-2]), "w") as f:
            f.write("/* GNU ld script: -l%s links %s, beside this file (a wheel holds no\n"
                    "   symlinks) */\nINPUT(%s)\n" % (so[3:-5], so, so))
    shutil.copytree(os.path.join(prefix, "include", "openinfer"),
                    os.path.join(pkg, "include", "openinfer"))
    version = pc_version(prefix)
    with open(os.path.join(lib, "pkgconfig", "openinfer.pc"), "w") as f:
        f.write("# libopeninfer as installed by the openinfer wheel: the paths follow\n"
                "# this file wherever pip put the package. Libs records the library\n"
                "# directory as RUNPATH, so a program finds libopeninfer.so.0 there.\n"
                "prefix=${pcfiledir}/../..\nlibdir=${prefix}/lib\nincludedir=${prefix}/include\n\n"
                "Name: openinfer\n"
                "Description: Host-memory tier for the paged KV cache of LLM inference engines\n"
                "URL: https://github.com/openinfer/libopeninfer\n"
                "Version: %s\nLibs: -L${libdir} -Wl,-rpath,${libdir} -lopeninfer\n"
                "Cflags: -I${includedir}\n" % version)
    return version


def build_native(prefix, py_src, pkg, work):
    """openinfer._native against PREFIX, named for the stable ABI."""
    env = dict(os.environ, OPENINFER_INCLUDE_DIR=os.path.join(prefix, "include"),
               OPENINFER_LIB_DIR=os.path.join(prefix, "lib"), OPENINFER_RUNPATH="$ORIGIN/lib")
    code = ("import sys; sys.path.insert(0, %r); import _build; "
            "_build.ffibuilder.compile(tmpdir=%r, target='_native.abi3.so')"
            % (os.path.join(py_src, "openinfer"), work))
    r = subprocess.run([sys.executable, "-c", code], env=env)
    if r.returncode != 0:
        fail("building openinfer._native failed (exit %d)" % r.returncode)
    out = os.path.join(work, "openinfer", "_native.abi3.so")  # (cffi: under the module's package)
    if not os.path.exists(out):
        fail("cffi did not write %s" % out)
    # The limited API: cffi defines Py_LIMITED_API in non-debug builds; a
    # module that used more would need symbols outside the stable ABI, which
    # importing it under another minor version (./dev wheel-check) would show.
    src = open(os.path.join(work, "openinfer", "_native.c")).read()
    if "Py_LIMITED_API" not in src:
        fail("the generated module does not use the limited API")
    shutil.copy(out, os.path.join(pkg, "_native.abi3.so"))
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", os.path.join(pkg, "_native.abi3.so")], check=True)


def record_line(root, rel):
    data = open(os.path.join(root, rel), "rb").read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [rel, "sha256=" + digest, str(len(data))]


def write_dist_info(root, version, tag):
    di = "openinfer-%s.dist-info" % version
    os.makedirs(os.path.join(root, di))
    files = {
        "METADATA": "Metadata-Version: 2.1\nName: openinfer\nVersion: %s\n"
                    "Summary: libopeninfer (host-memory tier for the paged KV cache of LLM "
                    "inference engines): the C library, the openinfer command and the Python "
                    "binding with the vLLM and SGLang connectors\n"
                    "License: Apache-2.0\nRequires-Python: >=3.9\nRequires-Dist: cffi>=1.15\n"
                    % version,
        "WHEEL": "Wheel-Version: 1.0\nGenerator: openinfer tools/wheel/build_wheel.py\n"
                 "Root-Is-Purelib: false\nTag: %s\n" % tag,
        "entry_points.txt": "[console_scripts]\nopeninfer = openinfer._cli:main\n",
        "top_level.txt": "openinfer\n",
    }
    for name, text in files.items():
        with open(os.path.join(root, di, name), "w") as f:
            f.write(text)
    return di


def zip_wheel(root, di, path):
    rels = []
    for dp, dns, fns in os.walk(root):
        dns.sort()
        for fn in sorted(fns):
            rels.append(os.path.relpath(os.path.join(dp, fn), root))
    record = di + "/RECORD"
    rels = [r for r in rels if r != record]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for rel in rels:
        w.writerow(record_line(root, rel))
    w.writerow([record, "", ""])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in rels:
            full = os.path.join(root, rel)
            info = zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (os.stat(full).st_mode & 0o777 | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(full, "rb") as f:
                z.writestr(info, f.read())
        info = zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        z.writestr(info, buf.getvalue(), zipfile.ZIP_DEFLATED)


def main():
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    prefix, py_src, out_dir = [os.path.abspath(a) for a in sys.argv[1:]]
    work = tempfile.mkdtemp(prefix="oi-wheel-")
    try:
        root = os.path.join(work, "root")
        pkg = os.path.join(root, "openinfer")
        version = stage_package(prefix, py_src, pkg)
        build_native(prefix, py_src, pkg, os.path.join(work, "native"))
        tag = "%s-abi3-linux_%s" % (PY_TAG, platform.machine())
        di = write_dist_info(root, version, tag)
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "openinfer-%s-%s.whl" % (version, tag))
        zip_wheel(root, di, path)
        print(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
