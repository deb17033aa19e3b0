//! The minimal C plugin: its descriptor agrees with the ABI mirror, and its init and shutdown
//! keep the contract the header writes down for them.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_void, CStr};

use guild_abi::{
    guild_error_info_t, guild_host_api_v1_t, guild_kernel_abi_make_version,
    guild_kernel_op_desc_v1_t, guild_plugin_descriptor_v1_t, guild_runner_desc_v1_t,
    guild_status_t, GUILD_HOST_API_V1_BASE_SIZE, GUILD_KERNEL_ABI_VERSION, GUILD_LOG_LEVEL_DEBUG,
    GUILD_STATUS_ERR_ABI_MISMATCH, GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_OK,
};

use crate::support::LoadedPlugin;

const PLUGIN: &str = "minimal_kernel";

#[test]
fn descriptor_matches_the_abi_mirror() {
    let plugin = LoadedPlugin::load(PLUGIN);
    let descriptor = plugin.descriptor();

    assert_eq!(
        descriptor.struct_size as usize,
        size_of::<guild_plugin_descriptor_v1_t>()
    );
    assert_eq!(descriptor.abi_version, GUILD_KERNEL_ABI_VERSION);
    assert_eq!(
        descriptor.abi_version, 0x0100_0000,
        "Kernel ABI 1.0.0 packs to 0x01000000"
    );
    assert_eq!(descriptor.min_kernel_abi, GUILD_KERNEL_ABI_VERSION);
    assert_eq!(descriptor.max_kernel_abi, GUILD_KERNEL_ABI_VERSION);
    assert_eq!(text(descriptor.plugin_name), "minimal_kernel");
    assert_eq!(text(descriptor.plugin_version), "1.0.0");
    assert!(descriptor.init.is_some(), "init is NULL");
    assert!(descriptor.shutdown.is_some(), "shutdown is NULL");
}

#[test]
fn init_registers_nothing_and_logs_once_through_the_host_table() {
    let plugin = LoadedPlugin::load(PLUGIN);
    let host = FakeHost::default();
    let table = host.table(GUILD_KERNEL_ABI_VERSION, size_of::<guild_host_api_v1_t>());

    let outcome = init_then_shutdown(&plugin, &table);

    assert_eq!(
        outcome.status,
        GUILD_STATUS_OK,
        "init failed: {}",
        text(outcome.error.message.as_ptr())
    );
    assert!(
        outcome.plugin_state.is_null(),
        "minimal_kernel allocates no state"
    );
    assert_eq!((host.kernels.get(), host.runners.get()), (0, 0));
    assert_eq!(
        host.logs.borrow().as_slice(),
        [(
            GUILD_LOG_LEVEL_DEBUG,
            GUILD_STATUS_OK,
            "minimal_kernel".to_string(),
            "initialised; no kernels to register".to_string()
        )]
    );
}

#[test]
fn init_accepts_a_host_table_without_the_operations_tail() {
    let plugin = LoadedPlugin::load(PLUGIN);
    let host = FakeHost::default();
    // What a pre-1.5 host passes: the table stops before the optional operation-service pointer.
    let table = host.table(GUILD_KERNEL_ABI_VERSION, GUILD_HOST_API_V1_BASE_SIZE);

    let outcome = init_then_shutdown(&plugin, &table);

    assert_eq!(
        outcome.status,
        GUILD_STATUS_OK,
        "init failed: {}",
        text(outcome.error.message.as_ptr())
    );
    assert_eq!(host.logs.borrow().len(), 1);
}

#[test]
fn init_refuses_a_host_of_another_abi_major() {
    let plugin = LoadedPlugin::load(PLUGIN);
    let host = FakeHost::default();
    let table = host.table(
        guild_kernel_abi_make_version(2, 0, 0),
        size_of::<guild_host_api_v1_t>(),
    );

    let outcome = init_then_shutdown(&plugin, &table);

    assert_eq!(outcome.status, GUILD_STATUS_ERR_ABI_MISMATCH);
    assert_eq!(outcome.error.status, GUILD_STATUS_ERR_ABI_MISMATCH);
    assert_eq!(text(outcome.error.component.as_ptr()), "minimal_kernel");
    assert_eq!(
        text(outcome.error.message.as_ptr()),
        "host speaks another Kernel ABI major version"
    );
    assert!(
        host.logs.borrow().is_empty(),
        "a refused init must not use the host table"
    );
}

