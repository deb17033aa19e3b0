//! CDD1 `project`, CDM1 `elementwise` and CDA1 `kv_append` of test-plugins/cuda_dense through
//! [`BoundCudaTables`] on a device: on a non-default stream (project with and without row
//! selection, bias and accumulation; elementwise for each operation the plugin computes, in
//! place and with a broadcast row; kv_append into padded F16 blocks, skipping tokens outside
//! the view), against host references that do the kernels' F32 steps in
//! their order (so the comparison is bit for bit); captured into graphs that replay them; the
//! package leased while the tables are bound.

use super::*;

use guild_abi::{
    GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE, GUILD_CUDA_DENSE_ACCUMULATE,
    GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE, GUILD_CUDA_EW_ADD, GUILD_CUDA_EW_AXPY,
    GUILD_CUDA_EW_COPY, GUILD_CUDA_EW_MUL, GUILD_CUDA_EW_SCALE, GUILD_CUDA_EW_SILU,
    GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE, GUILD_DTYPE_F16, GUILD_DTYPE_F32,
};
use guild_host::cuda_tables::{
    BoundCudaTables, CudaCallError, CudaStream, DenseProject, DeviceSpan, Elementwise, KvAppend,
    KvCacheView, RowSelection,
};

use crate::cuda_tables::{dense_spec, DENSE_IMPL, DENSE_PACKAGE};

/// What the kernel writes for a selected row outside the matrix.
const BAD_ROW: u32 = 0x7fc0_0000;

/// The shape of one product and its operands' strides, in elements.
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    tokens: usize,
    w_stride: usize,
    in_stride: usize,
    out_stride: usize,
}

/// cuda_dense's arithmetic on the host: per token and output element, the products summed left
/// to right from +0 (each product and sum rounded on its own), then the bias, then the old output
/// with `accumulate`; a selected row outside the matrix gives NaN.
fn reference(
    s: Shape,
    w: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    selection: Option<&[i32]>,
    accumulate: bool,
    out: &mut [f32],
) {
    let outputs = selection.map_or(s.rows, <[i32]>::len);
    for t in 0..s.tokens {
        for i in 0..outputs {
            let y = &mut out[t * s.out_stride + i];
            let row = selection.map_or(Some(i), |sel| usize::try_from(sel[i]).ok());
            let Some(row) = row.filter(|&r| r < s.rows) else {
                *y = f32::from_bits(BAD_ROW);
                continue;
            };
            let mut sum = 0f32;
            for c in 0..s.cols {
                sum += w[row * s.w_stride + c] * x[t * s.in_stride + c];
            }
            if let Some(b) = bias {
                sum += b[row];
            }
            *y = if accumulate { *y + sum } else { sum };
        }
    }
}

/// Values with many significant bits, so that a different order or a fused step would show.
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let k = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
            (k % 20_011) as f32 / 1_013.0 - 9.5
        })
        .collect()
}

/// `buffer` as a span of `gpu`'s device.
fn on_device(gpu: &Gpu, buffer: &DeviceBuffer) -> DeviceSpan {
    // SAFETY: every caller keeps `buffer` (device memory of this device, `bytes()` long) alive
    // and untouched until it has synchronised the stream its calls named.
    unsafe { DeviceSpan::new(buffer.as_ptr(), buffer.bytes() as u64, gpu.ordinal()) }
}

