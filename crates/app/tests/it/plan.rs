//! `PackageManager::apply_plan`, the one change a `guild sync` makes, through the package
//! manager alone: what it refuses as a whole (a package named twice, impl ids two new packages
//! both claim, a result its caller does not accept), each time committing nothing and leaving
//! no staged tree, and a plan that disables a dependency together with its dependent.

use guild_host::package_manager::{Change, LifecycleHook};
use guild_host::{HostError, PlanError, PlanStep, StepDone};
use guild_test_support::{
    assert_no_leftovers, id, key, observe, open_host, trust, v, Scratch, Spec, Workshop, PUBLISHER,
};

/// A hook that lets every change through.
struct Pass;

impl LifecycleHook for Pass {
    fn prepare(&mut self, _: &Change<'_>) -> Result<(), HostError> {
        Ok(())
    }
    fn committed(&mut self) {}
    fn aborted(&mut self) {}
}

fn accept_all(_: &guild_host::domain::store_state::StoreState) -> Result<(), String> {
    Ok(())
}

/// The source of a refusal, and the step and package it names.
fn refusal(e: PlanError) -> (&'static str, String, HostError) {
    match e {
        PlanError::Step {
            step,
            package,
            source,
        } => (step, package, *source),
        other => panic!("not a refused step: {other}"),
    }
}

#[test]
fn a_plan_refused_as_a_whole_commits_nothing_and_leaves_no_staged_tree() {
    let dir = Scratch::new();
    let root = dir.path().join("store");
    let shop = Workshop::new();
    let k = key();
    let host = open_host(&root, None).unwrap();
    trust(&host.pm, PUBLISHER, &k);
    let a = shop.build(&Spec::module("example.a", "1.0.0"), &k);
    let b = shop.build(&Spec::module("example.b", "1.0.0"), &k);
    // Provides an impl id of a's.
    let thief = shop.build(
        &Spec::module("example.thief", "1.0.0").op("example.a.op.cpu"),
        &k,
    );
    let before = observe(&host.pm, &root);
    let generation = host.generation();

    // A package named twice.
    let twice = [
        PlanStep::Install(a.archive.clone()),
        PlanStep::Install(a.archive.clone()),
    ];
    let (step, package, source) = refusal(
        host.pm
            .apply_plan(&twice, &accept_all, &mut Pass)
            .unwrap_err(),
    );
    assert_eq!((step, package.as_str()), ("install", "example.a 1.0.0"));
    assert!(
        matches!(&source, HostError::RepeatedInPlan { id: i } if *i == id("example.a")),
        "{source}"
    );

    // Two new packages that claim one impl id: refused on the final state, though each alone
    // would pass.
    let clash = [
        PlanStep::Install(a.archive.clone()),
        PlanStep::Install(b.archive.clone()),
        PlanStep::Install(thief.archive.clone()),
    ];
    let (step, package, source) = refusal(
        host.pm
            .apply_plan(&clash, &accept_all, &mut Pass)
            .unwrap_err(),
    );
    assert_eq!(step, "apply the changes to");
    assert_eq!(package, "example.a, example.b, example.thief");
    assert!(
        matches!(&source, HostError::ImplIdConflict(c)
            if c.involves(&id("example.a")) && c.involves(&id("example.thief"))),
        "{source}"
    );

    // A result the caller does not accept.
    let refuse = |_: &guild_host::domain::store_state::StoreState| Err("not today".to_owned());
    let fine = [
        PlanStep::Install(a.archive.clone()),
        PlanStep::Install(b.archive.clone()),
    ];
    match host.pm.apply_plan(&fine, &refuse, &mut Pass) {
        Err(PlanError::NotAccepted { reason }) => assert_eq!(reason, "not today"),
        other => panic!("{other:?}"),
    }

    assert_eq!(host.generation(), generation);
    assert_eq!(observe(&host.pm, &root), before);
    assert_no_leftovers(&root, "after the refusals");

    // The same plan, accepted, is one generation.
    let done = host.pm.apply_plan(&fine, &accept_all, &mut Pass).unwrap();
    assert_eq!(done.len(), 2);
    assert_eq!(host.generation(), generation + 1);
    assert_no_leftovers(&root, "after the plan");
}

#[test]
fn a_plan_disables_a_dependency_with_its_dependent_and_refuses_it_without() {
    let dir = Scratch::new();
    let root = dir.path().join("store");
    let shop = Workshop::new();
    let k = key();
    let host = open_host(&root, None).unwrap();
    trust(&host.pm, PUBLISHER, &k);
    let base = shop.build(&Spec::module("example.base", "1.0.0"), &k);
    let user = shop.build(
        &Spec::module("example.user", "1.0.0")
            .module_dep(guild_test_support::ModDep::on("example.base", "1.0.0")),
        &k,
    );
    for built in [&base, &user] {
        host.pm
            .install(&built.archive, guild_host::InstallOptions::default())
            .unwrap();
    }
    let generation = host.generation();

    // The dependency alone: its enabled dependent would break.
    let alone = [PlanStep::Disable(id("example.base"))];
    let (step, package, source) = refusal(
        host.pm
            .apply_plan(&alone, &accept_all, &mut Pass)
            .unwrap_err(),
    );
    assert_eq!(
        (step, package.as_str()),
        ("apply the changes to", "example.base")
    );
    assert!(matches!(source, HostError::Dependencies { .. }), "{source}");
    assert_eq!(host.generation(), generation);

    // The dependency first, then its dependent: the order does not matter, the result does.
    let both = [
        PlanStep::Disable(id("example.base")),
        PlanStep::Disable(id("example.user")),
    ];
    let done = host.pm.apply_plan(&both, &accept_all, &mut Pass).unwrap();
    assert_eq!(
        done,
        [
            StepDone::Disabled {
                id: id("example.base"),
                version: v("1.0.0")
            },
            StepDone::Disabled {
                id: id("example.user"),
                version: v("1.0.0")
            },
        ]
    );
    assert_eq!(host.generation(), generation + 1);
    for p in host.pm.list().unwrap() {
        assert_eq!(p.enabled, None, "{}", p.id);
    }
}
