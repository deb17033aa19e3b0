/*
 * CDM1 (Guild Kernel ABI v1 / SDK 1.5, introduced with SDK 1.4): CUDA mixture-of-experts and
 * decode-loop building blocks.
 *
 * A CUDA kernel descriptor may attach a guild_cuda_moe_ext_v1_t to its next_ext chain. The table
 * groups the stream-ordered operations an MoE decoder needs around its projections:
 *   routing         router logits to top-k experts, weights and an expert-sorted token order;
 *   combine         weighted sum of expert outputs back into token order (plus a shared expert);
 *   shared_expert   one dense gated FFN applied to every token;
 *   grouped_experts gate/up or down products for all routed experts in one launch;
 *   s_gemv/s_dequant products and dequantization for the S-family scaled block formats;
 *   quantize        activation quantization, optionally gathering rows into expert order;
 *   elementwise     small fused vector operations;
 *   doorbell        stream-ordered writes and waits on a memory word, to hand work between the
 *                   device and host-side pipelines without synchronising the stream;
 *   sample          token sampling from logits;
 *   spec_verify     verification of speculative draft tokens.
 * A separate, optional Qwen specialization group (gated RMS normalisation, its fused residual
 * form, per-layer embeddings and control vectors) hangs off the table through its own pointer and
 * header, so that model-family code stays out of the general table.
 *
 * Routing layout. A token t routed to k experts owns the slots t * top_k + j (j < top_k). route
 * can also produce the expert-major order of all slots: sorted_slots lists the slots of expert e
 * at positions expert_offsets[e] .. expert_offsets[e + 1] - 1, and slot_rows is its inverse (the
 * row of each slot in that order). grouped_experts reads and writes rows in that order, and
 * combine uses slot_rows to bring them back to token order.
 *
 * Streams and buffers. Every execution callback enqueues its work on args->stream (an opaque
 * cudaStream_t) on device args->device_id, which the caller has already made current, and returns
 * without waiting. Device buffers are allocated and owned by the caller and must stay valid until
 * the enqueued work completes; descriptors and host values reached from an args struct are read
 * during the call only. Callbacks do not allocate device memory, create or synchronise streams,
 * or synchronise the device; scratch comes from the caller, sized by query_workspace. With
 * GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE the execution callbacks may be recorded into a CUDA graph.
 *
 * Threads and errors. Callbacks may be called from any host thread and concurrently for
 * different streams. A status describes validation and launch only; on failure *error is filled
 * when non-NULL and no work was enqueued.
 *
 * Registering a descriptor that carries this table is not a promise that the host will execute
 * it: the host validates the table and chooses per operation whether to use it.
 */
#ifndef GUILD_ABI_CUDA_MOE_ABI_H
#define GUILD_ABI_CUDA_MOE_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "guild/abi/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "CDM1": the extension tag, and the layout version of guild_cuda_moe_ext_v1_t. */
#define GUILD_CUDA_MOE_TAG GUILD_MAKE_TAG('C', 'D', 'M', '1')
#define GUILD_CUDA_MOE_EXT_VERSION 1u

/* "CDMQ": the tag and layout version of the Qwen specialization group. */
#define GUILD_CUDA_QWEN_TAG GUILD_MAKE_TAG('C', 'D', 'M', 'Q')
#define GUILD_CUDA_QWEN_EXT_VERSION 1u

/* guild_cuda_moe_ext_v1_t.capabilities bits. */
/* Execution callbacks may be recorded into a CUDA graph. */
#define GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE (1u << 0)
/* route and combine give results that do not depend on launch configuration. */
#define GUILD_CUDA_MOE_CAP_DETERMINISTIC (1u << 1)
/* doorbell accepts 8-byte words. */
#define GUILD_CUDA_MOE_CAP_DOORBELL_64 (1u << 2)

/* Operations named in a workspace query (guild_cuda_moe_workspace_query_args_v1_t.operation). */
#define GUILD_CUDA_MOE_OP_ROUTE 1u
#define GUILD_CUDA_MOE_OP_COMBINE 2u
#define GUILD_CUDA_MOE_OP_SHARED_EXPERT 3u
#define GUILD_CUDA_MOE_OP_GROUPED_EXPERTS 4u
#define GUILD_CUDA_MOE_OP_S_GEMV 5u
#define GUILD_CUDA_MOE_OP_S_DEQUANT 6u
#define GUILD_CUDA_MOE_OP_QUANTIZE 7u
#define GUILD_CUDA_MOE_OP_ELEMENTWISE 8u
#define GUILD_CUDA_MOE_OP_DOORBELL 9u
#define GUILD_CUDA_MOE_OP_SAMPLE 10u
#define GUILD_CUDA_MOE_OP_SPEC_VERIFY 11u

