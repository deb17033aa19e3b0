/*
 * cuda_dense: a CUDA kernel (impl example.cuda_dense.cuda, op kind GUILD_OP_MATMUL) carrying a
 * CDD1 table (cuda_dense_abi.h) whose `project` launches a PTX kernel on the caller's stream:
 *
 *   output[t][i] = (dot(W[row(i)], x[t]) (+ bias[row(i)])) (+ output[t][i] with ACCUMULATE)
 *
 * for F32 weights, F32 input and F32 output, with optional bias and row selection, on device or
 * managed memory. quantize_q8_1 and mmvq are not offered. The table declares
 * GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE (a launch is the only stream work) and not BF16 output.
 *
 * The same kernel carries a CDM1 table (cuda_moe_abi.h) with `elementwise` for F32 operands and
 * the exact operations ADD (a + b), MUL (a * b), SCALE (alpha * a + beta), COPY (a) and AXPY
 * (a + alpha * b), each step rounded on its own (never fused), with b broadcast when its row
 * stride is 0 and out allowed to be a or b (in place); the other operations and dtypes are
 * refused. query_workspace answers 0 bytes for elementwise and refuses the rest. GRAPH_CAPTURABLE.
 *
 * And a CDA1 table (cuda_attn_abi.h) with `kv_append` from F32 keys and values into an F16 cache
 * (kv_cache_dtypes: F16) without a block table, one thread per element, each value converted to
 * F16 with round-to-nearest-even; a token whose sequence, position or block is outside the view
 * is skipped. configure and query_pools (required) refuse everything. GRAPH_CAPTURABLE.
 *
 * Numerics: one thread per (token, output element) forms the dot product left to right over the
 * columns, with a separately rounded multiply and add per element (mul.rn, add.rn: never fused),
 * starting from +0; then adds the bias, then, with ACCUMULATE, adds the sum to the old output.
 * A host reference that does the same steps in F32 matches bit for bit. A selected row index
 * outside 0..rows (device data the host cannot check) is not read: its output is a quiet NaN.
 *
 * Like cuda_scan it builds without a CUDA toolkit: libcuda.so.1 is opened with dlopen on the
 * first project call (never in init, so the package installs and loads without a GPU), the
 * kernel travels as PTX for sm_50 that the driver compiles for the device, it runs in the primary
 * context of args->device_id, and the module is loaded on the first call on a device with the
 * thread's capture mode relaxed, so that the first call may be inside a graph capture. A stream
 * of another context is refused. Shutdown unloads the modules and releases the contexts.
 */
#define _POSIX_C_SOURCE 200809L

#include <guild/abi/cuda_attn_abi.h>
#include <guild/abi/cuda_dense_abi.h>
#include <guild/abi/cuda_moe_abi.h>
#include <guild/abi/kernel_abi.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define DENSE_COMPONENT "example.cuda_dense"
#define DENSE_IMPL "example.cuda_dense.cuda"
#define DENSE_DRIVER "libcuda.so.1"
#define DENSE_MAX_DEVICES 16
/* Threads per block of the launch. */
#define DENSE_BLOCK 128u

/* ------------------------------------------------------------------------------------------ */
/* The driver API subset (as cuda.h declares it)                                                */
/* ------------------------------------------------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

typedef struct dense_api_t {
    CUresult (*init)(unsigned int flags);
    CUresult (*device_get_count)(int* count);
    CUresult (*device_get)(CUdevice* device, int ordinal);
    CUresult (*primary_ctx_retain)(CUcontext* ctx, CUdevice device);
    CUresult (*primary_ctx_release)(CUdevice device);
    CUresult (*ctx_push)(CUcontext ctx);
    CUresult (*ctx_pop)(CUcontext* ctx);
    CUresult (*stream_get_ctx)(CUstream stream, CUcontext* ctx);
    CUresult (*exchange_capture_mode)(int* mode);
    CUresult (*module_load_data)(CUmodule* module, const void* image);
    CUresult (*module_get_function)(CUfunction* function, CUmodule module, const char* name);
    CUresult (*module_unload)(CUmodule module);
    CUresult (*launch_kernel)(CUfunction f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                              unsigned int block_x, unsigned int block_y, unsigned int block_z,
                              unsigned int shared_bytes, CUstream stream, void** params, void** extra);
    CUresult (*get_error_name)(CUresult error, const char** name);
} dense_api_t;

/* ------------------------------------------------------------------------------------------ */
/* The kernel                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * guild_dense_project(weights, input, bias, output, selection, rows, outputs, cols, tokens,
 *                     weight_stride, input_stride, output_stride, flags)
 * Thread idx = ctaid.x * ntid.x + tid.x handles token t = idx / outputs, element
 * i = idx % outputs, for idx < tokens * outputs. row = selection ? selection[i] : i (a signed
 * index; one outside 0..rows writes NaN). bias and selection may be 0. flags bit 0: accumulate.
 */
