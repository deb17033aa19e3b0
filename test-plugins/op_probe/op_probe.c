/*
 * op_probe: a runtime module whose candidates exist to be rejected. It registers twenty GOP1
 * implementations of one namespaced operation,
 *
 *   example.probe.copy   y = x: one input, one output of the same dtype and shape, the output's
 *                        outer strides honoured independently of the input's,
 *
 * and one implementation of a second operation, example.probe.zero (no input, one output filled
 * with zero bytes), which exists so that an exact request can name an impl id registered for
 * another operation.
 *
 * The copy candidates share one baseline contract and each departs from it in exactly one
 * respect, so that a single query (the "baseline query" of crates/app/tests/it/rejections.rs)
 * draws a different rejection from each of them. The baseline contract:
 *   backend cpu, priority 10, op version 1.0.0, capability PROBE_CAP_MIXED_LAYOUTS, numerics
 *   deterministic and exact-integer, dtype any (validate wants the same dtype on both sides),
 *   exactly one input and one output, contiguous and outer-strided layouts, host memory,
 *   alignment 4, rank 1..8, no per-axis or batch bound, host-blocking, no SM bounds, no ISA.
 * The baseline query: f32 [8, 2] input at 0x10010, f32 [8, 2] output with outer stride 10 at
 * 0x20010; backends cpu|cuda; capability PROBE_CAP_MIXED_LAYOUTS; numerics deterministic;
 * host-blocking; versions 1.x; RAM budget 4096 bytes; no CUDA device; CPU sse4.2|avx|avx2.
 *
 * The candidates (impl id: the one departure, and the rejection the baseline query draws):
 *   example.probe.version.cpu       op version 2.0.0                 VersionOutOfInterval
 *   example.probe.backend.hip       backend hip                      BackendNotPermitted
 *   example.probe.caps.cpu          no capability bits              MissingCapabilities
 *   example.probe.numerics.cpu      no numerics bits                 MissingNumerics
 *   example.probe.stream.cuda       cuda, stream-ordered and
 *                                   graph-capturable only            SyncModeUnsupported
 *   example.probe.arity.cpu         exactly two inputs               ArityOutOfRange
 *   example.probe.rank.cpu          rank 1..1                        RankOutOfRange
 *   example.probe.dims.cpu          max_dim[0] = 4                   DimensionTooLarge
 *   example.probe.batch.cpu         max_batch = 1                    BatchTooLarge
 *   example.probe.dtype.cpu         input dtype f64                  DtypeMismatch
 *   example.probe.layout.cpu        contiguous layouts only          LayoutUnsupported
 *   example.probe.align.cpu         alignment 64                     Misaligned
 *   example.probe.devmem.cuda       cuda, device memory only         MemorySpaceNotPermitted
 *   example.probe.cuda.cuda         cuda                             NoCudaDevice
 *   example.probe.sm.cuda           cuda, SM 9.0..=10.0              NoCudaDevice (SmOutOfRange
 *                                                                    when the query reports SM 8.0)
 *   example.probe.isa.cpu           requires avx2|avx512f            MissingIsa
 *   example.probe.refuses.cpu       validate always refuses          ValidateRefused
 *   example.probe.scratch.cpu       query_scratch refuses more than
 *                                   4 input elements                 ScratchRefused
 *   example.probe.budget.cpu        query_scratch asks 65536 bytes   OverBudget
 *   example.probe.reference.cpu     none: priority 1, op version 1.1.0, validate checks that the
 *                                   output has the input's dtype and shape, execute copies
 *
 * The first sixteen are rejected from their declarations alone, so the host must never call
 * them. Each of their callbacks counts the call in probe_static_calls and refuses; the validate
 * of example.probe.refuses.cpu reports that count in its refusal message ("... were called 0
 * times"), which lets a test see that no statically rejected provider was ever called. The
 * counter is a plain integer: in a correct host nothing ever writes it, so reading it is never a
 * race; a host that does call these callbacks concurrently is already failing the test.
 *
 * The negotiating candidates (refuses, scratch, budget) accept every query in validate (except
 * refuses) so that their rejection does not depend on the shapes; their execute refuses, since
 * a correct host never chooses them. The CUDA and HIP candidates are declarations only.
 *
 * C99, the installed SDK and the C standard library only; everything but the entry point is
 * static.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#include <stdio.h>
#include <string.h>

#define PROBE_COMPONENT "example.probe"
#define PROBE_COPY_OP "example.probe.copy"
#define PROBE_ZERO_OP "example.probe.zero"
#define PROBE_MAGIC 0x9e0b3a11u

/* Capability bit 0 of example.probe.copy: input and output may have different layouts. */
#define PROBE_CAP_MIXED_LAYOUTS ((uint64_t)1 << 0)

