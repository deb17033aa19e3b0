//! Files written by an independent writer: `tests/fixtures/write_gguf.py` writes them with the
//! `gguf` package from PyPI (llama.cpp's own Python package). The checks below hold their own
//! expectations for every key, value, type, tensor and tensor byte; the script's sidecar files,
//! written by the package's reader, are compared as well (offsets, sizes, data digests).
//!
//! Without `python3` or the `gguf` and `numpy` packages the test prints why and passes, unless
//! `GUILD_REQUIRE_GGUF_PY=1` (CI sets it), which turns the skip into a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use guild_adapters_fs::gguf::{GgufFile, GgufSource};
use guild_ports::model::{MetaArray, MetaValue, ModelFile};
use sha2::{Digest, Sha256};

/// Runs the writer into `out`; `Err` says why the files could not be written.
fn write_files(out: &Path) -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/write_gguf.py");
    let output = Command::new("python3")
        .arg(&script)
        .arg(out)
        .output()
        .map_err(|e| format!("python3 cannot be run: {e}"))?;
    match output.status.code() {
        Some(0) => Ok(()),
        // The script's "a package is missing" status.
        Some(3) => Err(format!(
            "the gguf or numpy Python package is missing ({}); install them with \
             `python3 -m pip install gguf numpy`",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        _ => panic!(
            "write_gguf.py failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

/// The written files' directory, or `None` after printing why the test is skipped.
fn written(temp: &Path) -> Option<PathBuf> {
    match write_files(temp) {
        Ok(()) => Some(temp.to_path_buf()),
        Err(reason) => {
            let required = std::env::var("GUILD_REQUIRE_GGUF_PY").is_ok_and(|v| v == "1");
            assert!(!required, "GUILD_REQUIRE_GGUF_PY=1 but {reason}");
            eprintln!(
                "gguf (python): skipped because {reason}; set GUILD_REQUIRE_GGUF_PY=1 to fail \
                 instead"
            );
            None
        }
    }
}

fn open(dir: &Path, name: &str) -> GgufFile {
    let path = dir.join(format!("{name}.gguf"));
    GgufSource::default()
        .open_gguf(&path)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn ints(element_type: u32, values: &[i128]) -> MetaValue {
    MetaValue::Array(MetaArray::Ints {
        element_type,
        values: values.to_vec(),
    })
}

fn floats(element_type: u32, values: &[f64]) -> MetaValue {
    MetaValue::Array(MetaArray::Floats {
        element_type,
        values: values.to_vec(),
    })
}

fn strings(values: &[&str]) -> MetaValue {
    MetaValue::Array(MetaArray::Strings(
        values.iter().map(|s| (*s).to_owned()).collect(),
    ))
}

fn text(s: &str) -> MetaValue {
    MetaValue::Str(s.to_owned())
}

/// Checks every key, in order, with its value.
fn assert_metadata(file: &GgufFile, expected: &[(&str, MetaValue)]) {
    let keys: Vec<&str> = expected.iter().map(|(k, _)| *k).collect();
    assert_eq!(file.keys(), keys);
    for (key, value) in expected {
        assert_eq!(file.metadata(key), Some(value), "{key}");
    }
}

/// The bytes of tensor `name`.
fn data<'a>(file: &'a GgufFile, name: &str) -> &'a [u8] {
    let i = file
        .tensors()
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    file.tensor_data(i).unwrap()
}

/// Checks each tensor's name, ggml type, dims and size, in order.
fn assert_tensors(file: &GgufFile, expected: &[(&str, u32, &[u64], u64)]) {
    let got: Vec<(&str, u32, &[u64], u64)> = file
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dtype, &t.dims[..], t.size_bytes))
        .collect();
    assert_eq!(got, expected);
    // Packed in order, each at an aligned offset from the data section, none overlapping.
    let mut end = file.data_start();
    for t in file.tensors() {
        assert!(t.offset >= end, "{}", t.name);
        assert_eq!(
            (t.offset - file.data_start()) % file.alignment(),
            0,
            "{}",
            t.name
        );
        end = t.offset + t.size_bytes;
    }
}

fn le<T: Copy, const N: usize>(values: &[T], to: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to(v)).collect()
}

