//! The C face of the operation service: the `guild_operation_service_v1_t` table that plugins
//! receive through their host table and in-process runners get from
//! [`KernelRegistry::operation_api`](crate::registry::KernelRegistry::operation_api).
//!
//! Every entry point checks what it is given before it trusts it (NULL pointers, record sizes
//! and versions, the handle's tag and owner, strings bounded and UTF-8), converts the caller's
//! records to the domain's types and then runs the same code as the Rust face. A failure fills
//! the caller's `guild_error_info_t` with the status, a component and a one-line message that
//! says what failed; a failed resolution lists every candidate and why it was rejected, as far
//! as the message buffer holds. No panic crosses back into C: each entry point catches one and
//! reports `GUILD_STATUS_ERR_INTERNAL`.
//!
//! A handle is a heap record the caller owns until `release`. Each handle counts the calls in
//! progress on it, so that `release` during a call is refused with `GUILD_STATUS_ERR_BUSY`
//! (nothing is released) instead of freeing memory another thread is using.

use std::collections::HashSet;
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use guild_abi::{
    guild_device_caps_v1_t, guild_error_info_t, guild_execute_args_v1_t, guild_op_description_v1_t,
    guild_op_handle_t, guild_operation_query_v1_t, guild_operation_service_v1_t,
    guild_scratch_request_v1_t, guild_status_t, guild_tensor_desc_v1_t,
    GUILD_OPERATION_QUERY_VERSION, GUILD_OPERATION_SERVICE_VERSION,
    GUILD_STATUS_ERR_BUFFER_TOO_SMALL, GUILD_STATUS_ERR_BUSY, GUILD_STATUS_ERR_DEVICE,
    GUILD_STATUS_ERR_INTERNAL, GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_ERR_NOT_FOUND,
    GUILD_STATUS_ERR_OUT_OF_MEMORY, GUILD_STATUS_ERR_STATE, GUILD_STATUS_ERR_UNSUPPORTED,
    GUILD_STATUS_OK,
};
use guild_adapters_posix::{bounded_str, status_name, write_error_record, MAX_DESCRIPTOR_STRING};
use guild_domain::ids::{ImplId, OpName};
use guild_domain::operation::{
    Backend, BackendSet, Budget, Capabilities, DeviceCaps, FailureKind, Numerics, OpQuery,
    QuerySpec, Rejection, SyncMode, TensorDesc,
};
use guild_domain::version::PackedVersion;

use super::core::{tensor_from_c, Call, Resolved, ServiceCore};
use super::{ExecuteError, ResolveError};

/// The component named in the error records the service itself writes.
pub const COMPONENT: &str = "guild.operations";

/// The most tensors one query may carry on either side. Far above any real operation; it bounds
/// what a malformed count can make the host allocate.
pub const MAX_QUERY_TENSORS: usize = 1024;

/// The most parameter bytes one query may carry.
pub const MAX_PARAMS_BYTES: usize = 1 << 20;

const HANDLE_TAG: u64 = u64::from_be_bytes(*b"guild.op");
const RELEASED: u32 = 1 << 31;

/// The table every registry's core starts from; the core fills in `user`.
pub(crate) fn table() -> guild_operation_service_v1_t {
    guild_operation_service_v1_t {
        struct_size: size_of::<guild_operation_service_v1_t>() as u32,
        version: GUILD_OPERATION_SERVICE_VERSION,
        user: ptr::null_mut(),
        resolve: Some(service_resolve),
        describe: Some(service_describe),
        scratch: Some(service_scratch),
        execute: Some(service_execute),
        release: Some(service_release),
    }
}

/// The cores alive in this process, by address, so that `resolve` can refuse a `user` that no
/// longer (or never did) name one instead of reading freed memory.
static LIVE_CORES: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

pub(crate) fn register_core(core: &ServiceCore) {
    let mut live = LIVE_CORES.lock().unwrap_or_else(PoisonError::into_inner);
    live.get_or_insert_with(HashSet::new)
        .insert(core as *const ServiceCore as usize);
}

pub(crate) fn unregister_core(core: &ServiceCore) {
    let mut live = LIVE_CORES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(set) = live.as_mut() {
        set.remove(&(core as *const ServiceCore as usize));
    }
}

