//! One test per C test plugin: what `DlopenLoader::load` makes of it, asserted exactly, and that
//! every failed load has closed its library again.

use std::ffi::c_void;
use std::sync::Arc;

use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, GUILD_OP_CUSTOM, GUILD_OP_MATVEC,
    GUILD_OP_RMS_NORM, GUILD_STATUS_ERR_STATE,
};
use guild_adapters_posix::{DlopenLoader, OwnedKernel};
use guild_domain::graph::{DependencyGraph, PackageNode};
use guild_domain::ids::OpName;
use guild_domain::manifest::Metadata;
use guild_domain::operation::Backend;
use guild_domain::version::PackedVersion;
use guild_ports::loader::{LoadErrorKind, LoadRequest, LoadedPlugin, PluginLoader};

use crate::support::{guild_text, marker_lines, request};

const RMS_NORM: &str = "test.good_kernel.rms_norm_f32";
const PREFIX_SUM: &str = "test.good_kernel.prefix_sum_f32";
const RUNNER: &str = "test.good_kernel.runner";

/// Loads through a fresh loader and checks that a failure left nothing open.
fn load(request: &LoadRequest) -> (DlopenLoader, Result<LoadedPlugin, LoadErrorKind>) {
    let loader = DlopenLoader::new();
    let outcome = loader.load(request).map_err(|e| {
        assert_eq!(e.package, request.package, "the error names the package");
        assert_eq!(e.library, request.library, "the error names the library");
        *e.kind
    });
    if outcome.is_err() {
        assert_eq!(
            loader.open_libraries(),
            0,
            "a failed load must close its library before it returns"
        );
    }
    (loader, outcome)
}

/// The error a load must fail with.
fn refusal(request: &LoadRequest) -> LoadErrorKind {
    match load(request).1 {
        Ok(plugin) => panic!(
            "{} loaded, registering {:?}",
            request.library.display(),
            plugin.kernels
        ),
        Err(kind) => kind,
    }
}

#[test]
fn good_kernel_loads_its_kernels_and_runner() {
    let request = request("good_kernel", &[RMS_NORM, PREFIX_SUM], &[RUNNER]);
    let (loader, outcome) = load(&request);
    let plugin = outcome.unwrap_or_else(|e| panic!("good_kernel failed to load: {e}"));

    assert_eq!(loader.open_libraries(), 1);
    assert_eq!(plugin.library.package().as_str(), "test.good_kernel");
    assert_eq!(plugin.library.version().to_string(), "1.0.0");
    let kernels: Vec<_> = plugin
        .kernels
        .iter()
        .map(|k| (k.impl_id.as_str(), k.op_kind, k.backend, k.priority))
        .collect();
    assert_eq!(
        kernels,
        [
            (RMS_NORM, GUILD_OP_RMS_NORM, Backend::Cpu, 10),
            (PREFIX_SUM, GUILD_OP_CUSTOM, Backend::Cpu, 50)
        ]
    );
    assert_eq!(plugin.kernels[0].op_name, None);
    assert_eq!(plugin.kernels[0].operation, None);
    assert_eq!(
        plugin.kernels[1].op_name,
        Some(OpName::new("test.sequence.prefix_sum").expect("valid"))
    );
    let runners: Vec<_> = plugin
        .runners
        .iter()
        .map(|r| (r.runner_id.as_str(), r.priority))
        .collect();
    assert_eq!(
        runners,
        [(RUNNER, 7)],
        "RMD1's priority (7) takes the place of the descriptor's (3)"
    );

    drop(plugin);
    assert_eq!(loader.open_libraries(), 0);
}

#[test]
fn init_failure_reports_the_plugins_error_and_still_runs_shutdown() {
    let kind = refusal(&request("init_fails", &[], &[]));
    assert_eq!(
        kind,
        LoadErrorKind::InitFailed {
            status: -9,
            status_name: "GUILD_STATUS_ERR_DEVICE",
            component: "test.init_fails".into(),
            message: "no usable device for the test kernels".into(),
        }
    );
    assert_eq!(
        kind.to_string(),
        "init failed with status -9 (GUILD_STATUS_ERR_DEVICE) in test.init_fails: no usable \
         device for the test kernels"
    );
    assert_eq!(
        marker_lines("init_fails"),
        ["shutdown freed the state init left"],
        "shutdown must run once, with the state the failed init handed over"
    );
}

#[test]
fn a_duplicate_impl_id_is_refused() {
    let kind = refusal(&request(
        "duplicate_impl",
        &["test.duplicate_impl.add"],
        &[],
    ));
    assert_eq!(
        kind,
        LoadErrorKind::RegistrationRefused {
            reason: "impl id test.duplicate_impl.add is registered twice".into()
        }
    );
}

