//! The C face of the operation service: the `guild_operation_service_v1_t` table that plugins
//! receive through their host table and in-process runners get from
//! [`KernelRegistry::operation_api`](crate::registry::KernelRegistry::operation_api).
//!
//! Every entry point checks what it is given before it trusts it (NULL pointers, record sizes
//! and versions, the handle's number against the core's table, strings bounded and UTF-8),
//! converts the caller's
//! records to the domain's types and then runs the same code as the Rust face. A failure fills
//! the caller's `guild_error_info_t` with the status, a component and a one-line message that
//! says what failed; a failed resolution lists every candidate and why it was rejected, as far
//! as the message buffer holds. No panic crosses back into C: each entry point catches one and
//! reports `GUILD_STATUS_ERR_INTERNAL`.
//!
//! A handle is a number that names a slot of the core's handle table (see `handles`), never a
//! pointer: a stale, doubly released or foreign handle is refused with
//! `GUILD_STATUS_ERR_INVALID_ARGUMENT` without reading anything that is not live. The calls in
//! progress on a handle are counted in the slot's gate, so that `release` during a call is
//! refused with `GUILD_STATUS_ERR_BUSY` and releases nothing, decided by one atomic operation.
//!
//! The core has two tables. The one in-process runners get waits its turn when another thread's
//! `execute` holds a handle; the one plugins find in their host table never waits: a call on a
//! busy handle is refused with `GUILD_STATUS_ERR_BUSY`, so providers that call each other's
//! handles from several threads cannot deadlock.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use guild_abi::text::{bounded_str, status_name, write_error_record, MAX_DESCRIPTOR_STRING};
use guild_abi::{
    guild_device_caps_v1_t, guild_error_info_t, guild_execute_args_v1_t, guild_op_description_v1_t,
    guild_op_handle_t, guild_operation_query_v1_t, guild_operation_service_v1_t,
    guild_reshape_args_v1_t, guild_scratch_request_v1_t, guild_status_t, guild_tensor_desc_v1_t,
    GUILD_OPERATION_QUERY_VERSION, GUILD_OPERATION_SERVICE_VERSION,
    GUILD_OP_DESCRIPTION_V1_BASE_SIZE, GUILD_OP_DESCRIPTION_V1_VERSION_SIZE,
    GUILD_STATUS_ERR_BUFFER_TOO_SMALL, GUILD_STATUS_ERR_BUSY, GUILD_STATUS_ERR_DEVICE,
    GUILD_STATUS_ERR_INTERNAL, GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_ERR_NOT_FOUND,
    GUILD_STATUS_ERR_OUT_OF_MEMORY, GUILD_STATUS_ERR_STATE, GUILD_STATUS_ERR_UNSUPPORTED,
    GUILD_STATUS_OK,
};
use guild_domain::ids::{ImplId, OpNameRef};
use guild_domain::operation::{
    Backend, BackendSet, Budget, Capabilities, DeviceCaps, FailureKind, MemorySpace, Numerics,
    OpQuery, QueryRef, Rejection, SyncMode, TensorDesc,
};
use guild_domain::version::PackedVersion;

use super::core::{
    desc_from_c, tensor_from_c, Call, NegotiatedTensors, Negotiation, Resolved, ServiceCore,
};
use super::handles::{HandleName, Refused};
use super::inline::InlineVec;
use super::{ExecuteError, ReshapeError, ResolveError};

/// The component named in the error records the service itself writes.
pub const COMPONENT: &str = "guild.operations";

/// The most tensors one query may carry on either side. Far above any real operation; it bounds
/// what a malformed count can make the host allocate.
pub const MAX_QUERY_TENSORS: usize = 1024;

/// The most parameter bytes one query may carry (the limit the `--params` notation holds to).
pub const MAX_PARAMS_BYTES: usize = guild_domain::params::MAX_RECORD_BYTES;

/// The alignment, in bytes, of every parameter record a provider receives (module_abi.h): the
/// largest of a `uint64_t`'s, a `double`'s and a pointer's on every supported platform, so that
/// a provider may read its record as the C struct it is. The C table refuses a record that is
/// not aligned so; the Rust face copies one that is not into an aligned buffer.
pub const PARAMS_ALIGNMENT: usize = 8;

/// The table every core starts from; the core fills in `user`.
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
        reshape: Some(service_reshape),
    }
}

/// A C handle's data, in its slot of the core's handle table: the resolution itself, boxed
/// by the core. The names its description points at are the stored kernel's, which its
/// binding keeps alive.
pub(crate) type CHandle = Resolved;