fn is_live_core(user: *mut c_void) -> bool {
    let live = LIVE_CORES.lock().unwrap_or_else(PoisonError::into_inner);
    live.as_ref()
        .is_some_and(|set| set.contains(&(user as usize)))
}

/// What a C handle points at. `repr(C)` with the tag first, so that checking a caller's
/// pointer reads only its first eight bytes.
#[repr(C)]
struct CHandle {
    tag: u64,
    core: *const ServiceCore,
    /// Calls in progress, plus [`RELEASED`] once release has begun.
    state: AtomicU32,
    resolved: Resolved,
    impl_id: CString,
    package_id: CString,
    op_name: CString,
}

/// A failure to report through the caller's error record.
struct Failure {
    status: guild_status_t,
    message: String,
}

impl Failure {
    fn new(status: guild_status_t, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Failure::new(GUILD_STATUS_ERR_INVALID_ARGUMENT, message)
    }
}

/// Runs an entry point's body, turning its failure or panic into a status and an error record.
fn guarded(
    error: *mut guild_error_info_t,
    entry: &str,
    body: impl FnOnce() -> Result<(), Failure>,
) -> guild_status_t {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return GUILD_STATUS_OK,
        Ok(Err(failure)) => failure,
        Err(_) => Failure::new(
            GUILD_STATUS_ERR_INTERNAL,
            format!("the host panicked in {entry}; this is a bug in the host"),
        ),
    };
    // SAFETY: the service's contract makes `error` NULL or a caller-initialised record valid
    // for this call; write_error_record checks NULL, alignment and struct_size itself.
    unsafe { write_error_record(error, failure.status, COMPONENT, &failure.message) };
    failure.status
}

/// The handle behind a caller's pointer, after checking that it is one of `user`'s handles.
///
/// # Safety
/// `handle` must be NULL or a pointer this service returned and that was not released.
unsafe fn handle_ref<'h>(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    entry: &str,
) -> Result<&'h CHandle, Failure> {
    let h = handle.cast::<CHandle>();
    if h.is_null() || !h.is_aligned() {
        return Err(Failure::invalid(format!(
            "{entry}: the handle is NULL or not one this service returned"
        )));
    }
    // SAFETY: by the contract a non-NULL handle points at memory this service allocated; the
    // tag is read on its own (the first field), before the rest is trusted.
    let tag = unsafe { ptr::addr_of!((*h).tag).read() };
    if tag != HANDLE_TAG {
        return Err(Failure::invalid(format!(
            "{entry}: the handle is not one this service returned (or it was released)"
        )));
    }
    // SAFETY: the tag marks a live CHandle this service made (released ones have it cleared).
    let h = unsafe { &*h };
    if h.core != user.cast_const().cast() {
        return Err(Failure::new(
            GUILD_STATUS_ERR_STATE,
            format!("{entry}: the handle belongs to another registry's service than `user`"),
        ));
    }
    Ok(h)
}

/// Counts a call on `h` for its duration, refusing one on a handle being released.
struct InCall<'h>(&'h CHandle);

impl<'h> InCall<'h> {
    fn enter(h: &'h CHandle, entry: &str) -> Result<Self, Failure> {
        let previous = h.state.fetch_add(1, Ordering::Acquire);
        if previous & RELEASED != 0 {
            h.state.fetch_sub(1, Ordering::Release);
            return Err(Failure::new(
                GUILD_STATUS_ERR_STATE,
                format!("{entry}: the handle is being released"),
            ));
        }
        Ok(InCall(h))
    }
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        self.0.state.fetch_sub(1, Ordering::Release);
    }
}

