//! G19: a tiny Llama decoded end to end through a signed module. The model and its reference
//! come from `examples/llama-decode/make_tiny_llama.py` (the `gguf` package from PyPI writes the
//! file, numpy computes the greedy tokens and their logits); the module is
//! `test-plugins/llama_ops`, signed and installed like any other; the decode loop is the example
//! runner's own (`examples/llama-decode/src/lib.rs`, included here by path), run through the
//! operation service. The same writer's options write real GGUF conventions (tied embeddings,
//! no freq_base, linear RoPE scaling, Llama 3 rope_freqs, an unimplemented scaling type): each
//! decodes as its reference does or is refused naming the key (G24), and metadata the decode
//! does not implement is refused by name on in-memory models, which need no Python.
//!
//! Without `python3` or the `gguf` and `numpy` packages the decode tests print why and pass,
//! unless `GUILD_REQUIRE_GGUF_PY=1` (CI sets it), which turns the skip into a failure. The
//! module's contract tests need no Python.

use std::path::{Path, PathBuf};
use std::process::Command;

use guild_domain::operation::{DType, MemorySpace, TensorDesc};
use guild_host::operations::{DeviceSupport, ExecuteError, TensorArg, TensorArgMut};
use guild_host::{InstallOptions, OperationRequest, OperationService};
use guild_test_support::guild::Run;
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

use crate::guild;
use crate::operations::{fixture_with, op, Fixture};

#[path = "../../../../examples/llama-decode/src/lib.rs"]
#[allow(dead_code)]
pub(crate) mod decode;

use decode::{generate, Config, Decoder, Reference, Service, Weights, LOGIT_TOLERANCE};

pub(crate) fn llama_spec(version: &str) -> Spec {
    let mut spec = Spec::module("example.llama_ops", version).library(&plugin_library("llama_ops"));
    spec.provided_ops = decode::MODULE_IMPLS.iter().map(|s| s.to_string()).collect();
    spec
}

fn llama_fixture() -> Fixture {
    fixture_with(&[llama_spec("1.0.0")], DeviceSupport::host())
}

/// Runs the Python writer `script` (relative to the workspace) into a fresh directory:
/// `Some(dir)` with what it wrote, or `None` after printing why the test is skipped.
fn written(shop: &Workshop, script: &str) -> Option<PathBuf> {
    written_with(shop, script, &[])
}