#[test]
fn impl_ids_that_differ_from_provided_ops_are_a_mismatch() {
    let kind = refusal(&request("wrong_ids", &["test.wrong_ids.declared"], &[]));
    assert_eq!(
        kind,
        LoadErrorKind::RegistrationMismatch {
            registered: vec!["test.wrong_ids.actual".into()],
            declared: vec!["test.wrong_ids.declared".into()],
        }
    );
}

#[test]
fn declared_ids_that_are_never_registered_are_a_mismatch() {
    let extra = "test.good_kernel.extra";
    let kind = refusal(&request(
        "good_kernel",
        &[RMS_NORM, PREFIX_SUM, extra],
        &[RUNNER],
    ));
    assert_eq!(
        kind,
        LoadErrorKind::RegistrationMismatch {
            registered: vec![PREFIX_SUM.into(), RMS_NORM.into()],
            declared: vec![extra.into(), PREFIX_SUM.into(), RMS_NORM.into()],
        }
    );
}

#[test]
fn an_undeclared_runner_is_a_mismatch() {
    let kind = refusal(&request("good_kernel", &[RMS_NORM, PREFIX_SUM], &[]));
    assert_eq!(
        kind,
        LoadErrorKind::RegistrationMismatch {
            registered: vec![RUNNER.into()],
            declared: vec![],
        }
    );
}

#[test]
fn registration_from_another_thread_is_refused() {
    let kind = refusal(&request("other_thread", &["test.other_thread.add"], &[]));
    assert_eq!(
        kind,
        LoadErrorKind::RegistrationRefused {
            reason: "register_kernel was called from a thread other than the one running init; \
                     registration must happen synchronously on the init thread"
                .into()
        }
    );
}

#[test]
fn a_kept_staging_host_answers_err_state_after_init() {
    let request = request("keeps_host", &["test.keeps_host.probe"], &[]);
    let (loader, outcome) = load(&request);
    let plugin = outcome.unwrap_or_else(|e| panic!("keeps_host failed to load: {e}"));
    let probe = plugin
        .kernels
        .iter()
        .find(|k| k.impl_id.as_str() == "test.keeps_host.probe")
        .expect("the probe kernel is registered");
    let provider: Arc<dyn std::any::Any + Send + Sync> = probe.provider.clone();
    let owned = provider
        .downcast::<OwnedKernel>()
        .expect("the loader's provider is an OwnedKernel");
    let op = owned.operation().expect("the probe has a GOP1 contract");
    let execute = op.execute.expect("GOP1 execute is present");
    let args = empty_execute_args();
    let mut error = guild_error_info_t::new();

    // SAFETY: the plugin's library is loaded (`plugin` holds it) and execute is called with
    // the user_data registered for it, a valid argument record and an error record, per GOP1.
    let status = unsafe { execute(op.user_data, &args, &mut error) };

    assert_eq!(status, GUILD_STATUS_ERR_STATE);
    assert_eq!(
        guild_text(&error.message),
        "late register_kernel returned -11, register_runner returned -11"
    );
    drop(owned);
    drop(plugin);
    assert_eq!(loader.open_libraries(), 0);
    assert_eq!(
        marker_lines("keeps_host"),
        ["shutdown: late register_kernel returned -11, register_runner returned -11"]
    );
}

#[test]
fn a_plugin_for_another_abi_major_is_refused_before_init() {
    let kind = refusal(&request("wrong_abi", &[], &[]));
    let v2 = PackedVersion::new(2, 0, 0).expect("packs");
    assert_eq!(
        kind,
        LoadErrorKind::AbiMismatch {
            min: v2,
            max: v2,
            host: PackedVersion::KERNEL_ABI_V1
        }
    );
    assert_eq!(
        marker_lines("wrong_abi"),
        Vec::<String>::new(),
        "neither init nor shutdown may run"
    );
}

#[test]
fn a_library_without_the_entry_symbol_is_not_a_plugin() {
    let kind = refusal(&request("no_entry", &[], &[]));
    assert_eq!(
        kind,
        LoadErrorKind::MissingEntry {
            symbol: "guild_plugin_entry_v1"
        }
    );
}

#[test]
fn a_descriptor_without_init_is_refused() {
    let kind = refusal(&request("bad_descriptor", &[], &[]));
    assert_eq!(
        kind,
        LoadErrorKind::BadDescriptor {
            reason: "init is NULL".into()
        }
    );
    assert_eq!(marker_lines("bad_descriptor"), Vec::<String>::new());
}

