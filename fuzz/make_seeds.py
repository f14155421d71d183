#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/seed-*).
Run from anywhere: python3 fuzz/make_seeds.py. Seeds are committed; inputs
libFuzzer finds that crashed (fixed since) are committed next to them as
regression inputs (crash-*)."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- protobuf by hand (matches lib/proto/openinfer.proto) ----
def varint(v):
    b = bytearray()
    while v >= 0x80:
        b.append((v & 0x7F) | 0x80)
        v >>= 7
    b.append(v)
    return bytes(b)


def tag(field, wt):
    return varint(field << 3 | wt)


def u(field, v):
    return tag(field, 0) + varint(v)


def zz(v):
    return (v << 1) ^ (v >> 63) if v >= 0 else ((-v) << 1) - 1


def s(field, v):
    return tag(field, 0) + varint(zz(v))


def by(field, data):
    return tag(field, 2) + varint(len(data)) + data


def packed_sint(field, vals):
    return by(field, b"".join(varint(zz(v)) for v in vals))


def env(req, body_field, body):
    return u(1, req) + by(body_field, body)


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


H = lambda i: bytes([i]) + b"\x00" * 14 + b"\xa5"
LEASE = bytes(range(16))

hello = env(1, 2, u(1, 1) + by(3, b"seed client"))
arena0 = u(2, 0) + u(3, 32) + u(4, 256) + u(5, 1024) + u(6, 2) + u(7, 512)
arena1 = u(2, 32768) + u(3, 32) + u(4, 384) + u(5, 384) + u(6, 1)
register = env(2, 4, by(1, b"ns") + by(2, b"inst") + s(3, -1) + u(4, 1) + u(5, 65536)
               + by(6, by(1, b"kv") + arena0) + by(6, by(1, b"mla") + arena1))
save = env(3, 6, u(1, 1) + packed_sint(2, [0, 1, 2, 3]) + b"".join(by(3, H(i)) for i in range(4)))
query = env(4, 7, u(1, 1) + by(2, b"req-1") + b"".join(by(3, H(i)) for i in range(4)))
member = env(5, 7, u(1, 1) + b"".join(by(3, H(i)) for i in range(3)) + u(4, 1))
load = env(6, 9, u(1, 1) + by(2, LEASE) + packed_sint(3, [31, 30, 29, 28]))
release = env(7, 10, u(1, 1) + by(2, LEASE))
flush = env(8, 11, u(1, 1) + u(2, 10000))
stats = env(9, 13, u(1, 0))
unreg = env(10, 12, u(1, 1))
session = [hello, register, save, flush, query, load, release, member, stats, unreg]
out("fuzz_frame", "session", b"".join(frame(p) for p in session))
for i, p in enumerate(session):
    out("fuzz_frame", "msg-%02d" % i, frame(p))
out("fuzz_frame", "bad-hash", frame(env(11, 6, u(1, 1) + packed_sint(2, [0]) + by(3, b"short"))))
out("fuzz_frame", "count-mismatch", frame(env(12, 6, u(1, 1) + packed_sint(2, [0, 1]) + by(3, H(0)))))
out("fuzz_frame", "unpacked-ids", frame(env(13, 9, u(1, 1) + by(2, LEASE) + s(3, 4) + s(3, -7))))
out("fuzz_frame", "overlap-layout", frame(env(14, 4, by(1, b"ns") + u(4, 1) + u(5, 8192)
                                             + by(6, by(1, b"a") + u(3, 4) + u(4, 64) + u(5, 64) + u(6, 1))
                                             + by(6, by(1, b"b") + u(2, 32) + u(3, 4) + u(4, 64) + u(5, 64) + u(6, 1)))))
out("fuzz_frame", "oversized", struct.pack("<I", 9 << 20) + b"\x00" * 16)
out("fuzz_frame", "truncated", frame(save)[:-5])
out("fuzz_frame", "reply-type", frame(env(15, 15, u(1, 0))))
out("fuzz_frame", "empty", frame(b""))


# ---- layouts: mode, arena_size (u16), count, then per arena:
# [name index], [0xff escape?], offset, num_blocks, bytes_per_block,
# block_stride, segments, segment_stride (each: one byte < 0x80 = small value,
# 0x80 + u16 = medium, 0xc0 + u64 = anything) ----
def small(v):
    assert v < 64
    return bytes([v])


def med(v):
    return bytes([0x80]) + struct.pack("<H", v)


