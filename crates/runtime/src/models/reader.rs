//! The C model reader: `guild_model_reader_v1_t` over a [`ModelFile`], the read-only view of a
//! model that runners recognise, describe and validate it through.
//!
//! Every getter follows the header's rules exactly. On success it writes its outputs and returns
//! `GUILD_STATUS_OK`; on a failure it writes nothing and returns, checked in this order:
//! 1. `GUILD_STATUS_ERR_INVALID_ARGUMENT` for a `ctx` that is not a live reader, a NULL key,
//!    name or output pointer, or a key or name that is not NUL-terminated UTF-8 within
//!    [`MAX_READER_STRING`] bytes;
//! 2. `GUILD_STATUS_ERR_NOT_FOUND` when no metadata key or tensor has that name;
//! 3. `GUILD_STATUS_ERR_UNSUPPORTED` when the value has another type than the getter reads, or a
//!    value (or any one array element asked for) does not fit the output type;
//! 4. `GUILD_STATUS_ERR_INVALID_ARGUMENT` for an array range or element index past the end, or a
//!    tensor position past the last tensor;
//! 5. `GUILD_STATUS_ERR_BUFFER_TOO_SMALL` from the string getters, which then write the string's
//!    length (without the NUL, so the buffer needs one byte more) to `*out_length` and nothing
//!    else: the one output written on a failure.
//!
//! A NULL buffer is accepted only with a zero size or count: `get_string(ctx, key, NULL, 0,
//! &len)` is how a caller asks for a length first. Integers and bools convert to `int64_t` or
//! `uint64_t` when the value fits (a bool reads as 0 or 1); `get_float` reads only `FLOAT32` and
//! `FLOAT64` values. A tensor whose rank is outside `1..=GUILD_MAX_TENSOR_RANK`, or whose name
//! holds a NUL byte, cannot be described in the C record and reads as
//! `GUILD_STATUS_ERR_UNSUPPORTED`. A string value is copied byte for byte, NUL bytes inside it
//! included; `*out_length` says how many bytes it has.
//!
//! No panic leaves a getter: each one catches it and returns `GUILD_STATUS_ERR_INTERNAL`.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::{Arc, OnceLock};

use guild_abi::text::bounded_str;
use guild_abi::{
    guild_model_reader_v1_t, guild_model_tensor_info_v1_t, guild_status_t, GUILD_MAX_TENSOR_RANK,
    GUILD_MODEL_READER_VERSION, GUILD_STATUS_ERR_BUFFER_TOO_SMALL, GUILD_STATUS_ERR_INTERNAL,
    GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_ERR_NOT_FOUND, GUILD_STATUS_ERR_UNSUPPORTED,
    GUILD_STATUS_OK,
};
use guild_ports::model::{MetaArray, MetaValue, ModelFile, ModelTensor};

/// The longest key or tensor name, in bytes without the terminator, that a getter reads from
/// its caller. GGUF keys and tensor names are far shorter; the bound turns a missing terminator
/// into a refusal instead of a walk through the caller's memory.
pub const MAX_READER_STRING: usize = 4096;

/// Marks a live reader state, so that a `ctx` that is not one is refused rather than read.
const READER_TAG: u64 = u64::from_be_bytes(*b"guild.mr");

/// What a reader's `ctx` points at. `repr(C)` with the tag first, so that checking a caller's
/// pointer reads only its first eight bytes before anything else is trusted.
#[repr(C)]
struct ReaderState {
    tag: u64,
    model: Arc<dyn ModelFile>,
    /// Tensor positions by name; the first of two equal names wins.
    by_name: HashMap<String, usize>,
    /// Each tensor's name as a C string, made the first time a getter hands it out, so that
    /// the pointer stays valid (and unchanged) for as long as the state lives.
    names: Vec<OnceLock<Option<CString>>>,
}

/// The host's reader over one model: the state behind the C table's `ctx`, and the table.
///
/// The state lives until the reader is dropped; [`ModelReader::table`] returns a table whose
/// `ctx` points at it. The header makes a reader valid for one callback only, and the runner
/// registry hands each callback a fresh copy of the table, so a runner that keeps one breaks
/// the contract even while the state happens to live on.
pub struct ModelReader {
    /// From `Box::leak`, freed in `Drop`. Held as a raw pointer rather than a `Box`, because a
    /// `Box` asserts unique access when it moves, which would invalidate the `ctx` pointers the
    /// tables hold; the state is only ever read through shared references.
    state: NonNull<ReaderState>,
}

