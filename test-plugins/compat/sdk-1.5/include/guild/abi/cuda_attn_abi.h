/*
 * CDA1 (Guild Kernel ABI v1 / SDK 1.5, introduced with SDK 1.4): CUDA attention, recurrent
 * gated delta-net (GDN), RoPE, KV cache and query-sparse attention (QSA) selection.
 *
 * A CUDA kernel descriptor may attach a guild_cuda_attn_ext_v1_t to its next_ext chain. The
 * shapes, buffer pools, KV layouts and RoPE scaling that these kernels need are public C
 * descriptors declared below (they replace the private C++ records QsaShapes, GdnShapes,
 * QsaAttnPools, KvHostPools, KvStreamMap, QsaIndexerBuffers and RopeScaling), and settings that
 * used to be process-global switches are passed through the table's configure callback, so two
 * models in one process can configure their tables differently.
 *
 * Streams and buffers. Every execution callback enqueues its work on args->stream (an opaque
 * cudaStream_t) on device args->device_id, which the caller has already made current, and returns
 * without waiting. Device buffers are allocated and owned by the caller and must stay valid until
 * the enqueued work completes; descriptors and host arrays reached from an args struct are read
 * during the call only, unless a field says otherwise. Callbacks do not allocate device memory,
 * create or synchronise streams, or synchronise the device; scratch comes from caller-owned pools
 * whose sizes query_pools reports. With GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE the execution
 * callbacks may be recorded into a CUDA graph (kv_stream only when its host pools are pinned).
 *
 * Threads and errors. Execution callbacks may be called from any host thread and concurrently for
 * different streams. configure must not run concurrently with any other callback of the same
 * table. A status describes validation and launch only; on failure *error is filled when non-NULL
 * and no work was enqueued.
 *
 * Registering a descriptor that carries this table is not a promise that the host will execute
 * it: the host validates the table, checks the model's needs against the capability bits and may
 * choose another provider.
 */
#ifndef GUILD_ABI_CUDA_ATTN_ABI_H
#define GUILD_ABI_CUDA_ATTN_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "guild/abi/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "CDA1": the extension tag, and the layout version of guild_cuda_attn_ext_v1_t. */
#define GUILD_CUDA_ATTN_TAG GUILD_MAKE_TAG('C', 'D', 'A', '1')
#define GUILD_CUDA_ATTN_EXT_VERSION 1u

/* guild_cuda_attn_ext_v1_t.capabilities bits. */
/* Execution callbacks may be recorded into a CUDA graph. */
#define GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE (1u << 0)
/* attention accepts a QSA selection (args->selected). */
#define GUILD_CUDA_ATTN_CAP_QSA (1u << 1)
/* attention honours shapes->sliding_window. */
#define GUILD_CUDA_ATTN_CAP_SLIDING_WINDOW (1u << 2)
/* attention accepts per-head sink logits. */
#define GUILD_CUDA_ATTN_CAP_SINKS (1u << 3)
/* gdn_update implements chunked prefill (shapes->chunk_size > 0). */
#define GUILD_CUDA_ATTN_CAP_GDN_CHUNKED (1u << 4)

/* Operations named in a pool query (guild_cuda_attn_pool_query_args_v1_t.operation). */
#define GUILD_CUDA_ATTN_OP_ATTENTION 1u
#define GUILD_CUDA_ATTN_OP_GDN_UPDATE 2u
#define GUILD_CUDA_ATTN_OP_QSA_SELECT 3u

/*
 * Which keys a query may attend to (guild_cuda_attn_args_v1_t.mask_kind).
 * NONE: every cached position below seq_lens[s]. CAUSAL: positions <= the query's own position
 * (and within sliding_window when it is non-zero). EXPLICIT: CAUSAL plus an additive F16 mask.
 */
#define GUILD_CUDA_ATTN_MASK_NONE 0u
#define GUILD_CUDA_ATTN_MASK_CAUSAL 1u
#define GUILD_CUDA_ATTN_MASK_EXPLICIT 2u

