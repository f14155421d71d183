//! The connector calls (issue 18): shared leases across engines of a
//! namespace, lookups without a layout (host and sidecar `LookupClient`),
//! pending blocks in query answers, and per-call save results.
mod common;
use common::*;
use openinfer::*;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));

fn opts(ns: &str, world_size: u32) -> EngineOptions {
    let mut o = layout(ns);
    o.world_size = world_size;
    o
}

/// An engine of `ns` that saved `n` blocks (seed) under the hashes of tokens `start..`.
fn saved<'h>(host: &'h OffloadHost, ns: &str, n: u64, start: u32, seed: u64, world: u32) -> (OffloadEngine<'h>, Vec<BlockHash>) {
    let mut e = OffloadEngine::new(host, &opts(ns, world), vec![0u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(16 * n as u32, start), 16, b"", None).unwrap();
    {
        let buf = e.buffer_mut().unwrap();
        for b in 0..n {
            fill(buf, b, seed, b);
        }
    }
    let ids: Vec<i64> = (0..n as i64).collect();
    e.save(&ids, &hs).unwrap().wait(T).unwrap();
    e.flush(T).unwrap();
    (e, hs)
}

#[test]
fn shared_lease_loaded_and_released_by_other_engines() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let (sched, hs) = saved(&host, "rs/shared", 3, 10_000, 5, 2);
    let mut w1 = OffloadEngine::new(&host, &opts("rs/shared", 2), vec![0u8; span()]).unwrap();
    let mut w2 = OffloadEngine::new(&host, &opts("rs/shared", 2), vec![0u8; span()]).unwrap();
    let q = sched.query(Some("sched-1"), &hs).unwrap();
    assert_eq!((q.hit_blocks, q.pending_blocks), (3, 0));
    let lease = q.lease.unwrap();
    // two workers (world_size 2) load the scheduler's lease, byte-exact
    w1.load(lease, &[4, 5, 6]).unwrap().wait(T).unwrap();
    w2.load(lease, &[9, 1, 2]).unwrap().wait(T).unwrap();
    let (b1, b2) = (w1.buffer().unwrap().to_vec(), w2.buffer().unwrap().to_vec());
    for (block, slot) in [9u64, 1, 2].iter().enumerate() {
        assert_eq!(read_block(&b1, 4 + block as u64), expected(5, block as u64));
        assert_eq!(read_block(&b2, *slot), expected(5, block as u64));
    }
    // the budget is kept across instances: a third load is refused, whoever makes it
    let err = sched.load(lease, &[0, 1, 2]).and_then(|t| t.wait(T)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::LeaseExpired);
    assert!(!err.message().is_empty());

    // another engine releases the scheduler's lease; then it is gone for everyone
    let l2 = sched.query(None, &hs).unwrap().lease.unwrap();
    w2.release(l2).unwrap();
    assert_eq!(w1.release(l2).unwrap_err().code(), ErrorCode::LeaseExpired);

    // another namespace may not redeem it, and the refusal consumes nothing
    let other = OffloadEngine::new(&host, &opts("rs/other", 1), vec![0u8; span()]).unwrap();
    let l3 = sched.query(None, &hs).unwrap().lease.unwrap();
    let err = other.load(l3, &[0, 1, 2]).and_then(|t| t.wait(T)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Permission);
    assert!(err.message().contains("namespace"), "{}", err);
    assert_eq!(other.release(l3).unwrap_err().code(), ErrorCode::Permission);
    w1.buffer_mut().unwrap().iter_mut().for_each(|b| *b = 0);
    w1.load(l3, &[0, 1, 2]).unwrap().wait(T).unwrap();
    let b1 = w1.buffer().unwrap().to_vec();
    for b in 0..3 {
        assert_eq!(read_block(&b1, b), expected(5, b));
    }
    sched.release(l3).unwrap(); // one share was left
}

