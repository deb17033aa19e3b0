//! Mirror of `guild/abi/kernel_abi.h`: versions, status codes, error records, extension headers,
//! backends, dtypes, device capabilities, kernel descriptors and the PFKE prefill table. The
//! runner descriptor, the host table and the plugin entry point are in `host`, which names the
//! other headers' tables.
//!
//! The header is the normative text; the comments here only say what each item is for. The
//! layout test in `tests/it` proves that every struct and constant matches the C compiler.

use core::ffi::{c_char, c_void};

// ---------------------------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------------------------

/// `GUILD_KERNEL_ABI_MAKE_VERSION`: packs major (8 bits), minor (12) and patch (12).
pub const fn guild_kernel_abi_make_version(major: u32, minor: u32, patch: u32) -> u32 {
    ((major & 0xff) << 24) | ((minor & 0xfff) << 12) | (patch & 0xfff)
}

/// `GUILD_ABI_VERSION_MAJOR`.
pub const fn guild_abi_version_major(v: u32) -> u32 {
    (v >> 24) & 0xff
}

/// `GUILD_ABI_VERSION_MINOR`.
pub const fn guild_abi_version_minor(v: u32) -> u32 {
    (v >> 12) & 0xfff
}

/// `GUILD_ABI_VERSION_PATCH`.
pub const fn guild_abi_version_patch(v: u32) -> u32 {
    v & 0xfff
}

pub const GUILD_KERNEL_ABI_VERSION_1_0_0: u32 = guild_kernel_abi_make_version(1, 0, 0);
pub const GUILD_KERNEL_ABI_VERSION: u32 = GUILD_KERNEL_ABI_VERSION_1_0_0;

pub const GUILD_SDK_VERSION_MAJOR: u32 = 1;
pub const GUILD_SDK_VERSION_MINOR: u32 = 5;
pub const GUILD_SDK_VERSION_PATCH: u32 = 0;
pub const GUILD_SDK_VERSION: u32 = guild_kernel_abi_make_version(
    GUILD_SDK_VERSION_MAJOR,
    GUILD_SDK_VERSION_MINOR,
    GUILD_SDK_VERSION_PATCH,
);

/// `GUILD_MAKE_TAG`: four ASCII bytes, the first one most significant.
pub const fn guild_make_tag(a: u8, b: u8, c: u8, d: u8) -> u32 {
    ((a as u32) << 24) | ((b as u32) << 16) | ((c as u32) << 8) | (d as u32)
}

// ---------------------------------------------------------------------------------------------
// Status codes
// ---------------------------------------------------------------------------------------------

/// Return value of every fallible call: zero is success, errors are negative.
pub type guild_status_t = i32;

pub const GUILD_STATUS_OK: guild_status_t = 0;
pub const GUILD_STATUS_ERR_INVALID_ARGUMENT: guild_status_t = -1;
pub const GUILD_STATUS_ERR_UNSUPPORTED: guild_status_t = -2;
pub const GUILD_STATUS_ERR_ABI_MISMATCH: guild_status_t = -3;
pub const GUILD_STATUS_ERR_OUT_OF_MEMORY: guild_status_t = -4;
pub const GUILD_STATUS_ERR_NOT_FOUND: guild_status_t = -5;
pub const GUILD_STATUS_ERR_ALREADY_EXISTS: guild_status_t = -6;
pub const GUILD_STATUS_ERR_BUSY: guild_status_t = -7;
pub const GUILD_STATUS_ERR_INTERNAL: guild_status_t = -8;
pub const GUILD_STATUS_ERR_DEVICE: guild_status_t = -9;
pub const GUILD_STATUS_ERR_BUFFER_TOO_SMALL: guild_status_t = -10;
pub const GUILD_STATUS_ERR_STATE: guild_status_t = -11;
pub const GUILD_STATUS_ERR_PERMISSION: guild_status_t = -12;
pub const GUILD_STATUS_ERR_TIMEOUT: guild_status_t = -13;

// ---------------------------------------------------------------------------------------------
// Error records
// ---------------------------------------------------------------------------------------------

pub const GUILD_ERROR_COMPONENT_CAPACITY: usize = 64;
pub const GUILD_ERROR_MESSAGE_CAPACITY: usize = 512;

/// Fixed-size error or log record, owned by the caller, filled by the callee on failure.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_error_info_t {
    pub struct_size: u32,
    pub status: guild_status_t,
    pub component: [c_char; GUILD_ERROR_COMPONENT_CAPACITY],
    pub message: [c_char; GUILD_ERROR_MESSAGE_CAPACITY],
}

impl guild_error_info_t {
    /// A fresh record, as `GUILD_ERROR_INFO_INITIALIZER()` makes it: sized, OK, empty strings.
    pub const fn new() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>() as u32,
            status: GUILD_STATUS_OK,
            component: [0; GUILD_ERROR_COMPONENT_CAPACITY],
            message: [0; GUILD_ERROR_MESSAGE_CAPACITY],
        }
    }
}

