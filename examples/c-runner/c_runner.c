/*
 * example_c_runner: a minimal native runner that uses the host's operation service.
 *
 * Native code receives the host table (and with it the operation service) when the host loads
 * it as a plugin, so this runner is a runtime module: a Kernel ABI v1 plugin that
 *   1. copies the operation service table from the host table during init (the table itself
 *      is only valid while init runs; the copy stays usable until the host's registry goes);
 *   2. registers one operation of its own,
 *        example.runner.demo_pipeline  (impl example.c_runner.pipeline.cpu)
 *      whose input is one i64 tensor x and whose two outputs have x's shape;
 *   3. in that operation's execute, drives other modules' operations through the service:
 *        outputs[0] = example.sequence.inclusive_scan(x)
 *        outputs[1] = example.sequence.exclusive_scan(x)
 *      Both are resolved first (negotiated with the actual tensors), then executed, then
 *      released, so nothing is written unless both resolve, and no handle outlives the call.
 *
 * The service calls (resolve, execute, release) are all in run_pipeline(), which needs nothing
 * but a copy of the service table; the plugin around it only gets hold of that table and gives
 * the host something to call. See README.md next to this file.
 *
 * C99, the installed SDK's headers and the C standard library only.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUNNER_COMPONENT "example.c_runner.pipeline.cpu"
#define RUNNER_OP "example.runner.demo_pipeline"
#define INCLUSIVE_OP "example.sequence.inclusive_scan"
#define EXCLUSIVE_OP "example.sequence.exclusive_scan"

/* What the plugin keeps between calls: its copy of the host's operation service. */
typedef struct runner_state_t {
    int has_service;
    guild_operation_service_v1_t service;
} runner_state_t;

/* ------------------------------------------------------------------------------------------ */
/* Using the operation service                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* A host-blocking CPU query for any 1.x version of `op_name`, mapping `input` to `output`. */
static void scan_query(guild_operation_query_v1_t* query, const char* op_name, const guild_tensor_desc_v1_t* input,
                       const guild_tensor_desc_v1_t* output) {
    memset(query, 0, sizeof *query);
    query->struct_size = (uint32_t)sizeof *query;
    query->version = GUILD_OPERATION_QUERY_VERSION;
    query->op_name = op_name;
    query->min_op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    query->max_op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 4095, 4095);
    query->backends = GUILD_BACKEND_CPU;
    query->sync_mode = GUILD_SYNC_HOST_BLOCKING;
    /* Ask for what this runner relies on: the same result every run, exact integer sums. */
    query->required_numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_EXACT_INTEGER;
    query->inputs = input;
    query->input_count = 1u;
    query->outputs = output;
    query->output_count = 1u;
    /* No scratch: a provider that would need some is not chosen. */
    query->ram_budget = 0u;
    query->vram_budget = 0u;
    query->exact_impl_id = NULL; /* let the service pick the best provider */
    query->device_caps = NULL;   /* the host's default CPU */
}

/* Host-blocking execute arguments with no scratch, stream or parameters. */
static void scan_args(guild_execute_args_v1_t* args, const guild_tensor_desc_v1_t* input,
                      const guild_tensor_desc_v1_t* output) {
    memset(args, 0, sizeof *args);
    args->struct_size = (uint32_t)sizeof *args;
    args->inputs = input;
    args->input_count = 1u;
    args->outputs = output;
    args->output_count = 1u;
    args->device_id = 0;
    args->sync_mode = GUILD_SYNC_HOST_BLOCKING;
}

/* Records a failed service call under this runner's name, keeping the inner error's text. */
static guild_status_t pipeline_fail(guild_error_info_t* error, guild_status_t status, const char* step,
                                    const char* op_name, const guild_error_info_t* inner) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    (void)snprintf(message, sizeof message, "%s %s failed: %.64s: %.300s", step, op_name, inner->component,
                   inner->message);
    return guild_error_info_set(error, status, RUNNER_COMPONENT, message);
}

/*
 * The pipeline: resolves both scans for these exact tensors, executes them, releases them.
 * Everything it needs from the host is the copied service table.
 */
