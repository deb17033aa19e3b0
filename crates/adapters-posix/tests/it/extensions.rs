//! Negotiation of every extension the host consumes, through a real C plugin loaded by
//! `DlopenLoader`: test-plugins/ext_probe, copied once per case under the name
//! `libext_probe__<extension>__<case>.so`, from which the plugin picks what to register.
//!
//! [`CASES`] is the table: for each (extension, case) the exact outcome, either the copied view
//! (tag, declared version and size, bytes copied, callbacks reported absent), a skipped tag, or
//! the exact typed refusal. Further tests call one callback of each copied table through the
//! host's copy, to prove that the copy reaches the plugin's function with its user_data, and
//! check how a kernel carrying several extensions links their copies.

use std::ffi::c_void;
use std::fs;
use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::OnceLock;

use guild_abi::{
    guild_cpu_backend_ext_v2_t, guild_cpu_expert_ext_v1_t, guild_cpu_expert_format_v1_t,
    guild_cpu_expert_quantize_activation_args_v1_t, guild_cpu_router_args_v1_t,
    guild_cuda_attn_config_args_v1_t, guild_cuda_attn_ext_v1_t, guild_cuda_dense_ext_v1_t,
    guild_cuda_dense_geometry_v1_t, guild_cuda_dense_project_args_v1_t,
    guild_cuda_dense_strides_v1_t, guild_cuda_moe_ext_v1_t, guild_cuda_moe_route_args_v1_t,
    guild_cuda_moe_workspace_query_args_v1_t, guild_cuda_qwen_cvec_args_v1_t,
    guild_cuda_qwen_group_v1_t, guild_cuda_row_selection_v1_t, guild_error_info_t,
    guild_ext_header_t, guild_operation_ext_v1_t, guild_prefill_kernel_ext_v1_t,
    guild_prefill_router_args_v1_t, guild_runner_model_ext_v1_t, guild_scratch_request_v1_t,
    guild_tensor_desc_v1_t, GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX, GUILD_CUDA_CONFIG_VALUE_INT,
    GUILD_CUDA_MOE_OP_ROUTE, GUILD_DTYPE_F32, GUILD_MEMORY_HOST, GUILD_STATUS_ERR_INVALID_ARGUMENT,
    GUILD_STATUS_OK,
};
use guild_adapters_posix::extensions::AbiTable;
use guild_adapters_posix::{DlopenLoader, ExtensionCopy, OwnedKernel, OwnedRunner};
use guild_domain::ids::{ImplId, PackageId, RunnerId};
use guild_domain::version::{PackedVersion, Version};
use guild_ports::loader::{
    ExtensionProblem, ExtensionRefusal, ExtensionSite, ExtensionTag, LoadErrorKind, LoadRequest,
    LoadedPlugin, PluginLoader, Registrant,
};

use crate::support::{guild_text, host_query, plugin_path};

// ---------------------------------------------------------------------------------------------
// Loading one case
// ---------------------------------------------------------------------------------------------

/// This process's directory of renamed copies.
fn copies_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("ext-probe-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        dir
    })
}

/// The id the probe registers for `ext`.
fn probe_id(ext: &str) -> String {
    format!("test.ext_probe.{ext}")
}

/// Loads the probe as `(ext, case)`: a copy named for the case, declaring the one id it
/// registers (a runner for rmd1, a kernel otherwise).
fn load(ext: &str, case: &str) -> Result<LoadedPlugin, LoadErrorKind> {
    let path = copies_dir().join(format!("libext_probe__{ext}__{case}.so"));
    if !path.is_file() {
        // Tests run in parallel and may want the same case: each copies to a name of its own
        // and renames it into place, so that nobody opens a half-written copy.
        let source = plugin_path("ext_probe");
        let partial = copies_dir().join(format!(
            ".partial-{}-{:?}-{ext}-{case}",
            std::process::id(),
            std::thread::current().id()
        ));
        fs::copy(&source, &partial).unwrap_or_else(|e| {
            panic!(
                "cannot copy {} to {}: {e}",
                source.display(),
                partial.display()
            )
        });
        fs::rename(&partial, &path).unwrap_or_else(|e| {
            panic!(
                "cannot rename {} to {}: {e}",
                partial.display(),
                path.display()
            )
        });
    }
    let id = probe_id(ext);
    let runner = ext == "rmd1";
    let request = LoadRequest {
        package: PackageId::new("test.ext_probe").expect("a valid package id"),
        version: Version::new(1, 0, 0),
        library: path,
        provided_ops: if runner {
            Vec::new()
        } else {
            vec![ImplId::new(id.as_str()).expect("a valid impl id")]
        },
        provided_runners: if runner {
            vec![RunnerId::new(id.as_str()).expect("a valid runner id")]
        } else {
            Vec::new()
        },
        host_abi: PackedVersion::KERNEL_ABI_V1,
        operations: None,
    };
    DlopenLoader::new().load(&request).map_err(|e| *e.kind)
}

fn kernel(plugin: &LoadedPlugin) -> &OwnedKernel {
    assert_eq!(plugin.kernels.len(), 1, "one kernel");
    let provider: &dyn std::any::Any = plugin.kernels[0].provider.as_ref();
    provider
        .downcast_ref::<OwnedKernel>()
        .expect("the dlopen loader's kernel")
}

fn runner(plugin: &LoadedPlugin) -> &OwnedRunner {
    assert_eq!(plugin.runners.len(), 1, "one runner");
    let provider: &dyn std::any::Any = plugin.runners[0].provider.as_ref();
    provider
        .downcast_ref::<OwnedRunner>()
        .expect("the dlopen loader's runner")
}

