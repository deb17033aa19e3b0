/*
 * expert_ref: one CPU GUILD_OP_BATCHED_EXPERT_EXEC kernel, test.expert_ref.cpu, carrying a CPE1
 * (version 1) table whose callbacks do F32 reference arithmetic, so that the host's bound table
 * and worker pool (crates/app/tests/it/experts.rs) can be checked against values computed in the
 * test.
 *
 * The format it serves: activation_dtype and hidden_dtype are F32, so "quantizing" copies a row
 * (activation_row_bytes >= 4 * hidden_size, hidden_row_bytes >= 4 * intermediate_size). An
 * expert image starts with a 32-bit word holding its expert index; gate, up and down are F32
 * matrices at their offsets and row strides. gate_up_rows applies SwiGLU
 * (hidden = silu(gate . x) * (up . x)); down_rows computes dst (+)= w * (down . h).
 *
 * gate_up_rows and down_rows refuse an image whose leading word is not args->expert_index, with a
 * message naming both, so that a test can tell which expert a failure belongs to. Every callback
 * first checks that it received the table's user_data.
 *
 * The table is built on init's stack. C99, the installed SDK and the C library only.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <guild/abi/cpu_expert_abi.h>
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>

#define COMPONENT "test.expert_ref"

static int ref_state;

static guild_status_t prologue(void* user_data, const void* args, const guild_cpu_expert_format_v1_t* format,
                               guild_error_info_t* error) {
    if (user_data != &ref_state) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "wrong user_data");
    }
    if (args == NULL || format == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "args or format is NULL");
    }
    if (format->activation_dtype != GUILD_DTYPE_F32 || format->hidden_dtype != GUILD_DTYPE_F32) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT,
                                    "only F32 activations and hidden rows");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t copy_rows(uint64_t rows, uint64_t elements, const void* src, uint64_t src_stride, void* dst,
                                uint64_t dst_stride) {
    uint64_t r;
    for (r = 0; r < rows; ++r) {
        memcpy((unsigned char*)dst + r * dst_stride, (const unsigned char*)src + r * src_stride,
               (size_t)(elements * sizeof(float)));
    }
    return GUILD_STATUS_OK;
}

static guild_status_t ref_quantize_activation(void* user_data,
                                              const guild_cpu_expert_quantize_activation_args_v1_t* args,
                                              guild_error_info_t* error) {
    guild_status_t status = prologue(user_data, args, args == NULL ? NULL : args->format, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->src_dtype != GUILD_DTYPE_F32 || args->format->activation_row_bytes < 4u * args->format->hidden_size) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT,
                                    "quantize_activation copies F32 rows");
    }
    return copy_rows(args->row_count, args->format->hidden_size, args->src, args->src_row_stride_bytes, args->dst,
                     args->dst_row_stride_bytes);
}

static guild_status_t ref_quantize_hidden(void* user_data, const guild_cpu_expert_quantize_hidden_args_v1_t* args,
                                          guild_error_info_t* error) {
    guild_status_t status = prologue(user_data, args, args == NULL ? NULL : args->format, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->src_dtype != GUILD_DTYPE_F32 || args->format->hidden_row_bytes < 4u * args->format->intermediate_size) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT,
                                    "quantize_hidden copies F32 rows");
    }
    return copy_rows(args->row_count, args->format->intermediate_size, args->src, args->src_row_stride_bytes,
                     args->dst, args->dst_row_stride_bytes);
}

static guild_status_t check_image(const void* image, uint32_t expert_index, guild_error_info_t* error) {
    uint32_t tag;
    char message[96];
    memcpy(&tag, image, sizeof tag);
    if (tag != expert_index) {
        snprintf(message, sizeof message, "expert image %u handed over as expert %u", (unsigned)tag,
                 (unsigned)expert_index);
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, message);
    }
    return GUILD_STATUS_OK;
}

static float dot(const float* a, const float* b, uint64_t n) {
    float sum = 0.0f;
    uint64_t i;
    for (i = 0; i < n; ++i) {
        sum += a[i] * b[i];
    }
    return sum;
}

static guild_status_t ref_gate_up_rows(void* user_data, const guild_cpu_expert_gate_up_args_v1_t* args,
                                       guild_error_info_t* error) {
    const guild_cpu_expert_format_v1_t* f;
    const unsigned char* image;
    uint32_t t;
    uint64_t r;
    guild_status_t status = prologue(user_data, args, args == NULL ? NULL : args->format, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (args->glu != GUILD_CPU_EXPERT_GLU_SWIGLU) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, COMPONENT, "gate_up_rows does SwiGLU only");
    }
    status = check_image(args->expert_image, args->expert_index, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    f = args->format;
    image = (const unsigned char*)args->expert_image;
    for (t = 0; t < args->token_count; ++t) {
        const float* x =
            (const float*)((const unsigned char*)args->activations + t * args->activation_row_stride_bytes);
        float* h = (float*)((unsigned char*)args->hidden + t * args->hidden_row_stride_bytes);
        for (r = args->row_begin; r < args->row_end; ++r) {
            const float* gate = (const float*)(image + f->gate_offset_bytes + r * f->gate_up_row_stride_bytes);
            const float* up = (const float*)(image + f->up_offset_bytes + r * f->gate_up_row_stride_bytes);
            float g = dot(gate, x, f->hidden_size);
            h[r] = g / (1.0f + expf(-g)) * dot(up, x, f->hidden_size);
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t ref_down_rows(void* user_data, const guild_cpu_expert_down_args_v1_t* args,
                                    guild_error_info_t* error) {
    const guild_cpu_expert_format_v1_t* f;
    const unsigned char* image;
    uint32_t t;
    uint64_t r;
    guild_status_t status = prologue(user_data, args, args == NULL ? NULL : args->format, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = check_image(args->expert_image, args->expert_index, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    f = args->format;
    image = (const unsigned char*)args->expert_image;
    for (t = 0; t < args->token_count; ++t) {
        const float* h = (const float*)((const unsigned char*)args->hidden + t * args->hidden_row_stride_bytes);
        float* y = (float*)((unsigned char*)args->dst + t * args->dst_row_stride_bytes);
        float w = args->token_weights == NULL ? 1.0f : args->token_weights[t];
        for (r = args->row_begin; r < args->row_end; ++r) {
            const float* down = (const float*)(image + f->down_offset_bytes + r * f->down_row_stride_bytes);
            float value = w * dot(down, h, f->intermediate_size);
            if (args->flags & GUILD_CPU_EXPERT_DOWN_ACCUMULATE) {
                y[r] += value;
            } else {
                y[r] = value;
            }
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t ref_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_cpu_expert_ext_v1_t table;
    guild_kernel_op_desc_v1_t desc;
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "null argument");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, COMPONENT, "short host table");
    }
    memset(&table, 0, sizeof table);
    table.header.struct_size = (uint32_t)sizeof table;
    table.header.tag = GUILD_CPU_EXPERT_TAG;
    table.header.version = GUILD_CPU_EXPERT_EXT_VERSION;
    table.quantize_activation = ref_quantize_activation;
    table.quantize_hidden = ref_quantize_hidden;
    table.gate_up_rows = ref_gate_up_rows;
    table.down_rows = ref_down_rows;
    table.user_data = &ref_state;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.impl_id = "test.expert_ref.cpu";
    desc.op_kind = GUILD_OP_BATCHED_EXPERT_EXEC;
    desc.backend = GUILD_BACKEND_CPU;
    desc.op_name = "reference experts";
    desc.priority = 1;
    desc.user_data = &ref_state;
    desc.next_ext = &table.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static void ref_shutdown(void* plugin_state) { (void)plugin_state; }

static const guild_plugin_descriptor_v1_t ref_descriptor = {
    sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "expert_ref",
    "1.0.0",
    ref_init,
    ref_shutdown};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) { return &ref_descriptor; }