// SAFETY: the state is immutable after construction except for the `OnceLock` cells, which are
// thread-safe; the model is `Send + Sync` by the port's bounds.
unsafe impl Send for ModelReader {}
// SAFETY: as for Send: every access through a shared reference is a read or a `OnceLock` init.
unsafe impl Sync for ModelReader {}

impl fmt::Debug for ModelReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelReader")
            .field("model", &self.model().location())
            .finish_non_exhaustive()
    }
}

impl ModelReader {
    /// A reader over `model`.
    pub fn new(model: Arc<dyn ModelFile>) -> Self {
        let tensors = model.tensors();
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (index, tensor) in tensors.iter().enumerate() {
            by_name.entry(tensor.name.clone()).or_insert(index);
        }
        let names = tensors.iter().map(|_| OnceLock::new()).collect();
        let state = ReaderState {
            tag: READER_TAG,
            model,
            by_name,
            names,
        };
        ModelReader {
            state: NonNull::from(Box::leak(Box::new(state))),
        }
    }

    fn state(&self) -> &ReaderState {
        // SAFETY: the pointer came from Box::leak in `new`, is freed only in Drop, and the
        // state is only read (or its OnceLock cells initialised) through shared references.
        unsafe { self.state.as_ref() }
    }

    /// The model this reader reads.
    pub fn model(&self) -> &Arc<dyn ModelFile> {
        &self.state().model
    }

    /// A C table over this reader, every entry filled. Its `ctx` points into this reader, so
    /// the table must not be used after the reader is dropped.
    pub fn table(&self) -> guild_model_reader_v1_t {
        guild_model_reader_v1_t {
            struct_size: size_of::<guild_model_reader_v1_t>() as u32,
            version: GUILD_MODEL_READER_VERSION,
            ctx: self.state.as_ptr().cast(),
            find_key: Some(reader_find_key),
            get_int: Some(reader_get_int),
            get_uint: Some(reader_get_uint),
            get_float: Some(reader_get_float),
            get_string: Some(reader_get_string),
            get_array_info: Some(reader_get_array_info),
            get_array_ints: Some(reader_get_array_ints),
            get_array_uints: Some(reader_get_array_uints),
            get_array_floats: Some(reader_get_array_floats),
            get_array_string: Some(reader_get_array_string),
            tensor_count: Some(reader_tensor_count),
            find_tensor: Some(reader_find_tensor),
            tensor_at: Some(reader_tensor_at),
        }
    }
}

impl Drop for ModelReader {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::leak in `new` and is freed exactly once, here.
        let mut state = unsafe { Box::from_raw(self.state.as_ptr()) };
        // A table kept past its callback now finds no tag instead of a reader (for as long as
        // the allocator leaves the bytes alone; keeping a table is the caller's breach).
        state.tag = 0;
        drop(state);
    }
}

// ---------------------------------------------------------------------------------------------
// Shared checks
// ---------------------------------------------------------------------------------------------

/// A getter's failure: the status it returns.
type Failed = guild_status_t;

/// Runs a getter's body, turning a panic into `GUILD_STATUS_ERR_INTERNAL`.
fn guarded(body: impl FnOnce() -> Result<(), Failed>) -> guild_status_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => GUILD_STATUS_OK,
        Ok(Err(status)) => status,
        Err(_) => GUILD_STATUS_ERR_INTERNAL,
    }
}

/// The reader state behind `ctx`, after checking that it is one.
///
/// # Safety
/// `ctx` must be NULL or the `ctx` of a table from [`ModelReader::table`] whose reader is
/// alive, as the header requires of every caller.
unsafe fn state<'a>(ctx: *mut c_void) -> Result<&'a ReaderState, Failed> {
    let state = ctx.cast::<ReaderState>();
    if state.is_null() || !state.is_aligned() {
        return Err(GUILD_STATUS_ERR_INVALID_ARGUMENT);
    }
    // SAFETY: per the contract a non-NULL ctx points at a reader state; the tag (its first
    // field) is read on its own before the rest is trusted.
    let tag = unsafe { ptr::addr_of!((*state).tag).read() };
    if tag != READER_TAG {
        return Err(GUILD_STATUS_ERR_INVALID_ARGUMENT);
    }
    // SAFETY: the tag marks a live state, which is only ever shared.
    Ok(unsafe { &*state })
}

