//! Operation descriptors, queries and the choice of a provider: one test per rejection reason,
//! the ranking rules, and properties of the resolution as a whole.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use guild_domain::ids::{ImplId, OpName};
use guild_domain::operation::*;
use guild_domain::version::{PackedVersion, VersionError};
use proptest::prelude::*;

const OP: &str = "example.sequence.inclusive_scan";
const OTHER_OP: &str = "example.sequence.exclusive_scan";

fn v(text: &str) -> PackedVersion {
    PackedVersion::parse(text).unwrap()
}

fn id(text: &str) -> ImplId {
    ImplId::new(text).unwrap()
}

/// A CPU candidate that accepts [`spec`] as it stands; each test breaks one thing.
fn candidate(impl_id: &str) -> OpCandidate {
    OpCandidate {
        impl_id: id(impl_id),
        op_name: OpName::new(OP).unwrap(),
        backend: Backend::Cpu,
        priority: 0,
        op_version: v("1.2.0"),
        capabilities: Capabilities::from_bits(0b11),
        numerics: Numerics::from_bits(0b1),
        input_dtype: DType::F32,
        output_dtype: DType::F32,
        inputs: Arity::exactly(1),
        outputs: Arity::exactly(1),
        layouts: LayoutSet::CONTIGUOUS | LayoutSet::OUTER_STRIDED,
        memory_spaces: MemorySpaceSet::HOST | MemorySpaceSet::HOST_PINNED,
        min_alignment: 16,
        min_rank: 1,
        max_rank: 4,
        max_dim: [0; 8],
        max_batch: 0,
        sync_modes: SyncModeSet::HOST_BLOCKING,
        min_sm: 0,
        max_sm: 0,
        cpu_isa: CpuIsa::from_bits(0b1),
    }
}

fn host_f32(shape: &[u64], addr: u64) -> TensorDesc {
    TensorDesc::new(DType::F32, shape, MemorySpace::Host).with_data_addr(addr)
}

/// A host-blocking scan of one 64x3 f32 tensor into another.
fn spec() -> QuerySpec {
    QuerySpec {
        op_name: OpName::new(OP).unwrap(),
        min_version: v("1.0.0"),
        max_version: v("1.9.0"),
        backends: BackendSet::CPU | BackendSet::CUDA,
        capabilities: Capabilities::from_bits(0b1),
        numerics: Numerics::EMPTY,
        sync_mode: SyncMode::HostBlocking,
        inputs: vec![host_f32(&[64, 3], 0x1000)],
        outputs: vec![host_f32(&[64, 3], 0x2000)],
        ram_budget: Budget::UNLIMITED,
        vram_budget: Budget::UNLIMITED,
        exact_impl: None,
        device: DeviceCaps {
            device_id: 0,
            cuda_sm: Some(86),
            cpu_isa: CpuIsa::from_bits(0b111),
        },
    }
}

fn query(spec: &QuerySpec) -> OpQuery<'_> {
    OpQuery::new(spec).unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Callback {
    Validate,
    Scratch,
}

/// A provider whose answers are scripted per impl id (by default: accept, no scratch) and which
/// records every call, so that tests can prove which callbacks ran.
#[derive(Default)]
struct Scripted {
    refuse_validate: HashMap<String, ProviderRefusal>,
    refuse_scratch: HashMap<String, ProviderRefusal>,
    scratch: HashMap<String, ScratchRequest>,
    calls: RefCell<Vec<(String, Callback)>>,
}

impl Scripted {
    fn refusing_validate(mut self, impl_id: &str, refusal: ProviderRefusal) -> Self {
        self.refuse_validate.insert(impl_id.to_owned(), refusal);
        self
    }

    fn refusing_scratch(mut self, impl_id: &str, refusal: ProviderRefusal) -> Self {
        self.refuse_scratch.insert(impl_id.to_owned(), refusal);
        self
    }

    fn asking(mut self, impl_id: &str, host_bytes: u64, device_bytes: u64) -> Self {
        self.scratch.insert(
            impl_id.to_owned(),
            ScratchRequest {
                host_bytes,
                device_bytes,
            },
        );
        self
    }

    fn calls(&self) -> Vec<(String, Callback)> {
        self.calls.borrow().clone()
    }

    fn called(&self, impl_id: &str) -> bool {
        self.calls.borrow().iter().any(|(i, _)| i == impl_id)
    }
}

impl Negotiator for Scripted {
    fn validate(
        &self,
        index: usize,
        c: &OpCandidate,
        _: &OpQuery<'_>,
    ) -> Result<(), ProviderRefusal> {
        let _ = index;
        self.calls
            .borrow_mut()
            .push((c.impl_id.to_string(), Callback::Validate));
        match self.refuse_validate.get(c.impl_id.as_str()) {
            Some(refusal) => Err(refusal.clone()),
            None => Ok(()),
        }
    }

    fn query_scratch(
        &self,
        _: usize,
        c: &OpCandidate,
        _: &OpQuery<'_>,
    ) -> Result<ScratchRequest, ProviderRefusal> {
        self.calls
            .borrow_mut()
            .push((c.impl_id.to_string(), Callback::Scratch));
        match self.refuse_scratch.get(c.impl_id.as_str()) {
            Some(refusal) => Err(refusal.clone()),
            None => Ok(self
                .scratch
                .get(c.impl_id.as_str())
                .copied()
                .unwrap_or_default()),
        }
    }
}

