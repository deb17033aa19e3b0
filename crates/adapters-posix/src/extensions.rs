//! The extensions this host consumes, described in one table ([`CONSUMED_EXTENSIONS`]), and the
//! one mechanism that checks and copies every one of them.
//!
//! Each [`ExtensionContract`] names a tag, the layout versions this host reads (for each, the
//! smallest `struct_size` of that version and the size this host knows), the callbacks by offset
//! (required, or optional and reported absent), and where the extension may appear. The copy
//! follows the growth rules of abi-headers/README.md the same way for every tag:
//!
//! - The version must be one the contract lists; a consumed tag with another version is refused.
//! - `struct_size` must be at least the version's minimum, the size of its first published
//!   layout; a smaller one is refused.
//! - The host copies `min(struct_size, known size of that version)` bytes (stopping short of a
//!   callback pointer the size covers only in part) into a zeroed struct of its own. An older
//!   plugin's smaller table is read up to its size and the fields it does not carry stay zero;
//!   a newer plugin's larger table of the same version is read up to the fields this host
//!   knows. Nothing past the declared size is ever read.
//! - A callback counts as present only when the copied bytes cover the whole pointer and it is
//!   non-NULL. An absent required callback is refused; an absent optional one is reported by
//!   [`ExtensionCopy::absent_callbacks`]. An extension whose callbacks are all optional but which
//!   must offer one (CDD1) is refused when it offers none.
//! - The copy's `struct_size` is the number of bytes copied, so C code handed the copy sees what
//!   the plugin provided, and its `next` is NULL until the owner links its copies together.
//!
//! Placement (which descriptor may carry which tag) and the site-specific checks (the chain walk,
//! PFKE's own 12-byte header, CDM1's Qwen group) are the owner's: see `owned.rs`.

use std::ffi::c_void;
use std::fmt;
use std::mem::{offset_of, size_of};
use std::ptr;

use guild_abi::{
    guild_cpu_backend_ext_v2_t, guild_cpu_expert_ext_v1_t, guild_cuda_attn_ext_v1_t,
    guild_cuda_dense_ext_v1_t, guild_cuda_moe_ext_v1_t, guild_cuda_qwen_group_v1_t,
    guild_ext_header_t, guild_operation_ext_v1_t, guild_prefill_kernel_ext_v1_t,
    guild_runner_model_ext_v1_t, GUILD_BACKEND_CPU, GUILD_BACKEND_CUDA,
    GUILD_CPU_BACKEND_EXT_VERSION, GUILD_CPU_EXPERT_EXT_VERSION, GUILD_CPU_EXPERT_TAG,
    GUILD_CUDA_ATTN_EXT_VERSION, GUILD_CUDA_ATTN_TAG, GUILD_CUDA_DENSE_EXT_VERSION,
    GUILD_CUDA_DENSE_TAG, GUILD_CUDA_MOE_EXT_VERSION, GUILD_CUDA_MOE_TAG,
    GUILD_CUDA_QWEN_EXT_VERSION, GUILD_CUDA_QWEN_TAG, GUILD_GOP1_TAG, GUILD_GOP1_VERSION,
    GUILD_OP_BATCHED_EXPERT_EXEC, GUILD_OP_CUSTOM, GUILD_PFKE_TAG, GUILD_PFKE_VERSION,
    GUILD_RMD1_TAG, GUILD_RMD1_VERSION,
};
use guild_ports::loader::ExtensionProblem;

use crate::heap::Heap;

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

/// What this host reads of one extension.
#[derive(Debug)]
pub struct ExtensionContract {
    /// The tag (`GUILD_MAKE_TAG`).
    pub tag: u32,
    /// The tag's four characters.
    pub name: &'static str,
    /// The layout versions this host reads, ascending.
    pub layouts: &'static [LayoutContract],
    /// `size_of` the struct the host copies into: the largest layout it knows.
    pub host_size: usize,
    /// Every callback, in field order.
    pub callbacks: &'static [CallbackContract],
    /// Whether an extension whose callbacks are all optional must still offer one of them.
    pub needs_a_callback: bool,
    /// Where the extension may appear.
    pub placement: Placement,
}

/// One layout version of an extension.
#[derive(Debug)]
pub struct LayoutContract {
    /// The `header.version` value.
    pub version: u32,
    /// The smallest `struct_size` of this version: the size of its first published layout.
    pub minimum_size: usize,
    /// The C type whose size `minimum_size` is, for messages.
    pub minimum_layout: &'static str,
    /// How many bytes of this version this host knows and copies at most.
    pub known_size: usize,
}

/// One callback (function-pointer field) of an extension.
#[derive(Debug)]
pub struct CallbackContract {
    /// The field's name in the header.
    pub name: &'static str,
    /// Its byte offset in the host's struct.
    pub offset: usize,
    /// Whether a NULL (or uncovered) pointer refuses the extension.
    pub required: bool,
}

