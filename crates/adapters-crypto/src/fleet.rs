//! Signing fleet documents (a fleet root or policy, [`guild_domain::fleet`]) one holder at a
//! time. The domain's threshold rules count them through its `SignatureCheck`, which callers
//! bridge to [`crate::P256Verifier`] as they do for packages.

use crate::{KeyError, SigningKey};
use guild_domain::fleet::{FleetDocument, Signed};
use guild_domain::manifest::{SignatureAlgorithm, SignatureEntry};

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
