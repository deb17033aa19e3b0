//! The operation service over the fake loader, with providers written in Rust: the service
//! reaches providers through the loader port's `KernelProvider`, so an alternative loader
//! serves operations exactly as the dlopen one does. Ranking, a validate refusal, scratch,
//! execute (Rust and C faces, the C face's arrays and error record reaching the provider as the
//! caller passed them) and a lifecycle refusal while a handle lives.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use guild_abi::{
    guild_tensor_desc_v1_t, GUILD_DTYPE_I64, GUILD_STATUS_ERR_INVALID_ARGUMENT,
    GUILD_STATUS_ERR_UNSUPPORTED,
};
use guild_domain::ids::{ImplId, OpName};
use guild_domain::lease::QuiescentAction;
use guild_domain::operation::{
    Arity, Backend, BackendSet, Capabilities, CpuIsa, DType, LayoutSet, MemorySpace,
    MemorySpaceSet, Numerics, OpCandidate, ProviderRefusal, Rejection, SyncModeSet, TensorDesc,
};
use guild_domain::version::PackedVersion;
use guild_host::operations::{DeviceSupport, ExecuteError, PassReason, TensorArg, TensorArgMut};
use guild_host::{Host, HostError, InstallOptions, OperationRequest, OperationService};
use guild_ports::fakes::{
    fake_operation_with, FakeLoader, FakePlugin, FakeProvider, FakeScratch, FAKE_PROVIDER_COMPONENT,
};
use guild_ports::loader::{LoadError, LoadRequest, LoadedPlugin, PluginLoader};
use guild_ports::provider::ExecuteCall;
use guild_test_support::{id, key, open_dir, trust, Spec, Workshop, PUBLISHER};

use crate::c_face::{args, tensor, with_data, Query, Service};

pub(crate) const OP: &str = "ex.fake.double";
const FAST: &str = "ex.fake.op.cpu";
const SLOW: &str = "ex.fake.slow";
const NEVER: &str = "ex.fake.never";
/// The fast provider's scratch: 64 bytes at 16.
const FAST_SCRATCH: FakeScratch = FakeScratch {
    host_bytes: 64,
    device_bytes: 0,
    alignment: 16,
};

/// Shares one fake loader between the host and the test that watches it.
struct Shared(Arc<FakeLoader>);

impl PluginLoader for Shared {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        self.0.load(request)
    }
}

/// A one-input, one-output host-blocking CPU contract over contiguous tensors of any dtype.
pub(crate) fn candidate(impl_id: &str, priority: i32) -> OpCandidate {
    OpCandidate {
        impl_id: ImplId::new(impl_id).unwrap(),
        op_name: OpName::new(OP).unwrap(),
        backend: Backend::Cpu,
        priority,
        op_version: PackedVersion::new(1, 0, 0).unwrap(),
        capabilities: Capabilities::from_bits(0),
        numerics: Numerics::DETERMINISTIC | Numerics::EXACT_INTEGER,
        input_dtype: DType::ANY,
        output_dtype: DType::ANY,
        inputs: Arity::exactly(1),
        outputs: Arity::exactly(1),
        layouts: LayoutSet::CONTIGUOUS,
        memory_spaces: MemorySpaceSet::HOST,
        min_alignment: 8,
        min_rank: 1,
        max_rank: 1,
        max_dim: [0; 8],
        max_batch: 0,
        sync_modes: SyncModeSet::HOST_BLOCKING,
        min_sm: 0,
        max_sm: 0,
        cpu_isa: CpuIsa::EMPTY,
    }
}

