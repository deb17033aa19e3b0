//! Readers beside a writer: a reader opens without the lock, sees one committed generation,
//! takes the lock only for its own transactions, and pins keep live processes' versions.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use guild_adapters_fs::store::{Fault, FaultMode, FsStore, StoreLayout, StoreOptions};
use guild_domain::registry::PublishOptions;
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

/// A process that holds a shared lock on `path` (the pin protocol) until it is killed.
fn foreign_pin(path: &Path) -> Child {
    // `--close`: the lock stays with `flock` itself (the pid the test kills), and its command
    // ends when the test closes its stdin.
    let mut child = Command::new("flock")
        .args(["--shared", "--nonblock", "--close"])
        .arg(path)
        .args(["sh", "-c", "echo pinned; read _"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the flock utility runs");
    let mut line = String::new();
    use std::io::BufRead as _;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "pinned");
    child
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
