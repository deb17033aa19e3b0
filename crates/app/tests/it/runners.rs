//! Runner selection through RMD1 over the real C test runners (test-plugins/runner_llama and
//! runner_hybrid, installed as signed gkernels and loaded with dlopen) and in-memory models:
//! priority order, a disabled runner, mappings outside the supported contract, a model no
//! runner recognises, numerical validation, and a bound model holding its runner's package until
//! it is dropped. The C model reader's own rules are tested in `reader`, the description
//! contract's rules one by one in `contract`.

mod contract;
mod reader;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use guild_abi::{GUILD_PREFILL_BATCHED, GUILD_PREFILL_CHUNKED, GUILD_ROPE_TYPE_NORMAL};
use guild_domain::ids::{PackageId, RunnerId};
use guild_domain::lease::{Leased, QuiescentAction};
use guild_host::models::{
    DescriptionError, LayerKind, PluginReason, RunnerRefusal, RunnerVerdict, TensorRoleKind,
};
use guild_host::operations::DeviceSupport;
use guild_host::{BoundModel, HostError, SelectError, SelectFileError};
use guild_ports::fakes::FakeModel;
use guild_ports::model::{MetaArray, MetaValue};
use guild_test_support::plugins::plugin_library;
use guild_test_support::Spec;

use crate::operations::{fixture_with, Fixture};

const F32: u32 = guild_abi::GUILD_DTYPE_F32;

/// One test runner: its package, the library it is built as, and the runner id it registers.
#[derive(Debug, Clone, Copy)]
struct Runner {
    package: &'static str,
    library: &'static str,
    id: &'static str,
    priority: i32,
}

const LLAMA: Runner = Runner {
    package: "test.runners.llama",
    library: "runner_llama",
    id: "test.runner.llama",
    priority: 20,
};
const LLAMA_LOW: Runner = Runner {
    package: "test.runners.llama_low",
    library: "runner_llama_low",
    id: "test.runner.llama_low",
    priority: 10,
};
const LLAMA_BROKEN: Runner = Runner {
    package: "test.runners.llama_broken",
    library: "runner_llama_broken",
    id: "test.runner.llama_broken",
    priority: 30,
};
const HYBRID: Runner = Runner {
    package: "test.runners.hybrid",
    library: "runner_hybrid",
    id: "test.runner.hybrid",
    priority: 20,
};
const HYBRID_BAD: Runner = Runner {
    package: "test.runners.hybrid_bad",
    library: "runner_hybrid_bad",
    id: "test.runner.hybrid_bad",
    priority: 30,
};

impl Runner {
    fn spec(self) -> Spec {
        let mut spec = Spec::kernel(self.package, "1.0.0")
            .library(&plugin_library(self.library))
            .runner(self.id);
        // A runner-only plugin registers no kernel, and the manifest must say so.
        spec.provided_ops = Vec::new();
        spec
    }

    fn package_id(self) -> PackageId {
        PackageId::new(self.package).unwrap()
    }

    fn runner_id(self) -> RunnerId {
        RunnerId::new(self.id).unwrap()
    }

    /// The verdict this runner gets with `refusal`.
    fn verdict(self, refusal: RunnerRefusal) -> RunnerVerdict {
        RunnerVerdict {
            runner_id: self.runner_id(),
            package: self.package_id(),
            priority: self.priority,
            refusal,
        }
    }

    /// This runner's `ERR_UNSUPPORTED` answer with `message`.
    fn unsupported(self, message: &str) -> PluginReason {
        PluginReason {
            status: guild_abi::GUILD_STATUS_ERR_UNSUPPORTED,
            component: self.id.to_owned(),
            message: message.to_owned(),
        }
    }
}

fn fixture(runners: &[Runner]) -> Fixture {
    let specs: Vec<Spec> = runners.iter().map(|r| r.spec()).collect();
    fixture_with(&specs, DeviceSupport::host())
}

fn strings(values: &[&str]) -> MetaValue {
    MetaValue::Array(MetaArray::Strings(
        values.iter().map(|s| (*s).to_owned()).collect(),
    ))
}