/// Checks a caller-provided output record's `struct_size`.
///
/// # Safety
/// `record` must be NULL or point at a record whose first field is a `uint32_t struct_size`.
unsafe fn check_out_record<T>(record: *mut T, what: &str) -> Result<(), Failure> {
    if record.is_null() || !record.is_aligned() {
        return Err(Failure::invalid(format!("{what} is NULL or misaligned")));
    }
    // SAFETY: non-NULL and aligned; by the contract its first field is the caller's size.
    let size = unsafe { record.cast::<u32>().read() };
    if usize::try_from(size).map_or(true, |s| s < size_of::<T>()) {
        return Err(Failure::invalid(format!(
            "{what}.struct_size is {size}, smaller than the {} bytes of this version",
            size_of::<T>()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// resolve
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn service_resolve(
    user: *mut c_void,
    query: *const guild_operation_query_v1_t,
    out_handle: *mut *mut guild_op_handle_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    guarded(error, "resolve", || {
        if out_handle.is_null() || !out_handle.is_aligned() {
            return Err(Failure::invalid(
                "resolve: out_handle is NULL or misaligned",
            ));
        }
        // SAFETY: checked non-NULL and aligned; the caller provides the slot for this call.
        unsafe { out_handle.write(ptr::null_mut()) };
        if !is_live_core(user) {
            return Err(Failure::new(
                GUILD_STATUS_ERR_STATE,
                "resolve: `user` is not a live operation service (was its registry destroyed?)",
            ));
        }
        // SAFETY: `user` is the address of a registered core, and a core unregisters before it
        // is freed; the registry outlives calls into its service by the service's contract.
        let core = unsafe { &*user.cast::<ServiceCore>() };
        // SAFETY: the caller's query and everything it points at are valid for this call.
        let (spec, params) = unsafe { read_query(core, query) }?;
        let query = OpQuery::new(spec).map_err(|e| Failure::invalid(e.to_string()))?;
        let resolved = core
            .resolve(&query, params, false)
            .map_err(resolve_failure)?;
        let c_string = |s: &str| CString::new(s).unwrap_or_default();
        let handle = Box::new(CHandle {
            tag: HANDLE_TAG,
            core,
            state: AtomicU32::new(0),
            impl_id: c_string(resolved.candidate.impl_id.as_str()),
            package_id: c_string(resolved.binding.package().as_str()),
            op_name: c_string(resolved.candidate.op_name.as_str()),
            resolved,
        });
        core.live_c_handles.fetch_add(1, Ordering::AcqRel);
        // SAFETY: checked above; ownership of the box passes to the caller until release.
        unsafe { out_handle.write(Box::into_raw(handle).cast()) };
        Ok(())
    })
}

/// The status and message of a failed resolution.
fn resolve_failure(e: ResolveError) -> Failure {
    let status = match &e {
        ResolveError::Query(_) => GUILD_STATUS_ERR_INVALID_ARGUMENT,
        ResolveError::Unsupported(_) => GUILD_STATUS_ERR_UNSUPPORTED,
        ResolveError::Internal(_) => GUILD_STATUS_ERR_INTERNAL,
        ResolveError::Unresolved(f) => match f.kind {
            FailureKind::NoCandidates | FailureKind::ExactImplAbsent { .. } => {
                GUILD_STATUS_ERR_NOT_FOUND
            }
            _ if f
                .rejections
                .iter()
                .any(|r| matches!(r.reason, Rejection::OverBudget { .. })) =>
            {
                GUILD_STATUS_ERR_OUT_OF_MEMORY
            }
            _ => GUILD_STATUS_ERR_NOT_FOUND,
        },
    };
    let message = match &e {
        ResolveError::Unresolved(f) => one_line_report(f),
        _ => e.to_string(),
    };
    Failure::new(status, message)
}

/// A failure report on one line that fits a C message buffer as well as it can: the header,
/// then each candidate rejected for a reason of its own, then a count of those that only lost
/// because the query named another one exactly, then a count of what did not fit.
fn one_line_report(f: &guild_domain::operation::ResolveFailure) -> String {
    /// Room in `guild_error_info_t.message`, less its terminator and the tail this adds.
    const ROOM: usize = guild_abi::GUILD_ERROR_MESSAGE_CAPACITY - 1 - 40;
    let text = f.to_string();
    let mut out = text.lines().next().unwrap_or_default().to_owned();
    // The header already gives the reason of an exactly requested candidate.
    let named = match &f.kind {
        FailureKind::ExactImplRejected { impl_id } => Some(impl_id),
        _ => None,
    };
    let (not_exact, own): (Vec<_>, Vec<_>) = f
        .rejections
        .iter()
        .filter(|r| Some(&r.impl_id) != named)
        .partition(|r| r.reason == Rejection::NotExactImpl);
    let mut left = own.len();
    for r in own {
        let line = format!("; {}: {}", r.impl_id, r.reason);
        if out.len() + line.len() > ROOM {
            break;
        }
        out.push_str(&line);
        left -= 1;
    }
    if !not_exact.is_empty() {
        let line = format!(
            "; {} other candidate(s): {}",
            not_exact.len(),
            Rejection::NotExactImpl
        );
        if left == 0 && out.len() + line.len() <= ROOM {
            out.push_str(&line);
        } else {
            left += not_exact.len();
        }
    }
    if left > 0 {
        out.push_str(&format!("; and {left} more candidate(s)"));
    }
    out
}

/// Reads and checks the caller's query.
///
/// # Safety
/// `query` must be NULL or point at a query whose pointers are valid for this call.
unsafe fn read_query<'q>(
    core: &ServiceCore,
    query: *const guild_operation_query_v1_t,
) -> Result<(QuerySpec, &'q [u8]), Failure> {
    if query.is_null() || !query.is_aligned() {
        return Err(Failure::invalid("the query is NULL or misaligned"));
    }
    // SAFETY: non-NULL and aligned; its first field is the caller's size.
    let size = unsafe { query.cast::<u32>().read() };
    if usize::try_from(size).map_or(true, |s| s < size_of::<guild_operation_query_v1_t>()) {
        return Err(Failure::invalid(format!(
            "query.struct_size is {size}, smaller than the {} bytes of query version 1",
            size_of::<guild_operation_query_v1_t>()
        )));
    }
    // SAFETY: the record is at least as large as the struct this host knows.
    let q = unsafe { &*query };
    if q.version != GUILD_OPERATION_QUERY_VERSION {
        return Err(Failure::new(
            guild_abi::GUILD_STATUS_ERR_ABI_MISMATCH,
            format!(
                "query.version is {}, this service reads version {GUILD_OPERATION_QUERY_VERSION}",
                q.version
            ),
        ));
    }
    // SAFETY: by the contract the string is NUL-terminated; the read is bounded anyway.
    let name = unsafe { bounded_str(q.op_name, MAX_DESCRIPTOR_STRING) }
        .map_err(|e| Failure::invalid(format!("query.op_name {e}")))?;
    let op_name = OpName::new(name).map_err(|e| Failure::invalid(format!("query.op_name: {e}")))?;
    let exact_impl = if q.exact_impl_id.is_null() {
        None
    } else {
        // SAFETY: as for op_name.
        let id = unsafe { bounded_str(q.exact_impl_id, MAX_DESCRIPTOR_STRING) }
            .map_err(|e| Failure::invalid(format!("query.exact_impl_id {e}")))?;
        Some(ImplId::new(id).map_err(|e| Failure::invalid(format!("query.exact_impl_id: {e}")))?)
    };
    let sync_mode = SyncMode::from_raw(q.sync_mode).ok_or_else(|| {
        Failure::invalid(format!(
            "query.sync_mode {} is not a GUILD_SYNC_* value",
            q.sync_mode
        ))
    })?;
    // SAFETY: the arrays are the caller's and valid for this call.
    let inputs = unsafe { read_tensors("input", q.inputs, q.input_count) }?;
    // SAFETY: as above.
    let outputs = unsafe { read_tensors("output", q.outputs, q.output_count) }?;
    // SAFETY: NULL or the caller's caps record, valid for this call.
    let device = unsafe { read_device(core, q.device_caps) }?;
    let params: &[u8] = if q.params.is_null() || q.params_size == 0 {
        &[]
    } else if q.params_size > MAX_PARAMS_BYTES {
        return Err(Failure::invalid(format!(
            "query.params_size is {}, above the {MAX_PARAMS_BYTES} bytes this service accepts",
            q.params_size
        )));
    } else {
        // SAFETY: the caller's params record of params_size bytes, borrowed for the call.
        unsafe { std::slice::from_raw_parts(q.params.cast::<u8>(), q.params_size) }
    };
    let spec = QuerySpec {
        op_name,
        min_version: PackedVersion::from_raw(q.min_op_version),
        max_version: PackedVersion::from_raw(q.max_op_version),
        backends: BackendSet::from_bits(q.backends),
        capabilities: Capabilities::from_bits(q.required_capabilities),
        numerics: Numerics::from_bits(q.required_numerics),
        sync_mode,
        inputs,
        outputs,
        ram_budget: Budget::bytes(q.ram_budget),
        vram_budget: Budget::bytes(q.vram_budget),
        exact_impl,
        device,
    };
    Ok((spec, params))
}

/// Copies the caller's tensor array.
///
/// # Safety
/// `tensors` must be NULL or point at `count` readable descriptors.
unsafe fn read_tensors(
    role: &str,
    tensors: *const guild_tensor_desc_v1_t,
    count: usize,
) -> Result<Vec<TensorDesc>, Failure> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if count > MAX_QUERY_TENSORS {
        return Err(Failure::invalid(format!(
            "the query has {count} {role}s, above the {MAX_QUERY_TENSORS} this service accepts"
        )));
    }
    if tensors.is_null() || !tensors.is_aligned() {
        return Err(Failure::invalid(format!(
            "the query's {role} array is NULL or misaligned but its count is {count}"
        )));
    }
    // SAFETY: non-NULL, aligned, and `count` descriptors long by the caller's contract.
    let slice = unsafe { std::slice::from_raw_parts(tensors, count) };
    slice
        .iter()
        .enumerate()
        .map(|(i, t)| tensor_from_c(t).map_err(|e| Failure::invalid(format!("{role} {i}: {e}"))))
        .collect()
}

/// The device a query resolves against: the caller's record, or the host's device 0.
///
/// # Safety
/// `caps` must be NULL or point at a caps record valid for this call.
unsafe fn read_device(
    core: &ServiceCore,
    caps: *const guild_device_caps_v1_t,
) -> Result<DeviceCaps, Failure> {
    let mut device = core.default_device();
    if caps.is_null() {
        return Ok(device);
    }
    if !caps.is_aligned() {
        return Err(Failure::invalid("query.device_caps is misaligned"));
    }
    // SAFETY: non-NULL and aligned; its first field is the caller's size.
    let size = unsafe { caps.cast::<u32>().read() };
    if usize::try_from(size).map_or(true, |s| s < size_of::<guild_device_caps_v1_t>()) {
        return Err(Failure::invalid(format!(
            "device_caps.struct_size is {size}, smaller than the {} bytes of this version",
            size_of::<guild_device_caps_v1_t>()
        )));
    }
    // SAFETY: at least as large as the struct this host knows.
    let c = unsafe { &*caps };
    if !c.next_ext.is_null() {
        return Err(Failure::new(
            GUILD_STATUS_ERR_UNSUPPORTED,
            "device_caps.next_ext must be NULL: operation service version 1 reads no device \
             capability extensions",
        ));
    }
    let backend = Backend::from_bit(c.backend).ok_or_else(|| {
        Failure::invalid(format!(
            "device_caps.backend {:#x} is not exactly one GUILD_BACKEND_* bit",
            c.backend
        ))
    })?;
    device.device_id = c.device_id;
    match backend {
        Backend::Cpu => device.cpu_isa = guild_domain::operation::CpuIsa::from_bits(c.cpu_isa),
        Backend::Cuda => device.cuda_sm = (c.cuda_sm != 0).then_some(c.cuda_sm),
        Backend::Hip => {}
    }
    Ok(device)
}

// ---------------------------------------------------------------------------------------------
// describe, scratch
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn service_describe(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    out_description: *mut guild_op_description_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    guarded(error, "describe", || {
        // SAFETY: NULL or a live handle by the contract; checked inside.
        let h = unsafe { handle_ref(user, handle, "describe") }?;
        let _call = InCall::enter(h, "describe")?;
        // SAFETY: NULL or the caller's record with its size set; checked inside.
        unsafe { check_out_record(out_description, "describe: out_description") }?;
        let r = &h.resolved;
        let d = super::describe(r);
        let operation = r
            .kernel
            .operation()
            .map_or(ptr::null(), |op| op as *const _);
        // SAFETY: checked non-NULL, aligned and large enough; only this version's fields are
        // written, so a larger record from a newer caller keeps its tail.
        unsafe {
            let out = &mut *out_description;
            out.op_version = d.op_version.raw();
            out.impl_id = h.impl_id.as_ptr();
            out.package_id = h.package_id.as_ptr();
            out.op_name = h.op_name.as_ptr();
            out.backend = d.backend.bit();
            out.sync_mode = d.sync_mode.raw();
            out.scratch = scratch_record(r);
            out.kernel_desc = r.kernel.descriptor();
            out.operation = operation;
        }
        Ok(())
    })
}

fn scratch_record(r: &Resolved) -> guild_scratch_request_v1_t {
    guild_scratch_request_v1_t {
        struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
        alignment: r.scratch.alignment,
        host_bytes: r.scratch.host_bytes,
        device_bytes: r.scratch.device_bytes,
    }
}

unsafe extern "C" fn service_scratch(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    out_scratch: *mut guild_scratch_request_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    guarded(error, "scratch", || {
        // SAFETY: NULL or a live handle by the contract; checked inside.
        let h = unsafe { handle_ref(user, handle, "scratch") }?;
        let _call = InCall::enter(h, "scratch")?;
        // SAFETY: NULL or the caller's record with its size set; checked inside.
        unsafe { check_out_record(out_scratch, "scratch: out_scratch") }?;
        let record = scratch_record(&h.resolved);
        // SAFETY: checked non-NULL, aligned and large enough; the caller keeps its own size.
        unsafe {
            let out = &mut *out_scratch;
            out.alignment = record.alignment;
            out.host_bytes = record.host_bytes;
            out.device_bytes = record.device_bytes;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// execute
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn service_execute(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    args: *const guild_execute_args_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    // The caller's error record goes straight to the provider when it is usable, so that a
    // provider's failure reaches the caller as the provider wrote it.
    // SAFETY: NULL or a caller-initialised record valid for this call.
    let caller_record = unsafe { usable_record(error) };
    // Made only when the caller's record cannot be used: it is 584 bytes to clear.
    let mut local: Option<guild_error_info_t> = None;
    let mut provider_status = None;
    let status = guarded(error, "execute", || {
        // SAFETY: NULL or a live handle by the contract; checked inside.
        let h = unsafe { handle_ref(user, handle, "execute") }?;
        let _call = InCall::enter(h, "execute")?;
        if args.is_null() || !args.is_aligned() {
            return Err(Failure::invalid("execute: args is NULL or misaligned"));
        }
        // SAFETY: non-NULL and aligned; its first field is the caller's size.
        let size = unsafe { args.cast::<u32>().read() };
        if usize::try_from(size).map_or(true, |s| s < size_of::<guild_execute_args_v1_t>()) {
            return Err(Failure::invalid(format!(
                "execute: args.struct_size is {size}, smaller than the {} bytes of this version",
                size_of::<guild_execute_args_v1_t>()
            )));
        }
        // SAFETY: at least as large as the struct this host knows.
        let a = unsafe { &*args };
        if a.reserved != 0 {
            return Err(Failure::invalid("execute: args.reserved must be zero"));
        }
        // SAFETY: the arrays are the caller's, valid for this call.
        let inputs = unsafe { tensor_slice(a.inputs, a.input_count, "input") }?;
        // SAFETY: as above.
        let outputs = unsafe { tensor_slice(a.outputs, a.output_count, "output") }?;
        let call = Call {
            inputs,
            outputs,
            scratch_host: a.scratch_host,
            scratch_host_size: a.scratch_host_size,
            scratch_device: a.scratch_device,
            scratch_device_size: a.scratch_device_size,
            stream: a.stream,
            device_id: a.device_id,
            sync_mode: a.sync_mode,
            params: a.params,
            params_size: a.params_size,
        };
        let record = match caller_record {
            // SAFETY: usable_record checked the caller's record; nothing else borrows it now.
            Some(record) => unsafe { &mut *record },
            None => local.insert(guild_error_info_t::new()),
        };
        match h.resolved.execute(&call, record) {
            Ok(()) => Ok(()),
            Err(ExecuteError::Provider(refusal)) => {
                provider_status = Some(refusal.status);
                // The provider reported into the record itself; make sure it says who failed
                // and with which status, as a provider may leave it empty.
                if record.message[0] == 0 {
                    return Err(Failure::new(
                        refusal.status,
                        format!(
                            "{} failed with {} and no message",
                            h.resolved.candidate.impl_id,
                            status_name(refusal.status)
                        ),
                    ));
                }
                record.status = refusal.status;
                Ok(())
            }
            Err(e) => Err(execute_failure(e)),
        }
    });
    match provider_status {
        Some(s) if status == GUILD_STATUS_OK => s,
        _ => status,
    }
}

/// The caller's error record when the provider may write it directly.
///
/// # Safety
/// `error` must be NULL or a caller-initialised record valid for this call.
unsafe fn usable_record(error: *mut guild_error_info_t) -> Option<*mut guild_error_info_t> {
    if error.is_null() || !error.is_aligned() {
        return None;
    }
    // SAFETY: non-NULL and aligned; its first field is the caller's size.
    let size = unsafe { error.cast::<u32>().read() };
    usize::try_from(size)
        .is_ok_and(|s| s >= size_of::<guild_error_info_t>())
        .then_some(error)
}

/// The caller's tensor array as a slice.
///
/// # Safety
/// `tensors` must be NULL or point at `count` readable descriptors valid for this call.
unsafe fn tensor_slice<'a>(
    tensors: *const guild_tensor_desc_v1_t,
    count: usize,
    role: &str,
) -> Result<&'a [guild_tensor_desc_v1_t], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    if tensors.is_null() || !tensors.is_aligned() || count > MAX_QUERY_TENSORS {
        return Err(Failure::invalid(format!(
            "execute: the {role} array is NULL, misaligned or too long ({count} entries)"
        )));
    }
    // SAFETY: non-NULL, aligned, and `count` descriptors long by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(tensors, count) })
}

fn execute_failure(e: ExecuteError) -> Failure {
    let status = match &e {
        ExecuteError::Reentrant => GUILD_STATUS_ERR_BUSY,
        ExecuteError::Stream(_) => GUILD_STATUS_ERR_DEVICE,
        ExecuteError::ScratchTooSmall { .. } | ExecuteError::BufferTooSmall { .. } => {
            GUILD_STATUS_ERR_BUFFER_TOO_SMALL
        }
        ExecuteError::Provider(r) => r.status,
        _ => GUILD_STATUS_ERR_INVALID_ARGUMENT,
    };
    Failure::new(status, format!("execute: {e}"))
}

// ---------------------------------------------------------------------------------------------
// release
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn service_release(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    guarded(error, "release", || {
        if handle.is_null() {
            return Ok(());
        }
        // SAFETY: a live handle by the contract; checked inside.
        let h = unsafe { handle_ref(user, handle, "release") }?;
        if let Err(busy) =
            h.state
                .compare_exchange(0, RELEASED, Ordering::AcqRel, Ordering::Acquire)
        {
            return Err(Failure::new(
                GUILD_STATUS_ERR_BUSY,
                format!(
                    "release: {} call(s) are using the handle; nothing was released",
                    busy & !RELEASED
                ),
            ));
        }
        let waited = h.resolved.finish();
        // SAFETY: the handle is marked released with no call in progress, so this thread owns
        // it; it was made by Box::into_raw in resolve. The tag is cleared so that a second
        // release of the same pointer is likelier to be caught than to free twice.
        let mut boxed = unsafe { Box::from_raw(handle.cast::<CHandle>()) };
        // SAFETY: a plain write to a field of the box this thread owns; volatile so that it is
        // not elided as a dead store before the free.
        unsafe { ptr::write_volatile(&mut boxed.tag, 0) };
        // SAFETY: `h.core` is the live core that made the handle (checked against `user`).
        let core = unsafe { &*boxed.core };
        drop(boxed);
        core.live_c_handles.fetch_sub(1, Ordering::AcqRel);
        waited.map_err(|e| {
            Failure::new(
                GUILD_STATUS_ERR_DEVICE,
                format!("release: waiting for the handle's stream work failed: {e}; the handle is released"),
            )
        })
    })
}
