//! The fleet root: the keys that may sign for a fleet, how many must, and how the root itself
//! rotates.
//!
//! A store joins a fleet by pinning one root (its digest, handed over out of band). From then on
//! a root is replaced only by the next version, signed by a threshold of the keys of the root it
//! replaces and a threshold of its own: the old holders vouch for the new keys, and the new
//! holders show they hold them. A machine that was offline fetches every version in between
//! and walks them in order; only the newest root's expiry counts, since an old root expiring
//! while a machine was away says nothing about the new one (TUF's rule).

use crate::ids::{FleetId, Sha256Digest};
use crate::json::Value;
use crate::trust::{SignatureCheck, TrustedKey};

use super::codec::{check_marker, keys_value, read_keys, FleetDocumentError, Obj};
use super::envelope::{check_threshold, FleetDocument, Signed, ThresholdError};
use super::{judge_expiry, DocumentKind, ExpiryRule, ExpiryStatus, MAX_ROOT_KEYS};

/// The member that marks a root and gives its format: `"guild_fleet_root": 1`.
pub const ROOT_MARKER: &str = "guild_fleet_root";

const ROOT_FIELDS: &[&str] = &[
    ROOT_MARKER,
    "fleet",
    "version",
    "expires",
    "threshold",
    "keys",
];

/// The `signed` part of a fleet root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetRoot {
    /// The fleet it is the root of; never changes across rotations.
    pub fleet: FleetId,
    /// 1 for the first root, one more for each rotation.
    pub version: u64,
    /// When it expires, in UNIX seconds: from that second on it is expired.
    pub expires: u64,
    /// How many distinct keys of `keys` must sign a root or policy: 1 to `keys.len()`.
    pub threshold: usize,
    /// The keys that may sign, each with its id (SHA-256 of the DER SubjectPublicKeyInfo).
    pub keys: Vec<TrustedKey>,
}

/// A fleet root in its envelope.
pub type SignedRoot = Signed<FleetRoot>;

impl FleetDocument for FleetRoot {
    const KIND: DocumentKind = DocumentKind::Root;

    fn read(signed: &Value) -> Result<Self, FleetDocumentError> {
        let o = Obj::of(Self::KIND, signed, "signed", ROOT_FIELDS)?;
        check_marker(&o, ROOT_MARKER)?;
        let fleet = o.parsed("fleet", |s| FleetId::new(s))?;
        let version = o.u64("version")?;
        if version == 0 {
            return Err(o.err("version", "versions start at 1"));
        }
        let expires = o.u64("expires")?;
        let keys = read_keys(Self::KIND, o.req("keys")?, &o.at("keys"), MAX_ROOT_KEYS)?;
        let threshold = o.u64("threshold")?;
        if threshold == 0 || threshold > keys.len() as u64 {
            return Err(o.err(
                "threshold",
                format!(
                    "{threshold} of {} keys: a threshold is at least 1 and at most the number \
                     of keys",
                    keys.len()
                ),
            ));
        }
        Ok(FleetRoot {
            fleet,
            version,
            expires,
            threshold: threshold as usize,
            keys,
        })
    }

    fn to_value(&self) -> Value {
        Value::Object(vec![
            (ROOT_MARKER.into(), 1u64.into()),
            ("fleet".into(), self.fleet.as_str().into()),
            ("version".into(), self.version.into()),
            ("expires".into(), self.expires.into()),
            ("threshold".into(), (self.threshold as u64).into()),
            ("keys".into(), keys_value(&self.keys)),
        ])
    }

    fn version(&self) -> u64 {
        self.version
    }
}

/// A root this machine trusts: pinned, or reached from a pinned root by verified rotations.
/// Only the `verify_root_*` functions make one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedRoot(SignedRoot);

impl VerifiedRoot {
    /// The root.
    pub fn root(&self) -> &FleetRoot {
        self.0.body()
    }

    /// The root with its envelope, as the store keeps it.
    pub fn signed(&self) -> &SignedRoot {
        &self.0
    }

    /// The root's version.
    pub fn version(&self) -> u64 {
        self.0.version()
    }

    /// The root's digest.
    pub fn digest(&self) -> Sha256Digest {
        self.0.digest()
    }

    pub(crate) fn threshold_of<T: FleetDocument>(
        &self,
        doc: &Signed<T>,
        check: &dyn SignatureCheck,
    ) -> Result<(), ThresholdError> {
        let root = self.root();
        check_threshold(doc, &root.keys, root.threshold, root.version, check).map(|_| ())
    }
}

