//! The host: the package manager, the plugin loader and the kernel registry, composed so that
//! every lifecycle change is one transaction across all three.
//!
//! Loading a package's library happens only after the package manager has authenticated and
//! verified it, and (for a new version) before the durable commit, from the verified staging
//! tree; what the plugin registered becomes visible to lookups only after the commit succeeded.
//! A failed load or a conflicting registration aborts the change with nothing written.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use guild_adapters_posix::{DlopenLoader, LoaderLogSink, PluginLog};
use guild_domain::distribution::{LockFile, LockRefusal};
use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::lease::{Leased, QuiescentAction};
use guild_domain::manifest::Metadata;
use guild_domain::store_state::RolledBack;
use guild_domain::trust::TrustStore;
use guild_domain::version::{Version, VersionRange};
use guild_ports::loader::{LoadedPlugin, PluginLoader};

use crate::error::HostError;
use crate::models::{BoundModel, ModelRunners, SelectFileError};
use crate::operations::DeviceSupport;
use crate::package_manager::{
    Change, InstallOptions, Installed, LeftOut, LifecycleHook, LoadOrder, OpenReport,
    PackageManager, PackageView, PlannedPackage, Refreshed,
};
use crate::reconcile::{Applied, Pass, PendingCause, PendingChange};
use crate::registry::{
    Drain, KernelRegistry, OwnedRegistry, PreparedPublication, RegistryChangeError,
};
use guild_ports::loader::LoadedLibrary;
use guild_ports::store::StorePin;

/// One package the host loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedSummary {
    /// The package.
    pub id: PackageId,
    /// The version that was loaded (the enabled one).
    pub version: Version,
    /// How many kernels (operation implementations included) its `init` registered.
    pub kernels: usize,
    /// How many model runners its `init` registered.
    pub runners: usize,
}

/// What loading the enabled packages did.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Loaded, in load order.
    pub loaded: Vec<LoadedSummary>,
    /// Packages whose library failed to load or register, with the error.
    pub failed: Vec<(PackageId, Version, HostError)>,
    /// Packages that were not even opened: their dependencies are missing, disabled, failed to
    /// load, or they sit on a cycle.
    pub skipped: Vec<LeftOut>,
    /// Enabled packages not opened because the host's lock ([`HostBuilder::lock`]) does not
    /// admit them: it does not name them, or names another version or payload digest. What
    /// depends on them is in `skipped`.
    pub refused_by_lock: Vec<LockRefused>,
}

/// An enabled package the host's lock file does not admit, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRefused {
    /// The package.
    pub id: PackageId,
    /// Its enabled version.
    pub version: Version,
    /// The payload digest of that version.
    pub payload_digest: Sha256Digest,
    /// Why the lock refuses it.
    pub reason: LockRefusal,
}

/// What one [`Host::refresh`] did to follow the store.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct RefreshReport {
    /// The last committed generation the host had worked through before (every change of it
    /// applied or in [`pending`](RefreshReport::pending)).
    pub from_generation: u64,
    /// The committed generation it follows now.
    pub generation: u64,
    /// New versions authenticated, loaded and published (a version that replaced another
    /// included).
    pub loaded: Vec<LoadedSummary>,
    /// Package versions taken out of the registry: disabled, removed, rolled back from,
    /// replaced, revoked, or failing verification. Their libraries close with their last
    /// bindings.
    pub taken_out: Vec<LeftOut>,
    /// Switches that wait for live bindings to be released: the old version stays in service
    /// (its bindings answer `is_current() == false`) until a later refresh finds them gone.
    pub deferred: Vec<DeferredSwitch>,
    /// Versions taken out because the trust store no longer authenticates them (a revoked key or
    /// payload) while live bindings still run their code: drop those handles.
    pub revoked_live: Vec<RevokedLive>,
    /// Versions whose library failed to load or register at this refresh, with the error. Each
    /// is also in [`pending`](RefreshReport::pending): a later refresh tries again.
    pub failed: Vec<(PackageId, Version, HostError)>,
    /// Enabled versions this host does not load because they fail verification here (or depend
    /// on one that does); a reader records nothing, the next writer does.
    pub unusable: Vec<LeftOut>,
    /// Versions the store now enables that the host's lock does not admit: the host keeps what
    /// it has loaded of those packages and does not switch to them.
    pub refused_by_lock: Vec<LockRefused>,
    /// Every change the store wants that the host has not applied after this refresh, with why
    /// (live bindings, or the error of the last attempt) and when it is tried again: switches
    /// deferred by bindings and failed loads alike. Nothing here is forgotten: later refreshes
    /// (and a [`Host::watch`]er, without waiting for a new commit) retry each until it is
    /// applied or the store no longer wants it.
    pub pending: Vec<PendingChange>,
}

impl RefreshReport {
    /// Whether the refresh changed nothing in the registry and nothing waits.
    pub fn is_quiet(&self) -> bool {
        self.pending.is_empty()
            && self.refused_by_lock.is_empty()
            && self.loaded.is_empty()
            && self.taken_out.is_empty()
            && self.deferred.is_empty()
            && self.revoked_live.is_empty()
            && self.failed.is_empty()
    }
}

/// A switch of a package that live bindings hold, postponed until they are released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeferredSwitch {
    /// The package.
    pub id: PackageId,
    /// The version loaded and still serving.
    pub from: Version,
    /// The version the store now enables, or `None` when the package is to be taken out.
    pub to: Option<Version>,
    /// Live bindings (operation handles, bound kernels or runners) at the check.
    pub bindings: u64,
}

impl fmt::Display for DeferredSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let to = self
            .to
            .as_ref()
            .map_or_else(|| "out".to_owned(), |v| format!("to {v}"));
        write!(
            f,
            "{}@{} switches {to} once its {} live binding(s) are released",
            self.id, self.from, self.bindings
        )
    }
}

/// A revoked version that live bindings still run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedLive {
    /// The package.
    pub id: PackageId,
    /// The revoked version.
    pub version: Version,
    /// Live bindings into it when it was taken out.
    pub bindings: u64,
    /// Why it no longer authenticates.
    pub reason: String,
}

/// A loaded library together with the pin that keeps its files in the store: the pin goes
/// when the library closes (after the last binding into it).
#[derive(Debug)]
struct PinnedLibrary {
    library: Arc<dyn LoadedLibrary>,
    _pin: StorePin,
}

impl LoadedLibrary for PinnedLibrary {
    fn package(&self) -> &PackageId {
        self.library.package()
    }

    fn version(&self) -> &Version {
        self.library.version()
    }
}

/// The host that runners embed: a store of signed packages, the libraries of the enabled ones
/// loaded, and the kernel registry that the operation service resolves against.
///
/// Every lifecycle change made through a `Host` ([`install`](Host::install),
/// [`enable`](Host::enable), [`disable`](Host::disable), [`remove`](Host::remove),
/// [`rollback`](Host::rollback)) is one transaction across the store, the loader and the
/// registry, serialised by the host's lifecycle lock. Lookups and operation calls never take that
/// lock. A `Host` reads its store without the store's lock (one committed generation at a time)
/// and takes the lock only for the one transaction of a change it makes itself, so `guild`
/// commands and other runners use the store while it serves. Each version it loads is pinned
/// (its files stay while the library is loaded), and [`Host::refresh`] or a
/// [`Host::watch`]er follows what others commit.
///
/// # Examples
///
/// Open a store that `guild install` filled, load what is enabled and report it:
///
/// ```no_run
/// use guild_host::{Host, OpenedHost};
///
/// # fn main() -> Result<(), guild_host::HostError> {
/// let OpenedHost { host, report } = Host::builder("/var/lib/guild").open()?;
/// for q in &report.store.disabled {
///     eprintln!("{} {} was disabled while opening: {}", q.id, q.version, q.reason);
/// }
/// for p in &report.loaded.loaded {
///     println!("loaded {} {} ({} kernels)", p.id, p.version, p.kernels);
/// }
/// for (id, version, error) in &report.loaded.failed {
///     eprintln!("{id} {version} did not load: {error}");
/// }
/// // Resolve operations through `guild_host::OperationService::new(host.kernels())`.
/// # drop(host);
/// # Ok(())
/// # }
/// ```
pub struct Host {
    packages: PackageManager,
    kernels: OwnedRegistry,
    loader: Box<dyn PluginLoader>,
    /// The provider lifecycle lock: loading, publication, enable, disable, remove and rollback
    /// are serialised by it. Lookups never take it.
    lifecycle: Mutex<()>,
    /// What the host has applied of the store (the generation it worked through) and what it
    /// still owes, kept apart from what the package manager has read ([`crate::reconcile`]).
    applied: Mutex<Applied>,
    /// The store's crash records and quarantine, when the host was opened on a store directory.
    crashes: Option<crate::crash_quarantine::Quarantine>,
    /// When set, [`Host::load_enabled`] opens only the enabled packages this lock admits.
    lock: Option<Arc<LockFile>>,
    /// The [`Host::watch`] threads, woken when a call on another thread records a retry due
    /// before the one they sleep toward.
    watchers: Mutex<Vec<WatchWake>>,
}

