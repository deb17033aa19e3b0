//! Opening a store: creation, the lock, fail-closed reading of damaged files, what recovery
//! reports, and the transactions a commit refuses.

use std::fs;
use std::path::{Path, PathBuf};

use guild_adapters_fs::store::{Fault, FaultMode, FsStore, StoreLayout, StoreOptions};
use guild_domain::graph::NodeRef;
use guild_domain::store_state::StoreState;
use guild_ports::store::{PackageStore, StoreError, StoreErrorKind, Transaction};

use super::{
    assert_no_leftovers, change, id, new_version, publish, snapshot, stage_tree, v, ENABLED,
};

fn open_err(root: &Path) -> StoreError {
    FsStore::open(root).map(|_| ()).unwrap_err()
}

/// A store holding a@1.0.0 enabled, closed again.
fn store_with_one_package() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, _) = FsStore::open(&root).unwrap();
    publish(&store, "a", "1.0.0", ENABLED).unwrap();
    (dir, root)
}

/// A store whose next publish crashed after its journal record became durable, closed again;
/// answers the record's path.
fn store_with_journal_record() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (dir, root) = store_with_one_package();
    let fault = Some(Fault {
        step: 5,
        mode: FaultMode::Crash,
    });
    let (store, _) = FsStore::open_with(&root, StoreOptions::new().with_fault(fault)).unwrap();
    let err = publish(&store, "b", "1.0.0", ENABLED).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::SimulatedCrash);
    drop(store);
    let record = StoreLayout::new(&root)
        .journal
        .join("00000000000000000002.intent");
    assert!(record.is_file());
    (dir, root, record)
}

#[test]
fn store_open_creates_the_layout_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("new");
    let (store, report) = FsStore::open(&root).unwrap();
    assert!(report.created);
    assert_eq!(report.generation, 0);
    assert_eq!(store.registry().unwrap(), StoreState::new());
    assert_eq!(store.read_trust().unwrap(), None);
    drop(store);
    assert_no_leftovers(&root);
    let (_store, report) = FsStore::open(&root).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn store_second_open_is_locked_until_the_first_closes() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = FsStore::open(dir.path()).unwrap();
    let err = open_err(dir.path());
    assert_eq!(err.kind, StoreErrorKind::Locked);
    assert_eq!(err.path, Some(dir.path().join("lock")));
    drop(first);
    FsStore::open(dir.path()).unwrap();
}

#[test]
fn store_lock_message_names_the_holder_not_another_user() {
    let dir = tempfile::tempdir().unwrap();
    let (_first, _) = FsStore::open(dir.path()).unwrap();
    let err = FsStore::open_with(
        dir.path(),
        StoreOptions {
            lock_wait: std::time::Duration::ZERO,
            ..StoreOptions::new()
        },
    )
    .map(|_| ())
    .unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Locked);
    let text = err.to_string();
    assert!(!text.contains("another user"), "{text}");
    // Both handles are this process's, and the message says so, with its pid.
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
    assert!(text.contains("this process"), "{text}");
}

#[test]
fn store_lock_planted_as_a_symlink_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let outside = dir.path().join("outside");
    FsStore::open(&root).unwrap();
    fs::remove_file(root.join("lock")).unwrap();
    let victim = outside.join("victim");
    fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&victim, root.join("lock")).unwrap();
    let err = open_err(&root);
    assert_eq!(err.path, Some(root.join("lock")), "{err}");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    assert!(!victim.exists(), "the lock was opened through the link");

    // A link to an existing file is refused as well, and the file is left alone.
    fs::write(&victim, b"precious").unwrap();
    let err = open_err(&root);
    assert_eq!(err.path, Some(root.join("lock")), "{err}");
    assert_eq!(fs::read(&victim).unwrap(), b"precious");

    // So is a directory in its place.
    fs::remove_file(root.join("lock")).unwrap();
    fs::create_dir(root.join("lock")).unwrap();
    let err = open_err(&root);
    assert_eq!(err.path, Some(root.join("lock")), "{err}");
}

#[test]
fn store_corrupt_registry_fails_closed_naming_the_file() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    let good = fs::read(&layout.registry).unwrap();
    // Leave debris that recovery would otherwise clear, to prove nothing is touched.
    fs::create_dir(layout.staging.join("debris")).unwrap();
    let before = snapshot(&root);

    fs::write(&layout.registry, &good[..good.len() / 2]).unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert_eq!(err.path.as_deref(), Some(layout.registry.as_path()));
    assert!(
        err.to_string().starts_with(&format!(
            "store file is corrupt: decode registry ({}): not strict JSON:",
            layout.registry.display()
        )),
        "{err}"
    );
    fs::write(&layout.registry, b"").unwrap();
    assert_eq!(open_err(&root).kind, StoreErrorKind::Corrupt);
    let extra = String::from_utf8(good.clone()).unwrap().replacen(
        "\"generation\"",
        "\"owner\": \"me\",\n  \"generation\"",
        1,
    );
    fs::write(&layout.registry, extra).unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert!(
        err.to_string().ends_with("unknown field at $.owner"),
        "{err}"
    );

    // Failing closed left the packages and the debris alone.
    fs::write(&layout.registry, &good).unwrap();
    assert_eq!(snapshot(&root), before);
    assert!(layout.staging.join("debris").is_dir());
}

