//! Raw bindings of libopeninfer's C ABI (`include/openinfer/*.h`), generated
//! by the `bindgen` command-line tool (`regen.sh`) and checked in;
//! `tests/regenerate.rs` regenerates them and fails on any difference.
//! Everything here is `unsafe`; use the `openinfer` crate.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code)]
#![allow(clippy::all)]

include!("bindings.rs");
