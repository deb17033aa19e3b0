//! The signed envelope both fleet documents share, and the threshold rule over its signatures.
//!
//! `{"signed": {...}, "signatures": [{"key_id", "algorithm", "signature"}]}`: the message every
//! signature covers is the canonical bytes ([`crate::canonical`]) of the `signed` member as
//! received, the same rule as a package's payload, and the signature entries are spelled as a
//! `.gkmetadata` file spells them. The typed document is built from that same value, so nothing a
//! machine acts on escapes the signatures.

use std::collections::BTreeSet;
use std::fmt;

use crate::canonical::canonicalize;
use crate::ids::Sha256Digest;
use crate::json::{self, Value};
use crate::manifest::{SignatureAlgorithm, SignatureEntry};
use crate::trust::{SignatureCheck, TrustedKey};

use super::codec::{clip, field, FleetDocumentError, Obj};
use super::{DocumentKind, MAX_DOCUMENT_BYTES, MAX_SIGNATURES, MAX_SIGNATURE_BYTES};

/// A document that travels in the signed envelope: how to read its `signed` member and write it.
pub trait FleetDocument: Sized {
    /// Which document this is.
    const KIND: DocumentKind;
    /// Reads the `signed` member strictly.
    fn read(signed: &Value) -> Result<Self, FleetDocumentError>;
    /// The `signed` member for this document. Reading it back gives an equal document.
    fn to_value(&self) -> Value;
    /// The document's version.
    fn version(&self) -> u64;
}

/// A fleet document with its signatures. Built only by [`Signed::parse`] and [`Signed::new`],
/// which read the `signed` member by the same strict rules, so a `Signed` always holds a valid
/// document, the value it was read from, and that value's canonical bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed<T> {
    body: T,
    signed: Value,
    canonical: Vec<u8>,
    digest: Sha256Digest,
    signatures: Vec<SignatureEntry>,
}

/// Why a signature could not be added to a document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddSignatureError {
    /// The key already signed this document, with other signature bytes. A key signs a document
    /// once; adding the identical entry again is a no-op instead.
    #[error("{document} version {version} ({digest}) is already signed by key {key_id}")]
    AlreadySigned {
        /// Which document.
        document: DocumentKind,
        /// Its version.
        version: u64,
        /// Its digest.
        digest: Sha256Digest,
        /// The key.
        key_id: Sha256Digest,
    },
    /// The document already carries the most signatures an envelope may hold.
    #[error("{document} version {version} already carries {limit} signatures, the most allowed")]
    TooMany {
        /// Which document.
        document: DocumentKind,
        /// Its version.
        version: u64,
        /// The limit.
        limit: usize,
    },
    /// The signature is empty or longer than any signature of the algorithm.
    #[error(
        "{document} version {version}: the signature by key {key_id} is {len} bytes; \
         expected 1 to {MAX_SIGNATURE_BYTES}"
    )]
    BadLength {
        /// Which document.
        document: DocumentKind,
        /// Its version.
        version: u64,
        /// The key.
        key_id: Sha256Digest,
        /// The signature's length.
        len: usize,
    },
}

impl<T: FleetDocument> Signed<T> {
    /// An unsigned envelope for `body`, as an author writes it. The body is written and read
    /// back by the parser's rules, so a document that could not be parsed cannot be built.
    pub fn new(body: &T) -> Result<Self, FleetDocumentError> {
        Self::assemble(body.to_value(), Vec::new())
    }

    fn assemble(
        signed: Value,
        signatures: Vec<SignatureEntry>,
    ) -> Result<Self, FleetDocumentError> {
        let body = T::read(&signed)?;
        let canonical = canonicalize(&signed);
        if canonical.len() > MAX_DOCUMENT_BYTES {
            return Err(FleetDocumentError::TooLarge {
                document: T::KIND,
                size: canonical.len(),
                limit: MAX_DOCUMENT_BYTES,
            });
        }
        let digest = Sha256Digest::of(&canonical);
        Ok(Signed {
            body,
            signed,
            canonical,
            digest,
            signatures,
        })
    }

