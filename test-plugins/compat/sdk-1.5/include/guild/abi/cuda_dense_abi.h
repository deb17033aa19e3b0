/*
 * CDD1 (Guild Kernel ABI v1 / SDK 1.5, introduced with SDK 1.4): CUDA dense projections.
 *
 * A CUDA kernel descriptor may attach a guild_cuda_dense_ext_v1_t to its next_ext chain. The
 * table offers three stream-ordered building blocks for the linear layers of a transformer:
 *   project        BF16/F32 weights times F32/BF16 activations (any number of tokens);
 *   quantize_q8_1  F32/BF16 activations to GGML Q8_1 blocks, the input of MMVQ;
 *   mmvq           GGUF block-quantized weights times Q8_1 activations for a few tokens
 *                  (quantized matrix-vector products, the decode path).
 * Nothing here changes Kernel ABI v1, PFKE or the frozen prefill direct table.
 *
 * Geometry. A weight matrix has `rows` output features of `cols` input elements each; row r
 * starts at weights + r * weight_row_stride_bytes. Activations and outputs are token-major: token
 * t of the input starts at input + t * input_row_stride_bytes, and its output at
 * output + t * output_row_stride_bytes.
 *
 * Row selection. Every product can compute an exact subset of weight rows: with selection.rows
 * non-NULL, output element i of each token is dot(W[selection.rows[i]], x[t]) for
 * i < selection.count, packed in the order given; with selection.rows NULL all `rows` rows are
 * computed in order. The indices are device-accessible int32 values read by the kernels.
 *
 * Streams and buffers. Every callback enqueues its work on args->stream (an opaque
 * cudaStream_t; NULL is the legacy default stream) on the device args->device_id, which the
 * caller has already made current, and returns without waiting for it. Every buffer is device
 * memory allocated and owned by the caller; it must stay valid, and must not be reused, until the
 * enqueued work has completed on that stream. The args struct itself, and any host array it
 * points at, is read during the call only. Callbacks do not allocate device memory, create or
 * synchronise streams, or synchronise the device. With GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE they
 * may also be recorded into a CUDA graph while the stream is capturing.
 *
 * Threads and errors. Callbacks may be called from any host thread and concurrently for
 * different streams. A status describes argument validation and the launch only; faults during
 * execution surface through the stream. On failure *error is filled when non-NULL and no work was
 * enqueued.
 *
 * Registering a descriptor that carries this table is not a promise that the host will execute
 * it: the host validates the table and chooses among providers per operation.
 */
#ifndef GUILD_ABI_CUDA_DENSE_ABI_H
#define GUILD_ABI_CUDA_DENSE_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "guild/abi/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "CDD1": the extension tag, and the layout version of guild_cuda_dense_ext_v1_t. */
#define GUILD_CUDA_DENSE_TAG GUILD_MAKE_TAG('C', 'D', 'D', '1')
#define GUILD_CUDA_DENSE_EXT_VERSION 1u

/* guild_cuda_dense_ext_v1_t.capabilities: every callback may be recorded into a CUDA graph. */
#define GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE (1u << 0)
/* guild_cuda_dense_ext_v1_t.capabilities: project accepts BF16 outputs. */
#define GUILD_CUDA_DENSE_CAP_BF16_OUTPUT (1u << 1)

/* Flags of project and mmvq: add the product to the output instead of overwriting it. */
#define GUILD_CUDA_DENSE_ACCUMULATE (1u << 0)

/* GGML Q8_1 block: 32 int8 quants with an F16 scale d and the F16 value d * sum(quants). */
#define GUILD_CUDA_DENSE_Q8_1_BLOCK_ELEMENTS 32u
#define GUILD_CUDA_DENSE_Q8_1_BLOCK_BYTES 36u
/* Quantized activation rows are padded with zeros to a multiple of this many elements, so that
 * MMVQ kernels can read whole tiles without bounds checks. */