/// Which of the core's tables a call came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Face {
    /// An in-process runner's: a busy handle is waited for.
    Runner,
    /// A plugin's, from its host table: a busy handle is refused.
    Plugin,
}

/// The core and the face a table's `user` names; `None` when it is a runner's table whose
/// registry is gone.
///
/// # Safety
/// `user` must be the `user` of one of a core's two tables. A plugin's (the core's address with
/// its lowest bit set) is only callable from the plugin's own code, and the loader keeps the
/// core alive until that library is closed. A runner's is the address of the core's
/// [`RunnerCell`](super::core::RunnerCell), which is never freed and names the core until its
/// registry drops; the runner keeps the registry alive while it calls.
#[inline(always)]
unsafe fn core_of<'c>(user: *mut c_void) -> Option<(&'c ServiceCore, Face)> {
    if user as usize & 1 == 1 {
        let core = user.cast::<u8>().wrapping_sub(1);
        // SAFETY: by the contract, a live core's address with the plugin table's mark.
        return Some((unsafe { &*core.cast::<ServiceCore>() }, Face::Plugin));
    }
    // SAFETY: by the contract, a runner cell, which lives for the rest of the process.
    let cell = unsafe { &*user.cast::<super::core::RunnerCell>() };
    // SAFETY: a non-NULL pointer in the cell is its live core (the registry clears the cell
    // before it lets go of the core, and the runner keeps the registry alive while it calls).
    cell.core().map(|core| (unsafe { &*core }, Face::Runner))
}

/// The core, refused with `GUILD_STATUS_ERR_STATE` once its registry is gone.
///
/// # Safety
/// As for [`core_of`].
#[inline(always)]
unsafe fn open_core<'c>(
    user: *mut c_void,
    entry: &str,
) -> Result<(&'c ServiceCore, Face), Failure> {
    // SAFETY: the caller's contract.
    match unsafe { core_of(user) } {
        Some((core, face)) if !core.is_closed() => Ok((core, face)),
        _ => Err(destroyed(entry)),
    }
}

#[cold]
fn destroyed(entry: &str) -> Failure {
    Failure::new(
        GUILD_STATUS_ERR_STATE,
        format!("{entry}: the registry of this operation service was destroyed"),
    )
}

/// The slot a caller's handle names, or why it names none of this core's.
#[inline(always)]
fn name_of(
    core: &ServiceCore,
    handle: *mut guild_op_handle_t,
    entry: &str,
) -> Result<HandleName, Failure> {
    // NULL decodes to no slot (index 0 is never issued), so it needs no test of its own.
    match core.handles.decode(handle as usize as u64) {
        Some(name) => Ok(name),
        None => Err(not_a_handle(handle, entry)),
    }
}

#[cold]
fn not_a_handle(handle: *mut guild_op_handle_t, entry: &str) -> Failure {
    if handle.is_null() {
        return Failure::invalid(format!("{entry}: the handle is NULL"));
    }
    Failure::invalid(format!(
        "{entry}: the handle was not issued by this operation service"
    ))
}

