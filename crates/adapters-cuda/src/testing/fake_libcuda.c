/*
 * A fake CUDA driver (libcuda.so.1) for tests on machines without a GPU.
 *
 * It exports the driver entry points that the host's CUDA adapter and the cuda_scan test module
 * call, with the rules of the real driver that those callers depend on, and runs the kernels it
 * knows on the CPU: device "memory" is host memory, work runs at the launch (so every stream is
 * always idle), and a stream being captured collects launches into a graph that replays them.
 *
 * Rules it enforces, each a way a caller can get CUDA wrong:
 *   - calls that need a current context fail with CUDA_ERROR_INVALID_CONTEXT without one;
 *   - a launch needs the kernel's module and the stream to belong to the current context;
 *   - loading a module on a thread that is capturing a stream in global or thread-local mode
 *     fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED unless the thread relaxed its capture
 *     mode with cuThreadExchangeStreamCaptureMode;
 *   - recording an event on, synchronising, or launching a graph on a capturing stream fails.
 *
 * Kernels, found by name in the PTX text given to cuModuleLoadData:
 *   guild_scan(u64 in, u64 out, u64 rows, u64 n, u32 flags)  the cuda_scan module's kernel
 *   add_one(u64 data, u64 n)                                 data[i] += 1 for n u32 values
 *   guild_dense_project(u64 weights, u64 input, u64 bias, u64 output, u64 selection, u64 rows,
 *                       u64 outputs, u64 cols, u64 tokens, u64 weight_stride, u64 input_stride,
 *                       u64 output_stride, u32 flags)      the cuda_dense plugin's CDD1 project
 *   guild_elementwise(u64 a, u64 b, u64 out, u64 rows, u64 cols, u64 a_stride, u64 b_stride,
 *                     u64 out_stride, u32 op, f32 alpha, f32 beta)  its CDM1 elementwise
 *   guild_kv_append(21 u64: k, v, seqs, positions, k_blocks, v_blocks, tokens, heads, dim_k,
 *                   dim_v, block_size, max_blocks, block_count, then the strides)  its CDA1
 *                                                            kv_append (F32 to F16)
 *
 * Environment: FAKE_CUDA_INIT (cuInit's result, default 0), FAKE_CUDA_DEVICES (default 1),
 * FAKE_CUDA_SM (compute capability times ten, default 90), FAKE_CUDA_EVENT_SYNC (the result of
 * cuEventSynchronize, default 0), FAKE_CUDA_TRACE (print every call to stderr). At exit it
 * prints the objects still alive as one line starting "fake-cuda: alive at exit:". Compile with
 * -DFAKE_CUDA_OMIT_GRAPH_LAUNCH to leave cuGraphLaunch out (a driver too old for the host).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;

enum {
    OK = 0,
    ERR_INVALID_VALUE = 1,
    ERR_NOT_INITIALIZED = 3,
    ERR_NO_DEVICE = 100,
    ERR_INVALID_DEVICE = 101,
    ERR_INVALID_CONTEXT = 201,
    ERR_INVALID_PTX = 218,
    ERR_INVALID_HANDLE = 400,
    ERR_NOT_FOUND = 500,
    ERR_NOT_READY = 600,
    ERR_ILLEGAL_ADDRESS = 700,
    ERR_NOT_SUPPORTED = 801,
    ERR_CAPTURE_UNSUPPORTED = 900
};

enum { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 };
#define MAX_DEVICES 8
#define MAX_LAUNCHES 64

typedef struct ctx_t {
    int device;
    int retains;
} ctx_t;

typedef struct module_t module_t;

typedef struct function_t {
    module_t* module;
    int kind; /* 1 guild_scan, 2 add_one, 3 guild_dense_project, 4 guild_elementwise, 5 guild_kv_append */
} function_t;

struct module_t {
    ctx_t* ctx;
    int has_scan;
    int has_add_one;
    int has_dense_project;
    int has_elementwise;
    int has_kv_append;
    /* The module owns its functions, as in the real driver: functions[kind - 1]. */
    function_t functions[5];
};

typedef struct launch_t {
    function_t* function;
    uint64_t args[21];
    /* Threads along x (grid_x * block_x): a kernel indexed by them covers no more. */
    uint64_t threads_x;
} launch_t;

