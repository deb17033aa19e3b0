//! Crash quarantine: a package whose `init` killed the process that loaded it is not loaded
//! again by accident, while the rest of the store keeps working.
//!
//! Before a [`Host`](crate::Host) opened on a store runs a package's library (`dlopen`, entry
//! point, `init`), it writes one small durable record, `loading/<pid>-<n>.json`, naming the
//! payload digest it is about to run and the process; when `init` returns (whatever it
//! returned) the record is removed. A record left behind by a process that is no longer running
//! means that process died in between. The next host that opens the store turns every such
//! record into a quarantine entry, `quarantine/<digest>.json`, and refuses to load that digest
//! while the entry stands; everything else loads. Records are per process, so that several
//! runner processes on one store never mistake each other's loads for crashes: a record whose
//! process is alive (same pid and start time) is left alone.
//!
//! The quarantine is keyed by digest, not by package: a new version (another digest) of the
//! package loads at once, and loading it lifts the entries of the package's other digests; the
//! crashed build itself stays refused until `guild quarantine clear ID` (or
//! [`CrashLedger::clear`]) removes its entry.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::version::Version;
use serde_json::{json, Value};

/// The directory of in-flight load records under a store.
pub const LOADING_DIR: &str = "loading";
/// The directory of quarantine entries under a store.
pub const QUARANTINE_DIR: &str = "quarantine";

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
    /// The process's start time (clock ticks since boot, from `/proc`), 0 where unknown; with the
    /// pid it tells a live process from a later one that reuses the number.
    pub process_start: u64,
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
            "process_start": self.process_start,
        })
    }

    fn from_json(bytes: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        Some(CrashRecord {
            package: v["package_id"].as_str()?.to_owned(),
            version: v["version"].as_str()?.to_owned(),
            digest: Sha256Digest::parse_hex(v["payload_sha256"].as_str()?).ok()?,
            pid: u32::try_from(v["pid"].as_u64()?).ok()?,
            started: v["started_unix"].as_u64()?,
            process_start: v["process_start"].as_u64().unwrap_or(0),
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

/// This process's start time in clock ticks since boot (`/proc/self/stat` field 22), or 0.
fn start_ticks(pid: u32) -> u64 {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name (field 2) may hold spaces and parentheses; fields resume after the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

/// Whether the process of `record` still runs: its `/proc` entry exists with the same start
/// time. Without `/proc` (not Linux) every record counts as a crash, which can only quarantine
/// too much, never load a crashed build.
fn alive(record: &CrashRecord) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return false;
    }
    let ticks = start_ticks(record.pid);
    // A reused pid has another start time; a vanished one has no entry at all.
    ticks != 0 && (record.process_start == 0 || ticks == record.process_start)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Writes `bytes` to `path` (a fresh name) and makes it durable: the file, then its directory.
fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    // The temporary name is this process's own, so that two sweeping hosts never share one.
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// The crash records and quarantine entries of one store.
#[derive(Debug, Clone)]
pub struct CrashLedger {
    loading: PathBuf,
    quarantine: PathBuf,
}

/// A load in flight: its record is removed when this is dropped (after `init` returned).
#[derive(Debug)]
pub struct Loading {
    path: PathBuf,
}

impl Drop for Loading {
    fn drop(&mut self) {
        // Removing the record needs no fsync: a record that survives a crash after init
        // returned would only quarantine a build that did not crash, and the removal of the
        // file is ordered before anything the process does next on this store.
        let _ = fs::remove_file(&self.path);
    }
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

    /// Durably records that this process is about to load `digest` (`id@version`).
    pub fn begin(
        &self,
        id: &PackageId,
        version: &Version,
        digest: &Sha256Digest,
    ) -> io::Result<Loading> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let record = CrashRecord {
            package: id.to_string(),
            version: version.to_string(),
            digest: *digest,
            pid,
            started: now(),
            process_start: start_ticks(pid),
        };
        let created = !self.loading.exists();
        fs::create_dir_all(&self.loading)?;
        if created {
            sync_dir(self.loading.parent().unwrap_or(Path::new(".")))?;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = self.loading.join(format!("{pid}-{n}.json"));
        write_durably(&path, record.to_json().to_string().as_bytes())?;
        Ok(Loading { path })
    }

    fn read_dir(dir: &Path) -> io::Result<Vec<(PathBuf, Option<CrashRecord>)>> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json") {
                let record = fs::read(&path)
                    .ok()
                    .and_then(|b| CrashRecord::from_json(&b));
                out.push((path, record));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Turns every load record left by a process that no longer runs into a quarantine entry
    /// (durably, before the record is removed) and returns the records it quarantined.
    pub fn sweep(&self) -> io::Result<Vec<CrashRecord>> {
        let mut found = Vec::new();
        for (path, record) in Self::read_dir(&self.loading)? {
            let Some(record) = record else {
                // A record torn by the crash itself names nothing to quarantine.
                let _ = fs::remove_file(&path);
                continue;
            };
            if alive(&record) {
                continue;
            }
            fs::create_dir_all(&self.quarantine)?;
            let entry = self
                .quarantine
                .join(format!("{}.json", record.digest.to_hex()));
            write_durably(&entry, record.to_json().to_string().as_bytes())?;
            // Another host opening the store at the same time may have swept it first.
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => found.push(record),
            }
        }
        Ok(found)
    }

    /// Every quarantine entry.
    pub fn quarantined(&self) -> io::Result<Vec<CrashRecord>> {
        Ok(Self::read_dir(&self.quarantine)?
            .into_iter()
            .filter_map(|(_, r)| r)
            .collect())
    }

    /// The quarantine entry of `digest`, if it has one.
    pub fn entry(&self, digest: &Sha256Digest) -> Option<CrashRecord> {
        let path = self.quarantine.join(format!("{}.json", digest.to_hex()));
        fs::read(path).ok().and_then(|b| CrashRecord::from_json(&b))
    }

    /// Removes the entries of `id` whose digest is not `keep` (all of them when `keep` is
    /// `None`), returning what was removed.
    pub fn clear(&self, id: &str, keep: Option<&Sha256Digest>) -> io::Result<Vec<CrashRecord>> {
        let mut removed = Vec::new();
        for (path, record) in Self::read_dir(&self.quarantine)? {
            if let Some(r) = record.filter(|r| r.package == id && Some(&r.digest) != keep) {
                fs::remove_file(&path)?;
                removed.push(r);
            }
        }
        if !removed.is_empty() {
            sync_dir(&self.quarantine)?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(b: u8) -> Sha256Digest {
        Sha256Digest::parse_hex(&format!("{b:02x}").repeat(32)).unwrap()
    }

    #[test]
    fn utc_renders_civil_time() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_122_800), "2026-12-01T11:00:00Z");
    }

    #[test]
    fn a_live_load_is_not_a_crash_and_a_dead_one_is() {
        let dir = std::env::temp_dir().join(format!("guild-crash-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let ledger = CrashLedger::new(&dir);
        let (id, v) = (
            PackageId::new("ex.a").unwrap(),
            Version::parse("1.0.0").unwrap(),
        );
        let loading = ledger.begin(&id, &v, &digest(1)).unwrap();
        assert!(ledger.sweep().unwrap().is_empty(), "this process is alive");
        drop(loading);
        assert_eq!(fs::read_dir(dir.join(LOADING_DIR)).unwrap().count(), 0);

        // A record of a process that is gone (pid beyond pid_max) becomes an entry.
        let gone = CrashRecord {
            package: "ex.a".into(),
            version: "1.0.0".into(),
            digest: digest(2),
            pid: 4_999_999,
            started: 1,
            process_start: 7,
        };
        fs::write(
            dir.join(LOADING_DIR).join("4999999-0.json"),
            gone.to_json().to_string(),
        )
        .unwrap();
        assert_eq!(ledger.sweep().unwrap(), vec![gone.clone()]);
        assert_eq!(ledger.entry(&digest(2)), Some(gone.clone()));
        assert_eq!(ledger.clear("ex.a", Some(&digest(2))).unwrap(), vec![]);
        assert_eq!(ledger.clear("ex.a", None).unwrap(), vec![gone]);
        assert!(ledger.quarantined().unwrap().is_empty());
        let _ = fs::remove_dir_all(&dir);
    }
}
