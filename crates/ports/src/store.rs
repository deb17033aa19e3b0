//! The package store port: where installed package versions, the registry and the trust bytes
//! live, and the one durable transaction through which all of them change.
//!
//! Every change to the package set (publish, enable, disable, remove, rollback, the taint
//! that recovery's re-verification decides on, every change of the trust file, and a whole
//! `guild sync`) is a single [`Transaction`] carrying the complete next [`StoreState`], the
//! staged trees of every version it installs (or puts in place of an installed tree that failed
//! re-verification), and the new trust bytes when they change. The registry records a digest of the trust bytes, so the
//! registry's commit point decides which trust file is the store's. The store derives which trees
//! to delete from the difference between the current and the next state. Because there is only
//! one kind of change, there is only one crash behaviour to prove: after a crash at any instant
//! and the recovery that follows, the store holds exactly the state before the transaction or
//! exactly the state after it.
//!
//! Durability contract shared by every method that writes: when it returns `Ok`, the change is on
//! stable storage (every file and directory involved was fsynced), so it survives a power loss;
//! when it returns an error of any kind other than [`StoreErrorKind::Poisoned`] and
//! [`StoreErrorKind::SimulatedCrash`], nothing changed. A poisoned store refuses every call until
//! it is opened again, and opening recovers to one of the two states.

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};

use guild_domain::graph::NodeRef;
use guild_domain::ids::PackageId;
use guild_domain::store_state::listing::Listing;
use guild_domain::store_state::StoreState;
use guild_domain::version::Version;

/// A staged package tree to move into the store as `id@version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedInstall {
    /// The package.
    pub id: PackageId,
    /// The version being installed.
    pub version: Version,
    /// A directory returned by [`PackageStore::new_staging_dir`] and filled since (by the
    /// hardened extractor). The commit consumes it: on success it becomes the installed tree, on
    /// failure it is deleted.
    pub staged: PathBuf,
    /// Whether the version is installed already (in the current registry and in the new one) and
    /// the staged tree replaces its tree: the repair of a version whose files failed
    /// re-verification. A crash leaves the old tree or the new one, never neither.
    pub replace: bool,
}

/// One atomic change to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    /// The generation of the registry the change was computed from. The commit is refused with
    /// [`StoreErrorKind::GenerationConflict`] if the store has moved on since.
    pub expected_generation: u64,
    /// The complete registry after the change. Its generation must be
    /// `expected_generation + 1` (build it with `StoreState::successor`), it must pass
    /// `validate`, and it must keep every record of the current registry with its payload digest
    /// unchanged (versions are immutable, removed ones included), except the removed records
    /// that [`Transaction::purge`] names.
    pub new_state: StoreState,
    /// The staged trees: exactly one for each version that `new_state` installs and the current
    /// registry does not, and one for each installed version whose tree it replaces
    /// ([`StagedInstall::replace`]). No version and no staged tree may appear twice. Either all
    /// of them are in place after the commit, or none is.
    pub installs: Vec<StagedInstall>,
    /// The new trust bytes, when the transaction changes the trust file. Required exactly when
    /// `new_state`'s trust anchor differs from the current registry's, and its digest must be
    /// the one that anchor records.
    pub trust: Option<Vec<u8>>,
    /// The records `new_state` drops on purpose: each must be a `removed` version in the current
    /// registry. Any other record missing from `new_state` refuses the commit, so a registry
    /// cannot forget a version by accident.
    pub purge: Vec<(PackageId, Version)>,
}

impl Transaction {
    /// A state-only change from the registry at `expected_generation` to `new_state`.
    pub fn new(expected_generation: u64, new_state: StoreState) -> Self {
        Transaction {
            expected_generation,
            new_state,
            installs: Vec::new(),
            trust: None,
            purge: Vec::new(),
        }
    }

    /// The same change, also installing `staged` as `id@version` (beside the installs it
    /// carries already).
    pub fn with_install(mut self, id: PackageId, version: Version, staged: PathBuf) -> Self {
        self.installs.push(StagedInstall {
            id,
            version,
            staged,
            replace: false,
        });
        self
    }

