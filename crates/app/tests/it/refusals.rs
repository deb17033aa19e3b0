//! Every refusal of the package manager, each with its exact error, and each leaving the store
//! exactly as it was: the same registry generation, the same files, and (for installs refused by
//! the dependency graph) no staging directory ever requested, so nothing was extracted.

use std::fs;
use std::path::PathBuf;

use guild_domain::dependency::ModuleDependency;
use guild_domain::graph::{
    Dependent, DisableRefusal, GraphProblem, NodeRef, RemoveRefusal, Requirement, RollbackRefusal,
};
use guild_domain::lease::{Leased, QuiescentAction};
use guild_domain::lifecycle::State;
use guild_domain::store_state::{ImmutableVersionConflict, StoreStateError};
use guild_domain::trust::TrustFileError;
use guild_host::{ErrorCategory, HostError, InstallOptions, PackageManager};
use guild_ports::store::StoreErrorKind;
use guild_test_support::{
    disk, id, key, open_dir, open_host, publisher, trust, v, Built, Host, ModDep, Scratch, Spec,
    Workshop, PUBLISHER,
};

/// A trusted store and a workshop to build packages for it.
struct Bench {
    shop: Workshop,
    _dir: Scratch,
    host: Host,
    key: guild_adapters_crypto::SigningKey,
    cases: usize,
}

impl Bench {
    fn new() -> Self {
        let shop = Workshop::new();
        let dir = Scratch::new();
        let host = open_host(&dir.path().join("store"), None).unwrap();
        let key = key();
        trust(&host.pm, PUBLISHER, &key);
        Bench {
            shop,
            _dir: dir,
            host,
            key,
            cases: 0,
        }
    }

    fn build(&self, spec: &Spec) -> Built {
        self.shop.build(spec, &self.key)
    }

    fn install(&self, built: &Built) {
        self.host
            .pm
            .install(&built.archive, InstallOptions::default())
            .unwrap();
    }

    /// Runs `op`, which must fail, and checks that it changed nothing on disk and requested no
    /// staging directory.
    fn refused<T: std::fmt::Debug>(
        &mut self,
        label: &str,
        op: impl FnOnce(&PackageManager) -> Result<T, HostError>,
    ) -> HostError {
        let before = disk(&self.host.root);
        let generation = self.host.generation();
        let calls = self.host.spy.calls();
        let err = match op(&self.host.pm) {
            Ok(out) => panic!("{label}: allowed, answered {out:?}"),
            Err(e) => e,
        };
        assert_eq!(self.host.generation(), generation, "{label}");
        assert_eq!(disk(&self.host.root), before, "{label}");
        assert_eq!(self.host.spy.calls(), calls, "{label}: {err}");
        assert_eq!(err.category(), ErrorCategory::Refused, "{label}: {err}");
        self.cases += 1;
        err
    }
}

fn node(built: &Built) -> NodeRef {
    NodeRef {
        id: built.id(),
        version: built.version(),
    }
}

fn module_requirement(built: &Built, i: usize) -> Requirement {
    Requirement::Module(module_dep(built, i))
}

fn module_dep(built: &Built, i: usize) -> ModuleDependency {
    built.metadata.manifest().module_dependencies[i].clone()
}

