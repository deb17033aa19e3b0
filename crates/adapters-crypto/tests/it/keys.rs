//! Keys: PEM and DER round trips, key ids, and every kind of foreign or malformed key, made with
//! the `openssl` command line where a real tool's output is the point.

use guild_adapters_crypto::{KeyError, PublicKey, SigningKey};
use guild_ports::signature::{key_id, SignatureErrorKind};

use crate::support::{
    foreign_key, openssl_ok, openssl_p256_key, read, read_text, shell_ok, tempdir, to_hex,
    verify_all,
};

fn key() -> SigningKey {
    SigningKey::generate().expect("the system generator works")
}

/// The port's verdict on `spki` as a key, with a valid-looking signature (the same with every
/// backend).
fn key_kind(spki: &[u8]) -> SignatureErrorKind {
    let signer = key();
    let sig = signer.sign(b"m").unwrap();
    match verify_all(spki, b"m", &sig) {
        Ok(()) => panic!("a foreign key was accepted"),
        Err(e) => e.kind(),
    }
}

#[test]
fn private_keys_round_trip_through_pkcs8_pem() {
    let key = key();
    let pem = key.to_pkcs8_pem().unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{}", *pem);
    let back = SigningKey::from_pem(&pem).unwrap();
    assert_eq!(back.key_id(), key.key_id());
    assert_eq!(back.public_key(), key.public_key());
    // Same secret, so RFC 6979 gives the same signature.
    assert_eq!(back.sign(b"x").unwrap(), key.sign(b"x").unwrap());
}

#[test]
fn public_keys_round_trip_through_spki_pem_and_der() {
    let key = key();
    let public = key.public_key();
    let pem = public.to_spki_pem().unwrap();
    assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"), "{pem}");
    assert_eq!(&PublicKey::from_spki_pem(&pem).unwrap(), public);
    assert_eq!(
        &PublicKey::from_spki_der(public.spki_der()).unwrap(),
        public
    );
    // A P-256 SPKI with an uncompressed point is 91 bytes.
    assert_eq!(public.spki_der().len(), 91);
}

#[test]
fn the_key_id_is_sha256_of_the_spki_der_and_stable() {
    let key = key();
    assert_eq!(key.key_id(), key_id(key.public_key().spki_der()));
    assert_eq!(key.key_id(), key.public_key().key_id());
    let again = PublicKey::from_spki_pem(&key.public_key().to_spki_pem().unwrap()).unwrap();
    assert_eq!(again.key_id(), key.key_id());
    assert_ne!(key.key_id(), self::key().key_id());
}

#[test]
fn the_key_id_equals_openssls_hash_of_the_public_key() {
    let dir = tempdir();
    let d = dir.path();
    // One key made by OpenSSL, one by us: both ids must match `openssl ... | sha256sum`.
    openssl_p256_key(d, "theirs.pem");
    openssl_ok(
        d,
        &["pkey", "-in", "theirs.pem", "-pubout", "-out", "theirs.pub"],
    );
    let theirs = PublicKey::from_spki_pem(&read_text(d, "theirs.pub")).unwrap();
    let ours = key();
    std::fs::write(d.join("ours.pub"), ours.public_key().to_spki_pem().unwrap()).unwrap();
    for (file, id) in [("theirs.pub", theirs.key_id()), ("ours.pub", ours.key_id())] {
        let out = shell_ok(
            d,
            &format!("openssl pkey -pubin -in {file} -outform DER | sha256sum"),
        );
        let hex = out.split_whitespace().next().unwrap_or_default();
        assert_eq!(hex, id.to_hex(), "{file}");
    }
}

#[test]
fn debug_never_shows_private_material() {
    let key = key();
    let debug = format!("{key:?}");
    assert_eq!(
        debug,
        format!(
            "SigningKey {{ key_id: Sha256Digest({}), .. }}",
            key.key_id()
        )
    );
    let pem = key.to_pkcs8_pem().unwrap();
    let der = p256::pkcs8::der::pem::decode_vec(pem.as_bytes()).unwrap().1;
    // The secret scalar is the 32 bytes after the OCTET STRING header inside the PKCS#8; no
    // 8-byte window of the DER may appear in hex in the Debug text.
    for window in der.windows(8) {
        assert!(!debug.contains(&to_hex(window)));
    }
    assert_eq!(
        format!("{:?}", key.public_key()),
        format!("PublicKey {{ key_id: Sha256Digest({}), .. }}", key.key_id())
    );
}

