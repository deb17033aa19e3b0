/*
 * cuda_scan: the CUDA variant of scan_module, a runtime module (module ABI 1) with two GOP1
 * operations on the CUDA backend:
 *   example.sequence.inclusive_scan  (impl example.cuda_scan.inclusive.cuda)
 *   example.sequence.exclusive_scan  (impl example.cuda_scan.exclusive.cuda)
 * Both scan along dims[0] for every index of the outer axes, on f32 or i32 tensors of rank 1..8
 * in contiguous layout, in device or managed memory, stream-ordered, graph-capturable or
 * host-blocking (launch, then wait for the stream). The output may be the input buffer itself.
 * Op version 1.0.0, priority 10, compute capability 5.0 and up (the PTX targets sm_50).
 *
 * The kernel is one thread that walks every row in order: a lifecycle fixture, not a fast scan.
 * Integer sums wrap in two's complement; float sums add left to right with IEEE rounding, so a
 * sequential reference on the host matches bit for bit.
 *
 * It builds without a CUDA toolkit: the few driver API types and entry points it needs are
 * declared below, libcuda.so.1 is opened with dlopen on first use (never in init, so the package
 * installs and loads on machines without a GPU), and the kernel travels as PTX text that the
 * driver compiles for the device when the module is first used on it.
 *
 * Contexts: everything runs in the primary context of the call's device, as the CUDA runtime
 * and the host's CUDA adapter do. A stream from another context is refused (the kernel's module
 * is loaded in the primary context only). The module is loaded on the first execute on a device,
 * with the thread's capture mode relaxed for the load, so that the first execute may itself be
 * inside a graph capture; shutdown unloads it and releases the contexts. libcuda itself is never
 * closed: other code in the process shares it, and the driver is not meant to be unloaded.
 */
#define _POSIX_C_SOURCE 200809L

#define SCAN_CORE_HELPERS_ONLY
#include "scan_core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CUDA_SCAN_COMPONENT "example.cuda_scan"
#define CUDA_SCAN_DRIVER "libcuda.so.1"
/* Devices this module serves; a higher ordinal is refused by validate. */
#define CUDA_SCAN_MAX_DEVICES 16

/* ------------------------------------------------------------------------------------------ */
/* The driver API subset, as cuda.h declares it (the ABI is stable across driver versions)      */
/* ------------------------------------------------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
/* CUstreamCaptureStatus and CUstreamCaptureMode values. */
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

/* Every entry point, with the symbol cuda.h maps its name to (the _v2 forms where there is one;
 * the plain stream functions, so that stream 0 is the legacy default stream, as in the host). */
typedef struct cuda_api_t {
    CUresult (*init)(unsigned int flags);
    CUresult (*device_get_count)(int* count);
    CUresult (*device_get)(CUdevice* device, int ordinal);
    CUresult (*primary_ctx_retain)(CUcontext* ctx, CUdevice device);
    CUresult (*primary_ctx_release)(CUdevice device);
    CUresult (*ctx_push)(CUcontext ctx);
    CUresult (*ctx_pop)(CUcontext* ctx);
    CUresult (*stream_get_ctx)(CUstream stream, CUcontext* ctx);
    CUresult (*stream_is_capturing)(CUstream stream, int* status);
    CUresult (*stream_synchronize)(CUstream stream);
    CUresult (*exchange_capture_mode)(int* mode);
    CUresult (*module_load_data)(CUmodule* module, const void* image);
    CUresult (*module_get_function)(CUfunction* function, CUmodule module, const char* name);
    CUresult (*module_unload)(CUmodule module);
    CUresult (*launch_kernel)(CUfunction f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                              unsigned int block_x, unsigned int block_y, unsigned int block_z,
                              unsigned int shared_bytes, CUstream stream, void** params, void** extra);
    CUresult (*get_error_name)(CUresult error, const char** name);
} cuda_api_t;

