//! Records the directory openinfer-sys linked libopeninfer.so from
//! (LIBOPENINFER_DIR or pkg-config, passed on as DEP_OPENINFER_LIBDIR) as the
//! RUNPATH of this crate's tests and examples, so they load that library.
//! A program depending on this crate does the same in its own build script
//! (docs/bindings.md): cargo passes link arguments to no other crate.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_OPENINFER_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_OPENINFER_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
