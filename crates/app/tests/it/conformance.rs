//! The conformance check (`guild check`, `guild_conformance`) held against the project's
//! own test plugins: every plugin meant to be correct passes, and each faulty build in
//! test-plugins/faulty_scan fails the check its fault breaks, naming the operation.

use std::time::Duration;

use guild_conformance::{self as conformance, Options, Report, Verdict};

use crate::cli::{guild, guild_binary};
use crate::operations::{alt_spec, plugin_library, scan_spec};
use crate::support::{Spec, Workshop};

/// The time limit of one call in these tests: short, so the hang costs little.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

fn options() -> Options {
    let mut o = Options::new(guild_binary().to_path_buf());
    o.call_timeout = CALL_TIMEOUT;
    o
}

/// Checks `spec`, packed unsigned into an archive.
fn check(shop: &Workshop, spec: &Spec) -> Report {
    let built = shop.build_with(spec, None);
    conformance::check(&built.archive, None, &options())
        .unwrap_or_else(|e| panic!("{}: cannot check: {e}", spec.id))
}

fn failures(report: &Report) -> String {
    report
        .findings
        .iter()
        .filter(|f| f.verdict == Verdict::Failed)
        .map(|f| format!("{} {:?}: {}", f.check, f.operation, f.reason))
        .collect::<Vec<_>>()
        .join("\n")
}

fn module(id: &str, library: &str, ops: &[&str]) -> Spec {
    let mut spec = Spec::module(id, "1.0.0").library(&plugin_library(library));
    spec.files[0].0 = format!("lib/lib{library}.so");
    spec.provided_ops = ops.iter().map(|s| s.to_string()).collect();
    spec
}

fn kernel(mut spec: Spec) -> Spec {
    spec.kind = guild_domain::ids::PackageKind::Kernel;
    spec
}

fn faulty(kind: &str) -> Spec {
    module(
        &format!("example.faulty-{}", kind.replace('_', "-")),
        &format!("faulty_{kind}"),
        &[&format!("example.faulty.{kind}")],
    )
}

/// The test plugins that are meant to be correct, with the manifests their tests use. Left out:
/// the loader outcomes that fail on purpose (init_fails, wrong_abi, ...), op_probe and ext_probe
/// (one deliberately odd candidate or table per rejection case the host must report), the
/// broken runners, and the faulty scans but the correct one.
fn correct_plugins() -> Vec<Spec> {
    let runner =
        |id: &str, library: &str, runner: &str| kernel(module(id, library, &[]).runner(runner));
    let mut cuda = module(
        "example.cuda_scan",
        "cuda_scan",
        &[
            "example.cuda_scan.inclusive.cuda",
            "example.cuda_scan.exclusive.cuda",
        ],
    );
    cuda.backends = vec!["cuda".into()];
    let mut service = module(
        "example.service_probe",
        "service_probe",
        &[
            "example.service_probe.reenter.cpu",
            "example.service_probe.stream_copy.cuda",
            "example.service_probe.cross.cpu",
            "example.service_probe.device_copy.cuda",
        ],
    );
    service.backends.push("cuda".into());
    let mut dependent = module(
        "example.dependent",
        "scan_dependent",
        &["example.dependent.total.cpu"],
    );
    dependent = dependent.module_dep(crate::support::ModDep::on("example.scan", "1.0.0"));
    vec![
        scan_spec("1.0.0"),
        alt_spec("1.0.0"),
        module(
            "example.early_scan",
            "scan_module_tie",
            &[
                "example.early_scan.inclusive.cpu",
                "example.early_scan.exclusive.cpu",
            ],
        ),
        dependent,
        service,
        cuda,
        module(
            "test.good",
            "good_kernel",
            &[
                "test.good_kernel.rms_norm_f32",
                "test.good_kernel.prefix_sum_f32",
            ],
        )
        .runner("test.good_kernel.runner"),
        module("test.expert_ref", "expert_ref", &["test.expert_ref.cpu"]),
        runner("test.runners.llama", "runner_llama", "test.runner.llama"),
        runner("test.runners.hybrid", "runner_hybrid", "test.runner.hybrid"),
        module(
            "example.c_runner",
            "example_c_runner",
            &["example.c_runner.pipeline.cpu"],
        )
        .module_dep(crate::support::ModDep::on("example.scan", "1.0.0")),
        faulty("none"),
        kernel(module("test.minimal", "minimal_kernel", &[])),
        kernel(module(
            "test.legacy",
            "legacy_provenance",
            &["test.legacy_provenance.matvec_q4_0"],
        )),
        module(
            "test.echo",
            "manifest_echo",
            &["test.echo.one.cpu", "test.echo.two.cpu"],
        ),
        {
            let mut many = module("example.many", "op_many", &[]);
            many.provided_ops = (0..64)
                .map(|n| format!("example.many.c{n:02}.cpu"))
                .collect();
            many
        },
    ]
}