/// A llama model of `n_layers` layers, `n_embd` wide with `n_heads` query heads (one key/value
/// head) and a five-token vocabulary, whose runner instances log to `marker`.
fn llama_model(marker: &Path, n_layers: u32, n_embd: u64, n_heads: u32) -> FakeModel {
    let (ff, vocab, kv) = (16, 5, n_embd / u64::from(n_heads));
    let mut model = FakeModel::new("/models/tiny-llama.gguf")
        .with_meta("general.architecture", MetaValue::Str("llama".into()))
        .with_meta("llama.block_count", MetaValue::U32(n_layers))
        .with_meta("llama.embedding_length", MetaValue::U32(n_embd as u32))
        .with_meta("llama.feed_forward_length", MetaValue::U32(ff as u32))
        .with_meta("llama.attention.head_count", MetaValue::U32(n_heads))
        .with_meta("llama.attention.head_count_kv", MetaValue::U32(1))
        .with_meta("llama.context_length", MetaValue::U64(128))
        .with_meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .with_meta(
            "tokenizer.ggml.tokens",
            strings(&["<s>", "a", "b", "c", "</s>"]),
        )
        .with_meta(
            "test.marker_path",
            MetaValue::Str(marker.display().to_string()),
        )
        .with_tensor("token_embd.weight", F32, &[n_embd, vocab])
        .with_tensor("output_norm.weight", F32, &[n_embd])
        .with_tensor("output.weight", F32, &[n_embd, vocab]);
    for layer in 0..n_layers {
        let t = |name: &str| format!("blk.{layer}.{name}.weight");
        model = model
            .with_tensor(&t("attn_norm"), F32, &[n_embd])
            .with_tensor(&t("attn_q"), F32, &[n_embd, n_embd])
            .with_tensor(&t("attn_k"), F32, &[n_embd, kv])
            .with_tensor(&t("attn_v"), F32, &[n_embd, kv])
            .with_tensor(&t("attn_output"), F32, &[n_embd, n_embd])
            .with_tensor(&t("ffn_norm"), F32, &[n_embd])
            .with_tensor(&t("ffn_gate"), F32, &[n_embd, ff])
            .with_tensor(&t("ffn_up"), F32, &[n_embd, ff])
            .with_tensor(&t("ffn_down"), F32, &[ff, n_embd]);
    }
    model
}

/// A qwen3next-style periodic hybrid: `n_layers` layers, full attention every `interval`-th,
/// four experts (two used) and a shared expert in every layer.
fn hybrid_model(marker: &Path, n_layers: u32, interval: u32) -> FakeModel {
    let key = |k: &str| format!("qwen3next.{k}");
    let mut model = FakeModel::new("/models/tiny-hybrid.gguf")
        .with_meta("general.architecture", MetaValue::Str("qwen3next".into()))
        .with_meta(
            "test.marker_path",
            MetaValue::Str(marker.display().to_string()),
        );
    for (k, v) in [
        ("block_count", n_layers),
        ("embedding_length", 16),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 8),
        ("attention.value_length", 8),
        ("context_length", 256),
        ("full_attention_interval", interval),
        ("ssm.conv_kernel", 4),
        ("ssm.state_size", 8),
        ("ssm.group_count", 2),
        ("ssm.time_step_rank", 4),
        ("ssm.inner_size", 32),
        ("expert_count", 4),
        ("expert_used_count", 2),
        ("expert_feed_forward_length", 8),
        ("expert_shared_feed_forward_length", 8),
        ("rope.dimension_count", 4),
    ] {
        model = model.with_meta(&key(k), MetaValue::U32(v));
    }
    model = model
        .with_meta("tokenizer.ggml.tokens", strings(&["a", "b", "c"]))
        .with_tensor("token_embd.weight", F32, &[16, 3])
        .with_tensor("output_norm.weight", F32, &[16])
        .with_tensor("output.weight", F32, &[16, 3]);
    for layer in 0..n_layers {
        let t = |name: &str| format!("blk.{layer}.{name}");
        let mut names = vec![
            "attn_norm.weight",
            "post_attention_norm.weight",
            "ffn_gate_inp.weight",
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "ffn_down_exps.weight",
            "ffn_gate_inp_shexp.weight",
            "ffn_gate_shexp.weight",
            "ffn_up_shexp.weight",
            "ffn_down_shexp.weight",
        ];
        if (layer + 1) % interval == 0 {
            names.extend([
                "attn_q.weight",
                "attn_k.weight",
                "attn_v.weight",
                "attn_output.weight",
                "attn_q_norm.weight",
                "attn_k_norm.weight",
            ]);
        } else {
            names.extend([
                "ssm_in.weight",
                "ssm_conv1d.weight",
                "ssm_a",
                "ssm_dt.bias",
                "ssm_ba.weight",
                "ssm_norm.weight",
                "ssm_out.weight",
            ]);
        }
        for name in names {
            model = model.with_tensor(&t(name), F32, &[16, 4]);
        }
    }
    model
}

