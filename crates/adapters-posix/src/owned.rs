//! The host's own copies of what a plugin registers: a kernel or runner descriptor, its strings
//! and the extensions of its `next_ext` chain, checked and copied inside `register_kernel` /
//! `register_runner` so that nothing the host keeps points into `init`'s stack.
//!
//! A copied descriptor is a `#[repr(C)]` struct like the plugin's, with every pointer the host
//! copied (strings, extensions, a PFKE table) rewritten to point into memory the copy owns. The
//! app can therefore hand [`OwnedKernel::descriptor`] and [`OwnedKernel::operation`] to C code
//! (the operation service's `describe` does) exactly as if they were the plugin's originals.
//!
//! What is copied and what is refused:
//! - The descriptor's `struct_size` must cover the whole v1 struct and its `abi_version` must be
//!   of this host's major; fields appended by a newer minor are not read.
//! - Ids must be valid domain ids; every string is read with a bound and checked as UTF-8.
//! - The chain is walked with a length bound and a cycle check. Each extension must be at least
//!   as large as an extension header, and the PFKE tag (whose header is not a chain header) is
//!   refused. Extensions this host consumes are copied after their own size and version checks:
//!   GOP1 on kernels, RMD1 on runners. Any other tag is skipped, as the ABI's growth rules ask,
//!   and left out of the copied chain (it is never read, so it cannot be left dangling); the
//!   skipped tags are kept for diagnostics.
//! - A `GUILD_OP_CUSTOM` kernel must name a valid operation and carry exactly one GOP1 whose
//!   three callbacks are present and whose contract passes the domain's own check; GOP1 on any
//!   other kind, RMD1 on a kernel and GOP1 on a runner are refused as misplaced.

use std::ffi::{c_char, CStr, CString};
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use guild_abi::{
    guild_abi_version_major, guild_ext_header_t, guild_kernel_op_desc_v1_t,
    guild_operation_ext_v1_t, guild_prefill_kernel_ext_v1_t, guild_runner_desc_v1_t,
    guild_runner_model_ext_v1_t, guild_status_t, GUILD_GOP1_TAG, GUILD_GOP1_VERSION,
    GUILD_KERNEL_ABI_VERSION, GUILD_OP_CUSTOM, GUILD_OP_PREFILL_KERNELS, GUILD_PFKE_TAG,
    GUILD_PFKE_VERSION, GUILD_RMD1_TAG, GUILD_RMD1_VERSION, GUILD_STATUS_ERR_ABI_MISMATCH,
    GUILD_STATUS_ERR_INVALID_ARGUMENT,
};
use guild_domain::ids::{ImplId, OpName, RunnerId};
use guild_domain::operation::{
    Arity, Backend, Capabilities, CpuIsa, DType, LayoutSet, MemorySpaceSet, Numerics, OpCandidate,
    SyncModeSet,
};
use guild_domain::version::PackedVersion;
use guild_ports::loader::{RegisteredKernel, RegisteredRunner};

use crate::text::{bounded_str, tag_text, MAX_DESCRIPTOR_STRING};

/// The most extensions a `next_ext` chain may hold. Real chains hold one or two; the bound turns
/// a corrupt chain that never ends into a refusal.
pub const MAX_CHAIN_LENGTH: usize = 64;

/// A registration the host refused: the status returned to the plugin and the reason the load
/// reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: guild_status_t,
    pub reason: String,
}