impl Default for guild_error_info_t {
    fn default() -> Self {
        Self::new()
    }
}

const _: () = assert!(
    core::mem::size_of::<guild_error_info_t>()
        == 8 + GUILD_ERROR_COMPONENT_CAPACITY + GUILD_ERROR_MESSAGE_CAPACITY
);

pub const GUILD_LOG_LEVEL_ERROR: u32 = 0;
pub const GUILD_LOG_LEVEL_WARN: u32 = 1;
pub const GUILD_LOG_LEVEL_INFO: u32 = 2;
pub const GUILD_LOG_LEVEL_DEBUG: u32 = 3;
pub const GUILD_LOG_LEVEL_TRACE: u32 = 4;

// ---------------------------------------------------------------------------------------------
// Extension chains
// ---------------------------------------------------------------------------------------------

/// First member of every `next_ext` extension.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_ext_header_t {
    pub struct_size: u32,
    pub tag: u32,
    pub version: u32,
    pub reserved: u32,
    pub next: *const guild_ext_header_t,
}

const _: () = assert!(core::mem::offset_of!(guild_ext_header_t, next) == 16);

// ---------------------------------------------------------------------------------------------
// Backends, dtypes, tensors
// ---------------------------------------------------------------------------------------------

pub const GUILD_BACKEND_CPU: u32 = 1 << 0;
pub const GUILD_BACKEND_CUDA: u32 = 1 << 1;
pub const GUILD_BACKEND_HIP: u32 = 1 << 2;

pub const GUILD_DTYPE_F32: u32 = 0;
pub const GUILD_DTYPE_F16: u32 = 1;
pub const GUILD_DTYPE_Q4_0: u32 = 2;
pub const GUILD_DTYPE_Q4_1: u32 = 3;
pub const GUILD_DTYPE_Q5_0: u32 = 6;
pub const GUILD_DTYPE_Q5_1: u32 = 7;
pub const GUILD_DTYPE_Q8_0: u32 = 8;
pub const GUILD_DTYPE_Q8_1: u32 = 9;
pub const GUILD_DTYPE_Q2_K: u32 = 10;
pub const GUILD_DTYPE_Q3_K: u32 = 11;
pub const GUILD_DTYPE_Q4_K: u32 = 12;
pub const GUILD_DTYPE_Q5_K: u32 = 13;
pub const GUILD_DTYPE_Q6_K: u32 = 14;
pub const GUILD_DTYPE_Q8_K: u32 = 15;
pub const GUILD_DTYPE_I8: u32 = 24;
pub const GUILD_DTYPE_I16: u32 = 25;
pub const GUILD_DTYPE_I32: u32 = 26;
pub const GUILD_DTYPE_I64: u32 = 27;
pub const GUILD_DTYPE_F64: u32 = 28;
pub const GUILD_DTYPE_BF16: u32 = 30;
pub const GUILD_DTYPE_ANY: u32 = 0xFFFF_FFFF;

pub const GUILD_MAX_TENSOR_RANK: usize = 8;

/// Opaque target of `guild_stream_t` (a CUDA or HIP stream passed through).
#[repr(C)]
#[derive(Debug)]
pub struct guild_stream_s {
    _private: [u8; 0],
}

/// An opaque GPU stream; null for the default stream or CPU work.
pub type guild_stream_t = *mut guild_stream_s;

// ---------------------------------------------------------------------------------------------
// Legacy operation kinds and sync mask
// ---------------------------------------------------------------------------------------------

pub const GUILD_OP_INVALID: u32 = 0;
pub const GUILD_OP_MATMUL: u32 = 1;
pub const GUILD_OP_MATVEC: u32 = 2;
pub const GUILD_OP_DEQUANTIZE: u32 = 3;
pub const GUILD_OP_QUANTIZE_ACTIVATIONS: u32 = 4;
pub const GUILD_OP_RMS_NORM: u32 = 5;
pub const GUILD_OP_LAYER_NORM: u32 = 6;
pub const GUILD_OP_ROPE: u32 = 7;
pub const GUILD_OP_SOFTMAX: u32 = 8;
pub const GUILD_OP_ATTENTION: u32 = 9;
pub const GUILD_OP_GATED_DELTA_NET: u32 = 10;
pub const GUILD_OP_SSM_CONV: u32 = 11;
pub const GUILD_OP_MOE_ROUTER: u32 = 12;
pub const GUILD_OP_BATCHED_EXPERT_EXEC: u32 = 13;
pub const GUILD_OP_MOE_COMBINE: u32 = 14;
pub const GUILD_OP_EMBEDDING_LOOKUP: u32 = 15;
pub const GUILD_OP_ADD: u32 = 16;
pub const GUILD_OP_MUL: u32 = 17;
pub const GUILD_OP_ACTIVATION: u32 = 18;
pub const GUILD_OP_SAMPLING: u32 = 19;
pub const GUILD_OP_KV_CACHE_UPDATE: u32 = 20;
pub const GUILD_OP_PREFILL_DIRECT: u32 = 21;
pub const GUILD_OP_PREFILL_KERNELS: u32 = 22;

