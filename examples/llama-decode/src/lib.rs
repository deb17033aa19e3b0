//! A greedy decode of a Llama-architecture model through the operation service (G19).
//!
//! The runner reads the model through the host's GGUF reader ([`ModelFile`]), resolves every
//! operation of a decode step once (the `example.llama.*` operations of `test-plugins/llama_ops`),
//! and runs the loop: one forward pass per token, the embedding lookup, 15 operation calls per
//! layer and three for the output (34 for two layers). The weight matrices may be stored as f32,
//! f16, bf16, q8_0 or q4_0 ([`MATRIX_DTYPES`]): each is passed to the module as the file stores
//! it, its descriptor naming its dtype, and the service resolves the implementation that takes
//! that dtype; the norm vectors are f32. The attention's key/value length is part of its tensors' shapes,
//! so its handle is re-bound to the grown cache before each token through [`Ops::rebind`], the
//! one place that does so.
//!
//! The loop is written against [`Ops`], so that a benchmark can run the very same loop on the
//! module's C functions called directly; [`Service`] is the operation service's implementation.
//! This file uses only `guild-host`, `serde_json` (for the reference, a dependency of
//! `guild-host` too) and std, and no `unsafe`, so that the host's tests and benchmarks can
//! include it by path (nothing may depend on an example crate).

#![forbid(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use guild_host::ports::model::{MetaValue, ModelFile};
use guild_host::{
    DType, MemorySpace, OpHandle, OpName, OperationRequest, OperationService, TensorArg,
    TensorArgMut, TensorDesc,
};

/// The implementation ids `test-plugins/llama_ops` registers (what its manifest lists): one
/// matvec and one embed per weight storage type.
pub const MODULE_IMPLS: [&str; 16] = [
    "example.llama.matvec.cpu",
    "example.llama.rmsnorm.cpu",
    "example.llama.rope.cpu",
    "example.llama.attention.cpu",
    "example.llama.swiglu.cpu",
    "example.llama.add.cpu",
    "example.llama.argmax.cpu",
    "example.llama.matvec.f16.cpu",
    "example.llama.matvec.bf16.cpu",
    "example.llama.matvec.q8_0.cpu",
    "example.llama.matvec.q4_0.cpu",
    "example.llama.embed.f32.cpu",
    "example.llama.embed.f16.cpu",
    "example.llama.embed.bf16.cpu",
    "example.llama.embed.q8_0.cpu",
    "example.llama.embed.q4_0.cpu",
];

/// The storage types this runner takes for a weight matrix (token_embd, the projections and
/// output): those the module's matvec and embed implementations take.
pub const MATRIX_DTYPES: [DType; 5] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
];

/// The operations a decode step uses, by name.
pub const MATVEC: &str = "example.llama.matvec";
pub const RMSNORM: &str = "example.llama.rmsnorm";
pub const ROPE: &str = "example.llama.rope";
pub const ATTENTION: &str = "example.llama.attention";
pub const SWIGLU: &str = "example.llama.swiglu";
pub const ADD: &str = "example.llama.add";
pub const ARGMAX: &str = "example.llama.argmax";
pub const EMBED: &str = "example.llama.embed";

