//! The durable package store on a local file system: [`FsStore`], the adapter behind the
//! [`PackageStore`] port.
//!
//! Layout of a store directory (see [`StoreLayout`]):
//!
//! ```text
//! lock                     advisory lock; held by a writer (for its life, or one transaction)
//! registry.json            the checkpoint: the registry (StoreState) at some generation
//! registry.log             one frame per commit after it; appending one is the commit point
//! trust                    the trust bytes, opaque to the store, replaced atomically
//! trust.next               new trust bytes of a commit in flight (finished or dropped by recovery)
//! journal/<gen>.intent     the record of a transaction in flight
//! staging/<n>/             trees being extracted; cleared by recovery
//! packages/<id>/<version>/ installed trees, read-only
//! pins/<id>@<version>      shared locks of the processes that have the version loaded
//! sweep.pending            packages/ may hold trees to delete that no journal record names
//! ```
//!
//! A *writer* handle ([`FsStore::open`]) takes the lock (or fails with `Locked`) and recovers
//! before anything else; the `recovery` module says what that means and the `commit` module
//! lists the durable steps in order. A *reader* handle ([`StoreOptions::reader`]) takes no lock
//! and writes nothing but its own pins: it reads the last committed generation (the checkpoint
//! and the complete frames after it, as the `log` module describes; the trust bytes of a commit
//! whose rename of `trust.next` is still to come are found by the digest the state records), so a pending transaction is invisible to it and
//! its recovery is left to the next writer. A reader takes the lock only for the transactions it
//! makes itself. The `pins` module says how loaded versions are kept from deletion. A
//! [`Fault`] in [`StoreOptions`] makes one numbered step fail or "crash", which is how the crash
//! matrix proves that every interruption leaves the before-state or the after-state.

mod commit;
mod durable;
mod journal;
mod log;
mod pins;
mod recovery;
pub mod testing;
mod watch;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use guild_domain::graph::NodeRef;
use guild_domain::ids::PackageId;
use guild_domain::ids::Sha256Digest;
use guild_domain::store_state::listing::Listing;
use guild_domain::store_state::StoreState;
use guild_domain::version::Version;
use guild_ports::store::{
    Committed, PackageStore, PinHolder, RecoveryReport, StoreError, StoreErrorKind, StorePin,
    Transaction, VersionPins,
};

pub use durable::{Fault, FaultMode, OpStats};
pub use journal::{JournalDecodeError, JOURNAL_FORMAT_V1};
pub use log::{reads_in_parts, LogCorruption, LogProblem};
pub use watch::StoreWatcher;

use commit::{is_crash, is_staging_entry, Failure};
use durable::{io_error, remove_tree, Run};
use log::DiskInfo;
use recovery::Sweep;

/// The most bytes a reader takes from `registry.json`, and from `registry.log`: far more than a
/// store ever holds (a compaction keeps the log near a sixteenth of the checkpoint, or 64 KiB),
/// and a bound on what a damaged or planted file can make any reader hold.
pub(crate) const MAX_REGISTRY_BYTES: u64 = 1 << 30;
/// The most bytes a reader takes from `trust` or `trust.next`.
pub(crate) const MAX_TRUST_BYTES: u64 = 64 << 20;
/// The most bytes a reader takes from a journal record.
pub(crate) const MAX_RECORD_BYTES: u64 = 16 << 20;

/// Where each part of a store lives under its root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLayout {
    pub root: PathBuf,
    pub lock: PathBuf,
    /// The checkpoint: the whole registry at some generation (the whole registry, in a format-1
    /// store that has no log yet).
    pub registry: PathBuf,
    pub registry_tmp: PathBuf,
    /// The registry log: one frame per commit after the checkpoint. Appending a frame and
    /// fdatasyncing it is the commit point.
    pub log: PathBuf,
    pub log_tmp: PathBuf,
    pub trust: PathBuf,
    pub trust_tmp: PathBuf,
    /// The new trust bytes of a transaction, renamed over `trust` after its commit point.
    pub trust_next: PathBuf,
    pub journal: PathBuf,
    pub staging: PathBuf,
    pub packages: PathBuf,
    /// One lock file per pinned version ([`FsStore`]'s `pin`).
    pub pins: PathBuf,
    /// Present while `packages/` may hold trees the registry does not install that no journal
    /// record names: a recovery kept some (pinned, unchecked or unaccounted) or a commit could
    /// not delete them. Opening the store lists `packages/` only while it or a journal record
    /// is there.
    pub sweep_marker: PathBuf,
}

