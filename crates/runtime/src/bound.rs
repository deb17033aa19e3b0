//! What the bound extension tables share: [`BoundExpertTable`](crate::experts::BoundExpertTable)
//! and [`BoundCudaTables`](crate::cuda_tables::BoundCudaTables) both copy a negotiated table out
//! of a kernel's provider once ([`bound`]), hold it beside the kernel's binding, whose lease
//! keeps the provider's library loaded while the copy lives, and call its callbacks the same
//! way.
//!
//! Every CPE1, CPU backend, CDD1, CDA1 and CDM1 callback has one shape ([`TableFn`]): it takes
//! its table's `user_data`, one argument record and an error record, and returns a status.
//! [`BoundTable::callback`] pairs a callback the table offers with that `user_data`, and
//! [`Callback::call`] hands it the arguments and a fresh error record and reads the record
//! back when the status is not OK. What a wrapper checks before the call, and what error it
//! reports, stay the wrapper's own.

use std::ffi::c_void;
use std::mem::size_of;

use guild_abi::{
    guild_cpu_backend_ext_v2_t, guild_cuda_attn_ext_v1_t, guild_cuda_dense_ext_v1_t,
    guild_cuda_moe_ext_v1_t, guild_cuda_qwen_group_v1_t, guild_error_info_t, guild_status_t,
    GUILD_STATUS_OK,
};
use guild_ports::provider::ExtensionTable;

use crate::error::PluginReason;

/// The shape of every callback of a bound table: `user_data`, the argument record, the error
/// record.
pub(crate) type TableFn<A> =
    unsafe extern "C" fn(*mut c_void, *const A, *mut guild_error_info_t) -> guild_status_t;

/// A bound table of one tag: the plugin's table in this host's layout, and the optional
/// callbacks it does not offer.
#[derive(Debug, Clone)]
pub struct BoundTable<T> {
    table: T,
    version: u32,
    absent: Vec<&'static str>,
}

impl<T> BoundTable<T> {
    /// The table (fields the plugin's size did not carry are zero; `header.next` is NULL).
    pub fn table(&self) -> &T {
        &self.table
    }

    /// The layout version the plugin declared.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The optional callbacks the plugin does not offer, in field order.
    pub fn absent_callbacks(&self) -> &[&'static str] {
        &self.absent
    }

    /// The callback `pick` reads from the table, with the table's `user_data`; `None` when the
    /// table leaves it NULL.
    pub(crate) fn callback<A>(
        &self,
        pick: impl FnOnce(&T) -> Option<TableFn<A>>,
    ) -> Option<Callback<A>>
    where
        T: Table,
    {
        pick(&self.table).map(|f| Callback {
            f,
            user_data: self.table.user_data(),
        })
    }
}

/// Copies a negotiated table out of the kernel's provider, cutting its link to the next copy.
pub(crate) fn bound<T: Copy>(
    lent: Option<ExtensionTable<'_, T>>,
    unlink: impl FnOnce(&mut T),
) -> Option<BoundTable<T>> {
    lent.map(|lent| {
        let mut table = *lent.table;
        unlink(&mut table);
        BoundTable {
            table,
            version: lent.version,
            absent: lent.absent_callbacks,
        }
    })
}

/// An extension table whose callbacks all take its `user_data`.
pub(crate) trait Table: Copy {
    /// The `user_data` every callback of the table is handed.
    fn user_data(&self) -> *mut c_void;
}

macro_rules! tables {
    ($($t:ty),* $(,)?) => {
        $(impl Table for $t {
            fn user_data(&self) -> *mut c_void {
                self.user_data
            }
        })*
    };
}

tables!(
    guild_cpu_backend_ext_v2_t,
    guild_cuda_dense_ext_v1_t,
    guild_cuda_attn_ext_v1_t,
    guild_cuda_moe_ext_v1_t,
    guild_cuda_qwen_group_v1_t,
);

/// A callback a bound table offers, with the table's `user_data`: what a call needs besides its
/// arguments.
pub(crate) struct Callback<A> {
    f: TableFn<A>,
    user_data: *mut c_void,
}

impl<A> Callback<A> {
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
