//! Hand-made GGUF bytes for the reader's tests.
//!
//! Every field is written as raw bytes the test controls, so the hostile suite can produce what
//! no well-behaved writer would (wrong counts, invalid UTF-8, unknown types, overlapping data).
//! While writing, the builder records where each field starts ([`Built::at`]), so a test can
//! assert the byte offset an error names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use guild_domain::operation::DType;

/// GGUF value type numbers.
pub mod ty {
    pub const U8: u32 = 0;
    pub const U32: u32 = 4;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
}

/// A GGUF string: `u64` length and the bytes.
pub fn gstr(bytes: &[u8]) -> Vec<u8> {
    let mut out = (bytes.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

/// An array value: element type, length, encoded elements.
pub fn garray(element_type: u32, len: u64, elements: &[u8]) -> Vec<u8> {
    let mut out = element_type.to_le_bytes().to_vec();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(elements);
    out
}

/// A string array value.
pub fn gstr_array(items: &[&str]) -> Vec<u8> {
    let elements: Vec<u8> = items.iter().flat_map(|s| gstr(s.as_bytes())).collect();
    garray(ty::STRING, items.len() as u64, &elements)
}

/// One metadata entry, raw.
#[derive(Debug, Clone)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value_type: u32,
    pub value: Vec<u8>,
}

impl Kv {
    pub fn new(key: &str, value_type: u32, value: Vec<u8>) -> Self {
        Kv {
            key: key.as_bytes().to_vec(),
            value_type,
            value,
        }
    }

    pub fn u32(key: &str, v: u32) -> Self {
        Kv::new(key, ty::U32, v.to_le_bytes().to_vec())
    }

    pub fn string(key: &str, v: &str) -> Self {
        Kv::new(key, ty::STRING, gstr(v.as_bytes()))
    }
}

/// One tensor, raw.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: Vec<u8>,
    /// Written as the axis count unless `n_dims` overrides it.
    pub dims: Vec<u64>,
    pub n_dims: Option<u32>,
    pub ggml_type: u32,
    /// The offset written; `None` places the tensor after the previous one, aligned.
    pub offset: Option<u64>,
    /// The data written; `None` writes the size the type and dims give, filled with a pattern.
    pub data: Option<Vec<u8>>,
}

impl Tensor {
    pub fn new(name: &str, ggml_type: u32, dims: &[u64]) -> Self {
        Tensor {
            name: name.as_bytes().to_vec(),
            dims: dims.to_vec(),
            n_dims: None,
            ggml_type,
            offset: None,
            data: None,
        }
    }

    /// The bytes the type and dims give, for well-formed tensors.
    pub fn natural_size(&self) -> u64 {
        let block = DType::from_raw(self.ggml_type)
            .block()
            .expect("a known type");
        let elements: u64 = self.dims.iter().product();
        elements / u64::from(block.elements) * u64::from(block.bytes)
    }
}

/// A GGUF file to be written.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub magic: [u8; 4],
    pub version: u32,
    pub tensor_count: Option<u64>,
    pub kv_count: Option<u64>,
    pub kvs: Vec<Kv>,
    pub tensors: Vec<Tensor>,
    /// The alignment the layout uses (the file's own `general.alignment` is a `Kv`).
    pub alignment: u64,
}

/// Written bytes and where each field starts.
#[derive(Debug, Clone)]
pub struct Built {
    pub bytes: Vec<u8>,
    marks: HashMap<String, u64>,
}

impl Built {
    /// Where the field `mark` starts: `tensor_count`, `kv_count`, `kv:KEY` (its key length),
    /// `kv:KEY:type`, `kv:KEY:value`, `tensor:NAME` (its name length), `tensor:NAME:n_dims`,
    /// `tensor:NAME:ne`, `tensor:NAME:type`, `tensor:NAME:offset`, `data_start`,
    /// `data:NAME`. A repeated key or name records its last occurrence.
    pub fn at(&self, mark: &str) -> u64 {
        *self
            .marks
            .get(mark)
            .unwrap_or_else(|| panic!("no mark {mark}"))
    }

    /// Writes the bytes to `dir/name` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.bytes).unwrap();
        path
    }
}

