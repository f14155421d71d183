//! Tickets as futures (the waker driven by the completion callback), tickets
//! that do not wait in Drop, completion closures, save and load options.
mod common;
use common::*;
use openinfer::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(30));

#[test]
fn futures_round_trip_bytes() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let mut e = OffloadEngine::new(&host, &layout("rs/async-rt"), vec![0u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(4 * 16, 3000), 16, b"", None).unwrap();
    {
        let buf = e.buffer_mut().unwrap();
        for b in 0..4 {
            fill(buf, b, 11, b);
        }
    }
    block_on(async {
        // two saves in flight at once, awaited in turn
        let t1 = e.save(&[0, 1], &hs[..2])?;
        let t2 = e.save(&[2, 3], &hs[2..])?;
        t2.await?;
        (&t1).await?; // awaiting a reference keeps the ticket
        assert!(t1.is_complete() && t1.poll()?);
        let q = e.query(Some("req"), &hs)?;
        assert_eq!(q.hit_blocks, 4);
        e.load(q.lease.unwrap(), &[12, 8, 15, 9])?.await
    })
    .unwrap();
    assert_eq!(e.in_flight(), 0);
    let buf = e.buffer().unwrap().to_vec();
    for (block, slot) in [12u64, 8, 15, 9].iter().enumerate() {
        assert_eq!(read_block(&buf, *slot), expected(11, block as u64));
    }
}

/// Counts wakes and reports each one on a channel.
struct Probe {
    wakes: AtomicUsize,
    tx: std::sync::Mutex<mpsc::Sender<()>>,
}

impl Wake for Probe {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        let _ = self.tx.lock().unwrap().send(());
    }
}

/// 32 MiB in 128 blocks of 256 KiB: a save the cpu workers need milliseconds for.
const BIG_BLOCKS: u64 = 128;
const BIG_BPB: u64 = 256 << 10;

fn big_engine<'h>(host: &'h OffloadHost, ns: &str) -> OffloadEngine<'h> {
    let opts = EngineOptions::new(ns, vec![ArenaDesc::new("kv", BIG_BLOCKS, BIG_BPB)]);
    let buf: Vec<u8> = (0..BIG_BLOCKS * BIG_BPB).map(|i| (i % 251) as u8).collect();
    OffloadEngine::new(host, &opts, buf).unwrap()
}

fn big_hashes(seed: u32) -> Vec<BlockHash> {
    hash_blocks(&tokens(BIG_BLOCKS as u32 * 16, seed), 16, b"", None).unwrap()
}

#[test]
fn the_completion_callback_wakes_the_future() {
    let host = OffloadHost::new(&HostOptions::new(48 << 20)).unwrap();
    let e = big_engine(&host, "rs/async-wake");
    let ids: Vec<i64> = (0..BIG_BLOCKS as i64).collect();
    let hs = big_hashes(1);
    let (tx, rx) = mpsc::channel();
    let probe = Arc::new(Probe { wakes: AtomicUsize::new(0), tx: std::sync::Mutex::new(tx) });
    let waker = Waker::from(probe.clone());
    let mut cx = Context::from_waker(&waker);
    let mut t = e.save(&ids, &hs).unwrap();
    // polled at once: the copies of 32 MiB are still running
    assert!(Pin::new(&mut t).poll(&mut cx).is_pending());
    assert_eq!(probe.wakes.load(Ordering::SeqCst), 0);
    // no polling in between: only the library's completion callback can wake it
    rx.recv_timeout(Duration::from_secs(30)).expect("the waker was not called");
    assert_eq!(probe.wakes.load(Ordering::SeqCst), 1);
    match Pin::new(&mut t).poll(&mut cx) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("woken but not ready"),
    }
    assert!(t.poll().unwrap());
    assert_eq!(probe.wakes.load(Ordering::SeqCst), 1);
    drop(t);
    assert_eq!(e.query(None, &hs).unwrap().hit_blocks, BIG_BLOCKS);
}

