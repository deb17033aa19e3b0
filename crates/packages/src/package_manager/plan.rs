//! A whole plan of changes made as one ([`PackageManager::apply_plan`]): the disables and
//! installations of a `guild sync`, drafted into one next store state, checked together on the
//! state they make, and committed in one store transaction.
//!
//! Each step is drafted as its single change would be (an installation authenticated and
//! published with the same rules, an installed version re-checked before it is made loadable
//! again), but the dependency graph and the impl-id claims are judged once, on the final state:
//! a plan that swaps a dependency and its dependent together is sound even though neither step
//! is sound alone. Only then is anything extracted; then the hook prepares every change in the
//! plan's order, and one commit makes all of them durable or none. A runner following the store
//! sees the generation before and the one after, nothing in between.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use guild_domain::ids::PackageId;
use guild_domain::lease::QuiescentAction;
use guild_domain::manifest::Metadata;
use guild_domain::store_state::{PublishKind, StoreState};
use guild_domain::version::Version;
use guild_ports::source::OpenedPackage;
use guild_ports::store::Transaction;

use super::fleet::{FleetChange, PlanTrust};
use super::install::installed_as_found;
use super::kept::{Kept, KeptChange};
use super::lease::PendingChange;
use super::{Change, InstallOptions, Installed, Lifecycle, LifecycleHook, PackageManager};
use crate::error::HostError;

/// One step of a plan for [`PackageManager::apply_plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanStep {
    /// Disable the enabled version of this package.
    Disable(PackageId),
    /// Install the package file at this path enabled, as `install` with the downgrade allowed
    /// would: a new version is extracted, an installed one is made current and enabled (or
    /// enabled, or repaired when its installed copy fails its check).
    Install(PathBuf),
}

/// What one step of a plan did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepDone {
    /// The package's enabled version was disabled.
    Disabled {
        /// The package.
        id: PackageId,
        /// The version that was enabled.
        version: Version,
    },
    /// The package file was installed, as the report says.
    Installed(Installed),
}

/// Why a plan was not applied. Nothing in the store changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A step, or the plan as a whole, was refused or failed.
    #[error("cannot {step} {package}: {source}")]
    Step {
        /// What was being done: `disable`, `install`, `enable`, or for the plan as a whole
        /// `apply the changes to`, `commit the changes to`.
        step: &'static str,
        /// The package (`id` or `id version`), or for the plan as a whole the packages it
        /// changes.
        package: String,
        /// Why.
        #[source]
        source: Box<HostError>,
    },
    /// The state the plan makes was checked by the caller before the commit and refused.
    #[error("the plan's result was refused: {reason}")]
    NotAccepted {
        /// The caller's reason.
        reason: String,
    },
}

/// A step drafted into the next store state, with what its check, extraction and hook need.
enum Drafted {
    Disable {
        id: PackageId,
        version: Version,
    },
    /// A version the store does not install: extracted once the plan is checked.
    New {
        opened: Option<Box<dyn OpenedPackage>>,
        metadata: Arc<Metadata>,
        package: String,
        installed: Installed,
        staged: Option<PathBuf>,
    },
    /// An installed version whose installed copy is tainted or damaged: the offered package's
    /// tree replaces it.
    Repair {
        opened: Option<Box<dyn OpenedPackage>>,
        metadata: Arc<Metadata>,
        package: String,
        installed: Installed,
        enabled_after: bool,
        staged: Option<PathBuf>,
    },
    /// An installed, sound version made current and enabled again (`from` was current), or,
    /// when it is current already, enabled (`reactivated` false).
    Loadable {
        installed: Installed,
        metadata: Arc<Metadata>,
        reactivated: bool,
        from: Option<Version>,
    },
    /// The version is current and enabled already: nothing changes but, when the offered copy
    /// carries verified signatures the store lacks (a copy re-signed during a key rotation),
    /// their record (`recorded`: the version's metadata with them).
    Unchanged {
        installed: Installed,
        recorded: Option<Arc<Metadata>>,
    },
}

