//! The verifier: ECDSA P-256 over SHA-256, strict DER, low-S only.

use guild_ports::signature::{SignatureError, SignatureErrorKind, SignatureVerifier};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{self, Signature};

use crate::keys::{PublicKey, MAX_SIGNATURE_DER_BYTES};

/// Verifies `ecdsa-p256-sha256` signatures for the [`SignatureVerifier`] port.
///
/// The key must be a canonical P-256 SubjectPublicKeyInfo (see [`PublicKey::from_spki_der`]);
/// the signature must be strict DER with both numbers in range and `s` in low form; the message
/// is hashed with SHA-256. It holds no state, so one value serves every thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct P256Verifier;

impl P256Verifier {
    /// A verifier.
    pub const fn new() -> Self {
        P256Verifier
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
        key.verify(message, signature_der)
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

/// Verifies `signature_der` over SHA-256(`message`) with `key`.
pub(crate) fn verify_with(
    key: &ecdsa::VerifyingKey,
    message: &[u8],
    signature_der: &[u8],
) -> Result<(), SignatureError> {
    let signature = parse_signature(signature_der)?;
    key.verify(message, &signature)
        .map_err(|e| SignatureError::new(SignatureErrorKind::Invalid).with_source(e))
}
