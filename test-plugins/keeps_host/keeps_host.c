/*
 * keeps_host: a plugin that breaks the staging rule on purpose. During init it keeps the pointer
 * to the host table it was given, and later calls register_kernel, register_runner and log through
 * it: from the execute callback of the GOP1 operation it registers (which a test invokes after the
 * load) and again from shutdown. The host must answer GUILD_STATUS_ERR_STATE each time instead of
 * touching memory that belonged to the finished init. What came back is reported through
 * execute's status and error record, and from shutdown through a marker line.
 */
#include <guild/abi/kernel_abi.h>
#include <guild/abi/module_abi.h>
#include <guild/abi/runner_abi.h>

#include <stdio.h>
#include <string.h>

#include "guild_test_kernel.h"
#include "guild_test_marker.h"

#define KEEPS_HOST_COMPONENT "test.keeps_host"

/* The table init was given. Keeping it is the bug this plugin exists to commit. */
static const guild_host_api_v1_t* keeps_host_kept = NULL;

/* Calls every host callback through the kept table and describes the answers in `message`. */
static guild_status_t keeps_host_late_calls(char* message, size_t capacity) {
    guild_kernel_op_desc_v1_t kernel;
    guild_runner_desc_v1_t runner;
    guild_error_info_t error;
    guild_error_info_t record;
    guild_status_t kernel_status;
    guild_status_t runner_status;
    if (keeps_host_kept == NULL) {
        (void)snprintf(message, capacity, "no host table was kept");
        return GUILD_STATUS_ERR_INTERNAL;
    }
    guild_test_kernel_desc(&kernel, "test.keeps_host.late");
    guild_error_info_init(&error);
    kernel_status = keeps_host_kept->register_kernel(keeps_host_kept->host_context, &kernel, &error);

    memset(&runner, 0, sizeof runner);
    runner.struct_size = (uint32_t)sizeof runner;
    runner.abi_version = GUILD_KERNEL_ABI_VERSION;
    runner.runner_id = "test.keeps_host.late_runner";
    guild_error_info_init(&error);
    runner_status = keeps_host_kept->register_runner(keeps_host_kept->host_context, &runner, &error);

    /* log cannot report failure; it must simply do nothing harmful. */
    guild_error_info_init(&record);
    (void)guild_error_info_set(&record, GUILD_STATUS_OK, KEEPS_HOST_COMPONENT, "a log record after init");
    keeps_host_kept->log(keeps_host_kept->host_context, GUILD_LOG_LEVEL_WARN, &record);

    (void)snprintf(message, capacity, "late register_kernel returned %d, register_runner returned %d",
                   (int)kernel_status, (int)runner_status);
    return kernel_status;
}

static guild_status_t keeps_host_validate(void* user_data, const guild_operation_query_v1_t* query,
                                          guild_error_info_t* error) {
    (void)user_data;
    (void)query;
    (void)error;
    return GUILD_STATUS_OK;
}

static guild_status_t keeps_host_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                               guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    (void)user_data;
    (void)query;
    if (out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, KEEPS_HOST_COMPONENT, "no output");
    }
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

/* Ignores its arguments: it exists so that a test can make the plugin use the kept table. */
static guild_status_t keeps_host_execute(void* user_data, const guild_execute_args_v1_t* args,
                                         guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    guild_status_t status;
    (void)user_data;
    (void)args;
    status = keeps_host_late_calls(message, sizeof message);
    (void)guild_error_info_set(error, status, KEEPS_HOST_COMPONENT, message);
    return status;
}

static guild_status_t keeps_host_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_operation_ext_v1_t op;
    guild_kernel_op_desc_v1_t desc;
    guild_status_t status = guild_test_init_prologue(host, plugin_state, error, KEEPS_HOST_COMPONENT);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    keeps_host_kept = host;

    memset(&op, 0, sizeof op);
    op.header.struct_size = (uint32_t)sizeof op;
    op.header.tag = GUILD_GOP1_TAG;
    op.header.version = GUILD_GOP1_VERSION;
    op.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    op.input_dtype = GUILD_DTYPE_ANY;
    op.output_dtype = GUILD_DTYPE_ANY;
    op.min_inputs = 0u;
    op.max_inputs = 0u;
    op.min_outputs = 0u;
    op.max_outputs = 0u;
    op.layouts = GUILD_LAYOUT_CONTIGUOUS;
    op.memory_spaces = GUILD_MEMORY_HOST;
    op.min_rank = 1u;
    op.max_rank = 1u;
    op.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    op.validate = keeps_host_validate;
    op.query_scratch = keeps_host_query_scratch;
    op.execute = keeps_host_execute;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = "test.keeps_host.probe";
    desc.op_name = "test.keeps_host.late_registration";
    desc.next_ext = &op.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static void keeps_host_shutdown(void* plugin_state) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    char line[GUILD_ERROR_MESSAGE_CAPACITY + 16];
    (void)plugin_state;
    (void)keeps_host_late_calls(message, sizeof message);
    (void)snprintf(line, sizeof line, "shutdown: %s", message);
    guild_test_marker("keeps_host", line);
    keeps_host_kept = NULL;
}

static const guild_plugin_descriptor_v1_t keeps_host_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "keeps_host",
    "1.0.0",
    keeps_host_init,
    keeps_host_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &keeps_host_descriptor;
}
