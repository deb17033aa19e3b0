//! What the host's benchmarks share: a global allocator that counts heap allocations, the
//! per-sample record of criterion's timings with the median the summaries print, and a library
//! stand-in for registries filled by hand (the test plugins and packages are
//! guild-test-support's, as for the tests). Each benchmark binary includes it with
//! `#[path = "common/mod.rs"] mod common;`.

#![allow(dead_code)] // Each benchmark uses part of it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::Bencher;
use guild_abi::guild_error_info_t;
use guild_abi::text::fixed_buffer_text;
use guild_domain::ids::PackageId;
use guild_domain::version::Version;
use guild_ports::loader::LoadedLibrary;

/// Counts heap allocations, so that a summary can say what a path allocates.
pub struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator with the caller's arguments; the
// counter is a side effect that allocates nothing. `alloc_zeroed` keeps its default, which calls
// `alloc` (and so is counted).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` or `realloc` here, that is from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc` and `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocations made so far, on every thread.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// What a path allocates: in its first calls, and per call after them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocations {
    /// Over the first [`FIRST_CALLS`] calls, which can make what later ones reuse (a handle
    /// table's first slab, a static made on first use): reported apart, not hidden.
    pub first_calls: u64,
    /// Per call in the steady state: the larger of two windows of 1,000 calls after the first
    /// ones, so that a cost that keeps growing (a vector pushed to once per call reallocates in
    /// both) shows as more than a whole number.
    pub per_call: f64,
}

/// The calls [`Allocations::first_calls`] counts.
pub const FIRST_CALLS: u64 = 10;

/// The heap allocations `call` makes ([`Allocations`]).
pub fn allocations_of(mut call: impl FnMut()) -> Allocations {
    let mut window = |calls: u64| {
        let before = allocations();
        for _ in 0..calls {
            call();
        }
        allocations() - before
    };
    let first_calls = window(FIRST_CALLS);
    let steady = window(1000).max(window(1000));
    Allocations {
        first_calls,
        per_call: steady as f64 / 1000.0,
    }
}

/// Heap allocations per call of `call` in the steady state ([`Allocations::per_call`]).
pub fn allocations_per_call(call: impl FnMut()) -> f64 {
    allocations_of(call).per_call
}

/// Nanoseconds per iteration of every sample criterion asked for, in order: its warm-up runs
/// first, then the `sample_size` measured samples (or the one run of test mode).
pub type Samples = RefCell<Vec<f64>>;

/// Runs `timed(iters)` (which returns the time to count) for criterion, keeping each sample.
pub fn recorded(b: &mut Bencher<'_>, samples: &Samples, mut timed: impl FnMut(u64) -> Duration) {
    b.iter_custom(|iters| {
        let elapsed = timed(iters);
        samples
            .borrow_mut()
            .push(elapsed.as_nanos() as f64 / iters.max(1) as f64);
        elapsed
    });
}

/// The median of the last `n` samples (the measured ones), computed as criterion computes its
/// median point estimate; None when the benchmark did not run (filtered out).
pub fn median(samples: &Samples, n: usize) -> Option<f64> {
    let all = samples.borrow();
    let mut last: Vec<f64> = all[all.len().saturating_sub(n)..].to_vec();
    if last.is_empty() {
        return None;
    }
    last.sort_by(f64::total_cmp);
    let mid = last.len() / 2;
    Some(if last.len().is_multiple_of(2) {
        (last[mid - 1] + last[mid]) / 2.0
    } else {
        last[mid]
    })
}

/// A median for the summary: microseconds from 10 µs on, else nanoseconds.
pub fn show(ns: Option<f64>) -> String {
    match ns {
        None => "not run".into(),
        Some(ns) if ns >= 1e4 => format!("{:.2} us", ns / 1e3),
        Some(ns) if ns >= 100.0 => format!("{ns:.1} ns"),
        Some(ns) => format!("{ns:.2} ns"),
    }
}

/// A package's library for a registry filled by hand: nothing is loaded, so its providers are
/// the benchmark's own.
#[derive(Debug)]
pub struct NoLibrary(pub PackageId, pub Version);

impl LoadedLibrary for NoLibrary {
    fn package(&self) -> &PackageId {
        &self.0
    }
    fn version(&self) -> &Version {
        &self.1
    }
}

/// The message a provider or the service left in an error record, for a benchmark's assertion.
pub fn message(error: &guild_error_info_t) -> String {
    fixed_buffer_text(&error.message)
}
