//! The crash matrix: every transaction shape the package manager issues, interrupted at every
//! durable step, by an error and by a crash, then read by a reader (no lock, no recovery) and
//! reopened. The disk must hold exactly the state before or exactly the state after, with
//! nothing left over; the reader must have seen that very generation and written nothing; and
//! the answer the caller got must agree with which one it is.

use std::path::{Path, PathBuf};

use guild_adapters_fs::store::{Fault, FaultMode, FsStore, StoreOptions};
use guild_domain::store_state::{PublishOptions, StoreState, Taint};
use guild_ports::store::{PackageStore, StoreErrorKind, Transaction};

use super::{
    assert_no_leftovers, change, commit_trust, id, publish, publish_many, snapshot, stage_tree,
    tamper, v, Snapshot, ENABLED,
};

/// What an operation under test answered: the paths it could not clean up, or its error.
type Outcome = Result<Vec<PathBuf>, guild_ports::store::StoreError>;

struct Shape {
    name: &'static str,
    /// Whether the store compacts its log after every commit.
    compact: bool,
    setup: fn(&FsStore),
    op: fn(&FsStore) -> Outcome,
}

fn leftovers(r: Result<guild_ports::store::Committed, guild_ports::store::StoreError>) -> Outcome {
    r.map(|c| c.leftovers)
}

fn one_enabled(s: &FsStore) {
    publish(s, "a", "1.0.0", ENABLED).unwrap();
}

fn one_disabled(s: &FsStore) {
    publish(s, "a", "1.0.0", PublishOptions::default()).unwrap();
}

fn two_versions(s: &FsStore) {
    publish(s, "a", "1.0.0", ENABLED).unwrap();
    publish(s, "a", "2.0.0", ENABLED).unwrap();
}

/// Adds b@1.0.0, whose library is then changed behind the store's back and which is tainted
/// (and so disabled) for it.
fn tainted_b(s: &FsStore) {
    publish(s, "b", "1.0.0", ENABLED).unwrap();
    tamper(s, "b", "1.0.0");
    change(s, |r| {
        r.taint(
            &id("b"),
            &v("1.0.0"),
            Taint {
                reason: "tampered".into(),
                file: Some("lib/libb.so".into()),
            },
        )
    })
    .unwrap();
}

