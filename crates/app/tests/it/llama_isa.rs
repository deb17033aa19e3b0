//! G24: competing providers chosen by capability. `test-plugins/llama_ops` built a second time
//! with `LLAMA_OPS_AVX2` is the module `example.llama_ops_avx2`: the matvec for each weight
//! storage type, vectorized with AVX2 and FMA (and F16C where halves are read: f16, and the
//! q8_0 and q4_0 blocks' scales), at priority 20 against the
//! portable module's 10, each implementation declaring the instructions it uses in its
//! descriptor's `required_cpu_isa`. Installed beside the portable module, it is what
//! `example.llama.matvec` resolves to on a CPU with those instructions, and the portable
//! implementation is what it resolves to on one without (a query resolves as another CPU by
//! carrying that CPU's ISA bits): both are run here, against an exact reference and through
//! the tiny Llama's decode against numpy's.
//!
//! The module is built for x86-64 with GCC or Clang only; elsewhere these tests print why and
//! pass. On an x86-64 CPU without AVX2 or FMA the parts that would execute the AVX2 code say
//! so and check only that the portable implementation is chosen and right.

use guild_domain::ids::ImplId;
use guild_domain::operation::{CpuIsa, DType, MemorySpace, Numerics, Rejection, TensorDesc};
use guild_host::operations::{DeviceSupport, PassReason, TensorArg, TensorArgMut};
use guild_host::{OpHandle, OpName, OperationRequest, OperationService};
use guild_test_support::plugins::plugin_library;
use guild_test_support::{id, Spec};

use crate::llama::decode::{
    self, generate, Config, DecodeError, Decoder, In, Ops, Out, Provider, Reference, Service,
    Weights, LOGIT_TOLERANCE,
};
use crate::llama::{f32s, llama_spec, tiny_llama, tiny_llama_as};
use crate::operations::{fixture_with, op, Fixture};

const PORTABLE: &str = "example.llama_ops";
const AVX2: &str = "example.llama_ops_avx2";

/// How far a matvec's output may be from the exact product, as a share of the sum of the
/// products' magnitudes: `|y[o] - exact[o]| <= MATVEC_TOLERANCE * sum_i |W[o][i] * x[i]|`. Both
/// builds multiply the same weights by the same f32 activations and add n products in f32: the
/// portable one dequantizes each weight (exact in f32) and sums in index order, the AVX2 one sums
/// in eight-lane partial sums with fused multiply-adds, its q8_0 kernel applying each block's
/// scale once to the block's sum of q * x. The rounding error of either is at most a few n *
/// 2^-24 (8.2e-5 at n = 1376, once) of that sum, and below 3e-7 here in practice. A misread
/// scale, nibble or lane is of the order of the sum itself.
const MATVEC_TOLERANCE: f64 = 1e-5;

/// One storage type: the two implementations of `example.llama.matvec` that take it, and the
/// instructions the AVX2 one declares.
struct Case {
    dtype: DType,
    name: &'static str,
    avx2: &'static str,
    portable: &'static str,
    isa: CpuIsa,
}

fn cases() -> [Case; 5] {
    let base = CpuIsa::AVX | CpuIsa::AVX2 | CpuIsa::FMA;
    let case = |dtype, name, avx2, portable, isa| Case {
        dtype,
        name,
        avx2,
        portable,
        isa,
    };
    [
        case(
            DType::F32,
            "f32",
            "example.llama.matvec.avx2",
            "example.llama.matvec.cpu",
            base,
        ),
        case(
            DType::F16,
            "f16",
            "example.llama.matvec.f16.avx2",
            "example.llama.matvec.f16.cpu",
            base | CpuIsa::F16C,
        ),
        case(
            DType::BF16,
            "bf16",
            "example.llama.matvec.bf16.avx2",
            "example.llama.matvec.bf16.cpu",
            base,
        ),
        case(
            DType::Q8_0,
            "q8_0",
            "example.llama.matvec.q8_0.avx2",
            "example.llama.matvec.q8_0.cpu",
            base | CpuIsa::F16C,
        ),
        case(
            DType::Q4_0,
            "q4_0",
            "example.llama.matvec.q4_0.avx2",
            "example.llama.matvec.q4_0.cpu",
            base | CpuIsa::F16C,
        ),
    ]
}

