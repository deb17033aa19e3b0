/*
 * Guild Kernel ABI v1 (SDK 1.5): the frozen plugin entry point, kernel and runner descriptors,
 * the host callback table and the shared vocabulary (status codes, error records, extension
 * headers, backends, dtypes, device capabilities) that every other Guild header builds on.
 *
 * This header is C99 and C++17 clean, self-contained and safe to include more than once. It
 * declares plain data and function-pointer types only: no C++ types, no exceptions and no GPU SDK
 * types cross this boundary. The conventions every call follows (status returns, outputs written
 * only on success, ownership of borrowed pointers, how structs grow) are written down in
 * abi-headers/README.md.
 *
 * Layouts declared here are frozen for Kernel ABI 1.x. New functionality arrives as size-, tag-
 * and version-checked extensions linked through `next_ext`, or as fields appended at the end of a
 * struct whose readers check `struct_size` first.
 */
#ifndef GUILD_ABI_KERNEL_ABI_H
#define GUILD_ABI_KERNEL_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Versions                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * A packed version keeps the major number in bits 24-31, the minor number in bits 12-23 and the
 * patch number in bits 0-11, so that packed versions of the same major compare as integers.
 * Kernel ABI versions and GOP1 operation versions both use this packing.
 */
#define GUILD_KERNEL_ABI_MAKE_VERSION(major, minor, patch)                                         \
    ((uint32_t)((((uint32_t)(major) & 0xffu) << 24) | (((uint32_t)(minor) & 0xfffu) << 12) |      \
                ((uint32_t)(patch) & 0xfffu)))
/* The same packing under its older name. */
#define GUILD_MAKE_ABI_VERSION(major, minor, patch) GUILD_KERNEL_ABI_MAKE_VERSION(major, minor, patch)
/* Extract the parts of a packed version. */
#define GUILD_ABI_VERSION_MAJOR(v) ((((uint32_t)(v)) >> 24) & 0xffu)
#define GUILD_ABI_VERSION_MINOR(v) ((((uint32_t)(v)) >> 12) & 0xfffu)
#define GUILD_ABI_VERSION_PATCH(v) (((uint32_t)(v)) & 0xfffu)

/* Kernel ABI 1.0.0 (0x01000000) and the version this header declares. */
#define GUILD_KERNEL_ABI_VERSION_1_0_0 GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0)
#define GUILD_KERNEL_ABI_VERSION GUILD_KERNEL_ABI_VERSION_1_0_0

/*
 * The SDK release that ships these headers. SDK 1.5 adds the operation service (module_abi.h)
 * without changing the Kernel ABI number or any v1 descriptor layout.
 */
#define GUILD_SDK_VERSION_MAJOR 1u
#define GUILD_SDK_VERSION_MINOR 5u
#define GUILD_SDK_VERSION_PATCH 0u
#define GUILD_SDK_VERSION                                                                          \
    GUILD_KERNEL_ABI_MAKE_VERSION(GUILD_SDK_VERSION_MAJOR, GUILD_SDK_VERSION_MINOR, GUILD_SDK_VERSION_PATCH)

/*
 * Extension tags are four ASCII characters packed so that the first character is the most
 * significant byte: GUILD_MAKE_TAG('G','O','P','1') reads "GOP1" in a big-endian hex dump.
 */
#define GUILD_MAKE_TAG(a, b, c, d)                                                                 \
    ((uint32_t)((((uint32_t)(a) & 0xffu) << 24) | (((uint32_t)(b) & 0xffu) << 16) |               \
                (((uint32_t)(c) & 0xffu) << 8) | ((uint32_t)(d) & 0xffu)))

/* ------------------------------------------------------------------------------------------ */
/* Compiler helpers                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * GUILD_STATIC_ASSERT(condition, "message") checks a frozen layout at compile time. C++ and C11
 * use the language's own assertion; plain C99 falls back to a file-scope array typedef whose size
 * turns negative when the condition is false. The fallback's name is made unique with
 * __COUNTER__ where the compiler has it (GCC, Clang, MSVC) so that two headers asserting on the
 * same line number do not redefine one typedef. Use it at file scope only.
 */
#define GUILD_STATIC_ASSERT_CONCAT_INNER_(a, b) a##b
#define GUILD_STATIC_ASSERT_CONCAT_(a, b) GUILD_STATIC_ASSERT_CONCAT_INNER_(a, b)
#if defined(__cplusplus)
#define GUILD_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define GUILD_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#elif defined(__COUNTER__)
#define GUILD_STATIC_ASSERT(cond, msg)                                                             \
    typedef char GUILD_STATIC_ASSERT_CONCAT_(guild_static_assert_, __COUNTER__)[(cond) ? 1 : -1]
