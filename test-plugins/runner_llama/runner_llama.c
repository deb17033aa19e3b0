/*
 * runner_llama: a test runner for the llama architecture, with an RMD1 extension.
 *
 * - recognize: general.architecture reads "llama" through the host's model reader;
 * - describe: dimensions from the llama.* keys (the vocabulary from the tokenizer's token list),
 *   the RoPE facts as llama.cpp reads them (rope.dimension_count, default the head size;
 *   rope.freq_base, default 10000; rope.scaling.type, where a missing type is linear, and
 *   rope.scaling.factor or the older rope.scale_linear as freq_scale = 1 / factor), the experts
 *   (expert_count, expert_used_count), and the canonical roles of the llama.cpp tensor names,
 *   per layer, output.weight (absent with tied embeddings) and rope_freqs.weight optional;
 * - validate_numerics: n_embd divisible by n_heads, n_heads by n_kv_heads, token_embd shaped
 *   [n_embd, vocab_size], and what this runner computes: no scaling or linear scaling, the whole
 *   head rotated, no experts, rope_freqs (when present) of rope_dims / 2 factors. Anything else
 *   is refused here, naming the key, so that selection passes the model over before its first
 *   token rather than running it wrongly;
 * - create/destroy: a small instance, each call logged to the model's "test.marker_path" file
 *   when it names one (guild_test_runner.h).
 *
 * The same source builds several runners (see CMakeLists.txt): RUNNER_ID, RUNNER_PRIORITY and
 * RUNNER_NAME set the id, the RMD1 priority and the plugin name; RUNNER_BREAK_MAPPING makes
 * the description map layer 0's ATTN_K to a tensor llama models do not have.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/runner_abi.h>

#include "guild_test_runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef RUNNER_ID
#define RUNNER_ID "test.runner.llama"
#endif
#ifndef RUNNER_PRIORITY
#define RUNNER_PRIORITY 20
#endif
#ifndef RUNNER_NAME
#define RUNNER_NAME "runner_llama"
#endif

#define LLAMA_MAGIC 0x11a3a000u
#define LLAMA_MAX_LAYERS 1024u
#define LLAMA_ROLES_PER_LAYER 9u
#define LLAMA_GLOBAL_ROLES 4u

typedef struct llama_state_t {
    uint32_t magic;
    guild_test_roles_t roles;
} llama_state_t;

typedef struct llama_instance_t {
    uint32_t magic;
    uint32_t n_layers;
    char marker[GUILD_TEST_MARKER_PATH_CAPACITY];
} llama_instance_t;

static guild_status_t llama_recognize(void* user_data, const guild_model_reader_v1_t* model, guild_error_info_t* error) {
    (void)user_data;
    return guild_test_recognize_arch(model, "llama", RUNNER_ID, error);
}

static guild_status_t llama_map_roles(llama_state_t* state, uint32_t n_layers, guild_error_info_t* error) {
    static const struct {
        uint32_t role;
        const char* suffix;
    } per_layer[LLAMA_ROLES_PER_LAYER] = {
        {GUILD_TENSOR_ROLE_ATTN_NORM, "attn_norm.weight"}, {GUILD_TENSOR_ROLE_ATTN_Q, "attn_q.weight"},
        {GUILD_TENSOR_ROLE_ATTN_K, "attn_k.weight"},       {GUILD_TENSOR_ROLE_ATTN_V, "attn_v.weight"},
        {GUILD_TENSOR_ROLE_ATTN_OUTPUT, "attn_output.weight"}, {GUILD_TENSOR_ROLE_FFN_NORM, "ffn_norm.weight"},
        {GUILD_TENSOR_ROLE_FFN_GATE, "ffn_gate.weight"},   {GUILD_TENSOR_ROLE_FFN_UP, "ffn_up.weight"},
        {GUILD_TENSOR_ROLE_FFN_DOWN, "ffn_down.weight"},
    };
    uint32_t layer;
    size_t i;
    int ok;
    if (!guild_test_roles_reset(&state->roles, LLAMA_GLOBAL_ROLES + (size_t)n_layers * LLAMA_ROLES_PER_LAYER)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, RUNNER_ID, "cannot allocate the role list");
    }
    ok = guild_test_roles_add(&state->roles, GUILD_TENSOR_ROLE_TOKEN_EMBD, -1, 0u, "token_embd.weight");
    ok = ok && guild_test_roles_add(&state->roles, GUILD_TENSOR_ROLE_OUTPUT_NORM, -1, 0u, "output_norm.weight");
    /* Models with tied embeddings have no output projection, and only some carry rope_freqs. */
    ok = ok && guild_test_roles_add(&state->roles, GUILD_TENSOR_ROLE_OUTPUT, -1, GUILD_TENSOR_ROLE_FLAG_OPTIONAL,
                                    "output.weight");
    ok = ok && guild_test_roles_add(&state->roles, GUILD_TENSOR_ROLE_ROPE_FREQS, -1, GUILD_TENSOR_ROLE_FLAG_OPTIONAL,
                                    "rope_freqs.weight");
    for (layer = 0; ok && layer < n_layers; ++layer) {
        for (i = 0; ok && i < LLAMA_ROLES_PER_LAYER; ++i) {
            const char* suffix = per_layer[i].suffix;
#ifdef RUNNER_BREAK_MAPPING
            if (layer == 0u && per_layer[i].role == GUILD_TENSOR_ROLE_ATTN_K) {
                suffix = "attn_k_fused.weight";
            }
#endif
            ok = guild_test_roles_add_layer(&state->roles, per_layer[i].role, (int32_t)layer, 0u, suffix);
        }
    }
    if (!ok) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, RUNNER_ID, "the role list overflowed");
    }
    return GUILD_STATUS_OK;
}