/// The lines a model's runner instances wrote to `marker` ("create <id>", "destroy <id>").
fn events(marker: &Path) -> Vec<String> {
    match std::fs::read_to_string(marker) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("cannot read {}: {e}", marker.display()),
    }
}

fn marker(f: &Fixture, name: &str) -> PathBuf {
    f.shop.path().join(format!("{name}.events"))
}

fn select(f: &Fixture, model: FakeModel) -> Result<BoundModel, SelectError> {
    f.host.models().select(Arc::new(model))
}

fn no_runner(result: Result<BoundModel, SelectError>) -> (PathBuf, Vec<RunnerVerdict>) {
    match result {
        Err(SelectError::NoRunner { model, verdicts }) => (model, verdicts),
        Ok(bound) => panic!("expected no runner, {} was bound", bound.runner_id()),
        Err(other) => panic!("expected NoRunner, got {other}"),
    }
}

#[test]
fn the_higher_rmd1_priority_wins_and_its_description_is_copied() {
    let f = fixture(&[LLAMA_LOW, LLAMA]);
    let log = marker(&f, "llama");
    let bound = select(&f, llama_model(&log, 2, 8, 2)).unwrap();

    assert_eq!(bound.runner_id(), &LLAMA.runner_id());
    assert_eq!(bound.package(), &LLAMA.package_id());
    assert!(
        bound.passed_over().is_empty(),
        "the first runner asked took the model: {:?}",
        bound.passed_over()
    );
    // The descriptors' own priorities are the reverse (-20 and -10): RMD1's priority decided.
    let descriptor = bound.runner().descriptor().expect("a dlopen'ed runner");
    assert_eq!(
        (descriptor.priority, bound.binding().runner().priority),
        (-20, 20)
    );

    let d = bound.description();
    assert_eq!(d.architecture, "llama");
    assert_eq!(
        (d.n_layers, d.n_embd, d.n_ff, d.n_heads, d.n_kv_heads),
        (2, 8, 16, 2, 1)
    );
    assert_eq!((d.head_dim, d.head_dim_v, d.vocab_size), (4, 4, 5));
    assert_eq!((d.context_length, d.norm_eps), (128, 1e-5));
    assert_eq!((d.rope_type, d.rope_dims), (GUILD_ROPE_TYPE_NORMAL, 4));
    assert_eq!(d.rope_freq_base, 10000.0, "the runner's default");
    assert_eq!(d.prefill_strategy, GUILD_PREFILL_BATCHED);
    assert_eq!(d.full_attention_interval, 0);
    assert_eq!(d.layer_kind(1), LayerKind::Attention);
    // Four model-wide roles and nine per layer, each resolved to its tensor in the model.
    assert_eq!(d.roles.len(), 4 + 2 * 9);
    let tensors = bound.model().tensors();
    let k1 = d.role(TensorRoleKind::AttnK, Some(1)).unwrap();
    assert_eq!(k1.name, "blk.1.attn_k.weight");
    assert_eq!(tensors[k1.tensor.unwrap()].name, k1.name);
    assert!(!k1.optional);
    // rope_freqs is optional and this model lacks it: kept, marked absent.
    let freqs = d.role(TensorRoleKind::RopeFreqs, None).unwrap();
    assert_eq!((freqs.optional, freqs.tensor), (true, None));
    let output = d.role(TensorRoleKind::Output, None).unwrap();
    assert_eq!(tensors[output.tensor.unwrap()].name, "output.weight");

    // The C copy lives in host memory and says the same.
    let c = bound.c_description();
    assert_eq!((c.n_layers, c.n_embd, c.tensor_role_count), (2, 8, 22));
    // SAFETY: the host's copy holds tensor_role_count records whose names are NUL-terminated,
    // valid while `bound` lives.
    let (first, last) = unsafe {
        let roles = std::slice::from_raw_parts(c.tensor_roles, c.tensor_role_count);
        let name = |i: usize| std::ffi::CStr::from_ptr(roles[i].name).to_str().unwrap();
        (
            (roles[0].role, roles[0].layer, name(0)),
            (roles[21].layer, name(21)),
        )
    };
    assert_eq!(
        first,
        (TensorRoleKind::TokenEmbd.raw(), -1, "token_embd.weight")
    );
    assert_eq!(last, (1, "blk.1.ffn_down.weight"));

    assert_eq!(events(&log), ["create test.runner.llama"]);
    drop(bound);
    assert_eq!(
        events(&log),
        ["create test.runner.llama", "destroy test.runner.llama"]
    );
}

