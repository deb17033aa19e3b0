//! Benchmarks the durable store: the fsyncs a publish makes (counted, printed), the time to
//! publish a package holding a 1 MiB library (the commit alone: sealing, every fsync, the moves
//! and the registry write; staging the bytes is the extractor's cost and is left out), and the
//! time to open and recover a store of 1,000 installed packages, next to the time to decode its
//! registry alone. Criterion prints the estimates;
//! the stores live in a temporary directory on the same file system as `target/` unless
//! `TMPDIR` says otherwise.

use std::fs;
use std::time::{Duration, Instant};

use criterion::Criterion;
use guild_adapters_fs::store::{FsStore, StoreLayout};
use guild_domain::ids::PackageId;
use guild_domain::store_state::{PublishOptions, StoreState};
use guild_domain::version::Version;
use guild_ports::store::{PackageStore, Transaction};

mod common;
use common::{build_store, new_version, write_tree};

const MIB: usize = 1 << 20;
const INSTALLED: usize = 1_000;

/// Stages and commits `id@version` enabled; answers the time the commit alone took.
fn publish(store: &FsStore, id: &PackageId, version: &Version, library: &[u8]) -> Duration {
    let before = store.registry().expect("registry");
    let mut next = before.successor();
    next.publish(
        id,
        version,
        new_version(&format!("{id}@{version}")),
        PublishOptions {
            enable: true,
            allow_downgrade: false,
        },
    )
    .expect("publish is legal");
    let staged = store.new_staging_dir().expect("staging dir");
    write_tree(&staged, library);
    let tx = Transaction::new(before.generation(), next).with_install(
        id.clone(),
        version.clone(),
        staged,
    );
    let start = Instant::now();
    store.commit(tx).expect("commit");
    start.elapsed()
}

fn bench_publish(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, _) = FsStore::open(dir.path().join("store")).expect("open store");
    let library = vec![0x5a_u8; MIB];
    let id = PackageId::new("bench.publish").expect("valid id");

    publish(&store, &id, &Version::new(0, 0, 1), &library);
    let first = store.last_op();
    publish(&store, &id, &Version::new(0, 0, 2), &library);
    let second = store.last_op();
    println!(
        "fsyncs per publish: {} for a new package id, {} for a new version of an installed id \
         ({} and {} durable steps)",
        first.fsyncs,
        second.fsyncs,
        first.steps.len(),
        second.steps.len()
    );

    let mut patch = 2;
    c.bench_function("store/publish_1mib_commit", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                patch += 1;
                total += publish(&store, &id, &Version::new(0, 0, patch), &library);
            }
            total
        })
    });
}

fn bench_open(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("store");
    build_store(&root, INSTALLED);
    let (store, report) = FsStore::open(&root).expect("open store");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(
        store.registry().expect("registry").installed().count(),
        INSTALLED
    );
    drop(store);
    // The registry decode alone, to show how much of opening it accounts for.
    let bytes = fs::read(StoreLayout::new(&root).registry).expect("read registry");
    println!("registry of {INSTALLED} packages: {} bytes", bytes.len());
    c.bench_function("store/decode_registry_1000_packages", |b| {
        b.iter(|| StoreState::from_json(&bytes).expect("decode"))
    });
    c.bench_function("store/open_recover_1000_packages", |b| {
        b.iter(|| {
            let (store, report) = FsStore::open(&root).expect("open store");
            assert!(report.is_clean());
            store
        })
    });
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    bench_publish(&mut c);
    bench_open(&mut c);
    c.final_summary();
}
