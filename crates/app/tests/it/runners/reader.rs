//! The C model reader, called through its table's function pointers exactly as a runner calls
//! it, over an in-memory model: every getter's conversions, and every error rule with its
//! "nothing written" guarantee (outputs start as sentinels and must come back unchanged).

use std::ffi::{c_char, CStr, CString};
use std::ptr;
use std::sync::Arc;

use guild_abi::{
    guild_model_reader_v1_t, guild_model_tensor_info_v1_t, guild_status_t, GUILD_META_TYPE_ARRAY,
    GUILD_META_TYPE_BOOL, GUILD_META_TYPE_FLOAT32, GUILD_META_TYPE_FLOAT64, GUILD_META_TYPE_INT16,
    GUILD_META_TYPE_INT32, GUILD_META_TYPE_INT64, GUILD_META_TYPE_INT8, GUILD_META_TYPE_STRING,
    GUILD_META_TYPE_UINT16, GUILD_META_TYPE_UINT32, GUILD_META_TYPE_UINT64, GUILD_META_TYPE_UINT8,
    GUILD_MODEL_READER_VERSION, GUILD_STATUS_ERR_BUFFER_TOO_SMALL as TOO_SMALL,
    GUILD_STATUS_ERR_INVALID_ARGUMENT as INVALID, GUILD_STATUS_ERR_NOT_FOUND as NOT_FOUND,
    GUILD_STATUS_ERR_UNSUPPORTED as UNSUPPORTED, GUILD_STATUS_OK as OK,
};
use guild_host::models::reader::MAX_READER_STRING;
use guild_host::models::ModelReader;
use guild_ports::fakes::FakeModel;
use guild_ports::model::{MetaArray, MetaValue};

const SENTINEL_I: i64 = -7777;
const SENTINEL_U: u64 = 7777;
const SENTINEL_F: f64 = -77.5;
const SENTINEL_LEN: usize = 999_999;

fn model() -> FakeModel {
    FakeModel::new("/models/reader.gguf")
        .with_meta("u8", MetaValue::U8(200))
        .with_meta("i8", MetaValue::I8(-100))
        .with_meta("u16", MetaValue::U16(60000))
        .with_meta("i16", MetaValue::I16(-30000))
        .with_meta("u32", MetaValue::U32(4_000_000_000))
        .with_meta("i32", MetaValue::I32(-2_000_000_000))
        .with_meta("u64.big", MetaValue::U64(u64::MAX))
        .with_meta("u64.small", MetaValue::U64(42))
        .with_meta("i64", MetaValue::I64(i64::MIN))
        .with_meta("f32", MetaValue::F32(0.5))
        .with_meta("f64", MetaValue::F64(1e300))
        .with_meta("yes", MetaValue::Bool(true))
        .with_meta("name", MetaValue::Str("llama".into()))
        .with_meta("empty", MetaValue::Str(String::new()))
        .with_meta(
            "ints",
            MetaValue::Array(MetaArray::Ints {
                element_type: GUILD_META_TYPE_INT32,
                values: vec![3, -1, 7, 1 << 40],
            }),
        )
        .with_meta(
            "bools",
            MetaValue::Array(MetaArray::Ints {
                element_type: GUILD_META_TYPE_BOOL,
                values: vec![1, 0],
            }),
        )
        .with_meta(
            "floats",
            MetaValue::Array(MetaArray::Floats {
                element_type: GUILD_META_TYPE_FLOAT32,
                values: vec![0.25, -2.0],
            }),
        )
        .with_meta(
            "tokens",
            MetaValue::Array(MetaArray::Strings(vec![
                "<s>".into(),
                "hello".into(),
                String::new(),
            ])),
        )
        .with_tensor("token_embd.weight", guild_abi::GUILD_DTYPE_F16, &[8, 5])
        .with_tensor("output_norm.weight", guild_abi::GUILD_DTYPE_F32, &[8])
        .with_tensor("blk.0.ffn_up_exps.weight", 12, &[8, 16, 4])
}

