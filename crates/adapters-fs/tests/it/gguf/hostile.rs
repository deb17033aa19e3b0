//! The hostile-file suite: each case mutates the valid file of [`Gguf::valid`] (or its bytes)
//! and asserts the exact error kind, the byte offset the error names, and words of its message.

use std::path::Path;

use guild_adapters_fs::gguf::{GgufLimits, GgufSource};
use guild_ports::model::{ModelError, ModelErrorKind, ModelSource};

use super::craft::{garray, gstr, gstr_array, ty, Built, Gguf, Kv, Tensor};

/// The kinds, by name, so a case can say which one it expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Io,
    NotAModel,
    Version(u32),
    Truncated,
    TooLarge,
    Malformed,
    NoSuchTensor,
}

fn kind_of(kind: &ModelErrorKind) -> Kind {
    match kind {
        ModelErrorKind::Io(_) => Kind::Io,
        ModelErrorKind::NotAModel(_) => Kind::NotAModel,
        ModelErrorKind::UnsupportedVersion(v) => Kind::Version(*v),
        ModelErrorKind::Truncated(_) => Kind::Truncated,
        ModelErrorKind::TooLarge(_) => Kind::TooLarge,
        ModelErrorKind::Malformed(_) => Kind::Malformed,
        ModelErrorKind::NoSuchTensor(_) => Kind::NoSuchTensor,
        other => panic!("a kind this suite does not know: {other:?}"),
    }
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    limits: GgufLimits,
    kind: Kind,
    at: Option<u64>,
    /// Words the message must contain (the field, the key or tensor).
    says: Vec<String>,
    /// Whether the kind's own message (without the location the error adds) names the byte.
    /// Header-level refusals (magic, version, a file too short for a header) do not.
    byte_in_kind: bool,
}

fn case(name: &'static str, bytes: Vec<u8>, kind: Kind, at: u64, says: &[&str]) -> Case {
    Case {
        name,
        bytes,
        limits: GgufLimits::default(),
        kind,
        at: Some(at),
        says: says.iter().map(|s| (*s).to_owned()).collect(),
        byte_in_kind: true,
    }
}

impl Case {
    fn header_level(mut self) -> Self {
        self.byte_in_kind = false;
        self
    }
}

/// The valid file with one change made to its description.
fn with(change: impl FnOnce(&mut Gguf)) -> Gguf {
    let mut g = Gguf::valid();
    change(&mut g);
    g
}

/// The valid file's bytes with `bytes` written at `at`.
fn patched(built: &Built, at: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = built.bytes.clone();
    let at = at as usize;
    out[at..at + bytes.len()].copy_from_slice(bytes);
    out
}

fn open(dir: &Path, name: &str, bytes: &[u8], limits: GgufLimits) -> Result<(), ModelError> {
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    GgufSource::new(limits).open(&path).map(|_| ())
}

