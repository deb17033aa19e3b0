//! What the kernel registry publishes and what readers hold: the immutable [`Snapshot`], the
//! stored kernels and runners in it, the loaded packages with their striped binding counts, and
//! the bindings that keep a provider's code loaded. Below both the registry, which builds
//! snapshots and drains packages, and the operation service, which resolves against a snapshot
//! and binds what it chose; the counting protocol is described in the
//! [registry's documentation](crate::registry#draining).

use std::borrow::Cow;
use std::ffi::CString;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use guild_domain::ids::{ImplId, OpName, PackageId};
use guild_domain::operation::OpCandidate;
use guild_domain::version::Version;
use guild_ports::loader::{LoadedLibrary, RegisteredKernel, RegisteredRunner};
use rustc_hash::FxHashMap;

use crate::sync::{AtomicBool, AtomicU64, Mutex, MutexGuard};

/// Set in every stripe of a package's count while a lifecycle change drains it, and for good
/// once it has left the registry: no new binding may be taken.
const DRAINING: u64 = 1 << 63;
/// Set (and never cleared) once someone has waited for the package's bindings to end: the drop
/// of its last binding then wakes the waiters.
const WAITED: u64 = 1 << 62;
/// Set in every stripe while a drain counts the bindings and has not decided yet: a binder that
/// meets it waits for the decision (a few atomic operations away) instead of taking the
/// package for gone, so a drain that is refused hides the package from no one.
const DECIDING: u64 = 1 << 61;
/// The live binding count, in the low bits. It cannot reach `DECIDING`: each binding is a live
/// object of at least a pointer's size, and 2^61 of them do not fit in an address space.
const COUNT: u64 = DECIDING - 1;
/// Stripes of a package's binding count: enough that the threads of a small machine each bind
/// on their own.
#[cfg(not(loom))]
const STRIPES: usize = 8;
/// Two stripes in the loom models: every path that crosses stripes is there, and the models stay
/// small enough to explore whole.
#[cfg(loom)]
const STRIPES: usize = 2;

/// One stripe of a package's count: `DRAINING | WAITED | bindings taken on it`, alone on its
/// cache line (128 bytes: the pair of lines that adjacent-line prefetching moves together).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// The stripe this thread binds on: threads are dealt stripes in turn as they first bind.
#[inline]
fn thread_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    // A binding taken while the thread's locals are torn down counts on stripe 0.
    STRIPE.try_with(|s| *s).unwrap_or(0)
}

/// Where waiters for a package's bindings to end sleep
/// ([`KernelRegistry::wait_unbound`](crate::registry::KernelRegistry::wait_unbound)).
#[derive(Debug, Default)]
pub(crate) struct Quiet {
    lock: std::sync::Mutex<()>,
    pub(crate) released: std::sync::Condvar,
}

impl Quiet {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // The mutex guards no data, so poisoning means nothing here.
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A package's striped binding count and the drain protocol over it (see the module
/// documentation): everything of [`LoadedPackage`] that binders and drains race on, apart so
/// that the loom models below check exactly this code.
#[derive(Debug, Default)]
struct BindCount {
    /// The stripes.
    state: [Stripe; STRIPES],
    /// Held by a drain from its marks to its decision, so that two drains never decide at once
    /// (binders never take it).
    deciding: Mutex<()>,
    /// Set when the package leaves the registry (unloaded or replaced).
    retired: AtomicBool,
}

impl BindCount {
    fn is_draining(&self) -> bool {
        // Every stripe is marked and cleared together; the first says for all.
        self.state[0].0.load(Ordering::Relaxed) & DRAINING != 0
    }

    fn live_bindings(&self) -> u64 {
        self.state
            .iter()
            .map(|s| s.0.load(Ordering::Acquire) & COUNT)
            .sum()
    }

