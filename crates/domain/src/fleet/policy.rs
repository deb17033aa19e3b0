//! The fleet policy: the one signed document every machine of a fleet follows.
//!
//! It holds the trusted publishers and their keys (each optionally scoped to package-id
//! prefixes), the revoked keys and payload digests, and the desired set: each package's id,
//! version, kind, payload digest, publisher, the keys that may sign it and where to fetch it.
//! A threshold of the root's keys signs it. Reading refuses what is malformed; verifying also
//! refuses a policy that contradicts itself (a desired package whose payload is revoked, that no
//! usable key may sign, or whose publisher is missing or out of scope), naming the entry.

use std::collections::BTreeMap;

use crate::distribution::{LockedSource, OciReference};
use crate::ids::{FleetId, PackageId, PackageKind, PublisherId, Sha256Digest};
use crate::json::Value;
use crate::trust::{SignatureCheck, TrustStore, TrustedKey};
use crate::version::Version;

use super::codec::{check_marker, clip, field, keys_value, read_keys, FleetDocumentError, Obj};
use super::envelope::{FleetDocument, Signed, ThresholdError};
use super::root::VerifiedRoot;
use super::{
    DocumentKind, MAX_PACKAGES, MAX_PACKAGE_KEYS, MAX_PUBLISHERS, MAX_PUBLISHER_KEYS,
    MAX_REASON_BYTES, MAX_REVOCATIONS, MAX_SCOPES,
};

/// The member that marks a policy and gives its format: `"guild_fleet_policy": 1`.
pub const POLICY_MARKER: &str = "guild_fleet_policy";

const POLICY_FIELDS: &[&str] = &[
    POLICY_MARKER,
    "fleet",
    "version",
    "expires",
    "root_version",
    "publishers",
    "revoked_keys",
    "revoked_digests",
    "packages",
];
const PUBLISHER_FIELDS: &[&str] = &["keys", "scopes"];
const PACKAGE_FIELDS: &[&str] = &[
    "id",
    "version",
    "kind",
    "payload_sha256",
    "publisher",
    "key_ids",
    "source",
];
const SOURCE_FIELDS: &[&str] = &["reference", "manifest_digest"];

/// A publisher the policy trusts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FleetPublisher {
    /// Its keys. A key belongs to one publisher in a policy.
    pub keys: Vec<TrustedKey>,
    /// The package ids it may publish, as prefixes on dot boundaries: `org.example` covers
    /// `org.example` and `org.example.scan`, not `org.examples`. Empty: every id.
    pub scopes: Vec<PackageId>,
}

impl FleetPublisher {
    /// Whether the publisher's scopes cover `id`.
    pub fn covers(&self, id: &PackageId) -> bool {
        self.scopes.is_empty() || self.scopes.iter().any(|s| scope_covers(s, id))
    }
}

fn scope_covers(scope: &PackageId, id: &PackageId) -> bool {
    let (s, id) = (scope.as_str(), id.as_str());
    id.strip_prefix(s)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// One package of the desired set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPackage {
    /// The package.
    pub id: PackageId,
    /// The version every machine enables.
    pub version: Version,
    /// Kernel or module.
    pub kind: PackageKind,
    /// SHA-256 of its canonical payload: the one identity that counts.
    pub payload_sha256: Sha256Digest,
    /// The publisher its manifest names.
    pub publisher: PublisherId,
    /// The keys of that publisher that may sign it, at least one; during a key rotation both
    /// the old and the new key.
    pub key_ids: Vec<Sha256Digest>,
    /// Where to fetch it: an `oci://` reference and the manifest digest it is pulled by.
    pub source: LockedSource,
}

/// The `signed` part of a fleet policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetPolicy {
    /// The fleet; must be the root's.
    pub fleet: FleetId,
    /// Grows with every policy: a machine never goes back to a lower one.
    pub version: u64,
    /// When it expires, in UNIX seconds: from that second on it is expired.
    pub expires: u64,
    /// The root version it was signed under: a machine that trusts an older root fetches the
    /// newer roots first.
    pub root_version: u64,
    /// The trusted publishers.
    pub publishers: BTreeMap<PublisherId, FleetPublisher>,
    /// Revoked keys, with the reason. A revocation wins over any listing.
    pub revoked_keys: BTreeMap<Sha256Digest, String>,
    /// Revoked payload digests, with the reason.
    pub revoked_digests: BTreeMap<Sha256Digest, String>,
    /// The desired set: exactly the packages every machine enables. May be empty.
    pub packages: Vec<DesiredPackage>,
}

