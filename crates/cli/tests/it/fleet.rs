//! `guild fleet`: a root of three keys with a threshold of two, signed by two holders in turn
//! (it verifies after the second signature and not before), a policy made from a lock and
//! signed the same way, and both pushed to and pulled back from a real registry (the one the
//! `oci` tests start; those parts skip as they do when it is not installed).

use std::fs;

use guild_test_support::guild::{Bench, Run};

use crate::guild;
use crate::oci::{fails, locked_store, ok, run, start};

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

/// `guild fleet policy new` for fleet `example.prod`, version 1 under root version 1, from
/// `lock` with `publisher` (`ID=KEY.pub[,...]`), written to `policy.json`; `more` adds options.
fn policy_new(bench: &Bench, lock: &str, publisher: &str, more: &[&str]) -> Run {
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
        "--from-lock",
        lock,
        "--publisher",
        publisher,
        "--out",
        "policy.json",
    ];
    args.extend(more);
    bench.run(&args)
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
