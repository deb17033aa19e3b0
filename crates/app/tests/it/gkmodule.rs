//! The gkmodule end-to-end test: keys made, the C scan modules signed and archived as
//! `.gkmodule` packages, installed into a fresh store and loaded with dlopen, then driven
//! through the **C** operation service exactly as a C runner or module would: resolve, describe,
//! scratch, execute, release. Outputs are checked against a Rust reference over generated
//! shapes and strides; ranking (priority, impl-id tie-break, exact ids), the dependent module,
//! handles that hold their package through an unload, the service's guards against misuse, and
//! the stream bookkeeping each get a test.

use std::ptr;
use std::sync::Arc;

use guild_abi::{
    guild_device_caps_v1_t, guild_execute_args_v1_t, guild_operation_query_v1_t, guild_stream_t,
    GUILD_BACKEND_CPU, GUILD_BACKEND_CUDA, GUILD_DTYPE_F32, GUILD_DTYPE_F64, GUILD_DTYPE_I32,
    GUILD_DTYPE_I64, GUILD_MEMORY_MANAGED, GUILD_STATUS_ERR_ABI_MISMATCH,
    GUILD_STATUS_ERR_BUFFER_TOO_SMALL, GUILD_STATUS_ERR_BUSY, GUILD_STATUS_ERR_DEVICE,
    GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_ERR_NOT_FOUND, GUILD_STATUS_ERR_OUT_OF_MEMORY,
    GUILD_STATUS_ERR_STATE, GUILD_STATUS_ERR_UNSUPPORTED, GUILD_SYNC_GRAPH_CAPTURABLE,
    GUILD_SYNC_HOST_BLOCKING, GUILD_SYNC_STREAM_ORDERED,
};
use guild_domain::lease::QuiescentAction;
use guild_domain::operation::{CpuIsa, DType};
use guild_host::operations::{DeviceSupport, TensorArg, TensorArgMut};
use guild_host::registry::KernelRegistry;
use guild_host::{HostError, InstallOptions, OperationRequest, OperationService};
use guild_ports::device::StreamRef;
use guild_ports::fakes::{FakeStreams, StreamEvent};
use guild_test_support::plugins::{alt_spec, plugin_library, plugin_module, scan_spec};
use guild_test_support::{id, ModDep, Spec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::c_face::{args, release_raw, tensor, with_data, CError, Query, Service};
use crate::operations::{
    desc, fixture_with, op, reference, row_offsets, Fixture, EXCLUSIVE_OP, INCLUSIVE_OP,
};

use guild_test_support::plugins::ALT_INCLUSIVE;
use guild_test_support::plugins::EXCLUSIVE;
use guild_test_support::plugins::INCLUSIVE;
const TIE_INCLUSIVE: &str = "example.early_scan.inclusive.cpu";
use guild_test_support::plugins::TOTAL_OP;
const TOTAL: &str = "example.dependent.total.cpu";
const REENTER_OP: &str = "example.probe.reenter";
const STREAM_OP: &str = "example.probe.stream_copy";

fn tie_spec() -> Spec {
    let mut spec =
        Spec::module("example.early_scan", "1.0.0").library(&plugin_library("scan_module_tie"));
    spec.provided_ops = vec![
        TIE_INCLUSIVE.into(),
        "example.early_scan.exclusive.cpu".into(),
    ];
    spec
}

pub(crate) fn dependent_spec() -> Spec {
    let mut spec = Spec::module("example.dependent", "1.0.0")
        .library(&plugin_library("scan_dependent"))
        .module_dep(ModDep::on("example.scan", "1.0.0").max("1.99.0"));
    spec.provided_ops = vec![TOTAL.into()];
    spec
}

pub(crate) fn probe_spec() -> Spec {
    let mut spec = Spec::module("example.service_probe", "1.0.0")
        .library(&plugin_library("service_probe"))
        .backend("cuda");
    spec.provided_ops = vec![
        "example.service_probe.reenter.cpu".into(),
        "example.service_probe.stream_copy.cuda".into(),
        "example.service_probe.cross.cpu".into(),
        "example.service_probe.device_copy.cuda".into(),
    ];
    spec
}

fn fixture() -> Fixture {
    fixture_with(
        &[scan_spec("1.0.0"), alt_spec("1.0.0"), dependent_spec()],
        DeviceSupport::host(),
    )
}

/// A query for `op` over one input and one output of the same shape.
fn same_shape(op: &str, dtype: u32, dims: &[u64]) -> Query {
    Query::cpu(
        op,
        vec![tensor(dtype, dims, &[])],
        vec![tensor(dtype, dims, &[])],
    )
}

// ---------------------------------------------------------------------------------------------
// Scans against the reference
// ---------------------------------------------------------------------------------------------

/// One generated case: which scan, the element type, the shape, and padding per outer axis.
#[derive(Debug, Clone)]
struct Case {
    exclusive: bool,
    dtype: u32,
    dims: Vec<u64>,
    in_pad: Vec<u64>,
    out_pad: Vec<u64>,
    /// Ask for the alternative provider by its exact id (when its contract allows the case).
    exact_alt: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=5)
        .prop_flat_map(|rank| {
            (
                any::<bool>(),
                prop_oneof![
                    Just(GUILD_DTYPE_F32),
                    Just(GUILD_DTYPE_F64),
                    Just(GUILD_DTYPE_I32),
                    Just(GUILD_DTYPE_I64)
                ],
                proptest::collection::vec(1u64..=6, rank),
                proptest::collection::vec(0u64..=3, rank),
                proptest::collection::vec(0u64..=3, rank),
                any::<bool>(),
                any::<u64>(),
            )
        })
        .prop_map(
            |(exclusive, dtype, dims, in_pad, out_pad, exact_alt, seed)| Case {
                exclusive,
                dtype,
                dims,
                in_pad,
                out_pad,
                exact_alt,
                seed,
            },
        )
}

/// Explicit strides for `dims` with `pad` extra elements per outer axis (0 pad: packed, spelt
/// as 0 every other time so that both spellings are exercised).
fn strides(dims: &[u64], pad: &[u64]) -> Vec<u64> {
    let mut strides = vec![0u64; dims.len()];
    let mut extent = dims[0];
    for i in 1..dims.len() {
        let stride = extent + pad[i];
        strides[i] = if pad[i] == 0 && i % 2 == 0 { 0 } else { stride };
        extent = stride * dims[i];
    }
    strides
}

