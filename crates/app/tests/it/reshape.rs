//! Reshape: a handle renegotiates new shapes with the provider it already has (Rust and C
//! faces), never with another one; a refusal leaves it as it was; executes with the old shapes
//! are refused afterwards; a reshape is serialised with an execute of the same handle (a
//! runner's table waits for it, a plugin's is refused with BUSY); a released or stale handle
//! is refused.
//!
//! The providers are Rust fakes over the fake loader: `grow` (priority 10) serves up to eight
//! values with 8 bytes of scratch per value at 16, and can be made to block in execute; `eager`
//! (priority 20) serves exactly four values, so it loses at resolution for two and would win
//! for four if a reshape ever ranked again.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use guild_abi::{
    guild_reshape_args_v1_t, guild_tensor_desc_v1_t, GUILD_DTYPE_F32, GUILD_DTYPE_I64,
    GUILD_STATUS_ERR_BUSY, GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_ERR_UNSUPPORTED,
};
use guild_domain::ids::OpName;
use guild_domain::operation::{
    Arity, DType, MemorySpace, ProviderRefusal, Rejection, TensorDesc, TensorRef, TensorRole,
};
use guild_host::operations::{
    DeviceSupport, ExecuteError, OpHandle, ReshapeError, TensorArg, TensorArgMut,
};
use guild_host::{Host, OperationRequest, OperationService};
use guild_ports::fakes::{fake_operation_with, FakePlugin, FakeProvider, FakeScratch};
use guild_test_support::{Spec, Workshop};

use crate::allocations::made_by;

use crate::c_face::{args, reshape_args, reshape_raw, tensor, with_data, Query, Service};
use crate::fake_providers::{candidate, double, fake_host, i64s, request, Aligned, OP};
use crate::gkmodule::ProbeParams;

/// The module's default op (what `Spec::module` declares).
const GROW: &str = "ex.reshape.op.cpu";
const EAGER: &str = "ex.reshape.eager.cpu";
/// The most values `grow` serves.
const MOST: u64 = 8;

/// What `grow` saw, in order, and a latch that holds its execute while armed.
#[derive(Default)]
struct Log {
    events: Mutex<Vec<String>>,
    /// (armed, entered): an armed execute marks itself entered and waits until disarmed.
    latch: Mutex<(bool, bool)>,
    wake: Condvar,
}

impl Log {
    fn push(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }

    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }

    fn arm(&self) {
        *self.latch.lock().unwrap() = (true, false);
    }

    fn wait_entered(&self) {
        let mut latch = self.latch.lock().unwrap();
        while !latch.1 {
            latch = self.wake.wait(latch).unwrap();
        }
    }

    fn disarm(&self) {
        self.latch.lock().unwrap().0 = false;
        self.wake.notify_all();
    }

    /// Called by an execute: waits while armed.
    fn hold(&self) {
        let mut latch = self.latch.lock().unwrap();
        if latch.0 {
            latch.1 = true;
            self.wake.notify_all();
            while latch.0 {
                latch = self.wake.wait(latch).unwrap();
            }
        }
    }
}

struct Fixture {
    host: Host,
    grow: Arc<FakeProvider>,
    eager: Arc<FakeProvider>,
    log: Arc<Log>,
    _shop: Workshop,
}

fn fixture() -> Fixture {
    let shop = Workshop::new();
    let log = Arc::new(Log::default());
    let (seen, scratch_seen, ran) = (log.clone(), log.clone(), log.clone());
    let grow = Arc::new(
        FakeProvider::new()
            .validating(move |q| {
                let n = q.inputs()[0].dims[0];
                seen.push(format!("validate {n}"));
                if n > MOST {
                    return Err(ProviderRefusal::new(
                        GUILD_STATUS_ERR_UNSUPPORTED,
                        format!("grow serves at most {MOST} values, not {n}"),
                    ));
                }
                Ok(())
            })
            .scratch(move |q| {
                let n = q.inputs()[0].dims[0];
                scratch_seen.push(format!("scratch {n}"));
                Ok(FakeScratch {
                    host_bytes: 8 * n,
                    device_bytes: 0,
                    alignment: 16,
                })
            })
            .executing(move |call| {
                let a = call.raw();
                let n = call.inputs()[0].dims[0];
                ran.push(format!("execute {n} begins"));
                // The scratch the service checked is the one the current shapes need.
                assert!(a.scratch_host_size >= 8 * n);
                ran.hold();
                let result = double(call);
                ran.push(format!("execute {n} ends"));
                result
            }),
    );
    let eager = Arc::new(FakeProvider::new().validating(|q| {
        if q.inputs()[0].dims[0] == 4 {
            Ok(())
        } else {
            Err(ProviderRefusal::new(
                GUILD_STATUS_ERR_UNSUPPORTED,
                "eager serves exactly four values",
            ))
        }
    }));
    let plugin = FakePlugin::new()
        .with_kernel(fake_operation_with(candidate(GROW, 10), grow.clone()))
        .with_kernel(fake_operation_with(candidate(EAGER, 20), eager.clone()));
    let (host, _, _) = fake_host(&shop, Spec::module("ex.reshape", "1.0.0").op(EAGER), plugin);
    Fixture {
        host,
        grow,
        eager,
        log,
        _shop: shop,
    }
}

/// Executes `handle` on `n` values 1..=n through the Rust face; the output on success.
fn run(handle: &OpHandle<'_>, n: u64, scratch: &mut Aligned) -> Result<Vec<i64>, ExecuteError> {
    let input: Vec<i64> = (1..=n as i64).collect();
    let mut output = vec![0i64; n as usize];
    handle.execute(
        &[TensorArg::new(&i64s(n), &input)],
        &mut [TensorArgMut::new(&i64s(n), &mut output)],
        Some(&mut scratch.0),
    )?;
    Ok(output)
}

