//! A runner's model description as the host keeps it: copied out of the runner's
//! `guild_runner_model_v1_t` (strings and role records included) and checked against the
//! execution contract the host supports.
//!
//! # The supported contract
//!
//! A description is accepted only when all of the following hold; the first rule broken is
//! reported as a [`DescriptionError`].
//!
//! 1. The record is well formed: `struct_size` and `version` are still what the host set,
//!    `architecture` is non-empty UTF-8 terminated inside its 64 bytes, `tensor_roles` is
//!    non-NULL when `tensor_role_count` is not zero, the count is at most [`MAX_TENSOR_ROLES`],
//!    each role's name is UTF-8 terminated within [`MAX_TENSOR_NAME`] bytes, each role's
//!    `reserved` is zero and its `flags` hold no bit but `GUILD_TENSOR_ROLE_FLAG_OPTIONAL`.
//! 2. Enumerations hold known values: `rope_type` a `GUILD_ROPE_TYPE_*`, `rope_scaling_type` a
//!    `GUILD_ROPE_SCALING_*`, `prefill_strategy` a `GUILD_PREFILL_*`; the chunked strategy
//!    names a chunk size.
//! 3. Canonical tensor roles: every role is one of `GUILD_TENSOR_ROLE_*` (not `UNKNOWN`); the
//!    model-wide roles (`TOKEN_EMBD`, `OUTPUT_NORM`, `OUTPUT`, the three `PLE_*`) have layer -1;
//!    every other role has a layer in `0..n_layers`, except `ROPE_FREQS`, which may be either;
//!    no (role, layer) pair appears twice; and every role's tensor exists in the model unless
//!    the role is optional. An optional role whose tensor is absent is kept, marked absent.
//! 4. `n_layers` is at least 1 and `TOKEN_EMBD` is present.
//! 5. Periodic hybrid topology. With `full_attention_interval` = `k`, layer `i` is an attention
//!    layer when `k == 0` or `(i + 1) % k == 0`, and a recurrent layer otherwise; `k` may not
//!    exceed `n_layers` (such a model would have no attention layer at all, which is not a
//!    hybrid). Then, counting only roles whose tensor is present:
//!    - an attention layer has `ATTN_OUTPUT` and either `ATTN_QKV` or all of `ATTN_Q`, `ATTN_K`
//!      and `ATTN_V`, and no `SSM_*` role;
//!    - a recurrent layer has `SSM_IN`, `SSM_CONV1D` and `SSM_OUT`, and none of the
//!      attention-only roles (`ATTN_Q`, `ATTN_K`, `ATTN_V`, `ATTN_QKV`, `ATTN_OUTPUT`,
//!      `ATTN_Q_NORM`, `ATTN_K_NORM`, `ATTN_GATE`);
//!    - the layer norms (`ATTN_NORM`, `POST_ATTN_NORM`) and the feed-forward roles (`FFN_*`)
//!      may appear on either kind;
//!    - when there is a recurrent layer, the recurrent geometry the host sizes state by
//!      (`ssm_conv_kernel`, `ssm_state_size`, `ssm_inner_size`) is not zero.
//!
//! Everything numerical beyond this (dtypes, divisibility, value ranges) is the runner's own
//! `validate_numerics`, which runs after these checks pass.

use std::collections::HashSet;
use std::ffi::c_char;
use std::fmt;
use std::ptr;

use guild_abi::text::bounded_str;
use guild_abi::{
    guild_runner_model_v1_t, guild_tensor_role_v1_t, GUILD_PREFILL_CHUNKED,
    GUILD_RUNNER_ARCH_CAPACITY, GUILD_RUNNER_MODEL_VERSION, GUILD_TENSOR_ROLE_FLAG_OPTIONAL,
};
use guild_ports::model::ModelFile;

/// The most role records a description may carry. A large model maps a few thousand tensors;
/// the bound caps what a corrupt count can make the host read.
pub const MAX_TENSOR_ROLES: usize = 1 << 16;

