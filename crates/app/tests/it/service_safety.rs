//! What a plugin or a runner can do wrong with the operation service, and that none of it
//! touches freed memory, frees the wrong thing, or hangs: stale and doubly released handles,
//! execute racing release, late calls from plugins of a destroyed host, plugin calls racing the
//! registry's drop, slices passed for device memory, and providers calling each other's handles
//! from two threads. The memory cases run under valgrind in CI, where a read of freed memory is
//! an error even when it happens to return the right answer.

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_op_handle_t, GUILD_DTYPE_F32,
    GUILD_DTYPE_I32, GUILD_DTYPE_I64, GUILD_STATUS_ERR_BUSY, GUILD_STATUS_ERR_INVALID_ARGUMENT,
    GUILD_STATUS_ERR_STATE, GUILD_STATUS_OK,
};
use guild_domain::ids::ImplId;
use guild_domain::operation::{BackendSet, DType, MemorySpace, TensorDesc};
use guild_host::operations::{DeviceSupport, ExecuteError, TensorArg, TensorArgMut};
use guild_host::registry::{KernelBinding, KernelRegistry};
use guild_host::OperationService;
use guild_test_support::plugins::scan_spec;

use crate::c_face::{args, release_raw, tensor, with_data, Query, Service};
use crate::gkmodule::{dependent_spec, probe_spec};
use crate::operations::{fixture_with, INCLUSIVE_OP};

use guild_test_support::plugins::TOTAL_OP;
const TOTAL: &str = "example.dependent.total.cpu";

const CROSS_OP: &str = "example.probe.cross";

/// Fewer rounds under valgrind (which the xtask step tells by setting the proptest case count).
fn rounds(normal: usize, slow: usize) -> usize {
    if std::env::var_os("GUILD_PROPTEST_CASES").is_some() {
        slow
    } else {
        normal
    }
}

fn scan_query() -> Query {
    Query::cpu(
        INCLUSIVE_OP,
        vec![tensor(GUILD_DTYPE_F32, &[4], &[])],
        vec![tensor(GUILD_DTYPE_F32, &[4], &[])],
    )
}

/// Executes a raw handle number through `service` on four f32 values and returns the status.
fn execute_raw(service: &Service<'_>, raw: *mut guild_op_handle_t) -> i32 {
    let input = [1.0f32, 2.0, 3.0, 4.0];
    let mut output = [0.0f32; 4];
    let q = scan_query();
    let inputs = [with_data(q.inputs[0], input.as_ptr())];
    let outputs = [with_data(q.outputs[0], output.as_mut_ptr())];
    let a = args(&inputs, &outputs);
    let mut error = guild_error_info_t::new();
    let execute = service.table.execute.unwrap();
    // SAFETY: the service's table; `raw` is a handle number (live or not, which the service
    // must tell); the tensors point at the live arrays above.
    let status = unsafe { execute(service.table.user, raw, &a, &mut error) };
    if status == GUILD_STATUS_OK {
        assert_eq!(
            output,
            [1.0, 3.0, 6.0, 10.0],
            "the scan ran on the given buffers"
        );
    }
    status
}

fn describe_raw(service: &Service<'_>, raw: *mut guild_op_handle_t) -> i32 {
    let mut error = guild_error_info_t::new();
    // SAFETY: a zeroed description is a valid bit pattern (NULL pointers, zero numbers).
    let mut d: guild_abi::guild_op_description_v1_t = unsafe { std::mem::zeroed() };
    d.struct_size = size_of::<guild_abi::guild_op_description_v1_t>() as u32;
    let describe = service.table.describe.unwrap();
    // SAFETY: as in execute_raw.
    unsafe { describe(service.table.user, raw, &mut d, &mut error) }
}

#[test]
fn a_released_handle_is_refused_by_every_entry() {
    let f = fixture_with(&[scan_spec("1.0.0")], DeviceSupport::host());
    let service = Service::of(f.host.kernels());
    let handle = service.resolve(&scan_query()).unwrap();
    let raw = handle.raw();
    handle.release().unwrap();
    assert_eq!(
        describe_raw(&service, raw),
        GUILD_STATUS_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        execute_raw(&service, raw),
        GUILD_STATUS_ERR_INVALID_ARGUMENT
    );
    let err = release_raw(&service, raw).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert!(err.message.contains("not live"), "{}", err.message);
    assert_eq!(f.host.kernels().live_c_handles(), 0);
}

