//! Distribution through OCI registries (feature `oci`): the registry adapter behind the
//! [`ArtifactRegistry`] port, for tools built on the host (`guild push`, `pull`, `install
//! oci://…`, `sync`).
//!
//! A registry is an untrusted transport: what it delivers is a package file like any other,
//! installed through [`crate::PackageManager::install_with`], which authenticates it before
//! anything reaches the store. The feature pulls in an async HTTP stack (tokio, reqwest,
//! rustls), which stays inside the adapter; a runner that never talks to a registry leaves it
//! off.

pub use guild_adapters_oci::{
    Limits, OciRegistry, OciSettings, CA_FILE_VARIABLE, INSECURE_VARIABLE,
};
pub use guild_domain::distribution::{
    plan_sync, ArtifactConfig, HeldVersion, LockFile, LockRefusal, LockedPackage, LockedSource,
    OciReference, OciRepository, OciTarget, SyncConflict, SyncStep,
};
pub use guild_ports::distribution::{
    ArtifactRegistry, DistributionError, DistributionErrorKind, DocumentRegistry, Part, Pulled,
    PulledDocument, PushRequest, Pushed,
};
