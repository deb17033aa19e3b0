//! The package manager's costs over a real store: the fsyncs one publication makes (counted by the
//! store), the time to install a package holding a 1 MiB library (the whole `install`: read and
//! authenticate `.gkmetadata`, validate the graph, extract and hash with every fsync, commit), and
//! the time to open and re-verify a store of 1,000 installed, enabled packages, with a breakdown of
//! that open by phase so that the dominant cost is visible.
//!
//! Then the trusted-state figures (G18) over stores of 1,000 and 10,000 enabled packages, built
//! once and kept under `target/bench-stores/` (rebuilt when [`KEPT_FORMAT`] changes): opening
//! with an unchanged trust file (a writer, a reader, and a `Host` that plans its load, with the
//! pre-load checks of every planned version timed apart), the same right after a revocation, the
//! real `guild list` and `guild status ID` binaries (`target/release/guild`, when it is built),
//! and the full check on 1 and 2 threads, whose 1-thread figure is the work every open used to do.
//!
//! Last, installs of one small package into copies of the kept stores of 10, 1,000 and 10,000
//! packages (G18: a commit must not grow with the store), with the store's own `commit` and
//! `registry` calls timed apart from the package manager's work. `GUILD_BENCH_ONLY=install`
//! runs only these; `GUILD_BENCH_INSTALL_SIZES` (a comma-separated list) picks the sizes.
//!
//! `GUILD_BENCH_ONLY=full-check` measures only how the full check (`verify_all`, what `guild
//! verify --all --jobs N` runs) scales with its threads, over a kept store of
//! `GUILD_BENCH_FULL_CHECK_SIZE` packages (1,000 by default), with a verdict.
//!
//! `GUILD_BENCH_ONLY=commands` measures only the whole commands (G28): the release `guild`
//! binary (`GUILD_BENCH_GUILD`, else `target/release/guild`) run as a process for `--version`,
//! `list`, `status ID` and `install PKG` on the kept stores of each size in
//! `GUILD_BENCH_COMMAND_SIZES` (10, 1,000 and 10,000 by default), `install` into a fresh copy of
//! the kept store every run so that the kept one never changes; and `install PKG` right after a
//! trust change (a key added for another publisher, in process), whose opening checks every
//! version's signatures again and records the new trust file. Each figure is the median of
//! `GUILD_BENCH_COMMAND_RUNS` (7) runs with its spread, and the child's median CPU time (user and
//! system) and max RSS as `wait4` reports them (the child and the children it reaped: the
//! registration check's); install's ratio is also given in CPU time, beside its verdict. With
//! `GUILD_BENCH_GUILD_BEFORE` naming a second binary (a build of an earlier commit), both run
//! alternately, run by run, so that a machine's changing load hits both alike. The in-process
//! opens of each store (reader, committed reader, writer) are timed too, and each figure is
//! judged against G28's goals. The full run ends with these figures as well.
//!
//! `GUILD_BENCH_KEEP_TEMPLATE=DIR` keeps a copy of each size's settled install template
//! (`DIR/store-N`) and the package the installs offer it (`DIR/offered.gkmodule`), to profile
//! one command outside the bench.
//!
//! `cargo bench --bench store_open` runs the full sizes; run in test mode (`cargo test --benches`,
//! no `--bench` argument) it builds stores of ten and twenty packages in a temporary directory
//! and runs each measurement once. The other stores live in a temporary directory (set `TMPDIR`
//! to measure another file system).

use std::ffi::OsString;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use criterion::Criterion;
use guild_adapters_crypto::{P256Verifier, SigningKey};
use guild_adapters_fs::archive::GkpkSource;
use guild_adapters_fs::store::FsStore;
use guild_domain::manifest::Metadata;
use guild_domain::path::RESERVED_METADATA_NAME;
use guild_domain::trust::{authenticate, SignatureCheck};
use guild_host::{Host, InstallOptions, PackageManager, VerifyOptions};
use guild_ports::signature::SignatureVerifier;
use guild_ports::source::PackageSource;
use guild_ports::store::PackageStore;
use guild_test_support::{
    copy_tree, make_writable, open_host, trust, Built, Scratch, Spec, StoreTime, Workshop,
    PUBLISHER,
};

/// Bumped whenever the kept stores' layout or registry format changes, so that they are rebuilt.
const KEPT_FORMAT: &str = "g28-checkpoint-index-2";

const MIB: usize = 1 << 20;
/// The library of each package in the large store: small enough that signatures, not hashing,
/// are the question, and large enough to be a real file (the breakdown prints the hash rate to
/// scale from).
const SMALL_LIBRARY: usize = 16 << 10;

/// Deterministic, incompressible-looking bytes.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

struct Verify(P256Verifier);

impl SignatureCheck for Verify {
    fn verify(&self, spki: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        self.0
            .verify(spki, message, signature)
            .map_err(|e| e.to_string())
    }
}

/// Builds `count` packages signed by `key` and installs them, enabled, into a store at `root`.
fn large_store(shop: &Workshop, key: &SigningKey, root: &Path, count: usize) -> Duration {
    let built: Vec<Built> = (0..count)
        .map(|i| {
            let spec = Spec::module(&format!("bench.pkg{i:04}"), "1.0.0")
                .library(&bytes(SMALL_LIBRARY, i as u64));
            shop.build(&spec, key)
        })
        .collect();
    let host = open_host(root, None).expect("open store");
    trust(&host.pm, PUBLISHER, key);
    let start = Instant::now();
    for b in &built {
        host.pm
            .install(&b.archive, InstallOptions::default())
            .expect("install");
    }
    start.elapsed()
}