#[test]
fn a_reshaped_handle_runs_the_new_shapes_with_the_same_provider_and_refuses_the_old() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let mut handle = service.resolve(&request(2)).unwrap();
    assert_eq!(
        handle.describe().impl_id.as_str(),
        GROW,
        "eager refused two values"
    );
    assert_eq!(handle.scratch().host_bytes, 16);
    let eager_before = f.eager.calls();
    let mut scratch = Aligned([0; 64]);
    assert_eq!(run(&handle, 2, &mut scratch).unwrap(), [2, 4]);

    // Four values: eager would accept them, but a reshape asks the handle's provider only.
    handle.reshape(&[i64s(4)], &[i64s(4)]).unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), GROW);
    assert_eq!(f.eager.calls(), eager_before, "no other provider was asked");
    assert_eq!(handle.inputs(), [i64s(4)]);
    assert_eq!(handle.outputs(), [i64s(4)]);
    assert_eq!(
        handle.scratch().host_bytes,
        32,
        "scratch is the new shapes'"
    );
    assert_eq!(handle.describe().scratch.host_bytes, 32);
    assert_eq!(run(&handle, 4, &mut scratch).unwrap(), [2, 4, 6, 8]);

    // The old shapes are refused now, before the provider runs.
    let executed = f.grow.calls().execute;
    match run(&handle, 2, &mut scratch).unwrap_err() {
        ExecuteError::DescriptorMismatch { tensor, .. } => {
            assert_eq!(tensor, TensorRef::input(0))
        }
        other => panic!("expected a descriptor mismatch, got {other}"),
    }
    assert_eq!(f.grow.calls().execute, executed);

    // A decode loop: one longer every step, each step renegotiated and run.
    for n in 5..=MOST {
        handle.reshape(&[i64s(n)], &[i64s(n)]).unwrap();
        assert_eq!(handle.scratch().host_bytes, 8 * n);
        let out = run(&handle, n, &mut scratch).unwrap();
        assert_eq!(out.last(), Some(&(2 * n as i64)));
    }
    let events = f.log.events();
    let validates: Vec<&String> = events
        .iter()
        .filter(|e| e.starts_with("validate"))
        .collect();
    assert_eq!(validates.len(), 1 + 1 + (MOST as usize - 4), "{events:?}");
}

#[test]
fn a_refused_reshape_leaves_the_handle_usable_with_its_old_shapes() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let mut handle = service.resolve(&request(2)).unwrap();
    let mut scratch = Aligned([0; 64]);

    // The provider's own refusal, with its reason.
    let err = handle.reshape(&[i64s(9)], &[i64s(9)]).unwrap_err();
    assert_eq!(
        err,
        ReshapeError::Refused(Rejection::ValidateRefused(ProviderRefusal::new(
            GUILD_STATUS_ERR_UNSUPPORTED,
            "grow serves at most 8 values, not 9",
        )))
    );
    // The contract's own refusal (rank 2 where the candidate declares rank 1): no callback.
    let calls = f.grow.calls();
    let rank2 = TensorDesc::new(DType::I64, &[2, 2], MemorySpace::Host);
    match handle.reshape(&[rank2], &[rank2]).unwrap_err() {
        ReshapeError::Refused(r) => assert!(r.is_static(), "{r}"),
        other => panic!("expected a static refusal, got {other}"),
    }
    assert_eq!(f.grow.calls(), calls, "a static refusal calls nothing");
    // What a reshape may not change.
    let f32s = TensorDesc::new(DType::F32, &[2], MemorySpace::Host);
    assert_eq!(
        handle.reshape(&[f32s], &[i64s(2)]).unwrap_err(),
        ReshapeError::Changed {
            tensor: TensorRef::input(0),
            what: "dtype"
        }
    );
    let pinned = TensorDesc::new(DType::I64, &[2], MemorySpace::HostPinned);
    assert_eq!(
        handle.reshape(&[i64s(2)], &[pinned]).unwrap_err(),
        ReshapeError::Changed {
            tensor: TensorRef::output(0),
            what: "memory space"
        }
    );
    assert_eq!(
        handle.reshape(&[i64s(2), i64s(2)], &[i64s(2)]).unwrap_err(),
        ReshapeError::Arity {
            role: TensorRole::Input,
            expected: 1,
            got: 2
        }
    );
    assert!(matches!(
        handle.reshape(&[i64s(0)], &[i64s(0)]).unwrap_err(),
        ReshapeError::Query(_)
    ));

    // Nothing changed: the old shapes, the old scratch, and the handle still runs.
    assert_eq!(handle.inputs(), [i64s(2)]);
    assert_eq!(handle.scratch().host_bytes, 16);
    assert_eq!(run(&handle, 2, &mut scratch).unwrap(), [2, 4]);
    assert!(matches!(
        run(&handle, 9, &mut scratch).unwrap_err(),
        ExecuteError::DescriptorMismatch { .. }
    ));
}

