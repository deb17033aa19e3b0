//! Lifecycle refusals without a race: a change that unloads or replaces a package's code
//! (disable, rollback, replacement) either returns `Leased` because a handle into the package
//! lives, or returns Ok with no handle into the replaced code alive, however resolution on other
//! threads interleaves with it. Also: `disable_waiting` wakes on the last release, and the
//! lease ledger is never held across an installation's plugin loading.
//!
//! A registry-level test shows what a lookup sees while a package drains. The races run the real
//! scan modules through every binder: the Rust face, the C face and
//! `KernelRegistry::find_by_id`. A resolver thread that holds a handle checks, while it holds
//! it, that the lifecycle thread has not reported a change Ok that took that handle's version
//! out; the lifecycle thread checks the registry's live-binding count after each Ok.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use guild_abi::GUILD_DTYPE_F32;
use guild_adapters_posix::DlopenLoader;
use guild_domain::ids::{ImplId, PackageId};
use guild_domain::lease::{LeaseError, LeaseKind, QuiescentAction};
use guild_domain::operation::DType;
use guild_domain::version::Version;
use guild_host::operations::DeviceSupport;
use guild_host::registry::{KernelRegistry, OwnedRegistry, RegistryChangeError};
use guild_host::{Host, HostError, InstallOptions, OperationService};
use guild_ports::loader::{LoadError, LoadRequest, LoadedPlugin, PluginLoader};
use guild_test_support::plugins::{alt_spec, scan_spec};
use guild_test_support::{id, key, open_dir, trust, Workshop, PUBLISHER};

use crate::c_face::{tensor, Query, Service};
use crate::operations::{desc, fixture_with, op, Fixture, INCLUSIVE_OP};
use crate::registry::{plugin, publish, scan};

use guild_test_support::plugins::INCLUSIVE;
use guild_test_support::plugins::SCAN_PACKAGE as SCAN;

/// A bound for waits that only a deadlock would exceed; no assertion depends on how long
/// anything takes.
const DEADLOCK_GUARD: Duration = Duration::from_secs(20);

/// Both scan modules: `example.scan` (priority 10) and `example.scan_alt` (priority 5), which
/// resolution falls back to while `example.scan` is draining or gone.
fn fixture() -> Fixture {
    fixture_with(
        &[scan_spec("1.0.0"), alt_spec("1.0.0")],
        DeviceSupport::host(),
    )
}

/// The slot a version takes in [`Allowed`]: its minor number plus one (0 is "none").
fn slot(version: &Version) -> u32 {
    u32::try_from(version.minor).unwrap() + 1
}

/// The versions of `example.scan` that a live handle may point into right now: the current one
/// and, while a change is in flight, the one it brings in. Two slots in one word, so that a
/// reader sees one consistent pair.
#[derive(Default)]
struct Allowed(AtomicU64);

impl Allowed {
    fn set(&self, a: u32, b: u32) {
        self.0
            .store((u64::from(a) << 32) | u64::from(b), Ordering::SeqCst);
    }

    fn permits(&self, v: u32) -> bool {
        let w = self.0.load(Ordering::SeqCst);
        (w >> 32) as u32 == v || w as u32 == v
    }
}

/// What the threads of one race share.
#[derive(Default)]
struct Race {
    stop: AtomicBool,
    round: AtomicUsize,
    allowed: Allowed,
    /// Rounds in which a resolver held a handle into a version the lifecycle thread had
    /// already taken out with an Ok.
    held_after_ok: Mutex<BTreeSet<usize>>,
    /// Rounds in which the registry counted a binding into the replaced version after an Ok.
    counted_after_ok: Mutex<BTreeSet<usize>>,
    bound_scan: AtomicUsize,
    bound_other: AtomicUsize,
    resolve_failures: Mutex<Vec<String>>,
}

impl Race {
    /// Called while a handle or binding into `example.scan` at `version` is alive: checks at
    /// once and once more after giving the lifecycle thread a chance to run, so that a handle
    /// that lives across a change's Ok is seen.
    fn holding(&self, version: u32) {
        self.bound_scan.fetch_add(1, Ordering::Relaxed);
        for check in 0..2 {
            if check > 0 {
                std::thread::yield_now();
            }
            if !self.allowed.permits(version) {
                let round = self.round.load(Ordering::SeqCst);
                self.held_after_ok.lock().unwrap().insert(round);
            }
        }
    }