/// How to wake one watch thread: its channel, and until when it sleeps (`None` while it
/// refreshes). The thread sets the time under its lock while it reads the next retry, so a
/// retry recorded after that read finds the time set and wakes it: no wake-up is lost.
struct WatchWake {
    tx: std::sync::mpsc::Sender<bool>,
    asleep_until: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("packages", &self.packages)
            .field("kernels", &self.kernels)
            .finish_non_exhaustive()
    }
}

impl Host {
    /// Composes a host from a package manager and a loader. Nothing is loaded yet: call
    /// [`Host::load_enabled`].
    pub fn new(packages: PackageManager, loader: Box<dyn PluginLoader>) -> Self {
        Self::with_devices(packages, loader, DeviceSupport::host())
    }

    /// As [`Host::new`], with the operation service resolving against `devices` (the device
    /// adapter that records stream work, and what the GPUs offer).
    pub fn with_devices(
        packages: PackageManager,
        loader: Box<dyn PluginLoader>,
        devices: DeviceSupport,
    ) -> Self {
        // What the package manager has read now is what `load_enabled` works from. When it
        // cannot be told, 0: the first refresh then works through the committed plan.
        let generation = packages.generation().unwrap_or(0);
        Host {
            packages,
            kernels: OwnedRegistry::with_devices(devices),
            loader,
            lifecycle: Mutex::new(()),
            applied: Mutex::new(Applied::new(generation)),
            crashes: None,
            lock: None,
            watchers: Mutex::new(Vec::new()),
        }
    }

    /// Wakes every watch thread that sleeps past the earliest retry the host now owes.
    fn wake_watchers(&self) {
        let Some(at) = self.applied().next_retry() else {
            return;
        };
        let mut watchers = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        watchers.retain(|w| {
            let asleep = *w.asleep_until.lock().unwrap_or_else(|e| e.into_inner());
            match asleep {
                Some(until) if at < until => w.tx.send(true).is_ok(),
                // Awake (refreshing) or due to wake in time: kept while its thread lives.
                _ => true,
            }
        });
    }

    /// Loads only what `lock` admits from now on: [`Host::load_enabled`] leaves every enabled
    /// package that the lock does not name, or names with another version or payload digest,
    /// unopened, and reports it in [`LoadReport::refused_by_lock`].
    pub fn under_lock(mut self, lock: LockFile) -> Self {
        self.lock = Some(Arc::new(lock));
        self
    }

    /// Starts a [`HostBuilder`] for the store at `dir`: it says what the host is wired with (the
    /// plugin loader, the devices, where plugins' log records go) and
    /// [`open`](HostBuilder::open)s it.
    pub fn builder(dir: impl Into<PathBuf>) -> HostBuilder {
        HostBuilder::new(dir.into())
    }

    /// The simple path: `Host::builder(dir).open()` with every default (the dlopen loader,
    /// plugins' log records dropped, devices detected, every enabled package loaded, the store
    /// required to exist), its
    /// reports returned as a tuple and the reason there is no CUDA device dropped. Use
    /// [`Host::builder`] to choose any of these or to keep that reason.
    pub fn open_dir(dir: &Path) -> Result<(Host, OpenReport, LoadReport), HostError> {
        let OpenedHost { host, report } = Host::builder(dir).open()?;
        Ok((host, report.store, report.loaded))
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lifecycle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The package manager's queries (`list`, `metadata`, `trust`, leases). Lifecycle changes
    /// are the host's own methods, so that the registry takes part in each of them.
    pub fn packages(&self) -> PackageView<'_> {
        PackageView::new(&self.packages)
    }

    /// Applies `change` to the trust store and commits it durably
    /// ([`PackageManager::update_trust`]). Revocations take effect for loaded packages at
    /// [`Host::reverify`] (or the next open).
    pub fn update_trust<T>(
        &self,
        change: impl FnOnce(&mut TrustStore) -> Result<T, HostError>,
    ) -> Result<T, HostError> {
        let _lifecycle = self.lock();
        self.packages.update_trust(change)
    }

    /// The kernel registry: lookups, bindings, and the operation service
    /// ([`OperationService::new`](crate::OperationService::new) and
    /// [`KernelRegistry::operation_api`]).
    pub fn kernels(&self) -> &KernelRegistry {
        &self.kernels
    }

