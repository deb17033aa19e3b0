//! The safe wrappers of the CUDA tables' execution callbacks (CDD1 `project`, CDA1 `kv_append`,
//! CDM1 `elementwise`), on every machine: what a wrapper refuses before any call (so before any
//! driver or device is involved), over test-plugins/cuda_dense (CDD1, CDA1 and CDM1 tables whose
//! callbacks launch PTX) and ext_probe's `cuda__all` case (whose `project` is a host reference
//! and whose `elementwise` and `kv_append` are declarations that refuse, so that a call that
//! passes the checks reaches it and its answer or refusal comes back). The same wrappers on a
//! device, against host references, are `gpu::device::tables`.

use std::ffi::c_void;

use guild_abi::{
    GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE, GUILD_CUDA_DENSE_ACCUMULATE,
    GUILD_CUDA_DENSE_CAP_BF16_OUTPUT, GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE, GUILD_CUDA_EW_ADD,
    GUILD_CUDA_EW_AXPY, GUILD_CUDA_EW_COPY, GUILD_CUDA_EW_SCALE,
    GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE, GUILD_DTYPE_BF16, GUILD_DTYPE_F16, GUILD_DTYPE_F32,
    GUILD_DTYPE_Q8_0, GUILD_STATUS_ERR_UNSUPPORTED,
};
use guild_adapters_cuda::testing::report_skip;
use guild_adapters_cuda::{CudaError, Driver, NoDevice};
use guild_domain::ids::ImplId;
use guild_host::cuda_tables::{
    BoundCudaTables, CallProblem, CudaBindError, CudaCallError, CudaStream, DenseProject,
    DeviceSpan, Elementwise, KvAppend, KvCacheView, RowSelection,
};
use guild_host::models::PluginReason;
use guild_host::operations::DeviceSupport;
use guild_host::StreamRef;
use guild_test_support::plugins::plugin_library;
use guild_test_support::Spec;

use crate::operations::fixture_with;

pub(crate) const DENSE_PACKAGE: &str = "example.cuda_dense";
pub(crate) const DENSE_IMPL: &str = "example.cuda_dense.cuda";

/// The signed package of test-plugins/cuda_dense.
pub(crate) fn dense_spec(version: &str) -> Spec {
    let mut spec = Spec::kernel(DENSE_PACKAGE, version).library(&plugin_library("cuda_dense"));
    spec.backends = vec!["cuda".into()];
    spec.provided_ops = vec![DENSE_IMPL.into()];
    spec
}

/// ext_probe's `case` of `ext`, whose kernel is `test.ext_probe.<ext>`, as a CUDA package.
fn probe_spec(ext: &str, case: &str) -> Spec {
    let mut spec = Spec::kernel(&format!("test.ext_probe_{ext}"), "1.0.0")
        .library(&plugin_library("ext_probe"));
    spec.files[0].0 = format!("lib/libext_probe__{ext}__{case}.so");
    spec.provided_ops = vec![format!("test.ext_probe.{ext}")];
    spec.backends = vec!["cuda".into()];
    spec
}

fn impl_id(s: &str) -> ImplId {
    ImplId::new(s).unwrap()
}

/// `v` as a span of device 0. The tests that pass these to a provider use ext_probe, whose
/// reference `project` reads and writes host memory during the call; the others are refused
/// before any call.
fn span<T>(v: &mut [T]) -> DeviceSpan {
    // SAFETY: see above: the memory is live for the whole test and is only touched during the
    // (synchronous, host-side) call, or not at all.
    unsafe {
        DeviceSpan::new(
            v.as_mut_ptr().cast::<c_void>(),
            std::mem::size_of_val(v) as u64,
            0,
        )
    }
}

/// Buffers for a packed F32 product of `rows` x `cols` over `tokens`.
struct Buffers {
    weights: Vec<f32>,
    input: Vec<f32>,
    bias: Vec<f32>,
    output: Vec<f32>,
    selection: Vec<i32>,
}

