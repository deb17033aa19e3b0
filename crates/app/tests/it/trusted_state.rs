//! Authenticate once, trust the committed state: opening a store checks a version's signatures
//! only when the trust file changed since the version was authenticated (a revocation still takes
//! effect at once), hashes no file, and the host re-hashes a version's files right before its
//! library opens. The full check (`verify_all`) still finds everything.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use guild_adapters_crypto::{P256Verifier, SigningKey};
use guild_adapters_fs::archive::GkpkSource;
use guild_adapters_fs::store::{FsStore, StoreOptions};
use guild_domain::ids::ImplId;
use guild_domain::operation::Backend;
use guild_host::{Host, HostError, InstallOptions, OpenReport, PackageManager, VerifyOptions};
use guild_ports::fakes::{fake_kernel, FakeLoader, FakePlugin};
use guild_ports::signature::{SignatureError, SignatureVerifier};
use guild_ports::store::PackageStore;
use guild_test_support::{
    id, key, make_writable, open_dir, platform, trust, v, ModDep, Spec, Workshop, PUBLISHER,
};
use serde_json::Value;

use crate::host::Shared;

/// The production verifier, counting its calls.
#[derive(Clone, Default)]
struct Counting(Arc<AtomicUsize>);

impl Counting {
    fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl SignatureVerifier for Counting {
    fn verify(&self, spki: &[u8], message: &[u8], signature: &[u8]) -> Result<(), SignatureError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        P256Verifier::new().verify(spki, message, signature)
    }
}

/// Opens `root` (a writer, or a reader) with a counting verifier; answers the package manager,
/// what opening did and how many signatures it checked.
fn open_counting(root: &Path, reader: bool) -> (PackageManager, OpenReport, usize) {
    let mut options = StoreOptions::new();
    options.reader = reader;
    let (store, recovery) = FsStore::open_with(root, options).unwrap();
    let verifier = Counting::default();
    let (pm, report) = PackageManager::open(
        Box::new(store),
        recovery,
        Box::new(GkpkSource::default()),
        Box::new(verifier.clone()),
        platform(),
    )
    .unwrap();
    (pm, report, verifier.calls())
}

/// A store with `ex.base` and `ex.user` (which depends on it) installed and enabled, both
/// signed by one trusted key.
fn two_packages(shop: &Workshop, k: &SigningKey) -> std::path::PathBuf {
    let root = shop.fresh("store");
    let (pm, _) = open_dir(&root).unwrap();
    trust(&pm, PUBLISHER, k);
    let base = shop.build(&Spec::module("ex.base", "1.0.0"), k);
    let user = shop.build(
        &Spec::module("ex.user", "1.0.0").module_dep(ModDep::on("ex.base", "1.0.0")),
        k,
    );
    for b in [&base, &user] {
        pm.install(&b.archive, InstallOptions::default()).unwrap();
    }
    root
}

#[test]
fn trusted_state_open_with_unchanged_trust_checks_no_signature() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    for reader in [false, true] {
        let (_pm, report, calls) = open_counting(&root, reader);
        assert_eq!(calls, 0, "reader {reader}: {report:?}");
        assert_eq!(report.verified, 2, "reader {reader}");
        assert_eq!(report.reauthenticated, 0, "reader {reader}");
        assert!(report.disabled.is_empty(), "reader {reader}: {report:?}");
    }
}

