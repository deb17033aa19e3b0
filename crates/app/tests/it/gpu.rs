//! The CUDA scan module (test-plugins/cuda_scan) through the C operation service.
//!
//! On every machine: the signed `.gkmodule` installs and loads without a driver or a GPU (its
//! init never touches the driver), `DeviceSupport::detect` says what the machine has, and a CUDA
//! query on a host without a CUDA device is refused with the domain's `NoCudaDevice` reason (or,
//! stream-ordered, for want of a stream adapter). Where there is no driver at all, the module's
//! own `validate` refuses a query that claims a device, naming the missing library.
//!
//! On a GPU (`gpu::device::`, which skips with its reason elsewhere and fails instead with
//! `REQUIRE_GPU=1`): the scan on a non-default stream against a Rust reference, in device and
//! managed memory, f32 and i32, inclusive and exclusive; captured into a CUDA graph that is
//! instantiated and launched several times, its objects destroyed before the handle is released;
//! release waiting for the work it recorded (timed against the work alone, printed as a note);
//! the package held while the handle lives; and the Rust face's `execute_on_stream`,
//! stream-ordered and graph-capturable, with release waiting for a long scan.
//!
//! `device_tests_pass_against_the_fake_driver` runs `gpu::device::` in a child process against
//! the adapter crate's fake driver, so that the whole path (service, adapter, module) runs on
//! every machine; only the PTX and the real driver's behaviour stay for a GPU run to show.

use std::ffi::c_void;
use std::ptr;

use guild_abi::{
    guild_stream_t, guild_tensor_desc_v1_t, GUILD_BACKEND_CUDA, GUILD_DTYPE_F32, GUILD_DTYPE_I32,
    GUILD_MEMORY_DEVICE, GUILD_MEMORY_MANAGED, GUILD_STATUS_ERR_NOT_FOUND,
    GUILD_STATUS_ERR_UNSUPPORTED, GUILD_SYNC_GRAPH_CAPTURABLE, GUILD_SYNC_HOST_BLOCKING,
    GUILD_SYNC_STREAM_ORDERED,
};
use guild_adapters_cuda::testing::fake_driver::{exit_report, FakeDriver, Variant, NOTHING_ALIVE};
use guild_adapters_cuda::testing::report_skip;
use guild_adapters_cuda::{CudaError, Driver, NoDevice};
use guild_domain::ids::ImplId;
use guild_domain::operation::{
    Backend, DType, FailureKind, MemorySpace, Rejection, SyncMode, TensorDesc,
};
use guild_host::operations::{DeviceSupport, ResolveError};
use guild_host::{OperationRequest, OperationService};
use guild_test_support::plugins::plugin_library;
use guild_test_support::Spec;

use crate::c_face::{args, tensor, Query, Service};
use crate::operations::{fixture_with, op, EXCLUSIVE_OP, INCLUSIVE_OP};

const PACKAGE: &str = "example.cuda_scan";
const CUDA_INCLUSIVE: &str = "example.cuda_scan.inclusive.cuda";
const CUDA_EXCLUSIVE: &str = "example.cuda_scan.exclusive.cuda";

fn cuda_spec(version: &str) -> Spec {
    let mut spec = Spec::module(PACKAGE, version).library(&plugin_library("cuda_scan"));
    spec.backends = vec!["cuda".into()];
    spec.provided_ops = vec![CUDA_INCLUSIVE.into(), CUDA_EXCLUSIVE.into()];
    spec
}

/// A C query for the CUDA scans over `dims` in `space` memory of device 0, in `sync` mode,
/// resolved against the host's own device record.
fn cuda_query(op: &str, dtype: u32, dims: &[u64], space: u32, sync: u32) -> Query {
    let mut t = tensor(dtype, dims, &[]);
    t.memory_space = space;
    let mut q = Query::cpu(op, vec![t], vec![t]);
    q.backends = GUILD_BACKEND_CUDA;
    q.sync_mode = sync;
    q
}