/// As [`written`], with `args` after the directory.
fn written_with(shop: &Workshop, script: &str, args: &[&str]) -> Option<PathBuf> {
    let out = shop.fresh("model");
    std::fs::create_dir_all(&out).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(script);
    let run = Command::new("python3")
        .arg(&script)
        .arg(&out)
        .args(args)
        .output();
    let reason = match run {
        Err(e) => format!("python3 cannot be run: {e}"),
        Ok(o) if o.status.success() => return Some(out),
        Ok(o) if o.status.code() == Some(3) => format!(
            "the gguf or numpy Python package is missing ({}); install them with \
             `python3 -m pip install gguf numpy`",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Ok(o) => panic!(
            "{} failed ({}):\n{}",
            script.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ),
    };
    let required = std::env::var("GUILD_REQUIRE_GGUF_PY").is_ok_and(|v| v == "1");
    assert!(!required, "GUILD_REQUIRE_GGUF_PY=1 but {reason}");
    eprintln!(
        "{}: skipped because {reason}; set GUILD_REQUIRE_GGUF_PY=1 to fail instead",
        script.display()
    );
    None
}

/// The tiny Llama and its reference (`make_tiny_llama.py`).
pub(crate) fn tiny_llama(shop: &Workshop) -> Option<PathBuf> {
    tiny_llama_with(shop, &[])
}

/// The tiny Llama written with `make_tiny_llama.py`'s options `args`.
fn tiny_llama_with(shop: &Workshop, args: &[&str]) -> Option<PathBuf> {
    written_with(shop, "examples/llama-decode/make_tiny_llama.py", args)
}

/// The tiny Llama with its weight matrices stored as `dtype` (`make_tiny_llama.py --dtype`).
pub(crate) fn tiny_llama_as(shop: &Workshop, dtype: &str) -> Option<PathBuf> {
    tiny_llama_with(shop, &["--dtype", dtype])
}

/// `model` rebuilt in memory with the tensor `name` replaced by `dtype`, `dims` and `bytes`.
fn with_tensor(
    model: &dyn guild_host::ports::model::ModelFile,
    name: &str,
    dtype: DType,
    dims: &[u64],
    bytes: Vec<u8>,
) -> std::sync::Arc<dyn guild_host::ports::model::ModelFile> {
    let mut fake = guild_ports::fakes::FakeModel::new(model.location());
    for key in model.keys() {
        fake = fake.with_meta(key, model.metadata(key).unwrap().clone());
    }
    for (i, t) in model.tensors().iter().enumerate() {
        fake = if t.name == name {
            fake.with_tensor_data(name, dtype.raw(), dims, bytes.clone())
        } else {
            fake.with_tensor_data(
                &t.name,
                t.dtype,
                &t.dims,
                model.tensor_data(i).unwrap().to_vec(),
            )
        };
    }
    fake.into_arc()
}

#[test]
fn a_model_this_runner_cannot_run_is_refused_naming_the_key_or_tensor() {
    let shop = Workshop::new();
    // The GGUF reader's own fixtures: a llama whose projections are Q8_0 and Q4_0 and whose
    // embedding and output are F16, and a file of another architecture.
    let Some(dir) = written(&shop, "crates/adapters-fs/tests/fixtures/write_gguf.py") else {
        return;
    };
    let f = llama_fixture();
    let read = |name: &str| f.host.models().read_file(&dir.join(name)).unwrap();

    let other = read("types.gguf");
    assert_eq!(
        Config::from_model(other.as_ref()).unwrap_err(),
        decode::DecodeError::Model(
            "general.architecture is Some(Str(\"guild-test\")), not \"llama\"".into()
        )
    );
    // Those storage types are taken, each matvec and the embedding resolved for its own.
    let mixed = read("llama.gguf");
    let cfg = Config::from_model(mixed.as_ref()).unwrap();
    assert_eq!((cfg.n_layer, cfg.n_embd, cfg.n_vocab), (1, 32, 8));
    let weights = Weights::from_model(&mixed, &cfg).unwrap();
    let dtypes: Vec<String> = weights
        .matrix_dtypes()
        .iter()
        .map(|(name, d)| format!("{name} {d}"))
        .collect();
    assert_eq!(
        dtypes.join(", "),
        "token_embd f16, attn_q q8_0, attn_k q8_0, attn_v q8_0, attn_output q8_0, \
         ffn_gate q4_0, ffn_up q4_0, ffn_down q4_0, output f16"
    );
    let ops = Service::new(OperationService::new(f.host.kernels()));
    let decoder = Decoder::new(cfg, weights, &ops).unwrap();
    assert_eq!(decoder.bound().handles, 14);
    drop(decoder);

    // What it does not take is refused before any handle is resolved, naming the tensor: a
    // block type the module has no matvec for, a norm vector that is not f32, the two matrices
    // one handle serves stored unlike, and a matrix whose bytes are not its dtype's size.
    let refused = |model: std::sync::Arc<dyn guild_host::ports::model::ModelFile>| {
        let cfg = Config::from_model(model.as_ref()).unwrap();
        match Weights::from_model(&model, &cfg).unwrap_err() {
            decode::DecodeError::Model(m) => m,
            other => panic!("{other:?}"),
        }
    };
    let q4_1 = with_tensor(
        mixed.as_ref(),
        "blk.0.attn_q.weight",
        DType::Q4_1,
        &[32, 32],
        vec![0; 32 * 20],
    );
    assert_eq!(
        refused(q4_1),
        "tensor blk.0.attn_q.weight is q4_1 with dims [32, 32]; this runner needs [32, 32] stored \
         as f32, f16, bf16, q8_0 or q4_0"
    );
    let f16_norm = with_tensor(
        mixed.as_ref(),
        "blk.0.ffn_norm.weight",
        DType::F16,
        &[32],
        vec![0; 64],
    );
    assert_eq!(
        refused(f16_norm),
        "tensor blk.0.ffn_norm.weight is dtype 1 with dims [32]; this runner needs f32 [32]"
    );
    let unlike = with_tensor(
        mixed.as_ref(),
        "blk.0.attn_v.weight",
        DType::Q4_0,
        &[32, 16],
        vec![0; 16 * 18],
    );
    assert_eq!(
        refused(unlike),
        "tensor blk.0.attn_v.weight is q4_0 but blk.0.attn_k.weight is q8_0; this runner \
         resolves one matvec for both, so they must be stored alike"
    );
    // 32 bytes a block, as if the f16 scale were not stored.
    let short = with_tensor(
        mixed.as_ref(),
        "blk.0.attn_q.weight",
        DType::Q8_0,
        &[32, 32],
        vec![0; 32 * 32],
    );
    assert_eq!(
        refused(short),
        "tensor blk.0.attn_q.weight holds 1024 bytes; q8_0 [32, 32] is 1088"
    );
}

#[test]
fn tiny_llama_decodes_through_the_service_as_the_numpy_reference_does() {
    let f = llama_fixture();
    let Some(dir) = tiny_llama(&f.shop) else {
        return;
    };
    let reference = Reference::read(&dir.join("tiny-llama.reference.json")).unwrap();
    assert_eq!(reference.tokens.len(), 16);
    // Equal tokens mean something only if no step was a near tie at this tolerance.
    assert!(
        reference.min_top2_margin > 100.0 * f64::from(LOGIT_TOLERANCE),
        "the reference has a near tie ({}); pick another seed",
        reference.min_top2_margin
    );

    // The host's own GGUF reader, through guild-host.
    let model = f
        .host
        .models()
        .read_file(&dir.join("tiny-llama.gguf"))
        .unwrap();
    let cfg = Config::from_model(model.as_ref()).unwrap();
    assert_eq!(
        (
            cfg.n_layer,
            cfg.n_embd,
            cfg.n_head,
            cfg.n_head_kv,
            cfg.n_vocab
        ),
        (2, 64, 4, 2, 256)
    );
    let weights = Weights::from_model(&model, &cfg).unwrap();
    let ops = Service::new(OperationService::new(f.host.kernels()));
    let mut decoder = Decoder::new(cfg, weights, &ops).unwrap();
    // Fourteen handles, all into the one module.
    assert_eq!(
        f.host
            .kernels()
            .live_bindings(&guild_test_support::id("example.llama_ops")),
        14
    );

    let got = generate(&mut decoder, &reference.prompt, reference.tokens.len()).unwrap();
    assert_eq!(got.tokens, reference.tokens);
    let c = reference.compare(&got);
    eprintln!(
        "tiny llama: tokens match; largest logit error {:.2e} (tolerance {LOGIT_TOLERANCE:.0e})",
        c.max_logit_error
    );
    assert!(c.logits_shape_match);
    assert!(
        c.max_logit_error <= LOGIT_TOLERANCE,
        "largest logit error {} over the tolerance {LOGIT_TOLERANCE}",
        c.max_logit_error
    );

    // One forward pass per prompt token and per decoded token but the last; the embedding
    // lookup, 15 calls per layer and 2 for the output per pass, plus one argmax per decoded
    // token; the attention re-bound before every pass but the first.
    let steps = (reference.prompt.len() + reference.tokens.len() - 1) as u64;
    let counts = decoder.counts();
    assert_eq!(counts.steps, steps);
    assert_eq!(
        counts.calls,
        steps * (1 + 15 * 2 + 2) + reference.tokens.len() as u64
    );
    assert_eq!(counts.rebinds, steps - 1);
    drop(decoder);
    assert_eq!(
        f.host
            .kernels()
            .live_bindings(&guild_test_support::id("example.llama_ops")),
        0
    );
}

/// Every storage type of the weight matrices decodes as its reference does, within the same
/// tolerance as f32 ([`LOGIT_TOLERANCE`], 1e-4 relative above 1, absolute below): the reference
/// multiplies the very values the file stores (dequantized as the format defines, each exact in
/// f32) with f32 activations, as the module does, so what remains between them is the order of
/// the f32 sums, as for f32 weights (about 2e-6 for every dtype here). The storage itself moves
/// the first step's logits, against the f32 weights the matrices were drawn as, by 1.6e-3
/// (f16), 1.4e-2 (bf16), 3.7e-2 (q8_0) and 0.69 (q4_0): 16 to 7,000 times the tolerance, so a
/// misread scale, block or nibble order cannot hide under it.
#[test]
fn each_weight_dtype_decodes_through_the_service_as_its_numpy_reference_does() {
    let f = llama_fixture();
    for dtype in ["f16", "bf16", "q8_0", "q4_0"] {
        let Some(dir) = tiny_llama_as(&f.shop, dtype) else {
            return;
        };
        // The matvecs and the embedding were resolved to the implementations of that dtype.
        let model = f
            .host
            .models()
            .read_file(&dir.join("tiny-llama.gguf"))
            .unwrap();
        let stored = model
            .tensors()
            .iter()
            .find(|t| t.name == "blk.0.attn_q.weight")
            .unwrap();
        assert_eq!(DType::from_raw(stored.dtype).to_string(), dtype);
        let service = OperationService::new(f.host.kernels());
        for (op_name, inputs, output) in [
            (
                "example.llama.matvec",
                vec![
                    TensorDesc::new(DType::from_raw(stored.dtype), &[64, 64], MemorySpace::Host),
                    f32s(&[64]),
                ],
                f32s(&[64]),
            ),
            (
                "example.llama.embed",
                vec![TensorDesc::new(
                    DType::from_raw(stored.dtype),
                    &[64, 256],
                    MemorySpace::Host,
                )],
                f32s(&[64]),
            ),
        ] {
            let handle = service
                .resolve(&OperationRequest::cpu(op(op_name), inputs, vec![output]))
                .unwrap();
            assert_eq!(
                handle.describe().impl_id.to_string(),
                format!("{op_name}.{dtype}.cpu")
            );
        }
        decodes_as_its_reference(&f, &dir, &format!("tiny llama, {dtype} weights"));
    }
}

/// A q8_0 block: the f16 scale `d` (its bits), then 32 signed values.
fn q8_0_block(d: u16, q: impl Fn(usize) -> i8) -> Vec<u8> {
    let mut b = d.to_le_bytes().to_vec();
    b.extend((0..32).map(|i| q(i) as u8));
    b
}

/// A q4_0 block: the f16 scale `d`, then 16 bytes holding nibbles `n(i)` (element i in the
/// low nibble of byte i, element i + 16 in its high nibble).
fn q4_0_block(d: u16, n: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut b = d.to_le_bytes().to_vec();
    b.extend((0..16).map(|i| n(i) & 0x0f | (n(i + 16) & 0x0f) << 4));
    b
}

/// One call of `op_name` through the service on host buffers: `inputs` as (descriptor,
/// bytes), an f32 output of `n`, `params`.
fn call(
    service: &OperationService<'_>,
    op_name: &str,
    inputs: &[(TensorDesc, &[u8])],
    n: u64,
    params: &[u8],
) -> Result<Vec<f32>, ExecuteError> {
    let out = f32s(&[n]);
    let descs: Vec<TensorDesc> = inputs.iter().map(|(d, _)| *d).collect();
    let handle = service
        .resolve(&OperationRequest::cpu(
            op(op_name),
            descs.clone(),
            vec![out],
        ))
        .unwrap();
    let mut y = vec![0.0f32; n as usize];
    let args: Vec<TensorArg<'_>> = inputs
        .iter()
        .zip(&descs)
        .map(|((_, bytes), d)| TensorArg::new(d, bytes))
        .collect();
    handle.execute_with_params(&args, &mut [TensorArgMut::new(&out, &mut y)], None, params)?;
    Ok(y)
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn embed_row(row: u32) -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&8u32.to_ne_bytes());
    p[4..].copy_from_slice(&row.to_ne_bytes());
    p
}

