//! How the service names and guards its handles.
//!
//! A [`Gate`] is one handle's call state. Its word holds whether an `execute` (or a reshape)
//! holds the handle, whether a release is deciding, whether the handle is live, and (for C
//! handles) its generation. Beside it, two counters say how many `describe`/`scratch` calls
//! are in progress and how many callers wait for the running `execute`.
//!
//! Only the call that holds the handle changes the word while it holds it (every other change
//! is a compare-and-swap that needs the handle free), so an `execute` takes the handle with one
//! compare-and-swap and gives it back with a plain store: one locked instruction per call. A
//! release first takes the handle as an execute would, marked as deciding, then looks at the
//! two counters: with none in progress it retires the handle; otherwise it gives the handle
//! back and is refused with "busy", having changed nothing. Counted calls announce themselves
//! before they look at the word, and the release looks at the counters after it has marked the
//! word (both sequentially consistent), so one of the two always sees the other: there is no
//! window between the check and the release.
//!
//! A call that finds a release deciding waits for the decision (the release only reads the two
//! counters before it stores it), so that a call racing a release finds the handle live or
//! gone, never busy because of the release.
//!
//! A waiter announces itself in its counter and sleeps on the gate's condition variable. The
//! call that gives the handle back wakes it when it sees the count; should it miss a waiter
//! that announced itself at that very moment, the waiter's sleep ends after a millisecond and
//! it looks again, so a wake-up can be late but never lost.
//!
//! A C handle is not a pointer: it is the number [`HandleTable::insert`] returns, made of the
//! table's tag (unique among live tables), the slot's generation and the slot's index. The slots live in segments that are
//! allocated once and freed only with the table, so decoding any number, stale, doubly released,
//! forged or foreign, reads only memory the table owns, and a generation that does not match the
//! slot's is refused before anything the handle owned is touched. A slot whose generation is
//! exhausted is retired instead of reused, so a stale number can never name a newer handle.

use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;
use std::time::Duration;

// The gate's atomics, lock and waits: loom's under `--cfg loom` (the models at the end).
use crate::sync::{AtomicU32, AtomicU64, AtomicUsize, Condvar};

// The handle number is a 64-bit value carried in a pointer.
const _: () = assert!(size_of::<usize>() == 8, "C handles need 64-bit pointers");

/// An `execute` or a reshape holds the handle.
const RUNNING: u64 = 1 << 24;
/// A release holds the handle while it decides (with [`RUNNING`]).
const RETIRING: u64 = 1 << 25;
/// The handle is live: resolved and not released.
const LIVE: u64 = 1 << 26;
const GEN_SHIFT: u32 = 32;
/// Generations are 24 bits, as they are in a handle number.
const GEN_BITS: u32 = 24;
const GEN_MAX: u64 = (1 << GEN_BITS) - 1;
/// How long a waiter sleeps before it looks at the word again without a wake-up.
const WAIT_SLICE: Duration = Duration::from_millis(1);

/// Why a gate refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The handle is not live at this generation: released, never issued, or from another
    /// service.
    Stale,
    /// Another call holds the handle and this caller may not wait for it.
    Busy,
    /// This thread already holds the handle (a provider calling back into its own handle).
    Reentrant,
    /// The handle is released while calls are in progress or waiting: `n` of them.
    InUse(u64),
}

#[cfg(not(loom))]
thread_local! {
    static TOKEN: Cell<u8> = const { Cell::new(0) };
}
// Loom runs its threads on one thread of the process: each needs a local of its own.
#[cfg(loom)]
loom::thread_local! {
    static TOKEN: Cell<u8> = Cell::new(0);
}

/// A number that identifies the calling thread while it lives: the address of a thread-local
/// (two instructions: the thread pointer and an offset).
#[inline(always)]
fn thread_token() -> usize {
    TOKEN.with(|t| ptr::from_ref(t) as usize)
}

/// One handle's call state; see the module documentation.
#[derive(Debug)]
pub(crate) struct Gate {
    state: AtomicU64,
    /// The thread whose `execute` holds the handle (0 when none), to refuse reentry.
    owner: AtomicUsize,
    /// `describe`/`scratch` calls in progress.
    shared: AtomicU32,
    /// Callers waiting for the running `execute`.
    waiters: AtomicU32,
    /// Guards the condition variable waiters sleep on.
    waiting: crate::sync::Mutex<()>,
    wake: Condvar,
}

/// Proof that this thread holds a gate's `execute` exclusivity; dropping it lets the next call
/// in.
#[derive(Debug)]
pub(crate) struct Running<'g> {
    gate: &'g Gate,
}