#else
#define GUILD_STATIC_ASSERT(cond, msg)                                                             \
    typedef char GUILD_STATIC_ASSERT_CONCAT_(guild_static_assert_line_, __LINE__)[(cond) ? 1 : -1]
#endif

/*
 * GUILD_ATTR_EXPORT marks the plugin entry point as exported from a shared library built with
 * hidden default visibility (what the SDK's CMake helper configures).
 */
#if defined(_WIN32) || defined(__CYGWIN__)
#define GUILD_ATTR_EXPORT __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define GUILD_ATTR_EXPORT __attribute__((visibility("default")))
#else
#define GUILD_ATTR_EXPORT
#endif

/*
 * GUILD_ATTR_ALIGN(n) raises the alignment of a struct member to n bytes (a power of two). Put
 * it first in the member declaration: `GUILD_ATTR_ALIGN(64) uint8_t bytes[3584];`. C++ uses
 * alignas, MSVC's C compiler __declspec(align), GCC, Clang and MinGW the aligned attribute.
 */
#if defined(__cplusplus) && __cplusplus >= 201103L
#define GUILD_ATTR_ALIGN(n) alignas(n)
#elif defined(_MSC_VER)
#define GUILD_ATTR_ALIGN(n) __declspec(align(n))
#elif defined(__GNUC__) || defined(__clang__)
#define GUILD_ATTR_ALIGN(n) __attribute__((aligned(n)))
#else
#error "guild/abi/kernel_abi.h: no known way to align a struct member on this compiler"
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * Every fallible call returns a guild_status_t. Zero is success, every error is negative, and a
 * caller that meets a negative value it does not know treats it as GUILD_STATUS_ERR_INTERNAL.
 */
typedef int32_t guild_status_t;

#define GUILD_STATUS_OK 0
/* A pointer was NULL, a size too small, a field out of range, or struct_size too small. */
#define GUILD_STATUS_ERR_INVALID_ARGUMENT (-1)
/* Well-formed but not supported: unknown version, tag, dtype, backend, layout or mode. */
#define GUILD_STATUS_ERR_UNSUPPORTED (-2)
/* The two sides were built against incompatible ABI versions. */
#define GUILD_STATUS_ERR_ABI_MISMATCH (-3)
/* A host or device allocation failed, or a memory budget cannot be met. */
#define GUILD_STATUS_ERR_OUT_OF_MEMORY (-4)
/* A named thing (operation, implementation, metadata key, tensor) does not exist. */
#define GUILD_STATUS_ERR_NOT_FOUND (-5)
/* A registration would duplicate an existing id. */
#define GUILD_STATUS_ERR_ALREADY_EXISTS (-6)
/* The resource is in use (for example a package with live handles). */
#define GUILD_STATUS_ERR_BUSY (-7)
/* A bug or broken invariant on the side that reports it. */
#define GUILD_STATUS_ERR_INTERNAL (-8)
/* The GPU runtime or driver reported an error. */
#define GUILD_STATUS_ERR_DEVICE (-9)
/* A caller-supplied buffer is too small; the call says how much it needs where it can. */
#define GUILD_STATUS_ERR_BUFFER_TOO_SMALL (-10)
/* The call came in the wrong state, for example a staging host used after init returned. */
#define GUILD_STATUS_ERR_STATE (-11)
/* Policy forbids the call (trust, publisher pin, disabled package). */
#define GUILD_STATUS_ERR_PERMISSION (-12)
/* A wait ran out of time. */
#define GUILD_STATUS_ERR_TIMEOUT (-13)

/* ------------------------------------------------------------------------------------------ */
/* Error records                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Capacities of the fixed buffers in guild_error_info_t, including the terminating NUL. */
#define GUILD_ERROR_COMPONENT_CAPACITY 64
#define GUILD_ERROR_MESSAGE_CAPACITY 512

/*
 * A fixed-size error (or log) record that crosses the boundary without any allocation.
 *
 * The caller owns it, sets struct_size to sizeof(guild_error_info_t) and passes a pointer; the
 * callee fills it when it fails. Callers may pass NULL where they do not want details, so callees
 * check the pointer and struct_size before writing. Both strings are always NUL-terminated,
 * truncated to fit, and hold UTF-8 text.
 */
