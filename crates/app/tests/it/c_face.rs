//! A test-side wrapper over the C operation service table, used the way a C runner or module
//! uses it: copy the table, build queries and execute records in C form, call through the
//! function pointers, read `guild_error_info_t` back. Everything that touches the table is here,
//! so that the tests read as plain Rust.

use std::ffi::{c_void, CStr, CString};
use std::marker::PhantomData;
use std::ptr;

use guild_abi::text::fixed_buffer_text;
use guild_abi::{
    guild_device_caps_v1_t, guild_error_info_t, guild_execute_args_v1_t, guild_op_description_v1_t,
    guild_op_handle_t, guild_operation_query_v1_t, guild_operation_service_v1_t,
    guild_reshape_args_v1_t, guild_scratch_request_v1_t, guild_tensor_desc_v1_t, GUILD_BACKEND_CPU,
    GUILD_BUDGET_UNLIMITED, GUILD_MEMORY_HOST, GUILD_OPERATION_QUERY_VERSION,
    GUILD_OPERATION_SERVICE_VERSION, GUILD_STATUS_OK, GUILD_SYNC_HOST_BLOCKING,
};
use guild_host::registry::KernelRegistry;

/// What a failed call reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CError {
    pub status: i32,
    pub component: String,
    pub message: String,
}

impl std::fmt::Display for CError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {} from {}: {}",
            self.status, self.component, self.message
        )
    }
}

fn check(status: i32, error: &guild_error_info_t) -> Result<(), CError> {
    if status == GUILD_STATUS_OK {
        return Ok(());
    }
    assert_eq!(
        error.status, status,
        "the error record's status matches the returned one"
    );
    Err(CError {
        status,
        component: fixed_buffer_text(&error.component),
        message: fixed_buffer_text(&error.message),
    })
}

/// A C tensor in host memory with no data (for queries) and packed strides unless given.
pub fn tensor(dtype: u32, dims: &[u64], strides: &[u64]) -> guild_tensor_desc_v1_t {
    let mut t = guild_tensor_desc_v1_t {
        dtype,
        rank: dims.len() as u32,
        dims: [0; 8],
        strides: [0; 8],
        memory_space: GUILD_MEMORY_HOST,
        device_id: 0,
        data: ptr::null_mut(),
    };
    t.dims[..dims.len()].copy_from_slice(dims);
    t.strides[..strides.len()].copy_from_slice(strides);
    t
}

/// The same tensor pointing at `data`.
pub fn with_data<T>(mut t: guild_tensor_desc_v1_t, data: *const T) -> guild_tensor_desc_v1_t {
    t.data = data.cast_mut().cast::<c_void>();
    t
}

/// Host-blocking execute args for these tensors on device 0, with no scratch, stream or params.
pub fn args(
    inputs: &[guild_tensor_desc_v1_t],
    outputs: &[guild_tensor_desc_v1_t],
) -> guild_execute_args_v1_t {
    guild_execute_args_v1_t::host_blocking(inputs, outputs, &[])
}

/// A query as a C caller builds it; `c()` gives the record, valid while `self` lives.
#[derive(Debug, Clone)]
pub struct Query {
    pub op_name: CString,
    pub min_version: u32,
    pub max_version: u32,
    pub backends: u32,
    pub sync_mode: u32,
    pub capabilities: u64,
    pub numerics: u64,
    pub inputs: Vec<guild_tensor_desc_v1_t>,
    pub outputs: Vec<guild_tensor_desc_v1_t>,
    pub ram_budget: u64,
    pub vram_budget: u64,
    pub exact: Option<CString>,
    pub device_caps: Option<guild_device_caps_v1_t>,
    pub params: Vec<u8>,
}

// SAFETY: a query owns all its data; the raw pointers in its tensors and caps are addresses the
// tests set and only the service reads, during calls the tests make.
unsafe impl Send for Query {}
// SAFETY: as above; nothing mutates a query through a shared reference.
unsafe impl Sync for Query {}

impl Query {
    /// A host-blocking CPU query for any 1.x version with unlimited budgets.
    pub fn cpu(
        op_name: &str,
        inputs: Vec<guild_tensor_desc_v1_t>,
        outputs: Vec<guild_tensor_desc_v1_t>,
    ) -> Self {
        Query {
            op_name: CString::new(op_name).unwrap(),
            min_version: 0x0100_0000,
            max_version: 0x01ff_ffff,
            backends: GUILD_BACKEND_CPU,
            sync_mode: GUILD_SYNC_HOST_BLOCKING,
            capabilities: 0,
            numerics: 0,
            inputs,
            outputs,
            ram_budget: GUILD_BUDGET_UNLIMITED,
            vram_budget: GUILD_BUDGET_UNLIMITED,
            exact: None,
            device_caps: None,
            params: Vec::new(),
        }
    }

    pub fn exact(mut self, impl_id: &str) -> Self {
        self.exact = Some(CString::new(impl_id).unwrap());
        self
    }

