//! Helpers for tests that need a GPU: finding one (or saying clearly why a test skips), device
//! and managed memory, non-default streams, PTX modules and launches, and graph capture.
//!
//! Every helper works in the device's primary context, as [`CudaStreams`](crate::CudaStreams)
//! and the CUDA test module do, and makes it current on the calling thread for each driver call,
//! so the helpers may be used from any thread. Nothing here exposes a cudarc type: streams,
//! buffers and graphs are handed out as the addresses the C ABI passes around.
//!
//! # Skipping
//!
//! [`gpu_or_skip`] returns the device, or prints `<test>: skipped: <reason>` to the test's
//! stderr (bypassing libtest's capture, so the line shows in every run) and returns `None`.
//! With `REQUIRE_GPU=1` in the environment it panics instead, so that a machine that should have
//! a GPU fails loudly.

use std::ffi::{c_void, CString};
use std::fmt;
use std::io::Write;
use std::sync::Arc;

use cudarc::driver::result;
use cudarc::driver::sys;

use crate::context::Primary;
use crate::driver::{call, CudaError, DeviceInfo, Driver};

pub mod fake_driver;

/// A kernel for tests: `add_one(u64 data, u64 n)` adds 1 to each of `n` u32 values at `data`,
/// in order, on one thread (launch it with one thread).
pub const ADD_ONE_PTX: &str = "\
.version 6.0
.target sm_50
.address_size 64

.visible .entry add_one(
    .param .u64 p_data,
    .param .u64 p_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<6>;

    ld.param.u64 %rd1, [p_data];
    ld.param.u64 %rd2, [p_n];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u64 %rd3, 0;
LOOP:
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra DONE;
    shl.b64 %rd4, %rd3, 2;
    add.u64 %rd5, %rd1, %rd4;
    ld.global.u32 %r1, [%rd5];
    add.u32 %r2, %r1, 1;
    st.global.u32 [%rd5], %r2;
    add.u64 %rd3, %rd3, 1;
    bra LOOP;
DONE:
    ret;
}
";

/// Whether `REQUIRE_GPU` asks for GPU tests to fail instead of skipping.
pub fn gpu_required() -> bool {
    std::env::var("REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Says, on the real stderr, that `test` skipped and why (see the module documentation).
pub fn report_skip(test: &str, reason: &dyn fmt::Display) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{test}: skipped: {reason}");
}

/// Device 0, or `None` after reporting why `test` skips; panics instead when
/// [`gpu_required`].
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) if gpu_required() => {
            panic!("{test}: REQUIRE_GPU is set and there is no usable GPU: {e}")
        }
        Err(e) => {
            report_skip(test, &e);
            None
        }
    }
}

/// A device with its primary context retained.
#[derive(Clone)]
pub struct Gpu {
    driver: Driver,
    info: DeviceInfo,
    primary: Arc<Primary>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

impl Gpu {
    /// Opens device `ordinal`, retains its primary context and makes it current on this thread.
    pub fn open(ordinal: i32) -> Result<Gpu, CudaError> {
        let driver = Driver::load()?;
        let info = driver.device(ordinal)?;
        let primary = Arc::new(Primary::retain(driver, ordinal)?);
        primary.make_current()?;
        Ok(Gpu {
            driver,
            info,
            primary,
        })
    }

    /// The opened driver.
    pub fn driver(&self) -> Driver {
        self.driver
    }

    /// What the driver says about the device.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.info.ordinal
    }

    /// Makes the primary context current on the calling thread (as a runtime-API caller has it
    /// after `cudaSetDevice`).
    pub fn make_current(&self) -> Result<(), CudaError> {
        self.primary.make_current()
    }

    /// `bytes` of device memory, uninitialised.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a plain allocation in the current (primary) context; freed in Drop.
        let ptr = call("cuMemAlloc_v2", unsafe {
            result::malloc_sync(bytes.max(1))
        })?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            managed: false,
            primary: Arc::clone(&self.primary),
        })
    }

    /// `bytes` of managed memory, attached globally, uninitialised.
    pub fn alloc_managed(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a plain allocation in the current (primary) context; freed in Drop.
        let ptr = call("cuMemAllocManaged", unsafe {
            result::malloc_managed(bytes.max(1), sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL)
        })?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            managed: true,
            primary: Arc::clone(&self.primary),
        })
    }

    /// Device memory holding a copy of `data`.
    pub fn upload<T: Plain>(&self, data: &[T]) -> Result<DeviceBuffer, CudaError> {
        let buffer = self.alloc(size_of_val(data))?;
        buffer.write(data)?;
        Ok(buffer)
    }

    /// A new stream that does not synchronise with the legacy default stream (so that nothing
    /// but the work enqueued on it, or an explicit wait, decides when its work has finished).
    pub fn stream(&self) -> Result<Stream, CudaError> {
        let _current = self.primary.push()?;
        let raw = call(
            "cuStreamCreate",
            result::stream::create(result::stream::StreamKind::NonBlocking),
        )?;
        Ok(Stream {
            raw,
            primary: Arc::clone(&self.primary),
        })
    }

    /// Loads a module from PTX text (JIT-compiled by the driver for this device).
    pub fn load_ptx(&self, ptx: &str) -> Result<Module, CudaError> {
        let image = CString::new(ptx)
            .map_err(|_| CudaError::Misuse("PTX text contains a NUL byte".to_string()))?;
        let _current = self.primary.push()?;
        // SAFETY: `image` is NUL-terminated PTX text that lives for the call; the driver copies
        // what it compiles.
        let raw = call("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr().cast())
        })?;
        Ok(Module {
            raw,
            primary: Arc::clone(&self.primary),
        })
    }
}