#[test]
fn the_c_face_reshapes_reports_the_new_scratch_and_refuses_the_old_shapes() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    assert!(
        service.table.struct_size as usize >= guild_abi::GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE
    );
    let (t2, t4) = (
        tensor(GUILD_DTYPE_I64, &[2], &[]),
        tensor(GUILD_DTYPE_I64, &[4], &[]),
    );
    let handle = service
        .resolve(&Query::cpu(OP, vec![t2], vec![t2]))
        .unwrap();
    assert_eq!(handle.describe().unwrap().impl_id, GROW);
    assert_eq!(handle.scratch().unwrap().host_bytes, 16);

    // Refused by the provider: its status and reason, and the handle keeps its shapes.
    let t9 = tensor(GUILD_DTYPE_I64, &[9], &[]);
    let err = handle.reshape(&[t9], &[t9]).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_UNSUPPORTED);
    assert!(err.message.contains("at most 8 values, not 9"), "{err}");
    assert!(err.message.contains("keeps its shapes"), "{err}");
    let t_f32 = tensor(GUILD_DTYPE_F32, &[2], &[]);
    let err = handle.reshape(&[t_f32], &[t2]).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert!(err.message.contains("changes its dtype"), "{err}");
    let mut bad = reshape_args(&[t2], &[t2]);
    bad.struct_size = 8;
    let err = reshape_raw(&service, handle.raw(), &bad).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert!(err.message.contains("struct_size is 8"), "{err}");
    let err = reshape_raw(&service, handle.raw(), std::ptr::null()).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(handle.scratch().unwrap().host_bytes, 16);

    let mut scratch = Aligned([0; 64]);
    let input = [1i64, 2, 3, 4];
    let mut output = [0i64; 4];
    let old = (
        [with_data(t2, input.as_ptr())],
        [with_data(t2, output.as_mut_ptr())],
    );
    handle
        .execute(&old.0, &old.1, Some(&mut scratch.0))
        .unwrap();
    assert_eq!(output[..2], [2, 4]);

    // Accepted: the new scratch, the new shapes run, the old ones are refused.
    handle.reshape(&[t4], &[t4]).unwrap();
    assert_eq!(handle.describe().unwrap().impl_id, GROW, "never reselected");
    assert_eq!(
        f.eager.calls().validate,
        1,
        "eager was asked only at resolution"
    );
    assert_eq!(handle.scratch().unwrap().host_bytes, 32);
    assert_eq!(handle.describe().unwrap().raw.scratch.host_bytes, 32);
    let new = (
        [with_data(t4, input.as_ptr())],
        [with_data(t4, output.as_mut_ptr())],
    );
    handle
        .execute(&new.0, &new.1, Some(&mut scratch.0))
        .unwrap();
    assert_eq!(output, [2, 4, 6, 8]);
    let err = handle
        .execute(&old.0, &old.1, Some(&mut scratch.0))
        .unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert!(err.message.contains("does not match"), "{err}");
    // The scratch the old shapes needed is too small for the new ones.
    let err = handle
        .execute(&new.0, &new.1, Some(&mut scratch.0[..16]))
        .unwrap_err();
    assert!(err.message.contains("32 bytes of host scratch"), "{err}");

    // A released handle, and a stale one whose slot a newer handle reuses, are refused.
    let raw = handle.raw();
    handle.release().unwrap();
    let err = reshape_raw(&service, raw, &reshape_args(&[t2], &[t2])).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert!(err.message.contains("not live"), "{err}");
    let newer = service
        .resolve(&Query::cpu(OP, vec![t2], vec![t2]))
        .unwrap();
    assert_ne!(newer.raw(), raw);
    let err = reshape_raw(&service, raw, &reshape_args(&[t4], &[t4])).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(
        newer.scratch().unwrap().host_bytes,
        16,
        "the stale reshape touched nothing"
    );
    let err = reshape_raw(&service, std::ptr::null_mut(), &reshape_args(&[t2], &[t2])).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    newer.release().unwrap();
}

/// A C handle for two values.
fn resolve_two<'s, 'r>(service: &'s Service<'r>) -> crate::c_face::Handle<'s, 'r> {
    let t2 = tensor(GUILD_DTYPE_I64, &[2], &[]);
    service
        .resolve(&Query::cpu(OP, vec![t2], vec![t2]))
        .unwrap()
}

/// Carries a raw C handle to another thread.
#[derive(Clone, Copy)]
struct Sent(usize);

/// Executes a raw handle through the table on `n` values 1..=n with 64 bytes of scratch, as a
/// runner's thread would: the status and the output.
fn execute_raw(service: &Service<'_>, raw: Sent, n: u64) -> (i32, Vec<i64>) {
    let t = tensor(GUILD_DTYPE_I64, &[n], &[]);
    let input: Vec<i64> = (1..=n as i64).collect();
    let mut output = vec![0i64; n as usize];
    let inputs = [with_data(t, input.as_ptr())];
    let outputs = [with_data(t, output.as_mut_ptr())];
    let mut scratch = Aligned([0; 64]);
    let mut a = args(&inputs, &outputs);
    a.scratch_host = scratch.0.as_mut_ptr().cast();
    a.scratch_host_size = 64;
    let mut error = guild_abi::guild_error_info_t::new();
    let execute = service.table.execute.unwrap();
    // SAFETY: a live handle of this service; the args point at this thread's buffers.
    let status = unsafe {
        execute(
            service.table.user,
            raw.0 as *mut guild_abi::guild_op_handle_t,
            &a,
            &mut error,
        )
    };
    (status, output)
}

