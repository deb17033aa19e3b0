//! The package manager: authenticates packages, validates the dependency graph with the change in
//! place, publishes into the durable store, and carries out enable, disable, remove and rollback.
//!
//! Every change runs under one lifecycle transaction (a mutex held from reading the registry to
//! the end of the durable commit), so the state a change was validated against is the state it
//! replaces, and a failed commit never exposes anything: the in-memory view is updated only after
//! the store reports success.
//!
//! The order of an installation is fixed and is the security argument of the host:
//! 1. read `.gkmetadata` only, parse it strictly, and authenticate it against the trust store;
//! 2. check the platform, the immutable-version rule and the dependency graph;
//! 3. only then extract the artifacts (each hashed from the bytes written) into staging;
//! 4. commit durably. No library is opened by any of this.
//!
//! Two more promises are kept here. The trust file is bound to the store: every trust change is
//! committed with the registry, which records the file's generation, digest and every revocation,
//! and opening refuses a trust file that is missing, older, foreign or altered
//! ([`HostError::TrustBinding`]) until the operator rebuilds it ([`TrustReset`]), which keeps every
//! recorded revocation. And a version that fails re-verification is tainted in the registry,
//! with the reason and the file, whatever the command that found it does next; installing a
//! genuine copy of it replaces its files and lifts the taint.
//!
//! The files of this module follow those concerns: `open` opens a store and re-verifies it,
//! `install` authenticates and installs packages (and repairs or reactivates installed
//! versions), `lifecycle` enables, disables, removes, purges and rolls back, `plan` makes a
//! whole plan of disables and installations (a `guild sync`) as one change, `verify`
//! checks installed versions again and taints what fails, `trust` keeps the trust file bound to
//! the store, `refresh` follows the generations other processes commit and plans the load,
//! `kept` holds the dependency graph and impl-id claims kept between changes, `lease` the
//! session leases, and `types` the options and reports the package manager answers with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::lease::LeaseLedger;
use guild_domain::manifest::Metadata;
use guild_domain::store_state::{PackageRecord, StoreState, VersionRecord};
use guild_domain::version::Version;
use guild_ports::signature::SignatureVerifier;
use guild_ports::source::{PackageSource, Progress};
use guild_ports::store::{PackageStore, Transaction};

use crate::error::HostError;
use guild_domain::platform::HostPlatform;

mod fleet;
mod install;
mod kept;
mod lease;
mod lifecycle;
mod open;
mod plan;
mod refresh;
mod trust;
mod types;
mod verify;
mod view;

use kept::Kept;
use lease::Ledger;

pub use fleet::{FleetChange, Joined};
pub use lease::PackageLease;
pub use plan::{PlanError, PlanStep, StepDone};
pub use refresh::contested_reason;
pub use trust::PortCheck;
pub use types::{
    FullCheck, InstallOptions, Installed, LeftOut, LoadOrder, OpenReport, PackageSummary,
    PlannedPackage, Refreshed, TrustOpened, TrustReset, VerifyFailure, VerifyOptions,
    VersionSummary,
};
pub use view::PackageView;

/// Where a store keeps its files (the lock, the journal, installed trees), re-exported for tools
/// that report on a store without naming the file-system adapter.
pub use guild_adapters_fs::store::StoreLayout;

