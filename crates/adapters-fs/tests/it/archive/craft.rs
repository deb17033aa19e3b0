//! Hand-made tar bytes and manifests for the archive tests.
//!
//! Headers are written field by field, checksum included, so that the tests can produce shapes
//! that no well-behaved tar writer (the `tar` crate's builder included) would: `..` and absolute
//! names, bytes hidden after a name's NUL, devices, sparse and long-name headers, broken
//! checksums, base-256 sizes.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use guild_domain::ids::Sha256Digest;
use guild_domain::manifest::{Manifest, Metadata};

/// One tar block.
pub const BLOCK: usize = 512;

/// The contents of the usual test artifact.
pub const LIB: &[u8] = b"\x7fELF pretend shared library for the archive tests";

/// `.gkmetadata` JSON listing `artifacts` (path, contents); the first one is the entry.
pub fn metadata_json(artifacts: &[(&str, &[u8])]) -> Vec<u8> {
    let list: Vec<String> = artifacts
        .iter()
        .map(|(path, data)| {
            format!(
                r#"{{"path":"{path}","size":{},"sha256":"{}"}}"#,
                data.len(),
                Sha256Digest::of(data)
            )
        })
        .collect();
    let entry = artifacts.first().map_or("lib/a.so", |a| a.0);
    format!(
        concat!(
            r#"{{"gkmetadata":1,"payload":{{"package_id":"org.example.scan","kind":"gkernel","#,
            r#""version":"1.0.0","publisher_id":"org.example","#,
            r#""kernel_abi":{{"min":"1.0.0","max":"1.0.0"}},"os":"linux","arch":"x86_64","#,
            r#""backends":["cpu"],"entry":"{}","artifacts":[{}],"provided_ops":[]}},"#,
            r#""signatures":[]}}"#
        ),
        entry,
        list.join(",")
    )
    .into_bytes()
}

/// The manifest inside `json`.
pub fn manifest(json: &[u8]) -> Manifest {
    match Metadata::parse(json) {
        Ok(m) => m.into_manifest(),
        Err(e) => panic!("test metadata does not parse: {e}"),
    }
}

/// The fields of one hand-made header.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: Vec<u8>,
    pub prefix: Vec<u8>,
    pub size: u64,
    pub type_flag: u8,
    pub mode: u32,
    pub linkname: Vec<u8>,
    /// GNU magic (`ustar  \0`) instead of POSIX (`ustar\000`).
    pub gnu: bool,
    /// No magic at all: a pre-POSIX (v7) header.
    pub v7: bool,
    /// Raw bytes for the size field, instead of octal `size`.
    pub raw_size: Option<[u8; 12]>,
}

impl Spec {
    pub fn new(name: impl AsRef<[u8]>, type_flag: u8, size: u64) -> Self {
        Spec {
            name: name.as_ref().to_vec(),
            prefix: Vec::new(),
            size,
            type_flag,
            mode: 0o644,
            linkname: Vec::new(),
            gnu: false,
            v7: false,
            raw_size: None,
        }
    }

    pub fn file(name: impl AsRef<[u8]>, size: u64) -> Self {
        Spec::new(name, b'0', size)
    }

    pub fn dir(name: impl AsRef<[u8]>) -> Self {
        let mut s = Spec::new(name, b'5', 0);
        s.mode = 0o755;
        s
    }

    pub fn link(name: impl AsRef<[u8]>, type_flag: u8, target: impl AsRef<[u8]>) -> Self {
        let mut s = Spec::new(name, type_flag, 0);
        s.linkname = target.as_ref().to_vec();
        s
    }
}

fn put(block: &mut [u8; BLOCK], at: usize, len: usize, value: &[u8]) {
    let n = value.len().min(len);
    block[at..at + n].copy_from_slice(&value[..n]);
}

fn put_octal(block: &mut [u8; BLOCK], at: usize, len: usize, value: u64) {
    let text = format!("{value:0width$o}\0", width = len - 1);
    put(block, at, len, text.as_bytes());
}

