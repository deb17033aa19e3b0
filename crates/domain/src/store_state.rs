//! The package manager's durable truth: which package versions are recorded, the lifecycle state
//! of each, which one is current, which one a rollback returns to, and the generation number that
//! orders committed changes.
//!
//! The store persists a [`StoreState`] as a checkpoint and a log of the changes after it (see
//! the `store_log` module), so every rule that must survive a crash lives here, as pure data
//! and pure decisions:
//!
//! - Each package id has at most one *current* version (lifecycle state `enabled` or `disabled`);
//!   older published versions stay installed as `superseded` rollback candidates, and one of them
//!   may be named the `previous` version that [`StoreState::rollback`] restores.
//! - Versions are immutable. A removed version keeps a tombstone record (state `removed`, its
//!   payload digest, no tree on disk), so that the same version can never come back with other
//!   content, even after removal. Two versions that differ only in build metadata (`1.0.0+a`,
//!   `1.0.0+b`) count as the same version for this rule, since semantic versioning gives them
//!   equal precedence.
//! - A record holds what the package manager needs without opening any archive: the SHA-256 of
//!   the canonical signed payload, the kind and the publisher, and (since it was recorded) what
//!   the dependency graph and the impl-id claims read of the manifest ([`ManifestFacts`]), so
//!   that checking a change reads the registry and not every installed tree. Everything else
//!   about a version (artifacts, entry, signatures) is read from the `.gkmetadata` file inside
//!   its installed tree when needed, and its payload digest must equal the recorded one, which
//!   catches a tree altered after installation. The facts are copied from the authenticated
//!   manifest at publication; the full check compares them with the signed metadata again and
//!   corrects a record that disagrees.
//!
//! The transition methods ([`StoreState::publish`], [`StoreState::enable`], ...) change a
//! draft that the app then hands to the store in a single transaction; none of them touches the
//! generation, which belongs to the commit (see [`StoreState::successor`]). Each refuses with a
//! typed [`StoreStateError`] and leaves the state unchanged when it refuses.
//!
//! Two more facts ride on the same commit point. A version that failed re-verification carries a
//! [`Taint`] (why, and which file) until a genuine copy replaces its files or it is removed;
//! it can be neither enabled nor rolled back to meanwhile. And the store state records the trust
//! file's [`TrustAnchor`] (its binding, its digest and every revocation), so that the trust file
//! cannot be swapped, lost or rolled back without the store noticing.
//!
//! The file format is strict JSON read with [`crate::json`] (duplicate keys, unknown fields and
//! `null` are refused), marked `"guild_registry": 1`; the file keeps the name `registry.json`
//! and its members their first names (a taint is a version's `quarantine` member), so that
//! stores written by earlier builds read unchanged. The `trust` and `quarantine` members are
//! optional, so store states written before they existed still read; a build that predates them
//! refuses a store state that has them (an unknown field) instead of ignoring them. A file that
//! cannot be read is an error with its reason, never an empty store state.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use std::sync::Arc;

use crate::chunk_map::ChunkMap;
use crate::dependency::{Dependency, ModuleDependency};
use crate::fleet::{FleetMembership, PolicyRecord, SignedRoot};
use crate::graph::PackageNode;
use crate::ids::ImplId;
use crate::ids::{IdError, PackageId, PackageKind, PublisherId, Sha256Digest};
use crate::json::{self, BorrowedValue, Cursor, Integer, JsonError, JsonPath, PathSegment, Value};
use crate::lifecycle::{transition, Event, IllegalTransition, State};
use crate::manifest::{SignatureAlgorithm, SignatureEntry};
use crate::manifest_facts::ManifestFacts;
use crate::trust::{is_store_id, TrustAnchor, TrustBinding};
use crate::vec_map::VecMap;
use crate::version::Version;
use crate::version::VersionRange;
use listing::{CheckpointParts, IndexedWriter, ListingRow};

mod bytes;
pub mod listing;
mod quick;

/// The registry file format of a store without a log (`"guild_registry": 1`): the file is the
/// whole committed state.
pub const REGISTRY_FORMAT_V1: u64 = 1;

/// The format of a checkpoint (`"guild_registry": 2`): the same document, but only the state at
/// its generation; the commits after it are frames of the store state log
/// (the `store_log` module). A build that knows only format 1 refuses it rather than read a
/// stale state.
pub const REGISTRY_FORMAT_V2: u64 = 2;

/// The format of a checkpoint with an index (`"guild_registry": 3`): a format-2 checkpoint
/// that carries, before its packages, the row a listing shows of each package and the byte
/// range of its record ([`listing`]), so that a listing reads the index alone and a
/// reader of one package one record. Every writer writes it; formats 1 and 2 are still read.
pub const REGISTRY_FORMAT_V3: u64 = 3;

/// The format of a log frame without a retrust (`"guild_registry_delta": 1`,
/// [`crate::store_log`]). Kept here, beside the decode error that names it.
pub const REGISTRY_DELTA_FORMAT_V1: u64 = 1;

/// The format of a log frame with a retrust (`"guild_registry_delta": 2`): builds that read
/// format 1 only refuse it, instead of reading it without the versions it re-records.
pub const REGISTRY_DELTA_FORMAT_V2: u64 = 2;

/// The formats of a registry file this build reads.
const FORMATS: [u64; 3] = [REGISTRY_FORMAT_V1, REGISTRY_FORMAT_V2, REGISTRY_FORMAT_V3];

const TOP_FIELDS: &[&str] = &["guild_registry", "generation", "trust", "fleet", "packages"];
/// A format-3 checkpoint's members.
const TOP_FIELDS_V3: &[&str] = &[
    "guild_registry",
    "generation",
    "trust",
    "fleet",
    "index",
    "packages",
];

/// Whether member `key` of a format-3 checkpoint comes after the last one read, in the order
/// every writer writes them ([`TOP_FIELDS_V3`]), with `order` (0 before the first) then moved
/// to it. Every reader holds a format-3 document to that order, so that what one reader
/// refuses for it, the others refuse too; a key not among them is left to the reader.
fn in_writer_order(order: &mut usize, key: &str) -> bool {
    match TOP_FIELDS_V3.iter().position(|k| *k == key) {
        Some(at) => at >= std::mem::replace(order, at),
        None => true,
    }
}
const FLEET_FIELDS: &[&str] = &["root", "policy"];
const POLICY_RECORD_FIELDS: &[&str] = &["version", "sha256", "expires"];
const PACKAGE_FIELDS: &[&str] = &["id", "previous", "versions"];
const VERSION_FIELDS: &[&str] = &[
    "version",
    "state",
    "kind",
    "publisher",
    "payload_sha256",
    "quarantine",
    "trusted_under",
    "signatures",
    "signed_by",
    "manifest",
];
const SIGNATURE_FIELDS: &[&str] = &["key_id", "algorithm", "signature"];
const TAINT_FIELDS: &[&str] = &["reason", "file"];
const TRUST_FIELDS: &[&str] = &[
    "store_id",
    "generation",
    "sha256",
    "revoked_keys",
    "revoked_digests",
];
const REVOKED_KEY_FIELDS: &[&str] = &["key_id", "reason"];
const REVOKED_DIGEST_FIELDS: &[&str] = &["sha256", "reason"];

/// Why an installed version is tainted (not to be confused with the crash quarantine, which
/// refuses to load a build whose `init` killed its process): it failed re-verification (its files no longer match
/// its signed manifest, or its signature no longer authenticates it). It stays disabled, and
/// cannot be enabled or rolled back to, until a genuine copy is installed over it or it is
/// removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    /// What the re-verification found, in one line.
    pub reason: String,
    /// The file concerned, relative to the version's installed tree, when one is known.
    pub file: Option<String>,
}

/// What the store state knows about one recorded package version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRecord {
    /// SHA-256 of the canonical signed payload: the version's identity for the immutability rule
    /// and what dependents' digest pins compare with.
    pub payload_digest: Sha256Digest,
    /// `gkernel` or `gkmodule`.
    pub kind: PackageKind,
    /// The publisher the version was signed as; revoking that publisher's key affects it.
    pub publisher: PublisherId,
    /// Where the version stands. Only `enabled`, `disabled`, `superseded` and `removed` are ever
    /// recorded: `staged` and `discarded` versions were never published.
    pub state: State,
    /// Set while the version is tainted; never on an enabled or removed version.
    pub taint: Option<Taint>,
    /// The trust file (by the SHA-256 of its bytes, [`TrustAnchor::file_digest`]) under which the
    /// version's signatures last verified. While the store state's trust anchor records the same
    /// digest, no key was added, removed or revoked since, so opening the store need not check
    /// the signatures again. `None` in stores written before it was recorded: checked at the
    /// next open, which records it.
    pub trusted_under: Option<Sha256Digest>,
    /// Signatures over the same payload that arrived after the version was installed (the
    /// publisher re-signed it with a new key, and the re-signed file was installed again), in
    /// the order they were recorded. The installed `.gkmetadata` is never rewritten: the
    /// version's signatures are those of that file followed by these, none by the same key
    /// twice ([`StoreState::add_signatures`]). Empty in stores written before it was recorded,
    /// and written only when non-empty, so that such records keep their bytes.
    pub signatures: Vec<SignatureEntry>,
    /// The keys whose signatures verified when the version was published, in file order: what
    /// `guild list` shows without reading the version's files. Empty in stores written before
    /// it was recorded.
    pub signed_by: Vec<Sha256Digest>,
    /// What the dependency graph and the impl-id claims read of its signed manifest
    /// ([`ManifestFacts`]), so that checking a change reads the registry and not every
    /// version's `.gkmetadata`. `None` in stores written before it was recorded (the metadata
    /// is read instead), and then not written, so that such records keep their bytes.
    pub facts: Option<Arc<ManifestFacts>>,
}

/// The facts about a version being published, as verification established them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVersion {
    /// SHA-256 of its canonical payload.
    pub payload_digest: Sha256Digest,
    /// Kernel plugin or runtime module.
    pub kind: PackageKind,
    /// Its publisher.
    pub publisher: PublisherId,
    /// The keys whose signatures verified when it was published, in file order.
    pub signed_by: Vec<Sha256Digest>,
    /// What the graph and the claims read of its manifest, recorded with it.
    pub facts: Option<ManifestFacts>,
}

/// Every recorded version of one package id, and its rollback target.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PackageRecord {
    versions: VecMap<Version, VersionRecord>,
    previous: Option<Version>,
}

impl PackageRecord {
    /// Every recorded version, removed ones included, in ascending version order.
    pub fn versions(&self) -> impl Iterator<Item = (&Version, &VersionRecord)> + '_ {
        self.versions.iter()
    }

    /// The record of `version`, if there is one.
    pub fn get(&self, version: &Version) -> Option<&VersionRecord> {
        self.versions.get(version)
    }

    /// The versions whose trees are on disk (enabled, disabled or superseded), ascending.
    pub fn installed(&self) -> impl Iterator<Item = (&Version, &VersionRecord)> + '_ {
        self.versions.iter().filter(|(_, r)| r.state.is_installed())
    }

    /// The current version (enabled or disabled), if any.
    pub fn current(&self) -> Option<(&Version, &VersionRecord)> {
        self.versions.iter().find(|(_, r)| r.state.is_current())
    }

    /// The enabled version, if any.
    pub fn enabled(&self) -> Option<&Version> {
        self.current()
            .filter(|(_, r)| r.state.is_enabled())
            .map(|(v, _)| v)
    }

    /// The version a rollback restores, if any. It is always an installed, superseded version.
    pub fn previous(&self) -> Option<&Version> {
        self.previous.as_ref()
    }

    /// Every version's record to write to, for a change that keeps every invariant (a
    /// [`crate::store_log::Retrust`]).
    pub(crate) fn versions_mut(&mut self) -> impl Iterator<Item = (&Version, &mut VersionRecord)> {
        self.versions.iter_mut()
    }
}

/// What publishing a given payload as `id@version` would mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishKind {
    /// The version is not installed: stage it and commit. This is also the answer for a version
    /// that was removed earlier and is offered again with the very same payload.
    New,
    /// This exact payload is already installed as this version: nothing to do, and no
    /// transaction should be committed.
    IdenticalNoOp,
    /// This exact payload is installed as this version, but another version is current (after a
    /// rollback, say): the installed version becomes current and enabled again, and the one
    /// that was current becomes the rollback target. Nothing is staged: its tree is in place.
    Reactivated,
}

/// A version was offered with a payload other than the one already recorded for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot publish {id}@{version}: version {recorded_version} is already recorded with payload \
     digest {recorded}, and the offered payload has digest {offered}; published versions are \
     immutable"
)]
pub struct ImmutableVersionConflict {
    /// The package.
    pub id: PackageId,
    /// The version as offered.
    pub version: Version,
    /// The recorded version of equal precedence; it differs from `version` only in build
    /// metadata, if at all.
    pub recorded_version: Version,
    /// The payload digest recorded for that version.
    pub recorded: Sha256Digest,
    /// The digest of the payload offered.
    pub offered: Sha256Digest,
}

/// How a publication should be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishOptions {
    /// Whether the new version starts enabled.
    pub enable: bool,
    /// Whether a version older than the current one may be published. Rollback is the normal way
    /// back; this is the explicit escape hatch.
    pub allow_downgrade: bool,
}

/// What a successful [`StoreState::publish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// New, or identical to an installed one (nothing changed).
    pub kind: PublishKind,
    /// The version that was current and is now superseded (and the new rollback target).
    pub superseded: Option<Version>,
}

/// What a successful [`StoreState::rollback`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolledBack {
    /// The version that was current before, now superseded; `None` when none was current.
    pub from: Option<Version>,
    /// The restored version, now enabled.
    pub to: Version,
}

/// Why a store state change was refused. The state is unchanged after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreStateError {
    /// The version is recorded with another payload.
    #[error(transparent)]
    ImmutableVersion(#[from] Box<ImmutableVersionConflict>),
    /// The version is older than the current one and no downgrade was asked for.
    #[error(
        "cannot publish {id}@{offered}: it is older than the current version {current}; use \
         rollback, or ask for a downgrade explicitly"
    )]
    Downgrade {
        /// The package.
        id: PackageId,
        /// The current version.
        current: Version,
        /// The version offered.
        offered: Version,
    },
    /// The package's installed versions are of another kind.
    #[error("cannot publish {id}@{version} as a {offered}: installed versions of {id} are {recorded} packages")]
    KindChanged {
        /// The package.
        id: PackageId,
        /// The version offered.
        version: Version,
        /// The kind of the installed versions.
        recorded: PackageKind,
        /// The kind offered.
        offered: PackageKind,
    },
    /// The package's installed versions belong to another publisher.
    #[error("cannot publish {id}@{version} as publisher {offered}: installed versions of {id} belong to {recorded}")]
    PublisherChanged {
        /// The package.
        id: PackageId,
        /// The version offered.
        version: Version,
        /// The publisher of the installed versions.
        recorded: PublisherId,
        /// The publisher offered.
        offered: PublisherId,
    },
    /// No version of the package is recorded.
    #[error("package {id} is not recorded")]
    UnknownPackage {
        /// The package.
        id: PackageId,
    },
    /// The version is not installed.
    #[error("{id}@{version} is not installed")]
    NotInstalled {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
    },
    /// No record of the version exists.
    #[error("{id}@{version} is not recorded")]
    NotRecorded {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
    },
    /// Only a removed version can be purged.
    #[error("{id}@{version} is {state}, not removed: remove it before purging its record")]
    NotRemoved {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
        /// Its state.
        state: State,
    },
    /// The package has no removed version to purge.
    #[error("{id} has no removed version to purge")]
    NothingToPurge {
        /// The package.
        id: PackageId,
    },
    /// The package has no enabled or disabled version.
    #[error("{id} has no current version")]
    NoCurrentVersion {
        /// The package.
        id: PackageId,
    },
    /// The package has no rollback target.
    #[error("{id} has no previous version to roll back to")]
    NoPreviousVersion {
        /// The package.
        id: PackageId,
    },
    /// The version is tainted: it failed re-verification and must be repaired first.
    #[error(
        "{id}@{version} is tainted: {}{}",
        .taint.reason,
        .taint.file.as_ref().map(|f| format!(" (file {f})")).unwrap_or_default()
    )]
    Tainted {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
        /// Why.
        taint: Taint,
    },
    /// The lifecycle does not allow the change from the version's state.
    #[error("{id}@{version}: {source}")]
    Illegal {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
        #[source]
        /// The refused transition.
        source: IllegalTransition,
    },
}

/// A store state that breaks one of its invariants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreStateInvariantError {
    /// A package without versions.
    #[error("{id} has no recorded versions")]
    EmptyPackage {
        /// The package.
        id: PackageId,
    },
    /// Two current versions of one package.
    #[error("{id} has two current versions, {first} and {second}; at most one may be enabled or disabled")]
    SeveralCurrent {
        /// The package.
        id: PackageId,
        /// One current version.
        first: Version,
        /// The other.
        second: Version,
    },
    /// A state that only exists during a transaction was written.
    #[error("{id}@{version} is recorded as {state}, which is never persisted")]
    UnpersistedState {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
        /// Its state.
        state: State,
    },
    /// The rollback target is not an installed, superseded version.
    #[error("{id} names {version} as its previous version, but that version is {}", .state.map_or("not recorded", State::as_str))]
    PreviousNotRollbackTarget {
        /// The package.
        id: PackageId,
        /// The version named as previous.
        version: Version,
        /// Its recorded state, if any.
        state: Option<State>,
    },
    /// A taint on a version that is enabled or not installed.
    #[error("{id}@{version} is tainted but {}", .state.as_str())]
    TaintOnState {
        /// The package.
        id: PackageId,
        /// The version.
        version: Version,
        /// Its state, which a tainted version cannot have.
        state: State,
    },
    /// Two recorded versions that differ only in build metadata.
    #[error("{id} records {first} and {second}, which differ only in build metadata")]
    SamePrecedence {
        /// The package.
        id: PackageId,
        /// One version.
        first: Version,
        /// The other.
        second: Version,
    },
}

