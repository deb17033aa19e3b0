//! The kernel registry: the kernels, operations and runners loaded plugins registered, readable
//! without taking a lock, with bindings that keep the provider's code loaded.
//!
//! Readers load an immutable [`Snapshot`] through arc-swap; writers (publication, enable,
//! disable, unload) build a new snapshot and swap it in while holding the registry's lifecycle
//! lock, so that they are serialised with each other and never block a reader. A lookup by impl
//! id reads, instead of the snapshot, the thread's copy of an impl-id table published with it,
//! which holds the kernels weakly (see `id_lookup`).
//!
//! A [`KernelBinding`] is the spec's aliasing shared pointer: one `Arc` that keeps both the stored
//! operation and the library it points into alive. The library of a package that was unloaded or
//! replaced closes when its last binding is dropped, never earlier.
//!
//! # Draining
//!
//! Each loaded package counts its live bindings (kernel bindings and runner references together)
//! in a few stripes, each an atomic word on its own cache line: a `DRAINING` bit, a sticky
//! `WAITED` bit and the stripe's count. A thread binds on its own stripe (threads are dealt
//! stripes in turn), and a binding, and every copy of it, is counted on the stripe it was taken
//! on, so that threads binding into the same package do not write the same cache line. Taking
//! a binding is one compare-and-swap on its stripe that either sees `DRAINING` and takes
//! nothing, or is counted. A lifecycle change that must not run while the package is bound
//! (`KernelRegistry::drain`) sets `DRAINING` on every stripe with one `fetch_or` each and reads
//! that stripe's count from the same operation. On one stripe these are read-modify-writes of
//! one location, so they are totally ordered: every bind either precedes its stripe's mark (and
//! is in the count the drainer reads there) or follows it (and fails); a copy is only made of
//! a binding that is alive, so counted, on the same stripe. When every stripe read zero, no
//! binding was alive at any stripe's mark and none can be taken since: the change may go on.
//! Otherwise it is refused. A refused or aborted change clears the marks; a committed one
//! keeps them for good (a package that left the registry is never bound again, whatever
//! snapshot a late resolver still holds).
//!
//! A lookup that meets a draining package treats it as already gone: resolution passes over its
//! candidates, [`KernelRegistry::select`] takes the next best, [`KernelRegistry::find_by_id`] and
//! [`KernelRegistry::find_runner`] answer `None` and [`KernelRegistry::runners`] leaves it out.
//!
//! The marks above are in fact set in two steps, so that a drain that will be refused hides the
//! package from no one: the drainer counts the bindings into retired versions, then sets an
//! undecided mark (`DECIDING`) on every stripe, reading the counts as described, and only then
//! turns every mark into `DRAINING` (one update per stripe) or clears them. A binder that meets
//! the undecided mark waits (spinning briefly, then yielding) for the decision instead of
//! taking the package for gone; drains of one package decide one at a time.
//!
//! # Who changes a registry
//!
//! The right to change a registry is a value: an [`OwnedRegistry`], which only its owner holds.
//! A host (`guild_host::Host`) owns the one it serves from and changes it only inside its
//! lifecycle transactions (install, enable, disable, remove, rollback, re-verification), which
//! keep it and the store in step; what it hands out (`Host::kernels`) is `&KernelRegistry`,
//! which has lookups, bindings and the operation service but no mutators. Tests, benchmarks and
//! the registration check own registries of their own, with no store behind them.

use std::collections::HashMap;
use std::ffi::CString;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use arc_swap::ArcSwap;
use guild_abi::guild_operation_service_v1_t;
use guild_domain::ids::{ImplId, OpName, PackageId, RunnerId};
pub use guild_domain::kernel_registry::RegistryChangeError;
use guild_domain::operation::Backend;
use guild_domain::version::Version;
use guild_ports::loader::LoadedPlugin;

use crate::id_lookup::IdLookup;
use crate::operations::core::ServiceCore;
use crate::operations::{DeviceSupport, OperationService};
pub(crate) use crate::snapshot::{CNames, IdTable, Quiet};
pub use crate::snapshot::{
    KernelBinding, LoadedPackage, OperationCandidates, RunnerBinding, Snapshot, StoredOp,
    StoredRunner,
};

/// What a lookup by operation asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// The descriptor's `op_kind` (`GUILD_OP_*`).
    pub op_kind: u32,
    /// The namespaced name; required for `GUILD_OP_CUSTOM`, `None` matches unnamed legacy kernels.
    pub op_name: Option<OpName>,
    /// Restricts the backend, or any backend when `None`.
    pub backend: Option<Backend>,
}