/// A change the package manager is about to commit, as a [`LifecycleHook`] sees it.
#[derive(Debug)]
pub enum Change<'a> {
    /// A new version was verified and extracted into `dir` (its staging tree).
    Install {
        /// The package.
        id: &'a PackageId,
        /// The new version.
        version: &'a Version,
        /// Its verified staging tree (the library is loaded from here before the commit).
        dir: &'a Path,
        /// Its authenticated metadata.
        metadata: &'a Metadata,
        /// Whether it will be enabled.
        enabled: bool,
    },
    /// The current version, installed in `dir`, becomes enabled.
    Enable {
        /// The package.
        id: &'a PackageId,
        /// Its current version.
        version: &'a Version,
        /// The installed tree.
        dir: PathBuf,
        /// Its authenticated metadata.
        metadata: Arc<Metadata>,
    },
    /// The enabled version becomes disabled.
    Disable {
        /// The package.
        id: &'a PackageId,
        /// The version being disabled.
        version: &'a Version,
    },
    /// A version is removed; `current` says whether it was the current version.
    Remove {
        /// The package.
        id: &'a PackageId,
        /// The version whose files go.
        version: &'a Version,
        /// Whether it is the current version.
        current: bool,
    },
    /// An installed, superseded version offered again becomes current and enabled (the one
    /// that was current becomes the rollback target); its tree is already in `dir`.
    Reactivate {
        /// The package.
        id: &'a PackageId,
        /// The version that was current, if any.
        from: Option<&'a Version>,
        /// The version that becomes current and enabled.
        to: &'a Version,
        /// Its installed tree.
        dir: PathBuf,
        /// Its authenticated metadata.
        metadata: Arc<Metadata>,
    },
    /// The package returns to `to`, installed in `dir`.
    Rollback {
        /// The package.
        id: &'a PackageId,
        /// The version that was current, if any.
        from: Option<&'a Version>,
        /// The previous version, which becomes current and enabled.
        to: &'a Version,
        /// The installed tree of `to`.
        dir: PathBuf,
        /// The authenticated metadata of `to`.
        metadata: Arc<Metadata>,
    },
}

/// Lets the layer above (the kernel registry) take part in the lifecycle transaction: it can
/// refuse a change before the durable commit, and it applies its own part only after the commit
/// succeeded, still under the same lock, so that a failed commit never exposes anything.
///
/// A hook runs while the package manager holds its lifecycle lock, so it must not make a
/// lifecycle change through the package manager. The lease ledger is not held (the change is
/// marked pending in it instead), so queries of leases answer.
pub trait LifecycleHook {
    /// Called after every check passed and before the durable commit. An error aborts the
    /// change; nothing has been written. A plan ([`PackageManager::apply_plan`]) calls it once
    /// per change, in the plan's order, before its one commit; a hook that can hold the part of
    /// one change only (the host's own) is never given a plan.
    fn prepare(&mut self, change: &Change<'_>) -> Result<(), HostError>;
    /// Called once the commit is durable (once for a whole plan).
    fn committed(&mut self);
    /// Called when the commit failed after `prepare` succeeded, and for a plan when a later
    /// change's `prepare` refused after earlier ones succeeded (once either way).
    fn aborted(&mut self);
}

/// The hook of a package manager used on its own.
struct NoHook;

impl LifecycleHook for NoHook {
    fn prepare(&mut self, _: &Change<'_>) -> Result<(), HostError> {
        Ok(())
    }
    fn committed(&mut self) {}
    fn aborted(&mut self) {}
}

/// State that only the lifecycle transaction touches.
struct Lifecycle {
    /// The signed metadata of the installed versions read so far, each from its tree when
    /// something first needed it ([`PackageManager::metadata_for`]).
    metadata: HashMap<(PackageId, Version), Arc<Metadata>>,
    /// Bumped by every trust change this handle writes. The store's lock keeps other processes
    /// from changing the trust file while this handle is open, so an authentication made at the
    /// current epoch still holds.
    trust_epoch: u64,
    /// The trust epoch at which each version was last authenticated by this handle, so that
    /// loading right after a change does not verify its signatures a second time.
    authenticated_at: HashMap<(PackageId, Version), u64>,
    /// The versions that count as authenticated without a check of their own: those the last
    /// opening check found recorded as verified under the trust file then in force
    /// ([`TrustedUnder`]). Kept as that rule rather than as one entry per version in
    /// `authenticated_at`, which filled a table of every enabled version at each opening.
    trusted_under: Option<TrustedUnder>,
    /// Whether the metadata of every installed version has been read (a handle opened with
    /// [`PackageManager::open_dir_committed`] reads it only when a query needs it).
    caught_up: bool,
    /// The registry generation this state was built from.
    generation: u64,
    /// The digest of the trust bytes this state was authenticated under.
    trust_digest: Option<Sha256Digest>,
    /// A reader's own view: the committed registry with what failed verification in this
    /// process disabled. Never written; `None` when nothing failed (or for a writer, which
    /// commits what fails instead).
    local_view: Option<StoreState>,
    /// The dependency graph and impl-id claims of the committed registry, kept between changes
    /// ([`Kept`]); `None` until a change first needs them.
    kept: Option<Kept>,
    /// Whether a change was judged on an index built around it instead of on `kept`
    /// ([`PackageManager::judged_on`]): the next change builds `kept`.
    judged_around: bool,
}

/// The rule an opening check leaves behind ([`PackageManager::verify_enabled`] at
/// [`verify::Scope::Open`]): a version enabled in `registry` whose record says it was verified
/// under the trust file `anchor` (`trusted_under`) was authenticated at trust epoch `epoch`,
/// exactly as if it had been checked then. It holds only while the trust epoch stays `epoch`.
struct TrustedUnder {
    /// The registry (for a reader, its own view) the check read; its chunks are shared with the
    /// store's, so keeping it costs a pointer per chunk.
    registry: StoreState,
    /// The digest of the trust file in force, as the registry records it.
    anchor: Sha256Digest,
    /// The trust epoch of the check.
    epoch: u64,
}

impl TrustedUnder {
    /// Whether `id@version` counts as authenticated at trust epoch `epoch` under this rule.
    fn admits(&self, id: &PackageId, version: &Version, epoch: u64) -> bool {
        self.epoch == epoch
            && self.registry.record(id, version).is_some_and(|r| {
                r.state.is_enabled() && r.trusted_under.as_ref() == Some(&self.anchor)
            })
    }
}

/// A reader's hold on the store's exclusive lock for one transaction; see
/// [`PackageStore::begin_write`].
struct WriteSession<'s>(&'s dyn PackageStore);