/// Why a decode could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The model lacks a key or tensor, or has one of another type or shape than a Llama of
    /// its own metadata needs.
    Model(String),
    /// An operation could not be resolved (or re-bound) for the shapes it was asked for.
    Resolve { op: String, message: String },
    /// An operation refused a call or failed in it.
    Execute { op: String, message: String },
    /// The prompt is empty, a token is outside the vocabulary, or the context is full.
    Input(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Model(m) => write!(f, "model: {m}"),
            DecodeError::Resolve { op, message } => write!(f, "resolving {op}: {message}"),
            DecodeError::Execute { op, message } => write!(f, "executing {op}: {message}"),
            DecodeError::Input(m) => write!(f, "input: {m}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The hyperparameters read from the model's `llama.*` keys, with llama.cpp's reading of what a
/// file may leave out (see [`Config::from_model`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub eps: f32,
    pub rope_base: f32,
    /// llama.cpp's `freq_scale`: positions are scaled by it before the rotation (1 / the linear
    /// scaling factor; 1 without scaling).
    pub rope_freq_scale: f32,
    /// The model carries Llama 3's `rope_freqs.weight`: `head_dim / 2` factors that each divide
    /// one rotation frequency.
    pub rope_freqs: bool,
    /// The model has no `output.weight`: `token_embd.weight` is the output projection too.
    pub tied_embeddings: bool,
}

/// llama.cpp's default `llama.rope.freq_base`.
pub const DEFAULT_ROPE_BASE: f32 = 10000.0;

/// `key` holds `what`, which changes the arithmetic in a way this runner does not implement.
fn unsupported(key: &str, what: impl fmt::Display) -> DecodeError {
    DecodeError::Model(format!(
        "{key} is {what}, which this runner does not implement"
    ))
}

fn meta_uint(model: &dyn ModelFile, key: &str) -> Result<usize, DecodeError> {
    let value = match model.metadata(key) {
        Some(MetaValue::U32(v)) => u64::from(*v),
        Some(MetaValue::U64(v)) => *v,
        Some(MetaValue::I32(v)) if *v >= 0 => *v as u64,
        Some(other) => {
            return Err(DecodeError::Model(format!(
                "{key} is not an unsigned integer ({other:?})"
            )))
        }
        None => return Err(DecodeError::Model(format!("{key} is missing"))),
    };
    match usize::try_from(value) {
        Ok(v) if v > 0 && v <= 1 << 20 => Ok(v),
        _ => Err(DecodeError::Model(format!(
            "{key} = {value} is out of range"
        ))),
    }
}

fn meta_float(model: &dyn ModelFile, key: &str) -> Result<f32, DecodeError> {
    meta_opt_float(model, key)?.ok_or_else(|| DecodeError::Model(format!("{key} is missing")))
}

/// `key` as a positive f32, or `None` when the file leaves it out.
fn meta_opt_float(model: &dyn ModelFile, key: &str) -> Result<Option<f32>, DecodeError> {
    match model.metadata(key) {
        Some(MetaValue::F32(v)) if v.is_finite() && *v > 0.0 => Ok(Some(*v)),
        Some(other) => Err(DecodeError::Model(format!(
            "{key} is not a positive f32 ({other:?})"
        ))),
        None => Ok(None),
    }
}

/// `key` as an unsigned integer (zero allowed), or `None` when the file leaves it out.
fn meta_opt_uint(model: &dyn ModelFile, key: &str) -> Result<Option<u64>, DecodeError> {
    match model.metadata(key) {
        None => Ok(None),
        Some(MetaValue::U32(v)) => Ok(Some(u64::from(*v))),
        Some(MetaValue::U64(v)) => Ok(Some(*v)),
        Some(MetaValue::I32(v)) if *v >= 0 => Ok(Some(*v as u64)),
        Some(other) => Err(DecodeError::Model(format!(
            "{key} is not an unsigned integer ({other:?})"
        ))),
    }
}

/// llama.cpp's `freq_scale` from the `llama.rope.scaling.*` keys. A missing type reads as
/// "linear", as llama.cpp reads it, so that a factor without a type still scales; "none" never
/// scales; the factor is `llama.rope.scaling.factor` or else the older
/// `llama.rope.scale_linear`, and a missing or zero factor does not scale. Every other type
/// (yarn, longrope, ...) changes the rotation in ways this runner does not compute: refused,
/// naming the key and the value, never read as no scaling.
fn rope_freq_scale(model: &dyn ModelFile) -> Result<f32, DecodeError> {
    const TYPE: &str = "llama.rope.scaling.type";
    let linear = match model.metadata(TYPE) {
        None => true,
        Some(MetaValue::Str(t)) if t == "linear" => true,
        Some(MetaValue::Str(t)) if t == "none" => false,
        Some(MetaValue::Str(t)) => {
            return Err(unsupported(
                TYPE,
                format!("\"{t}\" (it implements \"none\" and \"linear\")"),
            ))
        }
        Some(other) => {
            return Err(DecodeError::Model(format!(
                "{TYPE} is not a string ({other:?})"
            )))
        }
    };
    let mut factor = None;
    for key in ["llama.rope.scaling.factor", "llama.rope.scale_linear"] {
        match model.metadata(key) {
            None => continue,
            Some(MetaValue::F32(f)) if f.is_finite() && *f >= 0.0 => {
                factor = Some((key, *f));
                break;
            }
            Some(other) => {
                return Err(DecodeError::Model(format!(
                    "{key} is not a finite f32 >= 0 ({other:?})"
                )))
            }
        }
    }
    match factor {
        Some((key, f)) if linear && f != 0.0 => {
            let scale = 1.0 / f;
            if scale.is_finite() && scale > 0.0 {
                Ok(scale)
            } else {
                Err(DecodeError::Model(format!("{key} = {f} is out of range")))
            }
        }
        _ => Ok(1.0),
    }
}

/// Refuses the keys of a llama file that would change the arithmetic in ways this runner does
/// not implement (llama.cpp either computes something else for them or refuses the file).
fn refuse_unimplemented(model: &dyn ModelFile, head_dim: usize) -> Result<(), DecodeError> {
    for key in ["llama.expert_count", "llama.expert_used_count"] {
        if let Some(n) = meta_opt_uint(model, key)? {
            if n > 0 {
                return Err(unsupported(key, format!("{n} (a mixture of experts)")));
            }
        }
    }
    // Partial rotary embedding: llama.cpp refuses it for this architecture too.
    if let Some(n) = meta_opt_uint(model, "llama.rope.dimension_count")? {
        if n != head_dim as u64 {
            return Err(unsupported(
                "llama.rope.dimension_count",
                format!("{n}, not the head size {head_dim} (a rotation of part of each head)"),
            ));
        }
    }
    // Head sizes other than n_embd / n_head.
    for key in ["llama.attention.key_length", "llama.attention.value_length"] {
        if let Some(n) = meta_opt_uint(model, key)? {
            if n != head_dim as u64 {
                return Err(unsupported(
                    key,
                    format!("{n}, not embedding_length / head_count = {head_dim}"),
                ));
            }
        }
    }
    // An attention factor scales the rotated values (YaRN-style magnitude correction).
    const ATTN_FACTOR: &str = "llama.rope.scaling.attn_factor";
    match model.metadata(ATTN_FACTOR) {
        None | Some(MetaValue::F32(1.0)) => {}
        Some(other) => return Err(unsupported(ATTN_FACTOR, format!("{other:?}, not 1"))),
    }
    Ok(())
}

/// Every tensor a llama of `n_layer` layers may hold that this runner reads. llama.cpp refuses
/// a file with a tensor its graph does not use, and so does this runner: an attention bias or
/// an expert's weights the decode skipped would change the arithmetic without a word.
fn refuse_unknown_tensors(model: &dyn ModelFile, n_layer: usize) -> Result<(), DecodeError> {
    const GLOBAL: [&str; 4] = [
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",
        "rope_freqs.weight",
    ];
    const LAYER: [&str; 9] = [
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    let known = |name: &str| {
        if GLOBAL.contains(&name) {
            return true;
        }
        let Some(rest) = name.strip_prefix("blk.") else {
            return false;
        };
        let Some((layer, part)) = rest.split_once('.') else {
            return false;
        };
        layer
            .parse::<usize>()
            .is_ok_and(|l| l < n_layer && l.to_string() == layer)
            && part
                .strip_suffix(".weight")
                .is_some_and(|p| LAYER.contains(&p))
    };
    match model.tensors().iter().find(|t| !known(&t.name)) {
        Some(t) => Err(DecodeError::Model(format!(
            "tensor {} is not one a llama of {n_layer} layers uses, and this runner does not \
             implement what it would add",
            t.name
        ))),
        None => Ok(()),
    }
}

impl Config {
    /// Reads the hyperparameters of a `general.architecture = "llama"` model as llama.cpp
    /// reads them: without `output.weight` the token embedding is the output projection (tied
    /// embeddings); without `llama.rope.freq_base` the base is 10000; without
    /// `llama.attention.head_count_kv` every query head has its own key/value head;
    /// `llama.rope.scaling.*` scale positions linearly ([`Config::rope_freq_scale`]);
    /// `rope_freqs.weight` divides each rotation frequency by its factor. The RMS epsilon has no
    /// default for llama in llama.cpp, and none here. Whatever else would change the arithmetic
    /// (another scaling type, experts, a partial rotation, other head sizes, a tensor the decode
    /// does not read) is refused with the key or tensor named, never ignored.
    pub fn from_model(model: &dyn ModelFile) -> Result<Config, DecodeError> {
        match model.metadata("general.architecture") {
            Some(MetaValue::Str(a)) if a == "llama" => {}
            other => {
                return Err(DecodeError::Model(format!(
                    "general.architecture is {other:?}, not \"llama\""
                )))
            }
        }
        let n_embd = meta_uint(model, "llama.embedding_length")?;
        let n_head = meta_uint(model, "llama.attention.head_count")?;
        let n_head_kv = match model.metadata("llama.attention.head_count_kv") {
            None => n_head,
            Some(_) => meta_uint(model, "llama.attention.head_count_kv")?,
        };
        if n_embd % n_head != 0 || n_head % n_head_kv != 0 {
            return Err(DecodeError::Model(format!(
                "{n_embd} embedding values do not split into {n_head} heads sharing {n_head_kv} \
                 key/value heads"
            )));
        }
        let n_vocab = match model
            .tensors()
            .iter()
            .find(|t| t.name == "token_embd.weight")
        {
            Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
            _ => return Err(DecodeError::Model("token_embd.weight is missing".into())),
        };
        let head_dim = n_embd / n_head;
        let n_layer = meta_uint(model, "llama.block_count")?;
        refuse_unimplemented(model, head_dim)?;
        refuse_unknown_tensors(model, n_layer)?;
        let tensor = |name: &str| model.tensors().iter().find(|t| t.name == name);
        let rope_freqs = match tensor("rope_freqs.weight") {
            None => false,
            Some(t) if t.dims == [head_dim as u64 / 2] => true,
            Some(t) => {
                return Err(DecodeError::Model(format!(
                    "tensor rope_freqs.weight has dims {:?}; a llama with head size {head_dim} \
                     needs [{}]",
                    t.dims,
                    head_dim / 2
                )))
            }
        };
        Ok(Config {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: meta_uint(model, "llama.feed_forward_length")?,
            n_vocab,
            n_ctx: meta_uint(model, "llama.context_length")?,
            eps: meta_float(model, "llama.attention.layer_norm_rms_epsilon")?,
            rope_base: meta_opt_float(model, "llama.rope.freq_base")?.unwrap_or(DEFAULT_ROPE_BASE),
            rope_freq_scale: rope_freq_scale(model)?,
            rope_freqs,
            tied_embeddings: tensor("output.weight").is_none(),
        })
    }

    fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// A weight matrix as the file stores it: its dtype and its bytes.
#[derive(Debug, Clone, Copy)]
struct Matrix<'m> {
    dtype: DType,
    bytes: &'m [u8],
}

/// One layer's weights, the bytes of the file: f32 norm vectors and stored matrices.
#[derive(Debug)]
struct Layer<'m> {
    attn_norm: &'m [u8],
    wq: Matrix<'m>,
    wk: Matrix<'m>,
    wv: Matrix<'m>,
    wo: Matrix<'m>,
    ffn_norm: &'m [u8],
    gate: Matrix<'m>,
    up: Matrix<'m>,
    down: Matrix<'m>,
}

/// The model's weights, borrowed from the file's mapping.
#[derive(Debug)]
pub struct Weights<'m> {
    token_embd: Matrix<'m>,
    layers: Vec<Layer<'m>>,
    output_norm: &'m [u8],
    output: Matrix<'m>,
    /// `rope_freqs.weight`, f32.
    rope_freqs: Option<&'m [u8]>,
}