/// Elements a buffer needs for `dims` laid out with `strides`.
fn span(dims: &[u64], strides: &[u64]) -> usize {
    row_offsets(dims, strides).into_iter().max().unwrap_or(0) + dims[0] as usize
}

trait Elem: Copy + std::ops::Add<Output = Self> + Default + PartialEq + std::fmt::Debug {
    fn from_seed(x: u64) -> Self;
}

impl Elem for f32 {
    fn from_seed(x: u64) -> Self {
        (x % 2001) as f32 * 0.25 - 250.0
    }
}
impl Elem for f64 {
    fn from_seed(x: u64) -> Self {
        (x % 20001) as f64 * 0.125 - 1250.0
    }
}
impl Elem for i32 {
    fn from_seed(x: u64) -> Self {
        (x % 2001) as i32 - 1000
    }
}
impl Elem for i64 {
    fn from_seed(x: u64) -> Self {
        (x % 2_000_001) as i64 - 1_000_000
    }
}

fn values<T: Elem>(seed: u64, n: usize) -> Vec<T> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            T::from_seed(x)
        })
        .collect()
}

fn run_case<T: Elem>(service: &Service<'_>, c: &Case) -> Result<(), TestCaseError> {
    let op = if c.exclusive {
        EXCLUSIVE_OP
    } else {
        INCLUSIVE_OP
    };
    let (in_strides, out_strides) = (strides(&c.dims, &c.in_pad), strides(&c.dims, &c.out_pad));
    let contiguous =
        c.in_pad.iter().skip(1).all(|&p| p == 0) && c.out_pad.iter().skip(1).all(|&p| p == 0);
    let float = matches!(c.dtype, GUILD_DTYPE_F32 | GUILD_DTYPE_F64);
    let alt_fits = float && contiguous && c.dims.len() <= 4;
    let exact_alt = c.exact_alt && alt_fits;
    let mut query = Query::cpu(
        op,
        vec![tensor(c.dtype, &c.dims, &in_strides)],
        vec![tensor(c.dtype, &c.dims, &out_strides)],
    );
    let expected_impl = match (c.exclusive, exact_alt) {
        (false, false) => INCLUSIVE,
        (true, false) => EXCLUSIVE,
        (false, true) => ALT_INCLUSIVE,
        (true, true) => "example.scan_alt.exclusive.cpu",
    };
    if exact_alt {
        query = query.exact(expected_impl);
    }
    let handle = service
        .resolve(&query)
        .map_err(|e| TestCaseError::fail(format!("resolve: {e}")))?;
    prop_assert_eq!(handle.describe().unwrap().impl_id, expected_impl);

    let input: Vec<T> = values(c.seed, span(&c.dims, &in_strides));
    let sentinel = T::from_seed(c.seed.rotate_left(7));
    let mut output = vec![sentinel; span(&c.dims, &out_strides)];
    let mut want = output.clone();
    reference(
        &input,
        &mut want,
        &c.dims,
        &in_strides,
        &out_strides,
        c.exclusive,
    );
    handle
        .execute(
            &[with_data(query.inputs[0], input.as_ptr())],
            &[with_data(query.outputs[0], output.as_mut_ptr())],
            None,
        )
        .map_err(|e| TestCaseError::fail(format!("execute: {e}")))?;
    prop_assert_eq!(output, want);
    handle
        .release()
        .map_err(|e| TestCaseError::fail(format!("release: {e}")))?;
    Ok(())
}

#[test]
fn both_scans_through_the_c_service_match_the_reference() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let cases = std::env::var("GUILD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    runner
        .run(&case(), |c| match c.dtype {
            GUILD_DTYPE_F32 => run_case::<f32>(&service, &c),
            GUILD_DTYPE_F64 => run_case::<f64>(&service, &c),
            GUILD_DTYPE_I32 => run_case::<i32>(&service, &c),
            _ => run_case::<i64>(&service, &c),
        })
        .unwrap();
    assert_eq!(f.host.kernels().live_c_handles(), 0);
}

// ---------------------------------------------------------------------------------------------
// Ranking
// ---------------------------------------------------------------------------------------------

#[test]
fn priority_tie_break_and_exact_ids_do_not_depend_on_install_order() {
    for order in [
        vec![scan_spec("1.0.0"), alt_spec("1.0.0"), tie_spec()],
        vec![tie_spec(), alt_spec("1.0.0"), scan_spec("1.0.0")],
    ] {
        let f = fixture_with(&order, DeviceSupport::host());
        let service = Service::of(f.host.kernels());
        let chosen = |q: &Query| service.resolve(q).map(|h| h.describe().unwrap().impl_id);

        // f32: scan (10), tie (10) and alt (5) all fit; the tie goes to the smaller impl id.
        let f32_query = same_shape(INCLUSIVE_OP, GUILD_DTYPE_F32, &[8, 2]);
        assert_eq!(chosen(&f32_query).unwrap(), TIE_INCLUSIVE);
        // i32: the tie and alt providers refuse integers in validate; scan is left.
        assert_eq!(
            chosen(&same_shape(INCLUSIVE_OP, GUILD_DTYPE_I32, &[8, 2])).unwrap(),
            INCLUSIVE
        );
        // An exact id wins over priority and never falls back.
        assert_eq!(
            chosen(&f32_query.clone().exact(ALT_INCLUSIVE)).unwrap(),
            ALT_INCLUSIVE
        );
        assert_eq!(
            chosen(&f32_query.clone().exact(INCLUSIVE)).unwrap(),
            INCLUSIVE
        );
        let err = chosen(&same_shape(INCLUSIVE_OP, GUILD_DTYPE_I32, &[8]).exact(ALT_INCLUSIVE))
            .unwrap_err();
        assert_eq!(err.status, GUILD_STATUS_ERR_NOT_FOUND, "{err}");
        assert_eq!(err.component, "guild.operations");
        // The diagnostic names every candidate and why it was rejected.
        for needle in [
            ALT_INCLUSIVE,
            "input dtype 26 (i32) is not supported by this scan",
            "2 other candidate(s): not the implementation the query names exactly",
        ] {
            assert!(err.message.contains(needle), "{needle}: {err}");
        }
        let err = chosen(&f32_query.clone().exact("example.nobody.cpu")).unwrap_err();
        assert_eq!(err.status, GUILD_STATUS_ERR_NOT_FOUND, "{err}");
        assert!(err.message.contains("example.nobody.cpu"), "{err}");
    }
}

