//! In-memory fakes of the ports, so that the app's tests run without opening a single library.
//!
//! [`FakeLoader`] "loads" plugins described in Rust: a map from library path to a
//! [`FakePlugin`] (what it registers, or the error its load ends in). It keeps the real loader's
//! contract where a test can tell the difference: registrations are checked against the
//! request's `provided_ops` and `provided_runners` and for duplicates with the same error kinds,
//! a failure after `init` counts a shutdown, and the library stays "loaded" exactly as long as an
//! `Arc` of its [`LoadedLibrary`] lives. Counters per path show what happened: how many
//! libraries are live, how many shutdowns ran, and which paths were opened in which order.
//!
//! [`FakeModel`] is a model file built in memory (metadata and tensors), for model runner selection's
//! tests.
//!
//! The provider behind what [`fake_kernel`], [`fake_operation`] and [`fake_runner`] build is
//! [`NoCallbacks`]: there is no C descriptor behind a fake. [`FakeProvider`] is a GOP1 provider
//! written in Rust (closures for validate, query_scratch and execute, and counts of the calls),
//! which [`fake_operation_with`] registers, so that the app's operation service can resolve and
//! execute over the fake loader exactly as over the dlopen one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use guild_abi::text::set_error;
use guild_abi::{guild_error_info_t, guild_scratch_request_v1_t, guild_status_t, GUILD_STATUS_OK};
use guild_domain::ids::{ImplId, PackageId, RunnerId};
use guild_domain::operation::{Backend, CpuIsa, OpCandidate, ProviderRefusal};
use guild_domain::version::Version;

use crate::device::{DeviceError, StreamEvents, StreamRef, WorkMark};
use crate::loader::{
    LoadError, LoadErrorKind, LoadRequest, LoadedLibrary, LoadedPlugin, PluginLoader,
    RegisteredKernel, RegisteredRunner,
};
use crate::model::{MetaValue, ModelError, ModelErrorKind, ModelFile, ModelTensor};
use crate::provider::{ExecuteCall, KernelProvider, NoCallbacks, QueryCall};

/// `GUILD_OP_CUSTOM`, the op kind of every namespaced operation.
pub const OP_KIND_CUSTOM: u32 = guild_abi::GUILD_OP_CUSTOM;

/// What a fake library registers when it is loaded, or how its load fails.
#[derive(Debug, Clone, Default)]
pub struct FakePlugin {
    /// Registered kernels, in registration order.
    pub kernels: Vec<RegisteredKernel>,
    /// Registered runners, in registration order.
    pub runners: Vec<RegisteredRunner>,
    /// When set, every load of this plugin fails with this kind. For the kinds that a real
    /// loader only reaches after calling `init` (`InitFailed`, `RegistrationRefused`,
    /// `RegistrationMismatch`), the fake counts a shutdown, as the real plugin would see one.
    pub init_error: Option<LoadErrorKind>,
}

impl FakePlugin {
    /// A plugin that registers nothing.
    pub fn new() -> Self {
        FakePlugin::default()
    }

    /// The same plugin, also registering `kernel`.
    pub fn with_kernel(mut self, kernel: RegisteredKernel) -> Self {
        self.kernels.push(kernel);
        self
    }

    /// The same plugin, also registering `runner`.
    pub fn with_runner(mut self, runner: RegisteredRunner) -> Self {
        self.runners.push(runner);
        self
    }

    /// A plugin whose every load fails with `kind`.
    pub fn failing(kind: LoadErrorKind) -> Self {
        FakePlugin {
            init_error: Some(kind),
            ..FakePlugin::default()
        }
    }
}

/// A registered legacy (non-GOP1) kernel of `op_kind` on `backend`, priority 0, providing
/// nothing.
pub fn fake_kernel(impl_id: ImplId, op_kind: u32, backend: Backend) -> RegisteredKernel {
    RegisteredKernel {
        impl_id,
        op_kind,
        op_name: None,
        backend,
        priority: 0,
        required_cpu_isa: CpuIsa::EMPTY,
        operation: None,
        provider: Arc::new(NoCallbacks),
    }
}

