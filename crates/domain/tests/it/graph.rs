//! The dependency graph: every validation problem, the load plan, and the disable, remove and
//! rollback queries.

use guild_domain::dependency::{Dependency, ModuleDependency, MODULE_ABI_TAG_V1};
use guild_domain::graph::{
    requirement_part, BlockReason, Blocked, DependencyGraph, Dependent, DisableRefusal,
    GraphBuildError, GraphIndex, GraphProblem, NodeRef, PackageNode, RemoveRefusal, Requirement,
    RollbackRefusal, VersionNotInstalled,
};
use guild_domain::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use guild_domain::version::{Version, VersionRange};
use proptest::prelude::*;

fn id(s: &str) -> PackageId {
    PackageId::new(s).unwrap()
}

fn v(s: &str) -> Version {
    Version::parse(s).unwrap()
}

fn r(i: &str, ver: &str) -> NodeRef {
    NodeRef {
        id: id(i),
        version: v(ver),
    }
}

fn publisher() -> PublisherId {
    PublisherId::new("org.example").unwrap()
}

fn digest_of(i: &str, ver: &str) -> Sha256Digest {
    Sha256Digest::of(format!("{i}@{ver}").as_bytes())
}

/// An enabled kernel with no requirements.
fn kernel(i: &str, ver: &str) -> PackageNode {
    PackageNode {
        id: id(i),
        version: v(ver),
        kind: PackageKind::Kernel,
        module_abi: None,
        publisher: publisher(),
        payload_digest: digest_of(i, ver),
        enabled: true,
        dependencies: Vec::new(),
        module_dependencies: Vec::new(),
    }
}

/// An enabled module with module ABI 1 and no requirements.
fn module(i: &str, ver: &str) -> PackageNode {
    PackageNode {
        kind: PackageKind::Module,
        module_abi: Some(1),
        ..kernel(i, ver)
    }
}

fn range(min: &str, max: Option<&str>) -> VersionRange {
    VersionRange::new(v(min), max.map(v)).unwrap()
}

fn dep(target: &str, min: &str, max: Option<&str>) -> Dependency {
    Dependency {
        package_id: id(target),
        range: range(min, max),
    }
}

fn mdep(target: &str, min: &str, max: Option<&str>) -> ModuleDependency {
    ModuleDependency {
        module_id: id(target),
        range: range(min, max),
        abi_tag: MODULE_ABI_TAG_V1.to_owned(),
        publisher_id: None,
        sha256: None,
    }
}

trait NodeExt {
    fn dep(self, d: Dependency) -> Self;
    fn mdep(self, d: ModuleDependency) -> Self;
    fn disabled(self) -> Self;
}

impl NodeExt for PackageNode {
    fn dep(mut self, d: Dependency) -> Self {
        self.dependencies.push(d);
        self
    }
    fn mdep(mut self, d: ModuleDependency) -> Self {
        self.module_dependencies.push(d);
        self
    }
    fn disabled(mut self) -> Self {
        self.enabled = false;
        self
    }
}

fn graph(nodes: Vec<PackageNode>) -> DependencyGraph {
    DependencyGraph::new(nodes).unwrap()
}

fn order_ids(g: &DependencyGraph) -> Vec<String> {
    g.plan()
        .order
        .iter()
        .map(|n| n.node_ref().to_string())
        .collect()
}

/// Asserts that validation finds exactly `expected`, and that the dependent of each problem is
/// blocked with exactly its own problems as the reason.
fn check_problems(g: &DependencyGraph, expected: &[GraphProblem]) {
    let plan = g.plan();
    assert_eq!(plan.problems, expected);
    for p in expected {
        if let Some(dependent) = p.dependent() {
            let own: Vec<GraphProblem> = expected
                .iter()
                .filter(|q| q.dependent() == Some(dependent))
                .cloned()
                .collect();
            let blocked = plan.blocked.iter().find(|b| &b.node == dependent).unwrap();
            assert_eq!(blocked.reason, BlockReason::Problems(own));
            assert!(!plan.order.iter().any(|n| n.node_ref() == *dependent));
        }
    }
}

// ---- Building ---------------------------------------------------------------------------------

#[test]
fn graph_build_refuses_a_repeated_version() {
    let err = DependencyGraph::new(vec![kernel("a", "1.0.0"), kernel("a", "1.0.0").disabled()]);
    assert_eq!(
        err.unwrap_err(),
        GraphBuildError::DuplicateVersion {
            id: id("a"),
            version: v("1.0.0")
        }
    );
}

#[test]
fn graph_build_refuses_two_enabled_versions() {
    let err = DependencyGraph::new(vec![
        kernel("a", "2.0.0"),
        kernel("b", "1.0.0"),
        kernel("a", "1.0.0"),
    ]);
    assert_eq!(
        err.unwrap_err(),
        GraphBuildError::SeveralEnabled {
            id: id("a"),
            first: v("1.0.0"),
            second: v("2.0.0")
        }
    );
    assert_eq!(
        GraphBuildError::SeveralEnabled {
            id: id("a"),
            first: v("1.0.0"),
            second: v("2.0.0")
        }
        .to_string(),
        "a has two enabled versions, 1.0.0 and 2.0.0; at most one version may be enabled"
    );
}

#[test]
fn graph_keeps_several_versions_with_one_enabled() {
    let g = graph(vec![
        kernel("a", "2.0.0"),
        kernel("a", "1.0.0").disabled(),
        kernel("a", "0.9.0").disabled(),
    ]);
    let versions: Vec<_> = g
        .versions(&id("a"))
        .iter()
        .map(|n| n.version.to_string())
        .collect();
    assert_eq!(versions, ["0.9.0", "1.0.0", "2.0.0"]);
    assert_eq!(
        g.enabled(&id("a")).map(|n| n.version.clone()),
        Some(v("2.0.0"))
    );
    assert!(g.node(&id("a"), &v("1.0.0")).is_some());
    assert!(g.versions(&id("zzz")).is_empty());
}

// ---- Every validation problem -----------------------------------------------------------------

#[test]
fn graph_healthy_graph_has_no_problems_and_loads_dependencies_first() {
    let g = graph(vec![
        kernel("app", "1.0.0")
            .dep(dep("base", "1.0.0", None))
            .mdep(mdep("scan", "1.0.0", Some("1.9.99"))),
        module("scan", "1.2.0").dep(dep("base", "1.0.0", None)),
        kernel("base", "1.0.0"),
        kernel("lonely", "3.0.0"),
    ]);
    let plan = g.plan();
    assert!(plan.is_healthy());
    assert_eq!(
        order_ids(&g),
        ["base@1.0.0", "lonely@3.0.0", "scan@1.2.0", "app@1.0.0"]
    );
}

#[test]
fn graph_missing_target_names_both_ends() {
    let g = graph(vec![kernel("app", "1.0.0").dep(dep("scan", "1.0.0", None))]);
    let p = GraphProblem::Missing {
        dependent: r("app", "1.0.0"),
        target: id("scan"),
        requirement: Requirement::Package(dep("scan", "1.0.0", None)),
    };
    assert_eq!(
        p.to_string(),
        "app@1.0.0 requires scan 1.0.0.., but scan is not installed"
    );
    check_problems(&g, &[p]);
}