/// The status and message of a handle the gate refused. Once the registry is gone, a handle that
/// is no longer live may have been released with it, so that is what the caller is told.
#[cold]
fn refused(core: &ServiceCore, entry: &str, why: Refused) -> Failure {
    match why {
        Refused::Stale if core.is_closed() => Failure::new(
            GUILD_STATUS_ERR_STATE,
            format!(
                "{entry}: the registry of this operation service was destroyed, and its idle \
                 handles were released with it"
            ),
        ),
        Refused::Stale => Failure::invalid(format!(
            "{entry}: the handle is not live (it was released, or never issued by this service)"
        )),
        Refused::Busy => Failure::new(
            GUILD_STATUS_ERR_BUSY,
            format!(
                "{entry}: another call is using the handle (calls through a plugin's service \
                 table never wait for one)"
            ),
        ),
        Refused::Reentrant => Failure::new(
            GUILD_STATUS_ERR_BUSY,
            format!("{entry}: this thread is already inside a call on the handle"),
        ),
        Refused::InUse(calls) => Failure::new(
            GUILD_STATUS_ERR_BUSY,
            format!("{entry}: {calls} call(s) are using the handle; nothing was released"),
        ),
    }
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

/// Checks a caller-provided output record's `struct_size`.
///
/// # Safety
/// `record` must be NULL or point at a record whose first field is a `uint32_t struct_size`.
unsafe fn check_out_record<T>(record: *mut T, what: &str) -> Result<(), Failure> {
    // SAFETY: the caller's contract.
    unsafe { check_out_record_of(record, size_of::<T>(), what) }.map(drop)
}

/// [`check_out_record`] for a record that grew by appending: at least `smallest` bytes, the size
/// of its first version. Answers the caller's size, which says which tail fields it has room for.
///
/// # Safety
/// As for [`check_out_record`].
unsafe fn check_out_record_of<T>(
    record: *mut T,
    smallest: usize,
    what: &str,
) -> Result<usize, Failure> {
    if record.is_null() || !record.is_aligned() {
        return Err(Failure::invalid(format!("{what} is NULL or misaligned")));
    }
    // SAFETY: non-NULL and aligned; by the contract its first field is the caller's size.
    let size = unsafe { record.cast::<u32>().read() };
    match usize::try_from(size) {
        Ok(s) if s >= smallest => Ok(s),
        _ => Err(Failure::invalid(format!(
            "{what}.struct_size is {size}, smaller than the {smallest} bytes of its first version"
        ))),
    }
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
        // SAFETY: a table's `user`, whose core its holder keeps alive (the service's contract).
        let (core, face) = unsafe { open_core(user, "resolve") }?;
        // SAFETY: the caller's query and everything it points at are valid for this call.
        let mut buffers = QueryBuffers::default();
        // SAFETY: as above.
        let (spec, args) = unsafe { read_query(core, query, &mut buffers) }?;
        let query = OpQuery::new(spec).map_err(|e| Failure::invalid(e.to_string()))?;
        let mut resolved = core.resolve(&query, args, false).map_err(|e| {
            // A registry being destroyed empties its snapshot; say so rather than "not found".
            if core.is_closed() {
                Failure::new(
                    GUILD_STATUS_ERR_STATE,
                    "resolve: the registry of this operation service was destroyed",
                )
            } else {
                resolve_failure(e)
            }
        })?;
        // Counted before it can be released (a release uncounts it), so the runner's count
        // never reads low.
        if face == Face::Runner {
            core.count_runner_handle(&mut resolved);
        }
        let counted = resolved.through_runner;
        let number = core.handles.insert(resolved).map_err(|_| {
            if counted {
                core.runner_handles
                    .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            }
            Failure::new(
                GUILD_STATUS_ERR_OUT_OF_MEMORY,
                "resolve: this service already holds the most live handles it can name",
            )
        })?;
        // A registry that closed while this call resolved has already released its idle
        // handles; one inserted after that must not outlive it (its binding would keep the
        // core alive for ever). Closing happens before the release of idle handles, which
        // takes the table's lock that `insert` took, so this load sees it.
        if core.is_closed() {
            if let Some(name) = core.handles.decode(number) {
                if let Ok(handle) = core.handles.remove(name) {
                    core.let_go(&handle);
                }
            }
            return Err(destroyed("resolve"));
        }
        // SAFETY: checked above; the handle is the caller's until it releases it. Its value is
        // a number, not an address: nothing but this service ever reads through it.
        unsafe { out_handle.write(ptr::without_provenance_mut(number as usize)) };
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

/// How many tensors, inputs and outputs together, a C query is read into without an
/// allocation.
const INLINE_QUERY_TENSORS: usize = 8;

/// What a C query is read into besides the caller's own memory: the domain's form of its
/// tensors, inputs then outputs (in place when there are few), and its exact id. The name is
/// borrowed from the caller's text. One array for both sides: with two, the compiler cleared
/// everything between their two headers (the first array's unwritten places) in one `memset`.
#[derive(Default)]
struct QueryBuffers {
    tensors: InlineVec<TensorDesc, INLINE_QUERY_TENSORS>,
    exact_impl: Option<ImplId>,
}

/// Reads and checks the caller's query, into `buffers` where it is not borrowed.
///
/// # Safety
/// `query` must be NULL or point at a query whose pointers are valid for `'q`.
unsafe fn read_query<'q: 'b, 'b>(
    core: &ServiceCore,
    query: *const guild_operation_query_v1_t,
    buffers: &'b mut QueryBuffers,
) -> Result<(QueryRef<'b>, Negotiation<'q>), Failure> {
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
    let op_name =
        OpNameRef::new(name).map_err(|e| Failure::invalid(format!("query.op_name: {e}")))?;
    buffers.exact_impl = if q.exact_impl_id.is_null() {
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
    let c_inputs = unsafe { read_tensors("input", q.inputs, q.input_count, &mut buffers.tensors) }?;
    // SAFETY: as above.
    let c_outputs =
        unsafe { read_tensors("output", q.outputs, q.output_count, &mut buffers.tensors) }?;
    let buffers: &'b QueryBuffers = buffers;
    // As many inputs as the caller's array has were read first.
    let (inputs, outputs) = buffers
        .tensors
        .split_at(c_inputs.len().min(buffers.tensors.len()));
    // SAFETY: NULL or the caller's caps record, valid for this call.
    let device = unsafe { read_device(core, q.device_caps) }?;
    // SAFETY: the caller's params record, valid for this call.
    let params = unsafe { read_params(q.params, q.params_size, "query") }?;
    let spec = QueryRef {
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
        exact_impl: buffers.exact_impl.as_ref(),
        device,
    };
    let args = Negotiation {
        params,
        tensors: NegotiatedTensors::Caller([c_inputs, c_outputs]),
    };
    Ok((spec, args))
}

/// The caller's parameter record as bytes (empty when NULL or of size 0).
///
/// # Safety
/// `params` must be NULL or point at `size` readable bytes valid for `'a`.
unsafe fn read_params<'a>(
    params: *const c_void,
    size: usize,
    record: &str,
) -> Result<&'a [u8], Failure> {
    if size == 0 {
        return Ok(&[]);
    }
    if params.is_null() {
        return Err(null_params(record, size));
    }
    if !(params as usize).is_multiple_of(PARAMS_ALIGNMENT) {
        return Err(misaligned_params(record, params));
    }
    if size > MAX_PARAMS_BYTES {
        return Err(Failure::invalid(format!(
            "{record}.params_size is {size}, above the {MAX_PARAMS_BYTES} bytes this service \
             accepts"
        )));
    }
    // SAFETY: the caller's params record of `size` bytes, borrowed for the call.
    Ok(unsafe { std::slice::from_raw_parts(params.cast::<u8>(), size) })
}

