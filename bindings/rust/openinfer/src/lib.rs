//! Safe Rust binding of libopeninfer, a host-memory tier for the paged KV
//! cache of LLM inference engines.
//!
//! Ownership encodes the library's drop order:
//!
//! * an [`OffloadEngine`] borrows its [`OffloadHost`], so the host cannot be
//!   dropped (or moved) while an engine lives;
//! * a sidecar engine ([`OffloadEngine::connect`]) owns the arena it imported
//!   and its `Drop` closes that mapping *before* it flushes and unregisters;
//! * an engine-owned sidecar engine ([`OffloadEngine::connect_owned`]) keeps
//!   its [`SharedBuffer`] and unmaps it only after the engine is destroyed;
//! * a [`Ticket`] borrows its engine; dropping it does not wait (the library
//!   keeps the operation alive until it completes), and the engine counts the
//!   operation as in flight until its completion callback ran: the KV buffer
//!   is only handed out (`buffer_mut`, which takes `&mut self`) once no copy
//!   is in flight, waiting for detached ones.
//!
//! A ticket is a [`Future`](std::future::Future) whose waker is driven by the
//! ticket's completion callback (`oi_ticket_set_callback`); [`block_on`] is a
//! small std-only executor to drive one:
//!
//! ```no_run
//! use openinfer::*;
//! let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
//! let opts = EngineOptions::new("ns", vec![ArenaDesc::new("k", 4, 4096)]);
//! let engine = OffloadEngine::new(&host, &opts, vec![0u8; 4 * 4096]).unwrap();
//! let hashes = hash_blocks(&(0..32).collect::<Vec<u32>>(), 16, b"", None).unwrap();
//! block_on(async {
//!     engine.save(&[0, 1], &hashes)?.await?;
//!     let lease = engine.query(None, &hashes)?.lease.unwrap();
//!     engine.load(lease, &[2, 3])?.await
//! })
//! .unwrap();
//! ```
//!
//! The host must outlive its engines:
//!
//! ```compile_fail,E0597
//! use openinfer::*;
//! let engine;
//! {
//!     let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
//!     let opts = EngineOptions::new("ns", vec![ArenaDesc::new("k", 4, 4096)]);
//!     engine = OffloadEngine::new(&host, &opts, vec![0u8; 4 * 4096]).unwrap();
//! } // error: `host` does not live long enough
//! drop(engine);
//! ```
//!
//! The KV buffer cannot be touched while a copy (a live ticket) may use it:
//!
//! ```compile_fail,E0502
//! use openinfer::*;
//! let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
//! let opts = EngineOptions::new("ns", vec![ArenaDesc::new("k", 4, 4096)]);
//! let mut engine = OffloadEngine::new(&host, &opts, vec![0u8; 4 * 4096]).unwrap();
//! let ticket = engine.save(&[0], &[BlockHash([1; 16])]).unwrap();
//! engine.buffer_mut().unwrap()[0] = 1; // error: `engine` is borrowed by `ticket`
//! ticket.wait(None).unwrap();
//! ```
//!
//! The same code in the right order compiles:
//!
//! ```no_run
//! use openinfer::*;
//! let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
//! let opts = EngineOptions::new("ns", vec![ArenaDesc::new("k", 4, 4096)]);
//! let mut engine = OffloadEngine::new(&host, &opts, vec![0u8; 4 * 4096]).unwrap();
//! let ticket = engine.save(&[0], &[BlockHash([1; 16])]).unwrap();
//! ticket.wait(None).unwrap();
//! drop(ticket);
//! engine.buffer_mut().unwrap()[0] = 1;
//! drop(engine);
//! drop(host);
//! ```

use std::any::Any;
use std::ffi::{CStr, CString};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::io::RawFd;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

pub use openinfer_sys as sys;

/// Device ordinal of the cpu backend.
pub const DEVICE_CPU: i32 = sys::OI_DEVICE_CPU;

// ---------------------------------------------------------------------------- errors

/// The error kinds, one per `oi_status` error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidArgument,
    NotFound,
    OutOfMemory,
    Timeout,
    Cuda,
    Io,
    Protocol,
    State,
    LeaseExpired,
    Closed,
    Unsupported,
    Permission,
    Version,
    Internal,
    NoDevice,
    Busy,
    /// A load missed its deadline; final only once no copy can still land
    /// in its destination.
    Deadline,
    /// A code this binding does not know.
    Unknown(i32),
}

impl ErrorCode {
    pub fn from_status(st: i32) -> ErrorCode {
        match st {
            sys::OI_ERR_INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            sys::OI_ERR_NOT_FOUND => ErrorCode::NotFound,
            sys::OI_ERR_OUT_OF_MEMORY => ErrorCode::OutOfMemory,
            sys::OI_ERR_TIMEOUT => ErrorCode::Timeout,
            sys::OI_ERR_CUDA => ErrorCode::Cuda,
            sys::OI_ERR_IO => ErrorCode::Io,
            sys::OI_ERR_PROTOCOL => ErrorCode::Protocol,
            sys::OI_ERR_STATE => ErrorCode::State,
            sys::OI_ERR_LEASE_EXPIRED => ErrorCode::LeaseExpired,
            sys::OI_ERR_CLOSED => ErrorCode::Closed,
            sys::OI_ERR_UNSUPPORTED => ErrorCode::Unsupported,
            sys::OI_ERR_PERMISSION => ErrorCode::Permission,
            sys::OI_ERR_VERSION => ErrorCode::Version,
            sys::OI_ERR_INTERNAL => ErrorCode::Internal,
            sys::OI_ERR_NO_DEVICE => ErrorCode::NoDevice,
            sys::OI_ERR_BUSY => ErrorCode::Busy,
            sys::OI_ERR_DEADLINE => ErrorCode::Deadline,
            other => ErrorCode::Unknown(other),
        }
    }
}

/// A failed call: the `oi_status` and the library's `oi_last_error()` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: i32,
    message: String,
}

impl Error {
    /// An error with an explicit status and message.
    pub fn new(status: i32, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
    /// `st` with the calling thread's `oi_last_error()`.
    pub fn from_last(st: i32) -> Error {
        let msg = unsafe { CStr::from_ptr(sys::oi_last_error()) }.to_string_lossy().into_owned();
        Error { status: st, message: msg }
    }
    /// The `oi_status` code (negative).
    pub fn status(&self) -> i32 {
        self.status
    }
    pub fn code(&self) -> ErrorCode {
        ErrorCode::from_status(self.status)
    }
    /// `"OI_ERR_TIMEOUT"`.
    pub fn status_name(&self) -> &'static str {
        status_name(self.status)
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status_name())
        } else {
            write!(f, "{}: {}", self.status_name(), self.message)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// `oi_status_str`.
pub fn status_name(st: i32) -> &'static str {
    // Static strings owned by the library.
    unsafe { CStr::from_ptr(sys::oi_status_str(st)) }.to_str().unwrap_or("OI_ERR_UNKNOWN")
}

fn check(st: i32) -> Result<i32> {
    if st < 0 {
        Err(Error::from_last(st))
    } else {
        Ok(st)
    }
}

fn invalid(msg: &str) -> Error {
    Error::new(sys::OI_ERR_INVALID_ARGUMENT, msg)
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| invalid("string contains a NUL byte"))
}

fn timeout_ms(t: Option<Duration>) -> u32 {
    match t {
        None => u32::MAX,
        Some(d) => d.as_millis().min((u32::MAX - 1) as u128) as u32,
    }
}

// ---------------------------------------------------------------------------- misc

/// `OI_VERSION_NUMBER` of the loaded library.
pub fn version() -> u32 {
    unsafe { sys::oi_version() }
}

/// `"0.1.0 (cpu)"`.
pub fn version_string() -> String {
    unsafe { CStr::from_ptr(sys::oi_version_string()) }.to_string_lossy().into_owned()
}

/// Number of CUDA devices visible (0 without the cuda backend).
pub fn device_count() -> Result<i32> {
    let mut n = 0;
    check(unsafe { sys::oi_device_count(&mut n) })?;
    Ok(n)
}

/// A 16-byte block hash.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockHash(pub [u8; 16]);

/// Chained hashes of the full blocks of `tokens` (see `oi_hash_blocks`).
pub fn hash_blocks(
    tokens: &[u32],
    block_size: u32,
    salt: &[u8],
    parent: Option<&BlockHash>,
) -> Result<Vec<BlockHash>> {
    let cap = if block_size == 0 { 0 } else { tokens.len() / block_size as usize };
    let mut out = vec![BlockHash::default(); cap];
    let mut n: sys::size_t = 0;
    let parent_ptr = parent.map_or(ptr::null(), |p| p as *const BlockHash as *const sys::oi_block_hash);
    check(unsafe {
        sys::oi_hash_blocks(
            tokens.as_ptr(),
            tokens.len() as sys::size_t,
            block_size,
            if salt.is_empty() { ptr::null() } else { salt.as_ptr() as *const c_void },
            salt.len() as sys::size_t,
            parent_ptr,
            out.as_mut_ptr() as *mut sys::oi_block_hash,
            cap as sys::size_t,
            &mut n,
        )
    })?;
    out.truncate(n as usize);
    Ok(out)
}

/// Longest external key [`block_key`] accepts, in bytes.
pub const BLOCK_KEY_MAX: usize = sys::OI_BLOCK_KEY_MAX as usize;

/// Maps an engine's own block key of 1..=[`BLOCK_KEY_MAX`] bytes (a vLLM
/// block hash, for instance) to a [`BlockHash`] (see `oi_block_key_from_bytes`).
pub fn block_key(key: &[u8]) -> Result<BlockHash> {
    let mut out = BlockHash::default();
    check(unsafe {
        sys::oi_block_key_from_bytes(
            key.as_ptr() as *const c_void,
            key.len() as sys::size_t,
            &mut out as *mut BlockHash as *mut sys::oi_block_hash,
        )
    })?;
    Ok(out)
}

/// Maps the keys of `key_len` bytes packed back to back in `keys` in one call
/// (see `oi_block_keys_from_bytes`); element i equals `block_key` of key i.
pub fn block_keys(keys: &[u8], key_len: usize) -> Result<Vec<BlockHash>> {
    if key_len == 0 || keys.len() % key_len != 0 {
        return Err(invalid(&format!("block_keys: {} bytes are not keys of {} bytes", keys.len(), key_len)));
    }
    let n = keys.len() / key_len;
    let mut out = vec![BlockHash::default(); n];
    check(unsafe {
        sys::oi_block_keys_from_bytes(
            keys.as_ptr() as *const c_void,
            key_len as sys::size_t,
            n as sys::size_t,
            out.as_mut_ptr() as *mut sys::oi_block_hash,
        )
    })?;
    Ok(out)
}

/// Chained hashes of the full blocks of `tokens` where block i also covers
/// `extra_keys[i]` (empty: none; entries past the full blocks are ignored).
/// With no extra keys it equals [`hash_blocks`] (see `oi_hash_blocks_ex`).
pub fn hash_blocks_ex(
    tokens: &[u32],
    block_size: u32,
    salt: &[u8],
    parent: Option<&BlockHash>,
    extra_keys: &[&[u8]],
) -> Result<Vec<BlockHash>> {
    let cap = if block_size == 0 { 0 } else { tokens.len() / block_size as usize };
    let mut out = vec![BlockHash::default(); cap];
    let mut n: sys::size_t = 0;
    let extras: Vec<sys::oi_block_extra_key> = extra_keys
        .iter()
        .map(|k| sys::oi_block_extra_key { bytes: k.as_ptr() as *const c_void, len: k.len() as sys::size_t })
        .collect();
    let mut args = unsafe { std::mem::zeroed::<sys::oi_hash_blocks_args>() };
    unsafe { sys::oi_hash_blocks_args_init(&mut args) };
    args.block_size = block_size;
    args.tokens = tokens.as_ptr();
    args.n_tokens = tokens.len() as sys::size_t;
    args.salt = if salt.is_empty() { ptr::null() } else { salt.as_ptr() as *const c_void };
    args.salt_len = salt.len() as sys::size_t;
    args.parent = parent.map_or(ptr::null(), |p| p as *const BlockHash as *const sys::oi_block_hash);
    args.extra_keys = if extras.is_empty() { ptr::null() } else { extras.as_ptr() };
    args.n_extra_keys = extras.len() as sys::size_t;
    check(unsafe {
        sys::oi_hash_blocks_ex(&args, out.as_mut_ptr() as *mut sys::oi_block_hash, cap as sys::size_t, &mut n)
    })?;
    out.truncate(n as usize);
    Ok(out)
}

// ---------------------------------------------------------------------------- host

/// Options of an [`OffloadHost`] (and of a [`Server`]'s pool).
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub pool_bytes: u64,
    pub device: i32,
    pub hugepages: bool,
    /// Pin the pool (default: only for a cuda device).
    pub pin: Option<bool>,
    pub lease_ttl_ms: Option<u32>,
    pub numa_node: Option<i32>,
    /// Pool chunk size (`oi_host_options.chunk_bytes`; None: the library's).
    pub chunk_bytes: Option<u64>,
    /// Background eviction watermarks, fractions of the pool (None: the
    /// library's; 1.0 and 1.0: no background eviction).
    pub high_watermark: Option<f32>,
    pub low_watermark: Option<f32>,
}

impl HostOptions {
    pub fn new(pool_bytes: u64) -> HostOptions {
        HostOptions {
            pool_bytes,
            device: DEVICE_CPU,
            hugepages: false,
            pin: None,
            lease_ttl_ms: None,
            numa_node: None,
            chunk_bytes: None,
            high_watermark: None,
            low_watermark: None,
        }
    }

