//! A store following a fleet through the package service (`guild_host::fleet`): joining pins a
//! root once, a policy applies as one commit (its packages, its trust, its record), and every
//! refusal (a rollback, an expired policy, too few root signatures, a package that is not the
//! one the policy pins, a record that moved since the policy was judged) leaves the store's
//! files exactly as they were. The documents and packages are made with the `guild` binary; the
//! command line over these steps is tested with guild-cli (crates/cli/tests/it/fleet.rs).

use std::fs;
use std::path::Path;

use guild_host::domain::distribution::SyncStep;
use guild_host::domain::fleet::{
    AcceptError, ExpiryRule, PolicyChange, PolicyError, SignedPolicy, SignedRoot,
};
use guild_host::fleet::{self, FleetError, Judged};
use guild_host::lock_sync::{StagedPackage, SyncStaging};
use guild_host::package_manager::{Change, Joined, LifecycleHook};
use guild_host::{HostError, PackageManager};
use guild_test_support::guild::Bench;

use crate::guild;

/// A hook that lets every change through (no registration check: the packages' libraries are
/// never loaded here).
struct Plain;

impl LifecycleHook for Plain {
    fn prepare(&mut self, _: &Change<'_>) -> Result<(), HostError> {
        Ok(())
    }
    fn committed(&mut self) {}
    fn aborted(&mut self) {}
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A bench with root keys `a`, `b`, `c` (threshold 2) in `root.json` signed by `a` and `b`,
/// and the packages `scan` and `norm` signed by the bench's key.
struct Fleet {
    bench: Bench,
    scan: String,
    norm: String,
}

impl Fleet {
    fn new() -> Self {
        let bench = Bench::new(guild());
        for k in ["a", "b", "c"] {
            bench.run(&["keygen", "--out", k]).expect(0);
        }
        bench
            .run(&[
                "fleet",
                "root",
                "new",
                "--fleet",
                "example.prod",
                "--threshold",
                "2",
                "--key",
                "a.pub",
                "--key",
                "b.pub",
                "--key",
                "c.pub",
                "--expires",
                "365d",
                "--out",
                "root.json",
            ])
            .expect(0);
        for k in ["a.key", "b.key"] {
            bench
                .run(&["fleet", "sign", "root.json", "--key", k])
                .expect(0);
        }
        let scan = bench.package("example.scan", "1.0.0", b"scan", "");
        let norm = bench.package("example.norm", "2.1.0", b"norm", "");
        Fleet { bench, scan, norm }
    }

    fn root(&self) -> SignedRoot {
        SignedRoot::parse(&fs::read(self.bench.path().join("root.json")).unwrap()).unwrap()
    }