    /// Counts one more binding on `stripe` unless the package is draining, and answers the
    /// stripe; one compare-and-swap (see the module documentation for why that cannot miss a
    /// drain). A drain that has not decided yet is waited for, out of line.
    #[inline(always)]
    fn try_bind(&self, stripe: usize) -> Option<u8> {
        let word = &self.state[stripe].0;
        let now = word.load(Ordering::Relaxed);
        // Relaxed suffices: the exclusion with a drain rests on the word's own modification
        // order (a successful CAS reads the value just before it, so it cannot succeed after a
        // `fetch_or` of a mark), and the provider's memory is kept by the `Arc`, not the count.
        // `now + 1` stays below `DECIDING` (see `COUNT`).
        if now & (DRAINING | DECIDING) == 0
            && word
                .compare_exchange_weak(now, now + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // STRIPES fits in a byte.
            return Some(stripe as u8);
        }
        self.try_bind_contended(stripe)
    }

    /// [`BindCount::try_bind`] after its first attempt failed: another binder moved the word,
    /// the package is draining, or a drain is deciding (waited for).
    #[cold]
    #[inline(never)]
    fn try_bind_contended(&self, stripe: usize) -> Option<u8> {
        let word = &self.state[stripe].0;
        let mut now = word.load(Ordering::Relaxed);
        loop {
            if now & DRAINING != 0 {
                return None;
            }
            if now & DECIDING != 0 {
                now = wait_for_decision(word);
                continue;
            }
            match word.compare_exchange_weak(now, now + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(stripe as u8),
                Err(seen) => now = seen,
            }
        }
    }