/// Resolves `spec` against the single candidate `c` and returns the reason it was rejected,
/// asserting that it was the only verdict and that nothing was chosen.
fn rejection_with(c: OpCandidate, spec: QuerySpec, provider: &Scripted) -> Rejection {
    let asked = spec;
    let q = query(&asked);
    let candidates = [c];
    let r = resolve(&q, &candidates, provider);
    assert_eq!(r.choice(), None, "{r}");
    assert_eq!(r.verdicts().len(), 1, "{r}");
    match &r.verdicts()[0].reason {
        Reason::Rejected(reason) => reason.clone(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// As [`rejection_with`], with a provider that accepts everything, and asserting that a static
/// rejection called no callback.
fn rejection(c: OpCandidate, spec: QuerySpec) -> Rejection {
    let provider = Scripted::default();
    let reason = rejection_with(c, spec, &provider);
    if reason.is_static() {
        assert_eq!(
            provider.calls(),
            vec![],
            "static rejection {reason} called the provider"
        );
    }
    reason
}

// ---------------------------------------------------------------------------------------------
// The baseline accepts, so that every rejection below is caused by the one change it makes.

#[test]
fn the_baseline_candidate_is_chosen_with_its_scratch() {
    let asked = spec();
    let q = query(&asked);
    let candidates = [candidate("a.cpu")];
    let provider = Scripted::default().asking("a.cpu", 128, 0);
    let r = resolve(&q, &candidates, &provider);
    assert_eq!(
        r.choice(),
        Some(&Choice {
            index: 0,
            impl_id: id("a.cpu"),
            scratch: ScratchRequest {
                host_bytes: 128,
                device_bytes: 0
            }
        })
    );
    assert_eq!(r.verdicts(), &[]);
    assert_eq!(
        provider.calls(),
        vec![
            ("a.cpu".to_owned(), Callback::Validate),
            ("a.cpu".to_owned(), Callback::Scratch)
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// One test per rejection reason.

#[test]
fn rank_outside_bounds_names_the_tensor() {
    let mut c = candidate("a.cpu");
    c.inputs = Arity::exactly(2);
    let mut s = spec();
    s.inputs.push(host_f32(&[4, 2, 2, 2, 2], 0x3000));
    assert_eq!(
        rejection(c, s),
        Rejection::RankOutOfRange {
            tensor: TensorRef::input(1),
            rank: 5,
            min: 1,
            max: 4
        }
    );

    let mut c = candidate("a.cpu");
    c.min_rank = 3;
    assert_eq!(
        rejection(c, spec()),
        Rejection::RankOutOfRange {
            tensor: TensorRef::input(0),
            rank: 2,
            min: 3,
            max: 4
        }
    );
}

#[test]
fn dimension_bound_applies_to_every_axis() {
    let mut c = candidate("a.cpu");
    c.max_dim = [32; 8];
    assert_eq!(
        rejection(c.clone(), spec()),
        Rejection::DimensionTooLarge {
            tensor: TensorRef::input(0),
            axis: 0,
            dim: 64,
            max: 32
        }
    );

    let mut s = spec();
    s.inputs = vec![host_f32(&[16, 3], 0x1000)];
    s.outputs = vec![host_f32(&[16, 40], 0x2000)];
    assert_eq!(
        rejection(c, s.clone()),
        Rejection::DimensionTooLarge {
            tensor: TensorRef::output(0),
            axis: 1,
            dim: 40,
            max: 32
        }
    );

    // Bounds are per axis: only axis 1 is bounded here, so the same shapes fail on axis 1 alone.
    let mut c = candidate("a.cpu");
    c.max_dim = [0, 39, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        rejection(c, s),
        Rejection::DimensionTooLarge {
            tensor: TensorRef::output(0),
            axis: 1,
            dim: 40,
            max: 39
        }
    );
}

#[test]
fn batch_bound_is_the_product_of_the_outer_axes() {
    let mut c = candidate("a.cpu");
    c.max_batch = 5;
    let mut s = spec();
    s.inputs = vec![host_f32(&[64, 3, 2], 0x1000)];
    s.outputs = vec![host_f32(&[64, 3, 2], 0x2000)];
    assert_eq!(
        rejection(c.clone(), s),
        Rejection::BatchTooLarge {
            tensor: TensorRef::input(0),
            batch: 6,
            max: 5
        }
    );

    // The innermost axis is not part of the batch: 64 x 3 has batch 3, within 5.
    let asked = spec();
    let q = query(&asked);
    let r = resolve(&q, std::slice::from_ref(&c), &Scripted::default());
    assert_eq!(r.choice().map(|ch| ch.impl_id.as_str()), Some("a.cpu"));
}

#[test]
fn outer_strided_tensor_needs_the_outer_strided_layout() {
    let mut c = candidate("a.cpu");
    c.layouts = LayoutSet::CONTIGUOUS;
    let mut s = spec();
    s.outputs = vec![host_f32(&[64, 3], 0x2000).with_strides(&[0, 128])];
    assert_eq!(
        rejection(c, s),
        Rejection::LayoutUnsupported {
            tensor: TensorRef::output(0),
            layout: Layout::OuterStrided,
            accepted: LayoutSet::CONTIGUOUS,
        }
    );
}

#[test]
fn a_contiguous_tensor_fits_an_outer_strided_provider() {
    // Strides that equal the packed extents are contiguous, and a provider that walks explicit
    // strides handles them.
    let mut c = candidate("a.cpu");
    c.layouts = LayoutSet::OUTER_STRIDED;
    let mut s = spec();
    s.inputs = vec![host_f32(&[64, 3, 2], 0x1000).with_strides(&[0, 64, 192])];
    s.outputs = vec![host_f32(&[64, 3, 2], 0x2000)];
    let q = query(&s);
    assert_eq!(q.input_infos()[0].layout, Layout::Contiguous);
    let candidates = [c];
    let r = resolve(&q, &candidates, &Scripted::default());
    assert_eq!(r.choice().map(|ch| ch.index), Some(0));
}

#[test]
fn dtype_constrains_every_input_and_every_output() {
    let mut s = spec();
    s.outputs = vec![TensorDesc::new(DType::F16, &[64, 3], MemorySpace::Host)];
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::DtypeMismatch {
            tensor: TensorRef::output(0),
            expected: DType::F32,
            actual: DType::F16,
        }
    );

    let mut c = candidate("a.cpu");
    c.inputs = Arity::new(1, 3);
    let mut s = spec();
    s.inputs.push(host_f32(&[64, 3], 0x3000));
    s.inputs
        .push(TensorDesc::new(DType::I32, &[64, 3], MemorySpace::Host));
    assert_eq!(
        rejection(c, s),
        Rejection::DtypeMismatch {
            tensor: TensorRef::input(2),
            expected: DType::F32,
            actual: DType::I32,
        }
    );
}

#[test]
fn dtype_any_defers_heterogeneous_inputs_to_validate() {
    let mut c = candidate("a.cpu");
    c.input_dtype = DType::ANY;
    c.inputs = Arity::exactly(2);
    let mut s = spec();
    s.inputs
        .push(TensorDesc::new(DType::Q4_K, &[256, 3], MemorySpace::Host));

    // Statically the mix is acceptable, so the provider is asked, and its refusal is the reason.
    let refusal = ProviderRefusal::new(-2, "q4_k indices are not supported");
    let provider = Scripted::default().refusing_validate("a.cpu", refusal.clone());
    assert_eq!(
        rejection_with(c.clone(), s.clone(), &provider),
        Rejection::ValidateRefused(refusal)
    );
    assert_eq!(
        provider.calls(),
        vec![("a.cpu".to_owned(), Callback::Validate)]
    );

    // When validate accepts, the candidate is chosen.
    let q = query(&s);
    let candidates = [c];
    let r = resolve(&q, &candidates, &Scripted::default());
    assert_eq!(r.choice().map(|ch| ch.index), Some(0));
}

#[test]
fn misaligned_data_is_rejected_and_unknown_addresses_are_not_checked() {
    let mut s = spec();
    s.inputs = vec![host_f32(&[64, 3], 0x1008)];
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::Misaligned {
            tensor: TensorRef::input(0),
            address: 0x1008,
            required: 16
        }
    );

    let mut s = spec();
    s.inputs = vec![TensorDesc::new(DType::F32, &[64, 3], MemorySpace::Host)];
    let q = query(&s);
    let candidates = [candidate("a.cpu")];
    assert!(resolve(&q, &candidates, &Scripted::default())
        .choice()
        .is_some());
}

#[test]
fn memory_space_must_be_permitted() {
    let mut s = spec();
    s.inputs =
        vec![TensorDesc::new(DType::F32, &[64, 3], MemorySpace::Device).with_data_addr(0x1000)];
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::MemorySpaceNotPermitted {
            tensor: TensorRef::input(0),
            space: MemorySpace::Device,
            accepted: MemorySpaceSet::HOST | MemorySpaceSet::HOST_PINNED,
        }
    );
}

fn cuda_candidate(min_sm: u32, max_sm: u32) -> OpCandidate {
    let mut c = candidate("a.cuda");
    c.backend = Backend::Cuda;
    c.min_sm = min_sm;
    c.max_sm = max_sm;
    c
}

#[test]
fn cuda_compute_capability_must_be_in_range() {
    assert_eq!(
        rejection(cuda_candidate(90, 0), spec()),
        Rejection::SmOutOfRange {
            sm: 86,
            min: 90,
            max: 0
        }
    );
    assert_eq!(
        rejection(cuda_candidate(70, 80), spec()),
        Rejection::SmOutOfRange {
            sm: 86,
            min: 70,
            max: 80
        }
    );
    assert_eq!(
        Rejection::SmOutOfRange {
            sm: 86,
            min: 90,
            max: 0
        }
        .to_string(),
        "cuda compute capability 86 is outside 90.."
    );
    // Bounds are inclusive.
    let asked = spec();
    let q = query(&asked);
    for c in [
        cuda_candidate(86, 86),
        cuda_candidate(0, 0),
        cuda_candidate(0, 86),
    ] {
        let r = resolve(&q, std::slice::from_ref(&c), &Scripted::default());
        assert_eq!(
            r.choice().map(|ch| ch.index),
            Some(0),
            "{:?}",
            (c.min_sm, c.max_sm)
        );
    }
}

#[test]
fn cuda_candidates_need_a_cuda_device() {
    let mut s = spec();
    s.device.cuda_sm = None;
    assert_eq!(rejection(cuda_candidate(0, 0), s), Rejection::NoCudaDevice);
}

#[test]
fn required_cpu_isa_bits_must_be_present() {
    let mut c = candidate("a.cpu");
    c.cpu_isa = CpuIsa::from_bits(0b1001);
    assert_eq!(
        rejection(c, spec()),
        Rejection::MissingIsa {
            missing: CpuIsa::from_bits(0b1000)
        }
    );
}

#[test]
fn missing_capabilities_are_named() {
    let mut s = spec();
    s.capabilities = Capabilities::from_bits(0b1101);
    let reason = rejection(candidate("a.cpu"), s);
    assert_eq!(
        reason,
        Rejection::MissingCapabilities {
            missing: Capabilities::from_bits(0b1100)
        }
    );
    assert_eq!(reason.to_string(), "lacks required capability bits 0xc");
}

#[test]
fn missing_numerics_are_named() {
    let mut s = spec();
    s.numerics = Numerics::from_bits(0b110);
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::MissingNumerics {
            missing: Numerics::from_bits(0b110)
        }
    );
}

#[test]
fn sync_mode_must_be_declared() {
    let mut s = spec();
    s.sync_mode = SyncMode::StreamOrdered;
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::SyncModeUnsupported {
            requested: SyncMode::StreamOrdered,
            offered: SyncModeSet::HOST_BLOCKING,
        }
    );
}

#[test]
fn version_must_lie_in_the_inclusive_interval() {
    for (version, ok) in [
        ("1.0.0", true),
        ("1.9.0", true),
        ("1.9.1", false),
        ("0.9.9", false),
        ("2.0.0", false),
    ] {
        let mut c = candidate("a.cpu");
        c.op_version = v(version);
        let asked = spec();
        let q = query(&asked);
        let r = resolve(&q, std::slice::from_ref(&c), &Scripted::default());
        if ok {
            assert!(r.choice().is_some(), "{version} should be accepted");
        } else {
            assert_eq!(
                r.reason_for("a.cpu"),
                Some(&Reason::Rejected(Rejection::VersionOutOfInterval {
                    version: v(version),
                    wanted: q.versions(),
                })),
                "{version}"
            );
        }
    }
}

#[test]
fn an_interval_across_majors_is_refused_when_the_query_is_built() {
    let mut s = spec();
    s.max_version = v("2.0.0");
    assert_eq!(
        OpQuery::new(&s),
        Err(QueryError::VersionInterval(VersionError::CrossesMajor {
            min: v("1.0.0"),
            max: v("2.0.0"),
        }))
    );
    let mut s = spec();
    s.min_version = v("1.5.0");
    s.max_version = v("1.4.0");
    assert!(matches!(
        OpQuery::new(&s),
        Err(QueryError::VersionInterval(VersionError::EmptyRange { .. }))
    ));
}

#[test]
fn backend_must_be_permitted() {
    let mut s = spec();
    s.backends = BackendSet::CUDA | BackendSet::HIP;
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::BackendNotPermitted {
            backend: Backend::Cpu,
            permitted: BackendSet::CUDA | BackendSet::HIP,
        }
    );
}

