//! Resolution cost as the number of candidates grows, measured in one run:
//! - the curve for 1, 16, 64, 256 and 1024 candidates of one operation, through the C service
//!   table and through the Rust face (`OperationService::resolve`), where every candidate passes
//!   the static checks and all but the lowest-ranked refuse in `validate`, so that every
//!   candidate's callback runs;
//! - the baseline: the same refusing `validate` called directly, with the same query, so that
//!   the host's cost per refusing candidate is what remains once the callback's own is taken off;
//! - heap allocations per resolve at each size (a refused candidate should cost none), in the
//!   steady state, with what the first calls make on top said apart for one candidate.
//!
//! The providers are Rust ones behind the loader port's `KernelProvider` (the same path the
//! dlopen loader's providers take), registered in a `OwnedRegistry`, so the curve measures
//! the host rather than a plugin. `cargo bench -p guild-host --bench resolve` runs the full
//! measurement; with `-- --test` each benchmark runs once. `GUILD_BENCH_SIZES=1,64` limits the
//! curve to those sizes (for a profiler).

#[path = "../tests/it/c_face.rs"]
#[allow(dead_code)]
mod c_face;
#[path = "common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, Criterion};
use guild_abi::text::set_error;
use guild_abi::{
    guild_error_info_t, guild_scratch_request_v1_t, guild_status_t, GUILD_DTYPE_F32,
    GUILD_STATUS_ERR_UNSUPPORTED, GUILD_STATUS_OK,
};
use guild_domain::ids::{ImplId, OpName, PackageId};
use guild_domain::operation::{
    Arity, Backend, Capabilities, CpuIsa, DType, LayoutSet, MemorySpace, MemorySpaceSet, Numerics,
    OpCandidate, SyncModeSet, TensorDesc,
};
use guild_domain::version::{PackedVersion, Version};
use guild_host::registry::OwnedRegistry;
use guild_host::{OperationRequest, OperationService};
use guild_ports::loader::{LoadedPlugin, RegisteredKernel};
use guild_ports::provider::{KernelProvider, QueryCall};

use c_face::{tensor, Query, Service};
use common::{
    allocations_of, median, recorded, show, Allocations, NoLibrary, Samples, FIRST_CALLS,
};

const SIZES: [usize; 5] = [1, 16, 64, 256, 1024];
/// Handles resolved per timed batch (released untimed).
const BATCH: u64 = 64;
const ELEMENTS: u64 = 16;

/// A provider that accepts or refuses every query, as a plugin's `validate` would: a refusal
/// writes its status and a message into the error record.
#[derive(Debug)]
struct Provider {
    accepts: bool,
}

impl KernelProvider for Provider {
    fn validate(&self, query: QueryCall<'_>, error: &mut guild_error_info_t) -> guild_status_t {
        if self.accepts && !query.inputs().is_empty() {
            return GUILD_STATUS_OK;
        }
        set_error(
            error,
            GUILD_STATUS_ERR_UNSUPPORTED,
            "bench.provider",
            "this build takes no tensors of this shape",
        );
        GUILD_STATUS_ERR_UNSUPPORTED
    }

    fn query_scratch(
        &self,
        _query: QueryCall<'_>,
        scratch: &mut guild_scratch_request_v1_t,
        _error: &mut guild_error_info_t,
    ) -> guild_status_t {
        scratch.host_bytes = 0;
        scratch.device_bytes = 0;
        scratch.alignment = 0;
        GUILD_STATUS_OK
    }
}

fn op_name(n: usize) -> String {
    format!("bench.curve.n{n}")
}

fn candidate(n: usize, i: usize) -> OpCandidate {
    OpCandidate {
        impl_id: ImplId::new(format!("bench.curve{n}.c{i:04}")).unwrap(),
        op_name: OpName::new(op_name(n)).unwrap(),
        backend: Backend::Cpu,
        priority: i as i32,
        op_version: PackedVersion::new(1, 0, 0).unwrap(),
        capabilities: Capabilities::from_bits(0),
        numerics: Numerics::from_bits(0),
        input_dtype: DType::F32,
        output_dtype: DType::F32,
        inputs: Arity::exactly(1),
        outputs: Arity::exactly(1),
        layouts: LayoutSet::CONTIGUOUS,
        memory_spaces: MemorySpaceSet::HOST,
        min_alignment: 4,
        min_rank: 1,
        max_rank: 1,
        max_dim: [0; 8],
        max_batch: 0,
        sync_modes: SyncModeSet::HOST_BLOCKING,
        min_sm: 0,
        max_sm: 0,
        cpu_isa: CpuIsa::EMPTY,
    }
}

