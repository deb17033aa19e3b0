//! Making a store's enabled set equal a lock file (`guild sync`), in two phases, so that the
//! store's lock is never held across a download, and as one change of the store, so that a sync
//! that fails or is killed changes nothing.
//!
//! 1. Without the store's lock: every package the plan installs is brought into a private
//!    staging area under the store ([`SyncStaging`]), from a mirror directory (read once, copied
//!    exclusively) or by a download into it, and checked whole there ([`stage`]): authenticated
//!    against the store's trust file, its platform checked, every artifact hashed, and its id,
//!    version and payload compared with the lock. Writers of the store are not kept waiting
//!    meanwhile.
//! 2. Under the store's lock ([`apply`]): the plan is made again from the committed state, and
//!    carried out from the staged files only (the exact bytes that were checked; a mirror is
//!    never read a second time) as one change ([`PackageManager::apply_plan`]): every disable
//!    and installation is drafted into one next store state, the dependency graph and impl-id
//!    claims are checked on that final state as a whole (so a dependency and its dependent can
//!    move to new major versions together), the result is compared with the lock, the hook
//!    prepares each change (the registration check of each version made loadable), and one
//!    store transaction commits it all. Since every package was checked in phase 1, what can
//!    still fail is what the store says to the change (a dependency, an impl id, the trust file
//!    changed since).
//!
//! Whatever fails, nothing was committed: the store is where the sync found it, with no step to
//! undo. A process killed at any instant of phase 2 (SIGKILL, a power loss) leaves the store's
//! recovery the one transaction to finish or undo, so the store is wholly the state before the
//! sync or wholly the state after it. A runner following the store sees those two generations
//! and nothing in between.
//!
//! A staging area belongs to the process that holds the `flock` on its `NAME.lock` file beside
//! it; one whose owner died is removed by the next sync that creates one.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One step of a sync's plan ([`plan`]).
pub use guild_domain::distribution::SyncStep;
use guild_domain::distribution::{plan_sync, HeldVersion, LockFile, LockedPackage, SyncConflict};
use guild_domain::ids::PackageId;
use guild_domain::lifecycle::State;
use guild_domain::version::Version;

use guild_domain::store_state::StoreState;

use crate::package_manager::{FleetChange, LifecycleHook};
use crate::{HostError, PackageManager, PlanError, PlanStep, StepDone};
use guild_adapters_fs::durable_file;

/// The directory under a store that holds the staging areas of syncs in progress.
pub const STAGING_DIR: &str = "sync-staging";

