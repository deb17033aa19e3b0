//! The two backends side by side. Every input the verifier refuses is refused by ring and by
//! p256 with the same kind and message, and the refusals that are this crate's rules rather than
//! ECDSA's (low S, one encoding per key and per signature) are made before any arithmetic: ring
//! by itself accepts a high-S twin, and the verifier built on it still refuses it.
//!
//! The other test files check the same agreement on every input they try, through
//! [`verify_all`]; this one lists the refusals the choice of backend must not change.

use guild_adapters_crypto::{Backend, P256Verifier, SigningKey};
use guild_ports::signature::{SignatureErrorKind, SignatureVerifier};

use crate::support::{
    der_signature, foreign_key, parse_strict, sub, tempdir, verify_all, Garbage, N,
};

fn key() -> SigningKey {
    SigningKey::generate().expect("the system generator works")
}

/// The uncompressed point of a canonical P-256 SubjectPublicKeyInfo: its last 65 bytes.
fn point(spki: &[u8]) -> &[u8] {
    assert_eq!(spki.len(), 91);
    &spki[26..]
}

/// A secp256k1 key's SubjectPublicKeyInfo, made by OpenSSL: a key of the same size and encoding
/// as a P-256 key, on another curve.
fn secp256k1_spki() -> Vec<u8> {
    let dir = tempdir();
    let pkeyopt = [
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:secp256k1",
    ];
    foreign_key(dir.path(), "k1", &pkeyopt).1
}

/// A name, a key, a message, a signature and the kind of refusal expected.
type Case = (&'static str, Vec<u8>, Vec<u8>, Vec<u8>, SignatureErrorKind);

#[test]
fn both_backends_refuse_the_same_inputs_with_the_same_kind_and_message() {
    let key = key();
    let message = b"the canonical payload".to_vec();
    let sig = key.sign(&message).unwrap();
    let good = key.public_key().spki_der().to_vec();
    let (r, s) = parse_strict(&sig).expect("strict DER");

    let mut long_outer = sig.clone();
    long_outer[1] += 1;
    let mut short_outer = sig.clone();
    short_outer[1] -= 1;
    let mut trailing = sig.clone();
    trailing.push(0);
    let mut p1363 = r.to_vec();
    p1363.extend_from_slice(&s);
    let mut off_curve = good.clone();
    off_curve[90] ^= 1;
    let mut infinity = good[..23].to_vec();
    infinity.extend_from_slice(&[0x03, 0x02, 0x00, 0x00]);
    infinity[1] = (infinity.len() - 2) as u8;
    let mut tampered = message.clone();
    tampered[0] ^= 1;

    use SignatureErrorKind::*;
    let with_sig = |name, signature: &[u8], kind| {
        (
            name,
            good.clone(),
            message.clone(),
            signature.to_vec(),
            kind,
        )
    };
    let with_key = |name, spki: Vec<u8>, kind| (name, spki, message.clone(), sig.clone(), kind);
    let cases: Vec<Case> = vec![
        with_sig("high-S twin", &der_signature(&r, &sub(&N, &s)), HighS),
        with_sig("outer length one too long", &long_outer, MalformedSignature),
        with_sig(
            "outer length one too short",
            &short_outer,
            MalformedSignature,
        ),
        with_sig("truncated", &sig[..sig.len() - 1], MalformedSignature),
        with_sig("trailing byte", &trailing, MalformedSignature),
        with_sig("empty", b"", MalformedSignature),
        with_sig("P1363 r || s", &p1363, MalformedSignature),
        with_sig("s = n", &der_signature(&r, &N), MalformedSignature),
        with_key("point off the curve", off_curve, MalformedKey),
        with_key("point at infinity", infinity, MalformedKey),
        with_key(
            "trailing byte after the key",
            [&good[..], &[0]].concat(),
            MalformedKey,
        ),
        with_key("secp256k1 key", secp256k1_spki(), WrongCurve),
        (
            "message changed",
            good.clone(),
            tampered,
            sig.clone(),
            Invalid,
        ),
        with_sig(
            "another key's signature",
            &signature_by_another_key(&message),
            Invalid,
        ),
    ];
    for (name, spki, message, signature, expected) in cases {
        let (spki, message, signature) = (&spki[..], &message[..], &signature[..]);
        let results: Vec<(Backend, SignatureErrorKind, String)> = Backend::ALL
            .iter()
            .map(|&b| {
                let err = P256Verifier::with_backend(b)
                    .verify(spki, message, signature)
                    .expect_err(name);
                (b, err.kind(), err.to_string())
            })
            .collect();
        for (backend, kind, text) in &results {
            assert_eq!(*kind, expected, "{name} with {}: {text}", backend.name());
            assert_eq!(text, &results[0].2, "{name}: the backends' messages differ");
        }
        // And the shared helper agrees (it also tries the key parsed once).
        assert_eq!(
            verify_all(spki, message, signature).unwrap_err().kind(),
            expected
        );
    }
}

/// A valid signature over `message` by a fresh key.
fn signature_by_another_key(message: &[u8]) -> Vec<u8> {
    key().sign(message).unwrap()
}

#[test]
fn low_s_is_this_crates_rule_and_holds_with_ring_as_the_backend() {
    let key = key();
    let spki = key.public_key().spki_der().to_vec();
    for round in 0..8u8 {
        let message = [b'm', round];
        let sig = key.sign(&message).unwrap();
        let (r, s) = parse_strict(&sig).unwrap();
        let twin = der_signature(&r, &sub(&N, &s));
        // ring by itself accepts both forms: ECDSA has no low-S rule.
        for form in [&sig, &twin] {
            ring::signature::UnparsedPublicKey::new(
                &ring::signature::ECDSA_P256_SHA256_ASN1,
                point(&spki),
            )
            .verify(&message, form)
            .expect("ring accepts the signature in either form");
        }
        // The verifier built on it accepts only the low form.
        let verifier = P256Verifier::new();
        assert_eq!(verifier.backend(), Backend::Ring);
        verifier.verify(&spki, &message, &sig).unwrap();
        let err = verifier.verify(&spki, &message, &twin).unwrap_err();
        assert_eq!(err.kind(), SignatureErrorKind::HighS);
    }
}

#[test]
fn both_backends_agree_over_many_keys_messages_and_random_signatures() {
    let mut g = Garbage::new(0xb4c6);
    let mut verdicts = [0usize; 2];
    for _ in 0..16 {
        let key = key();
        let spki = key.public_key().spki_der().to_vec();
        let len = 1 + (g.next_u64() % 5000) as usize;
        let message = g.bytes(len);
        let sig = key.sign(&message).unwrap();
        verify_all(&spki, &message, &sig).expect("a good signature verifies");
        verdicts[0] += 1;
        // Well-formed low-S numbers that are no signature: both must call them invalid.
        for _ in 0..4 {
            let (r, s) = g.r_and_s();
            let err = verify_all(&spki, &message, &der_signature(&r, &s)).unwrap_err();
            assert_eq!(err.kind(), SignatureErrorKind::Invalid);
            verdicts[1] += 1;
        }
    }
    assert_eq!(verdicts, [16, 64], "[valid, invalid]");
}