/// The matrices of a layer that one matvec handle serves together, in every layer: a handle is
/// resolved for one dtype, so they must be stored alike.
const MATRIX_ROLES: [&[&str]; 5] = [
    &["attn_q"],
    &["attn_k", "attn_v"],
    &["attn_output"],
    &["ffn_gate", "ffn_up"],
    &["ffn_down"],
];

impl<'m> Weights<'m> {
    /// Finds every tensor a Llama of `cfg` needs, checking that each has the shape `cfg` implies
    /// (GGUF dims, innermost first), that the norm vectors are f32 and the matrices one of
    /// [`MATRIX_DTYPES`], the matrices of one role stored alike in every layer.
    pub fn from_model(model: &'m Arc<dyn ModelFile>, cfg: &Config) -> Result<Self, DecodeError> {
        let find = |name: &str, dims: &[usize]| {
            let (index, t) = model
                .tensors()
                .iter()
                .enumerate()
                .find(|(_, t)| t.name == name)
                .ok_or_else(|| DecodeError::Model(format!("tensor {name} is missing")))?;
            let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
            Ok::<_, DecodeError>((index, DType::from_raw(t.dtype), t.dims.clone(), want))
        };
        let data = |index: usize| {
            model
                .tensor_data(index)
                .map_err(|e| DecodeError::Model(e.to_string()))
        };
        let vector = |name: &str, n: usize| -> Result<&'m [u8], DecodeError> {
            let (index, dtype, dims, want) = find(name, &[n])?;
            if dtype != DType::F32 || dims != want {
                return Err(DecodeError::Model(format!(
                    "tensor {name} is dtype {} with dims {dims:?}; this runner needs f32 {want:?}",
                    dtype.raw()
                )));
            }
            data(index)
        };
        let matrix = |name: &str, n_in: usize, n_out: usize| -> Result<Matrix<'m>, DecodeError> {
            let (index, dtype, dims, want) = find(name, &[n_in, n_out])?;
            if !MATRIX_DTYPES.contains(&dtype) || dims != want {
                return Err(DecodeError::Model(format!(
                    "tensor {name} is {dtype} with dims {dims:?}; this runner needs {want:?} \
                     stored as f32, f16, bf16, q8_0 or q4_0"
                )));
            }
            let bytes = data(index)?;
            // The descriptor the module will be given must span exactly the stored bytes.
            let extent = stored_desc(dtype, &[n_in, n_out])
                .check()
                .map_err(|e| DecodeError::Model(format!("tensor {name}: {e}")))?
                .byte_extent;
            if bytes.len() as u64 != extent {
                return Err(DecodeError::Model(format!(
                    "tensor {name} holds {} bytes; {dtype} {want:?} is {extent}",
                    bytes.len()
                )));
            }
            Ok(Matrix { dtype, bytes })
        };
        let (e, q, kv, ff) = (
            cfg.n_embd,
            cfg.n_head * cfg.head_dim,
            cfg.kv_dim(),
            cfg.n_ff,
        );
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            let name = |part: &str| format!("blk.{l}.{part}.weight");
            layers.push(Layer {
                attn_norm: vector(&name("attn_norm"), e)?,
                wq: matrix(&name("attn_q"), e, q)?,
                wk: matrix(&name("attn_k"), e, kv)?,
                wv: matrix(&name("attn_v"), e, kv)?,
                wo: matrix(&name("attn_output"), q, e)?,
                ffn_norm: vector(&name("ffn_norm"), e)?,
                gate: matrix(&name("ffn_gate"), e, ff)?,
                up: matrix(&name("ffn_up"), e, ff)?,
                down: matrix(&name("ffn_down"), ff, e)?,
            });
        }
        let token_embd = matrix("token_embd.weight", e, cfg.n_vocab)?;
        let rope_freqs = match cfg.rope_freqs {
            true => Some(rope_factors(vector(
                "rope_freqs.weight",
                cfg.head_dim / 2,
            )?)?),
            false => None,
        };
        let weights = Weights {
            token_embd,
            layers,
            output_norm: vector("output_norm.weight", e)?,
            // Tied embeddings: the one table is the output projection too.
            output: match cfg.tied_embeddings {
                true => token_embd,
                false => matrix("output.weight", e, cfg.n_vocab)?,
            },
            rope_freqs,
        };
        for role in MATRIX_ROLES {
            let want = weights.layers[0].matrix(role[0]).dtype;
            for (l, layer) in weights.layers.iter().enumerate() {
                for part in role {
                    let got = layer.matrix(part).dtype;
                    if got != want {
                        return Err(DecodeError::Model(format!(
                            "tensor blk.{l}.{part}.weight is {got} but blk.0.{}.weight is {want}; \
                             this runner resolves one matvec for both, so they must be stored alike",
                            role[0]
                        )));
                    }
                }
            }
        }
        Ok(weights)
    }

    /// The dtype each weight matrix is stored as, by GGUF name (layer 0's for the projections,
    /// which every layer shares): what the runner reports of a model.
    pub fn matrix_dtypes(&self) -> Vec<(&'static str, DType)> {
        let l = &self.layers[0];
        vec![
            ("token_embd", self.token_embd.dtype),
            ("attn_q", l.wq.dtype),
            ("attn_k", l.wk.dtype),
            ("attn_v", l.wv.dtype),
            ("attn_output", l.wo.dtype),
            ("ffn_gate", l.gate.dtype),
            ("ffn_up", l.up.dtype),
            ("ffn_down", l.down.dtype),
            ("output", self.output.dtype),
        ]
    }
}