#[test]
fn trusted_state_a_trust_change_rechecks_once_and_a_revocation_refuses_at_open() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);

    // A key added for someone else changes the trust file: both versions are checked again, by
    // a reader in memory (it writes nothing, so the next reader checks again) ...
    {
        let (pm, _) = open_dir(&root).unwrap();
        trust(&pm, "org.other", &key());
    }
    for _ in 0..2 {
        let (_pm, report, calls) = open_counting(&root, true);
        assert_eq!((calls, report.reauthenticated), (2, 2), "{report:?}");
        assert!(report.disabled.is_empty(), "{report:?}");
    }
    // ... and by a writer, which records the new trust file for them: the next open checks none.
    let (pm, report, calls) = open_counting(&root, false);
    assert_eq!((calls, report.reauthenticated), (2, 2), "{report:?}");
    drop(pm);
    let (pm, report, calls) = open_counting(&root, false);
    assert_eq!((calls, report.reauthenticated), (0, 0), "{report:?}");
    drop(pm);

    // The signer's key revoked: the very next open refuses its versions, a reader's in its view
    // (the store still enables them) ...
    {
        let (pm, _) = open_dir(&root).unwrap();
        pm.update_trust(|t| Ok(t.revoke_key(k.key_id(), "leaked")))
            .unwrap();
    }
    // (A revoked key is refused before its signature would be checked.)
    let (reader, report, _) = open_counting(&root, true);
    assert_eq!(report.reauthenticated, 2, "{report:?}");
    let refused: Vec<&str> = report.disabled.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(refused, ["ex.base", "ex.user"], "{report:?}");
    assert!(reader.load_plan().unwrap().order.is_empty());
    let enabled = |pm: &PackageManager| {
        pm.list()
            .unwrap()
            .iter()
            .filter(|p| p.enabled.is_some())
            .count()
    };
    assert_eq!(enabled(&reader), 2, "a reader records nothing");
    drop(reader);
    // ... a writer's in the store.
    let (pm, report, _) = open_counting(&root, false);
    let disabled: Vec<&str> = report.disabled.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(disabled, ["ex.base", "ex.user"], "{report:?}");
    assert!(
        report.disabled[0].reason.contains("revoked"),
        "{:?}",
        report.disabled[0]
    );
    assert_eq!(enabled(&pm), 0);
    // And at load: a version loaded under the old trust is refused by the same check.
    assert!(matches!(
        pm.check_loadable(&id("ex.base"), &v("1.0.0")),
        Err(HostError::Unauthenticated { .. })
    ));
}

#[test]
fn trusted_state_an_old_registry_without_the_record_is_checked_once_and_gets_it() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    // The registry as a store written before the record existed has it (format 1, no log).
    guild_adapters_fs::store::testing::as_format_1(&root).unwrap();
    let registry = root.join("registry.json");
    let mut doc: Value = serde_json::from_slice(&fs::read(&registry).unwrap()).unwrap();
    let mut stripped = 0;
    for p in doc["packages"].as_array_mut().unwrap() {
        for version in p["versions"].as_array_mut().unwrap() {
            stripped += usize::from(
                version
                    .as_object_mut()
                    .unwrap()
                    .remove("trusted_under")
                    .is_some(),
            );
        }
    }
    assert_eq!(
        stripped, 2,
        "install records the trust file it authenticated under"
    );
    make_writable(&root);
    fs::write(&registry, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();

    let (pm, report, calls) = open_counting(&root, false);
    assert_eq!((calls, report.reauthenticated), (2, 2), "{report:?}");
    assert!(report.disabled.is_empty(), "{report:?}");
    drop(pm);
    let written = guild_adapters_fs::store::read_registry(&root)
        .unwrap()
        .unwrap();
    let recorded = written
        .installed()
        .filter(|(_, _, r)| r.trusted_under.is_some())
        .count();
    assert_eq!(recorded, 2, "{written:?}");
    let (_pm, _, calls) = open_counting(&root, false);
    assert_eq!(calls, 0);
}

