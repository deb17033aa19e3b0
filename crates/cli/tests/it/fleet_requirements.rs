//! `guild fleet policy new --requirements FILE`: a policy's desired set resolved against a real
//! registry's tags (the one the `oci` tests start; those parts skip as they do when it is not
//! installed). Several versions of a signed package are tagged (`1.0.0`, `1.2.0`, `1.3.0-rc.1`,
//! `2.0.0`, `latest`); `^1` resolves to 1.2.0 with its manifest digest and every given key that
//! signed it, and the policy signs, verifies and is applied by `fleet sync`. Refusals (nothing
//! matches, another package at the tag, an unsigned or untrusted publisher, a malformed file, an
//! unreachable registry) name the requirement and what was seen, and write nothing.

use std::fs;

use guild_test_support::guild::{Bench, Run};

use crate::fleet::{keygen_id, policy_new_args, signed_root};
use crate::guild;
use crate::oci::{fails, ok, run, start, Registry};

/// Writes `requirements.json` with one requirement per `(id, version, repository)`.
fn requirements(bench: &Bench, entries: &[(&str, &str, &str)]) -> String {
    let list: Vec<serde_json::Value> = entries
        .iter()
        .map(|(id, version, repository)| {
            serde_json::json!({"id": id, "version": version, "repository": repository})
        })
        .collect();
    let doc = serde_json::json!({ "requirements": list });
    fs::write(
        bench.path().join("requirements.json"),
        serde_json::to_vec_pretty(&doc).unwrap(),
    )
    .unwrap();
    "requirements.json".to_owned()
}

/// `guild --json fleet policy new` (see [`policy_new_args`]) from the requirements `file`.
fn policy_new(bench: &Bench, file: &str, publisher: &str, more: &[&str]) -> Run {
    let mut args = vec!["--json"];
    args.extend(policy_new_args(["--requirements", file], publisher, more));
    run(bench, &bench.store(), None, &args)
}

