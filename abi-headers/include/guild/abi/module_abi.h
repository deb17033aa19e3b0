/*
 * Guild runtime modules and namespaced operations (SDK 1.5, module ABI 1).
 *
 * A runtime module is an ordinary Kernel ABI v1 plugin whose kernels use op_kind GUILD_OP_CUSTOM,
 * a namespaced op_name and a GOP1 extension (guild_operation_ext_v1_t) on next_ext. Runners and
 * other modules reach those operations through the operation service
 * (guild_operation_service_v1_t), which the host offers as the optional tail of
 * guild_host_api_v1_t: resolve a query to a handle, describe it, ask its scratch needs, execute
 * it, release it.
 *
 * Everything here is C99 and C++17 clean and follows the conventions in abi-headers/README.md.
 * No layout in kernel_abi.h changes and the Kernel ABI stays 1.0.0.
 */
#ifndef GUILD_ABI_MODULE_ABI_H
#define GUILD_ABI_MODULE_ABI_H

#include "guild/abi/kernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Identity                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/*
 * op_kind of every namespaced operation. It lies above all legacy GUILD_OP_* numbers; the
 * operation is identified by the descriptor's op_name, not by a number.
 */
#define GUILD_OP_CUSTOM 0x00010000u

/* The module ABI a .gkmodule manifest declares ("module_abi": 1) and its dependency tag. */
#define GUILD_MODULE_ABI_VERSION 1u
#define GUILD_MODULE_ABI_TAG_V1 "guild.module.v1"

/* GOP1: the operation-contract extension of a GUILD_OP_CUSTOM kernel descriptor. */
#define GUILD_GOP1_TAG GUILD_MAKE_TAG('G', 'O', 'P', '1')
#define GUILD_GOP1_VERSION 1u

/* ------------------------------------------------------------------------------------------ */
/* Contract vocabulary                                                                         */
/* ------------------------------------------------------------------------------------------ */

/*
 * Layout bits (uint32_t). A tensor is contiguous when every outer stride is 0 (packed) or equal to
 * its packed extent; any other outer stride makes it outer-strided. A GOP1 contract lists the
 * layouts it accepts.
 */
#define GUILD_LAYOUT_CONTIGUOUS (1u << 0)
#define GUILD_LAYOUT_OUTER_STRIDED (1u << 1)

/* Memory spaces (uint32_t bits). A tensor names exactly one; a GOP1 contract names a set. */
#define GUILD_MEMORY_HOST (1u << 0)
#define GUILD_MEMORY_HOST_PINNED (1u << 1)
#define GUILD_MEMORY_DEVICE (1u << 2)
#define GUILD_MEMORY_MANAGED (1u << 3)

/*
 * Sync modes (uint32_t values). A query and an execute call name one mode; a GOP1 contract lists
 * the modes it supports as GUILD_SYNC_BIT(mode) bits. These are not the legacy
 * GUILD_LEGACY_SYNC_* mask of kernel_abi.h.
 */
/* The call returns when the results are in place. CPU execution is always host-blocking. */
#define GUILD_SYNC_HOST_BLOCKING 0u
/* The work is enqueued on the supplied stream; the call returns without waiting. */
#define GUILD_SYNC_STREAM_ORDERED 1u
/* Stream-ordered and safe to record into a GPU graph: no allocation, no host synchronisation. */
#define GUILD_SYNC_GRAPH_CAPTURABLE 2u
#define GUILD_SYNC_BIT(mode) ((uint32_t)1u << (mode))

/* A RAM or VRAM budget (uint64_t bytes) that bounds nothing. */
#define GUILD_BUDGET_UNLIMITED UINT64_MAX

/*
 * Numerical guarantees (uint64_t bits of guild_operation_ext_v1_t.numerics). Bits 0-31 mean the
 * same for every operation, as below; bits 32-63 are defined by each operation's own contract.
 */