/// Where an extension may appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The `next_ext` chain of a `GUILD_OP_CUSTOM` kernel (GOP1).
    CustomKernel,
    /// The `next_ext` chain of a CPU kernel whose op kind is `GUILD_OP_BATCHED_EXPERT_EXEC`
    /// (CPE1 and the CPU backend v2 table).
    CpuExpertKernel,
    /// The `next_ext` chain of a CUDA kernel of any op kind (CDD1, CDA1, CDM1).
    CudaKernel,
    /// The `next_ext` chain of a runner (RMD1).
    Runner,
    /// `kernel_fns` of a `GUILD_OP_PREFILL_KERNELS` kernel, never a chain (PFKE).
    PrefillKernelFns,
    /// The `qwen` pointer of a CDM1 table, never a chain (CDMQ).
    CudaMoeQwen,
}

const PTR: usize = size_of::<*const c_void>();

const fn required(name: &'static str, offset: usize) -> CallbackContract {
    CallbackContract {
        name,
        offset,
        required: true,
    }
}

const fn optional(name: &'static str, offset: usize) -> CallbackContract {
    CallbackContract {
        name,
        offset,
        required: false,
    }
}

const fn only_layout(version: u32, size: usize, layout: &'static str) -> [LayoutContract; 1] {
    [LayoutContract {
        version,
        minimum_size: size,
        minimum_layout: layout,
        known_size: size,
    }]
}

/// GOP1, the operation contract of a `GUILD_OP_CUSTOM` kernel (module_abi.h).
pub static GOP1_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_GOP1_TAG,
    name: "GOP1",
    layouts: &only_layout(
        GUILD_GOP1_VERSION,
        size_of::<guild_operation_ext_v1_t>(),
        "guild_operation_ext_v1_t",
    ),
    host_size: size_of::<guild_operation_ext_v1_t>(),
    callbacks: &[
        required("validate", offset_of!(guild_operation_ext_v1_t, validate)),
        required(
            "query_scratch",
            offset_of!(guild_operation_ext_v1_t, query_scratch),
        ),
        required("execute", offset_of!(guild_operation_ext_v1_t, execute)),
    ],
    needs_a_callback: false,
    placement: Placement::CustomKernel,
};

/// RMD1, a runner's model description (runner_abi.h).
pub static RMD1_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_RMD1_TAG,
    name: "RMD1",
    layouts: &only_layout(
        GUILD_RMD1_VERSION,
        size_of::<guild_runner_model_ext_v1_t>(),
        "guild_runner_model_ext_v1_t",
    ),
    host_size: size_of::<guild_runner_model_ext_v1_t>(),
    callbacks: &[
        required(
            "recognize",
            offset_of!(guild_runner_model_ext_v1_t, recognize),
        ),
        required(
            "describe",
            offset_of!(guild_runner_model_ext_v1_t, describe),
        ),
        required(
            "validate_numerics",
            offset_of!(guild_runner_model_ext_v1_t, validate_numerics),
        ),
    ],
    needs_a_callback: false,
    placement: Placement::Runner,
};

/// CPE1 and the CPU backend v2 table, one tag with two layouts (cpu_expert_abi.h,
/// cpu_backend_abi.h). Version 1 is the CPE1 table. Version 2 appends six optional callbacks;
/// its header accepts any `struct_size` from the CPE1 prefix up, each appended callback counting
/// only where the size covers it, so its minimum is the CPE1 size too.
pub static CPE1_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_CPU_EXPERT_TAG,
    name: "CPE1",
    layouts: &[
        LayoutContract {
            version: GUILD_CPU_EXPERT_EXT_VERSION,
            minimum_size: size_of::<guild_cpu_expert_ext_v1_t>(),
            minimum_layout: "guild_cpu_expert_ext_v1_t",
            known_size: size_of::<guild_cpu_expert_ext_v1_t>(),
        },
        LayoutContract {
            version: GUILD_CPU_BACKEND_EXT_VERSION,
            minimum_size: size_of::<guild_cpu_expert_ext_v1_t>(),
            minimum_layout: "guild_cpu_expert_ext_v1_t",
            known_size: size_of::<guild_cpu_backend_ext_v2_t>(),
        },
    ],
    host_size: size_of::<guild_cpu_backend_ext_v2_t>(),
    callbacks: &[
        required(
            "quantize_activation",
            offset_of!(guild_cpu_backend_ext_v2_t, quantize_activation),
        ),
        required(
            "quantize_hidden",
            offset_of!(guild_cpu_backend_ext_v2_t, quantize_hidden),
        ),
        required(
            "gate_up_rows",
            offset_of!(guild_cpu_backend_ext_v2_t, gate_up_rows),
        ),
        required(
            "down_rows",
            offset_of!(guild_cpu_backend_ext_v2_t, down_rows),
        ),
        optional(
            "describe_format",
            offset_of!(guild_cpu_backend_ext_v2_t, describe_format),
        ),
        optional(
            "quantize_planar_q2",
            offset_of!(guild_cpu_backend_ext_v2_t, quantize_planar_q2),
        ),
        optional(
            "dequantize_planar_q2",
            offset_of!(guild_cpu_backend_ext_v2_t, dequantize_planar_q2),
        ),
        optional("q2_rows", offset_of!(guild_cpu_backend_ext_v2_t, q2_rows)),
        optional(
            "router_bf16",
            offset_of!(guild_cpu_backend_ext_v2_t, router_bf16),
        ),
        optional(
            "combine_ordered",
            offset_of!(guild_cpu_backend_ext_v2_t, combine_ordered),
        ),
    ],
    needs_a_callback: false,
    placement: Placement::CpuExpertKernel,
};