#[test]
fn with_the_higher_runner_disabled_the_lower_one_is_chosen() {
    let f = fixture(&[LLAMA, LLAMA_LOW]);
    let log = marker(&f, "llama");
    f.host.disable(&LLAMA.package_id()).unwrap();
    assert_eq!(f.loader.open_libraries(), 1, "the disabled runner unloaded");

    let bound = select(&f, llama_model(&log, 2, 8, 2)).unwrap();
    assert_eq!(bound.runner_id(), &LLAMA_LOW.runner_id());
    assert_eq!(bound.package(), &LLAMA_LOW.package_id());
    assert!(
        bound.passed_over().is_empty(),
        "a disabled runner is not asked: {:?}",
        bound.passed_over()
    );
    assert_eq!(bound.description().n_layers, 2);
    drop(bound);
    assert_eq!(
        events(&log),
        [
            "create test.runner.llama_low",
            "destroy test.runner.llama_low"
        ]
    );

    // Enabled again, it is preferred again.
    f.host.enable(&LLAMA.package_id()).unwrap();
    let bound = select(&f, llama_model(&log, 2, 8, 2)).unwrap();
    assert_eq!(bound.runner_id(), &LLAMA.runner_id());
}

#[test]
fn a_bound_model_keeps_its_runner_package_loaded_until_it_is_dropped() {
    let f = fixture(&[LLAMA, LLAMA_LOW]);
    let log = marker(&f, "llama");
    let pkg = LLAMA.package_id();
    let bound = select(&f, llama_model(&log, 1, 8, 2)).unwrap();

    // The bound model is the one lease on its runner's package; the runners only asked hold
    // nothing once selection returns.
    assert_eq!(f.host.active_package_leases(&pkg), 1);
    assert_eq!(f.host.active_package_leases(&LLAMA_LOW.package_id()), 0);
    let leased = |e: HostError, action| match e {
        HostError::Leased(Leased {
            id,
            action: a,
            bindings,
            ..
        }) => assert_eq!((id, a, bindings), (pkg.clone(), action, 1)),
        other => panic!("expected a lease refusal, got {other}"),
    };
    leased(f.host.disable(&pkg).unwrap_err(), QuiescentAction::Unload);
    leased(
        f.host.remove(&pkg, None).unwrap_err(),
        QuiescentAction::Remove,
    );
    assert_eq!(f.loader.open_libraries(), 2, "refusals close nothing");
    assert_eq!(events(&log), ["create test.runner.llama"]);

    // Disabling while bound waits for the bound model when asked to. Dropping it destroys the
    // instance (once), then releases the lease.
    std::thread::scope(|s| {
        let waiting = s.spawn(|| f.host.disable_waiting(&pkg, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiting.is_finished(), "disable went through while bound");
        drop(bound);
        assert_eq!(waiting.join().unwrap().unwrap().to_string(), "1.0.0");
    });
    assert_eq!(
        events(&log),
        ["create test.runner.llama", "destroy test.runner.llama"]
    );
    assert_eq!(f.host.active_package_leases(&pkg), 0);
    assert_eq!(f.loader.open_libraries(), 1, "the runner's library closed");
}

#[test]
fn an_unsupported_mapping_is_rejected_with_its_typed_reason() {
    let f = fixture(&[LLAMA_BROKEN]);
    let log = marker(&f, "broken");
    let (model, verdicts) = no_runner(select(&f, llama_model(&log, 2, 8, 2)));
    assert_eq!(model, Path::new("/models/tiny-llama.gguf"));
    assert_eq!(
        verdicts,
        [LLAMA_BROKEN.verdict(RunnerRefusal::Unsupported(
            DescriptionError::MissingTensor {
                role: TensorRoleKind::AttnK,
                layer: Some(0),
                name: "blk.0.attn_k_fused.weight".into(),
            }
        ))]
    );
    assert!(
        events(&log).is_empty(),
        "a rejected runner is never created"
    );
    assert_eq!(f.host.active_package_leases(&LLAMA_BROKEN.package_id()), 0);
}

#[test]
fn a_higher_runner_with_an_unsupported_mapping_is_passed_over_with_its_reason() {
    let f = fixture(&[LLAMA_BROKEN, LLAMA]);
    let log = marker(&f, "llama");
    let bound = select(&f, llama_model(&log, 2, 8, 2)).unwrap();
    assert_eq!(bound.runner_id(), &LLAMA.runner_id());
    assert_eq!(
        bound.passed_over(),
        [LLAMA_BROKEN.verdict(RunnerRefusal::Unsupported(
            DescriptionError::MissingTensor {
                role: TensorRoleKind::AttnK,
                layer: Some(0),
                name: "blk.0.attn_k_fused.weight".into(),
            }
        ))]
    );
    assert_eq!(events(&log), ["create test.runner.llama"]);
}

#[test]
fn a_model_no_runner_recognises_lists_every_runner_and_its_reason() {
    let f = fixture(&[LLAMA_LOW, HYBRID, LLAMA]);
    let log = marker(&f, "none");
    let mamba = llama_model(&log, 2, 8, 2)
        .with_meta("general.architecture", MetaValue::Str("mamba".into()));
    let err = select(&f, mamba).unwrap_err();
    // Descending priority, ties by runner id: hybrid (20) before llama (20), then llama_low.
    assert_eq!(
        err.verdicts(),
        [
            HYBRID.verdict(RunnerRefusal::NotRecognised(
                HYBRID.unsupported("architecture mamba is not qwen3next")
            )),
            LLAMA.verdict(RunnerRefusal::NotRecognised(
                LLAMA.unsupported("architecture mamba is not llama")
            )),
            LLAMA_LOW.verdict(RunnerRefusal::NotRecognised(
                LLAMA_LOW.unsupported("architecture mamba is not llama")
            )),
        ]
    );
    let text = err.to_string();
    assert!(
        text.starts_with("no enabled runner takes the model /models/tiny-llama.gguf: "),
        "{text}"
    );
    for id in [HYBRID.id, LLAMA.id, LLAMA_LOW.id] {
        assert!(text.contains(id), "{text} does not name {id}");
    }

    // Without general.architecture every runner says so.
    let anonymous = llama_model(&log, 2, 8, 2).without_meta("general.architecture");
    let (_, verdicts) = no_runner(select(&f, anonymous));
    let reasons: Vec<String> = verdicts.iter().map(|v| v.to_string()).collect();
    let expected: Vec<String> = [HYBRID, LLAMA, LLAMA_LOW]
        .iter()
        .map(|r| {
            format!(
                "{} (package {}, priority {}): it does not recognise the model: {}: the model \
                 has no general.architecture (GUILD_STATUS_ERR_UNSUPPORTED)",
                r.id, r.package, r.priority, r.id
            )
        })
        .collect();
    assert_eq!(reasons, expected);
    assert!(events(&log).is_empty());

    // With no runner enabled at all, the error says that.
    for r in [LLAMA_LOW, HYBRID, LLAMA] {
        f.host.disable(&r.package_id()).unwrap();
    }
    let err = select(&f, llama_model(&log, 2, 8, 2)).unwrap_err();
    assert!(err.verdicts().is_empty());
    assert!(err.to_string().ends_with(": no runner is enabled"), "{err}");
}

#[test]
fn a_runner_that_refuses_the_numerics_is_passed_over_with_its_reason() {
    let f = fixture(&[LLAMA, LLAMA_LOW]);
    let log = marker(&f, "numerics");
    // Ten wide with four heads: the description is within the contract, the numbers are not.
    let (_, verdicts) = no_runner(select(&f, llama_model(&log, 1, 10, 4)));
    assert_eq!(
        verdicts,
        [
            LLAMA.verdict(RunnerRefusal::NumericsRefused(
                LLAMA.unsupported("n_embd 10 is not a multiple of n_heads 4")
            )),
            LLAMA_LOW.verdict(RunnerRefusal::NumericsRefused(
                LLAMA_LOW.unsupported("n_embd 10 is not a multiple of n_heads 4")
            )),
        ]
    );

    // The runner checks shapes through the reader: a token table of the wrong width.
    let skewed = llama_model(&log, 1, 8, 2)
        .without_tensor("token_embd.weight")
        .with_tensor("token_embd.weight", F32, &[6, 5]);
    let (_, verdicts) = no_runner(select(&f, skewed));
    assert_eq!(
        verdicts[0],
        LLAMA.verdict(RunnerRefusal::NumericsRefused(LLAMA.unsupported(
            "token_embd.weight is [6, 5] (rank 2), not [n_embd 8, vocab 5]"
        )))
    );
    assert!(events(&log).is_empty());
}

#[test]
fn the_llama_runner_describes_real_gguf_conventions_and_refuses_what_it_cannot_run_naming_the_key()
{
    use guild_abi::{GUILD_ROPE_SCALING_LINEAR, GUILD_ROPE_SCALING_NONE};
    use guild_host::models::Stage;
    let f = fixture(&[LLAMA]);
    let log = marker(&f, "conventions");
    // One layer, 8 wide with 2 heads of 4: rope_freqs has 2 factors.
    let base = || llama_model(&log, 1, 8, 2);
    let text = |s: &str| MetaValue::Str(s.to_owned());

    // Tied embeddings, no freq_base, linear scaling by 4 and Llama 3 factors: described as
    // llama.cpp reads them, and the runner takes the model.
    let model = base()
        .without_tensor("output.weight")
        .with_meta("llama.rope.scaling.type", text("linear"))
        .with_meta("llama.rope.scaling.factor", MetaValue::F32(4.0))
        .with_tensor("rope_freqs.weight", F32, &[2]);
    let bound = select(&f, model).unwrap();
    let d = bound.description();
    assert_eq!(
        (d.rope_scaling_type, d.rope_freq_scale, d.rope_freq_base),
        (GUILD_ROPE_SCALING_LINEAR, 0.25, 10000.0)
    );
    assert_eq!((d.rope_dims, d.head_dim, d.n_experts), (4, 4, 0));
    assert_eq!(d.rope_orig_context, d.context_length);
    let output = d.role(TensorRoleKind::Output, None).unwrap();
    assert_eq!(
        (output.optional, output.tensor),
        (true, None),
        "tied: absent"
    );
    let freqs = d.role(TensorRoleKind::RopeFreqs, None).unwrap();
    assert!(freqs.tensor.is_some());
    drop(bound);

    // llama.cpp's reading of the scaling keys: a factor without a type is linear, the older
    // key counts, "none" never scales.
    for (model, scaling, scale) in [
        (
            base().with_meta("llama.rope.scaling.factor", MetaValue::F32(2.0)),
            GUILD_ROPE_SCALING_LINEAR,
            0.5,
        ),
        (
            base().with_meta("llama.rope.scale_linear", MetaValue::F32(8.0)),
            GUILD_ROPE_SCALING_LINEAR,
            0.125,
        ),
        (
            base()
                .with_meta("llama.rope.scaling.type", text("none"))
                .with_meta("llama.rope.scaling.factor", MetaValue::F32(8.0)),
            GUILD_ROPE_SCALING_NONE,
            1.0,
        ),
        (base(), GUILD_ROPE_SCALING_NONE, 1.0),
    ] {
        let bound = select(&f, model).unwrap();
        let d = bound.description();
        assert_eq!((d.rope_scaling_type, d.rope_freq_scale), (scaling, scale));
    }
    let created = events(&log).len();

    // What the runner cannot compute is refused at selection, naming the key, before any
    // instance exists (so before any token). Yarn and longrope descriptions are within the
    // host's contract (RMD1 has values for them): the refusal is the runner's numerics.
    let refused = |model: FakeModel| {
        let (_, verdicts) = no_runner(select(&f, model));
        assert_eq!(verdicts.len(), 1);
        verdicts.into_iter().next().unwrap().refusal
    };
    let numerics = |message: &str| RunnerRefusal::NumericsRefused(LLAMA.unsupported(message));
    let yarn = base()
        .with_meta("llama.rope.scaling.type", text("yarn"))
        .with_meta("llama.rope.scaling.factor", MetaValue::F32(4.0));
    assert_eq!(
        refused(yarn),
        numerics("llama.rope.scaling.type is yarn: this runner computes no scaling and linear scaling only")
    );
    assert_eq!(
        refused(base().with_meta("llama.rope.scaling.type", text("longrope"))),
        numerics(
            "llama.rope.scaling.type is longrope: this runner computes no scaling and linear scaling only"
        )
    );
    assert_eq!(
        refused(base().with_meta("llama.rope.scaling.type", text("llama3"))),
        RunnerRefusal::CallbackFailed {
            stage: Stage::Describe,
            reason: LLAMA.unsupported(
                "llama.rope.scaling.type is \"llama3\", a scaling RMD1 has no value for"
            ),
        }
    );
    assert_eq!(
        refused(base().without_meta("llama.attention.layer_norm_rms_epsilon")),
        RunnerRefusal::CallbackFailed {
            stage: Stage::Describe,
            reason: LLAMA.unsupported(
                "llama.attention.layer_norm_rms_epsilon is missing (llama.cpp has no default for \
                 llama)"
            ),
        }
    );
    assert_eq!(
        refused(base().with_meta("llama.rope.dimension_count", MetaValue::U32(2))),
        numerics(
            "llama.rope.dimension_count is 2, not the head size 4: this runner rotates whole heads"
        )
    );
    assert_eq!(
        refused(
            base()
                .with_meta("llama.expert_count", MetaValue::U32(8))
                .with_meta("llama.expert_used_count", MetaValue::U32(2))
        ),
        numerics("llama.expert_count is 8: this runner has no mixture of experts")
    );
    assert_eq!(
        refused(base().with_tensor("rope_freqs.weight", F32, &[4])),
        numerics("rope_freqs.weight has 4 factors (rank 1), not rope_dims / 2 = 2")
    );
    assert_eq!(
        events(&log).len(),
        created,
        "no refused model got an instance"
    );
}

#[test]
fn a_periodic_hybrid_is_bound_and_a_mapping_that_breaks_its_topology_is_rejected() {
    let f = fixture(&[HYBRID_BAD, HYBRID]);
    let log = marker(&f, "hybrid");
    // Eight layers, full attention on every fourth: layers 3 and 7.
    let bound = select(&f, hybrid_model(&log, 8, 4)).unwrap();
    assert_eq!(bound.runner_id(), &HYBRID.runner_id());
    assert_eq!(
        bound.passed_over(),
        [HYBRID_BAD.verdict(RunnerRefusal::Unsupported(
            DescriptionError::RoleOnWrongLayer {
                role: TensorRoleKind::AttnQkv,
                layer: 0,
                kind: LayerKind::Recurrent,
            }
        ))]
    );
    let d = bound.description();
    assert_eq!(d.architecture, "qwen3next");
    assert_eq!(d.full_attention_interval, 4);
    let kinds: Vec<LayerKind> = (0..d.n_layers).map(|l| d.layer_kind(l)).collect();
    use LayerKind::{Attention as A, Recurrent as R};
    assert_eq!(kinds, [R, R, R, A, R, R, R, A]);
    assert_eq!(
        (d.ssm_conv_kernel, d.ssm_state_size, d.ssm_inner_size),
        (4, 8, 32)
    );
    assert_eq!((d.n_experts, d.n_experts_used), (4, 2));
    assert_eq!(
        (d.prefill_strategy, d.prefill_chunk_tokens),
        (GUILD_PREFILL_CHUNKED, 64)
    );
    assert!(d.role(TensorRoleKind::SsmIn, Some(2)).is_some());
    assert!(d.role(TensorRoleKind::SsmIn, Some(3)).is_none());
    assert!(d.role(TensorRoleKind::AttnQ, Some(3)).is_some());
    drop(bound);
    assert_eq!(
        events(&log),
        ["create test.runner.hybrid", "destroy test.runner.hybrid"]
    );

    // A model whose recurrent layer lacks its convolution: both runners map it (the role is not
    // optional), and the host refuses both for the missing tensor.
    let gapped = hybrid_model(&log, 4, 4).without_tensor("blk.1.ssm_conv1d.weight");
    let (_, verdicts) = no_runner(select(&f, gapped));
    let missing = || {
        RunnerRefusal::Unsupported(DescriptionError::MissingTensor {
            role: TensorRoleKind::SsmConv1d,
            layer: Some(1),
            name: "blk.1.ssm_conv1d.weight".into(),
        })
    };
    assert_eq!(
        verdicts,
        [HYBRID_BAD.verdict(missing()), HYBRID.verdict(missing())]
    );
}

#[test]
fn tables_bound_for_a_model_keep_their_package_loaded_until_the_model_is_dropped() {
    let f = fixture_with(
        &[LLAMA.spec(), crate::experts::expert_ref_spec()],
        DeviceSupport::host(),
    );
    let log = marker(&f, "llama");
    let mut bound = select(&f, llama_model(&log, 1, 8, 2)).unwrap();
    let experts = PackageId::new("test.expert_ref").unwrap();
    let table = guild_domain::ids::ImplId::new("test.expert_ref.cpu").unwrap();
    bound.bind_expert_table(f.host.kernels(), &table).unwrap();
    assert_eq!(bound.expert_tables().len(), 1);
    assert_eq!(f.host.active_package_leases(&experts), 1);
    match f.host.disable(&experts).unwrap_err() {
        HostError::Leased(l) => assert_eq!((l.action, l.bindings), (QuiescentAction::Unload, 1)),
        other => panic!("expected a lease refusal, got {other}"),
    }
    let open = f.loader.open_libraries();

    // Dropping the model destroys the runner's instance, then releases the table and the runner.
    drop(bound);
    assert_eq!(
        events(&log),
        ["create test.runner.llama", "destroy test.runner.llama"]
    );
    assert_eq!(f.host.active_package_leases(&experts), 0);
    f.host.disable(&experts).unwrap();
    assert_eq!(
        f.loader.open_libraries(),
        open - 1,
        "the expert package closed"
    );
}

/// Writes `model` as a GGUF v3 file: the same keys, values and tensors, tensor data aligned to
/// 32 bytes. Small and separate from the reader under test (whose own tests read files written
/// by the gguf Python package).
fn write_gguf(model: &FakeModel, path: &Path) {
    use guild_ports::model::ModelFile;
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn value(out: &mut Vec<u8>, v: &MetaValue) {
        out.extend_from_slice(&v.type_code().to_le_bytes());
        match v {
            MetaValue::U8(x) => out.push(*x),
            MetaValue::I8(x) => out.push(*x as u8),
            MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::Bool(x) => out.push(u8::from(*x)),
            MetaValue::Str(s) => string(out, s),
            MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            MetaValue::Array(MetaArray::Strings(items)) => {
                out.extend_from_slice(&8u32.to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for s in items {
                    string(out, s);
                }
            }
            MetaValue::Array(other) => panic!("the test writer has no case for {other:?}"),
        }
    }
    let align = 32u64;
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(model.tensors().len() as u64).to_le_bytes());
    out.extend_from_slice(&(model.keys().len() as u64).to_le_bytes());
    for key in model.keys() {
        string(&mut out, key);
        value(&mut out, model.metadata(key).unwrap());
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for t in model.tensors() {
        string(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.dtype.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.size_bytes).div_ceil(align) * align;
    }
    out.resize(
        (out.len() as u64).div_ceil(align) as usize * align as usize,
        0,
    );
    let data_start = out.len() as u64;
    for (i, offset) in offsets.iter().enumerate() {
        out.resize((data_start + offset) as usize, 0);
        out.extend_from_slice(model.tensor_data(i).unwrap());
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn a_file_that_is_not_gguf_is_refused_before_any_runner_is_asked() {
    let f = fixture(&[LLAMA]);
    let path = f.shop.fresh("not-a-model.gguf");
    std::fs::write(&path, b"GGML but not really").unwrap();
    // A read error, not a selection error: no runner was asked.
    match f.host.models().select_file(&path).unwrap_err() {
        SelectFileError::Read(e) => assert_eq!(e.location, path),
        other => panic!("expected a read error, got {other}"),
    }
}

#[test]
fn a_gguf_file_on_disk_selects_and_binds_its_runner() {
    let f = fixture(&[LLAMA, LLAMA_LOW]);
    let log = marker(&f, "gguf");
    let path = f.shop.fresh("tiny-llama.gguf");
    write_gguf(&llama_model(&log, 2, 8, 2), &path);

    // The host's own GGUF reader: the runner names no adapter.
    let bound = f.host.open_model(&path).unwrap();
    assert_eq!(bound.model().tensors().len(), 3 + 2 * 9);
    assert_eq!(bound.runner_id().as_str(), LLAMA.id);
    assert_eq!(bound.description().n_layers, 2);
    assert_eq!(events(&log), ["create test.runner.llama"]);
    drop(bound);
    assert_eq!(
        events(&log),
        ["create test.runner.llama", "destroy test.runner.llama"]
    );
}