/// Distinguishes this process's staging areas.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Why a sync failed. Nothing in the store was changed by it: the sync commits one store
/// transaction, after everything that can refuse it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    /// The store could not be read.
    #[error("cannot read the store: {0}")]
    Store(#[source] Box<HostError>),
    /// The lock and the store disagree about what a version is; versions are immutable.
    #[error(transparent)]
    Conflict(#[from] Box<SyncConflict>),
    /// The staging area could not be made, or a file in it created.
    #[error("cannot prepare the sync's staging area {}: {source}", path.display())]
    Staging {
        /// The directory or file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A mirror's file could not be read into the staging area.
    #[error("{package}: cannot copy {} into the staging area: {source}", from.display())]
    Copy {
        /// `id version` of the locked package.
        package: String,
        /// The mirror's file.
        from: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A staged package failed the checks of an installation.
    #[error("{package}: {} failed its check before the sync: {source}", file.display())]
    Check {
        /// `id version` of the locked package.
        package: String,
        /// The staged file.
        file: PathBuf,
        /// What failed.
        #[source]
        source: Box<HostError>,
    },
    /// A staged package is genuine but is not the one the lock pins.
    #[error(
        "{package}: {} holds {found} with payload {found_payload}, but the lock pins payload \
         {locked_payload}",
        file.display()
    )]
    NotLocked {
        /// `id version` of the locked package.
        package: String,
        /// The staged file.
        file: PathBuf,
        /// `id version` the file holds.
        found: String,
        /// Its payload digest, hex.
        found_payload: String,
        /// The locked payload digest, hex.
        locked_payload: String,
    },
    /// A staged package is genuine and is the locked payload, but no signature on it by the key
    /// the lock names authenticates (another trusted key signed it).
    #[error(
        "{package}: {} is signed by key {found_key}, but the lock requires key {locked_key}",
        file.display()
    )]
    StagedKeyDiffers {
        /// `id version` of the locked package.
        package: String,
        /// The staged file.
        file: PathBuf,
        /// The key that authenticated it, hex.
        found_key: String,
        /// The key the lock names, hex.
        locked_key: String,
    },
    /// The store holds the locked version, but not signed by the key the lock names: the store
    /// cannot match the lock by enabling it. Versions are immutable, so the sync does not
    /// replace it.
    #[error(
        "{package}: the store holds this version signed by key {found_keys}, but the lock \
         requires key {locked_key}{why}"
    )]
    InstalledKeyDiffers {
        /// `id version` of the locked package.
        package: String,
        /// The key ids of the installed version's signatures, hex, comma-separated.
        found_keys: String,
        /// The key the lock names, hex.
        locked_key: String,
        /// Empty, or why the installed signature by the locked key does not count (its key
        /// revoked or no longer trusted, the signature invalid), with a leading separator.
        why: String,
    },
    /// The sync would shrink the store's enabled set (see [`SyncOptions::allow_shrink`]) and
    /// was not allowed to; nothing was changed.
    #[error("{what}; the sync changed nothing")]
    Shrinks {
        /// What the sync would have done: the packages it would disable, or that the lock is
        /// empty.
        what: String,
        /// The package ids it would disable.
        disabled: Vec<PackageId>,
    },
    /// The store changed while the packages were staged, and the sync now needs one that was
    /// not staged.
    #[error(
        "{package}: the store changed while the sync fetched its packages, and it now needs this \
         one, which was not fetched; run the sync again"
    )]
    NotStaged {
        /// `id version` of the locked package.
        package: String,
    },
    /// A change was refused, or failed, under the store's lock; nothing was committed.
    #[error("cannot {step} {package}: {source}; the sync changed nothing")]
    Step {
        /// The step: `disable`, `install`, `enable`, or for the changes as a whole `apply the
        /// changes to`, `commit the changes to`.
        step: &'static str,
        /// The package it was for, or the packages the sync changes.
        package: String,
        /// Why it failed.
        #[source]
        source: Box<HostError>,
    },
    /// The changes would not have made the store's enabled set equal the lock; nothing was
    /// committed.
    #[error(
        "the sync's changes would leave the store differing from the lock for {packages}; the \
         sync changed nothing"
    )]
    Differs {
        /// The package ids that would differ.
        packages: String,
    },
}

/// A private staging area for one sync: `STORE/sync-staging/PID-N/`, created exclusively with
/// mode 0700, owned through an exclusive `flock` on `PID-N.lock` beside it, and removed with
/// everything in it when dropped.
#[derive(Debug)]
pub struct SyncStaging {
    base: PathBuf,
    dir: PathBuf,
    lock: PathBuf,
    _owner: File,
}

