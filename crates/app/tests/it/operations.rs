//! The operation service's safe Rust face over the real C scan modules (test-plugins
//! scan_module and scan_module_alt), installed as signed gkmodules and loaded with dlopen:
//! ranking, exact ids, rejection reports, execution against a Rust reference, argument checks
//! before the provider runs, leases held by handles, and concurrent execution.

use std::sync::Arc;

use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::{ImplId, OpName};
use guild_domain::lease::QuiescentAction;
use guild_domain::operation::{
    Backend, DType, FailureKind, MemorySpace, ProviderRefusal, Rejection, TensorDesc,
};
use guild_domain::version::PackedVersion;
use guild_host::operations::{
    DeviceSupport, ExecuteError, PassReason, PassedOver, ResolveError, TensorArg, TensorArgMut,
};
use guild_host::{Host, HostError, InstallOptions, OpHandle, OperationRequest, OperationService};
use guild_test_support::plugins::{alt_spec, scan_spec, ALT_INCLUSIVE, EXCLUSIVE, INCLUSIVE};
use guild_test_support::{id, key, open_dir, trust, Spec, Workshop, PUBLISHER};

pub(crate) use guild_test_support::plugins::EXCLUSIVE_OP;
pub(crate) use guild_test_support::plugins::INCLUSIVE_OP;
/// A host over a fresh store with packages built, signed, installed and loaded by dlopen.
pub(crate) struct Fixture {
    pub(crate) shop: Workshop,
    pub(crate) key: guild_adapters_crypto::SigningKey,
    pub(crate) host: Host,
    pub(crate) loader: DlopenLoader,
}

/// A [`Fixture`] with `specs` installed in that order (each loads at once), the operation
/// service resolving against `devices`.
pub(crate) fn fixture_with(specs: &[Spec], devices: DeviceSupport) -> Fixture {
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let loader = DlopenLoader::new();
    let host = Host::with_devices(pm, Box::new(loader.clone()), devices);
    for spec in specs {
        let built = shop.build(spec, &k);
        host.install(&built.archive, InstallOptions::default())
            .unwrap_or_else(|e| panic!("installing {}: {e}", spec.id));
    }
    assert_eq!(loader.open_libraries(), specs.len());
    Fixture {
        shop,
        key: k,
        host,
        loader,
    }
}

/// Both scan modules.
fn fixture() -> Fixture {
    fixture_with(
        &[scan_spec("1.0.0"), alt_spec("1.0.0")],
        DeviceSupport::host(),
    )
}

pub(crate) fn op(name: &str) -> OpName {
    OpName::new(name).unwrap()
}

fn impl_id(name: &str) -> ImplId {
    ImplId::new(name).unwrap()
}

pub(crate) fn desc(dtype: DType, dims: &[u64], strides: &[u64]) -> TensorDesc {
    TensorDesc::new(dtype, dims, MemorySpace::Host).with_strides(strides)
}

fn request(name: &str, dtype: DType, dims: &[u64]) -> OperationRequest {
    OperationRequest::cpu(
        op(name),
        vec![desc(dtype, dims, &[])],
        vec![desc(dtype, dims, &[])],
    )
}

#[test]
fn f32_resolves_to_the_priority_10_provider() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels()).reporting();
    let handle = service
        .resolve(&request(INCLUSIVE_OP, DType::F32, &[4, 2]))
        .unwrap();
    let d = handle.describe();
    assert_eq!(d.impl_id.as_str(), INCLUSIVE);
    assert_eq!(d.package.as_str(), "example.scan");
    assert_eq!(d.package_version.to_string(), "1.0.0");
    assert_eq!(d.op_name.as_str(), INCLUSIVE_OP);
    assert_eq!(d.op_version, PackedVersion::new(1, 0, 0).unwrap());
    assert_eq!(d.backend, Backend::Cpu);
    assert_eq!(d.priority, 10);
    assert_eq!((d.scratch.host_bytes, d.scratch.device_bytes), (0, 0));
    assert_eq!(handle.scratch(), d.scratch);
    // The alternative was not asked: it ranks below the choice.
    assert_eq!(
        handle.passed_over(),
        Some(
            &[PassedOver {
                impl_id: impl_id(ALT_INCLUSIVE),
                reason: PassReason::Outranked,
            }][..]
        )
    );
    // A service that is not asked for the report keeps none, and chooses the same.
    let quiet = OperationService::new(f.host.kernels())
        .resolve(&request(INCLUSIVE_OP, DType::F32, &[4, 2]))
        .unwrap();
    assert_eq!(quiet.describe().impl_id.as_str(), INCLUSIVE);
    assert_eq!(quiet.passed_over(), None);
}