/// Without Python: the module's stored-weight operations compute what each format defines, on
/// blocks built here by hand (q8_0 d * q; q4_0 d * (nibble - 8), low nibbles first; f16 with a
/// subnormal, the largest finite value and a negative zero; bf16 the high half of an f32).
#[test]
fn the_stored_weight_operations_compute_what_each_format_defines() {
    let f = llama_fixture();
    let service = OperationService::new(f.host.kernels());
    let host = |dtype: DType, dims: &[u64]| TensorDesc::new(dtype, dims, MemorySpace::Host);

    // Two rows of two q8_0 blocks: row 0 has d = 0.5 (0x3800) and q = i - 16 in block 0,
    // d = -2 (0xc000) and q = 127 - i in block 1; row 1 has d = 2^-24 (the smallest f16
    // subnormal, 0x0001) and q = -128 in block 0, d = 0 in block 1.
    let mut q8 = q8_0_block(0x3800, |i| i as i8 - 16);
    q8.extend(q8_0_block(0xc000, |i| 127 - i as i8));
    q8.extend(q8_0_block(0x0001, |_| -128));
    q8.extend(q8_0_block(0x0000, |_| 5));
    let want_q8: Vec<Vec<f32>> = vec![
        (0..64)
            .map(|i| {
                if i < 32 {
                    0.5 * (i as f32 - 16.0)
                } else {
                    -2.0 * (127.0 - (i - 32) as f32)
                }
            })
            .collect(),
        (0..64)
            .map(|i| if i < 32 { -128.0 * 2f32.powi(-24) } else { 0.0 })
            .collect(),
    ];
    // Two rows of one q4_0 block: d = 0.25 (0x3400), nibble i % 16; d = -1 (0xbc00), 15 - i % 16.
    let mut q4 = q4_0_block(0x3400, |i| (i % 16) as u8);
    q4.extend(q4_0_block(0xbc00, |i| 15 - (i % 16) as u8));
    let want_q4: Vec<Vec<f32>> = vec![
        (0..32).map(|i| 0.25 * ((i % 16) as f32 - 8.0)).collect(),
        (0..32).map(|i| -(7.0 - (i % 16) as f32)).collect(),
    ];
    // One row of f16 and of bf16 values.
    let f16_bits: [u16; 6] = [0x0001, 0x3c00, 0xc000, 0x7bff, 0x0400, 0x8000];
    let want_f16 = [2f32.powi(-24), 1.0, -2.0, 65504.0, 2f32.powi(-14), -0.0];
    let bf16_vals = [1.5f32, -3.0e-3, 65536.0, -0.0, 1.0e30, 7.0];
    let bf16_bits: Vec<u16> = bf16_vals
        .iter()
        .map(|v| (v.to_bits() >> 16) as u16)
        .collect();
    let want_bf16: Vec<f32> = bf16_bits
        .iter()
        .map(|&b| f32::from_bits(u32::from(b) << 16))
        .collect();
    let u16_bytes = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|b| b.to_le_bytes()).collect() };

    let cases = vec![
        (DType::Q8_0, 64, q8, want_q8),
        (DType::Q4_0, 32, q4, want_q4),
        (DType::F16, 6, u16_bytes(&f16_bits), vec![want_f16.to_vec()]),
        (DType::BF16, 6, u16_bytes(&bf16_bits), vec![want_bf16]),
    ];
    for (dtype, n, bytes, rows) in &cases {
        let table = host(*dtype, &[*n, rows.len() as u64]);
        // The embedding returns each row exactly, bit for bit (the sign of -0 included).
        for (r, want) in rows.iter().enumerate() {
            let got = call(
                &service,
                "example.llama.embed",
                &[(table, bytes)],
                *n,
                &embed_row(r as u32),
            )
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(want), "{dtype} embed row {r}");
        }
        // The matvec is the dequantized rows times x, summed in index order in f32.
        let x: Vec<f32> = (0..*n).map(|i| 1.0 - 0.03125 * i as f32).collect();
        let got = call(
            &service,
            "example.llama.matvec",
            &[(table, bytes), (f32s(&[*n]), &le_bytes(&x))],
            rows.len() as u64,
            &[],
        )
        .unwrap();
        let want: Vec<f32> = rows
            .iter()
            .map(|row| row.iter().zip(&x).fold(0.0f32, |acc, (w, x)| acc + w * x))
            .collect();
        assert_eq!(got, want, "{dtype} matvec");
    }
}

