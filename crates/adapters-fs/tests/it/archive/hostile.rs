//! The hostile-package suite: every refusal class, each case built at run time, each asserting
//! its exact error kind, that the staging directory is gone, and that nothing changed anywhere
//! else under the test's temporary root (nor at the usual escape targets outside it).

use std::fs;
use std::path::{Path, PathBuf};

use guild_adapters_fs::archive::GkpkSource;
use guild_domain::ids::Sha256Digest;
use guild_domain::path::PathRule;
use guild_ports::source::{ExtractLimits, ExtractOptions, PackageSource, SourceErrorKind};

use super::craft::{header, manifest, metadata_json, snapshot, Spec, Tar, BLOCK, LIB};

/// Where a case's package comes from.
enum Source {
    Tar(Vec<u8>),
    Dir(Box<dyn Fn(&Path)>),
}

struct Case {
    name: String,
    source: Source,
    /// The `.gkmetadata` the test hands to extraction (an archive carries its own copy).
    json: Vec<u8>,
    limits: ExtractLimits,
    expect: SourceErrorKind,
    /// The member the error must name, when the case cares.
    member: Option<String>,
    /// The staging directory exists (with a file in it) before extraction.
    staging_exists: bool,
    /// The staging directory is inside the (directory) source.
    staging_in_source: bool,
}

impl Case {
    fn new(name: &str, source: Source, json: &[u8], expect: SourceErrorKind) -> Self {
        Case {
            name: name.to_owned(),
            source,
            json: json.to_vec(),
            limits: ExtractLimits::default(),
            expect,
            member: None,
            staging_exists: false,
            staging_in_source: false,
        }
    }

    fn member(mut self, member: &str) -> Self {
        self.member = Some(member.to_owned());
        self
    }

    fn limits(mut self, limits: ExtractLimits) -> Self {
        self.limits = limits;
        self
    }
}

fn unsafe_path(rule: PathRule) -> SourceErrorKind {
    SourceErrorKind::UnsafePath { rule }
}

fn malformed(reason: &str) -> SourceErrorKind {
    SourceErrorKind::MalformedHeader {
        reason: reason.to_owned(),
    }
}

fn unsupported(what: &str) -> SourceErrorKind {
    SourceErrorKind::UnsupportedExtension {
        what: what.to_owned(),
    }
}

fn round_up(n: usize) -> usize {
    n.div_ceil(BLOCK) * BLOCK
}

/// The header checksum as stored (the unsigned sum with the checksum field read as spaces).
fn checksum(block: &[u8; BLOCK]) -> u64 {
    block
        .iter()
        .enumerate()
        .map(|(i, &b)| u64::from(if (148..156).contains(&i) { b' ' } else { b }))
        .sum()
}

/// Deterministic noise for the garbage case.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn write_dir_package(dir: &Path, json: &[u8], files: &[(&str, &[u8])]) {
    fs::write(dir.join(".gkmetadata"), json).unwrap();
    for (rel, data) in files {
        let path = dir.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, data).unwrap();
    }
}