/// Times each phase of what opening does, separately: the store's own open (lock, recovery,
/// registry), reading and parsing every `.gkmetadata`, checking every signature, and re-hashing
/// every artifact. Answers the phase names with their median times.
fn breakdown(root: &Path, runs: usize) -> Vec<(&'static str, Duration)> {
    let mut phases: Vec<(&'static str, Vec<Duration>)> = vec![
        ("store open (lock, recovery, registry)", Vec::new()),
        ("read + parse .gkmetadata", Vec::new()),
        ("signature checks", Vec::new()),
        ("re-hash artifacts", Vec::new()),
        ("PackageManager::open_dir now, all of it", Vec::new()),
    ];
    let source = GkpkSource::default();
    let check = Verify(P256Verifier::new());
    for _ in 0..runs {
        let start = Instant::now();
        let (store, _) = FsStore::open(root).expect("open store");
        phases[0].1.push(start.elapsed());
        let registry = store.registry().expect("registry");
        let trust = guild_domain::trust::TrustStore::from_json(
            &store.read_trust().expect("trust").expect("trust file"),
        )
        .expect("trust decodes");
        let dirs: Vec<_> = registry
            .installed()
            .map(|(id, v, _)| store.package_dir(id, v))
            .collect();

        let start = Instant::now();
        let metas: Vec<Metadata> = dirs
            .iter()
            .map(|d| {
                Metadata::parse(&fs::read(d.join(RESERVED_METADATA_NAME)).expect("read"))
                    .expect("parse")
            })
            .collect();
        phases[1].1.push(start.elapsed());

        let start = Instant::now();
        for m in &metas {
            authenticate(m, &trust, &check).expect("authenticated");
        }
        phases[2].1.push(start.elapsed());

        let start = Instant::now();
        for (d, m) in dirs.iter().zip(&metas) {
            source
                .open(d)
                .and_then(|o| o.verify_in_place(m.manifest()))
                .expect("verified");
        }
        phases[3].1.push(start.elapsed());
        drop(store);

        let start = Instant::now();
        let (pm, report) = PackageManager::open_dir(root).expect("open");
        phases[4].1.push(start.elapsed());
        assert_eq!(report.verified, dirs.len());
        assert_eq!(report.reauthenticated, 0);
        assert!(report.disabled.is_empty());
        drop(pm);
    }
    phases
        .into_iter()
        .map(|(name, times)| (name, median(times)))
        .collect()
}

/// A comma-separated list of sizes from the environment variable `name`, or `default`.
fn sizes_from(name: &str, default: Vec<usize>) -> Vec<usize> {
    match std::env::var(name) {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse().expect("a store size"))
            .collect(),
        Err(_) => default,
    }
}

/// Where the large stores are kept between runs: `GUILD_BENCH_STORES` when set (the GPU bundle
/// runs far from a checkout), else `target/bench-stores`; a temporary directory in test mode.
fn kept_root(full: bool, dir: &Scratch) -> std::path::PathBuf {
    if let Some(kept) = std::env::var_os("GUILD_BENCH_STORES") {
        std::path::PathBuf::from(kept)
    } else if full {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-stores")
    } else {
        dir.path().join("kept")
    }
}

/// The load average, to print beside the figures (timings taken while others build are
/// inflated).
fn load() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn main() {
    if let Some(out) = std::env::var_os(SHIM_VARIABLE) {
        shim(Path::new(&out));
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let count = if full { 1_000 } else { 10 };
    let runs = if full { 5 } else { 1 };
    let shop = Workshop::new();
    let dir = Scratch::new();
    let key = SigningKey::generate().expect("key");
    let install_sizes = sizes_from(
        "GUILD_BENCH_INSTALL_SIZES",
        if full {
            vec![10, 1_000, 10_000]
        } else {
            vec![10, 20]
        },
    );
    match std::env::var("GUILD_BENCH_ONLY").as_deref() {
        Ok("install") => {
            let installs = if full { 15 } else { 2 };
            let kept = kept_root(full, &dir);
            install_figures(&shop, &key, &kept, &install_sizes, installs, dir.path());
            return;
        }
        Ok("commands") => {
            command_figures(&shop, &key, &kept_root(full, &dir), full, dir.path());
            return;
        }
        Ok("log-share") => {
            let n = sizes_from(
                "GUILD_BENCH_COMMAND_SIZES",
                vec![if full { 10_000 } else { 10 }],
            );
            log_share(
                &kept_store(&shop, &key, &kept_root(full, &dir), n[0]),
                dir.path(),
            );
            return;
        }
        Ok("full-check") => {
            let n = sizes_from(
                "GUILD_BENCH_FULL_CHECK_SIZE",
                vec![if full { 1_000 } else { 10 }],
            );
            let root = kept_store(&shop, &key, &kept_root(full, &dir), n[0]);
            full_check_scaling(&root, n[0], if full { 5 } else { 1 });
            return;
        }
        _ => {}
    }

    // Fsyncs of publications, counted by the store (the commit) and, for the extraction into
    // staging, by what `Durability::Fsync` promises: each file written and each directory made,
    // plus the staging area that receives the new directory.
    let lib = shop.build(
        &Spec::module("bench.big", "1.0.0").library(&bytes(MIB, 7)),
        &key,
    );
    let lib2 = shop.build(
        &Spec::module("bench.big", "1.1.0").library(&bytes(MIB, 8)),
        &key,
    );
    let host = open_host(&dir.path().join("fsyncs"), None).expect("open");
    trust(&host.pm, PUBLISHER, &key);
    let mut rows = Vec::new();
    for (what, built) in [("new package id", &lib), ("new version of an id", &lib2)] {
        let before = host.store.total_fsyncs();
        host.pm
            .install(&built.archive, InstallOptions::default())
            .expect("install");
        let stats = host.store.last_op();
        let files = built.metadata.manifest().artifacts.len() as u64 + 1;
        let dirs = 2; // The staging root and `lib/`.
        rows.push((
            what,
            host.store.total_fsyncs() - before,
            stats.steps.len(),
            files + dirs + 1,
        ));
    }
    drop(host);
    println!("fsyncs per publish (a 1 MiB library and .gkmetadata):");
    for (what, commit, steps, extract) in &rows {
        println!(
            "  {what:<22} commit {commit:>2} fsyncs in {steps} durable steps; extraction {extract} \
             fsyncs; {} in all",
            commit + extract
        );
    }

    // Install with a 1 MiB library, whole, into a fresh trusted store each time.
    let mut install_times = Vec::new();
    for i in 0..if full { 20 } else { 1 } {
        let root = dir.path().join(format!("install-{i}"));
        let host = open_host(&root, None).expect("open");
        trust(&host.pm, PUBLISHER, &key);
        let start = Instant::now();
        host.pm
            .install(&lib.archive, InstallOptions::default())
            .expect("install");
        install_times.push(start.elapsed());
    }
    println!(
        "install with a 1 MiB library: {} (median of {})",
        ms(median(install_times.clone())),
        install_times.len()
    );

    // The large store, built once, then opened and re-verified again and again (an open that
    // finds everything valid writes nothing, so every run sees the same store).
    let root = dir.path().join("large");
    let built_in = large_store(&shop, &key, &root, count);
    println!(
        "built a store of {count} packages ({} KiB library each) in {:.1} s ({} per install)",
        SMALL_LIBRARY >> 10,
        built_in.as_secs_f64(),
        ms(built_in / count as u32)
    );
    let phases = breakdown(&root, runs);
    let hashed = (count * (SMALL_LIBRARY + 64)) as f64;
    println!("open and re-verify {count} enabled packages (median of {runs}):");
    for (name, time) in &phases {
        let per = *time / count as u32;
        println!(
            "  {name:<40} {:>10}  {:>8.1} us/package",
            ms(*time),
            per.as_secs_f64() * 1e6
        );
    }
    if let Some((_, t)) = phases.get(3) {
        println!(
            "  (re-hashing runs at {:.0} MiB/s including open and read)",
            hashed / t.as_secs_f64() / MIB as f64
        );
    }

    let mut c = Criterion::default()
        .sample_size(10)
        .measurement_time(Duration::from_secs(if full { 10 } else { 1 }))
        .configure_from_args();
    c.bench_function(&format!("open_and_reverify_{count}_packages"), |b| {
        b.iter(|| PackageManager::open_dir(&root).expect("open"))
    });
    let mut n = 0;
    c.bench_function("install_1mib_library", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let root = dir.path().join(format!("criterion-{n}"));
                let host = open_host(&root, None).expect("open");
                trust(&host.pm, PUBLISHER, &key);
                let start = Instant::now();
                host.pm
                    .install(&lib.archive, InstallOptions::default())
                    .expect("install");
                total += start.elapsed();
                drop(host);
                guild_test_support::make_writable(&root);
                let _ = fs::remove_dir_all(&root);
            }
            total
        })
    });
    c.final_summary();

    // `GUILD_BENCH_STORE_SIZES=1000` (a comma-separated list) measures other sizes.
    let sizes = sizes_from(
        "GUILD_BENCH_STORE_SIZES",
        if full {
            vec![1_000, 10_000]
        } else {
            vec![10, 20]
        },
    );
    let kept_root = kept_root(full, &dir);
    for &n in &sizes {
        let root = kept_store(&shop, &key, &kept_root, n);
        trusted_state(&root, n, runs, &dir.path().join(format!("revoked-{n}")));
    }
    let installs = if full { 15 } else { 1 };
    install_figures(
        &shop,
        &key,
        &kept_root,
        &install_sizes,
        installs,
        dir.path(),
    );
    command_figures(&shop, &key, &kept_root, full, dir.path());
}

