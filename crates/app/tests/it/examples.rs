//! The examples under `examples/` build and run: the modules are packed from the manifest
//! templates in examples/ (so a template that no longer matches its library fails here), the C
//! runner module is loaded and executed through the service, and the Rust runner binary is
//! built and run against a store prepared the way an operator prepares one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use guild_abi::GUILD_STATUS_ERR_UNSUPPORTED;
use guild_adapters_crypto::SigningKey;
use guild_adapters_posix::DlopenLoader;
use guild_domain::json::{self, Value};
use guild_domain::operation::{DType, ProviderRefusal, Rejection};
use guild_host::operations::{TensorArg, TensorArgMut};
use guild_host::packaging::pack;
use guild_host::{Host, InstallOptions, OperationRequest, OperationService};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{id, key, open_dir, platform, trust, Workshop, PUBLISHER};

use crate::operations::{desc, op, reference, EXCLUSIVE_OP, INCLUSIVE_OP};

const PIPELINE_OP: &str = "example.runner.demo_pipeline";
const PIPELINE: &str = "example.c_runner.pipeline.cpu";
use guild_test_support::plugins::TOTAL_OP;

/// One example package: its manifest template in examples/ and the library it packs.
pub(crate) struct Example {
    template: &'static str,
    library: &'static str,
}

pub(crate) const SCAN: Example = Example {
    template: "examples/modules/scan/manifest.json",
    library: "scan_module",
};
pub(crate) const DEPENDENT: Example = Example {
    template: "examples/modules/scan_dependent/manifest.json",
    library: "scan_dependent",
};
const C_RUNNER: Example = Example {
    template: "examples/c-runner/manifest.json",
    library: "example_c_runner",
};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Packs `example` as `guild pack` does: its library under lib/ and its template from
/// examples/, with only the OS and architecture set to this machine's.
fn pack_example(shop: &Workshop, key: &SigningKey, example: &Example) -> PathBuf {
    pack_example_at(shop, key, example, None)
}

/// [`pack_example`] with the template's version replaced by `version`, when given.
pub(crate) fn pack_example_at(
    shop: &Workshop,
    key: &SigningKey,
    example: &Example,
    version: Option<&str>,
) -> PathBuf {
    let base = shop.fresh(example.library);
    let lib = base.join("src/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        lib.join(format!("lib{}.so", example.library)),
        plugin_library(example.library),
    )
    .unwrap();
    let path = workspace().join(example.template);
    let text = std::fs::read(&path).unwrap();
    let Value::Object(mut members) = json::parse(&text).unwrap() else {
        panic!("{} is not a JSON object", path.display());
    };
    let here = platform();
    for (name, value) in &mut members {
        match name.as_str() {
            "os" => *value = here.os.as_str().into(),
            "arch" => *value = here.arch.as_str().into(),
            "version" => {
                if let Some(version) = version {
                    *value = version.into();
                }
            }
            _ => {}
        }
    }
    let template = base.join("manifest.json");
    std::fs::write(&template, Value::Object(members).to_pretty_string()).unwrap();
    let archive = base.join("package.gkmodule");
    pack(&base.join("src"), &template, &archive, Some(key))
        .unwrap_or_else(|e| panic!("packing {}: {e}", example.template));
    archive
}

/// A host over a fresh store with the publisher trusted and `examples` installed (and loaded).
fn host_with(shop: &Workshop, examples: &[&Example]) -> Host {
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).unwrap();
    trust(&pm, PUBLISHER, &k);
    let host = Host::new(pm, Box::new(DlopenLoader::new()));
    for example in examples {
        let archive = pack_example(shop, &k, example);
        host.install(&archive, InstallOptions::default())
            .unwrap_or_else(|e| panic!("installing {}: {e}", example.template));
    }
    host
}

// ---------------------------------------------------------------------------------------------
// The C runner (a module that drives the scans through the C service)
// ---------------------------------------------------------------------------------------------

