//! The tiny Llama's decode loop run on a module's C `execute` called directly, for the decode
//! benchmarks' baseline: [`Direct`] implements the example's `Ops` with the function pointer
//! and `user_data` bound from the GOP1 descriptor of the implementation the C service resolved,
//! so the comparison with the service runs the same code. Each benchmark that uses it includes
//! the example's `src/lib.rs` as `mod decode` at its root and this file with
//! `#[path = "common/direct_ops.rs"] mod direct_ops;`.

use std::cell::{Cell, RefCell};
use std::ffi::{c_void, CStr, CString};
use std::ptr;

use guild_abi::{
    guild_error_info_t, guild_execute_args_v1_t, guild_op_description_v1_t, guild_op_handle_t,
    guild_operation_query_v1_t, guild_operation_service_v1_t, guild_status_t,
    guild_tensor_desc_v1_t, GUILD_BACKEND_CPU, GUILD_BUDGET_UNLIMITED,
    GUILD_OPERATION_QUERY_VERSION, GUILD_STATUS_OK, GUILD_SYNC_HOST_BLOCKING,
};
use guild_domain::operation::TensorDesc;

use crate::common::message;
use crate::decode::{DecodeError, In, Ops, Out};

fn c_tensor(desc: &TensorDesc) -> guild_tensor_desc_v1_t {
    guild_tensor_desc_v1_t {
        dtype: desc.dtype.raw(),
        rank: desc.rank,
        dims: desc.dims,
        strides: desc.strides,
        memory_space: desc.memory_space.bit(),
        device_id: desc.device_id,
        data: ptr::null_mut(),
    }
}

type ExecuteFn = unsafe extern "C" fn(
    *mut c_void,
    *const guild_execute_args_v1_t,
    *mut guild_error_info_t,
) -> guild_status_t;

/// One operation bound for direct calls: the provider's execute and user_data from its GOP1
/// descriptor, and the tensor records. The C handle that keeps the module loaded is held by
/// [`Direct`].
pub struct DirectHandle {
    execute: ExecuteFn,
    user_data: *mut c_void,
    inputs: Vec<guild_tensor_desc_v1_t>,
    outputs: Vec<guild_tensor_desc_v1_t>,
}

impl DirectHandle {
    /// Calls the provider's execute `calls` times on f32 buffers through one argument record
    /// built beforehand: the bare cost of a call, without the record building each
    /// [`Ops::execute`] of [`Direct`] does (decode_bound's baseline for the host's cost per
    /// call).
    #[allow(dead_code)] // decode_bound's; the decode bench shares this file
    pub fn call_repeatedly(&self, inputs: &[&[f32]], output: &mut [f32], calls: u32) {
        let mut ins = self.inputs.clone();
        for (t, d) in ins.iter_mut().zip(inputs) {
            t.data = d.as_ptr().cast_mut().cast();
        }
        let mut out = self.outputs[0];
        out.data = output.as_mut_ptr().cast();
        let args = guild_execute_args_v1_t::host_blocking(&ins, std::slice::from_ref(&out), &[]);
        let mut error = guild_error_info_t::new();
        for _ in 0..calls {
            // SAFETY: the provider's own execute and user_data, its library held by the C handle
            // `Direct` keeps; the records point at the caller's live buffers, which the caller
            // sized to the tensors this handle was bound to.
            let status =
                unsafe { (self.execute)(self.user_data, std::hint::black_box(&args), &mut error) };
            assert_eq!(
                status,
                GUILD_STATUS_OK,
                "direct execute: {}",
                message(&error)
            );
        }
    }
}

/// `Ops` on the module's own functions. Resolution goes through the C service once per
/// operation (to find the provider and hold its library); executes and re-binds do not.
pub struct Direct {
    table: guild_operation_service_v1_t,
    handles: Cell<Vec<*mut guild_op_handle_t>>,
    /// `(operation, impl id)` of every resolution, in order.
    resolved: RefCell<Vec<(String, String)>>,
}

impl Direct {
    /// Direct calls of what `table` (a registry's `operation_api()`) resolves.
    pub fn new(table: guild_operation_service_v1_t) -> Self {
        Direct {
            table,
            handles: Cell::new(Vec::new()),
            resolved: RefCell::new(Vec::new()),
        }
    }

    /// `(operation, impl id)` of every resolution so far, in order: the implementations whose
    /// functions the calls run.
    #[allow(dead_code)] // The decode benchmark does not ask.
    pub fn resolved(&self) -> Vec<(String, String)> {
        self.resolved.borrow().clone()
    }
}

impl Ops for Direct {
    type Handle = DirectHandle;