#[test]
fn store_unknown_registry_format_fails_closed() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    let text = fs::read_to_string(&layout.registry).unwrap();
    fs::write(
        &layout.registry,
        text.replace("\"guild_registry\":3", "\"guild_registry\":4"),
    )
    .unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::UnsupportedFormat);
    assert_eq!(err.path.as_deref(), Some(layout.registry.as_path()));
    assert!(
        err.to_string()
            .ends_with("store state format 4 is not supported; this build reads formats 1 (a whole store state), 2 (a checkpoint) and 3 (a checkpoint with an index)"),
        "{err}"
    );
}

#[test]
fn store_missing_registry_with_packages_fails_closed() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    fs::remove_file(&layout.registry).unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert_eq!(
        err.what,
        "registry file is missing but the store holds package trees"
    );
    assert!(layout.packages.join("a/1.0.0/.gkmetadata").is_file());
}

#[test]
fn store_truncated_journal_record_fails_closed_naming_the_file() {
    let (_dir, root, record) = store_with_journal_record();
    let bytes = fs::read(&record).unwrap();
    fs::write(&record, &bytes[..bytes.len() / 2]).unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert_eq!(err.path.as_deref(), Some(record.as_path()));
    assert_eq!(err.what, "decode journal record");
    // Nothing was cleaned up: the record is evidence.
    assert_eq!(fs::read(&record).unwrap(), &bytes[..bytes.len() / 2]);
}

#[test]
fn store_unknown_journal_format_fails_closed() {
    let (_dir, root, record) = store_with_journal_record();
    let text = fs::read_to_string(&record).unwrap();
    fs::write(
        &record,
        text.replace("\"guild_journal\": 1", "\"guild_journal\": 3"),
    )
    .unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::UnsupportedFormat);
    assert_eq!(err.path.as_deref(), Some(record.as_path()));
    assert!(
        err.to_string().contains("this build reads formats 1 and 2"),
        "{err}"
    );
}

#[test]
fn store_journal_ahead_of_the_registry_fails_closed() {
    let (_dir, root, record) = store_with_journal_record();
    let text = fs::read_to_string(&record).unwrap();
    fs::write(
        &record,
        text.replace("\"from_generation\": 1", "\"from_generation\": 7")
            .replace("\"to_generation\": 2", "\"to_generation\": 8"),
    )
    .unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert_eq!(
        err.what,
        "journal record moves generation 7 to 8, but the store state is at 1"
    );
    let stray = StoreLayout::new(&root).journal.join("notes.txt");
    fs::write(&record, text).unwrap();
    fs::write(&stray, b"hello").unwrap();
    let err = open_err(&root);
    assert_eq!(
        (err.kind, err.path),
        (StoreErrorKind::Corrupt, Some(stray.clone()))
    );
}

#[test]
fn store_recovery_reports_what_it_did_and_is_idempotent() {
    let (_dir, root, _record) = store_with_journal_record();
    let layout = StoreLayout::new(&root);
    // Debris of other kinds: a tree no record accounts for, a stale temporary file.
    let zombie = layout.packages.join("zombie/9.9.9");
    fs::create_dir_all(&zombie).unwrap();
    fs::write(&layout.registry_tmp, b"half a regis").unwrap();

    let (store, report) = FsStore::open(&root).unwrap();
    assert_eq!(report.generation, 1);
    assert!(report.rolled_forward.is_empty());
    assert_eq!(report.rolled_back.len(), 1);
    let interrupted = &report.rolled_back[0];
    assert_eq!(
        (interrupted.from_generation, interrupted.to_generation),
        (1, 2)
    );
    assert_eq!(
        interrupted.installs,
        [NodeRef {
            id: id("b"),
            version: v("1.0.0")
        }]
    );
    // The tree no record accounts for stays, reported; the rest is cleared.
    assert!(report.removed_trees.is_empty(), "{report:?}");
    assert_eq!(report.unaccounted_trees, std::slice::from_ref(&zombie));
    assert!(zombie.exists());
    assert_eq!(report.removed_staging.len(), 1, "the staged tree of b");
    assert_eq!(report.removed_temp_files, vec![layout.registry_tmp.clone()]);
    assert!(report.missing_trees.is_empty());
    // It kept a tree, so the next opening sweeps again.
    assert!(layout.sweep_marker.exists());
    // The operator, having looked, removes it and recovers: nothing is left to sweep.
    fs::remove_dir_all(layout.packages.join("zombie")).unwrap();
    let again = store.recover().unwrap();
    assert!(again.is_clean(), "{again:?}");
    assert_no_leftovers(&root);
    assert!(store.recover().unwrap().is_clean());
    drop(store);
    let (_store, reopened) = FsStore::open(&root).unwrap();
    assert!(reopened.is_clean(), "{reopened:?}");
}

