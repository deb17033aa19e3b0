//! Benchmarks for reading a large `.gkmetadata` file and computing its canonical payload bytes.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use guild_domain::canonical::canonicalize;
use guild_domain::dependency::{ModuleDependency, MODULE_ABI_TAG_V1};
use guild_domain::ids::{ImplId, PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::json;
use guild_domain::manifest::{
    Arch, Artifact, Backend, Manifest, Metadata, Os, SignatureAlgorithm, SignatureEntry,
};
use guild_domain::path::ArtifactPath;
use guild_domain::version::{AbiRange, PackedVersion, Version, VersionRange};

/// Size the benchmark document aims for.
const TARGET_BYTES: usize = 64 * 1024;

/// A signed gkmodule whose pretty `.gkmetadata` text is just over 64 KiB, most of it artifacts,
/// which is the shape a large package takes.
fn large_metadata() -> Vec<u8> {
    let id = |s: String| PackageId::new(s).expect("valid id");
    let mut manifest = Manifest {
        package_id: id("example.large".into()),
        kind: PackageKind::Module,
        version: Version::new(3, 1, 4),
        publisher_id: PublisherId::new("org.example").expect("valid id"),
        kernel_abi: AbiRange::new(PackedVersion::KERNEL_ABI_V1, PackedVersion::KERNEL_ABI_V1)
            .expect("range"),
        module_abi: Some(1),
        os: Os::Linux,
        arch: Arch::X86_64,
        backends: vec![Backend::Cpu, Backend::Cuda],
        entry: ArtifactPath::new("lib/libentry.so").expect("valid path"),
        artifacts: vec![],
        provided_ops: (0..32)
            .map(|i| ImplId::new(format!("example.large.op{i}.cpu")).expect("id"))
            .collect(),
        provided_runners: vec![],
        dependencies: vec![],
        module_dependencies: (0..8)
            .map(|i| ModuleDependency {
                module_id: id(format!("example.dep{i}")),
                range: VersionRange::new(Version::new(1, 0, 0), Some(Version::new(1, 9, 99)))
                    .expect("range"),
                abi_tag: MODULE_ABI_TAG_V1.into(),
                publisher_id: None,
                sha256: Some(Sha256Digest::of(&[i])),
            })
            .collect(),
        check_params: Default::default(),
    };
    let signature = SignatureEntry {
        key_id: Sha256Digest::of(b"key"),
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature: vec![0x30; 71],
    };
    let mut i: u32 = 0;
    loop {
        let path = if i == 0 {
            "lib/libentry.so".to_owned()
        } else {
            format!("share/kernels/k{i:04}.bin")
        };
        manifest.artifacts.push(Artifact {
            path: ArtifactPath::new(path).expect("valid path"),
            size: u64::from(i) * 4096 + 17,
            sha256: Sha256Digest::of(&i.to_le_bytes()),
        });
        i += 1;
        let meta =
            Metadata::new(manifest.clone(), vec![signature.clone()]).expect("valid manifest");
        let text = meta.to_pretty_json();
        if text.len() >= TARGET_BYTES {
            return text.into_bytes();
        }
    }
}

fn bench(c: &mut Criterion) {
    let input = large_metadata();
    let payload = json::parse(&input)
        .expect("parses")
        .get("payload")
        .cloned()
        .expect("payload");
    let canonical_len = canonicalize(&payload).len();
    println!(
        "document: {} bytes, canonical payload: {canonical_len} bytes",
        input.len()
    );

    let mut group = c.benchmark_group("canonical");
    group.throughput(Throughput::Bytes(input.len() as u64));
    group.bench_function("metadata_parse_64k", |b| {
        b.iter(|| Metadata::parse(black_box(&input)).expect("valid"))
    });
    group.bench_function("json_parse_64k", |b| {
        b.iter(|| json::parse(black_box(&input)).expect("valid"))
    });
    group.throughput(Throughput::Bytes(canonical_len as u64));
    group.bench_function("canonicalize_64k", |b| {
        b.iter(|| canonicalize(black_box(&payload)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
