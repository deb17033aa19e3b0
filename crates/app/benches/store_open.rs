//! The package manager's costs over a real store: the fsyncs one publication makes (counted by the
//! store), the time to install a package holding a 1 MiB library (the whole `install`: read and
//! authenticate `.gkmetadata`, validate the graph, extract and hash with every fsync, commit), and
//! the time to open and re-verify a store of 1,000 installed, enabled packages, with a breakdown of
//! that open by phase so that the dominant cost is visible.
//!
//! `cargo bench --bench store_open` runs the full sizes; run in test mode (`cargo test --benches`,
//! no `--bench` argument) it builds a store of ten packages and runs each measurement once. The
//! stores live in a temporary directory (set `TMPDIR` to measure another file system).

#[path = "../tests/it/support.rs"]
mod support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::Criterion;
use guild_adapters_crypto::{P256Verifier, SigningKey};
use guild_adapters_fs::archive::GkpkSource;
use guild_adapters_fs::store::FsStore;
use guild_domain::manifest::Metadata;
use guild_domain::path::RESERVED_METADATA_NAME;
use guild_domain::trust::{authenticate, SignatureCheck};
use guild_host::{InstallOptions, PackageManager};
use guild_ports::signature::SignatureVerifier;
use guild_ports::source::PackageSource;
use guild_ports::store::PackageStore;

use support::{open_host, trust, Built, Scratch, Spec, Workshop, PUBLISHER};

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
        ("PackageManager::open_dir, all of it", Vec::new()),
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
        assert!(report.disabled.is_empty());
        drop(pm);
    }
    phases
        .into_iter()
        .map(|(name, times)| (name, median(times)))
        .collect()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let count = if full { 1_000 } else { 10 };
    let runs = if full { 5 } else { 1 };
    let shop = Workshop::new();
    let dir = Scratch::new();
    let key = SigningKey::generate().expect("key");

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
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(if full { 10 } else { 1 }));
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
                support::make_writable(&root);
                let _ = fs::remove_dir_all(&root);
            }
            total
        })
    });
    c.final_summary();
}