/// The refusal of a NULL parameter record that claims `size` bytes (NULL goes with 0).
#[cold]
fn null_params(record: &str, size: usize) -> Failure {
    Failure::invalid(format!(
        "{record}.params is NULL but params_size is {size}; pass NULL with 0 for no record"
    ))
}

/// The refusal of a parameter record at `params`, which is not aligned to [`PARAMS_ALIGNMENT`].
#[cold]
fn misaligned_params(record: &str, params: *const c_void) -> Failure {
    Failure::invalid(format!(
        "{record}.params at {params:p} is not aligned to {PARAMS_ALIGNMENT} bytes, the \
         alignment module_abi.h promises providers"
    ))
}

/// Copies the caller's tensor array into `out` (in place when it is short), and gives it back
/// as a slice for the negotiation callbacks.
///
/// # Safety
/// `tensors` must be NULL or point at `count` readable descriptors that stay valid for `'q`.
// Inlined, as `read_device` is: a result returned through memory was read back with loads
// that straddled the stores that wrote it, which the processor cannot forward.
#[inline(always)]
unsafe fn read_tensors<'q>(
    role: &str,
    tensors: *const guild_tensor_desc_v1_t,
    count: usize,
    out: &mut InlineVec<TensorDesc, INLINE_QUERY_TENSORS>,
) -> Result<&'q [guild_tensor_desc_v1_t], Failure> {
    // SAFETY: the caller's contract, as this function's.
    let slice = unsafe { tensor_array(role, tensors, count) }?;
    for (i, t) in slice.iter().enumerate() {
        let Some(memory_space) = MemorySpace::from_bit(t.memory_space) else {
            return Err(bad_c_tensor(role, i, t));
        };
        out.push(desc_from_c(t, memory_space));
    }
    Ok(slice)
}

/// The caller's array of `count` tensors of `role` as a slice: empty for none, refused when
/// there are more than [`MAX_QUERY_TENSORS`] or the array is NULL or misaligned.
///
/// # Safety
/// As for [`read_tensors`].
#[inline(always)]
unsafe fn tensor_array<'q>(
    role: &str,
    tensors: *const guild_tensor_desc_v1_t,
    count: usize,
) -> Result<&'q [guild_tensor_desc_v1_t], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    if count > MAX_QUERY_TENSORS {
        return Err(too_many_tensors(role, count));
    }
    if tensors.is_null() || !tensors.is_aligned() {
        return Err(no_tensor_array(role, count));
    }
    // SAFETY: non-NULL, aligned, and `count` descriptors long by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(tensors, count) })
}

/// The refusal of a query with more than [`MAX_QUERY_TENSORS`] tensors of `role`.
#[cold]
fn too_many_tensors(role: &str, count: usize) -> Failure {
    Failure::invalid(format!(
        "the query has {count} {role}s, above the {MAX_QUERY_TENSORS} this service accepts"
    ))
}

/// The refusal of a query whose array of `count` tensors of `role` is NULL or misaligned.
#[cold]
fn no_tensor_array(role: &str, count: usize) -> Failure {
    Failure::invalid(format!(
        "the query's {role} array is NULL or misaligned but its count is {count}"
    ))
}