#[test]
fn trusted_state_a_library_changed_after_install_is_refused_before_it_opens_and_tainted() {
    let shop = Workshop::new();
    let k = key();
    let root = shop.fresh("store");
    let (pm, _) = open_dir(&root).unwrap();
    trust(&pm, PUBLISHER, &k);
    let built = shop.build(&Spec::module("ex.solo", "1.0.0"), &k);
    pm.install(&built.archive, InstallOptions::default())
        .unwrap();
    drop(pm);
    let dir = root.join("packages/ex.solo/1.0.0");
    let lib = dir.join("libplugin.so");
    make_writable(&root);
    fs::write(&lib, b"a library with a backdoor").unwrap();

    // Opening hashes nothing: the store opens with the version enabled and planned ...
    let (pm, report) = open_dir(&root).unwrap();
    assert!(report.disabled.is_empty(), "{report:?}");
    assert_eq!(pm.load_plan().unwrap().order.len(), 1);
    // ... and the load refuses it before the loader sees it, naming the file.
    let fake = Arc::new(FakeLoader::new());
    fake.insert(
        &lib,
        FakePlugin::new().with_kernel(fake_kernel(
            ImplId::new("ex.solo.op.cpu").unwrap(),
            1,
            Backend::Cpu,
        )),
    );
    let host = Host::new(pm, Box::new(Shared(fake.clone())));
    let loaded = host.load_enabled().unwrap();
    assert!(loaded.loaded.is_empty(), "{loaded:?}");
    assert!(fake.opened().is_empty(), "{:?}", fake.opened());
    let (_, _, error) = &loaded.failed[0];
    let text = error.to_string();
    assert!(text.contains("libplugin.so"), "{text}");
    assert!(text.contains("tainted"), "{text}");
    drop(host);

    // It is tainted in the store, with the file.
    let (pm, _) = open_dir(&root).unwrap();
    let listed = pm.list().unwrap();
    let q = listed[0].versions[0].taint.clone().expect("tainted");
    assert_eq!(q.file.as_deref(), Some("libplugin.so"), "{q:?}");
    assert_eq!(listed[0].enabled, None);
}

#[test]
fn trusted_state_the_full_check_finds_a_changed_library_and_a_stripped_signature_on_any_threads() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    let solo = shop.build(&Spec::module("ex.solo", "1.0.0"), &k);
    let (pm, _) = open_dir(&root).unwrap();
    pm.install(&solo.archive, InstallOptions::default())
        .unwrap();
    drop(pm);
    make_writable(&root);
    fs::write(root.join("packages/ex.solo/1.0.0/libplugin.so"), b"changed").unwrap();
    let meta = root.join("packages/ex.base/1.0.0/.gkmetadata");
    let mut doc: Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
    doc["signatures"] = Value::Array(Vec::new());
    fs::write(&meta, serde_json::to_vec(&doc).unwrap()).unwrap();

    // A reader's full check reports and records nothing, the same on one thread as on four.
    let mut seen = Vec::new();
    for jobs in [1, 4] {
        let (reader, report, _) = open_counting(&root, true);
        assert!(
            report.disabled.is_empty(),
            "opening checks neither: {report:?}"
        );
        let found = reader
            .verify_all(VerifyOptions { jobs: Some(jobs) })
            .unwrap();
        assert_eq!(
            (found.checked, found.jobs, found.recorded),
            (3, jobs, false)
        );
        let failures: Vec<(String, Option<String>, bool)> = found
            .failures
            .iter()
            .map(|f| (f.id.to_string(), f.file.clone(), f.tampered))
            .collect();
        assert_eq!(
            failures,
            [
                ("ex.base".to_owned(), Some(".gkmetadata".to_owned()), true),
                ("ex.solo".to_owned(), Some("libplugin.so".to_owned()), true),
            ],
            "{found:?}"
        );
        seen.push(found.failures);
    }
    assert_eq!(seen[0], seen[1]);
    // A writer's full check disables them (and the dependent) in the store: `reverify`.
    let (pm, _, _) = open_counting(&root, false);
    let disabled: Vec<String> = pm
        .reverify()
        .unwrap()
        .iter()
        .map(|q| q.id.to_string())
        .collect();
    assert_eq!(disabled, ["ex.base", "ex.solo", "ex.user"]);
    assert!(pm.list().unwrap().iter().all(|p| p.enabled.is_none()));
}

