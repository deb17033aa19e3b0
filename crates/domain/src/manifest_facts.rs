//! What the dependency graph and the impl-id claims read of a version's signed manifest, recorded
//! with the version in the store state when it is published, so that checking a change against
//! the whole store reads the registry alone and not every installed version's `.gkmetadata`.
//!
//! A version's payload never changes, so neither do these facts; a full check compares them with
//! the installed metadata. Records written before they were recorded have none, and their
//! metadata is read instead.

use crate::dependency::{Dependency, ModuleDependency};
use crate::ids::ImplId;
use crate::manifest::Manifest;

/// The manifest fields that the graph (`PackageNode`) and the claims read, beyond what a
/// version's record in the store state holds anyway (kind, publisher, payload digest).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ManifestFacts {
    /// The module ABI a `gkmodule` declares.
    pub module_abi: Option<u32>,
    /// The implementation ids it registers, in manifest order.
    pub provided_ops: Vec<ImplId>,
    /// Its `dependencies`, in manifest order.
    pub dependencies: Vec<Dependency>,
    /// Its `module_dependencies`, in manifest order, provenance records included.
    pub module_dependencies: Vec<ModuleDependency>,
}

impl ManifestFacts {
    /// The facts of `manifest`.
    pub fn of(manifest: &Manifest) -> Self {
        ManifestFacts {
            module_abi: manifest.module_abi,
            provided_ops: manifest.provided_ops.clone(),
            dependencies: manifest.dependencies.clone(),
            module_dependencies: manifest.module_dependencies.clone(),
        }
    }
}