impl Drop for Running<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let gate = self.gate;
        gate.owner.store(0, Ordering::Relaxed);
        // Nobody else changes the word while the handle is held, so a store gives it back:
        // the word as this call made it, less the running bit (read back rather than kept,
        // which would cost the call a register or a stack slot).
        let held = gate.state.load(Ordering::Relaxed);
        gate.state.store(held & !RUNNING, Ordering::Release);
        if gate.waiters.load(Ordering::Relaxed) != 0 {
            gate.wake_waiters();
        }
    }
}

/// Proof that this thread has a `describe`/`scratch` call counted on a gate.
#[derive(Debug)]
pub(crate) struct Shared<'g>(&'g Gate);

impl Drop for Shared<'_> {
    fn drop(&mut self) {
        self.0.shared.fetch_sub(1, Ordering::Release);
    }
}

impl Gate {
    /// A gate that is not live, at generation 0 (a C slot before its first handle).
    fn vacant() -> Self {
        Gate {
            state: AtomicU64::new(0),
            owner: AtomicUsize::new(0),
            shared: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            waiting: crate::sync::Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// A live gate at generation 0: a Rust handle's, which is never released through it.
    pub(crate) fn live() -> Self {
        Gate {
            state: AtomicU64::new(LIVE),
            ..Gate::vacant()
        }
    }

    fn generation(state: u64) -> u64 {
        (state >> GEN_SHIFT) & GEN_MAX
    }

    #[inline(always)]
    fn is_live_at(state: u64, generation: u64) -> bool {
        state & (LIVE | (GEN_MAX << GEN_SHIFT)) == LIVE | (generation << GEN_SHIFT)
    }

    #[cold]
    fn wake_waiters(&self) {
        // Taking the lock orders this wake-up after a waiter's last look at the word.
        let _waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        self.wake.notify_all();
    }

    /// Counts a `describe` or `scratch` call (which reads only what resolution fixed, and the
    /// published scratch, so it may run beside an `execute`).
    pub(crate) fn enter_shared(&self, generation: u64) -> Result<Shared<'_>, Refused> {
        loop {
            // A stale number is refused before it touches the count, so that it cannot make a
            // release of the slot's newer handle look busy.
            if !Self::is_live_at(self.state.load(Ordering::Acquire), generation) {
                return Err(Refused::Stale);
            }
            if self.shared.fetch_add(1, Ordering::SeqCst) == u32::MAX {
                self.shared.fetch_sub(1, Ordering::SeqCst);
                return Err(Refused::Busy);
            }
            crate::sync::seq_cst_point();
            let state = self.state.load(Ordering::SeqCst);
            if !Self::is_live_at(state, generation) {
                self.shared.fetch_sub(1, Ordering::SeqCst);
                return Err(Refused::Stale);
            }
            if state & RETIRING == 0 {
                return Ok(Shared(self));
            }
            // A release is deciding; it never blocks while it does, so look again.
            self.shared.fetch_sub(1, Ordering::SeqCst);
            crate::sync::yield_now();
        }
    }

    /// Takes the handle for an `execute` (or a reshape). When another call holds it, a caller
    /// that may `wait` (a runner, through its own table or the Rust face) waits its turn,
    /// unless it is the thread that holds it; one that may not (a plugin, through the table in
    /// its host table, on any of its threads) is refused with [`Refused::Busy`].
    #[inline(always)]
    pub(crate) fn enter_run(&self, generation: u64, wait: bool) -> Result<Running<'_>, Refused> {
        let me = thread_token();
        let idle = LIVE | (generation << GEN_SHIFT);
        match self.state.compare_exchange(
            idle,
            idle | RUNNING,
            Ordering::Acquire,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.owner.store(me, Ordering::Relaxed);
                Ok(Running { gate: self })
            }
            Err(now) => self.contended(now, generation, me, wait),
        }
    }

    /// Why the handle could not be taken at once, or the handle after a wait.
    #[cold]
    fn contended(
        &self,
        mut now: u64,
        generation: u64,
        me: usize,
        wait: bool,
    ) -> Result<Running<'_>, Refused> {
        let idle = LIVE | (generation << GEN_SHIFT);
        // A release that is deciding never blocks while it does: wait for its decision, so that
        // a call racing a release sees the handle either live or gone, never busy because of it.
        while Self::is_live_at(now, generation) && now & RETIRING != 0 {
            crate::sync::yield_now();
            now = self.state.load(Ordering::Acquire);
            if now == idle {
                match self.state.compare_exchange(
                    idle,
                    idle | RUNNING,
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        self.owner.store(me, Ordering::Relaxed);
                        return Ok(Running { gate: self });
                    }
                    Err(again) => now = again,
                }
            }
        }
        if !Self::is_live_at(now, generation) {
            return Err(Refused::Stale);
        }
        if now & RUNNING != 0 && now & RETIRING == 0 && self.owner.load(Ordering::Relaxed) == me {
            return Err(Refused::Reentrant);
        }
        if !wait {
            return Err(Refused::Busy);
        }
        self.wait_to_run(generation, me)
    }

    #[cold]
    fn wait_to_run(&self, generation: u64, me: usize) -> Result<Running<'_>, Refused> {
        let idle = LIVE | (generation << GEN_SHIFT);
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        // Announced before the first look at the word: a release refuses while anyone waits.
        self.waiters.fetch_add(1, Ordering::SeqCst);
        crate::sync::seq_cst_point();
        let taken = loop {
            let state = self.state.load(Ordering::SeqCst);
            if !Self::is_live_at(state, generation) {
                break Err(Refused::Stale);
            }
            if state & RUNNING == 0
                && self
                    .state
                    .compare_exchange(idle, idle | RUNNING, Ordering::Acquire, Ordering::Acquire)
                    .is_ok()
            {
                self.owner.store(me, Ordering::Relaxed);
                break Ok(Running { gate: self });
            }
            if state & RUNNING != 0 {
                waiting = crate::sync::wait_slice(&self.wake, waiting, WAIT_SLICE, &self.waiting);
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        taken
    }

    /// Retires the handle at `generation` when no call is in progress or waiting; otherwise
    /// nothing changes.
    fn retire(&self, generation: u64) -> Result<(), Refused> {
        let idle = LIVE | (generation << GEN_SHIFT);
        if let Err(now) = self.state.compare_exchange(
            idle,
            idle | RUNNING | RETIRING,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            crate::sync::seq_cst_point();
            if !Self::is_live_at(now, generation) {
                return Err(Refused::Stale);
            }
            let calls = u64::from(self.shared.load(Ordering::SeqCst))
                + u64::from(self.waiters.load(Ordering::SeqCst))
                + 1;
            return Err(Refused::InUse(calls));
        }
        crate::sync::seq_cst_point();
        let calls = u64::from(self.shared.load(Ordering::SeqCst))
            + u64::from(self.waiters.load(Ordering::SeqCst));
        if calls > 0 {
            // Give the handle back as it was; a waiter that came meanwhile gets its turn.
            self.state.store(idle, Ordering::SeqCst);
            if self.waiters.load(Ordering::SeqCst) != 0 {
                self.wake_waiters();
            }
            return Err(Refused::InUse(calls));
        }
        let next = ((generation + 1) & GEN_MAX) << GEN_SHIFT;
        self.state.store(next, Ordering::Release);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The table of C handles
// ---------------------------------------------------------------------------------------------

/// The first segment's slots; segment `k` holds `BASE << k`.
const BASE: usize = 64;
const BASE_LOG2: u32 = BASE.trailing_zeros();
/// Enough segments for every index a handle number can carry.
const SEGMENTS: usize = 19;
const INDEX_BITS: u32 = 24;
/// The largest index a handle number carries (`index + 1` must fit in 24 bits).
const MAX_INDEX: usize = (1 << INDEX_BITS) - 2;

const _: () = assert!(((BASE << SEGMENTS) - BASE) > MAX_INDEX);

/// How far apart two handles' call states must be so that calls on different handles never
/// write the same cache line: 128 bytes, as the adjacent-line prefetcher of x86-64 cores and
/// the lines of recent Arm cores pair or size them (crossbeam's `CachePadded` chose the same).
pub(crate) const LINE: usize = 128;

/// A value alone in its [`LINE`]-aligned block, so that writes to it never slow down a thread
/// that works on a neighbour.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Lone<T>(pub(crate) T);

const _: () = assert!(align_of::<Lone<u8>>() == LINE);

/// One handle's gate and data, alone in its block: every execute writes its gate, and two
/// threads executing neighbouring handles must not contend for one line (they did, four times
/// slower per call, while slots were 48 bytes apart).
#[repr(align(128))]
struct Slot<T> {
    gate: Gate,
    /// The live handle's data, set before the gate goes live and taken after it is retired.
    data: AtomicPtr<T>,
}

/// Where slot `index` lives: its segment and its offset there.
#[inline(always)]
fn locate(index: usize) -> (usize, usize) {
    let j = index + BASE;
    let segment = (usize::BITS - 1 - j.leading_zeros() - BASE_LOG2) as usize;
    (segment, j - (BASE << segment))
}

#[derive(Debug, Default)]
struct FreeList {
    free: Vec<usize>,
    /// Slots ever handed out (the next fresh index).
    used: usize,
}

/// How many tags there are: the top 16 bits of a handle number.
const TAGS: usize = 1 << 16;

/// The tags of the live tables. A tag is never held by two live tables, so a number one table
/// issued is foreign to every other live table; a free tag is handed out again only after
/// every other free tag has been (round robin from `next`), so a dead table's numbers stay
/// foreign to the tables made after it for as long as possible.
struct TagPool {
    live: Vec<u64>,
    next: usize,
}

static TAG_POOL: Mutex<TagPool> = Mutex::new(TagPool {
    live: Vec::new(),
    next: 0,
});

impl TagPool {
    fn is_live(&self, tag: usize) -> bool {
        self.live
            .get(tag / 64)
            .is_some_and(|w| w & (1 << (tag % 64)) != 0)
    }

    /// A tag no live table holds, marked live.
    fn take(&mut self) -> u64 {
        if self.live.is_empty() {
            self.live = vec![0; TAGS / 64];
        }
        let Some(tag) = (0..TAGS)
            .map(|i| (self.next + i) % TAGS)
            .find(|&t| !self.is_live(t))
        else {
            // Every table holds memory of its own; 65,536 alive at once is a leak of kernel
            // registries, not a load to serve.
            panic!("more than {TAGS} operation service cores are alive in this process");
        };
        self.live[tag / 64] |= 1 << (tag % 64);
        self.next = (tag + 1) % TAGS;
        tag as u64
    }

    fn give_back(&mut self, tag: u64) {
        let tag = tag as usize;
        if let Some(word) = self.live.get_mut(tag / 64) {
            *word &= !(1 << (tag % 64));
        }
    }
}

/// The live C handles of one service core.
pub(crate) struct HandleTable<T> {
    /// This table's tag, carried in the top 16 bits of every handle number; no other live
    /// table holds it ([`TagPool`]).
    tag: u64,
    segments: [AtomicPtr<Slot<T>>; SEGMENTS],
    free: Mutex<FreeList>,
    live: std::sync::atomic::AtomicUsize,
}

impl<T> std::fmt::Debug for HandleTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleTable")
            .field("tag", &self.tag)
            .field("live", &self.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A decoded handle number: which slot, at which generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandleName {
    index: usize,
    generation: u64,
}

/// A handle taken for an `execute` or a reshape: its data, lent for as long as the execute
/// exclusivity (which ends when this drops) is held.
pub(crate) struct Entered<'t, T> {
    data: &'t T,
    running: Running<'t>,
}

impl<T> Entered<'_, T> {
    /// The handle's data, borrowed no longer than the exclusivity lives.
    #[inline(always)]
    pub(crate) fn data(&self) -> &T {
        self.data
    }

    /// The exclusivity.
    #[inline(always)]
    pub(crate) fn running(&self) -> &Running<'_> {
        &self.running
    }
}