#[test]
fn refusals_of_disable_remove_and_rollback_name_the_dependent() {
    let mut b = Bench::new();
    let core1 = b.build(&Spec::module("example.core", "1.0.0"));
    let core2 = b.build(&Spec::module("example.core", "2.0.0"));
    // One dependent needs 2.x by range, the other pins 2.0.0's payload by digest.
    let ranged = b.build(
        &Spec::module("example.ranged", "1.0.0").module_dep(ModDep::on("example.core", "2.0.0")),
    );
    let pinned = b.build(
        &Spec::module("example.pinned", "1.0.0")
            .module_dep(ModDep::on("example.core", "1.0.0").sha256(core2.digest())),
    );
    for built in [&core1, &core2, &ranged] {
        b.install(built);
    }
    let core = id("example.core");

    let err = b.refused("disable a dependency", |pm| pm.disable(&core));
    let dependents = vec![Dependent {
        node: node(&ranged),
        requirement: module_requirement(&ranged, 0),
    }];
    match err {
        HostError::Disable(e) => assert_eq!(
            e,
            DisableRefusal::EnabledDependents {
                id: core.clone(),
                dependents: dependents.clone(),
            }
        ),
        other => panic!("{other}"),
    }
    let err = b.refused("remove a dependency", |pm| pm.remove(&core, None));
    match err {
        HostError::Remove(e) => assert_eq!(
            e,
            RemoveRefusal::EnabledDependents {
                target: node(&core2),
                dependents,
            }
        ),
        other => panic!("{other}"),
    }
    assert!(
        b.host
            .pm
            .remove(&core, None)
            .unwrap_err()
            .to_string()
            .contains("example.ranged@1.0.0"),
        "the message names the dependent"
    );

    let err = b.refused("roll back below a dependent's range", |pm| {
        pm.rollback(&core)
    });
    let below = RollbackRefusal::Incompatible {
        id: core.clone(),
        version: v("1.0.0"),
        problems: vec![GraphProblem::VersionOutOfRange {
            dependent: node(&ranged),
            target: node(&core1),
            requirement: module_requirement(&ranged, 0),
        }],
    };
    match err {
        HostError::Rollback(e) => assert_eq!(e, below),
        other => panic!("{other}"),
    }

    // Swap the ranged dependent for the pinned one: now the range allows 1.0.0 and the pin does
    // not.
    b.host.pm.disable(&id("example.ranged")).unwrap();
    b.install(&pinned);
    let err = b.refused("roll back against a digest pin", |pm| pm.rollback(&core));
    let pin = RollbackRefusal::Incompatible {
        id: core.clone(),
        version: v("1.0.0"),
        problems: vec![GraphProblem::DigestMismatch {
            dependent: node(&pinned),
            target: node(&core1),
            requirement: module_requirement(&pinned, 0),
            expected: core2.digest(),
            found: core1.digest(),
        }],
    };
    match err {
        HostError::Rollback(e) => assert_eq!(e, pin),
        other => panic!("{other}"),
    }

    // With the dependent gone the same rollback goes through.
    b.host.pm.disable(&id("example.pinned")).unwrap();
    let rolled = b.host.pm.rollback(&core).unwrap();
    assert_eq!((rolled.from, rolled.to), (Some(v("2.0.0")), v("1.0.0")));
    println!("refusals (dependents): {} cases", b.cases);
}