typedef struct guild_error_info_t {
    /* sizeof(guild_error_info_t) as the caller knows it; written by the caller. */
    uint32_t struct_size;
    /* The status the call returned (GUILD_STATUS_OK in an informational log record). */
    guild_status_t status;
    /* Who reported it: an impl id, package id or subsystem name. May be empty. */
    char component[GUILD_ERROR_COMPONENT_CAPACITY];
    /* What failed and why, in one line. May be empty. */
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
} guild_error_info_t;

GUILD_STATIC_ASSERT(sizeof(guild_error_info_t) == 8 + GUILD_ERROR_COMPONENT_CAPACITY + GUILD_ERROR_MESSAGE_CAPACITY,
                    "guild_error_info_t layout is frozen");

/* Initialiser for a fresh record: `guild_error_info_t err = GUILD_ERROR_INFO_INITIALIZER();`. */
#define GUILD_ERROR_INFO_INITIALIZER() {(uint32_t)sizeof(guild_error_info_t), GUILD_STATUS_OK, {0}, {0}}

/* Resets a record the caller owns: struct_size set, status OK, both strings empty. */
static inline void guild_error_info_init(guild_error_info_t* info) {
    if (info == NULL) {
        return;
    }
    info->struct_size = (uint32_t)sizeof(guild_error_info_t);
    info->status = GUILD_STATUS_OK;
    info->component[0] = '\0';
    info->message[0] = '\0';
}

/*
 * Fills a record (when it is non-NULL and large enough) and returns `status`, so that a callee can
 * write `return guild_error_info_set(err, GUILD_STATUS_ERR_UNSUPPORTED, "my.impl", "rank > 4");`.
 * NULL strings are written as empty strings; long strings are truncated.
 */
static inline guild_status_t guild_error_info_set(guild_error_info_t* info, guild_status_t status,
                                                  const char* component, const char* message) {
    size_t i = 0;
    if (info == NULL || info->struct_size < (uint32_t)sizeof(guild_error_info_t)) {
        return status;
    }
    info->status = status;
    if (component != NULL) {
        for (; component[i] != '\0' && i + 1u < (size_t)GUILD_ERROR_COMPONENT_CAPACITY; ++i) {
            info->component[i] = component[i];
        }
    }
    info->component[i] = '\0';
    i = 0;
    if (message != NULL) {
        for (; message[i] != '\0' && i + 1u < (size_t)GUILD_ERROR_MESSAGE_CAPACITY; ++i) {
            info->message[i] = message[i];
        }
    }
    info->message[i] = '\0';
    return status;
}

/* Severity of a host log record (guild_host_api_v1_t.log). Lower is more severe. */
#define GUILD_LOG_LEVEL_ERROR 0u
#define GUILD_LOG_LEVEL_WARN 1u
#define GUILD_LOG_LEVEL_INFO 2u
#define GUILD_LOG_LEVEL_DEBUG 3u
#define GUILD_LOG_LEVEL_TRACE 4u

/* ------------------------------------------------------------------------------------------ */
/* Extension chains                                                                            */
/* ------------------------------------------------------------------------------------------ */

/*
 * The first member of every extension reached through a `next_ext` pointer. A reader walks the
 * chain, skips tags it does not know, and before using an extension checks its tag, its version
 * and that struct_size covers every field it is about to read. Extensions are const data owned by
 * whoever built the chain; a reader that needs them later copies them.
 */
typedef struct guild_ext_header_t {
    /* sizeof the whole extension struct, this header included, as its writer knows it. */
    uint32_t struct_size;
    /* GUILD_MAKE_TAG of the extension's four-character name, e.g. "GOP1". */
    uint32_t tag;
    /* Version of the extension layout; a reader rejects versions it does not know. */
    uint32_t version;
    /* Must be zero. */
    uint32_t reserved;
    /* The next extension in the chain, or NULL. */
    const struct guild_ext_header_t* next;
} guild_ext_header_t;

GUILD_STATIC_ASSERT(offsetof(guild_ext_header_t, next) == 16, "guild_ext_header_t layout is frozen");

/* ------------------------------------------------------------------------------------------ */
/* Backends, dtypes, tensors                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * Backend bits (uint32_t). A descriptor or capability record names exactly one bit; a query names
 * the set of backends it accepts.
 */
#define GUILD_BACKEND_CPU (1u << 0)
#define GUILD_BACKEND_CUDA (1u << 1)
#define GUILD_BACKEND_HIP (1u << 2)

