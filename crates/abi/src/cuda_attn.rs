//! Mirror of `guild/abi/cuda_attn_abi.h`: the CDA1 CUDA attention table and the public
//! descriptors that replace the private C++ records (QSA and GDN shapes, pools, KV layouts, RoPE
//! scaling).
//!
//! The header is the normative text, with the units, ownership and threading rules of every
//! field; the comments here only say what each item is for. The layout test in `tests/it` proves
//! that every struct and constant matches the C compiler.

use core::ffi::{c_char, c_void, CStr};

use crate::{
    guild_error_info_t, guild_ext_header_t, guild_make_tag, guild_status_t, guild_stream_t,
};

// "CDA1": the extension tag, and the layout version of `guild_cuda_attn_ext_v1_t`.
pub const GUILD_CUDA_ATTN_TAG: u32 = guild_make_tag(b'C', b'D', b'A', b'1');
pub const GUILD_CUDA_ATTN_EXT_VERSION: u32 = 1;

/// Execution callbacks may be recorded into a CUDA graph.
pub const GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE: u32 = 1 << 0;

/// `attention` accepts a QSA selection (`args->selected`).
pub const GUILD_CUDA_ATTN_CAP_QSA: u32 = 1 << 1;

/// `attention` honours `shapes->sliding_window`.
pub const GUILD_CUDA_ATTN_CAP_SLIDING_WINDOW: u32 = 1 << 2;

/// `attention` accepts per-head sink logits.
pub const GUILD_CUDA_ATTN_CAP_SINKS: u32 = 1 << 3;

/// `gdn_update` implements chunked prefill (`shapes->chunk_size` > 0).
pub const GUILD_CUDA_ATTN_CAP_GDN_CHUNKED: u32 = 1 << 4;

// Operations named in a pool query (`guild_cuda_attn_pool_query_args_v1_t.operation`).
pub const GUILD_CUDA_ATTN_OP_ATTENTION: u32 = 1;
pub const GUILD_CUDA_ATTN_OP_GDN_UPDATE: u32 = 2;
pub const GUILD_CUDA_ATTN_OP_QSA_SELECT: u32 = 3;

// Which keys a query may attend to (`guild_cuda_attn_args_v1_t.mask_kind`).
pub const GUILD_CUDA_ATTN_MASK_NONE: u32 = 0;
pub const GUILD_CUDA_ATTN_MASK_CAUSAL: u32 = 1;
pub const GUILD_CUDA_ATTN_MASK_EXPLICIT: u32 = 2;

/// L2-normalise every q and k head vector before use.
pub const GUILD_CUDA_GDN_L2NORM_QK: u32 = 1 << 0;

/// Start every sequence from a zero state instead of reading it.
pub const GUILD_CUDA_GDN_RESET_STATE: u32 = 1 << 1;

// RoPE frequency scaling (`guild_cuda_rope_scaling_v1_t.scaling_type`).
pub const GUILD_CUDA_ROPE_SCALING_NONE: u32 = 0;
pub const GUILD_CUDA_ROPE_SCALING_LINEAR: u32 = 1;
pub const GUILD_CUDA_ROPE_SCALING_YARN: u32 = 2;
pub const GUILD_CUDA_ROPE_SCALING_LONGROPE: u32 = 3;
pub const GUILD_CUDA_ROPE_SCALING_LLAMA3: u32 = 4;

// Which element pairs RoPE rotates (`guild_cuda_rope_scaling_v1_t.mode`), numbered as GGML numbers
// its rope modes.
pub const GUILD_CUDA_ROPE_MODE_NORMAL: u32 = 0;
pub const GUILD_CUDA_ROPE_MODE_NEOX: u32 = 2;
pub const GUILD_CUDA_ROPE_MODE_MROPE: u32 = 8;
pub const GUILD_CUDA_ROPE_MODE_VISION: u32 = 24;

/// Section count of multi-axis RoPE (and rows of its position array).
pub const GUILD_CUDA_ROPE_MAX_SECTIONS: usize = 4;

