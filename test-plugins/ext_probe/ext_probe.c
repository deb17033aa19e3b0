/*
 * ext_probe: one plugin that registers one descriptor carrying one extension, in the form a test
 * asks for, so that the host's negotiation of every extension can be tested case by case
 * (crates/adapters-posix/tests/it/extensions.rs).
 *
 * The case is chosen at init from the library's own file name, which the test gives each copy:
 *
 *   libext_probe__<extension>__<case>.so
 *
 * Extensions: gop1, rmd1, cpe1 (a CPE1 version 1 table), cpu2 (a CPU backend version 2 table),
 * cdd1, cda1, cdm1, pfke, and cuda (a CUDA kernel carrying CDD1, an unknown tag, CDA1 and CDM1
 * with its Qwen group in one chain). The registered id is test.ext_probe.<extension>: a runner
 * for rmd1 (except in the misplaced case, where it is a kernel carrying RMD1), a kernel for the
 * rest.
 *
 * Cases (not every extension has every case; an unknown combination fails init):
 *   current            the layout these headers declare (for cpe1, version 1 at its own size)
 *   older              cpu2 only: version 2 whose struct_size stops after quantize_planar_q2;
 *                      the callbacks past it are set in memory, but the size does not carry them
 *   newer              struct_size 16 bytes past the layout, the extra bytes non-zero; for
 *                      cpe1, version 1 declaring the whole v2 size with every appended callback
 *                      set
 *   too_small          struct_size 8 bytes below the version's smallest layout (for cpu2, the
 *                      CPE1 prefix)
 *   version            a version this host does not know (3 for CPE1, 2 for the rest)
 *   wrong_tag          the tag's last character replaced by '9'
 *   misplaced          on a descriptor the extension does not belong on (gop1 on GUILD_OP_ADD,
 *                      rmd1 on a kernel, cpe1/cpu2 on GUILD_OP_MATMUL, cdd1/cda1/cdm1 on a CPU
 *                      kernel, pfke in the next_ext chain)
 *   misplaced_backend  cpe1 only: on a CUDA GUILD_OP_BATCHED_EXPERT_EXEC kernel
 *   null               a required callback NULL (for cdd1 and pfke, whose callbacks are each
 *                      optional, all of them NULL)
 *   sparse             accepted with optional callbacks NULL (cpu2: router_bf16; cdd1: all but
 *                      project; cda1: every execution callback; cdm1: all but combine)
 *   cycle              the chain loops back (a self-loop, or through an unknown extension first)
 *   duplicate          cpe1 only: two CPE1 tables in one chain
 *   qwen, qwen_wrong_tag, qwen_too_small, qwen_version
 *                      cdm1 only: with a Qwen group, valid or broken in one respect
 *   all                cuda only
 *   other_isa          a kernel extension on a descriptor whose required_cpu_isa names an
 *                      instruction set of the other architecture (NEON on x86-64, AVX2
 *                      elsewhere), which no CPU running this build has
 *
 * The callbacks do small reference arithmetic on host memory, so that a test calling one
 * through the host's copy can tell it reached the right function:
 *   CPE1 quantize_activation  per row d = max|x| / 127, q = round(x / d); the row is written as
 *                             the F32 d followed by the int8 quants
 *   v2 router_bf16            logits = input . router (BF16), top-k with ties to the lower
 *                             index, softmax over the k (GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX)
 *   v2 quantize_planar_q2     F32 rows to planar Q2: per 16-element group the range
 *                             [min(0, lo), max(0, hi)] in three steps, d and dmin the block's
 *                             largest step and minimum over 15 (stored as binary16)
 *   v2 dequantize_planar_q2   planar Q2 rows to F32: d * scale * q - dmin * min
 *   v2 combine_ordered        dst[t] (+)= sum over k of weight * expert_outputs[slot] in slot
 *                             order, skipping negative slots, then + shared_output[t]
 *   GOP1 query_scratch        host_bytes = 64 * inputs + 8 * outputs, alignment 16
 *   RMD1 recognize            refuses a NULL model with a message naming itself
 *   CDD1 project              F32 rows: output[t][i] = W[i] . x[t] + bias[i] (on the host)
 *   CDA1 configure            cda1.attn.max_splits must be a power of two in 1..=64
 *   CDM1 query_workspace      route needs token_count * expert_count * 4 bytes
 *   CDMQ cvec                 hidden[t] += strength * vector (F32, on the host)
 *   PFKE router_projection    F32 logits[t][e] = hidden[t] . weight[e]
 * Every callback first checks that it received the table's user_data. The rest are declarations
 * that answer GUILD_STATUS_ERR_UNSUPPORTED.
 *
 * Everything is built on init's stack. C99, the installed SDK, dladdr and the C library only;
 * everything but the entry point is static.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <guild/abi/cpu_backend_abi.h>
#include <guild/abi/cpu_expert_abi.h>
#include <guild/abi/cuda_attn_abi.h>
#include <guild/abi/cuda_dense_abi.h>
#include <guild/abi/cuda_moe_abi.h>
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>
#include <guild/abi/runner_abi.h>

#define COMPONENT "test.ext_probe"

/* The user_data of every table; a callback that receives anything else refuses. */
static int probe_state;

static guild_status_t wrong_user(void* user_data, guild_error_info_t* error) {
    if (user_data != (void*)&probe_state) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, COMPONENT, "wrong user_data");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t declared_only(void* user_data, const void* args, guild_error_info_t* error,
                                    const char* message) {
    guild_status_t status = wrong_user(user_data, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "args is NULL");
    }
    return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT, message);
}

/* Checks user_data and args; returns OK when the callback may go on. */
static guild_status_t prologue(void* user_data, const void* args, guild_error_info_t* error) {
    guild_status_t status = wrong_user(user_data, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "args is NULL");
    }
    return GUILD_STATUS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* GOP1                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static guild_status_t gop1_validate(void* user_data, const guild_operation_query_v1_t* query,
                                    guild_error_info_t* error) {
    return prologue(user_data, query, error);
}

static guild_status_t gop1_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                         guild_scratch_request_v1_t* out, guild_error_info_t* error) {
    guild_status_t status = prologue(user_data, query, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (out == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "out_scratch is NULL");
    }
    out->alignment = 16u;
    out->host_bytes = 64u * (uint64_t)query->input_count + 8u * (uint64_t)query->output_count;
    out->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t gop1_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    return declared_only(user_data, args, error, "gop1 execute is a declaration only");
}

