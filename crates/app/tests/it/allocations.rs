//! Heap allocations counted per thread, for tests that a path allocates nothing: the test
//! binary's global allocator forwards to the system allocator and counts each allocation on the
//! thread that made it, so tests running beside one another do not count in it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts the heap allocations of each thread.
struct Counting;

thread_local! {
    /// A constant initialiser and no destructor: reading it allocates nothing.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // A thread being torn down has no counter left; its allocations go uncounted.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded to the system allocator with the caller's arguments; the
// counter is a side effect that allocates nothing. `alloc_zeroed` keeps its default, which calls
// `alloc` (and so is counted).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` or `realloc` here, that is from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as for `dealloc` and `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The heap allocations `f` made on this thread.
pub(crate) fn made_by(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}