/// The callbacks version 2 of the CPU backend table appends to CPE1.
pub const CPU_BACKEND_V2_OPS: [&str; 6] = [
    "describe_format",
    "quantize_planar_q2",
    "dequantize_planar_q2",
    "q2_rows",
    "router_bf16",
    "combine_ordered",
];

/// CDD1, CUDA dense projections (cuda_dense_abi.h): every callback optional, at least one.
pub static CDD1_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_CUDA_DENSE_TAG,
    name: "CDD1",
    layouts: &only_layout(
        GUILD_CUDA_DENSE_EXT_VERSION,
        size_of::<guild_cuda_dense_ext_v1_t>(),
        "guild_cuda_dense_ext_v1_t",
    ),
    host_size: size_of::<guild_cuda_dense_ext_v1_t>(),
    callbacks: &[
        optional("project", offset_of!(guild_cuda_dense_ext_v1_t, project)),
        optional(
            "quantize_q8_1",
            offset_of!(guild_cuda_dense_ext_v1_t, quantize_q8_1),
        ),
        optional("mmvq", offset_of!(guild_cuda_dense_ext_v1_t, mmvq)),
    ],
    needs_a_callback: true,
    placement: Placement::CudaKernel,
};

/// CDA1, CUDA attention, GDN, RoPE, KV cache and QSA (cuda_attn_abi.h): `configure` and
/// `query_pools` required, the execution callbacks optional.
pub static CDA1_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_CUDA_ATTN_TAG,
    name: "CDA1",
    layouts: &only_layout(
        GUILD_CUDA_ATTN_EXT_VERSION,
        size_of::<guild_cuda_attn_ext_v1_t>(),
        "guild_cuda_attn_ext_v1_t",
    ),
    host_size: size_of::<guild_cuda_attn_ext_v1_t>(),
    callbacks: &[
        required("configure", offset_of!(guild_cuda_attn_ext_v1_t, configure)),
        required(
            "query_pools",
            offset_of!(guild_cuda_attn_ext_v1_t, query_pools),
        ),
        optional("attention", offset_of!(guild_cuda_attn_ext_v1_t, attention)),
        optional(
            "gdn_update",
            offset_of!(guild_cuda_attn_ext_v1_t, gdn_update),
        ),
        optional("rope", offset_of!(guild_cuda_attn_ext_v1_t, rope)),
        optional("kv_append", offset_of!(guild_cuda_attn_ext_v1_t, kv_append)),
        optional("kv_stream", offset_of!(guild_cuda_attn_ext_v1_t, kv_stream)),
        optional(
            "qsa_select",
            offset_of!(guild_cuda_attn_ext_v1_t, qsa_select),
        ),
    ],
    needs_a_callback: false,
    placement: Placement::CudaKernel,
};

