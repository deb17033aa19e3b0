//! Where a mock says more than a fake: which port calls must never happen.
//!
//! A signature by a key the trust store does not hold must never reach the verifier, and a
//! package that is refused before extraction must never reach the loader.

use guild_adapters_crypto::P256Verifier;
use guild_adapters_fs::archive::GkpkSource;
use guild_adapters_fs::store::FsStore;
use guild_host::{Host, HostError, InstallOptions, PackageManager};
use guild_ports::loader::MockPluginLoader;
use guild_ports::signature::{MockSignatureVerifier, SignatureVerifier};
use guild_test_support::{key, platform, trust, ModDep, Spec, Workshop, PUBLISHER};

fn manager(store: &std::path::Path, verifier: Box<dyn SignatureVerifier>) -> PackageManager {
    let (fs, recovery) = FsStore::open(store).unwrap();
    let (pm, _) = PackageManager::open(
        Box::new(fs),
        recovery,
        Box::new(GkpkSource::default()),
        verifier,
        platform(),
    )
    .unwrap();
    pm
}

#[test]
fn only_signatures_by_trusted_unrevoked_keys_reach_the_verifier() {
    let shop = Workshop::new();
    let (trusted, stranger) = (key(), key());
    let store = shop.fresh("store");

    // A package signed by a stranger only: the verifier must not be asked at all.
    let mut never = MockSignatureVerifier::new();
    never.expect_verify().never();
    let pm = manager(&store, Box::new(never));
    trust(&pm, PUBLISHER, &trusted);
    let by_stranger = shop.build(&Spec::module("ex.mock", "1.0.0"), &stranger);
    let err = pm
        .install(&by_stranger.archive, InstallOptions::default())
        .unwrap_err();
    assert!(matches!(err, HostError::Unauthenticated { .. }), "{err}");
    drop(pm);

    // Signed by the trusted key: exactly one verification, over the canonical payload, answered
    // by the real verifier behind the mock.
    let good = shop.build(&Spec::module("ex.mock", "1.0.0"), &trusted);
    let canonical = good.metadata.canonical_payload().to_vec();
    let mut once = MockSignatureVerifier::new();
    once.expect_verify()
        .withf(move |_, message, _| message == canonical.as_slice())
        .times(1)
        .returning(|key, message, signature| P256Verifier::new().verify(key, message, signature));
    let pm = manager(&store, Box::new(once));
    pm.install(&good.archive, InstallOptions::default())
        .unwrap();
    // Dropping the package manager drops the mock, which checks that exactly one call came.
    drop(pm);
}

#[test]
fn a_package_refused_before_extraction_never_reaches_the_loader() {
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = guild_test_support::open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let mut loader = MockPluginLoader::new();
    loader.expect_load().never();
    let host = Host::new(pm, Box::new(loader));

    let untrusted = shop.build(&Spec::module("ex.a", "1.0.0"), &key());
    assert!(matches!(
        host.install(&untrusted.archive, InstallOptions::default())
            .unwrap_err(),
        HostError::Unauthenticated { .. }
    ));
    let orphan = shop.build(
        &Spec::module("ex.b", "1.0.0").module_dep(ModDep::on("ex.missing", "1.0.0")),
        &k,
    );
    assert!(matches!(
        host.install(&orphan.archive, InstallOptions::default())
            .unwrap_err(),
        HostError::Dependencies { .. }
    ));
    // Installed disabled: verified and stored, but nothing to load.
    let quiet = shop.build(&Spec::module("ex.c", "1.0.0"), &k);
    host.install(
        &quiet.archive,
        InstallOptions {
            enable: false,
            ..InstallOptions::default()
        },
    )
    .unwrap();
}

#[test]
fn loading_right_after_opening_verifies_no_signature_while_the_trust_file_is_unchanged() {
    use guild_ports::loader::{LoadError, LoadErrorKind};
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let pm = manager(&store, Box::new(P256Verifier::new()));
    trust(&pm, PUBLISHER, &k);
    let built = shop.build(&Spec::module("ex.once", "1.0.0"), &k);
    pm.install(&built.archive, InstallOptions::default())
        .unwrap();
    drop(pm);

    // The install recorded that the version was authenticated under today's trust file, so
    // neither opening nor loading checks its signature again.
    let mut never = MockSignatureVerifier::new();
    never.expect_verify().never();
    let pm = manager(&store, Box::new(never));
    let mut loader = MockPluginLoader::new();
    loader.expect_load().times(1).returning(|request| {
        Err(LoadError::new(
            LoadErrorKind::Open {
                reason: "not a real library".into(),
            },
            request,
        ))
    });
    let host = Host::new(pm, Box::new(loader));
    let report = host.load_enabled().unwrap();
    assert_eq!(report.failed.len(), 1);
    drop(host);
}