    /// Model runner selection over this host's runners: [`ModelRunners::select`]
    /// chooses the runner for an opened model and binds it, and the bound model holds the
    /// runner's package like any binding (see [`crate::models`]).
    pub fn models(&self) -> ModelRunners<'_> {
        ModelRunners::new(&self.kernels)
    }

    /// Opens the model file at `path` with the host's GGUF reader and selects and binds its
    /// runner: [`ModelRunners::select_file`] on [`Host::models`].
    pub fn open_model(&self, path: &Path) -> Result<BoundModel, SelectFileError> {
        self.models().select_file(path)
    }

    /// Explicit session leases plus live bindings into any loaded version of `id`.
    pub fn active_package_leases(&self, id: &PackageId) -> u64 {
        self.packages.active_package_leases(id).total() + self.kernels.live_bindings(id)
    }

    /// Loads every enabled package that is not loaded yet, dependencies first. A package whose
    /// dependency failed is not opened at all. One that fails to load is pending (see
    /// [`RefreshReport::pending`]): later refreshes try it again.
    pub fn load_enabled(&self) -> Result<LoadReport, HostError> {
        let _lifecycle = self.lock();
        let plan = self.packages.load_plan()?;
        let mut report = LoadReport {
            skipped: plan.blocked,
            ..LoadReport::default()
        };
        let mut unusable: BTreeSet<PackageId> =
            report.skipped.iter().map(|q| q.id.clone()).collect();
        let mut failed = Vec::new();
        for planned in plan.order {
            if self.kernels.loaded_version(&planned.id).as_ref() == Some(&planned.version) {
                continue;
            }
            // Opening read no tree: one that is damaged is found here, and neither it nor what
            // depends on it is opened.
            let metadata = match self
                .packages
                .installed_metadata(&planned.id, &planned.version)
            {
                Ok(metadata) => metadata,
                Err(e) => {
                    unusable.insert(planned.id.clone());
                    let cause = PendingCause::Failed {
                        error: e.to_string(),
                    };
                    failed.push((planned.id.clone(), planned.version.clone(), cause));
                    report.failed.push((planned.id, planned.version, e));
                    continue;
                }
            };
            let m = metadata.manifest();
            let needs: Vec<&PackageId> = m
                .dependencies
                .iter()
                .map(|d| &d.package_id)
                .chain(
                    m.module_dependencies
                        .iter()
                        .filter(|d| d.is_runtime_edge())
                        .map(|d| &d.module_id),
                )
                .collect();
            if let Some(refused) = self.lock_refusal(&planned.id, &planned.version, &metadata) {
                unusable.insert(planned.id.clone());
                report.refused_by_lock.push(refused);
                continue;
            }
            if let Some(dep) = needs.into_iter().find(|d| unusable.contains(*d)) {
                report.skipped.push(LeftOut {
                    id: planned.id.clone(),
                    version: planned.version.clone(),
                    reason: format!("its dependency {dep} could not be loaded"),
                });
                unusable.insert(planned.id.clone());
                continue;
            }
            match self.load_planned(&planned, &metadata) {
                Ok((kernels, runners)) => report.loaded.push(LoadedSummary {
                    id: planned.id,
                    version: planned.version,
                    kernels,
                    runners,
                }),
                Err(e) => {
                    unusable.insert(planned.id.clone());
                    let cause = PendingCause::Failed {
                        error: e.to_string(),
                    };
                    failed.push((planned.id.clone(), planned.version.clone(), cause));
                    report.failed.push((planned.id, planned.version, e));
                }
            }
        }
        if !failed.is_empty() {
            self.record_failed_loads(failed);
        }
        Ok(report)
    }

    /// Loads `planned`, described by `metadata`, into the kernel registry for
    /// [`Host::load_enabled`]: still authenticated by today's trust store, then loaded from its
    /// installed tree and published. Answers how many kernels and runners it registered.
    fn load_planned(
        &self,
        planned: &PlannedPackage,
        metadata: &Metadata,
    ) -> Result<(usize, usize), HostError> {
        self.packages
            .check_loadable(&planned.id, &planned.version)
            .and_then(|()| {
                self.load(
                    &planned.id,
                    &planned.version,
                    &planned.dir,
                    metadata,
                    LoadFrom::Installed,
                )
            })
            .and_then(|plugin| {
                let (kernels, runners) = (plugin.kernels.len(), plugin.runners.len());
                let prepared = self
                    .kernels
                    .prepare(&planned.id, &planned.version, plugin, true)?;
                self.kernels.commit(prepared);
                Ok((kernels, runners))
            })
    }

    /// Records the loads [`Host::load_enabled`] could not make as changes still owed, for later
    /// refreshes to try again, and wakes the watchers.
    fn record_failed_loads(&self, failed: Vec<(PackageId, Version, PendingCause)>) {
        let now = Instant::now();
        let mut applied = self.applied();
        for (id, version, cause) in failed {
            let from = self.kernels.loaded_version(&id);
            applied.record(&id, from, Some(version), cause, now);
        }
        drop(applied);
        self.wake_watchers();
    }

    /// The full check of every enabled package ([`PackageManager::reverify`]): its signatures
    /// against today's trust store and all its files against the signed manifest, across the
    /// machine's cores; what fails (and what depends on it) is disabled in the store and taken
    /// out of the kernel registry (its libraries close with their last bindings).
    pub fn reverify(&self) -> Result<Vec<LeftOut>, HostError> {
        let _lifecycle = self.lock();
        let disabled = self.packages.reverify()?;
        for q in &disabled {
            // A package that was never loaded has nothing to unload.
            let _ = self.kernels.unload(&q.id);
        }
        Ok(disabled)
    }

    /// Checks that every dependency of `id@version` (package dependencies and runtime module
    /// edges) is loaded in this host at a version in range, so that a package is never opened
    /// while what it builds on is missing from the registry (the store's graph can be satisfied
    /// by a dependency whose own load failed).
    fn check_dependencies_loaded(
        &self,
        id: &PackageId,
        version: &Version,
        metadata: &Metadata,
    ) -> Result<(), HostError> {
        for (dependency, range) in needs(metadata) {
            let loaded = self.kernels.loaded_version(dependency);
            if !loaded.as_ref().is_some_and(|v| range.contains(v)) {
                return Err(HostError::DependencyNotLoaded {
                    package: format!("{id}@{version}"),
                    dependency: dependency.clone(),
                    range: range.to_string(),
                    loaded,
                });
            }
        }
        Ok(())
    }

    /// Opens a verified tree's entry library through the loader and checks what it registered,
    /// with the same code the command line's child-process check runs
    /// ([`crate::registration::load_checked`]).
    fn load(
        &self,
        id: &PackageId,
        version: &Version,
        dir: &Path,
        metadata: &Metadata,
        from: LoadFrom,
    ) -> Result<LoadedPlugin, HostError> {
        // Pinned before its files are hashed and its library opens, for as long as it is loaded,
        // so that no other process deletes the tree in between.
        let pin = match from {
            LoadFrom::Installed => self.packages.pin(id, version)?,
            LoadFrom::Change => self.packages.pin_installing(id, version)?,
        };
        // Opening the store hashed nothing: the files are checked against the signed manifest
        // here, right before the loader opens them (a mismatch taints the version). A
        // change has just checked them itself, under the package manager's lock that this hook
        // runs in: install hashes every file as it extracts it, enable, rollback and
        // reactivation re-hash the installed tree (`verified_installed`).
        if from == LoadFrom::Installed {
            self.packages.check_files_before_load(id, version)?;
        }
        // A build whose init killed a process is refused; any other runs under a durable record
        // that outlives this process only if init does not return (crate::crash_quarantine).
        let digest = metadata.payload_digest();
        let loading = match &self.crashes {
            Some(quarantine) => {
                if let Some(refused) = quarantine.refusal(&digest) {
                    return Err(refused.into());
                }
                Some(quarantine.begin(id, version, &digest)?)
            }
            None => None,
        };
        let loaded = crate::registration::load_checked(
            &*self.loader,
            id,
            version,
            dir,
            metadata,
            self.packages.platform().kernel_abi,
            // Every plugin gets the service through its host table's tail; the library keeps
            // the service's core alive until it is closed.
            Some(self.kernels.plugin_service()),
        );
        drop(loading);
        if let (Ok(_), Some(quarantine)) = (&loaded, &self.crashes) {
            // Another build of the package loaded: the quarantine of its crashed ones is lifted.
            quarantine.loaded(id, &digest);
        }
        let mut plugin = loaded?;
        plugin.library = Arc::new(PinnedLibrary {
            library: plugin.library,
            _pin: pin,
        });
        Ok(plugin)
    }

    /// Follows the store: works toward the newest committed generation from what this host has
    /// applied (when nothing changed and nothing is owed, a few small reads: the registry file
    /// and the trust file it names). It authenticates and loads new versions, takes disabled,
    /// removed, rolled-back and revoked versions out, and publishes the result.
    ///
    /// Nothing the store wants is forgotten. A package with live bindings is switched only once
    /// they are released: it is reported in [`RefreshReport::deferred`], its bindings answer
    /// `is_current() == false`, and every later refresh checks again. A switch that fails (the
    /// library does not load, its `init` fails, a pin or a crash record cannot be written) is in
    /// [`RefreshReport::failed`] and stays in [`RefreshReport::pending`] with its cause; later
    /// refreshes try it again after a delay that doubles from 50 ms up to 5 s
    /// ([`crate::reconcile`]). A refresh that fails (an error is returned) leaves the host's
    /// applied generation where it was, so the next refresh works through the same committed
    /// state again, whatever the package manager has read meanwhile. A switch that waits for a
    /// loaded dependent which itself waits for the switch (a module holding handles into its
    /// dependency) is not waited on: the dependent is taken out first (see `break_cycles`). A
    /// revoked version is taken out at once whatever holds it (new resolutions no longer find
    /// it); the bindings that still run it are in [`RefreshReport::revoked_live`].
    pub fn refresh(&self) -> Result<RefreshReport, HostError> {
        let _lifecycle = self.lock();
        let now = Instant::now();
        let outcome = self
            .packages
            .refresh()
            .and_then(|refreshed| self.reconcile(refreshed, now));
        match &outcome {
            Ok(_) => self.applied().unstall(),
            Err(_) => self.applied().stall(now),
        }
        self.wake_watchers();
        outcome
    }

    /// One pass of [`Host::refresh`] from the host's applied state toward `refreshed`, the
    /// package manager's committed state; runs under the lifecycle lock.
    fn reconcile(&self, refreshed: Refreshed, now: Instant) -> Result<RefreshReport, HostError> {
        let (from_generation, due, mut unusable) = {
            let mut applied = self.applied();
            (
                applied.generation(),
                applied.due(now),
                applied.take_unusable(),
            )
        };
        unusable.extend(refreshed.unusable);
        let mut report = RefreshReport {
            from_generation,
            generation: refreshed.generation,
            unusable,
            ..RefreshReport::default()
        };
        if from_generation == refreshed.generation && !due {
            report.pending = self.applied().report(now);
            return Ok(report);
        }
        // Revocations first: they need nothing but the trust check, so no fault further on
        // (the crash records, the load plan) can keep revoked code reachable.
        self.take_out_distrusted(&mut report);
        let plan = self.plan_to_follow(&mut report)?;
        let held = self.held_by_lock(&plan.order, &mut report);
        let mut pass = self.applied().pass();
        self.take_out_unwanted(&plan.order, &held, &mut report, &mut pass, now);
        self.load_wanted(&plan.order, &held, &mut report, &mut pass, now);
        self.break_cycles(&plan.order, &held, &mut report, &mut pass, now);
        let mut applied = self.applied();
        applied.complete(refreshed.generation, pass.finish());
        report.pending = applied.report(now);
        Ok(report)
    }

    /// The load plan a pass of [`Host::reconcile`] follows, read once the crash records are
    /// read again. When either cannot be read, what the package manager reported unusable at
    /// this refresh is kept for the next report.
    fn plan_to_follow(&self, report: &mut RefreshReport) -> Result<LoadOrder, HostError> {
        // Something may load: what other processes quarantined since is refused too.
        let plan = self
            .crashes
            .as_ref()
            .map_or(Ok(()), |quarantine| {
                quarantine.reread().map_err(HostError::from)
            })
            .and_then(|()| self.packages.load_plan());
        match plan {
            Ok(plan) => Ok(plan),
            Err(e) => {
                // The package manager reports what it cannot use once, at the refresh that read
                // it: the next report says it instead of this one.
                self.applied()
                    .keep_unusable(std::mem::take(&mut report.unusable));
                Err(e)
            }
        }
    }

    /// The packages of `order` that the host's lock holds where they are, because it does not
    /// admit the planned version; each refusal is reported. None for a host without a lock.
    fn held_by_lock(
        &self,
        order: &[PlannedPackage],
        report: &mut RefreshReport,
    ) -> BTreeSet<PackageId> {
        // A host under a lock follows the store only where the lock admits the new version;
        // elsewhere it keeps what it has.
        let mut held = BTreeSet::new();
        for planned in order.iter().filter(|_| self.lock.is_some()) {
            let refused = self
                .packages
                .metadata(&planned.id, &planned.version)
                .and_then(|m| self.lock_refusal(&planned.id, &planned.version, &m));
            if let Some(refused) = refused {
                held.insert(planned.id.clone());
                report.refused_by_lock.push(refused);
            }
        }
        held
    }

    /// Takes out the loaded packages that the plan `order` no longer wants at all, unless a lock
    /// holds them; one that live bindings hold is deferred, and one that cannot be drained is
    /// recorded as failed. A package the plan wants at another version is left to
    /// [`Host::load_wanted`].
    fn take_out_unwanted(
        &self,
        order: &[PlannedPackage],
        held: &BTreeSet<PackageId>,
        report: &mut RefreshReport,
        pass: &mut Pass,
        now: Instant,
    ) {
        let wanted: BTreeMap<&PackageId, &Version> =
            order.iter().map(|p| (&p.id, &p.version)).collect();
        // What the new generation no longer wants loaded (or wants at another version).
        for (id, version) in self.kernels.loaded_packages() {
            let to = wanted.get(&id).map(|v| (*v).clone());
            if to.as_ref() == Some(&version) {
                self.kernels.set_superseded(&id, false);
                continue;
            }
            // A lock holds back a switch, never a revocation (taken out before the plan).
            if held.contains(&id) {
                continue;
            }
            if to.is_some() {
                continue; // A switch: the loading pass below decides.
            }
            match self.kernels.drain(&id) {
                Ok(drain) => {
                    let _ = self.kernels.unload(&id);
                    drain.finish();
                    report.taken_out.push(LeftOut {
                        id,
                        version,
                        reason: "the store no longer enables it".to_owned(),
                    });
                }
                Err(RegistryChangeError::Bound { bindings, .. }) => {
                    self.defer(report, pass, now, id, version, None, bindings);
                }
                Err(e) => {
                    let cause = PendingCause::Failed {
                        error: HostError::from(e).to_string(),
                    };
                    pass.record(&id, Some(version), None, cause, now);
                }
            }
        }
    }

    /// The loading pass: loads each package of the plan `order` at its planned version, or
    /// switches it there, unless a lock holds it, live bindings defer the switch, or it failed a
    /// moment ago and nothing it needs changed since. Runs after [`Host::take_out_unwanted`].
    fn load_wanted(
        &self,
        order: &[PlannedPackage],
        held: &BTreeSet<PackageId>,
        report: &mut RefreshReport,
        pass: &mut Pass,
        now: Instant,
    ) {
        // Packages loaded or taken out by this pass: a failed switch that needs one of them is
        // tried again at once, whatever its delay.
        let mut changed: BTreeSet<PackageId> =
            report.taken_out.iter().map(|q| q.id.clone()).collect();
        for planned in order {
            let current = self.kernels.loaded_version(&planned.id);
            if current.as_ref() == Some(&planned.version) || held.contains(&planned.id) {
                continue;
            }
            let bindings = self.kernels.live_bindings(&planned.id);
            if let (Some(from), true) = (&current, bindings > 0) {
                let (id, from) = (planned.id.clone(), from.clone());
                let to = Some(planned.version.clone());
                self.defer(report, pass, now, id, from, to, bindings);
                continue;
            }
            let after_change = changed.contains(&planned.id)
                || self
                    .packages
                    .metadata(&planned.id, &planned.version)
                    .is_some_and(|m| needs(&m).any(|(d, _)| changed.contains(d)));
            if !after_change && !pass.should_try(&planned.id, Some(&planned.version), now) {
                // It failed a moment ago: tried again once its delay is over.
                pass.keep(&planned.id);
                continue;
            }
            match self.switch_to(planned, current.is_some()) {
                Ok(Switched::Loaded(summary)) => {
                    changed.insert(planned.id.clone());
                    if let Some(from) = current {
                        report.taken_out.push(LeftOut {
                            id: planned.id.clone(),
                            version: from,
                            reason: format!("replaced by {}", planned.version),
                        });
                    }
                    report.loaded.push(summary);
                }
                Ok(Switched::Bound(bindings)) => {
                    let (id, to) = (planned.id.clone(), Some(planned.version.clone()));
                    let from = current.unwrap_or_else(|| planned.version.clone());
                    self.defer(report, pass, now, id, from, to, bindings);
                }
                Err(e) => {
                    let cause = PendingCause::Failed {
                        error: e.to_string(),
                    };
                    let to = Some(planned.version.clone());
                    pass.record(&planned.id, current, to, cause, now);
                    report
                        .failed
                        .push((planned.id.clone(), planned.version.clone(), e));
                }
            }
        }
    }

    /// Breaks the cycles of waiting the loading pass leaves behind. A switch deferred by live
    /// bindings may be held by a loaded dependent that the store wants changed too (a module
    /// keeps the handles it resolved into its dependency for as long as it is loaded) and whose
    /// new version needs the dependency's new one: neither can go first, so waiting would never
    /// end. The dependents go first: each one that nothing binds (and that nothing loaded
    /// depends on) is taken out, so that its library closes and lets go; then the dependency
    /// switches, and the dependents load at the versions the store enables.
    ///
    /// When the dependency is still bound with them out (a runner holds it too), they are put
    /// back as they were, and the attempt is not made again until the dependency's binding
    /// count changes.
    fn break_cycles(
        &self,
        order: &[PlannedPackage],
        held: &BTreeSet<PackageId>,
        report: &mut RefreshReport,
        pass: &mut Pass,
        now: Instant,
    ) {
        let planned = |id: &PackageId| order.iter().find(|p| &p.id == id);
        let waiting: Vec<DeferredSwitch> = report
            .deferred
            .iter()
            .filter(|d| d.to.is_some())
            .cloned()
            .collect();
        for switch in waiting {
            let Some(target) = planned(&switch.id) else {
                continue;
            };
            let bindings = self.kernels.live_bindings(&switch.id);
            if !pass.cycle_worth_trying(&switch.id, bindings) {
                continue;
            }
            let dependents = self.dependents_in_the_way(&switch.id, order, held);
            // A dependent switched by the loading pass may have let go already.
            let dependents = if bindings == 0 {
                Vec::new()
            } else {
                dependents
            };
            let out = self.take_out_unbound(dependents);
            if out.is_empty() && bindings > 0 {
                continue;
            }
            match self.switch_to(target, true) {
                Ok(Switched::Loaded(summary)) => {
                    report.deferred.retain(|d| d.id != switch.id);
                    pass.forget(&switch.id);
                    report.taken_out.push(LeftOut {
                        id: switch.id.clone(),
                        version: switch.from.clone(),
                        reason: format!("replaced by {}", target.version),
                    });
                    report.loaded.push(summary);
                    let reason = format!(
                        "taken out first so that {}@{}, which it depends on and may hold, could \
                         switch to {}",
                        switch.id, switch.from, target.version
                    );
                    self.load_taken_out(out, &reason, order, report, pass, now);
                }
                outcome => {
                    // The dependency is bound by more than its dependents (or its new version
                    // failed): they are put back as they were.
                    if let Err(e) = outcome {
                        let cause = PendingCause::Failed {
                            error: e.to_string(),
                        };
                        let (from, to) = (Some(switch.from.clone()), switch.to.clone());
                        pass.record(&switch.id, from, to, cause, now);
                        report
                            .failed
                            .push((switch.id.clone(), target.version.clone(), e));
                    }
                    pass.cycle_tried(&switch.id, bindings);
                    for (dependent, at) in out {
                        self.restore_dependent(
                            &dependent,
                            at,
                            planned(&dependent),
                            report,
                            pass,
                            now,
                        );
                    }
                }
            }
        }
    }

    /// The loaded dependents of `id` that keep its deferred switch waiting and can go first:
    /// each needs `id`, is not at the version the plan `order` wants, is not held by the lock,
    /// and has no loaded dependent of its own.
    fn dependents_in_the_way(
        &self,
        id: &PackageId,
        order: &[PlannedPackage],
        held: &BTreeSet<PackageId>,
    ) -> Vec<(PackageId, Version)> {
        let planned = |id: &PackageId| order.iter().find(|p| &p.id == id);
        let loaded = self.kernels.loaded_packages();
        let needs_of = |id: &PackageId, at: &Version, on: &PackageId| {
            self.packages
                .metadata(id, at)
                .is_some_and(|m| needs(&m).any(|(d, _)| d == on))
        };
        loaded
            .iter()
            .filter(|(d, at)| {
                d != id
                    && !held.contains(d)
                    && planned(d).map(|p| &p.version) != Some(at)
                    && needs_of(d, at, id)
                    && !loaded.iter().any(|(e, e_at)| needs_of(e, e_at, d))
            })
            .cloned()
            .collect()
    }

    /// Takes out each of `dependents` that nothing binds, so that its library closes and lets
    /// go of what it holds; answers those taken out.
    fn take_out_unbound(&self, dependents: Vec<(PackageId, Version)>) -> Vec<(PackageId, Version)> {
        let mut out = Vec::new();
        for (dependent, at) in dependents {
            // Bound by the runner: it stays, and so may what it holds.
            let Ok(drain) = self.kernels.drain(&dependent) else {
                continue;
            };
            let _ = self.kernels.unload(&dependent);
            drain.finish();
            out.push((dependent, at));
        }
        out
    }

    /// Reports the dependents [`Host::break_cycles`] took out (`out`) as taken out for `reason`,
    /// and loads each at the version the plan `order` wants, now that the dependency they need
    /// has switched.
    fn load_taken_out(
        &self,
        out: Vec<(PackageId, Version)>,
        reason: &str,
        order: &[PlannedPackage],
        report: &mut RefreshReport,
        pass: &mut Pass,
        now: Instant,
    ) {
        for (dependent, at) in out {
            report.taken_out.push(LeftOut {
                id: dependent.clone(),
                version: at,
                reason: reason.to_owned(),
            });
            // Its own switch failed in the loading pass for want of the new dependency, which
            // is loaded now.
            report.failed.retain(|(id, ..)| id != &dependent);
            pass.forget(&dependent);
            if let Some(planned) = order.iter().find(|p| p.id == dependent) {
                self.load_or_record(planned, report, pass, now);
            }
        }
    }

    /// Loads `dependent` again at `at`, the version it served before [`Host::break_cycles`]
    /// took it out for nothing; `wanted` is what the store enables of it. Should the load fail
    /// (its `init` fails this time, its files no longer check), it stays out, reported, and its
    /// change to `wanted` stays owed.
    fn restore_dependent(
        &self,
        dependent: &PackageId,
        at: Version,
        wanted: Option<&PlannedPackage>,
        report: &mut RefreshReport,
        pass: &mut Pass,
        now: Instant,
    ) {
        let restored = self.packages.planned(dependent, &at);
        match self.switch_to(&restored, false) {
            Ok(Switched::Loaded(summary)) => {
                report.loaded.push(summary);
                // Still not what the store wants.
                self.kernels.set_superseded(dependent, true);
            }
            // Nothing is replaced, so nothing is drained.
            Ok(Switched::Bound(_)) => {}
            Err(e) => {
                report.taken_out.push(LeftOut {
                    id: dependent.clone(),
                    version: at.clone(),
                    reason: format!(
                        "taken out to free its dependency for a switch, and loading it again \
                         failed: {e}"
                    ),
                });
                let cause = PendingCause::Failed {
                    error: e.to_string(),
                };
                let to = wanted.map(|p| p.version.clone());
                pass.record(dependent, None, to, cause, now);
                report.failed.push((dependent.clone(), at, e));
            }
        }
    }

    /// Loads `planned` (whose package is not loaded); a failure is reported and owed.
    fn load_or_record(
        &self,
        planned: &PlannedPackage,
        report: &mut RefreshReport,
        pass: &mut Pass,
        now: Instant,
    ) {
        match self.switch_to(planned, false) {
            Ok(Switched::Loaded(summary)) => report.loaded.push(summary),
            // Nothing is replaced, so nothing is drained.
            Ok(Switched::Bound(_)) => {}
            Err(e) => {
                let cause = PendingCause::Failed {
                    error: e.to_string(),
                };
                let to = Some(planned.version.clone());
                pass.record(&planned.id, None, to, cause, now);
                report
                    .failed
                    .push((planned.id.clone(), planned.version.clone(), e));
            }
        }
    }

    /// Takes out every loaded version that is no longer authenticated (its key or payload
    /// revoked), whatever holds it: new resolutions no longer find it, and the bindings that
    /// still run it are reported in `revoked_live`.
    ///
    /// A loaded package that depends on a revoked version may be what still runs it (a module
    /// keeps handles into its dependency): such a dependent is taken out too, unless something
    /// binds it, so that its library closes and lets go; the loading pass that follows loads it
    /// again over what the store now enables. What still binds the revoked version after that
    /// is the runner's, and `revoked_live` counts it.
    fn take_out_distrusted(&self, report: &mut RefreshReport) {
        for (id, version) in self.kernels.loaded_packages() {
            let reason = match self.packages.check_loadable(&id, &version) {
                Err(e @ HostError::Unauthenticated { .. }) => e.to_string(),
                _ => continue,
            };
            let unloaded = self.kernels.unload(&id);
            report.taken_out.push(LeftOut {
                id: id.clone(),
                version: version.clone(),
                reason: format!("no longer authenticated: {reason}"),
            });
            if !unloaded.is_ok_and(|u| u.deferred_bindings > 0) {
                continue;
            }
            self.take_out_dependents_of(&id, &version, report);
            let bindings = self.kernels.live_bindings_of(&id, &version);
            if bindings > 0 {
                report.revoked_live.push(RevokedLive {
                    id,
                    version,
                    bindings,
                    reason,
                });
            }
        }
    }

    /// Takes out every loaded package that depends on `id` (revoked at `version`) and that
    /// nothing binds; see [`Host::take_out_distrusted`].
    fn take_out_dependents_of(
        &self,
        id: &PackageId,
        version: &Version,
        report: &mut RefreshReport,
    ) {
        for (dependent, at) in self.kernels.loaded_packages() {
            let depends = self
                .packages
                .metadata(&dependent, &at)
                .is_some_and(|m| needs(&m).any(|(d, _)| d == id));
            if !depends {
                continue;
            }
            // Bound by the runner: its handles keep the dependent, and the revoked bindings
            // it may hold are counted in `revoked_live`.
            let Ok(drain) = self.kernels.drain(&dependent) else {
                continue;
            };
            let _ = self.kernels.unload(&dependent);
            drain.finish();
            report.taken_out.push(LeftOut {
                id: dependent,
                version: at,
                reason: format!("it depends on {id}@{version}, revoked, and may hold its code"),
            });
        }
    }

    /// Why the host's lock, if it has one, does not admit `id@version` with `metadata`'s
    /// payload.
    fn lock_refusal(
        &self,
        id: &PackageId,
        version: &Version,
        metadata: &Metadata,
    ) -> Option<LockRefused> {
        let lock = self.lock.as_ref()?;
        let payload_digest = metadata.payload_digest();
        let reason = lock.admits(id, version, &payload_digest).err()?;
        Some(LockRefused {
            id: id.clone(),
            version: version.clone(),
            payload_digest,
            reason,
        })
    }

    fn applied(&self) -> MutexGuard<'_, Applied> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that the switch of `id` from `from` to `to` waits for `bindings` live bindings:
    /// they answer `is_current() == false` from now on, and every refresh checks again.
    #[allow(clippy::too_many_arguments)]
    fn defer(
        &self,
        report: &mut RefreshReport,
        pass: &mut Pass,
        now: Instant,
        id: PackageId,
        from: Version,
        to: Option<Version>,
        bindings: u64,
    ) {
        self.kernels.set_superseded(&id, true);
        let cause = PendingCause::Bound { bindings };
        pass.record(&id, Some(from.clone()), to.clone(), cause, now);
        report.deferred.push(DeferredSwitch {
            id,
            from,
            to,
            bindings,
        });
    }

    /// Loads `planned` and publishes it, replacing the loaded version when `replaces` (which
    /// must then have no live binding at the drain).
    fn switch_to(&self, planned: &PlannedPackage, replaces: bool) -> Result<Switched, HostError> {
        let metadata = self
            .packages
            .metadata(&planned.id, &planned.version)
            .ok_or_else(|| HostError::InstalledTree {
                package: format!("{}@{}", planned.id, planned.version),
                path: planned.dir.clone(),
                problem: "its metadata was not loaded".into(),
            })?;
        self.packages
            .check_loadable(&planned.id, &planned.version)?;
        self.check_dependencies_loaded(&planned.id, &planned.version, &metadata)?;
        let plugin = self.load(
            &planned.id,
            &planned.version,
            &planned.dir,
            &metadata,
            LoadFrom::Installed,
        )?;
        let (kernels, runners) = (plugin.kernels.len(), plugin.runners.len());
        let prepared = self
            .kernels
            .prepare(&planned.id, &planned.version, plugin, true)?;
        let drain = if replaces {
            match self.kernels.drain(&planned.id) {
                Ok(drain) => Some(drain),
                // Dropping the prepared publication closes the new library again.
                Err(RegistryChangeError::Bound { bindings, .. }) => {
                    return Ok(Switched::Bound(bindings))
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            None
        };
        self.kernels.commit(prepared);
        if let Some(drain) = drain {
            drain.finish();
        }
        Ok(Switched::Loaded(LoadedSummary {
            id: planned.id.clone(),
            version: planned.version.clone(),
            kernels,
            runners,
        }))
    }

    /// How long until the host owes a retry: of a failed refresh, a failed switch or a deferred
    /// one; `None` when it owes nothing.
    fn next_retry_in(&self) -> Option<Duration> {
        let at = self.applied().next_retry()?;
        Some(at.saturating_duration_since(Instant::now()))
    }

    /// Starts following the store in the background: a thread that calls [`Host::refresh`]
    /// whenever a new generation is committed (an inotify watch on the registry file, through
    /// the file-system adapter), also every `fallback` in case a notification was lost, and,
    /// while the host owes a change (a refresh or a switch that failed, a switch deferred by
    /// bindings), whenever its retry is due ([`RefreshReport::pending`]), without waiting for a
    /// commit. `on_refresh` sees each report that did something or still owes something (not
    /// quiet) and each failure. The thread holds the host weakly and ends when the watcher is
    /// dropped or the host is.
    pub fn watch(
        self: &Arc<Self>,
        fallback: Duration,
        on_refresh: impl Fn(&Result<RefreshReport, HostError>) + Send + 'static,
    ) -> Result<HostWatcher, HostError> {
        let (tx, rx) = std::sync::mpsc::channel::<bool>();
        let notice = tx.clone();
        let store_watch =
            guild_adapters_fs::store::StoreWatcher::new(&self.packages.store_root(), move || {
                let _ = notice.send(true);
            })?;
        let asleep_until = Arc::new(Mutex::new(None));
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WatchWake {
                tx: tx.clone(),
                asleep_until: Arc::clone(&asleep_until),
            });
        let host = Arc::downgrade(self);
        let thread = std::thread::Builder::new()
            .name("guild-watch".into())
            .spawn(move || loop {
                // While the host owes a change (a failed switch, a deferred one, a failed
                // refresh), it wakes for the retry without waiting for a commit; a retry that
                // another thread records later wakes it through `asleep_until`.
                let wait = {
                    let mut asleep = asleep_until.lock().unwrap_or_else(|e| e.into_inner());
                    let wait = match host.upgrade() {
                        Some(host) => host.next_retry_in().map_or(fallback, |d| d.min(fallback)),
                        None => return,
                    };
                    *asleep = Instant::now().checked_add(wait);
                    wait
                };
                let woken = rx.recv_timeout(wait);
                *asleep_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
                match woken {
                    Ok(false) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    Ok(true) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                }
                // Several commits in a row are one refresh.
                let mut stop = false;
                while let Ok(more) = rx.try_recv() {
                    stop |= !more;
                }
                if stop {
                    return;
                }
                let Some(host) = host.upgrade() else { return };
                let outcome = host.refresh();
                if outcome.as_ref().map_or(true, |r| !r.is_quiet()) {
                    on_refresh(&outcome);
                }
            })
            .map_err(|e| {
                HostError::Store(
                    guild_ports::store::StoreError::new(
                        guild_ports::store::StoreErrorKind::Io,
                        "start the store watcher thread",
                    )
                    .caused_by(e),
                )
            })?;
        Ok(HostWatcher {
            stop: tx,
            thread: Some(thread),
            _store_watch: store_watch,
        })
    }

    /// Installs a package; when it is enabled, its library is loaded from the verified staging
    /// tree before the commit and its registrations become visible after it. Replacing a
    /// loaded version is refused while bindings hold it.
    pub fn install(
        &self,
        location: &Path,
        options: InstallOptions,
    ) -> Result<Installed, HostError> {
        let _lifecycle = self.lock();
        self.packages
            .install_with(location, options, &mut RegistryHook::new(self))
    }

    /// Enables the current version of `id` and loads it.
    pub fn enable(&self, id: &PackageId) -> Result<Version, HostError> {
        let _lifecycle = self.lock();
        self.packages.enable_with(id, &mut RegistryHook::new(self))
    }

    /// Disables `id` and unloads it. Refused with [`HostError::Leased`] while a binding (an
    /// operation handle, a bound kernel or runner) holds the package; see
    /// [`Host::disable_waiting`].
    pub fn disable(&self, id: &PackageId) -> Result<Version, HostError> {
        let _lifecycle = self.lock();
        self.packages.disable_with(id, &mut RegistryHook::new(self))
    }

    /// Disables `id` once nothing holds it: while bindings or session leases refuse the
    /// change, waits for them to be released (new lookups still find the package meanwhile),
    /// for at most `timeout`, and tries again. The wait is woken by the release of the last
    /// binding or lease (no polling) and holds no lifecycle lock. On timeout the last refusal
    /// is returned and nothing has changed.
    pub fn disable_waiting(&self, id: &PackageId, timeout: Duration) -> Result<Version, HostError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.disable(id) {
                Err(HostError::Leased(refusal)) => {
                    // The package manager refuses session leases before the registry counts
                    // bindings, so a refusal names one kind or the other.
                    let released = if refusal.leases > 0 {
                        self.packages.wait_unleased(id, deadline)
                    } else {
                        self.kernels.wait_unbound(id, deadline)
                    };
                    if !released {
                        return Err(HostError::Leased(refusal));
                    }
                }
                outcome => return outcome,
            }
        }
    }

    /// Removes a version; the current version is refused while bindings or leases hold it.
    pub fn remove(&self, id: &PackageId, version: Option<&Version>) -> Result<Version, HostError> {
        let _lifecycle = self.lock();
        self.packages
            .remove_with(id, version, &mut RegistryHook::new(self))
    }

    /// Forgets removed versions of `id` (the one named, or every removed one); answers them.
    /// No loaded code is concerned: only versions whose files are gone can be purged.
    pub fn purge(
        &self,
        id: &PackageId,
        version: Option<&Version>,
    ) -> Result<Vec<Version>, HostError> {
        let _lifecycle = self.lock();
        self.packages.purge(id, version)
    }

    /// Rolls `id` back to its previous version, refused while bindings or leases hold it.
    pub fn rollback(&self, id: &PackageId) -> Result<RolledBack, HostError> {
        let _lifecycle = self.lock();
        self.packages
            .rollback_with(id, &mut RegistryHook::new(self))
    }
}

