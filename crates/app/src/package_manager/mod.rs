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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use guild_domain::claims::{
    claiming_versions, claiming_versions_of, conflicts, Claim, ClaimIndex, ImplIdConflict,
};
use guild_domain::graph::{DependencyGraph, GraphIndex, NodeRef, PackageNode};
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::lease::{ActiveLeases, LeaseKind, LeaseLedger, QuiescentAction};
use guild_domain::manifest::Metadata;
use guild_domain::path::RESERVED_METADATA_NAME;
use guild_domain::store_state::{
    NewVersion, PackageRecord, PublishKind, PublishOptions, StoreState, Taint,
};
use guild_domain::trust::{
    authenticate, check_trust_file, Authenticated, SignatureCheck, TrustFileMismatch, TrustStore,
};
use guild_domain::version::Version;
use guild_ports::signature::SignatureVerifier;
use guild_ports::source::{OpenedPackage, PackageSource, Progress};
use guild_ports::store::{PackageStore, RecoveryReport, StoreErrorKind, Transaction, VersionPins};

use crate::error::HostError;

use crate::platform::HostPlatform;
/// Where a store keeps its files (the lock, the journal, installed trees), re-exported for tools
/// that report on a store without naming the file-system adapter.
pub use guild_adapters_fs::store::StoreLayout;

/// How to install a package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstallOptions {
    /// Whether the new version starts enabled (the default) or disabled.
    pub enable: bool,
    /// Whether a version older than the current one may be installed. Rollback is the normal
    /// way back to an older version; this is the explicit escape hatch.
    pub allow_downgrade: bool,
}

impl Default for InstallOptions {
    fn default() -> Self {
        InstallOptions {
            enable: true,
            allow_downgrade: false,
        }
    }
}

/// What an installation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The package.
    pub id: PackageId,
    /// The version installed.
    pub version: Version,
    /// Kernel plugin or runtime module.
    pub kind: PackageKind,
    /// SHA-256 of the canonical unsigned payload: what `trust revoke-package` and dependency
    /// pins name.
    pub payload_digest: Sha256Digest,
    /// The publisher whose trusted key authenticated it.
    pub publisher: PublisherId,
    /// The id of the key whose signature verified.
    pub key_id: Sha256Digest,
    /// False when this exact payload was already installed and nothing changed.
    pub changed: bool,
    /// Whether this version is now the enabled one.
    pub enabled: bool,
    /// The version that was current before and is now the rollback target.
    pub superseded: Option<Version>,
    /// True when this version was already installed (superseded, after a rollback say) and was
    /// made current and enabled again instead of being extracted anew.
    pub reactivated: bool,
    /// True when this version was installed but tainted or damaged, and its files were
    /// replaced by the offered package's (verified as they were written); its taint is
    /// lifted.
    pub repaired: bool,
}

/// A package version that was disabled (it failed re-verification, or depends on one that did)
/// or left out of a load, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    /// The package.
    pub id: PackageId,
    /// The version that was disabled or not loaded.
    pub version: Version,
    /// Why it can no longer be trusted, or which failed dependency it needs.
    pub reason: String,
}

/// What opening the package manager found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// What the store's recovery did before anything else.
    pub recovery: RecoveryReport,
    /// Enabled packages that failed re-verification (revoked key or digest, damaged tree), that
    /// depend on one, or whose dependencies are otherwise not met, and were therefore disabled.
    pub disabled: Vec<LeftOut>,
    /// How many enabled versions opening accepted as authenticated: under the trust file their
    /// record names ([`guild_domain::store_state::VersionRecord::trusted_under`]) or re-checked now.
    /// Opening hashes no file; the host re-hashes a version's files right before it loads it.
    pub verified: usize,
    /// How many of those had their signatures checked again, because the trust file changed
    /// since they were last authenticated (or the store predates that record).
    pub reauthenticated: usize,
    /// Opened to read the committed state only ([`PackageManager::open_dir_committed`]): no
    /// signature was checked and no `.gkmetadata` read at opening.
    pub committed_only: bool,
    /// Installed versions whose tree was missing or unreadable: each was marked removed (its
    /// dependents, if any, are among [`OpenReport::disabled`]).
    pub removed: Vec<LeftOut>,
    /// What opening did to the trust file, if anything: bound a store's unbound trust file, or
    /// rebuilt it as [`PackageManager::open_resetting_trust`] asked.
    pub trust: Option<TrustOpened>,
    /// Opened as a reader ([`PackageManager::open_dir_reader`]): nothing was recovered or
    /// written, and [`OpenReport::disabled`] lists what this process leaves out, not what the
    /// store records (the next writer records it).
    pub read_only: bool,
}

/// How [`PackageManager::verify_all`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VerifyOptions {
    /// Worker threads; `None` for one per core
    /// ([`std::thread::available_parallelism`]).
    pub jobs: Option<usize>,
}

/// One installed version that failed a full check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyFailure {
    /// The package.
    pub id: PackageId,
    /// The version.
    pub version: Version,
    /// Its state when it was checked (an enabled one is disabled by the check).
    pub state: guild_domain::lifecycle::State,
    /// The file concerned, relative to the installed tree (`.gkmetadata` for a signature).
    pub file: Option<String>,
    /// What was found.
    pub reason: String,
    /// Whether it is tamper evidence (a changed file or signature) rather than a trust decision
    /// (a revocation, a key no longer trusted).
    pub tampered: bool,
}

/// What [`PackageManager::verify_all`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FullCheck {
    /// Installed versions checked.
    pub checked: usize,
    /// Worker threads used.
    pub jobs: usize,
    /// Every version that failed, by id then version.
    pub failures: Vec<VerifyFailure>,
    /// Enabled versions disabled: those that failed and those that depend on them.
    pub disabled: Vec<LeftOut>,
    /// Whether [`FullCheck::disabled`] is recorded in the store (a writer) or only left out of
    /// this process's view (a reader: the load-time check still refuses a changed file).
    pub recorded: bool,
}

/// How to rebuild a trust file that the registry does not recognise (missing, an older copy,
/// another store's, changed by hand, unreadable): the `guild trust reset` command.
///
/// The new trust file keeps every revocation the registry recorded and every revocation of the
/// file found (when it can be read). It trusts no key unless `keep_keys` asks to keep the keys of
/// the file found, except revoked ones; the operator can then `trust add` what is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrustReset {
    /// Keep the keys that the trust file found trusts (it must be readable).
    pub keep_keys: bool,
}

/// What opening did to the trust file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustOpened {
    /// The store predates trust binding: its trust file was bound to it at `generation`.
    Bound {
        /// The trust file's generation now.
        generation: u64,
    },
    /// The trust file was rebuilt ([`TrustReset`]).
    Rebuilt {
        /// What was wrong with the file found, or `None` when it was the right one.
        found: Option<String>,
        /// The new trust file's generation.
        generation: u64,
        /// Keys trusted in the new file.
        keys: usize,
        /// Revoked keys in the new file.
        revoked_keys: usize,
        /// Revoked payloads in the new file.
        revoked_payloads: usize,
    },
}

/// An enabled package the loader should open, in dependency order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPackage {
    /// The package.
    pub id: PackageId,
    /// Its enabled version.
    pub version: Version,
    /// Its installed tree.
    pub dir: PathBuf,
}

/// The enabled packages in load order, and those that cannot load with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadOrder {
    /// What can load, dependencies first.
    pub order: Vec<PlannedPackage>,
    /// Enabled packages whose dependencies are not met (or that sit on a cycle), with why.
    pub blocked: Vec<LeftOut>,
}

/// One installed version, as `list` and `status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSummary {
    /// The version.
    pub version: Version,
    /// Enabled, disabled, superseded or removed.
    pub state: guild_domain::lifecycle::State,
    /// SHA-256 of its canonical unsigned payload.
    pub payload_digest: Sha256Digest,
    /// Why it is tainted, while it is.
    pub taint: Option<Taint>,
}

/// One package id with all its recorded versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSummary {
    /// The package.
    pub id: PackageId,
    /// Kernel plugin or runtime module (the same for every version).
    pub kind: PackageKind,
    /// Its publisher (the same for every version).
    pub publisher: PublisherId,
    /// Every recorded version, removed ones included, in ascending order.
    pub versions: Vec<VersionSummary>,
    /// The enabled version, if any.
    pub enabled: Option<Version>,
    /// The version `rollback` returns to, if any.
    pub previous: Option<Version>,
    /// Session leases on the package. Bindings into loaded code are counted by the kernel
    /// registry; [`crate::Host::active_package_leases`] adds both.
    pub leases: ActiveLeases,
}

/// An explicit session lease on a package: while it lives, the changes that would unload or
/// replace the package's code (disable, installing a new version, rollback, removal of the
/// current version) are refused with [`HostError::Leased`]. Dropping it releases the lease; that
/// never waits for a change in progress (the ledger is not held across one).
#[derive(Debug)]
pub struct PackageLease {
    id: PackageId,
    ledger: Arc<Ledger>,
}

impl PackageLease {
    /// The leased package.
    pub fn package(&self) -> &PackageId {
        &self.id
    }
}

impl Drop for PackageLease {
    fn drop(&mut self) {
        // A lease is only created by a successful acquire, so the release cannot underflow.
        let mut ledger = self.ledger.lock();
        let left = ledger.release(&self.id, LeaseKind::Lease);
        drop(ledger);
        if left.is_ok_and(|a| a.leases == 0) {
            self.ledger.released.notify_all();
        }
    }
}

/// The lease ledger behind its lock, and the condition its last lease on a package signals.
///
/// The lock is a leaf, held for one update at a time: a change takes it to check quiescence and
/// mark itself pending ([`LeaseLedger::begin_change`]) and again to end, never across
/// extraction, loading, a hook or the durable commit. So a lease drop or a ledger query never
/// waits for an installation, and a plugin callback that queries the package manager's leases
/// while its package loads finds the lock free.
#[derive(Debug, Default)]
struct Ledger {
    state: Mutex<LeaseLedger>,
    released: Condvar,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, LeaseLedger> {
        // A poisoned ledger still holds valid counts: every update is a single assignment.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A change marked pending in the ledger; dropping it ends the change, committed or not.
struct PendingChange<'a> {
    ledger: &'a Ledger,
    id: PackageId,
}

impl Drop for PendingChange<'_> {
    fn drop(&mut self) {
        self.ledger.lock().end_change(&self.id);
    }
}

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
    /// change; nothing has been written.
    fn prepare(&mut self, change: &Change<'_>) -> Result<(), HostError>;
    /// Called once the commit is durable.
    fn committed(&mut self);
    /// Called when the commit failed after `prepare` succeeded.
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

/// Ends a watched piece of work when dropped, whether it finished or failed.
struct Watch(Option<Arc<dyn Progress>>);

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.finish();
        }
    }
}

