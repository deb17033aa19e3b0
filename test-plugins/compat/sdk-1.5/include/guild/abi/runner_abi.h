/*
 * Guild RMD1: the optional model-description extension of a runner descriptor.
 *
 * A runner attaches guild_runner_model_ext_v1_t to guild_runner_desc_v1_t.next_ext. The host opens
 * a model file, hands enabled runners a read-only view of it (guild_model_reader_v1_t) in priority
 * order, and the first runner that recognises the model describes it into a fixed-width record
 * (guild_runner_model_v1_t) that the host copies. Nothing here is consulted per token.
 *
 * C99 and C++17 clean; conventions in abi-headers/README.md.
 */
#ifndef GUILD_ABI_RUNNER_ABI_H
#define GUILD_ABI_RUNNER_ABI_H

#include "guild/abi/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RMD1 tag and layout version. */
#define GUILD_RMD1_TAG GUILD_MAKE_TAG('R', 'M', 'D', '1')
#define GUILD_RMD1_VERSION 1u

/* Versions of the host-built reader table and of the description record. */
#define GUILD_MODEL_READER_VERSION 1u
#define GUILD_RUNNER_MODEL_VERSION 1u

/* ------------------------------------------------------------------------------------------ */
/* Model reader                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Metadata value types, numbered as GGUF numbers them. */
#define GUILD_META_TYPE_UINT8 0u
#define GUILD_META_TYPE_INT8 1u
#define GUILD_META_TYPE_UINT16 2u
#define GUILD_META_TYPE_INT16 3u
#define GUILD_META_TYPE_UINT32 4u
#define GUILD_META_TYPE_INT32 5u
#define GUILD_META_TYPE_FLOAT32 6u
#define GUILD_META_TYPE_BOOL 7u
#define GUILD_META_TYPE_STRING 8u
#define GUILD_META_TYPE_ARRAY 9u
#define GUILD_META_TYPE_UINT64 10u
#define GUILD_META_TYPE_INT64 11u
#define GUILD_META_TYPE_FLOAT64 12u

/*
 * Shape and type of one tensor in the model file. Filled by the reader into a record whose
 * struct_size the caller set.
 */
typedef struct guild_model_tensor_info_v1_t {
    /* sizeof(guild_model_tensor_info_v1_t), set by the caller. */
    uint32_t struct_size;
    /* GUILD_DTYPE_* of the stored tensor. */
    uint32_t dtype;
    /* Number of axes, 1..GUILD_MAX_TENSOR_RANK. */
    uint32_t rank;
    /* Must be zero. */
    uint32_t reserved;
    /* Extent of each axis in elements, dims[0] innermost (the GGUF ne[] order); 0 above rank. */
    uint64_t dims[GUILD_MAX_TENSOR_RANK];
    /* Stored size in bytes. */
    uint64_t size_bytes;
    /* The tensor's name, borrowed from the reader for as long as the reader is valid. */
    const char* name;
} guild_model_tensor_info_v1_t;

/*
 * A read-only view of one opened model, built by the host. It and every string it returns are
 * valid only during the callback that received it; the host keeps the files and payloads, so
 * runners copy what they need and never keep the reader.
 *
 * Every getter returns OK and writes its outputs, or leaves them untouched and returns
 * ERR_NOT_FOUND (no such key or tensor), ERR_UNSUPPORTED (the value has another type or does not
 * fit the output type) or ERR_INVALID_ARGUMENT (a NULL pointer, an index out of range).
 */
