//! The compatibility matrix (test-plugins/compat): builds against the frozen SDK 1.5 headers load
//! and run on this host; today's builds on a host that predates the operation service (it
//! advertises a host table that stops before the `operations` tail) load and degrade exactly as
//! the size rules say; and a payload signed before an optional manifest field existed still
//! verifies, its canonical bytes unchanged.

use std::path::PathBuf;

use guild_adapters_posix::DlopenLoader;
use guild_conformance::{self as conformance, Options, Verdict};
use guild_domain::manifest::Metadata;
use guild_domain::operation::{DType, MemorySpace, TensorDesc};
use guild_host::operations::{DeviceSupport, ExecuteError, TensorArg, TensorArgMut};
use guild_host::{Host, InstallOptions, OpName, OperationRequest, OperationService};
use guild_ports::loader::{LoadError, LoadRequest, LoadedPlugin, PluginLoader};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, trust, ModDep, Spec, Workshop, PUBLISHER};

use crate::guild;
use crate::operations::fixture_with;

use guild_test_support::plugins::INCLUSIVE_OP as SCAN_OP;
use guild_test_support::plugins::TOTAL_OP;

fn compat_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../test-plugins/compat")
}

/// The scan module, from `library` (the frozen build or today's).
fn scan(library: &str) -> Spec {
    let mut spec = Spec::module("example.scan", "1.0.0").library(&plugin_library(library));
    spec.provided_ops = vec![
        "example.scan.inclusive.cpu".into(),
        "example.scan.exclusive.cpu".into(),
    ];
    spec
}

/// The module that calls the scan through the operation service, from `library`.
fn dependent(library: &str) -> Spec {
    let mut spec = Spec::module("example.dependent", "1.0.0")
        .library(&plugin_library(library))
        .module_dep(ModDep::on("example.scan", "1.0.0").max("1.99.0"));
    spec.provided_ops = vec!["example.dependent.total.cpu".into()];
    spec
}

fn desc(dims: &[u64]) -> TensorDesc {
    TensorDesc::new(DType::I64, dims, MemorySpace::Host)
}

fn op(name: &str) -> OpName {
    OpName::new(name).unwrap()
}

/// Runs the scan and the row totals on `service` over a 5x3 i64 input.
fn run_both(service: &OperationService<'_>) -> Result<(Vec<i64>, Vec<i64>), ExecuteError> {
    let input: Vec<i64> = (0..15).map(|i| i * 3 - 7).collect();
    let scan = service
        .resolve(&OperationRequest::cpu(
            op(SCAN_OP),
            vec![desc(&[5, 3])],
            vec![desc(&[5, 3])],
        ))
        .unwrap();
    let mut scanned = vec![0i64; 15];
    scan.execute(
        &[TensorArg::new(&desc(&[5, 3]), &input)],
        &mut [TensorArgMut::new(&desc(&[5, 3]), &mut scanned)],
        None,
    )?;
    let total = service
        .resolve(&OperationRequest::cpu(
            op(TOTAL_OP),
            vec![desc(&[5, 3])],
            vec![desc(&[1, 3])],
        ))
        .unwrap();
    let mut scratch = vec![0u8; total.scratch().host_bytes as usize];
    let mut totals = vec![0i64; 3];
    total.execute(
        &[TensorArg::new(&desc(&[5, 3]), &input)],
        &mut [TensorArgMut::new(&desc(&[1, 3]), &mut totals)],
        Some(&mut scratch),
    )?;
    Ok((scanned, totals))
}

fn reference() -> (Vec<i64>, Vec<i64>) {
    let input: Vec<i64> = (0..15).map(|i| i * 3 - 7).collect();
    let mut scanned = Vec::new();
    let mut totals = Vec::new();
    for row in input.chunks(5) {
        let mut acc = 0;
        for x in row {
            acc += x;
            scanned.push(acc);
        }
        totals.push(acc);
    }
    (scanned, totals)
}

#[test]
fn builds_against_the_frozen_sdk_load_and_run_on_this_host() {
    let f = fixture_with(
        &[scan("compat_scan"), dependent("compat_dependent")],
        DeviceSupport::host(),
    );
    let service = OperationService::new(f.host.kernels());
    // The frozen dependent copied today's (larger or equal) service table by the size it knew,
    // and calls the frozen scan through it.
    assert_eq!(run_both(&service).unwrap(), reference());
}

#[test]
fn a_frozen_build_runs_beside_todays_builds() {
    let f = fixture_with(
        &[scan("scan_module"), dependent("compat_dependent")],
        DeviceSupport::host(),
    );
    assert_eq!(
        run_both(&OperationService::new(f.host.kernels())).unwrap(),
        reference()
    );
}

#[test]
fn frozen_builds_pass_the_conformance_check() {
    let shop = Workshop::new();
    let mut options = Options::new(guild().path().to_path_buf());
    options.call_timeout = std::time::Duration::from_secs(2);
    for spec in [scan("compat_scan"), dependent("compat_dependent")] {
        let built = shop.build_with(&spec, None);
        let report = conformance::check(&built.archive, None, &options).unwrap();
        assert!(report.passed(), "{}: {:#?}", spec.id, report.findings);
    }
}

/// A loader that offers what a host from before the operation service offered: a host table
/// whose `struct_size` stops before the `operations` tail.
struct OlderHost(DlopenLoader);

impl PluginLoader for OlderHost {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        let mut older = request.clone();
        older.operations = None;
        self.0.load(&older)
    }
}