/*
 * Element types (uint32_t), numbered as GGML numbers them so that a GGUF tensor type maps to the
 * same value. Quantized types are stored in blocks: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q8_1 hold 32
 * elements per block, the K types 256.
 */
#define GUILD_DTYPE_F32 0u
#define GUILD_DTYPE_F16 1u
#define GUILD_DTYPE_Q4_0 2u
#define GUILD_DTYPE_Q4_1 3u
#define GUILD_DTYPE_Q5_0 6u
#define GUILD_DTYPE_Q5_1 7u
#define GUILD_DTYPE_Q8_0 8u
#define GUILD_DTYPE_Q8_1 9u
#define GUILD_DTYPE_Q2_K 10u
#define GUILD_DTYPE_Q3_K 11u
#define GUILD_DTYPE_Q4_K 12u
#define GUILD_DTYPE_Q5_K 13u
#define GUILD_DTYPE_Q6_K 14u
#define GUILD_DTYPE_Q8_K 15u
#define GUILD_DTYPE_I8 24u
#define GUILD_DTYPE_I16 25u
#define GUILD_DTYPE_I32 26u
#define GUILD_DTYPE_I64 27u
#define GUILD_DTYPE_F64 28u
#define GUILD_DTYPE_BF16 30u
/* In a contract: any dtype; the provider's validate callback decides. Never a tensor's dtype. */
#define GUILD_DTYPE_ANY 0xFFFFFFFFu

/* The most axes a tensor descriptor or a per-axis bound can have. */
#define GUILD_MAX_TENSOR_RANK 8

/*
 * An opaque GPU stream: a cudaStream_t or hipStream_t passed through unchanged, NULL for the
 * default stream or for CPU work. The headers never name a GPU SDK type.
 */
typedef struct guild_stream_s* guild_stream_t;

/* ------------------------------------------------------------------------------------------ */
/* Legacy operation kinds and sync mask                                                        */
/* ------------------------------------------------------------------------------------------ */

/*
 * Kernel operation kinds (guild_kernel_op_desc_v1_t.op_kind, uint32_t). These are the built-in
 * operations the runtime dispatches by number; their `kernel_fns` tables are frozen per kind.
 * New operations do not get numbers: they use GUILD_OP_CUSTOM (module_abi.h) and a namespaced
 * op_name instead.
 */
#define GUILD_OP_INVALID 0u
/* Dense or quantized matrix-matrix product (prefill projections). */
#define GUILD_OP_MATMUL 1u
/* Matrix-vector product for single-token decode. */
#define GUILD_OP_MATVEC 2u
/* Dequantize a quantized tensor to F32/F16/BF16. */
#define GUILD_OP_DEQUANTIZE 3u
/* Quantize activations to a block format ahead of a quantized product. */
#define GUILD_OP_QUANTIZE_ACTIVATIONS 4u
#define GUILD_OP_RMS_NORM 5u
#define GUILD_OP_LAYER_NORM 6u
/* Rotary position embedding. */
#define GUILD_OP_ROPE 7u
#define GUILD_OP_SOFTMAX 8u
/* Full attention over a KV cache (prefill and decode). */
#define GUILD_OP_ATTENTION 9u
/* Recurrent gated delta-net step or scan. */
#define GUILD_OP_GATED_DELTA_NET 10u
/* Short causal convolution of recurrent layers. */
#define GUILD_OP_SSM_CONV 11u
/* Mixture-of-experts routing: logits, top-k selection and weights. */
#define GUILD_OP_MOE_ROUTER 12u
/* Run many experts over their routed tokens; CPE1 (cpu_expert_abi.h) attaches here. */
#define GUILD_OP_BATCHED_EXPERT_EXEC 13u
/* Weighted combination of expert outputs. */
#define GUILD_OP_MOE_COMBINE 14u
/* Embedding row lookup (get_rows). */
#define GUILD_OP_EMBEDDING_LOOKUP 15u
/* Elementwise add, multiply and gated activations (SiLU, GELU). */
#define GUILD_OP_ADD 16u
#define GUILD_OP_MUL 17u
#define GUILD_OP_ACTIVATION 18u
/* Token sampling from logits. */
#define GUILD_OP_SAMPLING 19u
/* KV cache append and copy. */
#define GUILD_OP_KV_CACHE_UPDATE 20u
/*
 * The frozen seven-pointer prefill direct table. It is a private C++ contract: kernel_fns points
 * at it, it is not declared in any public header and new backends must not provide it.
 */
