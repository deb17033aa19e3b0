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
use std::cell::{Cell, RefCell, UnsafeCell};
use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
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
    choose, resolve, Backend, CpuIsa, DType, MemorySpace, Negotiator, OpCandidate, OpQuery,
    ProviderRefusal, Reason, Rejection, ScratchRequest, SyncMode, TensorDesc, TensorInfo,
    TensorRef, TensorRole, MAX_TENSOR_RANK,
};
use guild_ports::device::{DeviceError, StreamEvents, StreamRef, WorkMark};
use guild_ports::provider::{ExecuteCall, KernelProvider, QueryCall};

use super::handles::{HandleTable, Running};
use super::{ExecuteError, ResolveError, Scratch};
use crate::registry::{KernelBinding, OperationCandidates, Snapshot, StoredOp};

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

/// What the host knows about the devices operations run on, and the adapter that keeps
/// stream-ordered calls safe.
#[derive(Clone)]
pub struct DeviceSupport {
    /// The host CPU's ISA bits, offered to CPU candidates.
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
    /// Never reused within the process; its low bits are part of every C handle's number.
    pub(crate) id: u64,
    snapshot: Arc<ArcSwap<Snapshot>>,
    pub(crate) devices: DeviceSupport,
    /// The table in-process runners use: a call on a handle that another call holds waits its
    /// turn. `user` is the address of the core's [`RunnerCell`].
    pub(crate) runner_table: guild_operation_service_v1_t,
    /// The table plugins get through their host table: a call on a busy handle is refused with
    /// `GUILD_STATUS_ERR_BUSY`, on any thread, so that providers calling each other's handles
    /// can never deadlock. `user` is the core's address with its lowest bit set.
    pub(crate) plugin_table: guild_operation_service_v1_t,
    closed: AtomicBool,
    /// The C handles resolved and not yet released.
    pub(crate) handles: HandleTable<super::c_service::CHandle>,
    /// Where the runner's table leads while the registry lives.
    cell: &'static RunnerCell,
}

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
    pub(crate) fn new(snapshot: Arc<ArcSwap<Snapshot>>, devices: DeviceSupport) -> Arc<Self> {
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
            let mut runner_table = super::c_service::table();
            runner_table.user = std::ptr::from_ref(cell).cast_mut().cast();
            let mut plugin_table = super::c_service::table();
            plugin_table.user = user.cast::<u8>().wrapping_add(1).cast();
            ServiceCore {
                id,
                snapshot,
                devices,
                runner_table,
                plugin_table,
                closed: AtomicBool::new(false),
                handles: HandleTable::new(id),
                cell,
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
    pub(crate) fn close(&self) -> Vec<Box<super::c_service::CHandle>> {
        self.closed.store(true, Ordering::Release);
        self.cell
            .core
            .store(std::ptr::null_mut(), Ordering::Release);
        self.handles.drain_idle()
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
        query: OpQuery,
        args: &Negotiation<'_>,
        report: bool,
    ) -> Result<Resolved, ResolveError> {
        let spec = query.spec();
        let needs_streams = spec.sync_mode != SyncMode::HostBlocking;
        if needs_streams && self.devices.streams.is_none() && spec.backends != Backend::Cpu.into() {
            return Err(no_device_adapter());
        }
        // Held (one reference count) while the providers negotiate, so that nothing is copied
        // per candidate; only the chosen one is bound.
        let snapshot = self.snapshot.load_full();
        static NONE: LazyLock<OperationCandidates> = LazyLock::new(OperationCandidates::default);
        // A candidate whose package a lifecycle change is draining counts as already gone.
        let entry = snapshot
            .operation(query.op_name())
            .map_or(Cow::Borrowed(&*NONE), OperationCandidates::bindable);
        let mut candidates = Cow::Borrowed(entry.contracts.as_slice());
        // An exact id registered for another operation takes part as a declaration only (the
        // domain skips other operations' candidates without calling them), so that the report
        // says what it implements instead.
        if let Some(exact) = &spec.exact_impl {
            if !candidates.iter().any(|c| &c.impl_id == exact) {
                if let Some(c) = snapshot
                    .by_id(exact)
                    .and_then(|s| s.kernel.operation.as_ref())
                {
                    if c.op_name != *query.op_name() {
                        candidates.to_mut().push(c.clone());
                    }
                }
            }
        }
        let chosen = if report {
            negotiate_reported(&entry, &query, args, &candidates)?
        } else {
            let negotiator = CNegotiator::new(&entry, &query, args, false);
            match choose(&query, &candidates, &negotiator) {
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
                    ..negotiate_reported(&entry, &query, args, &candidates)?
                },
            }
        };
        // The domain only chooses among the candidates it was given, in the same order, and an
        // appended declaration is never chosen (it names another operation).
        let (Some(stored), Some(candidate)) = (
            entry.stored.get(chosen.index),
            candidates.get(chosen.index).cloned(),
        ) else {
            return Err(ResolveError::Internal(
                "the chosen candidate has no provider",
            ));
        };
        let kernel = Arc::clone(&stored.kernel.provider);
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
        let data_alignment = candidate.min_alignment.max(1);
        let (spec, input_infos, output_infos) = query.into_parts();
        let host_only = spec
            .inputs
            .iter()
            .chain(&spec.outputs)
            .all(|t| t.memory_space == MemorySpace::Host);
        Ok(Resolved {
            kernel,
            binding,
            data_alignment,
            alignment_mask: data_alignment.is_power_of_two().then(|| data_alignment - 1),
            host_only,
            candidate,
            scratch: Scratch {
                host_bytes: chosen.scratch.host_bytes,
                device_bytes: chosen.scratch.device_bytes,
                alignment: chosen.alignment,
            },
            input_shapes: spec.inputs.iter().map(Shape::of).collect(),
            output_shapes: spec.outputs.iter().map(Shape::of).collect(),
            inputs: spec.inputs,
            outputs: spec.outputs,
            input_infos,
            output_infos,
            sync_mode: spec.sync_mode,
            device_id: spec.device.device_id,
            passed_over: chosen.passed_over,
            streams,
            marks: UnsafeCell::new(Vec::new()),
            error: UnsafeCell::new(guild_error_info_t::new()),
        })
    }
}

