//! The checked forms of the two GOP1 calls a host makes into a provider: a negotiation query
//! (`validate`, `query_scratch`) and an `execute`. Each wraps a borrowed C struct, unchanged, so
//! that passing one on costs nothing; what it adds is the caller's word, given once in its
//! `unsafe` constructor, that every pointer inside is valid for the call. A provider, whether a
//! plugin's C callbacks or a Rust implementation of the port's provider interface, can then read
//! the arrays and strings through safe accessors, and hand the struct itself to C code.
//!
//! The tensor data and scratch pointers are not made into slices here: their extent depends on
//! the dtype, strides and memory space (device memory cannot be read from the host at all), so
//! reading them stays the provider's own `unsafe` step, under the contract the constructor
//! states.

use core::ffi::CStr;
use core::fmt;

use crate::{
    guild_device_caps_v1_t, guild_execute_args_v1_t, guild_operation_query_v1_t,
    guild_tensor_desc_v1_t, GUILD_SYNC_HOST_BLOCKING,
};

/// `count` values at `ptr`, or none when the count is zero (the pointer may then be NULL).
///
/// # Safety
/// When `count` is non-zero, `ptr` must point at `count` initialised values that stay valid and
/// unchanged for `'a`.
unsafe fn array<'a, T>(ptr: *const T, count: usize) -> &'a [T] {
    if count == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: per this function's contract.
    unsafe { core::slice::from_raw_parts(ptr, count) }
}

/// A GOP1 negotiation query whose pointers the host vouches for; see the module documentation.
#[derive(Clone, Copy)]
pub struct QueryCall<'a> {
    query: &'a guild_operation_query_v1_t,
}

impl<'a> QueryCall<'a> {
    /// Vouches for `query`.
    ///
    /// # Safety
    /// For `'a`, and unchanged: `op_name` is a NUL-terminated string; `exact_impl_id` is NULL or
    /// one; `inputs` and `outputs` point at `input_count` and `output_count` tensor descriptors
    /// (or are NULL with a count of zero); `device_caps` is NULL or a live record; `params`
    /// points at `params_size` readable bytes (or is NULL with a size of zero). Tensor data
    /// addresses are there to be inspected (alignment, placement), never dereferenced.
    pub unsafe fn new(query: &'a guild_operation_query_v1_t) -> Self {
        QueryCall { query }
    }

    /// The C query itself, for a provider that hands it to C code.
    pub fn raw(&self) -> &'a guild_operation_query_v1_t {
        self.query
    }

    /// The operation name.
    pub fn op_name(&self) -> Option<&'a CStr> {
        if self.query.op_name.is_null() {
            return None;
        }
        // SAFETY: non-NULL, and NUL-terminated for 'a per the constructor's contract.
        Some(unsafe { CStr::from_ptr(self.query.op_name) })
    }

    /// The input tensors, as the query describes them.
    pub fn inputs(&self) -> &'a [guild_tensor_desc_v1_t] {
        // SAFETY: per the constructor's contract.
        unsafe { array(self.query.inputs, self.query.input_count) }
    }

    /// The output tensors, as the query describes them.
    pub fn outputs(&self) -> &'a [guild_tensor_desc_v1_t] {
        // SAFETY: per the constructor's contract.
        unsafe { array(self.query.outputs, self.query.output_count) }
    }

    /// The caller's operation parameters (empty when there are none).
    pub fn params(&self) -> &'a [u8] {
        // SAFETY: per the constructor's contract.
        unsafe { array(self.query.params.cast::<u8>(), self.query.params_size) }
    }

    /// The device the query is for, when it names one.
    pub fn device_caps(&self) -> Option<&'a guild_device_caps_v1_t> {
        // SAFETY: NULL or a live record for 'a, per the constructor's contract.
        unsafe { self.query.device_caps.as_ref() }
    }
}

impl fmt::Debug for QueryCall<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryCall")
            .field("op_name", &self.op_name())
            .field("inputs", &self.query.input_count)
            .field("outputs", &self.query.output_count)
            .field("params_size", &self.query.params_size)
            .finish_non_exhaustive()
    }
}

/// An `execute` call whose pointers the host vouches for, and which it has checked against the
/// negotiated contract; see the module documentation.
#[derive(Clone, Copy)]
pub struct ExecuteCall<'a> {
    args: &'a guild_execute_args_v1_t,
}