/* Flags shared by several operations: add the result to the output instead of overwriting it. */
#define GUILD_CUDA_MOE_ACCUMULATE (1u << 0)
/* shared_expert: scale the result by sigmoid(dot(x, gate_input_weights)). */
#define GUILD_CUDA_MOE_SHARED_GATED (1u << 1)
/* route: rescale the k selected weights to sum to 1. */
#define GUILD_CUDA_MOE_ROUTE_NORMALIZE (1u << 2)

/*
 * Router gating (guild_cuda_moe_route_args_v1_t.gating). SOFTMAX: softmax over all experts, then
 * top-k. SIGMOID: per-expert sigmoid, then top-k. TOP_K_SOFTMAX: top-k on the raw logits, then a
 * softmax over the k selected.
 */
#define GUILD_CUDA_MOE_GATING_SOFTMAX 0u
#define GUILD_CUDA_MOE_GATING_SIGMOID 1u
#define GUILD_CUDA_MOE_GATING_TOP_K_SOFTMAX 2u

/* Gated activations of expert FFNs: SWIGLU = silu(gate) * up, GEGLU = gelu(gate) * up. */
#define GUILD_CUDA_MOE_GLU_SWIGLU 1u
#define GUILD_CUDA_MOE_GLU_GEGLU 2u

/* Stages of grouped_experts (guild_cuda_moe_grouped_args_v1_t.stage). */
#define GUILD_CUDA_MOE_STAGE_GATE_UP 1u
#define GUILD_CUDA_MOE_STAGE_DOWN 2u

/*
 * S-family formats (guild_cuda_s_format_v1_t.format_id): scaled block formats with `bits`-bit
 * codes per weight and one scale (plus an offset when GUILD_CUDA_S_FORMAT_AFFINE is set) per
 * block. A weight decodes to scale * (code - 2^(bits-1)), or scale * code + offset when affine.
 */
#define GUILD_CUDA_S_FORMAT_S2 1u
#define GUILD_CUDA_S_FORMAT_S3 2u
#define GUILD_CUDA_S_FORMAT_S4 3u
#define GUILD_CUDA_S_FORMAT_S8 4u
/* guild_cuda_s_format_v1_t.flags: every block also stores an offset. */
#define GUILD_CUDA_S_FORMAT_AFFINE (1u << 0)
/* guild_cuda_s_format_v1_t.flags: scales (and offsets) live in a separate plane, not in blocks. */
#define GUILD_CUDA_S_FORMAT_PLANAR_SCALES (1u << 1)

/*
 * Elementwise operations (guild_cuda_elementwise_args_v1_t.op), computed in F32 per element:
 * ADD a + b; MUL a * b; SCALE alpha * a + beta; COPY a (converting dtype); SILU silu(a);
 * GELU gelu(a); SWIGLU silu(a) * b; GEGLU gelu(a) * b; SIGMOID_MUL a * sigmoid(b);
 * AXPY a + alpha * b.
 */
#define GUILD_CUDA_EW_ADD 1u
#define GUILD_CUDA_EW_MUL 2u
#define GUILD_CUDA_EW_SCALE 3u
#define GUILD_CUDA_EW_COPY 4u
#define GUILD_CUDA_EW_SILU 5u
#define GUILD_CUDA_EW_GELU 6u
#define GUILD_CUDA_EW_SWIGLU 7u
#define GUILD_CUDA_EW_GEGLU 8u
#define GUILD_CUDA_EW_SIGMOID_MUL 9u
#define GUILD_CUDA_EW_AXPY 10u

/*
 * Doorbell operations (guild_cuda_doorbell_args_v1_t.op). WRITE stores value once all earlier
 * work on the stream has completed. WAIT_GEQ and WAIT_EQ hold back later work on the stream until
 * the word is >= value (unsigned) or == value.
 */
#define GUILD_CUDA_DOORBELL_WRITE 1u
#define GUILD_CUDA_DOORBELL_WAIT_GEQ 2u
#define GUILD_CUDA_DOORBELL_WAIT_EQ 3u

/* How spec_verify accepts drafts (guild_cuda_spec_verify_args_v1_t.mode). */
/* Accept while the draft equals the target's argmax. */
#define GUILD_CUDA_SPEC_VERIFY_GREEDY 0u
/* Speculative-sampling rejection test against the draft distribution. */
#define GUILD_CUDA_SPEC_VERIFY_REJECTION 1u

/* Gate activations of the Qwen gated RMS normalisation: silu(z) or sigmoid(z). */
#define GUILD_CUDA_QWEN_GATE_SILU 0u
#define GUILD_CUDA_QWEN_GATE_SIGMOID 1u

/* ------------------------------------------------------------------------------------------ */
/* General operations                                                                          */
/* ------------------------------------------------------------------------------------------ */

/*
 * Arguments of query_workspace: report the scratch one operation needs. `op_args` points at that
 * operation's args struct filled as it will be passed (buffer pointers may be NULL). Runs on the
 * host only and enqueues nothing.
 */
