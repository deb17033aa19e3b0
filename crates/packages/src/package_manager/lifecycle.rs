//! The lifecycle changes of installed versions: enable, disable, remove, purge and rollback.

use std::sync::Arc;

use guild_domain::ids::PackageId;
use guild_domain::lease::QuiescentAction;
use guild_domain::manifest::Metadata;
use guild_domain::store_state::StoreState;
use guild_domain::version::Version;
use guild_ports::store::Transaction;

use super::{Change, Lifecycle, LifecycleHook, NoHook, PackageManager};
use crate::error::HostError;

impl PackageManager {
    /// The metadata of an installed version that is about to become loadable again (enable,
    /// rollback, reactivation): still authenticated by today's trust store, and its installed
    /// files still those the metadata signs. The draft `next` records that it was authenticated
    /// under the trust file `registry` records.
    pub(super) fn verified_installed(
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
}
