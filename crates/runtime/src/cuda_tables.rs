//! A CUDA kernel's CDD1 (dense projections), CDA1 (attention) and CDM1 (mixture of experts,
//! with its optional CDMQ Qwen group) tables, bound once with a lease on the package, the same
//! way [`BoundExpertTable`](crate::experts::BoundExpertTable) binds CPE1.
//!
//! The loader checked and copied each table at registration (tag, version, size, required
//! callbacks, placement on a CUDA kernel). [`BoundCudaTables::bind`] copies those copies by value
//! into a struct that holds the [`KernelBinding`], so the tables' callbacks stay loaded and the
//! package refuses disable, replace and rollback while it lives, and a model never looks the
//! kernel up again.
//!
//! Host-side queries have safe wrappers (CDA1 `configure`, CDM1 `query_workspace` for routing).
//! The execution callbacks take device pointers and a stream, which the host cannot check; their
//! wrappers (so far CDD1 [`BoundCudaTables::project`], CDA1 [`BoundCudaTables::kv_append`] and
//! CDM1 [`BoundCudaTables::elementwise`]) take them as [`DeviceSpan`]s and a
//! [`CudaStream`], whose `unsafe` constructors carry the caller's promise that the memory and the
//! stream are what they claim to be and outlive the enqueued work. Given that promise, a wrapper
//! checks everything else before the callback runs: the callback is offered, the dtypes are ones
//! the table takes, the geometry is non-zero and does not overflow, every buffer is on the
//! stream's device, aligned, and large enough for every byte the geometry and strides address,
//! and the output overlaps no input. A refusal ([`CudaCallError::Refused`]) names the kernel, the
//! callback and the [`CallProblem`]; nothing is enqueued then. The bound tables stay readable,
//! for the callbacks that have no wrapper yet.

use std::ffi::{c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::ptr;

use guild_abi::{
    guild_cuda_attn_config_args_v1_t, guild_cuda_attn_ext_v1_t, guild_cuda_dense_ext_v1_t,
    guild_cuda_dense_geometry_v1_t, guild_cuda_dense_project_args_v1_t,
    guild_cuda_dense_strides_v1_t, guild_cuda_elementwise_args_v1_t,
    guild_cuda_kv_append_args_v1_t, guild_cuda_kv_cache_view_v1_t, guild_cuda_moe_ext_v1_t,
    guild_cuda_moe_route_args_v1_t, guild_cuda_moe_workspace_query_args_v1_t,
    guild_cuda_qwen_group_v1_t, guild_cuda_row_selection_v1_t, guild_stream_t, GUILD_BACKEND_CUDA,
    GUILD_CUDA_CONFIG_VALUE_INT, GUILD_CUDA_DENSE_ACCUMULATE, GUILD_CUDA_DENSE_CAP_BF16_OUTPUT,
    GUILD_CUDA_EW_ADD, GUILD_CUDA_EW_AXPY, GUILD_CUDA_EW_COPY, GUILD_CUDA_EW_GEGLU,
    GUILD_CUDA_EW_GELU, GUILD_CUDA_EW_MUL, GUILD_CUDA_EW_SCALE, GUILD_CUDA_EW_SIGMOID_MUL,
    GUILD_CUDA_EW_SILU, GUILD_CUDA_EW_SWIGLU, GUILD_CUDA_MOE_OP_ROUTE, GUILD_DTYPE_BF16,
    GUILD_DTYPE_F16, GUILD_DTYPE_F32, GUILD_DTYPE_Q8_0,
};
use guild_domain::ids::{ImplId, PackageId};
use guild_domain::operation::CpuIsa;
use guild_ports::device::StreamRef;
use thiserror::Error;

pub use crate::bound::BoundTable;
use crate::bound::{bound, size_u32, Callback, Table, TableFn};
use crate::error::PluginReason;
use crate::experts::{call, ExpertError};
use crate::registry::{KernelBinding, KernelRegistry};

/// Why a kernel binding could not become [`BoundCudaTables`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CudaBindError {
    /// No kernel with this implementation id is registered (or its package is disabled).
    #[error("no kernel {0} is registered")]
    NoSuchKernel(ImplId),
    /// The kernel is not a CUDA kernel carrying CDD1, CDA1 or CDM1.
    #[error("kernel {0} carries no CDD1, CDA1 or CDM1 table")]
    NoCudaTables(ImplId),
    /// The kernel's host-side code needs CPU instruction sets this CPU lacks (its descriptor's
    /// `required_cpu_isa`); calling it could execute an illegal instruction.
    #[error("kernel {impl_id} requires CPU instruction sets this CPU lacks ({missing})")]
    MissingCpuIsa {
        /// The kernel.
        impl_id: ImplId,
        /// The required bits this CPU lacks.
        missing: CpuIsa,
    },
}

/// A CUDA kernel's CDD1, CDA1 and CDM1 tables (whichever it carries), bound with a lease.
pub struct BoundCudaTables {
    dense: Option<BoundTable<guild_cuda_dense_ext_v1_t>>,
    attn: Option<BoundTable<guild_cuda_attn_ext_v1_t>>,
    moe: Option<BoundTable<guild_cuda_moe_ext_v1_t>>,
    qwen: Option<BoundTable<guild_cuda_qwen_group_v1_t>>,
    // Last, so that the code the tables point into is released after everything else.
    binding: KernelBinding,
}

// SAFETY: the tables hold the plugin's function pointers and user_data, valid while `binding`
// lives and never written after bind; the CUDA extension headers make their callbacks callable
// from any host thread (each call names its own stream).
unsafe impl Send for BoundCudaTables {}
// SAFETY: as for Send: shared use only reads the tables and calls the callbacks.
unsafe impl Sync for BoundCudaTables {}

impl fmt::Debug for BoundCudaTables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundCudaTables")
            .field("impl_id", self.impl_id())
            .field("dense", &self.dense.is_some())
            .field("attn", &self.attn.is_some())
            .field("moe", &self.moe.is_some())
            .field("qwen", &self.qwen.is_some())
            .finish_non_exhaustive()
    }
}

impl BoundCudaTables {
    /// Binds the CDD1, CDA1 and CDM1 tables (and CDM1's Qwen group) of the CUDA kernel
    /// `binding` refers to. The binding moves in and keeps the package leased.
    pub fn bind(binding: KernelBinding) -> Result<Self, CudaBindError> {
        let refused = || CudaBindError::NoCudaTables(binding.kernel().impl_id.clone());
        if binding.kernel().backend.bit() != GUILD_BACKEND_CUDA {
            return Err(refused());
        }
        let missing = crate::platform::lacking(binding.kernel().required_cpu_isa);
        if !missing.is_empty() {
            return Err(CudaBindError::MissingCpuIsa {
                impl_id: binding.kernel().impl_id.clone(),
                missing,
            });
        }
        let kernel = binding.kernel().provider.as_ref();
        let dense = bound(kernel.cuda_dense(), |t| t.header.next = ptr::null());
        let attn = bound(kernel.cuda_attn(), |t| t.header.next = ptr::null());
        // The Qwen group is bound beside CDM1; the CDM1 copy no longer points at it.
        let moe = bound(kernel.cuda_moe(), |t| {
            t.header.next = ptr::null();
            t.qwen = ptr::null();
        });
        let qwen = bound(kernel.cuda_qwen(), |t| t.header.next = ptr::null());
        if dense.is_none() && attn.is_none() && moe.is_none() {
            return Err(refused());
        }
        Ok(BoundCudaTables {
            dense,
            attn,
            moe,
            qwen,
            binding,
        })
    }

