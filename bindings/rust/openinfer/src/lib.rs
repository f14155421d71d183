//! Safe Rust binding of libopeninfer, a host-memory tier for the paged KV
//! cache of LLM inference engines.
//!
//! Ownership encodes the library's drop order:
//!
//! * an [`OffloadEngine`] borrows its [`OffloadHost`], so the host cannot be
//!   dropped (or moved) while an engine lives;
//! * a sidecar engine ([`OffloadEngine::connect`]) owns the arena it imported
//!   and its `Drop` closes that mapping *before* it flushes and unregisters;
//! * a [`Ticket`] borrows its engine and its `Drop` waits for the operation,
//!   so the KV buffer can only be touched (`buffer_mut`, which takes
//!   `&mut self`) when no copy is in flight.
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

use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_void};
use std::os::unix::io::RawFd;
use std::ptr::{self, NonNull};
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
}

impl HostOptions {
    pub fn new(pool_bytes: u64) -> HostOptions {
        HostOptions { pool_bytes, device: DEVICE_CPU, hugepages: false, pin: None, lease_ttl_ms: None, numa_node: None }
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
}

/// The host tier: a pool of host memory shared by this process's engines.
/// Thread-safe (`Send + Sync`). Engines borrow it, so it outlives them.
pub struct OffloadHost {
    raw: NonNull<sys::oi_offload_host>,
}

// The C API documents every host function as callable from any thread.
unsafe impl Send for OffloadHost {}
unsafe impl Sync for OffloadHost {}

impl OffloadHost {
    pub fn new(opts: &HostOptions) -> Result<OffloadHost> {
        let o = opts.raw()?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::oi_offload_host_create(&o, &mut out) })?;
        Ok(OffloadHost { raw: NonNull::new(out).ok_or_else(|| invalid("host_create returned NULL"))? })
    }

    pub fn as_ptr(&self) -> *mut sys::oi_offload_host {
        self.raw.as_ptr()
    }

    pub fn stats(&self) -> Result<HostStats> {
        let mut s: sys::oi_host_stats = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::oi_host_stats>() as u32;
        check(unsafe { sys::oi_offload_host_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(HostStats {
            capacity_bytes: s.capacity_bytes,
            blocks_sealed: s.blocks_sealed,
            blocks_leased: s.blocks_leased,
            saves_completed: s.saves_completed,
            saves_deduplicated: s.saves_deduplicated,
            loads_completed: s.loads_completed,
            leases_active: s.leases_active,
            leases_expired: s.leases_expired,
            leases_released: s.leases_released,
            evictions: s.evictions,
        })
    }

    /// Evicts every block nothing holds; returns how many.
    pub fn evict_all(&self) -> Result<u64> {
        let mut n = 0u64;
        check(unsafe { sys::oi_offload_host_evict_all(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
}

impl Drop for OffloadHost {
    fn drop(&mut self) {
        unsafe { sys::oi_offload_host_destroy(self.raw.as_ptr()) }
    }
}

// ---------------------------------------------------------------------------- engine

/// One arena of a layout, by offset into the engine's buffer (or the
/// sidecar's arena). Block b, segment s lives at
/// `offset + b*block_stride + s*segment_stride`.
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
    /// The end of the arena from the buffer's start.
    pub fn end(&self) -> u64 {
        if self.num_blocks == 0 {
            return self.offset;
        }
        self.offset
            + (self.num_blocks - 1) * self.block_stride
            + (self.segments as u64 - 1) * self.segment_stride
            + self.bytes_per_block
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
        }
    }

    /// The bytes the arenas span from offset 0.
    pub fn span(&self) -> u64 {
        self.arenas.iter().map(|a| a.end()).max().unwrap_or(0)
    }
}

/// The C options and the strings and descriptors they point to.
struct RawEngineOptions {
    o: sys::oi_engine_options,
    _ns: CString,
    _inst: Option<CString>,
    _names: Vec<CString>,
    _descs: Vec<sys::oi_arena_desc>,
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
        Ok(RawEngineOptions { o, _ns: ns, _inst: inst, _names: names, _descs: descs })
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
}

/// Engine counters (a subset of `oi_engine_stats`).
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineStats {
    pub instance_id: u32,
    pub block_bytes: u64,
    pub saves_completed: u64,
    pub saves_deduplicated: u64,
    pub blocks_loaded: u64,
    pub bytes_saved: u64,
    pub bytes_loaded: u64,
    pub loads_failed: u64,
}

enum Memory {
    /// cpu: a buffer the engine owns.
    Owned(Vec<u8>),
    /// sidecar: the arena the server allocated, mapped here; closed first.
    Imported(NonNull<sys::oi_imported_arena>),
    /// a caller-managed address (cuda device memory).
    Raw(*mut c_void, u64),
}

/// One rank's offload engine. Thread-safe (`Send + Sync`); borrows its host
/// (`'h`), which therefore outlives it. Sidecar engines are
/// `OffloadEngine<'static>` and own their imported arena.
pub struct OffloadEngine<'h> {
    raw: NonNull<sys::oi_offload_engine>,
    mem: Memory,
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
        if opts.span() > buffer.len() as u64 {
            return Err(invalid("the arenas extend past the buffer"));
        }
        let raw = opts.raw(buffer.as_mut_ptr() as *mut c_void, buffer.len() as u64)?;
        let mut out = ptr::null_mut();
        check(unsafe { sys::oi_offload_engine_create(host.as_ptr(), &raw.o, &mut out) })?;
        Ok(OffloadEngine { raw: NonNull::new(out).unwrap(), mem: Memory::Owned(buffer), _host: PhantomData })
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
        check(sys::oi_offload_engine_create(host.as_ptr(), &raw.o, &mut out))?;
        Ok(OffloadEngine { raw: NonNull::new(out).unwrap(), mem: Memory::Raw(base, size), _host: PhantomData })
    }

    pub fn as_ptr(&self) -> *mut sys::oi_offload_engine {
        self.raw.as_ptr()
    }

    /// The start of the KV memory (host address on cpu, device pointer on cuda).
    pub fn memory_ptr(&self) -> *mut c_void {
        match &self.mem {
            Memory::Owned(v) => v.as_ptr() as *mut c_void,
            Memory::Imported(a) => unsafe { sys::oi_imported_arena_ptr(a.as_ptr()) },
            Memory::Raw(p, _) => *p,
        }
    }

    pub fn memory_len(&self) -> u64 {
        match &self.mem {
            Memory::Owned(v) => v.len() as u64,
            Memory::Imported(a) => unsafe { sys::oi_imported_arena_size(a.as_ptr()) },
            Memory::Raw(_, n) => *n,
        }
    }

    /// The KV bytes (cpu memory). Takes `&mut self` for the same reason as
    /// [`buffer_mut`](Self::buffer_mut): no copy may be writing them.
    pub fn buffer(&mut self) -> Result<&[u8]> {
        self.buffer_mut().map(|b| &*b)
    }

    /// The KV bytes for writing (cpu memory: an owned buffer or a cpu
    /// sidecar arena). Taking `&mut self` proves no [`Ticket`] (which borrows
    /// the engine and waits in its `Drop`) is live, so no copy touches it.
    pub fn buffer_mut(&mut self) -> Result<&mut [u8]> {
        match &mut self.mem {
            Memory::Owned(v) => Ok(&mut v[..]),
            Memory::Imported(a) => unsafe {
                let p = sys::oi_imported_arena_ptr(a.as_ptr()) as *mut u8;
                let n = sys::oi_imported_arena_size(a.as_ptr()) as usize;
                Ok(std::slice::from_raw_parts_mut(p, n))
            },
            Memory::Raw(..) => Err(Error::new(sys::OI_ERR_UNSUPPORTED, "caller-managed memory: use memory_ptr()")),
        }
    }

    /// Saves `block_ids[i]` under `hashes[i]`. The ticket borrows the engine.
    pub fn save(&self, block_ids: &[i64], hashes: &[BlockHash]) -> Result<Ticket<'_>> {
        if block_ids.len() != hashes.len() {
            return Err(invalid("block_ids and hashes differ in length"));
        }
        let mut t = ptr::null_mut();
        check(unsafe {
            sys::oi_offload_engine_save(
                self.raw.as_ptr(),
                block_ids.as_ptr(),
                hashes.as_ptr() as *const sys::oi_block_hash,
                block_ids.len() as sys::size_t,
                ptr::null(),
                &mut t,
            )
        })?;
        Ticket::from_raw(t)
    }

    /// Counts the leading run of `hashes` in the host tier and leases it.
    pub fn query(&self, req_id: Option<&str>, hashes: &[BlockHash]) -> Result<QueryResult> {
        let rid = match req_id {
            Some(s) => Some(cstring(s)?),
            None => None,
        };
        let mut r: sys::oi_query_result = unsafe { std::mem::zeroed() };
        r.struct_size = std::mem::size_of::<sys::oi_query_result>() as u32;
        check(unsafe {
            sys::oi_offload_engine_query(
                self.raw.as_ptr(),
                rid.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
                hashes.as_ptr() as *const sys::oi_block_hash,
                hashes.len() as sys::size_t,
                0,
                &mut r,
            )
        })?;
        let lease = if r.lease.bytes.iter().any(|&b| b != 0) { Some(Lease(r.lease.bytes)) } else { None };
        Ok(QueryResult { hit_blocks: r.hit_blocks, lease, loading: r.state == sys::OI_QUERY_LOADING })
    }

    /// Which of `hashes` are present, each on its own (no prefix rule, no lease).
    pub fn query_membership(&self, hashes: &[BlockHash]) -> Result<Vec<bool>> {
        let mut present = vec![0u8; hashes.len().max(1)];
        let mut r: sys::oi_query_result = unsafe { std::mem::zeroed() };
        r.struct_size = std::mem::size_of::<sys::oi_query_result>() as u32;
        r.present = present.as_mut_ptr();
        check(unsafe {
            sys::oi_offload_engine_query(
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
        self.load_with(lease, dst_block_ids, 0)
    }

    /// [`OffloadEngine::load`] arena by arena, with a CUDA event after each arena's
    /// copies ([`Ticket::arena_event`]; `OI_LOAD_ARENA_EVENTS`).
    pub fn load_layered(&self, lease: Lease, dst_block_ids: &[i64]) -> Result<Ticket<'_>> {
        self.load_with(lease, dst_block_ids, sys::OI_LOAD_ARENA_EVENTS as u32)
    }

    fn load_with(&self, lease: Lease, dst_block_ids: &[i64], flags: u32) -> Result<Ticket<'_>> {
        let mut t = ptr::null_mut();
        let mut opt: sys::oi_load_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::oi_load_options_init(&mut opt) })?;
        opt.flags = flags;
        check(unsafe {
            sys::oi_offload_engine_load(
                self.raw.as_ptr(),
                sys::oi_lease { bytes: lease.0 },
                dst_block_ids.as_ptr(),
                dst_block_ids.len() as sys::size_t,
                &opt,
                &mut t,
            )
        })?;
        Ticket::from_raw(t)
    }

    /// Drops a lease (`LeaseExpired` when it is unknown, consumed or expired).
    pub fn release(&self, lease: Lease) -> Result<()> {
        check(unsafe { sys::oi_offload_engine_release(self.raw.as_ptr(), sys::oi_lease { bytes: lease.0 }) })?;
        Ok(())
    }

    /// Waits until every save submitted before the call is sealed or dropped.
    pub fn flush(&self, timeout: Option<Duration>) -> Result<()> {
        check(unsafe { sys::oi_offload_engine_flush(self.raw.as_ptr(), timeout_ms(timeout)) })?;
        Ok(())
    }

    pub fn stats(&self) -> Result<EngineStats> {
        let mut s: sys::oi_engine_stats = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::oi_engine_stats>() as u32;
        check(unsafe { sys::oi_offload_engine_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(EngineStats {
            instance_id: s.instance_id,
            block_bytes: s.block_bytes,
            saves_completed: s.saves_completed,
            saves_deduplicated: s.saves_deduplicated,
            blocks_loaded: s.blocks_loaded,
            bytes_saved: s.bytes_saved,
            bytes_loaded: s.bytes_loaded,
            loads_failed: s.loads_failed,
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
            sys::oi_offload_engine_connect(
                sock.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
                &raw.o,
                &mut out,
                &mut arena,
            )
        })?;
        Ok(OffloadEngine {
            raw: NonNull::new(out).unwrap(),
            mem: Memory::Imported(NonNull::new(arena).unwrap()),
            _host: PhantomData,
        })
    }
}

impl Drop for OffloadEngine<'_> {
    /// Drop order: close the imported mapping (sidecar), then flush and
    /// unregister; an owned buffer is freed after the engine is gone.
    fn drop(&mut self) {
        unsafe {
            if let Memory::Imported(a) = self.mem {
                sys::oi_imported_arena_close(a.as_ptr());
            }
            sys::oi_offload_engine_destroy(self.raw.as_ptr());
        }
    }
}

