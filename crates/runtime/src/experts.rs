//! Native CPU expert arithmetic: a kernel's CPE1 (or CPU backend v2) table bound once, with a
//! lease on its package, and the host's worker pool that runs batched expert work through it.
//!
//! A CPU kernel whose op kind is `GUILD_OP_BATCHED_EXPERT_EXEC` may carry the CPE1 table
//! (cpu_expert_abi.h), or its version 2, the CPU backend table (cpu_backend_abi.h), which
//! appends optional operations. The loader has already checked and copied the table at
//! registration. [`BoundExpertTable::bind`] turns a [`KernelBinding`] to such a kernel into a
//! plain struct of function pointers and `user_data`, copied once, so that a model's decode loop
//! never looks anything up in the registry again; the struct holds the binding, so the
//! provider's library stays loaded, and its package refuses to be disabled, replaced or rolled
//! back ([`Leased`](guild_domain::lease::Leased)), until the table is dropped.
//!
//! The host keeps scheduling, threading and memory: [`ExpertPool`] decides which worker runs
//! which [`ExpertTask`], every buffer a task names is allocated and owned by the caller (use
//! [`AlignedBuffer`] for the aligned ones), and each worker's scratch is the pool's. The plugin
//! only does arithmetic on what it is handed, for the duration of one call.
//!
//! Every safe wrapper checks the buffers it hands over against the layer's
//! [`guild_cpu_expert_format_v1_t`] (lengths, row ranges, the format's alignment) before calling,
//! so that a callback that stays inside the ranges its arguments describe cannot reach memory the
//! host did not give it. Operations version 2 appends are available only when the plugin's
//! table carries them; asking for one it does not carry is [`ExpertError::NotOffered`].

use std::alloc::{self, Layout};
use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::mem::{self, align_of, size_of};
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use guild_abi::{
    guild_cpu_activation_image_v1_t, guild_cpu_backend_ext_v2_t, guild_cpu_combine_args_v1_t,
    guild_cpu_describe_format_args_v1_t, guild_cpu_expert_down_args_v1_t,
    guild_cpu_expert_format_v1_t, guild_cpu_expert_gate_up_args_v1_t,
    guild_cpu_expert_quantize_activation_args_v1_t, guild_cpu_expert_quantize_hidden_args_v1_t,
    guild_cpu_planar_q2_dequantize_args_v1_t, guild_cpu_planar_q2_quantize_args_v1_t,
    guild_cpu_q2_rows_args_v1_t, guild_cpu_router_args_v1_t, GUILD_BACKEND_CPU,
    GUILD_CPU_ACTIVATION_IMAGE_ALIGN, GUILD_CPU_ACTIVATION_IMAGE_BYTES,
    GUILD_CPU_ACTIVATION_IMAGE_MAX_ELEMENTS, GUILD_CPU_PLANAR_Q2_BLOCK_BYTES,
    GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS, GUILD_DTYPE_F32, GUILD_OP_BATCHED_EXPERT_EXEC,
};
use guild_domain::ids::{ImplId, PackageId};
use guild_domain::operation::CpuIsa;
use thiserror::Error;

use crate::bound::{bound, size_u32, BoundTable, Callback, TableFn};
use crate::error::PluginReason;
use crate::registry::{KernelBinding, KernelRegistry};

// The canonical activation image, checked on the host's side as the C header checks it on the
// plugin's: the record the host allocates is exactly 3584 bytes with 64-byte alignment.
const _: () = {
    assert!(size_of::<guild_cpu_activation_image_v1_t>() == GUILD_CPU_ACTIVATION_IMAGE_BYTES);
    assert!(align_of::<guild_cpu_activation_image_v1_t>() == GUILD_CPU_ACTIVATION_IMAGE_ALIGN);
};

/// Why a kernel binding could not become a [`BoundExpertTable`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BindError {
    /// No kernel with this implementation id is registered (or its package is disabled).
    #[error("no kernel {0} is registered")]
    NoSuchKernel(ImplId),
    /// The kernel is not a CPU `GUILD_OP_BATCHED_EXPERT_EXEC` kernel carrying a CPE1 table.
    #[error("kernel {impl_id} carries no CPE1 table (op kind {op_kind}, backend {backend})")]
    NoExpertTable {
        /// The kernel.
        impl_id: ImplId,
        /// Its `op_kind`.
        op_kind: u32,
        /// Its backend's `GUILD_BACKEND_*` bit.
        backend: u32,
    },
    /// The kernel needs CPU instruction sets this CPU lacks (its descriptor's
    /// `required_cpu_isa`); calling it could execute an illegal instruction.
    #[error("kernel {impl_id} requires CPU instruction sets this CPU lacks ({missing})")]
    MissingCpuIsa {
        /// The kernel.
        impl_id: ImplId,
        /// The required bits this CPU lacks.
        missing: CpuIsa,
    },
}

/// Why a call through a bound table did not happen or failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ExpertError {
    /// The plugin's table does not carry this (version 2) operation.
    #[error("{callback} is not offered by provider {impl_id}")]
    NotOffered {
        /// The provider.
        impl_id: ImplId,
        /// The callback's field name.
        callback: &'static str,
    },
    /// The host's arguments do not fit the layer's format; nothing was called.
    #[error("{callback}: {problem}")]
    Arguments {
        /// The callback that was not called.
        callback: &'static str,
        /// What does not fit.
        problem: String,
    },
    /// The provider's callback returned an error.
    #[error("{callback} failed: {reason}")]
    Provider {
        /// The callback.
        callback: &'static str,
        /// Its status and error record.
        reason: PluginReason,
    },
}