// ---------------------------------------------------------------------------------------------
// What a case must give
// ---------------------------------------------------------------------------------------------

/// One copied extension as the test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct View {
    tag: String,
    version: u32,
    declared: u32,
    copied: usize,
    absent: Vec<&'static str>,
}

fn view<T: AbiTable>(copy: &ExtensionCopy<T>) -> View {
    View {
        tag: copy.contract().name.to_owned(),
        version: copy.version(),
        declared: copy.declared_size(),
        copied: copy.copied_size(),
        absent: copy.absent_callbacks(),
    }
}

/// Every extension copy of a loaded probe, in a fixed order, and the tags it skipped.
fn views(ext: &str, plugin: &LoadedPlugin) -> (Vec<View>, Vec<String>) {
    let tags =
        |t: &[u32]| -> Vec<String> { t.iter().map(|&t| ExtensionTag(t).to_string()).collect() };
    if ext == "rmd1" {
        let r = runner(plugin);
        return (
            r.model_copy().map(view).into_iter().collect(),
            tags(r.skipped_tags()),
        );
    }
    let k = kernel(plugin);
    let mut all = Vec::new();
    all.extend(k.operation_copy().map(view));
    all.extend(k.cpu_backend().map(view));
    all.extend(k.cuda_dense().map(view));
    all.extend(k.cuda_attn().map(view));
    all.extend(k.cuda_moe().map(view));
    all.extend(k.cuda_qwen().map(view));
    all.extend(k.prefill_copy().map(view));
    (all, tags(k.skipped_tags()))
}

/// The exact outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Loaded, with these copies and these skipped tags.
    Loaded {
        copies: Vec<View>,
        skipped: Vec<String>,
    },
    /// Refused because of an extension.
    Refused(ExtensionRefusal),
    /// Refused for another reason.
    RefusedText(String),
}

fn outcome(ext: &str, case: &str) -> Outcome {
    match load(ext, case) {
        Ok(plugin) => {
            let (copies, skipped) = views(ext, &plugin);
            Outcome::Loaded { copies, skipped }
        }
        Err(LoadErrorKind::ExtensionRefused { refusal, more: 0 }) => Outcome::Refused(refusal),
        Err(LoadErrorKind::RegistrationRefused { reason }) => Outcome::RefusedText(reason),
        Err(other) => panic!("{ext}/{case}: unexpected failure {other}"),
    }
}

const V2_OPS: [&str; 6] = [
    "describe_format",
    "quantize_planar_q2",
    "dequantize_planar_q2",
    "q2_rows",
    "router_bf16",
    "combine_ordered",
];

fn sz<T>() -> u32 {
    size_of::<T>() as u32
}

