//! Segment offsets (vLLM's `[2, num_blocks, block_bytes]` layers), layerwise
//! saves and layered loads with per-arena waits, embedded on the cpu backend.
use openinfer::*;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));
const LAYERS: u64 = 3;
const NB: u64 = 8;
const BB: u64 = 4096;

/// Bytes of one layer: `[2, NB, BB]`, the K half then the V half.
const LAYER_BYTES: u64 = 2 * NB * BB;

fn host() -> OffloadHost {
    OffloadHost::new(&HostOptions::new(16 << 20)).unwrap()
}

/// One arena per layer whose two segments are the K half and the V half of
/// the layer's buffer: block b's K at `layer*LAYER_BYTES + b*BB`, its V at
/// `layer*LAYER_BYTES + NB*BB + b*BB`. The descriptors alone (segment_stride
/// BB inside a block stride of BB) would be refused: only the offsets make
/// this a layout.
fn vllm_layout(ns: &str) -> EngineOptions {
    let arenas = (0..LAYERS)
        .map(|l| ArenaDesc::new(&format!("layer{}", l), NB, BB).offset(l * LAYER_BYTES).segments(2, BB, BB))
        .collect();
    let offsets = (0..LAYERS).flat_map(|_| vec![0, NB * BB]).collect();
    EngineOptions::new(ns, arenas).segment_offsets(offsets)
}

/// The same block shape as the descriptors' rule: K and V of a block side by
/// side (`[NB, 2, BB]` per layer).
fn interleaved_layout(ns: &str) -> EngineOptions {
    let arenas = (0..LAYERS)
        .map(|l| ArenaDesc::new(&format!("layer{}", l), NB, BB).offset(l * LAYER_BYTES).segments(2, BB, 2 * BB))
        .collect();
    EngineOptions::new(ns, arenas)
}

fn pattern(seed: u64, block: u64, layer: u64, kv: u64) -> Vec<u8> {
    (0..BB).map(|i| ((seed * 1009 + block * 131 + layer * 31 + kv * 7 + i).wrapping_mul(2654435761) >> 11) as u8).collect()
}

fn k_off(layer: u64, slot: u64) -> usize {
    (layer * LAYER_BYTES + slot * BB) as usize
}
fn v_off(layer: u64, slot: u64) -> usize {
    (layer * LAYER_BYTES + NB * BB + slot * BB) as usize
}
fn ik_off(layer: u64, slot: u64) -> usize {
    (layer * LAYER_BYTES + slot * 2 * BB) as usize
}
fn iv_off(layer: u64, slot: u64) -> usize {
    ik_off(layer, slot) + BB as usize
}

/// Writes logical block `block` (seed) into device block `slot` of a vLLM buffer.
fn fill_vllm(buf: &mut [u8], slot: u64, seed: u64, block: u64) {
    for l in 0..LAYERS {
        buf[k_off(l, slot)..k_off(l, slot) + BB as usize].copy_from_slice(&pattern(seed, block, l, 0));
        buf[v_off(l, slot)..v_off(l, slot) + BB as usize].copy_from_slice(&pattern(seed, block, l, 1));
    }
}

fn span() -> usize {
    (LAYERS * LAYER_BYTES) as usize
}

