//! The operation service's costs over a real module (test-plugins/op_many: 64 GOP1 candidates of
//! `example.bench.tiny`, y[i] = x[i] + 1 over f32), installed as a signed gkmodule and loaded
//! with dlopen, all measured in one run:
//! - execute overhead on a one-element tensor: the provider's own `execute` pointer called
//!   directly, `execute` through the C service table, and `OpHandle::execute` (Rust face), with
//!   the same arguments and a caller-owned error record (the Rust face's `TensorArg`s are made
//!   anew for every call, as a runner whose buffers change makes them);
//! - resolve among 64 candidates through the C service: (a) every candidate accepts and the best
//!   is taken after one validate, (b) every candidate passes the static checks but all except the
//!   lowest-ranked refuse in validate (driven by the query's params), so all 64 validate
//!   callbacks run; and release on its own;
//! - execute throughput on independent handles, one per thread, on 1 and 2 threads, through
//!   the C service and through the Rust face (handles side by side in one `Vec`);
//! - reshape of one handle between one and two elements (C table and Rust face) against the
//!   provider's `validate` + `query_scratch` called directly on the same shapes;
//! - a decode loop: a sequence growing from 1 to 4096 elements with one execute per step, the
//!   handle reshaped every step against resolved anew (and released) every step.
//!
//! With `GUILD_BENCH_CALLS=n` the benchmark instead runs each execute path, the reshape and the
//! callback pair `n` times in its own never-inlined function (`calls_direct`, `calls_c_service`,
//! `calls_rust`, `calls_reshape`, `calls_callbacks`) and exits, for instruction counts:
//! `GUILD_BENCH_CALLS=10000 valgrind --tool=callgrind <bench binary> --bench`, then
//! `callgrind_annotate --inclusive=yes` and divide each function's count by `n`.
//!
//! The summary at the end is computed from the samples criterion took in this run (the median
//! per-iteration time, as criterion reports it), with the heap allocations each execute path
//! makes, counted by the benchmark's own global allocator over 1000 calls. `cargo bench --bench operations` runs the full
//! measurement; with `-- --test` (or under `cargo test --benches`) each benchmark runs once.
//! Build the C plugins first: `cargo xtask plugins`.

#[path = "common/mod.rs"]
mod common;

use std::ffi::{c_void, CString};
use std::ptr;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion};
use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_op_description_v1_t, guild_op_handle_t,
    guild_operation_query_v1_t, guild_operation_service_v1_t, guild_reshape_args_v1_t,
    guild_scratch_request_v1_t, guild_tensor_desc_v1_t, GUILD_BACKEND_CPU, GUILD_BUDGET_UNLIMITED,
    GUILD_DTYPE_F32, GUILD_MEMORY_HOST, GUILD_OPERATION_QUERY_VERSION, GUILD_STATUS_OK,
    GUILD_SYNC_HOST_BLOCKING,
};
use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::OpName;
use guild_domain::operation::{DType, MemorySpace, TensorDesc};
use guild_host::operations::{TensorArg, TensorArgMut};
use guild_host::{Host, InstallOptions, OperationRequest, OperationService};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

use common::{allocations_per_call, median, message, recorded, show, Samples};

const OP: &str = "example.bench.tiny";
const CANDIDATES: usize = 64;
/// Elements of the tiny operation's input and output.
const ELEMENTS: usize = 1;
/// Handles resolved per timed batch in the resolve and release benchmarks.
const BATCH: u64 = 256;
/// The decode loop's last sequence length.
const STEPS: u64 = 4096;

fn impl_id(i: usize) -> String {
    format!("example.many.c{i:02}.cpu")
}

/// A host over a fresh store with op_many installed, signed and loaded by dlopen.
fn fixture(shop: &Workshop) -> Host {
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).expect("open store");
    trust(&pm, PUBLISHER, &k);
    let host = Host::new(pm, Box::new(DlopenLoader::new()));
    let mut spec = Spec::module("example.many", "1.0.0").library(&plugin_library("op_many"));
    spec.provided_ops = (0..CANDIDATES).map(impl_id).collect();
    host.install(&shop.build(&spec, &k).archive, InstallOptions::default())
        .expect("install op_many");
    host
}

/// The operation's parameter record (`many_params_t` in op_many.c): only the `accepting`
/// lowest-ranked candidates accept in validate.
#[repr(C)]
struct ManyParams {
    struct_size: u32,
    accepting: u32,
}

fn c_tensor(data: *const f32) -> guild_tensor_desc_v1_t {
    c_tensor_n(ELEMENTS as u64, data)
}

/// The tiny operation's tensor over `n` elements at `data`.
fn c_tensor_n(n: u64, data: *const f32) -> guild_tensor_desc_v1_t {
    let mut dims = [0; 8];
    dims[0] = n;
    guild_tensor_desc_v1_t {
        dtype: GUILD_DTYPE_F32,
        rank: 1,
        dims,
        strides: [0; 8],
        memory_space: GUILD_MEMORY_HOST,
        device_id: 0,
        data: data.cast_mut().cast(),
    }
}

