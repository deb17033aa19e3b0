//! The operation service's safe Rust face (G6, first slice: CPU, host-blocking).
//!
//! A runner describes what it wants with an [`OperationRequest`] (operation name, version
//! interval, backends, required capabilities and numerics, sync mode, its actual tensors,
//! budgets, optionally an exact impl id) and asks an [`OperationService`] to resolve it. The
//! service converts the request to the domain's [`OpQuery`], takes the GOP1 candidates of the
//! operation from the kernel registry's snapshot, ranks them with
//! [`guild_domain::operation::resolve`] and negotiates through each candidate's C `validate` and
//! `query_scratch` callbacks with the request's actual tensors. The result is an [`OpHandle`]
//! that owns a [`KernelBinding`] (so the provider's library stays loaded and its package cannot
//! be rolled back or removed), the negotiated scratch and a copy of the tensor descriptors; or a
//! [`ResolveError`] carrying the domain's report of every candidate and why it lost.
//!
//! [`OpHandle::execute`] checks the caller's buffers against the negotiated descriptors (shape,
//! strides, dtype, element type, byte extent, alignment) and the scratch against the request
//! before it calls the provider, so that a mismatch is a typed error and the provider never sees
//! it. It never reselects. Each handle serialises its own executes behind a mutex; handles are
//! `Send + Sync`, so independent handles run concurrently and one handle can be shared.
//!
//! The handle borrows the registry (`OpHandle<'r>`), which makes "handles are released before
//! their registry goes" a compile-time fact.
//!
//! Unsafe code here is confined to the calls into the provider's C callbacks; no Rust panic can
//! cross into C because no Rust code is called from C on these paths.

use std::cell::RefCell;
use std::ffi::{c_void, CString};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use guild_abi::{
    guild_device_caps_v1_t, guild_error_info_t, guild_execute_args_v1_t, guild_operation_ext_v1_t,
    guild_operation_query_v1_t, guild_scratch_request_v1_t, guild_tensor_desc_v1_t,
    GUILD_OP_CUSTOM, GUILD_STATUS_OK,
};
use guild_adapters_posix::OwnedKernel;
use guild_domain::ids::{ImplId, OpName, PackageId};
use guild_domain::operation::{
    check_tensor, resolve, Backend, BackendSet, Budget, Capabilities, CpuIsa, DType, DeviceCaps,
    Negotiator, Numerics, OpCandidate, OpQuery, ProviderRefusal, QueryError, QuerySpec, Rejection,
    ResolveFailure, ScratchRequest, SyncMode, TensorDesc, TensorInfo, TensorRef, TensorRole,
};
use guild_domain::version::{PackedVersion, Version};

use crate::registry::{KernelBinding, KernelRegistry, StoredOp};

// ---------------------------------------------------------------------------------------------
// The request
// ---------------------------------------------------------------------------------------------

/// What a runner asks the service for: a safe description of a GOP1 query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationRequest {
    /// The namespaced operation wanted.
    pub op_name: OpName,
    /// Lowest acceptable operation version, inclusive.
    pub min_version: PackedVersion,
    /// Highest acceptable operation version, inclusive (same major as `min_version`).
    pub max_version: PackedVersion,
    /// Backends the caller can run.
    pub backends: BackendSet,
    /// Capability bits the provider must offer.
    pub capabilities: Capabilities,
    /// Numerical guarantees the provider must offer.
    pub numerics: Numerics,
    /// How the call is synchronised. This slice executes host-blocking only.
    pub sync_mode: SyncMode,
    /// The actual input tensors (a known data address lets the provider check alignment).
    pub inputs: Vec<TensorDesc>,
    /// The actual output tensors.
    pub outputs: Vec<TensorDesc>,
    /// Bound on host scratch.
    pub ram_budget: Budget,
    /// Bound on device scratch.
    pub vram_budget: Budget,
    /// When set, only this implementation may be chosen, with no fallback.
    pub exact_impl: Option<ImplId>,
    /// The device the call runs on.
    pub device: DeviceCaps,
}

