//! Crash quarantine: a package whose `init` killed the process that loaded it is not loaded
//! again by accident, while the rest of the store keeps working.
//!
//! Before a `Host` opened on a store runs a package's library (`dlopen`, entry
//! point, `init`), it writes one small durable record, `loading/<pid>-<n>.json`, naming the
//! payload digest it is about to run and the process, and keeps an exclusive `flock` on the
//! record from before its name appears until `init` has returned and the record is removed. The
//! kernel drops that lock when the process dies, so a record whose lock can be taken was left by
//! a process that died in between (`guild_adapters_fs::durable_file` says how this stays exact
//! whatever became of the pid, and on any system with `flock`). The next host that opens the
//! store, or refreshes, turns every such record into a quarantine entry,
//! `quarantine/<digest>.json`, and refuses to load that digest while the entry stands;
//! everything else loads. A record whose writer still holds its lock is another runner loading
//! at the same time, and is left alone.
//!
//! The quarantine is keyed by digest, not by package: a new version (another digest) of the
//! package loads at once, and loading it lifts the entries of the package's other digests; the
//! crashed build itself stays refused until `guild quarantine clear ID` (or
//! [`CrashLedger::clear`]) removes its entry. An entry that cannot be read fails closed: the
//! digest its name gives stays refused, with an error naming the file and what is wrong, and
//! `guild quarantine clear ID` removes it when the digest is one of the package's versions.
//!
//! A host reads the quarantine when it opens and at each refresh that loads something
//! (`Quarantine`), not at every load; an entry another process writes is seen at the next
//! refresh.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use guild_adapters_fs::durable_file;
use guild_adapters_posix::termination;
use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::version::Version;
use serde_json::{json, Value};

/// The directory of in-flight load records under a store.
pub const LOADING_DIR: &str = "loading";
/// The directory of quarantine entries under a store.
pub const QUARANTINE_DIR: &str = "quarantine";

/// The most bytes read from a load record or a quarantine entry: a record is a few hundred, so
/// anything near this was not written by a host.
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// One process's load of one package: in flight while it is a record under `loading/`, a crash
/// once it is an entry under `quarantine/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashRecord {
    /// The package.
    pub package: String,
    /// Its version.
    pub version: String,
    /// The payload digest that was being loaded.
    pub digest: Sha256Digest,
    /// The process that loaded it.
    pub pid: u32,
    /// When the load began, in seconds since the Unix epoch.
    pub started: u64,
}

impl CrashRecord {
    /// The record as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "package_id": self.package,
            "version": self.version,
            "payload_sha256": self.digest.to_hex(),
            "pid": self.pid,
            "started_unix": self.started,
            "started": utc(self.started),
        })
    }

    /// The record in `bytes`, or what is wrong with them.
    fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let text = |field: &str| {
            v[field]
                .as_str()
                .ok_or_else(|| format!("field `{field}` is missing or not a string"))
        };
        let number = |field: &str| {
            v[field]
                .as_u64()
                .ok_or_else(|| format!("field `{field}` is missing or not a number"))
        };
        Ok(CrashRecord {
            package: text("package_id")?.to_owned(),
            version: text("version")?.to_owned(),
            digest: Sha256Digest::parse_hex(text("payload_sha256")?)
                .map_err(|e| format!("field `payload_sha256`: {e}"))?,
            pid: u32::try_from(number("pid")?).map_err(|_| "field `pid` is out of range")?,
            started: number("started_unix")?,
        })
    }

    /// One line for people: what crashed, in which process, when.
    pub fn describe(&self) -> String {
        format!(
            "{}@{} (payload {}) is quarantined: process {} died while loading it (init began {})",
            self.package,
            self.version,
            short(&self.digest),
            self.pid,
            utc(self.started)
        )
    }
}

/// One entry under `quarantine/`, as read from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuarantineEntry {
    /// A build whose `init` killed the process that loaded it.
    Crashed(CrashRecord),
    /// An entry that cannot be read (torn, or not a record): the digest its name gives stays
    /// refused all the same.
    Unreadable {
        /// The entry's file.
        path: PathBuf,
        /// The digest its name gives.
        digest: Sha256Digest,
        /// What is wrong with it.
        problem: String,
    },
}

impl QuarantineEntry {
    /// The refused digest.
    pub fn digest(&self) -> &Sha256Digest {
        match self {
            QuarantineEntry::Crashed(r) => &r.digest,
            QuarantineEntry::Unreadable { digest, .. } => digest,
        }
    }