#[test]
fn a_second_release_cannot_free_a_newer_handle() {
    let f = fixture_with(&[scan_spec("1.0.0")], DeviceSupport::host());
    let service = Service::of(f.host.kernels());
    for _ in 0..rounds(200, 20) {
        let first = service.resolve(&scan_query()).unwrap();
        let stale = first.raw();
        first.release().unwrap();
        // The next handle may reuse whatever the first one used.
        let second = service.resolve(&scan_query()).unwrap();
        let err = release_raw(&service, stale).unwrap_err();
        assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT, "{err}");
        assert_eq!(execute_raw(&service, second.raw()), GUILD_STATUS_OK);
        assert_eq!(f.host.kernels().live_c_handles(), 1);
        second.release().unwrap();
    }
}

#[test]
fn execute_racing_release_is_either_counted_or_refused() {
    let f = fixture_with(&[scan_spec("1.0.0")], DeviceSupport::host());
    let service = Service::of(f.host.kernels());
    let (mut ran, mut refused_releases) = (0usize, 0usize);
    // Under valgrind (the slow mode) threads run one at a time, switched after long slices: a
    // caller switched out inside an execute keeps the handle for the releaser's whole slice,
    // and one that executes back to back is almost never switched out between two executes,
    // so the release could be refused for minutes. There the caller yields after each
    // execute, so that every release meets the handle free now and then.
    let slow = rounds(0, 1) == 1;
    for _ in 0..rounds(2000, 100) {
        let handle = service.resolve(&scan_query()).unwrap();
        let raw = std::mem::ManuallyDrop::new(handle).raw() as usize;
        let started = AtomicBool::new(false);
        std::thread::scope(|s| {
            let caller = s.spawn(|| {
                let mut ok = 0;
                loop {
                    let status = execute_raw(&service, raw as *mut guild_op_handle_t);
                    started.store(true, Ordering::Release);
                    if slow {
                        std::thread::yield_now();
                    }
                    match status {
                        GUILD_STATUS_OK => ok += 1,
                        GUILD_STATUS_ERR_INVALID_ARGUMENT => return ok,
                        other => panic!("execute racing release returned {other}"),
                    }
                }
            });
            while !started.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            loop {
                match release_raw(&service, raw as *mut guild_op_handle_t) {
                    Ok(()) => break,
                    Err(e) if e.status == GUILD_STATUS_ERR_BUSY => refused_releases += 1,
                    Err(e) => panic!("release racing execute: {e}"),
                }
            }
            ran += caller.join().unwrap();
        });
    }
    assert!(ran > 0);
    assert_eq!(f.host.kernels().live_c_handles(), 0);
    eprintln!("{ran} executes ran; {refused_releases} releases were refused as busy and retried");
}

/// The dependent module's GOP1 execute, called directly as its own library would be (through a
/// binding that keeps the library loaded), on four i64 values with the scratch it asks for.
fn call_dependent(binding: &KernelBinding, scratch_bytes: usize) -> (i32, String) {
    let op = binding.kernel().provider.operation().expect("GOP1");
    let input = [1i64, 2, 3, 4];
    let mut output = [0i64; 1];
    let mut scratch = vec![0u64; scratch_bytes.div_ceil(8).max(1)];
    let inputs = [with_data(
        tensor(GUILD_DTYPE_I64, &[4], &[]),
        input.as_ptr(),
    )];
    let outputs = [with_data(
        tensor(GUILD_DTYPE_I64, &[1], &[]),
        output.as_mut_ptr(),
    )];
    let mut a: guild_execute_args_v1_t = args(&inputs, &outputs);
    a.scratch_host = scratch.as_mut_ptr().cast();
    a.scratch_host_size = (scratch.len() * 8) as u64;
    let mut error = guild_error_info_t::new();
    // SAFETY: the binding keeps the library loaded; the args point at live local buffers of
    // the shapes the dependent validates, with its scratch.
    let status = unsafe { (op.execute.unwrap())(op.user_data, &a, &mut error) };
    if status == GUILD_STATUS_OK {
        assert_eq!(output, [10], "the scan's last element");
    }
    (status, guild_abi::text::fixed_buffer_text(&error.message))
}