impl SyncStaging {
    /// Creates a staging area under `store`, first removing those whose owner is gone.
    pub fn create(store: &Path) -> Result<Self, SyncError> {
        let base = store.join(STAGING_DIR);
        let failed = |path: &Path, source| SyncError::Staging {
            path: path.to_path_buf(),
            source,
        };
        remove_abandoned(&base).map_err(|e| failed(&base, e))?;
        for _ in 0..64 {
            // The store itself as the store would make it; the staging areas private.
            fs::create_dir_all(store).map_err(|e| failed(store, e))?;
            match private_dir(&base) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(failed(&base, e)),
            }
            let name = format!(
                "{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let lock = base.join(format!("{name}.lock"));
            let mut options = OpenOptions::new();
            options.write(true).create_new(true);
            let owner = match durable_file::unfollowed(&mut options).open(&lock) {
                Ok(f) => f,
                // Another sync emptied and removed the base meanwhile, or the name is taken.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::AlreadyExists | io::ErrorKind::NotFound
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(failed(&lock, e)),
            };
            match owner.try_lock() {
                Ok(()) if durable_file::still_linked(&owner, &lock).unwrap_or(false) => {}
                // A sync cleaning up claimed it between the create and the lock.
                Ok(()) | Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(e)) => return Err(failed(&lock, e)),
            }
            let dir = base.join(&name);
            // A directory without its lock file belongs to nobody: its owner removes the
            // directory before the lock file.
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(&dir, e)),
            }
            let staging = SyncStaging {
                base: base.clone(),
                dir: dir.clone(),
                lock,
                _owner: owner,
            };
            private_dir(&dir).map_err(|e| failed(&dir, e))?;
            return Ok(staging);
        }
        Err(failed(
            &base,
            io::Error::new(io::ErrorKind::AlreadyExists, "every name is taken"),
        ))
    }

    /// The staging area.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Where the package file of `locked` goes in the staging area: a download writes it there
    /// (it must not exist yet), [`SyncStaging::copy_in`] copies it there.
    pub fn file_for(&self, locked: &LockedPackage) -> PathBuf {
        self.dir.join(format!(
            "{}-{}.{}",
            locked.id,
            locked.version,
            locked.kind.as_str()
        ))
    }

    /// Copies the package file at `from` (a mirror's) into the staging area, reading it once;
    /// answers the copy. Only a regular file is read (never a FIFO), and the copy is created
    /// exclusively.
    pub fn copy_in(&self, locked: &LockedPackage, from: &Path) -> Result<PathBuf, SyncError> {
        let copy_failed = |source| SyncError::Copy {
            package: format!("{} {}", locked.id, locked.version),
            from: from.to_path_buf(),
            source,
        };
        let mut options = OpenOptions::new();
        let mut source = durable_file::open_regular(from, options.read(true)).map_err(|e| {
            copy_failed(match e {
                durable_file::ReadError::Io(e) => e,
                other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
            })
        })?;
        let to = self.file_for(locked);
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        let mut copy = durable_file::unfollowed(&mut options)
            .open(&to)
            .map_err(|e| SyncError::Staging {
                path: to.clone(),
                source: e,
            })?;
        io::copy(&mut source, &mut copy).map_err(copy_failed)?;
        Ok(to)
    }
}

impl Drop for SyncStaging {
    fn drop(&mut self) {
        make_writable(&self.dir);
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            if e.kind() != io::ErrorKind::NotFound {
                eprintln!(
                    "warning: could not remove the sync's staging area {}: {e}",
                    self.dir.display()
                );
            }
        }
        let _ = fs::remove_file(&self.lock);
        // The base goes with the last staging area; another sync's makes this fail.
        let _ = fs::remove_dir(&self.base);
    }
}

/// Removes the staging areas under `base` whose owner is gone.
fn remove_abandoned(base: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(base) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let Some(name) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".lock"))
            .map(str::to_owned)
        else {
            continue;
        };
        if let Some(held) = durable_file::claim_abandoned(&path)? {
            let dir = base.join(name);
            make_writable(&dir);
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            fs::remove_file(&path)?;
            drop(held);
        }
    }
    Ok(())
}

/// Staged files are plain files in plain directories; nothing here is sealed read-only, but a
/// download or copy that failed half way may have left any mode.
fn make_writable(dir: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    }
    #[cfg(not(unix))]
    let _ = dir;
}

fn private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// A package file in a staging area that passed every check of an installation and is the one
/// the lock pins.
#[derive(Debug, Clone)]
pub struct StagedPackage {
    locked: LockedPackage,
    file: PathBuf,
}

impl StagedPackage {
    /// The lock's entry.
    pub fn locked(&self) -> &LockedPackage {
        &self.locked
    }

    /// The staged file.
    pub fn file(&self) -> &Path {
        &self.file
    }
}

