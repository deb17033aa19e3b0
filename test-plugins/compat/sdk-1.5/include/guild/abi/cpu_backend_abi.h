/*
 * CPU backend v2 (Guild Kernel ABI v1 / SDK 1.5, introduced with SDK 1.2): the CPE1 expert table
 * with further CPU callbacks appended.
 *
 * guild_cpu_backend_ext_v2_t begins with exactly the fields of guild_cpu_expert_ext_v1_t, in the
 * same order and at the same offsets (the assertions below prove it), and then appends:
 * describe_format, the canonical planar Q2 conversions (quantize and dequantize), native Q2 rows,
 * a CPU BF16 router and an ordered combine. It uses the CPE1 tag; header.version says which
 * layout the writer used (1 for a CPE1-only table, 2 for this one).
 *
 * Reading a table. A reader accepts tag GUILD_CPU_EXPERT_TAG with version 1 or 2 and
 * header.struct_size >= sizeof(guild_cpu_expert_ext_v1_t); anything smaller is rejected. It copies
 * min(header.struct_size, sizeof(guild_cpu_backend_ext_v2_t)) bytes, which is the CPE1 prefix for
 * an older plugin. An appended callback counts as present only when struct_size covers the whole
 * pointer and the pointer is non-NULL; otherwise the reader reports that operation absent rather
 * than failing. The four CPE1 callbacks stay required in every version. A larger table from a
 * newer plugin is read up to the fields this header knows.
 *
 * Ownership, threading and error rules are those of cpu_expert_abi.h: synchronous calls from
 * several host worker threads at once, buffers owned by the host and borrowed for one call,
 * outputs undefined after a failure. Registering a table is not a promise that the host will
 * execute any of its operations; binding an appended callback does not by itself move ownership
 * of that arithmetic to the plugin.
 */
#ifndef GUILD_ABI_CPU_BACKEND_ABI_H
#define GUILD_ABI_CPU_BACKEND_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "guild/abi/cpu_expert_abi.h"
#include "guild/abi/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend table keeps the CPE1 tag; version 2 is the layout declared here. */
#define GUILD_CPU_BACKEND_TAG GUILD_CPU_EXPERT_TAG
#define GUILD_CPU_BACKEND_EXT_VERSION 2u

/* ------------------------------------------------------------------------------------------ */
/* Canonical activation image                                                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * The canonical activation image is a frozen 3584-byte, 64-byte-aligned record holding up to
 * 3072 consecutive elements of one activation row, quantized to signed 8-bit values in planar
 * form: all quants, then one F32 scale per 256-element block, then the sum of every 16-element
 * group of quants (what K-quant dot products need to apply block minimums). Element i of block b
 * decodes to block_scales[b] * quants[b * 256 + i]. A row longer than 3072 elements is a sequence
 * of images with increasing first_element; the last one may be partly used.
 */
#define GUILD_CPU_ACTIVATION_IMAGE_BYTES 3584u
#define GUILD_CPU_ACTIVATION_IMAGE_ALIGN 64u
/* Layout identifier and version written into every image. */
#define GUILD_CPU_ACTIVATION_IMAGE_FORMAT_Q8_PLANAR 1u
#define GUILD_CPU_ACTIVATION_IMAGE_VERSION 1u
/* Elements per scale block and per group sum. */
#define GUILD_CPU_ACTIVATION_IMAGE_BLOCK_ELEMENTS 256u
#define GUILD_CPU_ACTIVATION_IMAGE_GROUP_ELEMENTS 16u
/* Capacity of one image: 3072 elements = 12 blocks = 192 groups. */
#define GUILD_CPU_ACTIVATION_IMAGE_MAX_ELEMENTS 3072u
#define GUILD_CPU_ACTIVATION_IMAGE_MAX_BLOCKS 12u
#define GUILD_CPU_ACTIVATION_IMAGE_MAX_GROUPS 192u
/* Bytes of the descriptive header and of the trailing padding. */
#define GUILD_CPU_ACTIVATION_IMAGE_HEADER_BYTES 64u
#define GUILD_CPU_ACTIVATION_IMAGE_TAIL_BYTES 16u

/*
 * One canonical activation image. Offsets: header 0..64, quants 64..3136, block_scales
 * 3136..3184, group_sums 3184..3568, tail padding 3568..3584. Every reserved byte is zero.
 */