    fn raw(&self) -> Result<sys::oi_host_options> {
        let mut o: sys::oi_host_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_host_options_init(&mut o) })?;
        o.pool_bytes = self.pool_bytes;
        o.device = self.device;
        let pin = self.pin.unwrap_or(self.device != DEVICE_CPU);
        o.flags = (if self.hugepages { sys::OI_HOST_HUGEPAGES } else { 0 }) as u32
            | (if pin { 0 } else { sys::OI_HOST_NO_PIN }) as u32;
        if let Some(t) = self.lease_ttl_ms {
            o.lease_ttl_ms = t;
        }
        if let Some(n) = self.numa_node {
            o.numa_node = n;
        }
        if let Some(c) = self.chunk_bytes {
            o.chunk_bytes = c;
        }
        if let Some(w) = self.high_watermark {
            o.high_watermark = w;
        }
        if let Some(w) = self.low_watermark {
            o.low_watermark = w;
        }
        Ok(o)
    }
}

/// Host-tier counters (a subset of `oi_host_stats`).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostStats {
    pub capacity_bytes: u64,
    pub blocks_sealed: u64,
    pub blocks_leased: u64,
    pub saves_completed: u64,
    pub saves_deduplicated: u64,
    pub loads_completed: u64,
    pub leases_active: u64,
    pub leases_expired: u64,
    pub leases_released: u64,
    pub evictions: u64,
    /// The read-rate estimates, bytes per second (docs/planner.md).
    pub link_bytes_per_s: u64,
    pub disk_bytes_per_s: u64,
    pub remote_bytes_per_s: u64,
}

/// Where a block is (`oi_block_where`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockWhere {
    None = 0,
    Pool = 1,
    Disk = 2,
    Remote = 3,
    Unknown = 4,
}

/// The arguments of [`plan_restore`] (`oi_restore_plan_args`): rates in
/// bytes per second, the prefill cost of a token at position p is
/// `prefill_ns_per_token + prefill_ns_per_token_ctx * p` ns.
#[derive(Debug, Clone, Default)]
pub struct RestorePlanArgs {
    pub prompt_tokens: u64,
    pub start_tokens: u64,
    /// One entry per held block after `start_tokens` (empty: `n_blocks` in the pool).
    pub where_: Vec<BlockWhere>,
    pub n_blocks: u64,
    pub block_tokens: u64,
    pub block_bytes: u64,
    pub num_layers: u32,
    pub layerwise: bool,
    pub no_split: bool,
    pub staged: bool,
    pub link_bytes_per_s: u64,
    pub disk_bytes_per_s: u64,
    pub remote_bytes_per_s: u64,
    pub prefill_ns_per_token: f64,
    pub prefill_ns_per_token_ctx: f64,
    pub load_overhead_ns: u64,
}

/// The plan (`oi_restore_plan`): compute `compute_head_blocks`, load the
/// next `load_blocks`, compute the rest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestorePlan {
    pub compute_head_blocks: u64,
    pub load_blocks: u64,
    pub load_tokens: u64,
    pub compute_tokens: u64,
    pub est_ns: u64,
    pub est_cold_ns: u64,
    pub est_load_all_ns: u64,
}

/// Restore or recompute (`oi_plan_restore`, docs/planner.md).
pub fn plan_restore(a: &RestorePlanArgs) -> Result<RestorePlan> {
    let mut c: sys::oi_restore_plan_args = unsafe { std::mem::zeroed() };
    check(unsafe { sys::oi_restore_plan_args_init(&mut c) })?;
    let places: Vec<u8> = a.where_.iter().map(|w| *w as u8).collect();
    let n = if places.is_empty() { a.n_blocks } else { places.len() as u64 };
    c.flags = (if a.layerwise { sys::OI_PLAN_LAYERWISE } else { 0 })
        | (if a.no_split { sys::OI_PLAN_NO_SPLIT } else { 0 })
        | (if a.staged { sys::OI_PLAN_STAGED } else { 0 });
    c.prompt_tokens = a.prompt_tokens;
    c.start_tokens = a.start_tokens;
    c.n_blocks = n;
    c.where_ = if places.is_empty() { std::ptr::null() } else { places.as_ptr() };
    c.block_tokens = a.block_tokens;
    c.block_bytes = a.block_bytes;
    c.num_layers = a.num_layers;
    c.link_bytes_per_s = a.link_bytes_per_s;
    c.disk_bytes_per_s = a.disk_bytes_per_s;
    c.remote_bytes_per_s = a.remote_bytes_per_s;
    c.prefill_ns_per_token = a.prefill_ns_per_token;
    c.prefill_ns_per_token_ctx = a.prefill_ns_per_token_ctx;
    c.load_overhead_ns = a.load_overhead_ns;
    let mut p: sys::oi_restore_plan = unsafe { std::mem::zeroed() };
    p.struct_size = std::mem::size_of::<sys::oi_restore_plan>() as u32;
    check(unsafe { sys::oi_plan_restore(&c, &mut p) })?;
    Ok(RestorePlan {
        compute_head_blocks: p.compute_head_blocks,
        load_blocks: p.load_blocks,
        load_tokens: p.load_tokens,
        compute_tokens: p.compute_tokens,
        est_ns: p.est_ns,
        est_cold_ns: p.est_cold_ns,
        est_load_all_ns: p.est_load_all_ns,
    })
}

/// The host tier: a pool of host memory shared by this process's engines.
/// Thread-safe (`Send + Sync`). Engines borrow it, so it outlives them.
/// The disk tier's counters (`oi_host_disk_stats`; the read latency
/// histogram stays in the raw struct).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub blocks: u64,
    pub bytes_used: u64,
    pub capacity_bytes: u64,
    pub spills: u64,
    pub spills_failed: u64,
    pub spills_skipped: u64,
    pub spill_overflow: u64,
    pub promotions: u64,
    pub promote_failed: u64,
    pub checksum_failures: u64,
    pub evictions: u64,
    pub torn_records_cut: u64,
    pub replay_ns: u64,
    pub lost_queue_full: u64,
    pub lost_unwritten: u64,
    pub lost_write_failed: u64,
    pub lost_no_room: u64,
    pub disk_full: u64,
    pub full_events: u64,
    pub spills_refused_full: u64,
}

pub struct OffloadHost {
    raw: NonNull<sys::oi_host>,
}

// The C API documents every host function as callable from any thread.
unsafe impl Send for OffloadHost {}
unsafe impl Sync for OffloadHost {}

