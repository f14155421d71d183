"""External keys and per-block extra keys through the Python binding, with
the frozen vectors of tests/hash/test_hash_vectors.py (python3-xxhash)."""
import hashlib

import pytest

import openinfer as oi


def test_block_key_vectors():
    assert oi.block_key(b"ab").hex() == "418d7f337b4a161d9d9bb6fafb70496a"
    digest = hashlib.sha256(b"block 0").digest()  # a vLLM-style block hash
    assert oi.block_key(digest).hex() == "7cc0242f8aaf8d03ff5dc6e9f1de5e23"
    assert oi.block_key(b"ab") != oi.block_key(b"ab\0")
    assert len(oi.block_key(bytes(oi.BLOCK_KEY_MAX))) == 16


def test_block_keys_batch_equals_single():
    keys = [hashlib.sha256(b"block %d" % i).digest() for i in range(20)]
    want = [oi.block_key(k) for k in keys]
    assert oi.block_keys(keys) == want
    assert oi.block_keys(b"".join(keys), 32) == want
    assert oi.block_keys(memoryview(bytearray(b"".join(keys))), 32) == want
    assert oi.block_keys([]) == []
    assert len(set(want)) == 20


def test_block_key_errors():
    for bad in (b"", bytes(oi.BLOCK_KEY_MAX + 1)):
        with pytest.raises(oi.InvalidArgumentError):
            oi.block_key(bad)
    with pytest.raises(oi.InvalidArgumentError):
        oi.block_keys([b"ab", b"abc"])
    with pytest.raises(oi.InvalidArgumentError):
        oi.block_keys(bytes(33), 32)
    with pytest.raises(oi.InvalidArgumentError):
        oi.block_keys([bytes(oi.BLOCK_KEY_MAX + 1)])


def test_hash_blocks_ex():
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    assert [h.hex() for h in oi.hash_blocks_ex(toks, 4, extra_keys=[b"img-0"])] == [
        "e60845be7c1e81dd0bf675bb2a350d94", "68afd095a39e854909d978be0df28d68"]
    plain = oi.hash_blocks(toks, 4, salt=b"s")
    assert oi.hash_blocks_ex(toks, 4, salt=b"s") == plain
    assert oi.hash_blocks_ex(toks, 4, salt=b"s", extra_keys=[b"", None, b"tail"]) == plain
    keyed = oi.hash_blocks_ex(toks, 4, salt=b"s", extra_keys=[None, b"lora:1"])
    assert keyed[0] == plain[0] and keyed[1] != plain[1]
    # continuing the chain from block 1 with its parent and extra key
    assert oi.hash_blocks_ex(toks[4:], 4, salt=b"s", parent=keyed[0],
                             extra_keys=[b"lora:1"]) == keyed[1:]
    with pytest.raises(oi.InvalidArgumentError):
        oi.hash_blocks_ex(toks, 0)
