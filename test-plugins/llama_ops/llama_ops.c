/*
 * llama_ops: a runtime module (module ABI 1) with the CPU operations a Llama decode step needs,
 * under the example.llama namespace, each with a GOP1 contract:
 *
 *   op name                    inputs (dims innermost first)            output        params
 *   example.llama.matvec       W [in, out], x [in]                       y [out]       -
 *                              y[o] = sum_i W[o*in + i] * x[i], W stored as f32, f16, bf16, q8_0
 *                              or q4_0 (one implementation per storage type, see below)
 *   example.llama.embed        E [n, rows]                               y [n]         embed
 *                              y = row `row` of E, dequantized to f32; E stored as f32, f16,
 *                              bf16, q8_0 or q4_0 (one implementation per storage type)
 *   example.llama.rmsnorm      x [n], w [n]                              y [n]         rmsnorm
 *                              y = x / sqrt(mean(x^2) + eps) * w
 *   example.llama.rope         x [d, heads] (d even)[, f [d/2]]          y [d, heads]  rope
 *                              pairs (2i, 2i+1) of each head rotated by
 *                              pos * freq_scale * base^(-2i/d) / f[i]  (f absent: 1)
 *   example.llama.attention    q [d, H], k [d, Hkv, T], v [d, Hkv, T]    o [d, H]      -
 *                              per query head h (key/value head h / (H/Hkv)):
 *                              o = softmax(q.k_t / sqrt(d)) over t < T, weighting v_t
 *   example.llama.swiglu       g [n], u [n]                              y [n]         -
 *                              y = g / (1 + exp(-g)) * u
 *   example.llama.add          a [n], b [n]                              y [n]         -
 *   example.llama.argmax       x [n]                                     i [1] (i32)   -
 *                              the first index of the largest value
 *
 * Every other tensor is f32 (argmax's output i32); every tensor is packed (no explicit strides),
 * in host memory, aligned to 4 bytes; calls are host-blocking; op version 1.0.0 (rope 1.1.0),
 * priority 10. The attention's key/value length T is part of its tensors' shapes, so a decode
 * re-resolves (or reshapes) it as the cache grows. It keeps no scratch: the softmax is computed
 * online, one pass over the cache, which
 * bounds d to LLAMA_MAX_HEAD_DIM. Validate refuses every shape and record it does not compute.
 *
 * Weight storage types. The weight of a matvec and the table of an embed are stored as a GGUF
 * file stores them, and the descriptor says how: the dtype is GUILD_DTYPE_F32, F16, BF16, Q8_0 or
 * Q4_0, dims[0] (the row length in elements) is a whole number of blocks, and each row is
 * dims[0] / 32 blocks of 34 bytes (q8_0: an f16 scale d, then 32 int8 q; value d * q) or 18
 * bytes (q4_0: an f16 scale d, then 16 bytes whose low nibbles are elements 0..15 and high
 * nibbles 16..31; value d * (nibble - 8)); f16 and bf16 are one 2-byte element each. The host
 * checks the descriptor (a row of whole blocks, no stride on the first axis, the byte extent of
 * the buffer, the alignment) before anything here runs. Products are computed on the dequantized
 * values in f32 with f32 activations (llama.cpp rounds the activation to Q8_0 first for q8_0 and
 * q4_0 weights; this module does not).
 *
 * Why one implementation per storage type, under one operation name, rather than an operation
 * per type (example.llama.matvec_q8_0...): the storage type is a property of the tensor, which
 * the spec puts in the descriptor ("dtype IDs include existing quantized formats"), and what the
 * operation computes does not change with it. A runner asks for example.llama.matvec with its
 * weight's real descriptor and resolution picks the implementation that takes it; another
 * provider (a faster build, a GPU) competes per type by priority without the runner knowing
 * implementation names. GOP1's input_dtype constrains every input, and a matvec's inputs are
 * heterogeneous (W in its storage type, x in f32), so the non-f32 matvecs declare
 * GUILD_DTYPE_ANY and their validate takes only their own type for W and f32 for x, as the spec
 * says heterogeneous contracts do; the f32 matvec keeps its F32 contract. The embed has one
 * input, so each embed's contract names its table's type itself and the host's own dtype check
 * chooses among them before any validate runs.
 *
 * Parameter records (execute needs them; a query may carry them or not, and validate checks
 * them when it does):
 *   rmsnorm: { uint32_t struct_size = 8; float eps; }             eps > 0 and finite
 *   rope:    { uint32_t struct_size = 12; uint32_t position; float freq_base; }  base > 0
 *   embed:   { uint32_t struct_size = 8; uint32_t row; }           row < rows
 *            { uint32_t struct_size = 16; uint32_t position; float freq_base; float freq_scale; }
 *                                                                    base > 0, scale > 0
 *
 * Rope 1.1.0 extends 1.0.0 compatibly, the two ways GOP1 lets an operation grow without a new
 * name: the record grows (its struct_size tells the 12-byte record of a 1.0.0 caller, which
 * means freq_scale 1, from the 16-byte one), and the frequency factors of Llama 3's
 * rope_freqs.weight travel as an optional second input tensor rather than in the record. The
 * factors are model data, d/2 floats that the caller keeps for the model's life: as a tensor
 * the host checks their dtype, shape and buffer length against the negotiated contract on every
 * call, where a pointer inside the record would be an unchecked borrow the ABI cannot describe.
 * freq_scale is llama.cpp's (1 / the linear scaling factor): positions are scaled by it. An
 * older module (max_inputs 1, 12-byte record only) refuses a caller that needs either at
 * resolve (the second input) or at the first call (the record's size), never silently.
 *
 * Numerics: deterministic, f32 arithmetic and accumulation, ordered reductions (index order;
 * not the AVX2 build's matvecs, below).
 * The module keeps no state: each operation's user_data is a static llama_op_t.
 *
 * Built with LLAMA_OPS_AVX2 defined (x86-64, GCC or Clang; the llama_ops_avx2 library, package
 * example.llama_ops_avx2), it is a competing provider of the matvecs alone: one implementation
 * per storage type, example.llama.matvec[.<dtype>].avx2, at priority 20 (above the portable 10),
 * each declaring in its descriptor's required_cpu_isa the instructions its kernel uses (AVX,
 * AVX2 and FMA; F16C too for the types stored with halves: f16, and q8_0's and q4_0's scales). Its
 * kernels are in matvec_avx2.h; everything else, validate included, is this file's, compiled
 * for the baseline x86-64 (see there why). A runner that installs both
 * modules and asks for example.llama.matvec gets the AVX2 kernel on a CPU that has those bits and
 * the portable one elsewhere, the host choosing; the two compute the same values within a few
 * roundings of the sum, summed in another order (so the AVX2 build does not declare GUILD_NUMERICS_ORDERED_REDUCTION, and a
 * caller that requires it gets the portable build on any CPU).
 *
 * Built with LLAMA_OPS_MARKER defined (a string naming the build), every execute that computed
 * something also appends "<marker> <impl id>" to $GUILD_TEST_MARKER_DIR/llama_ops.log, so that
 * a test holding two builds installed as two versions can tell which one ran each call.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#ifdef LLAMA_OPS_MARKER
#include "guild_test_marker.h"
#endif

#define LLAMA_OP_MAGIC 0x11a3a0f5u
#define LLAMA_MAX_HEAD_DIM 256u

typedef enum llama_kind {
    LLAMA_MATVEC,
    LLAMA_RMSNORM,
    LLAMA_ROPE,
    LLAMA_ATTENTION,
    LLAMA_SWIGLU,
    LLAMA_ADD,
    LLAMA_ARGMAX,
    LLAMA_EMBED
} llama_kind;

typedef struct llama_op_t {
    uint32_t magic;
    llama_kind kind;
    const char* op_name;
    const char* impl_id;
    /* The inputs every call has, and how many more it may have (rope's frequency factors). */
    uint32_t inputs;
    uint32_t optional_inputs;
    /* The storage type of a matvec's W or an embed's table; F32 for the other operations. */
    uint32_t weight_dtype;
    uint32_t output_dtype;
    uint32_t op_version;
} llama_op_t;