typedef struct guild_model_reader_v1_t {
    /* sizeof(guild_model_reader_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_MODEL_READER_VERSION. */
    uint32_t version;
    /* The host's reader state; pass it to every callback. */
    void* ctx;
    /* Writes the GUILD_META_TYPE_* of `key`. */
    guild_status_t (*find_key)(void* ctx, const char* key, uint32_t* out_type);
    /* Reads an integer or bool value as int64_t (or uint64_t), converting when it fits. */
    guild_status_t (*get_int)(void* ctx, const char* key, int64_t* out_value);
    guild_status_t (*get_uint)(void* ctx, const char* key, uint64_t* out_value);
    /* Reads a FLOAT32 or FLOAT64 value. */
    guild_status_t (*get_float)(void* ctx, const char* key, double* out_value);
    /*
     * Copies a string value and a NUL into buffer[0..buffer_size) and writes its length (without
     * the NUL) to *out_length. When the buffer is too small it returns ERR_BUFFER_TOO_SMALL,
     * writes the needed length to *out_length and nothing to the buffer: the one output written
     * on a failure, so that the caller can retry with a large enough buffer.
     */
    guild_status_t (*get_string)(void* ctx, const char* key, char* buffer, size_t buffer_size, size_t* out_length);
    /* Writes the GUILD_META_TYPE_* of an array's elements and its element count. */
    guild_status_t (*get_array_info)(void* ctx, const char* key, uint32_t* out_element_type, uint64_t* out_length);
    /* Copies `count` integer (bool) elements starting at index `first`, converting each. */
    guild_status_t (*get_array_ints)(void* ctx, const char* key, uint64_t first, int64_t* out_values, size_t count);
    guild_status_t (*get_array_uints)(void* ctx, const char* key, uint64_t first, uint64_t* out_values, size_t count);
    /* Copies `count` float elements starting at index `first`. */
    guild_status_t (*get_array_floats)(void* ctx, const char* key, uint64_t first, double* out_values, size_t count);
    /* Copies string element `index`, with get_string's buffer rules. */
    guild_status_t (*get_array_string)(void* ctx, const char* key, uint64_t index, char* buffer, size_t buffer_size,
                                       size_t* out_length);
    /* Writes the number of tensors in the model. */
    guild_status_t (*tensor_count)(void* ctx, uint64_t* out_count);
    /* Looks a tensor up by name. */
    guild_status_t (*find_tensor)(void* ctx, const char* name, guild_model_tensor_info_v1_t* out_info);
    /* Looks a tensor up by position, 0..tensor_count-1, in file order. */
    guild_status_t (*tensor_at)(void* ctx, uint64_t index, guild_model_tensor_info_v1_t* out_info);
} guild_model_reader_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* Model description                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Capacity of guild_runner_model_v1_t.architecture, including the terminating NUL. */
#define GUILD_RUNNER_ARCH_CAPACITY 64

/* Rotary embedding variants. */
#define GUILD_ROPE_TYPE_NONE 0u
/* Rotates adjacent pairs (x[2i], x[2i+1]). */
#define GUILD_ROPE_TYPE_NORMAL 1u
/* Rotates the two halves (x[i], x[i + n/2]). */
#define GUILD_ROPE_TYPE_NEOX 2u
/* Multi-section rotary embedding over several position streams. */
#define GUILD_ROPE_TYPE_MROPE 3u

/* Rotary frequency scaling. */
#define GUILD_ROPE_SCALING_NONE 0u
#define GUILD_ROPE_SCALING_LINEAR 1u
#define GUILD_ROPE_SCALING_YARN 2u
#define GUILD_ROPE_SCALING_LONGROPE 3u

/* How the runner wants a prompt fed through the layers. */
/* One token at a time through every layer. */
#define GUILD_PREFILL_TOKEN_BY_TOKEN 0u
/* The whole prompt through each layer in one batch. */
#define GUILD_PREFILL_BATCHED 1u
/* Chunks of prefill_chunk_tokens tokens, recurrent state carried between chunks. */
#define GUILD_PREFILL_CHUNKED 2u

