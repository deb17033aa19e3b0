//! The store's durable steps: numbered so that a fault plan can stop any one of them, counted
//! so that the cost of a commit is visible, and each following the Linux rules for making a
//! change survive a power loss (write a temporary file in the same directory, fsync it, rename it
//! over the target, fsync the directory; fsync a tree's files and directories bottom-up).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use guild_ports::store::{StoreError, StoreErrorKind};

/// A fault to inject at one durable step, for the crash matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The 1-based number of the step, counted within one operation (a commit or a trust write).
    pub step: usize,
    pub mode: FaultMode,
}

/// How an injected fault behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// The step fails as if its system call had failed. The operation then cleans up as it would
    /// after a real error.
    Error,
    /// The process "dies" before the step completes: the operation stops at once with no cleanup
    /// (a write step leaves half its bytes behind), the store refuses every further call, and the
    /// test reopens the store from disk.
    Crash,
}

/// What the last durable operation did: the name of each step it started, in order, and how many
/// fsync calls it made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpStats {
    pub steps: Vec<&'static str>,
    pub fsyncs: u32,
}

/// One durable operation in progress: numbers its steps, fires the armed fault, counts fsyncs.
#[derive(Debug)]
pub(crate) struct Run {
    fault: Option<Fault>,
    pub(crate) stats: OpStats,
}

impl Run {
    pub(crate) fn new(fault: Option<Fault>) -> Self {
        Run {
            fault,
            stats: OpStats::default(),
        }
    }

    /// The fault if it has not fired, so that the store can keep it armed for a later operation.
    pub(crate) fn unfired(&self) -> Option<Fault> {
        self.fault
    }

    /// Starts step `name`: fails with the armed fault if this is its number.
    pub(crate) fn step(&mut self, name: &'static str) -> Result<(), StoreError> {
        match self.begin(name) {
            Some(mode) => Err(injected(mode, name, self.stats.steps.len())),
            None => Ok(()),
        }
    }

    fn begin(&mut self, name: &'static str) -> Option<FaultMode> {
        self.stats.steps.push(name);
        let n = self.stats.steps.len();
        match self.fault {
            Some(f) if f.step == n => {
                self.fault = None;
                Some(f.mode)
            }
            _ => None,
        }
    }