// The cases are pushed one by one, each after the setup it needs.
#[allow(clippy::vec_init_then_push)]
fn cases() -> Vec<Case> {
    let valid = Gguf::valid().build();
    let mut cases = Vec::new();

    // The fixed header.
    cases.push(case("empty file", vec![], Kind::Truncated, 0, &["0 bytes long"]).header_level());
    cases.push(
        case(
            "cut inside the fixed header",
            valid.bytes[..20].to_vec(),
            Kind::Truncated,
            20,
            &["20 bytes long"],
        )
        .header_level(),
    );
    cases.push(
        case(
            "bad magic",
            patched(&valid, 0, b"GGUG"),
            Kind::NotAModel,
            0,
            &["magic"],
        )
        .header_level(),
    );
    cases.push(
        case(
            "version 1",
            patched(&valid, 4, &1u32.to_le_bytes()),
            Kind::Version(1),
            4,
            &["version 1"],
        )
        .header_level(),
    );
    cases.push(
        case(
            "version 4",
            patched(&valid, 4, &4u32.to_le_bytes()),
            Kind::Version(4),
            4,
            &["version 4"],
        )
        .header_level(),
    );
    cases.push(
        case(
            "big-endian version 3",
            patched(&valid, 4, &3u32.to_be_bytes()),
            Kind::NotAModel,
            4,
            &["big-endian"],
        )
        .header_level(),
    );
    cases.push(case(
        "tensor count huge",
        patched(&valid, 8, &u64::MAX.to_le_bytes()),
        Kind::TooLarge,
        8,
        &["tensor count", "limit"],
    ));
    cases.push(case(
        "tensor count under the limit but past the end",
        patched(&valid, 8, &100_000u64.to_le_bytes()),
        Kind::TooLarge,
        8,
        &["tensor count", "100000", "end of the file"],
    ));
    cases.push(case(
        "metadata count huge",
        patched(&valid, 16, &u64::MAX.to_le_bytes()),
        Kind::TooLarge,
        16,
        &["metadata count", "limit"],
    ));
    cases.push(case(
        "metadata count under the limit but past the end",
        patched(&valid, 16, &60_000u64.to_le_bytes()),
        Kind::TooLarge,
        16,
        &["metadata count", "60000", "end of the file"],
    ));
    let mut both = patched(&valid, 8, &12u64.to_le_bytes());
    both[16..24].copy_from_slice(&12u64.to_le_bytes());
    cases.push(case(
        "metadata and tensor counts that fit alone but not together",
        both,
        Kind::TooLarge,
        16,
        &["12 metadata entries", "12 tensors", "end of the file"],
    ));

    // Strings.
    let key_at = valid.at("kv:general.architecture");
    cases.push(case(
        "key length past the end of the file",
        patched(&valid, key_at, &10_000u64.to_le_bytes()),
        Kind::TooLarge,
        key_at,
        &["key of metadata entry #0", "10000", "end of the file"],
    ));
    let value_at = valid.at("kv:general.architecture:value");
    cases.push(case(
        "string value length huge",
        patched(&valid, value_at, &(u64::MAX - 3).to_le_bytes()),
        Kind::TooLarge,
        value_at,
        &["'general.architecture'", "limit"],
    ));
    let g = with(|g| g.kv_mut("general.architecture").key = b"general.\xffarch".to_vec());
    let b = g.build();
    let at = b.at("kv:general.\u{fffd}arch");
    cases.push(case(
        "key is not UTF-8",
        b.bytes,
        Kind::Malformed,
        at,
        &["key of metadata entry #0", "not UTF-8"],
    ));
    let g = with(|g| g.kv_mut("general.architecture").value = gstr(b"ll\xc3ama"));
    let b = g.build();
    let at = b.at("kv:general.architecture:value");
    cases.push(case(
        "string value is not UTF-8",
        b.bytes,
        Kind::Malformed,
        at,
        &["'general.architecture'", "not UTF-8"],
    ));
    let g = with(|g| g.kvs.insert(1, Kv::u32("", 1)));
    let b = g.build();
    let at = b.at("kv:");
    cases.push(case(
        "empty key",
        b.bytes,
        Kind::Malformed,
        at,
        &["#1", "empty key"],
    ));
    let g = with(|g| g.kvs.push(Kv::u32("llama.block_count", 3)));
    let b = g.build();
    let at = b.at("kv:llama.block_count");
    cases.push(case(
        "duplicate key",
        b.bytes,
        Kind::Malformed,
        at,
        &["'llama.block_count'", "second time"],
    ));

    // Values.
    let type_at = valid.at("kv:llama.block_count:type");
    cases.push(case(
        "unknown value type",
        patched(&valid, type_at, &13u32.to_le_bytes()),
        Kind::Malformed,
        type_at,
        &["'llama.block_count'", "value type 13"],
    ));
    let at = valid.at("kv:general.flag:value");
    cases.push(case(
        "bool that is neither 0 nor 1",
        patched(&valid, at, &[2]),
        Kind::Malformed,
        at,
        &["'general.flag'", "bool stored as 2"],
    ));
    let at = valid.at("kv:general.bytes:value");
    cases.push(case(
        "array of huge length",
        patched(&valid, at + 4, &(1u64 << 40).to_le_bytes()),
        Kind::TooLarge,
        at + 4,
        &["array 'general.bytes'", "limit"],
    ));
    cases.push(case(
        "array length under the limit but past the end",
        patched(&valid, at + 4, &1_000_000u64.to_le_bytes()),
        Kind::TooLarge,
        at + 4,
        &["array 'general.bytes'", "1000000", "end of the file"],
    ));
    let at = valid.at("kv:tokenizer.ggml.tokens:value");
    cases.push(case(
        "string array length past the end",
        patched(&valid, at + 4, &5_000u64.to_le_bytes()),
        Kind::TooLarge,
        at + 4,
        &["array 'tokenizer.ggml.tokens'", "40000 bytes"],
    ));
    let at = valid.at("kv:general.bytes:value");
    cases.push(case(
        "nested array",
        patched(&valid, at, &ty::ARRAY.to_le_bytes()),
        Kind::Malformed,
        at,
        &["'general.bytes'", "array of arrays"],
    ));
    cases.push(case(
        "unknown array element type",
        patched(&valid, at, &99u32.to_le_bytes()),
        Kind::Malformed,
        at,
        &["'general.bytes'", "element type 99"],
    ));
    let g = with(|g| {
        g.kvs.push(Kv::new(
            "general.bools",
            ty::ARRAY,
            garray(ty::BOOL, 2, &[1, 7]),
        ))
    });
    let b = g.build();
    let at = b.at("kv:general.bools:value") + 12 + 1;
    cases.push(case(
        "bool array element that is neither 0 nor 1",
        b.bytes,
        Kind::Malformed,
        at,
        &["element #1 of 'general.bools'", "bool stored as 7"],
    ));
    // With counts small enough for what is left, the cut is found where it is.
    let at = valid.at("kv:llama.block_count:value");
    let mut cut = patched(&valid, 8, &0u64.to_le_bytes());
    cut[16..24].copy_from_slice(&2u64.to_le_bytes());
    cut.truncate(at as usize + 2);
    cases.push(case(
        "cut inside a metadata value",
        cut,
        Kind::Truncated,
        at,
        &["'llama.block_count'", "needs 4 bytes"],
    ));

    // Alignment.
    for (name, value) in [("alignment 0", 0u32), ("alignment not a power of two", 48)] {
        let g = with(|g| g.kvs.push(Kv::u32("general.alignment", value)));
        let b = g.build();
        let at = b.at("kv:general.alignment:value");
        let text = format!("is {value}, not a power of two");
        cases.push(case(
            name,
            b.bytes,
            Kind::Malformed,
            at,
            &["general.alignment", &text],
        ));
    }
    let g = with(|g| {
        g.kvs.push(Kv::new(
            "general.alignment",
            ty::U64,
            32u64.to_le_bytes().to_vec(),
        ))
    });
    let b = g.build();
    let at = b.at("kv:general.alignment:type");
    cases.push(case(
        "alignment of the wrong type",
        b.bytes,
        Kind::Malformed,
        at,
        &["general.alignment", "value type 10, not uint32"],
    ));

    // Tensor infos.
    let at = valid.at("tensor:b:n_dims");
    cases.push(case(
        "zero axes",
        patched(&valid, at, &0u32.to_le_bytes()),
        Kind::Malformed,
        at,
        &["tensor 'b'", "0 axes"],
    ));
    let g = with(|g| g.tensor_mut("a").dims = vec![4, 2, 1, 1, 1]);
    let b = g.build();
    let at = b.at("tensor:a:n_dims");
    cases.push(case(
        "five axes",
        b.bytes,
        Kind::Malformed,
        at,
        &["tensor 'a'", "5 axes", "1 to 4"],
    ));
    let g = with(|g| {
        let t = g.tensor_mut("a");
        t.dims = vec![1 << 32, 1 << 32];
        t.data = Some(vec![0; 32]);
    });
    let b = g.build();
    let at = b.at("tensor:a:ne");
    cases.push(case(
        "element count overflows",
        b.bytes,
        Kind::TooLarge,
        at,
        &["tensor 'a'", "overflows"],
    ));
    let g = with(|g| {
        let t = g.tensor_mut("a");
        t.dims = vec![1 << 63];
        t.data = Some(vec![0; 32]);
    });
    let b = g.build();
    let at = b.at("tensor:a:ne");
    cases.push(case(
        "one axis beyond i64",
        b.bytes,
        Kind::TooLarge,
        at,
        &["tensor 'a'", "overflows"],
    ));
    // A zero axis makes the product zero, which must not hide an axis no int64_t holds
    // (llama.cpp refuses every axis above INT64_MAX on its own).
    let g = with(|g| {
        let t = g.tensor_mut("a");
        t.dims = vec![0, u64::MAX];
        t.data = Some(vec![0; 32]);
    });
    let b = g.build();
    let at = b.at("tensor:a:ne") + 8;
    cases.push(case(
        "a zero axis beside an axis beyond i64",
        b.bytes,
        Kind::TooLarge,
        at,
        &["tensor 'a'", "axis 1", "18446744073709551615", "i64"],
    ));
    let at = valid.at("tensor:b:type");
    cases.push(case(
        "unknown ggml type",
        patched(&valid, at, &4u32.to_le_bytes()),
        Kind::Malformed,
        at,
        &["tensor 'b'", "ggml type 4"],
    ));
    let g = with(|g| {
        let t = g.tensor_mut("b");
        t.dims = vec![16];
        t.data = Some(vec![0; 34]);
    });
    let b = g.build();
    let at = b.at("tensor:b:ne");
    cases.push(case(
        "quantized axis not a whole number of blocks",
        b.bytes,
        Kind::Malformed,
        at,
        &["tensor 'b'", "q8_0", "32-element blocks"],
    ));
    let g = with(|g| g.tensors.push(Tensor::new("a", 0, &[2])));
    let b = g.build();
    let at = b.at("tensor:a");
    cases.push(case(
        "duplicate tensor name",
        b.bytes,
        Kind::Malformed,
        at,
        &["tensor name 'a'", "second time"],
    ));
    let g = with(|g| g.tensor_mut("b").name = Vec::new());
    let b = g.build();
    let at = b.at("tensor:");
    cases.push(case(
        "empty tensor name",
        b.bytes,
        Kind::Malformed,
        at,
        &["tensor #1", "no name"],
    ));
    let g = with(|g| g.tensor_mut("c").name = b"c\xfe".to_vec());
    let b = g.build();
    let at = b.at("tensor:c\u{fffd}");
    cases.push(case(
        "tensor name is not UTF-8",
        b.bytes,
        Kind::Malformed,
        at,
        &["name of tensor #2", "not UTF-8"],
    ));
    let at = valid.at("tensor:c:type");
    cases.push(case(
        "cut inside the tensor infos",
        valid.bytes[..at as usize + 1].to_vec(),
        Kind::Truncated,
        at,
        &["type of tensor 'c'", "needs 4 bytes"],
    ));

    // Tensor data.
    let at = valid.at("tensor:c:offset");
    cases.push(case(
        "tensor offset past the end of the file",
        patched(&valid, at, &(1u64 << 20).to_le_bytes()),
        Kind::NoSuchTensor,
        at,
        &["tensor 'c'", "past the end"],
    ));
    cases.push(case(
        "tensor offset that overflows",
        patched(&valid, at, &(u64::MAX - 31).to_le_bytes()),
        Kind::NoSuchTensor,
        at,
        &["tensor 'c'", "past the end"],
    ));
    cases.push(case(
        "misaligned tensor offset",
        patched(
            &valid,
            at,
            &(valid.at("data:c") - valid.at("data_start") + 2).to_le_bytes(),
        ),
        Kind::Malformed,
        at,
        &["tensor 'c'", "not a multiple of the alignment 32"],
    ));
    cases.push(case(
        "tensors that overlap",
        patched(&valid, at, &32u64.to_le_bytes()),
        Kind::Malformed,
        at,
        &["tensor 'c'", "overlaps", "tensor 'b'"],
    ));
    let end = valid.at("data:c") + 6;
    cases.push(case(
        "data section cut short",
        valid.bytes[..end as usize - 1].to_vec(),
        Kind::NoSuchTensor,
        at,
        &["tensor 'c'", "past the end"],
    ));

    // Limits.
    let mut tight = case(
        "header past the header limit",
        valid.bytes.clone(),
        Kind::TooLarge,
        valid.at("tensor:a"),
        &["header limit"],
    );
    tight.limits.max_header_bytes = valid.at("tensor:a") + 4;
    cases.push(tight);
    let mut tight = case(
        "string longer than the string limit",
        valid.bytes.clone(),
        Kind::TooLarge,
        valid.at("kv:general.architecture:value"),
        &["'general.architecture'", "limit of 4"],
    );
    tight.limits.max_string_bytes = 4;
    cases.push(tight);
    let g = with(|g| {
        let tokens: Vec<&str> = vec!["tok"; 1000];
        g.kvs
            .push(Kv::new("big.tokens", ty::ARRAY, gstr_array(&tokens)));
    });
    let b = g.build();
    let at = b.at("kv:big.tokens:value") + 4;
    let mut tight = case(
        "decoded metadata past the memory limit",
        b.bytes,
        Kind::TooLarge,
        at,
        &["array 'big.tokens'", "memory limit"],
    );
    tight.limits.max_decoded_bytes = 16 * 1024;
    cases.push(tight);
    let mut tight = case(
        "array longer than the array limit",
        valid.bytes.clone(),
        Kind::TooLarge,
        valid.at("kv:tokenizer.ggml.tokens:value") + 4,
        &["array 'tokenizer.ggml.tokens'", "limit of 2"],
    );
    tight.limits.max_array_len = 2;
    cases.push(tight);
    cases
}

