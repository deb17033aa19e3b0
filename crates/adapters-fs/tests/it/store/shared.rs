//! Readers beside a writer: a reader opens without the lock, sees one committed generation,
//! takes the lock only for its own transactions, and pins keep live processes' versions.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guild_adapters_fs::store::{testing, Fault, FaultMode, FsStore, StoreLayout, StoreOptions};
use guild_domain::store_state::PublishOptions;
use guild_ports::store::{PackageStore, StoreErrorKind};

use super::{change, commit_trust, id, publish, v, ENABLED};

fn reader(root: &Path) -> FsStore {
    let options = StoreOptions {
        lock_wait: Duration::from_millis(50),
        ..StoreOptions::new().reader()
    };
    FsStore::open_with(root, options).unwrap().0
}

#[test]
fn store_reader_opens_beside_a_writer_and_follows_its_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, _) = FsStore::open(dir.path()).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    let first = reader(dir.path());
    let second = reader(dir.path());
    assert!(first.is_reader());
    assert_eq!(first.registry().unwrap(), writer.registry().unwrap());
    commit_trust(&writer, "one").unwrap();
    publish(&writer, "b", "1.0.0", ENABLED).unwrap();
    // The view stays put until it is refreshed.
    assert_eq!(first.registry().unwrap().generation(), 1);
    assert_eq!(first.refresh().unwrap(), 3);
    assert_eq!(first.registry().unwrap(), writer.registry().unwrap());
    assert_eq!(first.read_trust().unwrap(), writer.read_trust().unwrap());
    assert_eq!(second.refresh().unwrap(), 3);
}

#[test]
fn store_reader_of_an_interrupted_commit_reads_the_last_committed_generation() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    commit_trust(&writer, "one").unwrap();
    let before = writer.registry().unwrap();
    drop(writer);
    // A trust change that "dies" before its registry rename, and one that dies after it but
    // before `trust.next` is renamed over `trust`.
    for (step, committed) in [(5, false), (11, true)] {
        let fault = Some(Fault {
            step,
            mode: FaultMode::Crash,
        });
        let (writer, _) = FsStore::open_with(root, StoreOptions::new().with_fault(fault)).unwrap();
        let err = commit_trust(&writer, "two").unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::SimulatedCrash);
        let journal = StoreLayout::new(root).journal;
        let pending = std::fs::read_dir(&journal).unwrap().count();
        assert_eq!(pending, 1, "the dead writer left its record (step {step})");
        let seen = reader(root);
        let registry = seen.registry().unwrap();
        let anchor = registry.trust_anchor().unwrap().clone();
        let trust = seen.read_trust().unwrap().unwrap();
        assert_eq!(
            guild_domain::ids::Sha256Digest::of(&trust),
            anchor.file_digest,
            "the reader's trust bytes are those its registry records (step {step})"
        );
        if committed {
            assert_eq!(registry.generation(), before.generation() + 1);
        } else {
            assert_eq!(registry, before);
        }
        // The reader recovered nothing: the record is the next writer's.
        assert_eq!(std::fs::read_dir(&journal).unwrap().count(), 1);
        drop(writer);
        let (writer, report) = FsStore::open(root).unwrap();
        assert!(!report.is_clean(), "the next writer recovers (step {step})");
        assert_eq!(writer.registry().unwrap(), registry);
        drop(writer);
    }
}

#[test]
fn store_reader_takes_the_lock_for_its_own_transaction_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let r = reader(root);
    let (writer, _) = FsStore::open(root).unwrap();
    // While a writer lives, the reader's own change waits for the lock and then gives up.
    let err = publish(&r, "a", "1.0.0", ENABLED).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Locked);
    publish(&writer, "b", "1.0.0", ENABLED).unwrap();
    drop(writer);
    // Its view is stale: the commit catches up with the disk and refuses the old generation.
    let stale = publish(&r, "a", "1.0.0", ENABLED).unwrap_err();
    assert_eq!(stale.kind, StoreErrorKind::GenerationConflict);
    publish(&r, "a", "1.0.0", ENABLED).unwrap();
    // The lock was given back after the commit: a writer opens at once.
    let (writer, _) = FsStore::open(root).unwrap();
    assert_eq!(writer.registry().unwrap().generation(), 2);
    drop(writer);
    // A reader's own recovery reports what it did.
    std::fs::write(StoreLayout::new(root).registry_tmp, b"half").unwrap();
    let report = r.recover().unwrap();
    assert_eq!(
        report.removed_temp_files,
        vec![StoreLayout::new(root).registry_tmp]
    );
}