/// The implementation ids the AVX2 build registers (what its manifest lists).
pub(crate) fn avx2_impls() -> Vec<String> {
    cases().iter().map(|c| c.avx2.to_owned()).collect()
}

/// The AVX2 build as `example.llama_ops_avx2` 1.0.0, or `None` (after saying why) where it is
/// not built.
fn avx2_spec() -> Option<Spec> {
    if !cfg!(target_arch = "x86_64") {
        assert!(
            !avx2_required(),
            "GUILD_REQUIRE_AVX2 is set, but this is {}, where test-plugins builds no AVX2 module",
            std::env::consts::ARCH
        );
        eprintln!(
            "skipped: test-plugins builds llama_ops_avx2 for x86-64 only, and this is {}",
            std::env::consts::ARCH
        );
        return None;
    }
    let mut spec = Spec::module(AVX2, "1.0.0").library(&plugin_library("llama_ops_avx2"));
    spec.provided_ops = avx2_impls();
    Some(spec)
}

/// Both modules installed and loaded, the service resolving for this host.
fn both() -> Option<Fixture> {
    Some(fixture_with(
        &[llama_spec("1.0.0"), avx2_spec()?],
        DeviceSupport::host(),
    ))
}

/// A CPU without AVX2, FMA and F16C (an x86-64 of before 2013 that has AVX).
fn without_avx2() -> CpuIsa {
    CpuIsa::SSE4_2 | CpuIsa::AVX
}

/// Whether `GUILD_REQUIRE_AVX2=1` asks that the AVX2 paths run here (CI sets it): a CPU or a
/// platform without them is then a failure, not a skip.
fn avx2_required() -> bool {
    std::env::var_os("GUILD_REQUIRE_AVX2").is_some_and(|v| v == "1")
}

/// Whether this CPU has `isa`; when not, says what is skipped (or fails, where
/// `GUILD_REQUIRE_AVX2=1`).
fn this_cpu_has(isa: CpuIsa, what: &str) -> bool {
    let cpu = guild_host::platform::cpu_isa();
    let has = cpu.contains(isa);
    assert!(
        has || !avx2_required(),
        "GUILD_REQUIRE_AVX2 is set, but this CPU lacks {:?} of the {:?} {what} needs",
        isa.difference(cpu),
        isa
    );
    if !has {
        eprintln!(
            "skipped {what}: this CPU lacks {:?} of the {:?} the AVX2 implementation requires; \
             only the portable fallback runs here",
            isa.difference(cpu),
            isa
        );
    }
    has
}

/// A deterministic generator (xorshift64), so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// A normal f16 of exponent field `lo..=hi` and a random sign and mantissa: its bits and
    /// its value, which f32 holds exactly.
    fn f16(&mut self, lo: u16, hi: u16) -> (u16, f32) {
        let r = self.next();
        let sign = (r & 1) as u16;
        let exponent = lo + ((r >> 1) % u64::from(hi - lo + 1)) as u16;
        let mantissa = ((r >> 8) & 0x3ff) as u16;
        let bits = sign << 15 | exponent << 10 | mantissa;
        let value = (1.0 + f32::from(mantissa) / 1024.0) * 2f32.powi(i32::from(exponent) - 15);
        (bits, if sign == 1 { -value } else { value })
    }
}

