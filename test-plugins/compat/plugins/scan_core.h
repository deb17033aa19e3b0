/* FROZEN (compatibility matrix): test-plugins/scan_module/scan_core.h as it was at SDK 1.5, built against ../sdk-1.5 only.
 * Never edit: the new host must keep loading and running this build as it is. */
/*
 * scan_core.h: the arithmetic and tensor checks shared by the scan test modules (scan_module,
 * scan_module_alt and scan_dependent). C99, SDK headers and the C standard library only; every
 * function is static so that each module gets its own private copy and exports nothing.
 *
 * Tensors follow guild_tensor_desc_v1_t: dims[0] is the innermost, contiguous axis and
 * strides[0] is 0; for 1 <= i < rank, strides[i] is the element distance between consecutive
 * indices of axis i, and 0 means packed: the stride of axis i-1 times dims[i-1] (the same rule
 * the host's domain applies, so an explicit stride after a packed one and a packed one after an
 * explicit one both come out as the host computes them).
 *
 * Integer scans add in unsigned arithmetic of the same width, so a sum that leaves the type's
 * range wraps around in two's complement instead of being undefined behaviour; within the range
 * the result is exact. Floating-point scans add left to right in the tensor's own type.
 */
#ifndef GUILD_TEST_SCAN_CORE_H
#define GUILD_TEST_SCAN_CORE_H

#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#include <stdio.h>
#include <string.h>

/*
 * Capability bits of the example.sequence.*_scan operations (bits of GOP1 `capabilities`, whose
 * meaning each operation defines). Both scan providers use this one vocabulary so that a query
 * can ask for a property and ranking tests can tell the providers apart:
 *   bit 0  in place: the output may be the input buffer itself, with the same strides;
 *   bit 1  64-bit element types (f64, and i64 where integers are supported);
 *   bit 2  integer element types (i32, i64);
 *   bit 3  outer-strided layouts (explicit outer strides on input and output independently).
 */
#define SCAN_CAP_IN_PLACE ((uint64_t)1 << 0)
#define SCAN_CAP_WIDE_TYPES ((uint64_t)1 << 1)
#define SCAN_CAP_INTEGERS ((uint64_t)1 << 2)
#define SCAN_CAP_OUTER_STRIDED ((uint64_t)1 << 3)

/* Dtype sets, as bits (1u << index) over the four dtypes the scans know. */
#define SCAN_DTYPES_ALL 0xfu
#define SCAN_DTYPES_FLOAT 0x3u

static const char* scan_dtype_name(uint32_t dtype) {
    switch (dtype) {
        case GUILD_DTYPE_F32:
            return "f32";
        case GUILD_DTYPE_F64:
            return "f64";
        case GUILD_DTYPE_I32:
            return "i32";
        case GUILD_DTYPE_I64:
            return "i64";
        default:
            return "unsupported";
    }
}

/* Bit of `dtype` in a SCAN_DTYPES_* set, or 0 for a dtype the scans do not know. */
static uint32_t scan_dtype_bit(uint32_t dtype) {
    switch (dtype) {
        case GUILD_DTYPE_F32:
            return 1u << 0;
        case GUILD_DTYPE_F64:
            return 1u << 1;
        case GUILD_DTYPE_I32:
            return 1u << 2;
        case GUILD_DTYPE_I64:
            return 1u << 3;
        default:
            return 0u;
    }
}

/* Element size in bytes, or 0 for a dtype the scans do not know. */
static size_t scan_dtype_size(uint32_t dtype) {
    switch (dtype) {
        case GUILD_DTYPE_F32:
        case GUILD_DTYPE_I32:
            return 4u;
        case GUILD_DTYPE_F64:
        case GUILD_DTYPE_I64:
            return 8u;
        default:
            return 0u;
    }
}

/*
 * Computes the effective element strides of a tensor (strides[0] = 1) and its element count, and
 * checks that it is well formed: rank within [min_rank, max_rank], no zero extent, strides[0] == 0,
 * no explicit outer stride below its packed extent, and nothing that overflows 64 bits. Writes
 * `reason` (NUL-terminated, at most reason_size bytes) and returns 0 when it is not.
 */