/// The same request through the Rust face (host-blocking, device 0 with `cuda_sm`).
fn cuda_request(cuda_sm: Option<u32>) -> OperationRequest {
    let t = TensorDesc::new(DType::F32, &[8, 2], MemorySpace::Device);
    let mut request = OperationRequest::cpu(op(INCLUSIVE_OP), vec![t], vec![t]);
    request.backends = Backend::Cuda.into();
    request.device.cuda_sm = cuda_sm;
    request
}

fn impl_id(s: &str) -> ImplId {
    ImplId::new(s).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Every machine
// ---------------------------------------------------------------------------------------------

#[test]
fn the_cuda_scan_installs_and_loads_without_a_device() {
    // The fixture installs the signed package and asserts that its library is open.
    let f = fixture_with(&[cuda_spec("1.0.0")], DeviceSupport::host());
    let snapshot = f.host.kernels().snapshot();
    for (id, op_name) in [
        (CUDA_INCLUSIVE, INCLUSIVE_OP),
        (CUDA_EXCLUSIVE, EXCLUSIVE_OP),
    ] {
        let stored = snapshot
            .by_id(&impl_id(id))
            .unwrap_or_else(|| panic!("{id} is registered"));
        let c = stored.kernel.operation.as_ref().expect("a GOP1 contract");
        assert_eq!(stored.kernel.backend, Backend::Cuda);
        assert_eq!(c.op_name.as_str(), op_name);
        assert_eq!((c.min_sm, c.max_sm), (50, 0));
        assert!(c.memory_spaces.has(MemorySpace::Device));
        assert!(c.memory_spaces.has(MemorySpace::Managed));
        assert!(!c.memory_spaces.has(MemorySpace::Host));
        for mode in [
            SyncMode::HostBlocking,
            SyncMode::StreamOrdered,
            SyncMode::GraphCapturable,
        ] {
            assert!(c.sync_modes.has(mode), "{id} supports {mode:?}");
        }
    }
}

#[test]
fn detect_reports_cuda_device_zero_or_why_there_is_none() {
    let (devices, why) = DeviceSupport::detect();
    match Driver::load().and_then(|d| d.device(0)) {
        Ok(device) => {
            assert_eq!(devices.cuda_sm, Some(device.sm));
            assert!(devices.streams.is_some());
            assert_eq!(why, None);
        }
        Err(e) => {
            assert!(e.is_no_device(), "{e}");
            assert_eq!(devices.cuda_sm, None);
            assert!(devices.streams.is_none());
            assert_eq!(why, Some(e.to_string()));
        }
    }
}

#[test]
fn without_a_cuda_device_a_cuda_query_is_refused_with_the_reason() {
    let f = fixture_with(&[cuda_spec("1.0.0")], DeviceSupport::host());

    // Rust face: the domain's report names each CUDA candidate and NoCudaDevice.
    let service = OperationService::new(f.host.kernels());
    let err = service.resolve(&cuda_request(None)).unwrap_err();
    let ResolveError::Unresolved(failure) = &err else {
        panic!("expected the domain's report, got {err}");
    };
    assert_eq!(failure.kind, FailureKind::NoneCompatible);
    let reasons: Vec<(&str, &Rejection)> = failure
        .rejections
        .iter()
        .map(|r| (r.impl_id.as_str(), &r.reason))
        .collect();
    assert_eq!(reasons, [(CUDA_INCLUSIVE, &Rejection::NoCudaDevice)]);

    // C face, host-blocking, against the host's own record of device 0 (no CUDA there).
    let c = Service::of(f.host.kernels());
    let q = cuda_query(
        INCLUSIVE_OP,
        GUILD_DTYPE_F32,
        &[8, 2],
        GUILD_MEMORY_DEVICE,
        GUILD_SYNC_HOST_BLOCKING,
    );
    let err = c.resolve(&q).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_NOT_FOUND, "{err}");
    assert!(
        err.message
            .contains("a cuda provider needs a cuda device and the query reports none"),
        "{err}"
    );

    // Stream-ordered: refused before ranking, for want of a stream adapter (as the service does
    // today for every non-CPU stream-ordered query on a host without one).
    let q = cuda_query(
        INCLUSIVE_OP,
        GUILD_DTYPE_F32,
        &[8, 2],
        GUILD_MEMORY_DEVICE,
        GUILD_SYNC_STREAM_ORDERED,
    );
    let err = c.resolve(&q).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_UNSUPPORTED, "{err}");
    assert!(
        err.message
            .contains("stream-ordered execution on a device needs a device adapter"),
        "{err}"
    );
    assert_eq!(f.host.kernels().live_c_handles(), 0);
}