    /// Called right after a change returned Ok: nothing may hold the version it took out.
    fn replaced(&self, host: &Host, round: usize, version: &Version) {
        if host.kernels().live_bindings_of(&id(SCAN), version) > 0 {
            self.counted_after_ok.lock().unwrap().insert(round);
        }
    }

    fn failed(&self, what: String) {
        self.resolve_failures.lock().unwrap().push(what);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Runs the three binders against `host` until `race.stop`, while `lifecycle` runs on this
/// thread. `versioned_c` says whether a C handle's version can be taken as the only one the
/// test installs (the C description names the package, not its version).
fn race(host: &Host, race: &Race, versioned_c: bool, lifecycle: impl FnOnce()) {
    let request = guild_host::OperationRequest::cpu(
        op(INCLUSIVE_OP),
        vec![desc(DType::F32, &[4], &[])],
        vec![desc(DType::F32, &[4], &[])],
    );
    let query = Query::cpu(
        INCLUSIVE_OP,
        vec![tensor(GUILD_DTYPE_F32, &[4], &[])],
        vec![tensor(GUILD_DTYPE_F32, &[4], &[])],
    );
    let impl_id = ImplId::new(INCLUSIVE).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let service = OperationService::new(host.kernels());
            while !race.stopped() {
                match service.resolve(&request) {
                    Ok(handle) => {
                        let d = handle.describe();
                        if d.package.as_str() == SCAN {
                            race.holding(slot(d.package_version));
                        } else {
                            race.bound_other.fetch_add(1, Ordering::Relaxed);
                        }
                        drop(handle);
                    }
                    Err(e) => race.failed(format!("rust face: {e}")),
                }
                std::thread::yield_now();
            }
        });
        s.spawn(|| {
            let service = Service::of(host.kernels());
            while !race.stopped() {
                match service.resolve(&query) {
                    Ok(handle) => {
                        let d = handle.describe().unwrap();
                        if d.package_id == SCAN && versioned_c {
                            race.holding(1);
                        } else {
                            race.bound_other.fetch_add(1, Ordering::Relaxed);
                        }
                        handle.release().unwrap();
                    }
                    Err(e) => race.failed(format!("c face: {e}")),
                }
                std::thread::yield_now();
            }
        });
        s.spawn(|| {
            while !race.stopped() {
                // `None` is what a lookup answers while the package drains or is gone.
                if let Some(binding) = host.kernels().find_by_id(&impl_id) {
                    race.holding(slot(binding.version()));
                    drop(binding);
                }
                std::thread::yield_now();
            }
        });
        // Stops the binders also when the lifecycle thread's assertion fails, so that the
        // scope can end and the failure be reported.
        let _stop = StopOnDrop(&race.stop);
        lifecycle();
    });
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Checks the outcome of one attempted change from `from` to `to` (slots; 0 is "nothing").
/// Answers whether it went through.
fn settle(
    race: &Race,
    outcome: Result<(), HostError>,
    action: QuiescentAction,
    from: u32,
    to: u32,
) -> bool {
    match outcome {
        Ok(()) => {
            race.allowed.set(to, to);
            true
        }
        Err(HostError::Leased(l)) => {
            assert_eq!(l.action, action);
            assert!(
                l.bindings > 0 && l.leases == 0,
                "a refusal names the bindings that caused it: {l}"
            );
            race.allowed.set(from, from);
            false
        }
        Err(other) => panic!("the {action} failed with something other than a refusal: {other}"),
    }
}

fn report(race: &Race, rounds: usize, what: &str) {
    let held = race.held_after_ok.lock().unwrap();
    let counted = race.counted_after_ok.lock().unwrap();
    let failures = race.resolve_failures.lock().unwrap();
    eprintln!(
        "{what}: {rounds} rounds, {} handles into example.scan, {} elsewhere",
        race.bound_scan.load(Ordering::Relaxed),
        race.bound_other.load(Ordering::Relaxed),
    );
    assert!(
        held.is_empty() && counted.is_empty(),
        "handle alive after {what} Ok in {}/{rounds} rounds (held by a resolver in {}, counted \
         by the registry in {}); first rounds: {:?}",
        held.union(&counted).count(),
        held.len(),
        counted.len(),
        held.union(&counted).take(8).collect::<Vec<_>>(),
    );
    assert!(
        failures.is_empty(),
        "a resolve failed while example.scan_alt could serve it ({} times), first: {}",
        failures.len(),
        failures[0]
    );
}

