//! Small files written atomically and durably by processes that may die at any instant, and a
//! way to tell, from the file alone, whether the process that wrote it is gone.
//!
//! A file is first written to a temporary in the same directory, `.<name>.<pid>.<n>.tmp`, which
//! the writer locks (an exclusive `flock`) as soon as it has created it; the temporary is
//! fsynced, renamed over the name, and the directory fsynced. The writer holds the lock until it
//! is done, or, with [`write_locked`], for as long as it keeps the returned file; the kernel
//! drops it when the writer dies. So whether a file's writer is still at work is one
//! non-blocking lock attempt ([`claim_abandoned`]), whatever became of its pid and on any system
//! with `flock`, and a temporary that can be claimed is debris of a writer that died before its
//! rename ([`remove_stale_temporaries`]).
//!
//! Whoever holds the lock removes the file only while holding it, and whoever takes it checks
//! afterwards that the name still leads to the file it locked ([`still_linked`]), so a file
//! renamed or removed between the open and the lock is never mistaken for an abandoned one.
//!
//! The store's own commit steps (`store::durable`) are numbered for fault injection and write
//! fixed names under the store's lock; this module is for writers without that lock, such as
//! the host's crash records.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes this process's temporaries.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// How many fresh temporary names a write tries before it gives up.
const ATTEMPTS: usize = 16;

/// Replaces `path` with `bytes`, atomically and durably.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_locked(path, bytes).map(drop)
}

/// [`write()`], answering the file, which keeps the exclusive lock the writer took on it: while
/// the caller holds it (and the process lives), [`claim_abandoned`] answers that the file's
/// writer is still there.
pub fn write_locked(path: &Path, mut bytes: &[u8]) -> io::Result<File> {
    write_from(path, &mut bytes)
}

/// [`write_locked`], copying what `reader` yields (a downloaded package, say) instead of bytes
/// in memory. The temporary is created exclusively (`O_EXCL`, so a link planted at its name is
/// never followed: another name is taken), and a writer that dies leaves it for
/// [`remove_stale_temporaries`] or [`remove_stale_temporaries_of`].
pub fn write_from(path: &Path, reader: &mut dyn io::Read) -> io::Result<File> {
    write_from_then(path, reader, |_| ()).map(|(file, ())| file)
}

/// [`write_locked`], calling `before_rename` with the written, synced and locked file just before
/// it takes its name: whatever `before_rename` arranges for the file (a signal handler that
/// should find it, say) is in place by the time anyone can see the file at `path`. If the rename
/// fails, its result is dropped before the file is.
pub fn write_locked_then<T>(
    path: &Path,
    mut bytes: &[u8],
    before_rename: impl FnOnce(&File) -> T,
) -> io::Result<(File, T)> {
    write_from_then(path, &mut bytes, before_rename)
}