/// A reader and its table, with one safe wrapper per getter.
struct Reader {
    _reader: ModelReader,
    t: guild_model_reader_v1_t,
}

fn reader_over(model: FakeModel) -> Reader {
    let reader = ModelReader::new(Arc::new(model));
    let t = reader.table();
    Reader { _reader: reader, t }
}

fn reader() -> Reader {
    reader_over(model())
}

fn c(key: &str) -> CString {
    CString::new(key).unwrap()
}

fn info() -> guild_model_tensor_info_v1_t {
    guild_model_tensor_info_v1_t {
        struct_size: size_of::<guild_model_tensor_info_v1_t>() as u32,
        dtype: 0xdead,
        rank: 0xdead,
        reserved: 0xdead,
        dims: [0xdead; 8],
        size_bytes: 0xdead,
        name: ptr::null(),
    }
}

// For every wrapper below: the table comes from a reader that lives as long as `self`,
// every key is a NUL-terminated CString alive for the call, and every output points at a live
// local of the right type and size (buffers with their true sizes).
impl Reader {
    fn find_key(&self, key: &str) -> (guild_status_t, u32) {
        let mut out = 0xdead;
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe { self.t.find_key.unwrap()(self.t.ctx, c(key).as_ptr(), &mut out) };
        (status, out)
    }

    fn int(&self, key: &str) -> (guild_status_t, i64) {
        let mut out = SENTINEL_I;
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe { self.t.get_int.unwrap()(self.t.ctx, c(key).as_ptr(), &mut out) };
        (status, out)
    }

    fn uint(&self, key: &str) -> (guild_status_t, u64) {
        let mut out = SENTINEL_U;
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe { self.t.get_uint.unwrap()(self.t.ctx, c(key).as_ptr(), &mut out) };
        (status, out)
    }

    fn float(&self, key: &str) -> (guild_status_t, f64) {
        let mut out = SENTINEL_F;
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe { self.t.get_float.unwrap()(self.t.ctx, c(key).as_ptr(), &mut out) };
        (status, out)
    }

    /// `get_string` into a buffer of `size` bytes prefilled with `#`; the buffer comes back
    /// whole so that untouched bytes show.
    fn string(&self, key: &str, size: usize) -> (guild_status_t, usize, Vec<u8>) {
        let mut buffer = vec![b'#' as c_char; size];
        let mut length = SENTINEL_LEN;
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe {
            self.t.get_string.unwrap()(
                self.t.ctx,
                c(key).as_ptr(),
                buffer.as_mut_ptr(),
                size,
                &mut length,
            )
        };
        (status, length, buffer.iter().map(|&b| b as u8).collect())
    }

    fn array_info(&self, key: &str) -> (guild_status_t, u32, u64) {
        let (mut kind, mut len) = (0xdead, SENTINEL_U);
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe {
            self.t.get_array_info.unwrap()(self.t.ctx, c(key).as_ptr(), &mut kind, &mut len)
        };
        (status, kind, len)
    }

    fn ints(&self, key: &str, first: u64, count: usize) -> (guild_status_t, Vec<i64>) {
        let mut out = vec![SENTINEL_I; count];
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe {
            self.t.get_array_ints.unwrap()(
                self.t.ctx,
                c(key).as_ptr(),
                first,
                out.as_mut_ptr(),
                count,
            )
        };
        (status, out)
    }

    fn uints(&self, key: &str, first: u64, count: usize) -> (guild_status_t, Vec<u64>) {
        let mut out = vec![SENTINEL_U; count];
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe {
            self.t.get_array_uints.unwrap()(
                self.t.ctx,
                c(key).as_ptr(),
                first,
                out.as_mut_ptr(),
                count,
            )
        };
        (status, out)
    }

