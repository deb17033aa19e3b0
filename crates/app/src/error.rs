//! The host's error type: each variant names what failed and where, and belongs to one
//! [`ErrorCategory`] that the CLI maps to a documented exit code.

use std::path::PathBuf;

use guild_domain::graph::{
    DisableRefusal, GraphBuildError, GraphProblem, RemoveRefusal, RollbackRefusal,
};
use guild_domain::lease::Leased;
use guild_domain::manifest::ManifestErrors;
use guild_domain::registry::RegistryError;
use guild_domain::trust::{AuthError, TrustChangeError, TrustFileError};
use guild_ports::source::SourceError;
use guild_ports::store::StoreError;

use crate::platform::PlatformMismatch;

/// The broad class of a failure, which decides the CLI's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    /// The package itself is unacceptable: unreadable, hostile, malformed, unauthenticated or for
    /// another platform.
    PackageRejected,
    /// The request conflicts with the installed packages: dependencies, leases, immutable
    /// versions, downgrades, trust rules.
    Refused,
    /// The named package, version or key does not exist.
    NotFound,
    /// The store cannot be used: corrupt, locked, unreadable, or an IO failure.
    Store,
}

/// Anything the host refuses or fails to do.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("package {location}: {errors}")]
    Manifest {
        location: PathBuf,
        errors: ManifestErrors,
    },
    #[error("package {package} ({location}) is not authenticated: {source}")]
    Unauthenticated {
        location: PathBuf,
        package: String,
        #[source]
        source: AuthError,
    },
    #[error("package {package} cannot be installed on this host: {source}")]
    Platform {
        package: String,
        #[source]
        source: PlatformMismatch,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{action} refused: it would break dependencies:{}", list(.problems))]
    Dependencies {
        action: String,
        problems: Vec<GraphProblem>,
    },
    /// The store's graph is satisfied, but the dependency's library is not loaded in this host
    /// (its load failed, or it was skipped), so the package that builds on it is not opened.
    #[error(
        "{package} was not loaded: its dependency {dependency} {}",
        match .loaded {
            Some(v) => format!("is loaded at {v}, outside the range {range} it asks for"),
            None => format!("({range}) is not loaded in this host; load or repair it first"),
        }
    )]
    DependencyNotLoaded {
        /// `id@version` of the package that was not loaded.
        package: String,
        dependency: guild_domain::ids::PackageId,
        range: String,
        loaded: Option<guild_domain::version::Version>,
    },
    /// A plugin registered a kernel for a backend its signed manifest does not declare.
    #[error(
        "{package} registered {impl_id} for the {backend} backend, which its manifest does not \
         declare (backends: {declared})"
    )]
    UndeclaredBackend {
        /// `id@version`.
        package: String,
        impl_id: guild_domain::ids::ImplId,
        backend: guild_domain::operation::Backend,
        declared: String,
    },
    #[error(transparent)]
    Disable(#[from] DisableRefusal),
    #[error(transparent)]
    Remove(#[from] RemoveRefusal),
    #[error(transparent)]
    Rollback(#[from] RollbackRefusal),
    #[error(transparent)]
    Leased(#[from] Leased),
    #[error(transparent)]
    Lease(#[from] guild_domain::lease::LeaseError),
    #[error(transparent)]
    TrustChange(#[from] TrustChangeError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("trust file of the store: {0}")]
    TrustFile(#[from] TrustFileError),
    #[error("installed package {package} at {} is damaged: {problem}", .path.display())]
    InstalledTree {
        package: String,
        path: PathBuf,
        problem: String,
    },
    #[error("the store's installed packages do not form a graph: {0}")]
    Graph(#[from] GraphBuildError),
    #[error("this host runs on {os}/{arch}, which packages cannot name")]
    UnsupportedPlatform {
        os: &'static str,
        arch: &'static str,
    },
    #[error(transparent)]
    Publish(#[from] crate::publish::PublishError),
    #[error(transparent)]
    Load(#[from] guild_ports::loader::LoadError),
    #[error(transparent)]
    RegistryChange(#[from] crate::registry::RegistryChangeError),
}

fn list(problems: &[GraphProblem]) -> String {
    problems.iter().map(|p| format!("\n  {p}")).collect()
}

impl HostError {
    /// Which class of failure this is.
    pub fn category(&self) -> ErrorCategory {
        use guild_ports::source::SourceErrorKind;
        match self {
            HostError::Source(e) if e.kind == SourceErrorKind::NotFound => ErrorCategory::NotFound,
            HostError::Source(_)
            | HostError::Manifest { .. }
            | HostError::Unauthenticated { .. }
            | HostError::Platform { .. } => ErrorCategory::PackageRejected,
            HostError::Registry(
                RegistryError::UnknownPackage { .. }
                | RegistryError::NotInstalled { .. }
                | RegistryError::NoCurrentVersion { .. },
            )
            | HostError::Disable(DisableRefusal::NotInstalled { .. })
            | HostError::Remove(RemoveRefusal::NotInstalled { .. })
            | HostError::Rollback(RollbackRefusal::NotInstalled { .. }) => ErrorCategory::NotFound,
            HostError::Registry(_)
            | HostError::Dependencies { .. }
            | HostError::DependencyNotLoaded { .. }
            | HostError::Disable(_)
            | HostError::Remove(_)
            | HostError::Rollback(_)
            | HostError::Leased(_)
            | HostError::Lease(_)
            | HostError::TrustChange(_) => ErrorCategory::Refused,
            HostError::Store(_)
            | HostError::TrustFile(_)
            | HostError::InstalledTree { .. }
            | HostError::Graph(_)
            | HostError::UnsupportedPlatform { .. } => ErrorCategory::Store,
            HostError::Publish(_) | HostError::Load(_) | HostError::UndeclaredBackend { .. } => {
                ErrorCategory::PackageRejected
            }
            HostError::RegistryChange(crate::registry::RegistryChangeError::NotLoaded {
                ..
            }) => ErrorCategory::NotFound,
            HostError::RegistryChange(_) => ErrorCategory::Refused,
        }
    }
}