/// A caller's key or tensor name.
///
/// # Safety
/// `text` must be NULL or a NUL-terminated string (or at least `MAX_READER_STRING + 1`
/// readable bytes) that stays unchanged for the call.
unsafe fn caller_str<'a>(text: *const c_char) -> Result<&'a str, Failed> {
    // SAFETY: the caller upholds bounded_str's contract.
    unsafe { bounded_str(text, MAX_READER_STRING) }.map_err(|_| GUILD_STATUS_ERR_INVALID_ARGUMENT)
}

/// Refuses a NULL output pointer.
fn non_null<T>(out: *mut T) -> Result<*mut T, Failed> {
    if out.is_null() {
        Err(GUILD_STATUS_ERR_INVALID_ARGUMENT)
    } else {
        Ok(out)
    }
}

/// Refuses a NULL buffer unless nothing is to be written into it.
fn buffer_or_empty<T>(out: *mut T, len: usize) -> Result<(), Failed> {
    if out.is_null() && len != 0 {
        Err(GUILD_STATUS_ERR_INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

fn value<'a>(state: &'a ReaderState, key: &str) -> Result<&'a MetaValue, Failed> {
    state.model.metadata(key).ok_or(GUILD_STATUS_ERR_NOT_FOUND)
}

/// An integer or bool value, widened.
fn integer(value: &MetaValue) -> Option<i128> {
    Some(match value {
        MetaValue::U8(v) => i128::from(*v),
        MetaValue::I8(v) => i128::from(*v),
        MetaValue::U16(v) => i128::from(*v),
        MetaValue::I16(v) => i128::from(*v),
        MetaValue::U32(v) => i128::from(*v),
        MetaValue::I32(v) => i128::from(*v),
        MetaValue::U64(v) => i128::from(*v),
        MetaValue::I64(v) => i128::from(*v),
        MetaValue::Bool(v) => i128::from(*v),
        _ => return None,
    })
}

fn array(value: &MetaValue) -> Result<&MetaArray, Failed> {
    match value {
        MetaValue::Array(array) => Ok(array),
        _ => Err(GUILD_STATUS_ERR_UNSUPPORTED),
    }
}

/// The elements `first..first + count` of a slice of `len` elements, or an out-of-range refusal.
fn range(len: usize, first: u64, count: usize) -> Result<std::ops::Range<usize>, Failed> {
    let start = usize::try_from(first).map_err(|_| GUILD_STATUS_ERR_INVALID_ARGUMENT)?;
    let end = start
        .checked_add(count)
        .ok_or(GUILD_STATUS_ERR_INVALID_ARGUMENT)?;
    if end > len {
        return Err(GUILD_STATUS_ERR_INVALID_ARGUMENT);
    }
    Ok(start..end)
}

/// Writes `values` to `out[0..values.len()]`.
///
/// # Safety
/// `out` must be writable for `values.len()` elements (it may be NULL only when `values` is
/// empty).
unsafe fn write_all<T: Copy>(out: *mut T, values: &[T]) {
    for (i, v) in values.iter().enumerate() {
        // SAFETY: i < values.len(), the number of elements the caller made writable.
        unsafe { out.add(i).write_unaligned(*v) };
    }
}

/// Copies `text` and a NUL into a caller's buffer with the header's string rules.
///
/// # Safety
/// `buffer` must be NULL or writable for `buffer_size` bytes; `out_length` must be writable.
unsafe fn copy_string(
    text: &str,
    buffer: *mut c_char,
    buffer_size: usize,
    out_length: *mut usize,
) -> Result<(), Failed> {
    let bytes = text.as_bytes();
    if buffer_size <= bytes.len() {
        // SAFETY: out_length was checked non-NULL and is writable per the contract.
        unsafe { out_length.write_unaligned(bytes.len()) };
        return Err(GUILD_STATUS_ERR_BUFFER_TOO_SMALL);
    }
    // SAFETY: buffer_size > bytes.len() >= 0, so the buffer is non-NULL (checked by the
    // caller of this function) and holds bytes.len() + 1 writable bytes.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), bytes.len());
        buffer.add(bytes.len()).write(0);
        out_length.write_unaligned(bytes.len());
    }
    Ok(())
}