    /// Counts a copy of a live binding on its stripe. Needs no check: while that binding lives
    /// the stripe's count is at least one, so no drain can have succeeded (a drain succeeds
    /// only when every stripe counts zero).
    fn bind_again(&self, stripe: u8) {
        self.state[usize::from(stripe) % STRIPES]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Ends one binding taken on `stripe`; answers whether it was the stripe's last and someone
    /// waits (to be woken: they count every stripe again).
    #[inline]
    fn unbind(&self, stripe: u8) -> bool {
        // Release: everything the binding was used for happens before a drainer's Acquire
        // read of a count of zero, so before the unload or replacement it allows.
        let before = self.state[usize::from(stripe) % STRIPES]
            .0
            .fetch_sub(1, Ordering::Release);
        before & COUNT == 1 && before & WAITED != 0
    }

    fn decide_drain(&self) -> (Deciding<'_>, u64) {
        let held = self.deciding.lock().unwrap_or_else(|e| e.into_inner());
        let mut live = 0;
        for stripe in &self.state {
            // AcqRel: a binding counted on the stripe before the mark is seen here; one after
            // it sees the mark (both are read-modify-writes of the one word).
            let before = stripe.0.fetch_or(DECIDING, Ordering::AcqRel);
            live += before & COUNT;
        }
        (
            Deciding {
                count: self,
                _held: held,
            },
            live,
        )
    }

    fn end_drain(&self) {
        let _held = self.deciding.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_retired() {
            return;
        }
        for stripe in &self.state {
            stripe.0.fetch_and(!DRAINING, Ordering::Release);
        }
    }

    fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    fn retire(&self) {
        // Under the decision lock, so that no drain's end clears the marks in between.
        let _held = self.deciding.lock().unwrap_or_else(|e| e.into_inner());
        self.retired.store(true, Ordering::Release);
        for stripe in &self.state {
            stripe.0.fetch_or(DRAINING, Ordering::Release);
        }
    }

    fn watch(&self) -> u64 {
        self.state
            .iter()
            .map(|s| s.0.fetch_or(WAITED, Ordering::AcqRel) & COUNT)
            .sum()
    }
}

/// One loaded package version and its library.
pub struct LoadedPackage {
    /// The package.
    pub id: PackageId,
    /// The version whose library this is.
    pub version: Version,
    library: Arc<dyn LoadedLibrary>,
    /// The binding count; see the module documentation.
    count: BindCount,
    quiet: Arc<Quiet>,
    /// Set while a newer committed generation wants this version out or replaced and live
    /// bindings defer the switch ([`KernelBinding::is_current`] answers `false`).
    pub(crate) superseded: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for LoadedPackage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPackage")
            .field("id", &self.id)
            .field("version", &self.version)
            .finish()
    }
}

impl LoadedPackage {
    /// A package version just loaded: unbound, not draining, not superseded; its bindings'
    /// last drop wakes the waiters on `quiet`.
    pub(crate) fn new(
        id: PackageId,
        version: Version,
        library: Arc<dyn LoadedLibrary>,
        quiet: Arc<Quiet>,
    ) -> Self {
        LoadedPackage {
            id,
            version,
            library,
            count: BindCount::default(),
            quiet,
            superseded: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The library, for callers that must keep it loaded alongside a pointer into it.
    pub fn library(&self) -> &Arc<dyn LoadedLibrary> {
        &self.library
    }

    /// Whether a lifecycle change is draining the package (or it has left the registry).
    pub fn is_draining(&self) -> bool {
        self.count.is_draining()
    }

    /// Live bindings into the package.
    pub fn live_bindings(&self) -> u64 {
        self.count.live_bindings()
    }

    /// Whether this version is still the one the registry serves and no switch away from it is
    /// waiting: not retired, not draining, not superseded by a newer committed generation.
    pub fn is_current(&self) -> bool {
        !self.is_draining() && !self.superseded.load(Ordering::Acquire)
    }

    /// Counts one more binding on this thread's stripe unless the package is draining, and
    /// answers the stripe ([`BindCount::try_bind`]).
    #[inline(always)]
    fn try_bind(&self) -> Option<u8> {
        self.count.try_bind(thread_stripe())
    }

    /// Counts a copy of a live binding on its stripe.
    fn bind_again(&self, stripe: u8) {
        self.count.bind_again(stripe);
    }

    /// Ends one binding taken on `stripe`, waking the waiters when it was the stripe's last and
    /// someone waits.
    #[inline]
    fn unbind(&self, stripe: u8) {
        if self.count.unbind(stripe) {
            self.wake_waiters();
        }
    }

    /// Wakes whoever waits for the package's bindings to end.
    #[cold]
    fn wake_waiters(&self) {
        // Taking the lock orders this notification after a waiter that saw a non-zero count
        // has gone to sleep (it holds the lock from its read until it waits).
        let _held = self.quiet.lock();
        self.quiet.released.notify_all();
    }

    /// Starts deciding a drain: marks every stripe undecided and answers the live bindings at
    /// the marks. Until the returned [`Deciding`] decides (or drops, which refuses), binders
    /// wait for the decision; no binder treats the package as gone because of it.
    pub(crate) fn decide_drain(&self) -> (Deciding<'_>, u64) {
        self.count.decide_drain()
    }

    /// Clears the marks of a drain whose change did not commit (a package that has left the
    /// registry keeps them for good).
    pub(crate) fn end_drain(&self) {
        self.count.end_drain();
    }

    /// Whether the package has left the registry (its marks stay for good).
    pub(crate) fn is_retired(&self) -> bool {
        self.count.is_retired()
    }

    /// Marks a package that leaves the registry, for good.
    pub(crate) fn retire(&self) {
        self.count.retire();
    }

    /// Asks to be woken when a stripe's count reaches zero and answers the count. Called with
    /// the quiet lock held.
    pub(crate) fn watch(&self) -> u64 {
        self.count.watch()
    }
}

/// A binder's wait for a drain that has marked the package and not decided yet: spins briefly,
/// then yields, until the mark is gone; answers the word then.
#[cold]
#[inline(never)]
fn wait_for_decision(word: &AtomicU64) -> u64 {
    let mut spins = 0u32;
    loop {
        let now = word.load(Ordering::Acquire);
        if now & DECIDING == 0 {
            return now;
        }
        if spins < 64 {
            spins += 1;
            crate::sync::spin_loop();
        } else {
            crate::sync::yield_now();
        }
    }
}

/// A drain between its marks and its decision (see [`LoadedPackage::decide_drain`]); dropping
/// it undecided refuses the drain.
pub(crate) struct Deciding<'p> {
    count: &'p BindCount,
    _held: MutexGuard<'p, ()>,
}

impl Deciding<'_> {
    /// The package drains: every stripe is marked draining as it loses the undecided mark, in
    /// one step, so a binder sees one mark or the other, never neither.
    pub(crate) fn drain(self) {
        for stripe in &self.count.state {
            let _ = stripe
                .0
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                    Some((w | DRAINING) & !DECIDING)
                });
        }
        // The drop that follows finds no undecided mark left and changes nothing; the lock is
        // held until then, so no other drain has marked anything meanwhile.
    }
}