#[test]
fn tensor_counts_must_fit_the_arity() {
    let mut s = spec();
    s.inputs.push(host_f32(&[64, 3], 0x3000));
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::ArityOutOfRange {
            role: TensorRole::Input,
            count: 2,
            accepted: Arity::exactly(1)
        }
    );
    let mut s = spec();
    s.outputs.clear();
    assert_eq!(
        rejection(candidate("a.cpu"), s),
        Rejection::ArityOutOfRange {
            role: TensorRole::Output,
            count: 0,
            accepted: Arity::exactly(1)
        }
    );
}

#[test]
fn host_scratch_over_the_ram_budget_is_rejected() {
    let mut s = spec();
    s.ram_budget = Budget::bytes(1024);
    let provider = Scripted::default().asking("a.cpu", 4096, 0);
    let reason = rejection_with(candidate("a.cpu"), s, &provider);
    assert_eq!(
        reason,
        Rejection::OverBudget {
            budget: BudgetKind::Ram,
            needed: 4096,
            allowed: Budget::bytes(1024)
        }
    );
    assert_eq!(
        reason.to_string(),
        "needs 4096 bytes of host scratch, over the ram budget of 1024 bytes"
    );
}

#[test]
fn device_scratch_over_the_vram_budget_is_rejected() {
    let mut s = spec();
    s.vram_budget = Budget::bytes(0);
    let provider = Scripted::default().asking("a.cpu", 10, 1);
    assert_eq!(
        rejection_with(candidate("a.cpu"), s, &provider),
        Rejection::OverBudget {
            budget: BudgetKind::Vram,
            needed: 1,
            allowed: Budget::bytes(0)
        }
    );
}

#[test]
fn a_request_equal_to_the_budget_fits() {
    let mut s = spec();
    s.ram_budget = Budget::bytes(4096);
    let q = query(&s);
    let provider = Scripted::default().asking("a.cpu", 4096, 0);
    let candidates = [candidate("a.cpu")];
    assert!(resolve(&q, &candidates, &provider).choice().is_some());
}

#[test]
fn a_validate_refusal_rejects_and_skips_the_scratch_query() {
    let refusal = ProviderRefusal::new(-1, "strides must be even");
    let provider = Scripted::default().refusing_validate("a.cpu", refusal.clone());
    let reason = rejection_with(candidate("a.cpu"), spec(), &provider);
    assert_eq!(reason, Rejection::ValidateRefused(refusal));
    assert_eq!(
        reason.to_string(),
        "validate refused: status -1 (invalid argument): strides must be even"
    );
    assert_eq!(
        provider.calls(),
        vec![("a.cpu".to_owned(), Callback::Validate)]
    );
}