#[test]
fn graph_disabled_target_names_both_ends_and_installed_versions() {
    let g = graph(vec![
        kernel("app", "1.0.0").mdep(mdep("scan", "1.0.0", None)),
        module("scan", "1.0.0").disabled(),
        module("scan", "1.1.0").disabled(),
    ]);
    let p = GraphProblem::Disabled {
        dependent: r("app", "1.0.0"),
        target: id("scan"),
        requirement: Requirement::Module(mdep("scan", "1.0.0", None)),
        installed: vec![v("1.0.0"), v("1.1.0")],
    };
    assert_eq!(
        p.to_string(),
        "app@1.0.0 requires module scan 1.0.0.., but no version of scan is enabled (installed: 1.0.0, 1.1.0)"
    );
    check_problems(&g, &[p]);
}

#[test]
fn graph_runtime_module_edge_to_a_kernel_is_not_a_module() {
    let g = graph(vec![
        module("app", "1.0.0").mdep(mdep("scan", "1.0.0", None)),
        kernel("scan", "1.0.0"),
    ]);
    let p = GraphProblem::NotAModule {
        dependent: r("app", "1.0.0"),
        target: r("scan", "1.0.0"),
        requirement: Requirement::Module(mdep("scan", "1.0.0", None)),
        kind: PackageKind::Kernel,
    };
    assert_eq!(
        p.to_string(),
        "app@1.0.0 requires module scan 1.0.0.., but scan@1.0.0 is a gkernel package, not a gkmodule"
    );
    check_problems(&g, &[p]);
}

#[test]
fn graph_ordinary_edge_may_target_a_kernel_or_a_module() {
    let g = graph(vec![
        kernel("app", "1.0.0")
            .dep(dep("k", "1.0.0", None))
            .dep(dep("m", "1.0.0", None)),
        kernel("k", "1.0.0"),
        PackageNode {
            module_abi: Some(7),
            ..module("m", "1.0.0")
        },
    ]);
    assert!(g.plan().is_healthy());
}

#[test]
fn graph_runtime_module_edge_needs_module_abi_1() {
    let g = graph(vec![
        kernel("app", "1.0.0")
            .mdep(mdep("two", "1.0.0", None))
            .mdep(mdep("none", "1.0.0", None)),
        PackageNode {
            module_abi: Some(2),
            ..module("two", "1.0.0")
        },
        PackageNode {
            module_abi: None,
            ..module("none", "1.0.0")
        },
    ]);
    let two = GraphProblem::WrongModuleAbi {
        dependent: r("app", "1.0.0"),
        target: r("two", "1.0.0"),
        requirement: Requirement::Module(mdep("two", "1.0.0", None)),
        found: Some(2),
    };
    let none = GraphProblem::WrongModuleAbi {
        dependent: r("app", "1.0.0"),
        target: r("none", "1.0.0"),
        requirement: Requirement::Module(mdep("none", "1.0.0", None)),
        found: None,
    };
    assert_eq!(
        two.to_string(),
        "app@1.0.0 requires module two 1.0.0.., but two@1.0.0 declares module ABI 2; runtime module edges need module ABI 1"
    );
    assert_eq!(
        none.to_string(),
        "app@1.0.0 requires module none 1.0.0.., but none@1.0.0 declares no module ABI; runtime module edges need module ABI 1"
    );
    check_problems(&g, &[two, none]);
}

#[test]
fn graph_version_out_of_range_for_ordinary_and_module_edges() {
    let g = graph(vec![
        kernel("app", "1.0.0")
            .dep(dep("base", "2.0.0", None))
            .mdep(mdep("scan", "1.0.0", Some("1.9.99"))),
        kernel("base", "1.5.0"),
        module("scan", "2.0.0"),
    ]);
    let base = GraphProblem::VersionOutOfRange {
        dependent: r("app", "1.0.0"),
        target: r("base", "1.5.0"),
        requirement: Requirement::Package(dep("base", "2.0.0", None)),
    };
    let scan = GraphProblem::VersionOutOfRange {
        dependent: r("app", "1.0.0"),
        target: r("scan", "2.0.0"),
        requirement: Requirement::Module(mdep("scan", "1.0.0", Some("1.9.99"))),
    };
    assert_eq!(
        scan.to_string(),
        "app@1.0.0 requires module scan 1.0.0..=1.9.99, but the enabled version is scan@2.0.0"
    );
    check_problems(&g, &[base, scan]);
}

#[test]
fn graph_edges_resolve_to_the_enabled_version_only() {
    // The old version would satisfy the range, but it is disabled; the edge sees 2.0.0.
    let g = graph(vec![
        kernel("app", "1.0.0").dep(dep("base", "1.0.0", Some("1.9.9"))),
        kernel("base", "1.0.0").disabled(),
        kernel("base", "2.0.0"),
    ]);
    check_problems(
        &g,
        &[GraphProblem::VersionOutOfRange {
            dependent: r("app", "1.0.0"),
            target: r("base", "2.0.0"),
            requirement: Requirement::Package(dep("base", "1.0.0", Some("1.9.9"))),
        }],
    );
}

#[test]
fn graph_publisher_pin_must_match() {
    let mut pinned = mdep("scan", "1.0.0", None);
    pinned.publisher_id = Some(PublisherId::new("org.other").unwrap());
    let g = graph(vec![
        kernel("app", "1.0.0").mdep(pinned.clone()),
        module("scan", "1.0.0"),
    ]);
    let p = GraphProblem::PublisherMismatch {
        dependent: r("app", "1.0.0"),
        target: r("scan", "1.0.0"),
        requirement: Requirement::Module(pinned),
        expected: PublisherId::new("org.other").unwrap(),
        found: publisher(),
    };
    assert_eq!(
        p.to_string(),
        "app@1.0.0 requires module scan 1.0.0.. from publisher org.other, but scan@1.0.0 is published by org.example"
    );
    check_problems(&g, &[p]);
}

#[test]
fn graph_matching_pins_are_accepted() {
    let mut pinned = mdep("scan", "1.0.0", None);
    pinned.publisher_id = Some(publisher());
    pinned.sha256 = Some(digest_of("scan", "1.0.0"));
    let g = graph(vec![
        module("app", "1.0.0").mdep(pinned),
        module("scan", "1.0.0"),
    ]);
    assert!(g.plan().is_healthy());
}

#[test]
fn graph_digest_pin_must_match_the_payload_digest() {
    let mut pinned = mdep("scan", "1.0.0", None);
    pinned.sha256 = Some(digest_of("scan", "0.9.0"));
    let g = graph(vec![
        kernel("app", "1.0.0").mdep(pinned.clone()),
        module("scan", "1.0.0"),
    ]);
    let p = GraphProblem::DigestMismatch {
        dependent: r("app", "1.0.0"),
        target: r("scan", "1.0.0"),
        requirement: Requirement::Module(pinned),
        expected: digest_of("scan", "0.9.0"),
        found: digest_of("scan", "1.0.0"),
    };
    assert_eq!(
        p.to_string(),
        format!(
            "app@1.0.0 requires module scan 1.0.0.. with payload sha256 {}, but scan@1.0.0 has payload sha256 {}",
            digest_of("scan", "0.9.0"),
            digest_of("scan", "1.0.0")
        )
    );
    check_problems(&g, &[p]);
}