static const char dense_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry guild_dense_project(\n"
    "    .param .u64 p_weights,\n"
    "    .param .u64 p_input,\n"
    "    .param .u64 p_bias,\n"
    "    .param .u64 p_output,\n"
    "    .param .u64 p_selection,\n"
    "    .param .u64 p_rows,\n"
    "    .param .u64 p_outputs,\n"
    "    .param .u64 p_cols,\n"
    "    .param .u64 p_tokens,\n"
    "    .param .u64 p_weight_stride,\n"
    "    .param .u64 p_input_stride,\n"
    "    .param .u64 p_output_stride,\n"
    "    .param .u32 p_flags\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<8>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .f32 %f<8>;\n"
    "    .reg .b64 %rd<32>;\n"
    "\n"
    "    ld.param.u64 %rd1, [p_weights];\n"
    "    ld.param.u64 %rd2, [p_input];\n"
    "    ld.param.u64 %rd3, [p_bias];\n"
    "    ld.param.u64 %rd4, [p_output];\n"
    "    ld.param.u64 %rd5, [p_selection];\n"
    "    ld.param.u64 %rd6, [p_rows];\n"
    "    ld.param.u64 %rd7, [p_outputs];\n"
    "    ld.param.u64 %rd8, [p_cols];\n"
    "    ld.param.u64 %rd9, [p_tokens];\n"
    "    ld.param.u64 %rd10, [p_weight_stride];\n"
    "    ld.param.u64 %rd11, [p_input_stride];\n"
    "    ld.param.u64 %rd12, [p_output_stride];\n"
    "    ld.param.u32 %r1, [p_flags];\n"
    /* %rd13: this thread's flat index; %rd14: the number of (token, element) pairs. */
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mul.wide.u32 %rd13, %r2, %r3;\n"
    "    cvt.u64.u32 %rd14, %r4;\n"
    "    add.u64 %rd13, %rd13, %rd14;\n"
    "    mul.lo.u64 %rd14, %rd7, %rd9;\n"
    "    setp.ge.u64 %p1, %rd13, %rd14;\n"
    "    @%p1 bra DONE;\n"
    /* %rd15: token t; %rd16: element i; %rd17: the output element's address. */
    "    div.u64 %rd15, %rd13, %rd7;\n"
    "    mul.lo.u64 %rd16, %rd15, %rd7;\n"
    "    sub.u64 %rd16, %rd13, %rd16;\n"
    "    mul.lo.u64 %rd17, %rd15, %rd12;\n"
    "    add.u64 %rd17, %rd4, %rd17;\n"
    "    shl.b64 %rd18, %rd16, 2;\n"
    "    add.u64 %rd17, %rd17, %rd18;\n"
    "    cvta.to.global.u64 %rd17, %rd17;\n"
    /* %rd19: the weight row, i or selection[i] sign-extended (negative fails the check). */
    "    mov.u64 %rd19, %rd16;\n"
    "    setp.eq.u64 %p2, %rd5, 0;\n"
    "    @%p2 bra HAVE_ROW;\n"
    "    shl.b64 %rd20, %rd16, 2;\n"
    "    add.u64 %rd20, %rd5, %rd20;\n"
    "    cvta.to.global.u64 %rd20, %rd20;\n"
    "    ld.global.s32 %r5, [%rd20];\n"
    "    cvt.s64.s32 %rd19, %r5;\n"
    "HAVE_ROW:\n"
    "    setp.ge.u64 %p3, %rd19, %rd6;\n"
    "    @%p3 bra BAD_ROW;\n"
    /* %rd21: the weight row's next element; %rd22: the token's next input element. */
    "    mul.lo.u64 %rd21, %rd19, %rd10;\n"
    "    add.u64 %rd21, %rd1, %rd21;\n"
    "    cvta.to.global.u64 %rd21, %rd21;\n"
    "    mul.lo.u64 %rd22, %rd15, %rd11;\n"
    "    add.u64 %rd22, %rd2, %rd22;\n"
    "    cvta.to.global.u64 %rd22, %rd22;\n"
    "    mov.f32 %f1, 0f00000000;\n"
    "    mov.u64 %rd23, 0;\n"
    "LOOP:\n"
    "    setp.ge.u64 %p4, %rd23, %rd8;\n"
    "    @%p4 bra SUMMED;\n"
    "    ld.global.f32 %f2, [%rd21];\n"
    "    ld.global.f32 %f3, [%rd22];\n"
    "    mul.rn.f32 %f4, %f2, %f3;\n"
    "    add.rn.f32 %f1, %f1, %f4;\n"
    "    add.u64 %rd21, %rd21, 4;\n"
    "    add.u64 %rd22, %rd22, 4;\n"
    "    add.u64 %rd23, %rd23, 1;\n"
    "    bra LOOP;\n"
    "SUMMED:\n"
    "    setp.eq.u64 %p5, %rd3, 0;\n"
    "    @%p5 bra BIASED;\n"
    "    shl.b64 %rd24, %rd19, 2;\n"
    "    add.u64 %rd24, %rd3, %rd24;\n"
    "    cvta.to.global.u64 %rd24, %rd24;\n"
    "    ld.global.f32 %f5, [%rd24];\n"
    "    add.rn.f32 %f1, %f1, %f5;\n"
    "BIASED:\n"
    "    and.b32 %r6, %r1, 1;\n"
    "    setp.eq.u32 %p6, %r6, 0;\n"
    "    @%p6 bra STORE;\n"
    "    ld.global.f32 %f6, [%rd17];\n"
    "    add.rn.f32 %f1, %f6, %f1;\n"
    "STORE:\n"
    "    st.global.f32 [%rd17], %f1;\n"
    "    bra DONE;\n"
    "BAD_ROW:\n"
    "    mov.f32 %f1, 0f7FC00000;\n"
    "    st.global.f32 [%rd17], %f1;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

/*
 * guild_kv_append(k, v, seqs, positions, k_blocks, v_blocks, tokens, heads, dim_k, dim_v,
 *                 block_size, max_blocks, block_count, k_stride, v_stride, k_block_stride,
 *                 v_block_stride, k_position_stride, v_position_stride, k_head_stride,
 *                 v_head_stride), all u64
 * Thread idx handles token t = idx / W, element e = idx % W of the token's keys then values
 * (W = heads * (dim_k + dim_v)), for idx < tokens * W: F32 source to F16 (round to nearest even)
 * at block seq * max_blocks + position / block_size, slot position % block_size. A token whose
 * sequence or position is negative, or whose block falls outside the sequence's row or the pool,
 * is skipped (the host cannot check device data; nothing outside the view is written).
 */
static const char kv_append_ptx[] =
    "\n"
    ".visible .entry guild_kv_append(\n"
    "    .param .u64 p_k,\n"
    "    .param .u64 p_v,\n"
    "    .param .u64 p_seqs,\n"
    "    .param .u64 p_positions,\n"
    "    .param .u64 p_k_blocks,\n"
    "    .param .u64 p_v_blocks,\n"
    "    .param .u64 p_tokens,\n"
    "    .param .u64 p_heads,\n"
    "    .param .u64 p_dim_k,\n"
    "    .param .u64 p_dim_v,\n"
    "    .param .u64 p_block_size,\n"
    "    .param .u64 p_max_blocks,\n"
    "    .param .u64 p_block_count,\n"
    "    .param .u64 p_k_stride,\n"
    "    .param .u64 p_v_stride,\n"
    "    .param .u64 p_k_block_stride,\n"
    "    .param .u64 p_v_block_stride,\n"
    "    .param .u64 p_k_position_stride,\n"
    "    .param .u64 p_v_position_stride,\n"
    "    .param .u64 p_k_head_stride,\n"
    "    .param .u64 p_v_head_stride\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<8>;\n"
    "    .reg .b32 %r<4>;\n"
    "    .reg .f32 %f<2>;\n"
    "    .reg .b16 %h<2>;\n"
    "    .reg .b64 %rd<56>;\n"
    "\n"
    "    ld.param.u64 %rd1, [p_k];\n"
    "    ld.param.u64 %rd2, [p_v];\n"
    "    ld.param.u64 %rd3, [p_seqs];\n"
    "    ld.param.u64 %rd4, [p_positions];\n"
    "    ld.param.u64 %rd5, [p_k_blocks];\n"
    "    ld.param.u64 %rd6, [p_v_blocks];\n"
    "    ld.param.u64 %rd7, [p_tokens];\n"
    "    ld.param.u64 %rd8, [p_heads];\n"
    "    ld.param.u64 %rd9, [p_dim_k];\n"
    "    ld.param.u64 %rd10, [p_dim_v];\n"
    "    ld.param.u64 %rd11, [p_block_size];\n"
    "    ld.param.u64 %rd12, [p_max_blocks];\n"
    "    ld.param.u64 %rd13, [p_block_count];\n"
    "    ld.param.u64 %rd14, [p_k_stride];\n"
    "    ld.param.u64 %rd15, [p_v_stride];\n"
    "    ld.param.u64 %rd16, [p_k_block_stride];\n"
    "    ld.param.u64 %rd17, [p_v_block_stride];\n"
    "    ld.param.u64 %rd18, [p_k_position_stride];\n"
    "    ld.param.u64 %rd19, [p_v_position_stride];\n"
    "    ld.param.u64 %rd20, [p_k_head_stride];\n"
    "    ld.param.u64 %rd21, [p_v_head_stride];\n"
    "    mov.u32 %r1, %ctaid.x;\n"
    "    mov.u32 %r2, %ntid.x;\n"
    "    mov.u32 %r3, %tid.x;\n"
    "    mul.wide.u32 %rd22, %r1, %r2;\n"
    "    cvt.u64.u32 %rd23, %r3;\n"
    "    add.u64 %rd22, %rd22, %rd23;\n"
    "    mul.lo.u64 %rd23, %rd8, %rd9;\n"
    "    mul.lo.u64 %rd24, %rd8, %rd10;\n"
    "    add.u64 %rd25, %rd23, %rd24;\n"
    "    mul.lo.u64 %rd26, %rd25, %rd7;\n"
    "    setp.ge.u64 %p1, %rd22, %rd26;\n"
    "    @%p1 bra KV_DONE;\n"
    "    div.u64 %rd27, %rd22, %rd25;\n"
    "    mul.lo.u64 %rd28, %rd27, %rd25;\n"
    "    sub.u64 %rd28, %rd22, %rd28;\n"
    "    setp.lt.u64 %p2, %rd28, %rd23;\n"
    "    sub.u64 %rd29, %rd28, %rd23;\n"
    "    selp.b64 %rd29, %rd28, %rd29, %p2;\n"
    "    selp.b64 %rd30, %rd9, %rd10, %p2;\n"
    "    selp.b64 %rd31, %rd1, %rd2, %p2;\n"
    "    selp.b64 %rd32, %rd14, %rd15, %p2;\n"
    "    selp.b64 %rd33, %rd5, %rd6, %p2;\n"
    "    selp.b64 %rd34, %rd16, %rd17, %p2;\n"
    "    selp.b64 %rd35, %rd18, %rd19, %p2;\n"
    "    selp.b64 %rd36, %rd20, %rd21, %p2;\n"
    "    shl.b64 %rd37, %rd27, 2;\n"
    "    add.u64 %rd38, %rd3, %rd37;\n"
    "    cvta.to.global.u64 %rd38, %rd38;\n"
    "    ld.global.s32 %r1, [%rd38];\n"
    "    add.u64 %rd39, %rd4, %rd37;\n"
    "    cvta.to.global.u64 %rd39, %rd39;\n"
    "    ld.global.s32 %r2, [%rd39];\n"
    "    setp.lt.s32 %p3, %r1, 0;\n"
    "    @%p3 bra KV_DONE;\n"
    "    setp.lt.s32 %p4, %r2, 0;\n"
    "    @%p4 bra KV_DONE;\n"
    "    cvt.u64.u32 %rd40, %r1;\n"
    "    cvt.u64.u32 %rd41, %r2;\n"
    "    div.u64 %rd42, %rd41, %rd11;\n"
    "    mul.lo.u64 %rd43, %rd42, %rd11;\n"
    "    sub.u64 %rd43, %rd41, %rd43;\n"
    "    setp.ge.u64 %p5, %rd42, %rd12;\n"
    "    @%p5 bra KV_DONE;\n"
    "    mul.lo.u64 %rd44, %rd40, %rd12;\n"
    "    add.u64 %rd44, %rd44, %rd42;\n"
    "    setp.ge.u64 %p6, %rd44, %rd13;\n"
    "    @%p6 bra KV_DONE;\n"
    "    div.u64 %rd45, %rd29, %rd30;\n"
    "    mul.lo.u64 %rd46, %rd45, %rd30;\n"
    "    sub.u64 %rd46, %rd29, %rd46;\n"
    "    mul.lo.u64 %rd47, %rd27, %rd32;\n"
    "    add.u64 %rd47, %rd31, %rd47;\n"
    "    shl.b64 %rd48, %rd29, 2;\n"
    "    add.u64 %rd47, %rd47, %rd48;\n"
    "    cvta.to.global.u64 %rd47, %rd47;\n"
    "    ld.global.f32 %f1, [%rd47];\n"
    "    mul.lo.u64 %rd49, %rd44, %rd34;\n"
    "    add.u64 %rd49, %rd33, %rd49;\n"
    "    mul.lo.u64 %rd50, %rd43, %rd35;\n"
    "    add.u64 %rd49, %rd49, %rd50;\n"
    "    mul.lo.u64 %rd51, %rd45, %rd36;\n"
    "    add.u64 %rd49, %rd49, %rd51;\n"
    "    shl.b64 %rd52, %rd46, 1;\n"
    "    add.u64 %rd49, %rd49, %rd52;\n"
    "    cvta.to.global.u64 %rd49, %rd49;\n"
    "    cvt.rn.f16.f32 %h1, %f1;\n"
    "    st.global.b16 [%rd49], %h1;\n"
    "KV_DONE:\n"
    "    ret;\n"
    "}\n";

/* The second entry of the module: appended to dense_ptx when the module is loaded (ISO C caps the
 * length of one string literal). */
static const char elementwise_ptx[] =
    "\n"
    /*
     * guild_elementwise(a, b, out, rows, cols, a_stride, b_stride, out_stride, op, alpha, beta)
     * Thread idx handles row r = idx / cols, column c = idx % cols, for idx < rows * cols. b may
     * be 0 (unary); a b_stride of 0 broadcasts b's first row. op: GUILD_CUDA_EW_* (1 ADD, 2 MUL,
     * 3 SCALE, 10 AXPY; anything else copies a).
     */
    ".visible .entry guild_elementwise(\n"
    "    .param .u64 p_a,\n"
    "    .param .u64 p_b,\n"
    "    .param .u64 p_out,\n"
    "    .param .u64 p_rows,\n"
    "    .param .u64 p_cols,\n"
    "    .param .u64 p_a_stride,\n"
    "    .param .u64 p_b_stride,\n"
    "    .param .u64 p_out_stride,\n"
    "    .param .u32 p_op,\n"
    "    .param .f32 p_alpha,\n"
    "    .param .f32 p_beta\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<8>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .f32 %f<8>;\n"
    "    .reg .b64 %rd<24>;\n"
    "\n"
    "    ld.param.u64 %rd1, [p_a];\n"
    "    ld.param.u64 %rd2, [p_b];\n"
    "    ld.param.u64 %rd3, [p_out];\n"
    "    ld.param.u64 %rd4, [p_rows];\n"
    "    ld.param.u64 %rd5, [p_cols];\n"
    "    ld.param.u64 %rd6, [p_a_stride];\n"
    "    ld.param.u64 %rd7, [p_b_stride];\n"
    "    ld.param.u64 %rd8, [p_out_stride];\n"
    "    ld.param.u32 %r1, [p_op];\n"
    "    ld.param.f32 %f1, [p_alpha];\n"
    "    ld.param.f32 %f2, [p_beta];\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mul.wide.u32 %rd9, %r2, %r3;\n"
    "    cvt.u64.u32 %rd10, %r4;\n"
    "    add.u64 %rd9, %rd9, %rd10;\n"
    "    mul.lo.u64 %rd10, %rd4, %rd5;\n"
    "    setp.ge.u64 %p1, %rd9, %rd10;\n"
    "    @%p1 bra EW_DONE;\n"
    /* %rd11: row r; %rd12: column c; %rd13: c * 4. */
    "    div.u64 %rd11, %rd9, %rd5;\n"
    "    mul.lo.u64 %rd12, %rd11, %rd5;\n"
    "    sub.u64 %rd12, %rd9, %rd12;\n"
    "    shl.b64 %rd13, %rd12, 2;\n"
    "    mul.lo.u64 %rd14, %rd11, %rd6;\n"
    "    add.u64 %rd14, %rd1, %rd14;\n"
    "    add.u64 %rd14, %rd14, %rd13;\n"
    "    cvta.to.global.u64 %rd14, %rd14;\n"
    "    ld.global.f32 %f3, [%rd14];\n"
    "    mul.lo.u64 %rd16, %rd11, %rd8;\n"
    "    add.u64 %rd16, %rd3, %rd16;\n"
    "    add.u64 %rd16, %rd16, %rd13;\n"
    "    cvta.to.global.u64 %rd16, %rd16;\n"
    "    mov.f32 %f4, 0f00000000;\n"
    "    setp.eq.u64 %p2, %rd2, 0;\n"
    "    @%p2 bra EW_HAVE_B;\n"
    "    mul.lo.u64 %rd15, %rd11, %rd7;\n"
    "    add.u64 %rd15, %rd2, %rd15;\n"
    "    add.u64 %rd15, %rd15, %rd13;\n"
    "    cvta.to.global.u64 %rd15, %rd15;\n"
    "    ld.global.f32 %f4, [%rd15];\n"
    "EW_HAVE_B:\n"
    "    setp.eq.u32 %p3, %r1, 1;\n"
    "    @%p3 bra EW_ADD;\n"
    "    setp.eq.u32 %p3, %r1, 2;\n"
    "    @%p3 bra EW_MUL;\n"
    "    setp.eq.u32 %p3, %r1, 3;\n"
    "    @%p3 bra EW_SCALE;\n"
    "    setp.eq.u32 %p3, %r1, 10;\n"
    "    @%p3 bra EW_AXPY;\n"
    "    mov.f32 %f5, %f3;\n"
    "    bra EW_STORE;\n"
    "EW_ADD:\n"
    "    add.rn.f32 %f5, %f3, %f4;\n"
    "    bra EW_STORE;\n"
    "EW_MUL:\n"
    "    mul.rn.f32 %f5, %f3, %f4;\n"
    "    bra EW_STORE;\n"
    "EW_SCALE:\n"
    "    mul.rn.f32 %f6, %f1, %f3;\n"
    "    add.rn.f32 %f5, %f6, %f2;\n"
    "    bra EW_STORE;\n"
    "EW_AXPY:\n"
    "    mul.rn.f32 %f6, %f1, %f4;\n"
    "    add.rn.f32 %f5, %f3, %f6;\n"
    "EW_STORE:\n"
    "    st.global.f32 [%rd16], %f5;\n"
    "EW_DONE:\n"
    "    ret;\n"
    "}\n";

/* ------------------------------------------------------------------------------------------ */
/* Driver and device state                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct dense_device_t {
    int ready;
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    CUfunction kernel;
    CUfunction elementwise;
    CUfunction kv_append;
} dense_device_t;

static struct {
    pthread_mutex_t lock;
    int driver_tried;
    int driver_ok;
    char driver_error[256];
    dense_api_t api;
    int device_count;
    dense_device_t devices[DENSE_MAX_DEVICES];
} dense_state = {PTHREAD_MUTEX_INITIALIZER, 0, 0, {0}, {0}, 0, {{0}}};

static int dense_symbol(void* lib, const char* name, void* out_fn, size_t fn_size) {
    void* sym = dlsym(lib, name);
    if (sym == NULL) {
        (void)snprintf(dense_state.driver_error, sizeof dense_state.driver_error, "%s has no %s", DENSE_DRIVER,
                       name);
        return 0;
    }
    /* POSIX guarantees that dlsym's result has the function's representation. */
    memcpy(out_fn, &sym, fn_size);
    return 1;
}