/// Why a store state value could not be read from a JSON document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    /// A required field is absent.
    #[error("required field is missing")]
    Missing,
    /// A field the format does not define.
    #[error("unknown field")]
    Unknown,
    /// A value of the wrong JSON type.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The JSON type the field needs.
        expected: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
    /// A value that breaks the field's rules.
    #[error("{detail}")]
    Invalid {
        /// What is wrong.
        detail: String,
    },
    /// A value repeated where values must be unique.
    #[error("{what} {value} appears more than once")]
    Duplicate {
        /// What kind of value.
        what: &'static str,
        /// The repeated value.
        value: String,
    },
}

/// Why bytes are not a store state this build can use. The store reports it with the file's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreStateDecodeError {
    /// The bytes are not strict JSON.
    #[error("not strict JSON: {0}")]
    Json(#[from] JsonError),
    /// The document has no store state format marker.
    #[error(
        "not a store state: the top level is not an object with a \"guild_registry\" format marker"
    )]
    NotARegistry,
    /// A store state format this build cannot read.
    #[error(
        "store state format {found} is not supported; this build reads formats {REGISTRY_FORMAT_V1} (a whole store state), {REGISTRY_FORMAT_V2} (a checkpoint) and {REGISTRY_FORMAT_V3} (a checkpoint with an index)"
    )]
    UnsupportedFormat {
        /// The format found.
        found: String,
    },
    /// A log frame with no delta format marker.
    #[error(
        "not a log frame: the top level is not an object with a \"guild_registry_delta\" format marker"
    )]
    NotADelta,
    /// A log frame format this build cannot read.
    #[error(
        "log frame format {found} is not supported; this build reads formats {} (changes) and {} (changes with a retrust)",
        REGISTRY_DELTA_FORMAT_V1,
        REGISTRY_DELTA_FORMAT_V2
    )]
    UnsupportedDeltaFormat {
        /// The format found.
        found: String,
    },
    /// A field is missing or malformed.
    #[error("{problem} at {path}")]
    Field {
        /// Where.
        path: JsonPath,
        /// What is wrong.
        problem: FieldProblem,
    },
    /// The store state decodes but breaks an invariant.
    #[error("store state breaks an invariant: {0}")]
    Invariant(#[from] StoreStateInvariantError),
}

/// The whole store state: every recorded package and the generation of the last committed change.
///
/// Each package's record sits behind an [`Arc`] and is copied only when a change writes to it, so
/// that [`StoreState::successor`] copies one pointer per package and a draft shares every record
/// it does not change with the state it came from (comparing two such records short-cuts on the
/// pointer).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreState {
    generation: u64,
    trust: Option<TrustAnchor>,
    fleet: Option<Arc<FleetMembership>>,
    packages: ChunkMap<PackageId, Arc<PackageRecord>>,
}

impl StoreState {
    /// An empty store state at generation 0, as a new store starts.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of committed transactions that led here.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A copy with the generation advanced by one: the draft of the next transaction. At
    /// `u64::MAX` the generation stays put, and the store refuses the transaction because its
    /// generation does not advance.
    pub fn successor(&self) -> Self {
        StoreState {
            generation: self.generation.saturating_add(1),
            trust: self.trust.clone(),
            fleet: self.fleet.clone(),
            packages: self.packages.clone(),
        }
    }

    /// What the store state records about the trust file, if it records one (a new store, or one
    /// written before trust files were bound, does not).
    pub fn trust_anchor(&self) -> Option<&TrustAnchor> {
        self.trust.as_ref()
    }

    /// Records `anchor` for the trust file written in the same transaction.
    pub fn set_trust_anchor(&mut self, anchor: TrustAnchor) {
        self.trust = Some(anchor);
    }

    /// The fleet this store follows, if it joined one: the root it trusts and the last policy
    /// it accepted.
    pub fn fleet(&self) -> Option<&FleetMembership> {
        self.fleet.as_deref()
    }

    /// Records the store's fleet membership. A store never leaves a fleet through a commit:
    /// there is no way to clear it.
    pub fn set_fleet(&mut self, fleet: FleetMembership) {
        self.fleet = Some(Arc::new(fleet));
    }

    /// Every tainted version, by id then version.
    pub fn tainted(&self) -> impl Iterator<Item = (&PackageId, &Version, &Taint)> + '_ {
        self.packages.iter().flat_map(|(id, p)| {
            p.versions
                .iter()
                .filter_map(move |(v, r)| r.taint.as_ref().map(|q| (id, v, q)))
        })
    }

    /// Taints installed version `id@version`, disabling it first if it is enabled.
    pub fn taint(
        &mut self,
        id: &PackageId,
        version: &Version,
        taint: Taint,
    ) -> Result<(), StoreStateError> {
        let state = self
            .record(id, version)
            .filter(|r| r.state.is_installed())
            .map(|r| r.state)
            .ok_or_else(|| StoreStateError::NotInstalled {
                id: id.clone(),
                version: version.clone(),
            })?;
        if state.is_enabled() {
            self.disable(id)?;
        }
        if let Some(r) = self
            .packages
            .get_mut(id)
            .map(Arc::make_mut)
            .and_then(|p| p.versions.get_mut(version))
        {
            r.taint = Some(taint);
        }
        Ok(())
    }

    /// Records what installed version `id@version`'s authenticated manifest says the graph and
    /// the claims read ([`VersionRecord::facts`]): at publication, and when the full check finds
    /// the record disagreeing with the signed metadata (the record is what was wrong). Answers
    /// whether that changed anything.
    pub fn set_facts(&mut self, id: &PackageId, version: &Version, facts: ManifestFacts) -> bool {
        let changes = self
            .record(id, version)
            .is_some_and(|r| r.state.is_installed() && r.facts.as_deref() != Some(&facts));
        if changes {
            if let Some(r) = self.record_mut(id, version) {
                r.facts = Some(Arc::new(facts));
            }
        }
        changes
    }

    /// The record of `id@version`, made this state's own first (the package's record is
    /// copied when another state shares it).
    fn record_mut(&mut self, id: &PackageId, version: &Version) -> Option<&mut VersionRecord> {
        self.packages
            .get_mut(id)
            .map(Arc::make_mut)
            .and_then(|p| p.versions.get_mut(version))
    }

    /// Records that the signatures of installed version `id@version` verified under the trust
    /// file with digest `trust` ([`VersionRecord::trusted_under`]). Answers whether the record
    /// changed (false when it already said so, or when the version is not installed).
    pub fn set_trusted_under(
        &mut self,
        id: &PackageId,
        version: &Version,
        trust: Sha256Digest,
    ) -> bool {
        // Looked at before the package's record is made this state's own: one that already
        // says so is not copied.
        let changes = self
            .record(id, version)
            .is_some_and(|r| r.state.is_installed() && r.trusted_under != Some(trust));
        if changes {
            if let Some(r) = self.record_mut(id, version) {
                r.trusted_under = Some(trust);
            }
        }
        changes
    }

    /// Records `signatures` (over the payload of installed version `id@version`, already
    /// verified by the caller) beside the version's own ([`VersionRecord::signatures`]), leaving
    /// out every one by a key in `known` (the key ids of the installed `.gkmetadata`'s
    /// signatures) or recorded already. Answers how many were added (0 when the version is not
    /// installed).
    pub fn add_signatures(
        &mut self,
        id: &PackageId,
        version: &Version,
        known: &[Sha256Digest],
        signatures: &[SignatureEntry],
    ) -> usize {
        let Some(r) = self
            .packages
            .get_mut(id)
            .map(Arc::make_mut)
            .and_then(|p| p.versions.get_mut(version))
            .filter(|r| r.state.is_installed())
        else {
            return 0;
        };
        let mut added = 0;
        for sig in signatures {
            let seen =
                known.contains(&sig.key_id) || r.signatures.iter().any(|s| s.key_id == sig.key_id);
            if !seen {
                r.signatures.push(sig.clone());
                added += 1;
            }
        }
        added
    }

    /// Lifts the taint of `id@version`, once its files were replaced by a verified copy.
    /// Answers whether there was one.
    pub fn clear_taint(&mut self, id: &PackageId, version: &Version) -> bool {
        self.packages
            .get_mut(id)
            .map(Arc::make_mut)
            .and_then(|p| p.versions.get_mut(version))
            .and_then(|r| r.taint.take())
            .is_some()
    }

    /// Refuses a change that would load `id@version` while it is tainted.
    fn refuse_tainted(&self, id: &PackageId, version: &Version) -> Result<(), StoreStateError> {
        match self.record(id, version).and_then(|r| r.taint.as_ref()) {
            Some(q) => Err(StoreStateError::Tainted {
                id: id.clone(),
                version: version.clone(),
                taint: q.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Every recorded package, by id.
    pub fn packages(&self) -> impl Iterator<Item = (&PackageId, &PackageRecord)> + '_ {
        self.packages.iter().map(|(id, p)| (id, &**p))
    }

    /// The map of package records as the state shares it with its drafts, for telling shared
    /// records apart without comparing them.
    pub(crate) fn shared_packages(&self) -> &ChunkMap<PackageId, Arc<PackageRecord>> {
        &self.packages
    }

    /// The map of package records to write to, for a change that keeps every invariant (a
    /// [`crate::store_log::Retrust`]).
    pub(crate) fn shared_packages_mut(&mut self) -> &mut ChunkMap<PackageId, Arc<PackageRecord>> {
        &mut self.packages
    }

    /// The record of package `id`, if any.
    pub fn package(&self, id: &PackageId) -> Option<&PackageRecord> {
        self.packages.get(id).map(|p| &**p)
    }

    /// The record of `id@version`, if any.
    pub fn record(&self, id: &PackageId, version: &Version) -> Option<&VersionRecord> {
        self.package(id)?.versions.get(version)
    }

    /// Whether `id@version` is installed (its tree must be on disk).
    pub fn is_installed(&self, id: &PackageId, version: &Version) -> bool {
        self.record(id, version)
            .is_some_and(|r| r.state.is_installed())
    }

    /// Every installed version (enabled, disabled or superseded), by id then version: exactly the
    /// package trees the store must hold.
    pub fn installed(&self) -> impl Iterator<Item = (&PackageId, &Version, &VersionRecord)> + '_ {
        self.packages
            .iter()
            .flat_map(|(id, p)| p.installed().map(move |(v, r)| (id, v, r)))
    }

    /// Every removed version still recorded (a tombstone, until it is purged): trees the store
    /// may still hold and is to delete.
    pub fn removed(&self) -> impl Iterator<Item = (&PackageId, &Version)> + '_ {
        self.packages.iter().flat_map(|(id, p)| {
            p.versions
                .iter()
                .filter(|(_, r)| r.state == State::Removed)
                .map(move |(v, _)| (id, v))
        })
    }

    /// Whether a payload with digest `digest` may be published as `id@version`, and whether it
    /// would change anything. Only the payload digest counts; signature bytes play no part, so
    /// re-signing the same payload is a no-op and changing any signed field is a conflict. (The
    /// conflict is boxed because it carries two versions and two digests.)
    pub fn check_publish(
        &self,
        id: &PackageId,
        version: &Version,
        digest: &Sha256Digest,
    ) -> Result<PublishKind, Box<ImmutableVersionConflict>> {
        let Some(package) = self.package(id) else {
            return Ok(PublishKind::New);
        };
        let same = package
            .versions
            .iter()
            .find(|(v, _)| v.cmp_precedence(version) == Ordering::Equal);
        match same {
            None => Ok(PublishKind::New),
            Some((v, r)) if v == version && r.payload_digest == *digest => {
                if r.state.is_installed() {
                    Ok(PublishKind::IdenticalNoOp)
                } else {
                    Ok(PublishKind::New)
                }
            }
            Some((v, r)) => Err(Box::new(ImmutableVersionConflict {
                id: id.clone(),
                version: version.clone(),
                recorded_version: v.clone(),
                recorded: r.payload_digest,
                offered: *digest,
            })),
        }
    }

    /// Records the publication of `id@version`: the new version becomes current (enabled or
    /// disabled as `options` say), and the version that was current is superseded and becomes the
    /// rollback target.
    ///
    /// Refused when the version conflicts with a recorded one ([`Self::check_publish`]), when it
    /// is older than the current version without `allow_downgrade`, or when its kind or
    /// publisher differs from the installed versions of the same id (a package id belongs to one
    /// publisher while any of its versions is installed). Publishing an identical payload that is
    /// already installed changes nothing and answers [`PublishKind::IdenticalNoOp`].
    pub fn publish(
        &mut self,
        id: &PackageId,
        version: &Version,
        new: NewVersion,
        options: PublishOptions,
    ) -> Result<Published, StoreStateError> {
        if self.check_publish(id, version, &new.payload_digest)? == PublishKind::IdenticalNoOp {
            let is_current = self
                .package(id)
                .and_then(PackageRecord::current)
                .is_some_and(|(v, _)| v == version);
            // A version that is not current comes back when the operator offers it again
            // enabled: forward (newer than the current one), or back with `allow_downgrade`.
            // Anything else stays a no-op, as offering the same bytes twice always was.
            let older = self
                .package(id)
                .and_then(PackageRecord::current)
                .is_some_and(|(cur, _)| version.cmp_precedence(cur) == Ordering::Less);
            if is_current || !options.enable || (older && !options.allow_downgrade) {
                return Ok(Published {
                    kind: PublishKind::IdenticalNoOp,
                    superseded: None,
                });
            }
            return self.reactivate(id, version, options);
        }
        let package = self.package(id);
        for (_, r) in package.iter().flat_map(|p| p.installed()) {
            if r.kind != new.kind {
                return Err(StoreStateError::KindChanged {
                    id: id.clone(),
                    version: version.clone(),
                    recorded: r.kind,
                    offered: new.kind,
                });
            }
            if r.publisher != new.publisher {
                return Err(StoreStateError::PublisherChanged {
                    id: id.clone(),
                    version: version.clone(),
                    recorded: r.publisher.clone(),
                    offered: new.publisher.clone(),
                });
            }
        }
        let supersede = Supersede::plan(package, id, version, options)?;
        let state = illegal(
            id,
            version,
            transition(
                State::Staged,
                Event::Commit {
                    enable: options.enable,
                },
            ),
        )?;

        // Every check passed: apply.
        let package = Arc::make_mut(self.packages.get_or_insert_with(id, Default::default));
        let superseded = supersede.apply(package);
        package.versions.insert(
            version.clone(),
            VersionRecord {
                payload_digest: new.payload_digest,
                kind: new.kind,
                publisher: new.publisher,
                state,
                taint: None,
                trusted_under: None,
                signatures: Vec::new(),
                signed_by: new.signed_by,
                facts: new.facts.map(Arc::new),
            },
        );
        Ok(Published {
            kind: PublishKind::New,
            superseded,
        })
    }

    /// Makes the installed, superseded `version` of `id` current and enabled again; the version
    /// that was current is superseded and becomes the rollback target. An older version than the
    /// current one needs `allow_downgrade`, as in a publication.
    fn reactivate(
        &mut self,
        id: &PackageId,
        version: &Version,
        options: PublishOptions,
    ) -> Result<Published, StoreStateError> {
        let package = self.package(id).ok_or_else(|| unknown(id))?;
        let state = package
            .versions
            .get(version)
            .map(|r| r.state)
            .ok_or_else(|| StoreStateError::NotInstalled {
                id: id.clone(),
                version: version.clone(),
            })?;
        let restored = illegal(id, version, transition(state, Event::Restore))?;
        self.refuse_tainted(id, version)?;
        let supersede = Supersede::plan(Some(package), id, version, options)?;

        let package = self
            .packages
            .get_mut(id)
            .map(Arc::make_mut)
            .ok_or_else(|| unknown(id))?;
        if package.previous.as_ref() == Some(version) {
            package.previous = None;
        }
        let superseded = supersede.apply(package);
        if let Some(r) = package.versions.get_mut(version) {
            r.state = restored;
        }
        Ok(Published {
            kind: PublishKind::Reactivated,
            superseded,
        })
    }

    /// Enables the current version of `id`, which must be disabled. Answers that version.
    pub fn enable(&mut self, id: &PackageId) -> Result<Version, StoreStateError> {
        if let Some((v, _)) = self.package(id).and_then(PackageRecord::current) {
            self.refuse_tainted(id, &v.clone())?;
        }
        self.change_current(id, Event::Enable)
    }

    /// Disables the current version of `id`, which must be enabled. Answers that version. Whether
    /// dependents allow it is the graph's question (`DependencyGraph::check_disable`).
    pub fn disable(&mut self, id: &PackageId) -> Result<Version, StoreStateError> {
        self.change_current(id, Event::Disable)
    }

    fn change_current(&mut self, id: &PackageId, event: Event) -> Result<Version, StoreStateError> {
        let package = self
            .packages
            .get_mut(id)
            .map(Arc::make_mut)
            .ok_or_else(|| unknown(id))?;
        let (version, record) = package
            .versions
            .iter_mut()
            .find(|(_, r)| r.state.is_current())
            .ok_or_else(|| StoreStateError::NoCurrentVersion { id: id.clone() })?;
        record.state = illegal(id, version, transition(record.state, event))?;
        Ok(version.clone())
    }

    /// Removes installed version `id@version`: its record becomes a `removed` tombstone (the
    /// digest stays, so the version can never return with other content) and the store deletes
    /// its tree. If it was the rollback target, there is none afterwards. Whether dependents and
    /// leases allow it is decided elsewhere (`DependencyGraph::check_remove`, the lease ledger).
    pub fn remove(&mut self, id: &PackageId, version: &Version) -> Result<(), StoreStateError> {
        let package = self
            .packages
            .get_mut(id)
            .map(Arc::make_mut)
            .ok_or_else(|| unknown(id))?;
        let record = package
            .versions
            .get_mut(version)
            .filter(|r| r.state.is_installed())
            .ok_or_else(|| StoreStateError::NotInstalled {
                id: id.clone(),
                version: version.clone(),
            })?;
        record.state = illegal(id, version, transition(record.state, Event::Remove))?;
        // Its files are gone, and with them what the taint was about.
        record.taint = None;
        if package.previous.as_ref() == Some(version) {
            package.previous = None;
        }
        Ok(())
    }

    /// Forgets removed versions of `id`: the one named, or every removed one when `version` is
    /// `None`. Answers the versions forgotten, ascending. A package left with no record at all
    /// is dropped from the store state.
    ///
    /// A removed version's record is what keeps the version from returning with other content,
    /// so purging gives that promise up on purpose: afterwards the version may be installed
    /// again with any payload its publisher signs. Only `removed` records can be purged (their
    /// trees are already gone); an installed version must be removed first, and nothing else
    /// about the package changes.
    pub fn purge(
        &mut self,
        id: &PackageId,
        version: Option<&Version>,
    ) -> Result<Vec<Version>, StoreStateError> {
        let package = self.package(id).ok_or_else(|| unknown(id))?;
        let purged: Vec<Version> = match version {
            Some(v) => match package.versions.get(v) {
                None => {
                    return Err(StoreStateError::NotRecorded {
                        id: id.clone(),
                        version: v.clone(),
                    })
                }
                Some(r) if r.state != State::Removed => {
                    return Err(StoreStateError::NotRemoved {
                        id: id.clone(),
                        version: v.clone(),
                        state: r.state,
                    })
                }
                Some(_) => vec![v.clone()],
            },
            None => package
                .versions
                .iter()
                .filter(|(_, r)| r.state == State::Removed)
                .map(|(v, _)| v.clone())
                .collect(),
        };
        if purged.is_empty() {
            return Err(StoreStateError::NothingToPurge { id: id.clone() });
        }
        let package = self
            .packages
            .get_mut(id)
            .map(Arc::make_mut)
            .ok_or_else(|| unknown(id))?;
        for v in &purged {
            package.versions.remove(v);
        }
        if package.versions.is_empty() {
            self.packages.remove(id);
        }
        Ok(purged)
    }

    /// Rolls `id` back to its previous version: that version is restored (enabled) and the
    /// current one, if any, is superseded. Afterwards there is no previous version, so a second
    /// rollback is refused rather than bouncing between two versions. Whether dependents accept
    /// the restored version is the graph's question (`DependencyGraph::check_rollback`).
    pub fn rollback(&mut self, id: &PackageId) -> Result<RolledBack, StoreStateError> {
        let package = self.package(id).ok_or_else(|| unknown(id))?;
        let to = package
            .previous
            .clone()
            .ok_or_else(|| StoreStateError::NoPreviousVersion { id: id.clone() })?;
        let to_state = package.versions.get(&to).map(|r| r.state).ok_or_else(|| {
            StoreStateError::NotInstalled {
                id: id.clone(),
                version: to.clone(),
            }
        })?;
        let restored = illegal(id, &to, transition(to_state, Event::Restore))?;
        self.refuse_tainted(id, &to)?;
        let from = match package.current() {
            Some((v, r)) => Some((
                v.clone(),
                illegal(id, v, transition(r.state, Event::Supersede))?,
            )),
            None => None,
        };

        let package = self
            .packages
            .get_mut(id)
            .map(Arc::make_mut)
            .ok_or_else(|| unknown(id))?;
        if let Some((v, state)) = &from {
            if let Some(r) = package.versions.get_mut(v) {
                r.state = *state;
            }
        }
        if let Some(r) = package.versions.get_mut(&to) {
            r.state = restored;
        }
        package.previous = None;
        Ok(RolledBack {
            from: from.map(|(v, _)| v),
            to,
        })
    }

    /// Checks every invariant; answers the first violation found, in id and version order.
    pub fn validate(&self) -> Result<(), StoreStateInvariantError> {
        self.packages
            .iter()
            .try_for_each(|(id, package)| validate_package(id, package))
    }

    /// Checks the invariants of the packages `ids` only (an id that is not recorded passes).
    /// Every invariant concerns one package, so after a change to a few packages this is as
    /// strong as [`Self::validate`] on the whole state, at the cost of the change.
    pub fn validate_packages<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a PackageId>,
    ) -> Result<(), StoreStateInvariantError> {
        ids.into_iter()
            .try_for_each(|id| match self.packages.get(id) {
                Some(package) => validate_package(id, package),
                None => Ok(()),
            })
    }

    /// Applies the change of one commit in place: `generation`, the new trust anchor if any, and
    /// the new record (or deletion) of each changed package. Refuses, leaving the state as it
    /// was, a change that is not for the next generation or that leaves a changed package
    /// breaking an invariant. The public form is `StoreState::apply`, beside the delta type.
    pub(crate) fn apply_change(
        &mut self,
        generation: u64,
        trust: Option<&TrustAnchor>,
        fleet: Option<&FleetMembership>,
        packages: &BTreeMap<PackageId, Option<Arc<PackageRecord>>>,
    ) -> Result<(), ApplyError> {
        let expected = self.generation.checked_add(1);
        if expected != Some(generation) {
            return Err(ApplyError::Generation {
                current: self.generation,
                delta: generation,
            });
        }
        let mut undo = Vec::with_capacity(packages.len());
        for (id, change) in packages {
            let before = match change {
                Some(record) => self.packages.insert(id.clone(), Arc::clone(record)),
                None => self.packages.remove(id),
            };
            undo.push((id, before));
        }
        if let Err(e) = self.validate_packages(packages.keys()) {
            for (id, before) in undo {
                match before {
                    Some(record) => self.packages.insert(id.clone(), record),
                    None => self.packages.remove(id),
                };
            }
            return Err(ApplyError::Invariant(e));
        }
        if let Some(anchor) = trust {
            self.trust = Some(anchor.clone());
        }
        if let Some(fleet) = fleet {
            self.fleet = Some(Arc::new(fleet.clone()));
        }
        self.generation = generation;
        Ok(())
    }

    /// The store state as a checkpoint (format 3, [`REGISTRY_FORMAT_V3`]): the document of
    /// [`Self::to_json`] under the other format marker, with the index of its packages, written
    /// as compact JSON.
    pub fn to_checkpoint_json(&self) -> Vec<u8> {
        self.to_json_as(REGISTRY_FORMAT_V3)
    }

    /// The state's generation, trust anchor and fleet membership, in a state that records no
    /// package.
    pub fn facts_only(&self) -> Self {
        StoreState {
            generation: self.generation,
            trust: self.trust.clone(),
            fleet: self.fleet.clone(),
            packages: ChunkMap::new(),
        }
    }

    /// A state of these store-wide facts that records no package.
    pub(crate) fn facts(
        generation: u64,
        trust: Option<TrustAnchor>,
        fleet: Option<FleetMembership>,
    ) -> Self {
        StoreState {
            generation,
            trust,
            fleet: fleet.map(Arc::new),
            packages: ChunkMap::new(),
        }
    }

    /// Reads a registry file of any format, strictly, and answers it with its format.
    pub fn from_any_json(bytes: &[u8]) -> Result<(Self, u64), StoreStateDecodeError> {
        Self::from_json_of(bytes, &FORMATS)
    }

    /// [`Self::from_any_json`] for a reader of one package (`guild status ID`): the state holds
    /// package `only` (if recorded) and the store-wide facts (generation, trust anchor, fleet),
    /// and no other package. Every other package's value is passed over without being built
    /// (`json::Cursor::skip`), so that the cost is a scan of the file, not a decode of the store.
    ///
    /// What is refused is what [`Self::from_any_json`] refuses, except inside the packages
    /// passed over: there the JSON grammar is still checked in full (a truncated, zeroed or
    /// otherwise malformed file is refused with the same error, the full reader naming it), but
    /// not their fields (unknown or duplicate members, an invalid id, version or digest, a broken
    /// invariant, a second record for the same id). Such a file is one no writer produced; the
    /// next full reader or writer refuses it, and a reader of one package answers nothing about
    /// the packages it did not read.
    ///
    /// A checkpoint with an index (format 3) is read through it: the head, the index, and the
    /// one record the index points at, which must be package `only`'s; the other records are not
    /// read at all.
    pub fn from_any_json_only(
        bytes: &[u8],
        only: &PackageId,
    ) -> Result<(Self, u64), StoreStateDecodeError> {
        let formats = FORMATS;
        if let Some(read) = Self::read_indexed_only(bytes, only) {
            return Ok(read);
        }
        match Self::read_json_of(bytes, &formats, Some(only)) {
            Some(read) => Ok(read),
            // Refused (or unusual, such as a package whose id is not its first member): read
            // in full, which names what is wrong, and keep the one package.
            None => {
                let (mut state, format) = Self::from_json_of(bytes, &formats)?;
                state.keep_only(only);
                Ok((state, format))
            }
        }
    }

    /// Drops every package but `only`.
    fn keep_only(&mut self, only: &PackageId) {
        let mut kept = ChunkMap::new();
        if let Some(record) = self.packages.get(only) {
            kept.insert(only.clone(), Arc::clone(record));
        }
        self.packages = kept;
    }
}

