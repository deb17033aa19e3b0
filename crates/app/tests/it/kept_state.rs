//! What the package manager keeps of the committed registry between changes (the dependency
//! graph with its reverse edges, and the impl-id claims) follows every commit: its own, which
//! update it in place, and other processes', after which it is built again. A stale copy would
//! let a change through that the store no longer allows.

use guild_host::{HostError, InstallOptions, PackageManager, VerifyOptions};
use guild_test_support::{
    id, key, open_dir, retry_locked, trust, ModDep, Spec, Workshop, PUBLISHER,
};

fn reader(root: &std::path::Path) -> PackageManager {
    retry_locked(|| PackageManager::open_dir_reader(root))
        .unwrap()
        .0
}

#[test]
fn kept_state_follows_commits_made_through_another_handle() {
    let shop = Workshop::new();
    let k = key();
    let root = shop.fresh("store");
    {
        let (pm, _) = open_dir(&root).unwrap();
        trust(&pm, PUBLISHER, &k);
    }
    let base = shop.build(&Spec::module("ex.base", "1.0.0"), &k);
    let user = shop.build(
        &Spec::module("ex.user", "1.0.0").module_dep(ModDep::on("ex.base", "1.0.0")),
        &k,
    );
    let owner = shop.build(&Spec::module("ex.owner", "1.0.0").op("ex.shared.op"), &k);
    let rival = shop.build(&Spec::module("ex.rival", "1.0.0").op("ex.shared.op"), &k);
    let other = shop.build(&Spec::module("ex.other", "1.0.0"), &k);

    // Two handles on one store, as two runners would hold it. The second makes a change first,
    // so it keeps a graph and claims of that generation.
    let first = reader(&root);
    let second = reader(&root);
    second
        .install(&other.archive, InstallOptions::default())
        .unwrap();
    second
        .install(&base.archive, InstallOptions::default())
        .unwrap();

    // The first adds a dependent of ex.base and takes an impl id.
    first
        .install(&user.archive, InstallOptions::default())
        .unwrap();
    first
        .install(&owner.archive, InstallOptions::default())
        .unwrap();

    // The second must see both.
    let err = second.disable(&id("ex.base")).unwrap_err();
    assert!(
        matches!(err, HostError::Disable(_)) && err.to_string().contains("ex.user@1.0.0"),
        "{err}"
    );
    let err = second.remove(&id("ex.base"), None).unwrap_err();
    assert!(err.to_string().contains("ex.user@1.0.0"), "{err}");
    let err = second
        .install(&rival.archive, InstallOptions::default())
        .unwrap_err();
    assert!(
        matches!(&err, HostError::ImplIdConflict(c) if c.owner.id == id("ex.owner")),
        "{err}"
    );

    // Its own changes keep what it holds in step: once the dependent is gone, ex.base may go.
    second.disable(&id("ex.user")).unwrap();
    second.disable(&id("ex.base")).unwrap();
    // And the first sees that in turn: enabling the dependent again needs ex.base enabled.
    let err = first.enable(&id("ex.user")).unwrap_err();
    assert!(
        matches!(err, HostError::Dependencies { .. }) && err.to_string().contains("ex.base"),
        "{err}"
    );
}