/// The longest tensor name, in bytes without the terminator, read from a role record.
pub const MAX_TENSOR_NAME: usize = 1024;

/// Where a role may appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleScope {
    /// Only model-wide (layer -1).
    Model,
    /// Only on a layer.
    Layer,
    /// Model-wide or on a layer.
    Either,
}

/// Which layers of a hybrid a layer role belongs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Affinity {
    Any,
    Attention,
    Recurrent,
}

macro_rules! roles {
    ($($variant:ident = $value:literal, $name:literal, $scope:ident, $affinity:ident, $doc:literal;)*) => {
        /// A canonical tensor role (`GUILD_TENSOR_ROLE_*`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum TensorRoleKind {
            $(#[doc = $doc] $variant = $value,)*
        }

        impl TensorRoleKind {
            /// The role with this `GUILD_TENSOR_ROLE_*` number; `None` for `UNKNOWN` (0) and
            /// numbers this host does not know.
            pub fn from_raw(raw: u32) -> Option<Self> {
                match raw {
                    $($value => Some(TensorRoleKind::$variant),)*
                    _ => None,
                }
            }

            /// The role's `GUILD_TENSOR_ROLE_*` number.
            pub fn raw(self) -> u32 {
                self as u32
            }

            /// The role's name without the `GUILD_TENSOR_ROLE_` prefix, for messages.
            pub fn name(self) -> &'static str {
                match self {
                    $(TensorRoleKind::$variant => $name,)*
                }
            }

            /// Whether the role is model-wide, per layer, or either.
            pub fn scope(self) -> RoleScope {
                match self {
                    $(TensorRoleKind::$variant => RoleScope::$scope,)*
                }
            }

            fn affinity(self) -> Affinity {
                match self {
                    $(TensorRoleKind::$variant => Affinity::$affinity,)*
                }
            }
        }
    };
}

roles! {
    TokenEmbd = 1, "TOKEN_EMBD", Model, Any, "The token embedding table.";
    OutputNorm = 2, "OUTPUT_NORM", Model, Any, "The norm before the output projection.";
    Output = 3, "OUTPUT", Model, Any, "The output (unembedding) projection.";
    AttnNorm = 4, "ATTN_NORM", Layer, Any, "A layer's input norm.";
    AttnQ = 5, "ATTN_Q", Layer, Attention, "Attention query projection.";
    AttnK = 6, "ATTN_K", Layer, Attention, "Attention key projection.";
    AttnV = 7, "ATTN_V", Layer, Attention, "Attention value projection.";
    AttnQkv = 8, "ATTN_QKV", Layer, Attention, "Fused query, key and value projection.";
    AttnOutput = 9, "ATTN_OUTPUT", Layer, Attention, "Attention output projection.";
    AttnQNorm = 10, "ATTN_Q_NORM", Layer, Attention, "Per-head query norm.";
    AttnKNorm = 11, "ATTN_K_NORM", Layer, Attention, "Per-head key norm.";
    AttnGate = 12, "ATTN_GATE", Layer, Attention, "Attention output gate.";
    PostAttnNorm = 13, "POST_ATTN_NORM", Layer, Any, "The norm after the mixer.";
    FfnNorm = 14, "FFN_NORM", Layer, Any, "The feed-forward input norm.";
    FfnGate = 15, "FFN_GATE", Layer, Any, "Dense feed-forward gate projection.";
    FfnUp = 16, "FFN_UP", Layer, Any, "Dense feed-forward up projection.";
    FfnDown = 17, "FFN_DOWN", Layer, Any, "Dense feed-forward down projection.";
    FfnRouter = 18, "FFN_ROUTER", Layer, Any, "Expert router.";
    FfnGateExps = 19, "FFN_GATE_EXPS", Layer, Any, "Stacked expert gate projections.";
    FfnUpExps = 20, "FFN_UP_EXPS", Layer, Any, "Stacked expert up projections.";
    FfnDownExps = 21, "FFN_DOWN_EXPS", Layer, Any, "Stacked expert down projections.";
    FfnGateShexp = 22, "FFN_GATE_SHEXP", Layer, Any, "Shared expert gate projection.";
    FfnUpShexp = 23, "FFN_UP_SHEXP", Layer, Any, "Shared expert up projection.";
    FfnDownShexp = 24, "FFN_DOWN_SHEXP", Layer, Any, "Shared expert down projection.";
    FfnRouterShexp = 25, "FFN_ROUTER_SHEXP", Layer, Any, "Shared expert gate (router) input.";
    SsmIn = 26, "SSM_IN", Layer, Recurrent, "Recurrent input projection.";
    SsmConv1d = 27, "SSM_CONV1D", Layer, Recurrent, "Recurrent short convolution.";
    SsmA = 28, "SSM_A", Layer, Recurrent, "Recurrent state decay.";
    SsmDtBias = 29, "SSM_DT_BIAS", Layer, Recurrent, "Recurrent time-step bias.";
    SsmBetaAlpha = 30, "SSM_BETA_ALPHA", Layer, Recurrent, "Recurrent beta/alpha projection.";
    SsmNorm = 31, "SSM_NORM", Layer, Recurrent, "Recurrent output norm.";
    SsmOut = 32, "SSM_OUT", Layer, Recurrent, "Recurrent output projection.";
    PleTokenEmbd = 33, "PLE_TOKEN_EMBD", Model, Any, "Per-layer embedding table.";
    PleModelProj = 34, "PLE_MODEL_PROJ", Model, Any, "Per-layer embedding model projection.";
    PleProjNorm = 35, "PLE_PROJ_NORM", Model, Any, "Per-layer embedding projection norm.";
    RopeFreqs = 36, "ROPE_FREQS", Either, Any, "Rotary frequency factors.";
}

