//! Does a commit grow with the store? Times one install-shaped commit (a new package with a
//! small staged tree: a manifest and a 4 KiB library) into stores of 10, 1,000 and 10,000
//! installed packages, built synthetically with `FsStore` (no signing), and next to it, in the
//! same run and on the same stores, the commit as it was before the registry log: the same
//! commit plus checking every package of the new state and rewriting the whole registry file
//! (encode, write, fsync, rename, fsync the directory) as its commit point. The ratios 10k/10 of both are printed, with the fsyncs per commit and
//! what a compaction costs spread over the commits between two of them.
//!
//! `cargo bench -p guild-adapters-fs --bench commit_scale` (without `--bench`, as under `cargo
//! test --benches`, stores of 10, 20 and 40 only). The stores live in a temporary directory
//! (`TMPDIR`, or the system's: on a tmpfs the fsyncs cost nothing and what is left is the work
//! that can grow with the store).

use std::fs::{self, File};
use std::time::{Duration, Instant};

use guild_adapters_fs::store::{FsStore, StoreLayout, StoreOptions};
use guild_domain::ids::PackageId;
use guild_domain::store_state::StoreState;
use guild_domain::version::Version;
use guild_ports::store::{PackageStore, Transaction};

mod common;
use common::{build_store, new_version, write_tree, ENABLE};

const SIZES: [usize; 3] = [10, 1_000, 10_000];
/// The sizes when run without `--bench` (as by `cargo test --benches`): a smoke run.
const SMOKE_SIZES: [usize; 3] = [10, 20, 40];
/// Writes back everything dirty (the store just built), so that the file system's journal does
/// not hand that work to the first fsyncs measured.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

/// The transaction installing `id@1.0.0` into `store`, and the state it commits.
fn install(store: &FsStore, id: &PackageId) -> Transaction {
    let before = store.registry().expect("registry");
    let mut next = before.successor();
    let version = Version::new(1, 0, 0);
    next.publish(id, &version, new_version(id.as_str()), ENABLE)
        .expect("publish is legal");
    let staged = store.new_staging_dir().expect("staging dir");
    write_tree(&staged, &[0x5a; 4096]);
    Transaction::new(before.generation(), next).with_install(id.clone(), version, staged)
}

/// What a commit did per package before the log: check the whole new state against the old
/// one and rewrite the registry file durably.
fn rewrite_whole_registry(layout: &StoreLayout, old: &StoreState, new: &StoreState) {
    new.validate().expect("valid");
    for (id, package) in old.packages() {
        for (version, record) in package.versions() {
            let kept = new.record(id, version).expect("record kept");
            assert_eq!(kept.payload_digest, record.payload_digest);
        }
    }
    let _ = new
        .installed()
        .filter(|(id, v, _)| !old.is_installed(id, v))
        .count();
    let tmp = layout.root.join("baseline.json.tmp");
    let target = layout.root.join("baseline.json");
    fs::write(&tmp, new.to_json()).expect("write");
    File::open(&tmp).and_then(|f| f.sync_all()).expect("fsync");
    fs::rename(&tmp, &target).expect("rename");
    File::open(&layout.root)
        .and_then(|f| f.sync_all())
        .expect("fsync dir");
}

/// Commits timed per size and variant, after `WARM` untimed ones. Each adds a package, so a store
/// grows by at most `2 * (WARM + TIMED) + 3` packages over the run; the count is kept small so
/// that the smallest store stays small (criterion would run thousands of commits into it).
const WARM: usize = 3;
const TIMED: usize = 30;