typedef struct graph_t {
    int count;
    launch_t launches[MAX_LAUNCHES];
} graph_t;

typedef struct stream_t {
    ctx_t* ctx;
    int capturing;
    int mode;
    graph_t* capture;
} stream_t;

typedef struct event_t {
    ctx_t* ctx;
} event_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static ctx_t primaries[MAX_DEVICES];
static long alive_events, alive_streams, alive_modules, alive_graphs, alive_execs, alive_allocations;

static _Thread_local ctx_t* ctx_stack[32];
static _Thread_local int ctx_depth;
static _Thread_local int capture_mode = MODE_GLOBAL;
/* Captures this thread started in global or thread-local mode and has not ended. */
static _Thread_local int strict_captures;

static int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    return v != NULL && v[0] != '\0' ? atoi(v) : fallback;
}

static void trace(const char* call) {
    if (env_int("FAKE_CUDA_TRACE", 0)) {
        fprintf(stderr, "fake-cuda: %s\n", call);
    }
}

static ctx_t* current(void) {
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

static int device_count(void) {
    int n = env_int("FAKE_CUDA_DEVICES", 1);
    return n < 0 ? 0 : (n > MAX_DEVICES ? MAX_DEVICES : n);
}

/* Each kernel's parameters: how many, and the bytes of parameter i (4: a u32 or f32, kept as its
 * bit pattern in the low half of args[i]; else a u64). */
static int param_count(int kind) {
    static const int counts[] = {0, 5, 2, 13, 11, 21};
    return counts[kind];
}

static int param_bytes(int kind, int i) {
    if ((kind == 1 && i == 4) || (kind == 3 && i == 12) || (kind == 4 && i >= 8)) {
        return 4;
    }
    return 8;
}

static float f32_param(const launch_t* l, int i) {
    uint32_t bits = (uint32_t)l->args[i];
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* F32 to IEEE binary16 bits, rounding to nearest even (as cvt.rn.f16.f32). */
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    uint32_t sign, exponent, mantissa, half, rest, mid;
    int e;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    exponent = (x >> 23) & 0xffu;
    mantissa = x & 0x7fffffu;
    if (exponent == 0xffu) {
        return (uint16_t)(sign | 0x7c00u | (mantissa != 0u ? 0x200u : 0u));
    }
    e = (int)exponent - 127 + 15;
    if (e >= 31) {
        return (uint16_t)(sign | 0x7c00u);
    }
    if (e <= 0) {
        int shift = 14 - e;
        if (e < -10) {
            return (uint16_t)sign;
        }
        mantissa |= 0x800000u;
        half = mantissa >> shift;
        rest = mantissa & ((1u << shift) - 1u);
        mid = 1u << (shift - 1);
    } else {
        half = ((uint32_t)e << 10) | (mantissa >> 13);
        rest = mantissa & 0x1fffu;
        mid = 0x1000u;
    }
    /* A carry out of the mantissa steps the exponent, up to infinity: still the right rounding. */
    if (rest > mid || (rest == mid && (half & 1u) != 0u)) {
        half++;
    }
    return (uint16_t)(sign | half);
}

/* guild_kv_append: thread (t, e) of the PTX, in order. */
static void kv_append(const launch_t* l) {
    const uint64_t* a = l->args;
    uint64_t tokens = a[6], heads = a[7], dim_k = a[8], dim_v = a[9], block_size = a[10], max_blocks = a[11];
    uint64_t block_count = a[12];
    uint64_t width = heads * (dim_k + dim_v);
    uint64_t t, e;
    for (t = 0; t < tokens; ++t) {
        int32_t seq = ((const int32_t*)(uintptr_t)a[2])[t];
        int32_t position = ((const int32_t*)(uintptr_t)a[3])[t];
        uint64_t block, slot;
        if (seq < 0 || position < 0 || (uint64_t)position / block_size >= max_blocks) {
            continue;
        }
        block = (uint64_t)seq * max_blocks + (uint64_t)position / block_size;
        slot = (uint64_t)position % block_size;
        if (block >= block_count) {
            continue;
        }
        for (e = 0; e < width; ++e) {
            int keys = e < heads * dim_k;
            uint64_t i = keys ? e : e - heads * dim_k;
            uint64_t dim = keys ? dim_k : dim_v;
            const unsigned char* src = (const unsigned char*)(uintptr_t)a[keys ? 0 : 1];
            unsigned char* dst = (unsigned char*)(uintptr_t)a[keys ? 4 : 5];
            uint64_t src_stride = a[keys ? 13 : 14], block_stride = a[keys ? 15 : 16];
            uint64_t position_stride = a[keys ? 17 : 18], head_stride = a[keys ? 19 : 20];
            float value;
            uint16_t bits;
            if (t * width + e >= l->threads_x) {
                return;
            }
            memcpy(&value, src + t * src_stride + i * 4u, sizeof value);
            bits = f32_to_f16(value);
            memcpy(dst + block * block_stride + slot * position_stride + (i / dim) * head_stride + (i % dim) * 2u, &bits,
                   sizeof bits);
        }
    }
}

/* guild_elementwise: thread (r, c) of the PTX, in order; each step rounded on its own. */
static void elementwise(const launch_t* l) {
    const unsigned char* a = (const unsigned char*)(uintptr_t)l->args[0];
    const unsigned char* b = (const unsigned char*)(uintptr_t)l->args[1];
    unsigned char* out = (unsigned char*)(uintptr_t)l->args[2];
    uint64_t rows = l->args[3], cols = l->args[4];
    uint64_t a_stride = l->args[5], b_stride = l->args[6], out_stride = l->args[7];
    unsigned op = (unsigned)l->args[8];
    float alpha = f32_param(l, 9), beta = f32_param(l, 10);
    uint64_t r, c;
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < cols; ++c) {
            float x = ((const float*)(const void*)(a + r * a_stride))[c];
            float y = b != NULL ? ((const float*)(const void*)(b + r * b_stride))[c] : 0.0f;
            volatile float t;
            volatile float z;
            if (r * cols + c >= l->threads_x) {
                return;
            }
            switch (op) {
                case 1: z = x + y; break;
                case 2: z = x * y; break;
                case 3: t = alpha * x; z = t + beta; break;
                case 10: t = alpha * y; z = x + t; break;
                default: z = x; break;
            }
            ((float*)(void*)(out + r * out_stride))[c] = z;
        }
    }
}