#[test]
fn c_runner_runs_both_scans_through_the_service_and_keeps_no_handle() {
    let shop = Workshop::new();
    let host = host_with(&shop, &[&SCAN, &C_RUNNER]);
    let service = OperationService::new(host.kernels());
    for dims in [vec![7u64], vec![5, 3], vec![2, 3, 4]] {
        let d = desc(DType::I64, &dims, &[]);
        let handle = service
            .resolve(&OperationRequest::cpu(op(PIPELINE_OP), vec![d], vec![d, d]))
            .unwrap();
        let chosen = handle.describe();
        assert_eq!(chosen.impl_id.as_str(), PIPELINE);
        assert_eq!(chosen.package.as_str(), "example.c_runner");
        assert_eq!(handle.scratch().host_bytes, 0);

        let n = dims.iter().product::<u64>() as usize;
        let input: Vec<i64> = (0..n as i64).map(|i| i * i - 5 * i + 3).collect();
        let (mut inclusive, mut exclusive) = (vec![-1i64; n], vec![-1i64; n]);
        handle
            .execute(
                &[TensorArg::new(&d, &input)],
                &mut [
                    TensorArgMut::new(&d, &mut inclusive),
                    TensorArgMut::new(&d, &mut exclusive),
                ],
                None,
            )
            .unwrap();
        let (mut want_inclusive, mut want_exclusive) = (vec![0i64; n], vec![0i64; n]);
        reference(&input, &mut want_inclusive, &dims, &[], &[], false);
        reference(&input, &mut want_exclusive, &dims, &[], &[], true);
        assert_eq!(inclusive, want_inclusive, "{INCLUSIVE_OP} over {dims:?}");
        assert_eq!(exclusive, want_exclusive, "{EXCLUSIVE_OP} over {dims:?}");

        // The runner released the scans' handles before returning: only the pipeline's own
        // handle holds anything, and it holds the runner, not the scans.
        assert_eq!(host.active_package_leases(&id("example.scan")), 0);
        assert_eq!(host.active_package_leases(&id("example.c_runner")), 1);
    }
}

#[test]
fn c_runner_contract_admits_i64_only_and_outputs_of_the_input_shape() {
    let shop = Workshop::new();
    let host = host_with(&shop, &[&SCAN, &C_RUNNER]);
    let service = OperationService::new(host.kernels());

    // The element type is declared in the GOP1 contract, so the host refuses f32 itself.
    let f = desc(DType::F32, &[4], &[]);
    let err = service
        .resolve(&OperationRequest::cpu(op(PIPELINE_OP), vec![f], vec![f, f]))
        .unwrap_err();
    let rejection = &err.failure().expect("a resolution report").rejections;
    assert_eq!(rejection.len(), 1, "{err}");
    assert_eq!(rejection[0].impl_id.as_str(), PIPELINE);
    assert!(
        matches!(rejection[0].reason, Rejection::DtypeMismatch { .. }),
        "{err}"
    );

    // The shapes are the runner's own validate callback's to check.
    let (d, other) = (desc(DType::I64, &[4], &[]), desc(DType::I64, &[3], &[]));
    let err = service
        .resolve(&OperationRequest::cpu(
            op(PIPELINE_OP),
            vec![d],
            vec![d, other],
        ))
        .unwrap_err();
    let rejection = &err.failure().expect("a resolution report").rejections;
    assert_eq!(
        rejection[0].reason,
        Rejection::ValidateRefused(ProviderRefusal::new(
            GUILD_STATUS_ERR_UNSUPPORTED,
            "both outputs must have the input's shape"
        )),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// The Rust runner (a binary that embeds the host)
// ---------------------------------------------------------------------------------------------

/// Builds the example runner with cargo (once per test run) and returns its executable.
pub(crate) fn runner_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        guild_test_support::cargo_binary("guild-example-runner", "guild-example-runner")
    })
}

