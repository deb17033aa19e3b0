//! The operation service's rejection report, reason by reason, over the real C probe module
//! (test-plugins/op_probe) installed as a signed gkmodule and loaded with dlopen.
//!
//! The probe registers twenty candidates of `example.probe.copy`. Each departs from one baseline
//! contract in one respect, so that [`baseline`] (a query the baseline contract accepts) draws a
//! different, known rejection from each; `op_probe.c` lists them. [`cases`] is the table: one
//! request per reason of the diagnostic (mostly the baseline with an exact impl id) and exactly
//! what the report must say. It is a plain function so that the same table can be replayed
//! through the C face of the service, whose error message starts with the same header line.
//!
//! Statically rejected candidates must never be called. Their callbacks count every call, and
//! the refusal message of `example.probe.refuses.cpu` reports the count; the table's last case
//! expects "0 times".

use std::collections::BTreeSet;

use guild_abi::{
    guild_device_caps_v1_t, guild_tensor_desc_v1_t, GUILD_BACKEND_CPU, GUILD_BACKEND_CUDA,
    GUILD_STATUS_ERR_NOT_FOUND, GUILD_STATUS_ERR_OUT_OF_MEMORY,
};
use guild_domain::ids::ImplId;
use guild_domain::operation::{
    Arity, Backend, BackendSet, Budget, BudgetKind, Capabilities, CpuIsa, DType, FailureKind,
    Layout, LayoutSet, MemorySpace, MemorySpaceSet, Numerics, ProviderRefusal, Rejection, SyncMode,
    SyncModeSet, TensorDesc, TensorRef, TensorRole,
};
use guild_domain::version::{OpVersionInterval, PackedVersion};
use guild_host::operations::{
    DeviceSupport, PassReason, PassedOver, ResolveError, TensorArg, TensorArgMut,
};
use guild_host::{OpHandle, OperationRequest, OperationService};
use guild_test_support::plugins::plugin_library;
use guild_test_support::Spec;

use crate::c_face::{Query, Service};
use crate::operations::{fixture_with, op, Fixture};

pub(crate) const COPY_OP: &str = "example.probe.copy";
pub(crate) const ZERO_OP: &str = "example.probe.zero";
pub(crate) const ZERO: &str = "example.probe.zero.cpu";
pub(crate) const REFERENCE: &str = "example.probe.reference.cpu";
const VERSION: &str = "example.probe.version.cpu";
const BACKEND: &str = "example.probe.backend.hip";
const CAPS: &str = "example.probe.caps.cpu";
const NUMERICS: &str = "example.probe.numerics.cpu";
const STREAM: &str = "example.probe.stream.cuda";
const ARITY: &str = "example.probe.arity.cpu";
const RANK: &str = "example.probe.rank.cpu";
const DIMS: &str = "example.probe.dims.cpu";
const BATCH: &str = "example.probe.batch.cpu";
const DTYPE: &str = "example.probe.dtype.cpu";
const LAYOUT: &str = "example.probe.layout.cpu";
const ALIGN: &str = "example.probe.align.cpu";
const DEVMEM: &str = "example.probe.devmem.cuda";
const CUDA: &str = "example.probe.cuda.cuda";
const SM: &str = "example.probe.sm.cuda";
const ISA: &str = "example.probe.isa.cpu";
const REFUSES: &str = "example.probe.refuses.cpu";
const SCRATCH: &str = "example.probe.scratch.cpu";
const BUDGET: &str = "example.probe.budget.cpu";

/// Every candidate of `example.probe.copy`, in the order the module registers them.
pub(crate) const COPY_CANDIDATES: [&str; 20] = [
    VERSION, BACKEND, CAPS, NUMERICS, STREAM, ARITY, RANK, DIMS, BATCH, DTYPE, LAYOUT, ALIGN,
    DEVMEM, CUDA, SM, ISA, REFUSES, SCRATCH, BUDGET, REFERENCE,
];