/// Malformed descriptors of stored weights are refused by the host before the provider runs,
/// each error naming the tensor and what failed: a row that is not whole blocks, a stride on
/// the first axis, an outer stride counted in elements instead of blocks, a buffer sized
/// without the blocks' scales, and misaligned data (at resolve and at execute). An embedding
/// table of a block type no implementation takes is refused by every candidate's contract.
#[test]
fn malformed_quantized_descriptors_are_refused_through_the_service_naming_what_failed() {
    let f = llama_fixture();
    let service = OperationService::new(f.host.kernels());
    let matvec = |w: TensorDesc, n_in: u64, n_out: u64| {
        OperationRequest::cpu(
            op("example.llama.matvec"),
            vec![w, f32s(&[n_in])],
            vec![f32s(&[n_out])],
        )
    };
    let q8 = |dims: &[u64]| TensorDesc::new(DType::Q8_0, dims, MemorySpace::Host);

    // dims[0] = 48 is a block and a half.
    let err = service.resolve(&matvec(q8(&[48, 4]), 48, 4)).unwrap_err();
    assert!(
        err.to_string().contains(
            "input 0 is invalid: innermost extent 48 is not a multiple of the q8_0 block of 32 \
             elements"
        ),
        "{err}"
    );
    // A stride on the first axis (34, the block's bytes): the first axis is walked block by
    // block and its stride must be 0.
    let err = service
        .resolve(&matvec(q8(&[64, 4]).with_strides(&[34, 0]), 64, 4))
        .unwrap_err();
    assert!(
        err.to_string().contains(
            "input 0 is invalid: strides[0] is 34; the innermost axis is contiguous and its \
             stride must be 0"
        ),
        "{err}"
    );
    // An outer stride of 64 elements where a row is 2 blocks: a valid but outer-strided
    // tensor of 32 blocks a row, which the contiguous-only contract refuses.
    let err = service
        .resolve(&matvec(q8(&[64, 4]).with_strides(&[0, 64]), 64, 4))
        .unwrap_err();
    let failure = err.failure().expect("a resolution report");
    let q8_impl = failure
        .rejections
        .iter()
        .find(|r| r.impl_id.to_string() == "example.llama.matvec.q8_0.cpu")
        .expect("the q8_0 matvec was a candidate");
    assert_eq!(
        q8_impl.reason.to_string(),
        "input 0 is outer-strided, the provider accepts contiguous"
    );
    // A q8_0 [64, 4] spans 4 rows of 2 blocks of 34 bytes; a buffer of 32 bytes a block (the
    // scales forgotten) is refused before the provider reads past it.
    let w = q8(&[64, 4]);
    let handle = service.resolve(&matvec(w, 64, 4)).unwrap();
    let (x, mut y) = (vec![1.0f32; 64], vec![0.0f32; 4]);
    let (xd, yd) = (f32s(&[64]), f32s(&[4]));
    let short = vec![0u8; 4 * 2 * 32];
    let err = handle
        .execute(
            &[TensorArg::new(&w, &short), TensorArg::new(&xd, &x)],
            &mut [TensorArgMut::new(&yd, &mut y)],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(err, ExecuteError::BufferTooSmall { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "input 0 spans 272 bytes but its buffer has 256"
    );
    // The weight at an address 2 mod 4 (the contract asks 4): refused at execute, and at
    // resolve when the query gives the address.
    let backing = vec![0u8; 272 + 8];
    let offset = (2 + 4 - backing.as_ptr() as usize % 4) % 4;
    let misaligned = &backing[offset..offset + 272];
    let err = handle
        .execute(
            &[TensorArg::new(&w, misaligned), TensorArg::new(&xd, &x)],
            &mut [TensorArgMut::new(&yd, &mut y)],
            None,
        )
        .unwrap_err();
    let want = format!(
        "input 0 data at {:#x} is not aligned to 4 bytes",
        misaligned.as_ptr() as usize
    );
    assert!(err.to_string().contains(&want), "{err}");
    assert_eq!(y, vec![0.0f32; 4], "a refused call wrote its output");
    let err = service
        .resolve(&matvec(w.with_data_addr(0x1002), 64, 4))
        .unwrap_err();
    let failure = err.failure().expect("a resolution report");
    let q8_impl = failure
        .rejections
        .iter()
        .find(|r| r.impl_id.to_string() == "example.llama.matvec.q8_0.cpu")
        .expect("the q8_0 matvec was a candidate");
    assert_eq!(
        q8_impl.reason.to_string(),
        "input 0 data at 0x1002 is not aligned to 4 bytes"
    );

    // A q4_1 table: the embeddings' contracts each name their own dtype, so the host refuses
    // every candidate on the descriptor alone, and the matvecs' validates refuse the weight.
    let q4_1 = TensorDesc::new(DType::Q4_1, &[64, 8], MemorySpace::Host);
    let err = service
        .resolve(&OperationRequest::cpu(
            op("example.llama.embed"),
            vec![q4_1],
            vec![f32s(&[64])],
        ))
        .unwrap_err();
    let failure = err.failure().expect("a resolution report");
    assert_eq!(failure.rejections.len(), 5, "{err}");
    for r in &failure.rejections {
        assert!(
            r.reason
                .to_string()
                .starts_with("input 0 is q4_1, the provider takes "),
            "{}: {}",
            r.impl_id,
            r.reason
        );
    }
    let err = service.resolve(&matvec(q4_1, 64, 8)).unwrap_err();
    let failure = err.failure().expect("a resolution report");
    let q8_impl = failure
        .rejections
        .iter()
        .find(|r| r.impl_id.to_string() == "example.llama.matvec.q8_0.cpu")
        .expect("the q8_0 matvec was a candidate");
    assert!(
        q8_impl.reason.to_string().contains("input 0 must be q8_0"),
        "{}",
        q8_impl.reason
    );
    // And a row past the table is refused by the embedding's validate.
    let table = q8(&[64, 8]);
    let err = service
        .resolve_with_params(
            &OperationRequest::cpu(op("example.llama.embed"), vec![table], vec![f32s(&[64])]),
            &embed_row(8),
        )
        .unwrap_err();
    assert!(err.to_string().contains("a row below 8"), "{err}");
}

#[test]
fn a_decode_past_the_context_is_refused_before_any_call() {
    let f = llama_fixture();
    let Some(dir) = tiny_llama(&f.shop) else {
        return;
    };
    let model = f
        .host
        .models()
        .read_file(&dir.join("tiny-llama.gguf"))
        .unwrap();
    let cfg = Config::from_model(model.as_ref()).unwrap();
    let weights = Weights::from_model(&model, &cfg).unwrap();
    let ops = Service::new(OperationService::new(f.host.kernels()));
    let mut decoder = Decoder::new(cfg, weights, &ops).unwrap();
    assert!(matches!(
        decoder.step(cfg.n_vocab as u32),
        Err(decode::DecodeError::Input(_))
    ));
    assert_eq!(decoder.counts().calls, 0);
    let err = generate(&mut decoder, &[1], cfg.n_ctx + 1).unwrap_err();
    assert_eq!(
        err,
        decode::DecodeError::Input(format!("the context of {} positions is full", cfg.n_ctx))
    );
    assert_eq!(decoder.counts().steps, cfg.n_ctx as u64);
}

pub(crate) fn f32s(dims: &[u64]) -> TensorDesc {
    TensorDesc::new(DType::F32, dims, MemorySpace::Host)
}

/// The reason the module's validate gave for the f32 implementation of `name` (`<name>.cpu`,
/// the only one but for the matvec, whose other implementations refuse a weight of another
/// dtype).
fn refusal(
    service: &OperationService<'_>,
    name: &str,
    i: &[TensorDesc],
    o: &[TensorDesc],
) -> String {
    let err = service
        .resolve(&OperationRequest::cpu(op(name), i.to_vec(), o.to_vec()))
        .unwrap_err();
    let failure = err.failure().expect("a resolution report");
    let f32_impl = format!("{name}.cpu");
    failure
        .rejections
        .iter()
        .find(|r| r.impl_id.to_string() == f32_impl)
        .unwrap_or_else(|| panic!("{f32_impl} was not a candidate: {err}"))
        .reason
        .to_string()
}

#[test]
fn the_module_refuses_the_shapes_and_records_it_does_not_compute() {
    let f = llama_fixture();
    let service = OperationService::new(f.host.kernels());
    let cases: [(&str, Vec<TensorDesc>, Vec<TensorDesc>, &str); 6] = [
        (
            "example.llama.matvec",
            vec![f32s(&[64, 32]), f32s(&[63])],
            vec![f32s(&[32])],
            "matvec takes packed W [in, out], x [in] and y [out]",
        ),
        (
            "example.llama.attention",
            vec![f32s(&[16, 4]), f32s(&[16, 3, 5]), f32s(&[16, 3, 5])],
            vec![f32s(&[16, 4])],
            "with Hkv dividing H",
        ),
        (
            "example.llama.attention",
            vec![f32s(&[512, 2]), f32s(&[512, 1, 5]), f32s(&[512, 1, 5])],
            vec![f32s(&[512, 2])],
            "head size 512 is over this attention's 256",
        ),
        (
            "example.llama.attention",
            vec![f32s(&[16, 4]), f32s(&[16, 2, 5]), f32s(&[16, 2, 6])],
            vec![f32s(&[16, 4])],
            "k and v [d, Hkv, T]",
        ),
        (
            "example.llama.rope",
            vec![f32s(&[15, 4])],
            vec![f32s(&[15, 4])],
            "with d even",
        ),
        (
            "example.llama.argmax",
            vec![f32s(&[256])],
            vec![TensorDesc::new(DType::I32, &[2], MemorySpace::Host)],
            "writes one i32",
        ),
    ];
    for (name, inputs, outputs, why) in &cases {
        let reason = refusal(&service, name, inputs, outputs);
        assert!(reason.contains(why), "{name}: {reason}");
    }

    // A parameter record of the wrong size is refused at resolve, and a call without the
    // record the operation needs is refused by its execute.
    let x = f32s(&[64]);
    let request = OperationRequest::cpu(op("example.llama.rmsnorm"), vec![x, x], vec![x]);
    let err = service
        .resolve_with_params(&request, &[0u8; 4])
        .unwrap_err();
    assert!(err.to_string().contains("8-byte parameter record"), "{err}");
    let handle = service.resolve(&request).unwrap();
    let (a, w) = (vec![1.0f32; 64], vec![1.0f32; 64]);
    let mut y = vec![0.0f32; 64];
    let err = handle
        .execute(
            &[TensorArg::new(&x, &a), TensorArg::new(&x, &w)],
            &mut [TensorArgMut::new(&x, &mut y)],
            None,
        )
        .unwrap_err();
    assert!(matches!(err, ExecuteError::Provider(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("rmsnorm needs its 8-byte parameter record"),
        "{err}"
    );
    assert_eq!(y, vec![0.0f32; 64]);
}

/// example.llama.rope's record: the 12-byte 1.0.0 one, or with `scale` the 16-byte 1.1.0 one.
fn rope_record(position: u32, base: f32, scale: Option<f32>) -> Vec<u8> {
    let size: u32 = if scale.is_some() { 16 } else { 12 };
    let mut p = size.to_ne_bytes().to_vec();
    p.extend_from_slice(&position.to_ne_bytes());
    p.extend_from_slice(&base.to_ne_bytes());
    if let Some(scale) = scale {
        p.extend_from_slice(&scale.to_ne_bytes());
    }
    p
}

#[test]
fn the_rope_takes_the_old_record_the_scaled_one_and_optional_frequency_factors() {
    let f = llama_fixture();
    let service = OperationService::new(f.host.kernels());
    let x = f32s(&[4, 2]);
    let factors = f32s(&[2]);
    let plain = service
        .resolve(&OperationRequest::cpu(
            op("example.llama.rope"),
            vec![x],
            vec![x],
        ))
        .unwrap();
    assert_eq!(plain.describe().op_version.to_string(), "1.1.0");
    let with_factors = service
        .resolve(&OperationRequest::cpu(
            op("example.llama.rope"),
            vec![x, factors],
            vec![x],
        ))
        .unwrap();
    let input: Vec<f32> = (1..=8).map(|v| v as f32 * 0.25).collect();
    let rope = |h: &guild_host::OpHandle<'_>, factors: Option<&[f32]>, params: &[u8]| {
        let mut y = vec![0.0f32; 8];
        let descs = h.inputs();
        let r = match factors {
            None => h.execute_with_params(
                &[TensorArg::new(&descs[0], &input)],
                &mut [TensorArgMut::new(&x, &mut y)],
                None,
                params,
            ),
            Some(ff) => h.execute_with_params(
                &[
                    TensorArg::new(&descs[0], &input),
                    TensorArg::new(&descs[1], ff),
                ],
                &mut [TensorArgMut::new(&x, &mut y)],
                None,
                params,
            ),
        };
        r.map(|()| y)
    };
    // Position 1 unscaled, through the 1.0.0 record: the reference rotation.
    let at_one = rope(&plain, None, &rope_record(1, 10000.0, None)).unwrap();
    assert_ne!(at_one, input);
    // Position 2 scaled by 1/2, and position 2 with every factor 2: the same angles exactly.
    let scaled = rope(&plain, None, &rope_record(2, 10000.0, Some(0.5))).unwrap();
    assert_eq!(scaled, at_one);
    let divided = rope(
        &with_factors,
        Some(&[2.0, 2.0]),
        &rope_record(2, 10000.0, None),
    )
    .unwrap();
    assert_eq!(divided, at_one);
    // A factor per pair: the first pair at position 1, the second as if at 1/4.
    let mixed = rope(
        &with_factors,
        Some(&[1.0, 4.0]),
        &rope_record(1, 10000.0, None),
    )
    .unwrap();
    assert_eq!(mixed[..2], at_one[..2]);
    assert_ne!(mixed[2..4], at_one[2..4]);

    // Factors of another length are refused at resolve, a factor that cannot divide at the
    // call, and so are records of the wrong size or scale.
    let reason = refusal(&service, "example.llama.rope", &[x, f32s(&[3])], &[x]);
    assert!(
        reason.contains("rope's frequency factors are a packed vector of d/2 = 2"),
        "{reason}"
    );
    let err = rope(
        &with_factors,
        Some(&[1.0, 0.0]),
        &rope_record(1, 10000.0, None),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("rope's frequency factors must be finite and > 0"),
        "{err}"
    );
    let mut mislabelled = rope_record(1, 10000.0, Some(0.5));
    mislabelled[..4].copy_from_slice(&12u32.to_ne_bytes());
    for (record, why) in [
        (
            rope_record(1, 10000.0, Some(0.0)),
            "a finite freq_scale > 0",
        ),
        (
            rope_record(1, 10000.0, Some(f32::INFINITY)),
            "a finite freq_scale > 0",
        ),
        (mislabelled, "struct_size equal to its size"),
        (vec![0u8; 20], "or the 16-byte one (and freq_scale)"),
    ] {
        let err = rope(&plain, None, &record).unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
}

/// The runner binary, built with cargo once per test run.
fn decode_binary() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        guild_test_support::cargo_binary("guild-llama-decode", "guild-llama-decode")
    })
}

/// A store with the llama operations module 1.0.0, prepared as an operator prepares one and
/// closed again before a runner opens it.
fn operator_store(shop: &Workshop) -> PathBuf {
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    pm.install(
        &shop.build(&llama_spec("1.0.0"), &k).archive,
        InstallOptions::default(),
    )
    .unwrap();
    store
}

#[test]
fn the_runner_binary_decodes_from_a_store_and_fails_on_a_reference_it_does_not_match() {
    let shop = Workshop::new();
    let Some(dir) = tiny_llama(&shop) else {
        return;
    };
    let store = operator_store(&shop);

    let model = dir.join("tiny-llama.gguf");
    let reference_path = dir.join("tiny-llama.reference.json");
    let reference = Reference::read(&reference_path).unwrap();
    let run = |reference: &Path| {
        let out = Command::new(decode_binary())
            .arg(&store)
            .arg(&model)
            .arg("--reference")
            .arg(reference)
            .output()
            .expect("the runner starts");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&reference_path);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let tokens: Vec<String> = reference.tokens.iter().map(u32::to_string).collect();
    assert!(
        stdout.contains(&format!("\ndecode 1 tokens: {}\n", tokens.join(" "))),
        "{stdout}"
    );
    assert!(
        stdout.contains("decode 1 reference: tokens match;"),
        "{stdout}"
    );
    assert!(
        stdout.contains("decode 1: 21 forward passes in ")
            && stdout.contains(" 34 operation calls per token"),
        "{stdout}"
    );

    // The same run against a reference whose first token is another one fails.
    let mut altered: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&reference_path).unwrap()).unwrap();
    let first = altered["tokens"][0].as_u64().unwrap();
    altered["tokens"][0] = ((first + 1) % 256).into();
    let altered_path = dir.join("altered.reference.json");
    std::fs::write(&altered_path, altered.to_string()).unwrap();
    let (code, stdout, stderr) = run(&altered_path);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("decode 1 reference: tokens DIFFER;"),
        "{stdout}"
    );
    assert!(stderr.contains("does not match the reference"), "{stderr}");
}