/// A weight matrix `[n_in, n_out]` of `dtype`: the bytes the module reads and the values they
/// stand for, row by row.
fn weights(dtype: DType, n_in: usize, n_out: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut values = Vec::with_capacity(n_in * n_out);
    for _ in 0..n_out {
        match dtype {
            DType::F32 => {
                for _ in 0..n_in {
                    let v = rng.unit();
                    bytes.extend(v.to_le_bytes());
                    values.push(v);
                }
            }
            DType::F16 => {
                for _ in 0..n_in {
                    let (bits, v) = rng.f16(10, 17);
                    bytes.extend(bits.to_le_bytes());
                    values.push(v);
                }
            }
            DType::BF16 => {
                for _ in 0..n_in {
                    let bits = (rng.unit().to_bits() >> 16) as u16;
                    bytes.extend(bits.to_le_bytes());
                    values.push(f32::from_bits(u32::from(bits) << 16));
                }
            }
            DType::Q8_0 => {
                for _ in 0..n_in / 32 {
                    let (bits, d) = rng.f16(5, 9);
                    bytes.extend(bits.to_le_bytes());
                    for _ in 0..32 {
                        let q = rng.next() as u8;
                        bytes.push(q);
                        values.push(d * f32::from(q as i8));
                    }
                }
            }
            DType::Q4_0 => {
                for _ in 0..n_in / 32 {
                    let (bits, d) = rng.f16(8, 12);
                    bytes.extend(bits.to_le_bytes());
                    let nibbles: Vec<u8> = (0..32).map(|_| (rng.next() & 0x0f) as u8).collect();
                    bytes.extend((0..16).map(|i| nibbles[i] | nibbles[i + 16] << 4));
                    values.extend(nibbles.iter().map(|&n| d * f32::from(n as i8 - 8)));
                }
            }
            other => panic!("no weights of {other}"),
        }
    }
    (bytes, values)
}

/// A resolution of the matvec for W of `dtype` `[n_in, n_out]`, as this CPU.
fn matvec_request(dtype: DType, n_in: u64, n_out: u64) -> OperationRequest {
    OperationRequest::cpu(
        op(decode::MATVEC),
        vec![
            TensorDesc::new(dtype, &[n_in, n_out], MemorySpace::Host),
            f32s(&[n_in]),
        ],
        vec![f32s(&[n_out])],
    )
}

/// Runs `handle` on random weights of its dtype and shape and checks its output against the
/// exact product within [`MATVEC_TOLERANCE`]; answers what it computed.
fn check_matvec(handle: &OpHandle<'_>, seed: u64) -> Checked {
    let [w_desc, x_desc] = handle.inputs() else {
        panic!("a matvec has two inputs")
    };
    let y_desc = handle.outputs()[0];
    let (n_in, n_out) = (w_desc.dims[0] as usize, w_desc.dims[1] as usize);
    let chosen = handle.describe().impl_id.to_string();
    let mut rng = Rng(seed);
    let (bytes, values) = weights(w_desc.dtype, n_in, n_out, &mut rng);
    let x: Vec<f32> = (0..n_in).map(|_| rng.unit()).collect();
    let mut y = vec![0.0f32; n_out];
    handle
        .execute(
            &[TensorArg::new(w_desc, &bytes), TensorArg::new(x_desc, &x)],
            &mut [TensorArgMut::new(&y_desc, &mut y)],
            None,
        )
        .unwrap_or_else(|e| panic!("{chosen} [{n_in}, {n_out}]: {e}"));
    let mut checked = Checked {
        magnitudes: Vec::with_capacity(n_out),
        worst: 0.0,
        y: y.clone(),
    };
    for (o, got) in y.iter().enumerate() {
        let row = &values[o * n_in..(o + 1) * n_in];
        // Each product is exact in f64 (24-bit by 24-bit significands), and so nearly the sum.
        let exact: f64 = row
            .iter()
            .zip(&x)
            .map(|(w, x)| f64::from(*w) * f64::from(*x))
            .sum();
        let magnitude: f64 = row
            .iter()
            .zip(&x)
            .map(|(w, x)| (f64::from(*w) * f64::from(*x)).abs())
            .sum();
        let error = (f64::from(*got) - exact).abs() / magnitude;
        assert!(
            error <= MATVEC_TOLERANCE,
            "{chosen} [{n_in}, {n_out}] row {o}: {got} against the exact {exact}, an error of \
             {error:.2e} of the products' magnitudes {magnitude} (tolerance {MATVEC_TOLERANCE:.0e})"
        );
        checked.worst = checked.worst.max(error);
        checked.magnitudes.push(magnitude);
    }
    checked
}

