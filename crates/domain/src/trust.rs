//! Trust decisions: which publishers' keys the operator trusts, what has been revoked, and
//! whether a package's signatures authenticate it.
//!
//! The key material itself is opaque here (SPKI DER bytes); checking a signature is the crypto
//! adapter's job, reached through [`SignatureCheck`] so that the decision stays pure. The trust
//! file is read strictly and fails closed: a file that cannot be read completely is an error,
//! never an empty trust store.
//!
//! A trust file is also bound to its store. It carries a [`TrustBinding`] (the store's id and a
//! generation that grows with every change), and the registry records a [`TrustAnchor`] for it
//! in the same commit: the binding, the SHA-256 of the file's exact bytes, and a copy of every
//! revocation. [`check_trust_file`] compares the two, so that a missing, older, foreign or
//! hand-edited trust file stops the store instead of silently forgetting a revocation, and
//! [`TrustStore::rebuilt`] makes the file an operator recovers with, which keeps every
//! revocation the registry remembers.

use std::collections::BTreeMap;
use std::fmt;

use crate::ids::{IdError, PublisherId, Sha256Digest};
use crate::json::{self, Integer, Value};
use crate::manifest::{Metadata, SignatureAlgorithm};

/// The format number written into and required of trust files.
pub const TRUST_FORMAT_V1: u64 = 1;

/// A public key the operator trusts for one publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedKey {
    /// SHA-256 of `spki_der`.
    pub key_id: Sha256Digest,
    /// The public key, DER-encoded SubjectPublicKeyInfo.
    pub spki_der: Vec<u8>,
}

/// Trusted publishers and their keys, revoked keys and revoked package digests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustStore {
    publishers: BTreeMap<PublisherId, BTreeMap<Sha256Digest, TrustedKey>>,
    revoked_keys: BTreeMap<Sha256Digest, String>,
    revoked_digests: BTreeMap<Sha256Digest, String>,
    binding: Option<TrustBinding>,
}

/// Which store a trust file belongs to, and where it stands in that store's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBinding {
    /// The store's id ([`is_store_id`]): minted once, when the store first records a trust file.
    pub store_id: String,
    /// Grows by one with every change of the trust file.
    pub generation: u64,
}

/// What the registry records about the trust file in the commit that wrote it: enough to tell
/// the right file from any other, and every revocation, so that no file operation on the trust
/// file alone can make the store forget one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustAnchor {
    /// The binding the file carries.
    pub binding: TrustBinding,
    /// SHA-256 of the trust file's exact bytes.
    pub file_digest: Sha256Digest,
    /// Every revoked key, with its reason.
    pub revoked_keys: BTreeMap<Sha256Digest, String>,
    /// Every revoked payload digest, with its reason.
    pub revoked_digests: BTreeMap<Sha256Digest, String>,
}

/// Whether `s` is a store id: 32 lowercase hex digits.
pub fn is_store_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why the trust file on disk is not the one the registry recorded. Every variant stops the
/// store from opening; [`TrustStore::rebuilt`] is the way out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustFileMismatch {
    /// No trust file, although the registry recorded one.
    #[error(
        "the trust file is missing, but the registry records trust file generation {generation}; \
         opening without it would forget every trusted key and revocation"
    )]
    Missing {
        /// The generation the registry records.
        generation: u64,
    },
    /// No trust file in a store made before trust files were bound, which records packages: they
    /// were installed through a trust file, so one existed and is gone.
    #[error(
        "the trust file is missing, but the registry records installed packages, which were \
         authenticated through it; opening without it would forget its revocations"
    )]
    MissingWithPackages,
    /// A trust file without a binding where the registry records one: a copy from before the
    /// store bound its trust file, or a hand-written file.
    #[error(
        "the trust file carries no store binding, but the registry records trust file \
         generation {generation}: it is an old copy or was written by hand"
    )]
    Unbound {
        /// The generation the registry records.
        generation: u64,
    },
    /// A trust file of another store.
    #[error("the trust file belongs to store {found}, not to this store ({expected})")]
    Foreign {
        /// The store id the file carries.
        found: String,
        /// This store's id, as the registry records it.
        expected: String,
    },
    /// An older trust file of this store (a backup put back, say).
    #[error(
        "the trust file is generation {found}, older than generation {recorded} that the registry \
         records: it is an old copy, and revocations made since would be forgotten"
    )]
    Older {
        /// The generation the file carries.
        found: u64,
        /// The generation the registry records.
        recorded: u64,
    },
    /// A trust file newer than the registry knows: the registry itself was put back from an
    /// older copy, or the file was edited.
    #[error(
        "the trust file is generation {found}, newer than generation {recorded} that the registry \
         records: the registry or the trust file was replaced by another copy"
    )]
    Newer {
        /// The generation the file carries.
        found: u64,
        /// The generation the registry records.
        recorded: u64,
    },
    /// The right generation of this store's trust file, with other contents.
    #[error(
        "the trust file was changed outside guild: its bytes are not those the registry recorded \
         for generation {generation}"
    )]
    Altered {
        /// The generation of the file and of the record.
        generation: u64,
    },
    /// A bound trust file in a store whose registry records none.
    #[error(
        "the trust file is bound to store {found} at generation {generation}, but this store's \
         registry records no trust file: it comes from another store or the registry was replaced"
    )]
    NotRecorded {
        /// The store id the file carries.
        found: String,
        /// The generation the file carries.
        generation: u64,
    },
}

