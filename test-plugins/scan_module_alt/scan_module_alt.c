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
 *
 * The same source also builds scan_module_tie (see CMakeLists.txt), which overrides the three
 * macros below: priority 10 like scan_module, and impl ids under example.early_scan, which sort
 * before scan_module's. Ranking tests use it to show the impl-id tie-break.
 */
#include "scan_core.h"

#ifndef SCAN_ALT_PREFIX
#define SCAN_ALT_PREFIX "example.scan_alt"
#endif
#ifndef SCAN_ALT_PRIORITY
#define SCAN_ALT_PRIORITY 5
#endif
#ifndef SCAN_ALT_NAME
#define SCAN_ALT_NAME "scan_module_alt"
#endif

#define SCAN_ALT_COMPONENT SCAN_ALT_PREFIX

static scan_op_t scan_alt_inclusive = {
    SCAN_OP_MAGIC, 0, SCAN_DTYPES_FLOAT, 4u, 0, 0, SCAN_ALT_PREFIX ".inclusive.cpu",
};
static scan_op_t scan_alt_exclusive = {
    SCAN_OP_MAGIC, 1, SCAN_DTYPES_FLOAT, 4u, 0, 0, SCAN_ALT_PREFIX ".exclusive.cpu",
};

static guild_status_t scan_alt_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    const uint64_t caps = SCAN_CAP_WIDE_TYPES;
    const uint64_t numerics =
        GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION | GUILD_NUMERICS_ORDERED_REDUCTION;
    guild_status_t status = scan_check_host(host, plugin_state, SCAN_ALT_COMPONENT, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = scan_register(host, &scan_alt_inclusive, "example.sequence.inclusive_scan", SCAN_ALT_PRIORITY, caps, numerics,
                           GUILD_LAYOUT_CONTIGUOUS, GUILD_MEMORY_HOST, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    return scan_register(host, &scan_alt_exclusive, "example.sequence.exclusive_scan", SCAN_ALT_PRIORITY, caps, numerics,
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
    SCAN_ALT_NAME,
    "1.0.0",
    scan_alt_init,
    scan_alt_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &scan_alt_descriptor;
}
