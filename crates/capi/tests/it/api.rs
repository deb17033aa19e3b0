//! The table, called from Rust exactly as C calls it: arguments checked and out-parameters left
//! alone on failure, the store path that is not a store, the operation service handed out as
//! it is (with the package version in its description), a handle's version and currency, refresh,
//! revocation, watch and the pollable state, and close with handles outstanding.

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use guild_host::abi::text::fixed_buffer_text;
use guild_host::abi::*;
use guild_host::{Host, HostError};
use guild_host_capi::ffi::*;
use guild_host_capi::guild_host_get_api;

use crate::fixture::{api, c_path, close, open, options, outcome, text, Failed, ScanStore};
use crate::records;

const OP: &CStr = c"example.sequence.inclusive_scan";

/// The service a host hands out, with the calls the tests make.
struct Service(guild_operation_service_v1_t);

impl Service {
    fn of(host: *mut guild_host_t) -> Self {
        // SAFETY: all-zero is a valid table (NULL entries); the library fills it.
        let mut table: guild_operation_service_v1_t = unsafe { std::mem::zeroed() };
        table.struct_size = size_of::<guild_operation_service_v1_t>() as u32;
        let mut error = ptr::null_mut();
        // SAFETY: a live host, a sized table.
        let code = unsafe { (api().operation_service)(host, &mut table, &mut error) };
        outcome(code, error).unwrap();
        Service(table)
    }

    fn resolve(&self, n: u64) -> Result<*mut guild_op_handle_t, String> {
        let shape = records::vector(n, ptr::null_mut());
        let query = records::query(OP.as_ptr(), &shape, &shape);
        let mut handle = ptr::null_mut();
        let mut error = guild_error_info_t::new();
        // SAFETY: the host's table and a complete query.
        let status =
            unsafe { (self.0.resolve.unwrap())(self.0.user, &query, &mut handle, &mut error) };
        if status == GUILD_STATUS_OK {
            Ok(handle)
        } else {
            Err(fixed_buffer_text(&error.message))
        }
    }

    fn execute(
        &self,
        handle: *mut guild_op_handle_t,
        input: &mut [f32],
    ) -> Result<Vec<f32>, String> {
        let mut output = vec![0f32; input.len()];
        let n = input.len() as u64;
        let (i, o) = (
            records::vector(n, input.as_mut_ptr()),
            records::vector(n, output.as_mut_ptr()),
        );
        let args = records::execute_args(&i, &o);
        let mut error = guild_error_info_t::new();
        // SAFETY: a live handle and tensors that outlive the call.
        let status = unsafe { (self.0.execute.unwrap())(self.0.user, handle, &args, &mut error) };
        if status == GUILD_STATUS_OK {
            Ok(output)
        } else {
            Err(fixed_buffer_text(&error.message))
        }
    }

    fn reshape(&self, handle: *mut guild_op_handle_t, n: u64) {
        let shape = records::vector(n, ptr::null_mut());
        let args = guild_reshape_args_v1_t {
            struct_size: size_of::<guild_reshape_args_v1_t>() as u32,
            reserved: 0,
            inputs: &shape,
            input_count: 1,
            outputs: &shape,
            output_count: 1,
            params: ptr::null(),
            params_size: 0,
        };
        let mut error = guild_error_info_t::new();
        // SAFETY: a live handle, complete args.
        let status = unsafe { (self.0.reshape.unwrap())(self.0.user, handle, &args, &mut error) };
        assert_eq!(
            status,
            GUILD_STATUS_OK,
            "{}",
            fixed_buffer_text(&error.message)
        );
    }

    /// The description, with the record `size` the caller claims.
    fn describe(&self, handle: *mut guild_op_handle_t, size: usize) -> guild_op_description_v1_t {
        // SAFETY: all-zero is a valid description (NULL pointers).
        let mut d: guild_op_description_v1_t = unsafe { std::mem::zeroed() };
        d.struct_size = size as u32;
        let mut error = guild_error_info_t::new();
        // SAFETY: a live handle and a record at least as large as claimed.
        let status = unsafe { (self.0.describe.unwrap())(self.0.user, handle, &mut d, &mut error) };
        assert_eq!(
            status,
            GUILD_STATUS_OK,
            "{}",
            fixed_buffer_text(&error.message)
        );
        d
    }

