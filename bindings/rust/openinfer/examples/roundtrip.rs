//! save -> query -> load with an embedded host on the cpu backend.
//!     LIBOPENINFER_DIR=.../build/lib cargo run --example roundtrip
use openinfer::*;

fn main() -> Result<()> {
    const BLOCKS: u64 = 8;
    const BPB: u64 = 4096;
    let host = OffloadHost::new(&HostOptions::new(16 << 20))?;
    let opts = EngineOptions::new(
        "example/model",
        vec![ArenaDesc::new("k", BLOCKS, BPB), ArenaDesc::new("v", BLOCKS, BPB).offset(BLOCKS * BPB)],
    );
    let mut engine = OffloadEngine::new(&host, &opts, vec![0u8; (2 * BLOCKS * BPB) as usize])?;
    let prompt: Vec<u32> = (1000..1048).collect();
    let hashes = hash_blocks(&prompt, 16, b"", None)?; // one hash per full 16-token block

    for (i, b) in engine.buffer_mut()?.iter_mut().enumerate() {
        *b = (i % 251) as u8; // the KV the model wrote
    }
    let original = engine.buffer()?.to_vec();
    engine.save(&[0, 1, 2], &hashes)?.wait(None)?; // device -> host tier

    engine.buffer_mut()?.iter_mut().for_each(|b| *b = 0); // evicted from the GPU
    let q = engine.query(Some("req-1"), &hashes)?;
    println!("hit blocks: {}", q.hit_blocks);
    engine.load(q.lease.expect("a lease"), &[0, 1, 2])?.wait(None)?; // host tier -> device
    let restored = engine.buffer()?.to_vec();
    for slot in 0..3usize {
        for a in 0..2usize {
            let off = a * (BLOCKS * BPB) as usize + slot * BPB as usize;
            assert_eq!(restored[off..off + BPB as usize], original[off..off + BPB as usize]);
        }
    }
    println!("restored {} blocks byte-exact", q.hit_blocks);
    Ok(())
}
