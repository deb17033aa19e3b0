//! Following the store: catching up with the generations other processes commit, and the load
//! plan of what is enabled.

use std::sync::Arc;

use guild_domain::claims::{conflicts, ImplIdConflict};
use guild_domain::graph::PackageNode;
use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::version::Version;
#[cfg(doc)]
use guild_ports::store::PackageStore;

use super::open::with_record_signatures;
use super::verify::{Checked, Scope};
use super::{LeftOut, Lifecycle, LoadOrder, PackageManager, PlannedPackage, Refreshed};
use crate::error::HostError;

impl PackageManager {
    /// Brings the lifecycle state in line with the store's view (a reader's newest committed
    /// generation): brings the metadata it has read up to date (each version's is read when
    /// something first needs it), forgets removed ones, starts
    /// a new trust epoch when the trust file changed, and (for a reader) works out in memory
    /// which enabled versions it cannot load (signatures only where the trust file changed since
    /// they were authenticated; no file is hashed). Answers what it checked, with the unusable
    /// versions in [`Checked::disabled`].
    pub(super) fn catch_up(&self, life: &mut Lifecycle) -> Result<Checked, HostError> {
        let registry = self.store.registry()?;
        let mut damaged = Vec::new();
        // Only the versions this handle has read: any other is read when something first needs
        // it. Signatures recorded since this handle read one (a re-signed copy was installed
        // during a key rotation) join the ones it holds; the file is not read again.
        let mut merged = Vec::new();
        for ((id, version), known) in &life.metadata {
            let Some(record) = registry
                .record(id, version)
                .filter(|r| r.state.is_installed())
            else {
                continue;
            };
            let signed = |k| known.signatures().iter().any(|s| s.key_id == k);
            if record.signatures.iter().all(|s| signed(s.key_id)) {
                continue;
            }
            let dir = self.store.package_dir(id, version);
            match with_record_signatures((**known).clone(), record, &dir, id, version) {
                Ok(m) => merged.push(((id.clone(), version.clone()), Arc::new(m))),
                Err(e) => damaged.push(LeftOut {
                    id: id.clone(),
                    version: version.clone(),
                    reason: format!("its installed tree is damaged ({e})"),
                }),
            }
        }
        life.metadata.extend(merged);
        // A version whose record does not carry what the graph reads of it (a store written
        // before it was recorded) is read now, as opening always did for such stores.
        for (id, version, record) in registry.installed() {
            let key = (id.clone(), version.clone());
            if record.facts.is_some() || life.metadata.contains_key(&key) {
                continue;
            }
            match self.metadata_for(life, id, version, record) {
                Ok(m) => {
                    life.metadata.insert(key, m);
                }
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

    /// Reads every installed version's metadata now, which opening no longer does (each is
    /// otherwise read when something first needs it), as `guild doctor` does to look at every
    /// tree. A version whose tree is damaged (its `.gkmetadata` missing, unreadable or not the
    /// payload the registry records) is left out, and so is what depends on it: in this
    /// process's view for a reader, marked removed (and its dependents disabled) in the store
    /// for a writer. Answers what was left out or disabled.
    pub fn read_installed(&self) -> Result<Vec<LeftOut>, HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        let registry = self.store.registry()?;
        let mut damaged = Vec::new();
        for (id, version, record) in registry.installed() {
            match self.metadata_for(&life, id, version, record) {
                Ok(m) => {
                    life.metadata.insert((id.clone(), version.clone()), m);
                }
                Err(e) => damaged.push((id.clone(), version.clone(), e.to_string())),
            }
        }
        if !self.store.is_reader() {
            if damaged.is_empty() {
                return Ok(Vec::new());
            }
            let mut out = self.mark_damaged_removed(&registry, damaged)?;
            let registry = self.store.registry()?;
            out.extend(
                self.verify_enabled(&mut life, &registry, Scope::Open)?
                    .disabled,
            );
            return Ok(out);
        }
        let mut view = life
            .local_view
            .clone()
            .unwrap_or_else(|| registry.successor());
        let mut out = Vec::new();
        for (id, version, problem) in damaged {
            if view.package(&id).and_then(|p| p.enabled()) == Some(&version) {
                view.disable(&id)?;
            }
            if view.is_installed(&id, &version) {
                view.remove(&id, &version)?;
            }
            out.push(LeftOut {
                id,
                version,
                reason: format!("its installed tree is damaged ({problem})"),
            });
        }
        if out.is_empty() {
            return Ok(out);
        }
        let checked = self.verify_enabled(&mut life, &view, Scope::Open)?;
        life.local_view = Some(view);
        out.extend(checked.disabled);
        Ok(out)
    }

    /// Catches up with the store if this handle has not yet
    /// ([`PackageManager::open_dir_committed`] defers it to the first query that needs it).
    pub(super) fn ensure_caught_up(&self, life: &mut Lifecycle) -> Result<(), HostError> {
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

    /// `id@version` as a load plan would name it: its tree in the store (which may be gone).
    pub fn planned(&self, id: &PackageId, version: &Version) -> PlannedPackage {
        PlannedPackage {
            id: id.clone(),
            version: version.clone(),
            dir: self.store.package_dir(id, version),
        }
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
