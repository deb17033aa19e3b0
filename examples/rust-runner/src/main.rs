//! A minimal runner that embeds `guild-host`.
//!
//! ```text
//! guild-example-runner [--cpu-only] STORE_DIR [OPERATION...]
//! guild-example-runner --serve [--interval-ms N] [--cpu-only] STORE_DIR [OPERATION...]
//! ```
//!
//! It opens a store that the `guild` command line filled (`guild trust add`, `guild install`),
//! which loads every enabled package, and then, for each operation named on the command line
//! (by default `example.sequence.inclusive_scan` and `example.sequence.scan_then_total`):
//!
//! 1. describes the tensors it will pass, as that operation's contract expects them;
//! 2. asks the operation service to resolve the operation for exactly those tensors, which
//!    picks the best provider among the loaded packages and negotiates with it;
//! 3. gives the provider the scratch memory it asked for, executes, and prints the result;
//! 4. drops the handle, which lets the provider's package be disabled or replaced again.
//!
//! The input is always the same small `i64` tensor: two rows of four values.
//!
//! With `--serve` it runs until it is stopped: every `--interval-ms` (default 200) it executes
//! each operation once and prints one line per execution, `OP IMPL_ID PACKAGE@VERSION ok` or
//! `OP error: REASON`. It follows the store while it serves (what `guild install`, `rollback`,
//! `disable` and `trust revoke-key` commit reaches it within moments, without a restart): a
//! watcher refreshes the host when a new generation is committed, and before each execution the
//! runner asks whether its handle still points at the current provider, resolving again when
//! not. A handle into a revoked package is no longer current, so it is dropped at once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use guild_host::prelude::*;
use guild_host::{DeviceSupport, LockFile};

const DEFAULT_OPERATIONS: &[&str] = &[
    "example.sequence.inclusive_scan",
    "example.sequence.scan_then_total",
];

/// The example input. Axis 0 is the innermost, contiguous one, so the shape `[4, 2]` is two
/// rows of four values each.
const INPUT_SHAPE: [u64; 2] = [4, 2];
const INPUT: [i64; 8] = [1, 2, 3, 4, 10, 20, 30, 40];

