//! Staging a build for the check: a temporary package tree with its `.gkmetadata`, made from a
//! package archive, an unpacked package directory, or a directory of built files and a manifest
//! template (packed unsigned first, exactly as `guild pack` would). Nothing is authenticated.
//!
//! Each check stages under `$TMPDIR/guild-check-<uid>/` into a `run-<pid>-<n>` directory, with a
//! `run-<pid>-<n>.lock` file beside it that the check holds locked (`flock`) for its life. A check
//! that is killed or interrupted cannot remove its directory, but the kernel drops its lock, so
//! the next check removes every directory whose lock nobody holds before it stages its own.

use std::fs::File;
use std::path::{Path, PathBuf};

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
        if lock_path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(lock) = File::open(&lock_path) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            packaging::remove_scratch(&lock_path.with_extension(""));
            let _ = std::fs::remove_file(&lock_path);
        }
    }
}

/// A new run under `root`: its lock file made and locked first, then its directory.
fn new_run(root: &Path) -> Result<Run, StageError> {
    let refuse = |path: &Path, e: std::io::Error| StageError::Scratch {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    for n in 0..100u32 {
        let dir = root.join(format!("run-{}-{n}", std::process::id()));
        let lock_path = dir.with_extension("lock");
        let lock = match File::options()
            .write(true)
            .create_new(true)
            .open(&lock_path)
        {
            Ok(lock) => lock,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(refuse(&lock_path, e)),
        };
        if let Err(e) = lock.try_lock() {
            let _ = std::fs::remove_file(&lock_path);
            return Err(refuse(&lock_path, e.into()));
        }
        if let Err(e) = std::fs::create_dir(&dir) {
            let _ = std::fs::remove_file(&lock_path);
            return Err(refuse(&dir, e));
        }
        return Ok(Run {
            dir,
            lock_path,
            _lock: lock,
        });
    }
    Err(refuse(
        root,
        std::io::Error::other("no free run directory name"),
    ))
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
