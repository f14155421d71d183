// External keys and per-block extra keys through the safe binding, with the
// frozen vectors of tests/hash/test_hash_vectors.py (computed there with
// python3-xxhash).
use openinfer::*;

fn hex(h: &BlockHash) -> String {
    h.0.iter().map(|b| format!("{:02x}", b)).collect()
}

#[test]
fn block_key_vectors_and_batch() {
    assert_eq!(hex(&block_key(b"ab").unwrap()), "418d7f337b4a161d9d9bb6fafb70496a");
    let packed: Vec<u8> = (0..32 * 10).map(|i| (i * 7 + 3) as u8).collect();
    let batch = block_keys(&packed, 32).unwrap();
    assert_eq!(batch.len(), 10);
    for (i, h) in batch.iter().enumerate() {
        assert_eq!(*h, block_key(&packed[i * 32..(i + 1) * 32]).unwrap());
    }
    assert_ne!(block_key(b"ab").unwrap(), block_key(b"ab\0").unwrap());
    assert!(block_keys(&[], 32).unwrap().is_empty());
}

#[test]
fn block_key_errors() {
    assert_eq!(block_key(b"").unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(block_key(&[0u8; BLOCK_KEY_MAX + 1]).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert!(block_key(&[0u8; BLOCK_KEY_MAX]).is_ok());
    assert_eq!(block_keys(&[0u8; 33], 32).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(block_keys(&[0u8; 32], 0).unwrap_err().code(), ErrorCode::InvalidArgument);
}

#[test]
fn hash_blocks_ex_vectors() {
    let toks = [1u32, 2, 3, 4, 5, 6, 7, 8];
    let hs = hash_blocks_ex(&toks, 4, b"", None, &[b"img-0"]).unwrap();
    let got: Vec<String> = hs.iter().map(hex).collect();
    assert_eq!(got, ["e60845be7c1e81dd0bf675bb2a350d94", "68afd095a39e854909d978be0df28d68"]);
    // No extra keys (or only empty ones): the plain chain.
    let plain = hash_blocks(&toks, 4, b"s", None).unwrap();
    assert_eq!(hash_blocks_ex(&toks, 4, b"s", None, &[]).unwrap(), plain);
    assert_eq!(hash_blocks_ex(&toks, 4, b"s", None, &[b"", b""]).unwrap(), plain);
    // A key on block 1 leaves block 0 alone.
    let keyed = hash_blocks_ex(&toks, 4, b"s", None, &[b"", b"lora:1"]).unwrap();
    assert_eq!(keyed[0], plain[0]);
    assert_ne!(keyed[1], plain[1]);
    assert_eq!(hash_blocks_ex(&toks, 0, b"", None, &[]).unwrap_err().code(), ErrorCode::InvalidArgument);
}
