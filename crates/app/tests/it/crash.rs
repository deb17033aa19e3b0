//! The crash matrix at the package manager's level: every operation, interrupted at every durable
//! step of the store, by an error and by a crash, then reopened the way a restarted host opens its
//! store (`PackageManager::open_dir`). What a user can observe (the listing, the trust store and the
//! installed trees, byte for byte) must be exactly the state before the operation or exactly the
//! state after it, with no staging or journal leftovers, and the answer the caller got must agree
//! with which one it is.
//!
//! The store's contract decides one detail: a fault in the cleanup after the commit point (deleting
//! an old tree, removing the journal record) does not fail the commit, because the change is
//! already durable; the operation answers success and the next open finishes the cleanup. Every
//! other injected error fails the operation and leaves the before-state, on disk and in the live
//! handle, without waiting for a reopen.

use std::path::Path;

use guild_adapters_crypto::SigningKey;
use guild_adapters_fs::store::{Fault, FaultMode};
use guild_host::{HostError, InstallOptions};
use guild_ports::store::StoreErrorKind;
use guild_test_support::{
    assert_no_leftovers, copy_tree, id, key, observe, open_dir, open_host, publisher, trust, Built,
    Host, Observed, Scratch, Spec, Workshop, PUBLISHER,
};

/// The packages and keys every operation uses, built once.
struct Fixture {
    /// Holds the built archives.
    _shop: Workshop,
    key: SigningKey,
    /// Trusted too; revoked by the "open with a revocation to apply" operation.
    side: SigningKey,
    /// Not trusted; the trust update adds it.
    extra: SigningKey,
    core1: Built,
    core2: Built,
    /// `example.core` 1.0.0 signed by the side key.
    side_core: Built,
    app: Built,
}

impl Fixture {
    fn new() -> Self {
        let shop = Workshop::new();
        let (key, side, extra) = (key(), key(), key());
        let core1 = shop.build(&Spec::module("example.core", "1.0.0"), &key);
        let core2 = shop.build(&Spec::module("example.core", "2.0.0"), &key);
        let side_core = shop.build(&Spec::module("example.core", "1.0.0"), &side);
        let app = shop.build(
            &Spec::module("example.app", "1.0.0")
                .module_dep(guild_test_support::ModDep::on("example.core", "1.0.0")),
            &key,
        );
        Fixture {
            _shop: shop,
            key,
            side,
            extra,
            core1,
            core2,
            side_core,
            app,
        }
    }

    fn install(&self, host: &Host, built: &Built) {
        host.pm
            .install(&built.archive, InstallOptions::default())
            .unwrap();
    }
}

/// How the state after a reopen relates to the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settles {
    /// Before or after, whichever the interruption left.
    BeforeOrAfter,
    /// Always after: the operation is the re-verification that opening itself performs, so
    /// opening again re-applies it.
    Reapplied,
}

/// One operation of the matrix.
struct Operation {
    name: &'static str,
    /// Builds the before-state in a freshly opened store.
    setup: fn(&Host, &Fixture),
    /// Runs the operation on a store opened with the fault plan.
    run: fn(&Host, &Fixture) -> Result<(), HostError>,
    settles: Settles,
}