/// The medians of one store size's installs.
struct InstallRow {
    n: usize,
    total: Duration,
    commit: Duration,
    registry: Duration,
    rest: Duration,
    draft: Duration,
}

/// Installs `installs` new small packages, one after another, into a copy of the kept store of
/// each size in `sizes`, timing each whole `PackageManager::install` and, within it, the store's
/// `commit` (the durable write, which still rewrites `registry.json` here) and `registry` (the
/// copy of the committed state it hands out). The rest is the package manager's own work
/// (reading and authenticating the package, the graph and claim checks, extraction into
/// staging): the part that must not grow with the store.
fn install_figures(
    shop: &Workshop,
    key: &SigningKey,
    kept: &Path,
    sizes: &[usize],
    installs: usize,
    scratch: &Path,
) {
    let built: Vec<Built> = (0..installs)
        .map(|i| {
            let spec = Spec::module(&format!("bench.new{i:03}"), "1.0.0")
                .library(&bytes(SMALL_LIBRARY, 1_000_000 + i as u64));
            shop.build(&spec, key)
        })
        .collect();
    let mut rows = Vec::new();
    for &n in sizes {
        let source = kept_store(shop, key, kept, n);
        let copy = scratch.join(format!("install-into-{n}"));
        if copy.exists() {
            make_writable(&copy);
            fs::remove_dir_all(&copy).expect("old copy");
        }
        copy_tree(&source, &copy);
        let host = open_host(&copy, None).expect("open the copy");
        // The kept store may have been built in an earlier run, with another key.
        trust(&host.pm, PUBLISHER, key);
        let (mut total, mut commit, mut registry, mut rest) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for b in &built {
            let before: StoreTime = host.spy.store_time();
            let start = Instant::now();
            host.pm
                .install(&b.archive, InstallOptions::default())
                .expect("install");
            let took = start.elapsed();
            let after = host.spy.store_time();
            let (c, r) = (
                after.commit - before.commit,
                after.registry - before.registry,
            );
            total.push(took);
            commit.push(c);
            registry.push(r);
            rest.push(took.saturating_sub(c + r));
        }
        // What is left in the package manager's part that grows with the store: the draft of
        // each change copies the registry's map of packages (one pointer per record) and drops
        // it again.
        let committed = host.store.registry().expect("registry");
        let draft = timed(installs, || committed.successor());
        drop(host);
        make_writable(&copy);
        let _ = fs::remove_dir_all(&copy);
        rows.push(InstallRow {
            n,
            total: median(total),
            commit: median(commit),
            registry: median(registry),
            rest: median(rest),
            draft,
        });
    }
    println!(
        "install of one small package ({} KiB library) into a store of n enabled packages, median of {installs} (load {}):",
        SMALL_LIBRARY >> 10,
        load()
    );
    println!(
        "  {:>7}  {:>11}  {:>11}  {:>11}  {:>11}  {:>13}  {:>13}  {:>16}",
        "n",
        "install",
        "  commit",
        "registry()",
        "  rest",
        "install/first",
        "rest/first",
        "of rest: draft"
    );
    let Some(first) = rows.first().map(|r| (r.total, r.rest)) else {
        return;
    };
    for r in &rows {
        println!(
            "  {:>7}  {:>11}  {:>11}  {:>11}  {:>11}  {:>12.2}x  {:>12.2}x  {:>16}",
            r.n,
            ms(r.total),
            ms(r.commit),
            ms(r.registry),
            ms(r.rest),
            r.total.as_secs_f64() / first.0.as_secs_f64(),
            r.rest.as_secs_f64() / first.1.as_secs_f64(),
            ms(r.draft),
        );
    }
}

