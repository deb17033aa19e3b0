//! Whether a verified policy replaces the one a machine recorded: versions only grow, one
//! version names one document, and an expired policy is refused unless an operator overrides it.

use crate::ids::Sha256Digest;

use super::policy::VerifiedPolicy;
use super::{judge_expiry, ExpiryRule, ExpiryStatus};

/// What a machine records of the policy it follows, to judge the next one by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyRecord {
    /// The policy's version.
    pub version: u64,
    /// Its digest (SHA-256 of the canonical `signed` member).
    pub digest: Sha256Digest,
    /// Its expiry, in UNIX seconds.
    pub expires: u64,
}

impl PolicyRecord {
    /// The record of `policy`.
    pub fn of(policy: &VerifiedPolicy) -> Self {
        PolicyRecord {
            version: policy.policy().version,
            digest: policy.signed().digest(),
            expires: policy.policy().expires,
        }
    }

    /// Whether the recorded policy has expired at `now`: the machine keeps its last state and
    /// must say so until a newer policy arrives.
    pub fn is_expired(&self, now: u64) -> bool {
        super::is_expired(self.expires, now)
    }
}

/// How an accepted policy relates to the recorded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyChange {
    /// No policy was recorded: the machine takes its first.
    First,
    /// A newer version replaces the recorded one.
    Newer {
        /// The version recorded before.
        from: u64,
    },
    /// The same document as recorded: nothing changes.
    Unchanged,
}

/// A policy taken: what to record, how it relates to the last one, and whether its expiry was
/// overridden (which the caller must log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the record must be kept, and an overridden expiry logged"]
pub struct Acceptance {
    /// What to record.
    pub record: PolicyRecord,
    /// How it relates to the recorded policy.
    pub change: PolicyChange,
    /// Whether it was taken within its expiry or by override.
    pub expiry: ExpiryStatus,
}

/// Why a verified policy is not taken. Every refusal changes nothing: the machine keeps its
/// recorded policy and state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AcceptError {
    /// A policy older than the recorded one.
    #[error(
        "fleet policy version {offered} is older than version {recorded}, which this machine \
         already follows; refusing the rollback"
    )]
    Rollback {
        /// The version recorded.
        recorded: u64,
        /// The version offered.
        offered: u64,
    },
    /// Another document under the recorded version: the signers signed two policies with one
    /// version, or one was forged.
    #[error(
        "fleet policy version {version} has digest {offered}, but this machine follows version \
         {version} with digest {recorded}; one version must name one policy"
    )]
    Equivocation {
        /// The version.
        version: u64,
        /// The recorded digest.
        recorded: Sha256Digest,
        /// The offered digest.
        offered: Sha256Digest,
    },
    /// The policy has expired and expiry was not overridden.
    #[error(
        "fleet policy version {version} expired at {expires} (now {now}); keeping the last state \
         until a newer policy arrives, or an operator overrides the expiry"
    )]
    Expired {
        /// The version.
        version: u64,
        /// Its expiry (UNIX seconds).
        expires: u64,
        /// The time given (UNIX seconds).
        now: u64,
    },
}

/// Judges `offered` against the `recorded` policy at `now`, in this order: an older version is
/// a rollback; the same version with another digest is an equivocation; an expired policy
/// (`now >= expires`) is refused unless `rule` overrides it, and then the answer carries
/// [`ExpiryStatus::Overridden`]; otherwise it is taken, as the first policy, a newer one, or
/// the one already recorded ([`PolicyChange::Unchanged`], which is also judged for expiry, so
/// that a machine whose policy expired keeps refusing to act on it).
pub fn accept_policy(
    recorded: Option<&PolicyRecord>,
    offered: &VerifiedPolicy,
    now: u64,
    rule: ExpiryRule,
) -> Result<Acceptance, AcceptError> {
    let record = PolicyRecord::of(offered);
    let change = match recorded {
        None => PolicyChange::First,
        Some(r) if record.version < r.version => {
            return Err(AcceptError::Rollback {
                recorded: r.version,
                offered: record.version,
            })
        }
        Some(r) if record.version == r.version && record.digest != r.digest => {
            return Err(AcceptError::Equivocation {
                version: r.version,
                recorded: r.digest,
                offered: record.digest,
            })
        }
        Some(r) if record.version == r.version => PolicyChange::Unchanged,
        Some(r) => PolicyChange::Newer { from: r.version },
    };
    let expiry = judge_expiry(record.expires, now, rule).ok_or(AcceptError::Expired {
        version: record.version,
        expires: record.expires,
        now,
    })?;
    Ok(Acceptance {
        record,
        change,
        expiry,
    })
}