/// Turns the store into one written before the log existed: the whole registry in format 1,
/// the very bytes the earlier code wrote, and no log.
fn as_format_1(s: &FsStore) {
    guild_adapters_fs::store::testing::as_format_1(s.layout().root.clone()).unwrap();
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "publish into a format-1 store, migrating it",
            compact: false,
            setup: |s| {
                one_enabled(s);
                as_format_1(s);
            },
            op: |s| leftovers(publish(s, "b", "1.0.0", ENABLED)),
        },
        Shape {
            name: "publish, then compact the log",
            compact: true,
            setup: one_enabled,
            op: |s| leftovers(publish(s, "b", "1.0.0", ENABLED)),
        },
        Shape {
            name: "commit trust, then compact the log",
            compact: true,
            setup: |s| {
                one_enabled(s);
                commit_trust(s, "first").unwrap();
            },
            op: |s| leftovers(commit_trust(s, "second")),
        },
        Shape {
            name: "migrate a format-1 store, commit, compact",
            compact: true,
            setup: |s| {
                two_versions(s);
                as_format_1(s);
            },
            op: |s| leftovers(change(s, |r| r.rollback(&id("a")).map(|_| ()))),
        },
        Shape {
            name: "publish a new package",
            compact: false,
            setup: one_enabled,
            op: |s| leftovers(publish(s, "b", "1.0.0", ENABLED)),
        },
        Shape {
            name: "publish superseding the enabled version",
            compact: false,
            setup: one_enabled,
            op: |s| leftovers(publish(s, "a", "2.0.0", ENABLED)),
        },
        Shape {
            name: "enable",
            compact: false,
            setup: one_disabled,
            op: |s| leftovers(change(s, |r| r.enable(&id("a")).map(|_| ()))),
        },
        Shape {
            name: "disable",
            compact: false,
            setup: one_enabled,
            op: |s| leftovers(change(s, |r| r.disable(&id("a")).map(|_| ()))),
        },
        Shape {
            name: "remove a superseded version",
            compact: false,
            setup: two_versions,
            op: |s| leftovers(change(s, |r| r.remove(&id("a"), &v("1.0.0")))),
        },
        Shape {
            name: "remove the last version of a package",
            compact: false,
            setup: |s| {
                one_enabled(s);
                publish(s, "b", "1.0.0", ENABLED).unwrap();
            },
            op: |s| leftovers(change(s, |r| r.remove(&id("a"), &v("1.0.0")))),
        },
        Shape {
            name: "purge the last removed record of a package, then compact the log",
            compact: true,
            setup: |s| {
                one_enabled(s);
                publish(s, "b", "1.0.0", ENABLED).unwrap();
                change(s, |r| r.remove(&id("a"), &v("1.0.0"))).unwrap();
            },
            op: |s| {
                let before = s.registry().unwrap();
                let mut next = before.successor();
                next.purge(&id("a"), None).unwrap();
                leftovers(
                    s.commit(
                        Transaction::new(before.generation(), next)
                            .with_purge(vec![(id("a"), v("1.0.0"))]),
                    ),
                )
            },
        },
        Shape {
            name: "rollback",
            compact: false,
            setup: two_versions,
            op: |s| leftovers(change(s, |r| r.rollback(&id("a")).map(|_| ()))),
        },
        Shape {
            name: "reinstall a removed version",
            compact: false,
            setup: |s| {
                two_versions(s);
                change(s, |r| r.remove(&id("a"), &v("1.0.0"))).unwrap();
            },
            op: |s| {
                let options = PublishOptions {
                    enable: false,
                    allow_downgrade: true,
                };
                leftovers(publish(s, "a", "1.0.0", options))
            },
        },
        Shape {
            name: "write trust",
            compact: false,
            setup: |s| s.write_trust(b"trust v1").unwrap(),
            op: |s| s.write_trust(b"trust v2").map(|()| Vec::new()),
        },
        Shape {
            name: "commit trust with the registry",
            compact: false,
            setup: |s| {
                one_enabled(s);
                commit_trust(s, "first").unwrap();
            },
            op: |s| leftovers(commit_trust(s, "second")),
        },
        Shape {
            name: "publish three versions in one transaction (a sync)",
            compact: false,
            setup: one_enabled,
            op: |s| {
                leftovers(publish_many(
                    s,
                    &[("a", "2.0.0"), ("b", "1.0.0"), ("c", "1.0.0")],
                    |_, tx| tx,
                ))
            },
        },
        Shape {
            name: "publish two into a format-1 store in one transaction, then compact",
            compact: true,
            setup: |s| {
                one_enabled(s);
                as_format_1(s);
            },
            op: |s| {
                leftovers(publish_many(
                    s,
                    &[("b", "1.0.0"), ("c", "1.0.0")],
                    |_, tx| tx,
                ))
            },
        },
        Shape {
            name: "publish two, replace a tainted tree and remove a version in one transaction",
            compact: false,
            setup: |s| {
                two_versions(s);
                tainted_b(s);
            },
            op: |s| {
                leftovers(publish_many(
                    s,
                    &[("c", "1.0.0"), ("d", "1.0.0")],
                    |next, tx| {
                        next.clear_taint(&id("b"), &v("1.0.0"));
                        next.enable(&id("b")).unwrap();
                        next.remove(&id("a"), &v("1.0.0")).unwrap();
                        let staged = stage_tree(s, "b", "1.0.0");
                        tx.with_replacement(id("b"), v("1.0.0"), staged)
                    },
                ))
            },
        },
        Shape {
            name: "replace a tainted tree",
            compact: false,
            setup: |s| {
                one_enabled(s);
                tamper(s, "a", "1.0.0");
                change(s, |r| {
                    r.taint(
                        &id("a"),
                        &v("1.0.0"),
                        Taint {
                            reason: "tampered".into(),
                            file: Some("lib/liba.so".into()),
                        },
                    )
                })
                .unwrap();
            },
            op: |s| {
                let before = s.registry().unwrap();
                let mut next = before.successor();
                next.clear_taint(&id("a"), &v("1.0.0"));
                next.enable(&id("a")).unwrap();
                let staged = stage_tree(s, "a", "1.0.0");
                leftovers(s.commit(
                    Transaction::new(before.generation(), next).with_replacement(
                        id("a"),
                        v("1.0.0"),
                        staged,
                    ),
                ))
            },
        },
    ]
}