typedef struct guild_cpu_activation_image_v1_t {
    /* GUILD_CPU_ACTIVATION_IMAGE_FORMAT_Q8_PLANAR. Its alignment gives the image its 64 bytes. */
    GUILD_ATTR_ALIGN(64) uint32_t format;
    /* GUILD_CPU_ACTIVATION_IMAGE_VERSION. */
    uint32_t version;
    /* Valid elements in this image: a multiple of 256, at most 3072. */
    uint32_t element_count;
    /* element_count / 256. */
    uint32_t block_count;
    /* Index within the activation row of quants[0]. */
    uint64_t first_element;
    /* Length in elements of the whole activation row. */
    uint64_t row_elements;
    /* Row (token) of the batch the image was taken from, for checks and diagnostics. */
    uint32_t token_index;
    /* Must be zero. */
    uint32_t flags;
    /* Must be zero. */
    uint32_t reserved0[6];
    /* Quantized values; entries at and past element_count are zero. */
    int8_t quants[GUILD_CPU_ACTIVATION_IMAGE_MAX_ELEMENTS];
    /* F32 scale of each 256-element block; unused entries are zero. */
    float block_scales[GUILD_CPU_ACTIVATION_IMAGE_MAX_BLOCKS];
    /* Sum of the quants of each 16-element group; unused entries are zero. */
    int16_t group_sums[GUILD_CPU_ACTIVATION_IMAGE_MAX_GROUPS];
    /* Must be zero. */
    uint8_t reserved1[GUILD_CPU_ACTIVATION_IMAGE_TAIL_BYTES];
} guild_cpu_activation_image_v1_t;

/*
 * A layout probe, never passed across the boundary: a one-byte lead followed by an image. The
 * compiler puts the image at the image's alignment, so offsetof(..., image) == 64 proves the
 * 64-byte alignment in C99, where no alignof exists, as well as in C11 and C++.
 */
typedef struct guild_cpu_activation_image_align_probe_v1_t {
    uint8_t lead;
    guild_cpu_activation_image_v1_t image;
} guild_cpu_activation_image_align_probe_v1_t;

GUILD_STATIC_ASSERT(sizeof(guild_cpu_activation_image_v1_t) == GUILD_CPU_ACTIVATION_IMAGE_BYTES,
                    "the canonical activation image is 3584 bytes");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_activation_image_align_probe_v1_t, image) == GUILD_CPU_ACTIVATION_IMAGE_ALIGN,
                    "the canonical activation image is 64-byte aligned");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_activation_image_v1_t, quants) == GUILD_CPU_ACTIVATION_IMAGE_HEADER_BYTES,
                    "activation image quants start after the 64-byte header");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_activation_image_v1_t, block_scales) == 3136,
                    "activation image block_scales offset is frozen");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_activation_image_v1_t, group_sums) == 3184,
                    "activation image group_sums offset is frozen");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_activation_image_v1_t, reserved1) ==
                        GUILD_CPU_ACTIVATION_IMAGE_BYTES - GUILD_CPU_ACTIVATION_IMAGE_TAIL_BYTES,
                    "activation image tail padding is frozen");

/* ------------------------------------------------------------------------------------------ */
/* Canonical planar Q2                                                                         */
/* ------------------------------------------------------------------------------------------ */

/*
 * The canonical planar Q2 row format carries the same information as GGML Q2_K (256-element
 * blocks, 2-bit quants, a 4-bit scale and 4-bit minimum per 16 elements, F16 super-scale and
 * super-minimum per block) but stores a row of n blocks as four planes:
 *   quants  n * 64 bytes: element i of block b is bits 2*(i/64)..2*(i/64)+1 of byte b*64 + i%64;
 *   scales  n * 16 bytes: group g of block b is byte b*16 + g, scale in the low nibble, minimum
 *           in the high nibble;
 *   d       n IEEE binary16 values, little-endian;
 *   dmin    n IEEE binary16 values, little-endian.
 * Element value = d * scale * q - dmin * min. A row is n * 84 bytes; conversion to and from
 * Q2_K is lossless.
 */
#define GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS 256u
#define GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS 16u
#define GUILD_CPU_PLANAR_Q2_QUANT_BYTES 64u
#define GUILD_CPU_PLANAR_Q2_SCALE_BYTES 16u
#define GUILD_CPU_PLANAR_Q2_BLOCK_BYTES 84u

/* guild_cpu_q2_rows_args_v1_t.flags: add the result to dst instead of overwriting it. */
#define GUILD_CPU_Q2_ROWS_ACCUMULATE (1u << 0)