/// Checks the staged `file` whole ([`PackageManager::check_package`]: signature, platform, every
/// artifact) and against `locked` (its id, version and payload).
pub fn stage(
    pm: &PackageManager,
    locked: &LockedPackage,
    file: PathBuf,
) -> Result<StagedPackage, SyncError> {
    let checked = pm
        .check_package_as(&file, Some(&locked.key_id))
        .map_err(|source| SyncError::Check {
            package: format!("{} {}", locked.id, locked.version),
            file: file.clone(),
            source: Box::new(source),
        })?;
    if checked.key_id != locked.key_id {
        return Err(SyncError::StagedKeyDiffers {
            package: format!("{} {}", locked.id, locked.version),
            file,
            found_key: checked.key_id.to_hex(),
            locked_key: locked.key_id.to_hex(),
        });
    }
    staged(locked, file, &checked)
}

/// The staged `file`, which passed its check as `checked`, if it is the package `locked` pins
/// (its id, version and payload). Which key must have signed it is the caller's rule: a lock's
/// one key ([`stage`]), or any key a fleet policy's entry allows.
pub(crate) fn staged(
    locked: &LockedPackage,
    file: PathBuf,
    checked: &crate::Installed,
) -> Result<StagedPackage, SyncError> {
    let package = format!("{} {}", locked.id, locked.version);
    if checked.id != locked.id
        || checked.version != locked.version
        || checked.payload_digest != locked.payload_sha256
    {
        return Err(SyncError::NotLocked {
            package,
            file,
            found: format!("{} {}", checked.id, checked.version),
            found_payload: checked.payload_digest.to_hex(),
            locked_payload: locked.payload_sha256.to_hex(),
        });
    }
    Ok(StagedPackage {
        locked: locked.clone(),
        file,
    })
}

/// One change a sync made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncChange {
    /// The package was disabled: the lock does not name it.
    Disabled {
        /// The package.
        id: PackageId,
        /// The version that was enabled.
        version: Version,
    },
    /// The locked version was installed (or made current again) and enabled.
    Installed {
        /// The package.
        id: PackageId,
        /// The locked version.
        version: Version,
    },
}

/// What a sync may do beyond installing and enabling what its lock names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncOptions {
    /// Whether the sync may shrink the enabled set: disable a package that is enabled (and not
    /// tainted) now and that the lock does not name, or follow an empty lock at all. A package
    /// the lock names at another version is replaced, which is not shrinking. Without it such
    /// a sync is refused ([`SyncError::Shrinks`]) before anything changes: an empty or
    /// truncated lock would otherwise disable every package a server runs.
    pub allow_shrink: bool,
}

impl SyncOptions {
    /// Options that let a sync shrink the enabled set.
    pub fn allowing_shrink(allow_shrink: bool) -> Self {
        SyncOptions { allow_shrink }
    }
}

/// Refuses `steps` (a plan of `lock`) when they shrink the enabled set and `options` do not
/// allow it ([`SyncOptions::allow_shrink`]).
pub fn check_shrink(
    lock: &LockFile,
    steps: &[SyncStep],
    options: SyncOptions,
) -> Result<(), SyncError> {
    if options.allow_shrink {
        return Ok(());
    }
    let disabled: Vec<PackageId> = steps
        .iter()
        .filter_map(|s| match s {
            SyncStep::Disable(id) => Some(id.clone()),
            _ => None,
        })
        .collect();
    let what = if lock.packages().len() == 0 {
        let n = disabled.len();
        format!(
            "the lock names no package: following it would disable {n} enabled package{}",
            if n == 1 { "" } else { "s" }
        )
    } else if !disabled.is_empty() {
        let names: Vec<String> = disabled.iter().map(ToString::to_string).collect();
        format!(
            "the lock does not name {}, enabled now: following it would disable {}",
            names.join(", "),
            if names.len() == 1 { "it" } else { "them" }
        )
    } else {
        return Ok(());
    };
    Err(SyncError::Shrinks { what, disabled })
}