// Direction of a KV stream (`guild_cuda_kv_stream_map_v1_t.direction`).
pub const GUILD_CUDA_KV_HOST_TO_DEVICE: u32 = 0;
pub const GUILD_CUDA_KV_DEVICE_TO_HOST: u32 = 1;

// Kind of value a configuration entry carries (`guild_cuda_attn_config_args_v1_t.value_kind`).
pub const GUILD_CUDA_CONFIG_VALUE_INT: u32 = 0;
pub const GUILD_CUDA_CONFIG_VALUE_FLOAT: u32 = 1;
pub const GUILD_CUDA_CONFIG_VALUE_TEXT: u32 = 2;

/// 0 or 1: allow QSA-selected sparse attention (default 1 when `GUILD_CUDA_ATTN_CAP_QSA`).
pub const GUILD_CUDA_ATTN_CONFIG_QSA_ENABLE: &CStr = c"cda1.qsa.enable";

/// Upper bound on split-K partitions of one attention call; 0 lets the provider choose.
pub const GUILD_CUDA_ATTN_CONFIG_MAX_SPLITS: &CStr = c"cda1.attn.max_splits";

/// 0 or 1: prefer kernels whose results do not depend on launch configuration.
pub const GUILD_CUDA_ATTN_CONFIG_DETERMINISTIC: &CStr = c"cda1.deterministic";

/// Chunk length for chunked GDN prefill; 0 lets the provider choose.
pub const GUILD_CUDA_ATTN_CONFIG_GDN_CHUNK_SIZE: &CStr = c"cda1.gdn.chunk_size";

/// 0 or 1: allow KV blocks to be streamed between host pools and the device cache.
pub const GUILD_CUDA_ATTN_CONFIG_KV_STREAMING: &CStr = c"cda1.kv.streaming";

/// The shape of one attention layer call (dense or QSA-sparse).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qsa_shapes_v1_t {
    pub struct_size: u32,
    pub layer_index: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim_k: u32,
    pub head_dim_v: u32,
    pub n_tokens: u32,
    pub n_seqs: u32,
    pub n_kv: u64,
    pub top_k: u32,
    pub select_block_size: u32,
    pub index_n_head: u32,
    pub index_head_dim: u32,
    pub sliding_window: u32,
    pub reserved: u32,
}

/// The shape of one gated delta-net call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_gdn_shapes_v1_t {
    pub struct_size: u32,
    pub layer_index: u32,
    pub n_k_heads: u32,
    pub n_v_heads: u32,
    pub head_k_dim: u32,
    pub head_v_dim: u32,
    pub n_tokens: u32,
    pub n_seqs: u32,
    pub chunk_size: u32,
    pub reserved: u32,
    pub state_slot_stride_bytes: u64,
}

/// Caller-owned device scratch for attention.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qsa_attn_pools_v1_t {
    pub struct_size: u32,
    pub max_splits: u32,
    pub partial_output: *mut c_void,
    pub partial_output_bytes: u64,
    pub partial_lse: *mut c_void,
    pub partial_lse_bytes: u64,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
}

/// One layer's KV cache on the device: a pool of fixed-size blocks.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_kv_cache_view_v1_t {
    pub struct_size: u32,
    pub dtype: u32,
    pub n_head_kv: u32,
    pub head_dim_k: u32,
    pub head_dim_v: u32,
    pub block_size: u32,
    pub layer_index: u32,
    pub max_blocks_per_seq: u32,
    pub block_count: u64,
    pub k_blocks: *mut c_void,
    pub v_blocks: *mut c_void,
    pub k_block_stride_bytes: u64,
    pub v_block_stride_bytes: u64,
    pub k_position_stride_bytes: u64,
    pub v_position_stride_bytes: u64,
    pub k_head_stride_bytes: u64,
    pub v_head_stride_bytes: u64,
    pub block_table: *const i32,
}

