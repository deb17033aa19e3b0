/*
 * A minimal legacy CPU kernel descriptor for the C test plugins that only need something to
 * register: it names an impl id and nothing else of interest.
 */
#ifndef GUILD_TEST_KERNEL_H
#define GUILD_TEST_KERNEL_H

#include <guild/abi/kernel_abi.h>

#include <string.h>

/* Fills *desc as a valid Kernel ABI v1 GUILD_OP_ADD CPU kernel named impl_id. */
static inline void guild_test_kernel_desc(guild_kernel_op_desc_v1_t* desc, const char* impl_id) {
    memset(desc, 0, sizeof *desc);
    desc->struct_size = (uint32_t)sizeof *desc;
    desc->abi_version = GUILD_KERNEL_ABI_VERSION;
    desc->op_kind = GUILD_OP_ADD;
    desc->backend = GUILD_BACKEND_CPU;
    desc->impl_id = impl_id;
    desc->op_name = NULL;
    desc->priority = 1;
    desc->sync_mask = GUILD_LEGACY_SYNC_HOST;
    desc->next_ext = NULL;
}

/* The shared start of every test init: check the arguments and the host table, clear the state. */
static inline guild_status_t guild_test_init_prologue(const guild_host_api_v1_t* host, void** plugin_state,
                                                      guild_error_info_t* error, const char* component) {
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, component,
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    if (host->struct_size < (uint32_t)GUILD_HOST_API_V1_BASE_SIZE || host->register_kernel == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, component,
                                    "host table is smaller than the Kernel ABI v1 base");
    }
    return GUILD_STATUS_OK;
}

#endif /* GUILD_TEST_KERNEL_H */