impl OffloadHost {
    pub fn new(opts: &HostOptions) -> Result<OffloadHost> {
        let o = opts.raw()?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::oi_host_create(&o, &mut out) })?;
        Ok(OffloadHost { raw: NonNull::new(out).ok_or_else(|| invalid("host_create returned NULL"))? })
    }

    pub fn as_ptr(&self) -> *mut sys::oi_host {
        self.raw.as_ptr()
    }

    pub fn stats(&self) -> Result<HostStats> {
        let mut s: sys::oi_host_stats = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::oi_host_stats>() as u32;
        check(unsafe { sys::oi_host_get_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(HostStats {
            capacity_bytes: s.capacity_bytes,
            blocks_sealed: s.blocks_sealed,
            blocks_leased: s.blocks_leased,
            saves_completed: s.saves_completed,
            saves_deduplicated: s.saves_deduplicated,
            link_bytes_per_s: s.link_bytes_per_s,
            disk_bytes_per_s: s.disk_bytes_per_s,
            remote_bytes_per_s: s.remote_bytes_per_s,
            loads_completed: s.loads_completed,
            leases_active: s.leases_active,
            leases_expired: s.leases_expired,
            leases_released: s.leases_released,
            evictions: s.evictions,
        })
    }

    /// Attaches a disk tier under the pool (`oi_host_attach_disk`):
    /// one preallocated file per directory (each owned by this user, not
    /// writable by others), `capacity_bytes` in all. Sealed blocks are
    /// written behind; a query past the pool's prefix promotes what the disk
    /// holds (pending, then hits with `QueryOptions::wait_pending`); an
    /// earlier run's blocks are hits again (docs/disk.md).
    pub fn attach_disk(&self, dirs: &[&str], capacity_bytes: u64) -> Result<()> {
        let owned: Vec<CString> = dirs.iter().map(|d| cstring(d)).collect::<Result<_>>()?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        let mut o: sys::oi_host_disk_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_host_disk_options_init(&mut o) })?;
        o.dirs = if ptrs.is_empty() { std::ptr::null() } else { ptrs.as_ptr() };
        o.num_dirs = ptrs.len() as u32;
        o.capacity_bytes = capacity_bytes;
        check(unsafe { sys::oi_host_attach_disk(self.raw.as_ptr(), &o) }).map(|_| ())
    }

    /// The disk tier's counters (`oi_host_disk_stats`); `NotFound` without one.
    pub fn disk_stats(&self) -> Result<DiskStats> {
        let mut s: sys::oi_host_disk_stats = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::oi_host_disk_stats>() as u32;
        check(unsafe { sys::oi_host_get_disk_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(DiskStats {
            blocks: s.blocks,
            bytes_used: s.bytes_used,
            capacity_bytes: s.capacity_bytes,
            spills: s.spills,
            spills_failed: s.spills_failed,
            spills_skipped: s.spills_skipped,
            spill_overflow: s.spill_overflow,
            promotions: s.promotions,
            promote_failed: s.promote_failed,
            checksum_failures: s.checksum_failures,
            evictions: s.evictions,
            torn_records_cut: s.torn_records_cut,
            replay_ns: s.replay_ns,
            lost_queue_full: s.lost_queue_full,
            lost_unwritten: s.lost_unwritten,
            lost_write_failed: s.lost_write_failed,
            lost_no_room: s.lost_no_room,
            disk_full: s.disk_full,
            full_events: s.full_events,
            spills_refused_full: s.spills_refused_full,
        })
    }

    /// Evicts every block nothing holds; returns how many.
    pub fn evict_all(&self) -> Result<u64> {
        let mut n = 0u64;
        check(unsafe { sys::oi_host_evict_all(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// A lookup without a layout (`oi_host_query`): queries namespace
    /// `opts.namespace` as [`OffloadEngine::query_with`] does, with no engine.
    /// A namespace no engine has registered yet holds nothing (every block
    /// misses). The lease belongs to no engine: any engine of the namespace
    /// may load it (`opts.world_size` loads) or release it
    /// ([`release`](Self::release)) until it is consumed, released or expires.
    pub fn query(
        &self,
        opts: &LookupOptions,
        req_id: Option<&str>,
        hashes: &[BlockHash],
        qopts: &QueryOptions,
    ) -> Result<QueryResult> {
        let o = opts.raw()?;
        let h = self.raw.as_ptr();
        let r = raw_query(req_id, hashes, qopts, None, |rid, hs, n, flags, r| unsafe {
            sys::oi_host_query(h, &o.o, rid, hs, n, flags, r)
        })?;
        Ok(QueryResult::from_raw(&r))
    }

    /// Membership of `hashes` in `namespace` without an engine (each position
    /// on its own, no lease).
    pub fn membership(&self, namespace: &str, hashes: &[BlockHash]) -> Result<Membership> {
        let o = LookupOptions::new(namespace).raw()?;
        let h = self.raw.as_ptr();
        membership_with(hashes, |rid, hs, n, flags, r| unsafe {
            sys::oi_host_query(h, &o.o, rid, hs, n, flags, r)
        })
    }

    /// Drops a lease of namespace `namespace` (`oi_host_release`):
    /// `LeaseExpired` when it is unknown, consumed or expired, `Permission`
    /// when it belongs to another namespace.
    pub fn release(&self, namespace: &str, lease: Lease) -> Result<()> {
        let ns = cstring(namespace)?;
        check(unsafe {
            sys::oi_host_release(self.raw.as_ptr(), ns.as_ptr(), sys::oi_lease { bytes: lease.0 })
        })?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------- lookups

/// The namespace and lease consumers of a lookup ([`OffloadHost::query`],
/// [`LookupClient::connect`]; `oi_lookup_options`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOptions {
    /// Required; at most 255 bytes.
    pub namespace: String,
    /// Loads each lease allows (default 1).
    pub world_size: u32,
    /// Sidecar: deadline of connect, query and release (None: 30 s).
    pub control_deadline_ms: Option<u32>,
    /// Sidecar: a name for the server's logs.
    pub client_name: Option<String>,
    /// Sidecar: each query's deadline (None: 50 ms); a miss marks the server
    /// unresponsive and later queries miss at once until it answers a probe.
    pub lookup_deadline_ms: Option<u32>,
    /// Sidecar: the probe period while the server is unresponsive (None: 100 ms).
    pub probe_interval_ms: Option<u32>,
}

impl LookupOptions {
    pub fn new(namespace: &str) -> LookupOptions {
        LookupOptions {
            namespace: namespace.to_string(),
            world_size: 1,
            control_deadline_ms: None,
            client_name: None,
            lookup_deadline_ms: None,
            probe_interval_ms: None,
        }
    }
    pub fn lookup_deadline_ms(mut self, ms: u32) -> LookupOptions {
        self.lookup_deadline_ms = Some(ms);
        self
    }
    pub fn probe_interval_ms(mut self, ms: u32) -> LookupOptions {
        self.probe_interval_ms = Some(ms);
        self
    }
    pub fn world_size(mut self, n: u32) -> LookupOptions {
        self.world_size = n;
        self
    }
    pub fn control_deadline_ms(mut self, ms: u32) -> LookupOptions {
        self.control_deadline_ms = Some(ms);
        self
    }
    pub fn client_name(mut self, name: &str) -> LookupOptions {
        self.client_name = Some(name.to_string());
        self
    }

    fn raw(&self) -> Result<RawLookupOptions> {
        let ns = cstring(&self.namespace)?;
        let name = match &self.client_name {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let mut o: sys::oi_lookup_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_lookup_options_init(&mut o) })?;
        o.namespace_id = ns.as_ptr();
        o.world_size = self.world_size;
        if let Some(ms) = self.control_deadline_ms {
            o.control_deadline_ms = ms;
        }
        if let Some(ms) = self.lookup_deadline_ms {
            o.lookup_deadline_ms = ms;
        }
        if let Some(ms) = self.probe_interval_ms {
            o.probe_interval_ms = ms;
        }
        o.client_name = name.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        Ok(RawLookupOptions { o, _ns: ns, _name: name })
    }
}

struct RawLookupOptions {
    o: sys::oi_lookup_options,
    _ns: CString,
    _name: Option<CString>,
}

/// A sidecar session that only looks up (`oi_lookup_*`): it
/// registers no layout and maps no arena, so a scheduler process that holds
/// no KV memory can ask. Its leases may be loaded or released by any engine
/// of the namespace connected with the same user id; dropping the client
/// closes the session and the server drops the leases it created. A dead
/// server is not fatal to it: its calls return `Closed`. Thread-safe.
pub struct LookupClient {
    raw: NonNull<sys::oi_lookup>,
}

// The client's calls are serialized inside the library (its connection lock).
unsafe impl Send for LookupClient {}
unsafe impl Sync for LookupClient {}

impl LookupClient {
    /// Connects to `openinfer serve` at `socket` (None: the default path).
    pub fn connect(socket: Option<&str>, opts: &LookupOptions) -> Result<LookupClient> {
        let sock = match socket {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let o = opts.raw()?;
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::oi_lookup_connect(sock.as_ref().map_or(ptr::null(), |s| s.as_ptr()), &o.o, &mut out)
        })?;
        Ok(LookupClient { raw: NonNull::new(out).ok_or_else(|| invalid("client_connect returned NULL"))? })
    }

    pub fn as_ptr(&self) -> *mut sys::oi_lookup {
        self.raw.as_ptr()
    }

    /// Counts the leading run of `hashes` sealed in the namespace and leases it.
    pub fn query(&self, req_id: Option<&str>, hashes: &[BlockHash]) -> Result<QueryResult> {
        self.query_with(req_id, hashes, &QueryOptions::new())
    }

    /// [`query`](Self::query) with options (wait for pending blocks: the
    /// server waits up to that long, the client up to the control deadline
    /// plus that).
    pub fn query_with(&self, req_id: Option<&str>, hashes: &[BlockHash], opts: &QueryOptions) -> Result<QueryResult> {
        let c = self.raw.as_ptr();
        let r = raw_query(req_id, hashes, opts, None, |rid, hs, n, flags, r| unsafe {
            sys::oi_lookup_query(c, rid, hs, n, flags, r)
        })?;
        Ok(QueryResult::from_raw(&r))
    }

    /// Which of `hashes` are present, each on its own (no lease).
    pub fn membership(&self, hashes: &[BlockHash]) -> Result<Membership> {
        let c = self.raw.as_ptr();
        membership_with(hashes, |rid, hs, n, flags, r| unsafe { sys::oi_lookup_query(c, rid, hs, n, flags, r) })
    }

    /// Drops a lease of the namespace.
    pub fn release(&self, lease: Lease) -> Result<()> {
        check(unsafe { sys::oi_lookup_release(self.raw.as_ptr(), sys::oi_lease { bytes: lease.0 }) })?;
        Ok(())
    }
}

impl Drop for LookupClient {
    fn drop(&mut self) {
        unsafe { sys::oi_lookup_destroy(self.raw.as_ptr()) }
    }
}

/// Options of a query ([`OffloadEngine::query_with`], [`OffloadHost::query`],
/// [`LookupClient::query_with`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueryOptions {
    wait_pending: Option<Duration>,
}

impl QueryOptions {
    pub fn new() -> QueryOptions {
        QueryOptions { wait_pending: None }
    }

    /// `OI_QUERY_WAIT_PENDING`: before leasing, wait up to `limit` for the
    /// blocks right after the hit prefix whose save is in flight; those that
    /// sealed count as hits (a zero limit does not wait).
    pub fn wait_pending(mut self, limit: Duration) -> QueryOptions {
        self.wait_pending = Some(limit);
        self
    }

    fn flags_and_wait(&self) -> (u32, u32) {
        match self.wait_pending {
            None => (0, 0),
            Some(d) => (sys::OI_QUERY_WAIT_PENDING as u32, d.as_millis().min(u32::MAX as u128) as u32),
        }
    }
}

/// The answer of a membership query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// Per position: sealed in the namespace.
    pub present: Vec<bool>,
    /// Positions whose save is still in flight (not present).
    pub pending_blocks: u64,
}

fn raw_query(
    req_id: Option<&str>,
    hashes: &[BlockHash],
    opts: &QueryOptions,
    present: Option<&mut [u8]>,
    call: impl FnOnce(*const c_char, *const sys::oi_block_hash, sys::size_t, u32, *mut sys::oi_query_result) -> i32,
) -> Result<sys::oi_query_result> {
    let rid = match req_id {
        Some(s) => Some(cstring(s)?),
        None => None,
    };
    let mut r: sys::oi_query_result = unsafe { std::mem::zeroed() };
    r.struct_size = std::mem::size_of::<sys::oi_query_result>() as u32;
    let (mut flags, wait_ms) = opts.flags_and_wait();
    r.wait_ms = wait_ms;
    if let Some(p) = present {
        assert!(p.len() >= hashes.len());
        r.present = p.as_mut_ptr();
        flags |= sys::OI_QUERY_MEMBERSHIP as u32;
    }
    check(call(
        rid.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
        hashes.as_ptr() as *const sys::oi_block_hash,
        hashes.len() as sys::size_t,
        flags,
        &mut r,
    ))?;
    Ok(r)
}

fn membership_with(
    hashes: &[BlockHash],
    call: impl FnOnce(*const c_char, *const sys::oi_block_hash, sys::size_t, u32, *mut sys::oi_query_result) -> i32,
) -> Result<Membership> {
    let mut present = vec![0u8; hashes.len().max(1)];
    let r = raw_query(None, hashes, &QueryOptions::new(), Some(&mut present), call)?;
    Ok(Membership { present: present[..hashes.len()].iter().map(|&b| b != 0).collect(), pending_blocks: r.pending_blocks })
}

impl Drop for OffloadHost {
    fn drop(&mut self) {
        unsafe { sys::oi_host_destroy(self.raw.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------- engine

/// One arena of a layout, by offset into the engine's buffer (or the
/// sidecar's arena). Block b, segment s lives at
/// `offset + b*block_stride + s*segment_stride`, or at
/// `offset + segment_offsets[k + s] + b*block_stride` when the layout has
/// [`EngineOptions::segment_offsets`] (segments as separate regions).
#[derive(Debug, Clone)]
pub struct ArenaDesc {
    pub name: String,
    pub offset: u64,
    pub num_blocks: u64,
    pub bytes_per_block: u64,
    pub block_stride: u64,
    pub segments: u32,
    pub segment_stride: u64,
}

impl ArenaDesc {
    /// A contiguous single-segment arena at offset 0.
    pub fn new(name: &str, num_blocks: u64, bytes_per_block: u64) -> ArenaDesc {
        ArenaDesc {
            name: name.to_string(),
            offset: 0,
            num_blocks,
            bytes_per_block,
            block_stride: bytes_per_block,
            segments: 1,
            segment_stride: bytes_per_block,
        }
    }
    pub fn offset(mut self, offset: u64) -> ArenaDesc {
        self.offset = offset;
        self
    }
    /// Split K/V: `segments` slices per block, `segment_stride` apart.
    pub fn segments(mut self, segments: u32, segment_stride: u64, block_stride: u64) -> ArenaDesc {
        self.segments = segments;
        self.segment_stride = segment_stride;
        self.block_stride = block_stride;
        self
    }
    /// The end of the arena from the buffer's start (the descriptor's
    /// rule: segments `segment_stride` apart).
    pub fn end(&self) -> u64 {
        if self.num_blocks == 0 {
            return self.offset;
        }
        self.offset
            + (self.num_blocks - 1) * self.block_stride
            + (self.segments as u64 - 1) * self.segment_stride
            + self.bytes_per_block
    }

    /// The end of the arena when its segments start at `segment_offsets`
    /// (this arena's `segments` entries, relative to `offset`).
    pub fn end_with_offsets(&self, segment_offsets: &[u64]) -> u64 {
        if self.num_blocks == 0 {
            return self.offset;
        }
        let last = (self.num_blocks - 1) * self.block_stride + self.bytes_per_block;
        segment_offsets.iter().map(|s| self.offset + s + last).max().unwrap_or(self.offset)
    }
}

/// Options of an [`OffloadEngine`].
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub namespace: String,
    pub instance_name: Option<String>,
    pub device: i32,
    pub world_size: u32,
    pub arenas: Vec<ArenaDesc>,
    pub save_deadline_ms: Option<u32>,
    pub load_deadline_ms: Option<u32>,
    pub control_deadline_ms: Option<u32>,
    /// Sidecar: membership queries' deadline (None: 50 ms).
    pub lookup_deadline_ms: Option<u32>,
    /// Sidecar: the probe period while the server is unresponsive (None: 100 ms).
    pub probe_interval_ms: Option<u32>,
    /// Where each arena's segments start (`oi_engine_options.segment_offsets`):
    /// arena by arena, each arena's `segments` entries, relative to the
    /// arena's offset. None: the descriptors' `segment_stride` rule.
    pub segment_offsets: Option<Vec<u64>>,
    /// The namespace's codec (`oi_engine_options.codec`, docs/codecs.md):
    /// None or "none", "lossless", "int8", "int8-hadamard", "fp8".
    pub codec: Option<String>,
    /// int8, int8-hadamard and fp8: a host block's bf16 elements as (tokens, heads,
    /// head_dim) per part.
    pub codec_shape: Option<(u32, u32, u32)>,
    /// lossless: a frame's slot in bytes (None: 74 % of the block).
    pub codec_slot_bytes: Option<u64>,
}

impl EngineOptions {
    pub fn new(namespace: &str, arenas: Vec<ArenaDesc>) -> EngineOptions {
        EngineOptions {
            namespace: namespace.to_string(),
            instance_name: None,
            device: DEVICE_CPU,
            world_size: 1,
            arenas,
            save_deadline_ms: None,
            load_deadline_ms: None,
            control_deadline_ms: None,
            lookup_deadline_ms: None,
            probe_interval_ms: None,
            segment_offsets: None,
            codec: None,
            codec_shape: None,
            codec_slot_bytes: None,
        }
    }

    /// Stores the namespace's blocks as frames of `codec` ("lossless",
    /// "int8", "int8-hadamard", "fp8"; docs/codecs.md); the lossy codecs need `shape`
    /// (tokens, heads, head_dim). The library checks both at register
    /// (`InvalidArgument` naming the field).
    pub fn codec(mut self, codec: &str, shape: Option<(u32, u32, u32)>) -> EngineOptions {
        self.codec = Some(codec.to_string());
        self.codec_shape = shape;
        self
    }

    /// Segments as separate regions: block b, segment s of arena i lives at
    /// `arenas[i].offset + offsets[k_i + s] + b * block_stride`, where `k_i`
    /// is the sum of the segments of the arenas before i (vLLM's
    /// `[2, num_blocks, ...]` layer: the K half at 0, the V half at
    /// `num_blocks * block_stride`). `segment_stride` is then ignored and
    /// `block_stride` need only be `>= bytes_per_block`. The count must equal
    /// the sum of every arena's segments (the library checks it, and that no
    /// two slices overlap: `InvalidArgument`).
    pub fn segment_offsets(mut self, offsets: Vec<u64>) -> EngineOptions {
        self.segment_offsets = Some(offsets);
        self
    }

    /// The sum of every arena's segments (the count `segment_offsets` needs).
    pub fn total_segments(&self) -> usize {
        self.arenas.iter().map(|a| a.segments as usize).sum()
    }

    /// The bytes the arenas span from offset 0 (with segment offsets whose
    /// count does not match the arenas, the descriptors' rule: the library
    /// refuses such a layout anyway).
    pub fn span(&self) -> u64 {
        match &self.segment_offsets {
            Some(offs) if offs.len() == self.total_segments() => {
                let mut k = 0;
                let mut end = 0;
                for a in &self.arenas {
                    let n = a.segments as usize;
                    end = end.max(a.end_with_offsets(&offs[k..k + n]));
                    k += n;
                }
                end
            }
            _ => self.arenas.iter().map(|a| a.end()).max().unwrap_or(0),
        }
    }
}

/// The C options and the strings, descriptors and segment offsets they
/// point to (kept alive for the C call).
struct RawEngineOptions {
    o: sys::oi_engine_options,
    _ns: CString,
    _inst: Option<CString>,
    _names: Vec<CString>,
    _descs: Vec<sys::oi_arena_desc>,
    _offsets: Option<Vec<u64>>,
    _codec: Option<CString>,
}

impl EngineOptions {
    fn raw(&self, base: *mut c_void, size: u64) -> Result<RawEngineOptions> {
        let ns = cstring(&self.namespace)?;
        let inst = match &self.instance_name {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let names = self.arenas.iter().map(|a| cstring(&a.name)).collect::<Result<Vec<_>>>()?;
        let descs: Vec<sys::oi_arena_desc> = self
            .arenas
            .iter()
            .zip(names.iter())
            .map(|(a, n)| sys::oi_arena_desc {
                name: n.as_ptr(),
                offset: a.offset,
                base: ptr::null_mut(),
                num_blocks: a.num_blocks,
                bytes_per_block: a.bytes_per_block,
                block_stride: a.block_stride,
                segments: a.segments,
                segment_stride: a.segment_stride,
            })
            .collect();
        let mut o: sys::oi_engine_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_engine_options_init(&mut o) })?;
        o.device = self.device;
        o.namespace_id = ns.as_ptr();
        o.instance_name = inst.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        o.world_size = self.world_size;
        o.num_arenas = descs.len() as u32;
        o.arenas = descs.as_ptr();
        o.arena_base = base;
        o.arena_size = size;
        if let Some(v) = self.save_deadline_ms {
            o.save_deadline_ms = v;
        }
        if let Some(v) = self.load_deadline_ms {
            o.load_deadline_ms = v;
        }
        if let Some(v) = self.control_deadline_ms {
            o.control_deadline_ms = v;
        }
        if let Some(v) = self.lookup_deadline_ms {
            o.lookup_deadline_ms = v;
        }
        if let Some(v) = self.probe_interval_ms {
            o.probe_interval_ms = v;
        }
        let codec = match &self.codec {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        if let Some(c) = &codec {
            o.codec = c.as_ptr();
        }
        if let Some((t, h, d)) = self.codec_shape {
            o.codec_tokens = t;
            o.codec_heads = h;
            o.codec_head_dim = d;
        }
        if let Some(v) = self.codec_slot_bytes {
            o.codec_slot_bytes = v;
        }
        let offsets = self.segment_offsets.clone();
        if let Some(offs) = &offsets {
            o.segment_offsets = offs.as_ptr();
            o.num_segment_offsets =
                u32::try_from(offs.len()).map_err(|_| invalid("too many segment offsets"))?;
        }
        Ok(RawEngineOptions {
            o,
            _ns: ns,
            _inst: inst,
            _names: names,
            _descs: descs,
            _offsets: offsets,
            _codec: codec,
        })
    }
}

/// A pin on the blocks a query reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease(pub [u8; 16]);

/// What a query found.
#[derive(Debug, Clone, Copy)]
pub struct QueryResult {
    /// The leading run of hashes sealed in the namespace.
    pub hit_blocks: u64,
    /// Pins them; `None` when nothing hit.
    pub lease: Option<Lease>,
    /// A deeper tier is bringing more: query again with the same req_id.
    pub loading: bool,
    /// The blocks right after the hit prefix whose save is still in flight
    /// (not leased: a miss unless the query waited for them).
    pub pending_blocks: u64,
}

impl QueryResult {
    fn from_raw(r: &sys::oi_query_result) -> QueryResult {
        let lease = if r.lease.bytes.iter().any(|&b| b != 0) { Some(Lease(r.lease.bytes)) } else { None };
        QueryResult {
            hit_blocks: r.hit_blocks,
            lease,
            loading: r.state == sys::OI_QUERY_LOADING,
            pending_blocks: r.pending_blocks,
        }
    }
}

/// What one save call did with its n blocks (`oi_save_result`, asked for with
/// [`SaveOptions::counts`]); `accepted + deduplicated + dropped == n`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SaveResult {
    /// Being copied into the tier (the ticket reports their end).
    pub accepted: u64,
    /// The namespace already held them (sealed or in flight).
    pub deduplicated: u64,
    /// Got no memory (the pool is full of pinned blocks); never fails the ticket.
    pub dropped: u64,
}

/// The connection of an engine to its server (`oi_connection_state`,
/// [`EngineStats::connection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectionState {
    /// An embedded engine ([`OffloadEngine::new`]).
    Embedded,
    /// A sidecar engine registered with a live server.
    Connected,
    /// An engine-owned sidecar engine ([`OffloadEngine::connect_owned`])
    /// whose server went away: queries miss, saves are dropped, loads fail
    /// with `Closed`; it reconnects in the background when a server listens
    /// on the socket again.
    Degraded,
    /// A state this binding does not know.
    Unknown(u32),
}

impl Default for ConnectionState {
    fn default() -> ConnectionState {
        ConnectionState::Embedded
    }
}

impl ConnectionState {
    pub fn from_raw(v: u32) -> ConnectionState {
        match v {
            sys::OI_CONNECTION_EMBEDDED => ConnectionState::Embedded,
            sys::OI_CONNECTION_CONNECTED => ConnectionState::Connected,
            sys::OI_CONNECTION_DEGRADED => ConnectionState::Degraded,
            other => ConnectionState::Unknown(other),
        }
    }
}

/// Engine counters (the scalar fields of `oi_engine_stats`; the latency
/// histograms are raw-only).
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineStats {
    pub instance_id: u32,
    /// Bytes of one host block of this layout.
    pub block_bytes: u64,
    pub num_blocks: u64,
    /// Blocks.
    pub saves_submitted: u64,
    pub saves_completed: u64,
    pub saves_deduplicated: u64,
    pub saves_dropped: u64,
    pub saves_failed: u64,
    /// Save operations not yet sealed or dropped.
    pub saves_pending: u64,
    /// Load operations accepted.
    pub loads_submitted: u64,
    /// Load operations.
    pub loads_completed: u64,
    pub loads_failed: u64,
    pub blocks_loaded: u64,
    pub bytes_saved: u64,
    pub bytes_loaded: u64,
    pub query_hit_blocks: u64,
    pub query_miss_blocks: u64,
    /// Blocks in flight or sealed in this engine's namespace (every engine
    /// of the namespace shares them).
    pub namespace_blocks_resident: u64,
    /// Sidecar: the epoch of the server the engine is registered with (0:
    /// embedded, or no server now).
    pub server_epoch: u64,
    pub connection: ConnectionState,
    /// Engine-owned sidecar engines: times it registered again with a server
    /// that came back.
    pub reconnects: u32,
    /// Blocks of saves dropped because no server was connected.
    pub disconnected_saves: u64,
    /// Blocks reported missing because no server was connected.
    pub disconnected_query_misses: u64,
    /// Codec namespaces: blocks of saves not stored because the codec made
    /// no frame that fits the namespace's slot (also in `saves_failed`).
    pub saves_not_encoded: u64,
}

enum Memory {
    /// cpu: a buffer the engine owns.
    Owned(Vec<u8>),
    /// sidecar: the arena the server allocated, mapped here; closed first.
    Imported(NonNull<sys::oi_imported_arena>),
    /// a caller-managed address (cuda device memory).
    Raw(*mut c_void, u64),
    /// sidecar, engine-owned cpu memory: a sealed memfd the server maps too;
    /// unmapped after the engine is destroyed.
    Shared(SharedBuffer),
}

/// One rank's offload engine. Thread-safe (`Send + Sync`); borrows its host
/// (`'h`), which therefore outlives it. Sidecar engines are
/// `OffloadEngine<'static>` and own their imported arena.
pub struct OffloadEngine<'h> {
    raw: NonNull<sys::oi_engine>,
    mem: Memory,
    inflight: Arc<InFlight>,
    _host: PhantomData<&'h OffloadHost>,
}

// The C API documents every engine function as callable from any thread;
// the memory is only reachable through &mut self or raw pointers.
unsafe impl Send for OffloadEngine<'_> {}
unsafe impl Sync for OffloadEngine<'_> {}

impl<'h> OffloadEngine<'h> {
    /// An embedded engine on the cpu backend whose arenas lie (by offset) in
    /// `buffer`, which the engine owns (see [`buffer_mut`](Self::buffer_mut)).
    pub fn new(host: &'h OffloadHost, opts: &EngineOptions, mut buffer: Vec<u8>) -> Result<OffloadEngine<'h>> {
        // Segment offsets of the wrong count: the library refuses the layout
        // with its own status and message.
        let counted = opts.segment_offsets.as_ref().map_or(true, |o| o.len() == opts.total_segments());
        if counted && opts.span() > buffer.len() as u64 {
            return Err(invalid("the arenas extend past the buffer"));
        }
        let raw = opts.raw(buffer.as_mut_ptr() as *mut c_void, buffer.len() as u64)?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::oi_engine_create(host.as_ptr(), &raw.o, &mut out) })?;
        Ok(OffloadEngine {
            raw: NonNull::new(out).unwrap(),
            mem: Memory::Owned(buffer),
            inflight: Arc::default(),
            _host: PhantomData,
        })
    }

    /// An embedded engine over caller-managed memory (a cuda device pointer,
    /// e.g. a tensor's data_ptr()).
    ///
    /// # Safety
    /// `[base, base + size)` must stay valid, and not be freed, until the
    /// engine is dropped; the caller must not race the engine's copies.
    pub unsafe fn from_raw_memory(
        host: &'h OffloadHost,
        opts: &EngineOptions,
        base: *mut c_void,
        size: u64,
    ) -> Result<OffloadEngine<'h>> {
        let raw = opts.raw(base, size)?;
        let mut out = ptr::null_mut();
        check(sys::oi_engine_create(host.as_ptr(), &raw.o, &mut out))?;
        Ok(OffloadEngine {
            raw: NonNull::new(out).unwrap(),
            mem: Memory::Raw(base, size),
            inflight: Arc::default(),
            _host: PhantomData,
        })
    }

    pub fn as_ptr(&self) -> *mut sys::oi_engine {
        self.raw.as_ptr()
    }

    /// The start of the KV memory (host address on cpu, device pointer on cuda).
    pub fn memory_ptr(&self) -> *mut c_void {
        match &self.mem {
            Memory::Owned(v) => v.as_ptr() as *mut c_void,
            Memory::Imported(a) => unsafe { sys::oi_imported_arena_ptr(a.as_ptr()) },
            Memory::Raw(p, _) => *p,
            Memory::Shared(b) => b.as_ptr() as *mut c_void,
        }
    }

    pub fn memory_len(&self) -> u64 {
        match &self.mem {
            Memory::Owned(v) => v.len() as u64,
            Memory::Imported(a) => unsafe { sys::oi_imported_arena_size(a.as_ptr()) },
            Memory::Raw(_, n) => *n,
            Memory::Shared(b) => b.len() as u64,
        }
    }

    /// The KV bytes (cpu memory). Takes `&mut self` for the same reason as
    /// [`buffer_mut`](Self::buffer_mut): no copy may be writing them.
    pub fn buffer(&mut self) -> Result<&[u8]> {
        self.buffer_mut().map(|b| &*b)
    }

    /// The KV bytes for writing (cpu memory: an owned buffer, a cpu sidecar
    /// arena or an engine-owned [`SharedBuffer`]). Taking `&mut self` proves no [`Ticket`] (which borrows
    /// the engine) is live; operations whose tickets were dropped before they
    /// completed are waited for here ([`wait_in_flight`](Self::wait_in_flight)),
    /// so no copy touches the bytes while the slice lives.
    pub fn buffer_mut(&mut self) -> Result<&mut [u8]> {
        self.inflight.wait_idle();
        match &mut self.mem {
            Memory::Owned(v) => Ok(&mut v[..]),
            Memory::Imported(a) => unsafe {
                let p = sys::oi_imported_arena_ptr(a.as_ptr()) as *mut u8;
                let n = sys::oi_imported_arena_size(a.as_ptr()) as usize;
                Ok(std::slice::from_raw_parts_mut(p, n))
            },
            Memory::Raw(..) => Err(Error::new(sys::OI_ERR_UNSUPPORTED, "caller-managed memory: use memory_ptr()")),
            Memory::Shared(b) => Ok(b.as_mut_slice()),
        }
    }

    /// Operations of this engine whose completion has not been reported yet
    /// (live tickets and dropped ones).
    pub fn in_flight(&self) -> usize {
        self.inflight.count()
    }

    /// Blocks until every operation submitted so far has completed, the ones
    /// whose tickets were dropped included.
    pub fn wait_in_flight(&self) {
        self.inflight.wait_idle()
    }

    /// Saves `block_ids[i]` under `hashes[i]`. The ticket borrows the engine.
    pub fn save(&self, block_ids: &[i64], hashes: &[BlockHash]) -> Result<Ticket<'_>> {
        self.save_with(block_ids, hashes, SaveOptions::new())
    }

    /// [`save`](Self::save) with options: a CUDA event to wait for before
    /// copying, and a completion closure (`on_done`, the signal that the
    /// device blocks may be reused).
    pub fn save_with(&self, block_ids: &[i64], hashes: &[BlockHash], opts: SaveOptions) -> Result<Ticket<'_>> {
        if block_ids.len() != hashes.len() {
            return Err(invalid("block_ids and hashes differ in length"));
        }
        let mut o: sys::oi_save_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_save_options_init(&mut o) })?;
        o.wait_event = opts.wait_event;
        o.arena_first = opts.arena_first;
        o.arena_count = opts.arena_count;
        let mut counts: sys::oi_save_result = unsafe { std::mem::zeroed() };
        counts.struct_size = std::mem::size_of::<sys::oi_save_result>() as u32;
        if opts.counts {
            o.result = &mut counts;
        }
        let on_done = opts.on_done.map(|f| Arc::new(OnDone(Mutex::new(Some(f)))));
        let mut ctx: *const OnDone = ptr::null();
        if let Some(d) = &on_done {
            ctx = Arc::into_raw(d.clone());
            o.on_done = Some(save_done);
            o.on_done_ctx = ctx as *mut c_void;
        }
        let mut t = ptr::null_mut();
        let st = unsafe {
            sys::oi_engine_save(
                self.raw.as_ptr(),
                block_ids.as_ptr(),
                hashes.as_ptr() as *const sys::oi_block_hash,
                block_ids.len() as sys::size_t,
                &o,
                &mut t,
            )
        };
        if st < 0 {
            let err = Error::from_last(st);
            // A refused save never calls on_done (the library drops it): free
            // the closure and the reference the library would have consumed.
            if let Some(d) = &on_done {
                if lock(&d.0).take().is_some() {
                    drop(unsafe { Arc::from_raw(ctx) });
                }
            }
            return Err(err);
        }
        let mut ticket = Ticket::from_raw(t, Some(&self.inflight))?;
        if opts.counts && counts.accepted != u64::MAX {
            ticket.save_result = Some(SaveResult {
                accepted: counts.accepted,
                deduplicated: counts.deduplicated,
                dropped: counts.dropped,
            });
        }
        Ok(ticket)
    }

    /// Counts the leading run of `hashes` in the host tier and leases it.
    /// Blocks right after it whose save is in flight are reported in
    /// `pending_blocks` (a miss; see [`query_with`](Self::query_with)).
    pub fn query(&self, req_id: Option<&str>, hashes: &[BlockHash]) -> Result<QueryResult> {
        self.query_with(req_id, hashes, &QueryOptions::new())
    }

    /// [`query`](Self::query) with options (wait for pending blocks).
    pub fn query_with(&self, req_id: Option<&str>, hashes: &[BlockHash], opts: &QueryOptions) -> Result<QueryResult> {
        let e = self.raw.as_ptr();
        let r = raw_query(req_id, hashes, opts, None, |rid, hs, n, flags, r| unsafe {
            sys::oi_engine_query(e, rid, hs, n, flags, r)
        })?;
        Ok(QueryResult::from_raw(&r))
    }

    /// Which of `hashes` are present, each on its own, and how many are
    /// still being saved.
    pub fn membership(&self, hashes: &[BlockHash]) -> Result<Membership> {
        let e = self.raw.as_ptr();
        membership_with(hashes, |rid, hs, n, flags, r| unsafe { sys::oi_engine_query(e, rid, hs, n, flags, r) })
    }

    /// Which of `hashes` are present, each on its own (no prefix rule, no lease).
    pub fn query_membership(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        let mut present = vec![0u8; hashes.len().max(1)];
        let mut r: sys::oi_query_result = unsafe { std::mem::zeroed() };
        r.struct_size = std::mem::size_of::<sys::oi_query_result>() as u32;
        r.present = present.as_mut_ptr();
        check(unsafe {
            sys::oi_engine_query(
                self.raw.as_ptr(),
                ptr::null(),
                hashes.as_ptr() as *const sys::oi_block_hash,
                hashes.len() as sys::size_t,
                sys::OI_QUERY_MEMBERSHIP as u32,
                &mut r,
            )
        })?;
        Ok(present[..hashes.len()].iter().map(|&b| b != 0).collect())
    }

    /// Copies the leased blocks into `dst_block_ids`; consumes one share of
    /// the lease, whether the load succeeds or fails.
    pub fn load(&self, lease: Lease, dst_block_ids: &[i64]) -> Result<Ticket<'_>> {
        self.load_flags(lease, dst_block_ids, 0)
    }

    /// [`OffloadEngine::load`] arena by arena, with a CUDA event after each arena's
    /// copies ([`Ticket::arena_event`]; `OI_LOAD_ARENA_EVENTS`).
    pub fn load_layered(&self, lease: Lease, dst_block_ids: &[i64]) -> Result<Ticket<'_>> {
        self.load_flags(lease, dst_block_ids, LOAD_ARENA_EVENTS)
    }

    /// [`load`](Self::load) with options (`OI_LOAD_*` flags).
    pub fn load_with(&self, lease: Lease, dst_block_ids: &[i64], opts: &LoadOptions) -> Result<Ticket<'_>> {
        self.load_flags(lease, dst_block_ids, opts.flags)
    }

    fn load_flags(&self, lease: Lease, dst_block_ids: &[i64], flags: u32) -> Result<Ticket<'_>> {
        let mut t = ptr::null_mut();
        let mut opt: sys::oi_load_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_load_options_init(&mut opt) })?;
        opt.flags = flags;
        check(unsafe {
            sys::oi_engine_load(
                self.raw.as_ptr(),
                sys::oi_lease { bytes: lease.0 },
                dst_block_ids.as_ptr(),
                dst_block_ids.len() as sys::size_t,
                &opt,
                &mut t,
            )
        })?;
        Ticket::from_raw(t, Some(&self.inflight))
    }

    /// Drops a lease (`LeaseExpired` when it is unknown, consumed or expired).
    pub fn release(&self, lease: Lease) -> Result<()> {
        check(unsafe { sys::oi_engine_release(self.raw.as_ptr(), sys::oi_lease { bytes: lease.0 }) })?;
        Ok(())
    }

    /// Waits until every save submitted before the call is sealed or dropped.
    pub fn flush(&self, timeout: Option<Duration>) -> Result<()> {
        check(unsafe { sys::oi_engine_flush(self.raw.as_ptr(), timeout_ms(timeout)) })?;
        Ok(())
    }

    pub fn stats(&self) -> Result<EngineStats> {
        let mut s: sys::oi_engine_stats = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::oi_engine_stats>() as u32;
        check(unsafe { sys::oi_engine_get_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(EngineStats {
            instance_id: s.instance_id,
            block_bytes: s.block_bytes,
            num_blocks: s.num_blocks,
            saves_submitted: s.saves_submitted,
            saves_completed: s.saves_completed,
            saves_deduplicated: s.saves_deduplicated,
            saves_dropped: s.saves_dropped,
            saves_failed: s.saves_failed,
            saves_pending: s.saves_pending,
            loads_submitted: s.loads_submitted,
            loads_completed: s.loads_completed,
            loads_failed: s.loads_failed,
            blocks_loaded: s.blocks_loaded,
            bytes_saved: s.bytes_saved,
            bytes_loaded: s.bytes_loaded,
            query_hit_blocks: s.query_hit_blocks,
            query_miss_blocks: s.query_miss_blocks,
            namespace_blocks_resident: s.namespace_blocks_resident,
            server_epoch: s.server_epoch,
            connection: ConnectionState::from_raw(s.connection),
            reconnects: s.reconnects,
            disconnected_saves: s.disconnected_saves,
            disconnected_query_misses: s.disconnected_query_misses,
            saves_not_encoded: s.saves_not_encoded,
        })
    }
}

impl OffloadEngine<'static> {
    /// Sidecar mode: connects to `openinfer serve` at `socket` (None: the
    /// default path), registers the layout (arenas by offset) and imports the
    /// arena the server allocated, which the engine owns: dropping the engine
    /// closes the mapping first, then flushes and unregisters.
    pub fn connect(socket: Option<&str>, opts: &EngineOptions) -> Result<OffloadEngine<'static>> {
        let sock = match socket {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let raw = opts.raw(ptr::null_mut(), 0)?;
        let mut out = ptr::null_mut();
        let mut arena = ptr::null_mut();
        check(unsafe {
            sys::oi_engine_connect(
                sock.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
                &raw.o,
                &mut out,
                &mut arena,
            )
        })?;
        Ok(OffloadEngine {
            raw: NonNull::new(out).unwrap(),
            mem: Memory::Imported(NonNull::new(arena).unwrap()),
            inflight: Arc::default(),
            _host: PhantomData,
        })
    }

    /// Sidecar mode with engine-owned cpu memory: the arenas lie (by offset)
    /// in `memory`, a sealed memfd that is sent to the server, which maps it
    /// (`arena_base`, `arena_size` and `arena_fd`); the server allocates
    /// nothing. The engine keeps `memory` (read and write it with
    /// [`buffer`](Self::buffer) / [`buffer_mut`](Self::buffer_mut)) and
    /// unmaps it only after the engine is destroyed. If the server goes
    /// away the engine degrades instead of aborting
    /// ([`ConnectionState::Degraded`]: queries miss, saves are dropped,
    /// loads fail with `Closed`, release reports `LeaseExpired`) and
    /// reconnects in the background when a server listens on the socket
    /// again (a new [`EngineStats::server_epoch`]; old leases are invalid).
    pub fn connect_owned(socket: Option<&str>, opts: &EngineOptions, memory: SharedBuffer) -> Result<OffloadEngine<'static>> {
        if opts.device != DEVICE_CPU {
            return Err(invalid("connect_owned: a SharedBuffer is cpu memory (use connect_owned_device for CUDA)"));
        }
        let sock = match socket {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let mut raw = opts.raw(memory.as_ptr() as *mut c_void, memory.len() as u64)?;
        raw.o.arena_fd = memory.fd();
        let mut out = ptr::null_mut();
        check(unsafe {
            sys::oi_engine_connect(
                sock.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
                &raw.o,
                &mut out,
                ptr::null_mut(),
            )
        })?;
        Ok(OffloadEngine {
            raw: NonNull::new(out).unwrap(),
            mem: Memory::Shared(memory),
            inflight: Arc::default(),
            _host: PhantomData,
        })
    }

    /// Sidecar mode with engine-owned CUDA memory: `[device_ptr, device_ptr +
    /// size)` on `opts.device` (from `cudaMalloc`, possibly inside a larger
    /// allocation), which the library exports to the server (CUDA IPC).
    /// Degrades and reconnects as [`connect_owned`](Self::connect_owned).
    /// Read the memory through [`memory_ptr`](Self::memory_ptr).
    ///
    /// # Safety
    /// The memory must be device memory of `opts.device`, stay allocated
    /// until the engine is dropped, and not be raced with the engine's copies.
    pub unsafe fn connect_owned_device(
        socket: Option<&str>,
        opts: &EngineOptions,
        device_ptr: *mut c_void,
        size: u64,
    ) -> Result<OffloadEngine<'static>> {
        if device_ptr.is_null() {
            return Err(invalid("connect_owned_device: device_ptr is null"));
        }
        let sock = match socket {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let raw = opts.raw(device_ptr, size)?;
        let mut out = ptr::null_mut();
        check(sys::oi_engine_connect(
            sock.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
            &raw.o,
            &mut out,
            ptr::null_mut(),
        ))?;
        Ok(OffloadEngine {
            raw: NonNull::new(out).unwrap(),
            mem: Memory::Raw(device_ptr, size),
            inflight: Arc::default(),
            _host: PhantomData,
        })
    }
}