impl<'m> Layer<'m> {
    /// The matrix of this layer named `part` in GGUF (one of [`MATRIX_ROLES`]' names).
    fn matrix(&self, part: &str) -> Matrix<'m> {
        match part {
            "attn_q" => self.wq,
            "attn_k" => self.wk,
            "attn_v" => self.wv,
            "attn_output" => self.wo,
            "ffn_gate" => self.gate,
            "ffn_up" => self.up,
            _ => self.down,
        }
    }
}

/// `rope_freqs.weight`'s bytes, once each factor is known to be finite and positive (a factor
/// divides a frequency).
fn rope_factors(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    for (i, f) in bytes.chunks_exact(4).enumerate() {
        let f = f32::from_le_bytes([f[0], f[1], f[2], f[3]]);
        if !(f.is_finite() && f > 0.0) {
            return Err(DecodeError::Model(format!(
                "tensor rope_freqs.weight holds {f} at {i}; each factor must be finite and > 0"
            )));
        }
    }
    Ok(bytes)
}

/// An input buffer of a call.
#[derive(Debug, Clone, Copy)]
pub enum In<'a> {
    F32(&'a [f32]),
    /// Values as the file stores them (the weights, in their own dtype).
    Bytes(&'a [u8]),
}

/// An output buffer of a call.
#[derive(Debug)]
pub enum Out<'a> {
    F32(&'a mut [f32]),
    I32(&'a mut [i32]),
}

/// What the decode loop needs of whoever runs its operations.
pub trait Ops {
    /// A resolved operation.
    type Handle;

    /// Resolves `op` for these tensors, once.
    fn resolve(
        &self,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<Self::Handle, DecodeError>;

    /// Re-binds `handle` (resolved for `op`) to tensors of new shapes: the attention, whose
    /// key/value length grows by one each token. The decode calls nothing else when a shape
    /// changes.
    fn rebind(
        &self,
        handle: &mut Self::Handle,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<(), DecodeError>;

    /// Runs `handle` on buffers of the tensors it was (re-)bound to.
    fn execute(
        &self,
        handle: &Self::Handle,
        inputs: &[In<'_>],
        outputs: &mut [Out<'_>],
        params: &[u8],
    ) -> Result<(), DecodeError>;

    /// The package version whose code `handle` runs, and whether the host still serves that
    /// version; `None` where calls do not go through a host (the benchmark's direct calls).
    fn provider(&self, _handle: &Self::Handle) -> Option<Provider> {
        None
    }
}

/// Where a handle's calls go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// `package@version`.
    pub package: String,
    /// Whether that version is still the one the host serves (`OpHandle::is_current`): `false`
    /// once a refresh found it replaced, taken out or revoked, or waiting for its handles to
    /// be released to be so.
    pub current: bool,
}

/// The providers of a decoder's handles at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// Every distinct `package@version`, sorted.
    pub packages: Vec<String>,
    /// The handles of a step.
    pub handles: usize,
    /// Those whose provider is still current.
    pub current: usize,
}

impl Bound {
    /// Whether every handle's provider is still current.
    pub fn all_current(&self) -> bool {
        self.current == self.handles
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let packages = if self.packages.is_empty() {
            "no host".to_owned()
        } else {
            self.packages.join(", ")
        };
        write!(
            f,
            "{} handles on {packages}, {} current",
            self.handles, self.current
        )
    }
}

/// [`Ops`] through the operation service's Rust face.
#[derive(Debug, Clone, Copy)]
pub struct Service<'r> {
    service: OperationService<'r>,
}

impl<'r> Service<'r> {
    pub fn new(service: OperationService<'r>) -> Self {
        Service { service }
    }
}

impl<'r> Ops for Service<'r> {
    type Handle = OpHandle<'r>;

    fn resolve(
        &self,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<OpHandle<'r>, DecodeError> {
        let fail = |message: String| DecodeError::Resolve {
            op: op.to_owned(),
            message,
        };
        let name = OpName::new(op).map_err(|e| fail(e.to_string()))?;
        let request = OperationRequest::cpu(name, inputs.to_vec(), outputs.to_vec());
        self.service
            .resolve(&request)
            .map_err(|e| fail(e.to_string()))
    }

    /// Reshapes the handle in place (`OpHandle::reshape`): its own provider is asked about the
    /// new shapes, nothing is ranked again, and a refusal leaves the handle as it was.
    fn rebind(
        &self,
        handle: &mut OpHandle<'r>,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<(), DecodeError> {
        handle
            .reshape(inputs, outputs)
            .map_err(|e| DecodeError::Resolve {
                op: op.to_owned(),
                message: e.to_string(),
            })
    }

    fn execute(
        &self,
        handle: &OpHandle<'r>,
        inputs: &[In<'_>],
        outputs: &mut [Out<'_>],
        params: &[u8],
    ) -> Result<(), DecodeError> {
        let descs = handle.inputs();
        let arg = |i: usize| match inputs[i] {
            In::F32(d) => TensorArg::new(&descs[i], d),
            In::Bytes(d) => TensorArg::new(&descs[i], d),
        };
        let out_desc = &handle.outputs()[0];
        let mut out = [match &mut outputs[0] {
            Out::F32(d) => TensorArgMut::new(out_desc, d),
            Out::I32(d) => TensorArgMut::new(out_desc, d),
        }];
        let result = match inputs.len() {
            1 => handle.execute_with_params(&[arg(0)], &mut out, None, params),
            2 => handle.execute_with_params(&[arg(0), arg(1)], &mut out, None, params),
            _ => handle.execute_with_params(&[arg(0), arg(1), arg(2)], &mut out, None, params),
        };
        result.map_err(|e| DecodeError::Execute {
            op: handle.describe().op_name.to_string(),
            message: e.to_string(),
        })
    }

    fn provider(&self, handle: &OpHandle<'r>) -> Option<Provider> {
        let chosen = handle.describe();
        Some(Provider {
            package: format!("{}@{}", chosen.package, chosen.package_version),
            current: handle.is_current(),
        })
    }
}

fn f32_desc(shape: &[usize]) -> TensorDesc {
    stored_desc(DType::F32, shape)
}

/// A packed host tensor of `dtype`: for a block dtype, `shape[0]` counts elements and each row
/// is `shape[0] / block` blocks, which the host checks and sizes (`TensorDesc::check`).
fn stored_desc(dtype: DType, shape: &[usize]) -> TensorDesc {
    let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    TensorDesc::new(dtype, &dims, MemorySpace::Host)
}

/// The handles of one decode step.
#[derive(Debug)]
struct Handles<H> {
    embed: H,
    mv_q: H,
    mv_kv: H,
    mv_o: H,
    mv_ff: H,
    mv_down: H,
    mv_out: H,
    rmsnorm: H,
    rope_q: H,
    rope_k: H,
    attention: H,
    swiglu: H,
    add: H,
    argmax: H,
}

impl<H> Handles<H> {
    fn all(&self) -> [&H; 14] {
        [
            &self.embed,
            &self.mv_q,
            &self.mv_kv,
            &self.mv_o,
            &self.mv_ff,
            &self.mv_down,
            &self.mv_out,
            &self.rmsnorm,
            &self.rope_q,
            &self.rope_k,
            &self.attention,
            &self.swiglu,
            &self.add,
            &self.argmax,
        ]
    }
}

/// The scratch vectors of one step.
#[derive(Debug)]
struct Buffers {
    x: Vec<f32>,
    x2: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    q_rot: Vec<f32>,
    k: Vec<f32>,
    att: Vec<f32>,
    y: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    s: Vec<f32>,
    logits: Vec<f32>,
}

/// Counts of what a decode did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Forward passes (tokens fed, prompt included).
    pub steps: u64,
    /// Operation calls.
    pub calls: u64,
    /// Re-binds of the attention to a grown cache.
    pub rebinds: u64,
}

/// A decode in progress: the model, the handles and the key/value cache.
pub struct Decoder<'m, 'o, O: Ops> {
    cfg: Config,
    weights: Weights<'m>,
    ops: &'o O,
    handles: Handles<O::Handle>,
    /// Per layer: `n_ctx` positions of `kv_dim` values.
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    buffers: Buffers,
    /// The next position, which is also the number of cached positions.
    pos: usize,
    /// The key/value length the attention handle is bound to.
    bound_len: usize,
    counts: Counts,
}

impl<O: Ops> fmt::Debug for Decoder<'_, '_, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("cfg", &self.cfg)
            .field("pos", &self.pos)
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl<'m, 'o, O: Ops> Decoder<'m, 'o, O> {
    /// Resolves every operation of a step once (the attention for one cached position).
    pub fn new(cfg: Config, weights: Weights<'m>, ops: &'o O) -> Result<Self, DecodeError> {
        let (e, q, kv, ff, d) = (
            cfg.n_embd,
            cfg.n_head * cfg.head_dim,
            cfg.kv_dim(),
            cfg.n_ff,
            cfg.head_dim,
        );
        // Each matvec is resolved for its weight's dtype (one per role, which from_model
        // checked every layer shares).
        let mv = |w: Matrix<'_>, n_in: usize, n_out: usize| {
            ops.resolve(
                MATVEC,
                &[stored_desc(w.dtype, &[n_in, n_out]), f32_desc(&[n_in])],
                &[f32_desc(&[n_out])],
            )
        };
        let vec2 = |op: &str, n: usize| {
            ops.resolve(op, &[f32_desc(&[n]), f32_desc(&[n])], &[f32_desc(&[n])])
        };
        // With rope_freqs the factors are the rope's second input (example.llama.rope 1.1.0).
        let rope = |heads: usize| {
            let x = f32_desc(&[d, heads]);
            match weights.rope_freqs {
                Some(_) => ops.resolve(ROPE, &[x, f32_desc(&[d / 2])], &[x]),
                None => ops.resolve(ROPE, &[x], &[x]),
            }
        };
        let (att_in, att_out) = attention_descs(&cfg, 1);
        let l0 = &weights.layers[0];
        let handles = Handles {
            embed: ops.resolve(
                EMBED,
                &[stored_desc(weights.token_embd.dtype, &[e, cfg.n_vocab])],
                &[f32_desc(&[e])],
            )?,
            mv_q: mv(l0.wq, e, q)?,
            mv_kv: mv(l0.wk, e, kv)?,
            mv_o: mv(l0.wo, q, e)?,
            mv_ff: mv(l0.gate, e, ff)?,
            mv_down: mv(l0.down, ff, e)?,
            mv_out: mv(weights.output, e, cfg.n_vocab)?,
            rmsnorm: vec2(RMSNORM, e)?,
            rope_q: rope(cfg.n_head)?,
            rope_k: rope(cfg.n_head_kv)?,
            attention: ops.resolve(ATTENTION, &att_in, &att_out)?,
            swiglu: vec2(SWIGLU, ff)?,
            add: vec2(ADD, e)?,
            argmax: ops.resolve(
                ARGMAX,
                &[f32_desc(&[cfg.n_vocab])],
                &[TensorDesc::new(DType::I32, &[1], MemorySpace::Host)],
            )?,
        };
        let cache = || vec![vec![0.0f32; cfg.n_ctx * kv]; cfg.n_layer];
        Ok(Decoder {
            cfg,
            weights,
            ops,
            handles,
            k_cache: cache(),
            v_cache: cache(),
            buffers: Buffers {
                x: vec![0.0; e],
                x2: vec![0.0; e],
                h: vec![0.0; e],
                q: vec![0.0; q],
                q_rot: vec![0.0; q],
                k: vec![0.0; kv],
                att: vec![0.0; q],
                y: vec![0.0; e],
                g: vec![0.0; ff],
                u: vec![0.0; ff],
                s: vec![0.0; ff],
                logits: vec![0.0; cfg.n_vocab],
            },
            pos: 0,
            bound_len: 1,
            counts: Counts::default(),
        })
    }

    /// What the decode has done so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The hyperparameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Which package versions the handles run, and how many still point at the current one.
    /// A decode that holds its handles keeps running the code it resolved, whatever the store
    /// does meanwhile; this says when to resolve again (drop the decoder, refresh, build a new
    /// one).
    pub fn bound(&self) -> Bound {
        let providers: Vec<Provider> = self
            .handles
            .all()
            .into_iter()
            .filter_map(|h| self.ops.provider(h))
            .collect();
        let mut packages: Vec<String> = providers.iter().map(|p| p.package.clone()).collect();
        packages.sort();
        packages.dedup();
        Bound {
            packages,
            handles: self.handles.all().len(),
            current: providers.iter().filter(|p| p.current).count(),
        }
    }

    /// Starts a new sequence at position 0 with the same handles (the cache's old entries are
    /// overwritten before they are read).
    pub fn restart(&mut self) {
        self.pos = 0;
    }

    /// One call of the handle `which` picks, writing f32 values to `output`.
    fn call(
        &mut self,
        which: fn(&Handles<O::Handle>) -> &O::Handle,
        inputs: &[In<'_>],
        output: &mut [f32],
        params: &[u8],
    ) -> Result<(), DecodeError> {
        self.counts.calls += 1;
        self.ops.execute(
            which(&self.handles),
            inputs,
            &mut [Out::F32(output)],
            params,
        )
    }

    /// Feeds `token` at the next position and returns the logits of the token after it.
    pub fn step(&mut self, token: u32) -> Result<&[f32], DecodeError> {
        let cfg = self.cfg;
        let token = token as usize;
        if token >= cfg.n_vocab {
            return Err(DecodeError::Input(format!(
                "token {token} is outside the vocabulary of {}",
                cfg.n_vocab
            )));
        }
        if self.pos >= cfg.n_ctx {
            return Err(DecodeError::Input(format!(
                "the context of {} positions is full",
                cfg.n_ctx
            )));
        }
        let (pos, kv) = (self.pos, cfg.kv_dim());
        let len = pos + 1;
        if self.bound_len != len {
            let (inputs, outputs) = attention_descs(&cfg, len);
            self.ops
                .rebind(&mut self.handles.attention, ATTENTION, &inputs, &outputs)?;
            self.bound_len = len;
            self.counts.rebinds += 1;
        }
        let norm = rmsnorm_params(cfg.eps);
        let rope = RopeParams::new(pos as u32, cfg.rope_base, cfg.rope_freq_scale);
        let embed = embed_params(token as u32);
        let token_embd = self.weights.token_embd.bytes;
        let rope_freqs = self.weights.rope_freqs;
        let rope_inputs = 1 + usize::from(rope_freqs.is_some());
        let mut b = std::mem::replace(&mut self.buffers, empty_buffers());
        let result = (|| {
            self.call(|h| &h.embed, &[In::Bytes(token_embd)], &mut b.x, &embed)?;
            for l in 0..cfg.n_layer {
                let w = &self.weights.layers[l];
                let (wq, wk, wv, wo) = (w.wq.bytes, w.wk.bytes, w.wv.bytes, w.wo.bytes);
                let (attn_norm, ffn_norm, gate, up, down) = (
                    w.attn_norm,
                    w.ffn_norm,
                    w.gate.bytes,
                    w.up.bytes,
                    w.down.bytes,
                );
                let mut k_cache = std::mem::take(&mut self.k_cache[l]);
                let mut v_cache = std::mem::take(&mut self.v_cache[l]);
                let slot = pos * kv..len * kv;
                let r = (|| {
                    let x = In::F32(&b.x);
                    self.call(|h| &h.rmsnorm, &[x, In::Bytes(attn_norm)], &mut b.h, &norm)?;
                    let h = In::F32(&b.h);
                    self.call(|h| &h.mv_q, &[In::Bytes(wq), h], &mut b.q, &[])?;
                    self.call(|h| &h.mv_kv, &[In::Bytes(wk), h], &mut b.k, &[])?;
                    let v_slot = &mut v_cache[slot.clone()];
                    self.call(|h| &h.mv_kv, &[In::Bytes(wv), h], v_slot, &[])?;
                    // The factors, when the model has them, are the rope's second input.
                    let (f, n) = (In::Bytes(rope_freqs.unwrap_or(&[])), rope_inputs);
                    let q = [In::F32(&b.q), f];
                    self.call(|h| &h.rope_q, &q[..n], &mut b.q_rot, rope.bytes())?;
                    let k = [In::F32(&b.k), f];
                    let k_slot = &mut k_cache[slot.clone()];
                    self.call(|h| &h.rope_k, &k[..n], k_slot, rope.bytes())?;
                    let (k, v) = (In::F32(&k_cache[..len * kv]), In::F32(&v_cache[..len * kv]));
                    let q = In::F32(&b.q_rot);
                    self.call(|h| &h.attention, &[q, k, v], &mut b.att, &[])?;
                    self.call(
                        |h| &h.mv_o,
                        &[In::Bytes(wo), In::F32(&b.att)],
                        &mut b.y,
                        &[],
                    )?;
                    self.call(|h| &h.add, &[In::F32(&b.x), In::F32(&b.y)], &mut b.x2, &[])?;
                    std::mem::swap(&mut b.x, &mut b.x2);
                    let x = In::F32(&b.x);
                    self.call(|h| &h.rmsnorm, &[x, In::Bytes(ffn_norm)], &mut b.h, &norm)?;
                    let h = In::F32(&b.h);
                    self.call(|h| &h.mv_ff, &[In::Bytes(gate), h], &mut b.g, &[])?;
                    self.call(|h| &h.mv_ff, &[In::Bytes(up), h], &mut b.u, &[])?;
                    self.call(
                        |h| &h.swiglu,
                        &[In::F32(&b.g), In::F32(&b.u)],
                        &mut b.s,
                        &[],
                    )?;
                    self.call(
                        |h| &h.mv_down,
                        &[In::Bytes(down), In::F32(&b.s)],
                        &mut b.y,
                        &[],
                    )?;
                    self.call(|h| &h.add, &[In::F32(&b.x), In::F32(&b.y)], &mut b.x2, &[])?;
                    std::mem::swap(&mut b.x, &mut b.x2);
                    Ok(())
                })();
                self.k_cache[l] = k_cache;
                self.v_cache[l] = v_cache;
                r?;
            }
            let (output_norm, output) = (self.weights.output_norm, self.weights.output.bytes);
            let x = In::F32(&b.x);
            self.call(
                |h| &h.rmsnorm,
                &[x, In::Bytes(output_norm)],
                &mut b.h,
                &norm,
            )?;
            let h = In::F32(&b.h);
            self.call(|h| &h.mv_out, &[In::Bytes(output), h], &mut b.logits, &[])
        })();
        self.buffers = b;
        result?;
        self.pos += 1;
        self.counts.steps += 1;
        Ok(&self.buffers.logits)
    }

    /// The greedy choice over the last step's logits, through the argmax operation.
    pub fn argmax(&mut self) -> Result<u32, DecodeError> {
        let logits = std::mem::take(&mut self.buffers.logits);
        let mut best = [0i32];
        self.counts.calls += 1;
        let r = self.ops.execute(
            &self.handles.argmax,
            &[In::F32(&logits)],
            &mut [Out::I32(&mut best)],
            &[],
        );
        self.buffers.logits = logits;
        r?;
        u32::try_from(best[0])
            .ok()
            .filter(|&t| (t as usize) < self.cfg.n_vocab)
            .ok_or_else(|| DecodeError::Execute {
                op: ARGMAX.into(),
                message: format!("returned index {} outside the vocabulary", best[0]),
            })
    }
}

fn empty_buffers() -> Buffers {
    Buffers {
        x: Vec::new(),
        x2: Vec::new(),
        h: Vec::new(),
        q: Vec::new(),
        q_rot: Vec::new(),
        k: Vec::new(),
        att: Vec::new(),
        y: Vec::new(),
        g: Vec::new(),
        u: Vec::new(),
        s: Vec::new(),
        logits: Vec::new(),
    }
}

/// The attention's tensors over `len` cached positions: q, k, v and the output.
fn attention_descs(cfg: &Config, len: usize) -> ([TensorDesc; 3], [TensorDesc; 1]) {
    let cache = f32_desc(&[cfg.head_dim, cfg.n_head_kv, len]);
    let q = f32_desc(&[cfg.head_dim, cfg.n_head]);
    ([q, cache, cache], [q])
}

/// example.llama.rmsnorm's parameter record: `{ u32 struct_size = 8; f32 eps; }`.
fn rmsnorm_params(eps: f32) -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&8u32.to_ne_bytes());
    p[4..].copy_from_slice(&eps.to_ne_bytes());
    p
}

/// example.llama.embed's parameter record: `{ u32 struct_size = 8; u32 row; }`.
fn embed_params(row: u32) -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&8u32.to_ne_bytes());
    p[4..].copy_from_slice(&row.to_ne_bytes());
    p
}