/// What `metadata`'s package needs loaded: its package dependencies and runtime module edges,
/// with the version range of each.
fn needs(metadata: &Metadata) -> impl Iterator<Item = (&PackageId, &VersionRange)> {
    let m = metadata.manifest();
    m.dependencies
        .iter()
        .map(|d| (&d.package_id, &d.range))
        .chain(
            m.module_dependencies
                .iter()
                .filter(|d| d.is_runtime_edge())
                .map(|d| (&d.module_id, &d.range)),
        )
}

/// What a loading pass of [`Host::refresh`] did with one package.
enum Switched {
    Loaded(LoadedSummary),
    /// The version it replaces was bound at the drain; nothing changed.
    Bound(u64),
}

/// The background refresh started by [`Host::watch`]; dropping it stops the thread (after the
/// refresh in progress, if any).
pub struct HostWatcher {
    stop: std::sync::mpsc::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _store_watch: guild_adapters_fs::store::StoreWatcher,
}

impl fmt::Debug for HostWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostWatcher").finish_non_exhaustive()
    }
}

impl Drop for HostWatcher {
    fn drop(&mut self) {
        let _ = self.stop.send(false);
        if let Some(thread) = self.thread.take() {
            // The thread may be the last owner of the host, dropping it from a refresh; never
            // join from that very thread.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// How a [`Host`] is wired, said before it is opened ([`Host::builder`]):
///
/// - [`loader`](HostBuilder::loader): the plugin loader. Default: the dlopen loader
///   (`RTLD_NOW | RTLD_LOCAL`).
/// - [`plugin_log`](HostBuilder::plugin_log): where the records plugins write through their
///   host table's `log` go (with the dlopen loader), and the failure reports of providers whose
///   C callers passed no error record to read them from (with any loader). Default: dropped.
/// - [`devices`](HostBuilder::devices): what the operation service offers candidates (the CPU's
///   ISA, a CUDA device, the stream adapter). Default: detected, with the reason there is no CUDA
///   device kept in [`HostReport::no_cuda`].
/// - [`load_enabled`](HostBuilder::load_enabled): whether opening loads every enabled package.
///   Default: yes.
/// - [`create_store`](HostBuilder::create_store): whether a path that is not yet a store is
///   made one. Default: no, [`HostError::NotAStore`] naming the path.
///
/// The store itself is opened with the production adapters (the file-system store, the hardened
/// GKPK source, the P-256 verifier) for this platform; whatever is chosen here, no library is
/// opened before its package is authenticated.
///
/// # Examples
///
/// ```no_run
/// use guild_host::{Host, OpenedHost};
///
/// # fn main() -> Result<(), guild_host::HostError> {
/// let OpenedHost { host, report } = Host::builder("/var/lib/guild")
///     .plugin_log(|package, record| eprintln!("[{package}] {}", record.message))
///     .open()?;
/// if let Some(why) = &report.no_cuda {
///     eprintln!("CPU only: {why}");
/// }
/// for p in &report.loaded.loaded {
///     println!("loaded {} {}", p.id, p.version);
/// }
/// # drop(host);
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until it is opened"]
pub struct HostBuilder {
    dir: PathBuf,
    loader: Option<Box<dyn PluginLoader>>,
    plugin_log: Option<LoaderLogSink>,
    devices: Option<DeviceSupport>,
    load_enabled: bool,
    lock: Option<LockFile>,
    create_store: bool,
}

impl fmt::Debug for HostBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuilder")
            .field("dir", &self.dir)
            .field("custom_loader", &self.loader.is_some())
            .field("plugin_log", &self.plugin_log.is_some())
            .field("devices", &self.devices)
            .field("load_enabled", &self.load_enabled)
            .field("lock", &self.lock.as_ref().map(|l| l.packages().len()))
            .field("create_store", &self.create_store)
            .finish()
    }
}

impl HostBuilder {
    fn new(dir: PathBuf) -> Self {
        HostBuilder {
            dir,
            loader: None,
            plugin_log: None,
            devices: None,
            load_enabled: true,
            lock: None,
            create_store: false,
        }
    }

