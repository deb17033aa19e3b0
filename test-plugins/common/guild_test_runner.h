/*
 * Helpers for the C test runners (runner_llama, runner_hybrid): reading typed metadata through
 * the host's model reader, building the tensor-role list a description points at, and the
 * runner state that owns that list until the extension is called again.
 *
 * Only the SDK's public headers and the C99 standard library are used.
 */
#ifndef GUILD_TEST_RUNNER_H
#define GUILD_TEST_RUNNER_H

#include <guild/abi/kernel_abi.h>
#include <guild/abi/runner_abi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Capacity of one tensor name in a role list, NUL included. */
#define GUILD_TEST_RUNNER_NAME_CAPACITY 64

/* The roles a description points at, with their names; owned by the runner's state. */
typedef struct guild_test_roles_t {
    guild_tensor_role_v1_t* roles;
    char (*names)[GUILD_TEST_RUNNER_NAME_CAPACITY];
    size_t count;
    size_t capacity;
} guild_test_roles_t;

/* Frees the list and leaves it empty. */
static inline void guild_test_roles_free(guild_test_roles_t* list) {
    free(list->roles);
    free(list->names);
    list->roles = NULL;
    list->names = NULL;
    list->count = 0;
    list->capacity = 0;
}

/* Replaces the list with an empty one of `capacity` entries; 0 on failure. */
static inline int guild_test_roles_reset(guild_test_roles_t* list, size_t capacity) {
    guild_test_roles_free(list);
    list->roles = (guild_tensor_role_v1_t*)calloc(capacity, sizeof *list->roles);
    list->names = (char (*)[GUILD_TEST_RUNNER_NAME_CAPACITY])calloc(capacity, sizeof *list->names);
    if (list->roles == NULL || list->names == NULL) {
        guild_test_roles_free(list);
        return 0;
    }
    list->capacity = capacity;
    return 1;
}

/* Appends a role naming `name` (a layer of -1 for a model-wide tensor); 0 when full. */
static inline int guild_test_roles_add(guild_test_roles_t* list, uint32_t role, int32_t layer, uint32_t flags,
                                       const char* name) {
    guild_tensor_role_v1_t* record;
    if (list->count == list->capacity) {
        return 0;
    }
    (void)snprintf(list->names[list->count], GUILD_TEST_RUNNER_NAME_CAPACITY, "%s", name);
    record = &list->roles[list->count];
    record->role = role;
    record->layer = layer;
    record->name = list->names[list->count];
    record->flags = flags;
    record->reserved = 0u;
    list->count += 1;
    return 1;
}

/* Appends a role naming "blk.<layer>.<suffix>"; 0 when full. */
static inline int guild_test_roles_add_layer(guild_test_roles_t* list, uint32_t role, int32_t layer, uint32_t flags,
                                             const char* suffix) {
    char name[GUILD_TEST_RUNNER_NAME_CAPACITY];
    (void)snprintf(name, sizeof name, "blk.%d.%s", (int)layer, suffix);
    return guild_test_roles_add(list, role, layer, flags, name);
}

/* Points a description at the list. */
static inline void guild_test_roles_attach(const guild_test_roles_t* list, guild_runner_model_v1_t* out) {
    out->tensor_roles = list->roles;
    out->tensor_role_count = list->count;
}

/*
 * Reads "<prefix>.<suffix>" as a uint32_t. A missing key gives `fallback` when `fallback_ok`,
 * else ERR_UNSUPPORTED with a reason; a value that does not fit is ERR_UNSUPPORTED too.
 */
static inline guild_status_t guild_test_read_u32(const guild_model_reader_v1_t* model, const char* prefix,
                                                 const char* suffix, int fallback_ok, uint32_t fallback,
                                                 uint32_t* out, const char* component, guild_error_info_t* error) {
    char key[128];
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    uint64_t value = 0;
    guild_status_t status;
    (void)snprintf(key, sizeof key, "%s.%s", prefix, suffix);
    status = model->get_uint(model->ctx, key, &value);
    if (status == GUILD_STATUS_ERR_NOT_FOUND && fallback_ok) {
        *out = fallback;
        return GUILD_STATUS_OK;
    }
    if (status != GUILD_STATUS_OK || value > 0xffffffffu) {
        (void)snprintf(message, sizeof message, "%s cannot be read as a 32-bit count (status %d)", key, (int)status);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, message);
    }
    *out = (uint32_t)value;
    return GUILD_STATUS_OK;
}

/* Reads "<prefix>.<suffix>" as a float; a missing key gives `fallback`. */
static inline guild_status_t guild_test_read_f32(const guild_model_reader_v1_t* model, const char* prefix,
                                                 const char* suffix, float fallback, float* out,
                                                 const char* component, guild_error_info_t* error) {
    char key[128];
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    double value = 0.0;
    guild_status_t status;
    (void)snprintf(key, sizeof key, "%s.%s", prefix, suffix);
    status = model->get_float(model->ctx, key, &value);
    if (status == GUILD_STATUS_ERR_NOT_FOUND) {
        *out = fallback;
        return GUILD_STATUS_OK;
    }
    if (status != GUILD_STATUS_OK) {
        (void)snprintf(message, sizeof message, "%s cannot be read as a float (status %d)", key, (int)status);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, message);
    }
    *out = (float)value;
    return GUILD_STATUS_OK;
}