    fn release(&self, handle: *mut guild_op_handle_t) {
        let mut error = guild_error_info_t::new();
        // SAFETY: a live handle no other call uses.
        let status = unsafe { (self.0.release.unwrap())(self.0.user, handle, &mut error) };
        assert_eq!(
            status,
            GUILD_STATUS_OK,
            "{}",
            fixed_buffer_text(&error.message)
        );
    }
}

fn info(
    host: *mut guild_host_t,
    handle: *mut guild_op_handle_t,
) -> Result<(String, String, bool), Failed> {
    let mut out = guild_host_handle_info_v1_t {
        struct_size: size_of::<guild_host_handle_info_v1_t>() as u32,
        is_current: 7,
        package_id: [0; GUILD_HOST_ID_CAPACITY],
        package_version: [0; GUILD_HOST_VERSION_CAPACITY],
    };
    let mut error = ptr::null_mut();
    // SAFETY: a live host and a sized record.
    let code = unsafe { (api().handle_info)(host, handle, &mut out, &mut error) };
    outcome(code, error)?;
    Ok((
        text(&out.package_id),
        text(&out.package_version),
        out.is_current == 1,
    ))
}

fn refresh(host: *mut guild_host_t) -> guild_host_refresh_v1_t {
    let mut out = guild_host_refresh_v1_t {
        struct_size: size_of::<guild_host_refresh_v1_t>() as u32,
        ..Default::default()
    };
    let mut error = ptr::null_mut();
    // SAFETY: a live host and a sized record.
    let code = unsafe { (api().refresh)(host, &mut out, &mut error) };
    outcome(code, error).unwrap();
    out
}

fn state(host: *mut guild_host_t) -> guild_host_state_v1_t {
    let mut out = guild_host_state_v1_t {
        struct_size: size_of::<guild_host_state_v1_t>() as u32,
        ..Default::default()
    };
    let mut error = ptr::null_mut();
    // SAFETY: a live host and a sized record.
    let code = unsafe { (api().state)(host, &mut out, &mut error) };
    outcome(code, error).unwrap();
    out
}

#[test]
fn the_getter_hands_out_version_1_only() {
    let table = api();
    assert_eq!(
        table.struct_size as usize,
        size_of::<guild_host_capi_v1_t>()
    );
    assert_eq!(table.version, GUILD_HOST_CAPI_VERSION);
    assert!(guild_host_get_api(0).is_null());
    assert!(guild_host_get_api(2).is_null());
    assert_eq!(guild_host_get_api(1), table as *const _);
}

/// The defect: a runner given a mistyped store path created an empty store there and failed
/// later, as "no implementation is registered". Now the open fails, naming the path, and
/// nothing is created; out_host keeps what the caller put there.
#[test]
fn a_path_that_is_not_a_store_is_refused_naming_it_and_nothing_is_created() {
    let s = ScanStore::new("1.0.0");
    let missing = s.shop.fresh("mistyped-store");
    let file = s.shop.fresh("a-file");
    std::fs::write(&file, b"not a store").unwrap();
    let empty = s.shop.fresh("empty-dir");
    std::fs::create_dir(&empty).unwrap();
    for (path, says) in [
        (&missing, "no such directory"),
        (&file, "not a directory"),
        (&empty, "no store registry"),
    ] {
        let c = c_path(path);
        let o = options(&c);
        let sentinel = 0x5a5a_usize as *mut guild_host_t;
        let mut host = sentinel;
        let mut error = ptr::null_mut();
        // SAFETY: valid options and out-pointers.
        let code = unsafe { (api().open)(&o, &mut host, ptr::null_mut(), &mut error) };
        let failed = outcome(code, error).unwrap_err();
        assert_eq!(
            failed.code, GUILD_HOST_ERR_NOT_A_STORE,
            "{}",
            failed.message
        );
        assert!(
            failed.message.contains(path.to_str().unwrap()) && failed.message.contains(says),
            "{}",
            failed.message
        );
        assert_eq!(host, sentinel, "a failed open leaves out_host alone");
    }
    assert!(
        !missing.exists(),
        "the runner created {}",
        missing.display()
    );
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "the runner wrote into the empty directory"
    );
    // The Rust face refuses the same way, by default.
    match Host::builder(&missing).open() {
        Err(HostError::NotAStore { path, .. }) => assert_eq!(path, missing),
        other => panic!("opened {other:?}"),
    }
    assert!(!missing.exists());
}