#[test]
fn dense_project_runs_on_a_stream_and_a_captured_graph_replays_it() {
    let test =
        "gpu::device::tables::dense_project_runs_on_a_stream_and_a_captured_graph_replays_it";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let f = fixture(&gpu, &[dense_spec("1.0.0")]);
    let package = id(DENSE_PACKAGE);
    let tables =
        BoundCudaTables::bind_id(f.host.kernels(), &ImplId::new(DENSE_IMPL).unwrap()).unwrap();
    let capabilities = tables.dense().expect("CDD1").table().capabilities;
    assert_ne!(capabilities & GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE, 0);

    // Bound tables hold the package: what would unload its code is refused.
    assert_eq!(f.host.active_package_leases(&package), 1);
    match f.host.disable(&package) {
        Err(HostError::Leased(Leased {
            action: QuiescentAction::Unload,
            bindings: 1,
            ..
        })) => {}
        other => panic!("expected a lease refusal, got {other:?}"),
    }

    let stream = gpu.stream().unwrap();
    gpu.make_current().unwrap();
    // SAFETY: a stream of this device's primary context, current on this thread; it is
    // synchronised, and the graph objects destroyed, before `tables` is dropped below.
    let on_stream = unsafe { CudaStream::new(StreamRef(stream.address()), gpu.ordinal()) };

    // Padded strides, so that a kernel that assumed packed rows would read and write wrong.
    let s = Shape {
        rows: 37,
        cols: 53,
        tokens: 5,
        w_stride: 56,
        in_stride: 54,
        out_stride: 40,
    };
    let w = values(s.rows * s.w_stride, 1);
    let x = values(s.tokens * s.in_stride, 2);
    let bias = values(s.rows, 3);
    let selection: Vec<i32> = vec![5, 0, 36, 5, 17, 2];
    let sentinel = values(s.tokens * s.out_stride, 4);
    let weights = gpu.upload(&w).unwrap();
    let input = gpu.upload(&x).unwrap();
    let bias_buffer = gpu.upload(&bias).unwrap();
    let selection_buffer = gpu.upload(&selection).unwrap();
    let output = gpu.upload(&sentinel).unwrap();
    let n_out = s.tokens * s.out_stride;

    let mut base = DenseProject::f32(
        s.rows as u64,
        s.cols as u64,
        s.tokens as u64,
        on_device(&gpu, &weights),
        on_device(&gpu, &input),
        on_device(&gpu, &output),
    );
    base.weight_row_stride_bytes = (s.w_stride * 4) as u64;
    base.input_row_stride_bytes = (s.in_stride * 4) as u64;
    base.output_row_stride_bytes = (s.out_stride * 4) as u64;
    let selected = Some(RowSelection {
        rows: on_device(&gpu, &selection_buffer),
        count: selection.len() as u32,
    });

    // Every case starts from the sentinel output, so that an untouched padding shows too.
    for (case, bias_on, select, accumulate) in [
        ("all rows", false, false, false),
        ("all rows, bias", true, false, false),
        ("selected rows, bias, accumulate", true, true, true),
        ("selected rows, accumulate", false, true, true),
    ] {
        output.write(&sentinel).unwrap();
        let mut args = base;
        if bias_on {
            args.bias = Some(on_device(&gpu, &bias_buffer));
        }
        if select {
            args.selection = selected;
        }
        if accumulate {
            args.flags = GUILD_CUDA_DENSE_ACCUMULATE;
        }
        tables
            .project(&on_stream, &args)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        stream.synchronize().unwrap();
        let mut want = sentinel.clone();
        reference(
            s,
            &w,
            &x,
            bias_on.then_some(&bias[..]),
            select.then_some(&selection[..]),
            accumulate,
            &mut want,
        );
        assert_eq!(
            bits(&output.read::<f32>(n_out).unwrap()),
            bits(&want),
            "{case}"
        );
    }

    // A selected index outside the matrix (device data the host cannot check) reads nothing
    // and writes NaN.
    let bad: Vec<i32> = vec![1, -1, 37, 36];
    let bad_buffer = gpu.upload(&bad).unwrap();
    output.write(&sentinel).unwrap();
    let mut args = base;
    args.selection = Some(RowSelection {
        rows: on_device(&gpu, &bad_buffer),
        count: bad.len() as u32,
    });
    tables.project(&on_stream, &args).unwrap();
    stream.synchronize().unwrap();
    let mut want = sentinel.clone();
    reference(s, &w, &x, None, Some(&bad), false, &mut want);
    assert_eq!(bits(&output.read::<f32>(n_out).unwrap()), bits(&want));

    // What the plugin does not support it refuses itself, with its words.
    let bf16_input = DenseProject {
        input_dtype: guild_abi::GUILD_DTYPE_BF16,
        ..base
    };
    match tables.project(&on_stream, &bf16_input) {
        Err(CudaCallError::Provider { reason, .. }) => {
            assert_eq!(reason.status, GUILD_STATUS_ERR_UNSUPPORTED);
            assert_eq!(reason.component, "example.cuda_dense");
            assert!(
                reason
                    .message
                    .contains("F32 weights, input and output only"),
                "{reason}"
            );
        }
        other => panic!("expected the plugin's refusal, got {other:?}"),
    }

    // Captured into a graph (bias and selection on), instantiated, replayed over new inputs.
    let mut args = base;
    args.bias = Some(on_device(&gpu, &bias_buffer));
    args.selection = selected;
    stream.begin_capture().unwrap();
    let captured = tables.project(&on_stream, &args);
    let graph = stream.end_capture().unwrap();
    captured.unwrap();
    output.write(&sentinel).unwrap();
    let exec = graph.instantiate().unwrap();
    for round in 0..3u32 {
        let x = values(s.tokens * s.in_stride, 10 + round);
        input.write(&x).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        let mut want = sentinel.clone();
        reference(s, &w, &x, Some(&bias), Some(&selection), false, &mut want);
        assert_eq!(
            bits(&output.read::<f32>(n_out).unwrap()),
            bits(&want),
            "replay {round}"
        );
    }
    exec.destroy().unwrap();
    graph.destroy().unwrap();
    stream.synchronize().unwrap();

    // Dropping the tables gives the package back.
    drop(tables);
    assert_eq!(f.host.active_package_leases(&package), 0);
    assert_eq!(f.host.disable(&package).unwrap().to_string(), "1.0.0");
    note(
        test,
        &format_args!(
            "project: 4 stream cases, out-of-range selection and 3 graph replays bit-exact \
             ({} x {} over {} tokens)",
            s.rows, s.cols, s.tokens
        ),
    );
}

