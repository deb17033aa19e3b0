/*
 * The matvec kernels of the llama_ops_avx2 build (llama_ops.c with LLAMA_OPS_AVX2 defined): the
 * same products as the portable llama_matvec and llama_matvec_stored, eight lanes at a time with
 * fused multiply-adds, summed in another order.
 *
 * Only these functions carry the target attribute; the rest of the library (init, registration,
 * validate, the other operations) is compiled for the baseline x86-64, because the host opens
 * the library on any CPU (the registration check at install, dlopen at run time) and must be
 * able to run its init there. The host calls these only through an implementation whose
 * descriptor's required_cpu_isa the CPU has (llama_required_isa below), so that resolution
 * refuses them, naming the missing bits, on a CPU without them.
 *
 * Arithmetic: the f32, f16, bf16 and q4_0 kernels dequantize every weight exactly as the portable
 * build does (an f16 scale times a nibble minus 8 is exact in f32, as is an f16 or bf16 value
 * widened), multiply it by the f32 activation and add it into one of 16 (f32, f16, bf16) or 32
 * (q4_0) partial sums with one rounding (FMA), the partial sums added pairwise at the end, then
 * a row's last elements past a multiple of eight one by one. The q8_0 kernel sums each block's
 * q * x first and applies the block's scale once to that sum (fewer multiplies on its hottest
 * path), so the products are rounded before the scale rather than after. Against the portable
 * index-order sum the difference is a few roundings of n f32 additions: a few ulps of the sum
 * of the products' magnitudes, far inside the decode's logit tolerance.
 */
#ifndef LLAMA_OPS_MATVEC_AVX2_H
#define LLAMA_OPS_MATVEC_AVX2_H

#if !defined(__x86_64__) || !(defined(__GNUC__) || defined(__clang__))
#error "the avx2 build of llama_ops needs x86-64 and GCC or Clang (target attributes); CMake builds it only there"
#endif

#include <immintrin.h>

/* The kernels' instruction sets: F16C too for the types stored with halves (f16 values, the
 * blocks' f16 scales), so that only those implementations declare it. */
#define LLAMA_AVX2 __attribute__((target("avx2,fma")))
#define LLAMA_AVX2_F16C __attribute__((target("avx2,fma,f16c")))

/* The GUILD_CPU_ISA_* bits an implementation of this build requires of the CPU: AVX (the
 * 256-bit float instructions), AVX2 and FMA for every matvec, and F16C for those that convert halves (f16 weights eight at a time, the
 * q8_0 and q4_0 blocks' scales one at a time). The scales could be read with the portable
 * conversion instead, but a call from a kernel to code compiled without AVX costs more than the
 * block it serves (every vector register is caller-saved, and the switch between VEX and legacy
 * SSE code stalls some CPUs), and every CPU with AVX2 has F16C. */
static uint64_t llama_required_isa(const llama_op_t* op) {
    uint64_t isa = GUILD_CPU_ISA_AVX | GUILD_CPU_ISA_AVX2 | GUILD_CPU_ISA_FMA;
    if (op->weight_dtype == GUILD_DTYPE_F16 || op->weight_dtype == GUILD_DTYPE_Q8_0 ||
        op->weight_dtype == GUILD_DTYPE_Q4_0) {
        isa |= GUILD_CPU_ISA_F16C;
    }
    return isa;
}

/* A block's f16 scale at p (unaligned), exactly (subnormals included). */
LLAMA_AVX2_F16C static inline float llama_f16_scale_avx2(const unsigned char* p) {
    return _cvtsh_ss(llama_u16(p));
}

/* The sum of the eight lanes of v, pairwise. */
LLAMA_AVX2 static inline float llama_hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

LLAMA_AVX2 static void llama_matvec_f32_avx2(const float* w, const float* x, float* y, uint64_t n_in,
                                             uint64_t n_out) {
    uint64_t o, i;
    for (o = 0; o < n_out; ++o) {
        const float* row = w + o * n_in;
        __m256 acc0 = _mm256_setzero_ps();
        __m256 acc1 = _mm256_setzero_ps();
        float sum;
        for (i = 0; i + 16u <= n_in; i += 16u) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i), _mm256_loadu_ps(x + i), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i + 8u), _mm256_loadu_ps(x + i + 8u), acc1);
        }
        if (i + 8u <= n_in) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i), _mm256_loadu_ps(x + i), acc0);
            i += 8u;
        }
        sum = llama_hsum_avx2(_mm256_add_ps(acc0, acc1));
        for (; i < n_in; ++i) {
            sum += row[i] * x[i];
        }
        y[o] = sum;
    }
}

