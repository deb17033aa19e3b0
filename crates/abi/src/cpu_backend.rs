//! Mirror of `guild/abi/cpu_backend_abi.h`: the CPU backend v2 table (the CPE1 prefix plus
//! appended callbacks), the canonical 3584-byte activation image and the planar Q2 constants.
//!
//! The header is the normative text, with the units, ownership and threading rules of every
//! field; the comments here only say what each item is for. The layout test in `tests/it` proves
//! that every struct and constant matches the C compiler.

use core::ffi::c_void;

use crate::{
    guild_cpu_expert_down_rows_fn, guild_cpu_expert_format_v1_t, guild_cpu_expert_gate_up_rows_fn,
    guild_cpu_expert_quantize_activation_fn, guild_cpu_expert_quantize_hidden_fn,
    guild_error_info_t, guild_ext_header_t, guild_status_t, GUILD_CPU_EXPERT_TAG,
};

// The backend table keeps the CPE1 tag; version 2 is the layout declared here.
pub const GUILD_CPU_BACKEND_TAG: u32 = GUILD_CPU_EXPERT_TAG;
pub const GUILD_CPU_BACKEND_EXT_VERSION: u32 = 2;

// The canonical activation image is a frozen 3584-byte, 64-byte-aligned record holding up to 3072
// consecutive elements of one activation row, quantized to signed 8-bit values in planar form: all
// quants, then one F32 scale per 256-element block, then the sum of every 16-element group of
// quants (what K-quant dot products need to apply block minimums).
pub const GUILD_CPU_ACTIVATION_IMAGE_BYTES: usize = 3584;
pub const GUILD_CPU_ACTIVATION_IMAGE_ALIGN: usize = 64;

// Layout identifier and version written into every image.
pub const GUILD_CPU_ACTIVATION_IMAGE_FORMAT_Q8_PLANAR: u32 = 1;
pub const GUILD_CPU_ACTIVATION_IMAGE_VERSION: u32 = 1;

// Elements per scale block and per group sum.
pub const GUILD_CPU_ACTIVATION_IMAGE_BLOCK_ELEMENTS: u32 = 256;
pub const GUILD_CPU_ACTIVATION_IMAGE_GROUP_ELEMENTS: u32 = 16;

// Capacity of one image: 3072 elements = 12 blocks = 192 groups.
pub const GUILD_CPU_ACTIVATION_IMAGE_MAX_ELEMENTS: usize = 3072;
pub const GUILD_CPU_ACTIVATION_IMAGE_MAX_BLOCKS: usize = 12;
pub const GUILD_CPU_ACTIVATION_IMAGE_MAX_GROUPS: usize = 192;

// Bytes of the descriptive header and of the trailing padding.
pub const GUILD_CPU_ACTIVATION_IMAGE_HEADER_BYTES: usize = 64;
pub const GUILD_CPU_ACTIVATION_IMAGE_TAIL_BYTES: usize = 16;

/// One canonical activation image: 3584 bytes, 64-byte aligned (asserted below).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_activation_image_v1_t {
    pub format: u32,
    pub version: u32,
    pub element_count: u32,
    pub block_count: u32,
    pub first_element: u64,
    pub row_elements: u64,
    pub token_index: u32,
    pub flags: u32,
    pub reserved0: [u32; 6],
    pub quants: [i8; GUILD_CPU_ACTIVATION_IMAGE_MAX_ELEMENTS],
    pub block_scales: [f32; GUILD_CPU_ACTIVATION_IMAGE_MAX_BLOCKS],
    pub group_sums: [i16; GUILD_CPU_ACTIVATION_IMAGE_MAX_GROUPS],
    pub reserved1: [u8; GUILD_CPU_ACTIVATION_IMAGE_TAIL_BYTES],
}

/// A layout probe, never passed across the boundary: a one-byte lead followed by an image.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_activation_image_align_probe_v1_t {
    pub lead: u8,
    pub image: guild_cpu_activation_image_v1_t,
}