/// What [`check_matvec`] computed.
struct Checked {
    /// The output.
    y: Vec<f32>,
    /// Per row, `sum_i |W[o][i] * x[i]|`.
    magnitudes: Vec<f64>,
    /// The largest error against the exact product, as a share of its row's magnitude.
    worst: f64,
}

/// The shapes each matvec runs at (`[n_in, n_out]`): a square projection and a feed-forward
/// one's, whole blocks of 16 lanes; for the unblocked types rows that end with eight lanes and
/// then four scalars, that are shorter than 16 lanes, and shorter than eight; for the block
/// types an odd count of rows (a kernel that took rows in pairs would have a last one alone).
fn shapes(dtype: DType) -> Vec<[u64; 2]> {
    let mut shapes = vec![[512, 512], [1376, 512], [512, 1376]];
    if matches!(dtype, DType::Q8_0 | DType::Q4_0) {
        shapes.push([96, 5]);
    } else {
        shapes.extend([[108, 5], [12, 3], [7, 3]]);
    }
    shapes
}

/// On this CPU the matvec of every storage type resolves to the AVX2 implementation (priority
/// 20 over 10), and it computes what the portable one does: on the same random weights and
/// activations, each within [`MATVEC_TOLERANCE`] of the exact product and of the other.
#[test]
fn the_avx2_matvecs_are_chosen_on_a_capable_cpu_and_agree_with_the_portable_ones() {
    let Some(f) = both() else {
        return;
    };
    let service = OperationService::new(f.host.kernels());
    for (i, case) in cases().iter().enumerate() {
        let capable = this_cpu_has(case.isa, &format!("the {} AVX2 matvec", case.name));
        for (j, [n_in, n_out]) in shapes(case.dtype).into_iter().enumerate() {
            let request = matvec_request(case.dtype, n_in, n_out);
            let chosen = service.resolve(&request).unwrap();
            let d = chosen.describe();
            let want = if capable { case.avx2 } else { case.portable };
            assert_eq!(d.impl_id.as_str(), want, "{} on this CPU", case.name);
            assert_eq!(
                (d.package.as_str(), d.priority),
                if capable { (AVX2, 20) } else { (PORTABLE, 10) }
            );
            let portable = service
                .resolve(&request.clone().exact(ImplId::new(case.portable).unwrap()))
                .unwrap();
            let seed = 0x9e37_79b9_7f4a_7c15 ^ (i * 16 + j) as u64;
            let a = check_matvec(&chosen, seed);
            let b = check_matvec(&portable, seed);
            // And with each other, row by row, within the same share of the row's magnitude.
            let mut apart = 0.0f64;
            for (o, ((ya, yb), magnitude)) in a.y.iter().zip(&b.y).zip(&a.magnitudes).enumerate() {
                let d = (f64::from(*ya) - f64::from(*yb)).abs() / magnitude;
                assert!(
                    d <= MATVEC_TOLERANCE,
                    "{} [{n_in}, {n_out}] row {o}: {want} gave {ya}, {} {yb}: {d:.2e} of the \
                     products' magnitudes apart (tolerance {MATVEC_TOLERANCE:.0e})",
                    case.name,
                    case.portable
                );
                apart = apart.max(d);
            }
            eprintln!(
                "{} [{n_in}, {n_out}]: {want} within {:.1e} and {} within {:.1e} of the exact \
                 product, {apart:.1e} apart (shares of the products' magnitudes)",
                case.name, a.worst, case.portable, b.worst
            );
        }
    }
}

