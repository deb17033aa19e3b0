//! The operation service: runners (and modules, from inside their `execute`) ask for a
//! namespaced operation with their actual tensors and get a handle that runs one negotiated
//! contract.
//!
//! There is one implementation (the private `core` module) with two faces:
//! - the C table `guild_operation_service_v1_t` ([`c_service`]), which every plugin receives
//!   through the optional tail of its host table and in-process runners get from
//!   [`KernelRegistry::operation_api`](crate::registry::KernelRegistry::operation_api);
//! - the safe Rust API here: an [`OperationRequest`] resolved by an [`OperationService`] into an
//!   [`OpHandle`], with `describe`, `scratch`, `execute` (host-blocking, on borrowed slices),
//!   `execute_on_stream` (any sync mode, on [`DeviceTensor`]s the caller vouches for), and
//!   release on drop.
//!
//! Resolution takes the GOP1 candidates of the operation from the kernel registry's snapshot,
//! where they are already in rank order, and walks them best first with
//! [`guild_domain::operation::choose`], negotiating through each statically compatible
//! candidate's `validate` and `query_scratch` (the loader port's `KernelProvider`) with the
//! actual tensors until one accepts; nothing is allocated for a candidate that refuses, and no
//! refusal's text is kept. A [reporting](OperationService::reporting) service ranks with
//! [`guild_domain::operation::resolve`] instead, which keeps every candidate's verdict, and a
//! failed resolution is walked again that way, so that it carries the domain's report of every
//! candidate and why it lost. A handle owns a [`KernelBinding`], so the provider's library
//! stays loaded (and its package can be neither disabled, replaced, rolled back nor removed)
//! until the handle is released.
//!
//! `execute` checks every argument against the negotiated contract (shape, strides, dtype,
//! memory space, device, data alignment, scratch, sync mode) before it calls the provider, and
//! never reselects. Each handle serialises its own calls; handles are `Send + Sync`, so
//! independent handles run concurrently and one handle can be shared. The Rust handle borrows
//! the registry (`OpHandle<'r>`), which makes "handles are released before their registry goes"
//! a compile-time fact.
//!
//! The `unsafe` of this module is the C face's `extern "C"` entry points, the handle table and
//! the records handed to providers (whose C calls the loader's adapter makes); no entry point
//! lets a Rust panic cross into C. `models`, `experts` and `cuda_tables` are the app's other
//! modules allowed `unsafe`.
//!
//! # Examples
//!
//! Resolve the inclusive scan for eight `f32` values on the CPU and run it:
//!
//! ```no_run
//! use guild_host::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let OpenedHost { host, .. } = Host::builder("/var/lib/guild").open()?;
//! let service = OperationService::new(host.kernels());
//!
//! // Describe the tensors exactly as they will be passed: dtype, shape (innermost axis first),
//! // memory space. The providers negotiate against these.
//! let desc = TensorDesc::new(DType::F32, &[8], MemorySpace::Host);
//! let request = OperationRequest::cpu(
//!     OpName::new("example.sequence.inclusive_scan")?,
//!     vec![desc],
//!     vec![desc],
//! );
//! let handle = service.resolve(&request)?;
//! let chosen = handle.describe();
//! println!("{} from {} {}", chosen.impl_id, chosen.package, chosen.package_version);
//!
//! // The caller owns scratch; this provider asks for none.
//! assert_eq!(handle.scratch().host_bytes, 0);
//! let input = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
//! let mut output = [0.0f32; 8];
//! handle.execute(
//!     &[TensorArg::new(&desc, &input)],
//!     &mut [TensorArgMut::new(&desc, &mut output)],
//!     None,
//! )?;
//! assert_eq!(output[7], 36.0);
//!
//! // Releasing lets the provider's package be disabled or replaced again.
//! handle.release()?;
//! # Ok(())
//! # }
//! ```

mod block;
pub mod c_service;
pub(crate) mod core;
mod handles;
mod inline;

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;

use guild_abi::guild_stream_t;
use guild_domain::ids::{ImplId, OpName, PackageId};
use guild_domain::operation::{
    Backend, Budget, Capabilities, CpuIsa, DType, DeviceCaps, MemorySpace, Numerics, OpQuery,
    ProviderRefusal, QueryError, QuerySpec, Rejection, ResolveFailure, SyncMode, TensorDesc,
    TensorRef, TensorRole,
};
use guild_domain::version::{PackedVersion, Version};
use guild_ports::device::{DeviceError, StreamRef};

use self::core::ServiceCore;
use self::core::{Buffer, BufferArg, Lent, NegotiatedTensors, Negotiation, Resolved};
pub use self::core::{DeviceSupport, PassReason, PassedOver};
use self::handles::Refused;
use crate::snapshot::KernelBinding;

// ---------------------------------------------------------------------------------------------
// The request
// ---------------------------------------------------------------------------------------------

/// What a runner asks the service for: the domain's [`QuerySpec`] (the operation and its
/// version interval, backends, required capabilities and numerics, sync mode, the actual
/// tensors, budgets, an exact impl id, the device), whose fields it reads and writes through
/// `Deref`, with the constructor and builder methods below.
///
/// Host-blocking requests run on borrowed slices through [`OpHandle::execute`]; stream-ordered
/// and graph-capturable ones run on device buffers through [`OpHandle::execute_on_stream`], and
/// need a device adapter ([`DeviceSupport::streams`]) unless a CPU provider is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationRequest(QuerySpec);