impl Drop for OffloadEngine<'_> {
    /// Drop order: close the imported mapping (sidecar), then flush and
    /// unregister; an owned buffer (a `Vec` or a [`SharedBuffer`]) is freed
    /// after the engine is gone
    /// (`oi_engine_destroy` drains the engine's copies, those of
    /// dropped tickets included, before it returns).
    fn drop(&mut self) {
        unsafe {
            if let Memory::Imported(a) = self.mem {
                sys::oi_imported_arena_close(a.as_ptr());
            }
            sys::oi_engine_destroy(self.raw.as_ptr());
        }
    }
}

// ---------------------------------------------------------------------------- tickets

/// `OI_LOAD_ARENA_EVENTS`: copy arena by arena with a CUDA event after each.
pub const LOAD_ARENA_EVENTS: u32 = sys::OI_LOAD_ARENA_EVENTS as u32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The result of a completed operation, as a completion callback sees it
/// (on a library thread, where `oi_last_error()` says nothing about it).
fn op_result(st: i32) -> Result<()> {
    if st >= 0 {
        Ok(())
    } else {
        Err(Error::new(st, format!("the operation completed with {}", status_name(st))))
    }
}

/// A completion closure: runs once, on a library thread, and must not block.
type DoneFn = Box<dyn FnOnce(Result<()>) + Send + 'static>;