fn copied(tag: &str, version: u32, declared: u32, copied: u32, absent: &[&'static str]) -> View {
    View {
        tag: tag.into(),
        version,
        declared,
        copied: copied as usize,
        absent: absent.to_vec(),
    }
}

/// Loaded with exactly these copies and nothing skipped.
fn loaded(copies: Vec<View>) -> Outcome {
    Outcome::Loaded {
        copies,
        skipped: Vec::new(),
    }
}

/// Loaded without any copy: the tag was unknown and skipped.
fn skipped(tag: &str) -> Outcome {
    Outcome::Loaded {
        copies: Vec::new(),
        skipped: vec![tag.into()],
    }
}

/// Refused because of an extension of the probe's registration (a runner for rmd1, a kernel
/// otherwise).
fn refused(ext: &str, site: ExtensionSite, tag: &str, problem: ExtensionProblem) -> Outcome {
    let id = probe_id(ext);
    let registrant = if ext == "rmd1" {
        Registrant::Runner(RunnerId::new(id.as_str()).expect("valid"))
    } else {
        Registrant::Kernel(ImplId::new(id.as_str()).expect("valid"))
    };
    refused_by(registrant, site, tag, problem)
}

/// Refused because of an extension of a kernel the probe registers under `ext`'s id (rmd1's
/// misplaced case registers a kernel).
fn refused_kernel(ext: &str, site: ExtensionSite, tag: &str, problem: ExtensionProblem) -> Outcome {
    let id = ImplId::new(probe_id(ext)).expect("valid");
    refused_by(Registrant::Kernel(id), site, tag, problem)
}

fn refused_by(
    registrant: Registrant,
    site: ExtensionSite,
    tag: &str,
    problem: ExtensionProblem,
) -> Outcome {
    Outcome::Refused(ExtensionRefusal {
        registrant,
        site,
        tag: Some(ExtensionTag::from_chars(
            tag.as_bytes().try_into().expect("four characters"),
        )),
        problem,
    })
}

fn too_small(version: u32, struct_size: u32, minimum: u32, layout: &str) -> ExtensionProblem {
    ExtensionProblem::TooSmall {
        version,
        struct_size,
        minimum,
        layout: layout.into(),
    }
}

fn unknown_version(version: u32, known: &[u32]) -> ExtensionProblem {
    ExtensionProblem::UnknownVersion {
        version,
        known: known.to_vec(),
    }
}

fn null(callback: &str) -> ExtensionProblem {
    ExtensionProblem::NullCallback {
        callback: callback.into(),
    }
}

fn misplaced(belongs_on: &str, conflict: Option<&str>) -> ExtensionProblem {
    ExtensionProblem::Misplaced {
        belongs_on: belongs_on.into(),
        conflict: conflict.map(str::to_owned),
    }
}

fn cycle(links_back_to: usize) -> ExtensionProblem {
    ExtensionProblem::Cycle { links_back_to }
}

const C0: ExtensionSite = ExtensionSite::Chain(0);
const C1: ExtensionSite = ExtensionSite::Chain(1);
const KF: ExtensionSite = ExtensionSite::KernelFns;

/// The table: every (extension, case) and its exact outcome.
fn cases() -> Vec<(&'static str, &'static str, Outcome)> {
    let gop1 = sz::<guild_operation_ext_v1_t>();
    let rmd1 = sz::<guild_runner_model_ext_v1_t>();
    let cpe1 = sz::<guild_cpu_expert_ext_v1_t>();
    let cpu2 = sz::<guild_cpu_backend_ext_v2_t>();
    let cdd1 = sz::<guild_cuda_dense_ext_v1_t>();
    let cda1 = sz::<guild_cuda_attn_ext_v1_t>();
    let cdm1 = sz::<guild_cuda_moe_ext_v1_t>();
    let cdmq = sz::<guild_cuda_qwen_group_v1_t>();
    let pfke = sz::<guild_prefill_kernel_ext_v1_t>();
    let cpe1_layout = "guild_cpu_expert_ext_v1_t";
    let cuda = "a CUDA kernel";
    let not_cuda = Some("backend 0x1 is not GUILD_BACKEND_CUDA");
    let experts = "a GUILD_OP_BATCHED_EXPERT_EXEC CPU kernel";
    let v2_after_q2 = 64 + 2 * 8;
    vec![
        // GOP1: one layout, three required callbacks, on GUILD_OP_CUSTOM kernels.
        (
            "gop1",
            "current",
            loaded(vec![copied("GOP1", 1, gop1, gop1, &[])]),
        ),
        (
            "gop1",
            "newer",
            loaded(vec![copied("GOP1", 1, gop1 + 16, gop1, &[])]),
        ),
        (
            "gop1",
            "too_small",
            refused(
                "gop1",
                C0,
                "GOP1",
                too_small(1, gop1 - 8, gop1, "guild_operation_ext_v1_t"),
            ),
        ),
        (
            "gop1",
            "version",
            refused("gop1", C0, "GOP1", unknown_version(2, &[1])),
        ),
        (
            "gop1",
            "wrong_tag",
            Outcome::RefusedText(
                "kernel test.ext_probe.gop1: GUILD_OP_CUSTOM kernels need a GOP1 extension, and \
                 next_ext holds only [GOP9]"
                    .into(),
            ),
        ),
        (
            "gop1",
            "misplaced",
            refused(
                "gop1",
                C0,
                "GOP1",
                misplaced(
                    "a GUILD_OP_CUSTOM kernel",
                    Some("op_kind 0x10 is not GUILD_OP_CUSTOM"),
                ),
            ),
        ),
        ("gop1", "null", refused("gop1", C0, "GOP1", null("execute"))),
        ("gop1", "cycle", refused("gop1", C0, "GOP1", cycle(0))),
        // RMD1: one layout, three required callbacks, on runners.
        (
            "rmd1",
            "current",
            loaded(vec![copied("RMD1", 1, rmd1, rmd1, &[])]),
        ),
        (
            "rmd1",
            "newer",
            loaded(vec![copied("RMD1", 1, rmd1 + 16, rmd1, &[])]),
        ),
        (
            "rmd1",
            "too_small",
            refused(
                "rmd1",
                C0,
                "RMD1",
                too_small(1, rmd1 - 8, rmd1, "guild_runner_model_ext_v1_t"),
            ),
        ),
        (
            "rmd1",
            "version",
            refused("rmd1", C0, "RMD1", unknown_version(2, &[1])),
        ),
        ("rmd1", "wrong_tag", skipped("RMD9")),
        (
            "rmd1",
            "misplaced",
            refused_kernel("rmd1", C0, "RMD1", misplaced("a runner descriptor", None)),
        ),
        (
            "rmd1",
            "null",
            refused("rmd1", C0, "RMD1", null("validate_numerics")),
        ),
        ("rmd1", "cycle", refused("rmd1", C1, "RMD1", cycle(0))),
        // CPE1 version 1: four required callbacks, read as CPE1 only whatever its size.
        (
            "cpe1",
            "current",
            loaded(vec![copied("CPE1", 1, cpe1, cpe1, &V2_OPS)]),
        ),
        (
            "cpe1",
            "newer",
            loaded(vec![copied("CPE1", 1, cpu2, cpe1, &V2_OPS)]),
        ),
        (
            "cpe1",
            "too_small",
            refused(
                "cpe1",
                C0,
                "CPE1",
                too_small(1, cpe1 - 8, cpe1, cpe1_layout),
            ),
        ),
        (
            "cpe1",
            "version",
            refused("cpe1", C0, "CPE1", unknown_version(3, &[1, 2])),
        ),
        ("cpe1", "wrong_tag", skipped("CPE9")),
        (
            "cpe1",
            "misplaced",
            refused(
                "cpe1",
                C0,
                "CPE1",
                misplaced(
                    experts,
                    Some("op_kind 0x1 is not GUILD_OP_BATCHED_EXPERT_EXEC"),
                ),
            ),
        ),
        (
            "cpe1",
            "misplaced_backend",
            refused(
                "cpe1",
                C0,
                "CPE1",
                misplaced(experts, Some("backend 0x2 is not GUILD_BACKEND_CPU")),
            ),
        ),
        (
            "cpe1",
            "null",
            refused("cpe1", C0, "CPE1", null("gate_up_rows")),
        ),
        ("cpe1", "cycle", refused("cpe1", C0, "CPE1", cycle(0))),
        (
            "cpe1",
            "duplicate",
            refused("cpe1", C1, "CPE1", ExtensionProblem::Duplicate),
        ),
        // CPU backend v2: the CPE1 tag at version 2; appended callbacks optional, each present
        // only where struct_size covers it.
        (
            "cpu2",
            "current",
            loaded(vec![copied("CPE1", 2, cpu2, cpu2, &[])]),
        ),
        (
            "cpu2",
            "older",
            loaded(vec![copied(
                "CPE1",
                2,
                v2_after_q2,
                v2_after_q2,
                &V2_OPS[2..],
            )]),
        ),
        (
            "cpu2",
            "newer",
            loaded(vec![copied("CPE1", 2, cpu2 + 16, cpu2, &[])]),
        ),
        (
            "cpu2",
            "too_small",
            refused(
                "cpu2",
                C0,
                "CPE1",
                too_small(2, cpe1 - 8, cpe1, cpe1_layout),
            ),
        ),
        (
            "cpu2",
            "version",
            refused("cpu2", C0, "CPE1", unknown_version(3, &[1, 2])),
        ),
        ("cpu2", "wrong_tag", skipped("CPE9")),
        (
            "cpu2",
            "misplaced",
            refused(
                "cpu2",
                C0,
                "CPE1",
                misplaced(
                    experts,
                    Some("op_kind 0x1 is not GUILD_OP_BATCHED_EXPERT_EXEC"),
                ),
            ),
        ),
        (
            "cpu2",
            "null",
            refused("cpu2", C0, "CPE1", null("down_rows")),
        ),
        (
            "cpu2",
            "sparse",
            loaded(vec![copied("CPE1", 2, cpu2, cpu2, &["router_bf16"])]),
        ),
        ("cpu2", "cycle", refused("cpu2", C1, "CPE1", cycle(0))),
        // CDD1: every callback optional, at least one.
        (
            "cdd1",
            "current",
            loaded(vec![copied("CDD1", 1, cdd1, cdd1, &[])]),
        ),
        (
            "cdd1",
            "newer",
            loaded(vec![copied("CDD1", 1, cdd1 + 16, cdd1, &[])]),
        ),
        (
            "cdd1",
            "too_small",
            refused(
                "cdd1",
                C0,
                "CDD1",
                too_small(1, cdd1 - 8, cdd1, "guild_cuda_dense_ext_v1_t"),
            ),
        ),
        (
            "cdd1",
            "version",
            refused("cdd1", C0, "CDD1", unknown_version(2, &[1])),
        ),
        ("cdd1", "wrong_tag", skipped("CDD9")),
        (
            "cdd1",
            "misplaced",
            refused("cdd1", C0, "CDD1", misplaced(cuda, not_cuda)),
        ),
        (
            "cdd1",
            "null",
            refused(
                "cdd1",
                C0,
                "CDD1",
                ExtensionProblem::NoCallbacks {
                    callbacks: vec!["project".into(), "quantize_q8_1".into(), "mmvq".into()],
                },
            ),
        ),
        (
            "cdd1",
            "sparse",
            loaded(vec![copied(
                "CDD1",
                1,
                cdd1,
                cdd1,
                &["quantize_q8_1", "mmvq"],
            )]),
        ),
        ("cdd1", "cycle", refused("cdd1", C0, "CDD1", cycle(0))),
        // CDA1: configure and query_pools required, execution callbacks optional.
        (
            "cda1",
            "current",
            loaded(vec![copied("CDA1", 1, cda1, cda1, &[])]),
        ),
        (
            "cda1",
            "newer",
            loaded(vec![copied("CDA1", 1, cda1 + 16, cda1, &[])]),
        ),
        (
            "cda1",
            "too_small",
            refused(
                "cda1",
                C0,
                "CDA1",
                too_small(1, cda1 - 8, cda1, "guild_cuda_attn_ext_v1_t"),
            ),
        ),
        (
            "cda1",
            "version",
            refused("cda1", C0, "CDA1", unknown_version(2, &[1])),
        ),
        ("cda1", "wrong_tag", skipped("CDA9")),
        (
            "cda1",
            "misplaced",
            refused("cda1", C0, "CDA1", misplaced(cuda, not_cuda)),
        ),
        (
            "cda1",
            "null",
            refused("cda1", C0, "CDA1", null("query_pools")),
        ),
        (
            "cda1",
            "sparse",
            loaded(vec![copied(
                "CDA1",
                1,
                cda1,
                cda1,
                &[
                    "attention",
                    "gdn_update",
                    "rope",
                    "kv_append",
                    "kv_stream",
                    "qsa_select",
                ],
            )]),
        ),
        ("cda1", "cycle", refused("cda1", C1, "CDA1", cycle(0))),
        // CDM1: query_workspace required, the rest optional; an optional Qwen group behind its
        // own pointer and header.
        (
            "cdm1",
            "current",
            loaded(vec![copied("CDM1", 1, cdm1, cdm1, &[])]),
        ),
        (
            "cdm1",
            "newer",
            loaded(vec![copied("CDM1", 1, cdm1 + 16, cdm1, &[])]),
        ),
        (
            "cdm1",
            "too_small",
            refused(
                "cdm1",
                C0,
                "CDM1",
                too_small(1, cdm1 - 8, cdm1, "guild_cuda_moe_ext_v1_t"),
            ),
        ),
        (
            "cdm1",
            "version",
            refused("cdm1", C0, "CDM1", unknown_version(2, &[1])),
        ),
        ("cdm1", "wrong_tag", skipped("CDM9")),
        (
            "cdm1",
            "misplaced",
            refused("cdm1", C0, "CDM1", misplaced(cuda, not_cuda)),
        ),
        (
            "cdm1",
            "null",
            refused("cdm1", C0, "CDM1", null("query_workspace")),
        ),
        (
            "cdm1",
            "sparse",
            loaded(vec![copied(
                "CDM1",
                1,
                cdm1,
                cdm1,
                &[
                    "route",
                    "shared_expert",
                    "grouped_experts",
                    "s_gemv",
                    "s_dequant",
                    "quantize",
                    "elementwise",
                    "doorbell",
                    "sample",
                    "spec_verify",
                ],
            )]),
        ),
        ("cdm1", "cycle", refused("cdm1", C0, "CDM1", cycle(0))),
        (
            "cdm1",
            "qwen",
            loaded(vec![
                copied("CDM1", 1, cdm1, cdm1, &[]),
                copied("CDMQ", 1, cdmq, cdmq, &["fused_gr", "ple"]),
            ]),
        ),
        (
            "cdm1",
            "qwen_wrong_tag",
            refused(
                "cdm1",
                ExtensionSite::QwenGroup(0),
                "CDM9",
                ExtensionProblem::WrongTag {
                    expected: ExtensionTag::from_chars(*b"CDMQ"),
                },
            ),
        ),
        (
            "cdm1",
            "qwen_too_small",
            refused(
                "cdm1",
                ExtensionSite::QwenGroup(0),
                "CDMQ",
                too_small(1, cdmq - 8, cdmq, "guild_cuda_qwen_group_v1_t"),
            ),
        ),
        (
            "cdm1",
            "qwen_version",
            refused(
                "cdm1",
                ExtensionSite::QwenGroup(0),
                "CDMQ",
                unknown_version(2, &[1]),
            ),
        ),
        // PFKE: its own 12-byte header, reached through kernel_fns, never through the chain.
        (
            "pfke",
            "current",
            loaded(vec![copied("PFKE", 1, pfke, pfke, &[])]),
        ),
        (
            "pfke",
            "newer",
            loaded(vec![copied("PFKE", 1, pfke + 16, pfke, &[])]),
        ),
        (
            "pfke",
            "too_small",
            refused(
                "pfke",
                KF,
                "PFKE",
                too_small(1, pfke - 8, pfke, "guild_prefill_kernel_ext_v1_t"),
            ),
        ),
        (
            "pfke",
            "version",
            refused("pfke", KF, "PFKE", unknown_version(2, &[1])),
        ),
        (
            "pfke",
            "wrong_tag",
            refused(
                "pfke",
                KF,
                "PFK9",
                ExtensionProblem::WrongTag {
                    expected: ExtensionTag::from_chars(*b"PFKE"),
                },
            ),
        ),
        (
            "pfke",
            "misplaced",
            refused(
                "pfke",
                C0,
                "PFKE",
                ExtensionProblem::NotAChainExtension {
                    reached_through: "kernel_fns".into(),
                },
            ),
        ),
        (
            "pfke",
            "null",
            refused(
                "pfke",
                KF,
                "PFKE",
                ExtensionProblem::NoCallbacks {
                    callbacks: vec!["gdn_ab".into(), "router_projection".into()],
                },
            ),
        ),
        // Several extensions on one CUDA kernel, with an unknown tag among them.
        (
            "cuda",
            "all",
            Outcome::Loaded {
                copies: vec![
                    copied("CDD1", 1, cdd1, cdd1, &[]),
                    copied("CDA1", 1, cda1, cda1, &[]),
                    copied("CDM1", 1, cdm1, cdm1, &[]),
                    copied("CDMQ", 1, cdmq, cdmq, &["fused_gr", "ple"]),
                ],
                skipped: vec!["XYZ1".into()],
            },
        ),
    ]
}

#[test]
fn every_extension_case_has_its_exact_outcome() {
    let cases = cases();
    let mut failures = Vec::new();
    for (ext, case, want) in &cases {
        let got = outcome(ext, case);
        if &got != want {
            failures.push(format!("{ext}/{case}:\n   got {got:?}\n  want {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(cases.len(), 75, "the table's size, as reported");
}

/// The text of a typed refusal names the kernel or runner, the extension and what was wrong,
/// and a refusal is reported to the plugin with the same text.
#[test]
fn refusals_read_as_one_line_naming_registrant_tag_and_problem() {
    let texts: Vec<String> = [
        ("cpe1", "too_small"),
        ("cpu2", "version"),
        ("rmd1", "cycle"),
        ("cdd1", "null"),
        ("cda1", "misplaced"),
        ("cdm1", "qwen_wrong_tag"),
        ("pfke", "misplaced"),
    ]
    .iter()
    .map(|(ext, case)| match load(ext, case) {
        Err(kind @ LoadErrorKind::ExtensionRefused { .. }) => kind.to_string(),
        other => panic!("{ext}/{case}: {other:?}"),
    })
    .collect();
    assert_eq!(
        texts,
        [
            "registration refused: kernel test.ext_probe.cpe1: extension 0 (CPE1) declares \
             struct_size 56, smaller than the 64 bytes of guild_cpu_expert_ext_v1_t",
            "registration refused: kernel test.ext_probe.cpu2: extension 0 (CPE1) has version 3; \
             this host reads versions 1 and 2",
            "registration refused: runner test.ext_probe.rmd1: the next_ext chain has a cycle: \
             extension 1 (RMD1) links back to extension 0",
            "registration refused: kernel test.ext_probe.cdd1: extension 0 (CDD1) offers none of \
             its callbacks (project, quantize_q8_1, mmvq); CDD1 needs at least one",
            "registration refused: kernel test.ext_probe.cda1: extension 0 is CDA1, but backend \
             0x1 is not GUILD_BACKEND_CUDA",
            "registration refused: kernel test.ext_probe.cdm1: the qwen group of extension 0 \
             (CDM1) has tag CDM9, not CDMQ",
            "registration refused: kernel test.ext_probe.pfke: extension 0 has the PFKE tag, but \
             PFKE is reached through kernel_fns and is not a next_ext extension",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Calls through the copies
// ---------------------------------------------------------------------------------------------

fn error_record() -> guild_error_info_t {
    guild_error_info_t::new()
}

#[test]
fn cpe1_quantize_activation_is_reached_through_the_copy() {
    let plugin = load("cpe1", "current").expect("loads");
    let copy = kernel(&plugin).cpu_backend().expect("CPE1 copied");
    assert!(!copy.has_v2_ops());
    let table = copy.cpe1();
    let quantize = table.quantize_activation.expect("required");
    let mut format: guild_cpu_expert_format_v1_t =
        // SAFETY: a plain-integer struct, for which zero bytes are valid.
        unsafe { std::mem::zeroed() };
    format.struct_size = sz::<guild_cpu_expert_format_v1_t>();
    format.hidden_size = 4;
    format.activation_row_bytes = 8;
    let src: [f32; 4] = [1.0, -0.5, 0.25, 2.0];
    let mut dst = [0u8; 8];
    let args = guild_cpu_expert_quantize_activation_args_v1_t {
        struct_size: sz::<guild_cpu_expert_quantize_activation_args_v1_t>(),
        src_dtype: GUILD_DTYPE_F32,
        row_count: 1,
        format: &format,
        src: src.as_ptr().cast(),
        src_row_stride_bytes: 16,
        dst: dst.as_mut_ptr().cast(),
        dst_row_stride_bytes: 8,
    };
    let mut error = error_record();
    // SAFETY: the callback comes from the copy of a plugin that `plugin` keeps loaded; every
    // pointer in args leads to a live local of the size the args declare.
    let status = unsafe { quantize(table.user_data, &args, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK, "{}", guild_text(&error.message));
    let d = f32::from_ne_bytes(dst[..4].try_into().expect("four bytes"));
    assert_eq!(d, 2.0 / 127.0);
    let quants: Vec<i8> = dst[4..].iter().map(|&b| b as i8).collect();
    // 1/d = 63.5 and -0.5/d = -31.75 round away from zero; 2/d = 127.
    assert_eq!(quants, [64, -32, 16, 127]);
}

#[test]
fn a_v1_table_does_not_lend_the_bytes_past_its_layout() {
    // The plugin wrote a whole v2 table, router included, but declared version 1.
    let plugin = load("cpe1", "newer").expect("loads");
    let copy = kernel(&plugin).cpu_backend().expect("CPE1 copied");
    assert!(!copy.has_v2_ops());
    assert!(copy.table().router_bf16.is_none());
    assert_eq!(
        copy.table().header.struct_size,
        sz::<guild_cpu_expert_ext_v1_t>()
    );
}

#[test]
fn cpu_backend_v2_router_top_k_is_reached_through_the_copy() {
    let plugin = load("cpu2", "current").expect("loads");
    let copy = kernel(&plugin).cpu_backend().expect("CPU backend copied");
    assert!(copy.has_v2_ops());
    let table = copy.table();
    let router = table.router_bf16.expect("offered");
    // BF16 bit patterns of the rows [1, 0], [0, 1], [1, 1], [-1, 0].
    let weights: [u16; 8] = [0x3f80, 0, 0, 0x3f80, 0x3f80, 0x3f80, 0xbf80, 0];
    let input: [f32; 2] = [1.0, 2.0];
    let mut logits = [0f32; 4];
    let mut ids = [0i32; 2];
    let mut expert_weights = [0f32; 2];
    let args = guild_cpu_router_args_v1_t {
        struct_size: sz::<guild_cpu_router_args_v1_t>(),
        input_dtype: GUILD_DTYPE_F32,
        gating: GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX,
        flags: 0,
        token_count: 1,
        expert_count: 4,
        top_k: 2,
        weight_scale: 1.0,
        hidden_size: 2,
        input: input.as_ptr().cast(),
        input_row_stride_bytes: 8,
        router_weights: weights.as_ptr(),
        router_row_stride_bytes: 4,
        selection_bias: ptr::null(),
        logits: logits.as_mut_ptr(),
        expert_ids: ids.as_mut_ptr(),
        expert_weights: expert_weights.as_mut_ptr(),
    };
    let mut error = error_record();
    // SAFETY: as in the CPE1 test; every buffer matches the counts in args.
    let status = unsafe { router(table.user_data, &args, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK, "{}", guild_text(&error.message));
    assert_eq!(logits, [1.0, 2.0, 3.0, -1.0]);
    assert_eq!(ids, [2, 1]);
    let e = std::f32::consts::E;
    let expected = [e / (e + 1.0), 1.0 / (e + 1.0)];
    for (got, want) in expert_weights.iter().zip(expected) {
        assert!(
            (got - want).abs() < 1e-6,
            "{expert_weights:?} vs {expected:?}"
        );
    }
}

#[test]
fn gop1_query_scratch_is_reached_through_the_copy() {
    let plugin = load("gop1", "newer").expect("loads");
    let op = kernel(&plugin).operation().expect("GOP1 copied");
    // The probe's query_scratch counts tensors; their contents do not matter to it.
    let tensor = guild_tensor_desc_v1_t {
        dtype: GUILD_DTYPE_F32,
        rank: 1,
        dims: [4, 0, 0, 0, 0, 0, 0, 0],
        strides: [4, 0, 0, 0, 0, 0, 0, 0],
        memory_space: GUILD_MEMORY_HOST,
        device_id: 0,
        data: ptr::null_mut(),
    };
    let query = host_query(c"test.ext_probe.operation", &[tensor, tensor], &[tensor]);
    let mut scratch = guild_scratch_request_v1_t {
        struct_size: sz::<guild_scratch_request_v1_t>(),
        alignment: 0,
        host_bytes: 0,
        device_bytes: 0,
    };
    let mut error = error_record();
    let query_scratch = op.query_scratch.expect("required");
    // SAFETY: the copy's callback, its plugin loaded; query and scratch are live locals.
    let status = unsafe { query_scratch(op.user_data, &query, &mut scratch, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK, "{}", guild_text(&error.message));
    assert_eq!((scratch.alignment, scratch.host_bytes), (16, 64 * 2 + 8));
}

#[test]
fn rmd1_recognize_is_reached_through_the_copy() {
    let plugin = load("rmd1", "current").expect("loads");
    let model = runner(&plugin).model().expect("RMD1 copied");
    assert_eq!(runner(&plugin).selection_priority(), 7);
    let recognize = model.recognize.expect("required");
    let mut error = error_record();
    // SAFETY: the copy's callback, its plugin loaded; a NULL model is answered, not read.
    let status = unsafe { recognize(model.user_data, ptr::null(), &mut error) };
    assert_eq!(
        (status, guild_text(&error.message)),
        (
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            "rmd1 recognize needs a model".to_owned()
        )
    );
}

#[test]
fn cdd1_project_is_reached_through_the_copy() {
    let plugin = load("cdd1", "sparse").expect("loads");
    let copy = kernel(&plugin).cuda_dense().expect("CDD1 copied");
    assert!(copy.offers("project") && !copy.offers("mmvq"));
    let table = copy.table();
    let weights: [f32; 6] = [1.0, 2.0, 3.0, -1.0, 0.5, 0.0];
    let input: [f32; 3] = [1.0, 1.0, 2.0];
    let bias: [f32; 2] = [0.5, -0.5];
    let mut output = [0f32; 2];
    let args = guild_cuda_dense_project_args_v1_t {
        struct_size: sz::<guild_cuda_dense_project_args_v1_t>(),
        weight_dtype: GUILD_DTYPE_F32,
        input_dtype: GUILD_DTYPE_F32,
        output_dtype: GUILD_DTYPE_F32,
        flags: 0,
        reserved0: 0,
        geometry: guild_cuda_dense_geometry_v1_t {
            rows: 2,
            cols: 3,
            tokens: 1,
        },
        strides: guild_cuda_dense_strides_v1_t {
            weight_row_stride_bytes: 12,
            input_row_stride_bytes: 12,
            output_row_stride_bytes: 8,
        },
        selection: guild_cuda_row_selection_v1_t {
            rows: ptr::null(),
            count: 0,
            reserved: 0,
        },
        weights: weights.as_ptr().cast(),
        input: input.as_ptr().cast(),
        bias: bias.as_ptr(),
        output: output.as_mut_ptr().cast(),
        stream: ptr::null_mut(),
        device_id: 0,
        reserved1: 0,
    };
    let mut error = error_record();
    let project = table.project.expect("offered");
    // SAFETY: the copy's callback, its plugin loaded; the probe computes on the host, and
    // every buffer is a live local matching the geometry.
    let status = unsafe { project(table.user_data, &args, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK, "{}", guild_text(&error.message));
    assert_eq!(output, [1.0 + 2.0 + 6.0 + 0.5, -1.0 + 0.5 - 0.5]);
}

#[test]
fn cda1_configure_is_reached_through_the_copy() {
    let plugin = load("cda1", "current").expect("loads");
    let table = kernel(&plugin).cuda_attn().expect("CDA1 copied").table();
    let configure = table.configure.expect("required");
    let answer = |value: i64| {
        let args = guild_cuda_attn_config_args_v1_t {
            struct_size: sz::<guild_cuda_attn_config_args_v1_t>(),
            value_kind: GUILD_CUDA_CONFIG_VALUE_INT,
            key: c"cda1.attn.max_splits".as_ptr(),
            int_value: value,
            float_value: 0.0,
            text_value: ptr::null(),
        };
        let mut error = error_record();
        // SAFETY: the copy's callback, its plugin loaded; args and its key are live.
        let status = unsafe { configure(table.user_data, &args, &mut error) };
        (status, guild_text(&error.message))
    };
    assert_eq!(answer(4), (GUILD_STATUS_OK, String::new()));
    assert_eq!(
        answer(6),
        (
            GUILD_STATUS_ERR_INVALID_ARGUMENT,
            "max_splits must be a power of two in 1..=64".to_owned()
        )
    );
}

#[test]
fn cdm1_query_workspace_and_the_qwen_cvec_are_reached_through_the_copies() {
    let plugin = load("cdm1", "qwen").expect("loads");
    let owned = kernel(&plugin);
    let moe = owned.cuda_moe().expect("CDM1 copied").table();
    let qwen = owned.cuda_qwen().expect("CDMQ copied");
    assert_eq!(
        moe.qwen,
        qwen.as_ptr(),
        "the CDM1 copy points at the group's copy"
    );
    assert!(qwen.table().header.next.is_null());

    // SAFETY: a plain struct of integers, floats and pointers, for which zero is valid.
    let mut route: guild_cuda_moe_route_args_v1_t = unsafe { std::mem::zeroed() };
    route.struct_size = sz::<guild_cuda_moe_route_args_v1_t>();
    route.token_count = 3;
    route.expert_count = 8;
    let mut bytes = 0u64;
    let query = guild_cuda_moe_workspace_query_args_v1_t {
        struct_size: sz::<guild_cuda_moe_workspace_query_args_v1_t>(),
        operation: GUILD_CUDA_MOE_OP_ROUTE,
        op_args: ptr::from_ref(&route).cast::<c_void>(),
        workspace_bytes_out: &mut bytes,
    };
    let mut error = error_record();
    let query_workspace = moe.query_workspace.expect("required");
    // SAFETY: the copy's callback, its plugin loaded; query and route are live locals.
    let status = unsafe { query_workspace(moe.user_data, &query, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK, "{}", guild_text(&error.message));
    assert_eq!(bytes, 3 * 8 * 4);

    let vector: [f32; 3] = [1.0, -2.0, 0.5];
    let mut hidden: [f32; 6] = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0];
    let args = guild_cuda_qwen_cvec_args_v1_t {
        struct_size: sz::<guild_cuda_qwen_cvec_args_v1_t>(),
        io_dtype: GUILD_DTYPE_F32,
        layer_index: 0,
        token_count: 2,
        hidden_size: 3,
        strength: 2.0,
        reserved0: 0,
        vector: vector.as_ptr(),
        hidden: hidden.as_mut_ptr().cast(),
        hidden_row_stride_bytes: 12,
        stream: ptr::null_mut(),
        device_id: 0,
        reserved1: 0,
    };
    let group = qwen.table();
    let cvec = group.cvec.expect("offered");
    // SAFETY: the group copy's callback, its plugin loaded; the probe computes on the host
    // over the live local rows.
    let status = unsafe { cvec(group.user_data, &args, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK, "{}", guild_text(&error.message));
    assert_eq!(hidden, [2.0, -4.0, 1.0, 3.0, -3.0, 2.0]);
}

#[test]
fn pfke_router_projection_is_reached_through_the_copy() {
    let plugin = load("pfke", "newer").expect("loads");
    let owned = kernel(&plugin);
    let table = owned.prefill().expect("PFKE copied");
    assert_eq!(owned.descriptor().kernel_fns, ptr::from_ref(table).cast());
    let hidden: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
    let weight: [f32; 6] = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
    let mut logits = [0f32; 6];
    // SAFETY: a plain struct of integers and pointers, for which zero is valid.
    let mut args: guild_prefill_router_args_v1_t = unsafe { std::mem::zeroed() };
    args.struct_size = sz::<guild_prefill_router_args_v1_t>();
    args.n_tokens = 2;
    args.n_embd = 2;
    args.n_experts = 3;
    args.hidden_dtype = GUILD_DTYPE_F32;
    args.weight_dtype = GUILD_DTYPE_F32;
    args.hidden_row_stride = 2;
    args.logits_row_stride = 3;
    args.hidden = hidden.as_ptr().cast();
    args.weight = weight.as_ptr().cast();
    args.logits = logits.as_mut_ptr();
    let mut error = error_record();
    let project = table.router_projection.expect("offered");
    // SAFETY: the copy's callback, its plugin loaded; PFKE callbacks get the descriptor's
    // user_data; every buffer is a live local matching the counts.
    let status = unsafe { project(owned.descriptor().user_data, &args, &mut error) };
    assert_eq!(status, GUILD_STATUS_OK, "{}", guild_text(&error.message));
    assert_eq!(logits, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
}

/// A kernel with CDD1, an unknown tag, CDA1 and CDM1 (and its Qwen group): the copied chain
/// holds the three copies in the plugin's order, without the unknown one.
#[test]
fn copies_of_several_extensions_are_linked_in_chain_order() {
    let plugin = load("cuda", "all").expect("loads");
    let owned = kernel(&plugin);
    let dense = owned.cuda_dense().expect("CDD1");
    let attn = owned.cuda_attn().expect("CDA1");
    let moe = owned.cuda_moe().expect("CDM1");
    let as_header = |p: *const c_void| p.cast::<guild_ext_header_t>();
    assert_eq!(
        owned.descriptor().next_ext,
        as_header(dense.as_ptr().cast())
    );
    assert_eq!(dense.table().header.next, as_header(attn.as_ptr().cast()));
    assert_eq!(attn.table().header.next, as_header(moe.as_ptr().cast()));
    assert!(moe.table().header.next.is_null());
    assert_eq!(moe.table().qwen, owned.cuda_qwen().expect("CDMQ").as_ptr());
}