/* ------------------------------------------------------------------------------------------ */
/* Router and combine                                                                          */
/* ------------------------------------------------------------------------------------------ */

/*
 * How router_bf16 turns logits into expert weights (guild_cpu_router_args_v1_t.gating).
 * SOFTMAX: softmax over all experts, then top-k. SIGMOID: per-expert sigmoid, then top-k.
 * TOP_K_SOFTMAX: top-k on the raw logits, then softmax over the selected k.
 */
#define GUILD_CPU_ROUTER_GATING_SOFTMAX 0u
#define GUILD_CPU_ROUTER_GATING_SIGMOID 1u
#define GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX 2u

/* guild_cpu_router_args_v1_t.flags: rescale the k selected weights to sum to 1. */
#define GUILD_CPU_ROUTER_NORMALIZE_TOP_K (1u << 0)

/* guild_cpu_combine_args_v1_t.flags: add the combined row to dst instead of overwriting it. */
#define GUILD_CPU_COMBINE_ACCUMULATE (1u << 0)

/* ------------------------------------------------------------------------------------------ */
/* Appended callbacks' arguments                                                               */
/* ------------------------------------------------------------------------------------------ */

/*
 * Arguments of describe_format: the provider states how it wants a layer's experts stored and
 * quantized, given the dtypes and shapes the model file has. The host then packs expert images to
 * match and passes the same format back on every call.
 */
typedef struct guild_cpu_describe_format_args_v1_t {
    /* sizeof(guild_cpu_describe_format_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CPU_EXPERT_WEIGHTS_* layout the host asks for. */
    uint32_t weight_layout;
    /* GUILD_DTYPE_* of the model's gate/up and down tensors. */
    uint32_t gate_up_dtype;
    uint32_t down_dtype;
    /* Model width, expert FFN width and expert count of the layer. */
    uint64_t hidden_size;
    uint64_t intermediate_size;
    uint64_t expert_count;
    /* Written only on success. The host sets format_out->struct_size first; the provider fills
     * every field it knows and leaves the rest zero. */
    guild_cpu_expert_format_v1_t* format_out;
} guild_cpu_describe_format_args_v1_t;

/*
 * Arguments of quantize_planar_q2: convert row_count rows of row_elements elements from src_dtype
 * (F32, BF16, or Q2_K for a lossless repack) to canonical planar Q2.
 */
typedef struct guild_cpu_planar_q2_quantize_args_v1_t {
    /* sizeof(guild_cpu_planar_q2_quantize_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_BF16 or GUILD_DTYPE_Q2_K. */
    uint32_t src_dtype;
    /* Rows to convert. */
    uint64_t row_count;
    /* Elements per row: a multiple of GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS. */
    uint64_t row_elements;
    /* row_count source rows. */
    const void* src;
    /* Bytes between consecutive source rows. */
    uint64_t src_row_stride_bytes;
    /* Optional per-column importance weights (row_elements F32) that bias the quantization error;
     * NULL for uniform weighting. Ignored for a Q2_K source. */
    const float* importance;
    /* row_count planar Q2 rows of row_elements / 256 * 84 bytes. */
    void* dst;
    /* Bytes between consecutive destination rows. */
    uint64_t dst_row_stride_bytes;
} guild_cpu_planar_q2_quantize_args_v1_t;

/* Arguments of dequantize_planar_q2: expand canonical planar Q2 rows to F32 or BF16. */
typedef struct guild_cpu_planar_q2_dequantize_args_v1_t {
    /* sizeof(guild_cpu_planar_q2_dequantize_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16. */
    uint32_t dst_dtype;
    /* Rows to convert. */
    uint64_t row_count;
    /* Elements per row: a multiple of GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS. */
    uint64_t row_elements;
    /* row_count planar Q2 rows. */
    const void* src;
    /* Bytes between consecutive source rows. */
    uint64_t src_row_stride_bytes;
    /* row_count rows of row_elements elements of dst_dtype. */
    void* dst;
    /* Bytes between consecutive destination rows. */
    uint64_t dst_row_stride_bytes;
} guild_cpu_planar_q2_dequantize_args_v1_t;

/*
 * Arguments of q2_rows: native planar-Q2 matrix rows against canonical activation images. For
 * every token t < token_count and weight row r in [row_begin, row_end):
 *   y = dot(W[r], x[t]);  dst[t][r] = y, or dst[t][r] += y with ACCUMULATE
 * Columns of dst outside [row_begin, row_end) are not touched.
 */