/// Makes the enabled set of the store that `pm` holds the lock of equal `lock`: plans the steps
/// from the committed state ([`plan`]) and makes them from the `staged` packages as one change
/// ([`PackageManager::apply_plan`]), with `hook` taking part in each; answers the changes. If any
/// change is refused, or the result would not equal the lock, nothing is committed.
///
/// This sync may shrink the enabled set; [`apply_with`] takes [`SyncOptions`].
pub fn apply(
    pm: &PackageManager,
    lock: &LockFile,
    staged: &[StagedPackage],
    hook: &mut dyn LifecycleHook,
) -> Result<Vec<SyncChange>, SyncError> {
    apply_with(pm, lock, staged, hook, SyncOptions::allowing_shrink(true))
}

/// [`apply`] under `options`: the plan made under the store's lock is checked against them
/// ([`check_shrink`]) before anything changes, since the store may have changed since the plan
/// the packages were staged for.
pub fn apply_with(
    pm: &PackageManager,
    lock: &LockFile,
    staged: &[StagedPackage],
    hook: &mut dyn LifecycleHook,
    options: SyncOptions,
) -> Result<Vec<SyncChange>, SyncError> {
    let steps = plan(pm, lock)?;
    check_shrink(lock, &steps, options)?;
    apply_steps(pm, lock, &steps, staged, hook, None)
}

/// Applies a fleet policy's desired set (`lock`, as `steps` the fleet planned from
/// [`plan_steps`]: the policy's entries decide which keys may sign, not the lock's one key),
/// committing `fleet` (the policy's trust
/// and record) in the same transaction ([`PackageManager::apply_fleet_plan`]). A signed policy
/// may shrink the enabled set.
pub(crate) fn apply_fleet(
    pm: &PackageManager,
    lock: &LockFile,
    steps: &[SyncStep],
    staged: &[StagedPackage],
    hook: &mut dyn LifecycleHook,
    fleet: FleetChange,
) -> Result<Vec<SyncChange>, SyncError> {
    apply_steps(pm, lock, steps, staged, hook, Some(fleet))
}

/// Makes `steps` (a plan of `lock`) from the `staged` packages as one change.
fn apply_steps(
    pm: &PackageManager,
    lock: &LockFile,
    steps: &[SyncStep],
    staged: &[StagedPackage],
    hook: &mut dyn LifecycleHook,
    fleet: Option<FleetChange>,
) -> Result<Vec<SyncChange>, SyncError> {
    let files: BTreeMap<&PackageId, &StagedPackage> =
        staged.iter().map(|s| (&s.locked.id, s)).collect();
    // Every package the steps install must be staged as the version the lock pins.
    let mut changes = Vec::with_capacity(steps.len());
    for step in steps {
        match step {
            SyncStep::Disable(id) => changes.push(PlanStep::Disable(id.clone())),
            SyncStep::Install(l) | SyncStep::Reactivate(l) => match files.get(&l.id) {
                Some(s) if s.locked == *l => changes.push(PlanStep::Install(s.file.clone())),
                _ => {
                    return Err(SyncError::NotStaged {
                        package: format!("{} {}", l.id, l.version),
                    })
                }
            },
        }
    }
    let accept = |next: &StoreState| match differences(next, lock) {
        differs if differs.is_empty() => Ok(()),
        differs => Err(differs.join(", ")),
    };
    let done = match fleet {
        None => pm.apply_plan(&changes, &accept, hook),
        Some(fleet) => pm.apply_fleet_plan(&changes, &accept, hook, fleet),
    };
    let done = done.map_err(|e| match e {
        PlanError::Step {
            step,
            package,
            source,
        } => SyncError::Step {
            step,
            package,
            source,
        },
        PlanError::NotAccepted { reason } => SyncError::Differs { packages: reason },
    })?;
    Ok(done
        .into_iter()
        .map(|d| match d {
            StepDone::Disabled { id, version } => SyncChange::Disabled { id, version },
            StepDone::Installed(i) => SyncChange::Installed {
                id: i.id,
                version: i.version,
            },
        })
        .collect())
}