fn arguments(callback: &'static str, problem: impl Into<String>) -> ExpertError {
    ExpertError::Arguments {
        callback,
        problem: problem.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Host-owned aligned memory
// ---------------------------------------------------------------------------------------------

/// A zeroed, host-owned byte buffer with a chosen alignment, for expert images, quantized rows
/// and scratch, whose alignment the format prescribes.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// `len` zero bytes aligned to `align`; `None` when `align` is not a power of two or the
    /// size overflows.
    pub fn zeroed(len: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(1), align.max(1)).ok()?;
        // SAFETY: the layout's size is non-zero.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Some(AlignedBuffer {
            ptr,
            len,
            align: layout.align(),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live, initialised (zeroed) allocation of at least `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The alignment the buffer was allocated with.
    pub fn alignment(&self) -> usize {
        self.align
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout (checked there).
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len.max(1), self.align),
            );
        }
    }
}

impl fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuffer")
            .field("len", &self.len)
            .field("align", &self.align)
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------------------------------

/// One `gate_up_rows` call: intermediate rows `rows` of one expert for `token_count` tokens.
#[derive(Debug)]
pub struct GateUpCall<'a> {
    /// `GUILD_CPU_EXPERT_GLU_*`.
    pub glu: u32,
    /// Which expert of the layer.
    pub expert_index: u32,
    /// Tokens routed to it.
    pub token_count: u32,
    /// Intermediate rows to compute (within `format.intermediate_size`).
    pub rows: Range<u64>,
    /// This expert's image (at least `format.expert_stride_bytes` bytes, aligned to the format).
    pub expert_image: &'a [u8],
    /// `token_count` quantized activation rows of `format.activation_row_bytes`, back to back.
    pub activations: &'a [u8],
    /// `token_count` F32 rows of `format.intermediate_size`; columns `rows` are written.
    pub hidden: &'a mut [f32],
}

/// One `down_rows` call: output rows `rows` of one expert for `token_count` tokens.
#[derive(Debug)]
pub struct DownCall<'a> {
    /// `GUILD_CPU_EXPERT_DOWN_*` bits.
    pub flags: u32,
    /// Which expert of the layer.
    pub expert_index: u32,
    /// Tokens routed to it.
    pub token_count: u32,
    /// Output rows to compute (within `format.hidden_size`).
    pub rows: Range<u64>,
    /// This expert's image (at least `format.expert_stride_bytes` bytes, aligned to the format).
    pub expert_image: &'a [u8],
    /// `token_count` quantized hidden rows of `format.hidden_row_bytes`, back to back.
    pub hidden: &'a [u8],
    /// `token_count` router weights, or `None` for 1 each.
    pub token_weights: Option<&'a [f32]>,
    /// `token_count` F32 rows of `format.hidden_size`; columns `rows` are written.
    pub dst: &'a mut [f32],
}

/// One `router_bf16` call (CPU backend v2), over contiguous rows.
#[derive(Debug)]
pub struct RouterCall<'a> {
    /// `GUILD_CPU_ROUTER_GATING_*`.
    pub gating: u32,
    /// `GUILD_CPU_ROUTER_*` bits.
    pub flags: u32,
    /// Experts to select per token (0: logits only).
    pub top_k: u32,
    /// Factor applied to the selected weights.
    pub weight_scale: f32,
    /// Model width.
    pub hidden_size: u64,
    /// `token_count` F32 rows of `hidden_size`.
    pub input: &'a [f32],
    /// `expert_count` BF16 rows of `hidden_size`.
    pub router_weights: &'a [u16],
    /// Per-expert selection bias, or none.
    pub selection_bias: Option<&'a [f32]>,
    /// `token_count * expert_count` logits, or none.
    pub logits: Option<&'a mut [f32]>,
    /// `token_count * top_k` selected experts.
    pub expert_ids: &'a mut [i32],
    /// `token_count * top_k` their weights.
    pub expert_weights: &'a mut [f32],
}

/// One `q2_rows` call (CPU backend v2): planar-Q2 rows against canonical activation images.
#[derive(Debug)]
pub struct Q2RowsCall<'a> {
    /// `GUILD_CPU_Q2_ROWS_*` bits.
    pub flags: u32,
    /// Tokens.
    pub token_count: u32,
    /// Images per token.
    pub images_per_token: u32,
    /// Elements per weight row.
    pub row_elements: u64,
    /// Rows to compute.
    pub rows: Range<u64>,
    /// The weight rows, back to back at `weight_row_stride_bytes`.
    pub weights: &'a [u8],
    /// Bytes between weight rows.
    pub weight_row_stride_bytes: u64,
    /// `token_count * images_per_token` images.
    pub images: &'a [guild_cpu_activation_image_v1_t],
    /// `token_count` F32 rows of `rows.end` elements at least.
    pub dst: &'a mut [f32],
}

/// One `quantize_planar_q2` call (CPU backend v2): F32 rows to canonical planar Q2.
#[derive(Debug)]
pub struct PlanarQ2QuantizeCall<'a> {
    /// Rows to convert.
    pub row_count: u64,
    /// Elements per row: a non-zero multiple of 256.
    pub row_elements: u64,
    /// `row_count` F32 rows of `row_elements`, back to back.
    pub src: &'a [f32],
    /// `row_elements` per-column importance weights, or `None` for uniform weighting.
    pub importance: Option<&'a [f32]>,
    /// `row_count` planar Q2 rows of `row_elements / 256 * 84` bytes, back to back.
    pub dst: &'a mut [u8],
}

/// One `dequantize_planar_q2` call (CPU backend v2): canonical planar Q2 rows to F32.
#[derive(Debug)]
pub struct PlanarQ2DequantizeCall<'a> {
    /// Rows to convert.
    pub row_count: u64,
    /// Elements per row: a non-zero multiple of 256.
    pub row_elements: u64,
    /// `row_count` planar Q2 rows of `row_elements / 256 * 84` bytes, back to back.
    pub src: &'a [u8],
    /// `row_count` F32 rows of `row_elements`, back to back.
    pub dst: &'a mut [f32],
}

/// One `combine_ordered` call (CPU backend v2): per token, the weighted sum of the expert rows
/// its slots name, in slot order, plus an optional shared row.
#[derive(Debug)]
pub struct CombineCall<'a> {
    /// `GUILD_CPU_COMBINE_*` bits.
    pub flags: u32,
    /// Tokens to combine.
    pub token_count: u32,
    /// Expert slots per token.
    pub top_k: u32,
    /// Elements per row.
    pub hidden_size: u64,
    /// F32 expert output rows of `hidden_size`, back to back, indexed by `slots`.
    pub expert_outputs: &'a [f32],
    /// `token_count * top_k` row indices into `expert_outputs`; a negative one skips its slot.
    pub slots: &'a [i32],
    /// `token_count * top_k` weights, or `None` when the expert rows are already weighted.
    pub weights: Option<&'a [f32]>,
    /// `token_count` F32 rows of `hidden_size` added after the experts, or none.
    pub shared_output: Option<&'a [f32]>,
    /// `token_count` F32 rows of `hidden_size`.
    pub dst: &'a mut [f32],
}

/// One piece of batched expert work for [`ExpertPool::run`].
#[derive(Debug)]
pub enum ExpertTask<'a> {
    /// A `gate_up_rows` call.
    GateUp(GateUpCall<'a>),
    /// A `down_rows` call.
    Down(DownCall<'a>),
}

impl ExpertTask<'_> {
    /// The expert the task works on.
    pub fn expert_index(&self) -> u32 {
        match self {
            ExpertTask::GateUp(c) => c.expert_index,
            ExpertTask::Down(c) => c.expert_index,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The bound table
// ---------------------------------------------------------------------------------------------

/// A kernel's CPE1 table (and the CPU backend v2 operations it carries), copied once out of the
/// registry and bound with a lease: while it lives, the provider's library stays loaded and its
/// package counts one binding.
pub struct BoundExpertTable {
    table: BoundTable<guild_cpu_backend_ext_v2_t>,
    // Last, so that the code the table's pointers reach is released after everything else.
    binding: KernelBinding,
}

// SAFETY: the pointers are the plugin's code and user_data, which stay valid while `binding`
// lives; cpu_expert_abi.h requires every callback to be reentrant and callable from several host
// threads at once with the same user_data, and the table is immutable once bound.
unsafe impl Send for BoundExpertTable {}
// SAFETY: as for Send: shared use only calls the reentrant callbacks.
unsafe impl Sync for BoundExpertTable {}

impl fmt::Debug for BoundExpertTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundExpertTable")
            .field("impl_id", self.impl_id())
            .field("package", self.package())
            .field("version", &self.version())
            .field("absent", &self.absent_callbacks())
            .finish_non_exhaustive()
    }
}

impl BoundExpertTable {
    /// Binds the CPE1 table of the kernel `binding` refers to, copying its callbacks and
    /// `user_data` once. The binding moves into the table and keeps the package leased.
    pub fn bind(binding: KernelBinding) -> Result<Self, BindError> {
        let kernel = binding.kernel();
        let refused = || BindError::NoExpertTable {
            impl_id: kernel.impl_id.clone(),
            op_kind: kernel.op_kind,
            backend: kernel.backend.bit(),
        };
        if kernel.op_kind != GUILD_OP_BATCHED_EXPERT_EXEC
            || kernel.backend.bit() != GUILD_BACKEND_CPU
        {
            return Err(refused());
        }
        let missing = crate::platform::lacking(kernel.required_cpu_isa);
        if !missing.is_empty() {
            return Err(BindError::MissingCpuIsa {
                impl_id: kernel.impl_id.clone(),
                missing,
            });
        }
        // The negotiation left every field the plugin's size does not carry zero (None), so a
        // version 1 table, or a short version 2 one, has no appended operations here.
        let lent = kernel.provider.cpu_backend();
        let table = bound(lent, |t| t.header.next = ptr::null()).ok_or_else(refused)?;
        Ok(BoundExpertTable { table, binding })
    }

    /// Binds the table of the registered kernel `impl_id` (one registry lookup, now).
    pub fn bind_id(registry: &KernelRegistry, impl_id: &ImplId) -> Result<Self, BindError> {
        let binding = registry
            .find_by_id(impl_id)
            .ok_or_else(|| BindError::NoSuchKernel(impl_id.clone()))?;
        Self::bind(binding)
    }

    /// The provider kernel.
    pub fn impl_id(&self) -> &ImplId {
        &self.binding.kernel().impl_id
    }

    /// The package whose library holds the callbacks.
    pub fn package(&self) -> &PackageId {
        self.binding.package()
    }

    /// The table's layout version: 1 for CPE1, 2 for the CPU backend table.
    pub fn version(&self) -> u32 {
        self.table.version()
    }

    /// The optional (version 2) callbacks the plugin's table does not carry, in field order.
    pub fn absent_callbacks(&self) -> &[&'static str] {
        self.table.absent_callbacks()
    }

    /// Whether the table carries the callback named `name` (a field name of the v2 table).
    pub fn offers(&self, name: &str) -> bool {
        let v2 = self.table.table();
        match name {
            "quantize_activation" | "quantize_hidden" | "gate_up_rows" | "down_rows" => true,
            "describe_format" => v2.describe_format.is_some(),
            "quantize_planar_q2" => v2.quantize_planar_q2.is_some(),
            "dequantize_planar_q2" => v2.dequantize_planar_q2.is_some(),
            "q2_rows" => v2.q2_rows.is_some(),
            "router_bf16" => v2.router_bf16.is_some(),
            "combine_ordered" => v2.combine_ordered.is_some(),
            _ => false,
        }
    }

    /// The callback `pick` reads from the table, named `callback`, with the table's `user_data`;
    /// refused as [`ExpertError::NotOffered`] when the table leaves it NULL.
    fn offered<A>(
        &self,
        callback: &'static str,
        pick: impl FnOnce(&guild_cpu_backend_ext_v2_t) -> Option<TableFn<A>>,
    ) -> Result<Callback<A>, ExpertError> {
        self.table
            .callback(pick)
            .ok_or_else(|| ExpertError::NotOffered {
                impl_id: self.impl_id().clone(),
                callback,
            })
    }

    /// Quantizes `row_count` F32 rows of `format.hidden_size` (`src`, back to back) into `dst`,
    /// `row_count` rows of `format.activation_row_bytes` aligned to the format.
    pub fn quantize_activation(
        &self,
        format: &guild_cpu_expert_format_v1_t,
        row_count: u64,
        src: &[f32],
        dst: &mut [u8],
    ) -> Result<(), ExpertError> {
        const NAME: &str = "quantize_activation";
        check_format(NAME, format)?;
        check_len(NAME, "src", src.len(), row_count, format.hidden_size)?;
        check_len(
            NAME,
            "dst",
            dst.len(),
            row_count,
            format.activation_row_bytes,
        )?;
        check_aligned(NAME, "dst", dst.as_ptr(), format.alignment)?;
        let args = guild_cpu_expert_quantize_activation_args_v1_t {
            struct_size: size_u32::<guild_cpu_expert_quantize_activation_args_v1_t>(),
            src_dtype: GUILD_DTYPE_F32,
            row_count,
            format,
            src: src.as_ptr().cast(),
            src_row_stride_bytes: format.hidden_size * 4,
            dst: dst.as_mut_ptr().cast(),
            dst_row_stride_bytes: format.activation_row_bytes,
        };
        let f = self.offered(NAME, |t| t.quantize_activation)?;
        // SAFETY: the callback is the plugin's, loaded while `self.binding` lives; the args
        // describe host buffers whose lengths were checked against the format just above and
        // that outlive the call.
        unsafe { call(NAME, f, &args) }
    }

    /// Quantizes `row_count` F32 hidden rows of `format.intermediate_size` into `dst`,
    /// `row_count` rows of `format.hidden_row_bytes` aligned to the format.
    pub fn quantize_hidden(
        &self,
        format: &guild_cpu_expert_format_v1_t,
        row_count: u64,
        src: &[f32],
        dst: &mut [u8],
    ) -> Result<(), ExpertError> {
        const NAME: &str = "quantize_hidden";
        check_format(NAME, format)?;
        check_len(NAME, "src", src.len(), row_count, format.intermediate_size)?;
        check_len(NAME, "dst", dst.len(), row_count, format.hidden_row_bytes)?;
        check_aligned(NAME, "dst", dst.as_ptr(), format.alignment)?;
        let args = guild_cpu_expert_quantize_hidden_args_v1_t {
            struct_size: size_u32::<guild_cpu_expert_quantize_hidden_args_v1_t>(),
            src_dtype: GUILD_DTYPE_F32,
            row_count,
            format,
            src: src.as_ptr().cast(),
            src_row_stride_bytes: format.intermediate_size * 4,
            dst: dst.as_mut_ptr().cast(),
            dst_row_stride_bytes: format.hidden_row_bytes,
        };
        let f = self.offered(NAME, |t| t.quantize_hidden)?;
        // SAFETY: as in quantize_activation.
        unsafe { call(NAME, f, &args) }
    }

    /// Runs one `gate_up_rows` call with `scratch` (at least `format.scratch_bytes`, aligned).
    pub fn gate_up_rows(
        &self,
        format: &guild_cpu_expert_format_v1_t,
        call_args: &mut GateUpCall<'_>,
        scratch: &mut [u8],
    ) -> Result<(), ExpertError> {
        const NAME: &str = "gate_up_rows";
        let c = call_args;
        check_format(NAME, format)?;
        check_expert(NAME, format, c.expert_index, c.expert_image)?;
        check_rows(NAME, &c.rows, format.intermediate_size)?;
        let tokens = u64::from(c.token_count);
        check_len(
            NAME,
            "activations",
            c.activations.len(),
            tokens,
            format.activation_row_bytes,
        )?;
        check_aligned(
            NAME,
            "activations",
            c.activations.as_ptr(),
            format.alignment,
        )?;
        check_len(
            NAME,
            "hidden",
            c.hidden.len(),
            tokens,
            format.intermediate_size,
        )?;
        let scratch = check_scratch(NAME, format, scratch)?;
        let args = guild_cpu_expert_gate_up_args_v1_t {
            struct_size: size_u32::<guild_cpu_expert_gate_up_args_v1_t>(),
            glu: c.glu,
            expert_index: c.expert_index,
            token_count: c.token_count,
            row_begin: c.rows.start,
            row_end: c.rows.end,
            format,
            expert_image: c.expert_image.as_ptr().cast(),
            activations: c.activations.as_ptr().cast(),
            activation_row_stride_bytes: format.activation_row_bytes,
            hidden: c.hidden.as_mut_ptr(),
            hidden_row_stride_bytes: format.intermediate_size * 4,
            scratch: scratch.0,
            scratch_bytes: scratch.1,
        };
        let f = self.offered(NAME, |t| t.gate_up_rows)?;
        // SAFETY: as in quantize_activation; the expert image, rows and scratch were checked too.
        unsafe { call(NAME, f, &args) }
    }

    /// Runs one `down_rows` call with `scratch` (at least `format.scratch_bytes`, aligned).
    pub fn down_rows(
        &self,
        format: &guild_cpu_expert_format_v1_t,
        call_args: &mut DownCall<'_>,
        scratch: &mut [u8],
    ) -> Result<(), ExpertError> {
        const NAME: &str = "down_rows";
        let c = call_args;
        check_format(NAME, format)?;
        check_expert(NAME, format, c.expert_index, c.expert_image)?;
        check_rows(NAME, &c.rows, format.hidden_size)?;
        let tokens = u64::from(c.token_count);
        check_len(
            NAME,
            "hidden",
            c.hidden.len(),
            tokens,
            format.hidden_row_bytes,
        )?;
        check_aligned(NAME, "hidden", c.hidden.as_ptr(), format.alignment)?;
        check_len(NAME, "dst", c.dst.len(), tokens, format.hidden_size)?;
        if let Some(w) = c.token_weights {
            check_len(NAME, "token_weights", w.len(), tokens, 1)?;
        }
        let scratch = check_scratch(NAME, format, scratch)?;
        let args = guild_cpu_expert_down_args_v1_t {
            struct_size: size_u32::<guild_cpu_expert_down_args_v1_t>(),
            flags: c.flags,
            expert_index: c.expert_index,
            token_count: c.token_count,
            row_begin: c.rows.start,
            row_end: c.rows.end,
            format,
            expert_image: c.expert_image.as_ptr().cast(),
            hidden: c.hidden.as_ptr().cast(),
            hidden_row_stride_bytes: format.hidden_row_bytes,
            token_weights: c.token_weights.map_or(ptr::null(), <[f32]>::as_ptr),
            dst: c.dst.as_mut_ptr(),
            dst_row_stride_bytes: format.hidden_size * 4,
            scratch: scratch.0,
            scratch_bytes: scratch.1,
        };
        let f = self.offered(NAME, |t| t.down_rows)?;
        // SAFETY: as in gate_up_rows.
        unsafe { call(NAME, f, &args) }
    }

    /// Asks the provider (CPU backend v2 `describe_format`) for the format it wants for a layer.
    pub fn describe_format(
        &self,
        weight_layout: u32,
        gate_up_dtype: u32,
        down_dtype: u32,
        shape: [u64; 3],
    ) -> Result<guild_cpu_expert_format_v1_t, ExpertError> {
        const NAME: &str = "describe_format";
        let f = self.offered(NAME, |t| t.describe_format)?;
        // SAFETY: the format record is plain integers; all-zero is a valid value.
        let mut out: guild_cpu_expert_format_v1_t = unsafe { std::mem::zeroed() };
        out.struct_size = size_u32::<guild_cpu_expert_format_v1_t>();
        let args = guild_cpu_describe_format_args_v1_t {
            struct_size: size_u32::<guild_cpu_describe_format_args_v1_t>(),
            weight_layout,
            gate_up_dtype,
            down_dtype,
            hidden_size: shape[0],
            intermediate_size: shape[1],
            expert_count: shape[2],
            format_out: &mut out,
        };
        // SAFETY: the callback is loaded while `self.binding` lives; format_out is a live local.
        unsafe { call(NAME, f, &args) }?;
        Ok(out)
    }

    /// Runs the provider's router (CPU backend v2 `router_bf16`) over `input.len() / hidden_size`
    /// tokens and `router_weights.len() / hidden_size` experts.
    pub fn router_bf16(&self, c: &mut RouterCall<'_>) -> Result<(), ExpertError> {
        const NAME: &str = "router_bf16";
        let f = self.offered(NAME, |t| t.router_bf16)?;
        let width = usize::try_from(c.hidden_size)
            .ok()
            .filter(|w| *w > 0)
            .ok_or_else(|| arguments(NAME, "hidden_size is 0"))?;
        if !c.input.len().is_multiple_of(width) || !c.router_weights.len().is_multiple_of(width) {
            return Err(arguments(
                NAME,
                "input and router rows must be whole rows of hidden_size",
            ));
        }
        let tokens = c.input.len() / width;
        let experts = c.router_weights.len() / width;
        let k = c.top_k as usize;
        if k > experts {
            return Err(arguments(
                NAME,
                format!("top_k {k} exceeds {experts} experts"),
            ));
        }
        if c.expert_ids.len() < tokens * k || c.expert_weights.len() < tokens * k {
            return Err(arguments(
                NAME,
                format!("expert_ids and expert_weights need {} entries", tokens * k),
            ));
        }
        if c.logits
            .as_ref()
            .is_some_and(|l| l.len() < tokens * experts)
        {
            return Err(arguments(
                NAME,
                format!("logits need {} entries", tokens * experts),
            ));
        }
        if c.selection_bias.is_some_and(|b| b.len() < experts) {
            return Err(arguments(
                NAME,
                format!("selection_bias needs {experts} entries"),
            ));
        }
        let (Ok(token_count), Ok(expert_count)) = (u32::try_from(tokens), u32::try_from(experts))
        else {
            return Err(arguments(NAME, "too many tokens or experts"));
        };
        let args = guild_cpu_router_args_v1_t {
            struct_size: size_u32::<guild_cpu_router_args_v1_t>(),
            input_dtype: GUILD_DTYPE_F32,
            gating: c.gating,
            flags: c.flags,
            token_count,
            expert_count,
            top_k: c.top_k,
            weight_scale: c.weight_scale,
            hidden_size: c.hidden_size,
            input: c.input.as_ptr().cast(),
            input_row_stride_bytes: c.hidden_size * 4,
            router_weights: c.router_weights.as_ptr(),
            router_row_stride_bytes: c.hidden_size * 2,
            selection_bias: c.selection_bias.map_or(ptr::null(), <[f32]>::as_ptr),
            logits: c
                .logits
                .as_mut()
                .map_or(ptr::null_mut(), |l| l.as_mut_ptr()),
            expert_ids: c.expert_ids.as_mut_ptr(),
            expert_weights: c.expert_weights.as_mut_ptr(),
        };
        // SAFETY: the callback is loaded while `self.binding` lives; every buffer's length was
        // checked against the counts the args state.
        unsafe { call(NAME, f, &args) }
    }

    /// Runs the provider's planar-Q2 rows (CPU backend v2 `q2_rows`) against canonical
    /// activation images, whose 3584-byte, 64-byte-aligned layout is checked again at run time.
    pub fn q2_rows(&self, c: &mut Q2RowsCall<'_>) -> Result<(), ExpertError> {
        const NAME: &str = "q2_rows";
        let f = self.offered(NAME, |t| t.q2_rows)?;
        check_aligned(
            NAME,
            "images",
            c.images.as_ptr().cast(),
            GUILD_CPU_ACTIVATION_IMAGE_ALIGN as u32,
        )?;
        let images = u64::from(c.token_count) * u64::from(c.images_per_token);
        if (c.images.len() as u64) < images {
            return Err(arguments(
                NAME,
                format!("images: {images} needed, {} given", c.images.len()),
            ));
        }
        if c.rows.start > c.rows.end {
            return Err(arguments(NAME, "rows run backwards"));
        }
        let block = u64::from(GUILD_CPU_PLANAR_Q2_BLOCK_BYTES);
        let elements = GUILD_CPU_ACTIVATION_IMAGE_MAX_ELEMENTS as u64;
        if c.row_elements.div_ceil(256) * block > c.weight_row_stride_bytes
            || u64::from(c.images_per_token) * elements < c.row_elements
        {
            return Err(arguments(
                NAME,
                format!(
                    "{} elements per row need {} bytes per weight row and {} images per token",
                    c.row_elements,
                    c.row_elements.div_ceil(256) * block,
                    c.row_elements.div_ceil(elements)
                ),
            ));
        }
        check_len(
            NAME,
            "weights",
            c.weights.len(),
            c.rows.end,
            c.weight_row_stride_bytes,
        )?;
        check_len(
            NAME,
            "dst",
            c.dst.len(),
            u64::from(c.token_count),
            c.rows.end,
        )?;
        let args = guild_cpu_q2_rows_args_v1_t {
            struct_size: size_u32::<guild_cpu_q2_rows_args_v1_t>(),
            flags: c.flags,
            token_count: c.token_count,
            images_per_token: c.images_per_token,
            row_elements: c.row_elements,
            row_begin: c.rows.start,
            row_end: c.rows.end,
            weights: c.weights.as_ptr().cast(),
            weight_row_stride_bytes: c.weight_row_stride_bytes,
            images: c.images.as_ptr(),
            dst: c.dst.as_mut_ptr(),
            dst_row_stride_bytes: c.rows.end * 4,
        };
        // SAFETY: the callback is loaded while `self.binding` lives; images are typed records
        // (3584 bytes, 64-aligned by their type and checked above) and the other buffers' lengths
        // were checked against the args.
        unsafe { call(NAME, f, &args) }
    }

    /// Converts F32 rows to canonical planar Q2 (CPU backend v2 `quantize_planar_q2`).
    pub fn quantize_planar_q2(&self, c: &mut PlanarQ2QuantizeCall<'_>) -> Result<(), ExpertError> {
        const NAME: &str = "quantize_planar_q2";
        let f = self.offered(NAME, |t| t.quantize_planar_q2)?;
        let row_bytes = planar_q2_row_bytes(NAME, c.row_elements)?;
        check_len(NAME, "src", c.src.len(), c.row_count, c.row_elements)?;
        if let Some(importance) = c.importance {
            check_len(NAME, "importance", importance.len(), 1, c.row_elements)?;
        }
        check_len(NAME, "dst", c.dst.len(), c.row_count, row_bytes)?;
        let args = guild_cpu_planar_q2_quantize_args_v1_t {
            struct_size: size_u32::<guild_cpu_planar_q2_quantize_args_v1_t>(),
            src_dtype: GUILD_DTYPE_F32,
            row_count: c.row_count,
            row_elements: c.row_elements,
            src: c.src.as_ptr().cast(),
            src_row_stride_bytes: c.row_elements * 4,
            importance: c.importance.map_or(ptr::null(), <[f32]>::as_ptr),
            dst: c.dst.as_mut_ptr().cast(),
            dst_row_stride_bytes: row_bytes,
        };
        // SAFETY: the callback is loaded while `self.binding` lives; the F32 buffers are aligned
        // by their type, planar Q2 rows are bytes, and every length was checked against the
        // counts and strides the args state.
        unsafe { call(NAME, f, &args) }
    }

    /// Expands canonical planar Q2 rows to F32 (CPU backend v2 `dequantize_planar_q2`).
    pub fn dequantize_planar_q2(
        &self,
        c: &mut PlanarQ2DequantizeCall<'_>,
    ) -> Result<(), ExpertError> {
        const NAME: &str = "dequantize_planar_q2";
        let f = self.offered(NAME, |t| t.dequantize_planar_q2)?;
        let row_bytes = planar_q2_row_bytes(NAME, c.row_elements)?;
        check_len(NAME, "src", c.src.len(), c.row_count, row_bytes)?;
        check_len(NAME, "dst", c.dst.len(), c.row_count, c.row_elements)?;
        let args = guild_cpu_planar_q2_dequantize_args_v1_t {
            struct_size: size_u32::<guild_cpu_planar_q2_dequantize_args_v1_t>(),
            dst_dtype: GUILD_DTYPE_F32,
            row_count: c.row_count,
            row_elements: c.row_elements,
            src: c.src.as_ptr().cast(),
            src_row_stride_bytes: row_bytes,
            dst: c.dst.as_mut_ptr().cast(),
            dst_row_stride_bytes: c.row_elements * 4,
        };
        // SAFETY: as in quantize_planar_q2.
        unsafe { call(NAME, f, &args) }
    }

    /// Combines expert rows per token in slot order (CPU backend v2 `combine_ordered`). Every
    /// non-negative slot must name a whole row of `expert_outputs`.
    pub fn combine_ordered(&self, c: &mut CombineCall<'_>) -> Result<(), ExpertError> {
        const NAME: &str = "combine_ordered";
        let f = self.offered(NAME, |t| t.combine_ordered)?;
        let width = usize::try_from(c.hidden_size)
            .ok()
            .filter(|w| *w > 0)
            .ok_or_else(|| arguments(NAME, "hidden_size is 0"))?;
        if !c.expert_outputs.len().is_multiple_of(width) {
            return Err(arguments(
                NAME,
                "expert_outputs must be whole rows of hidden_size",
            ));
        }
        let expert_rows = c.expert_outputs.len() / width;
        let tokens = u64::from(c.token_count);
        let slot_count = tokens * u64::from(c.top_k);
        check_len(NAME, "slots", c.slots.len(), tokens, u64::from(c.top_k))?;
        if let Some(weights) = c.weights {
            check_len(NAME, "weights", weights.len(), tokens, u64::from(c.top_k))?;
        }
        if let Some(shared) = c.shared_output {
            check_len(NAME, "shared_output", shared.len(), tokens, c.hidden_size)?;
        }
        check_len(NAME, "dst", c.dst.len(), tokens, c.hidden_size)?;
        // The provider reads expert_outputs at every slot it is given, so each must be in range.
        if let Some((at, slot)) = c
            .slots
            .iter()
            .take(slot_count as usize)
            .enumerate()
            .find(|(_, s)| usize::try_from(**s).is_ok_and(|row| row >= expert_rows))
        {
            return Err(arguments(
                NAME,
                format!("slot {at} names row {slot} of {expert_rows} expert rows"),
            ));
        }
        let args = guild_cpu_combine_args_v1_t {
            struct_size: size_u32::<guild_cpu_combine_args_v1_t>(),
            flags: c.flags,
            token_count: c.token_count,
            top_k: c.top_k,
            hidden_size: c.hidden_size,
            expert_outputs: c.expert_outputs.as_ptr(),
            expert_output_row_stride_bytes: c.hidden_size * 4,
            slots: c.slots.as_ptr(),
            weights: c.weights.map_or(ptr::null(), <[f32]>::as_ptr),
            shared_output: c.shared_output.map_or(ptr::null(), <[f32]>::as_ptr),
            shared_output_row_stride_bytes: c.hidden_size * 4,
            dst: c.dst.as_mut_ptr(),
            dst_row_stride_bytes: c.hidden_size * 4,
        };
        // SAFETY: the callback is loaded while `self.binding` lives; every buffer's length was
        // checked against the counts the args state, and every slot names a whole expert row.
        unsafe { call(NAME, f, &args) }
    }

    /// Runs one task through the matching callback.
    pub fn run_task(
        &self,
        format: &guild_cpu_expert_format_v1_t,
        task: &mut ExpertTask<'_>,
        scratch: &mut [u8],
    ) -> Result<(), ExpertError> {
        match task {
            ExpertTask::GateUp(c) => self.gate_up_rows(format, c, scratch),
            ExpertTask::Down(c) => self.down_rows(format, c, scratch),
        }
    }
}

/// The bytes of one planar Q2 row of `row_elements` (a non-zero multiple of 256).
fn planar_q2_row_bytes(callback: &'static str, row_elements: u64) -> Result<u64, ExpertError> {
    let block = u64::from(GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS);
    if row_elements == 0 || !row_elements.is_multiple_of(block) {
        return Err(arguments(
            callback,
            format!("row_elements {row_elements} is not a non-zero multiple of {block}"),
        ));
    }
    Ok(row_elements / block * u64::from(GUILD_CPU_PLANAR_Q2_BLOCK_BYTES))
}

/// Calls `f`, the callback named `callback`, with `args`, and turns a failure into
/// [`ExpertError::Provider`].
///
/// # Safety
///
/// As for [`Callback::call`]: the table `f` came from is still bound, and `args` is what the
/// callback's header asks of the host.
pub(crate) unsafe fn call<A>(
    callback: &'static str,
    f: Callback<A>,
    args: &A,
) -> Result<(), ExpertError> {
    // SAFETY: forwarded from this function's contract.
    unsafe { f.call(args) }.map_err(|reason| ExpertError::Provider { callback, reason })
}

fn check_format(
    callback: &'static str,
    format: &guild_cpu_expert_format_v1_t,
) -> Result<(), ExpertError> {
    if (format.struct_size as usize) < size_of::<guild_cpu_expert_format_v1_t>() {
        return Err(arguments(
            callback,
            format!("format.struct_size {} is short", format.struct_size),
        ));
    }
    // Every matrix must lie inside one expert's image, so that a provider that stays inside
    // the format's description stays inside the image the host hands over.
    let end = |offset: u64, rows: u64, stride: u64| {
        rows.checked_mul(stride).and_then(|b| b.checked_add(offset))
    };
    for (matrix, last) in [
        (
            "gate",
            end(
                format.gate_offset_bytes,
                format.intermediate_size,
                format.gate_up_row_stride_bytes,
            ),
        ),
        (
            "up",
            end(
                format.up_offset_bytes,
                format.intermediate_size,
                format.gate_up_row_stride_bytes,
            ),
        ),
        (
            "down",
            end(
                format.down_offset_bytes,
                format.hidden_size,
                format.down_row_stride_bytes,
            ),
        ),
    ] {
        if last.is_none_or(|last| last > format.expert_stride_bytes) {
            return Err(arguments(
                callback,
                format!(
                    "the {matrix} matrix ends past expert_stride_bytes {}",
                    format.expert_stride_bytes
                ),
            ));
        }
    }
    if !format.alignment.is_power_of_two() || format.alignment < 16 {
        return Err(arguments(
            callback,
            format!(
                "format.alignment {} is not a power of two of at least 16",
                format.alignment
            ),
        ));
    }
    Ok(())
}

/// `len` elements hold `rows` rows of `per_row` elements.
fn check_len(
    callback: &'static str,
    what: &str,
    len: usize,
    rows: u64,
    per_row: u64,
) -> Result<(), ExpertError> {
    match rows.checked_mul(per_row) {
        Some(needed) if (len as u64) >= needed => Ok(()),
        needed => Err(arguments(
            callback,
            format!(
                "{what}: {} needed for {rows} rows of {per_row}, {len} given",
                needed.map_or_else(|| "more than 2^64".to_owned(), |n| n.to_string())
            ),
        )),
    }
}

fn check_aligned(
    callback: &'static str,
    what: &str,
    at: *const u8,
    alignment: u32,
) -> Result<(), ExpertError> {
    if (at as usize).is_multiple_of(alignment.max(1) as usize) {
        Ok(())
    } else {
        Err(arguments(
            callback,
            format!("{what} is not aligned to {alignment} bytes"),
        ))
    }
}

fn check_rows(callback: &'static str, rows: &Range<u64>, limit: u64) -> Result<(), ExpertError> {
    if rows.start <= rows.end && rows.end <= limit {
        Ok(())
    } else {
        Err(arguments(
            callback,
            format!("rows {rows:?} are not within 0..{limit}"),
        ))
    }
}

fn check_expert(
    callback: &'static str,
    format: &guild_cpu_expert_format_v1_t,
    expert_index: u32,
    image: &[u8],
) -> Result<(), ExpertError> {
    if u64::from(expert_index) >= format.expert_count {
        return Err(arguments(
            callback,
            format!(
                "expert {expert_index} is not below expert_count {}",
                format.expert_count
            ),
        ));
    }
    check_len(
        callback,
        "expert_image",
        image.len(),
        1,
        format.expert_stride_bytes,
    )?;
    check_aligned(callback, "expert_image", image.as_ptr(), format.alignment)
}

/// The scratch pointer and size to hand over: NULL when the format needs none.
fn check_scratch(
    callback: &'static str,
    format: &guild_cpu_expert_format_v1_t,
    scratch: &mut [u8],
) -> Result<(*mut c_void, u64), ExpertError> {
    if format.scratch_bytes == 0 {
        return Ok((ptr::null_mut(), 0));
    }
    check_len(callback, "scratch", scratch.len(), 1, format.scratch_bytes)?;
    check_aligned(callback, "scratch", scratch.as_ptr(), format.alignment)?;
    Ok((scratch.as_mut_ptr().cast(), scratch.len() as u64))
}

// ---------------------------------------------------------------------------------------------
// The worker pool
// ---------------------------------------------------------------------------------------------

/// A task of a batch that failed: which one, for which expert, and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("expert {expert_index} (task {task}): {error}")]
pub struct PoolError {
    /// The task's position in the batch.
    pub task: usize,
    /// The expert it worked on.
    pub expert_index: u32,
    /// What went wrong.
    pub error: ExpertError,
}

/// The host's expert worker pool: runs a batch of [`ExpertTask`]s across its workers and the
/// calling thread through a bound table and returns when all are done.
///
/// The workers are started once, by [`ExpertPool::new`], and live as long as the pool. The
/// caller of [`ExpertPool::run`] takes tasks too, so that a batch never waits for a worker to
/// wake before work starts, and a batch of one task runs on the caller alone, touching no
/// worker. Between batches a worker first watches for the next batch for a few microseconds
/// (spinning, then yielding its core) and only then sleeps on a condition variable: a decode
/// loop's batches (one per MoE layer per token) come faster than that, so they cost no wake-up,
/// while an idle pool costs no CPU. A batch wakes at most one sleeping worker, and each worker
/// that takes a task wakes the next while tasks are left. Dropping the pool stops and joins the
/// workers. Each worker, and the caller's side, keeps one scratch buffer for the pool's life,
/// aligned to the format; it grows only when a batch's format needs more than any before (its
/// contents are undefined on entry, as cpu_expert_abi.h says), so a steady decode loop
/// allocates nothing in the pool.
///
/// Tasks are handed out one at a time in batch order; each writes only its own output slice,
/// so the results do not depend on the number of workers or on which thread ran which task.
/// [`ExpertPool::run`] borrows the table, the format and the tasks' buffers and does not return
/// until every task of the batch has finished, so no worker touches them after the call; the
/// borrow is also what keeps the table's lease, and so the provider's library, alive while
/// workers call into it. Batches from several threads on one pool run one after another.
pub struct ExpertPool {
    shared: Arc<Shared>,
    /// Held for the whole of a batch, so that batches run one at a time; it holds the scratch
    /// of the tasks the caller runs.
    batch: Mutex<Scratch>,
    workers: Vec<JoinHandle<()>>,
}

impl fmt::Debug for ExpertPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExpertPool")
            .field("threads", &self.threads())
            .finish_non_exhaustive()
    }
}

/// What a batch is to the workers: run task `index` with this worker's scratch.
type Job<'a> = dyn Fn(usize, &mut Scratch) -> Result<(), PoolError> + Sync + 'a;

/// The current batch's job, its lifetime erased (see [`ExpertPool::dispatch`]).
#[derive(Clone, Copy)]
struct JobRef(*const Job<'static>);

// SAFETY: the pointer is only a way to reach a `Sync` closure from the workers; `dispatch`
// keeps the closure alive for as long as a worker may dereference it.
unsafe impl Send for JobRef {}

/// The pool's state, shared with its workers.
struct Shared {
    state: Mutex<State>,
    /// Workers sleep here for a batch or for shutdown.
    work: Condvar,
    /// The caller of `run` sleeps here for the batch's last task.
    done: Condvar,
    /// Bumped, under the lock, whenever a batch is published or shutdown is asked for; a worker
    /// watches it without the lock before it sleeps.
    epoch: AtomicU64,
    /// Tasks of the current batch not finished yet, which the caller watches without the lock
    /// before it sleeps. Written under the lock; read outside it only as that hint.
    unfinished: AtomicUsize,
}

impl Shared {
    /// The state. No code holding the lock panics (jobs run outside it, inside `catch_unwind`),
    /// so a poisoned lock can only mean a panic between two consistent updates: keep going.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs task `index` of `job` (handed out to this thread, unfinished) outside the lock, and
    /// records its outcome under it; answers the lock again.
    fn run_task<'s>(
        &'s self,
        state: MutexGuard<'s, State>,
        job: JobRef,
        index: usize,
        scratch: &mut Scratch,
    ) -> MutexGuard<'s, State> {
        drop(state);
        // SAFETY: task `index` is handed out but not finished, and `dispatch` clears `job` and
        // returns only once every task has finished, so the closure it published is alive until
        // this thread records the outcome below.
        let job = unsafe { &*job.0 };
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| job(index, scratch)));
        let mut state = self.lock();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(failure)) => {
                if state.failure.as_ref().is_none_or(|f| f.task > failure.task) {
                    state.failure = Some(failure);
                }
            }
            Err(payload) => {
                if state.panic.as_ref().is_none_or(|(at, _)| *at > index) {
                    state.panic = Some((index, payload));
                }
            }
        }
        state.finished += 1;
        self.unfinished
            .store(state.count - state.finished, Ordering::Release);
        if state.finished == state.count && state.caller_sleeps {
            self.done.notify_one();
        }
        state
    }

    /// The next task of the current batch, if one is left, handed out to the caller; wakes one
    /// more sleeping worker when tasks are left after it.
    fn take(&self, state: &mut State) -> Option<(JobRef, usize)> {
        let job = state.job?;
        if state.next >= state.count {
            return None;
        }
        let index = state.next;
        state.next += 1;
        if state.next < state.count && state.sleeping > 0 {
            self.work.notify_one();
        }
        Some((job, index))
    }
}

/// How long a thread watches for what it waits for before it sleeps: a worker for the next
/// batch, the caller for the last task of its batch.
const WATCH: Duration = Duration::from_micros(20);

/// Whether `ready` became true within [`WATCH`]: a few spins, then yielding the core, so that a
/// watching thread on a busy machine leaves the core to the threads with work.
fn watch(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    for round in 0u32.. {
        if ready() {
            return true;
        }
        if round < 64 {
            std::hint::spin_loop();
        } else {
            if round.is_multiple_of(16) && start.elapsed() >= WATCH {
                return false;
            }
            thread::yield_now();
        }
    }
    false
}

#[derive(Default)]
struct State {
    /// The batch being run; `Some` only while its `run` waits for it.
    job: Option<JobRef>,
    /// The batch's tasks, the next to hand out and how many have finished.
    count: usize,
    next: usize,
    finished: usize,
    /// The failure of the lowest-numbered failed task so far.
    failure: Option<PoolError>,
    /// The panic of the lowest-numbered task that panicked so far.
    panic: Option<(usize, Box<dyn Any + Send>)>,
    /// Workers asleep on `work`.
    sleeping: usize,
    /// Whether the caller is asleep on `done`.
    caller_sleeps: bool,
    shutdown: bool,
}

/// A worker's scratch, kept across batches.
#[derive(Default)]
struct Scratch(Option<AlignedBuffer>);

impl Scratch {
    /// `len` bytes aligned to `align` (a layout the caller checked), reusing the buffer when it
    /// is large and aligned enough and replacing it by one that covers both otherwise.
    fn get(&mut self, len: usize, align: usize) -> &mut [u8] {
        if len == 0 {
            return &mut [];
        }
        let fits = |b: &AlignedBuffer| b.len >= len && b.align >= align;
        if !self.0.as_ref().is_some_and(fits) {
            let (old_len, old_align) = self.0.as_ref().map_or((0, 1), |b| (b.len, b.align));
            self.0 = None;
            let grown = AlignedBuffer::zeroed(len.max(old_len), align.max(old_align))
                .or_else(|| AlignedBuffer::zeroed(len, align))
                .unwrap_or_else(|| unreachable!("the scratch layout was checked"));
            self.0 = Some(grown);
        }
        match &mut self.0 {
            Some(buffer) => &mut buffer.as_mut_slice()[..len],
            None => unreachable!("allocated above"),
        }
    }
}

/// A worker: waits for a batch, takes its tasks one at a time until none is left, and reports
/// each outcome, until the pool shuts down.
fn work(shared: &Shared) {
    let mut scratch = Scratch::default();
    let mut state = shared.lock();
    loop {
        if let Some((job, index)) = shared.take(&mut state) {
            state = shared.run_task(state, job, index, &mut scratch);
            continue;
        }
        if state.shutdown {
            return;
        }
        // Nothing to do: watch for the next batch a while, then sleep. The epoch is bumped under
        // the lock, so one still unchanged under it means no batch came since this worker
        // looked, and `dispatch` will see it asleep.
        let seen = shared.epoch.load(Ordering::Acquire);
        drop(state);
        watch(|| shared.epoch.load(Ordering::Acquire) != seen);
        state = shared.lock();
        if shared.epoch.load(Ordering::Relaxed) == seen {
            state.sleeping += 1;
            state = shared
                .work
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.sleeping -= 1;
        }
    }
}

/// The tasks of one batch, reached by index from the workers.
struct TaskSlots<'a>(*mut ExpertTask<'a>);

// SAFETY: the workers reach the slots only through `get`, with distinct indices (the pool hands
// each out once), so no task is shared between threads, only sent; `ExpertTask` is `Send`.
unsafe impl<'a> Sync for TaskSlots<'a> where ExpertTask<'a>: Send {}

impl<'a> TaskSlots<'a> {
    /// Task `index`.
    ///
    /// # Safety
    ///
    /// `index` is within the batch, no other reference to that task is live, and the tasks'
    /// vector is neither moved nor touched until the batch is over.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, index: usize) -> &mut ExpertTask<'a> {
        // SAFETY: in bounds and exclusive, by the caller's contract.
        unsafe { &mut *self.0.add(index) }
    }
}

impl ExpertPool {
    /// A pool of `threads` workers (at least one), started now.
    ///
    /// # Panics
    ///
    /// When the operating system refuses to start a thread, as [`std::thread::spawn`] does;
    /// [`ExpertPool::try_new`] returns the error instead.
    pub fn new(threads: usize) -> Self {
        Self::try_new(threads).unwrap_or_else(|e| panic!("starting expert workers: {e}"))
    }

    /// A pool of `threads` workers (at least one), or the error that stopped a worker from
    /// starting (the ones already started are stopped again).
    pub fn try_new(threads: usize) -> std::io::Result<Self> {
        let mut pool = ExpertPool {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                done: Condvar::new(),
                epoch: AtomicU64::new(0),
                unfinished: AtomicUsize::new(0),
            }),
            batch: Mutex::new(Scratch::default()),
            workers: Vec::with_capacity(threads.max(1)),
        };
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let worker = thread::Builder::new()
                .name(format!("guild-expert-{i}"))
                .spawn(move || work(&shared))?;
            pool.workers.push(worker);
        }
        Ok(pool)
    }

    /// The number of workers.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Runs every task of `tasks` through `table`, and waits for all. Every task runs, even
    /// after another failed; the failure reported is the first in batch order. A format that
    /// does not pass the checks of the bound table's wrappers is refused before any task runs,
    /// reported against the first task. A panic in a worker is raised again here, once every
    /// task has finished; the pool stays usable.
    pub fn run(
        &self,
        table: &BoundExpertTable,
        format: &guild_cpu_expert_format_v1_t,
        mut tasks: Vec<ExpertTask<'_>>,
    ) -> Result<(), PoolError> {
        let refused = |tasks: &[ExpertTask<'_>], error| PoolError {
            task: 0,
            expert_index: tasks.first().map_or(0, ExpertTask::expert_index),
            error,
        };
        check_format("pool", format).map_err(|error| refused(&tasks, error))?;
        let align = format.alignment as usize;
        let scratch_len = usize::try_from(format.scratch_bytes)
            .ok()
            .filter(|len| Layout::from_size_align(*len, align).is_ok())
            .ok_or_else(|| {
                refused(
                    &tasks,
                    arguments("pool", "format.scratch_bytes cannot be allocated"),
                )
            })?;
        let slots = TaskSlots(tasks.as_mut_ptr());
        let job = |index: usize, scratch: &mut Scratch| {
            // SAFETY: the pool hands out each index below `tasks.len()` once, and `tasks` is
            // not touched until `dispatch` has returned, after the batch.
            let task = unsafe { slots.get(index) };
            let expert_index = task.expert_index();
            table
                .run_task(format, task, scratch.get(scratch_len, align))
                .map_err(|error| PoolError {
                    task: index,
                    expert_index,
                    error,
                })
        };
        let count = tasks.len();
        self.dispatch(count, &job)
    }

    /// Runs `job` for every index below `count` on the workers and this thread, and returns
    /// once all have finished: the first failure in index order, or the panic of the first task
    /// that panicked, raised again here.
    fn dispatch(&self, count: usize, job: &Job<'_>) -> Result<(), PoolError> {
        if count == 0 {
            return Ok(());
        }
        let mut scratch = self.batch.lock().unwrap_or_else(PoisonError::into_inner);
        if count == 1 {
            // All overhead for the workers: the caller runs it, as a worker would (a panic is
            // raised again once the task is over, the pool untouched).
            return job(0, &mut scratch);
        }
        // SAFETY: only the lifetime changes (the same fat pointer). The workers dereference the
        // pointer only while a task is handed out and unfinished, and this function does not
        // return (nothing below unwinds: the lock ignores poisoning, the condition variable
        // calls do not panic, and the tasks this thread runs are inside `catch_unwind`) until
        // every task has finished and `job` is cleared again, so `job` and everything it
        // borrows outlive every use.
        let erased = unsafe { mem::transmute::<*const Job<'_>, *const Job<'static>>(job) };
        let mut state = self.shared.lock();
        // The previous batch left no failure or panic behind: its `dispatch` took them.
        state.job = Some(JobRef(erased));
        state.count = count;
        state.next = 0;
        state.finished = 0;
        self.shared.unfinished.store(count, Ordering::Release);
        self.shared.epoch.fetch_add(1, Ordering::Release);
        // The caller's first `take` wakes one sleeper (tasks are left after it), and each
        // worker that takes a task wakes the next while tasks are left. Watching workers see
        // the epoch move.
        while let Some((job, index)) = self.shared.take(&mut state) {
            state = self.shared.run_task(state, job, index, &mut scratch);
        }
        if state.finished < state.count {
            drop(state);
            watch(|| self.shared.unfinished.load(Ordering::Acquire) == 0);
            state = self.shared.lock();
            while state.finished < state.count {
                state.caller_sleeps = true;
                state = self
                    .shared
                    .done
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                state.caller_sleeps = false;
            }
        }
        state.job = None;
        let (failure, panicked) = (state.failure.take(), state.panic.take());
        drop(state);
        if let Some((_, payload)) = panicked {
            panic::resume_unwind(payload);
        }
        failure.map_or(Ok(()), Err)
    }
}

impl Drop for ExpertPool {
    /// Stops the workers and joins them. They catch every panic of a task, so a join fails
    /// only if the pool's own code panicked; there is nothing to report it to from a drop.
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.shutdown = true;
        self.shared.epoch.fetch_add(1, Ordering::Release);
        drop(state);
        self.shared.work.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_task_is_raised_on_the_caller_after_the_batch_and_the_pool_goes_on() {
        let pool = ExpertPool::new(3);
        let ran = AtomicUsize::new(0);
        let job = |index: usize, _: &mut Scratch| {
            ran.fetch_add(1, Ordering::Relaxed);
            if index == 2 || index == 5 {
                panic!("task {index}");
            }
            Ok(())
        };
        let caught = panic::catch_unwind(AssertUnwindSafe(|| pool.dispatch(8, &job)));
        let payload = caught.expect_err("the panic reaches the caller");
        assert_eq!(payload.downcast_ref::<String>().unwrap(), "task 2");
        assert_eq!(ran.load(Ordering::Relaxed), 8, "every task ran");
        // The same workers take the next batch.
        let job = |_: usize, _: &mut Scratch| Ok(());
        assert_eq!(pool.dispatch(16, &job), Ok(()));
        assert_eq!(pool.threads(), 3);
    }

    #[test]
    fn scratch_is_kept_across_batches_and_grows_only_when_a_batch_needs_more() {
        // Whichever side takes a task (the caller or the worker), its own buffer must come back
        // with what the previous task wrote into it, unless the task needs more than that side
        // has ever been given; then it gets a fresh, zeroed, larger buffer.
        const MARK: u8 = 0x5a;
        let pool = ExpertPool::new(1);
        // Per thread: the largest length it was given so far and the address of its buffer.
        let sides = Mutex::new(std::collections::HashMap::new());
        let grown = AtomicUsize::new(0);
        for (len, align) in [(64, 16), (32, 16), (64, 16), (256, 64), (64, 16), (32, 16)] {
            let job = |_: usize, scratch: &mut Scratch| {
                let bytes = scratch.get(len, align);
                assert_eq!(bytes.len(), len);
                assert!((bytes.as_ptr() as usize).is_multiple_of(align));
                let address = bytes.as_ptr() as usize;
                let mut sides = sides.lock().unwrap();
                match sides.get(&thread::current().id()) {
                    Some(&(most, kept)) if len <= most => {
                        assert_eq!(address, kept, "a {len}-byte task got another buffer");
                        assert_eq!(bytes[0], MARK, "a {len}-byte task lost the kept buffer");
                    }
                    _ => {
                        assert_eq!(bytes[0], 0, "a {len}-byte task reused a short buffer");
                        grown.fetch_add(1, Ordering::Relaxed);
                        sides.insert(thread::current().id(), (len, address));
                    }
                }
                bytes[0] = MARK;
                Ok(())
            };
            pool.dispatch(2, &job).unwrap();
        }
        // Each side that ran grew at most twice: once for its first task, once for 256 bytes.
        let sides = sides.into_inner().unwrap();
        assert!(!sides.is_empty() && sides.len() <= 2, "{}", sides.len());
        assert!(grown.load(Ordering::Relaxed) <= 2 * sides.len());
    }

    #[test]
    fn a_batch_of_one_task_runs_on_the_caller_alone() {
        let pool = ExpertPool::new(2);
        let caller = thread::current().id();
        for _ in 0..100 {
            let job = |_: usize, _: &mut Scratch| {
                assert_eq!(thread::current().id(), caller);
                Ok(())
            };
            pool.dispatch(1, &job).unwrap();
        }
        assert_eq!(
            pool.shared.epoch.load(Ordering::Relaxed),
            0,
            "no batch was published"
        );
    }

    #[test]
    fn every_task_runs_once_whoever_takes_it_asleep_or_awake() {
        let pool = ExpertPool::new(3);
        for round in 0..300usize {
            let count = 2 + round % 13;
            let runs: Vec<AtomicUsize> = (0..count).map(|_| AtomicUsize::new(0)).collect();
            let job = |index: usize, scratch: &mut Scratch| {
                scratch.get(32, 16)[0] = index as u8;
                runs[index].fetch_add(1, Ordering::Relaxed);
                Ok(())
            };
            pool.dispatch(count, &job).unwrap();
            assert!(
                runs.iter().all(|r| r.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
            if round % 100 == 99 {
                // Let every worker fall asleep, so that the next batch takes the wake-up path.
                let deadline = Instant::now() + Duration::from_secs(10);
                while pool.shared.lock().sleeping < pool.threads() && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(
                    pool.shared.lock().sleeping,
                    pool.threads(),
                    "idle workers sleep"
                );
            }
        }
    }

    #[test]
    fn the_first_failure_in_batch_order_is_reported_whatever_the_timing() {
        let pool = ExpertPool::new(4);
        let job = |index: usize, _: &mut Scratch| {
            if index % 3 == 2 {
                Err(PoolError {
                    task: index,
                    expert_index: 0,
                    error: arguments("test", "refused"),
                })
            } else {
                Ok(())
            }
        };
        for _ in 0..50 {
            assert_eq!(pool.dispatch(12, &job).map_err(|e| e.task), Err(2));
        }
    }
}