#[test]
fn store_recovery_rolls_forward_after_the_commit_point() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    {
        let (store, _) = FsStore::open(&root).unwrap();
        publish(&store, "a", "2.0.0", ENABLED).unwrap();
    }
    // Crash at "delete old tree": the registry no longer installs a@1.0.0, its tree is still there.
    let fault = Some(Fault {
        step: 7,
        mode: FaultMode::Crash,
    });
    let (store, _) = FsStore::open_with(&root, StoreOptions::new().with_fault(fault)).unwrap();
    let err = change(&store, |r| r.remove(&id("a"), &v("1.0.0"))).unwrap_err();
    assert_eq!(store.last_op().steps.last(), Some(&"delete old tree"));
    assert_eq!(err.kind, StoreErrorKind::SimulatedCrash);
    drop(store);
    assert!(layout.packages.join("a/1.0.0").is_dir());

    let (store, report) = FsStore::open(&root).unwrap();
    assert_eq!(report.generation, 3);
    assert_eq!(report.rolled_forward.len(), 1);
    assert_eq!(
        report.rolled_forward[0].delete,
        [NodeRef {
            id: id("a"),
            version: v("1.0.0")
        }]
    );
    assert_eq!(report.removed_trees, [layout.packages.join("a/1.0.0")]);
    assert!(!store
        .registry()
        .unwrap()
        .is_installed(&id("a"), &v("1.0.0")));
    assert_no_leftovers(&root);
}

#[test]
fn store_recovery_reports_a_missing_tree() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    let tree = layout.packages.join("a");
    fs::rename(&tree, root.join("elsewhere")).unwrap();
    // Opening does not list the package trees when no change was in flight; an explicit
    // recovery does.
    let (store, report) = FsStore::open(&root).unwrap();
    assert!(
        !report.swept && report.missing_trees.is_empty(),
        "{report:?}"
    );
    let report = store.recover().unwrap();
    assert!(report.swept);
    assert_eq!(
        report.missing_trees,
        [NodeRef {
            id: id("a"),
            version: v("1.0.0")
        }]
    );
}

#[test]
fn store_runtime_recovery_keeps_staging_it_handed_out() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = FsStore::open(dir.path()).unwrap();
    let staged = stage_tree(&store, "a", "1.0.0");
    let report = store.recover().unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert!(staged.join(".gkmetadata").is_file());
    store.discard_staging(&staged).unwrap();
    assert!(!staged.exists());
    store.discard_staging(&staged).unwrap();
    let outside = dir.path().join("packages");
    let err = store.discard_staging(&outside).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::InvalidTransaction);
    assert!(outside.is_dir(), "a path outside staging is never deleted");
}

#[test]
fn store_is_a_shareable_port_and_seals_a_read_only_staged_root() {
    fn shareable<T: Send + Sync>() {}
    shareable::<FsStore>();
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = FsStore::open(dir.path()).unwrap();
    let store: Box<dyn PackageStore> = Box::new(store);
    // An extractor that seals the staged root itself must not break the move into place.
    let before = store.registry().unwrap();
    let mut next = before.successor();
    next.publish(&id("a"), &v("1.0.0"), new_version("a", "1.0.0"), ENABLED)
        .unwrap();
    let staged = store.new_staging_dir().unwrap();
    fs::create_dir(&staged).unwrap();
    fs::write(staged.join(".gkmetadata"), b"{}").unwrap();
    let mut perms = fs::metadata(&staged).unwrap().permissions();
    perms.set_readonly(true);
    fs::set_permissions(&staged, perms).unwrap();
    let tx = Transaction::new(0, next).with_install(id("a"), v("1.0.0"), staged);
    assert_eq!(store.commit(tx).unwrap().generation, 1);
    let installed = store.package_dir(&id("a"), &v("1.0.0"));
    assert!(fs::metadata(&installed).unwrap().permissions().readonly());
    assert_eq!(fs::read(installed.join(".gkmetadata")).unwrap(), b"{}");
}

#[test]
fn store_trust_bytes_round_trip_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = FsStore::open(dir.path()).unwrap();
    store.write_trust(b"first").unwrap();
    store.write_trust(b"second").unwrap();
    assert_eq!(store.read_trust().unwrap(), Some(b"second".to_vec()));
    assert_eq!(store.last_op().fsyncs, 2);
    drop(store);
    let (store, _) = FsStore::open(dir.path()).unwrap();
    assert_eq!(store.read_trust().unwrap(), Some(b"second".to_vec()));
}