/// Checks the trust file on disk (its exact bytes and what they decode to; `None` when there is
/// no file) against what the registry recorded for it (`None` in a store that never recorded a
/// trust file). `packages_recorded` says whether the registry records any package version.
///
/// A store that never recorded a trust file (it is new, or it was made before trust files were
/// bound) accepts an unbound file, which is bound at the next trust commit, and no file while it
/// records no package.
pub fn check_trust_file(
    anchor: Option<&TrustAnchor>,
    file: Option<(&[u8], &TrustStore)>,
    packages_recorded: bool,
) -> Result<(), TrustFileMismatch> {
    let Some(anchor) = anchor else {
        return match file {
            None if packages_recorded => Err(TrustFileMismatch::MissingWithPackages),
            None => Ok(()),
            Some((_, store)) => match &store.binding {
                None => Ok(()),
                Some(b) => Err(TrustFileMismatch::NotRecorded {
                    found: b.store_id.clone(),
                    generation: b.generation,
                }),
            },
        };
    };
    let recorded = &anchor.binding;
    let Some((bytes, store)) = file else {
        return Err(TrustFileMismatch::Missing {
            generation: recorded.generation,
        });
    };
    let Some(found) = &store.binding else {
        return Err(TrustFileMismatch::Unbound {
            generation: recorded.generation,
        });
    };
    if found.store_id != recorded.store_id {
        return Err(TrustFileMismatch::Foreign {
            found: found.store_id.clone(),
            expected: recorded.store_id.clone(),
        });
    }
    if found.generation < recorded.generation {
        return Err(TrustFileMismatch::Older {
            found: found.generation,
            recorded: recorded.generation,
        });
    }
    if found.generation > recorded.generation {
        return Err(TrustFileMismatch::Newer {
            found: found.generation,
            recorded: recorded.generation,
        });
    }
    if Sha256Digest::of(bytes) != anchor.file_digest {
        return Err(TrustFileMismatch::Altered {
            generation: recorded.generation,
        });
    }
    Ok(())
}

/// Whether `next` may replace `current` as the registry's trust record: once recorded it stays,
/// for the same store, its generation grows when it changes, and it keeps every revocation.
/// Answers the problem, if any.
pub fn anchor_succession_problem(
    current: Option<&TrustAnchor>,
    next: Option<&TrustAnchor>,
) -> Option<String> {
    let current = current?;
    let Some(next) = next else {
        return Some("the new store state drops the record of the trust file".into());
    };
    if next == current {
        return None;
    }
    if next.binding.store_id != current.binding.store_id {
        return Some(format!(
            "the new store state binds the trust file to store {}, not {}",
            next.binding.store_id, current.binding.store_id
        ));
    }
    if next.binding.generation <= current.binding.generation {
        return Some(format!(
            "the trust file generation goes from {} to {}, not forward",
            current.binding.generation, next.binding.generation
        ));
    }
    let forgotten = current
        .revoked_keys
        .keys()
        .find(|k| !next.revoked_keys.contains_key(k))
        .or_else(|| {
            current
                .revoked_digests
                .keys()
                .find(|d| !next.revoked_digests.contains_key(d))
        });
    forgotten.map(|d| format!("the new store state forgets the revocation of {d}"))
}

