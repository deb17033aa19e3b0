//! A process killed while it publishes the scan module recovers, and the operations resolve.
//!
//! `guild install` of the signed scan gkmodule (built from test-plugins/scan_module) is killed
//! with SIGKILL at seeded random moments over the span of a normal install. After each kill the
//! store is opened in-process the production way (`Host::open_dir`: recovery, re-verification,
//! dlopen of what is enabled); the store must hold either the state before the install or the
//! state after it; an install the kill undid is completed in-process; then both scans resolve
//! through the operation service to the installed version and execute correctly, and a second
//! open finds a clean, consistent store. kill.rs does the same at a larger scale with placeholder
//! libraries and no loading.
//!
//! `GUILD_KILL_SEED` replays a run (the seed is printed); `GUILD_KILL_MODULES_MIN` sets how many
//! installs must really be killed (30 by default).

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use guild_adapters_fs::store::StoreLayout;
use guild_domain::manifest_facts::ManifestFacts;
use guild_domain::operation::DType;
use guild_domain::store_state::StoreState;
use guild_domain::version::Version;
use guild_host::operations::{TensorArg, TensorArgMut};
use guild_host::{Host, InstallOptions, OperationRequest, OperationService};
use guild_test_support::plugins::scan_spec;
use guild_test_support::{key, open_dir, retry_locked, trust, Workshop, PUBLISHER};

use crate::guild;
use crate::kill::{
    check_store, entries, env_u64, expected_after, read_registry, Target, XorShift, SIGKILL,
};
use crate::operations::{desc, op, EXCLUSIVE_OP, INCLUSIVE_OP};

/// How the rounds ended, judged from the store after each kill.
#[derive(Debug, Default)]
struct Tally {
    /// Killed before the commit: recovery left the state before the install.
    before: u32,
    /// Killed with a journal record on disk, which recovery undid or finished.
    rolled_back: u32,
    rolled_forward: u32,
    /// Killed after the commit point, with the journal already empty.
    after: u32,
    /// The install exited before the kill arrived.
    finished: u32,
}

impl Tally {
    fn killed(&self) -> u32 {
        self.before + self.rolled_back + self.rolled_forward + self.after
    }
}

