//! The expert pool's per-batch overhead over a real CPE1 provider (test-plugins/expert_ref, F32
//! reference arithmetic), installed as a signed gkernel and loaded with dlopen, before and after
//! the pool became persistent, in one run:
//! - the `down_rows` call made directly on the caller's thread (the work itself, no pool);
//! - (a) the spawn-per-batch pool the host used to have, reimplemented here as it was
//!   (crossbeam scoped workers started per batch, two channels, a zeroed scratch per worker);
//! - (b) the persistent [`ExpertPool`], whose workers and scratch live as long as the pool.
//!
//! Two batches: one task (one expert, one token, 8 x 4 matrices: the batch is all overhead) and
//! eight tasks (one per expert) over four workers. Every path builds its `Vec` of tasks per
//! batch, as a runner does. The summary at the end is computed from the
//! samples criterion took in this run (the median per-batch time, as criterion reports it), with
//! the heap allocations each path makes per batch in the steady state, counted by the
//! benchmark's own global allocator over 1000 batches (on every thread, the workers' included;
//! the caller's `Vec` of tasks is built outside the count). `cargo bench --bench experts` runs
//! the full measurement; with `-- --test` (or under `cargo test --benches`) each benchmark runs
//! once. Build the C plugins first: `cargo xtask plugins`.

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use criterion::{black_box, Criterion};
use guild_abi::{guild_cpu_expert_format_v1_t, GUILD_DTYPE_F32};
use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::ImplId;
use guild_host::experts::{
    AlignedBuffer, BoundExpertTable, DownCall, ExpertPool, ExpertTask, PoolError,
};
use guild_host::{Host, InstallOptions};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

use common::{median, recorded, show, Samples};

const HIDDEN: usize = 8;
const INTER: usize = 4;
const EXPERTS: usize = 8;
/// Workers of the pools (and at most as many threads per batch for the baseline).
const THREADS: usize = 4;

fn fixture(shop: &Workshop) -> Host {
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).expect("open store");
    trust(&pm, PUBLISHER, &k);
    let host = Host::new(pm, Box::new(DlopenLoader::new()));
    let mut spec = Spec::kernel("test.expert_ref", "1.0.0").library(&plugin_library("expert_ref"));
    spec.provided_ops = vec!["test.expert_ref.cpu".into()];
    host.install(&shop.build(&spec, &k).archive, InstallOptions::default())
        .expect("install expert_ref");
    host
}

/// F32 activations and hidden rows, 16-byte aligned, laid out as expert_ref reads an expert: a
/// 16-byte header word (the expert's index), then gate, up and down. 64 bytes of scratch.
fn format() -> guild_cpu_expert_format_v1_t {
    let (hidden, inter) = (HIDDEN as u64, INTER as u64);
    let matrix = hidden * inter * 4;
    guild_cpu_expert_format_v1_t {
        struct_size: size_of::<guild_cpu_expert_format_v1_t>() as u32,
        weight_layout: guild_abi::GUILD_CPU_EXPERT_WEIGHTS_NATIVE,
        scale_layout: guild_abi::GUILD_CPU_EXPERT_SCALES_IN_BLOCK,
        activation_layout: guild_abi::GUILD_CPU_EXPERT_ACTIVATION_ROWS,
        gate_up_dtype: GUILD_DTYPE_F32,
        down_dtype: GUILD_DTYPE_F32,
        activation_dtype: GUILD_DTYPE_F32,
        hidden_dtype: GUILD_DTYPE_F32,
        gate_up_block_elements: 1,
        gate_up_block_bytes: 4,
        down_block_elements: 1,
        down_block_bytes: 4,
        activation_block_elements: 1,
        activation_block_bytes: 4,
        hidden_block_elements: 1,
        hidden_block_bytes: 4,
        alignment: 16,
        reserved: 0,
        hidden_size: hidden,
        intermediate_size: inter,
        expert_count: EXPERTS as u64,
        expert_stride_bytes: 16 + 3 * matrix,
        gate_offset_bytes: 16,
        up_offset_bytes: 16 + matrix,
        down_offset_bytes: 16 + 2 * matrix,
        gate_up_row_stride_bytes: hidden * 4,
        down_row_stride_bytes: inter * 4,
        gate_scales_offset_bytes: 0,
        up_scales_offset_bytes: 0,
        down_scales_offset_bytes: 0,
        gate_up_scale_row_stride_bytes: 0,
        down_scale_row_stride_bytes: 0,
        activation_row_bytes: hidden * 4,
        hidden_row_bytes: inter * 4,
        scratch_bytes: 64,
    }
}

fn aligned_f32(values: impl Iterator<Item = f32>, len: usize) -> AlignedBuffer {
    let mut buffer = AlignedBuffer::zeroed(len * 4, 16).expect("layout");
    for (at, v) in buffer.as_mut_slice().chunks_exact_mut(4).zip(values) {
        at.copy_from_slice(&v.to_le_bytes());
    }
    buffer
}

