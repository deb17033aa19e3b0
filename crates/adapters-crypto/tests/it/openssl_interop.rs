//! Interoperability with the `openssl` command line, in both directions: keys OpenSSL makes sign
//! messages we verify, signatures we make verify with `openssl dgst`, OpenSSL reads the keys we
//! write, and OpenSSL's own signatures are accepted when low-S and refused when high-S.

use std::path::Path;

use guild_adapters_crypto::{PublicKey, SigningKey};
use guild_ports::signature::SignatureErrorKind;

use crate::support::{
    canonical_payload, der_signature, openssl, openssl_ok, openssl_p256_key, parse_strict, read,
    read_text, sub, tempdir, verify_all, HALF_N, N,
};

/// Whether `openssl dgst -sha256 -verify` accepts `sig` over `msg` with the public key `pub_pem`
/// (all file names in `d`). It must answer one way or the other; anything else fails the test.
fn openssl_verifies(d: &Path, pub_pem: &str, sig: &str, msg: &str) -> bool {
    let out = openssl(
        d,
        &[
            "dgst",
            "-sha256",
            "-verify",
            pub_pem,
            "-signature",
            sig,
            msg,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    match (out.status.success(), stdout.trim()) {
        (true, "Verified OK") => true,
        (false, "Verification failure") => false,
        _ => panic!(
            "unexpected answer from openssl dgst -verify ({}): {stdout} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Reads an OpenSSL-made private key, signs a canonical payload with it, and checks the result
/// with our verifier (through the port, with the public key exported by OpenSSL, with every
/// backend) and with OpenSSL.
fn sign_with_openssl_key(d: &Path, key_file: &str) {
    let key = SigningKey::from_pem(&read_text(d, key_file)).unwrap();
    openssl_ok(
        d,
        &[
            "pkey", "-in", key_file, "-pubout", "-outform", "DER", "-out", "pub.der",
        ],
    );
    openssl_ok(d, &["pkey", "-in", key_file, "-pubout", "-out", "pub.pem"]);
    let their_spki = read(d, "pub.der");
    assert_eq!(key.public_key().spki_der(), &their_spki[..]);

    let payload = canonical_payload(1024);
    let sig = key.sign(&payload).unwrap();
    verify_all(&their_spki, &payload, &sig).unwrap();

    std::fs::write(d.join("payload"), &payload).unwrap();
    std::fs::write(d.join("sig.der"), &sig).unwrap();
    assert!(openssl_verifies(d, "pub.pem", "sig.der", "payload"));
}

#[test]
fn a_pkcs8_key_made_by_openssl_genpkey_signs_and_we_verify() {
    let dir = tempdir();
    let d = dir.path();
    openssl_p256_key(d, "key.pem");
    assert!(read_text(d, "key.pem").starts_with("-----BEGIN PRIVATE KEY-----"));
    sign_with_openssl_key(d, "key.pem");
}

#[test]
fn a_sec1_key_made_by_openssl_ecparam_signs_and_we_verify() {
    let dir = tempdir();
    let d = dir.path();
    openssl_ok(
        d,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "key.pem",
        ],
    );
    assert!(read_text(d, "key.pem").starts_with("-----BEGIN EC PRIVATE KEY-----"));
    sign_with_openssl_key(d, "key.pem");
    // Without -noout, ecparam writes the parameters block first; that is read too.
    openssl_ok(
        d,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-out",
            "with_params.pem",
        ],
    );
    assert!(read_text(d, "with_params.pem").starts_with("-----BEGIN EC PARAMETERS-----"));
    sign_with_openssl_key(d, "with_params.pem");
}

#[test]
fn our_signatures_verify_with_openssl_dgst_and_tampering_fails_there_too() {
    let dir = tempdir();
    let d = dir.path();
    let key = SigningKey::generate().unwrap();
    std::fs::write(d.join("pub.pem"), key.public_key().to_spki_pem().unwrap()).unwrap();
    let payload = canonical_payload(4096);
    std::fs::write(d.join("payload"), &payload).unwrap();
    for i in 0..8u8 {
        let mut message = payload.clone();
        message.push(b' ' + i);
        std::fs::write(d.join("msg"), &message).unwrap();
        std::fs::write(d.join("sig.der"), key.sign(&message).unwrap()).unwrap();
        assert!(
            openssl_verifies(d, "pub.pem", "sig.der", "msg"),
            "message {i}"
        );
        // The same signature over the original payload must fail in OpenSSL as well, so the
        // check above is meaningful.
        assert!(!openssl_verifies(d, "pub.pem", "sig.der", "payload"));
    }
}

#[test]
fn openssl_reads_the_keys_we_write() {
    let dir = tempdir();
    let d = dir.path();
    let key = SigningKey::generate().unwrap();
    std::fs::write(d.join("priv.pem"), key.to_pkcs8_pem().unwrap().as_bytes()).unwrap();
    std::fs::write(d.join("pub.pem"), key.public_key().to_spki_pem().unwrap()).unwrap();

    // OpenSSL checks the private key (scalar range, public point) and describes its curve.
    let text = String::from_utf8(openssl_ok(
        d,
        &["pkey", "-in", "priv.pem", "-check", "-text", "-noout"],
    ))
    .unwrap();
    assert!(text.contains("ASN1 OID: prime256v1"), "{text}");
    assert!(text.contains("NIST CURVE: P-256"), "{text}");
    // The public key OpenSSL derives from our private key is, byte for byte, the one we write.
    let derived =
        String::from_utf8(openssl_ok(d, &["pkey", "-in", "priv.pem", "-pubout"])).unwrap();
    assert_eq!(derived, key.public_key().to_spki_pem().unwrap());
    // OpenSSL reads our public key PEM and re-encodes it to the same DER.
    let der = openssl_ok(d, &["pkey", "-pubin", "-in", "pub.pem", "-outform", "DER"]);
    assert_eq!(der, key.public_key().spki_der());
    // And a key OpenSSL signs with, read back from our PEM, produces signatures we accept.
    std::fs::write(d.join("msg"), b"hello").unwrap();
    openssl_ok(
        d,
        &[
            "dgst", "-sha256", "-sign", "priv.pem", "-out", "sig.der", "msg",
        ],
    );
    let sig = read(d, "sig.der");
    let (r, s) = parse_strict(&sig).expect("OpenSSL writes strict DER");
    let low = if s > HALF_N {
        der_signature(&r, &sub(&N, &s))
    } else {
        sig
    };
    verify_all(key.public_key().spki_der(), b"hello", &low).unwrap();
}

#[test]
fn openssl_signatures_are_accepted_when_low_s_and_refused_when_high_s() {
    let dir = tempdir();
    let d = dir.path();
    openssl_p256_key(d, "key.pem");
    let public = PublicKey::from_spki_pem(
        &String::from_utf8(openssl_ok(d, &["pkey", "-in", "key.pem", "-pubout"])).unwrap(),
    )
    .unwrap();
    let payload = canonical_payload(512);
    std::fs::write(d.join("payload"), &payload).unwrap();
    // OpenSSL picks a random nonce each time and does not normalise s, so each signature is
    // high-S with probability one half; 40 tries miss one of the cases with probability 2^-39.
    let (mut low, mut high) = (0, 0);
    for _ in 0..40 {
        openssl_ok(
            d,
            &[
                "dgst", "-sha256", "-sign", "key.pem", "-out", "sig.der", "payload",
            ],
        );
        let sig = read(d, "sig.der");
        let (r, s) = parse_strict(&sig).expect("OpenSSL writes strict DER");
        let result = verify_all(public.spki_der(), &payload, &sig);
        if s > HALF_N {
            high += 1;
            assert_eq!(result.unwrap_err().kind(), SignatureErrorKind::HighS);
            // Its low-S twin is the same signature in the accepted form.
            let twin = der_signature(&r, &sub(&N, &s));
            verify_all(public.spki_der(), &payload, &twin).unwrap();
        } else {
            low += 1;
            result.unwrap();
        }
        if low >= 2 && high >= 2 {
            break;
        }
    }
    assert!(
        low >= 1 && high >= 1,
        "saw {low} low-S and {high} high-S signatures"
    );
}