/* ------------------------------------------------------------------------------------------ */
/* The kernel                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/*
 * guild_scan(in, out, rows, n, flags): for each of `rows` rows of `n` contiguous 4-byte elements
 * (row r starts at element r * n of both tensors), out[i] = in[0] + ... + in[i] (inclusive) or
 * in[0] + ... + in[i-1] (exclusive, out[0] = 0). flags bit 0: exclusive; bit 1: i32 (else f32).
 * One thread does everything; each element is read before its output is written, so in place
 * works. Launched with one block of one thread.
 */
static const char cuda_scan_ptx[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry guild_scan(\n"
    "    .param .u64 p_in,\n"
    "    .param .u64 p_out,\n"
    "    .param .u64 p_rows,\n"
    "    .param .u64 p_n,\n"
    "    .param .u32 p_flags\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<5>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .f32 %f<4>;\n"
    "    .reg .b64 %rd<12>;\n"
    "\n"
    "    ld.param.u64 %rd1, [p_in];\n"
    "    ld.param.u64 %rd2, [p_out];\n"
    "    ld.param.u64 %rd3, [p_rows];\n"
    "    ld.param.u64 %rd4, [p_n];\n"
    "    ld.param.u32 %r1, [p_flags];\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    cvta.to.global.u64 %rd2, %rd2;\n"
    /* %rd5: total elements; %p1: exclusive; %p2: i32. */
    "    mul.lo.u64 %rd5, %rd3, %rd4;\n"
    "    and.b32 %r2, %r1, 1;\n"
    "    and.b32 %r3, %r1, 2;\n"
    "    setp.ne.u32 %p1, %r2, 0;\n"
    "    setp.ne.u32 %p2, %r3, 0;\n"
    /* %rd6: the flat index of the next element. */
    "    mov.u64 %rd6, 0;\n"
    "ROW:\n"
    "    setp.ge.u64 %p3, %rd6, %rd5;\n"
    "    @%p3 bra DONE;\n"
    /* %rd7: one past the row's last element; the accumulators restart at zero. */
    "    add.u64 %rd7, %rd6, %rd4;\n"
    "    mov.f32 %f1, 0f00000000;\n"
    "    mov.u32 %r4, 0;\n"
    "ELEM:\n"
    "    shl.b64 %rd8, %rd6, 2;\n"
    "    add.u64 %rd9, %rd1, %rd8;\n"
    "    add.u64 %rd10, %rd2, %rd8;\n"
    "    @%p2 bra INT;\n"
    "    ld.global.f32 %f2, [%rd9];\n"
    "    @%p1 st.global.f32 [%rd10], %f1;\n"
    "    add.rn.f32 %f1, %f1, %f2;\n"
    "    @!%p1 st.global.f32 [%rd10], %f1;\n"
    "    bra NEXT;\n"
    "INT:\n"
    "    ld.global.u32 %r5, [%rd9];\n"
    "    @%p1 st.global.u32 [%rd10], %r4;\n"
    "    add.u32 %r4, %r4, %r5;\n"
    "    @!%p1 st.global.u32 [%rd10], %r4;\n"
    "NEXT:\n"
    "    add.u64 %rd6, %rd6, 1;\n"
    "    setp.lt.u64 %p4, %rd6, %rd7;\n"
    "    @%p4 bra ELEM;\n"
    "    bra ROW;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

#define CUDA_SCAN_FLAG_EXCLUSIVE 1u
#define CUDA_SCAN_FLAG_I32 2u

/* ------------------------------------------------------------------------------------------ */
/* Module state                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* What one device needs: its retained primary context and the loaded kernel. */
typedef struct cuda_scan_device_t {
    int ready;
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    CUfunction kernel;
} cuda_scan_device_t;

/*
 * Process-wide state of this library instance, guarded by `lock`. The driver is opened at most
 * once (a failure is remembered with its reason); devices are set up on their first execute.
 */
static struct {
    pthread_mutex_t lock;
    int driver_tried;
    int driver_ok;
    char driver_error[256];
    cuda_api_t api;
    int device_count;
    cuda_scan_device_t devices[CUDA_SCAN_MAX_DEVICES];
} cuda_scan_state = {PTHREAD_MUTEX_INITIALIZER, 0, 0, {0}, {0}, 0, {{0}}};

/* Looks up one symbol; 0 when it is missing (the reason goes to driver_error). */
static int cuda_scan_symbol(void* lib, const char* name, void* out_fn, size_t fn_size) {
    void* sym = dlsym(lib, name);
    if (sym == NULL) {
        (void)snprintf(cuda_scan_state.driver_error, sizeof cuda_scan_state.driver_error,
                       "%s has no %s (the driver is too old)", CUDA_SCAN_DRIVER, name);
        return 0;
    }
    /* ISO C has no conversion from an object pointer to a function pointer; POSIX guarantees
     * that dlsym's result has the function's representation, so copy the bytes. */
    memcpy(out_fn, &sym, fn_size);
    return 1;
}

#define CUDA_SCAN_LOAD(lib, field, name) cuda_scan_symbol((lib), (name), &cuda_scan_state.api.field, sizeof cuda_scan_state.api.field)

/* The name of a driver result, for messages. */
static const char* cuda_scan_result_name(CUresult r) {
    const char* name = NULL;
    if (cuda_scan_state.api.get_error_name == NULL || cuda_scan_state.api.get_error_name(r, &name) != CUDA_SUCCESS ||
        name == NULL) {
        return "an unknown CUDA error";
    }
    return name;
}

/* Opens the driver once; the caller holds the lock. Returns 1 when it is usable. */
static int cuda_scan_open_driver_locked(void) {
    void* lib;
    CUresult r;
    if (cuda_scan_state.driver_tried) {
        return cuda_scan_state.driver_ok;
    }
    cuda_scan_state.driver_tried = 1;
    lib = dlopen(CUDA_SCAN_DRIVER, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char* why = dlerror();
        (void)snprintf(cuda_scan_state.driver_error, sizeof cuda_scan_state.driver_error, "%s",
                       why != NULL ? why : CUDA_SCAN_DRIVER ": cannot be opened");
        return 0;
    }
    if (!CUDA_SCAN_LOAD(lib, init, "cuInit") || !CUDA_SCAN_LOAD(lib, device_get_count, "cuDeviceGetCount") ||
        !CUDA_SCAN_LOAD(lib, device_get, "cuDeviceGet") ||
        !CUDA_SCAN_LOAD(lib, primary_ctx_retain, "cuDevicePrimaryCtxRetain") ||
        !CUDA_SCAN_LOAD(lib, primary_ctx_release, "cuDevicePrimaryCtxRelease_v2") ||
        !CUDA_SCAN_LOAD(lib, ctx_push, "cuCtxPushCurrent_v2") || !CUDA_SCAN_LOAD(lib, ctx_pop, "cuCtxPopCurrent_v2") ||
        !CUDA_SCAN_LOAD(lib, stream_get_ctx, "cuStreamGetCtx") ||
        !CUDA_SCAN_LOAD(lib, stream_is_capturing, "cuStreamIsCapturing") ||
        !CUDA_SCAN_LOAD(lib, stream_synchronize, "cuStreamSynchronize") ||
        !CUDA_SCAN_LOAD(lib, exchange_capture_mode, "cuThreadExchangeStreamCaptureMode") ||
        !CUDA_SCAN_LOAD(lib, module_load_data, "cuModuleLoadData") ||
        !CUDA_SCAN_LOAD(lib, module_get_function, "cuModuleGetFunction") ||
        !CUDA_SCAN_LOAD(lib, module_unload, "cuModuleUnload") ||
        !CUDA_SCAN_LOAD(lib, launch_kernel, "cuLaunchKernel") ||
        !CUDA_SCAN_LOAD(lib, get_error_name, "cuGetErrorName")) {
        memset(&cuda_scan_state.api, 0, sizeof cuda_scan_state.api);
        /* The handle stays open: closing the driver is never worth the risk. */
        return 0;
    }
    r = cuda_scan_state.api.init(0u);
    if (r != CUDA_SUCCESS) {
        (void)snprintf(cuda_scan_state.driver_error, sizeof cuda_scan_state.driver_error,
                       "cuInit failed with %s (%d)", cuda_scan_result_name(r), r);
        return 0;
    }
    r = cuda_scan_state.api.device_get_count(&cuda_scan_state.device_count);
    if (r != CUDA_SUCCESS) {
        (void)snprintf(cuda_scan_state.driver_error, sizeof cuda_scan_state.driver_error,
                       "cuDeviceGetCount failed with %s (%d)", cuda_scan_result_name(r), r);
        return 0;
    }
    cuda_scan_state.driver_ok = 1;
    return 1;
}

/*
 * Checks that the driver is usable and that `device_id` is one of its devices. Writes the
 * refusal to `error` and returns its status otherwise.
 */
static guild_status_t cuda_scan_check_device(int32_t device_id, const char* component, guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    int ok;
    int count;
    (void)pthread_mutex_lock(&cuda_scan_state.lock);
    ok = cuda_scan_open_driver_locked();
    count = cuda_scan_state.device_count;
    if (!ok) {
        (void)snprintf(message, sizeof message, "no usable CUDA driver: %s", cuda_scan_state.driver_error);
    }
    (void)pthread_mutex_unlock(&cuda_scan_state.lock);
    if (!ok) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, message);
    }
    if (device_id < 0 || device_id >= count || device_id >= CUDA_SCAN_MAX_DEVICES) {
        (void)snprintf(message, sizeof message, "CUDA device %d does not exist here (the driver reports %d)",
                       (int)device_id, count);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, component, message);
    }
    return GUILD_STATUS_OK;
}

