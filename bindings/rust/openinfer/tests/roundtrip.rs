mod common;
use common::*;
use openinfer::*;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));

#[test]
fn round_trip_bytes() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let mut e = OffloadEngine::new(&host, &layout("rs/rt"), vec![0u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(48, 1000), 16, b"", None).unwrap();
    assert_eq!(hs.len(), 3);
    {
        let buf = e.buffer_mut().unwrap();
        for b in 0..3 {
            fill(buf, b, 1, b);
        }
    }
    let t = e.save(&[0, 1, 2], &hs).unwrap();
    t.wait(T).unwrap();
    assert!(t.poll().unwrap());
    assert!(t.fd() >= 0);
    drop(t);
    e.flush(T).unwrap();
    assert_eq!(host.stats().unwrap().blocks_sealed, 3);

    e.buffer_mut().unwrap().iter_mut().for_each(|b| *b = 0);
    let q = e.query(Some("req-1"), &hs).unwrap();
    assert_eq!(q.hit_blocks, 3);
    let lease = q.lease.unwrap();
    e.load(lease, &[7, 3, 11]).unwrap().wait(T).unwrap();
    let buf = e.buffer().unwrap().to_vec();
    for (block, slot) in [7u64, 3, 11].iter().enumerate() {
        assert_eq!(read_block(&buf, *slot), expected(1, block as u64));
    }
    assert_eq!(read_block(&buf, 0), vec![0u8; 2 * BPB as usize]);
    let st = e.stats().unwrap();
    assert_eq!(st.blocks_loaded, 3);
    assert_eq!(st.bytes_loaded, 3 * 2 * BPB);
}

#[test]
fn prefix_semantics() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let e = OffloadEngine::new(&host, &layout("rs/prefix"), vec![0u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(64, 1000), 16, b"", None).unwrap();
    e.save(&[0, 1, 2, 3], &hs).unwrap().wait(T).unwrap();
    let other = hash_blocks(&tokens(16, 5), 16, b"", None).unwrap()[0];
    let q = e.query(None, &[hs[0], hs[1], other, hs[3]]).unwrap();
    assert_eq!(q.hit_blocks, 2);
    e.release(q.lease.unwrap()).unwrap();
    let q = e.query(None, &[other, hs[0]]).unwrap();
    assert_eq!(q.hit_blocks, 0);
    assert!(q.lease.is_none());
    assert_eq!(e.query_membership(&[hs[0], other, hs[3]]).unwrap(), vec![true, false, true]);
    // the chain and the salt
    assert_eq!(hash_blocks(&tokens(16, 1016), 16, b"", Some(&hs[0])).unwrap(), vec![hs[1]]);
    assert_ne!(hash_blocks(&tokens(64, 1000), 16, b"salt", None).unwrap(), hs);
    // two engines, one namespace, from two threads (Send + Sync)
    let e2 = OffloadEngine::new(&host, &layout("rs/prefix"), vec![0u8; span()]).unwrap();
    std::thread::scope(|s| {
        for eng in [&e, &e2] {
            let hs = &hs;
            s.spawn(move || {
                for _ in 0..20 {
                    let q = eng.query(None, hs).unwrap();
                    assert_eq!(q.hit_blocks, 4);
                    eng.release(q.lease.unwrap()).unwrap();
                }
            });
        }
    });
}

#[test]
fn lease_exhaustion_and_expiry() {
    let mut ho = HostOptions::new(16 << 20);
    ho.lease_ttl_ms = Some(100);
    let host = OffloadHost::new(&ho).unwrap();
    let mut opts = layout("rs/lease");
    opts.world_size = 2;
    let e = OffloadEngine::new(&host, &opts, vec![0u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(32, 1000), 16, b"", None).unwrap();
    e.save(&[0, 1], &hs).unwrap().wait(T).unwrap();
    let lease = e.query(None, &hs).unwrap().lease.unwrap();
    e.load(lease, &[2, 3]).unwrap().wait(T).unwrap();
    // a layered load on the cpu backend: a plain load, no arena events
    let t = e.load_layered(lease, &[4, 5]).unwrap();
    assert!(t.arena_event(0).is_null());
    t.wait(T).unwrap();
    let err = e.load(lease, &[6, 7]).err().expect("a third load of a 2-share lease");
    assert_eq!(err.code(), ErrorCode::LeaseExpired);
    assert_eq!(err.status(), -9);
    assert!(!err.message().is_empty());
    assert_eq!(e.release(lease).unwrap_err().code(), ErrorCode::LeaseExpired);
    // expiry by TTL
    let lease = e.query(None, &hs).unwrap().lease.unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(e.release(lease).unwrap_err().code(), ErrorCode::LeaseExpired);
    assert!(host.stats().unwrap().leases_expired >= 1);
}