fn operations() -> Vec<Operation> {
    vec![
        Operation {
            name: "install new",
            setup: |_, _| {},
            run: |h, fx| {
                h.pm.install(&fx.core1.archive, InstallOptions::default())
                    .map(drop)
            },
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "install with a dependency",
            setup: |h, fx| fx.install(h, &fx.core1),
            run: |h, fx| {
                h.pm.install(&fx.app.archive, InstallOptions::default())
                    .map(drop)
            },
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "install superseding",
            setup: |h, fx| fx.install(h, &fx.core1),
            run: |h, fx| {
                h.pm.install(&fx.core2.archive, InstallOptions::default())
                    .map(drop)
            },
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "enable",
            setup: |h, fx| {
                fx.install(h, &fx.core1);
                h.pm.disable(&id("example.core")).unwrap();
            },
            run: |h, _| h.pm.enable(&id("example.core")).map(drop),
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "disable",
            setup: |h, fx| fx.install(h, &fx.core1),
            run: |h, _| h.pm.disable(&id("example.core")).map(drop),
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "remove a superseded version",
            setup: |h, fx| {
                fx.install(h, &fx.core1);
                fx.install(h, &fx.core2);
            },
            run: |h, _| {
                h.pm.remove(&id("example.core"), Some(&guild_test_support::v("1.0.0")))
                    .map(drop)
            },
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "remove the current version",
            setup: |h, fx| fx.install(h, &fx.core1),
            run: |h, _| h.pm.remove(&id("example.core"), None).map(drop),
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "rollback",
            setup: |h, fx| {
                fx.install(h, &fx.core1);
                fx.install(h, &fx.core2);
            },
            run: |h, _| h.pm.rollback(&id("example.core")).map(drop),
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "trust update",
            setup: |_, _| {},
            run: |h, fx| {
                let spki = fx.extra.public_key().spki_der().to_vec();
                h.pm.update_trust(|t| {
                    t.add_key(publisher("org.side"), spki)?;
                    t.revoke_digest(fx.core2.digest(), "recalled");
                    Ok(())
                })
            },
            settles: Settles::BeforeOrAfter,
        },
        Operation {
            name: "open with a revocation to apply",
            setup: |h, fx| {
                fx.install(h, &fx.side_core);
                fx.install(h, &fx.app);
                h.pm.update_trust(|t| Ok(t.revoke_key(fx.side.key_id(), "compromised")))
                    .unwrap();
            },
            // Opening the store is the operation: its re-verification commits the taint.
            run: |_, _| Ok(()),
            settles: Settles::Reapplied,
        },
    ]
}

/// Prepares `op`'s before-state in a store at `dir/template` and closes it.
fn template(op: &Operation, fx: &Fixture, dir: &Path) -> std::path::PathBuf {
    let root = dir.join("template");
    let host = open_host(&root, None).unwrap();
    trust(&host.pm, PUBLISHER, &fx.key);
    trust(&host.pm, PUBLISHER, &fx.side);
    (op.setup)(&host, fx);
    root
}

/// Reopens the store the way a restarted host does and observes it; checks that nothing is left
/// over and that nothing failed re-verification (except where the operation is that).
fn reopen(root: &Path, label: &str, settles: Settles) -> Observed {
    let (pm, report) =
        open_dir(root).unwrap_or_else(|e| panic!("{label}: the store does not open: {e}"));
    if settles == Settles::BeforeOrAfter {
        assert_eq!(report.disabled, Vec::new(), "{label}");
    }
    assert_no_leftovers(root, label);
    observe(&pm, root)
}

/// Opens a copy of `template` at `root` with `fault` armed and runs `op` (for the re-verifying
/// open, opening is the run). Answers the outcome, the steps of the store's last durable
/// operation, and what the live handle showed afterwards when the store stayed usable.
fn attempt(
    op: &Operation,
    fx: &Fixture,
    root: &Path,
    fault: Option<Fault>,
) -> (Result<(), HostError>, Vec<&'static str>, Option<Observed>) {
    let host = match open_host(root, fault) {
        Ok(host) => host,
        Err(e) => return (Err(e), Vec::new(), None),
    };
    let outcome = (op.run)(&host, fx);
    let steps = host.store.last_op().steps;
    let live = match &outcome {
        Err(HostError::Store(e)) if e.kind == StoreErrorKind::SimulatedCrash => None,
        _ => Some(observe(&host.pm, root)),
    };
    (outcome, steps, live)
}

