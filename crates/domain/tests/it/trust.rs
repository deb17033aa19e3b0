//! Trust decisions: every refusal reason of `authenticate`, trust-store changes, and the strict,
//! fail-closed trust file.

use guild_domain::ids::{PublisherId, Sha256Digest};
use guild_domain::manifest::Metadata;
use guild_domain::trust::{
    authenticate, authenticate_by_key, AuthError, SignatureCheck, SignatureOutcome,
    TrustChangeError, TrustFileError, TrustStore,
};
use serde_json::json;
use std::cell::RefCell;

/// A stand-in for ECDSA: a "signature" is valid when it equals SHA-256(key || message). It
/// records the messages it was asked about, so tests can see which bytes were checked.
#[derive(Default)]
struct FakeCheck {
    seen: RefCell<Vec<Vec<u8>>>,
}

fn fake_sign(key: &[u8], message: &[u8]) -> Vec<u8> {
    Sha256Digest::of(&[key, message].concat()).0.to_vec()
}

impl SignatureCheck for FakeCheck {
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        self.seen.borrow_mut().push(message.to_vec());
        if fake_sign(spki_der, message) == signature {
            Ok(())
        } else {
            Err("signature mismatch".into())
        }
    }
}

fn publisher(s: &str) -> PublisherId {
    PublisherId::new(s).unwrap()
}

const KEY_A: &[u8] = b"spki-of-key-a";
const KEY_B: &[u8] = b"spki-of-key-b";

fn payload() -> serde_json::Value {
    json!({
        "package_id": "example.scan",
        "kind": "gkmodule",
        "version": "1.0.0",
        "publisher_id": "org.example",
        "kernel_abi": {"min": "1.0.0", "max": "1.0.0"},
        "module_abi": 1,
        "os": "linux",
        "arch": "x86_64",
        "backends": ["cpu"],
        "entry": "libscan.so",
        "artifacts": [{"path": "libscan.so", "size": 3, "sha256": "a".repeat(64)}],
        "provided_ops": ["example.scan.inclusive.cpu"]
    })
}

/// Metadata signed by the given (key, valid?) pairs.
fn metadata(signers: &[(&[u8], bool)]) -> Metadata {
    let unsigned = json!({"gkmetadata": 1, "payload": payload(), "signatures": []});
    let canonical = Metadata::parse(&serde_json::to_vec(&unsigned).unwrap())
        .unwrap()
        .canonical_payload()
        .to_vec();
    let sigs: Vec<_> = signers
        .iter()
        .map(|(key, valid)| {
            let mut sig = fake_sign(key, &canonical);
            if !valid {
                sig[0] ^= 1;
            }
            json!({
                "key_id": Sha256Digest::of(key).to_hex(),
                "algorithm": "ecdsa-p256-sha256",
                "signature": sig.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            })
        })
        .collect();
    let doc = json!({"gkmetadata": 1, "payload": payload(), "signatures": sigs});
    Metadata::parse(&serde_json::to_vec_pretty(&doc).unwrap()).unwrap()
}

fn trust_a() -> TrustStore {
    let mut t = TrustStore::new();
    t.add_key(publisher("org.example"), KEY_A.to_vec()).unwrap();
    t
}

#[test]
fn a_valid_signature_by_a_trusted_key_authenticates_over_the_canonical_bytes() {
    let m = metadata(&[(KEY_A, true)]);
    let check = FakeCheck::default();
    let auth = authenticate(&m, &trust_a(), &check).unwrap();
    assert_eq!(auth.publisher, publisher("org.example"));
    assert_eq!(auth.key_id, Sha256Digest::of(KEY_A));
    assert_eq!(auth.payload_digest, m.payload_digest());
    assert_eq!(*check.seen.borrow(), vec![m.canonical_payload().to_vec()]);
}

#[test]
fn a_later_valid_signature_is_enough() {
    let mut t = trust_a();
    t.add_key(publisher("org.example"), KEY_B.to_vec()).unwrap();
    // The earlier signature is by a key nobody trusts: ignored.
    let m = metadata(&[(b"unknown", true), (KEY_B, true)]);
    let auth = authenticate(&m, &t, &FakeCheck::default()).unwrap();
    assert_eq!(auth.key_id, Sha256Digest::of(KEY_B));
    assert_eq!(auth.signed_by, vec![Sha256Digest::of(KEY_B)]);
}

