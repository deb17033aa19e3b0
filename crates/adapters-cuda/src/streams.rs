//! [`CudaStreams`]: the device port's stream bookkeeping on real CUDA streams.
//!
//! After each stream-ordered call the operation service asks for a mark at the end of the
//! stream's work; here that is a CUDA event recorded on the caller's stream, in the stream's own
//! context, and waiting on the mark is `cuEventSynchronize`. A stream that is being captured
//! into a graph gives no mark (its work does not run until the graph is launched, and the
//! caller keeps the handle until the graph's executions are over).
//!
//! The stream arrives as the address a `guild_stream_t` holds. 0 is the legacy default stream
//! of the device's primary context; any other value must be a live `CUstream` (or one of the
//! driver's special handles) of the device the call names. Events are created with timing
//! disabled, destroyed when the mark is dropped.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use cudarc::driver::result;
use cudarc::driver::sys;
use guild_ports::device::{DeviceError, StreamEvents, StreamRef, WorkMark};

use crate::context::{current_device, Primary, Pushed};
use crate::driver::{call, CudaError, Driver};

/// Records and waits for work on caller-supplied CUDA streams.
pub struct CudaStreams {
    driver: Driver,
    /// The primary context of every device a call has named, retained until the adapter and
    /// every mark recorded through it are gone.
    primaries: Mutex<BTreeMap<i32, Arc<Primary>>>,
}

impl fmt::Debug for CudaStreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let devices: Vec<i32> = self
            .primaries
            .lock()
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default();
        f.debug_struct("CudaStreams")
            .field("driver_version", &self.driver.version())
            .field("devices", &devices)
            .finish()
    }
}

impl CudaStreams {
    /// The adapter over an opened driver.
    pub fn new(driver: Driver) -> Self {
        CudaStreams {
            driver,
            primaries: Mutex::new(BTreeMap::new()),
        }
    }

    /// The retained primary context of `device_id`, retained on first use.
    fn primary(&self, device_id: i32) -> Result<Arc<Primary>, CudaError> {
        let mut primaries = self.primaries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = primaries.get(&device_id) {
            return Ok(Arc::clone(p));
        }
        let p = Arc::new(Primary::retain(self.driver, device_id)?);
        primaries.insert(device_id, Arc::clone(&p));
        Ok(p)
    }

    fn try_record(
        &self,
        device_id: i32,
        stream: StreamRef,
    ) -> Result<Option<Box<dyn WorkMark>>, CudaError> {
        let primary = self.primary(device_id)?;
        let raw = stream.0 as sys::CUstream;
        // The stream's own context: the primary one for the default stream, otherwise what the
        // driver says the stream belongs to.
        let ctx = if raw.is_null() {
            primary.ctx
        } else {
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: the caller's contract: a non-zero stream is a live CUstream until the
            // handle is released. The driver writes one context handle to a live local.
            call("cuStreamGetCtx", unsafe {
                sys::cuStreamGetCtx(raw, &mut ctx).result()
            })?;
            ctx
        };
        let _current = Pushed::new(ctx)?;
        if !raw.is_null() {
            let device = current_device()?;
            if device != primary.device {
                return Err(CudaError::Misuse(format!(
                    "stream {:#x} belongs to CUDA device {device}, not to device {device_id} \
                     that the call names",
                    stream.0
                )));
            }
        }
        // SAFETY: `raw` is the caller's live stream (or the default stream of the context made
        // current above).
        let capture = call("cuStreamIsCapturing", unsafe {
            result::stream::is_capturing(raw)
        })?;
        if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            // Captured work runs when the graph is launched; there is nothing to wait for yet.
            return Ok(None);
        }
        let event = call(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
        )?;
        let mark = CudaMark {
            stream,
            device_id,
            event,
            ctx,
            _primary: primary,
        };
        // SAFETY: `event` was just created in the current context, which is the stream's.
        // Should the record fail, dropping `mark` destroys the event.
        call("cuEventRecord", unsafe {
            result::event::record(mark.event, raw)
        })?;
        Ok(Some(Box::new(mark)))
    }
}

impl StreamEvents for CudaStreams {
    fn record(
        &self,
        device_id: i32,
        stream: StreamRef,
    ) -> Result<Option<Box<dyn WorkMark>>, DeviceError> {
        self.try_record(device_id, stream).map_err(|e| DeviceError {
            device_id,
            message: e.to_string(),
        })
    }
}

/// An event recorded at the end of a stream's work.
struct CudaMark {
    stream: StreamRef,
    device_id: i32,
    event: sys::CUevent,
    /// The context the event was created in (the stream's).
    ctx: sys::CUcontext,
    /// Keeps the device's primary context retained while the event exists.
    _primary: Arc<Primary>,
}

// SAFETY: CUDA events and contexts are driver handles usable from any thread; the mark never
// mutates them through `&self` other than by driver calls the driver makes thread-safe.
unsafe impl Send for CudaMark {}
// SAFETY: as above.
unsafe impl Sync for CudaMark {}

impl fmt::Debug for CudaMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaMark")
            .field("device_id", &self.device_id)
            .field("stream", &format_args!("{:#x}", self.stream.0))
            .field("event", &self.event)
            .finish()
    }
}

impl WorkMark for CudaMark {
    fn stream(&self) -> StreamRef {
        self.stream
    }

    fn wait(&self) -> Result<(), DeviceError> {
        let waited = Pushed::new(self.ctx).and_then(|_current| {
            // SAFETY: the event is live until `self` drops; synchronising blocks this thread
            // only.
            call("cuEventSynchronize", unsafe {
                result::event::synchronize(self.event)
            })
        });
        waited.map_err(|e| DeviceError {
            device_id: self.device_id,
            message: format!("waiting for stream {:#x}: {e}", self.stream.0),
        })
    }
}

impl Drop for CudaMark {
    fn drop(&mut self) {
        // Destroying an event whose work is still pending is allowed: the driver releases it
        // once the work completes. A failure cannot be reported from here.
        let _current = Pushed::new(self.ctx);
        // SAFETY: the event was created by `try_record` and is destroyed exactly once.
        let _ = unsafe { result::event::destroy(self.event) };
    }
}
