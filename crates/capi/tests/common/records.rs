//! The C records a caller of the operation service fills in for the scan (f32 vectors, host
//! memory, host-blocking, CPU, any 1.x version), shared by the tests and the benchmark.

use std::ffi::{c_char, c_void};
use std::ptr;

use guild_host::abi::*;

/// A rank-1 f32 tensor of `n` elements in host memory at `data` (NULL in queries).
pub fn vector(n: u64, data: *mut f32) -> guild_tensor_desc_v1_t {
    let mut t = guild_tensor_desc_v1_t {
        dtype: GUILD_DTYPE_F32,
        rank: 1,
        dims: [0; GUILD_MAX_TENSOR_RANK],
        strides: [0; GUILD_MAX_TENSOR_RANK],
        memory_space: GUILD_MEMORY_HOST,
        device_id: 0,
        data: data.cast::<c_void>(),
    };
    t.dims[0] = n;
    t
}

/// A CPU, host-blocking query for `op` (any 1.x version) over one input and one output.
pub fn query(
    op: *const c_char,
    input: &guild_tensor_desc_v1_t,
    output: &guild_tensor_desc_v1_t,
) -> guild_operation_query_v1_t {
    guild_operation_query_v1_t {
        struct_size: size_of::<guild_operation_query_v1_t>() as u32,
        version: GUILD_OPERATION_QUERY_VERSION,
        op_name: op,
        min_op_version: 0x0100_0000,
        max_op_version: 0x01ff_ffff,
        backends: GUILD_BACKEND_CPU,
        sync_mode: GUILD_SYNC_HOST_BLOCKING,
        required_capabilities: 0,
        required_numerics: 0,
        inputs: input,
        input_count: 1,
        outputs: output,
        output_count: 1,
        ram_budget: GUILD_BUDGET_UNLIMITED,
        vram_budget: GUILD_BUDGET_UNLIMITED,
        exact_impl_id: ptr::null(),
        device_caps: ptr::null(),
        params: ptr::null(),
        params_size: 0,
    }
}

/// Host-blocking execute arguments over one input and one output, without scratch.
pub fn execute_args(
    input: &guild_tensor_desc_v1_t,
    output: &guild_tensor_desc_v1_t,
) -> guild_execute_args_v1_t {
    guild_execute_args_v1_t::host_blocking(
        std::slice::from_ref(input),
        std::slice::from_ref(output),
        &[],
    )
}