impl std::ops::Deref for OperationRequest {
    type Target = QuerySpec;
    fn deref(&self) -> &QuerySpec {
        &self.0
    }
}

impl std::ops::DerefMut for OperationRequest {
    fn deref_mut(&mut self) -> &mut QuerySpec {
        &mut self.0
    }
}

impl From<QuerySpec> for OperationRequest {
    fn from(spec: QuerySpec) -> Self {
        OperationRequest(spec)
    }
}

impl OperationRequest {
    /// A host-blocking CPU request for any 1.x version of `op_name`, with no required
    /// capabilities or numerics, unlimited budgets, on this host's CPU (its ISA detected).
    pub fn cpu(op_name: OpName, inputs: Vec<TensorDesc>, outputs: Vec<TensorDesc>) -> Self {
        OperationRequest(QuerySpec {
            op_name,
            min_version: PackedVersion::from_raw(0x0100_0000),
            max_version: PackedVersion::from_raw(0x01ff_ffff),
            backends: Backend::Cpu.into(),
            capabilities: Capabilities::EMPTY,
            numerics: Numerics::EMPTY,
            sync_mode: SyncMode::HostBlocking,
            inputs,
            outputs,
            ram_budget: Budget::UNLIMITED,
            vram_budget: Budget::UNLIMITED,
            exact_impl: None,
            device: DeviceCaps {
                device_id: 0,
                cuda_sm: None,
                cpu_isa: crate::platform::cpu_isa(),
            },
        })
    }

    /// Restricts the operation versions to `min..=max`.
    pub fn versions(mut self, min: PackedVersion, max: PackedVersion) -> Self {
        self.min_version = min;
        self.max_version = max;
        self
    }

    /// Requires capability bits.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Requires numerics bits.
    pub fn numerics(mut self, numerics: Numerics) -> Self {
        self.numerics = numerics;
        self
    }

    /// Bounds host scratch.
    pub fn ram_budget(mut self, budget: Budget) -> Self {
        self.ram_budget = budget;
        self
    }

    /// Names the only implementation that may be chosen.
    pub fn exact(mut self, impl_id: ImplId) -> Self {
        self.exact_impl = Some(impl_id);
        self
    }

    /// The domain form.
    pub fn to_spec(&self) -> QuerySpec {
        self.0.clone()
    }
}

