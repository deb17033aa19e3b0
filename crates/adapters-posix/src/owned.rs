//! The host's own copies of what a plugin registers: a kernel or runner descriptor, its strings
//! and the extensions of its `next_ext` chain, checked and copied inside `register_kernel` /
//! `register_runner` so that nothing the host keeps points into `init`'s stack.
//!
//! A copied descriptor is a `#[repr(C)]` struct like the plugin's, with every pointer the host
//! copied (strings, extensions, a PFKE table, a CDM1 Qwen group) rewritten to point into memory
//! the copy owns. The app can therefore hand [`OwnedKernel::descriptor`] and
//! [`OwnedKernel::operation`] to C code (the operation service's `describe` does) exactly as if
//! they were the plugin's originals.
//!
//! The app reaches both types only through the port's provider interface
//! ([`KernelProvider`], [`RunnerProvider`]), which they implement here: the GOP1 calls are
//! forwarded to the plugin's callbacks, with the C structs the host vouched for passed on as they
//! are, and the extension tables are lent as the negotiation left them.
//!
//! What is copied and what is refused:
//! - The descriptor's `struct_size` must cover the whole v1 struct and its `abi_version` must be
//!   of this host's major; fields appended by a newer minor are not read.
//! - Ids must be valid domain ids; every string is read with a bound and checked as UTF-8.
//! - The chain is walked with a length bound and a cycle check. Each extension must be at least
//!   as large as an extension header; PFKE and CDMQ, which are never chain extensions, are
//!   refused there.
//! - Every extension this host consumes is negotiated by the one mechanism of
//!   [`extensions`](crate::extensions): placement first (GOP1 on `GUILD_OP_CUSTOM` kernels, CPE1
//!   on `GUILD_OP_BATCHED_EXPERT_EXEC` CPU kernels, CDD1/CDA1/CDM1 on CUDA kernels, RMD1 on
//!   runners), at most one of each tag, then version, size and callbacks. Any other tag is
//!   skipped, as the ABI's growth rules ask, and left out of the copied chain (it is never read,
//!   so it cannot be left dangling); the skipped tags are kept for diagnostics.
//! - A `GUILD_OP_CUSTOM` kernel must name a valid operation and carry a GOP1 whose contract
//!   passes the domain's own check; a `GUILD_OP_PREFILL_KERNELS` kernel must carry a PFKE table
//!   in `kernel_fns`, negotiated like the others behind its own 12-byte header.
//! - A refusal caused by an extension carries a typed [`ExtensionRefusal`] naming the kernel or
//!   runner, where the extension was, its tag and what was wrong.
//!
//! Registration of a descriptor is not a promise of execution: the copies say what a plugin
//! offers and that it is well formed, nothing more.

use std::ffi::{c_char, c_void, CStr, CString};
use std::fmt;
use std::ptr;
use std::sync::Arc;

use guild_abi::{
    guild_abi_version_major, guild_cpu_backend_ext_v2_t, guild_cuda_attn_ext_v1_t,
    guild_cuda_dense_ext_v1_t, guild_cuda_moe_ext_v1_t, guild_cuda_qwen_group_v1_t,
    guild_error_info_t, guild_execute_args_v1_t, guild_ext_header_t, guild_kernel_op_desc_v1_t,
    guild_operation_ext_v1_t, guild_operation_query_v1_t, guild_prefill_ext_header_t,
    guild_prefill_kernel_ext_v1_t, guild_runner_desc_v1_t, guild_runner_model_ext_v1_t,
    guild_scratch_request_v1_t, guild_status_t, GUILD_CPU_EXPERT_TAG, GUILD_CUDA_ATTN_TAG,
    GUILD_CUDA_DENSE_TAG, GUILD_CUDA_MOE_TAG, GUILD_CUDA_QWEN_TAG, GUILD_GOP1_TAG,
    GUILD_KERNEL_ABI_VERSION, GUILD_OP_CUSTOM, GUILD_OP_PREFILL_KERNELS, GUILD_PFKE_TAG,
    GUILD_RMD1_TAG, GUILD_STATUS_ERR_ABI_MISMATCH, GUILD_STATUS_ERR_INVALID_ARGUMENT,
};
use guild_domain::ids::{ImplId, OpName, RunnerId};
use guild_domain::operation::{
    Arity, Backend, Capabilities, CpuIsa, DType, LayoutSet, MemorySpaceSet, Numerics, OpCandidate,
    SyncModeSet,
};
use guild_domain::version::PackedVersion;
use guild_ports::loader::{
    ExtensionProblem, ExtensionRefusal, ExtensionSite, ExtensionTag, RegisteredKernel,
    RegisteredRunner, Registrant,
};
use guild_ports::provider::{
    no_operation, ExecuteCall, ExecuteEntry, ExtensionTable, KernelProvider, QueryCall,
    RunnerProvider,
};

use crate::extensions::{
    check_and_copy, contract_for, AbiTable, ExtensionCopy, Holder, PFKE_CONTRACT,
};

use crate::heap::HeapCStr;
use guild_abi::text::{bounded_str, tag_text, MAX_DESCRIPTOR_STRING};

/// The most extensions a `next_ext` chain may hold. Real chains hold one or two; the bound turns
/// a corrupt chain that never ends into a refusal.
pub const MAX_CHAIN_LENGTH: usize = 64;

/// A registration the host refused: the status returned to the plugin, the reason the load
/// reports, and its typed form when an extension was at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: guild_status_t,
    pub reason: String,
    pub extension: Option<Box<ExtensionRefusal>>,
}

impl Refusal {
    pub(crate) fn new(status: guild_status_t, reason: impl Into<String>) -> Self {
        Refusal {
            status,
            reason: reason.into(),
            extension: None,
        }
    }

    fn invalid(reason: impl Into<String>) -> Self {
        Refusal::new(GUILD_STATUS_ERR_INVALID_ARGUMENT, reason)
    }

    fn extension(refusal: ExtensionRefusal) -> Self {
        Refusal {
            status: GUILD_STATUS_ERR_INVALID_ARGUMENT,
            reason: refusal.to_string(),
            extension: Some(Box::new(refusal)),
        }
    }
}

/// An extension problem before the registrant is attached: where, which tag, what.
type Fault = (ExtensionSite, Option<u32>, ExtensionProblem);