impl StoreLayout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        StoreLayout {
            lock: root.join("lock"),
            registry: root.join("registry.json"),
            registry_tmp: root.join("registry.json.tmp"),
            log: root.join("registry.log"),
            log_tmp: root.join("registry.log.tmp"),
            trust: root.join("trust"),
            trust_tmp: root.join("trust.tmp"),
            trust_next: root.join("trust.next"),
            journal: root.join("journal"),
            staging: root.join("staging"),
            packages: root.join("packages"),
            pins: root.join("pins"),
            sweep_marker: root.join("sweep.pending"),
            root,
        }
    }

    /// The installed tree of `id@version`: `packages/<id>/<version>`. Both names are safe as
    /// path components: the id grammar allows only `[a-z0-9_.-]` with no empty segment, and a
    /// semantic version only `[0-9A-Za-z.+-]`.
    pub fn package_dir(&self, id: &PackageId, version: &Version) -> PathBuf {
        self.packages.join(id.as_str()).join(version.to_string())
    }

    /// Where the installed tree of `id@version` waits while the replacement whose staged tree
    /// is named `staged` is in flight: `packages/<id>/<version>~replaced-<staged>`. A semantic
    /// version never contains `~`, so the name cannot be another version's; and it names the
    /// transaction, whose journal record holds the staged name, so that recovery puts back
    /// only the tree that the interrupted transaction moved aside.
    pub fn replaced_dir(&self, id: &PackageId, version: &Version, staged: &str) -> PathBuf {
        self.packages
            .join(id.as_str())
            .join(format!("{version}~replaced-{staged}"))
    }
}

/// How to open a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// A fault to inject at one step of the next durable operation that reaches it (a commit or
    /// a trust write; recovery's own steps are never faulted). It fires once.
    pub fault: Option<Fault>,
    /// How long to wait for the store's lock before failing with `Locked`. A short wait rides
    /// out a lock that is only held by a forked child between `fork` and `exec` (the lock lives
    /// on the open file, which a child inherits until it execs); a real second user still fails.
    pub lock_wait: Duration,
    /// Open as a reader: no lock, no recovery, the last committed generation; the lock is taken
    /// only for a transaction this handle makes.
    pub reader: bool,
    /// Compact the registry log after a commit that leaves more than this many bytes of frames
    /// in it. `None`, the default: when the frames outgrow the checkpoint (and 64 KiB), so that
    /// rewriting the checkpoint costs, spread over the commits, a constant per commit. Tests set
    /// 0 to compact after every commit.
    pub compact_log_over: Option<u64>,
    /// Have the writer's recovery list every package tree, as an explicit recovery does
    /// (`guild recover`); otherwise it does only when a change was in flight or an earlier
    /// recovery kept trees (the `recovery` module says when).
    pub sweep: bool,
}

impl StoreOptions {
    /// The default lock wait.
    pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(2);

    /// No fault, the default lock wait.
    pub fn new() -> Self {
        StoreOptions {
            fault: None,
            lock_wait: Self::DEFAULT_LOCK_WAIT,
            reader: false,
            compact_log_over: None,
            sweep: false,
        }
    }

    /// Sweeping every package tree at opening (see [`StoreOptions::sweep`]).
    pub fn sweep(mut self) -> Self {
        self.sweep = true;
        self
    }

    /// Compacting the log once its frames pass `bytes` (see [`StoreOptions::compact_log_over`]).
    pub fn compact_log_over(mut self, bytes: u64) -> Self {
        self.compact_log_over = Some(bytes);
        self
    }

    /// As a reader (see [`StoreOptions::reader`]).
    pub fn reader(mut self) -> Self {
        self.reader = true;
        self
    }

    /// With a fault plan.
    pub fn with_fault(mut self, fault: Option<Fault>) -> Self {
        self.fault = fault;
        self
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// The file-system package store. At most one writer handle per store directory at a time,
/// across processes (it holds an advisory lock until it is dropped), and any number of reader
/// handles beside it.
#[derive(Debug)]
pub struct FsStore {
    layout: StoreLayout,
    /// A writer holds the lock on this open file for its life; a reader only while
    /// `Inner::writing` is above zero. Dropping the handle releases it.
    lock: File,
    reader: bool,
    lock_wait: Duration,
    compact_log_over: Option<u64>,
    /// What of the registry this handle reads: all of it, or (a reader that cannot write) one
    /// package or the listing.
    view: View,
    inner: Mutex<Inner>,
}

/// What of the registry a handle reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum View {
    /// All of it.
    Whole,
    /// The store-wide facts and one package ([`FsStore::open_package_reader`]).
    Package(PackageId),
    /// The store-wide facts and the listing ([`FsStore::open_listing_reader`]).
    Listing,
}

impl View {
    fn part(&self) -> log::Part<'_> {
        match self {
            View::Whole => log::Part::Whole,
            View::Package(id) => log::Part::Package(id),
            View::Listing => log::Part::Listing,
        }
    }
}

