//! Cross-process pins: `pins/<id>@<version>` lock files.
//!
//! A process that loads a version's library holds a shared `flock` on the version's pin file for
//! as long as the library may be loaded. A writer that is about to delete the version's files
//! takes an exclusive `flock` on the same file without waiting: if that fails, a live process
//! holds the version and the deletion is refused, naming the holders (read from `/proc/locks`).
//! The kernel drops a process's locks when it dies, so a dead process never blocks anything.
//!
//! A writer removes a pin file only while it holds the exclusive lock on it; a reader that locked
//! the file checks afterwards that the path still names the inode it locked, and starts again if
//! not, so it never holds a pin on a file that a writer unlinked.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

use guild_domain::graph::NodeRef;
use guild_domain::ids::PackageId;
use guild_domain::version::Version;
use guild_ports::store::{PinHolder, StoreError, StoreErrorKind, VersionPins};

use super::durable::{io_error, remove_tree};
use super::StoreLayout;
use crate::durable_file::still_linked;

/// How often a pin is tried again when its file was replaced under it.
const ATTEMPTS: usize = 16;

/// The pin file of `id@version`. Ids use `[a-z0-9_.-]` and versions `[0-9A-Za-z.+-]`, so `@`
/// separates them unambiguously.
pub(crate) fn pin_path(layout: &StoreLayout, id: &str, version: &str) -> PathBuf {
    layout.pins.join(format!("{id}@{version}"))
}

fn open_pin(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    // The standard library opens every file close-on-exec.
    crate::durable_file::unfollowed(&mut options).open(path)
}

fn ensure_dir(layout: &StoreLayout) -> Result<(), StoreError> {
    match fs::create_dir(&layout.pins) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_error("create pins directory", &layout.pins, e)),
    }
}

/// Takes a shared pin on `id@version`. Refused with [`StoreErrorKind::Removed`] while a writer
/// holds the version for deletion.
pub(crate) fn take_shared(
    layout: &StoreLayout,
    id: &PackageId,
    version: &Version,
) -> Result<File, StoreError> {
    ensure_dir(layout)?;
    let path = pin_path(layout, id.as_str(), &version.to_string());
    for _ in 0..ATTEMPTS {
        let file = open_pin(&path).map_err(|e| io_error("open pin file", &path, e))?;
        match file.try_lock_shared() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::new(
                    StoreErrorKind::Removed,
                    format!("a writer is deleting the files of {id}@{version}"),
                )
                .at(path))
            }
            Err(TryLockError::Error(e)) => return Err(io_error("pin version", &path, e)),
        }
        if still_linked(&file, &path).map_err(|e| io_error("inspect pin file", &path, e))? {
            return Ok(file);
        }
    }
    Err(StoreError::new(
        StoreErrorKind::Removed,
        format!("the pin file of {id}@{version} keeps being replaced"),
    )
    .at(path))
}

/// A writer's hold on a version whose files it is about to delete: the exclusive lock on the
/// version's pin file, so that no process can pin the version until the files are gone. The
/// pin file is unlinked when the hold is dropped, still locked, so that no reader can pin the
/// unlinked file and believe itself safe. A version that only this process pins is held
/// without a lock (`file` is `None`): within a process the kernel registry's leases decide.
#[derive(Debug)]
pub(crate) struct DeleteHold {
    root: PathBuf,
    path: PathBuf,
    file: Option<File>,
}

impl DeleteHold {
    /// Deletes `tree`, the files of the held version, and lets go. This is the one way a writer
    /// deletes a version tree, for a commit and for recovery alike. Answers whether anything
    /// was there.
    pub(crate) fn delete_tree(self, tree: &Path) -> io::Result<bool> {
        super::testing::fire(&self.root, tree);
        remove_tree(tree)
    }
}

