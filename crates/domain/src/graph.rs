//! The dependency graph over installed package versions: validation, the load plan, and the
//! package manager's questions about disabling, removing and rolling back.
//!
//! The graph is built from plain [`PackageNode`] records. Several versions of one package may be
//! installed at once (the previous one stays for rollback), but at most one of them is enabled, and
//! every edge resolves to that enabled version. Only enabled packages are checked, because only they
//! will be loaded.
//!
//! Validation never stops at the first problem: [`DependencyGraph::plan`] returns every problem it
//! finds, each naming both ends of the failing edge, together with a deterministic load order of the
//! healthy part and the list of packages that cannot load and why.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use crate::dependency::{Dependency, ModuleDependency, MODULE_ABI_TAG_V1, MODULE_ABI_V1};
use crate::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use crate::version::{Version, VersionRange};

mod incremental;

pub use incremental::GraphIndex;

/// One installed package version, with the facts the graph needs to judge it and its edges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageNode {
    /// The package.
    pub id: PackageId,
    /// The version.
    pub version: Version,
    /// `gkernel` or `gkmodule`: only modules can be the target of a runtime module edge.
    pub kind: PackageKind,
    /// The module ABI a `gkmodule` declares; `None` for kernels.
    pub module_abi: Option<u32>,
    /// The publisher the package was signed as; compared with a dependent's publisher pin.
    pub publisher: PublisherId,
    /// SHA-256 of the canonical unsigned payload: what a dependent's `sha256` pin is compared with.
    pub payload_digest: Sha256Digest,
    /// Whether this is the enabled version of its package. At most one version per id may be.
    pub enabled: bool,
    /// The manifest's `dependencies`, in manifest order.
    pub dependencies: Vec<Dependency>,
    /// The manifest's `module_dependencies`, in manifest order, provenance records included.
    pub module_dependencies: Vec<ModuleDependency>,
}

impl PackageNode {
    /// The graph's view of an authenticated package: the fields the rules read, and the digest of
    /// the payload exactly as it was signed (not one recomputed from the typed manifest, which
    /// could differ when the publisher wrote an empty opt-in list).
    pub fn from_metadata(metadata: &crate::manifest::Metadata, enabled: bool) -> Self {
        let m = metadata.manifest();
        PackageNode {
            id: m.package_id.clone(),
            version: m.version.clone(),
            kind: m.kind,
            module_abi: m.module_abi,
            publisher: m.publisher_id.clone(),
            payload_digest: metadata.payload_digest(),
            enabled,
            dependencies: m.dependencies.clone(),
            module_dependencies: m.module_dependencies.clone(),
        }
    }

    /// The `id@version` name of this node.
    pub fn node_ref(&self) -> NodeRef {
        NodeRef {
            id: self.id.clone(),
            version: self.version.clone(),
        }
    }

    /// Whether `dep` is a build-time provenance record: a module edge with a tag other than
    /// `guild.module.v1` in a kernel's manifest. Such records take no part in loading.
    pub fn is_provenance(&self, dep: &ModuleDependency) -> bool {
        self.kind == PackageKind::Kernel && !dep.is_runtime_edge()
    }

    /// Every requirement that protects its target at run time, in manifest order: ordinary
    /// dependencies first, then module dependencies that are not provenance records.
    fn protecting_requirements(&self) -> impl Iterator<Item = (&PackageId, Requirement)> + '_ {
        let ordinary = self
            .dependencies
            .iter()
            .map(|d| (&d.package_id, Requirement::Package(d.clone())));
        let module = self
            .module_dependencies
            .iter()
            .filter(|d| !self.is_provenance(d))
            .map(|d| (&d.module_id, Requirement::Module(d.clone())));
        ordinary.chain(module)
    }

    /// Whether any requirement that protects its target at run time names `id`.
    fn requires(&self, id: &PackageId) -> bool {
        self.dependencies.iter().any(|d| &d.package_id == id)
            || self
                .module_dependencies
                .iter()
                .any(|d| &d.module_id == id && !self.is_provenance(d))
    }
}

/// A package version's name, displayed as `id@version`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeRef {
    /// The package.
    pub id: PackageId,
    /// The version.
    pub version: Version,
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.id, self.version)
    }
}

/// One requirement as its dependent declared it: an ordinary dependency or a module dependency.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Requirement {
    /// An entry of `dependencies`.
    Package(Dependency),
    /// An entry of `module_dependencies`.
    Module(ModuleDependency),
}

impl Requirement {
    /// The package the requirement names.
    pub fn target(&self) -> &PackageId {
        match self {
            Requirement::Package(d) => &d.package_id,
            Requirement::Module(d) => &d.module_id,
        }
    }

    /// The accepted version range.
    pub fn range(&self) -> &VersionRange {
        match self {
            Requirement::Package(d) => &d.range,
            Requirement::Module(d) => &d.range,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requirement::Package(d) => write!(f, "{} {}", d.package_id, d.range),
            Requirement::Module(d) => write!(f, "module {} {}", d.module_id, d.range),
        }
    }
}

/// Why the node list could not become a graph at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphBuildError {
    /// The same package version appears twice.
    #[error("{id}@{version} is listed more than once")]
    DuplicateVersion {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
    },
    /// Two versions of one package are enabled.
    #[error(
        "{id} has two enabled versions, {first} and {second}; at most one version may be enabled"
    )]
    SeveralEnabled {
        /// The package.
        id: PackageId,
        /// One enabled version.
        first: Version,
        /// The other.
        second: Version,
    },
    /// A replacement of one package's versions ([`GraphIndex::set_package`]) holds a version of
    /// another package.
    #[error("{found} is not a version of {id}")]
    OtherPackage {
        /// The package whose versions were being replaced.
        id: PackageId,
        /// The version of another package among them.
        found: NodeRef,
    },
}

/// The graph refers to a package version that is not installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{id}@{version} is not installed")]
pub struct VersionNotInstalled {
    /// The package.
    pub id: PackageId,
    /// The version.
    pub version: Version,
}