/// The C record of `tensors[index]`, its name handed out from the state's cache.
fn tensor_info(
    state: &ReaderState,
    index: usize,
    struct_size: u32,
) -> Result<guild_model_tensor_info_v1_t, Failed> {
    let tensor: &ModelTensor = state
        .model
        .tensors()
        .get(index)
        .ok_or(GUILD_STATUS_ERR_INVALID_ARGUMENT)?;
    let rank = tensor.dims.len();
    if rank == 0 || rank > GUILD_MAX_TENSOR_RANK {
        return Err(GUILD_STATUS_ERR_UNSUPPORTED);
    }
    let name = state
        .names
        .get(index)
        .ok_or(GUILD_STATUS_ERR_INTERNAL)?
        .get_or_init(|| CString::new(tensor.name.as_str()).ok())
        .as_ref()
        .ok_or(GUILD_STATUS_ERR_UNSUPPORTED)?;
    let mut dims = [0u64; GUILD_MAX_TENSOR_RANK];
    dims[..rank].copy_from_slice(&tensor.dims);
    Ok(guild_model_tensor_info_v1_t {
        struct_size,
        dtype: tensor.dtype,
        rank: rank as u32,
        reserved: 0,
        dims,
        size_bytes: tensor.size_bytes,
        name: name.as_ptr(),
    })
}

