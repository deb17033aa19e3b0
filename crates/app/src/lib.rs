//! `guild-host`: the host that inference runners embed to load signed native kernel plugins and
//! operation modules.
//!
//! A runner opens a store of installed packages, which authenticates and loads every enabled
//! package, then asks the operation service for namespaced operations with its actual tensors
//! and executes the handles it gets back. Where to start:
//!
//! - [`Host::builder`]: say what the host is wired with and open a store, which loads what is
//!   enabled ([`HostBuilder`] has an example; [`Host::open_dir`] is the same with every default).
//! - [`OperationService::resolve`] and [`OpHandle::execute`]: resolve an operation for concrete
//!   tensors and run it (the [`operations`] module has an example).
//! - [`registry::KernelRegistry::operation_api`]: the same service as the C table that plugins
//!   receive, for native code.
//! - [`Host::open_model`] (a GGUF file) and [`ModelRunners::select`] (any opened model):
//!   choose the runner for a model through the runners' RMD1 extensions and bind it (the
//!   [`models`] module explains the steps).
//! - [`experts::BoundExpertTable`] and [`experts::ExpertPool`]: bind a kernel's CPE1 (CPU backend
//!   v2) table once and run batched expert work through it on the host's worker pool;
//!   [`cuda_tables::BoundCudaTables`] binds a CUDA kernel's CDD1, CDA1 and CDM1 tables the same
//!   way.
//! - [`Host::install`], [`Host::disable`], ...: lifecycle changes, one transaction across the
//!   store, the loader and the kernel registry; [`Host::packages`] shows what is installed.
//!   [`PackageManager`] makes the same changes on a store without loading anything (the `guild`
//!   command line).
//! - [`HostError`] and [`ErrorCategory`]: what can go wrong, sorted the way the `guild` command
//!   line turns it into exit codes.
//!
//! `guild-host` is the one crate a runner names. The plain types requests and reports are written
//! in ([`OpName`], [`TensorDesc`], [`DType`], [`PackageId`], [`Version`], ...) are re-exported at
//! the root, and [`prelude`] holds what a runner uses most; the crates they come from are
//! re-exported whole as [`domain`], [`ports`] (the port traits, for a custom loader or model
//! source) and [`abi`] (the `#[repr(C)]` mirror of the headers, for the C tables).
//! The guides in the repository's `docs/` directory (`runner-authors.md`, `operators.md`,
//! `plugin-authors.md`, `package-format.md`) explain the concepts behind this API.
//!
//! This crate is the composition root, the only place that holds both halves of the host: the
//! package service (`guild-packages`: the package manager's authentication, dependency
//! validation, durable publication, lifecycle and recovery, the crash ledger, locks and sync,
//! the publisher's pack and sign) and the plugin runtime (`guild-runtime`: the kernel registry,
//! the operation service, model runners and bound tables, and with them nearly all of the host's
//! `unsafe`). Both are re-exported under the module names runners and tools use
//! ([`package_manager`], [`error`], [`registry`], [`operations`], [`models`], [`experts`],
//! [`cuda_tables`], [`platform`], ...). What needs both stays here: the [`Host`] and the
//! [`registration`] check, which loads a library into a registry of its own. This crate itself
//! has no `unsafe`. The publisher's conformance check (`guild check`) is `guild-conformance`,
//! which stands on this crate; the `guild` command line is `guild-cli`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod host;
pub mod reconcile;
pub mod registration;

// The plugin runtime (`guild-runtime`) and the package service (`guild-packages`), under the
// names runners and tools have always used.
#[cfg(feature = "oci")]
pub use guild_packages::distribution;
pub use guild_packages::{crash_quarantine, fleet, lock_sync, package_manager, packaging};
pub use guild_runtime::{cuda_tables, experts, models, operations, platform, registry};

/// What can go wrong, sorted the way the `guild` command line turns it into exit codes: the
/// package service's [`HostError`] and what a plugin's callback reported
/// ([`PluginReason`](error::PluginReason)).
pub mod error {
    pub use guild_packages::error::*;
    pub use guild_runtime::error::PluginReason;
}

pub use error::{ErrorCategory, HostError};
pub use guild_packages::{
    FullCheck, InstallOptions, Installed, OpenReport, PackageManager, PackageView, PlanError,
    PlanStep, StepDone, TrustReset, VerifyFailure, VerifyOptions,
};
pub use host::{
    DeferredSwitch, Host, HostBuilder, HostReport, HostWatcher, LoadReport, LockRefused,
    OpenedHost, RefreshReport, RevokedLive,
};
pub use models::{BoundModel, ModelRunners, SelectError, SelectFileError};
pub use operations::{
    DeviceScratch, DeviceSupport, DeviceTensor, ExecuteError, OpHandle, OperationRequest,
    OperationService, ReshapeError, ResolveError, TensorArg, TensorArgMut,
};
pub use platform::HostPlatform;
pub use reconcile::{PendingCause, PendingChange};

