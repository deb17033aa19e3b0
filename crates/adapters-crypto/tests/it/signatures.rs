//! Signing and verifying: round trips, every byte of a message and of a signature tampered,
//! the wrong key, the high-S twin, and malformed signatures, each checked for its exact kind.

use std::collections::BTreeMap;

use guild_adapters_crypto::{Backend, P256Verifier, SigningKey, MAX_SIGNATURE_DER_BYTES};
use guild_ports::signature::{SignatureErrorKind, SignatureVerifier};
use p256::ecdsa::signature::{Signer, Verifier};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};

use crate::support::{
    canonical_payload, der_signature, model, parse_strict, sub, verdict, verify_all, Garbage,
    Verdict, HALF_N, N,
};

fn key() -> SigningKey {
    SigningKey::generate().expect("the system generator works")
}

fn message_200() -> Vec<u8> {
    (0..200u32).map(|i| (i * 7 + 3) as u8).collect()
}

/// Verifies through the port, as the app will, with every backend (which must agree).
fn check(key: &SigningKey, message: &[u8], signature: &[u8]) -> Verdict {
    verdict(verify_all(key.public_key().spki_der(), message, signature))
}

#[test]
fn a_signature_round_trips_over_a_canonical_payload() {
    let key = key();
    let payload = canonical_payload(4096);
    let sig = key.sign(&payload).unwrap();
    assert_eq!(check(&key, &payload, &sig), Verdict::Valid);
    // The same check without re-parsing the key agrees.
    assert_eq!(key.public_key().verify(&payload, &sig).ok(), Some(()));
    // The empty message is a message like any other.
    let empty_sig = key.sign(b"").unwrap();
    assert_eq!(check(&key, b"", &empty_sig), Verdict::Valid);
    assert_eq!(check(&key, b"\0", &empty_sig), Verdict::Invalid);
}

#[test]
fn signing_is_deterministic_and_always_low_s() {
    let key = key();
    // Raw ECDSA gives high S about half the time; without normalisation some of these 64
    // signatures would be high-S (the chance that none is, is 2^-64).
    let raw_key = p256::ecdsa::SigningKey::from_pkcs8_der(
        &p256::pkcs8::der::pem::decode_vec(key.to_pkcs8_pem().unwrap().as_bytes())
            .unwrap()
            .1,
    )
    .unwrap();
    let mut raw_high = 0;
    for i in 0..64u32 {
        let message = format!("message {i}");
        let sig = key.sign(message.as_bytes()).unwrap();
        assert_eq!(sig, key.sign(message.as_bytes()).unwrap(), "RFC 6979");
        let (_, s) = parse_strict(&sig).expect("strict DER");
        assert!(s <= HALF_N, "signature {i} is high-S");
        assert_eq!(check(&key, message.as_bytes(), &sig), Verdict::Valid);
        let raw: p256::ecdsa::Signature = raw_key.sign(message.as_bytes());
        if raw.normalize_s().is_some() {
            raw_high += 1;
        }
    }
    assert!(
        raw_high > 0,
        "no raw signature was high-S; normalisation untested"
    );
}

#[test]
fn flipping_any_byte_of_the_message_invalidates_the_signature() {
    let key = key();
    let message = message_200();
    let sig = key.sign(&message).unwrap();
    assert_eq!(check(&key, &message, &sig), Verdict::Valid);
    for i in 0..message.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut tampered = message.clone();
            tampered[i] ^= mask;
            assert_eq!(
                check(&key, &tampered, &sig),
                Verdict::Invalid,
                "byte {i} ^ {mask:#04x}"
            );
        }
    }
    // Dropping or adding a byte is tampering too.
    assert_eq!(check(&key, &message[..199], &sig), Verdict::Invalid);
    let mut longer = message.clone();
    longer.push(0);
    assert_eq!(check(&key, &longer, &sig), Verdict::Invalid);
}