/// Why [`OperationService::resolve`] returned no handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The request is invalid whatever providers exist.
    #[error("invalid operation request: {0}")]
    Query(QueryError),
    /// No candidate was chosen; the report lists every candidate and why it was rejected.
    #[error("{0}")]
    Unresolved(ResolveFailure),
    /// The request needs something this host cannot do, such as stream-ordered work on a
    /// device without a device adapter to track it.
    #[error("unsupported operation request: {0}")]
    Unsupported(&'static str),
    /// A broken invariant of the resolver; never expected.
    #[error("internal error while resolving: {0}")]
    Internal(&'static str),
}

impl ResolveError {
    /// The domain's failure report, when that is what this is.
    pub fn failure(&self) -> Option<&ResolveFailure> {
        match self {
            ResolveError::Unresolved(f) => Some(f),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The service
// ---------------------------------------------------------------------------------------------

/// The operation service over one kernel registry.
#[derive(Debug, Clone, Copy)]
pub struct OperationService<'r> {
    /// The registry's core; `OperationService::new` (beside the registry, which owns the core)
    /// borrows it from the registry for `'r`.
    core: &'r ServiceCore,
    report: bool,
}

impl<'r> OperationService<'r> {
    /// The service over a registry's core, for as long as the registry is borrowed.
    pub(crate) fn over(core: &'r ServiceCore) -> Self {
        OperationService {
            core,
            report: false,
        }
    }

    /// The same service, with handles that keep why every other candidate was passed over
    /// ([`OpHandle::passed_over`]): for tools that explain a choice. A runner that only
    /// executes leaves it off, since the report costs an entry per candidate and the text of
    /// each provider's refusal. A failed resolution explains itself either way.
    pub fn reporting(self) -> Self {
        OperationService {
            report: true,
            ..self
        }
    }

    /// Resolves `request` to a handle: the best provider (highest priority, then smallest impl
    /// id) whose GOP1 contract admits the request and whose `validate` and `query_scratch`
    /// accept its tensors within the budgets. The handle binds that provider until it is
    /// dropped or released.
    ///
    /// A stream-ordered or graph-capturable request that may run on a device is
    /// [`ResolveError::Unsupported`] when the host has no device adapter to track the work
    /// (exactly as through the C table). See the [module documentation](self) for an example.
    pub fn resolve(&self, request: &OperationRequest) -> Result<OpHandle<'r>, ResolveError> {
        self.resolve_with_params(request, &[])
    }

    /// Resolves `request`, passing `params` (the operation's parameter record, laid out as its
    /// contract defines) to the providers' negotiation callbacks.
    ///
    /// The parameters are used for negotiation only; each execute carries its own, through
    /// [`OpHandle::execute_with_params`].
    pub fn resolve_with_params(
        &self,
        request: &OperationRequest,
        params: &[u8],
    ) -> Result<OpHandle<'r>, ResolveError> {
        // The core refuses stream work it could not track (no device adapter), for both faces.
        let query = OpQuery::new(&request.0).map_err(ResolveError::Query)?;
        // The query's tensors in C form, made once, in the block the handle's contract will be
        // made in: the negotiation callbacks see them (with the addresses the request knows),
        // then they are the handle's calls' tensors.
        let params = AlignedParams::new(params);
        let args = Negotiation {
            params: params.bytes(),
            tensors: NegotiatedTensors::Kept(self::core::call_block(
                query.spec().inputs,
                query.spec().outputs,
                query.tensor_infos(),
            )),
        };
        let resolved = self.core.resolve(&query, args, self.report)?;
        Ok(OpHandle {
            resolved,
            _registry: PhantomData,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The handle
// ---------------------------------------------------------------------------------------------

/// The scratch a handle's provider negotiated: the caller allocates it and keeps it; the
/// provider never frees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scratch {
    /// Bytes of host scratch each execute needs.
    pub host_bytes: u64,
    /// Bytes of device scratch each execute needs.
    pub device_bytes: u64,
    /// Required alignment of the scratch buffers in bytes (0 or 1: none).
    pub alignment: u32,
}

/// What a handle resolved to, borrowed for the handle's lifetime.
#[derive(Debug, Clone, Copy)]
pub struct OpDescription<'h> {
    /// The chosen implementation.
    pub impl_id: &'h ImplId,
    /// The package that provides it.
    pub package: &'h PackageId,
    /// That package's version.
    pub package_version: &'h Version,
    /// The operation.
    pub op_name: &'h OpName,
    /// The operation version the implementation declares (within the requested interval).
    pub op_version: PackedVersion,
    /// The backend it runs on.
    pub backend: Backend,
    /// Its registered priority.
    pub priority: i32,
    /// The sync mode every call on the handle uses.
    pub sync_mode: SyncMode,
    /// The scratch each execute needs.
    pub scratch: Scratch,
}

/// Describes a resolved operation with the scratch its face reports; shared by both faces.
fn describe(r: &Resolved, scratch: Scratch) -> OpDescription<'_> {
    OpDescription {
        impl_id: &r.candidate().impl_id,
        package: r.binding.package(),
        package_version: r.binding.version(),
        op_name: &r.candidate().op_name,
        op_version: r.candidate().op_version,
        backend: r.candidate().backend,
        priority: r.candidate().priority,
        sync_mode: r.sync_mode,
        scratch,
    }
}

/// A resolved operation: one negotiated contract with one provider, kept loaded by the
/// [`KernelBinding`] the handle owns. Dropping it waits for the stream work its calls recorded
/// (on the CPU there is none: every execute has returned), then releases the binding.
pub struct OpHandle<'r> {
    /// Boxed: the handle moves as a pointer. Its calls are serialised by the gate it holds
    /// ([`Resolved::rust_gate`](self::core::Resolved::rust_gate); the C face keeps the same
    /// gate in the handle's slot), alone in lines of the handle's own, so that handles side by
    /// side (in a `Vec`, on one stack) executing on different threads do not write one cache
    /// line.
    resolved: Box<Resolved>,
    _registry: PhantomData<&'r ServiceCore>,
}

impl fmt::Debug for OpHandle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpHandle")
            .field("impl_id", &self.resolved.candidate().impl_id)
            .field("package", self.resolved.binding.package())
            .field("scratch", &self.scratch())
            .finish_non_exhaustive()
    }
}