/// Bridges the crypto port to the domain's signature check.
pub(crate) struct PortCheck<'a>(pub(crate) &'a dyn SignatureVerifier);

impl SignatureCheck for PortCheck<'_> {
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        self.0
            .verify(spki_der, message, signature)
            .map_err(|e| e.to_string())
    }
}

/// State that only the lifecycle transaction touches.
struct Lifecycle {
    /// The signed metadata of every installed version, read from its tree.
    metadata: HashMap<(PackageId, Version), Arc<Metadata>>,
    /// Bumped by every trust change this handle writes. The store's lock keeps other processes
    /// from changing the trust file while this handle is open, so an authentication made at the
    /// current epoch still holds.
    trust_epoch: u64,
    /// The trust epoch at which each version was last authenticated, so that loading right after
    /// opening does not verify every signature a second time.
    authenticated_at: HashMap<(PackageId, Version), u64>,
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
}

/// What the package manager keeps of the committed registry between changes, so that checking
/// one reads only around the package it changes: every installed version's dependency records
/// with the reverse edges ([`GraphIndex`]), and the impl ids each package's current version and
/// rollback target hold ([`ClaimIndex`]). Built from the registry at `generation` and the
/// metadata the lifecycle holds; each change this handle commits replaces the changed package's
/// part, and any other commit (another process's, a taint, a trust change) leaves it
/// behind, to be built again by the next change that needs it.
struct Kept {
    /// The registry generation it describes.
    generation: u64,
    /// The installed versions and their edges.
    graph: GraphIndex,
    /// The claims on impl ids.
    claims: ClaimIndex,
}

/// A change's part of [`Kept`]: the changed package's installed versions and claims as the draft
/// records them, put in place once the change is committed ([`PackageManager::advance`]).
struct KeptChange {
    /// The generation the change was checked against.
    from: u64,
    /// The generation it commits.
    to: u64,
    /// The package.
    id: PackageId,
    /// Its installed versions afterwards.
    nodes: Vec<PackageNode>,
    /// Its claims afterwards.
    claims: Vec<Claim>,
}

/// What [`PackageManager::refresh`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// The committed generation before and after.
    pub from_generation: u64,
    /// The committed generation now in view.
    pub generation: u64,
    /// Whether the trust file changed (so every loaded version is authenticated again).
    pub trust_changed: bool,
    /// Enabled versions that this process does not load because they failed verification (or
    /// depend on one that did); a reader writes nothing, so they stay enabled in the store.
    pub unusable: Vec<LeftOut>,
}

/// A committed registry saved by [`PackageManager::savepoint`], to return to with
/// [`PackageManager::restore`].
#[derive(Debug, Clone)]
pub struct Savepoint(StoreState);

impl Savepoint {
    /// The registry generation it saved.
    pub fn generation(&self) -> u64 {
        self.0.generation()
    }
}

/// A package offered for installation once it is authenticated: the opened package, its
/// metadata, its `id@version` label and who signed it.
type Authenticating = (Box<dyn OpenedPackage>, Arc<Metadata>, String, Authenticated);

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
/// libraries loaded makes its changes through [`Host`](crate::Host), which owns a package
/// manager and lets the kernel registry take part in each change.
///
/// # Examples
///
/// Trust a publisher's key and install a package, as `guild trust add` and `guild install` do:
///
/// ```no_run
/// use std::path::Path;
///
/// use guild_host::{InstallOptions, PackageManager, PublisherId};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (pm, opened) = PackageManager::open_dir(Path::new("/var/lib/guild"))?;
/// assert!(opened.disabled.is_empty(), "opening disabled packages: {:?}", opened.disabled);
///
/// // The publisher's public key, DER-encoded SubjectPublicKeyInfo (`guild keygen` writes it as
/// // PEM; `openssl pkey -pubin -outform DER` converts it).
/// let spki_der = std::fs::read("org-example.pub.der")?;
/// let publisher = PublisherId::new("org.example")?;
/// let key_id = pm.update_trust(|trust| Ok(trust.add_key(publisher, spki_der)?))?;
/// println!("trusted key {key_id}");
///
/// let installed = pm.install(Path::new("scan.gkmodule"), InstallOptions::default())?;
/// println!(
///     "installed {} {} signed by {} (payload {})",
///     installed.id, installed.version, installed.publisher, installed.payload_digest
/// );
/// # Ok(())
/// # }
/// ```
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
}

impl std::fmt::Debug for PackageManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageManager")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

impl PackageManager {
    /// Opens the package manager over a store that has already run its recovery (its report is
    /// passed in so that it can be returned with the rest). Every installed version's metadata is
    /// read back and must match its recorded digest; every enabled version is re-verified against
    /// the current trust store and its artifacts are re-hashed. Enabled packages that fail, and
    /// the enabled packages that depend on them, are disabled in one durable transaction and
    /// reported; a version that failed itself is recorded as tainted.
    ///
    /// A trust file that cannot be read fails the open, and so does one that is not the file the
    /// registry recorded ([`HostError::TrustBinding`]): missing, older, another store's, or
    /// changed outside guild. Nothing is written before either check.
    pub fn open(
        store: Box<dyn PackageStore>,
        recovery: RecoveryReport,
        source: Box<dyn PackageSource>,
        verifier: Box<dyn SignatureVerifier>,
        platform: HostPlatform,
    ) -> Result<(Self, OpenReport), HostError> {
        Self::open_with(store, recovery, source, verifier, platform, None, false)
    }

    /// [`PackageManager::open`], but first rebuilding the trust file as `reset` says, whatever
    /// is wrong with the one found (or if nothing is): the way out of a
    /// [`HostError::TrustBinding`] or [`HostError::TrustFile`] refusal. Every revocation the
    /// registry recorded is kept. The rebuilt file and its record are one transaction.
    pub fn open_resetting_trust(
        store: Box<dyn PackageStore>,
        recovery: RecoveryReport,
        source: Box<dyn PackageSource>,
        verifier: Box<dyn SignatureVerifier>,
        platform: HostPlatform,
        reset: TrustReset,
    ) -> Result<(Self, OpenReport), HostError> {
        Self::open_with(
            store,
            recovery,
            source,
            verifier,
            platform,
            Some(reset),
            false,
        )
    }

    fn open_with(
        store: Box<dyn PackageStore>,
        recovery: RecoveryReport,
        source: Box<dyn PackageSource>,
        verifier: Box<dyn SignatureVerifier>,
        platform: HostPlatform,
        reset: Option<TrustReset>,
        committed_only: bool,
    ) -> Result<(Self, OpenReport), HostError> {
        let store_is_reader = store.is_reader();
        let pm = PackageManager {
            store,
            source,
            verifier,
            platform,
            lifecycle: Mutex::new(Lifecycle {
                metadata: HashMap::new(),
                trust_epoch: 0,
                authenticated_at: HashMap::new(),
                caught_up: false,
                generation: 0,
                trust_digest: None,
                local_view: None,
                kept: None,
            }),
            leases: Arc::new(Ledger::default()),
            progress: Mutex::new(None),
            committed_only: committed_only && store_is_reader,
        };
        let mut report = OpenReport {
            recovery,
            ..OpenReport::default()
        };
        if pm.store.is_reader() {
            let mut life = pm.lock();
            if reset.is_some() {
                return Err(HostError::Store(guild_ports::store::StoreError::new(
                    guild_ports::store::StoreErrorKind::InvalidTransaction,
                    "a reader cannot rebuild the trust file; open the store as a writer",
                )));
            }
            pm.check_trust_binding()?;
            report.read_only = true;
            if pm.committed_only {
                report.committed_only = true;
                drop(life);
                return Ok((pm, report));
            }
            let checked = pm.catch_up(&mut life)?;
            report.verified = checked.verified;
            report.reauthenticated = checked.reauthenticated;
            report.disabled = checked.disabled;
            drop(life);
            return Ok((pm, report));
        }
        {
            let mut life = pm.lock();
            report.trust = match reset {
                None => pm.check_trust_binding()?,
                Some(reset) => Some(pm.rebuild_trust(reset)?),
            };
            let mut registry = pm.store.registry()?;
            let mut damaged: Vec<(PackageId, Version, String)> = Vec::new();
            for (id, version, record) in registry.installed() {
                let dir = pm.store.package_dir(id, version);
                let metadata = match read_installed_metadata(&dir, id, version) {
                    Ok(m) => m,
                    Err(e) => {
                        damaged.push((id.clone(), version.clone(), e.to_string()));
                        continue;
                    }
                };
                if metadata.payload_digest() != record.payload_digest {
                    damaged.push((
                        id.clone(),
                        version.clone(),
                        format!(
                            "its .gkmetadata has payload digest {}, the registry records {}",
                            metadata.payload_digest(),
                            record.payload_digest
                        ),
                    ));
                    continue;
                }
                life.metadata
                    .insert((id.clone(), version.clone()), Arc::new(metadata));
            }
            if !damaged.is_empty() {
                // A version whose tree is gone or unreadable cannot be verified, loaded or
                // rolled back to; it is recorded as removed (so the same version can only come
                // back with the same content, by installing it again) instead of making the
                // whole store unusable, and whatever depended on it is disabled below.
                let mut next = registry.successor();
                for (id, version, problem) in damaged {
                    let enabled = next.package(&id).and_then(|p| p.enabled()) == Some(&version);
                    if enabled {
                        next.disable(&id)?;
                    }
                    next.remove(&id, &version)?;
                    report.removed.push(LeftOut {
                        id,
                        version,
                        reason: format!(
                            "its installed tree is damaged ({problem}); it was marked removed: \
                             install the package again to restore it"
                        ),
                    });
                }
                pm.store
                    .commit(Transaction::new(registry.generation(), next))?;
                registry = pm.store.registry()?;
            }

            let checked = pm.verify_enabled(&mut life, &registry, Scope::Open)?;
            report.verified = checked.verified;
            report.reauthenticated = checked.reauthenticated;
            report.disabled = checked.disabled;
            life.caught_up = true;
            life.generation = registry.generation();
            life.trust_digest = pm.store.read_trust()?.map(|b| Sha256Digest::of(&b));
            // A writer is there to make changes: build what each change reads now, once. It
            // only reads what opening already holds; if it cannot be built, the first change
            // builds it again and reports why.
            let committed = pm.store.registry()?;
            let _ = pm.kept(&mut life, &committed);
        }
        Ok((pm, report))
    }