/// The table is full (16 million live handles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableFull;

impl<T> HandleTable<T> {
    pub(crate) fn new() -> Self {
        HandleTable {
            tag: TAG_POOL.lock().unwrap_or_else(|e| e.into_inner()).take(),
            segments: [const { AtomicPtr::new(ptr::null_mut()) }; SEGMENTS],
            free: Mutex::new(FreeList::default()),
            live: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Handles inserted and not yet released.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    #[inline(always)]
    fn slot(&self, index: usize) -> Option<&Slot<T>> {
        if index > MAX_INDEX {
            return None;
        }
        let (segment, offset) = locate(index);
        let base = ptr::NonNull::new(self.segments[segment].load(Ordering::Acquire))?;
        // SAFETY: a non-NULL segment pointer is a live allocation of `BASE << segment` slots,
        // made in `insert` and freed only in `Drop`, which cannot run while `&self` lives, and
        // `offset` is below `BASE << segment` (`locate`). Staying a `NonNull`, the slot's
        // address needs no second test for NULL.
        Some(unsafe { base.add(offset).as_ref() })
    }

    /// Makes `data` a live handle and returns its number (never 0).
    pub(crate) fn insert(&self, data: Box<T>) -> Result<u64, TableFull> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let index = match free.free.pop() {
            Some(index) => index,
            None => {
                let index = free.used;
                if index > MAX_INDEX {
                    return Err(TableFull);
                }
                let (segment, _) = locate(index);
                if self.segments[segment].load(Ordering::Acquire).is_null() {
                    let slots: Box<[Slot<T>]> = (0..BASE << segment)
                        .map(|_| Slot {
                            gate: Gate::vacant(),
                            data: AtomicPtr::new(ptr::null_mut()),
                        })
                        .collect();
                    let base = Box::into_raw(slots).cast::<Slot<T>>();
                    self.segments[segment].store(base, Ordering::Release);
                }
                free.used += 1;
                index
            }
        };
        let Some(slot) = self.slot(index) else {
            return Err(TableFull);
        };
        let generation = Gate::generation(slot.gate.state.load(Ordering::Acquire));
        slot.data.store(Box::into_raw(data), Ordering::Relaxed);
        // Release: a caller whose acquire sees LIVE at this generation sees the data too.
        slot.gate
            .state
            .store((generation << GEN_SHIFT) | LIVE, Ordering::Release);
        self.live.fetch_add(1, Ordering::AcqRel);
        drop(free);
        Ok((self.tag << 48) | (generation << INDEX_BITS) | (index as u64 + 1))
    }

    /// The slot a handle number names, if it is one of this table's and the slot exists. The
    /// generation is checked by the gate, atomically with the call's entry.
    #[inline(always)]
    pub(crate) fn decode(&self, number: u64) -> Option<HandleName> {
        if number >> 48 != self.tag {
            return None;
        }
        let index = usize::try_from(number & ((1 << INDEX_BITS) - 1)).ok()?;
        let index = index.checked_sub(1)?;
        Some(HandleName {
            index,
            generation: (number >> INDEX_BITS) & GEN_MAX,
        })
    }

    /// Runs `body` with the handle's data while a `describe`/`scratch` call is counted on it.
    pub(crate) fn with_shared<R>(
        &self,
        name: HandleName,
        body: impl FnOnce(&T) -> R,
    ) -> Result<R, Refused> {
        let slot = self.slot(name.index).ok_or(Refused::Stale)?;
        let _call = slot.gate.enter_shared(name.generation)?;
        // SAFETY: the gate is live at this generation and counts this call, so the handle
        // cannot be retired (and its data freed) until `_call` drops after `body` returns; the
        // data was stored before the gate went live (release/acquire on the gate's word).
        let data = unsafe { &*slot.data.load(Ordering::Acquire) };
        Ok(body(data))
    }

    /// Runs `body` with the handle's data and its execute exclusivity.
    #[inline(always)]
    pub(crate) fn with_running<R>(
        &self,
        name: HandleName,
        wait: bool,
        body: impl FnOnce(&T, &Running<'_>) -> R,
    ) -> Result<R, Refused> {
        let entered = self.enter_running(name, wait)?;
        Ok(body(entered.data(), entered.running()))
    }

    /// Takes the handle's execute exclusivity: the handle's data and the exclusivity, which
    /// ends when the returned value drops. Inlined and without a closure: it is the C face's
    /// execute path, where a closure's body was kept out of line and its result moved through
    /// memory.
    #[inline(always)]
    pub(crate) fn enter_running(
        &self,
        name: HandleName,
        wait: bool,
    ) -> Result<Entered<'_, T>, Refused> {
        let slot = self.slot(name.index).ok_or(Refused::Stale)?;
        let running = slot.gate.enter_run(name.generation, wait)?;
        let data = slot.data.load(Ordering::Acquire);
        // SAFETY: as in `with_shared`: the running call keeps the handle from being retired
        // while `running` lives, and `Entered` lends the data only for as long as it does. The
        // pointer is not NULL (`insert` stored a boxed value's before the gate went live at this
        // generation, and only `remove`, after retiring it, clears it), and the test below
        // checks it anyway: promising it with `assert_unchecked` instead took 321 instructions
        // per C execute against 320 for this test (callgrind, operations bench,
        // GUILD_BENCH_CALLS).
        let Some(data) = (unsafe { data.as_ref() }) else {
            return Err(Refused::Stale);
        };
        Ok(Entered { data, running })
    }

    /// Takes the handle out: refused (and nothing changes) while a call uses it or waits for
    /// it, or when the number is stale.
    pub(crate) fn remove(&self, name: HandleName) -> Result<Box<T>, Refused> {
        let slot = self.slot(name.index).ok_or(Refused::Stale)?;
        slot.gate.retire(name.generation)?;
        let data = slot.data.swap(ptr::null_mut(), Ordering::Acquire);
        self.live.fetch_sub(1, Ordering::AcqRel);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        // A slot whose generation wrapped is never handed out again: a stale number must never
        // name a newer handle.
        if name.generation + 1 < GEN_MAX {
            free.free.push(name.index);
        }
        drop(free);
        // SAFETY: the pointer was made by Box::into_raw in `insert` for this generation, and the
        // successful retire made this thread the only one that can take it.
        Ok(unsafe { Box::from_raw(data) })
    }

    /// Takes out every live handle no call uses (the registry's end), for the caller to drop.
    pub(crate) fn drain_idle(&self) -> Vec<Box<T>> {
        let used = self.free.lock().unwrap_or_else(|e| e.into_inner()).used;
        let mut out = Vec::new();
        for index in 0..used {
            let Some(slot) = self.slot(index) else {
                continue;
            };
            let state = slot.gate.state.load(Ordering::Acquire);
            if state & LIVE == 0 {
                continue;
            }
            let name = HandleName {
                index,
                generation: Gate::generation(state),
            };
            if let Ok(data) = self.remove(name) {
                out.push(data);
            }
        }
        out
    }
}

impl<T> Drop for HandleTable<T> {
    fn drop(&mut self) {
        TAG_POOL
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .give_back(self.tag);
        for (segment, base) in self.segments.iter_mut().enumerate() {
            let base = *base.get_mut();
            if base.is_null() {
                continue;
            }
            let len = BASE << segment;
            // SAFETY: made by Box::into_raw of a boxed slice of exactly `len` slots in `insert`;
            // `&mut self` means no call can be using any of them.
            let slots = unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, len)) };
            for slot in slots.iter() {
                let data = slot.data.load(Ordering::Acquire);
                if !data.is_null() {
                    // SAFETY: a live handle's data, made by Box::into_raw and never taken.
                    drop(unsafe { Box::from_raw(data) });
                }
            }
        }
    }
}

