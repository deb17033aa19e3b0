//! The CUDA device runtime: streams, events, capabilities and graph capture, with the driver loaded
//! at run time so that the crate builds and reports "no device" without a CUDA toolkit.
//!
//! - [`Driver`] opens `libcuda.so.1` once per process and describes devices ([`DeviceInfo`]:
//!   compute capability, name, memory); every way of having no usable GPU is a typed
//!   [`NoDevice`] reason, never a panic.
//! - [`CudaStreams`] implements the device port's [`StreamEvents`](guild_ports::device::StreamEvents)
//!   with CUDA events on the caller's streams.
//! - `testing` (feature `testing`, for tests only) holds the helpers GPU tests use (memory,
//!   streams, PTX launches, graph capture), the skip-or-fail rule for machines without a GPU,
//!   and a fake `libcuda.so.1`.

mod context;
mod driver;
mod streams;
#[cfg(feature = "testing")]
pub mod testing;

pub use driver::{probe, CudaError, DeviceInfo, Driver, DriverFailure, NoDevice, DRIVER_LIBRARY};
pub use streams::CudaStreams;