/// Doubles a rank-1 i64 tensor into another of the same length; refuses a negative input
/// with `GUILD_STATUS_ERR_INVALID_ARGUMENT`, as a C provider would fill the error record.
pub(crate) fn double(call: ExecuteCall<'_>) -> Result<(), ProviderRefusal> {
    let (input, output) = (&call.inputs()[0], &call.outputs()[0]);
    let n = input.dims[0] as usize;
    // SAFETY: the service checked both tensors against the negotiated contract (rank 1, `n`
    // contiguous i64, non-NULL and 8-byte aligned, host memory), and ExecuteCall vouches that
    // their data is live for the call, the output writable and the provider's alone.
    let (from, to) = unsafe {
        (
            std::slice::from_raw_parts(input.data.cast::<i64>(), n),
            std::slice::from_raw_parts_mut(output.data.cast::<i64>(), n),
        )
    };
    if let Some(bad) = from.iter().find(|&&v| v < 0) {
        return Err(ProviderRefusal::new(
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            format!("cannot double {bad}: negative"),
        ));
    }
    for (o, i) in to.iter_mut().zip(from) {
        *o = 2 * i;
    }
    Ok(())
}

/// The three providers of the operation, and what they saw.
struct Providers {
    /// Priority 30: serves up to four values, with 64 bytes of scratch at 16, and records the
    /// address of the input array and scratch each execute was given.
    fast: Arc<FakeProvider>,
    /// Priority 20: serves any length, no scratch.
    slow: Arc<FakeProvider>,
    /// Priority 10: always outranked, so never called.
    never: Arc<FakeProvider>,
    /// The `inputs` array address the fast provider's last execute saw.
    fast_inputs: Arc<AtomicUsize>,
}

fn providers() -> Providers {
    let fast_inputs = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&fast_inputs);
    let fast = FakeProvider::new()
        .validating(|q| match q.inputs().first() {
            Some(t) if t.dims[0] <= 4 => Ok(()),
            _ => Err(ProviderRefusal::new(
                GUILD_STATUS_ERR_UNSUPPORTED,
                "the fast path takes at most 4 values",
            )),
        })
        .scratch(|_| Ok(FAST_SCRATCH))
        .executing(move |call| {
            let a = call.raw();
            assert!(a.scratch_host_size >= 64 && (a.scratch_host as usize).is_multiple_of(16));
            seen.store(a.inputs as usize, Ordering::SeqCst);
            double(call)
        });
    Providers {
        fast: Arc::new(fast),
        slow: Arc::new(FakeProvider::new().executing(double)),
        never: Arc::new(FakeProvider::new().executing(|_| panic!("an outranked provider ran"))),
        fast_inputs,
    }
}

/// A host over a fresh store with one enabled module whose library the fake loader serves
/// with the three providers.
struct Fixture {
    host: Host,
    fake: Arc<FakeLoader>,
    library: PathBuf,
    p: Providers,
    _shop: Workshop,
}

/// A host over a fresh store in `shop` with `module` installed and enabled, whose library the
/// fake loader serves as `plugin`; also the loader and the library's path.
pub(crate) fn fake_host(
    shop: &Workshop,
    module: Spec,
    plugin: FakePlugin,
) -> (Host, Arc<FakeLoader>, PathBuf) {
    fake_host_on(shop, module, plugin, DeviceSupport::host())
}

/// As [`fake_host`], the operation service resolving against `devices`.
fn fake_host_on(
    shop: &Workshop,
    module: Spec,
    plugin: FakePlugin,
    devices: DeviceSupport,
) -> (Host, Arc<FakeLoader>, PathBuf) {
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let built = shop.build(&module, &k);
    pm.install(&built.archive, InstallOptions::default())
        .unwrap();
    let plan = pm.load_plan().unwrap();
    let p = &plan.order[0];
    let library = p.dir.join(
        pm.metadata(&p.id, &p.version)
            .unwrap()
            .manifest()
            .entry
            .as_str(),
    );
    let fake = Arc::new(FakeLoader::new());
    fake.insert(&library, plugin);
    let host = Host::with_devices(pm, Box::new(Shared(fake.clone())), devices);
    let report = host.load_enabled().unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    (host, fake, library)
}

fn fixture() -> Fixture {
    let shop = Workshop::new();
    let providers = providers();
    let plugin = FakePlugin::new()
        .with_kernel(fake_operation_with(
            candidate(FAST, 30),
            providers.fast.clone(),
        ))
        .with_kernel(fake_operation_with(
            candidate(SLOW, 20),
            providers.slow.clone(),
        ))
        .with_kernel(fake_operation_with(
            candidate(NEVER, 10),
            providers.never.clone(),
        ));
    let (host, fake, library) = fake_host(
        &shop,
        Spec::module("ex.fake", "1.0.0").op(SLOW).op(NEVER),
        plugin,
    );
    Fixture {
        host,
        fake,
        library,
        p: providers,
        _shop: shop,
    }
}