    fn floats(&self, key: &str, first: u64, count: usize) -> (guild_status_t, Vec<f64>) {
        let mut out = vec![SENTINEL_F; count];
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe {
            self.t.get_array_floats.unwrap()(
                self.t.ctx,
                c(key).as_ptr(),
                first,
                out.as_mut_ptr(),
                count,
            )
        };
        (status, out)
    }

    fn array_string(&self, key: &str, index: u64, size: usize) -> (guild_status_t, usize, Vec<u8>) {
        let mut buffer = vec![b'#' as c_char; size];
        let mut length = SENTINEL_LEN;
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe {
            self.t.get_array_string.unwrap()(
                self.t.ctx,
                c(key).as_ptr(),
                index,
                buffer.as_mut_ptr(),
                size,
                &mut length,
            )
        };
        (status, length, buffer.iter().map(|&b| b as u8).collect())
    }

    fn tensor_count(&self) -> (guild_status_t, u64) {
        let mut out = SENTINEL_U;
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe { self.t.tensor_count.unwrap()(self.t.ctx, &mut out) };
        (status, out)
    }

    fn find_tensor(&self, name: &str) -> (guild_status_t, guild_model_tensor_info_v1_t) {
        let mut out = info();
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe { self.t.find_tensor.unwrap()(self.t.ctx, c(name).as_ptr(), &mut out) };
        (status, out)
    }

    fn tensor_at(&self, index: u64) -> (guild_status_t, guild_model_tensor_info_v1_t) {
        let mut out = info();
        // SAFETY: see the note above `impl Reader`.
        let status = unsafe { self.t.tensor_at.unwrap()(self.t.ctx, index, &mut out) };
        (status, out)
    }
}

/// Whether a tensor record is exactly as [`info`] made it.
fn untouched(i: &guild_model_tensor_info_v1_t) -> bool {
    (
        i.dtype,
        i.rank,
        i.reserved,
        i.dims,
        i.size_bytes,
        i.name.is_null(),
    ) == (0xdead, 0xdead, 0xdead, [0xdead; 8], 0xdead, true)
}

#[test]
fn the_table_is_complete_and_versioned() {
    let r = reader();
    assert_eq!(
        r.t.struct_size as usize,
        size_of::<guild_model_reader_v1_t>()
    );
    assert_eq!(r.t.version, GUILD_MODEL_READER_VERSION);
    assert!(!r.t.ctx.is_null());
    let t = r.t;
    let entries = [
        t.find_key.is_some(),
        t.get_int.is_some(),
        t.get_uint.is_some(),
        t.get_float.is_some(),
        t.get_string.is_some(),
        t.get_array_info.is_some(),
        t.get_array_ints.is_some(),
        t.get_array_uints.is_some(),
        t.get_array_floats.is_some(),
        t.get_array_string.is_some(),
        t.tensor_count.is_some(),
        t.find_tensor.is_some(),
        t.tensor_at.is_some(),
    ];
    assert!(entries.iter().all(|&e| e));
}

#[test]
fn find_key_reports_each_type_and_missing_keys() {
    let r = reader();
    for (key, kind) in [
        ("u8", GUILD_META_TYPE_UINT8),
        ("i8", GUILD_META_TYPE_INT8),
        ("u16", GUILD_META_TYPE_UINT16),
        ("i16", GUILD_META_TYPE_INT16),
        ("u32", GUILD_META_TYPE_UINT32),
        ("i32", GUILD_META_TYPE_INT32),
        ("u64.big", GUILD_META_TYPE_UINT64),
        ("i64", GUILD_META_TYPE_INT64),
        ("f32", GUILD_META_TYPE_FLOAT32),
        ("f64", GUILD_META_TYPE_FLOAT64),
        ("yes", GUILD_META_TYPE_BOOL),
        ("name", GUILD_META_TYPE_STRING),
        ("ints", GUILD_META_TYPE_ARRAY),
    ] {
        assert_eq!(r.find_key(key), (OK, kind), "{key}");
    }
    assert_eq!(r.find_key("general.architecture"), (NOT_FOUND, 0xdead));
}