impl Drafted {
    /// The package the step changes, and the metadata of a version it brings that the
    /// lifecycle does not know yet.
    fn package(&self) -> (&PackageId, Option<&Metadata>) {
        match self {
            Drafted::Disable { id, .. } => (id, None),
            Drafted::New {
                installed,
                metadata,
                ..
            }
            | Drafted::Repair {
                installed,
                metadata,
                ..
            } => (&installed.id, Some(metadata)),
            Drafted::Loadable { installed, .. } | Drafted::Unchanged { installed, .. } => {
                (&installed.id, None)
            }
        }
    }

    /// The metadata of the version the step makes loadable and that claims its impl ids anew
    /// (a new version, one made current or enabled again), if any.
    fn claimant(&self) -> Option<&Metadata> {
        match self {
            Drafted::New { metadata, .. } | Drafted::Loadable { metadata, .. } => Some(metadata),
            _ => None,
        }
    }

    /// The tree this step staged, if it got that far.
    fn staged(&self) -> Option<&Path> {
        match self {
            Drafted::New { staged, .. } | Drafted::Repair { staged, .. } => staged.as_deref(),
            _ => None,
        }
    }
}

/// A step's error, naming it.
fn step_error(step: &'static str, package: impl Into<String>, source: HostError) -> PlanError {
    PlanError::Step {
        step,
        package: package.into(),
        source: Box::new(source),
    }
}

impl PackageManager {
    /// Makes every change of `steps` as one: drafts each into one next store state (in order;
    /// each package at most once), checks the dependency graph and the impl-id claims on the
    /// state they make together (so no order of single changes needs to be sound, only the
    /// result), asks `accept` whether that state is the one the caller wants, extracts the new
    /// trees, lets `hook` prepare each change (for a version made loadable, the registration
    /// check, as a single change runs it), and commits once. `hook` hears `committed` or
    /// `aborted` once, after the last `prepare`; it is told `aborted` too when a later `prepare`
    /// refuses after earlier ones passed. On any failure nothing is committed and every staged
    /// tree is discarded.
    ///
    /// An installation here is one with the downgrade allowed and the version enabled
    /// ([`InstallOptions`]), as `guild sync` wants.
    pub fn apply_plan(
        &self,
        steps: &[PlanStep],
        accept: &dyn Fn(&StoreState) -> Result<(), String>,
        hook: &mut dyn LifecycleHook,
    ) -> Result<Vec<StepDone>, PlanError> {
        self.apply_plan_with(steps, accept, hook, None)
    }

    /// [`PackageManager::apply_plan`] that also replaces the store's trust and its fleet record
    /// as `fleet` says, in the same transaction: the plan's packages are authenticated under the
    /// new trust, and the commit writes the new trust file and records the policy with them. It
    /// commits even when no package changes. Refused, changing nothing, when the store's fleet
    /// record is no longer the one `fleet` was judged against.
    pub fn apply_fleet_plan(
        &self,
        steps: &[PlanStep],
        accept: &dyn Fn(&StoreState) -> Result<(), String>,
        hook: &mut dyn LifecycleHook,
        fleet: FleetChange,
    ) -> Result<Vec<StepDone>, PlanError> {
        self.apply_plan_with(steps, accept, hook, Some(fleet))
    }

