/*
 * good_kernel: a well-behaved Guild plugin that exercises everything a loader must copy.
 *
 * During init it registers two CPU kernels and one runner, each built in init's stack frame:
 *   - test.good_kernel.rms_norm_f32, a legacy GUILD_OP_RMS_NORM kernel whose next_ext chain holds
 *     a vendor extension the host does not know (tag TST1), which a host must skip;
 *   - test.good_kernel.prefix_sum_f32, a namespaced GUILD_OP_CUSTOM operation
 *     (test.sequence.prefix_sum) with a GOP1 contract and working validate / query_scratch /
 *     execute callbacks: an inclusive prefix sum along the innermost axis of an F32 tensor;
 *   - test.good_kernel.runner, a runner with an RMD1 extension that recognises no model.
 * Right after each registration the stack copies (descriptor, extensions and id strings) are
 * overwritten, so a host that kept a pointer into them instead of copying reads garbage.
 *
 * The plugin allocates state in init, copies the operation service when the host offers one,
 * reports what it saw through the log callback, and frees the state in shutdown.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>
#include <guild/abi/runner_abi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOOD_COMPONENT "test.good_kernel"
#define GOOD_MAGIC 0x600d600du

typedef struct good_state_t {
    uint32_t magic;
    int has_operations;
    /* The host's operation service, copied during init as the contract requires. */
    guild_operation_service_v1_t operations;
} good_state_t;

/* Stands in for a frozen legacy function table; the host only carries the pointer. */
typedef struct good_legacy_table_t {
    uint32_t struct_size;
    uint32_t reserved;
} good_legacy_table_t;

static const good_legacy_table_t good_rms_norm_table = {(uint32_t)sizeof(good_legacy_table_t), 0u};

/* A vendor extension no host knows. Hosts skip unknown tags. */
typedef struct good_vendor_ext_t {
    guild_ext_header_t header;
    uint64_t payload;
} good_vendor_ext_t;

/*
 * memset through a volatile pointer: the compiler cannot prove the stores dead, so the stack
 * copies really are overwritten after registration even in an optimised build.
 */
static void* (*volatile good_spoil)(void*, int, size_t) = memset;

static uint64_t good_required_isa(void) {
#if defined(__x86_64__) || defined(_M_X64)
    return GUILD_CPU_ISA_SSE4_2;
#elif defined(__aarch64__) || defined(_M_ARM64)
    return GUILD_CPU_ISA_NEON;
#else
    return 0u;
#endif
}

static int good_state_ok(const void* user_data) {
    return user_data != NULL && ((const good_state_t*)user_data)->magic == GOOD_MAGIC;
}

static int good_same_shape(const guild_tensor_desc_v1_t* a, const guild_tensor_desc_v1_t* b) {
    uint32_t i;
    if (a->rank != b->rank || a->rank == 0u || a->rank > 2u) {
        return 0;
    }
    for (i = 0; i < a->rank; ++i) {
        if (a->dims[i] != b->dims[i]) {
            return 0;
        }
    }
    return 1;
}