#[test]
fn integers_convert_when_they_fit_and_are_refused_when_not() {
    let r = reader();
    for (key, v) in [
        ("u8", 200),
        ("i8", -100),
        ("u16", 60000),
        ("i16", -30000),
        ("u32", 4_000_000_000),
        ("i32", -2_000_000_000),
        ("u64.small", 42),
        ("i64", i64::MIN),
        ("yes", 1),
    ] {
        assert_eq!(r.int(key), (OK, v), "get_int {key}");
    }
    for (key, v) in [
        ("u8", 200),
        ("u16", 60000),
        ("u32", 4_000_000_000),
        ("u64.big", u64::MAX),
        ("u64.small", 42),
        ("yes", 1),
    ] {
        assert_eq!(r.uint(key), (OK, v), "get_uint {key}");
    }
    // Too large for int64_t, negative for uint64_t, or not an integer at all: nothing written.
    assert_eq!(r.int("u64.big"), (UNSUPPORTED, SENTINEL_I));
    for key in ["i8", "i16", "i32", "i64"] {
        assert_eq!(r.uint(key), (UNSUPPORTED, SENTINEL_U), "get_uint {key}");
    }
    for key in ["f32", "name", "ints"] {
        assert_eq!(r.int(key), (UNSUPPORTED, SENTINEL_I), "get_int {key}");
        assert_eq!(r.uint(key), (UNSUPPORTED, SENTINEL_U), "get_uint {key}");
    }
    assert_eq!(r.int("missing"), (NOT_FOUND, SENTINEL_I));
    assert_eq!(r.uint("missing"), (NOT_FOUND, SENTINEL_U));
}

#[test]
fn floats_read_only_float_values() {
    let r = reader();
    assert_eq!(r.float("f32"), (OK, 0.5));
    assert_eq!(r.float("f64"), (OK, 1e300));
    for key in ["u8", "yes", "name", "floats"] {
        assert_eq!(r.float(key), (UNSUPPORTED, SENTINEL_F), "{key}");
    }
    assert_eq!(r.float("missing"), (NOT_FOUND, SENTINEL_F));
}

#[test]
fn strings_follow_the_buffer_rules() {
    let r = reader();
    // Exactly enough room: the text, its NUL, its length.
    assert_eq!(r.string("name", 6), (OK, 5, b"llama\0".to_vec()));
    assert_eq!(r.string("name", 8), (OK, 5, b"llama\0##".to_vec()));
    assert_eq!(r.string("empty", 1), (OK, 0, b"\0".to_vec()));
    // One byte short: the length only, the buffer untouched.
    assert_eq!(r.string("name", 5), (TOO_SMALL, 5, b"#####".to_vec()));
    // Asking for the length first with no buffer at all.
    let mut length = SENTINEL_LEN;
    // SAFETY: a live table; a NULL buffer of size 0 and a live length slot.
    let status = unsafe {
        r.t.get_string.unwrap()(r.t.ctx, c("name").as_ptr(), ptr::null_mut(), 0, &mut length)
    };
    assert_eq!((status, length), (TOO_SMALL, 5));
    // A NULL buffer that claims a size, and a NULL length, are invalid.
    let mut length = SENTINEL_LEN;
    // SAFETY: as above; the reader must refuse the NULL buffer before writing.
    let status = unsafe {
        r.t.get_string.unwrap()(r.t.ctx, c("name").as_ptr(), ptr::null_mut(), 8, &mut length)
    };
    assert_eq!((status, length), (INVALID, SENTINEL_LEN));
    let mut buffer = [b'#' as c_char; 8];
    // SAFETY: a live buffer of its true size and a NULL length, which must be refused.
    let status = unsafe {
        r.t.get_string.unwrap()(
            r.t.ctx,
            c("name").as_ptr(),
            buffer.as_mut_ptr(),
            8,
            ptr::null_mut(),
        )
    };
    assert_eq!(status, INVALID);
    assert!(buffer.iter().all(|&b| b == b'#' as c_char));
    // Not a string, or no such key: nothing written.
    assert_eq!(
        r.string("u8", 8),
        (UNSUPPORTED, SENTINEL_LEN, vec![b'#'; 8])
    );
    assert_eq!(
        r.string("tokens", 8),
        (UNSUPPORTED, SENTINEL_LEN, vec![b'#'; 8])
    );
    assert_eq!(
        r.string("missing", 8),
        (NOT_FOUND, SENTINEL_LEN, vec![b'#'; 8])
    );
}