/// cuda_dense's elementwise on the host, each step rounded on its own: `out[r][c]` for rows of
/// `a` (stride `sa`), `b` (stride `sb`, 0 broadcasts) and `out` (stride `so`), in elements.
#[allow(clippy::too_many_arguments)]
fn elementwise_reference(
    op: u32,
    alpha: f32,
    beta: f32,
    (rows, cols): (usize, usize),
    (a, sa): (&[f32], usize),
    b: Option<(&[f32], usize)>,
    (out, so): (&mut [f32], usize),
) {
    for r in 0..rows {
        for c in 0..cols {
            let x = a[r * sa + c];
            let y = b.map_or(0.0, |(b, sb)| b[r * sb + c]);
            out[r * so + c] = match op {
                GUILD_CUDA_EW_ADD => x + y,
                GUILD_CUDA_EW_MUL => x * y,
                GUILD_CUDA_EW_SCALE => alpha * x + beta,
                GUILD_CUDA_EW_AXPY => x + alpha * y,
                _ => x,
            };
        }
    }
}

#[test]
fn elementwise_runs_on_a_stream_in_place_and_broadcast_and_a_captured_graph_replays_it() {
    let test = concat!(
        "gpu::device::tables::",
        "elementwise_runs_on_a_stream_in_place_and_broadcast_and_a_captured_graph_replays_it"
    );
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let f = fixture(&gpu, &[dense_spec("1.0.0")]);
    let package = id(DENSE_PACKAGE);
    let tables =
        BoundCudaTables::bind_id(f.host.kernels(), &ImplId::new(DENSE_IMPL).unwrap()).unwrap();
    let capabilities = tables.moe().expect("CDM1").table().capabilities;
    assert_ne!(capabilities & GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE, 0);
    assert_eq!(f.host.active_package_leases(&package), 1);

    let stream = gpu.stream().unwrap();
    gpu.make_current().unwrap();
    // SAFETY: a stream of this device's primary context, current on this thread; it is
    // synchronised, and the graph objects destroyed, before `tables` is dropped below.
    let on_stream = unsafe { CudaStream::new(StreamRef(stream.address()), gpu.ordinal()) };

    // Padded row strides (in elements), so that packed-row assumptions would show.
    let (rows, cols, sa, sb, so) = (7usize, 33usize, 36usize, 34usize, 40usize);
    let a = values(rows * sa, 21);
    let b = values(rows * sb, 22);
    let sentinel = values(rows * so, 23);
    let a_buffer = gpu.upload(&a).unwrap();
    let b_buffer = gpu.upload(&b).unwrap();
    let out_buffer = gpu.upload(&sentinel).unwrap();
    let strided = |op: u32, with_b: bool| {
        let mut e = Elementwise::f32(
            op,
            rows as u64,
            cols as u64,
            on_device(&gpu, &a_buffer),
            with_b.then(|| on_device(&gpu, &b_buffer)),
            on_device(&gpu, &out_buffer),
        );
        e.a_row_stride_bytes = (sa * 4) as u64;
        e.b_row_stride_bytes = if with_b { (sb * 4) as u64 } else { 0 };
        e.out_row_stride_bytes = (so * 4) as u64;
        e.alpha = 1.7;
        e.beta = -0.3;
        e
    };

    for (op, with_b, broadcast) in [
        (GUILD_CUDA_EW_ADD, true, false),
        (GUILD_CUDA_EW_MUL, true, false),
        (GUILD_CUDA_EW_SCALE, false, false),
        (GUILD_CUDA_EW_COPY, false, false),
        (GUILD_CUDA_EW_AXPY, true, false),
        (GUILD_CUDA_EW_AXPY, true, true),
    ] {
        let case = format!("op {op}, broadcast {broadcast}");
        out_buffer.write(&sentinel).unwrap();
        let mut e = strided(op, with_b);
        if broadcast {
            e.b_row_stride_bytes = 0;
        }
        tables
            .elementwise(&on_stream, &e)
            .unwrap_or_else(|err| panic!("{case}: {err}"));
        stream.synchronize().unwrap();
        let mut want = sentinel.clone();
        let b_rows = with_b.then_some((&b[..], if broadcast { 0 } else { sb }));
        elementwise_reference(
            op,
            e.alpha,
            e.beta,
            (rows, cols),
            (&a, sa),
            b_rows,
            (&mut want, so),
        );
        assert_eq!(
            bits(&out_buffer.read::<f32>(rows * so).unwrap()),
            bits(&want),
            "{case}"
        );
    }

    // What the plugin does not compute it refuses itself, with its words.
    match tables.elementwise(&on_stream, &strided(GUILD_CUDA_EW_SILU, false)) {
        Err(CudaCallError::Provider { reason, .. }) => {
            assert_eq!(reason.status, GUILD_STATUS_ERR_UNSUPPORTED);
            assert!(
                reason
                    .message
                    .contains("ADD, MUL, SCALE, COPY and AXPY only"),
                "{reason}"
            );
        }
        other => panic!("expected the plugin's refusal, got {other:?}"),
    }

    // AXPY in place on a, captured once: every replay adds alpha * b again.
    let mut axpy = strided(GUILD_CUDA_EW_AXPY, true);
    axpy.out = axpy.a;
    axpy.out_row_stride_bytes = axpy.a_row_stride_bytes;
    a_buffer.write(&a).unwrap();
    stream.begin_capture().unwrap();
    let captured = tables.elementwise(&on_stream, &axpy);
    let graph = stream.end_capture().unwrap();
    captured.unwrap();
    assert_eq!(
        bits(&a_buffer.read::<f32>(rows * sa).unwrap()),
        bits(&a),
        "capturing runs nothing"
    );
    let exec = graph.instantiate().unwrap();
    let mut want = a.clone();
    for round in 0..3 {
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        let before = want.clone();
        elementwise_reference(
            GUILD_CUDA_EW_AXPY,
            axpy.alpha,
            axpy.beta,
            (rows, cols),
            (&before, sa),
            Some((&b, sb)),
            (&mut want, sa),
        );
        assert_eq!(
            bits(&a_buffer.read::<f32>(rows * sa).unwrap()),
            bits(&want),
            "replay {round}"
        );
    }
    exec.destroy().unwrap();
    graph.destroy().unwrap();
    stream.synchronize().unwrap();
    drop(tables);
    assert_eq!(f.host.active_package_leases(&package), 0);
    note(
        test,
        &format_args!(
            "elementwise: 6 stream cases ({rows} x {cols}, padded strides, one broadcast) and 3 \
             in-place graph replays bit-exact"
        ),
    );
}