/* The GUILD_ROPE_SCALING_* a llama.rope.scaling.type string names; 0 (and ERR_UNSUPPORTED from
 * the caller) for one RMD1 has no value for. */
static int llama_scaling_type(const char* name, uint32_t* out) {
    static const struct {
        const char* name;
        uint32_t value;
    } known[] = {
        {"none", GUILD_ROPE_SCALING_NONE},
        {"linear", GUILD_ROPE_SCALING_LINEAR},
        {"yarn", GUILD_ROPE_SCALING_YARN},
        {"longrope", GUILD_ROPE_SCALING_LONGROPE},
    };
    size_t i;
    for (i = 0; i < sizeof known / sizeof known[0]; ++i) {
        if (strcmp(name, known[i].name) == 0) {
            *out = known[i].value;
            return 1;
        }
    }
    return 0;
}

/*
 * The RoPE scaling as llama.cpp reads it: a missing llama.rope.scaling.type is "linear"; the
 * factor is llama.rope.scaling.factor, else llama.rope.scale_linear; a missing or zero factor,
 * or the type "none", does not scale. freq_scale is 1 / factor.
 */
static guild_status_t llama_describe_scaling(const guild_model_reader_v1_t* model, guild_runner_model_v1_t* out,
                                             guild_error_info_t* error) {
    static const char* const type_key = "llama.rope.scaling.type";
    char name[64];
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    size_t length = 0;
    uint32_t type = GUILD_ROPE_SCALING_LINEAR;
    double factor = 0.0;
    guild_status_t status = model->get_string(model->ctx, type_key, name, sizeof name, &length);
    if (status == GUILD_STATUS_OK) {
        if (!llama_scaling_type(name, &type)) {
            (void)snprintf(message, sizeof message, "%s is \"%s\", a scaling RMD1 has no value for", type_key, name);
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
        }
    } else if (status != GUILD_STATUS_ERR_NOT_FOUND) {
        (void)snprintf(message, sizeof message, "%s cannot be read as a short string (status %d)", type_key,
                       (int)status);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    status = model->get_float(model->ctx, "llama.rope.scaling.factor", &factor);
    if (status == GUILD_STATUS_ERR_NOT_FOUND) {
        status = model->get_float(model->ctx, "llama.rope.scale_linear", &factor);
    }
    if (status == GUILD_STATUS_ERR_NOT_FOUND) {
        factor = 0.0;
    } else if (status != GUILD_STATUS_OK || !(factor >= 0.0) || factor > 1e30) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID,
                                    "llama.rope.scaling.factor is not a finite float >= 0");
    }
    if (type == GUILD_ROPE_SCALING_NONE || (type == GUILD_ROPE_SCALING_LINEAR && factor == 0.0)) {
        out->rope_scaling_type = GUILD_ROPE_SCALING_NONE;
        out->rope_freq_scale = 1.0f;
    } else {
        out->rope_scaling_type = type;
        out->rope_freq_scale = factor == 0.0 ? 1.0f : (float)(1.0 / factor);
    }
    return guild_test_read_u32(model, "llama", "rope.scaling.original_context_length", 1, out->context_length,
                               &out->rope_orig_context, RUNNER_ID, error);
}

