//! Choosing a provider for a query: cheap static checks first, then a deterministic ranking, then
//! the provider's negotiation callbacks in rank order until one accepts.

use std::cmp::Ordering;
use std::collections::binary_heap::{BinaryHeap, PeekMut};
use std::fmt;

use super::contract::{Arity, CandidateError, DeviceCaps, OpCandidate, OpQuery};
use super::tensor::{TensorDesc, TensorInfo, TensorRef, TensorRole};
use super::values::{
    Backend, BackendSet, Budget, BudgetKind, Capabilities, CpuIsa, DType, Layout, LayoutSet,
    MemorySpace, MemorySpaceSet, Numerics, SyncMode, SyncModeSet,
};
use crate::ids::{ImplId, OpName};
use crate::version::{OpVersionInterval, PackedVersion};

/// A negotiation callback's refusal: the `guild_status_t` it returned and the message it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderRefusal {
    /// The status code (negative; see the shared status list).
    pub status: i32,
    /// The provider's own explanation, possibly empty.
    pub message: String,
}

impl ProviderRefusal {
    /// A refusal with `status` and `message`.
    pub fn new(status: i32, message: impl Into<String>) -> Self {
        ProviderRefusal {
            status,
            message: message.into(),
        }
    }
}

/// The symbolic name of a `guild_status_t`, for messages.
fn status_name(status: i32) -> Option<&'static str> {
    Some(match status {
        0 => "ok",
        -1 => "invalid argument",
        -2 => "unsupported",
        -3 => "abi mismatch",
        -4 => "out of memory",
        -5 => "not found",
        -6 => "already exists",
        -7 => "busy",
        -8 => "internal",
        -9 => "device",
        -10 => "buffer too small",
        -11 => "state",
        -12 => "permission",
        -13 => "timeout",
        _ => return None,
    })
}

impl fmt::Display for ProviderRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match status_name(self.status) {
            Some(name) => write!(f, "status {} ({name})", self.status)?,
            None => write!(f, "status {}", self.status)?,
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ProviderRefusal {}

/// Scratch memory a provider asks for, which the caller allocates and owns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ScratchRequest {
    /// Bytes of host scratch, bounded by the query's RAM budget.
    pub host_bytes: u64,
    /// Bytes of device scratch, bounded by the query's VRAM budget.
    pub device_bytes: u64,
}

/// The provider's negotiation callbacks (GOP1 `validate` and `query_scratch`), behind a port so
/// that the ranking stays pure. The app implements it by calling the C callbacks with the query's
/// actual tensors; tests use fakes.
///
/// Both calls receive `index`, the candidate's position in the slice given to [`resolve`], so
/// that an implementation can find the callbacks that belong to it without a lookup. They are
/// negotiation only: an implementation must not allocate device memory, launch work, keep the
/// query, or reenter the registry (the app may call them under its registry lock).
pub trait Negotiator {
    /// Asks the provider whether it accepts the query's tensors (the place where a descriptor's
    /// [`DType::ANY`] is settled).
    fn validate(
        &self,
        index: usize,
        candidate: &OpCandidate,
        query: &OpQuery<'_>,
    ) -> Result<(), ProviderRefusal>;

    /// Asks the provider how much scratch it needs for the query's tensors. Called only after
    /// `validate` accepted.
    fn query_scratch(
        &self,
        index: usize,
        candidate: &OpCandidate,
        query: &OpQuery<'_>,
    ) -> Result<ScratchRequest, ProviderRefusal>;
}