/// Host-side KV pools that blocks are streamed to and from.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_kv_host_pools_v1_t {
    pub struct_size: u32,
    pub dtype: u32,
    pub layer_count: u32,
    pub block_size: u32,
    pub block_count: u64,
    pub k_block_bytes: u64,
    pub v_block_bytes: u64,
    pub k_layer_stride_bytes: u64,
    pub v_layer_stride_bytes: u64,
    pub k_pool: *mut c_void,
    pub v_pool: *mut c_void,
}

/// Which blocks one `kv_stream` call moves: entry i copies host block `host_blocks[i]` to device
/// block `device_blocks[i]` (or back, by direction), keys and values both.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_kv_stream_map_v1_t {
    pub struct_size: u32,
    pub direction: u32,
    pub entry_count: u64,
    pub host_blocks: *const i32,
    pub device_blocks: *const i32,
}

/// Inputs and outputs of QSA selection.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qsa_indexer_buffers_v1_t {
    pub struct_size: u32,
    pub query_dtype: u32,
    pub key_dtype: u32,
    pub reserved: u32,
    pub index_queries: *const c_void,
    pub query_token_stride_bytes: u64,
    pub query_head_stride_bytes: u64,
    pub index_keys: *const c_void,
    pub key_seq_stride_bytes: u64,
    pub key_position_stride_bytes: u64,
    pub head_weights: *const f32,
    pub scores: *mut f32,
    pub score_token_stride_bytes: u64,
    pub selected: *mut i32,
    pub selected_count: *mut i32,
}

/// Rotary embedding parameters, GGML's rope parameters as a record.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_rope_scaling_v1_t {
    pub struct_size: u32,
    pub scaling_type: u32,
    pub mode: u32,
    pub n_dims: u32,
    pub n_ctx_orig: u32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub sections: [u32; GUILD_CUDA_ROPE_MAX_SECTIONS],
    pub reserved: u32,
    pub freq_factors: *const f32,
}

/// Arguments of `configure`: set one key to one value on this table's instance.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_attn_config_args_v1_t {
    pub struct_size: u32,
    pub value_kind: u32,
    pub key: *const c_char,
    pub int_value: i64,
    pub float_value: f64,
    pub text_value: *const c_char,
}

/// Arguments of `query_pools`: report the scratch one operation needs for the given shapes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_attn_pool_query_args_v1_t {
    pub struct_size: u32,
    pub operation: u32,
    pub qsa_shapes: *const guild_cuda_qsa_shapes_v1_t,
    pub gdn_shapes: *const guild_cuda_gdn_shapes_v1_t,
    pub pools_out: *mut guild_cuda_qsa_attn_pools_v1_t,
}

/// Arguments of `attention`: dense or QSA-sparse attention of the queries over the KV cache.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_attn_args_v1_t {
    pub struct_size: u32,
    pub q_dtype: u32,
    pub out_dtype: u32,
    pub mask_kind: u32,
    pub scale: f32,
    pub softcap: f32,
    pub shapes: *const guild_cuda_qsa_shapes_v1_t,
    pub cache: *const guild_cuda_kv_cache_view_v1_t,
    pub pools: *const guild_cuda_qsa_attn_pools_v1_t,
    pub q: *const c_void,
    pub q_token_stride_bytes: u64,
    pub q_head_stride_bytes: u64,
    pub query_seq_starts: *const i32,
    pub query_positions: *const i32,
    pub seq_lens: *const i32,
    pub mask: *const c_void,
    pub mask_row_stride_bytes: u64,
    pub sinks: *const f32,
    pub selected: *const i32,
    pub selected_count: *const i32,
    pub out: *mut c_void,
    pub out_token_stride_bytes: u64,
    pub out_head_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved: u32,
}

/// Arguments of `gdn_update`: the gated delta rule over each sequence's recurrent state slot.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_gdn_args_v1_t {
    pub struct_size: u32,
    pub io_dtype: u32,
    pub flags: u32,
    pub reserved0: u32,
    pub shapes: *const guild_cuda_gdn_shapes_v1_t,
    pub q: *const c_void,
    pub k: *const c_void,
    pub v: *const c_void,
    pub q_token_stride_bytes: u64,
    pub k_token_stride_bytes: u64,
    pub v_token_stride_bytes: u64,
    pub gate: *const f32,
    pub beta: *const f32,
    pub state: *mut f32,
    pub state_slots: *const i32,
    pub out: *mut c_void,
    pub out_token_stride_bytes: u64,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `rope`: rotate the first `scaling->n_dims` elements of every head of every token by
