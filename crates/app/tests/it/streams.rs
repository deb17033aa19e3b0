//! Stream-ordered work through the **Rust** face of the operation service: a request resolved
//! stream-ordered or graph-capturable, `OpHandle::execute_on_stream` over `DeviceTensor`s on the
//! service probe's CUDA-declared `example.probe.stream_copy` (which copies on the host, so no
//! GPU is needed), the fake device adapter's record of the marks, release waiting for them, and
//! the checks that refuse a call before the provider runs.

use std::ffi::c_void;
use std::sync::Arc;

use guild_domain::operation::{
    Backend, CpuIsa, DType, MemorySpace, SyncMode, TensorDesc, TensorRef, TensorRole,
};
use guild_host::operations::{
    DeviceSupport, DeviceTensor, ExecuteError, ResolveError, TensorArg, TensorArgMut,
};
use guild_host::{OpHandle, OperationRequest, OperationService};
use guild_ports::device::{DeviceError, StreamRef};
use guild_ports::fakes::{FakeStreams, StreamEvent};

use crate::gkmodule::probe_spec;
use crate::operations::{fixture_with, op, Fixture};

const STREAM_OP: &str = "example.probe.stream_copy";
const REENTER_OP: &str = "example.probe.reenter";

/// The probe installed on a host with CUDA sm_90 and `streams` as its device adapter.
fn probe_fixture(streams: Option<&FakeStreams>) -> Fixture {
    let devices = DeviceSupport {
        cpu_isa: CpuIsa::EMPTY,
        cuda_sm: Some(90),
        streams: streams.map(|s| Arc::new(s.clone()) as _),
    };
    fixture_with(&[probe_spec()], devices)
}

/// Four `f32` in managed memory.
fn managed() -> TensorDesc {
    TensorDesc::new(DType::F32, &[4], MemorySpace::Managed)
}

/// A CUDA request for the stream copy in `sync_mode`, on device 0 with sm_90.
fn stream_request(sync_mode: SyncMode) -> OperationRequest {
    let mut request = OperationRequest::cpu(op(STREAM_OP), vec![managed()], vec![managed()]);
    request.backends = Backend::Cuda.into();
    request.sync_mode = sync_mode;
    request.device.cuda_sm = Some(90);
    request
}

/// `data` as a device tensor described by `desc`, `bytes` long.
fn device<T>(desc: TensorDesc, data: *const T, bytes: u64) -> DeviceTensor {
    // SAFETY: every caller passes a buffer of at least `bytes` bytes (or NULL, which the
    // service refuses) that outlives the handle it is executed on.
    unsafe { DeviceTensor::new(desc, data.cast_mut().cast::<c_void>(), bytes) }
}

/// Runs the copy of `input` into `output` on `stream`.
fn copy_on(
    handle: &OpHandle<'_>,
    stream: usize,
    input: &[f32; 4],
    output: &mut [f32; 4],
) -> Result<(), ExecuteError> {
    let inputs = [device(managed(), input.as_ptr(), 16)];
    let outputs = [device(managed(), output.as_mut_ptr(), 16)];
    // SAFETY: both buffers are 16 bytes of host memory (standing in for managed memory, which
    // the probe copies on the host at once); the callers keep them alive past `release`.
    unsafe { handle.execute_on_stream(StreamRef(stream), &inputs, &outputs, None, None, &[]) }
}

fn recorded(mark: u64, stream: usize) -> StreamEvent {
    StreamEvent::Recorded {
        device_id: 0,
        stream: StreamRef(stream),
        mark,
    }
}

