//! `#[repr(C)]` mirror of the Guild Kernel ABI v1 / SDK 1.5 headers in `abi-headers/`.
//!
//! Nothing but layouts, constants and function-pointer types lives here. A test compiles a C
//! program against the headers and compares every struct's size, alignment and field offsets with
//! this crate, so any drift between the two fails the build's tests.

#![no_std]