// Canonical planar Q2: the information of GGML Q2_K, stored per row as four planes (quants,
// scales, d, dmin); a row of n blocks is n * 84 bytes.
pub const GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS: u32 = 256;
pub const GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS: u32 = 16;
pub const GUILD_CPU_PLANAR_Q2_QUANT_BYTES: u32 = 64;
pub const GUILD_CPU_PLANAR_Q2_SCALE_BYTES: u32 = 16;
pub const GUILD_CPU_PLANAR_Q2_BLOCK_BYTES: u32 = 84;

/// `guild_cpu_q2_rows_args_v1_t.flags`: add the result to dst instead of overwriting it.
pub const GUILD_CPU_Q2_ROWS_ACCUMULATE: u32 = 1 << 0;

// How `router_bf16` turns logits into expert weights (`guild_cpu_router_args_v1_t.gating`).
pub const GUILD_CPU_ROUTER_GATING_SOFTMAX: u32 = 0;
pub const GUILD_CPU_ROUTER_GATING_SIGMOID: u32 = 1;
pub const GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX: u32 = 2;

/// `guild_cpu_router_args_v1_t.flags`: rescale the k selected weights to sum to 1.
pub const GUILD_CPU_ROUTER_NORMALIZE_TOP_K: u32 = 1 << 0;

/// `guild_cpu_combine_args_v1_t.flags`: add the combined row to dst instead of overwriting it.
pub const GUILD_CPU_COMBINE_ACCUMULATE: u32 = 1 << 0;

/// Arguments of `describe_format`: the provider states how it wants a layer's experts stored and
/// quantized, given the dtypes and shapes the model file has.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_describe_format_args_v1_t {
    pub struct_size: u32,
    pub weight_layout: u32,
    pub gate_up_dtype: u32,
    pub down_dtype: u32,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub expert_count: u64,
    pub format_out: *mut guild_cpu_expert_format_v1_t,
}

/// Arguments of `quantize_planar_q2`: convert `row_count` rows of `row_elements` elements from
/// `src_dtype` (F32, BF16, or `Q2_K` for a lossless repack) to canonical planar Q2.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_planar_q2_quantize_args_v1_t {
    pub struct_size: u32,
    pub src_dtype: u32,
    pub row_count: u64,
    pub row_elements: u64,
    pub src: *const c_void,
    pub src_row_stride_bytes: u64,
    pub importance: *const f32,
    pub dst: *mut c_void,
    pub dst_row_stride_bytes: u64,
}

/// Arguments of `dequantize_planar_q2`: expand canonical planar Q2 rows to F32 or BF16.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_planar_q2_dequantize_args_v1_t {
    pub struct_size: u32,
    pub dst_dtype: u32,
    pub row_count: u64,
    pub row_elements: u64,
    pub src: *const c_void,
    pub src_row_stride_bytes: u64,
    pub dst: *mut c_void,
    pub dst_row_stride_bytes: u64,
}

/// Arguments of `q2_rows`: native planar-Q2 matrix rows against canonical activation images.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_q2_rows_args_v1_t {
    pub struct_size: u32,
    pub flags: u32,
    pub token_count: u32,
    pub images_per_token: u32,
    pub row_elements: u64,
    pub row_begin: u64,
    pub row_end: u64,
    pub weights: *const c_void,
    pub weight_row_stride_bytes: u64,
    pub images: *const guild_cpu_activation_image_v1_t,
    pub dst: *mut f32,
    pub dst_row_stride_bytes: u64,
}

/// Arguments of `router_bf16`: `logits[t][e] = dot(input[t], router[e])` with a BF16 router
/// matrix, accumulated in F32; then, when `top_k` > 0, gating and top-k selection.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_router_args_v1_t {
    pub struct_size: u32,
    pub input_dtype: u32,
    pub gating: u32,
    pub flags: u32,
    pub token_count: u32,
    pub expert_count: u32,
    pub top_k: u32,
    pub weight_scale: f32,
    pub hidden_size: u64,
    pub input: *const c_void,
    pub input_row_stride_bytes: u64,
    pub router_weights: *const u16,
    pub router_row_stride_bytes: u64,
    pub selection_bias: *const f32,
    pub logits: *mut f32,
    pub expert_ids: *mut i32,
    pub expert_weights: *mut f32,
}