/*
 * Recognition by general.architecture: OK when it reads `expected`, else ERR_UNSUPPORTED with a
 * reason. The length is asked first, the way a caller that does not know it sizes its buffer.
 */
static inline guild_status_t guild_test_recognize_arch(const guild_model_reader_v1_t* model, const char* expected,
                                                       const char* component, guild_error_info_t* error) {
    char arch[GUILD_RUNNER_ARCH_CAPACITY];
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    size_t length = 0;
    guild_status_t status;
    if (model == NULL || model->struct_size < (uint32_t)sizeof(guild_model_reader_v1_t) ||
        model->version != GUILD_MODEL_READER_VERSION) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, component,
                                    "the model reader is missing or of another version");
    }
    status = model->get_string(model->ctx, "general.architecture", NULL, 0u, &length);
    if (status == GUILD_STATUS_ERR_NOT_FOUND) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, "the model has no general.architecture");
    }
    if (status != GUILD_STATUS_ERR_BUFFER_TOO_SMALL) {
        (void)snprintf(message, sizeof message, "general.architecture is not a string (status %d)", (int)status);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, message);
    }
    if (length + 1u > sizeof arch) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, "general.architecture is too long");
    }
    status = model->get_string(model->ctx, "general.architecture", arch, sizeof arch, &length);
    if (status != GUILD_STATUS_OK) {
        (void)snprintf(message, sizeof message, "general.architecture cannot be read (status %d)", (int)status);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, message);
    }
    if (strcmp(arch, expected) != 0) {
        (void)snprintf(message, sizeof message, "architecture %s is not %s", arch, expected);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, message);
    }
    return GUILD_STATUS_OK;
}

/*
 * Instance logs. A test that wants to see a runner's instances come and go puts the path of a
 * log file in the model's "test.marker_path" string; create reads it into the instance, and
 * create and destroy each append one line to it. The path travels with the model, so tests that
 * run in parallel in one process never share a log (and no environment variable is written
 * while plugins may read the environment).
 */
#define GUILD_TEST_MARKER_PATH_KEY "test.marker_path"
#define GUILD_TEST_MARKER_PATH_CAPACITY 1024

/* Reads the model's marker path into `path` (empty when the model has none). */
static inline void guild_test_marker_path(const guild_model_reader_v1_t* model, char* path, size_t capacity) {
    size_t length = 0;
    path[0] = '\0';
    if (model->get_string(model->ctx, GUILD_TEST_MARKER_PATH_KEY, path, capacity, &length) != GUILD_STATUS_OK) {
        path[0] = '\0';
    }
}

/* Appends "<event> <runner_id>" and a newline to `path`, when it is not empty. */
static inline void guild_test_log_event(const char* path, const char* event, const char* runner_id) {
    FILE* file;
    if (path == NULL || path[0] == '\0') {
        return;
    }
    file = fopen(path, "a");
    if (file == NULL) {
        return;
    }
    (void)fprintf(file, "%s %s\n", event, runner_id);
    (void)fclose(file);
}

/* The callbacks of one test runner: its RMD1 extension and its descriptor's create/destroy. */
typedef struct guild_test_runner_callbacks_t {
    guild_status_t (*recognize)(void*, const guild_model_reader_v1_t*, guild_error_info_t*);
    guild_status_t (*describe)(void*, const guild_model_reader_v1_t*, guild_runner_model_v1_t*, guild_error_info_t*);
    guild_status_t (*validate_numerics)(void*, const guild_model_reader_v1_t*, const guild_runner_model_v1_t*,
                                        guild_error_info_t*);
    guild_status_t (*create)(void*, const struct guild_model_reader_v1_t*, void**, guild_error_info_t*);
    void (*destroy)(void*, void*);
} guild_test_runner_callbacks_t;

/*
 * Registers a runner `runner_id` whose RMD1 extension has `rmd1_priority` and whose descriptor
 * has `descriptor_priority`, with `state` as every callback's user_data. Both records live on
 * this frame: the host copies them.
 */
static inline guild_status_t guild_test_register_runner(const guild_host_api_v1_t* host, const char* runner_id,
                                                        int32_t rmd1_priority, int32_t descriptor_priority,
                                                        const guild_test_runner_callbacks_t* callbacks, void* state,
                                                        guild_error_info_t* error) {
    guild_runner_model_ext_v1_t ext;
    guild_runner_desc_v1_t desc;
    memset(&ext, 0, sizeof ext);
    ext.header.struct_size = (uint32_t)sizeof ext;
    ext.header.tag = GUILD_RMD1_TAG;
    ext.header.version = GUILD_RMD1_VERSION;
    ext.priority = rmd1_priority;
    ext.recognize = callbacks->recognize;
    ext.describe = callbacks->describe;
    ext.validate_numerics = callbacks->validate_numerics;
    ext.user_data = state;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.runner_id = runner_id;
    desc.priority = descriptor_priority;
    desc.user_data = state;
    desc.create = callbacks->create;
    desc.destroy = callbacks->destroy;
    desc.next_ext = &ext.header;
    return host->register_runner(host->host_context, &desc, error);
}

#endif /* GUILD_TEST_RUNNER_H */