impl Snapshot {
    /// The snapshot of `packages`, numbered `generation` (its impl-id table's).
    fn rebuild(packages: &HashMap<PackageId, PackageEntry>, generation: u64) -> Snapshot {
        let mut snap = Snapshot::default();
        for (id, entry) in packages {
            snap.packages.insert(id.clone(), entry.package.clone());
            if !entry.enabled {
                continue;
            }
            for op in &entry.ops {
                snap.by_id.insert(op.kernel.impl_id.clone(), op.clone());
                snap.by_op
                    .entry((op.kernel.op_kind, op.kernel.op_name.clone()))
                    .or_default()
                    .push(op.clone());
            }
            snap.runners.extend(entry.runners.iter().cloned());
        }
        for list in snap.by_op.values_mut() {
            list.sort_by(|a, b| {
                b.kernel
                    .priority
                    .cmp(&a.kernel.priority)
                    .then_with(|| a.kernel.impl_id.cmp(&b.kernel.impl_id))
            });
        }
        for ((kind, name), list) in &snap.by_op {
            let (Some(name), true) = (name, *kind == guild_abi::GUILD_OP_CUSTOM) else {
                continue;
            };
            let entry =
                snap.operations
                    .entry(name.clone())
                    .or_insert_with(|| OperationCandidates {
                        c_name: CString::new(name.as_str()).unwrap_or_default(),
                        ..OperationCandidates::default()
                    });
            for op in list {
                if let Some(contract) = &op.kernel.operation {
                    entry.stored.push(Arc::clone(op));
                    entry.contracts.push(contract.clone());
                }
            }
        }
        snap.runners.sort_by(|a, b| {
            b.runner
                .priority
                .cmp(&a.runner.priority)
                .then_with(|| a.runner.runner_id.cmp(&b.runner.runner_id))
        });
        snap.ids = Arc::new(IdTable::new(generation, &snap.by_id));
        snap
    }
}

impl<'r> OperationService<'r> {
    /// The service over `registry`; handles it returns borrow the registry.
    pub fn new(registry: &'r KernelRegistry) -> Self {
        OperationService::over(registry.service())
    }
}

/// A package as the writer side keeps it.
#[derive(Debug, Clone)]
struct PackageEntry {
    package: Arc<LoadedPackage>,
    ops: Vec<Arc<StoredOp>>,
    runners: Vec<Arc<StoredRunner>>,
    enabled: bool,
}

impl PackageEntry {
    fn live_bindings(&self) -> u64 {
        self.package.live_bindings()
    }
}

/// A package version that left the registry, remembered weakly so that the bindings still
/// pointing into it count as leases until they are gone. Its stripes are marked for good, so
/// its count only falls.
#[derive(Debug)]
struct Retired {
    id: PackageId,
    version: Version,
    package: Weak<LoadedPackage>,
}

impl Retired {
    /// The retired package, when it is `id` (at `version`, when given) and still alive. Only a
    /// match is upgraded: a strong reference made and dropped here could be the last one and
    /// close its library on this thread, under the caller's lock.
    fn is(&self, id: &PackageId, version: Option<&Version>) -> Option<Arc<LoadedPackage>> {
        if &self.id != id || version.is_some_and(|v| &self.version != v) {
            return None;
        }
        self.package.upgrade()
    }

    fn is_gone(&self) -> bool {
        self.package.strong_count() == 0
    }
}

/// A lifecycle change's hold on a package it is about to unload or replace: while it lives, no
/// new binding into the package can be taken. [`Drain::finish`] once the change committed (the
/// registry change that follows keeps the mark for good); dropping it otherwise clears the mark.
#[derive(Debug)]
pub struct Drain {
    package: Option<Arc<LoadedPackage>>,
}

impl Drain {
    /// The change committed and the registry took the package out or replaced it: the marks
    /// stay for good. Finished while the package is still loaded (nothing took it out), the
    /// drain ends as if dropped, so the package never stays draining with nothing to end it.
    pub fn finish(mut self) {
        if self.package.as_ref().is_some_and(|p| p.is_retired()) {
            self.package = None;
        }
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if let Some(package) = self.package.take() {
            package.end_drain();
        }
    }
}

