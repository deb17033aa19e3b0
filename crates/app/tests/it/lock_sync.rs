//! The all-or-nothing sync of a store to a lock file (`guild_host::lock_sync`, what `guild sync
//! LOCK --from DIR` runs) without a registry: a sync is one store transaction, so it commits
//! exactly one generation, a sync that fails or is interrupted at any store step leaves the
//! store wholly as it was or wholly synced, a dependency and its dependent can move to new major
//! versions together, and what it installs is the build it verified. Failures are injected
//! through the lifecycle hook and the store's fault plan; the `guild sync` command itself, killed
//! between its changes too, is tested with guild-cli (crates/cli/tests/it/sync.rs).

use std::fs;
use std::path::Path;

use guild_host::lock_sync::{self, StagedPackage, SyncError, SyncStaging, SyncStep};
use guild_host::package_manager::{Change, LifecycleHook};
use guild_host::{HostError, LockFile, PackageManager};
use guild_test_support::guild::Bench;

use crate::guild;

/// A hook that fails the `fail_at`-th change it is asked to prepare (counting from 0), and lets
/// every other through.
struct FailAt {
    fail_at: usize,
    seen: usize,
}

impl LifecycleHook for FailAt {
    fn prepare(&mut self, change: &Change<'_>) -> Result<(), HostError> {
        let n = self.seen;
        self.seen += 1;
        if n == self.fail_at {
            return Err(HostError::Store(guild_ports::store::StoreError::new(
                guild_ports::store::StoreErrorKind::Io,
                format!("injected failure at step {n} ({change:?})"),
            )));
        }
        Ok(())
    }
    fn committed(&mut self) {}
    fn aborted(&mut self) {}
}

/// Stages every package of `lock` from the archives in the bench, as `guild sync --from` does.
fn stage_all(
    pm: &PackageManager,
    staging: &SyncStaging,
    lock: &LockFile,
    mirror: &Path,
) -> Vec<StagedPackage> {
    let steps = lock_sync::plan(pm, lock).unwrap();
    let mut staged = Vec::new();
    for step in &steps {
        let (SyncStep::Install(l) | SyncStep::Reactivate(l)) = step else {
            continue;
        };
        let name = format!("{}-{}.{}", l.id, l.version, l.kind.as_str());
        let file = staging.copy_in(l, &mirror.join(name)).unwrap();
        staged.push(lock_sync::stage(pm, l, file).unwrap());
    }
    staged
}

fn read_lock(path: &Path) -> LockFile {
    LockFile::parse(&fs::read(path).unwrap()).unwrap()
}

