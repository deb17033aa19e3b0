//! The kernel registry and the model-runner registry: what loaded plugins registered, readable
//! without taking a lock, with bindings that keep the provider's code loaded.
//!
//! Readers load an immutable [`Snapshot`] through arc-swap; writers (publication, enable,
//! disable, unload) build a new snapshot and swap it in while holding the registry's lifecycle
//! lock, so that they are serialised with each other and never block a reader.
//!
//! A [`KernelBinding`] is the spec's aliasing shared pointer: one `Arc` that keeps both the stored
//! operation and the library it points into alive. The library of a package that was unloaded or
//! replaced closes when its last binding is dropped, never earlier.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arc_swap::ArcSwap;
use guild_abi::guild_operation_service_v1_t;
use guild_domain::ids::{ImplId, OpName, PackageId, RunnerId};
use guild_domain::operation::{Backend, OpCandidate};
use guild_domain::version::Version;
use guild_ports::loader::{LoadedLibrary, LoadedPlugin, RegisteredKernel, RegisteredRunner};

use crate::operations::core::ServiceCore;
use crate::operations::DeviceSupport;

/// One loaded package version and its library.
pub struct LoadedPackage {
    /// The package.
    pub id: PackageId,
    /// The version whose library this is.
    pub version: Version,
    library: Arc<dyn LoadedLibrary>,
}

impl fmt::Debug for LoadedPackage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPackage")
            .field("id", &self.id)
            .field("version", &self.version)
            .finish()
    }
}

impl LoadedPackage {
    /// The library, for callers that must keep it loaded alongside a pointer into it.
    pub fn library(&self) -> &Arc<dyn LoadedLibrary> {
        &self.library
    }
}

/// A registered kernel as the registry stores it: the copy the loader made, the package that
/// keeps its code loaded, and the count of live bindings to it. The count sits beside the `Arc`'s
/// own reference count, so taking a binding touches one cache line per kernel, and threads that
/// bind different kernels of one package do not contend.
#[derive(Debug)]
pub struct StoredOp {
    /// The host's copy of what the plugin registered.
    pub kernel: RegisteredKernel,
    /// The package whose library holds the kernel's code.
    pub package: Arc<LoadedPackage>,
    bindings: AtomicU64,
}

/// A live reference to a registered kernel. While it exists, the kernel's library stays loaded
/// and counts as a lease on its package.
pub struct KernelBinding {
    op: Arc<StoredOp>,
}

impl KernelBinding {
    /// Binds a stored op. Within the crate only: the operation service binds the very op it
    /// negotiated with, which may already have been replaced in the snapshot.
    pub(crate) fn new(op: Arc<StoredOp>) -> Self {
        // Relaxed is enough: the count informs lease decisions, while the library's lifetime is
        // guaranteed by the `Arc` the binding holds, not by the count.
        op.bindings.fetch_add(1, Ordering::Relaxed);
        KernelBinding { op }
    }

    /// The registered kernel.
    pub fn kernel(&self) -> &RegisteredKernel {
        &self.op.kernel
    }

    /// The package that provides it.
    pub fn package(&self) -> &PackageId {
        &self.op.package.id
    }

    /// The version of that package.
    pub fn version(&self) -> &Version {
        &self.op.package.version
    }

    /// The library the kernel's code lives in (kept loaded by this binding).
    pub fn library(&self) -> &Arc<dyn LoadedLibrary> {
        &self.op.package.library
    }
}

impl Clone for KernelBinding {
    fn clone(&self) -> Self {
        KernelBinding::new(self.op.clone())
    }
}

impl Drop for KernelBinding {
    fn drop(&mut self) {
        self.op.bindings.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for KernelBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelBinding")
            .field("impl_id", &self.op.kernel.impl_id)
            .field("package", &self.op.package.id)
            .finish()
    }
}

impl std::ops::Deref for KernelBinding {
    type Target = RegisteredKernel;
    fn deref(&self) -> &RegisteredKernel {
        &self.op.kernel
    }
}