impl Drop for DeleteHold {
    fn drop(&mut self) {
        if self.file.is_some() {
            // The lock is still held here: the file closes after this body.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Why a version's files cannot be deleted now.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Live processes other than this one pin the version.
    Pinned(Vec<PinHolder>),
    /// Whether a process pins it could not be told: the pin file could not be opened or locked.
    /// A writer that cannot tell does not delete.
    Unknown(StoreError),
}

/// Takes the hold for deleting `id@version`'s files, or says why not: the processes that pin
/// it, or why that could not be told.
pub(crate) fn hold_for_delete(
    layout: &StoreLayout,
    id: &str,
    version: &str,
) -> Result<DeleteHold, Refusal> {
    ensure_dir(layout).map_err(Refusal::Unknown)?;
    let path = pin_path(layout, id, version);
    let file =
        open_pin(&path).map_err(|e| Refusal::Unknown(io_error("open pin file", &path, e)))?;
    let me = std::process::id();
    let mut holders = Vec::new();
    for attempt in 0..TRANSIENT_ATTEMPTS {
        match file.try_lock() {
            Ok(()) => {
                return Ok(DeleteHold {
                    root: layout.root.clone(),
                    path,
                    file: Some(file),
                })
            }
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => {
                return Err(Refusal::Unknown(io_error("hold pin file", &path, e)))
            }
        }
        holders = lock_holders(&file);
        if holders.iter().any(|h| h.pid != me) {
            break;
        }
        if !holders.is_empty() {
            // Only this process pins it.
            return Ok(DeleteHold {
                root: layout.root.clone(),
                path,
                file: None,
            });
        }
        // Nobody is listed, yet the lock is held: a child forked by some thread of this
        // process holds a copy of a pin's open file until it execs. That passes; try again.
        if attempt + 1 < TRANSIENT_ATTEMPTS {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    Err(Refusal::Pinned(
        holders.into_iter().filter(|h| h.pid != me).collect(),
    ))
}

/// How often a pin held by nobody listed is tried again (2 ms apart).
const TRANSIENT_ATTEMPTS: usize = 100;

/// Lets go of a pin that turned out to be taken for nothing, and removes its file unless
/// another process holds it too (only under the exclusive lock, as the protocol says).
pub(crate) fn give_back(layout: &StoreLayout, id: &PackageId, version: &Version, file: File) {
    let path = pin_path(layout, id.as_str(), &version.to_string());
    // `flock` turns the shared lock into an exclusive one, or fails while anyone else holds it.
    if file.try_lock().is_ok() && still_linked(&file, &path).unwrap_or(false) {
        let _ = fs::remove_file(&path);
    }
}

/// The live pins on the versions of `id` (every package when `None`).
pub(crate) fn list(
    layout: &StoreLayout,
    id: Option<&PackageId>,
) -> Result<Vec<VersionPins>, StoreError> {
    let entries = match fs::read_dir(&layout.pins) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error("list pins", &layout.pins, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("list pins", &layout.pins, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid_name, version)) = name.split_once('@') else {
            continue;
        };
        let (Ok(package), Ok(version)) = (PackageId::new(pid_name), version.parse::<Version>())
        else {
            continue;
        };
        if id.is_some_and(|wanted| wanted != &package) {
            continue;
        }
        let Ok(file) = File::open(entry.path()) else {
            continue;
        };
        let holders = lock_holders(&file);
        if !holders.is_empty() {
            out.push(VersionPins {
                node: NodeRef {
                    id: package,
                    version,
                },
                holders,
            });
        }
    }
    out.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(out)
}

/// Every process that holds a `flock` on `file`, from `/proc/locks` (which names the device and
/// inode of each locked file), with its command name. Waiters (`->`) are not holders.
#[cfg(target_os = "linux")]
pub(crate) fn lock_holders(file: &File) -> Vec<PinHolder> {
    let Some(wanted) = super::proc_lock_key(file) else {
        return Vec::new();
    };
    let mut pids = flock_pids(&wanted);
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .map(|pid| PinHolder {
            pid,
            command: fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .map(|c| c.trim_end().to_owned())
                .filter(|c| !c.is_empty()),
        })
        .collect()
}

/// The pids `/proc/locks` lists as holding a `flock` on the file whose key is `wanted`, from
/// three readings. The kernel produces the file a page at a time and lets go of its lock list
/// in between, so one reading taken while other locks come and go can skip a line; a holder is
/// listed as long as it holds the lock, so the union of three readings misses it only if all
/// three skip it.
#[cfg(target_os = "linux")]
fn flock_pids(wanted: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = Vec::new();
    for _ in 0..3 {
        let Ok(locks) = fs::read_to_string("/proc/locks") else {
            continue;
        };
        pids.extend(locks.lines().filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [_, "FLOCK", _, _, pid, file, ..] if *file == wanted => pid.parse::<u32>().ok(),
                _ => None,
            }
        }));
    }
    pids
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn lock_holders(_file: &File) -> Vec<PinHolder> {
    Vec::new()
}