/// Commits `tx` and expects it refused with `kind`, leaving the store as it was and every staged
/// tree (if any) gone.
fn refused(store: &FsStore, root: &Path, tx: Transaction, kind: StoreErrorKind) -> StoreError {
    let before = snapshot(root);
    let staged: Vec<PathBuf> = tx.installs.iter().map(|i| i.staged.clone()).collect();
    let err = store.commit(tx).unwrap_err();
    assert_eq!(err.kind, kind, "{err}");
    assert_eq!(snapshot(root), before);
    for staged in staged
        .iter()
        .filter(|s| s.starts_with(root.join("staging")))
    {
        assert!(
            !staged.exists(),
            "the refused commit did not consume its staged tree {}",
            staged.display()
        );
    }
    assert_eq!(store.registry().unwrap().generation(), 1);
    err
}

#[test]
fn store_refuses_inconsistent_transactions() {
    let (_dir, root) = store_with_one_package();
    let (store, _) = FsStore::open(&root).unwrap();
    let current = store.registry().unwrap();

    let stale = Transaction::new(0, current.successor());
    let err = refused(&store, &root, stale, StoreErrorKind::GenerationConflict);
    assert_eq!(
        err.what,
        "the transaction was computed from generation 0 but the store state is at 1"
    );

    let no_step = Transaction::new(1, current.clone());
    let err = refused(&store, &root, no_step, StoreErrorKind::InvalidTransaction);
    assert_eq!(err.what, "the new store state has generation 1, not 1 + 1");

    let dropped = Transaction::new(1, StoreState::new().successor().successor());
    let err = refused(&store, &root, dropped, StoreErrorKind::InvalidTransaction);
    assert_eq!(err.what, "the new store state drops the record of a@1.0.0");

    // A new version in the registry without its tree, and a tree without its version.
    let mut next = current.successor();
    next.publish(&id("b"), &v("1.0.0"), new_version("b", "1.0.0"), ENABLED)
        .unwrap();
    let err = refused(
        &store,
        &root,
        Transaction::new(1, next.clone()),
        StoreErrorKind::InvalidTransaction,
    );
    assert_eq!(
        err.what,
        "the new store state installs [b@1.0.0] but the transaction stages nothing"
    );
    let staged = stage_tree(&store, "c", "1.0.0");
    let wrong = Transaction::new(1, next.clone()).with_install(id("c"), v("1.0.0"), staged);
    let err = refused(&store, &root, wrong, StoreErrorKind::InvalidTransaction);
    assert_eq!(
        err.what,
        "the new store state installs [b@1.0.0] but the transaction stages c@1.0.0"
    );

    // A staged tree outside the staging area is refused and left alone.
    let outside = root.join("outside");
    fs::create_dir(&outside).unwrap();
    let tx = Transaction::new(1, next.clone()).with_install(id("b"), v("1.0.0"), outside.clone());
    refused(&store, &root, tx, StoreErrorKind::InvalidTransaction);
    assert!(outside.is_dir());
    fs::remove_dir(&outside).unwrap();

    // A staged tree holding a symbolic link is refused during sealing, and rolled back.
    let staged = stage_tree(&store, "b", "1.0.0");
    #[cfg(unix)]
    std::os::unix::fs::symlink("/etc/passwd", staged.join("lib/evil")).unwrap();
    let tx = Transaction::new(1, next).with_install(id("b"), v("1.0.0"), staged);
    let err = refused(&store, &root, tx, StoreErrorKind::InvalidTransaction);
    assert_eq!(
        err.what,
        "staged tree holds something other than a regular file or directory"
    );
    assert_no_leftovers(&root);

    // And the handle still works.
    publish(&store, "b", "1.0.0", ENABLED).unwrap();
    assert_eq!(store.registry().unwrap().generation(), 2);
}

