//! Links libopeninfer.so (and libopeninfer-refmodel.so beside it: the
//! reference model): from LIBOPENINFER_DIR (a build tree's lib/ or an
//! install prefix's lib/), else from pkg-config openinfer (PKG_CONFIG_PATH
//! naming a custom prefix's lib/pkgconfig), else the linker's default paths.
//!
//! The directory found is published as `DEP_OPENINFER_LIBDIR` to the build
//! scripts of crates that depend on this one (`links = "openinfer"`), and
//! recorded as the RUNPATH of this crate's own tests. Cargo does not pass
//! link arguments on to dependent crates: a program that should find the
//! library without LD_LIBRARY_PATH records it in its own build script
//! (docs/bindings.md shows the three lines).
use std::env;
use std::process::Command;

fn main() {
    for var in ["LIBOPENINFER_DIR", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR"] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");
    let mut dirs = Vec::new();
    if let Ok(dir) = env::var("LIBOPENINFER_DIR") {
        dirs.push(dir);
    } else {
        match Command::new("pkg-config").args(["--libs-only-L", "openinfer"]).output() {
            Ok(out) if out.status.success() => {
                for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Some(dir) = flag.strip_prefix("-L") {
                        dirs.push(dir.to_string());
                    }
                }
            }
            _ => println!(
                "cargo:warning=libopeninfer not found: set LIBOPENINFER_DIR to its lib directory, \
                 or PKG_CONFIG_PATH to that directory's pkgconfig/"
            ),
        }
    }
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
    if let Some(dir) = dirs.first() {
        println!("cargo:libdir={}", dir);
    }
    println!("cargo:rustc-link-lib=dylib=openinfer");
    // The reference model (oi_refmodel_*): its own library beside it.
    println!("cargo:rustc-link-lib=dylib=openinfer-refmodel");
}