/* How many elements example.probe.scratch.cpu stages; larger inputs make its scratch query fail. */
#define PROBE_SCRATCH_MAX_ELEMENTS 4u
/* The host scratch example.probe.budget.cpu asks for. */
#define PROBE_BUDGET_BYTES 65536u

/* The one respect in which a candidate departs from the baseline contract. */
typedef enum probe_kind_t {
    PROBE_REFERENCE,
    PROBE_ZERO,
    PROBE_VERSION,
    PROBE_BACKEND,
    PROBE_CAPS,
    PROBE_NUMERICS,
    PROBE_STREAM,
    PROBE_ARITY,
    PROBE_RANK,
    PROBE_DIMS,
    PROBE_BATCH,
    PROBE_DTYPE,
    PROBE_LAYOUT,
    PROBE_ALIGN,
    PROBE_DEVMEM,
    PROBE_CUDA,
    PROBE_SM,
    PROBE_ISA,
    PROBE_REFUSES,
    PROBE_SCRATCH,
    PROBE_BUDGET
} probe_kind_t;

/* One registered implementation: its callbacks' user_data. Static and never written. */
typedef struct probe_t {
    uint32_t magic;
    probe_kind_t kind;
    const char* impl_id;
} probe_t;

static const probe_t probes[] = {
    {PROBE_MAGIC, PROBE_VERSION, "example.probe.version.cpu"},
    {PROBE_MAGIC, PROBE_BACKEND, "example.probe.backend.hip"},
    {PROBE_MAGIC, PROBE_CAPS, "example.probe.caps.cpu"},
    {PROBE_MAGIC, PROBE_NUMERICS, "example.probe.numerics.cpu"},
    {PROBE_MAGIC, PROBE_STREAM, "example.probe.stream.cuda"},
    {PROBE_MAGIC, PROBE_ARITY, "example.probe.arity.cpu"},
    {PROBE_MAGIC, PROBE_RANK, "example.probe.rank.cpu"},
    {PROBE_MAGIC, PROBE_DIMS, "example.probe.dims.cpu"},
    {PROBE_MAGIC, PROBE_BATCH, "example.probe.batch.cpu"},
    {PROBE_MAGIC, PROBE_DTYPE, "example.probe.dtype.cpu"},
    {PROBE_MAGIC, PROBE_LAYOUT, "example.probe.layout.cpu"},
    {PROBE_MAGIC, PROBE_ALIGN, "example.probe.align.cpu"},
    {PROBE_MAGIC, PROBE_DEVMEM, "example.probe.devmem.cuda"},
    {PROBE_MAGIC, PROBE_CUDA, "example.probe.cuda.cuda"},
    {PROBE_MAGIC, PROBE_SM, "example.probe.sm.cuda"},
    {PROBE_MAGIC, PROBE_ISA, "example.probe.isa.cpu"},
    {PROBE_MAGIC, PROBE_REFUSES, "example.probe.refuses.cpu"},
    {PROBE_MAGIC, PROBE_SCRATCH, "example.probe.scratch.cpu"},
    {PROBE_MAGIC, PROBE_BUDGET, "example.probe.budget.cpu"},
    {PROBE_MAGIC, PROBE_REFERENCE, "example.probe.reference.cpu"},
    {PROBE_MAGIC, PROBE_ZERO, "example.probe.zero.cpu"},
};

/* Calls the host made into candidates it should have rejected from their declarations. */
static unsigned long probe_static_calls;

/* Whether the host is expected to reject this candidate without calling it. */
static int probe_is_static(const probe_t* p) {
    switch (p->kind) {
        case PROBE_REFERENCE:
        case PROBE_ZERO:
        case PROBE_REFUSES:
        case PROBE_SCRATCH:
        case PROBE_BUDGET:
            return 0;
        default:
            return 1;
    }
}

