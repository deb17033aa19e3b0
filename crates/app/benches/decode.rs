//! G19's workload: the tiny Llama of `examples/llama-decode/make_tiny_llama.py` (2 layers, hidden
//! 64, f32) decoded greedily, 6 prompt tokens and 16 decoded, with the `example.llama.*`
//! operations of test-plugins/llama_ops installed as a signed gkmodule and loaded with dlopen.
//! One run measures the same decode loop (`examples/llama-decode/src/lib.rs`, included by path)
//! two ways:
//! - through the operation service's Rust face (`OpHandle::execute`, and a reshape of the
//!   attention's handle before each token as its key/value length grows);
//! - calling the module's C `execute` directly, the function pointer and `user_data` bound from
//!   the GOP1 descriptor (the C service's `describe`), with the grown attention shape written
//!   into the caller's own tensor records (no service call at all).
//!
//! The summary gives tokens per second both ways, the service's overhead per token and per
//! operation call, and the calls per token; it is computed from the samples criterion took in
//! this run (medians). `cargo bench --bench decode` runs the full measurement; with `-- --test`
//! (or under `cargo test --benches`) each benchmark runs once. Needs the C plugins
//! (`cargo xtask plugins`) and python3 with the gguf and numpy packages.

#[path = "common/mod.rs"]
mod common;
#[path = "../../../examples/llama-decode/src/lib.rs"]
#[allow(dead_code)]
mod decode;
#[path = "common/direct_ops.rs"]
mod direct_ops;

use std::cell::Cell;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use guild_adapters_posix::DlopenLoader;
use guild_domain::operation::{DType, MemorySpace, TensorDesc};
use guild_host::ports::model::ModelFile;
use guild_host::{Host, InstallOptions, OperationService};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

use common::{median, recorded, show, Samples};
use decode::{generate, Config, Decoder, Ops, Reference, Service, Weights};
use direct_ops::Direct;

fn fixture(shop: &Workshop) -> Host {
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).expect("open store");
    trust(&pm, PUBLISHER, &k);
    let host = Host::new(pm, Box::new(DlopenLoader::new()));
    let mut spec = Spec::module("example.llama_ops", "1.0.0").library(&plugin_library("llama_ops"));
    spec.provided_ops = decode::MODULE_IMPLS.iter().map(|s| s.to_string()).collect();
    host.install(&shop.build(&spec, &k).archive, InstallOptions::default())
        .expect("install llama_ops");
    host
}

