//! Opening the CUDA driver and asking it about its devices.
//!
//! cudarc's dynamic loading panics when it cannot open the driver library or find an entry
//! point, and the first call into a missing symbol would panic too. So the driver is opened here
//! in steps that each turn into a typed error instead: the library is opened once with `dlopen`
//! (its `dlerror` text is the reason a test prints when it skips), then cudarc opens it (inside
//! `catch_unwind`, should its own search disagree), then every entry point this crate calls is
//! looked up, and only then is `cuInit` called. The outcome is computed once per process.

use std::ffi::{c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

/// The file name the driver library has on Linux (the unversioned `libcuda.so` comes only with
/// a toolkit or a development package).
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";

/// Every driver entry point this crate calls, checked when the driver is opened so that a driver
/// too old for one is a typed error instead of a panic at the first call.
const ENTRY_POINTS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxGetDevice",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamGetCtx",
    "cuStreamIsCapturing",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemAllocManaged",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// What the driver said about a failed call: its result code, name and description.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} ({description})")]
pub struct DriverFailure {
    /// The `CUresult` value.
    pub code: u32,
    /// Its name, as `cuGetErrorName` gives it (`CUDA_ERROR_NO_DEVICE`).
    pub name: String,
    /// Its description, as `cuGetErrorString` gives it.
    pub description: String,
}

impl DriverFailure {
    pub(crate) fn from_driver(e: DriverError) -> Self {
        let text = |r: Result<&CStr, DriverError>| {
            r.map_or_else(
                |_| "unknown".to_string(),
                |s| s.to_string_lossy().into_owned(),
            )
        };
        DriverFailure {
            code: e.0 as u32,
            name: text(e.error_name()),
            description: text(e.error_string()),
        }
    }
}

/// Why there is no CUDA device to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoDevice {
    /// The driver library cannot be opened; the text is the loader's reason.
    #[error("no CUDA driver ({0})")]
    NoDriver(String),
    /// The driver library lacks an entry point this host calls.
    #[error("the CUDA driver has no {0}, which this host needs (the driver is too old)")]
    MissingEntryPoint(String),
    /// `cuInit` failed (no GPU, a stub library, a driver/kernel-module mismatch, ...).
    #[error("the CUDA driver does not initialise: {0}")]
    InitFailed(DriverFailure),
    /// The driver initialised and reports no device.
    #[error("the CUDA driver reports no device")]
    NoDevices,
    /// The ordinal asked for is not one of the driver's devices.
    #[error("there is no CUDA device {ordinal}: the driver reports {count}")]
    NoSuchDevice { ordinal: i32, count: i32 },
}

/// A failure of this adapter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// There is no CUDA device to use, and why.
    #[error("no CUDA device: {0}")]
    NoDevice(#[from] NoDevice),
    /// A driver call failed.
    #[error("{call} failed: {failure}")]
    Driver {
        /// The driver entry point.
        call: &'static str,
        failure: DriverFailure,
    },
    /// A helper was used in a way it does not support (a copy of the wrong size, ...).
    #[error("{0}")]
    Misuse(String),
}

impl CudaError {
    /// Whether this says that there is no device (as opposed to a device that failed).
    pub fn is_no_device(&self) -> bool {
        matches!(self, CudaError::NoDevice(_))
    }
}

/// Turns a cudarc result into this crate's error, naming the call.
pub(crate) fn call<T>(name: &'static str, r: Result<T, DriverError>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Driver {
        call: name,
        failure: DriverFailure::from_driver(e),
    })
}

/// Proof that the driver library is open, every entry point this crate calls is present, and
/// `cuInit` succeeded. Obtained from [`Driver::load`]; cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Driver {
    version: i32,
}

/// One CUDA device as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device ordinal (what `guild_device_caps_v1_t.device_id` holds).
    pub ordinal: i32,
    /// The marketing name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Compute capability times ten (9.0 -> 90), as the operation service compares it.
    pub sm: u32,
    /// Device memory in bytes.
    pub total_memory: u64,
}

static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();

impl Driver {
    /// Opens the driver (once per process; later calls return the first outcome).
    pub fn load() -> Result<Driver, CudaError> {
        DRIVER.get_or_init(|| open(DRIVER_LIBRARY)).clone()
    }

    /// The driver's CUDA version, as `cuDriverGetVersion` gives it (12040 for 12.4).
    pub fn version(self) -> i32 {
        self.version
    }

    /// How many devices the driver reports.
    pub fn device_count(self) -> Result<i32, CudaError> {
        call("cuDeviceGetCount", result::device::get_count())
    }

    /// The driver's handle for device `ordinal`, checked against the device count.
    pub(crate) fn device_handle(self, ordinal: i32) -> Result<sys::CUdevice, CudaError> {
        let count = self.device_count()?;
        if count == 0 {
            return Err(NoDevice::NoDevices.into());
        }
        if ordinal < 0 || ordinal >= count {
            return Err(NoDevice::NoSuchDevice { ordinal, count }.into());
        }
        call("cuDeviceGet", result::device::get(ordinal))
    }

