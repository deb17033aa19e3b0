//! Valid packages: what the writer produces extracts back identically, an archive and the
//! equivalent directory extract to the same read-only tree, and archives from other writers
//! (the `tar` crate, GNU tar) are read.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use guild_adapters_fs::archive::{scan_artifacts, write_gkpk, GkpkSource, PackError};
use guild_domain::ids::Sha256Digest;
use guild_domain::manifest::Artifact;
use guild_domain::path::ArtifactPath;
use guild_ports::source::{
    Durability, ExtractOptions, ExtractedPackage, PackageSource, SourceErrorKind,
};

use super::craft::{manifest, metadata_json, mode_of, snapshot, Node, Spec, Tar, BLOCK, LIB};

/// A source tree with nested directories, an empty file and a file large enough to be hashed
/// on a second thread while it is written (over 4 MiB).
fn sample_tree(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let files: Vec<(&'static str, Vec<u8>)> = vec![
        ("lib/libscan.so", LIB.to_vec()),
        (
            "lib/cuda/kernels.fatbin",
            (0..5_000_000u32).map(|i| (i % 251) as u8).collect(),
        ),
        ("share/empty.dat", Vec::new()),
        ("README.txt", b"scan kernels\n".to_vec()),
    ];
    for (rel, data) in &files {
        let path = dir.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, data).unwrap();
    }
    files
}

/// The `.gkmetadata` JSON for the artifacts `scan_artifacts` found.
fn json_for(artifacts: &[Artifact]) -> Vec<u8> {
    let owned: Vec<(String, Vec<u8>)> = Vec::new();
    let _ = owned;
    let list: Vec<String> = artifacts
        .iter()
        .map(|a| {
            format!(
                r#"{{"path":"{}","size":{},"sha256":"{}"}}"#,
                a.path, a.size, a.sha256
            )
        })
        .collect();
    format!(
        concat!(
            r#"{{"gkmetadata":1,"payload":{{"package_id":"org.example.scan","kind":"gkernel","#,
            r#""version":"1.0.0","publisher_id":"org.example","#,
            r#""kernel_abi":{{"min":"1.0.0","max":"1.0.0"}},"os":"linux","arch":"x86_64","#,
            r#""backends":["cpu"],"entry":"lib/libscan.so","artifacts":[{}],"provided_ops":[]}},"#,
            r#""signatures":[]}}"#
        ),
        list.join(",")
    )
    .into_bytes()
}

fn path(p: &str) -> ArtifactPath {
    ArtifactPath::new(p).unwrap()
}

fn inputs(dir: &Path, artifacts: &[Artifact]) -> Vec<(ArtifactPath, PathBuf)> {
    artifacts
        .iter()
        .map(|a| (a.path.clone(), dir.join(a.path.as_str())))
        .collect()
}

fn extract(
    location: &Path,
    json: &[u8],
    staging: &Path,
    options: ExtractOptions,
) -> ExtractedPackage {
    let opened = GkpkSource::new(options)
        .open(location)
        .unwrap_or_else(|e| panic!("open {}: {e}", location.display()));
    assert_eq!(opened.metadata_bytes(), json);
    opened
        .extract_to(&manifest(json), staging)
        .unwrap_or_else(|e| panic!("extract {}: {e}", location.display()))
}

/// Checks that every file is `0o444` and every directory `0o755`.
fn assert_read_only(tree: &BTreeMap<PathBuf, Node>) {
    for (rel, node) in tree {
        match node {
            Node::File { mode, .. } => assert_eq!(*mode, 0o444, "{}", rel.display()),
            Node::Dir { mode } => assert_eq!(*mode, 0o755, "{}", rel.display()),
            other => panic!("{} is {other:?}", rel.display()),
        }
    }
}

