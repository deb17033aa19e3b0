//! The one implementation behind both faces of the operation service: resolution against the
//! registry's snapshot, negotiation through the providers' GOP1 callbacks, and the checked call
//! into a provider's `execute`, with the per-handle serialisation and stream bookkeeping.
//!
//! Providers are reached through the loader port's [`KernelProvider`] interface, whatever loader
//! registered them (the dlopen adapter's C plugins, or Rust providers of a fake loader). It
//! speaks the Kernel ABI's structs, so the C query built here and the caller's execute arguments
//! and error record reach the provider as they are.
//!
//! Nothing here holds a registry lock while a provider runs. Resolution reads the lock-free
//! snapshot and binds what it negotiated with; execution holds only the handle's own gate. So an
//! `execute` callback may resolve and execute other operations through the service, and a
//! `validate` or `query_scratch` callback that (wrongly) calls back in finds no lock to deadlock
//! on either.

use std::borrow::Cow;
use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use arc_swap::ArcSwap;
use guild_abi::text::fixed_buffer_text;
use guild_abi::{
    guild_device_caps_v1_t, guild_error_info_t, guild_execute_args_v1_t,
    guild_operation_query_v1_t, guild_operation_service_v1_t, guild_scratch_request_v1_t,
    guild_status_t, guild_tensor_desc_v1_t, GUILD_OPERATION_QUERY_VERSION,
    GUILD_STATUS_ERR_INTERNAL, GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_OK,
};
use guild_domain::ids::ImplId;
use guild_domain::operation::{
    check_budgets, check_tensor, choose, resolve, Backend, BackendSet, Budget, Capabilities,
    CpuIsa, DType, DeviceCaps, MemorySpace, Negotiator, Numerics, OpCandidate, OpQuery,
    ProviderRefusal, QueryError, Reason, Rejection, ScratchRequest, SyncMode, TensorDesc,
    TensorError, TensorInfo, TensorRef, TensorRole, MAX_TENSOR_RANK,
};
use guild_domain::version::OpVersionInterval;
use guild_ports::device::{DeviceError, StreamEvents, StreamRef, WorkMark};
use guild_ports::provider::{ExecuteCall, ExecuteEntry, KernelProvider, QueryCall};

use super::block::{TensorBlock, BLANK_C, LINE_PAIR};
use super::handles::{Gate, HandleTable, Running, LINE};
use super::inline::Blank;
use super::{ExecuteError, ReshapeError, ResolveError, Scratch};
use crate::snapshot::{KernelBinding, OperationCandidates, Snapshot, StoredOp};

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

/// What the host knows about the devices operations run on, and the adapter that keeps
/// stream-ordered calls safe.
#[derive(Clone)]
pub struct DeviceSupport {
    /// The host CPU's ISA bits, offered to candidates. Bits the CPU does not have (as detected
    /// at run time) steer resolution only: an execute of a kernel that needs them is refused
    /// with [`ExecuteError::MissingCpuIsa`](super::ExecuteError::MissingCpuIsa), and
    /// [`KernelRegistry::select`](crate::registry::KernelRegistry::select) passes such kernels
    /// over.
    pub cpu_isa: CpuIsa,
    /// The compute capability (times ten) of CUDA device 0, when there is one.
    pub cuda_sm: Option<u32>,
    /// Records and waits for stream work; without it, only host-blocking calls resolve.
    pub streams: Option<Arc<dyn StreamEvents>>,
}

impl fmt::Debug for DeviceSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSupport")
            .field("cpu_isa", &self.cpu_isa)
            .field("cuda_sm", &self.cuda_sm)
            .field("streams", &self.streams.is_some())
            .finish()
    }
}

/// Why a host built without the `cuda` feature has no CUDA device.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA_SUPPORT: &str = "built without CUDA support";

impl DeviceSupport {
    /// The host CPU as detected at run time, no GPU and no stream adapter.
    pub fn host() -> Self {
        DeviceSupport {
            cpu_isa: crate::platform::cpu_isa(),
            cuda_sm: None,
            streams: None,
        }
    }

    /// The host CPU, and CUDA device 0 with the CUDA stream adapter when the driver reports a
    /// usable device; otherwise [`DeviceSupport::host`] and why there is no CUDA device (no
    /// driver, a driver without a device, a host built without the `cuda` feature, ...), in
    /// words a caller may show.
    #[cfg(feature = "cuda")]
    pub fn detect() -> (Self, Option<String>) {
        let cuda = guild_adapters_cuda::Driver::load()
            .and_then(|driver| driver.device(0).map(|device| (driver, device)));
        match cuda {
            Ok((driver, device)) => (
                DeviceSupport {
                    cpu_isa: crate::platform::cpu_isa(),
                    cuda_sm: Some(device.sm),
                    streams: Some(Arc::new(guild_adapters_cuda::CudaStreams::new(driver))),
                },
                None,
            ),
            Err(e) => (Self::host(), Some(e.to_string())),
        }
    }

    /// The host CPU alone: this host was built without the `cuda` feature, so there is no CUDA
    /// adapter to ask. The reason says so.
    #[cfg(not(feature = "cuda"))]
    pub fn detect() -> (Self, Option<String>) {
        (Self::host(), Some(NO_CUDA_SUPPORT.to_owned()))
    }
}

// ---------------------------------------------------------------------------------------------
// The service core
// ---------------------------------------------------------------------------------------------

/// The state the operation service works from. The kernel registry owns one reference; every
/// library loaded with its table owns another (the loader keeps it until the library is
/// closed), so the core, and the two C tables inside it, outlive every caller that can reach
/// them. A registry that is gone leaves its core [closed](ServiceCore::close): every entry then
/// answers `GUILD_STATUS_ERR_STATE`.
pub(crate) struct ServiceCore {
    /// Never reused within the process (the C handles carry their table's tag instead).
    pub(crate) id: u64,
    snapshot: Arc<ArcSwap<Snapshot>>,
    pub(crate) devices: DeviceSupport,
    /// The CPU ISA bits a provider may need when it executes (or a kernel when it is
    /// selected): those `devices` declares that this CPU has, detected once. A declaration of more (an embedder's, or a query's device
    /// record) can steer a resolution, never an execute.
    pub(crate) runs_isa: CpuIsa,
    /// The table in-process runners use: a call on a handle that another call holds waits its
    /// turn. `user` is the address of the core's [`RunnerCell`].
    pub(crate) runner_table: guild_operation_service_v1_t,
    /// The table plugins get through their host table: a call on a busy handle is refused with
    /// `GUILD_STATUS_ERR_BUSY`, on any thread, so that providers calling each other's handles
    /// can never deadlock. `user` is the core's address with its lowest bit set.
    pub(crate) plugin_table: guild_operation_service_v1_t,
    closed: AtomicBool,
    /// The C handles resolved and not yet released.
    pub(crate) handles: HandleTable<Resolved>,
    /// How many of them were resolved through the runner's table: the embedding process's own,
    /// as against those plugins hold, which their `shutdown` releases when the host unloads them.
    pub(crate) runner_handles: AtomicUsize,
    /// Where the runner's table leads while the registry lives.
    cell: &'static RunnerCell,
    /// Where a provider's failure report goes when its C caller passed no usable error record
    /// ([`ServiceCore::deliver_unread`]); read only on that cold path.
    unread_failures: Mutex<Option<UnreadFailureSink>>,
}

/// Takes the failure reports of providers whose C callers had no record to read them from:
/// the provider's package and the report, as a plugin log record.
pub(crate) type UnreadFailureSink =
    Arc<dyn Fn(&guild_domain::ids::PackageId, &guild_adapters_posix::PluginLog) + Send + Sync>;

/// The next core's id.
static NEXT_CORE_ID: AtomicU64 = AtomicU64::new(1);

/// What a runner's table's `user` points at: the core while its registry lives, NULL after.
/// Cells are never freed (each is one pointer, kept reachable from [`RUNNER_CELLS`]), so a
/// runner's copy of the table answers `GUILD_STATUS_ERR_STATE` after its registry is gone,
/// whatever has been allocated since where the core was.
#[derive(Debug)]
pub(crate) struct RunnerCell {
    core: AtomicPtr<ServiceCore>,
}

impl RunnerCell {
    /// The core, while its registry lives.
    pub(crate) fn core(&self) -> Option<*const ServiceCore> {
        let core = self.core.load(Ordering::Acquire);
        (!core.is_null()).then_some(core.cast_const())
    }
}

/// Every runner cell made, so that leak checkers see them as deliberately kept.
static RUNNER_CELLS: Mutex<Vec<&'static RunnerCell>> = Mutex::new(Vec::new());

// SAFETY: the tables are written once, in `ServiceCore::new`, before the core is shared; their
// pointers are the core's own address and `extern "C"` functions, which any thread may use.
// Everything else in the core is Send + Sync.
unsafe impl Send for ServiceCore {}
// SAFETY: as above.
unsafe impl Sync for ServiceCore {}

impl fmt::Debug for ServiceCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceCore")
            .field("id", &self.id)
            .field("devices", &self.devices)
            .field("closed", &self.is_closed())
            .field("handles", &self.handles)
            .finish_non_exhaustive()
    }
}

