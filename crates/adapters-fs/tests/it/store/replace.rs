//! Every deletion of a version tree happens under the hold of its pin, the replacement of a
//! tree included, and recovery puts back only the tree that the interrupted transaction itself
//! set aside.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};

use guild_adapters_fs::store::{testing, Fault, FaultMode, FsStore, StoreLayout, StoreOptions};
use guild_domain::store_state::Taint;
use guild_ports::store::{Committed, PackageStore, StoreError, StoreErrorKind, Transaction};

use super::shared::{foreign_pin, try_foreign_pin};
use super::{change, id, publish, stage_tree, tamper, v, ENABLED};

/// The library of the installed `a@1.0.0`.
fn library(store: &FsStore) -> PathBuf {
    store
        .package_dir(&id("a"), &v("1.0.0"))
        .join("lib")
        .join("liba.so")
}

/// The text of a genuine `a@1.0.0` library, as `stage_tree` writes it.
fn genuine() -> String {
    "ELF a 1.0.0".repeat(50)
}

/// The text of the installed `a@1.0.0` library.
fn installed(store: &FsStore) -> String {
    String::from_utf8_lossy(&fs::read(library(store)).unwrap()).into_owned()
}

/// Taints `a@1.0.0`, as the package manager does when its files fail their hash.
fn taint(store: &FsStore) {
    change(store, |r| {
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
}

/// Replaces the installed tree of `a@1.0.0` with a fresh genuine copy, lifting its taint.
fn repair(store: &FsStore) -> Result<Committed, StoreError> {
    let before = store.registry()?;
    let mut next = before.successor();
    next.clear_taint(&id("a"), &v("1.0.0"));
    next.enable(&id("a")).unwrap();
    let staged = stage_tree(store, "a", "1.0.0");
    store.commit(
        Transaction::new(before.generation(), next).with_replacement(id("a"), v("1.0.0"), staged),
    )
}

/// The entries of `packages/a/`.
fn versions_dir(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(StoreLayout::new(root).packages.join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A store holding a tainted, tampered `a@1.0.0`, open as a writer.
fn tampered_store(root: &Path, options: StoreOptions) -> FsStore {
    {
        let (store, _) = FsStore::open(root).unwrap();
        publish(&store, "a", "1.0.0", ENABLED).unwrap();
        tamper(&store, "a", "1.0.0");
        taint(&store);
    }
    FsStore::open_with(root, options).unwrap().0
}

/// The number of the step named `name` in a repair, counted on a scratch store.
fn repair_step(name: &str) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let store = tampered_store(dir.path(), StoreOptions::new());
    repair(&store).unwrap();
    let steps = store.last_op().steps;
    1 + steps
        .iter()
        .position(|s| *s == name)
        .unwrap_or_else(|| panic!("no step {name:?} in {steps:?}"))
}

/// What a writer was about to delete, each with the process that pinned the version then.
type Attempts = Arc<Mutex<Vec<(PathBuf, Option<Child>)>>>;

/// Has another process try to take the pin file `pin` each time a writer of the store at
/// `root` is about to delete a tree, until the guard is dropped.
fn pin_at_each_deletion(root: &Path, pin: PathBuf) -> (testing::HookGuard, Attempts) {
    let seen: Attempts = Arc::default();
    let hook = {
        let seen = Arc::clone(&seen);
        testing::before_tree_delete(root, move |tree: &Path| {
            let pinned = try_foreign_pin(&pin);
            seen.lock().unwrap().push((tree.to_path_buf(), pinned));
        })
    };
    (hook, seen)
}

/// The trees of `attempts`, each with whether the other process got its pin (which it lets go
/// now).
fn settle(attempts: &Attempts) -> Vec<(PathBuf, bool)> {
    let seen = std::mem::take(&mut *attempts.lock().unwrap());
    seen.into_iter()
        .map(|(tree, holder)| {
            let pinned = holder.is_some();
            if let Some(mut holder) = holder {
                holder.kill().unwrap();
                holder.wait().unwrap();
            }
            (tree, pinned)
        })
        .collect()
}

/// Another process has the version loaded: its files are not deleted under it, so the repair is
/// refused, naming the holder, and the tree it has is left as it was.
#[test]
fn store_replacement_of_a_tree_pinned_by_a_live_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = tampered_store(root, StoreOptions::new());
    fs::create_dir_all(StoreLayout::new(root).pins).unwrap();
    let mut holder = foreign_pin(&StoreLayout::new(root).pins.join("a@1.0.0"));
    let err = repair(&store).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Pinned, "{err}");
    assert!(err.holders.iter().any(|h| h.pid == holder.id()), "{err}");
    assert_eq!(installed(&store), "tampered");
    assert_eq!(versions_dir(root), ["1.0.0"]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    // Once it lets go, the repair goes through and leaves nothing aside.
    repair(&store).unwrap();
    assert_eq!(installed(&store), genuine());
    assert_eq!(versions_dir(root), ["1.0.0"]);
}

/// The replaced tree is deleted after the commit point under the version's pin: a process that
/// tries to pin the version at that moment is refused rather than left without files.
#[test]
fn store_replaced_tree_is_deleted_under_the_hold_of_its_pin() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = tampered_store(root, StoreOptions::new());
    let (hook, attempts) = pin_at_each_deletion(root, StoreLayout::new(root).pins.join("a@1.0.0"));
    repair(&store).unwrap();
    drop(hook);
    let seen = settle(&attempts);
    let pinned = seen.iter().any(|(_, p)| *p);
    let trees: Vec<&PathBuf> = seen.iter().map(|(t, _)| t).collect();
    assert_eq!(
        trees.len(),
        1,
        "the replaced tree goes through the hold: {trees:?}"
    );
    assert!(
        trees[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("1.0.0~replaced"),
        "{trees:?}"
    );
    assert!(
        !pinned,
        "the version was pinnable while its replaced tree was deleted"
    );
    assert_eq!(versions_dir(root), ["1.0.0"]);
    assert_eq!(installed(&store), genuine());
}

/// A version that only this process pins is deleted (within a process the kernel registry
/// decides), but never while another process can pin it in between: at the moment of the
/// deletion a foreign pin is refused. This process's own pin is left as it was.
#[test]
fn store_deletion_of_a_version_pinned_only_here_keeps_other_processes_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    publish(&writer, "a", "1.1.0", ENABLED).unwrap();
    let reader = FsStore::open_with(root, StoreOptions::new().reader())
        .unwrap()
        .0;
    let own = reader.pin(&id("a"), &v("1.0.0")).unwrap();
    let (hook, attempts) = pin_at_each_deletion(root, StoreLayout::new(root).pins.join("a@1.0.0"));
    change(&writer, |next| {
        next.remove(&id("a"), &v("1.0.0")).map(|_| ())
    })
    .unwrap();
    drop(hook);
    let seen = settle(&attempts);
    assert_eq!(seen.len(), 1);
    let (tree, pinned) = &seen[0];
    assert!(
        !pinned,
        "{} was pinnable by another process mid-deletion",
        tree.display()
    );
    assert!(!tree.exists());
    // This process's own pin is still the version's pin file, listed as before.
    let pins = writer.pins().unwrap();
    assert_eq!(pins.len(), 1, "{pins:?}");
    assert_eq!(pins[0].holders[0].pid, std::process::id());
    let names: Vec<String> = fs::read_dir(StoreLayout::new(root).pins)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a@1.0.0"], "nothing else is left in pins/");
    drop(own);
    assert!(writer.pins().unwrap().is_empty());
}

/// A process that pinned the version before this process's deletion started still refuses it,
/// even though this process pins it too.
#[test]
fn store_deletion_of_a_version_pinned_here_and_elsewhere_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (writer, _) = FsStore::open(root).unwrap();
    publish(&writer, "a", "1.0.0", ENABLED).unwrap();
    publish(&writer, "a", "1.1.0", ENABLED).unwrap();
    let reader = FsStore::open_with(root, StoreOptions::new().reader())
        .unwrap()
        .0;
    let own = reader.pin(&id("a"), &v("1.0.0")).unwrap();
    let mut holder = foreign_pin(&StoreLayout::new(root).pins.join("a@1.0.0"));
    let err = change(&writer, |next| {
        next.remove(&id("a"), &v("1.0.0")).map(|_| ())
    })
    .unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Pinned, "{err}");
    assert!(writer.package_dir(&id("a"), &v("1.0.0")).is_dir());
    holder.kill().unwrap();
    holder.wait().unwrap();
    drop(own);
}