/// Why one candidate cannot serve a query. The static reasons (everything up to
/// [`Rejection::DuplicateImplId`]) are found without calling the provider.
///
/// Messages carry their detail inline, with no `source` chain, so that one line says it all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The query names another impl id exactly.
    #[error("not the implementation the query names exactly")]
    NotExactImpl,
    /// The descriptor fails [`OpCandidate::check`].
    #[error("malformed descriptor: {0}")]
    InvalidCandidate(CandidateError),
    /// The operation version is outside the query's interval.
    #[error("operation version {version} is outside the requested {wanted}")]
    VersionOutOfInterval {
        /// The candidate's operation version.
        version: PackedVersion,
        /// The interval the query asks for.
        wanted: OpVersionInterval,
    },
    /// The candidate runs on a backend the query does not permit.
    #[error("backend {backend} is not among the permitted {permitted}")]
    BackendNotPermitted {
        /// The candidate's backend.
        backend: Backend,
        /// The backends the query permits.
        permitted: BackendSet,
    },
    /// Required capability bits are not offered; `missing` names them.
    #[error("lacks required capability bits {missing}")]
    MissingCapabilities {
        /// The required bits the candidate lacks.
        missing: Capabilities,
    },
    /// Required numerics bits are not offered; `missing` names them.
    #[error("lacks required numerics bits {missing}")]
    MissingNumerics {
        /// The required bits the candidate lacks.
        missing: Numerics,
    },
    /// The query's sync mode is not among the candidate's.
    #[error("sync mode {requested} is not among its {offered}")]
    SyncModeUnsupported {
        /// The query's mode.
        requested: SyncMode,
        /// The modes the candidate supports.
        offered: SyncModeSet,
    },
    /// The query has too few or too many inputs or outputs.
    #[error("takes {accepted} {role}s, the query has {count}")]
    ArityOutOfRange {
        /// Inputs or outputs.
        role: TensorRole,
        /// How many the query has.
        count: usize,
        /// How many the candidate takes.
        accepted: Arity,
    },
    /// A tensor's rank is outside the candidate's bounds.
    #[error("{tensor} has rank {rank}, outside {min}..={max}")]
    RankOutOfRange {
        /// Which tensor.
        tensor: TensorRef,
        /// Its rank.
        rank: u32,
        /// The candidate's lowest rank.
        min: u32,
        /// The candidate's highest rank.
        max: u32,
    },
    /// A tensor axis exceeds the descriptor's dimension bound.
    #[error("{tensor} axis {axis} has extent {dim}, above the bound {max}")]
    DimensionTooLarge {
        /// Which tensor.
        tensor: TensorRef,
        /// The axis.
        axis: usize,
        /// Its extent.
        dim: u64,
        /// The descriptor's bound for that axis.
        max: u64,
    },
    /// A tensor's batch (product of outer extents) exceeds the descriptor's bound.
    #[error("{tensor} has batch {batch} (product of its outer extents), above the bound {max}")]
    BatchTooLarge {
        /// Which tensor.
        tensor: TensorRef,
        /// The product of its outer extents.
        batch: u64,
        /// The descriptor's bound.
        max: u64,
    },
    /// A tensor's dtype differs from the one the descriptor fixes for its role.
    #[error("{tensor} is {actual}, the provider takes {expected}")]
    DtypeMismatch {
        /// Which tensor.
        tensor: TensorRef,
        /// The dtype the candidate fixes.
        expected: DType,
        /// The tensor's dtype.
        actual: DType,
    },
    /// A tensor's layout is not accepted.
    #[error("{tensor} is {layout}, the provider accepts {accepted}")]
    LayoutUnsupported {
        /// Which tensor.
        tensor: TensorRef,
        /// The tensor's layout.
        layout: Layout,
        /// The layouts the candidate accepts.
        accepted: LayoutSet,
    },
    /// A tensor's data address is not aligned as required.
    #[error("{tensor} data at {address:#x} is not aligned to {required} bytes")]
    Misaligned {
        /// Which tensor.
        tensor: TensorRef,
        /// The data address.
        address: u64,
        /// The alignment the candidate requires, in bytes.
        required: u64,
    },
    /// A tensor's memory space is not accepted.
    #[error("{tensor} is in {space} memory, the provider accepts {accepted}")]
    MemorySpaceNotPermitted {
        /// Which tensor.
        tensor: TensorRef,
        /// The tensor's memory space.
        space: MemorySpace,
        /// The memory spaces the candidate accepts.
        accepted: MemorySpaceSet,
    },
    /// A CUDA candidate, and the query reports no CUDA device.
    #[error("a cuda provider needs a cuda device and the query reports none")]
    NoCudaDevice,
    /// The device's CUDA compute capability is outside the candidate's bounds.
    #[error("cuda compute capability {sm} is outside {}", SmBounds(*min, *max))]
    SmOutOfRange {
        /// The device's compute capability times ten.
        sm: u32,
        /// The candidate's lowest (0: none).
        min: u32,
        /// The candidate's highest (0: none).
        max: u32,
    },
    /// The host CPU lacks required ISA features; `missing` names them.
    #[error("the cpu lacks required isa bits {missing}")]
    MissingIsa {
        /// The required bits the CPU lacks.
        missing: CpuIsa,
    },
    /// Two compatible candidates tie on impl id and priority.
    #[error(
        "another compatible candidate has the same impl id and priority, so neither ranks first"
    )]
    DuplicateImplId,
    /// The provider's validate callback refused.
    #[error("validate refused: {0}")]
    ValidateRefused(ProviderRefusal),
    /// The provider's scratch query failed.
    #[error("scratch query failed: {0}")]
    ScratchRefused(ProviderRefusal),
    /// The scratch asked for exceeds the RAM or VRAM budget.
    #[error("needs {needed} bytes of {} scratch, over the {budget} budget of {allowed}", budget.scratch())]
    OverBudget {
        /// RAM (host scratch) or VRAM (device scratch).
        budget: BudgetKind,
        /// The bytes the provider asked for.
        needed: u64,
        /// The query's budget.
        allowed: Budget,
    },
}

