//! The GGUF header parser: everything before the tensor data, read with bounded reads.
//!
//! The parser reads through a buffered reader that keeps its own position, so every error can
//! name the byte where the offending field starts. Before anything is allocated from a declared
//! count or length, the declaration is checked against three things: its own limit, the bytes
//! left in the header (each element takes a known minimum number of bytes, so a count that
//! cannot fit is refused before a single element is read), and the memory budget for decoded
//! metadata (decoded values can be larger than their encoding: a one-byte integer element is kept
//! as an `i128`).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::mem::size_of;
use std::path::Path;
use std::sync::OnceLock;

use guild_domain::operation::DType;
use guild_ports::model::{MetaArray, MetaValue, ModelError, ModelErrorKind, ModelTensor};

use super::GgufLimits;

/// `GGUF` as the first four bytes of the file.
pub(super) const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of the data section and of each tensor's data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides the alignment.
pub(super) const ALIGNMENT_KEY: &str = "general.alignment";
/// GGML's `GGML_MAX_DIMS`: GGUF tensors have one to four axes.
pub const MAX_DIMS: u32 = 4;
/// The fixed header: magic, version, tensor count, metadata count.
const FIXED_HEADER: u64 = 24;
/// The fewest bytes one metadata entry takes: key length, value type and a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes one tensor info takes: name length, axis count, one axis, type and offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;
/// Memory one metadata entry's records take: its slot in the entry list and in the key index.
const KV_RECORD_BYTES: u64 =
    (size_of::<(String, MetaValue)>() + size_of::<(String, usize)>() + 8) as u64;
/// Memory one tensor's records take: the description, the data slot, the offset field's
/// position and the duplicate check's entry.
const TENSOR_RECORD_BYTES: u64 =
    (size_of::<ModelTensor>() + size_of::<OnceLock<Box<[u8]>>>() + 8 + size_of::<String>() + 8)
        as u64;
/// How much of the header is buffered per read.
const READ_BUFFER: usize = 64 * 1024;

/// Metadata value types, as GGUF numbers them.
mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The encoded size of a scalar value type, `None` for strings, arrays and unknown types.
fn scalar_size(value_type: u32) -> Option<u64> {
    match value_type {
        ty::U8 | ty::I8 | ty::BOOL => Some(1),
        ty::U16 | ty::I16 => Some(2),
        ty::U32 | ty::I32 | ty::F32 => Some(4),
        ty::U64 | ty::I64 | ty::F64 => Some(8),
        _ => None,
    }
}

/// What the parser found before the tensor data.
#[derive(Debug)]
pub(super) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub index: HashMap<String, usize>,
    pub tensors: Vec<ModelTensor>,
    pub alignment: u64,
    /// Where the data section starts: the end of the tensor infos, rounded up to the alignment.
    pub data_start: u64,
}

/// Which string is being read, for messages (built only when one is needed).
#[derive(Clone, Copy)]
enum Field<'a> {
    Key(u64),
    Value(&'a str),
    Element(&'a str, u64),
    TensorName(u64),
}

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Key(i) => write!(f, "the key of metadata entry #{i}"),
            Field::Value(key) => write!(f, "the value of '{key}'"),
            Field::Element(key, i) => write!(f, "element #{i} of '{key}'"),
            Field::TensorName(i) => write!(f, "the name of tensor #{i}"),
        }
    }
}

/// A reader over the header that knows its position, the file's length, the header limit and
/// the memory budget left.
struct Reader<'a> {
    inner: BufReader<&'a File>,
    location: &'a Path,
    limits: &'a GgufLimits,
    pos: u64,
    file_len: u64,
    /// The header may not extend past this: the file's length or the header limit.
    end: u64,
    /// Bytes of memory decoded metadata may still take.
    budget: u64,
}

type Result<T> = std::result::Result<T, ModelError>;

impl<'a> Reader<'a> {
    fn err(&self, kind: ModelErrorKind, at: u64) -> ModelError {
        ModelError {
            kind,
            location: self.location.to_path_buf(),
            at: Some(at),
        }
    }

