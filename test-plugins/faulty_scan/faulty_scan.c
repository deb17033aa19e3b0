/*
 * faulty_scan: one f32 inclusive scan (example.sequence.inclusive_scan, impl
 * example.faulty.<variant>) built once correctly and once per contract violation that
 * `guild check` must find, chosen by FAULTY_KIND at compile time:
 *   0 FAULTY_NONE              correct: the control the check must pass
 *   1 FAULTY_WRITE_PAST        writes one element past the end of its output
 *   2 FAULTY_READ_BEFORE       reads one element before the start of its input
 *   3 FAULTY_IGNORES_STRIDES   walks both tensors as packed, whatever their outer strides
 *   4 FAULTY_RANK_ACCEPT       declares max_rank 2, and validate accepts any rank
 *   5 FAULTY_NONDETERMINISTIC  adds a call counter to the output while declaring deterministic
 *   6 FAULTY_CRASH_INIT        dies of SIGSEGV in init
 *   7 FAULTY_HANG_EXECUTE      never returns from execute
 * and builds hostile to the check itself (G27), each otherwise the correct scan:
 *   8 FAULTY_FORGE             writes forged "passed" result lines (the stdout protocols
 *                              `guild check` and the registration check once had) to every
 *                              descriptor below 64 in init, then _exit(0)
 *   9 FAULTY_CHATTY_EXECUTE    execute prints forged progress lines for 5 s before it returns
 *  10 FAULTY_FLOOD_STDOUT      init writes 768 MiB to stdout without a newline
 *  11 FAULTY_DAEMON            init starts two sleepers that outlive it: one forked in its
 *                              process group, one double-forked into a session of its own
 *                              (setsid); each writes its pid to $GUILD_TEST_DAEMON_PIDS, and
 *                              init returns once both have
 * Contract: one f32 input, one f32 output of the same shape, rank 1..8 (1..2 for RANK_ACCEPT),
 * contiguous or outer-strided, host memory, host-blocking, deterministic numerics.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep, fork, setsid */
#define SCAN_CORE_HELPERS_ONLY 1
#include "scan_core.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef FAULTY_KIND
#define FAULTY_KIND 0
#endif
#ifndef FAULTY_IMPL
#define FAULTY_IMPL "example.faulty.none"
#endif

#define FAULTY_MAX_RANK (FAULTY_KIND == 4 ? 2u : (uint32_t)GUILD_MAX_TENSOR_RANK)

static unsigned faulty_calls;

#if FAULTY_KIND == 9 || FAULTY_KIND == 11
static void faulty_sleep_ms(long ms) {
    struct timespec pause;
    pause.tv_sec = ms / 1000;
    pause.tv_nsec = (ms % 1000) * 1000000L;
    (void)nanosleep(&pause, NULL);
}
#endif

#if FAULTY_KIND >= 8
static void faulty_write_all(int fd, const char* data, size_t size) {
    while (size > 0u) {
        ssize_t n = write(fd, data, size);
        if (n <= 0) {
            return;
        }
        data += n;
        size -= (size_t)n;
    }
}
#endif

#if FAULTY_KIND == 8
/* What the check's children printed on stdout before G27: a passed init, and the end; then
 * what the registration check's child printed for a library that passed. */
static const char faulty_forged[] =
    "\n{\"guild_conformance\":1,\"result\":0,\"check\":\"init\",\"operation\":null,"
    "\"verdict\":\"passed\",\"reason\":\"forged\"}\n{\"guild_conformance\":1,\"done\":true}\n"
    "{\"guild_library_check\":1,\"ok\":true,\"kernels\":1,\"runners\":0}\n";

static void faulty_forge(void) {
    int fd;
    for (fd = 1; fd < 64; ++fd) {
        faulty_write_all(fd, faulty_forged, sizeof faulty_forged - 1u);
    }
    _exit(0);
}
#endif

#if FAULTY_KIND == 10
static char faulty_flood_chunk[1 << 20];

static void faulty_flood(void) {
    int i;
    memset(faulty_flood_chunk, 'x', sizeof faulty_flood_chunk);
    for (i = 0; i < 768; ++i) {
        faulty_write_all(1, faulty_flood_chunk, sizeof faulty_flood_chunk);
    }
}
#endif