pub(crate) fn i64s(n: u64) -> TensorDesc {
    TensorDesc::new(DType::I64, &[n], MemorySpace::Host)
}

pub(crate) fn request(n: u64) -> OperationRequest {
    OperationRequest::cpu(OpName::new(OP).unwrap(), vec![i64s(n)], vec![i64s(n)])
}

/// Scratch at the alignment the fast provider asks for (64 bytes at 16).
#[repr(C, align(16))]
pub(crate) struct Aligned(pub(crate) [u8; 64]);

/// Who the handle passed over and why, by impl id.
fn passed_over(handle: &guild_host::operations::OpHandle<'_>) -> Vec<(String, PassReason)> {
    let mut all: Vec<_> = handle
        .passed_over()
        .expect("a reporting service keeps the report")
        .iter()
        .map(|p| (p.impl_id.to_string(), p.reason.clone()))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

#[test]
fn rust_providers_are_ranked_negotiated_and_executed_by_the_service() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels()).reporting();

    // Four values: the highest-ranked provider accepts, and the others are not even asked.
    let handle = service.resolve(&request(4)).unwrap();
    let d = handle.describe();
    assert_eq!((d.impl_id.as_str(), d.priority), (FAST, 30));
    assert_eq!(d.package.as_str(), "ex.fake");
    let s = handle.scratch();
    assert_eq!((s.host_bytes, s.device_bytes, s.alignment), (64, 0, 16));
    assert_eq!(
        passed_over(&handle),
        [
            (NEVER.to_string(), PassReason::Outranked),
            (SLOW.to_string(), PassReason::Outranked),
        ]
    );
    assert_eq!(f.p.slow.calls().validate, 0);
    assert_eq!(f.p.never.calls().validate, 0);
    assert_eq!(
        (f.p.fast.calls().validate, f.p.fast.calls().query_scratch),
        (1, 1)
    );

    // Execute through the Rust face: the output is the provider's.
    let mut scratch = Aligned([0; 64]);
    let mut out = [0i64; 4];
    handle
        .execute(
            &[TensorArg::new(&i64s(4), &[1i64, 2, 3, 4])],
            &mut [TensorArgMut::new(&i64s(4), &mut out)],
            Some(&mut scratch.0),
        )
        .unwrap();
    assert_eq!(out, [2, 4, 6, 8]);
    assert_eq!(f.p.fast.calls().execute, 1);

    // The service checks the call before the provider runs: no scratch, no call.
    let err = handle
        .execute(
            &[TensorArg::new(&i64s(4), &[1i64, 2, 3, 4])],
            &mut [TensorArgMut::new(&i64s(4), &mut out)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(err, ExecuteError::ScratchTooSmall { needed: 64, .. }),
        "{err}"
    );
    assert_eq!(f.p.fast.calls().execute, 1, "the provider was not called");

    // A provider's own refusal comes back with its status and message.
    let err = handle
        .execute(
            &[TensorArg::new(&i64s(4), &[1i64, -2, 3, 4])],
            &mut [TensorArgMut::new(&i64s(4), &mut out)],
            Some(&mut scratch.0),
        )
        .unwrap_err();
    match err {
        ExecuteError::Provider(r) => {
            assert_eq!(r.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
            assert_eq!(r.message, "cannot double -2: negative");
        }
        other => panic!("expected the provider's refusal, got {other}"),
    }
    drop(handle);

    // Six values: the fast provider's validate refuses, and the next one down is chosen.
    let handle = service.resolve(&request(6)).unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), SLOW);
    assert_eq!(handle.scratch().host_bytes, 0);
    assert_eq!(
        passed_over(&handle),
        [
            (NEVER.to_string(), PassReason::Outranked),
            (
                FAST.to_string(),
                PassReason::Rejected(Rejection::ValidateRefused(ProviderRefusal::new(
                    GUILD_STATUS_ERR_UNSUPPORTED,
                    "the fast path takes at most 4 values",
                )))
            ),
        ]
    );
    let mut out = [0i64; 6];
    handle
        .execute(
            &[TensorArg::new(&i64s(6), &[1i64, 2, 3, 4, 5, 6])],
            &mut [TensorArgMut::new(&i64s(6), &mut out)],
            None,
        )
        .unwrap();
    assert_eq!(out, [2, 4, 6, 8, 10, 12]);
    assert_eq!(f.p.slow.calls().execute, 1);
    assert_eq!(f.p.never.calls(), Default::default(), "never called at all");
}