/// Runs operations from a Guild store on a fixed example input.
#[derive(Debug, Parser)]
#[command(name = "guild-example-runner", version)]
struct Args {
    /// Keep running: execute every operation each interval and follow store changes live.
    #[arg(long)]
    serve: bool,
    /// With --serve: milliseconds between rounds of executions.
    #[arg(long, value_name = "N", default_value_t = 200, requires = "serve",
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    interval_ms: u64,
    /// With --serve: instead of watching the store for commits, check for a new generation
    /// before every round (a few small reads when nothing changed).
    #[arg(long, requires = "serve")]
    poll: bool,
    /// Load only the enabled packages this lock file (`guild lock`) names, at their version and
    /// payload digest; anything else enabled in the store stays unloaded, with the reason.
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Use the CPU alone: do not look for a CUDA device. Detection initialises the CUDA driver,
    /// which on a machine with a GPU costs more CPU time than opening the store; a runner that
    /// runs only CPU operations can skip it.
    #[arg(long)]
    cpu_only: bool,
    /// The store directory that `guild` filled.
    #[arg(value_name = "STORE_DIR")]
    store: PathBuf,
    /// Operations to run (default: example.sequence.inclusive_scan and
    /// example.sequence.scan_then_total).
    #[arg(value_name = "OPERATION")]
    operations: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Stopped with SIGTERM (`systemctl stop`) or Ctrl-C while a library initialises, the
    // runner still ends by that signal, but the crash ledger learns it was a stop, not a crash
    // in `init`, so the build is not quarantined for every runner after this one.
    if let Err(e) = guild_host::termination::install_termination_handlers() {
        eprintln!("warning: cannot install the termination handlers: {e}");
    }
    let mut operations = args.operations;
    if operations.is_empty() {
        operations = DEFAULT_OPERATIONS.iter().map(|s| s.to_string()).collect();
    }
    let outcome = if args.serve {
        serve(
            &args.store,
            args.lock.as_deref(),
            &operations,
            Duration::from_millis(args.interval_ms),
            args.poll,
            args.cpu_only,
        )
    } else {
        run(
            &args.store,
            args.lock.as_deref(),
            &operations,
            args.cpu_only,
        )
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Opens the store as a runner does: without the store's lock, reading its last committed
/// generation; every enabled package is re-verified against the trust store and its signed
/// files and loaded in dependency order. No library is opened before its package has been
/// authenticated. Plugins' log records go to stderr; the devices are detected unless
/// `cpu_only`. With `lock`, only what the lock names is loaded.
fn open(store: &Path, lock: Option<&Path>, cpu_only: bool) -> Result<OpenedHost, String> {
    let mut builder = Host::builder(store)
        .plugin_log(|package, record| eprintln!("[{package}] {}", record.message));
    if cpu_only {
        builder = builder.devices(DeviceSupport::host());
    }
    if let Some(path) = lock {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read the lock file {}: {e}", path.display()))?;
        let lock = LockFile::parse(&bytes)
            .map_err(|e| format!("the lock file {} is not a lock: {e}", path.display()))?;
        builder = builder.lock(lock);
    }
    let opened = builder
        .open()
        .map_err(|e| format!("cannot open the store {}: {e}", store.display()))?;
    for r in &opened.report.loaded.refused_by_lock {
        eprintln!("warning: {} {} not loaded: {}", r.id, r.version, r.reason);
    }
    Ok(opened)
}

fn run(
    store: &Path,
    lock: Option<&Path>,
    operations: &[String],
    cpu_only: bool,
) -> Result<(), String> {
    let OpenedHost { host, report } = open(store, lock, cpu_only)?;
    let (opened, loaded) = (&report.store, &report.loaded);
    println!(
        "opened {} ({} verified)",
        store.display(),
        plural(opened.verified, "enabled package")
    );
    if let Some(why) = &report.no_cuda {
        println!("no CUDA device, CPU operations only: {why}");
    }
    for q in &opened.disabled {
        println!("warning: {} {} was disabled: {}", q.id, q.version, q.reason);
    }
    for p in &loaded.loaded {
        println!(
            "loaded {} {} ({})",
            p.id,
            p.version,
            plural(p.kernels, "operation implementation")
        );
    }
    for (id, version, error) in &loaded.failed {
        println!("warning: {id} {version} failed to load: {error}");
    }
    for q in &loaded.skipped {
        println!(
            "warning: {} {} was not loaded: {}",
            q.id, q.version, q.reason
        );
    }

    // The operation service reads the host's kernel registry. Its handles borrow the registry,
    // so the compiler makes sure that none outlives the host.
    let service = OperationService::new(host.kernels());
    for op in operations {
        println!();
        run_operation(&service, op)?;
    }
    Ok(())
}

/// One operation the serving runner keeps resolved.
struct Served<'r> {
    op: String,
    handle: Option<OpHandle<'r>>,
}

/// `--serve`: executes every operation each `interval`, one line per execution, following the
/// store until the process is stopped.
fn serve(
    store: &Path,
    lock: Option<&Path>,
    operations: &[String],
    interval: Duration,
    poll: bool,
    cpu_only: bool,
) -> Result<(), String> {
    let OpenedHost { host, report } = open(store, lock, cpu_only)?;
    let host = Arc::new(host);
    for (id, version, error) in &report.loaded.failed {
        eprintln!("warning: {id} {version} failed to load: {error}");
    }
    let log = |outcome: &Result<RefreshReport, HostError>| match outcome {
        Ok(r) if r.is_quiet() => {}
        Ok(r) => eprintln!("{}", describe_refresh(r)),
        Err(e) => eprintln!("warning: following the store failed: {e}"),
    };
    // The watcher refreshes the host as soon as a generation is committed (and once a second in
    // case a notification was lost); what it did goes to stderr.
    let _watcher = if poll {
        None
    } else {
        Some(
            host.watch(Duration::from_secs(1), log)
                .map_err(|e| format!("cannot watch the store {}: {e}", store.display()))?,
        )
    };
    let service = OperationService::new(host.kernels());
    let mut served: Vec<Served<'_>> = operations
        .iter()
        .map(|op| Served {
            op: op.clone(),
            handle: None,
        })
        .collect();
    let mut next = Instant::now();
    loop {
        let mut dropped = false;
        for s in &mut served {
            // A handle whose package was replaced, taken out or revoked since it was resolved
            // is dropped here, before it runs again.
            if s.handle.as_ref().is_some_and(|h| !h.is_current()) {
                s.handle = None;
                dropped = true;
            }
        }
        if dropped || poll {
            // A switch that waited for those handles can happen now (and a polling runner
            // looks for a new generation every round).
            log(&host.refresh());
        }
        for s in &mut served {
            println!("{}", serve_once(&service, s));
        }
        next += interval;
        let now = Instant::now();
        match next.checked_duration_since(now) {
            Some(wait) => std::thread::sleep(wait),
            None => next = now,
        }
    }
}

/// One execution of `s.op` (resolving it first when it has no current handle), as its line.
fn serve_once<'r>(service: &OperationService<'r>, s: &mut Served<'r>) -> String {
    let op = s.op.clone();
    if s.handle.is_none() {
        match resolve(service, &op) {
            Ok(handle) => s.handle = Some(handle),
            Err(reason) => return format!("{op} error: {}", one_line(&reason)),
        }
    }
    let Some(handle) = &s.handle else {
        return format!("{op} error: no handle");
    };
    let chosen = handle.describe();
    let who = format!(
        "{} {}@{}",
        chosen.impl_id, chosen.package, chosen.package_version
    );
    match execute(handle, &op) {
        Ok(_) => format!("{op} {who} ok"),
        Err(reason) => format!("{op} error: {}", one_line(&reason)),
    }
}

