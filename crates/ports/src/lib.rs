//! Port traits of the Guild kernel host, named by role, each with its own error type.
//!
//! Adapters implement these traits; the app composes them. A port never names an adapter's
//! types: each error is a `#[non_exhaustive]` kind plus a boxed source, so that a file-system or
//! crypto library error never leaks into the signatures the app sees. Besides the domain, the
//! ports depend on the ABI mirror (`guild-abi`) alone: the provider interface a loader hands the
//! app speaks the Kernel ABI's own structs, so that a call crosses it without a conversion.

#![forbid(unsafe_code)]

pub mod device;
pub mod distribution;
#[cfg(feature = "fakes")]
pub mod fakes;
pub mod loader;
pub mod model;
pub mod provider;
pub mod signature;
pub mod source;
pub mod store;