    fn resolve(
        &self,
        op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<DirectHandle, DecodeError> {
        let name = CString::new(op).unwrap();
        let (ins, outs): (Vec<_>, Vec<_>) = (
            inputs.iter().map(c_tensor).collect(),
            outputs.iter().map(c_tensor).collect(),
        );
        let query = guild_operation_query_v1_t {
            struct_size: size_of::<guild_operation_query_v1_t>() as u32,
            version: GUILD_OPERATION_QUERY_VERSION,
            op_name: name.as_ptr(),
            min_op_version: 0x0100_0000,
            max_op_version: 0x01ff_ffff,
            backends: GUILD_BACKEND_CPU,
            sync_mode: GUILD_SYNC_HOST_BLOCKING,
            required_capabilities: 0,
            required_numerics: 0,
            inputs: ins.as_ptr(),
            input_count: ins.len(),
            outputs: outs.as_ptr(),
            output_count: outs.len(),
            ram_budget: GUILD_BUDGET_UNLIMITED,
            vram_budget: GUILD_BUDGET_UNLIMITED,
            exact_impl_id: ptr::null(),
            device_caps: ptr::null(),
            params: ptr::null(),
            params_size: 0,
        };
        let mut error = guild_error_info_t::new();
        let mut handle = ptr::null_mut();
        // SAFETY: the query, its tensors and name live for the call; `handle` and `error` are
        // live records.
        let status = unsafe {
            self.table.resolve.unwrap()(self.table.user, &query, &mut handle, &mut error)
        };
        assert_eq!(status, GUILD_STATUS_OK, "resolve {op}: {}", message(&error));
        // SAFETY: a zeroed description is a valid bit pattern (NULL pointers, zero numbers).
        let mut d: guild_op_description_v1_t = unsafe { std::mem::zeroed() };
        d.struct_size = size_of::<guild_op_description_v1_t>() as u32;
        // SAFETY: a live handle of this service; `d` and `error` are live records.
        let status =
            unsafe { self.table.describe.unwrap()(self.table.user, handle, &mut d, &mut error) };
        assert_eq!(status, GUILD_STATUS_OK, "describe: {}", message(&error));
        // SAFETY: describe's `operation` is the host's copy of the provider's GOP1 extension,
        // valid while the handle lives (until `Direct` is dropped).
        let gop = unsafe { &*d.operation };
        assert!(!d.impl_id.is_null(), "describe {op}: no impl id");
        // SAFETY: describe wrote `impl_id`, a NUL-terminated string the host keeps while the
        // handle lives; it is copied here at once.
        let impl_id = unsafe { CStr::from_ptr(d.impl_id) }
            .to_string_lossy()
            .into_owned();
        self.resolved.borrow_mut().push((op.to_owned(), impl_id));
        let mut held = self.handles.take();
        held.push(handle);
        self.handles.set(held);
        Ok(DirectHandle {
            execute: gop.execute.expect("the provider's execute"),
            user_data: gop.user_data,
            inputs: ins,
            outputs: outs,
        })
    }

    fn rebind(
        &self,
        handle: &mut DirectHandle,
        _op: &str,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
    ) -> Result<(), DecodeError> {
        // The module's functions take any shape their contract admits: only the records change.
        handle.inputs = inputs.iter().map(c_tensor).collect();
        handle.outputs = outputs.iter().map(c_tensor).collect();
        Ok(())
    }

    fn execute(
        &self,
        h: &DirectHandle,
        inputs: &[In<'_>],
        outputs: &mut [Out<'_>],
        params: &[u8],
    ) -> Result<(), DecodeError> {
        let mut ins = [h.inputs[0]; 3];
        for (i, input) in inputs.iter().enumerate() {
            ins[i] = h.inputs[i];
            ins[i].data = match input {
                In::F32(d) => d.as_ptr().cast_mut().cast(),
                In::Bytes(d) => d.as_ptr().cast_mut().cast(),
            };
        }
        let mut out = h.outputs[0];
        out.data = match &mut outputs[0] {
            Out::F32(d) => d.as_mut_ptr().cast(),
            Out::I32(d) => d.as_mut_ptr().cast(),
        };
        let args = guild_execute_args_v1_t::host_blocking(
            &ins[..inputs.len()],
            std::slice::from_ref(&out),
            params,
        );
        let mut error = guild_error_info_t::new();
        // SAFETY: the provider's own execute and user_data, its library held by the C handle
        // `Direct` keeps;
        // the tensors point at live buffers of the shapes the decode bound, which the loop
        // sizes exactly as it does for the service (which checks them there).
        let status = unsafe { (h.execute)(h.user_data, &args, &mut error) };
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(DecodeError::Execute {
                op: "direct".into(),
                message: message(&error),
            })
        }
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let mut error = guild_error_info_t::new();
        for h in self.handles.take() {
            // SAFETY: a live handle of this service that no other call is using.
            let status = unsafe { self.table.release.unwrap()(self.table.user, h, &mut error) };
            assert_eq!(status, GUILD_STATUS_OK, "release: {}", message(&error));
        }
    }
}
