#![allow(dead_code)]
use openinfer::*;

pub const BLOCKS: u64 = 16;
pub const BPB: u64 = 4096;

pub fn layout(ns: &str) -> EngineOptions {
    EngineOptions::new(
        ns,
        vec![ArenaDesc::new("k", BLOCKS, BPB), ArenaDesc::new("v", BLOCKS, BPB).offset(BLOCKS * BPB)],
    )
}

pub fn span() -> usize {
    (2 * BLOCKS * BPB) as usize
}

pub fn pattern(seed: u64, block: u64, arena: u64) -> Vec<u8> {
    (0..BPB).map(|i| ((seed * 131 + block * 31 + arena * 7 + i).wrapping_mul(2654435761) >> 13) as u8).collect()
}

pub fn fill(buf: &mut [u8], slot: u64, seed: u64, block: u64) {
    for a in 0..2 {
        let off = (a * BLOCKS * BPB + slot * BPB) as usize;
        buf[off..off + BPB as usize].copy_from_slice(&pattern(seed, block, a));
    }
}

pub fn read_block(buf: &[u8], slot: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for a in 0..2 {
        let off = (a * BLOCKS * BPB + slot * BPB) as usize;
        out.extend_from_slice(&buf[off..off + BPB as usize]);
    }
    out
}

pub fn expected(seed: u64, block: u64) -> Vec<u8> {
    let mut v = pattern(seed, block, 0);
    v.extend(pattern(seed, block, 1));
    v
}

pub fn tokens(n: u32, start: u32) -> Vec<u32> {
    (start..start + n).collect()
}

/// A real `openinfer serve` (the binary in OPENINFER_EXE) on a socket in a
/// private directory, ready to accept clients. `None` (the caller skips)
/// when OPENINFER_EXE is not set.
pub struct ServeProcess {
    pub sock: String,
    exe: String,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
    generation: u32,
}

impl ServeProcess {
    pub fn start(tag: &str) -> Option<ServeProcess> {
        let exe = match std::env::var("OPENINFER_EXE") {
            Ok(e) => e,
            Err(_) => {
                eprintln!("SKIP: OPENINFER_EXE is not set");
                return None;
            }
        };
        let dir = std::env::temp_dir().join(format!("oi-rs-{}-{}", tag, std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("oi.sock").to_str().unwrap().to_string();
        let mut s = ServeProcess { sock, exe, dir, child: None, generation: 0 };
        s.spawn();
        Some(s)
    }

    /// Starts the server on the socket (each run logs to a file of its own)
    /// and waits until it listens.
    fn spawn(&mut self) {
        use std::io::Read;
        let log = self.dir.join(format!("server-{}.log", self.generation));
        self.generation += 1;
        let mut child = std::process::Command::new(&self.exe)
            .args(["serve", "--socket", &self.sock, "--pool", "64M", "--log-level", "info"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        loop {
            let mut s = String::new();
            std::fs::File::open(&log).unwrap().read_to_string(&mut s).unwrap();
            if s.contains("listening on") {
                break;
            }
            if let Some(st) = child.try_wait().unwrap() {
                panic!("openinfer serve exited ({:?}) before it was ready:\n{}", st, s);
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(10), "server not ready:\n{}", s);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.child = Some(child);
    }

    /// SIGKILL (the server gets no chance to say goodbye); waits for it to
    /// die, so a restart finds its socket stale.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("the server is not running");
        unsafe { libc_kill(child.id() as i32, 9) };
        child.wait().unwrap();
    }

    /// A new server on the same socket (after `kill`).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is still running");
        self.spawn();
    }

    /// SIGTERM; the server must exit 0. Removes the directory.
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("the server is not running");
        unsafe { libc_kill(child.id() as i32, 15) };
        let st = child.wait().unwrap();
        assert!(st.success(), "openinfer serve exited with {:?}", st);
        std::fs::remove_dir_all(&self.dir).unwrap();
    }
}

impl Drop for ServeProcess {
    /// A test that failed half way leaves no server behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe { libc_kill(child.id() as i32, 9) };
            let _ = child.wait();
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