    fn apply_plan_with(
        &self,
        steps: &[PlanStep],
        accept: &dyn Fn(&StoreState) -> Result<(), String>,
        hook: &mut dyn LifecycleHook,
        fleet: Option<FleetChange>,
    ) -> Result<Vec<StepDone>, PlanError> {
        let mut life = self.lock();
        let whole = |source: HostError| step_error("apply the changes to", "the store", source);
        let _write = self.write_session(&mut life).map_err(whole)?;
        let registry = self
            .store
            .registry()
            .map_err(|e| whole(HostError::Store(e)))?;
        let mut next = registry.successor();
        let mut trust_bytes = None;
        let _planned = match fleet {
            None => None,
            Some(change) => {
                if registry.fleet() != Some(&change.before) {
                    return Err(whole(HostError::FleetRecordChanged));
                }
                let mut trust = change.trust;
                // A revocation never disappears: those the store recorded stay beside the
                // policy's, which win over any key or payload it trusts.
                if let Some(anchor) = registry.trust_anchor() {
                    for (key, reason) in &anchor.revoked_keys {
                        trust.revoke_key(*key, reason.clone());
                    }
                    for (digest, reason) in &anchor.revoked_digests {
                        trust.revoke_digest(*digest, reason.clone());
                    }
                }
                let (bytes, anchor) = self.seal_trust(&registry, trust.clone());
                next.set_trust_anchor(anchor);
                next.set_fleet(change.after);
                trust_bytes = Some(bytes);
                Some(PlanTrust::set(self, trust))
            }
        };
        let mut pending = Vec::new();
        let mut drafted = Vec::with_capacity(steps.len());
        let mut seen = BTreeSet::new();
        for step in steps {
            let d = self.draft_step(&life, &registry, &mut next, step, &mut seen, &mut pending)?;
            drafted.push(d);
        }
        if trust_bytes.is_none()
            && drafted
                .iter()
                .all(|d| matches!(d, Drafted::Unchanged { recorded: None, .. }))
        {
            // Nothing to commit, and nothing for the hook to take part in.
            return Ok(drafted.into_iter().map(done).collect());
        }
        let ids: Vec<String> = seen.iter().map(ToString::to_string).collect();
        let ids = if ids.is_empty() {
            "the store".to_owned()
        } else {
            ids.join(", ")
        };
        let whole = |source: HostError| step_error("apply the changes to", ids.clone(), source);

        let after = self
            .check_plan(&mut life, &registry, &next, &drafted)
            .map_err(whole)?;
        accept(&next).map_err(|reason| PlanError::NotAccepted { reason })?;

        let prepared = self
            .extract_plan(&mut drafted)
            .and_then(|()| self.prepare_plan(&drafted, hook));
        if let Err(e) = prepared {
            self.discard_plan(&drafted);
            return Err(e);
        }
        let mut tx = Transaction::new(registry.generation(), next.clone());
        let trust_changed = trust_bytes.is_some();
        if let Some(bytes) = trust_bytes {
            tx = tx.with_trust(bytes);
        }
        for d in &drafted {
            match d {
                Drafted::New {
                    installed,
                    staged: Some(staged),
                    ..
                } => {
                    tx = tx.with_install(
                        installed.id.clone(),
                        installed.version.clone(),
                        staged.clone(),
                    )
                }
                Drafted::Repair {
                    installed,
                    staged: Some(staged),
                    ..
                } => {
                    tx = tx.with_replacement(
                        installed.id.clone(),
                        installed.version.clone(),
                        staged.clone(),
                    )
                }
                _ => {}
            }
        }
        self.commit(tx, hook)
            .map_err(|source| step_error("commit the changes to", ids.clone(), source))?;
        drop(pending);
        if trust_changed {
            life.trust_epoch += 1;
        }

        let epoch = life.trust_epoch;
        for d in &drafted {
            match d {
                Drafted::New {
                    installed,
                    metadata,
                    ..
                } => {
                    let key = (installed.id.clone(), installed.version.clone());
                    life.metadata.insert(key, metadata.clone());
                }
                Drafted::Repair {
                    installed,
                    metadata,
                    ..
                } => {
                    let key = (installed.id.clone(), installed.version.clone());
                    life.authenticated_at.insert(key.clone(), epoch);
                    life.metadata.insert(key, metadata.clone());
                }
                Drafted::Unchanged {
                    installed,
                    recorded: Some(merged),
                } => {
                    let key = (installed.id.clone(), installed.version.clone());
                    life.metadata.insert(key, merged.clone());
                }
                _ => {}
            }
        }
        life.kept = Some(after);
        Ok(drafted.into_iter().map(done).collect())
    }