#define GUILD_OP_PREFILL_DIRECT 21u
/*
 * The public prefill kernels (PFKE): kernel_fns points at a guild_prefill_kernel_ext_v1_t, which
 * the host recognises by this op kind and then checks by its 12-byte PFKE header.
 */
#define GUILD_OP_PREFILL_KERNELS 22u

/*
 * Legacy sync mask (guild_kernel_op_desc_v1_t.sync_mask): how a legacy kernel table behaves with
 * respect to streams. GOP1 operations ignore it and declare GUILD_SYNC_BIT(mode) bits in their
 * extension instead; the two encodings are not interchangeable.
 */
/* Runs on the host and returns when done. */
#define GUILD_LEGACY_SYNC_HOST (1u << 0)
/* Enqueues work on the supplied stream and returns without waiting. */
#define GUILD_LEGACY_SYNC_STREAM_ASYNC (1u << 1)
/* Synchronises the device before returning. */
#define GUILD_LEGACY_SYNC_DEVICE_BLOCKING (1u << 2)
/* Safe to record into a GPU graph (no allocation, no host sync, no stream creation). */
#define GUILD_LEGACY_SYNC_GRAPH_SAFE (1u << 3)

/* ------------------------------------------------------------------------------------------ */
/* Device capabilities                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* CPU instruction-set features (uint64_t bits) in capabilities and descriptor requirements. */
#define GUILD_CPU_ISA_SSE4_2 ((uint64_t)1 << 0)
#define GUILD_CPU_ISA_AVX ((uint64_t)1 << 1)
#define GUILD_CPU_ISA_AVX2 ((uint64_t)1 << 2)
#define GUILD_CPU_ISA_FMA ((uint64_t)1 << 3)
#define GUILD_CPU_ISA_F16C ((uint64_t)1 << 4)
#define GUILD_CPU_ISA_AVX512F ((uint64_t)1 << 5)
#define GUILD_CPU_ISA_AVX512BW ((uint64_t)1 << 6)
#define GUILD_CPU_ISA_AVX512_VNNI ((uint64_t)1 << 7)
#define GUILD_CPU_ISA_AVX512_BF16 ((uint64_t)1 << 8)
#define GUILD_CPU_ISA_AVX_VNNI ((uint64_t)1 << 9)
#define GUILD_CPU_ISA_NEON ((uint64_t)1 << 32)
#define GUILD_CPU_ISA_ARM_DOTPROD ((uint64_t)1 << 33)
#define GUILD_CPU_ISA_ARM_I8MM ((uint64_t)1 << 34)
#define GUILD_CPU_ISA_SVE ((uint64_t)1 << 35)
#define GUILD_CPU_ISA_SVE2 ((uint64_t)1 << 36)

/*
 * What one device offers. The host fills it; callers of the operation service may pass one in a
 * query to resolve against a particular device.
 */
typedef struct guild_device_caps_v1_t {
    /* sizeof(guild_device_caps_v1_t) as the writer knows it. */
    uint32_t struct_size;
    /* Exactly one GUILD_BACKEND_* bit. */
    uint32_t backend;
    /* Device ordinal within the backend; 0 for the CPU. */
    int32_t device_id;
    /* CUDA compute capability times ten (8.9 -> 89); 0 for other backends. */
    uint32_t cuda_sm;
    /* GUILD_CPU_ISA_* bits of the host CPU; 0 for GPU records. */
    uint64_t cpu_isa;
    /* Device memory in bytes (host RAM for the CPU); 0 when unknown. */
    uint64_t total_memory_bytes;
    /* Memory free when the record was taken, in bytes; 0 when unknown. */
    uint64_t free_memory_bytes;
    /* Further capability extensions. The operation service v1 requires NULL. */
    const guild_ext_header_t* next_ext;
} guild_device_caps_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* Kernel descriptors                                                                          */
/* ------------------------------------------------------------------------------------------ */

/*
 * One kernel implementation, registered by a plugin during init through
 * guild_host_api_v1_t.register_kernel. The host copies the descriptor, its strings and its
 * extension chain before register_kernel returns, so the plugin may build it on the stack. The
 * code and data that function pointers and user_data refer to must stay valid until the plugin's
 * shutdown returns; the host keeps the package loaded while any binding to it is alive.
 */