#[test]
fn bad_arguments_are_refused_in_words_and_touch_nothing() {
    let s = ScanStore::new("1.0.0");
    let path = c_path(s.path());
    let api = api();
    let try_open = |o: *const guild_host_open_options_v1_t, out: *mut *mut guild_host_t| {
        let mut error = ptr::null_mut();
        // SAFETY: deliberately broken arguments the library must detect.
        let code = unsafe { (api.open)(o, out, ptr::null_mut(), &mut error) };
        outcome(code, error).unwrap_err()
    };
    let mut host = ptr::null_mut();
    let f = try_open(ptr::null(), &mut host);
    assert_eq!(f.code, GUILD_HOST_ERR_INVALID_ARGUMENT);
    assert!(f.message.contains("options is NULL"), "{}", f.message);
    let mut small = options(&path);
    small.struct_size = 8;
    let f = try_open(&small, &mut host);
    assert!(f.message.contains("struct_size is 8"), "{}", f.message);
    let mut no_dir = options(&path);
    no_dir.store_dir = ptr::null();
    let f = try_open(&no_dir, &mut host);
    assert!(f.message.contains("store_dir is NULL"), "{}", f.message);
    let mut flags = options(&path);
    flags.flags = 0x80;
    let f = try_open(&flags, &mut host);
    assert!(f.message.contains("unknown bits 0x80"), "{}", f.message);
    let f = try_open(&options(&path), ptr::null_mut());
    assert!(f.message.contains("out_host is NULL"), "{}", f.message);
    let bad_lock = s.shop.fresh("lock.json");
    std::fs::write(&bad_lock, b"{}").unwrap();
    let lock = c_path(&bad_lock);
    let mut locked = options(&path);
    locked.lock_file = lock.as_ptr();
    let f = try_open(&locked, &mut host);
    assert_eq!(f.code, GUILD_HOST_ERR_LOCK_FILE, "{}", f.message);
    assert!(host.is_null());

    // A NULL out_error is allowed: the code alone comes back.
    // SAFETY: NULL options, NULL error slot.
    let code = unsafe { (api.open)(ptr::null(), &mut host, ptr::null_mut(), ptr::null_mut()) };
    assert_eq!(code, GUILD_HOST_ERR_INVALID_ARGUMENT);

    let (host, _) = open(s.path()).unwrap();
    // Records too small for this version, NULL records and handles.
    let mut st = guild_host_state_v1_t {
        struct_size: 4,
        pending: 9,
        ..Default::default()
    };
    let mut error = ptr::null_mut();
    // SAFETY: a live host and a record whose size is deliberately short.
    let code = unsafe { (api.state)(host, &mut st, &mut error) };
    let f = outcome(code, error).unwrap_err();
    assert!(
        f.message.contains("out_state.struct_size is 4"),
        "{}",
        f.message
    );
    assert_eq!(st.pending, 9, "a refused call writes nothing");
    let f = info(host, ptr::null_mut()).unwrap_err();
    assert_eq!(f.code, GUILD_HOST_ERR_NOT_FOUND, "{}", f.message);
    let f = info(host, 0x1234 as *mut guild_op_handle_t).unwrap_err();
    assert_eq!(f.code, GUILD_HOST_ERR_NOT_FOUND, "{}", f.message);
    let mut error = ptr::null_mut();
    // SAFETY: NULL host.
    let code = unsafe { (api.refresh)(ptr::null_mut(), ptr::null_mut(), &mut error) };
    assert!(outcome(code, error)
        .unwrap_err()
        .message
        .contains("the host is NULL"));
    // SAFETY: NULL is a no-op.
    let code = unsafe { (api.close)(ptr::null_mut(), ptr::null_mut()) };
    assert_eq!(code, GUILD_HOST_OK);
    // SAFETY: NULL errors are answered, not read.
    unsafe {
        assert_eq!((api.error_code)(ptr::null()), GUILD_HOST_OK);
        assert_eq!(
            CStr::from_ptr((api.error_message)(ptr::null())).to_bytes(),
            b""
        );
        (api.error_free)(ptr::null_mut());
    }
    close(host).unwrap();
}

