/*
 * duplicate_impl: registers the same impl id twice. The host must refuse the second registration
 * (GUILD_STATUS_ERR_ALREADY_EXISTS) and the load must fail; the plugin passes the refusal on as
 * its init status, as a careful plugin does.
 */
#include <guild/abi/kernel_abi.h>

#include "guild_test_kernel.h"

static guild_status_t duplicate_impl_init(const guild_host_api_v1_t* host, void** plugin_state,
                                          guild_error_info_t* error) {
    guild_kernel_op_desc_v1_t desc;
    guild_status_t status = guild_test_init_prologue(host, plugin_state, error, "test.duplicate_impl");
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    guild_test_kernel_desc(&desc, "test.duplicate_impl.add");
    status = host->register_kernel(host->host_context, &desc, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    desc.priority = 2;
    return host->register_kernel(host->host_context, &desc, error);
}

static void duplicate_impl_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t duplicate_impl_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "duplicate_impl",
    "1.0.0",
    duplicate_impl_init,
    duplicate_impl_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &duplicate_impl_descriptor;
}