/// A registered `GUILD_OP_CUSTOM` kernel with `candidate` as its GOP1 contract; id, name,
/// backend and priority are the candidate's. It provides no callbacks, so the operation service
/// can rank it but not negotiate with it; see [`fake_operation_with`].
pub fn fake_operation(candidate: OpCandidate) -> RegisteredKernel {
    RegisteredKernel {
        impl_id: candidate.impl_id.clone(),
        op_kind: OP_KIND_CUSTOM,
        op_name: Some(candidate.op_name.clone()),
        backend: candidate.backend,
        priority: candidate.priority,
        required_cpu_isa: candidate.cpu_isa,
        operation: Some(candidate),
        provider: Arc::new(NoCallbacks),
    }
}

/// A registered runner providing nothing.
pub fn fake_runner(runner_id: RunnerId, priority: i32) -> RegisteredRunner {
    RegisteredRunner {
        runner_id,
        priority,
        provider: Arc::new(NoCallbacks),
    }
}

/// [`fake_operation`] with `provider` behind it: an operation the service can negotiate with
/// and execute.
pub fn fake_operation_with(
    candidate: OpCandidate,
    provider: Arc<dyn KernelProvider>,
) -> RegisteredKernel {
    RegisteredKernel {
        provider,
        ..fake_operation(candidate)
    }
}

// ---------------------------------------------------------------------------------------------
// Providers written in Rust
// ---------------------------------------------------------------------------------------------

/// The component [`FakeProvider`] names in the error records it fills.
pub const FAKE_PROVIDER_COMPONENT: &str = "fake.provider";

/// The scratch a [`FakeProvider`] asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeScratch {
    /// Bytes of host scratch.
    pub host_bytes: u64,
    /// Bytes of device scratch.
    pub device_bytes: u64,
    /// Their alignment (0 or 1 for none; otherwise a power of two).
    pub alignment: u32,
}