static void fill_gop1(guild_operation_ext_v1_t* op) {
    memset(op, 0, sizeof *op);
    op->header.struct_size = (uint32_t)sizeof *op;
    op->header.tag = GUILD_GOP1_TAG;
    op->header.version = GUILD_GOP1_VERSION;
    op->op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    op->numerics = GUILD_NUMERICS_DETERMINISTIC;
    op->input_dtype = GUILD_DTYPE_F32;
    op->output_dtype = GUILD_DTYPE_F32;
    op->min_inputs = 1u;
    op->max_inputs = 2u;
    op->min_outputs = 1u;
    op->max_outputs = 1u;
    op->layouts = GUILD_LAYOUT_CONTIGUOUS;
    op->memory_spaces = GUILD_MEMORY_HOST;
    op->min_alignment = 4u;
    op->min_rank = 1u;
    op->max_rank = 4u;
    op->sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    op->validate = gop1_validate;
    op->query_scratch = gop1_query_scratch;
    op->execute = gop1_execute;
    op->user_data = &probe_state;
}

/* ------------------------------------------------------------------------------------------ */
/* RMD1                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static guild_status_t rmd1_recognize(void* user_data, const guild_model_reader_v1_t* model, guild_error_info_t* error) {
    guild_status_t status = wrong_user(user_data, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (model == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT,
                                    "rmd1 recognize needs a model");
    }
    return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT, "rmd1 recognizes no model");
}

static guild_status_t rmd1_describe(void* user_data, const guild_model_reader_v1_t* model,
                                    guild_runner_model_v1_t* out, guild_error_info_t* error) {
    (void)out;
    return declared_only(user_data, model, error, "rmd1 describe is a declaration only");
}

static guild_status_t rmd1_validate_numerics(void* user_data, const guild_model_reader_v1_t* model,
                                             const guild_runner_model_v1_t* description, guild_error_info_t* error) {
    (void)description;
    return declared_only(user_data, model, error, "rmd1 validate_numerics is a declaration only");
}

static guild_status_t runner_create(void* user_data, const struct guild_model_reader_v1_t* model, void** out,
                                    guild_error_info_t* error) {
    (void)out;
    return declared_only(user_data, model, error, "create is a declaration only");
}

static void runner_destroy(void* user_data, void* instance) {
    (void)user_data;
    (void)instance;
}

static void fill_rmd1(guild_runner_model_ext_v1_t* model) {
    memset(model, 0, sizeof *model);
    model->header.struct_size = (uint32_t)sizeof *model;
    model->header.tag = GUILD_RMD1_TAG;
    model->header.version = GUILD_RMD1_VERSION;
    model->priority = 7;
    model->recognize = rmd1_recognize;
    model->describe = rmd1_describe;
    model->validate_numerics = rmd1_validate_numerics;
    model->user_data = &probe_state;
}

/* ------------------------------------------------------------------------------------------ */
/* CPE1 and CPU backend v2                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int8_t round_to_i8(float value) {
    float rounded = value >= 0.0f ? value + 0.5f : value - 0.5f;
    if (rounded > 127.0f) {
        rounded = 127.0f;
    }
    if (rounded < -127.0f) {
        rounded = -127.0f;
    }
    return (int8_t)rounded;
}

static guild_status_t cpe1_quantize_activation(void* user_data,
                                               const guild_cpu_expert_quantize_activation_args_v1_t* args,
                                               guild_error_info_t* error) {
    uint64_t row;
    uint64_t i;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->format == NULL || args->src == NULL || args->dst == NULL || args->src_dtype != GUILD_DTYPE_F32 ||
        args->format->activation_row_bytes < sizeof(float) + args->format->hidden_size) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT,
                                    "quantize_activation needs F32 rows and room for d and the quants");
    }
    for (row = 0; row < args->row_count; ++row) {
        const float* src = (const float*)((const unsigned char*)args->src + row * args->src_row_stride_bytes);
        unsigned char* dst = (unsigned char*)args->dst + row * args->dst_row_stride_bytes;
        float amax = 0.0f;
        float d;
        for (i = 0; i < args->format->hidden_size; ++i) {
            float magnitude = src[i] < 0.0f ? -src[i] : src[i];
            if (magnitude > amax) {
                amax = magnitude;
            }
        }
        d = amax / 127.0f;
        memcpy(dst, &d, sizeof d);
        for (i = 0; i < args->format->hidden_size; ++i) {
            int8_t q = d == 0.0f ? (int8_t)0 : round_to_i8(src[i] / d);
            memcpy(dst + sizeof d + i, &q, 1);
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t cpe1_quantize_hidden(void* user_data, const guild_cpu_expert_quantize_hidden_args_v1_t* args,
                                           guild_error_info_t* error) {
    return declared_only(user_data, args, error, "quantize_hidden is a declaration only");
}

static guild_status_t cpe1_gate_up_rows(void* user_data, const guild_cpu_expert_gate_up_args_v1_t* args,
                                        guild_error_info_t* error) {
    return declared_only(user_data, args, error, "gate_up_rows is a declaration only");
}

static guild_status_t cpe1_down_rows(void* user_data, const guild_cpu_expert_down_args_v1_t* args,
                                     guild_error_info_t* error) {
    return declared_only(user_data, args, error, "down_rows is a declaration only");
}

static guild_status_t cpu_describe_format(void* user_data, const guild_cpu_describe_format_args_v1_t* args,
                                          guild_error_info_t* error) {
    return declared_only(user_data, args, error, "describe_format is a declaration only");
}

/* IEEE binary16 (little-endian in planar Q2) to F32; every class. */
static float f16_to_f32(uint16_t half) {
    uint32_t exponent = (uint32_t)(half >> 10) & 0x1fu;
    uint32_t mantissa = (uint32_t)half & 0x3ffu;
    float magnitude;
    if (exponent == 0u) {
        magnitude = ldexpf((float)mantissa, -24);
    } else if (exponent == 31u) {
        magnitude = mantissa == 0u ? INFINITY : NAN;
    } else {
        magnitude = ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
    }
    return (half & 0x8000u) != 0u ? -magnitude : magnitude;
}

/* A non-negative finite F32 to binary16, rounded to nearest even; below the normal range it is
 * 0, above it the largest finite value (the reference only stores d and dmin this way). */