/// the token's position(s); the other elements are copied.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_rope_args_v1_t {
    pub struct_size: u32,
    pub dtype: u32,
    pub n_head: u32,
    pub head_dim: u32,
    pub n_tokens: u32,
    pub reserved0: u32,
    pub scaling: *const guild_cuda_rope_scaling_v1_t,
    pub positions: *const i32,
    pub input: *const c_void,
    pub input_token_stride_bytes: u64,
    pub input_head_stride_bytes: u64,
    pub output: *mut c_void,
    pub output_token_stride_bytes: u64,
    pub output_head_stride_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `kv_append`: write `n_tokens` new keys and values into the cache at (sequence,
/// position) pairs, converting to the cache's dtype.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_kv_append_args_v1_t {
    pub struct_size: u32,
    pub src_dtype: u32,
    pub n_tokens: u32,
    pub reserved0: u32,
    pub cache: *const guild_cuda_kv_cache_view_v1_t,
    pub k: *const c_void,
    pub v: *const c_void,
    pub k_token_stride_bytes: u64,
    pub v_token_stride_bytes: u64,
    pub token_seqs: *const i32,
    pub token_positions: *const i32,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `kv_stream`: copy the blocks named by map between the host pools and the device
/// cache of layer `cache->layer_index`, asynchronously on the stream.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_kv_stream_args_v1_t {
    pub struct_size: u32,
    pub reserved0: u32,
    pub host_pools: *const guild_cuda_kv_host_pools_v1_t,
    pub map: *const guild_cuda_kv_stream_map_v1_t,
    pub cache: *const guild_cuda_kv_cache_view_v1_t,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Arguments of `qsa_select`: run the indexer and write each query's selected positions.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_qsa_select_args_v1_t {
    pub struct_size: u32,
    pub reserved0: u32,
    pub shapes: *const guild_cuda_qsa_shapes_v1_t,
    pub buffers: *const guild_cuda_qsa_indexer_buffers_v1_t,
    pub query_seq_starts: *const i32,
    pub query_positions: *const i32,
    pub seq_lens: *const i32,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub reserved1: u32,
}

/// Type of the `configure` callback.
pub type guild_cuda_attn_configure_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_attn_config_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `query_pools` callback.
pub type guild_cuda_attn_query_pools_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_attn_pool_query_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `attention` callback.
pub type guild_cuda_attn_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_attn_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `gdn_update` callback.
pub type guild_cuda_gdn_update_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_gdn_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `rope` callback.
pub type guild_cuda_rope_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_rope_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `kv_append` callback.
pub type guild_cuda_kv_append_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_kv_append_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `kv_stream` callback.
pub type guild_cuda_kv_stream_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_kv_stream_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// Type of the `qsa_select` callback.
pub type guild_cuda_qsa_select_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        args: *const guild_cuda_qsa_select_args_v1_t,
        error: *mut guild_error_info_t,
    ) -> guild_status_t,
>;

/// The CDA1 table: `configure` and `query_pools` (required), optional execution callbacks.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_cuda_attn_ext_v1_t {
    pub header: guild_ext_header_t,
    pub capabilities: u32,
    pub reserved: u32,
    pub kv_cache_dtypes: u64,
    pub configure: guild_cuda_attn_configure_fn,
    pub query_pools: guild_cuda_attn_query_pools_fn,
    pub attention: guild_cuda_attn_fn,
    pub gdn_update: guild_cuda_gdn_update_fn,
    pub rope: guild_cuda_rope_fn,
    pub kv_append: guild_cuda_kv_append_fn,
    pub kv_stream: guild_cuda_kv_stream_fn,
    pub qsa_select: guild_cuda_qsa_select_fn,
    pub user_data: *mut c_void,
}
