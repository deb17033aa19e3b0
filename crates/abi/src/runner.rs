//! Mirror of `guild/abi/runner_abi.h`: the RMD1 model-description extension, the host's
//! read-only model reader and the fixed-width model description.

use core::ffi::{c_char, c_void};

use crate::kernel::{
    guild_error_info_t, guild_ext_header_t, guild_make_tag, guild_status_t, GUILD_MAX_TENSOR_RANK,
};

pub const GUILD_RMD1_TAG: u32 = guild_make_tag(b'R', b'M', b'D', b'1');
pub const GUILD_RMD1_VERSION: u32 = 1;

pub const GUILD_MODEL_READER_VERSION: u32 = 1;
pub const GUILD_RUNNER_MODEL_VERSION: u32 = 1;

// ---------------------------------------------------------------------------------------------
// Model reader
// ---------------------------------------------------------------------------------------------

pub const GUILD_META_TYPE_UINT8: u32 = 0;
pub const GUILD_META_TYPE_INT8: u32 = 1;
pub const GUILD_META_TYPE_UINT16: u32 = 2;
pub const GUILD_META_TYPE_INT16: u32 = 3;
pub const GUILD_META_TYPE_UINT32: u32 = 4;
pub const GUILD_META_TYPE_INT32: u32 = 5;
pub const GUILD_META_TYPE_FLOAT32: u32 = 6;
pub const GUILD_META_TYPE_BOOL: u32 = 7;
pub const GUILD_META_TYPE_STRING: u32 = 8;
pub const GUILD_META_TYPE_ARRAY: u32 = 9;
pub const GUILD_META_TYPE_UINT64: u32 = 10;
pub const GUILD_META_TYPE_INT64: u32 = 11;
pub const GUILD_META_TYPE_FLOAT64: u32 = 12;

/// Shape and type of one stored tensor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_model_tensor_info_v1_t {
    pub struct_size: u32,
    pub dtype: u32,
    pub rank: u32,
    pub reserved: u32,
    pub dims: [u64; GUILD_MAX_TENSOR_RANK],
    pub size_bytes: u64,
    pub name: *const c_char,
}

/// The host's read-only view of an opened model, valid for one callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_model_reader_v1_t {
    pub struct_size: u32,
    pub version: u32,
    pub ctx: *mut c_void,
    pub find_key: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            out_type: *mut u32,
        ) -> guild_status_t,
    >,
    pub get_int: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            out_value: *mut i64,
        ) -> guild_status_t,
    >,
    pub get_uint: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            out_value: *mut u64,
        ) -> guild_status_t,
    >,
    pub get_float: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            out_value: *mut f64,
        ) -> guild_status_t,
    >,
    pub get_string: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            buffer: *mut c_char,
            buffer_size: usize,
            out_length: *mut usize,
        ) -> guild_status_t,
    >,
    pub get_array_info: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            out_element_type: *mut u32,
            out_length: *mut u64,
        ) -> guild_status_t,
    >,
    pub get_array_ints: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            first: u64,
            out_values: *mut i64,
            count: usize,
        ) -> guild_status_t,
    >,
    pub get_array_uints: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            first: u64,
            out_values: *mut u64,
            count: usize,
        ) -> guild_status_t,
    >,
    pub get_array_floats: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            first: u64,
            out_values: *mut f64,
            count: usize,
        ) -> guild_status_t,
    >,
    pub get_array_string: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            index: u64,
            buffer: *mut c_char,
            buffer_size: usize,
            out_length: *mut usize,
        ) -> guild_status_t,
    >,
    pub tensor_count:
        Option<unsafe extern "C" fn(ctx: *mut c_void, out_count: *mut u64) -> guild_status_t>,
    pub find_tensor: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            name: *const c_char,
            out_info: *mut guild_model_tensor_info_v1_t,
        ) -> guild_status_t,
    >,
    pub tensor_at: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            index: u64,
            out_info: *mut guild_model_tensor_info_v1_t,
        ) -> guild_status_t,
    >,
}

// ---------------------------------------------------------------------------------------------
// Model description
// ---------------------------------------------------------------------------------------------

pub const GUILD_RUNNER_ARCH_CAPACITY: usize = 64;

pub const GUILD_ROPE_TYPE_NONE: u32 = 0;
pub const GUILD_ROPE_TYPE_NORMAL: u32 = 1;
pub const GUILD_ROPE_TYPE_NEOX: u32 = 2;
pub const GUILD_ROPE_TYPE_MROPE: u32 = 3;

pub const GUILD_ROPE_SCALING_NONE: u32 = 0;
pub const GUILD_ROPE_SCALING_LINEAR: u32 = 1;
pub const GUILD_ROPE_SCALING_YARN: u32 = 2;
pub const GUILD_ROPE_SCALING_LONGROPE: u32 = 3;

pub const GUILD_PREFILL_TOKEN_BY_TOKEN: u32 = 0;
pub const GUILD_PREFILL_BATCHED: u32 = 1;
pub const GUILD_PREFILL_CHUNKED: u32 = 2;