/// What a resolution passes to the negotiation callbacks besides the query: the caller's
/// operation parameters and, from a C caller, its own tensor arrays (which describe the same
/// tensors as the query, and are handed on as they are rather than rebuilt).
pub(crate) struct Negotiation<'a> {
    pub(crate) params: &'a [u8],
    pub(crate) tensors: Option<[&'a [guild_tensor_desc_v1_t]; 2]>,
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
    query: &OpQuery,
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
    Ok(TensorDesc {
        dtype: DType::from_raw(t.dtype),
        rank: t.rank,
        dims: t.dims,
        strides: t.strides,
        memory_space,
        device_id: t.device_id,
        data_addr: (!t.data.is_null()).then_some(t.data as usize as u64),
    })
}

/// The pointer a descriptor's known address stands for (NULL when unknown). It is only ever
/// passed to negotiation callbacks, which may inspect the address but not the data.
fn address_ptr(desc: &TensorDesc) -> *mut c_void {
    desc.data_addr
        .and_then(|a| usize::try_from(a).ok())
        .map_or(std::ptr::null_mut(), |a| a as *mut c_void)
}

/// The providers' GOP1 negotiation, called with C structs built from the query's actual
/// tensors; the pointers inside them are valid for each call only.
struct CNegotiator<'p> {
    /// The operation's stored kernels, aligned with the contracts being ranked.
    stored: &'p [Arc<StoredOp>],
    op_name: &'p CStr,
    exact: Option<CString>,
    inputs: Cow<'p, [guild_tensor_desc_v1_t]>,
    outputs: Cow<'p, [guild_tensor_desc_v1_t]>,
    params: &'p [u8],
    /// Whether a refusal's message is kept (as text, for a report) or only its status.
    report: bool,
    /// The scratch alignment of the last scratch query that succeeded: the chosen candidate's,
    /// once negotiation has chosen (nothing is asked after the choice).
    last_alignment: Cell<u32>,
    /// One error record for every callback, cleared before each.
    error: RefCell<guild_error_info_t>,
}

