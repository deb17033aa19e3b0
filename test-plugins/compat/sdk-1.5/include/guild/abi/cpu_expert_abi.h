/*
 * CPE1 (Guild Kernel ABI v1 / SDK 1.5): native CPU arithmetic for batched mixture-of-experts
 * layers.
 *
 * A CPU kernel descriptor with op_kind GUILD_OP_BATCHED_EXPERT_EXEC may attach a
 * guild_cpu_expert_ext_v1_t to its next_ext chain. The table offers four synchronous building
 * blocks that the host's expert worker pool calls: quantize the routed activations, compute a
 * slice of gate/up rows with the gated activation applied, quantize the resulting hidden rows, and
 * compute a slice of down rows. The host keeps scheduling, threading and memory: it decides which
 * tokens go to which expert, splits rows across its workers and owns every buffer. The plugin only
 * does arithmetic on what it is handed.
 *
 * Lifetime. The host copies the table (not the pointed-to code) at model load and binds it once,
 * together with a lease on the package, so the code stays loaded while a model uses it. The plugin
 * may build the table on init's stack. Every pointer inside an args struct is borrowed for the
 * duration of that one call: the plugin must not keep it, free it or write outside the ranges the
 * args describe.
 *
 * Threads. The host calls the callbacks from several worker threads at once, with the same
 * user_data, on disjoint output ranges. A callback must therefore be reentrant and must not keep
 * per-call state in user_data without its own synchronisation. No callback may start threads,
 * block on other workers or call back into the host.
 *
 * Errors. Every callback returns GUILD_STATUS_OK or a negative GUILD_STATUS_ERR_* and, on failure,
 * fills *error when it is non-NULL. Outputs are undefined after a failure; the host discards them.
 *
 * Registering a descriptor that carries this table is not a promise that the host will execute
 * it: the host validates the table, may prefer another provider, and may decline a format it
 * cannot schedule.
 *
 * The extended CPU backend table (cpu_backend_abi.h) starts with this exact layout and appends
 * further callbacks.
 */
#ifndef GUILD_ABI_CPU_EXPERT_ABI_H
#define GUILD_ABI_CPU_EXPERT_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "guild/abi/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "CPE1": the extension tag, and the layout version of guild_cpu_expert_ext_v1_t. */
#define GUILD_CPU_EXPERT_TAG GUILD_MAKE_TAG('C', 'P', 'E', '1')
#define GUILD_CPU_EXPERT_EXT_VERSION 1u

/*
 * How an expert's weight rows are stored (guild_cpu_expert_format_v1_t.weight_layout).
 * GGUF: each row is a run of GGML blocks of the row's dtype, exactly as a GGUF file stores it.
 * PLANAR_Q2: the canonical planar 2-bit layout described in cpu_backend_abi.h.
 * NATIVE: a provider-specific repacking; the format's offsets and strides still describe where
 * each matrix and row starts, so the host can slice rows without knowing the encoding.
 */
#define GUILD_CPU_EXPERT_WEIGHTS_GGUF 0u
#define GUILD_CPU_EXPERT_WEIGHTS_PLANAR_Q2 1u
#define GUILD_CPU_EXPERT_WEIGHTS_NATIVE 2u

/*
 * Where the per-block scales of a quantized matrix live (guild_cpu_expert_format_v1_t.scale_layout).
 * IN_BLOCK: inside every block, as GGML stores them; the *_scales_offset_bytes fields are zero.
 * PLANAR: in a separate plane per matrix, at *_scales_offset_bytes within the expert image, one
 * scale row per weight row, scale_row_stride_bytes apart.
 */
#define GUILD_CPU_EXPERT_SCALES_IN_BLOCK 0u
#define GUILD_CPU_EXPERT_SCALES_PLANAR 1u

/*
 * How quantized activation rows are laid out (guild_cpu_expert_format_v1_t.activation_layout).
 * ROWS: each token is a run of blocks of activation_dtype, activation_row_bytes long.
 * IMAGE: each token is a sequence of canonical activation images (guild_cpu_activation_image_v1_t
 * in cpu_backend_abi.h), activation_row_bytes in total.
 */
#define GUILD_CPU_EXPERT_ACTIVATION_ROWS 0u
#define GUILD_CPU_EXPERT_ACTIVATION_IMAGE 1u