impl ServiceCore {
    /// A core over `snapshot` whose two C tables start from `table` (the C service's entry
    /// points, which the caller names so that this module need not import them).
    pub(crate) fn new(
        snapshot: Arc<ArcSwap<Snapshot>>,
        devices: DeviceSupport,
        table: guild_operation_service_v1_t,
    ) -> Arc<Self> {
        let id = NEXT_CORE_ID.fetch_add(1, Ordering::Relaxed);
        let cell: &'static RunnerCell = Box::leak(Box::new(RunnerCell {
            core: AtomicPtr::new(std::ptr::null_mut()),
        }));
        RUNNER_CELLS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cell);
        let core = Arc::new_cyclic(|core: &std::sync::Weak<ServiceCore>| {
            let user: *mut c_void = core.as_ptr().cast_mut().cast();
            let mut runner_table = table;
            runner_table.user = std::ptr::from_ref(cell).cast_mut().cast();
            let mut plugin_table = table;
            plugin_table.user = user.cast::<u8>().wrapping_add(1).cast();
            ServiceCore {
                id,
                snapshot,
                runs_isa: CpuIsa::from_bits(
                    devices.cpu_isa.bits() & crate::platform::cpu_isa().bits(),
                ),
                devices,
                runner_table,
                plugin_table,
                closed: AtomicBool::new(false),
                handles: HandleTable::new(),
                runner_handles: AtomicUsize::new(0),
                cell,
                unread_failures: Mutex::new(None),
            }
        });
        cell.core
            .store(Arc::as_ptr(&core).cast_mut(), Ordering::Release);
        core
    }

    /// Marks the core's registry as gone: from now on every entry of either table answers
    /// `GUILD_STATUS_ERR_STATE` (release still lets go of what it is given). Returns the C
    /// handles that no call is using, for the registry to drop; the rest are dropped by the
    /// core itself when its last owner lets go of it.
    #[allow(clippy::vec_box)] // Each handle was boxed into its slot; they are dropped as they are.
    pub(crate) fn close(&self) -> Vec<Box<Resolved>> {
        self.closed.store(true, Ordering::Release);
        self.cell
            .core
            .store(std::ptr::null_mut(), Ordering::Release);
        let idle = self.handles.drain_idle();
        for handle in &idle {
            self.let_go(handle);
        }
        idle
    }

    /// Counts a handle the runner's table is about to hand out.
    pub(crate) fn count_runner_handle(&self, handle: &mut Resolved) {
        handle.through_runner = true;
        self.runner_handles.fetch_add(1, Ordering::AcqRel);
    }

    /// Uncounts a handle taken out of the table (released, or dropped by the registry).
    pub(crate) fn let_go(&self, handle: &Resolved) {
        if handle.through_runner {
            self.runner_handles.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Sends the failure reports no caller can read to `sink` from now on.
    pub(crate) fn send_unread_failures_to(&self, sink: UnreadFailureSink) {
        *self
            .unread_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    /// Hands `record`, the report of `handle`'s provider that failed a call whose caller passed
    /// no usable error record, to the sink, if one was given: the text is not dropped.
    #[cold]
    pub(crate) fn deliver_unread(&self, handle: &Resolved, record: &guild_error_info_t) {
        let sink = self
            .unread_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(sink) = sink {
            let log = guild_adapters_posix::PluginLog {
                level: guild_abi::GUILD_LOG_LEVEL_ERROR,
                status: record.status,
                component: fixed_buffer_text(&record.component),
                message: fixed_buffer_text(&record.message),
            };
            sink(handle.binding.package(), &log);
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The device record a query without one resolves against: device 0.
    pub(crate) fn default_device(&self) -> guild_domain::operation::DeviceCaps {
        guild_domain::operation::DeviceCaps {
            device_id: 0,
            cuda_sm: self.devices.cuda_sm,
            cpu_isa: self.devices.cpu_isa,
        }
    }

    /// Resolves a validated query against the current snapshot, negotiating with `args`.
    ///
    /// With `report`, the handle keeps why every other candidate was passed over (the Rust
    /// face offers it on request). Without it, resolution only walks the operation's candidates
    /// best first until one accepts, and keeps no text of the refusals on the way; should
    /// nothing be chosen, the walk is made again with the full report, which is then the error.
    pub(crate) fn resolve(
        &self,
        query: &OpQuery<'_>,
        args: Negotiation<'_>,
        report: bool,
    ) -> Result<Box<Resolved>, ResolveError> {
        let spec = query.spec();
        let needs_streams = spec.sync_mode != SyncMode::HostBlocking;
        if needs_streams && self.devices.streams.is_none() && spec.backends != Backend::Cpu.into() {
            return Err(no_device_adapter());
        }
        // Held while the providers negotiate, so that nothing is copied per candidate; only the
        // chosen one is bound. A guard rather than a counted reference: no reference count is
        // taken and given back (two atomic read-modify-writes of a shared line a resolution);
        // a snapshot replaced meanwhile is kept for the guard by the one replacing it.
        let snapshot = self.snapshot.load();
        static NONE: LazyLock<OperationCandidates> = LazyLock::new(OperationCandidates::default);
        // A candidate whose package a lifecycle change is draining counts as already gone.
        let entry = snapshot
            .operation(query.op_name().as_str())
            .map_or(Cow::Borrowed(&*NONE), OperationCandidates::bindable);
        let mut candidates = Cow::Borrowed(entry.contracts.as_slice());
        // An exact id registered for another operation takes part as a declaration only (the
        // domain skips other operations' candidates without calling them), so that the report
        // says what it implements instead.
        if let Some(exact) = spec.exact_impl {
            if !candidates.iter().any(|c| &c.impl_id == exact) {
                if let Some(c) = snapshot
                    .by_id(exact)
                    .and_then(|s| s.kernel.operation.as_ref())
                {
                    if c.op_name != query.op_name() {
                        candidates.to_mut().push(c.clone());
                    }
                }
            }
        }
        let chosen = if report {
            negotiate_reported(&entry, query, &args, &candidates)?
        } else {
            let negotiator = CNegotiator::new(&entry, query, &args, false);
            match choose(query, &candidates, &negotiator) {
                Ok((index, scratch)) => Chosen {
                    index,
                    scratch,
                    alignment: negotiator.last_alignment.get(),
                    passed_over: None,
                },
                // The callbacks are negotiation only, so asking them again gives the same
                // answers, now with their messages kept for the report. (Should a provider
                // accept this time after all, its acceptance is as good as any.)
                Err(_) => Chosen {
                    passed_over: None,
                    ..negotiate_reported(&entry, query, &args, &candidates)?
                },
            }
        };
        // The domain only chooses among the candidates it was given, in the same order, and an
        // appended declaration is never chosen (it names another operation).
        let Some((stored, candidate)) = entry
            .stored
            .get(chosen.index)
            .and_then(|stored| Some((stored, stored.contract.as_deref()?)))
        else {
            return Err(ResolveError::Internal(
                "the chosen candidate has no provider",
            ));
        };
        // Work on a device stream is tracked until release; a CPU provider has returned when
        // its execute does, whatever the mode.
        let streams = match candidate.backend {
            Backend::Cpu => None,
            _ if needs_streams => Some(self.devices.streams.clone().ok_or_else(no_device_adapter)?),
            _ => None,
        };
        // Bind the very stored op that was negotiated with. If its package began draining since
        // the snapshot was read, nothing is bound and resolution starts again from a fresh
        // snapshot, where that package is passed over (or, if the change was refused or
        // aborted meanwhile, can be bound again): each retry follows a drain that began during
        // this call, and lifecycle changes are serialised, so the retries end.
        let Some(binding) = KernelBinding::try_new(stored) else {
            return self.resolve(query, args, report);
        };
        Ok(Resolved::boxed(
            binding,
            candidate,
            query,
            args.into_calls(),
            Scratch {
                host_bytes: chosen.scratch.host_bytes,
                device_bytes: chosen.scratch.device_bytes,
                alignment: chosen.alignment,
            },
            chosen.passed_over,
            streams,
            self.runs_isa,
        ))
    }
}

/// What a resolution passes to the negotiation callbacks besides the query: the caller's
/// operation parameters and the query's tensors in C form, inputs then outputs (a C caller's
/// own arrays, handed on as they are; the Rust face's, made once for the handle's calls).
pub(crate) struct Negotiation<'a> {
    pub(crate) params: &'a [u8],
    pub(crate) tensors: NegotiatedTensors<'a>,
}

/// Where the C form of a resolution's tensors is.
pub(crate) enum NegotiatedTensors<'a> {
    /// The C caller's own arrays (inputs, outputs), handed on as they are.
    Caller([&'a [guild_tensor_desc_v1_t]; 2]),
    /// The Rust face's: made once, in the call tensors of the block the handle's contract is
    /// then made in ([`call_block`]), so that they are the handle's calls' tensors.
    Kept(TensorBlock<Shape>),
}

impl Negotiation<'_> {
    /// The tensors in C form, inputs and outputs.
    fn tensors(&self) -> [&[guild_tensor_desc_v1_t]; 2] {
        match &self.tensors {
            NegotiatedTensors::Caller(tensors) => *tensors,
            NegotiatedTensors::Kept(block) => block.call_split(),
        }
    }

    /// The block of the Rust face's tensors, for the handle's contract.
    fn into_calls(self) -> Option<TensorBlock<Shape>> {
        match self.tensors {
            NegotiatedTensors::Caller(_) => None,
            NegotiatedTensors::Kept(block) => Some(block),
        }
    }
}

/// What negotiation chose: the candidate's index, its scratch and scratch alignment, and, when
/// asked for, why each other candidate was passed over.
struct Chosen {
    index: usize,
    scratch: ScratchRequest,
    alignment: u32,
    passed_over: Option<Vec<PassedOver>>,
}

/// Negotiates with the full report kept: every candidate's verdict, and the text of every
/// refusal, for the Rust face's `passed_over` or for the error when nothing is chosen.
fn negotiate_reported(
    entry: &OperationCandidates,
    query: &OpQuery<'_>,
    args: &Negotiation<'_>,
    candidates: &[OpCandidate],
) -> Result<Chosen, ResolveError> {
    let negotiator = CNegotiator::new(entry, query, args, true);
    let resolution = resolve(query, candidates, &negotiator);
    let passed_over = resolution
        .verdicts()
        .iter()
        .map(|v| PassedOver {
            impl_id: v.impl_id.clone(),
            reason: match &v.reason {
                Reason::Rejected(r) => PassReason::Rejected(r.clone()),
                Reason::Outranked { .. } => PassReason::Outranked,
            },
        })
        .collect();
    let choice = resolution.into_result().map_err(ResolveError::Unresolved)?;
    Ok(Chosen {
        index: choice.index,
        scratch: choice.scratch,
        alignment: negotiator.last_alignment.get(),
        passed_over: Some(passed_over),
    })
}

/// A candidate the resolution did not choose, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedOver {
    /// The candidate's implementation id.
    pub impl_id: ImplId,
    /// Why it was not chosen.
    pub reason: PassReason,
}

/// Why a candidate was not chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassReason {
    /// It cannot serve the query.
    Rejected(Rejection),
    /// It ranked below the chosen one, so its callbacks were not called.
    Outranked,
}

impl fmt::Display for PassedOver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            PassReason::Rejected(r) => write!(f, "{}: {r}", self.impl_id),
            PassReason::Outranked => write!(f, "{}: outranked by the chosen one", self.impl_id),
        }
    }
}

fn no_device_adapter() -> ResolveError {
    ResolveError::Unsupported(
        "stream-ordered execution on a device needs a device adapter, and this host has none",
    )
}

// ---------------------------------------------------------------------------------------------
// Negotiation through the C callbacks
// ---------------------------------------------------------------------------------------------

/// The C form of one tensor.
pub(crate) fn c_tensor(desc: &TensorDesc, data: *mut c_void) -> guild_tensor_desc_v1_t {
    guild_tensor_desc_v1_t {
        dtype: desc.dtype.raw(),
        rank: desc.rank,
        dims: desc.dims,
        strides: desc.strides,
        memory_space: desc.memory_space.bit(),
        device_id: desc.device_id,
        data,
    }
}

/// The domain form of a caller's C tensor, or why it cannot be one.
pub(crate) fn tensor_from_c(t: &guild_tensor_desc_v1_t) -> Result<TensorDesc, String> {
    let memory_space = MemorySpace::from_bit(t.memory_space).ok_or_else(|| {
        format!(
            "memory_space {:#x} is not exactly one GUILD_MEMORY_* bit",
            t.memory_space
        )
    })?;
    Ok(desc_from_c(t, memory_space))
}

/// The domain form of a caller's C tensor whose memory space is `memory_space` (its
/// `memory_space` bit, read).
#[inline(always)]
pub(crate) fn desc_from_c(t: &guild_tensor_desc_v1_t, memory_space: MemorySpace) -> TensorDesc {
    TensorDesc {
        dtype: DType::from_raw(t.dtype),
        rank: t.rank,
        dims: t.dims,
        strides: t.strides,
        memory_space,
        device_id: t.device_id,
        data_addr: (!t.data.is_null()).then_some(t.data as usize as u64),
    }
}

/// A contract's block for a query's tensors (whose facts are `infos`, inputs then outputs):
/// their descriptors and shapes, and their C form in its call tensors, with their known
/// addresses (for the negotiation callbacks, which may inspect them). A Rust resolution
/// negotiates with them, then its handle's contract is this block, where they are the calls'
/// tensors. Each element is written once. Inlined, so that the block is written where its
/// caller keeps it (returned through memory, it was read back with loads straddling the stores
/// that wrote it).
#[inline]
pub(crate) fn call_block(
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    infos: &[TensorInfo],
) -> TensorBlock<Shape> {
    TensorBlock::filled(inputs, outputs, infos, true, Shape::of, |d| {
        c_tensor(d, address_ptr(d))
    })
}

/// The pointer a descriptor's known address stands for (NULL when unknown). It is only ever
/// passed to negotiation callbacks, which may inspect the address but not the data.
fn address_ptr(desc: &TensorDesc) -> *mut c_void {
    desc.data_addr
        .and_then(|a| usize::try_from(a).ok())
        .map_or(std::ptr::null_mut(), |a| a as *mut c_void)
}

/// The thread's provider error record, and whether it is lent to a callback now.
struct ErrorSlot {
    lent: Cell<bool>,
    record: UnsafeCell<guild_error_info_t>,
}

thread_local! {
    /// The error record the negotiation callbacks of a resolution, and the provider of a Rust
    /// face's call, on this thread report into, cleared before each ([`with_fresh_error`]):
    /// kept for the thread, so that a resolution does not clear all of its 584 bytes (only its
    /// status and the first byte of each text) when nothing fails, and so that a handle does
    /// not carry one (which took a handle past the 1,032 bytes glibc serves from its
    /// per-thread cache, and its allocation onto the allocator's slow path).
    static PROVIDER_ERROR: ErrorSlot = const {
        ErrorSlot {
            lent: Cell::new(false),
            record: UnsafeCell::new(guild_error_info_t::new()),
        }
    };
}

/// Runs `callback` with the thread's provider error record, cleared for it. A callback
/// that reaches a provider again on this thread while the record is lent (a negotiation
/// callback that resolves, which it must not do but may; a provider's execute that runs a
/// Rust handle) is lent a record of its own.
///
/// The thread-local access is only the slot's address, and the callback is inlined once, on
/// the path that lends the thread's record: with the callback inside the thread-local's
/// closure, the access was left out of line, behind a function pointer, and cost a Rust face's
/// execute about 70 instructions.
#[inline(always)]
pub(crate) fn with_fresh_error<T>(callback: impl FnOnce(&mut guild_error_info_t) -> T) -> T {
    /// Gives the record back however the callback ends.
    struct Lent<'a>(&'a Cell<bool>);
    impl Drop for Lent<'_> {
        fn drop(&mut self) {
            self.0.set(false);
        }
    }
    let slot: *const ErrorSlot = PROVIDER_ERROR.with(std::ptr::from_ref);
    // SAFETY: this thread's slot, which lives until the thread ends (a constant-initialised
    // thread local without drop glue is never destroyed), and is read only on this thread.
    let slot = unsafe { &*slot };
    if slot.lent.replace(true) {
        return with_own_error(callback);
    }
    let _lent = Lent(&slot.lent);
    // SAFETY: the record was not lent, so no reference into it exists: each one is made here,
    // and lives only for the callback, while `lent` is true.
    let error = unsafe { &mut *slot.record.get() };
    clear_error(error);
    callback(error)
}

/// [`with_fresh_error`] while the thread's record is lent: a record of the callback's own.
#[cold]
#[inline(never)]
fn with_own_error<T>(callback: impl FnOnce(&mut guild_error_info_t) -> T) -> T {
    callback(&mut guild_error_info_t::new())
}

/// The providers' GOP1 negotiation, called with C structs built from the query's actual
/// tensors; the pointers inside them are valid for each call only.
struct CNegotiator<'p> {
    /// The operation's stored kernels, aligned with the contracts being ranked.
    stored: &'p [Arc<StoredOp>],
    /// The exact id the query names, which `query` points at (its heap buffer stays where it
    /// is when the negotiator moves); otherwise never read.
    _exact: Option<CString>,
    /// The query's numbers, which every candidate's C query carries.
    statics: QueryStatics,
    /// Whether a refusal's message is kept (as text, for a report) or only its status.
    report: bool,
    /// The scratch alignment of the last scratch query that succeeded: the chosen candidate's,
    /// once negotiation has chosen (nothing is asked after the choice).
    last_alignment: Cell<u32>,
    /// The C query every callback is handed, made once per resolution: its pointers lead into
    /// `_exact` and into what `'p` borrows (the operation's name in the snapshot entry, the
    /// tensors in C form, the params). From one candidate to the next only its device record
    /// changes: each callback writes the candidate's into `caps` and points the query at it
    /// ([`CNegotiator::ask`]).
    query: UnsafeCell<guild_operation_query_v1_t>,
    caps: UnsafeCell<guild_device_caps_v1_t>,
}

impl<'p> CNegotiator<'p> {
    fn new(
        entry: &'p OperationCandidates,
        query: &OpQuery<'_>,
        args: &'p Negotiation<'_>,
        report: bool,
    ) -> Self {
        let [inputs, outputs] = args.tensors();
        // Ids are validated text without NUL bytes; an empty string is the harmless fallback
        // should that ever change.
        let exact = query
            .spec()
            .exact_impl
            .map(|id| CString::new(id.as_str()).unwrap_or_default());
        let statics = QueryStatics::of(query);
        let parts = QueryParts {
            op_name: &entry.c_name,
            exact: exact.as_deref(),
            inputs,
            outputs,
            params: args.params,
        };
        let mut c = c_query(&parts, &statics, &NO_CAPS);
        // Each callback points it at `caps`, where the negotiator then lies.
        c.device_caps = std::ptr::null();
        CNegotiator {
            stored: &entry.stored,
            _exact: exact,
            statics,
            report,
            last_alignment: Cell::new(0),
            query: UnsafeCell::new(c),
            caps: UnsafeCell::new(NO_CAPS),
        }
    }

