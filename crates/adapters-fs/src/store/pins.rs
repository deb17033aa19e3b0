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
//! not, so it never holds a pin on a file that a writer unlinked. A version that the writer's own
//! process pins is held by renaming an exclusively locked stand-in over the pin file's name (the
//! pin file keeps a second name, `.<id>@<version>.<pid>.<n>.kept`, and goes back when the
//! deletion is done), so that no other process can pin it between the check and the deletion
//! either. Names starting with `.` are never a version's pin.

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

/// A writer's hold on a version whose files it is about to delete: an exclusive lock that the
/// version's pin file name leads to, so that no process can pin the version until the files are
/// gone. Usually that is the lock on the pin file itself, unlinked when the hold is dropped,
/// still locked, so that no reader can pin the unlinked file and believe itself safe.
///
/// A version that this process pins itself (within a process the kernel registry's leases
/// decide) cannot be locked exclusively: this process's own shared lock is in the way. Its name
/// is then taken over by a locked stand-in (see [`stand_in`]), and the pin file, kept under a
/// second name meanwhile, is put back when the hold is dropped, so that this process's own pins
/// stay what they were.
#[derive(Debug)]
pub(crate) struct DeleteHold {
    root: PathBuf,
    path: PathBuf,
    /// The exclusive lock: on the pin file, or on the stand-in at its name. Held, never read;
    /// it closes after `drop` has dealt with the name.
    _lock: File,
    /// The second name of this process's own pin file while a stand-in holds its name.
    kept: Option<PathBuf>,
}

impl DeleteHold {
    /// Deletes `tree`, files of the held version, leaving the hold in place. This is the one way
    /// a writer deletes a version tree, for a commit and for recovery alike. Answers whether
    /// anything was there.
    pub(crate) fn delete_tree(&self, tree: &Path) -> io::Result<bool> {
        super::testing::fire(&self.root, tree);
        remove_tree(tree)
    }
}

impl Drop for DeleteHold {
    fn drop(&mut self) {
        // The lock is still held here: the file closes after this body.
        match self.kept.take() {
            // This process's own pin file goes back over the stand-in.
            Some(kept) => {
                if fs::rename(&kept, &self.path).is_err() {
                    let _ = fs::remove_file(&kept);
                    let _ = fs::remove_file(&self.path);
                }
            }
            None => {
                let _ = fs::remove_file(&self.path);
            }
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
    let me = std::process::id();
    let mut holders = Vec::new();
    for attempt in 0..TRANSIENT_ATTEMPTS {
        let file =
            open_pin(&path).map_err(|e| Refusal::Unknown(io_error("open pin file", &path, e)))?;
        match file.try_lock() {
            Ok(()) => {
                // A pinner that was refused may have unlinked the file after this open: a lock
                // on it would keep nobody out.
                if linked(&file, &path)? {
                    return Ok(DeleteHold {
                        root: layout.root.clone(),
                        path,
                        _lock: file,
                        kept: None,
                    });
                }
                continue;
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
            match stand_in(layout, &path, &file)? {
                StandIn::Held(hold) => return Ok(hold),
                StandIn::Pinned(others) => {
                    holders = others;
                    break;
                }
                StandIn::Moved => continue,
            }
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

fn linked(file: &File, path: &Path) -> Result<bool, Refusal> {
    still_linked(file, path).map_err(|e| Refusal::Unknown(io_error("inspect pin file", path, e)))
}

/// How taking over a pin file's name ended.
enum StandIn {
    Held(DeleteHold),
    /// Another process pinned the version before the name moved: the pin file is back.
    Pinned(Vec<PinHolder>),
    /// The pin file's name no longer led to the file this process pins: start again.
    Moved,
}

/// Distinguishes this process's stand-ins.
static NEXT_STAND_IN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Holds a version that only this process pins (`own`, the pin file at `path`, which this
/// process's shared lock keeps from being locked exclusively). A fresh file, locked exclusively,
/// is renamed over `path`, after a second name was linked to `own`. From that rename on, nobody
/// can pin the version: the name leads to the stand-in, whose lock is refused, and a pinner
/// that locked `own` finds that the name moved and starts again. A process that pinned `own`
/// before the rename is still listed as holding it afterwards: then `own` goes back under its
/// name and the deletion is refused. Otherwise the stand-in's lock is the hold, and `own` goes
/// back when it is dropped.
fn stand_in(layout: &StoreLayout, path: &Path, own: &File) -> Result<StandIn, Refusal> {
    let unknown =
        |what: &'static str, p: &Path, e: io::Error| Refusal::Unknown(io_error(what, p, e));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = NEXT_STAND_IN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let me = std::process::id();
    // Names starting with `.` are never a version's pin file.
    let tmp = layout.pins.join(format!(".{name}.{me}.{n}.hold"));
    let kept = layout.pins.join(format!(".{name}.{me}.{n}.kept"));
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    let stand_in = crate::durable_file::unfollowed(&mut options)
        .open(&tmp)
        .map_err(|e| unknown("create pin stand-in", &tmp, e))?;
    let cleanup = |also_kept: bool| {
        let _ = fs::remove_file(&tmp);
        if also_kept {
            let _ = fs::remove_file(&kept);
        }
    };
    if let Err(e) = stand_in.try_lock() {
        cleanup(false);
        let e = match e {
            TryLockError::Error(e) => e,
            TryLockError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
        };
        return Err(unknown("lock pin stand-in", &tmp, e));
    }
    match fs::hard_link(path, &kept) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            cleanup(false);
            return Ok(StandIn::Moved);
        }
        Err(e) => {
            cleanup(false);
            return Err(unknown("keep pin file", &kept, e));
        }
    }
    match still_linked(own, &kept) {
        Ok(true) => {}
        Ok(false) => {
            cleanup(true);
            return Ok(StandIn::Moved);
        }
        Err(e) => {
            cleanup(true);
            return Err(unknown("inspect pin file", &kept, e));
        }
    }
    if let Err(e) = fs::rename(&tmp, path) {
        cleanup(true);
        return Err(unknown("put pin stand-in in place", path, e));
    }
    let others: Vec<PinHolder> = lock_holders(own)
        .into_iter()
        .filter(|h| h.pid != me)
        .collect();
    let hold = DeleteHold {
        root: layout.root.clone(),
        path: path.to_path_buf(),
        _lock: stand_in,
        kept: Some(kept),
    };
    if others.is_empty() {
        Ok(StandIn::Held(hold))
    } else {
        // Dropping the hold puts `own` back under its name, under the stand-in's lock.
        drop(hold);
        Ok(StandIn::Pinned(others))
    }
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
        if name.starts_with('.') {
            // A writer's stand-in, or the second name of a pin file it put one over.
            continue;
        }
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
