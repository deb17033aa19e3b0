//! Benchmarks reading the store state back: decoding a checkpoint of 10,000 packages (format 2,
//! each version record with its signing key, the trust file it verified under and its manifest
//! facts, as `guild install` writes them) and replaying a log of 5,000 one-package deltas onto
//! it, which is what every `guild list` does first; the same written indented (as the store
//! wrote them before they were compact); and what a reader of one package (`guild status ID`)
//! does with them, passing over the other packages.
//! Criterion prints the median among its estimates.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use guild_domain::ids::{ImplId, PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::manifest_facts::ManifestFacts;
use guild_domain::store_log::StoreStateDelta;
use guild_domain::store_state::{NewVersion, PublishOptions, StoreState};
use guild_domain::version::Version;

const PACKAGES: usize = 10_000;
const LOGGED: usize = 5_000;

fn id(i: usize) -> PackageId {
    PackageId::new(format!("bench.pkg{i:05}")).expect("generated ids are valid")
}

fn publish(state: &mut StoreState, i: usize) {
    let id = id(i);
    let version = Version::parse("1.0.0").expect("valid version");
    let facts = ManifestFacts {
        module_abi: Some(1),
        provided_ops: vec![ImplId::new(format!("bench.pkg{i:05}.op.cpu")).expect("valid")],
        dependencies: Vec::new(),
        module_dependencies: Vec::new(),
    };
    let new = NewVersion {
        payload_digest: Sha256Digest::of(format!("{i}").as_bytes()),
        kind: PackageKind::Module,
        publisher: PublisherId::new("org.example.bench").expect("valid"),
        signed_by: vec![Sha256Digest::of(b"key")],
        facts: Some(facts),
    };
    let options = PublishOptions {
        enable: true,
        allow_downgrade: false,
    };
    state.publish(&id, &version, new, options).expect("publish");
    state.set_trusted_under(&id, &version, Sha256Digest::of(b"trust"));
}

/// A checkpoint of the first `PACKAGES - LOGGED` packages and one delta per later package.
fn store() -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut state = StoreState::new();
    for i in 0..PACKAGES - LOGGED {
        publish(&mut state, i);
    }
    let checkpoint = state.to_checkpoint_json();
    let mut deltas = Vec::new();
    for i in PACKAGES - LOGGED..PACKAGES {
        let mut next = state.successor();
        publish(&mut next, i);
        deltas.push(
            StoreStateDelta::between(&state, &next)
                .expect("delta")
                .to_json(),
        );
        state = next;
    }
    (checkpoint, deltas)
}

fn read(checkpoint: &[u8], deltas: &[Vec<u8>]) -> StoreState {
    let (mut state, _) = StoreState::from_any_json(checkpoint).expect("decode");
    for d in deltas {
        let delta = StoreStateDelta::from_json(d).expect("delta decodes");
        state.apply(&delta).expect("applies");
    }
    state
}

/// [`read`] as a reader of package `only` does (`guild status ID`).
fn read_one(checkpoint: &[u8], deltas: &[Vec<u8>], only: &PackageId) -> StoreState {
    let (mut state, _) = StoreState::from_any_json_only(checkpoint, only).expect("decode");
    for d in deltas {
        let delta = StoreStateDelta::from_json_only(d, only).expect("delta decodes");
        state.apply(&delta).expect("applies");
    }
    state
}

fn bench(c: &mut Criterion) {
    let (checkpoint, deltas) = store();
    eprintln!(
        "checkpoint {} bytes, {} deltas of {} bytes",
        checkpoint.len(),
        deltas.len(),
        deltas.iter().map(Vec::len).sum::<usize>()
    );
    if std::env::var_os("STORE_DECODE_LOOP").is_some() {
        for _ in 0..20 {
            black_box(read(&checkpoint, &deltas));
        }
        return;
    }
    let mut group = c.benchmark_group("store_decode");
    group.sample_size(20);
    group.bench_function("checkpoint_10000", |b| {
        b.iter(|| StoreState::from_any_json(black_box(&checkpoint)).expect("decode"))
    });
    group.bench_function("checkpoint_and_log", |b| {
        b.iter(|| read(black_box(&checkpoint), black_box(&deltas)))
    });
    // The same state written indented, as checkpoints (format 2, without an index: an index
    // holds the byte ranges of the compact records) and frames were before they were written
    // compact: what the reader pays for the whitespace.
    let pretty = |bytes: &[u8]| {
        guild_domain::json::parse(bytes)
            .expect("parses")
            .to_pretty_string()
            .into_bytes()
    };
    let format_2 = {
        use guild_domain::json::Value;
        let Value::Object(members) = guild_domain::json::parse(&checkpoint).expect("parses") else {
            unreachable!("a checkpoint is an object")
        };
        let members = members
            .into_iter()
            .filter(|(key, _)| key != "index")
            .map(|(key, value)| match key.as_str() {
                "guild_registry" => (key, Value::from(2u64)),
                _ => (key, value),
            })
            .collect();
        Value::Object(members).to_pretty_string().into_bytes()
    };
    let indented = format_2;
    let indented_deltas: Vec<Vec<u8>> = deltas.iter().map(|d| pretty(d)).collect();
    group.bench_function("checkpoint_and_log_indented", |b| {
        b.iter(|| read(black_box(&indented), black_box(&indented_deltas)))
    });
    // A reader of one package (in the middle of the checkpoint) passes over the others.
    let only = id((PACKAGES - LOGGED) / 2);
    group.bench_function("checkpoint_and_log_one_package", |b| {
        b.iter(|| read_one(black_box(&checkpoint), black_box(&deltas), &only))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
