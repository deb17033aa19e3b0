//! Load time of a plugin through `DlopenLoader` against a bare dlopen of the same library, in
//! the same run.
//!
//! Each sample of the loader path is one whole load and unload of `good_kernel`: dlopen, the
//! entry point, the descriptor checks, init with its staging session (two kernels and a runner,
//! each checked and copied with its extension chain), the judgement against the manifest's ids,
//! then dropping the plugin, which runs shutdown and dlclose. Each bare sample is
//! `dlopen(RTLD_NOW | RTLD_LOCAL)` + `dlclose` of the same file through libloading. The two are
//! interleaved sample by sample, so that drift in the machine's state hits both alike; the
//! medians and their ratio are printed.
//!
//! `cargo bench -p guild-adapters-posix --bench load` takes 2,000 samples of each
//! (`GUILD_BENCH_SAMPLES` overrides). Under `cargo test` the binary runs without `--bench` and
//! takes a handful, to prove it still works. The plugin comes from `GUILD_TEST_PLUGIN_DIR`, or
//! `target/test-plugins/lib` (`cargo xtask plugins` builds it).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::{ImplId, PackageId, RunnerId};
use guild_domain::version::{PackedVersion, Version};
use guild_ports::loader::{LoadRequest, PluginLoader};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let samples: usize = std::env::var("GUILD_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benchmarking { 2_000 } else { 5 });
    let warmup = if benchmarking { 200 } else { 1 };

    let library = plugin_path("good_kernel");
    let request = LoadRequest {
        package: PackageId::new("bench.good_kernel").expect("a valid package id"),
        version: Version::new(1, 0, 0),
        library: library.clone(),
        provided_ops: [
            "test.good_kernel.rms_norm_f32",
            "test.good_kernel.prefix_sum_f32",
        ]
        .into_iter()
        .map(|id| ImplId::new(id).expect("a valid impl id"))
        .collect(),
        provided_runners: vec![RunnerId::new("test.good_kernel.runner").expect("valid")],
        host_abi: PackedVersion::KERNEL_ABI_V1,
        operations: None,
    };
    let loader = DlopenLoader::new();

    let load = || {
        let start = Instant::now();
        let plugin = loader
            .load(&request)
            .unwrap_or_else(|e| panic!("good_kernel failed to load: {e}"));
        assert_eq!(plugin.kernels.len(), 2);
        drop(plugin);
        start.elapsed()
    };
    let bare = || {
        let start = Instant::now();
        // SAFETY: the test plugin is this repository's own C99 code with no initialisers;
        // opening it is the trust decision this benchmark makes.
        let handle = unsafe { Library::open(Some(&library), RTLD_NOW | RTLD_LOCAL) }
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", library.display()));
        handle.close().expect("dlclose");
        start.elapsed()
    };

    for _ in 0..warmup {
        load();
        bare();
    }
    let mut loads = Vec::with_capacity(samples);
    let mut bares = Vec::with_capacity(samples);
    for _ in 0..samples {
        loads.push(load());
        bares.push(bare());
    }
    assert_eq!(loader.open_libraries(), 0, "every load was unloaded");

    let (load_median, bare_median) = (median(&mut loads), median(&mut bares));
    let ratio = load_median.as_secs_f64() / bare_median.as_secs_f64().max(f64::MIN_POSITIVE);
    println!("plugin load time of good_kernel, medians of {samples} interleaved samples each:");
    println!(
        "  loader {:>9}  DlopenLoader::load + drop: dlopen, entry, checks, init (2 kernels and \
         a runner copied), shutdown, dlclose",
        micros(load_median)
    );
    println!(
        "  bare   {:>9}  libloading open + close, RTLD_NOW | RTLD_LOCAL",
        micros(bare_median)
    );
    println!("  ratio  {ratio:>9.2}  loader / bare");
    println!(
        "  p90    loader {}, bare {}",
        micros(percentile(&loads, 0.9)),
        micros(percentile(&bares, 0.9))
    );
}

fn plugin_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("GUILD_TEST_PLUGIN_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-plugins/lib"),
        PathBuf::from,
    );
    let path = dir.join(format!("lib{name}.so"));
    assert!(
        path.is_file(),
        "{} is missing; build the test plugins with `cargo xtask plugins`",
        path.display()
    );
    path
}

/// Sorts `samples` and returns the middle one.
fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

/// The `q` quantile of sorted `samples`.
fn percentile(samples: &[Duration], q: f64) -> Duration {
    let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples.get(index).copied().unwrap_or_default()
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}
