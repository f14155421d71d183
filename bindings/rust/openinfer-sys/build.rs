//! Links libopeninfer.so: from LIBOPENINFER_DIR (a build tree's lib/, also
//! recorded as the RUNPATH of tests and examples), else from pkg-config, else
//! the linker's default paths.
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBOPENINFER_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(dir) = env::var("LIBOPENINFER_DIR") {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
        println!("cargo:libdir={}", dir);
    } else if let Ok(out) = Command::new("pkg-config").args(["--libs-only-L", "openinfer"]).output() {
        if out.status.success() {
            for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    println!("cargo:rustc-link-search=native={}", dir);
                    println!("cargo:libdir={}", dir);
                }
            }
        }
    }
    println!("cargo:rustc-link-lib=dylib=openinfer");
}