    /// The same change, also putting `staged` in place of the installed tree of `id@version`.
    pub fn with_replacement(mut self, id: PackageId, version: Version, staged: PathBuf) -> Self {
        self.installs.push(StagedInstall {
            id,
            version,
            staged,
            replace: true,
        });
        self
    }

    /// The same change, dropping the removed records `purged` from the registry.
    pub fn with_purge(mut self, purged: Vec<(PackageId, Version)>) -> Self {
        self.purge = purged;
        self
    }

    /// The same change, also replacing the trust bytes with `bytes`.
    pub fn with_trust(mut self, bytes: Vec<u8>) -> Self {
        self.trust = Some(bytes);
        self
    }
}

/// What a successful commit did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Committed {
    /// The generation of the registry now on disk.
    pub generation: u64,
    /// The versions whose trees were deleted because the new state no longer installs them.
    pub deleted: Vec<NodeRef>,
    /// Paths that could not be cleaned up after the commit point (a deleted tree, a journal
    /// record). The commit stands; the next recovery removes them.
    pub leftovers: Vec<PathBuf>,
}

/// A journal record that recovery found, summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterruptedCommit {
    /// The registry generation the transaction started from.
    pub from_generation: u64,
    /// The generation it was writing.
    pub to_generation: u64,
    /// The versions the transaction was installing (or whose trees it was replacing).
    pub installs: Vec<NodeRef>,
    /// The versions whose trees the transaction was deleting.
    pub delete: Vec<NodeRef>,
}

/// What recovery found and did. An empty report (see [`RecoveryReport::is_clean`]) means the
/// store was already consistent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// The generation of the registry after recovery.
    pub generation: u64,
    /// Whether the store did not exist (or had never completed its first write) and was created.
    pub created: bool,
    /// Transactions whose registry write had happened: finished (trees deleted, record removed).
    pub rolled_forward: Vec<InterruptedCommit>,
    /// Transactions whose registry write had not happened: undone (every tree they had moved into
    /// place removed, every tree a replacement had set aside put back).
    pub rolled_back: Vec<InterruptedCommit>,
    /// Package trees that the registry does not reference, removed.
    pub removed_trees: Vec<PathBuf>,
    /// Entries of the staging area, removed.
    pub removed_staging: Vec<PathBuf>,
    /// Temporary files of interrupted atomic writes, removed.
    pub removed_temp_files: Vec<PathBuf>,
    /// Installed versions whose tree is missing. The store cannot repair this; the package
    /// manager must treat those versions as failed verification (disable or remove them).
    pub missing_trees: Vec<NodeRef>,
    /// Trees the registry no longer references that were kept because a live process pins them
    /// (it loaded them from an older generation); a later recovery deletes them.
    pub pinned_trees: Vec<PathBuf>,
    /// Trees the registry no longer references that were kept because whether a live process
    /// pins them could not be told (their pin file could not be opened or locked), each with
    /// why. Nothing is deleted on a guess; a later recovery tries again.
    pub unchecked_trees: Vec<UncheckedTree>,
    /// Trees in `packages/` that nothing accounts for: no installed or removed version of the
    /// registry, no journal record, no finished replacement of an installed version names them.
    /// Kept: they may be all that is left of versions a registry that went back (a log cut at a
    /// frame boundary, an older registry put back) no longer knows, so recovery, which deletes
    /// only what a record proves it may, leaves them for the operator to look at.
    pub unaccounted_trees: Vec<PathBuf>,
    /// Whether recovery listed every package tree: always for an explicit recovery, and at
    /// opening only when a journal record or an earlier recovery's kept trees said a tree might
    /// need deleting. Only a recovery that swept reports missing or unaccounted trees.
    pub swept: bool,
}

/// An unreferenced tree that recovery kept because it could not check its pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncheckedTree {
    /// The tree.
    pub path: PathBuf,
    /// What stopped the check (the pin file and the error).
    pub reason: String,
}

impl RecoveryReport {
    /// Whether recovery had nothing to do.
    pub fn is_clean(&self) -> bool {
        !self.created
            && self.rolled_forward.is_empty()
            && self.rolled_back.is_empty()
            && self.removed_trees.is_empty()
            && self.removed_staging.is_empty()
            && self.removed_temp_files.is_empty()
            && self.missing_trees.is_empty()
            && self.unchecked_trees.is_empty()
            && self.unaccounted_trees.is_empty()
    }
}