#[derive(Debug)]
struct Inner {
    registry: StoreState,
    /// The listing of a handle opened for it ([`View::Listing`]).
    listing: Option<Listing>,
    /// The registry files' sizes: where the next frame goes, and when to compact.
    disk: DiskInfo,
    /// The committed trust bytes. Kept here, like the registry, so that a commit whose rename of
    /// `trust.next` failed after the commit point still answers the bytes it committed.
    trust: Option<Vec<u8>>,
    poisoned: bool,
    fault: Option<Fault>,
    /// Staging entries handed out and not yet committed or discarded; a runtime recovery keeps
    /// them.
    issued: BTreeSet<OsString>,
    last_op: OpStats,
    total_fsyncs: u64,
    /// A reader's nesting of `begin_write`; it holds the lock while this is above zero.
    writing: u32,
}

impl FsStore {
    /// Opens (creating if needed) the store at `root`, takes its lock and recovers it.
    pub fn open(root: impl Into<PathBuf>) -> Result<(FsStore, RecoveryReport), StoreError> {
        Self::open_with(root, StoreOptions::default())
    }

    /// [`FsStore::open`] with options.
    pub fn open_with(
        root: impl Into<PathBuf>,
        options: StoreOptions,
    ) -> Result<(FsStore, RecoveryReport), StoreError> {
        Self::open_as(root, options, View::Whole)
    }

    /// A reader of package `id` alone (`guild status ID`): as [`StoreOptions::reader`], but its
    /// registry holds `id`'s record (when the store records it) and the store-wide facts
    /// (generation, trust anchor, fleet), and no other package: the other records in the
    /// checkpoint and the log are passed over, not decoded, so that opening costs a scan of the
    /// registry files and not a decode of the store. Every frame's checksum and generation is
    /// still checked; inside the records passed over only the JSON grammar is
    /// ([`StoreState::from_any_json_only`] says why that is enough for a reader). It cannot
    /// write or recover the store. A store that has never been written is created and recovered
    /// as a reader's opening does, and then holds every package.
    pub fn open_package_reader(
        root: impl Into<PathBuf>,
        id: &PackageId,
    ) -> Result<(FsStore, RecoveryReport), StoreError> {
        Self::open_as(
            root,
            StoreOptions::new().reader(),
            View::Package(id.clone()),
        )
    }

    /// A reader of the listing (`guild list`): as [`StoreOptions::reader`], but its registry
    /// holds the store-wide facts (generation, trust anchor, fleet) and no package, and
    /// [`PackageStore::listing`] answers the row of every package. A checkpoint with an index
    /// (format 3) is read up to its index, not record by record; the log's frames are decoded
    /// in full and make the rows of the packages they change. Nothing else is read, so damage
    /// inside the checkpoint's records is found by the next full reader, not by this one
    /// ([`guild_domain::store_state::listing`]). It cannot write or recover the store. A store that has
    /// never been written is created and recovered as a reader's opening does.
    pub fn open_listing_reader(
        root: impl Into<PathBuf>,
    ) -> Result<(FsStore, RecoveryReport), StoreError> {
        Self::open_as(root, StoreOptions::new().reader(), View::Listing)
    }

    fn open_as(
        root: impl Into<PathBuf>,
        options: StoreOptions,
        view: View,
    ) -> Result<(FsStore, RecoveryReport), StoreError> {
        let layout = StoreLayout::new(root);
        let mut run = Run::new(None);
        create_root(&layout.root, &mut run)?;
        let lock = open_lock(&layout.lock)?;
        let view = if options.reader { view } else { View::Whole };
        let mut listing = None;
        let recovered = if options.reader && layout.registry.exists() {
            let snapshot = read_snapshot(&layout, view.part())?;
            listing = snapshot.listing;
            recovery::Recovered {
                report: RecoveryReport {
                    generation: snapshot.registry.generation(),
                    ..RecoveryReport::default()
                },
                registry: snapshot.registry,
                info: snapshot.info,
                trust: snapshot.trust,
            }
        } else {
            // A writer recovers; so does a reader of a store that was never written, once, to
            // create it.
            lock_with_wait(&lock, &layout.lock, options.lock_wait)?;
            let sweep = if options.sweep {
                Sweep::Always
            } else {
                Sweep::WhenNeeded
            };
            let recovered = recovery::recover(&layout, &BTreeSet::new(), sweep, &mut run);
            if options.reader {
                let _ = lock.unlock();
            }
            recovered?
        };
        let store = FsStore {
            layout,
            lock,
            reader: options.reader,
            lock_wait: options.lock_wait,
            compact_log_over: options.compact_log_over,
            inner: Mutex::new(Inner {
                // A store created by this opening is read whole: make its listing.
                listing: match (&view, listing) {
                    (View::Listing, None) => Some(Listing::of(&recovered.registry)),
                    (_, listing) => listing,
                },
                registry: if view == View::Listing {
                    recovered.registry.facts_only()
                } else {
                    recovered.registry
                },
                disk: recovered.info,
                trust: recovered.trust,
                poisoned: false,
                fault: options.fault,
                issued: BTreeSet::new(),
                total_fsyncs: u64::from(run.stats.fsyncs),
                last_op: run.stats,
                writing: 0,
            }),
            view,
        };
        Ok((store, recovered.report))
    }

