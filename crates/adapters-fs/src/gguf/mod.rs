//! GGUF model files (the llama.cpp format), read through the [`ModelSource`] port.
//!
//! [`GgufSource`] opens a file, reads and checks its whole header (everything before the
//! tensor data) with bounded reads, and returns a [`GgufFile`] that keeps the file open. Tensor
//! data is read lazily: the first [`ModelFile::tensor_data`] call for a tensor reads its bytes
//! with a positioned read into a buffer that the file then keeps, so later calls borrow it. The
//! crate forbids `unsafe`, so the file is not memory-mapped; a tensor costs its size in memory
//! once someone has asked for it, and nothing before that.
//!
//! # The format, as read here
//!
//! All numbers are little-endian.
//!
//! - Header: the magic `GGUF`, a `u32` version, a `u64` tensor count and a `u64` metadata count.
//! - Metadata: that many entries of a key (a GGUF string: `u64` byte length, then UTF-8 bytes,
//!   no terminator), a `u32` value type and the value. Value types are numbered as
//!   `GUILD_META_TYPE_*` numbers them: 0 `u8`, 1 `i8`, 2 `u16`, 3 `i16`, 4 `u32`, 5 `i32`,
//!   6 `f32`, 7 bool (one byte), 8 string, 9 array, 10 `u64`, 11 `i64`, 12 `f64`. An array is a
//!   `u32` element type, a `u64` length and the elements, all of that one type.
//! - Tensor infos: that many entries of a name (a GGUF string), a `u32` axis count, one `u64`
//!   extent per axis (innermost first, GGML's `ne[]`), a `u32` GGML type and a `u64` offset
//!   relative to the data section.
//! - The data section starts at the end of the tensor infos rounded up to the alignment: the
//!   `u32` value of `general.alignment`, or 32 without one. Each tensor's offset is a multiple of
//!   the alignment.
//!
//! # Decisions
//!
//! - **Versions 2 and 3 are read.** They share one layout (64-bit counts and lengths); version 3
//!   only added big-endian files, which carry no marker besides their byte order. Version 1 used
//!   32-bit counts and lengths and has not been written by llama.cpp since 2023; it is refused
//!   with [`ModelErrorKind::UnsupportedVersion`], as is every other version. A big-endian file
//!   (whose version reads byte-swapped) is refused as [`ModelErrorKind::NotAModel`] with a
//!   message saying so.
//! - **Nested arrays are refused** ([`ModelErrorKind::Malformed`]): the port's
//!   [`MetaArray`](guild_ports::model::MetaArray) has no room for them, llama.cpp refuses them
//!   too, and no known writer produces them.
//! - **Unknown GGML types are refused**, with the whole file: the type decides a tensor's byte
//!   size, and without the size neither the tensor's bounds nor its overlap with others can be
//!   checked. The known types and their block geometry are the domain's
//!   [`DType`](guild_domain::operation::DType) table; a type added there is read here.
//! - **Strings are UTF-8**, as the format requires: a key, a tensor name or a string value that
//!   is not is refused rather than repaired. Keys and tensor names may not be empty, and neither
//!   may appear twice.
//! - **A bool is 0 or 1**; another byte is refused.
//! - **`general.alignment` must be a `u32` power of two** (llama.cpp reads it as a `u32` too).
//! - **Tensors have 1 to 4 axes** (GGML's `GGML_MAX_DIMS`), each axis and their element count
//!   fit in an `i64` (each axis on its own, so that a zero axis cannot hide a huge one), and the
//!   innermost extent of a quantized type is a whole number of blocks. A tensor's
//!   byte size is its block count times its block's bytes.
//! - **Tensor data must lie inside the file and not overlap** other tensors' data (zero-sized
//!   tensors excepted). Gaps between tensors are allowed; the format does not forbid them.
//!
//! # Limits
//!
//! [`GgufLimits`] caps what a file may declare; each declared count or length is checked against
//! its limit *and* against the bytes left in the header (every element takes a known minimum
//! number of bytes) before anything is allocated for it, so a short file cannot make the reader
//! allocate more than a small multiple of its own size, and no file can make it allocate more
//! than [`GgufLimits::max_decoded_bytes`] for metadata. The defaults leave ample room for real
//! models (the largest tokenizers hold a few hundred thousand strings, a few MiB of header).
//!
//! # Errors
//!
//! Every refusal is a [`ModelError`] whose `at` is the byte offset where the offending field
//! starts and whose message names the field (the metadata key, the tensor name, the entry
//! number) and repeats the offset. Fixed-size fields that run past the end of the file are
//! [`ModelErrorKind::Truncated`]; counts, lengths and sizes that exceed a limit, the bytes left,
//! or a `u64` are [`ModelErrorKind::TooLarge`]; invalid types, structure and values are
//! [`ModelErrorKind::Malformed`]; tensor data outside the file is
//! [`ModelErrorKind::NoSuchTensor`].

