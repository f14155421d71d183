#!/usr/bin/env python3
"""The docs name what the code has (docs/architecture.md, "The ABI fence").

    test_docs.py SOURCE_ROOT

Fails when:
  - a public header of include/openinfer/ (but experimental.h, behind
    OI_EXPERIMENTAL) is not named in docs/architecture.md's list of the
    stable headers (the section "The ABI fence"), or that list names a
    header that does not exist;
  - the layers docs/architecture.md says include experimental.h (the
    backticked folders after "`experimental.h` is included by", up to the
    next parenthesis) are not
    EXPERIMENTAL_USERS of tests/abi/test_layers.py;
  - a `lib/...` path named in docs/*.md does not exist (a glob such as
    lib/engine/remote_*.c must match a file; paths with <placeholders> and
    install-tree paths such as lib/libopeninfer.so.0 are not source paths);
  - an oi_/oi__ name in docs/*.md occurs nowhere in the sources (lib/,
    include/, kernels/, tools/, bindings/, tests/, fuzz/); a name ending in
    `_` or followed by `*` is a prefix.

Exit 0 pass, 1 fail.
"""
import glob
import os
import re
import sys

SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".map", ".build", ".proto", ".options", ".txt")
SOURCE_DIRS = ("lib", "include", "kernels", "tools", "bindings", "tests", "fuzz")
SOURCE_FILE = re.compile(r"\.(c|h|cu|cuh|py|rs|map|build|sh|proto|toml|pyi)$")
LIB_PATH = re.compile(r"(?<![\w/$.~-])(lib/[\w.*/-]+)")
OI_NAME = re.compile(r"\b(oi_{1,2}[A-Za-z0-9_]+)(\*?)")


def stable_headers(root):
    out = set()
    for p in glob.glob(os.path.join(root, "include", "openinfer", "*.h")):
        name = os.path.basename(p)
        if name.startswith("experimental"):
            continue
        out.add(name)
    return out


def section(text, title):
    m = re.search(r"^## " + re.escape(title) + r"\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else None


def experimental_users(root):
    sys.dont_write_bytecode = True  # (nothing written into the source tree)
    sys.path.insert(0, os.path.join(root, "tests", "abi"))
    import test_layers  # noqa: E402  (the table the layers test enforces)
    return set(test_layers.EXPERIMENTAL_USERS)


def check_architecture(root, errors):
    path = os.path.join(root, "docs", "architecture.md")
    text = open(path).read()
    fence = section(text, "The ABI fence")
    if fence is None:
        errors.append("docs/architecture.md has no section \"The ABI fence\"")
        return
    m = re.search(r"the stable headers \((.*?)\):", fence, re.S)
    if not m:
        errors.append("docs/architecture.md, \"The ABI fence\": no list \"the stable headers (...):\"")
        return
    listed = set(re.findall(r"`([\w.-]+\.h)`", m.group(1)))
    have = stable_headers(root)
    for h in sorted(have - listed):
        errors.append("include/openinfer/%s is not listed among the stable headers in "
                      "docs/architecture.md (\"The ABI fence\")" % h)
    for h in sorted(listed - have):
        errors.append("docs/architecture.md lists the stable header %s, which "
                      "include/openinfer/ does not have" % h)
    m = re.search(r"`experimental\.h` is included by([^(]*)\(", text, re.S)
    if not m:
        errors.append("docs/architecture.md does not say which layers include experimental.h "
                      "(\"`experimental.h` is included by ... `a`, `b` and `c` (...\")")
        return
    said = set(re.findall(r"`([\w/]+)`", m.group(1)))
    allowed = experimental_users(root)
    if said != allowed:
        errors.append("docs/architecture.md says experimental.h is included by %s; "
                      "tests/abi/test_layers.py allows %s"
                      % (", ".join(sorted(said)) or "nothing", ", ".join(sorted(allowed))))


def is_source_path(root, p):
    """lib/<folder of lib>/... or a path with a source file's extension; not
    install-tree paths (lib/libopeninfer.so.0, lib/pkgconfig/...)."""
    parts = p.split("/")
    if len(parts) > 2 and os.path.isdir(os.path.join(root, "lib", parts[1])):
        return True
    return p.endswith(SOURCE_EXT)


def source_names(root):
    names = set()
    for top in SOURCE_DIRS:
        for dp, dn, fn in os.walk(os.path.join(root, top)):
            dn[:] = [d for d in dn if d not in ("target", "build", "__pycache__") and
                     not d.startswith(".")]
            for f in fn:
                if SOURCE_FILE.search(f):
                    with open(os.path.join(dp, f), errors="replace") as fh:
                        names.update(re.findall(r"\boi_{1,2}[A-Za-z0-9_]+", fh.read()))
    return names


def check_docs(root, errors):
    names = None
    for doc in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
        rel = os.path.relpath(doc, root)
        text = open(doc).read()
        for m in LIB_PATH.finditer(text):
            p = m.group(1).rstrip(".,;:")
            if not is_source_path(root, p):
                continue
            line = text.count("\n", 0, m.start()) + 1
            if "*" in p:
                if not glob.glob(os.path.join(root, p)):
                    errors.append("%s:%d names %s, which matches no file" % (rel, line, p))
            elif not os.path.exists(os.path.join(root, p.rstrip("/"))):
                errors.append("%s:%d names %s, which does not exist" % (rel, line, p))
        for m in OI_NAME.finditer(text):
            name, star = m.group(1), m.group(2)
            if names is None:
                names = source_names(root)
            prefix = star or name.endswith("_")
            if (any(n.startswith(name) for n in names) if prefix else name in names):
                continue
            line = text.count("\n", 0, m.start()) + 1
            errors.append("%s:%d names %s%s, which no source file has" % (rel, line, name, star))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    errors = []
    check_architecture(root, errors)
    check_docs(root, errors)
    if errors:
        for e in errors:
            print("FAIL: " + e, file=sys.stderr)
        return 1
    print("docs: %d stable headers listed, every lib/ path and oi_ name in docs/*.md exists"
          % len(stable_headers(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
