//! The atomics, locks and waits of the lock-free protocols: the handle gate
//! (`operations::handles`) and the drain protocol's striped binding counts (`snapshot`). In an
//! ordinary build they are the standard library's; built with `--cfg loom` they are loom's, so
//! that the loom models beside each protocol explore every interleaving of exactly the code the
//! host runs (see ARCHITECTURE.md, "Machine-checked concurrency").

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Lets another thread run (under loom: lets the model switch threads).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// A busy-wait hint (under loom a yield, so that a spinning thread lets the model go on).
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::hint::spin_loop();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Sleeps on `condvar` until it is notified or `slice` has passed, and answers the guard again.
/// Loom has no clock: there the sleep may end at any point, notified or not, which covers every
/// timing the real timeout allows.
pub(crate) fn wait_slice<'a>(
    condvar: &Condvar,
    guard: MutexGuard<'a, ()>,
    slice: std::time::Duration,
    mutex: &'a Mutex<()>,
) -> MutexGuard<'a, ()> {
    #[cfg(loom)]
    {
        let _ = (condvar, slice);
        drop(guard);
        loom::thread::yield_now();
        mutex.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(loom))]
    {
        let _ = mutex;
        condvar
            .wait_timeout(guard, slice)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

/// Runs a loom model with its bounds: at most `LOOM_MAX_PREEMPTIONS` (default 3) preemptions
/// per execution, as loom reads its other settings (`LOOM_*`) from the environment.
#[cfg(all(test, loom))]
pub(crate) fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// Where a protocol relies on the single total order of its sequentially consistent accesses
/// (an announcement, then a look at the other side's word): nothing in an ordinary build, where
/// those accesses already carry the order. Loom treats a `SeqCst` access as `AcqRel` (its
/// documented limitation, which reports races that cannot happen), but models `SeqCst` fences
/// exactly; the fence here gives its models the order the real accesses have.
#[inline(always)]
pub(crate) fn seq_cst_point() {
    #[cfg(loom)]
    loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