    /// Why `need` bytes from the current position are not available.
    fn short(&self, need: u64, what: &dyn fmt::Display) -> ModelError {
        let at = self.pos;
        if at.saturating_add(need) > self.file_len {
            self.err(
                ModelErrorKind::Truncated(format!(
                    "{what} needs {need} bytes at byte {at}, but the file is {} bytes long",
                    self.file_len
                )),
                at,
            )
        } else {
            self.err(
                ModelErrorKind::TooLarge(format!(
                    "{what} at byte {at} lies past the {}-byte header limit",
                    self.limits.max_header_bytes
                )),
                at,
            )
        }
    }

    /// The bytes left before the header's end.
    fn remaining(&self) -> u64 {
        self.end.saturating_sub(self.pos)
    }

    /// Where the remaining bytes end, for messages.
    fn end_name(&self) -> &'static str {
        if self.end < self.file_len {
            "the header limit"
        } else {
            "the end of the file"
        }
    }

    /// Reads `buf.len()` bytes, refusing to go past the header's end.
    fn read_into(&mut self, buf: &mut [u8], what: &dyn fmt::Display) -> Result<()> {
        let need = buf.len() as u64;
        if need > self.remaining() {
            return Err(self.short(need, what));
        }
        if let Err(e) = self.inner.read_exact(buf) {
            let at = self.pos;
            return Err(match e.kind() {
                // The file was shorter than its length said: it shrank while being read.
                io::ErrorKind::UnexpectedEof => self.err(
                    ModelErrorKind::Truncated(format!(
                        "{what} at byte {at} is cut short: the file shrank while it was read"
                    )),
                    at,
                ),
                _ => self.err(
                    ModelErrorKind::Io(format!("reading {what} at byte {at}: {e}")),
                    at,
                ),
            });
        }
        self.pos += need;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &dyn fmt::Display) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.read_into(&mut buf, what)?;
        Ok(buf)
    }

    fn u8(&mut self, what: &dyn fmt::Display) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &dyn fmt::Display) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn fmt::Display) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Takes `bytes` from the decoded-metadata budget.
    fn charge(&mut self, bytes: u64, at: u64, what: &dyn fmt::Display) -> Result<()> {
        if bytes > self.budget {
            return Err(self.err(
                ModelErrorKind::TooLarge(format!(
                    "{what} at byte {at} would take the decoded metadata past its {}-byte memory \
                     limit",
                    self.limits.max_decoded_bytes
                )),
                at,
            ));
        }
        self.budget -= bytes;
        Ok(())
    }

    /// Reads a count or length: at most `max`, and `count * min_bytes` must fit in the bytes
    /// left, so nothing is allocated for elements the file cannot hold.
    fn count(&mut self, what: &dyn fmt::Display, max: u64, min_bytes: u64) -> Result<u64> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > max {
            return Err(self.err(
                ModelErrorKind::TooLarge(format!(
                    "{what} at byte {at} is {n}, more than the limit of {max}"
                )),
                at,
            ));
        }
        let need = n.saturating_mul(min_bytes);
        if need > self.remaining() {
            return Err(self.err(
                ModelErrorKind::TooLarge(format!(
                    "{what} at byte {at} is {n}, which needs at least {need} bytes, but only {} \
                     remain before {}",
                    self.remaining(),
                    self.end_name()
                )),
                at,
            ));
        }
        Ok(n)
    }

    /// Reads a GGUF string (a `u64` length and UTF-8 bytes) of at most `max` bytes.
    fn string(&mut self, field: Field<'_>, max: u64) -> Result<String> {
        let at = self.pos;
        let len = self.count(&format_args!("the length of {field}"), max, 1)?;
        // The `String` itself was counted with the record that holds it.
        self.charge(len, at, &format_args!("{field}"))?;
        // `count` checked `len` against the bytes left in the header, which fit in memory.
        let mut bytes = vec![0u8; len as usize];
        self.read_into(&mut bytes, &format_args!("{field}"))?;
        String::from_utf8(bytes).map_err(|e| {
            self.err(
                ModelErrorKind::Malformed(format!(
                    "{field} at byte {at} is not UTF-8 (invalid byte at position {})",
                    e.utf8_error().valid_up_to()
                )),
                at,
            )
        })
    }

    /// Reads one scalar of a known scalar type.
    fn scalar(&mut self, value_type: u32, key: &str) -> Result<MetaValue> {
        let what = Field::Value(key);
        let at = self.pos;
        Ok(match value_type {
            ty::U8 => MetaValue::U8(self.u8(&what)?),
            ty::I8 => MetaValue::I8(i8::from_le_bytes(self.array(&what)?)),
            ty::U16 => MetaValue::U16(u16::from_le_bytes(self.array(&what)?)),
            ty::I16 => MetaValue::I16(i16::from_le_bytes(self.array(&what)?)),
            ty::U32 => MetaValue::U32(self.u32(&what)?),
            ty::I32 => MetaValue::I32(i32::from_le_bytes(self.array(&what)?)),
            ty::F32 => MetaValue::F32(f32::from_le_bytes(self.array(&what)?)),
            ty::BOOL => MetaValue::Bool(self.bool(at, &what)?),
            ty::U64 => MetaValue::U64(self.u64(&what)?),
            ty::I64 => MetaValue::I64(i64::from_le_bytes(self.array(&what)?)),
            ty::F64 => MetaValue::F64(f64::from_le_bytes(self.array(&what)?)),
            _ => return Err(self.bad_type(value_type, key, at)),
        })
    }

    /// A GGUF bool is one byte, 0 or 1; any other byte is refused rather than guessed at.
    fn bool(&mut self, at: u64, what: &dyn fmt::Display) -> Result<bool> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(
                ModelErrorKind::Malformed(format!(
                    "{what} at byte {at} is a bool stored as {b}; only 0 and 1 are bools"
                )),
                at,
            )),
        }
    }

    fn bad_type(&self, value_type: u32, key: &str, at: u64) -> ModelError {
        self.err(
            ModelErrorKind::Malformed(format!(
                "'{key}' has value type {value_type} at byte {at}, which is not a GGUF type"
            )),
            at,
        )
    }

    /// Reads a value of `value_type` (already read, at `type_at`).
    fn value(&mut self, value_type: u32, key: &str, type_at: u64) -> Result<MetaValue> {
        match value_type {
            ty::STRING => Ok(MetaValue::Str(
                self.string(Field::Value(key), self.limits.max_string_bytes)?,
            )),
            ty::ARRAY => self.array_value(key),
            t if scalar_size(t).is_some() => self.scalar(t, key),
            t => Err(self.bad_type(t, key, type_at)),
        }
    }

    /// Reads an array: element type, length, elements. Arrays of arrays are refused.
    fn array_value(&mut self, key: &str) -> Result<MetaValue> {
        let type_at = self.pos;
        let element_type = self.u32(&format_args!("the element type of '{key}'"))?;
        if element_type == ty::ARRAY {
            return Err(self.err(
                ModelErrorKind::Malformed(format!(
                    "'{key}' is an array of arrays (element type at byte {type_at}); nested \
                     arrays are not supported"
                )),
                type_at,
            ));
        }
        let (min_bytes, decoded) = match element_type {
            ty::STRING => (8, size_of::<String>() as u64),
            ty::F32 | ty::F64 => (scalar_size(element_type).unwrap_or(8), 8),
            t => match scalar_size(t) {
                Some(size) => (size, 16),
                None => {
                    return Err(self.err(
                        ModelErrorKind::Malformed(format!(
                            "'{key}' has array element type {t} at byte {type_at}, which is not \
                             a GGUF type"
                        )),
                        type_at,
                    ))
                }
            },
        };
        let len_at = self.pos;
        let len = self.count(
            &format_args!("the length of array '{key}'"),
            self.limits.max_array_len,
            min_bytes,
        )?;
        self.charge(
            len.saturating_mul(decoded),
            len_at,
            &format_args!("array '{key}' of {len} elements"),
        )?;
        self.array_elements(key, element_type, len)
            .map(MetaValue::Array)
    }

    /// Reads the `len` elements of array `key`, of the scalar or string type `element_type`;
    /// `len` was checked against the bytes left and charged to the budget.
    fn array_elements(&mut self, key: &str, element_type: u32, len: u64) -> Result<MetaArray> {
        // The length fits in the header's remaining bytes, so it fits in a usize.
        let n = len as usize;
        Ok(match element_type {
            ty::STRING => {
                let mut values = Vec::with_capacity(n);
                for i in 0..len {
                    values.push(self.string(Field::Element(key, i), self.limits.max_string_bytes)?);
                }
                MetaArray::Strings(values)
            }
            ty::F32 | ty::F64 => {
                let mut values = Vec::with_capacity(n);
                for i in 0..len {
                    let what = Field::Element(key, i);
                    values.push(if element_type == ty::F32 {
                        f64::from(f32::from_le_bytes(self.array(&what)?))
                    } else {
                        f64::from_le_bytes(self.array(&what)?)
                    });
                }
                MetaArray::Floats {
                    element_type,
                    values,
                }
            }
            _ => {
                let mut values = Vec::with_capacity(n);
                for i in 0..len {
                    let at = self.pos;
                    let what = Field::Element(key, i);
                    values.push(match element_type {
                        ty::U8 => i128::from(self.u8(&what)?),
                        ty::I8 => i128::from(i8::from_le_bytes(self.array(&what)?)),
                        ty::U16 => i128::from(u16::from_le_bytes(self.array(&what)?)),
                        ty::I16 => i128::from(i16::from_le_bytes(self.array(&what)?)),
                        ty::U32 => i128::from(self.u32(&what)?),
                        ty::I32 => i128::from(i32::from_le_bytes(self.array(&what)?)),
                        ty::U64 => i128::from(self.u64(&what)?),
                        ty::I64 => i128::from(i64::from_le_bytes(self.array(&what)?)),
                        _ => i128::from(self.bool(at, &what)?),
                    });
                }
                MetaArray::Ints {
                    element_type,
                    values,
                }
            }
        })
    }

    /// Reads one tensor info; `offset` in the result is still relative to the data section.
    /// Also returns where the offset field was, for later messages.
    fn tensor_info(&mut self, index: u64, alignment: u64) -> Result<(ModelTensor, u64)> {
        let name_at = self.pos;
        let name = self.string(Field::TensorName(index), self.limits.max_name_bytes)?;
        if name.is_empty() {
            return Err(self.err(
                ModelErrorKind::Malformed(format!("tensor #{index} at byte {name_at} has no name")),
                name_at,
            ));
        }
        let dims_at = self.pos;
        let n_dims = self.u32(&format_args!("the axis count of tensor '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(self.err(
                ModelErrorKind::Malformed(format!(
                    "tensor '{name}' declares {n_dims} axes at byte {dims_at}; GGUF tensors have \
                     1 to {MAX_DIMS}"
                )),
                dims_at,
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for axis in 0..n_dims {
            dims.push(self.u64(&format_args!("axis {axis} of tensor '{name}'"))?);
        }
        let type_at = self.pos;
        let raw_type = self.u32(&format_args!("the type of tensor '{name}'"))?;
        let offset_at = self.pos;
        let offset = self.u64(&format_args!("the data offset of tensor '{name}'"))?;

        let size_bytes = self.tensor_size(&name, &dims, dims_at, raw_type, type_at)?;
        if !offset.is_multiple_of(alignment) {
            return Err(self.err(
                ModelErrorKind::Malformed(format!(
                    "tensor '{name}' has data offset {offset} at byte {offset_at}, not a multiple \
                     of the alignment {alignment}"
                )),
                offset_at,
            ));
        }
        // The name twice (the tensor's and the duplicate check's copy), and the extents.
        self.charge(
            (2 * name.len() + 8 * dims.len()) as u64,
            name_at,
            &format_args!("tensor '{name}'"),
        )?;
        Ok((
            ModelTensor {
                name,
                dtype: raw_type,
                dims,
                size_bytes,
                offset,
            },
            offset_at,
        ))
    }

    /// The bytes of data of tensor `name` with extents `dims` (axis count at `dims_at`) and
    /// ggml type `raw_type` (at `type_at`): its element count must fit in an `i64`, its type
    /// must be known, and its innermost axis must hold whole blocks.
    fn tensor_size(
        &self,
        name: &str,
        dims: &[u64],
        dims_at: u64,
        raw_type: u32,
        type_at: u64,
    ) -> Result<u64> {
        // GGML holds each axis in an int64_t. An axis that does not fit is refused on its own,
        // as llama.cpp does: the product below is zero whenever some other axis is, and must not
        // hide it.
        if let Some((axis, &extent)) = dims.iter().enumerate().find(|(_, &d)| d > i64::MAX as u64) {
            let axis_at = dims_at + 4 + 8 * axis as u64;
            return Err(self.err(
                ModelErrorKind::TooLarge(format!(
                    "tensor '{name}' has axis {axis} of {extent} (at byte {axis_at}), above \
                     i64::MAX: its element count overflows"
                )),
                axis_at,
            ));
        }
        // GGML counts elements in an int64_t; a tensor whose element count does not fit is refused.
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                self.err(
                    ModelErrorKind::TooLarge(format!(
                        "tensor '{name}' has axes {dims:?} (at byte {}) whose element count \
                         overflows",
                        dims_at + 4
                    )),
                    dims_at + 4,
                )
            })?;
        let dtype = DType::from_raw(raw_type);
        let block = dtype.block().ok_or_else(|| {
            self.err(
                ModelErrorKind::Malformed(format!(
                    "tensor '{name}' has ggml type {raw_type} at byte {type_at}, which this host \
                     does not know (its size cannot be computed)"
                )),
                type_at,
            )
        })?;
        let per_block = u64::from(block.elements);
        if !dims[0].is_multiple_of(per_block) {
            return Err(self.err(
                ModelErrorKind::Malformed(format!(
                    "tensor '{name}' ({dtype}) has {} elements on its innermost axis (at byte {}), \
                     not a whole number of {per_block}-element blocks",
                    dims[0],
                    dims_at + 4
                )),
                dims_at + 4,
            ));
        }
        // Cannot overflow: the byte count is at most the element count times the block's bytes
        // over its elements, both small, but it is checked all the same.
        (elements / per_block)
            .checked_mul(u64::from(block.bytes))
            .ok_or_else(|| {
                self.err(
                    ModelErrorKind::TooLarge(format!(
                        "tensor '{name}' with axes {dims:?} (at byte {}) takes more bytes than a \
                         u64 counts",
                        dims_at + 4
                    )),
                    dims_at + 4,
                )
            })
    }
}

