//! The bound CPE1 table and the host's expert worker pool, over real C providers installed as
//! signed gkernels and loaded with dlopen: test-plugins/ext_probe (copied under the names
//! `libext_probe__cpe1__current.so` and `libext_probe__cpu2__current.so`, from which it picks a
//! CPE1 version 1 or a CPU backend version 2 table) and test-plugins/expert_ref (F32 reference
//! arithmetic that the tests recompute), and ext_probe's `libext_probe__cuda__all.so` for the
//! bound CDD1, CDA1 and CDM1 tables.

use guild_abi::{
    guild_cpu_activation_image_v1_t, guild_cpu_expert_format_v1_t, GUILD_CPU_COMBINE_ACCUMULATE,
    GUILD_CPU_EXPERT_DOWN_ACCUMULATE, GUILD_CPU_EXPERT_GLU_SWIGLU,
    GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX, GUILD_CUDA_ATTN_CONFIG_MAX_SPLITS, GUILD_DTYPE_F32,
    GUILD_STATUS_ERR_INVALID_ARGUMENT, GUILD_STATUS_ERR_UNSUPPORTED,
};
use guild_domain::ids::{ImplId, PackageId};
use guild_domain::lease::{Leased, QuiescentAction};
use guild_domain::operation::Backend;
use guild_host::cuda_tables::{BoundCudaTables, CudaBindError};
use guild_host::experts::{
    AlignedBuffer, BindError, BoundExpertTable, CombineCall, DownCall, ExpertError, ExpertPool,
    ExpertTask, GateUpCall, PlanarQ2DequantizeCall, PlanarQ2QuantizeCall, PoolError, Q2RowsCall,
    RouterCall,
};
use guild_host::models::PluginReason;
use guild_host::operations::DeviceSupport;
use guild_host::registry::Selector;
use guild_host::HostError;
use guild_test_support::plugins::{plugin_library, scan_spec};
use guild_test_support::Spec;

use crate::operations::{fixture_with, Fixture};

const V2_OPS: [&str; 6] = [
    "describe_format",
    "quantize_planar_q2",
    "dequantize_planar_q2",
    "q2_rows",
    "router_bf16",
    "combine_ordered",
];

/// A package holding ext_probe under the file name that selects `(ext, "current")`.
fn probe_spec(ext: &str) -> Spec {
    probe_case_spec(ext, "current", &format!("test.ext_probe_{ext}"))
}

/// A package `package` holding ext_probe under the file name that selects `(ext, case)`.
fn probe_case_spec(ext: &str, case: &str, package: &str) -> Spec {
    let mut spec = Spec::kernel(package, "1.0.0").library(&plugin_library("ext_probe"));
    spec.files[0].0 = format!("lib/libext_probe__{ext}__{case}.so");
    spec.provided_ops = vec![format!("test.ext_probe.{ext}")];
    spec
}

pub(crate) fn expert_ref_spec() -> Spec {
    let mut spec = Spec::kernel("test.expert_ref", "1.0.0").library(&plugin_library("expert_ref"));
    spec.provided_ops = vec!["test.expert_ref.cpu".into()];
    spec
}

/// ext_probe's CPE1 kernel (priority 3, above expert_ref's 1) as the `other_isa` case: its
/// descriptor requires an instruction set no CPU of this architecture has.
const WIDE: &str = "test.ext_probe.cpe1";