// SAFETY: the table hands out shared references to `T` to any thread (`with_shared`,
// `with_running`) and moves boxed `T`s between threads (`insert`, `remove`), so it is Send and
// Sync exactly when `T` is.
unsafe impl<T: Send + Sync> Send for HandleTable<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for HandleTable<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_located_without_overlap() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(63), (0, 63));
        assert_eq!(locate(64), (1, 0));
        assert_eq!(locate(191), (1, 127));
        assert_eq!(locate(192), (2, 0));
        let (segment, offset) = locate(MAX_INDEX);
        assert!(segment < SEGMENTS && offset < BASE << segment);
    }

    #[test]
    // 65,536 tables are minutes of interpretation; the tag pool has no unsafe code.
    #[cfg_attr(miri, ignore)]
    fn a_handle_of_another_live_table_is_foreign_after_65536_tables() {
        let first = HandleTable::new();
        let mine = first.insert(Box::new(1u32)).unwrap();
        // As many tables made (and dropped) since as the tag has values.
        let mut last = None;
        for _ in 0..TAGS {
            last = Some(HandleTable::new());
        }
        let last = last.unwrap();
        let theirs = last.insert(Box::new(2u32)).unwrap();
        assert_eq!(
            last.decode(mine),
            None,
            "another live table's handle is foreign"
        );
        assert_eq!(first.decode(theirs), None, "and the other way round");
        assert!(last.decode(theirs).is_some());
    }

    #[test]
    fn a_released_number_is_stale_even_when_its_slot_is_reused() {
        let table = HandleTable::new();
        let first = table.insert(Box::new(1u32)).unwrap();
        let name = table.decode(first).unwrap();
        assert_eq!(*table.remove(name).unwrap(), 1);
        let second = table.insert(Box::new(2u32)).unwrap();
        assert_ne!(first, second, "the reused slot has a new generation");
        assert_eq!(table.remove(name).unwrap_err(), Refused::Stale);
        let again = table.decode(second).unwrap();
        assert_eq!(table.with_shared(again, |v| *v), Ok(2));
        assert_eq!(table.live(), 1);
    }

    #[test]
    fn foreign_and_forged_numbers_are_refused() {
        let table = HandleTable::<u32>::new();
        let other = HandleTable::<u32>::new();
        let number = other.insert(Box::new(5)).unwrap();
        assert!(table.decode(number).is_none());
        assert!(table.decode(0).is_none());
        let forged = table.decode((table.tag << 48) | 12345).unwrap();
        assert_eq!(table.with_shared(forged, |_| ()), Err(Refused::Stale));
    }

    #[test]
    fn a_release_during_a_call_is_refused_and_changes_nothing() {
        let table = HandleTable::new();
        let name = table.decode(table.insert(Box::new(9u32)).unwrap()).unwrap();
        let refused = table
            .with_running(name, false, |_, _| table.remove(name).map(|_| ()))
            .unwrap();
        assert_eq!(refused, Err(Refused::InUse(1)));
        let refused = table
            .with_shared(name, |_| table.remove(name).map(|_| ()))
            .unwrap();
        assert_eq!(refused, Err(Refused::InUse(1)));
        assert_eq!(*table.remove(name).unwrap(), 9);
    }

    #[test]
    fn execute_is_exclusive_busy_for_plugins_and_reentrant_for_its_thread() {
        let gate = Gate::live();
        let running = gate.enter_run(0, true).unwrap();
        assert_eq!(gate.enter_run(0, true).unwrap_err(), Refused::Reentrant);
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(gate.enter_run(0, false).unwrap_err(), Refused::Busy));
        });
        // A waiting runner gets its turn when the running call ends.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| gate.enter_run(0, true).map(|_| ()));
            while gate.waiters.load(Ordering::Acquire) == 0 {
                std::thread::yield_now();
            }
            drop(running);
            assert_eq!(waiter.join().unwrap(), Ok(()));
        });
        assert_eq!(gate.state.load(Ordering::Acquire), LIVE);
    }

    #[test]
    fn neighbouring_slots_never_share_a_line() {
        assert_eq!(align_of::<Slot<u64>>(), LINE);
        assert_eq!(size_of::<Slot<u64>>() % LINE, 0);
        let table = HandleTable::new();
        let names: Vec<_> = (0..3u64)
            .map(|i| table.decode(table.insert(Box::new(i)).unwrap()).unwrap())
            .collect();
        let block = |n: &HandleName| {
            let gate: *const Gate = &table.slot(n.index).unwrap().gate;
            gate as usize / LINE
        };
        assert_ne!(block(&names[0]), block(&names[1]));
        assert_ne!(block(&names[1]), block(&names[2]));
        // A Rust handle's gate is in its boxed handle, alone in lines of the handle's own: see
        // `core::tests::a_rust_handles_gate_lies_in_lines_of_its_own`.
    }

    /// Slots in several segments, released, reused, drained and dropped with the table: every
    /// path that turns a handle number into a reference or frees a handle's box (what Miri
    /// checks, with its leak check for the table's own drop).
    #[test]
    fn handles_across_segments_are_freed_once_by_remove_drain_or_drop() {
        let table = HandleTable::new();
        let names: Vec<_> = (0..70u64)
            .map(|i| table.decode(table.insert(Box::new(i)).unwrap()).unwrap())
            .collect();
        assert_eq!(locate(names[69].index).0, 1, "the second segment is in use");
        for (i, name) in names.iter().enumerate().step_by(3) {
            assert_eq!(*table.remove(*name).unwrap(), i as u64);
        }
        for (i, name) in names.iter().enumerate().skip(1).step_by(3) {
            assert_eq!(table.with_shared(*name, |v| *v), Ok(i as u64));
            let entered = table.enter_running(*name, false).unwrap();
            assert_eq!(*entered.data(), i as u64);
        }
        let drained = table.drain_idle();
        assert_eq!(drained.len(), 70 - 24, "every live handle no call uses");
        assert_eq!(table.live(), 0);
        // The table's drop frees what is still live.
        let kept = HandleTable::new();
        kept.insert(Box::new(String::from("freed by the drop")))
            .unwrap();
    }

    /// Executes on two threads, a describe and a release racing them: the handle's data is read
    /// only while a call is counted or holds the handle, and freed once (what ThreadSanitizer
    /// and Miri check; the loom models check the same protocol exhaustively).
    #[test]
    fn calls_racing_a_release_on_threads_touch_only_live_data() {
        let table = HandleTable::new();
        let name = table
            .decode(table.insert(Box::new(vec![1u8, 2, 3])).unwrap())
            .unwrap();
        let released = std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..3 {
                        match table.with_running(name, true, |v, _| v.len()) {
                            Ok(n) => assert_eq!(n, 3),
                            Err(refused) => assert_eq!(refused, Refused::Stale),
                        }
                    }
                });
            }
            s.spawn(|| match table.with_shared(name, |v| v[2]) {
                Ok(n) => assert_eq!(n, 3),
                Err(refused) => assert_eq!(refused, Refused::Stale),
            });
            loop {
                match table.remove(name) {
                    Ok(data) => break data,
                    Err(Refused::InUse(_)) => std::thread::yield_now(),
                    Err(other) => panic!("release refused as {other:?}"),
                }
            }
        });
        assert_eq!(*released, [1, 2, 3]);
        assert_eq!(table.live(), 0);
    }

    #[test]
    fn an_exhausted_slot_is_retired() {
        let table = HandleTable::new();
        let first = table.decode(table.insert(Box::new(0u8)).unwrap()).unwrap();
        let slot = table.slot(first.index).unwrap();
        slot.gate
            .state
            .store(((GEN_MAX - 1) << GEN_SHIFT) | LIVE, Ordering::Release);
        let old = HandleName {
            index: first.index,
            generation: GEN_MAX - 1,
        };
        table.remove(old).unwrap();
        let next = table.decode(table.insert(Box::new(1u8)).unwrap()).unwrap();
        assert_ne!(next.index, first.index, "the exhausted slot is not reused");
    }
}