    /// Step `name`: creates or truncates `path` and writes `bytes` to it (no fsync). An injected
    /// crash leaves the first half of the bytes behind, as a process killed mid-write would.
    pub(crate) fn write_file(
        &mut self,
        name: &'static str,
        path: &Path,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.writing(name, bytes, |bytes| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
                .and_then(|mut file| file.write_all(bytes))
                .map_err(|e| io_error(name, path, e))
        })
    }

    /// Starts write step `name` and has `write` write `bytes`, or the first half of them under an
    /// injected crash (which then stops the operation).
    fn writing(
        &mut self,
        name: &'static str,
        bytes: &[u8],
        write: impl FnOnce(&[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let fault = self.begin(name);
        let n = self.stats.steps.len();
        let bytes = match fault {
            Some(FaultMode::Error) => return Err(injected(FaultMode::Error, name, n)),
            Some(FaultMode::Crash) => bytes.get(..bytes.len() / 2).unwrap_or_default(),
            None => bytes,
        };
        write(bytes)?;
        match fault {
            Some(mode) => Err(injected(mode, name, n)),
            None => Ok(()),
        }
    }

    /// Step `name`: appends `bytes` to the file at `path`, which must be `at` bytes long (no
    /// fsync). An injected crash leaves the first half of the bytes behind, a torn frame.
    pub(crate) fn append(
        &mut self,
        name: &'static str,
        path: &Path,
        at: u64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        use std::io::{Seek as _, SeekFrom};
        self.writing(name, bytes, |bytes| {
            let mut file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| io_error(name, path, e))?;
            // Whatever lies past the last complete frame is not committed; write over it.
            file.set_len(at)
                .and_then(|()| file.seek(SeekFrom::Start(at)))
                .and_then(|_| file.write_all(bytes))
                .map_err(|e| io_error(name, path, e))
        })
    }

    /// Step `name`: fdatasyncs the file at `path` (its bytes and its length, not its times).
    pub(crate) fn fdatasync(&mut self, name: &'static str, path: &Path) -> Result<(), StoreError> {
        self.step(name)?;
        self.stats.fsyncs += 1;
        OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.sync_data())
            .map_err(|e| io_error(name, path, e))
    }

    /// Step `name`: fsyncs the file or directory at `path`.
    pub(crate) fn fsync(&mut self, name: &'static str, path: &Path) -> Result<(), StoreError> {
        self.step(name)?;
        self.sync_path(name, path)
    }

    /// Step `name`: renames `from` to `to`.
    pub(crate) fn rename(
        &mut self,
        name: &'static str,
        from: &Path,
        to: &Path,
    ) -> Result<(), StoreError> {
        self.step(name)?;
        fs::rename(from, to).map_err(|e| io_error(name, from, e))
    }

    /// Fsyncs `path` (a file or a directory) without starting a step of its own.
    pub(crate) fn sync_path(&mut self, what: &'static str, path: &Path) -> Result<(), StoreError> {
        self.stats.fsyncs += 1;
        File::open(path)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_error(what, path, e))
    }

    /// Replaces `target` with `bytes` atomically and durably, in four steps: write `tmp` (in the
    /// same directory), fsync it, rename it over `target`, fsync the directory.
    pub(crate) fn atomic_write(
        &mut self,
        names: [&'static str; 4],
        tmp: &Path,
        target: &Path,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let [write, sync, rename, sync_dir] = names;
        let dir = parent(target)?;
        self.write_file(write, tmp, bytes)?;
        self.fsync(sync, tmp)?;
        self.rename(rename, tmp, target)?;
        self.fsync(sync_dir, dir)
    }

    /// Fsyncs every file and directory of the tree at `top`, files first and then directories
    /// from the deepest up, so that each directory is synced after everything inside it. This is
    /// one step however large the tree.
    pub(crate) fn fsync_tree(&mut self, name: &'static str, top: &Path) -> Result<(), StoreError> {
        self.step(name)?;
        let tree = Tree::walk(top)?;
        for file in &tree.files {
            self.sync_path(name, file)?;
        }
        for dir in tree.dirs.iter().rev() {
            self.sync_path(name, dir)?;
        }
        Ok(())
    }
}

/// The regular files and directories of a tree, directories in pre-order (every directory before
/// the directories inside it).
pub(crate) struct Tree {
    pub(crate) files: Vec<PathBuf>,
    pub(crate) dirs: Vec<PathBuf>,
}

impl Tree {
    /// Lists the tree at `top` without following symbolic links. Anything other than a regular
    /// file or a directory is refused: the extractor never creates one, so finding one means the
    /// staged tree was tampered with.
    pub(crate) fn walk(top: &Path) -> Result<Tree, StoreError> {
        let mut tree = Tree {
            files: Vec::new(),
            dirs: Vec::new(),
        };
        let mut pending = vec![top.to_path_buf()];
        while let Some(dir) = pending.pop() {
            let entries = fs::read_dir(&dir).map_err(|e| io_error("list staged tree", &dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| io_error("list staged tree", &dir, e))?;
                let path = entry.path();
                let kind = entry
                    .file_type()
                    .map_err(|e| io_error("inspect staged tree", &path, e))?;
                if kind.is_dir() {
                    pending.push(path);
                } else if kind.is_file() {
                    tree.files.push(path);
                } else {
                    return Err(StoreError::new(
                        StoreErrorKind::InvalidTransaction,
                        "staged tree holds something other than a regular file or directory",
                    )
                    .at(path));
                }
            }
            tree.dirs.push(dir);
        }
        Ok(tree)
    }
}