/// Operations of one engine whose completion callback has not run yet.
#[derive(Default)]
struct InFlight {
    n: Mutex<usize>,
    idle: Condvar,
}

impl InFlight {
    fn begin(&self) {
        *lock(&self.n) += 1;
    }
    fn end(&self) {
        let mut n = lock(&self.n);
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }
    fn count(&self) -> usize {
        *lock(&self.n)
    }
    fn wait_idle(&self) {
        let mut n = lock(&self.n);
        while *n > 0 {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What the ticket's completion callback fills in.
#[derive(Default)]
struct Completion {
    status: Option<i32>,
    waker: Option<Waker>,
    callbacks: Vec<DoneFn>,
}

/// The context of the C completion callback: consumed by its one call.
struct TicketCtx {
    done: Arc<Mutex<Completion>>,
    inflight: Option<Arc<InFlight>>,
}

unsafe extern "C" fn ticket_done(ctx: *mut c_void, _t: *mut sys::oi_ticket, st: sys::oi_status) {
    // The library calls this exactly once per ticket (oi_ticket_set_callback).
    let ctx = Box::from_raw(ctx as *mut TicketCtx);
    let (waker, callbacks) = {
        let mut c = lock(&ctx.done);
        c.status = Some(st);
        (c.waker.take(), std::mem::take(&mut c.callbacks))
    };
    if let Some(f) = &ctx.inflight {
        f.end(); // the copies are over: buffer_mut may hand the bytes out
    }
    if let Some(w) = waker {
        let _ = catch_unwind(AssertUnwindSafe(|| w.wake()));
    }
    for f in callbacks {
        // A panic must not unwind into the library's thread.
        let _ = catch_unwind(AssertUnwindSafe(|| f(op_result(st))));
    }
}

/// The context of a save's `on_done`: the closure, taken by whoever runs first.
struct OnDone(Mutex<Option<DoneFn>>);

unsafe extern "C" fn save_done(ctx: *mut c_void, st: sys::oi_status) {
    let ctx = Arc::from_raw(ctx as *const OnDone);
    let f = lock(&ctx.0).take();
    if let Some(f) = f {
        let _ = catch_unwind(AssertUnwindSafe(|| f(op_result(st))));
    }
}

/// Options of [`OffloadEngine::save_with`].
pub struct SaveOptions {
    wait_event: *mut c_void,
    on_done: Option<DoneFn>,
    counts: bool,
    arena_first: u32,
    arena_count: u32,
}

impl fmt::Debug for SaveOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaveOptions")
            .field("wait_event", &self.wait_event)
            .field("on_done", &self.on_done.is_some())
            .field("counts", &self.counts)
            .field("arena_first", &self.arena_first)
            .field("arena_count", &self.arena_count)
            .finish()
    }
}

impl Default for SaveOptions {
    fn default() -> SaveOptions {
        SaveOptions::new()
    }
}

impl SaveOptions {
    pub fn new() -> SaveOptions {
        SaveOptions { wait_event: ptr::null_mut(), on_done: None, counts: false, arena_first: 0, arena_count: 0 }
    }