    /// Runs `ask` with the C query for `candidate` and the thread's negotiation error record,
    /// cleared for it.
    #[inline(always)]
    fn ask<T>(
        &self,
        candidate: &OpCandidate,
        ask: impl FnOnce(QueryCall<'_>, &mut guild_error_info_t) -> T,
    ) -> T {
        let (query, caps) = (self.query.get(), self.caps.get());
        // SAFETY: the negotiator is not `Sync`, and no reference into `query` or `caps`
        // outlives a callback (a negotiation callback must not retain the query, and a
        // resolution it starts has a negotiator of its own), so nothing reads them while they
        // are written here, between callbacks. Every pointer in the query leads into what the
        // negotiator owns or borrows for `'p` (see `query`) or to `caps`, all of which outlive
        // the call; the tensor data addresses are only the query's known addresses, for
        // inspection.
        unsafe {
            caps.write(device_caps(candidate, &self.statics));
            (*query).device_caps = caps;
            let call = QueryCall::new(&*query);
            with_fresh_error(|error| ask(call, error))
        }
    }

    /// A callback's refusal, with its message only when a report will show it.
    fn refusal(&self, status: guild_status_t, error: &guild_error_info_t) -> ProviderRefusal {
        let message = if self.report {
            error_text(error)
        } else {
            String::new()
        };
        ProviderRefusal::new(status, message)
    }

    /// The provider of candidate `index`, whatever loader registered it. One without GOP1
    /// callbacks refuses every query itself (`GUILD_STATUS_ERR_UNSUPPORTED`).
    fn op(&self, index: usize) -> Result<&'p dyn KernelProvider, ProviderRefusal> {
        let stored = self.stored.get(index).ok_or_else(|| {
            ProviderRefusal::new(
                GUILD_STATUS_ERR_INTERNAL,
                "the host lost track of this provider",
            )
        })?;
        Ok(stored.kernel.provider.as_ref())
    }
}

/// What a C query points at besides the query's own numbers: the names and the tensor arrays
/// in C form, and the caller's params.
struct QueryParts<'a> {
    op_name: &'a CStr,
    exact: Option<&'a CStr>,
    inputs: &'a [guild_tensor_desc_v1_t],
    outputs: &'a [guild_tensor_desc_v1_t],
    params: &'a [u8],
}

/// The numbers of a query that every C query made from it carries, whatever its tensors: what
/// a resolution fixed and a reshape of its handle renegotiates within (the name and the exact
/// id are in [`QueryParts`]). Plain values, taken once per resolution and kept by the handle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueryStatics {
    versions: OpVersionInterval,
    backends: BackendSet,
    capabilities: Capabilities,
    numerics: Numerics,
    sync_mode: SyncMode,
    ram_budget: Budget,
    vram_budget: Budget,
    device: DeviceCaps,
    /// Whether the query named the one implementation it takes (then the chosen candidate's).
    exact: bool,
}

impl QueryStatics {
    fn of(query: &OpQuery<'_>) -> Self {
        let spec = query.spec();
        QueryStatics {
            versions: query.versions(),
            backends: spec.backends,
            capabilities: spec.capabilities,
            numerics: spec.numerics,
            sync_mode: spec.sync_mode,
            ram_budget: spec.ram_budget,
            vram_budget: spec.vram_budget,
            device: spec.device,
            exact: spec.exact_impl.is_some(),
        }
    }
}

/// A device record of no device, which a negotiator's query starts from.
const NO_CAPS: guild_device_caps_v1_t = guild_device_caps_v1_t {
    struct_size: size_of::<guild_device_caps_v1_t>() as u32,
    backend: 0,
    device_id: 0,
    cuda_sm: 0,
    cpu_isa: 0,
    total_memory_bytes: 0,
    free_memory_bytes: 0,
    next_ext: std::ptr::null(),
};

/// The device record of a C query of `spec` for `candidate`.
fn device_caps(candidate: &OpCandidate, spec: &QueryStatics) -> guild_device_caps_v1_t {
    guild_device_caps_v1_t {
        struct_size: size_of::<guild_device_caps_v1_t>() as u32,
        backend: candidate.backend.bit(),
        device_id: spec.device.device_id,
        cuda_sm: match candidate.backend {
            Backend::Cuda => spec.device.cuda_sm.unwrap_or(0),
            _ => 0,
        },
        cpu_isa: match candidate.backend {
            Backend::Cpu => spec.device.cpu_isa.bits(),
            _ => 0,
        },
        total_memory_bytes: 0,
        free_memory_bytes: 0,
        next_ext: std::ptr::null(),
    }
}

/// The C query of `spec` and `parts` with the device record `caps`, its pointers leading into
/// `parts` and `caps`.
fn c_query(
    parts: &QueryParts<'_>,
    spec: &QueryStatics,
    caps: &guild_device_caps_v1_t,
) -> guild_operation_query_v1_t {
    guild_operation_query_v1_t {
        struct_size: size_of::<guild_operation_query_v1_t>() as u32,
        version: GUILD_OPERATION_QUERY_VERSION,
        op_name: parts.op_name.as_ptr(),
        min_op_version: spec.versions.min().raw(),
        max_op_version: spec.versions.max().raw(),
        backends: spec.backends.bits(),
        sync_mode: spec.sync_mode.raw(),
        required_capabilities: spec.capabilities.bits(),
        required_numerics: spec.numerics.bits(),
        inputs: parts.inputs.as_ptr(),
        input_count: parts.inputs.len(),
        outputs: parts.outputs.as_ptr(),
        output_count: parts.outputs.len(),
        ram_budget: spec.ram_budget.get(),
        vram_budget: spec.vram_budget.get(),
        exact_impl_id: parts.exact.map_or(std::ptr::null(), CStr::as_ptr),
        device_caps: caps,
        params: params_ptr(parts.params),
        params_size: parts.params.len(),
    }
}

/// A C query's `params`: NULL for none.
#[inline(always)]
fn params_ptr(params: &[u8]) -> *const c_void {
    if params.is_empty() {
        std::ptr::null()
    } else {
        params.as_ptr().cast()
    }
}

/// Asks `provider` to validate the C query `query`.
#[inline(always)]
fn validate_query(
    provider: &dyn KernelProvider,
    query: QueryCall<'_>,
    error: &mut guild_error_info_t,
    refusal: impl FnOnce(guild_status_t, &guild_error_info_t) -> ProviderRefusal,
) -> Result<(), ProviderRefusal> {
    let status = provider.validate(query, error);
    if status == GUILD_STATUS_OK {
        Ok(())
    } else {
        Err(refusal(status, error))
    }
}

/// Asks `provider` for the scratch of the C query `query`: the request and the alignment it
/// asked for. `refusal` makes the provider's own refusal.
#[inline(always)]
fn scratch_query(
    provider: &dyn KernelProvider,
    query: QueryCall<'_>,
    error: &mut guild_error_info_t,
    refusal: impl FnOnce(guild_status_t, &guild_error_info_t) -> ProviderRefusal,
) -> Result<(ScratchRequest, u32), ProviderRefusal> {
    let mut scratch = guild_scratch_request_v1_t {
        struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
        alignment: 0,
        host_bytes: 0,
        device_bytes: 0,
    };
    let status = provider.query_scratch(query, &mut scratch, error);
    if status != GUILD_STATUS_OK {
        return Err(refusal(status, error));
    }
    Ok((scratch_request(&scratch)?, scratch.alignment))
}

/// A provider's refusal with the text it left in the record (a reshape always reports why).
fn full_refusal(status: guild_status_t, error: &guild_error_info_t) -> ProviderRefusal {
    ProviderRefusal::new(status, error_text(error))
}

/// A provider's scratch answer as the domain takes it, or the refusal of an alignment that is
/// not a power of two. Inlined into both negotiations (a resolution's and a reshape's), with
/// the refusal out of line.
#[inline(always)]
fn scratch_request(
    scratch: &guild_scratch_request_v1_t,
) -> Result<ScratchRequest, ProviderRefusal> {
    if scratch.alignment > 1 && !scratch.alignment.is_power_of_two() {
        return Err(bad_scratch_alignment(scratch.alignment));
    }
    Ok(ScratchRequest {
        host_bytes: scratch.host_bytes,
        device_bytes: scratch.device_bytes,
    })
}

/// The refusal of a scratch alignment that is not a power of two.
#[cold]
fn bad_scratch_alignment(alignment: u32) -> ProviderRefusal {
    ProviderRefusal::new(
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        format!("the provider asked for a scratch alignment of {alignment}, not a power of two"),
    )
}

impl Negotiator for CNegotiator<'_> {
    // `query` is the one `self` was made for: its numbers are `self.statics`.
    fn validate(
        &self,
        index: usize,
        candidate: &OpCandidate,
        _query: &OpQuery<'_>,
    ) -> Result<(), ProviderRefusal> {
        let provider = self.op(index)?;
        // The provider's library stays loaded while the snapshot that `self.stored` borrows
        // from lives. It is a negotiation callback: it must not retain the query or reenter the
        // registry, which is not locked here.
        self.ask(candidate, |query, error| {
            validate_query(provider, query, error, |s, e| self.refusal(s, e))
        })
    }

    fn query_scratch(
        &self,
        index: usize,
        candidate: &OpCandidate,
        _query: &OpQuery<'_>,
    ) -> Result<ScratchRequest, ProviderRefusal> {
        let provider = self.op(index)?;
        let (request, alignment) = self.ask(candidate, |query, error| {
            scratch_query(provider, query, error, |s, e| self.refusal(s, e))
        })?;
        self.last_alignment.set(alignment);
        Ok(request)
    }
}

// ---------------------------------------------------------------------------------------------
// A resolved operation
// ---------------------------------------------------------------------------------------------

/// One negotiated contract with one provider: what both faces' handles hold.
///
/// What resolution fixed for good (the provider, the sync mode, the device, the alignment) sits
/// in plain fields. What a reshape renegotiates (the tensors and the scratch) sits in the
/// `contract` cell, and what one call writes (the Rust face's C tensors and error record, the
/// stream marks) in the `call` cell; see the `Sync` impl below for who may touch them.
pub(crate) struct Resolved {
    pub(crate) binding: KernelBinding,
    /// The chosen kernel's provider, the one `binding`'s stored op holds, which lives (and
    /// whose code stays loaded) while `binding` does: pointed at rather than counted, so that
    /// a resolution takes no reference count of its own (an atomic read-modify-write of a
    /// line every resolution of the kernel shares, and another at release). See
    /// [`Resolved::kernel`].
    kernel: NonNull<dyn KernelProvider>,
    /// The C callback `kernel.execute` hands every call to, when it has one
    /// ([`KernelProvider::execute_entry`]), called directly.
    entry: Option<ExecuteEntry>,
    /// The chosen contract, the one `binding`'s stored op holds, pointed at as `kernel` is.
    /// See [`Resolved::candidate`].
    candidate: NonNull<OpCandidate>,
    /// Whether [`OpHandle::execute`](super::OpHandle::execute) on borrowed slices may run the
    /// handle: every tensor is in pageable host memory, the only memory a Rust slice can vouch
    /// for, and the provider's work cannot outlive the call (host-blocking, or a CPU provider).
    /// A reshape keeps every memory space, so this is fixed at resolution and a call tests one
    /// flag.
    pub(crate) plain: bool,
    pub(crate) sync_mode: SyncMode,
    pub(crate) device_id: i32,
    /// The resolution's query less its tensors: what every reshape renegotiates within.
    statics: QueryStatics,
    /// Every other candidate of the operation and why it was not chosen, when the resolution
    /// was asked for that report.
    pub(crate) passed_over: Option<Vec<PassedOver>>,
    /// The provider's data alignment less one: its `min_alignment` is a power of two (the
    /// candidate passed `OpCandidate::check` at resolution), so one mask tests an address.
    align_mask: u64,
    /// The sync mode and device every call must name, as one word (see [`call_key`]).
    call_key: u64,
    /// Whether calls may pass a stream: a device provider's may, a CPU provider's may not.
    pub(crate) takes_stream: bool,
    /// The CPU ISA bits the provider requires that this host's CPU lacks: empty unless the
    /// resolution was steered by a declaration of more (the query's device record, or the
    /// embedder's [`DeviceSupport::cpu_isa`]). Such a handle describes what that CPU would
    /// run; executing it here could meet an illegal instruction, so every execute refuses it
    /// before the provider is called.
    pub(crate) lacks_here: CpuIsa,
    streams: Option<Arc<dyn StreamEvents>>,
    /// Whether the handle was resolved through the runner's C table (counted in
    /// [`ServiceCore::runner_handles`] until it is released).
    pub(crate) through_runner: bool,
    /// The negotiated tensors and scratch.
    contract: UnsafeCell<Contract>,
    /// The contract's scratch for `describe` and `scratch` calls, which the C face lets run
    /// beside an execute or a reshape (they never read `contract`).
    published: PublishedScratch,
    /// What calls write (a Rust handle's gate, and one call's cells), alone in its lines:
    /// whatever the allocator puts beside the handle, another handle's calls on another thread
    /// never write there.
    call: Padded<Calls>,
    /// What a reshape reuses.
    reshaping: UnsafeCell<ReshapeCells>,
}

/// The most a handle may take: the largest block glibc's allocator serves from its per-thread
/// cache (1,032 usable bytes). A handle is allocated at every resolution and freed at every
/// release, and one larger took both onto the allocator's slow path (about 330 instructions
/// a resolution, when it carried its own 584-byte error record).
const HANDLE_MAX_BYTES: usize = 1032;

const _: () = assert!(
    size_of::<Resolved>() <= HANDLE_MAX_BYTES,
    "a handle fits the allocator's per-thread cache"
);

/// What a reshape renegotiates: the tensors as last accepted (the resolution's, or the last
/// reshape's) and what calls are checked against. What a reshape cannot change is the handle's
/// ([`Resolved::statics`]).
pub(crate) struct Contract {
    /// The descriptors, their shapes and (a Rust handle's) the calls' C tensors, in one
    /// allocation.
    tensors: TensorBlock<Shape>,
    pub(crate) scratch: Scratch,
    /// `scratch.alignment - 1`, or 0 when any address will do.
    scratch_mask: u64,
}

/// A blank descriptor, for a contract's block before a reshape writes it.
impl Blank for TensorDesc {
    // All zero bits (F32 and host memory are 0), so that a blank array is a plain clear.
    const BLANK: TensorDesc = TensorDesc {
        dtype: DType::F32,
        rank: 0,
        dims: [0; MAX_TENSOR_RANK],
        strides: [0; MAX_TENSOR_RANK],
        memory_space: MemorySpace::Host,
        device_id: 0,
        data_addr: None,
    };
}

impl Contract {
    /// None at all, without an allocation: what a handle's first reshape lays out.
    const fn empty() -> Self {
        Contract {
            tensors: TensorBlock::none(),
            scratch: Scratch {
                host_bytes: 0,
                device_bytes: 0,
                alignment: 0,
            },
            scratch_mask: 0,
        }
    }

