//! Execute on a CUDA stream through the operation service against a direct `cuLaunchKernel` of
//! the same kernel, in one run on device 0.
//!
//! The provider is the cuda_scan test module (installed signed, loaded with dlopen, resolved
//! stream-ordered through the Rust face); the baseline launches the module's own kernel
//! (`guild_scan`, its PTX taken from the module's C source at build time) from the same thread
//! on the same stream with the same arguments. Both run a 32-element scan, so the kernel's own
//! time is negligible and the figures are what each path costs the calling thread:
//!
//! - **enqueue**: the time to enqueue one call, from batches of [`BATCH`] calls with the stream
//!   synchronised between batches (outside the timing), median over the rounds;
//! - **round trip**: one call and a `cuStreamSynchronize`, median over the rounds.
//!
//! The service's path does more than the launch by design: it checks every tensor against the
//! negotiated contract, the module checks the stream's context and pushes the primary context,
//! and the host records an event after the call so that release can wait for the work. The
//! difference is printed in microseconds and as a ratio, with a verdict against the project's
//! goal for the enqueue: at most 2x a direct launch.
//!
//! Without a GPU it prints why it skipped and exits 0 (`REQUIRE_GPU=1` makes that a failure).
//! `cargo bench --bench cuda_execute` takes 200 rounds; without `--bench` (as under `cargo test
//! --benches`) 3. Build the C plugins first: `cargo xtask plugins`.

#[path = "common/mod.rs"]
mod common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use guild_adapters_cuda::testing::{gpu_or_skip, DeviceBuffer, Stream};
use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::OpName;
use guild_domain::operation::{Backend, DType, MemorySpace, SyncMode, TensorDesc};
use guild_host::operations::{DeviceSupport, DeviceTensor};
use guild_host::{Host, InstallOptions, OpHandle, OperationRequest, OperationService};
use guild_ports::device::StreamRef;
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

/// Calls enqueued back to back before the stream is synchronised: far below the driver's
/// queue depth, so that no launch waits for a free slot.
const BATCH: usize = 64;
/// Elements of the scanned row.
const N: usize = 32;
const OP: &str = "example.sequence.inclusive_scan";

/// The cuda_scan module's PTX, as its C source spells it (a C string literal over many lines).
fn scan_ptx() -> String {
    let source = include_str!("../../../test-plugins/cuda_scan/cuda_scan.c");
    let start = source
        .find("cuda_scan_ptx[] =")
        .expect("cuda_scan.c defines cuda_scan_ptx");
    let body = &source[start..];
    let end = body.find("\";").expect("the literal ends") + 1;
    let mut ptx = String::new();
    let mut rest = &body[..end];
    // Each piece is "..." on its own line; comments between pieces are skipped.
    while let Some(open) = rest.find('"') {
        let piece = &rest[open + 1..];
        let mut chars = piece.char_indices();
        let mut close = piece.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => ptx.push('\n'),
                    Some((_, 't')) => ptx.push('\t'),
                    Some((_, other)) => ptx.push(other),
                    None => break,
                },
                '"' => {
                    close = i;
                    break;
                }
                c => ptx.push(c),
            }
        }
        rest = &piece[(close + 1).min(piece.len())..];
    }
    assert!(ptx.contains(".entry guild_scan("), "{ptx}");
    ptx
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> String {
    format!("{:.2} us", d.as_secs_f64() * 1e6)
}

/// A host with the signed cuda_scan module installed, resolving against what `detect` found.
fn host(shop: &Workshop) -> Host {
    let (devices, why) = DeviceSupport::detect();
    assert_eq!(why, None, "the GPU opened, so detect must find it");
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).expect("open");
    trust(&pm, PUBLISHER, &k);
    let host = Host::with_devices(pm, Box::new(DlopenLoader::new()), devices);
    let mut spec = Spec::module("example.cuda_scan", "1.0.0").library(&plugin_library("cuda_scan"));
    spec.backends = vec!["cuda".into()];
    spec.provided_ops = vec![
        "example.cuda_scan.inclusive.cuda".into(),
        "example.cuda_scan.exclusive.cuda".into(),
    ];
    host.install(&shop.build(&spec, &k).archive, InstallOptions::default())
        .expect("install");
    host
}

fn desc() -> TensorDesc {
    TensorDesc::new(DType::F32, &[N as u64], MemorySpace::Device)
}