/// Reads and checks the header of the GGUF file `file` (`file_len` bytes long).
pub(super) fn read_header(
    file: &File,
    file_len: u64,
    location: &Path,
    limits: &GgufLimits,
) -> Result<Header> {
    let mut r = Reader {
        inner: BufReader::with_capacity(READ_BUFFER, file),
        location,
        limits,
        pos: 0,
        file_len,
        end: file_len.min(limits.max_header_bytes),
        budget: limits.max_decoded_bytes,
    };

    if file_len < FIXED_HEADER {
        return Err(r.err(
            ModelErrorKind::Truncated(format!(
                "the file is {file_len} bytes long; a GGUF header takes at least {FIXED_HEADER}"
            )),
            file_len,
        ));
    }
    let version = read_magic_and_version(&mut r)?;
    let (tensor_count, kv_count) = read_counts(&mut r)?;
    let Metadata {
        entries: metadata,
        index,
        alignment,
    } = read_metadata(&mut r, kv_count)?;
    let (mut tensors, offset_fields) = read_tensor_infos(&mut r, tensor_count, alignment)?;
    let data_start = r.pos.div_ceil(alignment).saturating_mul(alignment);
    place_tensors(&r, &mut tensors, &offset_fields, data_start)?;
    Ok(Header {
        version,
        metadata,
        index,
        tensors,
        alignment,
        data_start,
    })
}