/// How many times its rounds a race may run when none of its changes has gone through yet.
const EXTRA: usize = 10;

#[test]
fn disable_racing_resolution_never_returns_ok_with_a_handle_alive() {
    const ROUNDS: usize = 2000;
    let f = fixture();
    let pkg = id(SCAN);
    let r = Race::default();
    let (mut oks, mut refused) = (0, 0);
    // Set before the binders start, like every race's first state.
    r.allowed.set(1, 1);
    let mut rounds = 0;
    race(&f.host, &r, true, || {
        for round in 0..ROUNDS * EXTRA {
            // A loaded machine can keep a binder preempted with a handle in every round; go on
            // until one change has gone through, so that both outcomes are exercised.
            if round >= ROUNDS && oks > 0 {
                break;
            }
            rounds = round + 1;
            r.round.store(round, Ordering::SeqCst);
            // While the disable runs, handles into the enabled version are still legitimate.
            r.allowed.set(1, 1);
            let outcome = f.host.disable(&pkg).map(|_| ());
            if settle(&r, outcome, QuiescentAction::Unload, 1, 0) {
                oks += 1;
                if f.host.kernels().live_bindings(&pkg) > 0 {
                    r.counted_after_ok.lock().unwrap().insert(round);
                }
                r.allowed.set(0, 1);
                f.host.enable(&pkg).unwrap();
                r.allowed.set(1, 1);
            } else {
                refused += 1;
            }
        }
    });
    eprintln!("disable: {oks} went through, {refused} refused");
    report(&r, rounds, "disable");
    assert!(oks > 0, "no disable went through in {rounds} rounds");
    assert_eq!(f.host.kernels().live_bindings(&pkg), 0);
}

#[test]
fn rollback_and_reactivation_racing_resolution_never_return_ok_with_a_handle_alive() {
    const ROUNDS: usize = 1000;
    let f = fixture();
    let pkg = id(SCAN);
    let v11 = f.shop.build(&scan_spec("1.1.0"), &f.key);
    f.host
        .install(&v11.archive, InstallOptions::default())
        .unwrap();
    let (v10, v11s) = (slot(&Version::new(1, 0, 0)), slot(&Version::new(1, 1, 0)));
    let r = Race::default();
    let (mut rollbacks, mut forwards, mut refused) = (0, 0, 0);
    r.allowed.set(v11s, v11s);
    let mut rounds = 0;
    race(&f.host, &r, false, || {
        let mut current = v11s;
        for round in 0..ROUNDS * EXTRA {
            if round >= ROUNDS && rollbacks > 0 {
                break;
            }
            rounds = round + 1;
            r.round.store(round, Ordering::SeqCst);
            if current == v11s {
                // Roll back to 1.0.0; until it returns, handles into either are legitimate.
                r.allowed.set(v11s, v10);
                let outcome = f.host.rollback(&pkg).map(|_| ());
                if settle(&r, outcome, QuiescentAction::Rollback, v11s, v10) {
                    r.replaced(&f.host, round, &Version::new(1, 1, 0));
                    rollbacks += 1;
                    current = v10;
                } else {
                    refused += 1;
                }
            } else {
                // Offering 1.1.0 again makes it current again (a replacement).
                r.allowed.set(v10, v11s);
                let outcome = f
                    .host
                    .install(&v11.archive, InstallOptions::default())
                    .map(|i| assert!(i.reactivated));
                if settle(&r, outcome, QuiescentAction::Replace, v10, v11s) {
                    r.replaced(&f.host, round, &Version::new(1, 0, 0));
                    forwards += 1;
                    current = v11s;
                } else {
                    refused += 1;
                }
            }
        }
    });
    eprintln!("rollback: {rollbacks} rollbacks, {forwards} reactivations, {refused} refused");
    report(&r, rounds, "rollback or reactivation");
    assert!(rollbacks > 0, "no rollback went through in {rounds} rounds");
}

