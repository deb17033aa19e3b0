//! What the bound extension tables share: the one way
//! [`BoundExpertTable`](crate::experts::BoundExpertTable) calls its callbacks.
//!
//! Every CPE1 and CPU backend callback has one shape ([`TableFn`]): it takes its table's
//! `user_data`, one argument record and an error record, and returns a status.
//! [`Callback::offered`] pairs a callback the table offers with that `user_data`, and
//! [`Callback::call`] hands it the arguments and a fresh error record and reads the record
//! back when the status is not OK. What a wrapper checks before the call, and what error it
//! reports, stay the wrapper's own.

use std::ffi::c_void;
use std::mem::size_of;

use guild_abi::{guild_error_info_t, guild_status_t, GUILD_STATUS_OK};

use crate::error::PluginReason;

/// The shape of every callback of a bound table: `user_data`, the argument record, the error
/// record.
pub(crate) type TableFn<A> =
    unsafe extern "C" fn(*mut c_void, *const A, *mut guild_error_info_t) -> guild_status_t;

/// A callback a bound table offers, with the table's `user_data`: what a call needs besides its
/// arguments.
pub(crate) struct Callback<A> {
    f: TableFn<A>,
    user_data: *mut c_void,
}

impl<A> Callback<A> {
    /// The callback `f` of a table whose `user_data` is `user_data`; `None` when the table
    /// leaves it NULL.
    pub(crate) fn offered(f: Option<TableFn<A>>, user_data: *mut c_void) -> Option<Self> {
        f.map(|f| Callback { f, user_data })
    }

    /// Calls the callback with `args` and a fresh error record; a status other than OK comes
    /// back with the record's text.
    ///
    /// # Safety
    ///
    /// The table the callback came from must still be bound (its kernel's binding alive, so the
    /// provider's library is loaded), and `args` must be what the callback's header asks of the
    /// host: every buffer, address and stream it names valid, large and aligned enough for what
    /// the callback does with it, for the call and for any work it enqueues.
    pub(crate) unsafe fn call(self, args: &A) -> Result<(), PluginReason> {
        let mut error = guild_error_info_t::new();
        // SAFETY: the callback and `user_data` are the bound table's and its code is loaded,
        // `args` is what the header asks for (this function's contract), and `error` is a live
        // local record for the callback to fill.
        let status = unsafe { (self.f)(self.user_data, args, &mut error) };
        if status == GUILD_STATUS_OK {
            Ok(())
        } else {
            Err(PluginReason::read(status, &error))
        }
    }
}

/// `size_of::<T>()` as a record's `struct_size`.
pub(crate) fn size_u32<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
}
