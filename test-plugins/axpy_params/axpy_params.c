/*
 * example.vector.axpy: out = a*x + y over f32 tensors of one shape, contiguous, the scalar a in
 * the operation's parameter record (axpy_params_t below, 8 bytes: a struct_size, then a).
 *
 * Written to the documented rule of module_abi.h: the host refuses every query outside the GOP1
 * declaration (dtypes, counts, rank, layout, memory space, alignment) before it calls validate,
 * so validate checks only what the declaration cannot say: that the three shapes agree and that
 * the parameter record is there, large enough and aligned as the ABI promises.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#include <stdint.h>
#include <string.h>

#define AXPY_IMPL "example.vector.axpy.cpu"

/* The operation's parameter record, version 1.0.0. */
typedef struct axpy_params_t {
    /* sizeof(axpy_params_t) or more (a later version appends fields). */
    uint32_t struct_size;
    /* The scalar a. */
    float a;
} axpy_params_t;

/* Why a parameter record is unusable, or NULL when it is fine. */
static const char* axpy_params_problem(const void* params, size_t params_size) {
    const axpy_params_t* p = (const axpy_params_t*)params;
    if (params == NULL || params_size < sizeof(axpy_params_t)) {
        return "needs its parameter record {uint32 struct_size, f32 a} (8 bytes)";
    }
    /* The ABI promises 8-byte alignment; a record that is not is a host bug. */
    if (((uintptr_t)params & 7u) != 0u) {
        return "the parameter record is not aligned to 8 bytes";
    }
    if (p->struct_size < sizeof(axpy_params_t) || p->struct_size > params_size) {
        return "the parameter record's struct_size is not between 8 and params_size";
    }
    return NULL;
}

static guild_status_t axpy_same_shapes(const guild_tensor_desc_v1_t* tensors[3], guild_error_info_t* error) {
    uint32_t t;
    uint32_t i;
    for (t = 1u; t < 3u; ++t) {
        if (tensors[t]->rank != tensors[0]->rank) {
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, AXPY_IMPL, "x, y and out differ in rank");
        }
        for (i = 0u; i < tensors[0]->rank && i < (uint32_t)GUILD_MAX_TENSOR_RANK; ++i) {
            if (tensors[t]->dims[i] != tensors[0]->dims[i]) {
                return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, AXPY_IMPL,
                                            "x, y and out differ in shape");
            }
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t axpy_validate(void* user_data, const guild_operation_query_v1_t* query,
                                    guild_error_info_t* error) {
    const guild_tensor_desc_v1_t* tensors[3];
    const char* problem;
    (void)user_data;
    problem = axpy_params_problem(query->params, query->params_size);
    if (problem != NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, AXPY_IMPL, problem);
    }
    /* The counts are the declared ones: the host checked them. */
    tensors[0] = &query->inputs[0];
    tensors[1] = &query->inputs[1];
    tensors[2] = &query->outputs[0];
    return axpy_same_shapes(tensors, error);
}

static guild_status_t axpy_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                         guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    (void)user_data;
    (void)query;
    (void)error;
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t axpy_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const float* x;
    const float* y;
    float* out;
    float a;
    uint64_t count = 1u;
    uint64_t i;
    const char* problem;
    (void)user_data;
    problem = axpy_params_problem(args->params, args->params_size);
    if (problem != NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, AXPY_IMPL, problem);
    }
    a = ((const axpy_params_t*)args->params)->a;
    /* Contiguous tensors of the resolved shape (the host checked both). */
    for (i = 0u; i < args->outputs[0].rank; ++i) {
        count *= args->outputs[0].dims[i];
    }
    x = (const float*)args->inputs[0].data;
    y = (const float*)args->inputs[1].data;
    out = (float*)args->outputs[0].data;
    for (i = 0u; i < count; ++i) {
        out[i] = a * x[i] + y[i];
    }
    return GUILD_STATUS_OK;
}

static guild_status_t axpy_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;
    if (host == NULL || plugin_state == NULL || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, AXPY_IMPL, "init needs a host table");
    }
    *plugin_state = NULL;
    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC;
    gop.input_dtype = GUILD_DTYPE_F32;
    gop.output_dtype = GUILD_DTYPE_F32;
    gop.min_inputs = 2u;
    gop.max_inputs = 2u;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS;
    gop.memory_spaces = GUILD_MEMORY_HOST;
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = 4u;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = axpy_validate;
    gop.query_scratch = axpy_query_scratch;
    gop.execute = axpy_execute;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = AXPY_IMPL;
    desc.op_name = "example.vector.axpy";
    desc.priority = 1;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static void axpy_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t axpy_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "axpy_params",
    "1.0.0",
    axpy_init,
    axpy_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &axpy_descriptor;
}
