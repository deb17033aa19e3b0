/*
 * legacy_provenance: an ordinary, valid kernel plugin standing in for a historical .gkernel. Its
 * manifest (written by the test) carries module_dependencies with a build-time ABI tag, which are
 * provenance records rather than runtime edges; the library itself registers one legacy CPU
 * kernel and must load like any good plugin.
 */
#include <guild/abi/kernel_abi.h>

#include "guild_test_kernel.h"

static guild_status_t legacy_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_kernel_op_desc_v1_t desc;
    guild_status_t status = guild_test_init_prologue(host, plugin_state, error, "test.legacy_provenance");
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    guild_test_kernel_desc(&desc, "test.legacy_provenance.matvec_q4_0");
    desc.op_kind = GUILD_OP_MATVEC;
    desc.op_name = "matvec";
    desc.priority = 5;
    return host->register_kernel(host->host_context, &desc, error);
}

static void legacy_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t legacy_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "legacy_provenance",
    "0.9.1",
    legacy_init,
    legacy_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &legacy_descriptor;
}