    /// Brings the lifecycle state in line with the store's view (a reader's newest committed
    /// generation): reads the metadata of versions it has not seen, forgets removed ones, starts
    /// a new trust epoch when the trust file changed, and (for a reader) works out in memory
    /// which enabled versions it cannot load (signatures only where the trust file changed since
    /// they were authenticated; no file is hashed). Answers what it checked, with the unusable
    /// versions in [`Checked::disabled`].
    fn catch_up(&self, life: &mut Lifecycle) -> Result<Checked, HostError> {
        let registry = self.store.registry()?;
        let mut damaged = Vec::new();
        for (id, version, record) in registry.installed() {
            let key = (id.clone(), version.clone());
            if life.metadata.contains_key(&key) {
                continue;
            }
            let dir = self.store.package_dir(id, version);
            match read_installed_metadata(&dir, id, version) {
                Ok(m) if m.payload_digest() == record.payload_digest => {
                    life.metadata.insert(key, Arc::new(m));
                }
                Ok(m) => damaged.push(LeftOut {
                    id: id.clone(),
                    version: version.clone(),
                    reason: format!(
                        "its .gkmetadata has payload digest {}, the registry records {}",
                        m.payload_digest(),
                        record.payload_digest
                    ),
                }),
                Err(e) => damaged.push(LeftOut {
                    id: id.clone(),
                    version: version.clone(),
                    reason: format!("its installed tree is damaged ({e})"),
                }),
            }
        }
        life.metadata
            .retain(|(id, version), _| registry.is_installed(id, version));
        life.caught_up = true;
        let digest = self.store.read_trust()?.map(|b| Sha256Digest::of(&b));
        if digest != life.trust_digest {
            life.trust_epoch += 1;
            life.trust_digest = digest;
        }
        life.generation = registry.generation();
        if !self.store.is_reader() {
            return Ok(Checked::default());
        }
        // A reader takes what it cannot verify out of its own view only: the next writer that
        // opens the store decides for the store.
        let mut view = registry.successor();
        for d in &damaged {
            if view.package(&d.id).and_then(|p| p.enabled()) == Some(&d.version) {
                view.disable(&d.id)?;
            }
            view.remove(&d.id, &d.version)?;
        }
        life.local_view = None;
        let mut checked = if self.committed_only {
            Checked::default()
        } else {
            self.verify_enabled(life, &view, Scope::Open)?
        };
        if life.local_view.is_none() && !damaged.is_empty() {
            life.local_view = Some(view);
        }
        checked.disabled.extend(damaged);
        Ok(checked)
    }

    /// Reads the metadata of every installed version if this handle has not yet
    /// ([`PackageManager::open_dir_committed`] defers it to the first query that needs it).
    fn ensure_caught_up(&self, life: &mut Lifecycle) -> Result<(), HostError> {
        if !life.caught_up {
            self.catch_up(life)?;
        }
        Ok(())
    }

    /// Moves a reader's view to the newest committed generation and catches up with it
    /// ([`PackageStore::refresh`]); a writer's view is always current. Cheap when nothing was
    /// committed since: a few small reads (the registry file and the trust file it names).
    pub fn refresh(&self) -> Result<Refreshed, HostError> {
        let mut life = self.lock();
        let from = life.generation;
        let generation = self.store.refresh()?;
        if generation == from {
            return Ok(Refreshed {
                from_generation: from,
                generation,
                ..Refreshed::default()
            });
        }
        let epoch = life.trust_epoch;
        let checked = self.catch_up(&mut life)?;
        Ok(Refreshed {
            from_generation: from,
            generation,
            trust_changed: life.trust_epoch != epoch,
            unusable: checked.disabled,
        })
    }

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
    pub(crate) fn store_root(&self) -> PathBuf {
        let trust = self.store.trust_path();
        trust.parent().map(Path::to_path_buf).unwrap_or(trust)
    }

    /// Opens the store at `dir` (creating it when absent) with the production adapters: the
    /// file-system store, the hardened GKPK source and the P-256 verifier, for this platform.
    pub fn open_dir(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_with(dir, None)
    }

