//! A fleet: one signed, versioned policy that every machine of the fleet follows, under a root
//! of trust that rotates without a flag day.
//!
//! Two documents share one signed envelope (`{"signed": {...}, "signatures": [...]}`, see
//! [`Signed`]): the **root** ([`FleetRoot`]) names the keys that may sign for the fleet and how
//! many of them must (k of n), and the **policy** ([`FleetPolicy`]) holds everything a machine
//! must agree on: trusted publishers and their keys (optionally scoped to package-id prefixes),
//! revocations, and the desired set of packages with where to fetch each. Signatures cover the
//! canonical bytes of the `signed` member exactly as received, so holders add theirs one at a
//! time ([`Signed::with_signature`]) and no machine ever needs k keys; a document's digest is
//! the SHA-256 of those bytes and does not move when a signature is added.
//!
//! The rules follow TUF: a store joins a fleet by pinning a root ([`verify_root_pinned`]); a new
//! root is accepted only as the next version, signed by k of the previous root's keys and k of
//! its own ([`verify_root_successor`], [`verify_root_chain`], where only the newest root's
//! expiry counts); a policy must carry k valid signatures by the root's keys and be consistent
//! with itself ([`verify_policy`]); and [`accept_policy`] refuses a rollback, two documents
//! under one version, and an expired policy unless an operator overrides it, which the answer
//! then says so that the caller logs it. [`check_succession`] holds a policy to the one before
//! it (same fleet, higher version, none of its revocations dropped) where a signer or a store
//! can compare them. On a fleet-managed store the policy is the trust:
//! [`VerifiedPolicy::trust_store`] feeds the unchanged [`crate::trust::authenticate`], and
//! [`authorize`] checks an authenticated package against its entry. [`VerifiedPolicy::to_lock`]
//! makes the desired set a lock, so that [`crate::distribution::plan_sync`] plans the steps.
//! A policy's desired set may be authored from [`Requirements`], each resolved against a
//! repository's tags by [`resolve_tag`].
//!
//! Everything here is pure: the current time is a parameter, signatures are checked through
//! [`crate::trust::SignatureCheck`], and fetching belongs to the OCI adapter.

use std::fmt;

mod accept;
mod authorize;
mod codec;
mod envelope;
mod membership;
mod plan;
mod policy;
mod requirements;
mod root;
mod succession;

pub use accept::{accept_policy, AcceptError, Acceptance, PolicyChange, PolicyRecord};
pub use authorize::{authenticate_desired, authorize, AuthorizeError};
pub use codec::FleetDocumentError;
pub use envelope::{AddSignatureError, FleetDocument, SignatureFault, Signed, ThresholdError};
pub use membership::FleetMembership;
pub use plan::Shrink;
pub use policy::{
    verify_policy, DesiredPackage, FleetPolicy, FleetPublisher, PolicyError, PolicyProblem,
    SignedPolicy, VerifiedPolicy, POLICY_MARKER,
};
pub use requirements::{
    resolve_tag, tag_version, NoMatchingTag, Requirement, Requirements, RequirementsError,
    ResolvedTag, MAX_VERSIONS_SHOWN,
};
pub use root::{
    verify_root_chain, verify_root_pinned, verify_root_self, verify_root_successor, FleetRoot,
    RootError, RootUpdate, SignedRoot, VerifiedRoot, ROOT_MARKER,
};
pub use succession::{check_succession, DroppedRevocations, SuccessionError};