/// A registered runner as stored, with its count of live references.
#[derive(Debug)]
pub struct StoredRunner {
    /// The host's copy of what the plugin registered.
    pub runner: RegisteredRunner,
    /// The package whose library holds the runner's code.
    pub package: Arc<LoadedPackage>,
    bindings: AtomicU64,
}

/// A shared reference to a registered runner, keeping its library loaded like a binding.
pub struct RunnerBinding {
    runner: Arc<StoredRunner>,
}

impl RunnerBinding {
    fn new(runner: Arc<StoredRunner>) -> Self {
        runner.bindings.fetch_add(1, Ordering::Relaxed);
        RunnerBinding { runner }
    }

    /// The registered runner.
    pub fn runner(&self) -> &RegisteredRunner {
        &self.runner.runner
    }

    /// The package that provides it.
    pub fn package(&self) -> &PackageId {
        &self.runner.package.id
    }
}

impl Drop for RunnerBinding {
    fn drop(&mut self) {
        self.runner.bindings.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for RunnerBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerBinding")
            .field("runner_id", &self.runner.runner.runner_id)
            .finish()
    }
}

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

/// An immutable view of everything registered and enabled.
#[derive(Debug, Default)]
pub struct Snapshot {
    by_id: HashMap<ImplId, Arc<StoredOp>>,
    /// Per (op_kind, op_name): candidates sorted by descending priority, then ascending impl id.
    by_op: HashMap<(u32, Option<OpName>), Vec<Arc<StoredOp>>>,
    runners: Vec<Arc<StoredRunner>>,
    packages: HashMap<PackageId, Arc<LoadedPackage>>,
    /// Per namespaced operation: its kernels that carry a GOP1 contract, best first, beside
    /// their contracts, so that resolution ranks them without copying anything.
    operations: HashMap<OpName, OperationCandidates>,
}

/// The GOP1 kernels of one namespaced operation, best first, and their contracts in the same
/// order.
#[derive(Debug, Default)]
pub struct OperationCandidates {
    /// The stored kernels, best first (descending priority, then ascending impl id).
    pub stored: Vec<Arc<StoredOp>>,
    /// Their GOP1 contracts in the domain's form, in the same order.
    pub contracts: Vec<OpCandidate>,
}

impl Snapshot {
    fn rebuild(packages: &HashMap<PackageId, PackageEntry>) -> Snapshot {
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
            let entry = snap.operations.entry(name.clone()).or_default();
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
        snap
    }

    /// The enabled GOP1 kernels of a namespaced operation, best first.
    pub fn operation(&self, name: &OpName) -> Option<&OperationCandidates> {
        self.operations.get(name)
    }

    /// The enabled kernel with this impl id.
    pub fn by_id(&self, impl_id: &ImplId) -> Option<&Arc<StoredOp>> {
        self.by_id.get(impl_id)
    }

    /// Every enabled candidate for an operation, best first.
    pub fn candidates(&self, op_kind: u32, op_name: Option<&OpName>) -> &[Arc<StoredOp>] {
        self.by_op
            .get(&(op_kind, op_name.cloned()))
            .map(Vec::as_slice)
            .unwrap_or(&[])
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
        let ops: u64 = self
            .ops
            .iter()
            .map(|o| o.bindings.load(Ordering::Relaxed))
            .sum();
        let runners: u64 = self
            .runners
            .iter()
            .map(|r| r.bindings.load(Ordering::Relaxed))
            .sum();
        ops + runners
    }
}

/// A package version that left the registry, remembered weakly so that the bindings still
/// pointing into it count as leases until they are gone.
#[derive(Debug)]
struct Retired {
    id: PackageId,
    ops: Vec<Weak<StoredOp>>,
    runners: Vec<Weak<StoredRunner>>,
}

impl Retired {
    fn live_bindings(&self) -> u64 {
        let ops: u64 = self
            .ops
            .iter()
            .filter_map(Weak::upgrade)
            .map(|o| o.bindings.load(Ordering::Relaxed))
            .sum();
        let runners: u64 = self
            .runners
            .iter()
            .filter_map(Weak::upgrade)
            .map(|r| r.bindings.load(Ordering::Relaxed))
            .sum();
        ops + runners
    }