/// A store of `count` enabled packages under `kept/`, built unless a complete one of the current
/// [`KEPT_FORMAT`] is already there.
fn kept_store(shop: &Workshop, key: &SigningKey, kept: &Path, count: usize) -> std::path::PathBuf {
    let root = kept.join(format!("{count}"));
    let marker = kept.join(format!("{count}.complete"));
    if fs::read_to_string(&marker).ok().as_deref() == Some(KEPT_FORMAT) {
        println!(
            "re-using the store of {count} packages in {}",
            root.display()
        );
        return root;
    }
    if root.exists() {
        make_writable(&root);
        fs::remove_dir_all(&root).expect("remove the old store");
    }
    fs::create_dir_all(kept).expect("bench-stores");
    let took = large_store(shop, key, &root, count);
    println!(
        "built a store of {count} packages in {:.1} s ({} per install), kept in {}",
        took.as_secs_f64(),
        ms(took / count as u32),
        root.display()
    );
    fs::write(&marker, KEPT_FORMAT).expect("marker");
    root
}

/// Median of `runs` timings of `f`.
fn timed<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    median(
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                let out = f();
                let took = start.elapsed();
                drop(out);
                took
            })
            .collect(),
    )
}

/// The trusted-state figures over the store at `root` of `n` enabled packages.
fn trusted_state(root: &Path, n: usize, runs: usize, scratch: &Path) {
    println!(
        "trusted state, {n} enabled packages (median of {runs}; load {}):",
        load()
    );
    let row = |what: &str, t: Duration| {
        println!(
            "  {what:<58} {:>11}  {:>8.1} us/package",
            ms(t),
            t.as_secs_f64() * 1e6 / n as f64
        )
    };
    let writer = timed(runs, || {
        let (pm, report) = PackageManager::open_dir(root).expect("open");
        assert_eq!((report.verified, report.reauthenticated), (n, 0));
        pm
    });
    row("PackageManager::open_dir (writer), trust unchanged", writer);
    let reader = timed(runs, || {
        PackageManager::open_dir_reader(root).expect("open")
    });
    row("PackageManager::open_dir_reader, trust unchanged", reader);
    let host = timed(runs, || {
        let opened = Host::builder(root)
            .load_enabled(false)
            .open()
            .expect("host");
        let plan = opened.host.packages().load_plan().expect("plan");
        assert_eq!(plan.order.len(), n);
        opened
    });
    row("Host open (reader) + load plan, no library opened", host);
    let (pm, _) = PackageManager::open_dir_reader(root).expect("open");
    let plan = pm.load_plan().expect("plan");
    let preload = timed(runs, || {
        for p in &plan.order {
            pm.check_loadable(&p.id, &p.version).expect("loadable");
            pm.check_files_before_load(&p.id, &p.version)
                .expect("files");
        }
    });
    row("pre-load checks of every planned version (hash)", preload);
    row(
        "  = open + plan + pre-load checks (all of \"load\" but dlopen)",
        host + preload,
    );
    let committed = timed(runs, || {
        let (pm, _) = PackageManager::open_dir_committed(root).expect("open");
        pm.list().expect("list")
    });
    row(
        "open_dir_committed + list (what `guild list` does)",
        committed,
    );
    drop(pm);

    if n <= 1_000 {
        let (pm, _) = PackageManager::open_dir_reader(root).expect("open");
        let full_check = |jobs: usize| {
            timed(1, || {
                let found = pm
                    .verify_all(VerifyOptions { jobs: Some(jobs) })
                    .expect("full");
                assert!(found.failures.is_empty());
                assert_eq!(found.checked, n);
            })
        };
        // One run on each thread count after the other, pair by pair: on a machine shared with
        // other work the second core comes and goes, and runs far apart in time compare the
        // machine's load, not the check. The speed-up is the median of the pairs' ratios.
        let pairs: Vec<(Duration, Duration)> = (0..runs.max(7))
            .map(|_| (full_check(1), full_check(2)))
            .collect();
        let one = median(pairs.iter().map(|p| p.0).collect());
        let two = median(pairs.iter().map(|p| p.1).collect());
        row("full check (verify_all) on 1 thread(s)", one);
        row("full check (verify_all) on 2 thread(s)", two);
        let mut ratios: Vec<f64> = pairs
            .iter()
            .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "  full check speed-up, 2 threads against 1: {:.2}x, median of {} pairs run one \
             after the other (load {}; the 1-thread figure is the work every open did before: \
             signatures and hashes of every enabled version)",
            ratios[ratios.len() / 2],
            ratios.len(),
            load()
        );
        println!(
            "  open_dir with trust unchanged against that old work: {:.1}x faster",
            one.as_secs_f64() / writer.as_secs_f64()
        );
    }

    cli_figures(root, n, runs);

    // Right after a revocation (one package's payload), on a copy of the store: every enabled
    // version is checked again; readers in memory each time, the first writer once, recording.
    if scratch.exists() {
        make_writable(scratch);
        fs::remove_dir_all(scratch).expect("old copy");
    }
    copy_tree(root, scratch);
    {
        let (pm, _) = PackageManager::open_dir(scratch).expect("open copy");
        let digest = pm.list().expect("list")[0].versions[0].payload_digest;
        pm.update_trust(|t| Ok(t.revoke_digest(digest, "bench")))
            .expect("revoke");
    }
    let reader = timed(runs.min(3), || {
        let (pm, report) = PackageManager::open_dir_reader(scratch).expect("open");
        assert_eq!(report.reauthenticated, n);
        pm
    });
    row(
        "after a revocation: open_dir_reader (re-checks, in memory)",
        reader,
    );
    let start = Instant::now();
    let (pm, report) = PackageManager::open_dir(scratch).expect("open");
    let first = start.elapsed();
    assert_eq!(report.disabled.len(), 1);
    drop(pm);
    row(
        "after a revocation: first open_dir (re-checks, records)",
        first,
    );
    let next = timed(runs, || PackageManager::open_dir(scratch).expect("open"));
    row("after a revocation: the next open_dir", next);
    make_writable(scratch);
    let _ = fs::remove_dir_all(scratch);
}