impl OperationRequest {
    /// A host-blocking CPU request for any 1.x version of `op_name`, with no required
    /// capabilities or numerics and unlimited budgets.
    pub fn cpu(op_name: OpName, inputs: Vec<TensorDesc>, outputs: Vec<TensorDesc>) -> Self {
        OperationRequest {
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
                cpu_isa: CpuIsa::EMPTY,
            },
        }
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
        QuerySpec {
            op_name: self.op_name.clone(),
            min_version: self.min_version,
            max_version: self.max_version,
            backends: self.backends,
            capabilities: self.capabilities,
            numerics: self.numerics,
            sync_mode: self.sync_mode,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            ram_budget: self.ram_budget,
            vram_budget: self.vram_budget,
            exact_impl: self.exact_impl.clone(),
            device: self.device,
        }
    }
}

/// Why [`OperationService::resolve`] returned no handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The request is invalid whatever providers exist.
    #[error("invalid operation request: {0}")]
    Query(QueryError),
    /// No candidate was chosen; the report lists every candidate and why it was rejected.
    #[error("{0}")]
    Unresolved(ResolveFailure),
    /// The request asks for something this slice of the service does not do yet.
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
    registry: &'r KernelRegistry,
}

/// One candidate as the service negotiates with it: the stored op (which keeps its library
/// loaded while this lives) and its owned C copy.
struct Provider {
    stored: Arc<StoredOp>,
    kernel: Arc<OwnedKernel>,
}

impl<'r> OperationService<'r> {
    /// The service over `registry`; handles it returns borrow the registry.
    pub fn new(registry: &'r KernelRegistry) -> Self {
        OperationService { registry }
    }

    /// Resolves `request` to a handle. See the module documentation.
    pub fn resolve(&self, request: &OperationRequest) -> Result<OpHandle<'r>, ResolveError> {
        if request.sync_mode != SyncMode::HostBlocking {
            return Err(ResolveError::Unsupported(
                "only host-blocking execution is implemented in this host version",
            ));
        }
        let query = OpQuery::new(request.to_spec()).map_err(ResolveError::Query)?;
        self.attempt(&query)
    }

    /// One resolution against the current snapshot.
    fn attempt(&self, query: &OpQuery) -> Result<OpHandle<'r>, ResolveError> {
        let providers: Vec<Provider> = self
            .registry
            .snapshot()
            .candidates(GUILD_OP_CUSTOM, Some(query.op_name()))
            .iter()
            .filter_map(provider)
            .collect();
        let mut candidates: Vec<OpCandidate> = providers
            .iter()
            .filter_map(|p| p.kernel.candidate().cloned())
            .collect();
        // An exact id registered for another operation takes part as a declaration only (the
        // domain skips other operations' candidates without calling them), so that the report
        // says what it implements instead.
        if let Some(exact) = &query.spec().exact_impl {
            if !candidates.iter().any(|c| &c.impl_id == exact) {
                if let Some(c) = self
                    .registry
                    .find_by_id(exact)
                    .and_then(|b| b.kernel().operation.clone())
                {
                    if c.op_name != *query.op_name() {
                        candidates.push(c);
                    }
                }
            }
        }
        let negotiator = CNegotiator::new(&providers, query);
        let resolution = resolve(query, &candidates, &negotiator);
        let passed_over: Vec<(ImplId, String)> = resolution
            .verdicts()
            .iter()
            .map(|v| (v.impl_id.clone(), v.reason.to_string()))
            .collect();
        let choice = resolution.into_result().map_err(ResolveError::Unresolved)?;
        let alignment = negotiator.alignment(choice.index);
        drop(negotiator);
        // The domain only chooses among the providers it was given, in the same order.
        let (Some(chosen), Some(candidate)) = (
            providers.get(choice.index),
            candidates.get(choice.index).cloned(),
        ) else {
            return Err(ResolveError::Internal(
                "the chosen candidate has no provider",
            ));
        };
        // Bind the very stored op that was negotiated with. If a replacement was published in
        // between, this handle keeps the version it negotiated (and its library) alive, which is
        // exactly what was validated.
        let binding = KernelBinding::new(Arc::clone(&chosen.stored));
        let spec = query.spec();
        Ok(OpHandle {
            kernel: Arc::clone(&chosen.kernel),
            binding,
            candidate,
            scratch: Scratch {
                host_bytes: choice.scratch.host_bytes,
                device_bytes: choice.scratch.device_bytes,
                alignment,
            },
            inputs: spec.inputs.clone(),
            outputs: spec.outputs.clone(),
            input_infos: query.input_infos().to_vec(),
            output_infos: query.output_infos().to_vec(),
            sync_mode: spec.sync_mode,
            device_id: spec.device.device_id,
            passed_over,
            calls: Mutex::new(()),
            _registry: PhantomData,
        })
    }
}