/// Resolving as a CPU without AVX2, FMA and F16C chooses the portable implementation of every
/// storage type, and the report names the AVX2 one as refused for exactly the bits it lacks;
/// as a CPU with AVX2 and FMA but no F16C, those that convert halves (f16, and the scales of
/// q8_0 and q4_0) fall back and the f32 and bf16 ones do not. The fallback runs, and is right.
#[test]
fn without_the_instructions_an_avx2_matvec_declares_the_portable_one_is_chosen() {
    let Some(f) = both() else {
        return;
    };
    let service = OperationService::new(f.host.kernels()).reporting();
    let no_f16c = CpuIsa::SSE4_2 | CpuIsa::AVX | CpuIsa::AVX2 | CpuIsa::FMA;
    for (i, case) in cases().iter().enumerate() {
        for (device, name) in [(without_avx2(), "sse4.2 and avx"), (no_f16c, "no f16c")] {
            let mut request = matvec_request(case.dtype, 512, 64);
            request.device.cpu_isa = device;
            let handle = service.resolve(&request).unwrap();
            let missing = case.isa.difference(device);
            let what = format!("{} as a CPU with {name}", case.name);
            if missing.is_empty() {
                assert_eq!(handle.describe().impl_id.as_str(), case.avx2, "{what}");
                continue;
            }
            assert_eq!(handle.describe().impl_id.as_str(), case.portable, "{what}");
            let avx2 = handle
                .passed_over()
                .unwrap()
                .iter()
                .find(|p| p.impl_id.as_str() == case.avx2)
                .unwrap_or_else(|| panic!("{what}: {} is not in the report", case.avx2));
            assert_eq!(
                avx2.reason,
                PassReason::Rejected(Rejection::MissingIsa { missing }),
                "{what}"
            );
            check_matvec(&handle, 0x5851_f42d_4c95_7f2d ^ i as u64);
        }
    }
}

/// The AVX2 matvecs sum in eight lanes, not in index order, and do not declare
/// `GUILD_NUMERICS_ORDERED_REDUCTION`: a caller that requires it gets the portable matvec even on
/// a CPU with every instruction, the report naming the missing numerics bit.
#[test]
fn a_caller_that_requires_ordered_reductions_gets_the_portable_matvec() {
    let Some(f) = both() else {
        return;
    };
    let service = OperationService::new(f.host.kernels()).reporting();
    for case in cases() {
        let mut request = matvec_request(case.dtype, 512, 64).numerics(Numerics::ORDERED_REDUCTION);
        request.device.cpu_isa = CpuIsa::KNOWN;
        let handle = service.resolve(&request).unwrap();
        assert_eq!(
            handle.describe().impl_id.as_str(),
            case.portable,
            "{}",
            case.name
        );
        let avx2 = handle
            .passed_over()
            .unwrap()
            .iter()
            .find(|p| p.impl_id.as_str() == case.avx2)
            .unwrap();
        assert_eq!(
            avx2.reason,
            PassReason::Rejected(Rejection::MissingNumerics {
                missing: Numerics::ORDERED_REDUCTION
            }),
            "{}",
            case.name
        );
    }
}

/// [`Service`], the example runner's own, resolving as a CPU with the instruction sets `isa`
/// instead of this one's.
struct AsCpu<'r> {
    service: OperationService<'r>,
    ops: Service<'r>,
    isa: CpuIsa,
}

impl<'r> AsCpu<'r> {
    fn new(service: OperationService<'r>, isa: CpuIsa) -> Self {
        AsCpu {
            service,
            ops: Service::new(service),
            isa,
        }
    }
}

impl<'r> Ops for AsCpu<'r> {
    type Handle = OpHandle<'r>;

    fn resolve(
        &self,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<OpHandle<'r>, DecodeError> {
        let mut request =
            OperationRequest::cpu(OpName::new(op).unwrap(), inputs.to_vec(), outputs.to_vec());
        request.device.cpu_isa = self.isa;
        self.service
            .resolve(&request)
            .map_err(|e| DecodeError::Resolve {
                op: op.to_owned(),
                message: e.to_string(),
            })
    }

    fn rebind(
        &self,
        handle: &mut OpHandle<'r>,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<(), DecodeError> {
        self.ops.rebind(handle, op, inputs, outputs)
    }

