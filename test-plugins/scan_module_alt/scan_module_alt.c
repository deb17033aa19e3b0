/*
 * scan_module_alt: a competing provider of the two scan operations of scan_module, with other
 * impl ids, a lower priority and a narrower contract, so that ranking tests can tell the
 * providers apart:
 *   example.sequence.inclusive_scan  (impl example.scan_alt.inclusive.cpu)
 *   example.sequence.exclusive_scan  (impl example.scan_alt.exclusive.cpu)
 * Priority 5 (scan_module: 10). f32 and f64 only, contiguous tensors only, rank 1..4, not in
 * place. Capabilities (scan_core.h): 64-bit types only. Numerics: deterministic, f32
 * accumulation, ordered reduction (no integer types, so no exact-integer guarantee). Op version
 * 1.0.0, host memory, host-blocking. The arithmetic is scan_module's (scan_core.h).
 */
#include "scan_core.h"

#define SCAN_ALT_COMPONENT "example.scan_alt"

static scan_op_t scan_alt_inclusive = {
    SCAN_OP_MAGIC, 0, SCAN_DTYPES_FLOAT, 4u, 0, 0, "example.scan_alt.inclusive.cpu",
};
static scan_op_t scan_alt_exclusive = {
    SCAN_OP_MAGIC, 1, SCAN_DTYPES_FLOAT, 4u, 0, 0, "example.scan_alt.exclusive.cpu",
};

static guild_status_t scan_alt_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    const uint64_t caps = SCAN_CAP_WIDE_TYPES;
    const uint64_t numerics =
        GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION | GUILD_NUMERICS_ORDERED_REDUCTION;
    guild_status_t status = scan_check_host(host, plugin_state, SCAN_ALT_COMPONENT, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = scan_register(host, &scan_alt_inclusive, "example.sequence.inclusive_scan", 5, caps, numerics,
                           GUILD_LAYOUT_CONTIGUOUS, GUILD_MEMORY_HOST, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    return scan_register(host, &scan_alt_exclusive, "example.sequence.exclusive_scan", 5, caps, numerics,
                         GUILD_LAYOUT_CONTIGUOUS, GUILD_MEMORY_HOST, error);
}

static void scan_alt_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t scan_alt_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "scan_module_alt",
    "1.0.0",
    scan_alt_init,
    scan_alt_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &scan_alt_descriptor;
}
