mod common;
use common::*;
use openinfer::*;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));

fn round_trip(sock: &str, ns: &str) {
    let hs = hash_blocks(&tokens(48, 1000), 16, b"", None).unwrap();
    {
        let mut e = OffloadEngine::connect(Some(sock), &layout(ns)).unwrap();
        assert!(e.memory_len() >= span() as u64);
        let buf = e.buffer_mut().unwrap();
        for b in 0..3 {
            fill(buf, b, 7, b);
        }
        e.save(&[0, 1, 2], &hs).unwrap().wait(T).unwrap();
        e.flush(T).unwrap();
    } // closes the mapping, then unregisters
    let mut e = OffloadEngine::connect(Some(sock), &layout(ns)).unwrap();
    assert!(e.buffer().unwrap().iter().all(|&b| b == 0));
    let q = e.query(None, &hs).unwrap();
    assert_eq!(q.hit_blocks, 3);
    e.load(q.lease.unwrap(), &[9, 4, 13]).unwrap().wait(T).unwrap();
    let buf = e.buffer().unwrap().to_vec();
    for (block, slot) in [9u64, 4, 13].iter().enumerate() {
        assert_eq!(read_block(&buf, *slot), expected(7, block as u64));
    }
    // only the server knows the lease is consumed: the ticket carries the error
    let t = e.load(q.lease.unwrap(), &[0, 1, 2]).unwrap();
    assert_eq!(t.wait(T).unwrap_err().code(), ErrorCode::LeaseExpired);
    // the same through the ticket's future (its waker driven by the completion callback)
    let err = block_on(e.load(q.lease.unwrap(), &[0, 1, 2]).unwrap()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::LeaseExpired);
    assert_eq!(err.status_name(), "OI_ERR_LEASE_EXPIRED");
    // save options: on_done runs once the server sealed the blocks
    let more = hash_blocks(&tokens(16, 7000), 16, b"", None).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = e.save_with(&[5], &more, SaveOptions::new().on_done(move |r| tx.send(r).unwrap())).unwrap();
    block_on(&t).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), Ok(()));
    // a wait event is refused by a sidecar engine, and on_done is dropped uncalled
    let ev = 0x1000 as *mut std::ffi::c_void;
    let err = e.save_with(&[6], &more, unsafe { SaveOptions::new().wait_event(ev) }).err().unwrap();
    assert_eq!(err.code(), ErrorCode::Unsupported);
}

#[test]
fn sidecar_round_trip_real_server() {
    let server = match ServeProcess::start("sidecar") {
        Some(s) => s,
        None => return,
    };
    round_trip(&server.sock, "rs/sidecar");
    server.stop();
}

#[test]
fn sidecar_against_embedded_server() {
    let dir = std::env::temp_dir().join(format!("oi-rs-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("oi.sock").to_str().unwrap().to_string();
    let server = Server::start(&ServerOptions::new(&sock, 32 << 20)).unwrap();
    assert_eq!(server.socket_path(), sock);
    assert_ne!(server.epoch(), 0);
    round_trip(&sock, "rs/embedded-server");
    server.stop().unwrap();
    assert!(!std::path::Path::new(&sock).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