#[test]
fn the_c_face_hands_a_rust_provider_the_callers_arrays_and_error_record() {
    let f = fixture();
    let service = Service::of(f.host.kernels());
    let t = tensor(GUILD_DTYPE_I64, &[4], &[]);
    let handle = service.resolve(&Query::cpu(OP, vec![t], vec![t])).unwrap();
    let d = handle.describe().unwrap();
    assert_eq!(d.impl_id, FAST);
    // A Rust provider has no C descriptor or GOP1 copy to show.
    assert!(d.raw.kernel_desc.is_null() && d.raw.operation.is_null());
    let s = handle.scratch().unwrap();
    assert_eq!((s.host_bytes, s.alignment), (64, 16));

    let input = [5i64, 6, 7, 8];
    let mut output = [0i64; 4];
    let inputs: [guild_tensor_desc_v1_t; 1] = [with_data(t, input.as_ptr())];
    let outputs = [with_data(t, output.as_mut_ptr())];
    let mut scratch = Aligned([0; 64]);
    handle
        .execute(&inputs, &outputs, Some(&mut scratch.0))
        .unwrap();
    assert_eq!(output, [10, 12, 14, 16]);
    assert_eq!(
        f.p.fast_inputs.load(Ordering::SeqCst),
        inputs.as_ptr() as usize,
        "the provider was handed the caller's own tensor array, not a copy"
    );

    // The provider fills the caller's record itself: its component, not the service's.
    let bad = [-1i64, 0, 0, 0];
    let inputs = [with_data(t, bad.as_ptr())];
    let mut a = args(&inputs, &outputs);
    a.scratch_host = scratch.0.as_mut_ptr().cast();
    a.scratch_host_size = 64;
    let err = handle.execute_args(&a).unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(err.component, FAKE_PROVIDER_COMPONENT);
    assert_eq!(err.message, "cannot double -1: negative");
    handle.release().unwrap();
}

/// A C caller that passes no error record (NULL) gets the provider's status back; the report
/// the provider wrote, which the caller would have read there, reaches the host's plugin log
/// with the provider's package instead of being dropped.
#[test]
fn a_provider_failure_whose_caller_takes_no_record_reaches_the_plugin_log() {
    let f = fixture();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    f.host
        .kernels()
        .send_unread_failures_to(move |package, record| {
            sink.lock().unwrap().push((
                package.to_string(),
                record.status,
                record.component.clone(),
                record.message.clone(),
            ));
        });
    let service = Service::of(f.host.kernels());
    let t = tensor(GUILD_DTYPE_I64, &[4], &[]);
    let handle = service.resolve(&Query::cpu(OP, vec![t], vec![t])).unwrap();
    let bad = [-1i64, 0, 0, 0];
    let mut output = [0i64; 4];
    let inputs = [with_data(t, bad.as_ptr())];
    let outputs = [with_data(t, output.as_mut_ptr())];
    let mut scratch = Aligned([0; 64]);
    let mut a = args(&inputs, &outputs);
    a.scratch_host = scratch.0.as_mut_ptr().cast();
    a.scratch_host_size = 64;

    let status = handle.execute_args_without_record(&a);
    assert_eq!(status, GUILD_STATUS_ERR_INVALID_ARGUMENT);
    assert_eq!(
        *seen.lock().unwrap(),
        [(
            "ex.fake".to_owned(),
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            FAKE_PROVIDER_COMPONENT.to_owned(),
            "cannot double -1: negative".to_owned()
        )]
    );
    // A caller that takes the record gets the report there, and the log nothing more.
    let err = handle.execute_args(&a).unwrap_err();
    assert_eq!(err.message, "cannot double -1: negative");
    assert_eq!(seen.lock().unwrap().len(), 1);
    handle.release().unwrap();
}

