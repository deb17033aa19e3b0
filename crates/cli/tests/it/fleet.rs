//! `guild fleet`: a root of three keys with a threshold of two, signed by two holders in turn
//! (it verifies after the second signature and not before), a policy made from a lock and
//! signed the same way, and both pushed to and pulled back from a real registry (the one the
//! `oci` tests start; those parts skip as they do when it is not installed).

use std::fs;

use guild_test_support::guild::{Bench, Run};

use crate::guild;
use crate::oci::{fails, locked_store, ok, run, start, Registry};

/// The requests in `registry`'s access log so far, in order, each as `METHOD PATH` (the query
/// left out).
pub(crate) fn requests(registry: &Registry) -> Vec<String> {
    registry
        .access_log()
        .lines()
        .filter(|l| l.contains("HTTP/1.1\""))
        .filter_map(|l| l.split('"').nth(1))
        .map(|r| {
            let mut words = r.split(' ');
            let method = words.next().unwrap_or_default();
            let path = words
                .next()
                .unwrap_or_default()
                .split('?')
                .next()
                .unwrap_or_default();
            format!("{method} {path}")
        })
        .collect()
}

/// Three holders' key pairs, `a`, `b` and `c`, in the bench.
fn holders(bench: &Bench) {
    for k in ["a", "b", "c"] {
        bench.run(&["keygen", "--out", k]).expect(0);
    }
}

/// `guild fleet root new` of the three holders' keys, threshold 2, as `root.json`.
/// `guild fleet root new` for fleet `example.prod` with `threshold` of `keys` (public key files),
/// expiring at `expires`, written to `out`; `more` adds options (`--version`).
fn root_new(
    bench: &Bench,
    threshold: &str,
    keys: &[&str],
    expires: &str,
    out: &str,
    more: &[&str],
) -> Run {
    let mut args = vec![
        "fleet",
        "root",
        "new",
        "--fleet",
        "example.prod",
        "--threshold",
        threshold,
    ];
    for k in keys {
        args.extend(["--key", k]);
    }
    args.extend(["--expires", expires, "--out", out]);
    args.extend(more);
    bench.run(&args)
}

/// The arguments of `guild fleet policy new` for fleet `example.prod`, version 1 under root
/// version 1, expiring in 30 days, its desired set from `source` (`["--from-lock", LOCK]` or
/// `["--requirements", FILE]`), trusting `publisher` (`ID=KEY.pub[,...]`), written to
/// `policy.json`; `more` adds options.
pub(crate) fn policy_new_args<'a>(
    source: [&'a str; 2],
    publisher: &'a str,
    more: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "fleet",
        "policy",
        "new",
        "--fleet",
        "example.prod",
        "--version",
        "1",
        "--root-version",
        "1",
        "--expires",
        "30d",
        source[0],
        source[1],
        "--publisher",
        publisher,
        "--out",
        "policy.json",
    ];
    args.extend(more);
    args
}

/// `guild fleet policy new` (see [`policy_new_args`]) from `lock`.
fn policy_new(bench: &Bench, lock: &str, publisher: &str, more: &[&str]) -> Run {
    bench.run(&policy_new_args(["--from-lock", lock], publisher, more))
}