fn write_from_then<T>(
    path: &Path,
    reader: &mut dyn io::Read,
    before_rename: impl FnOnce(&File) -> T,
) -> io::Result<(File, T)> {
    let (dir, name) = split(path)?;
    let (mut file, tmp) = claim_temporary(dir, name)?;
    let synced = io::copy(reader, &mut file).and_then(|_| file.sync_all());
    if let Err(e) = synced {
        // Still locked: nobody else can have claimed it.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let arranged = before_rename(&file);
    match fs::rename(&tmp, path).and_then(|()| sync_dir(dir)) {
        Ok(()) => Ok((file, arranged)),
        Err(e) => {
            drop(arranged);
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// A new temporary beside `name` in `dir`, created exclusively (`O_EXCL`, so a link planted at
/// its name is never followed: another name is taken) and locked, with its path.
fn claim_temporary(dir: &Path, name: &OsStr) -> io::Result<(File, PathBuf)> {
    for _ in 0..ATTEMPTS {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(
            ".{}.{}.{n}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        match file.try_lock() {
            // Someone cleaning debris may have locked it between its creation and this lock,
            // removed it and let go already: then it has lost its name, and another is taken.
            Ok(()) => {
                if !still_linked(&file, &tmp)? {
                    continue;
                }
            }
            // Someone cleaning debris locked it between its creation and this lock, and will
            // remove it: take another name.
            Err(TryLockError::WouldBlock) => {
                let _ = fs::remove_file(&tmp);
                continue;
            }
            Err(TryLockError::Error(e)) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        }
        return Ok((file, tmp));
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary name beside {}", dir.join(name).display()),
    ))
}

/// The file at `path`, locked, if the process that wrote it with [`write_locked`] (or holds its
/// lock otherwise) is gone; `None` while it lives, or when there is no file at `path` (any
/// more). The caller holds the lock for as long as it keeps the file.
pub fn claim_abandoned(path: &Path) -> io::Result<Option<File>> {
    let mut options = OpenOptions::new();
    // Never through a link, and never stalled by a FIFO in the file's place.
    unfollowed(options.read(true));
    let file = match options.open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(None),
        Err(TryLockError::Error(e)) => return Err(e),
    }
    // Its writer may have renamed it away, or removed it, between the open and the lock.
    Ok(still_linked(&file, path)?.then_some(file))
}

/// Why [`read_regular`] refused or failed to read a file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening or reading failed; [`io::ErrorKind::NotFound`] when there is no file.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Something other than a regular file is at the path: a link, a FIFO, a device, a
    /// directory. Nothing was read from it.
    #[error("not a regular file (a link or something else is in its place)")]
    NotRegular,
    /// The file holds more than the reader's cap; at most the cap and one byte were read.
    #[error("larger than {cap} bytes, more than is ever written there")]
    TooLarge { cap: u64 },
}

impl ReadError {
    /// Whether there is no file at the path.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

/// The bytes of the regular file at `path`, at most `cap` of them.
///
/// The last component is opened without following a link (`O_NOFOLLOW`) and without blocking
/// (`O_NONBLOCK`), and the file opened must be a regular file: a FIFO planted there cannot stall
/// the reader, nor a link to `/dev/zero` or a device feed it without end. A file longer than
/// `cap` is refused, and the read itself stops one byte past the cap, so that a file growing
/// meanwhile cannot make the reader's memory grow without bound either.
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>, ReadError> {
    use std::io::Read as _;
    let mut options = OpenOptions::new();
    let file = open_regular(path, options.read(true))?;
    let meta = file.metadata()?;
    if meta.len() > cap {
        return Err(ReadError::TooLarge { cap });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(ReadError::TooLarge { cap });
    }
    Ok(bytes)
}

/// A regular file opened for reading parts of it, as [`read_regular`] opens it: a reader of a
/// large file that needs only some of its bytes.
#[derive(Debug)]
pub struct PartialFile {
    file: File,
    len: u64,
}

impl PartialFile {
    /// Opens the regular file at `path` ([`open_regular`]), refusing one longer than `cap`.
    pub fn open(path: &Path, cap: u64) -> Result<Self, ReadError> {
        let mut options = OpenOptions::new();
        let file = open_regular(path, options.read(true))?;
        let len = file.metadata()?.len();
        if len > cap {
            return Err(ReadError::TooLarge { cap });
        }
        Ok(PartialFile { file, len })
    }

    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty when it was opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the bytes in `range` to `out`, all of them ([`io::ErrorKind::UnexpectedEof`]
    /// when the file ends first).
    pub fn append_at(&self, range: std::ops::Range<u64>, out: &mut Vec<u8>) -> io::Result<()> {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let len = range.end.saturating_sub(range.start);
        let mut file = &self.file;
        file.seek(SeekFrom::Start(range.start))?;
        out.reserve(
            usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        );
        let read = file.take(len).read_to_end(out)?;
        if (read as u64) < len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    /// The bytes in `range`, all of them ([`io::ErrorKind::UnexpectedEof`] when the file
    /// ends first).
    pub fn read_at(&self, range: std::ops::Range<u64>) -> io::Result<Vec<u8>> {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let len = usize::try_from(range.end.saturating_sub(range.start))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut bytes = vec![0; len];
        let mut file = &self.file;
        file.seek(SeekFrom::Start(range.start))?;
        file.read_exact(&mut bytes)?;
        Ok(bytes)
    }
}

/// `options`, opening the last component without following a link (`O_NOFOLLOW`) and without
/// blocking (`O_NONBLOCK`), so that neither a link nor a FIFO planted at the path can lead the
/// open elsewhere or stall it.
pub fn unfollowed(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    options
}

/// The regular file at `path`, opened with `options` [`unfollowed`]; anything else there (a
/// link, a FIFO, a device, a directory) is [`ReadError::NotRegular`] and left as it was.
pub fn open_regular(path: &Path, options: &mut OpenOptions) -> Result<File, ReadError> {
    let file = match unfollowed(options).open(path) {
        Ok(file) => file,
        // Whatever stopped the open (`ELOOP` for a link), something that is not a regular file
        // is the clearer reason to give.
        Err(e) => {
            return Err(match fs::symlink_metadata(path) {
                Ok(found) if !found.is_file() => ReadError::NotRegular,
                _ => ReadError::Io(e),
            })
        }
    };
    if !file.metadata()?.is_file() {
        return Err(ReadError::NotRegular);
    }
    Ok(file)
}

/// Whether `name` is one of this module's temporaries.
pub fn is_temporary(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Removes the temporaries in `dir` whose writer died before renaming them, and answers their
/// paths. A temporary that a live writer still holds stays. A missing `dir` has none.
pub fn remove_stale_temporaries(dir: &Path) -> io::Result<Vec<PathBuf>> {
    remove_stale(dir, |_| true)
}

/// [`remove_stale_temporaries`] for the temporaries of the one file `path` only, leaving any
/// other file in its directory alone (a directory the operator chose, say).
pub fn remove_stale_temporaries_of(path: &Path) -> io::Result<Vec<PathBuf>> {
    let (dir, name) = split(path)?;
    let prefix = format!(".{}.", name.to_string_lossy());
    remove_stale(dir, |temporary| {
        temporary.to_string_lossy().starts_with(&prefix)
    })
}

fn remove_stale(dir: &Path, ours: impl Fn(&OsStr) -> bool) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        // Only regular files are ever temporaries; a link planted under such a name is left
        // alone rather than failing the sweep.
        if !is_temporary(&entry.file_name())
            || !ours(&entry.file_name())
            || !entry.file_type()?.is_file()
        {
            continue;
        }
        let path = entry.path();
        if let Some(held) = claim_abandoned(&path)? {
            match fs::remove_file(&path) {
                Ok(()) => removed.push(path),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            drop(held);
        }
    }
    removed.sort();
    Ok(removed)
}

/// Whether `file` is still the file at `path` (someone may have renamed or unlinked it).
pub fn still_linked(file: &File, path: &Path) -> io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        let held = file.metadata()?;
        match fs::symlink_metadata(path) {
            Ok(now) => Ok(now.ino() == held.ino() && now.dev() == held.dev()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        Ok(path.exists())
    }
}

/// Moves the finished file `tmp` (already written, for example by a download) over `path`,
/// durably: `tmp` is fsynced, renamed in the same directory, and the directory fsynced. A
/// failure before the rename leaves `path` as it was.
pub fn move_into_place(tmp: &Path, path: &Path) -> io::Result<()> {
    let (dir, _) = split(path)?;
    File::open(tmp)?.sync_all()?;
    fs::rename(tmp, path)?;
    sync_dir(dir)
}

/// Makes the entries of directory `dir` durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        // Directories cannot be opened for syncing there; a rename is durable once the file
        // system commits it.
        let _ = dir;
        Ok(())
    }
}

fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn write_from_never_writes_through_a_link_planted_at_its_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"untouched").unwrap();
        let path = dir.path().join("pkg.gkmodule");
        // Links at the next temporary names this process will try.
        let next = NEXT.load(Ordering::Relaxed);
        for n in next..next + 8 {
            let tmp = dir
                .path()
                .join(format!(".pkg.gkmodule.{}.{n}.tmp", std::process::id()));
            std::os::unix::fs::symlink(&victim, tmp).unwrap();
        }
        write_from(&path, &mut &b"the package"[..]).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"the package");
        assert_eq!(fs::read(&victim).unwrap(), b"untouched");
        // Links are no temporaries of a dead writer to remove: the cleaner leaves them (and the
        // victim) alone, and removes only this file's unlocked temporaries.
        let stale = dir.path().join(".pkg.gkmodule.1.0.tmp");
        fs::write(&stale, b"half").unwrap();
        let other = dir.path().join(".other.1.0.tmp");
        fs::write(&other, b"theirs").unwrap();
        let removed = remove_stale_temporaries_of(&path).unwrap();
        assert!(removed.contains(&stale), "{removed:?}");
        assert!(other.exists());
        assert_eq!(fs::read(&victim).unwrap(), b"untouched");
    }

    #[cfg(unix)]
    #[test]
    fn write_locked_then_arranges_before_anyone_can_see_the_file() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        let (held, seen) = write_locked_then(&path, b"{}", |file| {
            // Written and locked, under its temporary name only.
            let mut bytes = [0u8; 2];
            file.read_exact_at(&mut bytes, 0).unwrap();
            let temporaries: Vec<_> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            let held = temporaries
                .iter()
                .all(|t| claim_abandoned(t).unwrap().is_none());
            (
                path.exists(),
                bytes.to_vec(),
                temporaries.len() == 1 && held,
            )
        })
        .unwrap();
        assert_eq!(seen, (false, b"{}".to_vec(), true));
        assert_eq!(fs::read(&path).unwrap(), b"{}");
        assert!(claim_abandoned(&path).unwrap().is_none(), "still held");
        drop(held);
        assert!(claim_abandoned(&path).unwrap().is_some(), "released");
        // A failed rename drops what was arranged before the file, and leaves no temporary.
        let blocked = dir.path().join("taken");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("inside"), b"x").unwrap();
        let order = std::cell::RefCell::new(Vec::new());
        struct Noted<'a>(&'a std::cell::RefCell<Vec<&'static str>>);
        impl Drop for Noted<'_> {
            fn drop(&mut self) {
                self.0.borrow_mut().push("arranged dropped");
            }
        }
        assert!(write_locked_then(&blocked, b"{}", |_| Noted(&order)).is_err());
        assert_eq!(*order.borrow(), ["arranged dropped"]);
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| is_temporary(n))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn read_regular_reads_up_to_the_cap_and_only_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_regular(&path, 10).unwrap(), b"0123456789");
        assert!(matches!(
            read_regular(&path, 9),
            Err(ReadError::TooLarge { cap: 9 })
        ));
        assert!(read_regular(&dir.path().join("none"), 10)
            .unwrap_err()
            .is_not_found());
        // A link is not followed, not even to a regular file; a device or a directory is not
        // read. A link to /dev/zero would otherwise feed the reader without end.
        let link = dir.path().join("link");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&path, &link).unwrap();
            assert!(matches!(
                read_regular(&link, 10),
                Err(ReadError::NotRegular)
            ));
            fs::remove_file(&link).unwrap();
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            assert!(matches!(
                read_regular(&link, 10),
                Err(ReadError::NotRegular)
            ));
            assert!(matches!(
                read_regular(Path::new("/dev/zero"), 10),
                Err(ReadError::NotRegular)
            ));
        }
        assert!(matches!(
            read_regular(dir.path(), 10),
            Err(ReadError::NotRegular)
        ));
    }

    #[test]
    fn a_held_write_is_not_abandoned_and_a_released_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let held = write_locked(&path, b"{}").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{}");
        assert!(
            claim_abandoned(&path).unwrap().is_none(),
            "its writer holds it"
        );
        drop(held);
        let claimed = claim_abandoned(&path).unwrap();
        assert!(claimed.is_some(), "its writer let go");
        // While claimed, nobody else can claim it.
        assert!(claim_abandoned(&path).unwrap().is_none());
        drop(claimed);
        assert!(claim_abandoned(&dir.path().join("none")).unwrap().is_none());
    }

    /// A sweeper may take a writer's temporary for debris between its creation and the
    /// writer's lock, remove it and let go before the writer locks: the writer must notice that
    /// its file lost its name rather than fail at the rename. Several processes that open one
    /// store at once (readers that record their loads) do exactly this.
    #[test]
    fn writes_racing_sweeps_of_their_directory_all_succeed() {
        use std::sync::atomic::AtomicBool;
        let dir = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        remove_stale_temporaries(dir.path()).unwrap();
                    }
                });
            }
            let writers: Vec<_> = (0..4)
                .map(|w| {
                    let dir = dir.path();
                    s.spawn(move || {
                        for i in 0..400 {
                            let path = dir.join(format!("{w}-{i}.json"));
                            let held = write_locked(&path, b"{}")
                                .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
                            drop(held);
                            fs::remove_file(&path).unwrap();
                        }
                    })
                })
                .collect();
            let outcomes: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
            stop.store(true, Ordering::Relaxed);
            for outcome in outcomes {
                if let Err(panic) = outcome {
                    std::panic::resume_unwind(panic);
                }
            }
        });
    }

    #[test]
    fn only_temporaries_nobody_holds_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".a.json.1.0.tmp");
        fs::write(&stale, b"half").unwrap();
        let live = dir.path().join(".b.json.1.1.tmp");
        let held = File::create(&live).unwrap();
        held.lock().unwrap();
        fs::write(dir.path().join("a.json"), b"{}").unwrap();
        let removed = remove_stale_temporaries(dir.path()).unwrap();
        assert_eq!(removed, vec![stale]);
        assert!(live.exists() && dir.path().join("a.json").exists());
        drop(held);
        assert_eq!(remove_stale_temporaries(dir.path()).unwrap(), vec![live]);
        assert!(remove_stale_temporaries(&dir.path().join("absent"))
            .unwrap()
            .is_empty());
    }
}
