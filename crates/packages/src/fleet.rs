//! A store that follows a fleet: joining one by pinning its root, and applying its signed
//! policy as one store transaction.
//!
//! The rules are the domain's (`guild_domain::fleet`); this module puts them in order against
//! a store. [`join`] pins a root (verified by its own keys, and against a digest handed over out
//! of band when the operator gives one) in the store's state, beside the trust anchor. A sync
//! then goes in the two phases of [`crate::lock_sync`]:
//!
//! 1. [`judge`]: newer roots are taken only by the chain rules (each signed by a threshold of
//!    the previous root's keys and its own), the policy is verified under the newest root, and
//!    accepted against the policy the store recorded (no rollback, one document per version, no
//!    expired policy unless the operator overrides it, which the answer says). Then each package
//!    the plan installs is fetched by the caller and checked by [`stage`] against its policy
//!    entry: authenticated by a key the entry allows, the payload it pins, every artifact.
//! 2. [`apply`], under the store's lock: the desired set as a lock, planned again from the
//!    committed state, and committed with the policy's trust (replacing the store's; its
//!    revocations win) and the new fleet record in ONE transaction
//!    ([`PackageManager::apply_fleet_plan`]).
//!
//! Every refusal, in either phase, changes nothing in the store.

use std::collections::BTreeSet;
use std::path::PathBuf;

use guild_domain::distribution::{LockFile, LockedPackage, SyncStep};
use guild_domain::fleet::{
    accept_policy, authenticate_desired, verify_policy, verify_root_chain, verify_root_pinned,
    verify_root_self, AcceptError, Acceptance, DroppedRevocations, ExpiryRule, ExpiryStatus,
    FleetMembership, PolicyChange, PolicyError, RootError, SignedPolicy, SignedRoot,
    VerifiedPolicy, VerifiedRoot,
};
use guild_domain::ids::{FleetId, PublisherId, Sha256Digest};
use guild_domain::trust::TrustStore;

use crate::error::{ErrorCategory, HostError};
use crate::lock_sync::{self, StagedPackage, SyncChange, SyncError};
use crate::package_manager::{FleetChange, Joined, LifecycleHook, PortCheck};
use crate::PackageManager;