    /// Binds the tables of the registered kernel `impl_id` (one registry lookup, now).
    pub fn bind_id(registry: &KernelRegistry, impl_id: &ImplId) -> Result<Self, CudaBindError> {
        let binding = registry
            .find_by_id(impl_id)
            .ok_or_else(|| CudaBindError::NoSuchKernel(impl_id.clone()))?;
        Self::bind(binding)
    }

    /// The provider kernel.
    pub fn impl_id(&self) -> &ImplId {
        &self.binding.kernel().impl_id
    }

    /// The package whose library holds the callbacks.
    pub fn package(&self) -> &PackageId {
        self.binding.package()
    }

    /// The CDD1 table, when the kernel carries one.
    pub fn dense(&self) -> Option<&BoundTable<guild_cuda_dense_ext_v1_t>> {
        self.dense.as_ref()
    }

    /// The CDA1 table, when the kernel carries one.
    pub fn attn(&self) -> Option<&BoundTable<guild_cuda_attn_ext_v1_t>> {
        self.attn.as_ref()
    }

    /// The CDM1 table, when the kernel carries one (its `qwen` pointer is NULL: see
    /// [`BoundCudaTables::qwen`]).
    pub fn moe(&self) -> Option<&BoundTable<guild_cuda_moe_ext_v1_t>> {
        self.moe.as_ref()
    }

    /// CDM1's Qwen group, when the CDM1 table pointed at one.
    pub fn qwen(&self) -> Option<&BoundTable<guild_cuda_qwen_group_v1_t>> {
        self.qwen.as_ref()
    }

    fn not_offered(&self, callback: &'static str) -> ExpertError {
        ExpertError::NotOffered {
            impl_id: self.impl_id().clone(),
            callback,
        }
    }

    /// Sets the CDA1 configuration key `key` to the integer `value` (CDA1 `configure`).
    pub fn configure_attn_int(&self, key: &CStr, value: i64) -> Result<(), ExpertError> {
        const NAME: &str = "configure";
        let (_, f) = offered(&self.attn, |t| t.configure).ok_or_else(|| self.not_offered(NAME))?;
        let args = guild_cuda_attn_config_args_v1_t {
            struct_size: size_u32::<guild_cuda_attn_config_args_v1_t>(),
            value_kind: GUILD_CUDA_CONFIG_VALUE_INT,
            key: key.as_ptr(),
            int_value: value,
            float_value: 0.0,
            text_value: ptr::null(),
        };
        // SAFETY: the callback is loaded while `self.binding` lives; the args and the key are
        // live for the call.
        unsafe { call(NAME, f, &args) }
    }

    /// The workspace bytes CDM1 `route` needs for `token_count` tokens over `expert_count`
    /// experts choosing `top_k` (CDM1 `query_workspace`; no device memory is named).
    pub fn route_workspace(
        &self,
        gating: u32,
        token_count: u32,
        expert_count: u32,
        top_k: u32,
    ) -> Result<u64, ExpertError> {
        const NAME: &str = "query_workspace";
        let (_, f) =
            offered(&self.moe, |t| t.query_workspace).ok_or_else(|| self.not_offered(NAME))?;
        // SAFETY: the route args are integers, floats and pointers; all-zero (NULL) is valid.
        let mut route: guild_cuda_moe_route_args_v1_t = unsafe { std::mem::zeroed() };
        route.struct_size = size_u32::<guild_cuda_moe_route_args_v1_t>();
        route.gating = gating;
        route.token_count = token_count;
        route.expert_count = expert_count;
        route.top_k = top_k;
        route.weight_scale = 1.0;
        let mut bytes = 0u64;
        let args = guild_cuda_moe_workspace_query_args_v1_t {
            struct_size: size_u32::<guild_cuda_moe_workspace_query_args_v1_t>(),
            operation: GUILD_CUDA_MOE_OP_ROUTE,
            op_args: (&raw const route).cast(),
            workspace_bytes_out: &mut bytes,
        };
        // SAFETY: the callback is loaded while `self.binding` lives; the route args and the
        // output are live locals for the call.
        unsafe { call(NAME, f, &args) }?;
        Ok(bytes)
    }
}

/// The callback `pick` reads from `table`, with that table (and its `user_data`), when the kernel
/// carries the table and the table offers the callback.
fn offered<T: Table, A>(
    table: &Option<BoundTable<T>>,
    pick: impl FnOnce(&T) -> Option<TableFn<A>>,
) -> Option<(&T, Callback<A>)> {
    let table = table.as_ref()?;
    Some((table.table(), table.callback(pick)?))
}

// ---------------------------------------------------------------------------------------------
// Device memory, streams and refusals of the execution callbacks
// ---------------------------------------------------------------------------------------------

/// Device memory handed to an execution callback: an address, the bytes the allocation holds
/// from it on, and the device that owns it. It grants no access by itself; a wrapper checks the
/// geometry of a call against `bytes` and `device_id` before handing the address over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpan {
    ptr: *mut c_void,
    bytes: u64,
    device_id: i32,
}

impl DeviceSpan {
    /// `bytes` bytes of memory of device `device_id` at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` must be memory that device `device_id` can access from its primary
    /// context (device or managed memory), and must stay allocated, and not be used by anything
    /// else in a conflicting way (written while the work reads it, accessed while the work writes
    /// it), until every piece of work enqueued with it has completed: until the caller has
    /// synchronised the stream the call named, or waited for an event recorded there after the
    /// call (and, for a captured graph, until its last launch has completed).
    pub unsafe fn new(ptr: *mut c_void, bytes: u64, device_id: i32) -> Self {
        DeviceSpan {
            ptr,
            bytes,
            device_id,
        }
    }

    /// The address.
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The bytes the allocation holds from the address on.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The device that owns the memory.
    pub fn device_id(&self) -> i32 {
        self.device_id
    }

    fn address(&self) -> u64 {
        self.ptr as usize as u64
    }
}

// SAFETY: a span is an address, a size and a device id; it gives no access by itself (only the
// wrappers hand it to a provider, under the promise its unsafe constructor carries), so moving
// or sharing it between threads cannot cause a data race.
unsafe impl Send for DeviceSpan {}
// SAFETY: as above.
unsafe impl Sync for DeviceSpan {}