/* guild_cuda_gdn_args_v1_t.flags. */
/* L2-normalise every q and k head vector before use. */
#define GUILD_CUDA_GDN_L2NORM_QK (1u << 0)
/* Start every sequence from a zero state instead of reading it. */
#define GUILD_CUDA_GDN_RESET_STATE (1u << 1)

/* RoPE frequency scaling (guild_cuda_rope_scaling_v1_t.scaling_type). */
#define GUILD_CUDA_ROPE_SCALING_NONE 0u
#define GUILD_CUDA_ROPE_SCALING_LINEAR 1u
#define GUILD_CUDA_ROPE_SCALING_YARN 2u
#define GUILD_CUDA_ROPE_SCALING_LONGROPE 3u
#define GUILD_CUDA_ROPE_SCALING_LLAMA3 4u

/*
 * Which element pairs RoPE rotates (guild_cuda_rope_scaling_v1_t.mode), numbered as GGML numbers
 * its rope modes. NORMAL: adjacent pairs (2i, 2i+1). NEOX: (i, i + n_dims/2). MROPE: NEOX pairs
 * with the rotary dimensions split into sections driven by separate position streams. VISION:
 * MROPE for two-dimensional image positions.
 */
#define GUILD_CUDA_ROPE_MODE_NORMAL 0u
#define GUILD_CUDA_ROPE_MODE_NEOX 2u
#define GUILD_CUDA_ROPE_MODE_MROPE 8u
#define GUILD_CUDA_ROPE_MODE_VISION 24u
/* Section count of multi-axis RoPE (and rows of its position array). */
#define GUILD_CUDA_ROPE_MAX_SECTIONS 4u

/* Direction of a KV stream (guild_cuda_kv_stream_map_v1_t.direction). */
#define GUILD_CUDA_KV_HOST_TO_DEVICE 0u
#define GUILD_CUDA_KV_DEVICE_TO_HOST 1u

/* Kind of value a configuration entry carries (guild_cuda_attn_config_args_v1_t.value_kind). */
#define GUILD_CUDA_CONFIG_VALUE_INT 0u
#define GUILD_CUDA_CONFIG_VALUE_FLOAT 1u
#define GUILD_CUDA_CONFIG_VALUE_TEXT 2u

/*
 * Configuration keys every CDA1 provider recognises. Providers may accept further keys of their
 * own under a "vendor.<package_id>." prefix. All of these take GUILD_CUDA_CONFIG_VALUE_INT.
 */
/* 0 or 1: allow QSA-selected sparse attention (default 1 when GUILD_CUDA_ATTN_CAP_QSA). */
#define GUILD_CUDA_ATTN_CONFIG_QSA_ENABLE "cda1.qsa.enable"
/* Upper bound on split-K partitions of one attention call; 0 lets the provider choose. */
#define GUILD_CUDA_ATTN_CONFIG_MAX_SPLITS "cda1.attn.max_splits"
/* 0 or 1: prefer kernels whose results do not depend on launch configuration. */
#define GUILD_CUDA_ATTN_CONFIG_DETERMINISTIC "cda1.deterministic"
/* Chunk length for chunked GDN prefill; 0 lets the provider choose. */
#define GUILD_CUDA_ATTN_CONFIG_GDN_CHUNK_SIZE "cda1.gdn.chunk_size"
/* 0 or 1: allow KV blocks to be streamed between host pools and the device cache. */
#define GUILD_CUDA_ATTN_CONFIG_KV_STREAMING "cda1.kv.streaming"

/* ------------------------------------------------------------------------------------------ */
/* Descriptors                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/*
 * The shape of one attention layer call (dense or QSA-sparse). Queries are the n_tokens tokens of
 * n_seqs sequences; every query head attends with key/value head h / (n_head / n_head_kv).
 */