// Touching the loom `UnsafeCell` that stands for a handle's data is `unsafe`.
/// The loom models of the handle gate (`cargo xtask test --only loom`): every interleaving, up
/// to the preemption bound, of calls racing a release and executes racing each other. The
/// handle's data is a loom `UnsafeCell`, so a call that could touch it after a release freed
/// it, or two executes at once, is reported as a race.
#[cfg(all(test, loom))]
mod loom_models {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    use super::{Gate, Refused};
    use crate::sync::model;

    type Handle = Arc<(Gate, UnsafeCell<u32>)>;

    fn live() -> Handle {
        Arc::new((Gate::live(), UnsafeCell::new(7)))
    }

    #[test]
    fn loom_a_release_never_frees_what_a_shared_call_reads() {
        model(|| {
            let handle = live();
            let caller = {
                let handle = Arc::clone(&handle);
                thread::spawn(move || match handle.0.enter_shared(0) {
                    Ok(_call) => {
                        // SAFETY: loom checks that no write (the release's) races this read.
                        handle.1.with(|v| assert_eq!(unsafe { *v }, 7));
                        true
                    }
                    Err(refused) => {
                        assert_eq!(refused, Refused::Stale, "refused other than stale");
                        false
                    }
                })
            };
            let released = match handle.0.retire(0) {
                Ok(()) => {
                    // SAFETY: loom checks that no read races this write (the free).
                    handle.1.with_mut(|v| unsafe { *v = 0 });
                    true
                }
                Err(refused) => {
                    assert_eq!(refused, Refused::InUse(1));
                    false
                }
            };
            let called = caller.join().unwrap();
            // A call racing a release finds the handle live or gone, never refused because of
            // a release that was itself refused.
            assert!(
                called || released,
                "the call was refused and the handle lives"
            );
            if !released {
                assert_eq!(
                    handle.0.retire(0),
                    Ok(()),
                    "a refused release changed something"
                );
            }
        });
    }

