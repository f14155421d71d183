#!/usr/bin/env python3
"""Bit-exact check of oi_hash_blocks, oi_hash_blocks_ex and
oi_block_key(s)_from_bytes against an independent implementation.

Block i's hash is XXH3-128 over
    parent_i (16 bytes) || block i's tokens as little-endian u32 || salt
with parent_0 = the given parent (16 zero bytes when none) and parent_i the
previous block's hash; the output is the canonical (big-endian) digest. A
block with an extra key E (oi_hash_blocks_ex) is XXH3-128 with the seed
"oi-xkey1" (big-endian u64) over
    parent_i || tokens || salt || E || u64le(len(salt)) || u64le(len(E)).
An external key K (1..64 bytes) maps to XXH3-128 of K with the seed
"oi-key-1". The expected values are computed here with python3-xxhash and
compared with what the library prints through the hash_dump helper (argv[1]).

Exit 0 pass, 1 fail, 77 skip (python3-xxhash missing).
"""
import hashlib
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

FROZEN_KEYS = [
    # (external key, expected hex): a sha256 block hash as vLLM keeps it, a short key
    (hashlib.sha256(b"block 0").digest(), "7cc0242f8aaf8d03ff5dc6e9f1de5e23"),
    (b"ab", "418d7f337b4a161d9d9bb6fafb70496a"),
]
FROZEN_EX = [
    # (block_size, salt, parent, tokens, extras, expected hex hashes); the
    # second's block 0 has no extra key, so it is FROZEN[1]'s block 0.
    (4, b"", None, [1, 2, 3, 4, 5, 6, 7, 8], [b"img-0"],
     ["e60845be7c1e81dd0bf675bb2a350d94", "68afd095a39e854909d978be0df28d68"]),
    (2, b"lora-7", bytes(range(16)), [0, U32_MAX, 0x80000000, 12345], [b"", b"\x00"],
     ["97bdc27aa0c87fe281022b35210746f9", "a993d31580b59b63d114f4ddadfebfdb"]),
]


# The seeds, derived here from their documented names, not from the header.
KEY_SEED = int.from_bytes(b"oi-key-1", "big")
EXTRA_KEY_SEED = int.from_bytes(b"oi-xkey1", "big")
KEY_MAX = 64


def expected_hashes(tokens, block_size, salt=b"", parent=None, extras=None):
    prev = parent if parent is not None else bytes(16)
    assert len(prev) == 16
    extras = extras or []
    out = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        data = prev + struct.pack("<%dI" % len(block), *block) + salt
        extra = extras[i] if i < len(extras) else b""
        if extra:
            data += extra + struct.pack("<QQ", len(salt), len(extra))
            prev = xxhash.xxh3_128_digest(data, seed=EXTRA_KEY_SEED)
        else:
            prev = xxhash.xxh3_128_digest(data)
        assert len(prev) == 16
        out.append(prev.hex())
    return out


def expected_key(key):
    assert 1 <= len(key) <= KEY_MAX
    return xxhash.xxh3_128_digest(key, seed=KEY_SEED).hex()


def run_dump(dump, block_size, salt, parent, tokens, via_file=False, salt_arg=None, extras=None):
    """extras None: oi_hash_blocks; a list (of bytes, b"" for none): oi_hash_blocks_ex."""
    if salt_arg is None:
        salt_arg = salt.hex() if salt else "-"
    args = [dump, str(block_size), salt_arg, parent.hex() if parent is not None else "-"]
    if extras is not None:
        args.insert(1, "ex")
        args.append(",".join(e.hex() for e in extras) if extras else "-")
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

    failures += check_ex(dump, rng, long_seq, parent_a, salt_bin)
    failures += check_keys(dump, rng)

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


def run_tool(args):
    res = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, timeout=60)
    return res.returncode, res.stdout.split(), res.stderr.strip()


def report(name, got, want):
    if got != want:
        print("FAIL %s: library %s, expected %s" % (name, got[:4], want[:4]), file=sys.stderr)
        return 1
    print("ok   %-36s %5d hashes" % (name, len(want)))
    return 0