/// The `struct_size` a caller set in a tensor record, refused when smaller than this host's.
///
/// # Safety
/// `out` must be non-NULL and point at a record whose `struct_size` the caller initialised.
unsafe fn info_size(out: *mut guild_model_tensor_info_v1_t) -> Result<u32, Failed> {
    // SAFETY: per the contract the first field is initialised and readable.
    let size = unsafe { ptr::addr_of!((*out).struct_size).read_unaligned() };
    if usize::try_from(size).map_or(true, |s| s < size_of::<guild_model_tensor_info_v1_t>()) {
        return Err(GUILD_STATUS_ERR_INVALID_ARGUMENT);
    }
    Ok(size)
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------
//
// Each entry point is `unsafe extern "C"`: its caller (a runner) promises what the header asks,
// namely that `ctx` comes from the table it was given during the callback, strings are
// NUL-terminated, and output pointers are NULL or writable for what the call writes.

/// One scalar getter: checks `ctx`, reads the caller's key, converts its value with `convert`
/// and writes the result to `out` only when every step succeeded.
///
/// # Safety
/// `ctx` must be NULL or the ctx of a live reader table, `key` NULL or NUL-terminated, and
/// `out` NULL or writable for a `T`.
unsafe fn scalar<T>(
    ctx: *mut c_void,
    key: *const c_char,
    out: *mut T,
    convert: impl FnOnce(&MetaValue) -> Result<T, Failed>,
) -> guild_status_t {
    guarded(|| {
        // SAFETY: the caller passes the ctx of a live table and a NUL-terminated key.
        let (state, key) = unsafe { (state(ctx)?, caller_str(key)?) };
        let out = non_null(out)?;
        let v = convert(value(state, key)?)?;
        // SAFETY: non-NULL and writable per the header.
        unsafe { out.write_unaligned(v) };
        Ok(())
    })
}

unsafe extern "C" fn reader_find_key(
    ctx: *mut c_void,
    key: *const c_char,
    out_type: *mut u32,
) -> guild_status_t {
    // SAFETY: the caller upholds the header's contract, which is scalar's.
    unsafe { scalar(ctx, key, out_type, |v| Ok(v.type_code())) }
}

unsafe extern "C" fn reader_get_int(
    ctx: *mut c_void,
    key: *const c_char,
    out_value: *mut i64,
) -> guild_status_t {
    // SAFETY: as in reader_find_key.
    unsafe {
        scalar(ctx, key, out_value, |v| {
            let wide = integer(v).ok_or(GUILD_STATUS_ERR_UNSUPPORTED)?;
            i64::try_from(wide).map_err(|_| GUILD_STATUS_ERR_UNSUPPORTED)
        })
    }
}

unsafe extern "C" fn reader_get_uint(
    ctx: *mut c_void,
    key: *const c_char,
    out_value: *mut u64,
) -> guild_status_t {
    // SAFETY: as in reader_find_key.
    unsafe {
        scalar(ctx, key, out_value, |v| {
            let wide = integer(v).ok_or(GUILD_STATUS_ERR_UNSUPPORTED)?;
            u64::try_from(wide).map_err(|_| GUILD_STATUS_ERR_UNSUPPORTED)
        })
    }
}

unsafe extern "C" fn reader_get_float(
    ctx: *mut c_void,
    key: *const c_char,
    out_value: *mut f64,
) -> guild_status_t {
    // SAFETY: as in reader_find_key.
    unsafe {
        scalar(ctx, key, out_value, |v| match v {
            MetaValue::F32(v) => Ok(f64::from(*v)),
            MetaValue::F64(v) => Ok(*v),
            _ => Err(GUILD_STATUS_ERR_UNSUPPORTED),
        })
    }
}

unsafe extern "C" fn reader_get_string(
    ctx: *mut c_void,
    key: *const c_char,
    buffer: *mut c_char,
    buffer_size: usize,
    out_length: *mut usize,
) -> guild_status_t {
    guarded(|| {
        // SAFETY: as in reader_find_key.
        let (state, key) = unsafe { (state(ctx)?, caller_str(key)?) };
        let out_length = non_null(out_length)?;
        buffer_or_empty(buffer, buffer_size)?;
        let MetaValue::Str(text) = value(state, key)? else {
            return Err(GUILD_STATUS_ERR_UNSUPPORTED);
        };
        // SAFETY: the buffer is NULL only with size 0, else writable for buffer_size bytes per
        // the header; out_length is non-NULL and writable.
        unsafe { copy_string(text, buffer, buffer_size, out_length) }
    })
}

unsafe extern "C" fn reader_get_array_info(
    ctx: *mut c_void,
    key: *const c_char,
    out_element_type: *mut u32,
    out_length: *mut u64,
) -> guild_status_t {
    guarded(|| {
        // SAFETY: as in reader_find_key.
        let (state, key) = unsafe { (state(ctx)?, caller_str(key)?) };
        let (out_type, out_len) = (non_null(out_element_type)?, non_null(out_length)?);
        let array = array(value(state, key)?)?;
        // SAFETY: both non-NULL and writable per the header.
        unsafe {
            out_type.write_unaligned(array.element_type());
            out_len.write_unaligned(array.len() as u64);
        }
        Ok(())
    })
}

/// One array getter: checks `ctx` and the output, reads the key's array with `read` (which
/// refuses another element type before it refuses a range: the header's order of errors) and
/// writes the elements only when every step succeeded.
///
/// # Safety
/// `ctx` must be NULL or the ctx of a live reader table, `key` NULL or NUL-terminated, and
/// `out` NULL (with `count` 0) or writable for `count` elements.
unsafe fn elements<T: Copy>(
    ctx: *mut c_void,
    key: *const c_char,
    out: *mut T,
    count: usize,
    read: impl FnOnce(&MetaArray) -> Result<Vec<T>, Failed>,
) -> guild_status_t {
    guarded(|| {
        // SAFETY: the caller passes the ctx of a live table and a NUL-terminated key.
        let (state, key) = unsafe { (state(ctx)?, caller_str(key)?) };
        buffer_or_empty(out, count)?;
        let values = read(array(value(state, key)?)?)?;
        // SAFETY: writable for `count` elements per the header, and values.len() == count.
        unsafe { write_all(out, &values) };
        Ok(())
    })
}

/// The converted integer elements `first..first + count` of an integer (or bool) array.
fn ints<T: TryFrom<i128>>(array: &MetaArray, first: u64, count: usize) -> Result<Vec<T>, Failed> {
    let MetaArray::Ints { values, .. } = array else {
        return Err(GUILD_STATUS_ERR_UNSUPPORTED);
    };
    values[range(values.len(), first, count)?]
        .iter()
        .map(|&v| T::try_from(v).map_err(|_| GUILD_STATUS_ERR_UNSUPPORTED))
        .collect()
}

unsafe extern "C" fn reader_get_array_ints(
    ctx: *mut c_void,
    key: *const c_char,
    first: u64,
    out_values: *mut i64,
    count: usize,
) -> guild_status_t {
    // SAFETY: the caller upholds the header's contract, which is elements'.
    unsafe {
        elements(ctx, key, out_values, count, |a| {
            ints::<i64>(a, first, count)
        })
    }
}

unsafe extern "C" fn reader_get_array_uints(
    ctx: *mut c_void,
    key: *const c_char,
    first: u64,
    out_values: *mut u64,
    count: usize,
) -> guild_status_t {
    // SAFETY: as in reader_get_array_ints.
    unsafe {
        elements(ctx, key, out_values, count, |a| {
            ints::<u64>(a, first, count)
        })
    }
}

unsafe extern "C" fn reader_get_array_floats(
    ctx: *mut c_void,
    key: *const c_char,
    first: u64,
    out_values: *mut f64,
    count: usize,
) -> guild_status_t {
    // SAFETY: as in reader_get_array_ints.
    unsafe {
        elements(ctx, key, out_values, count, |array| match array {
            MetaArray::Floats { values, .. } => {
                Ok(values[range(values.len(), first, count)?].to_vec())
            }
            _ => Err(GUILD_STATUS_ERR_UNSUPPORTED),
        })
    }
}

unsafe extern "C" fn reader_get_array_string(
    ctx: *mut c_void,
    key: *const c_char,
    index: u64,
    buffer: *mut c_char,
    buffer_size: usize,
    out_length: *mut usize,
) -> guild_status_t {
    guarded(|| {
        // SAFETY: as in reader_find_key.
        let (state, key) = unsafe { (state(ctx)?, caller_str(key)?) };
        let out_length = non_null(out_length)?;
        buffer_or_empty(buffer, buffer_size)?;
        let MetaArray::Strings(values) = array(value(state, key)?)? else {
            return Err(GUILD_STATUS_ERR_UNSUPPORTED);
        };
        let at = range(values.len(), index, 1)?.start;
        // SAFETY: as in reader_get_string.
        unsafe { copy_string(&values[at], buffer, buffer_size, out_length) }
    })
}

unsafe extern "C" fn reader_tensor_count(ctx: *mut c_void, out_count: *mut u64) -> guild_status_t {
    guarded(|| {
        // SAFETY: the caller passes the ctx of a live table.
        let state = unsafe { state(ctx)? };
        let out = non_null(out_count)?;
        // SAFETY: non-NULL and writable per the header.
        unsafe { out.write_unaligned(state.model.tensors().len() as u64) };
        Ok(())
    })
}

unsafe extern "C" fn reader_find_tensor(
    ctx: *mut c_void,
    name: *const c_char,
    out_info: *mut guild_model_tensor_info_v1_t,
) -> guild_status_t {
    guarded(|| {
        // SAFETY: as in reader_find_key.
        let (state, name) = unsafe { (state(ctx)?, caller_str(name)?) };
        let out = non_null(out_info)?;
        // SAFETY: non-NULL; the caller set struct_size.
        let size = unsafe { info_size(out)? };
        let index = *state.by_name.get(name).ok_or(GUILD_STATUS_ERR_NOT_FOUND)?;
        let info = tensor_info(state, index, size)?;
        // SAFETY: the record is writable for at least this host's size (checked above).
        unsafe { out.write_unaligned(info) };
        Ok(())
    })
}

unsafe extern "C" fn reader_tensor_at(
    ctx: *mut c_void,
    index: u64,
    out_info: *mut guild_model_tensor_info_v1_t,
) -> guild_status_t {
    guarded(|| {
        // SAFETY: the caller passes the ctx of a live table.
        let state = unsafe { state(ctx)? };
        let out = non_null(out_info)?;
        // SAFETY: non-NULL; the caller set struct_size.
        let size = unsafe { info_size(out)? };
        let index = usize::try_from(index).map_err(|_| GUILD_STATUS_ERR_INVALID_ARGUMENT)?;
        let info = tensor_info(state, index, size)?;
        // SAFETY: the record is writable for at least this host's size (checked above).
        unsafe { out.write_unaligned(info) };
        Ok(())
    })
}