#[test]
fn host_lookup_without_a_layout() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let four = hash_blocks(&tokens(64, 20_000), 16, b"", None).unwrap();
    let lk = LookupOptions::new("rs/lookup");
    // a namespace no engine has registered holds nothing
    let q = host.query(&lk, None, &four, &QueryOptions::new()).unwrap();
    assert_eq!((q.hit_blocks, q.lease, q.pending_blocks), (0, None, 0));
    let (mut e, _) = saved(&host, "rs/lookup", 3, 20_000, 9, 1);
    let q = host.query(&lk, Some("sched"), &four, &QueryOptions::new()).unwrap();
    assert_eq!(q.hit_blocks, 3);
    let lease = q.lease.unwrap();
    e.buffer_mut().unwrap().iter_mut().for_each(|b| *b = 0);
    e.load(lease, &[7, 8, 9]).unwrap().wait(T).unwrap(); // the engine loads the lookup's lease
    let buf = e.buffer().unwrap().to_vec();
    for b in 0..3 {
        assert_eq!(read_block(&buf, 7 + b), expected(9, b));
    }
    // world_size 1: consumed
    assert_eq!(host.release("rs/lookup", lease).unwrap_err().code(), ErrorCode::LeaseExpired);
    let m = host.membership("rs/lookup", &four).unwrap();
    assert_eq!(m.present, vec![true, true, true, false]);
    assert_eq!(m.pending_blocks, 0);
    // world_size 2: two loads
    let l = host.query(&lk.clone().world_size(2), None, &four[..2], &QueryOptions::new()).unwrap().lease.unwrap();
    e.load(l, &[0, 1]).unwrap().wait(T).unwrap();
    e.load(l, &[2, 3]).unwrap().wait(T).unwrap();
    assert_eq!(e.load(l, &[4, 5]).and_then(|t| t.wait(T)).unwrap_err().code(), ErrorCode::LeaseExpired);
    // release through the host, after which no engine can use it
    let l = host.query(&lk, None, &four, &QueryOptions::new()).unwrap().lease.unwrap();
    host.release("rs/lookup", l).unwrap();
    assert_eq!(e.release(l).unwrap_err().code(), ErrorCode::LeaseExpired);
    assert_eq!(host.query(&LookupOptions::new(""), None, &four, &QueryOptions::new()).unwrap_err().code(), ErrorCode::InvalidArgument);
}

#[test]
fn pending_blocks_and_wait_pending() {
    // Whatever the timing, a block the namespace holds is sealed or in
    // flight; with wait_pending every block that sealed in time is a hit.
    // The deterministic in-flight case (a slowed copy) is the C test
    // test_pending_fault.
    const BIG: u64 = 1 << 20;
    let host = OffloadHost::new(&HostOptions::new(64 << 20)).unwrap();
    let o = EngineOptions::new("rs/pending", vec![ArenaDesc::new("kv", 8, BIG)]);
    let data: Vec<u8> = (0..8 * BIG).map(|i| (i / BIG + 1) as u8 ^ (i as u8)).collect();
    let e = OffloadEngine::new(&host, &o, data.clone()).unwrap();
    let mut reader = OffloadEngine::new(&host, &o, vec![0u8; (8 * BIG) as usize]).unwrap();
    let hs = hash_blocks(&tokens(128, 30_000), 16, b"", None).unwrap();
    let ids: Vec<i64> = (0..8).collect();
    let t = e.save(&ids, &hs).unwrap();
    let q = reader.query(None, &hs).unwrap();
    assert!(q.hit_blocks + q.pending_blocks <= 8);
    if let Some(l) = q.lease {
        reader.release(l).unwrap();
    }
    let m = host.membership("rs/pending", &hs).unwrap();
    assert!(m.present.iter().filter(|&&p| p).count() as u64 + m.pending_blocks <= 8);
    let q = reader.query_with(None, &hs, &QueryOptions::new().wait_pending(Duration::from_secs(30))).unwrap();
    assert_eq!((q.hit_blocks, q.pending_blocks), (8, 0));
    t.wait(T).unwrap();
    drop(t);
    reader.load(q.lease.unwrap(), &ids).unwrap().wait(T).unwrap();
    assert!(reader.buffer().unwrap() == &data[..]);
    let q = host
        .query(&LookupOptions::new("rs/pending"), None, &hs, &QueryOptions::new().wait_pending(Duration::ZERO))
        .unwrap();
    assert_eq!((q.hit_blocks, q.pending_blocks), (8, 0));
    host.release("rs/pending", q.lease.unwrap()).unwrap();
}

