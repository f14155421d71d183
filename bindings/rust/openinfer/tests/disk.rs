//! The disk tier from Rust (cpu backend): blocks written behind, promoted
//! back after the pool evicted them, found again by a new host on the same
//! directory; bytes compared.
use openinfer::*;
use std::time::{Duration, Instant};

const BLOCK: u64 = 16384;
const N: usize = 8;

fn rig(dir: &str) -> OffloadHost {
    let mut ho = HostOptions::new(4 << 20);
    ho.pin = Some(false);
    let host = OffloadHost::new(&ho).unwrap();
    host.attach_disk(&[dir], 32 << 20).unwrap();
    host
}

fn pattern(b: usize) -> Vec<u8> {
    (0..BLOCK as usize).map(|i| ((b * 31 + i * 7) & 0xff) as u8).collect()
}

fn engine(host: &OffloadHost) -> OffloadEngine<'_> {
    let opts = EngineOptions::new("rs/disk", vec![ArenaDesc::new("kv", 2 * N as u64, BLOCK)]);
    OffloadEngine::new(host, &opts, vec![0u8; 2 * N * BLOCK as usize]).unwrap()
}

fn load_and_check(e: &mut OffloadEngine<'_>, hs: &[BlockHash]) {
    let q = e.query_with(None, hs, &QueryOptions::new().wait_pending(Duration::from_secs(10))).unwrap();
    assert_eq!(q.hit_blocks, N as u64);
    let dst: Vec<i64> = (N as i64..2 * N as i64).collect();
    e.load(q.lease.unwrap(), &dst).unwrap().wait(Some(Duration::from_secs(10))).unwrap();
    let buf = e.buffer().unwrap();
    for b in 0..N {
        let d = N + b;
        assert_eq!(&buf[d * BLOCK as usize..(d + 1) * BLOCK as usize], &pattern(b)[..]);
    }
}

#[test]
fn disk_round_trip_and_restart() {
    let dir = std::env::temp_dir().join(format!("oi-rs-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let d = dir.to_str().unwrap();
    let tokens: Vec<u32> = (0..(N as u32) * 16).collect();
    let hs = hash_blocks(&tokens, 16, b"", None).unwrap();
    {
        let host = rig(d);
        let mut e = engine(&host);
        {
            let buf = e.buffer_mut().unwrap();
            for b in 0..N {
                buf[b * BLOCK as usize..(b + 1) * BLOCK as usize].copy_from_slice(&pattern(b));
            }
        }
        let ids: Vec<i64> = (0..N as i64).collect();
        e.save(&ids, &hs).unwrap().wait(Some(Duration::from_secs(10))).unwrap();
        e.flush(Some(Duration::from_secs(10))).unwrap();
        let t0 = Instant::now();
        while host.disk_stats().unwrap().spills < N as u64 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(host.disk_stats().unwrap().spills, N as u64);
        host.evict_all().unwrap();
        load_and_check(&mut e, &hs);
        assert_eq!(host.disk_stats().unwrap().promotions, N as u64);
    }
    {
        let host = rig(d); // a restart on the same directory
        assert_eq!(host.disk_stats().unwrap().blocks, N as u64);
        let mut e = engine(&host);
        load_and_check(&mut e, &hs);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn disk_stats_without_a_tier_is_not_found() {
    let mut ho = HostOptions::new(1 << 20);
    ho.pin = Some(false);
    let host = OffloadHost::new(&ho).unwrap();
    assert_eq!(host.disk_stats().unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(host.attach_disk(&[], 1 << 20).unwrap_err().code(), ErrorCode::InvalidArgument);
}