#[test]
fn a_scratch_failure_rejects_the_candidate() {
    let refusal = ProviderRefusal::new(-4, "");
    let provider = Scripted::default().refusing_scratch("a.cpu", refusal.clone());
    let reason = rejection_with(candidate("a.cpu"), spec(), &provider);
    assert_eq!(reason, Rejection::ScratchRefused(refusal));
    assert_eq!(
        reason.to_string(),
        "scratch query failed: status -4 (out of memory)"
    );
}

#[test]
fn a_malformed_descriptor_is_never_chosen() {
    let mut c = candidate("a.cpu");
    c.min_alignment = 24;
    assert_eq!(c.check(), Err(CandidateError::Alignment { alignment: 24 }));
    assert_eq!(
        rejection(c, spec()),
        Rejection::InvalidCandidate(CandidateError::Alignment { alignment: 24 })
    );

    type Breaker = fn(&mut OpCandidate);
    let cases: [(Breaker, CandidateError); 6] = [
        (
            |c| c.max_rank = 0,
            CandidateError::RankBounds { min: 1, max: 0 },
        ),
        (
            |c| c.min_rank = 5,
            CandidateError::RankBounds { min: 5, max: 4 },
        ),
        (
            |c| c.outputs = Arity::new(2, 1),
            CandidateError::ArityBounds {
                role: TensorRole::Output,
                min: 2,
                max: 1,
            },
        ),
        (
            |c| (c.min_sm, c.max_sm) = (90, 80),
            CandidateError::SmBounds { min: 90, max: 80 },
        ),
        (
            |c| c.layouts = LayoutSet::EMPTY,
            CandidateError::EmptySet { what: "layout" },
        ),
        (
            |c| c.sync_modes = SyncModeSet::EMPTY,
            CandidateError::EmptySet { what: "sync mode" },
        ),
    ];
    for (break_it, expected) in cases {
        let mut c = candidate("a.cpu");
        break_it(&mut c);
        assert_eq!(c.check(), Err(expected));
    }
}

// ---------------------------------------------------------------------------------------------
// Exact implementation ids.

#[test]
fn an_absent_exact_id_is_its_own_outcome() {
    let mut s = spec();
    s.exact_impl = Some(id("missing.cpu"));
    let q = query(&s);
    let candidates = [candidate("a.cpu"), candidate("b.cpu")];
    let provider = Scripted::default();
    let r = resolve(&q, &candidates, &provider);
    assert_eq!(
        r.failure(),
        Some(&FailureKind::ExactImplAbsent {
            impl_id: id("missing.cpu"),
            registered_for: None
        })
    );
    assert_eq!(
        r.reason_for("a.cpu"),
        Some(&Reason::Rejected(Rejection::NotExactImpl))
    );
    assert_eq!(
        r.reason_for("b.cpu"),
        Some(&Reason::Rejected(Rejection::NotExactImpl))
    );
    assert_eq!(provider.calls(), vec![]);
}

#[test]
fn an_exact_id_of_another_operation_says_which() {
    let mut s = spec();
    s.exact_impl = Some(id("x.exclusive"));
    let q = query(&s);
    let mut other = candidate("x.exclusive");
    other.op_name = OpName::new(OTHER_OP).unwrap();
    let candidates = [other, candidate("a.cpu")];
    let failure = resolve(&q, &candidates, &Scripted::default())
        .into_result()
        .unwrap_err();
    assert_eq!(
        failure.kind,
        FailureKind::ExactImplAbsent {
            impl_id: id("x.exclusive"),
            registered_for: Some(OpName::new(OTHER_OP).unwrap()),
        }
    );
    assert_eq!(
        failure.to_string(),
        "implementation x.exclusive was requested for operation example.sequence.inclusive_scan \
         but implements example.sequence.exclusive_scan\n\
         a.cpu: not the implementation the query names exactly"
    );
}

#[test]
fn a_failing_exact_candidate_does_not_fall_back() {
    let mut s = spec();
    s.exact_impl = Some(id("a.cpu"));
    let q = query(&s);
    let mut fallback = candidate("b.cpu");
    fallback.priority = 100;
    let candidates = [candidate("a.cpu"), fallback];
    let refusal = ProviderRefusal::new(-2, "no");
    let provider = Scripted::default().refusing_validate("a.cpu", refusal.clone());
    let r = resolve(&q, &candidates, &provider);
    assert_eq!(
        r.failure(),
        Some(&FailureKind::ExactImplRejected {
            impl_id: id("a.cpu")
        })
    );
    assert_eq!(
        r.reason_for("a.cpu"),
        Some(&Reason::Rejected(Rejection::ValidateRefused(refusal)))
    );
    assert_eq!(
        r.reason_for("b.cpu"),
        Some(&Reason::Rejected(Rejection::NotExactImpl))
    );
    assert!(!provider.called("b.cpu"));
    assert_eq!(
        r.into_result().unwrap_err().to_string(),
        "implementation a.cpu was requested for operation example.sequence.inclusive_scan and \
         refused (validate refused: status -2 (unsupported): no); an exact request does not fall back\n\
         a.cpu: validate refused: status -2 (unsupported): no\n\
         b.cpu: not the implementation the query names exactly"
    );
}

#[test]
fn an_exact_id_overrides_priority() {
    let mut s = spec();
    s.exact_impl = Some(id("low.cpu"));
    let q = query(&s);
    let mut high = candidate("high.cpu");
    high.priority = 10;
    let candidates = [high, candidate("low.cpu")];
    let r = resolve(&q, &candidates, &Scripted::default());
    assert_eq!(r.choice().map(|ch| ch.impl_id.as_str()), Some("low.cpu"));
    assert_eq!(
        r.reason_for("high.cpu"),
        Some(&Reason::Rejected(Rejection::NotExactImpl))
    );
}

// ---------------------------------------------------------------------------------------------
// Ranking.

#[test]
fn higher_priority_wins_and_the_rest_are_outranked_without_callbacks() {
    let mut high = candidate("z.cpu");
    high.priority = 5;
    let mut low = candidate("a.cpu");
    low.priority = -1;
    let candidates = [low, high, candidate("m.cpu")];
    let asked = spec();
    let q = query(&asked);
    let provider = Scripted::default();
    let r = resolve(&q, &candidates, &provider);
    assert_eq!(
        r.choice().map(|ch| (ch.index, ch.impl_id.as_str())),
        Some((1, "z.cpu"))
    );
    let winner = id("z.cpu");
    assert_eq!(
        r.verdicts(),
        &[
            Verdict {
                index: 0,
                impl_id: &candidates[0].impl_id,
                reason: Reason::Outranked { by: &winner }
            },
            Verdict {
                index: 2,
                impl_id: &candidates[2].impl_id,
                reason: Reason::Outranked { by: &winner }
            },
        ]
    );
    assert_eq!(
        provider.calls(),
        vec![
            ("z.cpu".to_owned(), Callback::Validate),
            ("z.cpu".to_owned(), Callback::Scratch)
        ]
    );
}

