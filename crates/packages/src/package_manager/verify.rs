//! Checking installed versions again: the full check, the check before a library is opened, and
//! the taint recorded for what fails.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::lifecycle::State;
use guild_domain::manifest::Metadata;
use guild_domain::manifest_facts::ManifestFacts;
use guild_domain::path::RESERVED_METADATA_NAME;
use guild_domain::store_state::{StoreState, Taint};
use guild_domain::trust::{authenticate, TrustStore};
use guild_domain::version::Version;
use guild_ports::store::Transaction;

use super::trust::PortCheck;
use super::{
    FullCheck, LeftOut, Lifecycle, PackageManager, TrustedUnder, VerifyFailure, VerifyOptions,
};
use crate::error::HostError;

impl PackageManager {
    /// Checks the installed files of `id@version` against its signed manifest, through the same
    /// hardened path that extraction uses, before its library can be opened again.
    pub(super) fn check_files(
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
        if life
            .trusted_under
            .as_ref()
            .is_some_and(|t| t.admits(id, version, life.trust_epoch))
        {
            return Ok(());
        }
        let metadata = self.kept_metadata(&mut life, id, version)?;
        self.check_still_trusted(&metadata, id, version)?;
        let epoch = life.trust_epoch;
        life.authenticated_at.insert(key, epoch);
        Ok(())
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
    pub(super) fn verify_enabled(
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
        if !full {
            life.trusted_under = anchor.map(|anchor| TrustedUnder {
                registry: registry.clone(),
                anchor,
                epoch,
            });
        }
        let mut out = Checked::default();
        // The versions to check, a batch at a time: each batch's metadata is read, its
        // signatures (and files) checked in parallel, and the metadata dropped before the next
        // is read, so that re-authenticating a store of 10,000 versions after a trust change
        // holds a batch of them at a time, not all. Nor does the handle keep them: a version's
        // metadata is read again when something needs it, as after an opening that checked
        // nothing (what was authenticated is the payload digest the registry records, which a
        // later read is held to).
        let mut batches = Batches {
            trust,
            full,
            jobs,
            work: Vec::new(),
            next: registry.successor(),
            recorded: false,
            failed: BTreeMap::new(),
        };
        // Versions whose metadata cannot be read fail before their signatures are checked.
        let mut unreadable = Vec::new();
        for (id, version, record) in registry.installed() {
            let enabled = record.state.is_enabled();
            if !enabled && !full {
                continue;
            }
            if enabled {
                out.verified += 1;
            }
            if !full && anchor.is_some() && record.trusted_under == anchor {
                // Authenticated at `epoch` by the rule set below, not by an entry of its own.
                continue;
            }
            let metadata = match self.metadata_for(life, id, version, record) {
                Ok(m) => m,
                Err(e) => {
                    // Its tree is damaged: it fails this check like a changed file.
                    unreadable.push((id.clone(), version.clone(), record.state, e));
                    continue;
                }
            };
            if full {
                // What changes are checked against must be what was signed: a record that
                // disagrees (or predates the facts) is corrected from the metadata, which is
                // checked below like every version's.
                let facts = ManifestFacts::of(metadata.manifest());
                if record.facts.as_deref() != Some(&facts) {
                    batches.recorded |= batches.next.set_facts(id, version, facts);
                }
            }
            batches
                .work
                .push((id.clone(), version.clone(), record.state, metadata));
            if batches.work.len() == METADATA_BATCH {
                self.check_batch(life, &mut batches, &mut out);
            }
        }
        self.check_batch(life, &mut batches, &mut out);
        // What passed is recorded under today's trust file after the last batch, not batch by
        // batch: after a trust change that copies every package's record into the draft, and
        // copies made while the batches' metadata came and went were scattered among it, which
        // kept the process large (an install into 10,000 packages right after a trust change
        // peaked at 31.6 MB of RSS recording batch by batch, at 28.5 MB recording here).
        if let Some(anchor) = anchor {
            record_passed(registry, &mut batches, &out.failures, &unreadable, anchor);
        }
        out.checked += unreadable.len();
        let Batches {
            mut next,
            recorded,
            mut failed,
            ..
        } = batches;
        let mut removed = Vec::new();
        for (id, version, state, e) in unreadable {
            if !self.store.package_dir(&id, &version).exists() {
                // No tree at all is no tamper evidence: the version is marked removed, as
                // `guild recover` does (installing it again restores it), and what depends on it
                // is disabled below.
                if next.package(&id).and_then(|p| p.enabled()) == Some(&version) {
                    next.disable(&id)?;
                }
                next.remove(&id, &version)?;
                out.failures.push(VerifyFailure {
                    id: id.clone(),
                    version: version.clone(),
                    state,
                    file: None,
                    reason: e.to_string(),
                    tampered: false,
                });
                removed.push(LeftOut {
                    id,
                    version,
                    reason: format!(
                        "its installed tree is missing ({e}); it was marked removed: install \
                         the package again to restore it"
                    ),
                });
                continue;
            }
            let failure = Failed {
                reason: e.to_string(),
                tampered: true,
                file: Some(RESERVED_METADATA_NAME.to_owned()),
            };
            note_failure(&mut out.failures, &mut failed, id, version, state, failure);
        }
        // Also when nothing failed here: a version marked removed while opening may have left
        // enabled dependents behind.
        let (next, disabled) = self.taint(life, next, failed)?;
        out.disabled = removed;
        out.disabled.extend(disabled);
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

    /// Checks the versions of the batch (`batches.work`, emptied) as
    /// [`PackageManager::verify_enabled`] does, into `batches` and `out`.
    fn check_batch(&self, life: &mut Lifecycle, batches: &mut Batches, out: &mut Checked) {
        let Batches {
            trust,
            full,
            jobs,
            work,
            next: _,
            recorded: _,
            failed,
        } = batches;
        out.checked += work.len();
        out.reauthenticated += work.len();
        let results = crate::parallel::map(work, *jobs, |(id, version, _, metadata)| {
            self.check_version(trust, metadata, id, version, *full)
        });
        let epoch = life.trust_epoch;
        for ((id, version, state, _), result) in work.drain(..).zip(results) {
            match result {
                Ok(()) => {
                    // Recorded in the store after the last batch (`record_passed`).
                    life.authenticated_at.insert((id, version), epoch);
                }
                Err(failure) => {
                    note_failure(&mut out.failures, failed, id, version, state, failure)
                }
            }
        }
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
        let metadata = self.kept_metadata(&mut life, id, version)?;
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
            let graph = self.requirements_graph(life, &next)?;
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
pub(super) enum Scope {
    /// Opening: the signatures of enabled versions whose recorded trust file is not today's.
    Open,
    /// Everything, on `jobs` threads.
    Full {
        /// Worker threads.
        jobs: usize,
    },
}

/// How many versions' metadata a check holds at a time ([`PackageManager::verify_enabled`]):
/// enough that each batch keeps every thread busy, few enough that a store of any size is
/// re-authenticated in a few megabytes. Two in debug builds, so that the tests' small stores
/// cross batches (what a check finds does not depend on the size).
const METADATA_BATCH: usize = if cfg!(debug_assertions) { 2 } else { 1024 };

/// A check's batches ([`PackageManager::verify_enabled`]): what each is checked against, the
/// batch being gathered, and what the batches checked so far settled: the registry to commit,
/// whether it records anything new, and the enabled versions that failed.
struct Batches {
    trust: TrustStore,
    /// Whether files are hashed too (the full check).
    full: bool,
    jobs: usize,
    work: Vec<(PackageId, Version, State, Arc<Metadata>)>,
    next: StoreState,
    recorded: bool,
    failed: BTreeMap<PackageId, Failed>,
}

/// Reports that `id@version` (in `state`) failed its check, and keeps the failure of an enabled
/// version in `failed`, to be tainted.
fn note_failure(
    failures: &mut Vec<VerifyFailure>,
    failed: &mut BTreeMap<PackageId, Failed>,
    id: PackageId,
    version: Version,
    state: State,
    failure: Failed,
) {
    failures.push(VerifyFailure {
        id: id.clone(),
        version,
        state,
        file: failure.file.clone(),
        reason: failure.reason.clone(),
        tampered: failure.tampered,
    });
    if state.is_enabled() {
        failed.insert(id, failure);
    }
}

/// Records in `batches.next` that every version the check looked at and that passed (none of
/// `failures` or `unreadable`) verified under the trust file `anchor`: at opening the enabled
/// versions, in a full check the installed ones. Those already recorded under it were not
/// checked at opening and are left as they are (their records are not copied).
fn record_passed(
    registry: &StoreState,
    batches: &mut Batches,
    failures: &[VerifyFailure],
    unreadable: &[(PackageId, Version, State, HostError)],
    anchor: Sha256Digest,
) {
    let failed: BTreeSet<(&PackageId, &Version)> = failures
        .iter()
        .map(|f| (&f.id, &f.version))
        .chain(unreadable.iter().map(|(id, version, _, _)| (id, version)))
        .collect();
    for (id, version, record) in registry.installed() {
        let looked_at = batches.full || record.state.is_enabled();
        if looked_at && record.trusted_under != Some(anchor) && !failed.contains(&(id, version)) {
            batches.recorded |= batches.next.set_trusted_under(id, version, anchor);
        }
    }
}

/// What [`PackageManager::verify_enabled`] found and did.
#[derive(Debug, Default)]
pub(super) struct Checked {
    /// Enabled versions considered.
    pub(super) verified: usize,
    /// Versions whose signatures were checked.
    pub(super) reauthenticated: usize,
    /// Versions checked (signatures, and for a full check files).
    pub(super) checked: usize,
    /// Every version that failed.
    pub(super) failures: Vec<VerifyFailure>,
    /// What was disabled.
    pub(super) disabled: Vec<LeftOut>,
}

/// Whether an installed version's failed authentication shows that it was altered (a signature
/// that no longer verifies, or none at all) rather than that trust changed (a revoked key or
/// payload, a publisher or key no longer trusted).
fn is_tampered(e: &guild_domain::trust::AuthError) -> bool {
    use guild_domain::trust::{AuthError, SignatureOutcome};
    match e {
        AuthError::NoSignatures | AuthError::InvalidTrustedSignature { .. } => true,
        AuthError::NoValidSignature { attempts, .. } => attempts
            .iter()
            .any(|(_, o)| matches!(o, SignatureOutcome::Invalid { .. })),
        _ => false,
    }
}