#[test]
fn installing_new_versions_racing_resolution_never_returns_ok_with_a_handle_alive() {
    const ROUNDS: usize = 150;
    let f = fixture();
    // Versions 1.1.0 to 1.ROUNDS.0, each installed over the one before once nothing holds it.
    let built: Vec<_> = (1..=ROUNDS)
        .map(|minor| f.shop.build(&scan_spec(&format!("1.{minor}.0")), &f.key))
        .collect();
    let r = Race::default();
    let (mut installed, mut refused) = (0, 0);
    r.allowed
        .set(slot(&Version::new(1, 0, 0)), slot(&Version::new(1, 0, 0)));
    let mut rounds = 0;
    race(&f.host, &r, false, || {
        let mut current = slot(&Version::new(1, 0, 0));
        let mut current_version = Version::new(1, 0, 0);
        // Past ROUNDS only while nothing went through, so `installed` stays a valid index.
        for round in 0..ROUNDS * EXTRA {
            if round >= ROUNDS && installed > 0 {
                break;
            }
            rounds = round + 1;
            r.round.store(round, Ordering::SeqCst);
            let next = &built[installed];
            let to = slot(&next.version());
            r.allowed.set(current, to);
            let outcome = f
                .host
                .install(&next.archive, InstallOptions::default())
                .map(|_| ());
            if settle(&r, outcome, QuiescentAction::Replace, current, to) {
                r.replaced(&f.host, round, &current_version);
                installed += 1;
                current = to;
                current_version = next.version();
            } else {
                refused += 1;
            }
        }
    });
    eprintln!("install: {installed} installed, {refused} refused");
    report(&r, rounds, "install");
    assert!(
        installed > 0,
        "no installation went through in {rounds} rounds"
    );
}

#[test]
fn a_draining_package_is_passed_over_and_bindable_again_once_the_drain_ends() {
    let open = Arc::new(AtomicU64::new(0));
    let reg = OwnedRegistry::new();
    publish(&reg, plugin("a.pkg", "1.0.0", &[("a.k", 10)], &open));
    let b_closed = publish(&reg, plugin("b.pkg", "1.0.0", &[("b.k", 5)], &open));
    let (a, a_k) = (id("a.pkg"), ImplId::new("a.k").unwrap());
    let chosen = |reg: &KernelRegistry| reg.select(&scan()).map(|b| b.impl_id.to_string());

    // A live binding refuses the drain, which leaves no mark behind.
    let held = reg.find_by_id(&a_k).unwrap();
    let copy = held.clone();
    match reg.drain(&a).unwrap_err() {
        RegistryChangeError::Bound { package, bindings } => {
            assert_eq!((package, bindings), (a.clone(), 2))
        }
        other => panic!("expected a refusal for bindings, got {other}"),
    }
    assert_eq!(chosen(&reg).as_deref(), Some("a.k"));
    drop((held, copy));
    assert_eq!(reg.live_bindings(&a), 0);

    // Drained: every lookup treats the package as gone, and nothing is counted.
    let drain = reg.drain(&a).unwrap();
    assert_eq!(
        chosen(&reg).as_deref(),
        Some("b.k"),
        "select takes the next best"
    );
    assert!(reg.find_by_id(&a_k).is_none());
    assert_eq!(reg.live_bindings(&a), 0);
    // Aborted: bindable again.
    drop(drain);
    assert_eq!(chosen(&reg).as_deref(), Some("a.k"));

    // Committed: unloaded for good.
    let drain = reg.drain(&a).unwrap();
    let unloaded = reg.unload(&a).unwrap();
    drain.finish();
    assert_eq!(unloaded.deferred_bindings, 0);
    assert_eq!(chosen(&reg).as_deref(), Some("b.k"));
    assert!(!b_closed.load(Ordering::SeqCst));
    assert_eq!(
        open.load(Ordering::SeqCst),
        1,
        "a's library closed with the unload"
    );
}

