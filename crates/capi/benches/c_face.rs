//! The cost of one execute through the C face (`libguild_host`'s operation service table, what a
//! C or C++ engine calls) against the Rust face (`OpHandle::execute`), on the same provider in
//! the same run: the scan module (test-plugins/scan_module, an inclusive scan over f32),
//! installed signed into one store and opened twice in this process, once through
//! `guild_host_open` and once as a Rust runner opens it; the library is the same file, so the
//! provider's code is the same.
//!
//! Criterion times both; the summary at the end times 200,000 calls of each, alternating five
//! rounds, and reports the best per-call time of each and their ratio (C / Rust). Nothing here
//! asserts a time. `cargo bench -p guild-host-capi --bench c_face`; with `-- --test` each path
//! runs once. Build the C plugins first: `cargo xtask plugins`.

use std::ffi::CString;
use std::hint::black_box;
use std::ptr;
use std::time::Instant;

use criterion::Criterion;
use guild_host::abi::*;
use guild_host::operations::{TensorArg, TensorArgMut};
use guild_host::{
    DType, DeviceSupport, Host, InstallOptions, MemorySpace, OpName, OperationRequest,
    OperationService, TensorDesc,
};
use guild_host_capi::ffi::*;
use guild_host_capi::guild_host_get_api;
use guild_test_support::plugins::{scan_spec, INCLUSIVE_OP};
use guild_test_support::{key, open_dir, trust, Workshop, PUBLISHER};

#[path = "../tests/common/records.rs"]
mod records;

const ELEMENTS: usize = 16;

/// One execute through the C table, as C calls it.
#[inline(never)]
fn c_execute(
    service: &guild_operation_service_v1_t,
    handle: *mut guild_op_handle_t,
    args: &guild_execute_args_v1_t,
    error: &mut guild_error_info_t,
) {
    // SAFETY: a live handle of the open host, arguments naming live buffers.
    let status = unsafe { (service.execute.unwrap())(service.user, handle, args, error) };
    assert_eq!(status, GUILD_STATUS_OK);
}

/// One execute through the Rust face.
#[inline(never)]
fn rust_execute(
    handle: &guild_host::OpHandle<'_>,
    desc: &TensorDesc,
    x: &[f32; ELEMENTS],
    out: &mut [f32; ELEMENTS],
) {
    handle
        .execute(
            &[TensorArg::new(desc, black_box(x))],
            &mut [TensorArgMut::new(desc, out)],
            None,
        )
        .expect("Rust execute");
}

fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let shop = Workshop::new();
    let store = shop.fresh("store");
    let k = key();
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    pm.install(
        &shop.build(&scan_spec("1.0.0"), &k).archive,
        InstallOptions::default(),
    )
    .unwrap();
    drop(pm);

    // The C face.
    // SAFETY: the version 1 table is static.
    let api = unsafe { &*guild_host_get_api(GUILD_HOST_CAPI_VERSION) };
    let path = CString::new(store.to_str().unwrap()).unwrap();
    let options = guild_host_open_options_v1_t {
        struct_size: size_of::<guild_host_open_options_v1_t>() as u32,
        flags: GUILD_HOST_OPEN_CPU_ONLY,
        store_dir: path.as_ptr(),
        lock_file: ptr::null(),
        log: None,
        log_user: ptr::null_mut(),
    };
    let mut c_host = ptr::null_mut();
    // SAFETY: valid options and out-pointers; errors are not asked for (an assert reports).
    let code = unsafe { (api.open)(&options, &mut c_host, ptr::null_mut(), ptr::null_mut()) };
    assert_eq!(code, GUILD_HOST_OK);
    // SAFETY: all-zero is a valid (empty) table for the library to fill.
    let mut service: guild_operation_service_v1_t = unsafe { std::mem::zeroed() };
    service.struct_size = size_of::<guild_operation_service_v1_t>() as u32;
    // SAFETY: a live host and a sized table.
    let code = unsafe { (api.operation_service)(c_host, &mut service, ptr::null_mut()) };
    assert_eq!(code, GUILD_HOST_OK);
    let op = CString::new(INCLUSIVE_OP).unwrap();
    let shape = records::vector(ELEMENTS as u64, ptr::null_mut());
    let query = records::query(op.as_ptr(), &shape, &shape);
    let mut error = guild_error_info_t::new();
    let mut c_handle = ptr::null_mut();
    // SAFETY: the host's table and a complete query.
    let status =
        unsafe { (service.resolve.unwrap())(service.user, &query, &mut c_handle, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK);

    // The Rust face, on the same store (the same library file, so the same provider code).
    let rust_host = Host::builder(&store)
        .devices(DeviceSupport::host())
        .open()
        .unwrap()
        .host;
    let rust_service = OperationService::new(rust_host.kernels());
    let desc = TensorDesc::new(DType::F32, &[ELEMENTS as u64], MemorySpace::Host);
    let rust_handle = rust_service
        .resolve(&OperationRequest::cpu(
            OpName::new(INCLUSIVE_OP).unwrap(),
            vec![desc],
            vec![desc],
        ))
        .unwrap();

    let x = [1.0f32; ELEMENTS];
    let mut c_out = [0.0f32; ELEMENTS];
    let mut rust_out = [0.0f32; ELEMENTS];
    let input = records::vector(ELEMENTS as u64, x.as_ptr().cast_mut());
    let output = records::vector(ELEMENTS as u64, c_out.as_mut_ptr());
    let args = records::execute_args(&input, &output);

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("execute_16_f32");
    group.bench_function("c_face", |b| {
        b.iter(|| c_execute(&service, c_handle, black_box(&args), &mut error))
    });
    group.bench_function("rust_face", |b| {
        b.iter(|| rust_execute(&rust_handle, &desc, &x, &mut rust_out))
    });
    group.finish();
    criterion.final_summary();
    assert_eq!(c_out[ELEMENTS - 1], ELEMENTS as f32);
    assert_eq!(rust_out[ELEMENTS - 1], ELEMENTS as f32);

    let testing = std::env::args().any(|a| a == "--test");
    let n = if testing { 10 } else { 200_000 };
    let (mut c_best, mut rust_best) = (f64::MAX, f64::MAX);
    for _ in 0..if testing { 1 } else { 5 } {
        c_best = c_best.min(per_call(n, || {
            c_execute(&service, c_handle, black_box(&args), &mut error)
        }));
        rust_best = rust_best.min(per_call(n, || {
            rust_execute(&rust_handle, &desc, &x, &mut rust_out)
        }));
    }
    println!(
        "execute of a 16-element f32 scan, best of 5 rounds of {n} calls: C face {c_best:.1} ns, \
         Rust face {rust_best:.1} ns, ratio C/Rust {:.2}",
        c_best / rust_best
    );

    drop(rust_handle);
    drop(rust_host);
    // SAFETY: the live handle, released once.
    let status = unsafe { (service.release.unwrap())(service.user, c_handle, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK);
    // SAFETY: the live host, no handles left.
    let code = unsafe { (api.close)(c_host, ptr::null_mut()) };
    assert_eq!(code, GUILD_HOST_OK);
}
