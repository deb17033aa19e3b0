//! Mirror of `guild/abi/cuda_moe_abi.h`: the CDM1 CUDA MoE table, its argument structs and the
//! isolated Qwen specialization group.
//!
//! The header is the normative text, with the units, ownership and threading rules of every
//! field; the comments here only say what each item is for. The layout test in `tests/it` proves
//! that every struct and constant matches the C compiler.

use core::ffi::c_void;

use crate::{
    guild_error_info_t, guild_ext_header_t, guild_make_tag, guild_status_t, guild_stream_t,
};

// "CDM1": the extension tag, and the layout version of `guild_cuda_moe_ext_v1_t`.
pub const GUILD_CUDA_MOE_TAG: u32 = guild_make_tag(b'C', b'D', b'M', b'1');
pub const GUILD_CUDA_MOE_EXT_VERSION: u32 = 1;

// "CDMQ": the tag and layout version of the Qwen specialization group.
pub const GUILD_CUDA_QWEN_TAG: u32 = guild_make_tag(b'C', b'D', b'M', b'Q');
pub const GUILD_CUDA_QWEN_EXT_VERSION: u32 = 1;

/// Execution callbacks may be recorded into a CUDA graph.
pub const GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE: u32 = 1 << 0;

/// `route` and `combine` give results that do not depend on launch configuration.
pub const GUILD_CUDA_MOE_CAP_DETERMINISTIC: u32 = 1 << 1;

/// `doorbell` accepts 8-byte words.
pub const GUILD_CUDA_MOE_CAP_DOORBELL_64: u32 = 1 << 2;

// Operations named in a workspace query (`guild_cuda_moe_workspace_query_args_v1_t.operation`).
pub const GUILD_CUDA_MOE_OP_ROUTE: u32 = 1;
pub const GUILD_CUDA_MOE_OP_COMBINE: u32 = 2;
pub const GUILD_CUDA_MOE_OP_SHARED_EXPERT: u32 = 3;
pub const GUILD_CUDA_MOE_OP_GROUPED_EXPERTS: u32 = 4;
pub const GUILD_CUDA_MOE_OP_S_GEMV: u32 = 5;
pub const GUILD_CUDA_MOE_OP_S_DEQUANT: u32 = 6;
pub const GUILD_CUDA_MOE_OP_QUANTIZE: u32 = 7;
pub const GUILD_CUDA_MOE_OP_ELEMENTWISE: u32 = 8;
pub const GUILD_CUDA_MOE_OP_DOORBELL: u32 = 9;
pub const GUILD_CUDA_MOE_OP_SAMPLE: u32 = 10;
pub const GUILD_CUDA_MOE_OP_SPEC_VERIFY: u32 = 11;

/// Flags shared by several operations: add the result to the output instead of overwriting it.
pub const GUILD_CUDA_MOE_ACCUMULATE: u32 = 1 << 0;

/// `shared_expert`: scale the result by sigmoid(dot(x, `gate_input_weights`)).
pub const GUILD_CUDA_MOE_SHARED_GATED: u32 = 1 << 1;

/// `route`: rescale the k selected weights to sum to 1.
pub const GUILD_CUDA_MOE_ROUTE_NORMALIZE: u32 = 1 << 2;

// Router gating (`guild_cuda_moe_route_args_v1_t.gating`).
pub const GUILD_CUDA_MOE_GATING_SOFTMAX: u32 = 0;
pub const GUILD_CUDA_MOE_GATING_SIGMOID: u32 = 1;
pub const GUILD_CUDA_MOE_GATING_TOP_K_SOFTMAX: u32 = 2;

// Gated activations of expert FFNs: SWIGLU = silu(gate) * up, GEGLU = gelu(gate) * up.
pub const GUILD_CUDA_MOE_GLU_SWIGLU: u32 = 1;
pub const GUILD_CUDA_MOE_GLU_GEGLU: u32 = 2;

// Stages of `grouped_experts` (`guild_cuda_moe_grouped_args_v1_t.stage`).
pub const GUILD_CUDA_MOE_STAGE_GATE_UP: u32 = 1;
pub const GUILD_CUDA_MOE_STAGE_DOWN: u32 = 2;

