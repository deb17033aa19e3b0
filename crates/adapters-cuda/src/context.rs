//! Contexts: the primary context of a device, retained for as long as something here uses it,
//! and a guard that makes a context current on the calling thread for the length of a call.
//!
//! Everything in this crate (and the CUDA test module, which does the same in C) works in the
//! device's *primary* context, the one the CUDA runtime uses: a caller's stream made with the
//! runtime API lives there, so events recorded on it and kernels launched on it agree.

use std::fmt;
use std::ptr;

use cudarc::driver::result;
use cudarc::driver::sys;

use crate::driver::{call, CudaError, Driver};

/// A retained primary context of one device; released when dropped.
pub(crate) struct Primary {
    pub(crate) ordinal: i32,
    pub(crate) device: sys::CUdevice,
    pub(crate) ctx: sys::CUcontext,
}

// SAFETY: a CUcontext and a CUdevice are driver handles that any thread may pass to the driver;
// the driver serialises what needs serialising.
unsafe impl Send for Primary {}
// SAFETY: as above; `Primary` has no interior mutability.
unsafe impl Sync for Primary {}

impl fmt::Debug for Primary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Primary")
            .field("ordinal", &self.ordinal)
            .field("ctx", &self.ctx)
            .finish()
    }
}

impl Primary {
    /// Retains the primary context of device `ordinal`.
    pub(crate) fn retain(driver: Driver, ordinal: i32) -> Result<Primary, CudaError> {
        let device = driver.device_handle(ordinal)?;
        // SAFETY: `device` is a valid handle from the driver; the retain is balanced by the
        // release in `Drop`.
        let ctx = call("cuDevicePrimaryCtxRetain", unsafe {
            result::primary_ctx::retain(device)
        })?;
        Ok(Primary {
            ordinal,
            device,
            ctx,
        })
    }

    /// Makes this context current on the calling thread until the guard drops.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))] // Only the GPU test helpers use it.
    pub(crate) fn push(&self) -> Result<Pushed, CudaError> {
        Pushed::new(self.ctx)
    }

    /// Makes this context the calling thread's current one (replacing whatever was current).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))] // Only the GPU test helpers use it.
    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: `ctx` is a retained, live primary context.
        call("cuCtxSetCurrent", unsafe {
            result::ctx::set_current(self.ctx)
        })
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Primary::retain`. A failure cannot be reported from
        // here, and the context simply stays retained.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// A context pushed onto the calling thread's context stack; popped when dropped.
#[derive(Debug)]
pub(crate) struct Pushed {
    // Not Send: the pop must happen on the thread that pushed.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Pushed {
    pub(crate) fn new(ctx: sys::CUcontext) -> Result<Pushed, CudaError> {
        // SAFETY: the caller passes a live context (a retained primary one, or the context a
        // live stream reports); pushing it is balanced by the pop in `Drop` on this thread.
        call("cuCtxPushCurrent_v2", unsafe {
            sys::cuCtxPushCurrent_v2(ctx).result()
        })?;
        Ok(Pushed {
            _thread: std::marker::PhantomData,
        })
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = ptr::null_mut();
        // SAFETY: pops the context `new` pushed on this thread (the guard is not Send), writing
        // it to a live local.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    }
}

/// The device of the current context.
pub(crate) fn current_device() -> Result<sys::CUdevice, CudaError> {
    let mut device: sys::CUdevice = 0;
    // SAFETY: writes one device handle to a live local; fails cleanly without a context.
    call("cuCtxGetDevice", unsafe {
        sys::cuCtxGetDevice(&mut device).result()
    })?;
    Ok(device)
}