pub const GUILD_LEGACY_SYNC_HOST: u32 = 1 << 0;
pub const GUILD_LEGACY_SYNC_STREAM_ASYNC: u32 = 1 << 1;
pub const GUILD_LEGACY_SYNC_DEVICE_BLOCKING: u32 = 1 << 2;
pub const GUILD_LEGACY_SYNC_GRAPH_SAFE: u32 = 1 << 3;

// ---------------------------------------------------------------------------------------------
// Device capabilities
// ---------------------------------------------------------------------------------------------

pub const GUILD_CPU_ISA_SSE4_2: u64 = 1 << 0;
pub const GUILD_CPU_ISA_AVX: u64 = 1 << 1;
pub const GUILD_CPU_ISA_AVX2: u64 = 1 << 2;
pub const GUILD_CPU_ISA_FMA: u64 = 1 << 3;
pub const GUILD_CPU_ISA_F16C: u64 = 1 << 4;
pub const GUILD_CPU_ISA_AVX512F: u64 = 1 << 5;
pub const GUILD_CPU_ISA_AVX512BW: u64 = 1 << 6;
pub const GUILD_CPU_ISA_AVX512_VNNI: u64 = 1 << 7;
pub const GUILD_CPU_ISA_AVX512_BF16: u64 = 1 << 8;
pub const GUILD_CPU_ISA_AVX_VNNI: u64 = 1 << 9;
pub const GUILD_CPU_ISA_NEON: u64 = 1 << 32;
pub const GUILD_CPU_ISA_ARM_DOTPROD: u64 = 1 << 33;
pub const GUILD_CPU_ISA_ARM_I8MM: u64 = 1 << 34;
pub const GUILD_CPU_ISA_SVE: u64 = 1 << 35;
pub const GUILD_CPU_ISA_SVE2: u64 = 1 << 36;

/// What one device offers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_device_caps_v1_t {
    pub struct_size: u32,
    pub backend: u32,
    pub device_id: i32,
    pub cuda_sm: u32,
    pub cpu_isa: u64,
    pub total_memory_bytes: u64,
    pub free_memory_bytes: u64,
    pub next_ext: *const guild_ext_header_t,
}

// ---------------------------------------------------------------------------------------------
// Kernel and runner descriptors
// ---------------------------------------------------------------------------------------------

/// One kernel implementation, registered during init and copied by the host.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_kernel_op_desc_v1_t {
    pub struct_size: u32,
    pub abi_version: u32,
    pub op_kind: u32,
    pub backend: u32,
    pub impl_id: *const c_char,
    pub op_name: *const c_char,
    pub priority: i32,
    pub sync_mask: u32,
    pub max_dim: [u64; GUILD_MAX_TENSOR_RANK],
    pub max_batch: u64,
    pub min_sm: u32,
    pub max_sm: u32,
    pub required_cpu_isa: u64,
    pub kernel_fns: *const c_void,
    pub user_data: *mut c_void,
    pub next_ext: *const guild_ext_header_t,
}

// ---------------------------------------------------------------------------------------------
// PFKE
// ---------------------------------------------------------------------------------------------

pub const GUILD_PFKE_TAG: u32 = 0x5046_4b45;
pub const GUILD_PFKE_VERSION: u32 = 1;

const _: () = assert!(GUILD_PFKE_TAG == guild_make_tag(b'P', b'F', b'K', b'E'));

/// PFKE's own 12-byte header (not a `guild_ext_header_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_prefill_ext_header_t {
    pub struct_size: u32,
    pub tag: u32,
    pub version: u32,
}

const _: () = assert!(core::mem::size_of::<guild_prefill_ext_header_t>() == 12);

/// Arguments of PFKE `gdn_ab`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_prefill_gdn_ab_args_v1_t {
    pub struct_size: u32,
    pub n_tokens: u32,
    pub n_heads: u32,
    pub input_dtype: u32,
    pub input_row_stride: u64,
    pub output_row_stride: u64,
    pub alpha: *const c_void,
    pub beta_in: *const c_void,
    pub a_log: *const f32,
    pub dt_bias: *const f32,
    pub gate_out: *mut f32,
    pub beta_out: *mut f32,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of PFKE `router_projection`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_prefill_router_args_v1_t {
    pub struct_size: u32,
    pub n_tokens: u32,
    pub n_embd: u32,
    pub n_experts: u32,
    pub hidden_dtype: u32,
    pub weight_dtype: u32,
    pub hidden_row_stride: u64,
    pub logits_row_stride: u64,
    pub hidden: *const c_void,
    pub weight: *const c_void,
    pub logits: *mut f32,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// The PFKE table, carried by `kernel_fns` of a `GUILD_OP_PREFILL_KERNELS` descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_prefill_kernel_ext_v1_t {
    pub header: guild_prefill_ext_header_t,
    pub gdn_ab: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            args: *const guild_prefill_gdn_ab_args_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub router_projection: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            args: *const guild_prefill_router_args_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
}