/* Canonical tensor roles (guild_tensor_role_v1_t.role). */
#define GUILD_TENSOR_ROLE_UNKNOWN 0u
#define GUILD_TENSOR_ROLE_TOKEN_EMBD 1u
#define GUILD_TENSOR_ROLE_OUTPUT_NORM 2u
#define GUILD_TENSOR_ROLE_OUTPUT 3u
#define GUILD_TENSOR_ROLE_ATTN_NORM 4u
#define GUILD_TENSOR_ROLE_ATTN_Q 5u
#define GUILD_TENSOR_ROLE_ATTN_K 6u
#define GUILD_TENSOR_ROLE_ATTN_V 7u
#define GUILD_TENSOR_ROLE_ATTN_QKV 8u
#define GUILD_TENSOR_ROLE_ATTN_OUTPUT 9u
#define GUILD_TENSOR_ROLE_ATTN_Q_NORM 10u
#define GUILD_TENSOR_ROLE_ATTN_K_NORM 11u
#define GUILD_TENSOR_ROLE_ATTN_GATE 12u
#define GUILD_TENSOR_ROLE_POST_ATTN_NORM 13u
#define GUILD_TENSOR_ROLE_FFN_NORM 14u
#define GUILD_TENSOR_ROLE_FFN_GATE 15u
#define GUILD_TENSOR_ROLE_FFN_UP 16u
#define GUILD_TENSOR_ROLE_FFN_DOWN 17u
#define GUILD_TENSOR_ROLE_FFN_ROUTER 18u
#define GUILD_TENSOR_ROLE_FFN_GATE_EXPS 19u
#define GUILD_TENSOR_ROLE_FFN_UP_EXPS 20u
#define GUILD_TENSOR_ROLE_FFN_DOWN_EXPS 21u
#define GUILD_TENSOR_ROLE_FFN_GATE_SHEXP 22u
#define GUILD_TENSOR_ROLE_FFN_UP_SHEXP 23u
#define GUILD_TENSOR_ROLE_FFN_DOWN_SHEXP 24u
#define GUILD_TENSOR_ROLE_FFN_ROUTER_SHEXP 25u
#define GUILD_TENSOR_ROLE_SSM_IN 26u
#define GUILD_TENSOR_ROLE_SSM_CONV1D 27u
#define GUILD_TENSOR_ROLE_SSM_A 28u
#define GUILD_TENSOR_ROLE_SSM_DT_BIAS 29u
#define GUILD_TENSOR_ROLE_SSM_BETA_ALPHA 30u
#define GUILD_TENSOR_ROLE_SSM_NORM 31u
#define GUILD_TENSOR_ROLE_SSM_OUT 32u
#define GUILD_TENSOR_ROLE_PLE_TOKEN_EMBD 33u
#define GUILD_TENSOR_ROLE_PLE_MODEL_PROJ 34u
#define GUILD_TENSOR_ROLE_PLE_PROJ_NORM 35u
#define GUILD_TENSOR_ROLE_ROPE_FREQS 36u

/* guild_tensor_role_v1_t.flags: the model may lack this tensor. */
#define GUILD_TENSOR_ROLE_FLAG_OPTIONAL (1u << 0)

/* Maps one canonical role (per layer or global) to the tensor's name in the model file. */
typedef struct guild_tensor_role_v1_t {
    /* GUILD_TENSOR_ROLE_*. */
    uint32_t role;
    /* Layer index, or -1 for a tensor outside the layers. */
    int32_t layer;
    /* The tensor's name in the model file. */
    const char* name;
    /* GUILD_TENSOR_ROLE_FLAG_* bits. */
    uint32_t flags;
    /* Must be zero. */
    uint32_t reserved;
} guild_tensor_role_v1_t;

/*
 * A model as a runner describes it. The host sets struct_size and version, zeroes the rest and
 * passes it to describe; the runner fills it; the host copies it, including the role records,
 * before it calls the extension again. Counts are in elements, 0 where a feature is absent.
 */