#[test]
fn multi_signature_every_verified_key_is_answered_in_file_order() {
    let mut t = trust_a();
    t.add_key(publisher("org.example"), KEY_B.to_vec()).unwrap();
    let m = metadata(&[(KEY_B, true), (KEY_A, true)]);
    let auth = authenticate(&m, &t, &FakeCheck::default()).unwrap();
    assert_eq!(auth.key_id, Sha256Digest::of(KEY_B));
    assert_eq!(
        auth.signed_by,
        vec![Sha256Digest::of(KEY_B), Sha256Digest::of(KEY_A)]
    );
}

/// What a lock requires: a valid signature by one named key. Another trusted key's signature,
/// an invalid one by the named key, or the named key revoked, do not count.
#[test]
fn authenticating_by_one_key_counts_only_that_keys_signature() {
    let mut t = trust_a();
    t.add_key(publisher("org.example"), KEY_B.to_vec()).unwrap();
    let check = FakeCheck::default();
    let (a, b) = (Sha256Digest::of(KEY_A), Sha256Digest::of(KEY_B));
    let both = metadata(&[(KEY_A, true), (KEY_B, true)]);
    assert_eq!(authenticate(&both, &t, &check).unwrap().key_id, a);
    assert_eq!(
        authenticate_by_key(&both, &t, &check, &b).unwrap().key_id,
        b
    );
    let only_a = metadata(&[(KEY_A, true)]);
    assert!(matches!(
        authenticate_by_key(&only_a, &t, &check, &b),
        Err(AuthError::NoValidSignature { attempts, .. }) if attempts.is_empty()
    ));
    let bad_b = metadata(&[(KEY_A, true), (KEY_B, false)]);
    assert!(authenticate_by_key(&bad_b, &t, &check, &b).is_err());
    t.revoke_key(b, "rotated");
    assert!(authenticate_by_key(&both, &t, &check, &b).is_err());
    assert_eq!(
        authenticate_by_key(&both, &t, &check, &a).unwrap().key_id,
        a
    );
}

#[test]
fn multi_signature_rotation_keeps_a_package_signed_by_old_and_new_key() {
    // The rotation: the old key A signed first, the new key B added its signature; the
    // operator trusts B, then revokes A.
    let old_and_new = metadata(&[(KEY_A, true), (KEY_B, true)]);
    let only_old = metadata(&[(KEY_A, true)]);
    let mut t = trust_a();
    t.add_key(publisher("org.example"), KEY_B.to_vec()).unwrap();
    assert!(t.revoke_key(Sha256Digest::of(KEY_A), "rotated"));
    let auth = authenticate(&old_and_new, &t, &FakeCheck::default()).unwrap();
    assert_eq!(auth.signed_by, vec![Sha256Digest::of(KEY_B)]);
    assert_eq!(
        authenticate(&only_old, &t, &FakeCheck::default()),
        Err(AuthError::NoValidSignature {
            publisher: publisher("org.example"),
            attempts: vec![(
                Sha256Digest::of(KEY_A),
                SignatureOutcome::KeyRevoked {
                    reason: "rotated".into()
                }
            )],
        })
    );
    // Before the new key is trusted, its signature is one by an unknown key: ignored.
    let auth = authenticate(&old_and_new, &trust_a(), &FakeCheck::default()).unwrap();
    assert_eq!(auth.signed_by, vec![Sha256Digest::of(KEY_A)]);
}

#[test]
fn multi_signature_a_bad_signature_under_a_trusted_key_refuses_the_package() {
    let mut t = trust_a();
    t.add_key(publisher("org.example"), KEY_B.to_vec()).unwrap();
    for m in [
        metadata(&[(KEY_A, false), (KEY_B, true)]),
        metadata(&[(KEY_B, true), (KEY_A, false)]),
    ] {
        assert_eq!(
            authenticate(&m, &t, &FakeCheck::default()),
            Err(AuthError::InvalidTrustedSignature {
                publisher: publisher("org.example"),
                key_id: Box::new(Sha256Digest::of(KEY_A)),
                reason: "signature mismatch".into(),
            })
        );
    }
    // A bad signature by a key that is unknown, revoked or another publisher's is ignored.
    let mut other = t.clone();
    other
        .add_key(publisher("org.other"), b"spki-of-key-c".to_vec())
        .unwrap();
    assert!(other.revoke_key(Sha256Digest::of(KEY_A), "rotated"));
    let m = metadata(&[
        (KEY_A, false),
        (b"unknown", false),
        (b"spki-of-key-c", false),
        (KEY_B, true),
    ]);
    let auth = authenticate(&m, &other, &FakeCheck::default()).unwrap();
    assert_eq!(auth.signed_by, vec![Sha256Digest::of(KEY_B)]);
}