    fn is_gone(&self) -> bool {
        self.ops.iter().all(|w| w.strong_count() == 0)
            && self.runners.iter().all(|w| w.strong_count() == 0)
    }
}

/// Why the kernel registry refused a change. The registry is unchanged after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryChangeError {
    /// Another loaded package already provides this implementation id (ids are unique across
    /// the registry).
    #[error("{package} registers {impl_id}, which {owner} already provides")]
    DuplicateImplId {
        /// `id@version` of the package being published.
        package: String,
        /// The contested implementation id.
        impl_id: ImplId,
        /// `id@version` of the package that provides it.
        owner: String,
    },
    /// Another loaded package already provides this runner id.
    #[error("{package} registers runner {runner_id}, which {owner} already provides")]
    DuplicateRunnerId {
        /// `id@version` of the package being published.
        package: String,
        /// The contested runner id.
        runner_id: RunnerId,
        /// `id@version` of the package that provides it.
        owner: String,
    },
    /// The package is not in the registry.
    #[error("package {package} is not loaded")]
    NotLoaded {
        /// The package asked for.
        package: PackageId,
    },
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

/// The kernel registry (with the runner registry beside it). See the module documentation.
pub struct KernelRegistry {
    snapshot: Arc<ArcSwap<Snapshot>>,
    /// The writer side: the packages the registry holds. Locking it is the registry's share of
    /// the lifecycle transaction.
    writer: Mutex<HashMap<PackageId, PackageEntry>>,
    /// Packages that left the registry while bindings still pointed into them; kept weakly to
    /// count their leases until the last binding goes.
    retired: Mutex<Vec<Retired>>,
    /// The operation service over this registry. Every library loaded with its table keeps the
    /// core alive too, so a plugin's late call finds it closed, never freed.
    service: Arc<ServiceCore>,
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
/// it without [`KernelRegistry::commit`] discards the loaded plugin (its library closes).
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
            service: ServiceCore::new(Arc::clone(&snapshot), devices),
            snapshot,
            writer: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// The C operation service over this registry, for in-process runners (plugins receive the
    /// same table through their host table). The table and its `user` stay valid until the
    /// registry is dropped; handles resolved through it must be released before that.
    ///
    /// Rust code normally uses [`OperationService`](crate::OperationService) instead; this
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
    /// use guild_abi::{
    ///     guild_error_info_t, guild_op_handle_t, guild_operation_query_v1_t,
    ///     guild_scratch_request_v1_t, guild_tensor_desc_v1_t, GUILD_BACKEND_CPU,
    ///     GUILD_BUDGET_UNLIMITED, GUILD_DTYPE_F32, GUILD_MAX_TENSOR_RANK, GUILD_MEMORY_HOST,
    ///     GUILD_OPERATION_QUERY_VERSION, GUILD_STATUS_OK, GUILD_SYNC_HOST_BLOCKING,
    /// };
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (host, _, _) = guild_host::Host::open_dir(std::path::Path::new("/var/lib/guild"))?;
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