typedef struct guild_kernel_op_desc_v1_t {
    /* sizeof(guild_kernel_op_desc_v1_t). */
    uint32_t struct_size;
    /* GUILD_KERNEL_ABI_VERSION the plugin was built against. */
    uint32_t abi_version;
    /* GUILD_OP_* kind; GUILD_OP_CUSTOM for namespaced operations. */
    uint32_t op_kind;
    /* Exactly one GUILD_BACKEND_* bit. */
    uint32_t backend;
    /* Globally unique implementation id (dot-separated lowercase segments); must be listed in
     * the package manifest's provided_ops. Required. */
    const char* impl_id;
    /* Namespaced semantic operation name such as "example.sequence.prefix_sum". Required for
     * GUILD_OP_CUSTOM; NULL or a descriptive name for legacy kinds. */
    const char* op_name;
    /* Selection priority; higher wins, ties go to the lexicographically smaller impl_id. */
    int32_t priority;
    /* GUILD_LEGACY_SYNC_* bits for legacy kinds; 0 for GUILD_OP_CUSTOM. */
    uint32_t sync_mask;
    /* Upper bound on dims[i] of every tensor the kernel accepts, per axis; 0 = unbounded. */
    uint64_t max_dim[GUILD_MAX_TENSOR_RANK];
    /* Upper bound on the batch of a call, the product of every axis but the innermost
     * (dims[1] * ... * dims[rank-1]) of every tensor; 0 = unbounded. */
    uint64_t max_batch;
    /* Lowest and highest CUDA compute capability times ten; 0 = no bound. CUDA only. */
    uint32_t min_sm;
    uint32_t max_sm;
    /* GUILD_CPU_ISA_* bits the host CPU must have; 0 = none. */
    uint64_t required_cpu_isa;
    /* The op kind's function table: a frozen legacy table for legacy kinds, a
     * guild_prefill_kernel_ext_v1_t for GUILD_OP_PREFILL_KERNELS, NULL for GUILD_OP_CUSTOM. */
    const void* kernel_fns;
    /* Passed back to the kernel's callbacks; owned by the plugin. */
    void* user_data;
    /* Extension chain (GOP1, CPE1, ...), or NULL. */
    const guild_ext_header_t* next_ext;
} guild_kernel_op_desc_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* Runner descriptors                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Declared in runner_abi.h; runners receive the host's read-only view of a model. */
struct guild_model_reader_v1_t;

/*
 * A model runner: the code that knows an architecture and drives its layers. Registered during
 * init through guild_host_api_v1_t.register_runner and copied by the host like a kernel
 * descriptor. Its RMD1 model-description extension (runner_abi.h) hangs off next_ext.
 */
typedef struct guild_runner_desc_v1_t {
    /* sizeof(guild_runner_desc_v1_t). */
    uint32_t struct_size;
    /* GUILD_KERNEL_ABI_VERSION the plugin was built against. */
    uint32_t abi_version;
    /* Unique runner id (dot-separated lowercase segments), listed in provided_runners. */
    const char* runner_id;
    /* Selection priority among runners that recognise the same model; higher first. */
    int32_t priority;
    /* Must be zero. */
    uint32_t reserved;
    /* Passed back to create and destroy; owned by the plugin. */
    void* user_data;
    /*
     * Builds a runner instance for a model the host has opened. `model` is borrowed for the call
     * only. On success writes the instance to *out_instance, which the host later passes to
     * destroy exactly once.
     */
    guild_status_t (*create)(void* user_data, const struct guild_model_reader_v1_t* model, void** out_instance,
                             guild_error_info_t* error);
    /* Frees an instance from create. Must not fail; NULL is a no-op. */
    void (*destroy)(void* user_data, void* instance);
    /* Extension chain (RMD1, ...), or NULL. */
    const guild_ext_header_t* next_ext;
} guild_runner_desc_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* Host callback table                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Declared in module_abi.h. */
struct guild_operation_service_v1_t;

/*
 * What the host hands a plugin's init. The table and host_context are a temporary staging area:
 * valid only until init returns, and only on the thread that called init. Callbacks made after
 * that fail with GUILD_STATUS_ERR_STATE. A plugin that wants the operation service copies
 * *operations during init.
 */