/// Arguments of `combine_ordered`: a weighted sum of expert rows per token, in slot order.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_combine_args_v1_t {
    pub struct_size: u32,
    pub flags: u32,
    pub token_count: u32,
    pub top_k: u32,
    pub hidden_size: u64,
    pub expert_outputs: *const f32,
    pub expert_output_row_stride_bytes: u64,
    pub slots: *const i32,
    pub weights: *const f32,
    pub shared_output: *const f32,
    pub shared_output_row_stride_bytes: u64,
    pub dst: *mut f32,
    pub dst_row_stride_bytes: u64,
}

/// Type of the `describe_format` callback.
pub type guild_cpu_describe_format_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_describe_format_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `quantize_planar_q2` callback.
pub type guild_cpu_planar_q2_quantize_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_planar_q2_quantize_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `dequantize_planar_q2` callback.
pub type guild_cpu_planar_q2_dequantize_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_planar_q2_dequantize_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `q2_rows` callback.
pub type guild_cpu_q2_rows_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_q2_rows_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `router_bf16` callback.
pub type guild_cpu_router_bf16_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_router_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `combine_ordered` callback.
pub type guild_cpu_combine_ordered_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cpu_combine_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// The CPU backend v2 table: the CPE1 prefix, then the appended (optional) callbacks.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cpu_backend_ext_v2_t {
    pub header: guild_ext_header_t,
    pub quantize_activation: guild_cpu_expert_quantize_activation_fn,
    pub quantize_hidden: guild_cpu_expert_quantize_hidden_fn,
    pub gate_up_rows: guild_cpu_expert_gate_up_rows_fn,
    pub down_rows: guild_cpu_expert_down_rows_fn,
    pub user_data: *mut c_void,
    pub describe_format: guild_cpu_describe_format_fn,
    pub quantize_planar_q2: guild_cpu_planar_q2_quantize_fn,
    pub dequantize_planar_q2: guild_cpu_planar_q2_dequantize_fn,
    pub q2_rows: guild_cpu_q2_rows_fn,
    pub router_bf16: guild_cpu_router_bf16_fn,
    pub combine_ordered: guild_cpu_combine_ordered_fn,
}

// The same frozen facts the header asserts, checked on the Rust side too.
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<guild_cpu_activation_image_v1_t>() == GUILD_CPU_ACTIVATION_IMAGE_BYTES);
    assert!(align_of::<guild_cpu_activation_image_v1_t>() == GUILD_CPU_ACTIVATION_IMAGE_ALIGN);
    assert!(
        offset_of!(guild_cpu_activation_image_align_probe_v1_t, image)
            == GUILD_CPU_ACTIVATION_IMAGE_ALIGN
    );
    assert!(
        offset_of!(guild_cpu_activation_image_v1_t, quants)
            == GUILD_CPU_ACTIVATION_IMAGE_HEADER_BYTES
    );
    assert!(offset_of!(guild_cpu_activation_image_v1_t, block_scales) == 3136);
    assert!(offset_of!(guild_cpu_activation_image_v1_t, group_sums) == 3184);
    assert!(
        offset_of!(guild_cpu_activation_image_v1_t, reserved1)
            == GUILD_CPU_ACTIVATION_IMAGE_BYTES - GUILD_CPU_ACTIVATION_IMAGE_TAIL_BYTES
    );

    // The v2 table starts with the unchanged CPE1 layout and appends right after it.
    type V1 = crate::guild_cpu_expert_ext_v1_t;
    type V2 = guild_cpu_backend_ext_v2_t;
    assert!(offset_of!(V2, header) == offset_of!(V1, header));
    assert!(offset_of!(V2, quantize_activation) == offset_of!(V1, quantize_activation));
    assert!(offset_of!(V2, quantize_hidden) == offset_of!(V1, quantize_hidden));
    assert!(offset_of!(V2, gate_up_rows) == offset_of!(V1, gate_up_rows));
    assert!(offset_of!(V2, down_rows) == offset_of!(V1, down_rows));
    assert!(offset_of!(V2, user_data) == offset_of!(V1, user_data));
    assert!(offset_of!(V2, describe_format) == size_of::<V1>());
};