#[test]
fn refusals_of_versions_immutable_and_downgrade() {
    let mut b = Bench::new();
    let first = b.build(&Spec::module("example.core", "1.0.0"));
    let rebuilt = b.build(&Spec::module("example.core", "1.0.0").library(b"rebuilt, other bytes"));
    b.install(&first);

    let err = b.refused("republish a version with other content", |pm| {
        pm.install(&rebuilt.archive, InstallOptions::default())
    });
    let conflict = ImmutableVersionConflict {
        id: id("example.core"),
        version: v("1.0.0"),
        recorded_version: v("1.0.0"),
        recorded: first.digest(),
        offered: rebuilt.digest(),
    };
    match err {
        HostError::StoreState(e) => {
            assert_eq!(
                e,
                StoreStateError::ImmutableVersion(Box::new(conflict.clone()))
            );
        }
        other => panic!("{other}"),
    }
    // Build metadata does not make a new version either.
    let build_meta = b.build(&Spec::module("example.core", "1.0.0+rebuild.2"));
    let err = b.refused("republish with only build metadata changed", |pm| {
        pm.install(&build_meta.archive, InstallOptions::default())
    });
    match err {
        HostError::StoreState(StoreStateError::ImmutableVersion(c)) => {
            assert_eq!(c.version, v("1.0.0+rebuild.2"));
            assert_eq!(c.recorded_version, v("1.0.0"));
            assert_eq!(c.offered, build_meta.digest());
        }
        other => panic!("{other}"),
    }
    // The same payload signed again by another trusted key is the same version: identity is the
    // payload digest, never the signature bytes. Installing it records the new key's signature
    // (a key rotation, G21) and nothing else; installing it once more changes nothing.
    let second_key = key();
    trust(&b.host.pm, PUBLISHER, &second_key);
    let resigned = b
        .shop
        .build(&Spec::module("example.core", "1.0.0"), &second_key);
    assert_eq!(resigned.digest(), first.digest());
    assert_ne!(resigned.metadata.signatures(), first.metadata.signatures());
    let generation = b.host.generation();
    let again = b
        .host
        .pm
        .install(&resigned.archive, InstallOptions::default())
        .unwrap();
    assert!(again.changed);
    assert_eq!(again.version, v("1.0.0"));
    assert_eq!(again.signatures_added, [second_key.key_id()]);
    assert_eq!(b.host.generation(), generation + 1);
    let once_more = b
        .host
        .pm
        .install(&resigned.archive, InstallOptions::default())
        .unwrap();
    assert!(!once_more.changed);
    assert_eq!(b.host.generation(), generation + 1);

    let newer = b.build(&Spec::module("example.core", "2.0.0"));
    let older = b.build(&Spec::module("example.core", "1.5.0"));
    b.install(&newer);
    let err = b.refused("install an older version", |pm| {
        pm.install(&older.archive, InstallOptions::default())
    });
    match err {
        HostError::StoreState(e) => assert_eq!(
            e,
            StoreStateError::Downgrade {
                id: id("example.core"),
                current: v("2.0.0"),
                offered: v("1.5.0"),
            }
        ),
        other => panic!("{other}"),
    }
    let allowed = b
        .host
        .pm
        .install(
            &older.archive,
            InstallOptions {
                allow_downgrade: true,
                ..InstallOptions::default()
            },
        )
        .unwrap();
    assert!(allowed.changed && allowed.enabled);
    assert_eq!(allowed.superseded, Some(v("2.0.0")));
    let list = b.host.pm.list().unwrap();
    assert_eq!(list[0].enabled, Some(v("1.5.0")));
    assert_eq!(list[0].previous, Some(v("2.0.0")));
    println!("refusals (versions): {} cases", b.cases);
}

#[test]
fn refusals_while_leased_then_allowed_after_release() {
    let mut b = Bench::new();
    let core1 = b.build(&Spec::module("example.core", "1.0.0"));
    let core2 = b.build(&Spec::module("example.core", "2.0.0"));
    b.install(&core1);
    b.install(&core2);
    let core = id("example.core");

    let lease = b.host.pm.lease(&core).unwrap();
    assert_eq!(lease.package(), &core);
    let leased = |action| Leased {
        id: core.clone(),
        action,
        leases: 1,
        bindings: 0,
    };
    match b.refused("remove while leased", |pm| pm.remove(&core, None)) {
        HostError::Leased(e) => assert_eq!(e, leased(QuiescentAction::Remove)),
        other => panic!("{other}"),
    }
    match b.refused("roll back while leased", |pm| pm.rollback(&core)) {
        HostError::Leased(e) => assert_eq!(e, leased(QuiescentAction::Rollback)),
        other => panic!("{other}"),
    }
    match b.refused("disable while leased", |pm| pm.disable(&core)) {
        HostError::Leased(e) => assert_eq!(e, leased(QuiescentAction::Unload)),
        other => panic!("{other}"),
    }
    let core3 = b.build(&Spec::module("example.core", "3.0.0"));
    match b.refused("replace while leased", |pm| {
        pm.install(&core3.archive, InstallOptions::default())
    }) {
        HostError::Leased(e) => assert_eq!(e, leased(QuiescentAction::Replace)),
        other => panic!("{other}"),
    }
    // A second lease counts too.
    let second = b.host.pm.lease(&core).unwrap();
    match b.refused("roll back while leased twice", |pm| pm.rollback(&core)) {
        HostError::Leased(e) => assert_eq!(e.leases, 2),
        other => panic!("{other}"),
    }
    drop(second);
    drop(lease);
    assert_eq!(b.host.pm.active_package_leases(&core).total(), 0);

    let rolled = b.host.pm.rollback(&core).unwrap();
    assert_eq!(rolled.to, v("1.0.0"));
    assert_eq!(b.host.pm.remove(&core, None).unwrap(), v("1.0.0"));
    let list = b.host.pm.list().unwrap();
    let states: Vec<(String, State)> = list[0]
        .versions
        .iter()
        .map(|s| (s.version.to_string(), s.state))
        .collect();
    assert_eq!(
        states,
        [
            ("1.0.0".to_owned(), State::Removed),
            ("2.0.0".to_owned(), State::Superseded)
        ]
    );
    println!("refusals (leases): {} cases", b.cases);
}