#[test]
fn a_reshape_through_a_runners_table_waits_for_a_running_execute_of_the_same_handle() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let handle = resolve_two(&service);
    let raw = Sent(handle.raw() as usize);
    let before = f.log.events().len();
    f.log.arm();
    std::thread::scope(|s| {
        let service = &service;
        let executing = s.spawn(move || execute_raw(service, raw, 2));
        // The execute is inside the provider now, holding the handle.
        f.log.wait_entered();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let reshaping = s.spawn(move || {
            let t4 = tensor(GUILD_DTYPE_I64, &[4], &[]);
            let args: guild_reshape_args_v1_t = reshape_args(&[t4], &[t4]);
            let result = reshape_raw(service, raw.0 as *mut _, &args);
            let _ = done_tx.send(());
            result
        });
        // While the execute holds the handle the reshape cannot finish (it waits its turn).
        assert!(
            done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "the reshape finished while an execute of the handle was running"
        );
        f.log.disarm();
        let (status, output) = executing.join().unwrap();
        assert_eq!(status, 0);
        assert_eq!(
            output,
            [2, 4],
            "the execute ran with the shapes it was given"
        );
        reshaping.join().unwrap().unwrap();
    });
    // The order the provider saw: the whole execute, then the reshape's negotiation.
    assert_eq!(
        f.log.events()[before..],
        [
            "execute 2 begins",
            "execute 2 ends",
            "validate 4",
            "scratch 4"
        ]
    );
    assert_eq!(handle.scratch().unwrap().host_bytes, 32);
    handle.release().unwrap();
}

#[test]
fn executes_racing_reshapes_each_see_one_whole_contract() {
    // Many rounds of executes on one thread and reshapes between two shapes on another,
    // through the runner's table: every execute either matches the handle's shapes at that
    // moment and runs, or is refused as a mismatch; none reaches the provider with a shape the
    // handle did not have.
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let handle = resolve_two(&service);
    let raw = Sent(handle.raw() as usize);
    let rounds = 300;
    std::thread::scope(|s| {
        let service = &service;
        s.spawn(move || {
            for i in 0..rounds {
                let t = tensor(GUILD_DTYPE_I64, &[if i % 2 == 0 { 4 } else { 2 }], &[]);
                reshape_raw(service, raw.0 as *mut _, &reshape_args(&[t], &[t])).unwrap();
            }
        });
        let (mut ran, mut refused) = (0, 0);
        for i in 0..rounds {
            let n = if i % 2 == 0 { 2 } else { 4 };
            let (status, output) = execute_raw(service, raw, n);
            match status {
                0 => {
                    ran += 1;
                    assert_eq!(output, [2, 4, 6, 8][..n as usize]);
                }
                GUILD_STATUS_ERR_INVALID_ARGUMENT => refused += 1,
                other => panic!("unexpected status {other}"),
            }
        }
        assert_eq!(ran + refused, rounds);
    });
    handle.release().unwrap();
}

#[test]
fn a_provider_cannot_reshape_the_handle_it_runs_on_through_either_table() {
    let f =
        crate::operations::fixture_with(&[crate::gkmodule::probe_spec()], DeviceSupport::host());
    let service = Service::of(f.host.kernels());
    let query = Query::cpu(
        "example.probe.reenter",
        vec![tensor(guild_abi::GUILD_DTYPE_I32, &[4], &[])],
        vec![tensor(guild_abi::GUILD_DTYPE_I32, &[4], &[])],
    );
    let handle = service.resolve(&query).unwrap();
    let input = [0i32; 4];
    let mut statuses = [7i32; 4];
    let params = ProbeParams {
        struct_size: size_of::<ProbeParams>() as u32,
        reserved: 0,
        service: &service.table,
        handle: handle.raw(),
    };
    let inputs: [guild_tensor_desc_v1_t; 1] = [with_data(query.inputs[0], input.as_ptr())];
    let outputs = [with_data(query.outputs[0], statuses.as_mut_ptr())];
    let mut a = args(&inputs, &outputs);
    a.params = std::ptr::from_ref(&params).cast();
    a.params_size = size_of::<ProbeParams>();
    handle.execute_args(&a).unwrap();
    assert_eq!(
        statuses, [GUILD_STATUS_ERR_BUSY; 4],
        "release, execute, and reshape through the runner's table and the plugin's own, from \
         inside the handle's execute: all refused, none waits"
    );
    // The handle survived and still runs, and reshapes once its execute is over.
    handle.execute_args(&a).unwrap();
    handle.reshape(&inputs, &outputs).unwrap();
    handle.release().unwrap();
}

/// Once a handle has been reshaped, a reshape allocates nothing on either face, whether it grows
/// or shrinks the tensors: it refills the buffers of the contract it replaces (G28). Counted on
/// this thread alone, with a provider that allocates nothing itself.
#[test]
fn a_reshape_allocates_nothing_once_the_handle_has_been_reshaped() {
    let shop = Workshop::new();
    let quiet = FakeProvider::new().scratch(|q| {
        Ok(FakeScratch {
            host_bytes: 8 * q.inputs()[0].dims[0],
            device_bytes: 0,
            alignment: 16,
        })
    });
    let plugin = FakePlugin::new().with_kernel(fake_operation_with(
        candidate("ex.steady.op.cpu", 10),
        Arc::new(quiet),
    ));
    let (host, _, _) = fake_host(&shop, Spec::module("ex.steady", "1.0.0"), plugin);

    let rust = OperationService::new(host.kernels());
    let mut handle = rust.resolve(&request(2)).unwrap();
    let shapes = [i64s(2), i64s(7)];
    for d in shapes {
        handle.reshape(&[d], &[d]).unwrap();
    }
    for d in shapes.iter().cycle().take(8) {
        let made = made_by(|| handle.reshape(&[*d], &[*d]).unwrap());
        assert_eq!(made, 0, "a Rust reshape to {:?} allocated", d.shape());
        assert_eq!(handle.scratch().host_bytes, 8 * d.dims[0]);
    }

    let service = Service::of(host.kernels());
    let c_shapes = [2, 7].map(|n| tensor(GUILD_DTYPE_I64, &[n], &[]));
    let handle = service
        .resolve(&Query::cpu(OP, vec![c_shapes[0]], vec![c_shapes[0]]))
        .unwrap();
    for t in c_shapes {
        handle.reshape(&[t], &[t]).unwrap();
    }
    for t in c_shapes.iter().cycle().take(8) {
        let made = made_by(|| handle.reshape(&[*t], &[*t]).unwrap());
        assert_eq!(made, 0, "a C reshape to {} values allocated", t.dims[0]);
        assert_eq!(handle.scratch().unwrap().host_bytes, 8 * t.dims[0]);
    }
}