#[test]
fn a_handle_on_a_rust_provider_refuses_disable_until_it_is_released() {
    let f = fixture();
    let pkg = id("ex.fake");
    let service = OperationService::new(f.host.kernels());
    let handle = service.resolve(&request(2)).unwrap();

    match f.host.disable(&pkg).unwrap_err() {
        HostError::Leased(l) => {
            assert_eq!(l.action, QuiescentAction::Unload);
            assert_eq!(l.bindings, 1, "the handle's binding");
        }
        other => panic!("expected a lease refusal, got {other}"),
    }
    // Refused means nothing changed: the library is loaded and the handle still runs.
    assert_eq!(f.fake.live_libraries_of(&f.library), 1);
    let mut scratch = Aligned([0; 64]);
    let mut out = [0i64; 2];
    handle
        .execute(
            &[TensorArg::new(&i64s(2), &[20i64, 21])],
            &mut [TensorArgMut::new(&i64s(2), &mut out)],
            Some(&mut scratch.0),
        )
        .unwrap();
    assert_eq!(out, [40, 42]);

    handle.release().unwrap();
    f.host.disable(&pkg).unwrap();
    assert_eq!(
        f.fake.live_libraries_of(&f.library),
        0,
        "the library closed with its last binding"
    );
    assert_eq!(f.fake.shutdowns_of(&f.library), 1);
    let err = service.resolve(&request(2)).unwrap_err();
    assert!(err.failure().is_some(), "nothing left to resolve: {err}");
}

/// A `GUILD_CPU_ISA_*` bit this CPU lacks: one of the other architecture's, or an x86 extension
/// the machine does not have.
fn isa_this_cpu_lacks() -> CpuIsa {
    let here = guild_host::platform::cpu_isa();
    [
        CpuIsa::NEON,
        CpuIsa::SVE2,
        CpuIsa::AVX512_BF16,
        CpuIsa::AVX_VNNI,
        CpuIsa::AVX2,
    ]
    .into_iter()
    .find(|bit| !here.contains(*bit))
    .expect("no CPU has both NEON and AVX2")
}

/// The CPU kernel of a module whose one provider needs `lacking`, on a host whose service
/// resolves against `devices`.
fn host_with_a_kernel_needing(
    shop: &Workshop,
    lacking: CpuIsa,
    devices: DeviceSupport,
) -> (Host, Arc<FakeProvider>) {
    let wide = Arc::new(FakeProvider::new().executing(double));
    let plugin = FakePlugin::new().with_kernel(fake_operation_with(
        OpCandidate {
            cpu_isa: lacking,
            ..candidate(WIDE, 30)
        },
        wide.clone(),
    ));
    let (host, _, _) = fake_host_on(shop, Spec::module("ex.fake", "1.0.0"), plugin, devices);
    (host, wide)
}

/// The one implementation id the module of [`host_with_a_kernel_needing`] declares.
const WIDE: &str = "ex.fake.op.cpu";

