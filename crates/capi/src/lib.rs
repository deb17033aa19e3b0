//! `libguild_host`: the C embedding API of `guild-host`, for C and C++ engines that own their
//! process. The header is `abi-headers/include/guild/guild_host.h`; `cargo xtask capi` installs
//! the library, the header, a CMake package and a `guild-host.pc`.
//!
//! The API is one versioned table (`guild_host_get_api`), ONNX Runtime's shape: entries are only
//! appended, and the layout is checked against the C compiler by the tests. It adds what an
//! embedding process needs around the operation service table plugins already use
//! (`guild_operation_service_v1_t`, handed out as it is, so resolve, describe, scratch, execute,
//! reshape and release cost exactly what they cost a Rust runner calling that table): opening a
//! store as a runner, the version and currency of a handle, following the store, a log sink,
//! close, and owned error objects.
//!
//! Every entry runs behind `error::guarded`: a panic is caught and answered as
//! `GUILD_HOST_ERR_INTERNAL`; every pointer is checked before use, every record's `struct_size`
//! too, and out-parameters are written only on success. The `unsafe` here is the boundary
//! itself: reading what C passes and writing what it asked for, each block with its reason.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod error;
pub mod ffi;

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guild_host::abi::{
    guild_op_handle_t, guild_operation_service_v1_t, GUILD_OPERATION_SERVICE_V1_BASE_SIZE,
};
use guild_host::{DeviceSupport, Host, HostError, HostWatcher, LockFile, RefreshReport};

use error::{guarded, Failure, OutError};
pub use ffi::guild_host_error_s;
use ffi::*;

/// An opened host (`guild_host_t`): the host, its watcher, and the pollable state that refreshes
/// from either side update.
#[allow(non_camel_case_types)]
pub struct guild_host_s {
    host: Arc<Host>,
    watcher: Mutex<Option<HostWatcher>>,
    state: Arc<Followed>,
}

impl std::fmt::Debug for guild_host_s {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("guild_host_t").finish_non_exhaustive()
    }
}

/// What a poller reads (`guild_host_state_v1_t`), written by every refresh.
#[derive(Debug, Default)]
struct Followed {
    generation: AtomicU64,
    changes: AtomicU64,
    pending: AtomicU32,
}