// S-family formats (`guild_cuda_s_format_v1_t.format_id`): scaled block formats with `bits`-bit
// codes per weight and one scale (plus an offset when `GUILD_CUDA_S_FORMAT_AFFINE` is set) per
// block.
pub const GUILD_CUDA_S_FORMAT_S2: u32 = 1;
pub const GUILD_CUDA_S_FORMAT_S3: u32 = 2;
pub const GUILD_CUDA_S_FORMAT_S4: u32 = 3;
pub const GUILD_CUDA_S_FORMAT_S8: u32 = 4;

/// `guild_cuda_s_format_v1_t.flags`: every block also stores an offset.
pub const GUILD_CUDA_S_FORMAT_AFFINE: u32 = 1 << 0;

/// `guild_cuda_s_format_v1_t.flags`: scales (and offsets) live in a separate plane, not in blocks.
pub const GUILD_CUDA_S_FORMAT_PLANAR_SCALES: u32 = 1 << 1;

// Elementwise operations (`guild_cuda_elementwise_args_v1_t.op`), computed in F32 per element: ADD
// a + b; MUL a * b; SCALE alpha * a + beta; COPY a (converting dtype); SILU silu(a); GELU gelu(a);
// SWIGLU silu(a) * b; GEGLU gelu(a) * b; `SIGMOID_MUL` a * sigmoid(b); AXPY a + alpha * b.
pub const GUILD_CUDA_EW_ADD: u32 = 1;
pub const GUILD_CUDA_EW_MUL: u32 = 2;
pub const GUILD_CUDA_EW_SCALE: u32 = 3;
pub const GUILD_CUDA_EW_COPY: u32 = 4;
pub const GUILD_CUDA_EW_SILU: u32 = 5;
pub const GUILD_CUDA_EW_GELU: u32 = 6;
pub const GUILD_CUDA_EW_SWIGLU: u32 = 7;
pub const GUILD_CUDA_EW_GEGLU: u32 = 8;
pub const GUILD_CUDA_EW_SIGMOID_MUL: u32 = 9;
pub const GUILD_CUDA_EW_AXPY: u32 = 10;

// Doorbell operations (`guild_cuda_doorbell_args_v1_t.op`).
pub const GUILD_CUDA_DOORBELL_WRITE: u32 = 1;
pub const GUILD_CUDA_DOORBELL_WAIT_GEQ: u32 = 2;
pub const GUILD_CUDA_DOORBELL_WAIT_EQ: u32 = 3;

/// Accept while the draft equals the target's argmax.
pub const GUILD_CUDA_SPEC_VERIFY_GREEDY: u32 = 0;

/// Speculative-sampling rejection test against the draft distribution.
pub const GUILD_CUDA_SPEC_VERIFY_REJECTION: u32 = 1;

// Gate activations of the Qwen gated RMS normalisation: silu(z) or sigmoid(z).
pub const GUILD_CUDA_QWEN_GATE_SILU: u32 = 0;
pub const GUILD_CUDA_QWEN_GATE_SIGMOID: u32 = 1;

/// Arguments of `query_workspace`: report the scratch one operation needs.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_moe_workspace_query_args_v1_t {
    pub struct_size: u32,
    pub operation: u32,
    pub op_args: *const c_void,
    pub workspace_bytes_out: *mut u64,
}

/// Arguments of `route`: gating and top-k over router logits, with optional group-limited selection
/// (keep the `top_k_groups` groups of experts with the best scores, then select among their
/// experts) and an optional expert-major ordering of the slots (see "Routing layout").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_moe_route_args_v1_t {
    pub struct_size: u32,
    pub gating: u32,
    pub flags: u32,
    pub token_count: u32,
    pub expert_count: u32,
    pub top_k: u32,
    pub group_count: u32,
    pub top_k_groups: u32,
    pub weight_scale: f32,
    pub reserved0: u32,
    pub logits: *const f32,
    pub logits_row_stride_bytes: u64,
    pub selection_bias: *const f32,
    pub expert_ids: *mut i32,
    pub expert_weights: *mut f32,
    pub expert_offsets: *mut i32,
    pub sorted_slots: *mut i32,
    pub slot_rows: *mut i32,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `combine`: a weighted sum of each token's expert rows, in slot order, plus an