static guild_status_t llama_describe(void* user_data, const guild_model_reader_v1_t* model,
                                     guild_runner_model_v1_t* out, guild_error_info_t* error) {
    llama_state_t* state = (llama_state_t*)user_data;
    uint32_t element_type = 0;
    uint64_t tokens = 0;
    guild_status_t status;
    if (state == NULL || state->magic != LLAMA_MAGIC || model == NULL || out == NULL ||
        out->struct_size < (uint32_t)sizeof(guild_runner_model_v1_t) || out->version != GUILD_RUNNER_MODEL_VERSION) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID,
                                    "describe needs the state, a reader and a v1 record");
    }
    (void)snprintf(out->architecture, sizeof out->architecture, "%s", "llama");
    status = guild_test_read_u32(model, "llama", "block_count", 0, 0u, &out->n_layers, RUNNER_ID, error);
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_u32(model, "llama", "embedding_length", 0, 0u, &out->n_embd, RUNNER_ID, error);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_u32(model, "llama", "feed_forward_length", 0, 0u, &out->n_ff, RUNNER_ID, error);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_u32(model, "llama", "attention.head_count", 0, 0u, &out->n_heads, RUNNER_ID, error);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_u32(model, "llama", "attention.head_count_kv", 1, out->n_heads, &out->n_kv_heads,
                                     RUNNER_ID, error);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_u32(model, "llama", "context_length", 1, 2048u, &out->context_length, RUNNER_ID, error);
    }
    if (status == GUILD_STATUS_OK) {
        /* No default: llama.cpp requires this key for llama, and a guessed epsilon would be a
         * silent change of every norm. */
        static const char* const eps_key = "llama.attention.layer_norm_rms_epsilon";
        uint32_t type = 0;
        if (model->find_key(model->ctx, eps_key, &type) == GUILD_STATUS_ERR_NOT_FOUND) {
            status = guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID,
                                          "llama.attention.layer_norm_rms_epsilon is missing (llama.cpp has no default "
                                          "for llama)");
        } else {
            status = guild_test_read_f32(model, "llama", "attention.layer_norm_rms_epsilon", 0.0f, &out->norm_eps,
                                         RUNNER_ID, error);
        }
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_f32(model, "llama", "rope.freq_base", 10000.0f, &out->rope_freq_base, RUNNER_ID,
                                     error);
    }
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    if (model->get_array_info(model->ctx, "tokenizer.ggml.tokens", &element_type, &tokens) != GUILD_STATUS_OK ||
        element_type != GUILD_META_TYPE_STRING || tokens > 0xffffffffu) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID,
                                    "tokenizer.ggml.tokens is not a list of strings");
    }
    if (out->n_layers == 0u || out->n_layers > LLAMA_MAX_LAYERS || out->n_heads == 0u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID,
                                    "block_count must be 1..1024 and head_count non-zero");
    }
    out->vocab_size = (uint32_t)tokens;
    out->head_dim = out->n_embd / out->n_heads;
    out->head_dim_v = out->head_dim;
    out->rope_type = GUILD_ROPE_TYPE_NORMAL;
    out->prefill_strategy = GUILD_PREFILL_BATCHED;
    status = guild_test_read_u32(model, "llama", "rope.dimension_count", 1, out->head_dim, &out->rope_dims, RUNNER_ID,
                                 error);
    if (status == GUILD_STATUS_OK) {
        status = llama_describe_scaling(model, out, error);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_u32(model, "llama", "expert_count", 1, 0u, &out->n_experts, RUNNER_ID, error);
    }
    if (status == GUILD_STATUS_OK) {
        status = guild_test_read_u32(model, "llama", "expert_used_count", 1, 0u, &out->n_experts_used, RUNNER_ID,
                                     error);
    }
    if (status == GUILD_STATUS_OK) {
        status = llama_map_roles(state, out->n_layers, error);
    }
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    guild_test_roles_attach(&state->roles, out);
    return GUILD_STATUS_OK;
}

