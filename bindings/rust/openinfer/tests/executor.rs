//! The safe executor wrapper with the reference model: restores from the host
//! tier give the cold run's tokens; on_token, stats, errors, sidecar mode.
use openinfer::*;
use std::time::Duration;

fn prompt() -> Vec<u32> {
    (0..80u32).map(|i| (i * 37 + 11) % 500).collect()
}

fn cold_run(model: &mut RefModel, n: u32) -> Vec<u32> {
    let mut x = Executor::new(model, &ExecutorOptions::new()).unwrap();
    x.generate(&prompt(), n).unwrap()
}

#[test]
fn executor_restore_parity_embedded() {
    let mut model = RefModel::new(&RefModelOptions::default()).unwrap();
    let want = cold_run(&mut model, 8);
    assert_eq!(want.len(), 8);
    let host = OffloadHost::new(&HostOptions::new(64 << 20)).unwrap();
    let mut opts = ExecutorOptions::new();
    opts.offload = Offload::Host(&host);
    opts.gpu_blocks = Some(64);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut x = Executor::with_on_token(&mut model, &opts, move |ev| tx.send(ev).unwrap()).unwrap();
    let id = x.submit(&prompt(), 8).unwrap();
    x.run_until_idle().unwrap();
    let r = x.result(id).unwrap();
    assert!(r.is_finished() && r.error().is_none(), "{:?}", r);
    assert_eq!(r.tokens, want);
    assert_eq!((r.prompt_len, r.restored_tokens), (80, 0));
    let seen: Vec<TokenEvent> = rx.try_iter().collect();
    assert_eq!(seen.iter().map(|e| e.token).collect::<Vec<_>>(), want);
    assert!(seen.iter().all(|e| e.request_id == id));
    assert_eq!(seen.iter().map(|e| e.index).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
    assert!(seen[7].finished && !seen[6].finished);
    assert!(x.request_blocks(id).unwrap().len() >= 80 / 16);
    x.flush(Some(Duration::from_secs(30))).unwrap();
    assert!(host.stats().unwrap().blocks_sealed >= 5);
    assert!(x.evict_gpu_cache().unwrap() > 0);
    // the prompt's prefix now comes back from the host tier, token for token
    let id2 = x.submit(&prompt(), 8).unwrap();
    let mut finished = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // step() does not block: it spins while the restore's load runs
    while !x.result(id2).unwrap().is_finished() && std::time::Instant::now() < deadline {
        finished += x.step().unwrap();
    }
    assert_eq!(finished, 1);
    let r2 = x.result(id2).unwrap();
    assert_eq!(r2.tokens, want);
    assert!(r2.restored_tokens >= 64, "{:?}", r2);
    let st = x.stats().unwrap();
    assert!(st.restores_completed >= 1 && st.requests_finished == 2 && st.ranks == 1, "{:?}", st);
    assert_eq!(st.restores_overlapped, 0); // the cpu model has no per-layer events
    let kv = x.kv_layout(0).unwrap();
    assert_eq!((kv.page_size, kv.device), (16, DEVICE_CPU));
    assert!(kv.bytes > 0 && !kv.base.is_null());
    // clear errors
    let err = x.submit(&[], 4).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(!err.message().is_empty());
    assert_eq!(x.kv_layout(5).unwrap_err().code(), ErrorCode::InvalidArgument);
    drop(x); // before the host it borrows
}

#[test]
fn executor_private_host_salt_and_ranks() {
    let mut model = RefModel::new(&RefModelOptions { seed: Some(3), ..Default::default() }).unwrap();
    let mut opts = ExecutorOptions::new();
    opts.ranks = 2;
    opts.devices = Some(vec![DEVICE_CPU, DEVICE_CPU]);
    opts.offload = Offload::PrivateHost(Some(HostOptions::new(32 << 20)));
    opts.restore_overlap = RestoreOverlap::Host;
    let mut x = Executor::new(&mut model, &opts).unwrap();
    let p = prompt();
    let a = x.submit_request(&Request { rank: Some(1), ..Request::new(&p, 4) }).unwrap();
    let b = x.submit_request(&Request { salt: b"tenant-2", ..Request::new(&p, 4) }).unwrap();
    x.run_until_idle().unwrap();
    let (ra, rb) = (x.result(a).unwrap(), x.result(b).unwrap());
    assert_eq!(ra.rank, 1);
    assert_eq!(ra.tokens, rb.tokens); // same model and prompt; the salt only names blocks
    assert_eq!(x.stats().unwrap().ranks, 2);
    assert_eq!(x.result(999).unwrap_err().code(), ErrorCode::NotFound);
    drop(x);
    opts.devices = Some(vec![DEVICE_CPU]);
    let err = Executor::new(&mut model, &opts).err().unwrap();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

#[test]
fn on_token_panic_is_reraised_by_step() {
    let mut model = RefModel::new(&RefModelOptions::default()).unwrap();
    let mut x = Executor::with_on_token(&mut model, &ExecutorOptions::new(), |ev| {
        if ev.index == 1 {
            panic!("token handler failed");
        }
    })
    .unwrap();
    x.submit(&prompt(), 4).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| x.run_until_idle()));
    let p = r.expect_err("the panic was not re-raised");
    assert_eq!(p.downcast_ref::<&str>(), Some(&"token handler failed"));
    drop(x);
}