impl Buffers {
    fn new(rows: usize, cols: usize, tokens: usize) -> Self {
        Buffers {
            weights: (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect(),
            input: (0..tokens * cols).map(|i| (i % 5) as f32 - 2.0).collect(),
            bias: (0..rows).map(|i| i as f32 * 0.5).collect(),
            output: vec![0.0; rows * tokens],
            selection: vec![0; rows],
        }
    }

    fn project(&mut self, rows: u64, cols: u64, tokens: u64) -> DenseProject {
        DenseProject::f32(
            rows,
            cols,
            tokens,
            span(&mut self.weights),
            span(&mut self.input),
            span(&mut self.output),
        )
    }
}

/// A stream of device 0 that no call here reaches a driver with.
fn no_stream() -> CudaStream {
    // SAFETY: the legacy default stream; the calls below are either refused before the
    // provider runs, go to ext_probe's host reference (which ignores the stream), or to
    // cuda_dense on a machine without a driver (which refuses before naming the stream).
    unsafe { CudaStream::new(StreamRef(0), 0) }
}

fn refusal(tables: &BoundCudaTables, args: &DenseProject) -> CallProblem {
    match tables.project(&no_stream(), args) {
        Err(CudaCallError::Refused {
            impl_id,
            callback,
            problem,
        }) => {
            assert_eq!((impl_id.as_str(), callback), (DENSE_IMPL, "project"));
            problem
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn project_refuses_arguments_that_do_not_fit_before_calling_the_provider() {
    let f = fixture_with(&[dense_spec("1.0.0")], DeviceSupport::host());
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &impl_id(DENSE_IMPL)).unwrap();
    let dense = tables.dense().expect("CDD1");
    assert_eq!(
        dense.table().capabilities,
        GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE
    );
    assert_eq!(dense.absent_callbacks(), ["quantize_q8_1", "mmvq"]);
    let (rows, cols, tokens) = (6u64, 8u64, 3u64);
    let mut b = Buffers::new(6, 8, 3);
    let base = b.project(rows, cols, tokens);
    let bias = span(&mut b.bias);
    let selection = span(&mut b.selection);
    let with = |change: &dyn Fn(&mut DenseProject)| {
        let mut a = base;
        change(&mut a);
        refusal(&tables, &a)
    };

    // Dtypes, capabilities and flags.
    assert_eq!(
        with(&|a| a.weight_dtype = GUILD_DTYPE_F16),
        CallProblem::Dtype {
            operand: "weights",
            dtype: GUILD_DTYPE_F16,
            allowed: "BF16 or F32"
        }
    );
    assert_eq!(
        with(&|a| a.input_dtype = 99),
        CallProblem::Dtype {
            operand: "input",
            dtype: 99,
            allowed: "BF16 or F32"
        }
    );
    assert_eq!(
        with(&|a| a.output_dtype = GUILD_DTYPE_BF16),
        CallProblem::Bf16OutputNotDeclared
    );
    assert_eq!(with(&|a| a.flags = 0b110), CallProblem::UnknownFlags(0b110));

    // Geometry.
    assert_eq!(with(&|a| a.rows = 0), CallProblem::Zero("rows"));
    assert_eq!(with(&|a| a.cols = 0), CallProblem::Zero("cols"));
    assert_eq!(with(&|a| a.tokens = 0), CallProblem::Zero("tokens"));
    assert_eq!(
        with(&|a| a.selection = Some(RowSelection {
            rows: selection,
            count: 0
        })),
        CallProblem::Zero("the selection count")
    );
    assert_eq!(
        with(&|a| a.selection = Some(RowSelection {
            rows: selection,
            count: 7
        })),
        CallProblem::SelectionTooLong { count: 7, rows: 6 }
    );
    assert_eq!(
        with(&|a| {
            a.cols = u64::MAX / 2;
            a.weight_row_stride_bytes = u64::MAX;
        }),
        CallProblem::Overflow("weights")
    );
    assert_eq!(
        with(&|a| a.tokens = u64::MAX / 16),
        CallProblem::Overflow("input")
    );

    // Strides: aligned to the element, at least a row.
    assert_eq!(
        with(&|a| a.weight_row_stride_bytes = 34),
        CallProblem::StrideMisaligned {
            operand: "weights",
            stride: 34,
            align: 4
        }
    );
    assert_eq!(
        with(&|a| a.input_row_stride_bytes = 28),
        CallProblem::StrideTooShort {
            operand: "input",
            stride: 28,
            row_bytes: 32
        }
    );
    assert_eq!(
        with(&|a| a.output_row_stride_bytes = 20),
        CallProblem::StrideTooShort {
            operand: "output",
            stride: 20,
            row_bytes: 24
        }
    );

    // Buffers: the stream's device, non-NULL, aligned, large enough for what the strides reach.
    let moved = |s: DeviceSpan, offset: usize, bytes: u64, device: i32| {
        // SAFETY: refused before any call (asserted by `refusal`).
        unsafe {
            DeviceSpan::new(
                s.ptr().cast::<u8>().wrapping_add(offset).cast(),
                bytes,
                device,
            )
        }
    };
    assert_eq!(
        with(&|a| a.input = moved(a.input, 0, a.input.bytes(), 1)),
        CallProblem::Device {
            operand: "input",
            device_id: 1,
            stream_device_id: 0
        }
    );
    assert_eq!(
        with(&|a| a.output = a.output.null()),
        CallProblem::Null("output")
    );
    let misaligned = moved(base.weights, 2, base.weights.bytes() - 2, 0);
    assert_eq!(
        with(&|a| a.weights = misaligned),
        CallProblem::Misaligned {
            operand: "weights",
            address: misaligned.ptr() as u64,
            align: 4
        }
    );
    assert_eq!(
        with(&|a| a.weights = moved(a.weights, 0, 6 * 32 - 1, 0)),
        CallProblem::TooSmall {
            operand: "weights",
            bytes: 191,
            needed: 192
        }
    );
    // A longer input stride reaches further: (tokens - 1) * stride + one row.
    assert_eq!(
        with(&|a| a.input_row_stride_bytes = 40),
        CallProblem::TooSmall {
            operand: "input",
            bytes: 96,
            needed: 2 * 40 + 32
        }
    );
    assert_eq!(
        with(&|a| a.output_row_stride_bytes = 28),
        CallProblem::TooSmall {
            operand: "output",
            bytes: 72,
            needed: 2 * 28 + 24
        }
    );
    assert_eq!(
        with(&|a| a.bias = Some(moved(bias, 0, 20, 0))),
        CallProblem::TooSmall {
            operand: "bias",
            bytes: 20,
            needed: 24
        }
    );
    assert_eq!(
        with(&|a| a.selection = Some(RowSelection {
            rows: moved(selection, 0, 8, 0),
            count: 3
        })),
        CallProblem::TooSmall {
            operand: "selection",
            bytes: 8,
            needed: 12
        }
    );
    // The output may not share a byte with an input: here it is the input itself.
    assert_eq!(
        with(&|a| a.output = moved(a.input, 0, a.input.bytes(), 0)),
        CallProblem::Overlap("input")
    );
    // Selecting fewer rows shrinks the output each token needs.
    assert_eq!(
        with(&|a| {
            a.selection = Some(RowSelection {
                rows: selection,
                count: 2,
            });
            a.output_row_stride_bytes = 8;
            a.output = moved(a.output, 0, 2 * 8 + 8 - 1, 0);
        }),
        CallProblem::TooSmall {
            operand: "output",
            bytes: 23,
            needed: 24
        }
    );

    let err = tables
        .project(&no_stream(), &DenseProject { flags: 8, ..base })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("project of {DENSE_IMPL} refused before the call: unknown flag bits 0x8")
    );
    assert_eq!(
        f.host
            .active_package_leases(&guild_test_support::id(DENSE_PACKAGE)),
        1
    );
}

/// A NULL copy of a span (same size and device), for the NULL refusal.
trait NullSpan {
    fn null(self) -> DeviceSpan;
}

impl NullSpan for DeviceSpan {
    fn null(self) -> DeviceSpan {
        // SAFETY: refused before any call (asserted by `refusal`).
        unsafe { DeviceSpan::new(std::ptr::null_mut(), self.bytes(), self.device_id()) }
    }
}

#[test]
fn without_a_driver_the_dense_plugin_refuses_project_with_its_reason() {
    let reason = match Driver::load() {
        Err(CudaError::NoDevice(NoDevice::NoDriver(reason))) => reason,
        other => {
            report_skip(
                "cuda_tables::without_a_driver_the_dense_plugin_refuses_project_with_its_reason",
                &format_args!(
                    "this machine has a CUDA driver ({})",
                    other.map_or_else(|e| e.to_string(), |d| format!("version {}", d.version()))
                ),
            );
            return;
        }
    };
    let f = fixture_with(&[dense_spec("1.0.0")], DeviceSupport::host());
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &impl_id(DENSE_IMPL)).unwrap();
    let mut b = Buffers::new(2, 4, 1);
    let args = b.project(2, 4, 1);
    // The arguments fit, so the plugin is called; it opens the driver lazily and finds none.
    assert_eq!(
        tables.project(&no_stream(), &args),
        Err(CudaCallError::Provider {
            impl_id: impl_id(DENSE_IMPL),
            callback: "project",
            reason: PluginReason {
                status: GUILD_STATUS_ERR_UNSUPPORTED,
                component: "example.cuda_dense".into(),
                message: format!("no usable CUDA driver: {reason}"),
            },
        })
    );
}

#[test]
fn project_reaches_the_provider_with_checked_arguments_and_reports_its_refusal() {
    let f = fixture_with(&[probe_spec("cuda", "all")], DeviceSupport::host());
    let id = impl_id("test.ext_probe.cuda");
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &id).unwrap();
    assert_eq!(
        tables.dense().unwrap().table().capabilities,
        GUILD_CUDA_DENSE_CAP_BF16_OUTPUT
    );
    let (rows, cols, tokens) = (5usize, 6usize, 3usize);
    let mut b = Buffers::new(rows, cols, tokens);
    b.output = vec![100.0; rows * tokens];
    let mut a = b.project(rows as u64, cols as u64, tokens as u64);
    a.bias = Some(span(&mut b.bias));
    a.flags = GUILD_CUDA_DENSE_ACCUMULATE;
    tables.project(&no_stream(), &a).unwrap();
    // ext_probe's reference: bias + the products in order, added to the output. The values
    // are small integers and halves, so every F32 step is exact.
    for t in 0..tokens {
        for r in 0..rows {
            let mut dot = b.bias[r];
            for c in 0..cols {
                dot += b.weights[r * cols + c] * b.input[t * cols + c];
            }
            assert_eq!(b.output[t * rows + r], 100.0 + dot, "token {t} row {r}");
        }
    }