/// Turns a [`Fault`] of `registrant` into a refusal.
fn fault_refusal(registrant: &Registrant, (site, tag, problem): Fault) -> Refusal {
    Refusal::extension(ExtensionRefusal {
        registrant: registrant.clone(),
        site,
        tag: tag.map(ExtensionTag),
        problem,
    })
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

/// The host's copy of one registered kernel: the C descriptor with its pointers rewritten into
/// this value, the extensions the host consumes, and the facts the domain needs.
///
/// This is the [`KernelProvider`] behind [`RegisteredKernel::provider`] for kernels loaded by
/// [`DlopenLoader`](crate::DlopenLoader); the app reaches it only through that interface.
///
/// Registration of a descriptor is not a promise of execution. An `OwnedKernel` says that the
/// descriptor and every extension it carries passed the negotiation and what each offers (see
/// [`ExtensionCopy::absent_callbacks`]); whether the app ever calls them is its own choice.
///
/// Invariants, which hold from construction until drop:
/// - `descriptor().impl_id` and `op_name` point at [`impl_id_cstr`](Self::impl_id_cstr) and
///   [`op_name_cstr`](Self::op_name_cstr); `next_ext` is NULL or the first of the copied chain
///   extensions (GOP1, CPE1, CDD1, CDA1, CDM1), linked in the plugin's chain order through their
///   `next`, the last one's `next` NULL; for `GUILD_OP_PREFILL_KERNELS`, `kernel_fns` points at
///   the copied PFKE table; a copied CDM1's `qwen` is NULL or the copied Qwen group. None of
///   them points into the plugin's memory, and none changes.
/// - The `struct_size` of each extension copy is the number of bytes copied (see
///   [`ExtensionCopy::copied_size`]); the descriptor copy's is this host's struct size.
/// - When [`operation`](Self::operation) is `Some`, its `validate`, `query_scratch` and
///   `execute` are non-NULL, and [`candidate`](Self::candidate) is the same contract in domain
///   form, already checked with [`OpCandidate::check`]. Every extension's required callbacks
///   are non-NULL.
/// - Function pointers, `user_data` and (for legacy kinds) `kernel_fns` still point into the
///   plugin. They are valid only while the library that registered the kernel is loaded, that
///   is while an `Arc` of its [`LoadedLibrary`](guild_ports::loader::LoadedLibrary) lives;
///   whoever calls them must hold one.
pub struct OwnedKernel {
    descriptor: guild_kernel_op_desc_v1_t,
    impl_id_c: HeapCStr,
    op_name_c: Option<HeapCStr>,
    extensions: KernelExtensions,
    prefill: Option<ExtensionCopy<guild_prefill_kernel_ext_v1_t>>,
    skipped_tags: Vec<u32>,
    impl_id: ImplId,
    op_name: Option<OpName>,
    backend: Backend,
    candidate: Option<OpCandidate>,
    /// The GOP1 callbacks and user_data, read once out of the copy so that a forwarded call
    /// goes straight to the plugin.
    gop1: Option<Gop1>,
}

/// The three GOP1 callbacks of a copied extension, each non-NULL, and their user_data.
#[derive(Clone, Copy)]
struct Gop1 {
    validate: unsafe extern "C" fn(
        *mut c_void,
        *const guild_operation_query_v1_t,
        *mut guild_error_info_t,
    ) -> guild_status_t,
    query_scratch: unsafe extern "C" fn(
        *mut c_void,
        *const guild_operation_query_v1_t,
        *mut guild_scratch_request_v1_t,
        *mut guild_error_info_t,
    ) -> guild_status_t,
    execute: unsafe extern "C" fn(
        *mut c_void,
        *const guild_execute_args_v1_t,
        *mut guild_error_info_t,
    ) -> guild_status_t,
    user_data: *mut c_void,
}

impl Gop1 {
    /// The callbacks of `op`, when all three are there (the negotiation refuses a GOP1 whose
    /// required callbacks are NULL, so they always are for a copied one).
    fn of(op: &guild_operation_ext_v1_t) -> Option<Gop1> {
        Some(Gop1 {
            validate: op.validate?,
            query_scratch: op.query_scratch?,
            execute: op.execute?,
            user_data: op.user_data,
        })
    }
}

/// The chain extensions a kernel may carry, one of each at most.
#[derive(Default)]
struct KernelExtensions {
    operation: Option<ExtensionCopy<guild_operation_ext_v1_t>>,
    cpu_backend: Option<ExtensionCopy<guild_cpu_backend_ext_v2_t>>,
    cuda_dense: Option<ExtensionCopy<guild_cuda_dense_ext_v1_t>>,
    cuda_attn: Option<ExtensionCopy<guild_cuda_attn_ext_v1_t>>,
    cuda_moe: Option<ExtensionCopy<guild_cuda_moe_ext_v1_t>>,
    cuda_qwen: Option<ExtensionCopy<guild_cuda_qwen_group_v1_t>>,
    /// The copies' headers in the plugin's chain order, for linking the copied chain.
    order: Vec<*mut guild_ext_header_t>,
}

// SAFETY: an OwnedKernel is immutable after construction. Its own pointers lead into heap memory
// it owns and never mutates. The pointers into the plugin (callbacks, user_data, kernel_fns) are
// never dereferenced by this type, only called (the GOP1 ones, when the host forwards a call);
// the ABI makes the plugin responsible for its callbacks being callable from any thread
// (independent handles may execute concurrently).
unsafe impl Send for OwnedKernel {}
// SAFETY: as for Send: no interior mutability, and shared access only reads.
unsafe impl Sync for OwnedKernel {}

/// Reads a plugin's descriptor after checking that it is there and that its leading
/// `struct_size` (the first field of every descriptor version) covers this host's whole struct.
/// `register` names the host callback, `kind` the descriptor and `type_name` its C type, for
/// the refusals.
///
/// # Safety
/// `desc` must be NULL or point at a readable descriptor of at least its declared
/// `struct_size` bytes, whose first field is a `uint32_t struct_size`.
unsafe fn read_descriptor<T: Copy>(
    desc: *const T,
    register: &str,
    kind: &str,
    type_name: &str,
) -> Result<T, Refusal> {
    if desc.is_null() {
        return Err(Refusal::invalid(format!(
            "{register} was given a NULL descriptor"
        )));
    }
    // SAFETY: non-NULL and, per the contract, readable; struct_size is the first field of every
    // version, so it may be read before the size is known.
    let size = unsafe { desc.cast::<u32>().read_unaligned() };
    let needed = size_of::<T>();
    if usize::try_from(size).map_or(true, |s| s < needed) {
        return Err(Refusal::invalid(format!(
            "{kind} descriptor: struct_size {size} is smaller than the {needed} bytes of \
             {type_name}"
        )));
    }
    // SAFETY: the plugin declares at least `needed` readable bytes.
    Ok(unsafe { desc.read_unaligned() })
}

impl OwnedKernel {
    /// Checks and copies a kernel descriptor, its strings and its extension chain.
    ///
    /// # Safety
    /// `desc` must be NULL or point at a descriptor that stays valid and unchanged for this
    /// call, at least `struct_size` bytes long; its string pointers must be NULL or
    /// NUL-terminated strings, and its extension pointers NULL or extensions at least their
    /// declared `struct_size` long. This is the plugin's side of the ABI, which the host cannot
    /// check; everything it can check (sizes, tags, versions, bounds, cycles) it does.
    pub(crate) unsafe fn copy(desc: *const guild_kernel_op_desc_v1_t) -> Result<Self, Refusal> {
        // SAFETY: the caller upholds read_descriptor's contract, which is this function's.
        let raw = unsafe {
            read_descriptor(
                desc,
                "register_kernel",
                "kernel",
                "guild_kernel_op_desc_v1_t",
            )
        }?;
        check_abi_version("kernel descriptor", raw.abi_version)?;

        // SAFETY: per the contract, impl_id is NULL or a NUL-terminated string.
        let impl_id = unsafe { read_impl_id(raw.impl_id) }?;
        let refuse = |reason: String| Refusal::invalid(format!("kernel {impl_id}: {reason}"));
        let registrant = Registrant::Kernel(impl_id.clone());
        let fault = |f: Fault| fault_refusal(&registrant, f);

        let backend = Backend::from_bit(raw.backend).ok_or_else(|| {
            refuse(format!(
                "backend {:#x} is not exactly one known GUILD_BACKEND_* bit",
                raw.backend
            ))
        })?;

        let custom = raw.op_kind == GUILD_OP_CUSTOM;
        // SAFETY: per the contract, op_name is NULL or a NUL-terminated string.
        let (op_name_c, op_name) = unsafe { copy_op_name(raw.op_name, custom, &refuse) }?;

        let holder = Holder::Kernel {
            op_kind: raw.op_kind,
            backend: raw.backend,
        };
        // SAFETY: per the contract, next_ext is NULL or a valid chain, each extension readable
        // for its declared size, and a CDM1's qwen (an extension pointer too) is NULL or a
        // group readable for its declared size.
        let (mut extensions, skipped_tags) =
            unsafe { KernelExtensions::copy_chain(raw.next_ext, holder) }.map_err(fault)?;

        // SAFETY: per the contract, kernel_fns of a GUILD_OP_PREFILL_KERNELS kernel, which the
        // header makes a PFKE table, is NULL or readable for its declared size during this call.
        let prefill = unsafe { copy_prefill(&raw, &refuse, &fault) }?;

        let candidate = custom_candidate(
            &raw,
            &impl_id,
            op_name.as_ref(),
            backend,
            extensions.operation.as_ref(),
            &skipped_tags,
            &refuse,
        )?;

        let impl_id_c = CString::new(impl_id.as_str())
            .map(HeapCStr::new)
            .map_err(|_| refuse("impl_id has a NUL".into()))?;
        let descriptor = rewrite_descriptor(
            raw,
            &impl_id_c,
            op_name_c.as_ref(),
            &mut extensions,
            prefill.as_ref(),
        );
        let gop1 = extensions
            .operation
            .as_ref()
            .and_then(|op| Gop1::of(op.table()));
        Ok(OwnedKernel {
            descriptor,
            impl_id_c,
            op_name_c,
            extensions,
            prefill,
            skipped_tags,
            impl_id,
            op_name,
            backend,
            candidate,
            gop1,
        })
    }

    /// The copied descriptor; see the type's invariants for where its pointers lead.
    pub fn descriptor(&self) -> &guild_kernel_op_desc_v1_t {
        &self.descriptor
    }

    /// The copied GOP1 extension of a `GUILD_OP_CUSTOM` kernel.
    pub fn operation(&self) -> Option<&guild_operation_ext_v1_t> {
        self.extensions.operation.as_ref().map(ExtensionCopy::table)
    }

    /// The GOP1 negotiation: the copy with its sizes and which callbacks it offers.
    pub fn operation_copy(&self) -> Option<&ExtensionCopy<guild_operation_ext_v1_t>> {
        self.extensions.operation.as_ref()
    }

    /// The copied PFKE table of a `GUILD_OP_PREFILL_KERNELS` kernel.
    pub fn prefill(&self) -> Option<&guild_prefill_kernel_ext_v1_t> {
        self.prefill.as_ref().map(ExtensionCopy::table)
    }

    /// The PFKE negotiation: the copy with its sizes and which callbacks it offers.
    pub fn prefill_copy(&self) -> Option<&ExtensionCopy<guild_prefill_kernel_ext_v1_t>> {
        self.prefill.as_ref()
    }

    /// The copied CPE1 / CPU backend table of a `GUILD_OP_BATCHED_EXPERT_EXEC` CPU kernel, in
    /// the v2 layout whatever the plugin's version: a version 1 table has every appended
    /// callback NULL, and [`has_v2_ops`](ExtensionCopy::has_v2_ops) says whether any is offered.
    pub fn cpu_backend(&self) -> Option<&ExtensionCopy<guild_cpu_backend_ext_v2_t>> {
        self.extensions.cpu_backend.as_ref()
    }

    /// The copied CDD1 (CUDA dense projections) table of a CUDA kernel.
    pub fn cuda_dense(&self) -> Option<&ExtensionCopy<guild_cuda_dense_ext_v1_t>> {
        self.extensions.cuda_dense.as_ref()
    }

    /// The copied CDA1 (CUDA attention) table of a CUDA kernel.
    pub fn cuda_attn(&self) -> Option<&ExtensionCopy<guild_cuda_attn_ext_v1_t>> {
        self.extensions.cuda_attn.as_ref()
    }

    /// The copied CDM1 (CUDA mixture-of-experts) table of a CUDA kernel. Its `qwen` points at
    /// [`cuda_qwen`](Self::cuda_qwen)'s copy, or is NULL.
    pub fn cuda_moe(&self) -> Option<&ExtensionCopy<guild_cuda_moe_ext_v1_t>> {
        self.extensions.cuda_moe.as_ref()
    }

    /// The copied Qwen specialization group of the CDM1 table, when it has one.
    pub fn cuda_qwen(&self) -> Option<&ExtensionCopy<guild_cuda_qwen_group_v1_t>> {
        self.extensions.cuda_qwen.as_ref()
    }

    /// The implementation id.
    pub fn impl_id(&self) -> &ImplId {
        &self.impl_id
    }

    /// The implementation id as the C string the copied descriptor points at.
    pub fn impl_id_cstr(&self) -> &CStr {
        self.impl_id_c.as_cstr()
    }

    /// The operation name, when the descriptor names a valid one (always for
    /// `GUILD_OP_CUSTOM`).
    pub fn op_name(&self) -> Option<&OpName> {
        self.op_name.as_ref()
    }

    /// The `op_name` string as the plugin gave it (a legacy kind's descriptive name included),
    /// which the copied descriptor points at.
    pub fn op_name_cstr(&self) -> Option<&CStr> {
        self.op_name_c.as_ref().map(HeapCStr::as_cstr)
    }

    /// The one backend the kernel runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The GOP1 contract in domain form, for `GUILD_OP_CUSTOM` kernels.
    pub fn candidate(&self) -> Option<&OpCandidate> {
        self.candidate.as_ref()
    }

    /// Tags of the extensions the host did not know and left out of the copy, in chain order.
    pub fn skipped_tags(&self) -> &[u32] {
        &self.skipped_tags
    }

    /// The port's view of this kernel, with `self` as its provider.
    pub(crate) fn into_registered(self) -> RegisteredKernel {
        let owned = Arc::new(self);
        RegisteredKernel {
            impl_id: owned.impl_id.clone(),
            op_kind: owned.descriptor.op_kind,
            op_name: owned.op_name.clone(),
            backend: owned.backend,
            priority: owned.descriptor.priority,
            required_cpu_isa: CpuIsa::from_bits(owned.descriptor.required_cpu_isa),
            operation: owned.candidate.clone(),
            provider: owned,
        }
    }
}

/// The port's view of a negotiated extension copy.
fn lend<T: AbiTable>(copy: &ExtensionCopy<T>) -> ExtensionTable<'_, T> {
    ExtensionTable {
        table: copy.table(),
        version: copy.version(),
        absent_callbacks: copy.absent_callbacks(),
    }
}