static uint16_t f32_to_f16(float value) {
    uint32_t bits;
    int32_t exponent;
    uint32_t mantissa;
    uint32_t half;
    memcpy(&bits, &value, sizeof bits);
    exponent = (int32_t)((bits >> 23) & 0xffu) - 127 + 15;
    mantissa = bits & 0x7fffffu;
    if ((bits & 0x80000000u) != 0u || exponent <= 0) {
        return 0u;
    }
    if (exponent >= 31) {
        return 0x7bffu;
    }
    half = ((uint32_t)exponent << 10) | (mantissa >> 13);
    if ((mantissa & 0x1fffu) > 0x1000u || ((mantissa & 0x1fffu) == 0x1000u && (half & 1u) != 0u)) {
        half += 1u;
    }
    return half > 0x7bffu ? (uint16_t)0x7bffu : (uint16_t)half;
}

static uint32_t round_clamp(float value, uint32_t top) {
    float rounded = floorf(value + 0.5f);
    if (!(rounded > 0.0f)) {
        return 0u;
    }
    return rounded > (float)top ? top : (uint32_t)rounded;
}

#define Q2_GROUPS (GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS / GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS)

/* d and dmin are copied as native uint16_t: the reference assumes a little-endian host, as the
 * planar Q2 planes are little-endian. */

/* Quantizes one 256-element block into its places in the four planes of a row of n blocks:
 * per group, the range [min(0, lo), max(0, hi)] in three steps; the block's d and dmin are the
 * largest group step and minimum over 15. */