#[test]
fn graph_gkmodule_refuses_a_module_edge_with_another_tag() {
    let mut tagged = mdep("scan", "1.0.0", None);
    tagged.abi_tag = "cmake.build.v2".to_owned();
    let g = graph(vec![
        module("app", "1.0.0").mdep(tagged.clone()),
        module("scan", "1.0.0"),
    ]);
    let p = GraphProblem::NonModuleAbiTag {
        dependent: r("app", "1.0.0"),
        target: id("scan"),
        requirement: Requirement::Module(tagged),
    };
    assert_eq!(
        p.to_string(),
        "app@1.0.0 is a gkmodule, so its module dependency on scan must use abi_tag \"guild.module.v1\", not \"cmake.build.v2\""
    );
    check_problems(&g, &[p]);
}

#[test]
fn graph_historical_gkernel_provenance_edges_are_ignored_but_listed() {
    // The provenance record names a package that is not installed and one that is disabled; a
    // runtime edge in the same place would fail both times.
    let mut missing = mdep("toolchain.gcc", "13.0.0", None);
    missing.abi_tag = "build.provenance".to_owned();
    let mut disabled = mdep("scan", "9.0.0", None);
    disabled.abi_tag = "build.provenance".to_owned();
    let g = graph(vec![
        kernel("old", "1.0.0")
            .mdep(missing.clone())
            .mdep(disabled.clone()),
        module("scan", "1.0.0").disabled(),
    ]);
    let plan = g.plan();
    assert!(plan.is_healthy());
    assert_eq!(order_ids(&g), ["old@1.0.0"]);
    let listed: Vec<(NodeRef, ModuleDependency)> = g
        .provenance()
        .map(|(n, d)| (n.node_ref(), d.clone()))
        .collect();
    assert_eq!(
        listed,
        vec![(r("old", "1.0.0"), missing), (r("old", "1.0.0"), disabled)]
    );
    // A provenance record does not protect its target either.
    assert_eq!(g.check_disable(&id("scan")), Ok(()));
    let g = graph(vec![
        kernel("old", "1.0.0").mdep(g.nodes()[0].module_dependencies[1].clone()),
        module("scan", "1.0.0"),
    ]);
    assert_eq!(g.check_disable(&id("scan")), Ok(()));
    assert_eq!(g.check_remove(&id("scan"), &v("1.0.0")), Ok(()));
}

#[test]
fn graph_disabled_packages_edges_are_not_checked() {
    let g = graph(vec![
        kernel("app", "1.0.0")
            .dep(dep("nothing", "1.0.0", None))
            .disabled(),
        kernel("app", "2.0.0"),
    ]);
    assert!(g.plan().is_healthy());
    assert_eq!(order_ids(&g), ["app@2.0.0"]);
}

#[test]
fn graph_every_problem_of_one_edge_and_node_is_reported() {
    let mut pinned = mdep("scan", "2.0.0", None);
    pinned.publisher_id = Some(PublisherId::new("org.other").unwrap());
    pinned.sha256 = Some(digest_of("x", "1"));
    let g = graph(vec![
        kernel("app", "1.0.0")
            .dep(dep("gone", "1.0.0", None))
            .mdep(pinned.clone()),
        kernel("scan", "1.0.0"),
    ]);
    let req = Requirement::Module(pinned);
    check_problems(
        &g,
        &[
            GraphProblem::Missing {
                dependent: r("app", "1.0.0"),
                target: id("gone"),
                requirement: Requirement::Package(dep("gone", "1.0.0", None)),
            },
            GraphProblem::NotAModule {
                dependent: r("app", "1.0.0"),
                target: r("scan", "1.0.0"),
                requirement: req.clone(),
                kind: PackageKind::Kernel,
            },
            GraphProblem::VersionOutOfRange {
                dependent: r("app", "1.0.0"),
                target: r("scan", "1.0.0"),
                requirement: req.clone(),
            },
            GraphProblem::PublisherMismatch {
                dependent: r("app", "1.0.0"),
                target: r("scan", "1.0.0"),
                requirement: req.clone(),
                expected: PublisherId::new("org.other").unwrap(),
                found: publisher(),
            },
            GraphProblem::DigestMismatch {
                dependent: r("app", "1.0.0"),
                target: r("scan", "1.0.0"),
                requirement: req,
                expected: digest_of("x", "1"),
                found: digest_of("scan", "1.0.0"),
            },
        ],
    );
}

// ---- Cycles -----------------------------------------------------------------------------------

#[test]
fn graph_cycle_is_reported_once_with_its_path() {
    // The cycle mixes edge kinds: a module edge a -> b, ordinary edges b -> c and c -> a.
    let g = graph(vec![
        kernel("c", "1.0.0").dep(dep("a", "1.0.0", None)),
        module("b", "1.0.0").dep(dep("c", "1.0.0", None)),
        module("a", "1.0.0").mdep(mdep("b", "1.0.0", None)),
        module("b", "0.1.0").disabled(),
    ]);
    let plan = g.plan();
    let cycle = GraphProblem::Cycle {
        path: vec![
            r("a", "1.0.0"),
            r("b", "1.0.0"),
            r("c", "1.0.0"),
            r("a", "1.0.0"),
        ],
    };
    assert_eq!(
        cycle.to_string(),
        "dependency cycle: a@1.0.0 -> b@1.0.0 -> c@1.0.0 -> a@1.0.0"
    );
    assert_eq!(plan.problems, vec![cycle.clone()]);
    assert!(plan.order.is_empty());
    let reasons: Vec<_> = plan
        .blocked
        .iter()
        .map(|b| (b.node.clone(), b.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (r("a", "1.0.0"), BlockReason::Problems(vec![cycle.clone()])),
            (r("b", "1.0.0"), BlockReason::Problems(vec![cycle.clone()])),
            (r("c", "1.0.0"), BlockReason::Problems(vec![cycle])),
        ]
    );
}

#[test]
fn graph_self_edge_is_a_cycle() {
    let g = graph(vec![
        kernel("a", "1.0.0").dep(dep("a", "1.0.0", None)),
        kernel("b", "1.0.0"),
    ]);
    let plan = g.plan();
    let cycle = GraphProblem::Cycle {
        path: vec![r("a", "1.0.0"), r("a", "1.0.0")],
    };
    assert_eq!(plan.problems, vec![cycle.clone()]);
    assert_eq!(
        plan.blocked,
        vec![Blocked {
            node: r("a", "1.0.0"),
            reason: BlockReason::Problems(vec![cycle])
        }]
    );
    assert_eq!(order_ids(&g), ["b@1.0.0"]);
}

