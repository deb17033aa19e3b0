/*
 * service_probe: a runtime module whose three operations let tests drive the operation service's
 * guards from inside a provider call, deterministically.
 *
 *   example.probe.reenter      (impl example.service_probe.reenter.cpu, CPU, host-blocking)
 *     One i32 input of any shape, one i32 output of rank 1 with at least 2 elements. execute
 *     reads a probe_params_t from args->params: the service table and the very handle the caller
 *     is executing. It then calls, through that service, release(handle) and execute(handle,
 *     args) while its own call is still in progress, and writes the two statuses to output[0]
 *     and output[1]. A correct service refuses both (GUILD_STATUS_ERR_BUSY) and keeps the handle.
 *     With room for four statuses it also reshapes the handle (to its own shapes) through that
 *     service and through this module's own host table, each after checking that the table's
 *     struct_size covers reshape, and writes those statuses to output[2] and output[3]
 *     (PROBE_NO_RESHAPE, -1000, when the table has none). Without params it writes zeros.
 *
 *   example.probe.stream_copy  (impl example.service_probe.stream_copy.cuda, CUDA backend)
 *     Declared for stream-ordered and graph-capturable calls on host, pinned or managed memory,
 *     so that tests can resolve and execute stream-ordered work without a GPU: execute copies
 *     the rank-1 input to the output on the host at once (there is no device); what the tests
 *     observe is the host's bookkeeping of the streams it was given.
 *
 *   example.probe.cross        (impl example.service_probe.cross.cpu, CPU, host-blocking)
 *     The reenter probe's tensors. execute reads a probe_cross_t from args->params: another
 *     handle, the args to execute it with, and a counter shared with the call that runs that
 *     other handle. It counts itself in, waits (up to five seconds) until both calls are in, then
 *     executes the other handle through the service table from this module's own host table,
 *     and writes that status to output[0] and 1 to output[1]. Two such calls on two threads,
 *     each naming the other's handle, are the classic lock-order deadlock: a correct service
 *     answers at least one of them GUILD_STATUS_ERR_BUSY. Without params it writes two zeros.
 *
 *   example.probe.device_copy  (impl example.service_probe.device_copy.cuda, CUDA backend)
 *     Declared for host-blocking calls on device memory only. execute copies the rank-1 input
 *     to the output with memcpy, as a provider that trusted the memory space would hand the
 *     pointers to the device; tests use it to show that host memory never reaches it labelled
 *     as device memory through the safe Rust face.
 *
 * All operations are op version 1.0.0, priority 1, no scratch.
 */
#define _POSIX_C_SOURCE 200809L

#include <guild/abi/module_abi.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define PROBE_COMPONENT "example.service_probe"
#define PROBE_REENTER_ID "example.service_probe.reenter.cpu"
#define PROBE_STREAM_ID "example.service_probe.stream_copy.cuda"
#define PROBE_CROSS_ID "example.service_probe.cross.cpu"
#define PROBE_DEVICE_ID "example.service_probe.device_copy.cuda"
/* What the reenter probe writes for a reshape it could not call: the table has no reshape tail. */
#define PROBE_NO_RESHAPE (-1000)

/* What example.probe.reenter reads from args->params. */
typedef struct probe_params_t {
    uint32_t struct_size;
    uint32_t reserved;
    const guild_operation_service_v1_t* service;
    guild_op_handle_t* handle;
} probe_params_t;

/* What example.probe.cross reads from args->params. */
typedef struct probe_cross_t {
    uint32_t struct_size;
    uint32_t reserved;
    guild_op_handle_t* other;
    const guild_execute_args_v1_t* other_args;
    int* arrived;
} probe_cross_t;

static int probe_user_data;

/* The service from this module's own host table, copied at init (zeroed when absent). */
static guild_operation_service_v1_t probe_service;