/// Largest fleet document (root or policy, envelope included) accepted, in bytes.
pub const MAX_DOCUMENT_BYTES: usize = 4 << 20;
/// Most signatures an envelope may carry: each costs a verification, so a hostile document
/// must not be able to carry thousands.
pub const MAX_SIGNATURES: usize = 64;
/// Most keys a root may list.
pub const MAX_ROOT_KEYS: usize = 64;
/// Largest signature accepted, in bytes (a DER ECDSA P-256 signature is at most 72).
pub const MAX_SIGNATURE_BYTES: usize = 512;
/// Largest public key accepted, in bytes (a P-256 SubjectPublicKeyInfo is 91).
pub const MAX_SPKI_BYTES: usize = 1024;
/// Most publishers a policy may trust.
pub const MAX_PUBLISHERS: usize = 1024;
/// Most keys one publisher may have in a policy.
pub const MAX_PUBLISHER_KEYS: usize = 32;
/// Most scopes one publisher may have in a policy.
pub const MAX_SCOPES: usize = 64;
/// Most packages a policy's desired set may hold.
pub const MAX_PACKAGES: usize = 4096;
/// Most key ids one desired package may name.
pub const MAX_PACKAGE_KEYS: usize = 32;
/// Most revoked keys, and separately most revoked payload digests, a policy may list.
pub const MAX_REVOCATIONS: usize = 65536;
/// Longest revocation reason, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;

/// The media type of a fleet root as an OCI artifact: its one layer's, and the manifest's
/// `artifactType`.
pub const ROOT_MEDIA_TYPE: &str = "application/vnd.guild.fleet.root.v1+json";
/// The media type of a fleet policy as an OCI artifact: its one layer's, and the manifest's
/// `artifactType`.
pub const POLICY_MEDIA_TYPE: &str = "application/vnd.guild.fleet.policy.v1+json";

/// Which fleet document something is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DocumentKind {
    /// A fleet root.
    Root,
    /// A fleet policy.
    Policy,
}

impl DocumentKind {
    /// The media type the document travels under as an OCI artifact.
    pub fn media_type(self) -> &'static str {
        match self {
            DocumentKind::Root => ROOT_MEDIA_TYPE,
            DocumentKind::Policy => POLICY_MEDIA_TYPE,
        }
    }
}

impl fmt::Display for DocumentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DocumentKind::Root => "fleet root",
            DocumentKind::Policy => "fleet policy",
        })
    }
}

/// Whether an expired document is refused ([`ExpiryRule::Enforce`], the rule) or taken anyway
/// because an operator said so ([`ExpiryRule::Override`], for air gaps). An override is never
/// silent: the answer carries [`ExpiryStatus::Overridden`], which the caller must log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryRule {
    /// An expired document is refused.
    Enforce,
    /// An expired document is taken; the answer says it was expired.
    Override,
}

/// Whether a document was taken within its expiry or past it by an operator's override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an overridden expiry must be logged"]
pub enum ExpiryStatus {
    /// `now` is before the document's expiry.
    Current,
    /// The document had expired and was taken only because of [`ExpiryRule::Override`].
    Overridden {
        /// The document's expiry (UNIX seconds).
        expires: u64,
        /// The time it was taken at (UNIX seconds).
        now: u64,
    },
}

impl ExpiryStatus {
    /// Whether the expiry was overridden.
    pub fn is_overridden(self) -> bool {
        matches!(self, ExpiryStatus::Overridden { .. })
    }
}

/// Whether a document that expires at `expires` has expired at `now`: from the second it names
/// on, it has.
pub fn is_expired(expires: u64, now: u64) -> bool {
    now >= expires
}

/// Applies `rule` to a document that expires at `expires`, at `now`: `None` when it is expired
/// and the rule enforces expiry.
fn judge_expiry(expires: u64, now: u64, rule: ExpiryRule) -> Option<ExpiryStatus> {
    match (is_expired(expires, now), rule) {
        (false, _) => Some(ExpiryStatus::Current),
        (true, ExpiryRule::Override) => Some(ExpiryStatus::Overridden { expires, now }),
        (true, ExpiryRule::Enforce) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_expires_at_the_second_it_names() {
        assert!(!is_expired(10, 9));
        assert!(is_expired(10, 10));
        assert_eq!(
            judge_expiry(10, 9, ExpiryRule::Enforce),
            Some(ExpiryStatus::Current)
        );
        assert_eq!(judge_expiry(10, 10, ExpiryRule::Enforce), None);
        assert_eq!(
            judge_expiry(10, 11, ExpiryRule::Override),
            Some(ExpiryStatus::Overridden {
                expires: 10,
                now: 11
            })
        );
    }
}
