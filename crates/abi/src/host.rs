//! Mirror of the part of `guild/abi/kernel_abi.h` that ties the headers together: the runner
//! descriptor (whose `create` gets a model reader), the host callback table a plugin's init
//! receives (whose optional tail is the operation service) and the plugin entry point. It sits
//! above `kernel`, `module` and `runner`, which the C header reaches through forward
//! declarations, so that none of those three needs to name another's tables.

use core::ffi::{c_char, c_void, CStr};

use crate::kernel::{
    guild_error_info_t, guild_ext_header_t, guild_kernel_op_desc_v1_t, guild_status_t,
};
use crate::module::guild_operation_service_v1_t;
use crate::runner::guild_model_reader_v1_t;

/// One model runner, registered during init and copied by the host.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_runner_desc_v1_t {
    pub struct_size: u32,
    pub abi_version: u32,
    pub runner_id: *const c_char,
    pub priority: i32,
    pub reserved: u32,
    pub user_data: *mut c_void,
    pub create: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            model: *const guild_model_reader_v1_t,
            out_instance: *mut *mut c_void,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub destroy: Option<unsafe extern "C" fn(user_data: *mut c_void, instance: *mut c_void)>,
    pub next_ext: *const guild_ext_header_t,
}

// ---------------------------------------------------------------------------------------------
// Host callback table
// ---------------------------------------------------------------------------------------------

/// The staging table a plugin's init receives; valid only during init.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_host_api_v1_t {
    pub struct_size: u32,
    pub abi_version: u32,
    pub host_context: *mut c_void,
    pub register_kernel: Option<
        unsafe extern "C" fn(
            host_context: *mut c_void,
            desc: *const guild_kernel_op_desc_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub register_runner: Option<
        unsafe extern "C" fn(
            host_context: *mut c_void,
            desc: *const guild_runner_desc_v1_t,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub log: Option<
        unsafe extern "C" fn(
            host_context: *mut c_void,
            level: u32,
            record: *const guild_error_info_t,
        ),
    >,
    /// Optional tail: read only when `struct_size >= GUILD_HOST_API_V1_BASE_SIZE + size_of::<*const _>()`.
    pub operations: *const guild_operation_service_v1_t,
}

/// Size of the host table before the optional `operations` tail.
pub const GUILD_HOST_API_V1_BASE_SIZE: usize =
    core::mem::offset_of!(guild_host_api_v1_t, operations);

// ---------------------------------------------------------------------------------------------
// Plugin entry point
// ---------------------------------------------------------------------------------------------

/// The static descriptor a plugin's entry point returns.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_plugin_descriptor_v1_t {
    pub struct_size: u32,
    pub abi_version: u32,
    pub min_kernel_abi: u32,
    pub max_kernel_abi: u32,
    pub plugin_name: *const c_char,
    pub plugin_version: *const c_char,
    pub init: Option<
        unsafe extern "C" fn(
            host: *const guild_host_api_v1_t,
            plugin_state: *mut *mut c_void,
            error: *mut guild_error_info_t,
        ) -> guild_status_t,
    >,
    pub shutdown: Option<unsafe extern "C" fn(plugin_state: *mut c_void)>,
}

pub const GUILD_PLUGIN_ENTRY_SYMBOL_V1: &CStr = c"guild_plugin_entry_v1";

/// Type of the exported `guild_plugin_entry_v1`.
pub type guild_plugin_entry_fn =
    Option<unsafe extern "C" fn() -> *const guild_plugin_descriptor_v1_t>;
