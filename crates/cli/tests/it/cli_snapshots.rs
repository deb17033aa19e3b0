//! Snapshot tests of what people read from `guild`: the top-level help, one subcommand's help,
//! `guild --json list`, and one error message; plus the newer commands (`doctor`, `resolve`,
//! `completions`).
//!
//! A snapshot lives in `tests/it/snapshots/NAME.txt`. Paths and hex digests that differ per run
//! are replaced with placeholders first. To accept a deliberate change, run the tests with
//! `GUILD_UPDATE_SNAPSHOTS=1` and review the diff of the snapshot files like any other change.

use std::fs;
use std::path::{Path, PathBuf};

use guild_test_support::guild::{tamper, template_json, Bench};
use guild_test_support::plugins::plugin_library;

use crate::guild;

fn snapshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/snapshots")
}

/// Replaces what changes from run to run: the bench directory and 64-digit hex strings.
fn normalize(text: &str, bench: Option<&Path>) -> String {
    let mut out = match bench {
        Some(dir) => text.replace(dir.to_str().unwrap(), "<BENCH>"),
        None => text.to_owned(),
    };
    let bytes: Vec<char> = out.chars().collect();
    let mut result = String::with_capacity(out.len());
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..]
            .iter()
            .take_while(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            .count();
        if run == 64 {
            result.push_str("<SHA256>");
            i += run;
        } else if run > 0 {
            result.extend(&bytes[i..i + run]);
            i += run;
        } else {
            result.push(bytes[i]);
            i += 1;
        }
    }
    out = result;
    out
}

#[track_caller]
fn assert_snapshot(name: &str, actual: &str) {
    let path = snapshot_dir().join(format!("{name}.txt"));
    if std::env::var_os("GUILD_UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        fs::create_dir_all(snapshot_dir()).unwrap();
        fs::write(&path, actual).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with GUILD_UPDATE_SNAPSHOTS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "snapshot {name} differs from {} at line {}:\n--- expected\n{}\n--- actual\n{}\n\
             (GUILD_UPDATE_SNAPSHOTS=1 accepts the new output)",
            path.display(),
            first + 1,
            expected.lines().nth(first).unwrap_or("<end>"),
            actual.lines().nth(first).unwrap_or("<end>"),
        );
    }
}