impl<'a> ExecuteCall<'a> {
    /// Vouches for `args`.
    ///
    /// # Safety
    /// For `'a`, and unchanged but for what the provider writes: `inputs` and `outputs` point
    /// at `input_count` and `output_count` tensor descriptors (or are NULL with a count of
    /// zero) that match the contract negotiated with the provider receiving the call; every
    /// descriptor's `data` addresses live memory of the extent it describes, in the memory
    /// space it names, writable for outputs; the scratch buffers are NULL or live, writable
    /// memory of their stated sizes; `stream` and `device_id` are what the sync mode requires;
    /// `params` points at `params_size` readable bytes (or is NULL with a size of zero). The
    /// provider is the only one writing the outputs and scratch during the call.
    pub unsafe fn new(args: &'a guild_execute_args_v1_t) -> Self {
        ExecuteCall { args }
    }

    /// The C arguments themselves, which a C provider is given as they are.
    #[inline]
    pub fn raw(&self) -> &'a guild_execute_args_v1_t {
        self.args
    }

    /// The input tensors.
    pub fn inputs(&self) -> &'a [guild_tensor_desc_v1_t] {
        // SAFETY: per the constructor's contract.
        unsafe { array(self.args.inputs, self.args.input_count) }
    }

    /// The output tensors (the descriptors; their data is the provider's to write).
    pub fn outputs(&self) -> &'a [guild_tensor_desc_v1_t] {
        // SAFETY: per the constructor's contract.
        unsafe { array(self.args.outputs, self.args.output_count) }
    }

    /// The caller's operation parameters (empty when there are none).
    pub fn params(&self) -> &'a [u8] {
        // SAFETY: per the constructor's contract.
        unsafe { array(self.args.params.cast::<u8>(), self.args.params_size) }
    }
}

impl fmt::Debug for ExecuteCall<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecuteCall")
            .field("inputs", &self.args.input_count)
            .field("outputs", &self.args.output_count)
            .field("sync_mode", &self.args.sync_mode)
            .field("device_id", &self.args.device_id)
            .finish_non_exhaustive()
    }
}

impl guild_execute_args_v1_t {
    /// The record of a host-blocking call on device 0 over `inputs`, `outputs` and `params`,
    /// with no scratch and no stream. An empty array or record is NULL with a count of 0, as
    /// module_abi.h writes it. The record borrows the slices' addresses: it is valid for a call
    /// only while they live.
    pub fn host_blocking(
        inputs: &[guild_tensor_desc_v1_t],
        outputs: &[guild_tensor_desc_v1_t],
        params: &[u8],
    ) -> Self {
        fn or_null<T>(items: &[T]) -> *const T {
            if items.is_empty() {
                core::ptr::null()
            } else {
                items.as_ptr()
            }
        }
        guild_execute_args_v1_t {
            struct_size: size_of::<guild_execute_args_v1_t>() as u32,
            reserved: 0,
            inputs: or_null(inputs),
            input_count: inputs.len(),
            outputs: or_null(outputs),
            output_count: outputs.len(),
            scratch_host: core::ptr::null_mut(),
            scratch_host_size: 0,
            scratch_device: core::ptr::null_mut(),
            scratch_device_size: 0,
            stream: core::ptr::null_mut(),
            device_id: 0,
            sync_mode: GUILD_SYNC_HOST_BLOCKING,
            params: or_null(params).cast(),
            params_size: params.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use core::ptr;

    use super::*;
    use crate::GUILD_MEMORY_HOST;

    fn tensor(n: u64) -> guild_tensor_desc_v1_t {
        let mut dims = [0; 8];
        dims[0] = n;
        guild_tensor_desc_v1_t {
            dtype: 0,
            rank: 1,
            dims,
            strides: [0; 8],
            memory_space: GUILD_MEMORY_HOST,
            device_id: 0,
            data: ptr::null_mut(),
        }
    }

    #[test]
    fn an_execute_call_reads_the_callers_arrays_in_place() {
        let (inputs, outputs, params) = ([tensor(3), tensor(4)], [tensor(5)], [7u8, 8]);
        let a = guild_execute_args_v1_t::host_blocking(&inputs, &outputs, &params);
        // SAFETY: every pointer in `a` leads into the locals above, which outlive the call.
        let call = unsafe { ExecuteCall::new(&a) };
        assert!(ptr::eq(call.raw(), &a));
        assert!(ptr::eq(call.inputs().as_ptr(), inputs.as_ptr()), "no copy");
        assert_eq!(call.inputs()[1].dims[0], 4);
        assert_eq!(call.outputs()[0].dims[0], 5);
        assert_eq!(call.params(), &[7, 8]);

        // NULL arrays with a count of zero read as empty.
        let a = guild_execute_args_v1_t::host_blocking(&[], &outputs, &[]);
        assert!(
            a.inputs.is_null() && a.params.is_null() && a.sync_mode == GUILD_SYNC_HOST_BLOCKING
        );
        // SAFETY: as above; the NULL pointers come with counts of zero.
        let call = unsafe { ExecuteCall::new(&a) };
        assert!(call.inputs().is_empty() && call.params().is_empty());
    }
}