/// An earlier repair whose deletion of the replaced (tampered) tree failed left it aside; a
/// later repair, made before any recovery swept that tree, is interrupted before its commit
/// point. Recovery undoes the later one only: it must not put the earlier transaction's
/// tampered tree back over the committed genuine one.
#[test]
fn store_recovery_puts_back_only_the_tree_its_own_transaction_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let root = &dir.path().join("store");
    let fail_delete = Some(Fault {
        step: repair_step("delete replaced tree"),
        mode: FaultMode::Error,
    });
    let store = tampered_store(root, StoreOptions::new().with_fault(fail_delete));
    let committed = repair(&store).unwrap();
    // The tree it could not delete, and the journal record kept so that the next opening
    // sweeps it.
    assert_eq!(committed.leftovers.len(), 2, "{committed:?}");
    let stale = committed.leftovers[0].clone();
    assert!(
        committed.leftovers[1].starts_with(root.join("journal")),
        "{committed:?}"
    );
    assert!(stale.is_dir(), "the tampered tree stays aside");
    assert_eq!(installed(&store), genuine());
    taint(&store);
    drop(store);

    // The second repair dies after its journal record, before it moves anything. The stale
    // tree is kept out of the way of the recovery that opening runs, and then put back: the
    // disk as it is when one writer makes both repairs.
    let outside = dir.path().join("stale");
    fs::rename(&stale, &outside).unwrap();
    let crash = Some(Fault {
        step: repair_step("seal staged tree"),
        mode: FaultMode::Crash,
    });
    let (store, _) = FsStore::open_with(root, StoreOptions::new().with_fault(crash)).unwrap();
    let err = repair(&store).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::SimulatedCrash, "{err}");
    drop(store);
    fs::rename(&outside, &stale).unwrap();

    let (store, report) = FsStore::open(root).unwrap();
    assert_eq!(report.rolled_back.len(), 1, "{report:?}");
    assert_eq!(
        installed(&store),
        genuine(),
        "recovery put another transaction's tree back: {report:?}"
    );
    // The stale tree was nobody's to put back; as an unreferenced tree it is swept.
    assert_eq!(
        report.removed_trees,
        std::slice::from_ref(&stale),
        "{report:?}"
    );
    assert_eq!(versions_dir(root), ["1.0.0"]);
    let registry = store.registry().unwrap();
    assert!(registry
        .record(&id("a"), &v("1.0.0"))
        .unwrap()
        .taint
        .is_some());
}