/// Reads the caller's tensor array into `out` when it holds as many tensors (a reshape's spare
/// descriptors, laid out for the handle's), and gives it back as a slice; of another count,
/// only checks that each tensor has a domain form.
///
/// # Safety
/// As for [`read_tensors`].
#[inline(always)]
unsafe fn read_tensors_into<'q>(
    role: &str,
    tensors: *const guild_tensor_desc_v1_t,
    count: usize,
    out: &mut [TensorDesc],
) -> Result<&'q [guild_tensor_desc_v1_t], Failure> {
    // SAFETY: the caller's contract, as this function's.
    let slice = unsafe { tensor_array(role, tensors, count) }?;
    if out.len() == count {
        // A reshape's buffers hold as many as the handle has: each read into its slot.
        for (i, (slot, t)) in out.iter_mut().zip(slice).enumerate() {
            let Some(memory_space) = MemorySpace::from_bit(t.memory_space) else {
                return Err(bad_c_tensor(role, i, t));
            };
            *slot = desc_from_c(t, memory_space);
        }
        return Ok(slice);
    }
    // Another count than the handle's, which the reshape refuses once both arrays are read:
    // each tensor is still read, so that one without a domain form is reported first.
    for (i, t) in slice.iter().enumerate() {
        if MemorySpace::from_bit(t.memory_space).is_none() {
            return Err(bad_c_tensor(role, i, t));
        }
    }
    Ok(slice)
}

/// Why the caller's tensor `i` of `role` has no domain form.
#[cold]
fn bad_c_tensor(role: &str, i: usize, t: &guild_tensor_desc_v1_t) -> Failure {
    let why = tensor_from_c(t).err().unwrap_or_default();
    Failure::invalid(format!("{role} {i}: {why}"))
}

/// The device a query resolves against: the caller's record, or the host's device 0.
///
/// # Safety
/// `caps` must be NULL or point at a caps record valid for this call.
#[inline]
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
        // SAFETY: a table's `user`, whose core its holder keeps alive (the service's contract).
        let (core, _) = unsafe { open_core(user, "describe") }?;
        let name = name_of(core, handle, "describe")?;
        // SAFETY: NULL or the caller's record with its size set; checked inside. A caller built
        // against SDK 1.5 passes the record without its package_version tail.
        let size = unsafe {
            check_out_record_of(
                out_description,
                GUILD_OP_DESCRIPTION_V1_BASE_SIZE,
                "describe: out_description",
            )
        }?;
        core.handles
            .with_shared(name, |h| {
                let r = h;
                let d = super::describe(r, r.published_scratch());
                let operation = r
                    .kernel()
                    .operation()
                    .map_or(ptr::null(), |op| op as *const _);
                // SAFETY: checked non-NULL, aligned and large enough; only this version's
                // fields are written, so a larger record from a newer caller keeps its tail.
                // The strings live in the handle until it is released.
                unsafe {
                    let out = &mut *out_description;
                    out.op_version = d.op_version.raw();
                    let names = h.binding.c_names();
                    out.impl_id = names.impl_id.as_ptr();
                    out.package_id = names.package_id.as_ptr();
                    out.op_name = names.op_name.as_ptr();
                    out.backend = d.backend.bit();
                    out.sync_mode = d.sync_mode.raw();
                    out.scratch = scratch_record(d.scratch);
                    out.kernel_desc = r
                        .kernel()
                        .descriptor()
                        .map_or(ptr::null(), |k| k as *const _);
                    out.operation = operation;
                    if size >= GUILD_OP_DESCRIPTION_V1_VERSION_SIZE {
                        out.package_version = names.package_version.as_ptr();
                    }
                }
            })
            .map_err(|why| refused(core, "describe", why))
    })
}

fn scratch_record(scratch: super::Scratch) -> guild_scratch_request_v1_t {
    guild_scratch_request_v1_t {
        struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
        alignment: scratch.alignment,
        host_bytes: scratch.host_bytes,
        device_bytes: scratch.device_bytes,
    }
}

