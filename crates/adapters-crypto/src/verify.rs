//! The verifier: ECDSA P-256 over SHA-256, strict DER, low-S only.
//!
//! Every check on the encodings (the key's one accepted SubjectPublicKeyInfo, strict DER, both
//! numbers in range, low S) is made here, with p256's parsers, before any arithmetic; only the
//! last step, the curve arithmetic that says whether the signature verifies, is handed to a
//! [`Backend`]. A key or signature that this crate refuses is therefore refused, with the same
//! kind and message, whichever backend runs.

use guild_ports::signature::{SignatureError, SignatureErrorKind, SignatureVerifier};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{self, Signature};

use crate::keys::{PublicKey, MAX_SIGNATURE_DER_BYTES};

/// Which implementation does the curve arithmetic of a verification.
///
/// Both give the same answer for every input (the tests feed both the same keys and signatures,
/// tampered and not); they differ in speed. `cargo bench -p guild-adapters-crypto --bench verify`
/// measured one verification over a 4 KiB canonical payload in one run that takes turns between
/// the candidates (aws-lc-rs and libcrux-ecdsa were in the bench for that run only; they are not
/// dependencies). The machine (2 cores) was at load 11-12, so the
/// times are about 2.3 times what OpenSSL reports as CPU time; the ratios are what carries over:
///
/// | candidate | µs (wall clock) | × `openssl speed -elapsed` | × p256 |
/// |---|---|---|---|
/// | p256 through the port (the verifier before ring) | 1007 | 3.40 | 1.00 |
/// | p256, key parsed once | 974 | 3.29 | 0.97 |
/// | ring through the port (the default) | 244 | 0.82 | 0.24 |
/// | ring, key parsed once | 236 | 0.80 | 0.23 |
/// | aws-lc-rs, key parsed once | 221 | 0.75 | 0.22 |
/// | libcrux-ecdsa (pure Rust, formally verified) | 1011 | 3.42 | 1.00 |
/// | `openssl speed -seconds 3 -elapsed ecdsap256` | 296 | 1.00 | 0.29 |
///
/// ring is four times faster than p256 and level with OpenSSL. aws-lc-rs is level with ring but
/// would add a second large C build (ring is already built for the OCI client's TLS); the
/// pure-Rust alternative is no faster than p256. This crate's checks before the arithmetic cost
/// a few percent of a verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Backend {
    /// ring (`ECDSA_P256_SHA256_FIXED`), the default.
    #[default]
    Ring,
    /// The RustCrypto `p256` crate, pure Rust; the crate's reference for the cross-checks.
    RustCrypto,
}

impl Backend {
    /// Every backend, for tests and benchmarks that compare them.
    pub const ALL: [Backend; 2] = [Backend::Ring, Backend::RustCrypto];

    /// A short name: `ring` or `p256`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::RustCrypto => "p256",
        }
    }
}

// Verification with a parsed key lives here, beside the rules it shares with the port, so that
// keys (parsing) never needs this module.
impl PublicKey {
    /// Verifies a DER signature over `message` with this key, by the same rules as
    /// [`crate::P256Verifier`] (strict DER, low-S only), without parsing the key again; the
    /// arithmetic is done by the default [`Backend`].
    pub fn verify(&self, message: &[u8], signature_der: &[u8]) -> Result<(), SignatureError> {
        self.verify_using(Backend::default(), message, signature_der)
    }

    /// [`PublicKey::verify`] with the arithmetic done by `backend`.
    pub fn verify_using(
        &self,
        backend: Backend,
        message: &[u8],
        signature_der: &[u8],
    ) -> Result<(), SignatureError> {
        verify_with(
            backend,
            &self.inner,
            self.point.as_bytes(),
            message,
            signature_der,
        )
    }
}

/// Verifies `ecdsa-p256-sha256` signatures for the [`SignatureVerifier`] port.
///
/// The key must be a canonical P-256 SubjectPublicKeyInfo (see [`PublicKey::from_spki_der`]);
/// the signature must be strict DER with both numbers in range and `s` in low form; the message
/// is hashed with SHA-256. It holds no state but its [`Backend`], so one value serves every
/// thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct P256Verifier {
    backend: Backend,
}

impl P256Verifier {
    /// A verifier with the default backend (ring).
    pub const fn new() -> Self {
        P256Verifier {
            backend: Backend::Ring,
        }
    }

    /// A verifier whose arithmetic is done by `backend`; the checks on the inputs are the same.
    pub const fn with_backend(backend: Backend) -> Self {
        P256Verifier { backend }
    }

    /// The backend this verifier uses.
    pub const fn backend(&self) -> Backend {
        self.backend
    }
}

impl SignatureVerifier for P256Verifier {
    fn verify(
        &self,
        public_key_spki_der: &[u8],
        message: &[u8],
        signature_der: &[u8],
    ) -> Result<(), SignatureError> {
        let key = PublicKey::from_spki_der(public_key_spki_der)?;
        key.verify_using(self.backend, message, signature_der)
    }
}

/// Parses a signature strictly and checks that it is low-S.
fn parse_signature(signature_der: &[u8]) -> Result<Signature, SignatureError> {
    let malformed = || SignatureError::new(SignatureErrorKind::MalformedSignature);
    if signature_der.is_empty() {
        return Err(malformed().with_detail("it is empty"));
    }
    if signature_der.len() > MAX_SIGNATURE_DER_BYTES {
        return Err(malformed().with_detail(format!(
            "it is {} bytes; a P-256 signature is at most {MAX_SIGNATURE_DER_BYTES}",
            signature_der.len()
        )));
    }
    // The der crate refuses BER (long or indefinite lengths, padded or negative integers) and
    // trailing bytes; ecdsa refuses zero and out-of-range numbers.
    let signature = Signature::from_der(signature_der).map_err(|e| {
        malformed()
            .with_detail("it is not a DER SEQUENCE of two INTEGERs in 1..n")
            .with_source(e)
    })?;
    // Re-encoding must give back the same bytes. The parser above already ensures this; the
    // check keeps that property from depending on a dependency's strictness.
    if signature.to_der().as_bytes() != signature_der {
        return Err(malformed().with_detail("it is not in canonical DER"));
    }
    if signature.normalize_s().is_some() {
        return Err(SignatureError::new(SignatureErrorKind::HighS)
            .with_detail("s is above n/2; only the low-S form n - s is accepted"));
    }
    Ok(signature)
}

/// Verifies `signature_der` over SHA-256(`message`) with the key whose p256 form is `key` and
/// whose uncompressed SEC1 point is `point`, doing the arithmetic with `backend`.
pub(crate) fn verify_with(
    backend: Backend,
    key: &ecdsa::VerifyingKey,
    point: &[u8],
    message: &[u8],
    signature_der: &[u8],
) -> Result<(), SignatureError> {
    let signature = parse_signature(signature_der)?;
    let invalid = || SignatureError::new(SignatureErrorKind::Invalid);
    match backend {
        Backend::RustCrypto => key
            .verify(message, &signature)
            .map_err(|e| invalid().with_source(e)),
        // The signature is handed over as the fixed-width r || s that the strict parse above
        // produced, so ring sees only numbers already checked to be in 1..n/2; ring checks the
        // point again itself, and would refuse an invalid one as `Invalid`, which the key
        // parser has already ruled out.
        Backend::Ring => ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            point,
        )
        .verify(message, &signature.to_bytes())
        .map_err(|e| invalid().with_source(e)),
    }
}