/// Builds the 512-byte header for `spec`, checksum included.
pub fn header(spec: &Spec) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    put(&mut b, 0, 100, &spec.name);
    put_octal(&mut b, 100, 8, u64::from(spec.mode));
    put_octal(&mut b, 108, 8, 0);
    put_octal(&mut b, 116, 8, 0);
    match spec.raw_size {
        Some(raw) => put(&mut b, 124, 12, &raw),
        None => put_octal(&mut b, 124, 12, spec.size),
    }
    put_octal(&mut b, 136, 12, 0);
    b[156] = spec.type_flag;
    put(&mut b, 157, 100, &spec.linkname);
    if !spec.v7 {
        let magic: &[u8] = if spec.gnu {
            b"ustar  \0"
        } else {
            b"ustar\x0000"
        };
        put(&mut b, 257, 8, magic);
    }
    if !spec.gnu {
        put(&mut b, 345, 155, &spec.prefix);
    }
    fix_checksum(&mut b);
    b
}

/// Recomputes a header's checksum after it was edited.
pub fn fix_checksum(b: &mut [u8; BLOCK]) {
    b[148..156].copy_from_slice(b"        ");
    let sum: u64 = b.iter().map(|&x| u64::from(x)).sum();
    let text = format!("{sum:06o}\0 ");
    b[148..156].copy_from_slice(text.as_bytes());
}

/// An archive being assembled from raw pieces.
#[derive(Debug, Clone, Default)]
pub struct Tar(pub Vec<u8>);

impl Tar {
    pub fn new() -> Self {
        Tar(Vec::new())
    }

    /// An archive whose first member is `.gkmetadata` holding `json`.
    pub fn with_metadata(json: &[u8]) -> Self {
        Tar::new().file(".gkmetadata", json)
    }

    pub fn file(self, name: &str, data: &[u8]) -> Self {
        self.member(&Spec::file(name, data.len() as u64), data)
    }

    pub fn dir(self, name: &str) -> Self {
        self.member(&Spec::dir(name), b"")
    }

    /// A header for `spec` followed by `data` and padding.
    pub fn member(self, spec: &Spec, data: &[u8]) -> Self {
        self.block(header(spec)).data(data)
    }

    pub fn block(mut self, block: [u8; BLOCK]) -> Self {
        self.0.extend_from_slice(&block);
        self
    }

    /// `data` then zero padding to the next block.
    pub fn data(mut self, data: &[u8]) -> Self {
        self.0.extend_from_slice(data);
        let rem = data.len() % BLOCK;
        if rem != 0 {
            self.0.resize(self.0.len() + BLOCK - rem, 0);
        }
        self
    }

    /// A PAX extended header with `records` (key, value), for the member after it.
    pub fn pax(self, type_flag: u8, records: &[(&str, &[u8])]) -> Self {
        let mut body = Vec::new();
        for (key, value) in records {
            let rest = key.len() + value.len() + 3;
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {key}=").as_bytes());
            body.extend_from_slice(value);
            body.push(b'\n');
        }
        let spec = Spec::new("PaxHeader", type_flag, body.len() as u64);
        self.member(&spec, &body)
    }

    /// The archive with its end-of-archive marker.
    pub fn end(mut self) -> Vec<u8> {
        self.0.resize(self.0.len() + 2 * BLOCK, 0);
        self.0
    }

    /// The archive without an end-of-archive marker.
    pub fn unterminated(self) -> Vec<u8> {
        self.0
    }
}

/// What a tree holds at one path, for before/after comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File { mode: u32, sha256: Sha256Digest },
    Dir { mode: u32 },
    Symlink { target: PathBuf },
    Other { mode: u32 },
}

/// Every path under `root` (relative), never following links.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let md = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let mode = mode_of(&md);
            let node = if md.file_type().is_symlink() {
                Node::Symlink {
                    target: fs::read_link(&path).unwrap(),
                }
            } else if md.is_dir() {
                walk(root, &path, out);
                Node::Dir { mode }
            } else if md.is_file() {
                Node::File {
                    mode,
                    sha256: Sha256Digest::of(&fs::read(&path).unwrap()),
                }
            } else {
                Node::Other { mode }
            };
            out.insert(rel, node);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[cfg(unix)]
pub fn mode_of(md: &fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    md.permissions().mode() & 0o7777
}
