/*
 * bad_descriptor: exports the entry point, but its descriptor has no init callback. A host must
 * refuse the descriptor before calling anything else; shutdown leaves a marker line if it is ever
 * called.
 */
#include <guild/abi/kernel_abi.h>

#include "guild_test_marker.h"

static void bad_descriptor_shutdown(void* plugin_state) {
    (void)plugin_state;
    guild_test_marker("bad_descriptor", "shutdown was called");
}

static const guild_plugin_descriptor_v1_t bad_descriptor_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "bad_descriptor",
    "1.0.0",
    NULL,
    bad_descriptor_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &bad_descriptor_descriptor;
}