// ---------------------------------------------------------------------------- tickets

/// The completion of a save or load. Borrows its engine; dropping it waits
/// for the operation (so the engine's memory is never released or handed out
/// for writing while a copy may touch it), then drops the reference.
pub struct Ticket<'e> {
    raw: NonNull<sys::oi_ticket>,
    _engine: PhantomData<&'e ()>,
}

// Tickets are thread-safe in the C API.
unsafe impl Send for Ticket<'_> {}
unsafe impl Sync for Ticket<'_> {}

impl<'e> Ticket<'e> {
    fn from_raw(t: *mut sys::oi_ticket) -> Result<Ticket<'e>> {
        NonNull::new(t)
            .map(|raw| Ticket { raw, _engine: PhantomData })
            .ok_or_else(|| Error::new(sys::OI_ERR_INTERNAL, "no ticket returned"))
    }

    /// `Ok(false)` while pending, `Ok(true)` on success, or the operation's error.
    pub fn poll(&self) -> Result<bool> {
        let st = unsafe { sys::oi_ticket_poll(self.raw.as_ptr()) };
        if st == sys::OI_PENDING {
            return Ok(false);
        }
        check(st).map(|_| true)
    }

    /// Waits up to `timeout` (None: forever). A `Timeout` error leaves the
    /// ticket pending and usable.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        check(unsafe { sys::oi_ticket_wait(self.raw.as_ptr(), timeout_ms(timeout)) }).map(|_| ())
    }

    /// An eventfd that turns readable on completion (owned by the ticket).
    pub fn fd(&self) -> RawFd {
        unsafe { sys::oi_ticket_fd(self.raw.as_ptr()) }
    }

    /// The cudaEvent_t recorded after the copies (null on cpu).
    pub fn cuda_event(&self) -> *mut c_void {
        unsafe { sys::oi_ticket_cuda_event(self.raw.as_ptr()) }
    }

    /// A load made with [`OffloadEngine::load_layered`]: the `cudaEvent_t` recorded
    /// after arena `arena`'s copies; null when there is none (cpu backend,
    /// remote engine, not layered, out of range). Owned by the ticket.
    pub fn arena_event(&self, arena: u32) -> *mut c_void {
        unsafe { sys::oi_ticket_arena_event(self.raw.as_ptr(), arena) }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        unsafe {
            sys::oi_ticket_wait(self.raw.as_ptr(), u32::MAX);
            sys::oi_ticket_release(self.raw.as_ptr());
        }
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