#define DENSE_LOAD(lib, field, name) dense_symbol((lib), (name), &dense_state.api.field, sizeof dense_state.api.field)

static const char* dense_result_name(CUresult r) {
    const char* name = NULL;
    if (dense_state.api.get_error_name == NULL || dense_state.api.get_error_name(r, &name) != CUDA_SUCCESS ||
        name == NULL) {
        return "an unknown CUDA error";
    }
    return name;
}

/* Opens the driver once; the caller holds the lock. Returns 1 when it is usable. */
static int dense_open_driver_locked(void) {
    void* lib;
    CUresult r;
    if (dense_state.driver_tried) {
        return dense_state.driver_ok;
    }
    dense_state.driver_tried = 1;
    lib = dlopen(DENSE_DRIVER, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char* why = dlerror();
        (void)snprintf(dense_state.driver_error, sizeof dense_state.driver_error, "%s",
                       why != NULL ? why : DENSE_DRIVER ": cannot be opened");
        return 0;
    }
    if (!DENSE_LOAD(lib, init, "cuInit") || !DENSE_LOAD(lib, device_get_count, "cuDeviceGetCount") ||
        !DENSE_LOAD(lib, device_get, "cuDeviceGet") ||
        !DENSE_LOAD(lib, primary_ctx_retain, "cuDevicePrimaryCtxRetain") ||
        !DENSE_LOAD(lib, primary_ctx_release, "cuDevicePrimaryCtxRelease_v2") ||
        !DENSE_LOAD(lib, ctx_push, "cuCtxPushCurrent_v2") || !DENSE_LOAD(lib, ctx_pop, "cuCtxPopCurrent_v2") ||
        !DENSE_LOAD(lib, stream_get_ctx, "cuStreamGetCtx") ||
        !DENSE_LOAD(lib, exchange_capture_mode, "cuThreadExchangeStreamCaptureMode") ||
        !DENSE_LOAD(lib, module_load_data, "cuModuleLoadData") ||
        !DENSE_LOAD(lib, module_get_function, "cuModuleGetFunction") ||
        !DENSE_LOAD(lib, module_unload, "cuModuleUnload") || !DENSE_LOAD(lib, launch_kernel, "cuLaunchKernel") ||
        !DENSE_LOAD(lib, get_error_name, "cuGetErrorName")) {
        memset(&dense_state.api, 0, sizeof dense_state.api);
        return 0;
    }
    r = dense_state.api.init(0u);
    if (r == CUDA_SUCCESS) {
        r = dense_state.api.device_get_count(&dense_state.device_count);
    }
    if (r != CUDA_SUCCESS) {
        (void)snprintf(dense_state.driver_error, sizeof dense_state.driver_error,
                       "initialising the driver failed with %s (%d)", dense_result_name(r), r);
        return 0;
    }
    dense_state.driver_ok = 1;
    return 1;
}

