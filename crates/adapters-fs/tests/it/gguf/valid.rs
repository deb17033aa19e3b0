//! Valid files built by the test writer: what the reader accepts and what it returns.

use std::sync::Arc;

use guild_adapters_fs::gguf::{GgufSource, DEFAULT_ALIGNMENT};
use guild_ports::model::{MetaArray, MetaValue, ModelFile, ModelSource};

use super::craft::{Gguf, Kv, Tensor};

#[test]
fn the_valid_file_reads_back_field_for_field() {
    let temp = tempfile::tempdir().unwrap();
    let b = Gguf::valid().build();
    let path = b.write(temp.path(), "valid.gguf");
    let file = GgufSource::default().open_gguf(&path).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), DEFAULT_ALIGNMENT);
    assert_eq!(file.data_start(), b.at("data_start"));
    assert_eq!(file.location(), path);
    assert_eq!(
        file.keys(),
        [
            "general.architecture",
            "llama.block_count",
            "llama.rope.freq_base",
            "general.flag",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.scores",
            "general.bytes",
        ]
    );
    let meta = |k: &str| file.metadata(k).cloned();
    assert_eq!(
        meta("general.architecture"),
        Some(MetaValue::Str("llama".into()))
    );
    assert_eq!(meta("llama.block_count"), Some(MetaValue::U32(2)));
    assert_eq!(meta("llama.rope.freq_base"), Some(MetaValue::F32(10000.0)));
    assert_eq!(meta("general.flag"), Some(MetaValue::Bool(true)));
    assert_eq!(
        meta("tokenizer.ggml.tokens"),
        Some(MetaValue::Array(MetaArray::Strings(vec![
            "a".into(),
            "bc".into(),
            "déf".into()
        ])))
    );
    assert_eq!(
        meta("tokenizer.ggml.scores"),
        Some(MetaValue::Array(MetaArray::Floats {
            element_type: 6,
            values: vec![0.0, -1.5, 2.25]
        }))
    );
    assert_eq!(
        meta("general.bytes"),
        Some(MetaValue::Array(MetaArray::Ints {
            element_type: 0,
            values: vec![1, 2, 3, 250]
        }))
    );
    assert_eq!(meta("general.missing"), None);

    let t = file.tensors();
    let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(
        t.iter().map(|t| t.dtype).collect::<Vec<_>>(),
        [0, 8, 1],
        "f32, q8_0, f16"
    );
    assert_eq!(t[0].dims, [4, 2]);
    assert_eq!(t[1].dims, [32]);
    assert_eq!(t[2].dims, [3]);
    assert_eq!(
        t.iter().map(|t| t.size_bytes).collect::<Vec<_>>(),
        [32, 34, 6]
    );
    for (i, name) in names.iter().enumerate() {
        let start = b.at(&format!("data:{name}"));
        assert_eq!(t[i].offset, start, "{name}");
        let data = file.tensor_data(i).unwrap();
        assert_eq!(
            data,
            &b.bytes[start as usize..(start + t[i].size_bytes) as usize]
        );
    }
    // The second call borrows the same bytes.
    let first = file.tensor_data(1).unwrap().as_ptr();
    assert_eq!(file.tensor_data(1).unwrap().as_ptr(), first);
}

#[test]
fn version_2_reads_like_version_3() {
    let temp = tempfile::tempdir().unwrap();
    let v3 = Gguf::valid();
    let mut v2 = v3.clone();
    v2.version = 2;
    let a = GgufSource::default()
        .open_gguf(&v3.build().write(temp.path(), "v3.gguf"))
        .unwrap();
    let b = GgufSource::default()
        .open_gguf(&v2.build().write(temp.path(), "v2.gguf"))
        .unwrap();
    assert_eq!(b.version(), 2);
    assert_eq!(a.keys(), b.keys());
    for k in a.keys() {
        assert_eq!(a.metadata(k), b.metadata(k), "{k}");
    }
    assert_eq!(a.tensors(), b.tensors());
}

#[test]
fn a_custom_alignment_places_the_data_section_and_tensors() {
    let temp = tempfile::tempdir().unwrap();
    let mut g = Gguf::valid();
    g.kvs.push(Kv::u32("general.alignment", 128));
    g.alignment = 128;
    let b = g.build();
    let file = GgufSource::default()
        .open_gguf(&b.write(temp.path(), "aligned.gguf"))
        .unwrap();
    assert_eq!(file.alignment(), 128);
    assert_eq!(file.data_start() % 128, 0);
    assert_eq!(file.data_start(), b.at("data_start"));
    for t in file.tensors() {
        assert_eq!((t.offset - file.data_start()) % 128, 0, "{}", t.name);
        assert_eq!(t.offset, b.at(&format!("data:{}", t.name)));
    }
}

#[test]
fn gaps_zero_sized_tensors_and_no_tensors_are_accepted() {
    let temp = tempfile::tempdir().unwrap();
    let mut g = Gguf::valid();
    // A gap of 64 bytes before `c`, and a zero-sized tensor sharing `a`'s offset.
    g.tensor_mut("c").offset = Some(160);
    g.tensors.push(Tensor {
        offset: Some(0),
        ..Tensor::new("empty", 0, &[0, 4])
    });
    let b = g.build();
    let file = GgufSource::default()
        .open_gguf(&b.write(temp.path(), "gaps.gguf"))
        .unwrap();
    assert_eq!(file.tensors()[2].offset, file.data_start() + 160);
    assert_eq!(file.tensors()[3].size_bytes, 0);
    assert_eq!(file.tensor_data(3).unwrap(), &[] as &[u8]);

    let mut g = Gguf::valid();
    g.tensors.clear();
    let b = g.build();
    let file = GgufSource::default()
        .open_gguf(&b.write(temp.path(), "none.gguf"))
        .unwrap();
    assert!(file.tensors().is_empty());
    assert_eq!(file.keys().len(), 7);
}

#[test]
fn tensor_data_is_shared_between_threads() {
    let temp = tempfile::tempdir().unwrap();
    let b = Gguf::valid().build();
    let file: Arc<dyn ModelFile> = GgufSource::default()
        .open(&b.write(temp.path(), "valid.gguf"))
        .unwrap();
    let expected: Vec<Vec<u8>> = file
        .tensors()
        .iter()
        .map(|t| b.bytes[t.offset as usize..(t.offset + t.size_bytes) as usize].to_vec())
        .collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for (i, want) in expected.iter().enumerate() {
                    assert_eq!(file.tensor_data(i).unwrap(), &want[..]);
                }
            });
        }
    });
}