/// The stream an execution callback enqueues its work on, and the device the work runs on.
///
/// It stays on the thread that made it (the promise includes the thread's current context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaStream {
    stream: StreamRef,
    device_id: i32,
    _thread: PhantomData<*const ()>,
}

impl CudaStream {
    /// `stream` (the address its `cudaStream_t` holds; `StreamRef(0)` is the legacy default
    /// stream) of device `device_id`.
    ///
    /// # Safety
    ///
    /// `stream` must be `StreamRef(0)` or a live stream of device `device_id`'s primary context
    /// that stays valid until the work enqueued on it has completed; that context must be current
    /// on this thread whenever this value is passed to a call (the CUDA table headers require the
    /// caller to have made the device current); and the work enqueued on it through a
    /// [`BoundCudaTables`] (with any graph captured from it) must have completed, and the graph
    /// been destroyed, before those tables are dropped, since dropping the last binding may
    /// unload the provider's code and modules.
    pub unsafe fn new(stream: StreamRef, device_id: i32) -> Self {
        CudaStream {
            stream,
            device_id,
            _thread: PhantomData,
        }
    }

    /// The stream.
    pub fn stream(&self) -> StreamRef {
        self.stream
    }

    /// The device.
    pub fn device_id(&self) -> i32 {
        self.device_id
    }

    fn raw(&self) -> guild_stream_t {
        self.stream.0 as guild_stream_t
    }
}

/// Why a call through an execution callback of [`BoundCudaTables`] did not happen or failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CudaCallError {
    /// The kernel carries no table with this callback, or its table leaves it NULL.
    #[error("{callback} is not offered by provider {impl_id}")]
    NotOffered {
        /// The provider.
        impl_id: ImplId,
        /// The callback's field name.
        callback: &'static str,
    },
    /// The host's arguments do not fit the callback or the bound table; nothing was called and
    /// nothing enqueued.
    #[error("{callback} of {impl_id} refused before the call: {problem}")]
    Refused {
        /// The provider.
        impl_id: ImplId,
        /// The callback that was not called.
        callback: &'static str,
        /// What does not fit.
        problem: CallProblem,
    },
    /// The provider's callback returned an error (CUDA table callbacks then enqueue nothing).
    #[error("{callback} of {impl_id} failed: {reason}")]
    Provider {
        /// The provider.
        impl_id: ImplId,
        /// The callback.
        callback: &'static str,
        /// Its status and error record.
        reason: PluginReason,
    },
}