def lay(mode, size, arenas):
    b = bytes([mode]) + struct.pack("<H", size) + bytes([len(arenas)])
    for a in arenas:
        if not mode & 2:
            b += bytes([a[0]])
        b += bytes([0]) + b"".join(a[1:])
    return b


out("fuzz_layout", "one", lay(2, 4096, [(0, small(0), small(8), med(64), med(64), small(1), small(0))]))
out("fuzz_layout", "split-kv", lay(2, 8192, [(0, small(0), small(8), med(256), med(1024), small(2), med(512))]))
out("fuzz_layout", "two", lay(2, 8192, [(0, small(0), small(8), med(64), med(64), small(1), small(0)),
                                        (1, med(1024), small(8), med(96), med(128), small(1), small(0))]))
out("fuzz_layout", "interleaved", lay(2, 8192, [(0, small(0), small(8), med(32), med(64), small(1), small(0)),
                                                (1, med(32), small(8), med(32), med(64), small(1), small(0))]))
out("fuzz_layout", "overlap", lay(2, 8192, [(0, small(0), small(8), med(64), med(64), small(1), small(0)),
                                            (1, med(32), small(8), med(64), med(64), small(1), small(0))]))
out("fuzz_layout", "by-base", lay(3, 8192, [(0, small(0), small(8), med(64), med(64), small(1), small(0)),
                                            (1, med(600), small(8), med(64), med(64), small(1), small(0))]))
out("fuzz_layout", "dup-names", lay(0, 8192, [(0, small(0), small(4), med(64), med(64), small(1), small(0)),
                                              (5, med(512), small(4), med(64), med(64), small(1), small(0))]))

# Segments as separate regions (mode bit 8): each arena's fields are followed
# by one offset per segment, then one skew byte (0xfe/0xfd/0xfc: a wrong
# count, no array).
def lay_offs(mode, size, arenas, skew=0):
    b = bytes([mode | 8]) + struct.pack("<H", size) + bytes([len(arenas)])
    for a, offs in arenas:
        if not mode & 2:
            b += bytes([a[0]])
        b += bytes([0]) + b"".join(a[1:]) + b"".join(offs)
    return b + bytes([skew])


# vLLM's [2, num_blocks, ...] layer: the K half, then the V half, in 2 layers.
out("fuzz_layout", "kv-halves", lay_offs(2, 8192, [
    ((0, small(0), small(8), med(64), med(64), small(2), small(0)), [small(0), med(512)]),
    ((1, med(1024), small(8), med(64), med(64), small(2), small(0)), [small(0), med(512)])]))
# V before K, a gap between; the second layer's halves interleave the first's.
out("fuzz_layout", "kv-reversed", lay_offs(2, 8192, [
    ((0, small(0), small(8), med(32), med(64), small(2), small(0)), [med(1024), small(0)]),
    ((1, med(32), small(8), med(32), med(64), small(2), small(0)), [small(0), med(1024)])]))
out("fuzz_layout", "kv-overlap", lay_offs(2, 8192, [
    ((0, small(0), small(8), med(64), med(64), small(2), small(0)), [small(0), med(448)])]))
out("fuzz_layout", "kv-count-short", lay_offs(2, 8192, [
    ((0, small(0), small(8), med(64), med(64), small(2), small(0)), [small(0), med(512)])], 0xfe))
out("fuzz_layout", "kv-by-base", lay_offs(3, 8192, [
    ((0, small(0), small(4), med(64), med(64), small(2), small(0)), [small(0), med(256)]),
    ((1, med(600), small(4), med(64), med(64), small(2), small(0)), [small(0), med(256)])]))


# ---- engine ops: cfg, then ops (opcode % 9 and its bytes) ----
def ops(cfg, *seq):
    return bytes([cfg]) + b"".join(bytes(x) for x in seq)


