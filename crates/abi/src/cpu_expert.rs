//! Mirror of `guild/abi/cpu_expert_abi.h`: the CPE1 native CPU expert table, its expert format
//! record and the arguments of its four callbacks.
//!
//! The header is the normative text, with the units, ownership and threading rules of every
//! field; the comments here only say what each item is for. The layout test in `tests/it` proves
//! that every struct and constant matches the C compiler.

use core::ffi::c_void;

use crate::{guild_error_info_t, guild_ext_header_t, guild_make_tag, guild_status_t};

// "CPE1": the extension tag, and the layout version of `guild_cpu_expert_ext_v1_t`.
pub const GUILD_CPU_EXPERT_TAG: u32 = guild_make_tag(b'C', b'P', b'E', b'1');
pub const GUILD_CPU_EXPERT_EXT_VERSION: u32 = 1;

// How an expert's weight rows are stored (`guild_cpu_expert_format_v1_t.weight_layout`).
pub const GUILD_CPU_EXPERT_WEIGHTS_GGUF: u32 = 0;
pub const GUILD_CPU_EXPERT_WEIGHTS_PLANAR_Q2: u32 = 1;
pub const GUILD_CPU_EXPERT_WEIGHTS_NATIVE: u32 = 2;

// Where the per-block scales of a quantized matrix live
// (`guild_cpu_expert_format_v1_t.scale_layout`).
pub const GUILD_CPU_EXPERT_SCALES_IN_BLOCK: u32 = 0;
pub const GUILD_CPU_EXPERT_SCALES_PLANAR: u32 = 1;

// How quantized activation rows are laid out (`guild_cpu_expert_format_v1_t.activation_layout`).
pub const GUILD_CPU_EXPERT_ACTIVATION_ROWS: u32 = 0;
pub const GUILD_CPU_EXPERT_ACTIVATION_IMAGE: u32 = 1;

// The gated activation `gate_up_rows` applies (`guild_cpu_expert_gate_up_args_v1_t.glu`): SWIGLU:
// hidden = silu(gate) * up; GEGLU: hidden = gelu(gate) * up (tanh approximation).
pub const GUILD_CPU_EXPERT_GLU_SWIGLU: u32 = 1;
pub const GUILD_CPU_EXPERT_GLU_GEGLU: u32 = 2;

/// `guild_cpu_expert_down_args_v1_t.flags`: add the result to dst instead of overwriting it.
pub const GUILD_CPU_EXPERT_DOWN_ACCUMULATE: u32 = 1 << 0;

/// The storage format of one model's expert weights and of the quantized activations that feed
/// them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_expert_format_v1_t {
    pub struct_size: u32,
    pub weight_layout: u32,
    pub scale_layout: u32,
    pub activation_layout: u32,
    pub gate_up_dtype: u32,
    pub down_dtype: u32,
    pub activation_dtype: u32,
    pub hidden_dtype: u32,
    pub gate_up_block_elements: u32,
    pub gate_up_block_bytes: u32,
    pub down_block_elements: u32,
    pub down_block_bytes: u32,
    pub activation_block_elements: u32,
    pub activation_block_bytes: u32,
    pub hidden_block_elements: u32,
    pub hidden_block_bytes: u32,
    pub alignment: u32,
    pub reserved: u32,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub expert_count: u64,
    pub expert_stride_bytes: u64,
    pub gate_offset_bytes: u64,
    pub up_offset_bytes: u64,
    pub down_offset_bytes: u64,
    pub gate_up_row_stride_bytes: u64,
    pub down_row_stride_bytes: u64,
    pub gate_scales_offset_bytes: u64,
    pub up_scales_offset_bytes: u64,
    pub down_scales_offset_bytes: u64,
    pub gate_up_scale_row_stride_bytes: u64,
    pub down_scale_row_stride_bytes: u64,
    pub activation_row_bytes: u64,
    pub hidden_row_bytes: u64,
    pub scratch_bytes: u64,
}

/// Arguments of `quantize_activation`: quantize `row_count` token rows of `hidden_size` elements
/// into `format->activation_dtype` (laid out as `format->activation_layout` says).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_expert_quantize_activation_args_v1_t {
    pub struct_size: u32,
    pub src_dtype: u32,
    pub row_count: u64,
    pub format: *const guild_cpu_expert_format_v1_t,
    pub src: *const c_void,
    pub src_row_stride_bytes: u64,
    pub dst: *mut c_void,
    pub dst_row_stride_bytes: u64,
}

/// Arguments of `quantize_hidden`: quantize `row_count` hidden rows of `intermediate_size` elements
/// (the `gate_up_rows` output) into `format->hidden_dtype` for `down_rows`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_expert_quantize_hidden_args_v1_t {
    pub struct_size: u32,
    pub src_dtype: u32,
    pub row_count: u64,
    pub format: *const guild_cpu_expert_format_v1_t,
    pub src: *const c_void,
    pub src_row_stride_bytes: u64,
    pub dst: *mut c_void,
    pub dst_row_stride_bytes: u64,
}

/// Arguments of `gate_up_rows`: `hidden[t][r] = act(gate[r] . x[t]) * (up[r] . x[t])` for the
/// tokens of one expert and the intermediate rows `row_begin..row_end`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_expert_gate_up_args_v1_t {
    pub struct_size: u32,
    pub glu: u32,
    pub expert_index: u32,
    pub token_count: u32,
    pub row_begin: u64,
    pub row_end: u64,
    pub format: *const guild_cpu_expert_format_v1_t,
    pub expert_image: *const c_void,
    pub activations: *const c_void,
    pub activation_row_stride_bytes: u64,
    pub hidden: *mut f32,
    pub hidden_row_stride_bytes: u64,
    pub scratch: *mut c_void,
    pub scratch_bytes: u64,
}

/// Arguments of `down_rows`: `dst[t][r] (+)= w[t] * (down[r] . h[t])` for the tokens of one expert
/// and the output rows `row_begin..row_end`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_expert_down_args_v1_t {
    pub struct_size: u32,
    pub flags: u32,
    pub expert_index: u32,
    pub token_count: u32,
    pub row_begin: u64,
    pub row_end: u64,
    pub format: *const guild_cpu_expert_format_v1_t,
    pub expert_image: *const c_void,
    pub hidden: *const c_void,
    pub hidden_row_stride_bytes: u64,
    pub token_weights: *const f32,
    pub dst: *mut f32,
    pub dst_row_stride_bytes: u64,
    pub scratch: *mut c_void,
    pub scratch_bytes: u64,
}

/// Type of the `quantize_activation` callback.
pub type guild_cpu_expert_quantize_activation_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_expert_quantize_activation_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `quantize_hidden` callback.
pub type guild_cpu_expert_quantize_hidden_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_expert_quantize_hidden_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `gate_up_rows` callback.
pub type guild_cpu_expert_gate_up_rows_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_expert_gate_up_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `down_rows` callback.
pub type guild_cpu_expert_down_rows_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_expert_down_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// The CPE1 table: four required synchronous callbacks and their `user_data`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_expert_ext_v1_t {
    pub header: guild_ext_header_t,
    pub quantize_activation: guild_cpu_expert_quantize_activation_fn,
    pub quantize_hidden: guild_cpu_expert_quantize_hidden_fn,
    pub gate_up_rows: guild_cpu_expert_gate_up_rows_fn,
    pub down_rows: guild_cpu_expert_down_rows_fn,
    pub user_data: *mut c_void,
}
