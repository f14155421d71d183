"""The `openinfer` command of the wheel (its console script).

The wheel ships the command-line tool itself, the C program `openinfer`
(serve, stats, info, demo, ...), as openinfer/bin/openinfer beside the
library it links (openinfer/lib, found through its RUNPATH). This entry point
replaces the Python process with it (exec): same arguments, same process id,
so signals sent to the command (SIGTERM, SIGSTOP) reach the server and its
exit status is the command's.

A binding installed from source (`pip install ./bindings/python`) has no
bundled tool and no console script: the tool is the one `meson install` put
in PREFIX/bin."""
import os
import sys


def binary():
    """The path of the bundled `openinfer` program."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "openinfer")


def main():
    exe = binary()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(
            "openinfer: %s is missing or not executable: this openinfer package was not "
            "installed from the wheel (a source install has no bundled command; run the "
            "`openinfer` that meson installed in PREFIX/bin)\n" % exe)
        return 127
    os.execv(exe, [exe] + sys.argv[1:])
    return 127  # (execv does not return)


if __name__ == "__main__":
    sys.exit(main())