    /// [`PackageManager::open_dir`] with the trust file rebuilt first
    /// ([`PackageManager::open_resetting_trust`]).
    pub fn open_dir_resetting_trust(
        dir: &Path,
        reset: TrustReset,
    ) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_with(dir, Some(reset))
    }

    /// Opens the store at `dir` as a reader: no lock, nothing written, the last committed
    /// generation (see [`PackageStore::is_reader`]). What fails verification is left out of this
    /// process's load plan and reported, not recorded; a change made through this package
    /// manager takes the store's lock for that one transaction. This is how a runner's
    /// [`Host`](crate::Host) opens its store, and how `guild list`, `status` and `doctor` read.
    pub fn open_dir_reader(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_as(dir, None, true, false)
    }

    /// Opens the store at `dir` as a reader ([`PackageManager::open_dir_reader`]) to read its
    /// committed state, as `guild list` and `guild status` do: the registry and the trust file
    /// only. No signature is checked and no file hashed, and the `.gkmetadata` files are read only
    /// when a query needs them ([`PackageManager::load_plan`],
    /// [`PackageManager::impl_id_conflicts`], [`PackageManager::metadata`], a change). A library
    /// loaded through it is still checked right before it opens
    /// ([`PackageManager::check_loadable`], [`PackageManager::check_files_before_load`]).
    pub fn open_dir_committed(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_as(dir, None, true, true)
    }

    fn open_dir_with(
        dir: &Path,
        reset: Option<TrustReset>,
    ) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_as(dir, reset, false, false)
    }

    fn open_dir_as(
        dir: &Path,
        reset: Option<TrustReset>,
        reader: bool,
        committed_only: bool,
    ) -> Result<(Self, OpenReport), HostError> {
        let platform = HostPlatform::current().ok_or(HostError::UnsupportedPlatform {
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
        })?;
        let mut options = guild_adapters_fs::store::StoreOptions::new();
        options.reader = reader;
        let (store, recovery) = guild_adapters_fs::store::FsStore::open_with(dir, options)?;
        Self::open_with(
            Box::new(store),
            recovery,
            Box::new(guild_adapters_fs::archive::GkpkSource::default()),
            Box::new(guild_adapters_crypto::P256Verifier::new()),
            platform,
            reset,
            committed_only,
        )
    }

    /// The trust file as committed, its bytes decoded; `None` when there is none.
    fn trust_file(&self) -> Result<Option<(Vec<u8>, TrustStore)>, HostError> {
        match self.store.read_trust()? {
            None => Ok(None),
            Some(bytes) => {
                let trust = TrustStore::from_json(&bytes)?;
                Ok(Some((bytes, trust)))
            }
        }
    }

    /// Refuses a trust file that is not the one the registry recorded, before anything trusts
    /// it. A store that predates trust binding has its readable trust file bound now, so that
    /// from this open on it is guarded like any other.
    fn check_trust_binding(&self) -> Result<Option<TrustOpened>, HostError> {
        let registry = self.store.registry()?;
        let file = self.trust_file()?;
        check_trust_file(
            registry.trust_anchor(),
            file.as_ref().map(|(b, t)| (b.as_slice(), t)),
            registry.packages().next().is_some(),
        )
        .map_err(|problem| self.binding_error(problem))?;
        match (registry.trust_anchor(), file) {
            // A reader leaves the binding to the next writer.
            (None, Some(_)) if self.store.is_reader() => Ok(None),
            (None, Some((_, trust))) => {
                let generation = self.commit_trust(&registry, trust)?;
                Ok(Some(TrustOpened::Bound { generation }))
            }
            _ => Ok(None),
        }
    }

    fn binding_error(&self, problem: TrustFileMismatch) -> HostError {
        HostError::TrustBinding {
            path: self.store.trust_path(),
            problem,
        }
    }

    /// Rebuilds the trust file as `reset` says and commits it with its record.
    fn rebuild_trust(&self, reset: TrustReset) -> Result<TrustOpened, HostError> {
        let registry = self.store.registry()?;
        let (found, problem) = match self.store.read_trust()? {
            None => (
                None,
                check_trust_file(
                    registry.trust_anchor(),
                    None,
                    registry.packages().next().is_some(),
                )
                .err()
                .map(|p| p.to_string()),
            ),
            Some(bytes) => match TrustStore::from_json(&bytes) {
                Ok(trust) => {
                    let problem = check_trust_file(
                        registry.trust_anchor(),
                        Some((&bytes, &trust)),
                        registry.packages().next().is_some(),
                    )
                    .err()
                    .map(|p| p.to_string());
                    (Some(trust), problem)
                }
                // Its keys cannot be kept, but the registry's revocations still are.
                Err(e) if !reset.keep_keys => (None, Some(format!("it cannot be read: {e}"))),
                Err(e) => return Err(e.into()),
            },
        };
        let trust = TrustStore::rebuilt(registry.trust_anchor(), found.as_ref(), reset.keep_keys);
        let (keys, revoked_keys, revoked_payloads) = (
            trust.publishers().map(|(_, k)| k.count()).sum(),
            trust.revoked_keys().count(),
            trust.revoked_digests().count(),
        );
        let generation = self.commit_trust(&registry, trust)?;
        Ok(TrustOpened::Rebuilt {
            found: problem,
            generation,
            keys,
            revoked_keys,
            revoked_payloads,
        })
    }

    /// Binds `trust` to the store at the next generation and commits it with its record in one
    /// transaction from `registry`. Answers the new generation.
    fn commit_trust(&self, registry: &StoreState, mut trust: TrustStore) -> Result<u64, HostError> {
        let (store_id, generation) = match registry.trust_anchor() {
            Some(a) => (
                a.binding.store_id.clone(),
                a.binding.generation.saturating_add(1),
            ),
            None => (self.new_store_id(), 1),
        };
        let (bytes, anchor) = trust.seal(&store_id, generation);
        let mut next = registry.successor();
        next.set_trust_anchor(anchor);
        self.store
            .commit(Transaction::new(registry.generation(), next).with_trust(bytes))?;
        Ok(generation)
    }

    /// A fresh store id. It tells this store's trust file from another store's, so it must
    /// differ between stores; it is no secret (whoever can write the trust file can read the
    /// registry), so the time, the process and the store's path suffice.
    fn new_store_id(&self) -> String {
        static MINTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seed = format!(
            "{nanos}:{}:{}:{}",
            std::process::id(),
            MINTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            self.store.trust_path().display()
        );
        let hex = Sha256Digest::of(seed.as_bytes()).to_hex();
        hex.get(..32).unwrap_or(&hex).to_owned()
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

    fn lock_leases(&self) -> MutexGuard<'_, LeaseLedger> {
        self.leases.lock()
    }

    /// Checks that no session lease holds `id` and marks `action` pending on it, in one short
    /// critical section; until the returned guard is dropped, new leases on `id` are refused
    /// with [`LeaseError::ChangePending`](guild_domain::lease::LeaseError::ChangePending).
    fn begin_change(
        &self,
        id: &PackageId,
        action: QuiescentAction,
    ) -> Result<PendingChange<'_>, HostError> {
        self.lock_leases().begin_change(id, action)?;
        Ok(PendingChange {
            ledger: &self.leases,
            id: id.clone(),
        })
    }

    /// Waits until no session lease holds `id`, or until `deadline`; answers whether none does.
    /// Woken by the release of the last lease, not by polling.
    pub(crate) fn wait_unleased(&self, id: &PackageId, deadline: Instant) -> bool {
        let mut ledger = self.lock_leases();
        loop {
            if ledger.active(id).leases == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            ledger = match self.leases.released.wait_timeout(ledger, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Reports the artifact bytes each installation reads to `progress` (a command line's
    /// progress bar); `None` stops reporting.
    pub fn set_progress(&self, progress: Option<Arc<dyn Progress>>) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = progress;
    }

    /// Extracts an authenticated package into a new staging directory, hashing every file as it
    /// is written; on failure the directory is discarded. The extractor writes the signed
    /// `.gkmetadata` into the tree exactly as received, so that the store can be re-verified
    /// later without the archive.
    fn extract_to_staging(
        &self,
        mut opened: Box<dyn OpenedPackage>,
        package: &str,
        metadata: &Metadata,
    ) -> Result<PathBuf, HostError> {
        let staging = self.store.new_staging_dir()?;
        let watch = self.watch(&mut *opened, package, metadata.manifest());
        let extracted = opened.extract_to(metadata.manifest(), &staging);
        drop(watch);
        if let Err(e) = extracted {
            let _ = self.store.discard_staging(&staging);
            return Err(e.into());
        }
        Ok(staging)
    }

    /// The watcher set with [`PackageManager::set_progress`], told that work on `label` begins.
    fn watch(
        &self,
        opened: &mut dyn OpenedPackage,
        label: &str,
        manifest: &guild_domain::manifest::Manifest,
    ) -> Watch {
        let progress = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(p) = &progress {
            let total = manifest.artifacts.iter().map(|a| a.size).sum();
            p.begin(label, total);
            opened.watch(Arc::clone(p));
        }
        Watch(progress)
    }

    /// The platform packages are checked against.
    pub fn platform(&self) -> &HostPlatform {
        &self.platform
    }

    /// The current trust store. A store without a trust file trusts nothing; a trust file that
    /// cannot be decoded is an error.
    pub fn trust(&self) -> Result<TrustStore, HostError> {
        let _life = self.lock();
        self.read_trust()
    }

    fn read_trust(&self) -> Result<TrustStore, HostError> {
        Ok(self.trust_file()?.map(|(_, t)| t).unwrap_or_default())
    }

    /// Applies `change` to the trust store and commits it durably, together with the registry's
    /// record of the new trust file (its generation, digest and revocations), in one transaction.
    /// A change that changes nothing commits nothing. Revocations take effect for enabled
    /// packages the next time the store is opened (or at once through
    /// [`PackageManager::reverify`]).
    pub fn update_trust<T>(
        &self,
        change: impl FnOnce(&mut TrustStore) -> Result<T, HostError>,
    ) -> Result<T, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        let mut trust = self.read_trust()?;
        let before = trust.clone();
        let out = change(&mut trust)?;
        if trust != before {
            self.commit_trust(&registry, trust)?;
            life.trust_epoch += 1;
            // The trust file is no part of the graph or of the claims: what is kept still
            // holds at the new generation.
            if let Some(kept) = life
                .kept
                .as_mut()
                .filter(|k| k.generation == registry.generation())
            {
                kept.generation = registry.generation().saturating_add(1);
            }
        }
        Ok(out)
    }

    /// The signed metadata of an installed version, from the lifecycle state.
    fn loaded_metadata(
        &self,
        life: &Lifecycle,
        id: &PackageId,
        version: &Version,
    ) -> Result<Arc<Metadata>, HostError> {
        life.metadata
            .get(&(id.clone(), version.clone()))
            .cloned()
            .ok_or_else(|| HostError::InstalledTree {
                package: format!("{id}@{version}"),
                path: self.store.package_dir(id, version),
                problem: "its metadata was not loaded".into(),
            })
    }

    /// Refuses to make `id@version` loadable again unless today's trust store still
    /// authenticates it. A version that was installed under a key or payload digest revoked
    /// since must not come back through enable or rollback; without this check it would reach
    /// the load plan until the next open tainted it again.
    fn check_still_trusted(
        &self,
        metadata: &Metadata,
        id: &PackageId,
        version: &Version,
    ) -> Result<(), HostError> {
        let trust = self.read_trust()?;
        authenticate(metadata, &trust, &PortCheck(&*self.verifier))
            .map(|_| ())
            .map_err(|source| HostError::Unauthenticated {
                location: self.store.package_dir(id, version),
                package: format!("{id}@{version}"),
                source,
            })
    }

    /// Checks the installed files of `id@version` against its signed manifest, through the same
    /// hardened path that extraction uses, before its library can be opened again.
    fn check_files(
        &self,
        metadata: &Metadata,
        id: &PackageId,
        version: &Version,
    ) -> Result<(), HostError> {
        let dir = self.store.package_dir(id, version);
        self.source
            .open(&dir)?
            .verify_in_place(metadata.manifest())?;
        Ok(())
    }

    /// Whether `id@version` may be loaded now: still authenticated by today's trust store. The
    /// host asks before opening each planned library, so a revocation since the store was
    /// opened takes effect at the next load.
    pub fn check_loadable(&self, id: &PackageId, version: &Version) -> Result<(), HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        let key = (id.clone(), version.clone());
        if life.authenticated_at.get(&key) == Some(&life.trust_epoch) {
            return Ok(());
        }
        let metadata = self.loaded_metadata(&life, id, version)?;
        self.check_still_trusted(&metadata, id, version)?;
        let epoch = life.trust_epoch;
        life.authenticated_at.insert(key, epoch);
        Ok(())
    }

    /// The graph of installed versions as `registry` records them.
    fn graph(&self, life: &Lifecycle, registry: &StoreState) -> Result<DependencyGraph, HostError> {
        Ok(DependencyGraph::new(self.installed_nodes(life, registry)?)?)
    }

    /// The graph's node of every installed version `registry` records.
    fn installed_nodes(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
    ) -> Result<Vec<PackageNode>, HostError> {
        registry
            .installed()
            .map(|(id, version, record)| {
                let metadata = self.known_metadata(life, id, version, None)?;
                Ok(PackageNode::from_metadata(
                    metadata,
                    record.state.is_enabled(),
                ))
            })
            .collect()
    }

    /// The metadata of `id@version`: `extra` when it describes that version (a version being
    /// installed, not yet in the lifecycle state), otherwise the one the lifecycle holds.
    fn known_metadata<'m>(
        &self,
        life: &'m Lifecycle,
        id: &PackageId,
        version: &Version,
        extra: Option<&'m Metadata>,
    ) -> Result<&'m Metadata, HostError> {
        if let Some(m) = extra.filter(|m| {
            let m = m.manifest();
            &m.package_id == id && &m.version == version
        }) {
            return Ok(m);
        }
        life.metadata
            .get(&(id.clone(), version.clone()))
            .map(|m| &**m)
            .ok_or_else(|| HostError::InstalledTree {
                package: format!("{id}@{version}"),
                path: self.store.package_dir(id, version),
                problem: "its metadata was not loaded".into(),
            })
    }

    /// The claim of `node` on the impl ids its manifest provides.
    fn claim_of(
        &self,
        life: &Lifecycle,
        node: NodeRef,
        extra: Option<&Metadata>,
    ) -> Result<Claim, HostError> {
        let metadata = self.known_metadata(life, &node.id, &node.version, extra)?;
        let ids = metadata.manifest().provided_ops.iter().cloned();
        Ok(Claim::new(node, ids))
    }

    /// The claims on impl ids that `registry` records: the provided ops of every version that
    /// holds them (see [`guild_domain::claims::claiming_versions`]).
    fn claims(&self, life: &Lifecycle, registry: &StoreState) -> Result<Vec<Claim>, HostError> {
        claiming_versions(registry)
            .into_iter()
            .map(|node| self.claim_of(life, node, None))
            .collect()
    }

    /// What [`Kept`] will hold of package `id` once the draft `next` is committed: its installed
    /// versions and its claims (`extra` is the metadata of a version being installed).
    fn kept_change(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
        next: &StoreState,
        id: &PackageId,
        extra: Option<&Metadata>,
    ) -> Result<KeptChange, HostError> {
        let mut nodes = Vec::new();
        let mut claims = Vec::new();
        if let Some(record) = next.package(id) {
            for (version, r) in record.installed() {
                let metadata = self.known_metadata(life, id, version, extra)?;
                nodes.push(PackageNode::from_metadata(metadata, r.state.is_enabled()));
            }
            for node in claiming_versions_of(id, record) {
                claims.push(self.claim_of(life, node, extra)?);
            }
        }
        Ok(KeptChange {
            from: registry.generation(),
            to: next.generation(),
            id: id.clone(),
            nodes,
            claims,
        })
    }

    /// The kept graph and claims of `registry`, built now unless they describe its generation.
    fn kept<'l>(
        &self,
        life: &'l mut Lifecycle,
        registry: &StoreState,
    ) -> Result<&'l Kept, HostError> {
        let kept = match life.kept.take() {
            Some(k) if k.generation == registry.generation() => k,
            _ => Kept {
                generation: registry.generation(),
                graph: GraphIndex::new(self.installed_nodes(life, registry)?)?,
                claims: ClaimIndex::new(self.claims(life, registry)?),
            },
        };
        Ok(life.kept.insert(kept))
    }

    /// Puts a committed change's part in place in [`Kept`], or drops what is kept when it does
    /// not describe the generation the change was checked against.
    fn advance(life: &mut Lifecycle, change: KeptChange) {
        let KeptChange {
            from,
            to,
            id,
            nodes,
            claims,
        } = change;
        let Some(mut kept) = life.kept.take().filter(|k| k.generation == from) else {
            return;
        };
        if kept.graph.set_package(&id, nodes).is_ok() {
            kept.claims.set_package(&id, claims);
            kept.generation = to;
            life.kept = Some(kept);
        }
    }

    /// Refuses to make the version `metadata` describes installed, current or loadable while
    /// another package holds one of its impl ids: an id belongs to one package, and load order
    /// must never decide which.
    fn refuse_taken_ids(kept: &Kept, metadata: &Metadata) -> Result<(), HostError> {
        let m = metadata.manifest();
        let candidate = Claim::new(
            NodeRef {
                id: m.package_id.clone(),
                version: m.version.clone(),
            },
            m.provided_ops.iter().cloned(),
        );
        Ok(kept.claims.check(&candidate)?)
    }

    /// The impl ids that two recorded packages both hold: a store written before installation
    /// checked them. Neither side of a conflict is loaded ([`PackageManager::load_plan`]) until
    /// one of them is removed.
    pub fn impl_id_conflicts(&self) -> Result<Vec<ImplIdConflict>, HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        // A reader's own view: a version whose tree it found damaged has no metadata to claim.
        let registry = match &life.local_view {
            Some(view) => view.clone(),
            None => self.store.registry()?,
        };
        Ok(conflicts(&self.claims(&life, &registry)?))
    }

    /// Refuses a change for the problems it brings ([`GraphIndex::problems_added`]): a change is
    /// refused for what it breaks, not for problems that were already there. `action` names the
    /// change in the refusal.
    fn refuse_breakage(
        kept: &Kept,
        change: &KeptChange,
        action: impl FnOnce() -> String,
    ) -> Result<(), HostError> {
        let problems = kept
            .graph
            .problems_added(&change.id, change.nodes.clone())?;
        if problems.is_empty() {
            return Ok(());
        }
        Err(HostError::Dependencies {
            action: action(),
            problems,
        })
    }

    /// The metadata of an installed version that is about to become loadable again (enable,
    /// rollback, reactivation): still authenticated by today's trust store, and its installed
    /// files still those the metadata signs. The draft `next` records that it was authenticated
    /// under the trust file `registry` records.
    fn verified_installed(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
        next: &mut StoreState,
        id: &PackageId,
        version: &Version,
    ) -> Result<Arc<Metadata>, HostError> {
        let metadata = self.loaded_metadata(life, id, version)?;
        self.check_still_trusted(&metadata, id, version)?;
        self.check_files(&metadata, id, version)?;
        if let Some(anchor) = registry.trust_anchor() {
            next.set_trusted_under(id, version, anchor.file_digest);
        }
        Ok(metadata)
    }

    /// Steps 1 and 2 of an installation that need no registry: the package at `location` opened,
    /// its metadata parsed and authenticated against the current trust store, and its platform
    /// checked. Answers the opened package, its metadata, its `id@version` label and who signed it.
    fn offered(&self, location: &Path) -> Result<Authenticating, HostError> {
        let trust = self.read_trust()?;
        let opened = self.source.open(location)?;
        let metadata = Arc::new(Metadata::parse(opened.metadata_bytes()).map_err(|errors| {
            HostError::Manifest {
                location: location.to_path_buf(),
                errors,
            }
        })?);
        let manifest = metadata.manifest();
        let package = format!("{}@{}", manifest.package_id, manifest.version);
        let auth: Authenticated = authenticate(&metadata, &trust, &PortCheck(&*self.verifier))
            .map_err(|source| HostError::Unauthenticated {
                location: location.to_path_buf(),
                package: package.clone(),
                source,
            })?;
        self.platform
            .check(manifest)
            .map_err(|source| HostError::Platform {
                package: package.clone(),
                source,
            })?;
        Ok((opened, metadata, package, auth))
    }

    /// Checks the package at `location` as an installation does before it writes anything
    /// (authenticated against the current trust store, its platform checked, every artifact
    /// hashed against the signed manifest), writing nothing and taking no lock. Answers what an
    /// installation of it would record. What the store would say to it (the immutable-version
    /// rule, the dependency graph) is left to the installation.
    pub fn check_package(&self, location: &Path) -> Result<Installed, HostError> {
        let (mut opened, metadata, package, auth) = {
            let _life = self.lock();
            self.offered(location)?
        };
        let manifest = metadata.manifest();
        let watch = self.watch(&mut *opened, &package, manifest);
        opened.verify_in_place(manifest)?;
        drop(watch);
        Ok(Installed {
            id: manifest.package_id.clone(),
            version: manifest.version.clone(),
            kind: manifest.kind,
            payload_digest: auth.payload_digest,
            publisher: auth.publisher,
            key_id: auth.key_id,
            changed: false,
            enabled: false,
            superseded: None,
            reactivated: false,
            repaired: false,
        })
    }

    /// Authenticates, validates, extracts and publishes the package at `location`.
    pub fn install(
        &self,
        location: &Path,
        options: InstallOptions,
    ) -> Result<Installed, HostError> {
        self.install_with(location, options, &mut NoHook)
    }

    /// [`PackageManager::install`] with a hook that takes part in the transaction.
    pub fn install_with(
        &self,
        location: &Path,
        options: InstallOptions,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Installed, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let (mut opened, metadata, package, auth) = self.offered(location)?;
        let manifest = metadata.manifest();

        let registry = self.store.registry()?;
        let (id, version) = (&manifest.package_id, &manifest.version);
        let mut next = registry.successor();
        // A genuine copy of a tainted version repairs it: the taint is lifted in the
        // draft, so that the publication decides as for any installed version, and the files
        // are replaced below.
        let tainted = registry.record(id, version).is_some_and(|r| {
            r.payload_digest == auth.payload_digest && r.state.is_installed() && r.taint.is_some()
        });
        if tainted {
            next.clear_taint(id, version);
        }
        let trusted_under = registry.trust_anchor().map(|a| a.file_digest);
        let published = next.publish(
            id,
            version,
            NewVersion {
                payload_digest: auth.payload_digest,
                kind: manifest.kind,
                publisher: manifest.publisher_id.clone(),
            },
            PublishOptions {
                enable: options.enable,
                allow_downgrade: options.allow_downgrade,
            },
        )?;
        if let Some(anchor) = trusted_under {
            // Authenticated just now, under the trust file the registry records.
            next.set_trusted_under(id, version, anchor);
        }
        let mut installed = Installed {
            id: id.clone(),
            version: version.clone(),
            kind: manifest.kind,
            payload_digest: auth.payload_digest,
            publisher: auth.publisher.clone(),
            key_id: auth.key_id,
            changed: false,
            enabled: registry.package(id).and_then(|p| p.enabled()) == Some(version),
            superseded: None,
            reactivated: false,
            repaired: false,
        };
        if published.kind != PublishKind::New
            && (tainted || self.installed_copy_fails(&life, id, version))
        {
            let offered = Offered {
                opened,
                metadata,
                package,
                enable: options.enable,
            };
            return self.repair(
                &mut life, &registry, next, installed, published, offered, hook,
            );
        }
        if published.kind != PublishKind::New {
            // Nothing will be extracted, but the operator offered this file expecting it to be
            // checked: a damaged or tampered copy of an installed version is still an error.
            let watch = self.watch(&mut *opened, &package, metadata.manifest());
            opened.verify_in_place(metadata.manifest())?;
            drop(watch);
            if published.kind == PublishKind::IdenticalNoOp {
                return Ok(installed);
            }
            return self.reactivate(&mut life, &registry, next, installed, published, hook);
        }

        // Validate the graph with the new version in place, before anything is written.
        let change = self.kept_change(&life, &registry, &next, id, Some(&metadata))?;
        let kept = self.kept(&mut life, &registry)?;
        Self::refuse_breakage(kept, &change, || format!("installing {id}@{version}"))?;
        // Its impl ids must be free before anything of it is written or opened.
        Self::refuse_taken_ids(kept, &metadata)?;

        // A new version supersedes the enabled one: a session lease on the package pins it, and
        // none may be taken while the change is in progress.
        let _pending = match registry.package(id).and_then(|p| p.enabled()) {
            Some(_) => Some(self.begin_change(id, QuiescentAction::Replace)?),
            None => None,
        };

        let staging = self.extract_to_staging(opened, &package, &metadata)?;
        let prepared = Change::Install {
            id,
            version,
            dir: &staging,
            metadata: &metadata,
            enabled: options.enable,
        };
        if let Err(e) = hook.prepare(&prepared) {
            let _ = self.store.discard_staging(&staging);
            return Err(e);
        }
        let tx = Transaction::new(registry.generation(), next).with_install(
            id.clone(),
            version.clone(),
            staging,
        );
        self.commit(tx, hook)?;

        life.metadata
            .insert((id.clone(), version.clone()), metadata);
        Self::advance(&mut life, change);
        installed.changed = true;
        installed.enabled = options.enable;
        installed.superseded = published.superseded;
        Ok(installed)
    }

    /// Whether the installed tree of `id@version` no longer holds what its signed manifest says,
    /// or its signature no longer authenticates it: a copy worth replacing when the operator
    /// offers a genuine one.
    fn installed_copy_fails(&self, life: &Lifecycle, id: &PackageId, version: &Version) -> bool {
        match self.loaded_metadata(life, id, version) {
            Ok(metadata) => {
                self.check_still_trusted(&metadata, id, version).is_err()
                    || self.check_files(&metadata, id, version).is_err()
            }
            Err(_) => true,
        }
    }

    /// Replaces the installed tree of a tainted or damaged version with the offered,
    /// authenticated package (the second half of [`PackageManager::install`] in that case): its
    /// files are extracted and hashed into staging, the store swaps the trees in one
    /// transaction, and the taint is lifted. The version ends as the operator asked: current
    /// and enabled unless `--disabled` (or, if it is not current, as a reinstall of it decides).
    #[allow(clippy::too_many_arguments)]
    fn repair(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        mut next: StoreState,
        mut installed: Installed,
        published: guild_domain::store_state::Published,
        offered: Offered,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Installed, HostError> {
        let Offered {
            opened,
            metadata,
            package,
            enable,
        } = offered;
        let (id, version) = (installed.id.clone(), installed.version.clone());
        let record = next.package(&id).and_then(|p| p.current());
        let current_disabled = record.is_some_and(|(v, r)| *v == version && !r.state.is_enabled());
        if current_disabled && enable {
            next.enable(&id)?;
        }
        let change = self.kept_change(life, registry, &next, &id, Some(&metadata))?;
        let kept = self.kept(life, registry)?;
        Self::refuse_breakage(kept, &change, || format!("repairing {id}@{version}"))?;
        let enabled_after = next.package(&id).and_then(|p| p.enabled()) == Some(&version);
        // Putting the version in place of what is loaded replaces code: a lease pins it, and
        // none may be taken while the repair is in progress.
        let _pending = if enabled_after && registry.package(&id).and_then(|p| p.enabled()).is_some()
        {
            Some(self.begin_change(&id, QuiescentAction::Replace)?)
        } else {
            None
        };
        let staging = self.extract_to_staging(opened, &package, &metadata)?;
        let tx = Transaction::new(registry.generation(), next).with_replacement(
            id.clone(),
            version.clone(),
            staging.clone(),
        );
        if enabled_after {
            let prepared = Change::Install {
                id: &id,
                version: &version,
                dir: &staging,
                metadata: &metadata,
                enabled: true,
            };
            if let Err(e) = hook.prepare(&prepared) {
                let _ = self.store.discard_staging(&staging);
                return Err(e);
            }
            self.commit(tx, hook)?;
        } else {
            // Nothing that is loaded changes: the hook has no part in it.
            self.store.commit(tx)?;
        }
        let key = (id, version);
        let epoch = life.trust_epoch;
        life.authenticated_at.insert(key.clone(), epoch);
        life.metadata.insert(key, metadata);
        Self::advance(life, change);
        installed.changed = true;
        installed.repaired = true;
        installed.enabled = enabled_after;
        installed.reactivated = published.kind == PublishKind::Reactivated;
        installed.superseded = published.superseded;
        Ok(installed)
    }

    /// Makes an installed, superseded version current and enabled again (the second half of
    /// [`PackageManager::install`] when the offered package is such a version): its installed
    /// tree is checked and re-authenticated like a rollback target's, the graph must accept it,
    /// and a session lease on the package refuses the change.
    fn reactivate(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        mut next: StoreState,
        mut installed: Installed,
        published: guild_domain::store_state::Published,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Installed, HostError> {
        let (id, version) = (&installed.id, &installed.version);
        let change = self.kept_change(life, registry, &next, id, None)?;
        let candidate = self.loaded_metadata(life, id, version)?;
        let kept = self.kept(life, registry)?;
        Self::refuse_breakage(kept, &change, || {
            format!("making {id}@{version} current again")
        })?;
        Self::refuse_taken_ids(kept, &candidate)?;
        let _pending = self.begin_change(id, QuiescentAction::Replace)?;
        let metadata = self.verified_installed(life, registry, &mut next, id, version)?;
        hook.prepare(&Change::Reactivate {
            id,
            from: published.superseded.as_ref(),
            to: version,
            dir: self.store.package_dir(id, version),
            metadata,
        })?;
        self.commit(Transaction::new(registry.generation(), next), hook)?;
        Self::advance(life, change);
        installed.changed = true;
        installed.enabled = true;
        installed.reactivated = true;
        installed.superseded = published.superseded;
        Ok(installed)
    }

    /// Enables the current version of `id`, refused if that would break a dependency.
    pub fn enable(&self, id: &PackageId) -> Result<Version, HostError> {
        self.enable_with(id, &mut NoHook)
    }

    /// [`PackageManager::enable`] with a hook that takes part in the transaction.
    pub fn enable_with(
        &self,
        id: &PackageId,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Version, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        let mut next = registry.successor();
        let version = next.enable(id)?;
        let change = self.kept_change(&life, &registry, &next, id, None)?;
        let candidate = self.loaded_metadata(&life, id, &version)?;
        let kept = self.kept(&mut life, &registry)?;
        Self::refuse_breakage(kept, &change, || format!("enabling {id}@{version}"))?;
        Self::refuse_taken_ids(kept, &candidate)?;
        let metadata = self.verified_installed(&life, &registry, &mut next, id, &version)?;
        let dir = self.store.package_dir(id, &version);
        hook.prepare(&Change::Enable {
            id,
            version: &version,
            dir,
            metadata,
        })?;
        self.commit(Transaction::new(registry.generation(), next), hook)?;
        Self::advance(&mut life, change);
        Ok(version)
    }

    /// Disables the enabled version of `id`, refused while an enabled package depends on it or
    /// while it is leased.
    pub fn disable(&self, id: &PackageId) -> Result<Version, HostError> {
        self.disable_with(id, &mut NoHook)
    }

    /// [`PackageManager::disable`] with a hook that takes part in the transaction.
    pub fn disable_with(
        &self,
        id: &PackageId,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Version, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        self.kept(&mut life, &registry)?.graph.check_disable(id)?;
        let _pending = self.begin_change(id, QuiescentAction::Unload)?;
        let mut next = registry.successor();
        let version = next.disable(id)?;
        let change = self.kept_change(&life, &registry, &next, id, None)?;
        hook.prepare(&Change::Disable {
            id,
            version: &version,
        })?;
        self.commit(Transaction::new(registry.generation(), next), hook)?;
        Self::advance(&mut life, change);
        Ok(version)
    }

    /// Removes `id@version` (the current version when `version` is `None`), refused while an
    /// enabled package depends on it or while it is leased. Its tree is deleted; its record stays,
    /// so the same version can never return with other content.
    pub fn remove(&self, id: &PackageId, version: Option<&Version>) -> Result<Version, HostError> {
        self.remove_with(id, version, &mut NoHook)
    }

    /// [`PackageManager::remove`] with a hook that takes part in the transaction.
    pub fn remove_with(
        &self,
        id: &PackageId,
        version: Option<&Version>,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Version, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        let version = match version {
            Some(v) => v.clone(),
            None => registry
                .package(id)
                .and_then(|p| p.current().map(|(v, _)| v.clone()))
                .ok_or_else(
                    || guild_domain::store_state::StoreStateError::NoCurrentVersion {
                        id: id.clone(),
                    },
                )?,
        };
        self.kept(&mut life, &registry)?
            .graph
            .check_remove(id, &version)?;
        // Leases pin the current version (the one a loader opens); older, superseded trees are
        // not in use and may go while the package is leased.
        let is_current = registry
            .package(id)
            .and_then(|p| p.current())
            .is_some_and(|(v, _)| *v == version);
        let _pending = if is_current {
            Some(self.begin_change(id, QuiescentAction::Remove)?)
        } else {
            None
        };
        let mut next = registry.successor();
        next.remove(id, &version)?;
        let change = self.kept_change(&life, &registry, &next, id, None)?;
        hook.prepare(&Change::Remove {
            id,
            version: &version,
            current: is_current,
        })?;
        self.commit(Transaction::new(registry.generation(), next), hook)?;
        life.metadata.remove(&(id.clone(), version.clone()));
        Self::advance(&mut life, change);
        Ok(version)
    }

    /// Forgets removed versions of `id` (the one named, or every removed one), so that
    /// `list` and `status` no longer show them; answers the versions purged. Only `removed`
    /// records go: their files are already gone, so nothing loaded, leased or depended on can
    /// be affected. It gives up the record's promise that the version never returns with other
    /// content (see [`StoreState::purge`]).
    pub fn purge(
        &self,
        id: &PackageId,
        version: Option<&Version>,
    ) -> Result<Vec<Version>, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        let mut next = registry.successor();
        let purged = next.purge(id, version)?;
        let change = self.kept_change(&life, &registry, &next, id, None)?;
        let names = purged.iter().map(|v| (id.clone(), v.clone())).collect();
        self.commit(
            Transaction::new(registry.generation(), next).with_purge(names),
            &mut NoHook,
        )?;
        Self::advance(&mut life, change);
        Ok(purged)
    }

    /// The committed registry now, to return to with [`PackageManager::restore`] if a batch of
    /// changes made under the same hold of the store's lock fails part way.
    pub fn savepoint(&self) -> Result<Savepoint, HostError> {
        let _life = self.lock();
        Ok(Savepoint(self.store.registry()?))
    }

    /// Returns the store to `saved`: every version installed since is deleted and forgotten,
    /// and every other record (state, rollback target, taint) is put back as it was, in
    /// two durable transactions (the first deletes the trees, the second purges their records).
    /// Only versions whose trees are still installed can come back, so this undoes installs,
    /// enables, disables and reactivations, not removals. It is meant for a writer that holds
    /// the store's lock from the savepoint on, as `guild sync` does; the kernel registry takes
    /// no part, so a [`Host`](crate::Host) with packages loaded never calls it.
    ///
    /// A version installed since that a running process has loaded meanwhile (a runner
    /// following the store) cannot be deleted under it: it stays installed, switched off, and is
    /// answered with the processes that pin it, for the caller to report. Everything else goes
    /// back all the same.
    pub fn restore(&self, saved: &Savepoint) -> Result<Vec<VersionPins>, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        // A process may pin one more version between the look at the pins and the commit; the
        // commit then refuses, and the next round sees it.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let registry = self.store.registry()?;
            if registry.generation() == saved.0.generation() {
                return Ok(Vec::new());
            }
            let added = |id: &PackageId, version: &Version| saved.0.record(id, version).is_none();
            let kept: Vec<VersionPins> = self
                .store
                .pins()?
                .into_iter()
                .filter(|p| !p.holders.is_empty() && added(&p.node.id, &p.node.version))
                .collect();
            let keep = kept
                .iter()
                .map(|p| (p.node.id.clone(), p.node.version.clone()))
                .collect();
            let (back, purge) = registry.returning_to(&saved.0, &keep);
            // Whatever commits below, what is kept of the graph no longer describes the
            // registry.
            life.kept = None;
            match self.commit(
                Transaction::new(registry.generation(), back.clone()),
                &mut NoHook,
            ) {
                Ok(()) => {}
                Err(HostError::Store(e)) if e.kind == StoreErrorKind::Pinned && attempt < 3 => {
                    continue
                }
                Err(e) => return Err(e),
            }
            for key in &purge {
                life.metadata.remove(key);
            }
            if !purge.is_empty() {
                let mut forgotten = back.successor();
                for (id, version) in &purge {
                    forgotten.purge(id, Some(version))?;
                }
                self.commit(
                    Transaction::new(back.generation(), forgotten).with_purge(purge),
                    &mut NoHook,
                )?;
            }
            return Ok(kept);
        }
    }

    /// Rolls `id` back to its previous version, refused while leased or when any enabled
    /// dependent's range or pins reject that version.
    pub fn rollback(
        &self,
        id: &PackageId,
    ) -> Result<guild_domain::store_state::RolledBack, HostError> {
        self.rollback_with(id, &mut NoHook)
    }

    /// [`PackageManager::rollback`] with a hook that takes part in the transaction.
    pub fn rollback_with(
        &self,
        id: &PackageId,
        hook: &mut dyn LifecycleHook,
    ) -> Result<guild_domain::store_state::RolledBack, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        let mut next = registry.successor();
        let rolled = next.rollback(id)?;
        let change = self.kept_change(&life, &registry, &next, id, None)?;
        let candidate = self.loaded_metadata(&life, id, &rolled.to)?;
        let kept = self.kept(&mut life, &registry)?;
        kept.graph.check_rollback(id, &rolled.to)?;
        Self::refuse_taken_ids(kept, &candidate)?;
        let _pending = self.begin_change(id, QuiescentAction::Rollback)?;
        let metadata = self.verified_installed(&life, &registry, &mut next, id, &rolled.to)?;
        hook.prepare(&Change::Rollback {
            id,
            from: rolled.from.as_ref(),
            to: &rolled.to,
            dir: self.store.package_dir(id, &rolled.to),
            metadata,
        })?;
        self.commit(Transaction::new(registry.generation(), next), hook)?;
        Self::advance(&mut life, change);
        Ok(rolled)
    }

    /// Takes an explicit session lease on the enabled version of `id`. Refused with
    /// [`LeaseError::ChangePending`](guild_domain::lease::LeaseError::ChangePending) while a
    /// change that needs `id` quiescent (disable, a new version, rollback, removal) is in
    /// progress, instead of waiting for it: retry once it is over.
    pub fn lease(&self, id: &PackageId) -> Result<PackageLease, HostError> {
        // Acquired first and checked after: a change that began before the acquire is refused
        // by its pending mark; one that ended before it has committed, so the registry read
        // below sees its outcome; one that begins after it sees the lease.
        self.lock_leases().acquire(id, LeaseKind::Lease)?;
        let lease = PackageLease {
            id: id.clone(),
            ledger: self.leases.clone(),
        };
        let registry = self.store.registry()?;
        if registry.package(id).and_then(|p| p.enabled()).is_none() {
            return Err(
                guild_domain::store_state::StoreStateError::NoCurrentVersion { id: id.clone() }
                    .into(),
            );
        }
        Ok(lease)
    }

    /// How many leases and bindings keep `id` in use.
    pub fn active_package_leases(&self, id: &PackageId) -> ActiveLeases {
        self.lock_leases().active(id)
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

    /// `id@version` as a load plan would name it: its tree in the store (which may be gone).
    pub(crate) fn planned(&self, id: &PackageId, version: &Version) -> PlannedPackage {
        PlannedPackage {
            id: id.clone(),
            version: version.clone(),
            dir: self.store.package_dir(id, version),
        }
    }

    /// The signed metadata of an installed version.
    pub fn metadata(&self, id: &PackageId, version: &Version) -> Option<Arc<Metadata>> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life).ok()?;
        life.metadata.get(&(id.clone(), version.clone())).cloned()
    }

    /// The enabled packages in dependency order (dependencies first), with the ones that cannot
    /// load and why. This is the order in which a loader opens libraries.
    pub fn load_plan(&self) -> Result<LoadOrder, HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        let registry = match &life.local_view {
            Some(view) => view.clone(),
            None => self.store.registry()?,
        };
        let graph = self.graph(&life, &registry)?;
        let plan = graph.plan();
        // Both sides of an impl-id conflict stay unloaded: which one loaded first would
        // otherwise decide who serves the ids.
        let contested = conflicts(&self.claims(&life, &registry)?);
        let conflict_of = |node: &PackageNode| {
            contested.iter().find(|c| {
                [&c.claimant, &c.owner]
                    .iter()
                    .any(|side| side.id == node.id && side.version == node.version)
            })
        };
        let mut blocked_by_conflict = Vec::new();
        for node in &plan.order {
            if let Some(c) = conflict_of(node) {
                blocked_by_conflict.push(LeftOut {
                    id: node.id.clone(),
                    version: node.version.clone(),
                    reason: contested_reason(c),
                });
            }
        }
        let order = plan
            .order
            .iter()
            .filter(|n| conflict_of(n).is_none())
            .map(|n| PlannedPackage {
                id: n.id.clone(),
                version: n.version.clone(),
                dir: self.store.package_dir(&n.id, &n.version),
            })
            .collect();
        let blocked = plan
            .blocked
            .iter()
            .map(|b| LeftOut {
                id: b.node.id.clone(),
                version: b.node.version.clone(),
                reason: b.to_string(),
            })
            .chain(blocked_by_conflict)
            .collect();
        Ok(LoadOrder { order, blocked })
    }

    /// The full check, with as many threads as the machine has cores: every signature and every
    /// installed file of every enabled version, whatever the trust record says; what fails (and
    /// what depends on it) is disabled, in the store for a writer, in this process's view for a
    /// reader. [`PackageManager::verify_all`] says more of what it found.
    pub fn reverify(&self) -> Result<Vec<LeftOut>, HostError> {
        Ok(self.verify_all(VerifyOptions::default())?.disabled)
    }

    /// The full check (`guild verify --all`, `guild doctor --deep`): the signatures of every
    /// installed version (enabled, disabled and superseded) against today's trust store, and
    /// every one of their files against the signed manifest, on `options.jobs` threads. An
    /// enabled version that fails is disabled, and tainted when the failure is tamper
    /// evidence (a changed file or signature), with whatever depends on it, in one durable
    /// transaction for a writer (in this process's view only for a reader). A disabled or
    /// superseded version that fails is reported and left as it is: enabling or rolling back to
    /// it checks it again and refuses it. The versions that pass have today's trust file recorded.
    pub fn verify_all(&self, options: VerifyOptions) -> Result<FullCheck, HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        let registry = match &life.local_view {
            Some(view) if self.store.is_reader() => view.clone(),
            _ => self.store.registry()?,
        };
        let jobs = options.jobs.unwrap_or_else(default_jobs).max(1);
        let checked = self.verify_enabled(&mut life, &registry, Scope::Full { jobs })?;
        Ok(FullCheck {
            checked: checked.checked,
            jobs,
            failures: checked.failures,
            disabled: checked.disabled,
            recorded: !self.store.is_reader(),
        })
    }

    /// Checks installed versions as `scope` says and disables the enabled ones that fail (and
    /// what depends on them) in one durable transaction, which also records today's trust file
    /// for the versions whose signatures were checked and passed.
    ///
    /// At opening ([`Scope::Open`]) only enabled versions count, and only the signatures of
    /// those whose record names another trust file than today's are checked (a key added,
    /// removed or revoked since changes the file); no file is hashed. A full check
    /// ([`Scope::Full`]) checks every signature and every file of every installed version.
    fn verify_enabled(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        scope: Scope,
    ) -> Result<Checked, HostError> {
        let trust = self.read_trust()?;
        let anchor = registry.trust_anchor().map(|a| a.file_digest);
        let (full, jobs) = match scope {
            Scope::Open => (false, default_jobs()),
            Scope::Full { jobs } => (true, jobs),
        };
        let epoch = life.trust_epoch;
        let mut out = Checked::default();
        let mut work = Vec::new();
        for (id, version, record) in registry.installed() {
            let enabled = record.state.is_enabled();
            if !enabled && !full {
                continue;
            }
            if enabled {
                out.verified += 1;
            }
            let metadata = self.loaded_metadata(life, id, version)?;
            if !full && anchor.is_some() && record.trusted_under == anchor {
                life.authenticated_at
                    .insert((id.clone(), version.clone()), epoch);
                continue;
            }
            work.push((id.clone(), version.clone(), record.state, metadata));
        }
        out.checked = work.len();
        out.reauthenticated = work.len();
        let results = guild_runtime::parallel::map(&work, jobs, |(id, version, _, metadata)| {
            self.check_version(&trust, metadata, id, version, full)
        });
        let mut next = registry.successor();
        let mut recorded = false;
        let mut failed = BTreeMap::new();
        for ((id, version, state, _), result) in work.into_iter().zip(results) {
            match result {
                Ok(()) => {
                    if let Some(anchor) = anchor {
                        recorded |= next.set_trusted_under(&id, &version, anchor);
                    }
                    life.authenticated_at.insert((id, version), epoch);
                }
                Err(failure) => {
                    out.failures.push(VerifyFailure {
                        id: id.clone(),
                        version: version.clone(),
                        state,
                        file: failure.file.clone(),
                        reason: failure.reason.clone(),
                        tampered: failure.tampered,
                    });
                    if state.is_enabled() {
                        failed.insert(id, failure);
                    }
                }
            }
        }
        // Also when nothing failed here: a version marked removed while opening may have left
        // enabled dependents behind.
        let (next, disabled) = self.taint(life, next, failed)?;
        out.disabled = disabled;
        if self.store.is_reader() {
            if !out.disabled.is_empty() {
                life.local_view = Some(next);
            }
            return Ok(out);
        }
        if recorded || !out.disabled.is_empty() {
            self.store
                .commit(Transaction::new(registry.generation(), next))?;
        }
        Ok(out)
    }

    /// Checks one installed version: its signatures against `trust`, and with `files` every
    /// installed file against its signed manifest.
    fn check_version(
        &self,
        trust: &TrustStore,
        metadata: &Metadata,
        id: &PackageId,
        version: &Version,
        files: bool,
    ) -> Result<(), Failed> {
        if let Err(e) = authenticate(metadata, trust, &PortCheck(&*self.verifier)) {
            // A revocation explains itself for as long as the trust store records it (and the
            // registry keeps every revocation), so only a signature that was altered or
            // stripped is tamper evidence worth a taint.
            return Err(Failed {
                reason: format!("no longer authenticated: {e}"),
                tampered: is_tampered(&e),
                file: Some(RESERVED_METADATA_NAME.to_owned()),
            });
        }
        if files {
            self.check_files(metadata, id, version)
                .map_err(files_failed)?;
        }
        Ok(())
    }

    /// Re-hashes every installed file of `id@version` against its signed manifest, right
    /// before the host opens its library: opening a store hashes nothing, so this is what stands
    /// between a file changed in the store and the loader. A mismatch refuses the load, naming
    /// the file, and taints the version (with whatever depends on it) in the store: a
    /// writer commits it, a reader takes the store's lock for that one transaction (if it
    /// cannot, the load is still refused).
    ///
    /// The first hash takes no lock, so a same-version repair by another process may have been
    /// swapping the trees under it. The files are therefore hashed again under the store's lock
    /// (where no repair can be halfway) before anything is tainted: if they pass then, the
    /// repair is what the first hash saw, and the load goes ahead with the repaired files.
    pub fn check_files_before_load(
        &self,
        id: &PackageId,
        version: &Version,
    ) -> Result<(), HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        let metadata = self.loaded_metadata(&life, id, version)?;
        let Err(e) = self.check_files(&metadata, id, version) else {
            return Ok(());
        };
        let (failure, recorded) = match self.record_failure(&mut life, id, version) {
            Ok(Confirmed::Passed) => return Ok(()),
            Ok(Confirmed::Tainted(failure)) => (failure, "; it was tainted"),
            Ok(Confirmed::NotEnabled(failure)) => (failure, ""),
            // The lock could not be taken or the taint not committed: the first hash's
            // finding still refuses the load.
            Err(_) => (files_failed(e), ""),
        };
        let dir = self.store.package_dir(id, version);
        let path = failure.file.as_ref().map_or(dir.clone(), |f| dir.join(f));
        Err(HostError::InstalledTree {
            package: format!("{id}@{version}"),
            path,
            problem: format!("{}{recorded}; it was not loaded", failure.reason),
        })
    }

    /// Under the store's lock, hashes the files of `id@version` again and, if they still fail,
    /// taints it (and disables what depends on it) in the store, if it is still the
    /// enabled version.
    fn record_failure(
        &self,
        life: &mut Lifecycle,
        id: &PackageId,
        version: &Version,
    ) -> Result<Confirmed, HostError> {
        let _write = self.write_session(life)?;
        let metadata = self.loaded_metadata(life, id, version)?;
        let Err(e) = self.check_files(&metadata, id, version) else {
            return Ok(Confirmed::Passed);
        };
        let failure = files_failed(e);
        let registry = self.store.registry()?;
        if registry.package(id).and_then(|p| p.enabled()) != Some(version) {
            return Ok(Confirmed::NotEnabled(failure));
        }
        let failed = BTreeMap::from([(id.clone(), failure.clone())]);
        let (next, _) = self.taint(life, registry.successor(), failed)?;
        self.store
            .commit(Transaction::new(registry.generation(), next))?;
        Ok(Confirmed::Tainted(failure))
    }

    /// Taints the `failed` packages' enabled versions (which disables them) with the
    /// reason and file, and disables every enabled package that (transitively) depends on one of
    /// them, in `next` (the draft of the transaction), returning it and one report line per
    /// disabled package.
    fn taint(
        &self,
        life: &Lifecycle,
        mut next: StoreState,
        failed: BTreeMap<PackageId, Failed>,
    ) -> Result<(StoreState, Vec<LeftOut>), HostError> {
        let mut out = Vec::new();
        let mut disabled: BTreeSet<PackageId> = BTreeSet::new();
        for (id, failure) in failed {
            let Failed {
                reason,
                tampered,
                file,
            } = failure;
            let version = if tampered {
                let version = next
                    .package(&id)
                    .and_then(|p| p.enabled())
                    .cloned()
                    .ok_or_else(|| {
                        guild_domain::store_state::StoreStateError::NoCurrentVersion {
                            id: id.clone(),
                        }
                    })?;
                let taint = Taint {
                    // The registry keeps one line; an error chain may span several.
                    reason: reason.lines().map(str::trim).collect::<Vec<_>>().join(" "),
                    file,
                };
                next.taint(&id, &version, taint)?;
                version
            } else {
                next.disable(&id)?
            };
            disabled.insert(id.clone());
            out.push(LeftOut {
                id,
                version,
                reason,
            });
        }
        // Dependents of a disabled package cannot load either; disable them too, until nothing
        // enabled is left blocked.
        loop {
            let graph = self.graph(life, &next)?;
            let plan = graph.plan();
            let newly: Vec<(PackageId, String)> = plan
                .blocked
                .iter()
                .filter(|b| !disabled.contains(&b.node.id))
                .map(|b| (b.node.id.clone(), b.to_string()))
                .collect();
            if newly.is_empty() {
                break;
            }
            for (id, reason) in newly {
                let version = next.disable(&id)?;
                disabled.insert(id.clone());
                out.push(LeftOut {
                    id,
                    version,
                    reason,
                });
            }
        }
        Ok((next, out))
    }
}

