//! The adapter on a real device: device description, marks that wait for a stream's work, a
//! capturing stream that gives no mark, and the graph helpers. Each test skips with its reason
//! where there is no device (`REQUIRE_GPU=1` makes that a failure); `fake::` runs them against
//! the fake driver.

use std::ffi::c_void;

use guild_adapters_cuda::testing::{gpu_or_skip, ADD_ONE_PTX};
use guild_adapters_cuda::CudaStreams;
use guild_ports::device::{StreamEvents, StreamRef};

/// Enough single-thread work that a mark recorded right after the launch is very likely still
/// pending on a real GPU (the test does not depend on it).
const LONG: usize = 1 << 20;

#[test]
fn the_driver_describes_device_zero() {
    let Some(gpu) = gpu_or_skip("gpu::the_driver_describes_device_zero") else {
        return;
    };
    let info = gpu.info();
    {
        use std::io::Write;
        // Past libtest's capture, so that a GPU run's log names the device.
        let _ = writeln!(
            std::io::stderr().lock(),
            "gpu::the_driver_describes_device_zero: note: {info:?}"
        );
    }
    assert_eq!(info.ordinal, 0);
    let (major, minor) = info.compute_capability;
    assert_eq!(info.sm, major * 10 + minor);
    assert!(major >= 5, "compute capability {major}.{minor}");
    assert!(!info.name.is_empty());
    assert!(info.total_memory > 0);
    let devices = gpu.driver().devices().unwrap();
    assert_eq!(devices[0], *info);
}

#[test]
fn a_mark_waits_for_the_work_enqueued_before_it() {
    let Some(gpu) = gpu_or_skip("gpu::a_mark_waits_for_the_work_enqueued_before_it") else {
        return;
    };
    let streams = CudaStreams::new(gpu.driver());
    let data = gpu.upload(&vec![0u32; LONG]).unwrap();
    let stream = gpu.stream().unwrap();
    let module = gpu.load_ptx(ADD_ONE_PTX).unwrap();
    let kernel = module.function("add_one").unwrap();
    let mut address = data.address();
    let mut n = LONG as u64;
    let mut params = [
        (&mut address as *mut u64).cast::<c_void>(),
        (&mut n as *mut u64).cast::<c_void>(),
    ];
    // SAFETY: add_one takes (u64 data, u64 n); `data` holds n u32 values and outlives the work
    // (the mark is waited for below).
    unsafe { kernel.launch(&stream, 1, &mut params) }.unwrap();
    let mark = streams
        .record(gpu.ordinal(), StreamRef(stream.address()))
        .unwrap()
        .expect("a stream that is not capturing gives a mark");
    assert_eq!(mark.stream(), StreamRef(stream.address()));
    mark.wait().unwrap();
    assert!(
        stream.is_idle().unwrap(),
        "the mark was recorded after the launch, so waiting for it waited for the launch"
    );
    assert!(data.read::<u32>(LONG).unwrap().iter().all(|&v| v == 1));
    drop(mark);
}

#[test]
fn a_capturing_stream_gives_no_mark_and_its_graph_replays() {
    let Some(gpu) = gpu_or_skip("gpu::a_capturing_stream_gives_no_mark_and_its_graph_replays")
    else {
        return;
    };
    let streams = CudaStreams::new(gpu.driver());
    let data = gpu.upload(&[0u32; 64]).unwrap();
    let stream = gpu.stream().unwrap();
    let module = gpu.load_ptx(ADD_ONE_PTX).unwrap();
    let kernel = module.function("add_one").unwrap();
    let mut address = data.address();
    let mut n = 64u64;
    let mut params = [
        (&mut address as *mut u64).cast::<c_void>(),
        (&mut n as *mut u64).cast::<c_void>(),
    ];
    stream.begin_capture().unwrap();
    // SAFETY: as in the test above; the captured launch runs only when the graph is launched,
    // and every launch is waited for before `data` goes.
    unsafe { kernel.launch(&stream, 1, &mut params) }.unwrap();
    let mark = streams
        .record(gpu.ordinal(), StreamRef(stream.address()))
        .unwrap();
    assert!(mark.is_none(), "captured work has no mark to wait for");
    let graph = stream.end_capture().unwrap();
    assert!(
        data.read::<u32>(64).unwrap().iter().all(|&v| v == 0),
        "capturing runs nothing"
    );
    let exec = graph.instantiate().unwrap();
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
    }
    // Graph launches are ordinary stream work: they get marks.
    let mark = streams
        .record(gpu.ordinal(), StreamRef(stream.address()))
        .unwrap()
        .expect("a mark after the graph launches");
    mark.wait().unwrap();
    assert!(data.read::<u32>(64).unwrap().iter().all(|&v| v == 3));
    exec.destroy().unwrap();
    graph.destroy().unwrap();
}

#[test]
fn the_default_stream_is_marked_in_the_primary_context() {
    let Some(gpu) = gpu_or_skip("gpu::the_default_stream_is_marked_in_the_primary_context") else {
        return;
    };
    let streams = CudaStreams::new(gpu.driver());
    let mark = streams
        .record(gpu.ordinal(), StreamRef(0))
        .unwrap()
        .expect("the default stream is never capturing here");
    assert_eq!(mark.stream(), StreamRef(0));
    mark.wait().unwrap();
}

#[test]
fn a_device_the_driver_does_not_have_is_refused() {
    let Some(gpu) = gpu_or_skip("gpu::a_device_the_driver_does_not_have_is_refused") else {
        return;
    };
    let count = gpu.driver().device_count().unwrap();
    let err = CudaStreams::new(gpu.driver())
        .record(count, StreamRef(0))
        .unwrap_err();
    assert_eq!(err.device_id, count);
    assert_eq!(
        err.message,
        format!("no CUDA device: there is no CUDA device {count}: the driver reports {count}")
    );
}