typedef struct guild_host_api_v1_t {
    /* sizeof(guild_host_api_v1_t) as the host knows it; see GUILD_HOST_API_V1_BASE_SIZE. */
    uint32_t struct_size;
    /* The host's GUILD_KERNEL_ABI_VERSION. */
    uint32_t abi_version;
    /* The host's staging context; pass it to every callback below. */
    void* host_context;
    /* Registers one kernel. The host copies *desc. Fails with ERR_ALREADY_EXISTS on a duplicate
     * impl_id and ERR_PERMISSION when impl_id is not in the manifest's provided_ops. */
    guild_status_t (*register_kernel)(void* host_context, const guild_kernel_op_desc_v1_t* desc,
                                      guild_error_info_t* error);
    /* Registers one runner. The host copies *desc and its extensions. */
    guild_status_t (*register_runner)(void* host_context, const guild_runner_desc_v1_t* desc,
                                      guild_error_info_t* error);
    /* Writes a log record at a GUILD_LOG_LEVEL_*; record->status is OK for plain messages. The
     * record is borrowed for the call. */
    void (*log)(void* host_context, uint32_t level, const guild_error_info_t* record);
    /*
     * Optional tail (SDK 1.5): the operation service, or NULL when the host offers none. Read it
     * only when struct_size >= GUILD_HOST_API_V1_BASE_SIZE + sizeof(void*), then check the
     * service's own struct_size and version. Copy the pointed-to table; do not keep the pointer.
     */
    const struct guild_operation_service_v1_t* operations;
} guild_host_api_v1_t;

/* Size of the host table before the optional operations tail: what pre-1.5 hosts pass. */
#define GUILD_HOST_API_V1_BASE_SIZE offsetof(guild_host_api_v1_t, operations)

/* ------------------------------------------------------------------------------------------ */
/* Plugin entry point                                                                          */
/* ------------------------------------------------------------------------------------------ */

/*
 * What a plugin's entry point returns. It has static storage duration in the plugin and must not
 * change while the library is loaded.
 */
typedef struct guild_plugin_descriptor_v1_t {
    /* sizeof(guild_plugin_descriptor_v1_t). */
    uint32_t struct_size;
    /* GUILD_KERNEL_ABI_VERSION the plugin was built against. */
    uint32_t abi_version;
    /* Oldest and newest Kernel ABI (packed) the plugin can run under, inclusive; they must match
     * the manifest's kernel_abi range. */
    uint32_t min_kernel_abi;
    uint32_t max_kernel_abi;
    /* Human-readable name and version of the plugin, for logs. Static strings. */
    const char* plugin_name;
    const char* plugin_version;
    /*
     * Registers the plugin's kernels and runners through `host`, which is valid only during this
     * call. May allocate plugin state and return it through *plugin_state. Must catch its own
     * failures and report them as a status; on failure the host still calls shutdown with
     * whatever *plugin_state holds (NULL if it was never written).
     */
    guild_status_t (*init)(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error);
    /* Frees plugin state and quiesces any background work before returning. Called once, also
     * after a failed init; plugin_state may be NULL. */
    void (*shutdown)(void* plugin_state);
} guild_plugin_descriptor_v1_t;

/* The name under which a plugin exports its entry point. */
#define GUILD_PLUGIN_ENTRY_SYMBOL_V1 "guild_plugin_entry_v1"

/* The entry point's type: returns the plugin's static descriptor, or NULL if it cannot load. */
typedef const guild_plugin_descriptor_v1_t* (*guild_plugin_entry_fn)(void);

/* Every plugin defines this function and exports it under GUILD_PLUGIN_ENTRY_SYMBOL_V1. */
GUILD_ATTR_EXPORT const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void);

/* ------------------------------------------------------------------------------------------ */
/* PFKE: public prefill kernels (legacy contract, frozen with Kernel ABI v1)                   */
/* ------------------------------------------------------------------------------------------ */

/* "PFKE", the same value as GUILD_MAKE_TAG('P','F','K','E'). */
#define GUILD_PFKE_TAG 0x50464b45u
#define GUILD_PFKE_VERSION 1u

/*
 * PFKE's own 12-byte header. It predates guild_ext_header_t and has no next pointer: PFKE is not
 * part of any next_ext chain. A kernel descriptor with op_kind GUILD_OP_PREFILL_KERNELS carries it
 * through kernel_fns.
 */
typedef struct guild_prefill_ext_header_t {
    /* sizeof(guild_prefill_kernel_ext_v1_t) as the plugin knows it. */
    uint32_t struct_size;
    /* GUILD_PFKE_TAG. */
    uint32_t tag;
    /* GUILD_PFKE_VERSION. */
    uint32_t version;
} guild_prefill_ext_header_t;