/// `guild list` and `guild status ID` on the store at `root`, run as the real binary
/// (`target/release/guild`), when it is built.
fn cli_figures(root: &Path, n: usize, runs: usize) {
    let guild = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/guild");
    if !guild.is_file() {
        println!(
            "  (`cargo build --release -p guild-cli` to time the real `guild list` and `status`)"
        );
        return;
    }
    let id = format!("bench.pkg{:04}", n / 2);
    for args in [vec!["list"], vec!["status", id.as_str()]] {
        let t = timed(runs, || {
            let out = std::process::Command::new(&guild)
                .arg("--store")
                .arg(root)
                .args(&args)
                .output()
                .expect("run guild");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        });
        println!(
            "  real `guild {}` (release binary, whole process)             {:>11}",
            args.join(" "),
            ms(t)
        );
    }
}

/// How the full check (`verify_all`, what `guild verify --all --jobs N` runs) scales with its
/// threads on the store at `root` of `n` enabled packages: every power of two up to the cores,
/// and the cores themselves, each run once per round, `rounds` rounds one after the other (so
/// that a machine's changing load hits every thread count alike), medians per count.
///
/// The project's goal: on every core the check runs at least half as many times faster as
/// there are cores (parallel efficiency of at least 50%); the check is one signature and one
/// hash pass per version with nothing shared but the page cache.
fn full_check_scaling(root: &Path, n: usize, rounds: usize) {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |j| Some(j * 2))
        .take_while(|&j| j < cores)
        .collect();
    counts.push(cores);
    let (pm, _) = PackageManager::open_dir_reader(root).expect("open");
    let check = |jobs: usize| {
        let start = Instant::now();
        let found = pm
            .verify_all(VerifyOptions { jobs: Some(jobs) })
            .expect("full check");
        let took = start.elapsed();
        assert!(found.failures.is_empty(), "{:?}", found.failures);
        assert_eq!(found.checked, n);
        took
    };
    // One warm-up, so that the first count measured does not pay for a cold page cache.
    check(cores);
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); counts.len()];
    for _ in 0..rounds {
        for (i, &jobs) in counts.iter().enumerate() {
            times[i].push(check(jobs));
        }
    }
    let medians: Vec<Duration> = times.into_iter().map(median).collect();
    println!(
        "full check scaling: verify_all over {n} enabled packages, median of {rounds} round(s), \
         {cores} core(s), load {}",
        load()
    );
    for (&jobs, &t) in counts.iter().zip(&medians) {
        let speedup = medians[0].as_secs_f64() / t.as_secs_f64();
        println!(
            "  threads {jobs:>3}  {:>11}  {speedup:>5.2}x one thread  (efficiency {:>3.0}%)",
            ms(t),
            100.0 * speedup / jobs as f64
        );
    }
    let all = medians[0].as_secs_f64() / medians[medians.len() - 1].as_secs_f64();
    let goal = cores as f64 / 2.0;
    let verdict = if cores < 2 {
        "no verdict: one core".to_string()
    } else if all >= goal {
        format!("met ({all:.2}x >= {goal:.1}x)")
    } else {
        format!("NOT met ({all:.2}x < {goal:.1}x)")
    };
    println!(
        "  verdict: the full check on all {cores} cores against one thread, goal at least \
         {goal:.1}x (half the cores): {verdict}"
    );
}

/// What one run of a child process took: its wall time (from before the spawn to its reaping),
/// its CPU time (user and system) and max RSS in KiB (`wait4`'s, which cover the children it
/// reaped, such as `install`'s registration check) and how it ended.
struct ChildRun {
    took: Duration,
    cpu: Duration,
    max_rss_kib: u64,
    status: ExitStatus,
}

/// A `timeval` of `rusage` as a duration (zero for a negative one, which the kernel never gives).
fn duration_of(t: libc::timeval) -> Duration {
    let seconds = u64::try_from(t.tv_sec).unwrap_or(0);
    let micros = u64::try_from(t.tv_usec).unwrap_or(0);
    Duration::from_secs(seconds) + Duration::from_micros(micros)
}

/// Runs `command` to its end, reaping it with `wait4` for its resource usage. Its output goes
/// where `command` says (a file, not a pipe: a pipe nobody reads would stall a long listing).
fn run_child(command: &mut Command) -> ChildRun {
    let start = Instant::now();
    let child = command.spawn().expect("start the child");
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is a C struct of integers and `timeval`s, for which all zero bytes is a
    // valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is this process's own child, which nothing else waits for (`child` is
        // never waited on), and `status` and `usage` are valid for writes for the whole call.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "wait4: {e}");
    }
    let took = start.elapsed();
    // Reaped already: dropping a `Child` neither waits nor kills.
    drop(child);
    ChildRun {
        took,
        cpu: duration_of(usage.ru_utime) + duration_of(usage.ru_stime),
        max_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        status: ExitStatus::from_raw(status),
    }
}

/// Set (to a file's path) when this benchmark runs as the shim between itself and a measured
/// child ([`shim`]).
const SHIM_VARIABLE: &str = "GUILD_BENCH_SHIM_OUT";

/// The benchmark as the shim that starts a measured child: runs its own arguments as a command
/// (stdin, stdout and stderr its own), reaps it with `wait4` and writes `NANOSECONDS MAX_RSS_KIB
/// CPU_NANOSECONDS WAIT_STATUS` to `out`.
///
/// Why a shim: Linux counts in a process's max RSS the memory image it replaced at `exec`, so a
/// child the benchmark spawned directly would report at least the benchmark's own RSS. The shim
/// is spawned that way too, but it starts the measured child before it has grown: what the
/// child inherits is the shim's RSS at its start, a floor [`command_figures`] prints.
fn shim(out: &Path) {
    let mut args = std::env::args_os().skip(1);
    let program = args.next().expect("the shim's command");
    let mut command = Command::new(program);
    command.args(args).env_remove(SHIM_VARIABLE);
    let run = run_child(&mut command);
    fs::write(
        out,
        format!(
            "{} {} {} {}",
            run.took.as_nanos(),
            run.max_rss_kib,
            run.cpu.as_nanos(),
            run.status.into_raw()
        ),
    )
    .expect("the shim's report");
}