/// A transaction of several installs must stage exactly the versions its new state adds, each
/// once and each from its own staged tree; anything else is refused whole, every staged tree
/// consumed, the store unchanged.
#[test]
fn store_refuses_a_transaction_whose_installs_do_not_match_its_new_state() {
    let (_dir, root) = store_with_one_package();
    let (store, _) = FsStore::open(&root).unwrap();
    let current = store.registry().unwrap();
    let mut next = current.successor();
    for pkg in ["b", "c"] {
        next.publish(&id(pkg), &v("1.0.0"), new_version(pkg, "1.0.0"), ENABLED)
            .unwrap();
    }
    let with = |pkgs: &[&str]| {
        pkgs.iter()
            .fold(Transaction::new(1, next.clone()), |tx, pkg| {
                let staged = stage_tree(&store, pkg, "1.0.0");
                tx.with_install(id(pkg), v("1.0.0"), staged)
            })
    };

    let err = refused(
        &store,
        &root,
        with(&["b"]),
        StoreErrorKind::InvalidTransaction,
    );
    assert_eq!(
        err.what,
        "the new store state installs [b@1.0.0, c@1.0.0] but the transaction stages b@1.0.0"
    );
    let err = refused(
        &store,
        &root,
        with(&["b", "c", "d"]),
        StoreErrorKind::InvalidTransaction,
    );
    assert_eq!(
        err.what,
        "the new store state installs [b@1.0.0, c@1.0.0] but the transaction stages b@1.0.0, \
         c@1.0.0, d@1.0.0"
    );
    let err = refused(
        &store,
        &root,
        with(&["b", "c", "b"]),
        StoreErrorKind::InvalidTransaction,
    );
    assert_eq!(err.what, "the transaction stages two trees for b@1.0.0");

    // One staged tree named for two versions.
    let staged = stage_tree(&store, "b", "1.0.0");
    let twice = Transaction::new(1, next.clone())
        .with_install(id("b"), v("1.0.0"), staged.clone())
        .with_install(id("c"), v("1.0.0"), staged.clone());
    let err = refused(&store, &root, twice, StoreErrorKind::InvalidTransaction);
    assert_eq!(
        err.what,
        "the transaction stages the tree of c@1.0.0 where it stages another version's"
    );
    assert_eq!(err.path.as_deref(), Some(staged.as_path()));

    // A replacement of a version that is not installed, beside the right installs.
    let replacing =
        with(&["b", "c"]).with_replacement(id("z"), v("1.0.0"), stage_tree(&store, "z", "1.0.0"));
    let err = refused(&store, &root, replacing, StoreErrorKind::InvalidTransaction);
    assert_eq!(
        err.what,
        "the transaction replaces the tree of z@1.0.0, which is not installed before and after it"
    );
    assert_no_leftovers(&root);

    // The right installs commit, as one generation.
    store.commit(with(&["c", "b"])).unwrap();
    assert_eq!(store.registry().unwrap().generation(), 2);
    for pkg in ["b", "c"] {
        assert!(store.package_dir(&id(pkg), &v("1.0.0")).is_dir(), "{pkg}");
    }
    assert_no_leftovers(&root);
}

/// Writes `text` as the journal record of the transaction to generation 2 of the store at `root`
/// and, for each `pkg@1.0.0` in `trees`, the tree an interrupted commit moved into place.
fn interrupted_by_hand(root: &Path, text: &str, trees: &[&str]) {
    let layout = StoreLayout::new(root);
    fs::write(layout.journal.join("00000000000000000002.intent"), text).unwrap();
    for pkg in trees {
        let tree = layout.package_dir(&id(pkg), &v("1.0.0"));
        fs::create_dir_all(tree.join("lib")).unwrap();
        fs::write(tree.join(".gkmetadata"), pkg).unwrap();
    }
}

/// A record an older build left (journal format 1, one install, its bytes as that build wrote
/// them) is recovered as before: the transaction is undone and its tree deleted.
#[test]
fn store_recovers_a_format_1_record_left_by_an_older_build() {
    let (_dir, root) = store_with_one_package();
    let before = snapshot(&root);
    interrupted_by_hand(
        &root,
        r#"{
  "guild_journal": 1,
  "from_generation": 1,
  "to_generation": 2,
  "install": {
    "id": "b",
    "version": "1.0.0",
    "staged": "4242-0-0"
  },
  "delete": []
}
"#,
        &["b"],
    );
    let (_store, report) = FsStore::open(&root).unwrap();
    assert_eq!(report.rolled_back.len(), 1, "{report:?}");
    assert_eq!(report.rolled_back[0].installs, [node("b")]);
    assert_eq!(snapshot(&root), before);
    assert_no_leftovers(&root);
}

fn node(pkg: &str) -> NodeRef {
    NodeRef {
        id: id(pkg),
        version: v("1.0.0"),
    }
}

/// A format-2 record of an interrupted transaction of several installs: recovery deletes every
/// tree the record names and keeps, reported as unaccounted, a tree it does not name.
#[test]
fn store_recovers_a_record_of_several_installs_deleting_only_what_it_names() {
    let (_dir, root) = store_with_one_package();
    let before = snapshot(&root);
    interrupted_by_hand(
        &root,
        r#"{"guild_journal": 2, "from_generation": 1, "to_generation": 2,
            "installs": [{"id": "b", "version": "1.0.0", "staged": "4242-0-0"},
                         {"id": "c", "version": "1.0.0", "staged": "4242-1-0"}],
            "delete": []}"#,
        &["b", "c", "stray"],
    );
    let (_store, report) = FsStore::open(&root).unwrap();
    assert_eq!(report.rolled_back.len(), 1, "{report:?}");
    assert_eq!(report.rolled_back[0].installs, [node("b"), node("c")]);
    let layout = StoreLayout::new(&root);
    let stray = layout.package_dir(&id("stray"), &v("1.0.0"));
    assert_eq!(report.unaccounted_trees, std::slice::from_ref(&stray));
    assert!(stray.is_dir());
    for pkg in ["b", "c"] {
        assert!(!layout.package_dir(&id(pkg), &v("1.0.0")).exists(), "{pkg}");
    }
    fs::remove_dir_all(layout.packages.join("stray")).unwrap();
    drop(_store);
    // The kept tree left the marker; the next opening sweeps, keeps nothing and removes it.
    assert!(layout.sweep_marker.exists());
    let (_store, report) = FsStore::open(&root).unwrap();
    assert!(
        report.swept && report.unaccounted_trees.is_empty(),
        "{report:?}"
    );
    assert_eq!(snapshot(&root), before);
    assert_no_leftovers(&root);
}