/// A host with the base scan and the dependent, and a binding of the dependent that outlives
/// it (as a runner's escaped `KernelBinding` would), with the scratch the dependent needs.
fn dependent_binding() -> (crate::operations::Fixture, KernelBinding, usize) {
    let f = fixture_with(
        &[scan_spec("1.0.0"), dependent_spec()],
        DeviceSupport::host(),
    );
    let binding = f
        .host
        .kernels()
        .find_by_id(&ImplId::new(TOTAL).unwrap())
        .expect("the dependent is loaded");
    let service = Service::of(f.host.kernels());
    let q = Query::cpu(
        TOTAL_OP,
        vec![tensor(GUILD_DTYPE_I64, &[4], &[])],
        vec![tensor(GUILD_DTYPE_I64, &[1], &[])],
    );
    let scratch = service.resolve(&q).unwrap().scratch().unwrap().host_bytes as usize;
    assert_eq!(call_dependent(&binding, scratch).0, GUILD_STATUS_OK);
    (f, binding, scratch)
}

#[test]
fn a_late_call_from_a_plugin_of_a_destroyed_host_is_refused_by_that_host() {
    let (f, binding, scratch) = dependent_binding();
    let old_user = f.host.kernels().operation_api().user as usize;
    drop(f);
    // New registries, until one's service sits where the destroyed one's was (the allocator
    // reuses freed memory readily) or it is clear that none can.
    let mut others = Vec::new();
    for _ in 0..256 {
        let registry = KernelRegistry::new();
        let reused = registry.operation_api().user as usize == old_user;
        others.push(registry);
        if reused {
            break;
        }
    }
    let (status, message) = call_dependent(&binding, scratch);
    assert_eq!(
        status, GUILD_STATUS_ERR_STATE,
        "the dependent's copied service belongs to a destroyed registry: {message}"
    );
    assert!(message.contains("destroyed"), "{message}");
    drop(binding);
    drop(others);
}

#[test]
fn plugin_calls_racing_the_registry_drop_are_served_or_refused() {
    for _ in 0..rounds(40, 4) {
        let (f, binding, scratch) = dependent_binding();
        let started = AtomicBool::new(false);
        std::thread::scope(|s| {
            let caller = s.spawn(|| {
                let mut served = 0;
                loop {
                    let (status, message) = call_dependent(&binding, scratch);
                    started.store(true, Ordering::Release);
                    match status {
                        GUILD_STATUS_OK => served += 1,
                        GUILD_STATUS_ERR_STATE => return served,
                        other => panic!("a call racing the drop returned {other}: {message}"),
                    }
                }
            });
            while !started.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            drop(f);
            assert!(caller.join().unwrap() > 0);
        });
        drop(binding);
    }
}