    /// The contract of `inputs` and `outputs` (whose facts are `infos`, inputs then outputs)
    /// with `scratch`: `calls` (the Rust face's [`call_block`] for these same tensors, whose C
    /// form becomes the calls' tensors), or a new block without call tensors, written once.
    fn made(
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        infos: &[TensorInfo],
        scratch: Scratch,
        calls: Option<TensorBlock<Shape>>,
    ) -> Self {
        let tensors = match calls {
            Some(block) if block.fits(inputs.len(), outputs.len(), true) => block,
            _ => TensorBlock::filled(inputs, outputs, infos, false, Shape::of, |_| BLANK_C),
        };
        let mut contract = Contract {
            tensors,
            ..Contract::empty()
        };
        contract.set_scratch(scratch);
        contract
    }

    /// Makes `scratch` this contract's.
    fn set_scratch(&mut self, scratch: Scratch) {
        self.scratch = scratch;
        self.scratch_mask = scratch_mask(scratch);
    }

    /// Lays this contract out for `n_in` inputs and `n_out` outputs (with call tensors when
    /// `calls`), unless it already is: a handle's first reshape allocates its spare contract's
    /// block, every later one reuses it.
    fn fit(&mut self, n_in: usize, n_out: usize, calls: bool) {
        if !self.tensors.fits(n_in, n_out, calls) {
            self.tensors = TensorBlock::new(n_in, n_out, calls);
        }
    }

    /// The negotiated input descriptors.
    #[inline(always)]
    pub(crate) fn inputs(&self) -> &[TensorDesc] {
        self.tensors.descs().split_at(self.tensors.split()).0
    }

    /// The negotiated output descriptors.
    #[inline(always)]
    pub(crate) fn outputs(&self) -> &[TensorDesc] {
        self.tensors.descs().split_at(self.tensors.split()).1
    }

    /// The negotiated descriptors, by role.
    fn descs(&self, role: TensorRole) -> &[TensorDesc] {
        match role {
            TensorRole::Input => self.inputs(),
            TensorRole::Output => self.outputs(),
        }
    }

    #[inline(always)]
    fn shapes(&self, role: TensorRole) -> &[Shape] {
        self.tensors.shapes_of(role == TensorRole::Input)
    }

    /// Checks a call's scratch buffers against the negotiated sizes and alignment.
    #[inline]
    pub(crate) fn check_scratch(
        &self,
        host: *mut c_void,
        host_size: u64,
        device: *mut c_void,
        device_size: u64,
    ) -> Result<(), ExecuteError> {
        let s = &self.scratch;
        if s.host_bytes == 0 && s.device_bytes == 0 {
            return Ok(());
        }
        check_scratch("host", s.host_bytes, self.scratch_mask, host, host_size)?;
        check_scratch(
            "device",
            s.device_bytes,
            self.scratch_mask,
            device,
            device_size,
        )
    }
}

/// A value with [`LINE`] bytes of its owner's on each side, so that every line pair it touches
/// lies inside its owner's allocation, wherever the allocator puts that: what the alignment of
/// [`Lone`](super::handles::Lone) gives a value, without asking the allocator for an aligned
/// block. A handle is boxed at every resolution, and an over-aligned box goes through
/// `posix_memalign`, which cost a resolution about 630 instructions (and a slower free),
/// several times what any other of its allocations costs. Written in place
/// ([`Resolved::boxed`]): the padding is never written.
#[repr(C)]
struct Padded<T> {
    _before: [MaybeUninit<u8>; LINE],
    value: T,
    _after: [MaybeUninit<u8>; LINE],
}

/// What calls write: a Rust handle's gate, and the cells of the call that holds the execute
/// exclusivity.
struct Calls {
    /// The gate that serialises a Rust handle's calls (a C handle's is in its slot, and this
    /// one is never used), kept here rather than in the `OpHandle` that owns the handle, so
    /// that the `OpHandle` is a pointer, which a resolution returns and its caller keeps
    /// without copying a cache-line-aligned gate (the moves of the 256-byte `OpHandle` were a
    /// tenth of a Rust resolution's time in the resolve bench); here it is alone in lines of
    /// the handle's own, as the `OpHandle`'s alignment kept it.
    gate: Gate,
    cells: UnsafeCell<CallCells>,
}

/// What one call writes, touched only by the call that holds the handle's execute exclusivity
/// (or through `&mut Resolved`).
struct CallCells {
    /// What the Rust face lends the provider.
    rust: RustCells,
    /// The newest work mark per stream, for release to wait on.
    marks: Vec<Box<dyn WorkMark>>,
}

/// The Rust face's C call, kept in the handle and reused call after call: only its data
/// pointers, scratch, stream and params change. Its tensors are the contract's call tensors
/// (none on C handles, whose callers pass their own records). The error record the provider
/// reports into is the thread's ([`with_fresh_error`]), not the handle's.
pub(crate) struct RustCells {
    /// The arguments record, pointing at the contract's call tensors and carrying the handle's
    /// sync mode and device; [`RustCells::take_up`] points it anew whenever the contract
    /// changes.
    pub(crate) args: guild_execute_args_v1_t,
}

impl RustCells {
    #[cfg(test)]
    fn new(sync_mode: SyncMode, device_id: i32) -> Self {
        RustCells {
            args: RustCells::args(sync_mode, device_id),
        }
    }

    /// Writes the cells of a call with the handle's `sync_mode` and `device_id` at `at`, in
    /// place.
    ///
    /// # Safety
    /// `at` must be valid for writes and aligned for `RustCells`.
    unsafe fn init(at: *mut RustCells, sync_mode: SyncMode, device_id: i32) {
        // SAFETY: the caller's contract.
        unsafe { (&raw mut (*at).args).write(RustCells::args(sync_mode, device_id)) };
    }

    /// The arguments record of a call with the handle's `sync_mode` and `device_id`, pointing
    /// at no tensors yet.
    #[inline(always)]
    fn args(sync_mode: SyncMode, device_id: i32) -> guild_execute_args_v1_t {
        guild_execute_args_v1_t {
            struct_size: size_of::<guild_execute_args_v1_t>() as u32,
            reserved: 0,
            inputs: std::ptr::null(),
            input_count: 0,
            outputs: std::ptr::null(),
            output_count: 0,
            scratch_host: std::ptr::null_mut(),
            scratch_host_size: 0,
            scratch_device: std::ptr::null_mut(),
            scratch_device_size: 0,
            stream: std::ptr::null_mut(),
            device_id,
            sync_mode: sync_mode.raw(),
            params: std::ptr::null(),
            params_size: 0,
        }
    }

    /// Makes the call tensors of `contract` the call's: clears their data pointers (every call
    /// sets its own) and points the arguments record at them. The pointers are made from the
    /// block's own pointer, not from a reference, so they stay valid while each call writes
    /// the data pointers through [`TensorBlock::call_role_mut`].
    fn take_up(&mut self, contract: &mut Contract) {
        let t = &mut contract.tensors;
        let split = t.split();
        let (_, _, c) = t.parts_mut();
        let n = c.len();
        for d in c.iter_mut() {
            d.data = std::ptr::null_mut();
        }
        let base = t.call_tensors_ptr().cast_const();
        // `wrapping_add` within the block's call tensors (the offset is at most their length).
        self.args.inputs = base;
        self.args.input_count = split.min(n);
        self.args.outputs = base.wrapping_add(split.min(n));
        self.args.output_count = n - split.min(n);
    }
}

/// The mask a scratch buffer's address must clear: `alignment - 1`, or 0 when any will do.
fn scratch_mask(scratch: Scratch) -> u64 {
    u64::from(scratch.alignment.max(1)) - 1
}

/// The scratch as `describe` and `scratch` report it: a sequence lock, so that a reader beside
/// a reshape sees the old scratch or the new one, never a mix, and neither side takes a lock.
struct PublishedScratch {
    /// Odd while a write is in progress.
    sequence: AtomicU32,
    host_bytes: AtomicU64,
    device_bytes: AtomicU64,
    alignment: AtomicU32,
}

impl PublishedScratch {
    fn new(s: Scratch) -> Self {
        PublishedScratch {
            sequence: AtomicU32::new(0),
            host_bytes: AtomicU64::new(s.host_bytes),
            device_bytes: AtomicU64::new(s.device_bytes),
            alignment: AtomicU32::new(s.alignment),
        }
    }

    fn read(&self) -> Scratch {
        loop {
            let before = self.sequence.load(Ordering::Acquire);
            let s = Scratch {
                host_bytes: self.host_bytes.load(Ordering::Relaxed),
                device_bytes: self.device_bytes.load(Ordering::Relaxed),
                alignment: self.alignment.load(Ordering::Relaxed),
            };
            std::sync::atomic::fence(Ordering::Acquire);
            if before & 1 == 0 && self.sequence.load(Ordering::Relaxed) == before {
                return s;
            }
            std::hint::spin_loop();
        }
    }

    /// Publishes `s`.
    ///
    /// # Safety
    /// Writers must be serialised (the handle's execute exclusivity, or `&mut`); a concurrent
    /// second writer could leave readers spinning.
    unsafe fn write(&self, s: Scratch) {
        let before = self.sequence.load(Ordering::Relaxed);
        self.sequence
            .store(before.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        self.host_bytes.store(s.host_bytes, Ordering::Relaxed);
        self.device_bytes.store(s.device_bytes, Ordering::Relaxed);
        self.alignment.store(s.alignment, Ordering::Relaxed);
        self.sequence
            .store(before.wrapping_add(2), Ordering::Release);
    }
}

/// What a reshape keeps from one to the next, so that a decode loop's reshapes reuse their
/// buffers: touched only by a reshape (under the handle's execute exclusivity, or `&mut`).
struct ReshapeCells {
    /// The contract the last reshape replaced, whose block the next one writes (laid out at
    /// the handle's first reshape): a C reshape reads its caller's tensors straight into it,
    /// and a tensor it already holds is kept as it is.
    spare: Contract,
    /// What the negotiation of the new tensors works in.
    work: ReshapeWork,
}

impl ReshapeCells {
    /// None yet: what a resolution writes into its handle (a constant, so that it is copied
    /// into place from one image rather than assembled on the stack and copied, whose
    /// straddling loads cost a resolution a store-forwarding stall).
    const NONE: ReshapeCells = ReshapeCells {
        spare: Contract::empty(),
        work: ReshapeWork { query: None },
    };
}

/// Which face a reshape's negotiation serves, and where it writes the contract it makes (the
/// spare's block, as the checks go: inputs then outputs, as many as the tensors).
enum Reshaping<'a> {
    /// The Rust face's: the new tensors' descriptors, shapes and C form (the call tensors),
    /// which the callbacks are then handed.
    Rust {
        descs: &'a mut [TensorDesc],
        shapes: &'a mut [Shape],
        calls: &'a mut [guild_tensor_desc_v1_t],
    },
    /// The C face's: the caller's own descriptors of the tensors read, handed to the callbacks
    /// as they are, and the new shapes.
    C {
        tensors: [&'a [guild_tensor_desc_v1_t]; 2],
        shapes: &'a mut [Shape],
    },
}

/// The records a reshape's negotiation reuses.
#[derive(Default)]
struct ReshapeWork {
    /// The C query and error record of the callbacks, made at the first reshape.
    query: Option<Box<ReshapeQuery>>,
}

/// The C query a reshape hands the provider's callbacks, and the record they report into,
/// made at a handle's first reshape and kept: all of the query but its tensor arrays and
/// params is what the resolution fixed (the names, the numbers of [`Resolved::statics`], the
/// device record), so a reshape writes only those. Its names point into the heap buffers of
/// `_names`, which stay where they are however the handle moves; its `device_caps` is pointed
/// at `caps` anew by each reshape, and its arrays and params are the last reshape's until the
/// next writes its own (nothing reads them in between). Boxed, so that a handle that is never
/// reshaped carries a pointer for it, not the records.
struct ReshapeQuery {
    /// The operation name and the exact id (when the query named one) that `query` points at,
    /// owned here and otherwise never read.
    _names: (CString, Option<CString>),
    caps: guild_device_caps_v1_t,
    query: guild_operation_query_v1_t,
    error: guild_error_info_t,
}

impl Default for Contract {
    fn default() -> Self {
        Contract::empty()
    }
}

/// Clears a callback's error record for the next callback.
fn clear_error(error: &mut guild_error_info_t) {
    error.status = GUILD_STATUS_OK;
    error.component[0] = 0;
    error.message[0] = 0;
}

/// The word a call's device and sync mode make, compared with the handle's in one step: the two
/// fields in the order the C arguments record has them, so that the word is one load.
#[inline(always)]
fn call_key(device_id: i32, sync_mode: u32) -> u64 {
    u64::from(device_id as u32) | (u64::from(sync_mode) << 32)
}

/// The word a tensor's memory space and device make, in the order the C descriptor has them.
#[inline(always)]
fn place_key(memory_space: u32, device_id: i32) -> u64 {
    u64::from(memory_space) | (u64::from(device_id as u32) << 32)
}

// SAFETY: the cells are only touched as their documentation says: `contract` is written only by
// a reshape, which holds the handle's execute exclusivity (C handles) or `&mut` (Rust handles),
// and read only by calls that exclude such a reshape; `call` only under the execute
// exclusivity or `&mut`. Everything else is immutable after resolution or Send + Sync itself;
// the `kernel` and `candidate` pointers lead to a provider (`KernelProvider: Send + Sync`) and a
// contract (plain values) that the binding keeps alive and that nothing changes, as an `Arc`
// of each would.
// The raw data pointers in the call cell are the last call's addresses: every call overwrites
// them all before a provider sees them, and the host never dereferences them.
unsafe impl Sync for Resolved {}
// SAFETY: as above; moving the handle moves its cells with it, and the stale data pointers are
// never dereferenced.
unsafe impl Send for Resolved {}

/// One call's arguments in C form: the record the provider receives as it is (the C face passes
/// its caller's), and its tensor arrays as slices. The pointers are the caller's and are checked
/// by [`Resolved::execute`] before the provider sees them.
pub(crate) struct Call<'a> {
    pub(crate) args: &'a guild_execute_args_v1_t,
    pub(crate) inputs: &'a [guild_tensor_desc_v1_t],
    pub(crate) outputs: &'a [guild_tensor_desc_v1_t],
}