type Validate = dyn Fn(QueryCall<'_>) -> Result<(), ProviderRefusal> + Send + Sync;
type QueryScratch = dyn Fn(QueryCall<'_>) -> Result<FakeScratch, ProviderRefusal> + Send + Sync;
type Execute = dyn Fn(ExecuteCall<'_>) -> Result<(), ProviderRefusal> + Send + Sync;

/// How often each of a [`FakeProvider`]'s callbacks ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeCalls {
    /// `validate` calls.
    pub validate: usize,
    /// `query_scratch` calls.
    pub query_scratch: usize,
    /// `execute` calls.
    pub execute: usize,
}

/// A GOP1 provider written in Rust: closures stand for the three callbacks, and a refusal they
/// return reaches the caller as a C provider's would (its status returned, its message in the
/// error record). By default it accepts every query, needs no scratch and executes nothing.
///
/// The closures see the C structs through the safe accessors of [`QueryCall`] and
/// [`ExecuteCall`]; reading tensor data through its `data` pointers is the closure's own
/// `unsafe` step, under [`ExecuteCall::new`]'s contract.
pub struct FakeProvider {
    validate: Box<Validate>,
    query_scratch: Box<QueryScratch>,
    execute: Box<Execute>,
    validate_calls: AtomicUsize,
    scratch_calls: AtomicUsize,
    execute_calls: AtomicUsize,
}

impl Default for FakeProvider {
    fn default() -> Self {
        FakeProvider {
            validate: Box::new(|_| Ok(())),
            query_scratch: Box::new(|_| Ok(FakeScratch::default())),
            execute: Box::new(|_| Ok(())),
            validate_calls: AtomicUsize::new(0),
            scratch_calls: AtomicUsize::new(0),
            execute_calls: AtomicUsize::new(0),
        }
    }
}

impl FakeProvider {
    /// A provider that accepts everything and does nothing.
    pub fn new() -> Self {
        FakeProvider::default()
    }

    /// The same provider, validating with `f`.
    pub fn validating(
        mut self,
        f: impl Fn(QueryCall<'_>) -> Result<(), ProviderRefusal> + Send + Sync + 'static,
    ) -> Self {
        self.validate = Box::new(f);
        self
    }

    /// The same provider, asking for scratch with `f`.
    pub fn scratch(
        mut self,
        f: impl Fn(QueryCall<'_>) -> Result<FakeScratch, ProviderRefusal> + Send + Sync + 'static,
    ) -> Self {
        self.query_scratch = Box::new(f);
        self
    }

    /// The same provider, executing with `f`.
    pub fn executing(
        mut self,
        f: impl Fn(ExecuteCall<'_>) -> Result<(), ProviderRefusal> + Send + Sync + 'static,
    ) -> Self {
        self.execute = Box::new(f);
        self
    }

    /// How often each callback has run so far.
    pub fn calls(&self) -> FakeCalls {
        FakeCalls {
            validate: self.validate_calls.load(Ordering::SeqCst),
            query_scratch: self.scratch_calls.load(Ordering::SeqCst),
            execute: self.execute_calls.load(Ordering::SeqCst),
        }
    }
}

impl fmt::Debug for FakeProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeProvider")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

/// A callback's outcome as C reports it: the status, and on failure the error record filled.
fn report(outcome: Result<(), ProviderRefusal>, error: &mut guild_error_info_t) -> guild_status_t {
    match outcome {
        Ok(()) => GUILD_STATUS_OK,
        Err(refusal) => {
            set_error(
                error,
                refusal.status,
                FAKE_PROVIDER_COMPONENT,
                &refusal.message,
            );
            refusal.status
        }
    }
}

impl KernelProvider for FakeProvider {
    fn validate(&self, query: QueryCall<'_>, error: &mut guild_error_info_t) -> guild_status_t {
        self.validate_calls.fetch_add(1, Ordering::SeqCst);
        report((self.validate)(query), error)
    }

    fn query_scratch(
        &self,
        query: QueryCall<'_>,
        scratch: &mut guild_scratch_request_v1_t,
        error: &mut guild_error_info_t,
    ) -> guild_status_t {
        self.scratch_calls.fetch_add(1, Ordering::SeqCst);
        let outcome = (self.query_scratch)(query).map(|s| {
            scratch.host_bytes = s.host_bytes;
            scratch.device_bytes = s.device_bytes;
            scratch.alignment = s.alignment;
        });
        report(outcome, error)
    }

    fn execute(&self, call: ExecuteCall<'_>, error: &mut guild_error_info_t) -> guild_status_t {
        self.execute_calls.fetch_add(1, Ordering::SeqCst);
        report((self.execute)(call), error)
    }
}

/// What the fake loader has seen, shared with the libraries it hands out.
#[derive(Debug, Default)]
struct Tally {
    live: BTreeMap<PathBuf, usize>,
    shutdowns: BTreeMap<PathBuf, usize>,
    opened: Vec<PathBuf>,
}

/// A [`PluginLoader`] over plugins described in Rust; see the module documentation.
#[derive(Default)]
pub struct FakeLoader {
    plugins: Mutex<BTreeMap<PathBuf, FakePlugin>>,
    tally: Arc<Mutex<Tally>>,
}

/// Locks a mutex, ignoring poisoning: a test that panicked elsewhere must not hide the counts.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeLoader {
    /// A loader with no plugins.
    pub fn new() -> Self {
        FakeLoader::default()
    }

    /// Makes `library` load as `plugin` from now on, replacing what was there.
    pub fn insert(&self, library: impl Into<PathBuf>, plugin: FakePlugin) {
        lock(&self.plugins).insert(library.into(), plugin);
    }

    /// Forgets the plugin at `library`; later loads of it fail to open. Libraries already
    /// loaded stay loaded.
    pub fn remove(&self, library: &Path) -> Option<FakePlugin> {
        lock(&self.plugins).remove(library)
    }

    /// Libraries loaded and not yet dropped, over all paths.
    pub fn live_libraries(&self) -> usize {
        lock(&self.tally).live.values().sum()
    }

    /// Libraries loaded from `library` and not yet dropped.
    pub fn live_libraries_of(&self, library: &Path) -> usize {
        lock(&self.tally).live.get(library).copied().unwrap_or(0)
    }

    /// Shutdowns run, over all paths: one per dropped library and one per load that failed
    /// after `init`.
    pub fn shutdowns(&self) -> usize {
        lock(&self.tally).shutdowns.values().sum()
    }

    /// Shutdowns run for `library`.
    pub fn shutdowns_of(&self, library: &Path) -> usize {
        lock(&self.tally)
            .shutdowns
            .get(library)
            .copied()
            .unwrap_or(0)
    }

    /// Every path `load` was asked to open, in order, successful or not.
    pub fn opened(&self) -> Vec<PathBuf> {
        lock(&self.tally).opened.clone()
    }

    fn count_shutdown(&self, library: &Path) {
        *lock(&self.tally)
            .shutdowns
            .entry(library.to_path_buf())
            .or_default() += 1;
    }
}

impl fmt::Debug for FakeLoader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeLoader")
            .field("plugins", &lock(&self.plugins).keys().collect::<Vec<_>>())
            .field("tally", &*lock(&self.tally))
            .finish()
    }
}

impl PluginLoader for FakeLoader {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        let path = request.library.clone();
        lock(&self.tally).opened.push(path.clone());
        let Some(plugin) = lock(&self.plugins).get(&path).cloned() else {
            return Err(LoadError::new(
                LoadErrorKind::Open {
                    reason: format!("no fake plugin is registered at {}", path.display()),
                },
                request,
            ));
        };
        if let Some(kind) = plugin.init_error {
            let after_init = matches!(
                kind,
                LoadErrorKind::InitFailed { .. }
                    | LoadErrorKind::RegistrationRefused { .. }
                    | LoadErrorKind::ExtensionRefused { .. }
                    | LoadErrorKind::RegistrationMismatch { .. }
            );
            if after_init {
                self.count_shutdown(&path);
            }
            return Err(LoadError::new(kind, request));
        }
        if let Some(kind) = check_registrations(request, &plugin) {
            self.count_shutdown(&path);
            return Err(LoadError::new(kind, request));
        }
        *lock(&self.tally).live.entry(path.clone()).or_default() += 1;
        Ok(LoadedPlugin {
            library: Arc::new(FakeLibrary {
                package: request.package.clone(),
                version: request.version.clone(),
                path,
                tally: Arc::clone(&self.tally),
            }),
            kernels: plugin.kernels,
            runners: plugin.runners,
        })
    }
}

/// The real loader's registration rules: no id twice, and exactly the declared ids.
fn check_registrations(request: &LoadRequest, plugin: &FakePlugin) -> Option<LoadErrorKind> {
    let kernels: Vec<&str> = plugin.kernels.iter().map(|k| k.impl_id.as_str()).collect();
    let runners: Vec<&str> = plugin
        .runners
        .iter()
        .map(|r| r.runner_id.as_str())
        .collect();
    for (what, ids) in [("impl id", &kernels), ("runner id", &runners)] {
        let mut seen = BTreeSet::new();
        if let Some(twice) = ids.iter().find(|id| !seen.insert(**id)) {
            return Some(LoadErrorKind::RegistrationRefused {
                reason: format!("{what} {twice} is registered twice"),
            });
        }
    }
    let declared_ops: Vec<&str> = request.provided_ops.iter().map(|id| id.as_str()).collect();
    let declared_runners: Vec<&str> = request
        .provided_runners
        .iter()
        .map(|id| id.as_str())
        .collect();
    mismatch(&kernels, &declared_ops).or_else(|| mismatch(&runners, &declared_runners))
}

fn mismatch(registered: &[&str], declared: &[&str]) -> Option<LoadErrorKind> {
    let registered: BTreeSet<&str> = registered.iter().copied().collect();
    let declared: BTreeSet<&str> = declared.iter().copied().collect();
    (registered != declared).then(|| LoadErrorKind::RegistrationMismatch {
        registered: registered.into_iter().map(str::to_owned).collect(),
        declared: declared.into_iter().map(str::to_owned).collect(),
    })
}

/// A fake loaded library. Dropping it counts a shutdown and one live library fewer.
struct FakeLibrary {
    package: PackageId,
    version: Version,
    path: PathBuf,
    tally: Arc<Mutex<Tally>>,
}

impl LoadedLibrary for FakeLibrary {
    fn package(&self) -> &PackageId {
        &self.package
    }

    fn version(&self) -> &Version {
        &self.version
    }
}

impl fmt::Debug for FakeLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeLibrary")
            .field("package", &self.package)
            .field("version", &self.version)
            .field("path", &self.path)
            .finish()
    }
}