impl Followed {
    fn record(&self, outcome: &Result<RefreshReport, HostError>) {
        match outcome {
            Ok(report) => {
                self.generation.store(report.generation, Ordering::Release);
                self.pending
                    .store(count(report.pending.len()), Ordering::Release);
                if !report.is_quiet() {
                    self.changes.fetch_add(1, Ordering::AcqRel);
                }
            }
            Err(_) => {
                self.changes.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

thread_local! {
    /// Set while this thread runs a watch callback, where waiting for the watcher would wait
    /// for itself.
    static IN_WATCH_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn in_watch_callback() -> bool {
    IN_WATCH_CALLBACK.with(std::cell::Cell::get)
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

static API_V1: guild_host_capi_v1_t = guild_host_capi_v1_t {
    struct_size: size_of::<guild_host_capi_v1_t>() as u32,
    version: GUILD_HOST_CAPI_VERSION,
    open: host_open,
    close: host_close,
    operation_service: host_operation_service,
    handle_info: host_handle_info,
    refresh: host_refresh,
    watch: host_watch,
    unwatch: host_unwatch,
    state: host_state,
    error_code: error::error_code,
    error_message: error::error_message,
    error_free: error::error_free,
};

/// The API table of `version`, or NULL when this library does not provide it.
#[no_mangle]
pub extern "C" fn guild_host_get_api(version: u32) -> *const guild_host_capi_v1_t {
    if version == GUILD_HOST_CAPI_VERSION {
        &API_V1
    } else {
        std::ptr::null()
    }
}

// ---------------------------------------------------------------------------------------------
// Checks of what C passes
// ---------------------------------------------------------------------------------------------

/// The caller's record behind `record`, once it is non-NULL, aligned and at least as large as
/// this version's.
///
/// # Safety
/// `record` must be NULL or point at a record, valid for reads and writes, whose first field is
/// a `uint32_t struct_size`.
unsafe fn record_mut<'a, T>(record: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    if record.is_null() || !record.is_aligned() {
        return Err(Failure::invalid(format!("{what} is NULL or misaligned")));
    }
    // SAFETY: non-NULL and aligned; by the contract its first field is the caller's size.
    let size = unsafe { record.cast::<u32>().read() };
    if usize::try_from(size).map_or(true, |s| s < size_of::<T>()) {
        return Err(Failure::invalid(format!(
            "{what}.struct_size is {size}, smaller than the {} bytes of this version",
            size_of::<T>()
        )));
    }
    // SAFETY: checked non-NULL and aligned, and the caller says it holds at least this version's
    // bytes, valid for writes, and no one else uses it during the call.
    Ok(unsafe { &mut *record })
}

/// The host behind a `guild_host_t*`.
///
/// # Safety
/// `host` must be NULL or a host `open` made and `close` has not freed.
unsafe fn host_ref<'a>(host: *mut guild_host_s, entry: &str) -> Result<&'a guild_host_s, Failure> {
    if host.is_null() || !host.is_aligned() {
        return Err(Failure::invalid(format!("{entry}: the host is NULL")));
    }
    // SAFETY: by the contract, a live host; `close` does not race other calls.
    Ok(unsafe { &*host })
}

/// A required C string as UTF-8 text.
///
/// # Safety
/// `text` must be NULL or a NUL-terminated string valid for the call.
unsafe fn text<'a>(text: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if text.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the contract.
    let bytes = unsafe { CStr::from_ptr(text) };
    bytes
        .to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

// ---------------------------------------------------------------------------------------------
// open and close
// ---------------------------------------------------------------------------------------------

/// The C log sink and its user, which the caller promises may be called from any thread.
#[derive(Clone, Copy)]
struct LogSink {
    log: unsafe extern "C" fn(*mut c_void, *const c_char, u32, *const c_char),
    user: *mut c_void,
}

// SAFETY: the header requires a sink that may be called from any thread, several at once, with
// its `log_user`; the library only passes the pointer back.
unsafe impl Send for LogSink {}
// SAFETY: as above.
unsafe impl Sync for LogSink {}

impl LogSink {
    fn send(&self, package: &str, level: u32, message: &str) {
        let package = CString::new(package.replace('\0', " ")).unwrap_or_default();
        let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the caller's sink, called as the header describes, with strings valid for the
        // call. It must not unwind (C has no unwinding; C++ must catch its own exceptions).
        unsafe { (self.log)(self.user, package.as_ptr(), level, message.as_ptr()) };
    }
}

unsafe extern "C" fn host_open(
    options: *const guild_host_open_options_v1_t,
    out_host: *mut *mut guild_host_s,
    out_report: *mut guild_host_open_report_v1_t,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("open", out_error, || {
        if options.is_null() || !options.is_aligned() {
            return Err(Failure::invalid("open: options is NULL or misaligned"));
        }
        // SAFETY: non-NULL and aligned; its first field is struct_size by the contract.
        let size = unsafe { options.cast::<u32>().read() };
        if (size as usize) < size_of::<guild_host_open_options_v1_t>() {
            return Err(Failure::invalid(format!(
                "open: options.struct_size is {size}, smaller than the {} bytes of this \
                     version (start from GUILD_HOST_OPEN_OPTIONS_V1_INIT)",
                size_of::<guild_host_open_options_v1_t>()
            )));
        }
        // SAFETY: checked non-NULL, aligned and as large as this version's options.
        let o = unsafe { *options };
        if out_host.is_null() || !out_host.is_aligned() {
            return Err(Failure::invalid("open: out_host is NULL or misaligned"));
        }
        if !out_report.is_null() {
            // SAFETY: the caller's record, checked inside.
            unsafe { record_mut(out_report, "open: out_report") }?;
        }
        if o.flags & !GUILD_HOST_OPEN_KNOWN != 0 {
            return Err(Failure::invalid(format!(
                "open: options.flags has unknown bits {:#x}",
                o.flags & !GUILD_HOST_OPEN_KNOWN
            )));
        }
        // SAFETY: the options' strings are NULL or NUL-terminated, by the contract.
        let store = PathBuf::from(unsafe { text(o.store_dir, "open: options.store_dir") }?);
        let lock = if o.lock_file.is_null() {
            None
        } else {
            // SAFETY: as for store_dir.
            Some(read_lock(unsafe {
                text(o.lock_file, "open: options.lock_file")
            }?)?)
        };
        let mut builder = Host::builder(&store);
        if o.flags & GUILD_HOST_OPEN_CPU_ONLY != 0 {
            builder = builder.devices(DeviceSupport::host());
        }
        if let Some(lock) = lock {
            builder = builder.lock(lock);
        }
        if let Some(log) = o.log {
            let sink = LogSink {
                log,
                user: o.log_user,
            };
            builder = builder.plugin_log(move |package, record| {
                sink.send(package.as_str(), record.level, &record.message);
            });
        }
        let opened = builder
            .open()
            .map_err(|e| Failure::host(&format!("open {}", store.display()), &e))?;
        let generation = opened.host.packages().generation().unwrap_or(0);
        let loaded = &opened.report.loaded;
        let report = guild_host_open_report_v1_t {
            struct_size: size_of::<guild_host_open_report_v1_t>() as u32,
            loaded: count(loaded.loaded.len()),
            failed: count(loaded.failed.len()),
            skipped: count(loaded.skipped.len()),
            refused_by_lock: count(loaded.refused_by_lock.len()),
            quarantined: count(opened.report.quarantined.len()),
            generation,
        };
        let state = Arc::new(Followed::default());
        state.generation.store(generation, Ordering::Release);
        let host = Box::new(guild_host_s {
            host: Arc::new(opened.host),
            watcher: Mutex::new(None),
            state,
        });
        if !out_report.is_null() {
            // SAFETY: checked above (non-NULL, aligned, large enough).
            unsafe { out_report.write(report) };
        }
        // SAFETY: checked non-NULL and aligned above; valid for a write by the contract.
        unsafe { out_host.write(Box::into_raw(host)) };
        Ok(())
    })
}

fn read_lock(path: &str) -> Result<LockFile, Failure> {
    let bytes = std::fs::read(path).map_err(|e| {
        Failure::new(
            GUILD_HOST_ERR_LOCK_FILE,
            format!("open: lock file {path} cannot be read: {e}"),
        )
    })?;
    LockFile::parse(&bytes).map_err(|e| {
        Failure::new(
            GUILD_HOST_ERR_LOCK_FILE,
            format!("open: {path} is not a lock file: {e}"),
        )
    })
}

unsafe extern "C" fn host_close(
    host: *mut guild_host_s,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    if host.is_null() {
        return GUILD_HOST_OK;
    }
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("close", out_error, || {
        // SAFETY: the API's contract: NULL or a live host.
        let h = unsafe { host_ref(host, "close") }?;
        if in_watch_callback() {
            return Err(Failure::new(
                GUILD_HOST_ERR_BUSY,
                "close: refused from inside a watch callback (the watcher would wait for \
                     itself); close from another thread",
            ));
        }
        let live = h.host.kernels().live_runner_c_handles();
        if live > 0 {
            return Err(Failure::new(
                GUILD_HOST_ERR_BUSY,
                format!(
                    "close: refused while {live} operation handle(s) are live; release \
                         them first (nothing was closed)"
                ),
            ));
        }
        // SAFETY: a live host (checked above) that this call now owns: the contract forbids
        // any other call on it from now on.
        let owned = unsafe { Box::from_raw(host) };
        // The watcher first, so that no refresh runs while the host goes.
        drop(
            owned
                .watcher
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        drop(owned);
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// The operation service and handles
// ---------------------------------------------------------------------------------------------

unsafe extern "C" fn host_operation_service(
    host: *mut guild_host_s,
    out_service: *mut guild_operation_service_v1_t,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("operation_service", out_error, || {
        // SAFETY: the API's contract: NULL or a live host.
        let h = unsafe { host_ref(host, "operation_service") }?;
        if out_service.is_null() || !out_service.is_aligned() {
            return Err(Failure::invalid(
                "operation_service: out_service is NULL or misaligned",
            ));
        }
        // SAFETY: non-NULL and aligned; its first field is struct_size by the contract.
        let size = unsafe { out_service.cast::<u32>().read() } as usize;
        if size < GUILD_OPERATION_SERVICE_V1_BASE_SIZE {
            return Err(Failure::invalid(format!(
                "operation_service: out_service.struct_size is {size}, smaller than the \
                     {GUILD_OPERATION_SERVICE_V1_BASE_SIZE} bytes of the first version"
            )));
        }
        // A caller built against an older header gets the prefix its table has room for,
        // and the size of what it got.
        let table = *h.host.kernels().operation_api();
        let copied = size.min(size_of::<guild_operation_service_v1_t>());
        // SAFETY: the caller's table holds `size` bytes and `copied` is at most that and at
        // most ours; then its struct_size says how much it got.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const table).cast::<u8>(),
                out_service.cast::<u8>(),
                copied,
            );
            (*out_service).struct_size = copied as u32;
        }
        Ok(())
    })
}

/// Copies `text` into a fixed C buffer with its NUL; `None` when it does not fit.
fn fill(buffer: &mut [c_char], text: &str) -> Option<()> {
    let bytes = text.as_bytes();
    if bytes.len() >= buffer.len() || bytes.contains(&0) {
        return None;
    }
    for (slot, &b) in buffer.iter_mut().zip(bytes) {
        *slot = b as c_char;
    }
    buffer[bytes.len()] = 0;
    Some(())
}

unsafe extern "C" fn host_handle_info(
    host: *mut guild_host_s,
    handle: *mut guild_op_handle_t,
    out_info: *mut guild_host_handle_info_v1_t,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("handle_info", out_error, || {
        // SAFETY: the API's contract: NULL or a live host, NULL or the caller's record.
        let (h, out) = unsafe {
            (
                host_ref(host, "handle_info")?,
                record_mut(out_info, "handle_info: out_info")?,
            )
        };
        let provider = h.host.kernels().c_handle_provider(handle).ok_or_else(|| {
            Failure::new(
                GUILD_HOST_ERR_NOT_FOUND,
                "handle_info: the handle is not a live operation handle of this host \
                     (NULL, released, or resolved through another host's service)",
            )
        })?;
        let mut info = guild_host_handle_info_v1_t {
            struct_size: out.struct_size,
            is_current: u32::from(provider.is_current),
            package_id: [0; GUILD_HOST_ID_CAPACITY],
            package_version: [0; GUILD_HOST_VERSION_CAPACITY],
        };
        let version = provider.version.to_string();
        fill(&mut info.package_id, provider.package.as_str())
            .zip(fill(&mut info.package_version, &version))
            .ok_or_else(|| {
                Failure::new(
                    GUILD_HOST_ERR_HOST,
                    format!(
                        "handle_info: {}@{version} is longer than the record holds",
                        provider.package
                    ),
                )
            })?;
        *out = info;
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Following the store
// ---------------------------------------------------------------------------------------------

fn refresh_record(report: &RefreshReport) -> guild_host_refresh_v1_t {
    guild_host_refresh_v1_t {
        struct_size: size_of::<guild_host_refresh_v1_t>() as u32,
        loaded: count(report.loaded.len()),
        from_generation: report.from_generation,
        generation: report.generation,
        taken_out: count(report.taken_out.len()),
        deferred: count(report.deferred.len()),
        revoked_live: count(report.revoked_live.len()),
        failed: count(report.failed.len()),
        pending: count(report.pending.len()),
        reserved: 0,
    }
}

unsafe extern "C" fn host_refresh(
    host: *mut guild_host_s,
    out_report: *mut guild_host_refresh_v1_t,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("refresh", out_error, || {
        // SAFETY: the API's contract: NULL or a live host.
        let h = unsafe { host_ref(host, "refresh") }?;
        let out = if out_report.is_null() {
            None
        } else {
            // SAFETY: the caller's record, checked inside.
            Some(unsafe { record_mut(out_report, "refresh: out_report") }?)
        };
        let outcome = h.host.refresh();
        h.state.record(&outcome);
        let report = outcome.map_err(|e| Failure::host("refresh", &e))?;
        if let Some(out) = out {
            *out = refresh_record(&report);
        }
        Ok(())
    })
}

/// The C watch callback and its user, which the caller promises may be called on the watcher's
/// thread.
#[derive(Clone, Copy)]
struct WatchSink {
    on_change: guild_host_watch_fn,
    user: *mut c_void,
}

// SAFETY: the header says the callback runs on the watcher's thread with `user`; the library
// only passes the pointer back.
unsafe impl Send for WatchSink {}

impl WatchSink {
    fn call(&self, outcome: &Result<RefreshReport, HostError>) {
        let Some(on_change) = self.on_change else {
            return;
        };
        IN_WATCH_CALLBACK.with(|c| c.set(true));
        match outcome {
            Ok(report) => {
                let record = refresh_record(report);
                // SAFETY: the caller's callback, with a record valid for the call.
                unsafe { on_change(self.user, &record, std::ptr::null()) };
            }
            Err(e) => {
                let failure = Failure::host("refresh", e);
                let error = guild_host_error_s::new(failure.code, &failure.message);
                // SAFETY: the caller's callback, with an error borrowed for the call.
                unsafe { on_change(self.user, std::ptr::null(), &error) };
            }
        }
        IN_WATCH_CALLBACK.with(|c| c.set(false));
    }
}

unsafe extern "C" fn host_watch(
    host: *mut guild_host_s,
    fallback_ms: u32,
    on_change: guild_host_watch_fn,
    user: *mut c_void,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("watch", out_error, || {
        // SAFETY: the API's contract: NULL or a live host.
        let h = unsafe { host_ref(host, "watch") }?;
        if in_watch_callback() {
            return Err(Failure::new(
                GUILD_HOST_ERR_BUSY,
                "watch: refused from inside a watch callback",
            ));
        }
        let fallback = Duration::from_millis(match fallback_ms {
            0 => 60_000,
            ms => u64::from(ms),
        });
        let sink = WatchSink { on_change, user };
        let state = Arc::clone(&h.state);
        let mut slot = h.watcher.lock().unwrap_or_else(|e| e.into_inner());
        // The old watcher stops before the new one starts, so callbacks never overlap.
        drop(slot.take());
        let watcher = h
            .host
            .watch(fallback, move |outcome| {
                state.record(outcome);
                sink.call(outcome);
            })
            .map_err(|e| Failure::host("watch", &e))?;
        *slot = Some(watcher);
        Ok(())
    })
}

unsafe extern "C" fn host_unwatch(
    host: *mut guild_host_s,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("unwatch", out_error, || {
        // SAFETY: the API's contract: NULL or a live host.
        let h = unsafe { host_ref(host, "unwatch") }?;
        if in_watch_callback() {
            return Err(Failure::new(
                GUILD_HOST_ERR_BUSY,
                "unwatch: refused from inside a watch callback (the watcher would wait \
                     for itself)",
            ));
        }
        let watcher = h.watcher.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(watcher);
        Ok(())
    })
}

unsafe extern "C" fn host_state(
    host: *mut guild_host_s,
    out_state: *mut guild_host_state_v1_t,
    out_error: *mut *mut guild_host_error_s,
) -> guild_host_code_t {
    // SAFETY: the API's contract: `out_error` is NULL or valid for one write.
    let out_error = unsafe { OutError::new(out_error) };
    guarded("state", out_error, || {
        // SAFETY: the API's contract: NULL or a live host, NULL or the caller's record.
        let (h, out) = unsafe {
            (
                host_ref(host, "state")?,
                record_mut(out_state, "state: out_state")?,
            )
        };
        *out = guild_host_state_v1_t {
            struct_size: out.struct_size,
            pending: h.state.pending.load(Ordering::Acquire),
            generation: h.state.generation.load(Ordering::Acquire),
            changes: h.state.changes.load(Ordering::Acquire),
            live_handles: h.host.kernels().live_runner_c_handles() as u64,
        };
        Ok(())
    })
}