impl Drop for Deciding<'_> {
    fn drop(&mut self) {
        // Refused (or decided, in which case the marks are already gone and this changes
        // nothing): binders waiting for the decision go on.
        for stripe in &self.count.state {
            stripe.0.fetch_and(!DECIDING, Ordering::Release);
        }
    }
}

/// A registered kernel as the registry stores it: the copy the loader made and the package that
/// keeps its code loaded (whose stripes count the bindings to it).
#[derive(Debug)]
pub struct StoredOp {
    /// The host's copy of what the plugin registered.
    pub kernel: RegisteredKernel,
    /// The package whose library holds the kernel's code.
    pub package: Arc<LoadedPackage>,
    /// The names a C caller reads from a handle's description, made once at registration.
    pub(crate) c_names: CNames,
    /// The kernel's GOP1 contract, shared with every handle resolved to it (so a resolution
    /// takes a reference rather than copying it), when it has one.
    pub(crate) contract: Option<Arc<OpCandidate>>,
}

/// A kernel's names as C strings, which live as long as the stored kernel (and so as long as
/// any binding to it).
#[derive(Debug)]
pub(crate) struct CNames {
    pub(crate) impl_id: CString,
    pub(crate) package_id: CString,
    pub(crate) op_name: CString,
    pub(crate) package_version: CString,
}

impl CNames {
    pub(crate) fn of(kernel: &RegisteredKernel, package: &PackageId, version: &Version) -> Self {
        // Ids and names are validated text without NUL bytes; an empty string is the harmless
        // fallback should that ever change.
        let c = |s: &str| CString::new(s).unwrap_or_default();
        CNames {
            impl_id: c(kernel.impl_id.as_str()),
            package_id: c(package.as_str()),
            op_name: c(kernel.op_name.as_ref().map_or("", OpName::as_str)),
            package_version: c(&version.to_string()),
        }
    }
}

/// A live reference to a registered kernel. While it exists, the kernel's library stays loaded
/// and counts as a lease on its package.
pub struct KernelBinding {
    op: Arc<StoredOp>,
    /// The stripe of the package's count this binding (and each copy of it) is counted on.
    stripe: u8,
}

impl KernelBinding {
    /// Binds a stored op, or answers `None` when its package is draining or has left the
    /// registry (see the module documentation). Within the crate only: the operation service
    /// binds the very op it negotiated with.
    pub(crate) fn try_new(op: &Arc<StoredOp>) -> Option<Self> {
        op.package.try_bind().map(|stripe| KernelBinding {
            op: Arc::clone(op),
            stripe,
        })
    }

    /// As [`KernelBinding::try_new`], keeping the reference it is given (inlined into every
    /// lookup: out of line it costs a lookup a tenth more instructions).
    #[inline(always)]
    pub(crate) fn bind(op: Arc<StoredOp>) -> Option<Self> {
        op.package
            .try_bind()
            .map(|stripe| KernelBinding { op, stripe })
    }

    /// The registered kernel.
    pub fn kernel(&self) -> &RegisteredKernel {
        &self.op.kernel
    }

    /// The kernel's GOP1 contract, when it has one.
    pub(crate) fn contract(&self) -> Option<&OpCandidate> {
        self.op.contract.as_deref()
    }

    /// The package that provides it.
    pub fn package(&self) -> &PackageId {
        &self.op.package.id
    }

    /// The version of that package.
    pub fn version(&self) -> &Version {
        &self.op.package.version
    }

    /// The library the kernel's code lives in (kept loaded by this binding).
    pub fn library(&self) -> &Arc<dyn LoadedLibrary> {
        &self.op.package.library
    }