/* One F32 product added to a sum, each step rounded on its own (as mul.rn and add.rn: the
 * volatile keeps the compiler from contracting them into a fused multiply-add). */
static float add_product(float sum, float a, float b) {
    volatile float product = a * b;
    volatile float total = sum + product;
    return total;
}

/* guild_dense_project: thread (t, i) of the PTX, in (t, i) order (the threads are independent). */
static void dense_project(const launch_t* l) {
    const unsigned char* weights = (const unsigned char*)(uintptr_t)l->args[0];
    const unsigned char* input = (const unsigned char*)(uintptr_t)l->args[1];
    const float* bias = (const float*)(uintptr_t)l->args[2];
    unsigned char* output = (unsigned char*)(uintptr_t)l->args[3];
    const int32_t* selection = (const int32_t*)(uintptr_t)l->args[4];
    uint64_t rows = l->args[5], outputs = l->args[6], cols = l->args[7], tokens = l->args[8];
    uint64_t w_stride = l->args[9], in_stride = l->args[10], out_stride = l->args[11];
    unsigned flags = (unsigned)l->args[12];
    uint64_t t, i, c;
    for (t = 0; t < tokens; ++t) {
        const float* x = (const float*)(const void*)(input + t * in_stride);
        float* y = (float*)(void*)(output + t * out_stride);
        for (i = 0; i < outputs; ++i) {
            uint64_t row = selection != NULL ? (uint64_t)(int64_t)selection[i] : i;
            const float* w;
            volatile float sum = 0.0f;
            if (t * outputs + i >= l->threads_x) {
                return;
            }
            if (row >= rows) {
                uint32_t nan = 0x7fc00000u;
                memcpy(&y[i], &nan, sizeof nan);
                continue;
            }
            w = (const float*)(const void*)(weights + row * w_stride);
            for (c = 0; c < cols; ++c) {
                sum = add_product(sum, w[c], x[c]);
            }
            if (bias != NULL) {
                sum = sum + bias[row];
            }
            if (flags & 1u) {
                sum = y[i] + sum;
            }
            y[i] = sum;
        }
    }
}

