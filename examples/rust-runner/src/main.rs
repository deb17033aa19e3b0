//! A minimal runner that embeds `guild-host`.
//!
//! ```text
//! guild-example-runner STORE_DIR [OPERATION...]
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

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use guild_host::prelude::*;

const USAGE: &str = "usage: guild-example-runner STORE_DIR [OPERATION...]";

const DEFAULT_OPERATIONS: &[&str] = &[
    "example.sequence.inclusive_scan",
    "example.sequence.scan_then_total",
];

/// The example input. Axis 0 is the innermost, contiguous one, so the shape `[4, 2]` is two
/// rows of four values each.
const INPUT_SHAPE: [u64; 2] = [4, 2];
const INPUT: [i64; 8] = [1, 2, 3, 4, 10, 20, 30, 40];

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(store) = args.next().map(PathBuf::from) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let mut operations: Vec<String> = args.collect();
    if operations.is_empty() {
        operations = DEFAULT_OPERATIONS.iter().map(|s| s.to_string()).collect();
    }
    match run(&store, &operations) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(store: &Path, operations: &[String]) -> Result<(), String> {
    // Opening the store recovers any interrupted change, re-verifies every enabled package
    // against the trust store and its signed files, and loads them in dependency order. No
    // library is opened before its package has been authenticated.
    // Plugins' log records go to stderr; the devices are detected.
    let OpenedHost { host, report } = Host::builder(store)
        .plugin_log(|package, record| eprintln!("[{package}] {}", record.message))
        .open()
        .map_err(|e| format!("cannot open the store {}: {e}", store.display()))?;
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

/// Resolves `op` for the example tensors, executes it and prints what went in and came out.
fn run_operation(service: &OperationService<'_>, op: &str) -> Result<(), String> {
    let shapes = output_shapes(op)
        .ok_or_else(|| format!("this runner does not know the contract of {op}"))?;
    let name = OpName::new(op).map_err(|e| format!("{op}: {e}"))?;

    // 1. Describe the tensors: element type, shape, where the memory lives.
    let input = TensorDesc::new(DType::I64, &INPUT_SHAPE, MemorySpace::Host);
    let outputs: Vec<TensorDesc> = shapes
        .iter()
        .map(|shape| TensorDesc::new(DType::I64, shape, MemorySpace::Host))
        .collect();

    // 2. Resolve: a host-blocking CPU request for any 1.x version of the operation. A failure
    //    explains, for every candidate, why it was not chosen.
    let request = OperationRequest::cpu(name, vec![input], outputs.clone());
    let handle = service
        .resolve(&request)
        .map_err(|e| format!("resolving {op}: {e}"))?;
    let chosen = handle.describe();
    println!(
        "{op} -> {} from {} {}",
        chosen.impl_id, chosen.package, chosen.package_version
    );

    // 3. The caller owns scratch memory: allocate what the provider asked for, aligned.
    let need = handle.scratch();
    let align = usize::try_from(need.alignment.max(1)).map_err(|e| e.to_string())?;
    let bytes = usize::try_from(need.host_bytes).map_err(|e| e.to_string())?;
    let mut scratch_buffer = vec![0u8; bytes + align];
    let scratch = if bytes == 0 {
        None
    } else {
        println!("  scratch   {bytes} bytes, aligned to {align}");
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
        .map(|(desc, buffer)| TensorArgMut::new(*desc, buffer))
        .collect();
    handle
        .execute(&[TensorArg::new(input, &INPUT)], &mut output_args, scratch)
        .map_err(|e| format!("executing {op}: {e}"))?;
    drop(output_args);

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