/// optional shared expert row.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_moe_combine_args_v1_t {
    pub struct_size: u32,
    pub output_dtype: u32,
    pub flags: u32,
    pub token_count: u32,
    pub top_k: u32,
    pub reserved0: u32,
    pub hidden_size: u64,
    pub expert_outputs: *const f32,
    pub expert_output_row_stride_bytes: u64,
    pub slot_rows: *const i32,
    pub expert_weights: *const f32,
    pub shared_output: *const c_void,
    pub shared_output_row_stride_bytes: u64,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `shared_expert`: for every token, y = down(glu(gate(x), up(x))), optionally scaled
/// by sigmoid(dot(x, `gate_input_weights`)) with `GUILD_CUDA_MOE_SHARED_GATED`, then written or
/// accumulated into output.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_moe_shared_expert_args_v1_t {
    pub struct_size: u32,
    pub weight_dtype: u32,
    pub io_dtype: u32,
    pub glu: u32,
    pub flags: u32,
    pub token_count: u32,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub gate_weights: *const c_void,
    pub up_weights: *const c_void,
    pub down_weights: *const c_void,
    pub gate_up_row_stride_bytes: u64,
    pub down_row_stride_bytes: u64,
    pub gate_input_weights: *const c_void,
    pub input: *const c_void,
    pub input_row_stride_bytes: u64,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of `grouped_experts`: one stage of every routed expert's FFN in one launch.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_moe_grouped_args_v1_t {
    pub struct_size: u32,
    pub stage: u32,
    pub weight_dtype: u32,
    pub input_dtype: u32,
    pub glu: u32,
    pub expert_count: u32,
    pub top_k: u32,
    pub token_count: u32,
    pub in_features: u64,
    pub out_features: u64,
    pub weights: *const c_void,
    pub up_weights: *const c_void,
    pub expert_stride_bytes: u64,
    pub weight_row_stride_bytes: u64,
    pub expert_offsets: *const i32,
    pub sorted_slots: *const i32,
    pub input: *const c_void,
    pub input_row_stride_bytes: u64,
    pub output: *mut f32,
    pub output_row_stride_bytes: u64,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// One S-family format (see `GUILD_CUDA_S_FORMAT_S2` and its siblings): plain numbers only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_s_format_v1_t {
    pub struct_size: u32,
    pub format_id: u32,
    pub bits: u32,
    pub block_elements: u32,
    pub block_bytes: u32,
    pub scale_dtype: u32,
    pub flags: u32,
    pub reserved: u32,
}