/// Runs `program ARGS` through the [`shim`], with `stdout` and `stderr` going to those files:
/// its time from spawn to reaping and its max RSS, as the shim measured them.
fn run_measured(program: &Path, args: &[OsString], stdout: &Path, stderr: &Path) -> ChildRun {
    let report = stdout.with_extension("shim");
    let _ = fs::remove_file(&report);
    let shim = std::env::current_exe().expect("this benchmark's path");
    let status = Command::new(shim)
        .arg(program)
        .args(args)
        .env(SHIM_VARIABLE, &report)
        .stdin(Stdio::null())
        .stdout(fs::File::create(stdout).expect("output file"))
        .stderr(fs::File::create(stderr).expect("stderr file"))
        .status()
        .expect("run the shim");
    assert!(status.success(), "the shim failed: {status}");
    let text = fs::read_to_string(&report).expect("the shim's report");
    let fields: Vec<i64> = text
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    let [nanos, rss, cpu, raw] = fields[..] else {
        panic!("the shim's report {text:?}");
    };
    ChildRun {
        took: Duration::from_nanos(u64::try_from(nanos).expect("a time")),
        cpu: Duration::from_nanos(u64::try_from(cpu).expect("a time")),
        max_rss_kib: u64::try_from(rss).expect("a size"),
        status: ExitStatus::from_raw(i32::try_from(raw).expect("a wait status")),
    }
}

/// One command of the whole-command figures: its name in the table and its arguments after
/// `--store STORE` (`--version` takes no store).
struct CommandCase {
    name: String,
    args: Vec<OsString>,
    /// Whether it changes the store, so that each run gets a fresh copy of it.
    writes: bool,
    /// Whether that copy's trust file is changed first.
    trust_changed: bool,
}

/// The figures of one binary for one command at one store size.
#[derive(Default)]
struct Runs {
    took: Vec<Duration>,
    cpu: Vec<Duration>,
    rss_kib: Vec<u64>,
}

impl Runs {
    fn median(&self) -> Duration {
        median(self.took.clone())
    }

    /// The median CPU time (user and system, the command's and its reaped children's): less
    /// spread than the wall time where a run waits on the machine rather than works.
    fn cpu_median(&self) -> Duration {
        median(self.cpu.clone())
    }

    fn spread(&self) -> (Duration, Duration) {
        let min = self.took.iter().min().copied().unwrap_or_default();
        let max = self.took.iter().max().copied().unwrap_or_default();
        (min, max)
    }

    /// The median run's max RSS, for the table.
    fn max_rss_mb(&self) -> f64 {
        let mut v = self.rss_kib.clone();
        v.sort_unstable();
        v.get(v.len() / 2).map_or(0.0, |k| *k as f64 * 1024.0 / 1e6)
    }

    /// The largest max RSS of every run, for the goal: a peak is judged by its worst run.
    fn peak_rss_mb(&self) -> f64 {
        self.rss_kib
            .iter()
            .max()
            .map_or(0.0, |k| *k as f64 * 1024.0 / 1e6)
    }
}

/// The `guild` binaries to measure: the one under test (`GUILD_BENCH_GUILD`, else the release
/// build of this checkout) and, when `GUILD_BENCH_GUILD_BEFORE` names one, the earlier build to
/// compare with. Answers none when the one under test is not built.
fn guild_binaries() -> Vec<(&'static str, PathBuf)> {
    let after = std::env::var_os("GUILD_BENCH_GUILD").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/guild"),
        PathBuf::from,
    );
    if !after.is_file() {
        return Vec::new();
    }
    let mut binaries = vec![("this", after)];
    if let Some(before) = std::env::var_os("GUILD_BENCH_GUILD_BEFORE") {
        let before = PathBuf::from(before);
        assert!(
            before.is_file(),
            "GUILD_BENCH_GUILD_BEFORE names {}, which is not a file",
            before.display()
        );
        binaries.push(("before", before));
    }
    binaries
}

/// A writer on the store at `root` that compacts the log after each of its commits.
fn open_compacting(root: &Path) -> PackageManager {
    let (store, recovery) = FsStore::open_with(
        root,
        guild_adapters_fs::store::StoreOptions::new().compact_log_over(0),
    )
    .expect("open the store");
    let (pm, _) = PackageManager::open(
        Box::new(store),
        recovery,
        Box::new(GkpkSource::default()),
        Box::new(P256Verifier::new()),
        guild_domain::platform::HostPlatform::current().expect("platform"),
    )
    .expect("open the store");
    pm
}

/// Removes the store copy at `path`, read-only trees and all, if it is there.
fn remove_copy(path: &Path) {
    if path.exists() {
        make_writable(path);
        fs::remove_dir_all(path).expect("remove a store copy");
    }
}