/* The same inputs on the same device give bit-identical outputs on every run. */
#define GUILD_NUMERICS_DETERMINISTIC ((uint64_t)1 << 0)
/* Floating-point sums and products accumulate in at least IEEE binary32. */
#define GUILD_NUMERICS_F32_ACCUMULATION ((uint64_t)1 << 1)
/* Reductions run in index order, matching a sequential reference bit for bit. */
#define GUILD_NUMERICS_ORDERED_REDUCTION ((uint64_t)1 << 2)
/* Integer results are exact (no saturation or wrap-around within the documented range). */
#define GUILD_NUMERICS_EXACT_INTEGER ((uint64_t)1 << 3)

/* Versions of the caller-built records the service reads. */
#define GUILD_OPERATION_QUERY_VERSION 1u
#define GUILD_OPERATION_SERVICE_VERSION 1u

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * One tensor as an operation sees it. Arrays of these are passed as (pointer, count) pairs, so the
 * layout has no struct_size and is frozen.
 *
 * dims[0] is the innermost, contiguous axis; for a quantized dtype it is a multiple of the block
 * size and is walked block by block. strides[0] must be 0. For 1 <= i < rank, strides[i] is the
 * distance in elements (in blocks for quantized dtypes) between consecutive indices of axis i;
 * 0 means packed, the product of the extents inside it. A non-zero stride is at least that packed
 * extent, so axes never overlap. Entries at and above rank are 0.
 */
typedef struct guild_tensor_desc_v1_t {
    /* GUILD_DTYPE_* (never GUILD_DTYPE_ANY). */
    uint32_t dtype;
    /* Number of axes, 1..GUILD_MAX_TENSOR_RANK. */
    uint32_t rank;
    /* Extent of each axis in elements; dims[0] innermost. */
    uint64_t dims[GUILD_MAX_TENSOR_RANK];
    /* Outer strides in elements (blocks); 0 = packed; strides[0] is 0. */
    uint64_t strides[GUILD_MAX_TENSOR_RANK];
    /* Exactly one GUILD_MEMORY_* bit: where data lives. */
    uint32_t memory_space;
    /* Device that owns data for GUILD_MEMORY_DEVICE/MANAGED; 0 for host memory. */
    int32_t device_id;
    /* First element. Owned by the caller. May be NULL in a resolve query; when set there, only
     * its address is used (against the contract's min_alignment), never the data. */
    void* data;
} guild_tensor_desc_v1_t;

GUILD_STATIC_ASSERT(offsetof(guild_tensor_desc_v1_t, strides) == 72, "guild_tensor_desc_v1_t layout is frozen");
GUILD_STATIC_ASSERT(offsetof(guild_tensor_desc_v1_t, data) == 144, "guild_tensor_desc_v1_t layout is frozen");

/* ------------------------------------------------------------------------------------------ */
/* Scratch, queries and execution                                                             */
/* ------------------------------------------------------------------------------------------ */

/*
 * Scratch memory an operation needs for one call. The caller allocates it and keeps ownership;
 * providers never allocate or free scratch themselves.
 */
typedef struct guild_scratch_request_v1_t {
    /* sizeof(guild_scratch_request_v1_t), set by whoever provides the record to be filled. */
    uint32_t struct_size;
    /* Required alignment of both buffers in bytes, a power of two; 0 or 1 = none. */
    uint32_t alignment;
    /* Host scratch bytes; counted against the query's RAM budget. */
    uint64_t host_bytes;
    /* Device scratch bytes; counted against the query's VRAM budget. */
    uint64_t device_bytes;
} guild_scratch_request_v1_t;

GUILD_STATIC_ASSERT(sizeof(guild_scratch_request_v1_t) == 24, "guild_scratch_request_v1_t layout is frozen");

/*
 * What a caller asks the service for. Built by the caller and borrowed by resolve for the call;
 * resolve copies the tensor descriptors it keeps. Candidates are the registered GUILD_OP_CUSTOM
 * kernels named op_name whose GOP1 contract admits every field below.
 */