/// One package per size; in each, only the lowest-ranked candidate (priority 0) accepts.
fn registry() -> OwnedRegistry {
    let reg = OwnedRegistry::new();
    for n in SIZES {
        let id = PackageId::new(format!("bench.curve{n}")).unwrap();
        let version = Version::new(1, 0, 0);
        let kernels = (0..n)
            .map(|i| {
                let c = candidate(n, i);
                RegisteredKernel {
                    impl_id: c.impl_id.clone(),
                    op_kind: guild_abi::GUILD_OP_CUSTOM,
                    op_name: Some(c.op_name.clone()),
                    backend: Backend::Cpu,
                    priority: c.priority,
                    required_cpu_isa: c.cpu_isa,
                    operation: Some(c),
                    provider: Arc::new(Provider { accepts: i == 0 }),
                }
            })
            .collect();
        let plugin = LoadedPlugin {
            library: Arc::new(NoLibrary(id.clone(), version.clone())),
            kernels,
            runners: vec![],
        };
        reg.commit(reg.prepare(&id, &version, plugin, true).unwrap());
    }
    reg
}

fn c_query(n: usize) -> Query {
    let t = || tensor(GUILD_DTYPE_F32, &[ELEMENTS], &[0]);
    Query::cpu(&op_name(n), vec![t()], vec![t()])
}

fn rust_request(n: usize) -> OperationRequest {
    let t = || TensorDesc::new(DType::F32, &[ELEMENTS], MemorySpace::Host);
    OperationRequest::cpu(OpName::new(op_name(n)).unwrap(), vec![t()], vec![t()])
}

/// Runs `resolve` `iters` times in batches, timing the resolutions only.
fn timed_batches<H>(iters: u64, mut resolve: impl FnMut() -> H) -> Duration {
    let mut held = Vec::with_capacity(BATCH as usize);
    let mut elapsed = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        let start = Instant::now();
        for _ in 0..n {
            held.push(black_box(resolve()));
        }
        elapsed += start.elapsed();
        held.clear();
        left -= n;
    }
    elapsed
}

struct Row {
    n: usize,
    c: Samples,
    rust: Samples,
    c_allocations: Allocations,
    rust_allocations: Allocations,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let samples = if full { 20 } else { 10 };
    let mut criterion = Criterion::default()
        .sample_size(samples)
        .warm_up_time(Duration::from_millis(if full { 500 } else { 50 }))
        .measurement_time(Duration::from_secs(if full { 2 } else { 1 }))
        .configure_from_args();
    let reg = registry();
    let service = Service::of(&reg);
    let rust = OperationService::new(&reg);

    // The baseline: one refusing validate, called directly with the C query the host builds.
    let refusing = Provider { accepts: false };
    let query = c_query(1);
    let raw = query.c();
    let validate = Samples::default();
    criterion.bench_function("validate callback alone (refusing)", |b| {
        recorded(b, &validate, |iters| {
            let mut error = guild_error_info_t::new();
            let start = Instant::now();
            for _ in 0..iters {
                // SAFETY: `raw` and everything it points at live in `query` for the loop.
                let call = unsafe { QueryCall::new(black_box(&raw)) };
                black_box(refusing.validate(call, &mut error));
            }
            start.elapsed()
        })
    });