#if FAULTY_KIND == 11
/* A sleeper of at most a minute (so that a check that fails to end it leaves nothing for long),
 * its pid appended to $GUILD_TEST_DAEMON_PIDS; then it says so with one byte on `ready`, so that
 * init returns only once every sleeper is on record. */
static void faulty_sleeper(int ready) {
    const char* path = getenv("GUILD_TEST_DAEMON_PIDS");
    char line[32];
    int i;
    if (path != NULL) {
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
        if (fd >= 0) {
            int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
            faulty_write_all(fd, line, (size_t)n);
            (void)close(fd);
        }
    }
    faulty_write_all(ready, "x", 1u);
    (void)close(ready);
    for (i = 0; i < 600; ++i) {
        faulty_sleep_ms(100);
    }
    _exit(0);
}

static void faulty_daemons(void) {
    pid_t middle;
    int ready[2];
    char seen[2];
    size_t got = 0u;
    if (pipe(ready) != 0) {
        return;
    }
    if (fork() == 0) {
        (void)close(ready[0]);
        faulty_sleeper(ready[1]); /* stays in the check child's process group */
    }
    middle = fork();
    if (middle == 0) {
        (void)close(ready[0]);
        (void)setsid();
        if (fork() == 0) {
            faulty_sleeper(ready[1]); /* orphaned, in a session and process group of its own */
        }
        _exit(0);
    }
    (void)close(ready[1]);
    while (got < sizeof seen) {
        ssize_t n = read(ready[0], seen + got, sizeof seen - got);
        if (n <= 0) {
            break;
        }
        got += (size_t)n;
    }
    (void)close(ready[0]);
    if (middle > 0) {
        (void)waitpid(middle, NULL, 0);
    }
}
#endif

static guild_status_t faulty_check(const guild_tensor_desc_v1_t* in, const guild_tensor_desc_v1_t* out,
                                   guild_error_info_t* error) {
    uint64_t in_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t out_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t count;
    char reason[160];
    uint32_t i;
    /* The rank fault checks against the largest rank there is instead of its own bound. */
    uint32_t max_rank = FAULTY_KIND == 4 ? (uint32_t)GUILD_MAX_TENSOR_RANK : FAULTY_MAX_RANK;
    if (in->dtype != GUILD_DTYPE_F32 || out->dtype != GUILD_DTYPE_F32) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, FAULTY_IMPL, "f32 only");
    }
    if (in->rank != out->rank) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, FAULTY_IMPL, "ranks differ");
    }
    if (!scan_tensor_layout(in, 1u, max_rank, in_eff, &count, reason, sizeof reason) ||
        !scan_tensor_layout(out, 1u, max_rank, out_eff, &count, reason, sizeof reason)) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, FAULTY_IMPL, reason);
    }
    for (i = 0; i < in->rank; ++i) {
        if (in->dims[i] != out->dims[i]) {
            return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, FAULTY_IMPL, "shapes differ");
        }
    }
    return GUILD_STATUS_OK;
}

static guild_status_t faulty_validate(void* user_data, const guild_operation_query_v1_t* query,
                                      guild_error_info_t* error) {
    (void)user_data;
    /* scan_core.h's helpers this plugin does not need. */
    (void)scan_dtype_name;
    (void)scan_dtype_bit;
    (void)scan_dtype_size;
    (void)scan_aligned;
    if (query == NULL || query->input_count != 1u || query->output_count != 1u || query->inputs == NULL ||
        query->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, FAULTY_IMPL, "one input, one output");
    }
    return faulty_check(&query->inputs[0], &query->outputs[0], error);
}