impl OpHandle<'_> {
    /// The contract as last negotiated.
    fn contract(&self) -> &self::core::Contract {
        // SAFETY: a Rust handle's contract changes only in `reshape`, which takes `&mut self`.
        unsafe { self.resolved.contract() }
    }

    /// What was resolved.
    pub fn describe(&self) -> OpDescription<'_> {
        describe(&self.resolved, self.scratch())
    }

    /// The scratch each execute needs (as last negotiated: a reshape may change it).
    pub fn scratch(&self) -> Scratch {
        self.contract().scratch
    }

    /// The negotiated input descriptors (as last negotiated: a reshape may change them).
    pub fn inputs(&self) -> &[TensorDesc] {
        self.contract().inputs()
    }

    /// The negotiated output descriptors (as last negotiated: a reshape may change them).
    pub fn outputs(&self) -> &[TensorDesc] {
        self.contract().outputs()
    }

    /// Negotiates new shapes for the handle's tensors with the provider it already has: the
    /// same operation on a longer sequence, a KV cache one entry longer, a batch of another
    /// size. Only rank, dims and strides may change; each tensor keeps its dtype, memory space
    /// and device, and the handle its number of inputs and outputs.
    ///
    /// The new tensors must pass the provider's contract (its declared ranks, extents, layouts
    /// and alignment), its `validate` and its `query_scratch` within the request's budgets,
    /// exactly as at resolution, but no other provider is asked and none is ranked: a reshape
    /// never changes the provider. On success every later execute must pass the new
    /// descriptors ([`OpHandle::inputs`], [`OpHandle::outputs`]), and [`OpHandle::scratch`]
    /// reports the scratch they need; executing with the old ones is refused. On failure
    /// nothing changed: the handle still runs with the shapes it had.
    ///
    /// It takes `&mut self`, so no execute of the handle can be running (a shared handle is
    /// reshaped by whoever owns it). Stream work already enqueued keeps its own arguments.
    ///
    /// A decode loop whose KV cache grows by one each token:
    ///
    /// ```no_run
    /// # use guild_host::prelude::*;
    /// # fn step(handle: &mut OpHandle<'_>, q: TensorDesc, out: TensorDesc, len: u64)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let kv = TensorDesc::new(DType::F32, &[64, len], MemorySpace::Host);
    /// handle.reshape(&[q, kv], &[out])?;
    /// let mut scratch = vec![0u8; handle.scratch().host_bytes as usize];
    /// // ... execute with `kv` as the second input ...
    /// # Ok(())
    /// # }
    /// ```
    pub fn reshape(
        &mut self,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<(), ReshapeError> {
        self.reshape_with_params(inputs, outputs, &[])
    }

    /// As [`OpHandle::reshape`], passing `params` (the operation's parameter record) to the
    /// provider's `validate` and `query_scratch`, as [`OperationService::resolve_with_params`]
    /// does.
    pub fn reshape_with_params(
        &mut self,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &[u8],
    ) -> Result<(), ReshapeError> {
        let params = AlignedParams::new(params);
        // SAFETY: `&mut self`: no other call of this handle runs.
        unsafe { self.resolved.renegotiate(inputs, outputs, params.bytes()) }?;
        self.resolved.install_mut();
        Ok(())
    }

    /// Every other candidate of the operation and why it was not chosen (rejected, or
    /// outranked by this one, in which case its callbacks were not called); `None` unless the
    /// handle came from a [reporting](OperationService::reporting) service.
    pub fn passed_over(&self) -> Option<&[PassedOver]> {
        self.resolved.passed_over.as_deref()
    }

    /// The binding that keeps the provider loaded.
    pub fn binding(&self) -> &KernelBinding {
        &self.resolved.binding
    }

    /// Whether the provider is still the current one ([`KernelBinding::is_current`]): `false`
    /// once a newer committed generation replaced or took out its package, or waits for this
    /// handle (and the others into it) to be released to do so. Resolve again to follow.
    pub fn is_current(&self) -> bool {
        self.resolved.binding.is_current()
    }

    /// Releases the handle, reporting a device error seen while waiting for its recorded
    /// stream work (dropping it waits the same way but cannot report).
    pub fn release(mut self) -> Result<(), DeviceError> {
        self.resolved.finish()
    }

    /// Executes the negotiated contract on `inputs` and `outputs` with `scratch`, blocking
    /// until the provider returns. Every argument is checked against the negotiated contract
    /// first; a mismatch is an error and the provider is not called. Calls on one handle are
    /// serialised; calls on different handles may run at once.
    ///
    /// The descriptors must be the ones last negotiated, at resolution or by the last
    /// [`reshape`](OpHandle::reshape) (the data address aside);
    /// `scratch` must hold at least [`Scratch::host_bytes`] at [`Scratch::alignment`], or be
    /// `None` when none is needed. A provider that calls back into the handle it is running on
    /// gets [`ExecuteError::Reentrant`] rather than a deadlock. See the
    /// [module documentation](self) for an example.
    ///
    /// A handle resolved stream-ordered or graph-capturable on a device provider is refused
    /// with [`ExecuteError::SyncMode`]: its work may still run after the slices' borrows end.
    /// Use [`OpHandle::execute_on_stream`] for it.
    #[inline]
    pub fn execute(
        &self,
        inputs: &[TensorArg<'_>],
        outputs: &mut [TensorArgMut<'_>],
        scratch: Option<&mut [u8]>,
    ) -> Result<(), ExecuteError> {
        self.execute_with_params(inputs, outputs, scratch, &[])
    }

    /// As [`OpHandle::execute`], passing `params` (the operation's parameter record, laid out
    /// as its contract defines for the negotiated version) to the provider for this call.
    pub fn execute_with_params(
        &self,
        inputs: &[TensorArg<'_>],
        outputs: &mut [TensorArgMut<'_>],
        scratch: Option<&mut [u8]>,
        params: &[u8],
    ) -> Result<(), ExecuteError> {
        let r = &self.resolved;
        if !r.plain {
            return Err(not_plain(self));
        }
        // Every data pointer addresses a live Rust buffer of at least the tensor's byte extent
        // (checked in `run`), borrowed for this call by the arguments.
        self.run(inputs, outputs, scratch, None, std::ptr::null_mut(), params)
    }

    /// Enqueues the negotiated contract on `stream` (the address its `guild_stream_t` holds;
    /// `StreamRef(0)` is the device's default stream) over device buffers, in the sync mode the
    /// handle was resolved for, and returns once the provider has returned: for a
    /// stream-ordered or graph-capturable handle, that is when the work is enqueued, not done.
    ///
    /// Every tensor is checked against the negotiated descriptor and its byte extent (as
    /// [`OpHandle::execute`] checks slices), then the core checks data presence and alignment,
    /// sync mode, device, scratch and that a CPU provider is given no stream; a mismatch is an
    /// error and the provider is not called. After the provider returns, the end of the
    /// stream's work is recorded through the host's device adapter, and
    /// [`OpHandle::release`] (or dropping the handle) waits for it. `scratch_host` must hold at
    /// least [`Scratch::host_bytes`] and `scratch_device` [`Scratch::device_bytes`], at
    /// [`Scratch::alignment`], or be `None` when none is needed; `params` is the operation's
    /// parameter record for this call (empty: none).
    ///
    /// Host-blocking handles on borrowed host buffers are better served by
    /// [`OpHandle::execute`], which needs no `unsafe`.
    ///
    /// # Safety
    ///
    /// Every tensor's and the device scratch's memory must be valid for the provider's accesses
    /// (inputs read, outputs written, in the tensor's memory space and device) from this call
    /// until the work completes: until the handle is released or dropped, or the caller has
    /// synchronised `stream`. Outputs must not overlap other tensors unless the operation's
    /// contract allows it, and nothing else may access them while the work runs. `stream` must
    /// be a stream of the handle's device that stays valid until the work completes, and
    /// `scratch_host`, borrowed for this call only, must not be read by the work after the
    /// provider returns (host scratch is for the provider's own call).
    pub unsafe fn execute_on_stream(
        &self,
        stream: StreamRef,
        inputs: &[DeviceTensor],
        outputs: &[DeviceTensor],
        scratch_host: Option<&mut [u8]>,
        scratch_device: Option<DeviceScratch>,
        params: &[u8],
    ) -> Result<(), ExecuteError> {
        let device_scratch = Some(match scratch_device {
            Some(d) => (d.ptr, d.bytes),
            None => (std::ptr::null_mut(), 0),
        });
        // The data pointers are checked against the negotiated descriptors and byte extents in
        // `run`; that they address live memory of those extents until the work completes, and
        // that the stream is valid, is this function's safety contract. The host scratch is
        // borrowed for the call.
        self.run(
            inputs,
            outputs,
            scratch_host,
            device_scratch,
            stream.0 as guild_stream_t,
            params,
        )
    }

    /// What both execute paths share: the handle taken, each buffer checked against its
    /// negotiated tensor and its data pointer written into the handle's C tensors, the call
    /// built, and the provider called. `scratch_device` is `None` on the path that cannot pass
    /// device scratch, which a provider needing some refuses. The caller vouches that the
    /// pointers address the memory they describe.
    #[inline(always)]
    fn run<I: Buffer, O: Buffer>(
        &self,
        inputs: &[I],
        outputs: &[O],
        scratch_host: Option<&mut [u8]>,
        scratch_device: Option<(*mut c_void, u64)>,
        stream: guild_stream_t,
        params: &[u8],
    ) -> Result<(), ExecuteError> {
        let r = &self.resolved;
        if !r.lacks_here.is_empty() {
            return Err(r.not_here());
        }
        if !stream.is_null() && !r.takes_stream {
            return Err(ExecuteError::StreamOnCpu);
        }
        let running = r.rust_gate().enter_run(0, true).map_err(|why| match why {
            Refused::Reentrant => ExecuteError::Reentrant,
            // A Rust handle is live for as long as it exists and its callers wait their turn.
            Refused::Stale | Refused::Busy | Refused::InUse(_) => ExecuteError::Reentrant,
        })?;
        // SAFETY: `running` is this Rust handle's own gate's exclusivity, held for the call.
        let mut call = unsafe { r.rust_call(&running) };
        call.fill(r, TensorRole::Input, inputs)?;
        call.fill(r, TensorRole::Output, outputs)?;
        let device_given = scratch_device.is_some();
        let (scratch_device, scratch_device_size) =
            scratch_device.unwrap_or((std::ptr::null_mut(), 0));
        // No slice, or an empty one, is NULL with size 0 (two conditional moves).
        let (scratch_host, scratch_len) = scratch_host.map_or((std::ptr::null_mut(), 0), |s| {
            (s.as_mut_ptr().cast::<c_void>(), s.len())
        });
        let scratch_host = if scratch_len == 0 {
            std::ptr::null_mut()
        } else {
            scratch_host
        };
        let scratch_host_size = u64::try_from(scratch_len).unwrap_or(u64::MAX);
        let needed = call.contract.scratch;
        // A contract without scratch (the common case) passes both checks with one test.
        if needed.host_bytes | needed.device_bytes != 0 {
            if !device_given && needed.device_bytes > 0 {
                return Err(ExecuteError::DeviceScratch {
                    needed: needed.device_bytes,
                });
            }
            call.contract.check_scratch(
                scratch_host,
                scratch_host_size,
                scratch_device,
                scratch_device_size,
            )?;
        }
        let cells = call.cells;
        let args = &mut cells.args;
        args.scratch_host = scratch_host;
        args.scratch_host_size = scratch_host_size;
        args.scratch_device = scratch_device;
        args.scratch_device_size = scratch_device_size;
        args.stream = stream;
        // Kept until the provider has returned: it may be the aligned copy.
        let params = AlignedParams::new(params);
        let params = params.bytes();
        args.params = if params.is_empty() {
            std::ptr::null()
        } else {
            params.as_ptr().cast()
        };
        args.params_size = params.len();
        let args = &cells.args;
        // The provider reports into the thread's record, of which only what a report is read
        // from is reset.
        self::core::with_fresh_error(|error| {
            // SAFETY: the record's tensors are the negotiated descriptors with data pointers
            // checked for their byte extent and alignment (`fill`), its scratch was checked,
            // its sync mode and device are the handle's own (set at resolution), and the
            // stream is the caller's to vouch for (as the memory is); `running` is held, and
            // the error record is the thread's, not one of the handle's cells.
            unsafe { r.call_provider(&running, args, error) }
        })
    }
}

/// A parameter record at the alignment every provider may assume
/// ([`c_service::PARAMS_ALIGNMENT`]): the caller's bytes where they already are (the usual
/// case: a `#[repr(C)]` record or a `Vec<u64>` seen as bytes), else a copy in 8-byte words. A
/// Rust caller's `&[u8]` says nothing of its alignment, so the Rust face aligns rather than
/// refuses; the C face refuses a misaligned record.
enum AlignedParams<'a> {
    Borrowed(&'a [u8]),
    Copied { words: Vec<u64>, len: usize },
}

impl<'a> AlignedParams<'a> {
    fn new(params: &'a [u8]) -> Self {
        if params.is_empty()
            || (params.as_ptr() as usize).is_multiple_of(c_service::PARAMS_ALIGNMENT)
        {
            return AlignedParams::Borrowed(params);
        }
        let mut words = vec![0u64; params.len().div_ceil(8)];
        for (word, chunk) in words.iter_mut().zip(params.chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            *word = u64::from_ne_bytes(bytes);
        }
        AlignedParams::Copied {
            words,
            len: params.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            AlignedParams::Borrowed(b) => b,
            AlignedParams::Copied { words, len } => {
                // SAFETY: `words` holds at least `len` initialised bytes (`len` rounded up to
                // whole words), any byte pattern is a valid u8, and the slice borrows `self`.
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len) }
            }
        }
    }
}

/// Why [`OpHandle::execute`] on slices cannot run the handle.
#[cold]
#[inline(never)]
fn not_plain(h: &OpHandle<'_>) -> ExecuteError {
    let r = &h.resolved;
    if r.sync_mode != SyncMode::HostBlocking && r.candidate().backend != Backend::Cpu {
        // The work could outlive the borrows of these slices; such handles run through
        // `execute_on_stream`, whose caller vouches for the buffers' lifetime.
        return ExecuteError::SyncMode {
            resolved: r.sync_mode,
            got: SyncMode::HostBlocking.raw(),
        };
    }
    // A slice is host memory; a provider told otherwise would hand it to a device.
    not_host_memory(h.inputs(), h.outputs())
}

/// The error for slices passed to a handle negotiated for memory a slice cannot stand for.
#[cold]
fn not_host_memory(inputs: &[TensorDesc], outputs: &[TensorDesc]) -> ExecuteError {
    let roles = [(TensorRole::Input, inputs), (TensorRole::Output, outputs)];
    for (role, tensors) in roles {
        if let Some((index, t)) = tensors
            .iter()
            .enumerate()
            .find(|(_, t)| t.memory_space != MemorySpace::Host)
        {
            return ExecuteError::NotHostMemory {
                tensor: TensorRef { role, index },
                space: t.memory_space,
            };
        }
    }
    ExecuteError::NotHostMemory {
        tensor: TensorRef {
            role: TensorRole::Input,
            index: 0,
        },
        space: MemorySpace::Device,
    }
}

/// Why an execute did not run or the provider failed. Every variant but
/// [`ExecuteError::Provider`] and [`ExecuteError::Stream`] is found before the provider is
/// called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecuteError {
    /// The call passes another number of inputs or outputs than was negotiated.
    #[error("{got} {role}s given, the negotiated contract has {expected}")]
    Arity {
        /// Inputs or outputs.
        role: TensorRole,
        /// How many the negotiated contract has.
        expected: usize,
        /// How many the call passed.
        got: usize,
    },
    /// A tensor's descriptor differs from the negotiated one (only the data address may change
    /// from call to call; a reshape negotiates new descriptors).
    #[error(
        "{tensor} does not match the negotiated descriptor: expected {expected}, got {actual}"
    )]
    DescriptorMismatch {
        /// Which tensor.
        tensor: TensorRef,
        /// The descriptor last negotiated (at resolution or by a reshape).
        expected: Box<TensorDesc>,
        /// The one the call passed.
        actual: Box<TensorDesc>,
    },
    /// A typed buffer's element type is not the tensor's dtype.
    #[error("{tensor} is {dtype} but its buffer holds {element} elements")]
    ElementType {
        /// Which tensor.
        tensor: TensorRef,
        /// The descriptor's dtype.
        dtype: DType,
        /// The buffer's element type.
        element: DType,
    },
    /// A buffer is shorter than the tensor's extent in bytes.
    #[error("{tensor} spans {needed} bytes but its buffer has {got}")]
    BufferTooSmall {
        /// Which tensor.
        tensor: TensorRef,
        /// The tensor's byte extent (strides included).
        needed: u64,
        /// The buffer's length in bytes.
        got: usize,
    },
    /// A tensor has no data (the C face, or a [`DeviceTensor`]; a borrowed slice always has an
    /// address).
    #[error("{tensor} has a NULL data pointer")]
    NullData {
        /// Which tensor.
        tensor: TensorRef,
    },
    /// A buffer breaks the contract in a way only its address shows (its alignment).
    #[error("the buffer breaks the negotiated contract: {rejection}")]
    Contract {
        /// What the contract requires.
        rejection: Rejection,
    },
    /// A borrowed slice was passed for a tensor negotiated in memory other than pageable host
    /// memory (device, managed or pinned), which the host cannot check a slice against. Such
    /// handles run through [`OpHandle::execute_on_stream`] on [`DeviceTensor`]s.
    #[error(
        "{tensor} was negotiated in {space} memory, and a borrowed slice can only stand for \
         pageable host memory; use execute_on_stream with a DeviceTensor"
    )]
    NotHostMemory {
        /// The first such tensor.
        tensor: TensorRef,
        /// Its negotiated memory space.
        space: MemorySpace,
    },
    /// The call names another sync mode than the handle was resolved for.
    #[error("the handle was resolved for sync mode {resolved}, the call asks for {got}")]
    SyncMode {
        /// The handle's mode.
        resolved: SyncMode,
        /// The raw `GUILD_SYNC_*` value of the call.
        got: u32,
    },
    /// The call names another device than the handle was resolved for.
    #[error("the handle was resolved for device {resolved}, the call runs on device {got}")]
    Device {
        /// The handle's device.
        resolved: i32,
        /// The call's device.
        got: i32,
    },
    /// A stream was passed to a CPU provider.
    #[error("a CPU provider runs host-blocking on the calling thread and takes no stream")]
    StreamOnCpu,
    /// The handle's provider requires CPU instruction sets this CPU lacks: its resolution was
    /// steered by a declaration of more (the request's device record, or the embedder's
    /// [`DeviceSupport::cpu_isa`]), so the handle describes what such a CPU would run, and
    /// running it here could execute an illegal instruction. Checked before anything else on
    /// the Rust face; the C face reports it as `GUILD_STATUS_ERR_UNSUPPORTED`.
    #[error(
        "{impl_id} requires CPU instruction sets this CPU lacks ({missing}); it was chosen for \
         a declared CPU with more, and can be described but not executed here"
    )]
    MissingCpuIsa {
        /// The chosen implementation.
        impl_id: ImplId,
        /// The required bits this CPU lacks.
        missing: CpuIsa,
    },
    /// Scratch is missing or shorter than the provider asked for.
    #[error("the provider needs {needed} bytes of {kind} scratch, {got} given")]
    ScratchTooSmall {
        /// `host` or `device`.
        kind: &'static str,
        /// The bytes negotiated.
        needed: u64,
        /// The bytes passed (0 when none).
        got: u64,
    },
    /// Scratch is not aligned as the provider asked.
    #[error("the {kind} scratch at {address:#x} is not aligned to {alignment} bytes")]
    ScratchMisaligned {
        /// `host` or `device`.
        kind: &'static str,
        /// The scratch's address.
        address: usize,
        /// The alignment negotiated.
        alignment: u32,
    },
    /// The provider needs device scratch, which [`OpHandle::execute`] cannot pass (use
    /// [`OpHandle::execute_on_stream`] with a [`DeviceScratch`]).
    #[error(
        "the provider needs {needed} bytes of device scratch, which execute on slices cannot pass"
    )]
    DeviceScratch {
        /// The bytes negotiated.
        needed: u64,
    },
    /// The thread is already inside a call on this handle (a provider calling back into the
    /// handle that is running it); the C face reports it as `GUILD_STATUS_ERR_BUSY`.
    #[error("a call on this handle is already running on this thread; calling it again from inside would deadlock")]
    Reentrant,
    /// The provider's `execute` returned an error status, with its own message.
    #[error("the provider failed: {0}")]
    Provider(ProviderRefusal),
    /// The device adapter could not record the end of the stream work the call enqueued.
    #[error("the work was enqueued but its completion could not be recorded: {0}")]
    Stream(DeviceError),
}