/// The baseline query's data addresses: aligned to 16 bytes, not to 32.
const INPUT_ADDR: u64 = 0x1_0010;
const OUTPUT_ADDR: u64 = 0x2_0010;
/// The baseline query's RAM budget.
const RAM_BUDGET: u64 = 4096;
/// Capability bit 0 of `example.probe.copy` (`PROBE_CAP_MIXED_LAYOUTS`).
const MIXED_LAYOUTS: Capabilities = Capabilities::from_bits(1);
/// The message of `example.probe.refuses.cpu` when no statically rejected probe was called.
const NEVER_CALLED: &str =
    "this probe refuses every query; statically rejected probes were called 0 times";

fn impl_id(name: &str) -> ImplId {
    ImplId::new(name).unwrap()
}

/// The probe package, with every impl id the module registers.
pub(crate) fn probe_spec(version: &str) -> Spec {
    let mut spec = Spec::module("example.probe", version).library(&plugin_library("op_probe"));
    spec.backends = vec!["cpu".into(), "cuda".into(), "hip".into()];
    spec.provided_ops = COPY_CANDIDATES
        .iter()
        .chain(&[ZERO])
        .map(|s| s.to_string())
        .collect();
    spec
}

/// A host over a fresh store with the probe module installed, signed, and loaded by dlopen.
pub(crate) fn probe_fixture() -> Fixture {
    fixture_with(&[probe_spec("1.0.0")], DeviceSupport::host())
}

/// The query the baseline contract accepts: an f32 [8, 2] input at [`INPUT_ADDR`] copied into an
/// f32 [8, 2] output with outer stride 10 at [`OUTPUT_ADDR`]; CPU or CUDA, no CUDA device, a CPU
/// with sse4.2, avx and avx2; capability [`MIXED_LAYOUTS`], deterministic numerics,
/// host-blocking, versions 1.x, a RAM budget of [`RAM_BUDGET`] bytes.
pub(crate) fn baseline() -> OperationRequest {
    let input = TensorDesc::new(DType::F32, &[8, 2], MemorySpace::Host).with_data_addr(INPUT_ADDR);
    let output = TensorDesc::new(DType::F32, &[8, 2], MemorySpace::Host)
        .with_strides(&[0, 10])
        .with_data_addr(OUTPUT_ADDR);
    let mut request = OperationRequest::cpu(op(COPY_OP), vec![input], vec![output])
        .capabilities(MIXED_LAYOUTS)
        .numerics(Numerics::DETERMINISTIC)
        .ram_budget(Budget::bytes(RAM_BUDGET));
    request.backends = BackendSet::CPU | BackendSet::CUDA;
    request.device.cpu_isa = CpuIsa::SSE4_2 | CpuIsa::AVX | CpuIsa::AVX2;
    request
}

/// The baseline asking for `name` exactly.
fn exact(name: &str) -> OperationRequest {
    baseline().exact(impl_id(name))
}

/// The reasons the issue lists for the diagnostic; [`cases`] must cover each.
pub(crate) const LISTED_REASONS: [&str; 12] = [
    "rank",
    "layout",
    "dtype",
    "alignment",
    "device",
    "capability",
    "numerics",
    "sync mode",
    "version interval",
    "budget",
    "scratch failure",
    "exact id absent",
];

/// One failing resolution and exactly what its report must say.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    /// Unique name, for messages.
    pub name: &'static str,
    /// The reason of the diagnostic it covers ([`LISTED_REASONS`] or another one).
    pub reason: &'static str,
    pub request: OperationRequest,
    pub kind: FailureKind,
    /// The candidate the case is about and its rejection; `None` when no candidate of the
    /// operation is the one asked for.
    pub rejected: Option<(ImplId, Rejection)>,
    /// How many candidates the report lists. With an exact request, every one but `rejected`
    /// must be [`Rejection::NotExactImpl`].
    pub listed: usize,
    /// Text the first line of the diagnostic must contain (the C service's message starts with
    /// that line, which survives truncation).
    pub header: Vec<String>,
}

