//! `guild check`, the publisher's conformance check, run as a publisher runs it: its table and
//! JSON report and exit codes, and a run of the check that a hostile build cannot stretch past its
//! limits (G27): the parent's memory, the processes the build starts, the files a killed check
//! leaves. What the check finds in each test plugin is guild-host's tests/it/conformance.rs.

use std::time::Duration;

use guild_test_support::guild::Run;
use guild_test_support::plugins::{faulty, plugin_library};
use guild_test_support::Workshop;

use crate::guild;

/// The command line: a directory of built files with its template, a table naming the
/// operation and check, the same in JSON, exit code 3, and no store created. (The build is
/// kept under the name libfaulty_rank_accept.so, which the check does not care about.)
#[test]
fn guild_check_reports_a_table_and_json_and_touches_no_store() {
    let shop = Workshop::new();
    let dir = shop.fresh("build");
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::write(
        dir.join("lib/libfaulty_rank_accept.so"),
        plugin_library("faulty_write_past"),
    )
    .unwrap();
    let template = dir.with_extension("json");
    let mut failing = faulty("write_past");
    failing.files[0].0 = "lib/libfaulty_rank_accept.so".into();
    std::fs::write(&template, failing.template().to_pretty_string()).unwrap();
    let store = shop.fresh("store");
    let (d, t, s) = (
        dir.to_str().unwrap(),
        template.to_str().unwrap(),
        store.to_str().unwrap(),
    );
    let run = guild().run(
        shop.path(),
        &["--store", s, "check", d, "--manifest", t, "--timeout", "2"],
    );
    assert_eq!(run.code, 3, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("runs its code unverified"),
        "{}",
        run.stdout
    );
    let line = run
        .stdout
        .lines()
        .find(|l| l.starts_with("execute.guard_back"))
        .unwrap_or_else(|| panic!("no row:\n{}", run.stdout));
    assert!(
        line.contains("example.faulty.write_past") && line.contains("failed"),
        "{line}"
    );
    assert!(!store.exists(), "guild check created a store");

    let run = guild().run(shop.path(), &["--json", "check", d, "--manifest", t]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    let doc = run.json();
    assert_eq!(doc["command"], "check");
    // Every execution writes past its output, so each execute check that runs one fails.
    assert!(doc["failed"].as_u64().unwrap() >= 1, "{doc}");
    let row = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "execute.guard_back")
        .unwrap();
    assert_eq!(row["result"], "failed");
    assert!(row["operation"]
        .as_str()
        .unwrap()
        .starts_with("example.faulty.write_past"));

    // An archive carries its own manifest: a template with it is a usage error, and without one
    // the archive is checked as it is.
    let archive = shop.build_with(&faulty("write_past"), None).archive;
    let a = archive.to_str().unwrap();
    let run = guild().run(shop.path(), &["check", a, "--manifest", t]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let run = guild().run(shop.path(), &["--json", "check", a, "--timeout", "2"]);
    assert_eq!(
        (run.code, run.json()["failed"].as_u64()),
        (3, doc["failed"].as_u64()),
        "{}",
        run.stderr
    );

    // The correct build passes with exit code 0.
    std::fs::write(
        dir.join("lib/libfaulty_rank_accept.so"),
        plugin_library("faulty_none"),
    )
    .unwrap();
    let mut spec = faulty("none");
    spec.files[0].0 = "lib/libfaulty_rank_accept.so".into();
    std::fs::write(&template, spec.template().to_pretty_string()).unwrap();
    let run = guild().run(shop.path(), &["check", d, "--manifest", t]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(" 0 failed"), "{}", run.stdout);

    // A validate that accepts a rank above its declared max_rank is written to module_abi.h's
    // rule (the host refuses that rank before it asks validate): it passes, and the check names
    // what it left to the host.
    let accepts = shop.build_with(&faulty("rank_accept"), None).archive;
    let run = guild().run(
        shop.path(),
        &[
            "--json",
            "check",
            accepts.to_str().unwrap(),
            "--timeout",
            "10",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let row = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "validate.outside_bounds")
        .unwrap();
    assert_eq!(row["result"], "passed");
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains("information") && reason.contains("rank 3 above max_rank 2"),
        "{reason}"
    );
}

/// The axpy of test-plugins/axpy_params (`example.vector.axpy`, y = a*x + y with `a` in its
/// parameter record `{u32 struct_size, f32 a}`), as the module `example.axpy`.
fn axpy() -> guild_test_support::Spec {
    guild_test_support::plugins::plugin_module(
        "example.axpy",
        "axpy_params",
        &["example.vector.axpy.cpu"],
    )
}

/// An operation that needs a parameter record: without --params every check after validate is
/// skipped and the check exits 9 (not 0: the build was never executed) unless --allow-skipped;
/// with its record every category runs and passes, the executions included.
#[test]
fn an_operation_with_a_parameter_record_is_checked_with_params() {
    let shop = Workshop::new();
    let archive = shop.build_with(&axpy(), None).archive;
    let a = archive.to_str().unwrap();

    let run = guild().run(shop.path(), &["check", a, "--timeout", "10"]);
    assert_eq!(run.code, 9, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("every validate, query_scratch and execute check was skipped")
            && run.stderr.contains("--params"),
        "{}",
        run.stderr
    );
    let validate = run
        .stdout
        .lines()
        .find(|l| l.starts_with("validate "))
        .unwrap_or_else(|| panic!("no validate row:\n{}", run.stdout));
    assert!(
        validate.contains("skipped") && validate.contains("parameter record"),
        "{validate}"
    );
    let run = guild().run(shop.path(), &["--json", "check", a, "--allow-skipped"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.json()["skipped_categories"],
        serde_json::json!(["validate", "query_scratch", "execute"])
    );

    for params in ["u32:8,f32:2.0", "u32:8,f32:-0.5"] {
        let run = guild().run(
            shop.path(),
            &["--json", "check", a, "--params", params, "--timeout", "10"],
        );
        assert_eq!(run.code, 0, "{params}: {}\n{}", run.stdout, run.stderr);
        let doc = run.json();
        assert_eq!(doc["failed"], 0, "{doc}");
        assert_eq!(doc["skipped_categories"], serde_json::json!([]), "{doc}");
        for name in [
            "validate",
            "validate.inside_bounds",
            "validate.outside_bounds",
            "query_scratch",
            "execute.guard_front",
            "execute.guard_back",
            "execute.deterministic",
            "execute.concurrent",
        ] {
            let row = doc["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["check"] == name)
                .unwrap_or_else(|| panic!("no {name} row: {doc}"));
            assert_eq!(row["result"], "passed", "{params}: {row}");
        }
    }

    // The record may come from a file, byte for byte; a short one is refused by validate, and
    // bad notation is a usage error.
    let file = shop.fresh("axpy.params");
    let mut bytes = 8u32.to_ne_bytes().to_vec();
    bytes.extend(3.0f32.to_ne_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let at = format!("@{}", file.display());
    let run = guild().run(shop.path(), &["check", a, "--params", &at]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let run = guild().run(shop.path(), &["check", a, "--params", "u32:4"]);
    assert_eq!(run.code, 9, "{}\n{}", run.stdout, run.stderr);
    let run = guild().run(shop.path(), &["check", a, "--params", "float:2"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// `--params OP=RECORD` gives one operation its record, ahead of a plain `--params` (the record
/// of every other operation); an operation the build does not register is a usage error naming
/// it, and so is a second record for the same operation.
#[test]
fn params_can_name_the_operation_they_are_for() {
    let shop = Workshop::new();
    let archive = shop.build_with(&axpy(), None).archive;
    let a = archive.to_str().unwrap();
    let check = |extra: &[&str]| {
        let mut args = vec!["--json", "check", a, "--timeout", "10"];
        args.extend(extra);
        guild().run(shop.path(), &args)
    };

    let run = check(&["--params", "example.vector.axpy=u32:8,f32:2.0"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["skipped_categories"], serde_json::json!([]));
    // The operation's own record wins over the short one given for every operation.
    let run = check(&[
        "--params",
        "u32:4",
        "--params",
        "example.vector.axpy=u32:8,f32:2.0",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let run = check(&["--params", "u32:4"]);
    assert_eq!(run.code, 9, "{}\n{}", run.stdout, run.stderr);

    let run = check(&["--params", "example.vector.nope=u32:8,f32:2.0"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("example.vector.nope") && run.stderr.contains("example.vector.axpy"),
        "names the operation and what the build provides: {}",
        run.stderr
    );
    for twice in [
        ["u32:8,f32:2.0", "u32:8,f32:1.0"],
        [
            "example.vector.axpy=u32:8,f32:2.0",
            "example.vector.axpy=u32:8,f32:1.0",
        ],
    ] {
        let run = check(&["--params", twice[0], "--params", twice[1]]);
        assert_eq!(run.code, 2, "{twice:?}: {}", run.stderr);
        assert!(run.stderr.contains("two records"), "{}", run.stderr);
    }
    let run = check(&["--params", "Not An Op=u32:8"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// A manifest's `check_params` is the record `guild check` uses when the command line gives the
/// operation none: the axpy passes with no flag, a `--params` still wins, and a record that is
/// not in the notation is refused when the manifest is read, naming the field.
#[test]
fn the_manifest_names_default_check_params() {
    let shop = Workshop::new();
    let built = shop.build_with(&axpy(), None);
    let src = built.src.to_str().unwrap().to_owned();
    let write_template = |name: &str, check_params: serde_json::Value| {
        let mut template: serde_json::Value =
            serde_json::from_str(&axpy().template().to_pretty_string()).unwrap();
        template["check_params"] = check_params;
        let path = shop.fresh(name);
        std::fs::write(&path, template.to_string()).unwrap();
        path
    };
    let template = write_template(
        "axpy.json",
        serde_json::json!({"example.vector.axpy": "u32:8, f32:2.0"}),
    );
    let t = template.to_str().unwrap();

    let run = guild().run(
        shop.path(),
        &["--json", "check", &src, "--manifest", t, "--timeout", "10"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    assert_eq!(doc["failed"], 0, "{doc}");
    assert_eq!(doc["skipped_categories"], serde_json::json!([]), "{doc}");

    // Packed, the record travels in the signed manifest.
    let packed = shop.fresh("axpy.gkmodule");
    let p = packed.to_str().unwrap();
    let run = guild().run(shop.path(), &["pack", &src, "--manifest", t, "--out", p]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = guild().run(shop.path(), &["check", p, "--timeout", "10"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let run = guild().run(shop.path(), &["inspect", p]);
    assert!(
        run.stdout
            .contains("check params  example.vector.axpy=u32:8, f32:2.0"),
        "{}",
        run.stdout
    );
    // The command line's record comes first, for every operation or for the one.
    let run = guild().run(shop.path(), &["check", p, "--params", "u32:4"]);
    assert_eq!(run.code, 9, "{}\n{}", run.stdout, run.stderr);
    let run = guild().run(
        shop.path(),
        &["check", p, "--params", "example.vector.axpy=u32:4"],
    );
    assert_eq!(run.code, 9, "{}\n{}", run.stdout, run.stderr);

    let bad = write_template(
        "bad.json",
        serde_json::json!({"example.vector.axpy": "float:2.0"}),
    );
    let out = shop.fresh("bad.gkmodule");
    let run = guild().run(
        shop.path(),
        &[
            "pack",
            &src,
            "--manifest",
            bad.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stderr.contains("check_params") && run.stderr.contains("not a field type"),
        "{}",
        run.stderr
    );
    assert!(!out.exists(), "nothing is written on refusal");
}

/// `guild resolve --params` passes the record to validate: the axpy resolves with it and is
/// refused without it, naming why.
#[test]
fn guild_resolve_passes_the_parameter_record() {
    let b = guild_test_support::guild::Bench::new(guild());
    b.trust();
    let (src, template) = b.source("example.axpy", "1.0.0", &plugin_library("axpy_params"), "");
    let json = std::fs::read_to_string(&template).unwrap().replace(
        r#""provided_ops": ["example.axpy.op.cpu"]"#,
        r#""provided_ops": ["example.vector.axpy.cpu"]"#,
    );
    std::fs::write(&template, json).unwrap();
    b.run(&[
        "pack",
        src.to_str().unwrap(),
        "--manifest",
        template.to_str().unwrap(),
        "--out",
        "axpy.gkmodule",
        "--key",
        "k.key",
    ])
    .expect(0);
    b.run(&["install", "axpy.gkmodule"]).expect(0);
    let op = "example.vector.axpy";
    let tensors = [
        "--input", "f32:16x2", "--input", "f32:16x2", "--output", "f32:16x2",
    ];
    let mut args = vec!["resolve", op];
    args.extend(tensors);
    let run = b.run(&args);
    assert_eq!(run.code, 6, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("parameter record"), "{}", run.stderr);
    args.extend(["--params", "u32:8,f32:2.0"]);
    let run = b.run(&args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.starts_with(&format!(
            "{op} -> example.vector.axpy.cpu from example.axpy 1.0.0"
        )),
        "{}",
        run.stdout
    );
}

/// `guild ARGS` in `cwd` with its address space limited to `kib` KiB (`ulimit -v`).
fn guild_limited(cwd: &std::path::Path, kib: u64, args: &[&str]) -> Run {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(guild().path())
        .args(args)
        .current_dir(cwd)
        .env_remove("GUILD_STORE")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    Run::from(out)
}

/// 768 MiB printed without a newline neither exhausts the check's memory (1 GiB of address space
/// here) nor fails a build that is otherwise correct.
#[test]
fn unbounded_output_is_read_in_bounded_memory() {
    let shop = Workshop::new();
    let archive = shop.build_with(&faulty("flood_stdout"), None).archive;
    let run = guild_limited(
        shop.path(),
        1 << 20,
        &["check", archive.to_str().unwrap(), "--timeout", "10"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
}

/// Processes a plugin starts do not outlive the check: one left in the child's process group, and
/// one double-forked into a session of its own.
#[test]
fn processes_the_build_starts_do_not_outlive_the_check() {
    let shop = Workshop::new();
    let archive = shop.build_with(&faulty("daemon"), None).archive;
    let pids = shop.fresh("daemon.pids");
    // A generous bound per call: on a loaded 2-core machine the child once took more than 5 s
    // to reach init, and the test then saw no sleeper at all. A passing run takes no longer.
    let out = guild()
        .command(
            shop.path(),
            &["check", archive.to_str().unwrap(), "--timeout", "30"],
        )
        .env("GUILD_TEST_DAEMON_PIDS", &pids)
        .output()
        .unwrap();
    let (listed, survivors) = guild_test_support::guild::survivors(&pids);
    assert_eq!(listed.len(), 2, "the build started its two sleepers");
    assert!(
        survivors.is_empty(),
        "{survivors:?} of {listed:?} outlived the check:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// A check killed while it runs leaves its staged copy behind, and the next check removes it.
#[test]
fn an_interrupted_check_leaves_no_temporary_files_behind() {
    let shop = Workshop::new();
    let tmp = shop.fresh("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let slow = shop.build_with(&faulty("chatty_execute"), None).archive;
    let mut running = guild()
        .command(
            shop.path(),
            &["check", slow.to_str().unwrap(), "--timeout", "30"],
        )
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the build is staged (its manifest extracted), while the check runs it.
    let staged = (0..3000).any(|_| {
        let found = files_under(&tmp).iter().any(|p| p.ends_with(".gkmetadata"));
        if !found {
            std::thread::sleep(Duration::from_millis(20));
        }
        found
    });
    running.kill().unwrap();
    running.wait().unwrap();
    assert!(staged, "the check never staged the build");
    assert!(!files_under(&tmp).is_empty(), "nothing was left to clean");

    let next = shop.build_with(&faulty("none"), None).archive;
    let out = guild()
        .command(
            shop.path(),
            &["check", next.to_str().unwrap(), "--timeout", "10"],
        )
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let left = files_under(&tmp);
    assert!(left.is_empty(), "left behind: {left:?}");
}