#[test]
fn save_counts_and_a_full_pool_of_pinned_blocks() {
    let block = 2 * BPB; // one host block of the two-arena layout
    let mut ho = HostOptions::new(16 * block);
    ho.chunk_bytes = Some(16 * block);
    ho.high_watermark = Some(1.0);
    ho.low_watermark = Some(1.0);
    let host = OffloadHost::new(&ho).unwrap();
    let mut e = OffloadEngine::new(&host, &layout("rs/counts"), vec![0u8; span()]).unwrap();
    {
        let buf = e.buffer_mut().unwrap();
        for b in 0..16 {
            fill(buf, b, 3, b);
        }
    }
    let hs = hash_blocks(&tokens(16 * 40, 40_000), 16, b"", None).unwrap();
    let ids: Vec<i64> = (0..16).collect();
    let counted = || SaveOptions::new().counts(true);
    let t = e.save_with(&ids[..8], &hs[..8], counted()).unwrap();
    assert_eq!(t.save_result(), Some(SaveResult { accepted: 8, deduplicated: 0, dropped: 0 }));
    block_on(t).unwrap();
    let t = e.save_with(&ids[4..12], &hs[4..12], counted()).unwrap();
    assert_eq!(t.save_result(), Some(SaveResult { accepted: 4, deduplicated: 4, dropped: 0 }));
    t.wait(T).unwrap();
    drop(t);
    e.flush(T).unwrap();
    assert_eq!(e.save(&[0], &hs[..1]).unwrap().save_result(), None); // not asked for
    // pin the 12 sealed blocks, then offer 10 more: 4 slots are left
    let q = e.query(None, &hs[..12]).unwrap();
    assert_eq!(q.hit_blocks, 12);
    let more: Vec<i64> = (12..16).chain(0..6).collect();
    let t = e.save_with(&more, &hs[12..22], counted()).unwrap();
    assert_eq!(t.save_result(), Some(SaveResult { accepted: 4, deduplicated: 0, dropped: 6 }));
    t.wait(T).unwrap(); // the drops never fail the ticket
    drop(t);
    e.flush(T).unwrap();
    let q2 = e.query(None, &hs[12..16]).unwrap();
    assert_eq!(q2.hit_blocks, 4);
    // every slot pinned: a whole save drops, the ticket is still OK
    let t = e.save_with(&ids[..3], &hs[30..33], counted()).unwrap();
    assert_eq!(t.save_result(), Some(SaveResult { accepted: 0, deduplicated: 0, dropped: 3 }));
    t.wait(T).unwrap();
    drop(t);
    assert_eq!(e.membership(&hs[30..33]).unwrap().present, vec![false; 3]);
    // what was accepted loads byte-exact
    e.buffer_mut().unwrap().iter_mut().for_each(|b| *b = 0);
    e.load(q2.lease.unwrap(), &[0, 1, 2, 3]).unwrap().wait(T).unwrap();
    let buf = e.buffer().unwrap().to_vec();
    for i in 0..4 {
        assert_eq!(read_block(&buf, i), expected(3, 12 + i));
    }
    e.release(q.lease.unwrap()).unwrap();
}