#[test]
fn equal_priorities_break_ties_by_ascending_impl_id() {
    let asked = spec();
    let q = query(&asked);
    for order in [
        ["b.cpu", "a.cpu", "c.cpu"],
        ["c.cpu", "b.cpu", "a.cpu"],
        ["a.cpu", "c.cpu", "b.cpu"],
    ] {
        let candidates = order.map(candidate);
        let r = resolve(&q, &candidates, &Scripted::default());
        assert_eq!(
            r.choice().map(|ch| ch.impl_id.as_str()),
            Some("a.cpu"),
            "{order:?}"
        );
    }
    // Byte order: "a.cpu" < "a.cpu2" < "a_cpu" ('.' is 0x2e, '_' is 0x5f).
    let candidates = ["a_cpu", "a.cpu2", "a.cpu"].map(candidate);
    let mut order: Vec<&OpCandidate> = candidates.iter().collect();
    order.sort_by(|a, b| rank_order(a, b));
    let ids: Vec<&str> = order.iter().map(|c| c.impl_id.as_str()).collect();
    assert_eq!(ids, ["a.cpu", "a.cpu2", "a_cpu"]);
}

#[test]
fn priority_outweighs_impl_id() {
    let mut z = candidate("z.cpu");
    z.priority = 1;
    assert_eq!(
        rank_order(&z, &candidate("a.cpu")),
        std::cmp::Ordering::Less
    );
    let mut neg = candidate("a.cpu");
    neg.priority = i32::MIN;
    let mut pos = candidate("b.cpu");
    pos.priority = i32::MAX;
    assert_eq!(rank_order(&pos, &neg), std::cmp::Ordering::Less);
}

#[test]
fn a_refusal_falls_back_to_the_next_in_rank() {
    let mut best = candidate("best.cpu");
    best.priority = 9;
    let mut second = candidate("second.cpu");
    second.priority = 5;
    let third = candidate("third.cpu");
    let candidates = [third, second, best];
    let provider = Scripted::default()
        .refusing_scratch("best.cpu", ProviderRefusal::new(-4, "too big"))
        .asking("second.cpu", 1, 2);
    let asked = spec();
    let q = query(&asked);
    let r = resolve(&q, &candidates, &provider);
    let choice = r.choice().unwrap();
    assert_eq!((choice.index, choice.impl_id.as_str()), (1, "second.cpu"));
    assert_eq!(
        choice.scratch,
        ScratchRequest {
            host_bytes: 1,
            device_bytes: 2
        }
    );
    assert_eq!(
        r.reason_for("best.cpu"),
        Some(&Reason::Rejected(Rejection::ScratchRefused(
            ProviderRefusal::new(-4, "too big")
        )))
    );
    assert_eq!(
        r.reason_for("third.cpu"),
        Some(&Reason::Outranked {
            by: &id("second.cpu")
        })
    );
    assert!(!provider.called("third.cpu"));
}

#[test]
fn candidates_of_other_operations_are_ignored() {
    let mut other = candidate("other.cpu");
    other.op_name = OpName::new(OTHER_OP).unwrap();
    other.priority = 100;
    let candidates = [other, candidate("a.cpu")];
    let asked = spec();
    let q = query(&asked);
    let provider = Scripted::default();
    let r = resolve(&q, &candidates, &provider);
    assert_eq!(r.choice().map(|ch| ch.index), Some(1));
    assert_eq!(r.verdicts(), &[]);
    assert!(!provider.called("other.cpu"));
}

#[test]
fn no_candidate_of_the_operation_is_its_own_outcome() {
    let mut other = candidate("other.cpu");
    other.op_name = OpName::new(OTHER_OP).unwrap();
    let asked = spec();
    let q = query(&asked);
    let candidates = [other];
    let r = resolve(&q, &candidates, &Scripted::default());
    assert_eq!(r.failure(), Some(&FailureKind::NoCandidates));
    assert_eq!(
        r.to_string(),
        "no implementation of operation example.sequence.inclusive_scan is registered"
    );
}

#[test]
fn duplicate_impl_ids_at_equal_priority_are_both_refused() {
    let candidates = [candidate("a.cpu"), candidate("a.cpu"), candidate("b.cpu")];
    let asked = spec();
    let q = query(&asked);
    let r = resolve(&q, &candidates, &Scripted::default());
    assert_eq!(r.choice().map(|ch| ch.index), Some(2));
    let reasons: Vec<_> = r
        .verdicts()
        .iter()
        .map(|v| (v.index, v.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (0, Reason::Rejected(Rejection::DuplicateImplId)),
            (1, Reason::Rejected(Rejection::DuplicateImplId)),
        ]
    );
}

#[test]
fn a_failed_resolution_lists_every_candidate_one_per_line() {
    let mut wrong_rank = candidate("b.cpu");
    wrong_rank.max_rank = 1;
    let mut cuda = candidate("a.cuda");
    cuda.backend = Backend::Cuda;
    cuda.min_sm = 90;
    let candidates = [wrong_rank, cuda, candidate("c.cpu")];
    let provider = Scripted::default().asking("c.cpu", 2048, 0);
    let mut s = spec();
    s.ram_budget = Budget::bytes(1000);
    let q = query(&s);
    let failure = resolve(&q, &candidates, &provider)
        .into_result()
        .unwrap_err();
    assert_eq!(failure.kind, FailureKind::NoneCompatible);
    assert_eq!(
        failure.to_string(),
        "none of the 3 implementations of operation example.sequence.inclusive_scan accepts the query\n\
         a.cuda: cuda compute capability 86 is outside 90..\n\
         b.cpu: input 0 has rank 2, outside 1..=1\n\
         c.cpu: needs 2048 bytes of host scratch, over the ram budget of 1000 bytes"
    );
    let indices: Vec<usize> = failure.rejections.iter().map(|r| r.index).collect();
    assert_eq!(indices, [1, 0, 2]);
}

#[test]
fn a_successful_resolution_displays_its_choice_and_verdicts() {
    let mut best = candidate("b.cpu");
    best.priority = 1;
    let mut bad = candidate("c.cpu");
    bad.sync_modes = SyncModeSet::STREAM_ORDERED | SyncModeSet::GRAPH_CAPTURABLE;
    let candidates = [candidate("a.cpu"), best, bad];
    let asked = spec();
    let q = query(&asked);
    let r = resolve(&q, &candidates, &Scripted::default().asking("b.cpu", 64, 0));
    assert_eq!(
        r.to_string(),
        "operation example.sequence.inclusive_scan: chose b.cpu (host scratch 64 bytes, device scratch 0 bytes)\n\
         a.cpu: outranked by b.cpu, which was chosen\n\
         c.cpu: sync mode host-blocking is not among its stream-ordered|graph-capturable"
    );
}

// ---------------------------------------------------------------------------------------------
// Query and tensor validation, separate from candidate rejections.

#[test]
fn query_validation_refuses_bad_backend_sets() {
    let mut s = spec();
    s.backends = BackendSet::EMPTY;
    assert_eq!(OpQuery::new(&s), Err(QueryError::NoBackends));
    let mut s = spec();
    s.backends = BackendSet::from_bits(0x1 | 0x40);
    assert_eq!(
        OpQuery::new(&s),
        Err(QueryError::UnknownBackendBits { bits: 0x40 })
    );
}

#[test]
fn query_validation_names_the_bad_tensor() {
    let mut s = spec();
    s.outputs
        .push(TensorDesc::new(DType::F32, &[4, 0], MemorySpace::Host));
    let err = OpQuery::new(&s).unwrap_err();
    assert_eq!(
        err,
        QueryError::Tensor {
            tensor: TensorRef::output(1),
            error: TensorError::ZeroExtent { axis: 1 }
        }
    );
    assert_eq!(
        err.to_string(),
        "output 1 is invalid: axis 1 has extent 0; empty tensors are refused"
    );
}