/// One problem found by validation. Every edge problem names the dependent (`id@version`), the
/// target and the requirement that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphProblem {
    /// No version of the target is installed.
    #[error("{dependent} requires {requirement}, but {target} is not installed")]
    Missing {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package it requires.
        target: PackageId,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
    },
    /// The target is installed but no version of it is enabled.
    #[error(
        "{dependent} requires {requirement}, but no version of {target} is enabled (installed: {})",
        join(.installed)
    )]
    Disabled {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package it requires.
        target: PackageId,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
        /// The installed, disabled versions of the target.
        installed: Vec<Version>,
    },
    /// A runtime module edge points at a kernel package.
    #[error(
        "{dependent} requires {requirement}, but {target} is a {kind} package, not a gkmodule"
    )]
    NotAModule {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package version the requirement was checked against.
        target: NodeRef,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
        /// The target's kind.
        kind: PackageKind,
    },
    /// A runtime module edge points at a module of another module ABI.
    #[error(
        "{dependent} requires {requirement}, but {target} {}; runtime module edges need module ABI {MODULE_ABI_V1}",
        describe_module_abi(*.found)
    )]
    WrongModuleAbi {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package version the requirement was checked against.
        target: NodeRef,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
        /// The module ABI the target declares, if any.
        found: Option<u32>,
    },
    /// The enabled version of the target is outside the required range.
    #[error("{dependent} requires {requirement}, but the enabled version is {target}")]
    VersionOutOfRange {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package version the requirement was checked against.
        target: NodeRef,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
    },
    /// The target is published by another publisher than the requirement pins.
    #[error(
        "{dependent} requires {requirement} from publisher {expected}, but {target} is published by {found}"
    )]
    PublisherMismatch {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package version the requirement was checked against.
        target: NodeRef,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
        /// The publisher pinned.
        expected: PublisherId,
        /// The target's publisher.
        found: PublisherId,
    },
    /// The target's payload digest differs from the one the requirement pins.
    #[error(
        "{dependent} requires {requirement} with payload sha256 {expected}, but {target} has payload sha256 {found}"
    )]
    DigestMismatch {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package version the requirement was checked against.
        target: NodeRef,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
        /// The digest pinned.
        expected: Sha256Digest,
        /// The target's payload digest.
        found: Sha256Digest,
    },
    /// A gkmodule declares a module dependency with another tag than guild.module.v1.
    #[error(
        "{dependent} is a gkmodule, so its module dependency on {target} must use abi_tag {MODULE_ABI_TAG_V1:?}, not {:?}",
        abi_tag_of(.requirement)
    )]
    NonModuleAbiTag {
        /// The package version whose requirement failed.
        dependent: NodeRef,
        /// The package it names.
        target: PackageId,
        /// The requirement as its manifest declares it.
        requirement: Requirement,
    },
    /// Enabled packages depend on each other in a cycle.
    #[error("dependency cycle: {}", join_path(.path))]
    Cycle {
        /// The cycle, starting and ending at the same package version (`a -> b -> a`; a package
        /// that requires itself gives `a -> a`).
        path: Vec<NodeRef>,
    },
}

impl GraphProblem {
    /// The package version whose requirement failed; `None` for a cycle.
    pub fn dependent(&self) -> Option<&NodeRef> {
        match self {
            GraphProblem::Missing { dependent, .. }
            | GraphProblem::Disabled { dependent, .. }
            | GraphProblem::NotAModule { dependent, .. }
            | GraphProblem::WrongModuleAbi { dependent, .. }
            | GraphProblem::VersionOutOfRange { dependent, .. }
            | GraphProblem::PublisherMismatch { dependent, .. }
            | GraphProblem::DigestMismatch { dependent, .. }
            | GraphProblem::NonModuleAbiTag { dependent, .. } => Some(dependent),
            GraphProblem::Cycle { .. } => None,
        }
    }

    /// The package the failed requirement names; `None` for a cycle.
    pub fn target_id(&self) -> Option<&PackageId> {
        match self {
            GraphProblem::Missing { target, .. }
            | GraphProblem::Disabled { target, .. }
            | GraphProblem::NonModuleAbiTag { target, .. } => Some(target),
            GraphProblem::NotAModule { target, .. }
            | GraphProblem::WrongModuleAbi { target, .. }
            | GraphProblem::VersionOutOfRange { target, .. }
            | GraphProblem::PublisherMismatch { target, .. }
            | GraphProblem::DigestMismatch { target, .. } => Some(&target.id),
            GraphProblem::Cycle { .. } => None,
        }
    }

    /// Whether the problem concerns package `id`: as dependent, as target, or on a cycle's path.
    pub fn involves(&self, id: &PackageId) -> bool {
        match self {
            GraphProblem::Cycle { path } => path.iter().any(|n| &n.id == id),
            _ => self.dependent().is_some_and(|d| &d.id == id) || self.target_id() == Some(id),
        }
    }
}

/// Why an enabled package version is left out of the load order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockReason {
    /// Its own requirements failed or it lies on a reported cycle. Each problem also appears in
    /// [`LoadPlan::problems`].
    Problems(Vec<GraphProblem>),
    /// It depends, directly or through others, on a package that cannot load. `via` is the direct
    /// dependency that is blocked; `root` is a package whose own problems started the failure.
    DependencyBlocked {
        /// The direct dependency that cannot load.
        via: NodeRef,
        /// The package whose own problems started the failure.
        root: NodeRef,
    },
}

/// An enabled package version that will not be loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The package version left out.
    pub node: NodeRef,
    /// Why.
    pub reason: BlockReason,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            BlockReason::Problems(problems) => {
                write!(f, "{} cannot load: ", self.node)?;
                for (i, p) in problems.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
            BlockReason::DependencyBlocked { via, root } if via == root => {
                write!(
                    f,
                    "{} cannot load: its dependency {via} cannot load",
                    self.node
                )
            }
            BlockReason::DependencyBlocked { via, root } => write!(
                f,
                "{} cannot load: its dependency {via} cannot load because of problems in {root}",
                self.node
            ),
        }
    }
}

