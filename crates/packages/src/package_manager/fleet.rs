//! The store side of following a fleet: its record of the fleet (read, and written in a commit
//! of its own when it joins), the check of a fetched package against the policy's entry, and
//! what a policy's plan commits besides its packages ([`FleetChange`]). The rules are the
//! domain's (`guild_domain::fleet`); [`crate::fleet`] puts the steps in order.

use std::path::Path;

use guild_domain::fleet::{authenticate_desired, FleetMembership, VerifiedPolicy};
use guild_domain::trust::TrustStore;
use guild_ports::store::Transaction;

use super::trust::PortCheck;
use super::{Installed, PackageManager};
use crate::error::HostError;

/// What applying a fleet policy commits besides its packages: the policy's trust in place of
/// the store's, and the store's new fleet record, judged against the record `before`.
#[derive(Debug, Clone)]
pub struct FleetChange {
    /// The fleet record the policy was judged against; the commit is refused if the store's
    /// differs by then.
    pub before: FleetMembership,
    /// The record to commit: the root now trusted and the policy accepted.
    pub after: FleetMembership,
    /// The trust the policy gives the store (its publishers and revocations).
    pub trust: TrustStore,
}

/// What joining a fleet did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// The store now follows the fleet, from this generation on.
    Now {
        /// The generation of the commit that recorded it.
        generation: u64,
    },
    /// The store already followed the fleet under this very root: nothing changed.
    Already,
}

/// Holds a fleet plan's trust as the trust the package manager reads, until dropped.
pub(super) struct PlanTrust<'a>(&'a PackageManager);

impl<'a> PlanTrust<'a> {
    pub(super) fn set(pm: &'a PackageManager, trust: TrustStore) -> Self {
        *pm.plan_trust.lock().unwrap_or_else(|e| e.into_inner()) = Some(trust);
        PlanTrust(pm)
    }
}

impl Drop for PlanTrust<'_> {
    fn drop(&mut self) {
        *self.0.plan_trust.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl PackageManager {
    /// The fleet this store follows, as committed: `None` when it joined none.
    pub fn fleet(&self) -> Result<Option<FleetMembership>, HostError> {
        Ok(self.store.registry()?.fleet().cloned())
    }

    /// Records `membership` as the store's fleet in one commit, if the store's record is still
    /// `expected` (else [`HostError::FleetRecordChanged`]); a record equal to the committed one
    /// commits nothing ([`Joined::Already`]).
    pub fn record_fleet(
        &self,
        expected: Option<&FleetMembership>,
        membership: FleetMembership,
    ) -> Result<Joined, HostError> {
        let mut life = self.lock();
        let _write = self.write_session(&mut life)?;
        let registry = self.store.registry()?;
        if registry.fleet() != expected {
            return Err(HostError::FleetRecordChanged);
        }
        if registry.fleet() == Some(&membership) {
            return Ok(Joined::Already);
        }
        let mut next = registry.successor();
        next.set_fleet(membership);
        let generation = next.generation();
        self.store
            .commit(Transaction::new(registry.generation(), next))?;
        // The fleet record is no part of the graph or of the claims: what is kept still holds
        // at the new generation.
        if let Some(kept) = life
            .kept
            .as_mut()
            .filter(|k| k.generation == registry.generation())
        {
            kept.generation = generation;
        }
        Ok(Joined::Now { generation })
    }

    /// Checks the package at `location` as [`PackageManager::check_package`] does, but under
    /// `policy` instead of the store's trust: authenticated by a key its entry allows and not
    /// revoked, the payload, version, kind and publisher its entry names, its platform, and
    /// every artifact hashed. Writes nothing.
    pub fn check_desired(
        &self,
        location: &Path,
        policy: &VerifiedPolicy,
    ) -> Result<Installed, HostError> {
        let (mut opened, metadata, package, _) = {
            let _life = self.lock();
            let _planned = PlanTrust::set(self, policy.trust_store());
            self.offered(location)?
        };
        let (auth, _) = authenticate_desired(policy, &metadata, &PortCheck(&*self.verifier))
            .map_err(|source| HostError::NotDesired {
                location: location.to_path_buf(),
                source,
            })?;
        let manifest = metadata.manifest();
        let watch = self.watch(&mut *opened, &package, manifest);
        opened.verify_in_place(manifest)?;
        drop(watch);
        Ok(Installed::checked(&metadata, &auth))
    }
}