/* The "kernels": the same arithmetic as the PTX, on host memory. */
static void run(const launch_t* l) {
    if (l->function->kind == 5) {
        kv_append(l);
    } else if (l->function->kind == 4) {
        elementwise(l);
    } else if (l->function->kind == 3) {
        dense_project(l);
    } else if (l->function->kind == 1) {
        uint64_t rows = l->args[2];
        uint64_t n = l->args[3];
        unsigned flags = (unsigned)l->args[4];
        uint64_t r;
        uint64_t i;
        for (r = 0; r < rows; ++r) {
            if (flags & 2u) {
                const uint32_t* in = (const uint32_t*)(uintptr_t)l->args[0] + r * n;
                uint32_t* out = (uint32_t*)(uintptr_t)l->args[1] + r * n;
                uint32_t acc = 0;
                for (i = 0; i < n; ++i) {
                    uint32_t v = in[i];
                    if (flags & 1u) {
                        out[i] = acc;
                        acc += v;
                    } else {
                        acc += v;
                        out[i] = acc;
                    }
                }
            } else {
                const float* in = (const float*)(uintptr_t)l->args[0] + r * n;
                float* out = (float*)(uintptr_t)l->args[1] + r * n;
                float acc = 0.0f;
                for (i = 0; i < n; ++i) {
                    float v = in[i];
                    if (flags & 1u) {
                        out[i] = acc;
                        acc += v;
                    } else {
                        acc += v;
                        out[i] = acc;
                    }
                }
            }
        }
    } else {
        uint32_t* data = (uint32_t*)(uintptr_t)l->args[0];
        uint64_t i;
        for (i = 0; i < l->args[1]; ++i) {
            data[i] += 1u;
        }
    }
}

/* ---- initialisation, errors, devices ---------------------------------------------------- */

EXPORT CUresult cuInit(unsigned flags) {
    int r = env_int("FAKE_CUDA_INIT", 0);
    (void)flags;
    trace("cuInit");
    if (r == OK) {
        initialised = 1;
    }
    return r;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
    *v = 12080;
    return OK;
}

static const char* error_name(CUresult e) {
    switch (e) {
        case OK: return "CUDA_SUCCESS";
        case ERR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
        case ERR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
        case ERR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
        case ERR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
        case ERR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
        case ERR_INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
        case ERR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
        case ERR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
        case ERR_NOT_READY: return "CUDA_ERROR_NOT_READY";
        case ERR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
        case ERR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
        case ERR_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
        default: return NULL;
    }
}

EXPORT CUresult cuGetErrorName(CUresult e, const char** out) {
    const char* name = error_name(e);
    if (name == NULL) {
        return ERR_INVALID_VALUE;
    }
    *out = name;
    return OK;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char** out) {
    if (error_name(e) == NULL) {
        return ERR_INVALID_VALUE;
    }
    *out = e == ERR_NO_DEVICE ? "no CUDA-capable device is detected" : "fake driver error";
    return OK;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
    if (!initialised) return ERR_NOT_INITIALIZED;
    *n = device_count();
    return OK;
}

EXPORT CUresult cuDeviceGet(int* d, int ordinal) {
    if (!initialised) return ERR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= device_count()) return ERR_INVALID_DEVICE;
    *d = ordinal;
    return OK;
}

EXPORT CUresult cuDeviceGetAttribute(int* v, int attribute, int d) {
    int sm = env_int("FAKE_CUDA_SM", 90);
    if (d < 0 || d >= device_count()) return ERR_INVALID_DEVICE;
    *v = attribute == 75 ? sm / 10 : (attribute == 76 ? sm % 10 : 0);
    return OK;
}

EXPORT CUresult cuDeviceGetName(char* name, int len, int d) {
    if (d < 0 || d >= device_count() || len <= 0) return ERR_INVALID_VALUE;
    (void)snprintf(name, (size_t)len, "Guild Fake GPU %d", d);
    return OK;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, int d) {
    if (d < 0 || d >= device_count()) return ERR_INVALID_DEVICE;
    *bytes = (size_t)1 << 30;
    return OK;
}

/* ---- contexts --------------------------------------------------------------------------- */