/// The negotiable provider behind a stored op: a GOP1 kernel whose owned copy the dlopen loader
/// made. Anything else (a fake loader's payload, a kernel without GOP1) takes no part.
fn provider(stored: &Arc<StoredOp>) -> Option<Provider> {
    let kernel = Arc::clone(&stored.kernel.raw)
        .downcast::<OwnedKernel>()
        .ok()?;
    kernel.operation()?;
    kernel.candidate()?;
    Some(Provider {
        stored: Arc::clone(stored),
        kernel,
    })
}

// ---------------------------------------------------------------------------------------------
// Calling the C callbacks
// ---------------------------------------------------------------------------------------------

/// The C form of one tensor.
fn c_tensor(desc: &TensorDesc, data: *mut c_void) -> guild_tensor_desc_v1_t {
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

/// The pointer a descriptor's known address stands for (NULL when unknown). It is only ever
/// passed to negotiation callbacks, which may inspect the address but not the data.
fn address_ptr(desc: &TensorDesc) -> *mut c_void {
    desc.data_addr
        .and_then(|a| usize::try_from(a).ok())
        .map_or(std::ptr::null_mut(), |a| a as *mut c_void)
}

/// The text a provider wrote into an error record, up to its first NUL.
fn error_text(error: &guild_error_info_t) -> String {
    let bytes: Vec<u8> = error
        .message
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The GOP1 callbacks, called with C structs built from the query's actual tensors; the
/// pointers inside them are valid for each call only.
struct CNegotiator<'p> {
    providers: &'p [Provider],
    op_name: CString,
    exact: Option<CString>,
    inputs: Vec<guild_tensor_desc_v1_t>,
    outputs: Vec<guild_tensor_desc_v1_t>,
    /// The scratch alignment each provider asked for, by candidate index.
    alignments: RefCell<Vec<u32>>,
}

impl<'p> CNegotiator<'p> {
    fn new(providers: &'p [Provider], query: &OpQuery) -> Self {
        let spec = query.spec();
        let c = |d: &TensorDesc| c_tensor(d, address_ptr(d));
        CNegotiator {
            providers,
            // Ids and names are validated text without NUL bytes; an empty string is the
            // harmless fallback should that ever change.
            op_name: CString::new(spec.op_name.as_str()).unwrap_or_default(),
            exact: spec
                .exact_impl
                .as_ref()
                .map(|id| CString::new(id.as_str()).unwrap_or_default()),
            inputs: spec.inputs.iter().map(c).collect(),
            outputs: spec.outputs.iter().map(c).collect(),
            alignments: RefCell::new(vec![0; providers.len()]),
        }
    }

    fn alignment(&self, index: usize) -> u32 {
        self.alignments.borrow().get(index).copied().unwrap_or(0)
    }

    /// The callbacks of candidate `index`.
    fn op(&self, index: usize) -> Result<&'p guild_operation_ext_v1_t, ProviderRefusal> {
        self.providers
            .get(index)
            .and_then(|p| p.kernel.operation())
            .ok_or_else(|| ProviderRefusal::new(-8, "the host lost track of this provider"))
    }

    /// Runs `call` with a C query built from `query` for candidate `candidate`; every pointer
    /// in it lives until `call` returns.
    fn with_query<T>(
        &self,
        candidate: &OpCandidate,
        query: &OpQuery,
        call: impl FnOnce(&guild_operation_query_v1_t) -> T,
    ) -> T {
        let spec = query.spec();
        let caps = guild_device_caps_v1_t {
            struct_size: size_of::<guild_device_caps_v1_t>() as u32,
            backend: candidate.backend.bit(),
            device_id: spec.device.device_id,
            cuda_sm: spec.device.cuda_sm.unwrap_or(0),
            cpu_isa: spec.device.cpu_isa.bits(),
            total_memory_bytes: 0,
            free_memory_bytes: 0,
            next_ext: std::ptr::null(),
        };
        let c_query = guild_operation_query_v1_t {
            struct_size: size_of::<guild_operation_query_v1_t>() as u32,
            version: 1,
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
            params: std::ptr::null(),
            params_size: 0,
        };
        call(&c_query)
    }
}