/// Why the change of one commit (a store state delta) cannot be applied to a state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The delta is not the change to the next generation.
    #[error("the change is for generation {delta}, but the state is at {current}")]
    Generation {
        /// The state's generation.
        current: u64,
        /// The delta's.
        delta: u64,
    },
    /// A changed package breaks an invariant.
    #[error("the change breaks an invariant: {0}")]
    Invariant(StoreStateInvariantError),
    /// The change records every version as trusted under a trust file that is not the one the
    /// state records after it.
    #[error(
        "the change records the versions as trusted under trust file {retrust}, but the store \
         state records {}",
        anchor.map_or("no trust file".to_owned(), |a| format!("trust file {a}"))
    )]
    Retrust {
        /// The digest of the trust file the change records.
        retrust: Sha256Digest,
        /// That of the trust file the state records, if any.
        anchor: Option<Sha256Digest>,
    },
}

/// Checks the invariants of one package.
fn validate_package(
    id: &PackageId,
    package: &PackageRecord,
) -> Result<(), StoreStateInvariantError> {
    if package.versions.is_empty() {
        return Err(StoreStateInvariantError::EmptyPackage { id: id.clone() });
    }
    let mut current: Option<&Version> = None;
    let mut last: Option<&Version> = None;
    for (version, record) in &package.versions {
        if matches!(record.state, State::Staged | State::Discarded) {
            return Err(StoreStateInvariantError::UnpersistedState {
                id: id.clone(),
                version: version.clone(),
                state: record.state,
            });
        }
        if record.taint.is_some() && (record.state.is_enabled() || !record.state.is_installed()) {
            return Err(StoreStateInvariantError::TaintOnState {
                id: id.clone(),
                version: version.clone(),
                state: record.state,
            });
        }
        if record.state.is_current() {
            if let Some(first) = current {
                return Err(StoreStateInvariantError::SeveralCurrent {
                    id: id.clone(),
                    first: first.clone(),
                    second: version.clone(),
                });
            }
            current = Some(version);
        }
        // Versions are sorted, so equal precedence means neighbours.
        if let Some(prev) = last {
            if prev.cmp_precedence(version) == Ordering::Equal {
                return Err(StoreStateInvariantError::SamePrecedence {
                    id: id.clone(),
                    first: prev.clone(),
                    second: version.clone(),
                });
            }
        }
        last = Some(version);
    }
    if let Some(previous) = &package.previous {
        let state = package.versions.get(previous).map(|r| r.state);
        if state != Some(State::Superseded) {
            return Err(StoreStateInvariantError::PreviousNotRollbackTarget {
                id: id.clone(),
                version: previous.clone(),
                state,
            });
        }
    }
    Ok(())
}

/// What a checkpoint's text is reserved for before it is written: its head, and each package.
/// A package takes about 430 bytes; reserving more costs address space, not memory, as the
/// pages are not touched, and spares the copies of a buffer regrown while it is written.
const CHECKPOINT_HEAD: usize = 4 << 10;
const CHECKPOINT_PER_PACKAGE: usize = 1 << 10;

impl StoreState {
    /// The store state as indented JSON, packages by id and versions ascending, so that equal states
    /// always give equal bytes. This is format 1 ([`REGISTRY_FORMAT_V1`]), a store without a log.
    pub fn to_json(&self) -> Vec<u8> {
        self.to_json_as(REGISTRY_FORMAT_V1)
    }

    fn to_json_as(&self, format: u64) -> Vec<u8> {
        // A checkpoint is read by programs only, at every open: compact, which halves what each
        // reader scans. Format 1 stays indented, as the stores that wrote it did.
        if format == REGISTRY_FORMAT_V1 {
            return self.to_tree(format).to_pretty_string().into_bytes();
        }
        if format == REGISTRY_FORMAT_V3 {
            return self.to_indexed_json();
        }
        // Written a package at a time, each package's tree dropped once it is text: a tree of
        // the whole state (or a buffer regrown to twice its size) would hold a store of 10,000
        // packages several times over at the peak of the commit that compacts it. The bytes are
        // those of the tree's compact form (`the_checkpoint_is_the_compact_form_of_its_tree`).
        let mut out =
            String::with_capacity(CHECKPOINT_HEAD + CHECKPOINT_PER_PACKAGE * self.packages.len());
        out.push('{');
        json::write_compact_members(&mut out, &self.head(format));
        out.push_str(",\"packages\":");
        let packages = self.packages.iter().map(|(id, p)| encode_package(id, p));
        json::write_compact_array(&mut out, packages);
        out.push('}');
        out.into_bytes()
    }

    /// The format-3 checkpoint: the head, the index, then the packages, each record's byte
    /// range filled into its row once it is written.
    fn to_indexed_json(&self) -> Vec<u8> {
        let rows: Vec<ListingRow> = self
            .packages
            .iter()
            .filter_map(|(id, p)| ListingRow::of(id, p))
            .collect();
        let mut head =
            String::with_capacity(CHECKPOINT_HEAD + CHECKPOINT_PER_PACKAGE * self.packages.len());
        head.push('{');
        json::write_compact_members(&mut head, &self.head(REGISTRY_FORMAT_V3));
        head.push(',');
        let mut writer = IndexedWriter::new(head, rows.iter());
        drop(rows);
        writer.text().extend_from_slice(b",\"packages\":[");
        let mut record = String::new();
        for (i, (id, p)) in self.packages.iter().enumerate() {
            if i > 0 {
                writer.text().push(b',');
            }
            record.clear();
            json::write_compact(&mut record, &encode_package(id, p));
            let start = writer.text().len();
            writer.text().extend_from_slice(record.as_bytes());
            writer.fill(i, start..start + record.len());
        }
        writer.text().extend_from_slice(b"]}");
        writer.finish()
    }

    /// The members of the state's JSON object before its packages.
    fn head(&self, format: u64) -> Vec<(String, Value)> {
        let mut top = vec![
            ("guild_registry".to_owned(), Value::from(format)),
            ("generation".to_owned(), Value::from(self.generation)),
        ];
        if let Some(t) = &self.trust {
            top.push(("trust".to_owned(), encode_trust(t)));
        }
        if let Some(f) = &self.fleet {
            top.push(("fleet".to_owned(), encode_fleet(f)));
        }
        top
    }

    /// The state's JSON document as one tree (format 1 is written from it).
    fn to_tree(&self, format: u64) -> Value {
        let mut top = self.head(format);
        let packages = self
            .packages
            .iter()
            .map(|(id, p)| encode_package(id, p))
            .collect();
        top.push(("packages".to_owned(), Value::Array(packages)));
        Value::Object(top)
    }

    /// Reads a store state written by [`Self::to_json`], strictly, and checks its invariants.
    /// Only format 1: a checkpoint (format 2 or 3) is not the whole state, and is refused.
    pub fn from_json(bytes: &[u8]) -> Result<Self, StoreStateDecodeError> {
        Self::from_json_of(bytes, &[REGISTRY_FORMAT_V1]).map(|(state, _)| state)
    }

    fn from_json_of(bytes: &[u8], formats: &[u64]) -> Result<(Self, u64), StoreStateDecodeError> {
        // A checkpoint of 10,000 packages is read at every `guild list`: it is read straight
        // from the text, and only a document that this refuses is read again as a tree, to name
        // what is wrong and where (or, should the fast reader refuse something valid, to read
        // it after all).
        match Self::read_json_of(bytes, formats, None) {
            Some(read) => Ok(read),
            None => Self::from_tree_of(bytes, formats),
        }
    }

