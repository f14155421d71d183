#!/usr/bin/env python3
"""The layers of lib/ include only downward (docs/architecture.md).

    test_layers.py SOURCE_ROOT [--graph]

Reads every C, CUDA and header file of lib/, kernels/ and tools/ and fails on:
  - an `#include "x/..."` in lib/<dir> that names a folder <dir> may not
    include (the table ALLOWED below, which docs/architecture.md draws), or a
    public header (include/openinfer/) of a layer <dir> may not use;
  - an include of a tier implementation (TIERS: the folders behind the
    host's tier interface, lib/host/tier.h) from any other folder of lib/:
    the host drives the tiers through the interface, so neither the host,
    the engine, the server nor another tier names one;
  - a kernel folder (kernels/, lib/refmodel/kernels/) that includes anything
    above itself;
  - a CUDA header (<cuda*.h>, <cublas*.h>, <cub/...>, <nv*.h>) in a file
    outside lib/device/ and the kernel files (*.cu, *.cuh, and the kernel
    folders);
  - the installed command (tools/, but tools/bench/) including anything but
    the public headers and its own (cli.h).
--graph prints the include graph between folders (for reviews) and exits 0.

Exit 0 pass, 1 fail.
"""
import os
import re
import sys

# Who may include whom: folder -> the folders (besides itself) whose headers
# it may include. Lower layers first. A folder absent on the left includes
# nothing but itself.
ALLOWED = {
    "core": set(),
    "hash": {"core"},
    "codec": {"core"},
    "device": {"core", "kernels"},
    "host": {"core", "hash", "device", "codec"},
    "transfer": {"core", "hash", "device", "host", "codec"},
    "disk": {"core", "hash", "device", "host", "transfer", "codec"},
    "cluster": {"core", "hash", "host", "proto", "codec"},
    "engine": {"core", "hash", "device", "host", "transfer", "proto", "codec"},
    "proto": {"core"},
    "server": {"core", "hash", "device", "host", "transfer", "engine", "proto", "codec"},
    "executor": {"core", "hash", "device", "host", "engine"},
    "refmodel": {"core", "device", "refmodel/kernels"},
    "refmodel/kernels": set(),
    "kernels": set(),
}

# The tier implementations: each implements lib/host/tier.h and is attached
# through its public attach call. No other folder of lib/ includes one (not
# the host, the engine, the server, nor another tier); tools/bench/ may.
TIERS = {"disk", "cluster"}

# Arrows allowed for named files only (folder, included folder) -> files.
# The remote engine is the protocol's client: it alone of lib/engine speaks
# the wire format (its files include it through remote_internal.h).
FILE_EXCEPTIONS = {
    ("engine", "proto"): {"lib/engine/remote_internal.h"},
}

# Public headers: the layer each belongs to. A folder may include a public
# header when it may include that layer (or is it). model.h declares types
# only (the model interface) and sits with core. experimental.h gathers the
# experimental API of the layers that implement it, which alone include it.
PUBLIC_LAYER = {
    "common.h": "core",
    "model.h": "core",
    "hash.h": "hash",
    "device.h": "device",
    "host.h": "host",
    "disk.h": "disk",
    "engine.h": "engine",
    "server.h": "server",
    "executor.h": "executor",
    "openinfer.h": None,  # the umbrella header: not for the library itself
}
EXPERIMENTAL_USERS = {"device", "executor", "refmodel", "cluster", "server"}

CUDA_HEADER = re.compile(r"^(cuda\w*|cublas\w*|curand\w*|nv\w+|cub/.*|thrust/.*)(\.h|\.cuh)?$")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">]+)[">]', re.M)
SOURCE = re.compile(r"\.(c|h|cu|cuh)$")
KERNEL_DIRS = ("kernels/", "lib/refmodel/kernels/")


def folder_of(rel):
    """lib/<dir>/... -> <dir> (lib/refmodel/kernels/... -> refmodel/kernels);
    kernels/... -> kernels; None elsewhere."""
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] == "lib" and len(parts) > 2:
        if len(parts) > 3 and parts[2] == "kernels":
            return parts[1] + "/kernels"
        return parts[1]
    return None