#[test]
fn init_refuses_a_host_table_shorter_than_the_v1_base() {
    let plugin = LoadedPlugin::load(PLUGIN);
    let host = FakeHost::default();
    let table = host.table(GUILD_KERNEL_ABI_VERSION, GUILD_HOST_API_V1_BASE_SIZE - 1);

    let outcome = init_then_shutdown(&plugin, &table);

    assert_eq!(outcome.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(
        text(outcome.error.message.as_ptr()),
        "host table is smaller than the Kernel ABI v1 base"
    );
    assert!(
        host.logs.borrow().is_empty(),
        "a refused init must not use the host table"
    );
}

#[test]
fn init_refuses_a_null_host_table() {
    let plugin = LoadedPlugin::load(PLUGIN);

    let outcome = init_then_shutdown(&plugin, std::ptr::null());

    assert_eq!(outcome.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(text(outcome.error.component.as_ptr()), "minimal_kernel");
    assert_eq!(
        text(outcome.error.message.as_ptr()),
        "init needs a host table and a plugin_state slot"
    );
}

/// What one init call produced.
struct InitOutcome {
    status: guild_status_t,
    plugin_state: *mut c_void,
    error: guild_error_info_t,
}

/// Calls the plugin's init with `host` (possibly NULL), then its shutdown with whatever state
/// init left, as the header requires of a host after a failed init too.
fn init_then_shutdown(plugin: &LoadedPlugin, host: *const guild_host_api_v1_t) -> InitOutcome {
    let descriptor = plugin.descriptor();
    let (Some(init), Some(shutdown)) = (descriptor.init, descriptor.shutdown) else {
        panic!("the descriptor lacks init or shutdown");
    };
    let mut plugin_state: *mut c_void = std::ptr::null_mut();
    let mut error = guild_error_info_t::new();
    // SAFETY: `host` is NULL or points at a table whose callbacks and context (a FakeHost the
    // caller keeps alive) stay valid for this call; `plugin_state` and `error` are live locals of
    // the types the header names; the library stays loaded while `plugin` is borrowed.
    let status = unsafe { init(host, &mut plugin_state, &mut error) };
    // SAFETY: shutdown takes the state init produced (NULL here, which it must accept), and is
    // called once, after init returned, on the same thread.
    unsafe { shutdown(plugin_state) };
    InitOutcome {
        status,
        plugin_state,
        error,
    }
}

/// A host that records what the plugin does through the host table during init.
#[derive(Default)]
struct FakeHost {
    kernels: Cell<usize>,
    runners: Cell<usize>,
    logs: RefCell<Vec<(u32, guild_status_t, String, String)>>,
}

impl FakeHost {
    /// A host table that claims `struct_size` bytes and routes every callback to `self`.
    fn table(&self, abi_version: u32, struct_size: usize) -> guild_host_api_v1_t {
        guild_host_api_v1_t {
            struct_size: u32::try_from(struct_size).unwrap_or(u32::MAX),
            abi_version,
            host_context: std::ptr::from_ref(self).cast_mut().cast(),
            register_kernel: Some(register_kernel),
            register_runner: Some(register_runner),
            log: Some(log),
            operations: std::ptr::null(),
        }
    }

    /// # Safety
    /// `context` must be the `host_context` of a table made by [`FakeHost::table`] whose host is
    /// still alive.
    unsafe fn from_context<'a>(context: *mut c_void) -> &'a FakeHost {
        // SAFETY: per this function's contract the pointer came from `&FakeHost` in `table` and
        // the host outlives the init call that hands it back; only shared access is taken.
        unsafe { &*context.cast_const().cast::<FakeHost>() }
    }
}

unsafe extern "C" fn register_kernel(
    context: *mut c_void,
    _desc: *const guild_kernel_op_desc_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    // SAFETY: the plugin passes back the host_context of the table it was given.
    let host = unsafe { FakeHost::from_context(context) };
    host.kernels.set(host.kernels.get() + 1);
    GUILD_STATUS_OK
}

unsafe extern "C" fn register_runner(
    context: *mut c_void,
    _desc: *const guild_runner_desc_v1_t,
    _error: *mut guild_error_info_t,
) -> guild_status_t {
    // SAFETY: the plugin passes back the host_context of the table it was given.
    let host = unsafe { FakeHost::from_context(context) };
    host.runners.set(host.runners.get() + 1);
    GUILD_STATUS_OK
}

unsafe extern "C" fn log(context: *mut c_void, level: u32, record: *const guild_error_info_t) {
    // SAFETY: the plugin passes back the host_context of the table it was given.
    let host = unsafe { FakeHost::from_context(context) };
    // A NULL record is recorded rather than asserted on: a panic cannot unwind out of an
    // `extern "C"` function, and the tests compare the log exactly, so it still fails them.
    let entry = if record.is_null() {
        (
            level,
            GUILD_STATUS_OK,
            String::new(),
            "NULL record".to_string(),
        )
    } else {
        // SAFETY: the header lends the record for the duration of this call; it is not NULL.
        let record = unsafe { &*record };
        (
            level,
            record.status,
            text(record.component.as_ptr()),
            text(record.message.as_ptr()),
        )
    };
    host.logs.borrow_mut().push(entry);
}

/// A NUL-terminated string from the plugin, as UTF-8 text.
fn text(ptr: *const c_char) -> String {
    assert!(!ptr.is_null(), "the plugin handed out a NULL string");
    // SAFETY: the pointer is non-NULL and, per the header, a NUL-terminated string that lives in
    // the plugin's static storage or in a record the caller holds for at least this call.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}