static const probe_t* probe_of(void* user_data) {
    const probe_t* p = (const probe_t*)user_data;
    return p != NULL && p->magic == PROBE_MAGIC ? p : NULL;
}

/* Element size of a non-quantized dtype, or 0. */
static size_t probe_dtype_size(uint32_t dtype) {
    switch (dtype) {
        case GUILD_DTYPE_I8:
            return 1u;
        case GUILD_DTYPE_F16:
        case GUILD_DTYPE_BF16:
        case GUILD_DTYPE_I16:
            return 2u;
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

/* Effective element strides (eff[0] = 1; 0 in strides[i] means packed) of a tensor the host has
 * already checked. */
static void probe_strides(const guild_tensor_desc_v1_t* t, uint64_t eff[GUILD_MAX_TENSOR_RANK]) {
    uint32_t i;
    eff[0] = 1u;
    for (i = 1; i < (uint32_t)GUILD_MAX_TENSOR_RANK; ++i) {
        if (i < t->rank) {
            eff[i] = t->strides[i] != 0u ? t->strides[i] : eff[i - 1u] * t->dims[i - 1u];
        } else {
            eff[i] = 0u;
        }
    }
}

/*
 * Writes every row (dims[0] elements) of `out`: a copy of the same row of `in`, or zero bytes
 * when `in` is NULL. Both tensors have the same dtype and shape and non-NULL data.
 */
static void probe_rows(const guild_tensor_desc_v1_t* in, const guild_tensor_desc_v1_t* out) {
    uint64_t in_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t out_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t index[GUILD_MAX_TENSOR_RANK];
    size_t size = probe_dtype_size(out->dtype);
    size_t row = (size_t)out->dims[0] * size;
    uint32_t axis;

    probe_strides(out, out_eff);
    if (in != NULL) {
        probe_strides(in, in_eff);
    }
    memset(index, 0, sizeof index);
    for (;;) {
        uint64_t in_off = 0u;
        uint64_t out_off = 0u;
        unsigned char* dst;
        for (axis = 1; axis < out->rank; ++axis) {
            out_off += index[axis] * out_eff[axis];
            if (in != NULL) {
                in_off += index[axis] * in_eff[axis];
            }
        }
        dst = (unsigned char*)out->data + (size_t)out_off * size;
        if (in != NULL) {
            memcpy(dst, (const unsigned char*)in->data + (size_t)in_off * size, row);
        } else {
            memset(dst, 0, row);
        }
        for (axis = 1; axis < out->rank; ++axis) {
            if (++index[axis] < out->dims[axis]) {
                break;
            }
            index[axis] = 0u;
        }
        if (axis >= out->rank) {
            return;
        }
    }
}

/* What example.probe.reference.cpu checks beyond its declaration: one input and one output of
 * the same known dtype and the same shape. */
static guild_status_t probe_check_copy(const probe_t* p, const guild_tensor_desc_v1_t* in, size_t input_count,
                                       const guild_tensor_desc_v1_t* out, size_t output_count,
                                       guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    uint32_t i;
    if (input_count != 1u || output_count != 1u || in == NULL || out == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, p->impl_id,
                                    "a copy takes exactly one input and one output");
    }
    if (probe_dtype_size(in->dtype) == 0u) {
        (void)snprintf(message, sizeof message, "dtype %u is not one this copy knows", (unsigned)in->dtype);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id, message);
    }
    if (out->dtype != in->dtype) {
        (void)snprintf(message, sizeof message, "output dtype %u differs from input dtype %u", (unsigned)out->dtype,
                       (unsigned)in->dtype);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id, message);
    }
    if (out->rank != in->rank || in->rank == 0u || in->rank > (uint32_t)GUILD_MAX_TENSOR_RANK) {
        (void)snprintf(message, sizeof message, "output rank %u differs from input rank %u", (unsigned)out->rank,
                       (unsigned)in->rank);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id, message);
    }
    for (i = 0; i < in->rank; ++i) {
        if (out->dims[i] != in->dims[i]) {
            (void)snprintf(message, sizeof message, "output axis %u has extent %llu, the input's has %llu",
                           (unsigned)i, (unsigned long long)out->dims[i], (unsigned long long)in->dims[i]);
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id, message);
        }
    }
    return GUILD_STATUS_OK;
}