typedef struct guild_operation_query_v1_t {
    /* sizeof(guild_operation_query_v1_t). */
    uint32_t struct_size;
    /* GUILD_OPERATION_QUERY_VERSION. */
    uint32_t version;
    /* Namespaced operation name, e.g. "example.sequence.prefix_sum". Required. */
    const char* op_name;
    /* Inclusive interval of acceptable operation versions (packed); both the same major. */
    uint32_t min_op_version;
    uint32_t max_op_version;
    /* GUILD_BACKEND_* bits the caller accepts. */
    uint32_t backends;
    /* The one GUILD_SYNC_* mode the caller will execute in. */
    uint32_t sync_mode;
    /* Capability bits the provider must all declare (meanings defined by the operation). */
    uint64_t required_capabilities;
    /* GUILD_NUMERICS_* bits the provider must all declare. */
    uint64_t required_numerics;
    /* The concrete input tensors (shapes, dtypes, memory spaces; data may be NULL). */
    const guild_tensor_desc_v1_t* inputs;
    size_t input_count;
    /* The concrete output tensors. */
    const guild_tensor_desc_v1_t* outputs;
    size_t output_count;
    /* Upper bounds on host and device scratch bytes; GUILD_BUDGET_UNLIMITED for none. */
    uint64_t ram_budget;
    uint64_t vram_budget;
    /* NULL to let the service choose, or the one impl_id to accept (no fallback). */
    const char* exact_impl_id;
    /* The device to resolve for, or NULL for the host's own record of the default device
     * (device 0) of each permitted backend. Its next_ext must be NULL. */
    const guild_device_caps_v1_t* device_caps;
    /* Operation parameters, a POD whose layout the operation's contract defines for the
     * negotiated version (conventionally starting with a uint32_t struct_size); NULL/0 for none
     * (NULL with a nonzero size is refused).
     * Borrowed for the call only: a provider copies what it needs later. Aligned to at least
     * 8 bytes: the service refuses a record that is not (GUILD_STATUS_ERR_INVALID_ARGUMENT
     * naming it), so a provider may read it as its C struct. At most 1 MiB. */
    const void* params;
    size_t params_size;
} guild_operation_query_v1_t;

/*
 * One execution. Built by the caller and borrowed for the call. The tensors must have exactly
 * the shapes, dtypes, layouts and memory spaces that were resolved; only data pointers change.
 * Every buffer stays owned by the caller and must stay alive until the work has completed (for
 * stream-ordered work, until the handle is released or the stream synchronised).
 */