#[test]
fn snapshot_top_level_help() {
    let dir = tempfile::tempdir().unwrap();
    let run = guild().run(dir.path(), &["--help"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_snapshot("help", &run.stdout);
}

#[test]
fn snapshot_install_help() {
    let dir = tempfile::tempdir().unwrap();
    let run = guild().run(dir.path(), &["install", "--help"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_snapshot("install-help", &run.stdout);
}

#[test]
fn snapshot_list_json_and_an_untrusted_install() {
    let b = Bench::new(guild());
    let archive = b.package("example.snap", "1.0.0", b"snapshot library\n", "");
    let refused = b.run(&["install", &archive]);
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert_snapshot(
        "error-untrusted",
        &normalize(&refused.stderr, Some(b.path())),
    );

    b.trust();
    assert_eq!(b.run(&["install", "--disabled", &archive]).code, 0);
    let listed = b.run(&["--json", "list"]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert_snapshot("list-json", &normalize(&listed.stdout, Some(b.path())));
}

/// The purge of removed versions as an operator reads it: refused for an installed version,
/// then a package whose every version was removed, in `list` and `status` before the purge and
/// gone after it, and the JSON error once nothing is left to purge.
#[test]
fn snapshot_purge_of_removed_versions() {
    let b = Bench::new(guild());
    b.trust();
    for (version, body) in [("1.0.0", &b"purge v1\n"[..]), ("1.1.0", b"purge v2\n")] {
        let archive = b.package("example.purge", version, body, "");
        assert_eq!(b.run(&["install", &archive]).code, 0);
    }
    let mut transcript = String::new();
    let mut step = |args: &[&str]| {
        let run = b.run(args);
        transcript.push_str(&format!(
            "$ guild {}\nexit {}\n{}{}\n",
            args.join(" "),
            run.code,
            run.stdout,
            run.stderr
        ));
        run.code
    };
    assert_eq!(step(&["purge", "example.purge", "--version", "1.0.0"]), 4);
    assert_eq!(step(&["remove", "example.purge", "--version", "1.0.0"]), 0);
    assert_eq!(step(&["remove", "example.purge"]), 0);
    assert_eq!(step(&["list"]), 0);
    assert_eq!(step(&["status", "example.purge"]), 0);
    assert_eq!(step(&["purge", "example.purge"]), 0);
    assert_eq!(step(&["list"]), 0);
    assert_eq!(step(&["--json", "purge", "example.purge"]), 6);
    assert_snapshot("purge", &normalize(&transcript, Some(b.path())));
}

#[test]
fn completions_are_generated_for_each_shell() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, marker) in [
        ("bash", "_guild()"),
        ("zsh", "#compdef guild"),
        ("fish", "complete -c guild"),
    ] {
        let run = guild().run(dir.path(), &["completions", shell]);
        assert_eq!(run.code, 0, "{shell}: {}", run.stderr);
        assert!(run.stdout.contains(marker), "{shell}: {}", run.stdout);
        for sub in ["install", "rollback", "doctor", "resolve"] {
            assert!(run.stdout.contains(sub), "{shell} lacks {sub}");
        }
    }
    let bad = guild().run(dir.path(), &["completions", "cmd.exe"]);
    assert_eq!(bad.code, 2);
}

#[test]
fn doctor_reports_each_check_and_fails_on_an_unusable_store() {
    let b = Bench::new(guild());
    // doctor creates no store (publication_bounds tests that); any other command does.
    assert_eq!(b.run(&["list"]).code, 0);
    let run = b.run(&["--json", "doctor"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    let checks = doc["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["platform", "store", "trust", "quarantine", "cuda", "sdk"]
    );
    let trust = &checks[2];
    assert_eq!(trust["verdict"], "warn", "no key is trusted yet");
    assert!(trust["hint"].as_str().unwrap().contains("guild trust add"));
    assert_eq!(doc["failed"], serde_json::json!([]));

    b.trust();
    let run = b.run(&["doctor"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("ok    trust     1 publisher(s), 1 key(s)"),
        "{}",
        run.stdout
    );

    // A store whose registry is garbage cannot be opened: the check fails, exit 5.
    let run = b.run(&["trust", "list"]);
    assert_eq!(run.code, 0);
    let registry = b.store().join("registry.json");
    assert!(
        registry.exists(),
        "the store keeps its registry in registry.json"
    );
    fs::write(&registry, b"{ not json").unwrap();
    let run = b.run(&["doctor"]);
    assert_eq!(run.code, 5, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("fail  store"), "{}", run.stdout);
    assert!(
        run.stderr.contains("failed checks: store"),
        "{}",
        run.stderr
    );
}

#[test]
fn resolve_explains_the_choice_and_the_refusals() {
    let b = Bench::new(guild());
    b.trust();
    let library = plugin_library("scan_module");
    let (src, _) = b.source("example.scan", "1.0.0", &library, "");
    let template = b.path().join("scan.json");
    let json = template_json("example.scan", "1.0.0", "").replacen(
        r#""provided_ops": ["example.scan.op.cpu"]"#,
        r#""provided_ops": ["example.scan.inclusive.cpu", "example.scan.exclusive.cpu"]"#,
        1,
    );
    assert!(json.contains("example.scan.exclusive.cpu"), "{json}");
    fs::write(&template, json).unwrap();
    let pack = b.run(&[
        "pack",
        src.to_str().unwrap(),
        "--manifest",
        template.to_str().unwrap(),
        "--out",
        "scan.gkmodule",
        "--key",
        "k.key",
    ]);
    assert_eq!(pack.code, 0, "{}", pack.stderr);
    assert_eq!(b.run(&["install", "scan.gkmodule"]).code, 0);

    let op = "example.sequence.inclusive_scan";
    let run = b.run(&[
        "resolve",
        op,
        "--input",
        "f32:8x2",
        "--output",
        "f32:8x2@0,10",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.starts_with(&format!(
            "{op} -> example.scan.inclusive.cpu from example.scan 1.0.0 (op version 1.0.0, cpu, \
             priority 10; scratch: 0 host bytes)"
        )),
        "{}",
        run.stdout
    );
    let doc = b
        .run(&[
            "--json", "resolve", op, "--input", "i64:4", "--output", "i64:4",
        ])
        .json();
    assert_eq!(doc["impl_id"], "example.scan.inclusive.cpu");
    assert_eq!(doc["package_version"], "1.0.0");

    // Refusals name every candidate and why; the exit code says nothing was found.
    let run = b.run(&["resolve", op, "--input", "f32:8", "--output", "f32:4"]);
    assert_eq!(run.code, 6, "{}", run.stdout);
    assert!(
        run.stderr
            .contains("example.scan.inclusive.cpu: validate refused"),
        "{}",
        run.stderr
    );
    // In JSON, each candidate comes as an item of its own, and the message is one line.
    let refused = b.run(&[
        "--json", "resolve", op, "--input", "f32:8", "--output", "f32:4",
    ]);
    assert_eq!(refused.code, 6, "{}", refused.stderr);
    let e = refused.error_json();
    assert!(!e["message"].as_str().unwrap().contains('\n'), "{e}");
    let candidates = e["candidates"].as_array().expect("candidates");
    assert!(
        candidates
            .iter()
            .any(|c| c["impl_id"] == "example.scan.inclusive.cpu"
                && c["reason"]
                    .as_str()
                    .unwrap()
                    .starts_with("validate refused")),
        "{e}"
    );
    assert_snapshot("resolve-refused-json", &refused.stderr);
    let run = b.run(&["resolve", "example.nothing.here", "--input", "f32:8"]);
    assert_eq!(run.code, 6);
    assert!(
        run.stderr.contains("no enabled package provides it"),
        "{}",
        run.stderr
    );
    let run = b.run(&["resolve", op, "--input", "f33:8"]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("not a dtype this host knows"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_tampered_copy_of_an_installed_version_is_still_refused() {
    let b = Bench::new(guild());
    b.trust();
    let archive = b.package("example.same", "1.0.0", b"the real library\n", "");
    assert_eq!(b.run(&["install", &archive]).code, 0);
    // Reinstalling the very same file is a no-op that says so.
    let again = b.run(&["install", &archive]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(again.stdout.contains("nothing changed"), "{}", again.stdout);
    // A copy whose library differs (its metadata, and so its payload, is the same) is an error,
    // although nothing would be written either way.
    let tampered = tamper(&b, &archive, b"the real library", b"the fake library");
    let run = b.run(&["install", &tampered]);
    assert_eq!(run.code, 3, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("libplugin.so"), "{}", run.stderr);
}

#[test]
fn keygen_makes_a_private_key_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run = guild().run(dir.path(), &["keygen", "--out", "keys/deep/org.example"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let keys = dir.path().join("keys/deep");
    assert!(keys.join("org.example.key").is_file() && keys.join("org.example.pub").is_file());
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(&keys).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn a_store_with_a_missing_package_tree_still_opens_and_can_be_repaired() {
    let b = Bench::new(guild());
    b.trust();
    let base = b.package("example.base", "1.0.0", b"base library\n", "");
    let dep = b.package(
        "example.user",
        "1.0.0",
        b"user library\n",
        r#", "dependencies": [{"package_id": "example.base", "min_version": "1.0.0"}]"#,
    );
    assert_eq!(b.run(&["install", &base]).code, 0);
    assert_eq!(b.run(&["install", &dep]).code, 0);
    let status = b.run(&["--json", "status", "example.base"]).json();
    let tree = b
        .path()
        .join(status["package"]["versions"][0]["path"].as_str().unwrap());
    assert!(tree.is_dir(), "{status}");
    guild_test_support::make_writable(&tree);
    fs::remove_dir_all(&tree).unwrap();

    // Every command still works. `list` reads the registry only and does not look at the trees;
    // a reader that does (`doctor`) leaves both out and records nothing...
    let run = b.run(&["list"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = b.run(&["doctor"]);
    let warnings = run.stdout.clone();
    assert!(
        warnings.contains("example.base@1.0.0 is not usable: its installed tree is damaged"),
        "{warnings}"
    );
    assert!(
        warnings.contains("example.user@1.0.0 is not usable"),
        "{warnings}"
    );
    // ...and the next writer marks the version removed and disables its dependent.
    let run = b.run(&["recover"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let warnings = run.stdout.clone();
    let run = b.run(&["--json", "list"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    assert!(
        warnings.contains("example.base@1.0.0: its installed tree is damaged"),
        "{warnings}"
    );
    assert!(
        warnings.contains("disabled example.user@1.0.0"),
        "{warnings}"
    );
    let packages = doc["packages"].as_array().unwrap();
    let state =
        |id: &str| packages.iter().find(|p| p["id"] == id).unwrap()["versions"][0]["state"].clone();
    assert_eq!(state("example.base"), "removed");
    assert_eq!(state("example.user"), "disabled");

    // Installing the same package again restores it; the dependent can be enabled again.
    let run = b.run(&["install", &base]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = b.run(&["enable", "example.user"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn installing_a_version_again_after_a_rollback_makes_it_current() {
    let b = Bench::new(guild());
    b.trust();
    let v1 = b.package("example.fwd", "1.0.0", b"one\n", "");
    let v2 = b.package("example.fwd", "2.0.0", b"two\n", "");
    assert_eq!(b.run(&["install", &v1]).code, 0);
    assert_eq!(b.run(&["install", &v2]).code, 0);
    assert_eq!(b.run(&["rollback", "example.fwd"]).code, 0);

    let run = b.run(&["install", &v2]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.starts_with(
            "example.fwd 2.0.0 was already installed (its files are checked): it is current and \
             enabled again\nsuperseded example.fwd 1.0.0; `guild rollback example.fwd` returns to it"
        ),
        "{}",
        run.stdout
    );
    let status = b.run(&["--json", "status", "example.fwd"]).json();
    assert_eq!(status["package"]["enabled"], "2.0.0");
    assert_eq!(status["package"]["previous"], "1.0.0");
    // And back again, as after any installation.
    assert_eq!(b.run(&["rollback", "example.fwd"]).code, 0);
    // Offering the older, superseded version again without --allow-downgrade changes nothing.
    let again = b.run(&["--json", "install", &v2]).json();
    assert_eq!(again["reactivated"], true);
    let old = b.run(&["--json", "install", &v1]).json();
    assert_eq!(
        (old["changed"].clone(), old["reactivated"].clone()),
        (false.into(), false.into())
    );
}

#[test]
fn signing_leaves_no_scratch_behind_when_it_is_refused() {
    let b = Bench::new(guild());
    let archive = b.package("example.signed", "1.0.0", b"signed library\n", "");
    let scratch_dirs = || {
        fs::read_dir(b.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".guild-sign-"))
            .count()
    };
    // Already signed by this key (pack signed it).
    let run = b.run(&["sign", &archive, "--key", "k.key"]);
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(run.stderr.contains("already"), "{}", run.stderr);
    assert_eq!(scratch_dirs(), 0);
    // A damaged archive fails extraction.
    let damaged = tamper(&b, &archive, b"signed library", b"signed librarz");
    guild().run(b.path(), &["keygen", "--out", "other"]);
    let run = b.run(&["sign", &damaged, "--key", "other.key"]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(scratch_dirs(), 0);
}