/// The steps that make the enabled set of `pm`'s committed store equal `lock`. A locked version
/// the store already holds must be signed by the key the lock names (a valid signature by it
/// that the trust store accepts), whether it is enabled or would be made current again from its
/// installed tree: otherwise the store cannot match the lock ([`SyncError::InstalledKeyDiffers`]).
pub fn plan(pm: &PackageManager, lock: &LockFile) -> Result<Vec<SyncStep>, SyncError> {
    let (steps, held) = plan_held(pm, lock)?;
    check_installed_keys(pm, lock, &held)?;
    Ok(steps)
}

/// The steps of [`plan`] without its rule on the lock's one key (a fleet policy's entry allows
/// several keys, and its own checks hold the store to them).
pub(crate) fn plan_steps(pm: &PackageManager, lock: &LockFile) -> Result<Vec<SyncStep>, SyncError> {
    plan_held(pm, lock).map(|(steps, _)| steps)
}

/// The steps, and what the store holds.
fn plan_held(
    pm: &PackageManager,
    lock: &LockFile,
) -> Result<(Vec<SyncStep>, Vec<HeldVersion>), SyncError> {
    let mut held = Vec::new();
    for p in pm.list().map_err(|e| SyncError::Store(Box::new(e)))? {
        for v in &p.versions {
            held.push(HeldVersion {
                id: p.id.clone(),
                version: v.version.clone(),
                payload_sha256: v.payload_digest,
                installed: !matches!(v.state, State::Removed | State::Discarded | State::Staged),
                enabled: p.enabled.as_ref() == Some(&v.version) && v.taint.is_none(),
            });
        }
    }
    let steps = plan_sync(lock, &held)?;
    Ok((steps, held))
}

/// Refuses a locked version the store holds that no valid signature by the lock's key
/// authenticates ([`SyncError::InstalledKeyDiffers`]).
fn check_installed_keys(
    pm: &PackageManager,
    lock: &LockFile,
    held: &[HeldVersion],
) -> Result<(), SyncError> {
    for locked in lock.packages() {
        let installed = held
            .iter()
            .any(|h| h.id == locked.id && h.version == locked.version && h.installed);
        if !installed {
            continue;
        }
        let metadata = pm.metadata(&locked.id, &locked.version);
        let why = match metadata.as_deref() {
            Some(m) => match pm.authenticated_by(m, &locked.key_id) {
                Ok(_) => continue,
                Err(HostError::Unauthenticated { source, .. })
                    if m.signatures().iter().any(|s| s.key_id == locked.key_id) =>
                {
                    format!(" (its signature by that key does not count: {source})")
                }
                Err(HostError::Unauthenticated { .. }) => String::new(),
                Err(e) => return Err(SyncError::Store(Box::new(e))),
            },
            None => String::new(),
        };
        let found: Vec<String> = metadata
            .iter()
            .flat_map(|m| m.signatures().iter().map(|s| s.key_id.to_hex()))
            .collect();
        return Err(SyncError::InstalledKeyDiffers {
            package: format!("{} {}", locked.id, locked.version),
            found_keys: if found.is_empty() {
                "none that can be read".to_owned()
            } else {
                found.join(", ")
            },
            locked_key: locked.key_id.to_hex(),
            why,
        });
    }
    Ok(())
}

/// The packages whose enabled version in `state` differs from `lock` (missing, tainted, another
/// payload, or not named by it), by id.
fn differences(state: &StoreState, lock: &LockFile) -> Vec<String> {
    let mut differs = std::collections::BTreeSet::new();
    for (id, record) in state.packages() {
        let enabled = record
            .enabled()
            .and_then(|v| record.get(v).map(|r| (v, r)))
            .filter(|(_, r)| r.taint.is_none());
        match (enabled, lock.get(id)) {
            (None, None) => {}
            (Some((v, r)), Some(l)) if *v == l.version && r.payload_digest == l.payload_sha256 => {}
            _ => {
                differs.insert(id.to_string());
            }
        }
    }
    for l in lock.packages() {
        if state.package(&l.id).is_none() {
            differs.insert(l.id.to_string());
        }
    }
    differs.into_iter().collect()
}
