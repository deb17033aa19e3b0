//! GKPK v1 archives and directory sources through one hardened extraction path, the durable
//! package store (journal, atomic writes, fsync, recovery), and the GGUF model reader.

#![forbid(unsafe_code)]

pub mod archive;
pub mod durable_file;
pub mod gguf;
pub mod store;

pub use gguf::GgufSource;