#define GUILD_CUDA_DENSE_Q8_1_ROW_PADDING 512u
/* The most tokens one mmvq call handles. */
#define GUILD_CUDA_DENSE_MMVQ_MAX_TOKENS 8u

/* The bit of a GUILD_DTYPE_* id in a uint64_t dtype mask such as mmvq_dtypes (ids below 64). */
#define GUILD_CUDA_DTYPE_BIT(dtype) ((uint64_t)1 << (dtype))

/* The shape of one dense product. */
typedef struct guild_cuda_dense_geometry_v1_t {
    /* Output features: rows of the weight matrix. */
    uint64_t rows;
    /* Input features: elements per weight row and per input token (unpadded). */
    uint64_t cols;
    /* Tokens: input rows and output rows. */
    uint64_t tokens;
} guild_cuda_dense_geometry_v1_t;

/* Byte strides of the three operands of a dense product. */
typedef struct guild_cuda_dense_strides_v1_t {
    /* Bytes between consecutive weight rows. */
    uint64_t weight_row_stride_bytes;
    /* Bytes between consecutive input tokens. */
    uint64_t input_row_stride_bytes;
    /* Bytes between consecutive output tokens. */
    uint64_t output_row_stride_bytes;
} guild_cuda_dense_strides_v1_t;