/// example.llama.rope's parameter record: `{ u32 struct_size = 12; u32 position; f32 base; }`,
/// or, to scale positions, 1.1.0's `{ u32 struct_size = 16; u32 position; f32 base;
/// f32 freq_scale; }`. Without scaling the decode sends the 12-byte record, so that a model
/// that needs nothing new still runs on a 1.0.0 module; a 1.0.0 module refuses the 16-byte
/// record at the first call.
struct RopeParams {
    record: [u8; 16],
    len: usize,
}

impl RopeParams {
    fn new(position: u32, base: f32, freq_scale: f32) -> Self {
        let len = if freq_scale == 1.0 { 12 } else { 16 };
        let mut record = [0u8; 16];
        record[..4].copy_from_slice(&(len as u32).to_ne_bytes());
        record[4..8].copy_from_slice(&position.to_ne_bytes());
        record[8..12].copy_from_slice(&base.to_ne_bytes());
        record[12..].copy_from_slice(&freq_scale.to_ne_bytes());
        RopeParams { record, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.record[..self.len]
    }
}

/// What a greedy decode produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The decoded tokens.
    pub tokens: Vec<u32>,
    /// For each decoded token, the logits it was chosen from.
    pub logits: Vec<Vec<f32>>,
}

/// Feeds `prompt` one token at a time, then decodes `n` tokens greedily.
pub fn generate<O: Ops>(
    decoder: &mut Decoder<'_, '_, O>,
    prompt: &[u32],
    n: usize,
) -> Result<Generation, DecodeError> {
    generate_each(decoder, prompt, n, |_, _, _| Ok(()))
}