#[test]
fn describe_and_scratch_report_the_negotiated_contract() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    // The output of scan_then_total is one total per row: [1, 3], not [5, 3].
    let Err(err) = service.resolve(&same_shape(TOTAL_OP, GUILD_DTYPE_I64, &[5, 3]).exact(TOTAL))
    else {
        panic!("a [5, 3] output resolved");
    };
    assert_eq!(err.status, GUILD_STATUS_ERR_NOT_FOUND);
    assert!(err.message.contains("output dims[0] must be 1"), "{err}");

    let query = Query::cpu(
        TOTAL_OP,
        vec![tensor(GUILD_DTYPE_I64, &[5, 3], &[])],
        vec![tensor(GUILD_DTYPE_I64, &[1, 3], &[])],
    );
    let handle = service.resolve(&query).unwrap();
    let d = handle.describe().unwrap();
    assert_eq!(d.impl_id, TOTAL);
    assert_eq!(d.package_id, "example.dependent");
    assert_eq!(d.op_name, TOTAL_OP);
    assert_eq!(d.raw.op_version, 0x0100_0000);
    assert_eq!(d.raw.backend, GUILD_BACKEND_CPU);
    assert_eq!(d.raw.sync_mode, GUILD_SYNC_HOST_BLOCKING);
    // One packed i64 copy of the 15-element input, 8-byte aligned, as its query_scratch says.
    assert_eq!(
        (
            d.raw.scratch.host_bytes,
            d.raw.scratch.device_bytes,
            d.raw.scratch.alignment
        ),
        (120, 0, 8)
    );
    let s = handle.scratch().unwrap();
    assert_eq!((s.host_bytes, s.device_bytes, s.alignment), (120, 0, 8));
    // The host's own copies of the descriptor and its GOP1 contract.
    // SAFETY: describe's pointers are valid until the handle is released.
    let (kernel, gop) = unsafe { (&*d.raw.kernel_desc, &*d.raw.operation) };
    assert_eq!(kernel.priority, 10);
    // SAFETY: the copied descriptor's strings live as long as the copy.
    let kernel_impl = unsafe { std::ffi::CStr::from_ptr(kernel.impl_id) };
    assert_eq!(kernel_impl.to_str().unwrap(), TOTAL);
    assert_eq!((gop.min_inputs, gop.max_inputs), (1, 1));
    assert_eq!(gop.min_alignment, 4);

    // Budgets: the 120 bytes do not fit in 64, and the status says so.
    let mut tight = query.clone();
    tight.ram_budget = 64;
    let err = service.resolve(&tight).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_OUT_OF_MEMORY, "{err}");
    assert!(err.message.contains("120 bytes of host scratch"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The dependent module
// ---------------------------------------------------------------------------------------------

fn row_totals(input: &[i64], dims: &[u64], strides: &[u64]) -> Vec<i64> {
    row_offsets(dims, strides)
        .into_iter()
        .map(|o| input[o..o + dims[0] as usize].iter().sum())
        .collect()
}

#[test]
fn the_dependent_module_resolves_and_runs_the_base_scan_through_the_service() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let dims = [7u64, 3, 2];
    let in_strides = [0u64, 9, 30];
    let query = Query::cpu(
        TOTAL_OP,
        vec![tensor(GUILD_DTYPE_I64, &dims, &in_strides)],
        vec![tensor(GUILD_DTYPE_I64, &[1, 3, 2], &[])],
    );
    let handle = service.resolve(&query).unwrap();
    let input: Vec<i64> = values(42, span(&dims, &in_strides));
    let mut totals = vec![0i64; 6];
    let scratch = handle.scratch().unwrap();
    // Aligned for the 8 bytes query_scratch asked for.
    let mut scratch_buf = vec![0u64; scratch.host_bytes.div_ceil(8) as usize];
    // SAFETY: viewing a u64 buffer as bytes.
    let scratch_bytes = unsafe {
        std::slice::from_raw_parts_mut(scratch_buf.as_mut_ptr().cast::<u8>(), scratch_buf.len() * 8)
    };
    handle
        .execute(
            &[with_data(query.inputs[0], input.as_ptr())],
            &[with_data(query.outputs[0], totals.as_mut_ptr())],
            Some(scratch_bytes),
        )
        .unwrap();
    assert_eq!(totals, row_totals(&input, &dims, &in_strides));
    // The module released its nested handle before returning; only ours is live.
    assert_eq!(f.host.kernels().live_c_handles(), 1);
    handle.release().unwrap();
    assert_eq!(f.host.kernels().live_c_handles(), 0);

    // The same operation through the Rust face.
    let rust = OperationService::new(f.host.kernels());
    let (din, dout) = (
        desc(DType::I64, &dims, &in_strides),
        desc(DType::I64, &[1, 3, 2], &[]),
    );
    let handle = rust
        .resolve(&OperationRequest::cpu(op(TOTAL_OP), vec![din], vec![dout]))
        .unwrap();
    let mut out = vec![0i64; 6];
    let mut scratch = vec![0u64; 42];
    // SAFETY: viewing a u64 buffer as bytes.
    let scratch = unsafe {
        std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u8>(), scratch.len() * 8)
    };
    handle
        .execute(
            &[TensorArg::new(&din, &input)],
            &mut [TensorArgMut::new(&dout, &mut out)],
            Some(scratch),
        )
        .unwrap();
    assert_eq!(out, row_totals(&input, &dims, &in_strides));

    // Without the scratch it asked for, the provider is never called.
    let err = handle
        .execute(
            &[TensorArg::new(&din, &input)],
            &mut [TensorArgMut::new(&dout, &mut out)],
            None,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the provider needs 336 bytes of host scratch, 0 given"
    );
}

// ---------------------------------------------------------------------------------------------
// Lifetimes
// ---------------------------------------------------------------------------------------------