#[test]
fn device_tensors_must_live_on_the_query_device() {
    let mut s = spec();
    s.device.device_id = 1;
    s.inputs = vec![TensorDesc::new(DType::F32, &[64], MemorySpace::Device).with_device(0)];
    assert_eq!(
        OpQuery::new(&s),
        Err(QueryError::DeviceMismatch {
            tensor: TensorRef::input(0),
            tensor_device: 0,
            query_device: 1
        })
    );
    // Host tensors carry no device.
    let mut s = spec();
    s.device.device_id = 3;
    assert!(OpQuery::new(&s).is_ok());
}

#[test]
fn tensor_rank_is_one_to_eight() {
    let scalar = TensorDesc::new(DType::F32, &[], MemorySpace::Host);
    assert_eq!(scalar.check(), Err(TensorError::BadRank { rank: 0 }));
    let nine = TensorDesc::new(DType::F32, &[1; 9], MemorySpace::Host);
    assert_eq!(nine.rank, 9);
    assert_eq!(nine.check(), Err(TensorError::BadRank { rank: 9 }));
    let eight = TensorDesc::new(DType::F32, &[2; 8], MemorySpace::Host);
    assert_eq!(eight.check().map(|i| i.elements), Ok(256));
    let one = TensorDesc::new(DType::F32, &[1], MemorySpace::Host);
    assert_eq!(
        one.check(),
        Ok(TensorInfo {
            layout: Layout::Contiguous,
            elements: 1,
            batch: 1,
            byte_extent: 4
        })
    );
}

#[test]
fn tensor_dtype_must_be_concrete_and_known() {
    let any = TensorDesc::new(DType::ANY, &[4], MemorySpace::Host);
    assert_eq!(any.check(), Err(TensorError::AnyDtype));
    let unknown = TensorDesc::new(DType::from_raw(4), &[4], MemorySpace::Host);
    assert_eq!(unknown.check(), Err(TensorError::UnknownDtype { dtype: 4 }));
}

#[test]
fn tensor_strides_follow_the_shared_rules() {
    let t = |shape: &[u64], strides: &[u64]| {
        TensorDesc::new(DType::F32, shape, MemorySpace::Host)
            .with_strides(strides)
            .check()
    };
    assert_eq!(
        t(&[4, 2], &[1, 0]),
        Err(TensorError::InnerStride { stride: 1 })
    );
    assert_eq!(
        t(&[4, 2], &[0, 3]),
        Err(TensorError::StrideOverlap {
            axis: 1,
            stride: 3,
            packed: 4
        })
    );
    // A packed axis follows the real extent of a strided one inside it: 3 rows of stride 10
    // span 30 elements, so axis 2 may not start before 30.
    assert_eq!(
        t(&[4, 3, 2], &[0, 10, 29]),
        Err(TensorError::StrideOverlap {
            axis: 2,
            stride: 29,
            packed: 30
        })
    );
    assert_eq!(
        t(&[4, 3, 2], &[0, 10, 0]),
        Ok(TensorInfo {
            layout: Layout::OuterStrided,
            elements: 24,
            batch: 6,
            // The last element sits at 1*30 + 2*10 + 3 = 53, so 54 elements of 4 bytes.
            byte_extent: 216,
        })
    );
    assert_eq!(
        t(&[4, 3], &[0, 4]).map(|i| i.layout),
        Ok(Layout::Contiguous)
    );
    // Entries past the rank are ignored.
    assert_eq!(t(&[4], &[0, 7, 9]).map(|i| i.byte_extent), Ok(16));
}

#[test]
fn quantized_tensors_are_walked_in_blocks() {
    let q4k = |shape: &[u64]| TensorDesc::new(DType::Q4_K, shape, MemorySpace::Host);
    assert_eq!(
        q4k(&[300]).check(),
        Err(TensorError::NotBlockMultiple {
            dtype: DType::Q4_K,
            dim: 300,
            block: 256
        })
    );
    // Two blocks per row; rows 5 blocks apart: the last block is at 2*5 + 1, so 12 blocks.
    assert_eq!(
        q4k(&[512, 3]).with_strides(&[0, 5]).check(),
        Ok(TensorInfo {
            layout: Layout::OuterStrided,
            elements: 1536,
            batch: 3,
            byte_extent: 12 * 144
        })
    );
    assert_eq!(
        TensorDesc::new(DType::Q8_0, &[64, 2], MemorySpace::Host)
            .check()
            .map(|i| i.byte_extent),
        Ok(4 * 34)
    );
}