/// Why a store did not join a fleet or follow its policy. Nothing in the store was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// The store could not be read or written.
    #[error("{0}")]
    Store(#[source] Box<HostError>),
    /// The store follows no fleet, so it has no root to verify a policy with.
    #[error("this store follows no fleet; join one first with `guild fleet join ROOT`")]
    NotJoined,
    /// The store follows another fleet.
    #[error("this store follows fleet {joined}; it cannot join fleet {offered}")]
    OtherFleet {
        /// The fleet the store follows.
        joined: FleetId,
        /// The fleet of the root offered.
        offered: FleetId,
    },
    /// The store follows the fleet under another root; a joined store moves to a newer root
    /// only through the chain rules.
    #[error(
        "this store follows fleet {fleet} under root version {joined} ({joined_digest}), not \
         root version {offered} ({offered_digest}); a joined store takes newer roots only as a \
         verified chain (`guild fleet sync --root`)"
    )]
    OtherRoot {
        /// The fleet.
        fleet: FleetId,
        /// The version of the root the store trusts.
        joined: u64,
        /// Its digest.
        joined_digest: Sha256Digest,
        /// The version offered.
        offered: u64,
        /// Its digest.
        offered_digest: Sha256Digest,
    },
    /// A root was not trusted: not the pinned one, too few signatures, not the next version,
    /// another fleet's, or expired.
    #[error(transparent)]
    Root(#[from] RootError),
    /// The policy does not verify under the trusted root.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The policy verifies but is not taken: a rollback, an equivocation, or expired.
    #[error(transparent)]
    Accept(#[from] AcceptError),
    /// Fetching, checking or applying the policy's packages failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
}

impl FleetError {
    /// The class of the failure, for exit codes: a document or package that is not acceptable
    /// is [`ErrorCategory::PackageRejected`]; what conflicts with the store's record (another
    /// fleet, a rollback, an expired document) is [`ErrorCategory::Refused`].
    pub fn category(&self) -> ErrorCategory {
        match self {
            FleetError::Store(e) => e.category(),
            FleetError::NotJoined
            | FleetError::OtherFleet { .. }
            | FleetError::OtherRoot { .. }
            | FleetError::Accept(_)
            | FleetError::Root(RootError::Expired { .. } | RootError::OtherFleet { .. }) => {
                ErrorCategory::Refused
            }
            FleetError::Root(_) | FleetError::Policy(_) => ErrorCategory::PackageRejected,
            FleetError::Sync(e) => match e {
                SyncError::Store(source)
                | SyncError::Check { source, .. }
                | SyncError::Step { source, .. } => source.category(),
                SyncError::NotLocked { .. } => ErrorCategory::PackageRejected,
                SyncError::Conflict(_) | SyncError::Differs { .. } => ErrorCategory::Refused,
                SyncError::Copy { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    ErrorCategory::NotFound
                }
                _ => ErrorCategory::Store,
            },
        }
    }
}

fn store_error(e: HostError) -> FleetError {
    FleetError::Store(Box::new(e))
}

/// What [`join`] did.
#[derive(Debug, Clone)]
pub struct JoinReport {
    /// The root the store now trusts.
    pub root: VerifiedRoot,
    /// Whether the store joined now or had joined under this root already.
    pub joined: Joined,
    /// Whether the root was taken within its expiry or by override (which must be logged).
    pub expiry: ExpiryStatus,
}

/// Joins the store of `pm` to the fleet of `root`: the root must carry a threshold of its own
/// keys' signatures, have the digest `pinned` when one is given, and not be expired (unless
/// `rule` overrides it). A store that follows this root already is left as it is; one that
/// follows another root or fleet refuses it. The root is recorded in one commit.
pub fn join(
    pm: &PackageManager,
    root: &SignedRoot,
    pinned: Option<&Sha256Digest>,
    now: u64,
    rule: ExpiryRule,
) -> Result<JoinReport, FleetError> {
    let check = PortCheck(pm.verifier());
    let verified = match pinned {
        Some(digest) => verify_root_pinned(root, digest, &check)?,
        None => verify_root_self(root, &check)?,
    };
    let existing = pm.fleet().map_err(store_error)?;
    if let Some(m) = &existing {
        if m.root.digest() == root.digest() {
            return Ok(JoinReport {
                root: verified,
                joined: Joined::Already,
                expiry: ExpiryStatus::Current,
            });
        }
        if m.fleet() != &root.body().fleet {
            return Err(FleetError::OtherFleet {
                joined: m.fleet().clone(),
                offered: root.body().fleet.clone(),
            });
        }
        return Err(FleetError::OtherRoot {
            fleet: m.fleet().clone(),
            joined: m.root.version(),
            joined_digest: m.root.digest(),
            offered: root.version(),
            offered_digest: root.digest(),
        });
    }
    let update = verify_root_chain(&verified, &[], now, rule, &check)?;
    let joined = pm
        .record_fleet(None, FleetMembership::joined(&update.root))
        .map_err(store_error)?;
    Ok(JoinReport {
        root: update.root,
        joined,
        expiry: update.expiry,
    })
}

/// The fleet record of the store of `pm` and its root, whose signatures are checked again as
/// it is read back.
pub fn trusted(pm: &PackageManager) -> Result<(FleetMembership, VerifiedRoot), FleetError> {
    let membership = pm
        .fleet()
        .map_err(store_error)?
        .ok_or(FleetError::NotJoined)?;
    let root = verify_root_self(&membership.root, &PortCheck(pm.verifier()))?;
    Ok((membership, root))
}

/// A policy judged against a store's fleet record: verified under the newest trusted root and
/// accepted, with what to commit. Made by [`judge`] only.
#[derive(Debug, Clone)]
pub struct Judged {
    before: FleetMembership,
    root: VerifiedRoot,
    root_expiry: ExpiryStatus,
    policy: VerifiedPolicy,
    acceptance: Acceptance,
}

impl Judged {
    /// The policy.
    pub fn policy(&self) -> &VerifiedPolicy {
        &self.policy
    }

    /// The newest root: the recorded one, or the last of the chain given.
    pub fn root(&self) -> &VerifiedRoot {
        &self.root
    }

    /// Whether the root moved to a newer version.
    pub fn root_rotated(&self) -> bool {
        self.root.digest() != self.before.root.digest()
    }

    /// How the policy relates to the recorded one, what is recorded, and whether its expiry was
    /// overridden.
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
    }

    /// Whether the newest root was taken past its expiry by override.
    pub fn root_expiry(&self) -> ExpiryStatus {
        self.root_expiry
    }

    /// Whether neither the root nor the policy changes: the store's record stays as it is.
    pub fn record_unchanged(&self) -> bool {
        self.acceptance.change == PolicyChange::Unchanged && !self.root_rotated()
    }

    /// The desired set as a lock.
    pub fn lock(&self) -> LockFile {
        self.policy.to_lock()
    }

    fn change(&self) -> FleetChange {
        FleetChange {
            before: self.before.clone(),
            after: FleetMembership {
                root: self.root.signed().clone(),
                policy: Some(self.acceptance.record),
            },
            trust: self.policy.trust_store(),
        }
    }
}