/// What a [`Host`](crate::Host) lets its runner see of its package manager
/// ([`Host::packages`](crate::Host::packages)): the installed packages, their metadata, the trust
/// store and session leases, without the lifecycle changes. Those go through the `Host`
/// ([`Host::install`](crate::Host::install), [`Host::disable`](crate::Host::disable), ...) so
/// that the kernel registry takes part in each transaction; a [`PackageManager`] opened on its
/// own (as the `guild` command line does) makes them directly.
#[derive(Debug, Clone, Copy)]
pub struct PackageView<'pm> {
    packages: &'pm PackageManager,
}

impl<'pm> PackageView<'pm> {
    pub(crate) fn new(packages: &'pm PackageManager) -> Self {
        PackageView { packages }
    }

    /// Every recorded package with its versions ([`PackageManager::list`]).
    pub fn list(&self) -> Result<Vec<PackageSummary>, HostError> {
        self.packages.list()
    }

    /// Package `id` with its versions ([`PackageManager::summary`]).
    pub fn summary(&self, id: &PackageId) -> Result<Option<PackageSummary>, HostError> {
        self.packages.summary(id)
    }

    /// The signed metadata of an installed version ([`PackageManager::metadata`]).
    pub fn metadata(&self, id: &PackageId, version: &Version) -> Option<Arc<Metadata>> {
        self.packages.metadata(id, version)
    }