/// Resolves the operation through the Rust face with `request` and through the C face with
/// `device_caps`, and checks that each handle chose [`WIDE`], describes itself, and refuses to
/// execute, naming the implementation and `lacking`, without calling the provider.
fn both_faces_refuse_to_execute(
    host: &Host,
    wide: &FakeProvider,
    request: &OperationRequest,
    device_caps: Option<guild_abi::guild_device_caps_v1_t>,
    lacking: CpuIsa,
) {
    let service = OperationService::new(host.kernels());
    let handle = service.resolve(request).unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), WIDE);
    let mut out = [0i64; 4];
    let err = handle
        .execute(
            &[TensorArg::new(&i64s(4), &[1i64, 2, 3, 4])],
            &mut [TensorArgMut::new(&i64s(4), &mut out)],
            None,
        )
        .unwrap_err();
    match &err {
        ExecuteError::MissingCpuIsa { impl_id, missing } => {
            assert_eq!((impl_id.as_str(), *missing), (WIDE, lacking));
        }
        other => panic!("expected MissingCpuIsa, got {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(WIDE) && text.contains(&lacking.to_string()),
        "{text}"
    );
    assert_eq!(wide.calls().execute, 0, "the provider was not called");
    assert_eq!(out, [0; 4]);
    drop(handle);

    let c = Service::of(host.kernels());
    let t = tensor(GUILD_DTYPE_I64, &[4], &[]);
    let mut query = Query::cpu(OP, vec![t], vec![t]);
    query.device_caps = device_caps;
    let handle = c.resolve(&query).unwrap();
    assert_eq!(handle.describe().unwrap().impl_id, WIDE);
    let input = [1i64, 2, 3, 4];
    let mut output = [0i64; 4];
    let err = handle
        .execute(
            &[with_data(t, input.as_ptr())],
            &[with_data(t, output.as_mut_ptr())],
            None,
        )
        .unwrap_err();
    assert_eq!(err.status, GUILD_STATUS_ERR_UNSUPPORTED);
    assert!(
        err.message.contains(WIDE) && err.message.contains(&lacking.to_string()),
        "{}",
        err.message
    );
    assert_eq!(wide.calls().execute, 0, "the provider was not called");
    assert_eq!(output, [0; 4]);
    handle.release().unwrap();
}

/// A runner may resolve for another CPU's device record (to see what that CPU would run), and
/// so may be handed a provider needing instructions this CPU lacks. Executing such a handle here
/// could meet an illegal instruction; both faces refuse it before the provider is called, naming
/// the implementation and the missing bits, while the same handle still describes itself.
#[test]
fn a_handle_resolved_for_another_cpu_describes_but_does_not_execute_here() {
    let shop = Workshop::new();
    let lacking = isa_this_cpu_lacks();
    let here = guild_host::platform::cpu_isa();
    let (host, wide) = host_with_a_kernel_needing(&shop, lacking, DeviceSupport::host());

    // As this CPU, nothing can serve the operation.
    let service = OperationService::new(host.kernels());
    assert!(service.resolve(&request(4)).is_err());

    // As a CPU with the bit, the provider is chosen, and refused at execute.
    let mut as_other = request(4);
    as_other.device.cpu_isa = here | lacking;
    let caps = guild_abi::guild_device_caps_v1_t {
        struct_size: std::mem::size_of::<guild_abi::guild_device_caps_v1_t>() as u32,
        backend: guild_abi::GUILD_BACKEND_CPU,
        device_id: 0,
        cuda_sm: 0,
        cpu_isa: (here | lacking).bits(),
        total_memory_bytes: 0,
        free_memory_bytes: 0,
        next_ext: std::ptr::null(),
    };
    both_faces_refuse_to_execute(&host, &wide, &as_other, Some(caps), lacking);
}

/// An embedder that declares more instructions than the CPU has (`DeviceSupport::cpu_isa`)
/// steers resolution as a query's device record does (a C query without one resolves against
/// it), and gets the same refusal at execute.
#[test]
fn instructions_an_embedder_declares_but_the_cpu_lacks_are_not_executed() {
    let shop = Workshop::new();
    let lacking = isa_this_cpu_lacks();
    let declared = guild_host::platform::cpu_isa() | lacking;
    let devices = DeviceSupport {
        cpu_isa: declared,
        ..DeviceSupport::host()
    };
    let (host, wide) = host_with_a_kernel_needing(&shop, lacking, devices);
    // `OperationRequest::cpu` names this CPU as detected; a Rust runner following the
    // embedder's declaration names it.
    let mut as_declared = request(4);
    as_declared.device.cpu_isa = declared;
    both_faces_refuse_to_execute(&host, &wide, &as_declared, None, lacking);
}