#[test]
fn store_refuses_a_changed_digest_even_for_a_removed_version() {
    let (_dir, root) = store_with_one_package();
    let (store, _) = FsStore::open(&root).unwrap();
    change(&store, |r| r.remove(&id("a"), &v("1.0.0"))).unwrap();
    // Build a registry that forgets the tombstone and records other content for a@1.0.0; the
    // domain refuses to do this, so the test edits a hand-written file instead.
    let current = store.registry().unwrap();
    let text = String::from_utf8(current.successor().to_json()).unwrap();
    let other = new_version("a", "other").payload_digest.to_hex();
    let recorded = new_version("a", "1.0.0").payload_digest.to_hex();
    let forged = StoreState::from_json(text.replace(&recorded, &other).as_bytes()).unwrap();
    let before = snapshot(&root);
    let err = store.commit(Transaction::new(2, forged)).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::InvalidTransaction);
    assert_eq!(
        err.what,
        "the new store state changes the recorded payload of a@1.0.0"
    );
    assert_eq!(snapshot(&root), before);
}

#[test]
fn store_drops_a_removed_record_only_when_the_transaction_purges_it_by_name() {
    let (_dir, root) = store_with_one_package();
    let (store, _) = FsStore::open(&root).unwrap();
    publish(&store, "a", "2.0.0", ENABLED).unwrap();
    change(&store, |r| r.remove(&id("a"), &v("1.0.0"))).unwrap();
    let current = store.registry().unwrap();
    let generation = current.generation();
    let mut next = current.successor();
    next.purge(&id("a"), Some(&v("1.0.0"))).unwrap();
    let before = snapshot(&root);

    // Without naming it, the dropped tombstone is refused as any dropped record is.
    let err = store
        .commit(Transaction::new(generation, next.clone()))
        .unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::InvalidTransaction);
    assert_eq!(err.what, "the new store state drops the record of a@1.0.0");
    // Naming a record that is not removed, or one the new store state keeps, is refused too.
    let installed = Transaction::new(generation, next.clone())
        .with_purge(vec![(id("a"), v("1.0.0")), (id("a"), v("2.0.0"))]);
    let err = store.commit(installed).unwrap_err();
    assert_eq!(
        err.what,
        "the transaction purges a@2.0.0, which is enabled, not removed"
    );
    let kept =
        Transaction::new(generation, current.successor()).with_purge(vec![(id("a"), v("1.0.0"))]);
    let err = store.commit(kept).unwrap_err();
    assert_eq!(
        err.what,
        "the transaction purges a@1.0.0, but the new store state keeps its record"
    );
    let unknown = Transaction::new(generation, next.clone())
        .with_purge(vec![(id("a"), v("1.0.0")), (id("z"), v("1.0.0"))]);
    let err = store.commit(unknown).unwrap_err();
    assert_eq!(
        err.what,
        "the transaction purges z@1.0.0, which is not recorded"
    );
    assert_eq!(snapshot(&root), before);

    // Named, it commits, and readers and a reopened writer see the record gone.
    store
        .commit(Transaction::new(generation, next.clone()).with_purge(vec![(id("a"), v("1.0.0"))]))
        .unwrap();
    assert_eq!(committed(&root).record(&id("a"), &v("1.0.0")), None);
    assert!(committed(&root).record(&id("a"), &v("2.0.0")).is_some());
    drop(store);
    let (store, _) = FsStore::open(&root).unwrap();
    assert_eq!(store.registry().unwrap(), committed(&root));

    // The whole package goes with its last record, and a fresh a@1.0.0 with other content may
    // be installed after that.
    change(&store, |r| r.remove(&id("a"), &v("2.0.0"))).unwrap();
    let current = store.registry().unwrap();
    let mut next = current.successor();
    next.purge(&id("a"), None).unwrap();
    store
        .commit(
            Transaction::new(current.generation(), next).with_purge(vec![(id("a"), v("2.0.0"))]),
        )
        .unwrap();
    assert!(committed(&root).package(&id("a")).is_none());
    let staged = stage_tree(&store, "a", "1.0.0");
    let current = store.registry().unwrap();
    let mut next = current.successor();
    next.publish(&id("a"), &v("1.0.0"), new_version("a", "other"), ENABLED)
        .unwrap();
    store
        .commit(Transaction::new(current.generation(), next).with_install(
            id("a"),
            v("1.0.0"),
            staged,
        ))
        .unwrap();
    assert_eq!(
        committed(&root)
            .record(&id("a"), &v("1.0.0"))
            .unwrap()
            .payload_digest,
        new_version("a", "other").payload_digest
    );
}