typedef struct guild_execute_args_v1_t {
    /* sizeof(guild_execute_args_v1_t). */
    uint32_t struct_size;
    /* Must be zero. */
    uint32_t reserved;
    /* Input tensors with their data pointers. */
    const guild_tensor_desc_v1_t* inputs;
    size_t input_count;
    /* Output tensors with their data pointers. */
    const guild_tensor_desc_v1_t* outputs;
    size_t output_count;
    /* Host scratch of at least the requested host_bytes, suitably aligned; NULL when 0. */
    void* scratch_host;
    uint64_t scratch_host_size;
    /* Device scratch of at least the requested device_bytes, suitably aligned; NULL when 0. */
    void* scratch_device;
    uint64_t scratch_device_size;
    /* Stream to enqueue GPU work on; NULL for the default stream and for CPU work. */
    guild_stream_t stream;
    /* The device the caller has made current; it must match the tensors' device. */
    int32_t device_id;
    /* The GUILD_SYNC_* mode; must equal the resolved query's mode. */
    uint32_t sync_mode;
    /* Operation parameters as in the query (aligned to at least 8 bytes, refused otherwise);
     * borrowed for the call. */
    const void* params;
    size_t params_size;
} guild_execute_args_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* GOP1: the operation contract                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * The contract of one GUILD_OP_CUSTOM implementation, attached to its kernel descriptor through
 * next_ext. The host copies it at registration. The host refuses every query outside what the
 * declarative fields below admit (tensor counts, rank, dtypes, layouts, memory spaces, the
 * alignment of a known data address, and the kernel descriptor's max_dim and max_batch) before
 * it calls validate, at resolve and at reshape alike, so validate only checks what the fields
 * cannot express and may rely on them (index the declared counts, assume the declared ranks).
 * `guild check` holds a module to this same rule.
 */
typedef struct guild_operation_ext_v1_t {
    /* struct_size, GUILD_GOP1_TAG, GUILD_GOP1_VERSION. */
    guild_ext_header_t header;
    /* Semantic version of the operation this implements (packed), independent of the package. */
    uint32_t op_version;
    /* Must be zero. */
    uint32_t reserved;
    /* Operation-defined capability bits this implementation offers. */
    uint64_t capabilities;
    /* GUILD_NUMERICS_* and operation-defined numerical guarantees. */
    uint64_t numerics;
    /* dtype every input (output) tensor must have, or GUILD_DTYPE_ANY to leave it to validate. */
    uint32_t input_dtype;
    uint32_t output_dtype;
    /* Inclusive bounds on the number of input and output tensors. */
    uint32_t min_inputs;
    uint32_t max_inputs;
    uint32_t min_outputs;
    uint32_t max_outputs;
    /* GUILD_LAYOUT_* bits accepted for every tensor. */
    uint32_t layouts;
    /* GUILD_MEMORY_* bits accepted for every tensor. */
    uint32_t memory_spaces;
    /* Minimum alignment in bytes of every tensor's data (a power of two); 0 or 1 = none. */
    uint32_t min_alignment;
    /* Inclusive rank bounds of every tensor, within 1..GUILD_MAX_TENSOR_RANK. */
    uint32_t min_rank;
    uint32_t max_rank;
    /* GUILD_SYNC_BIT(mode) bits of the supported sync modes. */
    uint32_t sync_modes;
    /*
     * Pure negotiation: accept (OK) or reject (ERR_UNSUPPORTED/ERR_INVALID_ARGUMENT with a reason)
     * the query's tensors and params; only queries within the declaration above are asked. No
     * allocation, launches, registry calls or retained
     * pointers; may run under the registry lock. Required.
     */
    guild_status_t (*validate)(void* user_data, const guild_operation_query_v1_t* query, guild_error_info_t* error);
    /* Pure negotiation: write the scratch a validated query needs to *out_scratch. Same rules as
     * validate. Required. */
    guild_status_t (*query_scratch)(void* user_data, const guild_operation_query_v1_t* query,
                                    guild_scratch_request_v1_t* out_scratch, guild_error_info_t* error);
    /* Run the operation. The host has already checked args against the resolved contract.
     * Host-blocking on the CPU; GPU work goes on args->stream. Required. */
    guild_status_t (*execute)(void* user_data, const guild_execute_args_v1_t* args, guild_error_info_t* error);
    /* Passed to the three callbacks; owned by the plugin. */
    void* user_data;
} guild_operation_ext_v1_t;

/* ------------------------------------------------------------------------------------------ */
/* The operation service                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* A resolved operation: owns a binding to one implementation and keeps its package loaded. */
typedef struct guild_op_handle_s guild_op_handle_t;

/*
 * What describe reports about a handle. Every pointer is borrowed from the handle and stays valid
 * until release.
 *
 * Grown by appending: a caller built against an older header sets a smaller struct_size (at
 * least GUILD_OP_DESCRIPTION_V1_BASE_SIZE), and the host writes only the fields that fit in it.
 */
typedef struct guild_op_description_v1_t {
    /* sizeof(guild_op_description_v1_t), set by the caller. */
    uint32_t struct_size;
    /* The negotiated operation version (packed): the chosen implementation's op_version. */
    uint32_t op_version;
    /* The chosen implementation and the package that provides it. */
    const char* impl_id;
    const char* package_id;
    /* The operation name. */
    const char* op_name;
    /* The chosen implementation's GUILD_BACKEND_* bit. */
    uint32_t backend;
    /* The GUILD_SYNC_* mode the handle executes in. */
    uint32_t sync_mode;
    /* The scratch each execute needs. */
    guild_scratch_request_v1_t scratch;
    /* The host's copies of the implementation's kernel descriptor and GOP1 extension. */
    const guild_kernel_op_desc_v1_t* kernel_desc;
    const guild_operation_ext_v1_t* operation;
    /*
     * Optional tail, written only when struct_size >= GUILD_OP_DESCRIPTION_V1_VERSION_SIZE (SDK
     * 1.5 hosts leave it untouched): the semantic version of package_id that provides the
     * implementation, such as "1.2.0". A handle keeps running that version until it is released,
     * whatever the store enables later.
     */
    const char* package_version;
} guild_op_description_v1_t;

/* Size of the description before the package_version tail: the smallest struct_size accepted. */
#define GUILD_OP_DESCRIPTION_V1_BASE_SIZE offsetof(guild_op_description_v1_t, package_version)

/* The smallest struct_size of a description whose package_version the host writes. */
#define GUILD_OP_DESCRIPTION_V1_VERSION_SIZE (GUILD_OP_DESCRIPTION_V1_BASE_SIZE + sizeof(const char*))

/*
 * New tensors for a resolved handle, for the service's reshape. The arrays and params are
 * borrowed for the call; each descriptor's data may be NULL (a known address is passed on to
 * validate for inspection, as in a query).
 */
typedef struct guild_reshape_args_v1_t {
    /* sizeof(guild_reshape_args_v1_t), set by the caller. */
    uint32_t struct_size;
    /* Zero. */
    uint32_t reserved;
    /* The handle's inputs and outputs with their new shapes, as many as the handle has. */
    const guild_tensor_desc_v1_t* inputs;
    size_t input_count;
    const guild_tensor_desc_v1_t* outputs;
    size_t output_count;
    /* The operation's parameter record for validate and query_scratch, or NULL with size 0;
     * aligned to at least 8 bytes, as in a query. */
    const void* params;
    size_t params_size;
} guild_reshape_args_v1_t;

/*
 * The operation service. Reached through guild_host_api_v1_t.operations (check the host table's
 * struct_size first, then this table's struct_size and version) and copied during init; the
 * copy stays callable, and `user` valid, for as long as the plugin's library is loaded: once the
 * host's registry is destroyed every call answers GUILD_STATUS_ERR_STATE. Pass `user` as the
 * first argument of every call.
 *
 * A handle is an opaque number, not a pointer: a released, foreign or made-up handle is refused
 * with GUILD_STATUS_ERR_INVALID_ARGUMENT. One handle serialises its own execute calls; different
 * handles may be used from different threads at once. Through the table a plugin finds in its
 * host table, an execute on a handle that another call is executing never waits: it is refused
 * with GUILD_STATUS_ERR_BUSY (retry, or serialise your own threads), so that providers calling
 * each other's handles cannot deadlock. A runner's own table waits its turn instead. A release
 * while another call is using the handle is refused with GUILD_STATUS_ERR_BUSY and releases
 * nothing. Release every handle before shutdown returns. An execute callback may resolve and
 * execute other operations through the service; a call back into the handle that is executing
 * is refused with GUILD_STATUS_ERR_BUSY.
 */
typedef struct guild_operation_service_v1_t {
    /* sizeof(guild_operation_service_v1_t) as the host knows it. */
    uint32_t struct_size;
    /* GUILD_OPERATION_SERVICE_VERSION. */
    uint32_t version;
    /* The registry's context. */
    void* user;
    /*
     * Picks the best compatible implementation for *query (highest priority, then smallest
     * impl_id) and writes a new handle to *out_handle. Fails with ERR_NOT_FOUND when no candidate
     * is compatible (error says why the best one was rejected), ERR_OUT_OF_MEMORY when the
     * budgets cannot be met.
     */
    guild_status_t (*resolve)(void* user, const guild_operation_query_v1_t* query, guild_op_handle_t** out_handle,
                              guild_error_info_t* error);
    /* Fills *out_description (whose struct_size the caller set). */
    guild_status_t (*describe)(void* user, guild_op_handle_t* handle, guild_op_description_v1_t* out_description,
                               guild_error_info_t* error);
    /* Writes the scratch each execute on this handle needs. */
    guild_status_t (*scratch)(void* user, guild_op_handle_t* handle, guild_scratch_request_v1_t* out_scratch,
                              guild_error_info_t* error);
    /* Checks *args against the resolved contract and runs the chosen implementation. Never
     * re-selects or falls back to another implementation. */
    guild_status_t (*execute)(void* user, guild_op_handle_t* handle, const guild_execute_args_v1_t* args,
                              guild_error_info_t* error);
    /*
     * Waits for stream work recorded on the handle, then drops it. The handle is gone after the
     * call whatever the status (a non-OK status reports a device error seen while waiting),
     * except GUILD_STATUS_ERR_BUSY: another call was still using the handle (for instance the
     * provider's own execute calling back), and nothing was released, and
     * GUILD_STATUS_ERR_INVALID_ARGUMENT: the handle was not live (already released, or never
     * issued by this service), and nothing was touched. NULL is a no-op returning OK.
     */
    guild_status_t (*release)(void* user, guild_op_handle_t* handle, guild_error_info_t* error);
    /*
     * Optional tail: read it only when struct_size >= GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE
     * (older hosts report GUILD_OPERATION_SERVICE_V1_BASE_SIZE and have no reshape).
     *
     * Negotiates new tensors for the handle with the implementation it already has: the
     * candidate's declared contract, its validate and query_scratch (with args->params) and the
     * resolution's budgets, exactly as resolve checks them, but no other implementation is asked
     * or ranked. Only rank, dims and strides may change: the counts, dtypes, memory spaces and
     * devices stay the resolution's (a change is GUILD_STATUS_ERR_INVALID_ARGUMENT). On OK every
     * later execute must pass the new descriptors (the old ones are refused) and scratch reports
     * what they need. On failure nothing changed and the handle still executes with its old
     * shapes: GUILD_STATUS_ERR_UNSUPPORTED or the implementation's own status when it refuses,
     * GUILD_STATUS_ERR_OUT_OF_MEMORY when the scratch exceeds a budget.
     *
     * A reshape excludes execute on the same handle, as two executes exclude each other: through
     * a runner's table it waits for a running execute to finish; through a plugin's table it is
     * refused with GUILD_STATUS_ERR_BUSY, as is a reshape from inside the handle's own execute.
     * describe and scratch may run beside it and see the old or the new scratch, never a mix.
     */
    guild_status_t (*reshape)(void* user, guild_op_handle_t* handle, const guild_reshape_args_v1_t* args,
                              guild_error_info_t* error);
} guild_operation_service_v1_t;

/* Size of the service table before the optional reshape tail: what hosts without reshape report. */
#define GUILD_OPERATION_SERVICE_V1_BASE_SIZE offsetof(guild_operation_service_v1_t, reshape)

/* The smallest struct_size of a table whose reshape entry may be read. */
#define GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE (GUILD_OPERATION_SERVICE_V1_BASE_SIZE + sizeof(void*))

/* ------------------------------------------------------------------------------------------ */
/* Module dependencies                                                                         */
/* ------------------------------------------------------------------------------------------ */

/*
 * One runtime module dependency, the C form of a manifest "module_dependencies" entry. All
 * strings are UTF-8, borrowed from whoever built the record, and NULL where marked optional.
 */
typedef struct guild_module_dependency_v1_t {
    /* Package id of the required module. */
    const char* module_id;
    /* Inclusive semantic-version bounds; max_version NULL = no upper bound. */
    const char* min_version;
    const char* max_version;
    /* GUILD_MODULE_ABI_TAG_V1 for a runtime dependency. */
    const char* abi_tag;
    /* Required publisher id, or NULL. */
    const char* publisher_id;
    /* 64 lowercase hex digits of the dependency's canonical manifest payload, or NULL. */
    const char* sha256;
} guild_module_dependency_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* GUILD_ABI_MODULE_ABI_H */