#[test]
fn without_a_driver_the_module_refuses_a_query_that_claims_a_device() {
    let reason = match Driver::load() {
        Err(CudaError::NoDevice(NoDevice::NoDriver(reason))) => reason,
        other => {
            report_skip(
                "gpu::without_a_driver_the_module_refuses_a_query_that_claims_a_device",
                &format_args!(
                    "this machine has a CUDA driver ({})",
                    other.map_or_else(|e| e.to_string(), |d| format!("version {}", d.version()))
                ),
            );
            return;
        }
    };
    assert!(reason.contains("libcuda.so.1"), "{reason}");
    let f = fixture_with(&[cuda_spec("1.0.0")], DeviceSupport::host());
    let service = OperationService::new(f.host.kernels());
    // The caller claims an sm 90 device, so the static checks pass and validate runs; the
    // module opens the driver lazily there and finds none.
    let err = service.resolve(&cuda_request(Some(90))).unwrap_err();
    let ResolveError::Unresolved(failure) = &err else {
        panic!("expected the domain's report, got {err}");
    };
    let [rejection] = failure.rejections.as_slice() else {
        panic!("one candidate: {failure:?}");
    };
    assert_eq!(rejection.impl_id.as_str(), CUDA_INCLUSIVE);
    let Rejection::ValidateRefused(refusal) = &rejection.reason else {
        panic!("validate refuses: {:?}", rejection.reason);
    };
    assert_eq!(refusal.status, GUILD_STATUS_ERR_UNSUPPORTED);
    assert_eq!(
        refusal.message,
        format!("no usable CUDA driver: {reason}"),
        "the module reports what the loader said"
    );
}