impl Negotiator for CNegotiator<'_> {
    fn validate(
        &self,
        index: usize,
        candidate: &OpCandidate,
        query: &OpQuery,
    ) -> Result<(), ProviderRefusal> {
        let op = self.op(index)?;
        let Some(validate) = op.validate else {
            return Err(ProviderRefusal::new(
                -2,
                "the provider has no validate callback",
            ));
        };
        let mut error = guild_error_info_t::new();
        let status = self.with_query(candidate, query, |q| {
            // SAFETY: `op` is the owned copy of a GOP1 extension whose library stays loaded
            // while `self.providers` holds its stored op; `validate` gets the user_data it
            // registered, a query whose pointers (name, tensors, caps) live for this call, and
            // a fresh, correctly sized error record. It is a negotiation callback: it must not
            // retain the query or reenter the registry, which we do not hold locked here.
            unsafe { validate(op.user_data, q, &mut error) }
        });
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(ProviderRefusal::new(status, error_text(&error)))
        }
    }

    fn query_scratch(
        &self,
        index: usize,
        candidate: &OpCandidate,
        query: &OpQuery,
    ) -> Result<ScratchRequest, ProviderRefusal> {
        let op = self.op(index)?;
        let Some(query_scratch) = op.query_scratch else {
            return Err(ProviderRefusal::new(
                -2,
                "the provider has no query_scratch callback",
            ));
        };
        let mut error = guild_error_info_t::new();
        let mut scratch = guild_scratch_request_v1_t {
            struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
            alignment: 0,
            host_bytes: 0,
            device_bytes: 0,
        };
        let status = self.with_query(candidate, query, |q| {
            // SAFETY: as in `validate`; `scratch` is a live record of the declared size.
            unsafe { query_scratch(op.user_data, q, &mut scratch, &mut error) }
        });
        if status != GUILD_STATUS_OK {
            return Err(ProviderRefusal::new(status, error_text(&error)));
        }
        if scratch.alignment > 1 && !scratch.alignment.is_power_of_two() {
            return Err(ProviderRefusal::new(
                -1,
                format!(
                    "the provider asked for a scratch alignment of {}, not a power of two",
                    scratch.alignment
                ),
            ));
        }
        if let Some(slot) = self.alignments.borrow_mut().get_mut(index) {
            *slot = scratch.alignment;
        }
        Ok(ScratchRequest {
            host_bytes: scratch.host_bytes,
            device_bytes: scratch.device_bytes,
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
    pub impl_id: &'h ImplId,
    pub package: &'h PackageId,
    pub package_version: &'h Version,
    pub op_name: &'h OpName,
    pub op_version: PackedVersion,
    pub backend: Backend,
    pub priority: i32,
    pub scratch: Scratch,
}

/// A resolved operation: one negotiated contract with one provider, kept loaded by the
/// [`KernelBinding`] the handle owns. Dropping it releases the binding (on CPU there is no
/// outstanding work to wait for: every execute has returned).
pub struct OpHandle<'r> {
    binding: KernelBinding,
    kernel: Arc<OwnedKernel>,
    candidate: OpCandidate,
    scratch: Scratch,
    inputs: Vec<TensorDesc>,
    outputs: Vec<TensorDesc>,
    input_infos: Vec<TensorInfo>,
    output_infos: Vec<TensorInfo>,
    sync_mode: SyncMode,
    device_id: i32,
    /// Every other candidate of the operation and why it was not chosen.
    passed_over: Vec<(ImplId, String)>,
    /// Serialises this handle's executes.
    calls: Mutex<()>,
    _registry: PhantomData<&'r KernelRegistry>,
}

impl fmt::Debug for OpHandle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpHandle")
            .field("impl_id", &self.candidate.impl_id)
            .field("package", self.binding.package())
            .field("scratch", &self.scratch)
            .finish_non_exhaustive()
    }
}