#[test]
fn kill_module_install_then_recover_and_resolve_the_scans() {
    let started = Instant::now();
    let seed = env_u64("GUILD_KILL_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let min_kills = env_u64("GUILD_KILL_MODULES_MIN").unwrap_or(30);
    let max_rounds = min_kills * 5;
    eprintln!("kill modules: seed {seed} (GUILD_KILL_SEED={seed} replays it), {min_kills} kills");
    let mut rng = XorShift::new(seed);

    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let layout = StoreLayout::new(&store);
    {
        let (pm, _) = open_dir(&store).unwrap();
        trust(&pm, PUBLISHER, &k);
    }
    let targets: Vec<Target> = ["1.0.0", "1.1.0", "1.2.0"]
        .iter()
        .map(|version| {
            let built = shop.build(&scan_spec(version), &k);
            Target {
                id: built.id(),
                version: built.version(),
                archive: built.archive.clone(),
                digest: built.digest(),
                signed_by: built
                    .metadata
                    .signatures()
                    .iter()
                    .map(|s| s.key_id)
                    .collect(),
                facts: ManifestFacts::of(built.metadata.manifest()),
            }
        })
        .collect();
    let install_args = |t: &Target| -> Vec<String> {
        vec![
            "--store".into(),
            store.display().to_string(),
            "install".into(),
            t.archive.display().to_string(),
            "--allow-downgrade".into(),
        ]
    };

    // A normal install of each archive, timed from spawn to exit; each kill lands somewhere in
    // 0 to 1.25 times that to begin with.
    let mut windows = Vec::new();
    for t in &targets {
        let args = install_args(t);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let begin = Instant::now();
        let out = guild().command(shop.path(), &args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        windows.push(begin.elapsed().mul_f64(1.25));
    }
    eprintln!("kill modules: kill windows: {windows:?}");

    let mut tally = Tally::default();
    let mut round = 0;
    while u64::from(tally.killed()) < min_kills && round < max_rounds {
        round += 1;
        let pick = rng.below(targets.len() as u64) as usize;
        let (t, window) = (&targets[pick], windows[pick]);
        let before = make_room(&store, &layout, t);
        let expected = expected_after(&before, t, true, true)
            .expect("an enabled install with --allow-downgrade is always accepted");

        let args = install_args(t);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let delay = Duration::from_nanos(rng.below(window.as_nanos() as u64));
        let mut child = guild()
            .command(shop.path(), &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let killed = status.signal() == Some(SIGKILL);
        // The machine's load changes while the test runs (other tests spawn processes too): a
        // window that let the install finish shrinks, one that caught it grows a little, so that
        // kills keep landing inside installs.
        windows[pick] = window.mul_f64(if killed { 1.05 } else { 0.85 });
        let journal_left = !entries(&layout.journal).is_empty();
        let context = format!(
            "round {round} (seed {seed}): {}@{} killed after {delay:?}, status {status:?}",
            t.id, t.version
        );

        // Open the production way: recovery, re-verification, and dlopen of what is enabled.
        let (host, report, loaded) = retry_locked(|| Host::open_dir(&store))
            .unwrap_or_else(|e| panic!("{context}: opening failed: {e}"));
        assert!(report.disabled.is_empty(), "{context}: {report:?}");
        assert!(
            loaded.failed.is_empty() && loaded.skipped.is_empty(),
            "{context}: {loaded:?}"
        );
        let recovered = read_registry(&layout);
        let installed = recovered == expected;
        assert!(
            installed || recovered == before,
            "{context}: the store is neither the state before the install nor after it\n\
             before: {before:?}\nexpected: {expected:?}\nfound: {recovered:?}"
        );
        if !killed {
            assert_eq!(status.code(), Some(0), "{context}");
            assert!(installed, "{context}: exit 0 but not installed");
            tally.finished += 1;
        } else if journal_left {
            if installed {
                tally.rolled_forward += 1;
            } else {
                tally.rolled_back += 1;
            }
        } else if installed {
            tally.after += 1;
        } else {
            tally.before += 1;
        }

        // What is enabled now is what was loaded, and it serves the scans.
        let enabled = enabled_version(&recovered, t);
        assert_eq!(
            host.kernels().loaded_version(&t.id),
            enabled,
            "{context}: loaded version"
        );
        if let Some(version) = &enabled {
            check_scans(&host, version, &context);
        }
        if !installed {
            let done = host
                .install(
                    &t.archive,
                    InstallOptions {
                        enable: true,
                        allow_downgrade: true,
                    },
                )
                .unwrap_or_else(|e| panic!("{context}: completing the install failed: {e}"));
            assert!(done.changed && done.enabled, "{context}: {done:?}");
            assert_eq!(read_registry(&layout), expected, "{context}: completed");
        }
        assert_eq!(
            host.kernels().loaded_version(&t.id).as_ref(),
            Some(&t.version),
            "{context}"
        );
        check_scans(&host, &t.version, &context);
        drop(host);

        // The host read the store without recovering it (a reader); the next writer recovers,
        // and opened again after that, there is nothing left to do and the disk matches the
        // registry.
        drop(
            guild_test_support::open_dir(&store)
                .unwrap_or_else(|e| panic!("{context}: recovering failed: {e}")),
        );
        check_store(&store, &layout, &context);
    }

    eprintln!(
        "kill modules: {round} rounds in {:?}: {tally:?}",
        started.elapsed()
    );
    assert!(
        u64::from(tally.killed()) >= min_kills,
        "only {} of {round} installs were killed before they finished: {tally:?}",
        tally.killed()
    );
}

/// Makes sure installing `t` does real work (its version is not installed), through a host as a
/// running process would, and returns the registry as it stands then.
fn make_room(store: &std::path::Path, layout: &StoreLayout, t: &Target) -> StoreState {
    let registry = read_registry(layout);
    if registry.is_installed(&t.id, &t.version) {
        let (host, _, _) = retry_locked(|| Host::open_dir(store)).unwrap();
        let current = registry
            .package(&t.id)
            .and_then(|p| p.current())
            .map(|(v, _)| v.clone());
        if current.as_ref() == Some(&t.version) && host.rollback(&t.id).is_err() {
            host.disable(&t.id).unwrap();
        }
        host.remove(&t.id, Some(&t.version)).unwrap();
    }
    read_registry(layout)
}

/// The enabled version of `t`'s package in `registry`.
fn enabled_version(registry: &StoreState, t: &Target) -> Option<Version> {
    registry.package(&t.id).and_then(|p| p.enabled()).cloned()
}

/// Both scans resolve to `version` of the scan module and compute the right answer.
#[track_caller]
fn check_scans(host: &Host, version: &Version, context: &str) {
    let service = OperationService::new(host.kernels());
    let d = desc(DType::I64, &[4, 2], &[]);
    let input = [1i64, 2, 3, 4, 10, 20, 30, 40];
    for (name, want) in [
        (INCLUSIVE_OP, [1i64, 3, 6, 10, 10, 30, 60, 100]),
        (EXCLUSIVE_OP, [0i64, 1, 3, 6, 0, 10, 30, 60]),
    ] {
        let handle = service
            .resolve(&OperationRequest::cpu(op(name), vec![d], vec![d]))
            .unwrap_or_else(|e| panic!("{context}: {name} does not resolve: {e}"));
        assert_eq!(
            handle.describe().package_version,
            version,
            "{context}: {name}"
        );
        let mut out = [0i64; 8];
        handle
            .execute(
                &[TensorArg::new(&d, &input)],
                &mut [TensorArgMut::new(&d, &mut out)],
                None,
            )
            .unwrap_or_else(|e| panic!("{context}: {name} failed: {e}"));
        assert_eq!(out, want, "{context}: {name}");
    }
}