#[test]
fn trusted_state_a_format_1_store_is_migrated_by_its_first_write_and_passes_the_full_check() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    // The store as the code before the registry log left it: the whole registry in format 1
    // (byte for byte what that code wrote for this state) and no log.
    guild_adapters_fs::store::testing::as_format_1(&root).unwrap();
    let registry = root.join("registry.json");
    let log = root.join("registry.log");
    let old = fs::read(&registry).unwrap();
    assert!(String::from_utf8_lossy(&old).contains("\"guild_registry\": 1"));
    assert!(!log.exists());
    // Opening, as a reader and as a writer that has nothing to change, leaves it as it is.
    for reader in [true, false] {
        let (pm, report, calls) = open_counting(&root, reader);
        assert_eq!((calls, report.verified), (0, 2), "{report:?}");
        drop(pm);
        assert_eq!(fs::read(&registry).unwrap(), old, "reader {reader}");
        assert!(!log.exists(), "reader {reader}");
    }
    // The first write migrates it: a checkpoint (format 3) and the log with that write's frame.
    let (pm, _, _) = open_counting(&root, false);
    let solo = shop.build(&Spec::module("ex.solo", "1.0.0"), &k);
    pm.install(&solo.archive, InstallOptions::default())
        .unwrap();
    drop(pm);
    assert!(String::from_utf8_lossy(&fs::read(&registry).unwrap()).contains("\"guild_registry\":3"));
    assert!(
        fs::metadata(&log).unwrap().len() > 48,
        "the install's frame"
    );
    let (pm, report, calls) = open_counting(&root, false);
    assert_eq!((calls, report.verified), (0, 3), "{report:?}");
    let found = pm.verify_all(VerifyOptions { jobs: Some(2) }).unwrap();
    assert_eq!(found.checked, 3, "{found:?}");
    assert!(found.failures.is_empty(), "{found:?}");
    assert!(found.disabled.is_empty(), "{found:?}");
}

/// Opening reads no installed version's `.gkmetadata` when no change was in flight: the
/// dependency graph and the impl-id claims a change is checked against come from the facts the
/// registry records with each version. With `ex.base`'s metadata replaced by garbage, a writer
/// and a reader open without a word, a package claiming `ex.base`'s impl id is still refused
/// and disabling `ex.base` is still refused for its dependent; the full check finds the
/// damage, and `guild recover`'s opening marks the version removed.
#[test]
fn trusted_state_opening_reads_no_metadata_and_changes_check_the_recorded_facts() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    let rival = shop.build(&Spec::module("ex.rival", "1.0.0").op("ex.base.op.cpu"), &k);
    make_writable(&root);
    fs::write(root.join("packages/ex.base/1.0.0/.gkmetadata"), b"garbage").unwrap();

    for reader in [false, true] {
        let (_pm, report, calls) = open_counting(&root, reader);
        assert_eq!(calls, 0, "reader {reader}");
        assert!(
            report.removed.is_empty() && report.disabled.is_empty(),
            "reader {reader}: opening read a version's metadata: {report:?}"
        );
    }
    let (pm, _, _) = open_counting(&root, false);
    let err = pm
        .install(&rival.archive, InstallOptions::default())
        .unwrap_err();
    assert!(
        err.to_string().contains("ex.base.op.cpu"),
        "the recorded claim of ex.base refuses it: {err}"
    );
    let err = pm.disable(&id("ex.base")).unwrap_err();
    assert!(err.to_string().contains("ex.user"), "{err}");

    let found = pm.verify_all(VerifyOptions { jobs: Some(1) }).unwrap();
    let failed: Vec<String> = found.failures.iter().map(|f| f.id.to_string()).collect();
    assert_eq!(failed, ["ex.base"], "{found:?}");
    drop(pm);
    let (_pm, report) = PackageManager::open_dir_recovering(&root).unwrap();
    assert!(report.recovery.swept, "{report:?}");
    let removed: Vec<String> = report.removed.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(removed, ["ex.base"], "{report:?}");
}