/// The signers a property case draws from: two keys of the publisher (A and B), one of another
/// publisher, one nobody trusts.
const SIGNERS: [&[u8]; 4] = [KEY_A, KEY_B, b"spki-of-key-c", b"unknown"];

proptest::proptest! {
    /// Over any set of signers in any order, each signature valid or not, with A or B revoked
    /// or not: the package is authenticated exactly when some trusted, unrevoked key of the
    /// publisher signed validly and none signed invalidly, and the answer names exactly the
    /// valid ones in file order.
    #[test]
    fn multi_signature_decision_holds_in_any_order(
        order in proptest::strategy::Strategy::prop_shuffle(
            proptest::sample::subsequence(vec![0usize, 1, 2, 3], 0..=4)
        ),
        valid in proptest::collection::vec(proptest::bool::ANY, 4),
        revoked in proptest::collection::vec(proptest::bool::ANY, 2),
    ) {
        use proptest::{prop_assert, prop_assert_eq};
        let mut t = trust_a();
        t.add_key(publisher("org.example"), KEY_B.to_vec()).unwrap();
        t.add_key(publisher("org.other"), SIGNERS[2].to_vec()).unwrap();
        for (k, r) in [KEY_A, KEY_B].iter().zip(&revoked) {
            if *r {
                t.revoke_key(Sha256Digest::of(k), "test");
            }
        }
        let signers: Vec<(&[u8], bool)> = order.iter().map(|&i| (SIGNERS[i], valid[i])).collect();
        let m = metadata(&signers);
        let counts = |i: usize| i < 2 && !revoked[i];
        let good: Vec<Sha256Digest> = order
            .iter()
            .filter(|&&i| counts(i) && valid[i])
            .map(|&i| Sha256Digest::of(SIGNERS[i]))
            .collect();
        let bad = order.iter().any(|&i| counts(i) && !valid[i]);
        match authenticate(&m, &t, &FakeCheck::default()) {
            Ok(auth) => {
                prop_assert!(!bad);
                prop_assert_eq!(auth.key_id, good[0]);
                prop_assert_eq!(auth.signed_by, good);
            }
            Err(AuthError::InvalidTrustedSignature { .. }) => {
                prop_assert!(bad && !good.is_empty());
            }
            Err(AuthError::NoValidSignature { attempts, .. }) => {
                prop_assert!(good.is_empty());
                prop_assert_eq!(attempts.len(), order.len());
            }
            Err(AuthError::NoSignatures) => prop_assert!(order.is_empty()),
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
    }
}

#[test]
fn each_refusal_is_named() {
    let check = FakeCheck::default();
    let m = metadata(&[(KEY_A, true)]);

    // Revoked payload digest, checked before any signature.
    let mut t = trust_a();
    t.revoke_digest(m.payload_digest(), "withdrawn by publisher");
    assert_eq!(
        authenticate(&m, &t, &check),
        Err(AuthError::DigestRevoked {
            digest: m.payload_digest(),
            reason: "withdrawn by publisher".into()
        })
    );

    // No signatures at all.
    assert_eq!(
        authenticate(&metadata(&[]), &trust_a(), &check),
        Err(AuthError::NoSignatures)
    );

    // The publisher has no trusted key, though another publisher does.
    let mut other = TrustStore::new();
    other
        .add_key(publisher("org.other"), KEY_B.to_vec())
        .unwrap();
    assert_eq!(
        authenticate(&m, &other, &check),
        Err(AuthError::PublisherNotTrusted {
            publisher: publisher("org.example")
        })
    );

    // Unknown key, key of another publisher, revoked key, invalid signature.
    let mut t = trust_a();
    t.add_key(publisher("org.other"), KEY_B.to_vec()).unwrap();
    let attempts = |m: &Metadata, t: &TrustStore| match authenticate(m, t, &FakeCheck::default()) {
        Err(AuthError::NoValidSignature {
            publisher: p,
            attempts,
        }) => {
            assert_eq!(p, publisher("org.example"));
            attempts.into_iter().map(|(_, o)| o).collect::<Vec<_>>()
        }
        other => panic!("expected NoValidSignature, got {other:?}"),
    };
    assert_eq!(
        attempts(&metadata(&[(b"unknown", true)]), &t),
        vec![SignatureOutcome::UnknownKey]
    );
    assert_eq!(
        attempts(&metadata(&[(KEY_B, true)]), &t),
        vec![SignatureOutcome::KeyOfAnotherPublisher {
            owner: publisher("org.other")
        }]
    );
    assert_eq!(
        attempts(&metadata(&[(KEY_A, false)]), &t),
        vec![SignatureOutcome::Invalid {
            reason: "signature mismatch".into()
        }]
    );
    let mut revoked = t.clone();
    assert!(revoked.revoke_key(Sha256Digest::of(KEY_A), "leaked"));
    assert_eq!(
        attempts(&metadata(&[(KEY_A, true)]), &revoked),
        vec![SignatureOutcome::KeyRevoked {
            reason: "leaked".into()
        }]
    );
    // The message lists every attempt.
    let msg = authenticate(&metadata(&[(b"unknown", true), (KEY_A, false)]), &t, &check)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("not trusted for any publisher") && msg.contains("does not verify"),
        "{msg}"
    );
}

