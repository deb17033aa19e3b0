//! Installing a package: authenticating what is offered, checking it against the store, and
//! extracting and committing it, or repairing or reactivating a version already installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::lease::QuiescentAction;
use guild_domain::manifest::Metadata;
use guild_domain::manifest_facts::ManifestFacts;
use guild_domain::store_state::{NewVersion, PublishKind, PublishOptions, Published, StoreState};
use guild_domain::trust::{authenticate, Authenticated};
use guild_domain::version::Version;
use guild_ports::source::{OpenedPackage, Progress};
use guild_ports::store::Transaction;

use super::trust::PortCheck;
use super::{Change, InstallOptions, Installed, Lifecycle, LifecycleHook, NoHook, PackageManager};
use crate::error::HostError;

/// Ends a watched piece of work when dropped, whether it finished or failed.
pub(super) struct Watch(Option<Arc<dyn Progress>>);

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.finish();
        }
    }
}

/// A package offered for installation once it is authenticated: the opened package, its
/// metadata, its `id@version` label and who signed it.
pub(super) type Authenticating = (Box<dyn OpenedPackage>, Arc<Metadata>, String, Authenticated);

impl PackageManager {
    /// Reports the artifact bytes each installation reads to `progress` (a command line's
    /// progress bar); `None` stops reporting.
    pub fn set_progress(&self, progress: Option<Arc<dyn Progress>>) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = progress;
    }

    /// Extracts an authenticated package into a new staging directory, hashing every file as it
    /// is written; on failure the directory is discarded. The extractor writes the signed
    /// `.gkmetadata` into the tree exactly as received, so that the store can be re-verified
    /// later without the archive.
    pub(super) fn extract_to_staging(
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
    pub(super) fn watch(
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

    /// Steps 1 and 2 of an installation that need no registry: the package at `location` opened,
    /// its metadata parsed and authenticated against the current trust store, and its platform
    /// checked. Answers the opened package, its metadata, its `id@version` label and who signed it.
    pub(super) fn offered(&self, location: &Path) -> Result<Authenticating, HostError> {
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
        self.check_package_as(location, None)
    }

    /// [`PackageManager::check_package`], answering `key` as the signing key when the package
    /// also carries a valid signature by it under the current trust store (a package signed by
    /// several trusted keys authenticates under the first that verifies). A sync holds each
    /// package to the key its lock names by comparing [`Installed::key_id`] with it.
    pub fn check_package_as(
        &self,
        location: &Path,
        key: Option<&Sha256Digest>,
    ) -> Result<Installed, HostError> {
        let (mut opened, metadata, package, mut auth) = {
            let _life = self.lock();
            self.offered(location)?
        };
        if let Some(key) = key.filter(|k| **k != auth.key_id) {
            if let Ok(by_key) = self.authenticated_by(&metadata, key) {
                auth = by_key;
            }
        }
        let manifest = metadata.manifest();
        let watch = self.watch(&mut *opened, &package, manifest);
        opened.verify_in_place(manifest)?;
        drop(watch);
        Ok(Installed::checked(&metadata, &auth))
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
        let (opened, metadata, package, auth) = self.offered(location)?;
        let registry = self.store.registry()?;
        let draft = Self::draft_install(&registry, &metadata, &auth, options)?;
        let installed = installed_as_found(&registry, &metadata, &auth);
        let offered = Offered {
            opened,
            metadata,
            package,
            enable: options.enable,
        };
        if draft.published.kind != PublishKind::New {
            let (id, version) = (&installed.id, &installed.version);
            if draft.tainted || self.installed_copy_fails(&life, id, version) {
                return self.repair(&mut life, &registry, draft, installed, offered, hook);
            }
            return self.install_again(&mut life, &registry, draft, installed, offered, hook);
        }
        self.install_new(&mut life, &registry, draft, installed, offered, hook)
    }

    /// Step 2 of an installation against the store: the offered version (authenticated, with
    /// `metadata`) published in a draft of `registry`, with the trust file the registry records
    /// as the one it was authenticated under. Refused by the immutable-version and downgrade
    /// rules ([`StoreState::publish`]).
    fn draft_install(
        registry: &StoreState,
        metadata: &Metadata,
        auth: &Authenticated,
        options: InstallOptions,
    ) -> Result<Draft, HostError> {
        let mut next = registry.successor();
        let (published, tainted) = Self::publish_into(&mut next, metadata, auth, options)?;
        Ok(Draft {
            next,
            published,
            tainted,
        })
    }

    /// [`PackageManager::draft_install`] into the draft `next`, which other changes of the same
    /// transaction may have changed already (never the offered package's record): answers what
    /// publishing decided and whether the offered package repairs a tainted version.
    pub(super) fn publish_into(
        next: &mut StoreState,
        metadata: &Metadata,
        auth: &Authenticated,
        options: InstallOptions,
    ) -> Result<(Published, bool), HostError> {
        let manifest = metadata.manifest();
        let (id, version) = (&manifest.package_id, &manifest.version);
        // A genuine copy of a tainted version repairs it: the taint is lifted in the
        // draft, so that the publication decides as for any installed version, and the files
        // are replaced by the repair.
        let tainted = next.record(id, version).is_some_and(|r| {
            r.payload_digest == auth.payload_digest && r.state.is_installed() && r.taint.is_some()
        });
        if tainted {
            next.clear_taint(id, version);
        }
        let trusted_under = next.trust_anchor().map(|a| a.file_digest);
        let published = next.publish(
            id,
            version,
            NewVersion {
                payload_digest: auth.payload_digest,
                kind: manifest.kind,
                publisher: manifest.publisher_id.clone(),
                signed_by: auth.signed_by.clone(),
                facts: Some(ManifestFacts::of(manifest)),
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
        // A version installed again (a repair, a re-signed copy) gets the facts of its
        // authenticated manifest, in case its record predates them or holds wrong ones.
        next.set_facts(id, version, ManifestFacts::of(manifest));
        Ok((published, tainted))
    }

    /// The second half of [`PackageManager::install`] when the offered version is installed
    /// and its installed copy is sound: the offered file is still checked in full, then the
    /// offered file's verified signatures that the store lacks are recorded (a copy re-signed
    /// during a key rotation), and otherwise nothing changes (it is the current version already)
    /// or the version is made current again ([`PackageManager::reactivate`]), in one commit.
    fn install_again(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        draft: Draft,
        mut installed: Installed,
        offered: Offered,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Installed, HostError> {
        let Offered {
            mut opened,
            metadata,
            package,
            ..
        } = offered;
        // Nothing will be extracted, but the operator offered this file expecting it to be
        // checked: a damaged or tampered copy of an installed version is still an error.
        let watch = self.watch(&mut *opened, &package, metadata.manifest());
        opened.verify_in_place(metadata.manifest())?;
        drop(watch);
        let Draft {
            mut next,
            published,
            ..
        } = draft;
        let (id, version) = (installed.id.clone(), installed.version.clone());
        let stored = self.loaded_metadata(life, &id, &version)?;
        let added = add_verified_signatures(&mut next, &stored, &metadata, &installed.signed_by);
        let merged = if added.is_empty() {
            Arc::clone(&stored)
        } else {
            let merged =
                with_recorded_signatures(&stored, &metadata, &added).map_err(|problem| {
                    HostError::InstalledTree {
                        package: format!("{id}@{version}"),
                        path: self.store.package_dir(&id, &version),
                        problem,
                    }
                })?;
            Arc::new(merged)
        };
        let key = (id, version);
        if published.kind == PublishKind::IdenticalNoOp {
            if added.is_empty() {
                return Ok(installed);
            }
            // Only the registry changes: no file of the version, nothing loaded, so no lease
            // or hook has a part in it, and a runner serving the version goes on serving it.
            self.store
                .commit(Transaction::new(registry.generation(), next))?;
            life.metadata.insert(key, merged);
        } else {
            // The reactivation re-authenticates the version with every signature it will
            // have; a refusal puts back what the store holds.
            life.metadata.insert(key.clone(), merged);
            match self.reactivate(life, registry, next, installed, published, hook) {
                Ok(done) => installed = done,
                Err(e) => {
                    life.metadata.insert(key, stored);
                    return Err(e);
                }
            }
        }
        if !added.is_empty() {
            installed.changed = true;
            installed.signatures_added = added;
        }
        Ok(installed)
    }

    /// Steps 2 to 4 of an installation of a version not installed before: the graph with it in
    /// place and the impl ids it provides are checked before anything of it is written, then
    /// it is extracted into staging, the hook prepares, and one transaction installs it.
    fn install_new(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        draft: Draft,
        mut installed: Installed,
        offered: Offered,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Installed, HostError> {
        let Draft {
            next, published, ..
        } = draft;
        let Offered {
            opened,
            metadata,
            package,
            enable,
        } = offered;
        let manifest = metadata.manifest();
        let (id, version) = (&manifest.package_id, &manifest.version);

        // Validate the graph with the new version in place, before anything is written.
        let change = self.kept_change(life, registry, &next, id, Some(&metadata))?;
        let judged = self.judged_on(life, registry, &change, Some(&metadata))?;
        Self::refuse_breakage(&judged, &change, || format!("installing {id}@{version}"))?;
        // Its impl ids must be free before anything of it is written or opened.
        Self::refuse_taken_ids(&judged, &metadata)?;
        drop(judged);

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
            enabled: enable,
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
        Self::advance(life, change);
        installed.changed = true;
        installed.enabled = enable;
        installed.superseded = published.superseded;
        Ok(installed)
    }

    /// Whether the installed tree of `id@version` no longer holds what its signed manifest says,
    /// or its signature no longer authenticates it: a copy worth replacing when the operator
    /// offers a genuine one.
    pub(super) fn installed_copy_fails(
        &self,
        life: &Lifecycle,
        id: &PackageId,
        version: &Version,
    ) -> bool {
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
    fn repair(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        draft: Draft,
        mut installed: Installed,
        offered: Offered,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Installed, HostError> {
        let Draft {
            mut next,
            published,
            ..
        } = draft;
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
        let judged = self.judged_on(life, registry, &change, None)?;
        Self::refuse_breakage(&judged, &change, || format!("repairing {id}@{version}"))?;
        drop(judged);
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
        published: Published,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Installed, HostError> {
        let (id, version) = (&installed.id, &installed.version);
        let change = self.kept_change(life, registry, &next, id, None)?;
        let candidate = self.loaded_metadata(life, id, version)?;
        let judged = self.judged_on(life, registry, &change, Some(&candidate))?;
        Self::refuse_breakage(&judged, &change, || {
            format!("making {id}@{version} current again")
        })?;
        Self::refuse_taken_ids(&judged, &candidate)?;
        drop(judged);
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

/// An installation's draft of the registry, not yet committed: the offered version published.
struct Draft {
    /// The registry the installation commits.
    next: StoreState,
    /// What publishing the offered version decided.
    published: Published,
    /// Whether the offered package is a genuine copy of a tainted installed version (whose
    /// taint is lifted in `next`).
    tainted: bool,
}

/// Records in `next` the signatures of `offered` (a copy of the installed version whose signed
/// metadata is `stored`, with the same payload) that are by keys in `verified` (those whose
/// signatures `authenticate` just verified) and that `stored` lacks. Signatures by keys the
/// store does not trust (yet) are not recorded: nothing vouches for them, and a bad one would
/// refuse the version the day its key is trusted. Answers the keys added.
pub(super) fn add_verified_signatures(
    next: &mut StoreState,
    stored: &Metadata,
    offered: &Metadata,
    verified: &[guild_domain::ids::Sha256Digest],
) -> Vec<guild_domain::ids::Sha256Digest> {
    let m = offered.manifest();
    let known: Vec<_> = stored.signatures().iter().map(|s| s.key_id).collect();
    let new: Vec<_> = offered
        .signatures()
        .iter()
        .filter(|s| verified.contains(&s.key_id) && !known.contains(&s.key_id))
        .cloned()
        .collect();
    if next.add_signatures(&m.package_id, &m.version, &known, &new) != new.len() {
        // The version is not installed in the draft: nothing was recorded.
        return Vec::new();
    }
    new.iter().map(|s| s.key_id).collect()
}

/// `stored` with the signatures of `offered` by the keys `added` appended.
pub(super) fn with_recorded_signatures(
    stored: &Metadata,
    offered: &Metadata,
    added: &[guild_domain::ids::Sha256Digest],
) -> Result<Metadata, String> {
    let mut signatures = stored.signatures().to_vec();
    signatures.extend(
        offered
            .signatures()
            .iter()
            .filter(|s| added.contains(&s.key_id))
            .cloned(),
    );
    stored
        .clone()
        .with_signatures(signatures)
        .map_err(|e| format!("its signatures cannot be combined: {e}"))
}

/// What an installation of the authenticated package `metadata` describes answers while it has
/// changed nothing: the version enabled or not as `registry` records it.
pub(super) fn installed_as_found(
    registry: &StoreState,
    metadata: &Metadata,
    auth: &Authenticated,
) -> Installed {
    let manifest = metadata.manifest();
    let (id, version) = (&manifest.package_id, &manifest.version);
    Installed {
        enabled: registry.package(id).and_then(|p| p.enabled()) == Some(version),
        ..Installed::checked(metadata, auth)
    }
}

impl Installed {
    /// What a check of the authenticated package `metadata` answers: an installation of it that
    /// has changed nothing (and is not enabled).
    pub(super) fn checked(metadata: &Metadata, auth: &Authenticated) -> Self {
        let manifest = metadata.manifest();
        Installed {
            id: manifest.package_id.clone(),
            version: manifest.version.clone(),
            kind: manifest.kind,
            payload_digest: auth.payload_digest,
            publisher: auth.publisher.clone(),
            key_id: auth.key_id,
            signed_by: auth.signed_by.clone(),
            signatures_added: Vec::new(),
            changed: false,
            enabled: false,
            superseded: None,
            reactivated: false,
            repaired: false,
        }
    }
}
