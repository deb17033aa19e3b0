//! What is read before authentication, and what an archive may make land on disk: the first
//! member must be `.gkmetadata` (nothing is scanned for it), directory members are admitted only
//! where a listed artifact implies them, and the archive reader and the directory walk count the
//! entries of one tree alike, so that an accepted package always verifies again once installed.

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use guild_adapters_fs::archive::GkpkSource;
use guild_ports::source::{ExtractLimits, ExtractOptions, PackageSource, SourceErrorKind};

use super::craft::{header, manifest, metadata_json, snapshot, Node, Spec, Tar, BLOCK, LIB};

/// A generous guard for work that must not depend on declared sizes; the real figure is
/// milliseconds.
const QUICK: Duration = Duration::from_secs(10);

fn source(max_entries: u64) -> GkpkSource {
    GkpkSource::new(ExtractOptions {
        limits: ExtractLimits {
            max_entries,
            ..ExtractLimits::default()
        },
        ..ExtractOptions::default()
    })
}

#[test]
fn the_first_member_must_be_metadata_and_nothing_is_scanned_for_it() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB)]);
    // A 64 GiB member declared first (one byte less: twelve octal digits, the most a size
    // field holds), with a `.gkmetadata` after it, in a sparse file: a reader that looked for
    // the manifest would read 64 GiB of holes.
    let declared: u64 = (64 << 30) - 1;
    let mut big = Spec::file("lib/a.so", declared);
    big.raw_size = Some(*b"777777777777");
    let path = temp.path().join("sparse.gkernel");
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    file.write_all(&header(&big)).unwrap();
    file.seek(SeekFrom::Start(BLOCK as u64 + (64 << 30)))
        .unwrap();
    file.write_all(&Tar::with_metadata(&json).end()).unwrap();
    drop(file);

    let started = Instant::now();
    let err = GkpkSource::default().open(&path).unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind, SourceErrorKind::MetadataNotFirst, "{err}");
    assert_eq!(err.member.as_deref(), Some("lib/a.so"), "{err}");
    assert!(
        err.to_string().contains("first member"),
        "the message says what is wrong: {err}"
    );
    assert!(took < QUICK, "refusing took {took:?}");

    // The same refusal for a small archive, whatever follows.
    for bytes in [
        Tar::new().file("lib/a.so", LIB).end(),
        Tar::new()
            .file("lib/a.so", LIB)
            .file(".gkmetadata", &json)
            .end(),
        Tar::new().dir("lib/").file(".gkmetadata", &json).end(),
    ] {
        let small = temp.path().join("small.gkernel");
        fs::write(&small, bytes).unwrap();
        let err = GkpkSource::default().open(&small).unwrap_err();
        assert_eq!(err.kind, SourceErrorKind::MetadataNotFirst, "{err}");
    }
}

/// Writes `bytes` as an archive and extracts it against `json` into `out`.
fn extract(
    dir: &Path,
    bytes: Vec<u8>,
    json: &[u8],
    out: &Path,
) -> Result<Vec<String>, guild_ports::source::SourceError> {
    let archive = dir.join("p.gkernel");
    fs::write(&archive, bytes).unwrap();
    let extracted = GkpkSource::default()
        .open(&archive)?
        .extract_to(&manifest(json), out)?;
    Ok(snapshot(&extracted.root)
        .keys()
        .map(|p| p.display().to_string())
        .collect())
}

#[test]
fn directory_members_land_only_where_a_listed_artifact_implies_them() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/x/a.so", LIB)]);
    let start = || Tar::with_metadata(&json);

    // Implied directories, named or not, are the only ones created.
    for bytes in [
        start().file("lib/x/a.so", LIB).end(),
        start()
            .dir("lib/")
            .dir("lib/x/")
            .file("lib/x/a.so", LIB)
            .end(),
        start().file("lib/x/a.so", LIB).dir("lib/x/").end(),
    ] {
        let out = temp.path().join("ok");
        let tree = extract(temp.path(), bytes, &json, &out).unwrap();
        assert_eq!(tree, [".gkmetadata", "lib", "lib/x", "lib/x/a.so"]);
        fs::remove_dir_all(&out).unwrap();
    }

    // Any other directory member is refused before anything is created for it.
    for (bytes, unlisted) in [
        (start().dir("extra/").file("lib/x/a.so", LIB).end(), "extra"),
        (start().file("lib/x/a.so", LIB).dir("lib/y/").end(), "lib/y"),
        (start().dir("lib/").dir("lib/x/a.so/").end(), "lib/x/a.so"),
        (start().dir("Lib/").file("lib/x/a.so", LIB).end(), "Lib"),
    ] {
        let out = temp.path().join("refused");
        let err = extract(temp.path(), bytes, &json, &out).unwrap_err();
        assert_eq!(err.kind, SourceErrorKind::UnlistedDirectory, "{err}");
        assert_eq!(err.member.as_deref(), Some(unlisted), "{err}");
        assert!(!out.exists(), "staging left behind for {unlisted}");
    }
}