#[test]
fn every_correct_test_plugin_passes() {
    let shop = Workshop::new();
    let mut executed = 0;
    for spec in correct_plugins() {
        let report = check(&shop, &spec);
        assert!(
            report.passed(),
            "{} fails the conformance check:\n{}",
            spec.id,
            failures(&report)
        );
        assert_eq!(report.processes, 1, "{}: nothing crashed or hung", spec.id);
        assert_eq!(
            report.find("shutdown", None).map(|f| f.verdict),
            Some(Verdict::Passed),
            "{}",
            spec.id
        );
        executed += report
            .findings
            .iter()
            .filter(|f| f.check.starts_with("execute.") && f.verdict == Verdict::Passed)
            .count();
    }
    // The scans, the dependents' executions aside, really ran under the guards.
    assert!(executed >= 20, "only {executed} execute checks passed");
}

#[test]
fn the_scan_module_is_held_to_every_operation_check() {
    let shop = Workshop::new();
    let report = check(&shop, &scan_spec("1.0.0"));
    for op in ["example.scan.inclusive.cpu", "example.scan.exclusive.cpu"] {
        for name in [
            "validate",
            "validate.inside_bounds",
            "query_scratch",
            "execute.guard_front",
            "execute.guard_back",
            "execute.strides",
            "execute.deterministic",
            "execute.concurrent",
        ] {
            let f = report
                .find(name, Some(op))
                .unwrap_or_else(|| panic!("no {name} finding for {op}"));
            assert_eq!(f.verdict, Verdict::Passed, "{name} {op}: {}", f.reason);
        }
    }
}

/// Each faulty build fails the check its fault breaks, naming the operation.
#[test]
fn each_faulty_plugin_fails_the_check_it_breaks() {
    let shop = Workshop::new();
    for (kind, check_name, says) in [
        ("write_past", "execute.guard_back", "wrote outside output 0"),
        ("read_before", "execute.guard_front", "SIGSEGV"),
        ("ignores_strides", "execute.strides", "outer-strided output"),
        (
            "rank_accept",
            "validate.outside_bounds",
            "rank 3 above max_rank 2",
        ),
        (
            "nondeterministic",
            "execute.deterministic",
            "declares deterministic numerics",
        ),
        (
            "hang_execute",
            "execute.guard_front",
            "did not return within 2 s",
        ),
    ] {
        let report = check(&shop, &faulty(kind));
        let op = format!("example.faulty.{kind}");
        let f = report
            .find(check_name, Some(&op))
            .unwrap_or_else(|| panic!("{kind}: no {check_name} finding:\n{report:#?}"));
        assert_eq!(
            f.verdict,
            Verdict::Failed,
            "{kind}: {check_name}: {}",
            f.reason
        );
        assert!(
            f.reason.contains(says),
            "{kind}: {check_name}: {}",
            f.reason
        );
        assert!(
            f.operation.as_deref().unwrap().contains(&op),
            "{kind}: the finding names the operation"
        );
        // The load checks and shutdown passed: the report went on past the fault.
        assert_eq!(
            report.find("init", None).map(|f| f.verdict),
            Some(Verdict::Passed),
            "{kind}"
        );
        assert_eq!(
            report.find("shutdown", None).map(|f| f.verdict),
            Some(Verdict::Passed),
            "{kind}: a later child finished the report:\n{}",
            failures(&report)
        );
    }
}