typedef struct guild_cuda_qsa_shapes_v1_t {
    /* sizeof(guild_cuda_qsa_shapes_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* Layer of the model, for diagnostics and per-layer configuration. */
    uint32_t layer_index;
    /* Query heads; a multiple of n_head_kv. */
    uint32_t n_head;
    /* Key/value heads. */
    uint32_t n_head_kv;
    /* Elements per query/key head and per value head. */
    uint32_t head_dim_k;
    uint32_t head_dim_v;
    /* Query tokens in this call, over all sequences. */
    uint32_t n_tokens;
    /* Sequences in this call. */
    uint32_t n_seqs;
    /* Upper bound on the cached positions any sequence can see (the largest seq_lens entry). */
    uint64_t n_kv;
    /* QSA only: positions kept per query after selection; 0 means dense attention. */
    uint32_t top_k;
    /* QSA only: selection granularity in positions (1 = single positions). */
    uint32_t select_block_size;
    /* QSA only: heads and elements per head of the indexer. */
    uint32_t index_n_head;
    uint32_t index_head_dim;
    /* Positions before the query that stay visible; 0 = unlimited. */
    uint32_t sliding_window;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_qsa_shapes_v1_t;

/*
 * The shape of one gated delta-net call. The n_seqs sequences each contribute n_tokens tokens
 * (sequence-major); every value head h reads key head h / (n_v_heads / n_k_heads).
 */
typedef struct guild_cuda_gdn_shapes_v1_t {
    /* sizeof(guild_cuda_gdn_shapes_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* Layer of the model, for diagnostics. */
    uint32_t layer_index;
    /* Key heads (shared by q and k) and value heads; n_v_heads is a multiple of n_k_heads. */
    uint32_t n_k_heads;
    uint32_t n_v_heads;
    /* Elements per key/query head and per value head. */
    uint32_t head_k_dim;
    uint32_t head_v_dim;
    /* Tokens per sequence in this call (1 for a decode step). */
    uint32_t n_tokens;
    /* Sequences in this call. */
    uint32_t n_seqs;
    /* Chunk length for chunked prefill; 0 runs the plain recurrence token by token. */
    uint32_t chunk_size;
    /* Must be zero. */
    uint32_t reserved;
    /* Bytes between consecutive state slots in the state pool; each slot holds
     * n_v_heads * head_v_dim * head_k_dim F32 values. */
    uint64_t state_slot_stride_bytes;
} guild_cuda_gdn_shapes_v1_t;

/*
 * Caller-owned device scratch for attention. query_pools writes the byte counts (and
 * max_splits) a given shape needs into a record like this with the pointers left NULL; the caller
 * allocates at least that much and passes the filled record to the execution calls. A pool is
 * reused across calls on the same stream but must not be shared by calls on different streams.
 */
typedef struct guild_cuda_qsa_attn_pools_v1_t {
    /* sizeof(guild_cuda_qsa_attn_pools_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* Split-K partitions the partial buffers are sized for. */
    uint32_t max_splits;
    /* F32 partial outputs, [max_splits][n_tokens][n_head][head_dim_v]. */
    void* partial_output;
    uint64_t partial_output_bytes;
    /* F32 partial log-sum-exp values, [max_splits][n_tokens][n_head]. */
    void* partial_lse;
    uint64_t partial_lse_bytes;
    /* Untyped scratch (selection sorts, chunk buffers). */
    void* workspace;
    uint64_t workspace_bytes;
} guild_cuda_qsa_attn_pools_v1_t;

/*
 * One layer's KV cache on the device: a pool of fixed-size blocks. Position p of sequence s
 * lives in physical block b = block_table[s * max_blocks_per_seq + p / block_size] (or
 * b = s * max_blocks_per_seq + p / block_size when block_table is NULL), slot p % block_size;
 * key head h of it starts at
 *   k_blocks + b * k_block_stride_bytes + (p % block_size) * k_position_stride_bytes
 *            + h * k_head_stride_bytes
 * and values likewise.
 */
typedef struct guild_cuda_kv_cache_view_v1_t {
    /* sizeof(guild_cuda_kv_cache_view_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F16, GUILD_DTYPE_BF16 or GUILD_DTYPE_Q8_0 (one of the table's kv_cache_dtypes). */
    uint32_t dtype;
    /* Key/value heads and elements per key head and value head. */
    uint32_t n_head_kv;
    uint32_t head_dim_k;
    uint32_t head_dim_v;
    /* Positions per block. */
    uint32_t block_size;
    /* Layer this cache belongs to; selects the layer in host pools. */
    uint32_t layer_index;
    /* Entries per sequence row of block_table. */
    uint32_t max_blocks_per_seq;
    /* Physical blocks in the pool. */
    uint64_t block_count;
    /* Device memory of the key and value blocks. */
    void* k_blocks;
    void* v_blocks;
    /* Bytes between blocks, positions within a block, and heads within a position. */
    uint64_t k_block_stride_bytes;
    uint64_t v_block_stride_bytes;
    uint64_t k_position_stride_bytes;
    uint64_t v_position_stride_bytes;
    uint64_t k_head_stride_bytes;
    uint64_t v_head_stride_bytes;
    /* Device array [n_seqs][max_blocks_per_seq] of physical block indices, or NULL. */
    const int32_t* block_table;
} guild_cuda_kv_cache_view_v1_t;

/*
 * Host-side KV pools that blocks are streamed to and from. Both pools are pinned host memory
 * (page-locked, mapped for the device) owned by the caller, laid out layer-major: block b of
 * layer l starts at k_pool + l * k_layer_stride_bytes + b * k_block_bytes. A block's bytes are
 * the first k_block_bytes (v_block_bytes) bytes of a device block, copied verbatim.
 */
typedef struct guild_cuda_kv_host_pools_v1_t {
    /* sizeof(guild_cuda_kv_host_pools_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_* of the cached values; equal to the device cache's dtype. */
    uint32_t dtype;
    /* Layers held by the pools. */
    uint32_t layer_count;
    /* Positions per block; equal to the device cache's block_size. */
    uint32_t block_size;
    /* Blocks per layer in each pool. */
    uint64_t block_count;
    /* Bytes of one key block and one value block. */
    uint64_t k_block_bytes;
    uint64_t v_block_bytes;
    /* Bytes between layers in each pool. */
    uint64_t k_layer_stride_bytes;
    uint64_t v_layer_stride_bytes;
    /* Pinned host memory of the key and value pools; must stay valid until every transfer that
     * names them has completed. */
    void* k_pool;
    void* v_pool;
} guild_cuda_kv_host_pools_v1_t;

/*
 * Which blocks one kv_stream call moves: entry i copies host block host_blocks[i] to device block
 * device_blocks[i] (or back, by direction), keys and values both. Both arrays are host memory
 * read during the call only. Entries must not name one destination block twice.
 */
typedef struct guild_cuda_kv_stream_map_v1_t {
    /* sizeof(guild_cuda_kv_stream_map_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_KV_HOST_TO_DEVICE or GUILD_CUDA_KV_DEVICE_TO_HOST. */
    uint32_t direction;
    /* Blocks to move. */
    uint64_t entry_count;
    /* entry_count host pool block indices (< host_pools->block_count). */
    const int32_t* host_blocks;
    /* entry_count device cache block indices (< cache->block_count). */
    const int32_t* device_blocks;
} guild_cuda_kv_stream_map_v1_t;

/*
 * Inputs and outputs of QSA selection. The indexer scores every visible position p for query t as
 *   score[t][p] = sum over h < index_n_head of head_weights[t][h] * max(0, dot(q[t][h], k[p]))
 * and keeps the top_k best (ties to the lower position), written in ascending position order.
 */
typedef struct guild_cuda_qsa_indexer_buffers_v1_t {
    /* sizeof(guild_cuda_qsa_indexer_buffers_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16 or GUILD_DTYPE_BF16 of index_queries and index_keys. */
    uint32_t query_dtype;
    uint32_t key_dtype;
    /* Must be zero. */
    uint32_t reserved;
    /* Device [n_tokens][index_n_head][index_head_dim] indexer queries. */
    const void* index_queries;
    uint64_t query_token_stride_bytes;
    uint64_t query_head_stride_bytes;
    /* Device [n_seqs][n_kv][index_head_dim] indexer keys. */
    const void* index_keys;
    uint64_t key_seq_stride_bytes;
    uint64_t key_position_stride_bytes;
    /* Device [n_tokens][index_n_head] F32 head weights, rows packed. */
    const float* head_weights;
    /* Optional device [n_tokens] rows of n_kv F32 scores; NULL when not wanted. */
    float* scores;
    uint64_t score_token_stride_bytes;
    /* Device [n_tokens][top_k] selected positions, rows packed; unused entries are -1. */
    int32_t* selected;
    /* Device [n_tokens] number of valid entries in each row of selected. */
    int32_t* selected_count;
} guild_cuda_qsa_indexer_buffers_v1_t;

/*
 * Rotary embedding parameters, GGML's rope parameters as a record. For a pair at index i of the
 * n_dims rotated dimensions, theta = position * freq_base^(-2i / n_dims), adjusted by the scaling
 * type: LINEAR multiplies by freq_scale; YARN blends interpolation and extrapolation by
 * ext_factor between beta_fast and beta_slow and scales magnitudes by attn_factor; LONGROPE and
 * LLAMA3 divide by freq_factors[i].
 */
typedef struct guild_cuda_rope_scaling_v1_t {
    /* sizeof(guild_cuda_rope_scaling_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_ROPE_SCALING_*. */
    uint32_t scaling_type;
    /* GUILD_CUDA_ROPE_MODE_*. */
    uint32_t mode;
    /* Leading dimensions of each head that are rotated (even, <= head_dim). */
    uint32_t n_dims;
    /* Context length the model was trained with (YARN). */
    uint32_t n_ctx_orig;
    /* Base of the frequency ladder, e.g. 10000. */
    float freq_base;
    /* Position interpolation factor: 1 / context extension factor. */
    float freq_scale;
    /* YARN extrapolation mix; 0 disables the ramp. */
    float ext_factor;
    /* Magnitude correction applied to cos and sin. */
    float attn_factor;
    /* YARN ramp bounds, in rotations. */
    float beta_fast;
    float beta_slow;
    /* MROPE/VISION: rotary pairs driven by each position stream; zeros otherwise. */
    uint32_t sections[GUILD_CUDA_ROPE_MAX_SECTIONS];
    /* Must be zero. */
    uint32_t reserved;
    /* LONGROPE/LLAMA3: device array of n_dims / 2 F32 divisors; NULL otherwise. */
    const float* freq_factors;
} guild_cuda_rope_scaling_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* Callback arguments                                                                          */
/* ------------------------------------------------------------------------------------------ */

/*
 * Arguments of configure: set one key to one value on this table's instance. A change applies to
 * calls that start after configure returns. Unknown keys fail with GUILD_STATUS_ERR_NOT_FOUND, a
 * wrong value kind or range with GUILD_STATUS_ERR_INVALID_ARGUMENT.
 */
typedef struct guild_cuda_attn_config_args_v1_t {
    /* sizeof(guild_cuda_attn_config_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_CONFIG_VALUE_*: which of the value fields is meaningful. */
    uint32_t value_kind;
    /* NUL-terminated ASCII key, e.g. GUILD_CUDA_ATTN_CONFIG_MAX_SPLITS. */
    const char* key;
    /* The value for GUILD_CUDA_CONFIG_VALUE_INT. */
    int64_t int_value;
    /* The value for GUILD_CUDA_CONFIG_VALUE_FLOAT. */
    double float_value;
    /* The NUL-terminated UTF-8 value for GUILD_CUDA_CONFIG_VALUE_TEXT; NULL otherwise. */
    const char* text_value;
} guild_cuda_attn_config_args_v1_t;

/*
 * Arguments of query_pools: report the scratch one operation needs for the given shapes. Runs
 * on the host only and enqueues nothing.
 */
typedef struct guild_cuda_attn_pool_query_args_v1_t {
    /* sizeof(guild_cuda_attn_pool_query_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_CUDA_ATTN_OP_*. */
    uint32_t operation;
    /* Shapes for GUILD_CUDA_ATTN_OP_ATTENTION and GUILD_CUDA_ATTN_OP_QSA_SELECT; NULL otherwise. */
    const guild_cuda_qsa_shapes_v1_t* qsa_shapes;
    /* Shapes for GUILD_CUDA_ATTN_OP_GDN_UPDATE; NULL otherwise. */
    const guild_cuda_gdn_shapes_v1_t* gdn_shapes;
    /* Written only on success: max_splits and every *_bytes field (0 where nothing is needed);
     * the pointers are left NULL. The host sets pools_out->struct_size first. */
    guild_cuda_qsa_attn_pools_v1_t* pools_out;
} guild_cuda_attn_pool_query_args_v1_t;

/*
 * Arguments of attention: out[t][h] = softmax(scale * q[t][h] . K^T + mask) V over the positions
 * visible to query t (all of them, or only the QSA-selected ones when `selected` is non-NULL),
 * with logits soft-capped as softcap * tanh(logit / softcap) when softcap > 0 and an extra sink
 * logit per head in the softmax denominator when sinks is non-NULL.
 */
typedef struct guild_cuda_attn_args_v1_t {
    /* sizeof(guild_cuda_attn_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16 or GUILD_DTYPE_BF16 of q. */
    uint32_t q_dtype;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16 or GUILD_DTYPE_BF16 of out. */
    uint32_t out_dtype;
    /* GUILD_CUDA_ATTN_MASK_*. */
    uint32_t mask_kind;
    /* Logit scale, usually 1 / sqrt(head_dim_k). */
    float scale;
    /* Soft cap of the logits; 0 disables it. */
    float softcap;
    /* Shapes of the call. */
    const guild_cuda_qsa_shapes_v1_t* shapes;
    /* The layer's KV cache. */
    const guild_cuda_kv_cache_view_v1_t* cache;
    /* Scratch sized by query_pools for these shapes. */
    const guild_cuda_qsa_attn_pools_v1_t* pools;
    /* Device [n_tokens][n_head][head_dim_k] queries. */
    const void* q;
    uint64_t q_token_stride_bytes;
    uint64_t q_head_stride_bytes;
    /* Device [n_seqs + 1] offsets of each sequence's first query token (the last is n_tokens). */
    const int32_t* query_seq_starts;
    /* Device [n_tokens] absolute position of each query token within its sequence. */
    const int32_t* query_positions;
    /* Device [n_seqs] number of cached positions visible to each sequence. */
    const int32_t* seq_lens;
    /* GUILD_CUDA_ATTN_MASK_EXPLICIT: device [n_tokens] rows of n_kv F16 additive mask values. */
    const void* mask;
    uint64_t mask_row_stride_bytes;
    /* Optional device [n_head] F32 sink logits; NULL for none. */
    const float* sinks;
    /* Optional QSA selection from qsa_select ([n_tokens][top_k] positions and [n_tokens]
     * counts); NULL for dense attention. */
    const int32_t* selected;
    const int32_t* selected_count;
    /* Device [n_tokens][n_head][head_dim_v] output. */
    void* out;
    uint64_t out_token_stride_bytes;
    uint64_t out_head_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_cuda_attn_args_v1_t;

/*
 * Arguments of gdn_update: the gated delta rule for every sequence s and value head h, token by
 * token (or in equivalent chunks):
 *   S = exp(gate[t][h]) * S
 *   S = S + beta[t][h] * k[t] (v[t][h] - S^T k[t])^T
 *   out[t][h] = S^T q[t] / sqrt(head_k_dim)
 * where S is the head's head_k_dim x head_v_dim F32 state, read from and written back to the
 * sequence's state slot. q, k, v and out hold each token's heads packed one after another.
 */
typedef struct guild_cuda_gdn_args_v1_t {
    /* sizeof(guild_cuda_gdn_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16 of q, k, v and out. */
    uint32_t io_dtype;
    /* GUILD_CUDA_GDN_* bits. */
    uint32_t flags;
    /* Must be zero. */
    uint32_t reserved0;
    /* Shapes of the call. */
    const guild_cuda_gdn_shapes_v1_t* shapes;
    /* Device [n_seqs * n_tokens] token rows of q, k (n_k_heads * head_k_dim) and v
     * (n_v_heads * head_v_dim). */
    const void* q;
    const void* k;
    const void* v;
    uint64_t q_token_stride_bytes;
    uint64_t k_token_stride_bytes;
    uint64_t v_token_stride_bytes;
    /* Device [n_seqs * n_tokens][n_v_heads] F32 log decay (<= 0) and write strength (0..1). */
    const float* gate;
    const float* beta;
    /* Device pool of F32 recurrent states, slots shapes->state_slot_stride_bytes apart. */
    float* state;
    /* Device [n_seqs] slot of each sequence in the pool; NULL means slot s. */
    const int32_t* state_slots;
    /* Device [n_seqs * n_tokens] output rows of n_v_heads * head_v_dim. */
    void* out;
    uint64_t out_token_stride_bytes;
    /* Scratch of the size query_pools reported for GUILD_CUDA_ATTN_OP_GDN_UPDATE. */
    void* workspace;
    uint64_t workspace_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_gdn_args_v1_t;

/*
 * Arguments of rope: rotate the first scaling->n_dims elements of every head of every token by
 * the token's position(s); the other elements are copied. input and output may be the same
 * buffer with the same strides.
 */
typedef struct guild_cuda_rope_args_v1_t {
    /* sizeof(guild_cuda_rope_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16 or GUILD_DTYPE_BF16 of input and output. */
    uint32_t dtype;
    /* Heads per token and elements per head. */
    uint32_t n_head;
    uint32_t head_dim;
    /* Tokens to rotate. */
    uint32_t n_tokens;
    /* Must be zero. */
    uint32_t reserved0;
    /* Rotation parameters; read during the call (freq_factors is a device array). */
    const guild_cuda_rope_scaling_v1_t* scaling;
    /* Device positions: [n_tokens], or [GUILD_CUDA_ROPE_MAX_SECTIONS][n_tokens] for MROPE and
     * VISION. */
    const int32_t* positions;
    /* Device [n_tokens][n_head][head_dim] input. */
    const void* input;
    uint64_t input_token_stride_bytes;
    uint64_t input_head_stride_bytes;
    /* Device [n_tokens][n_head][head_dim] output. */
    void* output;
    uint64_t output_token_stride_bytes;
    uint64_t output_head_stride_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_rope_args_v1_t;

/*
 * Arguments of kv_append: write n_tokens new keys and values into the cache at (sequence,
 * position) pairs, converting to the cache's dtype. Pairs must be distinct within a call.
 */
typedef struct guild_cuda_kv_append_args_v1_t {
    /* sizeof(guild_cuda_kv_append_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_DTYPE_F32, GUILD_DTYPE_F16 or GUILD_DTYPE_BF16 of k and v. */
    uint32_t src_dtype;
    /* Tokens to append. */
    uint32_t n_tokens;
    /* Must be zero. */
    uint32_t reserved0;
    /* The layer's KV cache (written). */
    const guild_cuda_kv_cache_view_v1_t* cache;
    /* Device [n_tokens] rows of n_head_kv * head_dim_k keys and n_head_kv * head_dim_v values. */
    const void* k;
    const void* v;
    uint64_t k_token_stride_bytes;
    uint64_t v_token_stride_bytes;
    /* Device [n_tokens] sequence of each token, and its position within that sequence. */
    const int32_t* token_seqs;
    const int32_t* token_positions;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_kv_append_args_v1_t;

/*
 * Arguments of kv_stream: copy the blocks named by map between the host pools and the device
 * cache of layer cache->layer_index, asynchronously on the stream.
 */
typedef struct guild_cuda_kv_stream_args_v1_t {
    /* sizeof(guild_cuda_kv_stream_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* Must be zero. */
    uint32_t reserved0;
    /* The pinned host pools. */
    const guild_cuda_kv_host_pools_v1_t* host_pools;
    /* The blocks to move and the direction. */
    const guild_cuda_kv_stream_map_v1_t* map;
    /* The layer's device cache. */
    const guild_cuda_kv_cache_view_v1_t* cache;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the device cache and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_kv_stream_args_v1_t;

/* Arguments of qsa_select: run the indexer and write each query's selected positions. */
typedef struct guild_cuda_qsa_select_args_v1_t {
    /* sizeof(guild_cuda_qsa_select_args_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* Must be zero. */
    uint32_t reserved0;
    /* Shapes of the call (top_k, select_block_size and the index_* fields are used). */
    const guild_cuda_qsa_shapes_v1_t* shapes;
    /* Indexer inputs and the selection outputs. */
    const guild_cuda_qsa_indexer_buffers_v1_t* buffers;
    /* Device arrays as in guild_cuda_attn_args_v1_t: query offsets per sequence, query
     * positions, visible lengths. */
    const int32_t* query_seq_starts;
    const int32_t* query_positions;
    const int32_t* seq_lens;
    /* Scratch of the size query_pools reported for GUILD_CUDA_ATTN_OP_QSA_SELECT. */
    void* workspace;
    uint64_t workspace_bytes;
    /* Stream to enqueue on. */
    guild_stream_t stream;
    /* Device that owns the buffers and is current on the calling thread. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved1;
} guild_cuda_qsa_select_args_v1_t;

/* The callback types. `user_data` is the table's user_data; `error` may be NULL. */
typedef guild_status_t (*guild_cuda_attn_configure_fn)(void* user_data, const guild_cuda_attn_config_args_v1_t* args,
                                                       guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_attn_query_pools_fn)(void* user_data,
                                                         const guild_cuda_attn_pool_query_args_v1_t* args,
                                                         guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_attn_fn)(void* user_data, const guild_cuda_attn_args_v1_t* args,
                                             guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_gdn_update_fn)(void* user_data, const guild_cuda_gdn_args_v1_t* args,
                                                   guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_rope_fn)(void* user_data, const guild_cuda_rope_args_v1_t* args,
                                             guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_kv_append_fn)(void* user_data, const guild_cuda_kv_append_args_v1_t* args,
                                                  guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_kv_stream_fn)(void* user_data, const guild_cuda_kv_stream_args_v1_t* args,
                                                  guild_error_info_t* error);
typedef guild_status_t (*guild_cuda_qsa_select_fn)(void* user_data, const guild_cuda_qsa_select_args_v1_t* args,
                                                   guild_error_info_t* error);

/*
 * The CDA1 table. header.struct_size is sizeof(guild_cuda_attn_ext_v1_t), header.tag
 * GUILD_CUDA_ATTN_TAG and header.version GUILD_CUDA_ATTN_EXT_VERSION. configure and query_pools
 * are required; a NULL execution callback means that operation is not offered.
 */
typedef struct guild_cuda_attn_ext_v1_t {
    guild_ext_header_t header;
    /* GUILD_CUDA_ATTN_CAP_* bits. */
    uint32_t capabilities;
    /* Must be zero. */
    uint32_t reserved;
    /* KV cache dtypes accepted: bit ((uint64_t)1 << dtype) for each GUILD_DTYPE_* id. */
    uint64_t kv_cache_dtypes;
    /* Sets one configuration key on this table's instance. */
    guild_cuda_attn_configure_fn configure;
    /* Reports the scratch an operation needs. */
    guild_cuda_attn_query_pools_fn query_pools;
    /* Dense or QSA-sparse attention over the KV cache. */
    guild_cuda_attn_fn attention;
    /* Recurrent gated delta-net update. */
    guild_cuda_gdn_update_fn gdn_update;
    /* Rotary position embedding. */
    guild_cuda_rope_fn rope;
    /* Appends keys and values to the cache. */
    guild_cuda_kv_append_fn kv_append;
    /* Moves KV blocks between host pools and the device cache. */
    guild_cuda_kv_stream_fn kv_stream;
    /* QSA indexer scoring and top-k selection. */
    guild_cuda_qsa_select_fn qsa_select;
    /* Passed back as the first argument of every callback; owned by the plugin and valid until
     * its shutdown returns. */
    void* user_data;
} guild_cuda_attn_ext_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_CUDA_ATTN_ABI_H */