#[test]
fn every_hostile_file_is_refused_with_its_kind_offset_and_words() {
    let temp = tempfile::tempdir().unwrap();
    let cases = cases();
    assert!(
        cases.len() >= 40,
        "the suite shrank to {} cases",
        cases.len()
    );
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let result = open(temp.path(), &format!("case{i}"), &c.bytes, c.limits);
        let Err(err) = result else {
            failures.push(format!("{}: opened", c.name));
            continue;
        };
        let text = err.to_string();
        if kind_of(&err.kind) != c.kind {
            failures.push(format!("{}: expected {:?}, got {text}", c.name, c.kind));
        }
        if err.at != c.at {
            failures.push(format!(
                "{}: expected at {:?}, got {:?} ({text})",
                c.name, c.at, err.at
            ));
        }
        let at_text = format!("(at byte {})", c.at.unwrap_or_default());
        if c.at.is_some() && !text.ends_with(&at_text) {
            failures.push(format!(
                "{}: message does not end {at_text:?}: {text}",
                c.name
            ));
        }
        let in_kind = format!("byte {}", c.at.unwrap_or_default());
        if c.byte_in_kind && !err.kind.to_string().contains(&in_kind) {
            failures.push(format!(
                "{}: the kind's message lacks {in_kind:?}: {text}",
                c.name
            ));
        }
        for word in &c.says {
            if !text.contains(word.as_str()) {
                failures.push(format!("{}: message lacks {word:?}: {text}", c.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_unmutated_file_opens() {
    // The suite's base must itself be valid, or every case above proves nothing.
    let temp = tempfile::tempdir().unwrap();
    let b = Gguf::valid().build();
    let path = b.write(temp.path(), "valid.gguf");
    let file = GgufSource::default().open(&path).unwrap();
    assert_eq!(file.tensors().len(), 3);
}

#[test]
fn what_is_not_a_regular_file_or_not_there_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let err = GgufSource::default().open(temp.path()).unwrap_err();
    assert_eq!(
        err.kind,
        ModelErrorKind::NotAModel("it is not a regular file".into())
    );
    assert_eq!(err.location, temp.path());
    let missing = temp.path().join("missing.gguf");
    let err = GgufSource::default().open(&missing).unwrap_err();
    assert!(
        matches!(&err.kind, ModelErrorKind::Io(m) if m.contains("examine")),
        "{err}"
    );
    assert_eq!(err.at, None);
}

#[test]
fn a_tensor_index_out_of_range_is_no_such_tensor() {
    let temp = tempfile::tempdir().unwrap();
    let path = Gguf::valid().build().write(temp.path(), "valid.gguf");
    let file = GgufSource::default().open(&path).unwrap();
    let err = file.tensor_data(3).unwrap_err();
    assert_eq!(
        err.kind,
        ModelErrorKind::NoSuchTensor(
            "tensor index 3 is out of range: the file has 3 tensors".into()
        )
    );
}

#[test]
fn a_file_cut_short_after_opening_fails_the_read_not_the_process() {
    let temp = tempfile::tempdir().unwrap();
    let b = Gguf::valid().build();
    let path = b.write(temp.path(), "valid.gguf");
    let file = GgufSource::default().open(&path).unwrap();
    // Tensor `a` is read before the cut and stays readable; `c` is read after it.
    let a = file.tensor_data(0).unwrap().to_vec();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(b.at("data:c") + 1)
        .unwrap();
    let err = file.tensor_data(2).unwrap_err();
    assert!(
        matches!(&err.kind, ModelErrorKind::Truncated(m) if m.contains("tensor 'c'") && m.contains("shrank")),
        "{err}"
    );
    assert_eq!(err.at, Some(b.at("data:c")));
    assert_eq!(file.tensor_data(0).unwrap(), &a[..]);
}