/// The outcome of validating the enabled part of the graph. It borrows the graph's nodes for the
/// load order, so that planning a large graph copies no names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPlan<'g> {
    /// The healthy enabled package versions, dependencies before their dependents. Among packages
    /// that are ready at the same time the smaller package id comes first, so the order depends only
    /// on the graph's contents and never on the order the nodes were supplied in.
    pub order: Vec<&'g PackageNode>,
    /// Enabled package versions left out of `order`, sorted by package id.
    pub blocked: Vec<Blocked>,
    /// Every problem: edge problems sorted by dependent (within one dependent, ordinary
    /// dependencies before module dependencies, each in manifest order), then one cycle per
    /// strongly connected component, sorted by the cycle's first package.
    pub problems: Vec<GraphProblem>,
}

impl LoadPlan<'_> {
    /// Whether every enabled package version can load.
    pub fn is_healthy(&self) -> bool {
        self.problems.is_empty() && self.blocked.is_empty()
    }
}

/// An enabled package version whose requirement names a given package, as the disable and remove
/// queries report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependent {
    /// The dependent package version.
    pub node: NodeRef,
    /// Its requirement on the package in question.
    pub requirement: Requirement,
}

impl fmt::Display for Dependent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (requires {})", self.node, self.requirement)
    }
}

/// Why a package may not be disabled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DisableRefusal {
    /// The package is not installed.
    #[error("cannot disable {id}: it is not installed")]
    NotInstalled {
        /// The package.
        id: PackageId,
    },
    /// Enabled packages depend on the package.
    #[error("cannot disable {id}: enabled packages depend on it: {}", join(.dependents))]
    EnabledDependents {
        /// The package.
        id: PackageId,
        /// Each enabled dependent and its requirement.
        dependents: Vec<Dependent>,
    },
}

/// Why a package version may not be removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoveRefusal {
    /// The version is not installed.
    #[error("cannot remove {id}@{version}: it is not installed")]
    NotInstalled {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
    },
    /// The version is enabled and enabled packages depend on it.
    #[error("cannot remove {target}: it is enabled and enabled packages depend on it: {}", join(.dependents))]
    EnabledDependents {
        /// The version.
        target: NodeRef,
        /// Each enabled dependent and its requirement.
        dependents: Vec<Dependent>,
    },
}

/// Why a package may not roll back to a version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RollbackRefusal {
    /// The previous version is not installed.
    #[error("cannot roll {id} back to {version}: that version is not installed")]
    NotInstalled {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
    },
    /// Enabled dependents would reject the previous version.
    #[error("cannot roll {id} back to {version}: {}", join_problems(.problems))]
    Incompatible {
        /// The package.
        id: PackageId,
        /// The previous version.
        version: Version,
        /// What would break.
        problems: Vec<GraphProblem>,
    },
}

/// Where the versions of one package id sit in the sorted node list.
#[derive(Debug, Clone, Copy)]
struct IdSlot {
    first: usize,
    len: usize,
    enabled: Option<usize>,
    /// The next slot whose id has the same 64-bit hash, if any.
    next_same_hash: Option<usize>,
}

/// Which version of one package id counts as enabled while resolving, in place of what the
/// nodes say: the versions of that id occupy `first..first + len` in the node list.
#[derive(Debug, Clone, Copy)]
struct EnabledOverride {
    first: usize,
    len: usize,
    enabled: Option<usize>,
}

impl EnabledOverride {
    fn covers(&self, u: usize) -> bool {
        self.first <= u && u < self.first + self.len
    }

    fn apply(&self, slot: IdSlot) -> IdSlot {
        if slot.first == self.first {
            IdSlot {
                enabled: self.enabled,
                ..slot
            }
        } else {
            slot
        }
    }
}

/// A fast, non-cryptographic string hasher for package ids: the multiply-rotate step of rustc's
/// `FxHasher` with murmur3's 64-bit finaliser, so that ids differing only in their last bytes
/// still spread over the low bits a hash table indexes by. Looking up every edge's target with
/// SipHash dominated validation time. The table only ever holds the ids of installed packages,
/// which an operator chose to install, so protection against crafted collisions buys nothing here.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }

    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

fn hash_id(id: &PackageId) -> u64 {
    let mut hasher = IdHasher::default();
    hasher.write(id.as_str().as_bytes());
    hasher.finish()
}

/// Finds the versions of a package id without keeping a second copy of every id: the map goes
/// from an id's 64-bit hash to its slot, and slots whose ids share a hash are chained. A lookup
/// confirms the id against the node the slot points at.
#[derive(Debug, Clone, Default)]
struct IdTable {
    heads: HashMap<u64, usize, BuildHasherDefault<IdHasher>>,
    slots: Vec<IdSlot>,
}

impl IdTable {
    fn with_capacity(n: usize) -> Self {
        IdTable {
            heads: HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default()),
            slots: Vec::with_capacity(n),
        }
    }

    fn insert(&mut self, id: &PackageId, slot: IdSlot) {
        self.insert_hashed(hash_id(id), slot);
    }

    fn insert_hashed(&mut self, hash: u64, mut slot: IdSlot) {
        let index = self.slots.len();
        slot.next_same_hash = self.heads.insert(hash, index);
        self.slots.push(slot);
    }

    fn get(&self, nodes: &[PackageNode], id: &PackageId) -> Option<&IdSlot> {
        self.position(nodes, id).and_then(|i| self.slots.get(i))
    }

    fn position(&self, nodes: &[PackageNode], id: &PackageId) -> Option<usize> {
        self.position_hashed(nodes, id, hash_id(id))
    }

    fn position_hashed(&self, nodes: &[PackageNode], id: &PackageId, hash: u64) -> Option<usize> {
        let mut at = self.heads.get(&hash).copied();
        while let Some(i) = at {
            let slot = self.slots.get(i)?;
            if nodes.get(slot.first).is_some_and(|n| &n.id == id) {
                return Some(i);
            }
            at = slot.next_same_hash;
        }
        None
    }
}

/// The dependency graph over every installed package version.
///
/// Nodes are kept sorted by (package id, version). Because at most one version of an id is
/// enabled, the position of an enabled node orders enabled nodes by package id, which is what
/// makes the load order deterministic without comparing strings in the hot loop.
#[derive(Debug, Clone)]
pub struct DependencyGraph {
    nodes: Vec<PackageNode>,
    slots: IdTable,
}