static int scan_tensor_layout(const guild_tensor_desc_v1_t* t, uint32_t min_rank, uint32_t max_rank,
                              uint64_t eff[GUILD_MAX_TENSOR_RANK], uint64_t* elements, char* reason,
                              size_t reason_size) {
    uint32_t i;
    uint64_t count;
    if (t->rank < min_rank || t->rank > max_rank || t->rank > (uint32_t)GUILD_MAX_TENSOR_RANK) {
        (void)snprintf(reason, reason_size, "rank %u is outside %u..%u", (unsigned)t->rank, (unsigned)min_rank,
                       (unsigned)max_rank);
        return 0;
    }
    if (t->strides[0] != 0u) {
        (void)snprintf(reason, reason_size, "strides[0] must be 0 (the innermost axis is contiguous)");
        return 0;
    }
    count = 1u;
    for (i = 0; i < t->rank; ++i) {
        if (t->dims[i] == 0u) {
            (void)snprintf(reason, reason_size, "axis %u has extent 0", (unsigned)i);
            return 0;
        }
        if (count > UINT64_MAX / t->dims[i]) {
            (void)snprintf(reason, reason_size, "the element count overflows 64 bits");
            return 0;
        }
        count *= t->dims[i];
        if (i == 0u) {
            eff[0] = 1u;
        } else {
            uint64_t packed;
            if (eff[i - 1u] > UINT64_MAX / t->dims[i - 1u]) {
                (void)snprintf(reason, reason_size, "the stride of axis %u overflows 64 bits", (unsigned)i);
                return 0;
            }
            packed = eff[i - 1u] * t->dims[i - 1u];
            if (t->strides[i] != 0u && t->strides[i] < packed) {
                (void)snprintf(reason, reason_size, "stride %llu of axis %u overlaps the axes inside it (packed %llu)",
                               (unsigned long long)t->strides[i], (unsigned)i, (unsigned long long)packed);
                return 0;
            }
            eff[i] = t->strides[i] != 0u ? t->strides[i] : packed;
        }
    }
    /* The last element's offset must fit as well. */
    {
        uint64_t last = 0u;
        for (i = 0; i < t->rank; ++i) {
            uint64_t step;
            if (eff[i] != 0u && t->dims[i] - 1u > UINT64_MAX / eff[i]) {
                (void)snprintf(reason, reason_size, "the tensor's extent overflows 64 bits");
                return 0;
            }
            step = (t->dims[i] - 1u) * eff[i];
            if (last > UINT64_MAX - step) {
                (void)snprintf(reason, reason_size, "the tensor's extent overflows 64 bits");
                return 0;
            }
            last += step;
        }
    }
    for (i = t->rank; i < (uint32_t)GUILD_MAX_TENSOR_RANK; ++i) {
        eff[i] = 0u;
    }
    *elements = count;
    return 1;
}

/* Whether `data` is aligned to `alignment` bytes (a power of two). */
static int scan_aligned(const void* data, size_t alignment) {
    return alignment <= 1u || ((uintptr_t)data & (uintptr_t)(alignment - 1u)) == 0u;
}

#ifndef SCAN_CORE_HELPERS_ONLY
/* Everything from here to the host check is the scan providers' own (scan_dependent, which only
 * needs the tensor helpers, defines SCAN_CORE_HELPERS_ONLY so that no static goes unused). */

/*
 * Checks one input/output pair against a scan contract: a dtype in `dtypes` (SCAN_DTYPES_*), the
 * same dtype on both sides, the same shape, well-formed layouts, and (unless `strided_ok`) no
 * explicit outer stride that differs from the packed one. Writes the message to `message` and
 * returns the status to report; GUILD_STATUS_OK leaves `message` alone.
 */