/// A store with the publisher trusted and `examples` installed through the package manager
/// alone (as `guild install` does), closed again so that the runner can open it.
fn prepared_store(shop: &Workshop, examples: &[&Example]) -> PathBuf {
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    for example in examples {
        pm.install(&pack_example(shop, &k, example), InstallOptions::default())
            .unwrap_or_else(|e| panic!("installing {}: {e}", example.template));
    }
    store
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run_runner(store: &Path, ops: &[&str]) -> Ran {
    let out = Command::new(runner_binary())
        .arg(store)
        .args(ops)
        .output()
        .expect("the runner starts");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn rust_runner_resolves_and_executes_every_example_operation() {
    let shop = Workshop::new();
    let store = prepared_store(&shop, &[&SCAN, &DEPENDENT, &C_RUNNER]);
    let ran = run_runner(&store, &[INCLUSIVE_OP, TOTAL_OP, PIPELINE_OP]);
    assert_eq!(ran.code, Some(0), "{}{}", ran.stdout, ran.stderr);
    assert_eq!(ran.stderr, "");

    let (head, body) = ran
        .stdout
        .split_once("\n\n")
        .expect("a blank line after the loads");
    let mut head: Vec<&str> = head.lines().collect();
    assert_eq!(
        head.remove(0),
        format!("opened {} (3 enabled packages verified)", store.display())
    );
    // Said on a machine without a usable GPU, and not elsewhere.
    head.retain(|line| !line.starts_with("no CUDA device, CPU operations only: "));
    head.sort_unstable();
    assert_eq!(
        head,
        [
            "loaded example.c_runner 1.0.0 (1 operation implementation)",
            "loaded example.dependent 1.0.0 (1 operation implementation)",
            "loaded example.scan 1.0.0 (2 operation implementations)",
        ]
    );
    assert_eq!(
        body,
        "\
example.sequence.inclusive_scan -> example.scan.inclusive.cpu from example.scan 1.0.0
  input     [[1, 2, 3, 4], [10, 20, 30, 40]]
  output    [[1, 3, 6, 10], [10, 30, 60, 100]]

example.sequence.scan_then_total -> example.dependent.total.cpu from example.dependent 1.0.0
  scratch   64 bytes, aligned to 8
  input     [[1, 2, 3, 4], [10, 20, 30, 40]]
  output    [[10], [100]]

example.runner.demo_pipeline -> example.c_runner.pipeline.cpu from example.c_runner 1.0.0
  input     [[1, 2, 3, 4], [10, 20, 30, 40]]
  output[0] [[1, 3, 6, 10], [10, 30, 60, 100]]
  output[1] [[0, 1, 3, 6], [0, 10, 30, 60]]
"
    );
}

#[test]
fn rust_runner_fails_with_the_reason_when_an_operation_cannot_run() {
    let shop = Workshop::new();
    let store = prepared_store(&shop, &[&SCAN]);

    // No provider of the pipeline is installed: the service's report says so.
    let ran = run_runner(&store, &[INCLUSIVE_OP, PIPELINE_OP]);
    assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout
            .contains("output    [[1, 3, 6, 10], [10, 30, 60, 100]]"),
        "the first operation ran: {}",
        ran.stdout
    );
    assert!(
        ran.stderr
            .starts_with(&format!("error: resolving {PIPELINE_OP}: ")),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains(PIPELINE_OP), "{}", ran.stderr);

    // An operation whose contract the runner does not know.
    let ran = run_runner(&store, &["example.sequence.unknown"]);
    assert_eq!(ran.code, Some(1));
    assert_eq!(
        ran.stderr,
        "error: this runner does not know the contract of example.sequence.unknown\n"
    );

    // No store named: the usage, as a usage error.
    let out = Command::new(runner_binary()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Usage: guild-example-runner <STORE_DIR> [OPERATION]..."),
        "{stderr}"
    );

    // A store that cannot be opened (a file where the directory should be).
    let file = shop.fresh("not-a-store");
    std::fs::write(&file, b"").unwrap();
    let ran = run_runner(&file, &[]);
    assert_eq!(ran.code, Some(1));
    assert!(
        ran.stderr.starts_with(&format!(
            "error: cannot open the store {}: ",
            file.display()
        )),
        "{}",
        ran.stderr
    );

    // A mistyped store path: refused, naming it, and nothing is created there.
    let typo = shop.fresh("stroe");
    let ran = run_runner(&typo, &[INCLUSIVE_OP]);
    assert_eq!(ran.code, Some(1));
    assert!(
        ran.stderr.contains(&typo.display().to_string())
            && ran.stderr.contains("is not a guild store"),
        "{}",
        ran.stderr
    );
    assert!(!typo.exists(), "the runner created {}", typo.display());
}

#[test]
fn rust_runner_help_is_help_and_touches_no_store() {
    // It used to take `--help` for a store path and create a directory of that name.
    let shop = Workshop::new();
    let cwd = shop.fresh("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    for flag in ["--help", "-h"] {
        let out = Command::new(runner_binary())
            .arg(flag)
            .current_dir(&cwd)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}");
        assert!(stdout.contains("--serve"), "{stdout}");
        assert!(stdout.contains("--interval-ms <N>"), "{stdout}");
        let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().collect();
        assert!(left.is_empty(), "{flag} created {left:?}");
    }
    // An unknown option and an interval without --serve are usage errors, not store paths.
    for args in [&["--bogus", "store"][..], &["--interval-ms", "5", "store"]] {
        let out = Command::new(runner_binary())
            .args(args)
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            std::fs::read_dir(&cwd).unwrap().next().is_none(),
            "{args:?}"
        );
    }
}