#[test]
fn device_tests_pass_against_the_fake_driver() {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::build(dir.path(), Variant::Complete).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = driver.command(std::env::current_exe().unwrap());
    cmd.args(["gpu::device::", "--test-threads=1"])
        .env("REQUIRE_GPU", "1");
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("test result: ok. 8 passed; 0 failed"),
        "{stdout}"
    );
    assert!(!stderr.contains("skipped"), "{stderr}");
    // Every stream, event, module, graph, allocation and context retain was given back.
    assert_eq!(exit_report(&stderr), Some(NOTHING_ALIVE), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// On a device
// ---------------------------------------------------------------------------------------------

mod device {
    mod tables;

    use super::*;

    use std::time::{Duration, Instant};

    use guild_adapters_cuda::testing::{gpu_or_skip, DeviceBuffer, Gpu, Stream};
    use guild_domain::lease::{Leased, QuiescentAction};
    use guild_host::operations::{DeviceTensor, ExecuteError, TensorArg, TensorArgMut};
    use guild_host::{HostError, InstallOptions};
    use guild_ports::device::StreamRef;

    use crate::operations::Fixture;
    use guild_test_support::id;

    /// A host over the cuda_scan package that resolves against what `detect` found.
    fn fixture(gpu: &Gpu, specs: &[Spec]) -> Fixture {
        let (devices, why) = DeviceSupport::detect();
        assert_eq!(why, None, "the GPU opened, so detect must find it");
        assert_eq!(devices.cuda_sm, Some(gpu.info().sm));
        fixture_with(specs, devices)
    }

    /// Values for a scan: small enough that i32 sums stay far from overflow, varied enough (and
    /// fractional, for f32) that a wrong order or a wrong row would show.
    fn input_f32(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(7).wrapping_add(seed) % 13) as f32 * 0.25 - 1.5)
            .collect()
    }

    fn input_i32(n: usize, seed: u32) -> Vec<i32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(7919).wrapping_add(seed) % 2001) as i32 - 1000)
            .collect()
    }

    /// The sequential scan of each row of `row` elements, f32 left to right (bit for bit what
    /// the kernel computes).
    fn reference_f32(input: &[f32], row: usize, exclusive: bool) -> Vec<f32> {
        let mut out = vec![0f32; input.len()];
        for (src, dst) in input.chunks(row).zip(out.chunks_mut(row)) {
            let mut acc = 0f32;
            for (x, y) in src.iter().zip(dst) {
                if exclusive {
                    *y = acc;
                    acc += x;
                } else {
                    acc += x;
                    *y = acc;
                }
            }
        }
        out
    }

    fn reference_i32(input: &[i32], row: usize, exclusive: bool) -> Vec<i32> {
        let mut out = vec![0i32; input.len()];
        for (src, dst) in input.chunks(row).zip(out.chunks_mut(row)) {
            let mut acc = 0i32;
            for (x, y) in src.iter().zip(dst) {
                if exclusive {
                    *y = acc;
                    acc = acc.wrapping_add(*x);
                } else {
                    acc = acc.wrapping_add(*x);
                    *y = acc;
                }
            }
        }
        out
    }

    /// Prints `<test>: note: <text>` past libtest's capture, for the gpu-check summary.
    fn note(test: &str, text: &dyn std::fmt::Display) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr().lock(), "{test}: note: {text}");
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// `t` pointing at `buffer`.
    fn on(t: guild_tensor_desc_v1_t, buffer: &DeviceBuffer) -> guild_tensor_desc_v1_t {
        let mut t = t;
        t.data = buffer.as_ptr();
        t
    }

    fn alloc(gpu: &Gpu, space: u32, bytes: usize) -> DeviceBuffer {
        if space == GUILD_MEMORY_MANAGED {
            gpu.alloc_managed(bytes).unwrap()
        } else {
            gpu.alloc(bytes).unwrap()
        }
    }

    /// Execute args for one input and one output on `stream` of device 0 in `sync` mode.
    fn stream_args(
        inputs: &[guild_tensor_desc_v1_t],
        outputs: &[guild_tensor_desc_v1_t],
        stream: Option<&Stream>,
        sync: u32,
    ) -> guild_abi::guild_execute_args_v1_t {
        let mut a = args(inputs, outputs);
        a.stream = stream.map_or(ptr::null_mut::<c_void>() as guild_stream_t, |s| {
            s.address() as guild_stream_t
        });
        a.sync_mode = sync;
        a
    }

    #[test]
    fn the_scan_runs_on_a_non_default_stream() {
        let Some(gpu) = gpu_or_skip("gpu::device::the_scan_runs_on_a_non_default_stream") else {
            return;
        };
        let f = fixture(&gpu, &[cuda_spec("1.0.0")]);
        let service = Service::of(f.host.kernels());
        let stream = gpu.stream().unwrap();
        let dims = [37u64, 3];
        let n = 111;
        for (op_name, impl_name, exclusive) in [
            (INCLUSIVE_OP, CUDA_INCLUSIVE, false),
            (EXCLUSIVE_OP, CUDA_EXCLUSIVE, true),
        ] {
            for space in [GUILD_MEMORY_DEVICE, GUILD_MEMORY_MANAGED] {
                for dtype in [GUILD_DTYPE_F32, GUILD_DTYPE_I32] {
                    let case = format!("{impl_name} dtype {dtype} memory {space:#x}");
                    let q = cuda_query(op_name, dtype, &dims, space, GUILD_SYNC_STREAM_ORDERED);
                    let handle = service
                        .resolve(&q)
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                    let d = handle.describe().unwrap();
                    assert_eq!(d.impl_id, impl_name);
                    assert_eq!(d.raw.backend, GUILD_BACKEND_CUDA);
                    let input = alloc(&gpu, space, n * 4);
                    let output = alloc(&gpu, space, n * 4);
                    let inputs = [on(q.inputs[0], &input)];
                    let outputs = [on(q.outputs[0], &output)];
                    let a =
                        stream_args(&inputs, &outputs, Some(&stream), GUILD_SYNC_STREAM_ORDERED);
                    if dtype == GUILD_DTYPE_F32 {
                        let x = input_f32(n, dtype + space);
                        input.write(&x).unwrap();
                        handle
                            .execute_args(&a)
                            .unwrap_or_else(|e| panic!("{case}: {e}"));
                        stream.synchronize().unwrap();
                        let got = output.read::<f32>(n).unwrap();
                        assert_eq!(
                            bits(&got),
                            bits(&reference_f32(&x, 37, exclusive)),
                            "{case}"
                        );
                    } else {
                        let x = input_i32(n, dtype + space);
                        input.write(&x).unwrap();
                        handle
                            .execute_args(&a)
                            .unwrap_or_else(|e| panic!("{case}: {e}"));
                        stream.synchronize().unwrap();
                        let got = output.read::<i32>(n).unwrap();
                        assert_eq!(got, reference_i32(&x, 37, exclusive), "{case}");
                    }
                    handle.release().unwrap_or_else(|e| panic!("{case}: {e}"));
                }
            }
        }

        // In place and host-blocking on the default stream: the call returns with the result.
        let q = cuda_query(
            INCLUSIVE_OP,
            GUILD_DTYPE_I32,
            &dims,
            GUILD_MEMORY_DEVICE,
            GUILD_SYNC_HOST_BLOCKING,
        );
        let handle = service.resolve(&q).unwrap();
        let x = input_i32(n, 5);
        let buffer = gpu.upload(&x).unwrap();
        let same = [on(q.inputs[0], &buffer)];
        handle
            .execute_args(&stream_args(&same, &same, None, GUILD_SYNC_HOST_BLOCKING))
            .unwrap();
        assert_eq!(buffer.read::<i32>(n).unwrap(), reference_i32(&x, 37, false));
        handle.release().unwrap();
        assert_eq!(f.host.kernels().live_c_handles(), 0);
    }

    #[test]
    fn a_captured_graph_replays_the_scan_and_the_handle_outlives_it() {
        let Some(gpu) = gpu_or_skip(
            "gpu::device::a_captured_graph_replays_the_scan_and_the_handle_outlives_it",
        ) else {
            return;
        };
        let f = fixture(&gpu, &[cuda_spec("1.0.0")]);
        let service = Service::of(f.host.kernels());
        let stream = gpu.stream().unwrap();
        let (row, n) = (64usize, 256usize);
        let q = cuda_query(
            EXCLUSIVE_OP,
            GUILD_DTYPE_F32,
            &[row as u64, 4],
            GUILD_MEMORY_DEVICE,
            GUILD_SYNC_GRAPH_CAPTURABLE,
        );
        let handle = service.resolve(&q).unwrap();
        let input = gpu.upload(&input_f32(n, 0)).unwrap();
        let output = gpu.upload(&vec![0f32; n]).unwrap();
        let inputs = [on(q.inputs[0], &input)];
        let outputs = [on(q.outputs[0], &output)];

        // The first execute of this library happens inside the capture: the module loads its
        // kernel there (with the thread's capture mode relaxed for the load).
        stream.begin_capture().unwrap();
        let captured = handle.execute_args(&stream_args(
            &inputs,
            &outputs,
            Some(&stream),
            GUILD_SYNC_GRAPH_CAPTURABLE,
        ));
        let graph = stream.end_capture().unwrap();
        captured.unwrap();
        assert_eq!(
            output.read::<f32>(n).unwrap(),
            vec![0f32; n],
            "capturing runs nothing"
        );

        let exec = graph.instantiate().unwrap();
        for round in 0..5u32 {
            let x = input_f32(n, round);
            input.write(&x).unwrap();
            exec.launch(&stream).unwrap();
            stream.synchronize().unwrap();
            assert_eq!(
                bits(&output.read::<f32>(n).unwrap()),
                bits(&reference_f32(&x, row, true)),
                "launch {round}"
            );
        }
        // The graph references the module's kernel: the handle (and with it the package) must
        // outlive the graph objects, and does.
        assert_eq!(f.host.active_package_leases(&id(PACKAGE)), 1);
        exec.destroy().unwrap();
        graph.destroy().unwrap();
        handle.release().unwrap();
        assert_eq!(f.host.active_package_leases(&id(PACKAGE)), 0);
        assert_eq!(f.host.kernels().live_c_handles(), 0);
    }

    /// One row long enough that a single thread takes a while on a real GPU.
    const LONG_ROW: usize = 1 << 22;

    #[test]
    fn release_waits_for_the_work_it_recorded() {
        let Some(gpu) = gpu_or_skip("gpu::device::release_waits_for_the_work_it_recorded") else {
            return;
        };
        let f = fixture(&gpu, &[cuda_spec("1.0.0")]);
        let service = Service::of(f.host.kernels());
        let stream = gpu.stream().unwrap();
        let q = cuda_query(
            INCLUSIVE_OP,
            GUILD_DTYPE_I32,
            &[LONG_ROW as u64],
            GUILD_MEMORY_DEVICE,
            GUILD_SYNC_STREAM_ORDERED,
        );
        let handle = service.resolve(&q).unwrap();
        let x: Vec<i32> = (0..LONG_ROW).map(|i| (i % 3) as i32).collect();
        let input = gpu.upload(&x).unwrap();
        let output = gpu.upload(&vec![0i32; LONG_ROW]).unwrap();
        let inputs = [on(q.inputs[0], &input)];
        let outputs = [on(q.outputs[0], &output)];
        let a = stream_args(&inputs, &outputs, Some(&stream), GUILD_SYNC_STREAM_ORDERED);
        // The same work once with the stream synchronised: how long it takes on this device.
        let alone = Instant::now();
        handle.execute_args(&a).unwrap();
        stream.synchronize().unwrap();
        let alone = alone.elapsed();

        let launched = Instant::now();
        handle.execute_args(&a).unwrap();
        let enqueued = launched.elapsed();
        // Whether the work is still running here depends on the device; it is printed so that a
        // GPU run's log shows that the wait below had something to wait for.
        let pending = !stream.is_idle().unwrap();
        let releasing = Instant::now();
        handle.release().unwrap();
        let (release, total) = (releasing.elapsed(), launched.elapsed());
        assert!(
            stream.is_idle().unwrap(),
            "release returned before the work it recorded had finished"
        );
        note(
            "gpu::device::release_waits_for_the_work_it_recorded",
            &format_args!(
                "the work ({LONG_ROW} elements on one thread) takes {alone:.2?} launched and \
                 synchronised alone; execute returned after {enqueued:.2?}, the work was still \
                 pending then: {pending}; release returned {release:.2?} later, \
                 {total:.2?} after the launch"
            ),
        );
        assert_eq!(
            output.read::<i32>(LONG_ROW).unwrap(),
            reference_i32(&x, LONG_ROW, false)
        );
    }

    #[test]
    fn the_package_stays_loaded_while_a_handle_lives() {
        let Some(gpu) = gpu_or_skip("gpu::device::the_package_stays_loaded_while_a_handle_lives")
        else {
            return;
        };
        // A second version, so that there is something to roll back to.
        let f = fixture(&gpu, &[cuda_spec("1.0.0")]);
        let v101 = f.shop.build(&cuda_spec("1.0.1"), &f.key);
        f.host
            .install(&v101.archive, InstallOptions::default())
            .unwrap();
        assert_eq!(
            f.loader.open_libraries(),
            1,
            "1.0.0 was replaced and closed"
        );
        let package = id(PACKAGE);
        let service = Service::of(f.host.kernels());
        let stream = gpu.stream().unwrap();
        let q = cuda_query(
            INCLUSIVE_OP,
            GUILD_DTYPE_I32,
            &[LONG_ROW as u64],
            GUILD_MEMORY_DEVICE,
            GUILD_SYNC_STREAM_ORDERED,
        );
        let handle = service.resolve(&q).unwrap();
        let x: Vec<i32> = (0..LONG_ROW).map(|i| (i % 5) as i32).collect();
        let input = gpu.upload(&x).unwrap();
        let output = gpu.upload(&vec![0i32; LONG_ROW]).unwrap();
        let inputs = [on(q.inputs[0], &input)];
        let outputs = [on(q.outputs[0], &output)];
        handle
            .execute_args(&stream_args(
                &inputs,
                &outputs,
                Some(&stream),
                GUILD_SYNC_STREAM_ORDERED,
            ))
            .unwrap();

        // While the handle lives (its work possibly still running), every change that would
        // unload or replace the module's code is refused.
        let refused = |result: Result<_, HostError>, action| match result {
            Err(HostError::Leased(Leased {
                id: refused_id,
                action: got,
                leases: 0,
                bindings: 1,
            })) => {
                assert_eq!(refused_id, package);
                assert_eq!(got, action);
            }
            Err(other) => panic!("expected a refusal to {action}, got {other}"),
            Ok(_) => panic!("{action} went ahead while a handle lives"),
        };
        refused(
            f.host.disable(&package).map(|_| ()),
            QuiescentAction::Unload,
        );
        refused(
            f.host.rollback(&package).map(|_| ()),
            QuiescentAction::Rollback,
        );
        refused(
            f.host.remove(&package, None).map(|_| ()),
            QuiescentAction::Remove,
        );
        let newer = f.shop.build(&cuda_spec("1.0.2"), &f.key);
        refused(
            f.host
                .install(&newer.archive, InstallOptions::default())
                .map(|_| ()),
            QuiescentAction::Replace,
        );
        assert_eq!(f.loader.open_libraries(), 1, "nothing was loaded or closed");

        // disable_waiting drains: it goes ahead once the handle is released (which waits for
        // the recorded work), here from another thread.
        std::thread::scope(|s| {
            let waiting = s.spawn(|| f.host.disable_waiting(&package, Duration::from_secs(120)));
            handle.release().unwrap();
            assert!(stream.is_idle().unwrap(), "release waited for the work");
            let version = waiting.join().unwrap().unwrap();
            assert_eq!(version.to_string(), "1.0.1");
        });
        assert_eq!(
            output.read::<i32>(LONG_ROW).unwrap(),
            reference_i32(&x, LONG_ROW, false)
        );
        assert_eq!(f.host.active_package_leases(&package), 0);
        assert_eq!(f.host.kernels().loaded_version(&package), None);
        assert_eq!(
            f.loader.open_libraries(),
            0,
            "released and disabled: the library closed"
        );
    }

    /// `buffer` as a device tensor described by `desc`.
    fn device_tensor(desc: TensorDesc, buffer: &DeviceBuffer) -> DeviceTensor {
        // SAFETY: every caller keeps `buffer` (of `buffer.bytes()` bytes of `desc`'s memory on
        // device 0) alive until the handle it executes on is released.
        unsafe { DeviceTensor::new(desc, buffer.as_ptr(), buffer.bytes() as u64) }
    }

    /// Enqueues `handle` on `stream` from `input` to `output`, both described by `desc`.
    fn enqueue(
        handle: &guild_host::OpHandle<'_>,
        stream: &Stream,
        desc: TensorDesc,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
    ) -> Result<(), ExecuteError> {
        // SAFETY: every caller keeps both buffers (device memory of device 0 holding the
        // tensors' bytes) alive until after the handle is released; the stream belongs to
        // device 0's primary context, as the module requires.
        unsafe {
            handle.execute_on_stream(
                StreamRef(stream.address()),
                &[device_tensor(desc, input)],
                &[device_tensor(desc, output)],
                None,
                None,
                &[],
            )
        }
    }

    #[test]
    fn the_rust_face_enqueues_on_a_stream_and_release_waits() {
        let test = "gpu::device::the_rust_face_enqueues_on_a_stream_and_release_waits";
        let Some(gpu) = gpu_or_skip(test) else {
            return;
        };
        let f = fixture(&gpu, &[cuda_spec("1.0.0")]);
        let service = OperationService::new(f.host.kernels());
        let stream = gpu.stream().unwrap();
        let request = |op_name: &str, dims: &[u64], space: MemorySpace, sync: SyncMode| {
            let t = TensorDesc::new(DType::F32, dims, space);
            let mut r = OperationRequest::cpu(op(op_name), vec![t], vec![t]);
            r.backends = Backend::Cuda.into();
            r.sync_mode = sync;
            r.device.cuda_sm = Some(gpu.info().sm);
            r
        };

        // Stream-ordered and graph-capturable, device and managed memory: correct on the
        // stream once it is synchronised.
        let (row, n) = (37usize, 111usize);
        for (sync, space, op_name, impl_name, exclusive) in [
            (
                SyncMode::StreamOrdered,
                MemorySpace::Device,
                INCLUSIVE_OP,
                CUDA_INCLUSIVE,
                false,
            ),
            (
                SyncMode::StreamOrdered,
                MemorySpace::Managed,
                EXCLUSIVE_OP,
                CUDA_EXCLUSIVE,
                true,
            ),
            (
                SyncMode::GraphCapturable,
                MemorySpace::Device,
                EXCLUSIVE_OP,
                CUDA_EXCLUSIVE,
                true,
            ),
        ] {
            let case = format!("{impl_name} {sync:?} {space:?}");
            let r = request(op_name, &[row as u64, 3], space, sync);
            let handle = service
                .resolve(&r)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            let d = handle.describe();
            assert_eq!(d.impl_id.as_str(), impl_name, "{case}");
            assert_eq!((d.backend, d.sync_mode), (Backend::Cuda, sync), "{case}");
            let bytes = n * 4;
            let mem = if space == MemorySpace::Managed {
                GUILD_MEMORY_MANAGED
            } else {
                GUILD_MEMORY_DEVICE
            };
            let (input, output) = (alloc(&gpu, mem, bytes), alloc(&gpu, mem, bytes));
            let x = input_f32(n, 11);
            input.write(&x).unwrap();
            let desc = r.inputs[0];
            enqueue(&handle, &stream, desc, &input, &output)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            stream.synchronize().unwrap();
            assert_eq!(
                bits(&output.read::<f32>(n).unwrap()),
                bits(&reference_f32(&x, row, exclusive)),
                "{case}"
            );

            // The safe face takes host slices and would let the work outlive their borrows:
            // it refuses a stream-ordered device handle before the provider runs.
            let host_in = vec![0f32; n];
            let mut host_out = vec![0f32; n];
            let err = handle
                .execute(
                    &[TensorArg::new(&desc, &host_in)],
                    &mut [TensorArgMut::new(&desc, &mut host_out)],
                    None,
                )
                .unwrap_err();
            assert!(
                matches!(err, ExecuteError::SyncMode { .. }),
                "{case}: {err}"
            );
            handle.release().unwrap_or_else(|e| panic!("{case}: {e}"));
        }

        // A long piece of work: release, not the caller, waits for it.
        let long = TensorDesc::new(DType::I32, &[LONG_ROW as u64], MemorySpace::Device);
        let mut r = request(
            INCLUSIVE_OP,
            &[LONG_ROW as u64],
            MemorySpace::Device,
            SyncMode::StreamOrdered,
        );
        r.inputs = vec![long];
        r.outputs = vec![long];
        let handle = service.resolve(&r).unwrap();
        let x: Vec<i32> = (0..LONG_ROW).map(|i| (i % 7) as i32 - 3).collect();
        let input = gpu.upload(&x).unwrap();
        let output = gpu.upload(&vec![0i32; LONG_ROW]).unwrap();
        enqueue(&handle, &stream, long, &input, &output).unwrap();
        let pending = !stream.is_idle().unwrap();
        let releasing = Instant::now();
        handle.release().unwrap();
        let release = releasing.elapsed();
        assert!(stream.is_idle().unwrap(), "release waited for the work");
        note(
            test,
            &format_args!(
                "Rust face: 3 stream-ordered and graph-capturable scans correct; the long \
                 scan was pending at release: {pending}, release took {release:.2?}"
            ),
        );
        assert_eq!(
            output.read::<i32>(LONG_ROW).unwrap(),
            reference_i32(&x, LONG_ROW, false)
        );
        assert_eq!(f.host.kernels().live_c_handles(), 0);
        assert_eq!(f.host.active_package_leases(&id(PACKAGE)), 0);
    }
}