/// Reads the magic and the version, refusing anything but a little-endian GGUF file of
/// version 2 or 3.
fn read_magic_and_version(r: &mut Reader<'_>) -> Result<u32> {
    let magic: [u8; 4] = r.array(&"the magic")?;
    if magic != MAGIC {
        return Err(r.err(
            ModelErrorKind::NotAModel(format!(
                "the file starts with \"{}\", not the GGUF magic \"GGUF\"",
                magic.escape_ascii()
            )),
            0,
        ));
    }
    let version = r.u32(&"the version")?;
    match version {
        2 | 3 => Ok(version),
        // A big-endian file's version reads byte-swapped.
        0x0200_0000 | 0x0300_0000 => Err(r.err(
            ModelErrorKind::NotAModel(
                "the file is a big-endian GGUF file; only little-endian files are read".into(),
            ),
            4,
        )),
        v => Err(r.err(ModelErrorKind::UnsupportedVersion(v), 4)),
    }
}

/// Reads the tensor count and the metadata count, checks that the fewest bytes their entries
/// take fit in the header, and charges their records to the memory budget up front (they are
/// allocated up front). Answers `(tensor_count, kv_count)`.
fn read_counts(r: &mut Reader<'_>) -> Result<(u64, u64)> {
    let limits = r.limits;
    let tensor_count = r.count(
        &"the tensor count",
        limits.max_tensor_count,
        MIN_TENSOR_INFO_BYTES,
    )?;
    // What the metadata may use: the tensor infos still have to follow it.
    let kv_count_at = r.pos;
    let kv_count = r.count(&"the metadata count", limits.max_kv_count, MIN_KV_BYTES)?;
    let need = kv_count
        .saturating_mul(MIN_KV_BYTES)
        .saturating_add(tensor_count.saturating_mul(MIN_TENSOR_INFO_BYTES));
    if need > r.remaining() {
        return Err(r.err(
            ModelErrorKind::TooLarge(format!(
                "{kv_count} metadata entries (count at byte {kv_count_at}) and {tensor_count} \
                 tensors need at least {need} bytes, but only {} remain before {}",
                r.remaining(),
                r.end_name()
            )),
            kv_count_at,
        ));
    }

    // The records are allocated up front, so they are paid for up front.
    r.charge(
        tensor_count.saturating_mul(TENSOR_RECORD_BYTES),
        8,
        &format_args!("the tensor count {tensor_count}"),
    )?;
    r.charge(
        kv_count.saturating_mul(KV_RECORD_BYTES),
        kv_count_at,
        &format_args!("the metadata count {kv_count}"),
    )?;
    Ok((tensor_count, kv_count))
}