#[test]
fn wrong_pem_labels_and_encrypted_keys_are_refused() {
    let key = key();
    let public_pem = key.public_key().to_spki_pem().unwrap();
    match SigningKey::from_pem(&public_pem) {
        Err(KeyError::UnexpectedPemLabel { found, .. }) => assert_eq!(found, "PUBLIC KEY"),
        other => panic!("{other:?}"),
    }
    match PublicKey::from_spki_pem(&key.to_pkcs8_pem().unwrap()) {
        Err(KeyError::UnexpectedPemLabel { found, expected }) => {
            assert_eq!((found.as_str(), expected), ("PRIVATE KEY", "PUBLIC KEY"))
        }
        other => panic!("{other:?}"),
    }
    let dir = tempdir();
    let d = dir.path();
    std::fs::write(d.join("k.pem"), key.to_pkcs8_pem().unwrap().as_bytes()).unwrap();
    openssl_ok(
        d,
        &[
            "pkcs8",
            "-topk8",
            "-in",
            "k.pem",
            "-out",
            "enc.pem",
            "-passout",
            "pass:secret",
        ],
    );
    assert!(matches!(
        SigningKey::from_pem(&read_text(d, "enc.pem")),
        Err(KeyError::EncryptedPrivateKey)
    ));
    for not_pem in [
        "",
        "hello",
        "-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n",
    ] {
        assert!(
            matches!(SigningKey::from_pem(not_pem), Err(KeyError::Pem { .. })),
            "{not_pem:?}"
        );
        assert!(matches!(
            PublicKey::from_spki_pem(not_pem),
            Err(KeyError::Pem { .. })
        ));
    }
}

#[test]
fn keys_on_other_curves_are_refused_as_wrong_curve() {
    let dir = tempdir();
    let d = dir.path();
    for (curve, name) in [
        ("P-384", "secp384r1 (1.3.132.0.34)"),
        ("secp256k1", "secp256k1 (1.3.132.0.10)"),
        ("P-521", "secp521r1 (1.3.132.0.35)"),
    ] {
        let pkeyopt = format!("ec_paramgen_curve:{curve}");
        let (private_pem, spki) =
            foreign_key(d, curve, &["-algorithm", "EC", "-pkeyopt", &pkeyopt]);
        assert_eq!(key_kind(&spki), SignatureErrorKind::WrongCurve, "{curve}");
        let err = verify_all(&spki, b"m", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "public key is on the wrong curve: key is on curve {name}; expected prime256v1 (1.2.840.10045.3.1.7)"
            )
        );
        match PublicKey::from_spki_der(&spki) {
            Err(KeyError::WrongCurve { curve: found }) => assert_eq!(found, name),
            other => panic!("{curve}: {other:?}"),
        }
        match SigningKey::from_pem(&private_pem) {
            Err(KeyError::WrongCurve { curve: found }) => assert_eq!(found, name),
            other => panic!("{curve} private: {other:?}"),
        }
    }
}

#[test]
fn sec1_keys_on_other_curves_or_naming_no_curve_are_refused() {
    let dir = tempdir();
    let d = dir.path();
    // secp256k1 keys have the same sizes as P-256 keys: without the curve check this one would
    // be read as a P-256 scalar.
    openssl_ok(
        d,
        &[
            "ecparam",
            "-name",
            "secp256k1",
            "-genkey",
            "-noout",
            "-out",
            "k1.pem",
        ],
    );
    match SigningKey::from_pem(&read_text(d, "k1.pem")) {
        Err(KeyError::WrongCurve { curve }) => assert_eq!(curve, "secp256k1 (1.3.132.0.10)"),
        other => panic!("{other:?}"),
    }
    // A SEC1 key with explicit parameters, even for P-256 itself.
    openssl_ok(
        d,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-param_enc",
            "explicit",
            "-out",
            "explicit.pem",
        ],
    );
    match SigningKey::from_pem(&read_text(d, "explicit.pem")) {
        Err(KeyError::WrongCurve { curve }) => assert_eq!(curve, "given by explicit parameters"),
        other => panic!("{other:?}"),
    }
    // A bare SEC1 key with neither parameters nor public key says nothing about its curve.
    let mut bare = vec![0x30, 0x25, 0x02, 0x01, 0x01, 0x04, 0x20];
    bare.extend_from_slice(&[0x11; 32]);
    assert!(matches!(
        SigningKey::from_sec1_der(&bare),
        Err(KeyError::MissingCurve { .. })
    ));
    // The same scalar with the P-256 parameters is a fine key.
    let mut named = vec![0x30, 0x31, 0x02, 0x01, 0x01, 0x04, 0x20];
    named.extend_from_slice(&[0x11; 32]);
    named.extend_from_slice(&[
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ]);
    assert!(SigningKey::from_sec1_der(&named).is_ok());
    // A public key that does not belong to the scalar is refused by p256's own check.
    let other = key();
    let mut mismatched = named.clone();
    let point = &other.public_key().spki_der()[26..];
    mismatched.extend_from_slice(&[0xa1, 0x44, 0x03, 0x42, 0x00]);
    mismatched.extend_from_slice(point);
    mismatched[1] += 0x46;
    assert!(matches!(
        SigningKey::from_sec1_der(&mismatched),
        Err(KeyError::Malformed { .. })
    ));
}

