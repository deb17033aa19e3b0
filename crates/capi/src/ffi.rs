//! The `#[repr(C)]` mirror of `abi-headers/include/guild/guild_host.h`, nothing else. The
//! integration tests compile the header and compare every size and offset with these.

// The names and fields are the header's, documented there.
#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_void, CString};

use guild_host::abi::{guild_op_handle_t, guild_operation_service_v1_t};

use crate::guild_host_s;

/// `GUILD_HOST_CAPI_VERSION`.
pub const GUILD_HOST_CAPI_VERSION: u32 = 1;

/// `guild_host_code_t`.
pub type guild_host_code_t = i32;
pub const GUILD_HOST_OK: guild_host_code_t = 0;
pub const GUILD_HOST_ERR_INVALID_ARGUMENT: guild_host_code_t = 1;
pub const GUILD_HOST_ERR_NOT_A_STORE: guild_host_code_t = 2;
pub const GUILD_HOST_ERR_STORE: guild_host_code_t = 3;
pub const GUILD_HOST_ERR_LOCK_FILE: guild_host_code_t = 4;
pub const GUILD_HOST_ERR_BUSY: guild_host_code_t = 5;
pub const GUILD_HOST_ERR_NOT_FOUND: guild_host_code_t = 6;
pub const GUILD_HOST_ERR_HOST: guild_host_code_t = 7;
pub const GUILD_HOST_ERR_INTERNAL: guild_host_code_t = 8;

/// `GUILD_HOST_OPEN_CPU_ONLY`.
pub const GUILD_HOST_OPEN_CPU_ONLY: u32 = 1 << 0;
/// Every `GUILD_HOST_OPEN_*` bit this version knows.
pub const GUILD_HOST_OPEN_KNOWN: u32 = GUILD_HOST_OPEN_CPU_ONLY;

/// `GUILD_HOST_ID_CAPACITY`, `GUILD_HOST_VERSION_CAPACITY`.
pub const GUILD_HOST_ID_CAPACITY: usize = 136;
pub const GUILD_HOST_VERSION_CAPACITY: usize = 136;

/// `guild_host_t`.
pub type guild_host_t = guild_host_s;
/// `guild_host_error_t`.
pub type guild_host_error_t = guild_host_error_s;

/// `guild_host_log_fn`.
pub type guild_host_log_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        package_id: *const c_char,
        level: u32,
        message: *const c_char,
    ),
>;

/// `guild_host_watch_fn`.
pub type guild_host_watch_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        report: *const guild_host_refresh_v1_t,
        error: *const guild_host_error_t,
    ),
>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_host_open_options_v1_t {
    pub struct_size: u32,
    pub flags: u32,
    pub store_dir: *const c_char,
    pub lock_file: *const c_char,
    pub log: guild_host_log_fn,
    pub log_user: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct guild_host_open_report_v1_t {
    pub struct_size: u32,
    pub loaded: u32,
    pub failed: u32,
    pub skipped: u32,
    pub refused_by_lock: u32,
    pub quarantined: u32,
    pub generation: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct guild_host_refresh_v1_t {
    pub struct_size: u32,
    pub loaded: u32,
    pub from_generation: u64,
    pub generation: u64,
    pub taken_out: u32,
    pub deferred: u32,
    pub revoked_live: u32,
    pub failed: u32,
    pub pending: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct guild_host_state_v1_t {
    pub struct_size: u32,
    pub pending: u32,
    pub generation: u64,
    pub changes: u64,
    pub live_handles: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_host_handle_info_v1_t {
    pub struct_size: u32,
    pub is_current: u32,
    pub package_id: [c_char; GUILD_HOST_ID_CAPACITY],
    pub package_version: [c_char; GUILD_HOST_VERSION_CAPACITY],
}

/// `guild_host_capi_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct guild_host_capi_v1_t {
    pub struct_size: u32,
    pub version: u32,
    pub open: unsafe extern "C" fn(
        options: *const guild_host_open_options_v1_t,
        out_host: *mut *mut guild_host_t,
        out_report: *mut guild_host_open_report_v1_t,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub close: unsafe extern "C" fn(
        host: *mut guild_host_t,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub operation_service: unsafe extern "C" fn(
        host: *mut guild_host_t,
        out_service: *mut guild_operation_service_v1_t,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub handle_info: unsafe extern "C" fn(
        host: *mut guild_host_t,
        handle: *mut guild_op_handle_t,
        out_info: *mut guild_host_handle_info_v1_t,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub refresh: unsafe extern "C" fn(
        host: *mut guild_host_t,
        out_report: *mut guild_host_refresh_v1_t,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub watch: unsafe extern "C" fn(
        host: *mut guild_host_t,
        fallback_ms: u32,
        on_change: guild_host_watch_fn,
        user: *mut c_void,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub unwatch: unsafe extern "C" fn(
        host: *mut guild_host_t,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub state: unsafe extern "C" fn(
        host: *mut guild_host_t,
        out_state: *mut guild_host_state_v1_t,
        out_error: *mut *mut guild_host_error_t,
    ) -> guild_host_code_t,
    pub error_code: unsafe extern "C" fn(error: *const guild_host_error_t) -> guild_host_code_t,
    pub error_message: unsafe extern "C" fn(error: *const guild_host_error_t) -> *const c_char,
    pub error_free: unsafe extern "C" fn(error: *mut guild_host_error_t),
}

/// An owned error (`guild_host_error_t`): a code and a one-line message.
#[derive(Debug)]
pub struct guild_host_error_s {
    code: guild_host_code_t,
    message: CString,
}

impl guild_host_error_s {
    pub(crate) fn new(code: guild_host_code_t, message: &str) -> Self {
        // A NUL inside a message would cut it short in C; it becomes a visible mark instead.
        let message = CString::new(message.replace('\0', "\u{fffd}")).unwrap_or_default();
        guild_host_error_s { code, message }
    }

    /// The code.
    pub fn code(&self) -> guild_host_code_t {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        self.message.to_str().unwrap_or("")
    }

    pub(crate) fn message_ptr(&self) -> *const c_char {
        self.message.as_ptr()
    }
}