/// A store prepared by `setup`, closed again, with its durable snapshot.
fn prepared(shape: &Shape) -> (tempfile::TempDir, PathBuf, Snapshot) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    {
        let (store, report) = FsStore::open(&root).unwrap();
        assert!(report.created);
        (shape.setup)(&store);
    }
    let before = snapshot(&root);
    assert_no_leftovers(&root);
    (dir, root, before)
}

/// Reopens the store and checks it is consistent: nothing left over, the handle's registry is the
/// file's, and a second recovery has nothing to do.
fn reopen(root: &Path) -> Snapshot {
    let (store, _report) = FsStore::open(root).unwrap();
    let snap = snapshot(root);
    assert_no_leftovers(root);
    assert_eq!(
        store.registry().unwrap(),
        StoreState::from_json(&snap.registry).unwrap()
    );
    let again = store.recover().unwrap();
    assert!(again.is_clean(), "recovery is not idempotent: {again:?}");
    assert_eq!(snapshot(root), snap);
    snap
}

#[test]
fn store_crash_matrix_every_shape_every_step_both_modes() {
    let mut cases = 0;
    for shape in shapes() {
        // The undisturbed run gives the after-state and the list of steps.
        let (_dir, root, before) = prepared(&shape);
        let options = |fault| {
            let options = StoreOptions::new().with_fault(fault);
            if shape.compact {
                options.compact_log_over(0)
            } else {
                options
            }
        };
        let (store, _) = FsStore::open_with(&root, options(None)).unwrap();
        assert_eq!((shape.op)(&store).unwrap(), Vec::<PathBuf>::new());
        let steps = store.last_op().steps;
        drop(store);
        let after = reopen(&root);
        assert_ne!(
            before, after,
            "{}: the operation changed nothing",
            shape.name
        );
        println!(
            "{}: {} steps: {}",
            shape.name,
            steps.len(),
            steps.join(", ")
        );

        let (mut saw_before, mut saw_after) = (0, 0);
        for step in 1..=steps.len() {
            for mode in [FaultMode::Error, FaultMode::Crash] {
                let label = format!(
                    "{} at step {step} ({}) by {mode:?}",
                    shape.name,
                    steps[step - 1]
                );
                let (_dir, root, before_again) = prepared(&shape);
                assert_eq!(before_again, before, "{label}: setup is not deterministic");
                let fault = Some(Fault { step, mode });
                let (store, report) = FsStore::open_with(&root, options(fault)).unwrap();
                assert!(report.is_clean(), "{label}: {report:?}");
                let outcome = (shape.op)(&store);
                match (&outcome, mode) {
                    (Err(e), FaultMode::Crash) => {
                        assert_eq!(e.kind, StoreErrorKind::SimulatedCrash, "{label}: {e}");
                        let later = store.registry().unwrap_err();
                        assert_eq!(later.kind, StoreErrorKind::Poisoned, "{label}");
                    }
                    (Err(e), FaultMode::Error) => {
                        // A failed operation cleans up at once: the disk is the before-state
                        // without waiting for recovery, and the handle goes on working.
                        assert_eq!(e.kind, StoreErrorKind::Io, "{label}: {e}");
                        assert_eq!(snapshot(&root), before, "{label}");
                        assert_no_leftovers(&root);
                        assert_eq!(
                            store.registry().unwrap(),
                            StoreState::from_json(&before.registry).unwrap(),
                            "{label}"
                        );
                    }
                    (Ok(left), FaultMode::Error) => {
                        // Only cleanup after the commit point may fail without failing the
                        // commit, and then it says what it left behind.
                        assert!(!left.is_empty(), "{label}: the fault had no effect");
                    }
                    (Ok(_), FaultMode::Crash) => panic!("{label}: the crash did not happen"),
                }
                drop(store);
                // A reader opened now, before any recovery, sees one complete generation: the
                // registry and trust bytes the recovery below settles on, and changes nothing.
                let untouched = snapshot(&root);
                let (reader, _) = FsStore::open_with(&root, StoreOptions::new().reader())
                    .unwrap_or_else(|e| panic!("{label}: a reader could not open: {e}"));
                let (seen, seen_trust) = (reader.registry().unwrap(), reader.read_trust().unwrap());
                drop(reader);
                assert_eq!(snapshot(&root), untouched, "{label}: the reader wrote");
                let got = reopen(&root);
                assert_eq!(
                    seen,
                    StoreState::from_json(&got.registry).unwrap(),
                    "{label}: the reader saw another generation than the one recovered"
                );
                assert_eq!(seen_trust, got.trust, "{label}: the reader's trust bytes");
                if got == before {
                    saw_before += 1;
                    assert!(
                        outcome.is_err(),
                        "{label}: answered Ok but the disk is the before-state"
                    );
                } else {
                    assert_eq!(
                        got, after,
                        "{label}: neither the before- nor the after-state"
                    );
                    saw_after += 1;
                    if let Err(e) = &outcome {
                        assert_eq!(
                            e.kind,
                            StoreErrorKind::SimulatedCrash,
                            "{label}: answered {e} but the disk is the after-state"
                        );
                    }
                }
                cases += 1;
            }
        }
        assert!(
            saw_before > 0 && saw_after > 0,
            "{}: {saw_before} before, {saw_after} after",
            shape.name
        );
    }
    println!("crash matrix: {cases} (operation, step, mode) cases, all before- or after-state");
    assert!(cases >= 100, "{cases}");
}