/// F32 to IEEE binary16 bits, rounding to nearest even (what `cvt.rn.f16.f32` computes).
fn f16_bits(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = (x >> 16) & 0x8000;
    let exponent = (x >> 23) & 0xff;
    let mut mantissa = x & 0x7f_ffff;
    if exponent == 0xff {
        return (sign | 0x7c00 | if mantissa != 0 { 0x200 } else { 0 }) as u16;
    }
    let e = exponent as i32 - 127 + 15;
    if e >= 31 {
        return (sign | 0x7c00) as u16;
    }
    let (mut half, rest, mid) = if e <= 0 {
        if e < -10 {
            return sign as u16;
        }
        mantissa |= 0x80_0000;
        let shift = (14 - e) as u32;
        (
            mantissa >> shift,
            mantissa & ((1 << shift) - 1),
            1 << (shift - 1),
        )
    } else {
        (
            ((e as u32) << 10) | (mantissa >> 13),
            mantissa & 0x1fff,
            0x1000,
        )
    };
    if rest > mid || (rest == mid && half & 1 != 0) {
        half += 1;
    }
    (sign | half) as u16
}

/// One side (keys or values) of the test's cache, in bytes: head, position and block strides,
/// and the source row stride; `dim` in elements.
#[derive(Clone, Copy)]
struct Side {
    dim: usize,
    head: usize,
    position: usize,
    block: usize,
    src_stride: usize,
}

