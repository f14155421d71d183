// A namespace with a codec (docs/codecs.md) from Rust: bf16 KV-like blocks
// saved and loaded through lossless (byte-exact) and int8 (within half a
// scale step per token and head); the codec is the namespace's identity; a
// bad codec is refused naming it.
mod common;
use common::*;
use openinfer::*;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));

fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Block `block`'s bf16 element i: values in (-2, 2), as KV has (a narrow
/// range of exponents).
fn elem(block: u64, i: u64) -> u16 {
    let x = (block * 7919 + i).wrapping_mul(2654435761) >> 7;
    let f = ((x % 255) as f32 - 127.0) / 64.0;
    (f.to_bits() >> 16) as u16
}

fn fill_kv(buf: &mut [u8], slot: u64, block: u64) {
    for a in 0..2 {
        for i in 0..BPB / 2 {
            let off = (a * BLOCKS * BPB + slot * BPB + 2 * i) as usize;
            buf[off..off + 2].copy_from_slice(&elem(block, a * BPB + i).to_le_bytes());
        }
    }
}

fn round_trip(codec: &str, shape: Option<(u32, u32, u32)>, ns: &str) -> (Vec<u8>, Vec<u8>) {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let opts = layout(ns).codec(codec, shape);
    let mut e = OffloadEngine::new(&host, &opts, vec![0u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(48, 1000), 16, b"", None).unwrap();
    {
        let buf = e.buffer_mut().unwrap();
        for b in 0..3 {
            fill_kv(buf, b, b);
        }
    }
    e.save(&[0, 1, 2], &hs).unwrap().wait(T).unwrap();
    e.flush(T).unwrap();
    assert_eq!(e.stats().unwrap().saves_completed, 3);
    let q = e.query(None, &hs).unwrap();
    assert_eq!(q.hit_blocks, 3);
    e.load(q.lease.unwrap(), &[8, 9, 10]).unwrap().wait(T).unwrap();
    let buf = e.buffer().unwrap().to_vec();
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for b in 0..3u64 {
        want.extend(read_block(&buf, b));
        got.extend(read_block(&buf, 8 + b));
    }
    (want, got)
}

#[test]
fn lossless_is_byte_exact() {
    let (want, got) = round_trip("lossless", None, "rs/lossless");
    assert_eq!(got, want);
}

#[test]
fn int8_is_within_half_a_step() {
    // blocks of 2 x 4096 bytes: 2 parts of 16 tokens x 1 head x 128 channels
    let (want, got) = round_trip("int8", Some((16, 1, 128)), "rs/int8");
    assert_ne!(got, want);
    for (w, g) in want.chunks(256).zip(got.chunks(256)) {
        let w: Vec<f32> = w.chunks(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect();
        let g: Vec<f32> = g.chunks(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect();
        let step = w.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        for (a, b) in w.iter().zip(g.iter()) {
            assert!((a - b).abs() <= step / 2.0 + a.abs() / 128.0, "{} vs {}", a, b);
        }
    }
}

#[test]
fn int8_hadamard_is_within_its_bound() {
    // each group of 128 (a token's channels of a head) is int8 of y = H x / 8
    // (H: the Sylvester Hadamard matrix of order 128, entries (-1)^popcount(i & j)):
    // within 8 half steps of x in L2, plus the bf16 rounding
    let (want, got) = round_trip("int8-hadamard", Some((16, 1, 128)), "rs/int8h");
    assert_ne!(got, want);
    let sign = |i: usize, j: usize| if (i & j).count_ones() % 2 == 1 { -1.0f64 } else { 1.0 };
    for (w, g) in want.chunks(256).zip(got.chunks(256)) {
        let w: Vec<f64> = w.chunks(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64).collect();
        let g: Vec<f64> = g.chunks(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64).collect();
        let amax = (0..128)
            .map(|i| ((0..128).map(|j| sign(i, j) * w[j]).sum::<f64>() / 8.0).abs())
            .fold(0f64, f64::max);
        let err = w.iter().zip(g.iter()).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
        let norm = g.iter().map(|b| b * b).sum::<f64>().sqrt();
        assert!(err <= 8.0 * amax / 127.0 / 2.0 * 1.001 + norm / 256.0, "{} past the bound", err);
    }
}

fn refused(r: Result<OffloadEngine<'_>>) -> Error {
    match r {
        Ok(_) => panic!("an engine was made"),
        Err(e) => e,
    }
}

#[test]
fn the_codec_is_the_namespace_identity() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let _e = OffloadEngine::new(&host, &layout("rs/id").codec("lossless", None), vec![0u8; span()]).unwrap();
    let err = refused(OffloadEngine::new(&host, &layout("rs/id"), vec![0u8; span()]));
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("codec lossless"), "{}", err.message());
    let err = refused(OffloadEngine::new(&host, &layout("rs/bad").codec("zstd", None), vec![0u8; span()]));
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("codec 'zstd'"), "{}", err.message());
    let err = refused(OffloadEngine::new(&host, &layout("rs/bad").codec("fp8", None), vec![0u8; span()]));
    assert!(err.message().contains("needs the block's shape"), "{}", err.message());
}