impl Case {
    /// A case where the exact request for `name` is refused for `reason`.
    fn refused(
        name: &'static str,
        reason: &'static str,
        request: OperationRequest,
        rejection: Rejection,
    ) -> Case {
        let id = request
            .exact_impl
            .clone()
            .expect("a refused case asks for one candidate exactly");
        Case {
            name,
            reason,
            header: vec![
                format!("implementation {id} was requested for operation {COPY_OP} and refused"),
                format!("({rejection})"),
            ],
            kind: FailureKind::ExactImplRejected {
                impl_id: id.clone(),
            },
            rejected: Some((id, rejection)),
            listed: COPY_CANDIDATES.len(),
            request,
        }
    }

    /// Checks the first line of a diagnostic (the Rust error's `Display`, or the C message).
    pub fn check_header(&self, text: &str) -> Result<(), String> {
        let first = text.lines().next().unwrap_or_default();
        match self.header.iter().find(|h| !first.contains(h.as_str())) {
            Some(missing) => Err(format!("header {first:?} lacks {missing:?}")),
            None => Ok(()),
        }
    }

    /// Checks a resolution through the Rust face against the case.
    pub fn check(&self, outcome: Result<OpHandle<'_>, ResolveError>) -> Result<(), String> {
        let err = match outcome {
            Ok(handle) => return Err(format!("resolved to {}", handle.describe().impl_id)),
            Err(err) => err,
        };
        let Some(failure) = err.failure() else {
            return Err(format!("not a resolution report: {err:?}"));
        };
        if failure.kind != self.kind {
            return Err(format!("kind {:?}, expected {:?}", failure.kind, self.kind));
        }
        if failure.rejections.len() != self.listed {
            return Err(format!(
                "{} candidates listed, expected {}:\n{err}",
                failure.rejections.len(),
                self.listed
            ));
        }
        let target = self.rejected.as_ref().map(|(id, _)| id);
        for r in &failure.rejections {
            if Some(&r.impl_id) == target || self.request.exact_impl.is_none() {
                continue;
            }
            if r.reason != Rejection::NotExactImpl {
                return Err(format!("{} was rejected with {:?}", r.impl_id, r.reason));
            }
        }
        let text = err.to_string();
        if let Some((id, rejection)) = &self.rejected {
            let Some(found) = failure.rejections.iter().find(|r| &r.impl_id == id) else {
                return Err(format!("{id} is not in the report:\n{text}"));
            };
            if &found.reason != rejection {
                return Err(format!("{id}: {:?}, expected {rejection:?}", found.reason));
            }
            let line = format!("\n{id}: {rejection}");
            if !text.contains(&line) {
                return Err(format!("the report lacks the line {line:?}:\n{text}"));
            }
        }
        self.check_header(&text)
    }
}