/// Installs `built`, which the dependency graph must refuse with exactly `problem`, naming both
/// ends in its message.
fn check(b: &mut Bench, label: &str, built: &Built, problem: GraphProblem) {
    let err = b.refused(label, |pm| {
        pm.install(&built.archive, InstallOptions::default())
    });
    let text = err.to_string();
    assert!(
        text.contains("example.app@1.0.0") && text.contains("example.core"),
        "{label}: {text}"
    );
    match err {
        HostError::Dependencies { action, problems } => {
            assert_eq!(action, "installing example.app@1.0.0", "{label}");
            assert_eq!(problems, vec![problem], "{label}");
        }
        other => panic!("{label}: {other}"),
    }
}

#[test]
fn refusals_of_installs_whose_module_dependency_fails_name_both_ends() {
    let mut b = Bench::new();
    let core = b.build(&Spec::module("example.core", "1.0.0"));
    let other = b.build(&Spec::module("example.other", "1.0.0"));
    let app = |dep: ModDep| b.build(&Spec::module("example.app", "1.0.0").module_dep(dep));
    let missing = app(ModDep::on("example.core", "1.0.0"));
    let out_of_range = app(ModDep::on("example.core", "2.0.0"));
    let other_publisher = app(ModDep::on("example.core", "1.0.0").publisher("org.other"));
    let other_digest = app(ModDep::on("example.core", "1.0.0").sha256(other.digest()));
    let app_node = NodeRef {
        id: id("example.app"),
        version: v("1.0.0"),
    };
    let target = node(&core);

    check(
        &mut b,
        "a missing module",
        &missing,
        GraphProblem::Missing {
            dependent: app_node.clone(),
            target: id("example.core"),
            requirement: module_requirement(&missing, 0),
        },
    );

    b.install(&core);
    b.install(&other);
    b.host.pm.disable(&id("example.core")).unwrap();
    check(
        &mut b,
        "a disabled module",
        &missing,
        GraphProblem::Disabled {
            dependent: app_node.clone(),
            target: id("example.core"),
            requirement: module_requirement(&missing, 0),
            installed: vec![v("1.0.0")],
        },
    );
    b.host.pm.enable(&id("example.core")).unwrap();
    check(
        &mut b,
        "a module out of range",
        &out_of_range,
        GraphProblem::VersionOutOfRange {
            dependent: app_node.clone(),
            target: target.clone(),
            requirement: module_requirement(&out_of_range, 0),
        },
    );
    check(
        &mut b,
        "a module pinned to another publisher",
        &other_publisher,
        GraphProblem::PublisherMismatch {
            dependent: app_node.clone(),
            target: target.clone(),
            requirement: module_requirement(&other_publisher, 0),
            expected: publisher("org.other"),
            found: publisher(PUBLISHER),
        },
    );
    check(
        &mut b,
        "a module pinned to another payload",
        &other_digest,
        GraphProblem::DigestMismatch {
            dependent: app_node,
            target,
            requirement: module_requirement(&other_digest, 0),
            expected: other.digest(),
            found: core.digest(),
        },
    );
    // The unpinned, in-range dependent installs.
    assert!(
        b.host
            .pm
            .install(&missing.archive, InstallOptions::default())
            .unwrap()
            .changed
    );
    println!("refusals (module dependencies): {} cases", b.cases);
}

