//! What a hostile package can make `guild` do before and around authentication, tried with real
//! `guild` processes: the manifest must be the first member (nothing is scanned for it), a
//! malformed manifest's problems are reported in bounded form, only signed paths land in the
//! installed tree, the store's lock file is never opened through a link and its refusal says
//! who holds it, and `doctor` never creates the store it is asked about.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use guild_domain::canonical::canonicalize;
use guild_domain::ids::Sha256Digest;
use guild_domain::json;
use guild_test_support::adapters::crypto::files::read_private_key;
use guild_test_support::adapters::fs::store::FsStore;
use guild_test_support::guild::{library, template_json, Bench, Run};

use crate::guild;

/// A guard against a `guild` that hangs: far above what any of these commands needs (tens of
/// milliseconds), and far below what reading a declared 64 GiB would take.
const LIMIT: Duration = Duration::from_secs(10);

/// The documented exit codes these tests expect.
const REJECTED: i32 = 3;
const STORE: i32 = 5;

/// Runs `guild ARGS` in `cwd` with its output going to files (so that even a flood of output
/// cannot block it), killing it if it runs past [`LIMIT`]. Answers what it did and how long it
/// took.
fn timed(cwd: &Path, args: &[&str]) -> (Run, Duration) {
    let out_path = cwd.join(".timed-stdout");
    let err_path = cwd.join(".timed-stderr");
    let started = Instant::now();
    let mut child = guild()
        .command(cwd, args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("guild {args:?} was still running after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = started.elapsed();
    let read = |p: &Path| String::from_utf8_lossy(&fs::read(p).unwrap()).into_owned();
    let run = Run {
        code: status.code().unwrap_or(-1),
        stdout: read(&out_path),
        stderr: read(&err_path),
    };
    (run, took)
}

/// `guild --store STORE ARGS` in the bench, timed.
fn timed_in(bench: &Bench, args: &[&str]) -> (Run, Duration) {
    let store = bench.store();
    let mut all = vec!["--store", store.to_str().unwrap()];
    all.extend_from_slice(args);
    timed(bench.path(), &all)
}

#[track_caller]
fn expect(run: &Run, code: i32) {
    assert_eq!(
        run.code, code,
        "exit code\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
}

#[track_caller]
fn stderr_has(run: &Run, text: &str) {
    assert!(
        run.stderr.contains(text),
        "stderr lacks {text:?}:\n{}",
        run.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// Hand-made tar members, for shapes `guild pack` never writes.

const BLOCK: usize = 512;

/// A ustar header for `name` (a directory when it ends in `/`) declaring `size` bytes.
fn header(name: &str, size: u64) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let dir = name.ends_with('/');
    h[..name.len()].copy_from_slice(name.as_bytes());
    // Octal, NUL-terminated where the digits leave room (a size of 12 digits fills its field).
    let octal = |h: &mut [u8; BLOCK], at: usize, len: usize, v: u64| {
        let mut text = format!("{v:0w$o}", w = len - 1).into_bytes();
        if text.len() < len {
            text.push(0);
        }
        h[at..at + len].copy_from_slice(&text);
    };
    octal(&mut h, 100, 8, if dir { 0o755 } else { 0o644 });
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, size);
    octal(&mut h, 136, 12, 0);
    h[156] = if dir { b'5' } else { b'0' };
    h[257..265].copy_from_slice(b"ustar\x0000");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// A whole member: header, data, padding.
fn member(name: &str, data: &[u8]) -> Vec<u8> {
    let mut out = header(name, data.len() as u64).to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    out
}

/// The length of the first member (header, data and padding) of a `guild pack` archive.
fn first_member_len(archive: &[u8]) -> usize {
    let size_field = std::str::from_utf8(&archive[124..135]).unwrap();
    let size =
        usize::from_str_radix(size_field.trim_matches(|c| c == '\0' || c == ' '), 8).unwrap();
    BLOCK + size.div_ceil(BLOCK) * BLOCK
}

/// `archive` with `extra` members spliced in right after its `.gkmetadata`.
fn splice_after_metadata(archive: &[u8], extra: &[u8]) -> Vec<u8> {
    let at = first_member_len(archive);
    [&archive[..at], extra, &archive[at..]].concat()
}

/// A `.gkmetadata` document holding `payload` (JSON text), signed with the bench's `k.key`, as
/// `guild sign` would sign it but without reading the payload first.
fn signed_metadata(bench: &Bench, payload: &str) -> Vec<u8> {
    let key = read_private_key(&bench.path().join("k.key")).unwrap();
    let value = json::parse(payload.as_bytes()).unwrap();
    let signature = key.sign(&canonicalize(&value)).unwrap();
    let hex: String = signature.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        r#"{{"gkmetadata":1,"payload":{payload},"signatures":[{{"key_id":"{}","algorithm":"ecdsa-p256-sha256","signature":"{hex}"}}]}}"#,
        key.key_id()
    )
    .into_bytes()
}

/// Packs and signs a module whose library is `lib/libplugin.so`, so that its tree has a
/// directory; answers the archive's path.
fn package_with_a_directory(bench: &Bench) -> PathBuf {
    let src = bench.path().join("src").join("dirs");
    fs::create_dir_all(src.join("lib")).unwrap();
    fs::write(src.join("lib/libplugin.so"), library(b"dirs v1")).unwrap();
    let template = bench.path().join("dirs.json");
    let json = template_json("example.dirs", "1.0.0", "").replace(
        r#""entry": "libplugin.so""#,
        r#""entry": "lib/libplugin.so""#,
    );
    fs::write(&template, json).unwrap();
    let archive = bench.path().join("dirs.gkmodule");
    let run = bench.run(&[
        "pack",
        src.to_str().unwrap(),
        "--manifest",
        template.to_str().unwrap(),
        "--out",
        archive.to_str().unwrap(),
        "--key",
        "k.key",
    ]);
    expect(&run, 0);
    archive
}

// ---------------------------------------------------------------------------------------------
// Bounded before authentication.

#[test]
fn a_64_gib_member_before_the_manifest_is_refused_at_once() {
    let bench = Bench::new(guild());
    bench.trust();
    let good = bench.package("example.scan", "1.0.0", b"scan v1", "");
    let good = fs::read(bench.path().join(good)).unwrap();
    let metadata_len = first_member_len(&good);

    // A sparse file: a 64 GiB member first (one byte less: the most an octal size field can
    // declare), then the genuine signed `.gkmetadata` and the rest.
    let declared: u64 = (64 << 30) - 1;
    let path = bench.path().join("sparse.gkmodule");
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    file.write_all(&header("lib/huge.bin", declared)).unwrap();
    file.seek(SeekFrom::Start(BLOCK as u64 + (64 << 30)))
        .unwrap();
    file.write_all(&good[..metadata_len]).unwrap();
    file.write_all(&good[metadata_len..]).unwrap();
    drop(file);

    let (run, took) = timed_in(&bench, &["install", "sparse.gkmodule"]);
    println!("sparse 64 GiB member before .gkmetadata: guild install refused it in {took:?}");
    expect(&run, REJECTED);
    stderr_has(&run, "lib/huge.bin");
    stderr_has(&run, "first member");
    // The lock went with the process; the store holds nothing.
    let (list, _) = timed_in(&bench, &["list"]);
    expect(&list, 0);
    assert!(
        list.stdout.contains("no packages installed"),
        "{}",
        list.stdout
    );
}

/// An archive whose `.gkmetadata` is `metadata` followed by the library of a `guild pack`
/// archive (unsigned is enough: these refusals come before any signature is looked at).
fn with_metadata(bench: &Bench, name: &str, metadata: &[u8]) -> String {
    let good = bench.package("example.scan", "1.0.0", b"scan v1", "");
    let good = fs::read(bench.path().join(good)).unwrap();
    let rest = &good[first_member_len(&good)..];
    let bytes = [member(".gkmetadata", metadata).as_slice(), rest].concat();
    fs::write(bench.path().join(name), bytes).unwrap();
    name.to_owned()
}

#[test]
fn a_manifest_of_a_million_problems_prints_fifty_and_a_count() {
    let bench = Bench::new(guild());
    // About 1 MiB of empty objects: three missing fields each, about a million problems.
    let objects = ((1 << 20) - 200) / 3;
    let metadata = format!(
        r#"{{"gkmetadata":1,"signatures":[],"payload":{{"artifacts":[{}]}}}}"#,
        vec!["{}"; objects].join(",")
    );
    assert!(metadata.len() <= 1 << 20);
    let archive = with_metadata(&bench, "flood.gkmodule", metadata.as_bytes());

    for json in [false, true] {
        let args: &[&str] = if json {
            &["--json", "install", &archive]
        } else {
            &["install", &archive]
        };
        let (run, took) = timed_in(&bench, args);
        println!("1 MiB manifest of empty objects (json: {json}): refused in {took:?}, {} bytes of stderr", run.stderr.len());
        expect(&run, REJECTED);
        assert!(
            run.stderr.len() < 64 * 1024,
            "{} bytes of stderr (json: {json})",
            run.stderr.len()
        );
        stderr_has(&run, "more");
        let shown = run.stderr.matches("required field is missing").count();
        assert!(
            (1..=50).contains(&shown),
            "{shown} problems printed (json: {json})"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Only signed content lands.

#[test]
fn unlisted_directory_members_are_refused_and_never_disable_a_package_later() {
    let bench = Bench::new(guild());
    bench.trust();
    let archive = fs::read(package_with_a_directory(&bench)).unwrap();

    // Thousands of directory members no artifact implies: refused at the first, before
    // anything is written, and the store is as before.
    let mut flood = Vec::new();
    for i in 0..4094 {
        flood.extend_from_slice(&header(&format!("d{i:04}/"), 0));
    }
    fs::write(
        bench.path().join("flood.gkmodule"),
        splice_after_metadata(&archive, &flood),
    )
    .unwrap();
    let (run, took) = timed_in(&bench, &["install", "flood.gkmodule"]);
    println!("4094 unlisted directory members: guild install refused them in {took:?}");
    expect(&run, REJECTED);
    stderr_has(&run, "d0000");
    stderr_has(&run, "directory");
    let (list, _) = timed_in(&bench, &["list"]);
    expect(&list, 0);
    assert!(
        list.stdout.contains("no packages installed"),
        "{}",
        list.stdout
    );

    // A directory member that a listed artifact implies is fine, and only the signed paths
    // are in the installed tree.
    let named = splice_after_metadata(&archive, &header("lib/", 0));
    fs::write(bench.path().join("named.gkmodule"), named).unwrap();
    let (run, _) = timed_in(&bench, &["install", "named.gkmodule"]);
    expect(&run, 0);
    let tree = bench.store().join("packages/example.dirs/1.0.0");
    let mut found = Vec::new();
    for entry in walk(&tree) {
        found.push(entry.strip_prefix(&tree).unwrap().display().to_string());
    }
    found.sort();
    assert_eq!(found, [".gkmetadata", "lib", "lib/libplugin.so"]);

    // The next commands re-verify the tree and keep the package enabled.
    for args in [&["list"][..], &["status", "example.dirs"], &["doctor"]] {
        let (run, _) = timed_in(&bench, args);
        assert!(
            !run.stdout.contains("disabled") && !run.stderr.contains("disabled"),
            "{args:?}:\n{}\n{}",
            run.stdout,
            run.stderr
        );
    }
    let (list, _) = timed_in(&bench, &["--json", "list"]);
    expect(&list, 0);
    let list = list.json();
    assert_eq!(list["packages"][0]["enabled"], "1.0.0", "{list}");
    assert_eq!(
        list["packages"][0]["versions"][0]["state"], "enabled",
        "{list}"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn a_nested_gkmetadata_artifact_is_refused_in_any_case() {
    let bench = Bench::new(guild());
    bench.trust();
    // `guild pack` refuses to list it.
    let (src, template) = bench.source("example.nested", "1.0.0", b"nested v1", "");
    fs::create_dir_all(src.join("lib")).unwrap();
    fs::write(src.join("lib/.GKMetadata"), b"{}").unwrap();
    let (run, _) = timed_in(
        &bench,
        &[
            "pack",
            src.to_str().unwrap(),
            "--manifest",
            template.to_str().unwrap(),
            "--out",
            "nested.gkmodule",
            "--key",
            "k.key",
        ],
    );
    expect(&run, REJECTED);
    stderr_has(&run, "lib/.GKMetadata");
    stderr_has(&run, "reserved");

    // A signed manifest that lists one, by a trusted key, is refused by `install`.
    let lib = b"nested v1";
    let payload = format!(
        r#"{{"package_id":"example.nested","kind":"gkmodule","version":"1.0.0","publisher_id":"org.example","kernel_abi":{{"min":"1.0.0","max":"1.0.0"}},"module_abi":1,"os":"{os}","arch":"{arch}","backends":["cpu"],"entry":"libplugin.so","artifacts":[{{"path":"lib/.gkmetadata","size":2,"sha256":"{meta}"}},{{"path":"libplugin.so","size":{len},"sha256":"{lib}"}}],"provided_ops":["example.nested.op.cpu"]}}"#,
        os = std::env::consts::OS,
        arch = std::env::consts::ARCH,
        meta = Sha256Digest::of(b"{}"),
        len = lib.len(),
        lib = Sha256Digest::of(lib),
    );
    let metadata = signed_metadata(&bench, &payload);
    let bytes = [
        member(".gkmetadata", &metadata),
        member("lib/.gkmetadata", b"{}"),
        member("libplugin.so", lib),
        vec![0; 2 * BLOCK],
    ]
    .concat();
    fs::write(bench.path().join("nested.gkmodule"), bytes).unwrap();
    let (run, _) = timed_in(&bench, &["install", "nested.gkmodule"]);
    expect(&run, REJECTED);
    stderr_has(&run, "reserved");
    assert!(!bench.store().join("packages/example.nested").exists());
}

// ---------------------------------------------------------------------------------------------
// The store's lock.

#[test]
fn a_planted_lock_symlink_creates_nothing_outside_the_store() {
    let bench = Bench::new(guild());
    bench.trust();
    let lock = bench.store().join("lock");
    let victim = bench.path().join("victim");
    fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&victim, &lock).unwrap();
    let (run, _) = timed_in(&bench, &["list"]);
    expect(&run, STORE);
    stderr_has(&run, &lock.display().to_string());
    stderr_has(&run, "not a regular file");
    assert!(!victim.exists(), "guild created {}", victim.display());
}

#[test]
fn a_locked_store_says_which_process_holds_it() {
    let bench = Bench::new(guild());
    bench.trust();
    let (held, _) = FsStore::open(bench.store()).unwrap();
    // A writer waits for the lock (a reader such as `list` would not need it).
    let (run, _) = timed_in(&bench, &["recover"]);
    drop(held);
    expect(&run, STORE);
    assert!(!run.stderr.contains("another user"), "{}", run.stderr);
    stderr_has(&run, &format!("pid {}", std::process::id()));
}

// ---------------------------------------------------------------------------------------------
// doctor.

#[test]
fn doctor_on_a_mistyped_store_fails_and_creates_nothing() {
    let bench = Bench::new(guild());
    let typo = bench.path().join("stroe");
    let (run, _) = timed(bench.path(), &["--store", typo.to_str().unwrap(), "doctor"]);
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!typo.exists(), "doctor created {}", typo.display());
    let store_line = run
        .stdout
        .lines()
        .find(|l| l.contains(" store "))
        .unwrap_or_else(|| panic!("no store check:\n{}", run.stdout));
    assert!(store_line.starts_with("fail"), "{store_line}");
    assert!(store_line.contains("stroe"), "{store_line}");
    assert!(run.stdout.contains("hint:"), "{}", run.stdout);

    // An existing directory that is not a store is not made into one either.
    let empty = bench.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let (run, _) = timed(
        bench.path(),
        &["--json", "--store", empty.to_str().unwrap(), "doctor"],
    );
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        fs::read_dir(&empty).unwrap().count(),
        0,
        "doctor wrote into it"
    );
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let store = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "store")
        .unwrap();
    assert_eq!(store["verdict"], "fail", "{report}");
    assert!(store["hint"].is_string(), "{report}");
}
