//! `guild-host`: the host that inference runners embed to load signed native kernel plugins and
//! operation modules.
//!
//! This crate is the composition root: it is the only place that names concrete adapters. Today
//! it holds the package manager (authentication, dependency validation, durable publication,
//! enable/disable/remove/rollback, recovery) and the `guild` command line; the kernel registry
//! and the operation service arrive with the issues that build them.

#![forbid(unsafe_code)]

pub mod error;
pub mod host;
pub mod package_manager;
pub mod platform;
pub mod publish;
pub mod registry;

pub use error::{ErrorCategory, HostError};
pub use host::{Host, LoadReport};
pub use package_manager::{InstallOptions, Installed, OpenReport, PackageManager};
pub use platform::HostPlatform;