/// Marks an index that has not been assigned yet.
const NONE: usize = usize::MAX;

impl DependencyGraph {
    /// Builds the graph from the installed package versions, in any order. Refuses a repeated
    /// (id, version) and a package with two enabled versions.
    pub fn new(mut nodes: Vec<PackageNode>) -> Result<Self, GraphBuildError> {
        nodes.sort_unstable_by(|a, b| a.id.cmp(&b.id).then_with(|| a.version.cmp(&b.version)));
        let mut slots = IdTable::with_capacity(nodes.len());
        let mut i = 0;
        while let Some(head) = nodes.get(i) {
            let same_id = nodes[i..].iter().take_while(|n| n.id == head.id).count();
            let group = &nodes[i..i + same_id];
            let mut enabled: Option<usize> = None;
            for (k, node) in group.iter().enumerate() {
                if let Some(prev) = k.checked_sub(1).and_then(|p| group.get(p)) {
                    if prev.version == node.version {
                        return Err(GraphBuildError::DuplicateVersion {
                            id: node.id.clone(),
                            version: node.version.clone(),
                        });
                    }
                }
                if node.enabled {
                    if let Some(first) = enabled.and_then(|e| nodes.get(e)) {
                        return Err(GraphBuildError::SeveralEnabled {
                            id: node.id.clone(),
                            first: first.version.clone(),
                            second: node.version.clone(),
                        });
                    }
                    enabled = Some(i + k);
                }
            }
            slots.insert(
                &head.id,
                IdSlot {
                    first: i,
                    len: same_id,
                    enabled,
                    next_same_hash: None,
                },
            );
            i += same_id;
        }
        Ok(DependencyGraph { nodes, slots })
    }

    /// Every installed package version, sorted by (package id, version).
    pub fn nodes(&self) -> &[PackageNode] {
        &self.nodes
    }

    /// Gives the nodes back, sorted by (package id, version), so that a caller can edit them and
    /// build a hypothetical graph.
    pub fn into_nodes(self) -> Vec<PackageNode> {
        self.nodes
    }

    /// Every installed version of `id`, oldest first; empty when none is installed.
    pub fn versions(&self, id: &PackageId) -> &[PackageNode] {
        self.slots
            .get(&self.nodes, id)
            .and_then(|s| self.nodes.get(s.first..s.first + s.len))
            .unwrap_or(&[])
    }

    /// The installed node `id@version`.
    pub fn node(&self, id: &PackageId, version: &Version) -> Option<&PackageNode> {
        self.versions(id).iter().find(|n| &n.version == version)
    }

    /// The enabled version of `id`, if any.
    pub fn enabled(&self, id: &PackageId) -> Option<&PackageNode> {
        self.enabled_index(id).and_then(|i| self.nodes.get(i))
    }

    fn enabled_index(&self, id: &PackageId) -> Option<usize> {
        self.slots.get(&self.nodes, id).and_then(|s| s.enabled)
    }

    /// The graph with `node` put in place: it replaces an installed node with the same
    /// (id, version) or is added beside the others. When `node` is enabled, every other version of
    /// its id is disabled, as publication of a new current version does. Use it to validate a
    /// publication before committing it.
    ///
    /// The result always satisfies the build rules, so the error cannot occur in practice; it is
    /// returned rather than hidden so that a mistake here fails closed.
    pub fn with_replacement(&self, node: PackageNode) -> Result<Self, GraphBuildError> {
        let mut nodes = self.nodes.clone();
        if node.enabled {
            for other in nodes.iter_mut().filter(|n| n.id == node.id) {
                other.enabled = false;
            }
        }
        let at = nodes.binary_search_by(|n| {
            n.id.cmp(&node.id)
                .then_with(|| n.version.cmp(&node.version))
        });
        match at {
            Ok(at) => {
                if let Some(slot) = nodes.get_mut(at) {
                    *slot = node;
                }
            }
            Err(at) => nodes.insert(at, node),
        }
        Self::new(nodes)
    }

    /// The graph with `id@version` as the only enabled version of `id`, as a rollback would leave
    /// it.
    pub fn with_enabled(
        &self,
        id: &PackageId,
        version: &Version,
    ) -> Result<Self, VersionNotInstalled> {
        let not_installed = || VersionNotInstalled {
            id: id.clone(),
            version: version.clone(),
        };
        let (slot_index, target) = self.locate(id, version).ok_or_else(not_installed)?;
        // Only flags change, so the sorted node list and the id table stay valid as they are.
        let mut graph = self.clone();
        let slot = graph
            .slots
            .slots
            .get_mut(slot_index)
            .ok_or_else(not_installed)?;
        slot.enabled = Some(target);
        let range = slot.first..slot.first + slot.len;
        for (u, node) in graph.nodes.iter_mut().enumerate() {
            if range.contains(&u) {
                node.enabled = u == target;
            }
        }
        Ok(graph)
    }

    /// The position of `id`'s slot in the id table and of `id@version` in the node list.
    fn locate(&self, id: &PackageId, version: &Version) -> Option<(usize, usize)> {
        let slot_index = self.slots.position(&self.nodes, id)?;
        let slot = self.slots.slots.get(slot_index)?;
        let offset = self
            .nodes
            .get(slot.first..slot.first + slot.len)?
            .iter()
            .position(|n| &n.version == version)?;
        Some((slot_index, slot.first + offset))
    }