impl Refusal {
    fn invalid(reason: impl Into<String>) -> Self {
        Refusal {
            status: GUILD_STATUS_ERR_INVALID_ARGUMENT,
            reason: reason.into(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Owned heap memory that C may point into
// ---------------------------------------------------------------------------------------------

/// A heap value that copied descriptors point into.
///
/// It is held as a raw pointer from `Box::into_raw` rather than as a `Box`, because a `Box`
/// asserts unique access whenever it moves, which would invalidate the pointers the copied
/// descriptor holds into it. The value is never mutated after construction.
struct Heap<T>(NonNull<T>);

impl<T> Heap<T> {
    fn new(value: T) -> Self {
        Heap(NonNull::from(Box::leak(Box::new(value))))
    }

    fn as_ptr(&self) -> *const T {
        self.0.as_ptr()
    }

    fn get(&self) -> &T {
        // SAFETY: the pointer came from Box::leak in `new`, is freed only in Drop, and the value
        // is never mutated, so a shared borrow tied to `self` is valid.
        unsafe { self.0.as_ref() }
    }
}

impl<T> Drop for Heap<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::leak in `new` and is freed exactly once, here; any
        // pointer a copied descriptor holds into it dies with the OwnedKernel/OwnedRunner that
        // owns both.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// A NUL-terminated string that copied descriptors point into, held as the raw pointer of
/// `CString::into_raw` for the same reason as [`Heap`].
struct HeapCStr(NonNull<c_char>);

impl HeapCStr {
    fn new(text: CString) -> Self {
        let raw = text.into_raw();
        // SAFETY: CString::into_raw returns the pointer of a live allocation, never NULL.
        HeapCStr(unsafe { NonNull::new_unchecked(raw) })
    }

    fn as_ptr(&self) -> *const c_char {
        self.0.as_ptr()
    }

    fn as_cstr(&self) -> &CStr {
        // SAFETY: the pointer came from CString::into_raw (a valid NUL-terminated string that is
        // never mutated) and lives until Drop.
        unsafe { CStr::from_ptr(self.0.as_ptr()) }
    }
}

impl Drop for HeapCStr {
    fn drop(&mut self) {
        // SAFETY: the pointer came from CString::into_raw in `new` and is freed exactly once.
        drop(unsafe { CString::from_raw(self.0.as_ptr()) });
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

/// The host's copy of one registered kernel: the C descriptor with its pointers rewritten into
/// this value, the extensions the host consumes, and the facts the domain needs.
///
/// This is the concrete type behind [`RegisteredKernel::raw`] for kernels loaded by
/// [`DlopenLoader`](crate::DlopenLoader); the app downcasts `raw` to it to reach the callbacks.
///
/// Invariants, which hold from construction until drop:
/// - `descriptor().impl_id` and `op_name` point at [`impl_id_cstr`](Self::impl_id_cstr) and
///   [`op_name_cstr`](Self::op_name_cstr); `next_ext` points at the copied GOP1 header (its
///   `next` is NULL) or is NULL; for `GUILD_OP_PREFILL_KERNELS`, `kernel_fns` points at the
///   copied PFKE table. None of them points into the plugin's memory, and none changes.
/// - `struct_size` fields of the copies equal this host's struct sizes.
/// - When [`operation`](Self::operation) is `Some`, its `validate`, `query_scratch` and
///   `execute` are non-NULL, and [`candidate`](Self::candidate) is the same contract in domain
///   form, already checked with [`OpCandidate::check`].
/// - Function pointers, `user_data` and (for legacy kinds) `kernel_fns` still point into the
///   plugin. They are valid only while the library that registered the kernel is loaded, that
///   is while an `Arc` of its [`LoadedLibrary`](guild_ports::loader::LoadedLibrary) lives;
///   whoever calls them must hold one.
pub struct OwnedKernel {
    descriptor: guild_kernel_op_desc_v1_t,
    impl_id_c: HeapCStr,
    op_name_c: Option<HeapCStr>,
    operation: Option<Heap<guild_operation_ext_v1_t>>,
    prefill: Option<Heap<guild_prefill_kernel_ext_v1_t>>,
    skipped_tags: Vec<u32>,
    impl_id: ImplId,
    op_name: Option<OpName>,
    backend: Backend,
    candidate: Option<OpCandidate>,
}

// SAFETY: an OwnedKernel is immutable after construction. Its own pointers lead into heap memory
// it owns and never mutates. The pointers into the plugin (callbacks, user_data, kernel_fns) are
// only carried, never dereferenced by this type; the ABI makes the plugin responsible for its
// callbacks being callable from any thread (independent handles may execute concurrently).
unsafe impl Send for OwnedKernel {}
// SAFETY: as for Send: no interior mutability, and shared access only reads.
unsafe impl Sync for OwnedKernel {}

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
        if desc.is_null() {
            return Err(Refusal::invalid(
                "register_kernel was given a NULL descriptor",
            ));
        }
        // SAFETY: non-NULL and, per the contract, readable; struct_size is the first field of
        // every version, so it may be read before the size is known.
        let size = unsafe { ptr::addr_of!((*desc).struct_size).read_unaligned() };
        let needed = size_of::<guild_kernel_op_desc_v1_t>();
        if usize::try_from(size).map_or(true, |s| s < needed) {
            return Err(Refusal::invalid(format!(
                "kernel descriptor: struct_size {size} is smaller than the {needed} bytes of \
                 guild_kernel_op_desc_v1_t"
            )));
        }
        // SAFETY: the plugin declares at least `needed` readable bytes.
        let raw = unsafe { desc.read_unaligned() };
        check_abi_version("kernel descriptor", raw.abi_version)?;

        // SAFETY: per the contract, impl_id is NULL or a NUL-terminated string.
        let id_text = unsafe { bounded_str(raw.impl_id, MAX_DESCRIPTOR_STRING) }
            .map_err(|e| Refusal::invalid(format!("kernel descriptor: impl_id {e}")))?;
        let impl_id = ImplId::new(id_text)
            .map_err(|e| Refusal::invalid(format!("kernel descriptor: impl_id: {e}")))?;
        let refuse = |reason: String| Refusal::invalid(format!("kernel {impl_id}: {reason}"));

        let backend = Backend::from_bit(raw.backend).ok_or_else(|| {
            refuse(format!(
                "backend {:#x} is not exactly one known GUILD_BACKEND_* bit",
                raw.backend
            ))
        })?;

        let custom = raw.op_kind == GUILD_OP_CUSTOM;
        let (op_name_c, op_name) = if raw.op_name.is_null() {
            if custom {
                return Err(refuse(
                    "op_name is NULL; GUILD_OP_CUSTOM kernels must name their operation".into(),
                ));
            }
            (None, None)
        } else {
            // SAFETY: per the contract, a non-NULL op_name is a NUL-terminated string.
            let text = unsafe { bounded_str(raw.op_name, MAX_DESCRIPTOR_STRING) }
                .map_err(|e| refuse(format!("op_name {e}")))?;
            let name = match OpName::new(text) {
                Ok(name) => Some(name),
                Err(e) if custom => return Err(refuse(format!("op_name: {e}"))),
                // A legacy kind may carry a free-form descriptive name; it is kept as text.
                Err(_) => None,
            };
            let copy = CString::new(text).map_err(|_| refuse("op_name has a NUL".into()))?;
            (Some(HeapCStr::new(copy)), name)
        };

        // SAFETY: per the contract, next_ext is NULL or a valid chain.
        let links = unsafe { walk_chain(raw.next_ext) }.map_err(refuse)?;
        let mut operation = None;
        let mut skipped_tags = Vec::new();
        for link in &links {
            match link.header.tag {
                GUILD_GOP1_TAG => {
                    if !custom {
                        return Err(refuse(format!(
                            "extension {} is GOP1, but op_kind {:#x} is not GUILD_OP_CUSTOM",
                            link.index, raw.op_kind
                        )));
                    }
                    if operation.is_some() {
                        return Err(refuse(format!(
                            "extension {} is a second GOP1 extension",
                            link.index
                        )));
                    }
                    // SAFETY: the walk read this header from a live extension of at least the
                    // header's size; copy_gop1 checks the declared size before reading more.
                    operation = Some(unsafe { copy_gop1(link) }.map_err(refuse)?);
                }
                GUILD_RMD1_TAG => {
                    return Err(refuse(format!(
                        "extension {} is RMD1, which belongs on a runner descriptor",
                        link.index
                    )));
                }
                tag => skipped_tags.push(tag),
            }
        }

        let prefill = if raw.op_kind == GUILD_OP_PREFILL_KERNELS {
            // SAFETY: for this kind the header makes kernel_fns a PFKE table or NULL.
            Some(unsafe { copy_pfke(raw.kernel_fns.cast()) }.map_err(refuse)?)
        } else {
            None
        };

        let candidate = if custom {
            let Some(op) = &operation else {
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
                    "kernel_fns must be NULL for GUILD_OP_CUSTOM; the GOP1 extension carries \
                     the callbacks"
                        .into(),
                ));
            }
            // op_name is Some for every custom kernel that got this far.
            let name = op_name
                .clone()
                .ok_or_else(|| refuse("op_name is missing".into()))?;
            let candidate = op_candidate(&raw, &impl_id, &name, backend, op.get());
            candidate
                .check()
                .map_err(|e| refuse(format!("its GOP1 contract is malformed: {e}")))?;
            Some(candidate)
        } else {
            None
        };

        let copy =
            CString::new(impl_id.as_str()).map_err(|_| refuse("impl_id has a NUL".into()))?;
        let impl_id_c = HeapCStr::new(copy);
        let mut descriptor = raw;
        descriptor.struct_size = size_u32::<guild_kernel_op_desc_v1_t>();
        descriptor.impl_id = impl_id_c.as_ptr();
        descriptor.op_name = op_name_c.as_ref().map_or(ptr::null(), HeapCStr::as_ptr);
        descriptor.next_ext = operation
            .as_ref()
            .map_or(ptr::null(), |op| op.as_ptr().cast::<guild_ext_header_t>());
        if let Some(table) = &prefill {
            descriptor.kernel_fns = table.as_ptr().cast();
        }
        Ok(OwnedKernel {
            descriptor,
            impl_id_c,
            op_name_c,
            operation,
            prefill,
            skipped_tags,
            impl_id,
            op_name,
            backend,
            candidate,
        })
    }

    /// The copied descriptor; see the type's invariants for where its pointers lead.
    pub fn descriptor(&self) -> &guild_kernel_op_desc_v1_t {
        &self.descriptor
    }

    /// The copied GOP1 extension of a `GUILD_OP_CUSTOM` kernel (its `next` is NULL).
    pub fn operation(&self) -> Option<&guild_operation_ext_v1_t> {
        self.operation.as_ref().map(Heap::get)
    }

    /// The copied PFKE table of a `GUILD_OP_PREFILL_KERNELS` kernel.
    pub fn prefill(&self) -> Option<&guild_prefill_kernel_ext_v1_t> {
        self.prefill.as_ref().map(Heap::get)
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

    /// The port's view of this kernel, with `raw` holding `self`.
    pub(crate) fn into_registered(self) -> RegisteredKernel {
        let owned = Arc::new(self);
        RegisteredKernel {
            impl_id: owned.impl_id.clone(),
            op_kind: owned.descriptor.op_kind,
            op_name: owned.op_name.clone(),
            backend: owned.backend,
            priority: owned.descriptor.priority,
            operation: owned.candidate.clone(),
            raw: owned,
        }
    }
}

impl fmt::Debug for OwnedKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let skipped: Vec<String> = self.skipped_tags.iter().map(|&t| tag_text(t)).collect();
        f.debug_struct("OwnedKernel")
            .field("impl_id", &self.impl_id)
            .field("op_kind", &self.descriptor.op_kind)
            .field("op_name", &self.op_name_cstr())
            .field("backend", &self.backend)
            .field("priority", &self.descriptor.priority)
            .field("gop1", &self.operation.is_some())
            .field("pfke", &self.prefill.is_some())
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

// ---------------------------------------------------------------------------------------------
// Runners
// ---------------------------------------------------------------------------------------------

/// The host's copy of one registered runner: the C descriptor with its pointers rewritten into
/// this value, and its RMD1 extension when it has one.
///
/// This is the concrete type behind [`RegisteredRunner::raw`] for runners loaded by
/// [`DlopenLoader`](crate::DlopenLoader). Its invariants are those of [`OwnedKernel`]:
/// `descriptor().runner_id` points at [`runner_id_cstr`](Self::runner_id_cstr), `next_ext` at
/// the copied RMD1 header (whose `next` is NULL) or NULL; `create` and `destroy` are non-NULL,
/// as are RMD1's three callbacks; every function pointer and `user_data` is valid only while the
/// library that registered the runner is loaded.
pub struct OwnedRunner {
    descriptor: guild_runner_desc_v1_t,
    runner_id_c: HeapCStr,
    model: Option<Heap<guild_runner_model_ext_v1_t>>,
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
        if desc.is_null() {
            return Err(Refusal::invalid(
                "register_runner was given a NULL descriptor",
            ));
        }
        // SAFETY: non-NULL and readable per the contract; struct_size comes first.
        let size = unsafe { ptr::addr_of!((*desc).struct_size).read_unaligned() };
        let needed = size_of::<guild_runner_desc_v1_t>();
        if usize::try_from(size).map_or(true, |s| s < needed) {
            return Err(Refusal::invalid(format!(
                "runner descriptor: struct_size {size} is smaller than the {needed} bytes of \
                 guild_runner_desc_v1_t"
            )));
        }
        // SAFETY: the plugin declares at least `needed` readable bytes.
        let raw = unsafe { desc.read_unaligned() };
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

        // SAFETY: per the contract, next_ext is NULL or a valid chain.
        let links = unsafe { walk_chain(raw.next_ext) }.map_err(refuse)?;
        let mut model = None;
        let mut skipped_tags = Vec::new();
        for link in &links {
            match link.header.tag {
                GUILD_RMD1_TAG => {
                    if model.is_some() {
                        return Err(refuse(format!(
                            "extension {} is a second RMD1 extension",
                            link.index
                        )));
                    }
                    // SAFETY: the walk read this header from a live extension; copy_rmd1 checks
                    // the declared size before reading more.
                    model = Some(unsafe { copy_rmd1(link) }.map_err(refuse)?);
                }
                GUILD_GOP1_TAG => {
                    return Err(refuse(format!(
                        "extension {} is GOP1, which belongs on a GUILD_OP_CUSTOM kernel",
                        link.index
                    )));
                }
                tag => skipped_tags.push(tag),
            }
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
        self.model.as_ref().map(Heap::get)
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

    /// The port's view of this runner, with `raw` holding `self`.
    pub(crate) fn into_registered(self) -> RegisteredRunner {
        let owned = Arc::new(self);
        RegisteredRunner {
            runner_id: owned.runner_id.clone(),
            priority: owned.selection_priority(),
            raw: owned,
        }
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

/// Walks a `next_ext` chain, checking each header's size, refusing a cycle, an overlong chain
/// and the PFKE tag (whose 12-byte header has no `next` to follow).
///
/// # Safety
/// `first` must be NULL or the start of a chain whose every extension is readable for at least
/// its declared `struct_size` bytes during this call.
unsafe fn walk_chain(first: *const guild_ext_header_t) -> Result<Vec<ChainLink>, String> {
    let mut links: Vec<ChainLink> = Vec::new();
    let mut at = first;
    while !at.is_null() {
        let index = links.len();
        if let Some(earlier) = links.iter().find(|l| ptr::eq(l.at, at)) {
            return Err(format!(
                "the next_ext chain has a cycle: extension {} links back to extension {}",
                index.saturating_sub(1),
                earlier.index
            ));
        }
        if index == MAX_CHAIN_LENGTH {
            return Err(format!(
                "the next_ext chain is longer than {MAX_CHAIN_LENGTH} extensions"
            ));
        }
        // SAFETY: `at` is non-NULL and, per the contract, a readable extension; its first field
        // is struct_size, which may be read before the size is known.
        let size = unsafe { at.cast::<u32>().read_unaligned() };
        let header_size = size_of::<guild_ext_header_t>();
        if usize::try_from(size).map_or(true, |s| s < header_size) {
            return Err(format!(
                "extension {index} declares struct_size {size}, smaller than the \
                 {header_size}-byte extension header"
            ));
        }
        // SAFETY: the extension declares at least a whole header's worth of readable bytes.
        let header = unsafe { at.read_unaligned() };
        if header.tag == GUILD_PFKE_TAG {
            return Err(format!(
                "extension {index} has the PFKE tag, but PFKE is reached through kernel_fns \
                 and is not a next_ext extension"
            ));
        }
        let next = header.next;
        links.push(ChainLink { index, header, at });
        at = next;
    }
    Ok(links)
}

/// Refuses an extension whose size or version this host cannot read as `T`.
fn check_extension<T>(link: &ChainLink, name: &str, version: u32) -> Result<(), String> {
    let tag = tag_text(link.header.tag);
    let needed = size_of::<T>();
    let size = link.header.struct_size;
    if usize::try_from(size).map_or(true, |s| s < needed) {
        return Err(format!(
            "extension {} ({tag}) declares struct_size {size}, smaller than the {needed} bytes \
             of {name}",
            link.index
        ));
    }
    if link.header.version != version {
        return Err(format!(
            "extension {} ({tag}) has version {}; this host reads version {version}",
            link.index, link.header.version
        ));
    }
    Ok(())
}

/// Copies a GOP1 extension whose header the walk found, after its size, version and callback
/// checks.
///
/// # Safety
/// `link.at` must be readable for `link.header.struct_size` bytes during this call.
unsafe fn copy_gop1(link: &ChainLink) -> Result<Heap<guild_operation_ext_v1_t>, String> {
    check_extension::<guild_operation_ext_v1_t>(
        link,
        "guild_operation_ext_v1_t",
        GUILD_GOP1_VERSION,
    )?;
    // SAFETY: the extension declares at least size_of::<guild_operation_ext_v1_t>() readable
    // bytes (checked just above).
    let mut op = unsafe { link.at.cast::<guild_operation_ext_v1_t>().read_unaligned() };
    for (name, present) in [
        ("validate", op.validate.is_some()),
        ("query_scratch", op.query_scratch.is_some()),
        ("execute", op.execute.is_some()),
    ] {
        if !present {
            return Err(format!(
                "extension {} (GOP1) has a NULL {name} callback, which GOP1 requires",
                link.index
            ));
        }
    }
    op.header.struct_size = size_u32::<guild_operation_ext_v1_t>();
    op.header.next = ptr::null();
    Ok(Heap::new(op))
}

/// Copies an RMD1 extension whose header the walk found, after its size, version and callback
/// checks.
///
/// # Safety
/// `link.at` must be readable for `link.header.struct_size` bytes during this call.
unsafe fn copy_rmd1(link: &ChainLink) -> Result<Heap<guild_runner_model_ext_v1_t>, String> {
    check_extension::<guild_runner_model_ext_v1_t>(
        link,
        "guild_runner_model_ext_v1_t",
        GUILD_RMD1_VERSION,
    )?;
    // SAFETY: the extension declares at least size_of::<guild_runner_model_ext_v1_t>()
    // readable bytes (checked just above).
    let mut model = unsafe {
        link.at
            .cast::<guild_runner_model_ext_v1_t>()
            .read_unaligned()
    };
    for (name, present) in [
        ("recognize", model.recognize.is_some()),
        ("describe", model.describe.is_some()),
        ("validate_numerics", model.validate_numerics.is_some()),
    ] {
        if !present {
            return Err(format!(
                "extension {} (RMD1) has a NULL {name} callback",
                link.index
            ));
        }
    }
    model.header.struct_size = size_u32::<guild_runner_model_ext_v1_t>();
    model.header.next = ptr::null();
    Ok(Heap::new(model))
}

/// Copies the PFKE table of a `GUILD_OP_PREFILL_KERNELS` kernel after checking its own 12-byte
/// header.
///
/// # Safety
/// `table` must be NULL or readable for its declared `struct_size` bytes during this call.
unsafe fn copy_pfke(
    table: *const guild_prefill_kernel_ext_v1_t,
) -> Result<Heap<guild_prefill_kernel_ext_v1_t>, String> {
    if table.is_null() {
        return Err("GUILD_OP_PREFILL_KERNELS needs a PFKE table in kernel_fns".into());
    }
    // SAFETY: non-NULL and readable per the contract; PFKE's header is its first 12 bytes and
    // every PFKE table has at least that.
    let header = unsafe { ptr::addr_of!((*table).header).read_unaligned() };
    let needed = size_of::<guild_prefill_kernel_ext_v1_t>();
    if header.tag != GUILD_PFKE_TAG {
        return Err(format!(
            "kernel_fns of a GUILD_OP_PREFILL_KERNELS kernel has tag {}, not PFKE",
            tag_text(header.tag)
        ));
    }
    if usize::try_from(header.struct_size).map_or(true, |s| s < needed) {
        return Err(format!(
            "its PFKE table declares struct_size {}, smaller than the {needed} bytes of \
             guild_prefill_kernel_ext_v1_t",
            header.struct_size
        ));
    }
    if header.version != GUILD_PFKE_VERSION {
        return Err(format!(
            "its PFKE table has version {}; this host reads version {GUILD_PFKE_VERSION}",
            header.version
        ));
    }
    // SAFETY: the table declares at least `needed` readable bytes (checked just above).
    let mut copy = unsafe { table.read_unaligned() };
    copy.header.struct_size = size_u32::<guild_prefill_kernel_ext_v1_t>();
    Ok(Heap::new(copy))
}

/// Refuses a descriptor built against another Kernel ABI major, whose layout this host cannot
/// know.
fn check_abi_version(what: &str, abi_version: u32) -> Result<(), Refusal> {
    if guild_abi_version_major(abi_version) == guild_abi_version_major(GUILD_KERNEL_ABI_VERSION) {
        return Ok(());
    }
    Err(Refusal {
        status: GUILD_STATUS_ERR_ABI_MISMATCH,
        reason: format!(
            "{what}: built against Kernel ABI {}, whose layout this Kernel ABI {} host cannot \
             read",
            PackedVersion::from_raw(abi_version),
            PackedVersion::from_raw(GUILD_KERNEL_ABI_VERSION)
        ),
    })
}

/// `size_of::<T>()` as the `u32` that `struct_size` fields hold; every ABI struct is far below
/// 4 GiB.
fn size_u32<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
}
