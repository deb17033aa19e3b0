//! Staging a build for the check: a temporary package tree with its `.gkmetadata`, made from a
//! package archive, an unpacked package directory, or a directory of built files and a manifest
//! template (packed unsigned first, exactly as `guild pack` would). Nothing is authenticated.
//!
//! Each check stages under `$TMPDIR/guild-check-<uid>/` into a `run-<pid>-<n>` directory, with a
//! `run-<pid>-<n>.lock` file beside it that the check holds locked (`flock`) for its life. A check
//! that is killed or interrupted cannot remove its directory, but the kernel drops its lock, so
//! the next check removes every directory whose lock nobody holds before it stages its own. A lock
//! file is locked before it takes its `.lock` name, so a sweep never mistakes a starting check for
//! a dead one.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use guild_domain::manifest::{ManifestErrors, Metadata};
use guild_ports::source::{Durability, ExtractOptions, PackageSource, SourceError};

use guild_host::packaging::{self, GkpkSource, PublishError};

/// Why a build could not be checked at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// Packing the directory with its template failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The package could not be read or extracted.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Its `.gkmetadata` is malformed.
    #[error("{}: {errors}", .path.display())]
    Manifest {
        /// The package.
        path: PathBuf,
        /// Every problem.
        errors: ManifestErrors,
    },
    /// The arguments do not describe a build (a template with an archive, say).
    #[error("{0}")]
    Usage(String),
    /// The directory the check stages into is unusable.
    #[error("cannot stage the build under {}: {reason}", .path.display())]
    Scratch {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The check process could not be started.
    #[error("cannot run the check process {}: {reason}", .program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// A staged tree, removed when dropped.
pub(crate) struct Staged {
    _run: Run,
    /// The package tree: `.gkmetadata` and the artifacts.
    pub dir: PathBuf,
}

/// One check's directory and its held lock; both removed when dropped.
struct Run {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

impl Run {
    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // The directory first: a lock file without its directory is harmless, and the next
        // check removes it.
        packaging::remove_scratch(&self.dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// `$TMPDIR/guild-check-<uid>`, made if missing, and refused unless it is a directory of this
/// user's that no one else may write to (the temporary directory is shared).
fn root() -> Result<PathBuf, StageError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    let root = std::env::temp_dir().join(format!("guild-check-{uid}"));
    let refuse = |reason: String| StageError::Scratch {
        path: root.clone(),
        reason,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refuse(e.to_string())),
    }
    let meta = std::fs::symlink_metadata(&root).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(refuse(
            "it is not a directory of this user's that only this user may write to".into(),
        ));
    }
    Ok(root)
}

/// Removes the runs under `root` whose lock nobody holds: checks that were killed.
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let lock_path = entry.path();
        // A lock file not yet named (`.new-…`) belongs to a run being made; free, its maker
        // died before naming it.
        let unnamed = entry.file_name().to_string_lossy().starts_with(".new-");
        if !unnamed && lock_path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(lock) = File::open(&lock_path) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            if !unnamed {
                packaging::remove_scratch(&lock_path.with_extension(""));
            }
            let _ = std::fs::remove_file(&lock_path);
        }
    }
}

/// A locked lock file under a run's `.lock` name, with the run's directory name; `None` when a
/// sweep removed the new file before it was locked (see [`new_run`]).
fn claim_run_name(root: &Path) -> Result<Option<(File, PathBuf, PathBuf)>, StageError> {
    let refuse = |path: &Path, e: std::io::Error| StageError::Scratch {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    static MADE: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    let unnamed = root.join(format!(
        ".new-{pid}-{}",
        MADE.fetch_add(1, Ordering::Relaxed)
    ));
    let create = || File::options().write(true).create_new(true).open(&unnamed);
    let lock = create()
        .or_else(|e| {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(e);
            }
            // This process never makes a name twice: the file is an earlier process's, with
            // the same id, that died making its run.
            let _ = std::fs::remove_file(&unnamed);
            create()
        })
        .map_err(|e| refuse(&unnamed, e))?;
    let locked = match lock.try_lock() {
        Ok(()) => Ok(()),
        // A sweep holds it for the instant it takes to find it free, and removes it.
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(refuse(&unnamed, e)),
    };
    let named = locked.and_then(|()| {
        for n in 0..100u32 {
            let dir = root.join(format!("run-{pid}-{n}"));
            let lock_path = dir.with_extension("lock");
            match std::fs::hard_link(&unnamed, &lock_path) {
                Ok(()) => return Ok(Some((dir, lock_path))),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                // The new file itself is gone: swept before it was locked.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !unnamed.exists() => {
                    return Ok(None)
                }
                Err(e) => return Err(refuse(&lock_path, e)),
            }
        }
        Err(refuse(
            root,
            std::io::Error::other("no free run directory name"),
        ))
    });
    let _ = std::fs::remove_file(&unnamed);
    Ok(named?.map(|(dir, lock_path)| (lock, dir, lock_path)))
}