static guild_status_t probe_one_in_one_out(const guild_operation_query_v1_t* query, guild_error_info_t* error) {
    if (query == NULL || query->input_count != 1u || query->output_count != 1u || query->inputs == NULL ||
        query->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT,
                                    "the probe takes one input and one output");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t reenter_validate(void* user_data, const guild_operation_query_v1_t* query,
                                       guild_error_info_t* error) {
    guild_status_t status = probe_one_in_one_out(query, error);
    (void)user_data;
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (query->outputs[0].rank != 1u || query->outputs[0].dims[0] < 2u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, PROBE_COMPONENT,
                                    "the output must be rank 1 with room for two statuses");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t probe_no_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                       guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    (void)user_data;
    (void)query;
    if (out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT, "no scratch record");
    }
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t reenter_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const probe_params_t* params;
    guild_error_info_t inner = GUILD_ERROR_INFO_INITIALIZER();
    int32_t* out;
    (void)user_data;
    if (args == NULL || args->output_count != 1u || args->outputs == NULL || args->outputs[0].data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT, "no output");
    }
    out = (int32_t*)args->outputs[0].data;
    out[0] = 0;
    out[1] = 0;
    if (args->params == NULL || args->params_size < sizeof(probe_params_t)) {
        return GUILD_STATUS_OK;
    }
    params = (const probe_params_t*)args->params;
    if (params->service == NULL || params->service->release == NULL || params->service->execute == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT,
                                    "params carry no usable service");
    }
    out[0] = params->service->release(params->service->user, params->handle, &inner);
    out[1] = params->service->execute(params->service->user, params->handle, args, &inner);
    if (args->outputs[0].dims[0] >= 4u) {
        /* A reshape of the running handle (to the shapes it has), through the caller's table and
         * through this module's own; each only when the table has the reshape tail. */
        guild_reshape_args_v1_t same;
        memset(&same, 0, sizeof same);
        same.struct_size = (uint32_t)sizeof same;
        same.inputs = args->inputs;
        same.input_count = args->input_count;
        same.outputs = args->outputs;
        same.output_count = args->output_count;
        out[2] = params->service->struct_size >= GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE && params->service->reshape
                     ? params->service->reshape(params->service->user, params->handle, &same, &inner)
                     : PROBE_NO_RESHAPE;
        out[3] = probe_service.struct_size >= GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE && probe_service.reshape
                     ? probe_service.reshape(probe_service.user, params->handle, &same, &inner)
                     : PROBE_NO_RESHAPE;
    }
    return GUILD_STATUS_OK;
}

static guild_status_t cross_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const probe_cross_t* params;
    guild_error_info_t inner = GUILD_ERROR_INFO_INITIALIZER();
    struct timespec pause;
    int32_t* out;
    int waited;
    (void)user_data;
    if (args == NULL || args->output_count != 1u || args->outputs == NULL || args->outputs[0].data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT, "no output");
    }
    out = (int32_t*)args->outputs[0].data;
    out[0] = 0;
    out[1] = 0;
    if (args->params == NULL || args->params_size < sizeof(probe_cross_t)) {
        return GUILD_STATUS_OK;
    }
    params = (const probe_cross_t*)args->params;
    if (probe_service.execute == NULL || params->arrived == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, PROBE_COMPONENT,
                                    "the host table carried no operation service");
    }
    __atomic_add_fetch(params->arrived, 1, __ATOMIC_SEQ_CST);
    pause.tv_sec = 0;
    pause.tv_nsec = 1000000L;
    for (waited = 0; waited < 5000 && __atomic_load_n(params->arrived, __ATOMIC_SEQ_CST) < 2; ++waited) {
        nanosleep(&pause, NULL);
    }
    out[0] = probe_service.execute(probe_service.user, params->other, params->other_args, &inner);
    out[1] = 1;
    return GUILD_STATUS_OK;
}

static guild_status_t stream_validate(void* user_data, const guild_operation_query_v1_t* query,
                                      guild_error_info_t* error) {
    guild_status_t status = probe_one_in_one_out(query, error);
    (void)user_data;
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (query->inputs[0].dtype != query->outputs[0].dtype || query->inputs[0].dims[0] != query->outputs[0].dims[0]) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, PROBE_COMPONENT,
                                    "input and output must have the same dtype and length");
    }
    /* The contract declares rank 1; the copy reads dims[0] only, so refuse what it would drop. */
    if (query->inputs[0].rank != 1u || query->outputs[0].rank != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, PROBE_COMPONENT,
                                    "the stream copies take rank-1 tensors only");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t stream_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    size_t bytes;
    (void)user_data;
    if (args == NULL || args->input_count != 1u || args->output_count != 1u || args->inputs[0].data == NULL ||
        args->outputs[0].data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT, "no tensors");
    }
    if (args->sync_mode != GUILD_SYNC_STREAM_ORDERED && args->sync_mode != GUILD_SYNC_GRAPH_CAPTURABLE) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, PROBE_COMPONENT,
                                    "stream_copy runs stream-ordered only");
    }
    /* The host checked the dtype against the contract; 4-byte elements are all tests use. */
    bytes = (size_t)args->inputs[0].dims[0] * 4u;
    memcpy(args->outputs[0].data, args->inputs[0].data, bytes);
    return GUILD_STATUS_OK;
}