/// The Rust face's view of one call: the contract and the Rust face's call cells, for the call
/// that holds the handle's execute exclusivity. Two pointers, so that the checks keep it in
/// registers.
pub(crate) struct RustCall<'a> {
    pub(crate) contract: &'a Contract,
    pub(crate) cells: &'a mut RustCells,
}

impl Resolved {
    /// The gate that serialises a Rust handle's calls.
    #[inline(always)]
    pub(crate) fn rust_gate(&self) -> &Gate {
        &self.call.value.gate
    }

    /// The chosen kernel's provider.
    #[inline(always)]
    pub(crate) fn kernel(&self) -> &dyn KernelProvider {
        // SAFETY: `kernel` points at the provider of `self.binding`'s stored op (`boxed`),
        // which that op's reference keeps where it is, unchanged, while the binding lives:
        // as long as `self`, which the returned reference borrows.
        unsafe { self.kernel.as_ref() }
    }

    /// The chosen contract.
    #[inline(always)]
    pub(crate) fn candidate(&self) -> &OpCandidate {
        // SAFETY: `candidate` points at the contract of `self.binding`'s stored op (`boxed`),
        // kept as the provider is (see `Resolved::kernel`).
        unsafe { self.candidate.as_ref() }
    }

    /// The handle a resolution made: the chosen candidate, its negotiated scratch, the query.
    ///
    /// Boxed where it is made: a handle is large (its reused records), and both faces keep it
    /// behind a pointer. Its contract is made in one block from the query's tensors (borrowed,
    /// not the query's own) and, with `calls` (the Rust face), the C form they were negotiated
    /// in, which becomes the calls' tensors. `candidate` is the contract of `binding`'s stored
    /// op (the handle points at it, and at that op's provider, for as long as it keeps the
    /// binding).
    #[allow(clippy::too_many_arguments)] // Every part is one the resolution computed.
    fn boxed(
        binding: KernelBinding,
        candidate: &OpCandidate,
        query: &OpQuery<'_>,
        calls: Option<TensorBlock<Shape>>,
        scratch: Scratch,
        passed_over: Option<Vec<PassedOver>>,
        streams: Option<Arc<dyn StreamEvents>>,
        host_isa: CpuIsa,
    ) -> Box<Self> {
        let spec = query.spec();
        // Every backend: a device provider's host-side code runs on this CPU too.
        let lacks_here = candidate.cpu_isa.difference(host_isa);
        let (align_mask, takes_stream) = (
            candidate.min_alignment.max(1) - 1,
            candidate.backend != Backend::Cpu,
        );
        let host_only = spec
            .inputs
            .iter()
            .chain(spec.outputs)
            .all(|t| t.memory_space == MemorySpace::Host);
        let (call_key, sync_mode, device_id) = (
            call_key(spec.device.device_id, spec.sync_mode.raw()),
            spec.sync_mode,
            spec.device.device_id,
        );
        let plain =
            host_only && (sync_mode == SyncMode::HostBlocking || candidate.backend == Backend::Cpu);
        let statics = QueryStatics::of(query);
        let lends = calls.is_some();
        let contract = Contract::made(
            spec.inputs,
            spec.outputs,
            query.tensor_infos(),
            scratch,
            calls,
        );
        debug_assert!(binding
            .contract()
            .is_some_and(|c| std::ptr::eq(c, candidate)));
        let kernel = binding.kernel().provider.as_ref();
        let entry = kernel.execute_entry();
        let (kernel, candidate) = (NonNull::from(kernel), NonNull::from(candidate));
        let mut slot = Box::<Resolved>::new_uninit();
        let at = slot.as_mut_ptr();
        // SAFETY: `at` is the box's own allocation, aligned for a `Resolved` and valid for
        // writes. Every field is written once below, where it lives (the handle is too large to
        // be made on the stack and moved: that copy cost a resolution about 1.6 KB of memcpy),
        // apart from the padding around the call cells, which is `MaybeUninit`; the pattern
        // after the writes names every field, so that a field added to `Resolved` fails to
        // compile there until it is written here too. Nothing between the first write and
        // `assume_init` can panic.
        let mut handle = unsafe {
            (&raw mut (*at).binding).write(binding);
            (&raw mut (*at).entry).write(entry);
            (&raw mut (*at).kernel).write(kernel);
            (&raw mut (*at).align_mask).write(align_mask);
            (&raw mut (*at).call_key).write(call_key);
            (&raw mut (*at).takes_stream).write(takes_stream);
            (&raw mut (*at).lacks_here).write(lacks_here);
            (&raw mut (*at).plain).write(plain);
            (&raw mut (*at).sync_mode).write(sync_mode);
            (&raw mut (*at).device_id).write(device_id);
            (&raw mut (*at).statics).write(statics);
            (&raw mut (*at).candidate).write(candidate);
            (&raw mut (*at).passed_over).write(passed_over);
            (&raw mut (*at).streams).write(streams);
            (&raw mut (*at).published).write(PublishedScratch::new(scratch));
            (&raw mut (*at).through_runner).write(false);
            (&raw mut (*at).contract).write(UnsafeCell::new(contract));
            // `UnsafeCell` has the layout of what it holds.
            (&raw mut (*at).call.value.gate).write(Gate::live());
            let cells = (&raw mut (*at).call.value.cells).cast::<CallCells>();
            RustCells::init(&raw mut (*cells).rust, sync_mode, device_id);
            (&raw mut (*cells).marks).write(Vec::new());
            (&raw mut (*at).reshaping).write(UnsafeCell::new(ReshapeCells::NONE));
            slot.assume_init()
        };
        let Resolved {
            binding: _,
            kernel: _,
            entry: _,
            candidate: _,
            plain: _,
            sync_mode: _,
            device_id: _,
            statics: _,
            passed_over: _,
            align_mask: _,
            call_key: _,
            takes_stream: _,
            lacks_here: _,
            streams: _,
            through_runner: _,
            contract: _,
            published: _,
            call:
                Padded {
                    _before: _,
                    value: _,
                    _after: _,
                },
            reshaping: _,
        } = &*handle;
        if lends {
            let handle = &mut *handle;
            handle
                .call
                .value
                .cells
                .get_mut()
                .rust
                .take_up(handle.contract.get_mut());
        }
        handle
    }

    /// The contract.
    ///
    /// # Safety
    /// No reshape of this handle may run while the reference lives: the caller holds the
    /// handle's execute exclusivity, or the handle is a Rust handle (whose reshape takes `&mut`).
    #[inline(always)]
    pub(crate) unsafe fn contract(&self) -> &Contract {
        // SAFETY: writers are excluded by the caller's contract.
        unsafe { &*self.contract.get() }
    }

    /// The scratch as `describe` and `scratch` report it, whatever else runs on the handle.
    pub(crate) fn published_scratch(&self) -> Scratch {
        self.published.read()
    }