#[test]
fn a_missing_library_cannot_be_opened() {
    let mut request = request("good_kernel", &[], &[]);
    request.library = request.library.with_file_name("libno_such_plugin.so");
    let kind = refusal(&request);
    let LoadErrorKind::Open { reason } = kind else {
        panic!("expected an Open error, got {kind:?}");
    };
    // dlerror's wording is the C library's (and may be translated); the file name is certain.
    assert!(
        reason.contains("libno_such_plugin.so"),
        "dlerror's text names the file: {reason}"
    );
}

/// A historical `.gkernel` whose manifest carries module edges with a build-time ABI tag: the
/// domain treats them as provenance (nothing to resolve, the load plan is healthy without the
/// named modules), and the library loads like any good kernel.
#[test]
fn a_legacy_kernel_with_provenance_edges_loads() {
    let template = request("legacy_provenance", &[], &[]);
    let entry = template
        .library
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a file name");
    let json = format!(
        r#"{{"gkmetadata": 1, "signatures": [], "payload": {{
            "package_id": "test.legacy_provenance", "kind": "gkernel", "version": "0.9.1",
            "publisher_id": "org.example", "kernel_abi": {{"min": "1.0.0", "max": "1.0.0"}},
            "os": "linux", "arch": "x86_64", "backends": ["cpu"], "entry": "{entry}",
            "artifacts": [{{"path": "{entry}", "size": 1, "sha256": "{zeros}"}}],
            "provided_ops": ["test.legacy_provenance.matvec_q4_0"],
            "module_dependencies": [
                {{"module_id": "org.example.quant_tables", "min_version": "2.1.0",
                  "abi_tag": "guild.build.v0"}},
                {{"module_id": "org.example.gemv_gen", "min_version": "0.3.0",
                  "max_version": "0.3.9", "abi_tag": "legacy-codegen"}}
            ]
        }}}}"#,
        zeros = "0".repeat(64)
    );
    let metadata = Metadata::parse(json.as_bytes()).expect("the legacy manifest parses");
    let node = PackageNode::from_metadata(&metadata, true);
    assert!(
        node.module_dependencies
            .iter()
            .all(|d| node.is_provenance(d)),
        "every module edge of this gkernel is provenance"
    );
    let graph = DependencyGraph::new(vec![node]).expect("a graph of one package");
    assert!(
        graph.plan().is_healthy(),
        "provenance edges need no installed module: {:?}",
        graph.plan().problems
    );

    let manifest = metadata.manifest();
    let request = LoadRequest {
        package: manifest.package_id.clone(),
        version: manifest.version.clone(),
        provided_ops: manifest.provided_ops.clone(),
        provided_runners: manifest.provided_runners.clone(),
        ..template
    };
    let (loader, outcome) = load(&request);
    let plugin = outcome.unwrap_or_else(|e| panic!("legacy_provenance failed to load: {e}"));
    let kernels: Vec<_> = plugin
        .kernels
        .iter()
        .map(|k| {
            (
                k.impl_id.as_str(),
                k.op_kind,
                k.op_name.as_ref().map(OpName::as_str),
            )
        })
        .collect();
    assert_eq!(
        kernels,
        [(
            "test.legacy_provenance.matvec_q4_0",
            GUILD_OP_MATVEC,
            Some("matvec")
        )]
    );
    drop(plugin);
    assert_eq!(loader.open_libraries(), 0);
}

#[test]
fn the_minimal_kernel_loads_with_nothing_to_register() {
    let (loader, outcome) = load(&request("minimal_kernel", &[], &[]));
    let plugin = outcome.unwrap_or_else(|e| panic!("minimal_kernel failed to load: {e}"));
    assert!(plugin.kernels.is_empty() && plugin.runners.is_empty());
    drop(plugin);
    assert_eq!(loader.open_libraries(), 0);
}

fn empty_execute_args() -> guild_execute_args_v1_t {
    guild_execute_args_v1_t {
        struct_size: size_of::<guild_execute_args_v1_t>() as u32,
        reserved: 0,
        inputs: std::ptr::null(),
        input_count: 0,
        outputs: std::ptr::null(),
        output_count: 0,
        scratch_host: std::ptr::null_mut::<c_void>(),
        scratch_host_size: 0,
        scratch_device: std::ptr::null_mut::<c_void>(),
        scratch_device_size: 0,
        stream: std::ptr::null_mut(),
        device_id: 0,
        sync_mode: 0,
        params: std::ptr::null(),
        params_size: 0,
    }
}