    /// Drafts `step` into `next`, with the checks of its single change that look at nothing but
    /// its own package; a change that needs its package quiescent is marked in `pending`. A
    /// package already in `seen` (changed by an earlier step) is refused; `seen` gains this
    /// step's.
    fn draft_step<'p>(
        &'p self,
        life: &Lifecycle,
        registry: &StoreState,
        next: &mut StoreState,
        step: &PlanStep,
        seen: &mut BTreeSet<PackageId>,
        pending: &mut Vec<PendingChange<'p>>,
    ) -> Result<Drafted, PlanError> {
        let mut once = |id: &PackageId, step: &'static str, label: &str| {
            if seen.insert(id.clone()) {
                Ok(())
            } else {
                Err(step_error(
                    step,
                    label,
                    HostError::RepeatedInPlan { id: id.clone() },
                ))
            }
        };
        match step {
            PlanStep::Disable(id) => {
                once(id, "disable", id.as_str())?;
                let failed = |e: HostError| step_error("disable", id.to_string(), e);
                let version = next.disable(id).map_err(|e| failed(e.into()))?;
                pending.push(
                    self.begin_change(id, QuiescentAction::Unload)
                        .map_err(failed)?,
                );
                Ok(Drafted::Disable {
                    id: id.clone(),
                    version,
                })
            }
            PlanStep::Install(location) => {
                let label = location.display().to_string();
                let (opened, metadata, package, auth) = self
                    .offered(location)
                    .map_err(|e| step_error("install", label.clone(), e))?;
                let manifest = metadata.manifest();
                let (id, version) = (manifest.package_id.clone(), manifest.version.clone());
                let label = format!("{id} {version}");
                once(&id, "install", &label)?;
                let failed = |e: HostError| step_error("install", label.clone(), e);
                let options = InstallOptions {
                    enable: true,
                    allow_downgrade: true,
                };
                let installed = installed_as_found(registry, &metadata, &auth);
                let (published, tainted) =
                    Self::publish_into(next, &metadata, &auth, options).map_err(failed)?;
                let was_enabled = registry.package(&id).and_then(|p| p.enabled()).is_some();
                if published.kind == PublishKind::New {
                    if was_enabled {
                        pending.push(
                            self.begin_change(&id, QuiescentAction::Replace)
                                .map_err(failed)?,
                        );
                    }
                    let mut installed = installed;
                    installed.changed = true;
                    installed.enabled = true;
                    installed.superseded = published.superseded;
                    return Ok(Drafted::New {
                        opened: Some(opened),
                        metadata,
                        package,
                        installed,
                        staged: None,
                    });
                }
                // An installed copy that fails only for want of a signature the offered copy
                // carries (a policy revoked the key it was signed with, and trusts the key the
                // copy was re-signed with) is kept, and the signature recorded, below: its
                // files stay in place for whatever runs them.
                // The installed copy is checked once (it re-hashes its files).
                let copy_fails = tainted || self.installed_copy_fails(life, &id, &version);
                let needs_signature_only = copy_fails
                    && !tainted
                    && installed.enabled
                    && published.kind != PublishKind::Reactivated
                    && self.trusted_with_offered_signatures(life, &metadata, &auth.signed_by);
                if copy_fails && !needs_signature_only {
                    let current_disabled = next
                        .package(&id)
                        .and_then(|p| p.current())
                        .is_some_and(|(v, r)| *v == version && !r.state.is_enabled());
                    if current_disabled {
                        next.enable(&id).map_err(|e| failed(e.into()))?;
                    }
                    let enabled_after =
                        next.package(&id).and_then(|p| p.enabled()) == Some(&version);
                    if enabled_after && was_enabled {
                        pending.push(
                            self.begin_change(&id, QuiescentAction::Replace)
                                .map_err(failed)?,
                        );
                    }
                    let mut installed = installed;
                    installed.changed = true;
                    installed.repaired = true;
                    installed.enabled = enabled_after;
                    installed.reactivated = published.kind == PublishKind::Reactivated;
                    installed.superseded = published.superseded;
                    return Ok(Drafted::Repair {
                        opened: Some(opened),
                        metadata,
                        package,
                        installed,
                        enabled_after,
                        staged: None,
                    });
                }
                // Nothing will be extracted, but the file offered is still checked whole, as an
                // installation of an installed version checks it.
                let mut opened = opened;
                let watch = self.watch(&mut *opened, &package, metadata.manifest());
                opened
                    .verify_in_place(metadata.manifest())
                    .map_err(|e| failed(e.into()))?;
                drop(watch);
                let reactivated = published.kind == PublishKind::Reactivated;
                if !reactivated && installed.enabled {
                    // A copy re-signed during a key rotation: its verified signatures the store
                    // lacks are recorded, as a single installation of it records them.
                    let mut installed = installed;
                    let recorded = match life.metadata.get(&(id.clone(), version.clone())) {
                        Some(stored) => {
                            let added = super::install::add_verified_signatures(
                                next,
                                stored,
                                &metadata,
                                &installed.signed_by,
                            );
                            if added.is_empty() {
                                None
                            } else {
                                let merged = super::install::with_recorded_signatures(
                                    stored, &metadata, &added,
                                )
                                .map_err(|problem| {
                                    failed(HostError::InstalledTree {
                                        package: label.clone(),
                                        path: self.store.package_dir(&id, &version),
                                        problem,
                                    })
                                })?;
                                installed.changed = true;
                                installed.signatures_added = added;
                                Some(Arc::new(merged))
                            }
                        }
                        None => None,
                    };
                    return Ok(Drafted::Unchanged {
                        installed,
                        recorded,
                    });
                }
                if reactivated {
                    pending.push(
                        self.begin_change(&id, QuiescentAction::Replace)
                            .map_err(failed)?,
                    );
                } else {
                    next.enable(&id)
                        .map_err(|e| step_error("enable", label.clone(), e.into()))?;
                }
                let step = if reactivated { "install" } else { "enable" };
                let metadata = self
                    .verified_installed(life, registry, next, &id, &version)
                    .map_err(|e| step_error(step, label.clone(), e))?;
                let mut installed = installed;
                installed.changed = true;
                installed.enabled = true;
                installed.reactivated = reactivated;
                installed.superseded = published.superseded.clone();
                Ok(Drafted::Loadable {
                    installed,
                    metadata,
                    reactivated,
                    from: published.superseded,
                })
            }
        }
    }

    /// Checks the plan's final state `next` as a whole against `registry`: the dependency graph
    /// may gain no problem, and every version the plan makes loadable must find its impl ids
    /// free of other packages' claims in the final state. Answers what is kept once it commits.
    fn check_plan(
        &self,
        life: &mut Lifecycle,
        registry: &StoreState,
        next: &StoreState,
        drafted: &[Drafted],
    ) -> Result<Kept, HostError> {
        let mut changes: Vec<KeptChange> = Vec::with_capacity(drafted.len());
        for d in drafted {
            let (id, extra) = d.package();
            changes.push(self.kept_change(life, registry, next, id, extra)?);
        }
        let before = self.kept(life, registry)?;
        let after = Self::kept_after(before, &changes)?;
        Self::refuse_plan_breakage(before, &after, || {
            "changing those packages together".to_owned()
        })?;
        for metadata in drafted.iter().filter_map(Drafted::claimant) {
            Self::refuse_taken_ids(&after, metadata)?;
        }
        let mut after = after;
        after.generation = next.generation();
        Ok(after)
    }

    /// Extracts every new or repairing version into a staging tree of its own.
    fn extract_plan(&self, drafted: &mut [Drafted]) -> Result<(), PlanError> {
        for d in drafted.iter_mut() {
            if let Drafted::New {
                opened,
                metadata,
                package,
                installed,
                staged,
            }
            | Drafted::Repair {
                opened,
                metadata,
                package,
                installed,
                staged,
                ..
            } = d
            {
                let Some(opened) = opened.take() else {
                    continue;
                };
                let tree = self
                    .extract_to_staging(opened, package, metadata)
                    .map_err(|e| {
                        step_error(
                            "install",
                            format!("{} {}", installed.id, installed.version),
                            e,
                        )
                    })?;
                *staged = Some(tree);
            }
        }
        Ok(())
    }

    /// Lets `hook` prepare each change in the plan's order; once one refuses, the hook is told
    /// the plan is aborted.
    fn prepare_plan(
        &self,
        drafted: &[Drafted],
        hook: &mut dyn LifecycleHook,
    ) -> Result<(), PlanError> {
        for d in drafted {
            let (step, label, prepared) = match d {
                Drafted::Disable { id, version } => (
                    "disable",
                    id.to_string(),
                    hook.prepare(&Change::Disable { id, version }),
                ),
                // A repair that leaves its version enabled loads the new tree as an install does.
                Drafted::New {
                    metadata,
                    installed,
                    staged: Some(dir),
                    ..
                }
                | Drafted::Repair {
                    metadata,
                    installed,
                    enabled_after: true,
                    staged: Some(dir),
                    ..
                } => (
                    "install",
                    format!("{} {}", installed.id, installed.version),
                    hook.prepare(&Change::Install {
                        id: &installed.id,
                        version: &installed.version,
                        dir,
                        metadata,
                        enabled: true,
                    }),
                ),
                Drafted::Loadable {
                    installed,
                    metadata,
                    reactivated: true,
                    from,
                } => (
                    "install",
                    format!("{} {}", installed.id, installed.version),
                    hook.prepare(&Change::Reactivate {
                        id: &installed.id,
                        from: from.as_ref(),
                        to: &installed.version,
                        dir: self.store.package_dir(&installed.id, &installed.version),
                        metadata: metadata.clone(),
                    }),
                ),
                Drafted::Loadable {
                    installed,
                    metadata,
                    reactivated: false,
                    ..
                } => (
                    "enable",
                    format!("{} {}", installed.id, installed.version),
                    hook.prepare(&Change::Enable {
                        id: &installed.id,
                        version: &installed.version,
                        dir: self.store.package_dir(&installed.id, &installed.version),
                        metadata: metadata.clone(),
                    }),
                ),
                // Nothing that loads changes: a repair that leaves the version off, or no
                // change at all.
                _ => continue,
            };
            if let Err(e) = prepared {
                hook.aborted();
                return Err(step_error(step, label, e));
            }
        }
        Ok(())
    }

    /// Whether the installed version `offered` is a copy of (same id, version and payload) is
    /// sound and trusted once the offered copy's signatures by the keys in `verified` are
    /// recorded: its files match its metadata and today's trust authenticates it with them.
    fn trusted_with_offered_signatures(
        &self,
        life: &Lifecycle,
        offered: &Metadata,
        verified: &[guild_domain::ids::Sha256Digest],
    ) -> bool {
        let m = offered.manifest();
        let Some(stored) = life
            .metadata
            .get(&(m.package_id.clone(), m.version.clone()))
        else {
            return false;
        };
        let known: Vec<_> = stored.signatures().iter().map(|s| s.key_id).collect();
        let added: Vec<_> = verified
            .iter()
            .filter(|k| !known.contains(k))
            .copied()
            .collect();
        if added.is_empty() || stored.payload_digest() != offered.payload_digest() {
            return false;
        }
        match super::install::with_recorded_signatures(stored, offered, &added) {
            Ok(merged) => {
                self.check_still_trusted(&merged, &m.package_id, &m.version)
                    .is_ok()
                    && self.check_files(&merged, &m.package_id, &m.version).is_ok()
            }
            Err(_) => false,
        }
    }

    /// Gives back every tree the plan staged.
    fn discard_plan(&self, drafted: &[Drafted]) {
        for staged in drafted.iter().filter_map(Drafted::staged) {
            let _ = self.store.discard_staging(staged);
        }
    }
}

/// What a drafted step did, once committed.
fn done(d: Drafted) -> StepDone {
    match d {
        Drafted::Disable { id, version } => StepDone::Disabled { id, version },
        Drafted::New { installed, .. }
        | Drafted::Repair { installed, .. }
        | Drafted::Loadable { installed, .. }
        | Drafted::Unchanged { installed, .. } => StepDone::Installed(installed),
    }
}