    /// Policy `version` desiring `packages` (archives in the bench; `drop` ids left out),
    /// expiring at `expires`, signed by `signers`.
    fn policy(
        &self,
        version: &str,
        expires: &str,
        packages: &[&str],
        drop: &[&str],
        signers: &[&str],
    ) -> SignedPolicy {
        let lock = self.bench.lock_of(packages, drop);
        let mut value: serde_json::Value =
            serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
        for p in value["packages"].as_array_mut().unwrap() {
            p["reference"] = "oci://127.0.0.1:9/guild/unused:1".into();
            p["manifest_digest"] = format!("sha256:{}", "7".repeat(64)).into();
        }
        fs::write(&lock, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
        let out = format!("policy-{version}-{expires}-{}.json", signers.len());
        self.bench
            .run(&[
                "fleet",
                "policy",
                "new",
                "--fleet",
                "example.prod",
                "--version",
                version,
                "--root-version",
                "1",
                "--expires",
                expires,
                "--from-lock",
                lock.to_str().unwrap(),
                "--publisher",
                "org.example=k.pub",
                "--out",
                &out,
            ])
            .expect(0);
        for k in signers {
            self.bench
                .run(&["fleet", "sign", &out, "--key", k, "--root", "root.json"])
                .expect(0);
        }
        SignedPolicy::parse(&fs::read(self.bench.path().join(&out)).unwrap()).unwrap()
    }

    /// A fresh store joined to the fleet.
    fn member(&self, name: &str) -> std::path::PathBuf {
        let store = self.bench.path().join(name);
        let (pm, _) = PackageManager::open_dir(&store).unwrap();
        let joined = fleet::join(&pm, &self.root(), None, now(), ExpiryRule::Enforce).unwrap();
        assert!(matches!(joined.joined, Joined::Now { .. }));
        store
    }
}

/// Stages every package the judged policy's plan installs from the bench's archives.
fn stage_all(
    pm: &PackageManager,
    judged: &Judged,
    staging: &SyncStaging,
    from: &Path,
) -> Result<Vec<StagedPackage>, FleetError> {
    let mut staged = Vec::new();
    for step in fleet::plan(pm, judged)? {
        let (SyncStep::Install(l) | SyncStep::Reactivate(l)) = step else {
            continue;
        };
        let name = format!("{}-{}.{}", l.id, l.version, l.kind.as_str());
        let file = staging.copy_in(&l, &from.join(name)).unwrap();
        staged.push(fleet::stage(pm, judged, &l, file)?);
    }
    Ok(staged)
}

/// Judges, stages and applies `policy` on `store` at `now`, as `guild fleet sync` does.
fn sync(
    store: &Path,
    from: &Path,
    policy: &SignedPolicy,
    now: u64,
    rule: ExpiryRule,
) -> Result<usize, FleetError> {
    let (pm, _) = PackageManager::open_dir(store).unwrap();
    let judged = fleet::judge(&pm, &[], policy, now, rule)?;
    let staging = SyncStaging::create(store).unwrap();
    let staged = stage_all(&pm, &judged, &staging, from)?;
    Ok(fleet::apply(&pm, &judged, &staged, &mut Plain)?.len())
}

fn enabled(store: &Path) -> Vec<(String, String)> {
    let (pm, _) = PackageManager::open_dir(store).unwrap();
    pm.list()
        .unwrap()
        .into_iter()
        .filter_map(|p| Some((p.id.to_string(), p.enabled?.to_string())))
        .collect()
}

#[test]
fn fleet_join_pins_one_root_and_a_fleet_managed_store_refuses_local_trust() {
    let fx = Fleet::new();
    let store = fx.member("store");
    let before = guild_test_support::disk(&store);
    let (pm, _) = PackageManager::open_dir(&store).unwrap();
    let again = fleet::join(&pm, &fx.root(), None, now(), ExpiryRule::Enforce).unwrap();
    assert_eq!(again.joined, Joined::Already);
    assert_eq!(
        pm.fleet().unwrap().unwrap().root.digest(),
        fx.root().digest()
    );
    let refused = pm.update_trust(|_| Ok(())).unwrap_err();
    assert!(
        matches!(refused, HostError::FleetManaged { .. }),
        "{refused}"
    );
    drop(pm);
    assert_eq!(guild_test_support::disk(&store), before);
}

#[test]
fn fleet_policy_applies_in_one_commit_and_each_refusal_changes_nothing() {
    let fx = Fleet::new();
    let from = fx.bench.path();
    let store = fx.member("store");
    let v1 = fx.policy("1", "30d", &[&fx.scan, &fx.norm], &[], &["a.key", "c.key"]);

    // Signed by one root key where two must sign.
    let short = fx.policy("1", "29d", &[&fx.scan, &fx.norm], &[], &["a.key"]);
    let before = guild_test_support::disk(&store);
    let e = sync(&store, from, &short, now(), ExpiryRule::Enforce).unwrap_err();
    assert!(
        matches!(e, FleetError::Policy(PolicyError::Threshold(_))),
        "{e}"
    );
    assert_eq!(guild_test_support::disk(&store), before);

    // A package that is not the build the policy pins (same id, version and key).
    let other = Bench::new(guild());
    for f in ["k.key", "k.pub"] {
        fs::copy(from.join(f), other.path().join(f)).unwrap();
    }
    let forged = other.package("example.scan", "1.0.0", b"another scan", "");
    let bad = from.join("bad");
    fs::create_dir(&bad).unwrap();
    fs::copy(other.path().join(&forged), bad.join(&fx.scan)).unwrap();
    fs::copy(from.join(&fx.norm), bad.join(&fx.norm)).unwrap();
    let e = sync(&store, &bad, &v1, now(), ExpiryRule::Enforce).unwrap_err();
    assert!(e.to_string().contains("example.scan 1.0.0"), "{e}");
    assert_eq!(guild_test_support::disk(&store), before);

    // The policy applies: both packages, the policy's trust and its record, in one commit.
    let generation = |s: &Path| {
        let (pm, _) = PackageManager::open_dir(s).unwrap();
        pm.generation().unwrap()
    };
    let g0 = generation(&store);
    assert_eq!(
        sync(&store, from, &v1, now(), ExpiryRule::Enforce).unwrap(),
        2
    );
    assert_eq!(generation(&store), g0 + 1);
    assert_eq!(
        enabled(&store),
        [
            ("example.norm".to_owned(), "2.1.0".to_owned()),
            ("example.scan".to_owned(), "1.0.0".to_owned())
        ]
    );
    let (pm, _) = PackageManager::open_dir(&store).unwrap();
    let record = pm.fleet().unwrap().unwrap().policy.unwrap();
    assert_eq!((record.version, record.digest), (1, v1.digest()));
    assert_eq!(pm.trust().unwrap().publishers().count(), 1);
    // Judged again, the same policy is unchanged.
    let judged = fleet::judge(&pm, &[], &v1, now(), ExpiryRule::Enforce).unwrap();
    assert_eq!(judged.acceptance().change, PolicyChange::Unchanged);
    assert!(judged.record_unchanged());
    assert!(fleet::plan(&pm, &judged).unwrap().is_empty());

    // A record that moves between the judgement and the commit refuses the commit.
    let v2 = fx.policy(
        "2",
        "30d",
        &[&fx.scan],
        &["example.norm"],
        &["b.key", "c.key"],
    );
    let stale = fleet::judge(&pm, &[], &v2, now(), ExpiryRule::Enforce).unwrap();
    drop(pm);
    assert_eq!(
        sync(&store, from, &v2, now(), ExpiryRule::Enforce).unwrap(),
        1
    );
    // Opening after a trust change records the recheck of what is enabled; then the snapshot.
    let (pm, _) = PackageManager::open_dir(&store).unwrap();
    let at2 = guild_test_support::disk(&store);
    let e = fleet::apply(&pm, &stale, &[], &mut Plain).unwrap_err();
    assert!(e.to_string().contains("fleet record changed"), "{e}");
    drop(pm);
    assert_eq!(guild_test_support::disk(&store), at2);

    // Version 1 again is a rollback.
    let e = sync(&store, from, &v1, now(), ExpiryRule::Enforce).unwrap_err();
    assert!(
        matches!(
            e,
            FleetError::Accept(AcceptError::Rollback {
                recorded: 2,
                offered: 1
            })
        ),
        "{e}"
    );
    assert_eq!(guild_test_support::disk(&store), at2);
}

#[test]
fn fleet_an_expired_policy_is_refused_keeping_the_state_unless_overridden() {
    let fx = Fleet::new();
    let from = fx.bench.path();
    let store = fx.member("store");
    let v1 = fx.policy("1", "30d", &[&fx.scan], &[], &["a.key", "b.key"]);
    let expires = v1.body().expires;
    let before = guild_test_support::disk(&store);
    let e = sync(&store, from, &v1, expires, ExpiryRule::Enforce).unwrap_err();
    assert!(
        matches!(e, FleetError::Accept(AcceptError::Expired { .. })),
        "{e}"
    );
    assert!(
        e.to_string().contains(&format!("expired at {expires}")),
        "{e}"
    );
    assert_eq!(guild_test_support::disk(&store), before);

    let (pm, _) = PackageManager::open_dir(&store).unwrap();
    let judged = fleet::judge(&pm, &[], &v1, expires + 1, ExpiryRule::Override).unwrap();
    assert!(judged.acceptance().expiry.is_overridden());
    drop(pm);
    assert_eq!(
        sync(&store, from, &v1, expires + 1, ExpiryRule::Override).unwrap(),
        1
    );
    assert_eq!(
        enabled(&store),
        [("example.scan".to_owned(), "1.0.0".to_owned())]
    );
}

/// A publisher key rotated inside a fleet: the publisher re-signs the same build with its new
/// key, and the next policy trusts only the new key and revokes the old one. The store holds
/// the build signed by the old key alone, with the payload the policy pins, so nothing would be
/// installed; applying the policy must fetch the re-signed copy and record its signature in the
/// same commit, or the revocation would take the package out of every machine.
#[test]
fn fleet_key_rotation_records_the_new_signature_and_disables_nothing() {
    let fx = Fleet::new();
    let from = fx.bench.path();
    let store = fx.member("store");
    let v1 = fx.policy("1", "30d", &[&fx.scan], &[], &["a.key", "b.key"]);
    assert_eq!(
        sync(&store, from, &v1, now(), ExpiryRule::Enforce).unwrap(),
        1
    );

    // The same build, signed by the new key n as well: the payload does not change.
    fx.bench.run(&["keygen", "--out", "n"]).expect(0);
    let rotated = from.join("rotated");
    fs::create_dir(&rotated).unwrap();
    let resigned = rotated.join(&fx.scan);
    let signed = fx
        .bench
        .run(&[
            "--json",
            "sign",
            &fx.scan,
            "--key",
            "n.key",
            "--out",
            resigned.to_str().unwrap(),
        ])
        .expect(0)
        .json();
    let new_key = signed["key_id"].as_str().unwrap().to_owned();

    // Policy 2: org.example is the new key only, the old key is revoked, and the entry's build
    // is the re-signed copy (same payload) signed by the new key.
    let lock = fx.bench.lock_of(&[&fx.scan], &[]);
    let mut value: serde_json::Value = serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
    let old_key = value["packages"][0]["key_id"].as_str().unwrap().to_owned();
    assert_ne!(old_key, new_key);
    for p in value["packages"].as_array_mut().unwrap() {
        p["key_id"] = new_key.clone().into();
        p["reference"] = "oci://127.0.0.1:9/guild/unused:1".into();
        p["manifest_digest"] = format!("sha256:{}", "7".repeat(64)).into();
    }
    fs::write(&lock, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
    fx.bench
        .run(&[
            "fleet",
            "policy",
            "new",
            "--fleet",
            "example.prod",
            "--version",
            "2",
            "--root-version",
            "1",
            "--expires",
            "30d",
            "--from-lock",
            lock.to_str().unwrap(),
            "--publisher",
            "org.example=n.pub",
            "--out",
            "policy-2.json",
        ])
        .expect(0);
    let path = from.join("policy-2.json");
    let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    doc["signed"]["revoked_keys"] = serde_json::json!({ old_key.clone(): "rotated" });
    fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    for k in ["a.key", "b.key"] {
        fx.bench
            .run(&[
                "fleet",
                "sign",
                "policy-2.json",
                "--key",
                k,
                "--root",
                "root.json",
            ])
            .expect(0);
    }
    let v2 = SignedPolicy::parse(&fs::read(&path).unwrap()).unwrap();

    // The plan fetches the re-signed copy though the store holds that payload.
    {
        let (pm, _) = PackageManager::open_dir(&store).unwrap();
        let judged = fleet::judge(&pm, &[], &v2, now(), ExpiryRule::Enforce).unwrap();
        let steps = fleet::plan(&pm, &judged).unwrap();
        assert!(
            matches!(&steps[..], [SyncStep::Install(l)] if l.id.as_str() == "example.scan"),
            "{steps:?}"
        );
    }
    let generation = |s: &Path| {
        let (pm, _) = PackageManager::open_dir(s).unwrap();
        pm.generation().unwrap()
    };
    let g1 = generation(&store);
    assert_eq!(
        sync(&store, &rotated, &v2, now(), ExpiryRule::Enforce).unwrap(),
        1
    );
    assert_eq!(generation(&store), g1 + 1, "one commit");

    // Still enabled after the old key's revocation, reopened (which re-checks every enabled
    // version under the new trust), and signed by the new key in the store's record.
    assert_eq!(
        enabled(&store),
        [("example.scan".to_owned(), "1.0.0".to_owned())]
    );
    let (pm, _) = PackageManager::open_dir(&store).unwrap();
    let summary = pm
        .summary(&"example.scan".parse().unwrap())
        .unwrap()
        .unwrap();
    let recorded: Vec<String> = summary.versions[0]
        .signatures_added
        .iter()
        .map(|k| k.to_hex())
        .collect();
    assert_eq!(recorded, [new_key]);
    assert!(pm
        .trust()
        .unwrap()
        .is_key_revoked(&guild_host::domain::ids::Sha256Digest::parse_hex(&old_key).unwrap()));
}