    /// Describes device `ordinal`.
    pub fn device(self, ordinal: i32) -> Result<DeviceInfo, CudaError> {
        let dev = self.device_handle(ordinal)?;
        let attribute = |a: sys::CUdevice_attribute| {
            // SAFETY: `dev` is a handle the driver just gave for an existing device, and the
            // attribute is a valid enumerator of this binding.
            let value = unsafe { result::device::get_attribute(dev, a) };
            call("cuDeviceGetAttribute", value).map(|v| u32::try_from(v).unwrap_or_default())
        };
        let major =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let name = call("cuDeviceGetName", result::device::get_name(dev))?;
        // SAFETY: as above.
        let total = call("cuDeviceTotalMem_v2", unsafe {
            result::device::total_mem(dev)
        })?;
        Ok(DeviceInfo {
            ordinal,
            name,
            compute_capability: (major, minor),
            sm: major * 10 + minor,
            total_memory: total as u64,
        })
    }

    /// Describes every device; no device at all is [`NoDevice::NoDevices`].
    pub fn devices(self) -> Result<Vec<DeviceInfo>, CudaError> {
        let count = self.device_count()?;
        if count == 0 {
            return Err(NoDevice::NoDevices.into());
        }
        (0..count).map(|ordinal| self.device(ordinal)).collect()
    }
}

/// Opens the driver, checks it, and describes every device: what a caller that only wants to
/// know "is there a GPU, and which" asks.
pub fn probe() -> Result<Vec<DeviceInfo>, CudaError> {
    Driver::load()?.devices()
}

/// Opens the driver from `library` (see the module documentation for the steps).
pub(crate) fn open(library: &str) -> Result<Driver, CudaError> {
    check_library(library)?;
    let opened = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: opening the driver library runs its initialisers; it is the system's CUDA
        // driver, which exists to be loaded into processes like this one.
        let lib = unsafe { sys::culib() };
        ENTRY_POINTS
            .iter()
            // SAFETY: the symbol is only looked up, never called through this type.
            .find(|name| unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err())
            .map(|name| name.to_string())
    }));
    match opened {
        Err(panic) => return Err(NoDevice::NoDriver(panic_text(&*panic)).into()),
        Ok(Some(missing)) => return Err(NoDevice::MissingEntryPoint(missing).into()),
        Ok(None) => {}
    }
    result::init().map_err(|e| NoDevice::InitFailed(DriverFailure::from_driver(e)))?;
    let mut version: c_int = 0;
    // SAFETY: the entry point exists (checked above) and writes one int to a live location.
    call("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version).result()
    })?;
    Ok(Driver { version })
}

/// Opens `library` with `dlopen`, turning a failure into [`NoDevice::NoDriver`] with the
/// loader's own words. The handle is kept: the driver stays loaded for the life of the process
/// anyway, and closing it here would unload it only for cudarc to load it again.
#[cfg(unix)]
fn check_library(library: &str) -> Result<(), CudaError> {
    let name = CString::new(library)
        .map_err(|_| NoDevice::NoDriver(format!("{library:?} is not a library name")))?;
    // SAFETY: `name` is a NUL-terminated string; opening the system's CUDA driver runs its
    // initialisers, which is what using the driver means.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated string owned by the loader, valid
        // until the next dl* call on this thread; it is copied at once.
        let reason = unsafe {
            let text = libc::dlerror();
            if text.is_null() {
                format!("{library}: cannot be opened")
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        };
        return Err(NoDevice::NoDriver(reason).into());
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_library(library: &str) -> Result<(), CudaError> {
    Err(NoDevice::NoDriver(format!(
        "{library}: this host opens the CUDA driver on Linux only"
    ))
    .into())
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "the driver library could not be opened".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_that_cannot_be_opened_is_no_driver_with_the_loaders_reason() {
        let err = open("libguild-no-such-cuda-driver.so.1").unwrap_err();
        match &err {
            CudaError::NoDevice(NoDevice::NoDriver(reason)) => {
                assert!(
                    reason.contains("libguild-no-such-cuda-driver.so.1"),
                    "the reason names the library: {reason}"
                );
            }
            other => panic!("expected NoDriver, got {other:?}"),
        }
        assert!(err.is_no_device());
        assert!(
            err.to_string()
                .starts_with("no CUDA device: no CUDA driver (libguild-no-such-cuda-driver.so.1"),
            "{err}"
        );
    }

    #[test]
    fn a_name_with_a_nul_byte_is_no_driver() {
        assert_eq!(
            open("libcuda\0.so").unwrap_err(),
            CudaError::NoDevice(NoDevice::NoDriver(
                "\"libcuda\\0.so\" is not a library name".to_string()
            ))
        );
    }
}