#[test]
fn slices_are_refused_for_a_handle_negotiated_in_device_memory() {
    // The probe's device_copy: a CUDA kernel on device memory, host-blocking, that would hand
    // its pointers to the device. A compute capability is enough to resolve it.
    let devices = DeviceSupport {
        cuda_sm: Some(80),
        ..DeviceSupport::host()
    };
    let f = fixture_with(&[probe_spec()], devices);
    let service = OperationService::new(f.host.kernels());
    let device = TensorDesc::new(DType::I32, &[4], MemorySpace::Device);
    let mut request = guild_host::OperationRequest::cpu(
        crate::operations::op("example.probe.device_copy"),
        vec![device],
        vec![device],
    );
    request.backends = BackendSet::CUDA;
    request.device.cuda_sm = Some(80);
    let handle = service.resolve(&request).unwrap();
    let input = [1i32, 2, 3, 4];
    let mut output = [0i32; 4];
    let err = handle
        .execute(
            &[TensorArg::new(&device, &input)],
            &mut [TensorArgMut::new(&device, &mut output)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ExecuteError::NotHostMemory {
                space: MemorySpace::Device,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(output, [0; 4], "the provider did not run");
}

/// A copied service table, carried to a thread as a plugin's threads carry theirs.
#[derive(Clone, Copy)]
struct SendTable(guild_abi::guild_operation_service_v1_t);

// SAFETY: the table's `user` is a service core, which is Sync; its functions may be called from
// any thread.
unsafe impl Send for SendTable {}

impl SendTable {
    fn get(&self) -> guild_abi::guild_operation_service_v1_t {
        self.0
    }
}

/// What example.probe.cross reads from params.
#[repr(C)]
struct CrossParams {
    struct_size: u32,
    reserved: u32,
    other: *mut guild_op_handle_t,
    other_args: *const guild_execute_args_v1_t,
    arrived: *mut i32,
}

#[test]
fn providers_calling_each_others_handles_from_two_threads_do_not_deadlock() {
    let f = fixture_with(&[probe_spec()], DeviceSupport::host());
    let service = Service::of(f.host.kernels());
    let query = Query::cpu(
        CROSS_OP,
        vec![tensor(GUILD_DTYPE_I32, &[4], &[])],
        vec![tensor(GUILD_DTYPE_I32, &[2], &[])],
    );
    let first = service.resolve(&query).unwrap();
    let second = service.resolve(&query).unwrap();
    let (first_raw, second_raw) = (first.raw() as usize, second.raw() as usize);
    let (done, results) = mpsc::channel();
    let mut arrived = Box::new(0i32);
    let arrived_at = ptr::from_mut(&mut *arrived) as usize;
    let table = SendTable(service.table);
    let spawn = |mine: usize, other: usize| {
        let done = done.clone();
        std::thread::spawn(move || {
            let input = [0i32; 4];
            let mut statuses = [7i32; 2];
            let mut nested = [7i32; 2];
            let (input_t, output_t) = (
                tensor(GUILD_DTYPE_I32, &[4], &[]),
                tensor(GUILD_DTYPE_I32, &[2], &[]),
            );
            let inputs = [with_data(input_t, input.as_ptr())];
            let outputs = [with_data(output_t, statuses.as_mut_ptr())];
            let nested_outputs = [with_data(output_t, nested.as_mut_ptr())];
            // The other handle runs without params: it would just write zeros.
            let other_args = args(&inputs, &nested_outputs);
            let params = CrossParams {
                struct_size: size_of::<CrossParams>() as u32,
                reserved: 0,
                other: other as *mut guild_op_handle_t,
                other_args: &other_args,
                arrived: arrived_at as *mut i32,
            };
            let mut a = args(&inputs, &outputs);
            a.params = ptr::from_ref(&params).cast();
            a.params_size = size_of::<CrossParams>();
            let mut error = guild_error_info_t::new();
            let table = table.get();
            // SAFETY: the runner table of a registry that outlives this thread unless the test
            // times out (then everything is leaked); the args point at this thread's locals.
            let status = unsafe {
                (table.execute.unwrap())(table.user, mine as *mut guild_op_handle_t, &a, &mut error)
            };
            let _ = done.send((status, statuses));
        })
    };
    let threads = [spawn(first_raw, second_raw), spawn(second_raw, first_raw)];
    let mut seen = Vec::new();
    for _ in 0..2 {
        match results.recv_timeout(Duration::from_secs(30)) {
            Ok(result) => seen.push(result),
            Err(_) => {
                // Deadlocked: leave the threads and the host behind rather than hang the run.
                std::mem::forget((first, second));
                std::mem::forget(arrived);
                std::mem::forget(f);
                panic!("two providers calling each other's handles deadlocked");
            }
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    for (status, statuses) in &seen {
        assert_eq!(*status, GUILD_STATUS_OK);
        assert_eq!(statuses[1], 1, "the provider made its nested call");
    }
    assert!(
        seen.iter().any(|(_, s)| s[0] == GUILD_STATUS_ERR_BUSY),
        "at least one nested call finds the other handle busy: {seen:?}"
    );
    assert!(seen
        .iter()
        .all(|(_, s)| s[0] == GUILD_STATUS_ERR_BUSY || s[0] == GUILD_STATUS_OK));
    drop(arrived);
    first.release().unwrap();
    second.release().unwrap();
}
