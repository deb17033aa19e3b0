//! The kernel registry's refusals, as plain data. The runtime's registry returns them when a
//! change to the loaded packages cannot be made; the package service's error type carries them,
//! so that neither needs the other to name them.

use crate::ids::{ImplId, PackageId, RunnerId};

/// Why the kernel registry refused a change. The registry is unchanged after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryChangeError {
    /// Another loaded package already provides this implementation id (ids are unique across
    /// the registry).
    #[error("{package} registers {impl_id}, which {owner} already provides")]
    DuplicateImplId {
        /// `id@version` of the package being published.
        package: String,
        /// The contested implementation id.
        impl_id: ImplId,
        /// `id@version` of the package that provides it.
        owner: String,
    },
    /// Another loaded package already provides this runner id.
    #[error("{package} registers runner {runner_id}, which {owner} already provides")]
    DuplicateRunnerId {
        /// `id@version` of the package being published.
        package: String,
        /// The contested runner id.
        runner_id: RunnerId,
        /// `id@version` of the package that provides it.
        owner: String,
    },
    /// The package is not in the registry.
    #[error("package {package} is not loaded")]
    NotLoaded {
        /// The package asked for.
        package: PackageId,
    },
    /// Bindings into the package (any loaded or retired version) are alive, so it cannot be
    /// drained; the host reports this as a lease refusal naming the change.
    #[error("package {package} is held by {bindings} binding(s)")]
    Bound {
        /// The package asked for.
        package: PackageId,
        /// Live bindings at the instant of the check.
        bindings: u64,
    },
}