    pub fn c(&self) -> guild_operation_query_v1_t {
        guild_operation_query_v1_t {
            struct_size: size_of::<guild_operation_query_v1_t>() as u32,
            version: GUILD_OPERATION_QUERY_VERSION,
            op_name: self.op_name.as_ptr(),
            min_op_version: self.min_version,
            max_op_version: self.max_version,
            backends: self.backends,
            sync_mode: self.sync_mode,
            required_capabilities: self.capabilities,
            required_numerics: self.numerics,
            inputs: self.inputs.as_ptr(),
            input_count: self.inputs.len(),
            outputs: self.outputs.as_ptr(),
            output_count: self.outputs.len(),
            ram_budget: self.ram_budget,
            vram_budget: self.vram_budget,
            exact_impl_id: self.exact.as_ref().map_or(ptr::null(), |e| e.as_ptr()),
            device_caps: self
                .device_caps
                .as_ref()
                .map_or(ptr::null(), |c| c as *const _),
            params: if self.params.is_empty() {
                ptr::null()
            } else {
                self.params.as_ptr().cast()
            },
            params_size: self.params.len(),
        }
    }
}

/// A copy of a registry's service table, as a plugin keeps it; it borrows the registry so that
/// the tests cannot outlive it by accident.
#[derive(Debug, Clone, Copy)]
pub struct Service<'r> {
    pub table: guild_operation_service_v1_t,
    _registry: PhantomData<&'r KernelRegistry>,
}

// SAFETY: the table's `user` is the registry's service core, which is Sync; the function
// pointers may be called from any thread.
unsafe impl Send for Service<'_> {}
// SAFETY: as above.
unsafe impl Sync for Service<'_> {}

impl<'r> Service<'r> {
    pub fn of(registry: &'r KernelRegistry) -> Self {
        let table = *registry.operation_api();
        assert_eq!(
            table.struct_size as usize,
            size_of::<guild_operation_service_v1_t>()
        );
        assert_eq!(table.version, GUILD_OPERATION_SERVICE_VERSION);
        Service {
            table,
            _registry: PhantomData,
        }
    }

    /// Another table of the same registry's service, such as the one a plugin is given.
    pub fn with_table(_registry: &'r KernelRegistry, table: guild_operation_service_v1_t) -> Self {
        Service {
            table,
            _registry: PhantomData,
        }
    }

    /// Resolves a query record as given (for tests that break it on purpose).
    pub fn resolve_raw(
        &self,
        query: *const guild_operation_query_v1_t,
    ) -> Result<Handle<'_, 'r>, CError> {
        let mut error = guild_error_info_t::new();
        let mut out: *mut guild_op_handle_t = ptr::null_mut();
        let resolve = self.table.resolve.unwrap();
        // SAFETY: the table is the registry's, which outlives `self`; `query` is valid or
        // deliberately broken in a way the service must detect; `out` and `error` are live.
        let status = unsafe { resolve(self.table.user, query, &mut out, &mut error) };
        check(status, &error)?;
        assert!(!out.is_null(), "resolve returned OK and a NULL handle");
        Ok(Handle {
            service: self,
            raw: out,
        })
    }

    pub fn resolve(&self, query: &Query) -> Result<Handle<'_, 'r>, CError> {
        let c = query.c();
        let result = self.resolve_raw(&c);
        if result.is_err() {
            // A failed resolve leaves no handle behind.
            let mut error = guild_error_info_t::new();
            // A non-NULL sentinel that the service must overwrite with NULL.
            let mut slot = 0u64;
            let mut out: *mut guild_op_handle_t = (&mut slot as *mut u64).cast();
            let resolve = self.table.resolve.unwrap();
            // SAFETY: as in resolve_raw.
            let status = unsafe { resolve(self.table.user, &c, &mut out, &mut error) };
            assert_ne!(status, GUILD_STATUS_OK);
            assert!(out.is_null(), "a failed resolve writes NULL to out_handle");
        }
        result
    }
}

/// A resolved C handle; dropping it releases it (and asserts the release succeeded).
#[derive(Debug)]
pub struct Handle<'s, 'r> {
    service: &'s Service<'r>,
    raw: *mut guild_op_handle_t,
}

// SAFETY: the service serialises calls on one handle and allows them from any thread; the test
// never releases a handle while another thread uses it (release takes `self`).
unsafe impl Send for Handle<'_, '_> {}
// SAFETY: as above.
unsafe impl Sync for Handle<'_, '_> {}

/// What describe reported, with its strings read.
#[derive(Debug, Clone)]
pub struct Description {
    pub raw: guild_op_description_v1_t,
    pub impl_id: String,
    pub package_id: String,
    pub op_name: String,
}

impl Handle<'_, '_> {
    pub fn raw(&self) -> *mut guild_op_handle_t {
        self.raw
    }

    pub fn describe(&self) -> Result<Description, CError> {
        let mut error = guild_error_info_t::new();
        // SAFETY: a zeroed description is a valid bit pattern (NULL pointers, zero numbers).
        let mut d: guild_op_description_v1_t = unsafe { std::mem::zeroed() };
        d.struct_size = size_of::<guild_op_description_v1_t>() as u32;
        let describe = self.service.table.describe.unwrap();
        // SAFETY: live handle of this service; `d` and `error` are live records.
        let status = unsafe { describe(self.service.table.user, self.raw, &mut d, &mut error) };
        check(status, &error)?;
        // SAFETY: describe's strings are borrowed from the handle, valid until release.
        let s =
            |p: *const std::ffi::c_char| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
        Ok(Description {
            impl_id: s(d.impl_id),
            package_id: s(d.package_id),
            op_name: s(d.op_name),
            raw: d,
        })
    }