/// Why a change to the trust store was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustChangeError {
    /// The key was revoked; revocation is permanent.
    #[error("key {key_id} is revoked and cannot be trusted again")]
    KeyRevoked {
        /// The key.
        key_id: Sha256Digest,
    },
    /// The key is already trusted for another publisher.
    #[error("key {key_id} is already trusted for publisher {owner}; one key serves one publisher")]
    KeyOfAnotherPublisher {
        /// The key.
        key_id: Sha256Digest,
        /// The publisher it is trusted for.
        owner: PublisherId,
    },
    /// The key has no bytes.
    #[error("the public key is empty")]
    EmptyKey,
}

/// Why a trust file could not be read. Every variant fails closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustFileError {
    /// The file is not strict JSON.
    #[error("trust file is not valid JSON: {0}")]
    Json(#[from] json::JsonError),
    /// A field is missing or malformed.
    #[error("trust file: {path}: {problem}")]
    Field {
        /// The JSON path of the field.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The file's format number is not one this host reads.
    #[error("trust file has format {found}; this host reads format {TRUST_FORMAT_V1}")]
    UnknownFormat {
        /// The format found.
        found: String,
    },
}

fn field(path: impl Into<String>, problem: impl Into<String>) -> TrustFileError {
    TrustFileError::Field {
        path: path.into(),
        problem: problem.into(),
    }
}

impl TrustStore {
    /// An empty trust store: nothing is trusted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts `spki_der` for `publisher` and returns its key id. Trusting a key again for the
    /// same publisher is a no-op.
    pub fn add_key(
        &mut self,
        publisher: PublisherId,
        spki_der: Vec<u8>,
    ) -> Result<Sha256Digest, TrustChangeError> {
        if spki_der.is_empty() {
            return Err(TrustChangeError::EmptyKey);
        }
        let key_id = Sha256Digest::of(&spki_der);
        if self.revoked_keys.contains_key(&key_id) {
            return Err(TrustChangeError::KeyRevoked { key_id });
        }
        if let Some(owner) = self.owner_of(&key_id) {
            if owner != &publisher {
                return Err(TrustChangeError::KeyOfAnotherPublisher {
                    key_id,
                    owner: owner.clone(),
                });
            }
        }
        self.publishers
            .entry(publisher)
            .or_default()
            .insert(key_id, TrustedKey { key_id, spki_der });
        Ok(key_id)
    }

    /// Revokes a key: no signature by it authenticates anything from now on, even while it is
    /// still listed for its publisher. Returns whether it was newly revoked.
    pub fn revoke_key(&mut self, key_id: Sha256Digest, reason: impl Into<String>) -> bool {
        self.revoked_keys.insert(key_id, reason.into()).is_none()
    }

    /// Revokes one package payload (by the digest of its canonical payload). Returns whether it
    /// was newly revoked.
    pub fn revoke_digest(&mut self, digest: Sha256Digest, reason: impl Into<String>) -> bool {
        self.revoked_digests.insert(digest, reason.into()).is_none()
    }

    /// The publisher a key is trusted for, if any.
    pub fn owner_of(&self, key_id: &Sha256Digest) -> Option<&PublisherId> {
        self.publishers
            .iter()
            .find(|(_, keys)| keys.contains_key(key_id))
            .map(|(p, _)| p)
    }

    /// The keys trusted for `publisher`.
    pub fn keys_of(&self, publisher: &PublisherId) -> impl Iterator<Item = &TrustedKey> {
        self.publishers
            .get(publisher)
            .into_iter()
            .flat_map(|keys| keys.values())
    }

    /// Every trusted publisher with its keys, in id order.
    pub fn publishers(
        &self,
    ) -> impl Iterator<Item = (&PublisherId, impl Iterator<Item = &TrustedKey>)> {
        self.publishers.iter().map(|(p, keys)| (p, keys.values()))
    }

    /// Revoked keys with the reason recorded.
    pub fn revoked_keys(&self) -> impl Iterator<Item = (&Sha256Digest, &str)> {
        self.revoked_keys.iter().map(|(k, r)| (k, r.as_str()))
    }

    /// Revoked payload digests with the reason recorded.
    pub fn revoked_digests(&self) -> impl Iterator<Item = (&Sha256Digest, &str)> {
        self.revoked_digests.iter().map(|(k, r)| (k, r.as_str()))
    }

    /// Whether `key_id` is revoked.
    pub fn is_key_revoked(&self, key_id: &Sha256Digest) -> bool {
        self.revoked_keys.contains_key(key_id)
    }

    /// Whether the payload digest is revoked.
    pub fn is_digest_revoked(&self, digest: &Sha256Digest) -> bool {
        self.revoked_digests.contains_key(digest)
    }

    /// The store binding the file carries, if any.
    pub fn binding(&self) -> Option<&TrustBinding> {
        self.binding.as_ref()
    }

    /// Binds the trust store to `store_id` at `generation` and encodes it, answering the file's
    /// bytes and the anchor the registry records for them in the same commit.
    pub fn seal(&mut self, store_id: &str, generation: u64) -> (Vec<u8>, TrustAnchor) {
        self.binding = Some(TrustBinding {
            store_id: store_id.to_owned(),
            generation,
        });
        let bytes = self.to_json().into_bytes();
        let anchor = TrustAnchor {
            binding: TrustBinding {
                store_id: store_id.to_owned(),
                generation,
            },
            file_digest: Sha256Digest::of(&bytes),
            revoked_keys: self.revoked_keys.clone(),
            revoked_digests: self.revoked_digests.clone(),
        };
        (bytes, anchor)
    }

    /// The trust store an operator recovers with when the trust file is missing, old, foreign or
    /// damaged: every revocation the registry recorded (`anchor`) and every revocation of the
    /// file found (`found`, when it could be read), and, only when `keep_keys`, the keys that
    /// file trusts, except revoked ones. Unbound; [`TrustStore::seal`] binds it.
    pub fn rebuilt(
        anchor: Option<&TrustAnchor>,
        found: Option<&TrustStore>,
        keep_keys: bool,
    ) -> Self {
        let mut out = TrustStore::new();
        for source in anchor
            .map(|a| (&a.revoked_keys, &a.revoked_digests))
            .into_iter()
            .chain(found.map(|f| (&f.revoked_keys, &f.revoked_digests)))
        {
            for (k, r) in source.0 {
                out.revoked_keys.entry(*k).or_insert_with(|| r.clone());
            }
            for (d, r) in source.1 {
                out.revoked_digests.entry(*d).or_insert_with(|| r.clone());
            }
        }
        if keep_keys {
            for (publisher, keys) in found.iter().flat_map(|f| f.publishers.iter()) {
                for key in keys.values() {
                    // A revoked key is left out, and a key the file lists twice (for two
                    // publishers) could not be read in the first place.
                    let _ = out.add_key(publisher.clone(), key.spki_der.clone());
                }
            }
        }
        out
    }

    /// Encodes the trust file (indented JSON, stable order).
    pub fn to_json(&self) -> String {
        let publishers = self
            .publishers
            .iter()
            .map(|(p, keys)| {
                let keys = keys
                    .values()
                    .map(|k| {
                        Value::Object(vec![
                            ("key_id".into(), k.key_id.to_hex().into()),
                            (
                                "public_key_der".into(),
                                crate::hex::encode(&k.spki_der).into(),
                            ),
                        ])
                    })
                    .collect();
                (p.to_string(), Value::Array(keys))
            })
            .collect();
        let revoked = |m: &BTreeMap<Sha256Digest, String>, name: &str| {
            Value::Array(
                m.iter()
                    .map(|(d, r)| {
                        Value::Object(vec![
                            (name.into(), d.to_hex().into()),
                            ("reason".into(), r.clone().into()),
                        ])
                    })
                    .collect(),
            )
        };
        let mut members = vec![("trust_format".into(), TRUST_FORMAT_V1.into())];
        if let Some(b) = &self.binding {
            members.push(("store_id".into(), b.store_id.clone().into()));
            members.push(("generation".into(), b.generation.into()));
        }
        members.extend([
            ("publishers".into(), Value::Object(publishers)),
            ("revoked_keys".into(), revoked(&self.revoked_keys, "key_id")),
            (
                "revoked_digests".into(),
                revoked(&self.revoked_digests, "sha256"),
            ),
        ]);
        Value::Object(members).to_pretty_string()
    }

    /// Reads a trust file strictly: unknown fields, duplicate keys, or a key whose id does not
    /// match its bytes are errors. A key may be both listed and revoked (it was revoked after
    /// being trusted); revocation wins when deciding. `store_id` and `generation` (the binding)
    /// come together or not at all: files written before trust files were bound have neither.
    pub fn from_json(bytes: &[u8]) -> Result<Self, TrustFileError> {
        let doc = json::parse(bytes)?;
        let top = expect_object(
            &doc,
            "$",
            &[
                "trust_format",
                "store_id",
                "generation",
                "publishers",
                "revoked_keys",
                "revoked_digests",
            ],
        )?;
        let format = top
            .get("trust_format")
            .ok_or_else(|| field("$.trust_format", "missing"))?;
        if format.as_integer() != Integer::new(TRUST_FORMAT_V1.into()) {
            let found = match format {
                Value::Integer(i) => i.get().to_string(),
                other => other.type_name().to_string(),
            };
            return Err(TrustFileError::UnknownFormat { found });
        }
        let mut store = TrustStore::new();
        store.binding = match (top.get("store_id"), top.get("generation")) {
            (None, None) => None,
            (Some(id), Some(generation)) => {
                let store_id = id
                    .as_str()
                    .filter(|s| is_store_id(s))
                    .ok_or_else(|| field("$.store_id", "expected 32 lowercase hex digits"))?;
                let generation = generation
                    .as_integer()
                    .and_then(|i| i.as_u64())
                    .ok_or_else(|| field("$.generation", "expected a non-negative integer"))?;
                Some(TrustBinding {
                    store_id: store_id.to_owned(),
                    generation,
                })
            }
            (None, Some(_)) => return Err(field("$.store_id", "missing (generation is present)")),
            (Some(_), None) => return Err(field("$.generation", "missing (store_id is present)")),
        };
        let publishers = top
            .get("publishers")
            .ok_or_else(|| field("$.publishers", "missing"))?;
        let publishers = publishers
            .as_object()
            .ok_or_else(|| field("$.publishers", "expected an object"))?;
        for (name, keys) in publishers {
            let path = format!("$.publishers.{name}");
            let publisher = PublisherId::new(name.as_str())
                .map_err(|e: IdError| field(&path, e.to_string()))?;
            let keys = keys
                .as_array()
                .ok_or_else(|| field(&path, "expected an array of keys"))?;
            for (i, key) in keys.iter().enumerate() {
                let path = format!("{path}[{i}]");
                let key = expect_object(key, &path, &["key_id", "public_key_der"])?;
                let key_id = digest_field(&key, &path, "key_id")?;
                let der = string_field(&key, &path, "public_key_der")?;
                let der = crate::hex::decode(der).ok_or_else(|| {
                    field(format!("{path}.public_key_der"), "expected lowercase hex")
                })?;
                if Sha256Digest::of(&der) != key_id {
                    return Err(field(&path, "key_id is not the SHA-256 of public_key_der"));
                }
                store
                    .add_key(publisher.clone(), der)
                    .map_err(|e| field(&path, e.to_string()))?;
            }
        }
        for (list, name) in [("revoked_keys", "key_id"), ("revoked_digests", "sha256")] {
            let path = format!("$.{list}");
            let items = top.get(list).ok_or_else(|| field(&path, "missing"))?;
            let items = items
                .as_array()
                .ok_or_else(|| field(&path, "expected an array"))?;
            for (i, item) in items.iter().enumerate() {
                let path = format!("{path}[{i}]");
                let item = expect_object(item, &path, &[name, "reason"])?;
                let digest = digest_field(&item, &path, name)?;
                let reason = string_field(&item, &path, "reason")?.to_owned();
                let target = if list == "revoked_keys" {
                    &mut store.revoked_keys
                } else {
                    &mut store.revoked_digests
                };
                if target.insert(digest, reason).is_some() {
                    return Err(field(&path, format!("{digest} is listed twice")));
                }
            }
        }
        Ok(store)
    }
}

/// A JSON object's members, refusing any member not in `allowed`.
fn expect_object<'v>(
    v: &'v Value,
    path: &str,
    allowed: &[&str],
) -> Result<BTreeMap<&'v str, &'v Value>, TrustFileError> {
    let members = v
        .as_object()
        .ok_or_else(|| field(path, format!("expected an object, found {}", v.type_name())))?;
    let mut out = BTreeMap::new();
    for (k, value) in members {
        if !allowed.contains(&k.as_str()) {
            return Err(field(format!("{path}.{k}"), "unknown field"));
        }
        out.insert(k.as_str(), value);
    }
    Ok(out)
}