#[test]
fn an_exact_impl_id_chooses_the_alternative() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels()).reporting();
    let handle = service
        .resolve(&request(INCLUSIVE_OP, DType::F32, &[4, 2]).exact(impl_id(ALT_INCLUSIVE)))
        .unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), ALT_INCLUSIVE);
    assert_eq!(handle.describe().package.as_str(), "example.scan_alt");
    assert_eq!(handle.describe().priority, 5);
    assert_eq!(
        handle.passed_over(),
        Some(
            &[PassedOver {
                impl_id: impl_id(INCLUSIVE),
                reason: PassReason::Rejected(Rejection::NotExactImpl),
            }][..]
        )
    );
}

#[test]
fn i32_chooses_the_main_provider_and_an_exact_alt_fails_with_its_reason() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let handle = service
        .resolve(&request(INCLUSIVE_OP, DType::I32, &[4, 2]))
        .unwrap();
    assert_eq!(handle.describe().impl_id.as_str(), INCLUSIVE);

    // The alternative refuses integers in its validate callback; an exact request for it
    // does not fall back, and the report says why for every candidate.
    let err = service
        .resolve(&request(INCLUSIVE_OP, DType::I32, &[4, 2]).exact(impl_id(ALT_INCLUSIVE)))
        .unwrap_err();
    let failure = err.failure().expect("a resolution report");
    assert_eq!(
        failure.kind,
        FailureKind::ExactImplRejected {
            impl_id: impl_id(ALT_INCLUSIVE)
        }
    );
    let alt = failure
        .rejections
        .iter()
        .find(|r| r.impl_id.as_str() == ALT_INCLUSIVE)
        .unwrap();
    assert_eq!(
        alt.reason,
        Rejection::ValidateRefused(ProviderRefusal::new(
            -2,
            "input dtype 26 (i32) is not supported by this scan"
        ))
    );
    let main = failure
        .rejections
        .iter()
        .find(|r| r.impl_id.as_str() == INCLUSIVE)
        .unwrap();
    assert_eq!(main.reason, Rejection::NotExactImpl);
    let text = err.to_string();
    assert!(
        text.contains("input dtype 26 (i32) is not supported by this scan"),
        "{text}"
    );
    assert!(text.contains(INCLUSIVE), "{text}");

    // A strided query is refused by the alternative's static contract (layout).
    let strided = OperationRequest::cpu(
        op(INCLUSIVE_OP),
        vec![desc(DType::F32, &[4, 2], &[0, 6])],
        vec![desc(DType::F32, &[4, 2], &[])],
    )
    .exact(impl_id(ALT_INCLUSIVE));
    let err = service.resolve(&strided).unwrap_err();
    let alt = err
        .failure()
        .unwrap()
        .rejections
        .iter()
        .find(|r| r.impl_id.as_str() == ALT_INCLUSIVE);
    assert!(
        matches!(alt.unwrap().reason, Rejection::LayoutUnsupported { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("outer-strided"), "{err}");

    // An exact id nobody registered.
    let err = service
        .resolve(&request(INCLUSIVE_OP, DType::F32, &[4]).exact(impl_id("example.none.cpu")))
        .unwrap_err();
    assert!(matches!(
        err.failure().unwrap().kind,
        FailureKind::ExactImplAbsent { .. }
    ));
    // An exact id registered for the other operation says so.
    let err = service
        .resolve(&request(INCLUSIVE_OP, DType::F32, &[4]).exact(impl_id(EXCLUSIVE)))
        .unwrap_err();
    assert_eq!(
        err.failure().unwrap().kind,
        FailureKind::ExactImplAbsent {
            impl_id: impl_id(EXCLUSIVE),
            registered_for: Some(op(EXCLUSIVE_OP)),
        }
    );
    // An invalid request is refused before any provider is asked.
    let err = service
        .resolve(&request(INCLUSIVE_OP, DType::F32, &[0]))
        .unwrap_err();
    assert!(matches!(err, ResolveError::Query(_)), "{err}");
}

/// Row starts (element offsets) of a tensor, outer axes with axis 1 fastest.
pub(crate) fn row_offsets(dims: &[u64], strides: &[u64]) -> Vec<usize> {
    let mut eff = vec![1u64; dims.len()];
    for i in 1..dims.len() {
        let packed = eff[i - 1] * dims[i - 1];
        eff[i] = match strides.get(i) {
            Some(&s) if s != 0 => s,
            _ => packed,
        };
    }
    let mut offsets = vec![0u64];
    for axis in 1..dims.len() {
        let (inner, step) = (offsets, eff[axis]);
        offsets = (0..dims[axis])
            .flat_map(|i| inner.iter().map(move |&o| o + i * step))
            .collect();
    }
    offsets.into_iter().map(|o| o as usize).collect()
}

pub(crate) fn reference<T: Copy + std::ops::Add<Output = T> + Default>(
    input: &[T],
    output: &mut [T],
    dims: &[u64],
    in_strides: &[u64],
    out_strides: &[u64],
    exclusive: bool,
) {
    for (ri, ro) in row_offsets(dims, in_strides)
        .into_iter()
        .zip(row_offsets(dims, out_strides))
    {
        let mut acc = T::default();
        for k in 0..dims[0] as usize {
            if exclusive {
                output[ro + k] = acc;
                acc = acc + input[ri + k];
            } else {
                acc = acc + input[ri + k];
                output[ro + k] = acc;
            }
        }
    }
}

/// Resolves and executes one strided case (3 x 2 x 2, input rows 5 apart, output rows 4 apart)
/// and compares with the reference; padding keeps its sentinel.
fn run_case<T>(service: &OperationService<'_>, dtype: DType, exclusive: bool, values: Vec<T>)
where
    T: guild_host::operations::Element
        + std::ops::Add<Output = T>
        + Default
        + PartialEq
        + std::fmt::Debug,
{
    let dims = [3u64, 2, 2];
    let (in_strides, out_strides) = ([0u64, 5, 10], [0u64, 4, 8]);
    let name = if exclusive {
        EXCLUSIVE_OP
    } else {
        INCLUSIVE_OP
    };
    let input_desc = desc(dtype, &dims, &in_strides);
    let output_desc = desc(dtype, &dims, &out_strides);
    let handle = service
        .resolve(&OperationRequest::cpu(
            op(name),
            vec![input_desc],
            vec![output_desc],
        ))
        .unwrap();
    let expected_impl = if exclusive { EXCLUSIVE } else { INCLUSIVE };
    assert_eq!(handle.describe().impl_id.as_str(), expected_impl);
    assert_eq!(values.len(), 20);
    let sentinel = values[4];
    let mut output = vec![sentinel; 16];
    let mut want = output.clone();
    reference(
        &values,
        &mut want,
        &dims,
        &in_strides,
        &out_strides,
        exclusive,
    );
    handle
        .execute(
            &[TensorArg::new(&input_desc, &values)],
            &mut [TensorArgMut::new(&output_desc, &mut output)],
            None,
        )
        .unwrap();
    assert_eq!(output, want, "{name} over {dtype:?}");
}

#[test]
fn both_scans_execute_strided_f32_and_i64_like_the_reference() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    for exclusive in [false, true] {
        run_case::<f32>(
            &service,
            DType::F32,
            exclusive,
            (0..20).map(|i| (i as f32) * 0.5 - 3.0).collect(),
        );
        run_case::<i64>(
            &service,
            DType::I64,
            exclusive,
            (0..20).map(|i| (i as i64 - 7) << 33).collect(),
        );
    }
}

#[test]
fn bad_arguments_are_refused_before_the_provider_runs() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let d = desc(DType::F32, &[4, 2], &[]);
    let handle = service
        .resolve(&OperationRequest::cpu(op(INCLUSIVE_OP), vec![d], vec![d]))
        .unwrap();
    let input = [1.0f32; 8];

    // Too small an output buffer: nothing is written.
    let mut small = [9.0f32; 7];
    let err = handle
        .execute(
            &[TensorArg::new(&d, &input)],
            &mut [TensorArgMut::new(&d, &mut small)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ExecuteError::BufferTooSmall {
                needed: 32,
                got: 28,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(small, [9.0; 7]);

    // Elements of the wrong type.
    let mut ints = [9i32; 8];
    let err = handle
        .execute(
            &[TensorArg::new(&d, &input)],
            &mut [TensorArgMut::new(&d, &mut ints)],
            None,
        )
        .unwrap_err();
    assert!(matches!(err, ExecuteError::ElementType { .. }), "{err}");
    assert_eq!(ints, [9; 8]);

    // Another shape or dtype than negotiated.
    let mut out = [9.0f32; 8];
    let other = desc(DType::F32, &[2, 4], &[]);
    let err = handle
        .execute(
            &[TensorArg::new(&d, &input)],
            &mut [TensorArgMut::new(&other, &mut out)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(err, ExecuteError::DescriptorMismatch { .. }),
        "{err}"
    );
    let err = handle
        .execute(
            &[TensorArg::new(&desc(DType::I32, &[4, 2], &[]), &[1i32; 8])],
            &mut [TensorArgMut::new(&d, &mut out)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(err, ExecuteError::DescriptorMismatch { .. }),
        "{err}"
    );
    // Missing arguments.
    let err = handle
        .execute(&[], &mut [TensorArgMut::new(&d, &mut out)], None)
        .unwrap_err();
    assert!(matches!(err, ExecuteError::Arity { .. }), "{err}");
    // Misaligned data (the contract asks for 4 bytes): raw bytes one past an aligned start.
    let bytes = [0u8; 40];
    let start = bytes.as_ptr().align_offset(4) + 1;
    let err = handle
        .execute(
            &[TensorArg::new(&d, &bytes[start..start + 32])],
            &mut [TensorArgMut::new(&d, &mut out)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ExecuteError::Contract {
                rejection: Rejection::Misaligned { .. }
            }
        ),
        "{err}"
    );
    assert_eq!(out, [9.0; 8]);

    // And the correct call works.
    handle
        .execute(
            &[TensorArg::new(&d, &input)],
            &mut [TensorArgMut::new(&d, &mut out)],
            None,
        )
        .unwrap();
    assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
}

/// A disable refused because a handle lives must not hide the package from anyone else, not
/// even for the instant of its check: every concurrent resolve still chooses the priority 10
/// provider, and one that only it can serve (i32) never fails.
#[test]
fn a_refused_disable_never_hides_the_package_from_other_threads() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let f32_request = request(INCLUSIVE_OP, DType::F32, &[4, 2]);
    let i32_request = request(INCLUSIVE_OP, DType::I32, &[4, 2]);
    let held = service.resolve(&f32_request).unwrap();
    assert_eq!(held.describe().impl_id.as_str(), INCLUSIVE);
    let package = id("example.scan");
    let done = AtomicBool::new(false);
    // The disables start once both lookers are looking, so that the two overlap however the
    // threads are scheduled.
    let started = std::sync::Barrier::new(3);
    let (lookups, misses) = std::thread::scope(|s| {
        let lookers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let (mut lookups, mut misses) = (0u64, Vec::new());
                    started.wait();
                    // At least one round each, however late the thread runs.
                    for round in 0u64.. {
                        if round > 0 && done.load(Ordering::Acquire) {
                            break;
                        }
                        match service.resolve(&f32_request) {
                            Ok(h) if h.describe().impl_id.as_str() == INCLUSIVE => {}
                            Ok(h) => misses.push(format!("f32 chose {}", h.describe().impl_id)),
                            Err(e) => misses.push(format!("f32: {e}")),
                        }
                        if let Err(e) = service.resolve(&i32_request) {
                            misses.push(format!("i32: {e}"));
                        }
                        if f.host.kernels().find_by_id(&impl_id(INCLUSIVE)).is_none() {
                            misses.push("find_by_id found nothing".to_owned());
                        }
                        lookups += 3;
                    }
                    (lookups, misses)
                })
            })
            .collect();
        started.wait();
        for _ in 0..2_000 {
            match f.host.disable(&package) {
                Err(HostError::Leased(l)) => assert_eq!(l.action, QuiescentAction::Unload),
                other => panic!("the live handle must refuse the disable: {other:?}"),
            }
        }
        done.store(true, Ordering::Release);
        lookers.into_iter().map(|l| l.join().unwrap()).fold(
            (0, Vec::new()),
            |(n, mut all), (k, m)| {
                all.extend(m);
                (n + k, all)
            },
        )
    });
    assert!(
        misses.is_empty(),
        "{} of {lookups} lookups missed the enabled package during refused disables, e.g. {:?}",
        misses.len(),
        &misses[..misses.len().min(3)]
    );
    assert!(lookups > 0);
    drop(held);
}