#[test]
fn stream_ordered_work_runs_on_device_tensors_and_release_waits_for_it() {
    let streams = FakeStreams::new();
    let f = probe_fixture(Some(&streams));
    let service = OperationService::new(f.host.kernels());
    let handle = service
        .resolve(&stream_request(SyncMode::StreamOrdered))
        .unwrap();
    let chosen = handle.describe();
    assert_eq!(chosen.backend, Backend::Cuda);
    assert_eq!(chosen.sync_mode, SyncMode::StreamOrdered);
    assert_eq!(
        chosen.impl_id.as_str(),
        "example.service_probe.stream_copy.cuda"
    );

    let input = [1f32, 2.0, 3.0, 4.0];
    let mut output = [0f32; 4];
    copy_on(&handle, 0xa0, &input, &mut output).unwrap();
    assert_eq!(output, input);
    let second = [5f32, 6.0, 7.0, 8.0];
    copy_on(&handle, 0xa0, &second, &mut output).unwrap();
    copy_on(&handle, 0xb0, &input, &mut output).unwrap();
    assert_eq!(output, input);
    // One mark per call; the newer mark on 0xa0 replaced the older one.
    assert_eq!(
        streams.events(),
        vec![
            recorded(1, 0xa0),
            recorded(2, 0xa0),
            StreamEvent::Dropped { mark: 1 },
            recorded(3, 0xb0),
        ]
    );

    // Borrowed slices cannot outlive enqueued work: `execute` refuses a stream-ordered handle
    // without calling the provider or recording anything.
    let mut untouched = [0f32; 4];
    let err = handle
        .execute(
            &[TensorArg::new(&managed(), &input)],
            &mut [TensorArgMut::new(&managed(), &mut untouched)],
            None,
        )
        .unwrap_err();
    assert_eq!(
        err,
        ExecuteError::SyncMode {
            resolved: SyncMode::StreamOrdered,
            got: SyncMode::HostBlocking.raw(),
        }
    );
    assert_eq!(untouched, [0.0; 4]);
    assert_eq!(streams.events().len(), 4);

    handle.release().unwrap();
    let events = streams.events();
    for mark in [2, 3] {
        assert!(events.contains(&StreamEvent::Waited { mark }), "{events:?}");
    }
    assert!(
        !events.contains(&StreamEvent::Waited { mark: 1 }),
        "{events:?}"
    );
}

#[test]
fn release_reports_a_failing_wait_as_a_device_error() {
    let streams = FakeStreams::new();
    let f = probe_fixture(Some(&streams));
    let service = OperationService::new(f.host.kernels());
    let handle = service
        .resolve(&stream_request(SyncMode::GraphCapturable))
        .unwrap();
    assert_eq!(handle.describe().sync_mode, SyncMode::GraphCapturable);
    streams.capture(StreamRef(0xc0));
    streams.fail_waits_on(StreamRef(0xd0));
    let input = [1f32, 2.0, 3.0, 4.0];
    let mut output = [0f32; 4];
    // A stream being captured gives no mark.
    copy_on(&handle, 0xc0, &input, &mut output).unwrap();
    assert_eq!(streams.events(), vec![]);
    copy_on(&handle, 0xd0, &input, &mut output).unwrap();
    assert_eq!(streams.events(), vec![recorded(1, 0xd0)]);
    assert_eq!(output, input);
    assert_eq!(
        handle.release().unwrap_err(),
        DeviceError {
            device_id: 0,
            message: "fake failure on stream 0xd0".into(),
        }
    );
    assert_eq!(
        streams.events(),
        vec![
            recorded(1, 0xd0),
            StreamEvent::Waited { mark: 1 },
            StreamEvent::Dropped { mark: 1 },
        ]
    );
}