    /// Runs `op` as one write: a reader takes the lock (and catches up with the disk) around it.
    fn write<T>(
        &self,
        op: impl FnOnce(&mut MutexGuard<'_, Inner>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.begin_write()?;
        let result = self.usable().and_then(|mut inner| op(&mut inner));
        self.end_write();
        result
    }

    pub fn layout(&self) -> &StoreLayout {
        &self.layout
    }

    /// The steps and fsyncs of the last durable operation (commit, trust write or recovery).
    pub fn last_op(&self) -> OpStats {
        self.lock_inner()
            .map(|inner| inner.last_op.clone())
            .unwrap_or_default()
    }

    /// Every fsync this handle has made.
    pub fn total_fsyncs(&self) -> u64 {
        self.lock_inner()
            .map(|inner| inner.total_fsyncs)
            .unwrap_or_default()
    }

    /// Refuses `action` on a reader of one package ([`FsStore::open_package_reader`]) or of
    /// the listing ([`FsStore::open_listing_reader`]): its registry is not the whole state, so
    /// nothing may be written or recovered from it.
    fn refuse_if_one_package(&self, action: &str) -> Result<(), StoreError> {
        let opened = match &self.view {
            View::Whole => return Ok(()),
            View::Package(id) => format!("package {id} alone"),
            View::Listing => "the listing alone".to_owned(),
        };
        Err(StoreError::new(
            StoreErrorKind::InvalidTransaction,
            format!(
                "a reader opened for {opened} cannot {action} the store; open it as a reader or \
                 writer of every package"
            ),
        )
        .at(self.layout.root.clone()))
    }

    /// The inner state, refusing if an earlier failure poisoned the handle.
    fn usable(&self) -> Result<MutexGuard<'_, Inner>, StoreError> {
        let inner = self.lock_inner()?;
        if inner.poisoned {
            return Err(StoreError::new(
                StoreErrorKind::Poisoned,
                "an earlier failure left this handle unsure of the disk; open the store again",
            )
            .at(self.layout.root.clone()));
        }
        Ok(inner)
    }

    fn lock_inner(&self) -> Result<MutexGuard<'_, Inner>, StoreError> {
        self.inner.lock().map_err(|_| {
            StoreError::new(
                StoreErrorKind::Poisoned,
                "a thread panicked while using the store",
            )
            .at(self.layout.root.clone())
        })
    }
}

/// Runs one durable operation with the armed fault, records its statistics, and poisons the
/// handle if the operation says it must.
fn with_run<T>(
    inner: &mut Inner,
    op: impl FnOnce(&mut Run) -> Result<T, Failure>,
) -> Result<T, StoreError> {
    let mut run = Run::new(inner.fault.take());
    let result = op(&mut run);
    inner.fault = run.unfired();
    inner.total_fsyncs += u64::from(run.stats.fsyncs);
    inner.last_op = run.stats;
    result.map_err(|failure| match failure {
        Failure::Failed(e) => e,
        Failure::Poisoned(e) | Failure::Crashed(e) => {
            inner.poisoned = true;
            e
        }
    })
}

impl PackageStore for FsStore {
    fn registry(&self) -> Result<StoreState, StoreError> {
        Ok(self.usable()?.registry.clone())
    }

    fn listing(&self) -> Result<Listing, StoreError> {
        let inner = self.usable()?;
        Ok(match &inner.listing {
            Some(listing) => listing.clone(),
            None => Listing::of(&inner.registry),
        })
    }

    fn records_packages(&self) -> Result<bool, StoreError> {
        let inner = self.usable()?;
        Ok(match &inner.listing {
            Some(listing) => !listing.is_empty(),
            None => inner.registry.packages().next().is_some(),
        })
    }