    // The table declares BF16 output, so the wrapper lets it through, and the reference
    // refuses it with its own words; so it does a selection.
    let reference_refusal = CudaCallError::Provider {
        impl_id: id.clone(),
        callback: "project",
        reason: PluginReason {
            status: GUILD_STATUS_ERR_UNSUPPORTED,
            component: "test.ext_probe".into(),
            message: "the reference project takes F32 and every row".into(),
        },
    };
    let bf16 = DenseProject {
        output_dtype: GUILD_DTYPE_BF16,
        ..a
    };
    assert_eq!(
        tables.project(&no_stream(), &bf16),
        Err(reference_refusal.clone())
    );
    let selected = DenseProject {
        selection: Some(RowSelection {
            rows: span(&mut b.selection),
            count: 2,
        }),
        ..a
    };
    assert_eq!(
        tables.project(&no_stream(), &selected),
        Err(reference_refusal)
    );
    assert_eq!(a.output_dtype, GUILD_DTYPE_F32);
}

#[test]
fn project_is_not_offered_by_a_kernel_without_it() {
    let f = fixture_with(&[probe_spec("cda1", "current")], DeviceSupport::host());
    let id = impl_id("test.ext_probe.cda1");
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &id).unwrap();
    assert!(tables.dense().is_none());
    let mut b = Buffers::new(2, 2, 1);
    let err = tables
        .project(&no_stream(), &b.project(2, 2, 1))
        .unwrap_err();
    assert_eq!(
        err,
        CudaCallError::NotOffered {
            impl_id: id,
            callback: "project"
        }
    );
}