/// Tries to take a shared lock on `path` (the pin protocol) from another process, without
/// waiting: the process, which holds the pin until it is killed, or `None` if the lock was refused.
pub(crate) fn try_foreign_pin(path: &Path) -> Option<Child> {
    // `--close`: the lock stays with `flock` itself (the pid the test kills), and its command
    // ends when the test closes its stdin.
    let mut child = Command::new("flock")
        .args(["--shared", "--nonblock", "--close"])
        .arg(path)
        .args(["sh", "-c", "echo pinned; read _"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the flock utility runs");
    let mut line = String::new();
    use std::io::BufRead as _;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim() == "pinned" {
        Some(child)
    } else {
        // `flock --nonblock` gave up: it exits without running the command.
        child.wait().unwrap();
        None
    }
}

/// A process that holds a shared lock on `path` (the pin protocol) until it is killed.
pub(crate) fn foreign_pin(path: &Path) -> Child {
    try_foreign_pin(path).expect("the pin is free")
}

/// Puts a tree at `packages/<pkg>/<ver>` that no registry references.
fn stray_tree(root: &Path, pkg: &str, ver: &str) -> PathBuf {
    let tree = StoreLayout::new(root).packages.join(pkg).join(ver);
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("libstray.so"), b"ELF").unwrap();
    tree
}

/// The tree of `pkg@ver`, published and removed again (the registry keeps its tombstone), with
/// its files back, as a power loss that undid the deletion leaves them: recovery accounts for
/// it and deletes it.
fn removed_tree(store: &FsStore, root: &Path, pkg: &str, ver: &str) -> PathBuf {
    let disabled = PublishOptions {
        enable: false,
        allow_downgrade: false,
    };
    publish(store, pkg, ver, disabled).unwrap();
    change(store, |r| r.remove(&id(pkg), &v(ver))).unwrap();
    stray_tree(root, pkg, ver)
}

/// A tree about to be deleted, and the process that pinned its version meanwhile, if any.
type Attempt = (PathBuf, Option<Child>);

/// Recovery decides that an unreferenced tree may go and deletes it; a process that pins the
/// version in between must not lose its files. The hook runs at that exact moment: between the
/// decision and the first deleted file, another process tries to pin the version.
#[test]
fn store_recovery_never_deletes_a_tree_pinned_between_its_check_and_its_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    // A removed version of an installed package, and of a package with no other version.
    let trees = [
        removed_tree(&writer, root, "a", "9.9.9"),
        removed_tree(&writer, root, "b", "1.0.0"),
    ];
    let pins_dir = StoreLayout::new(root).pins;
    let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let hook = {
        let seen = Arc::clone(&seen);
        testing::before_tree_delete(root, move |tree: &Path| {
            let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
            let pin = pins_dir.join(format!("{}@{}", name(tree.parent().unwrap()), name(tree)));
            let pinned = try_foreign_pin(&pin);
            seen.lock().unwrap().push((tree.to_path_buf(), pinned));
        })
    };
    let report = writer.recover().unwrap();
    drop(hook);
    let mut seen = std::mem::take(&mut *seen.lock().unwrap());
    for (tree, pinned) in &mut seen {
        if let Some(holder) = pinned {
            let kept = tree.exists();
            holder.kill().unwrap();
            holder.wait().unwrap();
            assert!(
                kept,
                "{} was deleted although a live process pinned it first",
                tree.display()
            );
        }
    }
    let mut decided: Vec<&PathBuf> = seen.iter().map(|(t, _)| t).collect();
    decided.sort();
    assert_eq!(
        decided,
        trees.iter().collect::<Vec<_>>(),
        "every unreferenced tree is deleted through the same hold: {report:?}"
    );
    // The writer held the version against new pins across the deletion: the pin was refused
    // (the pinner is told the files are going) and the files went.
    for (tree, pinned) in &seen {
        assert!(
            pinned.is_none(),
            "{} was pinnable mid-deletion",
            tree.display()
        );
        assert!(!tree.exists(), "{}", tree.display());
    }
    assert_eq!(report.removed_trees, trees.to_vec());
}