/// The host forwards GOP1 calls to the plugin's callbacks with the C structs it was given, and
/// lends the copied descriptor and tables; nothing is converted or copied per call.
///
/// Every callback here may only run while the library that registered the kernel is loaded,
/// which is the port's contract for [`RegisteredKernel::provider`]: whoever calls holds a
/// binding (or the loaded library itself).
impl KernelProvider for OwnedKernel {
    fn validate(&self, query: QueryCall<'_>, error: &mut guild_error_info_t) -> guild_status_t {
        let Some(op) = self.gop1 else {
            return no_operation(error);
        };
        // SAFETY: the plugin's own validate with the user_data it registered, its library loaded
        // per the port's contract; the query's pointers are valid for the call (QueryCall's
        // contract, vouched for by its maker), and `error` is a live, sized record.
        unsafe { (op.validate)(op.user_data, query.raw(), error) }
    }

    fn query_scratch(
        &self,
        query: QueryCall<'_>,
        scratch: &mut guild_scratch_request_v1_t,
        error: &mut guild_error_info_t,
    ) -> guild_status_t {
        let Some(op) = self.gop1 else {
            return no_operation(error);
        };
        // SAFETY: as in validate; `scratch` is a live record the callback may write.
        unsafe { (op.query_scratch)(op.user_data, query.raw(), scratch, error) }
    }