/*
 * The device's context and kernel, set up on first use: retain the primary context, load the
 * PTX in it. The load is not stream work, but it is a call that a graph capture in global or
 * thread-local mode forbids on this thread, so the thread's capture mode is relaxed around it.
 */
static guild_status_t cuda_scan_device(int32_t device_id, const char* component, cuda_scan_device_t* out,
                                       guild_error_info_t* error) {
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    cuda_scan_device_t* slot;
    guild_status_t status = cuda_scan_check_device(device_id, component, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    message[0] = '\0';
    (void)pthread_mutex_lock(&cuda_scan_state.lock);
    slot = &cuda_scan_state.devices[device_id];
    if (!slot->ready) {
        const cuda_api_t* api = &cuda_scan_state.api;
        CUresult r = api->device_get(&slot->device, (int)device_id);
        if (r == CUDA_SUCCESS) {
            r = api->primary_ctx_retain(&slot->ctx, slot->device);
            if (r != CUDA_SUCCESS) {
                (void)snprintf(message, sizeof message, "cuDevicePrimaryCtxRetain failed with %s", cuda_scan_result_name(r));
            } else {
                int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
                CUcontext popped = NULL;
                r = api->ctx_push(slot->ctx);
                if (r == CUDA_SUCCESS) {
                    (void)api->exchange_capture_mode(&mode);
                    r = api->module_load_data(&slot->module, cuda_scan_ptx);
                    if (r == CUDA_SUCCESS) {
                        r = api->module_get_function(&slot->kernel, slot->module, "guild_scan");
                        if (r != CUDA_SUCCESS) {
                            (void)api->module_unload(slot->module);
                            (void)snprintf(message, sizeof message, "cuModuleGetFunction(guild_scan) failed with %s",
                                           cuda_scan_result_name(r));
                        }
                    } else {
                        (void)snprintf(message, sizeof message, "loading the scan PTX failed with %s",
                                       cuda_scan_result_name(r));
                    }
                    /* Put back the caller's mode (the exchange wrote the old one into `mode`). */
                    (void)api->exchange_capture_mode(&mode);
                    (void)api->ctx_pop(&popped);
                } else {
                    (void)snprintf(message, sizeof message, "cuCtxPushCurrent failed with %s", cuda_scan_result_name(r));
                }
                if (r != CUDA_SUCCESS) {
                    (void)api->primary_ctx_release(slot->device);
                }
            }
        } else {
            (void)snprintf(message, sizeof message, "cuDeviceGet(%d) failed with %s", (int)device_id,
                           cuda_scan_result_name(r));
        }
        if (message[0] == '\0') {
            slot->ready = 1;
        } else {
            memset(slot, 0, sizeof *slot);
        }
    }
    if (slot->ready) {
        *out = *slot;
    }
    (void)pthread_mutex_unlock(&cuda_scan_state.lock);
    if (message[0] != '\0') {
        return guild_error_info_set(error, GUILD_STATUS_ERR_DEVICE, component, message);
    }
    return GUILD_STATUS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* GOP1 callbacks                                                                               */
/* ------------------------------------------------------------------------------------------ */

#define CUDA_SCAN_OP_MAGIC 0xc5ca9c5au
#define CUDA_SCAN_DTYPES ((1u << 0) | (1u << 2)) /* f32 and i32, as scan_dtype_bit numbers them */

typedef struct cuda_scan_op_t {
    uint32_t magic;
    int exclusive;
    const char* component;
} cuda_scan_op_t;

static const cuda_scan_op_t* cuda_scan_op(void* user_data) {
    const cuda_scan_op_t* op = (const cuda_scan_op_t*)user_data;
    return op != NULL && op->magic == CUDA_SCAN_OP_MAGIC ? op : NULL;
}

/*
 * Checks one input/output pair: f32 or i32 on both sides, the same shape, contiguous, device or
 * managed memory on one device. On success writes the row length and row count.
 */
static guild_status_t cuda_scan_check_pair(const guild_tensor_desc_v1_t* in, const guild_tensor_desc_v1_t* out,
                                           uint64_t* n, uint64_t* rows, char* message, size_t message_size) {
    uint64_t in_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t out_eff[GUILD_MAX_TENSOR_RANK];
    uint64_t in_count;
    uint64_t out_count;
    char reason[160];
    uint32_t i;
    const guild_tensor_desc_v1_t* both[2];
    both[0] = in;
    both[1] = out;

    if ((scan_dtype_bit(in->dtype) & CUDA_SCAN_DTYPES) == 0u || out->dtype != in->dtype) {
        (void)snprintf(message, message_size, "dtypes %s -> %s: this scan takes f32 or i32 on both sides",
                       scan_dtype_name(in->dtype), scan_dtype_name(out->dtype));
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (out->rank != in->rank) {
        (void)snprintf(message, message_size, "output rank %u differs from input rank %u", (unsigned)out->rank,
                       (unsigned)in->rank);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (!scan_tensor_layout(in, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, in_eff, &in_count, reason, sizeof reason)) {
        (void)snprintf(message, message_size, "input: %s", reason);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    if (!scan_tensor_layout(out, 1u, (uint32_t)GUILD_MAX_TENSOR_RANK, out_eff, &out_count, reason, sizeof reason)) {
        (void)snprintf(message, message_size, "output: %s", reason);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    for (i = 0; i < in->rank; ++i) {
        if (in->dims[i] != out->dims[i]) {
            (void)snprintf(message, message_size, "output shape differs from input shape at axis %u",
                           (unsigned)i);
            return GUILD_STATUS_ERR_UNSUPPORTED;
        }
        if (i > 0u && (in_eff[i] != in_eff[i - 1u] * in->dims[i - 1u] ||
                       out_eff[i] != out_eff[i - 1u] * out->dims[i - 1u])) {
            (void)snprintf(message, message_size, "axis %u is outer-strided; this scan takes contiguous tensors only",
                           (unsigned)i);
            return GUILD_STATUS_ERR_UNSUPPORTED;
        }
    }
    for (i = 0; i < 2u; ++i) {
        if (both[i]->memory_space != GUILD_MEMORY_DEVICE && both[i]->memory_space != GUILD_MEMORY_MANAGED) {
            (void)snprintf(message, message_size, "%s is not in device or managed memory", i == 0u ? "input" : "output");
            return GUILD_STATUS_ERR_UNSUPPORTED;
        }
    }
    if (in->device_id != out->device_id) {
        (void)snprintf(message, message_size, "input is on device %d and output on device %d", (int)in->device_id,
                       (int)out->device_id);
        return GUILD_STATUS_ERR_UNSUPPORTED;
    }
    *n = in->dims[0];
    *rows = in_count / in->dims[0];
    return GUILD_STATUS_OK;
}

static guild_status_t cuda_scan_validate(void* user_data, const guild_operation_query_v1_t* query,
                                         guild_error_info_t* error) {
    const cuda_scan_op_t* op = cuda_scan_op(user_data);
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    uint64_t n;
    uint64_t rows;
    int32_t device_id;
    guild_status_t status;
    if (op == NULL || query == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, CUDA_SCAN_COMPONENT,
                                    "validate needs the scan state and a query");
    }
    if (query->input_count != 1u || query->output_count != 1u || query->inputs == NULL || query->outputs == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->component,
                                    "a scan takes exactly one input and one output");
    }
    status = cuda_scan_check_pair(&query->inputs[0], &query->outputs[0], &n, &rows, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, status, op->component, message);
    }
    device_id = query->device_caps != NULL ? query->device_caps->device_id : 0;
    if (query->inputs[0].device_id != device_id) {
        (void)snprintf(message, sizeof message, "the tensors are on device %d, the query is for device %d",
                       (int)query->inputs[0].device_id, (int)device_id);
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->component, message);
    }
    /* The one thing the contract cannot say: whether this machine can run the kernel at all. */
    return cuda_scan_check_device(device_id, op->component, error);
}

static guild_status_t cuda_scan_query_scratch(void* user_data, const guild_operation_query_v1_t* query,
                                              guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error) {
    const cuda_scan_op_t* op = cuda_scan_op(user_data);
    if (op == NULL || query == NULL || out_scratch == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, CUDA_SCAN_COMPONENT,
                                    "query_scratch needs the scan state, a query and an output record");
    }
    out_scratch->alignment = 0u;
    out_scratch->host_bytes = 0u;
    out_scratch->device_bytes = 0u;
    return GUILD_STATUS_OK;
}

static guild_status_t cuda_scan_execute(void* user_data, const guild_execute_args_v1_t* args,
                                        guild_error_info_t* error) {
    const cuda_scan_op_t* op = cuda_scan_op(user_data);
    const guild_tensor_desc_v1_t* in;
    const guild_tensor_desc_v1_t* out;
    char message[GUILD_ERROR_MESSAGE_CAPACITY];
    cuda_scan_device_t dev;
    CUstream stream;
    CUcontext popped = NULL;
    CUresult r;
    uint64_t n;
    uint64_t rows;
    CUdeviceptr in_ptr;
    CUdeviceptr out_ptr;
    unsigned int flags;
    void* params[5];
    guild_status_t status;

    memset(&dev, 0, sizeof dev);
    if (op == NULL) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, CUDA_SCAN_COMPONENT,
                                    "execute got no scan state in user_data");
    }
    if (args == NULL || args->inputs == NULL || args->outputs == NULL || args->input_count != 1u ||
        args->output_count != 1u) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component,
                                    "execute needs one input and one output");
    }
    if (args->sync_mode != GUILD_SYNC_STREAM_ORDERED && args->sync_mode != GUILD_SYNC_GRAPH_CAPTURABLE &&
        args->sync_mode != GUILD_SYNC_HOST_BLOCKING) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_UNSUPPORTED, op->component, "unknown sync mode");
    }
    in = &args->inputs[0];
    out = &args->outputs[0];
    status = cuda_scan_check_pair(in, out, &n, &rows, message, sizeof message);
    if (status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component, message);
    }
    if (in->data == NULL || out->data == NULL || !scan_aligned(in->data, scan_dtype_size(in->dtype)) ||
        !scan_aligned(out->data, scan_dtype_size(out->dtype))) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component,
                                    "tensor data must be non-NULL and aligned to the element size");
    }
    if (in->device_id != args->device_id) {
        (void)snprintf(message, sizeof message, "the tensors are on device %d, the call selected device %d",
                       (int)in->device_id, (int)args->device_id);
        return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component, message);
    }
    status = cuda_scan_device(args->device_id, op->component, &dev, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    stream = (CUstream)(void*)args->stream;
    if (stream != NULL) {
        CUcontext stream_ctx = NULL;
        r = cuda_scan_state.api.stream_get_ctx(stream, &stream_ctx);
        if (r != CUDA_SUCCESS) {
            (void)snprintf(message, sizeof message, "cuStreamGetCtx failed with %s", cuda_scan_result_name(r));
            return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component, message);
        }
        if (stream_ctx != dev.ctx) {
            (void)snprintf(message, sizeof message,
                           "the stream belongs to another context than the primary context of device %d",
                           (int)args->device_id);
            return guild_error_info_set(error, GUILD_STATUS_ERR_INVALID_ARGUMENT, op->component, message);
        }
    }
    in_ptr = (CUdeviceptr)(uintptr_t)in->data;
    out_ptr = (CUdeviceptr)(uintptr_t)out->data;
    flags = (op->exclusive ? CUDA_SCAN_FLAG_EXCLUSIVE : 0u) | (in->dtype == GUILD_DTYPE_I32 ? CUDA_SCAN_FLAG_I32 : 0u);
    params[0] = &in_ptr;
    params[1] = &out_ptr;
    params[2] = &rows;
    params[3] = &n;
    params[4] = &flags;

    r = cuda_scan_state.api.ctx_push(dev.ctx);
    if (r != CUDA_SUCCESS) {
        (void)snprintf(message, sizeof message, "cuCtxPushCurrent failed with %s", cuda_scan_result_name(r));
        return guild_error_info_set(error, GUILD_STATUS_ERR_DEVICE, op->component, message);
    }
    /* The driver copies the parameter values at the launch (and into the graph when capturing). */
    r = cuda_scan_state.api.launch_kernel(dev.kernel, 1u, 1u, 1u, 1u, 1u, 1u, 0u, stream, params, NULL);
    if (r == CUDA_SUCCESS && args->sync_mode == GUILD_SYNC_HOST_BLOCKING) {
        r = cuda_scan_state.api.stream_synchronize(stream);
        if (r != CUDA_SUCCESS) {
            (void)snprintf(message, sizeof message, "waiting for the scan failed with %s", cuda_scan_result_name(r));
        }
    } else if (r != CUDA_SUCCESS) {
        (void)snprintf(message, sizeof message, "cuLaunchKernel failed with %s", cuda_scan_result_name(r));
    }
    (void)cuda_scan_state.api.ctx_pop(&popped);
    if (r != CUDA_SUCCESS) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_DEVICE, op->component, message);
    }
    return GUILD_STATUS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Registration                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static cuda_scan_op_t cuda_scan_inclusive = {CUDA_SCAN_OP_MAGIC, 0, "example.cuda_scan.inclusive.cuda"};