#[test]
fn graph_separate_cycles_are_reported_separately_and_their_dependents_blocked() {
    let g = graph(vec![
        kernel("x", "1.0.0").dep(dep("y", "1.0.0", None)),
        kernel("y", "1.0.0").dep(dep("x", "1.0.0", None)),
        kernel("p", "1.0.0").dep(dep("q", "1.0.0", None)),
        kernel("q", "1.0.0").dep(dep("p", "1.0.0", None)),
        kernel("top", "1.0.0").dep(dep("x", "1.0.0", None)),
        kernel("free", "1.0.0"),
    ]);
    let plan = g.plan();
    assert_eq!(
        plan.problems,
        vec![
            GraphProblem::Cycle {
                path: vec![r("p", "1.0.0"), r("q", "1.0.0"), r("p", "1.0.0")]
            },
            GraphProblem::Cycle {
                path: vec![r("x", "1.0.0"), r("y", "1.0.0"), r("x", "1.0.0")]
            },
        ]
    );
    let top = plan
        .blocked
        .iter()
        .find(|b| b.node == r("top", "1.0.0"))
        .unwrap();
    assert_eq!(
        top.reason,
        BlockReason::DependencyBlocked {
            via: r("x", "1.0.0"),
            root: r("x", "1.0.0")
        }
    );
    assert_eq!(
        top.to_string(),
        "top@1.0.0 cannot load: its dependency x@1.0.0 cannot load"
    );
    assert_eq!(order_ids(&g), ["free@1.0.0"]);
}

// ---- The load plan ----------------------------------------------------------------------------

#[test]
fn graph_failure_blocks_dependents_transitively_and_loads_the_rest() {
    let g = graph(vec![
        kernel("base", "1.0.0").dep(dep("gone", "1.0.0", None)),
        kernel("mid", "1.0.0").dep(dep("base", "1.0.0", None)),
        module("top", "1.0.0")
            .dep(dep("mid", "1.0.0", None))
            .mdep(mdep("ok", "1.0.0", None)),
        module("ok", "1.0.0"),
        kernel("user", "1.0.0").mdep(mdep("ok", "1.0.0", None)),
    ]);
    let plan = g.plan();
    assert_eq!(order_ids(&g), ["ok@1.0.0", "user@1.0.0"]);
    let missing = GraphProblem::Missing {
        dependent: r("base", "1.0.0"),
        target: id("gone"),
        requirement: Requirement::Package(dep("gone", "1.0.0", None)),
    };
    assert_eq!(
        plan.blocked,
        vec![
            Blocked {
                node: r("base", "1.0.0"),
                reason: BlockReason::Problems(vec![missing])
            },
            Blocked {
                node: r("mid", "1.0.0"),
                reason: BlockReason::DependencyBlocked {
                    via: r("base", "1.0.0"),
                    root: r("base", "1.0.0")
                },
            },
            Blocked {
                node: r("top", "1.0.0"),
                reason: BlockReason::DependencyBlocked {
                    via: r("mid", "1.0.0"),
                    root: r("base", "1.0.0")
                },
            },
        ]
    );
    assert_eq!(
        plan.blocked[2].to_string(),
        "top@1.0.0 cannot load: its dependency mid@1.0.0 cannot load because of problems in base@1.0.0"
    );
    assert_eq!(
        plan.blocked[0].to_string(),
        "base@1.0.0 cannot load: base@1.0.0 requires gone 1.0.0.., but gone is not installed"
    );
}

#[test]
fn graph_order_breaks_ties_by_package_id_whatever_the_input_order() {
    let nodes = vec![
        kernel("zeta", "1.0.0"),
        kernel("alpha", "1.0.0").dep(dep("zeta", "1.0.0", None)),
        kernel("mu", "1.0.0"),
        kernel("beta", "1.0.0"),
    ];
    let mut reversed = nodes.clone();
    reversed.reverse();
    assert_eq!(
        order_ids(&graph(nodes)),
        ["beta@1.0.0", "mu@1.0.0", "zeta@1.0.0", "alpha@1.0.0"]
    );
    assert_eq!(
        order_ids(&graph(reversed)),
        ["beta@1.0.0", "mu@1.0.0", "zeta@1.0.0", "alpha@1.0.0"]
    );
}

// ---- Disable ----------------------------------------------------------------------------------

fn protected_scan() -> DependencyGraph {
    graph(vec![
        module("scan", "1.0.0").disabled(),
        module("scan", "1.1.0"),
        kernel("app", "1.0.0").mdep(mdep("scan", "1.0.0", None)),
        kernel("tool", "2.0.0").dep(dep("scan", "1.0.0", None)),
        kernel("sleeping", "1.0.0")
            .dep(dep("scan", "1.0.0", None))
            .disabled(),
        kernel("other", "1.0.0"),
    ])
}

#[test]
fn graph_disable_is_refused_while_enabled_dependents_exist() {
    let g = protected_scan();
    let err = g.check_disable(&id("scan")).unwrap_err();
    assert_eq!(
        err,
        DisableRefusal::EnabledDependents {
            id: id("scan"),
            dependents: vec![
                Dependent {
                    node: r("app", "1.0.0"),
                    requirement: Requirement::Module(mdep("scan", "1.0.0", None))
                },
                Dependent {
                    node: r("tool", "2.0.0"),
                    requirement: Requirement::Package(dep("scan", "1.0.0", None))
                },
            ],
        }
    );
    assert_eq!(
        err.to_string(),
        "cannot disable scan: enabled packages depend on it: app@1.0.0 (requires module scan 1.0.0..), \
         tool@2.0.0 (requires scan 1.0.0..)"
    );
}

#[test]
fn graph_disable_is_allowed_without_enabled_dependents() {
    let g = protected_scan();
    assert_eq!(g.check_disable(&id("app")), Ok(()));
    assert_eq!(g.check_disable(&id("other")), Ok(()));
    assert_eq!(g.check_disable(&id("sleeping")), Ok(()));
}

#[test]
fn graph_disable_of_an_unknown_package_is_refused() {
    assert_eq!(
        protected_scan().check_disable(&id("ghost")),
        Err(DisableRefusal::NotInstalled { id: id("ghost") })
    );
}

// ---- Remove -----------------------------------------------------------------------------------

#[test]
fn graph_remove_of_the_enabled_version_is_refused_while_dependents_exist() {
    let g = protected_scan();
    let err = g.check_remove(&id("scan"), &v("1.1.0")).unwrap_err();
    assert!(matches!(
        &err,
        RemoveRefusal::EnabledDependents { target, dependents }
            if *target == r("scan", "1.1.0")
                && dependents.iter().map(|d| d.node.clone()).collect::<Vec<_>>()
                    == [r("app", "1.0.0"), r("tool", "2.0.0")]
    ));
    assert!(err.to_string().starts_with(
        "cannot remove scan@1.1.0: it is enabled and enabled packages depend on it: app@1.0.0"
    ));
}

#[test]
fn graph_remove_of_a_version_that_is_not_enabled_is_allowed() {
    let g = protected_scan();
    assert_eq!(g.check_remove(&id("scan"), &v("1.0.0")), Ok(()));
    assert_eq!(g.check_remove(&id("other"), &v("1.0.0")), Ok(()));
}

#[test]
fn graph_remove_of_a_version_that_is_not_installed_is_refused() {
    assert_eq!(
        protected_scan().check_remove(&id("scan"), &v("3.0.0")),
        Err(RemoveRefusal::NotInstalled {
            id: id("scan"),
            version: v("3.0.0")
        })
    );
}