static guild_status_t run_pipeline(const guild_operation_service_v1_t* service, const guild_tensor_desc_v1_t* input,
                                   const guild_tensor_desc_v1_t* inclusive_out,
                                   const guild_tensor_desc_v1_t* exclusive_out, guild_error_info_t* error) {
    guild_operation_query_v1_t query;
    guild_execute_args_v1_t args;
    guild_op_handle_t* inclusive = NULL;
    guild_op_handle_t* exclusive = NULL;
    guild_error_info_t inner = GUILD_ERROR_INFO_INITIALIZER();
    guild_error_info_t ignored = GUILD_ERROR_INFO_INITIALIZER();
    guild_status_t status;

    /* 1. Resolve: the service ranks every registered provider and negotiates with the best. */
    scan_query(&query, INCLUSIVE_OP, input, inclusive_out);
    status = service->resolve(service->user, &query, &inclusive, &inner);
    if (status != GUILD_STATUS_OK) {
        return pipeline_fail(error, status, "resolving", INCLUSIVE_OP, &inner);
    }
    scan_query(&query, EXCLUSIVE_OP, input, exclusive_out);
    status = service->resolve(service->user, &query, &exclusive, &inner);
    if (status != GUILD_STATUS_OK) {
        (void)service->release(service->user, inclusive, &ignored);
        return pipeline_fail(error, status, "resolving", EXCLUSIVE_OP, &inner);
    }

    /* 2. Execute: each handle runs the contract it negotiated, never another provider. */
    scan_args(&args, input, inclusive_out);
    status = service->execute(service->user, inclusive, &args, &inner);
    if (status != GUILD_STATUS_OK) {
        (void)pipeline_fail(error, status, "executing", INCLUSIVE_OP, &inner);
    } else {
        scan_args(&args, input, exclusive_out);
        status = service->execute(service->user, exclusive, &args, &inner);
        if (status != GUILD_STATUS_OK) {
            (void)pipeline_fail(error, status, "executing", EXCLUSIVE_OP, &inner);
        }
    }

    /* 3. Release both, whatever happened: a handle keeps its provider's package loaded. */
    (void)service->release(service->user, inclusive, &ignored);
    (void)service->release(service->user, exclusive, &ignored);
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* The operation this plugin offers                                                            */
/* ------------------------------------------------------------------------------------------ */

static int same_dims(const guild_tensor_desc_v1_t* a, const guild_tensor_desc_v1_t* b) {
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

/* The host has checked every declared field of the contract (counts, dtype, rank, layout,
 * memory space, alignment); what is left is that both outputs have the input's shape. */
static guild_status_t pipeline_validate(void* user_data, const guild_operation_query_v1_t* query,
                                        guild_error_info_t* error) {
    if (user_data == NULL || query == NULL || query->inputs == NULL || query->outputs == NULL ||
        query->input_count != 1u || query->output_count != 2u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_COMPONENT,
                                    "validate needs the plugin state and a query with one input and two outputs");
    }
    if (!same_dims(&query->inputs[0], &query->outputs[0]) || !same_dims(&query->inputs[0], &query->outputs[1])) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_COMPONENT,
                                    "both outputs must have the input's shape");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t pipeline_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                             guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    if (user_data == NULL || query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_COMPONENT,
                                    "query_scratch needs the plugin state, a query and an output");
    }
    /* The scans write straight into the caller's outputs. */
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t pipeline_execute(void* user_data, const guild_execute_args_v1_t* args,
                                       guild_error_info_t* error) {
    const runner_state_t* state = (const runner_state_t*)user_data;
    if (state == NULL || args == NULL || args->inputs == NULL || args->outputs == NULL || args->input_count != 1u ||
        args->output_count != 2u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_COMPONENT,
                                    "execute needs the plugin state, one input and two outputs");
    }
    if (!state->has_service) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_COMPONENT,
                                    "the host offered no operation service at init");
    }
    return run_pipeline(&state->service, &args->inputs[0], &args->outputs[0], &args->outputs[1], error);
}

/* ------------------------------------------------------------------------------------------ */
/* The plugin                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static guild_status_t runner_register(const guild_host_api_v1_t* host, runner_state_t* state,
                                      guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    /* The contract, checked by the host before validate is asked. */
    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_EXACT_INTEGER;
    gop.input_dtype = GUILD_DTYPE_I64;
    gop.output_dtype = GUILD_DTYPE_I64;
    gop.min_inputs = 1u;
    gop.max_inputs = 1u;
    gop.min_outputs = 2u;
    gop.max_outputs = 2u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS;
    gop.memory_spaces = GUILD_MEMORY_HOST;
    gop.min_alignment = 8u;
    gop.min_rank = 1u;
    gop.max_rank = (uint32_t)GUILD_MAX_TENSOR_RANK;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = pipeline_validate;
    gop.query_scratch = pipeline_query_scratch;
    gop.execute = pipeline_execute;
    gop.user_data = state;

    /* The kernel descriptor that carries it; the host copies both during register_kernel. */
    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = RUNNER_COMPONENT; /* must be listed in the manifest's provided_ops */
    desc.op_name = RUNNER_OP;
    desc.priority = 10;
    desc.user_data = state;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static guild_status_t runner_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    runner_state_t* state;
    const guild_operation_service_v1_t* service = NULL;

    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_COMPONENT,
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL ||
        GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, RUNNER_COMPONENT,
                                    "the host table is not a Kernel ABI v1 table");
    }
    state = (runner_state_t*)calloc(1u, sizeof *state);
    if (state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, RUNNER_COMPONENT, "cannot allocate state");
    }
    /* Written at once, so that shutdown frees it whatever happens next. */
    *plugin_state = state;

    /* The service is the optional tail of the host table: read it only when the table is long
     * enough, check its size and version, and copy it. Do not call it here: the host is in the
     * middle of loading this plugin. */
    if ((size_t)host->struct_size >= GUILD_HOST_API_V1_BASE_SIZE + sizeof(void*)) {
        service = host->operations;
    }
    if (service != NULL && service->struct_size >= (uint32_t)GUILD_OPERATION_SERVICE_V1_BASE_SIZE &&
        service->version == GUILD_OPERATION_SERVICE_VERSION && service->resolve != NULL &&
        service->execute != NULL && service->release != NULL) {
        /* A table from a newer or older host may be longer or shorter than this header's: copy
         * what both know, and read the optional reshape tail only when struct_size covers it. */
        memset(&state->service, 0, sizeof state->service);
        memcpy(&state->service, service,
               service->struct_size < sizeof state->service ? service->struct_size : sizeof state->service);
        state->has_service = 1;
    }
    return runner_register(host, state, error);
}

static void runner_shutdown(void* plugin_state) {
    /* No handle is held between calls, so there is nothing to release here. */
    free(plugin_state);
}

static const guild_plugin_descriptor_v1_t runner_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "example_c_runner",
    "1.0.0",
    runner_init,
    runner_shutdown,
};

/* The one exported symbol (guild_configure_gkernel_plugin hides everything else). */
const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &runner_descriptor;
}
