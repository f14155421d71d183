"""Namespaces with a codec (docs/codecs.md) from Python: real KV pages of the
committed corpus (tests/data/kvcorpus/kv.bin) saved and loaded through
lossless (byte-exact), int8 (within half a scale step per token and
head) and int8-hadamard (within its bound per token and head), embedded and through a real `openinfer serve`; the codec is the
namespace's identity; bad codec options raise InvalidArgumentError."""
import json
import os
import subprocess

import pytest

import openinfer as oi

PAGE = 12288  # [K|V][16 tokens][3 heads][64] bf16
SHAPE = (16, 3, 64)
N = 24
CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "data", "kvcorpus",
                      "kv.bin")


@pytest.fixture(scope="module")
def pages():
    with open(CORPUS, "rb") as f:
        data = f.read(N * PAGE)
    assert len(data) == N * PAGE
    return data


def arena():
    return [oi.Arena("kv", 2 * N, PAGE, offset=0)]


def bf16(raw):
    np = pytest.importorskip("numpy")
    u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
    return u.view(np.float32)


def int8_close(got, want):
    """Every (token, head) group of 64 within half its scale step (amax / 127),
    plus the bf16 rounding of the decoded value."""
    np = pytest.importorskip("numpy")
    g = bf16(got).reshape(-1, 64)
    w = bf16(want).reshape(-1, 64)
    step = np.abs(w).max(axis=1, keepdims=True) / 127.0
    return bool(np.all(np.abs(g - w) <= step / 2 + np.abs(w) / 128 + 1e-30))


def int8_hadamard_close(got, want):
    """Every (token, head) group of 64 within int8-hadamard's bound in L2:
    its codes are within half a step of y = H x / 8 (H: the Sylvester
    Hadamard matrix, step = amax |y| / 127), which H / 8 takes back at the
    same norm: at most 8 half steps, plus the bf16 rounding."""
    np = pytest.importorskip("numpy")
    H = np.array([[1.0]])
    while H.shape[0] < 64:
        H = np.block([[H, H], [H, -H]])
    g = bf16(got).reshape(-1, 64).astype(np.float64)
    w = bf16(want).reshape(-1, 64).astype(np.float64)
    step = np.abs(w @ H.T / 8).max(axis=1) / 127.0
    err = np.linalg.norm(g - w, axis=1)
    return bool(np.all(err <= 8 * step / 2 * 1.001 + np.linalg.norm(g, axis=1) / 256 + 1e-30))


def save_load(e, write, read, pages, tag):
    hs = oi.hash_blocks(range(tag, tag + N * 16), 16)
    write(0, pages)
    e.save(list(range(N)), hs).wait(30)
    e.flush(30)
    q = e.query(hs)
    assert q.hit_blocks == N
    e.load(q.lease, list(range(N, 2 * N))).wait(30)
    return read(N * PAGE, N * PAGE)


def test_embedded_lossless_and_int8(pages):
    buf = bytearray(2 * N * PAGE)

    def write(off, data):
        buf[off:off + len(data)] = data

    def read(off, n):
        return bytes(buf[off:off + n])

    with oi.OffloadHost(32 << 20) as h:
        with oi.OffloadEngine(h, "py/lossless", arena(), buffer=buf, codec="lossless") as e:
            assert save_load(e, write, read, pages, 1) == pages
            assert e.stats()["saves_completed"] == N
        with oi.OffloadEngine(h, "py/int8", arena(), buffer=buf, codec="int8",
                              codec_shape=SHAPE) as e:
            got = save_load(e, write, read, pages, 2)
            assert got != pages and int8_close(got, pages)
        with oi.OffloadEngine(h, "py/int8-hadamard", arena(), buffer=buf, codec="int8-hadamard",
                              codec_shape=SHAPE) as e:
            goth = save_load(e, write, read, pages, 3)
            assert goth != got and int8_hadamard_close(goth, pages)
            # the rotation's point: less error than int8's on the same pages
            np = pytest.importorskip("numpy")
            assert np.abs(bf16(goth) - bf16(pages)).mean() < np.abs(bf16(got) - bf16(pages)).mean()
            assert e.stats()["saves_completed"] == N
        # the codec is the namespace's identity
        with pytest.raises(oi.InvalidArgumentError, match="namespace 'py/lossless'"):
            oi.OffloadEngine(h, "py/lossless", arena(), buffer=buf)
        with pytest.raises(oi.InvalidArgumentError, match="codec 'lz4'"):
            oi.OffloadEngine(h, "py/x", arena(), buffer=buf, codec="lz4")
        with pytest.raises(oi.InvalidArgumentError, match="needs the block's shape"):
            oi.OffloadEngine(h, "py/x", arena(), buffer=buf, codec="fp8")
        with pytest.raises(oi.InvalidArgumentError, match="codec_shape"):
            oi.OffloadEngine(h, "py/x", arena(), buffer=buf, codec="fp8", codec_shape=(16, 3))


