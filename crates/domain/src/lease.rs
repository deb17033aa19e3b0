//! The lease ledger: per package, how many explicit session leases and live bindings or handles
//! keep its code in use, and the rule that unloading, replacing, rolling back or removing a
//! package waits until both counts are zero.
//!
//! The ledger is plain data. The app keeps it behind its own lock and takes it only for short
//! updates: a change that needs the package quiescent checks the counts and marks the change
//! pending in one update ([`LeaseLedger::begin_change`]), does its slow work (extraction,
//! loading, the durable commit) without the lock, and clears the mark at the end. While the mark
//! is set, a new lease on the package is refused, so nothing can slip in between the check and
//! the change.

use std::collections::HashMap;
use std::fmt;

use crate::ids::PackageId;

/// What holds a package in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// An explicit lease taken by a session (for example a loaded model) on the package.
    Lease,
    /// A live binding or operation handle that points into the package's code.
    Binding,
}

impl fmt::Display for LeaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaseKind::Lease => "session lease",
            LeaseKind::Binding => "binding",
        })
    }
}

/// An action that needs the package quiescent: no leases and no bindings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuiescentAction {
    /// Taking the package's code out of the registry (disable).
    Unload,
    /// Replacing the loaded version with another (installing a new version).
    Replace,
    /// Returning to the previous version.
    Rollback,
    /// Deleting the current version's files.
    Remove,
}

impl fmt::Display for QuiescentAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuiescentAction::Unload => "unload",
            QuiescentAction::Replace => "replace",
            QuiescentAction::Rollback => "roll back",
            QuiescentAction::Remove => "remove",
        })
    }
}

/// The counts held on one package.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ActiveLeases {
    /// Explicit session leases.
    pub leases: u64,
    /// Live bindings into the package's code.
    pub bindings: u64,
}

impl ActiveLeases {
    /// Leases and bindings together. The ledger refuses any acquisition that would make this
    /// overflow, so it never saturates in practice.
    pub fn total(&self) -> u64 {
        self.leases.saturating_add(self.bindings)
    }

    fn count_mut(&mut self, kind: LeaseKind) -> &mut u64 {
        match kind {
            LeaseKind::Lease => &mut self.leases,
            LeaseKind::Binding => &mut self.bindings,
        }
    }
}

/// A ledger update that would make a count invalid. The ledger is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// A release without a matching acquire.
    #[error("cannot release a {kind} on {id}: none is held")]
    ReleaseWithoutAcquire {
        /// The package.
        id: PackageId,
        /// Lease or binding.
        kind: LeaseKind,
    },
    /// A change that needs the package quiescent is in progress; the lease would pin code that
    /// is about to be unloaded or replaced. Retry once the change is over.
    #[error("cannot acquire a {kind} on {id}: a change to {action} it is in progress")]
    ChangePending {
        /// The package.
        id: PackageId,
        /// Lease or binding.
        kind: LeaseKind,
        /// The change in progress.
        action: QuiescentAction,
    },
    /// An acquire that would overflow the count.
    #[error("cannot acquire another {kind} on {id}: the count would overflow")]
    CountOverflow {
        /// The package.
        id: PackageId,
        /// Lease or binding.
        kind: LeaseKind,
    },
}

/// A package is still in use, so `action` must wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot {action} {id}: {leases} session lease(s) and {bindings} binding(s) are still active"
)]
pub struct Leased {
    /// The package in use.
    pub id: PackageId,
    /// What was refused.
    pub action: QuiescentAction,
    /// Session leases held.
    pub leases: u64,
    /// Live bindings held.
    pub bindings: u64,
}

/// Lease and binding counts per package id, and the changes in progress that need a package
/// quiescent. Packages with nothing held have no entry, so the ledger's size follows the
/// packages in use, not all packages ever seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseLedger {
    held: HashMap<PackageId, ActiveLeases>,
    pending: HashMap<PackageId, QuiescentAction>,
}