/*
 * The device's context and kernel, set up on first use (primary context retained, PTX loaded
 * with the thread's capture mode relaxed). On failure writes the reason to `message`.
 */
static guild_status_t dense_device(int32_t device_id, dense_device_t* out, char* message, size_t message_size) {
    /* The module's PTX: every entry, one NUL at the end. */
    static char image[sizeof dense_ptx + sizeof elementwise_ptx + sizeof kv_append_ptx - 2u];
    dense_device_t* slot;
    guild_status_t status = GUILD_STATUS_OK;
    (void)pthread_mutex_lock(&dense_state.lock);
    if (!dense_open_driver_locked()) {
        (void)snprintf(message, message_size, "no usable CUDA driver: %s", dense_state.driver_error);
        status = GUILD_STATUS_ERR_UNSUPPORTED;
    } else if (device_id < 0 || device_id >= dense_state.device_count || device_id >= DENSE_MAX_DEVICES) {
        (void)snprintf(message, message_size, "CUDA device %d does not exist here (the driver reports %d)",
                       (int)device_id, dense_state.device_count);
        status = GUILD_STATUS_ERR_INVALID_ARGUMENT;
    } else {
        slot = &dense_state.devices[device_id];
        if (!slot->ready) {
            const dense_api_t* api = &dense_state.api;
            CUresult r = api->device_get(&slot->device, (int)device_id);
            message[0] = '\0';
            if (r != CUDA_SUCCESS) {
                (void)snprintf(message, message_size, "cuDeviceGet(%d) failed with %s", (int)device_id,
                               dense_result_name(r));
            } else if ((r = api->primary_ctx_retain(&slot->ctx, slot->device)) != CUDA_SUCCESS) {
                (void)snprintf(message, message_size, "cuDevicePrimaryCtxRetain failed with %s",
                               dense_result_name(r));
            } else {
                int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
                CUcontext popped = NULL;
                r = api->ctx_push(slot->ctx);
                if (r == CUDA_SUCCESS) {
                    (void)api->exchange_capture_mode(&mode);
                    memcpy(image, dense_ptx, sizeof dense_ptx - 1u);
                    memcpy(image + sizeof dense_ptx - 1u, elementwise_ptx, sizeof elementwise_ptx - 1u);
                    memcpy(image + sizeof dense_ptx + sizeof elementwise_ptx - 2u, kv_append_ptx,
                           sizeof kv_append_ptx);
                    r = api->module_load_data(&slot->module, image);
                    if (r == CUDA_SUCCESS) {
                        r = api->module_get_function(&slot->kernel, slot->module, "guild_dense_project");
                        if (r == CUDA_SUCCESS) {
                            r = api->module_get_function(&slot->elementwise, slot->module, "guild_elementwise");
                        }
                        if (r == CUDA_SUCCESS) {
                            r = api->module_get_function(&slot->kv_append, slot->module, "guild_kv_append");
                        }
                        if (r != CUDA_SUCCESS) {
                            (void)api->module_unload(slot->module);
                            (void)snprintf(message, message_size,
                                           "cuModuleGetFunction(the module's three entries) failed with %s",
                                           dense_result_name(r));
                        }
                    } else {
                        (void)snprintf(message, message_size, "loading the dense PTX failed with %s",
                                       dense_result_name(r));
                    }
                    (void)api->exchange_capture_mode(&mode);
                    (void)api->ctx_pop(&popped);
                } else {
                    (void)snprintf(message, message_size, "cuCtxPushCurrent failed with %s", dense_result_name(r));
                }
                if (r != CUDA_SUCCESS) {
                    (void)api->primary_ctx_release(slot->device);
                }
            }
            if (message[0] == '\0') {
                slot->ready = 1;
            } else {
                memset(slot, 0, sizeof *slot);
                status = GUILD_STATUS_ERR_DEVICE;
            }
        }
        if (slot->ready) {
            *out = *slot;
        }
    }
    (void)pthread_mutex_unlock(&dense_state.lock);
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* CDD1 project                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static int dense_user_data;

static guild_status_t dense_refuse(guild_error_info_t* error, guild_status_t status, const char* message) {
    return guild_error_info_set(error, status, DENSE_COMPONENT, message);
}

static int dense_aligned(const void* p) {
    return ((uintptr_t)p & 3u) == 0u;
}

/*
 * Checks that `raw_stream` (NULL: the legacy default stream) belongs to the primary context of
 * the device in `dev`, then launches `kernel` over `pairs` threads on it with `params`.
 */
static guild_status_t dense_launch(const dense_device_t* dev, int32_t device_id, guild_stream_t raw_stream,
                                   CUfunction kernel, uint64_t pairs, void** params, guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    CUstream stream = (CUstream)(void*)raw_stream;
    CUcontext popped = NULL;
    CUresult r;
    uint64_t blocks = pairs / DENSE_BLOCK + (pairs % DENSE_BLOCK != 0u ? 1u : 0u);
    if (blocks > 0x7fffffffu) {
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, "more elements than one launch covers");
    }
    if (stream != NULL) {
        CUcontext stream_ctx = NULL;
        r = dense_state.api.stream_get_ctx(stream, &stream_ctx);
        if (r != CUDA_SUCCESS) {
            (void)snprintf(message, sizeof message, "cuStreamGetCtx failed with %s", dense_result_name(r));
            return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, message);
        }
        if (stream_ctx != dev->ctx) {
            (void)snprintf(message, sizeof message,
                           "the stream belongs to another context than the primary context of device %d",
                           (int)device_id);
            return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, message);
        }
    }
    r = dense_state.api.ctx_push(dev->ctx);
    if (r != CUDA_SUCCESS) {
        (void)snprintf(message, sizeof message, "cuCtxPushCurrent failed with %s", dense_result_name(r));
        return dense_refuse(error, GUILD_STATUS_ERR_DEVICE, message);
    }
    /* The driver copies the parameter values at the launch (and into the graph when capturing). */
    r = dense_state.api.launch_kernel(kernel, (unsigned int)blocks, 1u, 1u, DENSE_BLOCK, 1u, 1u, 0u, stream, params,
                                      NULL);
    (void)dense_state.api.ctx_pop(&popped);
    if (r != CUDA_SUCCESS) {
        (void)snprintf(message, sizeof message, "cuLaunchKernel failed with %s", dense_result_name(r));
        return dense_refuse(error, GUILD_STATUS_ERR_DEVICE, message);
    }
    return GUILD_STATUS_OK;
}

