//! Opening the package manager over a store: the recovery report, the trust file's check, the
//! installed versions read back, and the re-verification of the enabled ones.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::manifest::Metadata;
use guild_domain::path::RESERVED_METADATA_NAME;
use guild_domain::store_state::{StoreState, VersionRecord};
use guild_domain::version::Version;
use guild_ports::signature::SignatureVerifier;
use guild_ports::source::PackageSource;
use guild_ports::store::{PackageStore, RecoveryReport, Transaction};

use super::lease::Ledger;
use super::verify::Scope;
use super::{LeftOut, Lifecycle, OpenReport, PackageManager, TrustReset};
use crate::error::HostError;
use guild_adapters_fs::store::StoreOptions;
use guild_domain::platform::HostPlatform;

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
        Self::open_with(
            store,
            recovery,
            source,
            verifier,
            platform,
            None,
            Reading::Usual,
        )
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
            Reading::Usual,
        )
    }

    /// Opens the package manager over `store` as [`PackageManager::open`] describes: as a reader
    /// when the store is one ([`PackageManager::open_reading`]), otherwise as the writer
    /// ([`PackageManager::open_writing`]).
    fn open_with(
        store: Box<dyn PackageStore>,
        recovery: RecoveryReport,
        source: Box<dyn PackageSource>,
        verifier: Box<dyn SignatureVerifier>,
        platform: HostPlatform,
        reset: Option<TrustReset>,
        reading: Reading,
    ) -> Result<(Self, OpenReport), HostError> {
        let committed_only = reading == Reading::CommittedOnly;
        let pm = Self::new(store, source, verifier, platform, committed_only);
        let mut report = OpenReport {
            recovery,
            ..OpenReport::default()
        };
        if pm.store.is_reader() {
            pm.open_reading(reset, &mut report)?;
        } else {
            pm.open_writing(reset, reading == Reading::Everything, &mut report)?;
        }
        Ok((pm, report))
    }

    /// A package manager over `store` that has read nothing yet. Only a reader can be opened to
    /// read the committed state only (`committed_only`).
    fn new(
        store: Box<dyn PackageStore>,
        source: Box<dyn PackageSource>,
        verifier: Box<dyn SignatureVerifier>,
        platform: HostPlatform,
        committed_only: bool,
    ) -> Self {
        let store_is_reader = store.is_reader();
        PackageManager {
            store,
            source,
            verifier,
            platform,
            lifecycle: Mutex::new(Lifecycle {
                metadata: HashMap::new(),
                trust_epoch: 0,
                authenticated_at: HashMap::new(),
                trusted_under: None,
                caught_up: false,
                generation: 0,
                trust_digest: None,
                local_view: None,
                kept: None,
                judged_around: false,
            }),
            leases: Arc::new(Ledger::default()),
            progress: Mutex::new(None),
            committed_only: committed_only && store_is_reader,
            plan_trust: Mutex::new(None),
        }
    }

    /// Opening as a reader: refuses to rebuild the trust file, checks the one found against the
    /// registry (writing nothing), and unless only the committed state is read, catches up with
    /// the store, leaving what this process cannot use out of its own view.
    fn open_reading(
        &self,
        reset: Option<TrustReset>,
        report: &mut OpenReport,
    ) -> Result<(), HostError> {
        let mut life = self.lock();
        if reset.is_some() {
            return Err(HostError::Store(guild_ports::store::StoreError::new(
                guild_ports::store::StoreErrorKind::InvalidTransaction,
                "a reader cannot rebuild the trust file; open the store as a writer",
            )));
        }
        self.check_trust_binding()?;
        report.read_only = true;
        if self.committed_only {
            report.committed_only = true;
            return Ok(());
        }
        let checked = self.catch_up(&mut life)?;
        report.verified = checked.verified;
        report.reauthenticated = checked.reauthenticated;
        report.disabled = checked.disabled;
        Ok(())
    }

    /// Opening as the writer, under the lifecycle lock: the trust file checked (or rebuilt as
    /// `reset` says), every installed version's metadata read back, the damaged ones marked
    /// removed, the enabled ones re-verified (what fails is disabled and recorded).
    fn open_writing(
        &self,
        reset: Option<TrustReset>,
        thorough: bool,
        report: &mut OpenReport,
    ) -> Result<(), HostError> {
        let mut life = self.lock();
        report.trust = match reset {
            None => self.check_trust_binding()?,
            Some(reset) => Some(self.rebuild_trust(reset)?),
        };
        let mut registry = self.store.registry()?;
        // Every installed version's metadata is read back only by an explicit recovery
        // (`guild recover`) or after a change was in flight; otherwise only the versions whose
        // record does not carry what the graph reads of them (a store written before it was
        // recorded), and any other is read when something first needs it.
        let rec = &report.recovery;
        let every = thorough || !rec.rolled_back.is_empty() || !rec.rolled_forward.is_empty();
        let damaged = self.read_back_installed(&mut life, &registry, every);
        if !damaged.is_empty() {
            report.removed = self.mark_damaged_removed(&registry, damaged)?;
            registry = self.store.registry()?;
        }

        let checked = self.verify_enabled(&mut life, &registry, Scope::Open)?;
        report.verified = checked.verified;
        report.reauthenticated = checked.reauthenticated;
        report.disabled = checked.disabled;
        life.caught_up = true;
        life.generation = registry.generation();
        life.trust_digest = self.store.read_trust()?.map(|b| Sha256Digest::of(&b));
        // What changes are checked against is not built here: an installation judges itself on
        // an index of what it touches (`judged_on`), and the index of every version is built
        // by the first change that needs it, so that a process making one installation (a
        // `guild install`) never indexes the whole store.
        Ok(())
    }

    /// Reads the signed metadata of every version `registry` records as installed into the
    /// lifecycle state. Answers the versions whose `.gkmetadata` cannot be read or parsed, or
    /// does not carry the payload digest the registry records, each with the problem.
    fn read_back_installed(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        every: bool,
    ) -> Vec<(PackageId, Version, String)> {
        let mut damaged = Vec::new();
        for (id, version, record) in registry.installed() {
            if !every && record.facts.is_some() {
                continue;
            }
            let dir = self.store.package_dir(id, version);
            let metadata = match read_installed_metadata(&dir, id, version)
                .and_then(|m| with_record_signatures(m, record, &dir, id, version))
            {
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
        damaged
    }

    /// Marks each `damaged` version removed (disabled first when it is the enabled one) in one
    /// durable transaction from `registry`; answers one report line per version.
    ///
    /// A version whose tree is gone or unreadable cannot be verified, loaded or rolled back to;
    /// it is recorded as removed (so the same version can only come back with the same content,
    /// by installing it again) instead of making the whole store unusable, and whatever depended
    /// on it is disabled by the re-verification that follows
    /// ([`PackageManager::verify_enabled`]).
    pub(super) fn mark_damaged_removed(
        &self,
        registry: &StoreState,
        damaged: Vec<(PackageId, Version, String)>,
    ) -> Result<Vec<LeftOut>, HostError> {
        let mut removed = Vec::new();
        let mut next = registry.successor();
        for (id, version, problem) in damaged {
            let enabled = next.package(&id).and_then(|p| p.enabled()) == Some(&version);
            if enabled {
                next.disable(&id)?;
            }
            next.remove(&id, &version)?;
            removed.push(LeftOut {
                id,
                version,
                reason: format!(
                    "its installed tree is damaged ({problem}); it was marked removed: \
                     install the package again to restore it"
                ),
            });
        }
        self.store
            .commit(Transaction::new(registry.generation(), next))?;
        Ok(removed)
    }

    /// Opens the store at `dir` (creating it when absent) with the production adapters: the
    /// file-system store, the hardened GKPK source and the P-256 verifier, for this platform.
    pub fn open_dir(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_with(dir, None)
    }

    /// [`PackageManager::open_dir`] with a recovery that lists every package tree whatever the
    /// store says (`guild recover`): it reports installed versions whose tree went missing and
    /// trees nothing accounts for, which an ordinary opening looks for only when a change was in
    /// flight.
    pub fn open_dir_recovering(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_as(dir, None, StoreOptions::new().sweep(), false)
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
    /// `Host` opens its store, and how `guild list`, `status` and `doctor` read.
    pub fn open_dir_reader(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_as(dir, None, StoreOptions::new().reader(), false)
    }

    /// Opens the store at `dir` as a reader ([`PackageManager::open_dir_reader`]) to read its
    /// committed state, as `guild list` and `guild status` do: the registry and the trust file
    /// only. No signature is checked and no file hashed, and the `.gkmetadata` files are read only
    /// when a query needs them ([`PackageManager::load_plan`],
    /// [`PackageManager::impl_id_conflicts`], [`PackageManager::metadata`], a change). A library
    /// loaded through it is still checked right before it opens
    /// ([`PackageManager::check_loadable`], [`PackageManager::check_files_before_load`]).
    pub fn open_dir_committed(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_as(dir, None, StoreOptions::new().reader(), true)
    }

    /// [`PackageManager::open_dir_committed`] for reading package `id` alone (`guild status
    /// ID`): the registry it holds records `id` and the store-wide facts (generation, trust
    /// anchor, fleet) and no other package, read from the registry files without decoding the
    /// other packages' records ([`guild_adapters_fs::store::FsStore::open_package_reader`]).
    /// Only queries about `id` answer as they would on a full reader
    /// ([`PackageManager::summary`], [`PackageManager::pins`] for `id`); a query about the whole
    /// store (`list`, `load_plan`, a change) sees a store of that one package, and a change is
    /// refused by the store. A store whose trust file is missing while it records packages is
    /// refused as [`PackageManager::open_dir_committed`] refuses it only when `id` is one of
    /// them; otherwise `id` is simply not found.
    pub fn open_dir_package(dir: &Path, id: &PackageId) -> Result<(Self, OpenReport), HostError> {
        let platform = current_platform()?;
        let opened = guild_adapters_fs::store::FsStore::open_package_reader(dir, id)?;
        Self::open_fs(opened, platform, None, Reading::CommittedOnly)
    }

    /// [`PackageManager::open_dir_committed`] for the listing alone (`guild list`):
    /// [`PackageManager::listing`] answers every package's row, read from the checkpoint's index
    /// and the log without decoding the checkpoint's records
    /// ([`guild_adapters_fs::store::FsStore::open_listing_reader`]). Every other query sees a
    /// store that records no package, and a change is refused by the store. The trust file is
    /// checked against the registry as [`PackageManager::open_dir_committed`] checks it.
    pub fn open_dir_listing(dir: &Path) -> Result<(Self, OpenReport), HostError> {
        let platform = current_platform()?;
        let opened = guild_adapters_fs::store::FsStore::open_listing_reader(dir)?;
        Self::open_fs(opened, platform, None, Reading::CommittedOnly)
    }

    fn open_dir_with(
        dir: &Path,
        reset: Option<TrustReset>,
    ) -> Result<(Self, OpenReport), HostError> {
        Self::open_dir_as(dir, reset, StoreOptions::new(), false)
    }

    fn open_dir_as(
        dir: &Path,
        reset: Option<TrustReset>,
        options: StoreOptions,
        committed_only: bool,
    ) -> Result<(Self, OpenReport), HostError> {
        let platform = current_platform()?;
        let reading = if committed_only {
            Reading::CommittedOnly
        } else if options.sweep {
            Reading::Everything
        } else {
            Reading::Usual
        };
        let opened = guild_adapters_fs::store::FsStore::open_with(dir, options)?;
        Self::open_fs(opened, platform, reset, reading)
    }

    /// A package manager over an opened directory store, with the production package source
    /// and signature verifier.
    fn open_fs(
        (store, recovery): (guild_adapters_fs::store::FsStore, RecoveryReport),
        platform: HostPlatform,
        reset: Option<TrustReset>,
        reading: Reading,
    ) -> Result<(Self, OpenReport), HostError> {
        Self::open_with(
            Box::new(store),
            recovery,
            Box::new(guild_adapters_fs::archive::GkpkSource::default()),
            Box::new(guild_adapters_crypto::P256Verifier::new()),
            platform,
            reset,
            reading,
        )
    }
}

/// The platform this build runs on, or the error naming the one it does not support.
fn current_platform() -> Result<HostPlatform, HostError> {
    HostPlatform::current().ok_or(HostError::UnsupportedPlatform {
        os: std::env::consts::OS,
        arch: std::env::consts::ARCH,
    })
}

/// The signed metadata of installed version `id@version`: its tree's `.gkmetadata` (`metadata`)
/// with the signatures the registry recorded for it since ([`VersionRecord::signatures`])
/// appended, leaving out any by a key the file's signatures name already. Answers `metadata`
/// unchanged when there are none to add.
pub(super) fn with_record_signatures(
    metadata: Metadata,
    record: &VersionRecord,
    dir: &Path,
    id: &PackageId,
    version: &Version,
) -> Result<Metadata, HostError> {
    let missing: Vec<_> = record
        .signatures
        .iter()
        .filter(|r| !metadata.signatures().iter().any(|s| s.key_id == r.key_id))
        .cloned()
        .collect();
    if missing.is_empty() {
        return Ok(metadata);
    }
    let mut signatures = metadata.signatures().to_vec();
    signatures.extend(missing);
    metadata
        .with_signatures(signatures)
        .map_err(|e| HostError::InstalledTree {
            package: format!("{id}@{version}"),
            path: dir.join(RESERVED_METADATA_NAME),
            problem: format!("the signatures the registry records for it do not fit: {e}"),
        })
}

/// Reads and parses the `.gkmetadata` an installed tree keeps.
pub(super) fn read_installed_metadata(
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

/// How much of the store opening reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// What a change or a query needs, read when first needed.
    Usual,
    /// A reader of the committed state only ([`PackageManager::open_dir_committed`]).
    CommittedOnly,
    /// A writer that reads every installed version back (`guild recover`).
    Everything,
}