fn push(bench: &Bench, file: &str, reference: &str) -> String {
    ok(run(
        bench,
        &bench.store(),
        None,
        &["--json", "push", file, reference],
    ))
    .json()["manifest_digest"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `example.scan` at tags 1.0.0, 1.2.0 (signed by `k` and `k2`), 1.3.0-rc.1, 2.0.0 and latest
/// (2.0.0 again) in `guild/scan`; answers the manifest digest of 1.2.0 and the ids of k and k2.
fn tagged_versions(bench: &Bench, registry: &Registry) -> (String, String, String) {
    bench.run(&["keygen", "--out", "k2"]).expect(0);
    let (mut digest, mut keys) = (String::new(), Vec::new());
    for version in ["1.0.0", "1.2.0", "1.3.0-rc.1", "2.0.0"] {
        let mut archive = bench.package("example.scan", version, version.as_bytes(), "");
        if version == "1.2.0" {
            let both = "scan-1.2.0-both.gkmodule";
            let signed = bench
                .run(&["--json", "sign", &archive, "--key", "k2.key", "--out", both])
                .expect(0)
                .json();
            keys = signed["signatures"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["key_id"].as_str().unwrap().to_owned())
                .collect();
            archive = both.to_owned();
        }
        let pushed = push(
            bench,
            &archive,
            &registry.reference(&format!("guild/scan:{version}")),
        );
        if version == "1.2.0" {
            digest = pushed;
        }
        if version == "2.0.0" {
            push(bench, &archive, &registry.reference("guild/scan:latest"));
        }
    }
    let [k, k2] = <[String; 2]>::try_from(keys).unwrap();
    (digest, k, k2)
}

#[test]
fn fleet_requirements_resolve_the_highest_matching_tag_and_a_store_follows_the_policy() {
    let Some((registry, bench)) =
        start("fleet_requirements_resolve_the_highest_matching_tag_and_a_store_follows_the_policy")
    else {
        return;
    };
    signed_root(&bench);
    let (digest, k, k2) = tagged_versions(&bench, &registry);
    let repository = registry.reference("guild/scan");
    let file = requirements(&bench, &[("example.scan", "^1", &repository)]);

    let made = ok(policy_new(&bench, &file, "org.example=k.pub,k2.pub", &[])).json();
    let resolved = &made["resolved"][0];
    assert_eq!(resolved["version"], "1.2.0", "{made}");
    assert_eq!(resolved["tag"], "1.2.0");
    assert_eq!(resolved["manifest_digest"], digest);
    let both = serde_json::json!([k, k2]);
    assert_eq!(resolved["key_ids"], both);
    let policy: serde_json::Value =
        serde_json::from_slice(&fs::read(bench.path().join("policy.json")).unwrap()).unwrap();
    let entry = &policy["signed"]["packages"][0];
    assert_eq!(entry["id"], "example.scan");
    assert_eq!(entry["version"], "1.2.0");
    assert_eq!(entry["key_ids"], both);
    assert_eq!(
        entry["source"]["reference"],
        format!("{repository}:1.2.0").as_str()
    );
    assert_eq!(entry["source"]["manifest_digest"], digest);

    // The policy signs, verifies and is applied.
    for key in ["a.key", "b.key"] {
        bench
            .run(&[
                "fleet",
                "sign",
                "policy.json",
                "--key",
                key,
                "--root",
                "root.json",
            ])
            .expect(0);
    }
    bench
        .run(&["fleet", "verify", "policy.json", "--root", "root.json"])
        .expect(0);
    let store = bench.path().join("follower");
    ok(run(&bench, &store, None, &["fleet", "join", "root.json"]));
    ok(run(
        &bench,
        &store,
        None,
        &["fleet", "sync", "--policy", "policy.json"],
    ))
    .stdout_has("installed example.scan 1.2.0");
    let listed = ok(run(&bench, &store, None, &["--json", "list"])).json();
    assert_eq!(listed["packages"][0]["enabled"], "1.2.0", "{listed}");

    // `--entry-keys publisher`: every key given for the publisher, signer or not.
    let k3 = keygen_id(&bench, "k3");
    let made = ok(policy_new(
        &bench,
        &file,
        "org.example=k.pub,k2.pub,k3.pub",
        &["--entry-keys", "publisher"],
    ))
    .json();
    assert_eq!(
        made["resolved"][0]["key_ids"],
        serde_json::json!([k, k2, k3])
    );
    // Only a key given verifies: with k2 alone, k2 alone is allowed.
    let made = ok(policy_new(&bench, &file, "org.example=k2.pub", &[])).json();
    assert_eq!(made["resolved"][0]["key_ids"], serde_json::json!([k2]));
    // A requirement that names a pre-release takes it; `*` the highest release.
    let file = requirements(&bench, &[("example.scan", ">=1.3.0-rc.1, <2", &repository)]);
    let made = ok(policy_new(&bench, &file, "org.example=k.pub", &[])).json();
    assert_eq!(made["resolved"][0]["version"], "1.3.0-rc.1");
    let file = requirements(&bench, &[("example.scan", "*", &repository)]);
    let made = ok(policy_new(&bench, &file, "org.example=k.pub", &[])).json();
    assert_eq!(made["resolved"][0]["tag"], "2.0.0");
}

#[test]
fn fleet_requirements_refusals_name_the_requirement_and_write_nothing() {
    let Some((registry, bench)) =
        start("fleet_requirements_refusals_name_the_requirement_and_write_nothing")
    else {
        return;
    };
    tagged_versions(&bench, &registry);
    let repository = registry.reference("guild/scan");
    let policy = bench.path().join("policy.json");

    // Nothing matches: the versions seen are listed, highest first.
    let file = requirements(&bench, &[("example.scan", "^3", &repository)]);
    fails(
        policy_new(&bench, &file, "org.example=k.pub", &[]),
        6,
        &format!(
            "requirement example.scan ^3 from {repository}: no tag matches; versions seen: 2.0.0, \
         1.3.0-rc.1, 1.2.0, 1.0.0 (1 other tag(s))"
        ),
    );
    assert!(!policy.exists());

    // The tag holds another package.
    let norm = bench.package("example.norm", "1.0.0", b"norm", "");
    push(&bench, &norm, &registry.reference("guild/other:1.0.0"));
    let other = registry.reference("guild/other");
    let file = requirements(&bench, &[("example.scan", "^1", &other)]);
    fails(
        policy_new(&bench, &file, "org.example=k.pub", &[]),
        3,
        "tag 1.0.0 holds package example.norm 1.0.0, not example.scan",
    );
    assert!(!policy.exists());

    // Signed by no key given for its publisher; a publisher not given at all.
    let file = requirements(&bench, &[("example.scan", "~1.0", &repository)]);
    bench.run(&["keygen", "--out", "stranger"]).expect(0);
    fails(
        policy_new(&bench, &file, "org.example=stranger.pub", &[]),
        3,
        "example.scan 1.0.0 (tag 1.0.0) is not signed by a key given for publisher org.example",
    );
    fails(
        policy_new(&bench, &file, "org.other=k.pub", &[]),
        3,
        "published by org.example, which is not given with --publisher",
    );
    // Out of the publisher's scope.
    fails(
        policy_new(
            &bench,
            &file,
            "org.example=k.pub",
            &["--scope", "org.example=example.norm"],
        ),
        4,
        "does not cover example.scan",
    );
    // --entry-keys lock needs a lock.
    fails(
        policy_new(
            &bench,
            &file,
            "org.example=k.pub",
            &["--entry-keys", "lock"],
        ),
        2,
        "--entry-keys lock needs --from-lock",
    );
    // A repository that does not exist.
    let file = requirements(
        &bench,
        &[("example.scan", "^1", &registry.reference("guild/absent"))],
    );
    fails(
        policy_new(&bench, &file, "org.example=k.pub", &[]),
        6,
        "not found",
    );
    assert!(!policy.exists());
}

/// A malformed requirements file is a usage error naming the file and the entry; so is giving
/// both sources or neither. A registry that cannot be reached exits 7. None needs a registry.
#[test]
fn fleet_requirements_malformed_files_and_an_unreachable_registry_are_refused() {
    let bench = Bench::new(guild());
    let repo = "oci://127.0.0.1:9/guild/scan";
    let policy = bench.path().join("policy.json");
    let write = |text: &str| fs::write(bench.path().join("requirements.json"), text).unwrap();
    for (text, says) in [
        (
            format!(
                r#"{{"requirements": [{{"id": "example.scan", "version": "^1", "repository": "{repo}", "tag": "1.0.0"}}]}}"#
            ),
            "requirements[0] (example.scan).tag: unknown member",
        ),
        (
            format!(
                r#"{{"requirements": [{{"id": "example.scan", "version": "^1", "repository": "{repo}:1.0.0"}}]}}"#
            ),
            "requirements[0] (example.scan).repository",
        ),
        (
            format!(
                r#"{{"requirements": [{{"id": "example.scan", "version": "^1", "repository": "{repo}"}}, {{"id": "example.scan", "version": "^2", "repository": "{repo}"}}]}}"#
            ),
            "requirements[1]: package example.scan is already required by requirements[0]",
        ),
        (
            format!(
                r#"{{"requirements": [{{"id": "example.scan", "version": "one", "repository": "{repo}"}}]}}"#
            ),
            "requirements[0] (example.scan).version",
        ),
        ("{\"requirements\": [".to_owned(), "not valid JSON"),
    ] {
        write(&text);
        fails(
            policy_new(&bench, "requirements.json", "org.example=k.pub", &[]),
            2,
            &format!("the requirements file requirements.json is malformed: {says}"),
        );
        assert!(!policy.exists(), "{text}");
    }
    // Exactly one of --from-lock and --requirements.
    fails(
        policy_new(
            &bench,
            "requirements.json",
            "org.example=k.pub",
            &["--from-lock", "guild.lock"],
        ),
        2,
        "cannot be used with",
    );
    // Neither: `--out` takes the source's place, and the trailing `--out` is dropped.
    let mut neither = policy_new_args(["--out", "policy.json"], "org.example=k.pub", &[]);
    neither.truncate(neither.len() - 2);
    fails(
        run(&bench, &bench.store(), None, &neither),
        2,
        "--from-lock",
    );
    // Nothing listens on port 9: exit 7, after one try here.
    write(&format!(
        r#"{{"requirements": [{{"id": "example.scan", "version": "^1", "repository": "{repo}"}}]}}"#
    ));
    let store = bench.store();
    let mut args = vec!["--store", store.to_str().unwrap()];
    args.extend(policy_new_args(
        ["--requirements", "requirements.json"],
        "org.example=k.pub",
        &[],
    ));
    let out = guild()
        .command(bench.path(), &args)
        .env("GUILD_REGISTRY_ATTEMPTS", "1")
        .output()
        .unwrap();
    let out = Run::from(out);
    fails(
        out,
        7,
        "cannot list the tags of oci://127.0.0.1:9/guild/scan",
    );
    assert!(!policy.exists());
}
