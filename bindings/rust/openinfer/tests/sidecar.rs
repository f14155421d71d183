mod common;
use common::*;
use openinfer::*;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let exe = match std::env::var("OPENINFER_EXE") {
        Ok(e) => e,
        Err(_) => {
            eprintln!("SKIP: OPENINFER_EXE is not set");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("oi-rs-sidecar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("oi.sock").to_str().unwrap().to_string();
    let log = dir.join("server.log");
    let mut child = Command::new(&exe)
        .args(["serve", "--socket", &sock, "--pool", "64M", "--log-level", "info"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let mut s = String::new();
        std::fs::File::open(&log).unwrap().read_to_string(&mut s).unwrap();
        if s.contains("listening on") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "server not ready:\n{}", s);
        std::thread::sleep(Duration::from_millis(10));
    }
    round_trip(&sock, "rs/sidecar");
    unsafe { libc_kill(child.id() as i32, 15) };
    let st = child.wait().unwrap();
    assert!(st.success(), "openinfer serve exited with {:?}", st);
    std::fs::remove_dir_all(&dir).unwrap();
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
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