/// A new run under `root`: its lock file made and locked first, then its directory.
///
/// The lock file is made and locked under a name no sweep looks at, and only then linked to its
/// `.lock` name, so that a sweep running meanwhile never finds it unlocked (it would take the
/// run for a dead one and remove it). A directory already at the run's name therefore has no
/// live owner, since the name's lock was free: a run whose removal stopped half way, or one from
/// an earlier process with the same id. It is removed and made again.
fn new_run(root: &Path) -> Result<Run, StageError> {
    let refuse = |path: &Path, e: std::io::Error| StageError::Scratch {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    // A sweep can open a new lock file in the instant between its creation and its lock, find
    // it free and remove it: the lock is then on a file no name leads to, and naming it fails.
    // That run is simply made again (a sweep removes only what is free at that instant, so a
    // second instant like it is as unlikely as the first).
    let mut attempts = 0;
    let (lock, dir, lock_path) = loop {
        match claim_run_name(root)? {
            Some(claimed) => break claimed,
            None if attempts < 10 => attempts += 1,
            None => {
                return Err(refuse(
                    root,
                    std::io::Error::other("every new lock file was swept before it was named"),
                ))
            }
        }
    };
    let made = std::fs::create_dir(&dir).or_else(|e| {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e);
        }
        packaging::remove_scratch(&dir);
        std::fs::create_dir(&dir)
    });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&lock_path);
        return Err(refuse(&dir, e));
    }
    Ok(Run {
        dir,
        lock_path,
        _lock: lock,
    })
}

pub(crate) fn stage(target: &Path, template: Option<&Path>) -> Result<Staged, StageError> {
    let root = root()?;
    sweep(&root);
    let scratch = new_run(&root)?;
    let package = match template {
        Some(t) => {
            if !target.is_dir() {
                return Err(StageError::Usage(format!(
                    "{} is not a directory; --manifest goes with a directory of built files \
                     (an archive carries its own manifest)",
                    target.display()
                )));
            }
            let archive = scratch.path().join("unsigned.gkpk");
            packaging::pack(target, t, &archive, None)?;
            archive
        }
        None => target.to_path_buf(),
    };
    let source = GkpkSource::new(ExtractOptions {
        durability: Durability::NoFsync,
        ..Default::default()
    });
    let opened = source.open(&package)?;
    let metadata =
        Metadata::parse(opened.metadata_bytes()).map_err(|errors| StageError::Manifest {
            path: package.clone(),
            errors,
        })?;
    let dir = scratch.path().join("tree");
    opened.extract_to(metadata.manifest(), &dir)?;
    Ok(Staged { _run: scratch, dir })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own under the temporary directory, removed when dropped.
    struct Root(PathBuf);

    impl Drop for Root {
        fn drop(&mut self) {
            packaging::remove_scratch(&self.0);
        }
    }

    #[test]
    fn a_run_directory_no_lock_accounts_for_is_replaced_not_a_failure() {
        let root = Root(std::env::temp_dir().join(format!(
            "guild-stage-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )));
        std::fs::create_dir_all(&root.0).unwrap();
        // What an earlier process with this id left: a run's directory, its lock file gone.
        let stale = root.0.join(format!("run-{}-0", std::process::id()));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("left-over"), b"x").unwrap();

        let run = new_run(&root.0).expect("a stale directory does not stop a check");
        assert_eq!(run.path(), stale);
        assert!(!stale.join("left-over").exists(), "the run starts empty");
        // Nothing but the run's directory and its lock file is left beside it.
        let mut names: Vec<String> = std::fs::read_dir(&root.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let pid = std::process::id();
        assert_eq!(names, [format!("run-{pid}-0"), format!("run-{pid}-0.lock")]);

        // A sweep while the run lives leaves it; once it is dropped, nothing is left.
        sweep(&root.0);
        assert!(stale.is_dir());
        drop(run);
        assert_eq!(std::fs::read_dir(&root.0).unwrap().count(), 0);
    }

    /// Checks that start while others sweep: a sweep that catches a new run's lock file in the
    /// instant before it is locked removes it, and the run is made again rather than failing
    /// ("cannot stage the build under run-….lock: No such file or directory", seen when the
    /// command-line tests ran several checks at once).
    #[test]
    fn runs_made_while_others_sweep_are_never_refused() {
        let root = Root(std::env::temp_dir().join(format!(
            "guild-stage-race-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )));
        std::fs::create_dir_all(&root.0).unwrap();
        let failures: Vec<String> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut failed = Vec::new();
                        for _ in 0..300 {
                            sweep(&root.0);
                            match new_run(&root.0) {
                                Ok(run) => {
                                    assert!(run.path().is_dir());
                                    drop(run);
                                }
                                Err(e) => failed.push(e.to_string()),
                            }
                        }
                        failed
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        assert!(
            failures.is_empty(),
            "{} refused: {:?}",
            failures.len(),
            &failures[..failures.len().min(3)]
        );
    }
}