#[test]
fn store_removal_of_a_version_pinned_by_a_live_process_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    publish(&writer, "a", "1.1.0", ENABLED).unwrap();
    std::fs::create_dir_all(StoreLayout::new(root).pins).unwrap();
    let mut holder = foreign_pin(&StoreLayout::new(root).pins.join("a@1.0.0"));
    let pins = writer.pins().unwrap();
    assert_eq!(pins.len(), 1);
    assert_eq!(pins[0].node.version, v("1.0.0"));
    assert!(pins[0].holders.iter().any(|h| h.pid == holder.id()));

    let err = change(&writer, |next| {
        next.remove(&id("a"), &v("1.0.0")).map(|_| ())
    })
    .unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Pinned, "{err}");
    assert!(err.holders.iter().any(|h| h.pid == holder.id()), "{err}");
    assert!(err.to_string().contains(&holder.id().to_string()), "{err}");
    assert!(writer.package_dir(&id("a"), &v("1.0.0")).is_dir());

    holder.kill().unwrap();
    holder.wait().unwrap();
    // The kernel dropped the dead process's lock: nothing blocks any more.
    assert!(writer.pins().unwrap().is_empty());
    change(&writer, |next| {
        next.remove(&id("a"), &v("1.0.0")).map(|_| ())
    })
    .unwrap();
    assert!(!writer.package_dir(&id("a"), &v("1.0.0")).exists());
    assert!(!StoreLayout::new(root).pins.join("a@1.0.0").exists());
}

#[test]
fn store_pin_of_this_process_is_listed_and_refuses_nothing_here() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    publish(
        &writer,
        "a",
        "1.1.0",
        PublishOptions {
            enable: true,
            allow_downgrade: false,
        },
    )
    .unwrap();
    let r = reader(root);
    let pin = r.pin(&id("a"), &v("1.0.0")).unwrap();
    let pins = writer.pins().unwrap();
    assert_eq!(pins.len(), 1);
    assert_eq!(pins[0].holders[0].pid, std::process::id());
    // Within one process the kernel registry's leases decide, not the pins.
    change(&writer, |next| {
        next.remove(&id("a"), &v("1.0.0")).map(|_| ())
    })
    .unwrap();
    drop(pin);
    assert!(writer.pins().unwrap().is_empty());
}

#[test]
fn store_pin_of_a_version_the_committed_registry_does_not_install_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    publish(&writer, "a", "1.1.0", ENABLED).unwrap();
    // The reader reads generation 2, in which 1.0.0 is still installed ...
    let r = reader(root);
    assert!(r.registry().unwrap().is_installed(&id("a"), &v("1.0.0")));
    // ... and a writer then removes it.
    change(&writer, |next| {
        next.remove(&id("a"), &v("1.0.0")).map(|_| ())
    })
    .unwrap();
    let pins = StoreLayout::new(root).pins;
    for (ver, how) in [("1.0.0", "removed"), ("7.0.0", "not recorded")] {
        let err = r
            .pin(&id("a"), &v(ver))
            .err()
            .unwrap_or_else(|| panic!("a@{ver} is {how}, yet it was pinned"));
        assert_eq!(err.kind, StoreErrorKind::NotInstalled, "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("a@{ver}")) && text.contains(how),
            "{text}"
        );
        assert!(
            !pins.join(format!("a@{ver}")).exists(),
            "a@{ver}'s pin file stayed"
        );
    }
    // An installed version pins as before.
    let pin = r.pin(&id("a"), &v("1.1.0")).unwrap();
    assert_eq!(writer.pins().unwrap().len(), 1);
    drop(pin);
}

