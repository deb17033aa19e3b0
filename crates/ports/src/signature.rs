//! The signature-verification port: checks one detached signature over one message with one
//! public key, and names keys by a digest of their encoding.
//!
//! The trust decision (which keys may sign for which publisher, which are revoked) belongs to the
//! domain and the app. This port only answers "did the holder of this key sign these bytes?", and
//! answers it the same way for every caller: a key arrives as SubjectPublicKeyInfo DER, the message
//! is the canonical payload bytes, and the signature is DER. Each refusal carries a kind that says
//! which of the three inputs was at fault, so that a caller can tell a corrupt trust store (a bad
//! key) from a forged or damaged package (a bad signature).

use std::error::Error;
use std::fmt;

use guild_domain::ids::Sha256Digest;

/// A key id: the SHA-256 of the key's SubjectPublicKeyInfo DER encoding.
///
/// This is what a `.gkmetadata` signature entry names in `key_id`, and it equals
/// `openssl pkey -pubin -outform DER | sha256sum` for the same key.
pub type KeyId = Sha256Digest;

/// Computes the key id of a public key given as SubjectPublicKeyInfo DER.
///
/// The id is over the exact bytes given; it says nothing about whether they hold a usable key.
/// An adapter that accepts more than one encoding of the same key must normalise before hashing,
/// so that one key has one id.
pub fn key_id(public_key_spki_der: &[u8]) -> KeyId {
    Sha256Digest::of(public_key_spki_der)
}

/// Verifies detached signatures. Implementations are stateless checkers and may be shared
/// between threads.
#[cfg_attr(feature = "mocks", mockall::automock)]
pub trait SignatureVerifier: Send + Sync {
    /// Checks that `signature_der` is a valid signature over `message` by the key whose
    /// SubjectPublicKeyInfo DER encoding is `public_key_spki_der`.
    ///
    /// `message` is the whole signed message (for `.gkmetadata`, the canonical payload bytes),
    /// not a digest of it; the implementation hashes it as its algorithm requires.
    fn verify(
        &self,
        public_key_spki_der: &[u8],
        message: &[u8],
        signature_der: &[u8],
    ) -> Result<(), SignatureError>;
}

/// Which input a verification refused, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SignatureErrorKind {
    /// The public key is not a well-formed SubjectPublicKeyInfo, its point is not on the curve,
    /// or it is not in the one encoding the verifier accepts for that key.
    MalformedKey,
    /// The public key is for an algorithm other than the verifier's (for example RSA or Ed25519
    /// where an elliptic-curve key is expected).
    UnsupportedKeyAlgorithm,
    /// The public key is an elliptic-curve key on a curve other than the verifier's.
    WrongCurve,
    /// The signature is not strict DER, or its numbers are out of range for the curve.
    MalformedSignature,
    /// The signature is the high-S twin of a signature. Both verify mathematically; only the
    /// low-S form is accepted so that a signature has exactly one valid encoding.
    HighS,
    /// The signature is well formed but does not verify: the message, the signature or the key
    /// differs from what was signed.
    Invalid,
}

impl SignatureErrorKind {
    /// A short phrase naming what failed, used by [`SignatureError`]'s `Display`.
    pub fn describe(self) -> &'static str {
        match self {
            SignatureErrorKind::MalformedKey => "public key is malformed",
            SignatureErrorKind::UnsupportedKeyAlgorithm => {
                "public key is for an unsupported algorithm"
            }
            SignatureErrorKind::WrongCurve => "public key is on the wrong curve",
            SignatureErrorKind::MalformedSignature => "signature is malformed",
            SignatureErrorKind::HighS => "signature is in high-S form",
            SignatureErrorKind::Invalid => "signature does not verify",
        }
    }
}

impl fmt::Display for SignatureErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A refused verification: its kind, an optional detail naming the offending value (an OID, a
/// length), and the underlying library error where there is one.
#[derive(Debug)]
pub struct SignatureError {
    kind: SignatureErrorKind,
    detail: Option<String>,
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl SignatureError {
    /// An error of `kind` with no detail and no source.
    pub fn new(kind: SignatureErrorKind) -> Self {
        SignatureError {
            kind,
            detail: None,
            source: None,
        }
    }

    /// Adds a detail that names the offending value; it is printed after the kind.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds the underlying error, reported through [`Error::source`].
    pub fn with_source(mut self, source: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What failed.
    pub fn kind(&self) -> SignatureErrorKind {
        self.kind
    }

    /// The detail, if any.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.describe())?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        Ok(())
    }
}

impl Error for SignatureError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_id_is_sha256_of_the_given_bytes() {
        // SHA-256("abc"), the FIPS 180-2 example.
        assert_eq!(
            key_id(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn display_names_the_failure_and_the_detail() {
        let e = SignatureError::new(SignatureErrorKind::WrongCurve)
            .with_detail("curve 1.3.132.0.34 (secp384r1); expected prime256v1");
        assert_eq!(
            e.to_string(),
            "public key is on the wrong curve: curve 1.3.132.0.34 (secp384r1); expected prime256v1"
        );
        assert_eq!(
            SignatureError::new(SignatureErrorKind::HighS).to_string(),
            "signature is in high-S form"
        );
    }

    #[test]
    fn source_is_reported() {
        let inner = std::io::Error::other("inner");
        let e = SignatureError::new(SignatureErrorKind::MalformedKey).with_source(inner);
        assert_eq!(e.source().map(|s| s.to_string()), Some("inner".to_owned()));
        assert!(SignatureError::new(SignatureErrorKind::Invalid)
            .source()
            .is_none());
    }

    #[test]
    fn the_port_is_object_safe_and_shareable() {
        struct RefuseAll;
        impl SignatureVerifier for RefuseAll {
            fn verify(&self, _: &[u8], _: &[u8], _: &[u8]) -> Result<(), SignatureError> {
                Err(SignatureError::new(SignatureErrorKind::Invalid))
            }
        }
        let shared: std::sync::Arc<dyn SignatureVerifier> = std::sync::Arc::new(RefuseAll);
        let err = shared.verify(b"", b"", b"").unwrap_err();
        assert_eq!(err.kind(), SignatureErrorKind::Invalid);
    }
}