    /// The kernel's names as C strings, valid while the binding lives.
    pub(crate) fn c_names(&self) -> &CNames {
        &self.op.c_names
    }

    /// Whether the binding's package version is still the current provider
    /// ([`LoadedPackage::is_current`]): `false` once it was replaced, taken out (revoked,
    /// disabled, rolled back) or is waiting for its bindings to end so that it can be. A runner
    /// that sees `false` drops the binding and resolves again when it suits it.
    pub fn is_current(&self) -> bool {
        self.op.package.is_current()
    }
}

impl Clone for KernelBinding {
    fn clone(&self) -> Self {
        self.op.package.bind_again(self.stripe);
        KernelBinding {
            op: Arc::clone(&self.op),
            stripe: self.stripe,
        }
    }
}

impl Drop for KernelBinding {
    #[inline]
    fn drop(&mut self) {
        self.op.package.unbind(self.stripe);
    }
}

impl fmt::Debug for KernelBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelBinding")
            .field("impl_id", &self.op.kernel.impl_id)
            .field("package", &self.op.package.id)
            .finish()
    }
}

impl std::ops::Deref for KernelBinding {
    type Target = RegisteredKernel;
    fn deref(&self) -> &RegisteredKernel {
        &self.op.kernel
    }
}

/// A registered runner as stored; its package's stripes count the references to it.
#[derive(Debug)]
pub struct StoredRunner {
    /// The host's copy of what the plugin registered.
    pub runner: RegisteredRunner,
    /// The package whose library holds the runner's code.
    pub package: Arc<LoadedPackage>,
}

/// A shared reference to a registered runner, keeping its library loaded like a binding.
pub struct RunnerBinding {
    runner: Arc<StoredRunner>,
    stripe: u8,
}

impl RunnerBinding {
    /// As [`KernelBinding::try_new`]: `None` while the runner's package drains.
    pub(crate) fn try_new(runner: &Arc<StoredRunner>) -> Option<Self> {
        runner.package.try_bind().map(|stripe| RunnerBinding {
            runner: Arc::clone(runner),
            stripe,
        })
    }

    /// The registered runner.
    pub fn runner(&self) -> &RegisteredRunner {
        &self.runner.runner
    }

    /// The package that provides it.
    pub fn package(&self) -> &PackageId {
        &self.runner.package.id
    }
}

impl Drop for RunnerBinding {
    fn drop(&mut self) {
        self.runner.package.unbind(self.stripe);
    }
}

impl fmt::Debug for RunnerBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerBinding")
            .field("runner_id", &self.runner.runner.runner_id)
            .finish()
    }
}

/// An immutable view of everything registered and enabled.
///
/// Its maps hash with a fast unkeyed hash: every key in them is an id the host registered after
/// checking it, and a lookup with an unknown key only misses.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub(crate) by_id: FxHashMap<ImplId, Arc<StoredOp>>,
    /// Per (op_kind, op_name): candidates sorted by descending priority, then ascending impl id.
    pub(crate) by_op: FxHashMap<(u32, Option<OpName>), Vec<Arc<StoredOp>>>,
    pub(crate) runners: Vec<Arc<StoredRunner>>,
    pub(crate) packages: FxHashMap<PackageId, Arc<LoadedPackage>>,
    /// Per namespaced operation: its kernels that carry a GOP1 contract, best first, beside
    /// their contracts, so that resolution ranks them without copying anything.
    pub(crate) operations: FxHashMap<OpName, OperationCandidates>,
    /// `by_id` held weakly and numbered with the registry's generation: what threads keep a
    /// copy of between lookups by impl id (see `id_lookup`).
    pub(crate) ids: Arc<IdTable>,
}

/// The GOP1 kernels of one namespaced operation, best first, and their contracts in the same
/// order: the registry ranks them once, when it builds a snapshot, so that resolution only
/// walks them.
#[derive(Debug, Default, Clone)]
pub struct OperationCandidates {
    /// The stored kernels, best first (descending priority, then ascending impl id).
    pub stored: Vec<Arc<StoredOp>>,
    /// Their GOP1 contracts in the domain's form, in the same order.
    pub contracts: Vec<OpCandidate>,
    /// The operation's name as the C string every negotiation callback receives.
    pub(crate) c_name: CString,
}

