//! Making a store's enabled set equal a lock file (`guild sync`), in two phases, so that the
//! store's lock is never held across a download and a sync that fails changes nothing.
//!
//! 1. Without the store's lock: every package the plan installs is brought into a private
//!    staging area under the store ([`SyncStaging`]), from a mirror directory (read once, copied
//!    exclusively) or by a download into it, and checked whole there ([`stage`]): authenticated
//!    against the store's trust file, its platform checked, every artifact hashed, and its id,
//!    version and payload compared with the lock. Writers of the store are not kept waiting
//!    meanwhile.
//! 2. Under the store's lock ([`apply`]): the plan is made again from the committed state, and
//!    carried out from the staged files only (the exact bytes that were checked; a mirror is
//!    never read a second time). The store has no transaction that spans packages, so each step
//!    commits on its own, after a [`Savepoint`]; if any step fails, the store is returned to the
//!    savepoint ([`PackageManager::restore`]) in the same hold of the lock, so that nothing the
//!    sync did remains. Since every package was checked in phase 1, what can still fail is what
//!    the store says to the change (a dependency, an impl id, the trust file changed since).
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

use crate::durable_file;
use crate::package_manager::{LifecycleHook, Savepoint};
use crate::{HostError, InstallOptions, PackageManager};

/// The directory under a store that holds the staging areas of syncs in progress.
pub const STAGING_DIR: &str = "sync-staging";

