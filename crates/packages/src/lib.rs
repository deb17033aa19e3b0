//! `guild-packages`: the package service of the Guild kernel host.
//!
//! Everything a store of packages needs before and apart from running their code: the
//! [`PackageManager`] (authentication, dependency and claim checks, crash-safe publication
//! through the store port, enable/disable/remove/rollback, trust, recovery, the full check),
//! [`lock_sync`] (locks and `guild sync` as one transaction), the crash ledger
//! ([`crash_quarantine`]), the publisher's pack and sign ([`packaging`]), and with the `oci`
//! feature the registry transport ([`distribution`]). [`HostError`] is what any of it refuses.
//!
//! It loads nothing and names nothing of the plugin runtime: `guild-host` composes the two, and
//! re-exports this crate's API under the paths runners and tools use (`guild_host::PackageManager`,
//! `guild_host::error::HostError`, ...). Name `guild-host`, not this crate.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod crash_quarantine;
#[cfg(feature = "oci")]
pub mod distribution;
pub mod error;
pub mod fleet;
pub mod lock_sync;
pub mod package_manager;
pub mod packaging;
mod parallel;

pub use error::{ErrorCategory, HostError};
pub use package_manager::{
    FullCheck, InstallOptions, Installed, OpenReport, PackageManager, PackageView, PlanError,
    PlanStep, StepDone, TrustReset, VerifyFailure, VerifyOptions,
};