/// The committed state of the store at `root`, as a reader reads it.
fn committed(root: &Path) -> StoreState {
    guild_adapters_fs::store::read_registry(root)
        .unwrap()
        .unwrap()
}

fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    let mut file = fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

/// A torn append is only ever found with its commit's journal record in place (the record is
/// durable before the append starts): the store crashed after the record; then the tail.
#[test]
fn store_log_torn_tail_is_ignored_by_readers_and_cut_by_the_writer() {
    for (what, tail) in [
        ("half a length", vec![0x10, 0x00]),
        (
            "a frame longer than the file",
            b"\x40\x00\x00\x00partial".to_vec(),
        ),
        ("zeros left by a power loss", vec![0; 300]),
    ] {
        let (_dir, root, record) = store_with_journal_record();
        let layout = StoreLayout::new(&root);
        let state = committed(&root);
        let good = fs::read(&layout.log).unwrap();
        append(&layout.log, &tail);
        let (reader, _) = FsStore::open_with(&root, StoreOptions::new().reader()).unwrap();
        assert_eq!(reader.registry().unwrap(), state, "{what}");
        drop(reader);
        assert_eq!(
            fs::read(&layout.log).unwrap().len(),
            good.len() + tail.len()
        );
        let (store, report) = FsStore::open(&root).unwrap();
        assert_eq!(
            report.removed_temp_files,
            std::slice::from_ref(&layout.log),
            "{what}"
        );
        assert_eq!(fs::read(&layout.log).unwrap(), good, "{what}: cut back");
        assert_eq!(report.rolled_back.len(), 1, "{what}: {report:?}");
        assert!(!record.exists(), "{what}");
        assert_eq!(store.registry().unwrap(), state);
        assert!(store.recover().unwrap().is_clean());
        // The next frame lands where the torn one was.
        publish(&store, "b", "1.0.0", ENABLED).unwrap();
        drop(store);
        assert!(committed(&root).is_installed(&id("b"), &v("1.0.0")));
    }
}

#[test]
fn store_log_bad_frame_before_good_ones_fails_closed_naming_the_offset() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    {
        let (store, _) = FsStore::open(&root).unwrap();
        publish(&store, "b", "1.0.0", ENABLED).unwrap();
    }
    let good = fs::read(&layout.log).unwrap();
    // The first frame starts right after the 48-byte header; flip a byte of its payload.
    let mut bad = good.clone();
    bad[48 + 36 + 10] ^= 0x20;
    fs::write(&layout.log, &bad).unwrap();
    for reader in [false, true] {
        let options = if reader {
            StoreOptions::new().reader()
        } else {
            StoreOptions::new()
        };
        let err = FsStore::open_with(&root, options).map(|_| ()).unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
        assert_eq!(err.path.as_deref(), Some(layout.log.as_path()));
        let second = 48 + 36 + u32::from_le_bytes(good[48..52].try_into().unwrap()) as usize;
        assert!(
            err.to_string().contains(&format!(
                "read registry log ({}): at byte offset 48: a frame runs past the end of the \
                 file or fails its checksum, and a complete frame follows it at byte offset \
                 {second}",
                layout.log.display()
            )),
            "{err}"
        );
    }
    assert_eq!(
        fs::read(&layout.log).unwrap(),
        bad,
        "failing closed wrote nothing"
    );
    fs::write(&layout.log, &good).unwrap();
    assert!(committed(&root).is_installed(&id("b"), &v("1.0.0")));
}

#[test]
fn store_checkpoint_without_its_log_fails_closed() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    fs::remove_file(&layout.log).unwrap();
    let err = open_err(&root);
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert_eq!(err.path.as_deref(), Some(layout.log.as_path()));
    assert_eq!(
        err.what,
        "the registry is a checkpoint (format 2 or 3) but its log is missing"
    );
}