/// A writer that has just opened the store keeps no index of it: its first installation is
/// judged on what that installation touches. Every check the index of the whole store makes must
/// still be made: an impl id held anywhere (by a current version or a rollback target), a
/// dependent whose range the new version leaves, and a cycle through packages already installed.
#[test]
fn kept_state_an_install_by_a_freshly_opened_writer_is_checked_against_the_whole_store() {
    let shop = Workshop::new();
    let k = key();
    let root = shop.fresh("store");
    let install = |archive: &std::path::Path| {
        let (pm, _) = open_dir(&root).unwrap();
        pm.install(archive, InstallOptions::default())
    };
    {
        let (pm, _) = open_dir(&root).unwrap();
        trust(&pm, PUBLISHER, &k);
    }
    let mut specs = Vec::new();
    for i in 0..12 {
        specs.push(Spec::module(&format!("ex.filler{i:02}"), "1.0.0"));
    }
    specs.extend([
        Spec::module("ex.owner", "1.0.0").op("ex.shared.old"),
        Spec::module("ex.owner", "2.0.0").op("ex.shared.new"),
        Spec::module("ex.base", "1.0.0"),
        Spec::module("ex.user", "1.0.0").depends_on("ex.base", "1.0.0", Some("1.9.0")),
        Spec::module("ex.modbase", "1.0.0"),
        Spec::module("ex.moduser", "1.0.0")
            .module_dep(ModDep::on("ex.modbase", "1.0.0").max("1.9.0")),
        Spec::module("ex.ring.b", "1.0.0"),
        Spec::module("ex.ring.a", "1.0.0").module_dep(ModDep::on("ex.ring.b", "1.0.0")),
    ]);
    for spec in &specs {
        install(&shop.build(spec, &k).archive).unwrap();
    }

    // The rollback target ex.owner@1.0.0 still holds the id its successor dropped.
    let rival = shop.build(&Spec::module("ex.rival", "1.0.0").op("ex.shared.old"), &k);
    let err = install(&rival.archive).unwrap_err();
    assert!(
        matches!(&err, HostError::ImplIdConflict(c)
            if c.owner.to_string() == "ex.owner@1.0.0" && c.claimant.id == id("ex.rival")),
        "{err}"
    );
    let rival = shop.build(&Spec::module("ex.rival", "1.0.0").op("ex.shared.new"), &k);
    let err = install(&rival.archive).unwrap_err();
    assert!(
        matches!(&err, HostError::ImplIdConflict(c) if c.owner.to_string() == "ex.owner@2.0.0"),
        "{err}"
    );

    // A new version of ex.base outside ex.user's range breaks its dependent.
    let base = shop.build(&Spec::module("ex.base", "2.0.0"), &k);
    let err = install(&base.archive).unwrap_err();
    assert!(
        matches!(&err, HostError::Dependencies { problems, .. }
            if problems.iter().any(|p| p.dependent().is_some_and(|d| d.to_string() == "ex.user@1.0.0"))),
        "{err}"
    );

    // So does one outside a range a dependent names as a module dependency.
    let modbase = shop.build(&Spec::module("ex.modbase", "2.0.0"), &k);
    let err = install(&modbase.archive).unwrap_err();
    assert!(
        matches!(&err, HostError::Dependencies { problems, .. }
            if problems.iter().any(|p| p.dependent().is_some_and(|d| d.to_string() == "ex.moduser@1.0.0"))),
        "{err}"
    );

    // ex.ring.b 2.0.0 requiring ex.ring.a closes a cycle through a package installed before it.
    let ring = shop.build(
        &Spec::module("ex.ring.b", "2.0.0").module_dep(ModDep::on("ex.ring.a", "1.0.0")),
        &k,
    );
    let err = install(&ring.archive).unwrap_err();
    assert!(
        matches!(&err, HostError::Dependencies { problems, .. }
            if problems.iter().any(|p| matches!(p, guild_domain::graph::GraphProblem::Cycle { .. }))),
        "{err}"
    );

    // What breaks nothing and takes a free id goes in.
    let fine = shop.build(
        &Spec::module("ex.fine", "1.0.0")
            .op("ex.shared.free")
            .depends_on("ex.base", "1.0.0", None),
        &k,
    );
    install(&fine.archive).unwrap();
}