/// As [`generate`], calling `each(decoder, i, token)` after decoding token `i` (from 0): a
/// runner reports progress there, or waits.
pub fn generate_each<'m, 'o, O: Ops, E: From<DecodeError>>(
    decoder: &mut Decoder<'m, 'o, O>,
    prompt: &[u32],
    n: usize,
    mut each: impl FnMut(&Decoder<'m, 'o, O>, usize, u32) -> Result<(), E>,
) -> Result<Generation, E> {
    let Some((&last, head)) = prompt.split_last() else {
        return Err(DecodeError::Input("the prompt is empty".into()).into());
    };
    for &token in head {
        decoder.step(token)?;
    }
    let mut out = Generation {
        tokens: Vec::with_capacity(n),
        logits: Vec::with_capacity(n),
    };
    let mut next = last;
    for i in 0..n {
        out.logits.push(decoder.step(next)?.to_vec());
        next = decoder.argmax()?;
        out.tokens.push(next);
        each(decoder, i, next)?;
    }
    Ok(out)
}

/// How far logits may be from the reference's: `|got - want| <= LOGIT_TOLERANCE * max(1, |want|)`
/// (relative for logits of magnitude above 1, absolute below). The module computes in f32 with
/// sequential sums, numpy in f32 with pairwise ones; their differences are around 1e-6. The
/// same holds for every weight dtype: both sides multiply the stored values, dequantized as the
/// format defines (exact in f32), with f32 activations.
pub const LOGIT_TOLERANCE: f32 = 1e-4;

