//! The two sides of a GOP1 negotiation in domain form: what a provider declares
//! ([`OpCandidate`]) and what a caller asks for ([`OpQuery`]), each with its own validation.

use std::fmt;

use super::tensor::{TensorDesc, TensorError, TensorInfo, TensorRef, TensorRole};
use super::values::{
    Backend, BackendSet, Budget, Capabilities, CpuIsa, DType, Layout, LayoutSet, MemorySpace,
    MemorySpaceSet, Numerics, SyncMode, SyncModeSet, MAX_TENSOR_RANK,
};
use crate::ids::{ImplId, OpName, OpNameRef};
use crate::version::{OpVersionInterval, PackedVersion, VersionError};

/// An inclusive bound on how many input or output tensors a provider takes.
///
/// There is no "0 means unbounded" sentinel here, unlike the descriptor's dimension bounds: an
/// operation with no inputs (a generator) is legitimate, so 0 must mean 0. Use `u32::MAX` for no
/// upper bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arity {
    /// Fewest tensors accepted.
    pub min: u32,
    /// Most tensors accepted.
    pub max: u32,
}

impl Arity {
    /// `min..=max` tensors.
    pub const fn new(min: u32, max: u32) -> Self {
        Arity { min, max }
    }

    /// Exactly `n` tensors.
    pub const fn exactly(n: u32) -> Self {
        Arity { min: n, max: n }
    }

    /// Whether `count` tensors are accepted.
    pub fn admits(self, count: usize) -> bool {
        // A count beyond `u32::MAX` cannot come from the C ABI, and no bound admits it.
        u32::try_from(count).is_ok_and(|c| self.min <= c && c <= self.max)
    }
}

impl fmt::Display for Arity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "exactly {}", self.min)
        } else if self.max == u32::MAX {
            write!(f, "at least {}", self.min)
        } else {
            write!(f, "{}..={}", self.min, self.max)
        }
    }
}

/// A provider's side of the negotiation: one registered implementation of a namespaced
/// operation, as its kernel descriptor and GOP1 extension declare it.
///
/// The app builds these from the C structs at registration, where it should also call
/// [`OpCandidate::check`] and refuse a malformed descriptor; [`resolve`](super::resolve) repeats
/// that check so that a malformed candidate can never be chosen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OpCandidate {
    /// Globally unique implementation id; the final tie-break of the ranking.
    pub impl_id: ImplId,
    /// The namespaced operation this implements.
    pub op_name: OpName,
    /// The one backend it runs on.
    pub backend: Backend,
    /// Higher is preferred.
    pub priority: i32,
    /// Semantic version of the operation contract (not of the package).
    pub op_version: PackedVersion,
    /// Capability bits offered.
    pub capabilities: Capabilities,
    /// Numerical guarantees offered.
    pub numerics: Numerics,
    /// Dtype every input tensor must have; [`DType::ANY`] leaves it to the provider's validate.
    pub input_dtype: DType,
    /// Dtype every output tensor must have; [`DType::ANY`] leaves it to the provider's validate.
    pub output_dtype: DType,
    /// How many inputs it takes.
    pub inputs: Arity,
    /// How many outputs it takes.
    pub outputs: Arity,
    /// Layouts accepted (see [`LayoutSet::admits`]).
    pub layouts: LayoutSet,
    /// Memory spaces accepted.
    pub memory_spaces: MemorySpaceSet,
    /// Required alignment of every tensor's data address in bytes, a power of two; 0 and 1 both
    /// mean none.
    pub min_alignment: u64,
    /// Smallest rank accepted for every tensor.
    pub min_rank: u32,
    /// Largest rank accepted for every tensor.
    pub max_rank: u32,
    /// Largest extent of each axis (`max_dim[i]` bounds `dims[i]` of every tensor, as the kernel
    /// descriptor's `max_dim` array does); 0 leaves that axis unbounded.
    pub max_dim: [u64; MAX_TENSOR_RANK],
    /// Largest product of the outer extents of any tensor; 0 is unbounded.
    pub max_batch: u64,
    /// Sync modes supported.
    pub sync_modes: SyncModeSet,
    /// Lowest CUDA compute capability times ten (86 for 8.6); 0 is unbounded. CUDA only.
    pub min_sm: u32,
    /// Highest CUDA compute capability times ten; 0 is unbounded. CUDA only.
    pub max_sm: u32,
    /// CPU features the host must have. Checked for every backend, because a GPU provider's
    /// host-side code runs on the CPU too.
    pub cpu_isa: CpuIsa,
}

