//! Whether one policy may follow another: the same fleet, a higher version, and every
//! revocation of the one before kept. A revocation that a policy drops would make a machine
//! that joins later (or restores an old backup) trust the leaked key again, so signers and
//! verifiers compare a policy with the last one before it is signed or taken.

use std::collections::BTreeMap;
use std::fmt;

use crate::ids::{FleetId, Sha256Digest};

use super::policy::FleetPolicy;

/// The revocations some earlier trust held that a policy does not list, with their reasons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DroppedRevocations {
    /// Revoked keys the policy does not revoke.
    pub keys: BTreeMap<Sha256Digest, String>,
    /// Revoked payload digests the policy does not revoke.
    pub digests: BTreeMap<Sha256Digest, String>,
}

impl DroppedRevocations {
    /// Which of the revoked `keys` and `digests` (each with its reason) `next` does not revoke.
    pub fn of<'a>(
        keys: impl IntoIterator<Item = (&'a Sha256Digest, &'a str)>,
        digests: impl IntoIterator<Item = (&'a Sha256Digest, &'a str)>,
        next: &FleetPolicy,
    ) -> Self {
        DroppedRevocations {
            keys: missing(&next.revoked_keys, keys),
            digests: missing(&next.revoked_digests, digests),
        }
    }

    /// Whether nothing was dropped.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.digests.is_empty()
    }
}

/// The entries of `held` that `kept` lacks.
fn missing<'a>(
    kept: &BTreeMap<Sha256Digest, String>,
    held: impl IntoIterator<Item = (&'a Sha256Digest, &'a str)>,
) -> BTreeMap<Sha256Digest, String> {
    held.into_iter()
        .filter(|(d, _)| !kept.contains_key(d))
        .map(|(d, r)| (*d, r.to_owned()))
        .collect()
}

impl fmt::Display for DroppedRevocations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self
            .keys
            .iter()
            .map(|(k, r)| format!("revoked key {k} ({r})"));
        let digests = self
            .digests
            .iter()
            .map(|(d, r)| format!("revoked payload {d} ({r})"));
        f.write_str(&keys.chain(digests).collect::<Vec<_>>().join(", "))
    }
}

/// Why a policy does not follow the one given as its predecessor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuccessionError {
    /// The two policies are different fleets'.
    #[error(
        "fleet policy version {next} is a policy of fleet {next_fleet}, but the previous policy \
         (version {previous}) is fleet {previous_fleet}'s"
    )]
    OtherFleet {
        /// The previous policy's version.
        previous: u64,
        /// Its fleet.
        previous_fleet: FleetId,
        /// The next policy's version.
        next: u64,
        /// Its fleet.
        next_fleet: FleetId,
    },
    /// The next policy's version is not higher than the previous one's.
    #[error(
        "fleet policy version {next} does not follow version {previous}: the next policy must \
         have a higher version"
    )]
    NotNewer {
        /// The previous policy's version.
        previous: u64,
        /// The next policy's version.
        next: u64,
    },
    /// The next policy leaves out revocations of the previous one.
    #[error(
        "fleet policy version {next} drops {} revocation(s) of version {previous}: {dropped}",
        dropped.keys.len() + dropped.digests.len()
    )]
    DropsRevocations {
        /// The previous policy's version.
        previous: u64,
        /// The next policy's version.
        next: u64,
        /// What it dropped.
        dropped: Box<DroppedRevocations>,
    },
}

/// Checks that `next` may follow `previous`: the same fleet, a higher version, and every key
/// and payload digest `previous` revokes revoked by `next` too (the reasons may change).
pub fn check_succession(previous: &FleetPolicy, next: &FleetPolicy) -> Result<(), SuccessionError> {
    if previous.fleet != next.fleet {
        return Err(SuccessionError::OtherFleet {
            previous: previous.version,
            previous_fleet: previous.fleet.clone(),
            next: next.version,
            next_fleet: next.fleet.clone(),
        });
    }
    if next.version <= previous.version {
        return Err(SuccessionError::NotNewer {
            previous: previous.version,
            next: next.version,
        });
    }
    let dropped = DroppedRevocations::of(
        previous.revoked_keys.iter().map(|(d, r)| (d, r.as_str())),
        previous
            .revoked_digests
            .iter()
            .map(|(d, r)| (d, r.as_str())),
        next,
    );
    if !dropped.is_empty() {
        return Err(SuccessionError::DropsRevocations {
            previous: previous.version,
            next: next.version,
            dropped: Box::new(dropped),
        });
    }
    Ok(())
}