    let sizes: Vec<usize> = std::env::var("GUILD_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| SIZES.to_vec());
    let mut rows = Vec::new();
    for n in sizes.into_iter().filter(|n| SIZES.contains(n)) {
        let query = c_query(n);
        let request = rust_request(n);
        let row = Row {
            n,
            c: Samples::default(),
            rust: Samples::default(),
            c_allocations: allocations_of(|| drop(service.resolve(&query).unwrap())),
            rust_allocations: allocations_of(|| drop(rust.resolve(&request).unwrap())),
        };
        let mut g = criterion.benchmark_group(format!("resolve_{n}_candidates"));
        g.bench_function("C service", |b| {
            recorded(b, &row.c, |iters| {
                timed_batches(iters, || service.resolve(black_box(&query)).unwrap())
            })
        });
        g.bench_function("Rust face", |b| {
            recorded(b, &row.rust, |iters| {
                timed_batches(iters, || rust.resolve(black_box(&request)).unwrap())
            })
        });
        g.finish();
        rows.push(row);
    }

    let v = median(&validate, samples);
    println!("\nresolve, every candidate but the lowest-ranked refusing in validate");
    println!("refusing validate called directly: {}", show(v));
    println!(
        "{:>6}{:>14}{:>14}{:>16}{:>16}{:>12}{:>12}",
        "n", "C face", "Rust face", "C per refusal", "Rust per ref.", "C allocs", "Rust allocs"
    );
    let base_c = rows.first().and_then(|r| median(&r.c, samples));
    let base_rust = rows.first().and_then(|r| median(&r.rust, samples));
    for r in &rows {
        let (c, rs) = (median(&r.c, samples), median(&r.rust, samples));
        // The host's own cost per refusing candidate: the growth over one candidate, per extra
        // candidate, less the callback's own time.
        let per = |t: Option<f64>, base: Option<f64>| match (t, base, v) {
            (Some(t), Some(base), Some(v)) if r.n > 1 => {
                show(Some((t - base) / (r.n - 1) as f64 - v))
            }
            _ => "-".into(),
        };
        println!(
            "{:>6}{:>14}{:>14}{:>16}{:>16}{:>12.1}{:>12.1}",
            r.n,
            show(c),
            show(rs),
            per(c, base_c),
            per(rs, base_rust),
            r.c_allocations.per_call,
            r.rust_allocations.per_call
        );
    }
    // Each goal with its verdict, from this run's medians (none in test mode).
    let verdict = |ok: Option<bool>| match ok {
        _ if !full => "not measured (test mode)",
        Some(true) => "met",
        Some(false) => "missed",
        None => "not measured (size not run)",
    };
    let one = rows.first().filter(|r| r.n == 1);
    let under_1us = |t: Option<f64>| one.and(t).map(|t| t < 1e3);
    println!(
        "goal: 1 candidate under 1 us: C {} ({}), Rust {} ({})",
        show(base_c),
        verdict(under_1us(base_c)),
        show(base_rust),
        verdict(under_1us(base_rust))
    );
    // G28's goal for one candidate: under 300 ns with at most 2 allocations (the allocations
    // are counted, so they are judged in test mode too).
    for (face, t, allocations) in [
        ("C", base_c, one.map(|r| r.c_allocations)),
        ("Rust", base_rust, one.map(|r| r.rust_allocations)),
    ] {
        let Some(allocations) = allocations else {
            continue;
        };
        println!(
            "goal: 1 candidate under 300 ns with at most 2 allocations: {face} {} ({}), \
             {} allocations ({}; {} in its first {FIRST_CALLS} calls)",
            show(t),
            verdict(t.map(|t| t < 300.0)),
            allocations.per_call,
            if allocations.per_call <= 2.0 {
                "met"
            } else {
                "missed"
            },
            allocations.first_calls,
        );
    }
    // The worst host cost per refusing candidate over the sizes run, on either face.
    let worst = rows
        .iter()
        .filter(|r| r.n > 1)
        .flat_map(|r| {
            [(&r.c, base_c), (&r.rust, base_rust)].map(|(t, base)| {
                match (median(t, samples), base, v) {
                    (Some(t), Some(base), Some(v)) => Some((t - base) / (r.n - 1) as f64 - v),
                    _ => None,
                }
            })
        })
        .collect::<Option<Vec<f64>>>()
        .and_then(|per| per.into_iter().reduce(f64::max));
    println!(
        "goal: each refusing candidate under 100 ns on top of its validate: worst {} ({})",
        show(worst),
        verdict(one.and(worst).map(|w| w < 100.0))
    );
    criterion.final_summary();
}