// Cases are pushed one by one, grouped under comments, with the values some of them need built
// in between; one `vec![...]` literal would separate those values from their cases.
#[allow(clippy::vec_init_then_push)]
fn cases(escape: &str, root: &Path) -> Vec<Case> {
    use SourceErrorKind as K;
    let json = metadata_json(&[("lib/a.so", LIB)]);
    let json = json.as_slice();
    let start = || Tar::with_metadata(json);
    let valid = start().file("lib/a.so", LIB).end();
    // Offset of the first header after `.gkmetadata`.
    let second = BLOCK + round_up(json.len());
    let tar =
        |name: &str, bytes: Vec<u8>, expect: K| Case::new(name, Source::Tar(bytes), json, expect);
    let dir = |name: &str, build: Box<dyn Fn(&Path)>, expect: K| {
        Case::new(name, Source::Dir(build), json, expect)
    };
    let outside = root.join(escape);
    let mut v = Vec::new();

    // Framing: truncation, garbage, malformed headers.
    v.push(tar("empty file", Vec::new(), K::Truncated));
    v.push(tar(
        "cut inside a header",
        valid[..second + 100].to_vec(),
        K::Truncated,
    ));
    v.push(tar(
        "cut inside member data",
        valid[..second + BLOCK + 10].to_vec(),
        K::Truncated,
    ));
    v.push(tar(
        "no end-of-archive marker",
        start().file("lib/a.so", LIB).unterminated(),
        K::Truncated,
    ));
    v.push(tar(
        "a lone zero block at the end",
        start()
            .file("lib/a.so", LIB)
            .data(&[0u8; BLOCK])
            .unterminated(),
        K::Truncated,
    ));
    v.push(tar(
        "cut inside .gkmetadata",
        valid[..BLOCK + 10].to_vec(),
        K::Truncated,
    ));
    v.push(tar(
        "random garbage",
        noise(8192),
        malformed("the checksum field is not an octal number"),
    ));
    let lib_header = header(&Spec::file("lib/a.so", LIB.len() as u64));
    let mut flipped = valid.clone();
    flipped[second] = b'm';
    v.push(tar(
        "corrupted header checksum",
        flipped,
        K::HeaderChecksum {
            stored: checksum(&lib_header),
            computed: checksum(&lib_header) + 1,
        },
    ));
    let mut v7 = Spec::file("lib/a.so", LIB.len() as u64);
    v7.v7 = true;
    v.push(tar(
        "pre-POSIX header without magic",
        start().member(&v7, LIB).end(),
        malformed("not a ustar or GNU tar header"),
    ));
    let mut base256 = Spec::file("lib/a.so", 0);
    let mut raw = [0u8; 12];
    raw[0] = 0x80;
    raw[11] = LIB.len() as u8;
    base256.raw_size = Some(raw);
    v.push(tar(
        "base-256 size field",
        start().member(&base256, LIB).end(),
        malformed("a base-256 size field"),
    ));
    let mut bad_size = Spec::file("lib/a.so", 0);
    bad_size.raw_size = Some(*b"0000000009x\0");
    v.push(tar(
        "size field that is not octal",
        start().member(&bad_size, LIB).end(),
        malformed("the size field is not an octal number"),
    ));
    let mut trailing = valid.clone();
    trailing.extend_from_slice(&start().file("lib/b.so", LIB).end());
    v.push(tar(
        "members after the end-of-archive marker",
        trailing,
        malformed("data after the end-of-archive marker"),
    ));
    v.push(tar(
        "a zero block followed by more members",
        start()
            .file("lib/a.so", LIB)
            .data(&[0u8; BLOCK])
            .file("lib/b.so", LIB)
            .end(),
        malformed("a lone zero block inside the archive"),
    ));
    // "20012 path=" plus 20000 bytes plus a newline.
    let huge_record = vec![b'a'; 20_000];
    v.push(tar(
        "oversized PAX header",
        start()
            .pax(b'x', &[("path", &huge_record)])
            .file("lib/a.so", LIB)
            .end(),
        unsupported("a PAX header of 20012 bytes (the limit is 16384)"),
    ));
    let mut dir_with_data = Spec::dir("lib/");
    dir_with_data.size = 10;
    v.push(tar(
        "directory with data",
        start().member(&dir_with_data, b"0123456789").end(),
        malformed("a directory with 10 bytes of data"),
    ));

    // The manifest member.
    // The reader looks no further than the first member: whether a `.gkmetadata` comes later
    // is not known, and not worth reading a hostile archive to find out.
    v.push(
        tar(
            ".gkmetadata missing",
            Tar::new().file("lib/a.so", LIB).end(),
            K::MetadataNotFirst,
        )
        .member("lib/a.so"),
    );
    v.push(tar(
        "an empty archive",
        Tar::new().end(),
        K::MetadataMissing,
    ));
    v.push(
        tar(
            ".gkmetadata not first",
            Tar::new()
                .file("lib/a.so", LIB)
                .file(".gkmetadata", json)
                .end(),
            K::MetadataNotFirst,
        )
        .member("lib/a.so"),
    );
    v.push(
        tar(
            ".gkmetadata twice",
            start()
                .file("lib/a.so", LIB)
                .file(".gkmetadata", json)
                .end(),
            K::MetadataDuplicated,
        )
        .member(".gkmetadata"),
    );
    v.push(tar(
        ".gkmetadata twice, differently cased",
        start()
            .file(".GKMetadata", json)
            .file("lib/a.so", LIB)
            .end(),
        K::MetadataDuplicated,
    ));
    v.push(
        tar(
            ".gkmetadata over the limit",
            valid.clone(),
            K::MetadataTooLarge {
                size: json.len() as u64,
                limit: 64,
            },
        )
        .limits(ExtractLimits {
            max_metadata_bytes: 64,
            ..ExtractLimits::default()
        }),
    );
    v.push(tar(
        ".gkmetadata is a directory",
        Tar::new().dir(".gkmetadata/").file("lib/a.so", LIB).end(),
        K::MetadataNotAFile,
    ));
    v.push(tar(
        ".gkmetadata is a symlink",
        Tar::new()
            .member(&Spec::link(".gkmetadata", b'2', "/etc/passwd"), b"")
            .end(),
        K::Symlink,
    ));

    // Artifacts against the manifest.
    let mut tampered = LIB.to_vec();
    tampered[0] ^= 1;
    v.push(tar(
        "artifact bytes differ from the manifest",
        start().file("lib/a.so", &tampered).end(),
        K::DigestMismatch {
            expected: Box::new(Sha256Digest::of(LIB)),
            actual: Box::new(Sha256Digest::of(&tampered)),
        },
    ));
    let longer = [LIB, b"!"].concat();
    v.push(tar(
        "artifact size differs from the manifest",
        start().file("lib/a.so", &longer).end(),
        K::SizeMismatch {
            expected: LIB.len() as u64,
            actual: longer.len() as u64,
        },
    ));
    v.push(
        tar(
            "unlisted file",
            start()
                .file("lib/a.so", LIB)
                .file("lib/extra.so", LIB)
                .end(),
            K::UnlistedFile,
        )
        .member("lib/extra.so"),
    );
    let two = metadata_json(&[("lib/a.so", LIB), ("lib/b.so", LIB)]);
    let mut missing = tar(
        "listed artifact missing",
        Tar::with_metadata(&two).file("lib/a.so", LIB).end(),
        K::MissingArtifact,
    )
    .member("lib/b.so");
    missing.json = two;
    v.push(missing);

    // Caps.
    v.push(tar(
        "declared size over the per-file cap, with no data behind it",
        start()
            .block(header(&Spec::file("lib/a.so", 0o777_7777_7777)))
            .unterminated(),
        K::FileTooLarge {
            size: 0o777_7777_7777,
            limit: ExtractLimits::DEFAULT_MAX_FILE_BYTES,
        },
    ));
    let (x, y) = (vec![b'x'; 600], vec![b'y'; 600]);
    let big = metadata_json(&[("lib/x.bin", &x), ("lib/y.bin", &y)]);
    let mut total = Case::new(
        "sizes over the total cap",
        Source::Tar(
            Tar::with_metadata(&big)
                .file("lib/x.bin", &x)
                .file("lib/y.bin", &y)
                .end(),
        ),
        &big,
        K::TotalTooLarge {
            total: 1200,
            limit: 1000,
        },
    )
    .limits(ExtractLimits {
        max_total_bytes: 1000,
        ..ExtractLimits::default()
    });
    total.member = Some("lib/y.bin".to_owned());
    v.push(total);
    // Entries are the paths of the tree: `.gkmetadata`, `lib` (implied), then the files.
    let three = metadata_json(&[("lib/a.so", LIB), ("lib/b.so", LIB), ("lib/c.so", LIB)]);
    v.push(
        Case::new(
            "more entries than the cap",
            Source::Tar(
                Tar::with_metadata(&three)
                    .file("lib/a.so", LIB)
                    .file("lib/b.so", LIB)
                    .file("lib/c.so", LIB)
                    .end(),
            ),
            &three,
            K::TooManyEntries { limit: 4 },
        )
        .member("lib/c.so")
        .limits(ExtractLimits {
            max_entries: 4,
            ..ExtractLimits::default()
        }),
    );
    v.push(
        tar(
            "an unlisted directory member",
            start().dir("d1/").file("lib/a.so", LIB).end(),
            K::UnlistedDirectory,
        )
        .member("d1"),
    );
    v.push(
        tar(
            "a nested .gkmetadata",
            start()
                .file("lib/a.so", LIB)
                .file("lib/.GKMetadata", json)
                .end(),
            unsafe_path(PathRule::Reserved),
        )
        .member("lib/.GKMetadata"),
    );

    // Member kinds.
    v.push(tar(
        "symlink",
        start()
            .member(&Spec::link("lib/link.so", b'2', "/etc/passwd"), b"")
            .end(),
        K::Symlink,
    ));
    v.push(tar(
        "symlink to outside, then a file through it",
        start()
            .member(
                &Spec::link("lib", b'2', root.as_os_str().as_encoded_bytes()),
                b"",
            )
            .file(&format!("lib/{escape}"), LIB)
            .end(),
        K::Symlink,
    ));
    v.push(tar(
        "hard link",
        start()
            .file("lib/a.so", LIB)
            .member(&Spec::link("lib/b.so", b'1', "lib/a.so"), b"")
            .end(),
        K::HardLink,
    ));
    v.push(tar(
        "hard link to a file outside",
        start()
            .member(&Spec::link("lib/a.so", b'1', "/etc/shadow"), b"")
            .end(),
        K::HardLink,
    ));
    v.push(tar(
        "character device",
        start().member(&Spec::new("lib/null", b'3', 0), b"").end(),
        K::Device,
    ));
    v.push(tar(
        "block device",
        start().member(&Spec::new("lib/sda", b'4', 0), b"").end(),
        K::Device,
    ));
    v.push(tar(
        "FIFO",
        start().member(&Spec::new("lib/pipe", b'6', 0), b"").end(),
        K::Fifo,
    ));
    let mut sparse = Spec::new("lib/a.so", b'S', LIB.len() as u64);
    sparse.gnu = true;
    v.push(tar(
        "GNU sparse file",
        start().member(&sparse, LIB).end(),
        K::Sparse,
    ));
    let long_name = format!("lib/{}", "n".repeat(120));
    let mut gnu_long = Spec::new("././@LongLink", b'L', long_name.len() as u64 + 1);
    gnu_long.gnu = true;
    v.push(tar(
        "GNU long name",
        start()
            .member(&gnu_long, format!("{long_name}\0").as_bytes())
            .file("lib/a.so", LIB)
            .end(),
        unsupported("a GNU long name"),
    ));
    let mut gnu_link = Spec::new("././@LongLink", b'K', 10);
    gnu_link.gnu = true;
    v.push(tar(
        "GNU long link name",
        start().member(&gnu_link, b"/etc/pass\0").end(),
        unsupported("a GNU long link name"),
    ));
    v.push(tar(
        "PAX global header",
        start()
            .pax(b'g', &[("path", b"lib/a.so")])
            .file("lib/a.so", LIB)
            .end(),
        unsupported("a PAX global header"),
    ));
    v.push(tar(
        "PAX size override",
        start()
            .pax(b'x', &[("size", b"5")])
            .file("lib/a.so", LIB)
            .end(),
        unsupported("a PAX \"size\" record"),
    ));
    v.push(tar(
        "PAX link path",
        start()
            .pax(b'x', &[("linkpath", b"/etc/passwd")])
            .file("lib/a.so", LIB)
            .end(),
        unsupported("a PAX \"linkpath\" record"),
    ));
    v.push(tar(
        "PAX sparse map",
        start()
            .pax(b'x', &[("GNU.sparse.map", b"0,10")])
            .file("lib/a.so", LIB)
            .end(),
        unsupported("a PAX \"GNU.sparse.map\" record"),
    ));
    v.push(tar(
        "PAX path with '..'",
        start()
            .pax(b'x', &[("path", format!("../{escape}").as_bytes())])
            .file("lib/a.so", LIB)
            .end(),
        unsafe_path(PathRule::DotDotComponent),
    ));
    v.push(tar(
        "PAX path with a NUL",
        start()
            .pax(b'x', &[("path", b"lib/a.so\0/../x")])
            .file("lib/a.so", LIB)
            .end(),
        unsafe_path(PathRule::Nul),
    ));
    v.push(tar(
        "PAX path naming .gkmetadata",
        start()
            .pax(b'x', &[("path", b".gkmetadata")])
            .file("lib/a.so", LIB)
            .end(),
        K::MetadataDuplicated,
    ));
    v.push(tar(
        "two PAX headers for one member",
        start()
            .pax(b'x', &[("path", b"lib/a.so")])
            .pax(b'x', &[("path", b"lib/a.so")])
            .file("x", LIB)
            .end(),
        malformed("two PAX headers for one member"),
    ));
    v.push(tar(
        "PAX header with no member after it",
        start()
            .file("lib/a.so", LIB)
            .pax(b'x', &[("path", b"lib/b.so")])
            .end(),
        malformed("a PAX header with no member after it"),
    ));
    v.push(tar(
        "contiguous file type",
        start()
            .member(&Spec::new("lib/a.so", b'7', LIB.len() as u64), LIB)
            .end(),
        K::UnsupportedEntryType { type_flag: '7' },
    ));
    let mut volume = Spec::new("VOLUME", b'V', 0);
    volume.gnu = true;
    v.push(tar(
        "GNU volume header",
        start().member(&volume, b"").end(),
        K::UnsupportedEntryType { type_flag: 'V' },
    ));

    // Names.
    let named = |case: &str, name: &[u8], rule: PathRule| {
        let bytes = start()
            .member(&Spec::file(name, LIB.len() as u64), LIB)
            .end();
        Case::new(case, Source::Tar(bytes), json, unsafe_path(rule))
    };
    v.push(named(
        "'..' first",
        format!("../{escape}").as_bytes(),
        PathRule::DotDotComponent,
    ));
    v.push(named(
        "'..' climbing out of a subdirectory",
        format!("lib/../../{escape}").as_bytes(),
        PathRule::DotDotComponent,
    ));
    v.push(named(
        "absolute path",
        outside.as_os_str().as_encoded_bytes(),
        PathRule::Absolute,
    ));
    v.push(named(
        "'.' component",
        b"lib/./a.so",
        PathRule::DotComponent,
    ));
    v.push(named("leading './'", b"./lib/a.so", PathRule::DotComponent));
    v.push(named(
        "empty component",
        b"lib//a.so",
        PathRule::EmptyComponent,
    ));
    v.push(named(
        "trailing slash on a file",
        b"lib/a.so/",
        PathRule::EmptyComponent,
    ));
    v.push(named(
        "NUL with bytes hidden after it",
        format!("lib/a.so\0../../{escape}").as_bytes(),
        PathRule::Nul,
    ));
    v.push(named(
        "backslashes",
        format!("lib\\..\\..\\{escape}").as_bytes(),
        PathRule::Backslash,
    ));
    v.push(named(
        "space",
        b"lib/a b.so",
        PathRule::BadCharacter { found: ' ', at: 5 },
    ));
    v.push(named(
        "not UTF-8",
        b"lib/\xff.so",
        PathRule::BadCharacter {
            found: '\u{fffd}',
            at: 4,
        },
    ));
    v.push(named("empty name", b"", PathRule::Empty));
    let deep = vec!["d"; 17].join("/");
    v.push(named(
        "too deep",
        deep.as_bytes(),
        PathRule::TooManyComponents { count: 17 },
    ));
    let mut overlong = Spec::file("b".repeat(100), LIB.len() as u64);
    overlong.prefix = "a".repeat(155).into_bytes();
    v.push(tar(
        "too long (ustar prefix and name)",
        start().member(&overlong, LIB).end(),
        unsafe_path(PathRule::TooLong { len: 256 }),
    ));
    let long_component = format!("lib/{}", "c".repeat(101));
    v.push(tar(
        "component too long (PAX path)",
        start()
            .pax(b'x', &[("path", long_component.as_bytes())])
            .file("x", LIB)
            .end(),
        unsafe_path(PathRule::ComponentTooLong {
            component: "c".repeat(101),
            len: 101,
        }),
    ));

    // The tree.
    let upper = metadata_json(&[("Lib.so", LIB)]);
    let mut case = Case::new(
        "case collision",
        Source::Tar(
            Tar::with_metadata(&upper)
                .file("Lib.so", LIB)
                .file("lib.so", LIB)
                .end(),
        ),
        &upper,
        K::CaseCollision {
            other: "Lib.so".to_owned(),
        },
    );
    case.member = Some("lib.so".to_owned());
    v.push(case);
    let upper_dir = metadata_json(&[("Lib/a.so", LIB), ("lib2/b.so", LIB)]);
    v.push(Case::new(
        "case-colliding directories",
        Source::Tar(
            Tar::with_metadata(&upper_dir)
                .file("Lib/a.so", LIB)
                .file("lib/b.so", LIB)
                .end(),
        ),
        &upper_dir,
        K::CaseCollision {
            other: "Lib".to_owned(),
        },
    ));
    v.push(tar(
        "the same file twice",
        start().file("lib/a.so", LIB).file("lib/a.so", LIB).end(),
        K::DuplicateEntry,
    ));
    v.push(tar(
        "the same directory twice",
        start().dir("lib/").dir("lib/").file("lib/a.so", LIB).end(),
        K::DuplicateEntry,
    ));
    v.push(tar(
        "directory entry over a file",
        start().file("lib/a.so", LIB).dir("lib/a.so/").end(),
        K::PathConflict {
            other: "lib/a.so".to_owned(),
        },
    ));
    v.push(tar(
        "file entry over a directory",
        start().dir("lib/").file("lib", LIB).end(),
        K::PathConflict {
            other: "lib".to_owned(),
        },
    ));
    v.push(tar(
        "file under a file",
        start().file("lib/a.so", LIB).file("lib/a.so/x", LIB).end(),
        K::PathConflict {
            other: "lib/a.so".to_owned(),
        },
    ));

    // Large artifacts, hashed on a second thread while they are written: the same refusals.
    let big = noise(5 << 20);
    let big_json = metadata_json(&[("lib/big.bin", &big)]);
    let mut big_tampered = big.clone();
    *big_tampered.last_mut().unwrap() ^= 1;
    let big_tar = |name: &str, bytes: Vec<u8>, expect: K| {
        Case::new(name, Source::Tar(bytes), &big_json, expect).member("lib/big.bin")
    };
    v.push(big_tar(
        "large artifact: last byte differs from the manifest",
        Tar::with_metadata(&big_json)
            .file("lib/big.bin", &big_tampered)
            .end(),
        K::DigestMismatch {
            expected: Box::new(Sha256Digest::of(&big)),
            actual: Box::new(Sha256Digest::of(&big_tampered)),
        },
    ));
    let whole = Tar::with_metadata(&big_json)
        .file("lib/big.bin", &big)
        .end();
    let cut = BLOCK + round_up(big_json.len()) + BLOCK + (3 << 20);
    v.push(big_tar(
        "large artifact: cut inside its data",
        whole[..cut].to_vec(),
        K::Truncated,
    ));
    let (dj, tampered_digest) = (big_json.clone(), Sha256Digest::of(&big_tampered));
    v.push(
        Case::new(
            "directory: large artifact's bytes differ",
            Source::Dir(Box::new(move |d| {
                write_dir_package(d, &dj, &[("lib/big.bin", &big_tampered)])
            })),
            &big_json,
            K::DigestMismatch {
                expected: Box::new(Sha256Digest::of(&big)),
                actual: Box::new(tampered_digest),
            },
        )
        .member("lib/big.bin"),
    );

    // The staging directory.
    let mut exists = tar(
        "staging directory already exists",
        valid.clone(),
        K::Truncated,
    );
    exists.staging_exists = true;
    v.push(exists);

    // Directory sources.
    let dj = json.to_vec();
    v.push(dir(
        "directory: symlink inside",
        Box::new(move |d| {
            write_dir_package(d, &dj, &[("lib/a.so", LIB)]);
            std::os::unix::fs::symlink("/etc/passwd", d.join("lib/b.so")).unwrap();
        }),
        K::Symlink,
    ));
    let dj = json.to_vec();
    let target = root.to_path_buf();
    v.push(dir(
        "directory: symlinked subdirectory pointing outside",
        Box::new(move |d| {
            write_dir_package(d, &dj, &[]);
            std::os::unix::fs::symlink(&target, d.join("lib")).unwrap();
        }),
        K::Symlink,
    ));
    let dj = json.to_vec();
    v.push(dir(
        "directory: .gkmetadata is a symlink",
        Box::new(move |d| {
            write_dir_package(d, &dj, &[("lib/a.so", LIB)]);
            fs::remove_file(d.join(".gkmetadata")).unwrap();
            fs::write(d.join("real"), &dj).unwrap();
            std::os::unix::fs::symlink("real", d.join(".gkmetadata")).unwrap();
        }),
        K::Symlink,
    ));
    let dj = json.to_vec();
    v.push(dir(
        "directory: socket",
        Box::new(move |d| {
            write_dir_package(d, &dj, &[("lib/a.so", LIB)]);
            // Keeping the socket file is all that is needed; the listener can go.
            drop(std::os::unix::net::UnixListener::bind(d.join("lib/sock")).unwrap());
        }),
        K::Socket,
    ));
    if has_mkfifo() {
        let dj = json.to_vec();
        v.push(dir(
            "directory: FIFO",
            Box::new(move |d| {
                write_dir_package(d, &dj, &[("lib/a.so", LIB)]);
                let status = std::process::Command::new("mkfifo")
                    .arg(d.join("lib/pipe"))
                    .status()
                    .unwrap();
                assert!(status.success());
            }),
            K::Fifo,
        ));
    } else {
        println!("hostile archives: `mkfifo` not found, the directory FIFO case is skipped");
    }
    let cj = upper.clone();
    let mut case = Case::new(
        "directory: case collision",
        Source::Dir(Box::new(move |d| {
            write_dir_package(d, &cj, &[("Lib.so", LIB), ("lib.so", LIB)]);
        })),
        &upper,
        K::CaseCollision {
            other: "Lib.so".to_owned(),
        },
    );
    case.member = Some("lib.so".to_owned());
    v.push(case);
    let dj = json.to_vec();
    v.push(
        dir(
            "directory: unlisted file",
            Box::new(move |d| write_dir_package(d, &dj, &[("lib/a.so", LIB), ("lib/z.so", LIB)])),
            K::UnlistedFile,
        )
        .member("lib/z.so"),
    );
    let dj = json.to_vec();
    let tampered_dir = tampered.clone();
    v.push(dir(
        "directory: artifact bytes differ",
        Box::new(move |d| write_dir_package(d, &dj, &[("lib/a.so", &tampered_dir)])),
        K::DigestMismatch {
            expected: Box::new(Sha256Digest::of(LIB)),
            actual: Box::new(Sha256Digest::of(&tampered)),
        },
    ));
    v.push(dir(
        "directory: .gkmetadata missing",
        Box::new(move |d| {
            fs::create_dir_all(d.join("lib")).unwrap();
            fs::write(d.join("lib/a.so"), LIB).unwrap();
        }),
        K::MetadataMissing,
    ));
    let dj = json.to_vec();
    v.push(dir(
        "directory: .gkmetadata is a directory",
        Box::new(move |d| {
            write_dir_package(d, &dj, &[("lib/a.so", LIB)]);
            fs::remove_file(d.join(".gkmetadata")).unwrap();
            fs::create_dir(d.join(".gkmetadata")).unwrap();
        }),
        K::MetadataNotAFile,
    ));
    let dj = json.to_vec();
    v.push(dir(
        "directory: name with a space",
        Box::new(move |d| write_dir_package(d, &dj, &[("lib/a.so", LIB), ("lib/a b.so", LIB)])),
        unsafe_path(PathRule::BadCharacter { found: ' ', at: 5 }),
    ));
    let dj = json.to_vec();
    v.push(
        dir(
            "directory: more entries than the cap",
            Box::new(move |d| {
                let names: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
                let files: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), LIB)).collect();
                write_dir_package(d, &dj, &files);
            }),
            K::TooManyEntries { limit: 4 },
        )
        .limits(ExtractLimits {
            max_entries: 4,
            ..ExtractLimits::default()
        }),
    );
    let dj = json.to_vec();
    let mut inside = dir(
        "directory: staging inside the source",
        Box::new(move |d| write_dir_package(d, &dj, &[("lib/a.so", LIB)])),
        K::Truncated,
    );
    inside.staging_in_source = true;
    v.push(inside);
    v
}