    /// The build-time provenance records: module dependencies in kernel manifests whose tag is not
    /// `guild.module.v1`. They take no part in loading, but the app may want to show them.
    pub fn provenance(&self) -> impl Iterator<Item = (&PackageNode, &ModuleDependency)> + '_ {
        self.nodes.iter().flat_map(|node| {
            node.module_dependencies
                .iter()
                .filter(move |d| node.is_provenance(d))
                .map(move |d| (node, d))
        })
    }

    /// Every problem in the enabled part of the graph. Equal to `self.plan().problems`.
    pub fn validate(&self) -> Vec<GraphProblem> {
        self.plan().problems
    }

    /// Validates the enabled part of the graph and orders the healthy part for loading.
    ///
    /// A package with a problem of its own, or one that depends directly or transitively on such a
    /// package, is left out of the order and listed in `blocked` with its reason, so that the app
    /// can load everything else.
    pub fn plan(&self) -> LoadPlan<'_> {
        let n = self.nodes.len();
        let resolved = self.resolve(None);
        let cycles = find_cycles(n, &resolved);

        // Nodes with a problem of their own: edge problems, or a place on a reported cycle.
        let mut on_cycles: HashMap<usize, Vec<usize>> = HashMap::new();
        for (c, path) in cycles.iter().enumerate() {
            // The path repeats its first node at the end; count each node once.
            for &u in path.iter().skip(1) {
                on_cycles.entry(u).or_default().push(c);
            }
        }
        let mut bad = vec![false; n];
        for (u, flag) in bad.iter_mut().enumerate() {
            *flag = resolved.problem_start[u] < resolved.problem_start[u + 1]
                || on_cycles.contains_key(&u);
        }

        // Everything that depends on a bad node is blocked. A breadth-first walk along reverse
        // edges from the bad nodes, in index order, records for each blocked node the dependency
        // it was reached through and the bad node at the start of the chain.
        let (pred_start, pred) = reverse(n, &resolved.start, &resolved.succ);
        let mut blocked_by: Vec<Option<(usize, usize)>> = vec![None; n];
        let mut queue: VecDeque<usize> = (0..n).filter(|&u| bad[u]).collect();
        while let Some(v) = queue.pop_front() {
            let root = blocked_by[v].map_or(v, |(_, root)| root);
            for &w in &pred[pred_start[v]..pred_start[v + 1]] {
                if !bad[w] && blocked_by[w].is_none() {
                    blocked_by[w] = Some((v, root));
                    queue.push_back(w);
                }
            }
        }
        // Precomputed so that the loop below does not revisit every node record at random.
        let healthy: Vec<bool> = (0..n)
            .map(|u| self.nodes[u].enabled && !bad[u] && blocked_by[u].is_none())
            .collect();

        // Kahn's algorithm over the healthy nodes: a node is ready once all of its dependencies
        // are loaded, and the heap hands out the smallest index (so the smallest id) first.
        let mut waiting: Vec<usize> = (0..n)
            .map(|u| resolved.start[u + 1] - resolved.start[u])
            .collect();
        let mut ready: BinaryHeap<Reverse<usize>> = (0..n)
            .filter(|&u| healthy[u] && waiting[u] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse(v)) = ready.pop() {
            order.push(&self.nodes[v]);
            for &w in &pred[pred_start[v]..pred_start[v + 1]] {
                if healthy[w] {
                    waiting[w] -= 1;
                    if waiting[w] == 0 {
                        ready.push(Reverse(w));
                    }
                }
            }
        }

        let cycle_problems: Vec<GraphProblem> = cycles
            .iter()
            .map(|path| GraphProblem::Cycle {
                path: path.iter().map(|&u| self.nodes[u].node_ref()).collect(),
            })
            .collect();
        let mut blocked = Vec::new();
        for u in 0..n {
            let node = &self.nodes[u];
            if !node.enabled {
                continue;
            }
            let reason = if bad[u] {
                let mut own: Vec<GraphProblem> = resolved.problems
                    [resolved.problem_start[u]..resolved.problem_start[u + 1]]
                    .to_vec();
                if let Some(cs) = on_cycles.get(&u) {
                    own.extend(cs.iter().map(|&c| cycle_problems[c].clone()));
                }
                BlockReason::Problems(own)
            } else if let Some((via, root)) = blocked_by[u] {
                BlockReason::DependencyBlocked {
                    via: self.nodes[via].node_ref(),
                    root: self.nodes[root].node_ref(),
                }
            } else {
                continue;
            };
            blocked.push(Blocked {
                node: node.node_ref(),
                reason,
            });
        }
        debug_assert_eq!(
            order.len() + blocked.len(),
            self.nodes.iter().filter(|n| n.enabled).count()
        );

        let mut problems = resolved.problems;
        problems.extend(cycle_problems);
        LoadPlan {
            order,
            blocked,
            problems,
        }
    }

    /// Enabled package versions, other than versions of `id` itself, with a requirement naming
    /// `id`. Every ordinary and module dependency counts except a kernel's provenance records,
    /// which take no part in loading. One entry per requirement, sorted by dependent.
    pub fn dependents(&self, id: &PackageId) -> Vec<Dependent> {
        dependents_among(self.nodes.iter(), id)
    }

    /// May `id` be disabled? Refused while enabled packages depend on it. Disabling a package that
    /// has no enabled version is allowed: nothing changes.
    pub fn check_disable(&self, id: &PackageId) -> Result<(), DisableRefusal> {
        disable_answer(id, self.versions(id), || self.dependents(id))
    }

    /// May `id@version` be removed? Removing the enabled version is refused while enabled packages
    /// depend on it; a version that is not enabled may always go.
    pub fn check_remove(&self, id: &PackageId, version: &Version) -> Result<(), RemoveRefusal> {
        remove_answer(id, version, self.versions(id), || self.dependents(id))
    }

    /// May `id` roll back to `version`? The version must be installed. The query then judges the
    /// graph as the rollback would leave it, and every problem there that concerns `id` refuses
    /// the rollback: each enabled dependent's range and pins (kind, module ABI, publisher, digest)
    /// are checked against that version, as are that version's own requirements and any cycle
    /// through it. Rolling back to the version that is already enabled reports the problems it
    /// has now.
    pub fn check_rollback(&self, id: &PackageId, version: &Version) -> Result<(), RollbackRefusal> {
        let not_installed = || RollbackRefusal::NotInstalled {
            id: id.clone(),
            version: version.clone(),
        };
        let (slot_index, target) = self.locate(id, version).ok_or_else(not_installed)?;
        let slot = self.slots.slots.get(slot_index).ok_or_else(not_installed)?;
        // Judge the graph the rollback would leave without copying it: only which version of
        // `id` is enabled changes.
        let resolved = self.resolve(Some(EnabledOverride {
            first: slot.first,
            len: slot.len,
            enabled: Some(target),
        }));
        let mut problems: Vec<GraphProblem> = resolved
            .problems
            .iter()
            .filter(|p| p.involves(id))
            .cloned()
            .collect();
        if let Some(path) = cycle_path(target, &resolved, |_| true) {
            problems.push(GraphProblem::Cycle {
                path: path.iter().map(|&u| self.nodes[u].node_ref()).collect(),
            });
        }
        rollback_answer(id, version, problems)
    }

    /// Checks every requirement of every enabled node and resolves the runtime edges to node
    /// indices. `over`, when given, replaces which version of one id counts as enabled.
    fn resolve(&self, over: Option<EnabledOverride>) -> Resolved {
        let is_enabled = |u: usize, node: &PackageNode| match over {
            Some(o) if o.covers(u) => o.enabled == Some(u),
            _ => node.enabled,
        };
        let n = self.nodes.len();
        let mut out = Resolved {
            start: Vec::with_capacity(n + 1),
            succ: Vec::new(),
            problems: Vec::new(),
            problem_start: Vec::with_capacity(n + 1),
        };
        // First find the slot of every requirement's target, in the order the checks below
        // consume them. The lookups are independent of each other, so in a loop of their own the
        // processor can overlap their memory accesses; interleaved with the checks they ran
        // noticeably slower on large graphs.
        let found: Vec<Option<&IdSlot>> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(u, n)| is_enabled(u, n))
            .flat_map(|(_, n)| {
                let ordinary = n.dependencies.iter().map(|d| &d.package_id);
                ordinary.chain(n.module_dependencies.iter().map(|d| &d.module_id))
            })
            .map(|id| self.slots.get(&self.nodes, id))
            .collect();
        let mut found = found.into_iter();
        for (u, node) in self.nodes.iter().enumerate() {
            out.start.push(out.succ.len());
            out.problem_start.push(out.problems.len());
            if !is_enabled(u, node) {
                continue;
            }
            let succ = &mut out.succ;
            check_requirements(
                self,
                node,
                |_| {
                    found
                        .next()
                        .flatten()
                        .map(|s| over.map_or(*s, |o| o.apply(*s)).enabled)
                },
                |t| succ.push(t),
                &mut out.problems,
            );
        }
        out.start.push(out.succ.len());
        out.problem_start.push(out.problems.len());
        out
    }
}