fn string_field<'v>(
    obj: &BTreeMap<&str, &'v Value>,
    path: &str,
    name: &str,
) -> Result<&'v str, TrustFileError> {
    obj.get(name)
        .ok_or_else(|| field(format!("{path}.{name}"), "missing"))?
        .as_str()
        .ok_or_else(|| field(format!("{path}.{name}"), "expected a string"))
}

fn digest_field(
    obj: &BTreeMap<&str, &Value>,
    path: &str,
    name: &str,
) -> Result<Sha256Digest, TrustFileError> {
    let s = string_field(obj, path, name)?;
    Sha256Digest::parse_hex(s).map_err(|e| field(format!("{path}.{name}"), e.to_string()))
}

/// Checks one signature. The crypto adapter implements it; tests use fakes.
pub trait SignatureCheck {
    /// Whether `signature` (DER) by the key `spki_der` is valid over `message`. The error text
    /// says why not (malformed, high-S, invalid, ...).
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String>;
}

/// Who authenticated a package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// The publisher the manifest names.
    pub publisher: PublisherId,
    /// The first trusted key, in file order, whose signature verified.
    pub key_id: Sha256Digest,
    /// Every trusted, unrevoked key of the publisher whose signature verified, in file order
    /// (`key_id` first). A package carries several while its publisher rotates keys.
    pub signed_by: Vec<Sha256Digest>,
    /// SHA-256 of the canonical payload.
    pub payload_digest: Sha256Digest,
}