static void q2_quantize_block(const float* x, unsigned char* row, uint64_t n, uint64_t b) {
    float step[Q2_GROUPS];
    float low[Q2_GROUPS];
    float max_step = 0.0f;
    float max_low = 0.0f;
    float d;
    float dmin;
    uint16_t d_bits;
    uint16_t dmin_bits;
    uint32_t g;
    uint32_t i;
    for (g = 0; g < Q2_GROUPS; ++g) {
        float lo = 0.0f;
        float hi = 0.0f;
        for (i = 0; i < GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS; ++i) {
            float v = x[g * GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS + i];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        step[g] = (hi - lo) / 3.0f;
        low[g] = -lo;
        max_step = step[g] > max_step ? step[g] : max_step;
        max_low = low[g] > max_low ? low[g] : max_low;
    }
    d_bits = f32_to_f16(max_step / 15.0f);
    dmin_bits = f32_to_f16(max_low / 15.0f);
    d = f16_to_f32(d_bits);
    dmin = f16_to_f32(dmin_bits);
    memcpy(row + n * 80u + b * 2u, &d_bits, 2);
    memcpy(row + n * 82u + b * 2u, &dmin_bits, 2);
    memset(row + b * GUILD_CPU_PLANAR_Q2_QUANT_BYTES, 0, GUILD_CPU_PLANAR_Q2_QUANT_BYTES);
    for (g = 0; g < Q2_GROUPS; ++g) {
        uint32_t scale = d > 0.0f ? round_clamp(step[g] / d, 15u) : 0u;
        uint32_t minimum = dmin > 0.0f ? round_clamp(low[g] / dmin, 15u) : 0u;
        row[n * 64u + b * 16u + g] = (unsigned char)(scale | (minimum << 4));
        for (i = 0; i < GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS; ++i) {
            uint32_t e = g * GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS + i;
            uint32_t q = scale == 0u ? 0u : round_clamp((x[e] + dmin * (float)minimum) / (d * (float)scale), 3u);
            row[b * 64u + e % 64u] |= (unsigned char)(q << (2u * (e / 64u)));
        }
    }
}

/* Planar Q2 arguments the reference handles: F32 on the other side, whole blocks, strides that
 * hold a row. */
static int q2_shape_ok(uint32_t dtype, const void* src, const void* dst, uint64_t row_elements, uint64_t q2_stride,
                       uint64_t f32_stride) {
    return dtype == GUILD_DTYPE_F32 && src != NULL && dst != NULL && row_elements != 0u &&
           row_elements % GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS == 0u &&
           q2_stride >= row_elements / GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS * GUILD_CPU_PLANAR_Q2_BLOCK_BYTES &&
           f32_stride >= row_elements * sizeof(float);
}

static guild_status_t cpu_quantize_planar_q2(void* user_data, const guild_cpu_planar_q2_quantize_args_v1_t* args,
                                             guild_error_info_t* error) {
    uint64_t row;
    uint64_t b;
    uint64_t n;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (!q2_shape_ok(args->src_dtype, args->src, args->dst, args->row_elements, args->dst_row_stride_bytes,
                     args->src_row_stride_bytes)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT,
                                    "quantize_planar_q2 handles F32 rows of whole blocks");
    }
    n = args->row_elements / GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS;
    for (row = 0; row < args->row_count; ++row) {
        const float* src = (const float*)((const unsigned char*)args->src + row * args->src_row_stride_bytes);
        unsigned char* dst = (unsigned char*)args->dst + row * args->dst_row_stride_bytes;
        for (b = 0; b < n; ++b) {
            q2_quantize_block(src + b * GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS, dst, n, b);
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t cpu_dequantize_planar_q2(void* user_data,
                                               const guild_cpu_planar_q2_dequantize_args_v1_t* args,
                                               guild_error_info_t* error) {
    uint64_t row;
    uint64_t n;
    uint64_t e;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (!q2_shape_ok(args->dst_dtype, args->src, args->dst, args->row_elements, args->src_row_stride_bytes,
                     args->dst_row_stride_bytes)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT,
                                    "dequantize_planar_q2 handles F32 rows of whole blocks");
    }
    n = args->row_elements / GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS;
    for (row = 0; row < args->row_count; ++row) {
        const unsigned char* src = (const unsigned char*)args->src + row * args->src_row_stride_bytes;
        float* dst = (float*)((unsigned char*)args->dst + row * args->dst_row_stride_bytes);
        for (e = 0; e < args->row_elements; ++e) {
            uint64_t b = e / GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS;
            uint64_t i = e % GUILD_CPU_PLANAR_Q2_BLOCK_ELEMENTS;
            uint16_t d_bits;
            uint16_t dmin_bits;
            unsigned char sm = src[n * 64u + b * 16u + i / GUILD_CPU_PLANAR_Q2_GROUP_ELEMENTS];
            uint32_t q = ((uint32_t)src[b * 64u + i % 64u] >> (2u * (i / 64u))) & 3u;
            memcpy(&d_bits, src + n * 80u + b * 2u, 2);
            memcpy(&dmin_bits, src + n * 82u + b * 2u, 2);
            dst[e] = f16_to_f32(d_bits) * (float)(sm & 0xfu) * (float)q - f16_to_f32(dmin_bits) * (float)(sm >> 4);
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t cpu_q2_rows(void* user_data, const guild_cpu_q2_rows_args_v1_t* args,
                                  guild_error_info_t* error) {
    return declared_only(user_data, args, error, "q2_rows is a declaration only");
}

static float bf16_to_f32(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

/* The most experts the reference router handles. */
#define PROBE_MAX_EXPERTS 64u

static guild_status_t cpu_router_bf16(void* user_data, const guild_cpu_router_args_v1_t* args,
                                      guild_error_info_t* error) {
    uint32_t t;
    uint32_t e;
    uint32_t k;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->input == NULL || args->router_weights == NULL || args->input_dtype != GUILD_DTYPE_F32 ||
        args->gating != GUILD_CPU_ROUTER_GATING_TOP_K_SOFTMAX || args->expert_count > PROBE_MAX_EXPERTS ||
        args->top_k > args->expert_count || args->top_k == 0u || args->expert_ids == NULL ||
        args->expert_weights == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT,
                                    "router_bf16 handles F32 input, top-k softmax, 1..=k..=experts<=64");
    }
    for (t = 0; t < args->token_count; ++t) {
        const float* x = (const float*)((const unsigned char*)args->input + t * args->input_row_stride_bytes);
        float scores[PROBE_MAX_EXPERTS];
        int taken[PROBE_MAX_EXPERTS];
        float top_max = 0.0f;
        float total = 0.0f;
        for (e = 0; e < args->expert_count; ++e) {
            const uint16_t* w =
                (const uint16_t*)((const unsigned char*)args->router_weights + e * args->router_row_stride_bytes);
            uint64_t i;
            float dot = 0.0f;
            for (i = 0; i < args->hidden_size; ++i) {
                dot += x[i] * bf16_to_f32(w[i]);
            }
            scores[e] = dot;
            taken[e] = 0;
            if (args->logits != NULL) {
                args->logits[(uint64_t)t * args->expert_count + e] = dot;
            }
        }
        for (k = 0; k < args->top_k; ++k) {
            uint32_t best = args->expert_count;
            for (e = 0; e < args->expert_count; ++e) {
                if (!taken[e] && (best == args->expert_count || scores[e] > scores[best])) {
                    best = e;
                }
            }
            taken[best] = 1;
            args->expert_ids[(uint64_t)t * args->top_k + k] = (int32_t)best;
            if (k == 0u) {
                top_max = scores[best];
            }
            args->expert_weights[(uint64_t)t * args->top_k + k] = expf(scores[best] - top_max);
            total += args->expert_weights[(uint64_t)t * args->top_k + k];
        }
        for (k = 0; k < args->top_k; ++k) {
            args->expert_weights[(uint64_t)t * args->top_k + k] *= args->weight_scale / total;
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t cpu_combine_ordered(void* user_data, const guild_cpu_combine_args_v1_t* args,
                                          guild_error_info_t* error) {
    uint32_t t;
    uint32_t k;
    uint64_t i;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->expert_outputs == NULL || args->slots == NULL || args->dst == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT,
                                    "combine_ordered needs expert_outputs, slots and dst");
    }
    for (t = 0; t < args->token_count; ++t) {
        float* dst = (float*)((unsigned char*)args->dst + t * args->dst_row_stride_bytes);
        for (i = 0; i < args->hidden_size; ++i) {
            float acc = 0.0f;
            for (k = 0; k < args->top_k; ++k) {
                uint64_t slot = (uint64_t)t * args->top_k + k;
                const float* row;
                if (args->slots[slot] < 0) {
                    continue;
                }
                row = (const float*)((const unsigned char*)args->expert_outputs +
                                     (uint64_t)args->slots[slot] * args->expert_output_row_stride_bytes);
                acc += (args->weights == NULL ? 1.0f : args->weights[slot]) * row[i];
            }
            if (args->shared_output != NULL) {
                acc += ((const float*)((const unsigned char*)args->shared_output +
                                       t * args->shared_output_row_stride_bytes))[i];
            }
            dst[i] = (args->flags & GUILD_CPU_COMBINE_ACCUMULATE) != 0u ? dst[i] + acc : acc;
        }
    }
    return GUILD_STATUS_OK;
}

/* A whole v2 table, version 2. */
static void fill_cpu(guild_cpu_backend_ext_v2_t* cpu) {
    memset(cpu, 0, sizeof *cpu);
    cpu->header.struct_size = (uint32_t)sizeof *cpu;
    cpu->header.tag = GUILD_CPU_BACKEND_TAG;
    cpu->header.version = GUILD_CPU_BACKEND_EXT_VERSION;
    cpu->quantize_activation = cpe1_quantize_activation;
    cpu->quantize_hidden = cpe1_quantize_hidden;
    cpu->gate_up_rows = cpe1_gate_up_rows;
    cpu->down_rows = cpe1_down_rows;
    cpu->user_data = &probe_state;
    cpu->describe_format = cpu_describe_format;
    cpu->quantize_planar_q2 = cpu_quantize_planar_q2;
    cpu->dequantize_planar_q2 = cpu_dequantize_planar_q2;
    cpu->q2_rows = cpu_q2_rows;
    cpu->router_bf16 = cpu_router_bf16;
    cpu->combine_ordered = cpu_combine_ordered;
}

/* ------------------------------------------------------------------------------------------ */
/* CDD1, CDA1, CDM1, CDMQ                                                                      */
/* ------------------------------------------------------------------------------------------ */

static guild_status_t cdd1_project(void* user_data, const guild_cuda_dense_project_args_v1_t* args,
                                   guild_error_info_t* error) {
    uint64_t t;
    uint64_t r;
    uint64_t c;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->weight_dtype != GUILD_DTYPE_F32 || args->input_dtype != GUILD_DTYPE_F32 ||
        args->output_dtype != GUILD_DTYPE_F32 || args->selection.rows != NULL || args->weights == NULL ||
        args->input == NULL || args->output == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT,
                                    "the reference project takes F32 and every row");
    }
    for (t = 0; t < args->geometry.tokens; ++t) {
        const float* x =
            (const float*)((const unsigned char*)args->input + t * args->strides.input_row_stride_bytes);
        float* y = (float*)((unsigned char*)args->output + t * args->strides.output_row_stride_bytes);
        for (r = 0; r < args->geometry.rows; ++r) {
            const float* w =
                (const float*)((const unsigned char*)args->weights + r * args->strides.weight_row_stride_bytes);
            float dot = args->bias != NULL ? args->bias[r] : 0.0f;
            for (c = 0; c < args->geometry.cols; ++c) {
                dot += w[c] * x[c];
            }
            y[r] = (args->flags & GUILD_CUDA_DENSE_ACCUMULATE) != 0u ? y[r] + dot : dot;
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t cdd1_quantize_q8_1(void* user_data, const guild_cuda_dense_quantize_q8_1_args_v1_t* args,
                                         guild_error_info_t* error) {
    return declared_only(user_data, args, error, "quantize_q8_1 is a declaration only");
}

static guild_status_t cdd1_mmvq(void* user_data, const guild_cuda_dense_mmvq_args_v1_t* args,
                                guild_error_info_t* error) {
    return declared_only(user_data, args, error, "mmvq is a declaration only");
}

static void fill_cdd1(guild_cuda_dense_ext_v1_t* dense) {
    memset(dense, 0, sizeof *dense);
    dense->header.struct_size = (uint32_t)sizeof *dense;
    dense->header.tag = GUILD_CUDA_DENSE_TAG;
    dense->header.version = GUILD_CUDA_DENSE_EXT_VERSION;
    dense->capabilities = GUILD_CUDA_DENSE_CAP_BF16_OUTPUT;
    dense->mmvq_dtypes = GUILD_CUDA_DTYPE_BIT(GUILD_DTYPE_Q4_K) | GUILD_CUDA_DTYPE_BIT(GUILD_DTYPE_Q8_0);
    dense->project = cdd1_project;
    dense->quantize_q8_1 = cdd1_quantize_q8_1;
    dense->mmvq = cdd1_mmvq;
    dense->user_data = &probe_state;
}

static guild_status_t cda1_configure(void* user_data, const guild_cuda_attn_config_args_v1_t* args,
                                     guild_error_info_t* error) {
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->key == NULL || strcmp(args->key, GUILD_CUDA_ATTN_CONFIG_MAX_SPLITS) != 0) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_NOT_FOUND, COMPONENT, "configure knows max_splits only");
    }
    if (args->value_kind != GUILD_CUDA_CONFIG_VALUE_INT || args->int_value < 1 || args->int_value > 64 ||
        (args->int_value & (args->int_value - 1)) != 0) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT,
                                    "max_splits must be a power of two in 1..=64");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t cda1_query_pools(void* user_data, const guild_cuda_attn_pool_query_args_v1_t* args,
                                       guild_error_info_t* error) {
    return declared_only(user_data, args, error, "query_pools is a declaration only");
}

static guild_status_t cda1_attention(void* user_data, const guild_cuda_attn_args_v1_t* args,
                                     guild_error_info_t* error) {
    return declared_only(user_data, args, error, "attention is a declaration only");
}

static guild_status_t cda1_gdn_update(void* user_data, const guild_cuda_gdn_args_v1_t* args,
                                      guild_error_info_t* error) {
    return declared_only(user_data, args, error, "gdn_update is a declaration only");
}

static guild_status_t cda1_rope(void* user_data, const guild_cuda_rope_args_v1_t* args, guild_error_info_t* error) {
    return declared_only(user_data, args, error, "rope is a declaration only");
}

static guild_status_t cda1_kv_append(void* user_data, const guild_cuda_kv_append_args_v1_t* args,
                                     guild_error_info_t* error) {
    return declared_only(user_data, args, error, "kv_append is a declaration only");
}

static guild_status_t cda1_kv_stream(void* user_data, const guild_cuda_kv_stream_args_v1_t* args,
                                     guild_error_info_t* error) {
    return declared_only(user_data, args, error, "kv_stream is a declaration only");
}

static guild_status_t cda1_qsa_select(void* user_data, const guild_cuda_qsa_select_args_v1_t* args,
                                      guild_error_info_t* error) {
    return declared_only(user_data, args, error, "qsa_select is a declaration only");
}

static void fill_cda1(guild_cuda_attn_ext_v1_t* attn) {
    memset(attn, 0, sizeof *attn);
    attn->header.struct_size = (uint32_t)sizeof *attn;
    attn->header.tag = GUILD_CUDA_ATTN_TAG;
    attn->header.version = GUILD_CUDA_ATTN_EXT_VERSION;
    attn->capabilities = GUILD_CUDA_ATTN_CAP_SLIDING_WINDOW;
    attn->kv_cache_dtypes = GUILD_CUDA_DTYPE_BIT(GUILD_DTYPE_F16) | GUILD_CUDA_DTYPE_BIT(GUILD_DTYPE_BF16);
    attn->configure = cda1_configure;
    attn->query_pools = cda1_query_pools;
    attn->attention = cda1_attention;
    attn->gdn_update = cda1_gdn_update;
    attn->rope = cda1_rope;
    attn->kv_append = cda1_kv_append;
    attn->kv_stream = cda1_kv_stream;
    attn->qsa_select = cda1_qsa_select;
    attn->user_data = &probe_state;
}

static guild_status_t cdm1_query_workspace(void* user_data, const guild_cuda_moe_workspace_query_args_v1_t* args,
                                           guild_error_info_t* error) {
    const guild_cuda_moe_route_args_v1_t* route;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->operation != GUILD_CUDA_MOE_OP_ROUTE || args->op_args == NULL || args->workspace_bytes_out == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT,
                                    "query_workspace answers for route only");
    }
    route = (const guild_cuda_moe_route_args_v1_t*)args->op_args;
    *args->workspace_bytes_out = (uint64_t)route->token_count * route->expert_count * 4u;
    return GUILD_STATUS_OK;
}

#define CDM1_STUB(name, args_type)                                                                                  \
    static guild_status_t cdm1_##name(void* user_data, const args_type* args, guild_error_info_t* error) {          \
        return declared_only(user_data, args, error, #name " is a declaration only");                               \
    }
CDM1_STUB(route, guild_cuda_moe_route_args_v1_t)
CDM1_STUB(combine, guild_cuda_moe_combine_args_v1_t)
CDM1_STUB(shared_expert, guild_cuda_moe_shared_expert_args_v1_t)
CDM1_STUB(grouped_experts, guild_cuda_moe_grouped_args_v1_t)
CDM1_STUB(s_gemv, guild_cuda_s_gemv_args_v1_t)
CDM1_STUB(s_dequant, guild_cuda_s_dequant_args_v1_t)
CDM1_STUB(quantize, guild_cuda_moe_quantize_args_v1_t)
CDM1_STUB(elementwise, guild_cuda_elementwise_args_v1_t)
CDM1_STUB(doorbell, guild_cuda_doorbell_args_v1_t)
CDM1_STUB(sample, guild_cuda_sample_args_v1_t)
CDM1_STUB(spec_verify, guild_cuda_spec_verify_args_v1_t)
CDM1_STUB(gr, guild_cuda_qwen_gr_args_v1_t)
CDM1_STUB(fused_gr, guild_cuda_qwen_fused_gr_args_v1_t)
CDM1_STUB(ple, guild_cuda_qwen_ple_args_v1_t)

static guild_status_t cdmq_cvec(void* user_data, const guild_cuda_qwen_cvec_args_v1_t* args,
                                guild_error_info_t* error) {
    uint32_t t;
    uint64_t i;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->io_dtype != GUILD_DTYPE_F32 || args->vector == NULL || args->hidden == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT, "the reference cvec takes F32");
    }
    for (t = 0; t < args->token_count; ++t) {
        float* row = (float*)((unsigned char*)args->hidden + t * args->hidden_row_stride_bytes);
        for (i = 0; i < args->hidden_size; ++i) {
            row[i] += args->strength * args->vector[i];
        }
    }
    return GUILD_STATUS_OK;
}

