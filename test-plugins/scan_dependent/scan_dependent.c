/*
 * scan_dependent: a runtime module that depends on scan_module (a module_dependencies edge with
 * abi_tag guild.module.v1 in its manifest) and implements one operation of its own by calling
 * the base module through the host's operation service:
 *   example.sequence.scan_then_total  (impl example.dependent.total.cpu)
 * Input: one tensor (f32, f64, i32 or i64, rank 1..8, any outer strides). Output: the same
 * dtype and rank, dims[0] == 1 and the input's outer extents; each output element is the last
 * element of the inclusive scan of the matching input row, i.e. the row's total.
 *
 * init copies *host_api->operations when the host table is long enough to carry the optional
 * tail and the service's struct_size and version are acceptable. It keeps the copy, never the
 * pointer: the host table is a staging area that dies when init returns, while the copied service
 * and its `user` stay valid until the host's registry is destroyed. init never calls the service
 * (the registry is in the middle of loading this module). A host that offers no service (an old
 * host, or a loader driven without a registry, as in the adapters' tests) still loads the module;
 * execute then fails with GUILD_STATUS_ERR_UNSUPPORTED, because the service arrives only with a
 * host that has a registry.
 *
 * Each execute resolves example.sequence.inclusive_scan (any provider, op version 1.x,
 * deterministic and ordered), runs it into the caller's host scratch (query_scratch asks for one
 * packed copy of the input) and releases the handle before returning, so this module never holds
 * a handle across calls and has none to release at shutdown.
 */
#define SCAN_CORE_HELPERS_ONLY
#include "scan_core.h"

#include <stdlib.h>

#define DEP_COMPONENT "example.dependent.total.cpu"
#define DEP_MAGIC 0xde9e4de4u
#define DEP_BASE_OP "example.sequence.inclusive_scan"

typedef struct dep_state_t {
    uint32_t magic;
    int has_service;
    /* The host's operation service, copied during init. */
    guild_operation_service_v1_t service;
} dep_state_t;

static dep_state_t* dep_state(void* user_data) {
    dep_state_t* state = (dep_state_t*)user_data;
    return state != NULL && state->magic == DEP_MAGIC ? state : NULL;
}

/* Checks the input/output pair; on success writes the input's element count. */
static guild_status_t dep_check(const guild_tensor_desc_v1_t* in, const guild_tensor_desc_v1_t* out,
                                uint64_t* in_elements, char* message, size_t message_size) {
    uint64_t eff[GUILD_MAX_TENSOR_RANK];
    uint64_t count;
    uint64_t out_count;
    char reason[160];
    uint32_t i;
    if (scan_dtype_bit(in->dtype) == 0u) {
        (void)snprintf(message, message_size, "input dtype %u is not supported (f32, f64, i32, i64)",
                       (unsigned)in->dtype);
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
    if (!scan_tensor_layout(in, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, eff, &count, reason, sizeof reason)) {
        (void)snprintf(message, message_size, "input: %s", reason);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (!scan_tensor_layout(out, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, eff, &out_count, reason, sizeof reason)) {
        (void)snprintf(message, message_size, "output: %s", reason);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (out->dims[0] != 1u) {
        (void)snprintf(message, message_size, "output dims[0] must be 1 (one total per row), not %llu",
                       (unsigned long long)out->dims[0]);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    for (i = 1; i < in->rank; ++i) {
        if (out->dims[i] != in->dims[i]) {
            (void)snprintf(message, message_size, "output shape differs from input shape at axis %u (%llu != %llu)",
                           (unsigned)i, (unsigned long long)out->dims[i], (unsigned long long)in->dims[i]);
            return GUILD_STATUS_ERR_UNSUPPORTED;
        }
    }
    if (count > UINT64_MAX / 8u) {
        (void)snprintf(message, message_size, "the input is too large for a scratch copy");
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    *in_elements = count;
    return GUILD_STATUS_OK;
}

static guild_status_t dep_validate(void* user_data, const guild_operation_query_v1_t* query,
                                   guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    uint64_t elements;
    guild_status_t status;
    if (dep_state(user_data) == NULL || query == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT,
                                    "validate needs the module state and a query");
    }
    if (query->input_count != 1u || query->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, DEP_COMPONENT,
                                    "scan_then_total takes exactly one input and one output");
    }
    if (query->inputs == NULL || query->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT,
                                    "the query's input or output array is NULL");
    }
    status = dep_check(&query->inputs[0], &query->outputs[0], &elements, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, status, DEP_COMPONENT, message);
    }
    return GUILD_STATUS_OK;
}

static guild_status_t dep_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                        guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    uint64_t elements;
    guild_status_t status;
    if (dep_state(user_data) == NULL || query == NULL || out_scratch == NULL || query->inputs == NULL ||
        query->outputs == NULL || query->input_count != 1u || query->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT,
                                    "query_scratch needs the module state, a one-in one-out query and an output");
    }
    status = dep_check(&query->inputs[0], &query->outputs[0], &elements, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT, message);
    }
    /* One packed copy of the input receives the inclusive scan. */
    out_scratch->alignment = 8u;
    out_scratch->host_bytes = elements * (uint64_t)scan_dtype_size(query->inputs[0].dtype);
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

