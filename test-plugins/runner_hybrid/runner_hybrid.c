/*
 * runner_hybrid: a test runner for a periodic hybrid architecture (qwen3next: gated-delta-net
 * recurrent layers with a full-attention layer every full_attention_interval layers, and a
 * mixture of experts with a shared expert in every layer), with an RMD1 extension.
 *
 * - recognize: general.architecture reads "qwen3next";
 * - describe: dimensions, recurrent geometry, the interval and the experts from the
 *   qwen3next.* keys, and per layer either the attention roles or the recurrent (SSM) roles,
 *   following the interval, plus the norms and expert roles every layer has;
 * - validate_numerics: experts used <= experts, ssm_inner_size a multiple of
 *   ssm_time_step_rank, and n_heads a multiple of n_kv_heads;
 * - create/destroy: an instance, each call logged to the model's "test.marker_path" file when
 *   it names one (guild_test_runner.h).
 *
 * RUNNER_ID, RUNNER_PRIORITY and RUNNER_NAME set the id, the RMD1 priority and the plugin name.
 * RUNNER_BREAK_TOPOLOGY builds a runner that maps each recurrent layer's fused input projection
 * as ATTN_QKV instead of SSM_IN: a mapping outside the periodic hybrid topology.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/runner_abi.h>

#include "guild_test_runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef RUNNER_ID
#define RUNNER_ID "test.runner.hybrid"
#endif
#ifndef RUNNER_PRIORITY
#define RUNNER_PRIORITY 20
#endif
#ifndef RUNNER_NAME
#define RUNNER_NAME "runner_hybrid"
#endif

#define HYBRID_MAGIC 0x4b1d0000u
#define HYBRID_MAX_LAYERS 1024u
#define HYBRID_ARCH "qwen3next"
/* Per layer at most: 2 norms, 7 recurrent roles, 8 expert roles. */
#define HYBRID_ROLES_PER_LAYER 17u
#define HYBRID_GLOBAL_ROLES 3u

typedef struct hybrid_state_t {
    uint32_t magic;
    guild_test_roles_t roles;
} hybrid_state_t;

typedef struct hybrid_instance_t {
    uint32_t magic;
    char marker[GUILD_TEST_MARKER_PATH_CAPACITY];
} hybrid_instance_t;

typedef struct hybrid_role_t {
    uint32_t role;
    const char* suffix;
} hybrid_role_t;

static guild_status_t hybrid_recognize(void* user_data, const guild_model_reader_v1_t* model,
                                       guild_error_info_t* error) {
    (void)user_data;
    return guild_test_recognize_arch(model, HYBRID_ARCH, RUNNER_ID, error);
}

static int hybrid_add_all(guild_test_roles_t* list, const hybrid_role_t* roles, size_t count, int32_t layer) {
    size_t i;
    for (i = 0; i < count; ++i) {
        if (!guild_test_roles_add_layer(list, roles[i].role, layer, 0u, roles[i].suffix)) {
            return 0;
        }
    }
    return 1;
}