#[test]
fn flipping_any_byte_of_the_signature_is_refused_with_the_kind_the_model_predicts() {
    let key = key();
    let message = message_200();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    // Several signatures, so that both padded (33-byte) and unpadded integers are covered.
    for round in 0..8u8 {
        let mut message = message.clone();
        message[0] = round;
        let sig = key.sign(&message).unwrap();
        for i in 0..sig.len() {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut tampered = sig.clone();
                tampered[i] ^= mask;
                let expected = model(&tampered, &sig);
                assert_ne!(expected, Verdict::Valid);
                let got = check(&key, &message, &tampered);
                assert_eq!(
                    got,
                    expected,
                    "round {round}, byte {i} ^ {mask:#04x}: {}",
                    crate::support::to_hex(&tampered)
                );
                *seen.entry(format!("{got:?}")).or_default() += 1;
            }
        }
    }
    // Both header damage (malformed) and number damage (invalid) must have been exercised.
    assert!(seen.get("Malformed").copied().unwrap_or(0) > 50, "{seen:?}");
    assert!(seen.get("Invalid").copied().unwrap_or(0) > 50, "{seen:?}");
}

#[test]
fn a_signature_by_another_key_is_invalid() {
    let signer = key();
    let other = key();
    let message = message_200();
    let sig = signer.sign(&message).unwrap();
    assert_eq!(check(&other, &message, &sig), Verdict::Invalid);
    assert_eq!(check(&signer, &message, &sig), Verdict::Valid);
}

#[test]
fn the_high_s_twin_of_a_valid_signature_is_refused_as_high_s() {
    let key = key();
    let message = message_200();
    for round in 0..16u8 {
        let mut message = message.clone();
        message[1] = round;
        let sig = key.sign(&message).unwrap();
        let (r, s) = parse_strict(&sig).expect("strict DER");
        let twin = der_signature(&r, &sub(&N, &s));
        assert_eq!(check(&key, &message, &sig), Verdict::Valid);
        let err = verify_all(key.public_key().spki_der(), &message, &twin).unwrap_err();
        assert_eq!(err.kind(), SignatureErrorKind::HighS, "{err}");
        assert_eq!(
            err.to_string(),
            "signature is in high-S form: s is above n/2; only the low-S form n - s is accepted"
        );
        // The twin really is a valid ECDSA signature: p256 without the low-S rule accepts it,
        // so the refusal comes from the rule and not from a broken twin.
        let raw = p256::ecdsa::Signature::from_der(&twin).unwrap();
        let vk =
            p256::ecdsa::VerifyingKey::from_public_key_der(key.public_key().spki_der()).unwrap();
        assert!(vk.verify(&message, &raw).is_ok());
    }
}

#[test]
fn truncated_extended_empty_and_oversized_signatures_are_malformed() {
    let key = key();
    let message = message_200();
    let sig = key.sign(&message).unwrap();
    for len in 0..sig.len() {
        let err = verify_all(key.public_key().spki_der(), &message, &sig[..len]).unwrap_err();
        assert_eq!(
            err.kind(),
            SignatureErrorKind::MalformedSignature,
            "prefix {len}"
        );
    }
    let empty = verify_all(key.public_key().spki_der(), &message, b"").unwrap_err();
    assert_eq!(empty.to_string(), "signature is malformed: it is empty");
    for extra in [&[0u8][..], &[0, 0], &[0x30, 0x00]] {
        let mut longer = sig.clone();
        longer.extend_from_slice(extra);
        assert_eq!(check(&key, &message, &longer), Verdict::Malformed);
    }
    let huge = vec![0x30; MAX_SIGNATURE_DER_BYTES + 1];
    let err = verify_all(key.public_key().spki_der(), &message, &huge).unwrap_err();
    assert_eq!(err.kind(), SignatureErrorKind::MalformedSignature);
    assert_eq!(
        err.to_string(),
        "signature is malformed: it is 73 bytes; a P-256 signature is at most 72"
    );
}