#[test]
fn a_crash_in_init_is_a_failed_init_and_ends_the_report() {
    let shop = Workshop::new();
    let report = check(&shop, &faulty("crash_init"));
    let init = report.find("init", None).expect("an init finding");
    assert_eq!(init.verdict, Verdict::Failed);
    assert!(init.reason.contains("SIGSEGV"), "{}", init.reason);
    assert!(report.find("validate", Some("example.faulty")).is_none());
    assert_eq!(report.count(Verdict::Failed), 1, "{report:#?}");
}

#[test]
fn a_failed_init_is_shut_down_and_reported() {
    let shop = Workshop::new();
    let report = check(&shop, &module("test.init_fails", "init_fails", &[]));
    let init = report.find("init", None).unwrap();
    assert_eq!(init.verdict, Verdict::Failed, "{}", init.reason);
    assert!(init.reason.contains("init failed"), "{}", init.reason);
    assert_eq!(
        report
            .find("shutdown after failed init", None)
            .map(|f| f.verdict),
        Some(Verdict::Passed)
    );
}

/// Each broken loader outcome fails the package-wide check it breaks, and the later ones are
/// skipped with the reason.
#[test]
fn the_package_wide_checks_name_what_failed() {
    let shop = Workshop::new();
    for (library, ops, failed, says) in [
        ("no_entry", &[][..], "entry point", "guild_plugin_entry_v1"),
        ("bad_descriptor", &[][..], "descriptor", "init is NULL"),
        ("wrong_abi", &[][..], "abi range", "Kernel ABI 2.0.0"),
        (
            "duplicate_impl",
            &["test.duplicate_impl.add"][..],
            "duplicate ids",
            "registered twice",
        ),
    ] {
        let spec = kernel(module(
            &format!("test.{}", library.replace('_', "-")),
            library,
            ops,
        ));
        let report = check(&shop, &spec);
        let f = report.find(failed, None).unwrap();
        assert_eq!(f.verdict, Verdict::Failed, "{library}: {}", f.reason);
        assert!(f.reason.contains(says), "{library}: {}", f.reason);
        assert_eq!(report.count(Verdict::Failed), 1, "{library}: {report:#?}");
        if failed != "duplicate ids" {
            let init = report.find("init", None).unwrap();
            assert_eq!(init.verdict, Verdict::Skipped, "{library}");
            let after = report.find("shutdown after failed init", None).unwrap();
            assert!(
                after.reason.contains("init never ran"),
                "{library}: {}",
                after.reason
            );
        }
    }
}

#[test]
fn registration_is_held_to_the_manifest() {
    let shop = Workshop::new();
    let mut spec = scan_spec("1.0.0");
    spec.provided_ops.pop();
    let report = check(&shop, &spec);
    let f = report.find("registration", None).unwrap();
    assert_eq!(f.verdict, Verdict::Failed, "{}", f.reason);
    assert!(
        f.reason.contains("example.scan.exclusive.cpu"),
        "{}",
        f.reason
    );
}

