//! Generated mutations of a valid file: byte flips, overwritten words and truncations never make
//! the reader panic, and whatever it accepts is consistent with the file.

use std::fs;

use guild_adapters_fs::gguf::{GgufLimits, GgufSource};
use guild_ports::model::ModelFile;
use proptest::prelude::*;

use super::craft::{Gguf, Kv};

/// The base: the valid file plus a custom alignment, so the mutations can reach that path too.
fn base() -> Vec<u8> {
    let mut g = Gguf::valid();
    g.kvs.push(Kv::u32("general.alignment", 64));
    g.alignment = 64;
    g.build().bytes
}

/// Opens `bytes` and, when the reader accepts them, checks what it returned against the file.
fn check(bytes: &[u8]) {
    let temp = tempfile::tempdir().unwrap();
    let path = temp.path().join("m.gguf");
    fs::write(&path, bytes).unwrap();
    // Tight limits, so that a mutated count or length is refused by a limit or by the file's
    // size, never by running out of memory.
    let limits = GgufLimits {
        max_header_bytes: 1 << 20,
        max_array_len: 1 << 16,
        max_decoded_bytes: 4 << 20,
        ..GgufLimits::default()
    };
    let file = match GgufSource::new(limits).open_gguf(&path) {
        Ok(file) => file,
        Err(err) => {
            assert_eq!(err.location, path);
            if let Some(at) = err.at {
                assert!(at <= bytes.len() as u64, "{err}");
            }
            return;
        }
    };
    let len = bytes.len() as u64;
    assert!(file.alignment().is_power_of_two());
    assert_eq!(file.data_start() % file.alignment(), 0);
    for key in file.keys() {
        assert!(file.metadata(key).is_some(), "{key}");
    }
    for (i, t) in file.tensors().iter().enumerate() {
        assert!(!t.name.is_empty());
        assert!((1..=4).contains(&t.dims.len()));
        assert!(t.offset >= file.data_start());
        assert_eq!((t.offset - file.data_start()) % file.alignment(), 0);
        assert!(
            t.offset + t.size_bytes <= len,
            "{} ends past the file",
            t.name
        );
        let data = file.tensor_data(i).unwrap();
        assert_eq!(
            data,
            &bytes[t.offset as usize..(t.offset + t.size_bytes) as usize]
        );
    }
}

/// One mutation.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR a byte.
    Flip(usize, u8),
    /// Overwrite eight bytes with a word (a count, a length, an offset).
    Word(usize, u64),
    /// Cut the file.
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop_oneof![
        Just(0u64),
        Just(1),
        Just(31),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX),
        Just(1 << 63),
        any::<u64>(),
    ];
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        2 => (any::<usize>(), interesting).prop_map(|(i, w)| Mutation::Word(i, w)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match *m {
        Mutation::Flip(i, x) => {
            let i = i % bytes.len();
            bytes[i] ^= x;
        }
        Mutation::Word(i, w) => {
            let i = i % bytes.len();
            let end = (i + 8).min(bytes.len());
            bytes[i..end].copy_from_slice(&w.to_le_bytes()[..end - i]);
        }
        Mutation::Truncate(n) => bytes.truncate(n % bytes.len()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn mutated_files_never_panic(mutations in prop::collection::vec(mutation(), 1..6)) {
        let mut bytes = base();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        check(&bytes);
    }
}

#[test]
fn every_prefix_of_the_file_is_refused_or_consistent() {
    let bytes = base();
    for n in 0..bytes.len() {
        check(&bytes[..n]);
    }
    check(&bytes);
}