#[test]
fn device_tensors_that_break_the_contract_are_refused_before_the_provider_runs() {
    let streams = FakeStreams::new();
    let f = probe_fixture(Some(&streams));
    let service = OperationService::new(f.host.kernels());
    let handle = service
        .resolve(&stream_request(SyncMode::StreamOrdered))
        .unwrap();
    let input = [1f32, 2.0, 3.0, 4.0];
    let mut output = [0f32; 4];
    let good_in = device(managed(), input.as_ptr(), 16);
    let good_out = device(managed(), output.as_mut_ptr(), 16);
    let run = |inputs: &[DeviceTensor], outputs: &[DeviceTensor]| {
        // SAFETY: the buffers outlive the handle; a NULL one is refused before any access.
        unsafe { handle.execute_on_stream(StreamRef(0xa0), inputs, outputs, None, None, &[]) }
    };
    let input0 = TensorRef {
        role: TensorRole::Input,
        index: 0,
    };
    let output0 = TensorRef {
        role: TensorRole::Output,
        index: 0,
    };

    // Another shape than was negotiated.
    let five = TensorDesc::new(DType::F32, &[5], MemorySpace::Managed);
    let wrong = device(five, input.as_ptr(), 20);
    assert_eq!(
        run(&[wrong], &[good_out]).unwrap_err(),
        ExecuteError::DescriptorMismatch {
            tensor: input0,
            expected: Box::new(managed()),
            actual: Box::new(five),
        }
    );
    // Another memory space than was negotiated.
    let on_device = TensorDesc::new(DType::F32, &[4], MemorySpace::Device);
    let wrong = device(on_device, output.as_mut_ptr(), 16);
    match run(&[good_in], &[wrong]).unwrap_err() {
        ExecuteError::DescriptorMismatch { tensor, actual, .. } => {
            assert_eq!(tensor, output0);
            assert_eq!(actual.memory_space, MemorySpace::Device);
        }
        other => panic!("expected a descriptor mismatch, got {other:?}"),
    }
    // An allocation shorter than the tensor's 16 bytes.
    let short = device(managed(), output.as_mut_ptr(), 15);
    assert_eq!(
        run(&[good_in], &[short]).unwrap_err(),
        ExecuteError::BufferTooSmall {
            tensor: output0,
            needed: 16,
            got: 15,
        }
    );
    // No data.
    let null = device(managed(), std::ptr::null::<f32>(), 16);
    assert_eq!(
        run(&[good_in], &[null]).unwrap_err(),
        ExecuteError::NullData { tensor: output0 }
    );
    // Too many tensors.
    assert_eq!(
        run(&[good_in, good_in], &[good_out]).unwrap_err(),
        ExecuteError::Arity {
            role: TensorRole::Input,
            expected: 1,
            got: 2,
        }
    );

    // The provider never ran and nothing was recorded; the valid call still works.
    assert_eq!(output, [0.0; 4]);
    assert_eq!(streams.events(), vec![]);
    run(&[good_in], &[good_out]).unwrap();
    assert_eq!(output, input);
    assert_eq!(streams.events(), vec![recorded(1, 0xa0)]);
    handle.release().unwrap();
}

#[test]
fn a_cpu_handle_given_a_stream_is_refused_before_the_provider_runs() {
    let streams = FakeStreams::new();
    let f = probe_fixture(Some(&streams));
    let service = OperationService::new(f.host.kernels());
    let in_desc = TensorDesc::new(DType::I32, &[2], MemorySpace::Host);
    let request = OperationRequest::cpu(op(REENTER_OP), vec![in_desc], vec![in_desc]);
    let handle = service.resolve(&request).unwrap();
    assert_eq!(handle.describe().backend, Backend::Cpu);
    assert_eq!(handle.describe().sync_mode, SyncMode::HostBlocking);
    let input = [1i32, 2];
    // Without params the probe writes two zeros: 7s left in place show it did not run.
    let mut output = [7i32, 7];
    let inputs = [device(in_desc, input.as_ptr(), 8)];
    let outputs = [device(in_desc, output.as_mut_ptr(), 8)];
    // SAFETY: both buffers are 8 bytes of host memory that outlive the handle.
    let err =
        unsafe { handle.execute_on_stream(StreamRef(0xa0), &inputs, &outputs, None, None, &[]) }
            .unwrap_err();
    assert_eq!(err, ExecuteError::StreamOnCpu);
    assert_eq!(output, [7, 7]);
    assert_eq!(streams.events(), vec![]);
    handle.release().unwrap();
}

#[test]
fn a_cuda_stream_ordered_request_without_a_device_adapter_is_unsupported() {
    let f = probe_fixture(None);
    let service = OperationService::new(f.host.kernels());
    for sync_mode in [SyncMode::StreamOrdered, SyncMode::GraphCapturable] {
        match service.resolve(&stream_request(sync_mode)).unwrap_err() {
            ResolveError::Unsupported(text) => {
                assert!(text.contains("needs a device adapter"), "{text}")
            }
            other => panic!("{sync_mode}: expected Unsupported, got {other:?}"),
        }
    }
}