/// The table: one failing request per reason (the twelve and the other rejections a
/// real provider can draw), each with its exact report. `validate` comes last: its message
/// proves that none of the statically rejected probes was called by any case before it.
pub(crate) fn cases() -> Vec<Case> {
    let input = TensorRef::input(0);
    let wanted = {
        let b = baseline();
        OpVersionInterval::new(b.min_version, b.max_version).unwrap()
    };
    let mut sm80 = exact(SM);
    sm80.device.cuda_sm = Some(80);
    let mut missing_op = baseline();
    missing_op.op_name = op("example.probe.missing");
    vec![
        Case::refused(
            "version",
            "version interval",
            exact(VERSION),
            Rejection::VersionOutOfInterval {
                version: PackedVersion::new(2, 0, 0).unwrap(),
                wanted,
            },
        ),
        Case::refused(
            "backend",
            "backend",
            exact(BACKEND),
            Rejection::BackendNotPermitted {
                backend: Backend::Hip,
                permitted: BackendSet::CPU | BackendSet::CUDA,
            },
        ),
        Case::refused(
            "capabilities",
            "capability",
            exact(CAPS),
            Rejection::MissingCapabilities {
                missing: MIXED_LAYOUTS,
            },
        ),
        Case::refused(
            "numerics",
            "numerics",
            exact(NUMERICS),
            Rejection::MissingNumerics {
                missing: Numerics::DETERMINISTIC,
            },
        ),
        Case::refused(
            "sync mode",
            "sync mode",
            exact(STREAM),
            Rejection::SyncModeUnsupported {
                requested: SyncMode::HostBlocking,
                offered: SyncModeSet::STREAM_ORDERED | SyncModeSet::GRAPH_CAPTURABLE,
            },
        ),
        Case::refused(
            "arity",
            "arity",
            exact(ARITY),
            Rejection::ArityOutOfRange {
                role: TensorRole::Input,
                count: 1,
                accepted: Arity::exactly(2),
            },
        ),
        Case::refused(
            "rank",
            "rank",
            exact(RANK),
            Rejection::RankOutOfRange {
                tensor: input,
                rank: 2,
                min: 1,
                max: 1,
            },
        ),
        Case::refused(
            "dimension",
            "dimension",
            exact(DIMS),
            Rejection::DimensionTooLarge {
                tensor: input,
                axis: 0,
                dim: 8,
                max: 4,
            },
        ),
        Case::refused(
            "batch",
            "batch",
            exact(BATCH),
            Rejection::BatchTooLarge {
                tensor: input,
                batch: 2,
                max: 1,
            },
        ),
        Case::refused(
            "dtype",
            "dtype",
            exact(DTYPE),
            Rejection::DtypeMismatch {
                tensor: input,
                expected: DType::F64,
                actual: DType::F32,
            },
        ),
        Case::refused(
            "layout",
            "layout",
            exact(LAYOUT),
            Rejection::LayoutUnsupported {
                tensor: TensorRef::output(0),
                layout: Layout::OuterStrided,
                accepted: LayoutSet::CONTIGUOUS,
            },
        ),
        Case::refused(
            "alignment",
            "alignment",
            exact(ALIGN),
            Rejection::Misaligned {
                tensor: input,
                address: INPUT_ADDR,
                required: 64,
            },
        ),
        Case::refused(
            "memory space",
            "memory space",
            exact(DEVMEM),
            Rejection::MemorySpaceNotPermitted {
                tensor: input,
                space: MemorySpace::Host,
                accepted: MemorySpaceSet::DEVICE,
            },
        ),
        Case::refused(
            "no cuda device",
            "device",
            exact(CUDA),
            Rejection::NoCudaDevice,
        ),
        Case::refused(
            "cuda sm",
            "device",
            sm80,
            Rejection::SmOutOfRange {
                sm: 80,
                min: 90,
                max: 100,
            },
        ),
        Case::refused(
            "cpu isa",
            "device",
            exact(ISA),
            Rejection::MissingIsa {
                missing: CpuIsa::AVX512F,
            },
        ),
        Case::refused(
            "scratch failure",
            "scratch failure",
            exact(SCRATCH),
            Rejection::ScratchRefused(ProviderRefusal::new(
                -4,
                "cannot stage 16 elements, at most 4",
            )),
        ),
        Case::refused(
            "budget",
            "budget",
            exact(BUDGET),
            Rejection::OverBudget {
                budget: BudgetKind::Ram,
                needed: 65536,
                allowed: Budget::bytes(RAM_BUDGET),
            },
        ),
        Case {
            name: "exact id unregistered",
            reason: "exact id absent",
            request: exact("example.probe.absent.cpu"),
            kind: FailureKind::ExactImplAbsent {
                impl_id: impl_id("example.probe.absent.cpu"),
                registered_for: None,
            },
            rejected: None,
            listed: COPY_CANDIDATES.len(),
            header: vec![format!(
                "implementation example.probe.absent.cpu was requested for operation {COPY_OP} \
                 but is not registered"
            )],
        },
        Case {
            name: "exact id of another operation",
            reason: "exact id absent",
            request: exact(ZERO),
            kind: FailureKind::ExactImplAbsent {
                impl_id: impl_id(ZERO),
                registered_for: Some(op(ZERO_OP)),
            },
            rejected: None,
            listed: COPY_CANDIDATES.len(),
            header: vec![format!(
                "implementation {ZERO} was requested for operation {COPY_OP} but implements \
                 {ZERO_OP}"
            )],
        },
        Case {
            name: "no candidates",
            reason: "no candidates",
            request: missing_op,
            kind: FailureKind::NoCandidates,
            rejected: None,
            listed: 0,
            header: vec![
                "no implementation of operation example.probe.missing is registered".into(),
            ],
        },
        Case::refused(
            "validate",
            "validate",
            exact(REFUSES),
            Rejection::ValidateRefused(ProviderRefusal::new(-2, NEVER_CALLED)),
        ),
    ]
}