    /// A layerwise save: copy only arenas `[first, first + count)` of each
    /// block (a layer's arenas, as soon as that layer is written, each call
    /// with its own ticket). A block's host copy seals, and queries count it,
    /// only when every arena of the layout arrived; a failed arena aborts the
    /// whole block. `count` 0 (the default): whole blocks. Sidecar engines
    /// need a server with the layerwise capability (else `Unsupported`).
    pub fn arenas(mut self, first: u32, count: u32) -> SaveOptions {
        self.arena_first = first;
        self.arena_count = count;
        self
    }

    /// Ask for this call's [`SaveResult`] (accepted / deduplicated / dropped),
    /// filled before `save_with` returns and read with
    /// [`Ticket::save_result`]. A sidecar engine waits one round trip for the
    /// server's counts.
    pub fn counts(mut self, on: bool) -> SaveOptions {
        self.counts = on;
        self
    }

    /// A `cudaEvent_t` recorded after the KV was written: the copies wait for
    /// it on the device (local CUDA engines; a sidecar engine refuses it with
    /// `Unsupported`).
    ///
    /// # Safety
    /// `event` must be a valid CUDA event of the engine's device (or null)
    /// while `save_with` runs.
    pub unsafe fn wait_event(mut self, event: *mut c_void) -> SaveOptions {
        self.wait_event = event;
        self
    }

    /// Called once when the save's blocks may be reused (their bytes were
    /// copied, or the save was dropped or failed), with the save's result.
    /// Runs on a library thread, or on the calling thread before `save_with`
    /// returns when nothing needed copying; it must not block. Not called
    /// when `save_with` returns an error.
    pub fn on_done(mut self, f: impl FnOnce(Result<()>) + Send + 'static) -> SaveOptions {
        self.on_done = Some(Box::new(f));
        self
    }
}

/// Options of [`OffloadEngine::load_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// `OI_LOAD_*` flags ([`LOAD_ARENA_EVENTS`]).
    pub flags: u32,
}

impl LoadOptions {
    pub fn new() -> LoadOptions {
        LoadOptions { flags: 0 }
    }
    /// `OI_LOAD_ARENA_EVENTS`: copy arena by arena with a CUDA event after
    /// each ([`Ticket::arena_event`]); a plain load where there are none.
    pub fn arena_events(mut self, on: bool) -> LoadOptions {
        if on {
            self.flags |= LOAD_ARENA_EVENTS;
        } else {
            self.flags &= !LOAD_ARENA_EVENTS;
        }
        self
    }
    /// Raw `OI_LOAD_*` flags (an unknown flag is refused by the library).
    pub fn flags(mut self, flags: u32) -> LoadOptions {
        self.flags = flags;
        self
    }
}

/// The completion of a save or load. Borrows its engine.
///
/// * `wait`/`poll` block or ask; `fd` is an eventfd for a poller of your own.
/// * It is a [`Future`] (`ticket.await`, or `(&ticket).await` to keep it)
///   whose waker is driven by the ticket's completion callback, set when the
///   ticket is made; [`on_complete`](Ticket::on_complete) adds closures to
///   that callback.
/// * Dropping it does not wait and never cancels: the library keeps the
///   operation alive until it completes (`oi_ticket_release`). The engine
///   counts the operation as in flight until then:
///   [`OffloadEngine::buffer_mut`] waits for it, and dropping the engine
///   drains it.
pub struct Ticket<'e> {
    raw: NonNull<sys::oi_ticket>,
    done: Arc<Mutex<Completion>>,
    save_result: Option<SaveResult>,
    _engine: PhantomData<&'e ()>,
}

// Tickets are thread-safe in the C API; the completion state is behind a mutex.
unsafe impl Send for Ticket<'_> {}
unsafe impl Sync for Ticket<'_> {}

impl<'e> Ticket<'e> {
    /// Takes the caller's reference to `t` and registers the completion
    /// callback (counted in `inflight` until it runs).
    fn from_raw(t: *mut sys::oi_ticket, inflight: Option<&Arc<InFlight>>) -> Result<Ticket<'e>> {
        let raw = NonNull::new(t).ok_or_else(|| Error::new(sys::OI_ERR_INTERNAL, "no ticket returned"))?;
        let done = Arc::new(Mutex::new(Completion::default()));
        if let Some(f) = inflight {
            f.begin();
        }
        let ctx = Box::into_raw(Box::new(TicketCtx { done: done.clone(), inflight: inflight.cloned() }));
        let st = unsafe { sys::oi_ticket_set_callback(t, Some(ticket_done), ctx as *mut c_void) };
        if st < 0 {
            // Not registered (cannot happen on a fresh ticket): complete the
            // bookkeeping by waiting here, so nothing is left in flight.
            let st = unsafe { sys::oi_ticket_wait(t, u32::MAX) };
            unsafe { ticket_done(ctx as *mut c_void, t, st) };
        }
        Ok(Ticket { raw, done, save_result: None, _engine: PhantomData })
    }

    /// A save made with [`SaveOptions::counts`]: what the call did with its
    /// blocks. `None` for other tickets, and in sidecar mode when the server's
    /// counts could not come (it refused the save, which the ticket reports,
    /// or they did not arrive within the control deadline).
    pub fn save_result(&self) -> Option<SaveResult> {
        self.save_result
    }

    /// `Ok(false)` while not final (pending, or [`fencing`](Self::fencing)),
    /// `Ok(true)` on success, or the operation's error.
    pub fn poll(&self) -> Result<bool> {
        let st = unsafe { sys::oi_ticket_poll(self.raw.as_ptr()) };
        if st > 0 {
            return Ok(false);
        }
        check(st).map(|_| true)
    }

    /// True while a load that missed its deadline may still have copies
    /// landing in its destination blocks (`OI_FENCING`): they are not the
    /// caller's until the ticket completes (with `Deadline`).
    pub fn fencing(&self) -> bool {
        unsafe { sys::oi_ticket_poll(self.raw.as_ptr()) == sys::OI_FENCING }
    }

    /// Waits up to `timeout` (None: forever). A `Timeout` error leaves the
    /// ticket pending and usable; it comes at once while the ticket is
    /// [`fencing`](Self::fencing), so no wait outlasts a load's deadline.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        check(unsafe { sys::oi_ticket_wait(self.raw.as_ptr(), timeout_ms(timeout)) }).map(|_| ())
    }

    /// Whether the completion callback has run (the future is ready).
    pub fn is_complete(&self) -> bool {
        lock(&self.done).status.is_some()
    }

    /// Calls `f` once with the operation's result: from the completion
    /// callback (a library thread; it must not block), or right here when the
    /// ticket has already completed. Several closures may be added.
    pub fn on_complete(&self, f: impl FnOnce(Result<()>) + Send + 'static) {
        let mut c = lock(&self.done);
        match c.status {
            Some(st) => {
                drop(c);
                f(op_result(st));
            }
            None => c.callbacks.push(Box::new(f)),
        }
    }

    fn poll_complete(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let mut c = lock(&self.done);
        match c.status {
            Some(st) => Poll::Ready(op_result(st)),
            None => {
                match &c.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => c.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }

    /// An eventfd that turns readable on completion (owned by the ticket).
    pub fn fd(&self) -> RawFd {
        unsafe { sys::oi_ticket_fd(self.raw.as_ptr()) }
    }

    /// The cudaEvent_t recorded after the copies (null on cpu).
    pub fn cuda_event(&self) -> *mut c_void {
        unsafe { sys::oi_ticket_cuda_event(self.raw.as_ptr()) }
    }

    /// A load made with [`OffloadEngine::load_layered`] (or
    /// [`LoadOptions::arena_events`]): the `cudaEvent_t` recorded after arena
    /// `arena`'s copies; null when there is none (cpu backend, remote engine,
    /// not layered, out of range). Owned by the ticket.
    pub fn arena_event(&self, arena: u32) -> *mut c_void {
        unsafe { sys::oi_ticket_arena_event(self.raw.as_ptr(), arena) }
    }

    /// Waits up to `timeout` (None: forever) until arena `arena`'s bytes are
    /// in place (`oi_ticket_arena_wait`). A load made with
    /// [`LoadOptions::arena_events`] reports each arena as its copies land,
    /// in the layout's order (embedded engines; sidecar engines from the
    /// server's progress frames); any other ticket (a load without the flag,
    /// a save) waits for the whole operation, whatever `arena`. Returns the load's error as soon as the
    /// load failed at this arena or an earlier one (bytes of a failed load
    /// are never to be used); `Timeout` leaves the ticket usable; an arena
    /// past the layout's count is `InvalidArgument` (with per-arena progress).
    pub fn arena_wait(&self, arena: u32, timeout: Option<Duration>) -> Result<()> {
        check(unsafe { sys::oi_ticket_arena_wait(self.raw.as_ptr(), arena, timeout_ms(timeout)) }).map(|_| ())
    }

    /// [`arena_wait`](Self::arena_wait) without blocking: `Ok(false)` while
    /// the arena is still moving, `Ok(true)` once its bytes are in place, or
    /// the error.
    pub fn arena_poll(&self, arena: u32) -> Result<bool> {
        let st = unsafe { sys::oi_ticket_arena_poll(self.raw.as_ptr(), arena) };
        if st > 0 {
            return Ok(false);
        }
        check(st).map(|_| true)
    }
}

impl Future for Ticket<'_> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.poll_complete(cx)
    }
}

impl Future for &Ticket<'_> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.poll_complete(cx)
    }
}

impl Drop for Ticket<'_> {
    /// Drops the caller's reference without waiting (the operation goes on;
    /// the engine still counts it as in flight until it completes).
    fn drop(&mut self) {
        unsafe { sys::oi_ticket_release(self.raw.as_ptr()) }
    }
}

/// Runs a future to completion on the calling thread: a minimal std-only
/// executor (the waker unparks this thread). Enough for tickets, whose
/// wakers are called from the library's completion threads.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut fut = Box::pin(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

// ---------------------------------------------------------------------------- imported arena

/// An arena exported by another process, mapped here (`oi_imported_arena`).
/// Close it (drop) before the owner frees it.
pub struct ImportedArena {
    raw: NonNull<sys::oi_imported_arena>,
}

unsafe impl Send for ImportedArena {}
unsafe impl Sync for ImportedArena {}