static cuda_scan_op_t cuda_scan_exclusive = {CUDA_SCAN_OP_MAGIC, 1, "example.cuda_scan.exclusive.cuda"};

static guild_status_t cuda_scan_register(const guild_host_api_v1_t* host, cuda_scan_op_t* op, const char* op_name,
                                         guild_error_info_t* error) {
    guild_operation_ext_v1_t gop;
    guild_kernel_op_desc_v1_t desc;

    memset(&gop, 0, sizeof gop);
    gop.header.struct_size = (uint32_t)sizeof gop;
    gop.header.tag = GUILD_GOP1_TAG;
    gop.header.version = GUILD_GOP1_VERSION;
    gop.header.next = NULL;
    gop.op_version = GUILD_KERNEL_ABI_MAKE_VERSION(1, 0, 0);
    gop.capabilities = SCAN_CAP_IN_PLACE | SCAN_CAP_INTEGERS;
    gop.numerics = GUILD_NUMERICS_DETERMINISTIC | GUILD_NUMERICS_F32_ACCUMULATION | GUILD_NUMERICS_ORDERED_REDUCTION |
                   GUILD_NUMERICS_EXACT_INTEGER;
    gop.input_dtype = GUILD_DTYPE_ANY;
    gop.output_dtype = GUILD_DTYPE_ANY;
    gop.min_inputs = 1u;
    gop.max_inputs = 1u;
    gop.min_outputs = 1u;
    gop.max_outputs = 1u;
    gop.layouts = GUILD_LAYOUT_CONTIGUOUS;
    gop.memory_spaces = GUILD_MEMORY_DEVICE | GUILD_MEMORY_MANAGED;
    gop.min_alignment = 4u;
    gop.min_rank = 1u;
    gop.max_rank = (uint32_t)GUILD_MAX_TENSOR_RANK;
    gop.sync_modes = GUILD_SYNC_BIT(GUILD_SYNC_HOST_BLOCKING) | GUILD_SYNC_BIT(GUILD_SYNC_STREAM_ORDERED) |
                     GUILD_SYNC_BIT(GUILD_SYNC_GRAPH_CAPTURABLE);
    gop.validate = cuda_scan_validate;
    gop.query_scratch = cuda_scan_query_scratch;
    gop.execute = cuda_scan_execute;
    gop.user_data = op;

    memset(&desc, 0, sizeof desc);
    desc.struct_size = (uint32_t)sizeof desc;
    desc.abi_version = GUILD_KERNEL_ABI_VERSION;
    desc.op_kind = GUILD_OP_CUSTOM;
    desc.backend = GUILD_BACKEND_CUDA;
    desc.impl_id = op->component;
    desc.op_name = op_name;
    desc.priority = 10;
    desc.min_sm = 50u;
    desc.max_sm = 0u;
    desc.user_data = op;
    desc.next_ext = &gop.header;
    return host->register_kernel(host->host_context, &desc, error);
}

