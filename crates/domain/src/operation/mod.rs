//! GOP1 operations in domain form, and the choice of a provider for an operation query.
//!
//! A provider registers [`OpCandidate`]s (its kernel descriptor plus GOP1 extension, converted by
//! the app); a caller asks with an [`OpQuery`] carrying its actual tensors. [`resolve`] rejects
//! what cannot work with cheap checks, ranks the rest by priority and impl id, and only then
//! negotiates through the [`Negotiator`] port, in rank order, until one provider accepts. Every
//! other candidate gets a verdict, so that a failure explains itself.
//!
//! Nothing here calls a provider directly: the C callbacks sit behind [`Negotiator`], which is
//! what keeps this module pure and testable with fakes.

mod contract;
mod resolve;
mod tensor;
mod values;

pub use contract::{
    Arity, CandidateError, DeviceCaps, OpCandidate, OpQuery, QueryError, QueryRef, QuerySpec,
};
pub use resolve::{
    check_budgets, check_static, check_tensor, choose, negotiate, rank_order, resolve, Choice,
    FailedCandidate, FailureKind, Negotiator, ProviderRefusal, Reason, Rejection, Resolution,
    ResolveFailure, ScratchRequest, Verdict,
};
pub use tensor::{TensorDesc, TensorError, TensorInfo, TensorRef, TensorRole};
pub use values::{
    Backend, BackendSet, Budget, BudgetKind, Capabilities, CpuIsa, DType, DTypeBlock, Layout,
    LayoutSet, MemorySpace, MemorySpaceSet, Numerics, SyncMode, SyncModeSet, MAX_TENSOR_RANK,
};