static guild_status_t scan_check_pair(const guild_tensor_desc_v1_t* in, const guild_tensor_desc_v1_t* out,
                                      uint32_t dtypes, uint32_t max_rank, int strided_ok, char* message,
                                      size_t message_size) {
    uint64_t in_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t out_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t in_count;
    uint64_t out_count;
    char reason[160];
    uint32_t i;

    if ((scan_dtype_bit(in->dtype) & dtypes) == 0u) {
        (void)snprintf(message, message_size, "input dtype %u (%s) is not supported by this scan", (unsigned)in->dtype,
                       scan_dtype_name(in->dtype));
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (out->dtype != in->dtype) {
        (void)snprintf(message, message_size, "output dtype %u (%s) differs from input dtype %u (%s)",
                       (unsigned)out->dtype, scan_dtype_name(out->dtype), (unsigned)in->dtype,
                       scan_dtype_name(in->dtype));
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (out->rank != in->rank) {
        (void)snprintf(message, message_size, "output rank %u differs from input rank %u", (unsigned)out->rank,
                       (unsigned)in->rank);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (!scan_tensor_layout(in, 1u, max_rank, in_eff, &in_count, reason, sizeof reason)) {
        (void)snprintf(message, message_size, "input: %s", reason);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (!scan_tensor_layout(out, 1u, max_rank, out_eff, &out_count, reason, sizeof reason)) {
        (void)snprintf(message, message_size, "output: %s", reason);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    for (i = 0; i < in->rank; ++i) {
        if (in->dims[i] != out->dims[i]) {
            (void)snprintf(message, message_size, "output shape differs from input shape at axis %u (%llu != %llu)",
                           (unsigned)i, (unsigned long long)out->dims[i], (unsigned long long)in->dims[i]);
            return GUILD_STATUS_ERR_UNSUPPORTED;
        }
    }
    if (!strided_ok) {
        for (i = 1; i < in->rank; ++i) {
            uint64_t in_packed = in_eff[i - 1u] * in->dims[i - 1u];
            uint64_t out_packed = out_eff[i - 1u] * out->dims[i - 1u];
            if (in_eff[i] != in_packed || out_eff[i] != out_packed) {
                (void)snprintf(message, message_size, "axis %u is outer-strided; this scan takes contiguous tensors only",
                               (unsigned)i);
                return GUILD_STATUS_ERR_UNSUPPORTED;
            }
        }
    }
    return GUILD_STATUS_OK;
}

/* Scans one row of n elements: src and dst are row starts (dims[0] is contiguous). */
#define SCAN_ROW(type, acc_type, src_ptr, dst_ptr, n, exclusive)                                   \
    do {                                                                                           \
        const type* s_ = (const type*)(src_ptr);                                                   \
        type* d_ = (type*)(dst_ptr);                                                               \
        acc_type acc_ = 0;                                                                         \
        uint64_t k_;                                                                               \
        for (k_ = 0; k_ < (n); ++k_) {                                                             \
            acc_type v_ = (acc_type)s_[k_]; /* read before writing: in place is allowed */        \
            if (exclusive) {                                                                       \
                d_[k_] = (type)acc_;                                                               \
                acc_ += v_;                                                                        \
            } else {                                                                               \
                acc_ += v_;                                                                        \
                d_[k_] = (type)acc_;                                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/*
 * Runs the scan along dims[0] for every index of the outer axes. The pair must have passed
 * scan_check_pair and both data pointers must be non-NULL and aligned to the element size.
 * Integer sums wrap (unsigned arithmetic, converted back to the signed type as two's complement
 * on every platform this SDK supports).
 */
static void scan_run(const guild_tensor_desc_v1_t* in, const guild_tensor_desc_v1_t* out, int exclusive) {
    uint64_t in_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t out_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t index[GUILD_MAX_TENSOR_RANK];
    uint64_t count;
    char reason[8];
    size_t size = scan_dtype_size(in->dtype);
    uint64_t n = in->dims[0];
    uint32_t rank = in->rank;

    if (!scan_tensor_layout(in, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, in_eff, &count, reason, sizeof reason) ||
        !scan_tensor_layout(out, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, out_eff, &count, reason, sizeof reason)) {
        return;
    }
    memset(index, 0, sizeof index);
    for (;;) {
        uint64_t in_off = 0u;
        uint64_t out_off = 0u;
        uint32_t axis;
        const unsigned char* src;
        unsigned char* dst;
        for (axis = 1; axis < rank; ++axis) {
            in_off += index[axis] * in_eff[axis];
            out_off += index[axis] * out_eff[axis];
        }
        src = (const unsigned char*)in->data + (size_t)in_off * size;
        dst = (unsigned char*)out->data + (size_t)out_off * size;
        switch (in->dtype) {
            case GUILD_DTYPE_F32:
                SCAN_ROW(float, float, src, dst, n, exclusive);
                break;
            case GUILD_DTYPE_F64:
                SCAN_ROW(double, double, src, dst, n, exclusive);
                break;
            case GUILD_DTYPE_I32:
                SCAN_ROW(int32_t, uint32_t, src, dst, n, exclusive);
                break;
            case GUILD_DTYPE_I64:
                SCAN_ROW(int64_t, uint64_t, src, dst, n, exclusive);
                break;
            default:
                return;
        }
        /* Next index of the outer axes, axis 1 fastest. */
        for (axis = 1; axis < rank; ++axis) {
            if (++index[axis] < in->dims[axis]) {
                break;
            }
            index[axis] = 0u;
        }
        if (axis >= rank) {
            return;
        }
    }
}


/* ------------------------------------------------------------------------------------------ */
/* GOP1 callbacks of a scan provider                                                           */
/* ------------------------------------------------------------------------------------------ */

#define SCAN_OP_MAGIC 0x5ca75ca7u

/*
 * One registered scan implementation: its callbacks' user_data. Static storage in the module,
 * never written after load, so the callbacks are safe from any number of threads at once.
 */
typedef struct scan_op_t {
    uint32_t magic;
    /* 0 = inclusive, 1 = exclusive. */
    int exclusive;
    /* SCAN_DTYPES_* the implementation accepts. */
    uint32_t dtypes;
    uint32_t max_rank;
    /* Whether explicit outer strides are accepted (GUILD_LAYOUT_OUTER_STRIDED). */
    int strided_ok;
    /* Whether the output may be the input buffer itself (SCAN_CAP_IN_PLACE). */
    int in_place_ok;
    /* The impl id, used as the error component. */
    const char* component;
} scan_op_t;

static const scan_op_t* scan_op(void* user_data) {
    const scan_op_t* op = (const scan_op_t*)user_data;
    return op != NULL && op->magic == SCAN_OP_MAGIC ? op : NULL;
}

static guild_status_t scan_validate(void* user_data, const guild_operation_query_v1_t* query,
                                    guild_error_info_t* error) {
    const scan_op_t* op = scan_op(user_data);
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    guild_status_t status;
    if (op == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.scan",
                                    "validate got no scan state in user_data");
    }
    if (query == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component, "validate got no query");
    }
    if (query->input_count != 1u || query->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->component,
                                    "a scan takes exactly one input and one output");
    }
    if (query->inputs == NULL || query->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component,
                                    "the query's input or output array is NULL");
    }
    status = scan_check_pair(&query->inputs[0], &query->outputs[0], op->dtypes, op->max_rank, op->strided_ok,
                             message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, status, op->component, message);
    }
    return GUILD_STATUS_OK;
}

static guild_status_t scan_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                         guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    const scan_op_t* op = scan_op(user_data);
    if (op == NULL || query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT,
                                    op != NULL ? op->component : "example.scan",
                                    "query_scratch needs the scan state, a query and an output record");
    }
    /* The scan streams each row once; it needs no scratch. struct_size is the caller's. */
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t scan_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const scan_op_t* op = scan_op(user_data);
    const guild_tensor_desc_v1_t* in;
    const guild_tensor_desc_v1_t* out;
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    guild_status_t status;
    size_t size;
    uint32_t i;

    if (op == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.scan",
                                    "execute got no scan state in user_data");
    }
    if (args == NULL || args->inputs == NULL || args->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component,
                                    "execute needs arguments with input and output arrays");
    }
    if (args->input_count != 1u || args->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component,
                                    "a scan takes exactly one input and one output");
    }
    if (args->sync_mode != GUILD_SYNC_HOST_BLOCKING) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->component,
                                    "this CPU scan runs host-blocking only");
    }
    in = &args->inputs[0];
    out = &args->outputs[0];
    status = scan_check_pair(in, out, op->dtypes, op->max_rank, op->strided_ok, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component, message);
    }
    if (in->data == NULL || out->data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component,
                                    "the input or output data pointer is NULL");
    }
    size = scan_dtype_size(in->dtype);
    if (!scan_aligned(in->data, size) || !scan_aligned(out->data, size)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component,
                                    "tensor data must be aligned to the element size");
    }
    if (in->data == out->data) {
        /* In place only with the very same layout: each element is read before it is written. */
        int same = op->in_place_ok;
        for (i = 1; same && i < in->rank; ++i) {
            same = in->strides[i] == out->strides[i];
        }
        if (!same) {
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->component,
                                        op->in_place_ok ? "in place needs identical input and output strides"
                                                        : "this scan does not run in place");
        }
    }
    scan_run(in, out, op->exclusive);
    return GUILD_STATUS_OK;
}