/// Expert `e`'s image: its index, then small deterministic weights.
fn expert_image(fmt: &guild_cpu_expert_format_v1_t, e: usize) -> AlignedBuffer {
    let words = fmt.expert_stride_bytes as usize / 4;
    let weights = (0..words).map(|i| (((e * 31 + i * 17) % 23) as f32 - 11.0) / 16.0);
    let mut image = aligned_f32(weights, words);
    image.as_mut_slice()[..16].fill(0);
    image.as_mut_slice()[..4].copy_from_slice(&(e as u32).to_le_bytes());
    image
}

/// What a batch reads: every expert's image and one token's quantized hidden row.
struct Inputs {
    images: Vec<AlignedBuffer>,
    hidden: AlignedBuffer,
}

/// One `down_rows` task per output, for one token each, expert `i` writing output `i`.
fn tasks<'a>(inputs: &'a Inputs, outputs: &'a mut [[f32; HIDDEN]]) -> Vec<ExpertTask<'a>> {
    outputs
        .iter_mut()
        .enumerate()
        .map(|(e, dst)| {
            ExpertTask::Down(DownCall {
                flags: 0,
                expert_index: e as u32,
                token_count: 1,
                rows: 0..HIDDEN as u64,
                expert_image: inputs.images[e].as_slice(),
                hidden: inputs.hidden.as_slice(),
                token_weights: None,
                dst,
            })
        })
        .collect()
}

/// The pool as it was before it became persistent (guild-host's `ExpertPool::run` up to this
/// change, less its format checks): per batch, `threads.min(tasks)` crossbeam scoped workers,
/// a bounded channel of tasks, an unbounded channel of results and a zeroed scratch buffer per
/// worker.
fn run_spawning_per_batch(
    threads: usize,
    table: &BoundExpertTable,
    format: &guild_cpu_expert_format_v1_t,
    tasks: Vec<ExpertTask<'_>>,
) -> Result<(), PoolError> {
    let count = tasks.len();
    let workers = threads.min(count);
    if workers == 0 {
        return Ok(());
    }
    let scratch_len = format.scratch_bytes as usize;
    let (work_tx, work_rx) = crossbeam::channel::bounded(count);
    for item in tasks.into_iter().enumerate() {
        let _ = work_tx.send(item);
    }
    drop(work_tx);
    let (done_tx, done_rx) = crossbeam::channel::unbounded();
    let joined = crossbeam::scope(|s| {
        for _ in 0..workers {
            let work_rx = work_rx.clone();
            let done_tx = done_tx.clone();
            s.spawn(move |_| {
                let mut scratch = AlignedBuffer::zeroed(scratch_len, format.alignment as usize)
                    .expect("the scratch layout");
                for (index, mut task) in work_rx.iter() {
                    let expert = task.expert_index();
                    let result = table.run_task(format, &mut task, scratch.as_mut_slice());
                    let _ = done_tx.send((index, expert, result));
                }
            });
        }
    });
    drop(done_tx);
    if let Err(panic) = joined {
        std::panic::resume_unwind(panic);
    }
    let mut failures: Vec<PoolError> = done_rx
        .iter()
        .filter_map(|(task, expert_index, result)| {
            result.err().map(|error| PoolError {
                task,
                expert_index,
                error,
            })
        })
        .collect();
    failures.sort_by_key(|f| f.task);
    failures.into_iter().next().map_or(Ok(()), Err)
}

/// Heap allocations per batch of `run`, over 1000 batches of `width` tasks; the tasks' `Vec`
/// is built before the count starts.
fn allocations_per_batch<'a>(
    inputs: &'a Inputs,
    outputs: &'a mut [[f32; HIDDEN]],
    mut run: impl FnMut(Vec<ExpertTask<'_>>),
) -> f64 {
    let mut total = 0;
    for _ in 0..1000 {
        let batch = tasks(inputs, outputs);
        let before = common::allocations();
        run(batch);
        total += common::allocations() - before;
    }
    total as f64 / 1000.0
}

/// The timings of one batch shape.
#[derive(Default)]
struct Shape {
    spawning: Samples,
    pool: Samples,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let samples = 30;
    // The times are defaults that the command line may override (`--measurement-time 3`).
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sample_size(samples)
        .configure_from_args();
    let shop = Workshop::new();
    let host = fixture(&shop);
    let table =
        BoundExpertTable::bind_id(host.kernels(), &ImplId::new("test.expert_ref.cpu").unwrap())
            .expect("bind expert_ref's CPE1 table");
    let fmt = format();
    let inputs = Inputs {
        images: (0..EXPERTS).map(|e| expert_image(&fmt, e)).collect(),
        hidden: aligned_f32((0..INTER).map(|i| 0.25 * i as f32 - 0.5), INTER),
    };
    let pool = ExpertPool::new(THREADS);