#[test]
fn a_c_handle_blocks_unload_replacement_and_rollback_and_disable_waits_for_it() {
    let f = fixture_with(
        &[scan_spec("1.0.0"), alt_spec("1.0.0")],
        DeviceSupport::host(),
    );
    // A second version, so that rollback has somewhere to go, and a third to replace it with.
    let v11 = f.shop.build(&scan_spec("1.1.0"), &f.key);
    let v12 = f.shop.build(&scan_spec("1.2.0"), &f.key);
    f.host
        .install(&v11.archive, InstallOptions::default())
        .unwrap();
    let pkg = id("example.scan");
    let service = Service::of(f.host.kernels());
    let query = same_shape(INCLUSIVE_OP, GUILD_DTYPE_I64, &[4]);
    let handle = service.resolve(&query).unwrap();
    assert_eq!(handle.describe().unwrap().package_id, "example.scan");
    assert_eq!(f.host.active_package_leases(&pkg), 1);

    for (outcome, action) in [
        (f.host.rollback(&pkg).map(|_| ()), QuiescentAction::Rollback),
        (
            f.host.remove(&pkg, None).map(|_| ()),
            QuiescentAction::Remove,
        ),
        (
            f.host
                .install(&v12.archive, InstallOptions::default())
                .map(|_| ()),
            QuiescentAction::Replace,
        ),
        (f.host.disable(&pkg).map(|_| ()), QuiescentAction::Unload),
    ] {
        match outcome.unwrap_err() {
            HostError::Leased(l) => {
                assert_eq!(l.action, action);
                assert_eq!((l.leases, l.bindings), (0, 1));
            }
            other => panic!("expected a lease refusal, got {other}"),
        }
    }
    assert_eq!(f.loader.open_libraries(), 2, "nothing was loaded or closed");

    // Unloading waits for the handle: a disable that waits returns only after the release,
    // while the handle keeps working meanwhile.
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            f.host
                .disable_waiting(&pkg, std::time::Duration::from_secs(30))
        });
        let input = [1i64, 2, 3, 4];
        let mut out = [0i64; 4];
        handle
            .execute(
                &[with_data(query.inputs[0], input.as_ptr())],
                &[with_data(query.outputs[0], out.as_mut_ptr())],
                None,
            )
            .unwrap();
        assert_eq!(out, [1, 3, 6, 10]);
        assert!(
            !waiting.is_finished(),
            "disable went through while the handle lived"
        );
        assert_eq!(f.loader.open_libraries(), 2);
        handle.release().unwrap();
        assert_eq!(waiting.join().unwrap().unwrap().to_string(), "1.1.0");
    });
    assert_eq!(
        f.loader.open_libraries(),
        1,
        "released and disabled: scan's library closed"
    );
    assert_eq!(f.host.active_package_leases(&pkg), 0);
    let err = service.resolve(&query).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_NOT_FOUND, "{err}");

    // A waiting disable gives up after its timeout with the refusal, changing nothing.
    f.host.enable(&pkg).unwrap();
    let held = service.resolve(&query).unwrap();
    match f
        .host
        .disable_waiting(&pkg, std::time::Duration::from_millis(30))
        .unwrap_err()
    {
        HostError::Leased(l) => assert_eq!(l.action, QuiescentAction::Unload),
        other => panic!("expected a lease refusal, got {other}"),
    }
    assert_eq!(f.loader.open_libraries(), 2);
    held.release().unwrap();
}

#[test]
fn a_registry_destroyed_under_a_copied_service_refuses_it() {
    let registry = KernelRegistry::new();
    let table = *registry.operation_api();
    drop(registry);
    let q = same_shape(INCLUSIVE_OP, GUILD_DTYPE_F32, &[4]);
    let c = q.c();
    let mut out = ptr::null_mut();
    let mut error = guild_abi::guild_error_info_t::new();
    // SAFETY: the table's functions are the host's and check `user` before using it.
    let status = unsafe { (table.resolve.unwrap())(table.user, &c, &mut out, &mut error) };
    assert_eq!(status, GUILD_STATUS_ERR_STATE);
    assert!(out.is_null());
}

// ---------------------------------------------------------------------------------------------
// The service's guards
// ---------------------------------------------------------------------------------------------

/// What example.probe.reenter reads from params.
#[repr(C)]
pub(crate) struct ProbeParams {
    pub(crate) struct_size: u32,
    pub(crate) reserved: u32,
    pub(crate) service: *const guild_abi::guild_operation_service_v1_t,
    pub(crate) handle: *mut guild_abi::guild_op_handle_t,
}

#[test]
fn a_provider_can_neither_release_nor_reenter_the_handle_it_runs_on() {
    let f = fixture_with(&[probe_spec()], DeviceSupport::host());
    let service = Service::of(f.host.kernels());
    let query = Query::cpu(
        REENTER_OP,
        vec![tensor(GUILD_DTYPE_I32, &[4], &[])],
        vec![tensor(GUILD_DTYPE_I32, &[2], &[])],
    );
    let handle = service.resolve(&query).unwrap();
    let input = [0i32; 4];
    let mut statuses = [7i32; 2];
    let params = ProbeParams {
        struct_size: size_of::<ProbeParams>() as u32,
        reserved: 0,
        service: &service.table,
        handle: handle.raw(),
    };
    let inputs = [with_data(query.inputs[0], input.as_ptr())];
    let outputs = [with_data(query.outputs[0], statuses.as_mut_ptr())];
    let mut args = args(&inputs, &outputs);
    args.params = (&params as *const ProbeParams).cast();
    args.params_size = size_of::<ProbeParams>();
    handle.execute_args(&args).unwrap();
    assert_eq!(
        statuses,
        [GUILD_STATUS_ERR_BUSY, GUILD_STATUS_ERR_BUSY],
        "release and a nested execute on the running handle are both refused"
    );
    // The handle survived its provider's attempt and still works.
    handle.execute_args(&args).unwrap();
    assert_eq!(f.host.kernels().live_c_handles(), 1);
    handle.release().unwrap();
    assert_eq!(f.host.kernels().live_c_handles(), 0);
}