/// A fleet policy in its envelope.
pub type SignedPolicy = Signed<FleetPolicy>;

impl FleetDocument for FleetPolicy {
    const KIND: DocumentKind = DocumentKind::Policy;

    fn read(signed: &Value) -> Result<Self, FleetDocumentError> {
        let doc = Self::KIND;
        let o = Obj::of(doc, signed, "signed", POLICY_FIELDS)?;
        check_marker(&o, POLICY_MARKER)?;
        let fleet = o.parsed("fleet", |s| FleetId::new(s))?;
        let version = o.u64("version")?;
        if version == 0 {
            return Err(o.err("version", "versions start at 1"));
        }
        let expires = o.u64("expires")?;
        let root_version = o.u64("root_version")?;
        if root_version == 0 {
            return Err(o.err("root_version", "root versions start at 1"));
        }
        let mut publishers = BTreeMap::new();
        let mut owner: BTreeMap<Sha256Digest, PublisherId> = BTreeMap::new();
        for (name, entry) in o.map("publishers", MAX_PUBLISHERS)? {
            let at = format!("{}.{}", o.at("publishers"), clip(name));
            let id = PublisherId::new(name.as_str()).map_err(|e| field(doc, &at, e.to_string()))?;
            let p = Obj::of(doc, entry, &at, PUBLISHER_FIELDS)?;
            let keys = read_keys(doc, p.req("keys")?, &p.at("keys"), MAX_PUBLISHER_KEYS)?;
            for k in &keys {
                if let Some(first) = owner.insert(k.key_id, id.clone()) {
                    return Err(p.err(
                        "keys",
                        format!(
                            "key {} is also a key of publisher {first}; a key belongs to one \
                             publisher",
                            k.key_id
                        ),
                    ));
                }
            }
            let mut scopes: Vec<PackageId> = Vec::new();
            if p.opt("scopes").is_some() {
                for (i, s) in p.array("scopes", MAX_SCOPES)?.iter().enumerate() {
                    let at = format!("{}[{i}]", p.at("scopes"));
                    let s = s
                        .as_str()
                        .ok_or_else(|| field(doc, &at, "expected a package-id prefix"))?;
                    let s = PackageId::new(s).map_err(|e| field(doc, &at, e.to_string()))?;
                    if scopes.contains(&s) {
                        return Err(field(doc, &at, format!("scope {s} is listed twice")));
                    }
                    scopes.push(s);
                }
            }
            publishers.insert(id, FleetPublisher { keys, scopes });
        }
        let revoked_keys = read_revocations(&o, "revoked_keys")?;
        let revoked_digests = read_revocations(&o, "revoked_digests")?;
        let mut packages: Vec<DesiredPackage> = Vec::new();
        for (i, entry) in o.array("packages", MAX_PACKAGES)?.iter().enumerate() {
            let at = format!("{}[{i}]", o.at("packages"));
            let package = read_package(doc, entry, &at)?;
            if packages.iter().any(|p| p.id == package.id) {
                return Err(field(
                    doc,
                    format!("{at}.id"),
                    format!(
                        "{} is desired twice; a machine enables one version",
                        package.id
                    ),
                ));
            }
            packages.push(package);
        }
        Ok(FleetPolicy {
            fleet,
            version,
            expires,
            root_version,
            publishers,
            revoked_keys,
            revoked_digests,
            packages,
        })
    }

    fn to_value(&self) -> Value {
        let publishers = self
            .publishers
            .iter()
            .map(|(id, p)| {
                let mut members = vec![("keys".into(), keys_value(&p.keys))];
                if !p.scopes.is_empty() {
                    members.push((
                        "scopes".into(),
                        Value::Array(p.scopes.iter().map(|s| s.as_str().into()).collect()),
                    ));
                }
                (id.to_string(), Value::Object(members))
            })
            .collect();
        let revoked = |m: &BTreeMap<Sha256Digest, String>| {
            Value::Object(
                m.iter()
                    .map(|(d, r)| (d.to_hex(), r.clone().into()))
                    .collect(),
            )
        };
        let packages = self
            .packages
            .iter()
            .map(|p| {
                Value::Object(vec![
                    ("id".into(), p.id.as_str().into()),
                    ("version".into(), p.version.to_string().into()),
                    ("kind".into(), p.kind.as_str().into()),
                    ("payload_sha256".into(), p.payload_sha256.to_hex().into()),
                    ("publisher".into(), p.publisher.as_str().into()),
                    (
                        "key_ids".into(),
                        Value::Array(p.key_ids.iter().map(|k| k.to_hex().into()).collect()),
                    ),
                    (
                        "source".into(),
                        Value::Object(vec![
                            ("reference".into(), p.source.reference.to_string().into()),
                            (
                                "manifest_digest".into(),
                                format!("sha256:{}", p.source.manifest_digest.to_hex()).into(),
                            ),
                        ]),
                    ),
                ])
            })
            .collect();
        Value::Object(vec![
            (POLICY_MARKER.into(), 1u64.into()),
            ("fleet".into(), self.fleet.as_str().into()),
            ("version".into(), self.version.into()),
            ("expires".into(), self.expires.into()),
            ("root_version".into(), self.root_version.into()),
            ("publishers".into(), Value::Object(publishers)),
            ("revoked_keys".into(), revoked(&self.revoked_keys)),
            ("revoked_digests".into(), revoked(&self.revoked_digests)),
            ("packages".into(), Value::Array(packages)),
        ])
    }