    /// [`Self::from_json_of`] through the tree [`json::parse_borrowed`] makes, naming the error.
    fn from_tree_of(bytes: &[u8], formats: &[u64]) -> Result<(Self, u64), StoreStateDecodeError> {
        // Borrowed strings and paths built only for errors.
        let value = json::parse_borrowed(bytes)?;
        let (members, format) = format_of(&value, "guild_registry", formats)?;
        let root = At::Root;
        let indexed = format == REGISTRY_FORMAT_V3;
        let fields = Fields::new(
            members,
            root,
            if indexed { TOP_FIELDS_V3 } else { TOP_FIELDS },
        )?;
        if indexed {
            fields.required("index")?;
            // The readers of the index alone read the store-wide facts before it and the
            // records after it: the members come in the order every writer writes them.
            let mut at = 0;
            for (key, _) in members {
                if !in_writer_order(&mut at, key) {
                    return Err(field(
                        root.path().key(key),
                        FieldProblem::Invalid {
                            detail: format!(
                                "out of order: a checkpoint of format 3 holds its members in the \
                                 order {}",
                                TOP_FIELDS_V3.join(", ")
                            ),
                        },
                    ));
                }
            }
        }
        let generation = fields.u64("generation")?;
        let trust = match fields.get("trust") {
            None => None,
            Some(t) => Some(decode_trust(t, root.key("trust"))?),
        };
        let fleet = match fields.get("fleet") {
            None => None,
            Some(f) => Some(Arc::new(decode_fleet(f, root.key("fleet"))?)),
        };
        let mut packages = ChunkMap::new();
        let list = fields.array("packages")?;
        let list_at = root.key("packages");
        for (i, item) in list.iter().enumerate() {
            let at = list_at.index(i);
            let (id, record) = decode_package(item, at)?;
            if packages.contains_key(&id) {
                return Err(field(
                    at.path().key("id"),
                    FieldProblem::Duplicate {
                        what: "package",
                        value: id.to_string(),
                    },
                ));
            }
            packages.insert(id, Arc::new(record));
        }
        let state = StoreState {
            generation,
            trust,
            fleet,
            packages,
        };
        state.validate()?;
        if indexed {
            listing::check_index(bytes, &state)?;
        }
        Ok((state, format))
    }
}

impl StoreState {
    /// [`Self::from_any_json_only`] through a format-3 checkpoint's index: the head, the index,
    /// and the record of package `only` at the byte range its row gives. `None` for a document
    /// of another format and for whatever this refuses (the caller reads the document again
    /// to name it).
    fn read_indexed_only(bytes: &[u8], only: &PackageId) -> Option<(Self, u64)> {
        Self::from_checkpoint_parts_only(CheckpointParts::whole(bytes), only, |range| {
            bytes.get(range).map(<[u8]>::to_vec)
        })
    }

    /// [`Self::from_any_json_only`] from the parts of a format-3 checkpoint
    /// ([`CheckpointParts`]) and its record of package `only`, which `record` reads given its
    /// byte range: `None` for anything this does not read (another format included), which the
    /// caller then reads whole with [`Self::from_any_json_only`].
    pub fn from_checkpoint_parts_only(
        parts: CheckpointParts<'_>,
        only: &PackageId,
        record: impl FnOnce(Range<usize>) -> Option<Vec<u8>>,
    ) -> Option<(Self, u64)> {
        let (mut state, package) = listing::read_indexed_only(parts, only, record)?;
        if let Some(package) = package {
            state.packages.insert(only.clone(), Arc::new(package));
        }
        state.validate().ok()?;
        Some((state, REGISTRY_FORMAT_V3))
    }

    /// [`Self::from_any_json`] from the parts of a format-3 checkpoint ([`CheckpointParts`])
    /// and its records, which `read` fills a buffer with a run of adjoining ones at a time
    /// (given their byte range), so that a large checkpoint is never held whole: `None` for
    /// anything this does not read (another format included), which the caller then reads
    /// whole with [`Self::from_any_json`]. `parts` and `read` must be views of one file (read
    /// through one descriptor, say): where the records lie is checked against the parts.
    pub fn from_checkpoint_parts(
        parts: CheckpointParts<'_>,
        read: impl FnMut(Range<usize>, &mut Vec<u8>) -> Option<()>,
    ) -> Option<(Self, u64)> {
        Self::from_checkpoint_parts_in(parts, listing::RECORDS_BATCH, read)
    }

    /// [`Self::from_checkpoint_parts`] asking `read` for at most `batch` bytes of records at a
    /// time (a record longer than that alone).
    pub(crate) fn from_checkpoint_parts_in(
        parts: CheckpointParts<'_>,
        batch: usize,
        read: impl FnMut(Range<usize>, &mut Vec<u8>) -> Option<()>,
    ) -> Option<(Self, u64)> {
        let mut packages = ChunkMap::new();
        let mut state = listing::read_indexed_whole(parts, batch, read, |id, package| {
            packages
                .insert(id, Arc::new(package))
                .is_none()
                .then_some(())
        })?;
        state.packages = packages;
        state.validate().ok()?;
        Some((state, REGISTRY_FORMAT_V3))
    }

    /// [`Self::from_json_of`] without the tree: `None` for whatever it would refuse. With
    /// `only`, the state holds that package alone and the others are passed over
    /// ([`read_package_of`]; [`Self::from_any_json_only`] says what that leaves unchecked).
    fn read_json_of(
        bytes: &[u8],
        formats: &[u64],
        only: Option<&PackageId>,
    ) -> Option<(Self, u64)> {
        let mut c = Cursor::new(bytes)?;
        let mut format = None;
        let mut generation = None;
        let mut trust = None;
        let mut fleet = None;
        let mut packages: Option<ChunkMap<PackageId, Arc<PackageRecord>>> = None;
        // A format-3 index's rows with their byte ranges, and how many records matched them.
        let mut index: Option<listing::Index> = None;
        let mut packages_end = None;
        let mut matched = 0;
        // Where in the writer's order the last member was (format 3 holds them in it).
        let mut order = 0;
        c.object(|c, key| match key {
            _ if format == Some(REGISTRY_FORMAT_V3) && !in_writer_order(&mut order, key) => None,
            "guild_registry" => once(&mut format, c.u64().filter(|f| formats.contains(f))?),
            "generation" => once(&mut generation, c.u64()?),
            // A reader of one package reads a format-3 document through its index
            // (`read_indexed_only`); what that refused, the full reader names.
            "index" if only.is_some() => None,
            // Only before the packages, as every writer puts it, so that each record is
            // compared with its row as it is read; only in a format-3 document.
            "index" if format == Some(REGISTRY_FORMAT_V3) && packages.is_none() => {
                once(&mut index, listing::read_index(c, |_| true, 0)?)
            }
            "trust" => once(&mut trust, decode_trust(&c.value()?, At::Root).ok()?),
            "fleet" => once(
                &mut fleet,
                Arc::new(decode_fleet(&c.value()?, At::Root).ok()?),
            ),
            "packages" => {
                let mut map = ChunkMap::new();
                c.array(|c| {
                    let start = c.offset();
                    let read = read_package_of(c, only)?;
                    if let Some(index) = &index {
                        // Row `matched` is this record's: its id, its byte range, its columns.
                        let (row, range) = (index.rows.get(matched)?, index.kept.get(matched)?);
                        let (id, record) = read.as_ref()?;
                        let holds = *range == (start..c.position())
                            && row.view(c.text()).matches(id, record);
                        holds.then(|| matched += 1)?;
                    }
                    match read {
                        Some((id, record)) => {
                            map.insert(id, Arc::new(record)).is_none().then_some(())
                        }
                        None => Some(()),
                    }
                })?;
                // The `]` that ends them, which a format-3 index records.
                packages_end = c.position().checked_sub(1);
                once(&mut packages, map)
            }
            _ => None,
        })?;
        if !c.at_end() {
            return None;
        }
        if format == Some(REGISTRY_FORMAT_V3) {
            let index = index?;
            if index.rows.len() != matched || Some(index.packages_end) != packages_end {
                return None;
            }
        }
        let state = StoreState {
            generation: generation?,
            trust,
            fleet,
            packages: packages?,
        };
        state.validate().ok()?;
        Some((state, format?))
    }
}

/// The members of a JSON object.
pub(crate) type Members<'a> = &'a [(Cow<'a, str>, BorrowedValue<'a>)];

/// Where a value sits in the document being decoded: steps that live on the stack, made into a
/// [`JsonPath`] only for an error, so that reading a large store state builds no path at all.
#[derive(Debug, Clone, Copy)]
pub(crate) enum At<'p> {
    /// The document.
    Root,
    /// Member `key` of the object at the first place.
    Key(&'p At<'p>, &'p str),
    /// Element `index` of the array at the first place.
    Index(&'p At<'p>, usize),
}

impl<'p> At<'p> {
    pub(crate) fn key(&'p self, key: &'p str) -> At<'p> {
        At::Key(self, key)
    }

    pub(crate) fn index(&'p self, index: usize) -> At<'p> {
        At::Index(self, index)
    }

    /// The path, for an error.
    pub(crate) fn path(&self) -> JsonPath {
        let mut steps = Vec::new();
        let mut at = self;
        loop {
            match at {
                At::Root => break,
                At::Key(up, key) => {
                    steps.push(PathSegment::Key((*key).to_owned()));
                    at = up;
                }
                At::Index(up, index) => {
                    steps.push(PathSegment::Index(*index));
                    at = up;
                }
            }
        }
        steps.into_iter().rev().collect()
    }
}

/// The members of the document `value` and its format, read from member `marker`, which must be
/// one of `formats`.
pub(crate) fn format_of<'a>(
    value: &'a BorrowedValue<'a>,
    marker: &str,
    formats: &[u64],
) -> Result<(Members<'a>, u64), StoreStateDecodeError> {
    let (Some(members), Some(found)) = (value.as_object(), value.get(marker)) else {
        return Err(StoreStateDecodeError::NotARegistry);
    };
    match found {
        BorrowedValue::Integer(i) => match i.as_u64().filter(|f| formats.contains(f)) {
            Some(format) => Ok((members, format)),
            None => Err(StoreStateDecodeError::UnsupportedFormat {
                found: i.to_string(),
            }),
        },
        other => Err(StoreStateDecodeError::UnsupportedFormat {
            found: format!("of type {}", other.type_name()),
        }),
    }
}

/// One package as the registry file and the log write it.
pub(crate) fn encode_package(id: &PackageId, p: &PackageRecord) -> Value {
    let mut members = vec![("id".to_owned(), Value::from(id.as_str()))];
    if let Some(prev) = &p.previous {
        members.push(("previous".to_owned(), Value::from(prev.to_string())));
    }
    let versions = p
        .versions
        .iter()
        .map(|(v, r)| {
            let mut members = vec![
                ("version".to_owned(), Value::from(v.to_string())),
                ("state".to_owned(), Value::from(r.state.as_str())),
                ("kind".to_owned(), Value::from(r.kind.as_str())),
                ("publisher".to_owned(), Value::from(r.publisher.as_str())),
                (
                    "payload_sha256".to_owned(),
                    Value::from(r.payload_digest.to_hex()),
                ),
            ];
            if let Some(q) = &r.taint {
                let mut qm = vec![("reason".to_owned(), Value::from(q.reason.as_str()))];
                if let Some(f) = &q.file {
                    qm.push(("file".to_owned(), Value::from(f.as_str())));
                }
                members.push(("quarantine".to_owned(), Value::Object(qm)));
            }
            if let Some(t) = &r.trusted_under {
                members.push(("trusted_under".to_owned(), Value::from(t.to_hex())));
            }
            if !r.signatures.is_empty() {
                let signatures = r
                    .signatures
                    .iter()
                    .map(|s| {
                        Value::Object(vec![
                            ("key_id".to_owned(), Value::from(s.key_id.to_hex())),
                            ("algorithm".to_owned(), Value::from(s.algorithm.as_str())),
                            (
                                "signature".to_owned(),
                                Value::from(crate::hex::encode(&s.signature)),
                            ),
                        ])
                    })
                    .collect();
                members.push(("signatures".to_owned(), Value::Array(signatures)));
            }
            if !r.signed_by.is_empty() {
                let keys = r
                    .signed_by
                    .iter()
                    .map(|k| Value::from(k.to_hex()))
                    .collect();
                members.push(("signed_by".to_owned(), Value::Array(keys)));
            }
            if let Some(facts) = &r.facts {
                members.push(("manifest".to_owned(), encode_facts(facts)));
            }
            Value::Object(members)
        })
        .collect();
    members.push(("versions".to_owned(), Value::Array(versions)));
    Value::Object(members)
}

/// The trust anchor as the registry file and the log write it.
pub(crate) fn encode_trust(t: &TrustAnchor) -> Value {
    let revoked = |m: &BTreeMap<Sha256Digest, String>, name: &str| {
        Value::Array(
            m.iter()
                .map(|(d, r)| {
                    Value::Object(vec![
                        (name.to_owned(), Value::from(d.to_hex())),
                        ("reason".to_owned(), Value::from(r.as_str())),
                    ])
                })
                .collect(),
        )
    };
    Value::Object(vec![
        (
            "store_id".to_owned(),
            Value::from(t.binding.store_id.as_str()),
        ),
        ("generation".to_owned(), Value::from(t.binding.generation)),
        ("sha256".to_owned(), Value::from(t.file_digest.to_hex())),
        (
            "revoked_keys".to_owned(),
            revoked(&t.revoked_keys, "key_id"),
        ),
        (
            "revoked_digests".to_owned(),
            revoked(&t.revoked_digests, "sha256"),
        ),
    ])
}

pub(crate) fn decode_package(
    item: &BorrowedValue<'_>,
    at: At<'_>,
) -> Result<(PackageId, PackageRecord), StoreStateDecodeError> {
    let fields = Fields::of(item, at, PACKAGE_FIELDS)?;
    let id = fields.parsed("id", |s| PackageId::new(s).map_err(id_detail))?;
    let previous = fields
        .optional_str("previous")?
        .map(|s| parse_version(s, at.key("previous")))
        .transpose()?;
    let list = fields.array("versions")?;
    // Room for the versions listed (see `VecMap::with_capacity`), up to a few: a damaged
    // record's list is refused at its first bad element, before it could use more.
    let mut versions = VecMap::with_capacity(list.len().min(16));
    let versions_at = at.key("versions");
    for (j, item) in list.iter().enumerate() {
        let vat = versions_at.index(j);
        let f = Fields::of(item, vat, VERSION_FIELDS)?;
        let version = parse_version(f.str("version")?, vat.key("version"))?;
        let state = f.parsed("state", parse_state)?;
        let kind = f.parsed("kind", parse_kind)?;
        let publisher = f.parsed("publisher", |s| PublisherId::new(s).map_err(id_detail))?;
        let payload_digest = f.parsed("payload_sha256", |s| {
            Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
        })?;
        let taint = match f.get("quarantine") {
            None => None,
            Some(q) => Some(decode_taint(q, vat.key("quarantine"))?),
        };
        // Absent in stores written before it was recorded: the next open checks the version.
        let trusted_under = f
            .optional_str("trusted_under")?
            .map(|s| {
                Sha256Digest::parse_hex(s).map_err(|e| {
                    field(
                        vat.path().key("trusted_under"),
                        FieldProblem::Invalid {
                            detail: e.to_string(),
                        },
                    )
                })
            })
            .transpose()?;
        let signatures = match f.get("signatures") {
            None => Vec::new(),
            Some(_) => decode_signatures(f.array("signatures")?, vat.key("signatures"))?,
        };
        // Absent in stores written before it was recorded.
        let signed_by = match f.get("signed_by") {
            None => Vec::new(),
            Some(_) => {
                let at = vat.key("signed_by");
                let mut keys = Vec::new();
                for (i, k) in f.array("signed_by")?.iter().enumerate() {
                    let bad = |detail: String| {
                        field(at.path().index(i), FieldProblem::Invalid { detail })
                    };
                    let hex = k
                        .as_str()
                        .ok_or_else(|| bad("expected a key id, a string".into()))?;
                    keys.push(Sha256Digest::parse_hex(hex).map_err(|e| bad(e.to_string()))?);
                }
                keys
            }
        };
        // Absent in stores written before it was recorded.
        let facts = match f.get("manifest") {
            None => None,
            Some(m) => Some(Arc::new(decode_facts(m, vat.key("manifest"))?)),
        };
        let record = VersionRecord {
            payload_digest,
            kind,
            publisher,
            state,
            taint,
            trusted_under,
            signatures,
            signed_by,
            facts,
        };
        if versions.insert(version.clone(), record).is_some() {
            return Err(field(
                vat.path().key("version"),
                FieldProblem::Duplicate {
                    what: "version",
                    value: version.to_string(),
                },
            ));
        }
    }
    Ok((id, PackageRecord { versions, previous }))
}

fn parse_state(s: &str) -> Result<State, String> {
    State::ALL
        .into_iter()
        .find(|st| st.as_str() == s)
        .ok_or_else(|| format!("unknown lifecycle state {:?}", clip(s)))
}

fn parse_kind(s: &str) -> Result<PackageKind, String> {
    PackageKind::parse(s).ok_or_else(|| format!("unknown package kind {:?}", clip(s)))
}

fn decode_taint(q: &BorrowedValue<'_>, at: At<'_>) -> Result<Taint, StoreStateDecodeError> {
    let qf = Fields::of(q, at, TAINT_FIELDS)?;
    Ok(Taint {
        reason: qf.str("reason")?.to_owned(),
        file: qf.optional_str("file")?.map(str::to_owned),
    })
}

/// Fills `slot` with `value` unless it holds one already: a key seen twice in one object.
pub(crate) fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    slot.is_none().then(|| *slot = Some(value))
}

/// Reads one package straight from the text, as [`decode_package`] reads it from the tree:
/// `None` for anything [`decode_package`] would refuse (and for anything unusual that it
/// accepts, such as a key written with an escape), so that the caller reads the document again
/// the slow way to name the error. Every value goes through the same parsing functions.
pub(crate) fn read_package(c: &mut Cursor<'_>) -> Option<(PackageId, PackageRecord)> {
    // The byte-level reader checks no nesting depth: every caller reads records at most two
    // levels down (the packages of a document or a log frame), far from the cursor's limit.
    let at = c.offset();
    if let Some((read, end)) = quick::package(c.text(), at) {
        c.pass_to(end)?;
        return Some(read);
    }
    read_package_generic(c)
}

/// [`read_package`] through the cursor: any record, as the JSON grammar allows it.
fn read_package_generic(c: &mut Cursor<'_>) -> Option<(PackageId, PackageRecord)> {
    let mut id = None;
    let mut previous = None;
    let mut versions = None;
    c.object(|c, key| match key {
        "id" => once(&mut id, PackageId::new(c.str()?.into_owned()).ok()?),
        _ => package_member(c, key, &mut previous, &mut versions),
    })?;
    Some((
        id?,
        PackageRecord {
            versions: versions?,
            previous,
        },
    ))
}