/// What each candidate but the reference says to the plain baseline query (no exact id): the
/// table's rejection for every case asked with the baseline, and `NoCudaDevice` for the SM-bounded
/// candidate, whose case reports an SM.
fn baseline_rejections() -> Vec<(ImplId, Rejection)> {
    let mut out: Vec<(ImplId, Rejection)> = cases()
        .into_iter()
        .filter_map(|case| {
            let (id, rejection) = case.rejected?;
            (case.request == exact(id.as_str())).then_some((id, rejection))
        })
        .collect();
    out.push((impl_id(SM), Rejection::NoCudaDevice));
    let ids: BTreeSet<&str> = out.iter().map(|(id, _)| id.as_str()).collect();
    let others: BTreeSet<&str> = COPY_CANDIDATES
        .iter()
        .copied()
        .filter(|&c| c != REFERENCE)
        .collect();
    assert_eq!(ids, others, "one baseline rejection per candidate");
    assert_eq!(out.len(), others.len());
    out
}

#[test]
fn every_reason_of_the_diagnostic_is_reported_exactly() {
    let f = probe_fixture();
    let service = OperationService::new(f.host.kernels());
    let table = cases();
    let failures: Vec<String> = table
        .iter()
        .filter_map(|case| {
            case.check(service.resolve(&case.request))
                .err()
                .map(|e| format!("case {:?} ({}): {e}", case.name, case.reason))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));

    assert_eq!(table.len(), 22);
    let names: BTreeSet<&str> = table.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), table.len(), "case names are unique");
    let covered: BTreeSet<&str> = table.iter().map(|c| c.reason).collect();
    for reason in LISTED_REASONS {
        assert!(covered.contains(reason), "no case covers {reason}");
    }
    // Each rejection variant a provider can draw appears exactly once (the two that the
    // registry makes impossible, a malformed contract and a duplicate impl id, aside).
    let rejected: Vec<&Rejection> = table
        .iter()
        .filter_map(|c| c.rejected.as_ref().map(|(_, r)| r))
        .collect();
    let variants: BTreeSet<String> = rejected
        .iter()
        .map(|r| format!("{:?}", std::mem::discriminant(*r)))
        .collect();
    assert_eq!(rejected.len(), 19);
    assert_eq!(variants.len(), rejected.len());
}