static guild_status_t dense_project(void* user_data, const guild_cuda_dense_project_args_v1_t* args,
                                    guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    dense_device_t dev;
    guild_status_t status;
    uint64_t outputs;
    CUdeviceptr weights, input, bias, output, selection;
    uint64_t rows, cols, tokens, w_stride, in_stride, out_stride;
    uint32_t flags;
    void* params[13];

    if (user_data != (void*)&dense_user_data) {
        return dense_refuse(error, GUILD_STATUS_ERR_INTERNAL, "project got the wrong user_data");
    }
    if (args == NULL || args->struct_size < (uint32_t)sizeof *args) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                            "project needs arguments of at least the SDK 1.5 size");
    }
    if (args->weight_dtype != GUILD_DTYPE_F32 || args->input_dtype != GUILD_DTYPE_F32 ||
        args->output_dtype != GUILD_DTYPE_F32) {
        (void)snprintf(message, sizeof message,
                       "this project takes F32 weights, input and output only (got dtypes %u, %u, %u)",
                       (unsigned)args->weight_dtype, (unsigned)args->input_dtype, (unsigned)args->output_dtype);
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, message);
    }
    if ((args->flags & ~GUILD_CUDA_DENSE_ACCUMULATE) != 0u || args->reserved0 != 0u || args->reserved1 != 0u ||
        args->selection.reserved != 0u) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "unknown flags or non-zero reserved fields");
    }
    rows = args->geometry.rows;
    cols = args->geometry.cols;
    tokens = args->geometry.tokens;
    outputs = args->selection.rows != NULL ? (uint64_t)args->selection.count : rows;
    if (rows == 0u || cols == 0u || tokens == 0u || outputs == 0u) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "rows, cols, tokens and the selection must be non-zero");
    }
    if (args->weights == NULL || args->input == NULL || args->output == NULL || !dense_aligned(args->weights) ||
        !dense_aligned(args->input) || !dense_aligned(args->output) || !dense_aligned(args->bias) ||
        !dense_aligned(args->selection.rows) || (args->strides.weight_row_stride_bytes & 3u) != 0u ||
        (args->strides.input_row_stride_bytes & 3u) != 0u || (args->strides.output_row_stride_bytes & 3u) != 0u) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                            "weights, input and output must be non-NULL, and every buffer and stride 4-byte aligned");
    }
    if (cols > UINT64_MAX / 4u || args->strides.weight_row_stride_bytes < cols * 4u ||
        args->strides.input_row_stride_bytes < cols * 4u || outputs > UINT64_MAX / 4u ||
        args->strides.output_row_stride_bytes < outputs * 4u) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "a stride is shorter than its row");
    }
    if (tokens > UINT64_MAX / outputs) {
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, "tokens times outputs overflows");
    }
    status = dense_device(args->device_id, &dev, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return dense_refuse(error, status, message);
    }

    weights = (CUdeviceptr)(uintptr_t)args->weights;
    input = (CUdeviceptr)(uintptr_t)args->input;
    bias = (CUdeviceptr)(uintptr_t)args->bias;
    output = (CUdeviceptr)(uintptr_t)args->output;
    selection = (CUdeviceptr)(uintptr_t)args->selection.rows;
    w_stride = args->strides.weight_row_stride_bytes;
    in_stride = args->strides.input_row_stride_bytes;
    out_stride = args->strides.output_row_stride_bytes;
    flags = args->flags;
    params[0] = &weights;
    params[1] = &input;
    params[2] = &bias;
    params[3] = &output;
    params[4] = &selection;
    params[5] = &rows;
    params[6] = &outputs;
    params[7] = &cols;
    params[8] = &tokens;
    params[9] = &w_stride;
    params[10] = &in_stride;
    params[11] = &out_stride;
    params[12] = &flags;
    return dense_launch(&dev, args->device_id, args->stream, dev.kernel, tokens * outputs, params, error);
}