unsafe extern "C" fn service_scratch(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    out_scratch: *mut guild_scratch_request_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    guarded(error, "scratch", || {
        // SAFETY: a table's `user`, whose core its holder keeps alive (the service's contract).
        let (core, _) = unsafe { open_core(user, "scratch") }?;
        let name = name_of(core, handle, "scratch")?;
        // SAFETY: NULL or the caller's record with its size set; checked inside.
        unsafe { check_out_record(out_scratch, "scratch: out_scratch") }?;
        let record = core
            .handles
            .with_shared(name, |h| scratch_record(h.published_scratch()))
            .map_err(|why| refused(core, "scratch", why))?;
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
    // The success path builds nothing and moves nothing but the status: a failure is reported
    // (and its text made) only once it has happened, out of line, where it is found.
    // SAFETY: the service's contract for every argument, passed on as they are.
    match catch_unwind(AssertUnwindSafe(|| unsafe {
        execute_checked(user, handle, args, error)
    })) {
        Ok(status) => status,
        Err(_) => report(
            error,
            Failure::new(
                GUILD_STATUS_ERR_INTERNAL,
                "the host panicked in execute; this is a bug in the host",
            ),
        ),
    }
}

/// Fills the caller's error record with a failure and returns its status.
#[cold]
#[inline(never)]
fn report(error: *mut guild_error_info_t, failure: Failure) -> guild_status_t {
    // SAFETY: the service's contract makes `error` NULL or a caller-initialised record valid
    // for this call; write_error_record checks NULL, alignment and struct_size itself.
    unsafe { write_error_record(error, failure.status, COMPONENT, &failure.message) };
    failure.status
}

/// The value of a `Result` whose failure is reported into the caller's record (returning its
/// status from the enclosing function).
macro_rules! or_report {
    ($result:expr, $error:expr) => {
        match $result {
            Ok(value) => value,
            Err(failure) => return report($error, failure),
        }
    };
}

/// `execute` once the call is known not to panic: the status to return (the provider's own,
/// with its report in the caller's record, when it failed; the service's, reported into the
/// record, when the call was refused).
///
/// # Safety
/// The service's contract for each argument.
#[inline(always)]
unsafe fn execute_checked(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    args: *const guild_execute_args_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    // SAFETY: a table's `user`, whose core its holder keeps alive (the service's contract).
    let (core, face) = or_report!(unsafe { open_core(user, "execute") }, error);
    let name = or_report!(name_of(core, handle, "execute"), error);
    if !aligned_non_null(args) {
        return report(error, bad_args(0, false));
    }
    // SAFETY: non-NULL and aligned; its first field is the caller's size.
    let size = unsafe { args.cast::<u32>().read() };
    if (size as usize) < size_of::<guild_execute_args_v1_t>() {
        return report(error, bad_args(size, true));
    }
    // SAFETY: at least as large as the struct this host knows.
    let a = unsafe { &*args };
    if a.reserved != 0 {
        return report(error, bad_args(size, false));
    }
    if a.params_size != 0 {
        if a.params.is_null() {
            return report(error, null_params("execute: args", a.params_size));
        }
        if !(a.params as usize).is_multiple_of(PARAMS_ALIGNMENT) {
            return report(error, misaligned_params("execute: args", a.params));
        }
    }
    // SAFETY: the arrays are the caller's, valid for this call.
    let inputs = or_report!(
        unsafe { tensor_slice(a.inputs, a.input_count, "input") },
        error
    );
    // SAFETY: as above.
    let outputs = or_report!(
        unsafe { tensor_slice(a.outputs, a.output_count, "output") },
        error
    );
    let call = Call {
        args: a,
        inputs,
        outputs,
    };
    // SAFETY: NULL or a caller-initialised record valid for this call.
    let record = match unsafe { usable_record(error) } {
        // SAFETY: checked by usable_record; nothing else borrows it during the call.
        Some(record) => unsafe { &mut *record },
        None => return run_with_local_record(core, face, name, call, error),
    };
    run_checked::<false>(core, face, name, &call, record, error)
}

/// The provider receives a local record (584 bytes to clear) only when the caller's is not
/// usable; out of line, so that the common path's frame does not hold one. The call is taken
/// by value, so that the common path never needs it in memory.
#[cold]
#[inline(never)]
fn run_with_local_record(
    core: &ServiceCore,
    face: Face,
    name: HandleName,
    call: Call<'_>,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    let mut local = guild_error_info_t::new();
    run_checked::<true>(core, face, name, &call, &mut local, error)
}

/// Takes the handle and runs the checked call with `record` as the provider's error record;
/// a refusal is reported into `error`, the caller's record. `LOCAL`: `record` is the service's
/// own, because the caller's is not usable; a provider's report in it then goes to the core's
/// sink for unread failures.
#[inline(always)]
fn run_checked<const LOCAL: bool>(
    core: &ServiceCore,
    face: Face,
    name: HandleName,
    call: &Call<'_>,
    record: &mut guild_error_info_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    let entered = match core.handles.enter_running(name, face == Face::Runner) {
        Ok(entered) => entered,
        Err(why) => return report(error, refused(core, "execute", why)),
    };
    let h = entered.data();
    // SAFETY: `entered` holds the exclusivity of this very handle's gate; the record is the
    // caller's (or a local), not one of the handle's cells; the caller vouches for the memory
    // its tensors and scratch name (the service's contract).
    match unsafe { h.execute(entered.running(), call, record) } {
        Ok(()) => GUILD_STATUS_OK,
        Err(e) => {
            let status = or_report!(provider_or_failure(h, e, record), error);
            if LOCAL {
                core.deliver_unread(h, record);
            }
            status
        }
    }
}

/// Why execute's args record was refused: NULL or misaligned (`size` 0), too small, or with
/// its reserved field set.
#[cold]
fn bad_args(size: u32, small: bool) -> Failure {
    if small {
        return Failure::invalid(format!(
            "execute: args.struct_size is {size}, smaller than the {} bytes of this version",
            size_of::<guild_execute_args_v1_t>()
        ));
    }
    if size == 0 {
        return Failure::invalid("execute: args is NULL or misaligned");
    }
    Failure::invalid("execute: args.reserved must be zero")
}

/// A failed execute: the provider's status when the provider failed (its report is in the
/// record, completed here if it left it empty), else the service's failure.
#[cold]
fn provider_or_failure(
    h: &CHandle,
    e: ExecuteError,
    record: &mut guild_error_info_t,
) -> Result<guild_status_t, Failure> {
    let ExecuteError::Provider(refusal) = e else {
        return Err(execute_failure(e));
    };
    // The provider reported into the record itself; make sure it says who failed and with
    // which status, as a provider may leave it empty.
    if record.message[0] == 0 {
        return Err(Failure::new(
            refusal.status,
            format!(
                "{} failed with {} and no message",
                h.candidate().impl_id,
                status_name(refusal.status)
            ),
        ));
    }
    record.status = refusal.status;
    Ok(refusal.status)
}

/// The caller's error record when the provider may write it directly.
///
/// # Safety
/// `error` must be NULL or a caller-initialised record valid for this call.
#[inline(always)]
unsafe fn usable_record(error: *mut guild_error_info_t) -> Option<*mut guild_error_info_t> {
    if !aligned_non_null(error.cast_const()) {
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
#[inline(always)]
unsafe fn tensor_slice<'a>(
    tensors: *const guild_tensor_desc_v1_t,
    count: usize,
    role: &str,
) -> Result<&'a [guild_tensor_desc_v1_t], Failure> {
    // One branch for the common case: 1 to MAX_QUERY_TENSORS descriptors at a non-NULL,
    // aligned address. An empty array (any address) is settled out of line.
    if (count.wrapping_sub(1) < MAX_QUERY_TENSORS) & aligned_non_null(tensors) {
        // SAFETY: non-NULL, aligned, and `count` descriptors long by the caller's contract.
        return Ok(unsafe { std::slice::from_raw_parts(tensors, count) });
    }
    empty_or_bad_array(role, count)
}

/// An empty array, or why a non-empty one was refused.
#[cold]
#[inline(never)]
fn empty_or_bad_array<'a>(
    role: &str,
    count: usize,
) -> Result<&'a [guild_tensor_desc_v1_t], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    Err(bad_array(role, count))
}