/* Every callback of a statically rejected candidate: counts the call and refuses. */
static guild_status_t probe_static_call(const probe_t* p, const char* callback, guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    ++probe_static_calls;
    (void)snprintf(message, sizeof message,
                   "%s was called, but the host should have rejected this candidate from its declaration", callback);
    return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, p->impl_id, message);
}

static guild_status_t probe_validate(void* user_data, const guild_operation_query_v1_t* query,
                                     guild_error_info_t* error) {
    const probe_t* p = probe_of(user_data);
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    if (p == NULL || query == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT,
                                    "validate needs the probe state and a query");
    }
    if (probe_is_static(p)) {
        return probe_static_call(p, "validate", error);
    }
    switch (p->kind) {
        case PROBE_REFERENCE:
            return probe_check_copy(p, query->inputs, query->input_count, query->outputs, query->output_count, error);
        case PROBE_ZERO:
            if (query->output_count != 1u || query->outputs == NULL ||
                probe_dtype_size(query->outputs[0].dtype) == 0u) {
                return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id,
                                            "zero fills one output of a non-quantized dtype");
            }
            return GUILD_STATUS_OK;
        case PROBE_REFUSES:
            (void)snprintf(message, sizeof message,
                           "this probe refuses every query; statically rejected probes were called %lu times",
                           probe_static_calls);
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id, message);
        default:
            /* scratch and budget accept every query, so that only their scratch query decides. */
            return GUILD_STATUS_OK;
    }
}

static guild_status_t probe_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                          guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    const probe_t* p = probe_of(user_data);
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    if (p == NULL || query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT,
                                    "query_scratch needs the probe state, a query and an output record");
    }
    if (probe_is_static(p)) {
        return probe_static_call(p, "query_scratch", error);
    }
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    if (p->kind == PROBE_SCRATCH) {
        uint64_t elements = 1u;
        uint32_t i;
        if (query->input_count < 1u || query->inputs == NULL) {
            return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, p->impl_id,
                                        "the scratch query needs the input tensor");
        }
        for (i = 0; i < query->inputs[0].rank && i < (uint32_t)GUILD_MAX_TENSOR_RANK; ++i) {
            elements *= query->inputs[0].dims[i];
        }
        if (elements > PROBE_SCRATCH_MAX_ELEMENTS) {
            (void)snprintf(message, sizeof message, "cannot stage %llu elements, at most %u",
                           (unsigned long long)elements, (unsigned)PROBE_SCRATCH_MAX_ELEMENTS);
            return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, p->impl_id, message);
        }
    } else if (p->kind == PROBE_BUDGET) {
        out_scratch->alignment = 64u;
        out_scratch->host_bytes = PROBE_BUDGET_BYTES;
    }
    return GUILD_STATUS_OK;
}

static guild_status_t probe_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const probe_t* p = probe_of(user_data);
    guild_status_t status;
    if (p == NULL || args == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT,
                                    "execute needs the probe state and arguments");
    }
    if (probe_is_static(p)) {
        return probe_static_call(p, "execute", error);
    }
    if (args->sync_mode != GUILD_SYNC_HOST_BLOCKING) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id,
                                    "the probes run host-blocking only");
    }
    switch (p->kind) {
        case PROBE_REFERENCE:
            status = probe_check_copy(p, args->inputs, args->input_count, args->outputs, args->output_count, error);
            if (status != GUILD_STATUS_OK) {
                return status;
            }
            if (args->inputs[0].data == NULL || args->outputs[0].data == NULL) {
                return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, p->impl_id,
                                            "the input or output data pointer is NULL");
            }
            probe_rows(&args->inputs[0], &args->outputs[0]);
            return GUILD_STATUS_OK;
        case PROBE_ZERO:
            if (args->output_count != 1u || args->outputs == NULL || args->outputs[0].data == NULL ||
                probe_dtype_size(args->outputs[0].dtype) == 0u) {
                return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, p->impl_id,
                                            "zero fills one output of a non-quantized dtype with data");
            }
            probe_rows(NULL, &args->outputs[0]);
            return GUILD_STATUS_OK;
        default:
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, p->impl_id,
                                        "this probe only negotiates; a correct host never chooses it");
    }
}

/*
 * Registers one probe: the baseline contract, then its one departure. The descriptor and
 * extension live on this frame; the host copies them inside register_kernel.
 */