/// The C query for the tiny operation over the tensors in `io`, with optional params.
fn c_query(
    op: &CString,
    io: &[guild_tensor_desc_v1_t; 2],
    params: Option<&ManyParams>,
) -> guild_operation_query_v1_t {
    guild_operation_query_v1_t {
        struct_size: size_of::<guild_operation_query_v1_t>() as u32,
        version: GUILD_OPERATION_QUERY_VERSION,
        op_name: op.as_ptr(),
        min_op_version: 0x0100_0000,
        max_op_version: 0x01ff_ffff,
        backends: GUILD_BACKEND_CPU,
        sync_mode: GUILD_SYNC_HOST_BLOCKING,
        required_capabilities: 0,
        required_numerics: 0,
        inputs: &io[0],
        input_count: 1,
        outputs: &io[1],
        output_count: 1,
        ram_budget: GUILD_BUDGET_UNLIMITED,
        vram_budget: GUILD_BUDGET_UNLIMITED,
        exact_impl_id: ptr::null(),
        device_caps: ptr::null(),
        params: params.map_or(ptr::null(), |p| ptr::from_ref(p).cast()),
        params_size: params.map_or(0, size_of_val),
    }
}

fn c_args(io: &[guild_tensor_desc_v1_t; 2]) -> guild_execute_args_v1_t {
    guild_execute_args_v1_t {
        struct_size: size_of::<guild_execute_args_v1_t>() as u32,
        reserved: 0,
        inputs: &io[0],
        input_count: 1,
        outputs: &io[1],
        output_count: 1,
        scratch_host: ptr::null_mut(),
        scratch_host_size: 0,
        scratch_device: ptr::null_mut(),
        scratch_device_size: 0,
        stream: ptr::null_mut(),
        device_id: 0,
        sync_mode: GUILD_SYNC_HOST_BLOCKING,
        params: ptr::null(),
        params_size: 0,
    }
}

/// A C handle, movable to another thread (the service allows calls from any thread).
#[derive(Clone, Copy)]
struct Raw(*mut guild_op_handle_t);
// SAFETY: a handle is an opaque token the service accepts from any thread; each thread here
// uses its own handle, and release happens after the threads are joined.
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}

/// The registry's C service table, as a C runner copies it.
#[derive(Clone, Copy)]
struct Service(guild_operation_service_v1_t);
// SAFETY: the table's `user` is the registry's service core, which is Sync; its function
// pointers may be called from any thread while the registry lives (the bench keeps the host
// alive until every handle is released).
unsafe impl Send for Service {}
// SAFETY: as above.
unsafe impl Sync for Service {}

impl Service {
    fn resolve(&self, query: &guild_operation_query_v1_t, error: &mut guild_error_info_t) -> Raw {
        let mut out = ptr::null_mut();
        // SAFETY: the query and its tensors and params are live for the call; `out` and
        // `error` are live records.
        let status = unsafe { self.0.resolve.unwrap()(self.0.user, query, &mut out, error) };
        assert_eq!(status, GUILD_STATUS_OK, "resolve: {}", message(error));
        Raw(out)
    }

    fn execute(
        &self,
        h: Raw,
        args: &guild_execute_args_v1_t,
        error: &mut guild_error_info_t,
    ) -> i32 {
        // SAFETY: a live handle of this service; the args' tensors point at live buffers of
        // the resolved shape.
        unsafe { self.0.execute.unwrap()(self.0.user, h.0, args, error) }
    }

    fn reshape(&self, h: Raw, io: &[guild_tensor_desc_v1_t; 2], error: &mut guild_error_info_t) {
        let args = guild_reshape_args_v1_t {
            struct_size: size_of::<guild_reshape_args_v1_t>() as u32,
            reserved: 0,
            inputs: &io[0],
            input_count: 1,
            outputs: &io[1],
            output_count: 1,
            params: ptr::null(),
            params_size: 0,
        };
        // SAFETY: a live handle of this service that no other call is using; `args` and its
        // tensors are live for the call.
        let status = unsafe { self.0.reshape.unwrap()(self.0.user, h.0, &args, error) };
        assert_eq!(status, GUILD_STATUS_OK, "reshape: {}", message(error));
    }

    /// Executes on the tensors in `io` (no scratch, stream or params), which must succeed.
    fn execute_ok(&self, h: Raw, io: &[guild_tensor_desc_v1_t; 2], error: &mut guild_error_info_t) {
        let status = self.execute(h, &c_args(io), error);
        assert_eq!(status, GUILD_STATUS_OK, "execute: {}", message(error));
    }