/// What a refresh did, in one line for the log.
fn describe_refresh(r: &RefreshReport) -> String {
    let mut parts = vec![format!("store generation {}", r.generation)];
    for l in &r.loaded {
        parts.push(format!("loaded {} {}", l.id, l.version));
    }
    for q in &r.taken_out {
        parts.push(format!(
            "took out {} {} ({})",
            q.id,
            q.version,
            one_line(&q.reason)
        ));
    }
    for d in &r.deferred {
        parts.push(format!("deferred: {d}"));
    }
    for v in &r.revoked_live {
        parts.push(format!(
            "{} live binding(s) still run revoked {} {}",
            v.bindings, v.id, v.version
        ));
    }
    for (id, version, e) in &r.failed {
        parts.push(format!(
            "{id} {version} failed to load: {}",
            one_line(&e.to_string())
        ));
    }
    for l in &r.refused_by_lock {
        parts.push(format!("{} {} not loaded: {}", l.id, l.version, l.reason));
    }
    format!("refresh: {}", parts.join("; "))
}

fn one_line(text: &str) -> String {
    text.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// The shapes of the outputs an operation produces for [`INPUT_SHAPE`], from its contract. A
/// runner has to know the contract of every operation it calls; this one knows four.
fn output_shapes(op: &str) -> Option<Vec<Vec<u64>>> {
    let same = INPUT_SHAPE.to_vec();
    match op {
        // One output of the input's shape.
        "example.sequence.inclusive_scan" | "example.sequence.exclusive_scan" => Some(vec![same]),
        // One total per row: the innermost axis shrinks to 1.
        "example.sequence.scan_then_total" => Some(vec![vec![1, INPUT_SHAPE[1]]]),
        // The C runner's pipeline: the inclusive and the exclusive scan of the input.
        "example.runner.demo_pipeline" => Some(vec![same.clone(), same]),
        _ => None,
    }
}

/// The input tensor, the output shapes and the output tensors of one operation.
type Tensors = (TensorDesc, Vec<Vec<u64>>, Vec<TensorDesc>);

/// The example tensors for `op`: the input and the outputs its contract expects.
fn tensors(op: &str) -> Result<Tensors, String> {
    let shapes = output_shapes(op)
        .ok_or_else(|| format!("this runner does not know the contract of {op}"))?;
    let input = TensorDesc::new(DType::I64, &INPUT_SHAPE, MemorySpace::Host);
    let outputs: Vec<TensorDesc> = shapes
        .iter()
        .map(|shape| TensorDesc::new(DType::I64, shape, MemorySpace::Host))
        .collect();
    Ok((input, shapes, outputs))
}

/// Resolves `op` for the example tensors: a host-blocking CPU request for any 1.x version of
/// the operation. A failure explains, for every candidate, why it was not chosen.
fn resolve<'r>(service: &OperationService<'r>, op: &str) -> Result<OpHandle<'r>, String> {
    // 1. Describe the tensors: element type, shape, where the memory lives.
    let (input, _, outputs) = tensors(op)?;
    let name = OpName::new(op).map_err(|e| format!("{op}: {e}"))?;
    // 2. Resolve.
    let request = OperationRequest::cpu(name, vec![input], outputs);
    service
        .resolve(&request)
        .map_err(|e| format!("resolving {op}: {e}"))
}