/// A runner finds a damaged tree when it loads, since opening reads none: `ex.base`'s garbage
/// `.gkmetadata` fails its load, naming the file, and `ex.user`, which depends on it, is not
/// opened.
#[test]
fn trusted_state_a_runner_refuses_a_damaged_tree_and_what_depends_on_it() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    make_writable(&root);
    fs::write(root.join("packages/ex.base/1.0.0/.gkmetadata"), b"garbage").unwrap();

    let (pm, report) = open_dir(&root).unwrap();
    assert!(report.disabled.is_empty(), "{report:?}");
    let fake = Arc::new(FakeLoader::new());
    let host = Host::new(pm, Box::new(Shared(fake.clone())));
    let loaded = host.load_enabled().unwrap();
    assert!(loaded.loaded.is_empty(), "{loaded:?}");
    assert!(fake.opened().is_empty(), "{:?}", fake.opened());
    let failed: Vec<(String, String)> = loaded
        .failed
        .iter()
        .map(|(id, _, e)| (id.to_string(), e.to_string()))
        .collect();
    assert_eq!(failed.len(), 1, "{loaded:?}");
    assert_eq!(failed[0].0, "ex.base");
    assert!(failed[0].1.contains(".gkmetadata"), "{}", failed[0].1);
    let skipped: Vec<String> = loaded.skipped.iter().map(|s| s.id.to_string()).collect();
    assert_eq!(skipped, ["ex.user"], "{loaded:?}");
}

/// Strips what the graph reads of each manifest from every version record, as a store written
/// before it was recorded has them (format 1, no log). Answers how many it stripped.
fn without_facts(root: &Path) -> usize {
    guild_adapters_fs::store::testing::as_format_1(root).unwrap();
    let registry = root.join("registry.json");
    let mut doc: Value = serde_json::from_slice(&fs::read(&registry).unwrap()).unwrap();
    let mut stripped = 0;
    for p in doc["packages"].as_array_mut().unwrap() {
        for version in p["versions"].as_array_mut().unwrap() {
            let record = version.as_object_mut().unwrap();
            stripped += usize::from(record.remove("manifest").is_some());
        }
    }
    make_writable(root);
    fs::write(&registry, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    stripped
}

/// A store written before versions recorded their manifest's facts opens as it always did: its
/// versions are read back at opening (a damaged one is marked removed and its dependent
/// disabled), changes are checked against what the metadata says, and the full check records
/// the facts, after which opening reads nothing.
#[test]
fn trusted_state_a_store_without_recorded_facts_is_read_back_and_the_full_check_records_them() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    assert_eq!(without_facts(&root), 2);
    let rival = shop.build(&Spec::module("ex.rival", "1.0.0").op("ex.base.op.cpu"), &k);
    {
        let (pm, report) = open_dir(&root).unwrap();
        assert!(
            report.removed.is_empty() && report.disabled.is_empty(),
            "{report:?}"
        );
        let err = pm
            .install(&rival.archive, InstallOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("ex.base.op.cpu"), "{err}");
        let found = pm.verify_all(VerifyOptions { jobs: Some(1) }).unwrap();
        assert!(found.failures.is_empty(), "{found:?}");
    }
    let written = guild_adapters_fs::store::read_registry(&root)
        .unwrap()
        .unwrap();
    assert_eq!(
        written
            .installed()
            .filter(|(_, _, r)| r.facts.is_some())
            .count(),
        2,
        "the full check records the facts"
    );

    // Damage in a store without facts is found by opening, as before.
    assert_eq!(without_facts(&root), 2);
    fs::write(root.join("packages/ex.base/1.0.0/.gkmetadata"), b"garbage").unwrap();
    let (_pm, report) = open_dir(&root).unwrap();
    let removed: Vec<String> = report.removed.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(removed, ["ex.base"], "{report:?}");
    let disabled: Vec<String> = report.disabled.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(disabled, ["ex.user"], "{report:?}");
}

