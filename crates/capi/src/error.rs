//! Owned error objects and the boundary every entry runs behind: a failure becomes a code and,
//! when the caller asked for one, a `guild_host_error_t`; a panic becomes
//! `GUILD_HOST_ERR_INTERNAL` instead of unwinding into C.

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use guild_host::{ErrorCategory, HostError};

use crate::ffi::*;

/// Why an entry did not do what it was asked, before it becomes an error object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) code: guild_host_code_t,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: guild_host_code_t, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Failure::new(GUILD_HOST_ERR_INVALID_ARGUMENT, message)
    }

    /// The host's error under `what` (the step that failed), with the code its kind maps to.
    pub(crate) fn host(what: &str, e: &HostError) -> Self {
        let code = match e {
            HostError::NotAStore { .. } => GUILD_HOST_ERR_NOT_A_STORE,
            HostError::Store(_) => GUILD_HOST_ERR_STORE,
            other if other.category() == ErrorCategory::Store => GUILD_HOST_ERR_STORE,
            _ => GUILD_HOST_ERR_HOST,
        };
        Failure::new(code, format!("{what}: {e}"))
    }
}

/// Where a failed entry writes its error object: the caller's `out_error`, which may be NULL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutError(*mut *mut guild_host_error_s);

impl OutError {
    /// # Safety
    /// `out_error` must be NULL or valid for writing one pointer for the rest of the call.
    pub(crate) unsafe fn new(out_error: *mut *mut guild_host_error_s) -> Self {
        OutError(out_error)
    }
}

/// Runs an entry's body behind the panic boundary; a failure is returned as its code and, when
/// the caller passed an `out_error`, written there as a new error object.
pub(crate) fn guarded(
    entry: &str,
    out_error: OutError,
    body: impl FnOnce() -> Result<(), Failure>,
) -> guild_host_code_t {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return GUILD_HOST_OK,
        Ok(Err(failure)) => failure,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            Failure::new(
                GUILD_HOST_ERR_INTERNAL,
                format!("{entry}: internal error in libguild_host ({what}); please report it"),
            )
        }
    };
    let out = out_error.0;
    if !out.is_null() && out.is_aligned() {
        let error = Box::new(guild_host_error_s::new(failure.code, &failure.message));
        // SAFETY: non-NULL and aligned, and valid for one write by `OutError::new`'s contract.
        unsafe { out.write(Box::into_raw(error)) };
    }
    failure.code
}

pub(crate) unsafe extern "C" fn error_code(error: *const guild_host_error_s) -> guild_host_code_t {
    if error.is_null() || !error.is_aligned() {
        return GUILD_HOST_OK;
    }
    // SAFETY: by the API's contract a non-NULL error is one this library made and not yet freed.
    unsafe { (*error).code() }
}

pub(crate) unsafe extern "C" fn error_message(error: *const guild_host_error_s) -> *const c_char {
    if error.is_null() || !error.is_aligned() {
        return c"".as_ptr();
    }
    // SAFETY: as in `error_code`; the message lives as long as the error.
    unsafe { (*error).message_ptr() }
}

pub(crate) unsafe extern "C" fn error_free(error: *mut guild_host_error_s) {
    if error.is_null() || !error.is_aligned() {
        return;
    }
    // Dropping a CString cannot panic, so nothing here can unwind.
    // SAFETY: by the API's contract a non-NULL error is one `guarded` boxed and not yet freed.
    drop(unsafe { Box::from_raw(error) });
}