/// What a wrapper found wrong with the arguments of an execution callback. Operands are named
/// as the callback's argument fields are (`weights`, `input`, `bias`, `output`, `selection`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CallProblem {
    /// A dtype the callback does not take.
    #[error("the {operand} dtype {dtype} is not {allowed}")]
    Dtype {
        /// The operand.
        operand: &'static str,
        /// Its `GUILD_DTYPE_*`.
        dtype: u32,
        /// What the callback takes, in words.
        allowed: &'static str,
    },
    /// A BF16 output without `GUILD_CUDA_DENSE_CAP_BF16_OUTPUT` in the table's capabilities.
    #[error(
        "a BF16 output needs GUILD_CUDA_DENSE_CAP_BF16_OUTPUT, which the table does not declare"
    )]
    Bf16OutputNotDeclared,
    /// Flag bits the header does not define.
    #[error("unknown flag bits {0:#x}")]
    UnknownFlags(u32),
    /// A dimension that must not be zero is zero.
    #[error("{0} is zero")]
    Zero(&'static str),
    /// A row selection longer than the weight matrix.
    #[error("the selection names {count} rows of a matrix of {rows}")]
    SelectionTooLong {
        /// Indices in the selection.
        count: u32,
        /// `geometry.rows`.
        rows: u64,
    },
    /// The bytes the geometry addresses in an operand overflow 64 bits.
    #[error("the extent of {0} overflows")]
    Overflow(&'static str),
    /// An operand on another device than the stream.
    #[error("{operand} is on device {device_id}, the stream on device {stream_device_id}")]
    Device {
        /// The operand.
        operand: &'static str,
        /// The operand's device.
        device_id: i32,
        /// The stream's device.
        stream_device_id: i32,
    },
    /// A NULL operand address.
    #[error("{0} is NULL")]
    Null(&'static str),
    /// An operand address not aligned to its element size.
    #[error("{operand} at {address:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The operand.
        operand: &'static str,
        /// Its address.
        address: u64,
        /// The element size.
        align: u64,
    },
    /// A row stride that is not a multiple of the element size, so that rows would be misaligned.
    #[error("the {operand} row stride {stride} is not a multiple of {align} bytes")]
    StrideMisaligned {
        /// The operand.
        operand: &'static str,
        /// Its row stride in bytes.
        stride: u64,
        /// The element size.
        align: u64,
    },
    /// A row stride shorter than one row, so that rows would overlap.
    #[error("the {operand} row stride {stride} is shorter than its row of {row_bytes} bytes")]
    StrideTooShort {
        /// The operand.
        operand: &'static str,
        /// Its row stride in bytes.
        stride: u64,
        /// The bytes of one row.
        row_bytes: u64,
    },
    /// An operand smaller than what the geometry and strides address.
    #[error("{operand} holds {bytes} bytes, the call addresses {needed}")]
    TooSmall {
        /// The operand.
        operand: &'static str,
        /// The bytes its span holds.
        bytes: u64,
        /// The bytes the call reads or writes, from the address on.
        needed: u64,
    },
    /// The bytes an output is written through overlap those of an input.
    #[error("output overlaps {0}")]
    Overlap(&'static str),
    /// An operation code the header does not define.
    #[error("unknown operation {0}")]
    UnknownOp(u32),
    /// An operand the operation needs is missing.
    #[error("operation {op} needs {operand}")]
    Missing {
        /// The operation code.
        op: u32,
        /// The operand.
        operand: &'static str,
    },
    /// An operand the operation does not take is given.
    #[error("operation {op} takes no {operand}")]
    Unexpected {
        /// The operation code.
        op: u32,
        /// The operand.
        operand: &'static str,
    },
    /// An output that shares bytes with an input without being that input in place (the same
    /// address, row stride and dtype).
    #[error("out overlaps {0} without being it in place (same address, row stride and dtype)")]
    PartialOverlap(&'static str),
    /// A KV cache dtype the table's `kv_cache_dtypes` does not list.
    #[error("the KV cache dtype {0} is not among the table's kv_cache_dtypes")]
    CacheDtypeNotDeclared(u32),
    /// A dimension that must be a multiple of a block is not.
    #[error("{what} {value} is not a multiple of {of}")]
    NotMultiple {
        /// The dimension.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The block.
        of: u64,
    },
    /// Two operands the call writes share bytes.
    #[error("{0} overlaps {1}")]
    WritesOverlap(&'static str, &'static str),
}

/// One CDD1 `project`: `output[t][i] = dot(W[row(i)], input[t]) (+ bias[row(i)])` with F32
/// accumulation, added to the output with [`GUILD_CUDA_DENSE_ACCUMULATE`]. Start from
/// [`DenseProject::f32`] for packed F32 rows and change what differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseProject {
    /// `GUILD_DTYPE_F32` or `GUILD_DTYPE_BF16`: the weights.
    pub weight_dtype: u32,
    /// `GUILD_DTYPE_F32` or `GUILD_DTYPE_BF16`: the input.
    pub input_dtype: u32,
    /// `GUILD_DTYPE_F32`, or `GUILD_DTYPE_BF16` where the table declares BF16 output.
    pub output_dtype: u32,
    /// `GUILD_CUDA_DENSE_*` flag bits.
    pub flags: u32,
    /// Output features: rows of the weight matrix.
    pub rows: u64,
    /// Input features: elements per weight row and per input token.
    pub cols: u64,
    /// Tokens: input rows and output rows.
    pub tokens: u64,
    /// Bytes between consecutive weight rows.
    pub weight_row_stride_bytes: u64,
    /// Bytes between consecutive input tokens.
    pub input_row_stride_bytes: u64,
    /// Bytes between consecutive output tokens.
    pub output_row_stride_bytes: u64,
    /// The weight rows to compute, in output order; `None` computes all `rows` in order.
    pub selection: Option<RowSelection>,
    /// `rows` weight rows of `cols` elements.
    pub weights: DeviceSpan,
    /// `tokens` input rows of `cols` elements.
    pub input: DeviceSpan,
    /// `rows` F32 biases, or none.
    pub bias: Option<DeviceSpan>,
    /// `tokens` output rows of [`DenseProject::outputs`] elements.
    pub output: DeviceSpan,
}

/// A device array of `count` `i32` weight-row indices (each must be below `rows`; the host
/// cannot read device memory to check, so what a provider does with a bad index is its own
/// documented choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSelection {
    /// The indices.
    pub rows: DeviceSpan,
    /// How many.
    pub count: u32,
}

impl DenseProject {
    /// F32 weights, input and output in packed rows (strides of one row), every row, no bias,
    /// no flags.
    pub fn f32(
        rows: u64,
        cols: u64,
        tokens: u64,
        weights: DeviceSpan,
        input: DeviceSpan,
        output: DeviceSpan,
    ) -> Self {
        DenseProject {
            weight_dtype: GUILD_DTYPE_F32,
            input_dtype: GUILD_DTYPE_F32,
            output_dtype: GUILD_DTYPE_F32,
            flags: 0,
            rows,
            cols,
            tokens,
            weight_row_stride_bytes: cols.saturating_mul(4),
            input_row_stride_bytes: cols.saturating_mul(4),
            output_row_stride_bytes: rows.saturating_mul(4),
            selection: None,
            weights,
            input,
            bias: None,
            output,
        }
    }

    /// Output elements per token: the selection's count, or `rows`.
    pub fn outputs(&self) -> u64 {
        self.selection.map_or(self.rows, |s| u64::from(s.count))
    }
}

/// The element size of a dense-product dtype, if the product takes it.
fn dense_element(dtype: u32) -> Option<u64> {
    match dtype {
        GUILD_DTYPE_F32 => Some(4),
        GUILD_DTYPE_BF16 => Some(2),
        _ => None,
    }
}

/// The bytes `count` rows of `row_bytes` at `stride` reach from the first row's start.
fn extent(
    count: u64,
    stride: u64,
    row_bytes: u64,
    operand: &'static str,
) -> Result<u64, CallProblem> {
    count
        .checked_sub(1)
        .and_then(|n| n.checked_mul(stride))
        .and_then(|n| n.checked_add(row_bytes))
        .ok_or(CallProblem::Overflow(operand))
}

/// Checks one operand: its device, address and size against the bytes the call reaches.
fn check_span(
    span: &DeviceSpan,
    operand: &'static str,
    align: u64,
    needed: u64,
    stream: &CudaStream,
) -> Result<(), CallProblem> {
    if span.device_id != stream.device_id {
        return Err(CallProblem::Device {
            operand,
            device_id: span.device_id,
            stream_device_id: stream.device_id,
        });
    }
    if span.ptr.is_null() {
        return Err(CallProblem::Null(operand));
    }
    if !span.address().is_multiple_of(align) {
        return Err(CallProblem::Misaligned {
            operand,
            address: span.address(),
            align,
        });
    }
    if span.bytes < needed {
        return Err(CallProblem::TooSmall {
            operand,
            bytes: span.bytes,
            needed,
        });
    }
    if span.address().checked_add(needed).is_none() {
        return Err(CallProblem::Overflow(operand));
    }
    Ok(())
}

/// Checks a row stride against the element size and the row's bytes.
fn check_stride(
    operand: &'static str,
    stride: u64,
    align: u64,
    row_bytes: u64,
) -> Result<(), CallProblem> {
    if !stride.is_multiple_of(align) {
        return Err(CallProblem::StrideMisaligned {
            operand,
            stride,
            align,
        });
    }
    if stride < row_bytes {
        return Err(CallProblem::StrideTooShort {
            operand,
            stride,
            row_bytes,
        });
    }
    Ok(())
}

/// Checks a [`DenseProject`] against the table's capabilities and the stream, and builds the
/// callback's arguments.
fn project_args(
    capabilities: u32,
    a: &DenseProject,
    stream: &CudaStream,
) -> Result<guild_cuda_dense_project_args_v1_t, CallProblem> {
    const BF16_OR_F32: &str = "BF16 or F32";
    let w_size = dense_element(a.weight_dtype).ok_or(CallProblem::Dtype {
        operand: "weights",
        dtype: a.weight_dtype,
        allowed: BF16_OR_F32,
    })?;
    let in_size = dense_element(a.input_dtype).ok_or(CallProblem::Dtype {
        operand: "input",
        dtype: a.input_dtype,
        allowed: BF16_OR_F32,
    })?;
    let out_size = dense_element(a.output_dtype).ok_or(CallProblem::Dtype {
        operand: "output",
        dtype: a.output_dtype,
        allowed: BF16_OR_F32,
    })?;
    if a.output_dtype == GUILD_DTYPE_BF16 && capabilities & GUILD_CUDA_DENSE_CAP_BF16_OUTPUT == 0 {
        return Err(CallProblem::Bf16OutputNotDeclared);
    }
    let unknown = a.flags & !GUILD_CUDA_DENSE_ACCUMULATE;
    if unknown != 0 {
        return Err(CallProblem::UnknownFlags(unknown));
    }
    for (value, name) in [(a.rows, "rows"), (a.cols, "cols"), (a.tokens, "tokens")] {
        if value == 0 {
            return Err(CallProblem::Zero(name));
        }
    }
    if let Some(selection) = a.selection {
        if selection.count == 0 {
            return Err(CallProblem::Zero("the selection count"));
        }
        if u64::from(selection.count) > a.rows {
            return Err(CallProblem::SelectionTooLong {
                count: selection.count,
                rows: a.rows,
            });
        }
    }
    let outputs = a.outputs();

    let w_row = a
        .cols
        .checked_mul(w_size)
        .ok_or(CallProblem::Overflow("weights"))?;
    let in_row = a
        .cols
        .checked_mul(in_size)
        .ok_or(CallProblem::Overflow("input"))?;
    let out_row = outputs
        .checked_mul(out_size)
        .ok_or(CallProblem::Overflow("output"))?;
    check_stride("weights", a.weight_row_stride_bytes, w_size, w_row)?;
    check_stride("input", a.input_row_stride_bytes, in_size, in_row)?;
    check_stride("output", a.output_row_stride_bytes, out_size, out_row)?;

    let w_bytes = extent(a.rows, a.weight_row_stride_bytes, w_row, "weights")?;
    let in_bytes = extent(a.tokens, a.input_row_stride_bytes, in_row, "input")?;
    let out_bytes = extent(a.tokens, a.output_row_stride_bytes, out_row, "output")?;
    check_span(&a.weights, "weights", w_size, w_bytes, stream)?;
    check_span(&a.input, "input", in_size, in_bytes, stream)?;
    check_span(&a.output, "output", out_size, out_bytes, stream)?;
    // The bias is indexed by weight row, the selection by output element.
    let mut reads = vec![
        ("weights", a.weights, w_bytes),
        ("input", a.input, in_bytes),
    ];
    if let Some(bias) = a.bias {
        let bytes = a.rows.checked_mul(4).ok_or(CallProblem::Overflow("bias"))?;
        check_span(&bias, "bias", 4, bytes, stream)?;
        reads.push(("bias", bias, bytes));
    }
    if let Some(selection) = a.selection {
        let bytes = u64::from(selection.count) * 4;
        check_span(&selection.rows, "selection", 4, bytes, stream)?;
        reads.push(("selection", selection.rows, bytes));
    }
    // The output is written while the inputs are read: they must not share a byte.
    let out_start = a.output.address();
    for (operand, span, bytes) in reads {
        let start = span.address();
        if start < out_start + out_bytes && out_start < start + bytes {
            return Err(CallProblem::Overlap(operand));
        }
    }

    Ok(guild_cuda_dense_project_args_v1_t {
        struct_size: size_u32::<guild_cuda_dense_project_args_v1_t>(),
        weight_dtype: a.weight_dtype,
        input_dtype: a.input_dtype,
        output_dtype: a.output_dtype,
        flags: a.flags,
        reserved0: 0,
        geometry: guild_cuda_dense_geometry_v1_t {
            rows: a.rows,
            cols: a.cols,
            tokens: a.tokens,
        },
        strides: guild_cuda_dense_strides_v1_t {
            weight_row_stride_bytes: a.weight_row_stride_bytes,
            input_row_stride_bytes: a.input_row_stride_bytes,
            output_row_stride_bytes: a.output_row_stride_bytes,
        },
        selection: guild_cuda_row_selection_v1_t {
            rows: a
                .selection
                .map_or(ptr::null(), |s| s.rows.ptr.cast_const().cast()),
            count: a.selection.map_or(0, |s| s.count),
            reserved: 0,
        },
        weights: a.weights.ptr.cast_const(),
        input: a.input.ptr.cast_const(),
        bias: a.bias.map_or(ptr::null(), |b| b.ptr.cast_const().cast()),
        output: a.output.ptr,
        stream: stream.raw(),
        device_id: stream.device_id,
        reserved1: 0,
    })
}

impl BoundCudaTables {
    fn call_not_offered(&self, callback: &'static str) -> CudaCallError {
        CudaCallError::NotOffered {
            impl_id: self.impl_id().clone(),
            callback,
        }
    }

    fn refused(&self, callback: &'static str, problem: CallProblem) -> CudaCallError {
        CudaCallError::Refused {
            impl_id: self.impl_id().clone(),
            callback,
            problem,
        }
    }

    /// Runs one execution callback, `f`, named `callback`, with `args`, and turns a failure into
    /// [`CudaCallError::Provider`].
    ///
    /// # Safety
    ///
    /// As for `Callback::call`: the table `f` came from is still bound, and `args` is what the
    /// callback's header asks of the host.
    unsafe fn enqueue<A>(
        &self,
        callback: &'static str,
        f: Callback<A>,
        args: &A,
    ) -> Result<(), CudaCallError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { f.call(args) }.map_err(|reason| CudaCallError::Provider {
            impl_id: self.impl_id().clone(),
            callback,
            reason,
        })
    }

    /// Enqueues CDD1 `project` on `stream` and returns without waiting for it: the result is in
    /// `args.output` once the stream's work up to here has completed. Refused, with nothing
    /// enqueued, when the kernel offers no `project` or the arguments do not fit (see the
    /// module's documentation and [`CallProblem`]); the provider's own refusal comes back as
    /// [`CudaCallError::Provider`]. With `GUILD_CUDA_DENSE_CAP_GRAPH_CAPTURABLE` in the table's
    /// capabilities the call may be made while `stream` is capturing a graph.
    pub fn project(&self, stream: &CudaStream, args: &DenseProject) -> Result<(), CudaCallError> {
        const NAME: &str = "project";
        let (dense, f) =
            offered(&self.dense, |t| t.project).ok_or_else(|| self.call_not_offered(NAME))?;
        let raw = project_args(dense.capabilities, args, stream)
            .map_err(|problem| self.refused(NAME, problem))?;
        // SAFETY: the callback is loaded while `self.binding` lives; `raw` is a live local read
        // during the call only. Every address in it was checked above to be non-NULL, aligned,
        // on the stream's device and large enough for what the geometry and strides reach; the
        // spans' and the stream's constructors carry the promise that the memory and the stream
        // are valid for the enqueued work until it completes.
        unsafe { self.enqueue(NAME, f, &raw) }
    }
}