    /// The Rust face's view of a call.
    ///
    /// # Safety
    /// `running` must be the execute exclusivity of the gate of the Rust handle that owns
    /// `self`, and the returned view must not outlive it.
    #[inline(always)]
    pub(crate) unsafe fn rust_call<'a>(&'a self, running: &'a Running<'_>) -> RustCall<'a> {
        let _ = running;
        // SAFETY: a Rust handle's contract changes only through `&mut`, which `&self` excludes;
        // `running` gives this call the call cells, of which the view takes the Rust face's
        // (the marks, which `record` takes, are another field).
        unsafe {
            RustCall {
                contract: self.contract(),
                cells: &mut *std::ptr::addr_of_mut!((*self.call.value.cells.get()).rust),
            }
        }
    }

    /// Checks one C call against the negotiated contract (tensors, sync mode, device, stream,
    /// scratch) and runs the provider. `error` receives the provider's own report when it
    /// fails.
    ///
    /// # Safety
    /// `running` must be the execute exclusivity of the gate of the handle that owns `self`;
    /// `error` must not be one of the handle's cells; the caller of the service vouches that
    /// each data pointer and the scratch buffers address live memory of the checked extents for
    /// the call (the service's contract).
    #[inline(always)]
    pub(crate) unsafe fn execute(
        &self,
        running: &Running<'_>,
        call: &Call<'_>,
        error: &mut guild_error_info_t,
    ) -> Result<(), ExecuteError> {
        let _ = running;
        // SAFETY: `running` excludes a reshape of this handle.
        let contract = unsafe { self.contract() };
        self.check_c_tensors(contract, TensorRole::Input, call.inputs)?;
        self.check_c_tensors(contract, TensorRole::Output, call.outputs)?;
        let a = call.args;
        if call_key(a.device_id, a.sync_mode) != self.call_key
            || (!self.takes_stream && !a.stream.is_null())
            || !self.lacks_here.is_empty()
        {
            return Err(self.call_mismatch(a));
        }
        contract.check_scratch(
            a.scratch_host,
            a.scratch_host_size,
            a.scratch_device,
            a.scratch_device_size,
        )?;
        // SAFETY: every tensor was checked against the negotiated contract (shape, strides,
        // dtype, memory space, device, non-NULL and aligned data), and so were the sync mode,
        // device, stream and scratch; the caller vouches for the memory (this function's
        // contract), and `running` makes this the handle's only call.
        unsafe { self.call_provider(running, a, error) }
    }

    /// Runs the provider on a checked call and records its stream work.
    ///
    /// # Safety
    /// `args` must be checked against the negotiated contract as [`Resolved::execute`] checks
    /// it, with memory valid for the call; `running` must be the execute exclusivity of the
    /// handle that owns `self`.
    #[inline(always)]
    pub(crate) unsafe fn call_provider(
        &self,
        running: &Running<'_>,
        args: &guild_execute_args_v1_t,
        error: &mut guild_error_info_t,
    ) -> Result<(), ExecuteError> {
        // The provider's library stays loaded while `self.binding` lives.
        let status = match self.entry {
            // SAFETY: the provider's own callback and user_data, which it says `execute`
            // hands every call to (`execute_entry`'s contract), with arguments meeting
            // `ExecuteCall::new`'s contract (this function's) and a live, sized record.
            Some(entry) => unsafe { (entry.execute)(entry.user_data, args, error) },
            None => {
                // SAFETY: the caller's contract is ExecuteCall's.
                let checked = unsafe { ExecuteCall::new(args) };
                self.kernel().execute(checked, error)
            }
        };
        let _ = running;
        if self.streams.is_some() {
            // SAFETY: `running` is this handle's exclusivity (the caller's contract), held
            // across this call.
            unsafe { self.record(args, status) }?;
        }
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(provider_failure(status, error))
        }
    }

    /// Records the end of the stream work a call enqueued, even after a failure (part of the
    /// work may already be enqueued).
    ///
    /// # Safety
    /// The caller must hold the execute exclusivity of the handle that owns `self` for the
    /// whole call. (The proof is not passed: it would make the caller keep it in memory for
    /// this cold call's sake, on every call.)
    #[cold]
    unsafe fn record(
        &self,
        args: &guild_execute_args_v1_t,
        status: guild_status_t,
    ) -> Result<(), ExecuteError> {
        let Some(streams) = &self.streams else {
            return Ok(());
        };
        // SAFETY: the caller's exclusivity gives this call the call cells; no other reference
        // to the marks exists (the Rust face's view borrows other fields).
        let marks = unsafe { &mut *std::ptr::addr_of_mut!((*self.call.value.cells.get()).marks) };
        let stream = StreamRef(args.stream as usize);
        match streams.record(args.device_id, stream) {
            Ok(Some(mark)) => {
                marks.retain(|m| m.stream() != stream);
                marks.push(mark);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) if status == GUILD_STATUS_OK => Err(ExecuteError::Stream(e)),
            Err(_) => Ok(()),
        }
    }

    /// Checks a C caller's tensors against the negotiated ones: the same shape, strides, dtype,
    /// memory space and device, and data present and aligned as the contract requires.
    /// Everything else the contract says was checked at negotiation against these very shapes.
    #[inline(always)]
    fn check_c_tensors(
        &self,
        contract: &Contract,
        role: TensorRole,
        given: &[guild_tensor_desc_v1_t],
    ) -> Result<(), ExecuteError> {
        let negotiated = contract.shapes(role);
        if given.len() != negotiated.len() {
            return Err(arity(role, negotiated.len(), given.len()));
        }
        let mask = self.align_mask;
        let bad = given.iter().zip(negotiated).position(|(t, expected)| {
            let address = t.data as usize as u64;
            !expected.matches(t) || (address == 0) | (address & mask != 0)
        });
        match bad {
            None => Ok(()),
            Some(index) => Err(self.bad_tensor(contract, TensorRef { role, index }, &given[index])),
        }
    }

    /// Why a C tensor failed [`Resolved::check_c_tensors`].
    #[cold]
    fn bad_tensor(
        &self,
        contract: &Contract,
        tensor: TensorRef,
        t: &guild_tensor_desc_v1_t,
    ) -> ExecuteError {
        let list = contract.descs(tensor.role);
        let Some(expected) = list.get(tensor.index) else {
            return arity(tensor.role, list.len(), tensor.index);
        };
        let matches = contract
            .shapes(tensor.role)
            .get(tensor.index)
            .is_some_and(|s| s.matches(t));
        if !matches {
            let actual = tensor_from_c(t).unwrap_or(TensorDesc {
                memory_space: expected.memory_space,
                ..*expected
            });
            return ExecuteError::DescriptorMismatch {
                tensor,
                expected: Box::new(*expected),
                actual: Box::new(TensorDesc {
                    data_addr: None,
                    ..actual
                }),
            };
        }
        self.bad_address(tensor, t.data as usize as u64)
    }

    /// The error for a NULL or misaligned data address.
    #[cold]
    pub(crate) fn bad_address(&self, tensor: TensorRef, address: u64) -> ExecuteError {
        if address == 0 {
            return ExecuteError::NullData { tensor };
        }
        ExecuteError::Contract {
            rejection: Rejection::Misaligned {
                tensor,
                address,
                required: self.align_mask + 1,
            },
        }
    }

    /// The error for a call whose sync mode, device or stream is not the handle's.
    #[cold]
    fn call_mismatch(&self, a: &guild_execute_args_v1_t) -> ExecuteError {
        if !self.lacks_here.is_empty() {
            return self.not_here();
        }
        if SyncMode::from_raw(a.sync_mode) != Some(self.sync_mode) {
            return ExecuteError::SyncMode {
                resolved: self.sync_mode,
                got: a.sync_mode,
            };
        }
        if a.device_id != self.device_id {
            return ExecuteError::Device {
                resolved: self.device_id,
                got: a.device_id,
            };
        }
        ExecuteError::StreamOnCpu
    }

    /// Why a handle resolved for another CPU does not run on this one.
    #[cold]
    pub(crate) fn not_here(&self) -> ExecuteError {
        ExecuteError::MissingCpuIsa {
            impl_id: self.candidate().impl_id.clone(),
            missing: self.lacks_here,
        }
    }

    /// Runs `read` with the buffers a C reshape reads its caller's tensors into (inputs,
    /// outputs): the descriptors of the contract the last reshape replaced (laid out for this
    /// handle's tensors at its first reshape), which [`Resolved::renegotiate_read`] then makes
    /// the new contract in. Nothing the handle's calls read is touched.
    ///
    /// # Safety
    /// No other call of this handle may run (the caller holds its execute exclusivity).
    pub(crate) unsafe fn read_reshape<T>(
        &self,
        read: impl FnOnce(&mut [TensorDesc], &mut [TensorDesc]) -> T,
    ) -> T {
        // SAFETY: the caller's contract gives this reshape the reshape cells, and excludes
        // every writer of the contract.
        let (current, spare) = unsafe { (self.contract(), &mut (*self.reshaping.get()).spare) };
        let split = current.tensors.split();
        spare.fit(split, current.tensors.descs().len() - split, false);
        let (inputs, outputs) = spare.tensors.descs_mut().split_at_mut(split);
        read(inputs, outputs)
    }

    /// Renegotiates the contract for new tensors with this handle's provider alone (the Rust
    /// face's reshape; see [`Resolved::renegotiate_read`] for what is checked). The new
    /// contract, the C form of its tensors included, is made in the spare's block as the
    /// tensors are checked, for [`Resolved::install_mut`] to install.
    ///
    /// # Safety
    /// No other call of this handle may run: the caller holds `&mut` of its Rust handle.
    pub(crate) unsafe fn renegotiate(
        &self,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &[u8],
    ) -> Result<(), ReshapeError> {
        // SAFETY: the caller's contract: no reshape runs but this one, and the reshape cells
        // are this call's (no reference to the contract reaches them).
        let (current, cells) = unsafe { (self.contract(), &mut *self.reshaping.get()) };
        let ReshapeCells { spare, work } = cells;
        let (n_in, n_out) = (current.inputs().len(), current.outputs().len());
        // A reshape of other counts is refused by the checks before anything is written, and
        // lays nothing out.
        if (inputs.len(), outputs.len()) == (n_in, n_out) {
            spare.fit(n_in, n_out, true);
        }
        let (descs, shapes, calls) = spare.tensors.parts_mut();
        let scratch = self.negotiate_shapes(
            current,
            inputs,
            outputs,
            Reshaping::Rust {
                descs,
                shapes,
                calls,
            },
            params,
            work,
        )?;
        spare.set_scratch(scratch);
        Ok(())
    }

    /// Renegotiates the contract for the new tensors [`Resolved::read_reshape`] read, with this
    /// handle's provider alone. Only what a reshape can change is checked again, against what
    /// the handle already knows: each new tensor on its own (as a query's are), against the
    /// candidate's declaration (as `check_static` checks each tensor), then the provider's
    /// `validate` and `query_scratch` and the budgets, in the C query of the resolution's
    /// numbers ([`Resolved::statics`]) and the new tensors. Every other static check concerns
    /// what no reshape changes, and passed at resolution. The new contract is made in place of
    /// the one the last reshape replaced (the reshape cells' spare, its block laid out at the
    /// handle's first reshape, which [`Resolved::install`] or [`Resolved::install_mut`] then
    /// trades with the handle's: two small headers, the blocks stay where they are): after the
    /// first reshape, nothing is allocated unless something refuses. Nothing the handle's calls
    /// read changes here, so a refusal leaves it as it was. Only rank, dims and strides may change: the number of tensors, their dtypes,
    /// memory spaces and devices are the resolution's.
    ///
    /// `c_tensors` are the C caller's own descriptors of the tensors read, handed to the
    /// callbacks as they are (as a resolution hands them).
    ///
    /// # Safety
    /// No other call of this handle may run: the caller holds its execute exclusivity.
    pub(crate) unsafe fn renegotiate_read(
        &self,
        c_tensors: [&[guild_tensor_desc_v1_t]; 2],
        params: &[u8],
    ) -> Result<(), ReshapeError> {
        // SAFETY: as in `renegotiate`.
        let (current, cells) = unsafe { (self.contract(), &mut *self.reshaping.get()) };
        let ReshapeCells { spare, work } = cells;
        // The caller's counts: `read_reshape` read the tensors only when they are the
        // handle's, so another count is refused here, before the checks read the spare.
        for (role, now, given) in [
            (
                TensorRole::Input,
                current.inputs().len(),
                c_tensors[0].len(),
            ),
            (
                TensorRole::Output,
                current.outputs().len(),
                c_tensors[1].len(),
            ),
        ] {
            if now != given {
                return Err(ReshapeError::Arity {
                    role,
                    expected: now,
                    got: given,
                });
            }
        }
        let split = spare.tensors.split();
        let (descs, shapes, _) = spare.tensors.parts_mut();
        let (inputs, outputs) = descs.split_at(split);
        let scratch = self.negotiate_shapes(
            current,
            inputs,
            outputs,
            Reshaping::C {
                tensors: c_tensors,
                shapes,
            },
            params,
            work,
        )?;
        spare.set_scratch(scratch);
        Ok(())
    }

    /// The checks and callbacks of a reshape to `inputs` and `outputs` (see
    /// [`Resolved::renegotiate_read`]), from the handle's `current` contract, for `face`: the
    /// new scratch. Inlined into each face's reshape, which then passes it its arguments in
    /// registers (43 instructions less a C reshape and 62 a Rust one, callgrind, operations
    /// bench).
    #[inline(always)]
    fn negotiate_shapes(
        &self,
        current: &Contract,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        mut face: Reshaping<'_>,
        params: &[u8],
        work: &mut ReshapeWork,
    ) -> Result<Scratch, ReshapeError> {
        for (role, now, new) in [
            (TensorRole::Input, current.inputs(), inputs),
            (TensorRole::Output, current.outputs(), outputs),
        ] {
            if now.len() != new.len() {
                return Err(ReshapeError::Arity {
                    role,
                    expected: now.len(),
                    got: new.len(),
                });
            }
            for (index, (a, b)) in now.iter().zip(new).enumerate() {
                let changed = if a.dtype != b.dtype {
                    Some("dtype")
                } else if a.memory_space != b.memory_space {
                    Some("memory space")
                } else if a.device_id != b.device_id {
                    Some("device")
                } else {
                    None
                };
                if let Some(what) = changed {
                    return Err(ReshapeError::Changed {
                        tensor: TensorRef { role, index },
                        what,
                    });
                }
            }
        }
        let ReshapeWork { query } = work;
        // Each tensor valid on its own and held against the candidate in one pass, but with
        // the precedence of two: every tensor is checked on its own before any refusal of the
        // candidate's is reported, as `OpQuery::new` checks a query before `check_static`
        // runs. Its device check needs no repeat: memory spaces and devices are those the
        // handle's query passed with.
        let mut refused = None;
        // Which tensor of all, inputs then outputs.
        let mut k = 0;
        for (role, list) in [(TensorRole::Input, inputs), (TensorRole::Output, outputs)] {
            for (index, d) in list.iter().enumerate() {
                let tensor = TensorRef { role, index };
                let info = match d.check() {
                    Ok(info) => info,
                    Err(error) => return Err(invalid_tensor(tensor, error)),
                };
                let passes = passes_as_reshaped(self.candidate(), d, &info);
                // The quick test may never admit what the domain's check refuses: every test
                // build holds them to each other on each reshape it makes.
                debug_assert!(
                    !passes || check_tensor(self.candidate(), tensor, d, &info).is_ok(),
                    "the reshape's quick test admitted {tensor:?}, which check_tensor refuses"
                );
                if refused.is_none() && !passes {
                    // The domain's check is the judge of what the quick test refused (and
                    // names the reason).
                    refused = check_tensor(self.candidate(), tensor, d, &info).err();
                }
                match &mut face {
                    Reshaping::Rust {
                        descs,
                        shapes,
                        calls,
                    } => {
                        if let (Some(slot), Some(shape), Some(c)) =
                            (descs.get_mut(k), shapes.get_mut(k), calls.get_mut(k))
                        {
                            // The spare holds the contract of two reshapes ago (or a refused
                            // one's writes), each tensor's descriptor, shape and C form written
                            // together: a tensor that is the one there (a shape the loop
                            // alternates between, a tensor that stays) keeps them, and only its
                            // known address is written, as calls leave theirs in the C form.
                            if shape.matches_desc(d) && *slot == *d {
                                c.data = address_ptr(d);
                            } else {
                                *slot = *d;
                                shape.set(d, &info);
                                *c = c_tensor(d, address_ptr(d));
                            }
                        }
                    }
                    Reshaping::C { shapes, .. } => {
                        // A shape is a function of its tensor's fields that it compares (and
                        // of the facts they fix), so a tensor the spare's shape matches is set.
                        if let Some(shape) = shapes.get_mut(k) {
                            if !shape.matches_desc(d) {
                                shape.set(d, &info);
                            }
                        }
                    }
                }
                k += 1;
            }
        }
        if let Some(refusal) = refused {
            return Err(ReshapeError::Refused(refusal));
        }
        let [c_inputs, c_outputs] = match face {
            Reshaping::C { tensors, .. } => tensors,
            Reshaping::Rust { calls, .. } => {
                let made: &[guild_tensor_desc_v1_t] = calls;
                let made = made.get(..k).unwrap_or_default();
                let (made_inputs, made_outputs) = made.split_at(inputs.len().min(made.len()));
                [made_inputs, made_outputs]
            }
        };
        let q = &mut **query.get_or_insert_with(|| self.reshape_query());
        let ReshapeQuery {
            caps,
            query: c_query,
            error,
            ..
        } = q;
        c_query.inputs = c_inputs.as_ptr();
        c_query.input_count = c_inputs.len();
        c_query.outputs = c_outputs.as_ptr();
        c_query.output_count = c_outputs.len();
        c_query.params = params_ptr(params);
        c_query.params_size = params.len();
        c_query.device_caps = &*caps;
        // SAFETY: the names lead into `q._names`, the device record into `q.caps`, the tensor
        // arrays into `c_tensors` or the reshape cells and the params into `params`, all of
        // which outlive both callbacks (which may not keep the query past their call); the
        // tensor data addresses are only the known addresses, for inspection.
        let call = unsafe { QueryCall::new(c_query) };
        let provider = self.kernel();
        clear_error(error);
        validate_query(provider, call, error, full_refusal)
            .map_err(|r| ReshapeError::Refused(Rejection::ValidateRefused(r)))?;
        clear_error(error);
        let (request, alignment) = scratch_query(provider, call, error, full_refusal)
            .map_err(|r| ReshapeError::Refused(Rejection::ScratchRefused(r)))?;
        check_budgets(&request, self.statics.ram_budget, self.statics.vram_budget)
            .map_err(ReshapeError::Refused)?;
        Ok(Scratch {
            host_bytes: request.host_bytes,
            device_bytes: request.device_bytes,
            alignment,
        })
    }

    /// The C query of every reshape of this handle, less its tensors and params: the
    /// resolution's numbers, the chosen candidate's name and (when the query named one) id, its
    /// device record.
    #[cold]
    fn reshape_query(&self) -> Box<ReshapeQuery> {
        let candidate = self.candidate();
        // Ids and names are validated text without NUL bytes; an empty string is the harmless
        // fallback should that ever change. The chosen candidate implements the query's
        // operation, and is the exact id the query named, if it named one.
        let names = (
            CString::new(candidate.op_name.as_str()).unwrap_or_default(),
            self.statics
                .exact
                .then(|| CString::new(candidate.impl_id.as_str()).unwrap_or_default()),
        );
        let caps = device_caps(candidate, &self.statics);
        let parts = QueryParts {
            op_name: &names.0,
            exact: names.1.as_deref(),
            inputs: &[],
            outputs: &[],
            params: &[],
        };
        let mut query = c_query(&parts, &self.statics, &caps);
        // Each reshape points it at the boxed record.
        query.device_caps = std::ptr::null();
        Box::new(ReshapeQuery {
            _names: names,
            caps,
            query,
            error: guild_error_info_t::new(),
        })
    }

    /// Installs the contract [`Resolved::renegotiate`] made; the one it replaces becomes the
    /// next reshape's spare.
    ///
    /// # Safety
    /// `running` must be the execute exclusivity of the gate of the C handle that owns `self`
    /// (which excludes every other reader of the contract and the call cells).
    pub(crate) unsafe fn install(&self, running: &Running<'_>) {
        let _ = running;
        // SAFETY: the caller's contract: no call reads the contract or the reshape cells
        // while `running` lives, and `describe`/`scratch` read only `published`.
        let (contract, cells) = unsafe { (&mut *self.contract.get(), &mut *self.reshaping.get()) };
        std::mem::swap(contract, &mut cells.spare);
        // SAFETY: `running` makes this the only writer.
        unsafe { self.published.write(contract.scratch) };
    }

    /// Installs in a Rust handle the contract [`Resolved::renegotiate`] made without C
    /// tensors: the C form it made of them becomes the calls' tensors, and the calls' old ones
    /// are the next reshape's buffers.
    pub(crate) fn install_mut(&mut self) {
        let cells = self.reshaping.get_mut();
        let contract = self.contract.get_mut();
        std::mem::swap(contract, &mut cells.spare);
        // SAFETY: `&mut self`: the only writer.
        unsafe { self.published.write(contract.scratch) };
        self.call.value.cells.get_mut().rust.take_up(contract);
    }

    /// Waits for the stream work this handle recorded; afterwards nothing recorded is pending.
    /// The first device error is reported, after every mark has been waited for.
    pub(crate) fn finish(&mut self) -> Result<(), DeviceError> {
        let marks = std::mem::take(&mut self.call.value.cells.get_mut().marks);
        let mut first = Ok(());
        for mark in marks {
            if let Err(e) = mark.wait() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Drop for Resolved {
    fn drop(&mut self) {
        // The binding (and with it possibly the provider's code) goes after the fields drop, so
        // recorded work must be over first. Errors were the caller's to collect by releasing.
        let _ = self.finish();
    }
}

/// Whether a reshape's valid tensor `d` (whose facts are `info`) passes [`check_tensor`]
/// against the handle's candidate `c`: the same tests, inline and without a refusal to make,
/// less the two that cannot fail for a tensor a reshape accepts for checking, its dtype and its
/// memory space, which are those the resolution's query passed with (a reshape refuses any
/// other as [`ReshapeError::Changed`] first). When it answers `false`, `check_tensor` decides.
#[inline(always)]
fn passes_as_reshaped(c: &OpCandidate, d: &TensorDesc, info: &TensorInfo) -> bool {
    let rank_ok = d.rank >= c.min_rank && d.rank <= c.max_rank;
    // As `TensorDesc::shape`, without a call across crates.
    let rank = usize::try_from(d.rank).map_or(MAX_TENSOR_RANK, |r| r.min(MAX_TENSOR_RANK));
    let mut dims_ok = true;
    for (&dim, &max) in d.dims[..rank].iter().zip(&c.max_dim) {
        dims_ok &= max == 0 || dim <= max;
    }
    let batch_ok = c.max_batch == 0 || info.batch <= c.max_batch;
    let aligned = match d.data_addr {
        // `OpCandidate::check` refused alignments that are not powers of two.
        Some(address) => c.min_alignment <= 1 || address & (c.min_alignment - 1) == 0,
        None => true,
    };
    rank_ok & dims_ok & batch_ok & aligned && c.layouts.admits(info.layout)
}

/// A reshape's tensor that is not valid on its own.
#[cold]
fn invalid_tensor(tensor: TensorRef, error: TensorError) -> ReshapeError {
    ReshapeError::Query(QueryError::Tensor { tensor, error })
}

/// The error for a call with another number of tensors than negotiated.
#[cold]
pub(crate) fn arity(role: TensorRole, expected: usize, got: usize) -> ExecuteError {
    ExecuteError::Arity {
        role,
        expected,
        got,
    }
}

/// The provider's failure, with the text it left in the record.
#[cold]
fn provider_failure(status: guild_status_t, error: &guild_error_info_t) -> ExecuteError {
    ExecuteError::Provider(ProviderRefusal::new(status, error_text(error)))
}

/// A negotiated tensor as calls must repeat it: every field of the C descriptor but the data
/// pointer (its [`Described`] form, with dims and strides at and above the rank zeroed, as
/// callers' entries there are ignored), its rank and its byte extent. The fixed fields are
/// packed in two words, so that a call's tensor is compared with two comparisons and one pass
/// over its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    fixed: Described,
    /// `memory_space | device_id << 32`, the memory space as its `GUILD_MEMORY_*` bit: the C
    /// descriptor's last two fields as one word.
    place: u64,
    /// The rank, at most [`MAX_TENSOR_RANK`].
    rank: usize,
    /// The tensor's byte extent, which a Rust call's buffer must hold.
    byte_extent: u64,
}

/// A shape is a line pair or more, so that one after a block's call tensors keeps every line a
/// call writes the block's own.
const _: () = assert!(size_of::<Shape>() >= LINE_PAIR);

impl Blank for Shape {
    const BLANK: Shape = Shape::BLANK;
}

impl Shape {
    /// What a contract's shapes are before [`Shape::set`] (a placeholder, matched by nothing a
    /// call passes: its rank is 0).
    pub(crate) const BLANK: Shape = Shape {
        fixed: Described {
            head: 0,
            place: 0,
            dims: [0; MAX_TENSOR_RANK],
            strides: [0; MAX_TENSOR_RANK],
        },
        place: 0,
        rank: 0,
        byte_extent: 0,
    };

    /// The shape of `d`, whose facts are `info`: what [`Shape::set`] makes, as a new value.
    /// (Made with `set` itself: a copy of the arrays with the entries above the rank cleared,
    /// by masks or by a loop, cost a contract's block more instructions.)
    #[inline(always)]
    fn of(d: &TensorDesc, info: &TensorInfo) -> Shape {
        let mut shape = Shape::BLANK;
        shape.set(d, info);
        shape
    }

    /// Makes this the shape of `d`, whose facts are `info`, in place.
    #[inline(always)]
    fn set(&mut self, d: &TensorDesc, info: &TensorInfo) {
        // As `TensorDesc::shape`'s length.
        let rank = usize::try_from(d.rank).map_or(MAX_TENSOR_RANK, |r| r.min(MAX_TENSOR_RANK));
        // Entries at and above the rank are zeroed by a select per entry over the whole fixed
        // array, not a fill and a copy of the rank's length: a reshape sets a shape per tensor,
        // and the two library calls cost more than the tensor's checks.
        let fixed = &mut self.fixed;
        fixed.head = Described::head(d.dtype.raw(), d.rank);
        fixed.place = Described::place(d);
        for i in 0..MAX_TENSOR_RANK {
            fixed.dims[i] = if i < rank { d.dims[i] } else { 0 };
            fixed.strides[i] = if i < rank { d.strides[i] } else { 0 };
        }
        self.place = place_key(d.memory_space.bit(), d.device_id);
        self.rank = rank;
        self.byte_extent = info.byte_extent;
    }

    /// Whether the extents and strides below the rank are `dims` and `strides`.
    #[inline(always)]
    fn same_extents(
        &self,
        dims: &[u64; MAX_TENSOR_RANK],
        strides: &[u64; MAX_TENSOR_RANK],
    ) -> bool {
        // A negotiated tensor has at least one axis (`TensorDesc::check`), so the first is
        // compared without a test of the rank (were the rank 0, it would be stricter still:
        // the shape's entries at and above its rank are zero).
        let rank = self.rank.min(MAX_TENSOR_RANK);
        let mut diff = (dims[0] ^ self.fixed.dims[0]) | (strides[0] ^ self.fixed.strides[0]);
        for i in 1..rank {
            diff |= (dims[i] ^ self.fixed.dims[i]) | (strides[i] ^ self.fixed.strides[i]);
        }
        diff == 0
    }

    /// Whether the C tensor `t` is this tensor apart from its data pointer.
    #[inline(always)]
    fn matches(&self, t: &guild_tensor_desc_v1_t) -> bool {
        Described::head(t.dtype, t.rank) == self.fixed.head
            && place_key(t.memory_space, t.device_id) == self.place
            && self.same_extents(&t.dims, &t.strides)
    }

    /// Whether the descriptor `d` is this tensor apart from its data address.
    #[inline(always)]
    fn matches_desc(&self, d: &TensorDesc) -> bool {
        Described::head(d.dtype.raw(), d.rank) == self.fixed.head
            && Described::place(d) == self.fixed.place
            && self.same_extents(&d.dims, &d.strides)
    }
}

impl RustCall<'_> {
    /// Checks one side of a Rust call, buffer by buffer, against the negotiated tensors (the
    /// descriptor, the element type, the byte extent, the data address against the mask) and
    /// writes each data pointer into the call's C tensors. One pass over slices of equal
    /// length, indexed, so that nothing but the pointers is copied and no iterator state is
    /// kept in memory.
    #[inline(always)]
    pub(crate) fn fill<B: Buffer>(
        &mut self,
        r: &Resolved,
        role: TensorRole,
        args: &[B],
    ) -> Result<(), ExecuteError> {
        let contract = self.contract;
        let shapes = contract.shapes(role);
        // SAFETY: this call holds the handle's execute exclusivity (how the view was made), so
        // no other reference to the call tensors lives while `out` does.
        let out = unsafe { contract.tensors.call_role_mut(role == TensorRole::Input) };
        let n = shapes.len();
        if args.len() != n || out.len() != n {
            return Err(arity(role, n, args.len()));
        }
        let mask = r.align_mask;
        for index in 0..n {
            let arg = args[index].parts();
            let shape = &shapes[index];
            let (desc, ptr, len) = arg;
            let address = ptr as usize as u64;
            // A buffer whose element type is not its descriptor's dtype carries a marked
            // descriptor, which matches no shape (see `Buffer`): the element check is this one.
            let ok = desc.matches(shape)
                && u64::try_from(len).unwrap_or(u64::MAX) >= shape.byte_extent
                && address != 0
                && address & mask == 0;
            if !ok {
                return Err(bad_buffer(
                    contract,
                    r,
                    TensorRef { role, index },
                    &args[index],
                ));
            }
            out[index].data = ptr;
        }
        Ok(())
    }
}

