//! Mirror of `guild/abi/module_abi.h`: namespaced operations (GOP1), tensor descriptors,
//! operation queries and execution, the operation service and module dependency records.

use core::ffi::{c_char, c_void, CStr};

use crate::kernel::{
    guild_device_caps_v1_t, guild_error_info_t, guild_ext_header_t, guild_kernel_op_desc_v1_t,
    guild_make_tag, guild_status_t, guild_stream_t, GUILD_MAX_TENSOR_RANK,
};

// ---------------------------------------------------------------------------------------------
// Identity
// ---------------------------------------------------------------------------------------------

pub const GUILD_OP_CUSTOM: u32 = 0x0001_0000;

pub const GUILD_MODULE_ABI_VERSION: u32 = 1;
pub const GUILD_MODULE_ABI_TAG_V1: &CStr = c"guild.module.v1";

pub const GUILD_GOP1_TAG: u32 = guild_make_tag(b'G', b'O', b'P', b'1');
pub const GUILD_GOP1_VERSION: u32 = 1;

// ---------------------------------------------------------------------------------------------
// Contract vocabulary
// ---------------------------------------------------------------------------------------------

pub const GUILD_LAYOUT_CONTIGUOUS: u32 = 1 << 0;
pub const GUILD_LAYOUT_OUTER_STRIDED: u32 = 1 << 1;

pub const GUILD_MEMORY_HOST: u32 = 1 << 0;
pub const GUILD_MEMORY_HOST_PINNED: u32 = 1 << 1;
pub const GUILD_MEMORY_DEVICE: u32 = 1 << 2;
pub const GUILD_MEMORY_MANAGED: u32 = 1 << 3;

pub const GUILD_SYNC_HOST_BLOCKING: u32 = 0;
pub const GUILD_SYNC_STREAM_ORDERED: u32 = 1;
pub const GUILD_SYNC_GRAPH_CAPTURABLE: u32 = 2;

/// `GUILD_SYNC_BIT(mode)`: the contract bit of one sync mode.
pub const fn guild_sync_bit(mode: u32) -> u32 {
    1 << mode
}

pub const GUILD_BUDGET_UNLIMITED: u64 = u64::MAX;

pub const GUILD_NUMERICS_DETERMINISTIC: u64 = 1 << 0;
pub const GUILD_NUMERICS_F32_ACCUMULATION: u64 = 1 << 1;
pub const GUILD_NUMERICS_ORDERED_REDUCTION: u64 = 1 << 2;
pub const GUILD_NUMERICS_EXACT_INTEGER: u64 = 1 << 3;

pub const GUILD_OPERATION_QUERY_VERSION: u32 = 1;
pub const GUILD_OPERATION_SERVICE_VERSION: u32 = 1;

// ---------------------------------------------------------------------------------------------
// Tensors, scratch, queries, execution
// ---------------------------------------------------------------------------------------------

/// One tensor: dtype, shape, outer strides (0 = packed), memory space, device and data.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_tensor_desc_v1_t {
    pub dtype: u32,
    pub rank: u32,
    pub dims: [u64; GUILD_MAX_TENSOR_RANK],
    pub strides: [u64; GUILD_MAX_TENSOR_RANK],
    pub memory_space: u32,
    pub device_id: i32,
    pub data: *mut c_void,
}

const _: () = assert!(core::mem::offset_of!(guild_tensor_desc_v1_t, strides) == 72);
const _: () = assert!(core::mem::offset_of!(guild_tensor_desc_v1_t, data) == 144);

/// Scratch bytes one call needs; the caller allocates and owns them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_scratch_request_v1_t {
    pub struct_size: u32,
    pub alignment: u32,
    pub host_bytes: u64,
    pub device_bytes: u64,
}

const _: () = assert!(core::mem::size_of::<guild_scratch_request_v1_t>() == 24);

/// What a caller asks the operation service to resolve.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_operation_query_v1_t {
    pub struct_size: u32,
    pub version: u32,
    pub op_name: *const c_char,
    pub min_op_version: u32,
    pub max_op_version: u32,
    pub backends: u32,
    pub sync_mode: u32,
    pub required_capabilities: u64,
    pub required_numerics: u64,
    pub inputs: *const guild_tensor_desc_v1_t,
    pub input_count: usize,
    pub outputs: *const guild_tensor_desc_v1_t,
    pub output_count: usize,
    pub ram_budget: u64,
    pub vram_budget: u64,
    pub exact_impl_id: *const c_char,
    pub device_caps: *const guild_device_caps_v1_t,
    pub params: *const c_void,
    pub params_size: usize,
}

/// One execution of a resolved operation.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_execute_args_v1_t {
    pub struct_size: u32,
    pub reserved: u32,
    pub inputs: *const guild_tensor_desc_v1_t,
    pub input_count: usize,
    pub outputs: *const guild_tensor_desc_v1_t,
    pub output_count: usize,
    pub scratch_host: *mut c_void,
    pub scratch_host_size: u64,
    pub scratch_device: *mut c_void,
    pub scratch_device_size: u64,
    pub stream: guild_stream_t,
    pub device_id: i32,
    pub sync_mode: u32,
    pub params: *const c_void,
    pub params_size: usize,
}

