//! The figure G21 asks for: what a poll costs a store that follows a policy of 1,000 packages
//! when nothing changed. 1,000 small signed packages are pushed to the real registry (the one
//! the `oci` tests start), a policy desiring all of them is published, a store syncs it once,
//! and `--follow` then polls a few times; the registry's access log must show each unchanged
//! poll asking for the policy's manifest alone (no blob, nothing of a package). The one-shot
//! unchanged sync's time is printed, never asserted.
//!
//! Ignored by default (it packs, pushes and installs 1,000 packages, minutes on a small
//! machine). Run it with
//! `cargo test -p guild-cli --test it fleet_thousand -- --ignored --nocapture`.

use std::fs;
use std::time::Instant;

use guild_test_support::guild::Bench;

use crate::fleet::{policy_with, requests, signed_root};
use crate::guild;
use crate::oci::{ok, run, Registry};

const PACKAGES: usize = 1000;
/// `guild pack` and `guild push` processes run at once while setting up.
const WORKERS: usize = 4;

#[test]
#[ignore = "packs, pushes and syncs 1,000 packages (minutes); run with `cargo test -p guild-cli \
            --test it fleet_thousand -- --ignored --nocapture`"]
fn fleet_thousand_an_unchanged_poll_of_a_1000_package_policy_is_one_manifest_request() {
    let Some(registry) = Registry::start_logged("fleet_thousand") else {
        return;
    };
    let bench = Bench::new(guild());
    signed_root(&bench);
    let setup = Instant::now();
    let store = bench.store();

    // The key id every entry names, from a lock of one package (the first).
    let first = bench.package("org.example.p0000", "1.0.0", b"p0000", "");
    let one = bench.lock_of(&[&first], &[]);
    let one: serde_json::Value = serde_json::from_slice(&fs::read(one).unwrap()).unwrap();
    let key_id = one["packages"][0]["key_id"].as_str().unwrap().to_owned();

    // Pack and push every package, WORKERS at a time; each push answers the manifest digest
    // and the payload digest the lock entry needs.
    let entries: Vec<serde_json::Value> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let bench = &bench;
                let registry = &registry;
                let store = &store;
                let key_id = &key_id;
                scope.spawn(move || {
                    let mut entries = Vec::new();
                    for i in (w..PACKAGES).step_by(WORKERS) {
                        let id = format!("org.example.p{i:04}");
                        let archive = if i == 0 {
                            format!("{id}-1.0.0.gkmodule")
                        } else {
                            bench.package(&id, "1.0.0", format!("p{i:04}").as_bytes(), "")
                        };
                        let reference = registry.reference(&format!("guild/pkgs:p{i:04}-1.0.0"));
                        let pushed = ok(run(
                            bench,
                            store,
                            None,
                            &["--json", "push", &archive, &reference],
                        ))
                        .json();
                        entries.push(serde_json::json!({
                            "id": id,
                            "version": "1.0.0",
                            "kind": "gkmodule",
                            "payload_sha256": pushed["payload_sha256"],
                            "publisher": "org.example",
                            "key_id": key_id,
                            "reference": reference,
                            "manifest_digest": pushed["manifest_digest"],
                        }));
                    }
                    entries
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let mut entries = entries;
    entries.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    let lock = bench.path().join("thousand.lock");
    fs::write(
        &lock,
        serde_json::to_vec_pretty(
            &serde_json::json!({"lock_format": one["lock_format"], "packages": entries}),
        )
        .unwrap(),
    )
    .unwrap();
    let policy = bench.path().join("policy.json");
    let policy = policy.to_str().unwrap();
    policy_with(
        &bench,
        ("1", "30d"),
        lock.to_str().unwrap(),
        policy,
        &["a.key", "b.key"],
        &[],
    );
    let tag = registry.reference("fleet/policy:prod");
    ok(run(&bench, &store, None, &["fleet", "push", policy, &tag]));
    ok(run(&bench, &store, None, &["fleet", "join", "root.json"]));
    let pushed_at = setup.elapsed();

    let synced = Instant::now();
    let applied = ok(run(
        &bench,
        &store,
        None,
        &["--json", "fleet", "sync", "--policy", &tag],
    ))
    .json();
    let first_sync = synced.elapsed();
    assert_eq!(applied["outcome"], "applied");
    assert_eq!(applied["changes"].as_array().unwrap().len(), PACKAGES);

    // One-shot unchanged sync: its time is the figure.
    let unchanged_at = Instant::now();
    ok(run(
        &bench,
        &store,
        None,
        &["fleet", "sync", "--policy", &tag],
    ))
    .stdout_has("unchanged");
    let unchanged = unchanged_at.elapsed();

    // Following: the first poll authenticates and pulls the policy; each one after it is the
    // policy's manifest alone.
    let polls = 4;
    let seen = requests(&registry).len();
    let followed = ok(run(
        &bench,
        &store,
        None,
        &[
            "fleet",
            "sync",
            "--policy",
            &tag,
            "--follow",
            "--interval",
            "1",
            "--rounds",
            &polls.to_string(),
        ],
    ));
    assert_eq!(
        followed.stdout.matches("unchanged").count(),
        polls,
        "{}",
        followed.stdout
    );
    let polled = requests(&registry)[seen..].to_vec();
    let manifest = "GET /v2/fleet/policy/manifests/prod".to_owned();
    assert_eq!(
        polled[..2],
        ["GET /v2/".to_owned(), manifest.clone()],
        "{polled:#?}"
    );
    assert!(
        polled[2].starts_with("GET /v2/fleet/policy/blobs/"),
        "{polled:#?}"
    );
    let later = &polled[3..];
    assert_eq!(later, vec![manifest; polls - 1], "{polled:#?}");
    assert!(
        !polled.iter().any(|r| r.contains("/guild/")),
        "a poll asked for a package: {polled:#?}"
    );
    eprintln!(
        "fleet_thousand: FIGURE setup (pack, push {PACKAGES} packages, policy) {pushed_at:?}; \
         first sync (installs {PACKAGES}) {first_sync:?}; one-shot unchanged sync {unchanged:?}; \
         --follow: {} request(s) for its first poll, then {} request(s) for {} unchanged \
         poll(s) ({:?})",
        3,
        later.len(),
        polls - 1,
        later.first()
    );
}