/* ------------------------------------------------------------------------------------------ */
/* CDM1 elementwise and query_workspace                                                         */
/* ------------------------------------------------------------------------------------------ */

static int dense_binary(uint32_t op) {
    return op == GUILD_CUDA_EW_ADD || op == GUILD_CUDA_EW_MUL || op == GUILD_CUDA_EW_AXPY;
}

static guild_status_t dense_elementwise(void* user_data, const guild_cuda_elementwise_args_v1_t* args,
                                        guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    dense_device_t dev;
    guild_status_t status;
    CUdeviceptr a, b, out;
    uint64_t rows, cols, a_stride, b_stride, out_stride;
    uint32_t op;
    float alpha, beta;
    void* params[11];

    if (user_data != (void*)&dense_user_data) {
        return dense_refuse(error, GUILD_STATUS_ERR_INTERNAL, "elementwise got the wrong user_data");
    }
    if (args == NULL || args->struct_size < (uint32_t)sizeof *args) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                            "elementwise needs arguments of at least the SDK 1.5 size");
    }
    op = args->op;
    if (op != GUILD_CUDA_EW_ADD && op != GUILD_CUDA_EW_MUL && op != GUILD_CUDA_EW_SCALE && op != GUILD_CUDA_EW_COPY &&
        op != GUILD_CUDA_EW_AXPY) {
        (void)snprintf(message, sizeof message,
                       "this elementwise computes ADD, MUL, SCALE, COPY and AXPY only (got op %u)", (unsigned)op);
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, message);
    }
    if (args->a_dtype != GUILD_DTYPE_F32 || args->out_dtype != GUILD_DTYPE_F32 ||
        (dense_binary(op) && args->b_dtype != GUILD_DTYPE_F32)) {
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, "this elementwise takes F32 operands only");
    }
    if (args->reserved0 != 0u || args->reserved1 != 0u) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "non-zero reserved fields");
    }
    rows = args->rows;
    cols = args->cols;
    if (rows == 0u || cols == 0u || cols > UINT64_MAX / 4u || rows > UINT64_MAX / cols) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "rows and cols must be non-zero and their product fit");
    }
    if (args->a == NULL || args->out == NULL || dense_binary(op) != (args->b != NULL) || !dense_aligned(args->a) ||
        !dense_aligned(args->b) || !dense_aligned(args->out) || (args->a_row_stride_bytes & 3u) != 0u ||
        (args->b_row_stride_bytes & 3u) != 0u || (args->out_row_stride_bytes & 3u) != 0u) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                            "a and out must be non-NULL, b present exactly for binary operations, and every buffer "
                            "and stride 4-byte aligned");
    }
    status = dense_device(args->device_id, &dev, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return dense_refuse(error, status, message);
    }
    a = (CUdeviceptr)(uintptr_t)args->a;
    b = (CUdeviceptr)(uintptr_t)args->b;
    out = (CUdeviceptr)(uintptr_t)args->out;
    a_stride = args->a_row_stride_bytes;
    b_stride = args->b_row_stride_bytes;
    out_stride = args->out_row_stride_bytes;
    alpha = args->alpha;
    beta = args->beta;
    params[0] = &a;
    params[1] = &b;
    params[2] = &out;
    params[3] = &rows;
    params[4] = &cols;
    params[5] = &a_stride;
    params[6] = &b_stride;
    params[7] = &out_stride;
    params[8] = &op;
    params[9] = &alpha;
    params[10] = &beta;
    return dense_launch(&dev, args->device_id, args->stream, dev.elementwise, rows * cols, params, error);
}