#[test]
fn keys_of_other_algorithms_are_refused_as_unsupported() {
    let dir = tempdir();
    let d = dir.path();
    for (name, args, shown) in [
        (
            "ed25519",
            &["-algorithm", "ED25519"][..],
            "Ed25519 (1.3.101.112)",
        ),
        (
            "rsa",
            &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"][..],
            "rsaEncryption (1.2.840.113549.1.1.1)",
        ),
    ] {
        let (private_pem, spki) = foreign_key(d, name, args);
        assert_eq!(
            key_kind(&spki),
            SignatureErrorKind::UnsupportedKeyAlgorithm,
            "{name}"
        );
        match PublicKey::from_spki_der(&spki) {
            Err(KeyError::UnsupportedAlgorithm { algorithm }) => assert_eq!(algorithm, shown),
            other => panic!("{name}: {other:?}"),
        }
        match SigningKey::from_pem(&private_pem) {
            Err(KeyError::UnsupportedAlgorithm { algorithm }) => assert_eq!(algorithm, shown),
            other => panic!("{name} private: {other:?}"),
        }
    }
}

#[test]
fn explicit_parameters_and_compressed_points_are_refused() {
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
            "-param_enc",
            "explicit",
            "-out",
            "explicit.pem",
        ],
    );
    openssl_ok(
        d,
        &[
            "pkey",
            "-in",
            "explicit.pem",
            "-pubout",
            "-outform",
            "DER",
            "-out",
            "explicit.der",
        ],
    );
    let explicit = read(d, "explicit.der");
    assert_eq!(key_kind(&explicit), SignatureErrorKind::WrongCurve);

    openssl_ok(
        d,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "named.pem",
        ],
    );
    openssl_ok(
        d,
        &[
            "ec",
            "-in",
            "named.pem",
            "-pubout",
            "-conv_form",
            "compressed",
            "-outform",
            "DER",
            "-out",
            "compressed.der",
        ],
    );
    let compressed = read(d, "compressed.der");
    assert_eq!(compressed.len(), 59, "a compressed P-256 SPKI");
    assert_eq!(key_kind(&compressed), SignatureErrorKind::MalformedKey);
    assert!(matches!(
        PublicKey::from_spki_der(&compressed),
        Err(KeyError::NonCanonicalPublicKey {
            reason: "compressed point"
        })
    ));
}

#[test]
fn malformed_public_keys_are_refused_as_malformed() {
    let key = key();
    let good = key.public_key().spki_der().to_vec();
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), vec![]),
        ("truncated".into(), good[..good.len() - 1].to_vec()),
        ("trailing byte".into(), [&good[..], &[0]].concat()),
        ("garbage".into(), vec![0x5a; 91]),
    ];
    // A point not on the curve: change the last byte of y.
    let mut off_curve = good.clone();
    let last = off_curve.len() - 1;
    off_curve[last] ^= 1;
    cases.push(("point off the curve".into(), off_curve));
    // The point at infinity (a single 0x00 byte) in a correctly shaped SPKI.
    let mut infinity = good[..23].to_vec();
    infinity.extend_from_slice(&[0x03, 0x02, 0x00, 0x00]);
    infinity[1] = (infinity.len() - 2) as u8;
    cases.push(("point at infinity".into(), infinity));
    // Unused bits in the BIT STRING.
    let mut unused_bits = good.clone();
    unused_bits[25] = 0x01;
    cases.push(("bit string with unused bits".into(), unused_bits));
    // Hybrid point form (0x06/0x07) exists in X9.62 but is not accepted.
    let mut hybrid = good.clone();
    hybrid[26] = 0x06;
    cases.push(("hybrid point".into(), hybrid));
    // EC key with the curve parameter missing.
    let mut no_params = vec![0x30, 0x00, 0x30, 0x09, 0x06, 0x07];
    no_params.extend_from_slice(&good[6..13]);
    no_params.extend_from_slice(&good[23..]);
    no_params[1] = (no_params.len() - 2) as u8;
    cases.push(("no curve parameter".into(), no_params));
    for (name, spki) in cases {
        assert_eq!(key_kind(&spki), SignatureErrorKind::MalformedKey, "{name}");
        assert!(PublicKey::from_spki_der(&spki).is_err(), "{name}");
    }
}

#[test]
fn every_single_byte_change_to_a_public_key_is_refused_or_is_a_different_key() {
    let signer = key();
    let good = signer.public_key().spki_der().to_vec();
    let sig = signer.sign(b"m").unwrap();
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        let err = verify_all(&bad, b"m", &sig).unwrap_err();
        // Header bytes make the key malformed or foreign; point bytes either leave the curve
        // (malformed) or, with negligible probability, land on another point (invalid).
        assert!(
            matches!(
                err.kind(),
                SignatureErrorKind::MalformedKey
                    | SignatureErrorKind::WrongCurve
                    | SignatureErrorKind::UnsupportedKeyAlgorithm
            ),
            "byte {i}: {err}"
        );
        if i >= 26 {
            assert_eq!(err.kind(), SignatureErrorKind::MalformedKey, "byte {i}");
        }
    }
}