/// One package of a registry's array: every package ([`read_package`]), or with `only` that
/// package alone ([`read_package_if`]: `Some(None)` for another).
pub(crate) fn read_package_of(
    c: &mut Cursor<'_>,
    only: Option<&PackageId>,
) -> Option<Option<(PackageId, PackageRecord)>> {
    match only {
        None => read_package(c).map(Some),
        Some(only) => read_package_if(c, only),
    }
}

/// [`read_package`] for a reader of package `only`: `Some(None)` for another package, passed
/// over once its id (its first member, as every writer puts it) is read; `None` for what
/// [`read_package`] would refuse in package `only`, for a malformed value in another, and for a
/// package whose first member is not its id (the caller then reads the document in full).
fn read_package_if(
    c: &mut Cursor<'_>,
    only: &PackageId,
) -> Option<Option<(PackageId, PackageRecord)>> {
    // Whether the id has been read, and whether it is `only`.
    let mut wanted = None;
    let mut previous = None;
    let mut versions = None;
    c.object(|c, key| match (wanted, key) {
        (None, "id") => {
            wanted = Some(c.str()? == only.as_str());
            Some(())
        }
        (None, _) | (Some(true), "id") => None,
        (Some(false), _) => c.skip(),
        (Some(true), _) => package_member(c, key, &mut previous, &mut versions),
    })?;
    if !wanted? {
        return Some(None);
    }
    Some(Some((
        only.clone(),
        PackageRecord {
            versions: versions?,
            previous,
        },
    )))
}

/// One member of a package other than its id ([`read_package`]).
fn package_member(
    c: &mut Cursor<'_>,
    key: &str,
    previous: &mut Option<Version>,
    versions: &mut Option<VecMap<Version, VersionRecord>>,
) -> Option<()> {
    match key {
        "previous" => once(previous, Version::parse(&c.str()?).ok()?),
        "versions" => {
            // Room for one version, what nearly every package records: the count is not known
            // before the list is read, and a vector's first growth makes room for four version
            // records (see `VecMap::with_capacity`).
            let mut list = VecMap::with_capacity(1);
            c.array(|c| {
                let (version, record) = read_version(c)?;
                list.insert(version, record).is_none().then_some(())
            })?;
            once(versions, list)
        }
        _ => None,
    }
}

/// One version record straight from the text ([`read_package`]).
fn read_version(c: &mut Cursor<'_>) -> Option<(Version, VersionRecord)> {
    let mut version = None;
    let mut state = None;
    let mut kind = None;
    let mut publisher = None;
    let mut payload_digest = None;
    let mut taint = None;
    let mut trusted_under = None;
    let mut signatures = None;
    let mut signed_by = None;
    let mut facts = None;
    c.object(|c, key| match key {
        "version" => once(&mut version, Version::parse(&c.str()?).ok()?),
        "state" => once(&mut state, parse_state(&c.str()?).ok()?),
        "kind" => once(&mut kind, parse_kind(&c.str()?).ok()?),
        "publisher" => once(
            &mut publisher,
            PublisherId::new(c.str()?.into_owned()).ok()?,
        ),
        "payload_sha256" => once(
            &mut payload_digest,
            Sha256Digest::parse_hex(&c.str()?).ok()?,
        ),
        "quarantine" => once(&mut taint, decode_taint(&c.value()?, At::Root).ok()?),
        "trusted_under" => once(&mut trusted_under, Sha256Digest::parse_hex(&c.str()?).ok()?),
        "signatures" => {
            let items = c.value()?;
            let list = decode_signatures(items.as_array()?, At::Root).ok()?;
            once(&mut signatures, list)
        }
        "signed_by" => {
            let mut keys = Vec::new();
            c.array(|c| {
                keys.push(Sha256Digest::parse_hex(&c.str()?).ok()?);
                Some(())
            })?;
            once(&mut signed_by, keys)
        }
        "manifest" => once(&mut facts, Arc::new(read_facts(c)?)),
        _ => None,
    })?;
    Some((
        version?,
        VersionRecord {
            payload_digest: payload_digest?,
            kind: kind?,
            publisher: publisher?,
            state: state?,
            taint,
            trusted_under,
            signatures: signatures.unwrap_or_default(),
            signed_by: signed_by.unwrap_or_default(),
            facts,
        },
    ))
}

/// A version's manifest facts straight from the text, as [`decode_facts`] reads them; each
/// dependency, a small object, is read from a tree by the same code as there.
fn read_facts(c: &mut Cursor<'_>) -> Option<ManifestFacts> {
    let mut module_abi = None;
    let mut provided_ops = None;
    let mut dependencies = None;
    let mut module_dependencies = None;
    c.object(|c, key| match key {
        "module_abi" => once(&mut module_abi, u32::try_from(c.u64()?).ok()?),
        "provided_ops" => {
            let mut ops = Vec::new();
            c.array(|c| {
                ops.push(ImplId::new(c.str()?.into_owned()).ok()?);
                Some(())
            })?;
            once(&mut provided_ops, ops)
        }
        "dependencies" => {
            let mut deps = Vec::new();
            c.array(|c| {
                deps.push(decode_dependency(&c.value()?, At::Root).ok()?);
                Some(())
            })?;
            once(&mut dependencies, deps)
        }
        "module_dependencies" => {
            let mut deps = Vec::new();
            c.array(|c| {
                deps.push(decode_module_dependency(&c.value()?, At::Root).ok()?);
                Some(())
            })?;
            once(&mut module_dependencies, deps)
        }
        _ => None,
    })?;
    Some(ManifestFacts {
        module_abi,
        provided_ops: provided_ops?,
        dependencies: dependencies.unwrap_or_default(),
        module_dependencies: module_dependencies.unwrap_or_default(),
    })
}

/// The fleet membership as the registry file and the log write it: the root as the text of its
/// envelope (its signatures cover the bytes of its `signed` member as received, so it is kept
/// whole), and the accepted policy's record.
pub(crate) fn encode_fleet(f: &FleetMembership) -> Value {
    let mut members = vec![("root".to_owned(), Value::from(f.root.to_json().as_str()))];
    if let Some(p) = &f.policy {
        members.push((
            "policy".to_owned(),
            Value::Object(vec![
                ("version".to_owned(), Value::from(p.version)),
                ("sha256".to_owned(), Value::from(p.digest.to_hex())),
                ("expires".to_owned(), Value::from(p.expires)),
            ]),
        ));
    }
    Value::Object(members)
}

pub(crate) fn decode_fleet(
    item: &BorrowedValue<'_>,
    at: At<'_>,
) -> Result<FleetMembership, StoreStateDecodeError> {
    let f = Fields::of(item, at, FLEET_FIELDS)?;
    let root = f.parsed("root", |s| {
        SignedRoot::parse(s.as_bytes()).map_err(|e| e.to_string())
    })?;
    let policy = match f.get("policy") {
        None => None,
        Some(p) => {
            let p = Fields::of(p, at.key("policy"), POLICY_RECORD_FIELDS)?;
            Some(PolicyRecord {
                version: p.u64("version")?,
                digest: p.parsed("sha256", |s| {
                    Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
                })?,
                expires: p.u64("expires")?,
            })
        }
    };
    Ok(FleetMembership { root, policy })
}

pub(crate) fn decode_trust(
    item: &BorrowedValue<'_>,
    at: At<'_>,
) -> Result<TrustAnchor, StoreStateDecodeError> {
    let f = Fields::of(item, at, TRUST_FIELDS)?;
    let store_id = f.parsed("store_id", |s| {
        if is_store_id(s) {
            Ok(s.to_owned())
        } else {
            Err(format!("{:?} is not 32 lowercase hex digits", clip(s)))
        }
    })?;
    let generation = f.u64("generation")?;
    let file_digest = f.parsed("sha256", |s| {
        Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
    })?;
    let revoked_keys = decode_revocations(&f, at, "revoked_keys", "key_id", REVOKED_KEY_FIELDS)?;
    let revoked_digests =
        decode_revocations(&f, at, "revoked_digests", "sha256", REVOKED_DIGEST_FIELDS)?;
    Ok(TrustAnchor {
        binding: TrustBinding {
            store_id,
            generation,
        },
        file_digest,
        revoked_keys,
        revoked_digests,
    })
}

/// One list of revocations of the trust record: `{NAME: digest, "reason": text}` objects, each
/// digest once.
fn decode_revocations(
    f: &Fields<'_>,
    at: At<'_>,
    list: &str,
    name: &str,
    allowed: &[&str],
) -> Result<BTreeMap<Sha256Digest, String>, StoreStateDecodeError> {
    let mut out = BTreeMap::new();
    let list_at = at.key(list);
    for (i, item) in f.array(list)?.iter().enumerate() {
        let iat = list_at.index(i);
        let itf = Fields::of(item, iat, allowed)?;
        let digest = itf.parsed(name, |s| {
            Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
        })?;
        let reason = itf.str("reason")?.to_owned();
        if out.insert(digest, reason).is_some() {
            return Err(field(
                iat.path().key(name),
                FieldProblem::Duplicate {
                    what: "revocation",
                    value: digest.to_hex(),
                },
            ));
        }
    }
    Ok(out)
}

/// A version record's added signatures: each a `key_id`, an `algorithm` and a non-empty hex
/// `signature`, no key twice.
fn decode_signatures(
    items: &[BorrowedValue<'_>],
    at: At<'_>,
) -> Result<Vec<SignatureEntry>, StoreStateDecodeError> {
    let mut out: Vec<SignatureEntry> = Vec::with_capacity(items.len());
    for (k, item) in items.iter().enumerate() {
        let sat = at.index(k);
        let f = Fields::of(item, sat, SIGNATURE_FIELDS)?;
        let key_id = f.parsed("key_id", |s| {
            Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
        })?;
        let algorithm = f.parsed("algorithm", |s| {
            SignatureAlgorithm::parse(s)
                .ok_or_else(|| format!("unknown signature algorithm {:?}", clip(s)))
        })?;
        let signature = f.parsed("signature", |s| {
            crate::hex::decode(s)
                .filter(|b| !b.is_empty())
                .ok_or_else(|| "expected non-empty lowercase hex".to_owned())
        })?;
        if out.iter().any(|s| s.key_id == key_id) {
            return Err(field(
                sat.path().key("key_id"),
                FieldProblem::Duplicate {
                    what: "signature key",
                    value: key_id.to_hex(),
                },
            ));
        }
        out.push(SignatureEntry {
            key_id,
            algorithm,
            signature,
        });
    }
    Ok(out)
}

/// The members of one JSON object, checked against the fields it may hold.
pub(crate) struct Fields<'a> {
    members: Members<'a>,
    at: At<'a>,
}

impl<'a> Fields<'a> {
    pub(crate) fn of(
        value: &'a BorrowedValue<'a>,
        at: At<'a>,
        allowed: &[&str],
    ) -> Result<Self, StoreStateDecodeError> {
        let members = value
            .as_object()
            .ok_or_else(|| wrong_type(at.path(), "object", value))?;
        Self::new(members, at, allowed)
    }

    pub(crate) fn new(
        members: Members<'a>,
        at: At<'a>,
        allowed: &[&str],
    ) -> Result<Self, StoreStateDecodeError> {
        if let Some((key, _)) = members.iter().find(|(k, _)| !allowed.contains(&k.as_ref())) {
            return Err(field(at.path().key(key), FieldProblem::Unknown));
        }
        Ok(Fields { members, at })
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a BorrowedValue<'a>> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The path of member `key`, for an error.
    fn path_of(&self, key: &str) -> JsonPath {
        self.at.path().key(key)
    }

    fn required(&self, key: &str) -> Result<&'a BorrowedValue<'a>, StoreStateDecodeError> {
        self.get(key)
            .ok_or_else(|| field(self.path_of(key), FieldProblem::Missing))
    }

    pub(crate) fn str(&self, key: &str) -> Result<&'a str, StoreStateDecodeError> {
        let v = self.required(key)?;
        v.as_str()
            .ok_or_else(|| wrong_type(self.path_of(key), "string", v))
    }

    pub(crate) fn optional_str(&self, key: &str) -> Result<Option<&'a str>, StoreStateDecodeError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| wrong_type(self.path_of(key), "string", v)),
        }
    }

    pub(crate) fn u64(&self, key: &str) -> Result<u64, StoreStateDecodeError> {
        let v = self.required(key)?;
        let i: Integer = v
            .as_integer()
            .ok_or_else(|| wrong_type(self.path_of(key), "integer", v))?;
        i.as_u64().ok_or_else(|| {
            field(
                self.path_of(key),
                FieldProblem::Invalid {
                    detail: format!("{i} is negative"),
                },
            )
        })
    }

    pub(crate) fn array(
        &self,
        key: &str,
    ) -> Result<&'a [BorrowedValue<'a>], StoreStateDecodeError> {
        let v = self.required(key)?;
        v.as_array()
            .ok_or_else(|| wrong_type(self.path_of(key), "array", v))
    }

    pub(crate) fn parsed<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, StoreStateDecodeError> {
        let s = self.str(key)?;
        parse(s).map_err(|detail| field(self.path_of(key), FieldProblem::Invalid { detail }))
    }
}

fn parse_version(s: &str, at: At<'_>) -> Result<Version, StoreStateDecodeError> {
    Version::parse(s).map_err(|e| {
        field(
            at.path(),
            FieldProblem::Invalid {
                detail: format!("{:?} is not a semantic version: {e}", clip(s)),
            },
        )
    })
}

pub(crate) fn field(path: JsonPath, problem: FieldProblem) -> StoreStateDecodeError {
    StoreStateDecodeError::Field { path, problem }
}

pub(crate) fn wrong_type(
    path: JsonPath,
    expected: &'static str,
    found: &BorrowedValue<'_>,
) -> StoreStateDecodeError {
    field(
        path,
        FieldProblem::WrongType {
            expected,
            found: found.type_name(),
        },
    )
}

fn id_detail(e: IdError) -> String {
    e.to_string()
}

/// At most 80 characters of `s`, so that a damaged file cannot make its own error huge.
fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

fn unknown(id: &PackageId) -> StoreStateError {
    StoreStateError::UnknownPackage { id: id.clone() }
}

fn illegal(
    id: &PackageId,
    version: &Version,
    r: Result<State, IllegalTransition>,
) -> Result<State, StoreStateError> {
    r.map_err(|source| StoreStateError::Illegal {
        id: id.clone(),
        version: version.clone(),
        source,
    })
}

/// What making `version` current does to the version that is current now: checked first (a
/// downgrade needs permission, the transition must be legal), applied once every other check
/// of the change has passed.
struct Supersede {
    current: Option<(Version, State)>,
}

impl Supersede {
    fn plan(
        package: Option<&PackageRecord>,
        id: &PackageId,
        version: &Version,
        options: PublishOptions,
    ) -> Result<Self, StoreStateError> {
        let Some((cur, cur_state)) = package.and_then(PackageRecord::current) else {
            return Ok(Supersede { current: None });
        };
        if version.cmp_precedence(cur) == Ordering::Less && !options.allow_downgrade {
            return Err(StoreStateError::Downgrade {
                id: id.clone(),
                current: cur.clone(),
                offered: version.clone(),
            });
        }
        let to = illegal(id, cur, transition(cur_state.state, Event::Supersede))?;
        Ok(Supersede {
            current: Some((cur.clone(), to)),
        })
    }

    /// Supersedes the current version, which becomes the rollback target; answers it.
    fn apply(self, package: &mut PackageRecord) -> Option<Version> {
        let (cur, to) = self.current?;
        if let Some(r) = package.versions.get_mut(&cur) {
            r.state = to;
        }
        package.previous = Some(cur.clone());
        Some(cur)
    }
}

impl fmt::Display for PublishKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PublishKind::New => "new",
            PublishKind::IdenticalNoOp => "identical (no-op)",
            PublishKind::Reactivated => "reactivated",
        })
    }
}

impl VersionRecord {
    /// The graph's node of this record's version `id@version`, when the record carries what
    /// the graph reads of its manifest ([`VersionRecord::facts`]).
    pub fn graph_node(&self, id: &PackageId, version: &Version) -> Option<PackageNode> {
        let facts = self.facts.as_deref()?;
        Some(PackageNode {
            id: id.clone(),
            version: version.clone(),
            kind: self.kind,
            module_abi: facts.module_abi,
            publisher: self.publisher.clone(),
            payload_digest: self.payload_digest,
            enabled: self.state.is_enabled(),
            dependencies: facts.dependencies.clone(),
            module_dependencies: facts.module_dependencies.clone(),
        })
    }
}

/// What a version record keeps of its manifest ([`ManifestFacts`]), as `"manifest"`.
const FACT_FIELDS: &[&str] = &[
    "module_abi",
    "provided_ops",
    "dependencies",
    "module_dependencies",
];
const DEPENDENCY_FIELDS: &[&str] = &["package_id", "min_version", "max_version"];
const MODULE_DEPENDENCY_FIELDS: &[&str] = &[
    "module_id",
    "min_version",
    "max_version",
    "abi_tag",
    "publisher_id",
    "sha256",
];

fn push_facts_range(o: &mut Vec<(String, Value)>, range: &VersionRange) {
    o.push(("min_version".into(), range.min().to_string().into()));
    if let Some(max) = range.max() {
        o.push(("max_version".into(), max.to_string().into()));
    }
}