#[test]
fn segment_offsets_vllm_layer_round_trip() {
    let host = host();
    let opts = vllm_layout("rs/vllm");
    assert_eq!(opts.span(), LAYERS * LAYER_BYTES);
    let mut buf = vec![0u8; span()];
    for b in 0..3 {
        fill_vllm(&mut buf, b, 5, b);
    }
    let mut want = buf.clone();
    let mut e = OffloadEngine::new(&host, &opts, buf).unwrap();
    let hs = hash_blocks(&(100..148).collect::<Vec<u32>>(), 16, b"", None).unwrap();
    e.save(&[0, 1, 2], &hs).unwrap().wait(T).unwrap();
    let st = e.stats().unwrap();
    assert_eq!(st.block_bytes, LAYERS * 2 * BB);
    assert_eq!(st.num_blocks, NB);
    assert_eq!(st.saves_completed, 3);
    assert_eq!(st.bytes_saved, 3 * LAYERS * 2 * BB);
    let q = e.query(None, &hs).unwrap();
    assert_eq!(q.hit_blocks, 3);
    e.load(q.lease.unwrap(), &[5, 6, 7]).unwrap().wait(T).unwrap();
    // The whole buffer: K halves into K halves, V halves into V halves, and
    // nothing written anywhere else.
    for b in 0..3 {
        fill_vllm(&mut want, 5 + b, 5, b);
    }
    assert!(e.buffer().unwrap() == &want[..], "the vLLM layer did not round trip byte-exact");

    // The host block is [layer0 K, layer0 V, layer1 K, ...]: an engine of the
    // same shape with K and V side by side gets each half in its place.
    let mut f = OffloadEngine::new(&host, &interleaved_layout("rs/vllm"), vec![0u8; span()]).unwrap();
    let q = f.query(None, &hs).unwrap();
    assert_eq!(q.hit_blocks, 3);
    f.load(q.lease.unwrap(), &[1, 2, 3]).unwrap().wait(T).unwrap();
    let got = f.buffer().unwrap();
    for b in 0..3u64 {
        for l in 0..LAYERS {
            let slot = 1 + b;
            assert_eq!(&got[ik_off(l, slot)..ik_off(l, slot) + BB as usize], &pattern(5, b, l, 0)[..]);
            assert_eq!(&got[iv_off(l, slot)..iv_off(l, slot) + BB as usize], &pattern(5, b, l, 1)[..]);
        }
    }
}

#[test]
fn segment_offsets_of_the_wrong_count_are_refused_by_the_library() {
    let host = host();
    // 5 offsets for 3 arenas of 2 segments.
    let opts = vllm_layout("rs/vllm-bad").segment_offsets(vec![0, NB * BB, 0, NB * BB, 0]);
    assert_eq!(opts.total_segments(), 6);
    let err = OffloadEngine::new(&host, &opts, vec![0u8; span()]).err().expect("5 offsets for 6 segments");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(err.status(), sys::OI_ERR_INVALID_ARGUMENT);
    assert!(!err.message().is_empty(), "the library's message is carried: {:?}", err);
    // None at all for a layout that needs some.
    let err = OffloadEngine::new(&host, &vllm_layout("rs/vllm-bad").segment_offsets(Vec::new()), vec![0u8; span()])
        .err()
        .expect("no offsets for 6 segments");
    assert_eq!(err.status(), sys::OI_ERR_INVALID_ARGUMENT);
    // The right count, but the V half overlaps the next block's K.
    let overlap = vllm_layout("rs/vllm-bad").segment_offsets((0..LAYERS).flat_map(|_| vec![0, BB]).collect());
    let err = OffloadEngine::new(&host, &overlap, vec![0u8; span()]).err().expect("overlapping segments");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    // And the valid layout is accepted on the same host.
    OffloadEngine::new(&host, &vllm_layout("rs/vllm-bad"), vec![0u8; span()]).unwrap();
}