impl OpCandidate {
    /// Checks that the declaration is coherent on its own: every bound pair can be met, the
    /// alignment is a power of two, and each declared set names something.
    pub fn check(&self) -> Result<(), CandidateError> {
        let ranks_possible = self.max_rank != 0
            && self.min_rank <= self.max_rank
            && usize::try_from(self.min_rank).is_ok_and(|r| r <= MAX_TENSOR_RANK);
        if !ranks_possible {
            return Err(CandidateError::RankBounds {
                min: self.min_rank,
                max: self.max_rank,
            });
        }
        for (role, arity) in [
            (TensorRole::Input, self.inputs),
            (TensorRole::Output, self.outputs),
        ] {
            if arity.min > arity.max {
                return Err(CandidateError::ArityBounds {
                    role,
                    min: arity.min,
                    max: arity.max,
                });
            }
        }
        if self.min_alignment > 1 && !self.min_alignment.is_power_of_two() {
            return Err(CandidateError::Alignment {
                alignment: self.min_alignment,
            });
        }
        if self.min_sm != 0 && self.max_sm != 0 && self.min_sm > self.max_sm {
            return Err(CandidateError::SmBounds {
                min: self.min_sm,
                max: self.max_sm,
            });
        }
        if self.layouts.is_empty() {
            return Err(CandidateError::EmptySet { what: "layout" });
        }
        if self.memory_spaces.is_empty() {
            return Err(CandidateError::EmptySet {
                what: "memory space",
            });
        }
        if self.sync_modes.is_empty() {
            return Err(CandidateError::EmptySet { what: "sync mode" });
        }
        Ok(())
    }
}

/// Why a provider's declaration is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CandidateError {
    /// No rank from 1 to 8 satisfies `min_rank..=max_rank`.
    #[error("rank bounds {min}..={max} admit no rank in 1..=8")]
    RankBounds {
        /// The declared lower bound.
        min: u32,
        /// The declared upper bound.
        max: u32,
    },
    /// An arity has `min > max`.
    #[error("{role} arity bounds {min}..={max} are empty")]
    ArityBounds {
        /// Inputs or outputs.
        role: TensorRole,
        /// The declared lower bound.
        min: u32,
        /// The declared upper bound.
        max: u32,
    },
    /// The alignment is not a power of two.
    #[error("minimum alignment {alignment} is not a power of two")]
    Alignment {
        /// The declared alignment in bytes.
        alignment: u64,
    },
    /// Both SM bounds are set and `min_sm > max_sm`.
    #[error("cuda sm bounds {min}..={max} are empty")]
    SmBounds {
        /// The declared lowest compute capability.
        min: u32,
        /// The declared highest.
        max: u32,
    },
    /// A required set (layouts, memory spaces, sync modes) is empty.
    #[error("declares no {what}")]
    EmptySet {
        /// Which set.
        what: &'static str,
    },
}

/// What the caller knows about the device the operation will run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceCaps {
    /// The device selected for the call; device-memory tensors must live on it.
    pub device_id: i32,
    /// The CUDA compute capability times ten, or `None` when there is no CUDA device. CUDA
    /// candidates are refused when this is `None`, so the app must fill it whenever one exists.
    pub cuda_sm: Option<u32>,
    /// CPU features the host has.
    pub cpu_isa: CpuIsa,
}

/// The caller's side of the negotiation, as plain fields; [`OpQuery::new`] validates it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QuerySpec {
    /// The namespaced operation wanted.
    pub op_name: OpName,
    /// Lowest acceptable operation version, inclusive.
    pub min_version: PackedVersion,
    /// Highest acceptable operation version, inclusive; same major as `min_version`.
    pub max_version: PackedVersion,
    /// Backends the caller can run.
    pub backends: BackendSet,
    /// Capability bits every acceptable provider must offer.
    pub capabilities: Capabilities,
    /// Numerical guarantees every acceptable provider must offer.
    pub numerics: Numerics,
    /// How the call will be synchronised.
    pub sync_mode: SyncMode,
    /// The actual input tensors.
    pub inputs: Vec<TensorDesc>,
    /// The actual output tensors.
    pub outputs: Vec<TensorDesc>,
    /// Bound on host scratch.
    pub ram_budget: Budget,
    /// Bound on device scratch.
    pub vram_budget: Budget,
    /// When set, only this implementation may be chosen, with no fallback.
    pub exact_impl: Option<ImplId>,
    /// The device the call will run on.
    pub device: DeviceCaps,
}