/// A device provider's descriptor may require CPU instruction sets too (its host-side code runs
/// on the CPU): resolved as a CPU with them, its execute is refused here as a CPU provider's is.
#[test]
fn a_device_provider_needing_instructions_this_cpu_lacks_is_not_executed() {
    let shop = Workshop::new();
    let lacking = isa_this_cpu_lacks();
    let wide = Arc::new(FakeProvider::new().executing(double));
    let plugin = FakePlugin::new().with_kernel(fake_operation_with(
        OpCandidate {
            cpu_isa: lacking,
            backend: Backend::Cuda,
            ..candidate(WIDE, 30)
        },
        wide.clone(),
    ));
    let devices = DeviceSupport {
        cuda_sm: Some(80),
        ..DeviceSupport::host()
    };
    let (host, _, _) = fake_host_on(
        &shop,
        Spec::module("ex.fake", "1.0.0").backend("cuda"),
        plugin,
        devices,
    );
    let service = OperationService::new(host.kernels());
    let mut as_other = request(4);
    as_other.backends = Backend::Cuda.into();
    as_other.device.cuda_sm = Some(80);
    as_other.device.cpu_isa = guild_host::platform::cpu_isa() | lacking;
    let handle = service.resolve(&as_other).unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), WIDE);
    let mut out = [0i64; 4];
    let err = handle
        .execute(
            &[TensorArg::new(&i64s(4), &[1i64, 2, 3, 4])],
            &mut [TensorArgMut::new(&i64s(4), &mut out)],
            None,
        )
        .unwrap_err();
    assert_eq!(
        err,
        ExecuteError::MissingCpuIsa {
            impl_id: ImplId::new(WIDE).unwrap(),
            missing: lacking,
        }
    );
    assert_eq!(wide.calls().execute, 0, "the provider was not called");
}

/// Every candidate a resolution asks sees its own device record in the query, whichever was
/// asked before it: a CUDA provider the compute capability (and no CPU instructions), a CPU
/// provider the CPU's instructions (and no compute capability), on both faces and in both
/// callbacks.
#[test]
fn each_candidate_is_asked_with_its_own_device_record() {
    let shop = Workshop::new();
    type Seen = Arc<Mutex<Vec<(u32, u32, u64)>>>;
    let record = |seen: &Seen, q: &guild_ports::provider::QueryCall<'_>| {
        let caps = q
            .device_caps()
            .expect("every query carries a device record");
        seen.lock()
            .unwrap()
            .push((caps.backend, caps.cuda_sm, caps.cpu_isa));
    };
    let (cuda_seen, cpu_seen): (Seen, Seen) = Default::default();
    let (v, s) = (cuda_seen.clone(), cpu_seen.clone());
    let cuda = FakeProvider::new().validating(move |q| {
        record(&v, &q);
        Err(ProviderRefusal::new(
            GUILD_STATUS_ERR_UNSUPPORTED,
            "refuses, so that the next candidate is asked",
        ))
    });
    let (v, s2) = (cpu_seen.clone(), s);
    let cpu = FakeProvider::new()
        .validating(move |q| {
            record(&v, &q);
            Ok(())
        })
        .scratch(move |q| {
            record(&s2, &q);
            Ok(FakeScratch::default())
        })
        .executing(double);
    let plugin = FakePlugin::new()
        .with_kernel(fake_operation_with(
            OpCandidate {
                backend: Backend::Cuda,
                ..candidate("ex.fake.op.cuda", 30)
            },
            Arc::new(cuda),
        ))
        .with_kernel(fake_operation_with(
            candidate("ex.fake.op.cpu", 20),
            Arc::new(cpu),
        ));
    let devices = DeviceSupport {
        cuda_sm: Some(80),
        ..DeviceSupport::host()
    };
    let host_isa = devices.cpu_isa;
    let (host, _, _) = fake_host_on(
        &shop,
        Spec::module("ex.fake", "1.0.0")
            .backend("cuda")
            .op("ex.fake.op.cuda"),
        plugin,
        devices,
    );
    let mut as_both = request(4);
    as_both.backends = BackendSet::CPU | BackendSet::CUDA;
    as_both.device.cuda_sm = Some(80);
    let service = OperationService::new(host.kernels());
    let handle = service.resolve(&as_both).unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), "ex.fake.op.cpu");

    // No device record: the host's device 0, with its compute capability and instructions.
    let c = Service::of(host.kernels());
    let t = tensor(GUILD_DTYPE_I64, &[4], &[]);
    let mut query = Query::cpu(OP, vec![t], vec![t]);
    query.backends = guild_abi::GUILD_BACKEND_CUDA | guild_abi::GUILD_BACKEND_CPU;
    let c_handle = c.resolve(&query).unwrap();
    assert_eq!(c_handle.describe().unwrap().impl_id, "ex.fake.op.cpu");

    let on_cuda = (guild_abi::GUILD_BACKEND_CUDA, 80, 0);
    let on_cpu = |isa: CpuIsa| (guild_abi::GUILD_BACKEND_CPU, 0, isa.bits());
    let (rust, c) = (on_cpu(as_both.device.cpu_isa), on_cpu(host_isa));
    assert_eq!(
        *cuda_seen.lock().unwrap(),
        [on_cuda; 2],
        "validate, each face"
    );
    assert_eq!(
        *cpu_seen.lock().unwrap(),
        [rust, rust, c, c],
        "validate then query_scratch, each face"
    );
}

