//! What a fleet-managed store records of its fleet, beside its trust anchor: the root it trusts
//! (pinned when it joined, or reached from that one by verified rotations) and the last policy
//! it accepted. The package service writes it in the same commit as the trust file and the
//! packages a policy brings, so a store never follows half a policy.

use crate::ids::FleetId;

use super::accept::PolicyRecord;
use super::root::{SignedRoot, VerifiedRoot};

/// A store's record of its fleet. A store that has one is fleet-managed: its trust is the
/// policy's, and local trust changes are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetMembership {
    /// The root the store trusts, with its signatures, as received (the package service checks
    /// its signatures again when it reads it back).
    pub root: SignedRoot,
    /// The last policy accepted, if any yet.
    pub policy: Option<PolicyRecord>,
}

impl FleetMembership {
    /// The record of a store that just joined the fleet of `root`: no policy yet.
    pub fn joined(root: &VerifiedRoot) -> Self {
        FleetMembership {
            root: root.signed().clone(),
            policy: None,
        }
    }

    /// The fleet.
    pub fn fleet(&self) -> &FleetId {
        &self.root.body().fleet
    }
}