static void fill_cdm1(guild_cuda_moe_ext_v1_t* moe) {
    memset(moe, 0, sizeof *moe);
    moe->header.struct_size = (uint32_t)sizeof *moe;
    moe->header.tag = GUILD_CUDA_MOE_TAG;
    moe->header.version = GUILD_CUDA_MOE_EXT_VERSION;
    moe->capabilities = GUILD_CUDA_MOE_CAP_DETERMINISTIC;
    moe->grouped_dtypes = GUILD_CUDA_DTYPE_BIT(GUILD_DTYPE_Q4_K);
    moe->s_formats = 0u;
    moe->query_workspace = cdm1_query_workspace;
    moe->route = cdm1_route;
    moe->combine = cdm1_combine;
    moe->shared_expert = cdm1_shared_expert;
    moe->grouped_experts = cdm1_grouped_experts;
    moe->s_gemv = cdm1_s_gemv;
    moe->s_dequant = cdm1_s_dequant;
    moe->quantize = cdm1_quantize;
    moe->elementwise = cdm1_elementwise;
    moe->doorbell = cdm1_doorbell;
    moe->sample = cdm1_sample;
    moe->spec_verify = cdm1_spec_verify;
    moe->qwen = NULL;
    moe->user_data = &probe_state;
}

/* A Qwen group offering gr and cvec. */
static void fill_qwen(guild_cuda_qwen_group_v1_t* qwen) {
    memset(qwen, 0, sizeof *qwen);
    qwen->header.struct_size = (uint32_t)sizeof *qwen;
    qwen->header.tag = GUILD_CUDA_QWEN_TAG;
    qwen->header.version = GUILD_CUDA_QWEN_EXT_VERSION;
    qwen->gr = cdm1_gr;
    qwen->fused_gr = NULL;
    qwen->ple = NULL;
    qwen->cvec = cdmq_cvec;
    qwen->user_data = &probe_state;
    (void)cdm1_fused_gr;
    (void)cdm1_ple;
}