/* Eight halves at p (unaligned) as f32, exactly. */
LLAMA_AVX2_F16C static inline __m256 llama_load_f16x8_avx2(const unsigned char* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(const void*)p));
}

LLAMA_AVX2_F16C static void llama_matvec_f16_avx2(const unsigned char* w, const float* x, float* y, uint64_t n_in,
                                                  uint64_t n_out) {
    uint64_t o, i;
    for (o = 0; o < n_out; ++o) {
        const unsigned char* row = w + o * n_in * 2u;
        __m256 acc0 = _mm256_setzero_ps();
        __m256 acc1 = _mm256_setzero_ps();
        float sum;
        for (i = 0; i + 16u <= n_in; i += 16u) {
            acc0 = _mm256_fmadd_ps(llama_load_f16x8_avx2(row + 2u * i), _mm256_loadu_ps(x + i), acc0);
            acc1 = _mm256_fmadd_ps(llama_load_f16x8_avx2(row + 2u * (i + 8u)), _mm256_loadu_ps(x + i + 8u), acc1);
        }
        if (i + 8u <= n_in) {
            acc0 = _mm256_fmadd_ps(llama_load_f16x8_avx2(row + 2u * i), _mm256_loadu_ps(x + i), acc0);
            i += 8u;
        }
        sum = llama_hsum_avx2(_mm256_add_ps(acc0, acc1));
        for (; i < n_in; ++i) {
            sum += _cvtsh_ss(llama_u16(row + 2u * i)) * x[i];
        }
        y[o] = sum;
    }
}