/// A process that holds a pin on a package version: it has (or is about to have) the version's
/// library loaded, so the version's files must stay.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PinHolder {
    /// The process id.
    pub pid: u32,
    /// The process's command name, when the system says (`/proc/PID/comm` on Linux).
    pub command: Option<String>,
}

impl fmt::Display for PinHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.command {
            Some(command) => write!(f, "pid {} ({command})", self.pid),
            None => write!(f, "pid {}", self.pid),
        }
    }
}

/// The live pins on one package version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionPins {
    /// The pinned version.
    pub node: NodeRef,
    /// The processes that hold it, by pid.
    pub holders: Vec<PinHolder>,
}

/// A process's hold on a package version's files ([`PackageStore::pin`]): while it lives, the
/// store refuses to delete them. The kernel drops it when the process dies, so a dead process
/// never blocks anything.
pub struct StorePin(Option<Box<dyn Send + Sync>>);

impl StorePin {
    /// A pin that holds nothing: what a store without pins hands out.
    pub fn none() -> Self {
        StorePin(None)
    }

    /// A pin that holds `hold` (an open lock file, say) until it is dropped.
    pub fn holding(hold: Box<dyn Send + Sync>) -> Self {
        StorePin(Some(hold))
    }
}

impl fmt::Debug for StorePin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StorePin").field(&self.0.is_some()).finish()
    }
}

/// The durable package store.
///
/// Implementations serialise their own calls, but the app must still hold its lifecycle
/// transaction from `registry` through `commit`, so that the state it validated is the state it
/// replaces; `expected_generation` catches a caller that does not.
///
/// A store handle is a *writer* (it holds the store's exclusive lock while it lives, as the
/// `guild` commands' handles do) or a *reader* ([`PackageStore::is_reader`]): it reads one
/// committed generation without any lock, never writes on its own, and takes the exclusive lock
/// only between [`PackageStore::begin_write`] and [`PackageStore::end_write`] (or for a single
/// call that writes).
#[cfg_attr(feature = "mocks", mockall::automock)]
pub trait PackageStore: Send + Sync {
    /// Whether this handle is a reader: opening it took no lock and recovered nothing, and it must
    /// not write unless asked to ([`PackageStore::begin_write`]). A reader's view moves to a newer
    /// generation only at [`PackageStore::refresh`].
    fn is_reader(&self) -> bool {
        false
    }

    /// Reads the newest committed generation (registry and trust bytes) into this handle's view
    /// and answers its registry generation. A writer's view is always the newest already.
    fn refresh(&self) -> Result<u64, StoreError> {
        self.registry().map(|r| r.generation())
    }