    pub fn scratch(&self) -> Result<guild_scratch_request_v1_t, CError> {
        let mut error = guild_error_info_t::new();
        let mut s = guild_scratch_request_v1_t {
            struct_size: size_of::<guild_scratch_request_v1_t>() as u32,
            alignment: 0,
            host_bytes: 0,
            device_bytes: 0,
        };
        let scratch = self.service.table.scratch.unwrap();
        // SAFETY: live handle of this service; `s` and `error` are live records.
        let status = unsafe { scratch(self.service.table.user, self.raw, &mut s, &mut error) };
        check(status, &error)?;
        Ok(s)
    }

    /// Executes with tensors whose data pointers the caller set, and optional host scratch.
    pub fn execute(
        &self,
        inputs: &[guild_tensor_desc_v1_t],
        outputs: &[guild_tensor_desc_v1_t],
        scratch: Option<&mut [u8]>,
    ) -> Result<(), CError> {
        let (scratch_host, scratch_host_size) = match scratch {
            Some(s) => (s.as_mut_ptr().cast::<c_void>(), s.len() as u64),
            None => (ptr::null_mut(), 0),
        };
        let mut a = args(inputs, outputs);
        a.scratch_host = scratch_host;
        a.scratch_host_size = scratch_host_size;
        self.execute_args(&a)
    }

    /// Executes with an args record as given.
    pub fn execute_args(&self, args: &guild_execute_args_v1_t) -> Result<(), CError> {
        let mut error = guild_error_info_t::new();
        let execute = self.service.table.execute.unwrap();
        // SAFETY: live handle of this service; the args' pointers are the test's live buffers
        // (or deliberately wrong in a way the service must catch before the provider runs).
        let status = unsafe { execute(self.service.table.user, self.raw, args, &mut error) };
        check(status, &error)
    }

    /// Executes with an args record as given and no error record (NULL): only the status.
    pub fn execute_args_without_record(&self, args: &guild_execute_args_v1_t) -> i32 {
        let execute = self.service.table.execute.unwrap();
        // SAFETY: as `execute_args`; a NULL error record is allowed by the service's contract.
        unsafe { execute(self.service.table.user, self.raw, args, ptr::null_mut()) }
    }

    /// Reshapes the handle to these tensors, without params.
    pub fn reshape(
        &self,
        inputs: &[guild_tensor_desc_v1_t],
        outputs: &[guild_tensor_desc_v1_t],
    ) -> Result<(), CError> {
        reshape_raw(self.service, self.raw, &reshape_args(inputs, outputs))
    }

    /// Releases the handle, reporting what release said.
    pub fn release(self) -> Result<(), CError> {
        let this = std::mem::ManuallyDrop::new(self);
        release_raw(this.service, this.raw)
    }
}

/// Calls release on a raw handle pointer.
pub fn release_raw(service: &Service<'_>, raw: *mut guild_op_handle_t) -> Result<(), CError> {
    let mut error = guild_error_info_t::new();
    let release = service.table.release.unwrap();
    // SAFETY: `raw` is a handle of this service that the caller gives up (or NULL).
    let status = unsafe { release(service.table.user, raw, &mut error) };
    check(status, &error)
}

impl Drop for Handle<'_, '_> {
    fn drop(&mut self) {
        let result = release_raw(self.service, self.raw);
        if !std::thread::panicking() {
            result.expect("releasing a handle");
        }
    }
}

/// Reshape args for these tensors, without params.
pub fn reshape_args(
    inputs: &[guild_tensor_desc_v1_t],
    outputs: &[guild_tensor_desc_v1_t],
) -> guild_reshape_args_v1_t {
    guild_reshape_args_v1_t {
        struct_size: size_of::<guild_reshape_args_v1_t>() as u32,
        reserved: 0,
        inputs: inputs.as_ptr(),
        input_count: inputs.len(),
        outputs: outputs.as_ptr(),
        output_count: outputs.len(),
        params: ptr::null(),
        params_size: 0,
    }
}

/// Calls reshape on a raw handle pointer with an args record as given.
pub fn reshape_raw(
    service: &Service<'_>,
    raw: *mut guild_op_handle_t,
    args: *const guild_reshape_args_v1_t,
) -> Result<(), CError> {
    let mut error = guild_error_info_t::new();
    assert!(
        service.table.struct_size as usize >= guild_abi::GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE,
        "the table has the reshape tail"
    );
    let reshape = service.table.reshape.unwrap();
    // SAFETY: `raw` is a handle of this service (or deliberately stale); `args` is a live record
    // whose arrays are live (or deliberately broken in a way the service must catch).
    let status = unsafe { reshape(service.table.user, raw, args, &mut error) };
    check(status, &error)
}