def target_of(inc):
    """The folder an include names ("host/host_internal.h" -> host), or None."""
    parts = inc.split("/")
    if len(parts) < 2:
        return None
    if len(parts) > 2 and parts[1] == "kernels":
        return parts[0] + "/kernels"
    return parts[0]


def files(root):
    for top in ("lib", "kernels", "tools"):
        for dp, dn, fn in os.walk(os.path.join(root, top)):
            dn.sort()
            for f in sorted(fn):
                if SOURCE.search(f):
                    p = os.path.join(dp, f)
                    yield os.path.relpath(p, root), p


def is_kernel_file(rel):
    return rel.endswith((".cu", ".cuh")) or rel.startswith(KERNEL_DIRS)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    graph = "--graph" in sys.argv[2:]
    errors = []
    for folder, allowed in sorted(ALLOWED.items()):
        if allowed & TIERS:
            errors.append("ALLOWED lets %s include the tier(s) %s" % (folder, sorted(allowed & TIERS)))
    edges = {}
    known = set(ALLOWED)
    for rel, path in files(root):
        with open(path, errors="replace") as f:
            src = f.read()
        src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
        folder = folder_of(rel)
        for m in INCLUDE.finditer(src):
            quote, inc = m.group(1), m.group(2)
            if CUDA_HEADER.match(inc):
                edges.setdefault(folder or rel, set()).add("<%s>" % inc)
                if not (rel.startswith("lib/device/") or is_kernel_file(rel)):
                    errors.append("%s includes the CUDA header <%s>: only lib/device/ and kernel "
                                  "files may" % (rel, inc))
                continue
            if quote != '"':
                continue
            # The installed command: public headers and its own only.
            if rel.startswith("tools/") and not rel.startswith("tools/bench/"):
                if not (inc.startswith("openinfer/") or "/" not in inc):
                    errors.append("%s includes \"%s\": the installed command uses the public API "
                                  "only (internals belong in tools/bench/)" % (rel, inc))
                continue
            if folder is None:
                continue
            if inc.startswith("openinfer/"):
                header = inc.split("/", 1)[1]
                edges.setdefault(folder, set()).add(inc)
                if header == "experimental.h":
                    if folder not in EXPERIMENTAL_USERS:
                        errors.append("%s includes openinfer/experimental.h: only %s may"
                                      % (rel, ", ".join(sorted(EXPERIMENTAL_USERS))))
                    continue
                if header not in PUBLIC_LAYER:
                    errors.append("%s includes unknown public header %s" % (rel, inc))
                    continue
                layer = PUBLIC_LAYER[header]
                if layer is None or (layer != folder and layer not in ALLOWED.get(folder, set())):
                    errors.append("%s (layer %s) includes %s (layer %s): an arrow up"
                                  % (rel, folder, inc, layer))
                continue
            target = target_of(inc)
            if target is None or target == folder:
                continue  # a header of the same folder
            if target not in known:
                continue  # a generated or third-party path
            edges.setdefault(folder, set()).add(target)
            if target in TIERS:
                errors.append("%s includes \"%s\": %s is a tier implementation, reached only "
                              "through the host's tier interface (host/tier.h)" % (rel, inc, target))
                continue
            if target in ALLOWED.get(folder, set()):
                if rel not in FILE_EXCEPTIONS.get((folder, target), {rel}):
                    errors.append("%s includes \"%s\": %s -> %s is allowed only for %s"
                                  % (rel, inc, folder, target,
                                     ", ".join(sorted(FILE_EXCEPTIONS[(folder, target)]))))
                continue
            errors.append("%s includes \"%s\": %s may not include %s (docs/architecture.md)"
                          % (rel, inc, folder, target))
    if graph:
        for f in sorted(edges):
            print("%-18s -> %s" % (f, " ".join(sorted(edges[f]))))
        return 0
    if errors:
        for e in errors:
            print("FAIL: " + e, file=sys.stderr)
        return 1
    print("layers: %d folders, every include points down" % len(edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