/// Decodes IEEE half floats (the test's values are normal or zero).
fn f16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| {
            let h = u16::from_le_bytes([c[0], c[1]]);
            let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
            let exp = i32::from((h >> 10) & 0x1f);
            let mant = f32::from(h & 0x3ff);
            assert!(exp != 0x1f, "inf or nan");
            if exp == 0 {
                sign * mant * 2f32.powi(-24)
            } else {
                sign * (1.0 + mant / 1024.0) * 2f32.powi(exp - 15)
            }
        })
        .collect()
}

fn quarter_steps(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.25).collect()
}

fn check_types(dir: &Path) {
    let file = open(dir, "types");
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_metadata(
        &file,
        &[
            ("general.architecture", text("guild-test")),
            ("t.u8", MetaValue::U8(255)),
            ("t.i8", MetaValue::I8(-128)),
            ("t.u16", MetaValue::U16(65535)),
            ("t.i16", MetaValue::I16(-32768)),
            ("t.u32", MetaValue::U32(u32::MAX)),
            ("t.i32", MetaValue::I32(i32::MIN)),
            ("t.f32", MetaValue::F32(1.5)),
            ("t.bool", MetaValue::Bool(true)),
            ("t.str", text("héllo, wörld ✓")),
            ("t.u64", MetaValue::U64(u64::MAX)),
            ("t.i64", MetaValue::I64(i64::MIN)),
            ("t.f64", MetaValue::F64(-2.25e300)),
            ("a.u8", ints(0, &[0, 1, 255])),
            ("a.i8", ints(1, &[-128, 0, 127])),
            ("a.u16", ints(2, &[0, 65535])),
            ("a.i16", ints(3, &[-32768, 32767])),
            ("a.u32", ints(4, &[0, u32::MAX.into()])),
            ("a.i32", ints(5, &[-1, i32::MAX.into()])),
            ("a.u64", ints(10, &[u64::MAX.into(), 0])),
            ("a.i64", ints(11, &[i64::MIN.into(), i64::MAX.into()])),
            ("a.f32", floats(6, &[0.5, -1.25, 3.0])),
            ("a.f64", floats(12, &[1e-300, -2.5])),
            ("a.bool", ints(7, &[1, 0, 1])),
            ("a.str", strings(&["a", "", "ünïcødé", "tab\there"])),
        ],
    );
    // Type codes as the C reader will report them.
    assert_eq!(file.metadata("t.f64").unwrap().type_code(), 12);
    assert_eq!(file.metadata("a.str").unwrap().type_code(), 9);

    assert_tensors(
        &file,
        &[
            ("f32.2x3", 0, &[3, 2], 24),
            ("f16.4", 1, &[4], 8),
            ("f64.3", 28, &[3], 24),
            ("i8.5", 24, &[5], 5),
            ("i16.3", 25, &[3], 6),
            ("i32.2", 26, &[2], 8),
            ("i64.2", 27, &[2], 16),
            ("f32.2x3x4", 0, &[4, 3, 2], 96),
            ("f32.1x2x3x4", 0, &[4, 3, 2, 1], 96),
            ("bf16.4", 30, &[4], 8),
            ("q8_0.2x32", 8, &[32, 2], 68),
            ("q4_0.32", 2, &[32, 1], 18),
            ("q4_k.256", 12, &[256, 1], 144),
            ("q6_k.2x256", 14, &[256, 2], 420),
        ],
    );
    assert_eq!(
        data(&file, "f32.2x3"),
        le(&quarter_steps(6), f32::to_le_bytes)
    );
    assert_eq!(f16s(data(&file, "f16.4")), quarter_steps(4));
    assert_eq!(
        data(&file, "f64.3"),
        le(&[0.0, 0.25, 0.5], f64::to_le_bytes)
    );
    assert_eq!(
        data(&file, "i8.5"),
        le(&[-2i8, -1, 0, 1, 2], i8::to_le_bytes)
    );
    assert_eq!(
        data(&file, "i16.3"),
        le(&[-300i16, 0, 300], i16::to_le_bytes)
    );
    assert_eq!(
        data(&file, "i32.2"),
        le(&[-70000i32, 70000], i32::to_le_bytes)
    );
    assert_eq!(
        data(&file, "i64.2"),
        le(&[-(1i64 << 40), 1 << 40], i64::to_le_bytes)
    );
    assert_eq!(
        data(&file, "f32.2x3x4"),
        le(&quarter_steps(24), f32::to_le_bytes)
    );
    assert_eq!(
        data(&file, "f32.1x2x3x4"),
        le(&quarter_steps(24), f32::to_le_bytes)
    );
    // bf16 keeps an f32's upper half; quarter steps are exact in it.
    let bf16: Vec<u16> = quarter_steps(4)
        .iter()
        .map(|v| (v.to_bits() >> 16) as u16)
        .collect();
    assert_eq!(data(&file, "bf16.4"), le(&bf16, u16::to_le_bytes));
    // q8_0: per block an f16 scale (1.0 here) and 32 signed bytes.
    let mut q8 = Vec::new();
    for row in 0..2i32 {
        q8.extend_from_slice(&0x3c00u16.to_le_bytes());
        for j in 0..32i32 {
            let v = match (row, j) {
                (0, 0) => -127,
                (1, 31) => 127,
                _ => row * 32 + j - 32,
            };
            q8.push(v as i8 as u8);
        }
    }
    assert_eq!(data(&file, "q8_0.2x32"), q8);
    // q4_0: an f16 scale (1.0), then byte j holds element j + 8 low and element j + 16 + 8 high.
    let mut q4 = 0x3c00u16.to_le_bytes().to_vec();
    q4.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(data(&file, "q4_0.32"), q4);
    let pattern = |n: usize| -> Vec<u8> { (0..n).map(|i| (i % 251) as u8).collect() };
    assert_eq!(data(&file, "q4_k.256"), pattern(144));
    assert_eq!(data(&file, "q6_k.2x256"), pattern(420));
}

