//! `guild-host`: the host that inference runners embed to load signed native kernel plugins and
//! operation modules.
//!
//! A runner opens a store of installed packages, which authenticates and loads every enabled
//! package, then asks the operation service for namespaced operations with its actual tensors
//! and executes the handles it gets back. Where to start:
//!
//! - [`Host::open_dir`]: open a store and load what is enabled ([`Host`] has an example).
//! - [`OperationService::resolve`] and [`OpHandle::execute`]: resolve an operation for concrete
//!   tensors and run it (the [`operations`] module has an example).
//! - [`registry::KernelRegistry::operation_api`]: the same service as the C table that plugins
//!   receive, for native code.
//! - [`Host::models`] and [`ModelRunnerRegistry::select`]: choose the runner for an opened model
//!   through the runners' RMD1 extensions and bind it (the [`models`] module explains the steps).
//! - [`experts::BoundExpertTable`] and [`experts::ExpertPool`]: bind a kernel's CPE1 (CPU backend
//!   v2) table once and run batched expert work through it on the host's worker pool;
//!   [`cuda_tables::BoundCudaTables`] binds a CUDA kernel's CDD1, CDA1 and CDM1 tables the same
//!   way.
//! - [`PackageManager`]: install, enable, disable, remove and roll back packages, and manage the
//!   trust store, without loading anything.
//! - [`HostError`] and [`ErrorCategory`]: what can go wrong, sorted the way the `guild` command
//!   line turns it into exit codes.
//!
//! The request and tensor types ([`OpName`](guild_domain::ids::OpName),
//! [`TensorDesc`](guild_domain::operation::TensorDesc), ...) come from the `guild-domain` crate.
//! The guides in the repository's `docs/` directory (`runner-authors.md`, `operators.md`,
//! `plugin-authors.md`, `package-format.md`) explain the concepts behind this API.
//!
//! This crate is the composition root: it is the only place that names concrete adapters. It
//! holds the package manager (authentication, dependency validation, durable publication,
//! enable/disable/remove/rollback, recovery), the kernel registry, the [`Host`] that composes
//! them with a plugin loader, the operation service (its C table and its Rust face), the
//! publisher tools (the `guild` command line is the `guild-cli` crate). `unsafe` is denied
//! everywhere but in `operations`, which calls the providers' C callbacks and implements the C
//! table, in `models`, which calls the runners' RMD1 callbacks and implements the C model
//! reader, in `experts`, which calls bound CPE1 tables, and in `cuda_tables`, which calls the
//! host-side queries of bound CDA1 and CDM1 tables.

#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)] // The CDD1/CDA1/CDM1 boundary: the host-side queries of bound CUDA tables.
pub mod cuda_tables;
pub mod error;
#[allow(unsafe_code)] // The CPE1 boundary: expert callbacks and the host-owned aligned buffers.
pub mod experts;
pub mod host;
#[allow(unsafe_code)] // The runner boundary: RMD1 callbacks and the C model reader's entry points.
pub mod models;
#[allow(unsafe_code)] // The C service boundary: GOP1 callbacks and the service's C table.
pub mod operations;
pub mod package_manager;
pub mod platform;
pub mod publication;
pub mod publish;
pub mod registry;

pub use error::{ErrorCategory, HostError};
pub use host::{Host, LoadReport};
pub use models::{BoundModel, ModelRunnerRegistry, SelectError};
pub use operations::{OpHandle, OperationRequest, OperationService};
pub use package_manager::{InstallOptions, Installed, OpenReport, PackageManager, TrustReset};
pub use platform::HostPlatform;