static guild_status_t good_validate(void* user_data, const guild_operation_query_v1_t* query,
                                    guild_error_info_t* error) {
    if (!good_state_ok(user_data) || query == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, GOOD_COMPONENT,
                                    "validate needs the plugin state and a query");
    }
    if (query->input_count != 1u || query->output_count != 1u || query->inputs == NULL ||
        query->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, GOOD_COMPONENT,
                                    "prefix_sum takes one input and one output");
    }
    if (!good_same_shape(&query->inputs[0], &query->outputs[0])) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, GOOD_COMPONENT,
                                    "the output must have the input's shape, rank 1 or 2");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t good_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                         guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    if (!good_state_ok(user_data) || query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, GOOD_COMPONENT,
                                    "query_scratch needs the plugin state, a query and an output");
    }
    /* The scan runs in place in the output; it needs no scratch. struct_size is the caller's. */
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t good_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const guild_tensor_desc_v1_t* in;
    const guild_tensor_desc_v1_t* out;
    uint64_t rows;
    uint64_t in_stride;
    uint64_t out_stride;
    uint64_t r;
    uint64_t i;
    if (!good_state_ok(user_data) || args == NULL || args->input_count != 1u || args->output_count != 1u ||
        args->inputs == NULL || args->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, GOOD_COMPONENT,
                                    "execute needs the plugin state, one input and one output");
    }
    in = &args->inputs[0];
    out = &args->outputs[0];
    if (!good_same_shape(in, out) || in->dtype != GUILD_DTYPE_F32 || out->dtype != GUILD_DTYPE_F32 ||
        in->data == NULL || out->data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, GOOD_COMPONENT,
                                    "execute got tensors outside the resolved contract");
    }
    rows = in->rank == 2u ? in->dims[1] : 1u;
    in_stride = (in->rank == 2u && in->strides[1] != 0u) ? in->strides[1] : in->dims[0];
    out_stride = (out->rank == 2u && out->strides[1] != 0u) ? out->strides[1] : out->dims[0];
    for (r = 0; r < rows; ++r) {
        const float* src = (const float*)in->data + r * in_stride;
        float* dst = (float*)out->data + r * out_stride;
        float sum = 0.0f;
        for (i = 0; i < in->dims[0]; ++i) {
            sum += src[i];
            dst[i] = sum;
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t good_register_rms_norm(const guild_host_api_v1_t* host, good_state_t* state,
                                             guild_error_info_t* error) {
    char impl_id[64];
    good_vendor_ext_t vendor;
    guild_kernel_op_desc_v1_t desc;
    guild_status_t status;

    (void)snprintf(impl_id, sizeof impl_id, "%s", "test.good_kernel.rms_norm_f32");
    memset(&vendor, 0, sizeof vendor);
    vendor.header.struct_size = (uint32_t)sizeof vendor;
    vendor.header.tag = GUILD_MAKE_TAG('T', 'S', 'T', '1');
    vendor.header.version = 3u;
    vendor.header.next = NULL;
    vendor.payload = UINT64_C(0x0123456789abcdef);

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_RMS_NORM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = impl_id;
    desc.op_name = NULL;
    desc.priority = 10;
    desc.sync_mask = GUILD_LEGACY_SYNC_HOST;
    desc.max_dim[0] = 8192u;
    desc.max_batch = 0u;
    desc.required_cpu_isa = 0u;
    desc.kernel_fns = &good_rms_norm_table;
    desc.user_data = state;
    desc.next_ext = &vendor.header;

    status = host->register_kernel(host->host_context, &desc, error);
    good_spoil(impl_id, 'X', sizeof impl_id);
    good_spoil(&vendor, 0xa5, sizeof vendor);
    good_spoil(&desc, 0xa5, sizeof desc);
    return status;
}

static guild_status_t good_register_prefix_sum(const guild_host_api_v1_t* host, good_state_t* state,
                                               guild_error_info_t* error) {
    char impl_id[64];
    char op_name[64];
    guild_operation_ext_v1_t op;
    guild_kernel_op_desc_v1_t desc;
    guild_status_t status;

    (void)snprintf(impl_id, sizeof impl_id, "%s", "test.good_kernel.prefix_sum_f32");
    (void)snprintf(op_name, sizeof op_name, "%s", "test.sequence.prefix_sum");

    memset(&op, 0, sizeof op);
    op.header.struct_size = (uint32_t)sizeof op;
    op.header.tag = GUILD_GOP1_TAG;
    op.header.version = GUILD_GOP1_VERSION;
    op.header.next = NULL;
    op.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 2, 0);
    /* Operation-defined capability bits: inclusive scan (bit 0) and row-wise batching (bit 5). */
    op.capabilities = ((uint64_t)1 << 0) | ((uint64_t)1 << 5);
    op.numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION | GUILD_NUMERICS_ORDERED_REDUCTION;
    op.input_dtype = GUILD_DTYPE_F32;
    op.output_dtype = GUILD_DTYPE_F32;
    op.min_inputs = 1u;
    op.max_inputs = 1u;
    op.min_outputs = 1u;
    op.max_outputs = 1u;
    op.layouts = GUILD_LAYOUT_CONTIGUOUS | GUILD_LAYOUT_OUTER_STRIDED;
    op.memory_spaces = GUILD_MEMORY_HOST | GUILD_MEMORY_HOST_PINNED;
    op.min_alignment = 16u;
    op.min_rank = 1u;
    op.max_rank = 2u;
    op.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    op.validate = good_validate;
    op.query_scratch = good_query_scratch;
    op.execute = good_execute;
    op.user_data = state;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = impl_id;
    desc.op_name = op_name;
    desc.priority = 50;
    desc.sync_mask = 0u;
    desc.max_dim[0] = (uint64_t)1 << 20;
    desc.max_dim[1] = (uint64_t)1 << 16;
    desc.max_batch = (uint64_t)1 << 16;
    desc.min_sm = 0u;
    desc.max_sm = 0u;
    desc.required_cpu_isa = good_required_isa();
    desc.kernel_fns = NULL;
    desc.user_data = state;
    desc.next_ext = &op.header;

    status = host->register_kernel(host->host_context, &desc, error);
    good_spoil(impl_id, 'X', sizeof impl_id);
    good_spoil(op_name, 'X', sizeof op_name);
    good_spoil(&op, 0xa5, sizeof op);
    good_spoil(&desc, 0xa5, sizeof desc);
    return status;
}

static guild_status_t good_runner_create(void* user_data, const guild_model_reader_v1_t* model, void** out_instance,
                                         guild_error_info_t* error) {
    (void)user_data;
    (void)model;
    (void)out_instance;
    return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, GOOD_COMPONENT, "the test runner runs no model");
}