fn lookup_round_trip(sock: &str, ns: &str) -> LookupClient {
    let hs = hash_blocks(&tokens(48, 50_000), 16, b"", None).unwrap();
    let four = hash_blocks(&tokens(64, 50_000), 16, b"", None).unwrap();
    let mut e = OffloadEngine::connect(Some(sock), &layout(ns)).unwrap();
    let client = LookupClient::connect(Some(sock), &LookupOptions::new(ns).client_name("rs-scheduler")).unwrap();
    {
        let buf = e.buffer_mut().unwrap();
        for b in 0..3 {
            fill(buf, b, 11, b);
        }
    }
    let t = e.save_with(&[0, 1, 2], &hs, SaveOptions::new().counts(true)).unwrap();
    // the server's counts, before the copy ends
    assert_eq!(t.save_result(), Some(SaveResult { accepted: 3, deduplicated: 0, dropped: 0 }));
    t.wait(T).unwrap();
    drop(t);
    let t = e.save_with(&[0, 1, 2], &hs, SaveOptions::new().counts(true)).unwrap();
    assert_eq!(t.save_result(), Some(SaveResult { accepted: 0, deduplicated: 3, dropped: 0 }));
    t.wait(T).unwrap();
    drop(t);
    e.flush(T).unwrap();
    // the scheduler (no layout, no arena) queries; the worker loads its lease
    let q = client.query_with(Some("r1"), &four, &QueryOptions::new().wait_pending(Duration::from_secs(5))).unwrap();
    assert_eq!((q.hit_blocks, q.pending_blocks), (3, 0));
    e.buffer_mut().unwrap().iter_mut().for_each(|b| *b = 0);
    e.load(q.lease.unwrap(), &[12, 13, 14]).unwrap().wait(T).unwrap();
    let buf = e.buffer().unwrap().to_vec();
    for b in 0..3 {
        assert_eq!(read_block(&buf, 12 + b), expected(11, b));
    }
    assert_eq!(client.membership(&four).unwrap().present, vec![true, true, true, false]);
    let l = client.query(None, &four).unwrap().lease.unwrap();
    client.release(l).unwrap();
    let err = client.release(l).unwrap_err();
    assert_eq!((err.code(), err.status_name()), (ErrorCode::LeaseExpired, "OI_ERR_LEASE_EXPIRED"));
    // a lease the client keeps is dropped when it is dropped
    let kept = client.query(None, &hs).unwrap().lease.unwrap();
    drop(client);
    // The server drops the session's leases when it sees the session end:
    // wait until only the engine's session is left before loading.
    let path = std::ffi::CString::new(sock).unwrap();
    let mut sessions = u64::MAX;
    for _ in 0..500 {
        let mut st: openinfer_sys::oi_server_stats = unsafe { std::mem::zeroed() };
        st.struct_size = std::mem::size_of::<openinfer_sys::oi_server_stats>() as u32;
        let rc = unsafe {
            openinfer_sys::oi_server_fetch_stats(
                path.as_ptr(),
                2000,
                &mut st,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, 0);
        sessions = st.sessions; // the stats connection itself is one of them
        if sessions <= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(sessions <= 2, "the lookup client's session is still open");
    let err = e.load(kept, &[0, 1, 2]).and_then(|t| t.wait(T)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::LeaseExpired);
    drop(e);
    LookupClient::connect(Some(sock), &LookupOptions::new(ns).control_deadline_ms(2000)).unwrap()
}

#[test]
fn lookup_client_against_embedded_server() {
    let dir = std::env::temp_dir().join(format!("oi-rs-lookup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("oi.sock").to_str().unwrap().to_string();
    let server = Server::start(&ServerOptions::new(&sock, 32 << 20)).unwrap();
    let client = lookup_round_trip(&sock, "rs/lookup-embedded");
    server.stop().unwrap();
    // the server's death is not fatal to a lookup client: its calls fail
    let hs = hash_blocks(&tokens(16, 1), 16, b"", None).unwrap();
    let err = client.query(None, &hs).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Closed, "{}", err);
    drop(client);
    assert!(LookupClient::connect(Some(&sock), &LookupOptions::new("rs/x")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lookup_client_against_real_server() {
    let server = match ServeProcess::start("lookup-serve") {
        Some(s) => s,
        None => return,
    };
    let client = lookup_round_trip(&server.sock, "rs/lookup-serve");
    drop(client);
    server.stop();
}