#[test]
fn thousands_of_unlisted_directory_members_are_refused_at_the_first() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB)]);
    let mut tar = Tar::with_metadata(&json);
    for i in 0..4094 {
        tar = tar.dir(&format!("d{i:04}/"));
    }
    let bytes = tar.file("lib/a.so", LIB).end();
    let out = temp.path().join("out");
    let started = Instant::now();
    let err = extract(temp.path(), bytes, &json, &out).unwrap_err();
    assert!(started.elapsed() < QUICK);
    assert_eq!(err.kind, SourceErrorKind::UnlistedDirectory, "{err}");
    assert_eq!(err.member.as_deref(), Some("d0000"));
    assert!(!out.exists());
}

#[test]
fn a_directory_package_with_an_unlisted_directory_does_not_verify() {
    let temp = tempfile::tempdir().unwrap();
    let json = metadata_json(&[("lib/a.so", LIB)]);
    let dir = temp.path().join("pkg");
    fs::create_dir_all(dir.join("lib/empty")).unwrap();
    fs::write(dir.join(".gkmetadata"), &json).unwrap();
    fs::write(dir.join("lib/a.so"), LIB).unwrap();
    let err = GkpkSource::default()
        .open(&dir)
        .and_then(|o| o.verify_in_place(&manifest(&json)))
        .unwrap_err();
    assert_eq!(err.kind, SourceErrorKind::UnlistedDirectory, "{err}");
    assert_eq!(err.member.as_deref(), Some("lib/empty"));
}

/// The entries of the tree holding `files`, as both sources must count them: `.gkmetadata`,
/// every file and every directory on the way to one.
fn expected_entries(files: &[&str]) -> u64 {
    let mut paths = std::collections::BTreeSet::new();
    for f in files {
        let mut prefix = String::new();
        for c in f.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(c);
            paths.insert(prefix.clone());
        }
    }
    paths.len() as u64 + 1
}

#[test]
fn the_archive_reader_and_the_directory_walk_count_entries_alike() {
    let trees: &[&[&str]] = &[
        &["a.so"],
        &["lib/a.so"],
        &["lib/a.so", "lib/b.so", "share/doc/readme"],
        &["a/b/c/d/e.so", "a/b/x.so", "z.so"],
    ];
    let temp = tempfile::tempdir().unwrap();
    for (t, files) in trees.iter().enumerate() {
        let artifacts: Vec<(&str, &[u8])> = files.iter().map(|f| (*f, LIB)).collect();
        let json = metadata_json(&artifacts);
        let manifest = manifest(&json);
        let entries = expected_entries(files);
        // Without directory members, and with every implied one named before its files.
        let mut bare = Tar::with_metadata(&json);
        let mut named = Tar::with_metadata(&json);
        let mut dirs_named = std::collections::BTreeSet::new();
        for f in *files {
            let mut prefix = String::new();
            let parts: Vec<&str> = f.split('/').collect();
            for c in &parts[..parts.len() - 1] {
                prefix.push_str(c);
                prefix.push('/');
                if dirs_named.insert(prefix.clone()) {
                    named = named.dir(&prefix);
                }
            }
            bare = bare.file(f, LIB);
            named = named.file(f, LIB);
        }
        for (form, bytes) in [("bare", bare.end()), ("named", named.end())] {
            let label = format!("tree {t} ({form}, {entries} entries)");
            let archive = temp.path().join(format!("t{t}-{form}.gkernel"));
            fs::write(&archive, bytes).unwrap();
            let tree = temp.path().join(format!("t{t}-{form}"));
            GkpkSource::default()
                .open(&archive)
                .unwrap()
                .extract_to(&manifest, &tree)
                .unwrap();
            let disk = snapshot(&tree);
            assert_eq!(disk.len() as u64, entries, "{label}: {disk:?}");
            assert!(disk
                .values()
                .all(|n| matches!(n, Node::File { .. } | Node::Dir { .. })));
            for location in [&archive, &tree] {
                let at_limit = source(entries)
                    .open(location)
                    .and_then(|o| o.verify_in_place(&manifest));
                assert!(
                    at_limit.is_ok(),
                    "{label}, {}: {at_limit:?}",
                    location.display()
                );
                let below = source(entries - 1)
                    .open(location)
                    .and_then(|o| o.verify_in_place(&manifest))
                    .map(|_| ())
                    .unwrap_err();
                assert_eq!(
                    below.kind,
                    SourceErrorKind::TooManyEntries { limit: entries - 1 },
                    "{label}, {}: {below}",
                    location.display()
                );
            }
        }
    }
}