// ---- Rollback ---------------------------------------------------------------------------------

/// `scan` 1.2.0 is enabled; older versions are kept, each wrong for `app`'s pins in one way.
fn rollback_fixture(pin: ModuleDependency) -> DependencyGraph {
    graph(vec![
        kernel("app", "1.0.0").mdep(pin),
        module("scan", "1.2.0"),
        module("scan", "1.1.0").disabled(),
        PackageNode {
            publisher: PublisherId::new("org.other").unwrap(),
            ..module("scan", "1.0.5").disabled()
        },
        PackageNode {
            module_abi: Some(2),
            ..module("scan", "1.0.2").disabled()
        },
        kernel("scan", "1.0.1").disabled(),
        module("scan", "0.9.0").disabled(),
    ])
}

fn pin_for_rollback() -> ModuleDependency {
    let mut pin = mdep("scan", "1.0.0", Some("1.9.99"));
    pin.publisher_id = Some(publisher());
    pin
}

#[test]
fn graph_rollback_to_an_acceptable_version_is_allowed() {
    let g = rollback_fixture(pin_for_rollback());
    assert_eq!(g.check_rollback(&id("scan"), &v("1.1.0")), Ok(()));
    assert_eq!(g.check_rollback(&id("scan"), &v("1.2.0")), Ok(()));
}

#[test]
fn graph_rollback_refuses_a_version_that_is_not_installed() {
    let g = rollback_fixture(pin_for_rollback());
    assert_eq!(
        g.check_rollback(&id("scan"), &v("1.0.0")),
        Err(RollbackRefusal::NotInstalled {
            id: id("scan"),
            version: v("1.0.0")
        })
    );
    assert_eq!(
        g.with_enabled(&id("scan"), &v("1.0.0")).unwrap_err(),
        VersionNotInstalled {
            id: id("scan"),
            version: v("1.0.0")
        }
    );
    let after = g.with_enabled(&id("scan"), &v("1.1.0")).unwrap();
    assert_eq!(
        after.enabled(&id("scan")).map(|n| n.node_ref()),
        Some(r("scan", "1.1.0"))
    );
    let enabled: Vec<_> = after
        .versions(&id("scan"))
        .iter()
        .filter(|n| n.enabled)
        .collect();
    assert_eq!(enabled.len(), 1);
    assert_eq!(
        g.enabled(&id("scan")).map(|n| n.node_ref()),
        Some(r("scan", "1.2.0"))
    );
}

/// Rolls `scan` back to `to` and returns the single problem that refuses it.
fn rollback_problem(g: &DependencyGraph, to: &str) -> GraphProblem {
    match g.check_rollback(&id("scan"), &v(to)) {
        Err(RollbackRefusal::Incompatible {
            id: got_id,
            version,
            mut problems,
        }) => {
            assert_eq!((got_id, version), (id("scan"), v(to)));
            assert_eq!(problems.len(), 1, "{problems:?}");
            problems.remove(0)
        }
        other => panic!("rollback to {to} was not refused as incompatible: {other:?}"),
    }
}

#[test]
fn graph_rollback_refuses_a_version_outside_a_dependents_range() {
    let g = rollback_fixture(pin_for_rollback());
    let p = rollback_problem(&g, "0.9.0");
    assert_eq!(
        p,
        GraphProblem::VersionOutOfRange {
            dependent: r("app", "1.0.0"),
            target: r("scan", "0.9.0"),
            requirement: Requirement::Module(pin_for_rollback()),
        }
    );
    assert_eq!(
        g.check_rollback(&id("scan"), &v("0.9.0")).unwrap_err().to_string(),
        "cannot roll scan back to 0.9.0: app@1.0.0 requires module scan 1.0.0..=1.9.99, but the enabled version is scan@0.9.0"
    );
}

#[test]
fn graph_rollback_refuses_a_version_of_another_kind() {
    let g = rollback_fixture(pin_for_rollback());
    assert_eq!(
        rollback_problem(&g, "1.0.1"),
        GraphProblem::NotAModule {
            dependent: r("app", "1.0.0"),
            target: r("scan", "1.0.1"),
            requirement: Requirement::Module(pin_for_rollback()),
            kind: PackageKind::Kernel,
        }
    );
}

#[test]
fn graph_rollback_refuses_a_version_with_another_module_abi() {
    let g = rollback_fixture(pin_for_rollback());
    assert_eq!(
        rollback_problem(&g, "1.0.2"),
        GraphProblem::WrongModuleAbi {
            dependent: r("app", "1.0.0"),
            target: r("scan", "1.0.2"),
            requirement: Requirement::Module(pin_for_rollback()),
            found: Some(2),
        }
    );
}

#[test]
fn graph_rollback_refuses_a_version_from_another_publisher() {
    let g = rollback_fixture(pin_for_rollback());
    assert_eq!(
        rollback_problem(&g, "1.0.5"),
        GraphProblem::PublisherMismatch {
            dependent: r("app", "1.0.0"),
            target: r("scan", "1.0.5"),
            requirement: Requirement::Module(pin_for_rollback()),
            expected: publisher(),
            found: PublisherId::new("org.other").unwrap(),
        }
    );
}

#[test]
fn graph_rollback_refuses_a_version_with_another_digest() {
    let mut pin = mdep("scan", "1.0.0", None);
    pin.sha256 = Some(digest_of("scan", "1.2.0"));
    let g = rollback_fixture(pin.clone());
    assert_eq!(g.check_rollback(&id("scan"), &v("1.2.0")), Ok(()));
    assert_eq!(
        rollback_problem(&g, "1.1.0"),
        GraphProblem::DigestMismatch {
            dependent: r("app", "1.0.0"),
            target: r("scan", "1.1.0"),
            requirement: Requirement::Module(pin),
            expected: digest_of("scan", "1.2.0"),
            found: digest_of("scan", "1.1.0"),
        }
    );
}

#[test]
fn graph_rollback_names_every_refusing_dependent() {
    let g = graph(vec![
        module("scan", "2.0.0"),
        module("scan", "1.0.0").disabled(),
        kernel("a", "1.0.0").mdep(mdep("scan", "2.0.0", None)),
        kernel("b", "1.0.0").dep(dep("scan", "1.5.0", None)),
        kernel("c", "1.0.0").dep(dep("scan", "1.0.0", None)),
    ]);
    let Err(RollbackRefusal::Incompatible { problems, .. }) =
        g.check_rollback(&id("scan"), &v("1.0.0"))
    else {
        panic!("rollback should be refused");
    };
    let dependents: Vec<_> = problems.iter().map(|p| p.dependent().cloned()).collect();
    assert_eq!(dependents, [Some(r("a", "1.0.0")), Some(r("b", "1.0.0"))]);
}