impl OpHandle<'_> {
    /// What was resolved.
    pub fn describe(&self) -> OpDescription<'_> {
        OpDescription {
            impl_id: &self.candidate.impl_id,
            package: self.binding.package(),
            package_version: self.binding.version(),
            op_name: &self.candidate.op_name,
            op_version: self.candidate.op_version,
            backend: self.candidate.backend,
            priority: self.candidate.priority,
            scratch: self.scratch,
        }
    }

    /// The scratch each execute needs.
    pub fn scratch(&self) -> Scratch {
        self.scratch
    }

    /// The negotiated input descriptors.
    pub fn inputs(&self) -> &[TensorDesc] {
        &self.inputs
    }

    /// The negotiated output descriptors.
    pub fn outputs(&self) -> &[TensorDesc] {
        &self.outputs
    }

    /// Every other candidate of the operation and why it was not chosen (rejected, or
    /// outranked by this one, in which case its callbacks were not called).
    pub fn passed_over(&self) -> &[(ImplId, String)] {
        &self.passed_over
    }

    /// The binding that keeps the provider loaded.
    pub fn binding(&self) -> &KernelBinding {
        &self.binding
    }

    /// Executes the negotiated contract on `inputs` and `outputs` with `scratch`, blocking
    /// until the provider returns. Every argument is checked against the negotiated contract
    /// first; a mismatch is an error and the provider is not called. Calls on one handle are
    /// serialised; calls on different handles may run at once.
    pub fn execute(
        &self,
        inputs: &[TensorArg<'_>],
        outputs: &mut [TensorArgMut<'_>],
        scratch: Option<&mut [u8]>,
    ) -> Result<(), ExecuteError> {
        let c_inputs = self.check_args(
            TensorRole::Input,
            &self.inputs,
            &self.input_infos,
            inputs.iter().map(|a| (a.desc, a.dtype, a.ptr, a.len)),
        )?;
        let c_outputs = self.check_args(
            TensorRole::Output,
            &self.outputs,
            &self.output_infos,
            outputs.iter().map(|a| (a.desc, a.dtype, a.ptr, a.len)),
        )?;
        if self.scratch.device_bytes > 0 {
            return Err(ExecuteError::DeviceScratch {
                needed: self.scratch.device_bytes,
            });
        }
        let (scratch_ptr, scratch_len) = match scratch {
            Some(s) if !s.is_empty() => (s.as_mut_ptr(), s.len()),
            _ => (std::ptr::null_mut(), 0),
        };
        let needed = self.scratch.host_bytes;
        if u64::try_from(scratch_len).unwrap_or(u64::MAX) < needed {
            return Err(ExecuteError::ScratchTooSmall {
                needed,
                got: scratch_len,
            });
        }
        let alignment = usize::try_from(self.scratch.alignment).unwrap_or(usize::MAX);
        if needed > 0 && alignment > 1 && !(scratch_ptr as usize).is_multiple_of(alignment) {
            return Err(ExecuteError::ScratchMisaligned {
                address: scratch_ptr as usize,
                alignment: self.scratch.alignment,
            });
        }
        let Some(op) = self.kernel.operation() else {
            return Err(ExecuteError::Provider(ProviderRefusal::new(
                -8,
                "the provider has no GOP1 extension",
            )));
        };
        let Some(execute) = op.execute else {
            return Err(ExecuteError::Provider(ProviderRefusal::new(
                -2,
                "the provider has no execute callback",
            )));
        };
        let args = guild_execute_args_v1_t {
            struct_size: size_of::<guild_execute_args_v1_t>() as u32,
            reserved: 0,
            inputs: c_inputs.as_ptr(),
            input_count: c_inputs.len(),
            outputs: c_outputs.as_ptr(),
            output_count: c_outputs.len(),
            scratch_host: scratch_ptr.cast(),
            scratch_host_size: u64::try_from(scratch_len).unwrap_or(u64::MAX),
            scratch_device: std::ptr::null_mut(),
            scratch_device_size: 0,
            stream: std::ptr::null_mut(),
            device_id: self.device_id,
            sync_mode: self.sync_mode.raw(),
            params: std::ptr::null(),
            params_size: 0,
        };
        let mut error = guild_error_info_t::new();
        let status = {
            let _serial = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the provider's library stays loaded while `self.binding` lives, and `op`
            // is its owned GOP1 copy with the user_data it registered. Every tensor passed the
            // negotiated contract above: its data pointer addresses a live Rust buffer of at
            // least the tensor's byte extent, borrowed (inputs shared, outputs exclusively) for
            // this call by the `TensorArg`s; the scratch slice is exclusively borrowed and at
            // least as large as negotiated. The handle's mutex serialises calls on it, and the
            // call is host-blocking, so nothing is used after it returns.
            unsafe { execute(op.user_data, &args, &mut error) }
        };
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(ExecuteError::Provider(ProviderRefusal::new(
                status,
                error_text(&error),
            )))
        }
    }

    /// Checks each argument against its negotiated descriptor and builds the C tensors.
    fn check_args(
        &self,
        role: TensorRole,
        negotiated: &[TensorDesc],
        infos: &[TensorInfo],
        args: impl ExactSizeIterator<Item = (TensorDesc, Option<DType>, *mut c_void, usize)>,
    ) -> Result<Vec<guild_tensor_desc_v1_t>, ExecuteError> {
        if args.len() != negotiated.len() {
            return Err(ExecuteError::Arity {
                role,
                expected: negotiated.len(),
                got: args.len(),
            });
        }
        let mut out = Vec::with_capacity(negotiated.len());
        for (index, (arg, (expected, info))) in args.zip(negotiated.iter().zip(infos)).enumerate() {
            let tensor = TensorRef { role, index };
            let (desc, element, ptr, len) = arg;
            if !same_tensor(&desc, expected) {
                return Err(ExecuteError::DescriptorMismatch {
                    tensor,
                    expected: Box::new(*expected),
                    actual: Box::new(desc),
                });
            }
            if let Some(element) = element {
                if element != desc.dtype {
                    return Err(ExecuteError::ElementType {
                        tensor,
                        dtype: desc.dtype,
                        element,
                    });
                }
            }
            let got = u64::try_from(len).unwrap_or(u64::MAX);
            if got < info.byte_extent {
                return Err(ExecuteError::BufferTooSmall {
                    tensor,
                    needed: info.byte_extent,
                    got: len,
                });
            }
            let actual = TensorDesc {
                data_addr: Some(ptr as usize as u64),
                ..desc
            };
            check_tensor(&self.candidate, tensor, &actual, info)
                .map_err(|rejection| ExecuteError::Contract { rejection })?;
            out.push(c_tensor(&actual, ptr));
        }
        Ok(out)
    }
}