/// Why [`OpHandle::reshape`] (or the C service's `reshape`) changed nothing. The handle keeps
/// the shapes it had and still runs with them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReshapeError {
    /// The reshape passes another number of inputs or outputs than the handle has.
    #[error(
        "{got} {role}s given, the handle has {expected}; a reshape keeps the number of tensors"
    )]
    Arity {
        /// Inputs or outputs.
        role: TensorRole,
        /// How many the handle has.
        expected: usize,
        /// How many the reshape passed.
        got: usize,
    },
    /// A tensor's dtype, memory space or device differs from the handle's: a reshape changes
    /// only rank, dims and strides (anything else is a new resolution).
    #[error("{tensor} changes its {what}; a reshape changes only rank, dims and strides")]
    Changed {
        /// Which tensor.
        tensor: TensorRef,
        /// `dtype`, `memory space` or `device`.
        what: &'static str,
    },
    /// The new tensors are invalid whatever the provider (a bad rank, extent or stride).
    #[error("invalid reshape: {0}")]
    Query(QueryError),
    /// The handle's provider cannot serve the new tensors: its declared contract, its
    /// `validate` or `query_scratch`, or the budgets refused them.
    #[error("the provider refused the new shapes: {0}")]
    Refused(Rejection),
}

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

mod sealed {
    pub trait Sealed {}
}

