//! GKPK v1 archives and directory sources through one hardened extraction path, and the durable
//! package store (journal, atomic writes, fsync, recovery).

#![forbid(unsafe_code)]

pub mod archive;
pub mod store;