/* Reports a failure of the base operation under this module's component. */
static guild_status_t dep_fail(guild_error_info_t* error, guild_status_t status, const char* step,
                               const guild_error_info_t* inner) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    (void)snprintf(message, sizeof message, "%s " DEP_BASE_OP " failed: %.64s: %.300s", step, inner->component,
                   inner->message);
    return guild_error_info_set(error, status, DEP_COMPONENT, message);
}

static guild_status_t dep_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    dep_state_t* state = dep_state(user_data);
    const guild_tensor_desc_v1_t* in;
    const guild_tensor_desc_v1_t* out;
    guild_tensor_desc_v1_t scanned;
    guild_operation_query_v1_t query;
    guild_execute_args_v1_t inner_args;
    guild_scratch_request_v1_t inner_scratch;
    guild_error_info_t inner = GUILD_ERROR_INFO_INITIALIZER();
    guild_error_info_t ignored = GUILD_ERROR_INFO_INITIALIZER();
    guild_op_handle_t* handle = NULL;
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    uint64_t elements;
    uint64_t out_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t index[GUILD_MAX_TENSOR_RANK];
    uint64_t out_count;
    uint64_t row;
    size_t size;
    guild_status_t status;

    if (state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT,
                                    "execute got no module state in user_data");
    }
    if (!state->has_service) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, DEP_COMPONENT,
                                    "no operation service: the host offered none at init, so "
                                    DEP_BASE_OP " cannot be resolved");
    }
    if (args == NULL || args->inputs == NULL || args->outputs == NULL || args->input_count != 1u ||
        args->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT,
                                    "execute needs one input and one output");
    }
    if (args->sync_mode != GUILD_SYNC_HOST_BLOCKING) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, DEP_COMPONENT,
                                    "this CPU operation runs host-blocking only");
    }
    in = &args->inputs[0];
    out = &args->outputs[0];
    status = dep_check(in, out, &elements, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT, message);
    }
    size = scan_dtype_size(in->dtype);
    if (in->data == NULL || out->data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT,
                                    "the input or output data pointer is NULL");
    }
    if (args->scratch_host == NULL || args->scratch_host_size < elements * (uint64_t)size ||
        !scan_aligned(args->scratch_host, 8u)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, DEP_COMPONENT,
                                    "execute needs the host scratch query_scratch asked for (8-byte aligned)");
    }

    /* The scan goes into a packed tensor of the input's shape in the scratch buffer. */
    memset(&scanned, 0, sizeof scanned);
    scanned.dtype = in->dtype;
    scanned.rank = in->rank;
    memcpy(scanned.dims, in->dims, sizeof scanned.dims);
    scanned.memory_space = GUILD_MEMORY_HOST;
    scanned.device_id = 0;
    scanned.data = args->scratch_host;

    memset(&query, 0, sizeof query);
    query.struct_size = (uint32_t)sizeof query;
    query.version = GUILD_OPERATION_QUERY_VERSION;
    query.op_name = DEP_BASE_OP;
    query.min_op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    query.max_op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 4095, 4095);
    query.backends = GUILD_BACKEND_CPU;
    query.sync_mode = GUILD_SYNC_HOST_BLOCKING;
    query.required_capabilities = 0u;
    query.required_numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_ORDERED_REDUCTION;
    query.inputs = in;
    query.input_count = 1u;
    query.outputs = &scanned;
    query.output_count = 1u;
    query.ram_budget = 0u;
    query.vram_budget = 0u;
    query.exact_impl_id = NULL;
    query.device_caps = NULL;
    query.params = NULL;
    query.params_size = 0u;

    status = state->service.resolve(state->service.user, &query, &handle, &inner);
    if (status != GUILD_STATUS_OK) {
        return dep_fail(error, status, "resolving", &inner);
    }
    if (handle == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, DEP_COMPONENT,
                                    "the operation service resolved to a NULL handle");
    }
    memset(&inner_scratch, 0, sizeof inner_scratch);
    inner_scratch.struct_size = (uint32_t)sizeof inner_scratch;
    status = state->service.scratch(state->service.user, handle, &inner_scratch, &inner);
    if (status == GUILD_STATUS_OK && (inner_scratch.host_bytes != 0u || inner_scratch.device_bytes != 0u)) {
        (void)state->service.release(state->service.user, handle, &ignored);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, DEP_COMPONENT,
                                    "the resolved " DEP_BASE_OP " needs scratch, which this module does not provide");
    }
    if (status == GUILD_STATUS_OK) {
        memset(&inner_args, 0, sizeof inner_args);
        inner_args.struct_size = (uint32_t)sizeof inner_args;
        inner_args.inputs = in;
        inner_args.input_count = 1u;
        inner_args.outputs = &scanned;
        inner_args.output_count = 1u;
        inner_args.scratch_host = NULL;
        inner_args.scratch_host_size = 0u;
        inner_args.scratch_device = NULL;
        inner_args.scratch_device_size = 0u;
        inner_args.stream = NULL;
        inner_args.device_id = 0;
        inner_args.sync_mode = GUILD_SYNC_HOST_BLOCKING;
        inner_args.params = NULL;
        inner_args.params_size = 0u;
        status = state->service.execute(state->service.user, handle, &inner_args, &inner);
        if (status != GUILD_STATUS_OK) {
            (void)state->service.release(state->service.user, handle, &ignored);
            return dep_fail(error, status, "executing", &inner);
        }
    } else {
        (void)state->service.release(state->service.user, handle, &ignored);
        return dep_fail(error, status, "asking the scratch of", &inner);
    }
    status = state->service.release(state->service.user, handle, &inner);
    if (status != GUILD_STATUS_OK) {
        return dep_fail(error, status, "releasing", &inner);
    }

    /* Only now is the output written: the last scanned element of each row. */
    if (!scan_tensor_layout(out, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, out_eff, &out_count, message, sizeof message)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, DEP_COMPONENT, message);
    }
    memset(index, 0, sizeof index);
    for (row = 0; row < out_count; ++row) {
        uint64_t out_off = 0u;
        uint32_t axis;
        const unsigned char* src =
            (const unsigned char*)args->scratch_host + (size_t)(row * in->dims[0] + in->dims[0] - 1u) * size;
        for (axis = 1; axis < out->rank; ++axis) {
            out_off += index[axis] * out_eff[axis];
        }
        memcpy((unsigned char*)out->data + (size_t)out_off * size, src, size);
        for (axis = 1; axis < out->rank; ++axis) {
            if (++index[axis] < out->dims[axis]) {
                break;
            }
            index[axis] = 0u;
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t dep_register(const guild_host_api_v1_t* host, dep_state_t* state, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.header.next = NULL;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.capabilities = 0u;
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_ORDERED_REDUCTION;
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
    gop.validate = dep_validate;
    gop.query_scratch = dep_query_scratch;
    gop.execute = dep_execute;
    gop.user_data = state;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = DEP_COMPONENT;
    desc.op_name = "example.sequence.scan_then_total";
    desc.priority = 10;
    desc.sync_mask = 0u;
    desc.kernel_fns = NULL;
    desc.user_data = state;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static guild_status_t dep_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    dep_state_t* state;
    const guild_operation_service_v1_t* service;
    guild_status_t status = scan_check_host(host, plugin_state, DEP_COMPONENT, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    state = (dep_state_t*)calloc(1u, sizeof *state);
    if (state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, DEP_COMPONENT, "cannot allocate state");
    }
    state->magic = DEP_MAGIC;
    /* Written before anything can fail, so that shutdown frees it on every path. */
    *plugin_state = state;

    /* The optional tail: read it only when the table is long enough, then check the service and
     * copy it. Never called here: the registry is busy loading this module. */
    service = (size_t)host->struct_size >= GUILD_HOST_API_V1_BASE_SIZE + sizeof(void*) ? host->operations : NULL;
    if (service != NULL && service->struct_size >= (uint32_t)GUILD_OPERATION_SERVICE_V1_BASE_SIZE &&
        service->version == GUILD_OPERATION_SERVICE_VERSION && service->resolve != NULL &&
        service->scratch != NULL && service->execute != NULL && service->release != NULL) {
        /* A newer header's table may be longer than this host's: copy what the host has. */
        memset(&state->service, 0, sizeof state->service);
        memcpy(&state->service, service,
               service->struct_size < sizeof state->service ? service->struct_size : sizeof state->service);
        state->has_service = 1;
    }
    return dep_register(host, state, error);
}

static void dep_shutdown(void* plugin_state) {
    dep_state_t* state = (dep_state_t*)plugin_state;
    if (state != NULL) {
        state->magic = 0u;
        free(state);
    }
}

static const guild_plugin_descriptor_v1_t dep_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "scan_dependent",
    "1.0.0",
    dep_init,
    dep_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &dep_descriptor;
}