/// Every fact of a C query a reshape does not change (the names, the numbers, the device
/// record), with the params, as a provider's callback saw them.
fn query_facts(q: &guild_ports::provider::QueryCall<'_>) -> String {
    let r = q.raw();
    let text = |p: *const std::ffi::c_char| {
        // SAFETY: NULL or a NUL-terminated string for the callback (the query's contract).
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_owned())
    };
    let caps = q.device_caps().map(|c| {
        (
            c.struct_size,
            c.backend,
            c.device_id,
            c.cuda_sm,
            c.cpu_isa,
            c.total_memory_bytes,
            c.free_memory_bytes,
            c.next_ext.is_null(),
        )
    });
    format!(
        "{} {} {:?} {:?} {:#x}..{:#x} backends {:#x} sync {} caps {:#x} numerics {:#x} ram {} \
         vram {} device {caps:?} params {:?} ({} and {} tensors)",
        r.struct_size,
        r.version,
        text(r.op_name),
        text(r.exact_impl_id),
        r.min_op_version,
        r.max_op_version,
        r.backends,
        r.sync_mode,
        r.required_capabilities,
        r.required_numerics,
        r.ram_budget,
        r.vram_budget,
        q.params(),
        q.inputs().len(),
        q.outputs().len(),
    )
}

/// The params record of the query-facts test, aligned as the C table requires.
#[repr(C, align(8))]
struct Params([u8; 8]);

/// A reshape hands the provider's callbacks the C query of its resolution but for the tensors
/// and the params: the same names, numbers and device record, on either face, at a handle's
/// first reshape and at every later one (which reuse the query the first made), with the
/// params of each reshape or none. Resolved with an exact id and a budget, so that those are
/// not the defaults.
#[test]
fn a_reshape_asks_with_the_resolutions_query_and_its_own_tensors_and_params() {
    let shop = Workshop::new();
    let seen = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    let (validated, scratched) = (seen.clone(), seen.clone());
    let provider = FakeProvider::new()
        .validating(move |q| {
            let n = q.inputs()[0].dims[0];
            validated.lock().unwrap().push((query_facts(&q), n));
            Ok(())
        })
        .scratch(move |q| {
            let n = q.inputs()[0].dims[0];
            scratched.lock().unwrap().push((query_facts(&q), n));
            Ok(FakeScratch {
                host_bytes: 8 * n,
                device_bytes: 0,
                alignment: 16,
            })
        });
    const ID: &str = "ex.asked.op.cpu";
    let plugin =
        FakePlugin::new().with_kernel(fake_operation_with(candidate(ID, 10), Arc::new(provider)));
    let (host, _, _) = fake_host(&shop, Spec::module("ex.asked", "1.0.0"), plugin);
    let params = Params(*b"reshaped");
    let take = || std::mem::take(&mut *seen.lock().unwrap());
    // Each callback of a resolution and of the reshapes after it, with the tensors' lengths.
    let check = |face: &str, asked: Vec<(String, u64)>, lengths: &[(u64, bool)]| {
        assert_eq!(asked.len(), 2 * lengths.len(), "{face}: {asked:?}");
        let resolution = asked[0].0.clone();
        assert!(
            resolution.contains(ID) && resolution.contains("ram 4096"),
            "{face}: {resolution}"
        );
        for (pair, &(n, with_params)) in asked.chunks(2).zip(lengths) {
            let expected = if with_params {
                resolution.replace("params []", &format!("params {:?}", params.0))
            } else {
                resolution.clone()
            };
            for (facts, length) in pair {
                assert_eq!((facts, *length), (&expected, n), "{face}");
            }
        }
    };

    let rust = OperationService::new(host.kernels());
    let exact = request(2)
        .exact(guild_domain::ids::ImplId::new(ID).unwrap())
        .ram_budget(guild_domain::operation::Budget::bytes(4096));
    let mut handle = rust.resolve(&exact).unwrap();
    handle.reshape(&[i64s(3)], &[i64s(3)]).unwrap();
    handle.reshape(&[i64s(4)], &[i64s(4)]).unwrap();
    handle
        .reshape_with_params(&[i64s(5)], &[i64s(5)], &params.0)
        .unwrap();
    handle.reshape(&[i64s(6)], &[i64s(6)]).unwrap();
    check(
        "Rust",
        take(),
        &[(2, false), (3, false), (4, false), (5, true), (6, false)],
    );

    let service = Service::of(host.kernels());
    let t = |n: u64| tensor(GUILD_DTYPE_I64, &[n], &[]);
    let mut query = Query::cpu(OP, vec![t(2)], vec![t(2)]);
    query.exact = Some(std::ffi::CString::new(ID).unwrap());
    query.ram_budget = 4096;
    let handle = service.resolve(&query).unwrap();
    handle.reshape(&[t(3)], &[t(3)]).unwrap();
    let mut with_params = reshape_args(&[t(4)], &[t(4)]);
    with_params.params = std::ptr::from_ref(&params).cast();
    with_params.params_size = size_of::<Params>();
    reshape_raw(&service, handle.raw(), &with_params).unwrap();
    handle.reshape(&[t(5)], &[t(5)]).unwrap();
    check(
        "C",
        take(),
        &[(2, false), (3, false), (4, true), (5, false)],
    );
    handle.release().unwrap();
}