typedef struct llama_rmsnorm_params_v1 {
    uint32_t struct_size;
    float eps;
} llama_rmsnorm_params_v1;

typedef struct llama_rope_params_v1 {
    uint32_t struct_size;
    uint32_t position;
    float freq_base;
} llama_rope_params_v1;

/* The 1.1.0 record: v1's fields, then the linear scaling of positions. */
typedef struct llama_rope_params_v2 {
    uint32_t struct_size;
    uint32_t position;
    float freq_base;
    float freq_scale;
} llama_rope_params_v2;

typedef struct llama_embed_params_v1 {
    uint32_t struct_size;
    uint32_t row;
} llama_embed_params_v1;

#define LLAMA_F32 GUILD_DTYPE_F32
#define LLAMA_V(major, minor, patch) GUILD_KERNEL_ABI_MAKE_VERSION(major, minor, patch)
#ifdef LLAMA_OPS_AVX2
/* The AVX2 build provides the matvecs only: the other operations are a small share of a decode
 * step's work, and the portable build's serve them. */
static llama_op_t llama_ops[] = {
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.avx2", 2u, 0u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.f16.avx2", 2u, 0u, GUILD_DTYPE_F16,
     LLAMA_F32, LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.bf16.avx2", 2u, 0u, GUILD_DTYPE_BF16,
     LLAMA_F32, LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.q8_0.avx2", 2u, 0u, GUILD_DTYPE_Q8_0,
     LLAMA_F32, LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.q4_0.avx2", 2u, 0u, GUILD_DTYPE_Q4_0,
     LLAMA_F32, LLAMA_V(1, 0, 0)},
};
#else
static llama_op_t llama_ops[] = {
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.cpu", 2u, 0u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_RMSNORM, "example.llama.rmsnorm", "example.llama.rmsnorm.cpu", 2u, 0u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_ROPE, "example.llama.rope", "example.llama.rope.cpu", 1u, 1u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 1, 0)},
    {LLAMA_OP_MAGIC, LLAMA_ATTENTION, "example.llama.attention", "example.llama.attention.cpu", 3u, 0u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_SWIGLU, "example.llama.swiglu", "example.llama.swiglu.cpu", 2u, 0u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_ADD, "example.llama.add", "example.llama.add.cpu", 2u, 0u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_ARGMAX, "example.llama.argmax", "example.llama.argmax.cpu", 1u, 0u, LLAMA_F32, GUILD_DTYPE_I32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.f16.cpu", 2u, 0u, GUILD_DTYPE_F16, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.bf16.cpu", 2u, 0u, GUILD_DTYPE_BF16, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.q8_0.cpu", 2u, 0u, GUILD_DTYPE_Q8_0, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_MATVEC, "example.llama.matvec", "example.llama.matvec.q4_0.cpu", 2u, 0u, GUILD_DTYPE_Q4_0, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_EMBED, "example.llama.embed", "example.llama.embed.f32.cpu", 1u, 0u, LLAMA_F32, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_EMBED, "example.llama.embed", "example.llama.embed.f16.cpu", 1u, 0u, GUILD_DTYPE_F16, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_EMBED, "example.llama.embed", "example.llama.embed.bf16.cpu", 1u, 0u, GUILD_DTYPE_BF16, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_EMBED, "example.llama.embed", "example.llama.embed.q8_0.cpu", 1u, 0u, GUILD_DTYPE_Q8_0, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
    {LLAMA_OP_MAGIC, LLAMA_EMBED, "example.llama.embed", "example.llama.embed.q4_0.cpu", 1u, 0u, GUILD_DTYPE_Q4_0, LLAMA_F32,
     LLAMA_V(1, 0, 0)},
};
#endif

/* The name of a storage type, for messages. */
static const char* llama_dtype_name(uint32_t dtype) {
    switch (dtype) {
        case GUILD_DTYPE_F32:
            return "f32";
        case GUILD_DTYPE_F16:
            return "f16";
        case GUILD_DTYPE_BF16:
            return "bf16";
        case GUILD_DTYPE_Q8_0:
            return "q8_0";
        case GUILD_DTYPE_Q4_0:
            return "q4_0";
        case GUILD_DTYPE_I32:
            return "i32";
        default:
            return "another dtype";
    }
}

/* Elements per block of a storage type (1 for the plain ones). */
static uint64_t llama_block_elements(uint32_t dtype) {
    return dtype == GUILD_DTYPE_Q8_0 || dtype == GUILD_DTYPE_Q4_0 ? 32u : 1u;
}

/* Bytes per block of a storage type. */
static uint64_t llama_block_bytes(uint32_t dtype) {
    switch (dtype) {
        case GUILD_DTYPE_F16:
        case GUILD_DTYPE_BF16:
            return 2u;
        case GUILD_DTYPE_Q8_0:
            return 34u;
        case GUILD_DTYPE_Q4_0:
            return 18u;
        default:
            return 4u;
    }
}

/* IEEE binary16 to binary32, exactly (subnormals, infinities and NaNs included). */
static float llama_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exponent == 0x1fu) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0u) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0u) {
        bits = sign;
    } else {
        /* A subnormal, mantissa * 2^-24: shift the leading one into the implicit bit. */
        exponent = 113u;
        while ((mantissa & 0x400u) == 0u) {
            mantissa <<= 1;
            --exponent;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* A little-endian 16-bit word at p, which may be unaligned (a block's scale is at 2 mod 4). */
static uint16_t llama_u16(const unsigned char* p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

/*
 * Dequantizes `count` elements of a row of `dtype` starting at element `first`, a multiple of 32
 * (a block boundary, for the block types), into out[0..count). The block types take count = 32.
 */
static void llama_dequantize(uint32_t dtype, const unsigned char* row, uint64_t first, uint64_t count, float* out) {
    uint64_t i;
    switch (dtype) {
        case GUILD_DTYPE_F16:
            for (i = 0; i < count; ++i) {
                out[i] = llama_f16_to_f32(llama_u16(row + 2u * (first + i)));
            }
            return;
        case GUILD_DTYPE_BF16:
            for (i = 0; i < count; ++i) {
                uint32_t bits = (uint32_t)llama_u16(row + 2u * (first + i)) << 16;
                memcpy(&out[i], &bits, sizeof bits);
            }
            return;
        case GUILD_DTYPE_Q8_0: {
            const unsigned char* block = row + (first / 32u) * 34u;
            float d = llama_f16_to_f32(llama_u16(block));
            for (i = 0; i < 32u; ++i) {
                out[i] = d * (float)(int8_t)block[2u + i];
            }
            return;
        }
        case GUILD_DTYPE_Q4_0: {
            const unsigned char* block = row + (first / 32u) * 18u;
            float d = llama_f16_to_f32(llama_u16(block));
            for (i = 0; i < 16u; ++i) {
                out[i] = d * (float)((int)(block[2u + i] & 0x0fu) - 8);
                out[i + 16u] = d * (float)((int)(block[2u + i] >> 4) - 8);
            }
            return;
        }
        default:
            memcpy(out, row + 4u * first, (size_t)(4u * count));
            return;
    }
}

#ifdef LLAMA_OPS_AVX2
#include "matvec_avx2.h"
#define LLAMA_PRIORITY 20
/* Deterministic and accumulated in f32, but not in index order: the kernels sum in eight lanes,
 * so a caller that asks for GUILD_NUMERICS_ORDERED_REDUCTION gets the portable build. */
#define LLAMA_NUMERICS (GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION)
#else
/* The portable build runs on any CPU. */
static uint64_t llama_required_isa(const llama_op_t* op) {
    (void)op;
    return 0u;
}
#define LLAMA_PRIORITY 10
#define LLAMA_NUMERICS \
    (GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION | GUILD_NUMERICS_ORDERED_REDUCTION)
#endif

static const llama_op_t* llama_op(void* user_data) {
    const llama_op_t* op = (const llama_op_t*)user_data;
    return op != NULL && op->magic == LLAMA_OP_MAGIC ? op : NULL;
}

/* Whether t has rank `rank`, no explicit strides and no zero extent. */
static int llama_packed(const guild_tensor_desc_v1_t* t, uint32_t rank) {
    uint32_t i;
    if (t->rank != rank) {
        return 0;
    }
    for (i = 0; i < rank; ++i) {
        if (t->strides[i] != 0u || t->dims[i] == 0u || t->dims[i] > 0x7fffffffu) {
            return 0;
        }
    }
    return 1;
}

static int llama_same_shape(const guild_tensor_desc_v1_t* a, const guild_tensor_desc_v1_t* b) {
    uint32_t i;
    if (a->rank != b->rank) {
        return 0;
    }
    for (i = 0; i < a->rank; ++i) {
        if (a->dims[i] != b->dims[i]) {
            return 0;
        }
    }
    return 1;
}

/* Checks a parameter record; `required` when executing; `rows` bounds an embed's row. Writes the reason
 * and returns 0 when bad. */
static int llama_check_params(const llama_op_t* op, const void* params, size_t size, uint64_t rows, int required,
                              char* why, size_t why_size) {
    if (op->kind == LLAMA_RMSNORM) {
        llama_rmsnorm_params_v1 p;
        if (params == NULL && size == 0u && !required) {
            return 1;
        }
        if (params == NULL || size != sizeof p) {
            (void)snprintf(why, why_size, "rmsnorm needs its %u-byte parameter record (eps)", (unsigned)sizeof p);
            return 0;
        }
        memcpy(&p, params, sizeof p);
        if (p.struct_size != (uint32_t)sizeof p || !(p.eps > 0.0f) || !isfinite(p.eps)) {
            (void)snprintf(why, why_size, "rmsnorm's record needs struct_size %u and a finite eps > 0",
                           (unsigned)sizeof p);
            return 0;
        }
        return 1;
    }
    if (op->kind == LLAMA_EMBED) {
        llama_embed_params_v1 p;
        if (params == NULL && size == 0u && !required) {
            return 1;
        }
        if (params == NULL || size != sizeof p) {
            (void)snprintf(why, why_size, "embed needs its %u-byte parameter record (row)", (unsigned)sizeof p);
            return 0;
        }
        memcpy(&p, params, sizeof p);
        if (p.struct_size != (uint32_t)sizeof p || (uint64_t)p.row >= rows) {
            (void)snprintf(why, why_size, "embed's record needs struct_size %u and a row below %llu",
                           (unsigned)sizeof p, (unsigned long long)rows);
            return 0;
        }
        return 1;
    }
    if (op->kind == LLAMA_ROPE) {
        llama_rope_params_v2 p;
        if (params == NULL && size == 0u && !required) {
            return 1;
        }
        /* Either record, told apart by its size; the v1 record means no scaling. */
        if (params == NULL || (size != sizeof(llama_rope_params_v1) && size != sizeof p)) {
            (void)snprintf(why, why_size,
                           "rope needs its %u-byte parameter record (position, freq_base) or the %u-byte one "
                           "(and freq_scale)",
                           (unsigned)sizeof(llama_rope_params_v1), (unsigned)sizeof p);
            return 0;
        }
        memset(&p, 0, sizeof p);
        memcpy(&p, params, size);
        if (size == sizeof(llama_rope_params_v1)) {
            p.freq_scale = 1.0f;
        }
        if (p.struct_size != (uint32_t)size || !(p.freq_base > 0.0f) || !isfinite(p.freq_base) ||
            !(p.freq_scale > 0.0f) || !isfinite(p.freq_scale)) {
            (void)snprintf(why, why_size,
                           "rope's record needs struct_size equal to its size, a finite freq_base > 0 and a "
                           "finite freq_scale > 0");
            return 0;
        }
        return 1;
    }
    if (params != NULL || size != 0u) {
        (void)snprintf(why, why_size, "%s takes no parameter record", op->op_name);
        return 0;
    }
    return 1;
}

/* The shape rules of each operation (the dtypes, counts and layouts are in the GOP1 contract). */
static int llama_check_shapes(const llama_op_t* op, const guild_tensor_desc_v1_t* in, size_t n_in,
                              const guild_tensor_desc_v1_t* out, size_t n_out, char* why, size_t why_size) {
    size_t i;
    if (n_in < op->inputs || n_in > op->inputs + op->optional_inputs || n_out != 1u || in == NULL || out == NULL) {
        if (op->optional_inputs != 0u) {
            (void)snprintf(why, why_size, "%s takes %u to %u inputs and one output", op->op_name,
                           (unsigned)op->inputs, (unsigned)(op->inputs + op->optional_inputs));
        } else {
            (void)snprintf(why, why_size, "%s takes %u inputs and one output", op->op_name, (unsigned)op->inputs);
        }
        return 0;
    }
    for (i = 0; i < n_in; ++i) {
        /* The weight (input 0 of a matvec or an embed) in this implementation's storage type, every
         * other input f32. */
        uint32_t want = i == 0u ? op->weight_dtype : GUILD_DTYPE_F32;
        if (in[i].dtype != want) {
            (void)snprintf(why, why_size, "input %u must be %s", (unsigned)i, llama_dtype_name(want));
            return 0;
        }
    }
    if (out[0].dtype != op->output_dtype) {
        (void)snprintf(why, why_size, "the output must be %s", llama_dtype_name(op->output_dtype));
        return 0;
    }
    switch (op->kind) {
        case LLAMA_MATVEC:
            if (!llama_packed(&in[0], 2u) || !llama_packed(&in[1], 1u) || !llama_packed(&out[0], 1u) ||
                in[1].dims[0] != in[0].dims[0] || out[0].dims[0] != in[0].dims[1]) {
                (void)snprintf(why, why_size, "matvec takes packed W [in, out], x [in] and y [out]");
                return 0;
            }
            /* The host refuses a row of partial blocks before validate; checked again so that
             * the arithmetic never reads past a row on a host that did not. */
            if (in[0].dims[0] % llama_block_elements(op->weight_dtype) != 0u) {
                (void)snprintf(why, why_size, "a %s row is whole blocks of 32", llama_dtype_name(op->weight_dtype));
                return 0;
            }
            return 1;
        case LLAMA_EMBED:
            if (!llama_packed(&in[0], 2u) || !llama_packed(&out[0], 1u) || out[0].dims[0] != in[0].dims[0]) {
                (void)snprintf(why, why_size, "embed takes a packed table E [n, rows] and writes y [n]");
                return 0;
            }
            if (in[0].dims[0] % llama_block_elements(op->weight_dtype) != 0u) {
                (void)snprintf(why, why_size, "a %s row is whole blocks of 32", llama_dtype_name(op->weight_dtype));
                return 0;
            }
            return 1;
        case LLAMA_RMSNORM:
        case LLAMA_SWIGLU:
        case LLAMA_ADD:
            if (!llama_packed(&in[0], 1u) || !llama_same_shape(&in[0], &in[1]) || !llama_packed(&in[1], 1u) ||
                !llama_same_shape(&in[0], &out[0]) || !llama_packed(&out[0], 1u)) {
                (void)snprintf(why, why_size, "%s takes two packed vectors of one length and writes a third",
                               op->op_name);
                return 0;
            }
            return 1;
        case LLAMA_ROPE:
            if (!llama_packed(&in[0], 2u) || !llama_same_shape(&in[0], &out[0]) || !llama_packed(&out[0], 2u) ||
                in[0].dims[0] % 2u != 0u) {
                (void)snprintf(why, why_size, "rope takes packed x [d, heads] with d even and writes that shape");
                return 0;
            }
            if (n_in == 2u && (!llama_packed(&in[1], 1u) || in[1].dims[0] != in[0].dims[0] / 2u)) {
                (void)snprintf(why, why_size, "rope's frequency factors are a packed vector of d/2 = %llu",
                               (unsigned long long)(in[0].dims[0] / 2u));
                return 0;
            }
            return 1;
        case LLAMA_ATTENTION: {
            const guild_tensor_desc_v1_t* q = &in[0];
            const guild_tensor_desc_v1_t* k = &in[1];
            const guild_tensor_desc_v1_t* v = &in[2];
            if (!llama_packed(q, 2u) || !llama_packed(k, 3u) || !llama_same_shape(k, v) || !llama_packed(v, 3u) ||
                !llama_same_shape(q, &out[0]) || !llama_packed(&out[0], 2u) || k->dims[0] != q->dims[0] ||
                q->dims[1] % k->dims[1] != 0u) {
                (void)snprintf(why, why_size,
                               "attention takes packed q [d, H], k and v [d, Hkv, T] with Hkv dividing H, and "
                               "writes [d, H]");
                return 0;
            }
            if (q->dims[0] > LLAMA_MAX_HEAD_DIM) {
                (void)snprintf(why, why_size, "head size %llu is over this attention's %u",
                               (unsigned long long)q->dims[0], (unsigned)LLAMA_MAX_HEAD_DIM);
                return 0;
            }
            return 1;
        }
        case LLAMA_ARGMAX:
            if (!llama_packed(&in[0], 1u) || !llama_packed(&out[0], 1u) || out[0].dims[0] != 1u) {
                (void)snprintf(why, why_size, "argmax takes a packed vector and writes one i32");
                return 0;
            }
            return 1;
    }
    (void)snprintf(why, why_size, "unknown operation");
    return 0;
}

static guild_status_t llama_validate(void* user_data, const guild_operation_query_v1_t* query,
                                     guild_error_info_t* error) {
    const llama_op_t* op = llama_op(user_data);
    char why[GUILD_ERROR_MESSAGE_CAPACITY];
    if (op == NULL || query == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.llama",
                                    "validate needs the operation's state and a query");
    }
    if (!llama_check_shapes(op, query->inputs, query->input_count, query->outputs, query->output_count, why,
                            sizeof why) ||
        !llama_check_params(op, query->params, query->params_size, query->inputs[0].dims[1], 0, why, sizeof why)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->impl_id, why);
    }
    return GUILD_STATUS_OK;
}

static guild_status_t llama_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                          guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    const llama_op_t* op = llama_op(user_data);
    if (op == NULL || query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.llama",
                                    "query_scratch needs the operation's state, a query and an output record");
    }
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

#ifndef LLAMA_OPS_AVX2
static void llama_matvec(const float* w, const float* x, float* y, uint64_t n_in, uint64_t n_out) {
    uint64_t o, i;
    for (o = 0; o < n_out; ++o) {
        const float* row = w + o * n_in;
        float acc = 0.0f;
        for (i = 0; i < n_in; ++i) {
            acc += row[i] * x[i];
        }
        y[o] = acc;
    }
}

/* y = W x for W stored as `dtype`: each row dequantized 32 elements at a time and multiplied in f32,
 * summed in index order as the f32 matvec does. */
static void llama_matvec_stored(uint32_t dtype, const unsigned char* w, const float* x, float* y, uint64_t n_in,
                                uint64_t n_out) {
    const uint64_t row_bytes = n_in / llama_block_elements(dtype) * llama_block_bytes(dtype);
    uint64_t o, start, i;
    float chunk[32];
    for (o = 0; o < n_out; ++o) {
        const unsigned char* row = w + o * row_bytes;
        float acc = 0.0f;
        for (start = 0; start < n_in; start += 32u) {
            const uint64_t count = n_in - start < 32u ? n_in - start : 32u;
            llama_dequantize(dtype, row, start, count, chunk);
            for (i = 0; i < count; ++i) {
                acc += chunk[i] * x[start + i];
            }
        }
        y[o] = acc;
    }
}
#endif

/* y = row `row` of the table E [n, rows] stored as `dtype`, as f32. */
static void llama_embed(uint32_t dtype, const unsigned char* table, float* y, uint64_t n, uint32_t row) {
    const uint64_t row_bytes = n / llama_block_elements(dtype) * llama_block_bytes(dtype);
    const unsigned char* r = table + (uint64_t)row * row_bytes;
    uint64_t start;
    for (start = 0; start < n; start += 32u) {
        const uint64_t count = n - start < 32u ? n - start : 32u;
        llama_dequantize(dtype, r, start, count, y + start);
    }
}

static void llama_rmsnorm(const float* x, const float* w, float* y, uint64_t n, float eps) {
    uint64_t i;
    float sum = 0.0f;
    float scale;
    for (i = 0; i < n; ++i) {
        sum += x[i] * x[i];
    }
    scale = 1.0f / sqrtf(sum / (float)n + eps);
    for (i = 0; i < n; ++i) {
        y[i] = x[i] * scale * w[i];
    }
}

/* `factors` NULL means every factor is 1, so that the 1.0.0 arithmetic is unchanged. */
static void llama_rope(const float* x, const float* factors, float* y, uint64_t d, uint64_t heads, uint32_t pos,
                       float base, float freq_scale) {
    uint64_t h, i;
    for (i = 0; i < d / 2u; ++i) {
        /* The angle in double, rounded once, as the reference computes it: llama.cpp's
         * theta = pos * freq_scale * base^(-2i/d) / factor[i] (its rope with freq_factors and
         * linear scaling, where YaRN's extrapolation mix is off). */
        double theta = (double)pos * (double)freq_scale * pow((double)base, -2.0 * (double)i / (double)d);
        float c, s;
        if (factors != NULL) {
            theta /= (double)factors[i];
        }
        c = (float)cos(theta);
        s = (float)sin(theta);
        for (h = 0; h < heads; ++h) {
            float x0 = x[h * d + 2u * i];
            float x1 = x[h * d + 2u * i + 1u];
            y[h * d + 2u * i] = x0 * c - x1 * s;
            y[h * d + 2u * i + 1u] = x0 * s + x1 * c;
        }
    }
}

static void llama_attention(const float* q, const float* k, const float* v, float* o, uint64_t d, uint64_t heads,
                            uint64_t kv_heads, uint64_t len) {
    uint64_t h, t, i;
    const uint64_t group = heads / kv_heads;
    const float scale = 1.0f / sqrtf((float)d);
    for (h = 0; h < heads; ++h) {
        const float* qh = q + h * d;
        const uint64_t kv = h / group;
        float acc[LLAMA_MAX_HEAD_DIM];
        float max = -INFINITY;
        float sum = 0.0f;
        for (i = 0; i < d; ++i) {
            acc[i] = 0.0f;
        }
        for (t = 0; t < len; ++t) {
            const float* kt = k + (t * kv_heads + kv) * d;
            const float* vt = v + (t * kv_heads + kv) * d;
            float s = 0.0f;
            float weight;
            for (i = 0; i < d; ++i) {
                s += qh[i] * kt[i];
            }
            s *= scale;
            if (s > max) {
                /* A new maximum: rescale what was accumulated against the old one. */
                float shrink = expf(max - s);
                sum *= shrink;
                for (i = 0; i < d; ++i) {
                    acc[i] *= shrink;
                }
                max = s;
            }
            weight = expf(s - max);
            sum += weight;
            for (i = 0; i < d; ++i) {
                acc[i] += weight * vt[i];
            }
        }
        for (i = 0; i < d; ++i) {
            o[h * d + i] = acc[i] / sum;
        }
    }
}

static guild_status_t llama_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const llama_op_t* op = llama_op(user_data);
    char why[GUILD_ERROR_MESSAGE_CAPACITY];
    const guild_tensor_desc_v1_t* in;
    const guild_tensor_desc_v1_t* out;
    size_t i;
    if (op == NULL || args == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.llama",
                                    "execute needs the operation's state and arguments");
    }
    if (args->sync_mode != GUILD_SYNC_HOST_BLOCKING) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->impl_id,
                                    "these CPU operations run host-blocking only");
    }
    in = args->inputs;
    out = args->outputs;
    if (!llama_check_shapes(op, in, args->input_count, out, args->output_count, why, sizeof why) ||
        !llama_check_params(op, args->params, args->params_size, in[0].dims[1], 1, why, sizeof why)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->impl_id, why);
    }
    for (i = 0; i < args->input_count; ++i) {
        if (in[i].data == NULL) {
            return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->impl_id,
                                        "an input's data pointer is NULL");
        }
    }
    if (out[0].data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->impl_id,
                                    "the output's data pointer is NULL");
    }
    switch (op->kind) {
        case LLAMA_MATVEC:
#ifdef LLAMA_OPS_AVX2
            llama_matvec_avx2(op, in[0].data, (const float*)in[1].data, (float*)out[0].data, in[0].dims[0],
                              in[0].dims[1]);
#else
            if (op->weight_dtype == GUILD_DTYPE_F32) {
                llama_matvec((const float*)in[0].data, (const float*)in[1].data, (float*)out[0].data,
                             in[0].dims[0], in[0].dims[1]);
            } else {
                llama_matvec_stored(op->weight_dtype, (const unsigned char*)in[0].data, (const float*)in[1].data,
                                    (float*)out[0].data, in[0].dims[0], in[0].dims[1]);
            }
#endif
            break;
        case LLAMA_EMBED: {
            llama_embed_params_v1 p;
            memcpy(&p, args->params, sizeof p);
            llama_embed(op->weight_dtype, (const unsigned char*)in[0].data, (float*)out[0].data, in[0].dims[0],
                        p.row);
            break;
        }
        case LLAMA_RMSNORM: {
            llama_rmsnorm_params_v1 p;
            memcpy(&p, args->params, sizeof p);
            llama_rmsnorm((const float*)in[0].data, (const float*)in[1].data, (float*)out[0].data, in[0].dims[0],
                          p.eps);
            break;
        }
        case LLAMA_ROPE: {
            llama_rope_params_v2 p;
            if (args->input_count == 2u) {
                const float* f = (const float*)in[1].data;
                uint64_t j;
                for (j = 0; j < in[1].dims[0]; ++j) {
                    if (!(f[j] > 0.0f) || !isfinite(f[j])) {
                        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->impl_id,
                                                    "rope's frequency factors must be finite and > 0");
                    }
                }
            }
            memcpy(&p, args->params, args->params_size);
            if (args->params_size == sizeof(llama_rope_params_v1)) {
                p.freq_scale = 1.0f;
            }
            llama_rope((const float*)in[0].data, args->input_count == 2u ? (const float*)in[1].data : NULL,
                       (float*)out[0].data, in[0].dims[0], in[0].dims[1], p.position, p.freq_base, p.freq_scale);
            break;
        }
        case LLAMA_ATTENTION:
            llama_attention((const float*)in[0].data, (const float*)in[1].data, (const float*)in[2].data,
                            (float*)out[0].data, in[0].dims[0], in[0].dims[1], in[1].dims[1], in[1].dims[2]);
            break;
        case LLAMA_SWIGLU: {
            const float* g = (const float*)in[0].data;
            const float* u = (const float*)in[1].data;
            float* y = (float*)out[0].data;
            uint64_t j;
            for (j = 0; j < in[0].dims[0]; ++j) {
                y[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
            }
            break;
        }
        case LLAMA_ADD: {
            const float* a = (const float*)in[0].data;
            const float* b = (const float*)in[1].data;
            float* y = (float*)out[0].data;
            uint64_t j;
            for (j = 0; j < in[0].dims[0]; ++j) {
                y[j] = a[j] + b[j];
            }
            break;
        }
        case LLAMA_ARGMAX: {
            const float* x = (const float*)in[0].data;
            uint64_t j, best = 0u;
            for (j = 1; j < in[0].dims[0]; ++j) {
                if (x[j] > x[best]) {
                    best = j;
                }
            }
            *(int32_t*)out[0].data = (int32_t)best;
            break;
        }
    }
