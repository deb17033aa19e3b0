//! A publisher key rotation without an outage, as operators run it: the package installed
//! under the old key is re-signed with the new key (`guild sign` adds a signature, the payload
//! stays), the new key is trusted, the re-signed file is installed again (which records the new
//! signature in the store), and the old key is revoked. What both keys signed stays enabled and
//! keeps serving; what only the old key signed is disabled as before.

use std::fs;

use guild_test_support::guild::{template_json, Bench, Run};
use guild_test_support::plugins::plugin_library;
use serde_json::Value;

use crate::guild;

#[track_caller]
fn expect(run: &Run, code: i32) -> &Run {
    assert_eq!(
        run.code, code,
        "exit code\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    run
}

#[track_caller]
fn has(text: &str, what: &str) {
    assert!(text.contains(what), "lacks {what:?}:\n{text}");
}

const OP: &str = "example.sequence.inclusive_scan";

/// Packs the real scan module (which serves [`OP`]) as `scan.gkmodule`, signed by `k.key`.
fn scan_package(b: &Bench) -> String {
    let library = plugin_library("scan_module");
    let (src, _) = b.source("example.scan", "1.0.0", &library, "");
    let template = b.path().join("scan.json");
    let json = template_json("example.scan", "1.0.0", "").replacen(
        r#""provided_ops": ["example.scan.op.cpu"]"#,
        r#""provided_ops": ["example.scan.inclusive.cpu", "example.scan.exclusive.cpu"]"#,
        1,
    );
    fs::write(&template, json).unwrap();
    let pack = b.run(&[
        "pack",
        src.to_str().unwrap(),
        "--manifest",
        template.to_str().unwrap(),
        "--out",
        "scan.gkmodule",
        "--key",
        "k.key",
    ]);
    expect(&pack, 0);
    "scan.gkmodule".to_owned()
}

fn key_id(b: &Bench, prefix: &str) -> String {
    let out = b.run(&["--json", "keygen", "--out", prefix]);
    expect(&out, 0);
    out.json()["key_id"].as_str().unwrap().to_owned()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

fn enabled(b: &Bench, id: &str) -> Option<String> {
    let listed = b.listed(&b.store());
    listed["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .and_then(|p| p["enabled"].as_str().map(str::to_owned))
}

fn resolves(b: &Bench) -> Run {
    b.run(&["resolve", OP, "--input", "i64:4", "--output", "i64:4"])
}

#[test]
fn trust_key_rotation_keeps_the_re_signed_package_enabled_and_serving() {
    let b = Bench::new(guild());
    b.trust();
    let old = b.run(&["--json", "trust", "list"]).json()["publishers"][0]["keys"][0]["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let scan = scan_package(&b);
    // A package that only the old key will ever sign.
    let other = b.package("example.other", "1.0.0", b"other v1", "");
    expect(&b.run(&["install", &scan]), 0);
    expect(&b.run(&["install", &other]), 0);
    expect(&resolves(&b), 0);

    // The publisher adds the new key's signature; the payload does not change.
    let new = key_id(&b, "new");
    let before = b.run(&["--json", "inspect", &scan]).json();
    let signed = b.run(&["--json", "sign", &scan, "--key", "new.key"]);
    expect(&signed, 0);
    let doc = signed.json();
    assert_eq!(doc["payload_sha256"], before["payload_sha256"], "{doc}");
    let keys: Vec<&str> = doc["signatures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key_id"].as_str().unwrap())
        .collect();
    assert_eq!(keys, [old.as_str(), new.as_str()]);
    // Signing again with the same key is refused, and the file is left as it was.
    let again = b.run(&["sign", &scan, "--key", "new.key"]);
    expect(&again, 4);
    has(&again.stderr, "already signed by key");

    // Until the store trusts the new key, its signature is one nobody vouches for.
    let verified = b.run(&["--json", "verify", &scan]);
    expect(&verified, 0);
    assert_eq!(strings(&verified.json()["signed_by"]), [old.as_str()]);
    expect(&b.run(&["trust", "add", "org.example", "new.pub"]), 0);
    let verified = b.run(&["verify", &scan]);
    expect(&verified, 0);
    has(
        &verified.stdout,
        &format!("signed by org.example keys {old}, {new}"),
    );

    // Installing the re-signed file records the new signature: a change, not "no change".
    let installed = b.run(&["--json", "install", &scan]);
    expect(&installed, 0);
    let doc = installed.json();
    assert_eq!(doc["changed"], true, "{doc}");
    assert_eq!(strings(&doc["signatures_added"]), [new.as_str()]);
    assert_eq!(doc["payload_sha256"], before["payload_sha256"], "{doc}");
    let again = b.run(&["--json", "install", &scan]);
    expect(&again, 0);
    assert_eq!(again.json()["changed"], false, "{}", again.stdout);
    assert_eq!(
        strings(&again.json()["signatures_added"]),
        Vec::<&str>::new()
    );

    // Revoking the old key disables only what it alone signed.
    let revoked = b.run(&["trust", "revoke-key", &old, "--reason", "rotated"]);
    expect(&revoked, 0);
    has(&revoked.stdout, "disabled example.other@1.0.0");
    assert!(
        !revoked.stdout.contains("example.scan@1.0.0"),
        "{}",
        revoked.stdout
    );
    assert_eq!(enabled(&b, "example.scan").as_deref(), Some("1.0.0"));
    assert_eq!(enabled(&b, "example.other"), None);
    let found = resolves(&b);
    expect(&found, 0);
    has(&found.stdout, "from example.scan 1.0.0");

    // Every later open and check agrees: the full check, a disable and enable (which runs the
    // registration check in a child), the old-key-only package refused.
    // The full check reports only the old-key-only package (disabled already), so exit 1.
    let all = b.run(&["verify", "--all"]);
    expect(&all, 1);
    has(&all.stdout, "2 installed version(s)");
    has(&all.stdout, ": 1 failed");
    has(&all.stdout, "FAILED example.other 1.0.0 (disabled)");
    expect(&b.run(&["disable", "example.scan"]), 0);
    expect(&b.run(&["enable", "example.scan"]), 0);
    expect(&resolves(&b), 0);
    assert_ne!(b.run(&["enable", "example.other"]).code, 0);
    let refused = b.run(&["install", &other]);
    expect(&refused, 3);
    has(&refused.stderr, "is not authenticated");
    let verified = b.run(&["--json", "verify", &scan]);
    expect(&verified, 0);
    assert_eq!(strings(&verified.json()["signed_by"]), [new.as_str()]);
}