/// A reshape checks every new tensor on its own before it holds any against the candidate, as
/// a resolution's query is checked before its candidates are: a tensor the candidate refuses
/// (rank 2, where it declares rank 1) ahead of one that is invalid (an extent of 0) reports the
/// invalid one, on either face, and the handle keeps its shapes.
#[test]
fn a_reshape_reports_an_invalid_tensor_before_a_refusal_of_an_earlier_one() {
    let f = fixture();
    let rust = OperationService::new(f.host.kernels());
    let mut handle = rust.resolve(&request(2)).unwrap();
    let rank2 = TensorDesc::new(DType::I64, &[2, 2], MemorySpace::Host);
    match handle.reshape(&[rank2], &[i64s(0)]).unwrap_err() {
        ReshapeError::Query(e) => assert!(e.to_string().contains("output 0"), "{e}"),
        other => panic!("expected the invalid output, got {other}"),
    }
    match handle.reshape(&[rank2], &[i64s(2)]).unwrap_err() {
        ReshapeError::Refused(r) => assert!(r.is_static(), "{r}"),
        other => panic!("expected the candidate's refusal, got {other}"),
    }
    assert_eq!(handle.inputs(), [i64s(2)]);

    let service = Service::of(f.host.kernels());
    let t2 = tensor(GUILD_DTYPE_I64, &[2], &[]);
    let handle = service
        .resolve(&Query::cpu(OP, vec![t2], vec![t2]))
        .unwrap();
    let c_rank2 = tensor(GUILD_DTYPE_I64, &[2, 2], &[]);
    let empty = tensor(GUILD_DTYPE_I64, &[0], &[]);
    let err = handle.reshape(&[c_rank2], &[empty]).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT, "{err}");
    assert!(err.message.contains("output 0"), "{err}");
    let err = handle.reshape(&[c_rank2], &[t2]).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_UNSUPPORTED, "{err}");
    assert_eq!(handle.scratch().unwrap().host_bytes, 16);
    handle.release().unwrap();
}

/// Whether a refusal is for the reason a case expects.
type Reason = fn(&Rejection) -> bool;

/// A reshape holds every new tensor against the candidate's declaration as a resolution does:
/// its rank, each extent, the batch, the layout and a known data address are each refused
/// for the reason the candidate gives (and the handle keeps its shapes), on either face; what
/// the declaration admits is accepted.
#[test]
fn a_reshape_is_refused_for_each_bound_of_the_candidates_declaration() {
    let shop = Workshop::new();
    let quiet = FakeProvider::new().scratch(|_| {
        Ok(FakeScratch {
            host_bytes: 0,
            device_bytes: 0,
            alignment: 0,
        })
    });
    let mut bounded = candidate("ex.bounded.op.cpu", 10);
    bounded.max_rank = 2;
    bounded.max_dim[0] = 4;
    bounded.max_batch = 3;
    bounded.min_alignment = 8;
    let plugin = FakePlugin::new().with_kernel(fake_operation_with(bounded, Arc::new(quiet)));
    let (host, _, _) = fake_host(&shop, Spec::module("ex.bounded", "1.0.0"), plugin);

    let rust = OperationService::new(host.kernels());
    let mut handle = rust.resolve(&request(2)).unwrap();
    let t = |dims: &[u64]| TensorDesc::new(DType::I64, dims, MemorySpace::Host);
    let cases: [(TensorDesc, Reason); 5] = [
        (t(&[1, 1, 1]), |r| {
            matches!(r, Rejection::RankOutOfRange { .. })
        }),
        (t(&[5]), |r| {
            matches!(r, Rejection::DimensionTooLarge { .. })
        }),
        (t(&[2, 4]), |r| matches!(r, Rejection::BatchTooLarge { .. })),
        (t(&[2, 2]).with_strides(&[0, 3]), |r| {
            matches!(r, Rejection::LayoutUnsupported { .. })
        }),
        (t(&[2]).with_data_addr(4), |r| {
            matches!(r, Rejection::Misaligned { .. })
        }),
    ];
    for (refused, reason) in cases {
        for (inputs, outputs) in [([refused], [i64s(2)]), ([i64s(2)], [refused])] {
            match handle.reshape(&inputs, &outputs).unwrap_err() {
                ReshapeError::Refused(r) => assert!(reason(&r), "{refused:?}: {r}"),
                other => panic!("{refused:?}: expected the candidate's refusal, got {other}"),
            }
        }
    }
    assert_eq!(handle.inputs(), [i64s(2)]);
    let admitted = t(&[4, 3]).with_strides(&[0, 4]).with_data_addr(64);
    handle.reshape(&[admitted], &[admitted]).unwrap();
    assert_eq!(handle.inputs(), [admitted]);

    let service = Service::of(host.kernels());
    let t2 = tensor(GUILD_DTYPE_I64, &[2], &[]);
    let handle = service
        .resolve(&Query::cpu(OP, vec![t2], vec![t2]))
        .unwrap();
    let mut words = [0u64; 2];
    let misaligned = with_data(t2, words.as_mut_ptr().cast::<u8>().wrapping_add(4));
    let err = handle.reshape(&[t2], &[misaligned]).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_UNSUPPORTED, "{err}");
    assert!(err.message.contains("output 0"), "{err}");
    let five = tensor(GUILD_DTYPE_I64, &[5], &[]);
    let err = handle.reshape(&[five], &[t2]).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_UNSUPPORTED, "{err}");
    handle
        .reshape(&[t2], &[with_data(t2, words.as_mut_ptr())])
        .unwrap();
    handle.release().unwrap();
}

