#!/usr/bin/env python3
"""Bit-exact check of oi_hash_blocks against an independent implementation.

Block i's hash is XXH3-128 over
    parent_i (16 bytes) || block i's tokens as little-endian u32 || salt
with parent_0 = the given parent (16 zero bytes when none) and parent_i the
previous block's hash; the output is the canonical (big-endian) digest. The
expected values are computed here with python3-xxhash and compared with what
the library prints through the hash_dump helper (argv[1]).

Exit 0 pass, 1 fail, 77 skip (python3-xxhash missing).
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

try:
    import xxhash
except ImportError:
    print("SKIP: python3-xxhash is not installed", file=sys.stderr)
    sys.exit(77)

U32_MAX = 2**32 - 1

# Frozen vectors: block hashes are persisted and exchanged between processes,
# so these values must never change. (Recomputed below with xxhash as well.)
FROZEN = [
    # (block_size, salt, parent, tokens, expected hex hashes)
    (4, b"", None, [1, 2, 3, 4, 5, 6, 7, 8],
     ["4e7b4f6b8cadfb2a1b1a20c2457494c4", "bad84e898fec8dace6ba4906880b0aa0"]),
    (2, b"lora-7", bytes(range(16)), [0, U32_MAX, 0x80000000, 12345],
     ["97bdc27aa0c87fe281022b35210746f9", "93e120ff72c6b799ab74ca802469a8fe"]),
]


def expected_hashes(tokens, block_size, salt=b"", parent=None):
    prev = parent if parent is not None else bytes(16)
    assert len(prev) == 16
    out = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        data = prev + struct.pack("<%dI" % len(block), *block) + salt
        prev = xxhash.xxh3_128_digest(data)
        assert len(prev) == 16
        out.append(prev.hex())
    return out


def run_dump(dump, block_size, salt, parent, tokens, via_file=False, salt_arg=None):
    if salt_arg is None:
        salt_arg = salt.hex() if salt else "-"
    args = [dump, str(block_size), salt_arg, parent.hex() if parent is not None else "-"]
    tmp = None
    try:
        if via_file:
            fd, tmp = tempfile.mkstemp(prefix="oi-hash-tokens-", suffix=".txt")
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(str(t) for t in tokens))
            args.append("@" + tmp)
        else:
            args += [str(t) for t in tokens]
        res = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=60)
    finally:
        if tmp:
            os.unlink(tmp)
    if res.returncode != 0:
        raise RuntimeError("hash_dump exited %d: %s" % (res.returncode, res.stderr.strip()))
    return res.stdout.split()


def main():
    if len(sys.argv) != 2:
        print("usage: test_hash_vectors.py HASH_DUMP", file=sys.stderr)
        return 2
    dump = sys.argv[1]
    rng = random.Random(20240601)

    def rand_tokens(n, hi=U32_MAX):
        return [rng.randint(0, hi) for _ in range(n)]

    extremes = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, U32_MAX, 0x01020304]
    parent_a = bytes(rng.randrange(256) for _ in range(16))
    parent_ff = b"\xff" * 16
    salt_bin = bytes([0, 1, 2, 0, 255, 128, 0])
    long_seq = rand_tokens(10000, hi=151935)  # a realistic vocabulary range
    long_wide = rand_tokens(10000)

    cases = []  # (name, block_size, salt, parent, tokens, kwargs)
    for bs in (1, 16, 256):
        for salt_name, salt in (("nosalt", b""), ("salt", b"model:llama-3-8b"), ("binsalt", salt_bin)):
            for parent_name, parent in (("noparent", None), ("parent", parent_a)):
                n = {1: 37, 16: 16 * 5 + 7, 256: 256 * 3 + 255}[bs]
                cases.append(("bs%d-%s-%s" % (bs, salt_name, parent_name),
                              bs, salt, parent, rand_tokens(n), {}))
    cases += [
        ("extremes-bs1", 1, b"", None, extremes, {}),
        ("extremes-bs4-salt", 4, b"x", parent_ff, extremes, {}),
        ("extremes-bs8", 8, b"", None, extremes, {}),
        ("all-max-bs16", 16, b"", None, [U32_MAX] * 64, {}),
        ("all-zero-bs16", 16, b"", None, [0] * 64, {}),
        ("all-zero-bs16-zero-parent", 16, b"", bytes(16), [0] * 64, {}),
        ("empty-tokens", 16, b"", None, [], {}),
        ("short-tail-only", 16, b"s", None, list(range(15)), {}),
        ("empty-salt-as-empty-hex", 16, b"", None, list(range(48)), {"salt_arg": ""}),
        ("long-10000-bs16", 16, b"", None, long_seq, {}),
        ("long-10000-bs256-salt-parent", 256, b"lora-42", parent_a, long_seq, {}),
        ("long-10000-bs1", 1, b"", None, long_wide[:10000], {"via_file": True}),
        ("long-10000-bs16-wide-file", 16, salt_bin, parent_ff, long_wide, {"via_file": True}),
        ("long-10000-bs256-wide", 256, b"", None, long_wide, {}),
    ]

    failures = 0
    for name, bs, salt, parent, tokens, kw in cases:
        want = expected_hashes(tokens, bs, salt, parent)
        try:
            got = run_dump(dump, bs, salt, parent, tokens, **kw)
        except Exception as e:  # noqa: BLE001 - report and continue
            print("FAIL %s: %s" % (name, e), file=sys.stderr)
            failures += 1
            continue
        if len(want) != len(tokens) // bs:
            raise AssertionError("reference implementation is broken")
        if got != want:
            failures += 1
            print("FAIL %s: %d hashes from the library, %d expected" % (name, len(got), len(want)),
                  file=sys.stderr)
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    print("  first difference at block %d: got %s, expected %s" % (i, g, w),
                          file=sys.stderr)
                    break
        else:
            print("ok   %-36s %5d tokens, %4d blocks" % (name, len(tokens), len(want)))

    # Chaining across calls: hashing the tail with parent = the last hash of the
    # head gives the same hashes as one call over everything.
    bs = 16
    head, tail = long_seq[:bs * 100], long_seq[bs * 100:]
    whole = run_dump(dump, bs, b"chain", None, long_seq)
    first = run_dump(dump, bs, b"chain", None, head)
    rest = run_dump(dump, bs, b"chain", bytes.fromhex(first[-1]), tail)
    if first + rest != whole or whole != expected_hashes(long_seq, bs, b"chain"):
        failures += 1
        print("FAIL chained calls do not match one call", file=sys.stderr)
    else:
        print("ok   %-36s" % "chained-calls")

    for i, (bs, salt, parent, tokens, frozen) in enumerate(FROZEN):
        want = expected_hashes(tokens, bs, salt, parent)
        got = run_dump(dump, bs, salt, parent, tokens)
        if want != frozen or got != frozen:
            failures += 1
            print("FAIL frozen vector %d: library %s, xxhash %s, frozen %s" % (i, got, want, frozen),
                  file=sys.stderr)
        else:
            print("ok   frozen vector %d" % i)

    if failures:
        print("%d case(s) failed" % failures, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