impl<'p> CNegotiator<'p> {
    fn new(
        entry: &'p OperationCandidates,
        query: &OpQuery,
        args: &Negotiation<'p>,
        report: bool,
    ) -> Self {
        let spec = query.spec();
        let c = |d: &TensorDesc| c_tensor(d, address_ptr(d));
        let (inputs, outputs) = match args.tensors {
            Some([inputs, outputs]) => (Cow::Borrowed(inputs), Cow::Borrowed(outputs)),
            None => (
                Cow::Owned(spec.inputs.iter().map(c).collect()),
                Cow::Owned(spec.outputs.iter().map(c).collect()),
            ),
        };
        CNegotiator {
            stored: &entry.stored,
            op_name: &entry.c_name,
            // Ids are validated text without NUL bytes; an empty string is the harmless
            // fallback should that ever change.
            exact: spec
                .exact_impl
                .as_ref()
                .map(|id| CString::new(id.as_str()).unwrap_or_default()),
            inputs,
            outputs,
            params: args.params,
            report,
            last_alignment: Cell::new(0),
            error: RefCell::new(guild_error_info_t::new()),
        }
    }

    /// The error record, cleared for the next callback.
    fn fresh_error(&self) -> std::cell::RefMut<'_, guild_error_info_t> {
        let mut error = self.error.borrow_mut();
        error.status = GUILD_STATUS_OK;
        error.component[0] = 0;
        error.message[0] = 0;
        error
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