/// Element types whose every bit pattern is a value, so copies to and from the device are
/// plain byte copies.
pub trait Plain: Copy + Default + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(u8, i32, u32, i64, u64, f32, f64);

/// Device or managed memory; freed when dropped.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    managed: bool,
    primary: Arc<Primary>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("address", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .field("managed", &self.managed)
            .finish()
    }
}

impl DeviceBuffer {
    /// The device address (what a tensor descriptor's `data` holds).
    pub fn address(&self) -> u64 {
        self.ptr
    }

    /// The device address as the pointer a tensor descriptor carries.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr as usize as *mut c_void
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether this is managed memory (readable from the host once the device is done).
    pub fn is_managed(&self) -> bool {
        self.managed
    }

    fn check_size(&self, bytes: usize) -> Result<(), CudaError> {
        if bytes == self.bytes {
            Ok(())
        } else {
            Err(CudaError::Misuse(format!(
                "copying {bytes} bytes to or from a buffer of {} bytes",
                self.bytes
            )))
        }
    }

    /// Copies `data` into the whole buffer and waits until it has landed. The copy is ordered
    /// after the legacy default stream's work only: callers synchronise the streams that use
    /// the buffer first.
    pub fn write<T: Plain>(&self, data: &[T]) -> Result<(), CudaError> {
        self.check_size(size_of_val(data))?;
        let _current = self.primary.push()?;
        // SAFETY: the buffer holds exactly `size_of_val(data)` bytes (checked) and is live.
        call("cuMemcpyHtoD_v2", unsafe {
            result::memcpy_htod_sync(self.ptr, data)
        })?;
        // A copy from pageable memory may return once the data is staged, before it reaches the
        // device; work on a non-blocking stream would not wait for the rest. The copy went on the
        // legacy default stream, so waiting for that stream waits for the copy.
        // SAFETY: the legacy default stream of the current (primary) context.
        call("cuStreamSynchronize", unsafe {
            result::stream::synchronize(std::ptr::null_mut())
        })
    }

    /// Copies the whole buffer out as `len` elements. As with `write`, callers synchronise the
    /// streams that write the buffer first.
    pub fn read<T: Plain>(&self, len: usize) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); len];
        self.check_size(size_of_val(out.as_slice()))?;
        let _current = self.primary.push()?;
        // SAFETY: the buffer holds exactly as many bytes as `out` (checked); `T` is `Plain`, so
        // any bytes the device wrote are a valid `T`.
        call("cuMemcpyDtoH_v2", unsafe {
            result::memcpy_dtoh_sync(&mut out, self.ptr)
        })?;
        Ok(out)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _current = self.primary.push();
        // SAFETY: allocated by `Gpu::alloc`/`alloc_managed` and freed exactly once. The caller
        // has waited for the work that uses it (cuMemFree would wait for it anyway).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A non-blocking stream of the device's primary context; destroyed when dropped.
pub struct Stream {
    raw: sys::CUstream,
    primary: Arc<Primary>,
}

// SAFETY: a CUstream is a driver handle that any thread may use; the driver orders the work.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:#x})", self.address())
    }
}

impl Stream {
    /// The stream as a `guild_stream_t` holds it.
    pub fn address(&self) -> usize {
        self.raw as usize
    }

    /// Blocks until the stream's work has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a live stream created by `Gpu::stream`.
        call("cuStreamSynchronize", unsafe {
            result::stream::synchronize(self.raw)
        })
    }

    /// Whether every piece of work enqueued so far has finished, without waiting.
    pub fn is_idle(&self) -> Result<bool, CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a live stream created by `Gpu::stream`.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => call("cuStreamQuery", other.result()).map(|()| false),
        }
    }

    /// Starts capturing the stream's work into a graph. The capture mode is thread-local: only
    /// this thread is barred from calls that are unsafe during capture, so that other tests
    /// running at the same time are not disturbed.
    pub fn begin_capture(&self) -> Result<(), CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a live stream created by `Gpu::stream`, not capturing yet.
        call("cuStreamBeginCapture_v2", unsafe {
            result::stream::begin_capture(
                self.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })
    }

    /// Ends the capture and returns the graph it recorded.
    pub fn end_capture(&self) -> Result<Graph, CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a live stream that `begin_capture` started capturing on this thread.
        let raw = call("cuStreamEndCapture", unsafe {
            result::stream::end_capture(self.raw)
        })?;
        if raw.is_null() {
            return Err(CudaError::Misuse(
                "the capture ended without a graph".to_string(),
            ));
        }
        Ok(Graph {
            raw,
            primary: Arc::clone(&self.primary),
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _current = self.primary.push();
        // SAFETY: created by `Gpu::stream` and destroyed exactly once; pending work still
        // completes (the driver releases the stream afterwards).
        let _ = unsafe { result::stream::destroy(self.raw) };
    }
}