impl fmt::Display for TensorRoleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a layer of the periodic hybrid topology is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Full attention.
    Attention,
    /// Recurrent (state-space) mixing.
    Recurrent,
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayerKind::Attention => "attention",
            LayerKind::Recurrent => "recurrent",
        })
    }
}

/// The kind of layer `layer` under a `full_attention_interval` of `interval`.
pub fn layer_kind(interval: u32, layer: u32) -> LayerKind {
    if interval == 0 || (u64::from(layer) + 1).is_multiple_of(u64::from(interval)) {
        LayerKind::Attention
    } else {
        LayerKind::Recurrent
    }
}

/// One canonical role mapped to a tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRole {
    /// The role.
    pub role: TensorRoleKind,
    /// The layer, or `None` for a model-wide tensor.
    pub layer: Option<u32>,
    /// The tensor's name in the model file.
    pub name: String,
    /// Whether the runner marked the role optional.
    pub optional: bool,
    /// The tensor's position in [`ModelFile::tensors`]; `None` only for an optional role whose
    /// tensor the model lacks.
    pub tensor: Option<usize>,
}

/// Declares [`ModelDescription`] with the scalar fields of `guild_runner_model_v1_t`, each named
/// once here, and the copy of those fields out of a record, so that the two cannot drift apart.
macro_rules! model_description {
    ($($field:ident: $ty:ty,)*) => {
        /// A model as its runner described it, copied and checked by the host. The fields mirror
        /// `guild_runner_model_v1_t` (see `runner_abi.h` for each one's meaning).
        #[derive(Debug, Clone, PartialEq)]
        #[allow(missing_docs)] // Each field is the C record's field of the same name.
        pub struct ModelDescription {
            pub architecture: String,
            $(pub $field: $ty,)*
            /// The canonical roles, in the runner's order.
            pub roles: Vec<TensorRole>,
        }

        impl ModelDescription {
            /// The description of `record`, whose architecture and roles were read and checked
            /// already: every other field as the record holds it.
            fn from_record(
                record: &guild_runner_model_v1_t,
                architecture: String,
                roles: Vec<TensorRole>,
            ) -> Self {
                ModelDescription {
                    architecture,
                    $($field: record.$field,)*
                    roles,
                }
            }
        }
    };
}