impl LeaseLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one more `kind` on `id` and returns the new counts; refused while a change to
    /// `id` is pending.
    pub fn acquire(&mut self, id: &PackageId, kind: LeaseKind) -> Result<ActiveLeases, LeaseError> {
        if let Some(action) = self.pending.get(id) {
            return Err(LeaseError::ChangePending {
                id: id.clone(),
                kind,
                action: *action,
            });
        }
        let current = self.active(id);
        if current
            .leases
            .checked_add(current.bindings)
            .and_then(|t| t.checked_add(1))
            .is_none()
        {
            return Err(LeaseError::CountOverflow {
                id: id.clone(),
                kind,
            });
        }
        let entry = self.held.entry(id.clone()).or_default();
        // Cannot overflow: the total, which bounds this count, was checked above.
        *entry.count_mut(kind) += 1;
        Ok(*entry)
    }

    /// Records that one `kind` on `id` ended and returns the new counts. Releasing more than was
    /// acquired is an error, never a wrap-around.
    pub fn release(&mut self, id: &PackageId, kind: LeaseKind) -> Result<ActiveLeases, LeaseError> {
        let Some(entry) = self.held.get_mut(id) else {
            return Err(LeaseError::ReleaseWithoutAcquire {
                id: id.clone(),
                kind,
            });
        };
        let count = entry.count_mut(kind);
        let Some(lower) = count.checked_sub(1) else {
            return Err(LeaseError::ReleaseWithoutAcquire {
                id: id.clone(),
                kind,
            });
        };
        *count = lower;
        let now = *entry;
        if now.total() == 0 {
            self.held.remove(id);
        }
        Ok(now)
    }

    /// The counts held on `id`; zero for a package nobody holds.
    pub fn active(&self, id: &PackageId) -> ActiveLeases {
        self.held.get(id).copied().unwrap_or_default()
    }

    /// Allows `action` on `id` only when no lease and no binding is held on it.
    pub fn check_quiescent(&self, id: &PackageId, action: QuiescentAction) -> Result<(), Leased> {
        let a = self.active(id);
        if a.total() == 0 {
            Ok(())
        } else {
            Err(Leased {
                id: id.clone(),
                action,
                leases: a.leases,
                bindings: a.bindings,
            })
        }
    }

    /// Starts `action` on `id`: allowed only when nothing is held on it (as
    /// [`LeaseLedger::check_quiescent`]), and then marked pending, so that every acquisition on
    /// `id` is refused until [`LeaseLedger::end_change`]. The caller serialises changes; a
    /// second change on the same package replaces the first one's mark.
    pub fn begin_change(&mut self, id: &PackageId, action: QuiescentAction) -> Result<(), Leased> {
        self.check_quiescent(id, action)?;
        self.pending.insert(id.clone(), action);
        Ok(())
    }

    /// Ends the change pending on `id` (committed or not); acquisitions are allowed again.
    pub fn end_change(&mut self, id: &PackageId) {
        self.pending.remove(id);
    }

    /// The change pending on `id`, if any.
    pub fn pending(&self, id: &PackageId) -> Option<QuiescentAction> {
        self.pending.get(id).copied()
    }

    /// The packages held by anything, with their counts, sorted by package id.
    pub fn held(&self) -> Vec<(PackageId, ActiveLeases)> {
        let mut out: Vec<_> = self.held.iter().map(|(id, a)| (id.clone(), *a)).collect();
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(s: &str) -> PackageId {
        PackageId::new(s).unwrap()
    }

    #[test]
    fn lease_counts_both_kinds_and_blocks_every_action_until_zero() {
        let mut ledger = LeaseLedger::new();
        let scan = id("example.scan");
        assert_eq!(ledger.active(&scan), ActiveLeases::default());
        ledger.acquire(&scan, LeaseKind::Lease).unwrap();
        ledger.acquire(&scan, LeaseKind::Binding).unwrap();
        let a = ledger.acquire(&scan, LeaseKind::Binding).unwrap();
        assert_eq!(
            a,
            ActiveLeases {
                leases: 1,
                bindings: 2
            }
        );
        assert_eq!(a.total(), 3);
        for action in [
            QuiescentAction::Unload,
            QuiescentAction::Replace,
            QuiescentAction::Rollback,
            QuiescentAction::Remove,
        ] {
            assert_eq!(
                ledger.check_quiescent(&scan, action),
                Err(Leased {
                    id: scan.clone(),
                    action,
                    leases: 1,
                    bindings: 2
                })
            );
        }
        ledger.release(&scan, LeaseKind::Binding).unwrap();
        ledger.release(&scan, LeaseKind::Binding).unwrap();
        assert_eq!(
            ledger.check_quiescent(&scan, QuiescentAction::Unload),
            Err(Leased {
                id: scan.clone(),
                action: QuiescentAction::Unload,
                leases: 1,
                bindings: 0
            })
        );
        assert_eq!(
            ledger.release(&scan, LeaseKind::Lease),
            Ok(ActiveLeases::default())
        );
        assert_eq!(
            ledger.check_quiescent(&scan, QuiescentAction::Remove),
            Ok(())
        );
        assert!(ledger.held().is_empty());
    }

    #[test]
    fn lease_release_below_zero_is_refused_and_changes_nothing() {
        let mut ledger = LeaseLedger::new();
        let scan = id("example.scan");
        assert_eq!(
            ledger.release(&scan, LeaseKind::Lease),
            Err(LeaseError::ReleaseWithoutAcquire {
                id: scan.clone(),
                kind: LeaseKind::Lease
            })
        );
        ledger.acquire(&scan, LeaseKind::Lease).unwrap();
        assert_eq!(
            ledger.release(&scan, LeaseKind::Binding),
            Err(LeaseError::ReleaseWithoutAcquire {
                id: scan.clone(),
                kind: LeaseKind::Binding
            })
        );
        assert_eq!(
            ledger.active(&scan),
            ActiveLeases {
                leases: 1,
                bindings: 0
            }
        );
    }

    #[test]
    fn lease_acquire_that_would_overflow_is_refused() {
        let scan = id("example.scan");
        let mut ledger = LeaseLedger::new();
        let full = ActiveLeases {
            leases: u64::MAX - 1,
            bindings: 1,
        };
        ledger.held.insert(scan.clone(), full);
        assert_eq!(
            ledger.acquire(&scan, LeaseKind::Lease),
            Err(LeaseError::CountOverflow {
                id: scan.clone(),
                kind: LeaseKind::Lease
            })
        );
        assert_eq!(ledger.active(&scan), full);
        assert_eq!(full.total(), u64::MAX);
    }

    #[test]
    fn a_pending_change_refuses_acquisitions_until_it_ends() {
        let mut ledger = LeaseLedger::new();
        let (scan, other) = (id("example.scan"), id("example.other"));
        ledger.acquire(&scan, LeaseKind::Lease).unwrap();
        assert_eq!(
            ledger.begin_change(&scan, QuiescentAction::Replace),
            Err(Leased {
                id: scan.clone(),
                action: QuiescentAction::Replace,
                leases: 1,
                bindings: 0
            })
        );
        assert_eq!(
            ledger.pending(&scan),
            None,
            "a refused change marks nothing"
        );
        ledger.release(&scan, LeaseKind::Lease).unwrap();
        ledger
            .begin_change(&scan, QuiescentAction::Replace)
            .unwrap();
        assert_eq!(ledger.pending(&scan), Some(QuiescentAction::Replace));
        for kind in [LeaseKind::Lease, LeaseKind::Binding] {
            assert_eq!(
                ledger.acquire(&scan, kind),
                Err(LeaseError::ChangePending {
                    id: scan.clone(),
                    kind,
                    action: QuiescentAction::Replace
                })
            );
        }
        assert!(ledger.acquire(&other, LeaseKind::Lease).is_ok());
        ledger.end_change(&scan);
        assert!(ledger.acquire(&scan, LeaseKind::Lease).is_ok());
        assert_eq!(
            LeaseError::ChangePending {
                id: scan.clone(),
                kind: LeaseKind::Lease,
                action: QuiescentAction::Unload
            }
            .to_string(),
            "cannot acquire a session lease on example.scan: a change to unload it is in progress"
        );
    }

    #[test]
    fn lease_messages_read_well() {
        let err = Leased {
            id: id("example.scan"),
            action: QuiescentAction::Rollback,
            leases: 2,
            bindings: 1,
        };
        assert_eq!(
            err.to_string(),
            "cannot roll back example.scan: 2 session lease(s) and 1 binding(s) are still active"
        );
        let err = LeaseError::ReleaseWithoutAcquire {
            id: id("a"),
            kind: LeaseKind::Binding,
        };
        assert_eq!(
            err.to_string(),
            "cannot release a binding on a: none is held"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(usize, LeaseKind),
        Release(usize, LeaseKind),
    }

    fn op() -> impl Strategy<Value = Op> {
        let kind = prop_oneof![Just(LeaseKind::Lease), Just(LeaseKind::Binding)];
        (any::<bool>(), 0usize..3, kind).prop_map(|(acq, p, k)| {
            if acq {
                Op::Acquire(p, k)
            } else {
                Op::Release(p, k)
            }
        })
    }

    proptest! {
        /// The ledger agrees with a plain map of signed counts in which a release at zero is
        /// refused.
        #[test]
        fn lease_ledger_agrees_with_a_reference_model(ops in proptest::collection::vec(op(), 0..200)) {
            let ids = [id("a"), id("b.c"), id("d")];
            let mut ledger = LeaseLedger::new();
            let mut model: HashMap<(usize, bool), i64> = HashMap::new();
            for op in ops {
                let (p, kind, delta) = match op {
                    Op::Acquire(p, k) => (p, k, 1),
                    Op::Release(p, k) => (p, k, -1),
                };
                let key = (p, kind == LeaseKind::Lease);
                let before = *model.get(&key).unwrap_or(&0);
                let result = if delta > 0 {
                    ledger.acquire(&ids[p], kind)
                } else {
                    ledger.release(&ids[p], kind)
                };
                if before + delta < 0 {
                    prop_assert_eq!(
                        result,
                        Err(LeaseError::ReleaseWithoutAcquire { id: ids[p].clone(), kind })
                    );
                } else {
                    model.insert(key, before + delta);
                    prop_assert!(result.is_ok());
                }
                for (q, qid) in ids.iter().enumerate() {
                    let leases = *model.get(&(q, true)).unwrap_or(&0);
                    let bindings = *model.get(&(q, false)).unwrap_or(&0);
                    let active = ledger.active(qid);
                    prop_assert_eq!(i64::try_from(active.leases).unwrap(), leases);
                    prop_assert_eq!(i64::try_from(active.bindings).unwrap(), bindings);
                    prop_assert_eq!(i64::try_from(active.total()).unwrap(), leases + bindings);
                    let quiet = ledger.check_quiescent(qid, QuiescentAction::Replace);
                    prop_assert_eq!(quiet.is_ok(), leases + bindings == 0);
                }
            }
        }
    }
}