/// A drain finished although nothing took the package out (drain, finish, then disable and
/// enable instead of an unload) must not leave it draining for good.
#[test]
fn a_drain_finished_without_an_unload_leaves_the_package_bindable() {
    let open = Arc::new(AtomicU64::new(0));
    let reg = OwnedRegistry::new();
    publish(&reg, plugin("a.pkg", "1.0.0", &[("a.k", 10)], &open));
    let (a, a_k) = (id("a.pkg"), ImplId::new("a.k").unwrap());
    reg.drain(&a).unwrap().finish();
    reg.set_enabled(&a, false).unwrap();
    assert!(reg.find_by_id(&a_k).is_none(), "disabled");
    reg.set_enabled(&a, true).unwrap();
    assert!(
        reg.find_by_id(&a_k).is_some(),
        "enabled and loaded, so bindable again"
    );
    assert_eq!(
        reg.select(&scan())
            .map(|b| b.impl_id.to_string())
            .as_deref(),
        Some("a.k")
    );
}

/// Bindings are counted on the stripe of the thread that took them: copies made and dropped
/// on other threads, and more threads than stripes, must still add up exactly, and every live
/// one must refuse a drain.
#[test]
fn bindings_taken_copied_and_dropped_on_many_threads_all_count() {
    const THREADS: usize = 12;
    let open = Arc::new(AtomicU64::new(0));
    let reg = OwnedRegistry::new();
    publish(&reg, plugin("a.pkg", "1.0.0", &[("a.k", 10)], &open));
    let (a, a_k) = (id("a.pkg"), ImplId::new("a.k").unwrap());
    let refused = |reg: &OwnedRegistry| match reg.drain(&a) {
        Err(RegistryChangeError::Bound { bindings, .. }) => bindings,
        Err(other) => panic!("expected a refusal for bindings, got {other}"),
        Ok(_) => 0,
    };

    // Taken on more threads than there are stripes, each copied on its own thread.
    let (originals, copies): (Vec<_>, Vec<_>) = std::thread::scope(|s| {
        let taken: Vec<_> = (0..THREADS)
            .map(|_| s.spawn(|| reg.find_by_id(&a_k).expect("bindable")))
            .collect();
        taken
            .into_iter()
            .map(|t| t.join().unwrap())
            .map(|b| {
                let copy = std::thread::scope(|t| t.spawn(|| b.clone()).join().unwrap());
                (b, copy)
            })
            .unzip()
    });
    assert_eq!(reg.live_bindings(&a), 2 * THREADS as u64);
    assert_eq!(refused(&reg), 2 * THREADS as u64);

    // The originals dropped on one other thread: the copies still refuse.
    std::thread::spawn(move || drop(originals)).join().unwrap();
    assert_eq!(reg.live_bindings(&a), THREADS as u64);
    assert_eq!(refused(&reg), THREADS as u64);
    assert!(
        reg.find_by_id(&a_k).is_some(),
        "a refused drain leaves no mark"
    );

    // The last copies dropped here: nothing is counted and the drain goes through.
    drop(copies);
    assert_eq!(reg.live_bindings(&a), 0);
    let drain = reg.drain(&a).expect("nothing is bound");
    assert!(reg.find_by_id(&a_k).is_none());
    drop(drain);
    assert!(reg.find_by_id(&a_k).is_some());
}

#[test]
fn disable_waiting_returns_after_the_last_release() {
    let f = fixture();
    let pkg = id(SCAN);
    let service = OperationService::new(f.host.kernels());
    let request = guild_host::OperationRequest::cpu(
        op(INCLUSIVE_OP),
        vec![desc(DType::F32, &[4], &[])],
        vec![desc(DType::F32, &[4], &[])],
    );
    let first = service.resolve(&request).unwrap();
    let second = service.resolve(&request).unwrap();
    assert_eq!(first.describe().package.as_str(), SCAN);
    assert_eq!(f.host.kernels().live_bindings(&pkg), 2);

    // A wait that runs out returns the refusal and changes nothing.
    match f
        .host
        .disable_waiting(&pkg, Duration::from_millis(20))
        .unwrap_err()
    {
        HostError::Leased(l) => assert_eq!((l.action, l.bindings), (QuiescentAction::Unload, 2)),
        other => panic!("expected a lease refusal, got {other}"),
    }
    assert!(f.host.kernels().loaded_version(&pkg).is_some());

    let released = AtomicBool::new(false);
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let outcome = f.host.disable_waiting(&pkg, Duration::from_secs(600));
            (outcome, released.load(Ordering::SeqCst))
        });
        drop(first);
        released.store(true, Ordering::SeqCst);
        drop(second);
        // The wait ends on the last release's notification; the guard only turns a waiter
        // that never wakes into a failure instead of a hang (its own timeout is ten minutes).
        let (tx, rx) = mpsc::channel();
        s.spawn(move || tx.send(waiting.join().unwrap()).unwrap());
        let (outcome, after_release) = rx
            .recv_timeout(DEADLOCK_GUARD)
            .expect("disable_waiting did not return after the last handle was released");
        assert_eq!(outcome.unwrap().to_string(), "1.0.0");
        assert!(
            after_release,
            "disable_waiting returned before the last release"
        );
    });
    assert_eq!(f.host.kernels().loaded_version(&pkg), None);
    assert_eq!(f.host.kernels().live_bindings(&pkg), 0);
}