#[test]
fn crash_matrix_every_operation_every_step_both_modes() {
    let fx = Fixture::new();
    let mut total = 0;
    let mut summary = Vec::new();
    for op in operations() {
        let dir = Scratch::new();
        let template = template(&op, &fx, dir.path());

        // The undisturbed run: its steps, the before-state and the after-state.
        let clean = dir.path().join("clean");
        copy_tree(&template, &clean);
        let before = match op.settles {
            Settles::BeforeOrAfter => {
                let probe = dir.path().join("probe");
                copy_tree(&template, &probe);
                Some(reopen(&probe, op.name, op.settles))
            }
            // Observing the before-state through the package manager would apply it.
            Settles::Reapplied => None,
        };
        let (outcome, steps, _) = attempt(&op, &fx, &clean, None);
        outcome.unwrap_or_else(|e| panic!("{}: {e}", op.name));
        let after = reopen(&clean, op.name, op.settles);
        if let Some(before) = &before {
            assert_ne!(before, &after, "{}: the operation changed nothing", op.name);
        }
        assert!(!steps.is_empty(), "{}: no durable step", op.name);
        // Everything after the fdatasync that makes the commit's log frame durable is cleanup.
        let commit_point = steps
            .iter()
            .position(|s| *s == "fdatasync registry log (commit point)")
            .unwrap_or_else(|| panic!("{}: no commit point in {steps:?}", op.name));

        let (mut saw_before, mut saw_after) = (0, 0);
        for (n, step) in steps.iter().enumerate().map(|(i, s)| (i + 1, s)) {
            for mode in [FaultMode::Error, FaultMode::Crash] {
                let label = format!("{} at step {n} ({step}) by {mode:?}", op.name);
                let root = dir.path().join(format!("case-{n}-{mode:?}"));
                copy_tree(&template, &root);
                let (outcome, _, live) = attempt(&op, &fx, &root, Some(Fault { step: n, mode }));
                let cleanup = n > commit_point + 1;
                match (&outcome, mode) {
                    (Err(HostError::Store(e)), FaultMode::Crash) => {
                        assert_eq!(e.kind, StoreErrorKind::SimulatedCrash, "{label}: {e}");
                    }
                    (Err(HostError::Store(e)), FaultMode::Error) => {
                        assert_eq!(e.kind, StoreErrorKind::Io, "{label}: {e}");
                        assert!(!cleanup, "{label}: a cleanup fault failed the operation");
                        // The failure is already undone: the live handle shows the before-state
                        // without a reopen.
                        if let (Some(live), Some(before)) = (&live, &before) {
                            assert_eq!(live, before, "{label}: the live handle");
                        }
                    }
                    (Ok(()), FaultMode::Error) => {
                        assert!(cleanup, "{label}: the injected error was swallowed");
                        // The change stands; only the leftover tree waits for the next open.
                        let live = live.as_ref().unwrap();
                        assert_eq!(live.packages, after.packages, "{label}: the live handle");
                        assert_eq!(live.trust, after.trust, "{label}: the live handle");
                    }
                    (Ok(()), FaultMode::Crash) => panic!("{label}: the crash did not happen"),
                    (Err(other), _) => panic!("{label}: not a store error: {other}"),
                }
                let got = reopen(&root, &label, op.settles);
                if Some(&got) == before.as_ref() {
                    saw_before += 1;
                    assert!(
                        outcome.is_err(),
                        "{label}: answered Ok, the disk is the before-state"
                    );
                } else {
                    assert_eq!(
                        got, after,
                        "{label}: neither the before- nor the after-state"
                    );
                    saw_after += 1;
                    if let Err(e) = &outcome {
                        assert!(
                            matches!(e, HostError::Store(s) if s.kind == StoreErrorKind::SimulatedCrash)
                                || op.settles == Settles::Reapplied,
                            "{label}: answered {e}, the disk is the after-state"
                        );
                    }
                }
                total += 1;
            }
        }
        if op.settles == Settles::BeforeOrAfter {
            assert!(
                saw_before > 0 && saw_after > 0,
                "{}: {saw_before} before, {saw_after} after",
                op.name
            );
        }
        summary.push(format!(
            "{}: {} steps, {} cases ({saw_before} before, {saw_after} after)",
            op.name,
            steps.len(),
            2 * steps.len()
        ));
    }
    for line in &summary {
        println!("{line}");
    }
    println!(
        "app crash matrix: {total} (operation, step, mode) cases over {} operations, each the \
         before- or the after-state",
        summary.len()
    );
    assert!(total >= 150, "{total}");
}
