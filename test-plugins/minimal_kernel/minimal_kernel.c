/*
 * minimal_kernel: the smallest well-behaved Guild plugin. It exports the Kernel ABI v1 entry point,
 * returns a static descriptor, registers no kernels during init and has nothing to free at
 * shutdown. The host's loader tests use it to prove that a library built against the installed
 * SDK can be opened, its entry symbol found and its descriptor read.
 */
#include <guild/abi/kernel_abi.h>

#include <stddef.h>

static guild_status_t minimal_kernel_init(const guild_host_api_v1_t* host, void** plugin_state,
                                          guild_error_info_t* error) {
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "minimal_kernel",
                                    "init needs a host table and a plugin_state slot");
    }
    /* Nothing is allocated, so the host passes NULL back to shutdown. Writing it first means the
     * slot is defined on every path below, including the failures. */
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "minimal_kernel",
                                    "host table is smaller than the Kernel ABI v1 base");
    }
    if (GUILD_ABI_VERSION_MAJOR(host->abi_version) != GUILD_ABI_VERSION_MAJOR(GUILD_KERNEL_ABI_VERSION)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_ABI_MISMATCH, "minimal_kernel",
                                    "host speaks another Kernel ABI major version");
    }
    /* The log callback is optional for this plugin: a host without one still loads it. */
    if (host->log != NULL) {
        guild_error_info_t record;
        guild_error_info_init(&record);
        (void)guild_error_info_set(&record, GUILD_STATUS_OK, "minimal_kernel", "initialised; no kernels to register");
        host->log(host->host_context, GUILD_LOG_LEVEL_DEBUG, &record);
    }
    return GUILD_STATUS_OK;
}

static void minimal_kernel_shutdown(void* plugin_state) {
    /* init never allocates, so there is nothing to release; NULL is the only value it hands out. */
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t minimal_kernel_descriptor = {
    .struct_size = (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    .abi_version = GUILD_KERNEL_ABI_VERSION,
    /* Only the ABI it was built and tested against; the package manifest states the same range. */
    .min_kernel_abi = GUILD_KERNEL_ABI_VERSION,
    .max_kernel_abi = GUILD_KERNEL_ABI_VERSION,
    .plugin_name = "minimal_kernel",
    .plugin_version = "1.0.0",
    .init = minimal_kernel_init,
    .shutdown = minimal_kernel_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &minimal_kernel_descriptor;
}