    fn release(&self, h: Raw, error: &mut guild_error_info_t) {
        // SAFETY: a live handle of this service that no other call is using.
        let status = unsafe { self.0.release.unwrap()(self.0.user, h.0, error) };
        assert_eq!(status, GUILD_STATUS_OK, "release: {}", message(error));
    }

    fn describe(&self, h: Raw) -> guild_op_description_v1_t {
        let mut error = guild_error_info_t::new();
        // SAFETY: a zeroed description is a valid bit pattern (NULL pointers, zero numbers).
        let mut d: guild_op_description_v1_t = unsafe { std::mem::zeroed() };
        d.struct_size = size_of::<guild_op_description_v1_t>() as u32;
        // SAFETY: a live handle of this service; `d` and `error` are live records.
        let status = unsafe { self.0.describe.unwrap()(self.0.user, h.0, &mut d, &mut error) };
        assert_eq!(status, GUILD_STATUS_OK, "describe: {}", message(&error));
        d
    }

    /// The impl id a handle resolved to.
    fn chosen(&self, h: Raw) -> String {
        // SAFETY: describe's strings are borrowed from the live handle.
        unsafe { std::ffi::CStr::from_ptr(self.describe(h).impl_id) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Runs `work` on one thread per handle, all started together, and answers the slowest
/// thread's own measurement.
fn slowest_thread<H: Sync>(handles: &[H], work: impl Fn(&H) -> Duration + Sync) -> Duration {
    let start = Barrier::new(handles.len());
    std::thread::scope(|s| {
        let workers: Vec<_> = handles
            .iter()
            .map(|h| {
                let (start, work) = (&start, &work);
                s.spawn(move || {
                    start.wait();
                    work(h)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .max()
            .unwrap_or_default()
    })
}

type DirectExecute = unsafe extern "C" fn(
    *mut c_void,
    *const guild_execute_args_v1_t,
    *mut guild_error_info_t,
) -> i32;

/// `n` direct calls of the provider's execute (callgrind's baseline).
#[inline(never)]
fn calls_direct(
    n: u64,
    direct: DirectExecute,
    user_data: *mut c_void,
    args: &guild_execute_args_v1_t,
    error: &mut guild_error_info_t,
) {
    for _ in 0..n {
        // SAFETY: the provider's own pointer and user_data with args the service accepted for
        // it; its library stays loaded while the caller's handle lives.
        let status = unsafe { direct(black_box(user_data), black_box(args), error) };
        assert_eq!(status, GUILD_STATUS_OK);
    }
}

/// The tiny operation's tensors over one and over two elements, without data (what a reshape
/// and a negotiation see).
fn two_shapes() -> [[guild_tensor_desc_v1_t; 2]; 2] {
    [1, 2].map(|n| [c_tensor_n(n, ptr::null()), c_tensor_n(n, ptr::null())])
}

/// The provider's own negotiation callbacks, called directly (the baseline of a reshape).
struct Callbacks {
    validate: unsafe extern "C" fn(
        *mut c_void,
        *const guild_operation_query_v1_t,
        *mut guild_error_info_t,
    ) -> i32,
    query_scratch: unsafe extern "C" fn(
        *mut c_void,
        *const guild_operation_query_v1_t,
        *mut guild_scratch_request_v1_t,
        *mut guild_error_info_t,
    ) -> i32,
    user_data: *mut c_void,
}

impl Callbacks {
    /// validate then query_scratch on `query`, as a reshape calls them.
    #[inline(always)]
    fn negotiate(&self, query: &guild_operation_query_v1_t, error: &mut guild_error_info_t) {
        let mut scratch = guild_scratch_request_v1_t {
            struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
            alignment: 0,
            host_bytes: 0,
            device_bytes: 0,
        };
        // SAFETY: the provider's own callbacks and user_data, its library loaded while the
        // bench's handles live; the query and records are live for the calls.
        let ok = unsafe {
            (self.validate)(black_box(self.user_data), black_box(query), error) == GUILD_STATUS_OK
                && (self.query_scratch)(self.user_data, query, &mut scratch, error)
                    == GUILD_STATUS_OK
        };
        assert!(ok, "negotiation failed: {}", message(error));
    }
}

/// `n` validate + query_scratch pairs, alternating between the two queries.
#[inline(never)]
fn calls_callbacks(
    n: u64,
    callbacks: &Callbacks,
    queries: &[guild_operation_query_v1_t; 2],
    error: &mut guild_error_info_t,
) {
    for i in 0..n {
        callbacks.negotiate(&queries[(i & 1) as usize], error);
    }
}

/// `n` reshapes through the C service table, alternating between the two shapes.
#[inline(never)]
fn calls_reshape(
    n: u64,
    service: &Service,
    handle: Raw,
    shapes: &[[guild_tensor_desc_v1_t; 2]; 2],
    error: &mut guild_error_info_t,
) {
    for i in 0..n {
        service.reshape(handle, black_box(&shapes[(i & 1) as usize]), error);
    }
}

/// `n` reshapes through the Rust face, alternating between one and two elements.
#[inline(never)]
fn calls_rust_reshape(n: u64, handle: &mut guild_host::operations::OpHandle<'_>) {
    let descs = [1u64, 2].map(|n| TensorDesc::new(DType::F32, &[n], MemorySpace::Host));
    for i in 0..n {
        let d = descs[(i & 1) as usize];
        handle.reshape(&[black_box(d)], &[d]).expect("Rust reshape");
    }
}

/// `n` rounds of what the cheapest exclusive handle costs: one uncontended compare-and-swap
/// taking a word and one store giving it back (the gate's own pair).
#[inline(never)]
fn calls_locked(n: u64, word: &std::sync::atomic::AtomicU64) {
    use std::sync::atomic::Ordering;
    for _ in 0..n {
        let w = black_box(word);
        let taken = w.compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire);
        w.store(0, Ordering::Release);
        assert!(taken.is_ok());
    }
}

/// `n` executes through the C service table.
#[inline(never)]
fn calls_c_service(
    n: u64,
    service: &Service,
    handle: Raw,
    args: &guild_execute_args_v1_t,
    error: &mut guild_error_info_t,
) {
    for _ in 0..n {
        assert_eq!(
            service.execute(black_box(handle), black_box(args), error),
            GUILD_STATUS_OK
        );
    }
}

/// `n` executes through the Rust face.
#[inline(never)]
fn calls_rust(
    n: u64,
    handle: &guild_host::operations::OpHandle<'_>,
    desc: TensorDesc,
    x: &[f32; ELEMENTS],
    out: &mut [f32; ELEMENTS],
) {
    for _ in 0..n {
        handle
            .execute(
                &[TensorArg::new(&desc, black_box(x))],
                &mut [TensorArgMut::new(&desc, out)],
                None,
            )
            .expect("Rust execute");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let samples = if full { 30 } else { 10 };
    let mut c = Criterion::default()
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(if full { 1000 } else { 100 }))
        .measurement_time(Duration::from_secs(if full { 4 } else { 1 }))
        .configure_from_args();

    let shop = Workshop::new();
    let host = fixture(&shop);
    let service = Service(*host.kernels().operation_api());
    let op = CString::new(OP).unwrap();
    let x = [41.0f32; ELEMENTS];
    let mut y = [0.0f32; ELEMENTS];
    let io = [c_tensor(x.as_ptr()), c_tensor(y.as_mut_ptr())];
    let all_accept = c_query(&op, &io, None);
    let last_only = ManyParams {
        struct_size: size_of::<ManyParams>() as u32,
        accepting: 1,
    };
    let one_accepts = c_query(&op, &io, Some(&last_only));
    let args = c_args(&io);
    let mut error = guild_error_info_t::new();

    // The scenarios are what they claim: (a) takes the best candidate; in (b) all 63 better
    // ones refused in validate (the Rust face's handle lists why each was passed over).
    let h = service.resolve(&all_accept, &mut error);
    assert_eq!(service.chosen(h), impl_id(CANDIDATES - 1));
    service.release(h, &mut error);
    let h = service.resolve(&one_accepts, &mut error);
    assert_eq!(service.chosen(h), impl_id(0));
    service.release(h, &mut error);
    let desc = TensorDesc::new(DType::F32, &[ELEMENTS as u64], MemorySpace::Host);
    let request = OperationRequest::cpu(OpName::new(OP).unwrap(), vec![desc], vec![desc]);
    let rust = OperationService::new(host.kernels());
    // The same record as bytes, for the Rust face.
    let param_bytes = [last_only.struct_size, last_only.accepting]
        .map(u32::to_ne_bytes)
        .concat();
    let refused = rust
        .reporting()
        .resolve_with_params(&request, &param_bytes)
        .expect("resolve through the Rust face")
        .passed_over()
        .expect("a reporting service keeps the report")
        .iter()
        .filter(|p| {
            p.to_string()
                .contains("params ask this candidate to refuse")
        })
        .count();
    assert_eq!(
        refused,
        CANDIDATES - 1,
        "every better candidate ran validate"
    );

    // Execute overhead: the same args and error record on the same provider (c63).
    let handle = service.resolve(&all_accept, &mut error);
    let description = service.describe(handle);
    // SAFETY: describe's `operation` is the host's copy of the provider's GOP1 extension,
    // valid while the handle lives.
    let gop = unsafe { &*description.operation };
    let direct = gop.execute.expect("the provider's execute");
    let user_data: *mut c_void = gop.user_data;
    let callbacks = Callbacks {
        validate: gop.validate.expect("the provider's validate"),
        query_scratch: gop.query_scratch.expect("the provider's query_scratch"),
        user_data,
    };
    let rust_handle = rust
        .resolve(&request)
        .expect("resolve through the Rust face");
    assert_eq!(
        rust_handle.describe().impl_id.as_str(),
        impl_id(CANDIDATES - 1)
    );

    // Instruction counts: with GUILD_BENCH_CALLS=n, each execute path runs n times in its own
    // never-inlined function and the benchmark exits, so that callgrind's inclusive count of
    // `calls_direct`, `calls_c_service` and `calls_rust` divided by n is the instructions per
    // call (see docs/benchmarks in the module docs).
    if let Some(n) = std::env::var("GUILD_BENCH_CALLS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
    {
        let mut out = [0.0f32; ELEMENTS];
        // Warm every path once (lazy binding, first-touch) before the counted calls.
        calls_direct(1, direct, user_data, &args, &mut error);
        calls_c_service(1, &service, handle, &args, &mut error);
        calls_rust(1, &rust_handle, desc, &x, &mut out);
        calls_direct(n, direct, user_data, &args, &mut error);
        calls_c_service(n, &service, handle, &args, &mut error);
        calls_rust(n, &rust_handle, desc, &x, &mut out);
        // Reshape between one and two elements, against the provider's two callbacks on the
        // same shapes.
        let shapes = two_shapes();
        let queries = shapes.each_ref().map(|io| c_query(&op, io, None));
        let reshaping = service.resolve(&all_accept, &mut error);
        calls_callbacks(1, &callbacks, &queries, &mut error);
        calls_reshape(1, &service, reshaping, &shapes, &mut error);
        calls_callbacks(n, &callbacks, &queries, &mut error);
        calls_reshape(n, &service, reshaping, &shapes, &mut error);
        service.release(reshaping, &mut error);
        let mut rust_reshaping = rust
            .resolve(&request)
            .expect("resolve through the Rust face");
        calls_rust_reshape(1, &mut rust_reshaping);
        calls_rust_reshape(n, &mut rust_reshaping);
        let word = std::sync::atomic::AtomicU64::new(0);
        calls_locked(1, &word);
        calls_locked(n, &word);
        println!("ran {n} calls of each execute path, {n} reshapes and {n} callback pairs");
        drop(rust_handle);
        service.release(handle, &mut error);
        return;
    }

    let locked_t = Samples::default();
    let direct_t = Samples::default();
    let c_service_t = Samples::default();
    let rust_t = Samples::default();
    let mut g = c.benchmark_group("execute_tiny");
    g.bench_function("direct provider execute", |b| {
        recorded(b, &direct_t, |iters| {
            let mut ok = true;
            let start = Instant::now();
            for _ in 0..iters {
                // SAFETY: the provider's own pointer and user_data, with args the service
                // accepted for this provider; its library stays loaded while `handle` lives.
                ok &= unsafe { direct(black_box(user_data), black_box(&args), &mut error) }
                    == GUILD_STATUS_OK;
            }
            let elapsed = start.elapsed();
            assert!(ok, "direct execute failed: {}", message(&error));
            elapsed
        })
    });
    let word = std::sync::atomic::AtomicU64::new(0);
    g.bench_function("one compare-and-swap and a store, alone", |b| {
        recorded(b, &locked_t, |iters| {
            let start = Instant::now();
            calls_locked(iters, &word);
            start.elapsed()
        })
    });
    g.bench_function("C service execute", |b| {
        recorded(b, &c_service_t, |iters| {
            let mut ok = true;
            let start = Instant::now();
            for _ in 0..iters {
                ok &= service.execute(black_box(handle), black_box(&args), &mut error)
                    == GUILD_STATUS_OK;
            }
            let elapsed = start.elapsed();
            assert!(ok, "C service execute failed: {}", message(&error));
            elapsed
        })
    });
    let mut out = [0.0f32; ELEMENTS];
    g.bench_function("Rust OpHandle::execute", |b| {
        recorded(b, &rust_t, |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                rust_handle
                    .execute(
                        &[TensorArg::new(&desc, black_box(&x))],
                        &mut [TensorArgMut::new(&desc, &mut out)],
                        None,
                    )
                    .expect("Rust execute");
            }
            let elapsed = start.elapsed();
            assert_eq!(out[0], x[0] + 1.0);
            elapsed
        })
    });
    g.finish();
    let c_allocs = allocations_per_call(|| {
        assert_eq!(service.execute(handle, &args, &mut error), GUILD_STATUS_OK);
    });
    let rust_allocs = allocations_per_call(|| {
        rust_handle
            .execute(
                &[TensorArg::new(&desc, &x)],
                &mut [TensorArgMut::new(&desc, &mut out)],
                None,
            )
            .expect("Rust execute");
    });
    drop(rust_handle);
    service.release(handle, &mut error);

    // Resolve among 64 candidates, in batches so that release is not timed with it; release
    // on its own, with resolve untimed.
    let resolve_a = Samples::default();
    let resolve_b = Samples::default();
    let release_t = Samples::default();
    let mut held = Vec::with_capacity(BATCH as usize);
    let mut g = c.benchmark_group("resolve_64_candidates");
    for (name, query, samples) in [
        ("(a) all accept, best taken", &all_accept, &resolve_a),
        ("(b) 63 refuse in validate", &one_accepts, &resolve_b),
    ] {
        g.bench_function(name, |b| {
            recorded(b, samples, |iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BATCH);
                    left -= n;
                    let start = Instant::now();
                    for _ in 0..n {
                        held.push(service.resolve(black_box(query), &mut error));
                    }
                    total += start.elapsed();
                    for h in held.drain(..) {
                        service.release(h, &mut error);
                    }
                }
                total
            })
        });
    }
    g.bench_function("release", |b| {
        recorded(b, &release_t, |iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(BATCH);
                left -= n;
                held.extend((0..n).map(|_| service.resolve(&all_accept, &mut error)));
                let start = Instant::now();
                for h in held.drain(..) {
                    service.release(black_box(h), &mut error);
                }
                total += start.elapsed();
            }
            total
        })
    });
    g.finish();