impl Gguf {
    /// A small valid model: strings, integers, a float, a bool and arrays in the metadata;
    /// f32, q8_0 and f16 tensors, the second of which needs padding after it.
    pub fn valid() -> Self {
        let mut scores = Vec::new();
        for s in [0.0f32, -1.5, 2.25] {
            scores.extend_from_slice(&s.to_le_bytes());
        }
        Gguf {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: vec![
                Kv::string("general.architecture", "llama"),
                Kv::u32("llama.block_count", 2),
                Kv::new(
                    "llama.rope.freq_base",
                    ty::F32,
                    10000f32.to_le_bytes().to_vec(),
                ),
                Kv::new("general.flag", ty::BOOL, vec![1]),
                Kv::new(
                    "tokenizer.ggml.tokens",
                    ty::ARRAY,
                    gstr_array(&["a", "bc", "déf"]),
                ),
                Kv::new(
                    "tokenizer.ggml.scores",
                    ty::ARRAY,
                    garray(ty::F32, 3, &scores),
                ),
                Kv::new(
                    "general.bytes",
                    ty::ARRAY,
                    garray(ty::U8, 4, &[1, 2, 3, 250]),
                ),
            ],
            tensors: vec![
                Tensor::new("a", DType::F32.raw(), &[4, 2]),
                Tensor::new("b", DType::Q8_0.raw(), &[32]),
                Tensor::new("c", DType::F16.raw(), &[3]),
            ],
            alignment: 32,
        }
    }

    pub fn kv_mut(&mut self, key: &str) -> &mut Kv {
        self.kvs
            .iter_mut()
            .find(|kv| kv.key == key.as_bytes())
            .unwrap_or_else(|| panic!("no key {key}"))
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut Tensor {
        self.tensors
            .iter_mut()
            .find(|t| t.name == name.as_bytes())
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    /// Serialises the file. Tensor data is `i as u8` for byte `i` of the data section, unless
    /// a tensor brings its own.
    pub fn build(&self) -> Built {
        let mut b: Vec<u8> = Vec::new();
        let mut marks = HashMap::new();
        fn mark(marks: &mut HashMap<String, u64>, name: String, at: usize) {
            marks.insert(name, at as u64);
        }
        b.extend_from_slice(&self.magic);
        b.extend_from_slice(&self.version.to_le_bytes());
        mark(&mut marks, "tensor_count".into(), b.len());
        let tensor_count = self.tensor_count.unwrap_or(self.tensors.len() as u64);
        b.extend_from_slice(&tensor_count.to_le_bytes());
        mark(&mut marks, "kv_count".into(), b.len());
        let kv_count = self.kv_count.unwrap_or(self.kvs.len() as u64);
        b.extend_from_slice(&kv_count.to_le_bytes());
        for kv in &self.kvs {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            mark(&mut marks, format!("kv:{key}"), b.len());
            b.extend_from_slice(&gstr(&kv.key));
            mark(&mut marks, format!("kv:{key}:type"), b.len());
            b.extend_from_slice(&kv.value_type.to_le_bytes());
            mark(&mut marks, format!("kv:{key}:value"), b.len());
            b.extend_from_slice(&kv.value);
        }
        let mut next = 0u64;
        let mut placed = Vec::new();
        for t in &self.tensors {
            let name = String::from_utf8_lossy(&t.name).into_owned();
            mark(&mut marks, format!("tensor:{name}"), b.len());
            b.extend_from_slice(&gstr(&t.name));
            mark(&mut marks, format!("tensor:{name}:n_dims"), b.len());
            let n_dims = t.n_dims.unwrap_or(t.dims.len() as u32);
            b.extend_from_slice(&n_dims.to_le_bytes());
            mark(&mut marks, format!("tensor:{name}:ne"), b.len());
            for d in &t.dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            mark(&mut marks, format!("tensor:{name}:type"), b.len());
            b.extend_from_slice(&t.ggml_type.to_le_bytes());
            mark(&mut marks, format!("tensor:{name}:offset"), b.len());
            let offset = t.offset.unwrap_or(next);
            b.extend_from_slice(&offset.to_le_bytes());
            let data = t.data.clone().unwrap_or_else(|| {
                let size = t.natural_size() as usize;
                (0..size).map(|i| (offset as usize + i) as u8).collect()
            });
            next = (offset + data.len() as u64).next_multiple_of(self.alignment);
            placed.push((name, offset, data));
        }
        let data_start = (b.len() as u64).next_multiple_of(self.alignment);
        mark(&mut marks, "data_start".into(), data_start as usize);
        let mut section: Vec<u8> = Vec::new();
        for (name, offset, data) in placed {
            let start = offset as usize;
            if section.len() < start + data.len() {
                section.resize(start + data.len(), 0);
            }
            section[start..start + data.len()].copy_from_slice(&data);
            mark(
                &mut marks,
                format!("data:{name}"),
                data_start as usize + start,
            );
        }
        if !self.tensors.is_empty() {
            b.resize(data_start as usize, 0);
            b.extend_from_slice(&section);
        }
        Built { bytes: b, marks }
    }
}