/// Executes `handle` once on the example input and answers the outputs.
fn execute(handle: &OpHandle<'_>, op: &str) -> Result<Vec<Vec<i64>>, String> {
    let (input, shapes, outputs) = tensors(op)?;
    // 3. The caller owns scratch memory: allocate what the provider asked for, aligned.
    let need = handle.scratch();
    let align = usize::try_from(need.alignment.max(1)).map_err(|e| e.to_string())?;
    let bytes = usize::try_from(need.host_bytes).map_err(|e| e.to_string())?;
    let mut scratch_buffer = vec![0u8; bytes + align];
    let scratch = if bytes == 0 {
        None
    } else {
        Some(aligned(&mut scratch_buffer, bytes, align)?)
    };

    // 4. Execute. The arguments borrow the buffers; every one is checked against the
    //    negotiated contract before the provider runs.
    let mut results: Vec<Vec<i64>> = shapes
        .iter()
        .map(|shape| vec![0; shape.iter().product::<u64>() as usize])
        .collect();
    let mut output_args: Vec<TensorArgMut<'_>> = outputs
        .iter()
        .zip(results.iter_mut())
        .map(|(desc, buffer)| TensorArgMut::new(desc, buffer))
        .collect();
    handle
        .execute(&[TensorArg::new(&input, &INPUT)], &mut output_args, scratch)
        .map_err(|e| format!("executing {op}: {e}"))?;
    drop(output_args);
    Ok(results)
}

/// Resolves `op` for the example tensors, executes it and prints what went in and came out.
fn run_operation(service: &OperationService<'_>, op: &str) -> Result<(), String> {
    let (_, shapes, _) = tensors(op)?;
    let handle = resolve(service, op)?;
    let chosen = handle.describe();
    println!(
        "{op} -> {} from {} {}",
        chosen.impl_id, chosen.package, chosen.package_version
    );
    let need = handle.scratch();
    if need.host_bytes > 0 {
        println!(
            "  scratch   {} bytes, aligned to {}",
            need.host_bytes,
            need.alignment.max(1)
        );
    }
    let results = execute(&handle, op)?;

    println!("  input     {}", rows(&INPUT, INPUT_SHAPE[0]));
    for (i, (result, shape)) in results.iter().zip(&shapes).enumerate() {
        let label = if results.len() == 1 {
            "output".to_string()
        } else {
            format!("output[{i}]")
        };
        println!("  {label:<9} {}", rows(result, shape[0]));
    }

    // 5. Dropping the handle releases the provider: until then its package stays loaded and
    //    cannot be disabled, replaced or rolled back.
    drop(handle);
    Ok(())
}

/// `len` bytes of `buffer` that start at an address aligned to `align` (the buffer has `align`
/// bytes to spare).
fn aligned(buffer: &mut [u8], len: usize, align: usize) -> Result<&mut [u8], String> {
    let start = buffer.as_ptr().align_offset(align);
    buffer
        .get_mut(start..start.saturating_add(len))
        .ok_or_else(|| format!("cannot align {len} bytes of scratch to {align}"))
}

/// The values as rows of `row` elements: `[[1, 2], [3, 4]]`.
fn rows(values: &[i64], row: u64) -> String {
    let rows: Vec<String> = values
        .chunks(row as usize)
        .map(|r| {
            let items: Vec<String> = r.iter().map(i64::to_string).collect();
            format!("[{}]", items.join(", "))
        })
        .collect();
    format!("[{}]", rows.join(", "))
}

/// `1 thing`, `2 things`.
fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}