/// Arguments of `s_gemv`: `output[t][i] = dot(W[row(i)], x[t])` in F32 for S-family weights, a
/// few tokens at a time.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_s_gemv_args_v1_t {
    pub struct_size: u32,
    pub input_dtype: u32,
    pub flags: u32,
    pub row_id_count: u32,
    pub format: *const guild_cuda_s_format_v1_t,
    pub rows: u64,
    pub cols: u64,
    pub tokens: u64,
    pub weights: *const c_void,
    pub weight_row_stride_bytes: u64,
    pub scales: *const c_void,
    pub scale_row_stride_bytes: u64,
    pub input: *const c_void,
    pub input_row_stride_bytes: u64,
    pub row_ids: *const i32,
    pub output: *mut f32,
    pub output_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of `s_dequant`: expand S-family rows to F32, F16 or BF16.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_s_dequant_args_v1_t {
    pub struct_size: u32,
    pub output_dtype: u32,
    pub format: *const guild_cuda_s_format_v1_t,
    pub rows: u64,
    pub cols: u64,
    pub weights: *const c_void,
    pub weight_row_stride_bytes: u64,
    pub scales: *const c_void,
    pub scale_row_stride_bytes: u64,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of `quantize`: quantize activation rows to a block format, optionally gathering them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_moe_quantize_args_v1_t {
    pub struct_size: u32,
    pub input_dtype: u32,
    pub output_dtype: u32,
    pub gather_divisor: u32,
    pub cols: u64,
    pub padded_cols: u64,
    pub rows: u64,
    pub input: *const c_void,
    pub input_row_stride_bytes: u64,
    pub gather_rows: *const i32,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of `elementwise`: `out[r][c] = op(a[r][c], b[r][c])` over rows x cols elements.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_elementwise_args_v1_t {
    pub struct_size: u32,
    pub op: u32,
    pub a_dtype: u32,
    pub b_dtype: u32,
    pub out_dtype: u32,
    pub reserved0: u32,
    pub rows: u64,
    pub cols: u64,
    pub alpha: f32,
    pub beta: f32,
    pub a: *const c_void,
    pub a_row_stride_bytes: u64,
    pub b: *const c_void,
    pub b_row_stride_bytes: u64,
    pub out: *mut c_void,
    pub out_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `doorbell`: a stream-ordered write of, or wait on, one memory word.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_doorbell_args_v1_t {
    pub struct_size: u32,
    pub op: u32,
    pub width_bytes: u32,
    pub reserved0: u32,
    pub address: *mut c_void,
    pub value: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `sample`: one token per logits row.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_sample_args_v1_t {
    pub struct_size: u32,
    pub row_count: u32,
    pub top_k: u32,
    pub reserved0: u32,
    pub vocab_size: u64,
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub reserved1: u32,
    pub seed: u64,
    pub offset: u64,
    pub logits: *const f32,
    pub logits_row_stride_bytes: u64,
    pub tokens: *mut i32,
    pub probabilities: *mut f32,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved2: u32,
}

/// Arguments of `spec_verify`: for each sequence, test its `draft_count` draft tokens against the
/// target model's logits for the draft positions (`draft_count` + 1 rows: one per draft plus the
/// position after the last).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_spec_verify_args_v1_t {
    pub struct_size: u32,
    pub mode: u32,
    pub seq_count: u32,
    pub draft_count: u32,
    pub vocab_size: u64,
    pub temperature: f32,
    pub reserved0: u32,
    pub seed: u64,
    pub offset: u64,
    pub draft_tokens: *const i32,
    pub draft_probs: *const f32,
    pub draft_probs_row_stride_bytes: u64,
    pub target_logits: *const f32,
    pub target_row_stride_bytes: u64,
    pub accepted_counts: *mut i32,
    pub output_tokens: *mut i32,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `gr`: gated RMS normalisation, `rmsnorm(x) * weight * act(z)` per group.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qwen_gr_args_v1_t {
    pub struct_size: u32,
    pub io_dtype: u32,
    pub gate_act: u32,
    pub rows: u32,
    pub cols: u64,
    pub group_size: u64,
    pub eps: f32,
    pub reserved0: u32,
    pub input: *const c_void,
    pub input_row_stride_bytes: u64,
    pub gate: *const c_void,
    pub gate_row_stride_bytes: u64,
    pub weight: *const f32,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `fused_gr`: `residual[r] += delta[r]`, then `output[r] = gr(residual[r], gate[r])`
/// as in gr (plain RMS normalisation when gate is NULL), and, when `output_q8_1` is non-NULL, the
/// same row also quantized to `Q8_1` with zeros from cols to `padded_cols`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qwen_fused_gr_args_v1_t {
    pub struct_size: u32,
    pub io_dtype: u32,
    pub gate_act: u32,
    pub rows: u32,
    pub cols: u64,
    pub group_size: u64,
    pub eps: f32,
    pub reserved0: u32,
    pub residual: *mut c_void,
    pub residual_row_stride_bytes: u64,
    pub delta: *const c_void,
    pub delta_row_stride_bytes: u64,
    pub gate: *const c_void,
    pub gate_row_stride_bytes: u64,
    pub weight: *const f32,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub output_q8_1: *mut c_void,
    pub output_q8_1_row_stride_bytes: u64,
    pub padded_cols: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `ple`: one layer's slice of the per-layer embeddings of each token.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qwen_ple_args_v1_t {
    pub struct_size: u32,
    pub table_dtype: u32,
    pub io_dtype: u32,
    pub layer_index: u32,
    pub layer_count: u32,
    pub token_count: u32,
    pub ple_dim: u64,
    pub table_scale: f32,
    pub output_scale: f32,
    pub token_ids: *const i32,
    pub table: *const c_void,
    pub table_row_stride_bytes: u64,
    pub vocab_size: u64,
    pub projected: *const c_void,
    pub projected_row_stride_bytes: u64,
    pub output: *mut c_void,
    pub output_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of `cvec`, a control vector: `hidden[t] += strength * vector` for every token,
/// applied by the host after the layers it chooses.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qwen_cvec_args_v1_t {
    pub struct_size: u32,
    pub io_dtype: u32,
    pub layer_index: u32,
    pub token_count: u32,
    pub hidden_size: u64,
    pub strength: f32,
    pub reserved0: u32,
    pub vector: *const f32,
    pub hidden: *mut c_void,
    pub hidden_row_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Type of the `gr` callback.
pub type guild_cuda_qwen_gr_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_qwen_gr_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `fused_gr` callback.
pub type guild_cuda_qwen_fused_gr_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_qwen_fused_gr_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `ple` callback.
pub type guild_cuda_qwen_ple_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_qwen_ple_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `cvec` callback.
pub type guild_cuda_qwen_cvec_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_qwen_cvec_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// The Qwen specialization group, reached only through `guild_cuda_moe_ext_v1_t.qwen` (never
/// through a `next_ext` chain, so header.next is NULL).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qwen_group_v1_t {
    pub header: guild_ext_header_t,
    pub gr: guild_cuda_qwen_gr_fn,
    pub fused_gr: guild_cuda_qwen_fused_gr_fn,
    pub ple: guild_cuda_qwen_ple_fn,
    pub cvec: guild_cuda_qwen_cvec_fn,
    pub user_data: *mut c_void,
}

/// Type of the `query_workspace` callback.
pub type guild_cuda_moe_query_workspace_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_moe_workspace_query_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `route` callback.
pub type guild_cuda_moe_route_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_moe_route_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `combine` callback.
pub type guild_cuda_moe_combine_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_moe_combine_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `shared_expert` callback.
pub type guild_cuda_moe_shared_expert_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_moe_shared_expert_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `grouped_experts` callback.
pub type guild_cuda_moe_grouped_experts_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_moe_grouped_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `s_gemv` callback.
pub type guild_cuda_s_gemv_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_s_gemv_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `s_dequant` callback.
pub type guild_cuda_s_dequant_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_s_dequant_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `quantize` callback.
pub type guild_cuda_moe_quantize_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_moe_quantize_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `elementwise` callback.
pub type guild_cuda_elementwise_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_elementwise_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `doorbell` callback.
pub type guild_cuda_doorbell_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_doorbell_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `sample` callback.
pub type guild_cuda_sample_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_sample_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `spec_verify` callback.
pub type guild_cuda_spec_verify_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_spec_verify_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// The CDM1 table: `query_workspace` (required), optional execution callbacks, the Qwen group.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_moe_ext_v1_t {
    pub header: guild_ext_header_t,
    pub capabilities: u32,
    pub reserved: u32,
    pub grouped_dtypes: u64,
    pub s_formats: u64,
    pub query_workspace: guild_cuda_moe_query_workspace_fn,
    pub route: guild_cuda_moe_route_fn,
    pub combine: guild_cuda_moe_combine_fn,
    pub shared_expert: guild_cuda_moe_shared_expert_fn,
    pub grouped_experts: guild_cuda_moe_grouped_experts_fn,
    pub s_gemv: guild_cuda_s_gemv_fn,
    pub s_dequant: guild_cuda_s_dequant_fn,
    pub quantize: guild_cuda_moe_quantize_fn,
    pub elementwise: guild_cuda_elementwise_fn,
    pub doorbell: guild_cuda_doorbell_fn,
    pub sample: guild_cuda_sample_fn,
    pub spec_verify: guild_cuda_spec_verify_fn,
    pub qwen: *const guild_cuda_qwen_group_v1_t,
    pub user_data: *mut c_void,
}