/// What the requirement checks need to know of the graph being judged: a node by its handle
/// (an index into a [`DependencyGraph`], a reference into a [`GraphIndex`] view) and the installed
/// versions of a package id, which a refusal lists.
pub(crate) trait Targets {
    /// How a node is named.
    type Handle: Copy;
    /// The node `h` names.
    fn node(&self, h: Self::Handle) -> &PackageNode;
    /// Every installed version of `id`, oldest first.
    fn installed(&self, id: &PackageId) -> Vec<Version>;
}

impl Targets for DependencyGraph {
    type Handle = usize;

    fn node(&self, h: usize) -> &PackageNode {
        &self.nodes[h]
    }

    fn installed(&self, id: &PackageId) -> Vec<Version> {
        self.versions(id)
            .iter()
            .map(|n| n.version.clone())
            .collect()
    }
}

/// Checks every requirement of the enabled `node`, in manifest order (ordinary dependencies,
/// then module dependencies), recording each failure in `problems` and each runtime edge that
/// resolves with `edge`. `slot` is asked once per requirement, in that order, where the target
/// stands: `None` when no version of it is installed, `Some(None)` when none is enabled, and
/// `Some(Some(enabled))` otherwise.
pub(crate) fn check_requirements<T: Targets>(
    graph: &T,
    node: &PackageNode,
    mut slot: impl FnMut(&PackageId) -> Option<Option<T::Handle>>,
    mut edge: impl FnMut(T::Handle),
    problems: &mut Vec<GraphProblem>,
) {
    for dep in &node.dependencies {
        let requirement = || Requirement::Package(dep.clone());
        let found = slot(&dep.package_id);
        if let Some(t) = lookup(graph, node, &dep.package_id, found, requirement, problems) {
            edge(t);
            let target = graph.node(t);
            if !dep.range.contains(&target.version) {
                problems.push(GraphProblem::VersionOutOfRange {
                    dependent: node.node_ref(),
                    target: target.node_ref(),
                    requirement: requirement(),
                });
            }
        }
    }
    for dep in &node.module_dependencies {
        let found = slot(&dep.module_id);
        if !dep.is_runtime_edge() {
            if node.kind == PackageKind::Module {
                problems.push(GraphProblem::NonModuleAbiTag {
                    dependent: node.node_ref(),
                    target: dep.module_id.clone(),
                    requirement: Requirement::Module(dep.clone()),
                });
            }
            // In a kernel this is a provenance record: nothing to resolve.
            continue;
        }
        let requirement = || Requirement::Module(dep.clone());
        if let Some(t) = lookup(graph, node, &dep.module_id, found, requirement, problems) {
            edge(t);
            check_module_target(node, dep, graph.node(t), problems);
        }
    }
}

/// Resolves a requirement's target, whose place was already looked up, to its enabled version,
/// or records why it cannot.
fn lookup<T: Targets>(
    graph: &T,
    dependent: &PackageNode,
    target: &PackageId,
    found: Option<Option<T::Handle>>,
    requirement: impl Fn() -> Requirement,
    problems: &mut Vec<GraphProblem>,
) -> Option<T::Handle> {
    match found {
        None => {
            problems.push(GraphProblem::Missing {
                dependent: dependent.node_ref(),
                target: target.clone(),
                requirement: requirement(),
            });
            None
        }
        Some(Some(t)) => Some(t),
        Some(None) => {
            problems.push(GraphProblem::Disabled {
                dependent: dependent.node_ref(),
                target: target.clone(),
                requirement: requirement(),
                installed: graph.installed(target),
            });
            None
        }
    }
}