#[test]
fn store_recovery_keeps_a_tree_whose_pin_it_cannot_check_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    let tree = removed_tree(&writer, root, "a", "9.9.9");
    // Something that cannot be opened as a pin file stands in its place (a directory: EISDIR,
    // whoever runs the test).
    let pin = StoreLayout::new(root).pins.join("a@9.9.9");
    std::fs::create_dir_all(&pin).unwrap();
    let report = writer.recover().unwrap();
    assert!(
        tree.exists(),
        "a tree whose pin cannot be checked is not deleted"
    );
    assert!(
        report.pinned_trees.is_empty(),
        "no process pins it, and the report must not pretend one does: {report:?}"
    );
    assert!(!report.is_clean(), "{report:?}");
    assert_eq!(report.unchecked_trees.len(), 1, "{report:?}");
    let unchecked = &report.unchecked_trees[0];
    assert_eq!(unchecked.path, tree);
    assert!(
        unchecked.reason.contains("open pin file") && unchecked.reason.contains("a@9.9.9"),
        "the report says why: {}",
        unchecked.reason
    );
    // A removal through a commit that cannot check the pin is refused, naming the pin file.
    publish(&writer, "a", "1.1.0", ENABLED).unwrap();
    std::fs::create_dir_all(StoreLayout::new(root).pins.join("a@1.0.0")).unwrap();
    let err = change(&writer, |next| {
        next.remove(&id("a"), &v("1.0.0")).map(|_| ())
    })
    .unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Io, "{err}");
    assert!(err.to_string().contains("a@1.0.0"), "{err}");
    assert!(writer.package_dir(&id("a"), &v("1.0.0")).is_dir());
    // Once the pin file is a file again, the stray tree goes.
    std::fs::remove_dir(&pin).unwrap();
    let report = writer.recover().unwrap();
    assert_eq!(report.removed_trees, vec![tree.clone()]);
    assert!(!tree.exists());
}

/// A pin taken for a version that is being installed (before its commit) is the installing
/// writer's alone.
#[test]
fn store_pin_of_a_version_being_installed_needs_the_installing_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let r = reader(root);
    let err = r.pin_installing(&id("a"), &v("1.0.0")).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::InvalidTransaction, "{err}");
    r.begin_write().unwrap();
    let pin = r.pin_installing(&id("a"), &v("1.0.0")).unwrap();
    publish(&r, "a", "1.0.0", ENABLED).unwrap();
    r.end_write();
    assert_eq!(r.pins().unwrap().len(), 1);
    drop(pin);
}

#[test]
fn store_watcher_fires_on_each_committed_frame_and_on_compaction() {
    use std::sync::mpsc::channel;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, _) = FsStore::open(&root).unwrap();
    publish(&store, "a", "1.0.0", ENABLED).unwrap();
    let (tx, rx) = channel();
    let _watch = guild_adapters_fs::store::StoreWatcher::new(&root, move || {
        let _ = tx.send(());
    })
    .unwrap();
    let drain = || while rx.recv_timeout(Duration::from_millis(200)).is_ok() {};
    drain();
    // A state-only commit appends a frame and replaces no file.
    change(&store, |r| r.disable(&id("a")).map(|_| ())).unwrap();
    rx.recv_timeout(Duration::from_secs(10))
        .expect("no notice of an appended frame");
    drain();
    drop(store);
    // A commit that compacts replaces both registry files.
    let (store, _) = FsStore::open_with(&root, StoreOptions::new().compact_log_over(0)).unwrap();
    change(&store, |r| r.enable(&id("a")).map(|_| ())).unwrap();
    assert_eq!(
        std::fs::metadata(&store.layout().log).unwrap().len(),
        48,
        "compacted"
    );
    rx.recv_timeout(Duration::from_secs(10))
        .expect("no notice of a compacting commit");
}