typedef struct guild_cpu_q2_rows_args_v1_t {
    /* sizeof(guild_cpu_q2_rows_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CPU_Q2_ROWS_* bits. */
    uint32_t flags;
    /* Tokens in this call. */
    uint32_t token_count;
    /* Images per token: ceil(row_elements / GUILD_CPU_ACTIVATION_IMAGE_MAX_ELEMENTS). */
    uint32_t images_per_token;
    /* Elements per weight row and per activation row: a multiple of 256. */
    uint64_t row_elements;
    /* First weight row to compute, and one past the last. */
    uint64_t row_begin;
    uint64_t row_end;
    /* Planar Q2 weight rows; row r starts at weights + r * weight_row_stride_bytes. */
    const void* weights;
    /* Bytes between consecutive weight rows (>= row_elements / 256 * 84). */
    uint64_t weight_row_stride_bytes;
    /* token_count * images_per_token images, token-major, 64-byte aligned. */
    const guild_cpu_activation_image_v1_t* images;
    /* token_count F32 rows; columns [row_begin, row_end) are written. */
    float* dst;
    /* Bytes between consecutive rows of dst. */
    uint64_t dst_row_stride_bytes;
} guild_cpu_q2_rows_args_v1_t;

/*
 * Arguments of router_bf16: logits[t][e] = dot(input[t], router[e]) with a BF16 router matrix,
 * accumulated in F32; then, when top_k > 0, gating and top-k selection. Ties between equal
 * scores go to the lower expert index so that the selection is deterministic.
 */
typedef struct guild_cpu_router_args_v1_t {
    /* sizeof(guild_cpu_router_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16: the dtype of input. */
    uint32_t input_dtype;
    /* GUILD_CPU_ROUTER_GATING_*. */
    uint32_t gating;
    /* GUILD_CPU_ROUTER_* bits. */
    uint32_t flags;
    /* Tokens (rows of input). */
    uint32_t token_count;
    /* Experts (rows of the router matrix). */
    uint32_t expert_count;
    /* Experts selected per token; 0 computes logits only. */
    uint32_t top_k;
    /* Factor applied to every selected weight after normalisation; 1 for none. */
    float weight_scale;
    /* Elements per input row and per router row. */
    uint64_t hidden_size;
    /* token_count rows of hidden_size elements of input_dtype. */
    const void* input;
    /* Bytes between consecutive input rows. */
    uint64_t input_row_stride_bytes;
    /* expert_count rows of hidden_size BF16 values (raw 16-bit patterns). */
    const uint16_t* router_weights;
    /* Bytes between consecutive router rows. */
    uint64_t router_row_stride_bytes;
    /* Optional expert_count F32 biases added to the scores for selection only (the returned
     * weights do not include them); NULL for none. */
    const float* selection_bias;
    /* Optional token_count * expert_count F32 logits, rows packed; NULL when not wanted. */
    float* logits;
    /* token_count * top_k selected expert indices, rows packed, in descending score order.
     * Required when top_k > 0. */
    int32_t* expert_ids;
    /* token_count * top_k weights matching expert_ids. Required when top_k > 0. */
    float* expert_weights;
} guild_cpu_router_args_v1_t;

/*
 * Arguments of combine_ordered: for every token t,
 *   acc = 0; for k in 0 .. top_k-1: acc += weights[t][k] * expert_outputs[slots[t][k]]
 *   acc += shared_output[t] (when given);  dst[t] = acc, or dst[t] += acc with ACCUMULATE
 * summed in F32 in exactly that order, so the result does not depend on how the host scheduled
 * the experts or split the work across threads.
 */
typedef struct guild_cpu_combine_args_v1_t {
    /* sizeof(guild_cpu_combine_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CPU_COMBINE_* bits. */
    uint32_t flags;
    /* Tokens to combine. */
    uint32_t token_count;
    /* Expert slots per token. */
    uint32_t top_k;
    /* Elements per row. */
    uint64_t hidden_size;
    /* F32 expert output rows, indexed by slots. */
    const float* expert_outputs;
    /* Bytes between consecutive expert output rows. */
    uint64_t expert_output_row_stride_bytes;
    /* token_count * top_k row indices into expert_outputs; a negative index skips the slot. */
    const int32_t* slots;
    /* token_count * top_k weights, or NULL when the expert outputs are already weighted. */
    const float* weights;
    /* Optional token_count F32 rows (a shared expert's output) added after the routed experts. */
    const float* shared_output;
    /* Bytes between consecutive shared_output rows. */
    uint64_t shared_output_row_stride_bytes;
    /* token_count F32 rows of hidden_size elements. */
    float* dst;
    /* Bytes between consecutive rows of dst. */
    uint64_t dst_row_stride_bytes;
} guild_cpu_combine_args_v1_t;