#[test]
fn malformed_queries_are_refused_with_what_is_wrong() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let good = same_shape(INCLUSIVE_OP, GUILD_DTYPE_F32, &[4]);
    let refuse = |c: &guild_operation_query_v1_t| service.resolve_raw(c).unwrap_err();
    let expect = |err: CError, status: i32, needle: &str| {
        assert_eq!(err.status, status, "{err}");
        assert_eq!(err.component, "guild.operations");
        assert!(err.message.contains(needle), "{needle:?} not in {err}");
    };

    expect(
        service.resolve_raw(ptr::null()).unwrap_err(),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "the query is NULL",
    );
    let mut c = good.c();
    c.struct_size = 16;
    expect(
        refuse(&c),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "query.struct_size is 16",
    );
    let mut c = good.c();
    c.version = 2;
    expect(
        refuse(&c),
        GUILD_STATUS_ERR_ABI_MISMATCH,
        "query.version is 2",
    );
    let mut c = good.c();
    c.op_name = ptr::null();
    expect(
        refuse(&c),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "query.op_name is NULL",
    );
    let bad_name = c"Not A Name";
    let mut c = good.c();
    c.op_name = bad_name.as_ptr();
    expect(
        refuse(&c),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "query.op_name",
    );
    let mut c = good.c();
    c.sync_mode = 9;
    expect(
        refuse(&c),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "query.sync_mode 9",
    );
    let mut c = good.c();
    c.inputs = ptr::null();
    expect(
        refuse(&c),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "input array is NULL",
    );
    let mut zero = good.clone();
    zero.inputs[0].dims[0] = 0;
    expect(
        refuse(&zero.c()),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "input 0",
    );
    let mut space = good.clone();
    space.outputs[0].memory_space = 0x3;
    expect(
        refuse(&space.c()),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "output 0: memory_space 0x3",
    );
    let mut versions = good.clone();
    versions.max_version = 0x0200_0000;
    expect(
        refuse(&versions.c()),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "version interval",
    );

    // Device-capability tails are refused by this service version.
    let header = guild_abi::guild_ext_header_t {
        struct_size: 16,
        tag: 0,
        version: 1,
        reserved: 0,
        next: ptr::null(),
    };
    let mut caps = cpu_caps();
    caps.next_ext = &header;
    let mut tailed = good.clone();
    tailed.device_caps = Some(caps);
    expect(
        refuse(&tailed.c()),
        GUILD_STATUS_ERR_UNSUPPORTED,
        "device_caps.next_ext must be NULL",
    );
    let mut caps = cpu_caps();
    caps.backend = 0x3;
    let mut two = good.clone();
    two.device_caps = Some(caps);
    expect(
        refuse(&two.c()),
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "device_caps.backend 0x3",
    );
    // A proper caps record resolves; stream-ordered work on a device needs a device adapter,
    // which this host lacks (CPU-only, the scans simply do not offer the mode).
    let mut with_caps = good.clone();
    with_caps.device_caps = Some(cpu_caps());
    service.resolve(&with_caps).unwrap().release().unwrap();
    let mut ordered = good.clone();
    ordered.sync_mode = GUILD_SYNC_STREAM_ORDERED;
    ordered.backends = GUILD_BACKEND_CPU | GUILD_BACKEND_CUDA;
    expect(
        refuse(&ordered.c()),
        GUILD_STATUS_ERR_UNSUPPORTED,
        "needs a device adapter",
    );
    assert_eq!(f.host.kernels().live_c_handles(), 0);
}

fn cpu_caps() -> guild_device_caps_v1_t {
    guild_device_caps_v1_t {
        struct_size: size_of::<guild_device_caps_v1_t>() as u32,
        backend: GUILD_BACKEND_CPU,
        device_id: 0,
        cuda_sm: 0,
        cpu_isa: CpuIsa::EMPTY.bits(),
        total_memory_bytes: 0,
        free_memory_bytes: 0,
        next_ext: ptr::null(),
    }
}

/// module_abi.h promises providers a parameter record aligned to 8 bytes: the service refuses a
/// misaligned one in a query, an execute and a reshape with GUILD_STATUS_ERR_INVALID_ARGUMENT
/// naming it, before any provider sees it, and takes the same record 8-byte aligned.
#[test]
fn a_misaligned_params_record_is_refused_by_the_c_service() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let words = [0u64; 3];
    let aligned: *const std::ffi::c_void = words.as_ptr().cast();
    // SAFETY: 4 bytes into a live 24-byte array, with 16 bytes of it after.
    let misaligned: *const std::ffi::c_void = unsafe { aligned.cast::<u8>().add(4) }.cast();
    let named = |err: CError, record: &str| {
        assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT, "{err}");
        assert!(
            err.message.contains(&format!("{record}.params at"))
                && err.message.contains("not aligned to 8 bytes"),
            "{err}"
        );
    };

    let query = same_shape(INCLUSIVE_OP, GUILD_DTYPE_F32, &[4, 2]);
    let mut c = query.c();
    c.params = misaligned;
    c.params_size = 16;
    named(service.resolve_raw(&c).unwrap_err(), "query");
    c.params = aligned;
    service.resolve_raw(&c).unwrap().release().unwrap();

    let handle = service.resolve(&query).unwrap();
    let input = [1f32; 8];
    let mut output = [-1f32; 8];
    let inputs = [with_data(query.inputs[0], input.as_ptr())];
    let outputs = [with_data(query.outputs[0], output.as_mut_ptr())];
    let mut a = args(&inputs, &outputs);
    a.params = misaligned;
    a.params_size = 16;
    named(handle.execute_args(&a).unwrap_err(), "execute: args");
    assert_eq!(output, [-1f32; 8], "the provider did not run");
    a.params = aligned;
    handle.execute_args(&a).unwrap();
    assert_eq!(output[0], 1.0);

    let mut r = crate::c_face::reshape_args(&query.inputs, &query.outputs);
    r.params = misaligned;
    r.params_size = 16;
    named(
        crate::c_face::reshape_raw(&service, handle.raw(), &r).unwrap_err(),
        "reshape: args",
    );
    r.params = aligned;
    crate::c_face::reshape_raw(&service, handle.raw(), &r).unwrap();

    // A NULL record that claims bytes is refused too, where the provider would read NULL.
    let null_named = |err: CError, record: &str| {
        assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT, "{err}");
        assert!(
            err.message
                .contains(&format!("{record}.params is NULL but params_size is 16")),
            "{err}"
        );
    };
    c.params = std::ptr::null();
    null_named(service.resolve_raw(&c).unwrap_err(), "query");
    a.params = std::ptr::null();
    output = [-1f32; 8];
    null_named(handle.execute_args(&a).unwrap_err(), "execute: args");
    assert_eq!(output, [-1f32; 8], "the provider did not run");
    r.params = std::ptr::null();
    null_named(
        crate::c_face::reshape_raw(&service, handle.raw(), &r).unwrap_err(),
        "reshape: args",
    );
}