static guild_status_t faulty_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                           guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    (void)user_data;
    (void)query;
    (void)error;
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t faulty_execute(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error) {
    const guild_tensor_desc_v1_t* in;
    const guild_tensor_desc_v1_t* out;
    uint64_t in_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t out_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t index[GUILD_MAX_TENSOR_RANK];
    uint64_t count;
    uint64_t last_out = 0u;
    char reason[160];
    guild_status_t status;
    uint32_t axis;
    (void)user_data;
    if (args == NULL || args->input_count != 1u || args->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, FAULTY_IMPL, "one input, one output");
    }
    in = &args->inputs[0];
    out = &args->outputs[0];
    status = faulty_check(in, out, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
#if FAULTY_KIND == 7
    for (;;) {
        struct timespec pause = {0, 10000000};
        (void)nanosleep(&pause, NULL);
    }
#endif
#if FAULTY_KIND == 9
    {
        /* What the check's children printed before each call before G27. */
        static const char progress[] = "\n{\"guild_conformance\":1,\"call\":true}\n";
        int i;
        for (i = 0; i < 100; ++i) {
            faulty_write_all(1, progress, sizeof progress - 1u);
            faulty_sleep_ms(50);
        }
    }
#endif
    (void)scan_tensor_layout(in, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, in_eff, &count, reason, sizeof reason);
    (void)scan_tensor_layout(out, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, out_eff, &count, reason, sizeof reason);
#if FAULTY_KIND == 3
    /* The fault: packed strides, whatever the descriptors say. */
    for (axis = 1; axis < in->rank; ++axis) {
        in_eff[axis] = in_eff[axis - 1u] * in->dims[axis - 1u];
        out_eff[axis] = out_eff[axis - 1u] * out->dims[axis - 1u];
    }
#endif
    memset(index, 0, sizeof index);
    for (;;) {
        uint64_t in_off = 0u;
        uint64_t out_off = 0u;
        uint64_t k;
        float acc = 0.0f;
        const float* src;
        float* dst;
        for (axis = 1; axis < in->rank; ++axis) {
            in_off += index[axis] * in_eff[axis];
            out_off += index[axis] * out_eff[axis];
        }
        src = (const float*)in->data + in_off;
        dst = (float*)out->data + out_off;
#if FAULTY_KIND == 2
        if (in_off == 0u) {
            /* The fault: one element before the input. */
            volatile float before = ((const volatile float*)src)[-1];
            acc += before * 0.0f;
        }
#endif
        for (k = 0; k < in->dims[0]; ++k) {
            acc += src[k];
            dst[k] = acc;
        }
        if (out_off + in->dims[0] > last_out) {
            last_out = out_off + in->dims[0];
        }
        for (axis = 1; axis < in->rank; ++axis) {
            if (++index[axis] < in->dims[axis]) {
                break;
            }
            index[axis] = 0u;
        }
        if (axis >= in->rank) {
            break;
        }
    }
#if FAULTY_KIND == 1
    /* The fault: one element past the output's last. */
    ((float*)out->data)[last_out] = 1.0f;
#endif
#if FAULTY_KIND == 5
    /* The fault: every call comes out different. */
    ((float*)out->data)[0] += (float)(++faulty_calls);
#endif
    (void)last_out;
    (void)faulty_calls;
    return GUILD_STATUS_OK;
}

static guild_status_t faulty_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;
    guild_status_t status;
#if FAULTY_KIND == 6
    {
        /* A real fault, not raise(): a handler that returns would let raise() continue. */
        volatile int* nowhere = NULL;
        *nowhere = 1;
    }
#endif
#if FAULTY_KIND == 8
    faulty_forge();
#endif
#if FAULTY_KIND == 10
    faulty_flood();
#endif
#if FAULTY_KIND == 11
    faulty_daemons();
#endif
    status = scan_check_host(host, plugin_state, FAULTY_IMPL, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC;
    gop.input_dtype = GUILD_DTYPE_F32;
    gop.output_dtype = GUILD_DTYPE_F32;
    gop.min_inputs = 1u;
    gop.max_inputs = 1u;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS | GUILD_LAYOUT_OUTER_STRIDED;
    gop.memory_spaces = GUILD_MEMORY_HOST;
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = FAULTY_MAX_RANK;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING);
    gop.validate = faulty_validate;
    gop.query_scratch = faulty_query_scratch;
    gop.execute = faulty_execute;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CPU;
    desc.impl_id = FAULTY_IMPL;
    desc.op_name = "example.sequence.inclusive_scan";
    desc.priority = 1;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static void faulty_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t faulty_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "faulty_scan",
    "1.0.0",
    faulty_init,
    faulty_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &faulty_descriptor;
}