/// Making an installed version current again (the `guild install` of a version the store still
/// holds) as a freshly opened writer's first change is judged on the index around it too: a
/// dependent that came in after a rollback and excludes the version refuses it.
#[test]
fn kept_state_a_reactivation_by_a_freshly_opened_writer_is_checked_against_the_whole_store() {
    let shop = Workshop::new();
    let k = key();
    let root = shop.fresh("store");
    let fresh = || open_dir(&root).unwrap().0;
    trust(&fresh(), PUBLISHER, &k);
    let base1 = shop.build(&Spec::module("ex.base", "1.0.0"), &k);
    let base2 = shop.build(&Spec::module("ex.base", "2.0.0"), &k);
    fresh()
        .install(&base1.archive, InstallOptions::default())
        .unwrap();
    fresh()
        .install(&base2.archive, InstallOptions::default())
        .unwrap();
    fresh().rollback(&id("ex.base")).unwrap();
    let user = shop.build(
        &Spec::module("ex.user", "1.0.0").module_dep(ModDep::on("ex.base", "1.0.0").max("1.9.0")),
        &k,
    );
    fresh()
        .install(&user.archive, InstallOptions::default())
        .unwrap();

    let err = fresh()
        .install(&base2.archive, InstallOptions::default())
        .unwrap_err();
    assert!(
        matches!(&err, HostError::Dependencies { problems, .. }
            if problems.iter().any(|p| p.dependent().is_some_and(|d| d.to_string() == "ex.user@1.0.0"))),
        "{err}"
    );
    // With the dependent gone, the version is made current again.
    fresh().remove(&id("ex.user"), None).unwrap();
    let done = fresh()
        .install(&base2.archive, InstallOptions::default())
        .unwrap();
    assert!(done.reactivated, "{done:?}");
}

/// Repairing a tainted version (offering its genuine archive again) as a freshly opened
/// writer's first change is judged on the index around it too: the repair makes the version
/// enabled again, and a requirement of it that the store stopped meeting while it was disabled
/// refuses the repair.
#[test]
fn kept_state_a_repair_by_a_freshly_opened_writer_is_checked_against_the_whole_store() {
    let shop = Workshop::new();
    let k = key();
    let root = shop.fresh("store");
    let fresh = || open_dir(&root).unwrap().0;
    trust(&fresh(), PUBLISHER, &k);
    let base1 = shop.build(&Spec::module("ex.base", "1.0.0"), &k);
    let base2 = shop.build(&Spec::module("ex.base", "2.0.0"), &k);
    let user = shop.build(
        &Spec::module("ex.user", "1.0.0").module_dep(ModDep::on("ex.base", "1.0.0").max("1.9.0")),
        &k,
    );
    for built in [&base1, &user] {
        fresh()
            .install(&built.archive, InstallOptions::default())
            .unwrap();
    }
    // ex.user's files are changed behind the store's back; the full check taints and disables it.
    let tree = root.join("packages").join("ex.user").join("1.0.0");
    let library = first_file_under(&tree.join("lib"));
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&library, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&library, b"tampered").unwrap();
        std::fs::set_permissions(&library, std::fs::Permissions::from_mode(0o444)).unwrap();
    }
    let checked = fresh().verify_all(VerifyOptions::default()).unwrap();
    assert_eq!(checked.failures.len(), 1, "{checked:?}");
    // With ex.user disabled, ex.base moves past what it accepts.
    fresh()
        .install(&base2.archive, InstallOptions::default())
        .unwrap();

    let err = fresh()
        .install(&user.archive, InstallOptions::default())
        .unwrap_err();
    assert!(
        matches!(&err, HostError::Dependencies { .. }) && err.to_string().contains("ex.base"),
        "{err}"
    );
    let registry = reader(&root).list().unwrap();
    let user_row = registry
        .iter()
        .find(|p| p.id.as_str() == "ex.user")
        .unwrap();
    assert!(
        user_row.versions[0].taint.is_some(),
        "a refused repair leaves the version tainted: {user_row:?}"
    );
    // With ex.base back on a version it accepts, the same repair goes through.
    fresh().rollback(&id("ex.base")).unwrap();
    let done = fresh()
        .install(&user.archive, InstallOptions::default())
        .unwrap();
    assert!(done.repaired, "{done:?}");
}

/// The first regular file found under `dir`, depth first.
fn first_file_under(dir: &std::path::Path) -> std::path::PathBuf {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_file() {
            return path;
        }
        if path.is_dir() {
            return first_file_under(&path);
        }
    }
    panic!("no file under {}", dir.display());
}