pub const GUILD_TENSOR_ROLE_UNKNOWN: u32 = 0;
pub const GUILD_TENSOR_ROLE_TOKEN_EMBD: u32 = 1;
pub const GUILD_TENSOR_ROLE_OUTPUT_NORM: u32 = 2;
pub const GUILD_TENSOR_ROLE_OUTPUT: u32 = 3;
pub const GUILD_TENSOR_ROLE_ATTN_NORM: u32 = 4;
pub const GUILD_TENSOR_ROLE_ATTN_Q: u32 = 5;
pub const GUILD_TENSOR_ROLE_ATTN_K: u32 = 6;
pub const GUILD_TENSOR_ROLE_ATTN_V: u32 = 7;
pub const GUILD_TENSOR_ROLE_ATTN_QKV: u32 = 8;
pub const GUILD_TENSOR_ROLE_ATTN_OUTPUT: u32 = 9;
pub const GUILD_TENSOR_ROLE_ATTN_Q_NORM: u32 = 10;
pub const GUILD_TENSOR_ROLE_ATTN_K_NORM: u32 = 11;
pub const GUILD_TENSOR_ROLE_ATTN_GATE: u32 = 12;
pub const GUILD_TENSOR_ROLE_POST_ATTN_NORM: u32 = 13;
pub const GUILD_TENSOR_ROLE_FFN_NORM: u32 = 14;
pub const GUILD_TENSOR_ROLE_FFN_GATE: u32 = 15;
pub const GUILD_TENSOR_ROLE_FFN_UP: u32 = 16;
pub const GUILD_TENSOR_ROLE_FFN_DOWN: u32 = 17;
pub const GUILD_TENSOR_ROLE_FFN_ROUTER: u32 = 18;
pub const GUILD_TENSOR_ROLE_FFN_GATE_EXPS: u32 = 19;
pub const GUILD_TENSOR_ROLE_FFN_UP_EXPS: u32 = 20;
pub const GUILD_TENSOR_ROLE_FFN_DOWN_EXPS: u32 = 21;
pub const GUILD_TENSOR_ROLE_FFN_GATE_SHEXP: u32 = 22;
pub const GUILD_TENSOR_ROLE_FFN_UP_SHEXP: u32 = 23;
pub const GUILD_TENSOR_ROLE_FFN_DOWN_SHEXP: u32 = 24;
pub const GUILD_TENSOR_ROLE_FFN_ROUTER_SHEXP: u32 = 25;
pub const GUILD_TENSOR_ROLE_SSM_IN: u32 = 26;
pub const GUILD_TENSOR_ROLE_SSM_CONV1D: u32 = 27;
pub const GUILD_TENSOR_ROLE_SSM_A: u32 = 28;
pub const GUILD_TENSOR_ROLE_SSM_DT_BIAS: u32 = 29;
pub const GUILD_TENSOR_ROLE_SSM_BETA_ALPHA: u32 = 30;
pub const GUILD_TENSOR_ROLE_SSM_NORM: u32 = 31;
pub const GUILD_TENSOR_ROLE_SSM_OUT: u32 = 32;
pub const GUILD_TENSOR_ROLE_PLE_TOKEN_EMBD: u32 = 33;
pub const GUILD_TENSOR_ROLE_PLE_MODEL_PROJ: u32 = 34;
pub const GUILD_TENSOR_ROLE_PLE_PROJ_NORM: u32 = 35;
pub const GUILD_TENSOR_ROLE_ROPE_FREQS: u32 = 36;

pub const GUILD_TENSOR_ROLE_FLAG_OPTIONAL: u32 = 1 << 0;

/// One canonical role mapped to a tensor name.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_tensor_role_v1_t {
    pub role: u32,
    pub layer: i32,
    pub name: *const c_char,
    pub flags: u32,
    pub reserved: u32,
}

/// A model as a runner describes it; the host copies it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_runner_model_v1_t {
    pub struct_size: u32,
    pub version: u32,
    pub architecture: [c_char; GUILD_RUNNER_ARCH_CAPACITY],
    pub n_layers: u32,
    pub n_embd: u32,
    pub n_ff: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub head_dim_v: u32,
    pub vocab_size: u32,
    pub context_length: u32,
    pub norm_eps: f32,
    pub ssm_conv_kernel: u32,
    pub ssm_state_size: u32,
    pub ssm_group_count: u32,
    pub ssm_time_step_rank: u32,
    pub ssm_inner_size: u32,
    pub full_attention_interval: u32,
    pub n_experts: u32,
    pub n_experts_used: u32,
    pub expert_ffn: u32,
    pub shared_expert_ffn: u32,
    pub rope_type: u32,
    pub rope_dims: u32,
    pub rope_scaling_type: u32,
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
    pub rope_orig_context: u32,
    pub ple_required: u32,
    pub ple_dim: u32,
    pub prefill_strategy: u32,
    pub prefill_chunk_tokens: u32,
    pub tensor_roles: *const guild_tensor_role_v1_t,
    pub tensor_role_count: usize,
}

// ---------------------------------------------------------------------------------------------
// RMD1
// ---------------------------------------------------------------------------------------------

/// The model-description extension on a runner descriptor's `next_ext`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_runner_model_ext_v1_t {
    pub header: guild_ext_header_t,
    pub priority: i32,
    pub reserved: u32,
    pub recognize: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            model: *const guild_model_reader_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub describe: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            model: *const guild_model_reader_v1_t,
            out_model: *mut guild_runner_model_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub validate_numerics: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            model: *const guild_model_reader_v1_t,
            description: *const guild_runner_model_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub user_data: *mut c_void,
}