/// The facts as a version record writes them (`"manifest"`): empty lists are left out.
fn encode_facts(facts: &ManifestFacts) -> Value {
    let mut m: Vec<(String, Value)> = Vec::new();
    if let Some(abi) = facts.module_abi {
        m.push(("module_abi".into(), Value::from(u64::from(abi))));
    }
    let ops = facts.provided_ops.iter().map(|o| o.as_str().into());
    m.push(("provided_ops".into(), Value::Array(ops.collect())));
    if !facts.dependencies.is_empty() {
        let deps = facts.dependencies.iter().map(|d| {
            let mut o = vec![("package_id".into(), d.package_id.as_str().into())];
            push_facts_range(&mut o, &d.range);
            Value::Object(o)
        });
        m.push(("dependencies".into(), Value::Array(deps.collect())));
    }
    if !facts.module_dependencies.is_empty() {
        let deps = facts.module_dependencies.iter().map(|d| {
            let mut o = vec![("module_id".into(), d.module_id.as_str().into())];
            push_facts_range(&mut o, &d.range);
            o.push(("abi_tag".into(), d.abi_tag.as_str().into()));
            if let Some(p) = &d.publisher_id {
                o.push(("publisher_id".into(), p.as_str().into()));
            }
            if let Some(s) = &d.sha256 {
                o.push(("sha256".into(), s.to_hex().into()));
            }
            Value::Object(o)
        });
        m.push(("module_dependencies".into(), Value::Array(deps.collect())));
    }
    Value::Object(m)
}

fn facts_invalid(at: At<'_>, detail: impl Into<String>) -> StoreStateDecodeError {
    field(
        at.path(),
        FieldProblem::Invalid {
            detail: detail.into(),
        },
    )
}

fn facts_range(f: &Fields<'_>, at: At<'_>) -> Result<VersionRange, StoreStateDecodeError> {
    let version = |key: &str| {
        f.parsed(key, |s| {
            Version::parse(s).map_err(|e| format!("not a semantic version: {e}"))
        })
    };
    let min = version("min_version")?;
    let max = match f.get("max_version") {
        None => None,
        Some(_) => Some(version("max_version")?),
    };
    VersionRange::new(min, max).map_err(|e| facts_invalid(at, e.to_string()))
}

/// One of a version's `dependencies`.
fn decode_dependency(
    d: &BorrowedValue<'_>,
    at: At<'_>,
) -> Result<Dependency, StoreStateDecodeError> {
    let df = Fields::of(d, at, DEPENDENCY_FIELDS)?;
    Ok(Dependency {
        package_id: df.parsed("package_id", |s| {
            PackageId::new(s).map_err(|e| e.to_string())
        })?,
        range: facts_range(&df, at)?,
    })
}

/// One of a version's `module_dependencies`.
fn decode_module_dependency(
    d: &BorrowedValue<'_>,
    at: At<'_>,
) -> Result<ModuleDependency, StoreStateDecodeError> {
    let df = Fields::of(d, at, MODULE_DEPENDENCY_FIELDS)?;
    Ok(ModuleDependency {
        module_id: df.parsed("module_id", |s| {
            PackageId::new(s).map_err(|e| e.to_string())
        })?,
        range: facts_range(&df, at)?,
        abi_tag: df.str("abi_tag")?.to_owned(),
        publisher_id: match df.get("publisher_id") {
            None => None,
            Some(_) => Some(df.parsed("publisher_id", |s| {
                PublisherId::new(s).map_err(|e| e.to_string())
            })?),
        },
        sha256: match df.get("sha256") {
            None => None,
            Some(_) => Some(df.parsed("sha256", |s| {
                Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
            })?),
        },
    })
}