/// Why a buffer failed [`RustCall::fill`]. It takes the contract, not the call's view, and
/// the buffer, not its parts, so that neither has to be kept in memory or registers for its
/// sake.
#[cold]
fn bad_buffer<B: Buffer>(
    contract: &Contract,
    r: &Resolved,
    tensor: TensorRef,
    arg: &B,
) -> ExecuteError {
    let (desc, ptr, len) = arg.parts();
    let element = desc.element();
    let desc = &desc.unmarked();
    let list = contract.descs(tensor.role);
    let (Some(expected), Some(shape)) = (
        list.get(tensor.index),
        contract.shapes(tensor.role).get(tensor.index),
    ) else {
        return arity(tensor.role, list.len(), tensor.index);
    };
    if !desc.matches(shape) {
        return ExecuteError::DescriptorMismatch {
            tensor,
            expected: Box::new(*expected),
            actual: Box::new(desc.desc()),
        };
    }
    if let Some(element) = element {
        return ExecuteError::ElementType {
            tensor,
            dtype: desc.dtype(),
            element,
        };
    }
    if u64::try_from(len).unwrap_or(u64::MAX) < shape.byte_extent {
        return ExecuteError::BufferTooSmall {
            tensor,
            needed: shape.byte_extent,
            got: len,
        };
    }
    r.bad_address(tensor, ptr as usize as u64)
}

/// A buffer of a Rust call, as [`RustCall::fill`] reads it.
pub(crate) trait Buffer {
    /// Its descriptor's type.
    type Desc: Describes;
    /// Its descriptor, address and length in bytes. When the buffer's element type is not the
    /// descriptor's dtype, the descriptor must be marked so that it matches no shape
    /// ([`Lent::new`]): `fill` checks the element type through that match, and
    /// [`Describes::unmarked`] takes the mark off for the error report.
    fn parts(&self) -> BufferArg<'_, Self::Desc>;
}

/// One buffer of a Rust call: its descriptor (marked when the buffer's element type is not its
/// dtype), its address and its length in bytes.
pub(crate) type BufferArg<'a, D> = (&'a D, *mut c_void, usize);

/// A Rust call's descriptor of a buffer, as its checks read it.
pub(crate) trait Describes {
    /// Whether it is the negotiated tensor `shape`, its data address aside.
    fn matches(&self, shape: &Shape) -> bool;
    /// Its element type.
    fn dtype(&self) -> DType;
    /// The descriptor itself, for an error report.
    fn desc(&self) -> TensorDesc;
    /// The descriptor as made, without the mark a buffer of another element type carries
    /// (see [`Buffer::parts`]).
    fn unmarked(&self) -> Self;
    /// The element type of a marked descriptor's buffer; `None` when it is not marked.
    fn element(&self) -> Option<DType>;
}

impl Describes for TensorDesc {
    #[inline(always)]
    fn matches(&self, shape: &Shape) -> bool {
        shape.matches_desc(self)
    }

    #[inline(always)]
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn desc(&self) -> TensorDesc {
        *self
    }

    /// A whole descriptor is never marked: it comes with no element type.
    fn unmarked(&self) -> Self {
        *self
    }

    fn element(&self) -> Option<DType> {
        None
    }
}

/// The fields of a [`TensorDesc`] that a contract fixes, without the data address: what a
/// negotiated tensor keeps in its [`Shape`], packed in two words, so that a call's descriptor
/// is compared with two comparisons and one pass over the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Described {
    /// `dtype | rank << 32`.
    head: u64,
    /// `space | device_id << 32`, the memory space as its `MemorySpace` discriminant.
    place: u64,
    dims: [u64; MAX_TENSOR_RANK],
    strides: [u64; MAX_TENSOR_RANK],
}

impl Described {
    #[inline(always)]
    fn head(dtype: u32, rank: u32) -> u64 {
        u64::from(dtype) | (u64::from(rank) << 32)
    }

    #[inline(always)]
    fn place(d: &TensorDesc) -> u64 {
        u64::from(d.memory_space as u8) | (u64::from(d.device_id as u32) << 32)
    }
}

/// A slice argument's descriptor as the Rust face receives it: borrowed from the caller, who
/// keeps it (it is the handle's negotiated one, or a copy of it), so that making an argument
/// for every call copies two words rather than the descriptor's 160 bytes. It is marked with
/// the slice's element type when that is not the descriptor's dtype; a marked descriptor
/// matches no shape, so the element check is paid once, when the argument is made, and rides
/// on the descriptor's comparison in every call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lent<'a> {
    desc: &'a TensorDesc,
    /// The slice's element type, only when it is not the dtype.
    mark: Option<DType>,
}

impl<'a> Lent<'a> {
    /// The descriptor of a slice of `element`s (`None`: raw bytes, which any dtype may be).
    #[inline(always)]
    pub(crate) fn new(desc: &'a TensorDesc, element: Option<DType>) -> Self {
        Lent {
            desc,
            mark: element.filter(|e| *e != desc.dtype),
        }
    }
}

impl Describes for Lent<'_> {
    #[inline(always)]
    fn matches(&self, shape: &Shape) -> bool {
        self.mark.is_none() && shape.matches_desc(self.desc)
    }

    fn dtype(&self) -> DType {
        self.desc.dtype
    }

    /// The descriptor without its data address, which the slice's replaces.
    fn desc(&self) -> TensorDesc {
        TensorDesc {
            data_addr: None,
            ..*self.desc
        }
    }

    fn unmarked(&self) -> Self {
        Lent {
            mark: None,
            ..*self
        }
    }

    fn element(&self) -> Option<DType> {
        self.mark
    }
}

/// The text a callback left in an error record, up to its first NUL.
fn error_text(error: &guild_error_info_t) -> String {
    fixed_buffer_text(&error.message)
}