#[test]
fn garbage_signatures_are_refused_as_the_model_predicts() {
    let key = key();
    let message = message_200();
    let valid = key.sign(&message).unwrap();
    let mut g = Garbage::new(0x5eed);
    for len in 1..=80usize {
        for _ in 0..8 {
            let garbage = g.bytes(len);
            assert_eq!(
                check(&key, &message, &garbage),
                model(&garbage, &valid),
                "{}",
                crate::support::to_hex(&garbage)
            );
        }
    }
    // Garbage with a plausible header: SEQUENCE of two random integers in range, half of them
    // with s in the high half. These parse, and must then be refused as high-S or invalid.
    let mut kinds = [0usize; 2];
    for i in 0..64 {
        let (r, mut s) = g.r_and_s();
        if i % 2 == 1 {
            s = sub(&N, &s);
        }
        let candidate = der_signature(&r, &s);
        let expected = model(&candidate, &valid);
        kinds[usize::from(expected == Verdict::HighS)] += 1;
        assert_eq!(check(&key, &message, &candidate), expected);
    }
    assert_eq!(kinds, [32, 32], "[invalid, high-S]");
}

#[test]
fn non_der_encodings_of_a_valid_signature_are_malformed() {
    let key = key();
    let message = message_200();
    let sig = key.sign(&message).unwrap();
    let (r, s) = parse_strict(&sig).unwrap();
    let int = |v: &[u8; 32]| crate::support::der_integer(v);

    // BER long-form length on the outer SEQUENCE.
    let mut long_form = vec![0x30, 0x81, sig[1]];
    long_form.extend_from_slice(&sig[2..]);
    // An integer padded with a needless zero byte.
    let mut padded_r = int(&r);
    padded_r[1] += 1;
    padded_r.insert(2, 0);
    let mut body = padded_r;
    body.extend(int(&s));
    let mut padded = vec![0x30, body.len() as u8];
    padded.extend(body);
    // Indefinite length.
    let mut indefinite = vec![0x30, 0x80];
    indefinite.extend_from_slice(&sig[2..]);
    indefinite.extend_from_slice(&[0, 0]);
    // r and s swapped order is well formed but wrong; r = 0, s = 0, s = n and r = n are out of
    // range; raw r || s (the IEEE P1363 form) is not DER.
    let zero = [0u8; 32];
    let mut raw = r.to_vec();
    raw.extend_from_slice(&s);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("long-form length", long_form),
        ("padded integer", padded),
        ("indefinite length", indefinite),
        ("r = 0", der_signature(&zero, &s)),
        ("s = 0", der_signature(&r, &zero)),
        ("s = n", der_signature(&r, &N)),
        ("r = n", der_signature(&N, &s)),
        ("P1363 r || s", raw),
        ("SET instead of SEQUENCE", {
            let mut v = sig.clone();
            v[0] = 0x31;
            v
        }),
    ];
    for (name, bad) in cases {
        assert_eq!(model(&bad, &sig), Verdict::Malformed, "model: {name}");
        let err = verify_all(key.public_key().spki_der(), &message, &bad).unwrap_err();
        assert_eq!(err.kind(), SignatureErrorKind::MalformedSignature, "{name}");
    }
}

#[test]
fn the_verifier_is_shareable_across_threads() {
    let key = key();
    let message = message_200();
    let sig = key.sign(&message).unwrap();
    for backend in Backend::ALL {
        let verifier: std::sync::Arc<dyn SignatureVerifier> =
            std::sync::Arc::new(P256Verifier::with_backend(backend));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let v = verifier.clone();
                let spki = key.public_key().spki_der().to_vec();
                let (m, s) = (message.clone(), sig.clone());
                std::thread::spawn(move || v.verify(&spki, &m, &s).is_ok())
            })
            .collect();
        for h in handles {
            assert!(h.join().unwrap(), "{}", backend.name());
        }
    }
}
