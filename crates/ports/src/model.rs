//! A model file as the host reads it: typed metadata and tensor descriptions, behind a port so
//! that model runner selection does not care whether a GGUF file, another format or a test fake
//! stands behind it.
//!
//! Runners see a model only through the C reader table the app builds over a [`ModelFile`]
//! (`guild_model_reader_v1_t`); a runner that recognises the model describes it, and the host
//! keeps the file open (and its bytes mapped) while anything bound to the model lives.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One metadata value, typed as GGUF types them (and as `GUILD_META_TYPE_*` numbers them).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// An array of one element type (GGUF arrays do not mix types; nested arrays are refused by
    /// readers of this version).
    Array(MetaArray),
}

impl MetaValue {
    /// The `GUILD_META_TYPE_*` number of the value.
    pub fn type_code(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }
}

/// The elements of an array value, stored by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    /// Integer or bool elements, with the `GUILD_META_TYPE_*` they were stored as.
    Ints {
        element_type: u32,
        values: Vec<i128>,
    },
    /// Float elements, with their stored type (`FLOAT32` or `FLOAT64`).
    Floats { element_type: u32, values: Vec<f64> },
    /// String elements.
    Strings(Vec<String>),
}

impl MetaArray {
    /// The `GUILD_META_TYPE_*` of the elements.
    pub fn element_type(&self) -> u32 {
        match self {
            MetaArray::Ints { element_type, .. } | MetaArray::Floats { element_type, .. } => {
                *element_type
            }
            MetaArray::Strings(_) => 8,
        }
    }

    /// How many elements there are.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::Ints { values, .. } => values.len(),
            MetaArray::Floats { values, .. } => values.len(),
            MetaArray::Strings(values) => values.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One tensor stored in a model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensor {
    /// Its name in the file.
    pub name: String,
    /// Its element type as a `GUILD_DTYPE_*` (GGML) id.
    pub dtype: u32,
    /// Extent of each axis, innermost first (GGUF's `ne[]` order); 1 to 8 axes.
    pub dims: Vec<u64>,
    /// Bytes its data takes in the file.
    pub size_bytes: u64,
    /// Where its data starts, from the start of the file.
    pub offset: u64,
}

/// An opened model file: what a runner may ask about it. Implementations are immutable once
/// opened and safe to share between threads.
pub trait ModelFile: Send + Sync + fmt::Debug {
    /// The file (or files) it was read from, for messages.
    fn location(&self) -> &Path;

    /// Every metadata key, in file order.
    fn keys(&self) -> Vec<&str>;

    /// The value of `key`, if present.
    fn metadata(&self, key: &str) -> Option<&MetaValue>;

    /// Every tensor, in file order.
    fn tensors(&self) -> &[ModelTensor];

    /// The bytes of tensor `index` (as in [`ModelFile::tensors`]), borrowed from the file's
    /// mapping or buffer.
    fn tensor_data(&self, index: usize) -> Result<&[u8], ModelError>;
}

/// Opens model files.
pub trait ModelSource: Send + Sync + fmt::Debug {
    /// Opens and checks the model at `path`. Nothing of the model is trusted before this
    /// returns: every count, size and offset is checked against the file.
    fn open(&self, path: &Path) -> Result<Arc<dyn ModelFile>, ModelError>;
}

/// Why a model file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{location}: {kind}{}", at.as_ref().map(|a| format!(" (at byte {a})")).unwrap_or_default())]
pub struct ModelError {
    /// What went wrong.
    pub kind: ModelErrorKind,
    /// The file.
    pub location: PathBuf,
    /// The byte offset where reading failed, when known.
    pub at: Option<u64>,
}

/// The kinds of [`ModelError`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelErrorKind {
    /// The file cannot be opened or read.
    #[error("cannot be read: {0}")]
    Io(String),
    /// The file is not in a format this reader knows (bad magic).
    #[error("is not a model file this host reads: {0}")]
    NotAModel(String),
    /// The format's version is not one this reader knows.
    #[error("format version {0} is not supported")]
    UnsupportedVersion(u32),
    /// The file ends before a structure it declares.
    #[error("is truncated: {0}")]
    Truncated(String),
    /// A count, length or size is larger than the file or a safety limit allows.
    #[error("declares too much: {0}")]
    TooLarge(String),
    /// A value type, dtype or structure is invalid.
    #[error("is malformed: {0}")]
    Malformed(String),
    /// A tensor index was out of range, or its data lies outside the file.
    #[error("has no such tensor data: {0}")]
    NoSuchTensor(String),
}