#[test]
fn bad_execute_calls_are_refused_before_the_provider_runs() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let query = same_shape(INCLUSIVE_OP, GUILD_DTYPE_F32, &[4, 2]);
    let handle = service.resolve(&query).unwrap();
    let input = [1f32; 8];
    let mut output = [-1f32; 8];
    let inputs = [with_data(query.inputs[0], input.as_ptr())];
    let outputs = [with_data(query.outputs[0], output.as_mut_ptr())];
    let expect = |args: &guild_execute_args_v1_t, status: i32, needle: &str| {
        let err = handle.execute_args(args).unwrap_err();
        assert_eq!(err.status, status, "{err}");
        assert!(err.message.contains(needle), "{needle:?} not in {err}");
    };
    let base = args(&inputs, &outputs);

    let mut a = base;
    a.struct_size = 8;
    expect(
        &a,
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "args.struct_size is 8",
    );
    let mut a = base;
    a.reserved = 1;
    expect(
        &a,
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "reserved must be zero",
    );
    let mut a = base;
    a.sync_mode = GUILD_SYNC_STREAM_ORDERED;
    expect(&a, GUILD_STATUS_ERR_INVALID_ARGUMENT, "sync mode");
    let mut a = base;
    a.device_id = 1;
    expect(&a, GUILD_STATUS_ERR_INVALID_ARGUMENT, "device 1");
    let mut a = base;
    a.stream = 0x1000 as guild_stream_t;
    expect(&a, GUILD_STATUS_ERR_INVALID_ARGUMENT, "takes no stream");
    let mut a = base;
    a.input_count = 2;
    expect(&a, GUILD_STATUS_ERR_INVALID_ARGUMENT, "2 inputs given");
    let wrong_shape = [with_data(
        tensor(GUILD_DTYPE_F32, &[2, 4], &[]),
        input.as_ptr(),
    )];
    let mut a = base;
    a.inputs = wrong_shape.as_ptr();
    expect(
        &a,
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "input 0 does not match",
    );
    let null_data = [query.inputs[0]];
    let mut a = base;
    a.inputs = null_data.as_ptr();
    expect(&a, GUILD_STATUS_ERR_INVALID_ARGUMENT, "NULL data pointer");
    let misaligned = [with_data(
        query.inputs[0],
        input.as_ptr().cast::<u8>().wrapping_add(2),
    )];
    let mut a = base;
    a.inputs = misaligned.as_ptr();
    expect(
        &a,
        GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "not aligned to 4 bytes",
    );
    assert_eq!(output, [-1f32; 8], "the provider never ran");

    // Handles are checked: NULL, a pointer that is not a handle, another registry's handle.
    let mut err = guild_abi::guild_error_info_t::new();
    let execute = service.table.execute.unwrap();
    // SAFETY: the service must refuse a NULL handle without touching anything.
    let status = unsafe { execute(service.table.user, ptr::null_mut(), &base, &mut err) };
    assert_eq!(status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    let fake = [0u64; 16];
    // SAFETY: a number that names no handle of this service; nothing is read through it.
    let status = unsafe {
        execute(
            service.table.user,
            fake.as_ptr().cast_mut().cast(),
            &base,
            &mut err,
        )
    };
    assert_eq!(status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    let other = KernelRegistry::new();
    let other_user = other.operation_api().user;
    // SAFETY: a live handle, passed with another live service's `user`.
    let status = unsafe { execute(other_user, handle.raw(), &base, &mut err) };
    assert_eq!(
        status, GUILD_STATUS_ERR_INVALID_ARGUMENT,
        "another service's handle is not one of this service's"
    );
    // Releasing NULL is a no-op.
    release_raw(&service, ptr::null_mut()).unwrap();

    // Scratch is checked too (the dependent module asks for 8-byte aligned host scratch).
    let q = Query::cpu(
        TOTAL_OP,
        vec![tensor(GUILD_DTYPE_I64, &[4], &[])],
        vec![tensor(GUILD_DTYPE_I64, &[1], &[])],
    );
    let total = service.resolve(&q).unwrap();
    let inp = [1i64, 2, 3, 4];
    let mut out = [0i64; 1];
    let mut small = [0u8; 16];
    let err = total
        .execute(
            &[with_data(q.inputs[0], inp.as_ptr())],
            &[with_data(q.outputs[0], out.as_mut_ptr())],
            Some(&mut small),
        )
        .unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_BUFFER_TOO_SMALL, "{err}");
    assert!(
        err.message
            .contains("needs 32 bytes of host scratch, 16 given"),
        "{err}"
    );
    let mut room = [0u64; 5];
    // SAFETY: viewing a u64 buffer as bytes, one byte in so that it is misaligned.
    let unaligned =
        unsafe { std::slice::from_raw_parts_mut(room.as_mut_ptr().cast::<u8>().add(1), 32) };
    let err = total
        .execute(
            &[with_data(q.inputs[0], inp.as_ptr())],
            &[with_data(q.outputs[0], out.as_mut_ptr())],
            Some(unaligned),
        )
        .unwrap_err();
    assert!(err.message.contains("not aligned to 8 bytes"), "{err}");
    assert_eq!(out, [0]);
}

// ---------------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------------