/// The command line: a directory of built files with its template, a table naming the
/// operation and check, the same in JSON, exit code 3, and no store created.
#[test]
fn guild_check_reports_a_table_and_json_and_touches_no_store() {
    let shop = Workshop::new();
    let dir = shop.fresh("build");
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::write(
        dir.join("lib/libfaulty_rank_accept.so"),
        plugin_library("faulty_rank_accept"),
    )
    .unwrap();
    let template = dir.with_extension("json");
    std::fs::write(
        &template,
        faulty("rank_accept").template().to_pretty_string(),
    )
    .unwrap();
    let store = shop.fresh("store");
    let (d, t, s) = (
        dir.to_str().unwrap(),
        template.to_str().unwrap(),
        store.to_str().unwrap(),
    );
    let run = guild(
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
        .find(|l| l.starts_with("validate.outside_bounds"))
        .unwrap_or_else(|| panic!("no row:\n{}", run.stdout));
    assert!(
        line.contains("example.faulty.rank_accept") && line.contains("failed"),
        "{line}"
    );
    assert!(!store.exists(), "guild check created a store");

    let run = guild(shop.path(), &["--json", "check", d, "--manifest", t]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    let doc = run.json();
    assert_eq!(doc["command"], "check");
    assert_eq!(doc["failed"], 1);
    let row = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "validate.outside_bounds")
        .unwrap();
    assert_eq!(row["result"], "failed");
    assert!(row["operation"]
        .as_str()
        .unwrap()
        .starts_with("example.faulty.rank_accept"));

    // An archive carries its own manifest: a template with it is a usage error, and without one
    // the archive is checked as it is.
    let archive = shop.build_with(&faulty("rank_accept"), None).archive;
    let a = archive.to_str().unwrap();
    let run = guild(shop.path(), &["check", a, "--manifest", t]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let run = guild(shop.path(), &["--json", "check", a, "--timeout", "2"]);
    assert_eq!(
        (run.code, run.json()["failed"].as_u64()),
        (3, Some(1)),
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
    let run = guild(shop.path(), &["check", d, "--manifest", t]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(" 0 failed"), "{}", run.stdout);
}

// ---------------------------------------------------------------------------------------------
// Builds hostile to the check itself (G27): the verdict, the time limit, the parent's memory and
// the processes the check leaves must not be the build's to decide.
// ---------------------------------------------------------------------------------------------

/// A build that prints "passed" results in the check's own line format and exits 0 fails: the
/// verdict comes from the check's private channel, and a stray line there is a failure.
#[test]
fn forged_results_do_not_pass_a_build() {
    let shop = Workshop::new();
    let report = check(&shop, &faulty("forge"));
    assert!(!report.passed(), "a forged report passed:\n{report:#?}");
    assert!(
        report.findings.iter().all(|f| f.reason != "forged"),
        "a forged finding was taken: {report:#?}"
    );
    let init = report.find("init", None).expect("an init finding");
    assert_eq!(init.verdict, Verdict::Failed, "{}", init.reason);
    assert!(init.reason.contains("result channel"), "{}", init.reason);

    // The command line says so with its exit code.
    let archive = shop.build_with(&faulty("forge"), None).archive;
    let run = guild(
        shop.path(),
        &["check", archive.to_str().unwrap(), "--timeout", "2"],
    );
    assert_eq!(run.code, 3, "{}\n{}", run.stdout, run.stderr);
}

/// A hung execute that keeps printing progress lines is killed at the time limit all the same.
#[test]
fn printed_progress_does_not_extend_the_time_limit() {
    let shop = Workshop::new();
    let report = check(&shop, &faulty("chatty_execute"));
    let f = report
        .find("execute.guard_front", Some("example.faulty.chatty_execute"))
        .unwrap_or_else(|| panic!("no execute finding:\n{report:#?}"));
    assert_eq!(f.verdict, Verdict::Failed, "{}", f.reason);
    assert!(
        f.reason.contains("did not return within 2 s"),
        "{}",
        f.reason
    );
}

/// `guild ARGS` in `cwd` with its address space limited to `kib` KiB (`ulimit -v`).
fn guild_limited(cwd: &std::path::Path, kib: u64, args: &[&str]) -> crate::cli::Run {
    let program = crate::cli::guild_command(cwd, args)
        .get_program()
        .to_owned();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(program)
        .args(args)
        .current_dir(cwd)
        .env_remove("GUILD_STORE")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    crate::cli::Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
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

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

/// Processes a plugin starts do not outlive the check: one left in the child's process group, and
/// one double-forked into a session of its own.
#[test]
fn processes_the_build_starts_do_not_outlive_the_check() {
    let shop = Workshop::new();
    let archive = shop.build_with(&faulty("daemon"), None).archive;
    let pids = shop.fresh("daemon.pids");
    let out = crate::cli::guild_command(
        shop.path(),
        &["check", archive.to_str().unwrap(), "--timeout", "5"],
    )
    .env("GUILD_TEST_DAEMON_PIDS", &pids)
    .output()
    .unwrap();
    let listed: Vec<u32> = std::fs::read_to_string(&pids)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let survivors: Vec<u32> = listed.iter().copied().filter(|p| alive(*p)).collect();
    for pid in &survivors {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
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
    let mut running = crate::cli::guild_command(
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
    let out = crate::cli::guild_command(
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