#[test]
fn graph_rollback_checks_the_old_versions_own_requirements_and_cycles() {
    // scan 1.0.0 required a package that is gone, and scan 0.5.0 required app, which requires scan.
    let g = graph(vec![
        module("scan", "2.0.0"),
        module("scan", "1.0.0")
            .dep(dep("gone", "1.0.0", None))
            .disabled(),
        module("scan", "0.5.0")
            .dep(dep("app", "1.0.0", None))
            .disabled(),
        kernel("app", "1.0.0").mdep(mdep("scan", "0.1.0", None)),
    ]);
    assert_eq!(
        rollback_problem(&g, "1.0.0"),
        GraphProblem::Missing {
            dependent: r("scan", "1.0.0"),
            target: id("gone"),
            requirement: Requirement::Package(dep("gone", "1.0.0", None)),
        }
    );
    assert_eq!(
        rollback_problem(&g, "0.5.0"),
        GraphProblem::Cycle {
            path: vec![r("scan", "0.5.0"), r("app", "1.0.0"), r("scan", "0.5.0")]
        }
    );
}

// ---- Hypothetical states ----------------------------------------------------------------------

#[test]
fn graph_with_replacement_validates_a_publication_in_place() {
    let g = graph(vec![
        module("scan", "1.0.0"),
        kernel("app", "1.0.0").mdep(mdep("scan", "1.0.0", Some("1.9.9"))),
    ]);
    let after = g.with_replacement(module("scan", "2.0.0")).unwrap();
    assert_eq!(
        after.enabled(&id("scan")).map(|n| n.version.clone()),
        Some(v("2.0.0"))
    );
    assert!(!after.node(&id("scan"), &v("1.0.0")).unwrap().enabled);
    assert_eq!(
        after.validate(),
        vec![GraphProblem::VersionOutOfRange {
            dependent: r("app", "1.0.0"),
            target: r("scan", "2.0.0"),
            requirement: Requirement::Module(mdep("scan", "1.0.0", Some("1.9.9"))),
        }]
    );
    // Replacing an installed version in place keeps one node for it.
    let same = g
        .with_replacement(PackageNode {
            module_abi: Some(3),
            ..module("scan", "1.0.0")
        })
        .unwrap();
    assert_eq!(same.versions(&id("scan")).len(), 1);
    assert!(matches!(
        same.validate().as_slice(),
        [GraphProblem::WrongModuleAbi { found: Some(3), .. }]
    ));
    // The original graph is untouched.
    assert!(g.plan().is_healthy());
}

// ---- Properties -------------------------------------------------------------------------------

fn name(i: usize) -> String {
    format!("p{i:02}")
}

/// Nodes `p00..` where each `(from, to)` pair is an ordinary edge from `from` to `to`.
fn nodes_with_edges(n: usize, edges: &[(usize, usize)]) -> Vec<PackageNode> {
    let mut nodes: Vec<PackageNode> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                kernel(&name(i), "1.0.0")
            } else {
                module(&name(i), "1.0.0")
            }
        })
        .collect();
    for &(from, to) in edges {
        // Alternate the edge kind so both kinds take part; runtime module edges need a module.
        let target = &name(to);
        if to % 2 == 1 && from % 3 == 0 {
            nodes[from]
                .module_dependencies
                .push(mdep(target, "1.0.0", None));
        } else {
            nodes[from].dependencies.push(dep(target, "1.0.0", None));
        }
    }
    nodes
}

/// A DAG: every edge goes from a higher to a lower index, in a random permutation of the input.
fn dag() -> impl Strategy<Value = (usize, Vec<(usize, usize)>, Vec<usize>)> {
    (1usize..40).prop_flat_map(|n| {
        let edges = proptest::collection::vec((0..n, 0..n), 0..(3 * n)).prop_map(|pairs| {
            pairs
                .into_iter()
                .filter(|(a, b)| a != b)
                .map(|(a, b)| (a.max(b), a.min(b)))
                .collect::<Vec<_>>()
        });
        let perm = Just((0..n).collect::<Vec<_>>()).prop_shuffle();
        (Just(n), edges, perm)
    })
}

/// Any directed graph, self-edges included.
fn digraph() -> impl Strategy<Value = (usize, Vec<(usize, usize)>)> {
    (1usize..12).prop_flat_map(|n| (Just(n), proptest::collection::vec((0..n, 0..n), 0..(2 * n))))
}