fn check_llama(dir: &Path) {
    let file = open(dir, "llama");
    assert_metadata(
        &file,
        &[
            ("general.architecture", text("llama")),
            ("general.name", text("guild tiny llama")),
            ("llama.context_length", MetaValue::U32(128)),
            ("llama.embedding_length", MetaValue::U32(32)),
            ("llama.block_count", MetaValue::U32(1)),
            ("llama.feed_forward_length", MetaValue::U32(64)),
            ("llama.attention.head_count", MetaValue::U32(4)),
            ("llama.attention.head_count_kv", MetaValue::U32(2)),
            ("llama.rope.freq_base", MetaValue::F32(10000.0)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                MetaValue::F32(1e-5),
            ),
            ("general.file_type", MetaValue::U32(7)),
            ("general.quantization_version", MetaValue::U32(2)),
            ("tokenizer.ggml.model", text("llama")),
            (
                "tokenizer.ggml.tokens",
                strings(&["<unk>", "<s>", "</s>", "▁the", "▁a", "b", "c", "d"]),
            ),
            (
                "tokenizer.ggml.scores",
                floats(6, &[0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0]),
            ),
            (
                "tokenizer.ggml.token_type",
                ints(5, &[2, 3, 3, 1, 1, 1, 1, 1]),
            ),
            ("tokenizer.ggml.bos_token_id", MetaValue::U32(1)),
            ("tokenizer.ggml.eos_token_id", MetaValue::U32(2)),
        ],
    );
    assert_tensors(
        &file,
        &[
            ("token_embd.weight", 1, &[32, 8], 512),
            ("blk.0.attn_norm.weight", 0, &[32], 128),
            ("blk.0.attn_q.weight", 8, &[32, 32], 32 * 34),
            ("blk.0.attn_k.weight", 8, &[32, 16], 16 * 34),
            ("blk.0.attn_v.weight", 8, &[32, 16], 16 * 34),
            ("blk.0.attn_output.weight", 8, &[32, 32], 32 * 34),
            ("blk.0.ffn_norm.weight", 0, &[32], 128),
            ("blk.0.ffn_gate.weight", 2, &[32, 64], 64 * 18),
            ("blk.0.ffn_up.weight", 2, &[32, 64], 64 * 18),
            ("blk.0.ffn_down.weight", 2, &[64, 32], 32 * 2 * 18),
            ("output_norm.weight", 0, &[32], 128),
            ("output.weight", 1, &[32, 8], 512),
        ],
    );
    let embd: Vec<f32> = (0..256).map(|i| (i % 7 - 3) as f32).collect();
    assert_eq!(f16s(data(&file, "token_embd.weight")), embd);
    assert_eq!(
        data(&file, "output_norm.weight"),
        le(&[1.0f32; 32], f32::to_le_bytes)
    );
}

