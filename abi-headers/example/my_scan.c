/*
 * my_scan: a minimal Guild runtime module (module ABI 1). It provides one namespaced CPU
 * operation with a GOP1 contract:
 *
 *   example.sequence.inclusive_scan, implemented as org.example.my_scan.inclusive.cpu:
 *   y[i] = x[0] + ... + x[i] along dims[0], for every row of a contiguous f32 tensor.
 *
 * C99, the SDK's headers and the C standard library only. The rules every call follows (status
 * codes, error records, ownership, how structs grow) are in ../README.md, installed next to this
 * directory; docs/plugin-authors.md in the Guild sources walks through every field used here.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#include <string.h>

#define MY_COMPONENT "org.example.my_scan.inclusive.cpu"

/* Checks what the declarative GOP1 fields cannot say: the output has the input's shape. */
static guild_status_t my_check_shapes(const guild_tensor_desc_v1_t* in, const guild_tensor_desc_v1_t* out,
                                      guild_error_info_t* error) {
    uint32_t i;
    if (in->rank != out->rank) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, MY_COMPONENT,
                                    "the output's rank differs from the input's");
    }
    for (i = 0; i < in->rank && i < (uint32_t)GUILD_MAX_TENSOR_RANK; ++i) {
        if (in->dims[i] != out->dims[i]) {
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, MY_COMPONENT,
                                        "the output's shape differs from the input's");
        }
    }
    return GUILD_STATUS_OK;
}

/* Negotiation: pure, no allocation, no pointer kept from the query. */
static guild_status_t my_validate(void* user_data, const guild_operation_query_v1_t* query,
                                  guild_error_info_t* error) {
    (void)user_data;
    if (query == NULL || query->inputs == NULL || query->outputs == NULL || query->input_count != 1u ||
        query->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MY_COMPONENT,
                                    "a scan takes one input and one output");
    }
    return my_check_shapes(&query->inputs[0], &query->outputs[0], error);
}

static guild_status_t my_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                       guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    (void)user_data;
    if (query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MY_COMPONENT,
                                    "query_scratch needs a query and an output record");
    }
    /* No scratch. out_scratch->struct_size belongs to the caller and is left alone. */
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t my_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const guild_tensor_desc_v1_t* in;
    const guild_tensor_desc_v1_t* out;
    const float* x;
    float* y;
    uint64_t n;
    uint64_t rows = 1u;
    uint64_t r;
    uint32_t i;
    guild_status_t status;

    (void)user_data;
    /* The host has checked all of this already; a module stays safe under any host. */
    if (args == NULL || args->inputs == NULL || args->outputs == NULL || args->input_count != 1u ||
        args->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MY_COMPONENT,
                                    "execute needs one input and one output");
    }
    in = &args->inputs[0];
    out = &args->outputs[0];
    status = my_check_shapes(in, out, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (in->data == NULL || out->data == NULL || in->rank < 1u || in->rank > (uint32_t)GUILD_MAX_TENSOR_RANK) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, MY_COMPONENT,
                                    "execute needs data and a rank within the SDK's limit");
    }
    /* Contiguous (the only layout the contract accepts): rows of dims[0] elements, one after another. */
    n = in->dims[0];
    for (i = 1; i < in->rank; ++i) {
        rows *= in->dims[i];
    }
    x = (const float*)in->data;
    y = (float*)out->data;
    for (r = 0; r < rows; ++r) {
        float acc = 0.0f;
        uint64_t k;
        for (k = 0; k < n; ++k) {
            acc += x[r * n + k]; /* read before writing, so y may be x itself */
            y[r * n + k] = acc;
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t my_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "example.my_scan",
                                    "init needs a host table and a plugin_state slot");
    }
    /* Written before anything can fail: the host calls shutdown(*plugin_state) after every init. */
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL ||
        GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, "example.my_scan",
                                    "the host table is too small or speaks another Kernel ABI major version");
    }

    /* The contract, checked by the host against the caller's tensors before my_validate is asked. */
    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.capabilities = (uint64_t)1 << 0; /* in place, in the example.sequence.*_scan vocabulary */
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION | GUILD_NUMERICS_ORDERED_REDUCTION;
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
    gop.max_rank = (uint32_t)GUILD_MAX_TENSOR_RANK;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = my_validate;
    gop.query_scratch = my_query_scratch;
    gop.execute = my_execute;
    gop.user_data = NULL;

    /* The host copies the descriptor, its strings and the extension before register_kernel returns. */
    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = MY_COMPONENT; /* listed in the manifest's provided_ops */
    desc.op_name = "example.sequence.inclusive_scan";
    desc.priority = 5;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static void my_shutdown(void* plugin_state) {
    (void)plugin_state; /* no state, no threads */
}

static const guild_plugin_descriptor_v1_t my_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "example.my_scan",
    "1.0.0",
    my_init,
    my_shutdown,
};

/* The one exported symbol; kernel_abi.h declares it with GUILD_ATTR_EXPORT. */
const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &my_descriptor;
}