/// Why a root is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootError {
    /// The root is not the one the operator pinned.
    #[error("fleet root version {version} has digest {found}, not the pinned {pinned}")]
    NotPinned {
        /// Its version.
        version: u64,
        /// The digest pinned.
        pinned: Sha256Digest,
        /// The root's digest.
        found: Sha256Digest,
    },
    /// Too few of a root's keys signed (its own, or the previous root's on a rotation).
    #[error(transparent)]
    Threshold(Box<ThresholdError>),
    /// A rotation that does not go to the next version.
    #[error(
        "fleet {fleet}: root version {offered} cannot follow version {trusted}; roots rotate one \
         version at a time (fetch every version in between)"
    )]
    NotNextVersion {
        /// The fleet.
        fleet: FleetId,
        /// The version trusted (or reached so far along a chain).
        trusted: u64,
        /// The version offered.
        offered: u64,
    },
    /// A rotation to another fleet's root.
    #[error("root version {version} is a root of fleet {offered}, not of fleet {trusted}")]
    OtherFleet {
        /// The version offered.
        version: u64,
        /// The fleet trusted.
        trusted: FleetId,
        /// The fleet the offered root names.
        offered: FleetId,
    },
    /// The newest root has expired and expiry was not overridden.
    #[error(
        "fleet {fleet}: root version {version} expired at {expires} (now {now}); keeping the last \
         state until a newer root arrives, or an operator overrides the expiry"
    )]
    Expired {
        /// The fleet.
        fleet: FleetId,
        /// The newest root's version.
        version: u64,
        /// Its expiry (UNIX seconds).
        expires: u64,
        /// The time given (UNIX seconds).
        now: u64,
    },
}

impl From<ThresholdError> for RootError {
    fn from(e: ThresholdError) -> Self {
        RootError::Threshold(Box::new(e))
    }
}

/// Checks that a threshold of `root`'s own keys signed it. Says nothing about whether the root
/// is the right one: [`verify_root_pinned`] is how a store joins a fleet, and this re-checks a
/// root the store already trusts when it reads it back.
pub fn verify_root_self(
    root: &SignedRoot,
    check: &dyn SignatureCheck,
) -> Result<VerifiedRoot, RootError> {
    let r = root.body();
    check_threshold(root, &r.keys, r.threshold, r.version, check)?;
    Ok(VerifiedRoot(root.clone()))
}

/// Joins a fleet: `root` must have the digest the operator pinned (handed over out of band)
/// and a threshold of its own keys' signatures. Any version may be pinned.
pub fn verify_root_pinned(
    root: &SignedRoot,
    pinned: &Sha256Digest,
    check: &dyn SignatureCheck,
) -> Result<VerifiedRoot, RootError> {
    if &root.digest() != pinned {
        return Err(RootError::NotPinned {
            version: root.version(),
            pinned: *pinned,
            found: root.digest(),
        });
    }
    verify_root_self(root, check)
}

/// One rotation: `next` must be the next version of the same fleet, signed by a threshold of
/// `trusted`'s keys (by `trusted`'s threshold) and a threshold of its own keys (by its own).
/// Expiry is not looked at; [`verify_root_chain`] checks the newest root's.
pub fn verify_root_successor(
    trusted: &VerifiedRoot,
    next: &SignedRoot,
    check: &dyn SignatureCheck,
) -> Result<VerifiedRoot, RootError> {
    let (old, new) = (trusted.root(), next.body());
    if new.fleet != old.fleet {
        return Err(RootError::OtherFleet {
            version: new.version,
            trusted: old.fleet.clone(),
            offered: new.fleet.clone(),
        });
    }
    if old.version.checked_add(1) != Some(new.version) {
        return Err(RootError::NotNextVersion {
            fleet: old.fleet.clone(),
            trusted: old.version,
            offered: new.version,
        });
    }
    check_threshold(next, &old.keys, old.threshold, old.version, check)?;
    verify_root_self(next, check)
}

/// What walking a root chain came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "the newest root must be recorded, and an overridden expiry logged"]
pub struct RootUpdate {
    /// The newest root: the last of the chain, or the trusted root when the chain is empty.
    pub root: VerifiedRoot,
    /// Whether it was taken within its expiry or by override.
    pub expiry: ExpiryStatus,
}

/// Walks `chain`, the roots after `trusted` in version order, each a verified successor of the
/// one before, and answers the newest, whose expiry must be later than `now` unless `rule`
/// overrides it. Intermediate roots' expiry is not checked. All or nothing: one bad step
/// refuses the whole walk, and the caller keeps `trusted`.
pub fn verify_root_chain(
    trusted: &VerifiedRoot,
    chain: &[SignedRoot],
    now: u64,
    rule: ExpiryRule,
    check: &dyn SignatureCheck,
) -> Result<RootUpdate, RootError> {
    let mut current = trusted.clone();
    for next in chain {
        current = verify_root_successor(&current, next, check)?;
    }
    let r = current.root();
    let expiry = judge_expiry(r.expires, now, rule).ok_or_else(|| RootError::Expired {
        fleet: r.fleet.clone(),
        version: r.version,
        expires: r.expires,
        now,
    })?;
    Ok(RootUpdate {
        root: current,
        expiry,
    })
}