fn check_aligned(dir: &Path) {
    let file = open(dir, "aligned");
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_start() % 64, 0);
    assert_metadata(
        &file,
        &[
            ("general.architecture", text("guild-test")),
            ("general.alignment", MetaValue::U32(64)),
        ],
    );
    assert_tensors(
        &file,
        &[
            ("odd.f32.3", 0, &[3], 12),
            ("odd.i8.5", 24, &[5], 5),
            ("odd.f16.7", 1, &[7], 14),
        ],
    );
    // Each odd-sized tensor is padded to the next multiple of 64.
    let offsets: Vec<u64> = file
        .tensors()
        .iter()
        .map(|t| t.offset - file.data_start())
        .collect();
    assert_eq!(offsets, [0, 64, 128]);
    assert_eq!(
        data(&file, "odd.f32.3"),
        le(&[1.0f32, 2.0, 3.0], f32::to_le_bytes)
    );
    assert_eq!(data(&file, "odd.i8.5"), [1, 2, 3, 4, 5]);
    assert_eq!(
        f16s(data(&file, "odd.f16.7")),
        (0..7).map(|i| i as f32).collect::<Vec<_>>()
    );
}

fn check_metadata_only(dir: &Path) {
    let file = open(dir, "metadata_only");
    assert!(file.tensors().is_empty());
    assert_metadata(
        &file,
        &[
            ("general.architecture", text("guild-test")),
            ("general.description", text("metadata only")),
        ],
    );
}

/// Compares a file with the sidecar the package's own reader wrote.
fn check_against_python_reader(dir: &Path, name: &str) {
    let file = open(dir, name);
    let sidecar = std::fs::read_to_string(dir.join(format!("{name}.expect"))).unwrap();
    let mut kvs = Vec::new();
    let mut tensors = Vec::new();
    for line in sidecar.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f[0] {
            "version" => assert_eq!(file.version().to_string(), f[1], "{name}"),
            "alignment" => assert_eq!(file.alignment().to_string(), f[1], "{name}"),
            "data_start" => assert_eq!(file.data_start().to_string(), f[1], "{name}"),
            "kv" => kvs.push((f[1].to_owned(), f[2].to_owned(), f[3].to_owned())),
            "tensor" => tensors.push(f[1..].iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()),
            other => panic!("unknown sidecar record {other}"),
        }
    }
    let ours: Vec<(String, String, String)> = file
        .keys()
        .into_iter()
        .map(|k| {
            let v = file.metadata(k).unwrap();
            let (types, count) = match v {
                MetaValue::Array(a) => (format!("9,{}", a.element_type()), a.len()),
                v => (v.type_code().to_string(), 1),
            };
            (k.to_owned(), types, count.to_string())
        })
        .collect();
    assert_eq!(ours, kvs, "{name}: metadata");
    let ours: Vec<Vec<String>> = file
        .tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
            let digest: String = Sha256::digest(file.tensor_data(i).unwrap())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            vec![
                t.name.clone(),
                t.dtype.to_string(),
                dims.join(","),
                t.offset.to_string(),
                t.size_bytes.to_string(),
                digest,
            ]
        })
        .collect();
    assert_eq!(ours, tensors, "{name}: tensors");
}

#[test]
fn files_written_by_the_gguf_python_package_read_back_exactly() {
    let temp = tempfile::tempdir().unwrap();
    let Some(dir) = written(temp.path()) else {
        return;
    };
    check_types(&dir);
    check_llama(&dir);
    check_aligned(&dir);
    check_metadata_only(&dir);
    for name in ["types", "llama", "aligned", "metadata_only"] {
        check_against_python_reader(&dir, name);
    }

    // The package writes version 3; the same bytes as version 2 read the same.
    let path = dir.join("types.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let v2_path = dir.join("types_v2.gguf");
    std::fs::write(&v2_path, &bytes).unwrap();
    let v2 = GgufSource::default().open_gguf(&v2_path).unwrap();
    let v3 = open(&dir, "types");
    assert_eq!(v2.version(), 2);
    assert_eq!(v2.tensors(), v3.tensors());
    for key in v3.keys() {
        assert_eq!(v2.metadata(key), v3.metadata(key), "{key}");
    }
}