/* Eight bf16 values at p (unaligned) as f32: each the high half of an f32, so a shift. */
LLAMA_AVX2 static inline __m256 llama_load_bf16x8_avx2(const unsigned char* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(const void*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

LLAMA_AVX2 static void llama_matvec_bf16_avx2(const unsigned char* w, const float* x, float* y, uint64_t n_in,
                                              uint64_t n_out) {
    uint64_t o, i;
    for (o = 0; o < n_out; ++o) {
        const unsigned char* row = w + o * n_in * 2u;
        __m256 acc0 = _mm256_setzero_ps();
        __m256 acc1 = _mm256_setzero_ps();
        float sum;
        for (i = 0; i + 16u <= n_in; i += 16u) {
            acc0 = _mm256_fmadd_ps(llama_load_bf16x8_avx2(row + 2u * i), _mm256_loadu_ps(x + i), acc0);
            acc1 = _mm256_fmadd_ps(llama_load_bf16x8_avx2(row + 2u * (i + 8u)), _mm256_loadu_ps(x + i + 8u), acc1);
        }
        if (i + 8u <= n_in) {
            acc0 = _mm256_fmadd_ps(llama_load_bf16x8_avx2(row + 2u * i), _mm256_loadu_ps(x + i), acc0);
            i += 8u;
        }
        sum = llama_hsum_avx2(_mm256_add_ps(acc0, acc1));
        for (; i < n_in; ++i) {
            uint32_t bits = (uint32_t)llama_u16(row + 2u * i) << 16;
            float v;
            memcpy(&v, &bits, sizeof v);
            sum += v * x[i];
        }
        y[o] = sum;
    }
}

/* q8_0: per block, each group of eight int8 widened to f32 and fused with the activations into
 * the block's own sum (the first group multiplied), then the block's sum times its scale d fused
 * into one of two accumulators, blocks alternating between them. The scale is applied once a
 * block rather than to every weight: the weights and activations are the same, only the
 * roundings move (the products q * x are rounded before d scales them), within the same few
 * ulps of the sum of the products' magnitudes as the reordering itself. The first group is peeled
 * out of the block loop: chosen by a condition inside it, the loop ran at 186 tokens/s on
 * decode_bound's q8_0 model against 227-242 peeled; taking two rows at a time, to load each
 * group of activations once for both, ran at 150. */

/* Group g (eight int8 weights) of a q8_0 block as f32, exactly. */
LLAMA_AVX2 static inline __m256 llama_q8_0_group_avx2(const unsigned char* block, int g) {
    __m128i q8 = _mm_loadl_epi64((const __m128i*)(const void*)(block + 2u + 8u * (unsigned)g));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
}

LLAMA_AVX2_F16C static void llama_matvec_q8_0_avx2(const unsigned char* w, const float* x, float* y, uint64_t n_in,
                                              uint64_t n_out) {
    const uint64_t blocks = n_in / 32u;
    const uint64_t stride = blocks * 34u;
    uint64_t o, b;
    for (o = 0; o < n_out; ++o) {
        const unsigned char* row = w + o * stride;
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (b = 0; b < blocks; ++b) {
            const unsigned char* block = row + b * 34u;
            const float* xb = x + b * 32u;
            __m256 sum = _mm256_mul_ps(llama_q8_0_group_avx2(block, 0), _mm256_loadu_ps(xb));
            int g;
            for (g = 1; g < 4; ++g) {
                sum = _mm256_fmadd_ps(llama_q8_0_group_avx2(block, g), _mm256_loadu_ps(xb + 8 * g), sum);
            }
            acc[b & 1u] = _mm256_fmadd_ps(_mm256_set1_ps(llama_f16_scale_avx2(block)), sum, acc[b & 1u]);
        }
        y[o] = llama_hsum_avx2(_mm256_add_ps(acc[0], acc[1]));
    }
}

/* q4_0: per block, the 16 bytes split into their low nibbles (elements 0..15) and high nibbles
 * (16..31), each group of eight widened, less 8, times d (exact), then fused with the activations
 * into one of four accumulators. */
LLAMA_AVX2_F16C static void llama_matvec_q4_0_avx2(const unsigned char* w, const float* x, float* y, uint64_t n_in,
                                              uint64_t n_out) {
    const uint64_t blocks = n_in / 32u;
    const __m128i low_mask = _mm_set1_epi8(0x0f);
    const __m256i eight = _mm256_set1_epi32(8);
    uint64_t o, b;
    for (o = 0; o < n_out; ++o) {
        const unsigned char* row = w + o * blocks * 18u;
        __m256 acc[4];
        int g;
        for (g = 0; g < 4; ++g) {
            acc[g] = _mm256_setzero_ps();
        }
        for (b = 0; b < blocks; ++b) {
            const unsigned char* block = row + b * 18u;
            const float* xb = x + b * 32u;
            const __m256 d = _mm256_set1_ps(llama_f16_scale_avx2(block));
            const __m128i bytes = _mm_loadu_si128((const __m128i*)(const void*)(block + 2u));
            /* Elements 0..15 then 16..31, as 32 bytes of nibbles. */
            const __m128i lo = _mm_and_si128(bytes, low_mask);
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_mask);
            const __m128i groups[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (g = 0; g < 4; ++g) {
                __m256i n = _mm256_sub_epi32(_mm256_cvtepu8_epi32(groups[g]), eight);
                __m256 v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(n));
                acc[g] = _mm256_fmadd_ps(v, _mm256_loadu_ps(xb + 8 * g), acc[g]);
            }
        }
        y[o] = llama_hsum_avx2(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    }
}

/* y = W x with this build's kernel for op's storage type. */
static void llama_matvec_avx2(const llama_op_t* op, const void* w, const float* x, float* y, uint64_t n_in,
                              uint64_t n_out) {
    switch (op->weight_dtype) {
        case GUILD_DTYPE_F16:
            llama_matvec_f16_avx2((const unsigned char*)w, x, y, n_in, n_out);
            return;
        case GUILD_DTYPE_BF16:
            llama_matvec_bf16_avx2((const unsigned char*)w, x, y, n_in, n_out);
            return;
        case GUILD_DTYPE_Q8_0:
            llama_matvec_q8_0_avx2((const unsigned char*)w, x, y, n_in, n_out);
            return;
        case GUILD_DTYPE_Q4_0:
            llama_matvec_q4_0_avx2((const unsigned char*)w, x, y, n_in, n_out);
            return;
        default:
            llama_matvec_f32_avx2((const float*)w, x, y, n_in, n_out);
            return;
    }
}

#endif