    /// Takes the store's exclusive lock for one transaction (a no-op on a writer, which holds it
    /// already), recovering an interrupted change first and moving the view to the newest
    /// generation. Pair every `Ok` with [`PackageStore::end_write`].
    fn begin_write(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Gives back what [`PackageStore::begin_write`] took.
    fn end_write(&self) {}

    /// Pins `id@version` for this process: until the pin is dropped (or the process dies), no
    /// writer deletes the version's files. Take it before verifying and loading the files.
    /// Refused with [`StoreErrorKind::NotInstalled`] when the committed registry (on disk, not
    /// this handle's view) does not install the version: it records it as removed, or not at
    /// all. A refused pin leaves nothing behind.
    fn pin(&self, _id: &PackageId, _version: &Version) -> Result<StorePin, StoreError> {
        Ok(StorePin::none())
    }

    /// Pins `id@version`, which the transaction this handle is making installs (it is not
    /// committed yet): for loading a staged tree before the commit that moves it into place.
    /// Refused with [`StoreErrorKind::InvalidTransaction`] on a reader outside
    /// [`PackageStore::begin_write`].
    fn pin_installing(&self, id: &PackageId, version: &Version) -> Result<StorePin, StoreError> {
        self.pin(id, version)
    }

    /// The live pins on every version, each with the processes that hold it.
    fn pins(&self) -> Result<Vec<VersionPins>, StoreError> {
        Ok(Vec::new())
    }

    /// The committed registry. Never an empty stand-in for a file that could not be read: opening
    /// the store fails instead.
    fn registry(&self) -> Result<StoreState, StoreError>;

    /// The committed registry as a listing shows it: every package's row, in id order. A
    /// handle opened for the listing alone answers it from the registry files' index, where
    /// [`PackageStore::registry`] then holds the store-wide facts and no package.
    fn listing(&self) -> Result<Listing, StoreError> {
        Ok(Listing::of(&self.registry()?))
    }

    /// Whether the committed registry records any package: on a handle opened for the listing
    /// (whose registry holds none) the listing says; on a handle opened for one package, whether
    /// that package is recorded (its registry holds no other).
    fn records_packages(&self) -> Result<bool, StoreError> {
        Ok(self.registry()?.packages().next().is_some())
    }

    /// A fresh path inside the store's staging area that does not exist yet. The caller creates
    /// the directory there exclusively (the extractor does) and either commits it with
    /// [`Transaction::with_install`] or gives it back with [`PackageStore::discard_staging`].
    /// Staging is not durable: recovery clears it.
    fn new_staging_dir(&self) -> Result<PathBuf, StoreError>;

    /// Deletes a staging directory that will not be committed. A path that does not exist is
    /// fine; a path outside the staging area is refused.
    fn discard_staging(&self, staged: &Path) -> Result<(), StoreError>;

    /// Applies `tx` atomically and durably: installs every staged tree read-only, replaces the
    /// registry, and deletes the trees the new state no longer installs. See the module
    /// documentation for what each outcome guarantees.
    fn commit(&self, tx: Transaction) -> Result<Committed, StoreError>;

    /// Where the installed tree of `id@version` lives (whether or not it is installed).
    fn package_dir(&self, id: &PackageId, version: &Version) -> PathBuf;

    /// The trust bytes last committed, or `None` if there are none. The store does not interpret
    /// them; the app decodes them, checks them against the registry's trust anchor and fails
    /// closed on anything it cannot read.
    fn read_trust(&self) -> Result<Option<Vec<u8>>, StoreError>;

    /// Where the trust bytes live, for messages that tell an operator which file is wrong.
    fn trust_path(&self) -> PathBuf;

    /// Replaces the trust bytes atomically and durably, outside any transaction: the registry's
    /// trust anchor is not updated, so a store that records one refuses to open afterwards. The
    /// package manager changes trust only through [`Transaction::with_trust`]; this is for
    /// stores used without it.
    fn write_trust(&self, bytes: &[u8]) -> Result<(), StoreError>;

    /// Brings the disk back in line with the registry: finishes or undoes interrupted
    /// transactions, removes unreferenced trees, stale temporary files and staging entries that
    /// this handle did not hand out. Opening a store runs it first; running it again on a
    /// consistent store changes nothing and answers a clean report.
    fn recover(&self) -> Result<RecoveryReport, StoreError>;
}

/// What kind of store failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// A file-system operation failed (including any fsync).
    Io,
    /// A store file (registry, journal record) exists but cannot be decoded, or the files
    /// contradict each other. The store refuses to open rather than guess.
    Corrupt,
    /// A store file is written in a format version this build does not read.
    UnsupportedFormat,
    /// Another process (or another handle in this one) holds the store's lock.
    Locked,
    /// The transaction's expected generation is not the registry's.
    GenerationConflict,
    /// The transaction contradicts itself or the current registry (wrong generation step, a
    /// changed digest, a missing or unexpected staged tree, a staging path outside the store).
    InvalidTransaction,
    /// An earlier failure left the store in a state this handle cannot vouch for. Open the store
    /// again; recovery decides.
    Poisoned,
    /// A fault plan stopped the store as if the process had died. Only tests see this.
    SimulatedCrash,
    /// The change would delete the files of a version that live processes have loaded (they
    /// are named in [`StoreError::holders`]); it can be made once they have let go.
    Pinned,
    /// The version's files are being deleted by a writer (or are gone), so they cannot be
    /// pinned; the next committed generation no longer holds them.
    Removed,
    /// The committed registry does not install the version (it records it as removed, or does
    /// not record it), so it cannot be pinned.
    NotInstalled,
}