static guild_status_t llama_validate_numerics(void* user_data, const guild_model_reader_v1_t* model,
                                              const guild_runner_model_v1_t* d, guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    guild_model_tensor_info_v1_t info;
    guild_status_t status;
    (void)user_data;
    if (model == NULL || d == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID, "validate needs a model");
    }
    if (d->n_heads == 0u || d->n_embd % d->n_heads != 0u) {
        (void)snprintf(message, sizeof message, "n_embd %u is not a multiple of n_heads %u", (unsigned)d->n_embd,
                       (unsigned)d->n_heads);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    if (d->n_kv_heads == 0u || d->n_heads % d->n_kv_heads != 0u) {
        (void)snprintf(message, sizeof message, "n_heads %u is not a multiple of n_kv_heads %u", (unsigned)d->n_heads,
                       (unsigned)d->n_kv_heads);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    memset(&info, 0, sizeof info);
    info.struct_size = (uint32_t)sizeof info;
    status = model->find_tensor(model->ctx, "token_embd.weight", &info);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, "token_embd.weight is missing");
    }
    if (info.rank != 2u || info.dims[0] != d->n_embd || info.dims[1] != d->vocab_size) {
        (void)snprintf(message, sizeof message, "%s is [%llu, %llu] (rank %u), not [n_embd %u, vocab %u]", info.name,
                       (unsigned long long)info.dims[0], (unsigned long long)info.dims[1], (unsigned)info.rank,
                       (unsigned)d->n_embd, (unsigned)d->vocab_size);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    /* What this runner computes, from the description's facts; each refusal names the key. */
    if (d->rope_scaling_type != GUILD_ROPE_SCALING_NONE && d->rope_scaling_type != GUILD_ROPE_SCALING_LINEAR) {
        (void)snprintf(message, sizeof message,
                       "llama.rope.scaling.type is %s: this runner computes no scaling and linear scaling only",
                       d->rope_scaling_type == GUILD_ROPE_SCALING_YARN ? "yarn" : "longrope");
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    if (!(d->rope_freq_scale > 0.0f) || !(d->rope_freq_scale <= 3.0e38f)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID,
                                    "llama.rope.scaling.factor gives no finite positive frequency scale");
    }
    if (d->rope_dims != d->head_dim) {
        (void)snprintf(message, sizeof message,
                       "llama.rope.dimension_count is %u, not the head size %u: this runner rotates whole heads",
                       (unsigned)d->rope_dims, (unsigned)d->head_dim);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    if (d->n_experts != 0u) {
        (void)snprintf(message, sizeof message, "llama.expert_count is %u: this runner has no mixture of experts",
                       (unsigned)d->n_experts);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    memset(&info, 0, sizeof info);
    info.struct_size = (uint32_t)sizeof info;
    status = model->find_tensor(model->ctx, "rope_freqs.weight", &info);
    if (status == GUILD_STATUS_OK && (info.rank != 1u || info.dims[0] != d->rope_dims / 2u)) {
        (void)snprintf(message, sizeof message, "rope_freqs.weight has %llu factors (rank %u), not rope_dims / 2 = %u",
                       (unsigned long long)info.dims[0], (unsigned)info.rank, (unsigned)(d->rope_dims / 2u));
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, message);
    }
    return GUILD_STATUS_OK;
}

static guild_status_t llama_create(void* user_data, const guild_model_reader_v1_t* model, void** out_instance,
                                   guild_error_info_t* error) {
    llama_instance_t* instance;
    uint64_t n_layers = 0;
    (void)user_data;
    if (model == NULL || out_instance == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID, "create needs a model");
    }
    if (model->get_uint(model->ctx, "llama.block_count", &n_layers) != GUILD_STATUS_OK) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, RUNNER_ID, "llama.block_count is missing");
    }
    instance = (llama_instance_t*)calloc(1u, sizeof *instance);
    if (instance == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, RUNNER_ID, "cannot allocate the instance");
    }
    instance->magic = LLAMA_MAGIC;
    instance->n_layers = (uint32_t)n_layers;
    guild_test_marker_path(model, instance->marker, sizeof instance->marker);
    *out_instance = instance;
    guild_test_log_event(instance->marker, "create", RUNNER_ID);
    return GUILD_STATUS_OK;
}

static void llama_destroy(void* user_data, void* instance) {
    llama_instance_t* self = (llama_instance_t*)instance;
    (void)user_data;
    if (self == NULL) {
        return;
    }
    /* A second destroy of the same instance would find the magic cleared and say so. */
    guild_test_log_event(self->marker, self->magic == LLAMA_MAGIC ? "destroy" : "destroy-twice", RUNNER_ID);
    self->magic = 0u;
    free(self);
}

static guild_status_t llama_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    static const guild_test_runner_callbacks_t callbacks = {
        llama_recognize, llama_describe, llama_validate_numerics, llama_create, llama_destroy,
    };
    llama_state_t* state;
    if (host == NULL || plugin_state == NULL || host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, RUNNER_ID, "init needs a host table");
    }
    state = (llama_state_t*)calloc(1u, sizeof *state);
    if (state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, RUNNER_ID, "cannot allocate state");
    }
    state->magic = LLAMA_MAGIC;
    *plugin_state = state;

    /* The descriptor's own priority is deliberately the reverse of RMD1's: selection uses RMD1's. */
    return guild_test_register_runner(host, RUNNER_ID, RUNNER_PRIORITY, -RUNNER_PRIORITY, &callbacks, state, error);
}

static void llama_shutdown(void* plugin_state) {
    llama_state_t* state = (llama_state_t*)plugin_state;
    if (state != NULL) {
        guild_test_roles_free(&state->roles);
        state->magic = 0u;
        free(state);
    }
}

static const guild_plugin_descriptor_v1_t llama_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    RUNNER_NAME,
    "1.0.0",
    llama_init,
    llama_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &llama_descriptor;
}