model_description! {
    n_layers: u32,
    n_embd: u32,
    n_ff: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    head_dim_v: u32,
    vocab_size: u32,
    context_length: u32,
    norm_eps: f32,
    ssm_conv_kernel: u32,
    ssm_state_size: u32,
    ssm_group_count: u32,
    ssm_time_step_rank: u32,
    ssm_inner_size: u32,
    full_attention_interval: u32,
    n_experts: u32,
    n_experts_used: u32,
    expert_ffn: u32,
    shared_expert_ffn: u32,
    rope_type: u32,
    rope_dims: u32,
    rope_scaling_type: u32,
    rope_freq_base: f32,
    rope_freq_scale: f32,
    rope_orig_context: u32,
    ple_required: u32,
    ple_dim: u32,
    prefill_strategy: u32,
    prefill_chunk_tokens: u32,
}

impl ModelDescription {
    /// The kind of layer `layer` in this model's topology.
    pub fn layer_kind(&self, layer: u32) -> LayerKind {
        layer_kind(self.full_attention_interval, layer)
    }

    /// The mapping of `role` on `layer` (`None` for model-wide), if the runner gave one.
    pub fn role(&self, role: TensorRoleKind, layer: Option<u32>) -> Option<&TensorRole> {
        self.roles
            .iter()
            .find(|r| r.role == role && r.layer == layer)
    }
}