/// A Rust reshape whose provider unwinds out of a callback (a Rust provider's panic) leaves the
/// handle as it was: its next execute hands the provider the C tensors of the shapes it still
/// has, not the ones the panicking reshape asked about.
#[test]
fn a_rust_reshape_that_unwinds_from_the_provider_leaves_the_calls_tensors_as_they_were() {
    let shop = Workshop::new();
    let executed = Arc::new(Mutex::new(Vec::new()));
    let seen = executed.clone();
    let provider = FakeProvider::new()
        .validating(|q| {
            let n = q.inputs()[0].dims[0];
            assert_ne!(n, 5, "validate panics on five values");
            Ok(())
        })
        .scratch(|q| {
            Ok(FakeScratch {
                host_bytes: 8 * q.inputs()[0].dims[0],
                device_bytes: 0,
                alignment: 16,
            })
        })
        .executing(move |call| {
            seen.lock().unwrap().push(call.inputs()[0].dims[0]);
            double(call)
        });
    let plugin = FakePlugin::new().with_kernel(fake_operation_with(
        candidate("ex.unwinding.op.cpu", 10),
        Arc::new(provider),
    ));
    let (host, _, _) = fake_host(&shop, Spec::module("ex.unwinding", "1.0.0"), plugin);
    let rust = OperationService::new(host.kernels());
    let mut handle = rust.resolve(&request(2)).unwrap();
    let mut scratch = Aligned([0; 64]);
    handle.reshape(&[i64s(3)], &[i64s(3)]).unwrap();

    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        handle.reshape(&[i64s(5)], &[i64s(5)])
    }));
    assert!(unwound.is_err(), "the provider's validate panicked");
    assert_eq!(handle.inputs(), [i64s(3)]);
    assert_eq!(run(&handle, 3, &mut scratch).unwrap(), [2, 4, 6]);
    assert_eq!(
        *executed.lock().unwrap(),
        [3],
        "the provider saw three values"
    );
    // It still reshapes, and runs the new shapes.
    handle.reshape(&[i64s(2)], &[i64s(2)]).unwrap();
    assert_eq!(run(&handle, 2, &mut scratch).unwrap(), [2, 4]);
    assert_eq!(*executed.lock().unwrap(), [3, 2]);
}

/// Executes a C handle on `n` values 1..=n: the output, or the service's refusal.
fn run_c(
    handle: &crate::c_face::Handle<'_, '_>,
    n: u64,
    scratch: &mut Aligned,
) -> Result<Vec<i64>, crate::c_face::CError> {
    let t = tensor(GUILD_DTYPE_I64, &[n], &[]);
    let input: Vec<i64> = (1..=n as i64).collect();
    let mut output = vec![0i64; n as usize];
    handle.execute(
        &[with_data(t, input.as_ptr())],
        &[with_data(t, output.as_mut_ptr())],
        Some(&mut scratch.0),
    )?;
    Ok(output)
}

/// Reshapes alternating between two shapes, each followed by refused ones (the provider's
/// refusal once every tensor was checked and written into the spare contract; a tensor invalid
/// after a valid one was written), leave the handle running exactly the shapes last accepted,
/// on both faces: what a refusal wrote is never what calls see, and the next accepted reshape
/// makes its contract in the same spare.
#[test]
fn reshapes_alternating_shapes_with_refusals_between_keep_every_result_right() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let mut handle = service.resolve(&request(2)).unwrap();
    let c_service = Service::of(f.host.kernels());
    let c_handle = resolve_two(&c_service);
    let mut scratch = Aligned([0; 64]);
    for round in 0..8 {
        let (n, other) = if round % 2 == 0 { (3, 5) } else { (5, 3) };
        let expected: Vec<i64> = (1..=n as i64).map(|v| 2 * v).collect();

        handle.reshape(&[i64s(n)], &[i64s(n)]).unwrap();
        let err = handle.reshape(&[i64s(9)], &[i64s(9)]).unwrap_err();
        assert!(
            matches!(err, ReshapeError::Refused(Rejection::ValidateRefused(_))),
            "{err}"
        );
        let err = handle.reshape(&[i64s(other)], &[i64s(0)]).unwrap_err();
        assert!(matches!(err, ReshapeError::Query(_)), "{err}");
        assert_eq!(handle.inputs(), [i64s(n)], "round {round}");
        assert_eq!(handle.outputs(), [i64s(n)], "round {round}");
        assert_eq!(handle.scratch().host_bytes, 8 * n, "round {round}");
        assert_eq!(
            run(&handle, n, &mut scratch).unwrap(),
            expected,
            "round {round}"
        );
        assert!(
            matches!(
                run(&handle, other, &mut scratch).unwrap_err(),
                ExecuteError::DescriptorMismatch { .. }
            ),
            "round {round}"
        );

        let (t, t_other, t9, t0) = (
            tensor(GUILD_DTYPE_I64, &[n], &[]),
            tensor(GUILD_DTYPE_I64, &[other], &[]),
            tensor(GUILD_DTYPE_I64, &[9], &[]),
            tensor(GUILD_DTYPE_I64, &[0], &[]),
        );
        c_handle.reshape(&[t], &[t]).unwrap();
        let err = c_handle.reshape(&[t9], &[t9]).unwrap_err();
        assert_eq!(err.status, GUILD_STATUS_ERR_UNSUPPORTED, "{err}");
        let err = c_handle.reshape(&[t_other], &[t0]).unwrap_err();
        assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT, "{err}");
        let err = c_handle
            .reshape(&[t_other, t_other], &[t_other])
            .unwrap_err();
        assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT, "{err}");
        assert_eq!(c_handle.scratch().unwrap().host_bytes, 8 * n);
        assert_eq!(
            run_c(&c_handle, n, &mut scratch).unwrap(),
            expected,
            "round {round}"
        );
        let err = run_c(&c_handle, other, &mut scratch).unwrap_err();
        assert!(
            err.message.contains("does not match"),
            "round {round}: {err}"
        );
    }
}