def check_ex(dump, rng, long_seq, parent_a, salt_bin):
    """oi_hash_blocks_ex against the reference, and against oi_hash_blocks
    when no block has an extra key."""
    failures = 0
    img = bytes(rng.randrange(256) for _ in range(32))  # an image's content hash
    seq = long_seq[:16 * 12 + 5]
    cases = [
        # (name, block_size, salt, parent, tokens, extras)
        ("ex-no-extras", 16, b"", None, seq, []),
        ("ex-all-empty", 16, b"lora-1", parent_a, seq, [b""] * 13),
        ("ex-image-blocks-2-4", 16, b"", None, seq, [b"", b"", img, img, img]),
        ("ex-every-block", 16, salt_bin, parent_a, seq,
         [bytes([i]) * (i + 1) for i in range(12)]),
        ("ex-lora-id-first-block", 16, b"model-x", None, seq, [b"lora:42"]),
        ("ex-tail-entry-ignored", 16, b"", None, seq, [b""] * 12 + [b"tail"]),
        ("ex-bs1-extremes", 1, b"x", bytes(16), [0, 1, 0xFFFFFFFF, 0x80000000],
         [b"\x00", b"", b"\x00\x00", b"\xff" * 70]),
        ("ex-long-key", 256, b"", None, long_seq[:256 * 3], [b"k" * 1000, b"", b"j" * 3]),
    ]
    for name, bs, salt, parent, tokens, extras in cases:
        want = expected_hashes(tokens, bs, salt, parent, extras)
        try:
            got = run_dump(dump, bs, salt, parent, tokens, extras=extras)
        except Exception as e:  # noqa: BLE001 - report and continue
            print("FAIL %s: %s" % (name, e), file=sys.stderr)
            failures += 1
            continue
        failures += report(name, got, want)
        if not any(extras[:len(tokens) // bs]):
            plain = run_dump(dump, bs, salt, parent, tokens)
            failures += report(name + " = plain", got, plain)
        elif got == expected_hashes(tokens, bs, salt, parent):
            failures += 1
            print("FAIL %s: the extra keys changed nothing" % name, file=sys.stderr)
    # Continuing the chain from block k with its extra keys.
    extras = [bytes([i]) * 5 if i % 2 else b"" for i in range(12)]
    whole = run_dump(dump, 16, b"", None, seq, extras=extras)
    rest = run_dump(dump, 16, b"", bytes.fromhex(whole[4]), seq[16 * 5:], extras=extras[5:])
    failures += report("ex-chained-calls", rest, whole[5:])
    return failures


def check_keys(dump, rng):
    """oi_block_key_from_bytes and the batch form against the reference."""
    failures = 0
    keys = [bytes([0]), bytes([0, 0]), b"ab", b"ab\x00", bytes(16), bytes(32),
            bytes(rng.randrange(256) for _ in range(KEY_MAX))]
    keys += [bytes(rng.randrange(256) for _ in range(n)) for n in range(1, KEY_MAX + 1)]
    # vLLM's block hashes: 32-byte sha256 digests; a Python hash int as 8
    # little-endian signed bytes.
    keys.append(hashlib.sha256(b"block 0").digest())
    keys.append((-1234567890123).to_bytes(8, "little", signed=True))
    rc, got, err = run_tool([dump, "key"] + [k.hex() for k in keys])
    want = [expected_key(k) for k in keys]
    if rc != 0:
        print("FAIL key: %s" % err, file=sys.stderr)
        failures += 1
    else:
        failures += report("key-single", got, want)
        if len(set(got)) != len(got):
            failures += 1
            print("FAIL key: distinct keys mapped equally", file=sys.stderr)
    for key_len in (1, 8, 16, 32, 36, KEY_MAX):
        packed = bytes(rng.randrange(256) for _ in range(key_len * 50))
        rc, got, err = run_tool([dump, "keys", str(key_len), packed.hex()])
        want = [expected_key(packed[i:i + key_len]) for i in range(0, len(packed), key_len)]
        if rc != 0:
            print("FAIL keys %d: %s" % (key_len, err), file=sys.stderr)
            failures += 1
            continue
        failures += report("keys-batch-%d" % key_len, got, want)
        rc, single, _ = run_tool([dump, "key"] + [packed[i:i + key_len].hex()
                                                  for i in range(0, len(packed), key_len)])
        failures += report("keys-batch-%d = single" % key_len, got, single)
    # Lengths outside 1..64 are refused.
    for bad in ([dump, "key", ""], [dump, "key", "00" * (KEY_MAX + 1)],
                [dump, "keys", "0", ""], [dump, "keys", str(KEY_MAX + 1), "00" * (KEY_MAX + 1)]):
        rc, _, err = run_tool(bad)
        if rc != 1 or "INVALID_ARGUMENT" not in err:
            failures += 1
            print("FAIL %s: rc %d (%s), expected a refusal" % (bad[1:3], rc, err), file=sys.stderr)
        else:
            print("ok   %-36s refused" % ("%s len %d" % (bad[1], len(bad[-1]) // 2)))
    for i, (key, frozen) in enumerate(FROZEN_KEYS):
        rc, got, _ = run_tool([dump, "key", key.hex()])
        failures += report("frozen key %d" % i, got + [expected_key(key)], [frozen, frozen])
    for i, (bs, salt, parent, tokens, extras, frozen) in enumerate(FROZEN_EX):
        got = run_dump(dump, bs, salt, parent, tokens, extras=extras)
        failures += report("frozen ex %d" % i, [got, expected_hashes(tokens, bs, salt, parent, extras)],
                           [frozen, frozen])
    return failures


if __name__ == "__main__":
    sys.exit(main())