GUILD_STATIC_ASSERT(sizeof(guild_prefill_ext_header_t) == 12, "guild_prefill_ext_header_t must be 12 bytes");
GUILD_STATIC_ASSERT(GUILD_PFKE_TAG == GUILD_MAKE_TAG('P', 'F', 'K', 'E'), "PFKE tag spells PFKE");

/*
 * Gated delta-net gate and beta for a whole prompt. For every token t and value head h:
 *   gate[t][h] = -exp(a_log[h]) * softplus(alpha[t][h] + dt_bias[h])
 *   beta[t][h] = sigmoid(beta_in[t][h])
 * Every buffer is caller-owned and borrowed for the call; on a GPU backend all of them are device
 * memory and the work is enqueued on `stream`.
 */
typedef struct guild_prefill_gdn_ab_args_v1_t {
    /* sizeof(guild_prefill_gdn_ab_args_v1_t). */
    uint32_t struct_size;
    /* Tokens in the prompt chunk. */
    uint32_t n_tokens;
    /* Value heads of the recurrent layer. */
    uint32_t n_heads;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16: the dtype of alpha and beta_in. */
    uint32_t input_dtype;
    /* Elements between consecutive tokens in alpha and beta_in (>= n_heads). */
    uint64_t input_row_stride;
    /* Elements between consecutive tokens in gate_out and beta_out (>= n_heads). */
    uint64_t output_row_stride;
    /* Raw alpha projection, [n_tokens][n_heads]. */
    const void* alpha;
    /* Raw beta projection, [n_tokens][n_heads]. */
    const void* beta_in;
    /* Per-head A_log, [n_heads] F32. */
    const float* a_log;
    /* Per-head dt bias, [n_heads] F32. */
    const float* dt_bias;
    /* Output gate, [n_tokens][n_heads] F32. */
    float* gate_out;
    /* Output beta, [n_tokens][n_heads] F32. */
    float* beta_out;
    /* Stream to enqueue on (GPU backends); NULL on the CPU. */
    guild_stream_t stream;
    /* Device the buffers live on; 0 on the CPU. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_prefill_gdn_ab_args_v1_t;

/*
 * MoE router logits for a whole prompt: logits[t][e] = dot(hidden[t][:], weight[e][:]).
 * Buffer ownership and stream rules are those of guild_prefill_gdn_ab_args_v1_t.
 */
typedef struct guild_prefill_router_args_v1_t {
    /* sizeof(guild_prefill_router_args_v1_t). */
    uint32_t struct_size;
    /* Tokens in the prompt chunk. */
    uint32_t n_tokens;
    /* Hidden size (elements per token). */
    uint32_t n_embd;
    /* Experts (rows of the router weight). */
    uint32_t n_experts;
    /* GUILD_DTYPE_F32 or GUILD_DTYPE_BF16. */
    uint32_t hidden_dtype;
    /* Router weight dtype: F32, F16, BF16 or a block-quantized GUILD_DTYPE_*. */
    uint32_t weight_dtype;
    /* Elements between consecutive tokens in hidden (>= n_embd). */
    uint64_t hidden_row_stride;
    /* Elements between consecutive tokens in logits (>= n_experts). */
    uint64_t logits_row_stride;
    /* [n_tokens][n_embd] activations. */
    const void* hidden;
    /* [n_experts][n_embd] router weight, rows packed. */
    const void* weight;
    /* [n_tokens][n_experts] F32 output. */
    float* logits;
    /* Stream to enqueue on (GPU backends); NULL on the CPU. */
    guild_stream_t stream;
    /* Device the buffers live on; 0 on the CPU. */
    int32_t device_id;
    /* Must be zero. */
    uint32_t reserved;
} guild_prefill_router_args_v1_t;

/*
 * The PFKE table. Both callbacks receive the owning kernel descriptor's user_data, are
 * synchronous on the CPU and stream-ordered on GPUs, and return a status with details in *error.
 */
typedef struct guild_prefill_kernel_ext_v1_t {
    /* struct_size, GUILD_PFKE_TAG, GUILD_PFKE_VERSION. */
    guild_prefill_ext_header_t header;
    guild_status_t (*gdn_ab)(void* user_data, const guild_prefill_gdn_ab_args_v1_t* args, guild_error_info_t* error);
    guild_status_t (*router_projection)(void* user_data, const guild_prefill_router_args_v1_t* args,
                                        guild_error_info_t* error);
} guild_prefill_kernel_ext_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_KERNEL_ABI_H */