/* The appended callback types. `user_data` is the table's user_data; `error` may be NULL. */
typedef guild_status_t (*guild_cpu_describe_format_fn)(void* user_data,
                                                       const guild_cpu_describe_format_args_v1_t* args,
                                                       guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_planar_q2_quantize_fn)(void* user_data,
                                                          const guild_cpu_planar_q2_quantize_args_v1_t* args,
                                                          guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_planar_q2_dequantize_fn)(void* user_data,
                                                            const guild_cpu_planar_q2_dequantize_args_v1_t* args,
                                                            guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_q2_rows_fn)(void* user_data, const guild_cpu_q2_rows_args_v1_t* args,
                                               guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_router_bf16_fn)(void* user_data, const guild_cpu_router_args_v1_t* args,
                                                   guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_combine_ordered_fn)(void* user_data, const guild_cpu_combine_args_v1_t* args,
                                                       guild_error_info_t* error);

/*
 * The CPU backend v2 table: the CPE1 prefix, then the appended callbacks. header.tag is
 * GUILD_CPU_BACKEND_TAG, header.version GUILD_CPU_BACKEND_EXT_VERSION and header.struct_size
 * sizeof(guild_cpu_backend_ext_v2_t). Each appended callback is optional: NULL means the plugin
 * does not offer that operation.
 */
typedef struct guild_cpu_backend_ext_v2_t {
    guild_ext_header_t header;
    /* The CPE1 prefix, unchanged. */
    guild_cpu_expert_quantize_activation_fn quantize_activation;
    guild_cpu_expert_quantize_hidden_fn quantize_hidden;
    guild_cpu_expert_gate_up_rows_fn gate_up_rows;
    guild_cpu_expert_down_rows_fn down_rows;
    void* user_data;
    /* Appended in v2. Describes the expert format the provider wants for a layer. */
    guild_cpu_describe_format_fn describe_format;
    /* Converts F32/BF16/Q2_K rows to canonical planar Q2. */
    guild_cpu_planar_q2_quantize_fn quantize_planar_q2;
    /* Expands canonical planar Q2 rows to F32/BF16. */
    guild_cpu_planar_q2_dequantize_fn dequantize_planar_q2;
    /* Native planar-Q2 rows against canonical activation images. */
    guild_cpu_q2_rows_fn q2_rows;
    /* BF16 router logits, gating and top-k. */
    guild_cpu_router_bf16_fn router_bf16;
    /* Deterministic weighted combine of expert outputs. */
    guild_cpu_combine_ordered_fn combine_ordered;
} guild_cpu_backend_ext_v2_t;

/* The v2 table starts with the unchanged CPE1 layout. */
GUILD_STATIC_ASSERT(offsetof(guild_cpu_backend_ext_v2_t, header) == offsetof(guild_cpu_expert_ext_v1_t, header),
                    "CPU backend v2 keeps the CPE1 header offset");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_backend_ext_v2_t, quantize_activation) ==
                        offsetof(guild_cpu_expert_ext_v1_t, quantize_activation),
                    "CPU backend v2 keeps the CPE1 quantize_activation offset");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_backend_ext_v2_t, quantize_hidden) ==
                        offsetof(guild_cpu_expert_ext_v1_t, quantize_hidden),
                    "CPU backend v2 keeps the CPE1 quantize_hidden offset");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_backend_ext_v2_t, gate_up_rows) ==
                        offsetof(guild_cpu_expert_ext_v1_t, gate_up_rows),
                    "CPU backend v2 keeps the CPE1 gate_up_rows offset");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_backend_ext_v2_t, down_rows) == offsetof(guild_cpu_expert_ext_v1_t, down_rows),
                    "CPU backend v2 keeps the CPE1 down_rows offset");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_backend_ext_v2_t, user_data) == offsetof(guild_cpu_expert_ext_v1_t, user_data),
                    "CPU backend v2 keeps the CPE1 user_data offset");
GUILD_STATIC_ASSERT(offsetof(guild_cpu_backend_ext_v2_t, describe_format) == sizeof(guild_cpu_expert_ext_v1_t),
                    "CPU backend v2 appends right after the CPE1 prefix");

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_CPU_BACKEND_ABI_H */
