//! Kernel-registry lookups against a `Mutex<HashMap>` baseline, in the same run: `find_by_id`
//! latency on one thread, and lookup throughput on one and two threads.
//!
//! With `GUILD_BENCH_CALLS=n` the benchmark instead runs each lookup `n` times in its own
//! never-inlined function (`lookups_registry`, `lookups_baseline`) and exits, for instruction
//! counts: `GUILD_BENCH_CALLS=100000 valgrind --tool=callgrind <bench binary> --bench`, then
//! `callgrind_annotate --inclusive=yes` and divide each function's count by `n`.

#[path = "common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{black_box, criterion_group, Criterion};
use guild_domain::ids::{ImplId, OpName, PackageId};
use guild_domain::operation::Backend;
use guild_domain::version::Version;
use guild_host::registry::OwnedRegistry;
use guild_ports::loader::{LoadedPlugin, RegisteredKernel};
use guild_ports::provider::NoCallbacks;

use common::NoLibrary;

const PACKAGES: usize = 64;
const KERNELS_PER_PACKAGE: usize = 8;

fn impl_id(p: usize, k: usize) -> ImplId {
    ImplId::new(format!("bench.pkg{p}.kernel{k}")).unwrap()
}

fn registry() -> OwnedRegistry {
    let reg = OwnedRegistry::new();
    for p in 0..PACKAGES {
        let id = PackageId::new(format!("bench.pkg{p}")).unwrap();
        let version = Version::new(1, 0, 0);
        let kernels = (0..KERNELS_PER_PACKAGE)
            .map(|k| RegisteredKernel {
                impl_id: impl_id(p, k),
                op_kind: 0x10000,
                op_name: Some(OpName::new(format!("bench.op{k}")).unwrap()),
                backend: Backend::Cpu,
                priority: p as i32,
                required_cpu_isa: guild_domain::operation::CpuIsa::EMPTY,
                operation: None,
                provider: Arc::new(NoCallbacks),
            })
            .collect();
        let library = Arc::new(NoLibrary(id.clone(), version.clone()));
        let plugin = LoadedPlugin {
            library,
            kernels,
            runners: vec![],
        };
        reg.commit(reg.prepare(&id, &version, plugin, true).unwrap());
    }
    reg
}

/// The baseline: the same lookup through a mutex-protected map of shared entries.
fn baseline() -> Mutex<HashMap<ImplId, Arc<(ImplId, i32)>>> {
    let mut map = HashMap::new();
    for p in 0..PACKAGES {
        for k in 0..KERNELS_PER_PACKAGE {
            map.insert(impl_id(p, k), Arc::new((impl_id(p, k), p as i32)));
        }
    }
    Mutex::new(map)
}

fn latency(c: &mut Criterion) {
    let reg = registry();
    let base = baseline();
    let probe = impl_id(PACKAGES / 2, 3);
    let mut g = c.benchmark_group("find_by_id");
    g.bench_function("registry (binding taken)", |b| {
        b.iter(|| black_box(reg.find_by_id(black_box(&probe))).is_some())
    });
    g.bench_function("baseline Mutex<HashMap> (Arc clone)", |b| {
        b.iter(|| black_box(base.lock().unwrap().get(black_box(&probe)).cloned()).is_some())
    });
    g.finish();
}

/// Lookups per second for `threads` threads over a fixed duration.
fn throughput(
    threads: usize,
    lookup: Arc<dyn Fn(&ImplId) -> bool + Send + Sync>,
    dur: Duration,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, lookup) = (stop.clone(), lookup.clone());
            std::thread::spawn(move || {
                let ids: Vec<_> = (0..PACKAGES)
                    .map(|p| impl_id(p, (p + t) % KERNELS_PER_PACKAGE))
                    .collect();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for id in &ids {
                        if lookup(id) {
                            n += 1;
                        }
                    }
                }
                n
            })
        })
        .collect();
    std::thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    total as f64 / dur.as_secs_f64()
}