/// CDM1, CUDA mixture-of-experts and decode-loop blocks (cuda_moe_abi.h): `query_workspace`
/// required, the execution callbacks optional.
pub static CDM1_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_CUDA_MOE_TAG,
    name: "CDM1",
    layouts: &only_layout(
        GUILD_CUDA_MOE_EXT_VERSION,
        size_of::<guild_cuda_moe_ext_v1_t>(),
        "guild_cuda_moe_ext_v1_t",
    ),
    host_size: size_of::<guild_cuda_moe_ext_v1_t>(),
    callbacks: &[
        required(
            "query_workspace",
            offset_of!(guild_cuda_moe_ext_v1_t, query_workspace),
        ),
        optional("route", offset_of!(guild_cuda_moe_ext_v1_t, route)),
        optional("combine", offset_of!(guild_cuda_moe_ext_v1_t, combine)),
        optional(
            "shared_expert",
            offset_of!(guild_cuda_moe_ext_v1_t, shared_expert),
        ),
        optional(
            "grouped_experts",
            offset_of!(guild_cuda_moe_ext_v1_t, grouped_experts),
        ),
        optional("s_gemv", offset_of!(guild_cuda_moe_ext_v1_t, s_gemv)),
        optional("s_dequant", offset_of!(guild_cuda_moe_ext_v1_t, s_dequant)),
        optional("quantize", offset_of!(guild_cuda_moe_ext_v1_t, quantize)),
        optional(
            "elementwise",
            offset_of!(guild_cuda_moe_ext_v1_t, elementwise),
        ),
        optional("doorbell", offset_of!(guild_cuda_moe_ext_v1_t, doorbell)),
        optional("sample", offset_of!(guild_cuda_moe_ext_v1_t, sample)),
        optional(
            "spec_verify",
            offset_of!(guild_cuda_moe_ext_v1_t, spec_verify),
        ),
    ],
    needs_a_callback: false,
    placement: Placement::CudaKernel,
};

/// CDMQ, the Qwen specialization group a CDM1 table may point at (cuda_moe_abi.h): every
/// callback optional.
pub static CDMQ_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_CUDA_QWEN_TAG,
    name: "CDMQ",
    layouts: &only_layout(
        GUILD_CUDA_QWEN_EXT_VERSION,
        size_of::<guild_cuda_qwen_group_v1_t>(),
        "guild_cuda_qwen_group_v1_t",
    ),
    host_size: size_of::<guild_cuda_qwen_group_v1_t>(),
    callbacks: &[
        optional("gr", offset_of!(guild_cuda_qwen_group_v1_t, gr)),
        optional("fused_gr", offset_of!(guild_cuda_qwen_group_v1_t, fused_gr)),
        optional("ple", offset_of!(guild_cuda_qwen_group_v1_t, ple)),
        optional("cvec", offset_of!(guild_cuda_qwen_group_v1_t, cvec)),
    ],
    needs_a_callback: false,
    placement: Placement::CudaMoeQwen,
};

/// PFKE, the public prefill kernels (kernel_abi.h), with its own 12-byte header. The header does
/// not say that both callbacks are required; a table must offer at least one of them.
pub static PFKE_CONTRACT: ExtensionContract = ExtensionContract {
    tag: GUILD_PFKE_TAG,
    name: "PFKE",
    layouts: &only_layout(
        GUILD_PFKE_VERSION,
        size_of::<guild_prefill_kernel_ext_v1_t>(),
        "guild_prefill_kernel_ext_v1_t",
    ),
    host_size: size_of::<guild_prefill_kernel_ext_v1_t>(),
    callbacks: &[
        optional("gdn_ab", offset_of!(guild_prefill_kernel_ext_v1_t, gdn_ab)),
        optional(
            "router_projection",
            offset_of!(guild_prefill_kernel_ext_v1_t, router_projection),
        ),
    ],
    needs_a_callback: true,
    placement: Placement::PrefillKernelFns,
};

/// Every extension this host consumes. Any other tag in a `next_ext` chain is skipped.
pub static CONSUMED_EXTENSIONS: [&ExtensionContract; 8] = [
    &GOP1_CONTRACT,
    &RMD1_CONTRACT,
    &CPE1_CONTRACT,
    &CDD1_CONTRACT,
    &CDA1_CONTRACT,
    &CDM1_CONTRACT,
    &CDMQ_CONTRACT,
    &PFKE_CONTRACT,
];

/// The contract of a consumed tag.
pub fn contract_for(tag: u32) -> Option<&'static ExtensionContract> {
    CONSUMED_EXTENSIONS.iter().copied().find(|c| c.tag == tag)
}

// ---------------------------------------------------------------------------------------------
// Placement
// ---------------------------------------------------------------------------------------------

/// The descriptor whose chain is being read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Holder {
    Kernel { op_kind: u32, backend: u32 },
    Runner,
}