/// The median and the mean of `times`.
fn summary(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    let mean = times.iter().sum::<Duration>() / u32::try_from(times.len()).unwrap_or(1);
    (times[times.len() / 2], mean)
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log_commit = Vec::new();
    let mut rewrite = Vec::new();
    let mut next = 0;
    let sizes = if std::env::args().any(|a| a == "--bench") {
        SIZES
    } else {
        SMOKE_SIZES
    };
    for n in sizes {
        let root = dir.path().join(format!("store{n}"));
        let built = Instant::now();
        build_store(&root, n);
        let (store, _) = FsStore::open(&root).expect("open store");
        // The first write migrates the format-1 store: timed once, on its own.
        let start = Instant::now();
        store
            .commit(install(
                &store,
                &PackageId::new("bench.migrate").expect("id"),
            ))
            .expect("commit");
        let migrated = start.elapsed();
        settle();
        let layout = store.layout().clone();
        let checkpoint = fs::metadata(&layout.registry).expect("checkpoint").len();
        println!(
            "{n} packages: built in {:.1?}; first commit (migration) {migrated:.1?}; \
             checkpoint {checkpoint} bytes",
            built.elapsed()
        );
        // The two variants alternate, commit by commit, so that a change in the machine's load
        // touches both alike.
        let (mut log_times, mut base_times) = (Vec::new(), Vec::new());
        let mut frame = 0;
        let mut fsyncs = 0;
        for round in 0..WARM + TIMED {
            next += 1;
            let id = PackageId::new(format!("bench.new{next:06}")).expect("id");
            let tx = install(&store, &id);
            let log_before = fs::metadata(&layout.log).expect("log").len();
            let start = Instant::now();
            store.commit(tx).expect("commit");
            let took = start.elapsed();
            frame = fs::metadata(&layout.log).expect("log").len() - log_before;
            fsyncs = store.last_op().fsyncs;
            // Before the log: the same install, and then the whole registry rewritten as the
            // commit point (and every package of the new state checked), as the code before the
            // log did.
            next += 1;
            let id = PackageId::new(format!("bench.new{next:06}")).expect("id");
            let old = store.registry().expect("registry");
            let tx = install(&store, &id);
            let new = tx.new_state.clone();
            let start = Instant::now();
            store.commit(tx).expect("commit");
            rewrite_whole_registry(&layout, &old, &new);
            let base = start.elapsed();
            if round >= WARM {
                log_times.push(took);
                base_times.push(base);
            }
        }
        let (log_median, log_mean) = summary(&mut log_times);
        let (base_median, base_mean) = summary(&mut base_times);
        println!(
            "{n} packages: log commit median {log_median:.2?} (mean {log_mean:.2?}); with the \
             whole registry rewritten median {base_median:.2?} (mean {base_mean:.2?}); {fsyncs} \
             fsyncs per install commit, a frame of {frame} bytes"
        );
        log_commit.push(log_median);
        rewrite.push(base_median);
        // The part of a commit that still walks the whole state, in memory: comparing the old
        // and the new state package by package, and freeing the old state once the new one is
        // committed. Both become pointer work once the state shares its records (`Arc`).
        {
            let old = store.registry().expect("registry");
            let mut new = old.successor();
            new.publish(
                &PackageId::new("bench.delta").expect("id"),
                &Version::new(1, 0, 0),
                new_version("delta"),
                ENABLE,
            )
            .expect("publish is legal");
            let rounds = 20u32;
            let start = Instant::now();
            for _ in 0..rounds {
                let delta =
                    guild_domain::store_log::StoreStateDelta::between(&old, &new).expect("delta");
                assert_eq!(delta.packages.len(), 1);
            }
            let compare = start.elapsed() / rounds;
            let copies: Vec<StoreState> = (0..rounds).map(|_| old.clone()).collect();
            let start = Instant::now();
            drop(copies);
            let free = start.elapsed() / rounds;
            println!(
                "{n} packages: in memory, the delta's comparison {compare:.2?} and freeing the \
                 old state {free:.2?} per commit ({} packages now)",
                old.packages().count()
            );
        }
        drop(store);
        // One compaction at this size, forced, to spread over the commits between two of them.
        let (store, _) =
            FsStore::open_with(&root, StoreOptions::new().compact_log_over(0)).expect("open");
        let tx = install(&store, &PackageId::new("bench.compact").expect("id"));
        let start = Instant::now();
        store.commit(tx).expect("commit");
        let compacting = start.elapsed();
        let checkpoint = fs::metadata(&layout.registry).expect("checkpoint").len();
        let between = checkpoint.max(64 * 1024) / frame.max(1);
        println!(
            "{n} packages: a commit that compacts takes {compacting:.1?} ({} fsyncs); one \
             compaction per {between} commits",
            store.last_op().fsyncs
        );
    }
    let ratio = |v: &[Duration]| v[2].as_secs_f64() / v[0].as_secs_f64();
    println!(
        "ratio 10k/10 of the medians: log commit {:.2}x; commit with the whole registry \
         rewritten {:.2}x",
        ratio(&log_commit),
        ratio(&rewrite)
    );
}