/* An exact set of weight rows to compute (see "Row selection" above). */
typedef struct guild_cuda_row_selection_v1_t {
    /* count device-accessible row indices, each < geometry.rows; NULL selects every row. Read by
     * the enqueued kernels, so it lives as long as the other buffers. */
    const int32_t* rows;
    /* Number of indices at rows; ignored when rows is NULL. */
    uint32_t count;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_row_selection_v1_t;

/*
 * Arguments of project: output[t][i] = dot(W[row(i)], input[t]) (+ bias[row(i)]) with F32
 * accumulation, for BF16 or F32 weights and F32 or BF16 activations.
 */
typedef struct guild_cuda_dense_project_args_v1_t {
    /* sizeof(guild_cuda_dense_project_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_BF16 or GUILD_DTYPE_F32: the weights. */
    uint32_t weight_dtype;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16: the input. */
    uint32_t input_dtype;
    /* GUILD_DTYPE_F32, or GUILD_DTYPE_BF16 with GUILD_CUDA_DENSE_CAP_BF16_OUTPUT: the output. */
    uint32_t output_dtype;
    /* GUILD_CUDA_DENSE_* flag bits. */
    uint32_t flags;
    /* Must be zero. */
    uint32_t reserved0;
    /* Shape of the product. */
    guild_cuda_dense_geometry_v1_t geometry;
    /* Byte strides of weights, input and output. */
    guild_cuda_dense_strides_v1_t strides;
    /* Which weight rows to compute. */
    guild_cuda_row_selection_v1_t selection;
    /* geometry.rows weight rows of geometry.cols elements. */
    const void* weights;
    /* geometry.tokens input rows of geometry.cols elements. */
    const void* input;
    /* Optional F32 bias per weight row (geometry.rows entries); NULL for none. */
    const float* bias;
    /* geometry.tokens output rows of selection.count (or geometry.rows) elements. */
    void* output;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_dense_project_args_v1_t;

/*
 * Arguments of quantize_q8_1: quantize token rows to GGML Q8_1. Row t of the output
 * holds padded_cols / 32 blocks; elements from cols to padded_cols are quantized as zeros.
 */
typedef struct guild_cuda_dense_quantize_q8_1_args_v1_t {
    /* sizeof(guild_cuda_dense_quantize_q8_1_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16: the input. */
    uint32_t input_dtype;
    /* Elements per input row. */
    uint64_t cols;
    /* Elements per output row: >= cols and a multiple of GUILD_CUDA_DENSE_Q8_1_ROW_PADDING. */
    uint64_t padded_cols;
    /* Rows (tokens) to quantize. */
    uint64_t rows;
    /* rows input rows of cols elements. */
    const void* input;
    /* Bytes between consecutive input rows. */
    uint64_t input_row_stride_bytes;
    /* rows output rows of padded_cols / 32 Q8_1 blocks. */
    void* output;
    /* Bytes between consecutive output rows (>= padded_cols / 32 * 36). */
    uint64_t output_row_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_dense_quantize_q8_1_args_v1_t;

/*
 * Arguments of mmvq: output[t][i] = dot(W[row(i)], x[t]) (+ bias[row(i)]) in F32, for weights in
 * a GGUF block-quantized dtype listed in the table's mmvq_dtypes and activations quantized to Q8_1
 * by quantize_q8_1. geometry.cols is the unpadded length and a multiple of the weight dtype's
 * block; geometry.tokens is at most GUILD_CUDA_DENSE_MMVQ_MAX_TOKENS; strides.input_row_stride_bytes
 * is the distance between Q8_1 rows.
 */
typedef struct guild_cuda_dense_mmvq_args_v1_t {
    /* sizeof(guild_cuda_dense_mmvq_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_* of the weights (Q4_0 ... Q6_K). */
    uint32_t weight_dtype;
    /* GUILD_CUDA_DENSE_* flag bits. */
    uint32_t flags;
    /* Must be zero. */
    uint32_t reserved0;
    /* Shape of the product. */
    guild_cuda_dense_geometry_v1_t geometry;
    /* Byte strides of weights, Q8_1 input and F32 output. */
    guild_cuda_dense_strides_v1_t strides;
    /* Which weight rows to compute. */
    guild_cuda_row_selection_v1_t selection;
    /* geometry.rows rows of geometry.cols / block elements blocks of weight_dtype. */
    const void* weights;
    /* geometry.tokens Q8_1 rows, padded as quantize_q8_1 writes them. */
    const void* input_q8_1;
    /* Optional F32 bias per weight row; NULL for none. */
    const float* bias;
    /* geometry.tokens F32 rows of selection.count (or geometry.rows) elements. */
    float* output;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_dense_mmvq_args_v1_t;

/* The callback types. `user_data` is the table's user_data; `error` may be NULL. */
typedef guild_status_t (*guild_cuda_dense_project_fn)(void* user_data, const guild_cuda_dense_project_args_v1_t* args,
                                                      guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_dense_quantize_q8_1_fn)(void* user_data,
                                                            const guild_cuda_dense_quantize_q8_1_args_v1_t* args,
                                                            guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_dense_mmvq_fn)(void* user_data, const guild_cuda_dense_mmvq_args_v1_t* args,
                                                   guild_error_info_t* error);

/*
 * The CDD1 table. header.struct_size is sizeof(guild_cuda_dense_ext_v1_t), header.tag
 * GUILD_CUDA_DENSE_TAG and header.version GUILD_CUDA_DENSE_EXT_VERSION. A NULL callback means the
 * operation is not offered; a table with all three NULL is rejected.
 */
typedef struct guild_cuda_dense_ext_v1_t {
    guild_ext_header_t header;
    /* GUILD_CUDA_DENSE_CAP_* bits. */
    uint32_t capabilities;
    /* Must be zero. */
    uint32_t reserved;
    /* GUILD_CUDA_DTYPE_BIT mask of the weight dtypes mmvq accepts. */
    uint64_t mmvq_dtypes;
    /* BF16/F32 projection. */
    guild_cuda_dense_project_fn project;
    /* Q8_1 activation quantization. */
    guild_cuda_dense_quantize_q8_1_fn quantize_q8_1;
    /* GGUF quantized matrix-vector products. */
    guild_cuda_dense_mmvq_fn mmvq;
    /* Passed back as the first argument of every callback; owned by the plugin and valid until
     * its shutdown returns. */
    void* user_data;
} guild_cuda_dense_ext_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_CUDA_DENSE_ABI_H */