/// One CDM1 `elementwise`: `out[r][c] = op(a[r][c], b[r][c])` over `rows` x `cols`, in F32
/// per element (the `GUILD_CUDA_EW_*` operations). `b` is given exactly for the binary
/// operations; a `b_row_stride_bytes` of 0 broadcasts its first row; `out` may be `a` or `b`
/// itself (same address, stride and dtype). Start from [`Elementwise::f32`] for packed F32 rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Elementwise {
    /// `GUILD_CUDA_EW_*`.
    pub op: u32,
    /// `GUILD_DTYPE_F32`, `GUILD_DTYPE_F16` or `GUILD_DTYPE_BF16` of `a`.
    pub a_dtype: u32,
    /// The same for `b` (ignored without `b`).
    pub b_dtype: u32,
    /// The same for `out`.
    pub out_dtype: u32,
    /// Rows.
    pub rows: u64,
    /// Elements per row.
    pub cols: u64,
    /// The scalar of SCALE and AXPY.
    pub alpha: f32,
    /// The offset of SCALE.
    pub beta: f32,
    /// The first operand.
    pub a: DeviceSpan,
    /// Bytes between rows of `a`.
    pub a_row_stride_bytes: u64,
    /// The second operand of a binary operation.
    pub b: Option<DeviceSpan>,
    /// Bytes between rows of `b`; 0 broadcasts its first row.
    pub b_row_stride_bytes: u64,
    /// The result.
    pub out: DeviceSpan,
    /// Bytes between rows of `out`.
    pub out_row_stride_bytes: u64,
}