#[test]
fn the_runner_binary_decodes_a_real_convention_file_says_what_it_read_and_refuses_yarn_by_key() {
    let shop = Workshop::new();
    let Some(dir) = tiny_llama_with(
        &shop,
        &[
            "--tied",
            "--no-freq-base",
            "--scaling-type",
            "linear",
            "--scaling-factor",
            "2",
            "--rope-freqs",
        ],
    ) else {
        return;
    };
    let yarn = tiny_llama_with(&shop, &["--scaling-type", "yarn", "--scaling-factor", "4"])
        .expect("python3 ran for the first file");
    let store = operator_store(&shop);
    let run = |dir: &Path, reference: bool| {
        let mut command = Command::new(decode_binary());
        command.arg(&store).arg(dir.join("tiny-llama.gguf"));
        if reference {
            command
                .arg("--reference")
                .arg(dir.join("tiny-llama.reference.json"));
        }
        let out = command.output().expect("the runner starts");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&dir, true);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "; rope base 10000, linear scaling (freq_scale 0.5), rope_freqs, tied embeddings\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("decode 1 reference: tokens match;"),
        "{stdout}"
    );

    // A yarn file is refused before the first token, naming the key and the value.
    let (code, stdout, stderr) = run(&yarn, false);
    assert_ne!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("decode 1"), "{stdout}");
    assert!(
        stderr.contains("llama.rope.scaling.type is \"yarn\""),
        "{stderr}"
    );
}