/// The packages whose installed versions make up the part of a graph in which an enabled
/// version can fail to load, given each enabled version's requirements (`enabled`: the
/// package, its ordinary and its module dependencies): each package whose enabled version
/// states a requirement (a provenance record included), and each package such a requirement
/// names. Every [`GraphProblem`] is a requirement's or a cycle's, and a cycle runs through
/// enabled versions with requirements, so the [`DependencyGraph::plan`] of the installed
/// versions of these packages blocks exactly the versions the plan of every installed version
/// blocks, in the same order, for the same reasons, with the same problems; a version outside
/// it has no problem of its own and nothing to be blocked by. This is what the opening check of
/// a store of 10,000 packages walks instead of all of them.
pub fn requirement_part<'a>(
    enabled: impl IntoIterator<Item = (&'a PackageId, &'a [Dependency], &'a [ModuleDependency])>,
) -> std::collections::BTreeSet<&'a PackageId> {
    let mut part = std::collections::BTreeSet::new();
    for (id, dependencies, module_dependencies) in enabled {
        if dependencies.is_empty() && module_dependencies.is_empty() {
            continue;
        }
        part.insert(id);
        part.extend(dependencies.iter().map(|d| &d.package_id));
        part.extend(module_dependencies.iter().map(|d| &d.module_id));
    }
    part
}

/// [`DependencyGraph::dependents`] of `id` among `nodes`, taken in the order given.
fn dependents_among<'a>(
    nodes: impl Iterator<Item = &'a PackageNode>,
    id: &PackageId,
) -> Vec<Dependent> {
    let mut out = Vec::new();
    for node in nodes.filter(|n| n.enabled && &n.id != id && n.requires(id)) {
        for (target, requirement) in node.protecting_requirements() {
            if target == id {
                out.push(Dependent {
                    node: node.node_ref(),
                    requirement,
                });
            }
        }
    }
    out
}

/// [`DependencyGraph::check_disable`] given the installed versions of `id` and a way to list its
/// enabled dependents.
fn disable_answer(
    id: &PackageId,
    versions: &[PackageNode],
    dependents: impl FnOnce() -> Vec<Dependent>,
) -> Result<(), DisableRefusal> {
    if versions.is_empty() {
        return Err(DisableRefusal::NotInstalled { id: id.clone() });
    }
    if !versions.iter().any(|n| n.enabled) {
        return Ok(());
    }
    let dependents = dependents();
    if dependents.is_empty() {
        Ok(())
    } else {
        Err(DisableRefusal::EnabledDependents {
            id: id.clone(),
            dependents,
        })
    }
}

/// [`DependencyGraph::check_remove`] given the installed versions of `id` and a way to list its
/// enabled dependents.
fn remove_answer(
    id: &PackageId,
    version: &Version,
    versions: &[PackageNode],
    dependents: impl FnOnce() -> Vec<Dependent>,
) -> Result<(), RemoveRefusal> {
    let Some(node) = versions.iter().find(|n| &n.version == version) else {
        return Err(RemoveRefusal::NotInstalled {
            id: id.clone(),
            version: version.clone(),
        });
    };
    if !node.enabled {
        return Ok(());
    }
    let dependents = dependents();
    if dependents.is_empty() {
        Ok(())
    } else {
        Err(RemoveRefusal::EnabledDependents {
            target: node.node_ref(),
            dependents,
        })
    }
}

/// [`DependencyGraph::check_rollback`] given what the rollback would break.
fn rollback_answer(
    id: &PackageId,
    version: &Version,
    problems: Vec<GraphProblem>,
) -> Result<(), RollbackRefusal> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RollbackRefusal::Incompatible {
            id: id.clone(),
            version: version.clone(),
            problems,
        })
    }
}

/// Checks a runtime module edge against the enabled version of its target, recording every
/// failed check.
fn check_module_target(
    dependent: &PackageNode,
    dep: &ModuleDependency,
    target: &PackageNode,
    problems: &mut Vec<GraphProblem>,
) {
    let requirement = || Requirement::Module(dep.clone());
    if target.kind != PackageKind::Module {
        problems.push(GraphProblem::NotAModule {
            dependent: dependent.node_ref(),
            target: target.node_ref(),
            requirement: requirement(),
            kind: target.kind,
        });
    } else if target.module_abi != Some(MODULE_ABI_V1) {
        // A kernel has no module ABI at all; that is already said by NotAModule above.
        problems.push(GraphProblem::WrongModuleAbi {
            dependent: dependent.node_ref(),
            target: target.node_ref(),
            requirement: requirement(),
            found: target.module_abi,
        });
    }
    if !dep.range.contains(&target.version) {
        problems.push(GraphProblem::VersionOutOfRange {
            dependent: dependent.node_ref(),
            target: target.node_ref(),
            requirement: requirement(),
        });
    }
    if let Some(expected) = dep
        .publisher_id
        .as_ref()
        .filter(|p| **p != target.publisher)
    {
        problems.push(GraphProblem::PublisherMismatch {
            dependent: dependent.node_ref(),
            target: target.node_ref(),
            requirement: requirement(),
            expected: expected.clone(),
            found: target.publisher.clone(),
        });
    }
    if let Some(expected) = dep.sha256.filter(|d| *d != target.payload_digest) {
        problems.push(GraphProblem::DigestMismatch {
            dependent: dependent.node_ref(),
            target: target.node_ref(),
            requirement: requirement(),
            expected,
            found: target.payload_digest,
        });
    }
}

/// The checked requirements and resolved runtime edges of the enabled nodes.
///
/// Edges are stored in compressed rows: the successors (dependencies) of node `u` are
/// `succ[start[u]..start[u + 1]]`, and its edge problems are
/// `problems[problem_start[u]..problem_start[u + 1]]`. Disabled nodes have empty rows.
struct Resolved {
    start: Vec<usize>,
    succ: Vec<usize>,
    problems: Vec<GraphProblem>,
    problem_start: Vec<usize>,
}

impl Resolved {
    fn successors(&self, u: usize) -> &[usize] {
        &self.succ[self.start[u]..self.start[u + 1]]
    }
}