    /// The generation of the committed registry ([`PackageManager::generation`]).
    pub fn generation(&self) -> Result<u64, HostError> {
        self.packages.generation()
    }

    /// The enabled packages in dependency order, with those that cannot load and why
    /// ([`PackageManager::load_plan`]).
    pub fn load_plan(&self) -> Result<LoadOrder, HostError> {
        self.packages.load_plan()
    }

    /// The impl ids two recorded packages both hold ([`PackageManager::impl_id_conflicts`]).
    pub fn impl_id_conflicts(&self) -> Result<Vec<ImplIdConflict>, HostError> {
        self.packages.impl_id_conflicts()
    }

    /// The platform packages are checked against.
    pub fn platform(&self) -> &'pm HostPlatform {
        self.packages.platform()
    }

    /// The current trust store ([`PackageManager::trust`]). Change it with
    /// [`Host::update_trust`](crate::Host::update_trust).
    pub fn trust(&self) -> Result<TrustStore, HostError> {
        self.packages.trust()
    }

    /// Takes an explicit session lease on the enabled version of `id`
    /// ([`PackageManager::lease`]): the package stays in place until the lease is dropped.
    pub fn lease(&self, id: &PackageId) -> Result<PackageLease, HostError> {
        self.packages.lease(id)
    }

    /// How many session leases keep `id` in use ([`PackageManager::active_package_leases`]);
    /// [`Host::active_package_leases`](crate::Host::active_package_leases) adds the bindings.
    pub fn active_package_leases(&self, id: &PackageId) -> ActiveLeases {
        self.packages.active_package_leases(id)
    }

    /// Reports the artifact bytes each installation reads to `progress`
    /// ([`PackageManager::set_progress`]).
    pub fn set_progress(&self, progress: Option<Arc<dyn Progress>>) {
        self.packages.set_progress(progress);
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
            })
            .collect(),
        enabled: record.enabled().cloned(),
        previous: record.previous().cloned(),
        leases: leases.active(id),
    })
}