    fn version(&self) -> u64 {
        self.version
    }
}

fn read_revocations(
    o: &Obj<'_>,
    key: &str,
) -> Result<BTreeMap<Sha256Digest, String>, FleetDocumentError> {
    let mut out = BTreeMap::new();
    for (hex, reason) in o.map(key, MAX_REVOCATIONS)? {
        let at = format!("{}.{}", o.at(key), clip(hex));
        let digest = Sha256Digest::parse_hex(hex).map_err(|e| field(o.doc, &at, e.to_string()))?;
        let reason = reason
            .as_str()
            .ok_or_else(|| field(o.doc, &at, "expected the reason, a string"))?;
        if reason.len() > MAX_REASON_BYTES {
            return Err(field(
                o.doc,
                &at,
                format!("the reason is longer than {MAX_REASON_BYTES} bytes"),
            ));
        }
        out.insert(digest, reason.to_owned());
    }
    Ok(out)
}

fn read_package(
    doc: DocumentKind,
    entry: &Value,
    at: &str,
) -> Result<DesiredPackage, FleetDocumentError> {
    let p = Obj::of(doc, entry, at, PACKAGE_FIELDS)?;
    let id = p.parsed("id", |s| PackageId::new(s))?;
    let version = p.parsed("version", Version::parse)?;
    let kind = p.parsed("kind", |s| {
        PackageKind::parse(s)
            .ok_or_else(|| format!("{:?} is neither gkernel nor gkmodule", clip(s)))
    })?;
    let payload_sha256 = p.digest("payload_sha256")?;
    let publisher = p.parsed("publisher", |s| PublisherId::new(s))?;
    let list = p.array("key_ids", MAX_PACKAGE_KEYS)?;
    if list.is_empty() {
        return Err(p.err(
            "key_ids",
            "names no key; at least one key must be allowed to sign",
        ));
    }
    let mut key_ids = Vec::with_capacity(list.len());
    for (i, k) in list.iter().enumerate() {
        let at = format!("{}[{i}]", p.at("key_ids"));
        let k = k
            .as_str()
            .ok_or_else(|| field(doc, &at, "expected a key id"))
            .and_then(|s| Sha256Digest::parse_hex(s).map_err(|e| field(doc, &at, e.to_string())))?;
        if key_ids.contains(&k) {
            return Err(field(doc, &at, format!("key {k} is listed twice")));
        }
        key_ids.push(k);
    }
    let s = Obj::of(doc, p.req("source")?, &p.at("source"), SOURCE_FIELDS)?;
    let source = LockedSource {
        reference: s.parsed("reference", OciReference::parse)?,
        manifest_digest: s.parsed("manifest_digest", |t| {
            t.strip_prefix("sha256:")
                .ok_or_else(|| format!("{:?} is not sha256:<64 hex digits>", clip(t)))
                .and_then(|h| Sha256Digest::parse_hex(h).map_err(|e| e.to_string()))
        })?,
    };
    Ok(DesiredPackage {
        id,
        version,
        kind,
        payload_sha256,
        publisher,
        key_ids,
        source,
    })
}