#[test]
fn todays_builds_on_a_host_without_the_operation_service_degrade_as_the_size_rules_say() {
    for (scan_lib, dependent_lib) in [
        ("scan_module", "scan_dependent"),
        ("compat_scan", "compat_dependent"),
    ] {
        let shop = Workshop::new();
        let k = key();
        let store = shop.fresh("store");
        let (pm, _) = open_dir(&store).unwrap();
        trust(&pm, PUBLISHER, &k);
        let host = Host::with_devices(
            pm,
            Box::new(OlderHost(DlopenLoader::new())),
            DeviceSupport::host(),
        );
        // Both load: the service is an optional tail, which each reads only when the table's
        // size covers it.
        for spec in [scan(scan_lib), dependent(dependent_lib)] {
            let built = shop.build(&spec, &k);
            host.install(&built.archive, InstallOptions::default())
                .unwrap_or_else(|e| panic!("{dependent_lib}: {}: {e}", spec.id));
        }
        // The scan runs; the totals, which need the service, are refused with a reason.
        let err = run_both(&OperationService::new(host.kernels())).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("unsupported") && text.contains("no operation service"),
            "{dependent_lib}: {text}"
        );
    }
}

/// Builds that carry extension tables from headers newer (or older) than this host's, as
/// test-plugins/ext_probe lays them out: `guild check` reports the negotiation exactly as the
/// host's size/tag/version rules decide it. A table larger than the layout this host knows is read
/// up to that layout (degraded, accepted), an older one up to its size, an unknown version or a
/// size below the layout is refused, and an unknown tag is skipped (so a GOP1 operation without
/// a GOP1 it can read is refused at registration).
#[test]
fn extension_tables_from_other_headers_are_negotiated_by_the_size_tag_and_version_rules() {
    let shop = Workshop::new();
    let mut options = Options::new(guild().path().to_path_buf());
    options.call_timeout = std::time::Duration::from_secs(2);
    for (ext, case, check, verdict, says) in [
        ("gop1", "newer", "extensions", Verdict::Passed, ""),
        ("cpu2", "newer", "extensions", Verdict::Passed, ""),
        ("cpe1", "newer", "extensions", Verdict::Passed, ""),
        ("cpu2", "older", "extensions", Verdict::Passed, ""),
        (
            "gop1",
            "version",
            "extensions",
            Verdict::Failed,
            "has version 2",
        ),
        (
            "cpu2",
            "version",
            "extensions",
            Verdict::Failed,
            "has version 3",
        ),
        (
            "gop1",
            "too_small",
            "extensions",
            Verdict::Failed,
            "smaller than",
        ),
        (
            "gop1",
            "wrong_tag",
            "registration",
            Verdict::Failed,
            "need a GOP1",
        ),
    ] {
        let mut spec = Spec::kernel(&format!("test.ext-probe-{ext}-{case}"), "1.0.0")
            .library(&plugin_library("ext_probe"));
        spec.files[0].0 = format!("lib/libext_probe__{ext}__{case}.so");
        spec.provided_ops = vec![format!("test.ext_probe.{ext}")];
        let built = shop.build_with(&spec, None);
        let report = conformance::check(&built.archive, None, &options).unwrap();
        let f = report
            .find(check, None)
            .unwrap_or_else(|| panic!("{ext}/{case}: no {check}: {report:#?}"));
        assert_eq!(f.verdict, verdict, "{ext}/{case}: {check}: {}", f.reason);
        assert!(f.reason.contains(says), "{ext}/{case}: {}", f.reason);
    }
}

/// The frozen payload: signed at SDK 1.5 without any of the optional manifest fields
/// (`dependencies`, `module_dependencies`, `provided_runners`, ...).
const FROZEN_DIGEST: &str = "59219ced5725951bae777d43b82446f6ae6b83ea67e82000f374a5559c298d25";
const FROZEN_ARTIFACT: &[u8] = b"frozen compat payload\n";

#[test]
fn a_payload_signed_before_the_optional_fields_existed_still_verifies_byte_for_byte() {
    let dir = compat_dir().join("payloads");
    let bytes = std::fs::read(dir.join("compat_payload-1.0.0.gkmetadata")).unwrap();
    let metadata = Metadata::parse(&bytes).unwrap();
    // The canonical payload this host computes is the one that was signed.
    assert_eq!(metadata.payload_digest().to_hex(), FROZEN_DIGEST);
    let m = metadata.manifest();
    assert!(m.dependencies.is_empty() && m.module_dependencies.is_empty());
    assert!(m.provided_runners.is_empty());

    // And the archive authenticates under a trust store holding the publisher's frozen key.
    let shop = Workshop::new();
    let archive = shop.fresh("compat_payload.gkernel");
    let src = shop.fresh("src");
    std::fs::create_dir_all(src.join("lib")).unwrap();
    std::fs::write(src.join("lib/libcompat_payload.so"), FROZEN_ARTIFACT).unwrap();
    let files = vec![(
        m.artifacts[0].path.clone(),
        src.join("lib/libcompat_payload.so"),
    )];
    guild_adapters_fs::archive::write_gkpk(&archive, &bytes, &files).unwrap();
    let store = shop.fresh("store");
    let s = store.to_str().unwrap();
    let key = dir.join("org.example.pub");
    let run = guild().run(
        shop.path(),
        &[
            "--store",
            s,
            "trust",
            "add",
            "org.example",
            key.to_str().unwrap(),
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = guild().run(
        shop.path(),
        &["--store", s, "--json", "verify", archive.to_str().unwrap()],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["payload_sha256"], FROZEN_DIGEST);
}
