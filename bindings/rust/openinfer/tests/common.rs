#![allow(dead_code)]
use openinfer::*;

pub const BLOCKS: u64 = 16;
pub const BPB: u64 = 4096;

pub fn layout(ns: &str) -> EngineOptions {
    EngineOptions::new(
        ns,
        vec![ArenaDesc::new("k", BLOCKS, BPB), ArenaDesc::new("v", BLOCKS, BPB).offset(BLOCKS * BPB)],
    )
}

pub fn span() -> usize {
    (2 * BLOCKS * BPB) as usize
}

pub fn pattern(seed: u64, block: u64, arena: u64) -> Vec<u8> {
    (0..BPB).map(|i| ((seed * 131 + block * 31 + arena * 7 + i).wrapping_mul(2654435761) >> 13) as u8).collect()
}

pub fn fill(buf: &mut [u8], slot: u64, seed: u64, block: u64) {
    for a in 0..2 {
        let off = (a * BLOCKS * BPB + slot * BPB) as usize;
        buf[off..off + BPB as usize].copy_from_slice(&pattern(seed, block, a));
    }
}

pub fn read_block(buf: &[u8], slot: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for a in 0..2 {
        let off = (a * BLOCKS * BPB + slot * BPB) as usize;
        out.extend_from_slice(&buf[off..off + BPB as usize]);
    }
    out
}

pub fn expected(seed: u64, block: u64) -> Vec<u8> {
    let mut v = pattern(seed, block, 0);
    v.extend(pattern(seed, block, 1));
    v
}

pub fn tokens(n: u32, start: u32) -> Vec<u32> {
    (start..start + n).collect()
}