    #[inline]
    fn execute(&self, call: ExecuteCall<'_>, error: &mut guild_error_info_t) -> guild_status_t {
        let Some(op) = self.gop1 else {
            return no_operation(error);
        };
        // SAFETY: the plugin's own execute with its user_data, its library loaded per the
        // port's contract. The arguments are those the host checked against the contract the
        // plugin negotiated and vouched for (ExecuteCall's contract: tensors, data, scratch,
        // stream and params valid for the call), passed on unchanged; `error` is a live, sized
        // record.
        unsafe { (op.execute)(op.user_data, call.raw(), error) }
    }

    fn execute_entry(&self) -> Option<ExecuteEntry> {
        // `execute` above hands every call on to this very callback, unchanged.
        self.gop1.map(|op| ExecuteEntry {
            execute: op.execute,
            user_data: op.user_data,
        })
    }

    fn descriptor(&self) -> Option<&guild_kernel_op_desc_v1_t> {
        Some(&self.descriptor)
    }

    fn operation(&self) -> Option<&guild_operation_ext_v1_t> {
        OwnedKernel::operation(self)
    }

    fn cpu_backend(&self) -> Option<ExtensionTable<'_, guild_cpu_backend_ext_v2_t>> {
        self.extensions.cpu_backend.as_ref().map(lend)
    }

    fn cuda_dense(&self) -> Option<ExtensionTable<'_, guild_cuda_dense_ext_v1_t>> {
        self.extensions.cuda_dense.as_ref().map(lend)
    }

    fn cuda_attn(&self) -> Option<ExtensionTable<'_, guild_cuda_attn_ext_v1_t>> {
        self.extensions.cuda_attn.as_ref().map(lend)
    }

    fn cuda_moe(&self) -> Option<ExtensionTable<'_, guild_cuda_moe_ext_v1_t>> {
        self.extensions.cuda_moe.as_ref().map(lend)
    }

    fn cuda_qwen(&self) -> Option<ExtensionTable<'_, guild_cuda_qwen_group_v1_t>> {
        self.extensions.cuda_qwen.as_ref().map(lend)
    }
}