/// What happened to one signature of a refused package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureOutcome {
    /// No trusted publisher has this key.
    UnknownKey,
    /// The key is trusted, but for another publisher than the manifest names.
    KeyOfAnotherPublisher {
        /// The publisher the key is trusted for.
        owner: PublisherId,
    },
    /// The key has been revoked.
    KeyRevoked {
        /// The reason recorded when it was revoked.
        reason: String,
    },
    /// The key is right but the signature does not verify.
    Invalid {
        /// What the verifier said.
        reason: String,
    },
}

impl fmt::Display for SignatureOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureOutcome::UnknownKey => f.write_str("the key is not trusted for any publisher"),
            SignatureOutcome::KeyOfAnotherPublisher { owner } => {
                write!(
                    f,
                    "the key is trusted for publisher {owner}, not for the package's publisher"
                )
            }
            SignatureOutcome::KeyRevoked { reason } => write!(f, "the key is revoked ({reason})"),
            SignatureOutcome::Invalid { reason } => {
                write!(f, "the signature does not verify: {reason}")
            }
        }
    }
}

/// Why a package is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The payload's digest is revoked.
    #[error("package payload {digest} is revoked ({reason})")]
    DigestRevoked {
        /// The payload digest.
        digest: Sha256Digest,
        /// The reason recorded when it was revoked.
        reason: String,
    },
    /// The package carries no signature at all.
    #[error("the package carries no signature")]
    NoSignatures,
    /// The trust store holds no key for the publisher.
    #[error("publisher {publisher} is not trusted: no key of it is in the trust store")]
    PublisherNotTrusted {
        /// The publisher the manifest names.
        publisher: PublisherId,
    },
    /// A signature names a trusted, unrevoked key of the publisher but does not verify, even
    /// though another signature does. A package that carries a forged or damaged signature under
    /// a key the operator trusts is refused whole: it was altered or mis-signed on the way.
    #[error(
        "the signature by trusted key {key_id} of publisher {publisher} does not verify \
         ({reason}); a package with a bad signature under a trusted key is refused even though \
         another signature verifies"
    )]
    InvalidTrustedSignature {
        /// The publisher the manifest names.
        publisher: PublisherId,
        /// The trusted key the bad signature names (boxed to keep the error, which every
        /// installation's result carries, small).
        key_id: Box<Sha256Digest>,
        /// What the verifier said.
        reason: String,
    },
    /// No signature verified under a trusted, unrevoked key of the publisher.
    #[error("no valid signature by a trusted key of publisher {publisher}:{}", list_attempts(.attempts))]
    NoValidSignature {
        /// The publisher the manifest names.
        publisher: PublisherId,
        /// Every signature's key and what happened to it.
        attempts: Vec<(Sha256Digest, SignatureOutcome)>,
    },
}

