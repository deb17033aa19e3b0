//! Session leases on packages: taking and releasing them, and the quiescence a change that
//! unloads or replaces a package's code waits for.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use guild_domain::ids::PackageId;
use guild_domain::lease::{ActiveLeases, LeaseKind, LeaseLedger, QuiescentAction};

use super::PackageManager;
use crate::error::HostError;

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
pub(super) struct Ledger {
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
pub(super) struct PendingChange<'a> {
    ledger: &'a Ledger,
    id: PackageId,
}

impl Drop for PendingChange<'_> {
    fn drop(&mut self) {
        self.ledger.lock().end_change(&self.id);
    }
}

impl PackageManager {
    pub(super) fn lock_leases(&self) -> MutexGuard<'_, LeaseLedger> {
        self.leases.lock()
    }

    /// Checks that no session lease holds `id` and marks `action` pending on it, in one short
    /// critical section; until the returned guard is dropped, new leases on `id` are refused
    /// with [`LeaseError::ChangePending`](guild_domain::lease::LeaseError::ChangePending).
    pub(super) fn begin_change(
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
    pub fn wait_unleased(&self, id: &PackageId, deadline: Instant) -> bool {
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
}