/// Naming more instruction sets than this CPU has changes nothing for a kernel that needs only
/// what it has: the handle executes.
#[test]
fn a_request_naming_more_instructions_still_executes_a_kernel_this_cpu_can_run() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let mut as_other = request(4);
    as_other.device.cpu_isa = guild_host::platform::cpu_isa() | isa_this_cpu_lacks();
    let handle = service.resolve(&as_other).unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), FAST);
    let mut scratch = Aligned([0; 64]);
    let mut out = [0i64; 4];
    handle
        .execute(
            &[TensorArg::new(&i64s(4), &[1i64, 2, 3, 4])],
            &mut [TensorArgMut::new(&i64s(4), &mut out)],
            Some(&mut scratch.0),
        )
        .unwrap();
    assert_eq!(out, [2, 4, 6, 8]);
}

/// A resolution of one candidate allocates only what the handle keeps: the handle and its
/// contract's one block (the descriptors, their shapes and, on the Rust face, the call
/// tensors). The query borrows the caller's name and tensors; the C face reads them on its
/// frame, the Rust face makes their C form in that block (G28). Counted on this thread alone,
/// with a provider that allocates nothing itself, after a first resolution on each face.
#[test]
fn a_resolution_allocates_only_what_its_handle_keeps() {
    let shop = Workshop::new();
    let quiet = FakeProvider::new().scratch(|_| {
        Ok(FakeScratch {
            host_bytes: 0,
            device_bytes: 0,
            alignment: 0,
        })
    });
    let plugin = FakePlugin::new().with_kernel(fake_operation_with(
        candidate("ex.lean.op.cpu", 10),
        Arc::new(quiet),
    ));
    let (host, _, _) = fake_host(&shop, Spec::module("ex.lean", "1.0.0"), plugin);

    let rust = OperationService::new(host.kernels());
    let request = request(4);
    drop(rust.resolve(&request).unwrap());
    let mut handle = None;
    let made = crate::allocations::made_by(|| handle = Some(rust.resolve(&request).unwrap()));
    assert!(made <= 2, "a Rust resolution made {made} allocations");
    let handle = handle.unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), "ex.lean.op.cpu");
    assert_eq!(handle.inputs(), &request.inputs[..]);
    assert_eq!(handle.outputs(), &request.outputs[..]);
    drop(handle);

    let service = Service::of(host.kernels());
    let t = tensor(GUILD_DTYPE_I64, &[4], &[]);
    let query = Query::cpu(OP, vec![t], vec![t]);
    drop(service.resolve(&query).unwrap());
    let mut handle = None;
    let made = crate::allocations::made_by(|| handle = Some(service.resolve(&query).unwrap()));
    assert!(made <= 2, "a C resolution made {made} allocations");
    drop(handle);
}