/// A captured graph; destroyed by [`Graph::destroy`] or when dropped.
pub struct Graph {
    raw: sys::CUgraph,
    primary: Arc<Primary>,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Graph({:p})", self.raw)
    }
}

impl Graph {
    /// Instantiates the graph for launching.
    pub fn instantiate(&self) -> Result<GraphExec, CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a live graph from `Stream::end_capture`.
        let raw = call("cuGraphInstantiateWithFlags", unsafe {
            result::graph::instantiate(self.raw, sys::CUgraphInstantiate_flags(0))
        })?;
        Ok(GraphExec {
            raw,
            primary: Arc::clone(&self.primary),
        })
    }

    /// Destroys the graph, reporting the driver's answer.
    pub fn destroy(mut self) -> Result<(), CudaError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        let _current = self.primary.push()?;
        // SAFETY: a live graph, destroyed exactly once (Drop skips the NULL left behind).
        call("cuGraphDestroy", unsafe { result::graph::destroy(raw) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let _current = self.primary.push();
        // SAFETY: a live graph, destroyed exactly once.
        let _ = unsafe { result::graph::destroy(self.raw) };
    }
}

/// An instantiated graph; destroyed by [`GraphExec::destroy`] or when dropped.
pub struct GraphExec {
    raw: sys::CUgraphExec,
    primary: Arc<Primary>,
}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GraphExec({:p})", self.raw)
    }
}

impl GraphExec {
    /// Enqueues one execution of the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<(), CudaError> {
        let _current = self.primary.push()?;
        // SAFETY: a live executable graph and a live stream of the same context.
        call("cuGraphLaunch", unsafe {
            result::graph::launch(self.raw, stream.raw)
        })
    }

    /// Destroys the executable graph, reporting the driver's answer. Executions already
    /// enqueued still complete.
    pub fn destroy(mut self) -> Result<(), CudaError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        let _current = self.primary.push()?;
        // SAFETY: a live executable graph, destroyed exactly once (Drop skips the NULL).
        call("cuGraphExecDestroy", unsafe {
            result::graph::exec_destroy(raw)
        })
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let _current = self.primary.push();
        // SAFETY: a live executable graph, destroyed exactly once.
        let _ = unsafe { result::graph::exec_destroy(self.raw) };
    }
}

/// A loaded module; unloaded when dropped.
pub struct Module {
    raw: sys::CUmodule,
    primary: Arc<Primary>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Module({:p})", self.raw)
    }
}

impl Module {
    /// The kernel `name` of this module.
    pub fn function(&self, name: &str) -> Result<Kernel<'_>, CudaError> {
        let c_name = CString::new(name)
            .map_err(|_| CudaError::Misuse(format!("kernel name {name:?} contains a NUL byte")))?;
        let _current = self.primary.push()?;
        // SAFETY: a live module; the name is NUL-terminated and lives for the call.
        let raw = call("cuModuleGetFunction", unsafe {
            result::module::get_function(self.raw, c_name)
        })?;
        Ok(Kernel { raw, module: self })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _current = self.primary.push();
        // SAFETY: loaded by `Gpu::load_ptx` and unloaded exactly once; kernels borrow the
        // module, so none outlives it.
        let _ = unsafe { result::module::unload(self.raw) };
    }
}

/// A kernel of a loaded module.
pub struct Kernel<'m> {
    raw: sys::CUfunction,
    module: &'m Module,
}

impl fmt::Debug for Kernel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernel({:p})", self.raw)
    }
}

impl Kernel<'_> {
    /// Enqueues the kernel on `stream` with one block of `threads` threads.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, in order, each pointing at a value
    /// of exactly that parameter's type; every device address among the values must stay valid
    /// (and be used as the kernel expects) until the launched work has finished.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        threads: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let _current = self.module.primary.push()?;
        // SAFETY: the function belongs to a live module of the current context and the stream
        // to the same context; the caller vouches for the parameters.
        call("cuLaunchKernel", unsafe {
            result::launch_kernel(self.raw, (1, 1, 1), (threads, 1, 1), 0, stream.raw, params)
        })
    }
}