/* ------------------------------------------------------------------------------------------ */
/* PFKE                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static guild_status_t pfke_gdn_ab(void* user_data, const guild_prefill_gdn_ab_args_v1_t* args,
                                  guild_error_info_t* error) {
    return declared_only(user_data, args, error, "gdn_ab is a declaration only");
}

static guild_status_t pfke_router_projection(void* user_data, const guild_prefill_router_args_v1_t* args,
                                             guild_error_info_t* error) {
    uint32_t t;
    uint32_t e;
    uint32_t i;
    guild_status_t status = prologue(user_data, args, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->hidden_dtype != GUILD_DTYPE_F32 || args->weight_dtype != GUILD_DTYPE_F32 || args->hidden == NULL ||
        args->weight == NULL || args->logits == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT,
                                    "the reference router_projection takes F32");
    }
    for (t = 0; t < args->n_tokens; ++t) {
        const float* x = (const float*)args->hidden + (uint64_t)t * args->hidden_row_stride;
        for (e = 0; e < args->n_experts; ++e) {
            const float* w = (const float*)args->weight + (uint64_t)e * args->n_embd;
            float dot = 0.0f;
            for (i = 0; i < args->n_embd; ++i) {
                dot += x[i] * w[i];
            }
            args->logits[(uint64_t)t * args->logits_row_stride + e] = dot;
        }
    }
    return GUILD_STATUS_OK;
}

static void fill_pfke(guild_prefill_kernel_ext_v1_t* pfke) {
    memset(pfke, 0, sizeof *pfke);
    pfke->header.struct_size = (uint32_t)sizeof *pfke;
    pfke->header.tag = GUILD_PFKE_TAG;
    pfke->header.version = GUILD_PFKE_VERSION;
    pfke->gdn_ab = pfke_gdn_ab;
    pfke->router_projection = pfke_router_projection;
}

/* ------------------------------------------------------------------------------------------ */
/* Cases                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Room for any extension plus what a newer layout appends. */
typedef union ext_storage {
    guild_ext_header_t header;
    guild_operation_ext_v1_t gop1;
    guild_runner_model_ext_v1_t rmd1;
    guild_cpu_backend_ext_v2_t cpu;
    guild_cuda_dense_ext_v1_t cdd1;
    guild_cuda_attn_ext_v1_t cda1;
    guild_cuda_moe_ext_v1_t cdm1;
    guild_cuda_qwen_group_v1_t qwen;
    guild_prefill_kernel_ext_v1_t pfke;
    uint64_t words[40];
} ext_storage;

/* The bytes a newer layout would append: non-zero, so that reading them would show. */
#define NEWER_BYTES 16u
#define NEWER_FILL 0xA5

