//! Generated packages: mutated valid archives and archives assembled from hostile name pieces.
//! Whatever happens, nothing outside the staging directory changes, a failure leaves no staging
//! directory, and a success holds exactly the manifest's artifacts.

use std::fs;
use std::path::Path;

use guild_adapters_fs::archive::GkpkSource;
use guild_domain::manifest::Manifest;
use guild_ports::source::{Durability, ExtractOptions, PackageSource};
use proptest::prelude::*;

use super::craft::{manifest, metadata_json, snapshot, Node, Spec, Tar, LIB};

/// Extracts `bytes` as an archive and checks the invariants that hold whatever the input.
fn check(bytes: &[u8], json: &[u8]) {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path();
    let archive = root.join("p.gkernel");
    fs::write(&archive, bytes).unwrap();
    fs::create_dir(root.join("parent")).unwrap();
    let staging = root.join("parent/staging");
    let before = snapshot(root);
    let source = GkpkSource::new(ExtractOptions {
        durability: Durability::NoFsync,
        ..ExtractOptions::default()
    });
    let manifest = manifest(json);
    let result = source
        .open(&archive)
        .and_then(|opened| opened.extract_to(&manifest, &staging));
    match result {
        Err(_) => {
            assert!(!staging.exists(), "staging left behind");
            assert_eq!(snapshot(root), before, "tree changed");
        }
        Ok(out) => {
            let mut after = snapshot(root);
            after.retain(|p, _| !p.starts_with("parent/staging"));
            assert_eq!(after, before, "tree changed outside staging");
            assert_extracted(&out.root, &manifest);
        }
    }
}

/// A successful extraction holds `.gkmetadata`, the manifest's artifacts with their digests,
/// and directories; all read-only.
fn assert_extracted(root: &Path, manifest: &Manifest) {
    let mut artifacts = 0;
    for (rel, node) in snapshot(root) {
        let rel = rel.to_str().unwrap().to_owned();
        match node {
            Node::Dir { mode } => assert_eq!(mode, 0o755),
            Node::File { mode, sha256 } => {
                assert_eq!(mode, 0o444);
                if rel != ".gkmetadata" {
                    let listed = manifest.artifacts.iter().find(|a| a.path.as_str() == rel);
                    assert_eq!(listed.map(|a| a.sha256), Some(sha256), "{rel}");
                    artifacts += 1;
                }
            }
            other => panic!("{rel} is {other:?}"),
        }
    }
    assert_eq!(artifacts, manifest.artifacts.len());
}

fn valid_archive(json: &[u8]) -> Vec<u8> {
    Tar::with_metadata(json)
        .dir("lib/")
        .file("lib/a.so", LIB)
        .file("lib/b.so", b"second")
        .end()
}

/// Pieces that hostile names are made of.
const PIECES: &[&str] = &[
    "..",
    ".",
    "",
    "a",
    "A",
    "b",
    "lib",
    "LIB",
    ".gkmetadata",
    "/",
    "\\",
    "\0",
    "guild-escape",
];

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(PIECES), 1..5)
        .prop_map(|pieces| pieces.join("/").into_bytes())
}

fn member() -> impl Strategy<Value = (Vec<u8>, u8, bool)> {
    (
        name(),
        prop::sample::select(&[b'0', b'5', b'2', b'1', b'x'][..]),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn mutated_archives_never_escape(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let json = metadata_json(&[("lib/a.so", LIB), ("lib/b.so", b"second")]);
        let mut bytes = valid_archive(&json);
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        check(&bytes, &json);
    }

    #[test]
    fn archives_of_hostile_names_never_escape(members in prop::collection::vec(member(), 1..6)) {
        let json = metadata_json(&[("a", LIB), ("lib/b", LIB), ("A/a", LIB)]);
        let mut tar = Tar::with_metadata(&json);
        for (name, type_flag, with_data) in members {
            let data: &[u8] = if with_data && type_flag == b'0' { LIB } else { b"" };
            tar = match type_flag {
                b'x' => tar.pax(b'x', &[("path", &name)]),
                b'2' | b'1' => tar.member(&Spec::link(&name, type_flag, "../../guild-escape"), b""),
                _ => tar.member(&Spec::new(&name, type_flag, data.len() as u64), data),
            };
        }
        check(&tar.end(), &json);
    }
}

#[test]
fn the_valid_archive_used_for_mutation_extracts() {
    let json = metadata_json(&[("lib/a.so", LIB), ("lib/b.so", b"second")]);
    check(&valid_archive(&json), &json);
}