    /// Runs `call` with a C query built from `query` for candidate `candidate`; every pointer
    /// in it lives until `call` returns, which is what [`QueryCall`] vouches for.
    fn with_query<T>(
        &self,
        candidate: &OpCandidate,
        query: &OpQuery,
        call: impl FnOnce(QueryCall<'_>) -> T,
    ) -> T {
        let spec = query.spec();
        let caps = guild_device_caps_v1_t {
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
        };
        let c_query = guild_operation_query_v1_t {
            struct_size: size_of::<guild_operation_query_v1_t>() as u32,
            version: GUILD_OPERATION_QUERY_VERSION,
            op_name: self.op_name.as_ptr(),
            min_op_version: query.versions().min().raw(),
            max_op_version: query.versions().max().raw(),
            backends: spec.backends.bits(),
            sync_mode: spec.sync_mode.raw(),
            required_capabilities: spec.capabilities.bits(),
            required_numerics: spec.numerics.bits(),
            inputs: self.inputs.as_ptr(),
            input_count: self.inputs.len(),
            outputs: self.outputs.as_ptr(),
            output_count: self.outputs.len(),
            ram_budget: spec.ram_budget.get(),
            vram_budget: spec.vram_budget.get(),
            exact_impl_id: self.exact.as_ref().map_or(std::ptr::null(), |e| e.as_ptr()),
            device_caps: &caps,
            params: if self.params.is_empty() {
                std::ptr::null()
            } else {
                self.params.as_ptr().cast()
            },
            params_size: self.params.len(),
        };
        // SAFETY: every pointer in `c_query` leads into `self` (the exact id, the tensor
        // arrays), the snapshot entry `self` borrows (the name), `caps` or the caller's params,
        // all of which outlive `call`; the tensor
        // data addresses are only the query's known addresses, for inspection.
        call(unsafe { QueryCall::new(&c_query) })
    }
}

impl Negotiator for CNegotiator<'_> {
    fn validate(
        &self,
        index: usize,
        candidate: &OpCandidate,
        query: &OpQuery,
    ) -> Result<(), ProviderRefusal> {
        let provider = self.op(index)?;
        let mut error = self.fresh_error();
        // The provider's library stays loaded while the snapshot that `self.stored` borrows
        // from lives. It is a negotiation callback: it must not retain the query or reenter the
        // registry, which is not locked here.
        let status = self.with_query(candidate, query, |q| provider.validate(q, &mut error));
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(self.refusal(status, &error))
        }
    }

    fn query_scratch(
        &self,
        index: usize,
        candidate: &OpCandidate,
        query: &OpQuery,
    ) -> Result<ScratchRequest, ProviderRefusal> {
        let provider = self.op(index)?;
        let mut error = self.fresh_error();
        let mut scratch = guild_scratch_request_v1_t {
            struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
            alignment: 0,
            host_bytes: 0,
            device_bytes: 0,
        };
        let status = self.with_query(candidate, query, |q| {
            provider.query_scratch(q, &mut scratch, &mut error)
        });
        if status != GUILD_STATUS_OK {
            return Err(self.refusal(status, &error));
        }
        if scratch.alignment > 1 && !scratch.alignment.is_power_of_two() {
            return Err(ProviderRefusal::new(
                GUILD_STATUS_ERR_INVALID_ARGUMENT,
                format!(
                    "the provider asked for a scratch alignment of {}, not a power of two",
                    scratch.alignment
                ),
            ));
        }
        self.last_alignment.set(scratch.alignment);
        Ok(ScratchRequest {
            host_bytes: scratch.host_bytes,
            device_bytes: scratch.device_bytes,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// A resolved operation
// ---------------------------------------------------------------------------------------------

/// One negotiated contract with one provider: what both faces' handles hold.
pub(crate) struct Resolved {
    pub(crate) binding: KernelBinding,
    /// The chosen kernel's provider; its code stays loaded while `binding` lives.
    pub(crate) kernel: Arc<dyn KernelProvider>,
    pub(crate) candidate: OpCandidate,
    pub(crate) scratch: Scratch,
    pub(crate) inputs: Vec<TensorDesc>,
    pub(crate) outputs: Vec<TensorDesc>,
    pub(crate) input_infos: Vec<TensorInfo>,
    pub(crate) output_infos: Vec<TensorInfo>,
    /// The negotiated tensors in the form calls are compared with.
    input_shapes: Vec<Shape>,
    output_shapes: Vec<Shape>,
    /// The provider's required data alignment in bytes (at least 1).
    data_alignment: u64,
    /// `data_alignment - 1` when it is a power of two, which it nearly always is.
    alignment_mask: Option<u64>,
    /// Whether every negotiated tensor is in pageable host memory, the only memory a Rust
    /// slice can vouch for.
    pub(crate) host_only: bool,
    pub(crate) sync_mode: SyncMode,
    pub(crate) device_id: i32,
    /// Every other candidate of the operation and why it was not chosen, when the resolution
    /// was asked for that report.
    pub(crate) passed_over: Option<Vec<PassedOver>>,
    streams: Option<Arc<dyn StreamEvents>>,
    /// The newest work mark per stream, for release to wait on. Touched only by the call that
    /// holds the handle's execute exclusivity, or through `&mut self`.
    marks: UnsafeCell<Vec<Box<dyn WorkMark>>>,
    /// The error record the Rust face lends providers, reused call after call. Touched only
    /// under the same exclusivity.
    pub(crate) error: UnsafeCell<guild_error_info_t>,
}

// SAFETY: the cells are only touched by the one thread holding the handle's execute
// exclusivity (a `Running` of the handle's gate, see `Resolved::execute`) or through `&mut
// self`; everything else is immutable after resolution or Send + Sync itself.
unsafe impl Sync for Resolved {}

/// One call's arguments in C form: the record the provider receives as it is (the C face passes
/// its caller's, the Rust face builds one), and its tensor arrays as slices. The pointers are the
/// caller's and are checked by [`Resolved::execute`] before the provider sees them.
pub(crate) struct Call<'a> {
    pub(crate) args: &'a guild_execute_args_v1_t,
    pub(crate) inputs: &'a [guild_tensor_desc_v1_t],
    pub(crate) outputs: &'a [guild_tensor_desc_v1_t],
}

impl Resolved {
    /// Checks one call against the negotiated contract and runs the provider. `error`
    /// receives the provider's own report when it fails. `shapes_checked` says that the
    /// caller built the tensors from the negotiated descriptors (the Rust face), so only their
    /// data addresses are new.
    ///
    /// # Safety
    /// `running` must be the execute exclusivity of the gate of the handle that owns `self`
    /// (the C slot's, or the Rust handle's own), so that no other call touches the handle's
    /// cells; `error` must not be one of those cells unless the caller holds `running` for it.
    pub(crate) unsafe fn execute(
        &self,
        running: &Running<'_>,
        call: &Call<'_>,
        shapes_checked: bool,
        error: &mut guild_error_info_t,
    ) -> Result<(), ExecuteError> {
        let _ = running;
        self.check_tensors(
            TensorRole::Input,
            &self.input_shapes,
            call.inputs,
            shapes_checked,
        )?;
        self.check_tensors(
            TensorRole::Output,
            &self.output_shapes,
            call.outputs,
            shapes_checked,
        )?;
        let got = SyncMode::from_raw(call.args.sync_mode);
        if got != Some(self.sync_mode) {
            return Err(ExecuteError::SyncMode {
                resolved: self.sync_mode,
                got: call.args.sync_mode,
            });
        }
        if call.args.device_id != self.device_id {
            return Err(ExecuteError::Device {
                resolved: self.device_id,
                got: call.args.device_id,
            });
        }
        if self.candidate.backend == Backend::Cpu && !call.args.stream.is_null() {
            return Err(ExecuteError::StreamOnCpu);
        }
        check_scratch(
            "host",
            self.scratch.host_bytes,
            self.scratch.alignment,
            call.args.scratch_host,
            call.args.scratch_host_size,
        )?;
        check_scratch(
            "device",
            self.scratch.device_bytes,
            self.scratch.alignment,
            call.args.scratch_device,
            call.args.scratch_device_size,
        )?;
        // SAFETY: `call.args` is the record the checks above read, and its arrays are
        // `call.inputs` and `call.outputs`. Every tensor was checked against the negotiated
        // contract (shape, strides, dtype, memory space, device, non-NULL and aligned data);
        // the caller of this function guarantees that each data pointer and the scratch buffers
        // address live memory of the checked extents for the call (the Rust face through its
        // borrows, the C face by the service's contract). `running` makes this the handle's
        // only call in progress.
        let checked = unsafe { ExecuteCall::new(call.args) };
        // The provider's library stays loaded while `self.binding` lives.
        let status = self.kernel.execute(checked, error);
        if let Some(streams) = &self.streams {
            // SAFETY: `running` gives this call the handle's cells to itself (the contract).
            let marks = unsafe { &mut *self.marks.get() };
            // Record even after a failure: part of the work may already be enqueued.
            let stream = StreamRef(call.args.stream as usize);
            match streams.record(call.args.device_id, stream) {
                Ok(Some(mark)) => {
                    marks.retain(|m| m.stream() != stream);
                    marks.push(mark);
                }
                Ok(None) => {}
                Err(e) if status == GUILD_STATUS_OK => return Err(ExecuteError::Stream(e)),
                Err(_) => {}
            }
        }
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(ExecuteError::Provider(ProviderRefusal::new(
                status,
                error_text(error),
            )))
        }
    }

    /// Checks the caller's tensors against the negotiated ones: the same shape, strides,
    /// dtype, memory space and device (unless `shapes_checked`), and data present and aligned
    /// as the contract requires. Everything else the contract says was checked once, at
    /// resolution, against these very shapes; only the data pointers are new.
    #[inline(always)]
    fn check_tensors(
        &self,
        role: TensorRole,
        negotiated: &[Shape],
        given: &[guild_tensor_desc_v1_t],
        shapes_checked: bool,
    ) -> Result<(), ExecuteError> {
        if given.len() != negotiated.len() {
            return Err(ExecuteError::Arity {
                role,
                expected: negotiated.len(),
                got: given.len(),
            });
        }
        for (index, (t, expected)) in given.iter().zip(negotiated).enumerate() {
            if !shapes_checked && !expected.matches(t) {
                return Err(self.mismatch(TensorRef { role, index }, t));
            }
            let address = t.data as usize as u64;
            let aligned = match self.alignment_mask {
                Some(mask) => address & mask == 0,
                None => address.is_multiple_of(self.data_alignment),
            };
            if address == 0 || !aligned {
                return Err(self.bad_address(TensorRef { role, index }, address));
            }
        }
        Ok(())
    }

    /// The error for a NULL or misaligned data address.
    #[cold]
    fn bad_address(&self, tensor: TensorRef, address: u64) -> ExecuteError {
        if address == 0 {
            return ExecuteError::NullData { tensor };
        }
        ExecuteError::Contract {
            rejection: Rejection::Misaligned {
                tensor,
                address,
                required: self.data_alignment,
            },
        }
    }

    /// The error for a caller's tensor that is not the negotiated one.
    #[cold]
    fn mismatch(&self, tensor: TensorRef, t: &guild_tensor_desc_v1_t) -> ExecuteError {
        let list = match tensor.role {
            TensorRole::Input => &self.inputs,
            TensorRole::Output => &self.outputs,
        };
        let Some(expected) = list.get(tensor.index) else {
            return ExecuteError::Arity {
                role: tensor.role,
                expected: list.len(),
                got: tensor.index,
            };
        };
        let actual = tensor_from_c(t).unwrap_or(TensorDesc {
            memory_space: expected.memory_space,
            ..*expected
        });
        ExecuteError::DescriptorMismatch {
            tensor,
            expected: Box::new(*expected),
            actual: Box::new(TensorDesc {
                data_addr: None,
                ..actual
            }),
        }
    }

    /// Waits for the stream work this handle recorded; afterwards nothing recorded is pending.
    /// The first device error is reported, after every mark has been waited for.
    pub(crate) fn finish(&mut self) -> Result<(), DeviceError> {
        let marks = std::mem::take(self.marks.get_mut());
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

/// A negotiated tensor as calls must repeat it: every field of the C descriptor but the data
/// pointer, with dims and strides at and above the rank zeroed (callers' entries there are
/// ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    dtype: u32,
    rank: u32,
    memory_space: u32,
    device_id: i32,
    dims: [u64; MAX_TENSOR_RANK],
    strides: [u64; MAX_TENSOR_RANK],
}

impl Shape {
    fn of(d: &TensorDesc) -> Shape {
        let rank = d.shape().len();
        let mut dims = [0; MAX_TENSOR_RANK];
        let mut strides = [0; MAX_TENSOR_RANK];
        dims[..rank].copy_from_slice(&d.dims[..rank]);
        strides[..rank].copy_from_slice(&d.strides[..rank]);
        Shape {
            dtype: d.dtype.raw(),
            rank: d.rank,
            memory_space: d.memory_space.bit(),
            device_id: d.device_id,
            dims,
            strides,
        }
    }

    /// Whether `t` is this tensor apart from its data pointer.
    #[inline(always)]
    fn matches(&self, t: &guild_tensor_desc_v1_t) -> bool {
        if t.dtype != self.dtype
            || t.rank != self.rank
            || t.memory_space != self.memory_space
            || t.device_id != self.device_id
        {
            return false;
        }
        // The rank was validated at resolution (1..=8) and `t.rank` equals it.
        let rank = (self.rank as usize).min(MAX_TENSOR_RANK);
        let mut same = true;
        for i in 0..rank {
            same &= t.dims[i] == self.dims[i] && t.strides[i] == self.strides[i];
        }
        same
    }
}

/// The text a callback left in an error record, up to its first NUL.
fn error_text(error: &guild_error_info_t) -> String {
    fixed_buffer_text(&error.message)
}

fn check_scratch(
    kind: &'static str,
    needed: u64,
    alignment: u32,
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
    let align = usize::try_from(alignment).unwrap_or(usize::MAX);
    if align > 1 && !(ptr as usize).is_multiple_of(align) {
        return Err(ExecuteError::ScratchMisaligned {
            kind,
            address: ptr as usize,
            alignment,
        });
    }
    Ok(())
}
