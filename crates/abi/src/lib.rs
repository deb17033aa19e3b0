//! `#[repr(C)]` mirror of the Guild Kernel ABI v1 / SDK 1.5 headers in `abi-headers/`.
//!
//! Nothing but layouts, constants and function-pointer types lives here; names are the C names so
//! that the mirror can be read side by side with the headers. A test compiles a C program against
//! the headers and compares every struct's size, alignment and field offsets, and every constant,
//! with this crate, so any drift between the two fails the tests.
//!
//! Function pointers are `Option<unsafe extern "C" fn(..)>` so that a NULL from C is representable;
//! whoever calls one must check it and uphold the contract written in the header.
//!
//! Beside the mirror, two small modules hold what both sides of the host's C boundary share, so
//! that the loader adapter, the port's provider interface and the app use one copy without
//! depending on each other: [`text`] (bounded strings, error records, status and tag names) and
//! [`call`] (the checked forms of a GOP1 query and execute call, passed on unchanged).

#![no_std]
#![allow(non_camel_case_types, non_snake_case)]

extern crate alloc;

pub mod call;
mod cpu_backend;
mod cpu_expert;
mod cuda_attn;
mod cuda_dense;
mod cuda_moe;
mod host;
mod kernel;
mod module;
mod runner;
pub mod text;

pub use cpu_backend::*;
pub use cpu_expert::*;
pub use cuda_attn::*;
pub use cuda_dense::*;
pub use cuda_moe::*;
pub use host::*;
pub use kernel::*;
pub use module::*;
pub use runner::*;