    fn execute(
        &self,
        handle: &OpHandle<'r>,
        inputs: &[In<'_>],
        outputs: &mut [Out<'_>],
        params: &[u8],
    ) -> Result<(), DecodeError> {
        self.ops.execute(handle, inputs, outputs, params)
    }

    fn provider(&self, handle: &OpHandle<'r>) -> Option<Provider> {
        self.ops.provider(handle)
    }
}

/// Decodes the tiny Llama in `dir` resolving as a CPU with `isa`, checks that `matvecs` of the
/// decoder's handles (the six matvecs, or none) are the AVX2 module's and the others the
/// portable module's, and compares with the reference: equal tokens, every logit within
/// [`LOGIT_TOLERANCE`]. Answers the largest logit error.
fn decodes_on(f: &Fixture, dir: &std::path::Path, isa: CpuIsa, matvecs: u64, case: &str) -> f32 {
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
    let ops = AsCpu::new(OperationService::new(f.host.kernels()), isa);
    let mut decoder = Decoder::new(cfg, weights, &ops).unwrap_or_else(|e| panic!("{case}: {e}"));
    let kernels = f.host.kernels();
    assert_eq!(
        (
            kernels.live_bindings(&id(AVX2)),
            kernels.live_bindings(&id(PORTABLE))
        ),
        (matvecs, 14 - matvecs),
        "{case}: the handles on the AVX2 and the portable module"
    );
    let got = generate(&mut decoder, &reference.prompt, reference.tokens.len())
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let c = reference.compare(&got);
    assert_eq!(got.tokens, reference.tokens, "{case}: tokens");
    assert!(c.logits_shape_match, "{case}");
    assert!(
        c.max_logit_error <= LOGIT_TOLERANCE,
        "{case}: largest logit error {} over the tolerance {LOGIT_TOLERANCE}",
        c.max_logit_error
    );
    c.max_logit_error
}

/// The tiny Llama, its weight matrices stored as each type, decodes as its numpy reference does
/// (equal tokens, logits within [`LOGIT_TOLERANCE`]) with both modules installed: once as this
/// CPU, its six matvecs on the AVX2 module, and once as a CPU without AVX2, all fourteen
/// handles on the portable module.
#[test]
fn the_tiny_llama_decodes_as_its_reference_on_the_avx2_matvecs_and_on_the_fallback() {
    let Some(f) = both() else {
        return;
    };
    for case in cases() {
        let dir = match case.dtype {
            DType::F32 => tiny_llama(&f.shop),
            _ => tiny_llama_as(&f.shop, case.name),
        };
        let Some(dir) = dir else {
            return;
        };
        let here = guild_host::platform::cpu_isa();
        let matvecs = if this_cpu_has(
            case.isa,
            &format!("the {} decode's AVX2 matvecs", case.name),
        ) {
            6
        } else {
            0
        };
        let avx2 = decodes_on(
            &f,
            &dir,
            here,
            matvecs,
            &format!("{} weights as this CPU", case.name),
        );
        let fallback = decodes_on(
            &f,
            &dir,
            without_avx2(),
            0,
            &format!("{} weights as a CPU without AVX2", case.name),
        );
        eprintln!(
            "tiny llama, {} weights: tokens match on {} matvecs of the AVX2 module (largest logit \
             error {avx2:.2e}) and on the portable fallback ({fallback:.2e}); tolerance \
             {LOGIT_TOLERANCE:.0e}",
            case.name, matvecs
        );
    }
}

/// The manifest template of the AVX2 module lists what its library registers.
#[test]
fn the_avx2_manifest_template_lists_what_the_module_registers() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/modules/llama_ops_avx2/manifest.json");
    let template: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let listed: Vec<&str> = template["provided_ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(listed, avx2_impls());
    assert_eq!(template["entry"], "lib/libllama_ops_avx2.so");
    let Some(f) = both() else {
        return;
    };
    for impl_id in avx2_impls() {
        let id = ImplId::new(&impl_id).unwrap();
        assert!(f.host.kernels().find_by_id(&id).is_some(), "{impl_id}");
    }
}
