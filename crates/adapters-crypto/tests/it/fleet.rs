//! Fleet documents signed one holder at a time with [`sign_document`] and counted by the
//! domain's threshold rules through [`P256Verifier`].

use guild_adapters_crypto::{sign_document, P256Verifier, SigningKey};
use guild_domain::fleet::{verify_root_self, FleetRoot, RootError, SignedRoot};
use guild_domain::ids::FleetId;
use guild_domain::trust::{SignatureCheck, TrustedKey};
use guild_ports::signature::SignatureVerifier;

/// The domain's signature check by the adapter's verifier, as the host bridges it.
struct Check(P256Verifier);

impl SignatureCheck for Check {
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        SignatureVerifier::verify(&self.0, spki_der, message, signature).map_err(|e| e.to_string())
    }
}

fn root_of(keys: &[&SigningKey], threshold: usize) -> SignedRoot {
    let keys = keys
        .iter()
        .map(|k| TrustedKey {
            key_id: k.key_id(),
            spki_der: k.public_key().spki_der().to_vec(),
        })
        .collect();
    SignedRoot::new(&FleetRoot {
        fleet: FleetId::new("example.prod").unwrap(),
        version: 1,
        expires: 4_000_000_000,
        threshold,
        keys,
    })
    .unwrap()
}

#[test]
fn two_holders_signing_in_turn_meet_a_threshold_of_two() {
    let (a, b, c) = (
        SigningKey::generate().unwrap(),
        SigningKey::generate().unwrap(),
        SigningKey::generate().unwrap(),
    );
    let unsigned = root_of(&[&a, &b, &c], 2);
    let digest = unsigned.digest();
    let check = Check(P256Verifier::new());

    // The first holder signs the file as written; one signature is short of the threshold.
    let entry = sign_document(&unsigned, &a).unwrap();
    let once = unsigned.with_signature(entry).unwrap();
    assert_eq!(once.digest(), digest);
    let Err(RootError::Threshold(short)) = verify_root_self(&once, &check) else {
        panic!("one signature met a threshold of two");
    };
    assert_eq!(short.valid.len(), 1);
    assert!(short.valid.contains(&a.key_id()));

    // The second signs the file the first handed on, read back from its text.
    let handed_on = SignedRoot::parse(once.to_json().as_bytes()).unwrap();
    let entry = sign_document(&handed_on, &b).unwrap();
    let twice = handed_on.with_signature(entry).unwrap();
    assert_eq!(twice.digest(), digest);
    let verified = verify_root_self(&twice, &check).expect("two of three signed");
    assert_eq!(verified.digest(), digest);

    // A key outside the root never counts, however many sign.
    let outsider = SigningKey::generate().unwrap();
    let entry = sign_document(&once, &outsider).unwrap();
    let with_outsider = once.with_signature(entry).unwrap();
    assert!(verify_root_self(&with_outsider, &check).is_err());
}

#[test]
fn a_signature_over_other_bytes_does_not_count() {
    let (a, b) = (
        SigningKey::generate().unwrap(),
        SigningKey::generate().unwrap(),
    );
    let root = root_of(&[&a, &b], 2);
    let other = root_of(&[&a, &b], 1);
    // b's signature is over another document.
    let signed = root
        .clone()
        .with_signature(sign_document(&root, &a).unwrap())
        .unwrap()
        .with_signature(sign_document(&other, &b).unwrap())
        .unwrap();
    let Err(RootError::Threshold(e)) = verify_root_self(&signed, &Check(P256Verifier::new()))
    else {
        panic!("a signature over other bytes counted");
    };
    assert_eq!(e.refused.len(), 1);
    assert_eq!(e.refused[0].0, b.key_id());
}