/// An armed gate: where the loader says it entered, and where it waits to be told to go on.
type Gate = Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>;

/// A loader that, once armed, stops inside `load` until told to go on: an installation whose
/// plugin init is as slow as the test wants, with the ordering proven by channels.
struct GatedLoader {
    inner: DlopenLoader,
    gate: Arc<Mutex<Gate>>,
}

impl PluginLoader for GatedLoader {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        let armed = self.gate.lock().unwrap().take();
        if let Some((entered, go)) = armed {
            entered.send(()).unwrap();
            // The test always sends `go` (also when an assertion is about to fail).
            let _ = go.recv();
        }
        self.inner.load(request)
    }
}

/// Runs `f` on another thread of `s` and answers what it returned, or `None` when it did not
/// return within [`DEADLOCK_GUARD`] (it is still joined when the scope ends).
fn returns<'s, T: Send + 's>(
    s: &'s std::thread::Scope<'s, '_>,
    f: impl FnOnce() -> T + Send + 's,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    s.spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(DEADLOCK_GUARD).ok()
}

#[test]
fn a_session_lease_drop_during_a_slow_install_does_not_wait_for_it() {
    let shop = Workshop::new();
    let k = key();
    let (pm, _) = open_dir(&shop.fresh("store")).unwrap();
    trust(&pm, PUBLISHER, &k);
    let gate = Arc::new(Mutex::new(None));
    let host = Host::new(
        pm,
        Box::new(GatedLoader {
            inner: DlopenLoader::new(),
            gate: gate.clone(),
        }),
    );
    for spec in [scan_spec("1.0.0"), alt_spec("1.0.0")] {
        host.install(&shop.build(&spec, &k).archive, InstallOptions::default())
            .unwrap();
    }
    let (scan, alt): (PackageId, PackageId) = (id(SCAN), id("example.scan_alt"));
    let lease = host.packages().lease(&alt).unwrap();
    let v11 = shop.build(&scan_spec("1.1.0"), &k);

    let (entered_tx, entered_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    *gate.lock().unwrap() = Some((entered_tx, go_rx));
    let in_install = AtomicBool::new(false);
    std::thread::scope(|s| {
        let install = s.spawn(|| {
            in_install.store(true, Ordering::SeqCst);
            let outcome = host.install(&v11.archive, InstallOptions::default());
            in_install.store(false, Ordering::SeqCst);
            outcome
        });
        entered_rx
            .recv_timeout(DEADLOCK_GUARD)
            .expect("the installation reaches plugin loading");
        // From here until `go`, the installation is inside the loader.
        let dropped = returns(s, move || drop(lease));
        let counted = returns(s, || host.packages().active_package_leases(&alt));
        let leased = returns(s, || host.packages().lease(&scan).map(drop));
        let still_installing = in_install.load(Ordering::SeqCst) && !install.is_finished();
        go_tx.send(()).unwrap();
        let installed = install.join().unwrap();

        assert!(still_installing, "the installation went on without `go`");
        assert!(
            dropped.is_some(),
            "dropping a session lease waited for an installation in progress"
        );
        assert_eq!(
            counted.expect("a ledger query waited for an installation in progress"),
            Default::default()
        );
        // A lease on the package being replaced is refused while the change is pending
        // (instead of waiting for it, or slipping under it).
        match leased.expect("a lease request waited for an installation in progress") {
            Err(HostError::Lease(LeaseError::ChangePending { id, kind, action })) => {
                assert_eq!(
                    (id, kind, action),
                    (scan.clone(), LeaseKind::Lease, QuiescentAction::Replace)
                );
            }
            other => panic!("expected the lease to be refused as pending, got {other:?}"),
        }
        assert_eq!(installed.unwrap().version.to_string(), "1.1.0");
    });
    // Once the change is over, leases are granted again.
    drop(host.packages().lease(&scan).unwrap());
}

/// A plugin library whose shutdown (its drop) calls back into the registry: it looks up an
/// implementation of another package, as a module's shutdown that resolves through the service
/// would.
#[derive(Debug)]
struct CallsBackOnClose {
    id: PackageId,
    version: Version,
    registry: std::sync::Weak<OwnedRegistry>,
    target: ImplId,
}

impl guild_ports::loader::LoadedLibrary for CallsBackOnClose {
    fn package(&self) -> &PackageId {
        &self.id
    }
    fn version(&self) -> &Version {
        &self.version
    }
}

impl Drop for CallsBackOnClose {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            let _ = registry.find_by_id(&self.target);
        }
    }
}