#[test]
fn trust_changes_keep_keys_unambiguous() {
    let mut t = trust_a();
    // Idempotent for the same publisher.
    assert_eq!(
        t.add_key(publisher("org.example"), KEY_A.to_vec()),
        Ok(Sha256Digest::of(KEY_A))
    );
    assert_eq!(
        t.add_key(publisher("org.other"), KEY_A.to_vec()),
        Err(TrustChangeError::KeyOfAnotherPublisher {
            key_id: Sha256Digest::of(KEY_A),
            owner: publisher("org.example")
        })
    );
    t.revoke_key(Sha256Digest::of(KEY_B), "compromised");
    assert_eq!(
        t.add_key(publisher("org.example"), KEY_B.to_vec()),
        Err(TrustChangeError::KeyRevoked {
            key_id: Sha256Digest::of(KEY_B)
        })
    );
    assert_eq!(
        t.add_key(publisher("org.example"), vec![]),
        Err(TrustChangeError::EmptyKey)
    );
}

#[test]
fn trust_file_round_trips() {
    let mut t = trust_a();
    t.add_key(publisher("org.other"), KEY_B.to_vec()).unwrap();
    t.revoke_key(Sha256Digest::of(KEY_A), "leaked");
    t.revoke_digest(Sha256Digest::of(b"payload"), "bad build");
    let text = t.to_json();
    assert_eq!(TrustStore::from_json(text.as_bytes()).unwrap(), t);
    assert_eq!(
        TrustStore::from_json(TrustStore::new().to_json().as_bytes()).unwrap(),
        TrustStore::new()
    );
}

#[test]
fn trust_file_fails_closed() {
    let good = trust_a().to_json();
    let key_id = Sha256Digest::of(KEY_A).to_hex();
    let field = |bytes: &str| match TrustStore::from_json(bytes.as_bytes()) {
        Err(TrustFileError::Field { path, .. }) => path,
        other => panic!("expected a field error for {bytes}, got {other:?}"),
    };
    assert!(matches!(
        TrustStore::from_json(b""),
        Err(TrustFileError::Json(_))
    ));
    assert!(matches!(
        TrustStore::from_json(&good.as_bytes()[..good.len() / 2]),
        Err(TrustFileError::Json(_))
    ));
    assert!(matches!(
        TrustStore::from_json(good.replace("\"trust_format\": 1", "\"trust_format\": 2").as_bytes()),
        Err(TrustFileError::UnknownFormat { found }) if found == "2"
    ));
    // Duplicate keys are a JSON error, not "last one wins".
    assert!(matches!(
        TrustStore::from_json(
            good.replace(
                "\"revoked_keys\": []",
                "\"revoked_keys\": [], \"revoked_keys\": []"
            )
            .as_bytes()
        ),
        Err(TrustFileError::Json(_))
    ));
    assert_eq!(
        field(&good.replace("\"revoked_keys\": []", "\"revoked_keys\": [], \"extra\": 1")),
        "$.extra"
    );
    assert_eq!(
        field(&good.replace(&key_id, &Sha256Digest::of(b"x").to_hex())),
        "$.publishers.org.example[0]"
    );
    assert_eq!(
        field(&good.replace("\"publishers\"", "\"publishers_\"")),
        "$.publishers_"
    );
    let no_revoked = r#"{"trust_format": 1, "publishers": {}, "revoked_digests": []}"#;
    assert_eq!(field(no_revoked), "$.revoked_keys");
    let bad_publisher = r#"{"trust_format": 1, "publishers": {"Org": []}, "revoked_keys": [], "revoked_digests": []}"#;
    assert_eq!(field(bad_publisher), "$.publishers.Org");
    let twice = format!(
        r#"{{"trust_format": 1, "publishers": {{}}, "revoked_keys": [{{"key_id": "{key_id}", "reason": "a"}}, {{"key_id": "{key_id}", "reason": "b"}}], "revoked_digests": []}}"#
    );
    assert_eq!(field(&twice), "$.revoked_keys[1]");
}

