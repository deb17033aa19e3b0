//! `guild-host`: the host that inference runners embed to load signed native kernel plugins and
//! operation modules.
//!
//! This crate is the composition root: it is the only place that names concrete adapters. It
//! holds the package manager (authentication, dependency validation, durable publication,
//! enable/disable/remove/rollback, recovery), the kernel registry, the [`Host`] that composes
//! them with a plugin loader, the operation service (its C table and its Rust face), the
//! publisher tools and, in the binary, the `guild` command line. `unsafe` is denied everywhere
//! but in `operations`, which calls the providers' C callbacks and implements the C table.

#![deny(unsafe_code)]

pub mod error;
pub mod host;
#[allow(unsafe_code)] // The C service boundary: GOP1 callbacks and the service's C table.
pub mod operations;
pub mod package_manager;
pub mod platform;
pub mod publish;
pub mod registry;

pub use error::{ErrorCategory, HostError};
pub use host::{Host, LoadReport};
pub use operations::{OpHandle, OperationRequest, OperationService};
pub use package_manager::{InstallOptions, Installed, OpenReport, PackageManager};
pub use platform::HostPlatform;