typedef struct guild_runner_model_v1_t {
    /* sizeof(guild_runner_model_v1_t), set by the host. */
    uint32_t struct_size;
    /* GUILD_RUNNER_MODEL_VERSION, set by the host. */
    uint32_t version;
    /* Architecture name (GGUF general.architecture), NUL-terminated. */
    char architecture[GUILD_RUNNER_ARCH_CAPACITY];
    /* Transformer blocks. */
    uint32_t n_layers;
    /* Hidden (model) dimension. */
    uint32_t n_embd;
    /* Dense feed-forward dimension; 0 for all-MoE models. */
    uint32_t n_ff;
    /* Attention query heads and key/value heads. */
    uint32_t n_heads;
    uint32_t n_kv_heads;
    /* Per-head key/query and value dimensions. */
    uint32_t head_dim;
    uint32_t head_dim_v;
    /* Vocabulary size. */
    uint32_t vocab_size;
    /* Context length the model was trained for, in tokens. */
    uint32_t context_length;
    /* Epsilon of the RMS/layer norms. */
    float norm_eps;
    /* Recurrent geometry: convolution width, state size per head, key-head groups, value heads
     * and total inner (value) size. All 0 for models without recurrent layers. */
    uint32_t ssm_conv_kernel;
    uint32_t ssm_state_size;
    uint32_t ssm_group_count;
    uint32_t ssm_time_step_rank;
    uint32_t ssm_inner_size;
    /* Layer i uses full attention when (i + 1) % interval == 0 and is recurrent otherwise;
     * 0 = every layer uses full attention. */
    uint32_t full_attention_interval;
    /* Mixture of experts: experts per layer, experts used per token, expert and shared-expert
     * feed-forward dimensions. 0 for dense models. */
    uint32_t n_experts;
    uint32_t n_experts_used;
    uint32_t expert_ffn;
    uint32_t shared_expert_ffn;
    /* Rotary embedding: GUILD_ROPE_TYPE_*, rotated dimensions per head, GUILD_ROPE_SCALING_*,
     * base frequency, frequency scale and the original context length scaling refers to. */
    uint32_t rope_type;
    uint32_t rope_dims;
    uint32_t rope_scaling_type;
    float rope_freq_base;
    float rope_freq_scale;
    uint32_t rope_orig_context;
    /* Per-layer embeddings: 1 when the model needs them, and their dimension. */
    uint32_t ple_required;
    uint32_t ple_dim;
    /* GUILD_PREFILL_* and, for GUILD_PREFILL_CHUNKED, the chunk size in tokens. */
    uint32_t prefill_strategy;
    uint32_t prefill_chunk_tokens;
    /* Canonical tensor roles; owned by the runner and valid until the extension is called again
     * or the plugin shuts down, whichever is first. */
    const guild_tensor_role_v1_t* tensor_roles;
    size_t tensor_role_count;
} guild_runner_model_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* RMD1                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/*
 * The model-description extension. The host copies it at register_runner, so it may live on
 * init's stack. Every callback receives user_data and a reader valid for the call only; none may
 * keep either pointer.
 */
typedef struct guild_runner_model_ext_v1_t {
    /* struct_size, GUILD_RMD1_TAG, GUILD_RMD1_VERSION. */
    guild_ext_header_t header;
    /* Selection priority among runners that recognise the same model, higher first; it takes the
     * place of the runner descriptor's priority for model selection. */
    int32_t priority;
    /* Must be zero. */
    uint32_t reserved;
    /* OK when this runner handles the model, ERR_UNSUPPORTED (with a reason) when not; any other
     * status is a failure. */
    guild_status_t (*recognize)(void* user_data, const guild_model_reader_v1_t* model, guild_error_info_t* error);
    /* Fills *out_model for a recognised model. */
    guild_status_t (*describe)(void* user_data, const guild_model_reader_v1_t* model,
                               guild_runner_model_v1_t* out_model, guild_error_info_t* error);
    /* Checks that the description and the file's tensors are numerically usable (dtypes,
     * divisibility, value ranges); OK or ERR_UNSUPPORTED with a reason. */
    guild_status_t (*validate_numerics)(void* user_data, const guild_model_reader_v1_t* model,
                                        const guild_runner_model_v1_t* description, guild_error_info_t* error);
    /* Passed to every callback; owned by the plugin. */
    void* user_data;
} guild_runner_model_ext_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_RUNNER_ABI_H */