/* Splits "libext_probe__<ext>__<case>.so" into ext and case; 0 when the name has no case. */
static int parse_case(char* ext, size_t ext_size, char* kase, size_t case_size) {
    Dl_info info;
    const char* name;
    const char* first;
    const char* second;
    const char* end;
    size_t ext_len;
    size_t case_len;
    if (dladdr((const void*)&probe_state, &info) == 0 || info.dli_fname == NULL) {
        return 0;
    }
    name = strrchr(info.dli_fname, '/');
    name = name == NULL ? info.dli_fname : name + 1;
    first = strstr(name, "__");
    if (first == NULL) {
        return 0;
    }
    first += 2;
    second = strstr(first, "__");
    if (second == NULL) {
        return 0;
    }
    end = strstr(second + 2, ".so");
    if (end == NULL) {
        return 0;
    }
    ext_len = (size_t)(second - first);
    case_len = (size_t)(end - (second + 2));
    if (ext_len + 1u > ext_size || case_len + 1u > case_size) {
        return 0;
    }
    memcpy(ext, first, ext_len);
    ext[ext_len] = '\0';
    memcpy(kase, second + 2, case_len);
    kase[case_len] = '\0';
    return 1;
}

static int is(const char* a, const char* b) { return strcmp(a, b) == 0; }

/* Replaces the tag's last character by '9'. */
static uint32_t wrong_tag(uint32_t tag) { return (tag & 0xffffff00u) | (uint32_t)'9'; }

static guild_status_t unknown_case(guild_error_info_t* error) {
    return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT,
                                "no such extension case; name the copy libext_probe__<ext>__<case>.so");
}