impl QuerySpec {
    /// The query borrowed, as [`OpQuery::new`] takes it.
    #[inline]
    pub fn as_query_ref(&self) -> QueryRef<'_> {
        QueryRef {
            op_name: self.op_name.as_name_ref(),
            min_version: self.min_version,
            max_version: self.max_version,
            backends: self.backends,
            capabilities: self.capabilities,
            numerics: self.numerics,
            sync_mode: self.sync_mode,
            inputs: &self.inputs,
            outputs: &self.outputs,
            ram_budget: self.ram_budget,
            vram_budget: self.vram_budget,
            exact_impl: self.exact_impl.as_ref(),
            device: self.device,
        }
    }
}

impl<'a> From<&'a QuerySpec> for QueryRef<'a> {
    #[inline]
    fn from(spec: &'a QuerySpec) -> Self {
        spec.as_query_ref()
    }
}

/// The caller's side of the negotiation with its name and tensors borrowed: what a validated
/// [`OpQuery`] holds. A resolution reads its query once and keeps none of it but what the chosen
/// contract copies, so the caller's own text and arrays (a runner's [`QuerySpec`], a C caller's
/// strings) are used where they lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueryRef<'a> {
    /// The namespaced operation wanted.
    pub op_name: OpNameRef<'a>,
    /// Lowest acceptable operation version, inclusive.
    pub min_version: PackedVersion,
    /// Highest acceptable operation version, inclusive; same major as `min_version`.
    pub max_version: PackedVersion,
    /// Backends the caller can run.
    pub backends: BackendSet,
    /// Capability bits every acceptable provider must offer.
    pub capabilities: Capabilities,
    /// Numerical guarantees every acceptable provider must offer.
    pub numerics: Numerics,
    /// How the call will be synchronised.
    pub sync_mode: SyncMode,
    /// The actual input tensors.
    pub inputs: &'a [TensorDesc],
    /// The actual output tensors.
    pub outputs: &'a [TensorDesc],
    /// Bound on host scratch.
    pub ram_budget: Budget,
    /// Bound on device scratch.
    pub vram_budget: Budget,
    /// When set, only this implementation may be chosen, with no fallback.
    pub exact_impl: Option<&'a ImplId>,
    /// The device the call will run on.
    pub device: DeviceCaps,
}

impl QueryRef<'_> {
    /// An owned copy, for a caller that wants to change it and validate again.
    pub fn to_spec(&self) -> QuerySpec {
        QuerySpec {
            op_name: self.op_name.to_owned(),
            min_version: self.min_version,
            max_version: self.max_version,
            backends: self.backends,
            capabilities: self.capabilities,
            numerics: self.numerics,
            sync_mode: self.sync_mode,
            inputs: self.inputs.to_vec(),
            outputs: self.outputs.to_vec(),
            ram_budget: self.ram_budget,
            vram_budget: self.vram_budget,
            exact_impl: self.exact_impl.cloned(),
            device: self.device,
        }
    }
}

/// A validated operation query: every tensor checked, the version interval built, and the facts
/// the ranking needs computed once. It borrows the caller's name and tensors ([`QueryRef`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpQuery<'a> {
    spec: QueryRef<'a>,
    versions: OpVersionInterval,
    /// The facts of the inputs, then of the outputs.
    infos: Infos,
}

/// How many tensors' facts a query keeps without an allocation: as many as nearly every
/// operation has (a resolution is on a runner's path, and each allocation shows in its cost).
const INLINE_INFOS: usize = 4;

/// The facts of a query's tensors, inputs then outputs: in place when there are at most
/// [`INLINE_INFOS`] of them, else in one allocation.
#[derive(Debug, Clone)]
enum Infos {
    Inline {
        len: usize,
        items: [TensorInfo; INLINE_INFOS],
    },
    Heap(Vec<TensorInfo>),
}

impl Infos {
    /// Room for `n` facts.
    fn with_capacity(n: usize) -> Self {
        if n <= INLINE_INFOS {
            let none = TensorInfo {
                layout: Layout::Contiguous,
                elements: 0,
                batch: 0,
                byte_extent: 0,
            };
            Infos::Inline {
                len: 0,
                items: [none; INLINE_INFOS],
            }
        } else {
            Infos::Heap(Vec::with_capacity(n))
        }
    }

    /// Appends `info`, moving the facts to the heap should there be more than the room
    /// asked for.
    #[inline]
    fn push(&mut self, info: TensorInfo) {
        match self {
            Infos::Inline { len, items } if *len < INLINE_INFOS => {
                items[*len] = info;
                *len += 1;
            }
            Infos::Inline { .. } => {
                let mut all = self.as_slice().to_vec();
                all.push(info);
                *self = Infos::Heap(all);
            }
            Infos::Heap(all) => all.push(info),
        }
    }