#[test]
fn the_handed_out_service_resolves_executes_and_reshapes_and_names_the_version() {
    let s = ScanStore::new("1.2.0");
    let (host, report) = open(s.path()).unwrap();
    assert_eq!(report.loaded, 1, "{report:?}");
    assert!(report.generation > 0);
    let service = Service::of(host);
    let handle = service.resolve(4).unwrap();
    let d = service.describe(handle, size_of::<guild_op_description_v1_t>());
    // SAFETY: strings the handle keeps until release.
    let (package, version) = unsafe {
        (
            CStr::from_ptr(d.package_id).to_str().unwrap(),
            CStr::from_ptr(d.package_version).to_str().unwrap(),
        )
    };
    assert_eq!((package, version), ("example.scan", "1.2.0"));
    // A caller built against SDK 1.5 passes the record without the version: it is not written.
    let old = service.describe(handle, GUILD_OP_DESCRIPTION_V1_BASE_SIZE);
    assert!(old.package_version.is_null());
    assert_eq!(
        info(host, handle).unwrap(),
        ("example.scan".into(), "1.2.0".into(), true)
    );
    assert_eq!(
        service.execute(handle, &mut [1.0, 2.0, 3.0, 4.0]).unwrap(),
        [1.0, 3.0, 6.0, 10.0]
    );
    service.reshape(handle, 6);
    assert_eq!(
        service.execute(handle, &mut [1.0; 6]).unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(state(host).live_handles, 1);
    service.release(handle);
    close(host).unwrap();
}

/// The defect: a C caller's error text carried Rust's `Debug` output of the descriptors
/// (`TensorDesc { dtype: DType(f32), rank: 1, dims: [16, 0, ...] }`). It now says what was
/// expected in words.
#[test]
fn an_execute_with_other_shapes_is_refused_in_plain_words() {
    let s = ScanStore::new("1.0.0");
    let (host, _) = open(s.path()).unwrap();
    let service = Service::of(host);
    let handle = service.resolve(16).unwrap();
    let message = service.execute(handle, &mut [0.0; 8]).unwrap_err();
    assert!(
        message
            .contains("expected f32 [16] packed in host memory, got f32 [8] packed in host memory"),
        "{message}"
    );
    for rust in ["TensorDesc", "DType(", "dims:", "Some("] {
        assert!(!message.contains(rust), "{message}");
    }
    service.release(handle);
    close(host).unwrap();
}

#[test]
fn close_with_a_live_handle_is_refused_and_changes_nothing() {
    let s = ScanStore::new("1.0.0");
    let (host, _) = open(s.path()).unwrap();
    let service = Service::of(host);
    let handle = service.resolve(4).unwrap();
    let f = close(host).unwrap_err();
    assert_eq!(f.code, GUILD_HOST_ERR_BUSY);
    assert!(
        f.message.contains("1 operation handle(s) are live"),
        "{}",
        f.message
    );
    // Still fully usable.
    assert_eq!(
        service.execute(handle, &mut [1.0; 4]).unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
    service.release(handle);
    close(host).unwrap();
    // A copy of the table kept past close answers ERR_STATE rather than touching freed memory.
    let message = service.resolve(4).unwrap_err();
    assert!(message.contains("destroyed"), "{message}");
}

#[test]
fn a_refresh_follows_an_install_and_a_revocation_while_handles_say_they_are_stale() {
    let s = ScanStore::new("1.0.0");
    let (host, _) = open(s.path()).unwrap();
    let service = Service::of(host);
    let old = service.resolve(4).unwrap();
    assert!(refresh(host).pending == 0);

    s.install("1.1.0");
    let r = refresh(host);
    assert!(r.generation > r.from_generation, "{r:?}");
    assert_eq!(
        (r.deferred, r.pending),
        (1, 1),
        "the live handle holds 1.0.0: {r:?}"
    );
    assert_eq!(
        info(host, old).unwrap(),
        ("example.scan".into(), "1.0.0".into(), false)
    );
    // The old handle keeps running the version it resolved.
    assert_eq!(
        service.execute(old, &mut [1.0; 4]).unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
    service.release(old);
    let r = refresh(host);
    assert_eq!((r.loaded, r.pending), (1, 0), "{r:?}");
    let new = service.resolve(4).unwrap();
    assert_eq!(
        info(host, new).unwrap(),
        ("example.scan".into(), "1.1.0".into(), true)
    );

    s.revoke("1.1.0");
    let r = refresh(host);
    assert_eq!(r.revoked_live, 1, "{r:?}");
    assert!(
        !info(host, new).unwrap().2,
        "a revoked version's handle is not current"
    );
    let message = service.resolve(4).unwrap_err();
    assert!(
        message.contains("example.sequence.inclusive_scan"),
        "{message}"
    );
    service.release(new);
    close(host).unwrap();
}

static WATCH_CALLS: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" fn on_change(
    user: *mut c_void,
    report: *const guild_host_refresh_v1_t,
    _error: *const guild_host_error_t,
) {
    if !report.is_null() {
        WATCH_CALLS.fetch_add(1, Ordering::SeqCst);
    }
    // From inside the callback, close and unwatch are refused rather than waiting for
    // themselves.
    let host = user.cast::<guild_host_t>();
    let mut error = ptr::null_mut();
    // SAFETY: the host outlives its watcher.
    let code = unsafe { (api().unwatch)(host, &mut error) };
    assert_eq!(outcome(code, error).unwrap_err().code, GUILD_HOST_ERR_BUSY);
}

#[test]
fn a_watcher_calls_back_and_the_state_counts_the_change() {
    let s = ScanStore::new("1.0.0");
    let (host, _) = open(s.path()).unwrap();
    let before = state(host);
    let mut error = ptr::null_mut();
    // SAFETY: a live host; the callback's user is the host, which outlives the watcher.
    let code = unsafe { (api().watch)(host, 200, Some(on_change), host.cast(), &mut error) };
    outcome(code, error).unwrap();
    s.install("1.1.0");
    let start = Instant::now();
    while state(host).changes == before.changes || WATCH_CALLS.load(Ordering::SeqCst) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no change seen: {:?}",
            state(host)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = state(host);
    assert!(after.generation > before.generation, "{after:?}");
    let service = Service::of(host);
    let handle = service.resolve(4).unwrap();
    assert_eq!(info(host, handle).unwrap().1, "1.1.0");
    service.release(handle);
    // Closing with a watcher running stops it first.
    close(host).unwrap();
}

static LOGGED: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" fn log_sink(
    user: *mut c_void,
    package: *const std::ffi::c_char,
    _level: u32,
    message: *const std::ffi::c_char,
) {
    assert_eq!(user as usize, 0x10c);
    // SAFETY: strings valid for the call.
    let (package, message) = unsafe { (CStr::from_ptr(package), CStr::from_ptr(message)) };
    assert!(!package.to_bytes().is_empty() && !message.to_bytes().is_empty());
    LOGGED.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn plugin_records_reach_the_log_sink_and_a_lock_file_limits_what_loads() {
    let s = ScanStore::new("1.0.0");
    // The minimal kernel writes a debug record from its init.
    let mut minimal =
        guild_test_support::plugins::plugin_module("test.minimal", "minimal_kernel", &[]);
    minimal.kind = guild_host::domain::ids::PackageKind::Kernel;
    s.install_spec(&minimal);
    let path = c_path(s.path());
    let open_with = |o: &guild_host_open_options_v1_t| {
        let mut host = ptr::null_mut();
        let mut report = guild_host_open_report_v1_t {
            struct_size: size_of::<guild_host_open_report_v1_t>() as u32,
            ..Default::default()
        };
        let mut error = ptr::null_mut();
        // SAFETY: valid options and out-pointers.
        let code = unsafe { (api().open)(o, &mut host, &mut report, &mut error) };
        outcome(code, error).unwrap();
        (host, report)
    };
    let mut o = options(&path);
    o.log = Some(log_sink);
    o.log_user = 0x10c as *mut c_void;
    let (host, report) = open_with(&o);
    assert_eq!(report.loaded, 2, "{report:?}");
    assert!(
        LOGGED.load(Ordering::SeqCst) > 0,
        "the minimal kernel's record was not passed on"
    );
    close(host).unwrap();

    let lock_path = s.shop.fresh("empty.lock");
    std::fs::write(&lock_path, guild_host::LockFile::new([]).unwrap().to_json()).unwrap();
    let lock = c_path(&lock_path);
    o.lock_file = lock.as_ptr();
    let (host, report) = open_with(&o);
    assert_eq!(
        (report.loaded, report.refused_by_lock),
        (0, 2),
        "{report:?}"
    );
    close(host).unwrap();
}