    /// Opens the store under a lock file (`guild lock`): only enabled packages that `lock`
    /// names, at its version and payload digest, are loaded; the others are reported in
    /// [`LoadReport::refused_by_lock`] with the reason. The store itself is not changed (`guild
    /// sync` makes it match).
    pub fn lock(mut self, lock: LockFile) -> Self {
        self.lock = Some(lock);
        self
    }

    /// Loads plugins with `loader` instead of the dlopen loader. A
    /// [`plugin_log`](HostBuilder::plugin_log) sink then takes only the failure reports no
    /// caller could read: `loader` sends its plugins' records where it was built to.
    pub fn loader(mut self, loader: Box<dyn PluginLoader>) -> Self {
        self.loader = Some(loader);
        self
    }

    /// Sends every record a plugin writes through its host table's `log` callback (during its
    /// `init` and later) to `sink`, with the package that wrote it; and the report of a provider
    /// whose call failed when its C caller passed no usable error record (as an error-level
    /// record of the provider's package; see [`KernelRegistry::send_unread_failures_to`]).
    /// Called synchronously on the plugin's or the caller's thread: keep it short, and do not
    /// call into the host from it.
    pub fn plugin_log(
        mut self,
        sink: impl Fn(&PackageId, &PluginLog) + Send + Sync + 'static,
    ) -> Self {
        self.plugin_log = Some(Arc::new(sink));
        self
    }