static guild_status_t device_copy_execute(void* user_data, const guild_execute_args_v1_t* args,
                                          guild_error_info_t* error) {
    size_t bytes;
    (void)user_data;
    if (args == NULL || args->input_count != 1u || args->output_count != 1u || args->inputs[0].data == NULL ||
        args->outputs[0].data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT, "no tensors");
    }
    bytes = (size_t)args->inputs[0].dims[0] * 4u;
    memcpy(args->outputs[0].data, args->inputs[0].data, bytes);
    return GUILD_STATUS_OK;
}

static guild_status_t probe_register(const guild_host_api_v1_t* host, const char* impl_id, const char* op_name,
                                     uint32_t backend, uint32_t dtype, uint32_t memory_spaces, uint32_t sync_modes,
                                     uint32_t max_rank,
                                     guild_status_t (*validate)(void*, const guild_operation_query_v1_t*,
                                                                guild_error_info_t*),
                                     guild_status_t (*execute)(void*, const guild_execute_args_v1_t*,
                                                               guild_error_info_t*),
                                     guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;
    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.input_dtype = dtype;
    gop.output_dtype = dtype;
    gop.min_inputs = 1u;
    gop.max_inputs = 1u;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS;
    gop.memory_spaces = memory_spaces;
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = max_rank;
    gop.sync_modes = sync_modes;
    gop.validate = validate;
    gop.query_scratch = probe_no_scratch;
    gop.execute = execute;
    gop.user_data = &probe_user_data;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = backend;
    desc.impl_id = impl_id;
    desc.op_name = op_name;
    desc.priority = 1;
    desc.user_data = &probe_user_data;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static guild_status_t probe_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_status_t status;
    if (host == NULL || plugin_state == NULL || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, PROBE_COMPONENT, "no host table");
    }
    *plugin_state = NULL;
    memset(&probe_service, 0, sizeof probe_service);
    if (host->struct_size >= sizeof(guild_host_api_v1_t) && host->operations != NULL &&
        host->operations->struct_size >= GUILD_OPERATION_SERVICE_V1_BASE_SIZE) {
        /* Copy what this host has: an older one has no reshape tail, which stays NULL. */
        memcpy(&probe_service, host->operations,
               host->operations->struct_size < sizeof probe_service ? host->operations->struct_size
                                                                    : sizeof probe_service);
    }
    status = probe_register(host, PROBE_CROSS_ID, "example.probe.cross", GUILD_BACKEND_CPU, GUILD_DTYPE_I32,
                            GUILD_MEMORY_HOST, GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING),
                            (uint32_t)GUILD_MAX_TENSOR_RANK, reenter_validate, cross_execute, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = probe_register(host, PROBE_REENTER_ID, "example.probe.reenter", GUILD_BACKEND_CPU, GUILD_DTYPE_I32,
                            GUILD_MEMORY_HOST, GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING),
                            (uint32_t)GUILD_MAX_TENSOR_RANK, reenter_validate, reenter_execute, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = probe_register(host, PROBE_STREAM_ID, "example.probe.stream_copy", GUILD_BACKEND_CUDA,
                            GUILD_DTYPE_ANY, GUILD_MEMORY_HOST | GUILD_MEMORY_HOST_PINNED | GUILD_MEMORY_MANAGED,
                            GUILD_SYNC_BIT(GUILD_SYNC_STREAM_ORDERED) | GUILD_SYNC_BIT(GUILD_SYNC_GRAPH_CAPTURABLE),
                            1u, stream_validate, stream_execute, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    return probe_register(host, PROBE_DEVICE_ID, "example.probe.device_copy", GUILD_BACKEND_CUDA, GUILD_DTYPE_ANY,
                          GUILD_MEMORY_DEVICE, GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING), 1u, stream_validate,
                          device_copy_execute, error);
}

static void probe_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t probe_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "service_probe",
    "1.0.0",
    probe_init,
    probe_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &probe_descriptor;
}