EXPORT CUresult cuDevicePrimaryCtxRetain(ctx_t** ctx, int d) {
    trace("cuDevicePrimaryCtxRetain");
    if (d < 0 || d >= device_count()) return ERR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    primaries[d].device = d;
    primaries[d].retains++;
    pthread_mutex_unlock(&lock);
    *ctx = &primaries[d];
    return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int d) {
    CUresult r = OK;
    trace("cuDevicePrimaryCtxRelease_v2");
    if (d < 0 || d >= device_count()) return ERR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    if (primaries[d].retains == 0) {
        r = ERR_INVALID_CONTEXT;
    } else {
        primaries[d].retains--;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT CUresult cuCtxSetCurrent(ctx_t* ctx) {
    if (ctx_depth == 0) {
        if (ctx != NULL) ctx_stack[ctx_depth++] = ctx;
    } else {
        ctx_stack[ctx_depth - 1] = ctx;
    }
    return OK;
}

EXPORT CUresult cuCtxPushCurrent_v2(ctx_t* ctx) {
    trace("cuCtxPushCurrent_v2");
    if (ctx == NULL || ctx_depth == 32) return ERR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return OK;
}

EXPORT CUresult cuCtxPopCurrent_v2(ctx_t** ctx) {
    trace("cuCtxPopCurrent_v2");
    if (ctx_depth == 0) return ERR_INVALID_CONTEXT;
    ctx_depth--;
    if (ctx != NULL) *ctx = ctx_stack[ctx_depth];
    return OK;
}

EXPORT CUresult cuCtxGetDevice(int* d) {
    if (current() == NULL) return ERR_INVALID_CONTEXT;
    *d = current()->device;
    return OK;
}

/* ---- streams and capture ---------------------------------------------------------------- */

EXPORT CUresult cuStreamCreate(stream_t** s, unsigned flags) {
    (void)flags;
    if (current() == NULL) return ERR_INVALID_CONTEXT;
    *s = calloc(1, sizeof **s);
    (*s)->ctx = current();
    pthread_mutex_lock(&lock);
    alive_streams++;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuStreamDestroy_v2(stream_t* s) {
    if (s == NULL) return ERR_INVALID_HANDLE;
    free(s->capture);
    free(s);
    pthread_mutex_lock(&lock);
    alive_streams--;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuStreamGetCtx(stream_t* s, ctx_t** ctx) {
    trace("cuStreamGetCtx");
    if (s == NULL) {
        if (current() == NULL) return ERR_INVALID_CONTEXT;
        *ctx = current();
    } else {
        *ctx = s->ctx;
    }
    return OK;
}

EXPORT CUresult cuStreamIsCapturing(stream_t* s, int* status) {
    trace("cuStreamIsCapturing");
    *status = s != NULL && s->capturing ? 1 : 0;
    return OK;
}

EXPORT CUresult cuStreamSynchronize(stream_t* s) {
    return s != NULL && s->capturing ? ERR_CAPTURE_UNSUPPORTED : OK;
}

EXPORT CUresult cuStreamQuery(stream_t* s) {
    return s != NULL && s->capturing ? ERR_CAPTURE_UNSUPPORTED : OK;
}

EXPORT CUresult cuStreamBeginCapture_v2(stream_t* s, int mode) {
    trace("cuStreamBeginCapture_v2");
    if (s == NULL || s->capturing) return ERR_INVALID_VALUE;
    s->capturing = 1;
    s->mode = mode;
    s->capture = calloc(1, sizeof *s->capture);
    if (mode != MODE_RELAXED) strict_captures++;
    return OK;
}

EXPORT CUresult cuStreamEndCapture(stream_t* s, graph_t** graph) {
    trace("cuStreamEndCapture");
    if (s == NULL || !s->capturing) return ERR_INVALID_VALUE;
    s->capturing = 0;
    if (s->mode != MODE_RELAXED) strict_captures--;
    *graph = s->capture;
    s->capture = NULL;
    pthread_mutex_lock(&lock);
    alive_graphs++;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
    int old = capture_mode;
    trace("cuThreadExchangeStreamCaptureMode");
    capture_mode = *mode;
    *mode = old;
    return OK;
}

/* ---- events ----------------------------------------------------------------------------- */

EXPORT CUresult cuEventCreate(event_t** e, unsigned flags) {
    (void)flags;
    trace("cuEventCreate");
    if (current() == NULL) return ERR_INVALID_CONTEXT;
    *e = calloc(1, sizeof **e);
    (*e)->ctx = current();
    pthread_mutex_lock(&lock);
    alive_events++;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuEventRecord(event_t* e, stream_t* s) {
    trace("cuEventRecord");
    if (e == NULL) return ERR_INVALID_HANDLE;
    if (s != NULL && s->capturing) return ERR_CAPTURE_UNSUPPORTED;
    if (s != NULL && s->ctx != e->ctx) return ERR_INVALID_HANDLE;
    return OK;
}

EXPORT CUresult cuEventQuery(event_t* e) {
    return e == NULL ? ERR_INVALID_HANDLE : OK;
}

EXPORT CUresult cuEventSynchronize(event_t* e) {
    trace("cuEventSynchronize");
    if (e == NULL) return ERR_INVALID_HANDLE;
    return env_int("FAKE_CUDA_EVENT_SYNC", 0);
}

EXPORT CUresult cuEventDestroy_v2(event_t* e) {
    trace("cuEventDestroy_v2");
    if (e == NULL) return ERR_INVALID_HANDLE;
    free(e);
    pthread_mutex_lock(&lock);
    alive_events--;
    pthread_mutex_unlock(&lock);
    return OK;
}

/* ---- memory ----------------------------------------------------------------------------- */

static CUresult alloc(uint64_t* p, size_t bytes) {
    void* m;
    if (current() == NULL) return ERR_INVALID_CONTEXT;
    m = calloc(1, bytes);
    if (m == NULL) return ERR_INVALID_VALUE;
    *p = (uint64_t)(uintptr_t)m;
    pthread_mutex_lock(&lock);
    alive_allocations++;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuMemAlloc_v2(uint64_t* p, size_t bytes) {
    return alloc(p, bytes);
}

EXPORT CUresult cuMemAllocManaged(uint64_t* p, size_t bytes, unsigned flags) {
    (void)flags;
    return alloc(p, bytes);
}

EXPORT CUresult cuMemFree_v2(uint64_t p) {
    free((void*)(uintptr_t)p);
    pthread_mutex_lock(&lock);
    alive_allocations--;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuMemcpyHtoD_v2(uint64_t dst, const void* src, size_t bytes) {
    if (strict_captures > 0 && capture_mode != MODE_RELAXED) return ERR_CAPTURE_UNSUPPORTED;
    memcpy((void*)(uintptr_t)dst, src, bytes);
    return OK;
}

EXPORT CUresult cuMemcpyDtoH_v2(void* dst, uint64_t src, size_t bytes) {
    if (strict_captures > 0 && capture_mode != MODE_RELAXED) return ERR_CAPTURE_UNSUPPORTED;
    memcpy(dst, (const void*)(uintptr_t)src, bytes);
    return OK;
}

/* ---- modules and launches ----------------------------------------------------------------- */

EXPORT CUresult cuModuleLoadData(module_t** m, const void* image) {
    const char* text = (const char*)image;
    trace("cuModuleLoadData");
    if (current() == NULL) return ERR_INVALID_CONTEXT;
    if (strict_captures > 0 && capture_mode != MODE_RELAXED) return ERR_CAPTURE_UNSUPPORTED;
    if (strstr(text, ".version") == NULL || strstr(text, ".target") == NULL) return ERR_INVALID_PTX;
    *m = calloc(1, sizeof **m);
    (*m)->ctx = current();
    (*m)->has_scan = strstr(text, ".entry guild_scan(") != NULL;
    (*m)->has_add_one = strstr(text, ".entry add_one(") != NULL;
    (*m)->has_dense_project = strstr(text, ".entry guild_dense_project(") != NULL;
    (*m)->has_elementwise = strstr(text, ".entry guild_elementwise(") != NULL;
    (*m)->has_kv_append = strstr(text, ".entry guild_kv_append(") != NULL;
    pthread_mutex_lock(&lock);
    alive_modules++;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuModuleGetFunction(function_t** f, module_t* m, const char* name) {
    int kind = 0;
    if (m == NULL) return ERR_INVALID_HANDLE;
    if (strcmp(name, "guild_scan") == 0 && m->has_scan) kind = 1;
    if (strcmp(name, "add_one") == 0 && m->has_add_one) kind = 2;
    if (strcmp(name, "guild_dense_project") == 0 && m->has_dense_project) kind = 3;
    if (strcmp(name, "guild_elementwise") == 0 && m->has_elementwise) kind = 4;
    if (strcmp(name, "guild_kv_append") == 0 && m->has_kv_append) kind = 5;
    if (kind == 0) return ERR_NOT_FOUND;
    m->functions[kind - 1].module = m;
    m->functions[kind - 1].kind = kind;
    *f = &m->functions[kind - 1];
    return OK;
}

EXPORT CUresult cuModuleUnload(module_t* m) {
    trace("cuModuleUnload");
    if (m == NULL) return ERR_INVALID_HANDLE;
    free(m);
    pthread_mutex_lock(&lock);
    alive_modules--;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuLaunchKernel(function_t* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, stream_t* s, void** params, void** extra) {
    launch_t l;
    int count;
    int i;
    (void)gy, (void)gz, (void)by, (void)bz, (void)shared, (void)extra;
    trace("cuLaunchKernel");
    if (f == NULL || params == NULL) return ERR_INVALID_VALUE;
    if (current() == NULL) return ERR_INVALID_CONTEXT;
    if (f->module->ctx != current()) return ERR_INVALID_HANDLE;
    if (s != NULL && s->ctx != current()) return ERR_INVALID_HANDLE;
    memset(&l, 0, sizeof l);
    l.function = f;
    l.threads_x = (uint64_t)gx * bx;
    count = param_count(f->kind);
    for (i = 0; i < count; ++i) {
        if (param_bytes(f->kind, i) == 4) {
            l.args[i] = *(const uint32_t*)params[i];
        } else {
            l.args[i] = *(const uint64_t*)params[i];
        }
    }
    if (s != NULL && s->capturing) {
        if (s->capture->count == MAX_LAUNCHES) return ERR_NOT_SUPPORTED;
        s->capture->launches[s->capture->count++] = l;
        return OK;
    }
    run(&l);
    return OK;
}

/* ---- graphs ----------------------------------------------------------------------------- */

EXPORT CUresult cuGraphInstantiateWithFlags(graph_t** exec, graph_t* graph, unsigned long long flags) {
    (void)flags;
    trace("cuGraphInstantiateWithFlags");
    if (graph == NULL) return ERR_INVALID_VALUE;
    *exec = malloc(sizeof **exec);
    **exec = *graph;
    pthread_mutex_lock(&lock);
    alive_execs++;
    pthread_mutex_unlock(&lock);
    return OK;
}

#ifndef FAKE_CUDA_OMIT_GRAPH_LAUNCH
EXPORT CUresult cuGraphLaunch(graph_t* exec, stream_t* s) {
    int i;
    trace("cuGraphLaunch");
    if (exec == NULL) return ERR_INVALID_VALUE;
    if (s != NULL && s->capturing) return ERR_CAPTURE_UNSUPPORTED;
    for (i = 0; i < exec->count; ++i) {
        run(&exec->launches[i]);
    }
    return OK;
}
#endif

EXPORT CUresult cuGraphExecDestroy(graph_t* exec) {
    trace("cuGraphExecDestroy");
    if (exec == NULL) return ERR_INVALID_VALUE;
    free(exec);
    pthread_mutex_lock(&lock);
    alive_execs--;
    pthread_mutex_unlock(&lock);
    return OK;
}

EXPORT CUresult cuGraphDestroy(graph_t* graph) {
    trace("cuGraphDestroy");
    if (graph == NULL) return ERR_INVALID_VALUE;
    free(graph);
    pthread_mutex_lock(&lock);
    alive_graphs--;
    pthread_mutex_unlock(&lock);
    return OK;
}

/* ---- the report at exit ----------------------------------------------------------------- */

__attribute__((destructor)) static void report(void) {
    int retains = 0;
    int d;
    for (d = 0; d < MAX_DEVICES; ++d) {
        retains += primaries[d].retains;
    }
    fprintf(stderr,
            "fake-cuda: alive at exit: %ld events, %ld streams, %ld modules, %ld graphs, %ld graph execs, "
            "%ld allocations, %d primary context retains\n",
            alive_events, alive_streams, alive_modules, alive_graphs, alive_execs, alive_allocations, retains);
}