#[test]
fn sync_refused_at_each_change_commits_nothing() {
    // The store starts with an unlocked package enabled, and an older alpha that the lock's
    // supersedes, itself over an older one (so that there is a rollback target to keep).
    let fx = FourChanges::new();
    let (bench, lock) = (&fx.bench, &fx.lock);
    let fresh = fx.store("fresh");
    let before = guild_test_support::disk(&fresh);
    let listed_before = bench.listed(&fresh);
    assert_eq!(listed_before["packages"][0]["previous"], "0.9.0");

    // Disable extra, install base, user and alpha: four changes; fail each in turn.
    let mut fail_at = 0;
    loop {
        let (pm, _) = PackageManager::open_dir(&fresh).unwrap();
        let staging = SyncStaging::create(&fresh).unwrap();
        let staged = stage_all(&pm, &staging, lock, bench.path());
        let mut hook = FailAt { fail_at, seen: 0 };
        let outcome = lock_sync::apply(&pm, lock, &staged, &mut hook);
        drop((staging, pm));
        match outcome {
            Err(SyncError::Step { .. }) => {
                assert_eq!(
                    bench.listed(&fresh),
                    listed_before,
                    "failing at step {fail_at} changed the registry"
                );
                // Nothing was committed: not even the registry's log has a frame more.
                assert_eq!(
                    guild_test_support::disk(&fresh),
                    before,
                    "failing at step {fail_at} changed the files"
                );
            }
            Err(e) => panic!("failing at step {fail_at}: {e}"),
            Ok(changes) => {
                assert_eq!(fail_at, 4, "{changes:?}");
                break;
            }
        }
        fail_at += 1;
    }
    // Without a failure the store matches the lock.
    let after = bench.listed(&fresh);
    let enabled: Vec<_> = after["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p["enabled"].as_str()?)))
        .collect();
    assert_eq!(
        enabled,
        [
            ("example.alpha", "2.0.0"),
            ("example.base", "1.0.0"),
            ("example.user", "1.0.0")
        ]
    );
}

#[test]
fn sync_installs_the_build_it_checked_even_if_the_mirror_changes_after() {
    let bench = Bench::new(guild());
    let scan = bench.package("example.scan", "1.0.0", b"scan build one", "");
    let mirror = bench.path().join("mirror");
    fs::create_dir(&mirror).unwrap();
    fs::copy(bench.path().join(&scan), mirror.join(&scan)).unwrap();
    let lock = read_lock(&bench.lock_of(&[&scan], &[]));
    let locked = lock.packages().next().unwrap().clone();
    // Another build of the same version, signed with the same trusted key.
    let rebuilt = bench.package("example.scan", "1.0.0", b"scan build two", "");
    assert_eq!(rebuilt, scan);

    let fresh = bench.trusting_store("fresh");
    let (pm, _) = PackageManager::open_dir(&fresh).unwrap();
    let staging = SyncStaging::create(&fresh).unwrap();
    let staged = stage_all(&pm, &staging, &lock, &mirror);
    // Between the check and the install, the mirror's file becomes the other build.
    fs::copy(bench.path().join(&rebuilt), mirror.join(&scan)).unwrap();
    let changes = lock_sync::apply(&pm, &lock, &staged, &mut NoChecks).unwrap();
    assert_eq!(changes.len(), 1);
    let summary = pm.summary(&locked.id).unwrap().unwrap();
    assert_eq!(summary.enabled.as_ref(), Some(&locked.version));
    assert_eq!(summary.versions[0].payload_digest, locked.payload_sha256);
}

/// A hook that lets every change through.
struct NoChecks;

impl LifecycleHook for NoChecks {
    fn prepare(&mut self, _: &Change<'_>) -> Result<(), HostError> {
        Ok(())
    }
    fn committed(&mut self) {}
    fn aborted(&mut self) {}
}

/// What a hook heard, in order: each change it prepared (its kind and package) with the
/// generation committed on disk at that moment, then `committed` or `aborted`.
struct Recording {
    store: std::path::PathBuf,
    fail_at: Option<usize>,
    heard: Vec<String>,
}

impl LifecycleHook for Recording {
    fn prepare(&mut self, change: &Change<'_>) -> Result<(), HostError> {
        let n = self.heard.len();
        let on_disk = guild_adapters_fs::store::read_registry(&self.store)
            .unwrap()
            .unwrap()
            .generation();
        let what = match change {
            Change::Disable { id, .. } => format!("disable {id}"),
            Change::Install { id, .. } => format!("install {id}"),
            Change::Enable { id, .. } => format!("enable {id}"),
            Change::Reactivate { id, .. } => format!("reactivate {id}"),
            other => format!("{other:?}"),
        };
        self.heard.push(format!("{what} at generation {on_disk}"));
        if self.fail_at == Some(n) {
            return Err(HostError::Store(guild_ports::store::StoreError::new(
                guild_ports::store::StoreErrorKind::Io,
                format!("injected failure at change {n}"),
            )));
        }
        Ok(())
    }
    fn committed(&mut self) {
        self.heard.push("committed".to_owned());
    }
    fn aborted(&mut self) {
        self.heard.push("aborted".to_owned());
    }
}

/// The hook prepares every change of a sync while the store still holds the generation before
/// it (what a runner following the store sees), then hears one `committed`; a refusal part way
/// is followed by one `aborted` and no commit.
#[test]
fn sync_prepares_every_change_before_its_one_commit() {
    let fx = FourChanges::new();
    for fail_at in [None, Some(2)] {
        let root = fx.store(&format!("store-{fail_at:?}"));
        let (pm, _) = PackageManager::open_dir(&root).unwrap();
        let before = pm.generation().unwrap();
        let staging = SyncStaging::create(&root).unwrap();
        let staged = stage_all(&pm, &staging, &fx.lock, fx.bench.path());
        let mut hook = Recording {
            store: root.clone(),
            fail_at,
            heard: Vec::new(),
        };
        let outcome = lock_sync::apply(&pm, &fx.lock, &staged, &mut hook);
        let at = |what: &str| format!("{what} at generation {before}");
        let mut expected = vec![
            at("disable example.extra"),
            at("install example.alpha"),
            at("install example.base"),
            at("install example.user"),
        ];
        match fail_at {
            None => {
                outcome.unwrap();
                expected.push("committed".to_owned());
                assert_eq!(pm.generation().unwrap(), before + 1);
            }
            Some(n) => {
                let message = outcome.unwrap_err().to_string();
                assert!(
                    message.contains("injected failure at change 2"),
                    "{message}"
                );
                assert!(message.ends_with("the sync changed nothing"), "{message}");
                expected.truncate(n + 1);
                expected.push("aborted".to_owned());
                assert_eq!(pm.generation().unwrap(), before);
            }
        }
        assert_eq!(hook.heard, expected);
    }
}

/// The store the sync tests start from, and the lock they sync it to: an unlocked package
/// enabled (`example.extra`) and an older alpha over an older one; the lock names base, a user
/// of base, and alpha 2.0.0. The sync disables one package and installs three: four changes.
struct FourChanges {
    bench: Bench,
    lock: LockFile,
    template: std::path::PathBuf,
}

impl FourChanges {
    fn new() -> Self {
        let bench = Bench::new(guild());
        let base = bench.package("example.base", "1.0.0", b"base", "");
        let dep = r#", "dependencies": [{"package_id": "example.base", "min_version": "1.0.0"}]"#;
        let user = bench.package("example.user", "1.0.0", b"user", dep);
        let alpha = bench.package("example.alpha", "2.0.0", b"alpha 2", "");
        let lock = read_lock(&bench.lock_of(&[&base, &user, &alpha], &[]));
        let template = bench.trusting_store("template");
        let extra = bench.package("example.extra", "1.0.0", b"extra", "");
        let alpha0 = bench.package("example.alpha", "0.9.0", b"alpha 0", "");
        let alpha1 = bench.package("example.alpha", "1.0.0", b"alpha 1", "");
        for p in [&extra, &alpha0, &alpha1] {
            bench.run_on(&template, &["install", p]).expect(0);
        }
        FourChanges {
            bench,
            lock,
            template,
        }
    }

    /// A copy of the starting store named `name`.
    fn store(&self, name: &str) -> std::path::PathBuf {
        let root = self.bench.path().join(name);
        guild_test_support::copy_tree(&self.template, &root);
        root
    }
}

/// A sync that changes several packages commits them as one change: the store's generation
/// moves by exactly one, so a runner following the store sees the state before and the state
/// after and nothing in between.
#[test]
fn sync_of_several_changes_commits_exactly_one_generation() {
    let fx = FourChanges::new();
    let root = fx.store("one");
    let (pm, _) = PackageManager::open_dir(&root).unwrap();
    let before = pm.generation().unwrap();
    let staging = SyncStaging::create(&root).unwrap();
    let staged = stage_all(&pm, &staging, &fx.lock, fx.bench.path());
    let changes = lock_sync::apply(&pm, &fx.lock, &staged, &mut NoChecks).unwrap();
    assert_eq!(changes.len(), 4, "{changes:?}");
    assert_eq!(
        pm.generation().unwrap(),
        before + 1,
        "the sync's four changes took more than one commit"
    );
    drop((staging, pm));
    let (pm, _) = PackageManager::open_dir(&root).unwrap();
    assert_eq!(pm.generation().unwrap(), before + 1);
}

/// A sync interrupted at every durable step of the store, by an error and by a crash (the
/// process stops there, as under SIGKILL or a power loss), then opened again as a restarted host
/// opens it: the store is wholly the state before the sync or wholly the state after it, never
/// one with some of its changes.
#[test]
fn sync_interrupted_at_every_store_step_recovers_to_the_old_or_the_new_state() {
    use guild_adapters_fs::store::{Fault, FaultMode};
    use guild_ports::store::StoreErrorKind;
    use guild_test_support::{assert_no_leftovers, observe, open_dir, open_host};

    let fx = FourChanges::new();
    let reopen = |root: &Path, label: &str| {
        let (pm, report) = open_dir(root).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(report.disabled, Vec::new(), "{label}");
        assert_no_leftovers(root, label);
        observe(&pm, root)
    };
    let attempt = |root: &Path, fault: Option<Fault>| {
        let host = open_host(root, fault).unwrap();
        let staging = SyncStaging::create(root).unwrap();
        let staged = stage_all(&host.pm, &staging, &fx.lock, fx.bench.path());
        let outcome = lock_sync::apply(&host.pm, &fx.lock, &staged, &mut NoChecks);
        let steps = host.store.last_op().steps;
        (outcome.map(drop), steps)
    };
    let before = reopen(&fx.store("before"), "before");
    let clean = fx.store("clean");
    let (outcome, steps) = attempt(&clean, None);
    outcome.unwrap();
    let after = reopen(&clean, "after");
    assert_ne!(before, after);
    assert!(
        steps.contains(&"fdatasync registry log (commit point)"),
        "{steps:?}"
    );

    let (mut saw_before, mut saw_after) = (0, 0);
    for (n, step) in steps.iter().enumerate().map(|(i, s)| (i + 1, s)) {
        for mode in [FaultMode::Error, FaultMode::Crash] {
            let label = format!("sync at step {n} ({step}) by {mode:?}");
            let root = fx.store(&format!("case-{n}-{mode:?}"));
            let (outcome, _) = attempt(&root, Some(Fault { step: n, mode }));
            let got = reopen(&root, &label);
            if got == before {
                saw_before += 1;
                assert!(
                    outcome.is_err(),
                    "{label}: answered Ok, the disk is the old state"
                );
            } else {
                assert_eq!(got, after, "{label}: neither the old nor the new state");
                saw_after += 1;
                if let Err(e) = &outcome {
                    let crashed = matches!(
                        e,
                        SyncError::Step { source, .. }
                            if matches!(&**source, HostError::Store(s)
                                if s.kind == StoreErrorKind::SimulatedCrash)
                    );
                    assert!(crashed, "{label}: answered {e}, the disk is the new state");
                }
            }
        }
    }
    println!(
        "sync crash matrix: {} steps, {} cases ({saw_before} old, {saw_after} new)",
        steps.len(),
        2 * steps.len()
    );
    assert!(
        saw_before > 0 && saw_after > 0,
        "{saw_before} old, {saw_after} new"
    );
}

/// A lock that moves a dependency and its dependent to new major versions together syncs: the
/// dependent's old version accepts only the old dependency and its new one only the new, so no
/// order of single changes gets there, but the final state is sound.
#[test]
fn sync_moves_a_dependency_and_its_dependent_across_major_versions_together() {
    let bench = Bench::new(guild());
    let dep = |min: &str, max: &str| {
        format!(
            r#", "dependencies": [{{"package_id": "example.base", "min_version": "{min}",
                "max_version": "{max}"}}]"#
        )
    };
    let base1 = bench.package("example.base", "1.0.0", b"base 1", "");
    let user1 = bench.package("example.user", "1.0.0", b"user 1", &dep("1.0.0", "1.9.9"));
    let base2 = bench.package("example.base", "2.0.0", b"base 2", "");
    let user2 = bench.package("example.user", "2.0.0", b"user 2", &dep("2.0.0", "2.9.9"));
    let lock = read_lock(&bench.lock_of(&[&base2, &user2], &[]));
    let root = bench.trusting_store("fresh");
    for p in [&base1, &user1] {
        bench.run_on(&root, &["install", p]).expect(0);
    }
    let (pm, _) = PackageManager::open_dir(&root).unwrap();
    let before = pm.generation().unwrap();
    let staging = SyncStaging::create(&root).unwrap();
    let staged = stage_all(&pm, &staging, &lock, bench.path());
    let changes = lock_sync::apply(&pm, &lock, &staged, &mut NoChecks)
        .unwrap_or_else(|e| panic!("the sync was refused: {e}"));
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(pm.generation().unwrap(), before + 1);
    for id in ["example.base", "example.user"] {
        let summary = pm.summary(&guild_test_support::id(id)).unwrap().unwrap();
        assert_eq!(
            summary.enabled,
            Some(guild_test_support::v("2.0.0")),
            "{id}"
        );
        assert_eq!(
            summary.previous,
            Some(guild_test_support::v("1.0.0")),
            "{id}"
        );
    }
}