SAVE = lambda n, start, keys: [0, n - 1, start] + keys
QUERY = lambda keys: [1, len(keys)] + keys
MEMBER = lambda keys: [2, len(keys) - 1] + keys
LOAD = lambda slot, how, start: [3, slot, how, start]
RELEASE = lambda slot: [4, slot]
FLUSH = [5]
EVICT = [6]
BADSAVE = [7, 1, 3, 0]
FORGED = [8] + list(range(16))
out("fuzz_engine_ops", "round-trip", ops(0, SAVE(4, 0, [0, 1, 2, 3]), FLUSH, QUERY([0, 1, 2, 3]), LOAD(0, 0, 4), MEMBER([0, 5, 2])))
out("fuzz_engine_ops", "world2", ops(8 | 1, SAVE(3, 2, [4, 5, 6]), QUERY([4, 5]), LOAD(0, 0, 1), LOAD(0, 0, 3), LOAD(0, 0, 5)))
out("fuzz_engine_ops", "gap", ops(2, SAVE(2, 0, [0, 2]), QUERY([0, 1, 2]), RELEASE(0), RELEASE(0), QUERY([1])))
out("fuzz_engine_ops", "evict", ops(4, SAVE(8, 0, [0, 1, 2, 3, 4, 5, 6, 7]), QUERY([0, 1]), EVICT, MEMBER([0, 1, 2, 3]), LOAD(0, 0, 2)))
out("fuzz_engine_ops", "bad", ops(1, SAVE(2, 0, [9, 10]), QUERY([9, 10]), LOAD(0, 1, 0), LOAD(0, 2, 0), LOAD(0, 3, 0), BADSAVE, FORGED, LOAD(0, 0, 0)))
out("fuzz_engine_ops", "dedup", ops(32, SAVE(4, 0, [1, 1, 2, 2]), SAVE(2, 5, [2, 3]), FLUSH, MEMBER([1, 2, 3, 4]), EVICT, QUERY([1])))

# ---- hash: block_size-1, salt_len, flags, salt, parent (16), tokens ----
out("fuzz_hash", "plain", bytes([15, 0, 0]) + bytes(16) + bytes(range(64)))
out("fuzz_hash", "salted", bytes([3, 5, 1]) + b"lora1" + bytes(range(16)) + bytes(range(200)))
out("fuzz_hash", "u32", bytes([7, 0, 2 | 4 * 3]) + bytes(16) + bytes(range(256)) * 2)
out("fuzz_hash", "partial", bytes([31, 2, 0x31]) + b"ab" + bytes(16) + bytes(range(100)))

# ---- hash_ex: block_size-1, salt_len, flags, n_extra, key_len, salt,
# parent (16), n_extra keys (len % 17, bytes), tokens ----
def xkeys(*keys):
    return b"".join(bytes([len(k)]) + k for k in keys)


out("fuzz_hash_ex", "none", bytes([15, 0, 0, 0, 32]) + bytes(16) + bytes(range(64)))
out("fuzz_hash_ex", "image", bytes([3, 5, 1, 4, 16]) + b"lora1" + bytes(range(16))
    + xkeys(b"", b"img-7f3a", b"img-7f3a", b"") + bytes(range(200)))
out("fuzz_hash_ex", "every", bytes([1, 0, 2 | 8 | 16 * 5, 8, 32]) + bytes(16)
    + xkeys(*[bytes([i]) * (i + 1) for i in range(8)]) + bytes(range(256)))
out("fuzz_hash_ex", "tail", bytes([7, 2, 0x31, 3, 64]) + b"ab" + bytes(16)
    + xkeys(b"", b"", b"tail") + bytes(range(20)))


# ---- cluster messages (docs/cluster.md; every parser runs on every input):
# node-to-node requests and replies, the peer handshake, directory values ----
def tier_msg(mtype, body):
    return struct.pack("<IHH", 0x4C43494F, 1, mtype) + body


def peer_msg(body):
    return struct.pack("<I", 0x5250494F) + body


def hello_msg(node_id, version=1):
    return peer_msg(struct.pack("<HH", version, len(node_id)) + bytes(range(32)) + node_id)


def welcome_msg(base, size, rkey):
    return peer_msg(bytes(range(100, 132)) + struct.pack("<QQII", base, size, len(rkey), 1 if rkey else 0) + rkey)


HASHES = b"".join(H(i) for i in range(4))
out("fuzz_cluster_msg", "lease", tier_msg(1, struct.pack("<QQII", 0x1234, 0x5678, 4, 0) + HASHES))
out("fuzz_cluster_msg", "lease-one", tier_msg(1, struct.pack("<QQII", 1, 2, 1, 0) + H(9)))
out("fuzz_cluster_msg", "lease-count-mismatch", tier_msg(1, struct.pack("<QQII", 1, 2, 5, 0) + HASHES))
out("fuzz_cluster_msg", "release", tier_msg(2, struct.pack("<Q", 42)))
out("fuzz_cluster_msg", "lease-reply", tier_msg(0x81, struct.pack("<QII", 42, 3, 0) + b"".join(
    struct.pack("<QQQ", 8192 * i, 8192, 0x9E3779B97F4A7C15 * (i + 1) & (2**64 - 1)) for i in range(3))))