    fn as_slice(&self) -> &[TensorInfo] {
        match self {
            Infos::Inline { len, items } => &items[..*len],
            Infos::Heap(all) => all,
        }
    }
}

impl PartialEq for Infos {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Infos {}

impl<'a> OpQuery<'a> {
    /// Validates `spec` (a [`QueryRef`], or a `&QuerySpec`): a non-empty set of known backends,
    /// a same-major version interval, every tensor valid on its own, and every device-memory
    /// tensor on the query's device.
    ///
    /// The device check lives here rather than among candidate rejections because it does not
    /// depend on any provider: such a query is wrong whoever answers it.
    ///
    /// Inlined, so that a caller's query is read where the caller wrote it rather than copied
    /// in (the copy's wide loads straddled the caller's narrower stores, a stall per
    /// resolution).
    #[inline]
    pub fn new(spec: impl Into<QueryRef<'a>>) -> Result<Self, QueryError> {
        let spec = spec.into();
        let unknown = spec.backends.unknown();
        if !unknown.is_empty() {
            return Err(QueryError::UnknownBackendBits {
                bits: unknown.bits(),
            });
        }
        if spec.backends.is_empty() {
            return Err(QueryError::NoBackends);
        }
        let versions = OpVersionInterval::new(spec.min_version, spec.max_version)
            .map_err(QueryError::VersionInterval)?;
        let mut infos = Infos::with_capacity(spec.inputs.len() + spec.outputs.len());
        check_tensors(TensorRole::Input, spec.inputs, &spec.device, &mut infos)?;
        check_tensors(TensorRole::Output, spec.outputs, &spec.device, &mut infos)?;
        Ok(OpQuery {
            spec,
            versions,
            infos,
        })
    }

    /// The query as given.
    pub fn spec(&self) -> &QueryRef<'a> {
        &self.spec
    }

    /// The operation name wanted.
    pub fn op_name(&self) -> OpNameRef<'a> {
        self.spec.op_name
    }

    /// The accepted operation versions.
    pub fn versions(&self) -> OpVersionInterval {
        self.versions
    }

    /// The facts computed for each input, in order.
    pub fn input_infos(&self) -> &[TensorInfo] {
        &self.infos.as_slice()[..self.spec.inputs.len()]
    }

    /// The facts computed for each output, in order.
    pub fn output_infos(&self) -> &[TensorInfo] {
        &self.infos.as_slice()[self.spec.inputs.len()..]
    }

    /// The facts computed for each tensor, inputs then outputs.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        self.infos.as_slice()
    }
}

/// Checks each tensor of one role and appends its facts to `infos`.
#[inline]
fn check_tensors(
    role: TensorRole,
    tensors: &[TensorDesc],
    device: &DeviceCaps,
    infos: &mut Infos,
) -> Result<(), QueryError> {
    for (index, t) in tensors.iter().enumerate() {
        let tensor = TensorRef { role, index };
        let info = t
            .check()
            .map_err(|error| QueryError::Tensor { tensor, error })?;
        if t.memory_space == MemorySpace::Device && t.device_id != device.device_id {
            return Err(QueryError::DeviceMismatch {
                tensor,
                tensor_device: t.device_id,
                query_device: device.device_id,
            });
        }
        infos.push(info);
    }
    Ok(())
}

/// Why a query is invalid, whatever providers exist.
///
/// Each message carries its cause inline (no `source` chain) so that one `Display` fills a C
/// error buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The backend set is empty.
    #[error("the query permits no backend")]
    NoBackends,
    /// The backend set has bits this host does not know.
    #[error("the query's backend set has unknown bits {bits:#x}")]
    UnknownBackendBits {
        /// The unknown bits.
        bits: u32,
    },
    /// The version interval is empty or spans two majors.
    #[error("the query's version interval is invalid: {0}")]
    VersionInterval(VersionError),
    /// A tensor is invalid on its own.
    #[error("{tensor} is invalid: {error}")]
    Tensor {
        /// Which tensor.
        tensor: TensorRef,
        /// What is wrong with it.
        error: TensorError,
    },
    /// A device-memory tensor lives on another device than the query's.
    #[error(
        "{tensor} lives on device {tensor_device} but the query runs on device {query_device}"
    )]
    DeviceMismatch {
        /// Which tensor.
        tensor: TensorRef,
        /// The device the tensor names.
        tensor_device: i32,
        /// The device the query runs on.
        query_device: i32,
    },
}
