/*
 * wrong_abi: a plugin built for Kernel ABI 2.0.0 (its descriptor's abi_version and its supported
 * range both say 2.x). A 1.x host must refuse it before calling init; init leaves a marker line
 * if it is ever called, so the tests can see that it was not.
 */
#include <guild/abi/kernel_abi.h>

#include "guild_test_marker.h"

#define WRONG_ABI_VERSION GUILD_KERNEL_ABI_MAKE_VERSION(2, 0, 0)

static guild_status_t wrong_abi_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    (void)host;
    guild_test_marker("wrong_abi", "init was called");
    if (plugin_state != NULL) {
        *plugin_state = NULL;
    }
    return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, "test.wrong_abi", "this plugin needs Kernel ABI 2");
}

static void wrong_abi_shutdown(void* plugin_state) {
    (void)plugin_state;
    guild_test_marker("wrong_abi", "shutdown was called");
}

static const guild_plugin_descriptor_v1_t wrong_abi_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    WRONG_ABI_VERSION,
    WRONG_ABI_VERSION,
    WRONG_ABI_VERSION,
    "wrong_abi",
    "2.0.0",
    wrong_abi_init,
    wrong_abi_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &wrong_abi_descriptor;
}