impl ImportedArena {
    /// Maps `handle` (64 bytes) on `device`; the real allocation must hold at
    /// least `expected_bytes` (else `Protocol`).
    pub fn open(handle: &[u8; 64], expected_bytes: u64, device: i32) -> Result<ImportedArena> {
        let h = sys::oi_arena_handle { bytes: *handle };
        let mut out = ptr::null_mut();
        check(unsafe { sys::oi_imported_arena_open(&h, expected_bytes, device, &mut out) })?;
        Ok(ImportedArena { raw: NonNull::new(out).unwrap() })
    }
    pub fn as_ptr(&self) -> *mut c_void {
        unsafe { sys::oi_imported_arena_ptr(self.raw.as_ptr()) }
    }
    pub fn len(&self) -> u64 {
        unsafe { sys::oi_imported_arena_size(self.raw.as_ptr()) }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes of a cpu arena.
    ///
    /// # Safety
    /// The arena must be host memory (cpu backend) and nothing may write it
    /// concurrently.
    pub unsafe fn as_slice(&self) -> &[u8] {
        std::slice::from_raw_parts(self.as_ptr() as *const u8, self.len() as usize)
    }
}

impl Drop for ImportedArena {
    fn drop(&mut self) {
        unsafe { sys::oi_imported_arena_close(self.raw.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------- shared buffer

// The system libc, which std already links (no crate needed).
mod libc_sys {
    use std::os::raw::{c_char, c_int, c_uint, c_void};
    pub const MFD_CLOEXEC: c_uint = 0x0001;
    pub const MFD_ALLOW_SEALING: c_uint = 0x0002;
    pub const F_ADD_SEALS: c_int = 1024 + 9;
    pub const F_GET_SEALS: c_int = 1024 + 10;
    pub const F_SEAL_SHRINK: c_int = 0x0002;
    pub const PROT_READ: c_int = 0x1;
    pub const PROT_WRITE: c_int = 0x2;
    pub const MAP_SHARED: c_int = 0x01;
    extern "C" {
        pub fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
        pub fn ftruncate(fd: c_int, length: i64) -> c_int;
        pub fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
        pub fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, offset: i64) -> *mut c_void;
        pub fn munmap(addr: *mut c_void, len: usize) -> c_int;
    }
}

fn os_error(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    let st = if e.raw_os_error() == Some(12) { sys::OI_ERR_OUT_OF_MEMORY } else { sys::OI_ERR_IO };
    Error::new(st, format!("{}: {}", what, e))
}

/// Engine-owned cpu memory for a sidecar engine
/// ([`OffloadEngine::connect_owned`]): a memfd (`memfd_create` with
/// `MFD_CLOEXEC | MFD_ALLOW_SEALING`) of `len` bytes, sealed against
/// shrinking (`F_SEAL_SHRINK`, which the server requires before it maps it),
/// mapped `MAP_SHARED` read-write from offset 0. Zero-filled when made.
/// `Drop` unmaps it and closes the descriptor.
pub struct SharedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    fd: std::os::unix::io::OwnedFd,
}

// Plain memory, like a Vec<u8>: &self reads, &mut self writes.
unsafe impl Send for SharedBuffer {}
unsafe impl Sync for SharedBuffer {}

impl SharedBuffer {
    /// A sealed, shared memfd of `len` bytes (`len` > 0).
    pub fn new(len: usize) -> Result<SharedBuffer> {
        use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd};
        use libc_sys::*;
        if len == 0 {
            return Err(invalid("SharedBuffer: len must be > 0"));
        }
        let size = i64::try_from(len).map_err(|_| invalid("SharedBuffer: len too large"))?;
        let name = b"openinfer-arena\0";
        let raw = unsafe { memfd_create(name.as_ptr() as *const c_char, MFD_CLOEXEC | MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(os_error("memfd_create"));
        }
        // Owned from here: closed on every error path.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if unsafe { ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(os_error("ftruncate"));
        }
        if unsafe { fcntl(fd.as_raw_fd(), F_ADD_SEALS, F_SEAL_SHRINK) } != 0 {
            return Err(os_error("fcntl(F_ADD_SEALS)"));
        }
        let p = unsafe { mmap(ptr::null_mut(), len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.as_raw_fd(), 0) };
        if p as isize == -1 || p.is_null() {
            return Err(os_error("mmap"));
        }
        Ok(SharedBuffer { ptr: NonNull::new(p as *mut u8).unwrap(), len, fd })
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The memfd (owned by the buffer: do not close it).
    pub fn fd(&self) -> RawFd {
        use std::os::unix::io::AsRawFd;
        self.fd.as_raw_fd()
    }
    /// The memfd's seals (`F_GET_SEALS`; includes `F_SEAL_SHRINK`, 0x2).
    pub fn seals(&self) -> Result<i32> {
        let s = unsafe { libc_sys::fcntl(self.fd(), libc_sys::F_GET_SEALS) };
        if s < 0 {
            return Err(os_error("fcntl(F_GET_SEALS)"));
        }
        Ok(s)
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn as_slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for SharedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuffer").field("ptr", &self.ptr).field("len", &self.len).field("fd", &self.fd()).finish()
    }
}

impl Drop for SharedBuffer {
    /// Unmaps the memory; the descriptor closes with the `OwnedFd`.
    fn drop(&mut self) {
        unsafe { libc_sys::munmap(self.ptr.as_ptr() as *mut c_void, self.len) };
    }
}

// ---------------------------------------------------------------------------- server

/// Options of the embeddable sidecar [`Server`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub socket_path: Option<String>,
    pub host: HostOptions,
    pub allowed_uids: Vec<u32>,
    pub allowed_gids: Vec<u32>,
    pub max_sessions: Option<u32>,
}

impl ServerOptions {
    pub fn new(socket_path: &str, pool_bytes: u64) -> ServerOptions {
        ServerOptions {
            socket_path: Some(socket_path.to_string()),
            host: HostOptions::new(pool_bytes),
            allowed_uids: Vec::new(),
            allowed_gids: Vec::new(),
            max_sessions: None,
        }
    }
}

struct SendPtr(*mut sys::oi_server);
unsafe impl Send for SendPtr {}

/// The sidecar server, serving on a thread of its own from `start` until it
/// is dropped (which stops it, joins the thread and frees it).
pub struct Server {
    raw: NonNull<sys::oi_server>,
    thread: Option<std::thread::JoinHandle<i32>>,
}

// oi_server_stop is thread-safe; run happens on the server's own thread; the
// getters read values fixed at create.
unsafe impl Send for Server {}
unsafe impl Sync for Server {}

impl Server {
    /// Creates the pool and listens on the socket, then serves on a thread.
    pub fn start(opts: &ServerOptions) -> Result<Server> {
        let host = opts.host.raw()?;
        let sock = match &opts.socket_path {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let mut o: sys::oi_server_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_server_options_init(&mut o) })?;
        o.socket_path = sock.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        o.host = &host;
        o.allowed_uids = opts.allowed_uids.as_ptr();
        o.num_allowed_uids = opts.allowed_uids.len() as u32;
        o.allowed_gids = opts.allowed_gids.as_ptr();
        o.num_allowed_gids = opts.allowed_gids.len() as u32;
        if let Some(m) = opts.max_sessions {
            o.max_sessions = m;
        }
        let mut out = ptr::null_mut();
        check(unsafe { sys::oi_server_create(&o, &mut out) })?;
        let p = SendPtr(out);
        let thread = std::thread::Builder::new()
            .name("openinfer-server".into())
            .spawn(move || {
                let p = p;
                unsafe { sys::oi_server_run(p.0) }
            })
            .map_err(|e| Error::new(sys::OI_ERR_IO, e.to_string()))?;
        Ok(Server { raw: NonNull::new(out).unwrap(), thread: Some(thread) })
    }

    pub fn socket_path(&self) -> String {
        unsafe { CStr::from_ptr(sys::oi_server_socket_path(self.raw.as_ptr()) as *const c_char) }
            .to_string_lossy()
            .into_owned()
    }

    /// Random at create: a restarted server has another.
    pub fn epoch(&self) -> u64 {
        unsafe { sys::oi_server_epoch(self.raw.as_ptr()) }
    }

    /// Stops serving, joins the thread; the result of `oi_server_run`.
    pub fn stop(mut self) -> Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<()> {
        unsafe { sys::oi_server_stop(self.raw.as_ptr()) };
        match self.thread.take() {
            Some(t) => match t.join() {
                Ok(st) => check(st).map(|_| ()),
                Err(_) => Err(Error::new(sys::OI_ERR_INTERNAL, "server thread panicked")),
            },
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
        unsafe { sys::oi_server_destroy(self.raw.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------- executor

/// Options of the reference model (experimental API, `oi_refmodel_*`); `None`
/// keeps the library's default.
#[derive(Debug, Clone, Default)]
pub struct RefModelOptions {
    pub seed: Option<u64>,
    pub num_layers: Option<u32>,
    pub hidden: Option<u32>,
    pub num_q_heads: Option<u32>,
    pub num_kv_heads: Option<u32>,
    pub head_dim: Option<u32>,
    pub intermediate: Option<u32>,
    pub vocab_size: Option<u32>,
    pub max_positions: Option<u32>,
    /// -1 (default): the cpu model; >= 0: the CUDA model on that device.
    pub device: Option<i32>,
}

/// The library's reference model (experimental API: it may change in any
/// release): a small deterministic transformer that an [`Executor`] runs.
/// An executor borrows it mutably: the model keeps one binding per rank, so
/// two live executors must not share one.
pub struct RefModel {
    ops: Box<sys::oi_model_ops>,
    ctx: NonNull<c_void>,
}

// The weights are read-only after create; bind/unbind lock; forward calls of
// different ranks use per-rank scratch.
unsafe impl Send for RefModel {}

impl RefModel {
    pub fn new(opts: &RefModelOptions) -> Result<RefModel> {
        let mut o: sys::oi_refmodel_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_refmodel_options_init(&mut o) })?;
        macro_rules! set {
            ($($f:ident),*) => { $(if let Some(v) = opts.$f { o.$f = v; })* };
        }
        set!(seed, num_layers, hidden, num_q_heads, num_kv_heads, head_dim, intermediate, vocab_size, max_positions, device);
        let mut ops: Box<sys::oi_model_ops> = Box::new(unsafe { std::mem::zeroed() });
        ops.struct_size = std::mem::size_of::<sys::oi_model_ops>() as u32;
        let mut ctx = ptr::null_mut();
        check(unsafe { sys::oi_refmodel_create(&o, &mut *ops, &mut ctx) })?;
        let ctx = NonNull::new(ctx).ok_or_else(|| Error::new(sys::OI_ERR_INTERNAL, "refmodel_create returned NULL"))?;
        Ok(RefModel { ops, ctx })
    }
}

impl Drop for RefModel {
    fn drop(&mut self) {
        unsafe { sys::oi_refmodel_destroy(self.ctx.as_ptr()) }
    }
}

/// Where an [`Executor`] keeps its host tier.
#[derive(Clone)]
pub enum Offload<'h> {
    /// The GPU prefix cache only.
    None,
    /// Embedded: a host tier of this process, shared (it outlives the executor).
    Host(&'h OffloadHost),
    /// Embedded: a private host tier made from these options (None: 64 MiB, unpinned).
    PrivateHost(Option<HostOptions>),
    /// `openinfer serve` at this socket (None: its default path).
    Sidecar(Option<String>),
}

/// `oi_restore_overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreOverlap {
    Auto,
    Off,
    Host,
}

/// Options of an [`Executor`]; `None` keeps the library's default.
#[derive(Clone)]
pub struct ExecutorOptions<'h> {
    pub ranks: u32,
    /// `ranks` device ordinals (None: every rank on the cpu).
    pub devices: Option<Vec<i32>>,
    pub page_size: Option<u32>,
    pub gpu_blocks: Option<u32>,
    pub offload: Offload<'h>,
    pub namespace: Option<String>,
    pub max_batch_tokens: Option<u32>,
    pub max_batch_seqs: Option<u32>,
    pub prefix_cache: bool,
    pub restore_timeout_ms: Option<u32>,
    pub flush_timeout_ms: Option<u32>,
    pub restore_overlap: RestoreOverlap,
    /// The namespace's codec (`oi_executor_options.codec`, docs/codecs.md):
    /// None or "none", "lossless", or (bf16 KV) "int8" / "int8-hadamard" / "fp8";
    /// needs offload.
    pub codec: Option<String>,
    /// The lossless codec's slot (`codec_slot_bytes`); None: the default.
    pub codec_slot_bytes: Option<u64>,
}

impl<'h> ExecutorOptions<'h> {
    pub fn new() -> ExecutorOptions<'h> {
        ExecutorOptions {
            ranks: 1,
            devices: None,
            page_size: None,
            gpu_blocks: None,
            offload: Offload::None,
            namespace: None,
            max_batch_tokens: None,
            max_batch_seqs: None,
            prefix_cache: true,
            restore_timeout_ms: None,
            flush_timeout_ms: None,
            restore_overlap: RestoreOverlap::Auto,
            codec: None,
            codec_slot_bytes: None,
        }
    }
}

impl Default for ExecutorOptions<'_> {
    fn default() -> Self {
        ExecutorOptions::new()
    }
}

/// One generated token, as `on_token` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenEvent {
    pub request_id: u64,
    pub token: u32,
    /// Counts from 0.
    pub index: u32,
    /// The request's last token.
    pub finished: bool,
}

/// A request for [`Executor::submit_request`].
#[derive(Debug, Clone, Copy)]
pub struct Request<'p> {
    pub prompt: &'p [u32],
    pub max_new_tokens: u32,
    /// None: round robin.
    pub rank: Option<u32>,
    /// Mixed into the block hashes (LoRA, tenant).
    pub salt: &'p [u8],
}

impl<'p> Request<'p> {
    pub fn new(prompt: &'p [u32], max_new_tokens: u32) -> Request<'p> {
        Request { prompt, max_new_tokens, rank: None, salt: b"" }
    }
}

/// `oi_request_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    Waiting,
    Restoring,
    Running,
    Finished,
    Failed,
    Unknown(u32),
}

/// The state and output of a request (`oi_request_result`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestResult {
    pub state: RequestState,
    /// `OI_OK`, or why the request failed.
    pub status: i32,
    pub rank: u32,
    /// The tokens generated so far.
    pub tokens: Vec<u32>,
    pub prompt_len: u32,
    /// Prompt tokens found in the GPU prefix cache.
    pub cached_tokens: u32,
    /// Prompt tokens restored from the host tier.
    pub restored_tokens: u32,
    /// Prompt tokens prefilled.
    pub computed_tokens: u32,
    pub ttft_ns: u64,
    pub latency_ns: u64,
}

impl RequestResult {
    pub fn is_finished(&self) -> bool {
        self.state == RequestState::Finished
    }
    /// The failure, when the request failed.
    pub fn error(&self) -> Option<Error> {
        if self.status < 0 {
            Some(Error::new(self.status, format!("the request failed with {}", status_name(self.status))))
        } else {
            None
        }
    }
}

/// Executor counters, totals over every rank (`oi_executor_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecStats {
    pub ranks: u32,
    pub steps: u64,
    pub requests_submitted: u64,
    pub requests_finished: u64,
    pub requests_failed: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub cached_tokens: u64,
    pub restored_tokens: u64,
    pub restores_started: u64,
    pub restores_completed: u64,
    pub restores_failed: u64,
    pub saves_submitted: u64,
    pub save_blocks_pending: u64,
    pub blocks_total: u64,
    pub blocks_free: u64,
    pub blocks_cached: u64,
    pub blocks_active: u64,
    pub leases_held: u64,
    pub restores_overlapped: u64,
    /// Restores that first waited for the disk tier to bring blocks back.
    pub restores_waited: u64,
}