#[test]
fn arrays_give_their_type_length_and_converted_ranges() {
    let r = reader();
    assert_eq!(r.array_info("ints"), (OK, GUILD_META_TYPE_INT32, 4));
    assert_eq!(r.array_info("bools"), (OK, GUILD_META_TYPE_BOOL, 2));
    assert_eq!(r.array_info("floats"), (OK, GUILD_META_TYPE_FLOAT32, 2));
    assert_eq!(r.array_info("tokens"), (OK, GUILD_META_TYPE_STRING, 3));
    assert_eq!(r.array_info("u8"), (UNSUPPORTED, 0xdead, SENTINEL_U));
    assert_eq!(r.array_info("missing"), (NOT_FOUND, 0xdead, SENTINEL_U));

    assert_eq!(r.ints("ints", 0, 4), (OK, vec![3, -1, 7, 1 << 40]));
    assert_eq!(r.ints("ints", 1, 2), (OK, vec![-1, 7]));
    assert_eq!(r.ints("ints", 4, 0), (OK, vec![]));
    assert_eq!(r.ints("bools", 0, 2), (OK, vec![1, 0]));
    assert_eq!(r.uints("ints", 2, 2), (OK, vec![7, 1 << 40]));
    // One element that does not fit refuses the whole range, and nothing is written.
    assert_eq!(r.uints("ints", 0, 3), (UNSUPPORTED, vec![SENTINEL_U; 3]));
    // Past the end, or an index so large the range wraps.
    assert_eq!(r.ints("ints", 3, 2), (INVALID, vec![SENTINEL_I; 2]));
    assert_eq!(r.ints("ints", 5, 0), (INVALID, vec![]));
    assert_eq!(r.ints("ints", u64::MAX, 1), (INVALID, vec![SENTINEL_I]));
    // Other element types, scalars and missing keys.
    assert_eq!(r.ints("floats", 0, 1), (UNSUPPORTED, vec![SENTINEL_I]));
    assert_eq!(r.uints("tokens", 0, 1), (UNSUPPORTED, vec![SENTINEL_U]));
    assert_eq!(r.ints("u32", 0, 1), (UNSUPPORTED, vec![SENTINEL_I]));
    assert_eq!(r.ints("missing", 0, 1), (NOT_FOUND, vec![SENTINEL_I]));
    // Another element type is refused before a range that does not fit.
    assert_eq!(r.ints("floats", 9, 1), (UNSUPPORTED, vec![SENTINEL_I]));
    assert_eq!(r.floats("ints", 9, 1), (UNSUPPORTED, vec![SENTINEL_F]));

    assert_eq!(r.floats("floats", 0, 2), (OK, vec![0.25, -2.0]));
    assert_eq!(r.floats("floats", 1, 1), (OK, vec![-2.0]));
    assert_eq!(r.floats("floats", 1, 2), (INVALID, vec![SENTINEL_F; 2]));
    assert_eq!(r.floats("ints", 0, 1), (UNSUPPORTED, vec![SENTINEL_F]));
    assert_eq!(r.floats("f32", 0, 1), (UNSUPPORTED, vec![SENTINEL_F]));

    // A NULL output is fine for zero elements only.
    // SAFETY: a live table; NULL outputs with the counts the reader must check.
    let (empty, refused) = unsafe {
        let f = r.t.get_array_ints.unwrap();
        (
            f(r.t.ctx, c("ints").as_ptr(), 0, ptr::null_mut(), 0),
            f(r.t.ctx, c("ints").as_ptr(), 0, ptr::null_mut(), 1),
        )
    };
    assert_eq!((empty, refused), (OK, INVALID));
}

