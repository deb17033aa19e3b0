//! Stream and event bookkeeping for operation calls that enqueue work instead of finishing it.
//!
//! A stream-ordered `execute` returns as soon as the provider has enqueued its work on the
//! caller's stream. The host must not drop the handle's binding (and with it possibly the
//! provider's code) while that work may still run, so after each such call it asks the device
//! adapter to mark the end of the stream's work so far, and `release` waits for every mark the
//! handle recorded. A handle keeps only the newest mark per stream: work on one stream completes
//! in order, so waiting for the newest mark waits for all older ones.
//!
//! The port speaks of streams by the address the C ABI passes (`guild_stream_t` is an opaque
//! pointer); the adapter knows what it points at. The address 0 is the device's default stream.

use std::fmt;

/// A caller's stream, as the address its `guild_stream_t` holds (0: the default stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamRef(pub usize);

/// A device failure seen while recording or waiting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {device_id}: {message}")]
pub struct DeviceError {
    /// The device the stream belongs to.
    pub device_id: i32,
    /// What the device runtime reported.
    pub message: String,
}

/// The end of the work enqueued on one stream at the moment it was recorded.
pub trait WorkMark: Send + Sync + fmt::Debug {
    /// The stream the mark was recorded on.
    fn stream(&self) -> StreamRef;

    /// Blocks until the marked work has finished. An error is a device failure the marked work
    /// (or the wait) ran into; the mark counts as finished either way.
    fn wait(&self) -> Result<(), DeviceError>;
}

/// What the host needs from a device adapter to keep stream-ordered calls safe.
pub trait StreamEvents: Send + Sync + fmt::Debug {
    /// Marks the end of the work enqueued so far on `stream` of device `device_id`.
    ///
    /// `Ok(None)` means there is nothing the host can wait for, as when the stream is being
    /// captured into a graph: the caller then keeps the handle alive until the graph's
    /// executions have finished, as the operation service's contract says.
    fn record(
        &self,
        device_id: i32,
        stream: StreamRef,
    ) -> Result<Option<Box<dyn WorkMark>>, DeviceError>;
}