impl Elementwise {
    /// `op` over F32 operands in packed rows, `alpha` 1 and `beta` 0.
    pub fn f32(
        op: u32,
        rows: u64,
        cols: u64,
        a: DeviceSpan,
        b: Option<DeviceSpan>,
        out: DeviceSpan,
    ) -> Self {
        let row = cols.saturating_mul(4);
        Elementwise {
            op,
            a_dtype: GUILD_DTYPE_F32,
            b_dtype: GUILD_DTYPE_F32,
            out_dtype: GUILD_DTYPE_F32,
            rows,
            cols,
            alpha: 1.0,
            beta: 0.0,
            a,
            a_row_stride_bytes: row,
            b,
            b_row_stride_bytes: row,
            out,
            out_row_stride_bytes: row,
        }
    }
}

/// Whether a `GUILD_CUDA_EW_*` operation takes `b`; `None` for an unknown code.
fn elementwise_binary(op: u32) -> Option<bool> {
    match op {
        GUILD_CUDA_EW_ADD
        | GUILD_CUDA_EW_MUL
        | GUILD_CUDA_EW_SWIGLU
        | GUILD_CUDA_EW_GEGLU
        | GUILD_CUDA_EW_SIGMOID_MUL
        | GUILD_CUDA_EW_AXPY => Some(true),
        GUILD_CUDA_EW_SCALE | GUILD_CUDA_EW_COPY | GUILD_CUDA_EW_SILU | GUILD_CUDA_EW_GELU => {
            Some(false)
        }
        _ => None,
    }
}

/// The element size of an elementwise dtype.
fn elementwise_element(operand: &'static str, dtype: u32) -> Result<u64, CallProblem> {
    match dtype {
        GUILD_DTYPE_F32 => Ok(4),
        GUILD_DTYPE_F16 | GUILD_DTYPE_BF16 => Ok(2),
        _ => Err(CallProblem::Dtype {
            operand,
            dtype,
            allowed: "F32, F16 or BF16",
        }),
    }
}

/// Checks an [`Elementwise`] against the stream and builds the callback's arguments.
fn elementwise_args(
    e: &Elementwise,
    stream: &CudaStream,
) -> Result<guild_cuda_elementwise_args_v1_t, CallProblem> {
    let binary = elementwise_binary(e.op).ok_or(CallProblem::UnknownOp(e.op))?;
    match (binary, e.b.is_some()) {
        (true, false) => {
            return Err(CallProblem::Missing {
                op: e.op,
                operand: "b",
            })
        }
        (false, true) => {
            return Err(CallProblem::Unexpected {
                op: e.op,
                operand: "b",
            })
        }
        _ => {}
    }
    let a_size = elementwise_element("a", e.a_dtype)?;
    let b_size = if binary {
        elementwise_element("b", e.b_dtype)?
    } else {
        0
    };
    let out_size = elementwise_element("out", e.out_dtype)?;
    for (value, name) in [(e.rows, "rows"), (e.cols, "cols")] {
        if value == 0 {
            return Err(CallProblem::Zero(name));
        }
    }
    let row = |size: u64, operand| {
        e.cols
            .checked_mul(size)
            .ok_or(CallProblem::Overflow(operand))
    };
    let a_row = row(a_size, "a")?;
    let out_row = row(out_size, "out")?;
    check_stride("a", e.a_row_stride_bytes, a_size, a_row)?;
    check_stride("out", e.out_row_stride_bytes, out_size, out_row)?;
    let a_bytes = extent(e.rows, e.a_row_stride_bytes, a_row, "a")?;
    let out_bytes = extent(e.rows, e.out_row_stride_bytes, out_row, "out")?;
    check_span(&e.a, "a", a_size, a_bytes, stream)?;
    check_span(&e.out, "out", out_size, out_bytes, stream)?;
    let mut reads = vec![("a", e.a, a_bytes, e.a_row_stride_bytes, e.a_dtype)];
    if let Some(b) = e.b {
        let b_row = row(b_size, "b")?;
        // A stride of 0 broadcasts the first row; any other stride is a row of its own.
        let b_bytes = if e.b_row_stride_bytes == 0 {
            b_row
        } else {
            check_stride("b", e.b_row_stride_bytes, b_size, b_row)?;
            extent(e.rows, e.b_row_stride_bytes, b_row, "b")?
        };
        check_span(&b, "b", b_size, b_bytes, stream)?;
        reads.push(("b", b, b_bytes, e.b_row_stride_bytes, e.b_dtype));
    }
    // out may be an input in place; otherwise it must not share a byte with one.
    let out_start = e.out.address();
    for (operand, span, bytes, stride, dtype) in reads {
        let start = span.address();
        let in_place =
            start == out_start && stride == e.out_row_stride_bytes && dtype == e.out_dtype;
        if !in_place && start < out_start + out_bytes && out_start < start + bytes {
            return Err(CallProblem::PartialOverlap(operand));
        }
    }
    Ok(guild_cuda_elementwise_args_v1_t {
        struct_size: size_u32::<guild_cuda_elementwise_args_v1_t>(),
        op: e.op,
        a_dtype: e.a_dtype,
        b_dtype: if binary { e.b_dtype } else { 0 },
        out_dtype: e.out_dtype,
        reserved0: 0,
        rows: e.rows,
        cols: e.cols,
        alpha: e.alpha,
        beta: e.beta,
        a: e.a.ptr.cast_const(),
        a_row_stride_bytes: e.a_row_stride_bytes,
        b: e.b.map_or(ptr::null(), |b| b.ptr.cast_const()),
        b_row_stride_bytes: if binary { e.b_row_stride_bytes } else { 0 },
        out: e.out.ptr,
        out_row_stride_bytes: e.out_row_stride_bytes,
        stream: stream.raw(),
        device_id: stream.device_id,
        reserved1: 0,
    })
}