/// G28's whole-command figures: the release `guild` binary run as a process on the kept stores
/// (see the module's documentation for the settings), the in-process opens, and the verdicts
/// against the goals: an install into 10,000 within 1.5x of one into 10, `list` and `status
/// ID` on 10,000 within 3x `--version`, a reader's open of 10,000 under 50 ms and a writer's
/// under 100 ms, and the install's max RSS at 10,000 under 30 MB.
fn command_figures(shop: &Workshop, key: &SigningKey, kept: &Path, full: bool, scratch: &Path) {
    let binaries = guild_binaries();
    if binaries.is_empty() {
        println!(
            "whole commands: `cargo build --release -p guild-cli` (or GUILD_BENCH_GUILD) to time \
             the real binary"
        );
        return;
    }
    let sizes = sizes_from(
        "GUILD_BENCH_COMMAND_SIZES",
        if full {
            vec![10, 1_000, 10_000]
        } else {
            vec![10, 20]
        },
    );
    let runs = sizes_from("GUILD_BENCH_COMMAND_RUNS", vec![if full { 7 } else { 1 }])[0].max(1);
    // The real binary runs the registration check, which opens the library: the offered
    // package's is the `manifest_echo` test plugin (with distinct bytes after its image).
    if !guild_test_support::plugins::plugin_dir()
        .join("libmanifest_echo.so")
        .is_file()
    {
        println!("whole commands: `cargo xtask plugins` first, to time `guild install`");
        return;
    }
    let offered = shop.build(
        &Spec::module("bench.command", "1.0.0").library(&guild_test_support::guild::library(
            &bytes(SMALL_LIBRARY, 2_000_000),
        )),
        key,
    );
    // The key a trust change adds, for another publisher.
    let other = SigningKey::generate().expect("key");
    let output = scratch.join("command-output");
    // (size, command name, binary) -> runs; in-process opens per size.
    let mut table: Vec<(usize, String, &'static str, Runs)> = Vec::new();
    let mut opens: Vec<(usize, &'static str, Duration)> = Vec::new();
    let floor = run_measured(
        Path::new("/bin/true"),
        &[],
        &output,
        &output.with_extension("err"),
    );
    println!(
        "whole commands: max RSS counts at least the shim's own at its start, {:.1} MB (that of \
         `/bin/true` run through it)",
        floor.max_rss_kib as f64 * 1024.0 / 1e6
    );
    println!(
        "whole commands, {} run(s) each, binaries: {} (load {} at the start)",
        runs,
        binaries
            .iter()
            .map(|(name, path)| format!("{name} = {}", path.display()))
            .collect::<Vec<_>>()
            .join(", "),
        load()
    );
    for &n in &sizes {
        let kept_store = kept_store(shop, key, kept, n);
        // The store each install run copies: the kept one, trusting this run's key (the kept
        // store may have been built in an earlier run, with another key).
        let template = scratch.join(format!("command-template-{n}"));
        remove_copy(&template);
        copy_tree(&kept_store, &template);
        {
            let host = open_host(&template, None).expect("open the template");
            trust(&host.pm, PUBLISHER, key);
        }
        // A trust change leaves every version's signatures to be checked again by the next
        // writer, which records that they passed: done here once, so that no measured install
        // pays for it (but the one measured right after a trust change). That writer compacts
        // after its commit, so that the template is one checkpoint and no log, as such a commit
        // left it before the log said a trust change's re-records in one short frame (which a
        // binary from before that refuses).
        drop(open_compacting(&template));
        let (_, settled) = PackageManager::open_dir(&template).expect("open the template");
        assert_eq!(
            (settled.verified, settled.reauthenticated),
            (n, 0),
            "the template is settled"
        );
        if let Some(keep) = std::env::var_os("GUILD_BENCH_KEEP_TEMPLATE") {
            // For a profile of one command outside the bench: the settled template and the
            // package each install run offers it.
            let keep = PathBuf::from(keep);
            fs::create_dir_all(&keep).expect("create GUILD_BENCH_KEEP_TEMPLATE");
            let kept_copy = keep.join(format!("store-{n}"));
            remove_copy(&kept_copy);
            copy_tree(&template, &kept_copy);
            fs::copy(&offered.archive, keep.join("offered.gkmodule")).expect("keep the package");
            println!(
                "kept the template of {n} packages in {}",
                kept_copy.display()
            );
        }
        let status_id = format!("bench.pkg{:04}", n / 2);
        let cases = [
            CommandCase {
                name: "--version".into(),
                args: vec!["--version".into()],
                writes: false,
                trust_changed: false,
            },
            CommandCase {
                name: "list".into(),
                args: vec!["list".into()],
                writes: false,
                trust_changed: false,
            },
            CommandCase {
                name: format!("status {status_id}"),
                args: vec!["status".into(), status_id.clone().into()],
                writes: false,
                trust_changed: false,
            },
            CommandCase {
                name: "install PKG".into(),
                args: vec!["install".into(), offered.archive.clone().into()],
                writes: true,
                trust_changed: false,
            },
            CommandCase {
                name: "retrusted install PKG".into(),
                args: vec!["install".into(), offered.archive.clone().into()],
                writes: true,
                trust_changed: true,
            },
        ];
        let run_copy = scratch.join(format!("command-install-{n}"));
        for case in &cases {
            let mut per_binary: Vec<Runs> = binaries.iter().map(|_| Runs::default()).collect();
            for _ in 0..runs {
                for ((_, guild), runs) in binaries.iter().zip(per_binary.iter_mut()) {
                    let store = if case.writes {
                        remove_copy(&run_copy);
                        copy_tree(&template, &run_copy);
                        if case.trust_changed {
                            // Its commit is one frame of the new trust record, which every
                            // binary of the registry log reads.
                            let host = open_host(&run_copy, None).expect("open the copy");
                            trust(&host.pm, "org.other", &other);
                        }
                        // The copy's data written back first: an fsync of the install would
                        // otherwise wait for it (ext4 commits a file's journal transaction with
                        // the data of every file in it), and time the copy instead.
                        // SAFETY: `sync` takes no arguments and only schedules and waits for
                        // writeback.
                        unsafe { libc::sync() };
                        run_copy.clone()
                    } else {
                        kept_store.clone()
                    };
                    let mut args: Vec<OsString> = Vec::new();
                    if case.args[0] != "--version" {
                        args.extend(["--store".into(), store.into_os_string()]);
                    }
                    args.extend(case.args.iter().cloned());
                    let run = run_measured(guild, &args, &output, &output.with_extension("err"));
                    let stdout = fs::read_to_string(&output).expect("output");
                    assert!(
                        run.status.success(),
                        "`{} {}` on {n} packages: {}\n{}",
                        guild.display(),
                        case.name,
                        run.status,
                        fs::read_to_string(output.with_extension("err")).unwrap_or_default()
                    );
                    // Each command did its work: a row per package, a status of the one asked
                    // for, an installation.
                    match case.args[0].to_str() {
                        Some("list") => assert_eq!(stdout.lines().count(), n + 1, "{stdout}"),
                        Some("status") => assert!(stdout.contains(&status_id), "{stdout}"),
                        Some("install") => {
                            assert!(stdout.contains("installed bench.command"), "{stdout}")
                        }
                        _ => assert!(stdout.starts_with("guild"), "{stdout}"),
                    }
                    runs.took.push(run.took);
                    runs.cpu.push(run.cpu);
                    runs.rss_kib.push(run.max_rss_kib);
                }
            }
            for ((name, _), r) in binaries.iter().zip(per_binary) {
                table.push((n, case.name.clone(), name, r));
            }
        }
        remove_copy(&run_copy);
        remove_copy(&template);
        // The in-process opens, of this checkout's code only.
        let open_runs = runs.max(3);
        opens.push((
            n,
            "reader (open_dir_reader)",
            timed(open_runs, || {
                PackageManager::open_dir_reader(&kept_store).expect("open")
            }),
        ));
        opens.push((
            n,
            "committed reader (open_dir_committed)",
            timed(open_runs, || {
                PackageManager::open_dir_committed(&kept_store).expect("open")
            }),
        ));
        opens.push((
            n,
            "writer (open_dir)",
            timed(open_runs, || {
                PackageManager::open_dir(&kept_store).expect("open")
            }),
        ));
        println!("  store of {n} measured (load {})", load());
    }

    println!(
        "whole commands: median of {runs} and spread (min..max), median CPU time (user and system, \
         with reaped children), max RSS median (load {} at the end):",
        load()
    );
    println!(
        "  {:>7}  {:<24} {:<7} {:>11}  {:>23}  {:>11}  {:>9}",
        "n", "command", "binary", "median", "spread", "CPU", "max RSS"
    );
    for (n, name, binary, r) in &table {
        let (min, max) = r.spread();
        println!(
            "  {n:>7}  {name:<24} {binary:<7} {:>11}  {:>23}  {:>11}  {:>6.1} MB",
            ms(r.median()),
            format!("{}..{}", ms(min), ms(max)),
            ms(r.cpu_median()),
            r.max_rss_mb()
        );
    }
    println!(
        "in-process opens of the kept stores, this checkout (median of {}):",
        runs.max(3)
    );
    for (n, what, t) in &opens {
        println!("  {n:>7}  {what:<40} {:>11}", ms(*t));
    }

    // The verdicts, per binary, on the smallest and the largest size measured.
    let (Some(&small), Some(&large)) = (sizes.iter().min(), sizes.iter().max()) else {
        return;
    };
    let find = |n: usize, prefix: &str, binary: &str| {
        table
            .iter()
            .find(|(m, name, b, _)| *m == n && name.starts_with(prefix) && *b == binary)
            .map(|(_, _, _, r)| r)
    };
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("G28 goals, store of {large} against {small}:");
    for (binary, _) in &binaries {
        let (Some(install_small), Some(install_large), Some(version), Some(list), Some(status)) = (
            find(small, "install", binary),
            find(large, "install", binary),
            find(large, "--version", binary),
            find(large, "list", binary),
            find(large, "status", binary),
        ) else {
            continue;
        };
        let ratio = |a: &Runs, b: &Runs| a.median().as_secs_f64() / b.median().as_secs_f64();
        let install = ratio(install_large, install_small);
        let list = ratio(list, version);
        let status = ratio(status, version);
        let rss = install_large.peak_rss_mb();
        println!(
            "  {binary:<7} install {large} / install {small}: {install:.2}x (goal <= 1.5x) {}",
            verdict(install <= 1.5)
        );
        // Not a verdict (the goal is the time an operator waits): the same ratio in CPU time,
        // which says how much of the wall time's gap is work rather than this machine's noise.
        let install_cpu =
            install_large.cpu_median().as_secs_f64() / install_small.cpu_median().as_secs_f64();
        println!(
            "  {binary:<7} install {large} / install {small} in CPU time: {install_cpu:.2}x (for \
             comparison)"
        );
        println!(
            "  {binary:<7} list on {large} / --version: {list:.2}x (goal <= 3x) {}",
            verdict(list <= 3.0)
        );
        println!(
            "  {binary:<7} status on {large} / --version: {status:.2}x (goal <= 3x) {}",
            verdict(status <= 3.0)
        );
        println!(
            "  {binary:<7} install max RSS on {large}, the largest of the runs: {rss:.1} MB (goal < \
             30 MB) {}",
            verdict(rss < 30.0)
        );
        if let Some(retrusted) = find(large, "retrusted install", binary) {
            let rss = retrusted.peak_rss_mb();
            println!(
                "  {binary:<7} install max RSS on {large} right after a trust change, the largest \
                 of the runs: {rss:.1} MB (goal < 30 MB) {}",
                verdict(rss < 30.0)
            );
        }
    }
    for (n, what, t) in opens.iter().filter(|(n, _, _)| *n == large) {
        let goal = if what.starts_with("writer") {
            100.0
        } else {
            50.0
        };
        let took = t.as_secs_f64() * 1e3;
        println!(
            "  this    {what} of {n}: {took:.1} ms (goal < {goal} ms) {}",
            verdict(took < goal)
        );
    }
}

/// How much of a reader's open of the kept store at `root` is the log's: the same store with
/// its log folded into the checkpoint (a copy, compacted by a writer that compacts after every
/// commit) opened beside it, with the bytes of each file.
fn log_share(root: &Path, scratch: &Path) {
    let copy = scratch.join("compacted");
    remove_copy(&copy);
    copy_tree(root, &copy);
    {
        let pm = open_compacting(&copy);
        let id = guild_domain::ids::PackageId::new("bench.pkg0000").expect("id");
        pm.disable(&id).expect("disable");
        pm.enable(&id).expect("enable");
    }
    let size = |p: &Path| fs::metadata(p).map_or(0, |m| m.len());
    for (what, store) in [("kept", root), ("compacted", copy.as_path())] {
        let read = timed(7, || {
            (
                fs::read(store.join("registry.json")).expect("checkpoint"),
                fs::read(store.join("registry.log")).ok(),
            )
        });
        let reader = timed(7, || {
            FsStore::open_with(
                store,
                guild_adapters_fs::store::StoreOptions::new().reader(),
            )
            .expect("open")
        });
        let committed = timed(7, || {
            PackageManager::open_dir_committed(store).expect("open")
        });
        println!(
            "  {what:<10} checkpoint {:>9} B, log {:>9} B: read both {:>10}, FsStore reader open \
             {:>10}, open_dir_committed {:>10} (median of 7, load {})",
            size(&store.join("registry.json")),
            size(&store.join("registry.log")),
            ms(read),
            ms(reader),
            ms(committed),
            load()
        );
    }
    remove_copy(&copy);
}