#[test]
fn archive_and_directory_extract_to_identical_read_only_trees() {
    let temp = tempfile::tempdir().unwrap();
    let src = temp.path().join("src");
    fs::create_dir(&src).unwrap();
    let files = sample_tree(&src);
    fs::create_dir(src.join("empty-dir")).unwrap();
    let artifacts = scan_artifacts(&src).unwrap();
    let mut expected: Vec<Artifact> = files
        .iter()
        .map(|(p, data)| Artifact {
            path: path(p),
            size: data.len() as u64,
            sha256: Sha256Digest::of(data),
        })
        .collect();
    expected.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(artifacts, expected);

    let json = json_for(&artifacts);
    fs::write(src.join(".gkmetadata"), &json).unwrap();
    let archive = temp.path().join("scan.gkernel");
    let written = write_gkpk(&archive, &json, &inputs(&src, &artifacts)).unwrap();
    assert_eq!(written, artifacts);

    let from_archive = extract(
        &archive,
        &json,
        &temp.path().join("a"),
        ExtractOptions::default(),
    );
    // The directory source's empty directory lies on no artifact's path, so it is refused
    // rather than carried into the tree; without it the source extracts.
    let err = GkpkSource::default()
        .open(&src)
        .and_then(|o| o.extract_to(&manifest(&json), &temp.path().join("d")))
        .unwrap_err();
    assert_eq!(err.kind, SourceErrorKind::UnlistedDirectory);
    assert_eq!(err.member.as_deref(), Some("empty-dir"));
    assert!(!temp.path().join("d").exists());
    fs::remove_dir(src.join("empty-dir")).unwrap();
    let from_dir = extract(
        &src,
        &json,
        &temp.path().join("d"),
        ExtractOptions::default(),
    );
    assert_eq!(from_archive.files, artifacts);
    assert_eq!(from_dir.files, artifacts);
    assert_eq!(from_archive.root, temp.path().join("a"));

    let tree_a = snapshot(&from_archive.root);
    let tree_d = snapshot(&from_dir.root);
    assert_read_only(&tree_a);
    assert_read_only(&tree_d);
    assert_eq!(tree_a, tree_d);
    assert_eq!(
        fs::read(from_archive.root.join(".gkmetadata")).unwrap(),
        json
    );
    for (rel, data) in &files {
        assert_eq!(
            &fs::read(from_archive.root.join(rel)).unwrap(),
            data,
            "{rel}"
        );
    }

    // An extracted tree is itself a complete directory package.
    let again = extract(
        &from_archive.root,
        &json,
        &temp.path().join("again"),
        ExtractOptions::default(),
    );
    assert_eq!(snapshot(&again.root), tree_a);
}

#[test]
fn written_archives_are_deterministic_ustar() {
    let temp = tempfile::tempdir().unwrap();
    let src = temp.path().join("src");
    fs::create_dir(&src).unwrap();
    sample_tree(&src);
    let artifacts = scan_artifacts(&src).unwrap();
    let json = json_for(&artifacts);
    let mut list = inputs(&src, &artifacts);
    let one = temp.path().join("one.gkernel");
    write_gkpk(&one, &json, &list).unwrap();
    // Input order does not matter; nor do the files' own modes and times.
    list.reverse();
    fs::set_permissions(
        src.join("README.txt"),
        <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .unwrap();
    let two = temp.path().join("two.gkernel");
    write_gkpk(&two, &json, &list).unwrap();
    let bytes = fs::read(&one).unwrap();
    assert_eq!(bytes, fs::read(&two).unwrap());

    assert_eq!(bytes.len() % BLOCK, 0);
    assert_eq!(&bytes[..12], b".gkmetadata\0");
    assert_eq!(&bytes[257..265], b"ustar\x0000");
    assert_eq!(&bytes[100..108], b"0000644\0", "mode");
    assert_eq!(&bytes[136..148], b"00000000000\0", "mtime");
    assert_eq!(&bytes[bytes.len() - 2 * BLOCK..], &[0u8; 2 * BLOCK][..]);
    // No temporary file is left beside the output.
    let names: Vec<_> = fs::read_dir(temp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["one.gkernel", "src", "two.gkernel"]);
}

#[test]
fn paths_too_long_for_ustar_round_trip_through_pax() {
    let temp = tempfile::tempdir().unwrap();
    let src = temp.path().join("src");
    let long = format!("{}/{}/{}", "a".repeat(100), "b".repeat(100), "c".repeat(53));
    assert_eq!(long.len(), 255);
    let file = src.join(&long);
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, LIB).unwrap();
    let artifacts = scan_artifacts(&src).unwrap();
    assert_eq!(artifacts[0].path.as_str(), long);
    let json = metadata_json(&[(long.as_str(), LIB)]);
    let archive = temp.path().join("long.gkernel");
    write_gkpk(&archive, &json, &inputs(&src, &artifacts)).unwrap();
    let bytes = fs::read(&archive).unwrap();
    let needle = format!("path={long}\n");
    assert!(bytes.windows(needle.len()).any(|w| w == needle.as_bytes()));
    let out = extract(
        &archive,
        &json,
        &temp.path().join("x"),
        ExtractOptions::default(),
    );
    assert_eq!(fs::read(out.root.join(&long)).unwrap(), LIB);
}

