//! The store's own files (`registry.json`, `registry.log`, `trust`, `trust.next`, journal
//! records) are read only from regular files and only up to a cap: a FIFO in one's place cannot
//! hang a reader or a writer's recovery, a link is not followed, and an oversized file is refused
//! before it is read. Each is `Corrupt`, naming the file, and changes nothing.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use guild_adapters_fs::durable_file::ReadError;
use guild_adapters_fs::store::{Fault, FaultMode, FsStore, StoreLayout, StoreOptions};
use guild_ports::store::{PackageStore, StoreError, StoreErrorKind};

use super::{commit_trust, publish, ENABLED};

/// A closed store holding a@1.0.0 and a trust file, and the journal record of a commit of b that
/// crashed once its record was durable (so a writer's recovery reads the journal).
fn store_with_every_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, _) = FsStore::open(&root).unwrap();
    publish(&store, "a", "1.0.0", ENABLED).unwrap();
    commit_trust(&store, "first").unwrap();
    drop(store);
    let fault = Some(Fault {
        step: 5,
        mode: FaultMode::Crash,
    });
    let (store, _) = FsStore::open_with(&root, StoreOptions::new().with_fault(fault)).unwrap();
    let err = publish(&store, "b", "1.0.0", ENABLED).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::SimulatedCrash);
    (dir, root)
}

/// The journal record the crashed commit left.
fn record(root: &Path) -> PathBuf {
    let journal = StoreLayout::new(root).journal;
    let mut names: Vec<PathBuf> = fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names.remove(0)
}

/// The files a reader reads, and the ones only a writer's recovery reads.
fn files(root: &Path) -> Vec<(PathBuf, bool)> {
    let layout = StoreLayout::new(root);
    vec![
        (layout.registry, true),
        (layout.log, true),
        (layout.trust, true),
        (record(root), false),
    ]
}

/// Opens the store at `root` in another thread, giving up after a few seconds (and then
/// releasing a reader stuck on the FIFO at `fifo`, so that the thread ends).
fn open_within(root: &Path, reader: bool, fifo: &Path) -> Result<(), StoreError> {
    let (tx, rx) = mpsc::channel();
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        let options = if reader {
            StoreOptions::new().reader()
        } else {
            StoreOptions::new()
        };
        let _ = tx.send(FsStore::open_with(&root, options).map(|(s, _)| drop(s)));
    });
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(result) => result,
        Err(_) => {
            // The open is blocked waiting for a writer of the FIFO: be one, and let it go.
            let _ = fs::OpenOptions::new().write(true).open(fifo);
            panic!(
                "opening the store (reader: {reader}) hung on the FIFO at {}",
                fifo.display()
            );
        }
    }
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

fn refused(err: &StoreError, path: &Path) -> bool {
    err.kind == StoreErrorKind::Corrupt
        && err.path.as_deref() == Some(path)
        && std::error::Error::source(err)
            .and_then(|s| s.downcast_ref::<ReadError>())
            .is_some_and(|e| matches!(e, ReadError::NotRegular | ReadError::TooLarge { .. }))
}

#[test]
fn store_file_replaced_by_a_fifo_is_refused_without_hanging() {
    let (_dir, root) = store_with_every_file();
    for (path, read_by_reader) in files(&root) {
        let bytes = fs::read(&path).unwrap();
        fs::remove_file(&path).unwrap();
        mkfifo(&path);
        let openers: &[bool] = if read_by_reader {
            &[true, false]
        } else {
            &[false]
        };
        for &reader in openers {
            let err = open_within(&root, reader, &path).unwrap_err();
            assert!(refused(&err, &path), "reader {reader}: {err}");
        }
        fs::remove_file(&path).unwrap();
        fs::write(&path, bytes).unwrap();
    }
    FsStore::open(&root).unwrap();
}

#[test]
fn store_file_replaced_by_a_link_is_not_followed() {
    let (dir, root) = store_with_every_file();
    for (path, read_by_reader) in files(&root) {
        // The link leads to the very bytes that were there: only the link itself is wrong.
        let elsewhere = dir.path().join("elsewhere");
        fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let openers: &[bool] = if read_by_reader {
            &[true, false]
        } else {
            &[false]
        };
        for &reader in openers {
            let options = if reader {
                StoreOptions::new().reader()
            } else {
                StoreOptions::new()
            };
            let err = FsStore::open_with(&root, options).map(drop).unwrap_err();
            assert!(refused(&err, &path), "reader {reader}: {err}");
            assert!(
                fs::symlink_metadata(&path).unwrap().is_symlink(),
                "left as it was"
            );
        }
        fs::remove_file(&path).unwrap();
        fs::rename(&elsewhere, &path).unwrap();
    }
    FsStore::open(&root).unwrap();
}

#[test]
fn store_journal_record_over_its_cap_is_refused_before_it_is_read() {
    let (_dir, root) = store_with_every_file();
    let path = record(&root);
    let bytes = fs::read(&path).unwrap();
    // Sparse: 32 MiB that take no space, twice the cap on a journal record.
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let err = FsStore::open(&root).map(drop).unwrap_err();
    assert!(refused(&err, &path), "{err}");
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        32 << 20,
        "left as it was"
    );
    fs::write(&path, bytes).unwrap();
    let (store, report) = FsStore::open(&root).unwrap();
    assert_eq!(report.rolled_back.len(), 1, "{report:?}");
    assert!(store.read_trust().unwrap().is_some());
}