#[test]
fn a_query_nobody_accepts_lists_every_candidate_with_its_own_reason() {
    let f = probe_fixture();
    let service = OperationService::new(f.host.kernels());
    // The baseline with an output of another shape (still outer-strided, at the same address):
    // only a provider that compares the two shapes notices, and that is the reference alone.
    let mut request = baseline();
    request.outputs[0] = TensorDesc::new(DType::F32, &[2, 8], MemorySpace::Host)
        .with_strides(&[0, 4])
        .with_data_addr(OUTPUT_ADDR);
    let err = service.resolve(&request).unwrap_err();
    let failure = err.failure().expect("a resolution report");
    assert_eq!(failure.kind, FailureKind::NoneCompatible);
    assert_eq!(failure.rejections.len(), COPY_CANDIDATES.len(), "{err}");

    let mut expected = baseline_rejections();
    expected.push((
        impl_id(REFERENCE),
        Rejection::ValidateRefused(ProviderRefusal::new(
            -2,
            "output axis 0 has extent 2, the input's has 8",
        )),
    ));
    let text = err.to_string();
    assert_eq!(
        text.lines().next(),
        Some("none of the 20 implementations of operation example.probe.copy accepts the query")
    );
    for (id, rejection) in &expected {
        let found = failure
            .rejections
            .iter()
            .find(|r| &r.impl_id == id)
            .unwrap_or_else(|| panic!("{id} is not in the report:\n{text}"));
        assert_eq!(&found.reason, rejection, "{id}");
        assert!(text.contains(&format!("\n{id}: {rejection}")), "{text}");
    }
    // Sorted by impl id, one line per candidate after the header.
    let ids: Vec<&str> = failure
        .rejections
        .iter()
        .map(|r| r.impl_id.as_str())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted);
    assert_eq!(text.lines().count(), 1 + COPY_CANDIDATES.len());

    // No statically rejected probe was called during that resolution, before or after the
    // refusing probe reported its count.
    let err = service.resolve(&exact(REFUSES)).unwrap_err();
    assert!(err.to_string().contains(NEVER_CALLED), "{err}");
}

#[test]
fn the_reference_takes_the_baseline_after_every_other_candidate_is_rejected() {
    let f = probe_fixture();
    let service = OperationService::new(f.host.kernels()).reporting();
    let handle = service.resolve(&baseline()).unwrap();
    let d = handle.describe();
    assert_eq!(d.impl_id.as_str(), REFERENCE);
    assert_eq!(d.package.as_str(), "example.probe");
    assert_eq!(d.op_version, PackedVersion::new(1, 1, 0).unwrap());
    assert_eq!(d.priority, 1);
    assert_eq!((d.scratch.host_bytes, d.scratch.device_bytes), (0, 0));

    // The reference ranks last, so every other candidate was rejected rather than outranked,
    // each with the reason the table gives it.
    let passed_over = handle
        .passed_over()
        .expect("a reporting service keeps the report");
    let expected = baseline_rejections();
    assert_eq!(passed_over.len(), expected.len(), "{passed_over:#?}");
    for (id, rejection) in expected {
        let entry = PassedOver {
            impl_id: id,
            reason: PassReason::Rejected(rejection),
        };
        assert!(
            passed_over.contains(&entry),
            "{entry} not in {passed_over:#?}"
        );
    }

    // And the chosen copy runs: rows land 10 elements apart, the padding keeps its sentinel.
    let request = baseline();
    let (input_desc, output_desc) = (request.inputs[0], request.outputs[0]);
    let input: Vec<f32> = (0..16).map(|i| i as f32 + 0.5).collect();
    let mut output = vec![-1.0f32; 18];
    handle
        .execute(
            &[TensorArg::new(&input_desc, &input)],
            &mut [TensorArgMut::new(&output_desc, &mut output)],
            None,
        )
        .unwrap();
    assert_eq!(&output[..8], &input[..8]);
    assert_eq!(&output[8..10], &[-1.0, -1.0]);
    assert_eq!(&output[10..], &input[8..]);
    drop(handle);

    let err = service.resolve(&exact(REFUSES)).unwrap_err();
    assert!(err.to_string().contains(NEVER_CALLED), "{err}");
}