static guild_status_t probe_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    char ext[16];
    char kase[24];
    char impl_id[64];
    ext_storage main_ext;
    ext_storage second;
    ext_storage third;
    guild_ext_header_t vendor;
    guild_cuda_qwen_group_v1_t qwen;
    guild_kernel_op_desc_v1_t desc;
    guild_runner_desc_v1_t runner;
    size_t size;
    int as_runner;

    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "null argument");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL ||
        host->register_runner == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "short host table");
    }
    if (!parse_case(ext, sizeof ext, kase, sizeof kase)) {
        /* The library under its own name registers nothing. */
        return GUILD_STATUS_OK;
    }
    memcpy(impl_id, "test.ext_probe.", 16);
    if (strlen(ext) + 16u > sizeof impl_id) {
        return unknown_case(error);
    }
    strcat(impl_id, ext);

    memset(&main_ext, 0, sizeof main_ext);
    memset(&second, 0, sizeof second);
    memset(&third, 0, sizeof third);
    memset(&vendor, 0, sizeof vendor);
    vendor.struct_size = (uint32_t)sizeof vendor;
    vendor.tag = GUILD_MAKE_TAG('X', 'Y', 'Z', '1');
    vendor.version = 1u;
    fill_qwen(&qwen);

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.impl_id = impl_id;
    desc.priority = 3;
    desc.user_data = &probe_state;
    desc.next_ext = &main_ext.header;

    memset(&runner, 0, sizeof runner);
    runner.struct_size = (uint32_t)sizeof runner;
    runner.abi_version = GUILD_KERNEL_ABI_VERSION;
    runner.runner_id = impl_id;
    runner.priority = 2;
    runner.user_data = &probe_state;
    runner.create = runner_create;
    runner.destroy = runner_destroy;
    runner.next_ext = &main_ext.header;
    as_runner = 0;

    /* The extension in its current layout, on the descriptor it belongs on. */
    if (is(ext, "gop1")) {
        fill_gop1(&main_ext.gop1);
        desc.op_kind = GUILD_OP_CUSTOM;
        desc.backend = GUILD_BACKEND_CPU;
        desc.op_name = "test.ext_probe.operation";
        size = sizeof main_ext.gop1;
    } else if (is(ext, "rmd1")) {
        fill_rmd1(&main_ext.rmd1);
        as_runner = 1;
        size = sizeof main_ext.rmd1;
    } else if (is(ext, "cpe1") || is(ext, "cpu2")) {
        fill_cpu(&main_ext.cpu);
        if (is(ext, "cpe1")) {
            main_ext.header.version = GUILD_CPU_EXPERT_EXT_VERSION;
            main_ext.header.struct_size = (uint32_t)sizeof(guild_cpu_expert_ext_v1_t);
            size = sizeof(guild_cpu_expert_ext_v1_t);
        } else {
            size = sizeof main_ext.cpu;
        }
        desc.op_kind = GUILD_OP_BATCHED_EXPERT_EXEC;
        desc.backend = GUILD_BACKEND_CPU;
        desc.op_name = "cpu experts";
    } else if (is(ext, "cdd1") || is(ext, "cuda")) {
        fill_cdd1(&main_ext.cdd1);
        desc.op_kind = GUILD_OP_MATMUL;
        desc.backend = GUILD_BACKEND_CUDA;
        size = sizeof main_ext.cdd1;
    } else if (is(ext, "cda1")) {
        fill_cda1(&main_ext.cda1);
        desc.op_kind = GUILD_OP_ATTENTION;
        desc.backend = GUILD_BACKEND_CUDA;
        size = sizeof main_ext.cda1;
    } else if (is(ext, "cdm1")) {
        fill_cdm1(&main_ext.cdm1);
        desc.op_kind = GUILD_OP_MOE_ROUTER;
        desc.backend = GUILD_BACKEND_CUDA;
        size = sizeof main_ext.cdm1;
    } else if (is(ext, "pfke")) {
        fill_pfke(&main_ext.pfke);
        desc.op_kind = GUILD_OP_PREFILL_KERNELS;
        desc.backend = GUILD_BACKEND_CPU;
        desc.kernel_fns = &main_ext.pfke;
        desc.next_ext = NULL;
        size = sizeof main_ext.pfke;
    } else {
        return unknown_case(error);
    }

    /* The case's one departure. For PFKE the 12-byte header's fields are the same first three
     * words as an extension header's, so main_ext.header reaches them too. */
    if (is(kase, "current")) {
    } else if (is(kase, "older") && is(ext, "cpu2")) {
        main_ext.header.struct_size = (uint32_t)offsetof(guild_cpu_backend_ext_v2_t, dequantize_planar_q2);
    } else if (is(kase, "newer")) {
        if (is(ext, "cpe1")) {
            main_ext.header.struct_size = (uint32_t)sizeof main_ext.cpu;
        } else {
            memset((unsigned char*)&main_ext + size, NEWER_FILL, NEWER_BYTES);
            main_ext.header.struct_size = (uint32_t)(size + NEWER_BYTES);
        }
    } else if (is(kase, "too_small")) {
        /* Version 2 accepts any size from the CPE1 prefix up; only below it is too small. */
        size_t minimum = is(ext, "cpu2") ? sizeof(guild_cpu_expert_ext_v1_t) : size;
        main_ext.header.struct_size = (uint32_t)(minimum - 8u);
    } else if (is(kase, "version")) {
        main_ext.header.version = (is(ext, "cpe1") || is(ext, "cpu2")) ? 3u : 2u;
    } else if (is(kase, "wrong_tag")) {
        main_ext.header.tag = wrong_tag(main_ext.header.tag);
    } else if (is(kase, "misplaced")) {
        if (is(ext, "gop1")) {
            desc.op_kind = GUILD_OP_ADD;
        } else if (is(ext, "rmd1")) {
            as_runner = 0;
            desc.op_kind = GUILD_OP_ADD;
            desc.backend = GUILD_BACKEND_CPU;
        } else if (is(ext, "cpe1") || is(ext, "cpu2")) {
            desc.op_kind = GUILD_OP_MATMUL;
        } else if (is(ext, "pfke")) {
            desc.next_ext = (const guild_ext_header_t*)(const void*)&main_ext.pfke;
        } else {
            desc.backend = GUILD_BACKEND_CPU;
        }
    } else if (is(kase, "misplaced_backend") && is(ext, "cpe1")) {
        desc.backend = GUILD_BACKEND_CUDA;
    } else if (is(kase, "other_isa") && !as_runner) {
#if defined(__x86_64__) || defined(_M_X64)
        desc.required_cpu_isa = GUILD_CPU_ISA_NEON;
#else
        desc.required_cpu_isa = GUILD_CPU_ISA_AVX2;
#endif
    } else if (is(kase, "null")) {
        if (is(ext, "gop1")) {
            main_ext.gop1.execute = NULL;
        } else if (is(ext, "rmd1")) {
            main_ext.rmd1.validate_numerics = NULL;
        } else if (is(ext, "cpe1")) {
            main_ext.cpu.gate_up_rows = NULL;
        } else if (is(ext, "cpu2")) {
            main_ext.cpu.down_rows = NULL;
        } else if (is(ext, "cdd1")) {
            main_ext.cdd1.project = NULL;
            main_ext.cdd1.quantize_q8_1 = NULL;
            main_ext.cdd1.mmvq = NULL;
        } else if (is(ext, "cda1")) {
            main_ext.cda1.query_pools = NULL;
        } else if (is(ext, "cdm1")) {
            main_ext.cdm1.query_workspace = NULL;
        } else if (is(ext, "pfke")) {
            main_ext.pfke.gdn_ab = NULL;
            main_ext.pfke.router_projection = NULL;
        }
    } else if (is(kase, "sparse") && is(ext, "cpu2")) {
        main_ext.cpu.router_bf16 = NULL;
    } else if (is(kase, "sparse") && is(ext, "cdd1")) {
        main_ext.cdd1.quantize_q8_1 = NULL;
        main_ext.cdd1.mmvq = NULL;
    } else if (is(kase, "sparse") && is(ext, "cda1")) {
        main_ext.cda1.attention = NULL;
        main_ext.cda1.gdn_update = NULL;
        main_ext.cda1.rope = NULL;
        main_ext.cda1.kv_append = NULL;
        main_ext.cda1.kv_stream = NULL;
        main_ext.cda1.qsa_select = NULL;
    } else if (is(kase, "sparse") && is(ext, "cdm1")) {
        fill_cdm1(&second.cdm1);
        memset(&main_ext.cdm1, 0, sizeof main_ext.cdm1);
        main_ext.cdm1.header = second.cdm1.header;
        main_ext.cdm1.query_workspace = cdm1_query_workspace;
        main_ext.cdm1.combine = cdm1_combine;
        main_ext.cdm1.user_data = &probe_state;
    } else if (is(kase, "cycle") && !is(ext, "pfke")) {
        if (is(ext, "rmd1") || is(ext, "cpu2") || is(ext, "cda1")) {
            /* Through an unknown extension: vendor -> main -> vendor. */
            vendor.next = &main_ext.header;
            main_ext.header.next = &vendor;
            desc.next_ext = &vendor;
            runner.next_ext = &vendor;
        } else {
            main_ext.header.next = &main_ext.header;
        }
    } else if (is(kase, "duplicate") && is(ext, "cpe1")) {
        second = main_ext;
        main_ext.header.next = &second.header;
    } else if (is(kase, "qwen") && is(ext, "cdm1")) {
        main_ext.cdm1.qwen = &qwen;
    } else if (is(kase, "qwen_wrong_tag") && is(ext, "cdm1")) {
        qwen.header.tag = wrong_tag(qwen.header.tag);
        main_ext.cdm1.qwen = &qwen;
    } else if (is(kase, "qwen_too_small") && is(ext, "cdm1")) {
        qwen.header.struct_size = (uint32_t)(sizeof qwen - 8u);
        main_ext.cdm1.qwen = &qwen;
    } else if (is(kase, "qwen_version") && is(ext, "cdm1")) {
        qwen.header.version = 2u;
        main_ext.cdm1.qwen = &qwen;
    } else if (is(kase, "all") && is(ext, "cuda")) {
        /* CDD1 -> XYZ1 -> CDA1 -> CDM1 (with its Qwen group). */
        fill_cda1(&second.cda1);
        fill_cdm1(&third.cdm1);
        third.cdm1.qwen = &qwen;
        main_ext.header.next = &vendor;
        vendor.next = &second.header;
        second.header.next = &third.header;
    } else {
        return unknown_case(error);
    }

    if (as_runner) {
        return host->register_runner(host->host_context, &runner, error);
    }
    return host->register_kernel(host->host_context, &desc, error);
}

static void probe_shutdown(void* plugin_state) { (void)plugin_state; }

static const guild_plugin_descriptor_v1_t probe_descriptor = {
    sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "ext_probe",
    "1.0.0",
    probe_init,
    probe_shutdown};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) { return &probe_descriptor; }