static guild_status_t probe_register(const guild_host_api_v1_t* host, const probe_t* p, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.header.next = NULL;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.capabilities = PROBE_CAP_MIXED_LAYOUTS;
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_EXACT_INTEGER;
    gop.input_dtype = GUILD_DTYPE_ANY;
    gop.output_dtype = GUILD_DTYPE_ANY;
    gop.min_inputs = 1u;
    gop.max_inputs = 1u;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS | GUILD_LAYOUT_OUTER_STRIDED;
    gop.memory_spaces = GUILD_MEMORY_HOST;
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = (uint32_t)GUILD_MAX_TENSOR_RANK;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = probe_validate;
    gop.query_scratch = probe_query_scratch;
    gop.execute = probe_execute;
    gop.user_data = (void*)(uintptr_t)p;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = p->impl_id;
    desc.op_name = PROBE_COPY_OP;
    desc.priority = 10;
    desc.sync_mask = 0u;
    desc.max_batch = 0u;
    desc.min_sm = 0u;
    desc.max_sm = 0u;
    desc.required_cpu_isa = 0u;
    desc.kernel_fns = NULL;
    desc.user_data = gop.user_data;
    desc.next_ext = &gop.header;

    switch (p->kind) {
        case PROBE_REFERENCE:
            desc.priority = 1;
            gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 1, 0);
            break;
        case PROBE_ZERO:
            desc.op_name = PROBE_ZERO_OP;
            gop.min_inputs = 0u;
            gop.max_inputs = 0u;
            break;
        case PROBE_VERSION:
            gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(2, 0, 0);
            break;
        case PROBE_BACKEND:
            desc.backend = GUILD_BACKEND_HIP;
            break;
        case PROBE_CAPS:
            gop.capabilities = 0u;
            break;
        case PROBE_NUMERICS:
            gop.numerics = 0u;
            break;
        case PROBE_STREAM:
            desc.backend = GUILD_BACKEND_CUDA;
            gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_STREAM_ORDERED) | GUILD_SYNC_BIT(GUILD_SYNC_GRAPH_CAPTURABLE);
            break;
        case PROBE_ARITY:
            gop.min_inputs = 2u;
            gop.max_inputs = 2u;
            break;
        case PROBE_RANK:
            gop.max_rank = 1u;
            break;
        case PROBE_DIMS:
            desc.max_dim[0] = 4u;
            break;
        case PROBE_BATCH:
            desc.max_batch = 1u;
            break;
        case PROBE_DTYPE:
            gop.input_dtype = GUILD_DTYPE_F64;
            break;
        case PROBE_LAYOUT:
            gop.layouts = GUILD_LAYOUT_CONTIGUOUS;
            break;
        case PROBE_ALIGN:
            gop.min_alignment = 64u;
            break;
        case PROBE_DEVMEM:
            desc.backend = GUILD_BACKEND_CUDA;
            gop.memory_spaces = GUILD_MEMORY_DEVICE;
            break;
        case PROBE_CUDA:
            desc.backend = GUILD_BACKEND_CUDA;
            break;
        case PROBE_SM:
            desc.backend = GUILD_BACKEND_CUDA;
            desc.min_sm = 90u;
            desc.max_sm = 100u;
            break;
        case PROBE_ISA:
            desc.required_cpu_isa = GUILD_CPU_ISA_AVX2 | GUILD_CPU_ISA_AVX512F;
            break;
        case PROBE_REFUSES:
        case PROBE_SCRATCH:
        case PROBE_BUDGET:
            /* The contract is the baseline's; the callbacks do the refusing. */
            break;
    }
    return host->register_kernel(host->host_context, &desc, error);
}

static guild_status_t probe_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    size_t i;
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT,
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT,
                                    "host table is smaller than the Kernel ABI v1 base or lacks register_kernel");
    }
    if (GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, PROBE_COMPONENT,
                                    "host speaks another Kernel ABI major version");
    }
    for (i = 0; i < sizeof probes / sizeof probes[0]; ++i) {
        guild_status_t status = probe_register(host, &probes[i], error);
        if (status != GUILD_STATUS_OK) {
            return status;
        }
    }
    return GUILD_STATUS_OK;
}

static void probe_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t probe_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "op_probe",
    "1.0.0",
    probe_init,
    probe_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &probe_descriptor;
}