/// Reference reachability by repeated DFS: `reach[a][b]` when a path of one or more edges leads
/// from `a` to `b`.
fn reachability(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<bool>> {
    let mut reach = vec![vec![false; n]; n];
    for (a, row) in reach.iter_mut().enumerate() {
        let mut stack: Vec<usize> = edges.iter().filter(|e| e.0 == a).map(|e| e.1).collect();
        while let Some(x) = stack.pop() {
            if !row[x] {
                row[x] = true;
                stack.extend(edges.iter().filter(|e| e.0 == x).map(|e| e.1));
            }
        }
    }
    reach
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The load order holds every node of a DAG, puts each dependency before its dependent, and
    /// does not depend on the order the nodes were given in.
    #[test]
    fn graph_order_respects_every_edge_of_any_dag((n, edges, perm) in dag()) {
        let nodes = nodes_with_edges(n, &edges);
        let shuffled: Vec<PackageNode> = perm.iter().map(|&i| nodes[i].clone()).collect();
        let g = graph(nodes);
        let plan = g.plan();
        prop_assert!(plan.is_healthy(), "{:?}", plan.problems);
        prop_assert_eq!(plan.order.len(), n);
        let position = |i: usize| plan.order.iter().position(|n| n.id.as_str() == name(i)).unwrap();
        for &(from, to) in &edges {
            prop_assert!(position(to) < position(from), "{} must load before {}", name(to), name(from));
        }
        let shuffled_graph = graph(shuffled);
        prop_assert_eq!(&shuffled_graph.plan(), &plan);
    }

    /// Cycle detection agrees with reachability: a cycle is reported iff some node reaches itself;
    /// every reported path is a real closed walk of cyclic nodes; there is one report per
    /// strongly connected component with a cycle; and exactly the nodes that cannot reach a cyclic
    /// node load.
    #[test]
    fn graph_cycles_agree_with_a_reachability_reference((n, edges) in digraph()) {
        let reach = reachability(n, &edges);
        let cyclic: Vec<bool> = (0..n).map(|i| reach[i][i]).collect();
        let g = graph(nodes_with_edges(n, &edges));
        let plan = g.plan();
        let index = |r: &NodeRef| (0..n).find(|&i| r.id.as_str() == name(i)).unwrap();

        let mut reported_components: Vec<usize> = Vec::new();
        for p in &plan.problems {
            let GraphProblem::Cycle { path } = p else {
                return Err(TestCaseError::fail(format!("unexpected problem {p}")));
            };
            prop_assert!(path.len() >= 2 && path.first() == path.last());
            for w in path.windows(2) {
                prop_assert!(edges.contains(&(index(&w[0]), index(&w[1]))), "{p} uses a missing edge");
                prop_assert!(cyclic[index(&w[0])]);
            }
            // Identify the component by its smallest member.
            let first = index(&path[0]);
            let smallest = (0..n).find(|&j| j == first || (reach[first][j] && reach[j][first])).unwrap();
            prop_assert_eq!(smallest, first, "cycle should start at its component's smallest node");
            reported_components.push(first);
        }
        let mut expected_components: Vec<usize> = (0..n)
            .filter(|&i| cyclic[i] && (0..i).all(|j| !(reach[i][j] && reach[j][i])))
            .collect();
        expected_components.sort_unstable();
        prop_assert_eq!(&reported_components, &expected_components);
        prop_assert_eq!(plan.problems.is_empty(), !cyclic.iter().any(|&c| c));

        let mut loads: Vec<usize> = plan.order.iter().map(|n| index(&n.node_ref())).collect();
        loads.sort_unstable();
        let expected_loads: Vec<usize> =
            (0..n).filter(|&i| !cyclic[i] && !(0..n).any(|j| cyclic[j] && reach[i][j])).collect();
        prop_assert_eq!(loads, expected_loads);
        prop_assert_eq!(plan.order.len() + plan.blocked.len(), n);
    }
}

/// Package `p{i}` at 1.0.0 (disabled) and 2.0.0 (enabled); `edges[i][k]` lists version k's
/// requirements as (target, range choice).
type VersionedEdges = Vec<[Vec<(usize, u8)>; 2]>;

fn versioned_graph() -> impl Strategy<Value = (VersionedEdges, usize)> {
    (2usize..8).prop_flat_map(|n| {
        let reqs = proptest::collection::vec((0..n, 0u8..3), 0..3);
        let per_package = [reqs.clone(), reqs];
        (proptest::collection::vec(per_package, n), 0..n)
    })
}

fn versioned_nodes(edges: &VersionedEdges) -> Vec<PackageNode> {
    let mut nodes = Vec::new();
    for (i, versions) in edges.iter().enumerate() {
        for (k, reqs) in versions.iter().enumerate() {
            let ver = if k == 0 { "1.0.0" } else { "2.0.0" };
            let mut node = module(&name(i), ver);
            node.enabled = k == 1;
            for &(to, choice) in reqs {
                let (min, max) = match choice {
                    0 => ("1.0.0", Some("1.9.9")),
                    1 => ("2.0.0", None),
                    _ => ("0.1.0", None),
                };
                if (i + to) % 2 == 0 {
                    node.dependencies.push(dep(&name(to), min, max));
                } else {
                    node.module_dependencies.push(mdep(&name(to), min, max));
                }
            }
            nodes.push(node);
        }
    }
    nodes
}

proptest! {
    /// The rollback query, which judges the rolled-back state without copying the graph, agrees
    /// with validating a copy of the graph in that state: the same edge problems concerning the
    /// package, and a cycle exactly when the restored version reaches itself.
    #[test]
    fn graph_rollback_agrees_with_validating_the_rolled_back_copy((edges, rolled) in versioned_graph()) {
        let g = graph(versioned_nodes(&edges));
        let rolled_id = id(&name(rolled));
        let after = g.with_enabled(&rolled_id, &v("1.0.0")).unwrap();
        let expected: Vec<GraphProblem> = after
            .validate()
            .into_iter()
            .filter(|p| !matches!(p, GraphProblem::Cycle { .. }) && p.involves(&rolled_id))
            .collect();
        // Reference: in the rolled-back state package i uses version 1.0.0 iff i == rolled.
        let n = edges.len();
        let flat: Vec<(usize, usize)> = (0..n)
            .flat_map(|i| {
                let k = usize::from(i != rolled);
                edges[i][k].iter().map(move |&(to, _)| (i, to))
            })
            .collect();
        let reaches_itself = reachability(n, &flat)[rolled][rolled];

        match g.check_rollback(&rolled_id, &v("1.0.0")) {
            Ok(()) => prop_assert!(expected.is_empty() && !reaches_itself, "{expected:?}"),
            Err(RollbackRefusal::Incompatible { problems, .. }) => {
                let (cycles, others): (Vec<_>, Vec<_>) =
                    problems.into_iter().partition(|p| matches!(p, GraphProblem::Cycle { .. }));
                prop_assert_eq!(others, expected);
                prop_assert_eq!(cycles.len(), usize::from(reaches_itself));
                if let Some(GraphProblem::Cycle { path }) = cycles.first() {
                    prop_assert_eq!(path.first(), Some(&r(&name(rolled), "1.0.0")));
                    prop_assert_eq!(path.first(), path.last());
                }
            }
            Err(other) => prop_assert!(false, "unexpected refusal {other}"),
        }
    }
}

/// One requirement of a generated version: its target (an index; the last one is never
/// installed), its form (0 a dependency, 1 a runtime module edge, 2 a provenance record), its
/// range, and its pins.
#[derive(Debug, Clone)]
struct GenReq {
    to: usize,
    form: u8,
    range: u8,
    publisher: Option<bool>,
    digest: Option<u8>,
}

/// One generated version: kernel, module of ABI 1 or of ABI 2; its publisher; its requirements.
#[derive(Debug, Clone)]
struct GenVersion {
    shape: u8,
    other_publisher: bool,
    reqs: Vec<GenReq>,
}

/// A generated package: which of versions 1.0.0 to 4.0.0 are installed, and which (if any) is
/// enabled.
#[derive(Debug, Clone)]
struct GenPackage {
    versions: Vec<Option<GenVersion>>,
    enabled: usize,
}

fn gen_package(n: usize) -> impl Strategy<Value = GenPackage> {
    let req = (
        0..n + 2,
        0u8..3,
        0u8..4,
        proptest::option::of(any::<bool>()),
        proptest::option::of(1u8..5),
    )
        .prop_map(|(to, form, range, publisher, digest)| GenReq {
            to,
            form,
            range,
            publisher,
            digest,
        });
    let version = (0u8..3, any::<bool>(), proptest::collection::vec(req, 0..3)).prop_map(
        |(shape, other_publisher, reqs)| GenVersion {
            shape,
            other_publisher,
            reqs,
        },
    );
    (
        proptest::collection::vec(proptest::option::of(version), 4),
        0usize..5,
    )
        .prop_map(|(versions, enabled)| GenPackage { versions, enabled })
}

fn gen_nodes(i: usize, p: &GenPackage) -> Vec<PackageNode> {
    let mut out = Vec::new();
    for (k, ver) in p.versions.iter().enumerate() {
        let Some(ver) = ver else { continue };
        let version = format!("{}.0.0", k + 1);
        let mut node = match ver.shape {
            0 => kernel(&name(i), &version),
            s => PackageNode {
                module_abi: Some(u32::from(s)),
                ..module(&name(i), &version)
            },
        };
        node.enabled = k == p.enabled;
        if ver.other_publisher {
            node.publisher = PublisherId::new("org.other").unwrap();
        }
        for q in &ver.reqs {
            let (min, max) = match q.range {
                0 => ("1.0.0", Some("1.9.9")),
                1 => ("2.0.0", None),
                2 => ("0.1.0", None),
                _ => ("3.0.0", Some("3.9.9")),
            };
            let target = name(q.to);
            if q.form == 0 {
                node.dependencies.push(dep(&target, min, max));
                continue;
            }
            let mut m = mdep(&target, min, max);
            if q.form == 2 {
                m.abi_tag = "build.provenance".to_owned();
            }
            m.publisher_id = q.publisher.map(|other| {
                PublisherId::new(if other { "org.other" } else { "org.example" }).unwrap()
            });
            m.sha256 = q.digest.map(|d| digest_of(&target, &format!("{d}.0.0")));
            node.module_dependencies.push(m);
        }
        out.push(node);
    }
    out
}

/// A store of up to six packages, a change to one of them (or to a package not installed yet):
/// only which version is enabled, or any other set of versions; and a version to ask about.
fn graph_change() -> impl Strategy<Value = (Vec<GenPackage>, usize, GenPackage, bool, usize, usize)>
{
    (1usize..7).prop_flat_map(|n| {
        (
            proptest::collection::vec(gen_package(n), n),
            0..n + 1,
            gen_package(n),
            any::<bool>(),
            0usize..5,
            1usize..5,
        )
    })
}

/// `before` refuses a change for the problems `after` has that it has not, as the package
/// manager did before it kept the graph between changes.
fn added_problems(before: &DependencyGraph, after: &DependencyGraph) -> Vec<GraphProblem> {
    let old = before.validate();
    after
        .validate()
        .into_iter()
        .filter(|p| !old.contains(p))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Every query of the kept index answers as the same query on a graph of every installed
    /// version: the problems a change adds, disabling, removing and rolling back; and an index
    /// updated by one package equals the index built from scratch.
    #[test]
    fn graph_index_answers_as_the_whole_graph(
        (packages, changed, replacement, only_enable, enable, asked) in graph_change()
    ) {
        let n = packages.len();
        let all = |changed_to: Option<&GenPackage>| -> Vec<PackageNode> {
            let mut out = Vec::new();
            for (i, p) in packages.iter().enumerate() {
                match changed_to {
                    Some(c) if i == changed => out.extend(gen_nodes(i, c)),
                    _ => out.extend(gen_nodes(i, p)),
                }
            }
            if changed == n {
                if let Some(c) = changed_to {
                    out.extend(gen_nodes(n, c));
                }
            }
            out
        };
        let after_package = match packages.get(changed) {
            Some(p) if only_enable => GenPackage { enabled: enable, ..p.clone() },
            _ => replacement,
        };
        let before_nodes = all(None);
        let after_nodes = all(Some(&after_package));
        let before = graph(before_nodes.clone());
        let after = graph(after_nodes.clone());
        let index = GraphIndex::new(before_nodes).unwrap();
        let pid = id(&name(changed));

        prop_assert_eq!(
            index.problems_added(&pid, gen_nodes(changed, &after_package)).unwrap(),
            added_problems(&before, &after)
        );

        for i in 0..n + 2 {
            let q = id(&name(i));
            prop_assert_eq!(index.check_disable(&q), before.check_disable(&q));
            let version = v(&format!("{asked}.0.0"));
            prop_assert_eq!(index.check_remove(&q, &version), before.check_remove(&q, &version));
            prop_assert_eq!(index.check_rollback(&q, &version), before.check_rollback(&q, &version));
        }

        let mut updated = index.clone();
        updated.set_package(&pid, gen_nodes(changed, &after_package)).unwrap();
        prop_assert_eq!(&updated, &GraphIndex::new(after_nodes).unwrap());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// The plan of the installed versions of the packages [`requirement_part`] names blocks
    /// the same versions, in the same order, for the same reasons, with the same problems, as
    /// the plan of every installed version (what the opening check reads of it).
    #[test]
    fn the_requirement_part_blocks_what_the_whole_graph_blocks(
        packages in (1usize..8).prop_flat_map(|n| proptest::collection::vec(gen_package(n), n))
    ) {
        let nodes: Vec<PackageNode> = packages
            .iter()
            .enumerate()
            .flat_map(|(i, p)| gen_nodes(i, p))
            .collect();
        let part = requirement_part(nodes.iter().filter(|n| n.enabled).map(|n| {
            (
                &n.id,
                n.dependencies.as_slice(),
                n.module_dependencies.as_slice(),
            )
        }));
        let partial: Vec<PackageNode> = nodes
            .iter()
            .filter(|n| part.contains(&n.id))
            .cloned()
            .collect();
        let (whole, partial) = (graph(nodes.clone()), graph(partial));
        let (whole, partial) = (whole.plan(), partial.plan());
        prop_assert_eq!(&partial.blocked, &whole.blocked);
        prop_assert_eq!(&partial.problems, &whole.problems);
    }
}

/// Packages that state no requirement and that none names are left out of the part, the
/// packages a requirement names are in it with every installed version.
#[test]
fn the_requirement_part_leaves_out_what_neither_requires_nor_is_required() {
    let mut user = module("user", "1.0.0");
    user.module_dependencies.push(mdep("base", "1.0.0", None));
    let mut old_user = module("olduser", "1.0.0");
    old_user.enabled = false;
    old_user
        .module_dependencies
        .push(mdep("gone", "1.0.0", None));
    let nodes = [
        module("alone", "1.0.0"),
        module("base", "1.0.0"),
        user,
        old_user,
    ];
    let part = requirement_part(nodes.iter().filter(|n| n.enabled).map(|n| {
        (
            &n.id,
            n.dependencies.as_slice(),
            n.module_dependencies.as_slice(),
        )
    }));
    let part: Vec<&str> = part.iter().map(|id| id.as_str()).collect();
    assert_eq!(part, ["base", "user"]);
}

#[test]
fn graph_index_refuses_a_replacement_that_is_not_one_package() {
    let mut index = GraphIndex::new(vec![kernel("a", "1.0.0")]).unwrap();
    let before = index.clone();
    assert_eq!(
        index.set_package(&id("a"), vec![kernel("b", "1.0.0")]),
        Err(GraphBuildError::OtherPackage {
            id: id("a"),
            found: r("b", "1.0.0")
        })
    );
    assert_eq!(
        index.problems_added(&id("a"), vec![kernel("a", "2.0.0"), kernel("a", "1.0.0")]),
        Err(GraphBuildError::SeveralEnabled {
            id: id("a"),
            first: v("1.0.0"),
            second: v("2.0.0")
        })
    );
    assert_eq!(index, before);
}

/// Disabling the package on a cycle can leave a smaller cycle behind that was not reported
/// before (its component was reported by another path): the index must see it, as comparing the
/// two whole graphs does.
#[test]
fn graph_index_sees_the_cycle_a_change_leaves_behind() {
    let a = kernel("a", "1.0.0")
        .dep(dep("p", "1.0.0", None))
        .dep(dep("b", "1.0.0", None));
    let b = kernel("b", "1.0.0").dep(dep("a", "1.0.0", None));
    let p = kernel("p", "1.0.0").dep(dep("a", "1.0.0", None));
    let before_nodes = vec![a, b, p.clone()];
    let index = GraphIndex::new(before_nodes.clone()).unwrap();
    let p_after = vec![p.clone().disabled(), kernel("p", "2.0.0").disabled()];
    let mut after_nodes = before_nodes[..2].to_vec();
    after_nodes.extend(p_after.clone());
    let expected = added_problems(&graph(before_nodes), &graph(after_nodes));
    assert!(
        expected.contains(&GraphProblem::Cycle {
            path: vec![r("a", "1.0.0"), r("b", "1.0.0"), r("a", "1.0.0")]
        }),
        "{expected:?}"
    );
    assert_eq!(index.problems_added(&id("p"), p_after).unwrap(), expected);
}