/// The metadata entries, in file order, with the index of their keys and the alignment they set.
struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
    alignment: u64,
}

/// Reads `kv_count` metadata entries, refusing an empty or repeated key, and takes the
/// alignment from `general.alignment` when it is there.
fn read_metadata(r: &mut Reader<'_>, kv_count: u64) -> Result<Metadata> {
    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(kv_count as usize);
    let mut index = HashMap::with_capacity(kv_count as usize);
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..kv_count {
        let key_at = r.pos;
        let key = r.string(Field::Key(i), r.limits.max_name_bytes)?;
        // The index keeps a second copy.
        r.charge(key.len() as u64, key_at, &Field::Key(i))?;
        if key.is_empty() {
            return Err(r.err(
                ModelErrorKind::Malformed(format!(
                    "metadata entry #{i} at byte {key_at} has an empty key"
                )),
                key_at,
            ));
        }
        if index.contains_key(&key) {
            return Err(r.err(
                ModelErrorKind::Malformed(format!(
                    "metadata key '{key}' at byte {key_at} appears a second time"
                )),
                key_at,
            ));
        }
        let type_at = r.pos;
        let value_type = r.u32(&format_args!("the value type of '{key}'"))?;
        let value_at = r.pos;
        let value = r.value(value_type, &key, type_at)?;
        if key == ALIGNMENT_KEY {
            alignment = alignment_of(r, &value, type_at, value_at)?;
        }
        index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    Ok(Metadata {
        entries: metadata,
        index,
        alignment,
    })
}

/// The alignment that `general.alignment`'s `value` (type at `type_at`, value at `value_at`)
/// sets: a uint32 power of two.
fn alignment_of(r: &Reader<'_>, value: &MetaValue, type_at: u64, value_at: u64) -> Result<u64> {
    match *value {
        MetaValue::U32(a) if a != 0 && a.is_power_of_two() => Ok(u64::from(a)),
        MetaValue::U32(a) => Err(r.err(
            ModelErrorKind::Malformed(format!(
                "'{ALIGNMENT_KEY}' at byte {value_at} is {a}, not a power of two"
            )),
            value_at,
        )),
        ref other => Err(r.err(
            ModelErrorKind::Malformed(format!(
                "'{ALIGNMENT_KEY}' at byte {type_at} has value type {}, not uint32",
                other.type_code()
            )),
            type_at,
        )),
    }
}

/// Reads `tensor_count` tensor infos, refusing a repeated name. Answers the tensors, their
/// offsets still relative to the data section, and where each offset field was.
fn read_tensor_infos(
    r: &mut Reader<'_>,
    tensor_count: u64,
    alignment: u64,
) -> Result<(Vec<ModelTensor>, Vec<u64>)> {
    let mut tensors = Vec::with_capacity(tensor_count as usize);
    let mut offset_fields = Vec::with_capacity(tensor_count as usize);
    let mut names = HashSet::with_capacity(tensor_count as usize);
    for i in 0..tensor_count {
        let name_at = r.pos;
        let (tensor, offset_at) = r.tensor_info(i, alignment)?;
        if !names.insert(tensor.name.clone()) {
            return Err(r.err(
                ModelErrorKind::Malformed(format!(
                    "tensor name '{}' at byte {name_at} appears a second time",
                    tensor.name
                )),
                name_at,
            ));
        }
        tensors.push(tensor);
        offset_fields.push(offset_at);
    }
    Ok((tensors, offset_fields))
}

/// Turns each tensor's offset into a file offset and checks that its data lies inside the file
/// and that no two tensors' data overlap.
fn place_tensors(
    r: &Reader<'_>,
    tensors: &mut [ModelTensor],
    offset_fields: &[u64],
    data_start: u64,
) -> Result<()> {
    for (tensor, &field) in tensors.iter_mut().zip(offset_fields) {
        let start = data_start.checked_add(tensor.offset);
        let end = start.and_then(|s| s.checked_add(tensor.size_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= r.file_len => tensor.offset = start,
            _ => {
                return Err(r.err(
                    ModelErrorKind::NoSuchTensor(format!(
                        "tensor '{}' (offset field at byte {field}) claims {} bytes at data \
                         offset {} (file offset {}), past the end of the {}-byte file",
                        tensor.name,
                        tensor.size_bytes,
                        tensor.offset,
                        data_start as u128 + u128::from(tensor.offset),
                        r.file_len
                    )),
                    field,
                ))
            }
        }
    }
    // In order of start, each tensor must start at or after the furthest end seen so far.
    // Zero-sized tensors occupy nothing and overlap nothing.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].size_bytes > 0)
        .collect();
    order.sort_by_key(|&i| tensors[i].offset);
    let mut furthest: Option<usize> = None;
    for &i in &order {
        let b = &tensors[i];
        if let Some(f) = furthest {
            let a = &tensors[f];
            let a_end = a.offset + a.size_bytes;
            if b.offset < a_end {
                let field = offset_fields[i];
                return Err(r.err(
                    ModelErrorKind::Malformed(format!(
                        "the data of tensor '{}' (bytes {}..{}, offset field at byte {field}) \
                         overlaps that of tensor '{}' (bytes {}..{a_end})",
                        b.name,
                        b.offset,
                        b.offset + b.size_bytes,
                        a.name,
                        a.offset,
                    )),
                    field,
                ));
            }
        }
        // With no overlap, the tensor just checked ends furthest.
        furthest = Some(i);
    }
    Ok(())
}
