//! Errors of reading, writing and using keys, and how they map onto the signature port's kinds.

use std::error::Error;
use std::path::PathBuf;

use guild_ports::signature::{SignatureError, SignatureErrorKind};

/// An underlying library error, boxed so that no p256 or der type appears in this crate's API.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Why a key could not be read, written or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is not one well-formed PEM block.
    #[error("{what} is not valid PEM")]
    Pem {
        what: &'static str,
        #[source]
        source: BoxError,
    },
    /// The PEM block holds something other than what was asked for.
    #[error("PEM block is labelled {found:?}; expected {expected}")]
    UnexpectedPemLabel {
        found: String,
        expected: &'static str,
    },
    /// The private key is password-protected; this crate reads only plain keys.
    #[error("encrypted private keys are not supported; decrypt it first (openssl pkey -in KEY -out PLAIN)")]
    EncryptedPrivateKey,
    /// The DER inside is not the structure it claims to be, or holds an impossible value.
    #[error("{what} is malformed")]
    Malformed {
        what: &'static str,
        #[source]
        source: Option<BoxError>,
    },
    /// The key is for another algorithm (RSA, Ed25519, ...).
    #[error("key algorithm is {algorithm}; expected id-ecPublicKey (1.2.840.10045.2.1)")]
    UnsupportedAlgorithm { algorithm: String },
    /// The key is an elliptic-curve key on another curve, or with explicit curve parameters.
    #[error("key is on curve {curve}; expected prime256v1 (1.2.840.10045.3.1.7)")]
    WrongCurve { curve: String },
    /// The key does not say which curve it is on, so it cannot be told apart from a key on
    /// another 256-bit curve.
    #[error("{what} names no curve; expected prime256v1 (1.2.840.10045.3.1.7)")]
    MissingCurve { what: &'static str },
    /// The public key is valid but not in the one encoding whose hash is its key id.
    #[error("public key is not in canonical form ({reason}); export it with an uncompressed point and a named curve")]
    NonCanonicalPublicKey { reason: &'static str },
    /// The operating system's random number generator failed.
    #[error("the system random number generator failed")]
    Random {
        #[source]
        source: BoxError,
    },
    /// Producing a signature failed (it cannot for a valid key except with negligible
    /// probability, but it is reported rather than panicking).
    #[error("signing failed")]
    Sign {
        #[source]
        source: BoxError,
    },
    /// Encoding a key failed.
    #[error("encoding the {what} failed")]
    Encode {
        what: &'static str,
        #[source]
        source: BoxError,
    },
}

impl KeyError {
    /// The port's kind for this error when it concerns the public key given to a verifier.
    pub(crate) fn signature_error_kind(&self) -> SignatureErrorKind {
        match self {
            KeyError::UnsupportedAlgorithm { .. } => SignatureErrorKind::UnsupportedKeyAlgorithm,
            KeyError::WrongCurve { .. } => SignatureErrorKind::WrongCurve,
            _ => SignatureErrorKind::MalformedKey,
        }
    }
}

impl From<KeyError> for SignatureError {
    /// Reports a public key the verifier refused: the kind from the variant, the variant's own
    /// message as the detail, and the library error (if any) as the source.
    fn from(e: KeyError) -> Self {
        let kind = e.signature_error_kind();
        let detail = e.to_string();
        let err = SignatureError::new(kind).with_detail(detail);
        match e {
            KeyError::Malformed {
                source: Some(source),
                ..
            }
            | KeyError::Pem { source, .. } => err.with_source(source),
            _ => err,
        }
    }
}

/// Why a key file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// A file-system call failed.
    #[error("cannot {operation} {}", path.display())]
    Io {
        operation: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The target exists and the options say not to replace it.
    #[error("{} already exists; refusing to overwrite a key file", path.display())]
    AlreadyExists { path: PathBuf },
    /// The file is larger than any key file this crate reads.
    #[error("{} is {size} bytes; a key file is at most {limit}", path.display())]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    /// The file is not UTF-8 text, so it is not PEM.
    #[error("{} is not text", path.display())]
    NotText { path: PathBuf },
    /// The file's contents are not a usable key.
    #[error("{} does not hold a usable key", path.display())]
    Key {
        path: PathBuf,
        #[source]
        source: KeyError,
    },
}