/*
 * The gated activation gate_up_rows applies (guild_cpu_expert_gate_up_args_v1_t.glu):
 * SWIGLU: hidden = silu(gate) * up; GEGLU: hidden = gelu(gate) * up (tanh approximation).
 */
#define GUILD_CPU_EXPERT_GLU_SWIGLU 1u
#define GUILD_CPU_EXPERT_GLU_GEGLU 2u

/* guild_cpu_expert_down_args_v1_t.flags: add the result to dst instead of overwriting it. */
#define GUILD_CPU_EXPERT_DOWN_ACCUMULATE (1u << 0)

/*
 * The storage format of one model's expert weights and of the quantized activations that feed
 * them. Plain numbers only: dtypes, block geometry, byte offsets and strides. It holds no pointer
 * and no provider state, so the host can copy, compare and persist it.
 *
 * Every expert is one contiguous "expert image" of expert_stride_bytes. Within it, the gate, up
 * and down matrices start at their *_offset_bytes; row r of the gate matrix starts at
 * gate_offset_bytes + r * gate_up_row_stride_bytes, and likewise for up and down. Gate and up have
 * intermediate_size rows of hidden_size elements; down has hidden_size rows of intermediate_size
 * elements. All offsets and strides are multiples of `alignment`.
 *
 * The host fills it from the model's tensor types (or asks the provider through describe_format in
 * cpu_backend_abi.h) and passes it by pointer to every call; it is read during the call only.
 */
typedef struct guild_cpu_expert_format_v1_t {
    /* sizeof(guild_cpu_expert_format_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* GUILD_CPU_EXPERT_WEIGHTS_*. */
    uint32_t weight_layout;
    /* GUILD_CPU_EXPERT_SCALES_*. */
    uint32_t scale_layout;
    /* GUILD_CPU_EXPERT_ACTIVATION_*. */
    uint32_t activation_layout;
    /* GUILD_DTYPE_* of the gate and up matrices. */
    uint32_t gate_up_dtype;
    /* GUILD_DTYPE_* of the down matrix. */
    uint32_t down_dtype;
    /* GUILD_DTYPE_* that quantize_activation writes and gate_up_rows reads (e.g. Q8_K for K types). */
    uint32_t activation_dtype;
    /* GUILD_DTYPE_* that quantize_hidden writes and down_rows reads. */
    uint32_t hidden_dtype;
    /* Elements and bytes per block of gate_up_dtype (1 and the element size for plain types). */
    uint32_t gate_up_block_elements;
    uint32_t gate_up_block_bytes;
    /* Elements and bytes per block of down_dtype. */
    uint32_t down_block_elements;
    uint32_t down_block_bytes;
    /* Elements and bytes per block of activation_dtype. */
    uint32_t activation_block_elements;
    uint32_t activation_block_bytes;
    /* Elements and bytes per block of hidden_dtype. */
    uint32_t hidden_block_elements;
    uint32_t hidden_block_bytes;
    /* Alignment in bytes (a power of two, at least 16) of expert images, matrices, rows and of the
     * activation and hidden buffers the host passes in. */
    uint32_t alignment;
    /* Must be zero. */
    uint32_t reserved;
    /* Model width: elements per gate/up row, rows of the down matrix. */
    uint64_t hidden_size;
    /* Expert FFN width: rows of gate and up, elements per down row. */
    uint64_t intermediate_size;
    /* Experts in the layer. */
    uint64_t expert_count;
    /* Bytes from one expert image to the next. */
    uint64_t expert_stride_bytes;
    /* Byte offsets of the gate, up and down matrices within an expert image. */
    uint64_t gate_offset_bytes;
    uint64_t up_offset_bytes;
    uint64_t down_offset_bytes;
    /* Bytes between consecutive rows of the gate and up matrices. */
    uint64_t gate_up_row_stride_bytes;
    /* Bytes between consecutive rows of the down matrix. */
    uint64_t down_row_stride_bytes;
    /* GUILD_CPU_EXPERT_SCALES_PLANAR only (zero otherwise): byte offsets of the scale planes of
     * gate, up and down within an expert image. */
    uint64_t gate_scales_offset_bytes;
    uint64_t up_scales_offset_bytes;
    uint64_t down_scales_offset_bytes;
    /* GUILD_CPU_EXPERT_SCALES_PLANAR only: bytes between the scale rows of consecutive gate/up
     * rows, and of consecutive down rows. */
    uint64_t gate_up_scale_row_stride_bytes;
    uint64_t down_scale_row_stride_bytes;
    /* Bytes of one quantized activation row (hidden_size elements of activation_dtype). */
    uint64_t activation_row_bytes;
    /* Bytes of one quantized hidden row (intermediate_size elements of hidden_dtype). */
    uint64_t hidden_row_bytes;
    /* Scratch bytes a single gate_up_rows or down_rows call needs; 0 when none. The host hands
     * each worker at least this much through the args' scratch pointer. */
    uint64_t scratch_bytes;
} guild_cpu_expert_format_v1_t;