/// A retired package's library may close on whichever thread drops its last reference; if that
/// is a drain deciding on another package, and the closing library binds into the package being
/// decided, the drain must not wait for itself. One thread drains `p` over and over; another
/// publishes, binds, unloads and unbinds versions of `q` whose close looks up `p`'s kernel. Both
/// run detached, so that a deadlock fails the test instead of hanging it.
#[test]
fn a_library_closing_during_a_drain_decision_cannot_block_it() {
    let registry = Arc::new(OwnedRegistry::new());
    let open = Arc::new(AtomicU64::new(0));
    publish(&registry, plugin("p.pkg", "1.0.0", &[("p.k", 10)], &open));
    let stop = Arc::new(AtomicBool::new(false));
    let decisions = Arc::new(AtomicU64::new(0));
    let rounds = Arc::new(AtomicU64::new(0));
    const ROUNDS: u64 = 3_000;
    {
        let (registry, stop, decisions) = (registry.clone(), stop.clone(), decisions.clone());
        std::thread::spawn(move || {
            let p = id("p.pkg");
            while !stop.load(Ordering::Relaxed) {
                let _ = registry.drain(&p);
                decisions.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    {
        let (registry, rounds) = (registry.clone(), rounds.clone());
        std::thread::spawn(move || {
            let (q, q_k) = (id("q.pkg"), ImplId::new("q.k").unwrap());
            for round in 0..ROUNDS {
                let version: Version = format!("1.0.{round}").parse().unwrap();
                let plugin = LoadedPlugin {
                    library: Arc::new(CallsBackOnClose {
                        id: q.clone(),
                        version: version.clone(),
                        registry: Arc::downgrade(&registry),
                        target: ImplId::new("p.k").unwrap(),
                    }),
                    kernels: vec![guild_ports::fakes::fake_kernel(
                        q_k.clone(),
                        1,
                        guild_domain::operation::Backend::Cpu,
                    )],
                    runners: vec![],
                };
                registry.commit(registry.prepare(&q, &version, plugin, true).unwrap());
                let bound = registry.find_by_id(&q_k).unwrap();
                registry.unload(&q).unwrap();
                drop(bound);
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let mut seen = (0, 0, std::time::Instant::now());
    while rounds.load(Ordering::Relaxed) < ROUNDS {
        std::thread::sleep(Duration::from_millis(20));
        let now = (
            decisions.load(Ordering::Relaxed),
            rounds.load(Ordering::Relaxed),
        );
        if now != (seen.0, seen.1) {
            seen = (now.0, now.1, std::time::Instant::now());
        } else if seen.2.elapsed() > DEADLOCK_GUARD {
            panic!(
                "no drain decided and no round ended for {DEADLOCK_GUARD:?} ({} decisions, {} \
                 rounds): a deadlock",
                now.0, now.1
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(decisions.load(Ordering::Relaxed) > 0);
}