    /// Reads a document strictly: size cap, strict JSON, exactly the members `signed` and
    /// `signatures`, at most [`MAX_SIGNATURES`] signatures, no key signing twice, and the
    /// `signed` member by the document's own rules.
    pub fn parse(bytes: &[u8]) -> Result<Self, FleetDocumentError> {
        let doc = T::KIND;
        if bytes.len() > MAX_DOCUMENT_BYTES {
            return Err(FleetDocumentError::TooLarge {
                document: doc,
                size: bytes.len(),
                limit: MAX_DOCUMENT_BYTES,
            });
        }
        let value = json::parse(bytes).map_err(|error| FleetDocumentError::Json {
            document: doc,
            error,
        })?;
        let top = Obj::of(doc, &value, "", &["signed", "signatures"])?;
        let signed = top.req("signed")?;
        let list = top.array("signatures", MAX_SIGNATURES)?;
        let mut signatures: Vec<SignatureEntry> = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let at = format!("signatures[{i}]");
            let o = Obj::of(doc, item, &at, &["key_id", "algorithm", "signature"])?;
            let key_id = o.digest("key_id")?;
            let algorithm = o.parsed("algorithm", |s| {
                SignatureAlgorithm::parse(s).ok_or_else(|| {
                    format!(
                        "{:?} is not a signature algorithm; expected one of {:?}",
                        clip(s),
                        SignatureAlgorithm::SPELLINGS
                    )
                })
            })?;
            let signature = o.parsed("signature", |s| {
                crate::hex::decode(s)
                    .filter(|b| b.len() <= MAX_SIGNATURE_BYTES)
                    .ok_or("expected non-empty lowercase hex, at most 512 bytes")
            })?;
            if signatures.iter().any(|s| s.key_id == key_id) {
                return Err(field(
                    doc,
                    format!("{at}.key_id"),
                    format!("key {key_id} signs twice"),
                ));
            }
            signatures.push(SignatureEntry {
                key_id,
                algorithm,
                signature,
            });
        }
        Self::assemble(signed.clone(), signatures)
    }

    /// The document.
    pub fn body(&self) -> &T {
        &self.body
    }

    /// The document's version.
    pub fn version(&self) -> u64 {
        self.body.version()
    }

    /// The `signed` member as received (or as written by [`Signed::new`]).
    pub fn signed_value(&self) -> &Value {
        &self.signed
    }

    /// The message every signature covers: the canonical bytes of the `signed` member.
    pub fn signed_bytes(&self) -> &[u8] {
        &self.canonical
    }

    /// SHA-256 of [`Signed::signed_bytes`]: the document's identity, whoever signed it.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// The signatures, in file order.
    pub fn signatures(&self) -> &[SignatureEntry] {
        &self.signatures
    }

    /// The document with one more signature, as a holder adds theirs ([`Signed::signed_bytes`]
    /// is what they sign). The digest does not change. Adding an entry identical to one already
    /// present is a no-op; another signature by a key that already signed is refused
    /// ([`AddSignatureError::AlreadySigned`]), so that a key is never counted twice. Whether
    /// the key belongs to the root is decided when the document is verified, not here.
    pub fn with_signature(mut self, entry: SignatureEntry) -> Result<Self, AddSignatureError> {
        let (document, version) = (T::KIND, self.version());
        if entry.signature.is_empty() || entry.signature.len() > MAX_SIGNATURE_BYTES {
            return Err(AddSignatureError::BadLength {
                document,
                version,
                key_id: entry.key_id,
                len: entry.signature.len(),
            });
        }
        if let Some(present) = self.signatures.iter().find(|s| s.key_id == entry.key_id) {
            if present == &entry {
                return Ok(self);
            }
            return Err(AddSignatureError::AlreadySigned {
                document,
                version,
                digest: self.digest,
                key_id: entry.key_id,
            });
        }
        if self.signatures.len() >= MAX_SIGNATURES {
            return Err(AddSignatureError::TooMany {
                document,
                version,
                limit: MAX_SIGNATURES,
            });
        }
        self.signatures.push(entry);
        Ok(self)
    }

    /// The whole document as a value: `signed` as received, then the signatures.
    pub fn to_value(&self) -> Value {
        let signatures = self
            .signatures
            .iter()
            .map(|s| {
                Value::Object(vec![
                    ("key_id".into(), s.key_id.to_hex().into()),
                    ("algorithm".into(), s.algorithm.as_str().into()),
                    ("signature".into(), crate::hex::encode(&s.signature).into()),
                ])
            })
            .collect();
        Value::Object(vec![
            ("signed".into(), self.signed.clone()),
            ("signatures".into(), Value::Array(signatures)),
        ])
    }

    /// The document's file text: indented JSON with a final newline. Reading it back gives the
    /// same document, digest and signatures.
    pub fn to_json(&self) -> String {
        self.to_value().to_pretty_string()
    }
}