#[test]
fn independent_and_shared_c_handles_execute_concurrently() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let dims = [32u64, 8];
    let query = |op: &str| same_shape(op, GUILD_DTYPE_I64, &dims);
    let (qi, qe) = (query(INCLUSIVE_OP), query(EXCLUSIVE_OP));
    let inclusive = service.resolve(&qi).unwrap();
    let exclusive = service.resolve(&qe).unwrap();
    let shared = Arc::new(service.resolve(&qi).unwrap());
    let hammer = |handle: &crate::c_face::Handle<'_, '_>, q: &Query, exclusive: bool, seed: u64| {
        for round in 0..150u64 {
            let input: Vec<i64> = values(seed * 1000 + round, 256);
            let mut output = vec![0i64; 256];
            let mut want = vec![0i64; 256];
            reference(&input, &mut want, &dims, &[], &[], exclusive);
            handle
                .execute(
                    &[with_data(q.inputs[0], input.as_ptr())],
                    &[with_data(q.outputs[0], output.as_mut_ptr())],
                    None,
                )
                .unwrap();
            assert_eq!(output, want);
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| hammer(&inclusive, &qi, false, 1));
        s.spawn(|| hammer(&exclusive, &qe, true, 2));
        for t in 0..4 {
            let shared = Arc::clone(&shared);
            let qi = &qi;
            s.spawn(move || hammer(&shared, qi, false, 10 + t));
        }
        // The dependent module resolves its own nested handles meanwhile.
        s.spawn(|| {
            let q = Query::cpu(
                TOTAL_OP,
                vec![tensor(GUILD_DTYPE_I64, &dims, &[])],
                vec![tensor(GUILD_DTYPE_I64, &[1, 8], &[])],
            );
            let total = service.resolve(&q).unwrap();
            for round in 0..100 {
                let input: Vec<i64> = values(99 + round, 256);
                let mut out = vec![0i64; 8];
                let mut scratch = vec![0u64; 256];
                // SAFETY: viewing a u64 buffer as bytes.
                let scratch = unsafe {
                    std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u8>(), 2048)
                };
                total
                    .execute(
                        &[with_data(q.inputs[0], input.as_ptr())],
                        &[with_data(q.outputs[0], out.as_mut_ptr())],
                        Some(scratch),
                    )
                    .unwrap();
                assert_eq!(out, row_totals(&input, &dims, &[]));
            }
        });
    });
    assert_eq!(f.host.kernels().live_c_handles(), 3);
    drop((inclusive, exclusive, shared));
    assert_eq!(f.host.kernels().live_c_handles(), 0);
    assert_eq!(f.host.active_package_leases(&id("example.scan")), 0);
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

#[test]
fn stream_ordered_calls_are_recorded_and_release_waits_for_them() {
    let streams = FakeStreams::new();
    let devices = DeviceSupport {
        cpu_isa: CpuIsa::EMPTY,
        cuda_sm: Some(90),
        streams: Some(Arc::new(streams.clone())),
    };
    let f = fixture_with(&[probe_spec()], devices);
    let service = Service::of(f.host.kernels());
    let mut t = tensor(GUILD_DTYPE_F32, &[4], &[]);
    t.memory_space = GUILD_MEMORY_MANAGED;
    let mut query = Query::cpu(STREAM_OP, vec![t], vec![t]);
    query.backends = GUILD_BACKEND_CUDA;
    query.sync_mode = GUILD_SYNC_STREAM_ORDERED;
    let handle = service.resolve(&query).unwrap();
    assert_eq!(handle.describe().unwrap().raw.backend, GUILD_BACKEND_CUDA);

    let input = [1f32, 2.0, 3.0, 4.0];
    let mut output = [0f32; 4];
    let inputs = [with_data(t, input.as_ptr())];
    let outputs = [with_data(t, output.as_mut_ptr())];
    let on = |stream: usize| {
        let mut a = args(&inputs, &outputs);
        a.sync_mode = GUILD_SYNC_STREAM_ORDERED;
        a.stream = stream as guild_stream_t;
        a
    };
    handle.execute_args(&on(0xa0)).unwrap();
    handle.execute_args(&on(0xa0)).unwrap();
    handle.execute_args(&on(0xb0)).unwrap();
    assert_eq!(output, input);
    // Work on one stream completes in order: the second mark on 0xa0 replaced the first.
    let recorded = |mark, stream| StreamEvent::Recorded {
        device_id: 0,
        stream: StreamRef(stream),
        mark,
    };
    assert_eq!(
        streams.events(),
        vec![
            recorded(1, 0xa0),
            recorded(2, 0xa0),
            StreamEvent::Dropped { mark: 1 },
            recorded(3, 0xb0),
        ]
    );
    handle.release().unwrap();
    let events = streams.events();
    for mark in [2, 3] {
        assert!(events.contains(&StreamEvent::Waited { mark }), "{events:?}");
    }
    assert_eq!(f.host.kernels().live_c_handles(), 0);

    // A stream being captured into a graph gives no mark; a failing device is reported by
    // release, and the handle is gone all the same.
    streams.capture(StreamRef(0xc0));
    streams.fail_waits_on(StreamRef(0xd0));
    let mut graph = query.clone();
    graph.sync_mode = GUILD_SYNC_GRAPH_CAPTURABLE;
    let handle = service.resolve(&graph).unwrap();
    let mut a = on(0xc0);
    a.sync_mode = GUILD_SYNC_GRAPH_CAPTURABLE;
    let before = streams.events().len();
    handle.execute_args(&a).unwrap();
    assert_eq!(
        streams.events().len(),
        before,
        "nothing recorded in capture"
    );
    a.stream = 0xd0 as guild_stream_t;
    handle.execute_args(&a).unwrap();
    let err = handle.release().unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_DEVICE, "{err}");
    assert!(err.message.contains("fake failure on stream 0xd0"), "{err}");
    assert_eq!(f.host.kernels().live_c_handles(), 0);
}

#[test]
fn a_kernel_for_a_backend_the_manifest_does_not_declare_is_refused() {
    let f = fixture_with(&[], DeviceSupport::host());
    let mut spec = probe_spec();
    spec.backends = vec!["cpu".into()];
    let built = f.shop.build(&spec, &f.key);
    match f
        .host
        .install(&built.archive, InstallOptions::default())
        .unwrap_err()
    {
        HostError::UndeclaredBackend {
            package,
            impl_id,
            declared,
            ..
        } => {
            assert_eq!(package, "example.service_probe@1.0.0");
            assert_eq!(impl_id.as_str(), "example.service_probe.stream_copy.cuda");
            assert_eq!(declared, "cpu");
        }
        other => panic!("expected UndeclaredBackend, got {other}"),
    }
    assert_eq!(f.loader.open_libraries(), 0, "the plugin was shut down");
    assert!(f.host.packages().list().unwrap().is_empty());
}