static guild_status_t hybrid_map_roles(hybrid_state_t* state, uint32_t n_layers, uint32_t interval,
                                       guild_error_info_t* error) {
    static const hybrid_role_t every_layer[] = {
        {GUILD_TENSOR_ROLE_ATTN_NORM, "attn_norm.weight"},
        {GUILD_TENSOR_ROLE_POST_ATTN_NORM, "post_attention_norm.weight"},
        {GUILD_TENSOR_ROLE_FFN_ROUTER, "ffn_gate_inp.weight"},
        {GUILD_TENSOR_ROLE_FFN_GATE_EXPS, "ffn_gate_exps.weight"},
        {GUILD_TENSOR_ROLE_FFN_UP_EXPS, "ffn_up_exps.weight"},
        {GUILD_TENSOR_ROLE_FFN_DOWN_EXPS, "ffn_down_exps.weight"},
        {GUILD_TENSOR_ROLE_FFN_ROUTER_SHEXP, "ffn_gate_inp_shexp.weight"},
        {GUILD_TENSOR_ROLE_FFN_GATE_SHEXP, "ffn_gate_shexp.weight"},
        {GUILD_TENSOR_ROLE_FFN_UP_SHEXP, "ffn_up_shexp.weight"},
        {GUILD_TENSOR_ROLE_FFN_DOWN_SHEXP, "ffn_down_shexp.weight"},
    };
    static const hybrid_role_t attention[] = {
        {GUILD_TENSOR_ROLE_ATTN_Q, "attn_q.weight"},           {GUILD_TENSOR_ROLE_ATTN_K, "attn_k.weight"},
        {GUILD_TENSOR_ROLE_ATTN_V, "attn_v.weight"},           {GUILD_TENSOR_ROLE_ATTN_OUTPUT, "attn_output.weight"},
        {GUILD_TENSOR_ROLE_ATTN_Q_NORM, "attn_q_norm.weight"}, {GUILD_TENSOR_ROLE_ATTN_K_NORM, "attn_k_norm.weight"},
    };
    static const hybrid_role_t recurrent[] = {
#ifdef RUNNER_BREAK_TOPOLOGY
        {GUILD_TENSOR_ROLE_ATTN_QKV, "ssm_in.weight"},
#else
        {GUILD_TENSOR_ROLE_SSM_IN, "ssm_in.weight"},
#endif
        {GUILD_TENSOR_ROLE_SSM_CONV1D, "ssm_conv1d.weight"},
        {GUILD_TENSOR_ROLE_SSM_A, "ssm_a"},
        {GUILD_TENSOR_ROLE_SSM_DT_BIAS, "ssm_dt.bias"},
        {GUILD_TENSOR_ROLE_SSM_BETA_ALPHA, "ssm_ba.weight"},
        {GUILD_TENSOR_ROLE_SSM_NORM, "ssm_norm.weight"},
        {GUILD_TENSOR_ROLE_SSM_OUT, "ssm_out.weight"},
    };
    uint32_t layer;
    int ok;
    if (!guild_test_roles_reset(&state->roles, HYBRID_GLOBAL_ROLES + (size_t)n_layers * HYBRID_ROLES_PER_LAYER)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, RUNNER_ID, "cannot allocate the role list");
    }
    ok = guild_test_roles_add(&state->roles, GUILD_TENSOR_ROLE_TOKEN_EMBD, -1, 0u, "token_embd.weight");
    ok = ok && guild_test_roles_add(&state->roles, GUILD_TENSOR_ROLE_OUTPUT_NORM, -1, 0u, "output_norm.weight");
    ok = ok && guild_test_roles_add(&state->roles, GUILD_TENSOR_ROLE_OUTPUT, -1, 0u, "output.weight");
    for (layer = 0; ok && layer < n_layers; ++layer) {
        int is_attention = interval == 0u || (layer + 1u) % interval == 0u;
        ok = hybrid_add_all(&state->roles, every_layer, sizeof every_layer / sizeof every_layer[0], (int32_t)layer);
        if (is_attention) {
            ok = ok && hybrid_add_all(&state->roles, attention, sizeof attention / sizeof attention[0], (int32_t)layer);
        } else {
            ok = ok && hybrid_add_all(&state->roles, recurrent, sizeof recurrent / sizeof recurrent[0], (int32_t)layer);
        }
    }
    if (!ok) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, RUNNER_ID, "the role list overflowed");
    }
    return GUILD_STATUS_OK;
}

static guild_status_t hybrid_describe(void* user_data, const guild_model_reader_v1_t* model,
                                      guild_runner_model_v1_t* out, guild_error_info_t* error) {
    static const struct {
        const char* suffix;
        size_t offset;
    } counts[] = {
        {"block_count", offsetof(guild_runner_model_v1_t, n_layers)},
        {"embedding_length", offsetof(guild_runner_model_v1_t, n_embd)},
        {"attention.head_count", offsetof(guild_runner_model_v1_t, n_heads)},
        {"attention.head_count_kv", offsetof(guild_runner_model_v1_t, n_kv_heads)},
        {"attention.key_length", offsetof(guild_runner_model_v1_t, head_dim)},
        {"attention.value_length", offsetof(guild_runner_model_v1_t, head_dim_v)},
        {"context_length", offsetof(guild_runner_model_v1_t, context_length)},
        {"full_attention_interval", offsetof(guild_runner_model_v1_t, full_attention_interval)},
        {"ssm.conv_kernel", offsetof(guild_runner_model_v1_t, ssm_conv_kernel)},
        {"ssm.state_size", offsetof(guild_runner_model_v1_t, ssm_state_size)},
        {"ssm.group_count", offsetof(guild_runner_model_v1_t, ssm_group_count)},
        {"ssm.time_step_rank", offsetof(guild_runner_model_v1_t, ssm_time_step_rank)},
        {"ssm.inner_size", offsetof(guild_runner_model_v1_t, ssm_inner_size)},
        {"expert_count", offsetof(guild_runner_model_v1_t, n_experts)},
        {"expert_used_count", offsetof(guild_runner_model_v1_t, n_experts_used)},
        {"expert_feed_forward_length", offsetof(guild_runner_model_v1_t, expert_ffn)},
        {"expert_shared_feed_forward_length", offsetof(guild_runner_model_v1_t, shared_expert_ffn)},
        {"rope.dimension_count", offsetof(guild_runner_model_v1_t, rope_dims)},
    };
    hybrid_state_t* state = (hybrid_state_t*)user_data;
    uint32_t element_type = 0;
    uint64_t tokens = 0;
    size_t i;
    guild_status_t status = GUILD_STATUS_OK;
    if (state == NULL || state->magic != HYBRID_MAGIC || model == NULL || out == NULL ||
        out->struct_size < (uint32_t)sizeof(guild_runner_model_v1_t) || out->version != GUILD_RUNNER_MODEL_VERSION) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID,
                                    "describe needs the state, a reader and a v1 record");
    }
    (void)snprintf(out->architecture, sizeof out->architecture, "%s", HYBRID_ARCH);
    for (i = 0; status == GUILD_STATUS_OK && i < sizeof counts / sizeof counts[0]; ++i) {
        uint32_t value = 0;
        status = guild_test_read_u32(model, HYBRID_ARCH, counts[i].suffix, 0, 0u, &value, RUNNER_ID, error);
        memcpy((char*)out + counts[i].offset, &value, sizeof value);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_f32(model, HYBRID_ARCH, "attention.layer_norm_rms_epsilon", 1e-6f, &out->norm_eps,
                                     RUNNER_ID, error);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_f32(model, HYBRID_ARCH, "rope.freq_base", 10000000.0f, &out->rope_freq_base,
                                     RUNNER_ID, error);
    }
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (model->get_array_info(model->ctx, "tokenizer.ggml.tokens", &element_type, &tokens) != GUILD_STATUS_OK ||
        element_type != GUILD_META_TYPE_STRING || tokens > 0xffffffffu) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID,
                                    "tokenizer.ggml.tokens is not a list of strings");
    }
    if (out->n_layers == 0u || out->n_layers > HYBRID_MAX_LAYERS) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, "block_count must be 1..1024");
    }
    out->vocab_size = (uint32_t)tokens;
    out->rope_type = GUILD_ROPE_TYPE_NEOX;
    out->rope_scaling_type = GUILD_ROPE_SCALING_NONE;
    out->rope_freq_scale = 1.0f;
    out->rope_orig_context = out->context_length;
    out->prefill_strategy = GUILD_PREFILL_CHUNKED;
    out->prefill_chunk_tokens = 64u;
    status = hybrid_map_roles(state, out->n_layers, out->full_attention_interval, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    guild_test_roles_attach(&state->roles, out);
    return GUILD_STATUS_OK;
}