/// `guild keygen --out NAME`; answers the new key's id.
pub(crate) fn keygen_id(bench: &Bench, name: &str) -> String {
    bench
        .run(&["--json", "keygen", "--out", name])
        .expect(0)
        .json()["key_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn new_root(bench: &Bench) {
    root_new(
        bench,
        "2",
        &["a.pub", "b.pub", "c.pub"],
        "365d",
        "root.json",
        &["--version", "1"],
    )
    .expect(0)
    .stdout_has("2 of 3 keys must sign");
}

#[test]
fn a_root_meets_its_threshold_only_when_two_holders_have_signed() {
    let bench = Bench::new(guild());
    holders(&bench);
    new_root(&bench);
    let unsigned = bench.run(&["fleet", "verify", "root.json"]);
    unsigned.expect(3).stderr_has("0 valid signatures");

    // The first holder signs: one of two.
    let first = bench.run(&["--json", "fleet", "sign", "root.json", "--key", "a.key"]);
    first.expect(0);
    let first = first.json();
    assert_eq!(first["threshold_met"], false);
    assert_eq!(first["valid_keys"].as_array().unwrap().len(), 1);
    let a = first["key_id"].as_str().unwrap().to_owned();
    bench
        .run(&["fleet", "verify", "root.json"])
        .expect(3)
        .stderr_has("1 valid signatures")
        .stderr_has(&format!("signed validly by: {}", &a[..16]));

    // Signing again with the same key changes nothing (signatures are deterministic).
    let before = fs::read(bench.path().join("root.json")).unwrap();
    bench
        .run(&["fleet", "sign", "root.json", "--key", "a.key"])
        .expect(0);
    assert_eq!(fs::read(bench.path().join("root.json")).unwrap(), before);

    // A key outside the root is added but never counted.
    bench.run(&["keygen", "--out", "outsider"]).expect(0);
    bench
        .run(&["fleet", "sign", "root.json", "--key", "outsider.key"])
        .expect(0)
        .stdout_has("not one of the root's keys");
    bench.run(&["fleet", "verify", "root.json"]).expect(3);

    // The second holder signs: the threshold is met, and the digest never moved.
    let second = bench.run(&["--json", "fleet", "sign", "root.json", "--key", "b.key"]);
    second.expect(0);
    let second = second.json();
    assert_eq!(second["threshold_met"], true);
    assert_eq!(second["digest"], first["digest"]);
    let verified = bench.run(&["--json", "fleet", "verify", "root.json"]);
    verified.expect(0);
    let verified = verified.json();
    assert_eq!(verified["threshold_met"], true);
    let valid: Vec<&str> = verified["valid_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(valid.contains(&a.as_str()), "{valid:?}");
    assert_eq!(valid.len(), 2);
}

#[test]
fn fleet_errors_name_the_file_and_what_failed() {
    let bench = Bench::new(guild());
    holders(&bench);
    bench
        .run(&["fleet", "verify", "missing.json"])
        .expect(6)
        .stderr_has("missing.json");
    fs::write(bench.path().join("junk.json"), b"{\"signed\": {}}").unwrap();
    bench
        .run(&["fleet", "verify", "junk.json"])
        .expect(3)
        .stderr_has("junk.json: not a fleet document");
    // A threshold above the number of keys is the author's mistake.
    root_new(&bench, "3", &["a.pub", "b.pub"], "30d", "root.json", &[])
        .expect(2)
        .stderr_has("threshold");
    // An expiry in the past is refused before anything is written.
    root_new(&bench, "1", &["a.pub"], "1000", "root.json", &[])
        .expect(2)
        .stderr_has("not in the future");
    assert!(!bench.path().join("root.json").exists());
    // `--out -` writes the document on standard output.
    let out = root_new(&bench, "1", &["a.pub"], "30d", "-", &[]);
    out.expect(0).stdout_has("\"guild_fleet_root\": 1");
    // A policy is verified under a root.
    new_root(&bench);
    let lock = bench.lock_of(&[&bench.package("example.scan", "1.0.0", b"scan", "")], &[]);
    // A lock without registry sources cannot be a desired set.
    policy_new(&bench, lock.to_str().unwrap(), "org.example=k.pub", &[])
        .expect(3)
        .stderr_has("example.scan 1.0.0 has no registry source");
}

#[test]
fn a_policy_from_a_lock_is_signed_in_turn_pushed_and_pulled_back() {
    let Some((registry, bench)) =
        start("a_policy_from_a_lock_is_signed_in_turn_pushed_and_pulled_back")
    else {
        return;
    };
    holders(&bench);
    new_root(&bench);
    for k in ["a.key", "c.key"] {
        bench
            .run(&["fleet", "sign", "root.json", "--key", k])
            .expect(0);
    }
    bench.run(&["fleet", "verify", "root.json"]).expect(0);
    let (_origin, lock) = locked_store(&bench, &registry);
    let lock = lock.to_str().unwrap();

    // A publisher that does not cover the lock's packages is refused.
    bench.run(&["keygen", "--out", "other"]).expect(0);
    let policy_new =
        |publisher: &str, scope: &str| policy_new(&bench, lock, publisher, &["--scope", scope]);
    policy_new("org.example=other.pub", "org.example=example")
        .expect(4)
        .stderr_has("contradict itself");
    policy_new("org.example=k.pub", "org.example=elsewhere").expect(4);
    policy_new("org.example=k.pub,other.pub", "org.example=example")
        .expect(0)
        .stdout_has("2 desired package(s)");
    let policy: serde_json::Value =
        serde_json::from_slice(&fs::read(bench.path().join("policy.json")).unwrap()).unwrap();
    let packages = policy["signed"]["packages"].as_array().unwrap();
    assert_eq!(packages.len(), 2);
    assert!(packages.iter().all(|p| p["source"]["reference"]
        .as_str()
        .unwrap()
        .starts_with("oci://")));

    // Without the root, a policy's signatures cannot be judged.
    bench
        .run(&["fleet", "verify", "policy.json"])
        .expect(2)
        .stderr_has("--root");
    bench
        .run(&[
            "fleet",
            "sign",
            "policy.json",
            "--key",
            "b.key",
            "--root",
            "root.json",
        ])
        .expect(0)
        .stdout_has("threshold not met");
    bench
        .run(&["fleet", "verify", "policy.json", "--root", "root.json"])
        .expect(3)
        .stderr_has("1 valid signatures");
    bench
        .run(&[
            "fleet",
            "sign",
            "policy.json",
            "--key",
            "c.key",
            "--root",
            "root.json",
        ])
        .expect(0)
        .stdout_has("threshold met");
    bench
        .run(&["fleet", "verify", "policy.json", "--root", "root.json"])
        .expect(0);

    // Both travel through the registry and come back byte for byte.
    let store = bench.store();
    for (file, tag) in [
        ("root.json", "fleet/root:prod"),
        ("policy.json", "fleet/policy:prod"),
    ] {
        let pushed = ok(run(
            &bench,
            &store,
            None,
            &["--json", "fleet", "push", file, &registry.reference(tag)],
        ))
        .json();
        let digest = pushed["manifest_digest"].as_str().unwrap().to_owned();
        let back = format!("pulled-{file}");
        let pulled = ok(run(
            &bench,
            &store,
            None,
            &[
                "--json",
                "fleet",
                "pull",
                &registry.reference(tag),
                "--out",
                &back,
            ],
        ))
        .json();
        assert_eq!(pulled["manifest_digest"].as_str().unwrap(), digest);
        assert_eq!(
            fs::read(bench.path().join(&back)).unwrap(),
            fs::read(bench.path().join(file)).unwrap(),
            "{file}"
        );
        // And by the manifest's digest.
        let at_digest = registry.reference(&format!("{}@{digest}", tag.split(':').next().unwrap()));
        ok(run(
            &bench,
            &store,
            None,
            &[
                "fleet",
                "pull",
                &at_digest,
                "--out",
                &format!("by-digest-{file}"),
            ],
        ));
    }
    bench
        .run(&[
            "fleet",
            "verify",
            "pulled-policy.json",
            "--root",
            "pulled-root.json",
        ])
        .expect(0);

    // A package artifact is no fleet document: refused before its layer is fetched.
    fails(
        run(
            &bench,
            &store,
            None,
            &[
                "fleet",
                "pull",
                &registry.reference("guild/scan:1.0.0"),
                "--out",
                "x.json",
            ],
        ),
        3,
        "media type",
    );
    assert!(!bench.path().join("x.json").exists());
}

#[test]
fn a_rotated_root_verifies_as_the_next_one_under_the_root_before_it() {
    let bench = Bench::new(guild());
    holders(&bench);
    bench.run(&["keygen", "--out", "d"]).expect(0);
    new_root(&bench);
    for k in ["a.key", "b.key"] {
        bench
            .run(&["fleet", "sign", "root.json", "--key", k])
            .expect(0);
    }
    // Version 2 drops a and adds d.
    root_new(
        &bench,
        "2",
        &["b.pub", "c.pub", "d.pub"],
        "365d",
        "root2.json",
        &["--version", "2"],
    )
    .expect(0);
    // c and d are two of its own keys but only one of the old root's: not yet a rotation.
    for k in ["c.key", "d.key"] {
        bench
            .run(&["fleet", "sign", "root2.json", "--key", k])
            .expect(0);
    }
    bench.run(&["fleet", "verify", "root2.json"]).expect(0);
    bench
        .run(&["fleet", "verify", "root2.json", "--root", "root.json"])
        .expect(3)
        .stderr_has("root2.json");
    // b signs too: two of the old root's keys (b, c) and of its own.
    bench
        .run(&["fleet", "sign", "root2.json", "--key", "b.key"])
        .expect(0);
    bench
        .run(&["fleet", "verify", "root2.json", "--root", "root.json"])
        .expect(0)
        .stdout_has("the next root after root version 1");
}

// ---- A store that joins a fleet and follows its policy (`guild fleet join`, `fleet sync`). ----

/// The root of the three holders, threshold 2, signed by `a` and `b`, as `root.json`.
pub(crate) fn signed_root(bench: &Bench) {
    holders(bench);
    new_root(bench);
    for k in ["a.key", "b.key"] {
        bench
            .run(&["fleet", "sign", "root.json", "--key", k])
            .expect(0);
    }
}

/// A lock (`guild.lock`) of `packages` (archives in the bench; the ids in `drop` left out)
/// whose entries name registry sources that are never reached: the packages come from a mirror
/// directory.
fn lock_with_sources(bench: &Bench, packages: &[&str], drop: &[&str]) -> String {
    let lock = bench.lock_of(packages, drop);
    let mut value: serde_json::Value = serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
    for p in value["packages"].as_array_mut().unwrap() {
        let name = p["id"]
            .as_str()
            .unwrap()
            .rsplit('.')
            .next()
            .unwrap()
            .to_owned();
        let version = p["version"].as_str().unwrap().to_owned();
        p["reference"] = format!("oci://127.0.0.1:9/guild/{name}:{version}").into();
        p["manifest_digest"] = format!("sha256:{}", "7".repeat(64)).into();
    }
    fs::write(&lock, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
    lock.to_str().unwrap().to_owned()
}

/// `guild fleet policy new` version `version` expiring at `expires`, from `lock`, trusting the
/// bench's key for `org.example`, written to `out` and signed by each of `signers`.
fn policy(bench: &Bench, version: &str, expires: &str, lock: &str, out: &str, signers: &[&str]) {
    policy_with(bench, (version, expires), lock, out, signers, &[]);
}

/// [`policy`] with `more` options for `guild fleet policy new`.
pub(crate) fn policy_with(
    bench: &Bench,
    (version, expires): (&str, &str),
    lock: &str,
    out: &str,
    signers: &[&str],
    more: &[&str],
) {
    let mut args = vec![
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
        lock,
        "--publisher",
        "org.example=k.pub",
        "--out",
        out,
    ];
    args.extend(more);
    bench.run(&args).expect(0);
    for k in signers {
        bench
            .run(&["fleet", "sign", out, "--key", k, "--root", "root.json"])
            .expect(0);
    }
}

/// A mirror directory `name` holding `policy` as policy.json, the root, and `archives`.
fn mirror(bench: &Bench, name: &str, policy: &str, archives: &[&str]) -> String {
    let dir = bench.path().join(name);
    fs::create_dir_all(&dir).unwrap();
    fs::copy(bench.path().join(policy), dir.join("policy.json")).unwrap();
    fs::copy(bench.path().join("root.json"), dir.join("root.json")).unwrap();
    for a in archives {
        fs::copy(bench.path().join(a), dir.join(a)).unwrap();
    }
    name.to_owned()
}

fn enabled(bench: &Bench) -> Vec<(String, String)> {
    let out = bench.run(&["--json", "list"]).expect(0).json();
    out["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            Some((
                p["id"].as_str()?.to_owned(),
                p["enabled"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[test]
fn fleet_join_pins_the_root_once_refuses_another_and_takes_the_stores_trust() {
    let bench = Bench::new(guild());
    signed_root(&bench);
    let digest = bench
        .run(&["--json", "fleet", "verify", "root.json"])
        .expect(0)
        .json()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    // A digest handed over out of band that is not this root's: refused, nothing recorded.
    bench
        .run(&["fleet", "join", "root.json", "--digest", &"0".repeat(64)])
        .expect(3)
        .stderr_has("not the pinned");
    bench
        .run(&["trust", "add", "org.example", "k.pub"])
        .expect(0);

    let joined = bench.run(&["--json", "fleet", "join", "root.json", "--digest", &digest]);
    joined.expect(0);
    let joined = joined.json();
    assert_eq!(joined["joined"], true);
    assert_eq!(joined["root_digest"], digest.as_str());

    // Again with the same root: nothing changes.
    let before = guild_test_support::disk(&bench.store());
    bench
        .run(&["fleet", "join", "root.json"])
        .expect(0)
        .stdout_has("already follows fleet example.prod");
    assert_eq!(guild_test_support::disk(&bench.store()), before);

    // Another fleet's root is refused.
    bench
        .run(&[
            "fleet",
            "root",
            "new",
            "--fleet",
            "example.other",
            "--threshold",
            "1",
            "--key",
            "a.pub",
            "--expires",
            "30d",
            "--out",
            "other.json",
        ])
        .expect(0);
    bench
        .run(&["fleet", "sign", "other.json", "--key", "a.key"])
        .expect(0);
    bench
        .run(&["fleet", "join", "other.json"])
        .expect(4)
        .stderr_has("follows fleet example.prod; it cannot join fleet example.other");
    // The policy owns the trust now: local changes are refused and change nothing.
    bench
        .run(&["trust", "add", "org.example", "a.pub"])
        .expect(4)
        .stderr_has("fleet example.prod, whose signed policy owns its trust");
    let list = bench.run(&["--json", "trust", "list"]).expect(0).json();
    bench
        .run(&["trust", "revoke-key", &"1".repeat(64)])
        .expect(4);
    assert_eq!(
        bench.run(&["--json", "trust", "list"]).expect(0).json(),
        list
    );
    assert_eq!(guild_test_support::disk(&bench.store()), before);
}

#[test]
fn fleet_sync_applies_a_policy_in_one_transaction_and_every_refusal_changes_nothing() {
    let bench = Bench::new(guild());
    signed_root(&bench);
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let norm = bench.package("example.norm", "2.1.0", b"norm", "");
    let lock = lock_with_sources(&bench, &[&scan, &norm], &[]);
    policy(
        &bench,
        "1",
        "30d",
        &lock,
        "policy1.json",
        &["a.key", "c.key"],
    );
    let m1 = mirror(&bench, "m1", "policy1.json", &[&scan, &norm]);

    // Not joined yet: there is no root to verify the policy with.
    bench
        .run(&["fleet", "sync", "--policy", &m1])
        .expect(4)
        .stderr_has("follows no fleet");
    bench.run(&["fleet", "join", "root.json"]).expect(0);

    // Signed by one root key of the two needed: refused, nothing changes.
    policy(&bench, "1", "30d", &lock, "short.json", &["a.key"]);
    let short = mirror(&bench, "short", "short.json", &[&scan, &norm]);
    let before = guild_test_support::disk(&bench.store());
    bench
        .run(&["fleet", "sync", "--policy", &short])
        .expect(3)
        .stderr_has("1 valid signatures");
    assert_eq!(guild_test_support::disk(&bench.store()), before);

    // A mirror whose package is another build than the one the policy pins: refused.
    let rebuilt_dir = bench.path().join("rebuilt");
    fs::create_dir_all(&rebuilt_dir).unwrap();
    let other = Bench::new(guild());
    fs::copy(bench.path().join("k.key"), other.path().join("k.key")).unwrap();
    fs::copy(bench.path().join("k.pub"), other.path().join("k.pub")).unwrap();
    let forged = other.package("example.scan", "1.0.0", b"another scan", "");
    let bad = mirror(&bench, "bad", "policy1.json", &[&norm]);
    fs::copy(
        other.path().join(&forged),
        bench.path().join(&bad).join(&scan),
    )
    .unwrap();
    bench
        .run(&["fleet", "sync", "--policy", &bad])
        .expect(3)
        .stderr_has("example.scan 1.0.0");
    assert_eq!(guild_test_support::disk(&bench.store()), before);

    // The policy applies: its trust, its record and its packages, one commit.
    let generation = |b: &Bench| b.run(&["--json", "status"]).json()["generation"].clone();
    let g0 = generation(&bench);
    let applied = bench.run(&["--json", "fleet", "sync", "--policy", &m1]);
    applied.expect(0);
    let applied = applied.json();
    assert_eq!(applied["outcome"], "applied");
    assert_eq!(applied["policy_version"], 1);
    assert_eq!(applied["changes"].as_array().unwrap().len(), 2);
    assert_eq!(
        generation(&bench).as_u64().unwrap(),
        g0.as_u64().unwrap() + 1,
        "one commit"
    );
    assert_eq!(
        enabled(&bench),
        [
            ("example.norm".to_owned(), "2.1.0".to_owned()),
            ("example.scan".to_owned(), "1.0.0".to_owned())
        ]
    );
    let trust = bench.run(&["--json", "trust", "list"]).expect(0).json();
    assert!(trust.to_string().contains("org.example"), "{trust}");

    // The same policy again: unchanged, and no file of the store moves.
    let synced = guild_test_support::disk(&bench.store());
    bench
        .run(&["fleet", "sync", "--policy", &m1])
        .expect(0)
        .stdout_has("unchanged");
    assert_eq!(guild_test_support::disk(&bench.store()), synced);

    // Version 2 desires scan alone: norm is disabled in the same commit.
    let lock2 = lock_with_sources(&bench, &[&scan], &["example.norm"]);
    policy(
        &bench,
        "2",
        "30d",
        &lock2,
        "policy2.json",
        &["b.key", "c.key"],
    );
    let m2 = mirror(&bench, "m2", "policy2.json", &[&scan]);
    bench
        .run(&["fleet", "sync", "--policy", &m2])
        .expect(0)
        .stdout_has("disabled example.norm 2.1.0");
    assert_eq!(
        enabled(&bench),
        [("example.scan".to_owned(), "1.0.0".to_owned())]
    );

    // Back to version 1: a rollback, refused, nothing changes.
    let at2 = guild_test_support::disk(&bench.store());
    bench
        .run(&["fleet", "sync", "--policy", &m1])
        .expect(4)
        .stderr_has("older than version 2");
    assert_eq!(guild_test_support::disk(&bench.store()), at2);
    // Another document under version 2 (another expiry): refused too.
    policy(
        &bench,
        "2",
        "29d",
        &lock2,
        "forked.json",
        &["a.key", "b.key"],
    );
    let forked = mirror(&bench, "forked", "forked.json", &[&scan]);
    bench
        .run(&["fleet", "sync", "--policy", &forked])
        .expect(4)
        .stderr_has("one version must name one policy");
    assert_eq!(guild_test_support::disk(&bench.store()), at2);
}

#[test]
fn fleet_an_expired_policy_keeps_the_last_state_until_an_operator_overrides_it_loudly() {
    let bench = Bench::new(guild());
    signed_root(&bench);
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = lock_with_sources(&bench, &[&scan], &[]);
    policy(&bench, "1", "2s", &lock, "policy.json", &["a.key", "b.key"]);
    let m = mirror(&bench, "m", "policy.json", &[&scan]);
    bench.run(&["fleet", "join", "root.json"]).expect(0);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let before = guild_test_support::disk(&bench.store());
    bench
        .run(&["fleet", "sync", "--policy", &m])
        .expect(4)
        .stderr_has("fleet policy version 1 expired at")
        .stderr_has("keeping the last state")
        .stderr_has("--allow-expired");
    assert_eq!(guild_test_support::disk(&bench.store()), before);
    assert!(enabled(&bench).is_empty());

    let overridden = bench.run(&["fleet", "sync", "--policy", &m, "--allow-expired"]);
    overridden
        .expect(0)
        .stderr_has("OVERRIDE: the fleet policy version 1 expired at")
        .stdout_has("applied");
    assert_eq!(
        enabled(&bench),
        [("example.scan".to_owned(), "1.0.0".to_owned())]
    );
    let json = bench.run(&["--json", "fleet", "sync", "--policy", &m, "--allow-expired"]);
    json.expect(0);
    assert_eq!(json.json()["expiry_overridden"], true);
    // The store says, at every status, that it runs on an expired policy.
    bench
        .run(&["status"])
        .expect(0)
        .stdout_has("fleet: example.prod (root version 1), policy version 1")
        .stderr_has("the fleet policy version 1 expired at");
}

#[test]
fn fleet_sync_follow_polls_applies_once_then_reports_unchanged() {
    let bench = Bench::new(guild());
    signed_root(&bench);
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = lock_with_sources(&bench, &[&scan], &[]);
    policy(
        &bench,
        "1",
        "30d",
        &lock,
        "policy.json",
        &["a.key", "b.key"],
    );
    let m = mirror(&bench, "m", "policy.json", &[&scan]);
    bench.run(&["fleet", "join", "root.json"]).expect(0);
    let started = std::time::Instant::now();
    bench
        .run(&[
            "fleet",
            "sync",
            "--policy",
            &m,
            "--follow",
            "--interval",
            "1",
            "--rounds",
            "3",
        ])
        .expect(0)
        .stdout_has("applied: the store follows fleet example.prod policy version 1")
        .stdout_has("unchanged: the store follows fleet policy version 1");
    // Two waits of one second, each jittered by at most 20%.
    let took = started.elapsed().as_secs_f64();
    assert!(took >= 1.6, "{took}");
    // A missing mirror is a failure to fetch: printed, and the loop goes on.
    bench
        .run(&[
            "fleet",
            "sync",
            "--policy",
            "nowhere.json",
            "--follow",
            "--interval",
            "1",
            "--rounds",
            "2",
        ])
        .expect(0)
        .stderr_has("nowhere.json");
}

#[test]
fn fleet_a_store_joins_and_follows_a_policy_through_a_registry() {
    let Some(registry) =
        Registry::start_logged("fleet_a_store_joins_and_follows_a_policy_through_a_registry")
    else {
        return;
    };
    let bench = Bench::new(guild());
    signed_root(&bench);
    let (_origin, lock) = locked_store(&bench, &registry);
    policy(
        &bench,
        "1",
        "30d",
        lock.to_str().unwrap(),
        "policy.json",
        &["b.key", "c.key"],
    );
    let store = bench.path().join("member");
    let root_tag = registry.reference("fleet/root:prod");
    let policy_tag = registry.reference("fleet/policy:prod");
    ok(run(
        &bench,
        &store,
        None,
        &["fleet", "push", "root.json", &root_tag],
    ));
    ok(run(
        &bench,
        &store,
        None,
        &["fleet", "push", "policy.json", &policy_tag],
    ));

    ok(run(&bench, &store, None, &["fleet", "join", &root_tag]))
        .stdout_has("joined fleet example.prod");
    let applied = ok(run(
        &bench,
        &store,
        None,
        &["--json", "fleet", "sync", "--policy", &policy_tag],
    ))
    .json();
    assert_eq!(applied["outcome"], "applied");
    assert_eq!(applied["changes"].as_array().unwrap().len(), 2);
    ok(run(
        &bench,
        &store,
        None,
        &["fleet", "sync", "--policy", &policy_tag],
    ))
    .stdout_has("unchanged");
    // Following: the first poll authenticates and fetches the policy; each poll after it asks
    // for the tag's manifest alone, on the session the first one opened, and reads the policy
    // it already holds; still unchanged.
    let seen = requests(&registry).len();
    ok(run(
        &bench,
        &store,
        None,
        &[
            "fleet",
            "sync",
            "--policy",
            &policy_tag,
            "--follow",
            "--interval",
            "1",
            "--rounds",
            "4",
        ],
    ))
    .stdout_has("unchanged");
    let manifest = "GET /v2/fleet/policy/manifests/prod".to_owned();
    let polled = requests(&registry)[seen..].to_vec();
    assert_eq!(polled.len(), 3 + 3, "{polled:#?}");
    assert_eq!(
        polled[..2],
        ["GET /v2/".to_owned(), manifest.clone()],
        "{polled:#?}"
    );
    assert!(
        polled[2].starts_with("GET /v2/fleet/policy/blobs/sha256:"),
        "{polled:#?}"
    );
    assert_eq!(
        polled[3..],
        [manifest.clone(), manifest.clone(), manifest],
        "{polled:#?}"
    );

    // With the registry unreachable the store keeps its state and says why.
    let before = guild_test_support::disk(&store);
    drop(registry);
    fails(
        run(
            &bench,
            &store,
            None,
            &["fleet", "sync", "--policy", &policy_tag],
        ),
        7,
        "cannot fetch the fleet policy",
    );
    assert_eq!(guild_test_support::disk(&store), before);
}

/// Revocations are written with `--revoke-key` / `--revoke-package`, and `--previous` carries
/// the policy before's into the next one, so that a machine that skips a policy still learns
/// what it revoked; a previous policy of another version order is refused.
#[test]
fn fleet_policy_new_writes_revocations_and_carries_the_previous_ones_forward() {
    let bench = Bench::new(guild());
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = lock_with_sources(&bench, &[&scan], &[]);
    let old_key = bench
        .run(&["--json", "keygen", "--out", "gone"])
        .expect(0)
        .json()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let bad_build = "ab".repeat(32);
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&fs::read(bench.path().join(name)).unwrap()).unwrap()
    };
    let new_policy = |version: &str, out: &str, more: &[&str]| {
        let mut args = vec![
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
            "30d",
            "--from-lock",
            &lock,
            "--publisher",
            "org.example=k.pub",
            "--out",
            out,
        ];
        args.extend(more);
        bench.run(&args)
    };

    let revoke_key = format!("{old_key}=leaked");
    let revoke_build = format!("sha256:{bad_build}");
    new_policy(
        "1",
        "p1.json",
        &[
            "--revoke-key",
            &revoke_key,
            "--revoke-package",
            &revoke_build,
        ],
    )
    .expect(0);
    let p1 = read("p1.json");
    assert_eq!(p1["signed"]["revoked_keys"][&old_key], "leaked");
    assert_eq!(
        p1["signed"]["revoked_digests"][&bad_build],
        "revoked by the fleet"
    );

    // The next policy names no revocation itself, yet carries both.
    new_policy("2", "p2.json", &["--previous", "p1.json"]).expect(0);
    let p2 = read("p2.json");
    assert_eq!(p2["signed"]["revoked_keys"], p1["signed"]["revoked_keys"]);
    assert_eq!(
        p2["signed"]["revoked_digests"],
        p1["signed"]["revoked_digests"]
    );

    // A "previous" policy that is not older is refused, and nothing is written.
    new_policy("2", "p2-again.json", &["--previous", "p2.json"])
        .expect(4)
        .stderr_has("at a higher version");
    assert!(!bench.path().join("p2-again.json").exists());
    // Not a key id.
    new_policy("3", "p3.json", &["--revoke-key", "nothex"]).expect(2);
}

/// `--entry-keys publisher` writes, for each entry of a lock, every unrevoked key given for its
/// publisher instead of the lock's one key: a rotation's policy needs no edited lock. The
/// default stays the lock's key.
#[test]
fn fleet_policy_new_from_a_lock_allows_every_publisher_key_with_entry_keys_publisher() {
    let bench = Bench::new(guild());
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = lock_with_sources(&bench, &[&scan], &[]);
    let locked: serde_json::Value =
        serde_json::from_slice(&fs::read(bench.path().join(&lock)).unwrap()).unwrap();
    let k = locked["packages"][0]["key_id"].as_str().unwrap().to_owned();
    let (k2, k3) = (keygen_id(&bench, "k2"), keygen_id(&bench, "k3"));
    let key_ids = |publisher: &str, more: &[&str]| {
        let run = policy_new(&bench, &lock, publisher, more);
        run.expect(0);
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(bench.path().join("policy.json")).unwrap()).unwrap();
        (doc["signed"]["packages"][0]["key_ids"].clone(), run)
    };
    let all = "org.example=k.pub,k2.pub,k3.pub";
    assert_eq!(key_ids(all, &[]).0, serde_json::json!([k]));
    assert_eq!(
        key_ids(all, &["--entry-keys", "lock"]).0,
        serde_json::json!([k])
    );
    assert_eq!(
        key_ids(all, &["--entry-keys", "publisher"]).0,
        serde_json::json!([k, k2, k3])
    );
    // A revoked key of the publisher allows nothing, so it is left out; the lock's key being
    // the revoked one is the rotation itself, said nothing about.
    let revoke = format!("{k}=rotated");
    let (keys, run) = key_ids(all, &["--entry-keys", "publisher", "--revoke-key", &revoke]);
    assert_eq!(keys, serde_json::json!([k2, k3]));
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    // A lock whose key is not among the publisher's is written, with a warning.
    let (keys, run) = key_ids("org.example=k2.pub", &["--entry-keys", "publisher"]);
    assert_eq!(keys, serde_json::json!([k2]));
    run.stderr_has("is not among the keys allowed for publisher org.example");
    // An unknown choice is a usage error.
    policy_new(&bench, &lock, all, &["--entry-keys", "every"]).expect(2);
}

/// A store in the bench joined to the fleet of [`signed_root`], with policy version 1 desiring
/// `example.scan` 1.0.0 (signed by `a` and `b`) in the mirror directory it answers, `m1`.
fn joined_with_scan(bench: &Bench) -> String {
    signed_root(bench);
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = lock_with_sources(bench, &[&scan], &[]);
    policy(bench, "1", "30d", &lock, "p1.json", &["a.key", "b.key"]);
    let m1 = mirror(bench, "m1", "p1.json", &[&scan]);
    bench.run(&["fleet", "join", "root.json"]).expect(0);
    m1
}

/// `guild trust reset` on a fleet-managed store whose trust file is its own is refused: the
/// fleet's policy is its trust, and a rebuild would only drop the policy's keys (and disable
/// what they sign) until the next sync. Nothing changes. A damaged trust file is still rebuilt
/// (the only way to open the store again), and the next sync writes the policy's keys back.
#[test]
fn fleet_trust_reset_is_refused_on_a_fleet_managed_store_unless_its_trust_file_is_damaged() {
    let bench = Bench::new(guild());
    let m1 = joined_with_scan(&bench);
    bench
        .run(&["fleet", "sync", "--policy", &m1])
        .expect(0)
        .stdout_has("applied");
    let trust = bench.run(&["--json", "trust", "list"]).expect(0).json();
    let before = guild_test_support::disk(&bench.store());
    for args in [&["trust", "reset"][..], &["trust", "reset", "--keep-keys"]] {
        bench.run(args).expect(4).stderr_has(
            "this store follows fleet example.prod, whose signed policy owns its trust",
        );
        assert_eq!(guild_test_support::disk(&bench.store()), before, "{args:?}");
    }
    assert_eq!(
        enabled(&bench),
        [("example.scan".to_owned(), "1.0.0".to_owned())]
    );

    // A deleted trust file stops the store; the reset rebuilds it, and the next sync brings the
    // policy's keys back, though the policy did not change.
    fs::remove_file(bench.store().join("trust")).unwrap();
    bench.run(&["list"]).expect(5);
    bench.run(&["trust", "reset"]).expect(0);
    bench
        .run(&["fleet", "sync", "--policy", &m1])
        .expect(0)
        .stdout_has("applied");
    assert_eq!(
        bench.run(&["--json", "trust", "list"]).expect(0).json(),
        trust
    );
    assert_eq!(
        enabled(&bench),
        [("example.scan".to_owned(), "1.0.0".to_owned())]
    );
}

/// A revocation never goes away: `fleet sign --previous` and `fleet verify --previous` refuse
/// a policy that drops one of the last policy's (exit 4, each one named, the file untouched),
/// or that is not the same fleet's at a higher version; and a store that syncs such a policy
/// keeps its revocations and says so loudly, in its output and its JSON.
#[test]
fn fleet_a_policy_that_drops_a_revocation_is_refused_by_sign_and_verify_and_kept_by_sync() {
    let bench = Bench::new(guild());
    signed_root(&bench);
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = lock_with_sources(&bench, &[&scan], &[]);
    let gone = bench
        .run(&["--json", "keygen", "--out", "gone"])
        .expect(0)
        .json()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let bad_build = "ab".repeat(32);
    let revoke_key = format!("{gone}=leaked");
    let revoke_build = format!("sha256:{bad_build}");
    let signers = ["a.key", "b.key"];
    policy_with(
        &bench,
        ("1", "30d"),
        &lock,
        "p1.json",
        &signers,
        &[
            "--revoke-key",
            &revoke_key,
            "--revoke-package",
            &revoke_build,
        ],
    );
    // Version 2 written without --previous: both revocations dropped.
    policy(&bench, "2", "30d", &lock, "p2.json", &signers);
    policy_with(
        &bench,
        ("3", "30d"),
        &lock,
        "p3.json",
        &signers,
        &["--previous", "p1.json"],
    );

    // Signing it against the last policy is refused, naming both, and the file is untouched.
    let unsigned = fs::read(bench.path().join("p2.json")).unwrap();
    let refused = bench.run(&[
        "fleet",
        "sign",
        "p2.json",
        "--key",
        "c.key",
        "--root",
        "root.json",
        "--previous",
        "p1.json",
    ]);
    refused
        .expect(4)
        .stderr_has("fleet policy version 2 drops 2 revocation(s) of version 1")
        .stderr_has(&gone)
        .stderr_has(&bad_build)
        .stderr_has("leaked");
    assert_eq!(fs::read(bench.path().join("p2.json")).unwrap(), unsigned);
    let json = bench.run(&[
        "--json",
        "fleet",
        "sign",
        "p2.json",
        "--key",
        "c.key",
        "--previous",
        "p1.json",
    ]);
    json.expect(4);
    assert_eq!(json.error_json()["category"], "refused");
    assert_eq!(fs::read(bench.path().join("p2.json")).unwrap(), unsigned);

    // Verifying: the signatures alone verify; against the last policy it is refused.
    bench
        .run(&["fleet", "verify", "p2.json", "--root", "root.json"])
        .expect(0);
    bench
        .run(&[
            "fleet",
            "verify",
            "p2.json",
            "--root",
            "root.json",
            "--previous",
            "p1.json",
        ])
        .expect(4)
        .stderr_has(&format!("revoked key {gone}"))
        .stderr_has(&format!("revoked payload {bad_build}"));
    // Not a higher version: refused too.
    bench
        .run(&[
            "fleet",
            "verify",
            "p1.json",
            "--root",
            "root.json",
            "--previous",
            "p3.json",
        ])
        .expect(4)
        .stderr_has("must have a higher version");
    // The policy that carries them forward verifies and signs against it.
    bench
        .run(&[
            "fleet",
            "verify",
            "p3.json",
            "--root",
            "root.json",
            "--previous",
            "p1.json",
        ])
        .expect(0)
        .stdout_has("it follows policy version 1 of p1.json");
    bench
        .run(&[
            "fleet",
            "sign",
            "p3.json",
            "--key",
            "c.key",
            "--root",
            "root.json",
            "--previous",
            "p1.json",
        ])
        .expect(0);

    // A store that took policy 1 and is then handed policy 2 keeps both revocations, and
    // every sync under policy 2 says so.
    bench.run(&["fleet", "join", "root.json"]).expect(0);
    let m1 = mirror(&bench, "m1", "p1.json", &[&scan]);
    let first = bench.run(&["--json", "fleet", "sync", "--policy", &m1]);
    first.expect(0);
    assert_eq!(
        first.json()["dropped_revocations"],
        serde_json::json!({"keys": [], "packages": []})
    );
    let m2 = mirror(&bench, "m2", "p2.json", &[&scan]);
    for outcome in ["applied", "unchanged"] {
        let synced = bench.run(&["--json", "fleet", "sync", "--policy", &m2]);
        synced.expect(0);
        let synced = synced.json();
        assert_eq!(synced["outcome"], outcome);
        let warning = synced["warnings"][0].as_str().unwrap_or_default();
        assert!(
            warning.starts_with("REVOCATION DROPPED: fleet policy version 2 does not list")
                && warning.contains(&gone)
                && warning.contains(&bad_build),
            "{synced}"
        );
        assert_eq!(
            synced["dropped_revocations"],
            serde_json::json!({
                "keys": [{"key_id": gone, "reason": "leaked"}],
                "packages": [{"sha256": bad_build, "reason": "revoked by the fleet"}],
            })
        );
    }
    let trust = bench.run(&["--json", "trust", "list"]).expect(0).json();
    assert_eq!(trust["revoked_keys"][0]["key_id"], gone.as_str(), "{trust}");
    assert_eq!(
        trust["revoked_packages"][0]["sha256"],
        bad_build.as_str(),
        "{trust}"
    );
    bench
        .run(&["fleet", "sync", "--policy", &m2])
        .expect(0)
        .stdout_has("unchanged")
        .stderr_has("REVOCATION DROPPED: fleet policy version 2 does not list")
        .stderr_has(&gone)
        .stderr_has(&bad_build);
}

/// `guild fleet sync --follow` stopped by SIGTERM or SIGINT while it waits an hour for its next
/// poll: it wakes at once, says it stopped on the signal, exits 0, and leaves the store
/// unlocked and as its last sync left it.
#[test]
fn fleet_sync_follow_stops_cleanly_on_sigterm_and_sigint() {
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let bench = Bench::new(guild());
    let m1 = joined_with_scan(&bench);
    let store = bench.store();
    for (signal, name, first) in [
        ("-TERM", "SIGTERM", "applied"),
        ("-INT", "SIGINT", "unchanged"),
    ] {
        let mut child = guild()
            .command(
                bench.path(),
                &[
                    "--store",
                    store.to_str().unwrap(),
                    "fleet",
                    "sync",
                    "--policy",
                    &m1,
                    "--follow",
                    "--interval",
                    "3600",
                ],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        // The first poll's outcome ends with its `applied:` or `unchanged:` line.
        let mut printed = String::new();
        while !printed.contains(&format!("{first}: ")) {
            assert!(
                stdout.read_line(&mut printed).unwrap() > 0,
                "{name}: no {first} outcome: {printed:?}"
            );
        }
        let before = guild_test_support::disk(&store);
        let sent = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        // A hang guard, not a timing assertion: the wait must end on the signal, not at the
        // interval.
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("{name}: the follower did not stop");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "{name}: {status:?}\n{rest}\n{stderr}"
        );
        assert!(
            rest.contains(&format!("stopped on {name} after 1 poll(s)")),
            "{name}: {rest:?} {stderr}"
        );
        // The store is unlocked (a writer opens it) and unchanged.
        assert_eq!(guild_test_support::disk(&store), before, "{name}");
        bench
            .run(&["fleet", "sync", "--policy", &m1])
            .expect(0)
            .stdout_has("unchanged");
        bench.run(&["verify", "--all"]).expect(0);
        assert_eq!(guild_test_support::disk(&store), before, "{name}");
    }
}