impl Rejection {
    /// Whether the reason was found without calling the provider.
    pub fn is_static(&self) -> bool {
        !matches!(
            self,
            Rejection::ValidateRefused(_)
                | Rejection::ScratchRefused(_)
                | Rejection::OverBudget { .. }
        )
    }
}

/// Prints an SM range whose zero bounds mean "unbounded".
struct SmBounds(u32, u32);

impl fmt::Display for SmBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (0, 0) => f.write_str("any"),
            (min, 0) => write!(f, "{min}.."),
            (0, max) => write!(f, "..={max}"),
            (min, max) => write!(f, "{min}..={max}"),
        }
    }
}

/// The verdict on a candidate that was not chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason<'c> {
    /// It cannot serve the query.
    Rejected(Rejection),
    /// It might have served the query, but a better-ranked candidate was chosen first; its
    /// callbacks were not called.
    Outranked {
        /// The chosen candidate's impl id.
        by: &'c ImplId,
    },
}

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Rejected(r) => r.fmt(f),
            Reason::Outranked { by } => write!(f, "outranked by {by}, which was chosen"),
        }
    }
}

/// One candidate that was not chosen, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<'c> {
    /// Its position in the slice given to [`resolve`].
    pub index: usize,
    /// Its impl id.
    pub impl_id: &'c ImplId,
    /// Why it was not chosen.
    pub reason: Reason<'c>,
}

/// The chosen candidate and the scratch it negotiated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Choice {
    /// Its position in the slice given to [`resolve`].
    pub index: usize,
    /// Its impl id.
    pub impl_id: ImplId,
    /// The scratch it asked for, within the query's budgets.
    pub scratch: ScratchRequest,
}

/// Why a resolution chose nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// No candidate implements the operation at all.
    NoCandidates,
    /// Every candidate was rejected.
    NoneCompatible,
    /// The query named an exact impl id that implements no candidate of this operation.
    ExactImplAbsent {
        /// The id asked for.
        impl_id: ImplId,
        /// The operation that id does implement, when it is registered for another one.
        registered_for: Option<OpName>,
    },
    /// The query named an exact impl id and that candidate was rejected; exact requests never
    /// fall back to another candidate.
    ExactImplRejected {
        /// The id asked for.
        impl_id: ImplId,
    },
}

/// The outcome of [`resolve`]: a choice or a failure, plus one verdict for every other candidate
/// of the operation (ordered by their position in the candidate slice). Candidates of other
/// operations take no part and get no verdict.
///
/// `Display` writes a header line followed by one `impl_id: reason` line per candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution<'c> {
    op_name: OpName,
    outcome: Result<Choice, FailureKind>,
    verdicts: Vec<Verdict<'c>>,
}

impl<'c> Resolution<'c> {
    /// The operation resolved.
    pub fn op_name(&self) -> &OpName {
        &self.op_name
    }

    /// The chosen candidate, if any.
    pub fn choice(&self) -> Option<&Choice> {
        self.outcome.as_ref().ok()
    }

