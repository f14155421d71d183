#!/usr/bin/env python3
"""The C example in README.md compiles against the build tree and runs.

    test_readme_snippet.py README_MD INCLUDE_DIR LIBOPENINFER_SO

Takes the first ```c fenced block after the first line containing
"<!-- snippet -->", compiles it with -I INCLUDE_DIR and the shared library
(strict warnings, -Werror), runs it and requires exit status 0.

Exit 0 pass, 1 fail, 77 skip (no C compiler).
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

MARKER = "<!-- snippet -->"


def extract_snippet(text):
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if MARKER in line), None)
    if start is None:
        raise ValueError("no line containing %r" % MARKER)
    i = start + 1
    while i < len(lines) and lines[i].strip().lower() not in ("```c", "``` c"):
        i += 1
    if i == len(lines):
        raise ValueError("no ```c block after %r (line %d)" % (MARKER, start + 1))
    body_start = i + 1
    for j in range(body_start, len(lines)):
        if lines[j].strip() == "```":
            return "\n".join(lines[body_start:j]) + "\n", body_start + 1
    raise ValueError("the ```c block at line %d is not closed" % (i + 1))


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    readme, include_dir, lib = sys.argv[1:]
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(shlex.split(cc)[0]):
        print("SKIP: no C compiler", file=sys.stderr)
        return 77
    try:
        with open(readme) as f:
            snippet, first_line = extract_snippet(f.read())
    except (OSError, ValueError) as e:
        print("FAIL: %s: %s" % (readme, e), file=sys.stderr)
        return 1
    print("snippet from %s, line %d:\n%s" % (readme, first_line, snippet))

    with tempfile.TemporaryDirectory(prefix="oi-readme-") as tmp:
        src = os.path.join(tmp, "snippet.c")
        exe = os.path.join(tmp, "snippet")
        with open(src, "w") as f:
            # Compiler messages point at README.md's lines.
            f.write('#line %d "%s"\n' % (first_line, readme.replace("\\", "\\\\")))
            f.write(snippet)
        cmd = shlex.split(cc) + ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                                 "-I", include_dir, "-o", exe, src, lib,
                                 "-Wl,-rpath," + os.path.dirname(os.path.abspath(lib))]
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True)
        if res.returncode != 0:
            print(res.stdout, file=sys.stderr)
            print("FAIL: the README snippet does not compile: %s"
                  % " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
            return 1
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.path.dirname(os.path.abspath(lib)) + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        res = subprocess.run([exe], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, env=env, timeout=60)
        print("output:\n" + res.stdout)
        if res.stderr:
            print("stderr:\n" + res.stderr, file=sys.stderr)
        if res.returncode != 0:
            print("FAIL: the README snippet exited %d" % res.returncode, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