static guild_status_t cuda_scan_init(const guild_host_api_v1_t* host, void** plugin_state, guild_error_info_t* error) {
    guild_status_t status = scan_check_host(host, plugin_state, CUDA_SCAN_COMPONENT, error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    /* Nothing here touches the driver: the package must load where there is none. */
    status = cuda_scan_register(host, &cuda_scan_inclusive, "example.sequence.inclusive_scan", error);
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    return cuda_scan_register(host, &cuda_scan_exclusive, "example.sequence.exclusive_scan", error);
}

static void cuda_scan_shutdown(void* plugin_state) {
    int i;
    (void)plugin_state;
    (void)pthread_mutex_lock(&cuda_scan_state.lock);
    for (i = 0; i < CUDA_SCAN_MAX_DEVICES; ++i) {
        cuda_scan_device_t* slot = &cuda_scan_state.devices[i];
        if (slot->ready) {
            CUcontext popped = NULL;
            /* The host closes a library only after every handle into it was released and its
             * recorded work waited for, so no launch of this module is pending here. */
            if (cuda_scan_state.api.ctx_push(slot->ctx) == CUDA_SUCCESS) {
                (void)cuda_scan_state.api.module_unload(slot->module);
                (void)cuda_scan_state.api.ctx_pop(&popped);
            }
            (void)cuda_scan_state.api.primary_ctx_release(slot->device);
        }
        memset(slot, 0, sizeof *slot);
    }
    (void)pthread_mutex_unlock(&cuda_scan_state.lock);
}

static const guild_plugin_descriptor_v1_t cuda_scan_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "cuda_scan",
    "1.0.0",
    cuda_scan_init,
    cuda_scan_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &cuda_scan_descriptor;
}
