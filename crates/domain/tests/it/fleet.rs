//! Fleet roots and policies: the envelope, thresholds, chained root rotation, policy
//! verification and acceptance, trust and authorization from the policy, and the plan. A fake
//! `SignatureCheck` (a "signature" is SHA-256(key || message)) stands in for ECDSA.

use std::collections::BTreeMap;

use guild_domain::distribution::{plan_sync, HeldVersion, LockedSource, OciReference, SyncStep};
use guild_domain::fleet::{
    accept_policy, authenticate_desired, authorize, check_succession, verify_policy,
    verify_root_chain, verify_root_pinned, verify_root_self, verify_root_successor, AcceptError,
    AddSignatureError, AuthorizeError, DesiredPackage, DocumentKind, ExpiryRule, ExpiryStatus,
    FleetDocumentError, FleetPolicy, FleetPublisher, FleetRoot, PolicyChange, PolicyError,
    PolicyProblem, PolicyRecord, RootError, SignatureFault, Signed, SignedPolicy, SignedRoot,
    SuccessionError, VerifiedPolicy, VerifiedRoot, MAX_SIGNATURES,
};
use guild_domain::ids::{FleetId, PackageId, PublisherId, Sha256Digest};
use guild_domain::manifest::{Metadata, SignatureAlgorithm, SignatureEntry};
use guild_domain::trust::{authenticate, SignatureCheck, SignatureOutcome, TrustedKey};
use guild_domain::version::Version;
use proptest::prelude::*;
use serde_json::json;

struct FakeCheck;

fn fake_sign(spki: &[u8], message: &[u8]) -> Vec<u8> {
    Sha256Digest::of(&[spki, message].concat()).0.to_vec()
}

impl SignatureCheck for FakeCheck {
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        if fake_sign(spki_der, message) == signature {
            Ok(())
        } else {
            Err("signature mismatch".into())
        }
    }
}

fn key(name: &str) -> TrustedKey {
    let spki_der = format!("spki-{name}").into_bytes();
    TrustedKey {
        key_id: Sha256Digest::of(&spki_der),
        spki_der,
    }
}

fn entry(k: &TrustedKey, message: &[u8]) -> SignatureEntry {
    SignatureEntry {
        key_id: k.key_id,
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature: fake_sign(&k.spki_der, message),
    }
}

fn signed_by<T: guild_domain::fleet::FleetDocument>(
    doc: Signed<T>,
    keys: &[&TrustedKey],
) -> Signed<T> {
    keys.iter().fold(doc, |d, k| {
        let e = entry(k, d.signed_bytes());
        d.with_signature(e).unwrap()
    })
}

fn fleet() -> FleetId {
    FleetId::new("org.example.prod").unwrap()
}

/// Keys of root version `v`: `r{v}-{i}`.
fn root_keys(v: u64, n: usize) -> Vec<TrustedKey> {
    (0..n).map(|i| key(&format!("r{v}-{i}"))).collect()
}

fn root_body(version: u64, threshold: usize, keys: Vec<TrustedKey>, expires: u64) -> FleetRoot {
    FleetRoot {
        fleet: fleet(),
        version,
        expires,
        threshold,
        keys,
    }
}

/// Root 1: three keys, two must sign, signed by all three.
fn root1() -> SignedRoot {
    let keys = root_keys(1, 3);
    let doc = Signed::new(&root_body(1, 2, keys.clone(), 10_000)).unwrap();
    signed_by(doc, &keys.iter().collect::<Vec<_>>())
}

fn trusted_root1() -> VerifiedRoot {
    verify_root_self(&root1(), &FakeCheck).unwrap()
}

const PUBLISHER: &str = "org.example";

fn publisher() -> PublisherId {
    PublisherId::new(PUBLISHER).unwrap()
}

