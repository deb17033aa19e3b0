/*
 * wrong_ids: registers an impl id that its manifest does not declare (the tests declare
 * test.wrong_ids.declared; the plugin registers test.wrong_ids.actual). The host answers
 * GUILD_STATUS_ERR_PERMISSION and the load fails with a mismatch naming both sets.
 */
#include <guild/abi/kernel_abi.h>

#include "guild_test_kernel.h"

static guild_status_t wrong_ids_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_kernel_op_desc_v1_t desc;
    guild_status_t status = guild_test_init_prologue(host, plugin_state, error, "test.wrong_ids");
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    guild_test_kernel_desc(&desc, "test.wrong_ids.actual");
    return host->register_kernel(host->host_context, &desc, error);
}

static void wrong_ids_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t wrong_ids_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "wrong_ids",
    "1.0.0",
    wrong_ids_init,
    wrong_ids_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &wrong_ids_descriptor;
}
