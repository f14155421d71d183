//! Regenerates the bindings with the bindgen CLI from the headers in
//! OPENINFER_INCLUDE_DIR (default: the repository's include/) and fails on
//! any difference from the checked-in src/bindings.rs. Skipped (with a note)
//! when bindgen is missing or is another version than the one that generated
//! the file (its output differs between versions).
use std::path::PathBuf;
use std::process::Command;

#[test]
fn checked_in_bindings_match_the_headers() {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let checked_in = std::fs::read_to_string(here.join("src/bindings.rs")).unwrap();
    let version = match Command::new("bindgen").arg("--version").output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => {
            eprintln!("SKIP: bindgen is not installed");
            return;
        }
    };
    let first = checked_in.lines().next().unwrap_or("");
    if !first.contains(&format!("with {} ", version)) {
        eprintln!("SKIP: {} is not the bindgen that generated the file ({})", version, first);
        return;
    }
    let include = std::env::var("OPENINFER_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| here.join("../../../include"));
    let out = std::env::temp_dir().join(format!("openinfer-bindings-{}.rs", std::process::id()));
    let st = Command::new(here.join("regen.sh")).arg(&include).arg(&out).status().unwrap();
    assert!(st.success(), "regen.sh failed");
    let fresh = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(
        fresh == checked_in,
        "src/bindings.rs is stale: run bindings/rust/openinfer-sys/regen.sh and commit the result"
    );
}

#[test]
fn links_and_calls() {
    unsafe {
        assert_eq!(openinfer_sys::oi_version() >> 16, openinfer_sys::OI_VERSION_MAJOR);
        let name = std::ffi::CStr::from_ptr(openinfer_sys::oi_status_str(openinfer_sys::OI_ERR_TIMEOUT));
        assert_eq!(name.to_str().unwrap(), "OI_ERR_TIMEOUT");
    }
}