static guild_status_t hybrid_validate_numerics(void* user_data, const guild_model_reader_v1_t* model,
                                               const guild_runner_model_v1_t* d, guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    (void)user_data;
    if (model == NULL || d == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID, "validate needs a model");
    }
    if (d->n_experts_used == 0u || d->n_experts_used > d->n_experts) {
        (void)snprintf(message, sizeof message, "%u experts used per token out of %u", (unsigned)d->n_experts_used,
                       (unsigned)d->n_experts);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    if (d->ssm_time_step_rank == 0u || d->ssm_inner_size % d->ssm_time_step_rank != 0u) {
        (void)snprintf(message, sizeof message, "ssm_inner_size %u is not a multiple of ssm_time_step_rank %u",
                       (unsigned)d->ssm_inner_size, (unsigned)d->ssm_time_step_rank);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    if (d->n_kv_heads == 0u || d->n_heads % d->n_kv_heads != 0u) {
        (void)snprintf(message, sizeof message, "n_heads %u is not a multiple of n_kv_heads %u", (unsigned)d->n_heads,
                       (unsigned)d->n_kv_heads);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    return GUILD_STATUS_OK;
}

static guild_status_t hybrid_create(void* user_data, const guild_model_reader_v1_t* model, void** out_instance,
                                    guild_error_info_t* error) {
    hybrid_instance_t* instance;
    (void)user_data;
    if (model == NULL || out_instance == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID, "create needs a model");
    }
    instance = (hybrid_instance_t*)calloc(1u, sizeof *instance);
    if (instance == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, RUNNER_ID, "cannot allocate the instance");
    }
    instance->magic = HYBRID_MAGIC;
    guild_test_marker_path(model, instance->marker, sizeof instance->marker);
    *out_instance = instance;
    guild_test_log_event(instance->marker, "create", RUNNER_ID);
    return GUILD_STATUS_OK;
}

static void hybrid_destroy(void* user_data, void* instance) {
    hybrid_instance_t* self = (hybrid_instance_t*)instance;
    (void)user_data;
    if (self != NULL) {
        guild_test_log_event(self->marker, "destroy", RUNNER_ID);
        self->magic = 0u;
        free(self);
    }
}

static guild_status_t hybrid_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    static const guild_test_runner_callbacks_t callbacks = {
        hybrid_recognize, hybrid_describe, hybrid_validate_numerics, hybrid_create, hybrid_destroy,
    };
    hybrid_state_t* state;
    if (host == NULL || plugin_state == NULL || host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID, "init needs a host table");
    }
    state = (hybrid_state_t*)calloc(1u, sizeof *state);
    if (state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, RUNNER_ID, "cannot allocate state");
    }
    state->magic = HYBRID_MAGIC;
    *plugin_state = state;

    return guild_test_register_runner(host, RUNNER_ID, RUNNER_PRIORITY, RUNNER_PRIORITY, &callbacks, state, error);
}

static void hybrid_shutdown(void* plugin_state) {
    hybrid_state_t* state = (hybrid_state_t*)plugin_state;
    if (state != NULL) {
        guild_test_roles_free(&state->roles);
        state->magic = 0u;
        free(state);
    }
}

static const guild_plugin_descriptor_v1_t hybrid_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    RUNNER_NAME,
    "1.0.0",
    hybrid_init,
    hybrid_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &hybrid_descriptor;
}