static void good_runner_destroy(void* user_data, void* instance) {
    (void)user_data;
    (void)instance;
}

static guild_status_t good_recognize(void* user_data, const guild_model_reader_v1_t* model, guild_error_info_t* error) {
    (void)user_data;
    (void)model;
    return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, GOOD_COMPONENT, "the test runner recognises no model");
}

static guild_status_t good_describe(void* user_data, const guild_model_reader_v1_t* model,
                                    guild_runner_model_v1_t* out_model, guild_error_info_t* error) {
    (void)user_data;
    (void)model;
    (void)out_model;
    return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, GOOD_COMPONENT, "the test runner describes no model");
}

static guild_status_t good_validate_numerics(void* user_data, const guild_model_reader_v1_t* model,
                                             const guild_runner_model_v1_t* description, guild_error_info_t* error) {
    (void)user_data;
    (void)model;
    (void)description;
    return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, GOOD_COMPONENT, "the test runner validates no model");
}

static guild_status_t good_register_runner(const guild_host_api_v1_t* host, good_state_t* state,
                                           guild_error_info_t* error) {
    char runner_id[64];
    guild_runner_model_ext_v1_t model;
    guild_runner_desc_v1_t desc;
    guild_status_t status;

    (void)snprintf(runner_id, sizeof runner_id, "%s", "test.good_kernel.runner");
    memset(&model, 0, sizeof model);
    model.header.struct_size = (uint32_t)sizeof model;
    model.header.tag = GUILD_RMD1_TAG;
    model.header.version = GUILD_RMD1_VERSION;
    model.header.next = NULL;
    model.priority = 7;
    model.recognize = good_recognize;
    model.describe = good_describe;
    model.validate_numerics = good_validate_numerics;
    model.user_data = state;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.runner_id = runner_id;
    desc.priority = 3;
    desc.user_data = state;
    desc.create = good_runner_create;
    desc.destroy = good_runner_destroy;
    desc.next_ext = &model.header;

    status = host->register_runner(host->host_context, &desc, error);
    good_spoil(runner_id, 'X', sizeof runner_id);
    good_spoil(&model, 0xa5, sizeof model);
    good_spoil(&desc, 0xa5, sizeof desc);
    return status;
}

static guild_status_t good_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    good_state_t* state;
    guild_status_t status;
    guild_error_info_t record;
    char message[GUILD_ERROR_MESSAGE_CAPACITY];

    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, GOOD_COMPONENT,
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, GOOD_COMPONENT,
                                    "host table is smaller than the Kernel ABI v1 base");
    }
    if (GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, GOOD_COMPONENT,
                                    "host speaks another Kernel ABI major version");
    }
    state = (good_state_t*)calloc(1u, sizeof *state);
    if (state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, GOOD_COMPONENT, "cannot allocate state");
    }
    state->magic = GOOD_MAGIC;
    /* Written before anything can fail, so that shutdown frees it on every path. */
    *plugin_state = state;

    /* The optional tail: read only when the table is long enough, then check the service. */
    if ((size_t)host->struct_size >= GUILD_HOST_API_V1_BASE_SIZE + sizeof(void*) && host->operations != NULL &&
        host->operations->struct_size >= (uint32_t)GUILD_OPERATION_SERVICE_V1_BASE_SIZE &&
        host->operations->version == GUILD_OPERATION_SERVICE_VERSION) {
        /* A newer header's table may be longer than this host's: copy what the host has. */
        memset(&state->operations, 0, sizeof state->operations);
        memcpy(&state->operations, host->operations,
               host->operations->struct_size < sizeof state->operations ? host->operations->struct_size
                                                                        : sizeof state->operations);
        state->has_operations = 1;
    }

    status = good_register_rms_norm(host, state, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = good_register_prefix_sum(host, state, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = good_register_runner(host, state, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }

    if (host->log != NULL) {
        (void)snprintf(message, sizeof message,
                       "registered 2 kernels and 1 runner; host table of %u bytes; operation service %s",
                       (unsigned)host->struct_size, state->has_operations ? "copied" : "absent");
        guild_error_info_init(&record);
        (void)guild_error_info_set(&record, GUILD_STATUS_OK, GOOD_COMPONENT, message);
        host->log(host->host_context, GUILD_LOG_LEVEL_INFO, &record);
    }
    return GUILD_STATUS_OK;
}

static void good_shutdown(void* plugin_state) {
    good_state_t* state = (good_state_t*)plugin_state;
    if (state != NULL) {
        state->magic = 0u;
        free(state);
    }
}

static const guild_plugin_descriptor_v1_t good_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "good_kernel",
    "1.4.2",
    good_init,
    good_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &good_descriptor;
}