#[test]
fn the_manifest_template_lists_what_the_module_registers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/modules/llama_ops/manifest.json");
    let template: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let listed: Vec<&str> = template["provided_ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(listed, decode::MODULE_IMPLS);
    assert_eq!(template["entry"], "lib/libllama_ops.so");
    // The library registers exactly those (registration checks it at install).
    let f = llama_fixture();
    for impl_id in decode::MODULE_IMPLS {
        let id = guild_host::ImplId::new(impl_id).unwrap();
        assert!(f.host.kernels().find_by_id(&id).is_some(), "{impl_id}");
    }
}

/// How long the stepped runner may take to print its next line: only a hang exceeds it (a
/// deadlock guard, not a timing assertion).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// The builds of `test-plugins/llama_ops` that the live test installs as 1.0.0 and 1.1.0: the
/// same source, each naming itself in the marker log on every call it computes.
const BUILD_1_0: &str = "llama_ops_v1";
const BUILD_1_1: &str = "llama_ops_v2";

/// A `guild-llama-decode --step` process: it waits for one line on its stdin before each token.
struct Stepped {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    /// The marker log the module builds write, and how many of its lines were checked.
    log: PathBuf,
    logged: usize,
}

impl Stepped {
    /// The next line the runner prints, which must start with `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(line) if line.starts_with(prefix) => {
                println!("runner: {line}");
                line
            }
            Ok(line) => panic!("expected a line starting {prefix:?}, got {line:?}"),
            Err(e) => panic!(
                "no line starting {prefix:?} within {PATIENCE:?} ({e}); the runner: {:?}",
                self.child.try_wait()
            ),
        }
    }

    /// Lets the runner decode one token and checks its line: the token, the package version
    /// its handles are bound to and whether they are current, and that every call the token
    /// took ran the code of `build`, as the module's marker log says.
    fn token(&mut self, decode: usize, i: usize, token: u32, bound: &str, build: &str) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().expect("the runner's stdin is open");
        writeln!(stdin, "next").expect("the runner reads its stdin");
        let line = self.expect(&format!("decode {decode} token {i}: "));
        let rest = line.split_once(": ").unwrap().1;
        let (got, rest) = rest.split_once(" (").unwrap();
        let (calls, rest) = rest.split_once(" calls; ").unwrap();
        assert_eq!(got, token.to_string(), "{line}");
        assert_eq!(rest, format!("{bound})"), "{line}");
        let calls: usize = calls.parse().unwrap();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let new: Vec<&str> = log.lines().skip(self.logged).collect();
        assert_eq!(new.len(), calls, "{line}: the module logged {new:?}");
        for call in &new {
            let (who, impl_id) = call.split_once(' ').unwrap();
            assert_eq!(who, build, "{line}: {impl_id} ran another build's code");
        }
        self.logged += new.len();
    }

    /// Lets the runner decode tokens `range` of decode `decode`, checking each: all 14
    /// handles on `version` and current, every call run by `build`.
    fn tokens(
        &mut self,
        decode: usize,
        range: std::ops::RangeInclusive<usize>,
        want: &[u32],
        version: &str,
        build: &str,
    ) {
        let bound = on_version(version, 14);
        for i in range {
            self.token(decode, i, want[i - 1], &bound, build);
        }
    }

    /// The lines between decode `decode`, on `from`, and the next, on `to`: the refresh that
    /// defers the switch for the held handles, the runner dropping them, the refresh that makes
    /// the switch, and the next decode's handles.
    fn switches(&mut self, decode: usize, from: &str, to: &str) {
        let deferred = self.expect("refresh: generation ");
        let want = format!(
            "deferred: example.llama_ops@{from} switches to {to} once its 14 live binding(s) \
             are released"
        );
        assert!(deferred.contains(&want), "{deferred}");
        self.expect(&format!(
            "decode {decode}: {}: resolving again",
            on_version(from, 0)
        ));
        let switched = self.expect("refresh: generation ");
        let want = format!("loaded example.llama_ops@{to}");
        assert!(switched.contains(&want), "{switched}");
        self.expect(&format!("decode {}: {}", decode + 1, on_version(to, 14)));
    }

    /// The lines that close decode `decode`: its tokens, its counts, the reference's verdict.
    fn finished(&mut self, decode: usize, want: &[u32]) {
        let tokens: Vec<String> = want.iter().map(u32::to_string).collect();
        let line = self.expect(&format!("decode {decode} tokens: "));
        assert_eq!(
            line,
            format!("decode {decode} tokens: {}", tokens.join(" "))
        );
        self.expect(&format!("decode {decode}: 21 forward passes in "));
        self.expect(&format!("decode {decode} reference: tokens match;"));
    }
}

impl Drop for Stepped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the runner says of its handles: all 14 on `version`, `current` of them current.
fn on_version(version: &str, current: usize) -> String {
    format!("14 handles on example.llama_ops@{version}, {current} current")
}

/// `guild --store STORE ARGS...`, run as an operator would from another shell.
fn operator(shop: &Workshop, store: &Path, args: &[&str]) -> Run {
    let mut all = vec!["--store", store.to_str().unwrap()];
    all.extend_from_slice(args);
    guild().run(shop.path(), &all)
}

/// `guild remove ID --version V` while the runner has that version loaded: refused, naming
/// the runner's process.
fn removal_refused(shop: &Workshop, store: &Path, version: &str, pid: u32) {
    let run = operator(
        shop,
        store,
        &["remove", "example.llama_ops", "--version", version],
    );
    assert_eq!(run.code, 4, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(&format!("pid {pid}")), "{}", run.stderr);
    assert!(
        store
            .join("packages/example.llama_ops")
            .join(version)
            .is_dir(),
        "the refused removal deleted {version}"
    );
}