    /// The package, when the entry can be read.
    pub fn package(&self) -> Option<&str> {
        match self {
            QuarantineEntry::Crashed(r) => Some(&r.package),
            QuarantineEntry::Unreadable { .. } => None,
        }
    }

    /// The entry as JSON: a record's fields, or the file and its problem.
    pub fn to_json(&self) -> Value {
        match self {
            QuarantineEntry::Crashed(r) => r.to_json(),
            QuarantineEntry::Unreadable {
                path,
                digest,
                problem,
            } => json!({
                "payload_sha256": digest.to_hex(),
                "unreadable": path.display().to_string(),
                "problem": problem,
            }),
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            QuarantineEntry::Crashed(r) => r.describe(),
            QuarantineEntry::Unreadable {
                path,
                digest,
                problem,
            } => format!(
                "payload {} stays quarantined: its crash quarantine entry {} cannot be read \
                 ({problem})",
                short(digest),
                path.display()
            ),
        }
    }
}

/// A crash ledger operation that failed: what, on which file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", .path.display())]
pub struct LedgerError {
    /// What was being done ("write load record", "read quarantine entry").
    pub what: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The failure.
    #[source]
    pub source: io::Error,
}

fn failed<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> LedgerError + 'p {
    move |source| LedgerError {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn short(d: &Sha256Digest) -> String {
    d.to_hex()[..12].to_owned()
}
/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to a civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The crash records and quarantine entries of one store.
#[derive(Debug, Clone)]
pub struct CrashLedger {
    loading: PathBuf,
    quarantine: PathBuf,
}

/// A load in flight: its record, still locked, is removed when this is dropped (after `init`
/// returned).
#[derive(Debug)]
pub struct Loading {
    path: PathBuf,
    /// The record, watched for termination signals (see
    /// [`guild_adapters_posix::termination`]) until it is removed; `None` when no slot was
    /// free (a signal during the load is then taken for a crash).
    watched: Option<termination::WatchedRecord>,
    /// Holds the record's lock: while it is open, the record's writer is alive.
    _held: fs::File,
}

impl Drop for Loading {
    fn drop(&mut self) {
        // Removed while still locked, so that a sweeper that opened it meanwhile finds it
        // unlinked once it gets the lock. No fsync: a record that survives a crash after init
        // returned would only quarantine a build that did not crash, and the removal of the
        // file is ordered before anything the process does next on this store.
        let _ = fs::remove_file(&self.path);
        // No longer watched before the file is closed (the field drop that follows).
        self.watched = None;
    }
}

/// A load that a signal ended, as its record says (the line [`termination::note_termination`]
/// appends): a routine stop, not a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupted {
    /// The load.
    pub record: CrashRecord,
    /// The signal that ended its process.
    pub signal: i32,
}

/// What [`CrashLedger::sweep`] found among the records of processes that are gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Loads whose process died in them: now quarantined.
    pub crashed: Vec<CrashRecord>,
    /// Loads whose process a signal ended, and said so: removed, nothing quarantined.
    pub interrupted: Vec<Interrupted>,
}

/// A record's bytes: the record (one JSON line) and, when its process noted it, the signal
/// that ended it (a later line `ended by signal N`).
fn split_record(bytes: &[u8]) -> (&[u8], Option<i32>) {
    let Some(end) = bytes.iter().position(|&b| b == b'\n') else {
        return (bytes, None);
    };
    let signal = bytes[end..]
        .split(|&b| b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok())
        .find_map(|line| line.strip_prefix("ended by signal ")?.parse().ok());
    (&bytes[..end], signal)
}

/// The entry name of `digest` under `quarantine/`.
fn entry_name(digest: &Sha256Digest) -> String {
    format!("{}.json", digest.to_hex())
}

impl CrashLedger {
    /// The ledger of the store at `root`.
    pub fn new(root: &Path) -> Self {
        CrashLedger {
            loading: root.join(LOADING_DIR),
            quarantine: root.join(QUARANTINE_DIR),
        }
    }

    /// The directory of in-flight load records.
    pub fn loading_dir(&self) -> &Path {
        &self.loading
    }