/// Judges `policy` for the store of `pm` at `now`: `roots` newer than the recorded root are
/// taken in version order as a chain (each the next version, signed by a threshold of the
/// previous root's keys and of its own; older or equal versions are ignored), the newest root
/// must not be expired, the policy must verify under it, and [`accept_policy`] must take it
/// against the recorded policy. `rule` overrides expiry for both documents. Reads the store,
/// writes nothing.
pub fn judge(
    pm: &PackageManager,
    roots: &[SignedRoot],
    policy: &SignedPolicy,
    now: u64,
    rule: ExpiryRule,
) -> Result<Judged, FleetError> {
    let (before, trusted) = trusted(pm)?;
    let check = PortCheck(pm.verifier());
    let mut chain: Vec<&SignedRoot> = roots
        .iter()
        .filter(|r| r.version() > trusted.version())
        .collect();
    chain.sort_by_key(|r| r.version());
    chain.dedup_by(|a, b| a.version() == b.version() && a.digest() == b.digest());
    let chain: Vec<SignedRoot> = chain.into_iter().cloned().collect();
    let update = verify_root_chain(&trusted, &chain, now, rule, &check)?;
    let policy = verify_policy(&update.root, policy, &check)?;
    let acceptance = accept_policy(before.policy.as_ref(), &policy, now, rule)?;
    Ok(Judged {
        before,
        root: update.root,
        root_expiry: update.expiry,
        policy,
        acceptance,
    })
}

/// Whether the trust of the store of `pm` is the judged policy's: the same publishers' keys,
/// and every revocation of the policy. A trust file rebuilt by an operator (`guild trust
/// reset`) is not, and the next sync writes the policy's again even when the policy did not
/// change.
pub fn trust_follows(pm: &PackageManager, judged: &Judged) -> Result<bool, FleetError> {
    let trust = pm.trust().map_err(store_error)?;
    let policy = judged.policy.trust_store();
    let keys = |t: &TrustStore| -> BTreeSet<(PublisherId, Sha256Digest)> {
        t.publishers()
            .flat_map(|(p, ks)| ks.map(move |k| (p.clone(), k.key_id)))
            .collect()
    };
    Ok(keys(&trust) == keys(&policy)
        && policy.revoked_keys().all(|(k, _)| trust.is_key_revoked(k))
        && policy
            .revoked_digests()
            .all(|(d, _)| trust.is_digest_revoked(d)))
}

/// The revocations the trust of the store of `pm` holds that the judged policy does not list.
/// The store keeps them whatever the policy says ([`apply`] commits the policy's trust with
/// the store's revocations added); a policy that drops one is the signers' mistake, or an
/// attempt to trust a leaked key again, and the caller says so loudly.
pub fn dropped_revocations(
    pm: &PackageManager,
    judged: &Judged,
) -> Result<DroppedRevocations, FleetError> {
    let trust = pm.trust().map_err(store_error)?;
    Ok(DroppedRevocations::of(
        trust.revoked_keys(),
        trust.revoked_digests(),
        judged.policy.policy(),
    ))
}

/// The steps that make the store of `pm` follow the judged policy's desired set. A desired
/// version the store already holds, enabled, with the payload its entry pins, but with no
/// signature the policy accepts for it (the policy moved the publisher to a new key and
/// revoked the old one) is installed again from the entry's source: the re-signed copy's
/// signatures are recorded in the same commit, so nothing that runs it loses it.
pub fn plan(pm: &PackageManager, judged: &Judged) -> Result<Vec<SyncStep>, FleetError> {
    let lock = judged.lock();
    let mut steps = lock_sync::plan_steps(pm, &lock)?;
    let check = PortCheck(pm.verifier());
    for locked in lock.packages() {
        let planned = steps.iter().any(|s| match s {
            SyncStep::Disable(id) => *id == locked.id,
            SyncStep::Install(l) | SyncStep::Reactivate(l) => l.id == locked.id,
        });
        if planned {
            continue;
        }
        let Some(held) = pm.metadata(&locked.id, &locked.version) else {
            continue;
        };
        if held.payload_digest() == locked.payload_sha256
            && authenticate_desired(judged.policy(), &held, &check).is_err()
        {
            steps.push(SyncStep::Install(locked.clone()));
        }
    }
    Ok(steps)
}

/// Checks the fetched `file` for `locked` (an entry of the judged policy's lock) against the
/// policy: authenticated by a key its entry allows and not revoked, the payload, version, kind
/// and publisher it names, its platform, every artifact.
pub fn stage(
    pm: &PackageManager,
    judged: &Judged,
    locked: &LockedPackage,
    file: PathBuf,
) -> Result<StagedPackage, FleetError> {
    let package = format!("{} {}", locked.id, locked.version);
    let checked = pm
        .check_desired(&file, &judged.policy)
        .map_err(|source| SyncError::Check {
            package: package.clone(),
            file: file.clone(),
            source: Box::new(source),
        })?;
    Ok(lock_sync::staged(locked, file, &checked)?)
}

/// Applies the judged policy to the store of `pm` in one transaction: the desired set from the
/// `staged` packages (planned again from the committed state), the policy's trust in place of
/// the store's, and the new fleet record. `hook` takes part in each change. Refused, changing
/// nothing, if any change is refused or the store's fleet record moved since [`judge`].
pub fn apply(
    pm: &PackageManager,
    judged: &Judged,
    staged: &[StagedPackage],
    hook: &mut dyn LifecycleHook,
) -> Result<Vec<SyncChange>, FleetError> {
    let steps = plan(pm, judged)?;
    Ok(lock_sync::apply_fleet(
        pm,
        &judged.lock(),
        &steps,
        staged,
        hook,
        judged.change(),
    )?)
}
