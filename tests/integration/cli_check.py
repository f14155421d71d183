"""The check helper of the integration scripts (test_cli.py, test_bench.py):
counts the failures and prints what failed, with the process's output."""
import sys

failures = 0


def check(cond, what, proc=None, stderr_tail=None):
    """Counts a failure when cond is false, printing `what` and, given the
    completed process, its return code and output (the last stderr_tail
    characters of stderr, or all of it)."""
    global failures
    if not cond:
        failures += 1
        print(f"FAIL: {what}", file=sys.stderr)
        if proc is not None:
            err = proc.stderr if stderr_tail is None else proc.stderr[-stderr_tail:]
            print(f"  rc={proc.returncode}\n  stdout={proc.stdout!r}\n  stderr={err!r}", file=sys.stderr)


def finish(name):
    """Prints the script's verdict and exits 1 on any failure."""
    print(f"{name}:", "ok" if failures == 0 else f"{failures} failure(s)")
    sys.exit(1 if failures else 0)