/// Why a description is outside the contract the host supports (see the module documentation
/// for the rules, in the order they are checked).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptionError {
    /// The runner changed `struct_size` or `version`, which the host sets.
    #[error("the runner rewrote the record's {field} (the host set {expected}, it holds {found})")]
    HeaderChanged {
        /// `struct_size` or `version`.
        field: &'static str,
        /// What the host set.
        expected: u32,
        /// What the record holds.
        found: u32,
    },
    /// `architecture` has no NUL inside its buffer, is not UTF-8, or is empty.
    #[error("architecture {0}")]
    Architecture(&'static str),
    /// `tensor_role_count` is above [`MAX_TENSOR_ROLES`].
    #[error("{count} tensor roles is more than the {max} a description may carry")]
    TooManyRoles {
        /// The count.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// `tensor_roles` is NULL while the count is not zero.
    #[error("tensor_roles is NULL but tensor_role_count is {0}")]
    RolesMissing(usize),
    /// A role's name is NULL, unterminated within [`MAX_TENSOR_NAME`] bytes, or not UTF-8.
    #[error("tensor role {index}: its name {problem}")]
    RoleName {
        /// Position in `tensor_roles`.
        index: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// A role's `reserved` field is not zero, or its flags hold an unknown bit.
    #[error("tensor role {index}: {problem}")]
    RoleRecord {
        /// Position in `tensor_roles`.
        index: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// An enumeration holds a value this host does not know.
    #[error("{field} is {value}, which is not a value this host knows")]
    UnknownValue {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// `prefill_strategy` is `GUILD_PREFILL_CHUNKED` with `prefill_chunk_tokens` 0.
    #[error("prefill_strategy is chunked but prefill_chunk_tokens is 0")]
    ChunkedWithoutSize,
    /// `n_layers` is 0.
    #[error("n_layers is 0")]
    NoLayers,
    /// A role number outside the canonical roles (or `UNKNOWN`).
    #[error("tensor role {index} ({name}) has role number {role}, which is not a canonical role")]
    UnknownRole {
        /// Position in `tensor_roles`.
        index: usize,
        /// The raw role number.
        role: u32,
        /// The tensor it names.
        name: String,
    },
    /// A role on a layer where it may not be: a model-wide role with a layer, a layer role with
    /// layer -1, or a layer at or past `n_layers`.
    #[error("{role} on layer {layer} ({name}): {problem}")]
    RoleScope {
        /// The role.
        role: TensorRoleKind,
        /// The raw layer the runner gave.
        layer: i32,
        /// The tensor it names.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The same role on the same layer twice.
    #[error("{role} is mapped twice on {}", layer_text(.layer))]
    DuplicateRole {
        /// The role.
        role: TensorRoleKind,
        /// The layer, `None` for model-wide.
        layer: Option<u32>,
    },
    /// A non-optional role names a tensor the model does not have.
    #[error("{role} on {} names tensor {name}, which the model does not have", layer_text(.layer))]
    MissingTensor {
        /// The role.
        role: TensorRoleKind,
        /// The layer, `None` for model-wide.
        layer: Option<u32>,
        /// The tensor name.
        name: String,
    },
    /// A role the contract requires is not mapped (or is optional and absent).
    #[error("{} has no {role}{}", layer_text(.layer), alternative_text(.alternative))]
    MissingRole {
        /// The role.
        role: TensorRoleKind,
        /// The layer, `None` for model-wide.
        layer: Option<u32>,
        /// A role that would have stood in for it, when there is one (`ATTN_QKV` for a
        /// separate projection).
        alternative: Option<TensorRoleKind>,
    },
    /// `full_attention_interval` is larger than `n_layers`, so no layer would use attention.
    #[error(
        "full_attention_interval {interval} exceeds n_layers {n_layers}: no layer would use \
         attention, which is not a periodic hybrid"
    )]
    IntervalBeyondLayers {
        /// The interval.
        interval: u32,
        /// The layer count.
        n_layers: u32,
    },
    /// A role that belongs to the other kind of layer.
    #[error("{role} is mapped on layer {layer}, which is a {kind} layer")]
    RoleOnWrongLayer {
        /// The role.
        role: TensorRoleKind,
        /// The layer.
        layer: u32,
        /// What the topology makes that layer.
        kind: LayerKind,
    },
    /// The model has recurrent layers but a recurrent dimension is 0.
    #[error("the model has recurrent layers but {field} is 0")]
    RecurrentGeometry {
        /// The field.
        field: &'static str,
    },
}

fn layer_text(layer: &Option<u32>) -> String {
    match layer {
        Some(l) => format!("layer {l}"),
        None => "the model".to_owned(),
    }
}

fn alternative_text(alternative: &Option<TensorRoleKind>) -> String {
    alternative
        .map(|a| format!(" (nor {a})"))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Copying the runner's record
// ---------------------------------------------------------------------------------------------

/// Copies and checks a description record exactly as selection does after `describe`: the
/// record is copied (strings and role records included) and then checked against the contract
/// and `model`'s tensors. For native code that builds a record itself, and for tests.
///
/// # Safety
/// `record.tensor_roles` must be NULL or point at `record.tensor_role_count` readable role
/// records whose names are NULL or NUL-terminated strings, all valid and unchanged for this
/// call.
pub unsafe fn check_record(
    record: &guild_runner_model_v1_t,
    model: &dyn ModelFile,
) -> Result<ModelDescription, DescriptionError> {
    // SAFETY: forwarded from this function's contract.
    unsafe { CopiedRecord::copy(record) }.check(model)
}

/// One role record as read from the runner, before the contract checks.
#[derive(Debug, Clone)]
struct RawRole {
    role: u32,
    layer: i32,
    name: String,
    flags: u32,
    reserved: u32,
}

/// The runner's record, copied: its scalar fields and its roles with their names. Nothing in it
/// points into the runner any more.
#[derive(Debug, Clone)]
pub(crate) struct CopiedRecord {
    fields: guild_runner_model_v1_t,
    architecture: Result<String, &'static str>,
    roles: Result<Vec<RawRole>, DescriptionError>,
}

// SAFETY: `fields` holds the runner's `tensor_roles` pointer only as an inert copy: it is never
// read through (the roles were copied into `roles` before this value existed) and is
// overwritten before the record is handed to anything.
unsafe impl Send for CopiedRecord {}

impl CopiedRecord {
    /// Copies what `describe` wrote into `record`, strings and role records included, so that
    /// nothing is read from the runner after this returns.
    ///
    /// # Safety
    /// `record.tensor_roles` must be NULL or point at `record.tensor_role_count` readable role
    /// records whose names are NULL or NUL-terminated strings, all valid and unchanged for
    /// this call; the runner promises this for as long as its extension is not called again.
    pub(crate) unsafe fn copy(record: &guild_runner_model_v1_t) -> Self {
        let architecture = architecture(&record.architecture);
        // SAFETY: forwarded from this function's contract.
        let roles = unsafe { copy_roles(record.tensor_roles, record.tensor_role_count) };
        let mut fields = *record;
        fields.tensor_roles = ptr::null();
        fields.tensor_role_count = 0;
        CopiedRecord {
            fields,
            architecture,
            roles,
        }
    }

    /// Checks the copy against the contract and `model`'s tensors.
    pub(crate) fn check(
        &self,
        model: &dyn ModelFile,
    ) -> Result<ModelDescription, DescriptionError> {
        let f = &self.fields;
        for (field, expected, found) in [
            (
                "struct_size",
                size_of::<guild_runner_model_v1_t>() as u32,
                f.struct_size,
            ),
            ("version", GUILD_RUNNER_MODEL_VERSION, f.version),
        ] {
            if expected != found {
                return Err(DescriptionError::HeaderChanged {
                    field,
                    expected,
                    found,
                });
            }
        }
        let architecture = self
            .architecture
            .clone()
            .map_err(DescriptionError::Architecture)?;
        let raw_roles = self.roles.clone()?;
        for (field, value, max) in [
            ("rope_type", f.rope_type, guild_abi::GUILD_ROPE_TYPE_MROPE),
            (
                "rope_scaling_type",
                f.rope_scaling_type,
                guild_abi::GUILD_ROPE_SCALING_LONGROPE,
            ),
            (
                "prefill_strategy",
                f.prefill_strategy,
                GUILD_PREFILL_CHUNKED,
            ),
        ] {
            if value > max {
                return Err(DescriptionError::UnknownValue { field, value });
            }
        }
        if f.prefill_strategy == GUILD_PREFILL_CHUNKED && f.prefill_chunk_tokens == 0 {
            return Err(DescriptionError::ChunkedWithoutSize);
        }
        if f.n_layers == 0 {
            return Err(DescriptionError::NoLayers);
        }
        let roles = check_roles(raw_roles, f.n_layers, model)?;
        let description = ModelDescription::from_record(f, architecture, roles);
        check_topology(&description)?;
        Ok(description)
    }

    /// The C record as the host keeps it: the runner's scalar fields with the role pointer
    /// rewritten to `roles` (host memory).
    pub(crate) fn c_record(&self, roles: &[guild_tensor_role_v1_t]) -> guild_runner_model_v1_t {
        let mut record = self.fields;
        record.tensor_roles = roles.as_ptr();
        record.tensor_role_count = roles.len();
        record
    }
}

fn architecture(buffer: &[c_char; GUILD_RUNNER_ARCH_CAPACITY]) -> Result<String, &'static str> {
    let bytes: Vec<u8> = buffer.iter().map(|&c| c as u8).collect();
    let end = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or("has no NUL within its 64 bytes")?;
    let text = std::str::from_utf8(&bytes[..end]).map_err(|_| "is not UTF-8")?;
    if text.is_empty() {
        return Err("is empty");
    }
    Ok(text.to_owned())
}

/// Reads `count` role records and their names.
///
/// # Safety
/// As for [`CopiedRecord::copy`].
unsafe fn copy_roles(
    roles: *const guild_tensor_role_v1_t,
    count: usize,
) -> Result<Vec<RawRole>, DescriptionError> {
    if count > MAX_TENSOR_ROLES {
        return Err(DescriptionError::TooManyRoles {
            count,
            max: MAX_TENSOR_ROLES,
        });
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    if roles.is_null() {
        return Err(DescriptionError::RolesMissing(count));
    }
    let mut out = Vec::with_capacity(count);
    for index in 0..count {
        // SAFETY: index < count, and the runner made `count` records readable.
        let raw = unsafe { roles.add(index).read_unaligned() };
        // SAFETY: per the contract the name is NULL or a NUL-terminated string.
        let name = unsafe { bounded_str(raw.name, MAX_TENSOR_NAME) }.map_err(|e| {
            DescriptionError::RoleName {
                index,
                problem: e.to_string(),
            }
        })?;
        out.push(RawRole {
            role: raw.role,
            layer: raw.layer,
            name: name.to_owned(),
            flags: raw.flags,
            reserved: raw.reserved,
        });
    }
    Ok(out)
}

/// Rule 3 of the contract, and `TOKEN_EMBD` from rule 4.
fn check_roles(
    raw_roles: Vec<RawRole>,
    n_layers: u32,
    model: &dyn ModelFile,
) -> Result<Vec<TensorRole>, DescriptionError> {
    let tensors = model.tensors();
    let mut seen = HashSet::new();
    let mut roles = Vec::with_capacity(raw_roles.len());
    for (index, raw) in raw_roles.into_iter().enumerate() {
        if raw.reserved != 0 {
            return Err(DescriptionError::RoleRecord {
                index,
                problem: format!("reserved is {}, not 0", raw.reserved),
            });
        }
        if raw.flags & !GUILD_TENSOR_ROLE_FLAG_OPTIONAL != 0 {
            return Err(DescriptionError::RoleRecord {
                index,
                problem: format!("flags {:#x} hold a bit this host does not know", raw.flags),
            });
        }
        let Some(role) = TensorRoleKind::from_raw(raw.role) else {
            return Err(DescriptionError::UnknownRole {
                index,
                role: raw.role,
                name: raw.name,
            });
        };
        let scope_error = |problem: &str| DescriptionError::RoleScope {
            role,
            layer: raw.layer,
            name: raw.name.clone(),
            problem: problem.to_owned(),
        };
        let layer = match (role.scope(), raw.layer) {
            (RoleScope::Model | RoleScope::Either, -1) => None,
            (RoleScope::Layer, -1) => {
                return Err(scope_error("a per-layer role needs a layer"));
            }
            (RoleScope::Model, _) => {
                return Err(scope_error("a model-wide role takes layer -1"));
            }
            (_, l) => match u32::try_from(l) {
                Ok(l) if l < n_layers => Some(l),
                _ => {
                    return Err(scope_error(&format!(
                        "layers run from 0 to {}",
                        n_layers - 1
                    )));
                }
            },
        };
        if !seen.insert((role, layer)) {
            return Err(DescriptionError::DuplicateRole { role, layer });
        }
        let optional = raw.flags & GUILD_TENSOR_ROLE_FLAG_OPTIONAL != 0;
        let tensor = tensors.iter().position(|t| t.name == raw.name);
        if tensor.is_none() && !optional {
            return Err(DescriptionError::MissingTensor {
                role,
                layer,
                name: raw.name,
            });
        }
        roles.push(TensorRole {
            role,
            layer,
            name: raw.name,
            optional,
            tensor,
        });
    }
    let present = |role| {
        roles
            .iter()
            .any(|r| r.role == role && r.layer.is_none() && r.tensor.is_some())
    };
    if !present(TensorRoleKind::TokenEmbd) {
        return Err(DescriptionError::MissingRole {
            role: TensorRoleKind::TokenEmbd,
            layer: None,
            alternative: None,
        });
    }
    Ok(roles)
}

/// Rule 5 of the contract.
fn check_topology(d: &ModelDescription) -> Result<(), DescriptionError> {
    use TensorRoleKind as R;
    let interval = d.full_attention_interval;
    if interval > d.n_layers {
        return Err(DescriptionError::IntervalBeyondLayers {
            interval,
            n_layers: d.n_layers,
        });
    }
    // Present roles per layer; model-wide roles are not part of the topology.
    let mut per_layer: Vec<Vec<TensorRoleKind>> = vec![Vec::new(); d.n_layers as usize];
    for r in &d.roles {
        if let (Some(layer), Some(_)) = (r.layer, r.tensor) {
            per_layer[layer as usize].push(r.role);
        }
    }
    let mut recurrent = false;
    for (layer, present) in per_layer.iter().enumerate() {
        let layer = layer as u32;
        let kind = layer_kind(interval, layer);
        let has = |role| present.contains(&role);
        let missing = |role, alternative| DescriptionError::MissingRole {
            role,
            layer: Some(layer),
            alternative,
        };
        let foreign = match kind {
            LayerKind::Attention => Affinity::Recurrent,
            LayerKind::Recurrent => Affinity::Attention,
        };
        if let Some(&role) = present.iter().find(|r| r.affinity() == foreign) {
            return Err(DescriptionError::RoleOnWrongLayer { role, layer, kind });
        }
        match kind {
            LayerKind::Attention => {
                if !has(R::AttnQkv) {
                    if let Some(&role) = [R::AttnQ, R::AttnK, R::AttnV].iter().find(|&&r| !has(r)) {
                        return Err(missing(role, Some(R::AttnQkv)));
                    }
                }
                if !has(R::AttnOutput) {
                    return Err(missing(R::AttnOutput, None));
                }
            }
            LayerKind::Recurrent => {
                recurrent = true;
                for role in [R::SsmIn, R::SsmConv1d, R::SsmOut] {
                    if !has(role) {
                        return Err(missing(role, None));
                    }
                }
            }
        }
    }
    if recurrent {
        for (field, value) in [
            ("ssm_conv_kernel", d.ssm_conv_kernel),
            ("ssm_state_size", d.ssm_state_size),
            ("ssm_inner_size", d.ssm_inner_size),
        ] {
            if value == 0 {
                return Err(DescriptionError::RecurrentGeometry { field });
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The host's C copy
// ---------------------------------------------------------------------------------------------

/// The description as a C record in host memory: the record, its role records, and one buffer
/// holding every name NUL-terminated. The role records point into the buffer and the record
/// points at the role records; both are `Vec`s that are never resized after construction, so
/// the pointers stay valid while this value lives, wherever it moves.
pub(crate) struct CDescription {
    record: guild_runner_model_v1_t,
    /// Kept for the pointers into them; never read through these fields.
    _roles: Vec<guild_tensor_role_v1_t>,
    _names: Vec<u8>,
}

// SAFETY: the raw pointers lead only into this value's own heap buffers, which are never
// mutated after construction; nothing is shared with the runner.
unsafe impl Send for CDescription {}
// SAFETY: as for Send: shared access only reads.
unsafe impl Sync for CDescription {}

impl fmt::Debug for CDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CDescription")
            .field("roles", &self.record.tensor_role_count)
            .finish_non_exhaustive()
    }
}

impl CDescription {
    /// Builds the host's C record for a checked description.
    pub(crate) fn new(copied: &CopiedRecord, description: &ModelDescription) -> Self {
        let mut names = Vec::new();
        let mut offsets = Vec::with_capacity(description.roles.len());
        for r in &description.roles {
            offsets.push(names.len());
            names.extend_from_slice(r.name.as_bytes());
            names.push(0);
        }
        // `names` is complete: from here on it is never resized, so pointers into it hold.
        let base = names.as_ptr();
        let roles: Vec<guild_tensor_role_v1_t> = description
            .roles
            .iter()
            .zip(&offsets)
            .map(|(r, &offset)| guild_tensor_role_v1_t {
                role: r.role.raw(),
                layer: r.layer.map_or(-1, |l| l as i32),
                // In bounds: `offset` is the start of a name written above.
                name: base.wrapping_add(offset).cast(),
                flags: if r.optional {
                    GUILD_TENSOR_ROLE_FLAG_OPTIONAL
                } else {
                    0
                },
                reserved: 0,
            })
            .collect();
        let record = copied.c_record(&roles);
        CDescription {
            record,
            _roles: roles,
            _names: names,
        }
    }

    /// The record; its pointers are valid while `self` lives.
    pub(crate) fn record(&self) -> &guild_runner_model_v1_t {
        &self.record
    }
}
