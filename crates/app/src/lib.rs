//! `guild-host`: the host that inference runners embed to load signed native kernel plugins and
//! operation modules.
//!
//! This crate is the composition root: it is the only place that names concrete adapters. Today
//! it holds the package manager (authentication, dependency validation, durable publication,
//! enable/disable/remove/rollback, recovery) and the `guild` command line; the kernel registry
//! and the operation service arrive with the issues that build them.

#![deny(unsafe_code)]

pub mod error;
pub mod host;
#[allow(unsafe_code)] // The C service boundary: calls into providers' GOP1 callbacks.
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