/*
 * Registers one scan implementation with the GOP1 contract filled from the arguments. The
 * descriptor and extension live on this frame; the host copies them inside register_kernel.
 */
static guild_status_t scan_register(const guild_host_api_v1_t* host, scan_op_t* op, const char* op_name,
                                    int32_t priority, uint64_t capabilities, uint64_t numerics, uint32_t layouts,
                                    uint32_t memory_spaces, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.header.next = NULL;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.capabilities = capabilities;
    gop.numerics = numerics;
    /* Input and output must share one dtype of a set; validate checks that. */
    gop.input_dtype = GUILD_DTYPE_ANY;
    gop.output_dtype = GUILD_DTYPE_ANY;
    gop.min_inputs = 1u;
    gop.max_inputs = 1u;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = layouts;
    gop.memory_spaces = memory_spaces;
    /* The smallest element size (f32, i32); execute checks 8 bytes for f64 and i64. */
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = op->max_rank;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = scan_validate;
    gop.query_scratch = scan_query_scratch;
    gop.execute = scan_execute;
    gop.user_data = op;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = op->component;
    desc.op_name = op_name;
    desc.priority = priority;
    desc.sync_mask = 0u;
    desc.max_batch = 0u;
    desc.required_cpu_isa = 0u;
    desc.kernel_fns = NULL;
    desc.user_data = op;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

#endif /* SCAN_CORE_HELPERS_ONLY */

/* The checks every scan module's init starts with. */
static guild_status_t scan_check_host(const guild_host_api_v1_t* host, void** plugin_state, const char* component,
                                      guild_error_info_t* error) {
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, component,
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, component,
                                    "host table is smaller than the Kernel ABI v1 base or lacks register_kernel");
    }
    if (GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, component,
                                    "host speaks another Kernel ABI major version");
    }
    return GUILD_STATUS_OK;
}

#endif /* GUILD_TEST_SCAN_CORE_H */