/// Writes the model and reference into `dir` with the example's script.
fn tiny_llama(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/llama-decode/make_tiny_llama.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "make_tiny_llama.py failed (the decode benchmark needs python3 with gguf and numpy):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Times `decodes` full decodes on fresh decoders (construction, which resolves every
/// operation once, is not timed); checks each against the reference.
fn timed<O: Ops>(
    ops: &O,
    model: &Arc<dyn ModelFile>,
    cfg: Config,
    reference: &Reference,
    decodes: u64,
) -> (Duration, decode::Counts) {
    let mut elapsed = Duration::ZERO;
    let mut counts = decode::Counts::default();
    for _ in 0..decodes {
        let weights = Weights::from_model(model, &cfg).expect("weights");
        let mut decoder = Decoder::new(cfg, weights, ops).expect("resolve");
        let start = Instant::now();
        let got =
            generate(&mut decoder, &reference.prompt, reference.tokens.len()).expect("decode");
        elapsed += start.elapsed();
        assert!(
            reference.compare(&got).matches(),
            "the decode left the reference"
        );
        counts = decoder.counts();
    }
    (elapsed, counts)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let samples = if full { 30 } else { 10 };
    let mut c = Criterion::default()
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(if full { 1000 } else { 100 }))
        .measurement_time(Duration::from_secs(if full { 5 } else { 1 }))
        .configure_from_args();

    let shop = Workshop::new();
    let host = fixture(&shop);
    let dir = shop.fresh("model");
    tiny_llama(&dir);
    let reference = Reference::read(&dir.join("tiny-llama.reference.json")).expect("reference");
    let model = host
        .models()
        .read_file(&dir.join("tiny-llama.gguf"))
        .expect("the host reads the model");
    let cfg = Config::from_model(model.as_ref()).expect("a llama");
    let service = Service::new(OperationService::new(host.kernels()));
    let direct = Direct::new(*host.kernels().operation_api());

    let service_t = Samples::default();
    let direct_t = Samples::default();
    let counts = Cell::new(decode::Counts::default());
    let mut g = c.benchmark_group("tiny_llama_decode");
    g.bench_function("module's execute, direct", |b| {
        recorded(b, &direct_t, |iters| {
            timed(&direct, &model, cfg, &reference, iters).0
        })
    });
    g.bench_function("operation service (Rust face)", |b| {
        recorded(b, &service_t, |iters| {
            let (t, n) = timed(&service, &model, cfg, &reference, iters);
            counts.set(n);
            t
        })
    });
    // What one re-bind costs on its own: the attention's handle reshaped for a cache one longer.
    let rebind_t = Samples::default();
    let attention = |len: u64| {
        let q = TensorDesc::new(
            DType::F32,
            &[cfg.head_dim as u64, cfg.n_head as u64],
            MemorySpace::Host,
        );
        let kv = TensorDesc::new(
            DType::F32,
            &[cfg.head_dim as u64, cfg.n_head_kv as u64, len],
            MemorySpace::Host,
        );
        ([q, kv, kv], [q])
    };
    let (i, o) = attention(1);
    let mut handle = service.resolve(decode::ATTENTION, &i, &o).expect("resolve");
    g.bench_function("attention re-bind through the service", |b| {
        recorded(b, &rebind_t, |iters| {
            let start = Instant::now();
            for n in 0..iters {
                let (i, o) = attention(2 + n % 32);
                service
                    .rebind(&mut handle, decode::ATTENTION, &i, &o)
                    .expect("rebind");
            }
            start.elapsed()
        })
    });
    drop(handle);
    g.finish();

    let counts = counts.get();
    let steps = counts.steps as f64;
    let per_token = |ns: Option<f64>| ns.map(|ns| ns / steps);
    let (d, s) = (
        per_token(median(&direct_t, samples)),
        per_token(median(&service_t, samples)),
    );
    let calls_per_token = counts.calls as f64 / steps;
    if full {
        println!(
            "\ntiny llama decode: medians of the {samples} samples each benchmark took in this run \
             (timings on a shared machine are noisy)"
        );
    } else {
        println!("\ntiny llama decode: test mode, one run each; the figures are not measurements");
    }
    println!(
        "{} forward passes per decode ({} prompt tokens, {} decoded), {calls_per_token:.2} \
         operation calls and {:.2} re-binds of the attention per token",
        counts.steps,
        reference.prompt.len(),
        reference.tokens.len(),
        counts.rebinds as f64 / steps
    );
    let tps = |ns: Option<f64>| ns.map_or("not run".into(), |ns| format!("{:.0}", 1e9 / ns));
    println!(
        "  {:<34}{:>12} per token {:>10} tokens/s",
        "module's execute, direct",
        show(d),
        tps(d)
    );
    println!(
        "  {:<34}{:>12} per token {:>10} tokens/s",
        "operation service (Rust face)",
        show(s),
        tps(s)
    );
    let rebinds_per_token = counts.rebinds as f64 / steps;
    let rebind = median(&rebind_t, samples);
    println!(
        "  {:<34}{:>12} per re-bind",
        "attention re-bind (a reshape)",
        show(rebind)
    );
    if let (Some(d), Some(s), Some(r)) = (d, s, rebind) {
        let execute_overhead = (s - d - rebinds_per_token * r) / calls_per_token;
        println!(
            "  service overhead: {} per token ({:.2}x direct): {} of re-binds and {} per \
             operation call for the rest",
            show(Some(s - d)),
            s / d,
            show(Some(rebinds_per_token * r)),
            show(Some(execute_overhead))
        );
    }
}