    /// Why nothing was chosen, if nothing was.
    pub fn failure(&self) -> Option<&FailureKind> {
        self.outcome.as_ref().err()
    }

    /// One verdict per candidate of the operation other than the choice, by candidate index.
    pub fn verdicts(&self) -> &[Verdict<'c>] {
        &self.verdicts
    }

    /// The verdict on the candidate with `impl_id` (the first, should ids repeat).
    pub fn reason_for(&self, impl_id: &str) -> Option<&Reason<'c>> {
        self.verdicts
            .iter()
            .find(|v| v.impl_id.as_str() == impl_id)
            .map(|v| &v.reason)
    }

    /// The choice, or an owned report of the failure that outlives the candidates.
    pub fn into_result(self) -> Result<Choice, ResolveFailure> {
        match self.outcome {
            Ok(choice) => Ok(choice),
            Err(kind) => Err(ResolveFailure::new(self.op_name, kind, &self.verdicts)),
        }
    }
}

impl fmt::Display for Resolution<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Ok(choice) => write!(
                f,
                "operation {}: chose {} (host scratch {} bytes, device scratch {} bytes)",
                self.op_name,
                choice.impl_id,
                choice.scratch.host_bytes,
                choice.scratch.device_bytes
            )?,
            Err(kind) => {
                let exact_reason =
                    exact_rejection(kind, self.verdicts.iter().map(|v| (v.impl_id, &v.reason)));
                write_failure_header(
                    f,
                    &self.op_name,
                    kind,
                    self.verdicts.len(),
                    exact_reason.map(|r| r as _),
                )?;
            }
        }
        for v in &self.verdicts {
            write!(f, "\n{}: {}", v.impl_id, v.reason)?;
        }
        Ok(())
    }
}

/// One rejected candidate in a [`ResolveFailure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedCandidate {
    /// Its position in the slice given to [`resolve`].
    pub index: usize,
    /// Its impl id.
    pub impl_id: ImplId,
    /// Why it was rejected.
    pub reason: Rejection,
}

/// A failed resolution that explains itself, owned so that it can travel as an error.
///
/// `Display` writes a header line saying what failed (for an exact request, with that
/// candidate's reason, so that it survives truncation into a short C buffer), then one
/// `impl_id: reason` line per candidate, sorted by impl id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveFailure {
    /// The operation asked for.
    pub op_name: OpName,
    /// What failed.
    pub kind: FailureKind,
    /// Every candidate of the operation and why it was rejected, sorted by impl id.
    pub rejections: Vec<FailedCandidate>,
}

impl ResolveFailure {
    fn new(op_name: OpName, kind: FailureKind, verdicts: &[Verdict<'_>]) -> Self {
        let mut rejections: Vec<FailedCandidate> = verdicts
            .iter()
            .filter_map(|v| match &v.reason {
                Reason::Rejected(reason) => Some(FailedCandidate {
                    index: v.index,
                    impl_id: v.impl_id.clone(),
                    reason: reason.clone(),
                }),
                // Nothing is outranked when nothing was chosen.
                Reason::Outranked { .. } => None,
            })
            .collect();
        rejections.sort_by(|a, b| a.impl_id.cmp(&b.impl_id).then(a.index.cmp(&b.index)));
        ResolveFailure {
            op_name,
            kind,
            rejections,
        }
    }
}

impl fmt::Display for ResolveFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let exact_reason = exact_rejection(
            &self.kind,
            self.rejections.iter().map(|r| (&r.impl_id, &r.reason)),
        );
        write_failure_header(
            f,
            &self.op_name,
            &self.kind,
            self.rejections.len(),
            exact_reason.map(|r| r as _),
        )?;
        for r in &self.rejections {
            write!(f, "\n{}: {}", r.impl_id, r.reason)?;
        }
        Ok(())
    }
}

impl std::error::Error for ResolveFailure {}

/// The reason the exactly requested candidate was rejected, when the failure is that.
fn exact_rejection<'a, R: fmt::Display + 'a>(
    kind: &FailureKind,
    mut reasons: impl Iterator<Item = (&'a ImplId, &'a R)>,
) -> Option<&'a R> {
    match kind {
        FailureKind::ExactImplRejected { impl_id } => {
            reasons.find(|(id, _)| *id == impl_id).map(|(_, r)| r)
        }
        _ => None,
    }
}