/// cuda_dense's kv_append on the host: each token's keys or values (F32 rows of `heads * dim`)
/// converted to F16 into block `seq * max_blocks + pos / block_size`, slot `pos % block_size`;
/// tokens outside the view are skipped.
fn kv_reference(
    heads: usize,
    (block_size, max_blocks, block_count): (usize, usize, usize),
    (seqs, positions): (&[i32], &[i32]),
    side: Side,
    src: &[f32],
    blocks: &mut [u8],
) {
    for (t, (&seq, &pos)) in seqs.iter().zip(positions).enumerate() {
        let (Ok(seq), Ok(pos)) = (usize::try_from(seq), usize::try_from(pos)) else {
            continue;
        };
        if pos / block_size >= max_blocks || seq * max_blocks + pos / block_size >= block_count {
            continue;
        }
        let block = seq * max_blocks + pos / block_size;
        for i in 0..heads * side.dim {
            let value = src[t * side.src_stride / 4 + i];
            let at = block * side.block
                + (pos % block_size) * side.position
                + (i / side.dim) * side.head
                + (i % side.dim) * 2;
            blocks[at..at + 2].copy_from_slice(&f16_bits(value).to_ne_bytes());
        }
    }
}

#[test]
fn kv_append_writes_f16_blocks_on_a_stream_and_a_captured_graph_replays_it() {
    let test = concat!(
        "gpu::device::tables::",
        "kv_append_writes_f16_blocks_on_a_stream_and_a_captured_graph_replays_it"
    );
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let f = fixture(&gpu, &[dense_spec("1.0.0")]);
    let package = id(DENSE_PACKAGE);
    let tables =
        BoundCudaTables::bind_id(f.host.kernels(), &ImplId::new(DENSE_IMPL).unwrap()).unwrap();
    let attn = tables.attn().expect("CDA1").table();
    assert_ne!(attn.capabilities & GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE, 0);
    assert_eq!(f.host.active_package_leases(&package), 1);

    let stream = gpu.stream().unwrap();
    gpu.make_current().unwrap();
    // SAFETY: a stream of this device's primary context, current on this thread; it is
    // synchronised, and the graph objects destroyed, before `tables` is dropped below.
    let on_stream = unsafe { CudaStream::new(StreamRef(stream.address()), gpu.ordinal()) };

    // 3 heads of 8 key and 5 value elements; 7 blocks of 4 positions, 3 per sequence. Every
    // stride is padded, so that packed assumptions would show.
    let (heads, block_size, max_blocks, block_count) = (3usize, 4usize, 3usize, 7usize);
    let k_side = Side {
        dim: 8,
        head: 20,
        position: 64,
        block: 264,
        src_stride: 104,
    };
    let v_side = Side {
        dim: 5,
        head: 12,
        position: 40,
        block: 166,
        src_stride: 64,
    };
    // Sequence -1, a block past the sequence's row (position 12) and one past the pool
    // (sequence 2, position 4: block 7) are skipped.
    let seqs: Vec<i32> = vec![0, 1, 0, 1, -1, 2, 0, 2];
    let positions: Vec<i32> = vec![0, 5, 3, 11, 2, 4, 12, 1];
    let tokens = seqs.len();
    let mut k = values(tokens * k_side.src_stride / 4, 31);
    let v = values(tokens * v_side.src_stride / 4, 32);
    // Values that overflow to infinity, fall into F16's subnormals, or round.
    k[0] = 70_000.0;
    k[1] = -1.0e-6;
    k[2] = 1.000_48;
    k[3] = 2.0f32.powi(-25) * 1.5;
    let k_bytes = block_count * k_side.block;
    let v_bytes = block_count * v_side.block;
    let k_sentinel: Vec<u8> = (0..k_bytes).map(|i| (i * 7 + 3) as u8).collect();
    let v_sentinel: Vec<u8> = (0..v_bytes).map(|i| (i * 5 + 1) as u8).collect();
    let k_src = gpu.upload(&k).unwrap();
    let v_src = gpu.upload(&v).unwrap();
    let seq_buffer = gpu.upload(&seqs).unwrap();
    let pos_buffer = gpu.upload(&positions).unwrap();
    let k_blocks = gpu.upload(&k_sentinel).unwrap();
    let v_blocks = gpu.upload(&v_sentinel).unwrap();
    let args = KvAppend {
        src_dtype: GUILD_DTYPE_F32,
        n_tokens: tokens as u32,
        cache: KvCacheView {
            dtype: GUILD_DTYPE_F16,
            n_head_kv: heads as u32,
            head_dim_k: k_side.dim as u32,
            head_dim_v: v_side.dim as u32,
            block_size: block_size as u32,
            layer_index: 0,
            max_blocks_per_seq: max_blocks as u32,
            block_count: block_count as u64,
            k_blocks: on_device(&gpu, &k_blocks),
            v_blocks: on_device(&gpu, &v_blocks),
            k_block_stride_bytes: k_side.block as u64,
            v_block_stride_bytes: v_side.block as u64,
            k_position_stride_bytes: k_side.position as u64,
            v_position_stride_bytes: v_side.position as u64,
            k_head_stride_bytes: k_side.head as u64,
            v_head_stride_bytes: v_side.head as u64,
            block_table: None,
        },
        k: on_device(&gpu, &k_src),
        v: on_device(&gpu, &v_src),
        k_token_stride_bytes: k_side.src_stride as u64,
        v_token_stride_bytes: v_side.src_stride as u64,
        token_seqs: on_device(&gpu, &seq_buffer),
        token_positions: on_device(&gpu, &pos_buffer),
    };
    let geometry = (block_size, max_blocks, block_count);
    let expect = |k: &[f32], v: &[f32]| {
        let mut want_k = k_sentinel.clone();
        let mut want_v = v_sentinel.clone();
        let tokens = (&seqs[..], &positions[..]);
        kv_reference(heads, geometry, tokens, k_side, k, &mut want_k);
        kv_reference(heads, geometry, tokens, v_side, v, &mut want_v);
        (want_k, want_v)
    };

    tables.kv_append(&on_stream, &args).unwrap();
    stream.synchronize().unwrap();
    let (want_k, want_v) = expect(&k, &v);
    assert_eq!(k_blocks.read::<u8>(k_bytes).unwrap(), want_k, "keys");
    assert_eq!(v_blocks.read::<u8>(v_bytes).unwrap(), want_v, "values");
    // The specials landed at sequence 0, position 0, head 0: infinity, a negative subnormal,
    // 1.000_48 rounded down to 1.0 and 1.5 * 2^-25 rounded up to the smallest subnormal.
    let first: Vec<u16> = want_k[..8]
        .chunks(2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .collect();
    assert_eq!(first, [0x7c00, 0x8011, 0x3c00, 0x0001]);

    // Captured once, then replayed over new keys into the restored cache.
    k_blocks.write(&k_sentinel).unwrap();
    v_blocks.write(&v_sentinel).unwrap();
    stream.begin_capture().unwrap();
    let captured = tables.kv_append(&on_stream, &args);
    let graph = stream.end_capture().unwrap();
    captured.unwrap();
    assert_eq!(
        k_blocks.read::<u8>(k_bytes).unwrap(),
        k_sentinel,
        "capturing runs nothing"
    );
    let exec = graph.instantiate().unwrap();
    for round in 0..2u32 {
        let k = values(tokens * k_side.src_stride / 4, 40 + round);
        k_src.write(&k).unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        let (want_k, want_v) = expect(&k, &v);
        assert_eq!(
            k_blocks.read::<u8>(k_bytes).unwrap(),
            want_k,
            "replay {round}"
        );
        assert_eq!(
            v_blocks.read::<u8>(v_bytes).unwrap(),
            want_v,
            "replay {round}"
        );
    }
    exec.destroy().unwrap();
    graph.destroy().unwrap();
    stream.synchronize().unwrap();
    drop(tables);
    assert_eq!(f.host.active_package_leases(&package), 0);
    note(
        test,
        &format_args!(
            "kv_append: {tokens} tokens (3 of them outside the view) into padded F16 blocks \
             and 2 graph replays byte-exact"
        ),
    );
}
