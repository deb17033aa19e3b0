/*
 * init_fails: a plugin whose init allocates its state, hands it to the host and then fails with a
 * status, a component and a message, as a plugin without its device would. The host must report
 * that text and still call shutdown with the state, which frees it and leaves a marker line
 * (guild_test_marker.h) so that the tests can see shutdown ran.
 */
#include <guild/abi/kernel_abi.h>

#include <stdlib.h>

#include "guild_test_marker.h"

typedef struct init_fails_state_t {
    uint32_t magic;
} init_fails_state_t;

#define INIT_FAILS_MAGIC 0xfa11fa11u

static guild_status_t init_fails_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    init_fails_state_t* state;
    if (host == NULL || plugin_state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, "test.init_fails",
                                    "init needs a host table and a plugin_state slot");
    }
    *plugin_state = NULL;
    state = (init_fails_state_t*)malloc(sizeof *state);
    if (state == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_OUT_OF_MEMORY, "test.init_fails", "cannot allocate state");
    }
    state->magic = INIT_FAILS_MAGIC;
    /* Partial initialisation: the state exists, so shutdown must be able to free it. */
    *plugin_state = state;
    return guild_error_info_set(error, GUILD_STATUS_ERR_DEVICE, "test.init_fails",
                                "no usable device for the test kernels");
}

static void init_fails_shutdown(void* plugin_state) {
    init_fails_state_t* state = (init_fails_state_t*)plugin_state;
    if (state == NULL) {
        guild_test_marker("init_fails", "shutdown called with NULL state");
        return;
    }
    if (state->magic != INIT_FAILS_MAGIC) {
        guild_test_marker("init_fails", "shutdown called with a foreign state");
        return;
    }
    state->magic = 0u;
    free(state);
    guild_test_marker("init_fails", "shutdown freed the state init left");
}

static const guild_plugin_descriptor_v1_t init_fails_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "init_fails",
    "1.0.0",
    init_fails_init,
    init_fails_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &init_fails_descriptor;
}
