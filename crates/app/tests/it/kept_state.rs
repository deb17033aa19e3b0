//! What the package manager keeps of the committed registry between changes (the dependency
//! graph with its reverse edges, and the impl-id claims) follows every commit: its own, which
//! update it in place, and other processes', after which it is built again. A stale copy would
//! let a change through that the store no longer allows.

use guild_host::{HostError, InstallOptions, PackageManager};
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