#[test]
fn dropping_a_ticket_does_not_wait() {
    let host = OffloadHost::new(&HostOptions::new(48 << 20)).unwrap();
    let mut e = big_engine(&host, "rs/async-drop");
    let ids: Vec<i64> = (0..BIG_BLOCKS as i64).collect();
    let hs = big_hashes(2);
    let (tx, rx) = mpsc::channel();
    let t = e.save(&ids, &hs).unwrap();
    t.on_complete(move |r| tx.send(r).unwrap());
    drop(t); // returns at once: the copy goes on, detached
    assert_eq!(e.in_flight(), 1, "the save was still running after the ticket was dropped");
    assert!(rx.try_recv().is_err());
    // buffer_mut waits for the detached save before it hands the bytes out
    let buf = e.buffer_mut().unwrap();
    buf[0] = buf[0].wrapping_add(1);
    assert_eq!(e.in_flight(), 0);
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), Ok(()));
    assert_eq!(e.query_membership(&hs).unwrap(), vec![true; BIG_BLOCKS as usize]);
    // dropped load tickets: the engine's drop drains them
    let q = e.query(None, &hs[..8]).unwrap();
    drop(e.load(q.lease.unwrap(), &[100, 101, 102, 103, 104, 105, 106, 107]).unwrap());
    e.wait_in_flight();
    assert_eq!(e.in_flight(), 0);
    let buf = e.buffer().unwrap();
    for b in 0..8usize {
        let (src, dst) = (b * BIG_BPB as usize, (100 + b) * BIG_BPB as usize);
        // block 0 was changed after it was saved: the host copy has the old byte
        let want: Vec<u8> = (src..src + BIG_BPB as usize).map(|i| (i % 251) as u8).collect();
        assert!(buf[dst..dst + BIG_BPB as usize] == want[..], "block {}", b);
    }
    let q = e.query(None, &hs[8..16]).unwrap();
    drop(e.load(q.lease.unwrap(), &[110, 111, 112, 113, 114, 115, 116, 117]).unwrap());
    drop(e); // drains the load, then frees the buffer
}

#[test]
fn completion_closures_and_save_options() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let e = OffloadEngine::new(&host, &layout("rs/async-opts"), vec![7u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(3 * 16, 4000), 16, b"", None).unwrap();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    let t = e
        .save_with(&[0, 1, 2], &hs, SaveOptions::new().on_done(move |r| tx2.send(("on_done", r)).unwrap()))
        .unwrap();
    let tx3 = tx.clone();
    t.on_complete(move |r| tx3.send(("ticket", r)).unwrap());
    t.wait(T).unwrap();
    let mut got = vec![rx.recv_timeout(Duration::from_secs(30)).unwrap(), rx.recv_timeout(Duration::from_secs(30)).unwrap()];
    got.sort_by_key(|g| g.0);
    assert_eq!(got, vec![("on_done", Ok(())), ("ticket", Ok(()))]);
    // after completion, on_complete runs right away on this thread
    let here = std::thread::current().id();
    let (tx4, rx4) = mpsc::channel();
    t.on_complete(move |r| tx4.send((std::thread::current().id(), r)).unwrap());
    assert_eq!(rx4.try_recv().unwrap(), (here, Ok(())));
    drop(t);
    // everything deduplicated: on_done runs before save_with returns
    let (tx5, rx5) = mpsc::channel();
    let t = e.save_with(&[0, 1, 2], &hs, SaveOptions::new().on_done(move |r| tx5.send(r).unwrap())).unwrap();
    assert_eq!(rx5.try_recv().unwrap(), Ok(()));
    block_on(t).unwrap();
    // a refused save never calls on_done and drops the closure
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let err = e
        .save_with(&[99], &hs[..1], SaveOptions::new().on_done(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        }))
        .err()
        .expect("block 99 of 16");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("out of range"), "{}", err);
    assert_eq!(Arc::strong_count(&calls), 1, "the closure was not dropped");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn load_options() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let mut e = OffloadEngine::new(&host, &layout("rs/async-load"), vec![0u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(2 * 16, 5000), 16, b"", None).unwrap();
    {
        let buf = e.buffer_mut().unwrap();
        fill(buf, 0, 3, 0);
        fill(buf, 1, 3, 1);
    }
    block_on(e.save(&[0, 1], &hs).unwrap()).unwrap();
    let lease = e.query(None, &hs).unwrap().lease.unwrap();
    // an unknown flag is refused before the lease is touched
    let err = e.load_with(lease, &[4, 5], &LoadOptions::new().flags(1 << 7)).err().unwrap();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    // arena events on the cpu backend: a plain load without events
    let opts = LoadOptions::new().arena_events(true);
    assert_eq!(opts.flags, LOAD_ARENA_EVENTS);
    let t = e.load_with(lease, &[4, 5], &opts).unwrap();
    assert!(t.arena_event(0).is_null() && t.arena_event(1).is_null());
    block_on(t).unwrap();
    assert_eq!(LoadOptions::new().arena_events(true).arena_events(false), LoadOptions::new());
    let buf = e.buffer().unwrap().to_vec();
    assert_eq!(read_block(&buf, 4), expected(3, 0));
    assert_eq!(read_block(&buf, 5), expected(3, 1));
}

#[test]
fn futures_on_other_threads() {
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let e = OffloadEngine::new(&host, &layout("rs/async-threads"), vec![1u8; span()]).unwrap();
    let hs = hash_blocks(&tokens(8 * 16, 6000), 16, b"", None).unwrap();
    std::thread::scope(|s| {
        for k in 0..4usize {
            let (e, hs) = (&e, &hs);
            s.spawn(move || {
                let ids = [2 * k as i64, 2 * k as i64 + 1];
                block_on(e.save(&ids, &hs[2 * k..2 * k + 2]).unwrap()).unwrap();
            });
        }
    });
    e.flush(T).unwrap();
    assert_eq!(e.query(None, &hs).unwrap().hit_blocks, 8);
}