/// The reverse edges (dependents) in compressed rows, each row in ascending node order.
fn reverse(n: usize, start: &[usize], succ: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut pred_start = vec![0usize; n + 1];
    for &w in succ {
        pred_start[w + 1] += 1;
    }
    for i in 0..n {
        pred_start[i + 1] += pred_start[i];
    }
    let mut fill = pred_start.clone();
    let mut pred = vec![0usize; succ.len()];
    for u in 0..n {
        for &w in &succ[start[u]..start[u + 1]] {
            pred[fill[w]] = u;
            fill[w] += 1;
        }
    }
    (pred_start, pred)
}

/// Finds one cycle in every strongly connected component that has one (more than one node, or a
/// node that requires itself), with Tarjan's algorithm run iteratively so that a long dependency
/// chain cannot exhaust the stack. Each cycle starts and ends at the component's smallest node,
/// and the cycles come sorted by that node.
fn find_cycles(n: usize, g: &Resolved) -> Vec<Vec<usize>> {
    let mut index = vec![NONE; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut component = vec![NONE; n];
    let mut stack: Vec<usize> = Vec::new();
    let mut frames: Vec<(usize, usize)> = Vec::new();
    let mut next_index = 0usize;
    let mut cyclic: Vec<usize> = Vec::new();

    for root in 0..n {
        if index[root] != NONE || g.start[root] == g.start[root + 1] {
            // Visited already, or a node without edges: alone it can never be on a cycle, and
            // nodes that reach it are visited from their own roots.
            continue;
        }
        index[root] = next_index;
        low[root] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root] = true;
        frames.push((root, g.start[root]));
        while let Some(frame) = frames.last_mut() {
            let v = frame.0;
            if frame.1 < g.start[v + 1] {
                let w = g.succ[frame.1];
                frame.1 += 1;
                if index[w] == NONE {
                    index[w] = next_index;
                    low[w] = next_index;
                    next_index += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    frames.push((w, g.start[w]));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            frames.pop();
            if let Some(&(parent, _)) = frames.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut members = 0usize;
                let mut smallest = v;
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component[w] = v;
                    members += 1;
                    smallest = smallest.min(w);
                    if w == v {
                        break;
                    }
                }
                if members > 1 || g.successors(v).contains(&v) {
                    cyclic.push(smallest);
                }
            }
        }
    }

    cyclic.sort_unstable();
    cyclic
        .into_iter()
        .filter_map(|s| {
            let c = component[s];
            cycle_path(s, g, |u| component[u] == c)
        })
        .collect()
}

/// The shortest cycle from `start` back to itself through nodes that `allowed` admits, found by
/// breadth-first search, as `[start, .., start]`; `None` when there is none.
fn cycle_path(start: usize, g: &Resolved, allowed: impl Fn(usize) -> bool) -> Option<Vec<usize>> {
    // The search touches only the component, so a map keeps it linear in the component's size
    // rather than the graph's.
    let mut parent: HashMap<usize, usize> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(x) = queue.pop_front() {
        for &w in g.successors(x) {
            if w == start {
                let mut path = vec![start, x];
                let mut at = x;
                while let Some(&p) = parent.get(&at) {
                    path.push(p);
                    at = p;
                }
                // `path` now runs start, x, .., start backwards ([start, start] for a self-edge).
                path.reverse();
                return Some(path);
            }
            if allowed(w) && !parent.contains_key(&w) {
                parent.insert(w, x);
                queue.push_back(w);
            }
        }
    }
    None
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&item.to_string());
    }
    out
}

fn join_path(path: &[NodeRef]) -> String {
    let mut out = String::new();
    for (i, item) in path.iter().enumerate() {
        if i > 0 {
            out.push_str(" -> ");
        }
        out.push_str(&item.to_string());
    }
    out
}

fn join_problems(problems: &[GraphProblem]) -> String {
    let mut out = String::new();
    for (i, item) in problems.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(&item.to_string());
    }
    out
}

fn describe_module_abi(found: Option<u32>) -> String {
    match found {
        Some(abi) => format!("declares module ABI {abi}"),
        None => "declares no module ABI".to_owned(),
    }
}

fn abi_tag_of(requirement: &Requirement) -> &str {
    match requirement {
        Requirement::Module(d) => &d.abi_tag,
        Requirement::Package(_) => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> PackageNode {
        PackageNode {
            id: PackageId::new(id).unwrap(),
            version: Version::new(1, 0, 0),
            kind: PackageKind::Kernel,
            module_abi: None,
            publisher: PublisherId::new("org.example").unwrap(),
            payload_digest: Sha256Digest::of(id.as_bytes()),
            enabled: true,
            dependencies: Vec::new(),
            module_dependencies: Vec::new(),
        }
    }

    #[test]
    fn graph_id_table_follows_the_chain_when_hashes_collide() {
        let nodes: Vec<PackageNode> = ["a", "b", "c"].into_iter().map(node).collect();
        let mut table = IdTable::with_capacity(nodes.len());
        for i in 0..nodes.len() {
            let slot = IdSlot {
                first: i,
                len: 1,
                enabled: Some(i),
                next_same_hash: None,
            };
            table.insert_hashed(7, slot);
        }
        for (i, n) in nodes.iter().enumerate() {
            assert_eq!(table.position_hashed(&nodes, &n.id, 7), Some(i));
        }
        let absent = PackageId::new("d").unwrap();
        assert_eq!(table.position_hashed(&nodes, &absent, 7), None);
        assert_eq!(table.position_hashed(&nodes, &nodes[0].id, 8), None);
    }

    #[test]
    fn graph_id_hash_spreads_ids_that_differ_only_at_the_end() {
        // Hash tables index by the low bits. Without a finaliser, ids that differ only in their
        // last bytes would share those bits and pile into few buckets.
        let buckets: std::collections::HashSet<u64> = (0..10_000)
            .map(|i| hash_id(&PackageId::new(format!("bench.pkg{i:05}")).unwrap()) & 0xfff)
            .collect();
        // A uniform hash fills about 3,740 of 4,096 buckets with 10,000 keys.
        assert!(
            buckets.len() > 3_500,
            "only {} of 4096 buckets used",
            buckets.len()
        );
    }
}