#[test]
fn executor_sidecar_embedded_server() {
    let dir = std::env::temp_dir().join(format!("oi-rs-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("oi.sock").to_str().unwrap().to_string();
    let server = Server::start(&ServerOptions::new(&sock, 64 << 20)).unwrap();
    let mut model = RefModel::new(&RefModelOptions::default()).unwrap();
    let want = cold_run(&mut model, 6);
    let mut opts = ExecutorOptions::new();
    opts.offload = Offload::Sidecar(Some(sock.clone()));
    {
        let mut x = Executor::new(&mut model, &opts).unwrap();
        assert_eq!(x.generate(&prompt(), 6).unwrap(), want);
        x.flush(Some(Duration::from_secs(30))).unwrap();
    }
    {
        let mut x = Executor::new(&mut model, &opts).unwrap();
        let id = x.submit(&prompt(), 6).unwrap();
        x.run_until_idle().unwrap();
        let r = x.result(id).unwrap();
        assert_eq!(r.tokens, want);
        assert!(r.restored_tokens > 0, "{:?}", r);
    }
    server.stop().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `codec` and `codec_slot_bytes` reach the executor's engines: a lossless
/// namespace restores the cold completion from its frames; a codec without
/// offload, and a lossy codec on the cpu model's fp32 KV, are refused.
#[test]
fn executor_codec_namespace() {
    let mut model = RefModel::new(&RefModelOptions::default()).unwrap();
    let want = cold_run(&mut model, 8);
    let block = {
        let x = Executor::new(&mut model, &ExecutorOptions::new()).unwrap();
        let k = x.kv_layout(0).unwrap();
        k.num_layers as u64 * 2 * k.segment_stride
    };
    let host = OffloadHost::new(&HostOptions::new(64 << 20)).unwrap();
    let mut opts = ExecutorOptions::new();
    opts.codec = Some("lossless".into());
    let err = Executor::new(&mut model, &opts).err().expect("a codec without offload");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("needs offload"), "{}", err.message());
    opts.offload = Offload::Host(&host);
    opts.codec = Some("int8".into());
    let err = Executor::new(&mut model, &opts).err().expect("int8 on fp32 KV");
    assert!(err.message().contains("quantizes bf16 KV"), "{}", err.message());
    // the cpu model's fp32 KV barely compresses: a slot of the block and the
    // frame's header and mode byte takes every frame
    opts.codec = Some("lossless".into());
    opts.codec_slot_bytes = Some(block + 41);
    opts.namespace = Some("rust-codec".into());
    let mut x = Executor::new(&mut model, &opts).unwrap();
    assert_eq!(x.generate(&prompt(), 8).unwrap(), want);
    x.flush(Some(Duration::from_secs(30))).unwrap();
    assert!(x.evict_gpu_cache().unwrap() > 0);
    let id = x.submit(&prompt(), 8).unwrap();
    x.run_until_idle().unwrap();
    let r = x.result(id).unwrap();
    assert_eq!(r.tokens, want);
    assert!(r.restored_tokens >= 64, "{:?}", r);
    drop(x); // before the host it borrows
}
