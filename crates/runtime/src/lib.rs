//! `guild-runtime`: the part of the Guild kernel host that runs plugin code.
//!
//! It holds what a loaded package's providers become once registered, and everything that calls
//! into them: the kernel registry and its lock-free snapshots ([`registry`]), the operation
//! service with its C table and its Rust face ([`operations`]), model runner selection through
//! RMD1 ([`models`]), the bound CPE1 expert tables and their worker pool ([`experts`]), and the
//! bound CUDA tables ([`cuda_tables`]). It knows nothing of stores, packages on disk or trust:
//! the package service (`guild-host`'s package manager) decides what is loaded, and `guild-host`
//! composes the two. Runners name `guild-host`, which re-exports this crate's modules under the
//! same names.
//!
//! Nearly all of the host's `unsafe` lives here, and only in the modules that cross the C
//! boundary: `operations` (the providers' GOP1 callbacks and the service's C table), `models`
//! (RMD1 callbacks and the C model reader), `experts` (bound CPE1 tables and host-owned aligned
//! buffers), `cuda_tables` (the host-side queries of bound CDA1 and CDM1 tables) and `bound`
//! (what those two share: the copy of a bound table and the one call into its callbacks).

#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)] // The one call into a bound table's callbacks, for experts and cuda_tables.
mod bound;
#[allow(unsafe_code)] // The CDD1/CDA1/CDM1 boundary: the host-side queries of bound CUDA tables.
pub mod cuda_tables;
pub mod error;
#[allow(unsafe_code)] // The CPE1 boundary: expert callbacks and the host-owned aligned buffers.
pub mod experts;
mod id_lookup;
#[allow(unsafe_code)] // The runner boundary: RMD1 callbacks and the C model reader's entry points.
pub mod models;
#[allow(unsafe_code)] // The C service boundary: GOP1 callbacks and the service's C table.
pub mod operations;
pub mod platform;
pub mod registry;
mod snapshot;
mod sync;