#ifdef LLAMA_OPS_MARKER
    {
        char line[128];
        (void)snprintf(line, sizeof line, "%s %s", LLAMA_OPS_MARKER, op->impl_id);
        guild_test_marker("llama_ops", line);
    }
#endif
    return GUILD_STATUS_OK;
}

static guild_status_t llama_register(const guild_host_api_v1_t* host, llama_op_t* op, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.header.next = NULL;
    gop.op_version = op->op_version;
    gop.capabilities = 0u;
    gop.numerics = LLAMA_NUMERICS;
    /* A matvec over stored weights has heterogeneous inputs (W in its type, x in f32): the
     * contract leaves the dtypes to validate, as the spec says such contracts do. Every other
     * implementation's inputs share one dtype, which the contract names. */
    gop.input_dtype =
        op->kind == LLAMA_MATVEC && op->weight_dtype != GUILD_DTYPE_F32 ? GUILD_DTYPE_ANY : op->weight_dtype;
    gop.output_dtype = op->output_dtype;
    gop.min_inputs = op->inputs;
    gop.max_inputs = op->inputs + op->optional_inputs;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS;
    gop.memory_spaces = GUILD_MEMORY_HOST;
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = 3u;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = llama_validate;
    gop.query_scratch = llama_query_scratch;
    gop.execute = llama_execute;
    gop.user_data = op;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = op->impl_id;
    desc.op_name = op->op_name;
    desc.priority = LLAMA_PRIORITY;
    desc.required_cpu_isa = llama_required_isa(op);
    desc.user_data = op;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static guild_status_t llama_ops_init(const guild_host_api_v1_t* host, void** plugin_state,
                                     guild_error_info_t* error) {
    size_t i;
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.llama",
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.llama",
                                    "host table is smaller than the Kernel ABI v1 base or lacks register_kernel");
    }
    if (GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, "example.llama",
                                    "host speaks another Kernel ABI major version");
    }
    for (i = 0; i < sizeof llama_ops / sizeof llama_ops[0]; ++i) {
        guild_status_t status = llama_register(host, &llama_ops[i], error);
        if (status != GUILD_STATUS_OK) {
            return status;
        }
    }
    return GUILD_STATUS_OK;
}

static void llama_ops_shutdown(void* plugin_state) {
    (void)plugin_state;
}

#ifdef LLAMA_OPS_AVX2
#define LLAMA_OPS_NAME "llama_ops_avx2"
#else
#define LLAMA_OPS_NAME "llama_ops"
#endif

#ifndef LLAMA_OPS_VERSION
#define LLAMA_OPS_VERSION "1.0.0"
#endif

static const guild_plugin_descriptor_v1_t llama_ops_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    LLAMA_OPS_NAME,
    LLAMA_OPS_VERSION,
    llama_ops_init,
    llama_ops_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &llama_ops_descriptor;
}
