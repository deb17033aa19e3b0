//! Signing fleet documents (a fleet root or policy, [`guild_domain::fleet`]) one holder at a
//! time, and checking their signatures for the domain's threshold rules.

use guild_domain::fleet::{FleetDocument, Signed};
use guild_domain::manifest::{SignatureAlgorithm, SignatureEntry};
use guild_domain::trust::SignatureCheck;
use guild_ports::signature::SignatureVerifier;

use crate::{KeyError, P256Verifier, SigningKey};

/// Signs `document`'s signed bytes ([`Signed::signed_bytes`]) with `key` and returns the
/// entry that [`Signed::with_signature`] adds: the key's id, ECDSA P-256 / SHA-256, and the
/// DER signature (low-S). Signing needs no other holder's key and does not change the
/// document's digest.
pub fn sign_document<T: FleetDocument>(
    document: &Signed<T>,
    key: &SigningKey,
) -> Result<SignatureEntry, KeyError> {
    Ok(SignatureEntry {
        key_id: key.key_id(),
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature: key.sign(document.signed_bytes())?,
    })
}

/// The domain's signature check (fleet thresholds, package authentication) done by this
/// verifier, with the same strictness as the port.
impl SignatureCheck for P256Verifier {
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        SignatureVerifier::verify(self, spki_der, message, signature).map_err(|e| e.to_string())
    }
}