/// Why the sides of `conflict`, already recorded in a store, are not loaded.
pub fn contested_reason(conflict: &ImplIdConflict) -> String {
    let ids: Vec<&str> = conflict.impl_ids.iter().map(|i| i.as_str()).collect();
    format!(
        "{} and {} both provide {}: neither is loaded until one of them is removed",
        conflict.owner,
        conflict.claimant,
        ids.join(", "),
    )
}

/// What hashing a version's files again under the store's lock found.
enum Confirmed {
    /// They pass: whatever the first hash saw (a repair in progress) is over.
    Passed,
    /// They fail, and the version was tainted.
    Tainted(Failed),
    /// They fail, but the version is no longer the enabled one: nothing is recorded.
    NotEnabled(Failed),
}

/// Why an installed version failed re-verification.
#[derive(Clone)]
struct Failed {
    /// What was found.
    reason: String,
    /// Whether it is tamper evidence (a file or a signature changed), which taints the
    /// version, rather than a trust decision (a revocation), which explains itself.
    tampered: bool,
    /// The file concerned, relative to the installed tree, when one is known.
    file: Option<String>,
}

/// The failure of an installed tree's files to match the signed manifest, with the file concerned
/// when the source names it.
fn files_failed(e: HostError) -> Failed {
    let file = match &e {
        HostError::Source(s) => s.member.clone(),
        _ => None,
    };
    Failed {
        reason: format!("installed files do not match the signed manifest: {e}"),
        tampered: true,
        file,
    }
}