fn ew_refusal(tables: &BoundCudaTables, args: &Elementwise) -> CallProblem {
    match tables.elementwise(&no_stream(), args) {
        Err(CudaCallError::Refused {
            impl_id,
            callback,
            problem,
        }) => {
            assert_eq!((impl_id.as_str(), callback), (DENSE_IMPL, "elementwise"));
            problem
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn elementwise_refuses_arguments_that_do_not_fit_before_calling_the_provider() {
    let f = fixture_with(&[dense_spec("1.0.0")], DeviceSupport::host());
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &impl_id(DENSE_IMPL)).unwrap();
    let moe = tables.moe().expect("CDM1");
    assert_eq!(
        moe.table().capabilities,
        GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE
    );
    // The plugin's CDM1 offers elementwise alone; its workspace query says so for routing.
    let err = tables.route_workspace(0, 1, 2, 1).unwrap_err().to_string();
    assert!(err.contains("only elementwise is offered"), "{err}");

    let (rows, cols) = (4usize, 6usize);
    let mut a = vec![0f32; rows * cols];
    let mut b = vec![0f32; rows * cols];
    let mut out = vec![0f32; rows * cols];
    let base = Elementwise::f32(
        GUILD_CUDA_EW_ADD,
        rows as u64,
        cols as u64,
        span(&mut a),
        Some(span(&mut b)),
        span(&mut out),
    );
    let with = |change: &dyn Fn(&mut Elementwise)| {
        let mut e = base;
        change(&mut e);
        ew_refusal(&tables, &e)
    };
    let shifted = |s: DeviceSpan, bytes: usize| {
        // SAFETY: refused before any call (asserted by `ew_refusal`).
        unsafe {
            DeviceSpan::new(
                s.ptr().cast::<u8>().wrapping_add(bytes).cast(),
                s.bytes(),
                0,
            )
        }
    };

    assert_eq!(with(&|e| e.op = 0), CallProblem::UnknownOp(0));
    assert_eq!(with(&|e| e.op = 11), CallProblem::UnknownOp(11));
    assert_eq!(
        with(&|e| e.b = None),
        CallProblem::Missing {
            op: GUILD_CUDA_EW_ADD,
            operand: "b"
        }
    );
    assert_eq!(
        with(&|e| e.op = GUILD_CUDA_EW_COPY),
        CallProblem::Unexpected {
            op: GUILD_CUDA_EW_COPY,
            operand: "b"
        }
    );
    assert_eq!(
        with(&|e| e.b_dtype = 99),
        CallProblem::Dtype {
            operand: "b",
            dtype: 99,
            allowed: "F32, F16 or BF16"
        }
    );
    assert_eq!(with(&|e| e.rows = 0), CallProblem::Zero("rows"));
    assert_eq!(
        with(&|e| e.a_row_stride_bytes = 20),
        CallProblem::StrideTooShort {
            operand: "a",
            stride: 20,
            row_bytes: 24
        }
    );
    assert_eq!(
        with(&|e| e.out_row_stride_bytes = 28),
        CallProblem::TooSmall {
            operand: "out",
            bytes: 96,
            needed: 3 * 28 + 24
        }
    );
    // A BF16 output has 2-byte elements: a row of 12 bytes and a 2-byte alignment.
    assert_eq!(
        with(&|e| {
            e.out_dtype = GUILD_DTYPE_BF16;
            e.out_row_stride_bytes = 12;
            e.out = shifted(e.out, 1);
        }),
        CallProblem::Misaligned {
            operand: "out",
            address: base.out.ptr() as u64 + 1,
            align: 2
        }
    );
    // b of one row is enough broadcast (stride 0); with a stride it must hold every row.
    let one_row = |e: &mut Elementwise| {
        // SAFETY: refused before any call (asserted by `ew_refusal`).
        e.b = Some(unsafe { DeviceSpan::new(e.b.unwrap().ptr(), 24, 0) });
    };
    assert_eq!(
        with(&|e| one_row(e)),
        CallProblem::TooSmall {
            operand: "b",
            bytes: 24,
            needed: 96
        }
    );
    // out may be a in place, but not a moved by one element, nor a under another stride, nor
    // the one broadcast row of b.
    assert_eq!(
        with(&|e| e.out = shifted(e.a, 4)),
        CallProblem::PartialOverlap("a")
    );
    assert_eq!(
        with(&|e| {
            e.out = e.a;
            e.a_row_stride_bytes = 28;
            e.rows = 3;
        }),
        CallProblem::PartialOverlap("a")
    );
    assert_eq!(
        with(&|e| {
            e.b_row_stride_bytes = 0;
            one_row(e);
            e.out = e.b.unwrap();
            e.rows = 1;
        }),
        CallProblem::PartialOverlap("b")
    );
    assert_eq!(
        tables
            .elementwise(&no_stream(), &Elementwise { op: 42, ..base })
            .unwrap_err()
            .to_string(),
        format!("elementwise of {DENSE_IMPL} refused before the call: unknown operation 42")
    );
}

#[test]
fn elementwise_passes_in_place_and_broadcast_operands_to_the_provider() {
    // ext_probe's elementwise is a declaration that refuses every call without touching memory:
    // its refusal shows that the wrapper let the arguments through.
    let f = fixture_with(&[probe_spec("cuda", "all")], DeviceSupport::host());
    let id = impl_id("test.ext_probe.cuda");
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &id).unwrap();
    let declared = Err(CudaCallError::Provider {
        impl_id: id.clone(),
        callback: "elementwise",
        reason: PluginReason {
            status: GUILD_STATUS_ERR_UNSUPPORTED,
            component: "test.ext_probe".into(),
            message: "elementwise is a declaration only".into(),
        },
    });
    let (rows, cols) = (3u64, 5u64);
    let mut a = vec![0f32; 15];
    let mut b = vec![0f32; 5];
    let a_span = span(&mut a);
    let b_span = span(&mut b);
    // AXPY in place over a, with b's one row broadcast.
    let mut axpy = Elementwise::f32(GUILD_CUDA_EW_AXPY, rows, cols, a_span, Some(b_span), a_span);
    axpy.b_row_stride_bytes = 0;
    axpy.alpha = 0.5;
    assert_eq!(tables.elementwise(&no_stream(), &axpy), declared);
    // A unary SCALE in place.
    let scale = Elementwise::f32(GUILD_CUDA_EW_SCALE, rows, cols, a_span, None, a_span);
    assert_eq!(tables.elementwise(&no_stream(), &scale), declared);

    // A kernel without CDM1 offers no elementwise.
    let f = fixture_with(&[probe_spec("cda1", "current")], DeviceSupport::host());
    let cda1 = impl_id("test.ext_probe.cda1");
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &cda1).unwrap();
    assert_eq!(
        tables.elementwise(&no_stream(), &scale),
        Err(CudaCallError::NotOffered {
            impl_id: cda1,
            callback: "elementwise"
        })
    );
}