impl Placement {
    /// Where an extension of this placement is reached when it is not a chain extension.
    pub(crate) fn outside_chains(self) -> Option<&'static str> {
        match self {
            Placement::PrefillKernelFns => Some("kernel_fns"),
            Placement::CudaMoeQwen => Some("the qwen pointer of a CDM1 table"),
            _ => None,
        }
    }

    /// Why `holder` may not carry a chain extension of this placement, if it may not.
    pub(crate) fn misplaced_on(self, holder: Holder) -> Option<ExtensionProblem> {
        let (belongs_on, conflict) = match (self, holder) {
            (Placement::CustomKernel, Holder::Kernel { op_kind, .. }) => (
                "a GUILD_OP_CUSTOM kernel",
                (op_kind != GUILD_OP_CUSTOM)
                    .then(|| format!("op_kind {op_kind:#x} is not GUILD_OP_CUSTOM")),
            ),
            (Placement::CustomKernel, Holder::Runner) => ("a GUILD_OP_CUSTOM kernel", None),
            (Placement::CpuExpertKernel, Holder::Kernel { op_kind, backend }) => (
                "a GUILD_OP_BATCHED_EXPERT_EXEC CPU kernel",
                if op_kind != GUILD_OP_BATCHED_EXPERT_EXEC {
                    Some(format!(
                        "op_kind {op_kind:#x} is not GUILD_OP_BATCHED_EXPERT_EXEC"
                    ))
                } else {
                    (backend != GUILD_BACKEND_CPU)
                        .then(|| format!("backend {backend:#x} is not GUILD_BACKEND_CPU"))
                },
            ),
            (Placement::CpuExpertKernel, Holder::Runner) => {
                ("a GUILD_OP_BATCHED_EXPERT_EXEC CPU kernel", None)
            }
            (Placement::CudaKernel, Holder::Kernel { backend, .. }) => (
                "a CUDA kernel",
                (backend != GUILD_BACKEND_CUDA)
                    .then(|| format!("backend {backend:#x} is not GUILD_BACKEND_CUDA")),
            ),
            (Placement::CudaKernel, Holder::Runner) => ("a CUDA kernel", None),
            (Placement::Runner, Holder::Kernel { .. }) => ("a runner descriptor", None),
            (Placement::Runner, Holder::Runner) => return None,
            // Never chain extensions; the chain walk refuses them before placement is asked.
            (Placement::PrefillKernelFns | Placement::CudaMoeQwen, _) => return None,
        };
        let fits = match holder {
            Holder::Kernel { .. } => self != Placement::Runner && conflict.is_none(),
            Holder::Runner => self == Placement::Runner,
        };
        (!fits).then(|| ExtensionProblem::Misplaced {
            belongs_on: belongs_on.into(),
            conflict,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The copy
// ---------------------------------------------------------------------------------------------

/// An ABI struct the negotiation copies.
///
/// # Safety
/// Implementors are `#[repr(C)]` ABI structs whose fields are all integers, raw pointers or
/// `Option`s of function pointers (so all-zero bytes are a valid value), whose size is their
/// contract's `host_size`, and whose callbacks lie at the offsets the contract names.
pub unsafe trait AbiTable: Copy + 'static {
    /// The contract this struct is the host's layout of.
    const CONTRACT: &'static ExtensionContract;

    /// Writes the copy's own header: `struct_size` as copied and, for chain extensions, a NULL
    /// `next`.
    fn seal(&mut self, copied_size: u32);
}

fn seal_ext_header(header: &mut guild_ext_header_t, copied_size: u32) {
    header.struct_size = copied_size;
    header.next = ptr::null();
}

// SAFETY: for each type below: a #[repr(C)] mirror (crates/abi, layout-tested against the C
// headers) of integers, raw pointers and Option<fn> only; its contract's host_size is its
// size_of and its callback offsets are offset_of! of its own fields.
unsafe impl AbiTable for guild_operation_ext_v1_t {
    const CONTRACT: &'static ExtensionContract = &GOP1_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        seal_ext_header(&mut self.header, copied_size);
    }
}
// SAFETY: as above.
unsafe impl AbiTable for guild_runner_model_ext_v1_t {
    const CONTRACT: &'static ExtensionContract = &RMD1_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        seal_ext_header(&mut self.header, copied_size);
    }
}
// SAFETY: as above.
unsafe impl AbiTable for guild_cpu_backend_ext_v2_t {
    const CONTRACT: &'static ExtensionContract = &CPE1_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        seal_ext_header(&mut self.header, copied_size);
    }
}
// SAFETY: as above.
unsafe impl AbiTable for guild_cuda_dense_ext_v1_t {
    const CONTRACT: &'static ExtensionContract = &CDD1_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        seal_ext_header(&mut self.header, copied_size);
    }
}
// SAFETY: as above.
unsafe impl AbiTable for guild_cuda_attn_ext_v1_t {
    const CONTRACT: &'static ExtensionContract = &CDA1_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        seal_ext_header(&mut self.header, copied_size);
    }
}
// SAFETY: as above.
unsafe impl AbiTable for guild_cuda_moe_ext_v1_t {
    const CONTRACT: &'static ExtensionContract = &CDM1_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        seal_ext_header(&mut self.header, copied_size);
    }
}
// SAFETY: as above.
unsafe impl AbiTable for guild_cuda_qwen_group_v1_t {
    const CONTRACT: &'static ExtensionContract = &CDMQ_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        seal_ext_header(&mut self.header, copied_size);
    }
}
// SAFETY: as above; PFKE's header has no next pointer.
unsafe impl AbiTable for guild_prefill_kernel_ext_v1_t {
    const CONTRACT: &'static ExtensionContract = &PFKE_CONTRACT;
    fn seal(&mut self, copied_size: u32) {
        self.header.struct_size = copied_size;
    }
}

