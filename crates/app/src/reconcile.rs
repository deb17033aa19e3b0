//! What a [`Host`](crate::Host) has applied of the store, kept apart from what its package
//! manager has read, so that [`Host::refresh`](crate::Host::refresh) works toward the committed
//! state from there and never forgets a change it could not make.
//!
//! The host remembers the last generation whose load plan it has worked through (every package
//! of it switched, taken out, or recorded here as pending) and, per package, the change the store
//! wants that is not applied yet: what it waits for (live bindings, or the error of the last
//! attempt), how many attempts were made, and when the next one is due. A refresh that fails
//! before it has worked through the plan leaves the applied generation where it was, so the next
//! refresh starts over from the package manager's committed state; a package whose switch failed
//! stays pending and is tried again after a bounded exponential delay ([`FIRST_RETRY`] doubling
//! up to [`LAST_RETRY`]), so that neither a runner refreshing between batches nor a
//! [`Host::watch`](crate::Host::watch)er spins on a persistent fault.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use guild_domain::ids::PackageId;
use guild_domain::version::Version;

use crate::package_manager::LeftOut;

/// The delay before the first retry of a failed change.
pub const FIRST_RETRY: Duration = Duration::from_millis(50);
/// The longest delay between two retries of a change that keeps failing.
pub const LAST_RETRY: Duration = Duration::from_secs(5);

/// The delay before the attempt that follows `attempts` failed ones (at least one).
fn backoff(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(LAST_RETRY)
}

/// Why a change the store wants of a package is not applied yet.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PendingCause {
    /// Live bindings (operation handles, bound kernels or runners) hold the version in service;
    /// the switch happens at the first refresh after they are released.
    Bound {
        /// Live bindings at the last check.
        bindings: u64,
    },
    /// The last attempt failed (the library did not load, its `init` failed, a pin or a crash
    /// record could not be written, ...); it is tried again.
    Failed {
        /// The error, in words.
        error: String,
    },
}

impl fmt::Display for PendingCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingCause::Bound { bindings } => {
                write!(f, "waits for {bindings} live binding(s) to be released")
            }
            PendingCause::Failed { error } => write!(f, "failed: {error}"),
        }
    }
}

/// A change the store wants of one package that the host has not applied yet
/// ([`RefreshReport::pending`](crate::RefreshReport::pending)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingChange {
    /// The package.
    pub id: PackageId,
    /// The version the host has loaded of it, if any.
    pub from: Option<Version>,
    /// The version the store enables, or `None` when the package is to be taken out.
    pub to: Option<Version>,
    /// Why it is not applied yet.
    pub cause: PendingCause,
    /// Attempts made so far.
    pub attempts: u32,
    /// How long after the report the next attempt is due (zero: at the next refresh). A switch
    /// that waits for bindings is checked at every refresh whatever this says.
    pub retry_in: Duration,
}

impl fmt::Display for PendingChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = self
            .from
            .as_ref()
            .map_or_else(|| "(not loaded)".to_owned(), ToString::to_string);
        let to = self
            .to
            .as_ref()
            .map_or_else(|| "out".to_owned(), |v| format!("to {v}"));
        write!(
            f,
            "{}@{from} switches {to}: {} (attempt {}, next in {:?})",
            self.id, self.cause, self.attempts, self.retry_in
        )
    }
}

/// One pending change as the host keeps it.
#[derive(Debug, Clone)]
struct Entry {
    from: Option<Version>,
    to: Option<Version>,
    cause: PendingCause,
    attempts: u32,
    retry_at: Instant,
    /// For a switch that waits for bindings: its live bindings when taking its dependents out
    /// first was tried and did not release them all (see `Host::break_cycles`). The attempt is
    /// not made again while the count is the same.
    cycle_tried: Option<u64>,
}

impl Entry {
    /// An attempt at `now` to bring a package from `from` to `to` did not apply, for `cause`;
    /// `before` is its previous record. The attempts count on from it when it wanted the same
    /// change.
    fn next(
        before: Option<&Entry>,
        from: Option<Version>,
        to: Option<Version>,
        cause: PendingCause,
        now: Instant,
    ) -> Entry {
        let (attempts, cycle_tried) = match before {
            Some(e) if e.to == to => (e.attempts.saturating_add(1), e.cycle_tried),
            _ => (1, None),
        };
        Entry {
            from,
            to,
            cause,
            attempts,
            retry_at: now + backoff(attempts),
            cycle_tried,
        }
    }
}