/// Host buffers for a small F16 cache without a block table: 3 tokens of 2 heads, keys of 4
/// and values of 6 elements, 4 blocks of 4 positions, 2 blocks per sequence, packed.
struct KvBuffers {
    k: Vec<f32>,
    v: Vec<f32>,
    seqs: Vec<i32>,
    positions: Vec<i32>,
    k_blocks: Vec<u16>,
    v_blocks: Vec<u16>,
    table: Vec<i32>,
}

impl KvBuffers {
    fn new() -> Self {
        KvBuffers {
            k: vec![0.0; 3 * 8],
            v: vec![0.0; 3 * 12],
            seqs: vec![0; 3],
            positions: vec![0; 3],
            k_blocks: vec![0; 4 * 4 * 8],
            v_blocks: vec![0; 4 * 4 * 12],
            table: vec![0; 4],
        }
    }

    fn append(&mut self) -> KvAppend {
        KvAppend {
            src_dtype: GUILD_DTYPE_F32,
            n_tokens: 3,
            cache: KvCacheView {
                dtype: GUILD_DTYPE_F16,
                n_head_kv: 2,
                head_dim_k: 4,
                head_dim_v: 6,
                block_size: 4,
                layer_index: 0,
                max_blocks_per_seq: 2,
                block_count: 4,
                k_blocks: span(&mut self.k_blocks),
                v_blocks: span(&mut self.v_blocks),
                k_block_stride_bytes: 64,
                v_block_stride_bytes: 96,
                k_position_stride_bytes: 16,
                v_position_stride_bytes: 24,
                k_head_stride_bytes: 8,
                v_head_stride_bytes: 12,
                block_table: None,
            },
            k: span(&mut self.k),
            v: span(&mut self.v),
            k_token_stride_bytes: 32,
            v_token_stride_bytes: 48,
            token_seqs: span(&mut self.seqs),
            token_positions: span(&mut self.positions),
        }
    }
}