/// A rank's KV arena layout (`oi_kv_layout`).
#[derive(Debug, Clone, Copy)]
pub struct KvLayout {
    pub device: i32,
    pub base: *mut c_void,
    pub bytes: u64,
    pub num_layers: u32,
    pub page_size: u32,
    pub num_blocks: u64,
    pub layer_stride: u64,
    pub block_stride: u64,
    pub segment_stride: u64,
    pub token_stride: u64,
}

struct TokenSink<'a> {
    f: Box<dyn FnMut(TokenEvent) + Send + 'a>,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn on_token(ctx: *mut c_void, request_id: u64, token: u32, index: u32, finished: c_int) {
    let sink = &mut *(ctx as *mut TokenSink<'_>);
    if sink.panic.is_some() {
        return;
    }
    let ev = TokenEvent { request_id, token, index, finished: finished != 0 };
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| (sink.f)(ev))) {
        sink.panic = Some(p); // re-raised by the step that called it
    }
}

/// The KV runtime (`oi_executor`): rank workers, a GPU block pool with a
/// prefix cache, the offload engines and a scheduler, running a
/// [`RefModel`]. Borrows the model mutably and a shared host, so both
/// outlive it. Driven from one thread at a time: it is `Send`, not `Sync`,
/// and every call goes through `&mut self` or `&self` of one owner.
///
/// Two live executors cannot share one model (it keeps one binding per rank):
///
/// ```compile_fail,E0499
/// use openinfer::*;
/// let mut model = RefModel::new(&RefModelOptions::default()).unwrap();
/// let a = Executor::new(&mut model, &ExecutorOptions::new()).unwrap();
/// let b = Executor::new(&mut model, &ExecutorOptions::new()).unwrap(); // error: `model` borrowed twice
/// drop((a, b));
/// ```
///
/// One after the other is fine:
///
/// ```no_run
/// use openinfer::*;
/// let mut model = RefModel::new(&RefModelOptions::default()).unwrap();
/// let cold = Executor::new(&mut model, &ExecutorOptions::new()).unwrap().generate(&[1, 2, 3], 4).unwrap();
/// let mut x = Executor::new(&mut model, &ExecutorOptions::new()).unwrap();
/// assert_eq!(x.generate(&[1, 2, 3], 4).unwrap(), cold);
/// ```
pub struct Executor<'a> {
    raw: NonNull<sys::oi_executor>,
    sink: *mut TokenSink<'a>,
    _borrows: PhantomData<(&'a mut RefModel, &'a OffloadHost)>,
}

// The C API allows driving an executor from any one thread at a time; the
// token closure is Send.
unsafe impl Send for Executor<'_> {}

impl<'a> Executor<'a> {
    pub fn new(model: &'a mut RefModel, opts: &ExecutorOptions<'a>) -> Result<Executor<'a>> {
        Executor::create(model, opts, None)
    }

    /// An executor whose `on_token` runs for every generated token, inside
    /// [`step`](Self::step) on the calling thread. A panic in it is re-raised
    /// by that step.
    pub fn with_on_token(
        model: &'a mut RefModel,
        opts: &ExecutorOptions<'a>,
        on_token: impl FnMut(TokenEvent) + Send + 'a,
    ) -> Result<Executor<'a>> {
        Executor::create(model, opts, Some(Box::new(on_token)))
    }

    fn create(
        model: &'a mut RefModel,
        opts: &ExecutorOptions<'a>,
        on_token_fn: Option<Box<dyn FnMut(TokenEvent) + Send + 'a>>,
    ) -> Result<Executor<'a>> {
        let mut o: sys::oi_executor_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_executor_options_init(&mut o) })?;
        o.model = &*model.ops;
        o.model_ctx = model.ctx.as_ptr();
        o.ranks = opts.ranks;
        if let Some(d) = &opts.devices {
            if d.len() != opts.ranks as usize {
                return Err(invalid("devices must name one device per rank"));
            }
            o.devices = d.as_ptr();
        }
        macro_rules! set {
            ($($f:ident),*) => { $(if let Some(v) = opts.$f { o.$f = v; })* };
        }
        set!(page_size, gpu_blocks, max_batch_tokens, max_batch_seqs, restore_timeout_ms, flush_timeout_ms);
        o.prefix_cache = opts.prefix_cache as u32;
        o.restore_overlap = match opts.restore_overlap {
            RestoreOverlap::Auto => sys::OI_RESTORE_OVERLAP_AUTO,
            RestoreOverlap::Off => sys::OI_RESTORE_OVERLAP_OFF,
            RestoreOverlap::Host => sys::OI_RESTORE_OVERLAP_HOST,
        } as u32;
        let host_opts;
        let sock;
        match &opts.offload {
            Offload::None => o.offload = sys::OI_OFFLOAD_NONE as u32,
            Offload::Host(h) => {
                o.offload = sys::OI_OFFLOAD_EMBEDDED as u32;
                o.host = h.as_ptr();
            }
            Offload::PrivateHost(ho) => {
                o.offload = sys::OI_OFFLOAD_EMBEDDED as u32;
                if let Some(ho) = ho {
                    host_opts = ho.raw()?;
                    o.host_options = &host_opts;
                }
            }
            Offload::Sidecar(s) => {
                o.offload = sys::OI_OFFLOAD_SIDECAR as u32;
                if let Some(s) = s {
                    sock = cstring(s)?;
                    o.socket_path = sock.as_ptr();
                }
            }
        }
        let ns = match &opts.namespace {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        o.namespace_id = ns.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let codec = match &opts.codec {
            Some(c) => Some(cstring(c)?),
            None => None,
        };
        o.codec = codec.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        if let Some(b) = opts.codec_slot_bytes {
            o.codec_slot_bytes = b;
        }
        let sink = match on_token_fn {
            Some(f) => Box::into_raw(Box::new(TokenSink { f, panic: None })),
            None => ptr::null_mut(),
        };
        if !sink.is_null() {
            o.on_token = Some(on_token);
            o.on_token_ctx = sink as *mut c_void;
        }
        let mut out = ptr::null_mut();
        let st = unsafe { sys::oi_executor_create(&o, &mut out) };
        if st < 0 {
            let err = Error::from_last(st);
            if !sink.is_null() {
                drop(unsafe { Box::from_raw(sink) });
            }
            return Err(err);
        }
        Ok(Executor {
            raw: NonNull::new(out).unwrap(),
            sink,
            _borrows: PhantomData,
        })
    }

    pub fn as_ptr(&self) -> *mut sys::oi_executor {
        self.raw.as_ptr()
    }

    /// Re-raises a panic of `on_token`, then the call's status.
    fn after_call(&mut self, st: i32) -> Result<i32> {
        if !self.sink.is_null() {
            if let Some(p) = unsafe { (*self.sink).panic.take() } {
                resume_unwind(p);
            }
        }
        check(st)
    }

    /// Queues `prompt` for `max_new_tokens` tokens; returns its id.
    pub fn submit(&mut self, prompt: &[u32], max_new_tokens: u32) -> Result<u64> {
        self.submit_request(&Request::new(prompt, max_new_tokens))
    }

    pub fn submit_request(&mut self, r: &Request<'_>) -> Result<u64> {
        if r.prompt.len() > u32::MAX as usize || r.salt.len() > u32::MAX as usize {
            return Err(invalid("prompt or salt too long"));
        }
        let mut c: sys::oi_request = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_request_init(&mut c) })?;
        c.prompt = r.prompt.as_ptr();
        c.prompt_len = r.prompt.len() as u32;
        c.max_new_tokens = r.max_new_tokens;
        c.rank = match r.rank {
            Some(k) => i32::try_from(k).map_err(|_| invalid("rank out of range"))?,
            None => -1,
        };
        if !r.salt.is_empty() {
            c.salt = r.salt.as_ptr() as *const c_void;
            c.salt_len = r.salt.len() as u32;
        }
        let mut id = 0u64;
        check(unsafe { sys::oi_executor_submit(self.raw.as_ptr(), &c, &mut id) })?;
        Ok(id)
    }

    /// One scheduler step over every rank; returns how many requests finished.
    pub fn step(&mut self) -> Result<u32> {
        let mut n = 0u32;
        let st = unsafe { sys::oi_executor_step(self.raw.as_ptr(), &mut n) };
        self.after_call(st)?;
        Ok(n)
    }

    /// Steps until no request is waiting, restoring or running.
    pub fn run_until_idle(&mut self) -> Result<()> {
        let st = unsafe { sys::oi_executor_run_until_idle(self.raw.as_ptr()) };
        self.after_call(st).map(|_| ())
    }

    pub fn result(&mut self, request_id: u64) -> Result<RequestResult> {
        let mut r: sys::oi_request_result = unsafe { std::mem::zeroed() };
        r.struct_size = std::mem::size_of::<sys::oi_request_result>() as u32;
        check(unsafe { sys::oi_executor_get_result(self.raw.as_ptr(), request_id, &mut r) })?;
        let tokens = if r.tokens.is_null() || r.n_tokens == 0 {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(r.tokens, r.n_tokens as usize) }.to_vec()
        };
        Ok(RequestResult {
            state: match r.state {
                sys::OI_REQUEST_WAITING => RequestState::Waiting,
                sys::OI_REQUEST_RESTORING => RequestState::Restoring,
                sys::OI_REQUEST_RUNNING => RequestState::Running,
                sys::OI_REQUEST_FINISHED => RequestState::Finished,
                sys::OI_REQUEST_FAILED => RequestState::Failed,
                other => RequestState::Unknown(other),
            },
            status: r.status,
            rank: r.rank,
            tokens,
            prompt_len: r.prompt_len,
            cached_tokens: r.cached_tokens,
            restored_tokens: r.restored_tokens,
            computed_tokens: r.computed_tokens,
            ttft_ns: r.ttft_ns,
            latency_ns: r.latency_ns,
        })
    }

    /// submit + run_until_idle + the generated tokens (or the request's error).
    pub fn generate(&mut self, prompt: &[u32], max_new_tokens: u32) -> Result<Vec<u32>> {
        let id = self.submit(prompt, max_new_tokens)?;
        self.run_until_idle()?;
        let r = self.result(id)?;
        match r.error() {
            Some(e) => Err(e),
            None => Ok(r.tokens),
        }
    }

    /// Waits until every save submitted so far landed in the host tier.
    pub fn flush(&mut self, timeout: Option<Duration>) -> Result<()> {
        check(unsafe { sys::oi_executor_flush(self.raw.as_ptr(), timeout_ms(timeout)) }).map(|_| ())
    }

    /// Drops every inactive block from the GPU prefix cache; returns how many.
    pub fn evict_gpu_cache(&mut self) -> Result<u64> {
        let mut n = 0u64;
        check(unsafe { sys::oi_executor_evict_gpu_cache(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    pub fn stats(&self) -> Result<ExecStats> {
        let mut s: sys::oi_executor_stats = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::oi_executor_stats>() as u32;
        check(unsafe { sys::oi_executor_get_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(ExecStats {
            ranks: s.ranks,
            steps: s.steps,
            requests_submitted: s.requests_submitted,
            requests_finished: s.requests_finished,
            requests_failed: s.requests_failed,
            prefill_tokens: s.prefill_tokens,
            decode_tokens: s.decode_tokens,
            cached_tokens: s.cached_tokens,
            restored_tokens: s.restored_tokens,
            restores_started: s.restores_started,
            restores_completed: s.restores_completed,
            restores_failed: s.restores_failed,
            saves_submitted: s.saves_submitted,
            save_blocks_pending: s.save_blocks_pending,
            blocks_total: s.blocks_total,
            blocks_free: s.blocks_free,
            blocks_cached: s.blocks_cached,
            blocks_active: s.blocks_active,
            leases_held: s.leases_held,
            restores_overlapped: s.restores_overlapped,
            restores_waited: s.restores_waited,
        })
    }

    pub fn kv_layout(&self, rank: u32) -> Result<KvLayout> {
        let mut k: sys::oi_kv_layout = unsafe { std::mem::zeroed() };
        k.struct_size = std::mem::size_of::<sys::oi_kv_layout>() as u32;
        check(unsafe { sys::oi_executor_get_kv_layout(self.raw.as_ptr(), rank, &mut k) })?;
        Ok(KvLayout {
            device: k.device,
            base: k.base,
            bytes: k.bytes,
            num_layers: k.num_layers,
            page_size: k.page_size,
            num_blocks: k.num_blocks,
            layer_stride: k.layer_stride,
            block_stride: k.block_stride,
            segment_stride: k.segment_stride,
            token_stride: k.token_stride,
        })
    }

    /// The block table of a request, in position order.
    pub fn request_blocks(&self, request_id: u64) -> Result<Vec<i64>> {
        let mut n: sys::size_t = 0;
        check(unsafe { sys::oi_executor_request_blocks(self.raw.as_ptr(), request_id, ptr::null_mut(), 0, &mut n) })?;
        let mut out = vec![0i64; n as usize];
        check(unsafe {
            sys::oi_executor_request_blocks(self.raw.as_ptr(), request_id, out.as_mut_ptr(), n, &mut n)
        })?;
        out.truncate(n as usize);
        Ok(out)
    }
}

impl Drop for Executor<'_> {
    /// `oi_executor_destroy`: workers, loads, the arena mapping, saves
    /// (flush_timeout_ms), the engines, the arenas; then the token closure.
    fn drop(&mut self) {
        unsafe {
            sys::oi_executor_destroy(self.raw.as_ptr());
            if !self.sink.is_null() {
                drop(Box::from_raw(self.sink));
            }
        }
    }
}
