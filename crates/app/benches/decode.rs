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

use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::path::Path;
use std::process::Command;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_op_description_v1_t, guild_op_handle_t,
    guild_operation_query_v1_t, guild_operation_service_v1_t, guild_status_t,
    guild_tensor_desc_v1_t, GUILD_BACKEND_CPU, GUILD_BUDGET_UNLIMITED,
    GUILD_OPERATION_QUERY_VERSION, GUILD_STATUS_OK, GUILD_SYNC_HOST_BLOCKING,
};
use guild_adapters_posix::DlopenLoader;
use guild_domain::operation::{DType, MemorySpace, TensorDesc};
use guild_host::ports::model::ModelFile;
use guild_host::{Host, InstallOptions, OperationService};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

use common::{median, message, recorded, show, Samples};
use decode::{generate, Config, DecodeError, Decoder, In, Ops, Out, Reference, Service, Weights};

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

fn c_tensor(desc: &TensorDesc) -> guild_tensor_desc_v1_t {
    guild_tensor_desc_v1_t {
        dtype: desc.dtype.raw(),
        rank: desc.rank,
        dims: desc.dims,
        strides: desc.strides,
        memory_space: desc.memory_space.bit(),
        device_id: desc.device_id,
        data: ptr::null_mut(),
    }
}

type ExecuteFn = unsafe extern "C" fn(
    *mut c_void,
    *const guild_execute_args_v1_t,
    *mut guild_error_info_t,
) -> guild_status_t;

/// One operation bound for direct calls: the provider's execute and user_data from its GOP1
/// descriptor, and the tensor records. The C handle that keeps the module loaded is held by
/// [`Direct`].
struct DirectHandle {
    execute: ExecuteFn,
    user_data: *mut c_void,
    inputs: Vec<guild_tensor_desc_v1_t>,
    outputs: Vec<guild_tensor_desc_v1_t>,
}

/// [`Ops`] on the module's own functions. Resolution goes through the C service once per
/// operation (to find the provider and hold its library); executes and re-binds do not.
struct Direct {
    table: guild_operation_service_v1_t,
    handles: Cell<Vec<*mut guild_op_handle_t>>,
}

impl Ops for Direct {
    type Handle = DirectHandle;

    fn resolve(
        &self,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<DirectHandle, DecodeError> {
        let name = CString::new(op).unwrap();
        let (ins, outs): (Vec<_>, Vec<_>) = (
            inputs.iter().map(c_tensor).collect(),
            outputs.iter().map(c_tensor).collect(),
        );
        let query = guild_operation_query_v1_t {
            struct_size: size_of::<guild_operation_query_v1_t>() as u32,
            version: GUILD_OPERATION_QUERY_VERSION,
            op_name: name.as_ptr(),
            min_op_version: 0x0100_0000,
            max_op_version: 0x01ff_ffff,
            backends: GUILD_BACKEND_CPU,
            sync_mode: GUILD_SYNC_HOST_BLOCKING,
            required_capabilities: 0,
            required_numerics: 0,
            inputs: ins.as_ptr(),
            input_count: ins.len(),
            outputs: outs.as_ptr(),
            output_count: outs.len(),
            ram_budget: GUILD_BUDGET_UNLIMITED,
            vram_budget: GUILD_BUDGET_UNLIMITED,
            exact_impl_id: ptr::null(),
            device_caps: ptr::null(),
            params: ptr::null(),
            params_size: 0,
        };
        let mut error = guild_error_info_t::new();
        let mut handle = ptr::null_mut();
        // SAFETY: the query, its tensors and name live for the call; `handle` and `error` are
        // live records.
        let status = unsafe {
            self.table.resolve.unwrap()(self.table.user, &query, &mut handle, &mut error)
        };
        assert_eq!(status, GUILD_STATUS_OK, "resolve {op}: {}", message(&error));
        // SAFETY: a zeroed description is a valid bit pattern (NULL pointers, zero numbers).
        let mut d: guild_op_description_v1_t = unsafe { std::mem::zeroed() };
        d.struct_size = size_of::<guild_op_description_v1_t>() as u32;
        // SAFETY: a live handle of this service; `d` and `error` are live records.
        let status =
            unsafe { self.table.describe.unwrap()(self.table.user, handle, &mut d, &mut error) };
        assert_eq!(status, GUILD_STATUS_OK, "describe: {}", message(&error));
        // SAFETY: describe's `operation` is the host's copy of the provider's GOP1 extension,
        // valid while the handle lives (until `Direct` is dropped).
        let gop = unsafe { &*d.operation };
        let mut held = self.handles.take();
        held.push(handle);
        self.handles.set(held);
        Ok(DirectHandle {
            execute: gop.execute.expect("the provider's execute"),
            user_data: gop.user_data,
            inputs: ins,
            outputs: outs,
        })
    }

    fn rebind(
        &self,
        handle: &mut DirectHandle,
        _op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<(), DecodeError> {
        // The module's functions take any shape their contract admits: only the records change.
        handle.inputs = inputs.iter().map(c_tensor).collect();
        handle.outputs = outputs.iter().map(c_tensor).collect();
        Ok(())
    }

    fn execute(
        &self,
        h: &DirectHandle,
        inputs: &[In<'_>],
        outputs: &mut [Out<'_>],
        params: &[u8],
    ) -> Result<(), DecodeError> {
        let mut ins = [h.inputs[0]; 3];
        for (i, input) in inputs.iter().enumerate() {
            ins[i] = h.inputs[i];
            ins[i].data = match input {
                In::F32(d) => d.as_ptr().cast_mut().cast(),
                In::Bytes(d) => d.as_ptr().cast_mut().cast(),
            };
        }
        let mut out = h.outputs[0];
        out.data = match &mut outputs[0] {
            Out::F32(d) => d.as_mut_ptr().cast(),
            Out::I32(d) => d.as_mut_ptr().cast(),
        };
        let args = guild_execute_args_v1_t {
            struct_size: size_of::<guild_execute_args_v1_t>() as u32,
            reserved: 0,
            inputs: ins.as_ptr(),
            input_count: inputs.len(),
            outputs: &out,
            output_count: 1,
            scratch_host: ptr::null_mut(),
            scratch_host_size: 0,
            scratch_device: ptr::null_mut(),
            scratch_device_size: 0,
            stream: ptr::null_mut(),
            device_id: 0,
            sync_mode: GUILD_SYNC_HOST_BLOCKING,
            params: if params.is_empty() {
                ptr::null()
            } else {
                params.as_ptr().cast()
            },
            params_size: params.len(),
        };
        let mut error = guild_error_info_t::new();
        // SAFETY: the provider's own execute and user_data, its library held by the C handle
        // `Direct` keeps;
        // the tensors point at live buffers of the shapes the decode bound, which the loop
        // sizes exactly as it does for the service (which checks them there).
        let status = unsafe { (h.execute)(h.user_data, &args, &mut error) };
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(DecodeError::Execute {
                op: "direct".into(),
                message: message(&error),
            })
        }
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let mut error = guild_error_info_t::new();
        for h in self.handles.take() {
            // SAFETY: a live handle of this service that no other call is using.
            let status = unsafe { self.table.release.unwrap()(self.table.user, h, &mut error) };
            assert_eq!(status, GUILD_STATUS_OK, "release: {}", message(&error));
        }
    }
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
    let direct = Direct {
        table: *host.kernels().operation_api(),
        handles: Cell::new(Vec::new()),
    };

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