#[test]
fn huge_tensors_give_an_error_not_an_overflow() {
    let t = |shape: &[u64], strides: &[u64]| {
        TensorDesc::new(DType::F64, shape, MemorySpace::Host)
            .with_strides(strides)
            .check()
    };
    assert_eq!(
        t(&[u64::MAX, 2], &[]),
        Err(TensorError::TooLarge {
            what: "byte extent"
        })
    );
    // An explicit stride can leave the extent in range while the packed stride of the next
    // axis overflows.
    assert_eq!(
        t(&[1, 2, 2], &[0, 1 << 63, 0]),
        Err(TensorError::TooLarge {
            what: "stride extent"
        })
    );
    assert_eq!(
        t(&[1 << 62], &[]),
        Err(TensorError::TooLarge {
            what: "byte extent"
        })
    );
    assert_eq!(
        t(&[1, 2], &[0, u64::MAX]),
        Err(TensorError::TooLarge {
            what: "byte extent"
        })
    );
    assert_eq!(
        t(&[1 << 32, 1 << 32, 2], &[0, 1, 1]).unwrap_err(),
        TensorError::StrideOverlap {
            axis: 1,
            stride: 1,
            packed: 1 << 32
        }
    );
    // The extent, which bounds the element count, is what overflows first.
    assert_eq!(
        t(&[1 << 20, 1 << 20, 1 << 20, 1 << 10], &[]),
        Err(TensorError::TooLarge {
            what: "byte extent"
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Value types agree with the shared constants.

#[test]
fn value_types_use_the_shared_numbering() {
    assert_eq!(DType::ANY.raw(), 0xFFFF_FFFF);
    let blocks = [
        (DType::F32, 0, 1, 4),
        (DType::F16, 1, 1, 2),
        (DType::Q4_0, 2, 32, 18),
        (DType::Q4_1, 3, 32, 20),
        (DType::Q5_0, 6, 32, 22),
        (DType::Q5_1, 7, 32, 24),
        (DType::Q8_0, 8, 32, 34),
        (DType::Q8_1, 9, 32, 36),
        (DType::Q2_K, 10, 256, 84),
        (DType::Q3_K, 11, 256, 110),
        (DType::Q4_K, 12, 256, 144),
        (DType::Q5_K, 13, 256, 176),
        (DType::Q6_K, 14, 256, 210),
        (DType::Q8_K, 15, 256, 292),
        (DType::I8, 24, 1, 1),
        (DType::I16, 25, 1, 2),
        (DType::I32, 26, 1, 4),
        (DType::I64, 27, 1, 8),
        (DType::F64, 28, 1, 8),
        (DType::BF16, 30, 1, 2),
    ];
    for (dtype, raw, elements, bytes) in blocks {
        assert_eq!(dtype.raw(), raw);
        assert_eq!(
            dtype.block(),
            Some(DTypeBlock { elements, bytes }),
            "{dtype}"
        );
        assert_eq!(dtype.is_quantized(), elements > 1);
    }
    let known = (0..=u32::from(u8::MAX))
        .filter(|&r| DType::from_raw(r).is_known())
        .count();
    assert_eq!(known, blocks.len());
    assert_eq!(DType::ANY.block(), None);

    assert_eq!(
        [Backend::Cpu.bit(), Backend::Cuda.bit(), Backend::Hip.bit()],
        [1, 2, 4]
    );
    assert_eq!(Backend::from_bit(3), None);
    assert_eq!(
        [
            MemorySpace::Host,
            MemorySpace::HostPinned,
            MemorySpace::Device,
            MemorySpace::Managed
        ]
        .map(MemorySpace::bit),
        [1, 2, 4, 8]
    );
    assert_eq!(
        [Layout::Contiguous.bit(), Layout::OuterStrided.bit()],
        [1, 2]
    );
    for mode in [
        SyncMode::HostBlocking,
        SyncMode::StreamOrdered,
        SyncMode::GraphCapturable,
    ] {
        assert_eq!(SyncMode::from_raw(mode.raw()), Some(mode));
        assert_eq!(mode.bit(), 1 << mode.raw());
    }
    assert_eq!(
        SyncMode::GraphCapturable.bit(),
        SyncModeSet::GRAPH_CAPTURABLE.bits()
    );
    assert_eq!(SyncMode::from_raw(3), None);
    assert_eq!(Budget::UNLIMITED.get(), u64::MAX);
    assert!(Budget::UNLIMITED.allows(u64::MAX));
    assert_eq!(
        (BackendSet::CPU | BackendSet::from_bits(0x10)).to_string(),
        "cpu|0x10"
    );
    assert_eq!(MemorySpaceSet::EMPTY.to_string(), "none");
}

// ---------------------------------------------------------------------------------------------
// Properties.

/// One way to make a candidate statically incompatible with [`spec`], or none.
fn static_breakers() -> Vec<fn(&mut OpCandidate)> {
    vec![
        |c| c.min_rank = 3,
        |c| c.backend = Backend::Hip,
        |c| c.capabilities = Capabilities::EMPTY,
        |c| c.sync_modes = SyncModeSet::STREAM_ORDERED,
        |c| c.op_version = v("2.0.0"),
        |c| c.input_dtype = DType::F16,
        |c| c.memory_spaces = MemorySpaceSet::DEVICE,
        |c| c.cpu_isa = CpuIsa::from_bits(0x100),
        |c| c.max_batch = 2,
        |c| c.min_alignment = 1 << 20,
    ]
}

/// A generated candidate: its id, priority, how (if at all) it is statically broken, and how
/// its provider answers.
#[derive(Debug, Clone)]
struct Gene {
    impl_id: String,
    priority: i32,
    breaker: Option<usize>,
    validate_ok: bool,
    scratch_ok: bool,
    host_bytes: u64,
}

fn genes() -> impl Strategy<Value = Vec<Gene>> {
    let breakers = static_breakers().len();
    prop::collection::btree_set("[a-z][a-z0-9_]{0,5}(\\.[a-z0-9]{1,3})?", 1..16).prop_flat_map(
        move |ids| {
            let n = ids.len();
            let traits = prop::collection::vec(
                (
                    -2i32..3,
                    prop::option::weighted(0.3, 0..breakers),
                    prop::bool::weighted(0.8),
                    prop::bool::weighted(0.8),
                    0u64..2000,
                ),
                n,
            );
            (Just(ids), traits).prop_map(|(ids, traits)| {
                ids.into_iter()
                    .zip(traits)
                    .map(
                        |(impl_id, (priority, breaker, validate_ok, scratch_ok, host_bytes))| {
                            Gene {
                                impl_id,
                                priority,
                                breaker,
                                validate_ok,
                                scratch_ok,
                                host_bytes,
                            }
                        },
                    )
                    .collect()
            })
        },
    )
}

fn build(genes: &[Gene]) -> (Vec<OpCandidate>, Scripted) {
    let breakers = static_breakers();
    let mut provider = Scripted::default();
    let candidates = genes
        .iter()
        .map(|g| {
            let mut c = candidate(&g.impl_id);
            c.priority = g.priority;
            if let Some(b) = g.breaker {
                breakers[b](&mut c);
            }
            if !g.validate_ok {
                provider
                    .refuse_validate
                    .insert(g.impl_id.clone(), ProviderRefusal::new(-2, "no"));
            }
            if !g.scratch_ok {
                provider
                    .refuse_scratch
                    .insert(g.impl_id.clone(), ProviderRefusal::new(-4, "no"));
            }
            provider.scratch.insert(
                g.impl_id.clone(),
                ScratchRequest {
                    host_bytes: g.host_bytes,
                    device_bytes: 0,
                },
            );
            c
        })
        .collect();
    (candidates, provider)
}

/// The parts of a resolution that must not depend on candidate order: the choice's id and
/// scratch, the failure, and each other candidate's reason by id.
/// What [`summary`] keeps of a resolution.
type Summary = (
    Option<(String, ScratchRequest)>,
    Option<FailureKind>,
    BTreeMap<String, String>,
);

fn summary(r: &Resolution<'_>) -> Summary {
    (
        r.choice().map(|c| (c.impl_id.to_string(), c.scratch)),
        r.failure().cloned(),
        r.verdicts()
            .iter()
            .map(|v| (v.impl_id.to_string(), v.reason.to_string()))
            .collect(),
    )
}

fn budget_spec(exact: Option<&str>) -> QuerySpec {
    let mut s = spec();
    s.ram_budget = Budget::bytes(1500);
    s.exact_impl = exact.map(id);
    s
}

proptest! {
    #[test]
    fn resolution_does_not_depend_on_candidate_order(
        (genes, shuffled) in genes().prop_flat_map(|g| (Just(g.clone()), Just(g).prop_shuffle())),
        exact_pick in prop::option::weighted(0.2, any::<prop::sample::Index>()),
    ) {
        let exact = exact_pick.map(|i| genes[i.index(genes.len())].impl_id.clone());
        let asked = budget_spec(exact.as_deref());
        let q = query(&asked);
        let (a, provider_a) = build(&genes);
        let (b, provider_b) = build(&shuffled);
        let ra = resolve(&q, &a, &provider_a);
        let rb = resolve(&q, &b, &provider_b);
        prop_assert_eq!(summary(&ra), summary(&rb));
        // Indices point at the same candidate in each input.
        if let (Some(ca), Some(cb)) = (ra.choice(), rb.choice()) {
            prop_assert_eq!(&a[ca.index].impl_id, &ca.impl_id);
            prop_assert_eq!(&b[cb.index].impl_id, &cb.impl_id);
        }
        // Every candidate of the operation is either chosen or has exactly one verdict.
        prop_assert_eq!(ra.verdicts().len() + usize::from(ra.choice().is_some()), genes.len());
    }

    #[test]
    fn the_rank_order_is_a_strict_total_order(
        keys in prop::collection::btree_map("[a-z][a-z0-9._]{0,6}", -3i32..3, 3..4)
    ) {
        let cs: Vec<OpCandidate> = keys
            .iter()
            .filter(|(k, _)| ImplId::new(k.as_str()).is_ok())
            .map(|(k, &p)| {
                let mut c = candidate(k);
                c.priority = p;
                c
            })
            .collect();
        use std::cmp::Ordering::*;
        for a in &cs {
            prop_assert_eq!(rank_order(a, a), Equal);
            for b in &cs {
                let ab = rank_order(a, b);
                // Antisymmetric, and total over distinct impl ids.
                prop_assert_eq!(ab, rank_order(b, a).reverse());
                if a.impl_id != b.impl_id {
                    prop_assert_ne!(ab, Equal);
                }
                for c in &cs {
                    if ab == Less && rank_order(b, c) == Less {
                        prop_assert_eq!(rank_order(a, c), Less);
                    }
                }
            }
        }
    }

    #[test]
    fn callbacks_run_only_in_rank_order_up_to_the_choice(genes in genes()) {
        let asked = budget_spec(None);
        let q = query(&asked);
        let (candidates, provider) = build(&genes);
        let r = resolve(&q, &candidates, &provider);
        let calls = provider.calls();

        // No callback for a statically rejected or outranked candidate.
        for verdict in r.verdicts() {
            let called = provider.called(verdict.impl_id.as_str());
            match &verdict.reason {
                Reason::Rejected(reason) if reason.is_static() => prop_assert!(!called, "{}", reason),
                Reason::Outranked { .. } => prop_assert!(!called, "outranked {} was called", verdict.impl_id),
                Reason::Rejected(_) => prop_assert!(called),
            }
        }

        // The candidates asked to validate are exactly the statically compatible ones in rank
        // order, stopping at the choice; scratch is asked only after validate accepted.
        let mut compatible: Vec<&OpCandidate> =
            candidates.iter().filter(|c| check_static(&q, c).is_ok()).collect();
        compatible.sort_by(|a, b| rank_order(a, b));
        let stop = match r.choice() {
            Some(choice) => compatible.iter().position(|c| c.impl_id == choice.impl_id).map_or(0, |p| p + 1),
            None => compatible.len(),
        };
        let validated: Vec<&str> = calls
            .iter()
            .filter(|(_, cb)| *cb == Callback::Validate)
            .map(|(i, _)| i.as_str())
            .collect();
        let expected: Vec<&str> = compatible[..stop].iter().map(|c| c.impl_id.as_str()).collect();
        prop_assert_eq!(validated, expected);
        for pair in calls.windows(2) {
            if pair[1].1 == Callback::Scratch {
                prop_assert_eq!(&pair[0], &(pair[1].0.clone(), Callback::Validate));
            }
        }
    }
    #[test]
    fn choose_makes_the_choice_of_resolve_with_the_same_callbacks(
        genes in genes(),
        exact_pick in prop::option::weighted(0.2, any::<prop::sample::Index>()),
    ) {
        let exact = exact_pick.map(|i| genes[i.index(genes.len())].impl_id.clone());
        let asked = budget_spec(exact.as_deref());
        let q = query(&asked);
        let (mut candidates, full) = build(&genes);
        // The registry's order: best first.
        candidates.sort_by(rank_order);
        let (_, quiet) = build(&genes);
        let r = resolve(&q, &candidates, &full);
        let chosen = choose(&q, &candidates, &quiet);
        match (r.choice(), r.failure(), &chosen) {
            (Some(c), None, Ok((index, scratch))) => {
                prop_assert_eq!(c.index, *index);
                prop_assert_eq!(c.scratch, *scratch);
            }
            (None, Some(kind), Err(quiet_kind)) => prop_assert_eq!(kind, quiet_kind),
            _ => prop_assert!(false, "resolve: {r}; choose: {chosen:?}"),
        }
        prop_assert_eq!(full.calls(), quiet.calls());
    }
}

#[test]
fn choose_rejects_tied_candidates_and_takes_the_next() {
    // Two compatible candidates that tie on impl id and priority (which the registry forbids)
    // are both passed over, as `resolve` does, and the next one is chosen.
    let asked = spec();
    let q = query(&asked);
    let mut low = candidate("ex.low");
    low.priority = -1;
    let candidates = [candidate("ex.tie"), candidate("ex.tie"), low];
    let provider = Scripted::default();
    assert_eq!(choose(&q, &candidates, &provider).map(|(i, _)| i), Ok(2));
    assert_eq!(
        provider.calls(),
        vec![
            ("ex.low".to_owned(), Callback::Validate),
            ("ex.low".to_owned(), Callback::Scratch)
        ]
    );
    let r = resolve(&q, &candidates, &Scripted::default());
    assert_eq!(r.choice().map(|c| c.index), Some(2));
}

#[test]
fn choose_names_the_operation_an_exact_id_implements() {
    let mut other = candidate("ex.elsewhere");
    other.op_name = OpName::new("ex.other.op").unwrap();
    let mut s = spec();
    s.exact_impl = Some(id("ex.elsewhere"));
    let q = query(&s);
    let candidates = [candidate("ex.a"), other];
    let kind = choose(&q, &candidates, &Scripted::default()).unwrap_err();
    assert_eq!(
        kind,
        FailureKind::ExactImplAbsent {
            impl_id: id("ex.elsewhere"),
            registered_for: Some(OpName::new("ex.other.op").unwrap()),
        }
    );
}

/// A tensor descriptor reads in plain words wherever an error names one (a C caller sees these
/// texts in its error record), never as Rust's `Debug` output.
#[test]
fn a_tensor_descriptor_is_written_in_plain_words() {
    let packed = TensorDesc::new(DType::F32, &[16], MemorySpace::Host);
    assert_eq!(packed.to_string(), "f32 [16] packed in host memory");
    let strided = TensorDesc::new(DType::F32, &[16, 4], MemorySpace::Device)
        .with_strides(&[0, 32])
        .with_device(1);
    assert_eq!(
        strided.to_string(),
        "f32 [16, 4] with strides [0, 32] in device memory of device 1"
    );
    let bad_rank = TensorDesc {
        rank: 12,
        ..TensorDesc::new(DType::F32, &[1], MemorySpace::Host)
    };
    let text = bad_rank.to_string();
    assert!(text.starts_with("f32 rank 12 "), "{text}");
    assert!(
        !text.contains("TensorDesc") && !text.contains("DType("),
        "{text}"
    );
}

/// A query borrows the caller's spec (name, tensors, exact id) and gives an equal owned copy
/// back on request.
#[test]
fn a_query_borrows_its_spec_and_copies_it_back_whole() {
    let mut s = spec();
    s.exact_impl = Some(ImplId::new("ex.exact.cpu").unwrap());
    let q = query(&s);
    assert_eq!(q.op_name(), s.op_name);
    assert!(std::ptr::eq(q.spec().inputs, s.inputs.as_slice()));
    assert!(std::ptr::eq(q.spec().outputs, s.outputs.as_slice()));
    assert_eq!(q.spec().to_spec(), s);
    assert_eq!(q.tensor_infos().len(), s.inputs.len() + s.outputs.len());
}