static guild_status_t dense_query_workspace(void* user_data, const guild_cuda_moe_workspace_query_args_v1_t* args,
                                            guild_error_info_t* error) {
    if (user_data != (void*)&dense_user_data) {
        return dense_refuse(error, GUILD_STATUS_ERR_INTERNAL, "query_workspace got the wrong user_data");
    }
    if (args == NULL || args->workspace_bytes_out == NULL) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "query_workspace needs args and an output");
    }
    if (args->operation != GUILD_CUDA_MOE_OP_ELEMENTWISE) {
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, "only elementwise is offered, and needs no workspace");
    }
    *args->workspace_bytes_out = 0u;
    return GUILD_STATUS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* CDA1 kv_append (and the required configure and query_pools)                                  */
/* ------------------------------------------------------------------------------------------ */

static int dense_even(uint64_t v) {
    return (v & 1u) == 0u;
}

static guild_status_t dense_kv_append(void* user_data, const guild_cuda_kv_append_args_v1_t* args,
                                      guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    const guild_cuda_kv_cache_view_v1_t* c;
    dense_device_t dev;
    guild_status_t status;
    uint64_t p[21];
    void* params[21];
    uint64_t width;
    int i;

    if (user_data != (void*)&dense_user_data) {
        return dense_refuse(error, GUILD_STATUS_ERR_INTERNAL, "kv_append got the wrong user_data");
    }
    if (args == NULL || args->struct_size < (uint32_t)sizeof *args || args->cache == NULL ||
        args->cache->struct_size < (uint32_t)sizeof *args->cache) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                            "kv_append needs arguments and a cache view of at least the SDK 1.5 size");
    }
    c = args->cache;
    if (args->src_dtype != GUILD_DTYPE_F32 || c->dtype != GUILD_DTYPE_F16) {
        (void)snprintf(message, sizeof message,
                       "this kv_append writes F32 keys and values to an F16 cache only (got %u to %u)",
                       (unsigned)args->src_dtype, (unsigned)c->dtype);
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, message);
    }
    if (c->block_table != NULL) {
        return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED,
                            "this kv_append takes no block table (blocks are seq * max_blocks_per_seq + p / block_size)");
    }
    if (args->reserved0 != 0u || args->reserved1 != 0u || args->n_tokens == 0u || c->n_head_kv == 0u ||
        c->head_dim_k == 0u || c->head_dim_v == 0u || c->block_size == 0u || c->max_blocks_per_seq == 0u ||
        c->block_count == 0u) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                            "non-zero reserved fields, or a zero token count or cache dimension");
    }
    if (args->k == NULL || args->v == NULL || args->token_seqs == NULL || args->token_positions == NULL ||
        c->k_blocks == NULL || c->v_blocks == NULL || !dense_aligned(args->k) || !dense_aligned(args->v) ||
        !dense_aligned(args->token_seqs) || !dense_aligned(args->token_positions) ||
        !dense_even((uint64_t)(uintptr_t)c->k_blocks) || !dense_even((uint64_t)(uintptr_t)c->v_blocks) ||
        (args->k_token_stride_bytes & 3u) != 0u || (args->v_token_stride_bytes & 3u) != 0u ||
        !dense_even(c->k_block_stride_bytes) || !dense_even(c->v_block_stride_bytes) ||
        !dense_even(c->k_position_stride_bytes) || !dense_even(c->v_position_stride_bytes) ||
        !dense_even(c->k_head_stride_bytes) || !dense_even(c->v_head_stride_bytes)) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                            "every buffer must be non-NULL and aligned to its element, and every stride too");
    }
    width = (uint64_t)c->n_head_kv * ((uint64_t)c->head_dim_k + (uint64_t)c->head_dim_v);
    status = dense_device(args->device_id, &dev, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return dense_refuse(error, status, message);
    }
    p[0] = (uint64_t)(uintptr_t)args->k;
    p[1] = (uint64_t)(uintptr_t)args->v;
    p[2] = (uint64_t)(uintptr_t)args->token_seqs;
    p[3] = (uint64_t)(uintptr_t)args->token_positions;
    p[4] = (uint64_t)(uintptr_t)c->k_blocks;
    p[5] = (uint64_t)(uintptr_t)c->v_blocks;
    p[6] = args->n_tokens;
    p[7] = c->n_head_kv;
    p[8] = c->head_dim_k;
    p[9] = c->head_dim_v;
    p[10] = c->block_size;
    p[11] = c->max_blocks_per_seq;
    p[12] = c->block_count;
    p[13] = args->k_token_stride_bytes;
    p[14] = args->v_token_stride_bytes;
    p[15] = c->k_block_stride_bytes;
    p[16] = c->v_block_stride_bytes;
    p[17] = c->k_position_stride_bytes;
    p[18] = c->v_position_stride_bytes;
    p[19] = c->k_head_stride_bytes;
    p[20] = c->v_head_stride_bytes;
    for (i = 0; i < 21; ++i) {
        params[i] = &p[i];
    }
    return dense_launch(&dev, args->device_id, args->stream, dev.kv_append, (uint64_t)args->n_tokens * width, params,
                        error);
}