/// The C form of a request, as a C runner would build it: the device record is the CUDA one
/// when the request names a CUDA device, the CPU one otherwise (a C query carries one record).
fn c_query(r: &OperationRequest) -> Query {
    let c_tensor = |d: &TensorDesc| guild_tensor_desc_v1_t {
        dtype: d.dtype.raw(),
        rank: d.rank,
        dims: d.dims,
        strides: d.strides,
        memory_space: d.memory_space.bit(),
        device_id: d.device_id,
        data: d
            .data_addr
            .map_or(std::ptr::null_mut(), |a| a as usize as *mut _),
    };
    let mut q = Query::cpu(
        r.op_name.as_str(),
        r.inputs.iter().map(c_tensor).collect(),
        r.outputs.iter().map(c_tensor).collect(),
    );
    q.min_version = r.min_version.raw();
    q.max_version = r.max_version.raw();
    q.backends = r.backends.bits();
    q.sync_mode = r.sync_mode.raw();
    q.capabilities = r.capabilities.bits();
    q.numerics = r.numerics.bits();
    q.ram_budget = r.ram_budget.get();
    q.vram_budget = r.vram_budget.get();
    q.exact = r
        .exact_impl
        .as_ref()
        .map(|id| std::ffi::CString::new(id.as_str()).unwrap());
    let (backend, cuda_sm, cpu_isa) = match r.device.cuda_sm {
        Some(sm) => (GUILD_BACKEND_CUDA, sm, 0),
        None => (GUILD_BACKEND_CPU, 0, r.device.cpu_isa.bits()),
    };
    q.device_caps = Some(guild_device_caps_v1_t {
        struct_size: size_of::<guild_device_caps_v1_t>() as u32,
        backend,
        device_id: r.device.device_id,
        cuda_sm,
        cpu_isa,
        total_memory_bytes: 0,
        free_memory_bytes: 0,
        next_ext: std::ptr::null(),
    });
    q
}

#[test]
fn every_reason_reaches_a_c_caller_in_its_error_record() {
    let f = probe_fixture();
    let service = Service::of(f.host.kernels());
    let mut statuses = BTreeSet::new();
    for case in cases() {
        let err = match service.resolve(&c_query(&case.request)) {
            Ok(h) => panic!(
                "case {:?} resolved to {}",
                case.name,
                h.describe().unwrap().impl_id
            ),
            Err(err) => err,
        };
        assert_eq!(err.component, "guild.operations", "{}", case.name);
        let over_budget = matches!(case.rejected, Some((_, Rejection::OverBudget { .. })));
        let status = if over_budget {
            GUILD_STATUS_ERR_OUT_OF_MEMORY
        } else {
            GUILD_STATUS_ERR_NOT_FOUND
        };
        assert_eq!(err.status, status, "case {:?}: {err}", case.name);
        statuses.insert(err.status);
        case.check_header(&err.message)
            .unwrap_or_else(|e| panic!("case {:?}: {e}", case.name));
        // An exact request's message names the rejected candidate with its reason and counts
        // the others, within the C buffer.
        if let (Some((id, rejection)), Some(_)) = (&case.rejected, &case.request.exact_impl) {
            let line =
                format!("{id} was requested for operation {COPY_OP} and refused ({rejection})");
            assert!(
                err.message.contains(&line),
                "case {:?}: {line:?} not in {err}",
                case.name
            );
            assert!(
                err.message.ends_with(&format!(
                    "; {} other candidate(s): not the implementation the query names exactly",
                    case.listed - 1
                )),
                "case {:?}: {err}",
                case.name
            );
        }
        assert!(err.message.len() < 512, "{}", err.message.len());
    }
    assert_eq!(
        statuses,
        BTreeSet::from([GUILD_STATUS_ERR_OUT_OF_MEMORY, GUILD_STATUS_ERR_NOT_FOUND])
    );
    assert_eq!(f.host.kernels().live_c_handles(), 0);
}