/// Whether two descriptors name the same tensor shape apart from the data address (unused
/// dims and strides ignored; a 0 stride equals its explicit packed value only if spelled the
/// same way, which the negotiation saw).
fn same_tensor(a: &TensorDesc, b: &TensorDesc) -> bool {
    a.dtype == b.dtype
        && a.rank == b.rank
        && a.shape() == b.shape()
        && a.strides.get(..a.shape().len()) == b.strides.get(..b.shape().len())
        && a.memory_space == b.memory_space
        && a.device_id == b.device_id
}

/// Why [`OpHandle::execute`] did not run or the provider failed. Every variant but
/// [`ExecuteError::Provider`] is found before the provider is called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecuteError {
    #[error("{got} {role}s given, the negotiated contract has {expected}")]
    Arity {
        role: TensorRole,
        expected: usize,
        got: usize,
    },
    #[error(
        "{tensor} does not match the negotiated descriptor (expected {expected:?}, got {actual:?})"
    )]
    DescriptorMismatch {
        tensor: TensorRef,
        expected: Box<TensorDesc>,
        actual: Box<TensorDesc>,
    },
    #[error("{tensor} is {dtype} but its buffer holds {element} elements")]
    ElementType {
        tensor: TensorRef,
        dtype: DType,
        element: DType,
    },
    #[error("{tensor} spans {needed} bytes but its buffer has {got}")]
    BufferTooSmall {
        tensor: TensorRef,
        needed: u64,
        got: usize,
    },
    #[error("the buffer breaks the negotiated contract: {rejection}")]
    Contract { rejection: Rejection },
    #[error("the provider needs {needed} bytes of host scratch, {got} given")]
    ScratchTooSmall { needed: u64, got: usize },
    #[error("the scratch at {address:#x} is not aligned to {alignment} bytes")]
    ScratchMisaligned { address: usize, alignment: u32 },
    #[error(
        "the provider needs {needed} bytes of device scratch, which this host version cannot pass"
    )]
    DeviceScratch { needed: u64 },
    #[error("the provider failed: {0}")]
    Provider(ProviderRefusal),
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
#[derive(Debug, Clone, Copy)]
pub struct TensorArg<'a> {
    desc: TensorDesc,
    dtype: Option<DType>,
    ptr: *mut c_void,
    len: usize,
    _data: PhantomData<&'a [u8]>,
}