/// Reads the facts a version record carries (`"manifest"`), naming the field that is wrong.
fn decode_facts(
    value: &BorrowedValue<'_>,
    at: At<'_>,
) -> Result<ManifestFacts, StoreStateDecodeError> {
    let f = Fields::of(value, at, FACT_FIELDS)?;
    let module_abi = match f.get("module_abi") {
        None => None,
        Some(_) => {
            let n = f.u64("module_abi")?;
            Some(u32::try_from(n).map_err(|_| facts_invalid(at.key("module_abi"), "too large"))?)
        }
    };
    let mut provided_ops = Vec::new();
    let ops_at = at.key("provided_ops");
    for (i, op) in f.array("provided_ops")?.iter().enumerate() {
        let s = op.as_str().ok_or_else(|| {
            facts_invalid(ops_at.index(i), "expected an implementation id, a string")
        })?;
        provided_ops
            .push(ImplId::new(s).map_err(|e| facts_invalid(ops_at.index(i), e.to_string()))?);
    }
    let mut dependencies = Vec::new();
    if f.get("dependencies").is_some() {
        let deps_at = at.key("dependencies");
        for (i, d) in f.array("dependencies")?.iter().enumerate() {
            dependencies.push(decode_dependency(d, deps_at.index(i))?);
        }
    }
    let mut module_dependencies = Vec::new();
    if f.get("module_dependencies").is_some() {
        let deps_at = at.key("module_dependencies");
        for (i, d) in f.array("module_dependencies")?.iter().enumerate() {
            module_dependencies.push(decode_module_dependency(d, deps_at.index(i))?);
        }
    }
    Ok(ManifestFacts {
        module_abi,
        provided_ops,
        dependencies,
        module_dependencies,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::json::PathSegment;
    use proptest::prelude::*;

    fn id(s: &str) -> PackageId {
        PackageId::new(s).unwrap()
    }

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn new_version(tag: &str) -> NewVersion {
        NewVersion {
            payload_digest: Sha256Digest::of(tag.as_bytes()),
            kind: PackageKind::Module,
            publisher: PublisherId::new("org.example").unwrap(),
            signed_by: Vec::new(),
            facts: None,
        }
    }

    const ENABLE: PublishOptions = PublishOptions {
        enable: true,
        allow_downgrade: false,
    };

    fn state_of(r: &StoreState, pkg: &str, ver: &str) -> Option<State> {
        r.record(&id(pkg), &v(ver)).map(|r| r.state)
    }

    /// a@1.0.0 published, then a@2.0.0 published over it: 2 enabled, 1 superseded and previous.
    fn two_versions() -> StoreState {
        let mut r = StoreState::new();
        r.publish(&id("a"), &v("1.0.0"), new_version("a1"), ENABLE)
            .unwrap();
        r.publish(&id("a"), &v("2.0.0"), new_version("a2"), ENABLE)
            .unwrap();
        r
    }

    #[test]
    fn store_state_publish_supersedes_the_current_version_and_records_previous() {
        let r = two_versions();
        assert_eq!(state_of(&r, "a", "1.0.0"), Some(State::Superseded));
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Enabled));
        let p = r.package(&id("a")).unwrap();
        assert_eq!(p.previous(), Some(&v("1.0.0")));
        assert_eq!(p.enabled(), Some(&v("2.0.0")));
        assert_eq!(r.generation(), 0, "transitions never touch the generation");
        assert_eq!(r.validate(), Ok(()));
        let installed: Vec<String> = r
            .installed()
            .map(|(i, ver, _)| format!("{i}@{ver}"))
            .collect();
        assert_eq!(installed, ["a@1.0.0", "a@2.0.0"]);
    }

    #[test]
    fn store_state_publish_reports_what_it_superseded() {
        let mut r = StoreState::new();
        let first = r
            .publish(&id("a"), &v("1.0.0"), new_version("a1"), ENABLE)
            .unwrap();
        assert_eq!(
            first,
            Published {
                kind: PublishKind::New,
                superseded: None
            }
        );
        let second = r
            .publish(
                &id("a"),
                &v("1.1.0"),
                new_version("a11"),
                PublishOptions::default(),
            )
            .unwrap();
        assert_eq!(
            second,
            Published {
                kind: PublishKind::New,
                superseded: Some(v("1.0.0"))
            }
        );
        assert_eq!(state_of(&r, "a", "1.1.0"), Some(State::Disabled));
    }

    #[test]
    fn store_state_publishing_a_superseded_version_again_makes_it_current() {
        let mut r = two_versions();
        r.rollback(&id("a")).unwrap();
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Superseded));
        assert_eq!(r.package(&id("a")).unwrap().previous(), None);

        // Disabled publication of the same payload changes nothing.
        let quiet = PublishOptions {
            enable: false,
            allow_downgrade: false,
        };
        let same = r
            .publish(&id("a"), &v("2.0.0"), new_version("a2"), quiet)
            .unwrap();
        assert_eq!(same.kind, PublishKind::IdenticalNoOp);

        // Enabled, it rolls forward: 2.0.0 current, 1.0.0 the rollback target again.
        let forward = r
            .publish(&id("a"), &v("2.0.0"), new_version("a2"), ENABLE)
            .unwrap();
        assert_eq!(
            forward,
            Published {
                kind: PublishKind::Reactivated,
                superseded: Some(v("1.0.0"))
            }
        );
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Enabled));
        assert_eq!(state_of(&r, "a", "1.0.0"), Some(State::Superseded));
        assert_eq!(r.package(&id("a")).unwrap().previous(), Some(&v("1.0.0")));
        assert_eq!(r.validate(), Ok(()));

        // The current version offered again is still a no-op, and so is an older one unless a
        // downgrade is allowed.
        for older in ["2.0.0", "1.0.0"] {
            let tag = if older == "2.0.0" { "a2" } else { "a1" };
            let before = r.clone();
            let again = r
                .publish(&id("a"), &v(older), new_version(tag), ENABLE)
                .unwrap();
            assert_eq!(again.kind, PublishKind::IdenticalNoOp, "{older}");
            assert_eq!(r, before);
        }
        let down = PublishOptions {
            enable: true,
            allow_downgrade: true,
        };
        let back = r
            .publish(&id("a"), &v("1.0.0"), new_version("a1"), down)
            .unwrap();
        assert_eq!(back.kind, PublishKind::Reactivated);
        assert_eq!(r.package(&id("a")).unwrap().enabled(), Some(&v("1.0.0")));
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn store_state_check_publish_decides_by_payload_digest_only() {
        let r = two_versions();
        let a = id("a");
        let d1 = new_version("a1").payload_digest;
        assert_eq!(
            r.check_publish(&a, &v("1.0.0"), &d1),
            Ok(PublishKind::IdenticalNoOp)
        );
        assert_eq!(r.check_publish(&a, &v("3.0.0"), &d1), Ok(PublishKind::New));
        assert_eq!(
            r.check_publish(&id("b"), &v("1.0.0"), &d1),
            Ok(PublishKind::New)
        );
        let other = Sha256Digest::of(b"tampered");
        assert_eq!(
            r.check_publish(&a, &v("1.0.0"), &other),
            Err(Box::new(ImmutableVersionConflict {
                id: a.clone(),
                version: v("1.0.0"),
                recorded_version: v("1.0.0"),
                recorded: d1,
                offered: other,
            }))
        );
    }

    #[test]
    fn store_state_build_metadata_does_not_make_a_new_version() {
        let r = two_versions();
        let d1 = new_version("a1").payload_digest;
        let err = r
            .check_publish(&id("a"), &v("1.0.0+rebuild"), &d1)
            .unwrap_err();
        assert_eq!(err.recorded_version, v("1.0.0"));
        assert_eq!(err.version, v("1.0.0+rebuild"));
    }

    #[test]
    fn store_state_purge_forgets_only_removed_versions_and_then_the_package() {
        let mut r = two_versions();
        let a = id("a");
        // Nothing is removed yet: every form of purge is refused and changes nothing.
        let before = r.clone();
        assert_eq!(
            r.purge(&a, None),
            Err(StoreStateError::NothingToPurge { id: a.clone() })
        );
        assert_eq!(
            r.purge(&a, Some(&v("2.0.0"))),
            Err(StoreStateError::NotRemoved {
                id: a.clone(),
                version: v("2.0.0"),
                state: State::Enabled,
            })
        );
        assert_eq!(
            r.purge(&a, Some(&v("3.0.0"))),
            Err(StoreStateError::NotRecorded {
                id: a.clone(),
                version: v("3.0.0"),
            })
        );
        assert_eq!(
            r.purge(&id("b"), None),
            Err(StoreStateError::UnknownPackage { id: id("b") })
        );
        assert_eq!(r, before);

        // One removed version is forgotten; the current one is untouched.
        r.remove(&a, &v("1.0.0")).unwrap();
        assert_eq!(r.purge(&a, None), Ok(vec![v("1.0.0")]));
        assert_eq!(state_of(&r, "a", "1.0.0"), None);
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Enabled));
        assert_eq!(r.validate(), Ok(()));
        // The promise is given up on purpose: other content may now take 1.0.0.
        let evil = new_version("other").payload_digest;
        assert_eq!(
            r.check_publish(&a, &v("1.0.0"), &evil),
            Ok(PublishKind::New)
        );

        // With its last record gone, the package is gone.
        r.remove(&a, &v("2.0.0")).unwrap();
        assert_eq!(r.purge(&a, Some(&v("2.0.0"))), Ok(vec![v("2.0.0")]));
        assert!(r.package(&a).is_none());
        assert_eq!(r.packages().count(), 0);
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn store_state_removed_versions_stay_immutable() {
        let mut r = two_versions();
        r.remove(&id("a"), &v("1.0.0")).unwrap();
        assert_eq!(state_of(&r, "a", "1.0.0"), Some(State::Removed));
        assert_eq!(r.package(&id("a")).unwrap().previous(), None);
        let d1 = new_version("a1").payload_digest;
        // The same payload may come back (it must be installed again) ...
        assert_eq!(
            r.check_publish(&id("a"), &v("1.0.0"), &d1),
            Ok(PublishKind::New)
        );
        // ... but different content under that version may not.
        let err = r
            .publish(
                &id("a"),
                &v("1.0.0"),
                new_version("evil"),
                PublishOptions {
                    enable: true,
                    allow_downgrade: true,
                },
            )
            .unwrap_err();
        assert!(matches!(err, StoreStateError::ImmutableVersion(_)), "{err}");
        // Reinstalling the identical payload replaces the tombstone.
        let out = r
            .publish(
                &id("a"),
                &v("1.0.0"),
                new_version("a1"),
                PublishOptions {
                    enable: false,
                    allow_downgrade: true,
                },
            )
            .unwrap();
        assert_eq!(out.kind, PublishKind::New);
        assert_eq!(state_of(&r, "a", "1.0.0"), Some(State::Disabled));
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Superseded));
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn store_state_identical_publish_changes_nothing() {
        let mut r = two_versions();
        let before = r.clone();
        let out = r
            .publish(&id("a"), &v("1.0.0"), new_version("a1"), ENABLE)
            .unwrap();
        assert_eq!(out.kind, PublishKind::IdenticalNoOp);
        assert_eq!(r, before);
    }

    #[test]
    fn store_state_downgrade_needs_explicit_permission() {
        let mut r = two_versions();
        let before = r.clone();
        let err = r
            .publish(&id("a"), &v("1.5.0"), new_version("a15"), ENABLE)
            .unwrap_err();
        assert_eq!(
            err,
            StoreStateError::Downgrade {
                id: id("a"),
                current: v("2.0.0"),
                offered: v("1.5.0")
            }
        );
        assert_eq!(r, before);
        let allowed = PublishOptions {
            enable: true,
            allow_downgrade: true,
        };
        r.publish(&id("a"), &v("1.5.0"), new_version("a15"), allowed)
            .unwrap();
        assert_eq!(state_of(&r, "a", "1.5.0"), Some(State::Enabled));
        assert_eq!(r.package(&id("a")).unwrap().previous(), Some(&v("2.0.0")));
    }

    #[test]
    fn store_state_kind_and_publisher_stay_with_the_installed_package() {
        let mut r = two_versions();
        let mut other_kind = new_version("k");
        other_kind.kind = PackageKind::Kernel;
        assert_eq!(
            r.publish(&id("a"), &v("3.0.0"), other_kind, ENABLE),
            Err(StoreStateError::KindChanged {
                id: id("a"),
                version: v("3.0.0"),
                recorded: PackageKind::Module,
                offered: PackageKind::Kernel
            })
        );
        let mut other_publisher = new_version("p");
        other_publisher.publisher = PublisherId::new("org.mallory").unwrap();
        let err = r
            .publish(&id("a"), &v("3.0.0"), other_publisher, ENABLE)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot publish a@3.0.0 as publisher org.mallory: installed versions of a belong to org.example"
        );
    }

    #[test]
    fn store_state_enable_disable_follow_the_lifecycle() {
        let mut r = two_versions();
        assert_eq!(r.disable(&id("a")), Ok(v("2.0.0")));
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Disabled));
        assert_eq!(r.package(&id("a")).unwrap().enabled(), None);
        let err = r.disable(&id("a")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a@2.0.0: cannot disable a package version that is disabled"
        );
        assert_eq!(r.enable(&id("a")), Ok(v("2.0.0")));
        assert!(matches!(
            r.enable(&id("a")),
            Err(StoreStateError::Illegal {
                source: IllegalTransition {
                    from: State::Enabled,
                    event: Event::Enable
                },
                ..
            })
        ));
        assert_eq!(
            r.enable(&id("zzz")),
            Err(StoreStateError::UnknownPackage { id: id("zzz") })
        );
        r.remove(&id("a"), &v("2.0.0")).unwrap();
        assert_eq!(
            r.enable(&id("a")),
            Err(StoreStateError::NoCurrentVersion { id: id("a") })
        );
    }

    #[test]
    fn store_state_rollback_restores_previous_once() {
        let mut r = two_versions();
        r.disable(&id("a")).unwrap();
        assert_eq!(
            r.rollback(&id("a")),
            Ok(RolledBack {
                from: Some(v("2.0.0")),
                to: v("1.0.0")
            })
        );
        assert_eq!(state_of(&r, "a", "1.0.0"), Some(State::Enabled));
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Superseded));
        assert_eq!(
            r.rollback(&id("a")),
            Err(StoreStateError::NoPreviousVersion { id: id("a") })
        );
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn store_state_rollback_after_removing_current_restores_previous() {
        let mut r = two_versions();
        r.remove(&id("a"), &v("2.0.0")).unwrap();
        assert_eq!(
            r.rollback(&id("a")),
            Ok(RolledBack {
                from: None,
                to: v("1.0.0")
            })
        );
        assert_eq!(r.package(&id("a")).unwrap().enabled(), Some(&v("1.0.0")));
    }

    #[test]
    fn store_state_remove_refuses_what_is_not_installed() {
        let mut r = two_versions();
        r.remove(&id("a"), &v("1.0.0")).unwrap();
        assert_eq!(
            r.remove(&id("a"), &v("1.0.0")),
            Err(StoreStateError::NotInstalled {
                id: id("a"),
                version: v("1.0.0")
            })
        );
        assert_eq!(
            r.remove(&id("a"), &v("9.0.0")),
            Err(StoreStateError::NotInstalled {
                id: id("a"),
                version: v("9.0.0")
            })
        );
    }

    #[test]
    fn store_state_successor_advances_only_the_generation() {
        let r = two_versions();
        let next = r.successor();
        assert_eq!(next.generation(), 1);
        assert_eq!(next.successor().generation(), 2);
        assert_eq!(next.packages, r.packages);
    }

    #[test]
    fn store_state_successor_shares_every_record_a_change_does_not_touch() {
        let mut r = two_versions();
        r.publish(&id("b"), &v("1.0.0"), new_version("b1"), ENABLE)
            .unwrap();
        let mut next = r.successor();
        let shared = |a: &StoreState, b: &StoreState, pkg: &str| {
            Arc::ptr_eq(
                a.packages.get(&id(pkg)).unwrap(),
                b.packages.get(&id(pkg)).unwrap(),
            )
        };
        assert!(shared(&r, &next, "a") && shared(&r, &next, "b"));
        next.disable(&id("b")).unwrap();
        // Only the record written to was copied; the state it came from is unchanged.
        assert!(shared(&r, &next, "a"));
        assert!(!shared(&r, &next, "b"));
        assert_eq!(state_of(&r, "b", "1.0.0"), Some(State::Enabled));
        assert_eq!(state_of(&next, "b", "1.0.0"), Some(State::Disabled));
        // Equal states still compare equal, shared records or not.
        next.enable(&id("b")).unwrap();
        assert_eq!(next.packages, r.packages);
    }

    #[test]
    fn store_state_round_trips_through_json() {
        let mut r = two_versions().successor().successor();
        r.publish(&id("b.kernel"), &v("0.1.0-rc.1"), new_version("b"), ENABLE)
            .unwrap();
        r.remove(&id("a"), &v("1.0.0")).unwrap();
        let bytes = r.to_json();
        let back = StoreState::from_json(&bytes).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.to_json(), bytes, "encoding is deterministic");
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("{\n  \"guild_registry\": 1,\n  \"generation\": 2,"));
    }

    #[test]
    fn store_state_taint_and_trust_record_round_trip_and_older_files_still_read() {
        let mut r = two_versions().successor();
        let q = Taint {
            reason: "installed files do not match the signed manifest".into(),
            file: Some("lib/liba.so".into()),
        };
        r.taint(&id("a"), &v("2.0.0"), q.clone()).unwrap();
        assert_eq!(state_of(&r, "a", "2.0.0"), Some(State::Disabled));
        let mut trust = crate::trust::TrustStore::new();
        trust.revoke_key(Sha256Digest::of(b"k"), "leaked");
        let (_, anchor) = trust.seal("0123456789abcdef0123456789abcdef", 3);
        r.set_trust_anchor(anchor.clone());
        let bytes = r.to_json();
        let back = StoreState::from_json(&bytes).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.trust_anchor(), Some(&anchor));
        let listed: Vec<_> = back.tainted().collect();
        assert_eq!(listed, [(&id("a"), &v("2.0.0"), &q)]);
        // A store state written before either existed reads as having neither.
        let old = decode(&doc("", "", "")).unwrap();
        assert_eq!(old.trust_anchor(), None);
        assert_eq!(old.tainted().count(), 0);
    }

    /// The checkpoint is written a package at a time; its bytes are those of the compact form of
    /// the state's tree, with a trust record and a taint, and for an empty state.
    #[test]
    fn the_checkpoint_is_the_compact_form_of_its_tree() {
        let mut r = two_versions().successor();
        r.publish(&id("b"), &v("0.1.0"), new_version("b01"), ENABLE)
            .unwrap();
        r.taint(
            &id("b"),
            &v("0.1.0"),
            Taint {
                reason: "a \"quoted\" reason\n".into(),
                file: Some("lib/libb.so".into()),
            },
        )
        .unwrap();
        let (_, anchor) =
            crate::trust::TrustStore::new().seal("0123456789abcdef0123456789abcdef", 3);
        r.set_trust_anchor(anchor);
        for state in [StoreState::new(), r] {
            let written = String::from_utf8(state.to_json_as(REGISTRY_FORMAT_V2)).unwrap();
            assert_eq!(
                written,
                state.to_tree(REGISTRY_FORMAT_V2).to_compact_string()
            );
            assert_eq!(
                StoreState::from_any_json(written.as_bytes()).unwrap().0,
                state
            );
            // The indexed checkpoint reads back through both readers.
            let indexed = state.to_checkpoint_json();
            assert_eq!(
                StoreState::from_any_json(&indexed),
                Ok((state.clone(), REGISTRY_FORMAT_V3))
            );
            assert_eq!(
                StoreState::from_tree_of(&indexed, &FORMATS),
                Ok((state.clone(), REGISTRY_FORMAT_V3))
            );
        }
    }

    #[test]
    fn store_state_a_tainted_version_is_neither_enabled_nor_rolled_back_to_until_cleared() {
        let mut r = two_versions();
        let q = Taint {
            reason: "tampered".into(),
            file: None,
        };
        r.taint(&id("a"), &v("2.0.0"), q.clone()).unwrap();
        let refused = StoreStateError::Tainted {
            id: id("a"),
            version: v("2.0.0"),
            taint: q.clone(),
        };
        assert_eq!(r.enable(&id("a")), Err(refused));
        assert_eq!(
            r.enable(&id("a")).unwrap_err().to_string(),
            "a@2.0.0 is tainted: tampered"
        );
        // Tainting the rollback target keeps rollback from restoring it.
        let mut s = two_versions();
        s.taint(&id("a"), &v("1.0.0"), q.clone()).unwrap();
        assert!(matches!(
            s.rollback(&id("a")),
            Err(StoreStateError::Tainted { .. })
        ));
        assert!(r.clear_taint(&id("a"), &v("2.0.0")));
        assert!(!r.clear_taint(&id("a"), &v("2.0.0")));
        assert_eq!(r.enable(&id("a")), Ok(v("2.0.0")));
        // Removing a version takes its taint with its files.
        s.remove(&id("a"), &v("1.0.0")).unwrap();
        assert_eq!(s.tainted().count(), 0);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn store_state_decode_refuses_a_taint_on_an_enabled_version_and_a_bad_trust_record() {
        let tainted = doc(r#", "quarantine": {"reason": "x"}"#, "", "");
        assert!(matches!(
            decode(&tainted),
            Err(StoreStateDecodeError::Invariant(
                StoreStateInvariantError::TaintOnState { .. }
            ))
        ));
        let bad_id = doc(
            "",
            "",
            &format!(
                r#", "trust": {{"store_id": "XYZ", "generation": 1, "sha256": "{DIGEST}", "revoked_keys": [], "revoked_digests": []}}"#
            ),
        );
        assert_eq!(field_error(&bad_id).0, "$.trust.store_id");
        let twice = doc(
            "",
            "",
            &format!(
                r#", "trust": {{"store_id": "0123456789abcdef0123456789abcdef", "generation": 1, "sha256": "{DIGEST}", "revoked_keys": [{{"key_id": "{DIGEST}", "reason": "a"}}, {{"key_id": "{DIGEST}", "reason": "b"}}], "revoked_digests": []}}"#
            ),
        );
        assert_eq!(field_error(&twice).0, "$.trust.revoked_keys[1].key_id");
    }

    fn decode(text: &str) -> Result<StoreState, StoreStateDecodeError> {
        StoreState::from_json(text.as_bytes())
    }

    fn field_error(text: &str) -> (String, FieldProblem) {
        match decode(text) {
            Err(StoreStateDecodeError::Field { path, problem }) => (path.to_string(), problem),
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    const DIGEST: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn doc(version_extra: &str, package_extra: &str, top_extra: &str) -> String {
        format!(
            r#"{{"guild_registry": 1, "generation": 4{top_extra}, "packages": [{{"id": "a"{package_extra}, "versions": [{{"version": "1.0.0", "state": "enabled", "kind": "gkmodule", "publisher": "org.example", "payload_sha256": "{DIGEST}"{version_extra}}}]}}]}}"#
        )
    }

    #[test]
    fn store_state_decode_accepts_a_hand_written_file() {
        let r = decode(&doc("", "", "")).unwrap();
        assert_eq!(r.generation(), 4);
        assert_eq!(r.package(&id("a")).unwrap().enabled(), Some(&v("1.0.0")));
    }

    #[test]
    fn store_state_trusted_under_reads_old_files_round_trips_and_refuses_damage() {
        // A file written before the field existed reads as "never recorded".
        let old = decode(&doc("", "", "")).unwrap();
        let record = |r: &StoreState| r.record(&id("a"), &v("1.0.0")).unwrap().clone();
        assert_eq!(record(&old).trusted_under, None);
        // Recording it changes the record once, and it survives encoding.
        let trust = Sha256Digest::of(b"trust file");
        let mut next = old.successor();
        assert!(next.set_trusted_under(&id("a"), &v("1.0.0"), trust));
        assert!(!next.set_trusted_under(&id("a"), &v("1.0.0"), trust));
        assert!(!next.set_trusted_under(&id("a"), &v("9.9.9"), trust));
        let back = StoreState::from_json(&next.to_json()).unwrap();
        assert_eq!(record(&back).trusted_under, Some(trust));
        assert_eq!(back, next);
        // Not a digest: refused at its path.
        let bad = doc(r#", "trusted_under": "nope""#, "", "");
        assert_eq!(
            field_error(&bad).0,
            "$.packages[0].versions[0].trusted_under"
        );
    }

    /// Recording what a record already says leaves the package's record shared with the state
    /// the draft came from: an opening that finds every version verified under today's trust
    /// file copies none of 10,000 records.
    #[test]
    fn store_state_recording_what_a_record_already_says_copies_nothing() {
        let trust = Sha256Digest::of(b"trust file");
        let mut settled = decode(&doc("", "", "")).unwrap().successor();
        assert!(settled.set_trusted_under(&id("a"), &v("1.0.0"), trust));
        let facts = ManifestFacts::default();
        assert!(settled.set_facts(&id("a"), &v("1.0.0"), facts.clone()));
        let shared = |a: &StoreState, b: &StoreState| {
            Arc::ptr_eq(
                a.shared_packages().get(&id("a")).unwrap(),
                b.shared_packages().get(&id("a")).unwrap(),
            )
        };
        let mut next = settled.successor();
        assert!(!next.set_trusted_under(&id("a"), &v("1.0.0"), trust));
        assert!(!next.set_facts(&id("a"), &v("1.0.0"), facts));
        assert!(shared(&settled, &next));
        // A change is made in the draft's own copy.
        assert!(next.set_trusted_under(&id("a"), &v("1.0.0"), Sha256Digest::of(b"another")));
        assert!(!shared(&settled, &next));
        assert_eq!(
            settled.record(&id("a"), &v("1.0.0")).unwrap().trusted_under,
            Some(trust)
        );
    }

    #[test]
    fn store_state_signatures_are_added_once_per_key_round_trip_and_refuse_damage() {
        use crate::manifest::{SignatureAlgorithm, SignatureEntry};
        let sig = |key: &[u8], byte: u8| SignatureEntry {
            key_id: Sha256Digest::of(key),
            algorithm: SignatureAlgorithm::EcdsaP256Sha256,
            signature: vec![byte; 8],
        };
        // A file written before the field existed reads as "none recorded", and writes the
        // same bytes back.
        let text = doc("", "", "");
        let old = decode(&text).unwrap();
        let record = |r: &StoreState| r.record(&id("a"), &v("1.0.0")).unwrap().clone();
        assert!(record(&old).signatures.is_empty());
        assert!(!String::from_utf8(old.to_json())
            .unwrap()
            .contains("signatures"));
        // Keys the installed file signed with, or recorded already, are left out.
        let mut next = old.successor();
        let known = [Sha256Digest::of(b"old")];
        let offered = [sig(b"old", 1), sig(b"new", 2)];
        assert_eq!(
            next.add_signatures(&id("a"), &v("1.0.0"), &known, &offered),
            1
        );
        assert_eq!(
            next.add_signatures(&id("a"), &v("1.0.0"), &known, &[sig(b"new", 3)]),
            0
        );
        assert_eq!(next.add_signatures(&id("a"), &v("9.9.9"), &[], &offered), 0);
        assert_eq!(record(&next).signatures, vec![sig(b"new", 2)]);
        let back = StoreState::from_json(&next.to_json()).unwrap();
        assert_eq!(back, next);
        // Damage is refused at its path.
        let one = format!(
            r#"{{"key_id": "{}", "algorithm": "ecdsa-p256-sha256", "signature": "0102"}}"#,
            Sha256Digest::of(b"new").to_hex()
        );
        for (extra, path) in [
            (
                r#", "signatures": {}"#.to_owned(),
                "$.packages[0].versions[0].signatures",
            ),
            (
                format!(r#", "signatures": [{one}, {one}]"#),
                "$.packages[0].versions[0].signatures[1].key_id",
            ),
            (
                format!(r#", "signatures": [{}]"#, one.replace("0102", "")),
                "$.packages[0].versions[0].signatures[0].signature",
            ),
            (
                format!(
                    r#", "signatures": [{}]"#,
                    one.replace("ecdsa-p256-sha256", "rsa")
                ),
                "$.packages[0].versions[0].signatures[0].algorithm",
            ),
        ] {
            assert_eq!(field_error(&doc(&extra, "", "")).0, path, "{extra}");
        }
    }

    #[test]
    fn store_state_records_the_keys_a_version_was_verified_by_and_reads_old_records() {
        // Written before the field existed: no keys, and the same bytes back.
        let old = decode(&doc("", "", "")).unwrap();
        let record = |r: &StoreState, ver: &str| r.record(&id("a"), &v(ver)).unwrap().clone();
        assert!(record(&old, "1.0.0").signed_by.is_empty());
        assert!(!String::from_utf8(old.to_json())
            .unwrap()
            .contains("signed_by"));
        // Published with its verified keys: recorded, and kept through the checkpoint.
        let keys = vec![Sha256Digest::of(b"k1"), Sha256Digest::of(b"k2")];
        let mut next = old.successor();
        let mut new = new_version("a@2.0.0");
        new.signed_by = keys.clone();
        next.publish(&id("a"), &v("2.0.0"), new, PublishOptions::default())
            .unwrap();
        assert_eq!(record(&next, "2.0.0").signed_by, keys);
        let back = StoreState::from_json(&next.to_json()).unwrap();
        assert_eq!(back, next);
        // Damage is refused at its path.
        for (extra, path) in [
            (
                r#", "signed_by": {}"#,
                "$.packages[0].versions[0].signed_by",
            ),
            (
                r#", "signed_by": [7]"#,
                "$.packages[0].versions[0].signed_by[0]",
            ),
            (
                r#", "signed_by": ["zz"]"#,
                "$.packages[0].versions[0].signed_by[0]",
            ),
        ] {
            assert_eq!(field_error(&doc(extra, "", "")).0, path, "{extra}");
        }
    }

    #[test]
    fn store_state_records_what_the_graph_reads_of_a_manifest_and_reads_old_records() {
        use crate::dependency::{Dependency, ModuleDependency, MODULE_ABI_TAG_V1};
        use crate::ids::ImplId;
        use crate::manifest_facts::ManifestFacts;
        use crate::version::VersionRange;
        // Written before the field existed: no facts, and no field written back.
        let old = decode(&doc("", "", "")).unwrap();
        let record = |r: &StoreState, ver: &str| r.record(&id("a"), &v(ver)).unwrap().clone();
        assert!(record(&old, "1.0.0").facts.is_none());
        assert!(!String::from_utf8(old.to_json())
            .unwrap()
            .contains("manifest"));
        // Published with its facts: recorded, kept through the checkpoint, and the graph's node
        // built from the record alone.
        let facts = ManifestFacts {
            module_abi: Some(1),
            provided_ops: vec![
                ImplId::new("a.op.cpu").unwrap(),
                ImplId::new("a.op.gpu").unwrap(),
            ],
            dependencies: vec![Dependency {
                package_id: id("b"),
                range: VersionRange::new(v("1.0.0"), Some(v("2.0.0"))).unwrap(),
            }],
            module_dependencies: vec![ModuleDependency {
                module_id: id("c"),
                range: VersionRange::new(v("1.2.0"), None).unwrap(),
                abi_tag: MODULE_ABI_TAG_V1.to_owned(),
                publisher_id: Some(PublisherId::new("org.example").unwrap()),
                sha256: Some(Sha256Digest::of(b"c")),
            }],
        };
        let mut next = old.successor();
        let mut new = new_version("a@2.0.0");
        new.facts = Some(facts.clone());
        next.publish(&id("a"), &v("2.0.0"), new, PublishOptions::default())
            .unwrap();
        assert_eq!(record(&next, "2.0.0").facts.as_deref(), Some(&facts));
        let back = StoreState::from_json(&next.to_json()).unwrap();
        assert_eq!(back, next);
        let node = record(&back, "2.0.0")
            .graph_node(&id("a"), &v("2.0.0"))
            .unwrap();
        assert_eq!(
            (
                node.module_abi,
                &node.dependencies,
                &node.module_dependencies
            ),
            (Some(1), &facts.dependencies, &facts.module_dependencies)
        );
        // Damage is refused at its path.
        for (extra, path) in [
            (r#", "manifest": []"#, "$.packages[0].versions[0].manifest"),
            (
                r#", "manifest": {}"#,
                "$.packages[0].versions[0].manifest.provided_ops",
            ),
            (
                r#", "manifest": {"provided_ops": ["Bad Id"]}"#,
                "$.packages[0].versions[0].manifest.provided_ops[0]",
            ),
            (
                r#", "manifest": {"provided_ops": [], "dependencies": [{"package_id": "b"}]}"#,
                "$.packages[0].versions[0].manifest.dependencies[0].min_version",
            ),
            (
                r#", "manifest": {"provided_ops": [], "extra": 1}"#,
                "$.packages[0].versions[0].manifest.extra",
            ),
        ] {
            assert_eq!(field_error(&doc(extra, "", "")).0, path, "{extra}");
        }
    }

    #[test]
    fn store_state_decode_refuses_every_damage_with_its_reason() {
        assert!(matches!(
            decode(""),
            Err(StoreStateDecodeError::Json(JsonError { .. }))
        ));
        let full = doc("", "", "");
        assert!(matches!(
            decode(&full[..full.len() / 2]),
            Err(StoreStateDecodeError::Json(_))
        ));
        assert_eq!(decode("[]"), Err(StoreStateDecodeError::NotARegistry));
        assert_eq!(
            decode(r#"{"generation": 1}"#),
            Err(StoreStateDecodeError::NotARegistry)
        );
        assert_eq!(
            decode(r#"{"guild_registry": 2, "whatever": true}"#),
            Err(StoreStateDecodeError::UnsupportedFormat {
                found: "2".to_owned()
            })
        );
        assert_eq!(
            decode(r#"{"guild_registry": "1"}"#),
            Err(StoreStateDecodeError::UnsupportedFormat {
                found: "of type string".to_owned()
            })
        );
        assert_eq!(
            field_error(&doc("", "", r#", "extra": 1"#)),
            ("$.extra".to_owned(), FieldProblem::Unknown)
        );
        assert_eq!(
            field_error(&doc(r#", "signature": "x""#, "", "")),
            (
                "$.packages[0].versions[0].signature".to_owned(),
                FieldProblem::Unknown
            )
        );
        assert_eq!(
            field_error(r#"{"guild_registry": 1, "packages": []}"#),
            ("$.generation".to_owned(), FieldProblem::Missing)
        );
        assert_eq!(
            field_error(r#"{"guild_registry": 1, "generation": -1, "packages": []}"#).0,
            "$.generation"
        );
        assert_eq!(
            field_error(r#"{"guild_registry": 1, "generation": 1, "packages": {}}"#),
            (
                "$.packages".to_owned(),
                FieldProblem::WrongType {
                    expected: "array",
                    found: "object"
                }
            )
        );
        let (path, problem) = field_error(&doc("", "", "").replace("enabled", "loaded"));
        assert_eq!(path, "$.packages[0].versions[0].state");
        assert_eq!(
            problem,
            FieldProblem::Invalid {
                detail: "unknown lifecycle state \"loaded\"".to_owned()
            }
        );
        let (path, _) = field_error(&doc("", "", "").replace(DIGEST, "ABC"));
        assert_eq!(path, "$.packages[0].versions[0].payload_sha256");
        let (path, _) = field_error(&doc("", "", "").replace("\"1.0.0\"", "\"1.0\""));
        assert_eq!(path, "$.packages[0].versions[0].version");
        let (path, _) = field_error(&doc("", "", "").replace("\"id\": \"a\"", "\"id\": \"A\""));
        assert_eq!(path, "$.packages[0].id");
    }

    #[test]
    fn store_state_decode_refuses_duplicates_and_broken_invariants() {
        // A duplicate key is refused by the strict reader itself.
        assert!(matches!(
            decode(&doc("", "", r#", "generation": 5"#)),
            Err(StoreStateDecodeError::Json(JsonError {
                kind: json::JsonErrorKind::DuplicateKey { .. },
                ..
            }))
        ));
        let entry = format!(
            r#"{{"version": "1.0.0", "state": "disabled", "kind": "gkmodule", "publisher": "org.example", "payload_sha256": "{DIGEST}"}}"#
        );
        let twice = doc("", "", "").replace("}]}]}", &format!("}}, {entry}]}}]}}"));
        let (path, problem) = field_error(&twice);
        assert_eq!(path, "$.packages[0].versions[1].version");
        assert_eq!(
            problem,
            FieldProblem::Duplicate {
                what: "version",
                value: "1.0.0".to_owned()
            }
        );
        let two_current = twice.replace(
            "\"version\": \"1.0.0\", \"state\": \"disabled\"",
            "\"version\": \"1.1.0\", \"state\": \"disabled\"",
        );
        assert_eq!(
            decode(&two_current),
            Err(StoreStateDecodeError::Invariant(
                StoreStateInvariantError::SeveralCurrent {
                    id: id("a"),
                    first: v("1.0.0"),
                    second: v("1.1.0")
                }
            ))
        );
        let bad_previous = doc("", r#", "previous": "1.0.0""#, "");
        assert_eq!(
            decode(&bad_previous),
            Err(StoreStateDecodeError::Invariant(
                StoreStateInvariantError::PreviousNotRollbackTarget {
                    id: id("a"),
                    version: v("1.0.0"),
                    state: Some(State::Enabled)
                }
            ))
        );
        let staged = doc("", "", "").replace("enabled", "staged");
        assert!(matches!(
            decode(&staged),
            Err(StoreStateDecodeError::Invariant(
                StoreStateInvariantError::UnpersistedState {
                    state: State::Staged,
                    ..
                }
            ))
        ));
        let build_twin = twice.replace(
            "\"version\": \"1.0.0\", \"state\": \"disabled\"",
            "\"version\": \"1.0.0+b\", \"state\": \"removed\"",
        );
        assert!(matches!(
            decode(&build_twin),
            Err(StoreStateDecodeError::Invariant(
                StoreStateInvariantError::SamePrecedence { .. }
            ))
        ));
        let empty =
            r#"{"guild_registry": 1, "generation": 1, "packages": [{"id": "a", "versions": []}]}"#;
        assert_eq!(
            decode(empty),
            Err(StoreStateDecodeError::Invariant(
                StoreStateInvariantError::EmptyPackage { id: id("a") }
            ))
        );
        let dup_pkg = r#"{"guild_registry": 1, "generation": 1, "packages": [{"id": "a", "versions": []}, {"id": "a", "versions": []}]}"#;
        let (path, _) = field_error(dup_pkg);
        assert_eq!(path, "$.packages[1].id");
    }

    #[test]
    fn store_state_decode_errors_read_well() {
        let err = decode(&doc("", "", r#", "extra": 1"#)).unwrap_err();
        assert_eq!(err.to_string(), "unknown field at $.extra");
        let err = decode(r#"{"guild_registry": 7}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "store state format 7 is not supported; this build reads formats 1 (a whole store state), 2 (a checkpoint) and 3 (a checkpoint with an index)"
        );
        let path: JsonPath = [PathSegment::Key("packages".to_owned())]
            .into_iter()
            .collect();
        assert_eq!(path.to_string(), "$.packages");
    }

    /// The reader that decodes straight from the text answers what the tree reader answers for
    /// every document the tree reader accepts, and refuses (leaving the tree reader to name the
    /// error) every document it refuses.
    #[test]
    fn store_state_fast_reader_agrees_with_the_tree_reader() {
        let signature = format!(
            r#", "signatures": [{{"key_id": "{DIGEST}", "algorithm": "ecdsa-p256-sha256", "signature": "00ff"}}]"#
        );
        let facts = r#", "manifest": {"module_abi": 1, "provided_ops": ["a.op.cpu"], "dependencies": [{"package_id": "b", "min_version": "1.0.0", "max_version": "2.0.0"}], "module_dependencies": [{"module_id": "c", "min_version": "1.2.0", "abi_tag": "guild.module.v1", "publisher_id": "org.example", "sha256": "DIGEST"}]}"#.replace("DIGEST", DIGEST);
        let trust = format!(
            r#", "trust": {{"store_id": "0123456789abcdef0123456789abcdef", "generation": 3, "sha256": "{DIGEST}", "revoked_keys": [{{"key_id": "{DIGEST}", "reason": "lost \"it\""}}], "revoked_digests": []}}"#
        );
        let superseded = doc("", "", "").replace(
            "}]}]}",
            &format!(
                r#"}}, {{"version": "0.9.0", "state": "superseded", "kind": "gkmodule", "publisher": "org.example", "payload_sha256": "{DIGEST}", "quarantine": {{"reason": "a file \u00e9 changed", "file": "lib/x.so"}}}}]}}]}}"#
            ),
        );
        let accepted = [
            doc("", "", ""),
            doc(&format!(r#", "trusted_under": "{DIGEST}""#), "", ""),
            doc(
                &format!(r#", "signed_by": ["{DIGEST}", "{DIGEST}"]"#),
                "",
                "",
            ),
            doc(&signature, "", ""),
            doc(&facts, "", ""),
            doc(r#", "manifest": {"provided_ops": []}"#, "", ""),
            doc("", "", &trust),
            superseded.replace("\"id\": \"a\"", "\"id\": \"a\", \"previous\": \"0.9.0\""),
            superseded.replace("\"id\": \"a\"", "\"\\u0069d\": \"\\u0061\""),
            format!(" \n\t{}\r\n", doc("", "", "")),
            r#"{"guild_registry": 1, "generation": 0, "packages": []}"#.to_owned(),
        ];
        for text in &accepted {
            let tree = StoreState::from_tree_of(text.as_bytes(), &[REGISTRY_FORMAT_V1]);
            assert!(tree.is_ok(), "{text}: {tree:?}");
            let fast = StoreState::read_json_of(text.as_bytes(), &[REGISTRY_FORMAT_V1], None);
            assert_eq!(fast, tree.ok(), "{text}");
        }
        let twice = doc("", "", "").replace(
            "}]}]}",
            &format!(
                r#"}}, {{"version": "1.0.0", "state": "disabled", "kind": "gkmodule", "publisher": "org.example", "payload_sha256": "{DIGEST}"}}]}}]}}"#
            ),
        );
        let refused = [
            String::new(),
            doc("", "", "")[..40].to_owned(),
            format!("\u{feff}{}", doc("", "", "")),
            format!("{} x", doc("", "", "")),
            doc("", "", r#", "extra": 1"#),
            doc("", "", r#", "generation": 5"#),
            doc("", r#", "id": "b""#, ""),
            doc(r#", "state": "enabled""#, "", ""),
            doc(r#", "trusted_under": null"#, "", ""),
            doc(r#", "signed_by": [1]"#, "", ""),
            doc(
                r#", "manifest": {"provided_ops": [], "module_abi": 4294967296}"#,
                "",
                "",
            ),
            doc(
                r#", "manifest": {"provided_ops": [], "dependencies": [{"package_id": "b"}]}"#,
                "",
                "",
            ),
            doc("", "", "").replace("enabled", "loaded"),
            doc("", "", "").replace("\"1.0.0\"", "\"1.0\""),
            doc("", "", "").replace("\"guild_registry\": 1", "\"guild_registry\": 2"),
            doc("", "", "").replace("\"generation\": 4", "\"generation\": -4"),
            doc("", r#", "previous": "1.0.0""#, ""),
            doc("", "", "").replace("enabled", "staged"),
            twice,
            r#"{"guild_registry": 1, "generation": 1, "packages": [{"id": "a", "versions": []}]}"#
                .to_owned(),
        ];
        for text in &refused {
            assert!(
                StoreState::from_tree_of(text.as_bytes(), &[REGISTRY_FORMAT_V1]).is_err(),
                "{text}"
            );
            assert_eq!(
                StoreState::read_json_of(text.as_bytes(), &[REGISTRY_FORMAT_V1], None),
                None,
                "{text}"
            );
        }
    }

    /// One operation of the package manager on a store state, for the property tests here and
    /// in `store_log`.
    #[derive(Debug, Clone)]
    pub(crate) enum Op {
        Publish {
            pkg: u8,
            major: u8,
            enable: bool,
        },
        Enable(u8),
        Disable(u8),
        Remove {
            pkg: u8,
            major: u8,
        },
        Rollback(u8),
        /// A new trust file, by its generation.
        Trust(u8),
        /// Every enabled (or installed) version recorded as trusted under today's trust file.
        Retrust {
            installed: bool,
        },
        /// One version recorded so.
        TrustOne {
            pkg: u8,
            major: u8,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3, 0u8..4, any::<bool>()).prop_map(|(pkg, major, enable)| Op::Publish {
                pkg,
                major,
                enable
            }),
            (0u8..3).prop_map(Op::Enable),
            (0u8..3).prop_map(Op::Disable),
            (0u8..3, 0u8..4).prop_map(|(pkg, major)| Op::Remove { pkg, major }),
            (0u8..3).prop_map(Op::Rollback),
            (0u8..3).prop_map(Op::Trust),
            any::<bool>().prop_map(|installed| Op::Retrust { installed }),
            (0u8..3, 0u8..4).prop_map(|(pkg, major)| Op::TrustOne { pkg, major }),
        ]
    }

    /// Sequences of commits, each of a few operations.
    pub(crate) fn steps() -> impl Strategy<Value = Vec<Vec<Op>>> {
        prop::collection::vec(prop::collection::vec(op(), 1..4), 0..15)
    }

    /// The name of package `p` of the property tests.
    pub(crate) fn pkg(p: u8) -> PackageId {
        id(&format!("p{p}"))
    }

    /// Applies `op` to `r`, as the package manager would.
    pub(crate) fn apply_op(r: &mut StoreState, op: Op) -> Result<(), StoreStateError> {
        let ver = |m: u8| Version::new(u64::from(m), 0, 0);
        // Re-records name the trust file the state records (or a stand-in before there is one).
        let digest = r
            .trust_anchor()
            .map_or(Sha256Digest::of(b"none"), |a| a.file_digest);
        match op {
            Op::Publish {
                pkg: p,
                major,
                enable,
            } => r
                .publish(
                    &pkg(p),
                    &ver(major),
                    new_version(&format!("p{p}-{major}")),
                    PublishOptions {
                        enable,
                        allow_downgrade: major % 2 == 0,
                    },
                )
                .map(|_| ()),
            Op::Enable(p) => r.enable(&pkg(p)).map(|_| ()),
            Op::Disable(p) => r.disable(&pkg(p)).map(|_| ()),
            Op::Remove { pkg: p, major } => r.remove(&pkg(p), &ver(major)),
            Op::Rollback(p) => r.rollback(&pkg(p)).map(|_| ()),
            Op::Trust(g) => {
                r.set_trust_anchor(TrustAnchor {
                    binding: TrustBinding {
                        store_id: "0123456789abcdef0123456789abcdef".to_owned(),
                        generation: u64::from(g),
                    },
                    file_digest: Sha256Digest::of(&[g]),
                    revoked_keys: BTreeMap::new(),
                    revoked_digests: BTreeMap::new(),
                });
                Ok(())
            }
            Op::Retrust { installed } => {
                let versions: Vec<(PackageId, Version)> = r
                    .installed()
                    .filter(|(_, _, rec)| installed || rec.state.is_enabled())
                    .map(|(i, v, _)| (i.clone(), v.clone()))
                    .collect();
                for (i, v) in &versions {
                    r.set_trusted_under(i, v, digest);
                }
                Ok(())
            }
            Op::TrustOne { pkg: p, major } => {
                r.set_trusted_under(&pkg(p), &ver(major), digest);
                Ok(())
            }
        }
    }

    proptest! {
        /// Whatever sequence of operations the package manager applies, accepted or refused, the
        /// store state keeps its invariants, a refusal changes nothing, and the file round-trips.
        #[test]
        fn store_state_any_operation_sequence_keeps_the_invariants(steps in steps()) {
            let mut r = StoreState::new();
            for step in steps {
                for op in step {
                    let before = r.clone();
                    if apply_op(&mut r, op).is_err() {
                        prop_assert_eq!(&r, &before);
                    }
                    prop_assert_eq!(r.validate(), Ok(()));
                }
                r = r.successor();
            }
            let back = StoreState::from_json(&r.to_json());
            prop_assert_eq!(&back, &Ok(r.clone()));
            // A format-2 checkpoint, written a package at a time, is its tree's compact form.
            prop_assert_eq!(
                String::from_utf8(r.to_json_as(REGISTRY_FORMAT_V2)).unwrap(),
                r.to_tree(REGISTRY_FORMAT_V2).to_compact_string()
            );
            // The fast reader reads every state written, and reads it as the tree reader does.
            let checkpoint = r.to_checkpoint_json();
            let fast = StoreState::read_json_of(&checkpoint, &FORMATS, None);
            prop_assert_eq!(fast, Some((r.clone(), REGISTRY_FORMAT_V3)));
            prop_assert_eq!(
                StoreState::from_tree_of(&checkpoint, &FORMATS),
                Ok((r.clone(), REGISTRY_FORMAT_V3))
            );
            // The index lists what the records say, and points at each record.
            prop_assert_eq!(
                listing::Listing::from_checkpoint(&checkpoint),
                Ok(Some(listing::Listing::of(&r)))
            );
            for p in 0..4u8 {
                let only = id(&format!("p{p}"));
                let mut want = r.clone();
                want.keep_only(&only);
                prop_assert_eq!(
                    StoreState::read_indexed_only(&checkpoint, &only),
                    Some((want, REGISTRY_FORMAT_V3))
                );
            }
        }
    }
}
