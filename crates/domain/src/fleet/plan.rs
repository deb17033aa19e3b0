//! The desired set as a lock, so that [`crate::distribution::plan_sync`] plans the steps, and the
//! fact the command line guards with `--allow-shrink`.

use std::collections::BTreeSet;

use crate::distribution::{HeldVersion, LockFile, LockedPackage};
use crate::ids::PackageId;

use super::policy::VerifiedPolicy;

/// What following a policy would take away from a store: the packages enabled now that the
/// desired set does not name, which a sync disables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shrink {
    /// The enabled packages the policy does not desire, by id.
    pub disabled: Vec<PackageId>,
    /// How many packages are enabled now.
    pub enabled_before: usize,
    /// How many the policy desires.
    pub enabled_after: usize,
}

impl Shrink {
    /// Whether following the policy disables anything.
    pub fn is_empty(&self) -> bool {
        self.disabled.is_empty()
    }

    /// Whether following the policy leaves nothing enabled where something is.
    pub fn empties_the_store(&self) -> bool {
        self.enabled_after == 0 && self.enabled_before > 0
    }
}

impl VerifiedPolicy {
    /// The desired set as a lock: one entry per package, with its source. A lock records one
    /// key per package, which is informative (the trust decides); it is the first key the entry
    /// names that is not revoked, and verification made sure there is one. An empty desired set
    /// gives an empty lock: a fleet may desire nothing.
    pub fn to_lock(&self) -> LockFile {
        let policy = self.policy();
        let packages = policy.packages.iter().map(|p| LockedPackage {
            id: p.id.clone(),
            version: p.version.clone(),
            kind: p.kind,
            payload_sha256: p.payload_sha256,
            publisher: p.publisher.clone(),
            key_id: *p
                .key_ids
                .iter()
                .find(|k| !policy.revoked_keys.contains_key(k))
                .unwrap_or(&p.key_ids[0]),
            source: Some(p.source.clone()),
        });
        // Reading refused a package desired twice, so the lock takes every entry.
        LockFile::new(packages).unwrap_or_default()
    }

    /// What following the policy would disable in a store that holds `held`.
    pub fn shrinks(&self, held: &[HeldVersion]) -> Shrink {
        let desired: BTreeSet<&PackageId> = self.policy().packages.iter().map(|p| &p.id).collect();
        let enabled: BTreeSet<&PackageId> =
            held.iter().filter(|h| h.enabled).map(|h| &h.id).collect();
        Shrink {
            disabled: enabled
                .iter()
                .filter(|id| !desired.contains(*id))
                .map(|id| (*id).clone())
                .collect(),
            enabled_before: enabled.len(),
            enabled_after: desired.len(),
        }
    }
}