/// An element type a tensor buffer may hold. `u8` stands for raw bytes of any dtype.
pub trait Element: sealed::Sealed + Copy + 'static {
    /// The dtype the element is, or `None` for raw bytes.
    const DTYPE: Option<DType>;
}

macro_rules! element {
    ($($t:ty => $d:expr),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Option<DType> = $d;
        }
    )*};
}

element!(
    f32 => Some(DType::F32),
    f64 => Some(DType::F64),
    i8 => Some(DType::I8),
    i16 => Some(DType::I16),
    i32 => Some(DType::I32),
    i64 => Some(DType::I64),
    u8 => None,
);

/// An input tensor: its descriptor and a shared borrow of the buffer that holds it. The
/// provider reads it only.
///
/// The descriptor is borrowed, not copied: an argument is four words, made anew for every call
/// at the cost of a few stores. Lend the handle's own descriptors ([`OpHandle::inputs`]) or
/// the runner's copies of them.
#[derive(Debug, Clone, Copy)]
pub struct TensorArg<'a> {
    /// Marked when `T` is not its dtype (the element type is checked with the descriptor).
    desc: Lent<'a>,
    ptr: *mut c_void,
    len: usize,
    _data: PhantomData<&'a [u8]>,
}

impl<'a> TensorArg<'a> {
    /// `data` holding a tensor described by `desc` (whose address is replaced by the buffer's).
    #[inline]
    pub fn new<T: Element>(desc: &'a TensorDesc, data: &'a [T]) -> Self {
        TensorArg {
            desc: Lent::new(desc, T::DTYPE),
            // The provider receives a `*mut` by the C ABI's shape but only reads inputs.
            ptr: data.as_ptr().cast_mut().cast(),
            len: size_of_val(data),
            _data: PhantomData,
        }
    }
}