fn write_failure_header(
    f: &mut fmt::Formatter<'_>,
    op: &OpName,
    kind: &FailureKind,
    considered: usize,
    exact_reason: Option<&dyn fmt::Display>,
) -> fmt::Result {
    match kind {
        FailureKind::NoCandidates => write!(f, "no implementation of operation {op} is registered"),
        FailureKind::NoneCompatible => write!(
            f,
            "none of the {considered} implementations of operation {op} accepts the query"
        ),
        FailureKind::ExactImplAbsent {
            impl_id,
            registered_for: Some(other),
        } => write!(
            f,
            "implementation {impl_id} was requested for operation {op} but implements {other}"
        ),
        FailureKind::ExactImplAbsent {
            impl_id,
            registered_for: None,
        } => {
            write!(
                f,
                "implementation {impl_id} was requested for operation {op} but is not registered"
            )
        }
        FailureKind::ExactImplRejected { impl_id } => {
            write!(
                f,
                "implementation {impl_id} was requested for operation {op} and refused"
            )?;
            if let Some(reason) = exact_reason {
                write!(f, " ({reason})")?;
            }
            f.write_str("; an exact request does not fall back")
        }
    }
}

/// The ranking: descending priority, then ascending impl id (byte order).
///
/// Impl ids are globally unique, so over distinct ids this is a strict total order, and the
/// ranking never depends on the order in which candidates were registered.
pub fn rank_order(a: &OpCandidate, b: &OpCandidate) -> Ordering {
    b.priority
        .cmp(&a.priority)
        .then_with(|| a.impl_id.cmp(&b.impl_id))
}

/// Every check that needs no provider callback, in the order that decides which reason is
/// reported: exact id, descriptor sanity, version, backend, capabilities, numerics, sync mode,
/// arity, each tensor (inputs, then outputs; see [`check_tensor`]), then the device.
pub fn check_static(query: &OpQuery<'_>, candidate: &OpCandidate) -> Result<(), Rejection> {
    let spec = query.spec();
    let c = candidate;
    if spec.exact_impl.is_some_and(|id| *id != c.impl_id) {
        return Err(Rejection::NotExactImpl);
    }
    c.check().map_err(Rejection::InvalidCandidate)?;
    if !query.versions().contains(c.op_version) {
        return Err(Rejection::VersionOutOfInterval {
            version: c.op_version,
            wanted: query.versions(),
        });
    }
    if !spec.backends.has(c.backend) {
        return Err(Rejection::BackendNotPermitted {
            backend: c.backend,
            permitted: spec.backends,
        });
    }
    let missing = spec.capabilities.difference(c.capabilities);
    if !missing.is_empty() {
        return Err(Rejection::MissingCapabilities { missing });
    }
    let missing = spec.numerics.difference(c.numerics);
    if !missing.is_empty() {
        return Err(Rejection::MissingNumerics { missing });
    }
    if !c.sync_modes.has(spec.sync_mode) {
        return Err(Rejection::SyncModeUnsupported {
            requested: spec.sync_mode,
            offered: c.sync_modes,
        });
    }
    for (role, count, accepted) in [
        (TensorRole::Input, spec.inputs.len(), c.inputs),
        (TensorRole::Output, spec.outputs.len(), c.outputs),
    ] {
        if !accepted.admits(count) {
            return Err(Rejection::ArityOutOfRange {
                role,
                count,
                accepted,
            });
        }
    }
    for (index, (desc, info)) in spec.inputs.iter().zip(query.input_infos()).enumerate() {
        check_tensor(c, TensorRef::input(index), desc, info)?;
    }
    for (index, (desc, info)) in spec.outputs.iter().zip(query.output_infos()).enumerate() {
        check_tensor(c, TensorRef::output(index), desc, info)?;
    }
    check_device(c, &spec.device)
}