impl KernelExtensions {
    /// Walks the chain from `first` and negotiates every extension this host consumes into a
    /// copy, refusing one misplaced on the kernel (`holder`) or a second one of a tag; a copied
    /// CDM1's Qwen group is copied with it. Answers the copies and the unknown tags it skipped,
    /// in chain order.
    ///
    /// # Safety
    /// `first` must be NULL or the start of a chain whose every extension is readable for at
    /// least its declared `struct_size` bytes during this call, and a CDM1 extension's `qwen`
    /// must be NULL or a group readable for its declared `struct_size` during this call.
    unsafe fn copy_chain(
        first: *const guild_ext_header_t,
        holder: Holder,
    ) -> Result<(Self, Vec<u32>), Fault> {
        // SAFETY: this function's contract includes walk_chain's.
        let links = unsafe { walk_chain(first) }?;
        let mut extensions = KernelExtensions::default();
        let mut skipped_tags = Vec::new();
        for link in &links {
            let tag = link.header.tag;
            let Some(contract) = contract_for(tag) else {
                skipped_tags.push(tag);
                continue;
            };
            let at = |problem| (ExtensionSite::Chain(link.index), Some(tag), problem);
            if let Some(problem) = contract.placement.misplaced_on(holder) {
                return Err(at(problem));
            }
            // SAFETY: the walk read this header from a live extension that declares
            // `struct_size` readable bytes; the copy reads no more than that.
            let copied = unsafe {
                match tag {
                    GUILD_GOP1_TAG => adopt(&mut extensions.operation, link),
                    GUILD_CPU_EXPERT_TAG => adopt(&mut extensions.cpu_backend, link),
                    GUILD_CUDA_DENSE_TAG => adopt(&mut extensions.cuda_dense, link),
                    GUILD_CUDA_ATTN_TAG => adopt(&mut extensions.cuda_attn, link),
                    GUILD_CUDA_MOE_TAG => adopt(&mut extensions.cuda_moe, link),
                    // Unreachable: the walk refuses PFKE and CDMQ, and placement refuses RMD1
                    // on a kernel. Refused rather than panicking should the table grow.
                    _ => Err(ExtensionProblem::Misplaced {
                        belongs_on: "a runner descriptor".into(),
                        conflict: None,
                    }),
                }
            };
            let header = copied.map_err(at)?;
            extensions.order.push(header);
            if tag == GUILD_CUDA_MOE_TAG {
                // SAFETY: the CDM1 copy's qwen pointer came from the plugin, which this
                // function's contract makes NULL or a live group for this call.
                unsafe { extensions.adopt_qwen(link.index) }?;
            }
        }
        Ok((extensions, skipped_tags))
    }

    /// Copies the Qwen group the just-copied CDM1 table (chain position `index`) points at, and
    /// points the CDM1 copy at the group's copy.
    ///
    /// # Safety
    /// The CDM1 copy's `qwen` must still be the plugin's pointer: NULL or a group readable for
    /// its declared `struct_size` during this call.
    unsafe fn adopt_qwen(&mut self, index: usize) -> Result<(), Fault> {
        let Some(moe) = self.cuda_moe.as_mut() else {
            return Ok(());
        };
        let table = moe.as_mut_ptr();
        // SAFETY: `table` is the live CDM1 copy, owned by `moe`, with no borrow outstanding.
        let group = unsafe { (*table).qwen };
        if group.is_null() {
            return Ok(());
        }
        let site = ExtensionSite::QwenGroup(index);
        // SAFETY: per this function's contract the group is readable; its header comes first.
        let header = unsafe { read_ext_header(group.cast()) }.map_err(|p| (site, None, p))?;
        if header.tag != GUILD_CUDA_QWEN_TAG {
            return Err((
                site,
                Some(header.tag),
                ExtensionProblem::WrongTag {
                    expected: ExtensionTag(GUILD_CUDA_QWEN_TAG),
                },
            ));
        }
        // SAFETY: the group declares `struct_size` readable bytes (at least a header).
        let copy = unsafe {
            check_and_copy::<guild_cuda_qwen_group_v1_t>(
                group.cast(),
                header.struct_size,
                header.version,
            )
        }
        .map_err(|p| (site, Some(header.tag), p))?;
        // SAFETY: as above: the live CDM1 copy, nothing borrowed from it.
        unsafe { (*table).qwen = copy.as_ptr() };
        self.cuda_qwen = Some(copy);
        Ok(())
    }

    /// Links the copied chain extensions in chain order and returns the first, or NULL.
    fn link(&mut self) -> *const guild_ext_header_t {
        for pair in self.order.windows(2) {
            // SAFETY: both are headers of live copies this value owns, with no borrow of them
            // outstanding; every chain extension starts with its guild_ext_header_t.
            unsafe { (*pair[0]).next = pair[1] };
        }
        self.order.first().map_or(ptr::null(), |&h| h.cast_const())
    }
}

impl fmt::Debug for OwnedKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let skipped: Vec<String> = self.skipped_tags.iter().map(|&t| tag_text(t)).collect();
        let ext = &self.extensions;
        let mut copied = Vec::new();
        for (name, present) in [
            ("GOP1", ext.operation.is_some()),
            ("CPE1", ext.cpu_backend.is_some()),
            ("CDD1", ext.cuda_dense.is_some()),
            ("CDA1", ext.cuda_attn.is_some()),
            ("CDM1", ext.cuda_moe.is_some()),
            ("CDMQ", ext.cuda_qwen.is_some()),
            ("PFKE", self.prefill.is_some()),
        ] {
            if present {
                copied.push(name);
            }
        }
        f.debug_struct("OwnedKernel")
            .field("impl_id", &self.impl_id)
            .field("op_kind", &self.descriptor.op_kind)
            .field("op_name", &self.op_name_cstr())
            .field("backend", &self.backend)
            .field("priority", &self.descriptor.priority)
            .field("extensions", &copied)
            .field("skipped_tags", &skipped)
            .finish_non_exhaustive()
    }
}

/// The domain form of a GOP1 contract: every declarative field of the extension, and the
/// per-axis, batch, SM and CPU bounds of the descriptor that carries it.
fn op_candidate(
    desc: &guild_kernel_op_desc_v1_t,
    impl_id: &ImplId,
    op_name: &OpName,
    backend: Backend,
    op: &guild_operation_ext_v1_t,
) -> OpCandidate {
    OpCandidate {
        impl_id: impl_id.clone(),
        op_name: op_name.clone(),
        backend,
        priority: desc.priority,
        op_version: PackedVersion::from_raw(op.op_version),
        capabilities: Capabilities::from_bits(op.capabilities),
        numerics: Numerics::from_bits(op.numerics),
        input_dtype: DType::from_raw(op.input_dtype),
        output_dtype: DType::from_raw(op.output_dtype),
        inputs: Arity::new(op.min_inputs, op.max_inputs),
        outputs: Arity::new(op.min_outputs, op.max_outputs),
        layouts: LayoutSet::from_bits(op.layouts),
        memory_spaces: MemorySpaceSet::from_bits(op.memory_spaces),
        min_alignment: u64::from(op.min_alignment),
        min_rank: op.min_rank,
        max_rank: op.max_rank,
        max_dim: desc.max_dim,
        max_batch: desc.max_batch,
        sync_modes: SyncModeSet::from_bits(op.sync_modes),
        min_sm: desc.min_sm,
        max_sm: desc.max_sm,
        cpu_isa: CpuIsa::from_bits(desc.required_cpu_isa),
    }
}