/// Distinguishes this process's staging areas.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Why a sync failed. Nothing in the store was changed by it, except where a variant says that
/// returning the store to where the sync found it failed too.
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
    /// A step failed under the store's lock; the store was returned to where the sync found it.
    #[error("cannot {step} {package}: {source}; the sync changed nothing")]
    Step {
        /// The step: `disable`, `install`, `enable`.
        step: &'static str,
        /// The package it was for.
        package: String,
        /// Why it failed.
        #[source]
        source: Box<HostError>,
    },
    /// The steps ran but the store's enabled set did not equal the lock; the store was returned
    /// to where the sync found it.
    #[error(
        "after the sync the store still differed from the lock for {packages}; the sync changed \
         nothing"
    )]
    Differs {
        /// The package ids that differed.
        packages: String,
    },
    /// The result differed from the lock and returning the store to where the sync found it
    /// failed: the store holds part of the sync.
    #[error(
        "after the sync the store still differed from the lock for {packages}, and returning it \
         to where the sync found it failed ({restore}), so part of the sync remains"
    )]
    DiffersNotRestored {
        /// The package ids that differed.
        packages: String,
        /// Why the return failed.
        #[source]
        restore: Box<HostError>,
    },
    /// The sync failed (`cause`) and the store was returned to where the sync found it, except
    /// for versions it had installed that running processes loaded meanwhile: they stay
    /// installed, switched off, until those processes let go and someone removes them.
    #[error(
        "{cause}; the store is back where the sync found it, except that {kept} stay installed \
         (not enabled) because running processes have them loaded; remove them once those let go"
    )]
    PartlyRestored {
        /// Why the sync failed.
        #[source]
        cause: Box<SyncError>,
        /// The versions kept, each with the processes that have it loaded.
        kept: String,
    },
    /// A step failed and returning the store to where the sync found it failed too: the store
    /// holds part of the sync.
    #[error(
        "cannot {step} {package}: {source}; returning the store to where the sync found it \
         failed too ({restore}), so part of the sync remains"
    )]
    NotRestored {
        /// The step that failed.
        step: &'static str,
        /// The package it was for.
        package: String,
        /// Why it failed.
        #[source]
        source: Box<HostError>,
        /// Why the return failed.
        restore: Box<HostError>,
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
    let package = format!("{} {}", locked.id, locked.version);
    let checked = pm.check_package(&file).map_err(|source| SyncError::Check {
        package: package.clone(),
        file: file.clone(),
        source: Box::new(source),
    })?;
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

/// Makes the enabled set of the store that `pm` holds the lock of equal `lock`: plans the steps
/// from the committed state ([`plan`]) and carries them out from the `staged` packages, with
/// `hook` taking part in each change; answers the changes. If any step fails, or the result
/// does not equal the lock, the store is returned to where it was first
/// ([`PackageManager::restore`]) before the error is answered.
///
/// Disables come first; one that an enabled package still needs is retried after the others.
/// Then installs, in rounds, so that a dependency is installed before what depends on it. Only
/// a refusal for dependencies is retried; any other failure ends the sync at once.
pub fn apply(
    pm: &PackageManager,
    lock: &LockFile,
    staged: &[StagedPackage],
    hook: &mut dyn LifecycleHook,
) -> Result<Vec<SyncChange>, SyncError> {
    let steps = plan(pm, lock)?;
    let steps = &steps[..];
    let files: BTreeMap<&PackageId, &StagedPackage> =
        staged.iter().map(|s| (&s.locked.id, s)).collect();
    // Every package the steps install must be staged as the version the lock pins.
    let mut pending = Vec::new();
    for step in steps {
        if let SyncStep::Install(l) | SyncStep::Reactivate(l) = step {
            match files.get(&l.id) {
                Some(s) if s.locked == *l => pending.push(*s),
                _ => {
                    return Err(SyncError::NotStaged {
                        package: format!("{} {}", l.id, l.version),
                    })
                }
            }
        }
    }
    let saved = pm.savepoint().map_err(|source| SyncError::Step {
        step: "save the state of",
        package: "the store".to_owned(),
        source: Box::new(source),
    })?;
    let mut done = Vec::new();
    let outcome = run(pm, steps, pending, hook, &mut done).and_then(|()| {
        differences(pm, lock).map_err(|e| ("check", "the store".to_owned(), Box::new(e)))
    });
    match outcome {
        Ok(differs) if differs.is_empty() => Ok(done),
        Ok(differs) => match pm.restore(&saved) {
            Ok(kept) => Err(partly_restored(
                SyncError::Differs {
                    packages: differs.join(", "),
                },
                &kept,
            )),
            Err(restore) => Err(SyncError::DiffersNotRestored {
                packages: differs.join(", "),
                restore: Box::new(restore),
            }),
        },
        Err((step, package, source)) => Err(undo(pm, &saved, step, package, source)),
    }
}

/// The steps that make the enabled set of `pm`'s committed store equal `lock`.
pub fn plan(pm: &PackageManager, lock: &LockFile) -> Result<Vec<SyncStep>, SyncError> {
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
    Ok(plan_sync(lock, &held)?)
}

/// The packages whose enabled version differs from `lock` (missing, another payload, or not
/// named by it), by id.
fn differences(pm: &PackageManager, lock: &LockFile) -> Result<Vec<String>, HostError> {
    let mut differs = std::collections::BTreeSet::new();
    let listed = pm.list()?;
    for p in &listed {
        let enabled = p
            .enabled
            .as_ref()
            .and_then(|e| p.versions.iter().find(|v| &v.version == e));
        match (enabled, lock.get(&p.id)) {
            (None, None) => {}
            (Some(v), Some(l))
                if v.version == l.version && v.payload_digest == l.payload_sha256 => {}
            _ => {
                differs.insert(p.id.to_string());
            }
        }
    }
    for l in lock.packages() {
        if !listed.iter().any(|p| p.id == l.id) {
            differs.insert(l.id.to_string());
        }
    }
    Ok(differs.into_iter().collect())
}

/// A failed step: what it was, on which package, and why.
type Failed = (&'static str, String, Box<HostError>);

/// Carries out a sync's changes, noting each one made in `done`: the disables of `steps` first,
/// then the installation (enabled) of every `pending` package.
fn run(
    pm: &PackageManager,
    steps: &[SyncStep],
    pending: Vec<&StagedPackage>,
    hook: &mut dyn LifecycleHook,
    done: &mut Vec<SyncChange>,
) -> Result<(), Failed> {
    disable_all(pm, steps, hook, done)?;
    install_all(pm, pending, hook, done)
}

/// Disables every package `steps` disables, in rounds: one refused because an enabled package
/// still depends on it is tried again once another disable may have freed it, until a round
/// makes no progress.
fn disable_all(
    pm: &PackageManager,
    steps: &[SyncStep],
    hook: &mut dyn LifecycleHook,
    done: &mut Vec<SyncChange>,
) -> Result<(), Failed> {
    let mut disables: Vec<&PackageId> = steps
        .iter()
        .filter_map(|s| match s {
            SyncStep::Disable(id) => Some(id),
            _ => None,
        })
        .collect();
    while !disables.is_empty() {
        let before = disables.len();
        let mut last = None;
        let mut rest = Vec::new();
        for id in disables {
            match pm.disable_with(id, hook) {
                Ok(version) => done.push(SyncChange::Disabled {
                    id: id.clone(),
                    version,
                }),
                // Another disable may free it; anything else is final.
                Err(e @ HostError::Dependencies { .. }) => {
                    last = Some((id, e));
                    rest.push(id);
                }
                Err(e) => return Err(("disable", id.to_string(), Box::new(e))),
            }
        }
        if rest.len() == before {
            if let Some((id, e)) = last {
                return Err(("disable", id.to_string(), Box::new(e)));
            }
        }
        disables = rest;
    }
    Ok(())
}

/// Installs every `pending` package enabled (enabling it when its version was installed
/// disabled), in rounds: one refused for its dependencies is tried again once a later one may
/// satisfy them, until a round makes no progress.
fn install_all(
    pm: &PackageManager,
    mut pending: Vec<&StagedPackage>,
    hook: &mut dyn LifecycleHook,
    done: &mut Vec<SyncChange>,
) -> Result<(), Failed> {
    while !pending.is_empty() {
        let before = pending.len();
        let mut last = None;
        let mut rest = Vec::new();
        for s in pending {
            let l = &s.locked;
            let installed = pm.install_with(
                &s.file,
                InstallOptions {
                    enable: true,
                    allow_downgrade: true,
                },
                hook,
            );
            match installed {
                Ok(i) if !i.enabled => pm
                    .enable_with(&l.id, hook)
                    .map(drop)
                    .map_err(|e| ("enable", format!("{} {}", l.id, l.version), Box::new(e)))?,
                Ok(_) => {}
                // A dependency installed later in the round may satisfy it; anything else is
                // final.
                Err(e @ HostError::Dependencies { .. }) => {
                    last = Some((format!("{} {}", l.id, l.version), e));
                    rest.push(s);
                    continue;
                }
                Err(e) => return Err(("install", format!("{} {}", l.id, l.version), Box::new(e))),
            }
            done.push(SyncChange::Installed {
                id: l.id.clone(),
                version: l.version.clone(),
            });
        }
        if rest.len() == before {
            if let Some((package, e)) = last {
                return Err(("install", package, Box::new(e)));
            }
        }
        pending = rest;
    }
    Ok(())
}

fn undo(
    pm: &PackageManager,
    saved: &Savepoint,
    step: &'static str,
    package: String,
    source: Box<HostError>,
) -> SyncError {
    match pm.restore(saved) {
        Ok(kept) => partly_restored(
            SyncError::Step {
                step,
                package,
                source,
            },
            &kept,
        ),
        Err(restore) => SyncError::NotRestored {
            step,
            package,
            source,
            restore: Box::new(restore),
        },
    }
}

/// `cause`, or, when the return to the savepoint had to keep versions that running processes
/// loaded, [`SyncError::PartlyRestored`] naming them and the processes.
fn partly_restored(cause: SyncError, kept: &[guild_ports::store::VersionPins]) -> SyncError {
    if kept.is_empty() {
        return cause;
    }
    let kept = kept
        .iter()
        .map(|p| {
            let holders: Vec<String> = p.holders.iter().map(ToString::to_string).collect();
            format!(
                "{}@{} (loaded by {})",
                p.node.id,
                p.node.version,
                holders.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    SyncError::PartlyRestored {
        cause: Box::new(cause),
        kept,
    }
}