/// A store with one package installed and trusted, closed; answers its root.
fn closed_store(dir: &Scratch) -> PathBuf {
    let shop = Workshop::new();
    let root = dir.path().join("store");
    let key = key();
    let built = shop.build(&Spec::module("example.core", "1.0.0"), &key);
    let host = open_host(&root, None).unwrap();
    trust(&host.pm, PUBLISHER, &key);
    host.pm
        .install(&built.archive, InstallOptions::default())
        .unwrap();
    root
}

/// Turns a valid registry file's bytes into corrupt ones.
type Corruption = fn(&[u8]) -> Vec<u8>;

/// Whether a trust-file error is the one a case expects.
type TrustCheck = fn(&TrustFileError) -> bool;

#[test]
fn refusals_to_open_a_store_with_a_corrupt_registry_or_trust_file() {
    let mut cases = 0;
    let registry_cases: [(&str, Corruption); 4] = [
        ("garbage", |_| b"\x00\x01 not json".to_vec()),
        ("truncated", |ok| ok[..ok.len() / 2].to_vec()),
        ("empty", |_| Vec::new()),
        ("an unknown field", |ok| {
            let text = String::from_utf8(ok.to_vec()).unwrap();
            text.replacen('{', "{\"extra\": 1, ", 1).into_bytes()
        }),
    ];
    for (label, corrupt) in registry_cases {
        let dir = Scratch::new();
        let root = closed_store(&dir);
        let path = root.join("registry.json");
        let bytes = corrupt(&fs::read(&path).unwrap());
        fs::write(&path, &bytes).unwrap();
        let before = disk(&root);
        let err = open_dir(&root).unwrap_err();
        match &err {
            HostError::Store(e) => {
                assert_eq!(e.kind, StoreErrorKind::Corrupt, "{label}: {e}");
                assert_eq!(e.path.as_deref(), Some(path.as_path()), "{label}");
            }
            other => panic!("registry {label}: {other}"),
        }
        assert_eq!(err.category(), ErrorCategory::Store);
        // Failing closed: the bad file is left for the operator, not replaced by an empty store.
        assert_eq!(disk(&root), before, "registry {label}");
        cases += 1;
    }

    let trust_cases: [(&str, &[u8], TrustCheck); 5] = [
        ("garbage", b"\xff\xfe garbage", |e| {
            matches!(e, TrustFileError::Json(_))
        }),
        (
            "truncated",
            b"{\"trust_format\": 1, \"publishers\": {",
            |e| matches!(e, TrustFileError::Json(_)),
        ),
        ("empty", b"", |e| matches!(e, TrustFileError::Json(_))),
        (
            "an unknown field",
            b"{\"trust_format\": 1, \"publishers\": {}, \"revoked_keys\": [], \
              \"revoked_digests\": [], \"allow_unsigned\": true}",
            |e| {
                *e == TrustFileError::Field {
                    path: "$.allow_unsigned".into(),
                    problem: "unknown field".into(),
                }
            },
        ),
        (
            "a future format",
            b"{\"trust_format\": 2, \"publishers\": {}, \"revoked_keys\": [], \
              \"revoked_digests\": []}",
            |e| *e == TrustFileError::UnknownFormat { found: "2".into() },
        ),
    ];
    for (label, bytes, expected) in trust_cases {
        let dir = Scratch::new();
        let root = closed_store(&dir);
        fs::write(root.join("trust"), bytes).unwrap();
        let before = disk(&root);
        let err = open_dir(&root).unwrap_err();
        match &err {
            HostError::TrustFile(e) => assert!(expected(e), "trust {label}: {e:?}"),
            other => panic!("trust {label}: {other}"),
        }
        assert_eq!(err.category(), ErrorCategory::Store);
        assert_eq!(disk(&root), before, "trust {label}");
        cases += 1;
    }
    println!("refusals (corrupt store files): {cases} cases");
}