impl Drop for WriteSession<'_> {
    fn drop(&mut self) {
        self.0.end_write();
    }
}

/// The package manager over one store. See the module documentation for the order of an
/// installation.
///
/// Used on its own it changes the store only: nothing is loaded. A runner that also wants the
/// libraries loaded makes its changes through guild-host's `Host`, which owns a package manager
/// and lets the kernel registry take part in each change.
///
/// # Examples
///
#[doc = include_str!("example.md")]
pub struct PackageManager {
    store: Box<dyn PackageStore>,
    source: Box<dyn PackageSource>,
    verifier: Box<dyn SignatureVerifier>,
    platform: HostPlatform,
    lifecycle: Mutex<Lifecycle>,
    leases: Arc<Ledger>,
    /// Told how far an installation's reading of artifacts has come, when someone watches.
    progress: Mutex<Option<Arc<dyn Progress>>>,
    /// Opened to read the committed state only ([`PackageManager::open_dir_committed`]):
    /// metadata is read when a query needs it, and catching up checks no signature.
    committed_only: bool,
    /// The trust a fleet policy brings, while the plan that commits it is drafted under the
    /// lifecycle lock: its packages are judged by the trust they will be committed with, not
    /// by the trust file it replaces. `None` at every other time.
    plan_trust: Mutex<Option<guild_domain::trust::TrustStore>>,
}

impl std::fmt::Debug for PackageManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageManager")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

