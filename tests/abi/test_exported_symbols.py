#!/usr/bin/env python3
"""The shared library exports exactly the functions the public headers
declare, each under the version node the version script names for it.

    test_exported_symbols.py INCLUDE_DIR LIBOPENINFER_SO VERSION_SCRIPT [LIB_SO VERSION_SCRIPT]...

Every further pair is a companion library that exports some of the
declared functions (libopeninfer-refmodel.so: oi_refmodel_*): the
functions its script lists are checked against it, the others against
libopeninfer.so, and every declared function is in exactly one script.

Three views of the ABI are compared, version node by version node:
  - the headers: every function declared with OI_API in
    INCLUDE_DIR/openinfer/*.h; those of experimental.h belong to the
    experimental nodes (OPENINFER_EXPERIMENTAL_*) and must sit inside its
    `#if defined(OI_EXPERIMENTAL)` section; every other header's belong to
    the stable nodes (OPENINFER_<major>.<minor>);
  - the version script: each node lists its symbols by name (a glob in a
    `global:` section fails: a symbol added later would silently join a node);
  - the shared library: every defined dynamic symbol and its version
    (nm -D --defined-only).
Fails on a symbol exported but not declared (a leak), declared but not
exported, exported under another node than the script's, a stable function
in an experimental node (or the reverse), an exported symbol that is not a
function or carries a hidden version, a SONAME other than
libopeninfer.so.0, and a NEEDED entry for UCX (libucp, libucs, libuct,
libucm: the cluster tier loads UCX with dlopen, docs/cluster.md "Loading
UCX"). Prints the count per node.

Exit 0 pass, 1 fail, 77 skip (binutils missing).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

SONAME = "libopeninfer.so.0"
EXPERIMENTAL_HEADER = "experimental.h"
STABLE_NODE = re.compile(r"^OPENINFER_\d+\.\d+$")
EXPERIMENTAL_NODE = re.compile(r"^OPENINFER_EXPERIMENTAL_\d+\.\d+$")
# nm types of exported functions: text, weak, indirect (ifunc).
FUNCTION_TYPES = set("TWi")


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def experimental_section(src):
    """(start, end) offsets of the `#if defined(OI_EXPERIMENTAL)` /
    `#ifdef OI_EXPERIMENTAL` section of experimental.h, or None."""
    m = re.search(r"^[ \t]*#[ \t]*(?:ifdef[ \t]+OI_EXPERIMENTAL\b|if[ \t]+defined\(OI_EXPERIMENTAL\))",
                  src, flags=re.M)
    if not m:
        return None
    depth, pos = 1, m.end()
    for d in re.finditer(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|endif)\b", src[pos:], flags=re.M):
        depth += -1 if d.group(1) == "endif" else 1
        if depth == 0:
            return (m.end(), pos + d.start())
    return None


def declared_functions(include_dir):
    """{name: (header path, experimental?)}"""
    headers = sorted(glob.glob(os.path.join(include_dir, "openinfer", "*.h")))
    if not headers:
        raise SystemExit("FAIL: no headers under %s/openinfer" % include_dir)
    decls = {}
    for path in headers:
        experimental = os.path.basename(path) == EXPERIMENTAL_HEADER
        with open(path) as f:
            src = strip_comments(f.read())
        section = experimental_section(src) if experimental else None
        if experimental and not section:
            raise SystemExit("FAIL: %s has no #if defined(OI_EXPERIMENTAL) section" % path)
        # Blank preprocessor lines (with continuations), keeping offsets.
        src = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*",
                     lambda m: re.sub(r"[^\n]", " ", m.group(0)), src, flags=re.M)
        # Look at the top-level statements that use OI_API.
        for st in re.finditer(r"[^;{}]+", src):
            stmt = st.group(0)
            api = re.search(r"\bOI_API\b", stmt)
            if not api:
                continue
            flat = " ".join(stmt.split())
            # The declared name is the identifier right before the first '(' of
            # the parameter list: "OI_API const char *oi_status_str(oi_status st)".
            m = re.search(r"\bOI_API\b[^(]*?\b([A-Za-z_]\w*)\s*\(", flat)
            if not m:
                raise SystemExit("FAIL: cannot parse OI_API declaration in %s: %s" % (path, flat))
            name = m.group(1)
            if not name.startswith("oi_"):
                raise SystemExit("FAIL: %s declares OI_API %s, which lacks the oi_ prefix"
                                 % (os.path.basename(path), name))
            if name in decls and decls[name][0] != path:
                raise SystemExit("FAIL: %s is declared in both %s and %s"
                                 % (name, decls[name][0], path))
            if experimental and not (section[0] <= st.start() + api.start() < section[1]):
                raise SystemExit("FAIL: %s: %s is declared outside the OI_EXPERIMENTAL section"
                                 % (path, name))
            decls[name] = (path, experimental)
    return decls


def version_script(path):
    """{node: set of names} of the version script; fails on globs."""
    with open(path) as f:
        src = strip_comments(f.read())
    nodes = {}
    for m in re.finditer(r"([A-Za-z_][\w.]*)\s*\{(.*?)\}\s*([A-Za-z_][\w.]*)?\s*;", src, flags=re.S):
        node, body = m.group(1), m.group(2)
        names, scope = set(), "global"
        for tok in re.findall(r"[^\s;]+:?", body):
            if tok in ("global:", "local:"):
                scope = tok[:-1]
                continue
            if scope != "global":
                continue
            if any(c in tok for c in "*?["):
                raise SystemExit("FAIL: %s: node %s exports the glob %r: list every symbol by name"
                                 % (path, node, tok))
            if tok in names:
                raise SystemExit("FAIL: %s: %s is listed twice in %s" % (path, tok, node))
            names.add(tok)
        nodes[node] = names
    if not nodes:
        raise SystemExit("FAIL: %s defines no version node" % path)
    seen = {}
    for node, names in nodes.items():
        if not (STABLE_NODE.match(node) or EXPERIMENTAL_NODE.match(node)):
            raise SystemExit("FAIL: %s: node %s is neither OPENINFER_M.N nor "
                             "OPENINFER_EXPERIMENTAL_M.N" % (path, node))
        for n in names:
            if n in seen:
                raise SystemExit("FAIL: %s: %s is listed in both %s and %s"
                                 % (path, n, seen[n], node))
            seen[n] = node
    return nodes


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
        # The version definitions themselves show up as absolute symbols.
        if typ == "A" and (STABLE_NODE.match(sym) or EXPERIMENTAL_NODE.match(sym)):
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


def needed(lib):
    if shutil.which("readelf"):
        out = run(["readelf", "-d", "-W", lib])
        return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    out = run(["objdump", "-p", lib])
    return re.findall(r"^\s*NEEDED\s+(\S+)", out, flags=re.M)


# Libraries the shared object must not depend on at load time.
NOT_NEEDED = re.compile(r"^libuc[pstm]\.so")


def check_library(lib, decls, nodes, errors, main):
    """The shared library `lib` against the functions its version script
    `nodes` lists (of `decls`); returns its per-node counts."""
    syms = exported_symbols(lib)
    node_of = {n: node for node, names in nodes.items() for n in names}
    mine = {n: d for n, d in decls.items() if n in node_of}
    name = os.path.basename(lib)
    for s in sorted(set(syms) - set(mine)):
        errors.append("leak: %s exports %s (nm type %s), which its version script does not list "
                      "or no public header declares with OI_API" % (name, s, syms[s][0]))
    for s in sorted(set(mine) - set(syms)):
        errors.append("missing: %s is declared in %s but %s does not export it"
                      % (s, os.path.basename(mine[s][0]), name))
    for s in sorted(set(syms) & set(mine)):
        typ, version, default = syms[s]
        if typ not in FUNCTION_TYPES:
            errors.append("%s is exported as nm type %s, not as a function" % (s, typ))
        if version != node_of.get(s):
            errors.append("%s carries version %s, the version script says %s"
                          % (s, version or "(none)", node_of.get(s)))
        elif not default:
            errors.append("%s@%s is a hidden (non-default) version" % (s, version))

    # Every node is defined in the library; per node, exported == listed.
    vd = run(["readelf", "-V", "-W", lib]) if shutil.which("readelf") else run(["objdump", "-p", lib])
    counts = []
    for node in sorted(nodes):
        if node not in vd:
            errors.append("%s: version node %s is not defined" % (name, node))
        exported = {s for s, (_t, v, _d) in syms.items() if v == node}
        for s in sorted(exported - nodes[node]):
            errors.append("%s: %s is exported under it but not listed" % (node, s))
        for s in sorted(nodes[node] - exported):
            errors.append("%s: %s is listed but not exported under it by %s" % (node, s, name))
        counts.append("%s %d" % (node, len(exported)))

    so = soname(lib)
    if main and so != SONAME:
        errors.append("SONAME is %s, expected %s" % (so, SONAME))
    for dep in needed(lib):
        if NOT_NEEDED.match(dep):
            errors.append("%s: NEEDED %s: UCX is loaded at run time (dlopen), not linked"
                          % (name, dep))
    print("%s: %d symbols exported (%s), SONAME %s" % (name, len(syms), ", ".join(counts), so))
    return node_of


def main():
    if len(sys.argv) < 4 or len(sys.argv) % 2 != 0:
        print(__doc__, file=sys.stderr)
        return 2
    include_dir = sys.argv[1]
    pairs = [(sys.argv[i], sys.argv[i + 1]) for i in range(2, len(sys.argv), 2)]
    if not shutil.which("nm") or not (shutil.which("readelf") or shutil.which("objdump")):
        print("SKIP: binutils (nm, readelf/objdump) not found", file=sys.stderr)
        return 77

    decls = declared_functions(include_dir)
    scripts = [(lib, script, version_script(script)) for lib, script in pairs]
    errors = []

    # Headers against the version scripts: each declared function in one
    # node of one script, stable or experimental as its header is.
    node_of, script_of = {}, {}
    for _lib, script, nodes in scripts:
        for node, names in nodes.items():
            for n in names:
                if n in node_of:
                    errors.append("%s is listed in both %s and %s"
                                  % (n, os.path.basename(script_of[n]), os.path.basename(script)))
                node_of[n], script_of[n] = node, script
    for name, (path, experimental) in sorted(decls.items()):
        node = node_of.get(name)
        hdr = os.path.relpath(path, include_dir)
        if node is None:
            errors.append("unlisted: %s (declared in %s) is in no node of %s"
                          % (name, hdr, ", ".join(os.path.basename(s) for _l, s in pairs)))
        elif experimental and not EXPERIMENTAL_NODE.match(node):
            errors.append("%s is experimental (%s) but listed in the stable node %s"
                          % (name, hdr, node))
        elif not experimental and not STABLE_NODE.match(node):
            errors.append("%s is stable (%s) but listed in the experimental node %s"
                          % (name, hdr, node))
    for name in sorted(set(node_of) - set(decls)):
        errors.append("stale: %s is listed in %s but declared in no header" % (name, node_of[name]))

    # Each shared library against its script.
    for i, (lib, _script, nodes) in enumerate(scripts):
        check_library(lib, decls, nodes, errors, main=(i == 0))

    print("%d functions declared with OI_API" % len(decls))
    if errors:
        for e in errors:
            print("FAIL: " + e, file=sys.stderr)
        return 1
    for s in sorted(decls):
        print("ok   %s@@%s (%s)" % (s, node_of[s], os.path.basename(script_of[s])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
