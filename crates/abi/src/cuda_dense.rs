//! Mirror of `guild/abi/cuda_dense_abi.h`: the CDD1 CUDA dense projection table (BF16/F32
//! projection, Q8_1 quantization, MMVQ) and its geometry, stride and row-selection records.
//!
//! The header is the normative text, with the units, ownership and threading rules of every
//! field; the comments here only say what each item is for. The layout test in `tests/it` proves
//! that every struct and constant matches the C compiler.

use core::ffi::c_void;

use crate::{
    guild_error_info_t, guild_ext_header_t, guild_make_tag, guild_status_t, guild_stream_t,
};

// "CDD1": the extension tag, and the layout version of `guild_cuda_dense_ext_v1_t`.
pub const GUILD_CUDA_DENSE_TAG: u32 = guild_make_tag(b'C', b'D', b'D', b'1');
pub const GUILD_CUDA_DENSE_EXT_VERSION: u32 = 1;

/// `guild_cuda_dense_ext_v1_t.capabilities`: every callback may be recorded into a CUDA graph.
pub const GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE: u32 = 1 << 0;

/// `guild_cuda_dense_ext_v1_t.capabilities`: `project` accepts BF16 outputs.
pub const GUILD_CUDA_DENSE_CAP_BF16_OUTPUT: u32 = 1 << 1;

/// Flags of `project` and `mmvq`: add the product to the output instead of overwriting it.
pub const GUILD_CUDA_DENSE_ACCUMULATE: u32 = 1 << 0;

// GGML `Q8_1` block: 32 int8 quants with an F16 scale d and the F16 value d * sum(quants).
pub const GUILD_CUDA_DENSE_Q8_1_BLOCK_ELEMENTS: u32 = 32;
pub const GUILD_CUDA_DENSE_Q8_1_BLOCK_BYTES: u32 = 36;

/// Quantized activation rows are padded with zeros to a multiple of this many elements, so that
/// MMVQ kernels can read whole tiles without bounds checks.
pub const GUILD_CUDA_DENSE_Q8_1_ROW_PADDING: u32 = 512;

/// The most tokens one `mmvq` call handles.
pub const GUILD_CUDA_DENSE_MMVQ_MAX_TOKENS: u32 = 8;

/// `GUILD_CUDA_DTYPE_BIT(dtype)`: the bit of a dtype id in a `u64` dtype mask such as
/// `mmvq_dtypes`. Ids of 64 and above have no bit (the C macro must not be used with them).
pub const fn guild_cuda_dtype_bit(dtype: u32) -> u64 {
    if dtype < 64 {
        1 << dtype
    } else {
        0
    }
}

/// The shape of one dense product.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_dense_geometry_v1_t {
    pub rows: u64,
    pub cols: u64,
    pub tokens: u64,
}

/// Byte strides of the three operands of a dense product.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_dense_strides_v1_t {
    pub weight_row_stride_bytes: u64,
    pub input_row_stride_bytes: u64,
    pub output_row_stride_bytes: u64,
}

/// An exact set of weight rows to compute; a null `rows` selects every row in order.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_row_selection_v1_t {
    pub rows: *const i32,
    pub count: u32,
    pub reserved: u32,
}

/// Arguments of project: `output[t][i] = dot(W[row(i)], input[t]) (+ bias[row(i)])` with F32
/// accumulation, for BF16 or F32 weights and F32 or BF16 activations.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_dense_project_args_v1_t {
    pub struct_size: u32,
    pub weight_dtype: u32,
    pub input_dtype: u32,
    pub output_dtype: u32,
    pub flags: u32,
    pub reserved0: u32,
    pub geometry: guild_cuda_dense_geometry_v1_t,
    pub strides: guild_cuda_dense_strides_v1_t,
    pub selection: guild_cuda_row_selection_v1_t,
    pub weights: *const c_void,
    pub input: *const c_void,
    pub bias: *const f32,
    pub output: *mut c_void,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `quantize_q8_1`: quantize token rows to GGML `Q8_1`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_dense_quantize_q8_1_args_v1_t {
    pub struct_size: u32,
    pub input_dtype: u32,
    pub cols: u64,
    pub padded_cols: u64,
    pub rows: u64,
    pub input: *const c_void,
    pub input_row_stride_bytes: u64,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of mmvq: `output[t][i] = dot(W[row(i)], x[t]) (+ bias[row(i)])` in F32, for weights
/// in a GGUF block-quantized dtype listed in the table's `mmvq_dtypes` and activations quantized to
/// `Q8_1` by `quantize_q8_1`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_dense_mmvq_args_v1_t {
    pub struct_size: u32,
    pub weight_dtype: u32,
    pub flags: u32,
    pub reserved0: u32,
    pub geometry: guild_cuda_dense_geometry_v1_t,
    pub strides: guild_cuda_dense_strides_v1_t,
    pub selection: guild_cuda_row_selection_v1_t,
    pub weights: *const c_void,
    pub input_q8_1: *const c_void,
    pub bias: *const f32,
    pub output: *mut f32,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Type of the `project` callback.
pub type guild_cuda_dense_project_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_dense_project_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `quantize_q8_1` callback.
pub type guild_cuda_dense_quantize_q8_1_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_dense_quantize_q8_1_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `mmvq` callback.
pub type guild_cuda_dense_mmvq_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_dense_mmvq_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// The CDD1 table: optional stream-ordered callbacks and their `user_data`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_dense_ext_v1_t {
    pub header: guild_ext_header_t,
    pub capabilities: u32,
    pub reserved: u32,
    pub mmvq_dtypes: u64,
    pub project: guild_cuda_dense_project_fn,
    pub quantize_q8_1: guild_cuda_dense_quantize_q8_1_fn,
    pub mmvq: guild_cuda_dense_mmvq_fn,
    pub user_data: *mut c_void,
}