fn payload(version: &str) -> serde_json::Value {
    json!({
        "package_id": "org.example.scan",
        "kind": "gkmodule",
        "version": version,
        "publisher_id": PUBLISHER,
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

/// The package `org.example.scan` at `version`, signed by `signers`.
fn package(version: &str, signers: &[&TrustedKey]) -> Metadata {
    let unsigned = json!({"gkmetadata": 1, "payload": payload(version), "signatures": []});
    let m = Metadata::parse(&serde_json::to_vec(&unsigned).unwrap()).unwrap();
    let sigs = signers
        .iter()
        .map(|k| entry(k, m.canonical_payload()))
        .collect();
    m.with_signatures(sigs).unwrap()
}

fn desired(m: &Metadata, key_ids: &[&TrustedKey]) -> DesiredPackage {
    let man = m.manifest();
    DesiredPackage {
        id: man.package_id.clone(),
        version: man.version.clone(),
        kind: man.kind,
        payload_sha256: m.payload_digest(),
        publisher: man.publisher_id.clone(),
        key_ids: key_ids.iter().map(|k| k.key_id).collect(),
        source: LockedSource {
            reference: OciReference::parse("oci://registry.example.com/guild/scan:1.0.0").unwrap(),
            manifest_digest: Sha256Digest([7; 32]),
        },
    }
}

/// A policy trusting `org.example` with the given keys, desiring `packages`.
fn policy_body(
    version: u64,
    expires: u64,
    keys: &[&TrustedKey],
    packages: Vec<DesiredPackage>,
) -> FleetPolicy {
    FleetPolicy {
        fleet: fleet(),
        version,
        expires,
        root_version: 1,
        publishers: BTreeMap::from([(
            publisher(),
            FleetPublisher {
                keys: keys.iter().map(|k| (*k).clone()).collect(),
                scopes: vec![PackageId::new("org.example").unwrap()],
            },
        )]),
        revoked_keys: BTreeMap::new(),
        revoked_digests: BTreeMap::new(),
        packages,
    }
}

/// `body` signed by the first two keys of root 1.
fn signed_policy(body: &FleetPolicy) -> SignedPolicy {
    let keys = root_keys(1, 3);
    signed_by(Signed::new(body).unwrap(), &[&keys[0], &keys[1]])
}

fn verified(body: &FleetPolicy) -> VerifiedPolicy {
    verify_policy(&trusted_root1(), &signed_policy(body), &FakeCheck).unwrap()
}

fn the_policy() -> (FleetPolicy, Metadata) {
    let k = key("pub-old");
    let m = package("1.0.0", &[&k]);
    (policy_body(1, 10_000, &[&k], vec![desired(&m, &[&k])]), m)
}

// ---------------------------------------------------------------------------------------------
// The envelope

#[test]
fn a_document_reads_back_with_the_same_digest_and_signatures() {
    let (body, _) = the_policy();
    let doc = signed_policy(&body);
    let text = doc.to_json();
    let back = SignedPolicy::parse(text.as_bytes()).unwrap();
    assert_eq!(back, doc);
    assert_eq!(back.digest(), Sha256Digest::of(back.signed_bytes()));
    assert_eq!(back.to_json(), text);
    // A root does not read as a policy, nor the reverse.
    assert!(matches!(
        SignedRoot::parse(text.as_bytes()),
        Err(FleetDocumentError::Field {
            document: DocumentKind::Root,
            ..
        })
    ));
}

#[test]
fn adding_signatures_keeps_the_digest_and_a_key_signs_once() {
    let keys = root_keys(1, 3);
    let unsigned = Signed::new(&root_body(1, 2, keys.clone(), 10)).unwrap();
    let digest = unsigned.digest();
    let one = signed_by(unsigned, &[&keys[0]]);
    assert_eq!(one.digest(), digest);
    // The identical entry again is a no-op.
    let again = one
        .clone()
        .with_signature(entry(&keys[0], one.signed_bytes()))
        .unwrap();
    assert_eq!(again, one);
    // Another signature by the same key is refused, naming the key.
    let mut other = entry(&keys[0], one.signed_bytes());
    other.signature[0] ^= 1;
    assert_eq!(
        one.clone().with_signature(other),
        Err(AddSignatureError::AlreadySigned {
            document: DocumentKind::Root,
            version: 1,
            digest,
            key_id: keys[0].key_id,
        })
    );
    let mut empty = entry(&keys[1], one.signed_bytes());
    empty.signature.clear();
    assert!(matches!(
        one.with_signature(empty),
        Err(AddSignatureError::BadLength { len: 0, .. })
    ));
}

#[test]
fn envelopes_are_read_strictly_naming_the_member() {
    let (body, _) = the_policy();
    let doc = signed_policy(&body);
    let good: serde_json::Value = serde_json::from_str(&doc.to_json()).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        SignedPolicy::parse(&serde_json::to_vec(&v).unwrap())
            .unwrap_err()
            .to_string()
    };
    for (said, f) in [
        (
            "unknown member",
            &(|v: &mut serde_json::Value| {
                v["extra"] = json!(1);
            }) as &dyn Fn(&mut serde_json::Value),
        ),
        ("signed.colour", &|v| {
            v["signed"]["colour"] = json!("red");
        }),
        ("signed.packages[0].source.tag", &|v| {
            v["signed"]["packages"][0]["source"]["tag"] = json!("x");
        }),
        ("format 2", &|v| {
            v["signed"]["guild_fleet_policy"] = json!(2);
        }),
        ("signed.version", &|v| {
            v["signed"]["version"] = json!(-1);
        }),
        ("signed.packages[0].key_ids", &|v| {
            v["signed"]["packages"][0]["key_ids"] = json!([]);
        }),
        ("signs twice", &|v| {
            let s = v["signatures"][0].clone();
            v["signatures"].as_array_mut().unwrap().push(s);
        }),
        ("signatures[0].algorithm", &|v| {
            v["signatures"][0]["algorithm"] = json!("rsa");
        }),
        ("desired twice", &|v| {
            let p = v["signed"]["packages"][0].clone();
            v["signed"]["packages"].as_array_mut().unwrap().push(p);
        }),
        ("not the SHA-256", &|v| {
            v["signed"]["publishers"][PUBLISHER]["keys"][0]["public_key_der"] = json!("00");
        }),
        ("signed.revoked_keys.zz", &|v| {
            v["signed"]["revoked_keys"]["zz"] = json!("r");
        }),
    ] {
        let err = edit(f);
        assert!(err.contains(said), "{said}: {err}");
    }
    // Duplicate JSON keys never reach the reader's members.
    let dup = doc
        .to_json()
        .replacen("\"version\"", "\"version\": 9, \"version\"", 1);
    assert!(matches!(
        SignedPolicy::parse(dup.as_bytes()),
        Err(FleetDocumentError::Json { .. })
    ));
    // Too many signatures, and too many bytes.
    let mut many = good.clone();
    many["signatures"] = json!((0..=MAX_SIGNATURES)
        .map(|i| json!({"key_id": key(&i.to_string()).key_id.to_hex(), "algorithm": "ecdsa-p256-sha256", "signature": "00"}))
        .collect::<Vec<_>>());
    assert!(matches!(
        SignedPolicy::parse(&serde_json::to_vec(&many).unwrap()),
        Err(FleetDocumentError::TooMany { .. })
    ));
    let huge = vec![b' '; guild_domain::fleet::MAX_DOCUMENT_BYTES + 1];
    assert!(matches!(
        SignedPolicy::parse(&huge),
        Err(FleetDocumentError::TooLarge { .. })
    ));
}

#[test]
fn roots_refuse_bad_thresholds_and_version_zero() {
    let keys = root_keys(1, 2);
    for (threshold, version, said) in [(0, 1, "threshold"), (3, 1, "threshold"), (1, 0, "version")]
    {
        let err = Signed::new(&root_body(version, threshold, keys.clone(), 5)).unwrap_err();
        assert!(err.to_string().contains(said), "{err}");
    }
    let mut twice = root_body(1, 1, keys.clone(), 5);
    twice.keys.push(keys[0].clone());
    assert!(Signed::new(&twice)
        .unwrap_err()
        .to_string()
        .contains("listed twice"));
}

// ---------------------------------------------------------------------------------------------
// Roots

#[test]
fn a_root_needs_its_threshold_of_its_own_keys() {
    let keys = root_keys(1, 3);
    let unsigned = Signed::new(&root_body(1, 2, keys.clone(), 10)).unwrap();
    let stranger = key("stranger");
    let one = signed_by(unsigned.clone(), &[&keys[0], &stranger]);
    let Err(RootError::Threshold(e)) = verify_root_self(&one, &FakeCheck) else {
        panic!("one signature passed");
    };
    assert_eq!(e.threshold, 2);
    assert_eq!(e.valid.len(), 1);
    assert_eq!(
        e.refused,
        vec![(stranger.key_id, SignatureFault::NotARootKey)]
    );
    // A bad signature by a root key does not count either.
    let mut bad = entry(&keys[1], unsigned.signed_bytes());
    bad.signature[0] ^= 1;
    let forged = signed_by(unsigned.clone(), &[&keys[0]])
        .with_signature(bad)
        .unwrap();
    assert!(verify_root_self(&forged, &FakeCheck).is_err());
    let two = signed_by(unsigned, &[&keys[2], &keys[0]]);
    assert!(verify_root_self(&two, &FakeCheck).is_ok());
}

#[test]
fn joining_a_fleet_pins_the_root_by_digest() {
    let root = root1();
    assert!(verify_root_pinned(&root, &root.digest(), &FakeCheck).is_ok());
    assert!(matches!(
        verify_root_pinned(&root, &Sha256Digest([1; 32]), &FakeCheck),
        Err(RootError::NotPinned { version: 1, .. })
    ));
}

/// Root `v` (keys `r{v}-*`, threshold 2 of 3) signed by `old` keys of root `v-1` and `own` of
/// its own.
fn successor(v: u64, old: usize, own: usize, expires: u64) -> SignedRoot {
    let (prev, mine) = (root_keys(v - 1, 3), root_keys(v, 3));
    let doc = Signed::new(&root_body(v, 2, mine.clone(), expires)).unwrap();
    let signers: Vec<&TrustedKey> = prev.iter().take(old).chain(mine.iter().take(own)).collect();
    signed_by(doc, &signers)
}

#[test]
fn a_rotation_needs_both_thresholds_and_the_next_version() {
    let trusted = trusted_root1();
    assert!(verify_root_successor(&trusted, &successor(2, 2, 2, 50), &FakeCheck).is_ok());
    for (old, own, who) in [(1, 3, 1), (3, 1, 2)] {
        let Err(RootError::Threshold(e)) =
            verify_root_successor(&trusted, &successor(2, old, own, 50), &FakeCheck)
        else {
            panic!("{old} old and {own} own signatures passed");
        };
        assert_eq!(e.root_version, who);
    }
    assert!(matches!(
        verify_root_successor(&trusted, &successor(3, 2, 2, 50), &FakeCheck),
        Err(RootError::NotNextVersion {
            trusted: 1,
            offered: 3,
            ..
        })
    ));
    let mut other = root_body(2, 1, root_keys(1, 3), 50);
    other.fleet = FleetId::new("org.example.staging").unwrap();
    let other = signed_by(
        Signed::new(&other).unwrap(),
        &root_keys(1, 3).iter().collect::<Vec<_>>(),
    );
    assert!(matches!(
        verify_root_successor(&trusted, &other, &FakeCheck),
        Err(RootError::OtherFleet { .. })
    ));
    // Keeping the same keys and raising the threshold is a rotation too.
    let keys = root_keys(1, 3);
    let same = Signed::new(&root_body(2, 3, keys.clone(), 50)).unwrap();
    let same = signed_by(same, &keys.iter().collect::<Vec<_>>());
    assert_eq!(
        verify_root_successor(&trusted, &same, &FakeCheck)
            .unwrap()
            .root()
            .threshold,
        3
    );
}

#[test]
fn only_the_newest_roots_expiry_counts() {
    let trusted = trusted_root1();
    // Root 2 expired long ago, root 3 is current.
    let chain = [successor(2, 2, 2, 5), successor(3, 2, 2, 500)];
    let up = verify_root_chain(&trusted, &chain, 100, ExpiryRule::Enforce, &FakeCheck).unwrap();
    assert_eq!((up.root.version(), up.expiry), (3, ExpiryStatus::Current));
    // The newest expired: refused, unless overridden, and then it says so.
    let err =
        verify_root_chain(&trusted, &chain, 500, ExpiryRule::Enforce, &FakeCheck).unwrap_err();
    assert!(matches!(
        err,
        RootError::Expired {
            version: 3,
            expires: 500,
            now: 500,
            ..
        }
    ));
    let up = verify_root_chain(&trusted, &chain, 600, ExpiryRule::Override, &FakeCheck).unwrap();
    assert_eq!(
        up.expiry,
        ExpiryStatus::Overridden {
            expires: 500,
            now: 600
        }
    );
    // An empty chain judges the trusted root.
    assert!(verify_root_chain(&trusted, &[], 10_000, ExpiryRule::Enforce, &FakeCheck).is_err());
    assert_eq!(
        verify_root_chain(&trusted, &[], 9_999, ExpiryRule::Enforce, &FakeCheck)
            .unwrap()
            .root,
        trusted
    );
    // A gap refuses the whole walk.
    assert!(verify_root_chain(
        &trusted,
        &[successor(3, 2, 2, 500)],
        1,
        ExpiryRule::Enforce,
        &FakeCheck
    )
    .is_err());
}

// ---------------------------------------------------------------------------------------------
// Policies

#[test]
fn a_policy_needs_the_roots_threshold_and_its_fleet() {
    let (body, _) = the_policy();
    let root = trusted_root1();
    let keys = root_keys(1, 3);
    let one = signed_by(Signed::new(&body).unwrap(), &[&keys[0]]);
    assert!(matches!(
        verify_policy(&root, &one, &FakeCheck),
        Err(PolicyError::Threshold(_))
    ));
    let publisher_signed = signed_by(Signed::new(&body).unwrap(), &[&key("pub-old"), &keys[0]]);
    assert!(matches!(
        verify_policy(&root, &publisher_signed, &FakeCheck),
        Err(PolicyError::Threshold(_))
    ));
    assert!(verify_policy(&root, &signed_policy(&body), &FakeCheck).is_ok());

    let mut other = body.clone();
    other.fleet = FleetId::new("org.example.staging").unwrap();
    assert!(matches!(
        verify_policy(&root, &signed_policy(&other), &FakeCheck),
        Err(PolicyError::OtherFleet { .. })
    ));
    let mut newer = body;
    newer.root_version = 2;
    assert!(matches!(
        verify_policy(&root, &signed_policy(&newer), &FakeCheck),
        Err(PolicyError::NeedsNewerRoot {
            signed_under: 2,
            trusted: 1,
            ..
        })
    ));
}

#[test]
fn a_policy_that_contradicts_itself_is_refused_naming_the_entry() {
    let (body, m) = the_policy();
    let k = key("pub-old");
    let problem =
        |b: &FleetPolicy| match verify_policy(&trusted_root1(), &signed_policy(b), &FakeCheck) {
            Err(PolicyError::Inconsistent { problem, .. }) => *problem,
            other => panic!("{other:?}"),
        };
    let mut revoked = body.clone();
    revoked
        .revoked_digests
        .insert(m.payload_digest(), "bad build".into());
    assert!(matches!(
        problem(&revoked),
        PolicyProblem::DesiredAndRevoked { .. }
    ));

    let mut key_gone = body.clone();
    key_gone.revoked_keys.insert(k.key_id, "stolen".into());
    let p = problem(&key_gone);
    assert!(matches!(p, PolicyProblem::NoUsableKey { .. }));
    assert!(p.to_string().contains("org.example.scan 1.0.0"), "{p}");

    let mut unlisted = body.clone();
    unlisted.publishers.clear();
    assert!(matches!(
        problem(&unlisted),
        PolicyProblem::PublisherNotListed { .. }
    ));

    let mut scoped = body.clone();
    scoped.publishers.get_mut(&publisher()).unwrap().scopes =
        vec![PackageId::new("org.example.scanner").unwrap()];
    assert!(matches!(problem(&scoped), PolicyProblem::OutOfScope { .. }));

    let mut stranger = body.clone();
    stranger.packages[0].key_ids.push(key("stranger").key_id);
    assert!(matches!(
        problem(&stranger),
        PolicyProblem::KeyNotOfPublisher { .. }
    ));

    // An empty desired set is a policy: the fleet desires nothing.
    let mut empty = body;
    empty.packages.clear();
    assert!(verify_policy(&trusted_root1(), &signed_policy(&empty), &FakeCheck).is_ok());
}

#[test]
fn acceptance_refuses_rollback_equivocation_and_expiry() {
    let (body, _) = the_policy();
    let v1 = verified(&body);
    let first = accept_policy(None, &v1, 0, ExpiryRule::Enforce).unwrap();
    assert_eq!(first.change, PolicyChange::First);
    assert_eq!(first.record, PolicyRecord::of(&v1));
    let same = accept_policy(Some(&first.record), &v1, 0, ExpiryRule::Enforce).unwrap();
    assert_eq!(same.change, PolicyChange::Unchanged);

    let mut b2 = body.clone();
    b2.version = 2;
    let v2 = verified(&b2);
    let r2 = accept_policy(Some(&first.record), &v2, 0, ExpiryRule::Enforce).unwrap();
    assert_eq!(r2.change, PolicyChange::Newer { from: 1 });
    assert_eq!(
        accept_policy(Some(&r2.record), &v1, 0, ExpiryRule::Enforce),
        Err(AcceptError::Rollback {
            recorded: 2,
            offered: 1
        })
    );
    let mut fork = body.clone();
    fork.expires += 1;
    let fork = verified(&fork);
    assert!(matches!(
        accept_policy(Some(&first.record), &fork, 0, ExpiryRule::Enforce),
        Err(AcceptError::Equivocation { version: 1, .. })
    ));
    assert_eq!(
        accept_policy(Some(&first.record), &v2, 10_000, ExpiryRule::Enforce),
        Err(AcceptError::Expired {
            version: 2,
            expires: 10_000,
            now: 10_000
        })
    );
    let forced = accept_policy(Some(&first.record), &v2, 10_001, ExpiryRule::Override).unwrap();
    assert!(forced.expiry.is_overridden());
    assert!(first.record.is_expired(10_000) && !first.record.is_expired(9_999));
}

// ---------------------------------------------------------------------------------------------
// Trust and authorization from the policy

#[test]
fn the_policy_is_the_trust_and_authorizes_what_it_names() {
    let (body, m) = the_policy();
    let policy = verified(&body);
    let trust = policy.trust_store();
    let auth = authenticate(&m, &trust, &FakeCheck).unwrap();
    assert_eq!(
        authorize(&policy, &m, &auth).unwrap().id,
        m.manifest().package_id
    );
    let (auth2, entry) = authenticate_desired(&policy, &m, &FakeCheck).unwrap();
    assert_eq!(
        (auth2, entry.version.to_string()),
        (auth.clone(), "1.0.0".into())
    );

    // Another build of the same version, or another version, is not the desired package.
    let k = key("pub-old");
    let other = package("1.0.1", &[&k]);
    let a = authenticate(&other, &trust, &FakeCheck).unwrap();
    assert!(matches!(
        *authorize(&policy, &other, &a).unwrap_err(),
        AuthorizeError::DigestDiffers { .. }
    ));
    // A package the policy does not name.
    let mut none = body.clone();
    none.packages.clear();
    let none = verified(&none);
    assert!(matches!(
        *authorize(&none, &m, &auth).unwrap_err(),
        AuthorizeError::NotDesired { .. }
    ));
}

#[test]
fn a_key_the_entry_does_not_allow_does_not_authorize() {
    let (old, new) = (key("pub-old"), key("pub-new"));
    let m = package("1.0.0", &[&old, &new]);
    // The publisher has both keys; the entry allows only the new one.
    let body = policy_body(1, 10_000, &[&old, &new], vec![desired(&m, &[&new])]);
    let policy = verified(&body);
    let auth = authenticate(&m, &policy.trust_store(), &FakeCheck).unwrap();
    assert_eq!(auth.key_id, old.key_id);
    // Every verified key counts: the new key's signature is one the entry allows.
    assert_eq!(auth.signed_by, vec![old.key_id, new.key_id]);
    assert_eq!(
        authorize(&policy, &m, &auth).unwrap().version,
        m.manifest().version
    );
    // Signed by a key the entry does not allow, and by nothing else: refused.
    let old_signed = package("1.0.0", &[&old]);
    let old_auth = authenticate(&old_signed, &policy.trust_store(), &FakeCheck).unwrap();
    let mut body_old = body.clone();
    body_old.packages = vec![desired(&old_signed, &[&new])];
    assert!(matches!(
        *authorize(&verified(&body_old), &old_signed, &old_auth).unwrap_err(),
        AuthorizeError::KeyNotAllowed { .. }
    ));
    // Authenticating under the entry's keys finds the allowed signature.
    let (auth, _) = authenticate_desired(&policy, &m, &FakeCheck).unwrap();
    assert_eq!(auth.key_id, new.key_id);
    // Signed by the old key only: nothing the entry allows.
    let only_old = package("1.0.0", &[&old]);
    assert!(matches!(
        *authenticate_desired(&policy, &only_old, &FakeCheck).unwrap_err(),
        AuthorizeError::NotAuthenticated { .. }
    ));
}

#[test]
fn rotating_a_publisher_key_disables_nothing_signed_by_both() {
    let (old, new) = (key("pub-old"), key("pub-new"));
    let m = package("1.0.0", &[&old, &new]);
    // Policy 1: old key only. Policy 2: both. Policy 3: the old key revoked.
    let p1 = verified(&policy_body(1, 10_000, &[&old], vec![desired(&m, &[&old])]));
    let p2 = verified(&policy_body(
        2,
        10_000,
        &[&old, &new],
        vec![desired(&m, &[&old, &new])],
    ));
    let mut b3 = policy_body(3, 10_000, &[&new], vec![desired(&m, &[&old, &new])]);
    b3.revoked_keys.insert(old.key_id, "rotated out".into());
    let p3 = verified(&b3);
    for (p, want) in [(&p1, &old), (&p2, &old), (&p3, &new)] {
        let (auth, _) = authenticate_desired(p, &m, &FakeCheck).unwrap();
        assert_eq!(auth.key_id, want.key_id);
    }
    // `authenticate` tries every signature: the revoked key is reported and the next one counts.
    let auth = authenticate(&m, &p3.trust_store(), &FakeCheck).unwrap();
    assert_eq!(auth.key_id, new.key_id);
    let only_old = package("1.0.0", &[&old]);
    match authenticate(&only_old, &p3.trust_store(), &FakeCheck) {
        Err(guild_domain::trust::AuthError::NoValidSignature { attempts, .. }) => {
            assert!(matches!(attempts[0].1, SignatureOutcome::KeyRevoked { .. }))
        }
        other => panic!("{other:?}"),
    }
    // The lock names the first unrevoked key.
    assert_eq!(p3.to_lock().packages().next().unwrap().key_id, new.key_id);
}

// ---------------------------------------------------------------------------------------------
// The plan

fn held(id: &str, v: &str, d: Sha256Digest, enabled: bool) -> HeldVersion {
    HeldVersion {
        id: PackageId::new(id).unwrap(),
        version: Version::parse(v).unwrap(),
        payload_sha256: d,
        installed: true,
        enabled,
    }
}

#[test]
fn the_desired_set_plans_through_a_lock() {
    let (body, m) = the_policy();
    let policy = verified(&body);
    let lock = policy.to_lock();
    let locked = lock.get(&m.manifest().package_id).unwrap();
    assert_eq!(locked.payload_sha256, m.payload_digest());
    assert_eq!(
        locked.source.as_ref().unwrap().manifest_digest,
        Sha256Digest([7; 32])
    );
    let store = [held(
        "org.example.other",
        "2.0.0",
        Sha256Digest([3; 32]),
        true,
    )];
    let steps = plan_sync(&lock, &store).unwrap();
    assert_eq!(steps.len(), 2);
    assert!(matches!(&steps[0], SyncStep::Disable(id) if id.as_str() == "org.example.other"));
    assert!(matches!(&steps[1], SyncStep::Install(p) if p.id == m.manifest().package_id));
    let shrink = policy.shrinks(&store);
    assert_eq!(
        shrink.disabled,
        vec![PackageId::new("org.example.other").unwrap()]
    );
    assert!(!shrink.empties_the_store());

    let mut nothing = body;
    nothing.packages.clear();
    let nothing = verified(&nothing);
    assert_eq!(nothing.to_lock().packages().len(), 0);
    let shrink = nothing.shrinks(&store);
    assert!(shrink.empties_the_store() && !shrink.is_empty());
    assert!(nothing.shrinks(&[]).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Properties

/// Root 1 with `n` keys and threshold `k`, signed as `statuses` says for each key (0: not at
/// all, 1: validly, 2: with a bad signature), by `strangers` keys outside the root, and with
/// the signatures of the keys `repeats` names (mod `n`) offered again.
fn root_signed_as(
    n: usize,
    k: usize,
    statuses: &[u8],
    strangers: usize,
    repeats: &[usize],
) -> SignedRoot {
    let keys = root_keys(1, n);
    let mut doc = Signed::new(&root_body(1, k, keys.clone(), 10)).unwrap();
    for s in 0..strangers {
        let e = entry(&key(&format!("stranger-{s}")), doc.signed_bytes());
        doc = doc.with_signature(e).unwrap();
    }
    for (key, status) in keys.iter().zip(statuses) {
        let mut e = entry(key, doc.signed_bytes());
        match status {
            0 => continue,
            1 => {}
            _ => e.signature[0] ^= 1,
        }
        doc = doc.with_signature(e).unwrap();
    }
    for &r in repeats {
        if statuses[r % n] == 0 {
            continue;
        }
        let e = entry(&keys[r % n], doc.signed_bytes());
        // Identical again: a no-op; after a bad one by this key: refused. Either way no count.
        doc = doc.clone().with_signature(e).unwrap_or(doc);
    }
    doc
}

proptest! {
    #[test]
    fn any_k_distinct_valid_signatures_accept_and_fewer_refuse(
        (n, k, statuses) in (1usize..8).prop_flat_map(|n| (Just(n), 1..=n, prop::collection::vec(0u8..3, n))),
        strangers in 0usize..4,
        repeats in prop::collection::vec(0usize..8, 0..6),
    ) {
        let doc = root_signed_as(n, k, &statuses, strangers, &repeats);
        let valid = statuses.iter().filter(|s| **s == 1).count();
        let verdict = verify_root_self(&doc, &FakeCheck);
        prop_assert_eq!(verdict.is_ok(), valid >= k, "{} valid of threshold {}", valid, k);
        // Reading the document back changes nothing.
        let back = SignedRoot::parse(doc.to_json().as_bytes()).unwrap();
        prop_assert_eq!(verify_root_self(&back, &FakeCheck).is_ok(), valid >= k);
    }

    #[test]
    fn a_chain_is_accepted_iff_every_step_has_both_thresholds_and_the_next_version(
        steps in prop::collection::vec((0usize..4, 0usize..4, prop::bool::weighted(0.85), 1u64..1000), 0..5),
        now in 0u64..1000,
    ) {
        // Step i offers root v = i + 2 (or v + 1 when not `next`), 2-of-3, signed by `old` keys
        // of the previous version's key set and `own` of its own.
        let trusted = trusted_root1();
        let mut chain = Vec::new();
        let mut expect_ok = true;
        for (i, (old, own, next, expires)) in steps.iter().enumerate() {
            let v = i as u64 + 2;
            let offered = if *next { v } else { v + 1 };
            let (prev, mine) = (root_keys(offered - 1, 3), root_keys(offered, 3));
            let doc = Signed::new(&root_body(offered, 2, mine.clone(), *expires)).unwrap();
            let signers: Vec<&TrustedKey> = prev.iter().take(*old).chain(mine.iter().take(*own)).collect();
            chain.push(signed_by(doc, &signers));
            expect_ok &= *old >= 2 && *own >= 2 && *next;
        }
        let newest_expires = steps.last().map_or(10_000, |s| s.3);
        let walked = verify_root_chain(&trusted, &chain, now, ExpiryRule::Override, &FakeCheck);
        prop_assert_eq!(walked.is_ok(), expect_ok);
        let enforced = verify_root_chain(&trusted, &chain, now, ExpiryRule::Enforce, &FakeCheck);
        prop_assert_eq!(enforced.is_ok(), expect_ok && now < newest_expires);
        if let Ok(up) = walked {
            prop_assert_eq!(up.root.version(), steps.len() as u64 + 1);
            prop_assert_eq!(up.expiry.is_overridden(), now >= newest_expires);
        }
    }

    #[test]
    fn versions_only_grow_and_one_version_names_one_policy(
        recorded in 1u64..6,
        offered in 1u64..6,
        same_digest in any::<bool>(),
    ) {
        let (mut body, _) = the_policy();
        body.version = offered;
        let policy = verified(&body);
        let digest = if same_digest { policy.signed().digest() } else { Sha256Digest([9; 32]) };
        let record = PolicyRecord { version: recorded, digest, expires: 10_000 };
        let verdict = accept_policy(Some(&record), &policy, 0, ExpiryRule::Enforce);
        match verdict {
            Err(AcceptError::Rollback { .. }) => prop_assert!(offered < recorded),
            Err(AcceptError::Equivocation { .. }) => prop_assert!(offered == recorded && !same_digest),
            Ok(a) if a.change == PolicyChange::Unchanged => prop_assert!(offered == recorded && same_digest),
            Ok(a) => {
                prop_assert!(offered > recorded);
                prop_assert_eq!(a.change, PolicyChange::Newer { from: recorded });
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    #[test]
    fn expiry_refuses_from_its_second_on_unless_overridden_and_then_says_so(
        expires in 1u64..50,
        now in 0u64..60,
        overridden in any::<bool>(),
    ) {
        let (mut body, _) = the_policy();
        body.expires = expires;
        let policy = verified(&body);
        let rule = if overridden { ExpiryRule::Override } else { ExpiryRule::Enforce };
        let verdict = accept_policy(None, &policy, now, rule);
        let expired = now >= expires;
        prop_assert_eq!(verdict.is_err(), expired && !overridden);
        if let Ok(a) = verdict {
            prop_assert_eq!(a.expiry.is_overridden(), expired);
        }
    }

    #[test]
    fn the_digest_ignores_key_order_whitespace_and_signatures(
        versions in prop::collection::btree_set(0u64..50, 0..4),
        revoked in prop::collection::btree_map(any::<u8>(), "[a-z ]{0,12}", 0..4),
        signers in prop::collection::vec(0usize..3, 0..4),
        version in 1u64..u64::MAX,
        expires in any::<u64>(),
    ) {
        let k = key("pub-old");
        let packages = versions
            .iter()
            .map(|v| {
                let mut d = desired(&package(&format!("1.{v}.0"), &[&k]), &[&k]);
                d.id = PackageId::new(format!("org.example.p{v}")).unwrap();
                d
            })
            .collect();
        let mut body = policy_body(version, expires, &[&k], packages);
        body.revoked_digests = revoked.into_iter().map(|(b, r)| (Sha256Digest([b; 32]), r)).collect();
        let doc = Signed::new(&body).unwrap();
        let digest = doc.digest();
        let keys = root_keys(1, 3);
        let doc = signers.iter().fold(doc, |d, i| {
            let e = entry(&keys[*i], d.signed_bytes());
            d.with_signature(e).unwrap()
        });
        prop_assert_eq!(doc.digest(), digest);
        let back = SignedPolicy::parse(doc.to_json().as_bytes()).unwrap();
        prop_assert_eq!(back.digest(), digest);
        prop_assert_eq!(back.body(), &body);
        // serde_json sorts keys and drops whitespace: another spelling of the same document.
        let respelled: serde_json::Value = serde_json::from_str(&doc.to_json()).unwrap();
        let respelled = SignedPolicy::parse(&serde_json::to_vec(&respelled).unwrap()).unwrap();
        prop_assert_eq!(respelled.digest(), digest);
        prop_assert_eq!(respelled.signatures(), doc.signatures());
    }
}

/// A map of revocations from `(byte, reason)` pairs: the digest is the byte repeated.
fn revocations(m: &BTreeMap<u8, String>) -> BTreeMap<Sha256Digest, String> {
    m.iter()
        .map(|(b, r)| (Sha256Digest([*b; 32]), r.clone()))
        .collect()
}

proptest! {
    /// A next policy is refused exactly when it is another fleet's, not newer, or leaves out
    /// a revocation of the previous one, and the error then names every revocation left out
    /// (reasons may change: only the digests count).
    #[test]
    fn a_next_policy_keeps_every_revocation_of_the_one_before(
        (prev_version, next_version) in (1u64..6, 1u64..6),
        other_fleet in prop::bool::weighted(0.1),
        prev_keys in prop::collection::btree_map(0u8..8, "[a-z]{0,6}", 0..5),
        next_keys in prop::collection::btree_map(0u8..8, "[a-z]{0,6}", 0..5),
        prev_digests in prop::collection::btree_map(0u8..8, "[a-z]{0,6}", 0..5),
        next_digests in prop::collection::btree_map(0u8..8, "[a-z]{0,6}", 0..5),
    ) {
        let (mut previous, _) = the_policy();
        previous.version = prev_version;
        previous.revoked_keys = revocations(&prev_keys);
        previous.revoked_digests = revocations(&prev_digests);
        let mut next = previous.clone();
        next.version = next_version;
        next.revoked_keys = revocations(&next_keys);
        next.revoked_digests = revocations(&next_digests);
        if other_fleet {
            next.fleet = FleetId::new("example.other").unwrap();
        }
        let dropped_keys: Vec<Sha256Digest> = previous.revoked_keys.keys()
            .filter(|k| !next.revoked_keys.contains_key(k)).copied().collect();
        let dropped_digests: Vec<Sha256Digest> = previous.revoked_digests.keys()
            .filter(|d| !next.revoked_digests.contains_key(d)).copied().collect();
        match check_succession(&previous, &next) {
            Err(SuccessionError::OtherFleet { .. }) => prop_assert!(other_fleet),
            Err(SuccessionError::NotNewer { previous: p, next: n }) => {
                prop_assert!(!other_fleet && next_version <= prev_version);
                prop_assert_eq!((p, n), (prev_version, next_version));
            }
            Err(e @ SuccessionError::DropsRevocations { .. }) => {
                prop_assert!(!other_fleet && next_version > prev_version);
                let SuccessionError::DropsRevocations { dropped, .. } = &e else { unreachable!() };
                prop_assert_eq!(dropped.keys.keys().copied().collect::<Vec<_>>(), dropped_keys.clone());
                prop_assert_eq!(dropped.digests.keys().copied().collect::<Vec<_>>(), dropped_digests.clone());
                prop_assert!(!dropped.is_empty());
                let message = e.to_string();
                for d in dropped_keys.iter().chain(&dropped_digests) {
                    prop_assert!(message.contains(&d.to_hex()), "{}", message);
                }
            }
            Ok(()) => prop_assert!(
                !other_fleet
                    && next_version > prev_version
                    && dropped_keys.is_empty()
                    && dropped_digests.is_empty()
            ),
        }
    }
}

#[test]
fn a_stores_fleet_record_survives_the_checkpoint_and_the_log_and_is_never_dropped() {
    use guild_domain::fleet::FleetMembership;
    use guild_domain::store_log::{DeltaError, StoreStateDelta};
    use guild_domain::store_state::StoreState;

    let old = StoreState::new();
    let mut joined = old.successor();
    let mut membership = FleetMembership::joined(&trusted_root1());
    joined.set_fleet(membership.clone());
    assert_eq!(joined.fleet().unwrap().fleet(), &fleet());

    // The checkpoint keeps the root whole: its digest and signatures read back the same.
    let (back, _) = StoreState::from_any_json(&joined.to_checkpoint_json()).unwrap();
    assert_eq!(back, joined);
    assert_eq!(back.fleet().unwrap().root.digest(), root1().digest());
    assert_eq!(
        verify_root_self(&back.fleet().unwrap().root, &FakeCheck)
            .unwrap()
            .digest(),
        root1().digest()
    );

    // A delta carries the record when it changed, and only then.
    let delta = StoreStateDelta::between(&old, &joined).unwrap();
    let replayed = {
        let mut s = old.clone();
        s.apply(&StoreStateDelta::from_json(&delta.to_json()).unwrap())
            .unwrap();
        s
    };
    assert_eq!(replayed, joined);
    let mut accepted = joined.successor();
    membership.policy = Some(PolicyRecord {
        version: 3,
        digest: Sha256Digest::of(b"policy 3"),
        expires: 9_000,
    });
    accepted.set_fleet(membership.clone());
    let delta = StoreStateDelta::between(&joined, &accepted).unwrap();
    assert_eq!(delta.fleet.as_ref(), Some(&membership));
    let unchanged = StoreStateDelta::between(&accepted, &accepted.successor()).unwrap();
    assert_eq!(unchanged.fleet, None);
    let mut replayed = joined.clone();
    replayed
        .apply(&StoreStateDelta::from_json(&delta.to_json()).unwrap())
        .unwrap();
    assert_eq!(replayed, accepted);

    // No commit leaves the fleet.
    assert_eq!(
        StoreStateDelta::between(&accepted, &StoreState::new()),
        Err(DeltaError::DropsFleet)
    );
}

/// A tag of `(major, minor, patch, rc)`: `rc` 0 is a release, else `-rc.N`; `v` prefixes a `v`.
fn tag_of((major, minor, patch, rc, v): (u64, u64, u64, u64, bool)) -> String {
    let mut t = format!("{}{major}.{minor}.{patch}", if v { "v" } else { "" });
    if rc > 0 {
        t.push_str(&format!("-rc.{rc}"));
    }
    t
}

proptest! {
    /// Whatever the tags, the resolution answers a tag of the list whose version the
    /// requirement matches, and no tag that names a higher matching version; it refuses only
    /// when no tag matches, listing at most ten versions, highest first.
    #[test]
    fn resolve_tag_answers_the_highest_matching_tag(
        tags in proptest::collection::vec((0u64..3, 0u64..4, 0u64..3, 0u64..3, any::<bool>()), 0..24),
        others in proptest::collection::vec("[a-z]{1,6}", 0..3),
        req in prop_oneof![
            Just("^1"), Just("^1.2"), Just("~0.1"), Just("*"), Just(">=1.1.0, <2"),
            Just("=2.3.2"), Just(">=1.2.0-rc.1, <1.3"), Just("^0.0.1"),
        ],
    ) {
        use guild_domain::fleet::{resolve_tag, tag_version, MAX_VERSIONS_SHOWN};
        use guild_domain::version::VersionReq;
        let mut all: Vec<String> = tags.iter().copied().map(tag_of).collect();
        all.extend(others);
        let req = VersionReq::parse(req).unwrap();
        let matching: Vec<Version> = all
            .iter()
            .filter_map(|t| tag_version(t))
            .filter(|v| req.matches(v))
            .collect();
        match resolve_tag(&req, &all) {
            Ok(r) => {
                prop_assert!(all.contains(&r.tag));
                prop_assert_eq!(tag_version(&r.tag), Some(r.version.clone()));
                prop_assert!(req.matches(&r.version));
                prop_assert!(matching
                    .iter()
                    .all(|v| v.cmp_precedence(&r.version) != std::cmp::Ordering::Greater));
            }
            Err(none) => {
                prop_assert!(matching.is_empty());
                prop_assert!(none.seen.len() <= MAX_VERSIONS_SHOWN);
                prop_assert!(none
                    .seen
                    .windows(2)
                    .all(|w| w[0].cmp_precedence(&w[1]) == std::cmp::Ordering::Greater));
            }
        }
    }
}