    /// Resolves operations against `devices` instead of detecting them ([`DeviceSupport::host`]
    /// for CPU only, without probing the CUDA driver at all).
    pub fn devices(mut self, devices: DeviceSupport) -> Self {
        self.devices = Some(devices);
        self
    }

    /// Whether [`open`](HostBuilder::open) loads every enabled package (the default), or leaves
    /// that to a later [`Host::load_enabled`].
    pub fn load_enabled(mut self, load: bool) -> Self {
        self.load_enabled = load;
        self
    }

    /// Whether [`open`](HostBuilder::open) makes an empty store at the path when there is none
    /// (`true`), or refuses a path that is not already a store with [`HostError::NotAStore`]
    /// naming it, creating nothing (`false`, the default). A runner is given its store's path,
    /// and a mistyped one should fail at open rather than later, as an operation that no package
    /// provides; a store is made by `guild` or a [`PackageManager`]. A tool that must work on a
    /// fresh path (a test, an installer) says `create_store(true)`.
    pub fn create_store(mut self, create: bool) -> Self {
        self.create_store = create;
        self
    }

    /// Opens the store as a reader (no lock: the last committed generation, whatever a writer is
    /// doing; every enabled package re-verified, what fails left out of this host and reported,
    /// nothing written), detects the devices unless they were given, composes the host and, by
    /// default, loads every enabled package in dependency order. A package that fails to load
    /// does not fail the open: it is in [`LoadReport::failed`].
    pub fn open(self) -> Result<OpenedHost, HostError> {
        if !self.create_store {
            check_is_store(&self.dir)?;
        }
        let (packages, store) = PackageManager::open_dir_reader(&self.dir)?;
        let (devices, no_cuda) = match self.devices {
            Some(devices) => (devices, None),
            // Without a usable GPU, CUDA queries are refused (host-blocking ones with the
            // domain's "no CUDA device", stream-ordered ones for want of a stream adapter).
            None => DeviceSupport::detect(),
        };
        let loader = match self.loader {
            Some(loader) => loader,
            None => {
                let dlopen = DlopenLoader::new();
                Box::new(match self.plugin_log.clone() {
                    Some(sink) => dlopen.with_log_sink(move |id, record| sink(id, record)),
                    None => dlopen,
                })
            }
        };
        let mut host = Host::with_devices(packages, loader, devices);
        if let Some(sink) = self.plugin_log {
            host.kernels
                .send_unread_failures_to(move |id, record| sink(id, record));
        }
        // A load record some dead process left is a crash in init: quarantine it before loading.
        host.crashes = Some(crate::crash_quarantine::Quarantine::open(&self.dir)?);
        if let Some(lock) = self.lock {
            host = host.under_lock(lock);
        }
        let loaded = if self.load_enabled {
            host.load_enabled()?
        } else {
            LoadReport::default()
        };
        let quarantined = match &host.crashes {
            Some(quarantine) => quarantine.list(),
            None => Vec::new(),
        };
        Ok(OpenedHost {
            host,
            report: HostReport {
                store,
                loaded,
                no_cuda,
                quarantined,
            },
        })
    }
}

/// Whether `dir` is a store some writer made: a directory holding the registry checkpoint.
/// Nothing is created or changed.
fn check_is_store(dir: &Path) -> Result<(), HostError> {
    let not_a_store = |reason: String| HostError::NotAStore {
        path: dir.to_path_buf(),
        reason,
    };
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_a_store("no such directory".into()))
        }
        Err(e) => return Err(not_a_store(format!("it cannot be read ({e})"))),
        Ok(m) if !m.is_dir() => return Err(not_a_store("it is not a directory".into())),
        Ok(_) => {}
    }
    let registry = guild_adapters_fs::store::StoreLayout::new(dir).registry;
    match std::fs::symlink_metadata(&registry) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(not_a_store(format!(
            "{} is not a regular file",
            registry.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_a_store(
            "the directory holds no store registry (stores are made by `guild` or a package \
             manager, never by a runner)"
                .into(),
        )),
        Err(e) => Err(not_a_store(format!("its registry cannot be read ({e})"))),
    }
}