fn check_scratch(
    kind: &'static str,
    needed: u64,
    mask: u64,
    ptr: *mut c_void,
    size: u64,
) -> Result<(), ExecuteError> {
    if needed == 0 {
        return Ok(());
    }
    if ptr.is_null() || size < needed {
        return Err(ExecuteError::ScratchTooSmall {
            kind,
            needed,
            got: if ptr.is_null() { 0 } else { size },
        });
    }
    if ptr as usize as u64 & mask != 0 {
        return Err(ExecuteError::ScratchMisaligned {
            kind,
            address: ptr as usize,
            alignment: u32::try_from(mask + 1).unwrap_or(u32::MAX),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Rust handle's gate, which every call on it writes, lies in its handle's padded call
    /// cells: a line pair of the handle's own on either side, so that whatever the allocator
    /// puts beside a handle (another handle, executing on another thread), neither writes the
    /// other's lines; and an `OpHandle`, which a resolution returns, is one pointer.
    #[test]
    fn a_rust_handles_gate_lies_in_lines_of_its_own() {
        let at = std::mem::offset_of!(Resolved, call.value.gate);
        assert!(at >= LINE, "the gate is {at} bytes into the handle");
        let after = size_of::<Resolved>() - (at + size_of::<Gate>());
        assert!(
            after >= LINE,
            "the gate is {after} bytes from the handle's end"
        );
        assert_eq!(
            size_of::<super::super::OpHandle<'static>>(),
            size_of::<usize>()
        );
    }

    fn desc(n: u64) -> TensorDesc {
        TensorDesc::new(DType::F32, &[n], MemorySpace::Host)
    }

    /// The contract of `n_in` inputs (dims 1, 2, ...) and `n_out` outputs (dims 101, 102, ...),
    /// with call tensors made from C forms whose data pointers are set (as a negotiation's
    /// known addresses are), taken up by `cells` as a resolution takes them up.
    fn made(cells: &mut RustCells, n_in: usize, n_out: usize) -> Contract {
        let known = |n: u64| TensorDesc {
            data_addr: Some(64),
            ..desc(n)
        };
        let ins: Vec<_> = (1..n_in as u64 + 1).map(known).collect();
        let outs: Vec<_> = (101..101 + n_out as u64).map(known).collect();
        let infos: Vec<_> = ins
            .iter()
            .chain(&outs)
            .map(|d| d.check().unwrap())
            .collect();
        let block = call_block(&ins, &outs, &infos);
        assert!(block.call_tensors().iter().all(|t| t.data as usize == 64));
        let scratch = Scratch {
            host_bytes: 0,
            device_bytes: 0,
            alignment: 0,
        };
        let mut contract = Contract::made(&ins, &outs, &infos, scratch, Some(block));
        cells.take_up(&mut contract);
        contract
    }

    /// Checks that `contract`'s call tensors hold `n_in` inputs (dims 1, 2, ...) and `n_out`
    /// outputs (dims 101, 102, ...) with a line pair of their block's own on each side (a
    /// descriptor before them, a shape after them), so that every cache line pair a call
    /// touches there lies inside the block's allocation, without data; that the arguments
    /// record points at them; and that data pointers written as a call writes them are read
    /// through the record, as the provider reads them.
    fn check_cells(cells: &RustCells, contract: &Contract, n_in: usize, n_out: usize) {
        let size = size_of::<guild_tensor_desc_v1_t>();
        let t = contract.tensors.call_tensors();
        let (first, len) = (t.as_ptr() as usize, t.len());
        assert_eq!(len, n_in + n_out, "{n_in}+{n_out}");
        if len > 0 {
            let pair = 128;
            let block_start = contract.tensors.descs().as_ptr() as usize;
            let shapes = contract.tensors.shapes();
            let block_end = shapes.as_ptr() as usize + size_of_val(shapes);
            let last = first + len * size;
            assert!(
                first / pair * pair >= block_start && first - block_start >= pair,
                "{n_in}+{n_out}: first line pair shared"
            );
            assert!(
                last.div_ceil(pair) * pair <= block_end && block_end - last >= pair,
                "{n_in}+{n_out}: last line pair shared"
            );
            assert!(
                shapes.as_ptr() as usize >= last,
                "{n_in}+{n_out}: the shapes overlap the call tensors"
            );
        }
        let dims: Vec<u64> = t.iter().map(|t| t.dims[0]).collect();
        let expected: Vec<u64> = (1..n_in as u64 + 1)
            .chain(101..101 + n_out as u64)
            .collect();
        assert_eq!(dims, expected, "{n_in}+{n_out}");
        assert!(t.iter().all(|t| t.data.is_null()), "{n_in}+{n_out}");
        for (input, n, mark) in [(true, n_in, 1), (false, n_out, 2)] {
            // SAFETY: no other reference to the call tensors lives meanwhile.
            let side = unsafe { contract.tensors.call_role_mut(input) };
            assert_eq!(side.len(), n, "{n_in}+{n_out}");
            for (i, d) in side.iter_mut().enumerate() {
                d.data = std::ptr::without_provenance_mut(mark * 1000 + i);
            }
        }
        let args = &cells.args;
        assert_eq!((args.input_count, args.output_count), (n_in, n_out));
        assert_eq!(args.inputs as usize, first);
        assert_eq!(args.outputs as usize, first + n_in * size);
        for (ptr, n, mark) in [(args.inputs, n_in, 1), (args.outputs, n_out, 2)] {
            for i in 0..n {
                // SAFETY: the record points at `n` descriptors of the live block (checked
                // above).
                let data = unsafe { (*ptr.add(i)).data };
                assert_eq!(data as usize, mark * 1000 + i, "{n_in}+{n_out}");
            }
        }
    }

    /// A Rust handle's call tensors, as a resolution makes them and as reshapes install them
    /// (the spare laid out once, then reused), lie inside their block with a line pair of its
    /// own on each side, and the arguments record follows them; a C handle's are none.
    #[test]
    fn the_call_tensors_lie_inside_their_block_and_the_arguments_follow_them() {
        let counts = [(0, 0), (0, 1), (2, 0), (1, 1), (2, 1), (3, 2), (8, 8)];
        for (n_in, n_out) in counts {
            let mut cells = RustCells::new(SyncMode::HostBlocking, 0);
            let contract = made(&mut cells, n_in, n_out);
            check_cells(&cells, &contract, n_in, n_out);
        }
        // Reshapes, as `Resolved::install_mut` takes them up: the spare laid out at the first,
        // written (data pointers included, as a reshape writes its known addresses), then
        // swapped with the calls' contract; from the second on, nothing is allocated.
        for (n_in, n_out) in counts {
            let mut cells = RustCells::new(SyncMode::HostBlocking, 0);
            let mut contract = made(&mut cells, n_in, n_out);
            let mut spare = Contract::empty();
            let mut blocks = Vec::new();
            for round in 0..5 {
                spare.fit(n_in, n_out, true);
                let (descs, _, calls) = spare.tensors.parts_mut();
                for (k, d) in descs.iter().enumerate() {
                    calls[k] = c_tensor(d, std::ptr::dangling_mut());
                }
                std::mem::swap(&mut contract, &mut spare);
                cells.take_up(&mut contract);
                if round >= 1 {
                    blocks.push(contract.tensors.call_tensors_ptr() as usize);
                }
            }
            // The blank spare's call tensors are blank: the dims of the first round's.
            assert!(
                contract
                    .tensors
                    .call_tensors()
                    .iter()
                    .all(|t| t.data.is_null()),
                "{n_in}+{n_out}"
            );
            assert_eq!(blocks[0], blocks[2], "{n_in}+{n_out}: a block was remade");
            assert_eq!(blocks[1], blocks[3], "{n_in}+{n_out}: a block was remade");
        }
        let none = Contract::empty();
        assert!(none.inputs().is_empty() && none.outputs().is_empty());
        assert!(none.tensors.call_tensors().is_empty());
        // SAFETY: no other reference to the call tensors lives meanwhile.
        assert!(unsafe { none.tensors.call_role_mut(true) }.is_empty());
    }

    /// A handle's call cells lie a line pair or more from both ends of the handle's own
    /// allocation, so that no other allocation shares a line with them, and the handle asks
    /// the allocator for no more alignment than a plain allocation has (no `posix_memalign`
    /// per resolution).
    #[test]
    fn the_call_cells_keep_a_line_pair_of_the_handles_own_on_each_side() {
        type Cells = Padded<UnsafeCell<CallCells>>;
        let start = std::mem::offset_of!(Cells, value);
        let end = start + size_of::<UnsafeCell<CallCells>>();
        assert!(start >= LINE, "{start} bytes before the cells");
        assert!(
            size_of::<Cells>() - end >= LINE,
            "{} bytes after the cells",
            size_of::<Cells>() - end
        );
        assert!(
            align_of::<Resolved>() <= 16,
            "a handle aligned to {} bytes is allocated through posix_memalign",
            align_of::<Resolved>()
        );
    }

    /// A contract made of tensors (more, fewer, as many as the one before; with call tensors
    /// and without) holds exactly the given tensors and their shapes: the entries at and above
    /// each rank zeroed, whatever the caller left there.
    #[test]
    fn a_made_contract_is_the_contract_of_its_tensors() {
        let t = |dims: &[u64]| TensorDesc::new(DType::F32, dims, MemorySpace::Host);
        let mut ragged = t(&[4, 2]);
        ragged.dims[5] = 9;
        ragged.strides[6] = 3;
        let cases = [
            (vec![t(&[4, 2])], vec![t(&[8])]),
            (vec![t(&[3]), ragged], vec![t(&[1])]),
            (vec![t(&[5, 5, 2]), t(&[2])], vec![t(&[6])]),
            (vec![t(&[2])], vec![]),
            (vec![], vec![t(&[7]), t(&[1, 1])]),
        ];
        for ((ins, outs), calls) in cases.into_iter().zip([false, true].into_iter().cycle()) {
            let infos: Vec<_> = ins
                .iter()
                .chain(&outs)
                .map(|d| d.check().unwrap())
                .collect();
            let scratch = Scratch {
                host_bytes: 5,
                device_bytes: 0,
                alignment: 64,
            };
            let c = |d: &TensorDesc| c_tensor(d, std::ptr::null_mut());
            let c_ins: Vec<_> = ins.iter().map(c).collect();
            let c_outs: Vec<_> = outs.iter().map(c).collect();
            let contract = Contract::made(
                &ins,
                &outs,
                &infos,
                scratch,
                calls.then(|| call_block(&ins, &outs, &infos)),
            );
            assert_eq!(
                (contract.inputs(), contract.outputs()),
                (&ins[..], &outs[..])
            );
            let expected: Vec<Shape> = ins
                .iter()
                .chain(&outs)
                .zip(&infos)
                .map(|(d, info)| {
                    let rank = d.rank as usize;
                    let mut dims = [0; MAX_TENSOR_RANK];
                    let mut strides = [0; MAX_TENSOR_RANK];
                    dims[..rank].copy_from_slice(&d.dims[..rank]);
                    strides[..rank].copy_from_slice(&d.strides[..rank]);
                    Shape {
                        fixed: Described {
                            head: Described::head(d.dtype.raw(), d.rank),
                            place: Described::place(d),
                            dims,
                            strides,
                        },
                        place: place_key(d.memory_space.bit(), d.device_id),
                        rank,
                        byte_extent: info.byte_extent,
                    }
                })
                .collect();
            assert_eq!(contract.tensors.shapes(), &expected[..], "{ins:?} {outs:?}");
            let made: Vec<_> = contract
                .tensors
                .call_tensors()
                .iter()
                .map(|t| t.dims)
                .collect();
            let expected: Vec<_> = if calls {
                c_ins.iter().chain(&c_outs).map(|t| t.dims).collect()
            } else {
                Vec::new()
            };
            assert_eq!(made, expected, "{ins:?} {outs:?}");
            assert_eq!((contract.scratch, contract.scratch_mask), (scratch, 63));
        }
    }

    /// A shape made new for a contract is the shape a reshape sets in place, at every rank
    /// (and at a rank past the largest, which both clamp), whatever lies above the rank.
    #[test]
    fn a_new_shape_is_the_shape_set_in_place() {
        let info = desc(4).check().unwrap();
        for rank in 0..=MAX_TENSOR_RANK as u32 + 1 {
            let d = TensorDesc {
                rank,
                dims: std::array::from_fn(|i| i as u64 + 2),
                strides: std::array::from_fn(|i| i as u64 + 100),
                device_id: 3,
                memory_space: MemorySpace::Device,
                ..desc(4)
            };
            let mut set = Shape {
                rank: 5,
                byte_extent: 9,
                ..Shape::BLANK
            };
            set.set(&d, &info);
            assert_eq!(Shape::of(&d, &info), set, "rank {rank}");
            assert_eq!(set.byte_extent, info.byte_extent);
        }
    }

    /// The Rust face's lent descriptor must accept and refuse exactly what the whole
    /// descriptor does: every field a contract fixes is compared, entries above the rank and
    /// the data address are not.
    #[test]
    fn a_slice_descriptor_matches_exactly_when_its_tensor_desc_does() {
        let negotiated = TensorDesc::new(DType::F32, &[4, 2], MemorySpace::Host);
        let shape = Shape::of(&negotiated, &negotiated.check().unwrap());
        let with = |change: fn(&mut TensorDesc)| {
            let mut d = negotiated;
            change(&mut d);
            d
        };
        let cases = [
            (negotiated, true),
            (with(|d| d.dims[5] = 9), true),
            (with(|d| d.strides[6] = 3), true),
            (with(|d| d.data_addr = Some(64)), true),
            (with(|d| d.dims[0] = 5), false),
            (with(|d| d.dims[1] = 1), false),
            (with(|d| d.strides[1] = 8), false),
            (with(|d| d.rank = 3), false),
            (with(|d| d.dtype = DType::F16), false),
            (with(|d| d.memory_space = MemorySpace::Device), false),
            (with(|d| d.device_id = 1), false),
        ];
        for (d, expected) in cases {
            assert_eq!(d.matches(&shape), expected, "{d:?}");
            // A slice of its own element type, or of raw bytes, is checked as its descriptor;
            // one of another element type matches nothing, and unmarks to its descriptor.
            for element in [None, Some(d.dtype)] {
                let lent = Lent::new(&d, element);
                assert_eq!(lent.matches(&shape), expected, "{d:?}");
                assert_eq!(lent.element(), None);
            }
            let other = Lent::new(&d, Some(DType::I8));
            assert!(!other.matches(&shape), "{d:?}");
            assert_eq!(other.element(), Some(DType::I8));
            assert_eq!(other.unmarked().element(), None);
            assert_eq!(other.unmarked().matches(&shape), expected, "{d:?}");
            assert_eq!(other.dtype(), d.dtype);
            assert_eq!(
                other.desc(),
                TensorDesc {
                    data_addr: None,
                    ..d
                }
            );
        }
    }
}
