//! The conformance check (`guild_conformance`) held against the project's own test plugins:
//! every plugin meant to be correct passes, and each faulty build in test-plugins/faulty_scan
//! fails the check its fault breaks, naming the operation. The check runs each build in a child
//! (`guild __conformance`), so these tests build the `guild` binary; the `guild check` command
//! itself is tested with guild-cli (crates/cli/tests/it/check.rs).

use std::time::Duration;

use guild_conformance::{self as conformance, Options, Report, Verdict};
use guild_test_support::plugins::{alt_spec, faulty, plugin_module, scan_spec};
use guild_test_support::{Spec, Workshop};

use crate::guild;

/// The time limit of one call in these tests: short, so the hang costs little.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

fn options() -> Options {
    let mut o = Options::new(guild().path().to_path_buf());
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

fn kernel(mut spec: Spec) -> Spec {
    spec.kind = guild_domain::ids::PackageKind::Kernel;
    spec
}

/// The test plugins that are meant to be correct, with the manifests their tests use. Left out:
/// the loader outcomes that fail on purpose (init_fails, wrong_abi, ...), op_probe and ext_probe
/// (one deliberately odd candidate or table per rejection case the host must report), the
/// broken runners, and the faulty scans but the correct one.
fn correct_plugins() -> Vec<Spec> {
    let runner = |id: &str, library: &str, runner: &str| {
        kernel(plugin_module(id, library, &[]).runner(runner))
    };
    let mut cuda = plugin_module(
        "example.cuda_scan",
        "cuda_scan",
        &[
            "example.cuda_scan.inclusive.cuda",
            "example.cuda_scan.exclusive.cuda",
        ],
    );
    cuda.backends = vec!["cuda".into()];
    let mut service = plugin_module(
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
    let mut dependent = plugin_module(
        "example.dependent",
        "scan_dependent",
        &["example.dependent.total.cpu"],
    );
    dependent = dependent.module_dep(guild_test_support::ModDep::on("example.scan", "1.0.0"));
    vec![
        scan_spec("1.0.0"),
        alt_spec("1.0.0"),
        plugin_module(
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
        plugin_module(
            "test.good",
            "good_kernel",
            &[
                "test.good_kernel.rms_norm_f32",
                "test.good_kernel.prefix_sum_f32",
            ],
        )
        .runner("test.good_kernel.runner"),
        plugin_module("test.expert_ref", "expert_ref", &["test.expert_ref.cpu"]),
        runner("test.runners.llama", "runner_llama", "test.runner.llama"),
        runner("test.runners.hybrid", "runner_hybrid", "test.runner.hybrid"),
        plugin_module(
            "example.c_runner",
            "example_c_runner",
            &["example.c_runner.pipeline.cpu"],
        )
        .module_dep(guild_test_support::ModDep::on("example.scan", "1.0.0")),
        faulty("none"),
        kernel(plugin_module("test.minimal", "minimal_kernel", &[])),
        kernel(plugin_module(
            "test.legacy",
            "legacy_provenance",
            &["test.legacy_provenance.matvec_q4_0"],
        )),
        plugin_module(
            "test.echo",
            "manifest_echo",
            &["test.echo.one.cpu", "test.echo.two.cpu"],
        ),
        {
            let mut many = plugin_module("example.many", "op_many", &[]);
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

/// module_abi.h's rule: the host refuses every query outside the GOP1 declaration before it
/// calls validate, so a validate that accepts a rank above max_rank (faulty_rank_accept) is
/// never asked about one. The check does not ask it either: it passes, naming the variants it
/// left to the host as information.
#[test]
fn a_validate_that_leaves_the_declared_bounds_to_the_host_passes() {
    let shop = Workshop::new();
    let report = check(&shop, &faulty("rank_accept"));
    assert!(report.passed(), "{}", failures(&report));
    let f = report
        .find(
            "validate.outside_bounds",
            Some("example.faulty.rank_accept"),
        )
        .expect("an outside_bounds finding");
    assert_eq!(f.verdict, Verdict::Passed, "{}", f.reason);
    assert!(
        f.reason.contains("information") && f.reason.contains("rank 3 above max_rank 2"),
        "{}",
        f.reason
    );
}

/// An operation that takes a parameter record (test-plugins/axpy_params) is checked in full when
/// the check is given the record: every query and execution carries it, 8-byte aligned (the
/// plugin refuses one that is not), and every category passes; without it, validate refuses
/// every generated query and the rest is skipped with a reason that says so.
#[test]
fn an_operation_with_a_parameter_record_is_checked_with_the_record() {
    let shop = Workshop::new();
    let spec = plugin_module("example.axpy", "axpy_params", &["example.vector.axpy.cpu"]);
    let report = check(&shop, &spec);
    let f = report
        .find("validate", Some("example.vector.axpy"))
        .unwrap();
    assert_eq!(f.verdict, Verdict::Skipped, "{}", f.reason);
    assert!(
        f.reason.contains("parameter record") && f.reason.contains("--params"),
        "{}",
        f.reason
    );
    assert_eq!(
        report
            .find("execute.guard_back", Some("example.vector.axpy"))
            .map(|f| f.verdict),
        Some(Verdict::Skipped)
    );

    let built = shop.build_with(&spec, None);
    let mut o = options();
    o.params = 8u32.to_ne_bytes().to_vec();
    o.params.extend(2.0f32.to_ne_bytes());
    let report = conformance::check(&built.archive, None, &o).unwrap();
    assert!(report.passed(), "{}", failures(&report));
    for name in [
        "validate",
        "validate.inside_bounds",
        "query_scratch",
        "execute.guard_front",
        "execute.guard_back",
        "execute.deterministic",
        "execute.concurrent",
    ] {
        let f = report
            .find(name, Some("example.vector.axpy"))
            .unwrap_or_else(|| panic!("no {name} finding"));
        assert_eq!(f.verdict, Verdict::Passed, "{name}: {}", f.reason);
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
    let report = check(&shop, &plugin_module("test.init_fails", "init_fails", &[]));
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
        let spec = kernel(plugin_module(
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
    let run = guild().run(
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

/// A kernel whose descriptor requires instruction sets this CPU lacks is negotiated with but not
/// executed: running it could stop the check with an illegal instruction, which would read as
/// the publisher's crash. The execution checks are skipped with a reason naming the bits.
#[test]
fn a_kernel_needing_instructions_this_cpu_lacks_is_checked_but_not_executed() {
    let shop = Workshop::new();
    let mut spec = kernel(
        Spec::kernel("test.ext_probe_gop1", "1.0.0")
            .library(&guild_test_support::plugins::plugin_library("ext_probe")),
    );
    spec.files[0].0 = "lib/libext_probe__gop1__other_isa.so".into();
    spec.provided_ops = vec!["test.ext_probe.gop1".into()];
    let report = check(&shop, &spec);
    let op = Some("test.ext_probe.gop1");
    assert_eq!(
        report.find("validate", op).map(|f| f.verdict),
        Some(Verdict::Passed),
        "{report:?}"
    );
    for name in [
        "execute.guard_front",
        "execute.guard_back",
        "execute.concurrent",
    ] {
        let f = report
            .find(name, op)
            .unwrap_or_else(|| panic!("no {name} finding"));
        assert_eq!(f.verdict, Verdict::Skipped, "{name}: {}", f.reason);
        assert!(
            f.reason.contains("this CPU lacks") && f.reason.contains("required_cpu_isa"),
            "{name}: {}",
            f.reason
        );
    }
}