impl OperationCandidates {
    /// The candidates whose package is not draining, in the same order: what resolution may
    /// choose from. Borrowed (no copy) unless a package drains.
    pub fn bindable(&self) -> Cow<'_, OperationCandidates> {
        if !self.stored.iter().any(|op| op.package.is_draining()) {
            return Cow::Borrowed(self);
        }
        let (stored, contracts) = self
            .stored
            .iter()
            .zip(&self.contracts)
            .filter(|(op, _)| !op.package.is_draining())
            .map(|(op, c)| (Arc::clone(op), c.clone()))
            .unzip();
        Cow::Owned(OperationCandidates {
            stored,
            contracts,
            c_name: self.c_name.clone(),
        })
    }
}

impl Snapshot {
    /// The enabled GOP1 kernels of a namespaced operation, best first: named by an
    /// [`OpName`] or by its text (a query's borrowed name).
    pub fn operation<N: AsRef<str> + ?Sized>(&self, name: &N) -> Option<&OperationCandidates> {
        self.operations.get(name.as_ref())
    }

    /// The enabled kernel with this impl id.
    pub fn by_id(&self, impl_id: &ImplId) -> Option<&Arc<StoredOp>> {
        self.by_id.get(impl_id)
    }

    /// Every enabled candidate for an operation, best first.
    pub fn candidates(&self, op_kind: u32, op_name: Option<&OpName>) -> &[Arc<StoredOp>] {
        self.by_op
            .get(&(op_kind, op_name.cloned()))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

/// The enabled kernels of one registry generation, by impl id, held weakly: what
/// `id_lookup` keeps per thread for [`KernelRegistry::find_by_id`](crate::registry::KernelRegistry::find_by_id).
#[derive(Debug, Default)]
pub(crate) struct IdTable {
    pub(crate) generation: u64,
    ids: FxHashMap<ImplId, Weak<StoredOp>>,
}

impl IdTable {
    /// The table of generation `generation` over `by_id` (a snapshot's kernels by impl id).
    pub(crate) fn new(generation: u64, by_id: &FxHashMap<ImplId, Arc<StoredOp>>) -> Self {
        IdTable {
            generation,
            ids: by_id
                .iter()
                .map(|(id, op)| (id.clone(), Arc::downgrade(op)))
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn find(&self, impl_id: &ImplId) -> Option<Arc<StoredOp>> {
        self.ids.get(impl_id).and_then(Weak::upgrade)
    }
}

/// The loom models of the drain protocol (`cargo xtask test --only loom`): every interleaving,
/// up to the preemption bound, of binders on two stripes against a drain, its end and a retire.
/// The drain protocol on real threads: what ThreadSanitizer and Miri check (the loom models
/// below check it exhaustively).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::{BindCount, STRIPES};

    #[test]
    fn binders_on_every_stripe_and_drains_never_coexist() {
        let count = BindCount::default();
        std::thread::scope(|s| {
            for stripe in 0..4 {
                let count = &count;
                s.spawn(move || {
                    for _ in 0..50 {
                        if let Some(taken) = count.try_bind(stripe % STRIPES) {
                            count.bind_again(taken);
                            count.unbind(taken);
                            count.unbind(taken);
                        }
                    }
                });
            }
            for _ in 0..20 {
                let (deciding, live) = count.decide_drain();
                if live > 0 {
                    drop(deciding);
                    continue;
                }
                deciding.drain();
                assert_eq!(count.live_bindings(), 0, "a drain over a live binding");
                assert_eq!(count.try_bind(0), None, "bound a drained package");
                count.end_drain();
            }
        });
        assert_eq!(count.live_bindings(), 0);
        count.retire();
        count.end_drain();
        assert!(count.is_draining() && count.try_bind(1).is_none());
    }
}

// The models' stand-in for a provider's memory is a loom `UnsafeCell`, whose reads and writes
// loom checks for happens-before: touching it is `unsafe`, in these tests only.
#[cfg(all(test, loom))]
#[allow(unsafe_code)]
mod loom_models {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    use super::BindCount;
    use crate::sync::model;

    /// A drain as `KernelRegistry::drain` decides it: refused while anything is bound.
    fn drain(count: &BindCount) -> bool {
        let (deciding, live) = count.decide_drain();
        if live > 0 {
            drop(deciding);
            return false;
        }
        deciding.drain();
        true
    }

    #[test]
    fn loom_a_drain_and_a_bind_never_both_win_nor_both_lose() {
        model(|| {
            let count = Arc::new(BindCount::default());
            let binder = {
                let count = Arc::clone(&count);
                // Kept: the binding outlives the race.
                thread::spawn(move || count.try_bind(1).is_some())
            };
            let drained = drain(&count);
            let bound = binder.join().unwrap();
            // Both: a drain that coexists with a live binding. Neither: a bind that failed on
            // a package no drain took out.
            assert_ne!(drained, bound, "drained {drained}, bound {bound}");
            assert_eq!(count.is_draining(), drained);
        });
    }

    #[test]
    fn loom_a_refused_drain_makes_no_bind_fail() {
        model(|| {
            let count = Arc::new(BindCount::default());
            // A binding live before the race: the drain must be refused.
            let held = count.try_bind(0).unwrap();
            let binder = {
                let count = Arc::clone(&count);
                thread::spawn(move || count.try_bind(1))
            };
            assert!(!drain(&count), "a drain succeeded over a live binding");
            let bound = binder.join().unwrap();
            assert_eq!(bound, Some(1), "a refused drain made a bind fail");
            assert!(!count.is_draining());
            count.unbind(held);
            count.unbind(1);
            assert_eq!(count.live_bindings(), 0);
        });
    }

    #[test]
    fn loom_what_a_binding_used_happens_before_the_unload_its_drain_allows() {
        model(|| {
            let count = Arc::new(BindCount::default());
            // The provider's memory: read while bound, freed (written) once a drain succeeds.
            let library = Arc::new(UnsafeCell::new(1u64));
            let user = {
                let (count, library) = (Arc::clone(&count), Arc::clone(&library));
                thread::spawn(move || {
                    if let Some(stripe) = count.try_bind(1) {
                        // A copy of the binding, dropped after the original.
                        count.bind_again(stripe);
                        count.unbind(stripe);
                        // SAFETY: loom checks that no write races this read.
                        library.with(|v| assert_eq!(unsafe { *v }, 1, "used after unload"));
                        count.unbind(stripe);
                    }
                })
            };
            if drain(&count) {
                // SAFETY: loom checks that no read races this write.
                library.with_mut(|v| unsafe { *v = 0 });
                assert_eq!(count.try_bind(0), None, "bound after a drain succeeded");
            }
            user.join().unwrap();
        });
    }

    #[test]
    fn loom_a_retired_package_stays_drained_whatever_end_races_it() {
        model(|| {
            let count = Arc::new(BindCount::default());
            assert!(drain(&count));
            let ender = {
                let count = Arc::clone(&count);
                thread::spawn(move || count.end_drain())
            };
            count.retire();
            ender.join().unwrap();
            assert!(count.is_draining() && count.is_retired());
            assert_eq!(count.try_bind(1), None, "bound a retired package");
        });
    }

    #[test]
    fn loom_the_last_unbind_after_a_watch_wakes_the_watcher() {
        model(|| {
            let count = Arc::new(BindCount::default());
            let stripe = count.try_bind(1).unwrap();
            let unbinder = {
                let count = Arc::clone(&count);
                thread::spawn(move || count.unbind(stripe))
            };
            let live = count.watch();
            let woke = unbinder.join().unwrap();
            // A watcher that saw the binding sleeps until the unbind wakes it.
            assert!(
                live == 0 || woke,
                "a watcher saw {live} binding and was never woken"
            );
        });
    }
}