    // Both pools compute the same thing, bit for bit, and it is not nothing.
    let mut old = [[0f32; HIDDEN]; EXPERTS];
    let mut new = [[0f32; HIDDEN]; EXPERTS];
    run_spawning_per_batch(THREADS, &table, &fmt, tasks(&inputs, &mut old)).expect("old pool");
    pool.run(&table, &fmt, tasks(&inputs, &mut new))
        .expect("new pool");
    assert_eq!(
        old.map(|r| r.map(f32::to_bits)),
        new.map(|r| r.map(f32::to_bits))
    );
    assert!(new.iter().flatten().any(|v| *v != 0.0));

    let direct_t = Samples::default();
    let shapes = [Shape::default(), Shape::default()];
    let mut scratch = AlignedBuffer::zeroed(fmt.scratch_bytes as usize, 16).unwrap();
    let mut outputs = [[0f32; HIDDEN]; EXPERTS];
    let mut g = c.benchmark_group("expert_batch");
    g.bench_function("1 task, direct down_rows call", |b| {
        recorded(b, &direct_t, |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                for mut task in tasks(&inputs, &mut outputs[..1]) {
                    table
                        .run_task(black_box(&fmt), &mut task, scratch.as_mut_slice())
                        .expect("down_rows");
                }
            }
            start.elapsed()
        })
    });
    for (width, shape) in [1, EXPERTS].into_iter().zip(&shapes) {
        g.bench_function(format!("{width} task(s), (a) spawn per batch"), |b| {
            recorded(b, &shape.spawning, |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    let batch = tasks(&inputs, &mut outputs[..width]);
                    run_spawning_per_batch(THREADS, &table, black_box(&fmt), batch)
                        .expect("old pool");
                }
                start.elapsed()
            })
        });
        g.bench_function(format!("{width} task(s), (b) persistent pool"), |b| {
            recorded(b, &shape.pool, |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    let batch = tasks(&inputs, &mut outputs[..width]);
                    pool.run(&table, black_box(&fmt), batch).expect("pool");
                }
                start.elapsed()
            })
        });
    }
    g.finish();

    let allocations: Vec<(f64, f64)> = [1, EXPERTS]
        .into_iter()
        .map(|width| {
            let spawning = allocations_per_batch(&inputs, &mut outputs[..width], |batch| {
                run_spawning_per_batch(THREADS, &table, &fmt, batch).expect("old pool");
            });
            let persistent = allocations_per_batch(&inputs, &mut outputs[..width], |batch| {
                pool.run(&table, &fmt, batch).expect("pool");
            });
            (spawning, persistent)
        })
        .collect();

    let m = |s: &Samples| median(s, samples);
    if full {
        println!(
            "\nexpert pool: medians of the {samples} samples each benchmark took in this run \
             (timings on a shared machine are noisy)"
        );
    } else {
        println!("\nexpert pool: test mode, one run each; the figures are not measurements");
    }
    let direct = m(&direct_t);
    println!(
        "one down_rows call ({HIDDEN} x {INTER}, one token) on the caller's thread: {}",
        show(direct)
    );
    println!("per batch, {THREADS} workers at most (allocations counted on every thread):");
    println!(
        "  {:<14}{:>22}{:>22}{:>10}{:>22}",
        "batch", "(a) spawn per batch", "(b) persistent pool", "(a)/(b)", "allocations (a) / (b)"
    );
    for ((width, shape), (alloc_a, alloc_b)) in
        [1, EXPERTS].into_iter().zip(&shapes).zip(allocations)
    {
        let (a, b) = (m(&shape.spawning), m(&shape.pool));
        println!(
            "  {:<14}{:>22}{:>22}{:>10}{:>22}",
            format!("{width} task(s)"),
            show(a),
            show(b),
            a.zip(b)
                .map_or(String::new(), |(a, b)| format!("{:.1}x", a / b)),
            format!("{alloc_a:.1} / {alloc_b:.1}")
        );
    }
    if let (Some(d), Some(a), Some(b)) = (direct, m(&shapes[0].spawning), m(&shapes[0].pool)) {
        println!(
            "  overhead over the direct call, 1 task: (a) {}, (b) {}",
            show(Some(a - d)),
            show(Some(b - d))
        );
    }
    // G28's goals for the persistent pool, on two cores: a batch of one task under 2 µs, one of
    // eight under 10 µs.
    for ((width, shape), goal) in [1, EXPERTS].into_iter().zip(&shapes).zip([2e3, 10e3]) {
        if let (true, Some(b)) = (full, m(&shape.pool)) {
            println!(
                "  goal, {width} task(s) under {}: {} ({})",
                show(Some(goal)),
                if b < goal { "met" } else { "NOT met" },
                show(Some(b))
            );
        }
    }
    drop(pool);
    drop(table);
    c.final_summary();
}
