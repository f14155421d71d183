//! Engine-owned sidecar memory: a `SharedBuffer` (sealed memfd) registered
//! with a real `openinfer serve`, which is SIGKILLed under the engine (it
//! degrades) and restarted on the same socket (it reconnects).
mod common;
use common::*;
use openinfer::*;
use std::io::Read;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(30));

#[test]
fn shared_buffer_is_a_sealed_shared_memfd() {
    assert_eq!(SharedBuffer::new(0).unwrap_err().code(), ErrorCode::InvalidArgument);
    let len = 3 * 4096 + 5;
    let mut b = SharedBuffer::new(len).unwrap();
    assert_eq!(b.len(), len);
    assert!(!b.is_empty());
    assert!(b.fd() >= 0);
    assert!(b.seals().unwrap() & 0x2 != 0, "F_SEAL_SHRINK is not set");
    assert!(b.as_slice().iter().all(|&x| x == 0));
    for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = (i * 7 % 251) as u8;
    }
    // The mapping is the memfd's (MAP_SHARED): reading the file gives the bytes.
    let mut f = std::fs::File::open(format!("/proc/self/fd/{}", b.fd())).unwrap();
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), len);
    assert!(got == b.as_slice());
    // Writes through the file land in the mapping too.
    drop(f);
    let mut w = std::fs::OpenOptions::new().write(true).open(format!("/proc/self/fd/{}", b.fd())).unwrap();
    std::io::Write::write_all(&mut w, b"openinfer").unwrap();
    assert_eq!(&b.as_slice()[..9], b"openinfer");
}

fn wait_for(e: &OffloadEngine<'_>, what: &str, limit: Duration, ok: impl Fn(&EngineStats) -> bool) -> EngineStats {
    let start = Instant::now();
    loop {
        let s = e.stats().unwrap();
        if ok(&s) {
            return s;
        }
        assert!(start.elapsed() < limit, "{} within {:?}: {:?}", what, limit, s);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Saves logical blocks 0..3 (seed) from device blocks `src`, loads them into
/// `dst` and compares the bytes.
fn round_trip(e: &mut OffloadEngine<'static>, hs: &[BlockHash], seed: u64, src: [u64; 3], dst: [u64; 3]) {
    {
        let buf = e.buffer_mut().unwrap();
        for (b, slot) in src.iter().enumerate() {
            fill(buf, *slot, seed, b as u64);
        }
        for slot in dst {
            fill(buf, slot, 0, 999); // not the expected bytes
        }
    }
    let ids: Vec<i64> = src.iter().map(|&s| s as i64).collect();
    e.save(&ids, hs).unwrap().wait(T).unwrap();
    e.flush(T).unwrap();
    let q = e.query(None, hs).unwrap();
    assert_eq!(q.hit_blocks, 3);
    let dst_ids: Vec<i64> = dst.iter().map(|&s| s as i64).collect();
    e.load(q.lease.unwrap(), &dst_ids).unwrap().wait(T).unwrap();
    let buf = e.buffer().unwrap();
    for (b, slot) in dst.iter().enumerate() {
        assert_eq!(read_block(buf, *slot), expected(seed, b as u64), "block {} in slot {}", b, slot);
    }
}

#[test]
fn owned_sidecar_degrades_and_reconnects() {
    let mut server = match ServeProcess::start("owned") {
        Some(s) => s,
        None => return,
    };
    let mut opts = layout("rs/owned");
    opts.control_deadline_ms = Some(5000);
    let mem = SharedBuffer::new(span()).unwrap();
    let base = mem.as_ptr();
    let mut e = OffloadEngine::connect_owned(Some(&server.sock), &opts, mem).unwrap();
    // The engine works on the caller's memory itself.
    assert_eq!(e.memory_ptr() as *mut u8, base);
    assert_eq!(e.memory_len(), span() as u64);
    let s = e.stats().unwrap();
    assert_eq!(s.connection, ConnectionState::Connected);
    assert_ne!(s.server_epoch, 0);
    assert_eq!(s.reconnects, 0);
    let epoch1 = s.server_epoch;

    let hs = hash_blocks(&tokens(48, 2000), 16, b"", None).unwrap();
    round_trip(&mut e, &hs, 11, [0, 1, 2], [9, 4, 13]);
    let s = e.stats().unwrap();
    assert_eq!(s.saves_completed, 3);
    assert_eq!(s.blocks_loaded, 3);
    assert_eq!(s.disconnected_saves, 0);
    // A lease of the first server, kept across the kill.
    let old = e.query(None, &hs).unwrap();
    assert_eq!(old.hit_blocks, 3);
    let old_lease = old.lease.unwrap();

    server.kill();
    let s = wait_for(&e, "Degraded", Duration::from_secs(10), |s| s.connection == ConnectionState::Degraded);
    assert_eq!(s.server_epoch, 0);
    // Queries miss (OI_OK, no lease).
    let q = e.query(None, &hs).unwrap();
    assert_eq!(q.hit_blocks, 0);
    assert!(q.lease.is_none());
    assert_eq!(e.membership(&hs).unwrap().present, vec![false; 3]);
    // A save is dropped: its ticket completes at once, the blocks are counted.
    let more = hash_blocks(&tokens(32, 5000), 16, b"", None).unwrap();
    let before = e.stats().unwrap().disconnected_saves;
    let (tx, rx) = std::sync::mpsc::channel();
    let t = e.save_with(&[5, 6], &more, SaveOptions::new().on_done(move |r| tx.send(r).unwrap())).unwrap();
    t.wait(T).unwrap();
    drop(t);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Ok(()));
    // Loads fail with Closed; release reports the lease expired.
    assert_eq!(e.load(old_lease, &[10, 11, 12]).err().unwrap().code(), ErrorCode::Closed);
    assert_eq!(e.release(old_lease).unwrap_err().code(), ErrorCode::LeaseExpired);
    e.flush(Some(Duration::from_secs(5))).unwrap();
    let s = e.stats().unwrap();
    assert_eq!(s.connection, ConnectionState::Degraded);
    assert_eq!(s.disconnected_saves, before + 2);
    assert!(s.disconnected_query_misses >= 6, "{:?}", s);
    assert_eq!(s.num_blocks, common::BLOCKS);

    // A server comes back on the same socket: the engine registers again.
    server.restart();
    let s = wait_for(&e, "Connected again", Duration::from_secs(10), |s| {
        s.connection == ConnectionState::Connected && s.reconnects >= 1
    });
    assert_eq!(s.reconnects, 1);
    assert_ne!(s.server_epoch, 0);
    assert_ne!(s.server_epoch, epoch1);
    // The new server holds nothing: the dropped save really was dropped.
    assert_eq!(e.membership(&more).unwrap().present, vec![false; 2]);
    assert_eq!(e.query(None, &hs).unwrap().hit_blocks, 0);
    // The old lease is invalid in the new epoch.
    match e.load(old_lease, &[10, 11, 12]) {
        Ok(t) => assert_eq!(t.wait(T).unwrap_err().code(), ErrorCode::LeaseExpired),
        Err(err) => assert_eq!(err.code(), ErrorCode::LeaseExpired),
    }
    // Byte-exact again: the new server maps the same memory.
    let hs2 = hash_blocks(&tokens(48, 3000), 16, b"", None).unwrap();
    round_trip(&mut e, &hs2, 23, [5, 6, 7], [10, 11, 12]);
    assert_eq!(e.stats().unwrap().connection, ConnectionState::Connected);
    drop(e); // flush, unregister, then the memfd is unmapped
    server.stop();
}