impl<'a> Buffer for TensorArg<'a> {
    type Desc = Lent<'a>;
    #[inline(always)]
    fn parts(&self) -> BufferArg<'_, Lent<'a>> {
        (&self.desc, self.ptr, self.len)
    }
}

/// An output tensor: its descriptor and an exclusive borrow of the buffer it is written into.
/// The descriptor is borrowed, as [`TensorArg`]'s is.
#[derive(Debug)]
pub struct TensorArgMut<'a> {
    /// Marked when `T` is not its dtype (the element type is checked with the descriptor).
    desc: Lent<'a>,
    ptr: *mut c_void,
    len: usize,
    _data: PhantomData<&'a mut [u8]>,
}

impl<'a> TensorArgMut<'a> {
    /// `data` to receive a tensor described by `desc` (whose address is replaced by the
    /// buffer's).
    #[inline]
    pub fn new<T: Element>(desc: &'a TensorDesc, data: &'a mut [T]) -> Self {
        TensorArgMut {
            desc: Lent::new(desc, T::DTYPE),
            len: size_of_val(data),
            ptr: data.as_mut_ptr().cast(),
            _data: PhantomData,
        }
    }
}

impl<'a> Buffer for TensorArgMut<'a> {
    type Desc = Lent<'a>;
    #[inline(always)]
    fn parts(&self) -> BufferArg<'_, Lent<'a>> {
        (&self.desc, self.ptr, self.len)
    }
}