#[test]
fn special_mode_bits_are_normalised_not_kept() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("bin/tool.so", LIB)]);
    let mut dir = Spec::dir("bin/");
    dir.mode = 0o7777;
    let mut file = Spec::file("bin/tool.so", LIB.len() as u64);
    file.mode = 0o6777;
    let archive = temp.path().join("modes.gkernel");
    fs::write(
        &archive,
        Tar::with_metadata(&json)
            .member(&dir, b"")
            .member(&file, LIB)
            .end(),
    )
    .unwrap();
    let out = extract(
        &archive,
        &json,
        &temp.path().join("x"),
        ExtractOptions::default(),
    );
    let md = |p: &str| fs::symlink_metadata(out.root.join(p)).unwrap();
    assert_eq!(mode_of(&md("bin/tool.so")), 0o444);
    assert_eq!(mode_of(&md("bin")), 0o755);
    assert_eq!(mode_of(&md(".gkmetadata")), 0o444);
    assert_eq!(mode_of(&fs::symlink_metadata(&out.root).unwrap()), 0o755);
}

#[test]
fn pax_paths_and_ignored_records_are_honoured() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB)]);
    let archive = temp.path().join("pax.gkernel");
    let bytes = Tar::with_metadata(&json)
        .pax(
            b'x',
            &[
                ("mtime", b"1700000000.5"),
                ("path", b"lib/a.so"),
                ("uname", b"builder"),
            ],
        )
        .file("placeholder", LIB)
        .end();
    fs::write(&archive, bytes).unwrap();
    let out = extract(
        &archive,
        &json,
        &temp.path().join("x"),
        ExtractOptions::default(),
    );
    assert_eq!(fs::read(out.root.join("lib/a.so")).unwrap(), LIB);
    assert!(!out.root.join("placeholder").exists());
}

#[test]
fn gnu_headers_and_record_padding_are_read() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB)]);
    let mut meta = Spec::file(".gkmetadata", json.len() as u64);
    meta.gnu = true;
    let mut lib = Spec::file("lib/a.so", LIB.len() as u64);
    lib.gnu = true;
    let mut bytes = Tar::new().member(&meta, &json).member(&lib, LIB).end();
    // Pad to a 10 KiB record, as GNU tar does.
    bytes.resize(bytes.len().div_ceil(10240) * 10240, 0);
    let archive = temp.path().join("gnu.gkernel");
    fs::write(&archive, bytes).unwrap();
    let out = extract(
        &archive,
        &json,
        &temp.path().join("x"),
        ExtractOptions::default(),
    );
    assert_eq!(fs::read(out.root.join("lib/a.so")).unwrap(), LIB);
}

#[test]
fn archives_from_the_tar_crate_builder_are_read() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB)]);
    let archive = temp.path().join("builder.gkernel");
    let mut builder = tar::Builder::new(fs::File::create(&archive).unwrap());
    for (name, data) in [(".gkmetadata", json.as_slice()), ("lib/a.so", LIB)] {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_mtime(1_700_000_000);
        builder.append_data(&mut h, name, data).unwrap();
    }
    builder.into_inner().unwrap();
    let out = extract(
        &archive,
        &json,
        &temp.path().join("x"),
        ExtractOptions::default(),
    );
    assert_eq!(out.files.len(), 1);
}

/// GNU tar writes the formats users will produce by hand; skipped (with a message) where the
/// `tar` command is missing.
#[test]
fn archives_from_gnu_tar_are_read() {
    if !Command::new("tar")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!("skipped: no `tar` command");
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let src = temp.path().join("src");
    fs::create_dir(&src).unwrap();
    sample_tree(&src);
    let artifacts = scan_artifacts(&src).unwrap();
    let json = json_for(&artifacts);
    fs::write(src.join(".gkmetadata"), &json).unwrap();
    for format in ["ustar", "gnu", "posix"] {
        let archive = temp.path().join(format!("{format}.gkernel"));
        let status = Command::new("tar")
            .arg(format!("--format={format}"))
            .arg("-C")
            .arg(&src)
            .arg("-cf")
            .arg(&archive)
            .args([".gkmetadata", "README.txt", "lib", "share"])
            .status()
            .unwrap();
        assert!(status.success());
        let staging = temp.path().join(format!("x-{format}"));
        let out = extract(&archive, &json, &staging, ExtractOptions::default());
        assert_eq!(out.files, artifacts, "{format}");
        assert_read_only(&snapshot(&staging));
    }
    // The tar command's own `./` prefixes are refused, not silently stripped: its first member
    // is `./`, not `.gkmetadata`.
    let archive = temp.path().join("dot.gkernel");
    let status = Command::new("tar")
        .arg("--format=ustar")
        .arg("-C")
        .arg(&src)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
    let err = GkpkSource::default().open(&archive).unwrap_err();
    assert_eq!(err.kind, SourceErrorKind::MetadataNotFirst);
    assert_eq!(err.member.as_deref(), Some("."));
}