    // Throughput: each thread executes on its own handle; a sample is the slowest thread's
    // time for `iters` executes, so the per-iteration figure is the time per execute on each
    // thread.
    let threads_t = [Samples::default(), Samples::default()];
    let mut g = c.benchmark_group("execute_throughput");
    for (threads, samples) in [1usize, 2].into_iter().zip(&threads_t) {
        let handles: Vec<Raw> = (0..threads)
            .map(|_| service.resolve(&all_accept, &mut error))
            .collect();
        g.bench_function(format!("{threads} thread(s), own handle each"), |b| {
            recorded(b, samples, |iters| {
                slowest_thread(&handles, |&h| {
                    let x = [1.0f32; ELEMENTS];
                    let mut y = [0.0f32; ELEMENTS];
                    let io = [c_tensor(x.as_ptr()), c_tensor(y.as_mut_ptr())];
                    let args = c_args(&io);
                    let mut error = guild_error_info_t::new();
                    let mut ok = true;
                    let begin = Instant::now();
                    for _ in 0..iters {
                        ok &= service.execute(h, black_box(&args), &mut error) == GUILD_STATUS_OK;
                    }
                    let elapsed = begin.elapsed();
                    assert!(ok, "execute failed: {}", message(&error));
                    elapsed
                })
            })
        });
        for h in handles {
            service.release(h, &mut error);
        }
    }
    // The Rust face, its handles side by side in one Vec (as a runner keeps them).
    let rust_threads_t = [Samples::default(), Samples::default()];
    for (threads, samples) in [1usize, 2].into_iter().zip(&rust_threads_t) {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                rust.resolve(&request)
                    .expect("resolve through the Rust face")
            })
            .collect();
        g.bench_function(
            format!("Rust face, {threads} thread(s), own handle each"),
            |b| {
                recorded(b, samples, |iters| {
                    slowest_thread(&handles, |h| {
                        let x = [1.0f32; ELEMENTS];
                        let mut y = [0.0f32; ELEMENTS];
                        let begin = Instant::now();
                        for _ in 0..iters {
                            h.execute(
                                &[TensorArg::new(&desc, black_box(&x))],
                                &mut [TensorArgMut::new(&desc, &mut y)],
                                None,
                            )
                            .expect("Rust execute");
                        }
                        begin.elapsed()
                    })
                })
            },
        );
    }
    g.finish();

    // Reshape: one handle between one and two elements, through the C table and the Rust
    // face, against the provider's validate + query_scratch called directly on the same shapes.
    let shapes = two_shapes();
    let queries = shapes.each_ref().map(|io| c_query(&op, io, None));
    let descs = [1u64, 2].map(|n| TensorDesc::new(DType::F32, &[n], MemorySpace::Host));
    let reshaping = service.resolve(&all_accept, &mut error);
    let mut rust_reshaping = rust
        .resolve(&request)
        .expect("resolve through the Rust face");
    let callbacks_t = Samples::default();
    let reshape_c_t = Samples::default();
    let reshape_rust_t = Samples::default();
    let mut g = c.benchmark_group("reshape");
    g.bench_function("provider's validate + query_scratch, direct", |b| {
        recorded(b, &callbacks_t, |iters| {
            let start = Instant::now();
            for i in 0..iters {
                callbacks.negotiate(&queries[(i & 1) as usize], &mut error);
            }
            start.elapsed()
        })
    });
    g.bench_function("C service reshape", |b| {
        recorded(b, &reshape_c_t, |iters| {
            let start = Instant::now();
            for i in 0..iters {
                service.reshape(reshaping, black_box(&shapes[(i & 1) as usize]), &mut error);
            }
            start.elapsed()
        })
    });
    g.bench_function("Rust OpHandle::reshape", |b| {
        recorded(b, &reshape_rust_t, |iters| {
            let start = Instant::now();
            for i in 0..iters {
                let d = descs[(i & 1) as usize];
                rust_reshaping
                    .reshape(&[black_box(d)], &[d])
                    .expect("Rust reshape");
            }
            start.elapsed()
        })
    });
    g.finish();
    // Heap allocations per reshape in the steady state: each handle's first reshape (which
    // makes the buffers the later ones reuse) runs before counting, whatever criterion ran.
    for io in &shapes {
        service.reshape(reshaping, io, &mut error);
    }
    let mut flip = 0usize;
    let reshape_allocs = allocations_per_call(|| {
        flip ^= 1;
        service.reshape(reshaping, &shapes[flip], &mut error);
    });
    for d in descs {
        rust_reshaping.reshape(&[d], &[d]).expect("Rust reshape");
    }
    let rust_reshape_allocs = allocations_per_call(|| {
        flip ^= 1;
        let d = descs[flip];
        rust_reshaping.reshape(&[d], &[d]).expect("Rust reshape");
    });
    service.release(reshaping, &mut error);
    drop(rust_reshaping);

    // A decode loop: one sequence grows from 1 to STEPS elements, one execute per step; the
    // handle either reshaped every step or resolved anew (and released) every step. Only the
    // change of shapes is timed (the executes, the same in both, run untimed between).
    let xs = vec![1.0f32; STEPS as usize];
    let mut ys = vec![0.0f32; STEPS as usize];
    let (xp, yp) = (xs.as_ptr(), ys.as_mut_ptr().cast_const());
    let step_io = |n: u64| [c_tensor_n(n, xp), c_tensor_n(n, yp)];
    let first = step_io(1);
    let decode_reshape_t = Samples::default();
    let decode_resolve_t = Samples::default();
    let mut g = c.benchmark_group(format!("decode_loop_1_to_{STEPS}"));
    g.sample_size(10);
    g.bench_function("reshape every step (C service)", |b| {
        recorded(b, &decode_reshape_t, |iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let h = service.resolve(&c_query(&op, &first, None), &mut error);
                timed += start.elapsed();
                for n in 1..=STEPS {
                    let io = step_io(n);
                    if n > 1 {
                        let start = Instant::now();
                        service.reshape(h, black_box(&io), &mut error);
                        timed += start.elapsed();
                    }
                    service.execute_ok(h, &io, &mut error);
                }
                let start = Instant::now();
                service.release(h, &mut error);
                timed += start.elapsed();
            }
            timed
        })
    });
    g.bench_function("resolve every step (C service)", |b| {
        recorded(b, &decode_resolve_t, |iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                for n in 1..=STEPS {
                    let io = step_io(n);
                    let start = Instant::now();
                    let h = service.resolve(black_box(&c_query(&op, &io, None)), &mut error);
                    timed += start.elapsed();
                    service.execute_ok(h, &io, &mut error);
                    let start = Instant::now();
                    service.release(h, &mut error);
                    timed += start.elapsed();
                }
            }
            timed
        })
    });
    g.finish();
    // Unless a criterion filter left the decode loop out, its last step ran over the whole
    // sequence.
    if !(decode_reshape_t.borrow().is_empty() && decode_resolve_t.borrow().is_empty()) {
        assert_eq!(
            ys[STEPS as usize - 1],
            2.0,
            "the last step ran over the whole sequence"
        );
    }

    let m = |s: &Samples| median(s, samples);
    let (direct_ns, c_ns, rust_ns) = (m(&direct_t), m(&c_service_t), m(&rust_t));
    // Whether a median meets its goal, as "; goal under X: met" (nothing in test mode).
    let goal = |ns: Option<f64>, limit: f64| match ns {
        Some(ns) if full => {
            let verdict = if ns < limit { "met" } else { "missed" };
            format!("; goal under {}: {verdict}", show(Some(limit)))
        }
        _ => String::new(),
    };
    let over = |face: Option<f64>| match (face, direct_ns) {
        (Some(f), Some(d)) => format!("{:+.1} ns over direct ({:.2}x)", f - d, f / d),
        _ => String::new(),
    };
    if full {
        println!(
            "\noperation service: medians of the {samples} samples each benchmark took in this \
             run (timings on a shared machine are noisy)"
        );
    } else {
        println!("\noperation service: test mode, one run each; the figures are not measurements");
    }
    println!("execute, tiny op ({ELEMENTS} f32 element), same args and error record:");
    println!(
        "  {:<34}{:>12}  (the floor of one exclusive call: the gate's locked pair)",
        "compare-and-swap + store, alone",
        show(m(&locked_t))
    );
    println!(
        "  {:<34}{:>12}",
        "provider's execute, direct",
        show(direct_ns)
    );
    println!(
        "  {:<34}{:>12}  {}{}; {c_allocs} allocations per call",
        "C service execute",
        show(c_ns),
        over(c_ns),
        goal(c_ns.zip(direct_ns).map(|(c, d)| c - d), 15.0)
    );
    println!(
        "  {:<34}{:>12}  {}{}; {rust_allocs} allocations per call",
        "Rust OpHandle::execute",
        show(rust_ns),
        over(rust_ns),
        goal(rust_ns.zip(direct_ns).map(|(r, d)| r - d), 20.0)
    );
    println!("resolve among {CANDIDATES} candidates through the C service:");
    let (ra, rb) = (m(&resolve_a), m(&resolve_b));
    println!(
        "  {:<34}{:>12}{}",
        "(a) all accept, 1 validate",
        show(ra),
        goal(ra, 20e3).replacen(";", " ", 1)
    );
    println!(
        "  {:<34}{:>12}  {}",
        "(b) 63 refuse, 64 validates",
        show(rb),
        match (ra, rb) {
            (Some(a), Some(b)) => format!(
                "{:.2}x (a), {:.0} ns per extra validate{}",
                b / a,
                (b - a) / (CANDIDATES - 1) as f64,
                goal(rb, 20e3)
            ),
            _ => String::new(),
        }
    );
    println!("  {:<34}{:>12}", "release", show(m(&release_t)));
    println!(
        "reshape between 1 and 2 elements ({reshape_allocs} allocations per C reshape, \
         {rust_reshape_allocs} per Rust reshape):"
    );
    let callbacks_ns = m(&callbacks_t);
    println!(
        "  {:<34}{:>12}",
        "validate + query_scratch, direct",
        show(callbacks_ns)
    );
    for (name, t) in [
        ("C service reshape", &reshape_c_t),
        ("Rust OpHandle::reshape", &reshape_rust_t),
    ] {
        let ns = m(t);
        println!(
            "  {name:<34}{:>12}  {}{}",
            show(ns),
            match (ns, callbacks_ns) {
                (Some(r), Some(cb)) => format!("{:+.1} ns over the callbacks", r - cb),
                _ => String::new(),
            },
            goal(ns.zip(callbacks_ns).map(|(r, cb)| r - cb), 100.0)
        );
    }
    // G28's goal for reshape: under 100 ns over the provider's two callbacks (the lines above),
    // and no allocation once the handle has been reshaped (counted, so judged in test mode too).
    println!(
        "  goal, 0 allocations per reshape: C {reshape_allocs}, Rust {rust_reshape_allocs} ({})",
        if reshape_allocs == 0.0 && rust_reshape_allocs == 0.0 {
            "met"
        } else {
            "missed"
        }
    );
    // Decode-loop samples are per whole loop (one iteration is STEPS steps).
    let (dr, dn) = (median(&decode_reshape_t, 10), median(&decode_resolve_t, 10));
    println!(
        "decode loop, sequence 1 to {STEPS}, one execute per step (untimed), the change of \
         shapes timed (C service, {CANDIDATES} candidates):"
    );
    for (name, total) in [("reshape every step", dr), ("resolve every step", dn)] {
        println!(
            "  {name:<34}{:>12} total{:>12} per step",
            show(total),
            show(total.map(|t| t / STEPS as f64))
        );
    }
    if let (Some(r), Some(n)) = (dr, dn) {
        println!("  resolving anew costs {:.2}x reshaping", n / r);
    }
    for (face, t) in [
        ("the C service", &threads_t),
        ("the Rust face", &rust_threads_t),
    ] {
        println!(
            "execute throughput through {face}, one handle per thread (goal: 2 threads at \
             least 1.8x 1 thread, as handles share no written line):"
        );
        println!(
            "  {:<10}{:>16}{:>18}{:>16}{:>14}",
            "threads", "per execute", "per thread (M/s)", "total (M/s)", "vs 1 thread"
        );
        let one = m(&t[0]).map(|ns| 1e3 / ns);
        for (threads, s) in [1usize, 2].into_iter().zip(t) {
            let Some(ns) = m(s) else { continue };
            let per_thread = 1e3 / ns;
            let total = per_thread * threads as f64;
            let verdict = match one {
                Some(o) if full && threads == 2 => {
                    let ratio = total / o;
                    format!(
                        "{ratio:.2}x: {}",
                        if ratio >= 1.8 { "met" } else { "missed" }
                    )
                }
                Some(o) => format!("{:.2}x", total / o),
                None => String::new(),
            };
            println!(
                "  {threads:<10}{:>16}{per_thread:>18.2}{total:>16.2}{verdict:>14}",
                show(Some(ns)),
            );
        }
    }
    c.final_summary();
}