/// A plugin may register kernels for CPUs other than this one (it loads, and its kernel is
/// listed), but the host never picks or binds one whose descriptor requires instruction sets
/// this CPU lacks: its code could execute an illegal instruction. Selection passes it over for
/// the portable kernel, though it ranks higher; binding it by id is refused, naming the bits,
/// and leaves no lease.
#[test]
fn a_kernel_needing_instructions_this_cpu_lacks_is_neither_selected_nor_bound() {
    let f = fixture(&[
        expert_ref_spec(),
        probe_case_spec("cpe1", "other_isa", "test.ext_probe_cpe1"),
    ]);
    let kernels = f.host.kernels();
    let wide = kernels
        .find_by_id(&impl_id(WIDE))
        .expect("the kernel is registered");
    let required = wide.required_cpu_isa;
    assert!(
        !required.is_empty(),
        "the descriptor's required_cpu_isa is recorded"
    );
    assert!(!guild_host::platform::cpu_isa().contains(required));
    drop(wide);

    let chosen = kernels
        .select(&Selector {
            op_kind: guild_abi::GUILD_OP_BATCHED_EXPERT_EXEC,
            op_name: None,
            backend: Some(Backend::Cpu),
        })
        .expect("the portable kernel is selected");
    assert_eq!(chosen.impl_id.as_str(), "test.expert_ref.cpu");
    drop(chosen);

    match BoundExpertTable::bind_id(kernels, &impl_id(WIDE)) {
        Err(e @ BindError::MissingCpuIsa { .. }) => {
            let BindError::MissingCpuIsa {
                impl_id: id,
                missing,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((id.as_str(), *missing), (WIDE, required));
            let text = e.to_string();
            assert!(
                text.contains(WIDE) && text.contains(&required.to_string()),
                "{text}"
            );
        }
        other => panic!("expected MissingCpuIsa, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        f.host
            .active_package_leases(&PackageId::new("test.ext_probe_cpe1").unwrap()),
        0
    );
    // The portable kernel binds as before.
    bind(&f, "test.expert_ref.cpu");
}

fn fixture(specs: &[Spec]) -> Fixture {
    fixture_with(specs, DeviceSupport::host())
}

fn impl_id(id: &str) -> ImplId {
    ImplId::new(id).unwrap()
}

fn bind(f: &Fixture, id: &str) -> BoundExpertTable {
    BoundExpertTable::bind_id(f.host.kernels(), &impl_id(id))
        .unwrap_or_else(|e| panic!("binding {id}: {e}"))
}

/// A format of F32 activations and hidden rows, 16-byte aligned, for `experts` experts of
/// `hidden` x `inter` matrices laid out as expert_ref reads them: a 16-byte header word (the
/// expert's index), then gate, up and down.
fn format(hidden: u64, inter: u64, experts: u64) -> guild_cpu_expert_format_v1_t {
    let matrix = hidden * inter * 4;
    guild_cpu_expert_format_v1_t {
        struct_size: std::mem::size_of::<guild_cpu_expert_format_v1_t>() as u32,
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
        expert_count: experts,
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

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn aligned(bytes: &[u8]) -> AlignedBuffer {
    let mut buffer = AlignedBuffer::zeroed(bytes.len(), 16).unwrap();
    buffer.as_mut_slice().copy_from_slice(bytes);
    buffer
}

// ---------------------------------------------------------------------------------------------
// Binding and calling
// ---------------------------------------------------------------------------------------------

#[test]
fn a_cpe1_table_is_bound_and_its_calls_reach_the_plugin() {
    let f = fixture(&[probe_spec("cpe1")]);
    let table = bind(&f, "test.ext_probe.cpe1");
    assert_eq!(table.version(), 1);
    assert_eq!(table.impl_id(), &impl_id("test.ext_probe.cpe1"));
    assert_eq!(
        table.package(),
        &PackageId::new("test.ext_probe_cpe1").unwrap()
    );

    // The probe's reference quantisation: d = max|x| / 127, then the int8 quants, per row.
    let mut fmt = format(4, 4, 1);
    fmt.activation_row_bytes = 16;
    let mut dst = AlignedBuffer::zeroed(32, 16).unwrap();
    table
        .quantize_activation(
            &fmt,
            2,
            &[1.0, -0.5, 0.25, 2.0, 0.0, 0.0, 0.0, 0.0],
            dst.as_mut_slice(),
        )
        .unwrap();
    let out = dst.as_slice();
    assert_eq!(
        f32::from_le_bytes(out[..4].try_into().unwrap()),
        2.0 / 127.0
    );
    let quants: Vec<i8> = out[4..8].iter().map(|&b| b as i8).collect();
    assert_eq!(quants, [64, -32, 16, 127]);
    assert_eq!(
        &out[16..24],
        &[0; 8],
        "an all-zero row has d = 0 and zero quants"
    );

    // The probe declares down_rows only: its refusal comes back with its text.
    let image = AlignedBuffer::zeroed(fmt.expert_stride_bytes as usize, 16).unwrap();
    let hidden = AlignedBuffer::zeroed(16, 16).unwrap();
    let mut out = vec![0.0f32; 4];
    let mut scratch = AlignedBuffer::zeroed(64, 16).unwrap();
    let refused = table.down_rows(
        &fmt,
        &mut DownCall {
            flags: 0,
            expert_index: 0,
            token_count: 1,
            rows: 0..4,
            expert_image: image.as_slice(),
            hidden: hidden.as_slice(),
            token_weights: None,
            dst: &mut out,
        },
        scratch.as_mut_slice(),
    );
    assert_eq!(
        refused,
        Err(ExpertError::Provider {
            callback: "down_rows",
            reason: PluginReason {
                status: GUILD_STATUS_ERR_UNSUPPORTED,
                component: "test.ext_probe".into(),
                message: "down_rows is a declaration only".into(),
            },
        })
    );
}

#[test]
fn a_version_1_table_reports_every_v2_operation_absent() {
    let f = fixture(&[probe_spec("cpe1")]);
    let table = bind(&f, "test.ext_probe.cpe1");
    assert_eq!(table.absent_callbacks(), V2_OPS);
    for op in V2_OPS {
        assert!(!table.offers(op), "{op}");
    }
    assert!(table.offers("gate_up_rows"));
    let not_offered = |callback| ExpertError::NotOffered {
        impl_id: impl_id("test.ext_probe.cpe1"),
        callback,
    };
    assert_eq!(
        table
            .describe_format(0, GUILD_DTYPE_F32, GUILD_DTYPE_F32, [4, 4, 1])
            .map(|_| ()),
        Err(not_offered("describe_format"))
    );
    let (mut ids, mut weights) = ([0i32; 2], [0f32; 2]);
    assert_eq!(
        table.router_bf16(&mut router_call(&mut ids, &mut weights)),
        Err(not_offered("router_bf16"))
    );
    assert_eq!(ids, [0, 0], "nothing was called");
}

/// One token `[1, 0]` against four experts whose first router column is 0.5, 2, 3, 1 (BF16).
fn router_call<'a>(ids: &'a mut [i32; 2], weights: &'a mut [f32; 2]) -> RouterCall<'a> {
    const ROUTER: [u16; 8] = [0x3F00, 0, 0x4000, 0, 0x4040, 0, 0x3F80, 0];
    RouterCall {
        gating: GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX,
        flags: 0,
        top_k: 2,
        weight_scale: 1.0,
        hidden_size: 2,
        input: &[1.0, 0.0],
        router_weights: &ROUTER,
        selection_bias: None,
        logits: None,
        expert_ids: ids,
        expert_weights: weights,
    }
}

#[test]
fn appended_operations_count_only_where_the_plugins_table_carries_them() {
    // Version 1 declaring the whole v2 size, every appended callback set in memory: still CPE1.
    let f = fixture(&[probe_case_spec("cpe1", "newer", "test.ext_probe_newer")]);
    let table = bind(&f, "test.ext_probe.cpe1");
    assert_eq!(
        (table.version(), table.absent_callbacks()),
        (1, &V2_OPS[..])
    );
    drop(table);
    drop(f);

    // Version 2 whose size stops after quantize_planar_q2.
    let f = fixture(&[probe_case_spec("cpu2", "older", "test.ext_probe_older")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    assert_eq!(table.version(), 2);
    assert_eq!(table.absent_callbacks(), &V2_OPS[2..]);
    assert!(table.offers("quantize_planar_q2") && !table.offers("q2_rows"));
    let (mut ids, mut weights) = ([0i32; 2], [0f32; 2]);
    assert_eq!(
        table.router_bf16(&mut router_call(&mut ids, &mut weights)),
        Err(ExpertError::NotOffered {
            impl_id: impl_id("test.ext_probe.cpu2"),
            callback: "router_bf16",
        })
    );
    drop(table);
    drop(f);

    // Version 2 at full size with router_bf16 NULL.
    let f = fixture(&[probe_case_spec("cpu2", "sparse", "test.ext_probe_sparse")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    assert_eq!(table.absent_callbacks(), ["router_bf16"]);
    assert!(matches!(
        table.router_bf16(&mut router_call(&mut ids, &mut weights)),
        Err(ExpertError::NotOffered {
            callback: "router_bf16",
            ..
        })
    ));
    assert_eq!(ids, [0, 0], "nothing was called");
}

#[test]
fn a_version_2_table_offers_its_appended_operations() {
    let f = fixture(&[probe_spec("cpu2")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    assert_eq!(table.version(), 2);
    assert!(table.absent_callbacks().is_empty());
    assert!(V2_OPS.iter().all(|op| table.offers(op)));

    let (mut ids, mut weights) = ([0i32; 2], [0f32; 2]);
    let mut logits = [0f32; 4];
    let mut call = router_call(&mut ids, &mut weights);
    call.logits = Some(&mut logits);
    table.router_bf16(&mut call).unwrap();
    assert_eq!(logits, [0.5, 2.0, 3.0, 1.0]);
    assert_eq!(ids, [2, 1]);
    let second = (-1.0f32).exp();
    let expected = [1.0 / (1.0 + second), second / (1.0 + second)];
    for (got, want) in weights.iter().zip(expected) {
        assert!((got - want).abs() < 1e-6, "{weights:?} vs {expected:?}");
    }

    // q2_rows takes canonical activation images; the probe declares it only.
    // SAFETY: the image is plain integers and floats; all-zero is a valid value.
    let images = vec![unsafe { std::mem::zeroed::<guild_cpu_activation_image_v1_t>() }; 2];
    assert_eq!(images.as_ptr() as usize % 64, 0);
    let mut dst = [0f32; 2];
    let refused = table.q2_rows(&mut Q2RowsCall {
        flags: 0,
        token_count: 2,
        images_per_token: 1,
        row_elements: 256,
        rows: 0..1,
        weights: &[0u8; 84],
        weight_row_stride_bytes: 84,
        images: &images,
        dst: &mut dst,
    });
    match refused {
        Err(ExpertError::Provider { callback, reason }) => {
            assert_eq!(callback, "q2_rows");
            assert_eq!(reason.message, "q2_rows is a declaration only");
        }
        other => panic!("expected the probe's refusal, got {other:?}"),
    }
}

#[test]
fn a_kernel_without_a_cpe1_table_or_an_unknown_id_is_not_bound() {
    let f = fixture(&[scan_spec("1.0.0")]);
    // scan_module registers this GUILD_OP_CUSTOM kernel, which carries GOP1, not CPE1.
    let scan = &impl_id("example.scan.inclusive.cpu");
    match BoundExpertTable::bind_id(f.host.kernels(), scan) {
        Err(BindError::NoExpertTable {
            impl_id, op_kind, ..
        }) => assert_eq!((&impl_id, op_kind), (scan, guild_abi::GUILD_OP_CUSTOM)),
        other => panic!("expected NoExpertTable, got {other:?}"),
    }
    assert_eq!(
        BoundExpertTable::bind_id(f.host.kernels(), &impl_id("test.nothing.here")).map(|_| ()),
        Err(BindError::NoSuchKernel(impl_id("test.nothing.here")))
    );
    assert_eq!(
        f.host
            .active_package_leases(&PackageId::new("example.scan").unwrap()),
        0
    );
}

#[test]
fn arguments_that_do_not_fit_the_format_are_refused_before_the_call() {
    let f = fixture(&[expert_ref_spec()]);
    let table = bind(&f, "test.expert_ref.cpu");
    let fmt = format(4, 2, 2);
    let src = [1.0f32; 8];

    // Too short: two rows of 16 bytes need 32.
    let mut short = AlignedBuffer::zeroed(16, 16).unwrap();
    match table.quantize_activation(&fmt, 2, &src, short.as_mut_slice()) {
        Err(ExpertError::Arguments { callback, problem }) => {
            assert_eq!(callback, "quantize_activation");
            assert_eq!(problem, "dst: 32 needed for 2 rows of 16, 16 given");
        }
        other => panic!("expected an argument refusal, got {other:?}"),
    }
    assert_eq!(short.as_slice(), &[0; 16], "nothing was written");

    // Misaligned: one byte into a 16-aligned buffer.
    let mut buffer = AlignedBuffer::zeroed(48, 16).unwrap();
    match table.quantize_activation(&fmt, 2, &src, &mut buffer.as_mut_slice()[1..]) {
        Err(ExpertError::Arguments { problem, .. }) => {
            assert_eq!(problem, "dst is not aligned to 16 bytes");
        }
        other => panic!("expected an argument refusal, got {other:?}"),
    }

    // A format whose down matrix does not fit in one expert's image.
    let mut short_stride = fmt;
    short_stride.expert_stride_bytes -= 4;
    match table.quantize_activation(&short_stride, 2, &src, buffer.as_mut_slice()) {
        Err(ExpertError::Arguments { problem, .. }) => assert_eq!(
            problem,
            format!(
                "the down matrix ends past expert_stride_bytes {}",
                short_stride.expert_stride_bytes
            )
        ),
        other => panic!("expected an argument refusal, got {other:?}"),
    }

    // An expert past the format's count, and rows past the matrix.
    let image = AlignedBuffer::zeroed(fmt.expert_stride_bytes as usize, 16).unwrap();
    let acts = AlignedBuffer::zeroed(16, 16).unwrap();
    let mut hidden = [0f32; 2];
    let mut scratch = AlignedBuffer::zeroed(64, 16).unwrap();
    let mut call = GateUpCall {
        glu: GUILD_CPU_EXPERT_GLU_SWIGLU,
        expert_index: 2,
        token_count: 1,
        rows: 0..2,
        expert_image: image.as_slice(),
        activations: acts.as_slice(),
        hidden: &mut hidden,
    };
    match table.gate_up_rows(&fmt, &mut call, scratch.as_mut_slice()) {
        Err(ExpertError::Arguments { problem, .. }) => {
            assert_eq!(problem, "expert 2 is not below expert_count 2");
        }
        other => panic!("expected an argument refusal, got {other:?}"),
    }
    call.expert_index = 0;
    call.rows = 1..3;
    match table.gate_up_rows(&fmt, &mut call, scratch.as_mut_slice()) {
        Err(ExpertError::Arguments { problem, .. }) => {
            assert_eq!(problem, "rows 1..3 are not within 0..2");
        }
        other => panic!("expected an argument refusal, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The worker pool
// ---------------------------------------------------------------------------------------------

const HIDDEN: usize = 8;
const INTER: usize = 4;
const EXPERTS: usize = 6;

/// A deterministic small value for position `i` of stream `seed`.
fn value(seed: usize, i: usize) -> f32 {
    (((seed * 31 + i * 17) % 23) as f32 - 11.0) / 16.0
}

/// Expert `e`'s image: its index, then gate, up and down.
fn expert_image(fmt: &guild_cpu_expert_format_v1_t, e: usize) -> (AlignedBuffer, Vec<f32>) {
    let n = HIDDEN * INTER;
    let weights: Vec<f32> = (0..3 * n).map(|i| value(e + 1, i)).collect();
    let mut bytes = vec![0u8; fmt.expert_stride_bytes as usize];
    bytes[..4].copy_from_slice(&(e as u32).to_le_bytes());
    bytes[16..].copy_from_slice(&f32_bytes(&weights));
    (aligned(&bytes), weights)
}

/// The tokens routed to expert `e` (1 to 3) and their F32 rows.
fn tokens(e: usize) -> Vec<f32> {
    let count = 1 + e % 3;
    (0..count * HIDDEN).map(|i| value(100 + e, i)).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// What expert `e` computes for its tokens, in the test's own arithmetic.
fn reference(weights: &[f32], x: &[f32], token_weights: &[f32]) -> Vec<f32> {
    let n = HIDDEN * INTER;
    let (gate, up, down) = (&weights[..n], &weights[n..2 * n], &weights[2 * n..]);
    let mut out = Vec::new();
    for (t, row) in x.chunks(HIDDEN).enumerate() {
        let h: Vec<f32> = (0..INTER)
            .map(|r| {
                let g = dot(&gate[r * HIDDEN..][..HIDDEN], row);
                g / (1.0 + (-g).exp()) * dot(&up[r * HIDDEN..][..HIDDEN], row)
            })
            .collect();
        out.extend((0..HIDDEN).map(|r| token_weights[t] * dot(&down[r * INTER..][..INTER], &h)));
    }
    out
}

/// Runs one MoE layer's experts through the pool with `threads` workers, gate/up split in two
/// row halves per expert, and returns every expert's output rows.
fn run_layer(table: &BoundExpertTable, threads: usize) -> Vec<Vec<f32>> {
    let fmt = format(HIDDEN as u64, INTER as u64, EXPERTS as u64);
    let pool = ExpertPool::new(threads);
    assert_eq!(pool.threads(), threads);
    let images: Vec<AlignedBuffer> = (0..EXPERTS).map(|e| expert_image(&fmt, e).0).collect();
    let x: Vec<Vec<f32>> = (0..EXPERTS).map(tokens).collect();
    let count = |e: usize| (x[e].len() / HIDDEN) as u32;

    // Quantize each expert's tokens (F32 rows: a copy), on the caller's thread.
    let acts: Vec<AlignedBuffer> = (0..EXPERTS)
        .map(|e| {
            let mut dst = AlignedBuffer::zeroed(x[e].len() * 4, 16).unwrap();
            table
                .quantize_activation(&fmt, u64::from(count(e)), &x[e], dst.as_mut_slice())
                .unwrap();
            dst
        })
        .collect();

    // Gate/up: two tasks per expert, each over half the rows into its own hidden buffer.
    let mut halves: Vec<[Vec<f32>; 2]> = (0..EXPERTS)
        .map(|e| {
            [
                vec![0f32; count(e) as usize * INTER],
                vec![0f32; count(e) as usize * INTER],
            ]
        })
        .collect();
    let mut tasks = Vec::new();
    for (e, [low, high]) in halves.iter_mut().enumerate() {
        for (rows, hidden) in [(0..2, low), (2..4, high)] {
            tasks.push(ExpertTask::GateUp(GateUpCall {
                glu: GUILD_CPU_EXPERT_GLU_SWIGLU,
                expert_index: e as u32,
                token_count: count(e),
                rows,
                expert_image: images[e].as_slice(),
                activations: acts[e].as_slice(),
                hidden,
            }));
        }
    }
    pool.run(table, &fmt, tasks).unwrap();

    // Join the halves and quantize the hidden rows.
    let hidden: Vec<AlignedBuffer> = halves
        .iter()
        .enumerate()
        .map(|(e, [low, high])| {
            let mut rows = low.clone();
            for (i, v) in rows.iter_mut().enumerate() {
                if i % INTER >= 2 {
                    *v = high[i];
                }
            }
            let mut dst = AlignedBuffer::zeroed(rows.len() * 4, 16).unwrap();
            table
                .quantize_hidden(&fmt, u64::from(count(e)), &rows, dst.as_mut_slice())
                .unwrap();
            dst
        })
        .collect();

    // Down: one task per expert, accumulating onto ones, with router weights.
    let weights: Vec<Vec<f32>> = (0..EXPERTS)
        .map(|e| {
            (0..count(e) as usize)
                .map(|t| 0.25 + 0.5 * t as f32)
                .collect()
        })
        .collect();
    let mut outputs: Vec<Vec<f32>> = (0..EXPERTS)
        .map(|e| vec![1.0; count(e) as usize * HIDDEN])
        .collect();
    let tasks = outputs
        .iter_mut()
        .enumerate()
        .map(|(e, dst)| {
            ExpertTask::Down(DownCall {
                flags: GUILD_CPU_EXPERT_DOWN_ACCUMULATE,
                expert_index: e as u32,
                token_count: count(e),
                rows: 0..HIDDEN as u64,
                expert_image: images[e].as_slice(),
                hidden: hidden[e].as_slice(),
                token_weights: Some(&weights[e]),
                dst,
            })
        })
        .collect();
    pool.run(table, &fmt, tasks).unwrap();
    outputs
}

#[test]
fn the_pool_runs_a_layer_identically_on_one_and_four_threads() {
    let f = fixture(&[expert_ref_spec()]);
    let table = bind(&f, "test.expert_ref.cpu");
    let one = run_layer(&table, 1);
    let four = run_layer(&table, 4);
    let bits = |v: &Vec<Vec<f32>>| -> Vec<Vec<u32>> {
        v.iter()
            .map(|r| r.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    assert_eq!(bits(&one), bits(&four));

    // And the numbers are the layer's: 1 + w[t] * down . swiglu(gate . x, up . x).
    let fmt = format(HIDDEN as u64, INTER as u64, EXPERTS as u64);
    for (e, got) in one.iter().enumerate() {
        let x = tokens(e);
        let token_weights: Vec<f32> = (0..x.len() / HIDDEN)
            .map(|t| 0.25 + 0.5 * t as f32)
            .collect();
        let want: Vec<f32> = reference(&expert_image(&fmt, e).1, &x, &token_weights)
            .into_iter()
            .map(|v| 1.0 + v)
            .collect();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "expert {e} value {i}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn a_failing_task_is_reported_with_its_expert_and_the_providers_text() {
    let f = fixture(&[expert_ref_spec()]);
    let table = bind(&f, "test.expert_ref.cpu");
    let fmt = format(HIDDEN as u64, INTER as u64, EXPERTS as u64);
    let images: Vec<AlignedBuffer> = (0..EXPERTS).map(|e| expert_image(&fmt, e).0).collect();
    let hidden = aligned(&f32_bytes(&[0.5; INTER]));
    let mut outputs = vec![vec![0f32; HIDDEN]; EXPERTS];
    let tasks = outputs
        .iter_mut()
        .enumerate()
        .map(|(e, dst)| {
            // Task 3 names expert 3 but hands over expert 2's image, which the provider refuses.
            let image = if e == 3 { &images[2] } else { &images[e] };
            ExpertTask::Down(DownCall {
                flags: 0,
                expert_index: e as u32,
                token_count: 1,
                rows: 0..HIDDEN as u64,
                expert_image: image.as_slice(),
                hidden: hidden.as_slice(),
                token_weights: None,
                dst,
            })
        })
        .collect();
    let failed = ExpertPool::new(4).run(&table, &fmt, tasks);
    assert_eq!(
        failed,
        Err(PoolError {
            task: 3,
            expert_index: 3,
            error: ExpertError::Provider {
                callback: "down_rows",
                reason: PluginReason {
                    status: GUILD_STATUS_ERR_INVALID_ARGUMENT,
                    component: "test.expert_ref".into(),
                    message: "expert image 2 handed over as expert 3".into(),
                },
            },
        })
    );
    // The other tasks ran: every output but the refused one was written.
    for (e, out) in outputs.iter().enumerate() {
        assert_eq!(out.iter().any(|v| *v != 0.0), e != 3, "expert {e}: {out:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The lease
// ---------------------------------------------------------------------------------------------

#[test]
fn a_bound_table_keeps_its_package_loaded_until_it_is_dropped() {
    let f = fixture(&[expert_ref_spec(), probe_spec("cpe1")]);
    let pkg = PackageId::new("test.expert_ref").unwrap();
    let table = bind(&f, "test.expert_ref.cpu");
    assert_eq!(f.host.active_package_leases(&pkg), 1);

    match f.host.disable(&pkg) {
        Err(HostError::Leased(Leased {
            id,
            action,
            bindings,
            ..
        })) => assert_eq!(
            (id, action, bindings),
            (pkg.clone(), QuiescentAction::Unload, 1)
        ),
        other => panic!("expected a lease refusal, got {other:?}"),
    }
    assert_eq!(f.loader.open_libraries(), 2, "the refusal closed nothing");

    // Still callable through the copy made at bind time.
    let fmt = format(HIDDEN as u64, INTER as u64, 1);
    let mut dst = AlignedBuffer::zeroed(HIDDEN * 4, 16).unwrap();
    table
        .quantize_activation(&fmt, 1, &[0.5; HIDDEN], dst.as_mut_slice())
        .unwrap();
    assert_eq!(floats(dst.as_slice()), [0.5; HIDDEN]);

    drop(table);
    assert_eq!(f.host.active_package_leases(&pkg), 0);
    assert_eq!(f.host.disable(&pkg).unwrap().to_string(), "1.0.0");
    assert_eq!(
        f.loader.open_libraries(),
        1,
        "the provider's library closed"
    );
    assert_eq!(
        BoundExpertTable::bind_id(f.host.kernels(), &impl_id("test.expert_ref.cpu")).map(|_| ()),
        Err(BindError::NoSuchKernel(impl_id("test.expert_ref.cpu")))
    );
}

// ---------------------------------------------------------------------------------------------
// CDD1, CDA1, CDM1
// ---------------------------------------------------------------------------------------------

/// ext_probe's `cuda__all` case: one CUDA kernel carrying CDD1, an unknown tag, CDA1 and CDM1
/// with its Qwen group.
fn cuda_probe_spec() -> Spec {
    let mut spec = probe_spec("cuda");
    spec.files[0].0 = "lib/libext_probe__cuda__all.so".into();
    spec.backends = vec!["cuda".into()];
    spec
}

#[test]
fn a_cuda_kernels_tables_are_bound_together_and_their_queries_reach_the_plugin() {
    let f = fixture(&[cuda_probe_spec()]);
    let id = impl_id("test.ext_probe.cuda");
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &id).unwrap();
    assert_eq!(tables.impl_id(), &id);
    let dense = tables.dense().expect("CDD1");
    let attn = tables.attn().expect("CDA1");
    let moe = tables.moe().expect("CDM1");
    let qwen = tables.qwen().expect("CDMQ");
    assert_eq!(
        (
            dense.version(),
            attn.version(),
            moe.version(),
            qwen.version()
        ),
        (1, 1, 1, 1)
    );
    for absent in [
        dense.absent_callbacks(),
        attn.absent_callbacks(),
        moe.absent_callbacks(),
    ] {
        assert!(absent.is_empty(), "{absent:?}");
    }
    // The probe's Qwen group leaves two of its optional callbacks NULL.
    assert_eq!(qwen.absent_callbacks(), ["fused_gr", "ple"]);
    assert!(dense.table().header.next.is_null());
    assert!(moe.table().qwen.is_null(), "the group is bound beside CDM1");

    // CDA1 configure: max_splits must be a power of two in 1..=64.
    tables
        .configure_attn_int(GUILD_CUDA_ATTN_CONFIG_MAX_SPLITS, 8)
        .unwrap();
    assert_eq!(
        tables.configure_attn_int(GUILD_CUDA_ATTN_CONFIG_MAX_SPLITS, 3),
        Err(ExpertError::Provider {
            callback: "configure",
            reason: PluginReason {
                status: GUILD_STATUS_ERR_INVALID_ARGUMENT,
                component: "test.ext_probe".into(),
                message: "max_splits must be a power of two in 1..=64".into(),
            },
        })
    );
    // CDM1 query_workspace: route needs token_count * expert_count * 4 bytes.
    assert_eq!(tables.route_workspace(0, 3, 8, 2), Ok(96));

    // The kernel is no CPE1 provider, and a CPE1 kernel has no CUDA tables.
    match BoundExpertTable::bind_id(f.host.kernels(), &id) {
        Err(BindError::NoExpertTable { impl_id, .. }) => assert_eq!(impl_id, id),
        other => panic!("expected NoExpertTable, got {other:?}"),
    }
}

#[test]
fn bound_cuda_tables_keep_their_package_loaded_until_dropped() {
    let f = fixture(&[cuda_probe_spec(), probe_spec("cpe1")]);
    let pkg = PackageId::new("test.ext_probe_cuda").unwrap();
    assert_eq!(
        BoundCudaTables::bind_id(f.host.kernels(), &impl_id("test.ext_probe.cpe1")).map(|_| ()),
        Err(CudaBindError::NoCudaTables(impl_id("test.ext_probe.cpe1")))
    );
    let tables =
        BoundCudaTables::bind_id(f.host.kernels(), &impl_id("test.ext_probe.cuda")).unwrap();
    assert_eq!(tables.package(), &pkg);
    assert_eq!(f.host.active_package_leases(&pkg), 1);
    match f.host.disable(&pkg) {
        Err(HostError::Leased(Leased {
            id,
            action,
            bindings,
            ..
        })) => assert_eq!(
            (id, action, bindings),
            (pkg.clone(), QuiescentAction::Unload, 1)
        ),
        other => panic!("expected a lease refusal, got {other:?}"),
    }
    assert_eq!(f.loader.open_libraries(), 2);
    assert_eq!(tables.route_workspace(0, 1, 4, 1), Ok(16));
    drop(tables);
    assert_eq!(f.host.disable(&pkg).unwrap().to_string(), "1.0.0");
    assert_eq!(
        f.loader.open_libraries(),
        1,
        "the provider's library closed"
    );
}

// ---------------------------------------------------------------------------------------------
// Planar Q2 conversion and the ordered combine (CPU backend v2)
// ---------------------------------------------------------------------------------------------

/// An IEEE binary16 bit pattern as F32 (normal and zero values: the probe stores no others).
fn f16(bits: u16) -> f32 {
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f32::from(bits & 0x3ff);
    let magnitude = if exponent == 0 {
        mantissa * 2f32.powi(-24)
    } else {
        (1024.0 + mantissa) * 2f32.powi(exponent - 25)
    };
    if bits & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// Decodes one planar Q2 row of `elements` as cpu_backend_abi.h lays it out: quants, scales,
/// d and dmin planes; element = d * scale * q - dmin * min.
fn decode_planar_q2(row: &[u8], elements: usize) -> Vec<f32> {
    let n = elements / 256;
    assert_eq!(row.len(), n * 84);
    (0..elements)
        .map(|e| {
            let (b, i) = (e / 256, e % 256);
            let q = f32::from((row[b * 64 + i % 64] >> (2 * (i / 64))) & 3);
            let sm = row[n * 64 + b * 16 + i / 16];
            let d = f16(u16::from_le_bytes([
                row[n * 80 + 2 * b],
                row[n * 80 + 2 * b + 1],
            ]));
            let dmin = f16(u16::from_le_bytes([
                row[n * 82 + 2 * b],
                row[n * 82 + 2 * b + 1],
            ]));
            d * f32::from(sm & 0xf) * q - dmin * f32::from(sm >> 4)
        })
        .collect()
}

const Q2_ELEMENTS: usize = 512;
const Q2_ROW_BYTES: usize = 2 * 84;

/// Two rows of two blocks: the first holds only the four levels -1, 0, 1, 2 of every group's
/// grid; the second a spread of values in [-1.125, 2.375] that fall between levels.
fn q2_source() -> Vec<f32> {
    let on_grid = (0..Q2_ELEMENTS).map(|i| (i % 4) as f32 - 1.0);
    let between = (0..Q2_ELEMENTS).map(|i| ((i * 37) % 29) as f32 / 8.0 - 1.125);
    on_grid.chain(between).collect()
}

#[test]
fn planar_q2_rows_round_trip_through_the_plugins_reference() {
    let f = fixture(&[probe_spec("cpu2")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    let src = q2_source();
    let mut q2 = vec![0u8; 2 * Q2_ROW_BYTES];
    table
        .quantize_planar_q2(&mut PlanarQ2QuantizeCall {
            row_count: 2,
            row_elements: Q2_ELEMENTS as u64,
            src: &src,
            importance: None,
            dst: &mut q2,
        })
        .unwrap();
    // Every group of the first row spans [-1, 2] in steps of 1: d = dmin = 1/15 as binary16
    // (0x2C44), scale = min = 15 in every group.
    let n = Q2_ELEMENTS / 256;
    let first = &q2[..Q2_ROW_BYTES];
    assert_eq!(
        &first[n * 80..n * 84],
        &[0x44, 0x2C, 0x44, 0x2C, 0x44, 0x2C, 0x44, 0x2C]
    );
    assert!(
        first[n * 64..n * 80].iter().all(|sm| *sm == 0xFF),
        "{first:?}"
    );

    let mut back = vec![0f32; 2 * Q2_ELEMENTS];
    table
        .dequantize_planar_q2(&mut PlanarQ2DequantizeCall {
            row_count: 2,
            row_elements: Q2_ELEMENTS as u64,
            src: &q2,
            dst: &mut back,
        })
        .unwrap();
    // The provider's expansion is the header's formula over the planes it wrote, row by row.
    for (row, got) in q2
        .chunks_exact(Q2_ROW_BYTES)
        .zip(back.chunks_exact(Q2_ELEMENTS))
    {
        assert_eq!(got, decode_planar_q2(row, Q2_ELEMENTS));
    }
    // Values on the grid come back up to the binary16 rounding of d and dmin.
    for (i, (x, y)) in src[..Q2_ELEMENTS].iter().zip(&back).enumerate() {
        assert!((x - y).abs() <= 2e-3, "element {i}: {x} became {y}");
    }
    // Values between levels come back within half a step (1/2 of 3.5 / 3) and the rounding of
    // the group's scale and minimum to 4 bits.
    for (i, (x, y)) in src[Q2_ELEMENTS..]
        .iter()
        .zip(&back[Q2_ELEMENTS..])
        .enumerate()
    {
        assert!((x - y).abs() <= 0.7, "element {i}: {x} became {y}");
    }
    let mean_error = src[Q2_ELEMENTS..]
        .iter()
        .zip(&back[Q2_ELEMENTS..])
        .map(|(x, y)| (x - y).abs())
        .sum::<f32>()
        / Q2_ELEMENTS as f32;
    assert!(mean_error < 0.35, "mean error {mean_error}");
}

#[test]
fn planar_q2_arguments_that_do_not_fit_are_refused_before_the_call() {
    let f = fixture(&[probe_spec("cpu2")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    let src = q2_source();
    let refusal = |result: Result<(), ExpertError>| match result {
        Err(ExpertError::Arguments { callback, problem }) => (callback, problem),
        other => panic!("expected an argument refusal, got {other:?}"),
    };

    let mut q2 = vec![0u8; 2 * Q2_ROW_BYTES - 1];
    let mut call = PlanarQ2QuantizeCall {
        row_count: 2,
        row_elements: Q2_ELEMENTS as u64,
        src: &src,
        importance: None,
        dst: &mut q2,
    };
    assert_eq!(
        refusal(table.quantize_planar_q2(&mut call)),
        (
            "quantize_planar_q2",
            "dst: 336 needed for 2 rows of 168, 335 given".to_owned()
        )
    );
    call.row_elements = 100;
    assert_eq!(
        refusal(table.quantize_planar_q2(&mut call)).1,
        "row_elements 100 is not a non-zero multiple of 256"
    );
    call.row_elements = 256;
    call.importance = Some(&src[..255]);
    assert_eq!(
        refusal(table.quantize_planar_q2(&mut call)).1,
        "importance: 256 needed for 1 rows of 256, 255 given"
    );
    assert!(q2.iter().all(|b| *b == 0), "nothing was written");

    let q2 = vec![0u8; 2 * Q2_ROW_BYTES];
    let mut back = vec![0f32; 2 * Q2_ELEMENTS - 1];
    assert_eq!(
        refusal(table.dequantize_planar_q2(&mut PlanarQ2DequantizeCall {
            row_count: 2,
            row_elements: Q2_ELEMENTS as u64,
            src: &q2,
            dst: &mut back,
        })),
        (
            "dequantize_planar_q2",
            "dst: 1024 needed for 2 rows of 512, 1023 given".to_owned()
        )
    );
    assert_eq!(
        refusal(table.dequantize_planar_q2(&mut PlanarQ2DequantizeCall {
            row_count: 3,
            row_elements: Q2_ELEMENTS as u64,
            src: &q2,
            dst: &mut back,
        }))
        .1,
        "src: 504 needed for 3 rows of 168, 336 given"
    );
}

/// Four expert rows of width 3: row r is `[r + 1, -(r + 1) / 2, 4]`.
fn expert_rows() -> Vec<f32> {
    (0..4)
        .flat_map(|r| {
            let r = r as f32 + 1.0;
            [r, -r / 2.0, 4.0]
        })
        .collect()
}

#[test]
fn combine_ordered_sums_the_slots_rows_in_order_through_the_plugin() {
    let f = fixture(&[probe_spec("cpu2")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    let rows = expert_rows();
    let row = |r: usize| &rows[r * 3..r * 3 + 3];
    // Token 0 takes rows 2 and 0 (its middle slot is skipped); token 1 takes 3, 1 and 1 again.
    let slots = [2, -1, 0, 3, 1, 1];
    let weights = [0.5, 9.0, 0.25, 1.0, -0.5, 2.0];
    let shared = [1.0, 1.0, 1.0, 0.0, 0.5, 0.0];
    let mut dst = [7.0f32; 6];
    table
        .combine_ordered(&mut CombineCall {
            flags: 0,
            token_count: 2,
            top_k: 3,
            hidden_size: 3,
            expert_outputs: &rows,
            slots: &slots,
            weights: Some(&weights),
            shared_output: Some(&shared),
            dst: &mut dst,
        })
        .unwrap();
    let mut expected = [0f32; 6];
    for t in 0..2 {
        for i in 0..3 {
            let mut acc = 0f32;
            for k in 0..3 {
                if let Ok(r) = usize::try_from(slots[t * 3 + k]) {
                    acc += weights[t * 3 + k] * row(r)[i];
                }
            }
            expected[t * 3 + i] = acc + shared[t * 3 + i];
        }
    }
    assert_eq!(dst, expected);
    assert_eq!(dst, [2.75, 0.125, 4.0, 7.0, -3.0, 10.0]);

    // Unweighted, no shared row, added to what dst holds: each token adds its rows' sum.
    table
        .combine_ordered(&mut CombineCall {
            flags: GUILD_CPU_COMBINE_ACCUMULATE,
            token_count: 2,
            top_k: 3,
            hidden_size: 3,
            expert_outputs: &rows,
            slots: &slots,
            weights: None,
            shared_output: None,
            dst: &mut dst,
        })
        .unwrap();
    assert_eq!(
        dst,
        [2.75 + 4.0, 0.125 - 2.0, 12.0, 7.0 + 8.0, -3.0 - 4.0, 22.0]
    );
}

#[test]
fn combine_arguments_that_do_not_fit_are_refused_before_the_call() {
    let f = fixture(&[probe_spec("cpu2")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    let rows = expert_rows();
    let mut dst = [7.0f32; 6];
    let mut call = CombineCall {
        flags: 0,
        token_count: 2,
        top_k: 3,
        hidden_size: 3,
        expert_outputs: &rows,
        slots: &[2, -1, 0, 3, 4, 1],
        weights: None,
        shared_output: None,
        dst: &mut dst,
    };
    let refusal = |result: Result<(), ExpertError>| match result {
        Err(ExpertError::Arguments { callback, problem }) => (callback, problem),
        other => panic!("expected an argument refusal, got {other:?}"),
    };
    assert_eq!(
        refusal(table.combine_ordered(&mut call)),
        (
            "combine_ordered",
            "slot 4 names row 4 of 4 expert rows".to_owned()
        )
    );
    call.slots = &[0, 1, 2, 3, 0];
    assert_eq!(
        refusal(table.combine_ordered(&mut call)).1,
        "slots: 6 needed for 2 rows of 3, 5 given"
    );
    call.slots = &[0; 6];
    call.weights = Some(&[1.0; 5]);
    assert_eq!(
        refusal(table.combine_ordered(&mut call)).1,
        "weights: 6 needed for 2 rows of 3, 5 given"
    );
    call.weights = None;
    call.shared_output = Some(&[1.0; 3]);
    assert_eq!(
        refusal(table.combine_ordered(&mut call)).1,
        "shared_output: 6 needed for 2 rows of 3, 3 given"
    );
    call.shared_output = None;
    call.expert_outputs = &rows[..11];
    assert_eq!(
        refusal(table.combine_ordered(&mut call)).1,
        "expert_outputs must be whole rows of hidden_size"
    );
    assert_eq!(dst, [7.0; 6], "nothing was written");
}

#[test]
fn a_table_without_the_conversions_or_the_combine_answers_not_offered() {
    // Version 2 whose size stops after quantize_planar_q2: that one is offered and reached, the
    // two after it are not.
    let f = fixture(&[probe_case_spec("cpu2", "older", "test.ext_probe_older")]);
    let table = bind(&f, "test.ext_probe.cpu2");
    let not_offered = |callback| ExpertError::NotOffered {
        impl_id: impl_id("test.ext_probe.cpu2"),
        callback,
    };
    let src = q2_source();
    let mut q2 = vec![0u8; 2 * Q2_ROW_BYTES];
    table
        .quantize_planar_q2(&mut PlanarQ2QuantizeCall {
            row_count: 2,
            row_elements: Q2_ELEMENTS as u64,
            src: &src,
            importance: None,
            dst: &mut q2,
        })
        .unwrap();
    assert!(q2.iter().any(|b| *b != 0), "the provider wrote the rows");
    let mut back = vec![0f32; 2 * Q2_ELEMENTS];
    assert_eq!(
        table.dequantize_planar_q2(&mut PlanarQ2DequantizeCall {
            row_count: 2,
            row_elements: Q2_ELEMENTS as u64,
            src: &q2,
            dst: &mut back,
        }),
        Err(not_offered("dequantize_planar_q2"))
    );
    assert!(back.iter().all(|v| *v == 0.0), "nothing was called");
    let rows = expert_rows();
    let mut dst = [7.0f32; 3];
    assert_eq!(
        table.combine_ordered(&mut CombineCall {
            flags: 0,
            token_count: 1,
            top_k: 1,
            hidden_size: 3,
            expert_outputs: &rows,
            slots: &[0],
            weights: None,
            shared_output: None,
            dst: &mut dst,
        }),
        Err(not_offered("combine_ordered"))
    );
    assert_eq!(dst, [7.0; 3], "nothing was called");
    drop(table);
    drop(f);

    // A CPE1 version 1 table carries none of the three.
    let f = fixture(&[probe_spec("cpe1")]);
    let table = bind(&f, "test.ext_probe.cpe1");
    let not_offered = |callback| ExpertError::NotOffered {
        impl_id: impl_id("test.ext_probe.cpe1"),
        callback,
    };
    let mut q2 = vec![0u8; 2 * Q2_ROW_BYTES];
    assert_eq!(
        table.quantize_planar_q2(&mut PlanarQ2QuantizeCall {
            row_count: 2,
            row_elements: Q2_ELEMENTS as u64,
            src: &src,
            importance: None,
            dst: &mut q2,
        }),
        Err(not_offered("quantize_planar_q2"))
    );
    assert!(q2.iter().all(|b| *b == 0), "nothing was called");
    assert_eq!(
        table.dequantize_planar_q2(&mut PlanarQ2DequantizeCall {
            row_count: 2,
            row_elements: Q2_ELEMENTS as u64,
            src: &q2,
            dst: &mut back,
        }),
        Err(not_offered("dequantize_planar_q2"))
    );
    assert_eq!(
        table.combine_ordered(&mut CombineCall {
            flags: 0,
            token_count: 1,
            top_k: 1,
            hidden_size: 3,
            expert_outputs: &rows,
            slots: &[0],
            weights: None,
            shared_output: None,
            dst: &mut dst,
        }),
        Err(not_offered("combine_ordered"))
    );
    assert_eq!(dst, [7.0; 3], "nothing was called");
}