impl PackageManager {
    /// Takes the store's exclusive lock for one change when this handle is a reader, and
    /// catches up with what other processes committed meanwhile.
    fn write_session(&self, life: &mut Lifecycle) -> Result<WriteSession<'_>, HostError> {
        self.store.begin_write()?;
        let session = WriteSession(&*self.store);
        if self.store.is_reader() {
            self.catch_up(life)?;
        }
        Ok(session)
    }

    /// Pins `id@version` for this process ([`PackageStore::pin`]): while the pin lives no other
    /// process deletes the version's files.
    pub fn pin(
        &self,
        id: &PackageId,
        version: &Version,
    ) -> Result<guild_ports::store::StorePin, HostError> {
        Ok(self.store.pin(id, version)?)
    }

    /// Pins `id@version` while the change in progress installs it, before its commit
    /// ([`PackageStore::pin_installing`]).
    pub fn pin_installing(
        &self,
        id: &PackageId,
        version: &Version,
    ) -> Result<guild_ports::store::StorePin, HostError> {
        Ok(self.store.pin_installing(id, version)?)
    }

    /// The live processes that pin versions of `id` (of every package when `None`).
    pub fn pins(
        &self,
        id: Option<&PackageId>,
    ) -> Result<Vec<guild_ports::store::VersionPins>, HostError> {
        let mut pins = self.store.pins()?;
        pins.retain(|p| id.is_none_or(|id| &p.node.id == id));
        Ok(pins)
    }

    /// Whether this package manager is a reader ([`PackageStore::is_reader`]).
    pub fn is_reader(&self) -> bool {
        self.store.is_reader()
    }

    /// The store's root directory (the parent of its trust file).
    pub fn store_root(&self) -> PathBuf {
        let trust = self.store.trust_path();
        trust.parent().map(Path::to_path_buf).unwrap_or(trust)
    }

    fn lock(&self) -> MutexGuard<'_, Lifecycle> {
        // The lifecycle state is rebuilt from the store on every change, and an in-memory update
        // happens only after a successful commit, so a poisoned lock holds no torn state.
        self.lifecycle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits `tx` and tells `hook` how it went.
    fn commit(&self, tx: Transaction, hook: &mut dyn LifecycleHook) -> Result<(), HostError> {
        match self.store.commit(tx) {
            Ok(_) => {
                hook.committed();
                Ok(())
            }
            Err(e) => {
                hook.aborted();
                Err(e.into())
            }
        }
    }

    /// The signature verifier packages and fleet documents are checked with.
    pub fn verifier(&self) -> &dyn SignatureVerifier {
        &*self.verifier
    }

    /// The platform packages are checked against.
    pub fn platform(&self) -> &HostPlatform {
        &self.platform
    }

    /// The signed metadata of an installed version: the lifecycle state's copy, or else its
    /// tree's `.gkmetadata` read now ([`PackageManager::metadata_for`]) with the record the
    /// store's registry holds.
    fn loaded_metadata(
        &self,
        life: &Lifecycle,
        id: &PackageId,
        version: &Version,
    ) -> Result<Arc<Metadata>, HostError> {
        if let Some(m) = life.metadata.get(&(id.clone(), version.clone())) {
            return Ok(m.clone());
        }
        let registry = self.store.registry()?;
        let record = registry
            .record(id, version)
            .filter(|r| r.state.is_installed())
            .ok_or_else(|| HostError::InstalledTree {
                package: format!("{id}@{version}"),
                path: self.store.package_dir(id, version),
                problem: "the registry does not record it as installed".into(),
            })?;
        self.metadata_for(life, id, version, record)
    }

    /// [`PackageManager::loaded_metadata`], kept in the lifecycle state once read.
    fn kept_metadata(
        &self,
        life: &mut Lifecycle,
        id: &PackageId,
        version: &Version,
    ) -> Result<Arc<Metadata>, HostError> {
        let metadata = self.loaded_metadata(life, id, version)?;
        life.metadata
            .entry((id.clone(), version.clone()))
            .or_insert_with(|| metadata.clone());
        Ok(metadata)
    }

    /// The signed metadata of installed version `id@version`, whose registry record is
    /// `record`: the lifecycle state's copy, or else its tree's `.gkmetadata` read now, with
    /// the signatures the record adds, and refused unless it carries the payload digest the
    /// record holds. Opening reads none of them: each is read when something first needs it.
    fn metadata_for(
        &self,
        life: &Lifecycle,
        id: &PackageId,
        version: &Version,
        record: &VersionRecord,
    ) -> Result<Arc<Metadata>, HostError> {
        if let Some(m) = life.metadata.get(&(id.clone(), version.clone())) {
            return Ok(m.clone());
        }
        let dir = self.store.package_dir(id, version);
        let metadata = open::read_installed_metadata(&dir, id, version)
            .and_then(|m| open::with_record_signatures(m, record, &dir, id, version))?;
        if metadata.payload_digest() != record.payload_digest {
            return Err(HostError::InstalledTree {
                package: format!("{id}@{version}"),
                path: dir.join(guild_domain::path::RESERVED_METADATA_NAME),
                problem: format!(
                    "its .gkmetadata has payload digest {}, the registry records {}",
                    metadata.payload_digest(),
                    record.payload_digest
                ),
            });
        }
        Ok(Arc::new(metadata))
    }

    /// Every recorded package with its versions.
    pub fn list(&self) -> Result<Vec<PackageSummary>, HostError> {
        let registry = self.store.registry()?;
        let leases = self.lock_leases();
        Ok(registry
            .packages()
            .filter_map(|(id, record)| summary(id, record, &leases))
            .collect())
    }

    /// Every recorded package as a listing shows it (id, kind, publisher, current version with
    /// its state and signing keys, rollback target, taints), in id order: what `guild list`
    /// prints. On a package manager opened for it ([`PackageManager::open_dir_listing`]) this is
    /// read from the checkpoint's index, without decoding a record.
    pub fn listing(&self) -> Result<guild_domain::store_state::listing::Listing, HostError> {
        Ok(self.store.listing()?)
    }

    /// Package `id` with its versions, as [`PackageManager::list`] shows it; `None` when the
    /// registry does not record it. Reads that one package, so that `guild status ID` does not
    /// grow with the store.
    pub fn summary(&self, id: &PackageId) -> Result<Option<PackageSummary>, HostError> {
        let registry = self.store.registry()?;
        let leases = self.lock_leases();
        Ok(registry
            .package(id)
            .and_then(|record| summary(id, record, &leases)))
    }

    /// The generation of the committed registry (it grows by one with every change).
    pub fn generation(&self) -> Result<u64, HostError> {
        Ok(self.store.registry()?.generation())
    }

    /// The signed metadata of installed version `id@version`, read from its tree the first time
    /// it is asked for; an error names what is wrong with the tree (its `.gkmetadata` missing,
    /// unreadable, or not the payload the registry records).
    pub fn installed_metadata(
        &self,
        id: &PackageId,
        version: &Version,
    ) -> Result<Arc<Metadata>, HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        self.kept_metadata(&mut life, id, version)
    }

    /// The signed metadata of an installed version ([`PackageManager::installed_metadata`]),
    /// `None` when it cannot be read.
    pub fn metadata(&self, id: &PackageId, version: &Version) -> Option<Arc<Metadata>> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life).ok()?;
        self.kept_metadata(&mut life, id, version).ok()
    }
}

/// What [`PackageManager::list`] shows of package `id`; `None` for a record without versions
/// (which the registry's invariants never let through).
fn summary(id: &PackageId, record: &PackageRecord, leases: &LeaseLedger) -> Option<PackageSummary> {
    let (_, first) = record.versions().next()?;
    Some(PackageSummary {
        id: id.clone(),
        kind: first.kind,
        publisher: first.publisher.clone(),
        versions: record
            .versions()
            .map(|(v, r)| VersionSummary {
                version: v.clone(),
                state: r.state,
                payload_digest: r.payload_digest,
                taint: r.taint.clone(),
                signatures_added: r.signatures.iter().map(|s| s.key_id).collect(),
                signed_by: r.signed_by.clone(),
            })
            .collect(),
        enabled: record.enabled().cloned(),
        previous: record.previous().cloned(),
        leases: leases.active(id),
    })
}