fn kv_refusal(tables: &BoundCudaTables, args: &KvAppend) -> CallProblem {
    match tables.kv_append(&no_stream(), args) {
        Err(CudaCallError::Refused {
            impl_id,
            callback,
            problem,
        }) => {
            assert_eq!((impl_id.as_str(), callback), (DENSE_IMPL, "kv_append"));
            problem
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn kv_append_refuses_arguments_that_do_not_fit_before_calling_the_provider() {
    let f = fixture_with(&[dense_spec("1.0.0")], DeviceSupport::host());
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &impl_id(DENSE_IMPL)).unwrap();
    let attn = tables.attn().expect("CDA1");
    assert_eq!(
        attn.table().capabilities,
        GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE
    );
    assert_eq!(attn.table().kv_cache_dtypes, 1 << GUILD_DTYPE_F16);
    let mut b = KvBuffers::new();
    let base = b.append();
    let table = span(&mut b.table);
    let with = |change: &dyn Fn(&mut KvAppend)| {
        let mut a = base;
        change(&mut a);
        kv_refusal(&tables, &a)
    };
    let resized = |s: DeviceSpan, bytes: u64| {
        // SAFETY: refused before any call (asserted by `kv_refusal`).
        unsafe { DeviceSpan::new(s.ptr(), bytes, s.device_id()) }
    };

    assert_eq!(
        with(&|a| a.src_dtype = 99),
        CallProblem::Dtype {
            operand: "k and v",
            dtype: 99,
            allowed: "F32, F16 or BF16"
        }
    );
    assert_eq!(
        with(&|a| a.cache.dtype = GUILD_DTYPE_F32),
        CallProblem::Dtype {
            operand: "cache",
            dtype: GUILD_DTYPE_F32,
            allowed: "F16, BF16 or Q8_0"
        }
    );
    assert_eq!(
        with(&|a| a.cache.dtype = GUILD_DTYPE_Q8_0),
        CallProblem::NotMultiple {
            what: "head_dim_k",
            value: 4,
            of: 32
        }
    );
    // BF16 is a cache dtype of the header, but not one this table lists.
    assert_eq!(
        with(&|a| a.cache.dtype = GUILD_DTYPE_BF16),
        CallProblem::CacheDtypeNotDeclared(GUILD_DTYPE_BF16)
    );
    assert_eq!(
        with(&|a| a.cache.block_count = 0),
        CallProblem::Zero("block_count")
    );
    assert_eq!(with(&|a| a.n_tokens = 0), CallProblem::Zero("n_tokens"));
    assert_eq!(
        with(&|a| a.k_token_stride_bytes = 28),
        CallProblem::StrideTooShort {
            operand: "k",
            stride: 28,
            row_bytes: 32
        }
    );
    assert_eq!(
        with(&|a| a.v_token_stride_bytes = 50),
        CallProblem::StrideMisaligned {
            operand: "v",
            stride: 50,
            align: 4
        }
    );
    // The cache's strides nest: heads within a position within a block.
    assert_eq!(
        with(&|a| a.cache.k_head_stride_bytes = 6),
        CallProblem::StrideTooShort {
            operand: "k_blocks",
            stride: 6,
            row_bytes: 8
        }
    );
    assert_eq!(
        with(&|a| a.cache.k_position_stride_bytes = 14),
        CallProblem::StrideTooShort {
            operand: "k_blocks",
            stride: 14,
            row_bytes: 16
        }
    );
    assert_eq!(
        with(&|a| a.cache.v_block_stride_bytes = 90),
        CallProblem::StrideTooShort {
            operand: "v_blocks",
            stride: 90,
            row_bytes: 96
        }
    );
    assert_eq!(
        with(&|a| a.cache.v_blocks = resized(a.cache.v_blocks, 383)),
        CallProblem::TooSmall {
            operand: "v_blocks",
            bytes: 383,
            needed: 384
        }
    );
    assert_eq!(
        with(&|a| a.token_positions = resized(a.token_positions, 8)),
        CallProblem::TooSmall {
            operand: "token_positions",
            bytes: 8,
            needed: 12
        }
    );
    assert_eq!(
        with(&|a| a.cache.block_table = Some(resized(table, 4))),
        CallProblem::TooSmall {
            operand: "block_table",
            bytes: 4,
            needed: 8
        }
    );
    // The cache is written: it may overlap neither itself nor what is read.
    assert_eq!(
        with(&|a| a.cache.k_blocks = a.cache.v_blocks),
        CallProblem::WritesOverlap("k_blocks", "v_blocks")
    );
    assert_eq!(
        with(&|a| a.token_seqs = a.cache.k_blocks),
        CallProblem::WritesOverlap("k_blocks", "token_seqs")
    );

    // What passes the checks reaches the plugin, which refuses a block table itself (before it
    // opens a driver or names the stream).
    let mut paged = base;
    paged.cache.block_table = Some(table);
    match tables.kv_append(&no_stream(), &paged) {
        Err(CudaCallError::Provider { reason, .. }) => {
            assert_eq!(reason.status, GUILD_STATUS_ERR_UNSUPPORTED);
            assert!(reason.message.contains("takes no block table"), "{reason}");
        }
        other => panic!("expected the plugin's refusal, got {other:?}"),
    }
}

#[test]
fn kv_append_follows_the_bound_tables_cache_dtypes_and_is_not_offered_without_cda1() {
    // ext_probe's CDA1 lists F16 and BF16, and its kv_append is a declaration that refuses.
    let f = fixture_with(&[probe_spec("cuda", "all")], DeviceSupport::host());
    let id = impl_id("test.ext_probe.cuda");
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &id).unwrap();
    let mut b = KvBuffers::new();
    let mut args = b.append();
    args.cache.dtype = GUILD_DTYPE_BF16;
    assert_eq!(
        tables.kv_append(&no_stream(), &args),
        Err(CudaCallError::Provider {
            impl_id: id,
            callback: "kv_append",
            reason: PluginReason {
                status: GUILD_STATUS_ERR_UNSUPPORTED,
                component: "test.ext_probe".into(),
                message: "kv_append is a declaration only".into(),
            },
        })
    );

    let f = fixture_with(&[probe_spec("cdd1", "current")], DeviceSupport::host());
    let cdd1 = impl_id("test.ext_probe.cdd1");
    let tables = BoundCudaTables::bind_id(f.host.kernels(), &cdd1).unwrap();
    assert_eq!(
        tables.kv_append(&no_stream(), &args),
        Err(CudaCallError::NotOffered {
            impl_id: cdd1,
            callback: "kv_append"
        })
    );
}

/// A CUDA kernel's host-side code runs on the CPU: one whose descriptor requires an instruction
/// set this CPU lacks (ext_probe's `other_isa` case) is registered but not bound, the refusal
/// naming the kernel and the bits, and no lease is left.
#[test]
fn tables_of_a_kernel_needing_instructions_this_cpu_lacks_are_not_bound() {
    let f = fixture_with(&[probe_spec("cdd1", "other_isa")], DeviceSupport::host());
    let id = impl_id("test.ext_probe.cdd1");
    let required = f
        .host
        .kernels()
        .find_by_id(&id)
        .expect("the kernel is registered")
        .required_cpu_isa;
    assert!(!required.is_empty() && !guild_host::platform::cpu_isa().contains(required));
    match BoundCudaTables::bind_id(f.host.kernels(), &id) {
        Err(e @ CudaBindError::MissingCpuIsa { .. }) => {
            assert_eq!(
                e,
                CudaBindError::MissingCpuIsa {
                    impl_id: id.clone(),
                    missing: required,
                }
            );
            assert!(e.to_string().contains(&required.to_string()), "{e}");
        }
        other => panic!("expected MissingCpuIsa, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        f.host.active_package_leases(
            &guild_domain::ids::PackageId::new("test.ext_probe_cdd1").unwrap()
        ),
        0
    );
    // The same kernel without the requirement binds.
    let f = fixture_with(&[probe_spec("cdd1", "current")], DeviceSupport::host());
    assert!(BoundCudaTables::bind_id(f.host.kernels(), &id).is_ok());
}