/*
 * Arguments of quantize_activation: quantize row_count token rows of hidden_size elements into
 * format->activation_dtype (laid out as format->activation_layout says).
 */
typedef struct guild_cpu_expert_quantize_activation_args_v1_t {
    /* sizeof(guild_cpu_expert_quantize_activation_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16: the dtype of src. */
    uint32_t src_dtype;
    /* Token rows to quantize. */
    uint64_t row_count;
    /* The expert format of the layer; read during the call only. */
    const guild_cpu_expert_format_v1_t* format;
    /* row_count rows of format->hidden_size elements of src_dtype. */
    const void* src;
    /* Bytes between consecutive rows of src. */
    uint64_t src_row_stride_bytes;
    /* row_count rows of format->activation_row_bytes, aligned to format->alignment. */
    void* dst;
    /* Bytes between consecutive rows of dst (>= format->activation_row_bytes). */
    uint64_t dst_row_stride_bytes;
} guild_cpu_expert_quantize_activation_args_v1_t;

/*
 * Arguments of quantize_hidden: quantize row_count hidden rows of intermediate_size elements (the
 * gate_up_rows output) into format->hidden_dtype for down_rows.
 */
typedef struct guild_cpu_expert_quantize_hidden_args_v1_t {
    /* sizeof(guild_cpu_expert_quantize_hidden_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16: the dtype of src. */
    uint32_t src_dtype;
    /* Token rows to quantize. */
    uint64_t row_count;
    /* The expert format of the layer; read during the call only. */
    const guild_cpu_expert_format_v1_t* format;
    /* row_count rows of format->intermediate_size elements of src_dtype. */
    const void* src;
    /* Bytes between consecutive rows of src. */
    uint64_t src_row_stride_bytes;
    /* row_count rows of format->hidden_row_bytes, aligned to format->alignment. */
    void* dst;
    /* Bytes between consecutive rows of dst (>= format->hidden_row_bytes). */
    uint64_t dst_row_stride_bytes;
} guild_cpu_expert_quantize_hidden_args_v1_t;

/*
 * Arguments of gate_up_rows: for every token t < token_count and every intermediate row r in
 * [row_begin, row_end) of expert `expert_index`,
 *   hidden[t][r] = act(dot(gate[r], x[t])) * dot(up[r], x[t])
 * where x[t] is the token's quantized activation row and act is chosen by `glu`. Columns of
 * `hidden` outside [row_begin, row_end) are not touched, so workers can fill disjoint slices of
 * the same rows concurrently.
 */
typedef struct guild_cpu_expert_gate_up_args_v1_t {
    /* sizeof(guild_cpu_expert_gate_up_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CPU_EXPERT_GLU_*. */
    uint32_t glu;
    /* Which expert of the layer (< format->expert_count); used for checks and diagnostics. */
    uint32_t expert_index;
    /* Tokens routed to this expert in this call. */
    uint32_t token_count;
    /* First intermediate row to compute, and one past the last (<= format->intermediate_size). */
    uint64_t row_begin;
    uint64_t row_end;
    /* The expert format of the layer; read during the call only. */
    const guild_cpu_expert_format_v1_t* format;
    /* Start of this expert's image, aligned to format->alignment. */
    const void* expert_image;
    /* token_count quantized activation rows written by quantize_activation. */
    const void* activations;
    /* Bytes between consecutive activation rows. */
    uint64_t activation_row_stride_bytes;
    /* token_count F32 rows of format->intermediate_size elements; columns [row_begin, row_end)
     * are written. */
    float* hidden;
    /* Bytes between consecutive rows of hidden. */
    uint64_t hidden_row_stride_bytes;
    /* Per-call scratch of at least format->scratch_bytes bytes, aligned to format->alignment;
     * NULL when format->scratch_bytes is 0. Contents are undefined on entry. */
    void* scratch;
    /* Bytes available at scratch. */
    uint64_t scratch_bytes;
} guild_cpu_expert_gate_up_args_v1_t;