/// What happened to one signature that did not count towards a threshold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureFault {
    /// The key is not one of the signing root's keys.
    NotARootKey,
    /// The key is a root key, but the signature does not verify.
    Invalid {
        /// What the verifier said.
        reason: String,
    },
}

impl fmt::Display for SignatureFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureFault::NotARootKey => f.write_str("the key is not one of the root's keys"),
            SignatureFault::Invalid { reason } => {
                write!(f, "the signature does not verify: {reason}")
            }
        }
    }
}

/// Fewer than the threshold of distinct root keys signed a document validly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{document} version {version} ({digest}) carries {} valid signatures by keys of root version \
     {root_version}; {threshold} are needed{}", valid.len(), list_faults(.refused)
)]
pub struct ThresholdError {
    /// Which document.
    pub document: DocumentKind,
    /// Its version.
    pub version: u64,
    /// Its digest.
    pub digest: Sha256Digest,
    /// The version of the root whose keys were counted.
    pub root_version: u64,
    /// How many distinct keys must sign.
    pub threshold: usize,
    /// The keys whose signatures verified.
    pub valid: BTreeSet<Sha256Digest>,
    /// Every other signature's key and why it did not count.
    pub refused: Vec<(Sha256Digest, SignatureFault)>,
}

fn list_faults(refused: &[(Sha256Digest, SignatureFault)]) -> String {
    refused
        .iter()
        .map(|(k, f)| format!("\n  key {k}: {f}"))
        .collect()
}

/// Checks that at least `threshold` distinct keys of `keys` (the keys of root `root_version`)
/// signed `doc` validly; answers the keys that did. A key counts once however many entries
/// name it, a key outside `keys` never counts, and verification stops once the threshold is
/// met. A threshold of 0 is never met: roots refuse it, and this refuses to be the place where
/// a document goes unsigned.
pub(crate) fn check_threshold<T: FleetDocument>(
    doc: &Signed<T>,
    keys: &[TrustedKey],
    threshold: usize,
    root_version: u64,
    check: &dyn SignatureCheck,
) -> Result<BTreeSet<Sha256Digest>, ThresholdError> {
    let mut valid = BTreeSet::new();
    let mut refused = Vec::new();
    for sig in &doc.signatures {
        if threshold > 0 && valid.len() >= threshold {
            break;
        }
        if valid.contains(&sig.key_id) {
            continue;
        }
        // One algorithm exists today; the match makes adding another a compile error here.
        match sig.algorithm {
            SignatureAlgorithm::EcdsaP256Sha256 => {}
        }
        let Some(key) = keys.iter().find(|k| k.key_id == sig.key_id) else {
            refused.push((sig.key_id, SignatureFault::NotARootKey));
            continue;
        };
        match check.verify(&key.spki_der, &doc.canonical, &sig.signature) {
            Ok(()) => {
                valid.insert(sig.key_id);
            }
            Err(reason) => refused.push((sig.key_id, SignatureFault::Invalid { reason })),
        }
    }
    if threshold > 0 && valid.len() >= threshold {
        Ok(valid)
    } else {
        Err(ThresholdError {
            document: T::KIND,
            version: doc.version(),
            digest: doc.digest,
            root_version,
            threshold,
            valid,
            refused,
        })
    }
}
