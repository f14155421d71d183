#!/usr/bin/env python3
"""The shared library exports exactly the functions the public headers declare.

    test_exported_symbols.py INCLUDE_DIR LIBOPENINFER_SO

Collects every function declared with OI_API in INCLUDE_DIR/openinfer/*.h and
every defined dynamic symbol of the shared library (nm -D --defined-only), and
fails on:
  - a symbol exported but not declared (a leak: an internal or third-party
    symbol escaped the version script),
  - a function declared but not exported (missing),
  - an exported symbol that is not a function, or not versioned OPENINFER_0.1,
  - a SONAME other than libopeninfer.so.0.

Exit 0 pass, 1 fail, 77 skip (binutils missing).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

VERSION_NODE = "OPENINFER_0.1"
SONAME = "libopeninfer.so.0"
# nm types of exported functions: text, weak, indirect (ifunc).
FUNCTION_TYPES = set("TWi")


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def declared_functions(include_dir):
    headers = sorted(glob.glob(os.path.join(include_dir, "openinfer", "*.h")))
    if not headers:
        raise SystemExit("FAIL: no headers under %s/openinfer" % include_dir)
    decls = {}
    for path in headers:
        with open(path) as f:
            src = strip_comments(f.read())
        # Drop preprocessor lines (with continuations): "#define OI_API ...".
        src = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", src, flags=re.M)
        # Split into top-level statements and look at those that use OI_API.
        for stmt in re.split(r"[;{}]", src):
            if not re.search(r"\bOI_API\b", stmt):
                continue
            stmt = " ".join(stmt.split())
            # The declared name is the identifier right before the first '(' of
            # the parameter list: "OI_API const char *oi_status_str(oi_status st)".
            m = re.search(r"\bOI_API\b[^(]*?\b([A-Za-z_]\w*)\s*\(", stmt)
            if not m:
                raise SystemExit("FAIL: cannot parse OI_API declaration in %s: %s" % (path, stmt))
            name = m.group(1)
            if not name.startswith("oi_"):
                raise SystemExit("FAIL: %s declares OI_API %s, which lacks the oi_ prefix"
                                 % (os.path.basename(path), name))
            if name in decls and decls[name] != path:
                raise SystemExit("FAIL: %s is declared in both %s and %s" % (name, decls[name], path))
            decls[name] = path
    return decls


def run(cmd):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True)
    if res.returncode != 0:
        raise SystemExit("FAIL: %s exited %d: %s" % (" ".join(cmd), res.returncode, res.stderr))
    return res.stdout


def exported_symbols(lib):
    """{name: (nm type, version or None, default version?)} of defined dynamic symbols."""
    out = run(["nm", "-D", "--defined-only", lib])
    if "@" not in out:  # older binutils print versions only on request
        out = run(["nm", "-D", "--defined-only", "--with-symbol-versions", lib])
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            _addr, typ, sym = parts
        elif len(parts) == 2:  # no address (absolute/undefined in odd nm versions)
            typ, sym = parts
        else:
            continue
        version, default = None, False
        if "@@" in sym:
            sym, version = sym.split("@@", 1)
            default = True
        elif "@" in sym:
            sym, version = sym.split("@", 1)
        # The version definition itself shows up as an absolute symbol.
        if typ == "A" and sym == VERSION_NODE:
            continue
        syms[sym] = (typ, version, default)
    return syms


def soname(lib):
    if shutil.which("readelf"):
        out = run(["readelf", "-d", "-W", lib])
        m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    else:
        out = run(["objdump", "-p", lib])
        m = re.search(r"^\s*SONAME\s+(\S+)", out, flags=re.M)
    return m.group(1) if m else None


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    include_dir, lib = sys.argv[1], sys.argv[2]
    if not shutil.which("nm") or not (shutil.which("readelf") or shutil.which("objdump")):
        print("SKIP: binutils (nm, readelf/objdump) not found", file=sys.stderr)
        return 77

    decls = declared_functions(include_dir)
    syms = exported_symbols(lib)
    errors = []

    leaked = sorted(set(syms) - set(decls))
    missing = sorted(set(decls) - set(syms))
    for s in leaked:
        errors.append("leak: %s is exported (nm type %s) but not declared with OI_API in the "
                      "public headers" % (s, syms[s][0]))
    for s in missing:
        errors.append("missing: %s is declared in %s but not exported"
                      % (s, os.path.relpath(decls[s], include_dir)))

    for s in sorted(set(syms) & set(decls)):
        typ, version, default = syms[s]
        if typ not in FUNCTION_TYPES:
            errors.append("%s is exported as nm type %s, not as a function" % (s, typ))
        if version != VERSION_NODE:
            errors.append("%s carries version %s, expected %s"
                          % (s, version or "(none)", VERSION_NODE))
        elif not default:
            errors.append("%s@%s is a hidden (non-default) version" % (s, version))

    # The version node itself must be defined.
    vd = run(["readelf", "-V", "-W", lib]) if shutil.which("readelf") else run(["objdump", "-p", lib])
    if VERSION_NODE not in vd:
        errors.append("version node %s is not defined" % VERSION_NODE)

    so = soname(lib)
    if so != SONAME:
        errors.append("SONAME is %s, expected %s" % (so, SONAME))

    print("%d functions declared with OI_API, %d symbols exported, SONAME %s"
          % (len(decls), len(syms), so))
    if errors:
        for e in errors:
            print("FAIL: " + e, file=sys.stderr)
        return 1
    for s in sorted(decls):
        print("ok   %s@@%s" % (s, VERSION_NODE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