    fn new_staging_dir(&self) -> Result<PathBuf, StoreError> {
        let mut inner = self.usable()?;
        loop {
            // Names are never reused within a process (pid, a process-wide counter, the time):
            // a loader may open a library from a staging tree, and the dynamic linker recognises
            // an already-loaded library by its path, so a reused path could hand back the code of
            // an earlier package instead of the bytes that were just verified.
            let name = OsString::from(format!(
                "{}-{:x}-{:x}",
                std::process::id(),
                STAGING_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            let path = self.layout.staging.join(&name);
            match fs::symlink_metadata(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    inner.issued.insert(name);
                    return Ok(path);
                }
                Err(e) => return Err(io_error("inspect staging entry", &path, e)),
                Ok(_) => continue,
            }
        }
    }

    fn discard_staging(&self, staged: &Path) -> Result<(), StoreError> {
        let mut inner = self.usable()?;
        if !is_staging_entry(&self.layout.staging, staged) {
            return Err(StoreError::new(
                StoreErrorKind::InvalidTransaction,
                "only an entry of the staging area can be discarded",
            )
            .at(staged.to_path_buf()));
        }
        remove_tree(staged).map_err(|e| io_error("discard staged tree", staged, e))?;
        if let Some(name) = staged.file_name() {
            inner.issued.remove(name);
        }
        Ok(())
    }

    fn commit(&self, tx: Transaction) -> Result<Committed, StoreError> {
        self.write(|inner| self.commit_locked(inner, tx))
    }

    fn package_dir(&self, id: &PackageId, version: &Version) -> PathBuf {
        self.layout.package_dir(id, version)
    }

    fn read_trust(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.usable()?.trust.clone())
    }

    fn trust_path(&self) -> PathBuf {
        self.layout.trust.clone()
    }

    fn write_trust(&self, bytes: &[u8]) -> Result<(), StoreError> {
        self.write(|inner| self.write_trust_locked(inner, bytes))
    }

    fn recover(&self) -> Result<RecoveryReport, StoreError> {
        self.refuse_if_one_package("recover")?;
        let mut inner = self.usable()?;
        if !self.reader || inner.writing > 0 {
            return self.recover_locked(&mut inner, Sweep::Always);
        }
        // A reader takes the lock for this one recovery (`begin_write` would recover first and
        // leave this report empty).
        lock_with_wait(&self.lock, &self.layout.lock, self.lock_wait)?;
        let report = self.recover_locked(&mut inner, Sweep::Always);
        let _ = self.lock.unlock();
        report
    }

    fn is_reader(&self) -> bool {
        self.reader
    }

    fn refresh(&self) -> Result<u64, StoreError> {
        let mut inner = self.usable()?;
        if self.reader && inner.writing == 0 {
            let snapshot = read_snapshot(&self.layout, self.view.part())?;
            inner.registry = snapshot.registry;
            inner.listing = snapshot.listing;
            inner.disk = snapshot.info;
            inner.trust = snapshot.trust;
        }
        Ok(inner.registry.generation())
    }

    fn begin_write(&self) -> Result<(), StoreError> {
        if !self.reader {
            return Ok(());
        }
        self.refuse_if_one_package("write")?;
        let mut inner = self.usable()?;
        if inner.writing == 0 {
            lock_with_wait(&self.lock, &self.layout.lock, self.lock_wait)?;
            // Whatever a writer that died left is finished or undone before this one starts,
            // and the view moves to what is now committed.
            if let Err(e) = self.recover_locked(&mut inner, Sweep::WhenNeeded) {
                let _ = self.lock.unlock();
                return Err(e);
            }
        }
        inner.writing += 1;
        Ok(())
    }

    fn end_write(&self) {
        if !self.reader {
            return;
        }
        let mut inner = match self.inner.lock() {
            Ok(inner) => inner,
            Err(poisoned) => poisoned.into_inner(),
        };
        if inner.writing > 0 {
            inner.writing -= 1;
            if inner.writing == 0 {
                let _ = self.lock.unlock();
            }
        }
    }

    fn pin(&self, id: &PackageId, version: &Version) -> Result<StorePin, StoreError> {
        let file = pins::take_shared(&self.layout, id, version)?;
        // From here no writer deletes the version's files; they are there only if what is
        // committed now installs the version. The disk decides, not this handle's view, which
        // may be older than a removal.
        let refusal = match read_committed(&self.layout, log::Part::Whole) {
            Ok(Some(snapshot)) => not_installed(&snapshot.registry, id, version),
            Ok(None) => Some(
                StoreError::new(
                    StoreErrorKind::NotInstalled,
                    format!("{id}@{version} is not installed: the store has no registry"),
                )
                .at(self.layout.registry.clone()),
            ),
            Err(e) => Some(e),
        };
        match refusal {
            None => Ok(StorePin::holding(Box::new(file))),
            Some(e) => {
                pins::give_back(&self.layout, id, version, file);
                Err(e)
            }
        }
    }