/// Checks one valid tensor against a candidate's declaration, in this order: rank, every
/// extent against `max_dim`, batch against `max_batch`, dtype (unless the descriptor says
/// [`DType::ANY`]), layout, alignment of the data address (skipped when it is unknown), memory
/// space. Public so that the app can repeat it at execute time with the real addresses.
pub fn check_tensor(
    candidate: &OpCandidate,
    tensor: TensorRef,
    desc: &TensorDesc,
    info: &TensorInfo,
) -> Result<(), Rejection> {
    let c = candidate;
    if desc.rank < c.min_rank || desc.rank > c.max_rank {
        return Err(Rejection::RankOutOfRange {
            tensor,
            rank: desc.rank,
            min: c.min_rank,
            max: c.max_rank,
        });
    }
    if let Some((axis, (&dim, &max))) = desc
        .shape()
        .iter()
        .zip(c.max_dim.iter())
        .enumerate()
        .find(|(_, (&d, &max))| max != 0 && d > max)
    {
        return Err(Rejection::DimensionTooLarge {
            tensor,
            axis,
            dim,
            max,
        });
    }
    if c.max_batch != 0 && info.batch > c.max_batch {
        return Err(Rejection::BatchTooLarge {
            tensor,
            batch: info.batch,
            max: c.max_batch,
        });
    }
    let expected = match tensor.role {
        TensorRole::Input => c.input_dtype,
        TensorRole::Output => c.output_dtype,
    };
    if !expected.is_any() && desc.dtype != expected {
        return Err(Rejection::DtypeMismatch {
            tensor,
            expected,
            actual: desc.dtype,
        });
    }
    if !c.layouts.admits(info.layout) {
        return Err(Rejection::LayoutUnsupported {
            tensor,
            layout: info.layout,
            accepted: c.layouts,
        });
    }
    if let Some(address) = desc.data_addr {
        // `check` has refused alignments that are not powers of two, so a mask replaces the
        // division (which showed in the ranking benchmark); 0 and 1 require nothing.
        if c.min_alignment > 1 && address & (c.min_alignment - 1) != 0 {
            return Err(Rejection::Misaligned {
                tensor,
                address,
                required: c.min_alignment,
            });
        }
    }
    if !c.memory_spaces.has(desc.memory_space) {
        return Err(Rejection::MemorySpaceNotPermitted {
            tensor,
            space: desc.memory_space,
            accepted: c.memory_spaces,
        });
    }
    Ok(())
}

fn check_device(c: &OpCandidate, device: &DeviceCaps) -> Result<(), Rejection> {
    if c.backend == Backend::Cuda {
        let sm = device.cuda_sm.ok_or(Rejection::NoCudaDevice)?;
        let too_low = c.min_sm != 0 && sm < c.min_sm;
        let too_high = c.max_sm != 0 && sm > c.max_sm;
        if too_low || too_high {
            return Err(Rejection::SmOutOfRange {
                sm,
                min: c.min_sm,
                max: c.max_sm,
            });
        }
    }
    let missing = c.cpu_isa.difference(device.cpu_isa);
    if !missing.is_empty() {
        return Err(Rejection::MissingIsa { missing });
    }
    Ok(())
}

/// Runs the provider's callbacks for one statically compatible candidate and checks its scratch
/// against the budgets: what [`resolve`] does for each candidate it tries, and what a reshape
/// of a resolved handle repeats with its one provider (after [`check_static`]), without ranking.
pub fn negotiate(
    query: &OpQuery<'_>,
    index: usize,
    candidate: &OpCandidate,
    negotiator: &dyn Negotiator,
) -> Result<ScratchRequest, Rejection> {
    negotiator
        .validate(index, candidate, query)
        .map_err(Rejection::ValidateRefused)?;
    let scratch = negotiator
        .query_scratch(index, candidate, query)
        .map_err(Rejection::ScratchRefused)?;
    let spec = query.spec();
    check_budgets(&scratch, spec.ram_budget, spec.vram_budget)?;
    Ok(scratch)
}

/// Checks a provider's scratch request against a query's RAM and VRAM budgets, RAM first: the
/// last step of [`negotiate`], and of a reshape, which renegotiates within the budgets its
/// handle was resolved with.
pub fn check_budgets(
    scratch: &ScratchRequest,
    ram_budget: Budget,
    vram_budget: Budget,
) -> Result<(), Rejection> {
    for (budget, needed, allowed) in [
        (BudgetKind::Ram, scratch.host_bytes, ram_budget),
        (BudgetKind::Vram, scratch.device_bytes, vram_budget),
    ] {
        if !allowed.allows(needed) {
            return Err(Rejection::OverBudget {
                budget,
                needed,
                allowed,
            });
        }
    }
    Ok(())
}