out("fuzz_cluster_msg", "lease-reply-empty", tier_msg(0x81, struct.pack("<QII", 0, 0, 0)))
out("fuzz_cluster_msg", "release-reply", tier_msg(0x82, b""))
out("fuzz_cluster_msg", "hello", hello_msg(b"node-a"))
out("fuzz_cluster_msg", "hello-long-id", hello_msg(b"n" * 255))
out("fuzz_cluster_msg", "hello-version2", hello_msg(b"node-b", 2))
out("fuzz_cluster_msg", "auth", peer_msg(bytes(range(200, 232))))
out("fuzz_cluster_msg", "welcome-served", welcome_msg(0x7F0000000000, 1 << 30, b""))
out("fuzz_cluster_msg", "welcome-rma", welcome_msg(0x7F0000000000, 1 << 30, bytes(range(64))))
out("fuzz_cluster_msg", "welcome-wraps", welcome_msg(2**64 - 4096, 8192, b""))
out("fuzz_cluster_msg", "holder", b"node-a 1733091234567890")
out("fuzz_cluster_msg", "holder-bad-id", b"node/a 12")
out("fuzz_cluster_msg", "liveness", b"1733091234567890 10.0.0.7:7400")
out("fuzz_cluster_msg", "liveness-v6", b"18446744073709551615 [fe80::1]:7400")


# ---- fuzz_codec: frames of lib/codec (codec/frame.c), payloads, blocks ----
def codec_seeds():
    import xxhash

    kv = open(os.path.join(HERE, "..", "tests", "data", "kvcorpus", "kv.bin"), "rb").read(12288)

    def frame(codec, shape, logical, payload, data_xxh=0, version=1):
        h = struct.pack("<IBBBBII4HQ", 0x434B494F, version, codec, 1, 0, logical, len(payload), *shape, data_xxh)
        return h + struct.pack("<Q", xxhash.xxh3_64_intdigest(payload, seed=xxhash.xxh3_64_intdigest(h))) + payload

    blk = kv[:768]  # [1 part][2 tokens][3 heads][64] bf16
    n = len(blk) // 2
    exp = bytes(((blk[2 * i] | blk[2 * i + 1] << 8) >> 7) & 0xFF for i in range(n))
    sm = bytes((blk[2 * i + 1] & 0x80) | (blk[2 * i] & 0x7F) for i in range(n))
    raw = frame(1, (1, 2, 3, 64), len(blk), b"\x00" + exp + sm, xxhash.xxh3_64_intdigest(blk))
    out("fuzz_codec", "lossless-raw-planes", b"\x00" + raw)
    out("fuzz_codec", "lossless-empty", b"\x00" + frame(1, (0, 0, 0, 0), 0, b"\x00", xxhash.xxh3_64_intdigest(b"")))
    # int8: 6 fp16 scales of 1.0 then 384 int8 codes; fp8: 3 fp32 scales then 384 e4m3 codes
    out("fuzz_codec", "int8", b"\x00" + frame(2, (1, 2, 3, 64), 768, struct.pack("<6H", *[0x3C00] * 6) + bytes(range(256)) + bytes(128)))
    out("fuzz_codec", "int8-hadamard", b"\x00" + frame(4, (1, 2, 3, 64), 768, struct.pack("<6H", *[0x3C00] * 6) + bytes(range(256)) + bytes(128), version=3))
    out("fuzz_codec", "fp8", b"\x00" + frame(3, (1, 2, 3, 64), 768, struct.pack("<3f", 1.0, 0.5, 2.0) + bytes(range(126)) * 3 + bytes(6)))
    out("fuzz_codec", "payload-lossless-rans", b"\x01\x01\x01\x01\x01\x01\x01\x20" + b"\x01" + struct.pack("<HI", 1, 12) + bytes([0x7C, 0x7E, 0x80, 0x10, 0x80, 0x10, 0, 0, 0x80, 0, 0, 0x80]) + bytes(32))
    out("fuzz_codec", "payload-int8", b"\x01\x02\x01\x01\x02\x03\x40\x80\x03" + bytes(6 * 2 + 384))
    out("fuzz_codec", "encode-lossless", b"\x02\x00" + kv[:6144])
    out("fuzz_codec", "encode-int8", b"\x02\x01\x00\x0f\x02\x3f" + kv[:4096])
    out("fuzz_codec", "encode-fp8", b"\x02\x02\x01\x0f\x02\x3f" + kv[:8192])


codec_seeds()