    fn pin_installing(&self, id: &PackageId, version: &Version) -> Result<StorePin, StoreError> {
        if self.reader && self.usable()?.writing == 0 {
            return Err(StoreError::new(
                StoreErrorKind::InvalidTransaction,
                format!(
                    "{id}@{version} can be pinned before it is installed only inside the \
                     transaction that installs it"
                ),
            )
            .at(pins::pin_path(
                &self.layout,
                id.as_str(),
                &version.to_string(),
            )));
        }
        let file = pins::take_shared(&self.layout, id, version)?;
        Ok(StorePin::holding(Box::new(file)))
    }

    fn pins(&self) -> Result<Vec<VersionPins>, StoreError> {
        pins::list(&self.layout, None)
    }
}

impl FsStore {
    fn commit_locked(&self, inner: &mut Inner, tx: Transaction) -> Result<Committed, StoreError> {
        let staged: Vec<PathBuf> = tx
            .installs
            .iter()
            .map(|i| i.staged.clone())
            .filter(|p| is_staging_entry(&self.layout.staging, p))
            .collect();
        for name in staged.iter().filter_map(|p| p.file_name()) {
            // Whatever happens next, the commit consumes the staged trees.
            inner.issued.remove(name);
        }
        // The transaction never started: the staged trees are all there is to tidy, and
        // recovery removes them if this fails.
        let discard_staged = || {
            for tree in &staged {
                let _ = remove_tree(tree);
            }
        };
        let plan = match commit::plan(&self.layout, &inner.registry, inner.disk, tx) {
            Ok(plan) => plan,
            Err(e) => {
                discard_staged();
                return Err(e);
            }
        };
        // The versions whose files go are held against new pins from here to their deletion;
        // a version that a live process pins refuses the whole transaction.
        // A version whose pin cannot be checked refuses it too, saying why.
        let mut holds = Vec::new();
        for (node, _) in &plan.delete {
            match pins::hold_for_delete(&self.layout, node.id.as_str(), &node.version.to_string()) {
                Ok(hold) => holds.push(hold),
                Err(refusal) => {
                    discard_staged();
                    return Err(self.refused(node, refusal));
                }
            }
        }
        // An install that deletes a tree of its own version (the one it replaces, or garbage at
        // its destination) holds that version's pin the same way.
        let mut install_holds = Vec::with_capacity(plan.installs.len());
        for ins in &plan.installs {
            let deletes = match ins.deletes_a_tree() {
                Ok(deletes) => deletes,
                Err(e) => {
                    discard_staged();
                    return Err(io_error("inspect package directory", &ins.dest, e));
                }
            };
            if !deletes {
                install_holds.push(None);
                continue;
            }
            let node = &ins.node;
            match pins::hold_for_delete(&self.layout, node.id.as_str(), &node.version.to_string()) {
                Ok(hold) => install_holds.push(Some(hold)),
                Err(refusal) => {
                    discard_staged();
                    return Err(self.refused(node, refusal));
                }
            }
        }
        let (committed, disk) = with_run(inner, |run| {
            commit::apply(
                &self.layout,
                run,
                &plan,
                holds,
                install_holds,
                self.compact_log_over,
            )
        })?;
        inner.registry = plan.new_state;
        inner.disk = disk;
        if let Some(trust) = plan.trust {
            inner.trust = Some(trust);
        }
        Ok(committed)
    }

    /// The error of a transaction that the pin of `node` refused.
    fn refused(&self, node: &NodeRef, refusal: pins::Refusal) -> StoreError {
        match refusal {
            pins::Refusal::Pinned(holders) => pinned_error(&self.layout, node, holders),
            pins::Refusal::Unknown(e) => e,
        }
    }

    fn write_trust_locked(&self, inner: &mut Inner, bytes: &[u8]) -> Result<(), StoreError> {
        let layout = &self.layout;
        let previous = read_optional(&layout.trust)?;
        let written = with_run(inner, |run| {
            let (tmp, target) = (&layout.trust_tmp, &layout.trust);
            let before_rename = run
                .write_file("write trust file", tmp, bytes)
                .and_then(|()| run.fsync("fsync trust file", tmp))
                .and_then(|()| run.rename("rename trust file", tmp, target));
            if let Err(e) = before_rename {
                if is_crash(&e) {
                    return Err(Failure::Crashed(e));
                }
                return Err(match durable::remove_file_if_present(tmp) {
                    Ok(_) => Failure::Failed(e),
                    Err(_) => Failure::Poisoned(e),
                });
            }
            match run.fsync("fsync store directory", &layout.root) {
                Ok(()) => Ok(()),
                Err(e) if is_crash(&e) => Err(Failure::Crashed(e)),
                // The new bytes are visible but perhaps not durable: put the old ones back so
                // that the answer "failed" is true.
                Err(e) => Err(match restore_file(run, layout, tmp, target, &previous) {
                    Ok(()) => Failure::Failed(e),
                    Err(_) => Failure::Poisoned(e),
                }),
            }
        });
        if written.is_ok() {
            inner.trust = Some(bytes.to_vec());
        }
        written
    }