/// Makes every file of the tree at `top` read-only (keeping its execute bits) and every directory
/// below `top` read-only. `top` itself is made writable by its owner: moving a directory to
/// another parent needs write permission on it (its `..` entry changes), so it is sealed after
/// the move, whatever mode the extractor left it in.
pub(crate) fn seal_tree(top: &Path) -> Result<(), StoreError> {
    set_dir_writable(top).map_err(|e| io_error("unseal staged tree root", top, e))?;
    let tree = Tree::walk(top)?;
    for file in &tree.files {
        let mode = fs::symlink_metadata(file)
            .map_err(|e| io_error("inspect staged file", file, e))?
            .permissions();
        set_read_only(file, mode).map_err(|e| io_error("seal staged file", file, e))?;
    }
    for dir in tree.dirs.iter().filter(|d| d.as_path() != top) {
        set_dir_read_only(dir).map_err(|e| io_error("seal staged directory", dir, e))?;
    }
    Ok(())
}

/// Deletes the file or tree at `path`, making sealed directories writable first. Answers whether
/// anything was there.
pub(crate) fn remove_tree(path: &Path) -> io::Result<bool> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        set_dir_writable(path)?;
        for entry in fs::read_dir(path)? {
            remove_tree(&entry?.path())?;
        }
        fs::remove_dir(path)?;
    } else {
        fs::remove_file(path)?;
    }
    Ok(true)
}

/// Removes `path` if it is there.
pub(crate) fn remove_file_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(unix)]
fn set_read_only(path: &Path, current: fs::Permissions) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(current.mode() & 0o555))
}

#[cfg(not(unix))]
fn set_read_only(path: &Path, mut current: fs::Permissions) -> io::Result<()> {
    current.set_readonly(true);
    fs::set_permissions(path, current)
}

#[cfg(unix)]
pub(crate) fn set_dir_read_only(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o555))
}

#[cfg(not(unix))]
pub(crate) fn set_dir_read_only(path: &Path) -> io::Result<()> {
    let mut p = fs::metadata(path)?.permissions();
    p.set_readonly(true);
    fs::set_permissions(path, p)
}

#[cfg(unix)]
fn set_dir_writable(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
}

#[cfg(not(unix))]
#[allow(clippy::permissions_set_readonly_false)]
fn set_dir_writable(path: &Path) -> io::Result<()> {
    let mut p = fs::metadata(path)?.permissions();
    p.set_readonly(false);
    fs::set_permissions(path, p)
}

/// The directory holding `path`.
pub(crate) fn parent(path: &Path) -> Result<&Path, StoreError> {
    path.parent().ok_or_else(|| {
        StoreError::new(StoreErrorKind::Io, "find the parent directory").at(path.to_path_buf())
    })
}

/// The bytes of the store's own file at `path`, or `None` when there is none. Read as
/// [`read_regular`](crate::durable_file::read_regular) reads: never through a link, never from
/// anything but a regular file (a FIFO cannot stall it), and at most `cap` bytes. Something else
/// in the file's place, or a file over the cap, is `Corrupt`, naming the file; nothing is read
/// from it.
pub(crate) fn read_store_file(
    what: &'static str,
    path: &Path,
    cap: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    use crate::durable_file::{read_regular, ReadError};
    match read_regular(path, cap) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(ReadError::Io(e)) => Err(io_error(what, path, e)),
        Err(e) => Err(StoreError::new(StoreErrorKind::Corrupt, what)
            .at(path.to_path_buf())
            .caused_by(e)),
    }
}

pub(crate) fn io_error(what: &'static str, path: &Path, e: io::Error) -> StoreError {
    StoreError::new(StoreErrorKind::Io, what)
        .at(path.to_path_buf())
        .caused_by(e)
}

fn injected(mode: FaultMode, name: &'static str, step: usize) -> StoreError {
    match mode {
        FaultMode::Error => StoreError::new(StoreErrorKind::Io, name)
            .caused_by(io::Error::other(format!("injected fault at step {step}"))),
        FaultMode::Crash => StoreError::new(
            StoreErrorKind::SimulatedCrash,
            format!("{name} (step {step})"),
        ),
    }
}