#[test]
fn a_handle_holds_its_package_until_dropped() {
    let f = fixture();
    let pkg = id("example.scan");
    let v11 = f.shop.build(&scan_spec("1.1.0"), &f.key);
    f.host
        .install(&v11.archive, InstallOptions::default())
        .unwrap();
    assert_eq!(
        f.loader.open_libraries(),
        2,
        "1.0.0 closed, nothing held it"
    );
    let service = OperationService::new(f.host.kernels());
    let d = desc(DType::I64, &[3], &[]);
    let handle = service
        .resolve(&OperationRequest::cpu(op(INCLUSIVE_OP), vec![d], vec![d]))
        .unwrap();
    assert_eq!(handle.describe().package_version.to_string(), "1.1.0");
    assert!(f.host.active_package_leases(&pkg) > 0);
    match f.host.rollback(&pkg).unwrap_err() {
        HostError::Leased(l) => {
            assert_eq!(l.action, QuiescentAction::Rollback);
            assert!(l.bindings > 0);
        }
        other => panic!("expected a lease refusal, got {other}"),
    }

    // A replacement is refused while the handle holds the package, and changes nothing.
    let v12 = f.shop.build(&scan_spec("1.2.0"), &f.key);
    match f
        .host
        .install(&v12.archive, InstallOptions::default())
        .unwrap_err()
    {
        HostError::Leased(l) => {
            assert_eq!((l.action, l.bindings), (QuiescentAction::Replace, 1));
        }
        other => panic!("expected a lease refusal, got {other}"),
    }
    assert_eq!(f.loader.open_libraries(), 2);
    let mut out = [0i64; 3];
    handle
        .execute(
            &[TensorArg::new(&d, &[1i64, 2, 3])],
            &mut [TensorArgMut::new(&d, &mut out)],
            None,
        )
        .unwrap();
    assert_eq!(out, [1, 3, 6]);

    drop(handle);
    assert_eq!(f.host.active_package_leases(&pkg), 0);
    f.host
        .install(&v12.archive, InstallOptions::default())
        .unwrap();
    assert_eq!(
        f.loader.open_libraries(),
        2,
        "1.1.0 closed as it was replaced"
    );
    let rolled = f.host.rollback(&pkg).unwrap();
    assert_eq!(rolled.to.to_string(), "1.1.0");
}