impl BoundCudaTables {
    /// Enqueues CDM1 `elementwise` on `stream` and returns without waiting, as
    /// [`BoundCudaTables::project`] does: refused, with nothing enqueued, when the kernel offers
    /// no `elementwise`, the operation is unknown, `b` is missing for a binary operation or given
    /// for a unary one, or an operand does not fit (dtype, zero or overflowing geometry, stride,
    /// device, alignment, size, or an overlap other than exactly in place). With
    /// `GUILD_CUDA_MOE_CAP_GRAPH_CAPTURABLE` the call may be captured into a graph.
    pub fn elementwise(
        &self,
        stream: &CudaStream,
        args: &Elementwise,
    ) -> Result<(), CudaCallError> {
        const NAME: &str = "elementwise";
        let (_, f) =
            offered(&self.moe, |t| t.elementwise).ok_or_else(|| self.call_not_offered(NAME))?;
        let raw = elementwise_args(args, stream).map_err(|problem| self.refused(NAME, problem))?;
        // SAFETY: the callback is loaded while `self.binding` lives; `raw` is a live local read
        // during the call only; every address in it was checked above against the bytes the
        // geometry reaches on the stream's device, and the spans' and the stream's constructors
        // carry the promise that the memory and the stream stay valid for the enqueued work.
        unsafe { self.enqueue(NAME, f, &raw) }
    }
}

/// A layer's KV cache on the device, as CDA1's `guild_cuda_kv_cache_view_v1_t` describes it:
/// `block_count` blocks of `block_size` positions of `n_head_kv` heads, for keys and values.
/// Position `p` of sequence `s` lives in block `block_table[s * max_blocks_per_seq + p /
/// block_size]`, or `s * max_blocks_per_seq + p / block_size` without a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheView {
    /// `GUILD_DTYPE_F16`, `GUILD_DTYPE_BF16` or `GUILD_DTYPE_Q8_0`, and one of the table's
    /// `kv_cache_dtypes`.
    pub dtype: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Elements per key head.
    pub head_dim_k: u32,
    /// Elements per value head.
    pub head_dim_v: u32,
    /// Positions per block.
    pub block_size: u32,
    /// The layer, for the provider's diagnostics and per-layer configuration.
    pub layer_index: u32,
    /// Entries per sequence row of the block table.
    pub max_blocks_per_seq: u32,
    /// Physical blocks in the pool.
    pub block_count: u64,
    /// The key blocks (written).
    pub k_blocks: DeviceSpan,
    /// The value blocks (written).
    pub v_blocks: DeviceSpan,
    /// Bytes between key blocks.
    pub k_block_stride_bytes: u64,
    /// Bytes between value blocks.
    pub v_block_stride_bytes: u64,
    /// Bytes between positions within a key block.
    pub k_position_stride_bytes: u64,
    /// Bytes between positions within a value block.
    pub v_position_stride_bytes: u64,
    /// Bytes between heads within a key position.
    pub k_head_stride_bytes: u64,
    /// Bytes between heads within a value position.
    pub v_head_stride_bytes: u64,
    /// The block table, `[n_seqs][max_blocks_per_seq]` `i32`s, or none.
    pub block_table: Option<DeviceSpan>,
}

/// One CDA1 `kv_append`: write `n_tokens` new key and value rows into `cache` at each token's
/// (sequence, position), converting to the cache's dtype. The sequence and position of each
/// token, and the block table's entries, are device data the host cannot read: a provider has
/// to bound what it reads and writes by them itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvAppend {
    /// `GUILD_DTYPE_F32`, `GUILD_DTYPE_F16` or `GUILD_DTYPE_BF16` of `k` and `v`.
    pub src_dtype: u32,
    /// Tokens to append.
    pub n_tokens: u32,
    /// The layer's cache.
    pub cache: KvCacheView,
    /// `n_tokens` rows of `n_head_kv * head_dim_k` keys.
    pub k: DeviceSpan,
    /// `n_tokens` rows of `n_head_kv * head_dim_v` values.
    pub v: DeviceSpan,
    /// Bytes between key rows.
    pub k_token_stride_bytes: u64,
    /// Bytes between value rows.
    pub v_token_stride_bytes: u64,
    /// `n_tokens` `i32` sequence ids.
    pub token_seqs: DeviceSpan,
    /// `n_tokens` `i32` positions within their sequences.
    pub token_positions: DeviceSpan,
}

/// The bytes and alignment of one cached head of `dim` elements in `dtype`.
fn cache_head(dtype: u32, dim: u32, what: &'static str) -> Result<(u64, u64), CallProblem> {
    let dim = u64::from(dim);
    match dtype {
        GUILD_DTYPE_F16 | GUILD_DTYPE_BF16 => Ok((dim * 2, 2)),
        // GGML Q8_0: 32 int8 quants after an F16 scale, 34 bytes a block.
        GUILD_DTYPE_Q8_0 => {
            if !dim.is_multiple_of(32) {
                return Err(CallProblem::NotMultiple {
                    what,
                    value: dim,
                    of: 32,
                });
            }
            Ok((dim / 32 * 34, 2))
        }
        _ => Err(CallProblem::Dtype {
            operand: "cache",
            dtype,
            allowed: "F16, BF16 or Q8_0",
        }),
    }
}

/// Checks one side (keys or values) of a cache: its strides nest (heads within a position,
/// positions within a block) and its blocks hold `block_count` blocks. Returns the bytes.
#[allow(clippy::too_many_arguments)]
fn check_cache_side(
    operand: &'static str,
    c: &KvCacheView,
    blocks: &DeviceSpan,
    (head_bytes, align): (u64, u64),
    head_stride: u64,
    position_stride: u64,
    block_stride: u64,
    stream: &CudaStream,
) -> Result<u64, CallProblem> {
    check_stride(operand, head_stride, align, head_bytes)?;
    let position_bytes = extent(u64::from(c.n_head_kv), head_stride, head_bytes, operand)?;
    check_stride(operand, position_stride, align, position_bytes)?;
    let block_bytes = extent(
        u64::from(c.block_size),
        position_stride,
        position_bytes,
        operand,
    )?;
    check_stride(operand, block_stride, align, block_bytes)?;
    let bytes = extent(c.block_count, block_stride, block_bytes, operand)?;
    check_span(blocks, operand, align, bytes, stream)?;
    Ok(bytes)
}

/// Whether two byte ranges share a byte (both already checked not to overflow).
fn overlaps((a, a_bytes): (u64, u64), (b, b_bytes): (u64, u64)) -> bool {
    a < b + b_bytes && b < a + a_bytes
}

/// Checks a [`KvAppend`] against the table's cache dtypes and the stream, and builds the
/// callback's arguments (and the cache view they point at).
fn kv_append_args(
    kv_cache_dtypes: u64,
    a: &KvAppend,
    stream: &CudaStream,
) -> Result<
    (
        guild_cuda_kv_append_args_v1_t,
        guild_cuda_kv_cache_view_v1_t,
    ),
    CallProblem,