    /// Durably records that this process is about to load `digest` (`id@version`), under a lock
    /// the record keeps while the answer lives.
    pub fn begin(
        &self,
        id: &PackageId,
        version: &Version,
        digest: &Sha256Digest,
    ) -> Result<Loading, LedgerError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let record = CrashRecord {
            package: id.to_string(),
            version: version.to_string(),
            digest: *digest,
            pid,
            started: now(),
        };
        ensure_dir(&self.loading)?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = self.loading.join(format!("{pid}-{n}.json"));
        // The termination handlers watch the record before it takes its name: a SIGTERM that
        // arrives once the record can be seen finds it and notes the signal in it.
        let (held, watched) = durable_file::write_locked_then(
            &path,
            record.to_json().to_string().as_bytes(),
            termination::watch_load_record,
        )
        .map_err(failed("write load record", &path))?;
        Ok(Loading {
            path,
            watched,
            _held: held,
        })
    }

    /// The `*.json` files of `dir` (none when it does not exist), sorted.
    fn json_files(dir: &Path) -> Result<Vec<PathBuf>, LedgerError> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(failed("list", dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(failed("list", dir))?;
            let name = entry.file_name();
            let path = entry.path();
            if !durable_file::is_temporary(&name) && path.extension().is_some_and(|e| e == "json") {
                out.push(path);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Turns every load record whose process is gone (its lock can be taken) into a quarantine
    /// entry, durably and before the record is removed, removes the temporaries of writers that
    /// died, and returns the records it quarantined. A record whose process noted that a signal
    /// ended it (a routine stop, see [`guild_adapters_posix::termination`]) quarantines nothing:
    /// it is removed and returned as [`Interrupted`].
    pub fn sweep(&self) -> Result<Swept, LedgerError> {
        let mut found = Swept::default();
        for dir in [&self.loading, &self.quarantine] {
            durable_file::remove_stale_temporaries(dir)
                .map_err(failed("remove stale temporaries in", dir))?;
        }
        for path in Self::json_files(&self.loading)? {
            // A host writes only regular files here: a link, a FIFO or a device is no record
            // (it could name no load) and is left alone, never opened through nor read from.
            match fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => {}
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(failed("inspect load record", &path)(e)),
            }
            let Some(held) =
                durable_file::claim_abandoned(&path).map_err(failed("lock load record", &path))?
            else {
                // Its process is loading right now (or has just removed it).
                continue;
            };
            // Opened without following a link and without blocking; replaced meanwhile by
            // something that is not a regular file, it is left alone all the same.
            if !held
                .metadata()
                .map_err(failed("inspect load record", &path))?
                .is_file()
            {
                continue;
            }
            let mut bytes = Vec::new();
            held.take(MAX_RECORD_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(failed("read load record", &path))?;
            if bytes.len() as u64 > MAX_RECORD_BYTES {
                // Not a host's record either; read no further.
                bytes.clear();
            }
            let (json, signal) = split_record(&bytes);
            let Ok(record) = CrashRecord::from_json(json) else {
                // Records appear under their name only complete (written aside, then renamed),
                // so this is not a load: it names nothing to quarantine.
                fs::remove_file(&path).map_err(failed("remove load record", &path))?;
                continue;
            };
            if let Some(signal) = signal {
                fs::remove_file(&path).map_err(failed("remove load record", &path))?;
                found.interrupted.push(Interrupted { record, signal });
                continue;
            }
            ensure_dir(&self.quarantine)?;
            let entry = self.quarantine.join(entry_name(&record.digest));
            durable_file::write(&entry, record.to_json().to_string().as_bytes())
                .map_err(failed("write quarantine entry", &entry))?;
            fs::remove_file(&path).map_err(failed("remove load record", &path))?;
            found.crashed.push(record);
        }
        Ok(found)
    }

    /// Every quarantine entry, readable or not. A file whose name is not `<digest>.json` is no
    /// entry (it could refuse no digest) and is left out.
    pub fn quarantined(&self) -> Result<Vec<QuarantineEntry>, LedgerError> {
        let mut out = Vec::new();
        for path in Self::json_files(&self.quarantine)? {
            let Some(digest) = path
                .file_stem()
                .and_then(|s| Sha256Digest::parse_hex(&s.to_string_lossy()).ok())
            else {
                continue;
            };
            let problem = match durable_file::read_regular(&path, MAX_RECORD_BYTES) {
                Ok(bytes) => match CrashRecord::from_json(&bytes) {
                    Ok(record) if record.digest == digest => {
                        out.push(QuarantineEntry::Crashed(record));
                        continue;
                    }
                    Ok(record) => format!(
                        "it records payload {}, not the one its name gives",
                        record.digest.to_hex()
                    ),
                    Err(problem) => problem,
                },
                Err(e) => format!("cannot be read: {e}"),
            };
            out.push(QuarantineEntry::Unreadable {
                path,
                digest,
                problem,
            });
        }
        Ok(out)
    }

    /// Removes the entries of package `id` whose digest is not `keep` (all of them when `keep`
    /// is `None`), returning what was removed. An unreadable entry names no package: it is
    /// removed when its digest is among `digests`, the payloads of `id`'s versions.
    pub fn clear(
        &self,
        id: &str,
        digests: &[Sha256Digest],
        keep: Option<&Sha256Digest>,
    ) -> Result<Vec<QuarantineEntry>, LedgerError> {
        let mut removed = Vec::new();
        for entry in self.quarantined()? {
            let ours = match &entry {
                QuarantineEntry::Crashed(r) => r.package == id,
                QuarantineEntry::Unreadable { digest, .. } => digests.contains(digest),
            };
            if ours && Some(entry.digest()) != keep {
                let path = self.quarantine.join(entry_name(entry.digest()));
                fs::remove_file(&path).map_err(failed("remove quarantine entry", &path))?;
                removed.push(entry);
            }
        }
        if !removed.is_empty() {
            durable_file::sync_dir(&self.quarantine).map_err(failed("sync", &self.quarantine))?;
        }
        Ok(removed)
    }
}

/// Creates `dir` if it is absent, durably.
fn ensure_dir(dir: &Path) -> Result<(), LedgerError> {
    match fs::create_dir(dir) {
        Ok(()) => durable_file::sync_dir(dir.parent().unwrap_or(Path::new(".")))
            .map_err(failed("sync the parent of", dir)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(failed("create", dir)(e)),
    }
}

/// A host's view of the quarantine: the ledger, and its entries as last read (when the host
/// opened, or at its last refresh that loaded something).
#[derive(Debug)]
pub struct Quarantine {
    ledger: CrashLedger,
    entries: Mutex<BTreeMap<Sha256Digest, QuarantineEntry>>,
}

impl Quarantine {
    /// Sweeps the ledger of the store at `root` and reads its entries.
    pub fn open(root: &Path) -> Result<Self, LedgerError> {
        let quarantine = Quarantine {
            ledger: CrashLedger::new(root),
            entries: Mutex::new(BTreeMap::new()),
        };
        quarantine.reread()?;
        Ok(quarantine)
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<Sha256Digest, QuarantineEntry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sweeps again and reads what other processes quarantined meanwhile.
    pub fn reread(&self) -> Result<(), LedgerError> {
        self.ledger.sweep()?;
        let read = self.ledger.quarantined()?;
        *self.entries() = read.into_iter().map(|e| (*e.digest(), e)).collect();
        Ok(())
    }

    /// The entries as last read.
    pub fn list(&self) -> Vec<QuarantineEntry> {
        self.entries().values().cloned().collect()
    }

    /// The entry that keeps `digest` from loading, if there is one (the host turns it into its
    /// refusal).
    pub fn refusal(&self, digest: &Sha256Digest) -> Option<QuarantineEntry> {
        self.entries().get(digest).cloned()
    }

    /// [`CrashLedger::begin`].
    pub fn begin(
        &self,
        id: &PackageId,
        version: &Version,
        digest: &Sha256Digest,
    ) -> Result<Loading, LedgerError> {
        self.ledger.begin(id, version, digest)
    }

    /// `digest` of `id` loaded: lifts the entries of `id`'s other builds. Failing to is not
    /// worth failing the load for; the next successful load tries again.
    pub fn loaded(&self, id: &PackageId, digest: &Sha256Digest) {
        let others = self
            .entries()
            .values()
            .any(|e| e.package() == Some(id.as_str()) && e.digest() != digest);
        if !others {
            return;
        }
        if let Ok(removed) = self.ledger.clear(id.as_str(), &[], Some(digest)) {
            let mut entries = self.entries();
            for entry in removed {
                entries.remove(entry.digest());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(b: u8) -> Sha256Digest {
        Sha256Digest::parse_hex(&format!("{b:02x}").repeat(32)).unwrap()
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn record_json(d: u8) -> String {
        CrashRecord {
            package: "ex.a".into(),
            version: "1.0.0".into(),
            digest: digest(d),
            pid: 1,
            started: 0,
        }
        .to_json()
        .to_string()
    }

    /// Runs the ledger's sweep and listing in another thread, giving up after a few seconds (and
    /// then releasing whatever is stuck opening one of `fifos`).
    fn sweep_and_list(
        root: &Path,
        fifos: &[PathBuf],
    ) -> (
        Result<Vec<CrashRecord>, LedgerError>,
        Result<Vec<QuarantineEntry>, LedgerError>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let ledger = CrashLedger::new(root);
        std::thread::spawn(move || {
            let _ = tx.send((ledger.sweep().map(|s| s.crashed), ledger.quarantined()));
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .unwrap_or_else(|_| {
                for fifo in fifos {
                    use std::os::unix::fs::OpenOptionsExt as _;
                    let _ = fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(fifo);
                }
                panic!("the ledger hung on a FIFO");
            })
    }

    #[test]
    fn records_that_are_not_regular_files_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (loading, quarantine) = (
            dir.path().join(LOADING_DIR),
            dir.path().join(QUARANTINE_DIR),
        );
        fs::create_dir(&loading).unwrap();
        fs::create_dir(&quarantine).unwrap();
        // A well-formed record elsewhere, for the links to lead to.
        let elsewhere = dir.path().join("elsewhere.json");
        fs::write(&elsewhere, record_json(4)).unwrap();
        let fifo_entry = quarantine.join(entry_name(&digest(3)));
        let link_entry = quarantine.join(entry_name(&digest(4)));
        let fifo_load = loading.join("7-0.json");
        let link_load = loading.join("7-1.json");
        mkfifo(&fifo_entry);
        mkfifo(&fifo_load);
        std::os::unix::fs::symlink(&elsewhere, &link_entry).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &link_load).unwrap();

        let (swept, listed) = sweep_and_list(dir.path(), &[fifo_entry.clone(), fifo_load.clone()]);
        assert!(swept.unwrap().is_empty(), "neither is a load record");
        let listed = listed.unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        for entry in &listed {
            // Still refusing the digest its name gives, but read from nowhere.
            let QuarantineEntry::Unreadable { problem, .. } = entry else {
                panic!("read through a link or from a FIFO: {entry:?}");
            };
            assert!(problem.contains("not a regular file"), "{problem}");
        }
        for path in [&fifo_entry, &link_entry, &fifo_load, &link_load] {
            assert!(
                fs::symlink_metadata(path).is_ok(),
                "{} was left",
                path.display()
            );
        }
    }

    #[test]
    fn an_oversized_entry_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let quarantine = dir.path().join(QUARANTINE_DIR);
        fs::create_dir(&quarantine).unwrap();
        let entry = quarantine.join(entry_name(&digest(5)));
        let mut bytes = record_json(5).into_bytes();
        // Valid JSON with trailing spaces: only its size is wrong.
        bytes.resize(MAX_RECORD_BYTES as usize + 1, b' ');
        fs::write(&entry, &bytes).unwrap();
        let listed = CrashLedger::new(dir.path()).quarantined().unwrap();
        let [QuarantineEntry::Unreadable { problem, .. }] = &listed[..] else {
            panic!("{listed:?}");
        };
        assert!(problem.contains("larger than"), "{problem}");
    }

    #[test]
    fn utc_renders_civil_time() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_122_800), "2026-12-01T11:00:00Z");
    }

    #[test]
    fn a_live_load_is_not_a_crash_and_a_dead_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = CrashLedger::new(dir.path());
        let (id, v) = (
            PackageId::new("ex.a").unwrap(),
            Version::parse("1.0.0").unwrap(),
        );
        let loading = ledger.begin(&id, &v, &digest(1)).unwrap();
        assert_eq!(
            ledger.sweep().unwrap(),
            Swept::default(),
            "this process is alive"
        );
        drop(loading);
        assert_eq!(
            fs::read_dir(dir.path().join(LOADING_DIR)).unwrap().count(),
            0
        );

        // A record nobody holds (whatever its pid) is a crash, and becomes an entry.
        let gone = CrashRecord {
            package: "ex.a".into(),
            version: "1.0.0".into(),
            digest: digest(2),
            pid: std::process::id(),
            started: 1,
        };
        fs::write(
            dir.path().join(LOADING_DIR).join("1-0.json"),
            gone.to_json().to_string(),
        )
        .unwrap();
        assert_eq!(ledger.sweep().unwrap().crashed, vec![gone.clone()]);
        let entry = QuarantineEntry::Crashed(gone);
        assert_eq!(ledger.quarantined().unwrap(), vec![entry.clone()]);
        assert_eq!(ledger.clear("ex.a", &[], Some(&digest(2))).unwrap(), vec![]);
        assert_eq!(ledger.clear("ex.a", &[], None).unwrap(), vec![entry]);
        assert!(ledger.quarantined().unwrap().is_empty());
    }
}
