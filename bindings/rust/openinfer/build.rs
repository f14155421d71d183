//! Records LIBOPENINFER_DIR as the RUNPATH of this crate's tests and
//! examples, so they load the build tree's libopeninfer.so.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBOPENINFER_DIR");
    if let Ok(dir) = std::env::var("LIBOPENINFER_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