/// The module of an operation with six inputs and three outputs (more than either face keeps
/// on its frame or a handle lays out for most operations), whose provider adds input `k + 3`
/// to input `k` into output `k`.
fn wide_host(shop: &Workshop) -> Host {
    let wide = FakeProvider::new().executing(|call| {
        let (ins, outs) = (call.inputs(), call.outputs());
        for (k, out) in outs.iter().enumerate() {
            let n = out.dims[0] as usize;
            // SAFETY: the service checked every tensor against the negotiated contract (rank
            // 1, `n` contiguous i64, non-NULL and aligned, host memory), live for the call.
            let (a, b, to) = unsafe {
                (
                    std::slice::from_raw_parts(ins[k].data.cast::<i64>(), n),
                    std::slice::from_raw_parts(ins[k + 3].data.cast::<i64>(), n),
                    std::slice::from_raw_parts_mut(out.data.cast::<i64>(), n),
                )
            };
            for i in 0..n {
                to[i] = a[i] + b[i];
            }
        }
        Ok(())
    });
    let mut c = candidate("ex.wide.op.cpu", 10);
    c.inputs = Arity::exactly(6);
    c.outputs = Arity::exactly(3);
    let plugin = FakePlugin::new().with_kernel(fake_operation_with(c, Arc::new(wide)));
    fake_host(shop, Spec::module("ex.wide", "1.0.0"), plugin).0
}

/// The six inputs of the wide operation on `n` values (input `j` holds `100 j + i`) and the
/// outputs it must make of them.
fn wide_values(n: u64) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let ins: Vec<Vec<i64>> = (0..6)
        .map(|j| (0..n as i64).map(|i| 100 * j + i).collect())
        .collect();
    let outs = (0..3)
        .map(|k| ins[k].iter().zip(&ins[k + 3]).map(|(a, b)| a + b).collect())
        .collect();
    (ins, outs)
}

/// An operation with more tensors than a resolution keeps on its frame resolves, runs,
/// reshapes (growing and shrinking) and runs the new shapes right on both faces, and still
/// refuses another count of tensors.
#[test]
fn an_operation_with_more_tensors_than_kept_in_place_resolves_runs_and_reshapes() {
    let shop = Workshop::new();
    let host = wide_host(&shop);
    let rust = OperationService::new(host.kernels());
    let request =
        OperationRequest::cpu(OpName::new(OP).unwrap(), vec![i64s(2); 6], vec![i64s(2); 3]);
    let mut handle = rust.resolve(&request).unwrap();
    let c_service = Service::of(host.kernels());
    let t2 = tensor(GUILD_DTYPE_I64, &[2], &[]);
    let c_handle = c_service
        .resolve(&Query::cpu(OP, vec![t2; 6], vec![t2; 3]))
        .unwrap();
    for n in [2u64, 5, 1, 7] {
        if n != 2 {
            handle.reshape(&[i64s(n); 6], &[i64s(n); 3]).unwrap();
            let t = tensor(GUILD_DTYPE_I64, &[n], &[]);
            c_handle.reshape(&[t; 6], &[t; 3]).unwrap();
        }
        assert_eq!(handle.inputs(), [i64s(n); 6]);
        assert_eq!(handle.outputs(), [i64s(n); 3]);
        let (ins, expected) = wide_values(n);
        let d = i64s(n);
        let mut outs = vec![vec![0i64; n as usize]; 3];
        let args: Vec<TensorArg<'_>> = ins.iter().map(|v| TensorArg::new(&d, v)).collect();
        let mut out_args: Vec<TensorArgMut<'_>> =
            outs.iter_mut().map(|v| TensorArgMut::new(&d, v)).collect();
        handle.execute(&args, &mut out_args, None).unwrap();
        drop(out_args);
        assert_eq!(outs, expected, "{n} values, Rust face");

        let t = tensor(GUILD_DTYPE_I64, &[n], &[]);
        let mut outs = vec![vec![0i64; n as usize]; 3];
        let c_ins: Vec<_> = ins.iter().map(|v| with_data(t, v.as_ptr())).collect();
        let c_outs: Vec<_> = outs
            .iter_mut()
            .map(|v| with_data(t, v.as_mut_ptr()))
            .collect();
        c_handle.execute(&c_ins, &c_outs, None).unwrap();
        assert_eq!(outs, expected, "{n} values, C face");
    }
    assert_eq!(
        handle.reshape(&[i64s(2); 5], &[i64s(2); 3]).unwrap_err(),
        ReshapeError::Arity {
            role: TensorRole::Input,
            expected: 6,
            got: 5
        }
    );
    let err = c_handle.reshape(&[t2; 6], &[t2; 4]).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT, "{err}");
    assert_eq!(
        handle.inputs(),
        [i64s(7); 6],
        "a refused count changed nothing"
    );
}