/// A tensor in memory the borrow checker cannot see (device, managed or pinned memory, or any
/// buffer whose lifetime the caller manages): its descriptor, data address and byte extent,
/// for [`OpHandle::execute_on_stream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTensor {
    desc: TensorDesc,
    ptr: *mut c_void,
    bytes: u64,
}

impl DeviceTensor {
    /// The tensor described by `desc` at `ptr`, whose allocation holds `bytes` bytes from
    /// `ptr` on. The descriptor's own data address is ignored; the execute checks `desc`
    /// against the negotiated one, `bytes` against the tensor's byte extent and `ptr` for NULL
    /// and alignment.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` must be memory of `desc`'s memory space and device that stays valid
    /// (allocated, and not used by anything else in a conflicting way) until the work of every
    /// execute it is passed to has completed: until the handle is released or dropped, or the
    /// stream the work was enqueued on has been synchronised.
    pub unsafe fn new(desc: TensorDesc, ptr: *mut c_void, bytes: u64) -> Self {
        DeviceTensor { desc, ptr, bytes }
    }

    /// The descriptor.
    pub fn desc(&self) -> &TensorDesc {
        &self.desc
    }

    /// The data address.
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The bytes the allocation holds from the data address on.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Buffer for DeviceTensor {
    type Desc = TensorDesc;
    #[inline(always)]
    fn parts(&self) -> BufferArg<'_, TensorDesc> {
        let extent = usize::try_from(self.bytes).unwrap_or(usize::MAX);
        (&self.desc, self.ptr, extent)
    }
}

/// Device scratch for [`OpHandle::execute_on_stream`]: an address on the handle's device and
/// its size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceScratch {
    ptr: *mut c_void,
    bytes: u64,
}

impl DeviceScratch {
    /// `bytes` bytes of device memory at `ptr`; the execute checks size and alignment against
    /// [`Scratch`].
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` must be device memory of the handle's device that stays valid, and is
    /// used by nothing else, until the work of every execute it is passed to has completed
    /// (the handle released or dropped, or the stream synchronised).
    pub unsafe fn new(ptr: *mut c_void, bytes: u64) -> Self {
        DeviceScratch { ptr, bytes }
    }
}

// SAFETY: a `DeviceTensor` or `DeviceScratch` is an address and a size; it gives no access by
// itself (only the unsafe `execute_on_stream` uses it, under its caller's contract), so moving
// or sharing it between threads cannot cause a data race.
unsafe impl Send for DeviceTensor {}
// SAFETY: as above.
unsafe impl Sync for DeviceTensor {}
// SAFETY: as above.
unsafe impl Send for DeviceScratch {}
// SAFETY: as above.
unsafe impl Sync for DeviceScratch {}

// SAFETY: the raw pointers in the argument types stand for the borrows in their PhantomData
// (`&[u8]` / `&mut [u8]`), which are Send and Sync; the only other borrow, of the descriptor
// (`&TensorDesc`), is Send and Sync as `TensorDesc` is Sync.
unsafe impl Send for TensorArg<'_> {}
// SAFETY: as above.
unsafe impl Sync for TensorArg<'_> {}
// SAFETY: as above.
unsafe impl Send for TensorArgMut<'_> {}
// SAFETY: as above.
unsafe impl Sync for TensorArgMut<'_> {}

/// Handles cross threads: independent handles run concurrently and one can be shared.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<OpHandle<'static>>();
    send_sync::<OperationService<'static>>();
};