def test_sidecar_lossless(serve, pages):
    e, a = oi.OffloadEngine.connect(serve, "py/sidecar-lossless", arena(), codec="lossless")
    try:
        assert save_load(e, a.write, a.read, pages, 3) == pages
        # random bytes do not fit a lossless slot: not stored, counted on the server
        a.write(0, os.urandom(4 * PAGE))
        e.save(list(range(4)), oi.hash_blocks(range(9000, 9000 + 4 * 16), 16)).wait(30)
        e.flush(30)
        st = e.stats()
        assert (st["saves_not_encoded"], st["saves_completed"]) == (4, N), st
        assert st["saves_failed"] == 4
    finally:
        a.close()
        e.close()
    # the server's figures name the codec and its ratio
    out = subprocess.run([os.environ["OPENINFER_EXE"], "stats", "--socket", serve, "--json"],
                         check=True, capture_output=True, text=True).stdout
    ns = {n["name"]: n for n in json.loads(out)["namespaces"]}["py/sidecar-lossless"]
    assert ns["codec"] == "lossless" and ns["blocks_resident"] == N
    assert ns["logical_bytes"] == N * PAGE and ns["stored_bytes"] == 8960
    assert ns["logical_bytes"] / ns["physical_bytes"] >= 1.35
    # a second client of another codec is refused by the server
    with pytest.raises(oi.InvalidArgumentError, match="codec"):
        oi.OffloadEngine.connect(serve, "py/sidecar-lossless", arena(), codec="int8",
                                 codec_shape=SHAPE)


@pytest.mark.parametrize("codec", ["lossless", "int8"])
def test_sidecar_layer_by_layer(serve, pages, codec):
    """Through the server, a codec namespace saves layer by layer (K then V
    arenas: a block is stored once its last arena landed, never before) and
    a layered load reports each arena; every byte comes back (lossless) or
    within int8's bound."""
    half = PAGE // 2
    arenas = [oi.Arena("k", 2 * N, half, offset=0), oi.Arena("v", 2 * N, half, offset=2 * N * half)]
    kw = {"codec_shape": SHAPE} if codec == "int8" else {}
    e, a = oi.OffloadEngine.connect(serve, "py/sidecar-layers-" + codec, arenas, codec=codec, **kw)
    try:
        for b in range(N):
            a.write(b * half, pages[b * PAGE:b * PAGE + half])
            a.write(2 * N * half + b * half, pages[b * PAGE + half:(b + 1) * PAGE])
        hs = oi.hash_blocks(range(7000, 7000 + N * 16), 16)
        e.save(list(range(N)), hs, arena_first=1, arena_count=1).wait(30)
        assert e.query(hs).hit_blocks == 0  # the V arena alone: nothing stored
        e.save(list(range(N)), hs, arena_first=0, arena_count=1).wait(30)
        e.flush(30)
        q = e.query(hs)
        assert q.hit_blocks == N
        t = e.load(q.lease, list(range(N, 2 * N)), arena_events=True)
        t.arena_wait(0, 30)
        t.arena_wait(1, 30)
        t.wait(30)
        got = b"".join(a.read(b * half, half) + a.read(2 * N * half + b * half, half)
                       for b in range(N, 2 * N))
        if codec == "lossless":
            assert got == pages
        else:
            assert got != pages and int8_close(got, pages)
        assert e.stats()["saves_completed"] >= N
    finally:
        a.close()
        e.close()