#[test]
fn array_strings_follow_the_buffer_rules_per_element() {
    let r = reader();
    assert_eq!(r.array_string("tokens", 1, 6), (OK, 5, b"hello\0".to_vec()));
    assert_eq!(r.array_string("tokens", 0, 4), (OK, 3, b"<s>\0".to_vec()));
    assert_eq!(r.array_string("tokens", 2, 1), (OK, 0, b"\0".to_vec()));
    assert_eq!(
        r.array_string("tokens", 1, 5),
        (TOO_SMALL, 5, b"#####".to_vec())
    );
    assert_eq!(
        r.array_string("tokens", 3, 8),
        (INVALID, SENTINEL_LEN, vec![b'#'; 8])
    );
    assert_eq!(
        r.array_string("ints", 0, 8),
        (UNSUPPORTED, SENTINEL_LEN, vec![b'#'; 8])
    );
    assert_eq!(
        r.array_string("name", 0, 8),
        (UNSUPPORTED, SENTINEL_LEN, vec![b'#'; 8])
    );
    assert_eq!(
        r.array_string("missing", 0, 8),
        (NOT_FOUND, SENTINEL_LEN, vec![b'#'; 8])
    );
}

#[test]
fn tensors_are_found_by_name_and_position() {
    let r = reader();
    assert_eq!(r.tensor_count(), (OK, 3));

    let (status, embd) = r.find_tensor("token_embd.weight");
    assert_eq!(status, OK);
    assert_eq!(
        (embd.dtype, embd.rank, embd.reserved, embd.size_bytes),
        (guild_abi::GUILD_DTYPE_F16, 2, 0, 8 * 5 * 2)
    );
    assert_eq!(embd.dims, [8, 5, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        embd.struct_size as usize,
        size_of::<guild_model_tensor_info_v1_t>()
    );
    // SAFETY: the reader is alive, so the name it handed out is a valid C string.
    let name = unsafe { CStr::from_ptr(embd.name) };
    assert_eq!(name.to_str().unwrap(), "token_embd.weight");

    let (status, exps) = r.tensor_at(2);
    assert_eq!(status, OK);
    assert_eq!((exps.dtype, exps.rank), (12, 3));
    assert_eq!(exps.dims[..4], [8, 16, 4, 0]);
    // SAFETY: as above.
    let name = unsafe { CStr::from_ptr(exps.name) };
    assert_eq!(name.to_str().unwrap(), "blk.0.ffn_up_exps.weight");
    // Asked again, by name, a tensor's name is the same pointer: it lives with the reader.
    assert_eq!(r.find_tensor("blk.0.ffn_up_exps.weight").1.name, exps.name);

    let (status, record) = r.find_tensor("output.weight");
    assert!(status == NOT_FOUND && untouched(&record));
    let (status, record) = r.tensor_at(3);
    assert!(status == INVALID && untouched(&record));
    let (status, record) = r.tensor_at(u64::MAX);
    assert!(status == INVALID && untouched(&record));
}

#[test]
fn a_tensor_record_must_be_large_enough() {
    let r = reader();
    let mut record = info();
    record.struct_size -= 1;
    // SAFETY: a live table and a live record whose declared size the reader must refuse.
    let (by_name, by_index) = unsafe {
        (
            r.t.find_tensor.unwrap()(r.t.ctx, c("token_embd.weight").as_ptr(), &mut record),
            r.t.tensor_at.unwrap()(r.t.ctx, 0, &mut record),
        )
    };
    assert_eq!((by_name, by_index), (INVALID, INVALID));
    assert!(untouched(&record));
    // A larger (newer) record is filled up to this host's size and keeps its own struct_size.
    let mut larger = [0u64; 32];
    let bigger = (size_of::<u64>() * larger.len()) as u32;
    larger[0] = u64::from(bigger);
    let out = larger.as_mut_ptr().cast::<guild_model_tensor_info_v1_t>();
    // SAFETY: `larger` is 256 bytes, aligned for u64, with struct_size (its first four bytes on
    // this little-endian host) set to its true size.
    let (status, got) = unsafe {
        let status = r.t.tensor_at.unwrap()(r.t.ctx, 1, out);
        (status, out.read())
    };
    assert_eq!(status, OK);
    assert_eq!((got.struct_size, got.rank, got.dims[0]), (bigger, 1, 8));
    assert_eq!(larger[31], 0, "nothing written past this host's record");
}

#[test]
fn tensors_the_c_record_cannot_express_are_unsupported() {
    let r = reader_over(
        FakeModel::new("/models/odd.gguf")
            .with_tensor("scalar", 0, &[])
            .with_tensor("deep", 0, &[1; 9])
            .with_tensor("nul\0name", 0, &[4]),
    );
    for index in 0..3 {
        let (status, record) = r.tensor_at(index);
        assert!(
            status == UNSUPPORTED && untouched(&record),
            "tensor {index}"
        );
    }
    assert_eq!(r.find_tensor("scalar").0, UNSUPPORTED);
}

#[test]
fn null_and_unterminated_arguments_are_invalid() {
    let r = reader();
    let mut kind = 0xdead;
    let mut count = SENTINEL_U;
    // SAFETY: a live table; the NULL and bogus pointers are what the reader must refuse before
    // reading anything through them (the bogus ctx is a live, aligned local that is not a
    // reader, so reading its first eight bytes is defined).
    unsafe {
        let bogus = &mut [0u64; 8];
        assert_eq!(
            r.t.find_key.unwrap()(r.t.ctx, ptr::null(), &mut kind),
            INVALID
        );
        assert_eq!(
            r.t.find_key.unwrap()(r.t.ctx, c("u8").as_ptr(), ptr::null_mut()),
            INVALID
        );
        assert_eq!(
            r.t.find_key.unwrap()(ptr::null_mut(), c("u8").as_ptr(), &mut kind),
            INVALID
        );
        assert_eq!(
            r.t.find_key.unwrap()(bogus.as_mut_ptr().cast(), c("u8").as_ptr(), &mut kind),
            INVALID
        );
        assert_eq!(
            r.t.tensor_count.unwrap()(ptr::null_mut(), &mut count),
            INVALID
        );
        assert_eq!(r.t.tensor_count.unwrap()(r.t.ctx, ptr::null_mut()), INVALID);
        assert_eq!(
            r.t.get_int.unwrap()(r.t.ctx, c("u8").as_ptr(), ptr::null_mut()),
            INVALID
        );
        assert_eq!(
            r.t.find_tensor.unwrap()(r.t.ctx, ptr::null(), &mut info()),
            INVALID
        );
        assert_eq!(
            r.t.find_tensor.unwrap()(r.t.ctx, c("output_norm.weight").as_ptr(), ptr::null_mut()),
            INVALID
        );
    }
    assert_eq!((kind, count), (0xdead, SENTINEL_U));

    // A key with no NUL within the bound is refused without reading past it.
    let long = vec![b'k' as c_char; MAX_READER_STRING + 1];
    // SAFETY: the reader reads at most MAX_READER_STRING + 1 bytes, all of them in `long`.
    let status = unsafe { r.t.find_key.unwrap()(r.t.ctx, long.as_ptr(), &mut kind) };
    assert_eq!((status, kind), (INVALID, 0xdead));
    // Invalid UTF-8 names no key.
    let bad = [0xffu8 as c_char, 0];
    // SAFETY: a NUL-terminated two-byte string.
    let status = unsafe { r.t.find_key.unwrap()(r.t.ctx, bad.as_ptr(), &mut kind) };
    assert_eq!((status, kind), (INVALID, 0xdead));
}