/// What unloading did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unloaded {
    /// The package taken out.
    pub package: PackageId,
    /// The version that was loaded.
    pub version: Version,
    /// Bindings still alive: the library closes when the last of them is dropped.
    pub deferred_bindings: u64,
}

/// The kernel registry: kernels, operations and model runners. See the module documentation.
pub struct KernelRegistry {
    snapshot: Arc<ArcSwap<Snapshot>>,
    /// The writer side: the packages the registry holds. Locking it is the registry's share of
    /// the lifecycle transaction.
    writer: Mutex<HashMap<PackageId, PackageEntry>>,
    /// Packages that left the registry while bindings still pointed into them; kept weakly to
    /// count their leases until the last binding goes.
    retired: Mutex<Vec<Retired>>,
    /// Shared by every package of this registry: the last binding's drop wakes waiters here.
    quiet: Arc<Quiet>,
    /// The operation service over this registry. Every library loaded with its table keeps the
    /// core alive too, so a plugin's late call finds it closed, never freed.
    service: Arc<ServiceCore>,
    /// The registry's generation, which tells [`KernelRegistry::find_by_id`] whether a thread's
    /// copy of a snapshot's impl-id table is current.
    ids: IdLookup,
}

impl fmt::Debug for KernelRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelRegistry")
            .field("snapshot", &self.snapshot.load())
            .finish()
    }
}

impl Default for KernelRegistry {
    fn default() -> Self {
        Self::new()
    }
}

/// A prepared publication: validated against the registry and ready to be swapped in. Dropping
/// it without [`OwnedRegistry::commit`] discards the loaded plugin (its library closes).
#[derive(Debug)]
pub struct PreparedPublication {
    entry: PackageEntry,
}

impl KernelRegistry {
    /// An empty registry whose operation service knows the host CPU and no GPU.
    pub fn new() -> Self {
        Self::with_devices(DeviceSupport::host())
    }