/// The host's checked copy of one extension: a struct of this host's layout holding what the
/// plugin provided, zero past the plugin's size, and the facts of the negotiation.
///
/// The copy's function pointers and `user_data` still point into the plugin; like those of the
/// descriptor that carried it, they are valid only while the plugin's library is loaded.
pub struct ExtensionCopy<T> {
    table: Heap<T>,
    version: u32,
    declared_size: u32,
    copied_size: usize,
}

// SAFETY: an ExtensionCopy is immutable once its owner is built; the pointers into the plugin
// are carried, never dereferenced, by this type (see OwnedKernel's Send/Sync).
unsafe impl<T> Send for ExtensionCopy<T> {}
// SAFETY: as for Send: shared access only reads.
unsafe impl<T> Sync for ExtensionCopy<T> {}

impl<T: AbiTable> ExtensionCopy<T> {
    /// The copied table, in this host's layout.
    pub fn table(&self) -> &T {
        self.table.get()
    }

    /// The copy's address, for C code; valid as long as `self`.
    pub fn as_ptr(&self) -> *const T {
        self.table.as_ptr()
    }

    /// The contract the table was negotiated under.
    pub fn contract(&self) -> &'static ExtensionContract {
        T::CONTRACT
    }

    /// The layout version the plugin declared.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The `struct_size` the plugin declared.
    pub fn declared_size(&self) -> u32 {
        self.declared_size
    }

    /// How many bytes were copied: the declared size, capped at what this host knows of the
    /// declared version and cut before a callback it covers only in part. The copy's own
    /// `struct_size` holds the same number.
    pub fn copied_size(&self) -> usize {
        self.copied_size
    }

    /// Whether the plugin offers `callback` (a field name of the contract): its pointer lies
    /// within the copied bytes and is non-NULL. Unknown names are not offered.
    pub fn offers(&self, callback: &str) -> bool {
        T::CONTRACT
            .callbacks
            .iter()
            .any(|c| c.name == callback && self.present(c))
    }

    /// The callbacks the plugin offers, in field order.
    pub fn offered_callbacks(&self) -> Vec<&'static str> {
        self.callbacks_where(true)
    }

    /// The callbacks the plugin does not offer (optional ones only: a missing required one is
    /// refused), in field order.
    pub fn absent_callbacks(&self) -> Vec<&'static str> {
        self.callbacks_where(false)
    }

    fn callbacks_where(&self, present: bool) -> Vec<&'static str> {
        T::CONTRACT
            .callbacks
            .iter()
            .filter(|c| self.present(c) == present)
            .map(|c| c.name)
            .collect()
    }

    fn present(&self, callback: &CallbackContract) -> bool {
        // SAFETY: the table is a live T; callback_present checks the offset against its size.
        unsafe { callback_present(self.table.as_ptr().cast(), self.copied_size, callback) }
    }

    /// A pointer for writing while the owner is being built (linking, rewriting a nested
    /// pointer); see [`Heap::as_mut_ptr`].
    pub(crate) fn as_mut_ptr(&mut self) -> *mut T {
        self.table.as_mut_ptr()
    }
}

impl ExtensionCopy<guild_cpu_backend_ext_v2_t> {
    /// Whether the plugin offers any of the operations CPU backend v2 appends to CPE1. Always
    /// false for a version 1 (CPE1) table, whatever its size; for a version 2 table, true when
    /// its `struct_size` covers at least one appended callback and that callback is non-NULL.
    pub fn has_v2_ops(&self) -> bool {
        CPU_BACKEND_V2_OPS.iter().any(|op| self.offers(op))
    }

    /// The CPE1 prefix of the table, the part every version has.
    pub fn cpe1(&self) -> &guild_cpu_expert_ext_v1_t {
        // SAFETY: guild_cpu_backend_ext_v2_t begins with exactly the fields of
        // guild_cpu_expert_ext_v1_t at the same offsets (asserted in crates/abi and in the C
        // header), its alignment is at least the prefix's, and the borrow is tied to `self`.
        unsafe { &*self.table.as_ptr().cast::<guild_cpu_expert_ext_v1_t>() }
    }
}

impl<T: AbiTable> fmt::Debug for ExtensionCopy<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionCopy")
            .field("tag", &T::CONTRACT.name)
            .field("version", &self.version)
            .field("declared_size", &self.declared_size)
            .field("copied_size", &self.copied_size)
            .field("absent_callbacks", &self.absent_callbacks())
            .finish_non_exhaustive()
    }
}

