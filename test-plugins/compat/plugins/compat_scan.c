/* FROZEN (compatibility matrix): test-plugins/scan_module/scan_module.c as it was at SDK 1.5, built against ../sdk-1.5 only.
 * Never edit: the new host must keep loading and running this build as it is. */
/*
 * scan_module: a runtime module (module ABI 1) that provides two namespaced CPU operations with
 * GOP1 contracts:
 *   example.sequence.inclusive_scan  (impl example.scan.inclusive.cpu)  y[i] = x[0] + ... + x[i]
 *   example.sequence.exclusive_scan  (impl example.scan.exclusive.cpu)  y[i] = x[0] + ... + x[i-1]
 * Both scan along dims[0], the contiguous axis, for every index of the outer axes, honouring the
 * outer strides of input and output independently (0 = packed). One input, one output, the same
 * dtype (f32, f64, i32 or i64) and shape on both sides, rank 1..8, host memory, host-blocking,
 * op version 1.0.0, priority 10.
 *
 * Capabilities (scan_core.h): in place, 64-bit types, integer types, outer-strided layouts.
 * Numerics: deterministic, f32 accumulation (f64 for f64), ordered left-to-right reduction,
 * exact integers (sums that leave the type's range wrap around; they are never undefined).
 *
 * The module keeps no state: each operation's user_data is a static scan_op_t.
 */
#include "scan_core.h"

#define SCAN_MODULE_COMPONENT "example.scan"

static scan_op_t scan_inclusive = {
    SCAN_OP_MAGIC, 0, SCAN_DTYPES_ALL, (uint32_t)GUILD_MAX_TENSOR_RANK, 1, 1, "example.scan.inclusive.cpu",
};
static scan_op_t scan_exclusive = {
    SCAN_OP_MAGIC, 1, SCAN_DTYPES_ALL, (uint32_t)GUILD_MAX_TENSOR_RANK, 1, 1, "example.scan.exclusive.cpu",
};

static guild_status_t scan_module_init(const guild_host_api_v1_t* host, void** plugin_state,
                                       guild_error_info_t* error) {
    const uint64_t caps = SCAN_CAP_IN_PLACE | SCAN_CAP_WIDE_TYPES | SCAN_CAP_INTEGERS | SCAN_CAP_OUTER_STRIDED;
    const uint64_t numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION |
                              GUILD_NUMERICS_ORDERED_REDUCTION | GUILD_NUMERICS_EXACT_INTEGER;
    const uint32_t layouts = GUILD_LAYOUT_CONTIGUOUS | GUILD_LAYOUT_OUTER_STRIDED;
    guild_status_t status = scan_check_host(host, plugin_state, SCAN_MODULE_COMPONENT, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    status = scan_register(host, &scan_inclusive, "example.sequence.inclusive_scan", 10, caps, numerics, layouts,
                           GUILD_MEMORY_HOST, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    return scan_register(host, &scan_exclusive, "example.sequence.exclusive_scan", 10, caps, numerics, layouts,
                         GUILD_MEMORY_HOST, error);
}

static void scan_module_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t scan_module_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "scan_module",
    "1.0.0",
    scan_module_init,
    scan_module_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &scan_module_descriptor;
}