static guild_status_t dense_configure(void* user_data, const guild_cuda_attn_config_args_v1_t* args,
                                      guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    if (user_data != (void*)&dense_user_data) {
        return dense_refuse(error, GUILD_STATUS_ERR_INTERNAL, "configure got the wrong user_data");
    }
    (void)snprintf(message, sizeof message, "this table takes no configuration (key %s)",
                   args != NULL && args->key != NULL ? args->key : "(none)");
    return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED, message);
}

static guild_status_t dense_query_pools(void* user_data, const guild_cuda_attn_pool_query_args_v1_t* args,
                                        guild_error_info_t* error) {
    (void)args;
    if (user_data != (void*)&dense_user_data) {
        return dense_refuse(error, GUILD_STATUS_ERR_INTERNAL, "query_pools got the wrong user_data");
    }
    return dense_refuse(error, GUILD_STATUS_ERR_UNSUPPORTED,
                        "only kv_append is offered, and it needs no pools");
}

/* ------------------------------------------------------------------------------------------ */
/* Registration                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static guild_status_t dense_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_cuda_dense_ext_v1_t dense;
    guild_cuda_moe_ext_v1_t moe;
    guild_cuda_attn_ext_v1_t attn;
    guild_kernel_op_desc_v1_t desc;
    if (host == NULL || plugin_state == NULL) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "init needs a host table and a state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL) {
        return dense_refuse(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "host table is smaller than the v1 base");
    }
    /* Nothing here touches the driver: the package must load where there is none. */
    memset(&dense, 0, sizeof dense);
    dense.header.struct_size = (uint32_t)sizeof dense;
    dense.header.tag = GUILD_CUDA_DENSE_TAG;
    dense.header.version = GUILD_CUDA_DENSE_EXT_VERSION;
    dense.capabilities = GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE;
    dense.project = dense_project;
    dense.user_data = &dense_user_data;
    dense.header.next = &moe.header;

    memset(&moe, 0, sizeof moe);
    moe.header.struct_size = (uint32_t)sizeof moe;
    moe.header.tag = GUILD_CUDA_MOE_TAG;
    moe.header.version = GUILD_CUDA_MOE_EXT_VERSION;
    moe.capabilities = GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE;
    moe.query_workspace = dense_query_workspace;
    moe.elementwise = dense_elementwise;
    moe.user_data = &dense_user_data;
    moe.header.next = &attn.header;

    memset(&attn, 0, sizeof attn);
    attn.header.struct_size = (uint32_t)sizeof attn;
    attn.header.tag = GUILD_CUDA_ATTN_TAG;
    attn.header.version = GUILD_CUDA_ATTN_EXT_VERSION;
    attn.capabilities = GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE;
    attn.kv_cache_dtypes = GUILD_CUDA_DTYPE_BIT(GUILD_DTYPE_F16);
    attn.configure = dense_configure;
    attn.query_pools = dense_query_pools;
    attn.kv_append = dense_kv_append;
    attn.user_data = &dense_user_data;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_MATMUL;
    desc.backend = GUILD_BACKEND_CUDA;
    desc.impl_id = DENSE_IMPL;
    desc.priority = 10;
    desc.min_sm = 50u;
    desc.user_data = &dense_user_data;
    desc.next_ext = &dense.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static void dense_shutdown(void* plugin_state) {
    int i;
    (void)plugin_state;
    (void)pthread_mutex_lock(&dense_state.lock);
    for (i = 0; i < DENSE_MAX_DEVICES; ++i) {
        dense_device_t* slot = &dense_state.devices[i];
        if (slot->ready) {
            CUcontext popped = NULL;
            /* The host closes the library only once no binding of its tables is left, and a
             * binding's holder waits for its stream work before dropping it. */
            if (dense_state.api.ctx_push(slot->ctx) == CUDA_SUCCESS) {
                (void)dense_state.api.module_unload(slot->module);
                (void)dense_state.api.ctx_pop(&popped);
            }
            (void)dense_state.api.primary_ctx_release(slot->device);
        }
        memset(slot, 0, sizeof *slot);
    }
    (void)pthread_mutex_unlock(&dense_state.lock);
}

static const guild_plugin_descriptor_v1_t dense_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "cuda_dense",
    "1.0.0",
    dense_init,
    dense_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &dense_descriptor;
}