    /// An empty registry whose operation service resolves against `devices`.
    pub fn with_devices(devices: DeviceSupport) -> Self {
        let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot::default()));
        KernelRegistry {
            service: ServiceCore::new(
                Arc::clone(&snapshot),
                devices,
                crate::operations::c_service::table(),
            ),
            snapshot,
            writer: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            quiet: Arc::new(Quiet::default()),
            ids: IdLookup::new(),
        }
    }

    /// The C operation service over this registry, for in-process runners (plugins receive the
    /// same table through their host table). The table and its `user` stay valid until the
    /// registry is dropped; handles resolved through it must be released before that.
    ///
    /// Rust code normally uses [`OperationService`] instead; this
    /// table is for native code that the runner hands it to, or for calling the service exactly
    /// as a plugin does. Every entry takes the table's `user` as its first argument.
    ///
    /// # Examples
    ///
    /// Resolve an operation through the C table, ask its scratch and release the handle:
    ///
    /// ```no_run
    /// use std::ffi::CStr;
    /// use std::ptr;
    ///
    /// use guild_host::abi::{
    ///     guild_error_info_t, guild_op_handle_t, guild_operation_query_v1_t,
    ///     guild_scratch_request_v1_t, guild_tensor_desc_v1_t, GUILD_BACKEND_CPU,
    ///     GUILD_BUDGET_UNLIMITED, GUILD_DTYPE_F32, GUILD_MAX_TENSOR_RANK, GUILD_MEMORY_HOST,
    ///     GUILD_OPERATION_QUERY_VERSION, GUILD_STATUS_OK, GUILD_SYNC_HOST_BLOCKING,
    /// };
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let guild_host::OpenedHost { host, .. } = guild_host::Host::builder("/var/lib/guild").open()?;
    /// let service = host.kernels().operation_api();
    ///
    /// // Eight packed f32 values in host memory, in and out. Resolution needs the shapes only.
    /// let mut dims = [0; GUILD_MAX_TENSOR_RANK];
    /// dims[0] = 8;
    /// let tensor = guild_tensor_desc_v1_t {
    ///     dtype: GUILD_DTYPE_F32,
    ///     rank: 1,
    ///     dims,
    ///     strides: [0; GUILD_MAX_TENSOR_RANK],
    ///     memory_space: GUILD_MEMORY_HOST,
    ///     device_id: 0,
    ///     data: ptr::null_mut(),
    /// };
    /// let query = guild_operation_query_v1_t {
    ///     struct_size: size_of::<guild_operation_query_v1_t>() as u32,
    ///     version: GUILD_OPERATION_QUERY_VERSION,
    ///     op_name: c"example.sequence.inclusive_scan".as_ptr(),
    ///     min_op_version: 0x0100_0000, // 1.0.0
    ///     max_op_version: 0x01ff_ffff, // any 1.x
    ///     backends: GUILD_BACKEND_CPU,
    ///     sync_mode: GUILD_SYNC_HOST_BLOCKING,
    ///     required_capabilities: 0,
    ///     required_numerics: 0,
    ///     inputs: &tensor,
    ///     input_count: 1,
    ///     outputs: &tensor,
    ///     output_count: 1,
    ///     ram_budget: GUILD_BUDGET_UNLIMITED,
    ///     vram_budget: GUILD_BUDGET_UNLIMITED,
    ///     exact_impl_id: ptr::null(),
    ///     device_caps: ptr::null(), // the host's own record of device 0
    ///     params: ptr::null(),
    ///     params_size: 0,
    /// };
    ///
    /// let mut error = guild_error_info_t::new();
    /// let mut handle: *mut guild_op_handle_t = ptr::null_mut();
    /// let resolve = service.resolve.expect("the host fills every entry");
    /// // SAFETY: `user` comes with the table; the query and what it points at live for the call.
    /// let status = unsafe { resolve(service.user, &query, &mut handle, &mut error) };
    /// if status != GUILD_STATUS_OK {
    ///     // SAFETY: the service leaves a NUL-terminated message in the record it was given.
    ///     let why = unsafe { CStr::from_ptr(error.message.as_ptr()) };
    ///     return Err(format!("resolve failed ({status}): {}", why.to_string_lossy()).into());
    /// }
    ///
    /// let mut scratch = guild_scratch_request_v1_t {
    ///     struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
    ///     alignment: 0,
    ///     host_bytes: 0,
    ///     device_bytes: 0,
    /// };
    /// let ask = service.scratch.expect("the host fills every entry");
    /// // SAFETY: a live handle from this service and a record of the declared size.
    /// if unsafe { ask(service.user, handle, &mut scratch, &mut error) } == GUILD_STATUS_OK {
    ///     println!("each execute needs {} bytes of host scratch", scratch.host_bytes);
    /// }
    ///
    /// // Execute with `service.execute` and a `guild_execute_args_v1_t` naming the same tensors
    /// // with their data. Then release exactly once, before the host is dropped.
    /// let release = service.release.expect("the host fills every entry");
    /// // SAFETY: a live handle that no other call is using.
    /// unsafe { release(service.user, handle, &mut error) };
    /// # Ok(())
    /// # }
    /// ```
    pub fn operation_api(&self) -> &guild_operation_service_v1_t {
        &self.service.runner_table
    }

    pub(crate) fn service(&self) -> &ServiceCore {
        &self.service
    }

    /// The table a plugin loaded into this registry finds in its host table, with the owner the
    /// loader keeps for as long as the library is loaded. Its calls never wait for a busy
    /// handle: they are refused with `GUILD_STATUS_ERR_BUSY` instead.
    pub(crate) fn plugin_service(&self) -> guild_ports::loader::ServiceTable {
        guild_ports::loader::ServiceTable {
            address: std::ptr::from_ref(&self.service.plugin_table).expose_provenance(),
            keep_alive: Arc::clone(&self.service) as Arc<dyn std::any::Any + Send + Sync>,
        }
    }

    /// Sends the report of a provider whose call failed to `sink`, with the provider's package,
    /// when the C caller passed no usable error record (NULL, misaligned, or smaller than this
    /// version's record) and so could not read it: the status still reaches the caller, and the
    /// text is not dropped. The host's `HostBuilder::plugin_log` sets
    /// this to the plugin log sink; without a sink the text is dropped.
    pub fn send_unread_failures_to(
        &self,
        sink: impl Fn(&PackageId, &guild_adapters_posix::PluginLog) + Send + Sync + 'static,
    ) {
        self.service.send_unread_failures_to(Arc::new(sink));
    }

    /// C handles resolved through either C table and not yet released.
    pub fn live_c_handles(&self) -> usize {
        self.service.handles.live()
    }

    /// The C handles of [`live_c_handles`](Self::live_c_handles) that were resolved through
    /// the runner's table ([`operation_api`](Self::operation_api)), that is by the embedding
    /// process itself; the rest are held by loaded plugins, which release them at the latest in
    /// their `shutdown` when the host unloads them.
    pub fn live_runner_c_handles(&self) -> usize {
        self.service
            .runner_handles
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The package version a live C handle of this registry runs, and whether that version is
    /// still the current one ([`KernelBinding::is_current`]); `None` when `handle` is not a live
    /// handle of this registry (NULL, released, another registry's, made up) or is being
    /// released. A handle is a number, never dereferenced, so any value may be asked about.
    pub fn c_handle_provider(
        &self,
        handle: *mut guild_abi::guild_op_handle_t,
    ) -> Option<HandleProvider> {
        let name = self.service.handles.decode(handle as usize as u64)?;
        self.service
            .handles
            .with_shared(name, |h| HandleProvider {
                package: h.binding.package().clone(),
                version: h.binding.version().clone(),
                is_current: h.binding.is_current(),
            })
            .ok()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PackageId, PackageEntry>> {
        // The writer map is only replaced wholesale after validation, so a poisoned lock still
        // holds a consistent map.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current snapshot, without a lock.
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// Checks that `plugin` can join the registry as `id@version` (no impl id or runner id that
    /// another package provides) and prepares its entry. Nothing is visible until
    /// [`KernelRegistry::commit`].
    pub(crate) fn prepare(
        &self,
        id: &PackageId,
        version: &Version,
        plugin: LoadedPlugin,
        enabled: bool,
    ) -> Result<PreparedPublication, RegistryChangeError> {
        let writer = self.lock();
        for (other_id, other) in writer.iter() {
            if other_id == id {
                continue; // The package's own previous version is being replaced.
            }
            for op in &other.ops {
                if let Some(k) = plugin
                    .kernels
                    .iter()
                    .find(|k| k.impl_id == op.kernel.impl_id)
                {
                    return Err(RegistryChangeError::DuplicateImplId {
                        package: format!("{id}@{version}"),
                        impl_id: k.impl_id.clone(),
                        owner: format!("{other_id}@{}", other.package.version),
                    });
                }
            }
            for r in &other.runners {
                if let Some(mine) = plugin
                    .runners
                    .iter()
                    .find(|m| m.runner_id == r.runner.runner_id)
                {
                    return Err(RegistryChangeError::DuplicateRunnerId {
                        package: format!("{id}@{version}"),
                        runner_id: mine.runner_id.clone(),
                        owner: format!("{other_id}@{}", other.package.version),
                    });
                }
            }
        }
        let package = Arc::new(LoadedPackage::new(
            id.clone(),
            version.clone(),
            plugin.library,
            Arc::clone(&self.quiet),
        ));
        let ops = plugin
            .kernels
            .into_iter()
            .map(|kernel| {
                Arc::new(StoredOp {
                    c_names: CNames::of(&kernel, id, version),
                    contract: kernel.operation.clone().map(Arc::new),
                    kernel,
                    package: package.clone(),
                })
            })
            .collect();
        let runners = plugin
            .runners
            .into_iter()
            .map(|runner| {
                Arc::new(StoredRunner {
                    runner,
                    package: package.clone(),
                })
            })
            .collect();
        Ok(PreparedPublication {
            entry: PackageEntry {
                package,
                ops,
                runners,
                enabled,
            },
        })
    }

    /// Makes a prepared publication visible, replacing the package's previous version if one was
    /// loaded (that version is never bound again; its library closes when its last binding
    /// goes). Drain the previous version first ([`KernelRegistry::drain`]) where a live binding
    /// must refuse the replacement.
    pub(crate) fn commit(&self, prepared: PreparedPublication) {
        let mut writer = self.lock();
        let id = prepared.entry.package.id.clone();
        let old = writer.insert(id, prepared.entry);
        if let Some(old) = &old {
            self.retire(old);
        }
        let old_snapshot = self.swap_snapshot(&writer);
        drop(writer);
        // Dropping the replaced entry and snapshot may close a library and run the plugin's
        // shutdown; that happens after the writer lock is released, so a shutdown that calls
        // back into the host cannot deadlock on it.
        drop(old);
        drop(old_snapshot);
    }

    /// Enables or disables a loaded package's kernels and runners for lookups.
    pub(crate) fn set_enabled(
        &self,
        id: &PackageId,
        enabled: bool,
    ) -> Result<(), RegistryChangeError> {
        let mut writer = self.lock();
        let entry = writer
            .get_mut(id)
            .ok_or_else(|| RegistryChangeError::NotLoaded {
                package: id.clone(),
            })?;
        entry.enabled = enabled;
        let old_snapshot = self.swap_snapshot(&writer);
        drop(writer);
        drop(old_snapshot);
        Ok(())
    }

    /// Removes a package from the registry. New lookups no longer find it, and no binding into
    /// it can be taken any more (also not from a snapshot read before); its library closes when
    /// the last binding into it is dropped (at once if there is none). Drain it first
    /// ([`KernelRegistry::drain`]) where a live binding must refuse the unload.
    pub(crate) fn unload(&self, id: &PackageId) -> Result<Unloaded, RegistryChangeError> {
        let mut writer = self.lock();
        let entry = writer
            .remove(id)
            .ok_or_else(|| RegistryChangeError::NotLoaded {
                package: id.clone(),
            })?;
        self.retire(&entry);
        let old_snapshot = self.swap_snapshot(&writer);
        drop(writer);
        let unloaded = Unloaded {
            package: id.clone(),
            version: entry.package.version.clone(),
            deferred_bindings: entry.live_bindings(),
        };
        // As in `commit`: the library may close here, outside the writer lock.
        drop(entry);
        drop(old_snapshot);
        Ok(unloaded)
    }

    /// Swaps in the snapshot of `writer` (the registry's writer side, locked by the caller)
    /// and its impl-id table, answering the snapshot it replaced.
    fn swap_snapshot(&self, writer: &HashMap<PackageId, PackageEntry>) -> Arc<Snapshot> {
        let generation = self.ids.next_generation();
        let snapshot = Arc::new(Snapshot::rebuild(writer, generation));
        // The generation first, then the snapshot: see `id_lookup`.
        self.ids.publish(generation);
        self.snapshot.swap(snapshot)
    }

    fn retire(&self, entry: &PackageEntry) {
        entry.package.retire();
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|r| !r.is_gone());
        retired.push(Retired {
            id: entry.package.id.clone(),
            version: entry.package.version.clone(),
            package: Arc::downgrade(&entry.package),
        });
    }

    /// Starts draining `id` for a lifecycle change that must not run while anything is bound
    /// into the package: marks the loaded version draining (no new binding into it can be
    /// taken from here on) and checks that no binding into it, or into a retired version, is
    /// alive. When some are, the mark is cleared and the change is refused with
    /// [`RegistryChangeError::Bound`]. A package that is not loaded drains at once when no
    /// retired version is bound.
    ///
    /// Keep the returned [`Drain`] until the change is decided: [`Drain::finish`] it after the
    /// commit and the unload or replacement that follows; drop it to abort.
    pub(crate) fn drain(&self, id: &PackageId) -> Result<Drain, RegistryChangeError> {
        let current = self.lock().get(id).map(|e| Arc::clone(&e.package));
        let bound = |bindings| RegistryChangeError::Bound {
            package: id.clone(),
            bindings,
        };
        // Retired versions are marked for good, so their counts only fall: a zero read here
        // stays zero. They are counted before the loaded version is marked, so that nothing
        // but atomic operations happens while binders wait for the decision (in particular no
        // lock is taken and no retired library closes on this thread then).
        let retired = self.retired_bindings(id, None);
        if retired > 0 {
            return Err(bound(retired));
        }
        let Some(package) = current else {
            return Ok(Drain { package: None });
        };
        // Marked undecided while its bindings are counted: binders wait for the decision
        // rather than take the package for gone, so a refusal hides it from no one.
        let (deciding, live) = package.decide_drain();
        if live > 0 {
            drop(deciding);
            return Err(bound(live));
        }
        deciding.drain();
        Ok(Drain {
            package: Some(package),
        })
    }

    /// Live bindings into retired versions of `id` (at `version` only, when given).
    fn retired_bindings(&self, id: &PackageId, version: Option<&Version>) -> u64 {
        let packages = self.retired_packages(id, version);
        let live = packages.iter().map(|p| p.live_bindings()).sum();
        // Dropped after the lock: one of these may be the last reference to its library.
        drop(packages);
        live
    }

    /// The retired versions of `id` (at `version` only, when given) still alive.
    fn retired_packages(
        &self,
        id: &PackageId,
        version: Option<&Version>,
    ) -> Vec<Arc<LoadedPackage>> {
        let retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.iter().filter_map(|r| r.is(id, version)).collect()
    }

    /// Waits until no binding into any loaded or retired version of `id` is alive, or until
    /// `deadline`; answers whether none is. Woken by the drop of the last binding, not by
    /// polling. New bindings may be taken meanwhile (the package is not drained), so a change
    /// that follows must still drain.
    pub fn wait_unbound(&self, id: &PackageId, deadline: Instant) -> bool {
        let mut packages: Vec<Arc<LoadedPackage>> = self
            .lock()
            .get(id)
            .map(|e| Arc::clone(&e.package))
            .into_iter()
            .collect();
        packages.extend(self.retired_packages(id, None));
        let mut held = self.quiet.lock();
        loop {
            // Under the quiet lock: an unbind that takes a count to zero after this read sees
            // `WAITED` and needs the lock to notify, which it gets only once this thread waits.
            let live: u64 = packages.iter().map(|p| p.watch()).sum();
            if live == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            held = match self.quiet.released.wait_timeout(held, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Marks the loaded version of `id` superseded (or clears the mark): a newer committed
    /// generation wants it out or replaced, and live bindings defer that.
    pub(crate) fn set_superseded(&self, id: &PackageId, superseded: bool) {
        if let Some(entry) = self.lock().get(id) {
            entry
                .package
                .superseded
                .store(superseded, Ordering::Release);
        }
    }

    /// Every loaded package and its version.
    pub fn loaded_packages(&self) -> Vec<(PackageId, Version)> {
        let mut out: Vec<(PackageId, Version)> = self
            .snapshot
            .load()
            .packages
            .values()
            .map(|p| (p.id.clone(), p.version.clone()))
            .collect();
        out.sort();
        out
    }

    /// Whether `id` is loaded, and at which version.
    pub fn loaded_version(&self, id: &PackageId) -> Option<Version> {
        self.snapshot
            .load()
            .packages
            .get(id)
            .map(|p| p.version.clone())
    }

    /// The best enabled kernel for `selector`: highest priority, then lowest impl id. A
    /// candidate whose package is draining counts as gone (the next best is chosen), and so
    /// does one needing CPU instruction sets this CPU lacks (its descriptor's
    /// `required_cpu_isa`).
    pub fn select(&self, selector: &Selector) -> Option<KernelBinding> {
        let snap = self.snapshot.load();
        let isa = self.service.runs_isa;
        snap.candidates(selector.op_kind, selector.op_name.as_ref())
            .iter()
            .filter(|op| selector.backend.is_none_or(|b| op.kernel.backend == b))
            .filter(|op| op.kernel.required_cpu_isa.difference(isa).is_empty())
            .find_map(KernelBinding::try_new)
    }

    /// The enabled kernel with this impl id; `None` also while its package is draining.
    ///
    /// The lookup reads this thread's copy of the registry's impl-id table rather than the
    /// snapshot, so that the binding's own count and reference are its only shared writes
    /// (see `id_lookup`).
    #[inline]
    pub fn find_by_id(&self, impl_id: &ImplId) -> Option<KernelBinding> {
        self.ids
            .find(impl_id, || Arc::clone(&self.snapshot.load().ids))
            .and_then(KernelBinding::bind)
    }

    /// The enabled runners, best first (descending priority, then runner id), without those
    /// whose package is draining.
    pub fn runners(&self) -> Vec<RunnerBinding> {
        self.snapshot
            .load()
            .runners
            .iter()
            .filter_map(RunnerBinding::try_new)
            .collect()
    }

    /// The runner with this id, if enabled; `None` also while its package is draining.
    pub fn find_runner(&self, runner_id: &RunnerId) -> Option<RunnerBinding> {
        self.snapshot
            .load()
            .runners
            .iter()
            .find(|r| &r.runner.runner_id == runner_id)
            .and_then(RunnerBinding::try_new)
    }

    /// Live bindings and runner references into any loaded or retired version of `id`.
    pub fn live_bindings(&self, id: &PackageId) -> u64 {
        let current = self.lock().get(id).map_or(0, PackageEntry::live_bindings);
        current + self.retired_bindings(id, None)
    }

    /// Live bindings and runner references into `id@version` alone, loaded or retired: what
    /// still holds a version that a lifecycle change replaced.
    pub fn live_bindings_of(&self, id: &PackageId, version: &Version) -> u64 {
        let current = self
            .lock()
            .get(id)
            .filter(|e| &e.package.version == version)
            .map_or(0, PackageEntry::live_bindings);
        current + self.retired_bindings(id, Some(version))
    }
}

/// A kernel registry together with the right to change it: whoever owns one publishes into it,
/// drains and unloads its packages; everyone else reaches it as the [`KernelRegistry`] it derefs
/// to, which only looks up and binds.
///
/// The host owns the one it serves from and changes it only inside its lifecycle transactions,
/// so the registry a runner gets from the host has no mutators at all. A test, a benchmark or a
/// tool that loads plugins without a store (the registration check) owns one of its own.
#[derive(Debug, Default)]
pub struct OwnedRegistry {
    registry: KernelRegistry,
}

impl OwnedRegistry {
    /// An empty registry whose operation service knows the host CPU and no GPU.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry whose operation service resolves against `devices`.
    pub fn with_devices(devices: DeviceSupport) -> Self {
        OwnedRegistry {
            registry: KernelRegistry::with_devices(devices),
        }
    }

    /// Checks that `plugin` can join the registry as `id@version` (no impl id or runner id that
    /// another package provides) and prepares its entry. Nothing is visible until
    /// [`OwnedRegistry::commit`].
    pub fn prepare(
        &self,
        id: &PackageId,
        version: &Version,
        plugin: LoadedPlugin,
        enabled: bool,
    ) -> Result<PreparedPublication, RegistryChangeError> {
        self.registry.prepare(id, version, plugin, enabled)
    }

    /// Makes a prepared publication visible, replacing the package's previous version if one was
    /// loaded (that version is never bound again; its library closes when its last binding
    /// goes). Drain the previous version first ([`OwnedRegistry::drain`]) where a live
    /// binding must refuse the replacement.
    pub fn commit(&self, prepared: PreparedPublication) {
        self.registry.commit(prepared);
    }

    /// Enables or disables a loaded package's kernels and runners for lookups.
    pub fn set_enabled(&self, id: &PackageId, enabled: bool) -> Result<(), RegistryChangeError> {
        self.registry.set_enabled(id, enabled)
    }

    /// Removes a package from the registry. New lookups no longer find it, and no binding into
    /// it can be taken any more (also not from a snapshot read before); its library closes when
    /// the last binding into it is dropped (at once if there is none). Drain it first
    /// ([`OwnedRegistry::drain`]) where a live binding must refuse the unload.
    pub fn unload(&self, id: &PackageId) -> Result<Unloaded, RegistryChangeError> {
        self.registry.unload(id)
    }

    /// Starts draining `id` for a change that must not run while anything is bound into the
    /// package: no new binding into it can be taken while the returned [`Drain`] lives, and the
    /// drain is refused with [`RegistryChangeError::Bound`] while bindings are alive (see the
    /// [module documentation](crate::registry)). [`Drain::finish`] it after the unload or replacement that
    /// follows; drop it to abort.
    pub fn drain(&self, id: &PackageId) -> Result<Drain, RegistryChangeError> {
        self.registry.drain(id)
    }

    /// Marks the loaded version of `id` superseded (or clears the mark): a newer committed
    /// generation wants it out or replaced, and live bindings defer that.
    pub fn set_superseded(&self, id: &PackageId, superseded: bool) {
        self.registry.set_superseded(id, superseded);
    }

    /// The table a plugin loaded into this registry finds in its host table, with the owner the
    /// loader keeps for as long as the library is loaded. Its calls never wait for a busy
    /// handle: they are refused with `GUILD_STATUS_ERR_BUSY` instead.
    pub fn plugin_service(&self) -> guild_ports::loader::ServiceTable {
        self.registry.plugin_service()
    }
}

impl std::ops::Deref for OwnedRegistry {
    type Target = KernelRegistry;
    fn deref(&self) -> &KernelRegistry {
        &self.registry
    }
}

impl Drop for KernelRegistry {
    fn drop(&mut self) {
        // Close the service first: from now on either table answers GUILD_STATUS_ERR_STATE, also
        // to a library that an escaped binding keeps loaded. C handles no call is using are
        // released here (against the service's contract, they outlived the registry); one in
        // use is released by its caller or with the core.
        let orphans = self.service.close();
        let old = self.snapshot.swap(Arc::new(Snapshot::default()));
        let packages = std::mem::take(&mut *self.lock());
        drop(orphans);
        drop(old);
        drop(packages);
    }
}

/// The provider behind a C operation handle ([`KernelRegistry::c_handle_provider`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleProvider {
    /// The package whose implementation the handle runs.
    pub package: PackageId,
    /// Its version, which the handle keeps loaded until it is released.
    pub version: Version,
    /// Whether that version is still the one the registry serves ([`KernelBinding::is_current`]).
    pub is_current: bool,
}