fn list_attempts(attempts: &[(Sha256Digest, SignatureOutcome)]) -> String {
    attempts
        .iter()
        .map(|(k, o)| format!("\n  key {k}: {o}"))
        .collect()
}

/// Decides whether `metadata` is authenticated by `trust`: its payload digest is not revoked,
/// at least one signature is a valid signature, over the canonical payload bytes as received, by
/// an unrevoked key trusted for the publisher the manifest names, and no signature that names
/// such a key fails to verify.
///
/// A package may carry several signatures (a publisher rotating keys signs with the old and the
/// new key). Their order does not matter. Signatures by keys that are unknown, revoked or
/// trusted for another publisher are ignored when another signature authenticates the package:
/// they are what a key rotation leaves behind. A signature that claims a trusted key of the
/// publisher and does not verify refuses the package ([`AuthError::InvalidTrustedSignature`]),
/// as TUF does: it can only come from damage or forgery.
pub fn authenticate(
    metadata: &Metadata,
    trust: &TrustStore,
    check: &dyn SignatureCheck,
) -> Result<Authenticated, AuthError> {
    authenticate_among(metadata, trust, check, None)
}

/// [`authenticate`] by one key: only the signatures made with `key_id` count, so the answer is
/// whether `metadata` carries a valid signature by that key and the key is trusted for its
/// publisher and not revoked. A lock names the key each package must be signed by, and a
/// package signed by several trusted keys may authenticate under another one first.
pub fn authenticate_by_key(
    metadata: &Metadata,
    trust: &TrustStore,
    check: &dyn SignatureCheck,
    key_id: &Sha256Digest,
) -> Result<Authenticated, AuthError> {
    authenticate_among(metadata, trust, check, Some(key_id))
}