/// Whether the callback's pointer lies within the first `copied` bytes at `table` and is
/// non-NULL.
///
/// # Safety
/// `table` must point at a live value of the contract's host struct.
unsafe fn callback_present(table: *const u8, copied: usize, callback: &CallbackContract) -> bool {
    if callback.offset + PTR > copied {
        return false;
    }
    // SAFETY: offset + PTR <= copied <= the struct's size (capped in check_and_copy), so the
    // read stays inside the live value; a function pointer has a data pointer's size on every
    // supported platform, and only its nullness is looked at.
    let word = unsafe {
        table
            .add(callback.offset)
            .cast::<*const ()>()
            .read_unaligned()
    };
    !word.is_null()
}

/// Checks an extension of `T`'s contract whose header declared `declared_size` and `version`,
/// and copies it.
///
/// # Safety
/// `at` must be readable for `declared_size` bytes during this call.
pub(crate) unsafe fn check_and_copy<T: AbiTable>(
    at: *const u8,
    declared_size: u32,
    version: u32,
) -> Result<ExtensionCopy<T>, ExtensionProblem> {
    let contract = T::CONTRACT;
    let Some(layout) = contract.layouts.iter().find(|l| l.version == version) else {
        return Err(ExtensionProblem::UnknownVersion {
            version,
            known: contract.layouts.iter().map(|l| l.version).collect(),
        });
    };
    let declared = usize::try_from(declared_size).unwrap_or(usize::MAX);
    if declared < layout.minimum_size {
        return Err(ExtensionProblem::TooSmall {
            version,
            struct_size: declared_size,
            minimum: u32::try_from(layout.minimum_size).unwrap_or(u32::MAX),
            layout: layout.minimum_layout.into(),
        });
    }
    let mut copied = declared.min(layout.known_size).min(size_of::<T>());
    // A size that ends inside a callback's pointer does not carry that callback: the copy stops
    // before it rather than keep half a pointer.
    if let Some(cut) = contract
        .callbacks
        .iter()
        .find(|c| c.offset < copied && copied < c.offset + PTR)
    {
        copied = cut.offset;
    }
    // SAFETY: AbiTable guarantees that all-zero bytes are a valid T.
    let mut value: T = unsafe { std::mem::zeroed() };
    // SAFETY: `at` is readable for declared >= copied bytes; `value` is a local T of
    // size_of::<T>() >= copied bytes; the two cannot overlap (one is this frame's local).
    unsafe { ptr::copy_nonoverlapping(at, (&raw mut value).cast::<u8>(), copied) };
    let base = (&raw const value).cast::<u8>();
    let mut offered = 0;
    for callback in contract.callbacks {
        // SAFETY: `base` points at the live local T.
        let present = unsafe { callback_present(base, copied, callback) };
        if present {
            offered += 1;
        } else if callback.required {
            return Err(ExtensionProblem::NullCallback {
                callback: callback.name.into(),
            });
        }
    }
    if contract.needs_a_callback && offered == 0 {
        return Err(ExtensionProblem::NoCallbacks {
            callbacks: contract.callbacks.iter().map(|c| c.name.into()).collect(),
        });
    }
    let copied_u32 = u32::try_from(copied).unwrap_or(u32::MAX);
    value.seal(copied_u32);
    Ok(ExtensionCopy {
        table: Heap::new(value),
        version,
        declared_size,
        copied_size: copied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use guild_abi::text::tag_text;

    /// Every contract is internally consistent: known sizes within the host struct, minimums
    /// within the known sizes, every required callback inside every version's minimum (so an
    /// accepted size always carries them), callbacks inside the struct, distinct tags.
    #[test]
    fn the_table_is_consistent() {
        let mut tags = Vec::new();
        for c in CONSUMED_EXTENSIONS {
            assert_eq!(tag_text(c.tag), c.name);
            assert!(!tags.contains(&c.tag), "{} twice", c.name);
            tags.push(c.tag);
            assert!(!c.layouts.is_empty());
            for l in c.layouts {
                assert!(l.minimum_size <= l.known_size, "{} v{}", c.name, l.version);
                assert!(l.known_size <= c.host_size, "{} v{}", c.name, l.version);
                for cb in c.callbacks.iter().filter(|cb| cb.required) {
                    assert!(cb.offset + PTR <= l.minimum_size, "{}.{}", c.name, cb.name);
                }
            }
            assert_eq!(
                c.layouts.last().map(|l| l.known_size),
                Some(c.host_size),
                "{}: the newest layout is the host's struct",
                c.name
            );
            for cb in c.callbacks {
                assert!(cb.offset + PTR <= c.host_size, "{}.{}", c.name, cb.name);
            }
        }
        assert_eq!(size_of::<guild_cpu_expert_ext_v1_t>(), 64);
        assert_eq!(size_of::<guild_cpu_backend_ext_v2_t>(), 112);
    }

    /// A layout with two published sizes of one version, to prove the older/newer rules
    /// independently of today's headers (where every version but CPE1's has one size).
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Grown {
        header: guild_ext_header_t,
        first: Option<unsafe extern "C" fn()>,
        second: Option<unsafe extern "C" fn()>,
        value: u64,
    }

    static GROWN_CONTRACT: ExtensionContract = ExtensionContract {
        tag: u32::from_be_bytes(*b"TST1"),
        name: "TST1",
        layouts: &[LayoutContract {
            version: 1,
            minimum_size: offset_of!(Grown, second),
            minimum_layout: "the first Grown layout",
            known_size: size_of::<Grown>(),
        }],
        host_size: size_of::<Grown>(),
        callbacks: &[
            required("first", offset_of!(Grown, first)),
            optional("second", offset_of!(Grown, second)),
        ],
        needs_a_callback: false,
        placement: Placement::Runner,
    };

    // SAFETY: integers, a raw pointer (in the header) and Option<fn> only; offsets from offset_of!.
    unsafe impl AbiTable for Grown {
        const CONTRACT: &'static ExtensionContract = &GROWN_CONTRACT;
        fn seal(&mut self, copied_size: u32) {
            seal_ext_header(&mut self.header, copied_size);
        }
    }

    unsafe extern "C" fn callback() {}

    /// The plugin's bytes: a full Grown followed by 16 bytes a newer layout would append.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Newer {
        grown: Grown,
        appended: [u64; 2],
    }

    fn plugin_bytes() -> Newer {
        Newer {
            grown: Grown {
                header: guild_ext_header_t {
                    struct_size: 0,
                    tag: GROWN_CONTRACT.tag,
                    version: 1,
                    reserved: 0,
                    next: ptr::NonNull::<guild_ext_header_t>::dangling().as_ptr(),
                },
                first: Some(callback),
                second: Some(callback),
                value: 7,
            },
            appended: [u64::MAX; 2],
        }
    }

    fn copy(size: usize) -> Result<ExtensionCopy<Grown>, ExtensionProblem> {
        let bytes = plugin_bytes();
        let size = u32::try_from(size).expect("small");
        // SAFETY: `bytes` is a live local of size_of::<Newer>() >= `size` bytes in every call.
        unsafe { check_and_copy::<Grown>((&raw const bytes).cast(), size, 1) }
    }

    #[test]
    fn an_older_table_is_copied_up_to_its_size_and_the_rest_is_absent() {
        let older = offset_of!(Grown, second);
        let copy = copy(older).expect("accepted");
        assert_eq!(copy.copied_size(), older);
        assert_eq!(copy.table().header.struct_size as usize, older);
        assert!(copy.table().header.next.is_null());
        assert!(copy.table().first.is_some());
        // The plugin's memory past its size holds a callback and a value; neither is read.
        assert!(copy.table().second.is_none());
        assert_eq!(copy.table().value, 0);
        assert_eq!(copy.absent_callbacks(), ["second"]);
        assert!(!copy.offers("second"));
    }

    #[test]
    fn a_newer_table_is_copied_up_to_the_known_size() {
        let copy = copy(size_of::<Newer>()).expect("accepted");
        assert_eq!(copy.declared_size() as usize, size_of::<Newer>());
        assert_eq!(copy.copied_size(), size_of::<Grown>());
        assert_eq!(copy.table().value, 7);
        assert_eq!(copy.offered_callbacks(), ["first", "second"]);
    }

    #[test]
    fn a_partial_pointer_is_not_a_callback() {
        let copy = copy(offset_of!(Grown, second) + 4).expect("accepted");
        assert!(
            copy.table().second.is_none(),
            "half a pointer is not copied"
        );
        assert_eq!(copy.copied_size(), offset_of!(Grown, second));
        assert_eq!(copy.absent_callbacks(), ["second"]);
    }

    #[test]
    fn too_small_and_unknown_versions_are_refused() {
        let minimum = offset_of!(Grown, second);
        assert_eq!(
            copy(minimum - 1).map(|c| c.copied_size()),
            Err(ExtensionProblem::TooSmall {
                version: 1,
                struct_size: u32::try_from(minimum - 1).expect("small"),
                minimum: u32::try_from(minimum).expect("small"),
                layout: "the first Grown layout".into(),
            })
        );
        let bytes = plugin_bytes();
        // SAFETY: `bytes` is a live local of at least the declared size.
        let other = unsafe {
            check_and_copy::<Grown>((&raw const bytes).cast(), size_of::<Grown>() as u32, 3)
        };
        assert_eq!(
            other.map(|c| c.version()),
            Err(ExtensionProblem::UnknownVersion {
                version: 3,
                known: vec![1],
            })
        );
    }
}