/// The host's applied state; see the module documentation.
#[derive(Debug)]
pub(crate) struct Applied {
    /// The last generation whose load plan the host worked through.
    generation: u64,
    /// What is not applied yet, by package.
    pending: BTreeMap<PackageId, Entry>,
    /// Refreshes that failed in a row before working through the plan, and when the next is
    /// due (for a watcher's wake-up; an explicit refresh that is behind always tries).
    stalled: Option<(u32, Instant)>,
    /// What the package manager found unusable at a refresh that then failed: the next report
    /// says it.
    unusable: Vec<LeftOut>,
}

impl Applied {
    /// A host that has applied `generation` and owes nothing.
    pub(crate) fn new(generation: u64) -> Self {
        Applied {
            generation,
            pending: BTreeMap::new(),
            stalled: None,
            unusable: Vec::new(),
        }
    }

    /// Keeps what a failed refresh was to report as unusable, for the next report.
    pub(crate) fn keep_unusable(&mut self, unusable: Vec<LeftOut>) {
        self.unusable.extend(unusable);
    }

    /// What a failed refresh was to report as unusable, taken for this one.
    pub(crate) fn take_unusable(&mut self) -> Vec<LeftOut> {
        std::mem::take(&mut self.unusable)
    }

    /// The last generation the host worked through.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a refresh at `now` has anything to retry: a switch that waits for bindings (a
    /// cheap check) or a failed change whose delay is over.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.pending
            .values()
            .any(|e| matches!(e.cause, PendingCause::Bound { .. }) || e.retry_at <= now)
    }

    /// Starts a pass: what it records replaces the pending set when it completes. It holds a
    /// copy of what is owed now, so that no lock is held while the pass loads libraries.
    pub(crate) fn pass(&self) -> Pass {
        Pass {
            before: self.pending.clone(),
            next: BTreeMap::new(),
        }
    }

    /// A pass over `generation`'s plan completed: it is applied, and `pass`'s records are what
    /// is still owed.
    pub(crate) fn complete(&mut self, generation: u64, pending: Pending) {
        self.generation = generation;
        self.pending = pending.0;
        self.stalled = None;
    }

    /// An attempt outside a refresh (the first load of an enabled package) did not apply: as
    /// [`Pass::record`], added to what is owed.
    pub(crate) fn record(
        &mut self,
        id: &PackageId,
        from: Option<Version>,
        to: Option<Version>,
        cause: PendingCause,
        now: Instant,
    ) {
        let entry = Entry::next(self.pending.get(id), from, to, cause, now);
        self.pending.insert(id.clone(), entry);
    }

    /// A refresh failed at `now` before completing its pass: the applied generation stays, and
    /// a watcher tries again after a delay.
    pub(crate) fn stall(&mut self, now: Instant) {
        let attempts = self.stalled.map_or(0, |(n, _)| n).saturating_add(1);
        self.stalled = Some((attempts, now + backoff(attempts)));
    }

    /// A refresh succeeded: whatever failed before it is over.
    pub(crate) fn unstall(&mut self) {
        self.stalled = None;
    }

    /// When a watcher should refresh next on its own (without a store event): after a failed
    /// refresh, once its delay is over (every retry goes through the step that failed);
    /// otherwise the earliest retry due; `None` when nothing is owed.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        if let Some((_, at)) = self.stalled {
            return Some(at);
        }
        self.pending.values().map(|e| e.retry_at).min()
    }

    /// What is owed, as a report sees it at `now`.
    pub(crate) fn report(&self, now: Instant) -> Vec<PendingChange> {
        self.pending
            .iter()
            .map(|(id, e)| PendingChange {
                id: id.clone(),
                from: e.from.clone(),
                to: e.to.clone(),
                cause: e.cause.clone(),
                attempts: e.attempts,
                retry_in: e.retry_at.saturating_duration_since(now),
            })
            .collect()
    }
}

/// What one refresh pass records as still owed.
pub(crate) struct Pass {
    before: BTreeMap<PackageId, Entry>,
    next: BTreeMap<PackageId, Entry>,
}

/// The records of a finished [`Pass`].
pub(crate) struct Pending(BTreeMap<PackageId, Entry>);

impl Pass {
    /// Whether the pass, at `now`, should try to bring `id` to `to`: not while a failed attempt
    /// at that very change waits out its delay (a change to something else is tried at once).
    pub(crate) fn should_try(&self, id: &PackageId, to: Option<&Version>, now: Instant) -> bool {
        match self.before.get(id) {
            Some(e) if e.to.as_ref() == to && matches!(e.cause, PendingCause::Failed { .. }) => {
                e.retry_at <= now
            }
            _ => true,
        }
    }

    /// An attempt at `now` to bring `id` from `from` to `to` did not apply, for `cause`. The
    /// attempts count on from the previous record when it wanted the same change.
    pub(crate) fn record(
        &mut self,
        id: &PackageId,
        from: Option<Version>,
        to: Option<Version>,
        cause: PendingCause,
        now: Instant,
    ) {
        let entry = Entry::next(self.before.get(id), from, to, cause, now);
        self.next.insert(id.clone(), entry);
    }