mod parse;

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use guild_ports::model::{
    MetaValue, ModelError, ModelErrorKind, ModelFile, ModelSource, ModelTensor,
};

pub use parse::{DEFAULT_ALIGNMENT, MAX_DIMS};

/// What a GGUF file may declare before it is refused as too large.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufLimits {
    /// Bytes before the data section (header, metadata, tensor infos). Default 64 MiB.
    pub max_header_bytes: u64,
    /// Metadata entries. Default 65,536.
    pub max_kv_count: u64,
    /// Tensors. Default 1,048,576.
    pub max_tensor_count: u64,
    /// Bytes of one key or tensor name. Default 65,535, the format's own cap on keys.
    pub max_name_bytes: u64,
    /// Bytes of one string value or string array element. Default 16 MiB.
    pub max_string_bytes: u64,
    /// Elements of one array. Default 16,777,216.
    pub max_array_len: u64,
    /// Memory the decoded metadata and tensor descriptions may take, estimated from what is
    /// allocated for them: each entry's and tensor's records, 16 bytes per integer (or bool)
    /// array element (kept as `i128`), 8 per float element, a `String` per string element, and
    /// the bytes of every string. Default 256 MiB.
    pub max_decoded_bytes: u64,
}

impl Default for GgufLimits {
    fn default() -> Self {
        GgufLimits {
            max_header_bytes: 64 << 20,
            max_kv_count: 1 << 16,
            max_tensor_count: 1 << 20,
            max_name_bytes: 65_535,
            max_string_bytes: 16 << 20,
            max_array_len: 1 << 24,
            max_decoded_bytes: 256 << 20,
        }
    }
}

/// Opens GGUF files as [`ModelFile`]s.
#[derive(Debug, Clone, Default)]
pub struct GgufSource {
    limits: GgufLimits,
}

impl GgufSource {
    /// A source that applies `limits`.
    pub fn new(limits: GgufLimits) -> Self {
        GgufSource { limits }
    }

    /// The limits this source applies.
    pub fn limits(&self) -> &GgufLimits {
        &self.limits
    }

    /// Opens and checks the GGUF file at `path`, returning the concrete type (which also tells
    /// the version, alignment and data section start).
    pub fn open_gguf(&self, path: &Path) -> Result<GgufFile, ModelError> {
        let io_err = |what: &str, e: io::Error| ModelError {
            kind: ModelErrorKind::Io(format!("cannot {what}: {e}")),
            location: path.to_path_buf(),
            at: None,
        };
        // Refuse what is not a regular file before opening it: opening a FIFO would block.
        let meta = fs::metadata(path).map_err(|e| io_err("examine the file", e))?;
        if !meta.is_file() {
            return Err(not_a_file(path));
        }
        let file = File::open(path).map_err(|e| io_err("open the file", e))?;
        let meta = file.metadata().map_err(|e| io_err("examine the file", e))?;
        if !meta.is_file() {
            return Err(not_a_file(path));
        }
        let header = parse::read_header(&file, meta.len(), path, &self.limits)?;
        let data = header.tensors.iter().map(|_| OnceLock::new()).collect();
        Ok(GgufFile {
            location: path.to_path_buf(),
            file,
            version: header.version,
            alignment: header.alignment,
            data_start: header.data_start,
            metadata: header.metadata,
            index: header.index,
            tensors: header.tensors,
            data,
        })
    }
}