/// Chooses the provider for `query` among `candidates` (every registered candidate; those of
/// other operations are skipped without a verdict).
///
/// 1. Each candidate of the operation passes [`check_static`] or is rejected with its first
///    failing reason. No callback is called for it.
/// 2. The compatible ones are ranked by [`rank_order`].
/// 3. From the best down, each is asked to validate, then for its scratch, which must fit the RAM
///    and VRAM budgets. The first to pass is chosen; the rest are [`Reason::Outranked`].
///
/// Should the ranking reach two candidates with the same impl id and priority (which the registry
/// forbids), neither order could be justified, so both are rejected as
/// [`Rejection::DuplicateImplId`] rather than letting input order decide.
///
/// An exact impl id in the query rejects every other candidate in step 1, so that if the exact
/// one fails there is no fallback.
#[must_use = "a resolution is the only record of the choice and of why the others lost"]
pub fn resolve<'c>(
    query: &OpQuery<'_>,
    candidates: &'c [OpCandidate],
    negotiator: &dyn Negotiator,
) -> Resolution<'c> {
    let exact = query.spec().exact_impl;
    // One slot per candidate, filled as reasons are found, so that the verdicts come out in
    // candidate order without sorting them afterwards.
    let mut reasons: Vec<Option<Reason<'c>>> = vec![None; candidates.len()];
    let mut compatible: Vec<Ranked<'c>> = Vec::new();
    let mut considered = 0usize;
    let mut exact_present = false;
    let mut exact_elsewhere: Option<&OpName> = None;

    for (index, c) in candidates.iter().enumerate() {
        let is_exact = exact == Some(&c.impl_id);
        if c.op_name != query.op_name() {
            if is_exact && exact_elsewhere.is_none() {
                exact_elsewhere = Some(&c.op_name);
            }
            continue;
        }
        considered += 1;
        exact_present |= is_exact;
        match check_static(query, c) {
            Ok(()) => compatible.push(Ranked {
                index,
                candidate: c,
            }),
            Err(reason) => record(&mut reasons, index, Reason::Rejected(reason)),
        }
    }

    // Only the best-ranked acceptor matters and the outranked need no order among themselves,
    // so a heap (linear to build, logarithmic per refusal) does the work of a full sort, which
    // dominated the ranking benchmark.
    let mut ranking = BinaryHeap::from(compatible);
    let mut chosen = None;
    while let Some(best) = ranking.pop() {
        if ranking.peek().is_some_and(|next| *next == best) {
            let duplicate = || Reason::Rejected(Rejection::DuplicateImplId);
            while let Some(tied) = ranking.peek_mut().filter(|next| **next == best) {
                record(&mut reasons, PeekMut::pop(tied).index, duplicate());
            }
            record(&mut reasons, best.index, duplicate());
            continue;
        }
        match negotiate(query, best.index, best.candidate, negotiator) {
            Ok(scratch) => {
                chosen = Some((best, scratch));
                break;
            }
            Err(reason) => record(&mut reasons, best.index, Reason::Rejected(reason)),
        }
    }

    let outcome = match chosen {
        Some((best, scratch)) => {
            // The candidates ranked below the choice are not negotiated with at all. Their
            // callbacks are not free (each crosses into the provider's library and may inspect
            // every tensor, under the registry lock), and no answer they gave could change the
            // choice, which belongs to the best-ranked candidate that accepted.
            let by = &best.candidate.impl_id;
            for other in ranking.into_vec() {
                record(&mut reasons, other.index, Reason::Outranked { by });
            }
            Ok(Choice {
                index: best.index,
                impl_id: by.clone(),
                scratch,
            })
        }
        None => Err(failure_kind(
            exact,
            exact_present,
            exact_elsewhere,
            considered,
        )),
    };
    let verdicts = candidates
        .iter()
        .zip(reasons)
        .enumerate()
        .filter_map(|(index, (c, reason))| {
            reason.map(|reason| Verdict {
                index,
                impl_id: &c.impl_id,
                reason,
            })
        })
        .collect();
    Resolution {
        op_name: query.op_name().to_owned(),
        outcome,
        verdicts,
    }
}