#[test]
fn the_rust_face_passes_execute_params_to_the_provider() {
    let f = fixture_with(&[probe_spec()], DeviceSupport::host());
    let rust = OperationService::new(f.host.kernels());
    let (din, dout) = (desc(DType::I32, &[4], &[]), desc(DType::I32, &[2], &[]));
    let handle = rust
        .resolve(&OperationRequest::cpu(
            op(REENTER_OP),
            vec![din],
            vec![dout],
        ))
        .unwrap();
    let input = [0i32; 4];
    let mut statuses = [7i32; 2];
    handle
        .execute(
            &[TensorArg::new(&din, &input)],
            &mut [TensorArgMut::new(&dout, &mut statuses)],
            None,
        )
        .unwrap();
    assert_eq!(statuses, [0, 0], "no params: the probe calls nothing");

    // With params naming the C service and no handle, the probe's release(NULL) is OK and its
    // execute(NULL) is refused: proof that the record reached the provider's execute.
    let params = ProbeParams {
        struct_size: size_of::<ProbeParams>() as u32,
        reserved: 0,
        service: f.host.kernels().operation_api(),
        handle: ptr::null_mut(),
    };
    // SAFETY: viewing a live repr(C) struct as its bytes for the duration of the call.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&params as *const ProbeParams).cast::<u8>(),
            size_of::<ProbeParams>(),
        )
    };
    handle
        .execute_with_params(
            &[TensorArg::new(&din, &input)],
            &mut [TensorArgMut::new(&dout, &mut statuses)],
            None,
            bytes,
        )
        .unwrap();
    assert_eq!(statuses, [0, GUILD_STATUS_ERR_INVALID_ARGUMENT]);
}

/// The parameter record of test-plugins/axpy_params, as a runner declares it in Rust.
#[repr(C)]
struct AxpyParams {
    struct_size: u32,
    a: f32,
}

/// A Rust caller's `&[u8]` record may sit at any address (this one's struct is only 4-aligned);
/// the Rust face hands providers an 8-byte aligned copy of a misaligned one, so the axpy, which
/// refuses a misaligned record, resolves, reshapes and runs with it.
#[test]
fn the_rust_face_aligns_a_misaligned_params_record() {
    let axpy = plugin_module("example.axpy", "axpy_params", &["example.vector.axpy.cpu"]);
    let f = fixture_with(&[axpy], DeviceSupport::host());
    let rust = OperationService::new(f.host.kernels());
    let record = AxpyParams {
        struct_size: size_of::<AxpyParams>() as u32,
        a: 2.0,
    };
    let mut words = [0u64; 3];
    // SAFETY: viewing a live array of u64 as its 24 bytes, for as long as `words` is borrowed.
    let buffer = unsafe {
        std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), size_of::<[u64; 3]>())
    };
    buffer[4..8].copy_from_slice(&record.struct_size.to_ne_bytes());
    buffer[8..12].copy_from_slice(&record.a.to_ne_bytes());
    let params = &buffer[4..12];
    assert_eq!(params.as_ptr() as usize % 8, 4, "the record is misaligned");

    let d = desc(DType::F32, &[4], &[]);
    let request = OperationRequest::cpu(op("example.vector.axpy"), vec![d, d], vec![d]);
    assert!(
        rust.resolve(&request).is_err(),
        "no record: validate refuses"
    );
    let mut handle = rust.resolve_with_params(&request, params).unwrap();
    let (x, y) = ([1f32, 2.0, 3.0, 4.0], [10f32, 20.0, 30.0, 40.0]);
    let mut out = [0f32; 4];
    handle
        .execute_with_params(
            &[TensorArg::new(&d, &x), TensorArg::new(&d, &y)],
            &mut [TensorArgMut::new(&d, &mut out)],
            None,
            params,
        )
        .unwrap();
    assert_eq!(out, [12.0, 24.0, 36.0, 48.0]);

    let d2 = desc(DType::F32, &[2, 2], &[]);
    handle
        .reshape_with_params(&[d2, d2], &[d2], params)
        .unwrap();
    handle
        .execute_with_params(
            &[TensorArg::new(&d2, &x), TensorArg::new(&d2, &y)],
            &mut [TensorArgMut::new(&d2, &mut out)],
            None,
            params,
        )
        .unwrap();
    assert_eq!(out, [12.0, 24.0, 36.0, 48.0]);
}

#[test]
fn reinstalling_a_superseded_version_rolls_forward_unless_a_handle_holds_the_package() {
    let f = fixture_with(&[scan_spec("1.0.0")], DeviceSupport::host());
    let pkg = id("example.scan");
    let v11 = f.shop.build(&scan_spec("1.1.0"), &f.key);
    f.host
        .install(&v11.archive, InstallOptions::default())
        .unwrap();
    f.host.rollback(&pkg).unwrap();
    assert_eq!(
        f.host.kernels().loaded_version(&pkg).unwrap().to_string(),
        "1.0.0"
    );

    let service = Service::of(f.host.kernels());
    let handle = service
        .resolve(&same_shape(INCLUSIVE_OP, GUILD_DTYPE_I64, &[4]))
        .unwrap();
    match f
        .host
        .install(&v11.archive, InstallOptions::default())
        .unwrap_err()
    {
        HostError::Leased(l) => assert_eq!(l.action, QuiescentAction::Replace),
        other => panic!("expected a lease refusal, got {other}"),
    }
    handle.release().unwrap();

    let done = f
        .host
        .install(&v11.archive, InstallOptions::default())
        .unwrap();
    assert!(done.reactivated && done.changed && done.enabled, "{done:?}");
    assert_eq!(done.superseded.unwrap().to_string(), "1.0.0");
    assert_eq!(
        f.host.kernels().loaded_version(&pkg).unwrap().to_string(),
        "1.1.0"
    );
    assert_eq!(
        f.loader.open_libraries(),
        1,
        "1.0.0 closed as it was replaced"
    );
}