fn not_a_file(path: &Path) -> ModelError {
    ModelError {
        kind: ModelErrorKind::NotAModel("it is not a regular file".into()),
        location: path.to_path_buf(),
        at: None,
    }
}

impl ModelSource for GgufSource {
    fn open(&self, path: &Path) -> Result<Arc<dyn ModelFile>, ModelError> {
        Ok(Arc::new(self.open_gguf(path)?))
    }
}

/// An opened, checked GGUF file. Its metadata and tensor descriptions are decoded; tensor data
/// is read from the file, which stays open, the first time it is asked for.
pub struct GgufFile {
    location: PathBuf,
    file: File,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
    tensors: Vec<ModelTensor>,
    /// Each tensor's bytes, once read.
    data: Vec<OnceLock<Box<[u8]>>>,
}

impl GgufFile {
    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment: `general.alignment` or [`DEFAULT_ALIGNMENT`].
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts, from the start of the file.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    fn err(&self, kind: ModelErrorKind, at: Option<u64>) -> ModelError {
        ModelError {
            kind,
            location: self.location.clone(),
            at,
        }
    }

    /// Reads the bytes of `tensor` from the file.
    fn read_tensor(&self, tensor: &ModelTensor) -> Result<Box<[u8]>, ModelError> {
        let at = Some(tensor.offset);
        // The size was checked against the file's length when it was opened, but a file that
        // size need not fit in memory: an allocation failure is an error, not an abort.
        let len = usize::try_from(tensor.size_bytes).ok();
        let mut buf = Vec::new();
        if len.is_none_or(|n| buf.try_reserve_exact(n).is_err()) {
            return Err(self.err(
                ModelErrorKind::TooLarge(format!(
                    "tensor '{}' takes {} bytes, more than can be allocated",
                    tensor.name, tensor.size_bytes
                )),
                at,
            ));
        }
        buf.resize(len.unwrap_or_default(), 0);
        read_exact_at(&self.file, &mut buf, tensor.offset).map_err(|e| {
            let kind = if e.kind() == io::ErrorKind::UnexpectedEof {
                ModelErrorKind::Truncated(format!(
                    "the data of tensor '{}' (bytes {}..{}) is no longer in the file: it shrank \
                     after it was opened",
                    tensor.name,
                    tensor.offset,
                    tensor.offset + tensor.size_bytes
                ))
            } else {
                ModelErrorKind::Io(format!(
                    "reading the data of tensor '{}' at byte {}: {e}",
                    tensor.name, tensor.offset
                ))
            };
            self.err(kind, at)
        })?;
        Ok(buf.into_boxed_slice())
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("location", &self.location)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl ModelFile for GgufFile {
    fn location(&self) -> &Path {
        &self.location
    }

    fn keys(&self) -> Vec<&str> {
        self.metadata.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn metadata(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }

    fn tensor_data(&self, index: usize) -> Result<&[u8], ModelError> {
        let (Some(tensor), Some(slot)) = (self.tensors.get(index), self.data.get(index)) else {
            return Err(self.err(
                ModelErrorKind::NoSuchTensor(format!(
                    "tensor index {index} is out of range: the file has {} tensors",
                    self.tensors.len()
                )),
                None,
            ));
        };
        if let Some(bytes) = slot.get() {
            return Ok(bytes);
        }
        // Two threads may both read a tensor the first time; one copy is kept.
        let bytes = self.read_tensor(tensor)?;
        Ok(slot.get_or_init(|| bytes))
    }
}

/// Reads exactly `buf.len()` bytes at `offset` without moving a shared file position.
#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    file.read_exact_at(buf, offset)
}

/// Reads exactly `buf.len()` bytes at `offset`; the positioned read may read less than asked,
/// so it loops.
#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt as _;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
