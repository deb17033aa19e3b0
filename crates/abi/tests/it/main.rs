//! Integration tests of `guild-abi`: the Rust mirror against the C headers.

mod headers;
mod layout;
mod layout_core;
mod layout_ext;