impl Drop for FakeLibrary {
    fn drop(&mut self) {
        let mut tally = lock(&self.tally);
        *tally.shutdowns.entry(self.path.clone()).or_default() += 1;
        if let Some(live) = tally.live.get_mut(&self.path) {
            *live = live.saturating_sub(1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

/// One thing a [`FakeStreams`] saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// A mark was recorded on `stream` of `device_id`; `mark` numbers marks from 1.
    Recorded {
        /// The device.
        device_id: i32,
        /// The stream.
        stream: StreamRef,
        /// The mark's number.
        mark: u64,
    },
    /// Mark number `mark` was waited for.
    Waited {
        /// The mark's number.
        mark: u64,
    },
    /// Mark number `mark` was dropped (waited for or not).
    Dropped {
        /// The mark's number.
        mark: u64,
    },
}

/// A device adapter without a device: it hands out numbered marks and logs every record, wait
/// and drop, so that a test can check what the host's bookkeeping did. Waits return at once,
/// with an error for streams set up to fail.
#[derive(Debug, Clone, Default)]
pub struct FakeStreams {
    inner: Arc<Mutex<FakeStreamsState>>,
}

#[derive(Debug, Default)]
struct FakeStreamsState {
    next: u64,
    events: Vec<StreamEvent>,
    failing: BTreeSet<StreamRef>,
    capturing: BTreeSet<StreamRef>,
}

impl FakeStreams {
    /// A fake with no marks, no failing streams and no captures.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, FakeStreamsState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for marks on `stream` report a device error from now on.
    pub fn fail_waits_on(&self, stream: StreamRef) {
        self.state().failing.insert(stream);
    }

    /// `stream` behaves as if it were being captured into a graph: recording gives no mark.
    pub fn capture(&self, stream: StreamRef) {
        self.state().capturing.insert(stream);
    }

    /// Everything seen so far, in order.
    pub fn events(&self) -> Vec<StreamEvent> {
        self.state().events.clone()
    }
}

impl StreamEvents for FakeStreams {
    fn record(
        &self,
        device_id: i32,
        stream: StreamRef,
    ) -> Result<Option<Box<dyn WorkMark>>, DeviceError> {
        let mut state = self.state();
        if state.capturing.contains(&stream) {
            return Ok(None);
        }
        state.next += 1;
        let mark = state.next;
        state.events.push(StreamEvent::Recorded {
            device_id,
            stream,
            mark,
        });
        Ok(Some(Box::new(FakeMark {
            streams: self.clone(),
            device_id,
            stream,
            mark,
        })))
    }
}

#[derive(Debug)]
struct FakeMark {
    streams: FakeStreams,
    device_id: i32,
    stream: StreamRef,
    mark: u64,
}

impl WorkMark for FakeMark {
    fn stream(&self) -> StreamRef {
        self.stream
    }

    fn wait(&self) -> Result<(), DeviceError> {
        let mut state = self.streams.state();
        state.events.push(StreamEvent::Waited { mark: self.mark });
        if state.failing.contains(&self.stream) {
            return Err(DeviceError {
                device_id: self.device_id,
                message: format!("fake failure on stream {:#x}", self.stream.0),
            });
        }
        Ok(())
    }
}

impl Drop for FakeMark {
    fn drop(&mut self) {
        self.streams
            .state()
            .events
            .push(StreamEvent::Dropped { mark: self.mark });
    }
}

// ---------------------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------------------

/// A model file built in memory: metadata in insertion order and tensors whose bytes are held
/// in a buffer, laid out one after another from offset 0. Nothing is read from disk, so a test
/// describes exactly the model a runner should see.
///
/// Tensor sizes are computed from the dtype for the unquantised types (`F32`, `F16`, `BF16`,
/// the integer types); other dtypes take one byte per element unless the bytes are given with
/// [`FakeModel::with_tensor_data`].
#[derive(Debug, Clone)]
pub struct FakeModel {
    location: PathBuf,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<ModelTensor>,
    data: Vec<Vec<u8>>,
}

impl FakeModel {
    /// An empty model that says it was read from `location`.
    pub fn new(location: impl Into<PathBuf>) -> Self {
        FakeModel {
            location: location.into(),
            metadata: Vec::new(),
            tensors: Vec::new(),
            data: Vec::new(),
        }
    }

    /// The same model with `key` set to `value` (replacing an earlier value of `key` in place).
    pub fn with_meta(mut self, key: &str, value: MetaValue) -> Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// The same model without `key`.
    pub fn without_meta(mut self, key: &str) -> Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// The same model with a zero-filled tensor `name` of `dtype` (a `GUILD_DTYPE_*` id) and
    /// `dims` (innermost first).
    pub fn with_tensor(self, name: &str, dtype: u32, dims: &[u64]) -> Self {
        let elements = dims.iter().product::<u64>();
        let size = elements.saturating_mul(fake_element_bytes(dtype));
        let bytes = vec![0; usize::try_from(size).unwrap_or(usize::MAX)];
        self.with_tensor_data(name, dtype, dims, bytes)
    }

    /// The same model with a tensor whose stored bytes are `bytes`.
    pub fn with_tensor_data(
        mut self,
        name: &str,
        dtype: u32,
        dims: &[u64],
        bytes: Vec<u8>,
    ) -> Self {
        let offset = self.tensors.last().map_or(0, |t| t.offset + t.size_bytes);
        self.tensors.push(ModelTensor {
            name: name.to_owned(),
            dtype,
            dims: dims.to_vec(),
            size_bytes: bytes.len() as u64,
            offset,
        });
        self.data.push(bytes);
        self
    }

    /// The same model without tensor `name` (later tensors keep their offsets).
    pub fn without_tensor(mut self, name: &str) -> Self {
        if let Some(index) = self.tensors.iter().position(|t| t.name == name) {
            self.tensors.remove(index);
            self.data.remove(index);
        }
        self
    }

    /// The model behind the port, ready to hand to model runner selection.
    pub fn into_arc(self) -> Arc<dyn ModelFile> {
        Arc::new(self)
    }
}

/// Bytes per element of the dtypes a fake sizes itself: GGML's F32 (0), F16 (1), I8 (24),
/// I16 (25), I32 (26), I64 (27), F64 (28) and BF16 (30); one byte for anything else.
fn fake_element_bytes(dtype: u32) -> u64 {
    match dtype {
        0 | 26 => 4,
        1 | 25 | 30 => 2,
        27 | 28 => 8,
        _ => 1,
    }
}

impl ModelFile for FakeModel {
    fn location(&self) -> &Path {
        &self.location
    }

    fn keys(&self) -> Vec<&str> {
        self.metadata.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn metadata(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }

    fn tensor_data(&self, index: usize) -> Result<&[u8], ModelError> {
        self.data
            .get(index)
            .map(Vec::as_slice)
            .ok_or_else(|| ModelError {
                kind: ModelErrorKind::NoSuchTensor(format!(
                    "tensor {index} of {}",
                    self.tensors.len()
                )),
                location: self.location.clone(),
                at: None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use guild_domain::version::PackedVersion;

    fn id(text: &str) -> ImplId {
        ImplId::new(text).expect("a valid impl id")
    }

    fn request(path: &str, ops: &[&str], runners: &[&str]) -> LoadRequest {
        LoadRequest {
            package: PackageId::new("test.fake").expect("a valid package id"),
            version: Version::new(1, 2, 3),
            library: PathBuf::from(path),
            provided_ops: ops.iter().map(|op| id(op)).collect(),
            provided_runners: runners
                .iter()
                .map(|r| RunnerId::new(*r).expect("a valid runner id"))
                .collect(),
            host_abi: PackedVersion::KERNEL_ABI_V1,
            operations: None,
        }
    }

    fn kind_of(result: Result<LoadedPlugin, LoadError>) -> LoadErrorKind {
        match result {
            Ok(plugin) => panic!("loaded {:?}", plugin.kernels),
            Err(e) => *e.kind,
        }
    }

    #[test]
    fn a_loaded_fake_lives_until_its_last_arc_drops() {
        let loader = FakeLoader::new();
        loader.insert(
            "/p/liba.so",
            FakePlugin::new()
                .with_kernel(fake_kernel(id("test.a.add"), 16, Backend::Cpu))
                .with_runner(fake_runner(RunnerId::new("test.a.run").expect("valid"), 3)),
        );
        let plugin = loader
            .load(&request("/p/liba.so", &["test.a.add"], &["test.a.run"]))
            .expect("loads");
        assert_eq!(plugin.library.package().as_str(), "test.fake");
        assert_eq!(plugin.library.version(), &Version::new(1, 2, 3));
        assert_eq!(plugin.kernels[0].impl_id.as_str(), "test.a.add");
        assert_eq!(plugin.runners[0].priority, 3);
        let library = Arc::clone(&plugin.library);
        drop(plugin);
        assert_eq!(loader.live_libraries_of(Path::new("/p/liba.so")), 1);
        assert_eq!(loader.shutdowns(), 0);
        drop(library);
        assert_eq!(loader.live_libraries(), 0);
        assert_eq!(loader.shutdowns_of(Path::new("/p/liba.so")), 1);
        assert_eq!(loader.opened(), [PathBuf::from("/p/liba.so")]);
    }

    #[test]
    fn registrations_follow_the_real_loaders_rules() {
        let loader = FakeLoader::new();
        let add = || fake_kernel(id("test.a.add"), 16, Backend::Cpu);
        loader.insert(
            "/p/dup.so",
            FakePlugin::new().with_kernel(add()).with_kernel(add()),
        );
        loader.insert("/p/one.so", FakePlugin::new().with_kernel(add()));

        assert_eq!(
            kind_of(loader.load(&request("/p/dup.so", &["test.a.add"], &[]))),
            LoadErrorKind::RegistrationRefused {
                reason: "impl id test.a.add is registered twice".into()
            }
        );
        assert_eq!(
            kind_of(loader.load(&request("/p/one.so", &["test.a.add", "test.a.mul"], &[]))),
            LoadErrorKind::RegistrationMismatch {
                registered: vec!["test.a.add".into()],
                declared: vec!["test.a.add".into(), "test.a.mul".into()],
            }
        );
        assert_eq!(
            kind_of(loader.load(&request("/p/none.so", &[], &[]))),
            LoadErrorKind::Open {
                reason: "no fake plugin is registered at /p/none.so".into()
            }
        );
        assert_eq!(loader.live_libraries(), 0);
        assert_eq!(
            loader.shutdowns(),
            2,
            "both refused registrations ran shutdown"
        );
    }

    #[test]
    fn a_configured_failure_counts_a_shutdown_only_after_init() {
        let loader = FakeLoader::new();
        let init_failed = LoadErrorKind::InitFailed {
            status: -9,
            status_name: "GUILD_STATUS_ERR_DEVICE",
            component: "test.fake".into(),
            message: "no device".into(),
        };
        loader.insert("/p/init.so", FakePlugin::failing(init_failed.clone()));
        loader.insert(
            "/p/entry.so",
            FakePlugin::failing(LoadErrorKind::MissingEntry {
                symbol: "guild_plugin_entry_v1",
            }),
        );
        assert_eq!(
            kind_of(loader.load(&request("/p/init.so", &[], &[]))),
            init_failed
        );
        assert_eq!(loader.shutdowns_of(Path::new("/p/init.so")), 1);
        assert!(matches!(
            kind_of(loader.load(&request("/p/entry.so", &[], &[]))),
            LoadErrorKind::MissingEntry { .. }
        ));
        assert_eq!(loader.shutdowns_of(Path::new("/p/entry.so")), 0);
    }
}