fn has_mkfifo() -> bool {
    std::process::Command::new("mkfifo")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn hostile_packages_are_refused_and_leave_nothing_behind() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("root");
    fs::create_dir(&root).unwrap();
    let escape = format!("guild-escape-{}", std::process::id());
    let escape_targets: Vec<PathBuf> = [
        Some(root.join(&escape)),
        Some(temp.path().join(&escape)),
        temp.path().parent().map(|p| p.join(&escape)),
        Some(PathBuf::from("/").join(&escape)),
        std::env::current_dir().ok().map(|p| p.join(&escape)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let cases = cases(&escape, &root);
    let count = cases.len();
    let mut verified_in_place = 0;
    for (i, mut case) in cases.into_iter().enumerate() {
        let name = case.name.clone();
        let case_dir = root.join(format!("case-{i:02}"));
        let sentinel = case_dir.join("sentinel");
        fs::create_dir_all(&sentinel).unwrap();
        fs::write(sentinel.join("keep"), b"sentinel").unwrap();
        let location = match &case.source {
            Source::Tar(bytes) => {
                let path = case_dir.join("package.gkernel");
                fs::write(&path, bytes).unwrap();
                path
            }
            Source::Dir(build) => {
                let path = case_dir.join("package");
                fs::create_dir(&path).unwrap();
                build(&path);
                path
            }
        };
        let staging = if case.staging_in_source {
            location.join("staging")
        } else {
            sentinel.join("staging")
        };
        if case.staging_exists {
            fs::create_dir(&staging).unwrap();
            fs::write(staging.join("keep"), b"earlier").unwrap();
            case.expect = SourceErrorKind::StagingExists {
                path: staging.clone(),
            };
        }
        if case.staging_in_source {
            case.expect = SourceErrorKind::StagingInsideSource {
                path: staging.clone(),
            };
        }
        let before = snapshot(&root);
        let source = GkpkSource::new(ExtractOptions {
            limits: case.limits,
            ..ExtractOptions::default()
        });
        let manifest = manifest(&case.json);
        let err = match source.open(&location) {
            Err(e) => e,
            Ok(opened) => match opened.extract_to(&manifest, &staging) {
                Err(e) => e,
                Ok(x) => panic!("case {i} ({name}) was accepted: {x:?}"),
            },
        };
        assert_eq!(err.kind, case.expect, "case {i} ({name}): {err}");
        assert_eq!(err.location, location, "case {i} ({name})");
        // Verifying in place applies the same rules and finds the same fault (the staging
        // cases aside, as verification has no staging directory).
        if !case.staging_exists && !case.staging_in_source {
            let verified = source
                .open(&location)
                .and_then(|opened| opened.verify_in_place(&manifest));
            match verified {
                Err(e) => assert_eq!(e.kind, case.expect, "case {i} ({name}) in place: {e}"),
                Ok(x) => panic!("case {i} ({name}) verified in place: {x:?}"),
            }
            verified_in_place += 1;
        }
        if let Some(member) = &case.member {
            assert_eq!(
                err.member.as_ref(),
                Some(member),
                "case {i} ({name}): {err}"
            );
        }
        assert!(!err.to_string().is_empty());
        assert_eq!(
            snapshot(&root),
            before,
            "case {i} ({name}): something changed outside the staging directory"
        );
        if !case.staging_exists {
            assert!(
                !staging.exists(),
                "case {i} ({name}): the staging directory is still there"
            );
        }
        for target in &escape_targets {
            assert!(
                !target.exists(),
                "case {i} ({name}): {} was written",
                target.display()
            );
        }
    }
    println!(
        "hostile archives: {count} cases refused by extraction, nothing written outside \
         staging; {verified_in_place} also refused by in-place verification"
    );
    assert!(count >= 30, "only {count} cases");
}