fn authenticate_among(
    metadata: &Metadata,
    trust: &TrustStore,
    check: &dyn SignatureCheck,
    only: Option<&Sha256Digest>,
) -> Result<Authenticated, AuthError> {
    let digest = metadata.payload_digest();
    if let Some(reason) = trust.revoked_digests.get(&digest) {
        return Err(AuthError::DigestRevoked {
            digest,
            reason: reason.clone(),
        });
    }
    let publisher = &metadata.manifest().publisher_id;
    if metadata.signatures().is_empty() {
        return Err(AuthError::NoSignatures);
    }
    let keys = trust.publishers.get(publisher);
    if keys.is_none_or(|k| k.is_empty()) {
        return Err(AuthError::PublisherNotTrusted {
            publisher: publisher.clone(),
        });
    }
    let mut attempts = Vec::new();
    let mut signed_by = Vec::new();
    // Every signature is checked, also when only one key counts: a bad signature under a
    // trusted key refuses the package whichever key authenticates it.
    for sig in metadata.signatures() {
        // One algorithm exists today; the match makes adding another a compile error here.
        match sig.algorithm {
            SignatureAlgorithm::EcdsaP256Sha256 => {}
        }
        let outcome = if let Some(reason) = trust.revoked_keys.get(&sig.key_id) {
            SignatureOutcome::KeyRevoked {
                reason: reason.clone(),
            }
        } else if let Some(key) = keys.and_then(|k| k.get(&sig.key_id)) {
            match check.verify(&key.spki_der, metadata.canonical_payload(), &sig.signature) {
                Ok(()) => {
                    signed_by.push(sig.key_id);
                    continue;
                }
                Err(reason) => SignatureOutcome::Invalid { reason },
            }
        } else if let Some(owner) = trust.owner_of(&sig.key_id) {
            SignatureOutcome::KeyOfAnotherPublisher {
                owner: owner.clone(),
            }
        } else {
            SignatureOutcome::UnknownKey
        };
        attempts.push((sig.key_id, outcome));
    }
    let chosen = match only {
        None => signed_by.first(),
        Some(wanted) => signed_by.iter().find(|k| *k == wanted),
    };
    let Some(&key_id) = chosen else {
        // By one key: what happened to that key's signatures, or that there is none.
        if let Some(wanted) = only {
            attempts.retain(|(k, _)| k == wanted);
        }
        return Err(AuthError::NoValidSignature {
            publisher: publisher.clone(),
            attempts,
        });
    };
    if let Some((bad, SignatureOutcome::Invalid { reason })) = attempts
        .iter()
        .find(|(_, o)| matches!(o, SignatureOutcome::Invalid { .. }))
    {
        return Err(AuthError::InvalidTrustedSignature {
            publisher: publisher.clone(),
            key_id: Box::new(*bad),
            reason: reason.clone(),
        });
    }
    Ok(Authenticated {
        publisher: publisher.clone(),
        key_id,
        signed_by,
        payload_digest: digest,
    })
}