    #[test]
    fn loom_an_execute_racing_a_release_sees_the_handle_live_or_gone() {
        model(|| {
            let handle = live();
            let caller = {
                let handle = Arc::clone(&handle);
                thread::spawn(move || match handle.0.enter_run(0, false) {
                    Ok(_running) => {
                        // SAFETY: loom checks that nothing races this write (the execute).
                        handle.1.with_mut(|v| unsafe { *v += 1 });
                        true
                    }
                    Err(refused) => {
                        assert_eq!(refused, Refused::Stale, "busy because of a release");
                        false
                    }
                })
            };
            let released = match handle.0.retire(0) {
                Ok(()) => {
                    // SAFETY: as above (the free).
                    handle.1.with_mut(|v| unsafe { *v = 0 });
                    true
                }
                Err(Refused::InUse(_)) => false,
                Err(other) => panic!("release refused as {other:?}"),
            };
            let ran = caller.join().unwrap();
            assert!(
                ran || released,
                "the execute was refused and the handle lives"
            );
        });
    }

    #[test]
    fn loom_executes_that_wait_take_the_handle_one_at_a_time() {
        model(|| {
            let handle = live();
            let other = {
                let handle = Arc::clone(&handle);
                thread::spawn(move || {
                    let _running = handle.0.enter_run(0, true).expect("a waiting execute");
                    // SAFETY: loom checks that the other execute's write does not race this.
                    handle.1.with_mut(|v| unsafe { *v += 1 });
                })
            };
            {
                let _running = handle.0.enter_run(0, true).expect("a waiting execute");
                // SAFETY: as above.
                handle.1.with_mut(|v| unsafe { *v += 1 });
            }
            other.join().unwrap();
            // SAFETY: both executes have ended.
            handle.1.with(|v| assert_eq!(unsafe { *v }, 9));
        });
    }
}