#[test]
fn store_installed_trees_are_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = FsStore::open(dir.path().join("s")).unwrap();
    publish(&store, "a", "1.0.0", ENABLED).unwrap();
    let snap = snapshot(&dir.path().join("s"));
    let names: Vec<&String> = snap.packages.keys().collect();
    assert_eq!(
        names,
        [
            "a",
            "a/1.0.0",
            "a/1.0.0/.gkmetadata",
            "a/1.0.0/lib",
            "a/1.0.0/lib/liba.so"
        ]
    );
    for (name, node) in &snap.packages {
        let read_only = match node {
            super::Node::Dir { read_only } | super::Node::File { read_only, .. } => *read_only,
        };
        // The id directory holds several versions and stays writable; every tree is sealed.
        assert_eq!(read_only, name != "a", "{name}");
    }
    assert_eq!(
        store.package_dir(&id("a"), &v("1.0.0")),
        dir.path().join("s/packages/a/1.0.0")
    );
}

#[test]
fn store_counts_the_fsyncs_of_a_publish() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = FsStore::open(dir.path().join("s")).unwrap();
    publish(&store, "a", "1.0.0", ENABLED).unwrap();
    let first = store.last_op();
    // Journal record 2, staged tree 4 (two files, two directories), packages directory 1 (a new
    // id), installed tree root 1, id directory 1, staging directory 1, the log's frame 1 (the
    // commit point, an fdatasync).
    assert_eq!(first.fsyncs, 11, "{:?}", first.steps);
    publish(&store, "a", "2.0.0", ENABLED).unwrap();
    assert_eq!(
        store.last_op().fsyncs,
        10,
        "the id directory already exists"
    );
    change(&store, |r| r.disable(&id("a")).map(|_| ())).unwrap();
    assert_eq!(store.last_op().fsyncs, 3, "a state-only change");
    change(&store, |r| r.remove(&id("a"), &v("1.0.0"))).unwrap();
    assert_eq!(store.last_op().fsyncs, 3, "deleting needs no fsync");
    // Several installs in one transaction: 4 + 7 per new id (its tree 4, the packages
    // directory, the installed tree, the id directory), staging and the journal once.
    publish_many(&store, &[("b", "1.0.0"), ("c", "1.0.0")], |_, tx| tx).unwrap();
    assert_eq!(store.last_op().fsyncs, 18, "{:?}", store.last_op().steps);
    publish_many(
        &store,
        &[("d", "1.0.0"), ("e", "1.0.0"), ("f", "1.0.0")],
        |_, tx| tx,
    )
    .unwrap();
    assert_eq!(store.last_op().fsyncs, 25);
}