/// The choice [`resolve`] would make, found without recording why the others lost: for callers
/// that only want the provider (a runner resolving on its hot path). On failure it says only
/// what failed; a caller that wants the report runs [`resolve`] for it.
///
/// `candidates` must be in rank order ([`rank_order`]) apart from candidates of other operations,
/// which may appear anywhere and are skipped, as in [`resolve`]. The registry keeps every
/// operation's candidates in that order, so that no ranking work is done per query: candidates
/// are visited best first, each statically checked just before its callbacks could run, and the
/// walk stops at the first one that accepts. The callbacks called, and their order, are exactly
/// those of [`resolve`] for the same input.
///
/// Inlined into its caller, whose choice is then read from registers (returned through
/// memory, it was read back with loads straddling the stores that wrote it: a stall per
/// resolution).
#[inline]
pub fn choose(
    query: &OpQuery<'_>,
    candidates: &[OpCandidate],
    negotiator: &dyn Negotiator,
) -> Result<(usize, ScratchRequest), FailureKind> {
    let exact = query.spec().exact_impl;
    let op_name = query.op_name();
    let mut considered = 0usize;
    let mut exact_present = false;
    let mut exact_elsewhere: Option<&OpName> = None;
    let mut index = 0;
    while index < candidates.len() {
        let c = &candidates[index];
        if c.op_name != op_name {
            if exact == Some(&c.impl_id) && exact_elsewhere.is_none() {
                exact_elsewhere = Some(&c.op_name);
            }
            index += 1;
            continue;
        }
        // The run of candidates that tie with this one in the ranking (in practice only
        // itself: the registry refuses duplicate impl ids). Ties among compatible candidates
        // are all rejected, as `resolve` does, whatever their order.
        let tied_end = candidates[index + 1..]
            .iter()
            .position(|next| next.op_name != op_name || rank_order(c, next) != Ordering::Equal)
            .map_or(candidates.len(), |p| index + 1 + p);
        let mut compatible = None;
        let mut ties = 0usize;
        for (i, t) in candidates.iter().enumerate().take(tied_end).skip(index) {
            considered += 1;
            exact_present |= exact == Some(&t.impl_id);
            if check_static(query, t).is_ok() {
                compatible = Some(i);
                ties += 1;
            }
        }
        if let (Some(i), 1) = (compatible, ties) {
            if let Ok(scratch) = negotiate(query, i, &candidates[i], negotiator) {
                return Ok((i, scratch));
            }
        }
        index = tied_end;
    }
    Err(failure_kind(
        exact,
        exact_present,
        exact_elsewhere,
        considered,
    ))
}

/// What failed when nothing was chosen: `considered` candidates of the operation, the exact id
/// asked for (if any), whether it was among them and which operation it implements otherwise.
fn failure_kind(
    exact: Option<&ImplId>,
    exact_present: bool,
    exact_elsewhere: Option<&OpName>,
    considered: usize,
) -> FailureKind {
    match exact {
        Some(id) if !exact_present => FailureKind::ExactImplAbsent {
            impl_id: id.clone(),
            registered_for: exact_elsewhere.cloned(),
        },
        Some(id) => FailureKind::ExactImplRejected {
            impl_id: id.clone(),
        },
        None if considered == 0 => FailureKind::NoCandidates,
        None => FailureKind::NoneCompatible,
    }
}

/// Files `reason` in the slot of candidate `index` (always in range: indices come from
/// enumerating the same slice the slots were sized for).
fn record<'c>(reasons: &mut [Option<Reason<'c>>], index: usize, reason: Reason<'c>) {
    if let Some(slot) = reasons.get_mut(index) {
        *slot = Some(reason);
    }
}

/// A candidate in the ranking heap, ordered so that the best-ranked is the greatest (the heap
/// pops its maximum). Equality means a tie in [`rank_order`]: same priority and impl id.
#[derive(Debug, Clone, Copy)]
struct Ranked<'c> {
    index: usize,
    candidate: &'c OpCandidate,
}

impl Ord for Ranked<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        rank_order(other.candidate, self.candidate)
    }
}

impl PartialOrd for Ranked<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked<'_> {}
