//! Benchmarks the dependency graph: building, validating and ordering 10,000 installed package
//! versions with 30,000 requirements (goal: under 10 ms), its parts, and the rollback query on
//! that graph. Criterion prints the median among its estimates; the figures quoted in reviews
//! come from `target/criterion/graph/*/new/estimates.json` (`median.point_estimate`, in ns).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use guild_domain::dependency::{Dependency, ModuleDependency, MODULE_ABI_TAG_V1};
use guild_domain::graph::{DependencyGraph, PackageNode};
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::version::{Version, VersionRange};

/// Enabled package ids; 1,000 of them also keep an older, disabled version, making 10,000 versions.
const IDS: usize = 9_000;
const OLD_VERSIONS: usize = 1_000;
const EDGES: usize = 30_000;

/// A small deterministic generator, so that every run measures the same graph.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % bound.max(1)
    }
}

fn package_id(i: usize) -> PackageId {
    PackageId::new(format!("bench.pkg{i:05}")).expect("generated ids are valid")
}

fn digest(i: usize, version: &str) -> Sha256Digest {
    Sha256Digest::of(format!("{i}@{version}").as_bytes())
}

/// Odd-numbered packages are modules; requirements always point to a lower number, so the graph is
/// a DAG. Edges to modules from modules are runtime module edges (every third with publisher and
/// digest pins); the rest are ordinary dependencies. Every kernel also carries one build-time
/// provenance record.
fn generate() -> Vec<PackageNode> {
    let publisher = PublisherId::new("org.bench").expect("valid publisher");
    let current = Version::new(1, 2, 0);
    let mut nodes: Vec<PackageNode> = (0..IDS)
        .map(|i| {
            let module = i % 2 == 1;
            let mut node = PackageNode {
                id: package_id(i),
                version: current.clone(),
                kind: if module {
                    PackageKind::Module
                } else {
                    PackageKind::Kernel
                },
                module_abi: module.then_some(1),
                publisher: publisher.clone(),
                payload_digest: digest(i, "1.2.0"),
                enabled: true,
                dependencies: Vec::new(),
                module_dependencies: Vec::new(),
            };
            if !module {
                node.module_dependencies.push(ModuleDependency {
                    module_id: PackageId::new("toolchain.compiler").expect("valid id"),
                    range: VersionRange::new(Version::new(13, 0, 0), None).expect("valid range"),
                    abi_tag: "build.provenance".to_owned(),
                    publisher_id: None,
                    sha256: None,
                });
            }
            node
        })
        .collect();

    let mut rng = Lcg(0x5eed);
    for e in 0..EDGES {
        // Spread the edges evenly over packages 1..IDS; mostly near neighbours, sometimes far.
        let from = 1 + e * (IDS - 1) / EDGES;
        let to = if rng.next(4) == 0 {
            rng.next(from)
        } else {
            from - 1 - rng.next(from.min(64))
        };
        let range = if e % 2 == 0 {
            VersionRange::new(Version::new(1, 0, 0), Some(Version::new(1, 9, 99)))
        } else {
            VersionRange::new(Version::new(1, 1, 0), None)
        }
        .expect("valid range");
        let node = &mut nodes[from];
        if to % 2 == 1 && node.kind == PackageKind::Module {
            let pinned = e % 3 == 0;
            node.module_dependencies.push(ModuleDependency {
                module_id: package_id(to),
                range,
                abi_tag: MODULE_ABI_TAG_V1.to_owned(),
                publisher_id: pinned.then(|| publisher.clone()),
                sha256: pinned.then(|| digest(to, "1.2.0")),
            });
        } else {
            node.dependencies.push(Dependency {
                package_id: package_id(to),
                range,
            });
        }
    }

    // Older, disabled versions kept for rollback, spread over the ids.
    for k in 0..OLD_VERSIONS {
        let i = k * (IDS / OLD_VERSIONS);
        let mut old = nodes[i].clone();
        old.version = Version::new(1, 1, 0);
        old.payload_digest = digest(i, "1.1.0");
        old.enabled = false;
        nodes.push(old);
    }
    // Supply the nodes in a scrambled order, as a store listing might.
    let mut rng = Lcg(42);
    for i in (1..nodes.len()).rev() {
        let j = rng.next(i + 1);
        nodes.swap(i, j);
    }
    nodes
}

fn bench_graph(c: &mut Criterion) {
    let nodes = generate();
    let edges: usize = nodes
        .iter()
        .filter(|n| n.enabled)
        .map(|n| {
            n.dependencies.len()
                + n.module_dependencies
                    .iter()
                    .filter(|d| d.is_runtime_edge())
                    .count()
        })
        .sum();
    assert_eq!((nodes.len(), edges), (IDS + OLD_VERSIONS, EDGES));
    let graph = DependencyGraph::new(nodes.clone()).expect("generated graph builds");
    let plan = graph.plan();
    assert!(
        plan.is_healthy(),
        "generated graph should be healthy: {:?}",
        plan.problems.first()
    );
    assert_eq!(plan.order.len(), IDS);

    let mut group = c.benchmark_group("graph");
    group.sample_size(50);
    group.bench_function("build_validate_plan_10k_versions_30k_edges", |b| {
        b.iter_batched(
            || nodes.clone(),
            |nodes| {
                let graph = DependencyGraph::new(nodes).expect("generated graph builds");
                black_box(&graph.plan());
                // Handing the graph back lets criterion drop it outside the timed section: the
                // app keeps its graph, so freeing it is not part of the work measured.
                graph
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("build_only_10k_versions", |b| {
        b.iter_batched(
            || nodes.clone(),
            |nodes| DependencyGraph::new(nodes).expect("generated graph builds"),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("validate_plan_only_10k_versions_30k_edges", |b| {
        b.iter(|| black_box(graph.plan()))
    });
    let target = package_id(0);
    let old = Version::new(1, 1, 0);
    assert_eq!(graph.check_rollback(&target, &old), Ok(()));
    group.bench_function("check_rollback_10k_versions", |b| {
        b.iter(|| black_box(graph.check_rollback(&target, &old)))
    });
    group.finish();
}

criterion_group!(benches, bench_graph);
criterion_main!(benches);