/// Opening with an unchanged trust file checks no signature, and neither does loading what the
/// store records as verified under that file; once this handle changes the trust file, the next
/// load checks the version's signatures again.
#[test]
fn trusted_state_a_version_verified_under_the_opened_trust_loads_unchecked_until_trust_changes() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    // The reader first: the writer's trust change would have it check both at opening.
    for reader in [true, false] {
        let mut options = StoreOptions::new();
        options.reader = reader;
        let (store, recovery) = FsStore::open_with(&root, options).unwrap();
        let verifier = Counting::default();
        let (pm, _) = PackageManager::open(
            Box::new(store),
            recovery,
            Box::new(GkpkSource::default()),
            Box::new(verifier.clone()),
            platform(),
        )
        .unwrap();
        for package in ["ex.base", "ex.user"] {
            pm.check_loadable(&id(package), &v("1.0.0")).unwrap();
        }
        assert_eq!(verifier.calls(), 0, "reader {reader}");
        if reader {
            continue;
        }
        trust(&pm, "org.other", &key());
        pm.check_loadable(&id("ex.base"), &v("1.0.0")).unwrap();
        assert_eq!(
            verifier.calls(),
            1,
            "a trust change checks the version again"
        );
        pm.check_loadable(&id("ex.base"), &v("1.0.0")).unwrap();
        assert_eq!(verifier.calls(), 1, "once");
    }
}

/// A check after a trust change reads, checks and drops the versions' metadata a batch at a time
/// (two at a time in a debug build): refusals in any batch are found, every other version is
/// recorded as authenticated under the new trust file, and none is checked again by the next
/// open.
#[test]
fn trusted_state_a_trust_change_is_checked_batch_by_batch_and_finds_refusals_in_any_batch() {
    let shop = Workshop::new();
    let (k, other) = (key(), key());
    let root = shop.fresh("store");
    {
        let (pm, _) = open_dir(&root).unwrap();
        trust(&pm, PUBLISHER, &k);
        trust(&pm, PUBLISHER, &other);
        for i in 0..5 {
            // The second and the last are signed by the key revoked below.
            let signer = if i == 1 || i == 4 { &other } else { &k };
            let built = shop.build(&Spec::module(&format!("ex.batch{i}"), "1.0.0"), signer);
            pm.install(&built.archive, InstallOptions::default())
                .unwrap();
        }
        pm.update_trust(|t| Ok(t.revoke_key(other.key_id(), "leaked")))
            .unwrap();
    }
    let (pm, report, calls) = open_counting(&root, false);
    assert_eq!(report.reauthenticated, 5, "{report:?}");
    // A revoked key is refused before its signature would be checked.
    assert_eq!(calls, 3, "{report:?}");
    let disabled: Vec<&str> = report.disabled.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(disabled, ["ex.batch1", "ex.batch4"], "{report:?}");
    drop(pm);
    let (_pm, report, calls) = open_counting(&root, false);
    assert_eq!((calls, report.reauthenticated), (0, 0), "{report:?}");
    assert_eq!(report.verified, 3, "{report:?}");
}