#[test]
fn layerwise_save_seals_after_the_last_layer() {
    let host = host();
    let mut buf = vec![0u8; span()];
    for b in 0..4 {
        fill_vllm(&mut buf, b, 9, b);
    }
    let mut want = buf.clone();
    let e = OffloadEngine::new(&host, &vllm_layout("rs/layerwise"), buf).unwrap();
    let hs = hash_blocks(&(500..564).collect::<Vec<u32>>(), 16, b"", None).unwrap();
    let ids = [0i64, 1, 2, 3];
    for layer in 0..LAYERS as u32 {
        let t = e.save_with(&ids, &hs, SaveOptions::new().arenas(layer, 1).counts(true)).unwrap();
        t.wait(T).unwrap();
        // The first layer decides for the whole block; later layers count 0.
        let want_counts = if layer == 0 { SaveResult { accepted: 4, deduplicated: 0, dropped: 0 } } else { SaveResult::default() };
        assert_eq!(t.save_result(), Some(want_counts), "layer {}", layer);
        drop(t);
        let q = e.query(None, &hs).unwrap();
        if layer + 1 < LAYERS as u32 {
            // Not every arena arrived: no hit, the blocks are still in flight.
            assert_eq!(q.hit_blocks, 0, "a block counted as a hit after layer {}", layer);
            assert!(q.lease.is_none());
            assert_eq!(q.pending_blocks, 4);
            assert_eq!(e.membership(&hs).unwrap().present, vec![false; 4]);
            assert_eq!(e.stats().unwrap().saves_completed, 0);
        } else {
            assert_eq!(q.hit_blocks, 4, "the blocks did not seal after the last layer");
            assert_eq!(q.pending_blocks, 0);
            let st = e.stats().unwrap();
            assert_eq!(st.saves_submitted, 4);
            assert_eq!(st.saves_completed, 4);
            assert_eq!(st.namespace_blocks_resident, 4);
            let t = e.load(q.lease.unwrap(), &[4, 5, 6, 7]).unwrap();
            t.wait(T).unwrap();
        }
    }
    let mut e = e;
    for b in 0..4 {
        fill_vllm(&mut want, 4 + b, 9, b);
    }
    assert!(e.buffer().unwrap() == &want[..], "the layerwise-saved blocks did not load byte-exact");
    // A range past the layout is refused.
    let err = e.save_with(&[0], &hs[..1], SaveOptions::new().arenas(LAYERS as u32, 1)).err().unwrap();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

#[test]
fn layered_load_reports_each_arena_in_order() {
    let host = host();
    let mut buf = vec![0u8; span()];
    for b in 0..4 {
        fill_vllm(&mut buf, b, 13, b);
    }
    let e = OffloadEngine::new(&host, &vllm_layout("rs/layered"), buf).unwrap();
    let hs = hash_blocks(&(900..964).collect::<Vec<u32>>(), 16, b"", None).unwrap();
    e.save(&[0, 1, 2, 3], &hs).unwrap().wait(T).unwrap();
    let dst = [7i64, 6, 5, 4];
    let q = e.query(None, &hs).unwrap();
    assert_eq!(q.hit_blocks, 4);
    let t = e.load_with(q.lease.unwrap(), &dst, &LoadOptions::new().arena_events(true)).unwrap();
    let mem = e.memory_ptr() as *const u8;
    for layer in 0..LAYERS {
        t.arena_wait(layer as u32, T).unwrap();
        assert_eq!(t.arena_poll(layer as u32), Ok(true));
        // This arena's bytes are in place (later arenas may still be moving:
        // only this layer's region is read).
        let region = unsafe { std::slice::from_raw_parts(mem.add((layer * LAYER_BYTES) as usize), LAYER_BYTES as usize) };
        for (b, slot) in dst.iter().enumerate() {
            let k = k_off(0, *slot as u64);
            let v = v_off(0, *slot as u64);
            assert_eq!(&region[k..k + BB as usize], &pattern(13, b as u64, layer, 0)[..], "layer {} K of {}", layer, b);
            assert_eq!(&region[v..v + BB as usize], &pattern(13, b as u64, layer, 1)[..], "layer {} V of {}", layer, b);
        }
        assert!(t.arena_event(layer as u32).is_null()); // no CUDA events on cpu
    }
    t.wait(T).unwrap();
    assert_eq!(t.arena_wait(LAYERS as u32, T).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(t.arena_poll(LAYERS as u32).unwrap_err().code(), ErrorCode::InvalidArgument);
    drop(t);

    // A plain load has no per-arena progress: an arena wait waits for the
    // whole load.
    let q = e.query(None, &hs).unwrap();
    let t = e.load(q.lease.unwrap(), &[0, 1, 2, 3]).unwrap();
    t.arena_wait(0, T).unwrap();
    assert_eq!(t.poll(), Ok(true));
    assert_eq!(t.arena_poll(LAYERS as u32 + 5), Ok(true));
    drop(t);
    assert_eq!(e.stats().unwrap().loads_submitted, 2);
    assert_eq!(e.stats().unwrap().loads_completed, 2);
}