#[test]
fn live_a_decode_holds_its_handles_through_an_install_and_a_rollback_in_another_process() {
    let shop = Workshop::new();
    let Some(dir) = tiny_llama(&shop) else {
        return;
    };
    let reference_path = dir.join("tiny-llama.reference.json");
    let want = Reference::read(&reference_path).unwrap().tokens;
    assert_eq!(want.len(), 16);
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let build = |version: &str, library: &str| {
        shop.build(&llama_spec(version).library(&plugin_library(library)), &k)
            .archive
    };
    pm.install(&build("1.0.0", BUILD_1_0), InstallOptions::default())
        .unwrap();
    drop(pm);
    let v11 = build("1.1.0", BUILD_1_1);
    let markers = shop.fresh("markers");
    std::fs::create_dir_all(&markers).unwrap();

    let mut child = Command::new(decode_binary())
        .arg(&store)
        .arg(dir.join("tiny-llama.gguf"))
        .arg("--reference")
        .arg(&reference_path)
        .args(["--decodes", "3", "--step"])
        .env("GUILD_TEST_MARKER_DIR", &markers)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the runner starts");
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let pid = child.id();
    let mut runner = Stepped {
        stdin: child.stdin.take(),
        child,
        lines,
        log: markers.join("llama_ops.log"),
        logged: 0,
    };
    runner.expect("model ");
    runner.expect("prompt: ");
    runner.expect(&format!("decode 1: {}", on_version("1.0.0", 14)));

    // Decode 1 starts on 1.0.0; 1.1.0 is installed from another process after its fourth
    // token. The decode finishes on 1.0.0's code: the host learns of the change at its next
    // refresh, which the runner makes between decodes, and the version it holds stays pinned.
    runner.tokens(1, 1..=4, &want, "1.0.0", BUILD_1_0);
    let installed = operator(&shop, &store, &["install", v11.to_str().unwrap()]);
    assert_eq!(
        installed.code, 0,
        "{}{}",
        installed.stdout, installed.stderr
    );
    removal_refused(&shop, &store, "1.0.0", pid);
    runner.tokens(1, 5..=16, &want, "1.0.0", BUILD_1_0);
    runner.finished(1, &want);
    runner.switches(1, "1.0.0", "1.1.0");

    // Decode 2 resolved anew and runs 1.1.0's code; a rollback from another process after its
    // fourth token waits for it the same way.
    runner.tokens(2, 1..=4, &want, "1.1.0", BUILD_1_1);
    let rolled = operator(&shop, &store, &["rollback", "example.llama_ops"]);
    assert_eq!(rolled.code, 0, "{}{}", rolled.stdout, rolled.stderr);
    removal_refused(&shop, &store, "1.1.0", pid);
    runner.tokens(2, 5..=16, &want, "1.1.0", BUILD_1_1);
    runner.finished(2, &want);
    runner.switches(2, "1.1.0", "1.0.0");

    // Decode 3 runs on 1.0.0 again, and the runner ends well.
    runner.tokens(3, 1..=16, &want, "1.0.0", BUILD_1_0);
    runner.finished(3, &want);
    drop(runner.stdin.take());
    let status = runner.child.wait().unwrap();
    assert!(status.success(), "the runner ended with {status}");
}

/// Decodes the tiny Llama in `dir` through the service and compares with its reference:
/// equal tokens, every logit within [`LOGIT_TOLERANCE`]. Returns the reference.
fn decodes_as_its_reference(f: &Fixture, dir: &Path, case: &str) -> Reference {
    let reference = Reference::read(&dir.join("tiny-llama.reference.json")).unwrap();
    assert!(
        reference.min_top2_margin > 100.0 * f64::from(LOGIT_TOLERANCE),
        "{case}: the reference has a near tie ({})",
        reference.min_top2_margin
    );
    let model = f
        .host
        .models()
        .read_file(&dir.join("tiny-llama.gguf"))
        .unwrap();
    let cfg = Config::from_model(model.as_ref()).unwrap_or_else(|e| panic!("{case}: {e}"));
    let weights = Weights::from_model(&model, &cfg).unwrap_or_else(|e| panic!("{case}: {e}"));
    let ops = Service::new(OperationService::new(f.host.kernels()));
    let mut decoder = Decoder::new(cfg, weights, &ops).unwrap_or_else(|e| panic!("{case}: {e}"));
    let got = generate(&mut decoder, &reference.prompt, reference.tokens.len())
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let c = reference.compare(&got);
    eprintln!(
        "{case}: tokens {}; largest logit error {:.2e} (tolerance {LOGIT_TOLERANCE:.0e})",
        if c.tokens_match { "match" } else { "DIFFER" },
        c.max_logit_error
    );
    assert_eq!(got.tokens, reference.tokens, "{case}: tokens");
    assert!(c.logits_shape_match, "{case}");
    assert!(
        c.max_logit_error <= LOGIT_TOLERANCE,
        "{case}: largest logit error {} over the tolerance {LOGIT_TOLERANCE}",
        c.max_logit_error
    );
    reference
}