/// Reads a kernel descriptor's `impl_id` and checks that it is a valid id.
///
/// # Safety
/// `ptr` must be NULL or a NUL-terminated string that stays unchanged during this call.
unsafe fn read_impl_id(ptr: *const c_char) -> Result<ImplId, Refusal> {
    // SAFETY: per this function's contract, `ptr` is NULL or a NUL-terminated string that
    // does not change during this call, which is as long as `id_text` is borrowed.
    let id_text = unsafe { bounded_str(ptr, MAX_DESCRIPTOR_STRING) }
        .map_err(|e| Refusal::invalid(format!("kernel descriptor: impl_id {e}")))?;
    ImplId::new(id_text).map_err(|e| Refusal::invalid(format!("kernel descriptor: impl_id: {e}")))
}

/// Reads a kernel descriptor's `op_name` and copies it as the plugin gave it. A
/// `GUILD_OP_CUSTOM` kernel (`custom`) must name a valid operation; a legacy kind may leave it
/// NULL or carry a free-form descriptive name, which is kept as text only. Answers the copy
/// and the operation name.
///
/// # Safety
/// `ptr` must be NULL or a NUL-terminated string that stays unchanged during this call.
unsafe fn copy_op_name(
    ptr: *const c_char,
    custom: bool,
    refuse: &impl Fn(String) -> Refusal,
) -> Result<(Option<HeapCStr>, Option<OpName>), Refusal> {
    if ptr.is_null() {
        if custom {
            return Err(refuse(
                "op_name is NULL; GUILD_OP_CUSTOM kernels must name their operation".into(),
            ));
        }
        return Ok((None, None));
    }
    // SAFETY: per this function's contract, a non-NULL op_name is a NUL-terminated string.
    let text = unsafe { bounded_str(ptr, MAX_DESCRIPTOR_STRING) }
        .map_err(|e| refuse(format!("op_name {e}")))?;
    let name = match OpName::new(text) {
        Ok(name) => Some(name),
        Err(e) if custom => return Err(refuse(format!("op_name: {e}"))),
        // A legacy kind may carry a free-form descriptive name; it is kept as text.
        Err(_) => None,
    };
    let copy = CString::new(text).map_err(|_| refuse("op_name has a NUL".into()))?;
    Ok((Some(HeapCStr::new(copy)), name))
}

/// Copies the PFKE table that a `GUILD_OP_PREFILL_KERNELS` kernel must carry in `kernel_fns`;
/// a kernel of any other kind has none.
///
/// # Safety
/// When `raw.op_kind` is `GUILD_OP_PREFILL_KERNELS`, `raw.kernel_fns` must be NULL or a PFKE
/// table readable for its declared `struct_size` bytes during this call.
unsafe fn copy_prefill(
    raw: &guild_kernel_op_desc_v1_t,
    refuse: &impl Fn(String) -> Refusal,
    fault: &impl Fn(Fault) -> Refusal,
) -> Result<Option<ExtensionCopy<guild_prefill_kernel_ext_v1_t>>, Refusal> {
    if raw.op_kind != GUILD_OP_PREFILL_KERNELS {
        return Ok(None);
    }
    if raw.kernel_fns.is_null() {
        return Err(refuse(
            "GUILD_OP_PREFILL_KERNELS needs a PFKE table in kernel_fns".into(),
        ));
    }
    // SAFETY: for this kind the header makes kernel_fns a PFKE table, and this function's
    // contract makes a non-NULL one readable for its declared size during this call.
    Ok(Some(
        unsafe { copy_pfke(raw.kernel_fns.cast()) }.map_err(fault)?,
    ))
}

/// The GOP1 contract of a `GUILD_OP_CUSTOM` kernel in domain form, checked with
/// [`OpCandidate::check`]; `None` for a kernel of any other kind. The kernel must carry a GOP1
/// extension (`operation`; the chain's `skipped_tags` say what it held instead) and leave
/// `kernel_fns` NULL, since the extension carries the callbacks.
fn custom_candidate(
    raw: &guild_kernel_op_desc_v1_t,
    impl_id: &ImplId,
    op_name: Option<&OpName>,
    backend: Backend,
    operation: Option<&ExtensionCopy<guild_operation_ext_v1_t>>,
    skipped_tags: &[u32],
    refuse: &impl Fn(String) -> Refusal,
) -> Result<Option<OpCandidate>, Refusal> {
    if raw.op_kind != GUILD_OP_CUSTOM {
        return Ok(None);
    }
    let Some(op) = operation else {
        let found = if skipped_tags.is_empty() {
            "an empty chain".to_string()
        } else {
            let tags: Vec<String> = skipped_tags.iter().map(|&t| tag_text(t)).collect();
            format!("only [{}]", tags.join(", "))
        };
        return Err(refuse(format!(
            "GUILD_OP_CUSTOM kernels need a GOP1 extension, and next_ext holds {found}"
        )));
    };
    if !raw.kernel_fns.is_null() {
        return Err(refuse(
            "kernel_fns must be NULL for GUILD_OP_CUSTOM; the GOP1 extension carries the \
             callbacks"
                .into(),
        ));
    }
    // op_name is Some for every custom kernel that got this far.
    let name = op_name.ok_or_else(|| refuse("op_name is missing".into()))?;
    let candidate = op_candidate(raw, impl_id, name, backend, op.table());
    candidate
        .check()
        .map_err(|e| refuse(format!("its GOP1 contract is malformed: {e}")))?;
    Ok(Some(candidate))
}

/// The plugin's descriptor `raw` with every pointer the host copied pointing at the copy: the
/// strings, the first of the linked chain `extensions` and a PFKE table. Its `struct_size`
/// becomes this host's.
fn rewrite_descriptor(
    raw: guild_kernel_op_desc_v1_t,
    impl_id_c: &HeapCStr,
    op_name_c: Option<&HeapCStr>,
    extensions: &mut KernelExtensions,
    prefill: Option<&ExtensionCopy<guild_prefill_kernel_ext_v1_t>>,
) -> guild_kernel_op_desc_v1_t {
    let mut descriptor = raw;
    descriptor.struct_size = size_u32::<guild_kernel_op_desc_v1_t>();
    descriptor.impl_id = impl_id_c.as_ptr();
    descriptor.op_name = op_name_c.map_or(ptr::null(), HeapCStr::as_ptr);
    descriptor.next_ext = extensions.link();
    if let Some(table) = prefill {
        descriptor.kernel_fns = table.as_ptr().cast();
    }
    descriptor
}

