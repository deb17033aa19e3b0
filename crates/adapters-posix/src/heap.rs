//! Heap values that copied C descriptors point into.

use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;

/// A heap value that copied descriptors point into.
///
/// It is held as a raw pointer from `Box::into_raw` rather than as a `Box`, because a `Box`
/// asserts unique access whenever it moves, which would invalidate the pointers the copied
/// descriptor holds into it. The value is only mutated through [`as_mut_ptr`](Self::as_mut_ptr)
/// while its owner is still being built, before any shared borrow of it exists.
pub(crate) struct Heap<T>(NonNull<T>);

impl<T> Heap<T> {
    pub(crate) fn new(value: T) -> Self {
        Heap(NonNull::from(Box::leak(Box::new(value))))
    }

    pub(crate) fn as_ptr(&self) -> *const T {
        self.0.as_ptr()
    }

    /// A pointer for writing while the owner is being built (linking copied chains). Whoever
    /// writes through it must hold no borrow from [`get`](Self::get) at the time.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut T {
        self.0.as_ptr()
    }

    pub(crate) fn get(&self) -> &T {
        // SAFETY: the pointer came from Box::leak in `new` and is freed only in Drop; writes
        // happen only through `as_mut_ptr`, which needs `&mut self` and so cannot overlap this
        // shared borrow tied to `self`.
        unsafe { self.0.as_ref() }
    }
}

impl<T> Drop for Heap<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::leak in `new` and is freed exactly once, here; any
        // pointer a copied descriptor holds into it dies with the OwnedKernel/OwnedRunner that
        // owns both.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// A NUL-terminated string that copied descriptors point into, held as the raw pointer of
/// `CString::into_raw` for the same reason as [`Heap`].
pub(crate) struct HeapCStr(NonNull<c_char>);

impl HeapCStr {
    pub(crate) fn new(text: CString) -> Self {
        let raw = text.into_raw();
        // SAFETY: CString::into_raw returns the pointer of a live allocation, never NULL.
        HeapCStr(unsafe { NonNull::new_unchecked(raw) })
    }

    pub(crate) fn as_ptr(&self) -> *const c_char {
        self.0.as_ptr()
    }

    pub(crate) fn as_cstr(&self) -> &CStr {
        // SAFETY: the pointer came from CString::into_raw (a valid NUL-terminated string that is
        // never mutated) and lives until Drop.
        unsafe { CStr::from_ptr(self.0.as_ptr()) }
    }
}

impl Drop for HeapCStr {
    fn drop(&mut self) {
        // SAFETY: the pointer came from CString::into_raw in `new` and is freed exactly once.
        drop(unsafe { CString::from_raw(self.0.as_ptr()) });
    }
}