/// An opened [`Host`] and what opening it did ([`HostBuilder::open`]).
#[derive(Debug)]
pub struct OpenedHost {
    /// The host.
    pub host: Host,
    /// What opening found and did.
    pub report: HostReport,
}

/// What opening a host did.
#[derive(Debug)]
#[non_exhaustive]
pub struct HostReport {
    /// The store: what recovery finished or undid, how many enabled versions re-verified, and
    /// what was disabled or marked removed because it no longer verifies.
    pub store: OpenReport,
    /// What loading the enabled packages did (empty with
    /// [`load_enabled(false)`](HostBuilder::load_enabled)).
    pub loaded: LoadReport,
    /// Why there is no CUDA device (no driver, a driver without a device, ...), in words to show,
    /// when the devices were detected and none was usable; `None` when CUDA device 0 is in use or
    /// the devices were given to the builder.
    pub no_cuda: Option<String>,
    /// The builds in crash quarantine ([`crate::crash_quarantine`]): a process died in their
    /// `init`, and they are not loaded until a new version or `guild quarantine clear`.
    pub quarantined: Vec<crate::crash_quarantine::QuarantineEntry>,
}

/// Where a load's files come from, which decides how they are pinned and whether the load
/// hashes them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LoadFrom {
    /// An installed version of the committed registry.
    Installed,
    /// A lifecycle change in progress, which may install the version only at its commit.
    Change,
}

