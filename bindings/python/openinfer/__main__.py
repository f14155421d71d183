"""python -m openinfer: where the wheel put the C library and its headers.

    python -m openinfer --cflags --libs     flags to compile and link a C/C++ program
    python -m openinfer --includedir        the directory holding openinfer/*.h
    python -m openinfer --libdir            the directory holding libopeninfer.so.0
    python -m openinfer --pkgconfigdir      the directory holding openinfer.pc
    python -m openinfer --bindir            the directory holding the openinfer program
    python -m openinfer --modversion        the library's version

Like pkg-config, several flags print on one line, in the order given. --libs
records the library directory as RUNPATH (-Wl,-rpath), so the program finds
libopeninfer.so.0 inside the installed package without LD_LIBRARY_PATH.
`pkg-config openinfer` works too with PKG_CONFIG_PATH set to --pkgconfigdir;
Rust's openinfer-sys takes LIBOPENINFER_DIR=$(python -m openinfer --libdir).

Only the wheel ships the library and headers inside the package; a binding
built from source (pip install ./bindings/python) uses the library meson
installed, which pkg-config finds (docs/building.md)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DIRS = {
    "--includedir": os.path.join(HERE, "include"),
    "--libdir": os.path.join(HERE, "lib"),
    "--pkgconfigdir": os.path.join(HERE, "lib", "pkgconfig"),
    "--bindir": os.path.join(HERE, "bin"),
}


def _version():
    # From the shipped .pc file: no need to load the library for it.
    with open(os.path.join(DIRS["--pkgconfigdir"], "openinfer.pc")) as f:
        for line in f:
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise RuntimeError("openinfer.pc has no Version line")


def main(argv):
    if not argv or any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(__doc__.split("\n\n")[0].split("\n", 1)[1] + "\n")
        return 0 if argv else 2
    unknown = [a for a in argv if a not in DIRS and a not in ("--cflags", "--libs", "--modversion")]
    if unknown:
        sys.stderr.write("python -m openinfer: unknown option %s (--help lists them)\n" % unknown[0])
        return 2
    if not os.path.exists(os.path.join(DIRS["--includedir"], "openinfer", "openinfer.h")):
        sys.stderr.write("python -m openinfer: %s has no C headers: this openinfer was not "
                         "installed from the wheel; the library it uses is where meson "
                         "installed it (pkg-config --cflags --libs openinfer)\n" % HERE)
        return 1
    out = []
    for a in argv:
        if a == "--cflags":
            out.append("-I" + DIRS["--includedir"])
        elif a == "--libs":
            lib = DIRS["--libdir"]
            out += ["-L" + lib, "-Wl,-rpath," + lib, "-lopeninfer"]
        elif a == "--modversion":
            out.append(_version())
        else:
            out.append(DIRS[a])
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