/// The largest difference between two references' logits.
fn logit_distance(a: &Reference, b: &Reference) -> f32 {
    a.logits
        .iter()
        .flatten()
        .zip(b.logits.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn each_gguf_convention_decodes_through_the_service_as_the_numpy_reference_does() {
    let f = llama_fixture();
    let Some(plain_dir) = tiny_llama(&f.shop) else {
        return;
    };
    let plain = Reference::read(&plain_dir.join("tiny-llama.reference.json")).unwrap();
    // (what, make_tiny_llama.py's options, whether the convention changes the arithmetic of
    // this model: then its reference must differ from the plain file's, or the case would
    // prove nothing).
    let cases: [(&str, &[&str], bool); 7] = [
        ("tied embeddings (no output.weight)", &["--tied"], true),
        (
            "no llama.rope.freq_base (10000)",
            &["--no-freq-base"],
            false,
        ),
        (
            "linear scaling, factor 4",
            &["--scaling-type", "linear", "--scaling-factor", "4"],
            true,
        ),
        (
            "a scaling factor without a type (llama.cpp reads linear)",
            &["--scaling-factor", "4"],
            true,
        ),
        (
            "scaling type none with a factor (no scaling)",
            &["--scaling-type", "none", "--scaling-factor", "4"],
            false,
        ),
        ("Llama 3 rope_freqs", &["--rope-freqs"], true),
        (
            "rope_freqs and linear scaling, factor 2, no freq_base",
            &[
                "--rope-freqs",
                "--scaling-type",
                "linear",
                "--scaling-factor",
                "2",
                "--no-freq-base",
            ],
            true,
        ),
    ];
    for (case, args, changes) in cases {
        let dir = tiny_llama_with(&f.shop, args).expect("python3 ran for the plain file");
        let reference = decodes_as_its_reference(&f, &dir, case);
        let distance = logit_distance(&reference, &plain);
        if changes {
            assert!(
                distance > 100.0 * LOGIT_TOLERANCE,
                "{case}: the reference is within {distance} of the plain file's"
            );
        } else {
            assert_eq!(
                reference, plain,
                "{case}: the arithmetic is the plain file's"
            );
        }
    }
    assert_eq!(
        f.host
            .kernels()
            .live_bindings(&guild_test_support::id("example.llama_ops")),
        0
    );
}

#[test]
fn an_unimplemented_rope_scaling_type_is_refused_naming_the_key_and_the_value() {
    let f = llama_fixture();
    for kind in ["yarn", "longrope", "llama3"] {
        let Some(dir) =
            tiny_llama_with(&f.shop, &["--scaling-type", kind, "--scaling-factor", "4"])
        else {
            return;
        };
        assert!(
            !dir.join("tiny-llama.reference.json").exists(),
            "{kind}: the writer has no reference for it"
        );
        let model = f
            .host
            .models()
            .read_file(&dir.join("tiny-llama.gguf"))
            .unwrap();
        let err = Config::from_model(model.as_ref()).unwrap_err();
        assert_eq!(
            err,
            decode::DecodeError::Model(format!(
                "llama.rope.scaling.type is \"{kind}\" (it implements \"none\" and \"linear\"), \
                 which this runner does not implement"
            ))
        );
    }
}

/// A valid llama for [`Config::from_model`]: the tiny Llama's shape (2 layers, hidden 64, 4
/// heads of 16, 2 key/value heads) with zero-filled f32 tensors.
fn fake_llama() -> guild_ports::fakes::FakeModel {
    use guild_ports::model::MetaValue as M;
    let f32_id = guild_abi::GUILD_DTYPE_F32;
    let mut model = guild_ports::fakes::FakeModel::new("/models/fake-llama.gguf")
        .with_meta("general.architecture", M::Str("llama".into()))
        .with_meta("llama.block_count", M::U32(2))
        .with_meta("llama.embedding_length", M::U32(64))
        .with_meta("llama.feed_forward_length", M::U32(128))
        .with_meta("llama.attention.head_count", M::U32(4))
        .with_meta("llama.attention.head_count_kv", M::U32(2))
        .with_meta("llama.context_length", M::U32(64))
        .with_meta("llama.rope.dimension_count", M::U32(16))
        .with_meta("llama.rope.freq_base", M::F32(10000.0))
        .with_meta("llama.attention.layer_norm_rms_epsilon", M::F32(1e-5))
        .with_tensor("token_embd.weight", f32_id, &[64, 256]);
    for l in 0..2 {
        for (part, dims) in [
            ("attn_norm", &[64][..]),
            ("attn_q", &[64, 64]),
            ("attn_k", &[64, 32]),
            ("attn_v", &[64, 32]),
            ("attn_output", &[64, 64]),
            ("ffn_norm", &[64]),
            ("ffn_gate", &[64, 128]),
            ("ffn_up", &[64, 128]),
            ("ffn_down", &[128, 64]),
        ] {
            model = model.with_tensor(&format!("blk.{l}.{part}.weight"), f32_id, dims);
        }
    }
    model
        .with_tensor("output_norm.weight", f32_id, &[64])
        .with_tensor("output.weight", f32_id, &[64, 256])
}

#[test]
fn metadata_that_would_change_the_arithmetic_is_read_as_llama_cpp_does_or_refused_naming_the_key() {
    use guild_ports::model::MetaValue as M;
    let f32_id = guild_abi::GUILD_DTYPE_F32;
    let base = fake_llama();
    let cfg = Config::from_model(&base).unwrap();
    assert_eq!(
        (
            cfg.rope_base,
            cfg.rope_freq_scale,
            cfg.rope_freqs,
            cfg.tied_embeddings
        ),
        (10000.0, 1.0, false, false)
    );

    // What llama.cpp reads with a default, read the same way.
    let read = |model: guild_ports::fakes::FakeModel| Config::from_model(&model).unwrap();
    let c = read(base.clone().without_meta("llama.rope.freq_base"));
    assert_eq!(c.rope_base, decode::DEFAULT_ROPE_BASE);
    let c = read(base.clone().without_meta("llama.attention.head_count_kv"));
    assert_eq!(c.n_head_kv, 4, "one key/value head per query head");
    let c = read(base.clone().without_meta("llama.rope.dimension_count"));
    assert_eq!(c.head_dim, 16);
    let c = read(base.clone().without_tensor("output.weight"));
    assert!(c.tied_embeddings);
    let c = read(
        base.clone()
            .with_meta("llama.rope.scaling.type", M::Str("linear".into())),
    );
    assert_eq!(c.rope_freq_scale, 1.0, "linear without a factor");
    let c = read(
        base.clone()
            .with_meta("llama.rope.scaling.factor", M::F32(8.0)),
    );
    assert_eq!(
        c.rope_freq_scale, 0.125,
        "a factor without a type is linear"
    );
    let c = read(
        base.clone()
            .with_meta("llama.rope.scale_linear", M::F32(2.0)),
    );
    assert_eq!(c.rope_freq_scale, 0.5, "the older key");
    let c = read(
        base.clone()
            .with_meta("llama.rope.scaling.type", M::Str("none".into()))
            .with_meta("llama.rope.scaling.factor", M::F32(8.0)),
    );
    assert_eq!(c.rope_freq_scale, 1.0, "none never scales");
    let c = read(
        base.clone()
            .with_meta("llama.rope.scaling.factor", M::F32(0.0)),
    );
    assert_eq!(c.rope_freq_scale, 1.0, "a zero factor does not scale");
    let c = read(
        base.clone()
            .with_meta("llama.rope.scaling.attn_factor", M::F32(1.0)),
    );
    assert_eq!(c.rope_freq_scale, 1.0);
    let c = read(base.clone().with_tensor("rope_freqs.weight", f32_id, &[8]));
    assert!(c.rope_freqs);

    // What would change the arithmetic in a way the decode does not implement: refused, the
    // error naming the key (or tensor) and the value.
    let refused: Vec<(&str, guild_ports::fakes::FakeModel, &str)> =
        vec![
        (
            "another architecture",
            base.clone().with_meta("general.architecture", M::Str("llama4".into())),
            "general.architecture is Some(Str(\"llama4\")), not \"llama\"",
        ),
        (
            "no RMS epsilon (llama.cpp has no default for llama)",
            base.clone().without_meta("llama.attention.layer_norm_rms_epsilon"),
            "llama.attention.layer_norm_rms_epsilon is missing",
        ),
        (
            "yarn",
            base.clone().with_meta("llama.rope.scaling.type", M::Str("yarn".into())),
            "llama.rope.scaling.type is \"yarn\" (it implements \"none\" and \"linear\"), \
             which this runner does not implement",
        ),
        (
            "a scaling type that is not a string",
            base.clone().with_meta("llama.rope.scaling.type", M::U32(1)),
            "llama.rope.scaling.type is not a string (U32(1))",
        ),
        (
            "a negative factor",
            base.clone().with_meta("llama.rope.scaling.factor", M::F32(-2.0)),
            "llama.rope.scaling.factor is not a finite f32 >= 0 (F32(-2.0))",
        ),
        (
            "an attention factor",
            base.clone().with_meta("llama.rope.scaling.attn_factor", M::F32(1.2)),
            "llama.rope.scaling.attn_factor is F32(1.2), not 1, which this runner does not \
             implement",
        ),
        (
            "partial rotary",
            base.clone().with_meta("llama.rope.dimension_count", M::U32(8)),
            "llama.rope.dimension_count is 8, not the head size 16 (a rotation of part of each \
             head), which this runner does not implement",
        ),
        (
            "experts",
            base.clone()
                .with_meta("llama.expert_count", M::U32(8))
                .with_meta("llama.expert_used_count", M::U32(2)),
            "llama.expert_count is 8 (a mixture of experts), which this runner does not implement",
        ),
        (
            "another key length",
            base.clone().with_meta("llama.attention.key_length", M::U32(32)),
            "llama.attention.key_length is 32, not embedding_length / head_count = 16, which \
             this runner does not implement",
        ),
        (
            "a non-positive base",
            base.clone().with_meta("llama.rope.freq_base", M::F32(0.0)),
            "llama.rope.freq_base is not a positive f32 (F32(0.0))",
        ),
        (
            "rope_freqs of another length",
            base.clone().with_tensor("rope_freqs.weight", f32_id, &[16]),
            "tensor rope_freqs.weight has dims [16]; a llama with head size 16 needs [8]",
        ),
        (
            "an attention bias",
            base.clone().with_tensor("blk.1.attn_q.bias", f32_id, &[64]),
            "tensor blk.1.attn_q.bias is not one a llama of 2 layers uses, and this runner does \
             not implement what it would add",
        ),
        (
            "a layer beyond block_count",
            base.clone().with_tensor("blk.2.attn_norm.weight", f32_id, &[64]),
            "tensor blk.2.attn_norm.weight is not one a llama of 2 layers uses, and this runner \
             does not implement what it would add",
        ),
    ];
    for (case, model, want) in refused {
        assert_eq!(
            Config::from_model(&model),
            Err(decode::DecodeError::Model(want.to_owned())),
            "{case}"
        );
    }

    // rope_freqs factors that cannot divide a frequency are refused when the weights are read.
    let mut bytes = Vec::new();
    for v in [1.0f32, 2.0, 0.0, 4.0, 8.0, 8.0, 8.0, 8.0] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let model: std::sync::Arc<dyn guild_ports::model::ModelFile> =
        std::sync::Arc::new(base.with_tensor_data("rope_freqs.weight", f32_id, &[8], bytes));
    let cfg = Config::from_model(model.as_ref()).unwrap();
    assert_eq!(
        Weights::from_model(&model, &cfg).unwrap_err(),
        decode::DecodeError::Model(
            "tensor rope_freqs.weight holds 0 at 2; each factor must be finite and > 0".into()
        )
    );
}
