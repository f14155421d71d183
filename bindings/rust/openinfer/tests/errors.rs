mod common;
use common::*;
use openinfer::*;

#[test]
fn every_status_maps_to_its_code() {
    let all = [
        (-1, ErrorCode::InvalidArgument),
        (-2, ErrorCode::NotFound),
        (-3, ErrorCode::OutOfMemory),
        (-4, ErrorCode::Timeout),
        (-5, ErrorCode::Cuda),
        (-6, ErrorCode::Io),
        (-7, ErrorCode::Protocol),
        (-8, ErrorCode::State),
        (-9, ErrorCode::LeaseExpired),
        (-10, ErrorCode::Closed),
        (-11, ErrorCode::Unsupported),
        (-12, ErrorCode::Permission),
        (-13, ErrorCode::Version),
        (-14, ErrorCode::Internal),
        (-15, ErrorCode::NoDevice),
        (-16, ErrorCode::Busy),
        (-17, ErrorCode::Deadline),
    ];
    for (st, code) in all {
        let e = Error::new(st, "why");
        assert_eq!(e.code(), code);
        assert_eq!(e.status(), st);
        assert_ne!(e.status_name(), "OI_ERR_UNKNOWN");
        assert_eq!(e.to_string(), format!("{}: why", e.status_name()));
    }
    assert_eq!(Error::new(-999, "").code(), ErrorCode::Unknown(-999));
    assert_eq!(status_name(-999), "OI_ERR_UNKNOWN");
}

#[test]
fn real_errors_carry_status_and_message() {
    assert_eq!(hash_blocks(&[1, 2, 3], 0, b"", None).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(OffloadHost::new(&HostOptions::new(0)).err().unwrap().code(), ErrorCode::InvalidArgument);
    let host = OffloadHost::new(&HostOptions::new(16 << 20)).unwrap();
    let e = OffloadEngine::new(&host, &layout("rs/err"), vec![0u8; span()]).unwrap();
    let err = e.save(&[1_000_000], &[BlockHash([1; 16])]).err().unwrap();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("out of range"), "{}", err);
    // a buffer smaller than the layout is refused before the library sees it
    assert_eq!(OffloadEngine::new(&host, &layout("rs/err"), vec![0u8; 10]).err().unwrap().code(), ErrorCode::InvalidArgument);
    // an under-sized or missing shared-memory arena
    let name = format!("/oi-rs-test-{}", std::process::id());
    std::fs::write(format!("/dev/shm{}", name), vec![0u8; 4096]).unwrap();
    let handle = |size: u64, name: &str| {
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(b"OISHM\x01\0\0"); // as lib/device/cpu.c lays it out
        h[8..16].copy_from_slice(&size.to_le_bytes());
        h[16..16 + name.len()].copy_from_slice(name.as_bytes());
        h
    };
    let a = ImportedArena::open(&handle(4096, &name), 4096, DEVICE_CPU).unwrap();
    assert_eq!(a.len(), 4096);
    drop(a);
    assert_eq!(ImportedArena::open(&handle(4096, &name), 1 << 20, DEVICE_CPU).err().unwrap().code(), ErrorCode::Protocol);
    std::fs::remove_file(format!("/dev/shm{}", name)).unwrap();
    assert_eq!(ImportedArena::open(&handle(4096, &name), 4096, DEVICE_CPU).err().unwrap().code(), ErrorCode::NotFound);
    // a live socket
    let dir = std::env::temp_dir().join(format!("oi-rs-busy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock").to_str().unwrap().to_string();
    let s = Server::start(&ServerOptions::new(&sock, 16 << 20)).unwrap();
    assert_eq!(Server::start(&ServerOptions::new(&sock, 16 << 20)).err().unwrap().code(), ErrorCode::Busy);
    s.stop().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