    /// `id` was not tried in this pass (its delay is not over): its record stays as it was.
    pub(crate) fn keep(&mut self, id: &PackageId) {
        if let Some(e) = self.before.get(id) {
            self.next.insert(id.clone(), e.clone());
        }
    }

    /// `id`'s change was applied after all, later in the pass: nothing is owed for it.
    pub(crate) fn forget(&mut self, id: &PackageId) {
        self.next.remove(id);
    }

    /// Whether taking out the dependents of `id`, whose switch waits for `bindings` live
    /// bindings, is worth a try: not when it was tried at that very count and did not free it.
    pub(crate) fn cycle_worth_trying(&self, id: &PackageId, bindings: u64) -> bool {
        self.before
            .get(id)
            .is_none_or(|e| e.cycle_tried != Some(bindings))
    }

    /// Taking out the dependents of `id` did not free it while it had `bindings` live
    /// bindings: not tried again until the count changes.
    pub(crate) fn cycle_tried(&mut self, id: &PackageId, bindings: u64) {
        if let Some(e) = self.next.get_mut(id) {
            e.cycle_tried = Some(bindings);
        }
    }

    /// The records, to be [`Applied::complete`]d once the lock on the host's state is taken
    /// again.
    pub(crate) fn finish(self) -> Pending {
        Pending(self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> PackageId {
        PackageId::new("example.scan").unwrap()
    }

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    #[test]
    fn the_delay_doubles_from_the_first_to_the_last() {
        assert_eq!(backoff(0), FIRST_RETRY);
        assert_eq!(backoff(1), FIRST_RETRY);
        assert_eq!(backoff(2), FIRST_RETRY * 2);
        assert_eq!(backoff(3), FIRST_RETRY * 4);
        assert_eq!(backoff(1000), LAST_RETRY);
        assert_eq!(backoff(u32::MAX), LAST_RETRY);
    }

    #[test]
    fn a_failed_change_waits_out_its_delay_and_counts_its_attempts() {
        let now = Instant::now();
        let mut applied = Applied::new(3);
        let failed = PendingCause::Failed {
            error: "init failed".into(),
        };
        let mut pass = applied.pass();
        pass.record(
            &id(),
            Some(v("1.0.0")),
            Some(v("1.1.0")),
            failed.clone(),
            now,
        );
        let pending = pass.finish();
        applied.complete(4, pending);
        assert_eq!(applied.generation(), 4);
        assert!(!applied.due(now));
        assert!(!applied.pass().should_try(&id(), Some(&v("1.1.0")), now));
        // Another target is tried at once.
        assert!(applied.pass().should_try(&id(), Some(&v("1.2.0")), now));
        let later = now + FIRST_RETRY;
        assert!(applied.due(later));
        assert!(applied.pass().should_try(&id(), Some(&v("1.1.0")), later));
        assert_eq!(applied.next_retry(), Some(later));

        let mut pass = applied.pass();
        pass.record(&id(), Some(v("1.0.0")), Some(v("1.1.0")), failed, later);
        let pending = pass.finish();
        applied.complete(4, pending);
        let report = applied.report(later);
        assert_eq!(report.len(), 1);
        assert_eq!(report[0].attempts, 2);
        assert_eq!(report[0].retry_in, FIRST_RETRY * 2);

        // A pass that applies it records nothing: nothing is owed.
        let pass = applied.pass();
        let pending = pass.finish();
        applied.complete(4, pending);
        assert!(applied.report(later).is_empty());
        assert_eq!(applied.next_retry(), None);
    }

    #[test]
    fn a_bound_switch_is_always_due_and_a_stalled_refresh_is_retried_later() {
        let now = Instant::now();
        let mut applied = Applied::new(1);
        let mut pass = applied.pass();
        pass.record(
            &id(),
            Some(v("1.0.0")),
            None,
            PendingCause::Bound { bindings: 2 },
            now,
        );
        let pending = pass.finish();
        applied.complete(2, pending);
        assert!(applied.due(now));

        // A failed refresh is retried after its own delay, whatever else is owed.
        let mut stalled = Applied::new(1);
        stalled.record(
            &id(),
            None,
            Some(v("1.0.0")),
            PendingCause::Bound { bindings: 1 },
            now,
        );
        stalled.stall(now);
        stalled.stall(now);
        assert_eq!(stalled.generation(), 1);
        assert_eq!(stalled.next_retry(), Some(now + FIRST_RETRY * 2));
        stalled.unstall();
        assert_eq!(stalled.next_retry(), Some(now + FIRST_RETRY));
        stalled.complete(2, Applied::new(0).pass().finish());
        assert_eq!(stalled.next_retry(), None);
    }
}