    fn recover_locked(
        &self,
        inner: &mut Inner,
        sweep: Sweep,
    ) -> Result<RecoveryReport, StoreError> {
        let issued = inner.issued.clone();
        let mut run = Run::new(None);
        let recovered = recovery::recover(&self.layout, &issued, sweep, &mut run);
        inner.total_fsyncs += u64::from(run.stats.fsyncs);
        inner.last_op = run.stats;
        let recovered = recovered?;
        inner.registry = recovered.registry;
        inner.disk = recovered.info;
        inner.trust = recovered.trust;
        Ok(recovered.report)
    }
}

/// Why `id@version` cannot be pinned with `registry` committed, or `None` if it is installed.
fn not_installed(registry: &StoreState, id: &PackageId, version: &Version) -> Option<StoreError> {
    if registry.is_installed(id, version) {
        return None;
    }
    let how = match registry.record(id, version) {
        Some(_) => "removed",
        None => "not recorded",
    };
    Some(StoreError::new(
        StoreErrorKind::NotInstalled,
        format!(
            "{id}@{version} is {how} in the committed registry (generation {}); its files cannot \
             be pinned",
            registry.generation()
        ),
    ))
}

/// The refusal of a transaction that would delete `node`'s files while `holders` pin them.
fn pinned_error(layout: &StoreLayout, node: &NodeRef, holders: Vec<PinHolder>) -> StoreError {
    let names: Vec<String> = holders.iter().map(ToString::to_string).collect();
    let by = if names.is_empty() {
        "another process".to_owned()
    } else {
        names.join(", ")
    };
    StoreError::new(
        StoreErrorKind::Pinned,
        format!("{node} is loaded by {by}; its files cannot be deleted until it lets go"),
    )
    .at(pins::pin_path(
        layout,
        node.id.as_str(),
        &node.version.to_string(),
    ))
    .held_by(holders)
}

/// One committed generation as a reader sees it.
struct Snapshot {
    registry: StoreState,
    listing: Option<Listing>,
    info: DiskInfo,
    trust: Option<Vec<u8>>,
}

/// How often a reader reads again when a writer committed while it was reading.
const SNAPSHOT_ATTEMPTS: usize = 64;

/// Which files the registry is made of right now: the checkpoint's and the log's inode and
/// length. An append changes the log's length, a compaction or migration an inode.
fn registry_files(layout: &StoreLayout) -> Result<[Option<(u64, u64)>; 2], StoreError> {
    let identity = |path: &Path| match fs::symlink_metadata(path) {
        Ok(m) => {
            #[cfg(unix)]
            let ino = std::os::unix::fs::MetadataExt::ino(&m);
            #[cfg(not(unix))]
            let ino = 0;
            Ok(Some((ino, m.len())))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("inspect registry file", path, e)),
    };
    Ok([identity(&layout.registry)?, identity(&layout.log)?])
}

/// Reads the last committed generation without the lock: the checkpoint and the log, then the
/// trust bytes the state records (from `trust.next` while a commit's rename of it is still to
/// come); if the registry files changed meanwhile, everything is read again. `None` when the
/// store has no registry.
fn read_committed(
    layout: &StoreLayout,
    part: log::Part<'_>,
) -> Result<Option<Snapshot>, StoreError> {
    for _ in 0..SNAPSHOT_ATTEMPTS {
        let files = registry_files(layout)?;
        let read = log::read_for(layout, part);
        let found = match read {
            Ok(Some(found)) => found,
            // Read while a writer replaced a file (a compaction): an error of a mixed view.
            Ok(None) | Err(_) if registry_files(layout)? != files => continue,
            Ok(None) => return Ok(None),
            Err(e) => return Err(e),
        };
        let registry = found.registry;
        let mut trust = read_optional(&layout.trust)?;
        if let Some(anchor) = registry.trust_anchor() {
            let matches = |b: &Option<Vec<u8>>| {
                b.as_ref()
                    .is_some_and(|b| Sha256Digest::of(b) == anchor.file_digest)
            };
            if !matches(&trust) {
                let next = read_optional(&layout.trust_next)?;
                if matches(&next) {
                    trust = next;
                } else {
                    // The rename may have happened between the two reads.
                    trust = read_optional(&layout.trust)?;
                }
            }
        }
        if registry_files(layout)? == files {
            return Ok(Some(Snapshot {
                registry,
                listing: found.listing,
                info: found.info,
                trust,
            }));
        }
    }
    Err(StoreError::new(
        StoreErrorKind::Io,
        "the registry kept changing while it was read",
    )
    .at(layout.registry.clone()))
}