/// The first writer after a trust change records the new trust file for every enabled version in
/// one log frame whose size does not grow with the store (a retrust, not every package's record
/// again), so that its commit rewrites no checkpoint either; a full reader, a reader of one
/// package and the next opening read back what it recorded.
#[test]
fn trusted_state_a_trust_change_is_recorded_in_a_small_frame_at_any_store_size() {
    let shop = Workshop::new();
    let k = key();
    let root = shop.fresh("store");
    let count = 8;
    {
        let (pm, _) = open_dir(&root).unwrap();
        trust(&pm, PUBLISHER, &k);
        for i in 0..count {
            let built = shop.build(&Spec::module(&format!("ex.many{i}"), "1.0.0"), &k);
            pm.install(&built.archive, InstallOptions::default())
                .unwrap();
        }
        trust(&pm, "org.other", &key());
    }
    let checkpoint = fs::read(root.join("registry.json")).unwrap();
    let log_len = || fs::metadata(root.join("registry.log")).unwrap().len();
    let before = log_len();
    let (pm, report, calls) = open_counting(&root, false);
    assert_eq!(
        (calls, report.reauthenticated),
        (count, count),
        "{report:?}"
    );
    drop(pm);
    assert_eq!(
        fs::read(root.join("registry.json")).unwrap(),
        checkpoint,
        "the checkpoint is not rewritten"
    );
    let frame = log_len() - before;
    assert!(frame < 512, "a frame of {frame} bytes for {count} packages");

    let written = guild_adapters_fs::store::read_registry(&root)
        .unwrap()
        .unwrap();
    let anchor = written.trust_anchor().unwrap().file_digest;
    assert_eq!(
        written
            .installed()
            .filter(|(_, _, r)| r.trusted_under == Some(anchor))
            .count(),
        count
    );
    let one = id("ex.many3");
    let (store, _) = FsStore::open_package_reader(&root, &one).unwrap();
    assert_eq!(
        store.registry().unwrap().package(&one),
        written.package(&one)
    );
    let (_pm, report, calls) = open_counting(&root, false);
    assert_eq!((calls, report.reauthenticated), (0, 0), "{report:?}");
}

/// Opening walks only the part of the graph where a version can fail to load (the packages
/// whose enabled version has a requirement, and those they name): in a store edited behind the
/// host's back so that `ex.base` is disabled under an enabled chain `ex.top -> ex.user ->
/// ex.base`, among packages that depend on nothing, opening disables exactly the chain, each
/// naming what it waits for, in the words and order a walk of every version gives, and leaves
/// the rest enabled.
#[test]
fn trusted_state_opening_disables_exactly_what_a_hand_disabled_dependency_blocks() {
    let shop = Workshop::new();
    let k = key();
    let root = two_packages(&shop, &k);
    {
        let (pm, _) = open_dir(&root).unwrap();
        let top = shop.build(
            &Spec::module("ex.top", "1.0.0").module_dep(ModDep::on("ex.user", "1.0.0")),
            &k,
        );
        pm.install(&top.archive, InstallOptions::default()).unwrap();
        for n in 0..3 {
            let alone = shop.build(&Spec::module(&format!("ex.alone{n}"), "1.0.0"), &k);
            pm.install(&alone.archive, InstallOptions::default())
                .unwrap();
        }
    }
    guild_adapters_fs::store::testing::as_format_1(&root).unwrap();
    let registry = root.join("registry.json");
    let mut doc: Value = serde_json::from_slice(&fs::read(&registry).unwrap()).unwrap();
    for p in doc["packages"].as_array_mut().unwrap() {
        if p["id"] == "ex.base" {
            p["versions"][0]["state"] = "disabled".into();
        }
    }
    make_writable(&root);
    fs::write(&registry, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();

    let (pm, report) = open_dir(&root).unwrap();
    let disabled: Vec<(String, String)> = report
        .disabled
        .iter()
        .map(|r| (r.id.to_string(), r.reason.clone()))
        .collect();
    assert_eq!(
        disabled,
        [
            (
                "ex.top".to_owned(),
                "ex.top@1.0.0 cannot load: its dependency ex.user@1.0.0 cannot load".to_owned()
            ),
            (
                "ex.user".to_owned(),
                "ex.user@1.0.0 cannot load: ex.user@1.0.0 requires module ex.base 1.0.0.., but \
                 no version of ex.base is enabled (installed: 1.0.0)"
                    .to_owned()
            ),
        ],
        "{report:?}"
    );
    let plan = pm.load_plan().unwrap();
    let order: Vec<String> = plan.order.iter().map(|p| p.id.to_string()).collect();
    assert_eq!(order, ["ex.alone0", "ex.alone1", "ex.alone2"], "{plan:?}");
    assert!(plan.blocked.is_empty(), "{plan:?}");
}