/// Whether `p` is non-NULL and aligned for `T`, with one comparison: rotated right by the
/// alignment's bits, an aligned non-NULL address is a number from 1 to `usize::MAX >> bits`,
/// NULL is 0 and a misaligned address has its low bits on top, above that range.
#[inline(always)]
fn aligned_non_null<T>(p: *const T) -> bool {
    let bits = align_of::<T>().trailing_zeros();
    (p as usize).rotate_right(bits).wrapping_sub(1) < usize::MAX >> bits
}

#[cold]
fn bad_array(role: &str, count: usize) -> Failure {
    Failure::invalid(format!(
        "execute: the {role} array is NULL, misaligned or too long ({count} entries)"
    ))
}

#[cold]
fn execute_failure(e: ExecuteError) -> Failure {
    let status = match &e {
        ExecuteError::Reentrant => GUILD_STATUS_ERR_BUSY,
        ExecuteError::Stream(_) => GUILD_STATUS_ERR_DEVICE,
        ExecuteError::MissingCpuIsa { .. } => GUILD_STATUS_ERR_UNSUPPORTED,
        ExecuteError::ScratchTooSmall { .. } | ExecuteError::BufferTooSmall { .. } => {
            GUILD_STATUS_ERR_BUFFER_TOO_SMALL
        }
        ExecuteError::Provider(r) => r.status,
        _ => GUILD_STATUS_ERR_INVALID_ARGUMENT,
    };
    Failure::new(status, format!("execute: {e}"))
}