// ---------------------------------------------------------------------------------------------
// GOP1
// ---------------------------------------------------------------------------------------------

/// The contract of one `GUILD_OP_CUSTOM` implementation, on its descriptor's `next_ext`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_operation_ext_v1_t {
    pub header: guild_ext_header_t,
    pub op_version: u32,
    pub reserved: u32,
    pub capabilities: u64,
    pub numerics: u64,
    pub input_dtype: u32,
    pub output_dtype: u32,
    pub min_inputs: u32,
    pub max_inputs: u32,
    pub min_outputs: u32,
    pub max_outputs: u32,
    pub layouts: u32,
    pub memory_spaces: u32,
    pub min_alignment: u32,
    pub min_rank: u32,
    pub max_rank: u32,
    pub sync_modes: u32,
    pub validate: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            query: *const guild_operation_query_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub query_scratch: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            query: *const guild_operation_query_v1_t,
            out_scratch: *mut guild_scratch_request_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub execute: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            args: *const guild_execute_args_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub user_data: *mut c_void,
}

// ---------------------------------------------------------------------------------------------
// The operation service
// ---------------------------------------------------------------------------------------------

/// Opaque target of a resolved-operation handle.
#[repr(C)]
#[derive(Debug)]
pub struct guild_op_handle_s {
    _private: [u8; 0],
}

/// `typedef struct guild_op_handle_s guild_op_handle_t;` (used behind a pointer).
pub type guild_op_handle_t = guild_op_handle_s;

/// What `describe` reports; every pointer is borrowed for the handle's lifetime.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_op_description_v1_t {
    pub struct_size: u32,
    pub op_version: u32,
    pub impl_id: *const c_char,
    pub package_id: *const c_char,
    pub op_name: *const c_char,
    pub backend: u32,
    pub sync_mode: u32,
    pub scratch: guild_scratch_request_v1_t,
    pub kernel_desc: *const guild_kernel_op_desc_v1_t,
    pub operation: *const guild_operation_ext_v1_t,
    /// Optional tail: written when `struct_size >= GUILD_OP_DESCRIPTION_V1_VERSION_SIZE`.
    pub package_version: *const c_char,
}

/// `GUILD_OP_DESCRIPTION_V1_BASE_SIZE`: the description before its `package_version` tail, the
/// smallest `struct_size` a host accepts.
pub const GUILD_OP_DESCRIPTION_V1_BASE_SIZE: usize =
    core::mem::offset_of!(guild_op_description_v1_t, package_version);

/// `GUILD_OP_DESCRIPTION_V1_VERSION_SIZE`: the smallest `struct_size` of a description whose
/// `package_version` the host writes.
pub const GUILD_OP_DESCRIPTION_V1_VERSION_SIZE: usize =
    GUILD_OP_DESCRIPTION_V1_BASE_SIZE + core::mem::size_of::<*const c_char>();

/// The operation service table, the optional tail of the host table.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_operation_service_v1_t {
    pub struct_size: u32,
    pub version: u32,
    pub user: *mut c_void,
    pub resolve: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            query: *const guild_operation_query_v1_t,
            out_handle: *mut *mut guild_op_handle_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub describe: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            handle: *mut guild_op_handle_t,
            out_description: *mut guild_op_description_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub scratch: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            handle: *mut guild_op_handle_t,
            out_scratch: *mut guild_scratch_request_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub execute: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            handle: *mut guild_op_handle_t,
            args: *const guild_execute_args_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub release: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            handle: *mut guild_op_handle_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    /// Optional tail: present when `struct_size >= GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE`.
    pub reshape: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            handle: *mut guild_op_handle_t,
            args: *const guild_reshape_args_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
}

/// `GUILD_OPERATION_SERVICE_V1_BASE_SIZE`: the table's size before the optional `reshape`
/// tail, what hosts without reshape report.
pub const GUILD_OPERATION_SERVICE_V1_BASE_SIZE: usize =
    core::mem::offset_of!(guild_operation_service_v1_t, reshape);

/// `GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE`: the smallest `struct_size` of a table whose
/// `reshape` entry may be read.
pub const GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE: usize =
    GUILD_OPERATION_SERVICE_V1_BASE_SIZE + core::mem::size_of::<*const c_void>();

/// New tensors for a resolved handle (the service's `reshape`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_reshape_args_v1_t {
    pub struct_size: u32,
    pub reserved: u32,
    pub inputs: *const guild_tensor_desc_v1_t,
    pub input_count: usize,
    pub outputs: *const guild_tensor_desc_v1_t,
    pub output_count: usize,
    pub params: *const c_void,
    pub params_size: usize,
}

// ---------------------------------------------------------------------------------------------
// Module dependencies
// ---------------------------------------------------------------------------------------------

/// One runtime module dependency; optional strings are null.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_module_dependency_v1_t {
    pub module_id: *const c_char,
    pub min_version: *const c_char,
    pub max_version: *const c_char,
    pub abi_tag: *const c_char,
    pub publisher_id: *const c_char,
    pub sha256: *const c_char,
}