/// Executes `handle` `rounds` times on rows of `seed`, checking each result.
fn hammer(handle: &OpHandle<'_>, exclusive: bool, seed: i64, rounds: usize) {
    let d = desc(DType::I64, &[16, 4], &[]);
    for round in 0..rounds {
        let input: Vec<i64> = (0..64).map(|i| seed * 1000 + i + round as i64).collect();
        let mut output = vec![0i64; 64];
        let mut want = vec![0i64; 64];
        reference(&input, &mut want, &[16, 4], &[], &[], exclusive);
        handle
            .execute(
                &[TensorArg::new(&d, &input)],
                &mut [TensorArgMut::new(&d, &mut output)],
                None,
            )
            .unwrap();
        assert_eq!(output, want);
    }
}

#[test]
fn independent_and_shared_handles_execute_concurrently() {
    let f = fixture();
    let service = OperationService::new(f.host.kernels());
    let d = desc(DType::I64, &[16, 4], &[]);
    let resolve = |name: &str| {
        service
            .resolve(&OperationRequest::cpu(op(name), vec![d], vec![d]))
            .unwrap()
    };
    let inclusive = resolve(INCLUSIVE_OP);
    let exclusive = resolve(EXCLUSIVE_OP);
    let shared = Arc::new(resolve(INCLUSIVE_OP));
    std::thread::scope(|s| {
        s.spawn(|| hammer(&inclusive, false, 1, 200));
        s.spawn(|| hammer(&exclusive, true, 2, 200));
        for t in 0..4 {
            let shared = Arc::clone(&shared);
            s.spawn(move || hammer(&shared, false, 10 + t, 200));
        }
    });
    assert!(f.host.active_package_leases(&id("example.scan")) >= 3);
    drop((inclusive, exclusive, shared));
    assert_eq!(f.host.active_package_leases(&id("example.scan")), 0);
}