fn throughput_table(_: &mut Criterion) {
    // A measurement under `cargo bench`, not the single pass of `-- --test`.
    let benchmarking =
        std::env::args().any(|a| a == "--bench") && !std::env::args().any(|a| a == "--test");
    // Each cell is the median of `rounds` measurements, the registry's and the baseline's taken
    // in turn, so that a drift of the machine's speed during the run moves both alike.
    let (dur, rounds) = if benchmarking {
        (Duration::from_millis(400), 7)
    } else {
        (Duration::from_millis(50), 1)
    };
    let reg = Arc::new(registry());
    let base = Arc::new(baseline());
    println!(
        "\nlookup throughput (median of {rounds} alternating runs of {} ms per cell, {} kernels \
         registered)",
        dur.as_millis(),
        PACKAGES * KERNELS_PER_PACKAGE
    );
    println!(
        "{:<10}{:>22}{:>22}{:>10}",
        "threads", "registry (M/s)", "Mutex<HashMap> (M/s)", "ratio"
    );
    let mut rates = Vec::new();
    for threads in [1, 2] {
        let r = reg.clone();
        let by_registry: Arc<dyn Fn(&ImplId) -> bool + Send + Sync> =
            Arc::new(move |id| r.find_by_id(id).is_some());
        let b = base.clone();
        let by_baseline: Arc<dyn Fn(&ImplId) -> bool + Send + Sync> =
            Arc::new(move |id| b.lock().unwrap().get(id).cloned().is_some());
        let (mut registry_rates, mut base_rates) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            registry_rates.push(throughput(threads, by_registry.clone(), dur));
            base_rates.push(throughput(threads, by_baseline.clone(), dur));
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (registry_rate, base_rate) = (median(registry_rates), median(base_rates));
        println!(
            "{threads:<10}{:>22.2}{:>22.2}{:>10.2}",
            registry_rate / 1e6,
            base_rate / 1e6,
            registry_rate / base_rate
        );
        rates.push((registry_rate, base_rate));
    }
    let verdict = |ok: bool| match (benchmarking, ok) {
        (false, _) => "not measured (test mode)",
        (true, true) => "met",
        (true, false) => "missed",
    };
    if let [(one, one_base), (two, _)] = rates[..] {
        println!(
            "goal: 1 thread no slower than Mutex<HashMap>: {:.2}x ({})",
            one / one_base,
            verdict(one >= one_base)
        );
        println!(
            "goal: 2 threads at least 1.8x 1 thread: {:.2}x ({})",
            two / one,
            verdict(two >= 1.8 * one)
        );
    }
}

/// `n` lookups through the registry, each binding dropped at once.
#[inline(never)]
fn lookups_registry(n: u64, reg: &OwnedRegistry, probe: &ImplId) -> u64 {
    (0..n)
        .filter(|_| black_box(reg.find_by_id(black_box(probe))).is_some())
        .count() as u64
}

/// `n` lookups through the baseline.
#[inline(never)]
fn lookups_baseline(
    n: u64,
    base: &Mutex<HashMap<ImplId, Arc<(ImplId, i32)>>>,
    probe: &ImplId,
) -> u64 {
    (0..n)
        .filter(|_| black_box(base.lock().unwrap().get(black_box(probe)).cloned()).is_some())
        .count() as u64
}

criterion_group!(benches, latency, throughput_table);

fn main() {
    if let Some(n) = std::env::var("GUILD_BENCH_CALLS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
    {
        let (reg, base) = (registry(), baseline());
        let probe = impl_id(PACKAGES / 2, 3);
        // Warm both paths once (the thread's table, lazy binding) before the counted calls.
        let warm = lookups_registry(1, &reg, &probe) + lookups_baseline(1, &base, &probe);
        let found = lookups_registry(n, &reg, &probe) + lookups_baseline(n, &base, &probe);
        assert_eq!((warm, found), (2, 2 * n), "every lookup finds the probe");
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