/// A way in which a policy contradicts itself, naming the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyProblem {
    /// A desired package's payload digest is revoked by the same policy.
    #[error("{package} {version}: its payload {digest} is desired and revoked ({reason})")]
    DesiredAndRevoked {
        /// The package.
        package: PackageId,
        /// Its version.
        version: Version,
        /// The payload digest.
        digest: Sha256Digest,
        /// The revocation's reason.
        reason: String,
    },
    /// A desired package's publisher is not a trusted publisher of the policy.
    #[error("{package} {version}: its publisher {publisher} is not one the policy trusts")]
    PublisherNotListed {
        /// The package.
        package: PackageId,
        /// Its version.
        version: Version,
        /// The publisher.
        publisher: PublisherId,
    },
    /// A desired package's id is outside its publisher's scopes.
    #[error(
        "{package} {version}: publisher {publisher} may publish only under {}",
        scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
    )]
    OutOfScope {
        /// The package.
        package: PackageId,
        /// Its version.
        version: Version,
        /// The publisher.
        publisher: PublisherId,
        /// The publisher's scopes.
        scopes: Vec<PackageId>,
    },
    /// A desired package names a key that is neither its publisher's nor revoked (a revoked key
    /// may stay named while a rotation finishes).
    #[error("{package} {version}: key {key_id} is not a key of its publisher {publisher}")]
    KeyNotOfPublisher {
        /// The package.
        package: PackageId,
        /// Its version.
        version: Version,
        /// The publisher.
        publisher: PublisherId,
        /// The key.
        key_id: Sha256Digest,
    },
    /// Every key a desired package names is revoked: nothing could authenticate it.
    #[error("{package} {version}: every key that may sign it is revoked")]
    NoUsableKey {
        /// The package.
        package: PackageId,
        /// Its version.
        version: Version,
    },
}

impl FleetPolicy {
    /// The first way the policy contradicts itself, if any: checked for every desired package,
    /// in order, so that the answer is the same on every machine.
    pub fn problem(&self) -> Option<PolicyProblem> {
        self.packages.iter().find_map(|p| self.problem_of(p))
    }

    fn problem_of(&self, p: &DesiredPackage) -> Option<PolicyProblem> {
        let (package, version) = (p.id.clone(), p.version.clone());
        if let Some(reason) = self.revoked_digests.get(&p.payload_sha256) {
            return Some(PolicyProblem::DesiredAndRevoked {
                package,
                version,
                digest: p.payload_sha256,
                reason: reason.clone(),
            });
        }
        let Some(publisher) = self.publishers.get(&p.publisher) else {
            return Some(PolicyProblem::PublisherNotListed {
                package,
                version,
                publisher: p.publisher.clone(),
            });
        };
        if !publisher.covers(&p.id) {
            return Some(PolicyProblem::OutOfScope {
                package,
                version,
                publisher: p.publisher.clone(),
                scopes: publisher.scopes.clone(),
            });
        }
        let listed = |k: &Sha256Digest| publisher.keys.iter().any(|t| &t.key_id == k);
        if let Some(k) = p
            .key_ids
            .iter()
            .find(|k| !listed(k) && !self.revoked_keys.contains_key(k))
        {
            return Some(PolicyProblem::KeyNotOfPublisher {
                package,
                version,
                publisher: p.publisher.clone(),
                key_id: *k,
            });
        }
        if !p
            .key_ids
            .iter()
            .any(|k| listed(k) && !self.revoked_keys.contains_key(k))
        {
            return Some(PolicyProblem::NoUsableKey { package, version });
        }
        None
    }

    /// The desired entry for `id`.
    pub fn desired(&self, id: &PackageId) -> Option<&DesiredPackage> {
        self.packages.iter().find(|p| &p.id == id)
    }
}

/// Why a policy is not taken as the fleet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The policy is another fleet's.
    #[error("fleet policy version {version} is a policy of fleet {policy_fleet}, not of fleet {root_fleet}")]
    OtherFleet {
        /// The policy's version.
        version: u64,
        /// The fleet the trusted root names.
        root_fleet: FleetId,
        /// The fleet the policy names.
        policy_fleet: FleetId,
    },
    /// The policy was signed under a root newer than the one trusted: fetch the roots up to it
    /// first.
    #[error(
        "fleet policy version {version} was signed under root version {signed_under}, but this \
         machine trusts root version {trusted}; fetch the newer roots first"
    )]
    NeedsNewerRoot {
        /// The policy's version.
        version: u64,
        /// The root version the policy names.
        signed_under: u64,
        /// The root version trusted.
        trusted: u64,
    },
    /// Too few of the root's keys signed it.
    #[error(transparent)]
    Threshold(Box<ThresholdError>),
    /// The policy contradicts itself.
    #[error("fleet policy version {version} contradicts itself: {problem}")]
    Inconsistent {
        /// The policy's version.
        version: u64,
        /// The first contradiction found.
        problem: Box<PolicyProblem>,
    },
}