/*
 * Arguments of down_rows: for every token t < token_count and every output row r in
 * [row_begin, row_end) of expert `expert_index`,
 *   y = w[t] * dot(down[r], h[t]);  dst[t][r] = y, or dst[t][r] += y with ACCUMULATE
 * where h[t] is the token's quantized hidden row and w[t] its router weight (1 when token_weights
 * is NULL). Columns outside [row_begin, row_end) are not touched.
 */
typedef struct guild_cpu_expert_down_args_v1_t {
    /* sizeof(guild_cpu_expert_down_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CPU_EXPERT_DOWN_* bits. */
    uint32_t flags;
    /* Which expert of the layer (< format->expert_count). */
    uint32_t expert_index;
    /* Tokens routed to this expert in this call. */
    uint32_t token_count;
    /* First output row to compute, and one past the last (<= format->hidden_size). */
    uint64_t row_begin;
    uint64_t row_end;
    /* The expert format of the layer; read during the call only. */
    const guild_cpu_expert_format_v1_t* format;
    /* Start of this expert's image, aligned to format->alignment. */
    const void* expert_image;
    /* token_count quantized hidden rows written by quantize_hidden. */
    const void* hidden;
    /* Bytes between consecutive hidden rows. */
    uint64_t hidden_row_stride_bytes;
    /* token_count router weights, or NULL to use 1 for every token. */
    const float* token_weights;
    /* token_count F32 rows of format->hidden_size elements; columns [row_begin, row_end) are
     * written (or accumulated into). */
    float* dst;
    /* Bytes between consecutive rows of dst. */
    uint64_t dst_row_stride_bytes;
    /* Per-call scratch of at least format->scratch_bytes bytes; NULL when that is 0. */
    void* scratch;
    /* Bytes available at scratch. */
    uint64_t scratch_bytes;
} guild_cpu_expert_down_args_v1_t;

/* The four callback types. `user_data` is the table's user_data; `error` may be NULL. */
typedef guild_status_t (*guild_cpu_expert_quantize_activation_fn)(
    void* user_data, const guild_cpu_expert_quantize_activation_args_v1_t* args, guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_expert_quantize_hidden_fn)(
    void* user_data, const guild_cpu_expert_quantize_hidden_args_v1_t* args, guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_expert_gate_up_rows_fn)(void* user_data,
                                                           const guild_cpu_expert_gate_up_args_v1_t* args,
                                                           guild_error_info_t* error);
typedef guild_status_t (*guild_cpu_expert_down_rows_fn)(void* user_data, const guild_cpu_expert_down_args_v1_t* args,
                                                        guild_error_info_t* error);

/*
 * The CPE1 table. header.struct_size is sizeof(guild_cpu_expert_ext_v1_t), header.tag
 * GUILD_CPU_EXPERT_TAG and header.version GUILD_CPU_EXPERT_EXT_VERSION. All four callbacks are
 * required; a table with a NULL callback is rejected at registration.
 */
typedef struct guild_cpu_expert_ext_v1_t {
    guild_ext_header_t header;
    /* Quantizes routed activations for gate_up_rows. */
    guild_cpu_expert_quantize_activation_fn quantize_activation;
    /* Quantizes gated hidden rows for down_rows. */
    guild_cpu_expert_quantize_hidden_fn quantize_hidden;
    /* Computes a slice of gate/up rows with the gated activation applied. */
    guild_cpu_expert_gate_up_rows_fn gate_up_rows;
    /* Computes a slice of down rows, weighted by the router. */
    guild_cpu_expert_down_rows_fn down_rows;
    /* Passed back as the first argument of every callback; owned by the plugin and valid until
     * its shutdown returns. */
    void* user_data;
} guild_cpu_expert_ext_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_CPU_EXPERT_ABI_H */