    /// C handles resolved through either C table and not yet released.
    pub fn live_c_handles(&self) -> usize {
        self.service.handles.live()
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
    pub fn prepare(
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
        let package = Arc::new(LoadedPackage {
            id: id.clone(),
            version: version.clone(),
            library: plugin.library,
        });
        let ops = plugin
            .kernels
            .into_iter()
            .map(|kernel| {
                Arc::new(StoredOp {
                    kernel,
                    package: package.clone(),
                    bindings: AtomicU64::new(0),
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
                    bindings: AtomicU64::new(0),
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
    /// loaded (that version's library closes when its last binding goes).
    pub fn commit(&self, prepared: PreparedPublication) {
        let mut writer = self.lock();
        let id = prepared.entry.package.id.clone();
        let old = writer.insert(id, prepared.entry);
        if let Some(old) = &old {
            self.retire(old);
        }
        let old_snapshot = self.snapshot.swap(Arc::new(Snapshot::rebuild(&writer)));
        drop(writer);
        // Dropping the replaced entry and snapshot may close a library and run the plugin's
        // shutdown; that happens after the writer lock is released, so a shutdown that calls
        // back into the host cannot deadlock on it.
        drop(old);
        drop(old_snapshot);
    }

    /// Enables or disables a loaded package's kernels and runners for lookups.
    pub fn set_enabled(&self, id: &PackageId, enabled: bool) -> Result<(), RegistryChangeError> {
        let mut writer = self.lock();
        let entry = writer
            .get_mut(id)
            .ok_or_else(|| RegistryChangeError::NotLoaded {
                package: id.clone(),
            })?;
        entry.enabled = enabled;
        let old_snapshot = self.snapshot.swap(Arc::new(Snapshot::rebuild(&writer)));
        drop(writer);
        drop(old_snapshot);
        Ok(())
    }

    /// Removes a package from the registry. New lookups no longer find it; its library closes
    /// when the last binding into it is dropped (at once if there is none).
    pub fn unload(&self, id: &PackageId) -> Result<Unloaded, RegistryChangeError> {
        let mut writer = self.lock();
        let entry = writer
            .remove(id)
            .ok_or_else(|| RegistryChangeError::NotLoaded {
                package: id.clone(),
            })?;
        let old_snapshot = self.snapshot.swap(Arc::new(Snapshot::rebuild(&writer)));
        drop(writer);
        let unloaded = Unloaded {
            package: id.clone(),
            version: entry.package.version.clone(),
            deferred_bindings: entry.live_bindings(),
        };
        self.retire(&entry);
        // As in `commit`: the library may close here, outside the writer lock.
        drop(entry);
        drop(old_snapshot);
        Ok(unloaded)
    }

    fn retire(&self, entry: &PackageEntry) {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|r| !r.is_gone());
        retired.push(Retired {
            id: entry.package.id.clone(),
            ops: entry.ops.iter().map(Arc::downgrade).collect(),
            runners: entry.runners.iter().map(Arc::downgrade).collect(),
        });
    }

    /// Whether `id` is loaded, and at which version.
    pub fn loaded_version(&self, id: &PackageId) -> Option<Version> {
        self.snapshot
            .load()
            .packages
            .get(id)
            .map(|p| p.version.clone())
    }

    /// The best enabled kernel for `selector`: highest priority, then lowest impl id.
    pub fn select(&self, selector: &Selector) -> Option<KernelBinding> {
        let snap = self.snapshot.load();
        snap.candidates(selector.op_kind, selector.op_name.as_ref())
            .iter()
            .find(|op| selector.backend.is_none_or(|b| op.kernel.backend == b))
            .map(|op| KernelBinding::new(op.clone()))
    }

    /// The enabled kernel with this impl id.
    pub fn find_by_id(&self, impl_id: &ImplId) -> Option<KernelBinding> {
        self.snapshot
            .load()
            .by_id
            .get(impl_id)
            .map(|op| KernelBinding::new(op.clone()))
    }

    /// The enabled runners, best first (descending priority, then runner id).
    pub fn runners(&self) -> Vec<RunnerBinding> {
        self.snapshot
            .load()
            .runners
            .iter()
            .map(|r| RunnerBinding::new(r.clone()))
            .collect()
    }

    /// The runner with this id, if enabled.
    pub fn find_runner(&self, runner_id: &RunnerId) -> Option<RunnerBinding> {
        self.snapshot
            .load()
            .runners
            .iter()
            .find(|r| &r.runner.runner_id == runner_id)
            .map(|r| RunnerBinding::new(r.clone()))
    }

    /// Live bindings and runner references into any loaded or retired version of `id`.
    pub fn live_bindings(&self, id: &PackageId) -> u64 {
        let current = self.lock().get(id).map_or(0, PackageEntry::live_bindings);
        let retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let old: u64 = retired
            .iter()
            .filter(|r| &r.id == id)
            .map(Retired::live_bindings)
            .sum();
        current + old
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