// The plain values requests, handles and reports are written in, so that a runner names no
// other guild crate.
pub use guild_adapters_posix::PluginLog;
/// Lock files (`guild lock`), for runners that open a store under one ([`HostBuilder::lock`]).
pub use guild_domain::distribution::{LockFile, LockRefusal, LockedPackage};
pub use guild_domain::ids::{ImplId, OpName, PackageId, PublisherId, RunnerId};
pub use guild_domain::operation::{
    Backend, BackendSet, Budget, Capabilities, CpuIsa, DType, Layout, MemorySpace, Numerics,
    ProviderRefusal, QueryError, Rejection, ResolveFailure, SyncMode, TensorDesc,
};
pub use guild_domain::version::{PackedVersion, Version};
pub use guild_ports::device::StreamRef;

/// The `#[repr(C)]` mirror of the Kernel ABI headers (`guild-abi`), for calling the C tables
/// ([`registry::KernelRegistry::operation_api`]) from Rust.
pub use guild_abi as abi;
/// Stopping a runner on purpose without its loads being taken for crashes: call
/// [`install_termination_handlers`](termination::install_termination_handlers) once at start
/// (SIGTERM, SIGINT and SIGHUP then still end the process, after noting the signal in the crash
/// ledger's records of loads in flight), or call
/// [`note_termination`](termination::note_termination) from handlers of your own.
pub mod termination {
    pub use guild_adapters_posix::termination::{
        install_termination_handlers, note_termination, stop_requests, StopRequests,
    };
}
/// Small files written atomically and durably (temporary, fsync, rename, directory fsync), for
/// tools built on the host that write beside a store.
pub use guild_adapters_fs::durable_file;
/// The pure domain (`guild-domain`): identifiers, versions, manifests, operation contracts and
/// their diagnostics; the common ones are also re-exported at the crate root.
pub use guild_domain as domain;
/// The port traits (`guild-ports`): what a custom [`ports::loader::PluginLoader`] (for
/// [`HostBuilder::loader`]) or [`ports::model::ModelSource`] implements.
pub use guild_ports as ports;

/// What a runner uses most, for `use guild_host::prelude::*;`: the host and its builder, the
/// operation service and its arguments, and the values a request is written in.
pub mod prelude {
    pub use crate::{
        Backend, BackendSet, BoundModel, Budget, Capabilities, DType, DeviceTensor, ExecuteError,
        Host, HostError, ImplId, MemorySpace, Numerics, OpHandle, OpName, OpenedHost,
        OperationRequest, OperationService, PackageId, PackedVersion, RefreshReport, ReshapeError,
        ResolveError, RunnerId, StreamRef, SyncMode, TensorArg, TensorArgMut, TensorDesc, Version,
    };
}

/// The README's runner snippet, compiled as a doctest so that it keeps up with the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The runner guide's examples (`docs/runner-authors.md`), compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/runner-authors.md")]
struct RunnerGuideDoctests;

/// The package manager's example, written in guild-packages and compiled here, where its
/// `guild_host` paths resolve.
#[cfg(doctest)]
#[doc = include_str!("../../packages/src/package_manager/example.md")]
struct PackageManagerDoctests;

/// The kernel registry a host hands out looks up and binds, and nothing else: the right to
/// change it is the host's `OwnedRegistry`. The same call shape with a lookup compiles,
///
/// ```
/// fn bound(host: &guild_host::Host, id: &guild_host::PackageId) -> u64 {
///     host.kernels().live_bindings(id)
/// }
/// ```
///
/// and every mutator is out of reach:
///
/// ```compile_fail
/// fn drain(host: &guild_host::Host, id: &guild_host::PackageId) {
///     let _ = host.kernels().drain(id);
/// }
/// ```
///
/// ```compile_fail
/// fn unload(host: &guild_host::Host, id: &guild_host::PackageId) {
///     let _ = host.kernels().unload(id);
/// }
/// ```
///
/// ```compile_fail
/// fn supersede(host: &guild_host::Host, id: &guild_host::PackageId) {
///     host.kernels().set_superseded(id, true);
/// }
/// ```
#[cfg(doctest)]
struct HostRegistryHasNoMutators;
