/*
 * op_many: a runtime module that registers 64 competing GOP1 implementations of one namespaced
 * operation,
 *
 *   example.bench.tiny   y[i] = x[i] + 1 over one f32 input and one f32 output of the same
 *                        rank-1 contiguous shape,
 *
 * as example.many.c00.cpu .. example.many.c63.cpu with priorities 100 .. 163 (cNN has priority
 * 100 + NN, so c63 ranks first and c00 last). Every candidate has the same contract: CPU,
 * host-blocking, f32, exactly one input and one output, rank 1, contiguous, host memory,
 * alignment 4, no scratch. It exists for the operation service's benchmarks, which need many
 * candidates that all pass the host's static checks.
 *
 * How many of them accept in validate is set by the query's params, so that one module serves
 * both resolve scenarios:
 *   no params (NULL or size 0)   every candidate accepts: the host negotiates with the best
 *                                one only (c63);
 *   many_params_t { struct_size, accepting = n }
 *                                only the n lowest-ranked candidates (c00 .. c{n-1}) accept;
 *                                the others refuse. With n = 1 the host calls all 64 validate
 *                                callbacks and ends with c00.
 * Execute ignores params.
 *
 * C99, the installed SDK and the C standard library only; everything but the entry point is
 * static. No state is ever written after init, so every callback may run on any thread.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#include <stdio.h>
#include <string.h>

#define MANY_COMPONENT "example.many"
#define MANY_OP "example.bench.tiny"
#define MANY_COUNT 64u
#define MANY_BASE_PRIORITY 100
#define MANY_MAGIC 0x6d616e79u

/* The operation's parameter record (what a query's params point at). */
typedef struct many_params_t {
    /* sizeof(many_params_t). */
    uint32_t struct_size;
    /* How many of the lowest-ranked candidates accept; the rest refuse in validate. */
    uint32_t accepting;
} many_params_t;

/* One registered implementation: its callbacks' user_data. Filled once by init. */
typedef struct many_t {
    uint32_t magic;
    uint32_t index;
    char impl_id[32];
} many_t;

static many_t many[MANY_COUNT];

static const many_t* many_of(void* user_data) {
    const many_t* m = (const many_t*)user_data;
    return m != NULL && m->magic == MANY_MAGIC ? m : NULL;
}

static guild_status_t many_validate(void* user_data, const guild_operation_query_v1_t* query,
                                    guild_error_info_t* error) {
    const many_t* m = many_of(user_data);
    const many_params_t* params;
    if (m == NULL || query == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MANY_COMPONENT,
                                    "validate needs its state and a query");
    }
    if (query->input_count != 1u || query->output_count != 1u || query->inputs == NULL || query->outputs == NULL ||
        query->inputs[0].dims[0] != query->outputs[0].dims[0]) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, m->impl_id,
                                    "the output must have the input's extent");
    }
    /* The contract declares rank 1, and only dims[0] is read: refuse what would be dropped. */
    if (query->inputs[0].rank != 1u || query->outputs[0].rank != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, m->impl_id, "rank-1 tensors only");
    }
    if (query->params == NULL || query->params_size == 0u) {
        return GUILD_STATUS_OK;
    }
    params = (const many_params_t*)query->params;
    if (query->params_size < sizeof *params || params->struct_size < (uint32_t)sizeof *params) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, m->impl_id,
                                    "params is smaller than many_params_t");
    }
    if (m->index >= params->accepting) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, m->impl_id,
                                    "params ask this candidate to refuse");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t many_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                         guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    if (many_of(user_data) == NULL || query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MANY_COMPONENT,
                                    "query_scratch needs its state, a query and an output record");
    }
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t many_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const many_t* m = many_of(user_data);
    const float* x;
    float* y;
    uint64_t i;
    if (m == NULL || args == NULL || args->input_count != 1u || args->output_count != 1u || args->inputs == NULL ||
        args->outputs == NULL || args->inputs[0].data == NULL || args->outputs[0].data == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MANY_COMPONENT,
                                    "execute needs its state, one input and one output with data");
    }
    x = (const float*)args->inputs[0].data;
    y = (float*)args->outputs[0].data;
    for (i = 0; i < args->outputs[0].dims[0]; ++i) {
        y[i] = x[i] + 1.0f;
    }
    return GUILD_STATUS_OK;
}

/* Registers candidate m. The descriptor and extension live on this frame; the host copies them
 * inside register_kernel. */
static guild_status_t many_register(const guild_host_api_v1_t* host, many_t* m, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.header.next = NULL;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.capabilities = 0u;
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC;
    gop.input_dtype = GUILD_DTYPE_F32;
    gop.output_dtype = GUILD_DTYPE_F32;
    gop.min_inputs = 1u;
    gop.max_inputs = 1u;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS;
    gop.memory_spaces = GUILD_MEMORY_HOST;
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = 1u;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = many_validate;
    gop.query_scratch = many_query_scratch;
    gop.execute = many_execute;
    gop.user_data = m;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = m->impl_id;
    desc.op_name = MANY_OP;
    desc.priority = MANY_BASE_PRIORITY + (int32_t)m->index;
    desc.kernel_fns = NULL;
    desc.user_data = m;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static guild_status_t many_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    uint32_t i;
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MANY_COMPONENT,
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MANY_COMPONENT,
                                    "host table is smaller than the Kernel ABI v1 base or lacks register_kernel");
    }
    if (GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, MANY_COMPONENT,
                                    "host speaks another Kernel ABI major version");
    }
    for (i = 0; i < MANY_COUNT; ++i) {
        guild_status_t status;
        many[i].magic = MANY_MAGIC;
        many[i].index = i;
        (void)snprintf(many[i].impl_id, sizeof many[i].impl_id, "example.many.c%02u.cpu", (unsigned)i);
        status = many_register(host, &many[i], error);
        if (status != GUILD_STATUS_OK) {
            return status;
        }
    }
    return GUILD_STATUS_OK;
}

static void many_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t many_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "op_many",
    "1.0.0",
    many_init,
    many_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &many_descriptor;
}