/// One stream-ordered execute of the scan of `input` into `output` on `stream`.
fn execute(handle: &OpHandle<'_>, stream: &Stream, input: &DeviceBuffer, output: &DeviceBuffer) {
    let bytes = (N * 4) as u64;
    // SAFETY: both buffers hold N f32 of device memory and outlive every call (the stream is
    // synchronised, and the handle released, before they are freed); the stream belongs to the
    // primary context of device 0, as the module requires.
    unsafe {
        let inputs = [DeviceTensor::new(desc(), input.as_ptr(), bytes)];
        let outputs = [DeviceTensor::new(desc(), output.as_ptr(), bytes)];
        handle
            .execute_on_stream(
                StreamRef(stream.address()),
                &inputs,
                &outputs,
                None,
                None,
                &[],
            )
            .expect("execute");
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full { 200 } else { 3 };
    let Some(gpu) = gpu_or_skip("cuda_execute") else {
        return;
    };
    let shop = Workshop::new();
    let host = host(&shop);
    let service = OperationService::new(host.kernels());
    let mut request = OperationRequest::cpu(OpName::new(OP).unwrap(), vec![desc()], vec![desc()]);
    request.backends = Backend::Cuda.into();
    request.sync_mode = SyncMode::StreamOrdered;
    request.device.cuda_sm = Some(gpu.info().sm);
    let handle = service.resolve(&request).expect("resolve");

    let x: Vec<f32> = (0..N).map(|i| i as f32 * 0.5).collect();
    let input = gpu.upload(&x).expect("upload");
    let output = gpu.upload(&[0f32; N]).expect("upload");
    let stream = gpu.stream().expect("stream");
    let module = gpu.load_ptx(&scan_ptx()).expect("the scan PTX loads");
    let kernel = module.function("guild_scan").expect("guild_scan");
    let direct = || {
        let (mut i, mut o, mut rows, mut n, mut flags) =
            (input.address(), output.address(), 1u64, N as u64, 0u32);
        let mut params = [
            (&mut i as *mut u64).cast::<c_void>(),
            (&mut o as *mut u64).cast::<c_void>(),
            (&mut rows as *mut u64).cast::<c_void>(),
            (&mut n as *mut u64).cast::<c_void>(),
            (&mut flags as *mut u32).cast::<c_void>(),
        ];
        // SAFETY: guild_scan takes (u64 in, u64 out, u64 rows, u64 n, u32 flags), each pointer
        // addresses a value of that type; the buffers hold N f32 and outlive the work.
        unsafe { kernel.launch(&stream, 1, &mut params) }.expect("launch");
    };
    let service_call = || execute(&handle, &stream, &input, &output);

    // Both paths compute the same thing: check the service's result, then the direct one's.
    let reference: Vec<f32> = x
        .iter()
        .scan(0f32, |acc, v| {
            *acc += v;
            Some(*acc)
        })
        .collect();
    for (name, run) in [
        ("service", &service_call as &dyn Fn()),
        ("direct", &direct as &dyn Fn()),
    ] {
        output.write(&[0f32; N]).expect("clear");
        run();
        stream.synchronize().expect("sync");
        assert_eq!(output.read::<f32>(N).expect("read"), reference, "{name}");
    }

    let batch = |run: &dyn Fn()| {
        let start = Instant::now();
        for _ in 0..BATCH {
            run();
        }
        let took = start.elapsed();
        stream.synchronize().expect("sync");
        took / BATCH as u32
    };
    let trip = |run: &dyn Fn()| {
        let start = Instant::now();
        run();
        stream.synchronize().expect("sync");
        start.elapsed()
    };
    // Warm-up, then the two paths in turn in every round.
    for _ in 0..3 {
        batch(&service_call);
        batch(&direct);
    }
    let (mut enq_s, mut enq_d, mut trip_s, mut trip_d) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        enq_d.push(batch(&direct));
        enq_s.push(batch(&service_call));
        trip_d.push(trip(&direct));
        trip_s.push(trip(&service_call));
    }
    handle.release().expect("release");
    let (enq_s, enq_d) = (median(enq_s), median(enq_d));
    let (trip_s, trip_d) = (median(trip_s), median(trip_d));
    let info = gpu.info();
    println!(
        "cuda_execute: a {N}-element scan on a non-default stream of {} (sm {}), median of \
         {rounds} rounds",
        info.name, info.sm
    );
    let ratio = enq_s.as_secs_f64() / enq_d.as_secs_f64();
    println!(
        "  enqueue     direct cuLaunchKernel {:>10}   service execute_on_stream {:>10}   \
         +{} ({ratio:.2}x)",
        us(enq_d),
        us(enq_s),
        us(enq_s.saturating_sub(enq_d)),
    );
    println!(
        "  round trip  direct cuLaunchKernel {:>10}   service execute_on_stream {:>10}   \
         +{} ({:.2}x)",
        us(trip_d),
        us(trip_s),
        us(trip_s.saturating_sub(trip_d)),
        trip_s.as_secs_f64() / trip_d.as_secs_f64()
    );
    let verdict = if ratio <= 2.0 {
        format!("met ({ratio:.2}x <= 2x)")
    } else {
        format!("NOT met ({ratio:.2}x > 2x)")
    };
    println!("  verdict: enqueue through the service, goal at most 2x a direct launch: {verdict}");
}
