//! The real-process crash test: `guild install` killed with SIGKILL at random moments, each time
//! followed by `guild list` and a full consistency check of the store on disk.
//!
//! The moments are drawn from a seeded xorshift generator, spread over the measured duration of
//! a normal install, so that kills land before, during and after the commit. Set
//! `GUILD_KILL_SEED` to replay a run (the seed is printed), `GUILD_KILL_MIN` to change the
//! number of kills (120 by default).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use guild_adapters_crypto::files::read_private_key;
use guild_adapters_fs::archive::GkpkSource;
use guild_adapters_fs::store::StoreLayout;
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::manifest::Metadata;
use guild_domain::manifest_facts::ManifestFacts;
use guild_domain::path::RESERVED_METADATA_NAME;
use guild_domain::store_state::{NewVersion, PublishOptions, StoreState};
use guild_domain::version::Version;
use guild_host::packaging::pack;
use guild_host::PackageManager;
use guild_ports::source::PackageSource;
use guild_test_support::guild::{library, template_json, Bench};

use crate::guild;

/// SIGKILL's number on every Unix this project builds for.
pub(crate) const SIGKILL: i32 = 9;

/// xorshift64*: small, fast, and the same sequence for the same seed on every machine.
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> Self {
        // Zero is the one state xorshift cannot leave.
        XorShift(seed.max(1))
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough in `0..n` for n far below 2^64.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One package archive the test installs.
pub(crate) struct Target {
    pub(crate) id: PackageId,
    pub(crate) version: Version,
    pub(crate) archive: PathBuf,
    pub(crate) digest: Sha256Digest,
    /// The keys of its signatures (each by the store's one trusted key), which an install
    /// records as those that verified.
    pub(crate) signed_by: Vec<Sha256Digest>,
    /// What the graph and the claims read of its manifest, which an install records.
    pub(crate) facts: ManifestFacts,
}

/// How one killed (or finished) install ended, inferred from the store afterwards.
#[derive(Debug, Default)]
struct Tally {
    /// Killed, nothing committed, no commit under way: before the commit (in startup,
    /// verification or extraction).
    before: u32,
    /// Of `before`, those that had staged files (killed during extraction).
    before_in_extraction: u32,
    /// Killed with a journal record on disk, undone by recovery.
    during_rolled_back: u32,
    /// Killed with a journal record on disk, finished by recovery.
    during_rolled_forward: u32,
    /// Killed after the commit point with nothing left in the journal.
    after: u32,
    /// The install finished before the kill arrived.
    finished: u32,
    /// Of `finished`, those that were refused (a downgrade without the option, a dependency).
    refused: u32,
}

impl Tally {
    fn killed(&self) -> u64 {
        u64::from(self.before + self.during_rolled_back + self.during_rolled_forward + self.after)
    }
}

pub(crate) fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn kill_install_at_random_moments_and_check_the_store() {
    let started = Instant::now();
    let seed = env_u64("GUILD_KILL_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    // Rounds go on until this many installs were really killed (an install that finishes before
    // its kill still counts as a checked round, not as a kill), within a cap.
    let min_kills = env_u64("GUILD_KILL_MIN").unwrap_or(120);
    let max_rounds = min_kills * 5;
    eprintln!("kill test: seed {seed} (GUILD_KILL_SEED={seed} replays it), {min_kills} kills");
    let mut rng = XorShift::new(seed);

    let bench = Bench::new(guild());
    bench.trust();
    let store = bench.store();
    let layout = StoreLayout::new(&store);
    let targets = make_targets(&bench, &mut rng);

    // A normal install's duration, measured from spawn to exit for each archive (the first
    // versions install afresh, later ones supersede). Each kill is drawn from 0 to 1.25 times
    // the duration of its archive's install, so that it can land anywhere in it.
    let mut windows = Vec::new();
    for t in &targets {
        let begin = Instant::now();
        let run = guild().run(
            bench.path(),
            &[
                "--store",
                store.to_str().unwrap(),
                "install",
                t.archive.to_str().unwrap(),
                "--allow-downgrade",
            ],
        );
        assert_eq!(run.code, 0, "{}", run.stderr);
        windows.push(begin.elapsed().mul_f64(1.25));
    }
    eprintln!("kill test: kill windows per archive (1.25 x a normal install): {windows:?}");

    let mut tally = Tally::default();
    let mut round = 0;
    while tally.killed() < min_kills && round < max_rounds {
        round += 1;
        let pick = rng.below(targets.len() as u64) as usize;
        let (t, window) = (&targets[pick], windows[pick]);
        // Mostly options under which the install does real work, so that kills land inside it:
        // `--disabled` never for kill.a (enabled kill.b needs it, so that install is refused
        // at once), and a downgrade without `--allow-downgrade` (refused at once) in one round
        // of six.
        let enable = t.id.as_str() == "kill.a" || rng.below(3) != 0;
        let allow_downgrade = rng.below(6) != 0;
        let before = prepare(&store, &layout, t);
        let expected = expected_after(&before, t, enable, allow_downgrade);

        let mut args = vec![
            "--store".to_owned(),
            store.display().to_string(),
            "install".to_owned(),
            t.archive.display().to_string(),
        ];
        if !enable {
            args.push("--disabled".into());
        }
        if allow_downgrade {
            args.push("--allow-downgrade".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let delay = Duration::from_nanos(rng.below(window.as_nanos() as u64));
        let mut child = guild()
            .command(bench.path(), &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        // On Unix this is SIGKILL; a child that already exited is not an error.
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let killed = status.signal() == Some(SIGKILL);

        // What the kill left, before anything recovers it.
        let journal_left = entries(&layout.journal);
        let staging_left = entries(&layout.staging);

        let list = guild().run(
            bench.path(),
            &["--store", store.to_str().unwrap(), "--json", "list"],
        );
        let context = format!(
            "round {round} (seed {seed}): {} {}@{} enable={enable} allow_downgrade={allow_downgrade}, \
             killed after {delay:?}, status {status:?}",
            t.archive.display(),
            t.id,
            t.version
        );
        assert_eq!(
            list.code, 0,
            "{context}: guild list failed:\n{}",
            list.stderr
        );
        let listed = list.json();
        // `guild list` only read the last committed generation; the next writer recovers.
        let recover = guild().run(
            bench.path(),
            &["--store", store.to_str().unwrap(), "recover"],
        );
        assert_eq!(
            recover.code, 0,
            "{context}: guild recover failed:\n{}",
            recover.stderr
        );

        let after = check_store(&store, &layout, &context);
        check_list_matches(&listed, &after, &context);
        let unchanged = after == before;
        let installed = expected.as_ref() == Some(&after);
        // When `prepare` could not make room, the install is an identical no-op that commits
        // nothing; such a kill can only land "before" a commit.
        let noop = expected.as_ref() == Some(&before);
        assert!(
            unchanged || installed,
            "{context}: the store is neither the state before the install nor the state after it\n\
             before: {before:?}\nexpected after: {expected:?}\nfound: {after:?}"
        );
        if !killed {
            // It finished: the outcome must be the exact result of the install.
            let code = status.code();
            match code {
                Some(0) => assert!(installed, "{context}: exit 0 but not installed"),
                Some(3..=6) => assert!(unchanged, "{context}: refused yet the store changed"),
                _ => panic!("{context}: unexpected exit {status:?}"),
            }
            tally.finished += 1;
            if code != Some(0) {
                tally.refused += 1;
            }
        } else if !journal_left.is_empty() {
            if installed {
                tally.during_rolled_forward += 1;
            } else {
                tally.during_rolled_back += 1;
            }
        } else if installed && !noop {
            tally.after += 1;
        } else {
            tally.before += 1;
            if !staging_left.is_empty() {
                tally.before_in_extraction += 1;
            }
        }
    }

    eprintln!(
        "kill test: {round} installs in {:?}; killed before the commit {} (of which {} during \
         extraction), during the commit {} (rolled back {}, rolled forward {}), after the commit \
         {}; finished before the kill {} (of which {} refused)",
        started.elapsed(),
        tally.before,
        tally.before_in_extraction,
        tally.during_rolled_back + tally.during_rolled_forward,
        tally.during_rolled_back,
        tally.during_rolled_forward,
        tally.after,
        tally.finished,
        tally.refused
    );
    assert!(
        tally.killed() >= min_kills,
        "only {} of {round} installs were killed before they finished: {tally:?}",
        tally.killed()
    );
}

/// Builds the archives: three versions of one package, two of a package that depends on it, and
/// one large standalone package, each with several files so that extraction takes a while.
fn make_targets(bench: &Bench, rng: &mut XorShift) -> Vec<Target> {
    let key = read_private_key(&bench.path().join("k.key")).unwrap();
    let dep = r#", "dependencies": [{"package_id": "kill.a", "min_version": "1.0.0"}]"#;
    let specs: [(&str, &str, &str, usize); 6] = [
        ("kill.a", "1.0.0", "", 512 << 10),
        ("kill.a", "1.1.0", "", 512 << 10),
        ("kill.a", "2.0.0", "", 512 << 10),
        ("kill.b", "1.0.0", dep, 256 << 10),
        ("kill.b", "2.0.0", dep, 256 << 10),
        ("kill.c", "1.0.0", "", 2 << 20),
    ];
    specs
        .iter()
        .map(|&(id, version, extra, size)| {
            let name = format!("{id}-{version}");
            let src = bench.path().join("kill-src").join(&name);
            fs::create_dir_all(src.join("data")).unwrap();
            let mut bytes = vec![0u8; size];
            for chunk in bytes.chunks_mut(8) {
                let word = rng.next().to_le_bytes();
                chunk.copy_from_slice(&word[..chunk.len()]);
            }
            // A library that loads (guild install checks it), padded with the random bytes.
            fs::write(src.join("libplugin.so"), library(&bytes)).unwrap();
            for i in 0..8 {
                fs::write(
                    src.join("data").join(format!("table{i}.bin")),
                    &bytes[..bytes.len() / 8],
                )
                .unwrap();
            }
            let template = bench.path().join(format!("{name}.kill.json"));
            fs::write(&template, template_json(id, version, extra)).unwrap();
            let archive = bench.path().join(format!("{name}.gkmodule"));
            let packed = pack(&src, &template, &archive, Some(&key)).unwrap();
            Target {
                id: PackageId::new(id).unwrap(),
                version: Version::parse(version).unwrap(),
                archive,
                digest: packed.metadata.payload_digest(),
                signed_by: packed
                    .metadata
                    .signatures()
                    .iter()
                    .map(|s| s.key_id)
                    .collect(),
                facts: ManifestFacts::of(packed.metadata.manifest()),
            }
        })
        .collect()
}

/// Makes sure the install of `t` will do real work (its version is not installed), and returns
/// the registry as it stands before the install.
fn prepare(store: &Path, layout: &StoreLayout, t: &Target) -> StoreState {
    let registry = read_registry(layout);
    if registry.is_installed(&t.id, &t.version) {
        let (pm, _) = PackageManager::open_dir(store).unwrap();
        let current = registry
            .package(&t.id)
            .and_then(|p| p.current())
            .map(|(v, _)| v.clone());
        if current.as_ref() == Some(&t.version) {
            // The current version cannot simply be removed while dependents need it; step back
            // to the previous version first when there is one, otherwise remove it (which the
            // dependents' refusals below will show).
            if pm.rollback(&t.id).is_err() {
                let _ = pm.disable(&t.id);
            }
        }
        // A refusal (an enabled dependent) leaves the version installed; the install is then an
        // identical no-op, which is a valid outcome too.
        let _ = pm.remove(&t.id, Some(&t.version));
    }
    read_registry(layout)
}

/// The registry a successful install would leave, or `None` if the registry refuses it.
pub(crate) fn expected_after(
    before: &StoreState,
    t: &Target,
    enable: bool,
    allow_downgrade: bool,
) -> Option<StoreState> {
    if before
        .record(&t.id, &t.version)
        .is_some_and(|r| r.state.is_installed())
    {
        // An identical no-op: nothing is committed.
        return Some(before.clone());
    }
    let mut next = before.successor();
    next.publish(
        &t.id,
        &t.version,
        NewVersion {
            payload_digest: t.digest,
            kind: PackageKind::Module,
            publisher: PublisherId::new("org.example").unwrap(),
            signed_by: t.signed_by.clone(),
            facts: Some(t.facts.clone()),
        },
        PublishOptions {
            enable,
            allow_downgrade,
        },
    )
    .ok()?;
    // Authenticated by the install, under the trust file the registry records.
    if let Some(anchor) = before.trust_anchor() {
        next.set_trusted_under(&t.id, &t.version, anchor.file_digest);
    }
    Some(next)
}

pub(crate) fn read_registry(layout: &StoreLayout) -> StoreState {
    guild_adapters_fs::store::read_registry(layout.root.clone())
        .unwrap()
        .unwrap()
}

/// The names in a directory (none if it does not exist).
pub(crate) fn entries(dir: &Path) -> Vec<String> {
    match fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Reopens the store and checks everything on disk against its registry; returns the registry.
pub(crate) fn check_store(store: &Path, layout: &StoreLayout, context: &str) -> StoreState {
    // `guild recover` already recovered the store, so opening again finds nothing to do:
    // recovery is complete the first time and idempotent. (Opened through the support helper, which
    // waits out a lock that a process forked by another test holds for a moment, since a caller
    // may have closed its own handle on this store just before.)
    let (pm, report) = guild_test_support::open_dir(store)
        .unwrap_or_else(|e| panic!("{context}: reopening the store failed: {e}"));
    assert!(
        report.recovery.is_clean(),
        "{context}: a second recovery had work to do: {:?}",
        report.recovery
    );
    assert!(
        report.disabled.is_empty(),
        "{context}: {:?}",
        report.disabled
    );
    drop(pm);

    let registry = read_registry(layout);
    registry
        .validate()
        .unwrap_or_else(|e| panic!("{context}: the store state breaks an invariant: {e}"));
    assert_eq!(
        entries(&layout.staging),
        Vec::<String>::new(),
        "{context}: staging leftovers"
    );
    assert_eq!(
        entries(&layout.journal),
        Vec::<String>::new(),
        "{context}: journal leftovers"
    );

    // Exactly the installed versions have trees, and each tree is the signed package.
    let mut expected_trees = BTreeSet::new();
    for (id, version, record) in registry.installed() {
        expected_trees.insert((id.to_string(), version.to_string()));
        let dir = layout.package_dir(id, version);
        let bytes = fs::read(dir.join(RESERVED_METADATA_NAME))
            .unwrap_or_else(|e| panic!("{context}: {id}@{version} has no .gkmetadata: {e}"));
        let metadata = Metadata::parse(&bytes).unwrap();
        assert_eq!(
            metadata.payload_digest(),
            record.payload_digest,
            "{context}: {id}@{version} tree holds another payload"
        );
        GkpkSource::default()
            .open(&dir)
            .and_then(|o| o.verify_in_place(metadata.manifest()))
            .unwrap_or_else(|e| panic!("{context}: {id}@{version} tree is incomplete: {e}"));
    }
    let mut found_trees = BTreeSet::new();
    for id in entries(&layout.packages) {
        for version in entries(&layout.packages.join(&id)) {
            found_trees.insert((id.clone(), version));
        }
    }
    assert_eq!(found_trees, expected_trees, "{context}: trees on disk");
    registry
}

/// `guild list --json` shows exactly the registry.
fn check_list_matches(listed: &serde_json::Value, registry: &StoreState, context: &str) {
    let mut shown = Vec::new();
    for p in listed["packages"].as_array().unwrap() {
        for v in p["versions"].as_array().unwrap() {
            shown.push((
                p["id"].as_str().unwrap().to_owned(),
                v["version"].as_str().unwrap().to_owned(),
                v["state"].as_str().unwrap().to_owned(),
                v["payload_sha256"].as_str().unwrap().to_owned(),
            ));
        }
    }
    let mut recorded = Vec::new();
    for (id, p) in registry.packages() {
        for (version, r) in p.versions() {
            recorded.push((
                id.to_string(),
                version.to_string(),
                r.state.as_str().to_owned(),
                r.payload_digest.to_hex(),
            ));
        }
    }
    assert_eq!(
        shown, recorded,
        "{context}: guild list differs from the registry"
    );
}