typedef struct guild_cuda_moe_workspace_query_args_v1_t {
    /* sizeof(guild_cuda_moe_workspace_query_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_MOE_OP_*: says which args struct op_args points at. */
    uint32_t operation;
    /* The operation's args, read during the call only. */
    const void* op_args;
    /* Written only on success: the workspace bytes the operation needs (0 for none). */
    uint64_t* workspace_bytes_out;
} guild_cuda_moe_workspace_query_args_v1_t;

/*
 * Arguments of route: gating and top-k over router logits, with optional group-limited selection
 * (keep the top_k_groups groups of experts with the best scores, then select among their experts)
 * and an optional expert-major ordering of the slots (see "Routing layout").
 */
typedef struct guild_cuda_moe_route_args_v1_t {
    /* sizeof(guild_cuda_moe_route_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_MOE_GATING_*. */
    uint32_t gating;
    /* GUILD_CUDA_MOE_ROUTE_NORMALIZE. */
    uint32_t flags;
    /* Tokens routed. */
    uint32_t token_count;
    /* Experts in the layer. */
    uint32_t expert_count;
    /* Experts selected per token. */
    uint32_t top_k;
    /* Expert groups for group-limited routing (expert_count is a multiple); 0 or 1 disables it. */
    uint32_t group_count;
    /* Groups kept per token when group_count > 1. */
    uint32_t top_k_groups;
    /* Factor applied to every selected weight after normalisation; 1 for none. */
    float weight_scale;
    /* Must be zero. */
    uint32_t reserved0;
    /* Device [token_count] rows of expert_count F32 logits. */
    const float* logits;
    uint64_t logits_row_stride_bytes;
    /* Optional device [expert_count] F32 biases added for selection only; NULL for none. */
    const float* selection_bias;
    /* Device [token_count * top_k] selected experts, each token's in descending score order. */
    int32_t* expert_ids;
    /* Device [token_count * top_k] weights matching expert_ids. */
    float* expert_weights;
    /* Optional device [expert_count + 1] prefix sums of slots per expert; NULL when not wanted. */
    int32_t* expert_offsets;
    /* Optional device [token_count * top_k] slots in expert-major order (stable within an
     * expert); required when expert_offsets is non-NULL. */
    int32_t* sorted_slots;
    /* Optional device [token_count * top_k] row of each slot in sorted order; NULL when not
     * wanted. */
    int32_t* slot_rows;
    /* Scratch of the size query_workspace reported. */
    void* workspace;
    uint64_t workspace_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_moe_route_args_v1_t;

/*
 * Arguments of combine: for every token t,
 *   acc = sum over j < top_k, in order, of w[t][j] * expert_outputs[slot_rows[t * top_k + j]]
 *   acc += shared_output[t] (when given);  output[t] = acc, or output[t] += acc with ACCUMULATE
 * summed in F32. A negative slot row skips the slot.
 */
typedef struct guild_cuda_moe_combine_args_v1_t {
    /* sizeof(guild_cuda_moe_combine_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of output and shared_output. */
    uint32_t output_dtype;
    /* GUILD_CUDA_MOE_ACCUMULATE. */
    uint32_t flags;
    /* Tokens to combine. */
    uint32_t token_count;
    /* Slots per token. */
    uint32_t top_k;
    /* Must be zero. */
    uint32_t reserved0;
    /* Elements per row. */
    uint64_t hidden_size;
    /* Device F32 expert output rows. */
    const float* expert_outputs;
    uint64_t expert_output_row_stride_bytes;
    /* Device [token_count * top_k] row of each slot in expert_outputs. */
    const int32_t* slot_rows;
    /* Device [token_count * top_k] weights, or NULL when the rows are already weighted. */
    const float* expert_weights;
    /* Optional device [token_count] shared expert rows; NULL for none. */
    const void* shared_output;
    uint64_t shared_output_row_stride_bytes;
    /* Device [token_count] output rows of hidden_size elements. */
    void* output;
    uint64_t output_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_moe_combine_args_v1_t;

/*
 * Arguments of shared_expert: for every token, y = down(glu(gate(x), up(x))), optionally scaled
 * by sigmoid(dot(x, gate_input_weights)) with GUILD_CUDA_MOE_SHARED_GATED, then written or
 * accumulated into output.
 */
typedef struct guild_cuda_moe_shared_expert_args_v1_t {
    /* sizeof(guild_cuda_moe_shared_expert_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_* of the gate, up and down matrices (one of the table's grouped_dtypes). */
    uint32_t weight_dtype;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of input, output and gate_input_weights. */
    uint32_t io_dtype;
    /* GUILD_CUDA_MOE_GLU_*. */
    uint32_t glu;
    /* GUILD_CUDA_MOE_ACCUMULATE and GUILD_CUDA_MOE_SHARED_GATED bits. */
    uint32_t flags;
    /* Tokens to process. */
    uint32_t token_count;
    /* Model width and the shared expert's FFN width. */
    uint64_t hidden_size;
    uint64_t intermediate_size;
    /* Device matrices: gate and up have intermediate_size rows of hidden_size elements, down has
     * hidden_size rows of intermediate_size elements. */
    const void* gate_weights;
    const void* up_weights;
    const void* down_weights;
    uint64_t gate_up_row_stride_bytes;
    uint64_t down_row_stride_bytes;
    /* Device [hidden_size] gate vector for GUILD_CUDA_MOE_SHARED_GATED; NULL otherwise. */
    const void* gate_input_weights;
    /* Device [token_count] input rows of hidden_size elements. */
    const void* input;
    uint64_t input_row_stride_bytes;
    /* Device [token_count] output rows of hidden_size elements. */
    void* output;
    uint64_t output_row_stride_bytes;
    /* Scratch of the size query_workspace reported. */
    void* workspace;
    uint64_t workspace_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_moe_shared_expert_args_v1_t;

/*
 * Arguments of grouped_experts: one stage of every routed expert's FFN in one launch. Output
 * row i belongs to slot sorted_slots[i] and to the expert e whose range contains i.
 * GATE_UP: input rows are tokens (row sorted_slots[i] / top_k); output[i] = glu(gate_e x, up_e x)
 * with out_features = the FFN width. DOWN: input row i is the slot's hidden row in sorted order;
 * output[i] = down_e h with out_features = the model width.
 */
typedef struct guild_cuda_moe_grouped_args_v1_t {
    /* sizeof(guild_cuda_moe_grouped_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_MOE_STAGE_*. */
    uint32_t stage;
    /* GUILD_DTYPE_* of the expert matrices (one of the table's grouped_dtypes). */
    uint32_t weight_dtype;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_BF16 or GUILD_DTYPE_Q8_1 (rows quantized by quantize). */
    uint32_t input_dtype;
    /* GUILD_CUDA_MOE_GLU_* for GATE_UP; 0 for DOWN. */
    uint32_t glu;
    /* Experts in the layer, experts per token and tokens. */
    uint32_t expert_count;
    uint32_t top_k;
    uint32_t token_count;
    /* Elements per input row and per output row. */
    uint64_t in_features;
    uint64_t out_features;
    /* Device matrices of expert 0; expert e's start expert_stride_bytes * e further. For GATE_UP
     * `weights` is the gate matrix and `up_weights` the up matrix, or up_weights is NULL when
     * each expert's matrix holds out_features gate rows followed by out_features up rows. */
    const void* weights;
    const void* up_weights;
    uint64_t expert_stride_bytes;
    uint64_t weight_row_stride_bytes;
    /* Device routing layout from route. */
    const int32_t* expert_offsets;
    const int32_t* sorted_slots;
    /* Device input rows (see above) and F32 output rows in sorted order. */
    const void* input;
    uint64_t input_row_stride_bytes;
    float* output;
    uint64_t output_row_stride_bytes;
    /* Scratch of the size query_workspace reported. */
    void* workspace;
    uint64_t workspace_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_moe_grouped_args_v1_t;

/* One S-family format (see GUILD_CUDA_S_FORMAT_*): plain numbers, no pointers. */
typedef struct guild_cuda_s_format_v1_t {
    /* sizeof(guild_cuda_s_format_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_S_FORMAT_*. */
    uint32_t format_id;
    /* Code width in bits. */
    uint32_t bits;
    /* Weights per block and bytes per block (codes, plus scales unless PLANAR_SCALES). */
    uint32_t block_elements;
    uint32_t block_bytes;
    /* GUILD_DTYPE_F16, GUILD_DTYPE_BF16 or GUILD_DTYPE_F32 of scales and offsets. */
    uint32_t scale_dtype;
    /* GUILD_CUDA_S_FORMAT_AFFINE and GUILD_CUDA_S_FORMAT_PLANAR_SCALES bits. */
    uint32_t flags;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_s_format_v1_t;

/*
 * Arguments of s_gemv: output[t][i] = dot(W[row(i)], x[t]) in F32 for S-family weights, a few
 * tokens at a time. row(i) is row_ids[i] when row_ids is non-NULL (row_id_count entries), else i.
 */
typedef struct guild_cuda_s_gemv_args_v1_t {
    /* sizeof(guild_cuda_s_gemv_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_BF16 or GUILD_DTYPE_Q8_1 of input. */
    uint32_t input_dtype;
    /* GUILD_CUDA_MOE_ACCUMULATE. */
    uint32_t flags;
    /* Number of entries at row_ids; ignored when row_ids is NULL. */
    uint32_t row_id_count;
    /* The weights' format; read during the call only. */
    const guild_cuda_s_format_v1_t* format;
    /* Weight rows, elements per row (a multiple of the block), and tokens. */
    uint64_t rows;
    uint64_t cols;
    uint64_t tokens;
    /* Device weight rows. */
    const void* weights;
    uint64_t weight_row_stride_bytes;
    /* Device scale plane for GUILD_CUDA_S_FORMAT_PLANAR_SCALES, one row per weight row; NULL
     * otherwise. */
    const void* scales;
    uint64_t scale_row_stride_bytes;
    /* Device [tokens] input rows. */
    const void* input;
    uint64_t input_row_stride_bytes;
    /* Optional device row selection; NULL computes every row. */
    const int32_t* row_ids;
    /* Device [tokens] F32 output rows. */
    float* output;
    uint64_t output_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_s_gemv_args_v1_t;

/* Arguments of s_dequant: expand S-family rows to F32, F16 or BF16. */
typedef struct guild_cuda_s_dequant_args_v1_t {
    /* sizeof(guild_cuda_s_dequant_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16 or GUILD_DTYPE_BF16 of output. */
    uint32_t output_dtype;
    /* The weights' format; read during the call only. */
    const guild_cuda_s_format_v1_t* format;
    /* Rows and elements per row (a multiple of the block). */
    uint64_t rows;
    uint64_t cols;
    /* Device weight rows and, for PLANAR_SCALES, the scale plane. */
    const void* weights;
    uint64_t weight_row_stride_bytes;
    const void* scales;
    uint64_t scale_row_stride_bytes;
    /* Device output rows. */
    void* output;
    uint64_t output_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_s_dequant_args_v1_t;

/*
 * Arguments of quantize: quantize activation rows to a block format, optionally gathering them.
 * Output row i quantizes input row gather_rows[i] / gather_divisor (so slots can be gathered into
 * expert order with gather_rows = sorted_slots and gather_divisor = top_k), or input row i when
 * gather_rows is NULL. Elements from cols to padded_cols are quantized as zeros.
 */
typedef struct guild_cuda_moe_quantize_args_v1_t {
    /* sizeof(guild_cuda_moe_quantize_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of input. */
    uint32_t input_dtype;
    /* GUILD_DTYPE_Q8_1, GUILD_DTYPE_Q8_0 or GUILD_DTYPE_Q8_K of output. */
    uint32_t output_dtype;
    /* Divisor applied to gather_rows entries; at least 1. */
    uint32_t gather_divisor;
    /* Elements per input row, per output row (padded to the output block), and output rows. */
    uint64_t cols;
    uint64_t padded_cols;
    uint64_t rows;
    /* Device input rows. */
    const void* input;
    uint64_t input_row_stride_bytes;
    /* Optional device [rows] gather indices; NULL for none. */
    const int32_t* gather_rows;
    /* Device [rows] output rows of padded_cols elements of output_dtype. */
    void* output;
    uint64_t output_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_moe_quantize_args_v1_t;

/*
 * Arguments of elementwise: out[r][c] = op(a[r][c], b[r][c]) over rows x cols elements. A row
 * stride of 0 for b broadcasts its first row to every row.
 */
typedef struct guild_cuda_elementwise_args_v1_t {
    /* sizeof(guild_cuda_elementwise_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_EW_*. */
    uint32_t op;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16 or GUILD_DTYPE_BF16 of a, b and out. */
    uint32_t a_dtype;
    uint32_t b_dtype;
    uint32_t out_dtype;
    /* Must be zero. */
    uint32_t reserved0;
    /* Rows and elements per row. */
    uint64_t rows;
    uint64_t cols;
    /* Scalars used by SCALE and AXPY. */
    float alpha;
    float beta;
    /* Device operands; b is NULL for unary operations. out may equal a or b (same strides). */
    const void* a;
    uint64_t a_row_stride_bytes;
    const void* b;
    uint64_t b_row_stride_bytes;
    void* out;
    uint64_t out_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_elementwise_args_v1_t;

/*
 * Arguments of doorbell. The word may be device memory or mapped pinned host memory and must
 * stay valid until the operation has completed on the stream. A wait whose condition never
 * becomes true stalls the stream; arranging the matching write is the caller's job.
 */
typedef struct guild_cuda_doorbell_args_v1_t {
    /* sizeof(guild_cuda_doorbell_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_DOORBELL_*. */
    uint32_t op;
    /* Width of the word: 4, or 8 with GUILD_CUDA_MOE_CAP_DOORBELL_64. */
    uint32_t width_bytes;
    /* Must be zero. */
    uint32_t reserved0;
    /* Device-accessible address of the word, aligned to width_bytes. */
    void* address;
    /* Value to write or compare with (the low 32 bits for 4-byte words). */
    uint64_t value;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the stream and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_doorbell_args_v1_t;

/*
 * Arguments of sample: one token per logits row. With temperature 0 the token is the argmax
 * (ties to the lower id). Otherwise logits are divided by temperature, softmaxed, filtered by
 * top_k, top_p and min_p (each off at 0, 1 and 0), and one token is drawn with the provider's
 * counter-based generator keyed by seed, at counter offset + row: the same inputs, seed and offset
 * give the same tokens from the same provider.
 */
typedef struct guild_cuda_sample_args_v1_t {
    /* sizeof(guild_cuda_sample_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* Logits rows to sample from. */
    uint32_t row_count;
    /* Keep the k most likely tokens; 0 keeps all. */
    uint32_t top_k;
    /* Must be zero. */
    uint32_t reserved0;
    /* Tokens per logits row. */
    uint64_t vocab_size;
    /* Temperature (0 = greedy), nucleus mass (1 = off) and minimum relative probability (0 =
     * off). */
    float temperature;
    float top_p;
    float min_p;
    /* Must be zero. */
    uint32_t reserved1;
    /* Generator key and counter offset. */
    uint64_t seed;
    uint64_t offset;
    /* Device [row_count] rows of vocab_size F32 logits. */
    const float* logits;
    uint64_t logits_row_stride_bytes;
    /* Device [row_count] sampled token ids. */
    int32_t* tokens;
    /* Optional device [row_count] probability of each sampled token after filtering; NULL when
     * not wanted. */
    float* probabilities;
    /* Scratch of the size query_workspace reported. */
    void* workspace;
    uint64_t workspace_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved2;
} guild_cuda_sample_args_v1_t;

/*
 * Arguments of spec_verify: for each sequence, test its draft_count draft tokens against the
 * target model's logits for the draft positions (draft_count + 1 rows: one per draft plus the
 * position after the last). The accepted prefix is followed by one token from the target: the
 * correction at the first rejected position, or the bonus token after a fully accepted draft.
 */
typedef struct guild_cuda_spec_verify_args_v1_t {
    /* sizeof(guild_cuda_spec_verify_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_SPEC_VERIFY_*. */
    uint32_t mode;
    /* Sequences and draft tokens per sequence. */
    uint32_t seq_count;
    uint32_t draft_count;
    /* Tokens per logits row. */
    uint64_t vocab_size;
    /* REJECTION: temperature applied to the target logits; ignored for GREEDY. */
    float temperature;
    /* Must be zero. */
    uint32_t reserved0;
    /* REJECTION: generator key and counter offset, as in sample. */
    uint64_t seed;
    uint64_t offset;
    /* Device [seq_count][draft_count] draft tokens, rows packed. */
    const int32_t* draft_tokens;
    /* REJECTION: device [seq_count * draft_count] rows of vocab_size F32 draft probabilities;
     * NULL for GREEDY. */
    const float* draft_probs;
    uint64_t draft_probs_row_stride_bytes;
    /* Device [seq_count * (draft_count + 1)] rows of vocab_size F32 target logits. */
    const float* target_logits;
    uint64_t target_row_stride_bytes;
    /* Device [seq_count] accepted draft tokens per sequence. */
    int32_t* accepted_counts;
    /* Device [seq_count][draft_count + 1] accepted tokens then the target's token, rows packed;
     * entries after it are -1. */
    int32_t* output_tokens;
    /* Scratch of the size query_workspace reported. */
    void* workspace;
    uint64_t workspace_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_spec_verify_args_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* Qwen specialization group                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * Arguments of gr, gated RMS normalisation: each row is split into groups of group_size elements
 * (group_size == cols normalises whole rows), and for each group
 *   out = x / sqrt(mean(x^2) + eps) * weight * act(z)
 * where z is the matching group of `gate` and act is GUILD_CUDA_QWEN_GATE_*.
 */
typedef struct guild_cuda_qwen_gr_args_v1_t {
    /* sizeof(guild_cuda_qwen_gr_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of input, gate and output. */
    uint32_t io_dtype;
    /* GUILD_CUDA_QWEN_GATE_*. */
    uint32_t gate_act;
    /* Rows to normalise. */
    uint32_t rows;
    /* Elements per row and per normalisation group (cols is a multiple of group_size). */
    uint64_t cols;
    uint64_t group_size;
    /* Added to the mean square before the square root. */
    float eps;
    /* Must be zero. */
    uint32_t reserved0;
    /* Device input and gate rows. */
    const void* input;
    uint64_t input_row_stride_bytes;
    const void* gate;
    uint64_t gate_row_stride_bytes;
    /* Device [group_size] F32 weights shared by every group. */
    const float* weight;
    /* Device output rows; may equal input. */
    void* output;
    uint64_t output_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_qwen_gr_args_v1_t;

/*
 * Arguments of fused_gr: residual[r] += delta[r], then output[r] = gr(residual[r], gate[r]) as
 * in gr (plain RMS normalisation when gate is NULL), and, when output_q8_1 is non-NULL, the same
 * row also quantized to Q8_1 with zeros from cols to padded_cols.
 */
typedef struct guild_cuda_qwen_fused_gr_args_v1_t {
    /* sizeof(guild_cuda_qwen_fused_gr_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of residual, delta, gate and output. */
    uint32_t io_dtype;
    /* GUILD_CUDA_QWEN_GATE_*. */
    uint32_t gate_act;
    /* Rows to process. */
    uint32_t rows;
    /* Elements per row and per normalisation group. */
    uint64_t cols;
    uint64_t group_size;
    /* Added to the mean square before the square root. */
    float eps;
    /* Must be zero. */
    uint32_t reserved0;
    /* Device residual rows, read and updated in place. */
    void* residual;
    uint64_t residual_row_stride_bytes;
    /* Device rows added to the residual. */
    const void* delta;
    uint64_t delta_row_stride_bytes;
    /* Optional device gate rows; NULL for an ungated RMS normalisation. */
    const void* gate;
    uint64_t gate_row_stride_bytes;
    /* Device [group_size] F32 weights. */
    const float* weight;
    /* Device normalised output rows. */
    void* output;
    uint64_t output_row_stride_bytes;
    /* Optional device Q8_1 copy of the output; NULL when not wanted. */
    void* output_q8_1;
    uint64_t output_q8_1_row_stride_bytes;
    /* Elements per Q8_1 row: >= cols and a multiple of 512. */
    uint64_t padded_cols;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_qwen_fused_gr_args_v1_t;

/*
 * Arguments of ple, per-layer embeddings: for every token t,
 *   output[t] = (table[token_ids[t]][layer_index] * table_scale + projected[t][layer_index])
 *               * output_scale
 * where the table holds, per vocabulary entry, layer_count slices of ple_dim elements, and the
 * projected term is skipped when projected is NULL.
 */
typedef struct guild_cuda_qwen_ple_args_v1_t {
    /* sizeof(guild_cuda_qwen_ple_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16, GUILD_DTYPE_BF16 or GUILD_DTYPE_Q8_0 of table. */
    uint32_t table_dtype;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of projected and output. */
    uint32_t io_dtype;
    /* The layer whose slice is produced, and the layers in the table. */
    uint32_t layer_index;
    uint32_t layer_count;
    /* Tokens to embed. */
    uint32_t token_count;
    /* Elements per layer slice. */
    uint64_t ple_dim;
    /* Scale of the table term and of the sum. */
    float table_scale;
    float output_scale;
    /* Device [token_count] token ids, each < vocab_size. */
    const int32_t* token_ids;
    /* Device embedding table, one row of layer_count * ple_dim elements per vocabulary entry. */
    const void* table;
    uint64_t table_row_stride_bytes;
    uint64_t vocab_size;
    /* Optional device [token_count] rows of layer_count * ple_dim elements; NULL for none. */
    const void* projected;
    uint64_t projected_row_stride_bytes;
    /* Device [token_count] output rows of ple_dim elements. */
    void* output;
    uint64_t output_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_qwen_ple_args_v1_t;

/*
 * Arguments of cvec, a control vector: hidden[t] += strength * vector for every token, applied
 * by the host after the layers it chooses.
 */
typedef struct guild_cuda_qwen_cvec_args_v1_t {
    /* sizeof(guild_cuda_qwen_cvec_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of hidden. */
    uint32_t io_dtype;
    /* Layer the vector belongs to, for diagnostics. */
    uint32_t layer_index;
    /* Tokens to steer. */
    uint32_t token_count;
    /* Elements per hidden row. */
    uint64_t hidden_size;
    /* Multiplier of the vector. */
    float strength;
    /* Must be zero. */
    uint32_t reserved0;
    /* Device [hidden_size] F32 direction for this layer. */
    const float* vector;
    /* Device [token_count] hidden rows, updated in place. */
    void* hidden;
    uint64_t hidden_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_qwen_cvec_args_v1_t;

/* The Qwen group's callback types. `user_data` is the group's user_data; `error` may be NULL. */
typedef guild_status_t (*guild_cuda_qwen_gr_fn)(void* user_data, const guild_cuda_qwen_gr_args_v1_t* args,
                                                guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_qwen_fused_gr_fn)(void* user_data, const guild_cuda_qwen_fused_gr_args_v1_t* args,
                                                      guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_qwen_ple_fn)(void* user_data, const guild_cuda_qwen_ple_args_v1_t* args,
                                                 guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_qwen_cvec_fn)(void* user_data, const guild_cuda_qwen_cvec_args_v1_t* args,
                                                  guild_error_info_t* error);

/*
 * The Qwen specialization group, reached only through guild_cuda_moe_ext_v1_t.qwen (never
 * through a next_ext chain, so header.next is NULL). header.struct_size is
 * sizeof(guild_cuda_qwen_group_v1_t), header.tag GUILD_CUDA_QWEN_TAG and header.version
 * GUILD_CUDA_QWEN_EXT_VERSION; it is checked like any extension. A NULL callback means that
 * operation is not offered.
 */
typedef struct guild_cuda_qwen_group_v1_t {
    guild_ext_header_t header;
    /* Gated RMS normalisation. */
    guild_cuda_qwen_gr_fn gr;
    /* Residual add, gated RMS normalisation and optional Q8_1 output in one pass. */
    guild_cuda_qwen_fused_gr_fn fused_gr;
    /* Per-layer embeddings. */
    guild_cuda_qwen_ple_fn ple;
    /* Control vectors. */
    guild_cuda_qwen_cvec_fn cvec;
    /* Passed back as the first argument of the group's callbacks; owned by the plugin and valid
     * until its shutdown returns. */
    void* user_data;
} guild_cuda_qwen_group_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* The CDM1 table                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* The callback types. `user_data` is the table's user_data; `error` may be NULL. */
typedef guild_status_t (*guild_cuda_moe_query_workspace_fn)(void* user_data,
                                                            const guild_cuda_moe_workspace_query_args_v1_t* args,
                                                            guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_moe_route_fn)(void* user_data, const guild_cuda_moe_route_args_v1_t* args,
                                                  guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_moe_combine_fn)(void* user_data, const guild_cuda_moe_combine_args_v1_t* args,
                                                    guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_moe_shared_expert_fn)(void* user_data,
                                                          const guild_cuda_moe_shared_expert_args_v1_t* args,
                                                          guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_moe_grouped_experts_fn)(void* user_data,
                                                            const guild_cuda_moe_grouped_args_v1_t* args,
                                                            guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_s_gemv_fn)(void* user_data, const guild_cuda_s_gemv_args_v1_t* args,
                                               guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_s_dequant_fn)(void* user_data, const guild_cuda_s_dequant_args_v1_t* args,
                                                  guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_moe_quantize_fn)(void* user_data, const guild_cuda_moe_quantize_args_v1_t* args,
                                                     guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_elementwise_fn)(void* user_data, const guild_cuda_elementwise_args_v1_t* args,
                                                    guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_doorbell_fn)(void* user_data, const guild_cuda_doorbell_args_v1_t* args,
                                                 guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_sample_fn)(void* user_data, const guild_cuda_sample_args_v1_t* args,
                                               guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_spec_verify_fn)(void* user_data, const guild_cuda_spec_verify_args_v1_t* args,
                                                    guild_error_info_t* error);

/*
 * The CDM1 table. header.struct_size is sizeof(guild_cuda_moe_ext_v1_t), header.tag
 * GUILD_CUDA_MOE_TAG and header.version GUILD_CUDA_MOE_EXT_VERSION. query_workspace is required;
 * a NULL execution callback means that operation is not offered.
 */
typedef struct guild_cuda_moe_ext_v1_t {
    guild_ext_header_t header;
    /* GUILD_CUDA_MOE_CAP_* bits. */
    uint32_t capabilities;
    /* Must be zero. */
    uint32_t reserved;
    /* Weight dtypes grouped_experts and shared_expert accept: bit ((uint64_t)1 << dtype). */
    uint64_t grouped_dtypes;
    /* S-family formats s_gemv and s_dequant accept: bit ((uint64_t)1 << format_id). */
    uint64_t s_formats;
    /* Reports the scratch an operation needs. */
    guild_cuda_moe_query_workspace_fn query_workspace;
    /* Routing: gating, top-k and the expert-major slot order. */
    guild_cuda_moe_route_fn route;
    /* Weighted combine back into token order. */
    guild_cuda_moe_combine_fn combine;
    /* Dense shared expert FFN. */
    guild_cuda_moe_shared_expert_fn shared_expert;
    /* One FFN stage for all routed experts. */
    guild_cuda_moe_grouped_experts_fn grouped_experts;
    /* S-family quantized matrix-vector products. */
    guild_cuda_s_gemv_fn s_gemv;
    /* S-family dequantization. */
    guild_cuda_s_dequant_fn s_dequant;
    /* Activation quantization with optional gather. */
    guild_cuda_moe_quantize_fn quantize;
    /* Elementwise vector operations. */
    guild_cuda_elementwise_fn elementwise;
    /* Stream-ordered writes and waits on a memory word. */
    guild_cuda_doorbell_fn doorbell;
    /* Token sampling. */
    guild_cuda_sample_fn sample;
    /* Speculative draft verification. */
    guild_cuda_spec_verify_fn spec_verify;
    /* The optional Qwen specialization group, or NULL. The host copies it together with this
     * table, so the plugin may build both on init's stack. */
    const guild_cuda_qwen_group_v1_t* qwen;
    /* Passed back as the first argument of every callback above; owned by the plugin and valid
     * until its shutdown returns. */
    void* user_data;
} guild_cuda_moe_ext_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_CUDA_MOE_ABI_H */