// ---------------------------------------------------------------------------------------------
// reshape
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn service_reshape(
    user: *mut c_void,
    handle: *mut guild_op_handle_t,
    args: *const guild_reshape_args_v1_t,
    error: *mut guild_error_info_t,
) -> guild_status_t {
    guarded(error, "reshape", || {
        // SAFETY: a table's `user`, whose core its holder keeps alive (the service's contract).
        let (core, face) = unsafe { open_core(user, "reshape") }?;
        let name = name_of(core, handle, "reshape")?;
        if args.is_null() || !args.is_aligned() {
            return Err(Failure::invalid("reshape: args is NULL or misaligned"));
        }
        // SAFETY: non-NULL and aligned; its first field is the caller's size.
        let size = unsafe { args.cast::<u32>().read() };
        if (size as usize) < size_of::<guild_reshape_args_v1_t>() {
            return Err(Failure::invalid(format!(
                "reshape: args.struct_size is {size}, smaller than the {} bytes of this version",
                size_of::<guild_reshape_args_v1_t>()
            )));
        }
        // SAFETY: at least as large as the struct this host knows.
        let a = unsafe { &*args };
        if a.reserved != 0 {
            return Err(Failure::invalid("reshape: args.reserved must be zero"));
        }
        // SAFETY: the caller's params record, valid for this call.
        let params = unsafe { read_params(a.params, a.params_size, "reshape: args") }?;
        core.handles
            .with_running(name, face == Face::Runner, |h, running| {
                let r = h;
                // SAFETY: `running` is this handle's exclusivity: no execute or other reshape
                // of it runs, so its reshape cells and contract are this call's. The caller's
                // arrays are valid for this call.
                let read = unsafe {
                    r.read_reshape(|inputs, outputs| {
                        let c_inputs = read_tensors_into("input", a.inputs, a.input_count, inputs)?;
                        let c_outputs =
                            read_tensors_into("output", a.outputs, a.output_count, outputs)?;
                        Ok([c_inputs, c_outputs])
                    })
                }?;
                // The caller's own arrays go to the provider's callbacks as they are.
                // SAFETY: as above.
                let renegotiated = unsafe { r.renegotiate_read(read, params) };
                renegotiated.map_err(|e| reshape_failure(r, e))?;
                // SAFETY: as above.
                unsafe { r.install(running) };
                Ok(())
            })
            .map_err(|why| refused(core, "reshape", why))?
    })
}

/// The status and message of a refused reshape.
fn reshape_failure(r: &Resolved, e: ReshapeError) -> Failure {
    let status = match &e {
        ReshapeError::Refused(Rejection::ValidateRefused(p) | Rejection::ScratchRefused(p)) => {
            p.status
        }
        ReshapeError::Refused(Rejection::OverBudget { .. }) => GUILD_STATUS_ERR_OUT_OF_MEMORY,
        ReshapeError::Refused(_) => GUILD_STATUS_ERR_UNSUPPORTED,
        _ => GUILD_STATUS_ERR_INVALID_ARGUMENT,
    };
    Failure::new(
        status,
        format!("reshape: {e} ({} keeps its shapes)", r.candidate().impl_id),
    )
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
        // SAFETY: a table's `user`, whose core its holder keeps alive (the service's contract).
        // A closed core still lets go of what it is given.
        let (core, _) = unsafe { core_of(user) }.ok_or_else(|| destroyed("release"))?;
        let name = name_of(core, handle, "release")?;
        let mut boxed = core
            .handles
            .remove(name)
            .map_err(|why| refused(core, "release", why))?;
        core.let_go(&boxed);
        let waited = boxed.finish();
        drop(boxed);
        waited.map_err(|e| {
            Failure::new(
                GUILD_STATUS_ERR_DEVICE,
                format!("release: waiting for the handle's stream work failed: {e}; the handle is released"),
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_usable_when_it_is_not_null_and_aligned() {
        let usable = |address: usize| aligned_non_null(address as *const u64);
        assert!(!usable(0));
        assert!(usable(8) && usable(16) && usable(usize::MAX - 7));
        for misaligned in [1, 4, 7, 9, usize::MAX, usize::MAX - 3] {
            assert!(!usable(misaligned), "{misaligned:#x}");
        }
        // Alignment 1: anything but NULL.
        assert!(!aligned_non_null(std::ptr::null::<u8>()));
        assert!(aligned_non_null(std::ptr::dangling::<u8>()));
        assert!(aligned_non_null(usize::MAX as *const u8));
    }
}