impl<'a> TensorArg<'a> {
    /// `data` holding a tensor described by `desc` (whose address is replaced by the buffer's).
    pub fn new<T: Element>(desc: TensorDesc, data: &'a [T]) -> Self {
        TensorArg {
            desc,
            dtype: T::DTYPE,
            // The provider receives a `*mut` by the C ABI's shape but only reads inputs.
            ptr: data.as_ptr().cast_mut().cast(),
            len: size_of_val(data),
            _data: PhantomData,
        }
    }
}

/// An output tensor: its descriptor and an exclusive borrow of the buffer it is written into.
#[derive(Debug)]
pub struct TensorArgMut<'a> {
    desc: TensorDesc,
    dtype: Option<DType>,
    ptr: *mut c_void,
    len: usize,
    _data: PhantomData<&'a mut [u8]>,
}

impl<'a> TensorArgMut<'a> {
    /// `data` to receive a tensor described by `desc` (whose address is replaced by the
    /// buffer's).
    pub fn new<T: Element>(desc: TensorDesc, data: &'a mut [T]) -> Self {
        TensorArgMut {
            desc,
            dtype: T::DTYPE,
            len: size_of_val(data),
            ptr: data.as_mut_ptr().cast(),
            _data: PhantomData,
        }
    }
}

// SAFETY: the raw pointers in the argument types stand for the borrows in their PhantomData
// (`&[u8]` / `&mut [u8]`), which are Send and Sync; nothing else is shared.
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