/// [`read_committed`], for a store that must have a registry.
fn read_snapshot(layout: &StoreLayout, part: log::Part<'_>) -> Result<Snapshot, StoreError> {
    read_committed(layout, part)?.ok_or_else(|| {
        StoreError::new(StoreErrorKind::Corrupt, "registry file is missing")
            .at(layout.registry.clone())
    })
}

/// The committed registry of the store at `root`, read as a reader reads it (the checkpoint and
/// the frames of the log after it), without the lock and without writing anything; `None` when
/// the store has no registry. For tools and tests that look at a store from outside.
pub fn read_registry(root: impl Into<PathBuf>) -> Result<Option<StoreState>, StoreError> {
    Ok(read_committed(&StoreLayout::new(root), log::Part::Whole)?.map(|s| s.registry))
}

/// The contents of the trust file (or `trust.next`) at `path`, or `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    durable::read_store_file("read trust file", path, MAX_TRUST_BYTES)
}

/// Puts `previous` back at `target` (or removes `target` if there was nothing), durably. Not
/// numbered steps: this only runs after a fault.
fn restore_file(
    run: &mut Run,
    layout: &StoreLayout,
    tmp: &Path,
    target: &Path,
    previous: &Option<Vec<u8>>,
) -> Result<(), StoreError> {
    match previous {
        Some(bytes) => {
            fs::write(tmp, bytes).map_err(|e| io_error("restore file", tmp, e))?;
            run.sync_path("restore file", tmp)?;
            fs::rename(tmp, target).map_err(|e| io_error("restore file", target, e))?;
        }
        None => {
            durable::remove_file_if_present(target)
                .map_err(|e| io_error("restore file", target, e))?;
        }
    }
    run.sync_path("restore file", &layout.root)
}

/// Creates the store's root directory if it is absent, and makes its entry durable.
fn create_root(root: &Path, run: &mut Run) -> Result<(), StoreError> {
    match fs::create_dir(root) {
        Ok(()) => {
            if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                run.sync_path("fsync parent of store directory", parent)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_error("create store directory", root, e)),
    }
}

/// Staging names handed out by any store in this process.
static STAGING_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Takes the store's advisory lock, retrying for up to `wait` while it is held elsewhere.
fn lock_with_wait(file: &File, path: &Path, wait: Duration) -> Result<(), StoreError> {
    let deadline = Instant::now() + wait;
    loop {
        match try_lock(file, path) {
            Err(e) if e.kind == StoreErrorKind::Locked && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Opens (creating if needed) the lock file, which must be a regular file inside the store.
///
/// The last component is opened without following a link (`O_NOFOLLOW`), so that a link planted
/// at `STORE/lock` cannot make the store create, or take a lock on, a file elsewhere; whatever
/// was found there instead (a link, a directory, a FIFO) is refused and left as it was.
fn open_lock(path: &Path) -> Result<File, StoreError> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    crate::durable_file::open_regular(path, &mut options).map_err(|e| match e {
        crate::durable_file::ReadError::Io(e) => io_error("open lock file", path, e),
        _ => StoreError::new(
            StoreErrorKind::Corrupt,
            "lock file is not a regular file (a link or something else is in its place); \
             remove it",
        )
        .at(path.to_path_buf()),
    })
}

/// Takes the store's advisory lock without waiting (`flock`, so not reliable on NFS).
fn try_lock(file: &File, path: &Path) -> Result<(), StoreError> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => {
            // For the message only: a lock taken before a `fork` is listed under the parent.
            let what = match pins::lock_holders(file).first().map(|h| h.pid) {
                Some(pid) if pid == std::process::id() => {
                    format!("another handle in this process (pid {pid}) has the store open")
                }
                Some(pid) => format!("another process (pid {pid}) has the store open"),
                None => "another process, or another handle in this process, has the store open"
                    .to_owned(),
            };
            Err(StoreError::new(StoreErrorKind::Locked, what).at(path.to_path_buf()))
        }
        Err(TryLockError::Error(e)) => Err(io_error("lock store", path, e)),
    }
}

/// How `/proc/locks` names `file`: `major:minor:inode`, the device in hex.
#[cfg(target_os = "linux")]
fn proc_lock_key(file: &File) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let md = file.metadata().ok()?;
    let dev = md.dev();
    // glibc's encoding of a device number (`gnu_dev_major`, `gnu_dev_minor`).
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x00ff);
    Some(format!("{major:02x}:{minor:02x}:{}", md.ino()))
}