const STORE: &str = "0123456789abcdef0123456789abcdef";
const OTHER_STORE: &str = "fedcba9876543210fedcba9876543210";

/// A trust store with key A trusted and revoked, sealed for `store` at `generation`.
fn sealed(store: &str, generation: u64) -> (Vec<u8>, TrustStore, guild_domain::trust::TrustAnchor) {
    let mut t = TrustStore::new();
    t.add_key(publisher("org.example"), KEY_A.to_vec()).unwrap();
    t.add_key(publisher("org.example"), KEY_B.to_vec()).unwrap();
    t.revoke_key(Sha256Digest::of(KEY_A), "leaked");
    let (bytes, anchor) = t.seal(store, generation);
    let read = TrustStore::from_json(&bytes).unwrap();
    assert_eq!(read, t, "a sealed trust file reads back with its binding");
    (bytes, read, anchor)
}

#[test]
fn trust_file_binding_refuses_every_file_but_the_recorded_one() {
    use guild_domain::trust::{check_trust_file, TrustFileMismatch as M};
    let (bytes, file, anchor) = sealed(STORE, 2);
    assert_eq!(
        check_trust_file(Some(&anchor), Some((&bytes, &file)), true),
        Ok(())
    );

    let (old_bytes, old, _) = sealed(STORE, 1);
    let (foreign_bytes, foreign, _) = sealed(OTHER_STORE, 2);
    let (newer_bytes, newer, _) = sealed(STORE, 3);
    let edited = String::from_utf8(bytes.clone())
        .unwrap()
        .replace("leaked", "fine");
    let edited_file = TrustStore::from_json(edited.as_bytes()).unwrap();
    let unbound = TrustStore::from_json(
        String::from_utf8(bytes.clone())
            .unwrap()
            .replace(
                &format!("\"store_id\": \"{STORE}\",\n  \"generation\": 2,\n  "),
                "",
            )
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(unbound.binding(), None);
    let unbound_bytes = unbound.to_json().into_bytes();
    /// A file as found on disk: its bytes and what they decode to.
    type Found<'a> = Option<(&'a [u8], &'a TrustStore)>;
    let cases: Vec<(&str, Found<'_>, M)> = vec![
        ("missing", None, M::Missing { generation: 2 }),
        (
            "older",
            Some((&old_bytes, &old)),
            M::Older {
                found: 1,
                recorded: 2,
            },
        ),
        (
            "newer",
            Some((&newer_bytes, &newer)),
            M::Newer {
                found: 3,
                recorded: 2,
            },
        ),
        (
            "foreign",
            Some((&foreign_bytes, &foreign)),
            M::Foreign {
                found: OTHER_STORE.into(),
                expected: STORE.into(),
            },
        ),
        (
            "edited",
            Some((edited.as_bytes(), &edited_file)),
            M::Altered { generation: 2 },
        ),
        (
            "unbound",
            Some((&unbound_bytes, &unbound)),
            M::Unbound { generation: 2 },
        ),
    ];
    for (label, found, expected) in cases {
        assert_eq!(
            check_trust_file(Some(&anchor), found, true),
            Err(expected),
            "{label}"
        );
    }
    // A store that never recorded a trust file: an unbound file is fine (it gets bound), no file
    // is fine only while no package is recorded, and a bound file is another store's.
    assert_eq!(
        check_trust_file(None, Some((&unbound_bytes, &unbound)), true),
        Ok(())
    );
    assert_eq!(check_trust_file(None, None, false), Ok(()));
    assert_eq!(
        check_trust_file(None, None, true),
        Err(M::MissingWithPackages)
    );
    assert_eq!(
        check_trust_file(None, Some((&bytes, &file)), false),
        Err(M::NotRecorded {
            found: STORE.into(),
            generation: 2
        })
    );
    let text = M::Older {
        found: 1,
        recorded: 2,
    }
    .to_string();
    assert!(
        text.starts_with("the trust file is generation 1, older than generation 2"),
        "{text}"
    );
}

#[test]
fn trust_rebuilt_keeps_every_revocation_and_only_unrevoked_keys_on_request() {
    let (_, file, anchor) = sealed(STORE, 2);
    let mut anchor_only = anchor.clone();
    anchor_only
        .revoked_digests
        .insert(Sha256Digest::of(b"payload"), "recalled".into());
    for keep in [false, true] {
        let t = TrustStore::rebuilt(Some(&anchor_only), Some(&file), keep);
        assert!(t.is_key_revoked(&Sha256Digest::of(KEY_A)), "keep {keep}");
        assert!(
            t.is_digest_revoked(&Sha256Digest::of(b"payload")),
            "keep {keep}"
        );
        let keys: Vec<_> = t
            .keys_of(&publisher("org.example"))
            .map(|k| k.key_id)
            .collect();
        let expected = if keep {
            vec![Sha256Digest::of(KEY_B)]
        } else {
            Vec::new()
        };
        assert_eq!(keys, expected, "keep {keep}");
        assert_eq!(t.binding(), None, "rebuilt trust is bound when sealed");
    }
    // With no trust file at all, the registry's revocations are still there.
    let t = TrustStore::rebuilt(Some(&anchor), None, true);
    assert!(t.is_key_revoked(&Sha256Digest::of(KEY_A)));
}

#[test]
fn trust_anchor_succession_keeps_the_store_the_order_and_every_revocation() {
    use guild_domain::trust::anchor_succession_problem as problem;
    let (_, _, two) = sealed(STORE, 2);
    let (_, _, three) = sealed(STORE, 3);
    let (_, _, foreign) = sealed(OTHER_STORE, 3);
    assert_eq!(problem(None, Some(&two)), None);
    assert_eq!(problem(Some(&two), Some(&two)), None);
    assert_eq!(problem(Some(&two), Some(&three)), None);
    assert!(problem(Some(&two), None).is_some());
    assert!(problem(Some(&three), Some(&two)).is_some());
    assert!(problem(Some(&two), Some(&foreign)).is_some());
    let mut forgetful = three.clone();
    forgetful.revoked_keys.clear();
    assert_eq!(
        problem(Some(&two), Some(&forgetful)),
        Some(format!(
            "the new store state forgets the revocation of {}",
            Sha256Digest::of(KEY_A)
        ))
    );
}

#[test]
fn trust_file_binding_fields_come_together_and_are_checked() {
    let base = r#""publishers": {}, "revoked_keys": [], "revoked_digests": []"#;
    let read = |extra: &str| {
        TrustStore::from_json(format!("{{\"trust_format\": 1{extra}, {base}}}").as_bytes())
    };
    assert!(read("").unwrap().binding().is_none());
    let ok = read(&format!(r#", "store_id": "{STORE}", "generation": 7"#)).unwrap();
    assert_eq!(ok.binding().unwrap().generation, 7);
    for (extra, path) in [
        (r#", "generation": 7"#.to_owned(), "$.store_id"),
        (format!(r#", "store_id": "{STORE}""#), "$.generation"),
        (
            r#", "store_id": "ABC", "generation": 7"#.to_owned(),
            "$.store_id",
        ),
        (
            format!(r#", "store_id": "{STORE}", "generation": -1"#),
            "$.generation",
        ),
    ] {
        match read(&extra) {
            Err(TrustFileError::Field { path: p, .. }) => assert_eq!(p, path, "{extra}"),
            other => panic!("{extra}: {other:?}"),
        }
    }
}