#[test]
fn extraction_without_fsync_gives_the_same_tree() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB)]);
    let archive = temp.path().join("p.gkernel");
    fs::write(
        &archive,
        Tar::with_metadata(&json).file("lib/a.so", LIB).end(),
    )
    .unwrap();
    let fast = ExtractOptions {
        durability: Durability::NoFsync,
        ..ExtractOptions::default()
    };
    let a = extract(&archive, &json, &temp.path().join("a"), fast);
    let b = extract(
        &archive,
        &json,
        &temp.path().join("b"),
        ExtractOptions::default(),
    );
    assert_eq!(snapshot(&a.root), snapshot(&b.root));
}

#[test]
fn the_writer_refuses_what_extraction_would() {
    let temp = tempfile::tempdir().unwrap();
    let f = temp.path().join("f");
    fs::write(&f, LIB).unwrap();
    let out = temp.path().join("out.gkernel");
    let json = metadata_json(&[("a", LIB)]);
    let write = |files: &[(&str, &Path)]| {
        let files: Vec<_> = files
            .iter()
            .map(|(p, s)| (path(p), s.to_path_buf()))
            .collect();
        write_gkpk(&out, &json, &files).unwrap_err()
    };
    assert!(
        matches!(write(&[("a", &f), ("a", &f)]), PackError::DuplicatePath { path } if path.as_str() == "a")
    );
    assert!(matches!(
        write(&[("Lib.so", &f), ("lib.so", &f)]),
        PackError::CaseCollision { path, other } if path.as_str() == "lib.so" && other.as_str() == "Lib.so"
    ));
    assert!(matches!(
        write(&[("a", &f), ("a/b", &f)]),
        PackError::PathConflict { path, other } if path.as_str() == "a/b" && other.as_str() == "a"
    ));
    let link = temp.path().join("link");
    std::os::unix::fs::symlink(&f, &link).unwrap();
    assert!(matches!(
        write(&[("a", &link)]),
        PackError::NotARegularFile { .. }
    ));
    assert!(matches!(
        write(&[("a", temp.path())]),
        PackError::NotARegularFile { .. }
    ));
    let big = vec![b' '; guild_domain::manifest::MAX_METADATA_BYTES + 1];
    assert!(matches!(
        write_gkpk(&out, &big, &[]),
        Err(PackError::MetadataTooLarge { .. })
    ));
    assert!(!out.exists());
    let leftovers: Vec<_> = fs::read_dir(temp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 2, "{leftovers:?}");
}

#[test]
fn scanning_refuses_links_and_special_files() {
    let temp = tempfile::tempdir().unwrap();
    fs::write(temp.path().join("a.so"), LIB).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", temp.path().join("b.so")).unwrap();
    let err = scan_artifacts(temp.path()).unwrap_err();
    assert_eq!(err.kind, SourceErrorKind::Symlink);
    assert_eq!(err.member.as_deref(), Some("b.so"));
}

#[test]
fn installed_trees_and_archives_verify_in_place() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB), ("lib/b.so", b"second")]);
    let manifest = manifest(&json);
    let archive = temp.path().join("p.gkernel");
    let bytes = Tar::with_metadata(&json)
        .file("lib/a.so", LIB)
        .file("lib/b.so", b"second")
        .end();
    fs::write(&archive, bytes).unwrap();
    let source = GkpkSource::default();
    let in_archive = source
        .open(&archive)
        .and_then(|o| o.verify_in_place(&manifest))
        .unwrap();
    let out = extract(
        &archive,
        &json,
        &temp.path().join("x"),
        ExtractOptions::default(),
    );
    assert_eq!(in_archive, out.files);
    let before = snapshot(&out.root);
    let in_tree = source
        .open(&out.root)
        .and_then(|o| o.verify_in_place(&manifest))
        .unwrap();
    assert_eq!(in_tree, out.files);
    assert_eq!(snapshot(&out.root), before, "verification wrote something");

    // A byte changed in an installed file is found.
    let b = out.root.join("lib/b.so");
    fs::set_permissions(
        &b,
        <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o644),
    )
    .unwrap();
    fs::write(&b, b"SECOND").unwrap();
    let err = source
        .open(&out.root)
        .and_then(|o| o.verify_in_place(&manifest))
        .unwrap_err();
    assert_eq!(
        err.kind,
        SourceErrorKind::DigestMismatch {
            expected: Box::new(Sha256Digest::of(b"second")),
            actual: Box::new(Sha256Digest::of(b"SECOND")),
        }
    );
    assert_eq!(err.member.as_deref(), Some("lib/b.so"));
    // So is a removed one.
    fs::remove_file(&b).unwrap();
    let err = source
        .open(&out.root)
        .and_then(|o| o.verify_in_place(&manifest))
        .unwrap_err();
    assert_eq!(err.kind, SourceErrorKind::MissingArtifact);
}
