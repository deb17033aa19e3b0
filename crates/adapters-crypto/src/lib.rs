//! ECDSA P-256 / SHA-256 signing and verification, PEM keys, and key files for the Guild kernel
//! host.
//!
//! [`P256Verifier`] implements the [`SignatureVerifier`](guild_ports::signature::SignatureVerifier)
//! port. [`SigningKey`] and [`PublicKey`] are the key material the CLI's `keygen`, `sign` and
//! `trust` commands handle; the functions in [`files`] write them to disk with safe permissions.
//! [`sign_document`] adds one holder's signature to a fleet root or policy.
//!
//! Keys, PEM and DER, signing and every check on an encoding are p256's (RustCrypto, pure Rust).
//! The curve arithmetic of a verification is ring's by default (BoringSSL's P-256 assembly),
//! chosen for speed; p256 can still do it ([`Backend::RustCrypto`]), and the tests run every
//! input through both and require the same answer.
//!
//! The rules this crate enforces, all of them so that one key and one signed message each have
//! exactly one accepted encoding:
//! - A public key is a SubjectPublicKeyInfo for `id-ecPublicKey` on the named curve
//!   `prime256v1`, with an uncompressed point, in DER; its key id is the SHA-256 of that DER,
//!   which is what `openssl pkey -pubin -outform DER | sha256sum` prints.
//! - A signature is strict DER and low-S; its high-S twin is refused even though it verifies
//!   mathematically.
//! - Private keys are read as PKCS#8 (`PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`, what
//!   `openssl ecparam -genkey` writes) PEM, and always written as PKCS#8.

#![forbid(unsafe_code)]

mod asn1;
mod error;
pub mod files;
mod fleet;
mod keys;
mod verify;

pub use error::{KeyError, KeyFileError};
pub use fleet::sign_document;
pub use keys::{PublicKey, SigningKey, MAX_SIGNATURE_DER_BYTES};
pub use verify::{Backend, P256Verifier};

/// Holds secret bytes and wipes them when dropped; private key PEM text is returned in one.
pub use p256::elliptic_curve::zeroize::Zeroizing;