/// The numpy reference `make_tiny_llama.py` writes beside the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    /// The smallest gap between the best and the second-best logit of a decoded step.
    pub min_top2_margin: f64,
}

impl Reference {
    /// Reads `tiny-llama.reference.json`.
    pub fn read(path: &std::path::Path) -> Result<Reference, String> {
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let field = |name: &str| {
            v.get(name)
                .ok_or_else(|| format!("{}: no {name}", path.display()))
        };
        let tokens = |name: &str| -> Result<Vec<u32>, String> {
            field(name)?
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t.as_u64())
                        .map(|t| t as u32)
                        .collect()
                })
                .ok_or_else(|| format!("{}: {name} is not an array", path.display()))
        };
        let logits = field("logits")?
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|row| {
                        row.as_array()
                            .map(|r| {
                                r.iter()
                                    .filter_map(|x| x.as_f64())
                                    .map(|x| x as f32)
                                    .collect()
                            })
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .ok_or_else(|| format!("{}: logits is not an array", path.display()))?;
        Ok(Reference {
            prompt: tokens("prompt")?,
            tokens: tokens("tokens")?,
            logits,
            min_top2_margin: field("min_top2_margin")?.as_f64().unwrap_or(0.0),
        })
    }

    /// Compares a generation with this reference.
    pub fn compare(&self, got: &Generation) -> Comparison {
        let mut worst = 0.0f32;
        let mut shape_ok = got.logits.len() == self.logits.len();
        for (g, w) in got.logits.iter().zip(&self.logits) {
            shape_ok &= g.len() == w.len();
            for (a, b) in g.iter().zip(w) {
                worst = worst.max((a - b).abs() / b.abs().max(1.0));
            }
        }
        Comparison {
            tokens_match: got.tokens == self.tokens,
            logits_shape_match: shape_ok,
            max_logit_error: worst,
        }
    }
}

/// A generation against the reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    pub tokens_match: bool,
    /// As many steps as the reference, each with as many logits.
    pub logits_shape_match: bool,
    /// The largest `|got - want| / max(1, |want|)`.
    pub max_logit_error: f32,
}

impl Comparison {
    /// Equal tokens, and every logit within [`LOGIT_TOLERANCE`].
    pub fn matches(&self) -> bool {
        self.tokens_match && self.logits_shape_match && self.max_logit_error <= LOGIT_TOLERANCE
    }
}