#[test]
fn store_format_1_opens_unchanged_and_the_first_write_migrates_it() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    let state = committed(&root);
    // The whole registry in format 1 and no log: what the code before the log wrote.
    guild_adapters_fs::store::testing::as_format_1(&root).unwrap();
    let old = fs::read(&layout.registry).unwrap();
    assert_eq!(old, state.to_json());
    for reader in [true, false] {
        let options = if reader {
            StoreOptions::new().reader()
        } else {
            StoreOptions::new()
        };
        let (store, report) = FsStore::open_with(&root, options).unwrap();
        assert!(report.is_clean(), "{report:?}");
        assert_eq!(store.registry().unwrap(), state);
        drop(store);
        assert_eq!(fs::read(&layout.registry).unwrap(), old, "opening wrote");
        assert!(!layout.log.exists());
    }
    let (store, _) = FsStore::open(&root).unwrap();
    publish(&store, "b", "1.0.0", ENABLED).unwrap();
    let after = store.registry().unwrap();
    drop(store);
    let text = fs::read_to_string(&layout.registry).unwrap();
    assert!(text.contains("\"guild_registry\":3"), "{text}");
    assert_eq!(
        StoreState::from_json(text.as_bytes())
            .unwrap_err()
            .to_string(),
        "store state format 3 is not supported; this build reads formats 1 (a whole store state), \
         2 (a checkpoint) and 3 (a checkpoint with an index)",
        "a format-1 reader refuses the checkpoint"
    );
    assert_eq!(committed(&root), after);
    let (_store, report) = FsStore::open(&root).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn store_log_compacts_once_it_passes_its_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let layout = StoreLayout::new(&root);
    let (store, _) = FsStore::open_with(&root, StoreOptions::new().compact_log_over(2000)).unwrap();
    let mut compactions = 0;
    let mut last_len = 0;
    for i in 0..20 {
        publish(&store, &format!("p{i}"), "1.0.0", ENABLED).unwrap();
        let len = fs::metadata(&layout.log).unwrap().len();
        assert!(len <= 48 + 2000 + 1000, "the log stays bounded: {len}");
        if len < last_len {
            compactions += 1;
            assert_eq!(len, 48, "an empty log after a compaction");
            let checkpoint = fs::read(&layout.registry).unwrap();
            let (state, format) = StoreState::from_any_json(&checkpoint).unwrap();
            assert_eq!(
                (state.generation(), format),
                (store.registry().unwrap().generation(), 3)
            );
        }
        last_len = len;
        assert_eq!(committed(&root), store.registry().unwrap());
    }
    assert!(compactions >= 2, "{compactions}");
}

/// Opening lists `packages/` only when something says a tree may need deleting: a stray tree
/// put there by hand is neither deleted nor reported by an opening, the marker makes the next
/// opening sweep (and report it, keeping it and the marker), and an explicit recovery always
/// sweeps.
#[test]
fn store_opening_sweeps_packages_only_when_marked_or_a_change_was_in_flight() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    let stray = layout.packages.join("stray/1.0.0");
    fs::create_dir_all(&stray).unwrap();

    let (store, report) = FsStore::open(&root).unwrap();
    assert!(!report.swept && report.is_clean(), "{report:?}");
    drop(store);

    fs::write(&layout.sweep_marker, b"").unwrap();
    let (store, report) = FsStore::open(&root).unwrap();
    assert!(report.swept, "{report:?}");
    assert_eq!(report.unaccounted_trees, std::slice::from_ref(&stray));
    assert!(stray.is_dir() && layout.sweep_marker.exists());

    fs::remove_dir_all(layout.packages.join("stray")).unwrap();
    let report = store.recover().unwrap();
    assert!(report.swept && report.is_clean(), "{report:?}");
    assert!(!layout.sweep_marker.exists());
    drop(store);
    let (_store, report) = FsStore::open(&root).unwrap();
    assert!(!report.swept && report.is_clean(), "{report:?}");
}

/// A commit that could not delete a tree it no longer installs keeps its journal record, so
/// that the next opening sweeps and deletes it.
#[test]
fn store_commit_that_could_not_delete_a_tree_leaves_it_to_the_next_opening() {
    let (_dir, root) = store_with_one_package();
    let layout = StoreLayout::new(&root);
    let fault = Some(Fault {
        step: 7,
        mode: FaultMode::Error,
    });
    let (store, _) = FsStore::open(&root).unwrap();
    publish(&store, "a", "2.0.0", ENABLED).unwrap();
    drop(store);
    let (store, _) = FsStore::open_with(&root, StoreOptions::new().with_fault(fault)).unwrap();
    let committed = change(&store, |r| r.remove(&id("a"), &v("1.0.0"))).unwrap();
    let old = layout.packages.join("a/1.0.0");
    assert!(old.is_dir());
    assert!(committed.leftovers.contains(&old), "{committed:?}");
    drop(store);

    let (_store, report) = FsStore::open(&root).unwrap();
    assert!(report.swept, "{report:?}");
    assert_eq!(
        report.removed_trees,
        std::slice::from_ref(&old),
        "{report:?}"
    );
    assert!(!old.exists());
    assert_no_leftovers(&root);
}