/// One thread per core, or one when that cannot be told.
fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// What [`PackageManager::verify_enabled`] checks.
#[derive(Debug, Clone, Copy)]
enum Scope {
    /// Opening: the signatures of enabled versions whose recorded trust file is not today's.
    Open,
    /// Everything, on `jobs` threads.
    Full {
        /// Worker threads.
        jobs: usize,
    },
}

/// What [`PackageManager::verify_enabled`] found and did.
#[derive(Debug, Default)]
struct Checked {
    /// Enabled versions considered.
    verified: usize,
    /// Versions whose signatures were checked.
    reauthenticated: usize,
    /// Versions checked (signatures, and for a full check files).
    checked: usize,
    /// Every version that failed.
    failures: Vec<VerifyFailure>,
    /// What was disabled.
    disabled: Vec<LeftOut>,
}

/// Whether an installed version's failed authentication shows that it was altered (a signature
/// that no longer verifies, or none at all) rather than that trust changed (a revoked key or
/// payload, a publisher or key no longer trusted).
fn is_tampered(e: &guild_domain::trust::AuthError) -> bool {
    use guild_domain::trust::{AuthError, SignatureOutcome};
    match e {
        AuthError::NoSignatures => true,
        AuthError::NoValidSignature { attempts, .. } => attempts
            .iter()
            .any(|(_, o)| matches!(o, SignatureOutcome::Invalid { .. })),
        _ => false,
    }
}

/// The package an installation was offered, authenticated and not yet extracted.
struct Offered {
    opened: Box<dyn OpenedPackage>,
    metadata: Arc<Metadata>,
    /// `id@version`, for progress.
    package: String,
    /// Whether the operator asked for the version enabled (no `--disabled`).
    enable: bool,
}

/// Reads and parses the `.gkmetadata` an installed tree keeps.
fn read_installed_metadata(
    dir: &Path,
    id: &PackageId,
    version: &Version,
) -> Result<Metadata, HostError> {
    let path = dir.join(RESERVED_METADATA_NAME);
    let damaged = |problem: String| HostError::InstalledTree {
        package: format!("{id}@{version}"),
        path: path.clone(),
        problem,
    };
    let bytes =
        std::fs::read(&path).map_err(|e| damaged(format!("cannot read its .gkmetadata: {e}")))?;
    Metadata::parse(&bytes).map_err(|e| damaged(format!("its .gkmetadata does not parse: {e}")))
}