impl StoreErrorKind {
    fn describe(self) -> &'static str {
        match self {
            StoreErrorKind::Io => "store i/o failed",
            StoreErrorKind::Corrupt => "store file is corrupt",
            StoreErrorKind::UnsupportedFormat => "store file has an unsupported format",
            StoreErrorKind::Locked => "store is locked",
            StoreErrorKind::GenerationConflict => "store registry changed since it was read",
            StoreErrorKind::InvalidTransaction => "store transaction is invalid",
            StoreErrorKind::Poisoned => "store is unusable after an earlier failure",
            StoreErrorKind::SimulatedCrash => "store stopped by an injected crash",
            StoreErrorKind::Pinned => "store version is in use by another process",
            StoreErrorKind::Removed => "store version is being removed",
            StoreErrorKind::NotInstalled => "store version is not installed",
        }
    }
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A store failure: its kind, what was being done, the path involved, and the underlying cause.
#[derive(Debug)]
pub struct StoreError {
    /// What kind of failure, which decides what an operator can do about it.
    pub kind: StoreErrorKind,
    /// What the store was doing, in a few words ("fsync registry", "decode journal record").
    pub what: String,
    /// The file or directory involved, if one was.
    pub path: Option<PathBuf>,
    /// The underlying error, when there is one.
    pub source: Option<Box<dyn StdError + Send + Sync>>,
    /// The processes whose pins refused the change ([`StoreErrorKind::Pinned`]).
    pub holders: Vec<PinHolder>,
}

impl StoreError {
    /// An error of `kind` while doing `what`, with no path or cause yet.
    pub fn new(kind: StoreErrorKind, what: impl Into<String>) -> Self {
        StoreError {
            kind,
            what: what.into(),
            path: None,
            source: None,
            holders: Vec::new(),
        }
    }

    /// The same error, naming the processes whose pins refused the change.
    pub fn held_by(mut self, holders: Vec<PinHolder>) -> Self {
        self.holders = holders;
        self
    }

    /// The same error, naming `path`.
    pub fn at(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The same error, caused by `source`.
    pub fn caused_by(mut self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.what)?;
        if let Some(path) = &self.path {
            write!(f, " ({})", path.display())?;
        }
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_error_names_kind_action_path_and_cause() {
        let err = StoreError::new(StoreErrorKind::Corrupt, "decode registry")
            .at("/s/registry.json")
            .caused_by("unknown field at $.extra");
        assert_eq!(
            err.to_string(),
            "store file is corrupt: decode registry (/s/registry.json): unknown field at $.extra"
        );
        assert_eq!(
            StdError::source(&err).map(|s| s.to_string()),
            Some("unknown field at $.extra".to_owned())
        );
    }

    #[test]
    fn store_port_is_object_safe_and_reports_clean_recovery() {
        fn takes(_: Option<&dyn PackageStore>) {}
        takes(None);
        assert!(RecoveryReport::default().is_clean());
        let report = RecoveryReport {
            removed_staging: vec![PathBuf::from("staging/x")],
            ..RecoveryReport::default()
        };
        assert!(!report.is_clean());
    }

    #[test]
    fn store_transaction_builder_adds_each_install() {
        let (a, b) = (PackageId::new("a").unwrap(), PackageId::new("b").unwrap());
        let v = Version::new(1, 0, 0);
        let tx = Transaction::new(3, StoreState::new())
            .with_install(a.clone(), v.clone(), PathBuf::from("/s/staging/0"))
            .with_replacement(b.clone(), v.clone(), PathBuf::from("/s/staging/1"));
        assert_eq!(tx.expected_generation, 3);
        assert_eq!(
            tx.installs,
            [
                StagedInstall {
                    id: a,
                    version: v.clone(),
                    staged: PathBuf::from("/s/staging/0"),
                    replace: false,
                },
                StagedInstall {
                    id: b,
                    version: v,
                    staged: PathBuf::from("/s/staging/1"),
                    replace: true,
                }
            ]
        );
    }
}