// ---------------------------------------------------------------------------------------------
// Runners
// ---------------------------------------------------------------------------------------------

/// The host's copy of one registered runner: the C descriptor with its pointers rewritten into
/// this value, and its RMD1 extension when it has one.
///
/// This is the [`RunnerProvider`] behind [`RegisteredRunner::provider`] for runners loaded by
/// [`DlopenLoader`](crate::DlopenLoader). Its invariants are those of [`OwnedKernel`]:
/// `descriptor().runner_id` points at [`runner_id_cstr`](Self::runner_id_cstr), `next_ext` at
/// the copied RMD1 header (whose `next` is NULL) or NULL; `create` and `destroy` are non-NULL,
/// as are RMD1's three callbacks; every function pointer and `user_data` is valid only while the
/// library that registered the runner is loaded. As for kernels, registration of a runner is not
/// a promise that the host will ever select it.
pub struct OwnedRunner {
    descriptor: guild_runner_desc_v1_t,
    runner_id_c: HeapCStr,
    model: Option<ExtensionCopy<guild_runner_model_ext_v1_t>>,
    skipped_tags: Vec<u32>,
    runner_id: RunnerId,
}

// SAFETY: as for OwnedKernel: immutable after construction, pointers into the plugin carried but
// never dereferenced by this type.
unsafe impl Send for OwnedRunner {}
// SAFETY: as for Send.
unsafe impl Sync for OwnedRunner {}

impl OwnedRunner {
    /// Checks and copies a runner descriptor, its id and its extension chain.
    ///
    /// # Safety
    /// As for [`OwnedKernel::copy`], for a `guild_runner_desc_v1_t`.
    pub(crate) unsafe fn copy(desc: *const guild_runner_desc_v1_t) -> Result<Self, Refusal> {
        // SAFETY: the caller upholds read_descriptor's contract, which is this function's.
        let raw = unsafe {
            read_descriptor(desc, "register_runner", "runner", "guild_runner_desc_v1_t")
        }?;
        check_abi_version("runner descriptor", raw.abi_version)?;
        // SAFETY: per the contract, runner_id is NULL or a NUL-terminated string.
        let id_text = unsafe { bounded_str(raw.runner_id, MAX_DESCRIPTOR_STRING) }
            .map_err(|e| Refusal::invalid(format!("runner descriptor: runner_id {e}")))?;
        let runner_id = RunnerId::new(id_text)
            .map_err(|e| Refusal::invalid(format!("runner descriptor: runner_id: {e}")))?;
        let refuse = |reason: String| Refusal::invalid(format!("runner {runner_id}: {reason}"));
        if raw.create.is_none() {
            return Err(refuse("create is NULL".into()));
        }
        if raw.destroy.is_none() {
            return Err(refuse("destroy is NULL".into()));
        }

        let registrant = Registrant::Runner(runner_id.clone());
        let fault = |f: Fault| fault_refusal(&registrant, f);
        // SAFETY: per the contract, next_ext is NULL or a valid chain.
        let links = unsafe { walk_chain(raw.next_ext) }.map_err(fault)?;
        let mut model: Option<ExtensionCopy<guild_runner_model_ext_v1_t>> = None;
        let mut skipped_tags = Vec::new();
        for link in &links {
            let tag = link.header.tag;
            let Some(contract) = contract_for(tag) else {
                skipped_tags.push(tag);
                continue;
            };
            let at = |problem| (ExtensionSite::Chain(link.index), Some(tag), problem);
            if let Some(problem) = contract.placement.misplaced_on(Holder::Runner) {
                return Err(fault(at(problem)));
            }
            // Placement admits only RMD1 on a runner.
            debug_assert_eq!(tag, GUILD_RMD1_TAG);
            // SAFETY: the walk read this header from a live extension that declares
            // `struct_size` readable bytes; the copy reads no more than that.
            unsafe { adopt(&mut model, link) }.map_err(|problem| fault(at(problem)))?;
        }

        let copy =
            CString::new(runner_id.as_str()).map_err(|_| refuse("runner_id has a NUL".into()))?;
        let runner_id_c = HeapCStr::new(copy);
        let mut descriptor = raw;
        descriptor.struct_size = size_u32::<guild_runner_desc_v1_t>();
        descriptor.runner_id = runner_id_c.as_ptr();
        descriptor.next_ext = model
            .as_ref()
            .map_or(ptr::null(), |m| m.as_ptr().cast::<guild_ext_header_t>());
        Ok(OwnedRunner {
            descriptor,
            runner_id_c,
            model,
            skipped_tags,
            runner_id,
        })
    }

    /// The copied descriptor; see the type's invariants.
    pub fn descriptor(&self) -> &guild_runner_desc_v1_t {
        &self.descriptor
    }

    /// The copied RMD1 extension, when the runner has one (its `next` is NULL).
    pub fn model(&self) -> Option<&guild_runner_model_ext_v1_t> {
        self.model.as_ref().map(ExtensionCopy::table)
    }

    /// The RMD1 negotiation: the copy with its sizes and which callbacks it offers.
    pub fn model_copy(&self) -> Option<&ExtensionCopy<guild_runner_model_ext_v1_t>> {
        self.model.as_ref()
    }

    /// The runner id.
    pub fn runner_id(&self) -> &RunnerId {
        &self.runner_id
    }

    /// The runner id as the C string the copied descriptor points at.
    pub fn runner_id_cstr(&self) -> &CStr {
        self.runner_id_c.as_cstr()
    }

    /// Tags of the extensions the host did not know and left out of the copy.
    pub fn skipped_tags(&self) -> &[u32] {
        &self.skipped_tags
    }

    /// The priority used to choose among runners that recognise the same model: RMD1's, which
    /// takes the place of the descriptor's when present, else the descriptor's.
    pub fn selection_priority(&self) -> i32 {
        self.model()
            .map_or(self.descriptor.priority, |model| model.priority)
    }

    /// The port's view of this runner, with `self` as its provider.
    pub(crate) fn into_registered(self) -> RegisteredRunner {
        let owned = Arc::new(self);
        RegisteredRunner {
            runner_id: owned.runner_id.clone(),
            priority: owned.selection_priority(),
            provider: owned,
        }
    }
}

/// The runner's copied descriptor and RMD1 table, lent as the negotiation left them.
impl RunnerProvider for OwnedRunner {
    fn descriptor(&self) -> Option<&guild_runner_desc_v1_t> {
        Some(&self.descriptor)
    }