/// A policy signed by a threshold of a trusted root's keys and consistent with itself. Only
/// [`verify_policy`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedPolicy {
    signed: SignedPolicy,
    root_version: u64,
}

impl VerifiedPolicy {
    /// The policy.
    pub fn policy(&self) -> &FleetPolicy {
        self.signed.body()
    }

    /// The policy with its envelope, as the store keeps it.
    pub fn signed(&self) -> &SignedPolicy {
        &self.signed
    }

    /// The version of the root whose keys verified it.
    pub fn verified_under(&self) -> u64 {
        self.root_version
    }

    /// The trust a fleet-managed store has: every publisher's keys and every revocation of the
    /// policy, for [`crate::trust::authenticate`]. A key the policy both lists and revokes is
    /// revoked.
    pub fn trust_store(&self) -> TrustStore {
        self.trust_with(|_, _| true)
    }

    /// The trust for one desired package: only the keys its entry allows (of its publisher),
    /// and every revocation, so that whichever signature [`crate::trust::authenticate`] finds
    /// valid is by an allowed key. `None` when the policy does not desire `id`.
    pub fn trust_store_for(&self, id: &PackageId) -> Option<TrustStore> {
        let entry = self.policy().desired(id)?;
        Some(self.trust_with(|publisher, key| {
            publisher == &entry.publisher && entry.key_ids.contains(key)
        }))
    }

    fn trust_with(&self, keep: impl Fn(&PublisherId, &Sha256Digest) -> bool) -> TrustStore {
        self.policy().trust_with(keep)
    }
}

impl FleetPolicy {
    /// The trust this policy gives, verified or not: every publisher's keys and every
    /// revocation (see [`VerifiedPolicy::trust_store`]). An author checks packages against it
    /// before the policy is signed.
    pub fn trust_store(&self) -> TrustStore {
        self.trust_with(|_, _| true)
    }

    fn trust_with(&self, keep: impl Fn(&PublisherId, &Sha256Digest) -> bool) -> TrustStore {
        let policy = self;
        let mut trust = TrustStore::new();
        for (publisher, p) in &policy.publishers {
            for key in p.keys.iter().filter(|k| keep(publisher, &k.key_id)) {
                // Nothing is revoked yet, and reading refuses empty keys and a key of two
                // publishers; in a policy being authored, such a key stays the first one's.
                let _ = trust.add_key(publisher.clone(), key.spki_der.clone());
            }
        }
        for (k, reason) in &policy.revoked_keys {
            trust.revoke_key(*k, reason.clone());
        }
        for (d, reason) in &policy.revoked_digests {
            trust.revoke_digest(*d, reason.clone());
        }
        trust
    }
}

/// Verifies `policy` under the trusted `root`: the same fleet, signed under that root or an
/// older one, a threshold of the root's keys signed it, and it is consistent with itself.
/// Version and expiry are [`super::accept_policy`]'s to judge.
pub fn verify_policy(
    root: &VerifiedRoot,
    policy: &SignedPolicy,
    check: &dyn SignatureCheck,
) -> Result<VerifiedPolicy, PolicyError> {
    let (r, p) = (root.root(), policy.body());
    if p.fleet != r.fleet {
        return Err(PolicyError::OtherFleet {
            version: p.version,
            root_fleet: r.fleet.clone(),
            policy_fleet: p.fleet.clone(),
        });
    }
    if p.root_version > r.version {
        return Err(PolicyError::NeedsNewerRoot {
            version: p.version,
            signed_under: p.root_version,
            trusted: r.version,
        });
    }
    root.threshold_of(policy, check)
        .map_err(|e| PolicyError::Threshold(Box::new(e)))?;
    if let Some(problem) = p.problem() {
        return Err(PolicyError::Inconsistent {
            version: p.version,
            problem: Box::new(problem),
        });
    }
    Ok(VerifiedPolicy {
        signed: policy.clone(),
        root_version: r.version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_cover_prefixes_on_dot_boundaries_only() {
        let id = |s: &str| PackageId::new(s).unwrap();
        let scoped = FleetPublisher {
            keys: Vec::new(),
            scopes: vec![id("org.example")],
        };
        assert!(scoped.covers(&id("org.example")));
        assert!(scoped.covers(&id("org.example.scan")));
        assert!(!scoped.covers(&id("org.examples")));
        assert!(!scoped.covers(&id("org")));
        assert!(FleetPublisher::default().covers(&id("anything.at.all")));
    }
}
