//! Dependency records as a manifest declares them. The graph (`graph`) decides what they mean.

use crate::ids::{PackageId, PublisherId, Sha256Digest};
use crate::version::VersionRange;

/// The ABI tag that marks a module edge as a runtime dependency on a `gkmodule`.
pub const MODULE_ABI_TAG_V1: &str = "guild.module.v1";

/// The module ABI version that runtime module edges require of their target.
pub const MODULE_ABI_V1: u32 = 1;

/// An ordinary dependency (`dependencies` in the manifest): the named package, kernel or module,
/// must be installed and enabled at a version inside `range`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dependency {
    /// The package depended on.
    pub package_id: PackageId,
    /// The versions it accepts, inclusive.
    pub range: VersionRange,
}

/// A module dependency record (`module_dependencies` in the manifest).
///
/// With `abi_tag == "guild.module.v1"` it is a runtime edge. In a historical `.gkernel` manifest a
/// record with another tag is build-time provenance and takes no part in loading; a `.gkmodule`
/// must use `guild.module.v1` on every record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModuleDependency {
    /// The module depended on.
    pub module_id: PackageId,
    /// The versions it accepts, inclusive.
    pub range: VersionRange,
    /// Kept as the manifest wrote it: provenance tags are free-form text.
    pub abi_tag: String,
    /// The publisher the module must come from, when pinned.
    pub publisher_id: Option<PublisherId>,
    /// SHA-256 of the target's canonical unsigned payload.
    pub sha256: Option<Sha256Digest>,
}

impl ModuleDependency {
    /// Whether this record is a runtime edge (`guild.module.v1`).
    pub fn is_runtime_edge(&self) -> bool {
        self.abi_tag == MODULE_ABI_TAG_V1
    }
}