/// What the registry does once the store commit is durable.
enum After {
    Nothing,
    Publish(PreparedPublication),
    Unload(PackageId),
}

/// The kernel registry's part of a lifecycle transaction.
struct RegistryHook<'h> {
    host: &'h Host,
    after: After,
    /// The package this change drains, held until the change is decided: finished once the
    /// commit and the registry change are done, dropped (clearing the mark) otherwise.
    drain: Option<Drain>,
}

/// The refusal of `action` on `id` because `bindings` bindings hold it. The package manager
/// has already refused session leases (and marked the change pending against new ones), so
/// only bindings can remain.
fn bound(id: &PackageId, action: QuiescentAction, bindings: u64) -> HostError {
    Leased {
        id: id.clone(),
        action,
        leases: 0,
        bindings,
    }
    .into()
}

impl<'h> RegistryHook<'h> {
    fn new(host: &'h Host) -> Self {
        RegistryHook {
            host,
            after: After::Nothing,
            drain: None,
        }
    }

    /// A cheap early refusal, before a new version is loaded for nothing. Not the decision:
    /// a binding may still be taken after it, until [`RegistryHook::drain`].
    fn refuse_if_bound(&self, id: &PackageId, action: QuiescentAction) -> Result<(), HostError> {
        match self.host.kernels.live_bindings(id) {
            0 => Ok(()),
            bindings => Err(bound(id, action, bindings)),
        }
    }

    /// The decision: drains `id` (no binding into it can be taken from here until the change
    /// is decided) or refuses `action` because bindings live. The last step of `prepare`, so
    /// that nothing after it can fail and leave the package drained for nothing.
    fn drain(&mut self, id: &PackageId, action: QuiescentAction) -> Result<(), HostError> {
        match self.host.kernels.drain(id) {
            Ok(drain) => {
                self.drain = Some(drain);
                Ok(())
            }
            Err(RegistryChangeError::Bound { bindings, .. }) => Err(bound(id, action, bindings)),
            Err(other) => Err(other.into()),
        }
    }

    fn publish(
        &mut self,
        id: &PackageId,
        version: &Version,
        dir: &Path,
        metadata: &Metadata,
    ) -> Result<(), HostError> {
        self.host.check_dependencies_loaded(id, version, metadata)?;
        let plugin = self
            .host
            .load(id, version, dir, metadata, LoadFrom::Change)?;
        self.after = After::Publish(self.host.kernels.prepare(id, version, plugin, true)?);
        Ok(())
    }

    /// Whether a version of `id` is loaded.
    fn loaded(&self, id: &PackageId) -> bool {
        self.host.kernels.loaded_version(id).is_some()
    }

    /// A new version installed enabled: it is loaded and prepared from its staging tree; a
    /// loaded version it replaces is refused while bound, and drained once the new one is in.
    fn install_enabled(
        &mut self,
        id: &PackageId,
        version: &Version,
        dir: &Path,
        metadata: &Metadata,
    ) -> Result<(), HostError> {
        let replaces = self.loaded(id);
        if replaces {
            self.refuse_if_bound(id, QuiescentAction::Replace)?;
        }
        self.publish(id, version, dir, metadata)?;
        if replaces {
            self.drain(id, QuiescentAction::Replace)?;
        }
        Ok(())
    }

    /// `id`, if loaded, leaves the registry once the change commits: it is drained now for
    /// `action`.
    fn unload_if_loaded(
        &mut self,
        id: &PackageId,
        action: QuiescentAction,
    ) -> Result<(), HostError> {
        if self.loaded(id) {
            self.drain(id, action)?;
            self.after = After::Unload(id.clone());
        }
        Ok(())
    }

    /// The loaded `id` switches to the installed version `to` for `action`: refused while bound,
    /// the new version loaded and prepared, then the old one drained.
    fn switch(
        &mut self,
        id: &PackageId,
        to: &Version,
        dir: &Path,
        metadata: &Metadata,
        action: QuiescentAction,
    ) -> Result<(), HostError> {
        self.refuse_if_bound(id, action)?;
        self.publish(id, to, dir, metadata)?;
        self.drain(id, action)
    }
}

impl LifecycleHook for RegistryHook<'_> {
    fn prepare(&mut self, change: &Change<'_>) -> Result<(), HostError> {
        // A live binding (an operation handle, a bound kernel or runner) prevents its package's
        // code from being unloaded or replaced by a lifecycle change: the change drains the
        // package (from then on no binding into it can be taken) and is refused if a binding
        // was alive at that instant; `Host::disable_waiting` waits for the last one first. A
        // replacement loads the new version before it drains the old one, so the old one stays
        // bindable while the new one initialises. Only re-verification (a revoked key, a
        // tampered file) takes a bound package out at once; its library then closes with its
        // last binding.
        match change {
            Change::Install {
                id,
                version,
                dir,
                metadata,
                enabled: true,
            } => self.install_enabled(id, version, dir, metadata),
            Change::Install {
                id, enabled: false, ..
            } => {
                // The new version is installed disabled: the version it supersedes is no longer
                // current, so it leaves the registry too.
                self.unload_if_loaded(id, QuiescentAction::Replace)
            }
            Change::Enable {
                id,
                version,
                dir,
                metadata,
            } => self.publish(id, version, dir, metadata),
            Change::Disable { id, .. } => self.unload_if_loaded(id, QuiescentAction::Unload),
            Change::Remove {
                id, current: true, ..
            } => {
                self.drain(id, QuiescentAction::Remove)?;
                if self.loaded(id) {
                    self.after = After::Unload((*id).clone());
                }
                Ok(())
            }
            Change::Remove { current: false, .. } => Ok(()),
            Change::Reactivate {
                id,
                to,
                dir,
                metadata,
                ..
            } => self.switch(id, to, dir, metadata, QuiescentAction::Replace),
            Change::Rollback {
                id,
                to,
                dir,
                metadata,
                ..
            } => self.switch(id, to, dir, metadata, QuiescentAction::Rollback),
        }
    }

    fn committed(&mut self) {
        match std::mem::replace(&mut self.after, After::Nothing) {
            After::Nothing => {}
            After::Publish(prepared) => self.host.kernels.commit(prepared),
            After::Unload(id) => {
                // Not loaded is fine here: there is nothing to take out.
                let _ = self.host.kernels.unload(&id);
            }
        }
        // The drained version has left the registry, which keeps it marked for good.
        if let Some(drain) = self.drain.take() {
            drain.finish();
        }
    }

    fn aborted(&mut self) {
        // Dropping a prepared publication shuts the plugin down and closes its library;
        // dropping the drain makes the package bindable again.
        self.after = After::Nothing;
        self.drain = None;
    }
}