> {
    let c = &a.cache;
    let src_size = elementwise_element("k and v", a.src_dtype)?;
    let k_head = cache_head(c.dtype, c.head_dim_k, "head_dim_k")?;
    let v_head = cache_head(c.dtype, c.head_dim_v, "head_dim_v")?;
    if c.dtype >= 64 || kv_cache_dtypes & (1u64 << c.dtype) == 0 {
        return Err(CallProblem::CacheDtypeNotDeclared(c.dtype));
    }
    for (value, name) in [
        (u64::from(a.n_tokens), "n_tokens"),
        (u64::from(c.n_head_kv), "n_head_kv"),
        (u64::from(c.head_dim_k), "head_dim_k"),
        (u64::from(c.head_dim_v), "head_dim_v"),
        (u64::from(c.block_size), "block_size"),
        (u64::from(c.max_blocks_per_seq), "max_blocks_per_seq"),
        (c.block_count, "block_count"),
    ] {
        if value == 0 {
            return Err(CallProblem::Zero(name));
        }
    }
    let tokens = u64::from(a.n_tokens);
    let heads = u64::from(c.n_head_kv);
    // The source rows: every head of a token, back to back.
    let row = |dim: u32, operand| {
        heads
            .checked_mul(u64::from(dim))
            .and_then(|n| n.checked_mul(src_size))
            .ok_or(CallProblem::Overflow(operand))
    };
    let k_row = row(c.head_dim_k, "k")?;
    let v_row = row(c.head_dim_v, "v")?;
    check_stride("k", a.k_token_stride_bytes, src_size, k_row)?;
    check_stride("v", a.v_token_stride_bytes, src_size, v_row)?;
    let k_bytes = extent(tokens, a.k_token_stride_bytes, k_row, "k")?;
    let v_bytes = extent(tokens, a.v_token_stride_bytes, v_row, "v")?;
    check_span(&a.k, "k", src_size, k_bytes, stream)?;
    check_span(&a.v, "v", src_size, v_bytes, stream)?;
    check_span(&a.token_seqs, "token_seqs", 4, tokens * 4, stream)?;
    check_span(&a.token_positions, "token_positions", 4, tokens * 4, stream)?;
    // The cache: every block the view describes must be there.
    let kb_bytes = check_cache_side(
        "k_blocks",
        c,
        &c.k_blocks,
        k_head,
        c.k_head_stride_bytes,
        c.k_position_stride_bytes,
        c.k_block_stride_bytes,
        stream,
    )?;
    let vb_bytes = check_cache_side(
        "v_blocks",
        c,
        &c.v_blocks,
        v_head,
        c.v_head_stride_bytes,
        c.v_position_stride_bytes,
        c.v_block_stride_bytes,
        stream,
    )?;
    let mut reads = vec![
        ("k", a.k, k_bytes),
        ("v", a.v, v_bytes),
        ("token_seqs", a.token_seqs, tokens * 4),
        ("token_positions", a.token_positions, tokens * 4),
    ];
    if let Some(table) = c.block_table {
        // At least one sequence's row; which rows a token reaches is device data.
        let row = u64::from(c.max_blocks_per_seq) * 4;
        check_span(&table, "block_table", 4, row, stream)?;
        reads.push(("block_table", table, table.bytes()));
    }
    let writes = [
        ("k_blocks", c.k_blocks, kb_bytes),
        ("v_blocks", c.v_blocks, vb_bytes),
    ];
    if overlaps(
        (c.k_blocks.address(), kb_bytes),
        (c.v_blocks.address(), vb_bytes),
    ) {
        return Err(CallProblem::WritesOverlap("k_blocks", "v_blocks"));
    }
    for (written, w, w_bytes) in writes {
        for (read, r, r_bytes) in &reads {
            if overlaps((w.address(), w_bytes), (r.address(), *r_bytes)) {
                return Err(CallProblem::WritesOverlap(written, read));
            }
        }
    }
    let view = guild_cuda_kv_cache_view_v1_t {
        struct_size: size_u32::<guild_cuda_kv_cache_view_v1_t>(),
        dtype: c.dtype,
        n_head_kv: c.n_head_kv,
        head_dim_k: c.head_dim_k,
        head_dim_v: c.head_dim_v,
        block_size: c.block_size,
        layer_index: c.layer_index,
        max_blocks_per_seq: c.max_blocks_per_seq,
        block_count: c.block_count,
        k_blocks: c.k_blocks.ptr,
        v_blocks: c.v_blocks.ptr,
        k_block_stride_bytes: c.k_block_stride_bytes,
        v_block_stride_bytes: c.v_block_stride_bytes,
        k_position_stride_bytes: c.k_position_stride_bytes,
        v_position_stride_bytes: c.v_position_stride_bytes,
        k_head_stride_bytes: c.k_head_stride_bytes,
        v_head_stride_bytes: c.v_head_stride_bytes,
        block_table: c
            .block_table
            .map_or(ptr::null(), |t| t.ptr.cast_const().cast()),
    };
    let args = guild_cuda_kv_append_args_v1_t {
        struct_size: size_u32::<guild_cuda_kv_append_args_v1_t>(),
        src_dtype: a.src_dtype,
        n_tokens: a.n_tokens,
        reserved0: 0,
        // Pointed at the caller's copy of `view` just before the call.
        cache: ptr::null(),
        k: a.k.ptr.cast_const(),
        v: a.v.ptr.cast_const(),
        k_token_stride_bytes: a.k_token_stride_bytes,
        v_token_stride_bytes: a.v_token_stride_bytes,
        token_seqs: a.token_seqs.ptr.cast_const().cast(),
        token_positions: a.token_positions.ptr.cast_const().cast(),
        stream: stream.raw(),
        device_id: stream.device_id,
        reserved1: 0,
    };
    Ok((args, view))
}

impl BoundCudaTables {
    /// Enqueues CDA1 `kv_append` on `stream` and returns without waiting, as
    /// [`BoundCudaTables::project`] does: refused, with nothing enqueued, when the kernel offers
    /// no `kv_append`, the source or cache dtype is not one it takes (the cache's must be among
    /// the table's `kv_cache_dtypes`), a dimension is zero, a stride is misaligned or shorter
    /// than what it steps over (source rows, and cache heads within positions within blocks),
    /// a span is off the stream's device, NULL, misaligned or smaller than what the view
    /// describes, or the cache overlaps a source or itself. Which blocks the tokens land in is
    /// device data (see [`KvAppend`]). With `GUILD_CUDA_ATTN_CAP_GRAPH_CAPTURABLE` the call may
    /// be captured into a graph.
    pub fn kv_append(&self, stream: &CudaStream, args: &KvAppend) -> Result<(), CudaCallError> {
        const NAME: &str = "kv_append";
        let (attn, f) =
            offered(&self.attn, |t| t.kv_append).ok_or_else(|| self.call_not_offered(NAME))?;
        let (mut raw, view) = kv_append_args(attn.kv_cache_dtypes, args, stream)
            .map_err(|problem| self.refused(NAME, problem))?;
        raw.cache = &view;
        // SAFETY: the callback is loaded while `self.binding` lives; `raw` and the `view` it
        // points at are live locals read during the call only; every device address in them was
        // checked above against the bytes the view and the rows reach on the stream's device,
        // and the spans' and the stream's constructors carry the promise that the memory and the
        // stream stay valid for the enqueued work.
        unsafe { self.enqueue(NAME, f, &raw) }
    }
}