    fn model(&self) -> Option<ExtensionTable<'_, guild_runner_model_ext_v1_t>> {
        self.model.as_ref().map(lend)
    }
}

impl fmt::Debug for OwnedRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let skipped: Vec<String> = self.skipped_tags.iter().map(|&t| tag_text(t)).collect();
        f.debug_struct("OwnedRunner")
            .field("runner_id", &self.runner_id)
            .field("priority", &self.descriptor.priority)
            .field("rmd1", &self.model.is_some())
            .field("skipped_tags", &skipped)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------------
// Chains and extensions
// ---------------------------------------------------------------------------------------------

/// One extension as the chain walk found it.
struct ChainLink {
    /// Position in the chain, from 0.
    index: usize,
    /// The extension's header, as read.
    header: guild_ext_header_t,
    /// Where the extension lives (in the plugin's memory, valid for the registration call).
    at: *const guild_ext_header_t,
}

/// Reads an extension header after checking that its declared size covers one.
///
/// # Safety
/// `at` must be non-NULL and readable for its declared `struct_size` bytes during this call.
unsafe fn read_ext_header(
    at: *const guild_ext_header_t,
) -> Result<guild_ext_header_t, ExtensionProblem> {
    // SAFETY: `at` is non-NULL and readable; its first field is struct_size, which may be read
    // before the size is known.
    let size = unsafe { at.cast::<u32>().read_unaligned() };
    let header_size = size_of::<guild_ext_header_t>();
    if usize::try_from(size).map_or(true, |s| s < header_size) {
        return Err(ExtensionProblem::HeaderTooSmall {
            struct_size: size,
            header_size: size_u32::<guild_ext_header_t>(),
        });
    }
    // SAFETY: the extension declares at least a whole header's worth of readable bytes.
    Ok(unsafe { at.read_unaligned() })
}

/// Walks a `next_ext` chain, checking each header's size, refusing a cycle, an overlong chain
/// and the tags that are never chain extensions (PFKE, whose 12-byte header has no `next` to
/// follow, and CDM1's Qwen group).
///
/// # Safety
/// `first` must be NULL or the start of a chain whose every extension is readable for at least
/// its declared `struct_size` bytes during this call.
unsafe fn walk_chain(first: *const guild_ext_header_t) -> Result<Vec<ChainLink>, Fault> {
    let mut links: Vec<ChainLink> = Vec::new();
    let mut at = first;
    while !at.is_null() {
        let index = links.len();
        if let Some(earlier) = links.iter().find(|l| ptr::eq(l.at, at)) {
            let from = index.saturating_sub(1);
            return Err((
                ExtensionSite::Chain(from),
                links.get(from).map(|l| l.header.tag),
                ExtensionProblem::Cycle {
                    links_back_to: earlier.index,
                },
            ));
        }
        if index == MAX_CHAIN_LENGTH {
            return Err((
                ExtensionSite::Chain(index),
                None,
                ExtensionProblem::ChainTooLong {
                    limit: MAX_CHAIN_LENGTH,
                },
            ));
        }
        // SAFETY: `at` is non-NULL and, per the contract, a readable extension.
        let header =
            unsafe { read_ext_header(at) }.map_err(|p| (ExtensionSite::Chain(index), None, p))?;
        if let Some(reached_through) =
            contract_for(header.tag).and_then(|c| c.placement.outside_chains())
        {
            return Err((
                ExtensionSite::Chain(index),
                Some(header.tag),
                ExtensionProblem::NotAChainExtension {
                    reached_through: reached_through.into(),
                },
            ));
        }
        let next = header.next;
        links.push(ChainLink { index, header, at });
        at = next;
    }
    Ok(links)
}

/// Negotiates one chain extension into `slot`, refusing a second one of the same tag, and
/// returns the copy's header for linking.
///
/// # Safety
/// `link.at` must be readable for `link.header.struct_size` bytes during this call.
unsafe fn adopt<T: AbiTable>(
    slot: &mut Option<ExtensionCopy<T>>,
    link: &ChainLink,
) -> Result<*mut guild_ext_header_t, ExtensionProblem> {
    if slot.is_some() {
        return Err(ExtensionProblem::Duplicate);
    }
    // SAFETY: per this function's contract.
    let copy = unsafe {
        check_and_copy::<T>(link.at.cast(), link.header.struct_size, link.header.version)
    }?;
    Ok(slot.insert(copy).as_mut_ptr().cast())
}

/// Copies the PFKE table of a `GUILD_OP_PREFILL_KERNELS` kernel after checking its own 12-byte
/// header.
///
/// # Safety
/// `table` must be non-NULL and readable for its declared `struct_size` bytes during this call.
unsafe fn copy_pfke(
    table: *const guild_prefill_kernel_ext_v1_t,
) -> Result<ExtensionCopy<guild_prefill_kernel_ext_v1_t>, Fault> {
    // SAFETY: non-NULL and readable per the contract; PFKE's header is its first 12 bytes and
    // every PFKE table has at least that.
    let header: guild_prefill_ext_header_t =
        unsafe { ptr::addr_of!((*table).header).read_unaligned() };
    let site = ExtensionSite::KernelFns;
    if header.tag != PFKE_CONTRACT.tag {
        return Err((
            site,
            Some(header.tag),
            ExtensionProblem::WrongTag {
                expected: ExtensionTag(GUILD_PFKE_TAG),
            },
        ));
    }
    // SAFETY: the table declares `struct_size` readable bytes.
    unsafe { check_and_copy(table.cast(), header.struct_size, header.version) }
        .map_err(|p| (site, Some(header.tag), p))
}

/// Refuses a descriptor built against another Kernel ABI major, whose layout this host cannot
/// know.
fn check_abi_version(what: &str, abi_version: u32) -> Result<(), Refusal> {
    if guild_abi_version_major(abi_version) == guild_abi_version_major(GUILD_KERNEL_ABI_VERSION) {
        return Ok(());
    }
    Err(Refusal::new(
        GUILD_STATUS_ERR_ABI_MISMATCH,
        format!(
            "{what}: built against Kernel ABI {}, whose layout this Kernel ABI {} host cannot \
             read",
            PackedVersion::from_raw(abi_version),
            PackedVersion::from_raw(GUILD_KERNEL_ABI_VERSION)
        ),
    ))
}

/// `size_of::<T>()` as the `u32` that `struct_size` fields hold; every ABI struct is far below
/// 4 GiB.
fn size_u32<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
}
