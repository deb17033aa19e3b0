//! The store fails closed on its trust file and keeps tamper evidence, as an operator sees it
//! through real `guild` processes.
//!
//! Trust: after `trust revoke-key`, deleting the trust file, putting an older copy back or
//! bringing in another store's trust file each stops the store (exit code 5, the file named, the
//! recovery command in the hint); `guild trust reset` gets the operator out, and the revoked key
//! stays revoked through it. Taint: a tampered file is recorded in the registry the first
//! time any command opens the store, even when that command then fails, and `list`, `status`
//! and `doctor` show it until a genuine copy of the package is installed over it.

use std::fs;
use std::path::{Path, PathBuf};

use guild_test_support::guild::{library, Bench, Run};
use serde_json::Value;

use crate::guild;

/// Fails with both streams unless `run` exited with `code`.
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

/// A bench with `k.pub` trusted and `example.scan` 1.0.0 installed and enabled; answers the
/// archive's name and the key id.
fn installed_bench() -> (Bench, String, String) {
    let b = Bench::new(guild());
    b.trust();
    let archive = b.package("example.scan", "1.0.0", b"scan v1", "");
    expect(&b.run(&["install", &archive]), 0);
    let listed = b.run(&["--json", "trust", "list"]);
    expect(&listed, 0);
    let key = listed.json()["publishers"][0]["keys"][0]["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    (b, archive, key)
}

fn trust_file(b: &Bench) -> PathBuf {
    b.store().join("trust")
}

/// The store refuses to open because of its trust file: exit code 5 from `list`, `trust add`
/// and `doctor`, the trust file named, `problem` in the message, the reset command in the hint.
#[track_caller]
fn assert_refused_for_trust(b: &Bench, problem: &str) {
    let trust = trust_file(b);
    let listed = b.run(&["list"]);
    expect(&listed, 5);
    has(
        &listed.stderr,
        &format!(
            "error: trust file {} is not this store's current trust file",
            trust.display()
        ),
    );
    has(&listed.stderr, problem);
    has(&listed.stderr, "hint: ");
    has(&listed.stderr, "guild trust reset");
    let json = b.run(&["--json", "list"]);
    expect(&json, 5);
    assert_eq!(json.error_json()["category"], "store");
    // Re-trusting is refused too: nothing can be changed while the trust file is wrong.
    expect(&b.run(&["trust", "add", "org.example", "k.pub"]), 5);
    let doctor = b.run(&["doctor"]);
    expect(&doctor, 5);
    has(&doctor.stdout, "fail  store");
    has(&doctor.stdout, "guild trust reset");
}

/// After recovery, `key` is still revoked: listed as revoked, refused by `trust add`, and the
/// package it signed neither enables nor installs.
#[track_caller]
fn assert_still_revoked(b: &Bench, key: &str, archive: &str) {
    let listed = b.run(&["--json", "trust", "list"]);
    expect(&listed, 0);
    let doc = listed.json();
    let revoked: Vec<&str> = doc["revoked_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key_id"].as_str().unwrap())
        .collect();
    assert_eq!(revoked, [key], "{}", listed.stdout);
    let again = b.run(&["trust", "add", "org.example", "k.pub"]);
    expect(&again, 4);
    has(&again.stderr, "is revoked and cannot be trusted again");
    assert_ne!(b.run(&["enable", "example.scan"]).code, 0);
    let install = b.run(&["install", archive]);
    expect(&install, 3);
    has(&install.stderr, "is not authenticated");
    let status = b.run(&["--json", "status"]);
    expect(&status, 0);
    assert_eq!(status.json()["counts"]["enabled"], 0, "{}", status.stdout);
}

#[test]
fn trust_deleting_the_file_after_revoke_key_stops_the_store_until_reset() {
    let (b, archive, key) = installed_bench();
    let revoked = b.run(&["trust", "revoke-key", &key, "--reason", "leaked"]);
    expect(&revoked, 0);
    has(&revoked.stdout, "disabled example.scan@1.0.0");

    fs::remove_file(trust_file(&b)).unwrap();
    assert_refused_for_trust(&b, "the trust file is missing");

    let reset = b.run(&["trust", "reset"]);
    expect(&reset, 0);
    has(
        &reset.stdout,
        "the trust file found was refused: the trust file is missing",
    );
    has(
        &reset.stdout,
        "0 trusted key(s), 1 revoked key(s) and 0 revoked package(s) kept",
    );
    has(&reset.stdout, "guild trust add");
    expect(&b.run(&["list"]), 0);
    assert_still_revoked(&b, &key, &archive);
    // The rebuilt file is guarded like any other.
    fs::remove_file(trust_file(&b)).unwrap();
    expect(&b.run(&["list"]), 5);
}

#[test]
fn trust_an_older_copy_of_the_file_is_refused_and_reset_keeps_its_keys_and_the_revocation() {
    let (b, archive, key) = installed_bench();
    // A second key of the publisher, trusted before the backup and never revoked.
    expect(&b.run(&["keygen", "--out", "k2"]), 0);
    expect(&b.run(&["trust", "add", "org.example", "k2.pub"]), 0);
    let backup = b.path().join("trust.backup");
    fs::copy(trust_file(&b), &backup).unwrap();
    expect(
        &b.run(&["trust", "revoke-key", &key, "--reason", "leaked"]),
        0,
    );
    // "Restore it from a backup": the backup predates the revocation.
    fs::copy(&backup, trust_file(&b)).unwrap();
    assert_refused_for_trust(&b, "older than generation");
    let reset = b.run(&["--json", "trust", "reset", "--keep-keys"]);
    expect(&reset, 0);
    let r = reset.json();
    assert_eq!(r["trusted_keys"], 1, "{r}");
    assert_eq!(r["revoked_keys"], 1, "{r}");
    has(r["found"].as_str().unwrap(), "older than generation");
    // The second key is kept; the revoked one is not trusted again.
    let listed = b.run(&["--json", "trust", "list"]);
    let keys = &listed.json()["publishers"][0]["keys"];
    assert_eq!(keys.as_array().unwrap().len(), 1, "{keys}");
    assert_ne!(keys[0]["key_id"], key.as_str(), "{keys}");
    assert_still_revoked(&b, &key, &archive);

    // Editing the current file by hand is refused the same way.
    let text = fs::read_to_string(trust_file(&b)).unwrap();
    fs::write(trust_file(&b), text.replace("leaked", "nothing to see")).unwrap();
    assert_refused_for_trust(&b, "the trust file was changed outside guild");
}

#[test]
fn trust_a_file_from_another_store_is_refused_and_reset_keeps_the_revocation() {
    let (b, archive, key) = installed_bench();
    expect(
        &b.run(&["trust", "revoke-key", &key, "--reason", "leaked"]),
        0,
    );
    // Another store on the same machine trusts the same key, unrevoked.
    let other = b.path().join("other-store");
    let other_arg = other.to_str().unwrap();
    expect(
        &guild().run(
            b.path(),
            &["--store", other_arg, "trust", "add", "org.example", "k.pub"],
        ),
        0,
    );
    fs::copy(other.join("trust"), trust_file(&b)).unwrap();
    assert_refused_for_trust(&b, "the trust file belongs to store ");

    let reset = b.run(&["trust", "reset"]);
    expect(&reset, 0);
    has(
        &reset.stdout,
        "the trust file found was refused: the trust file belongs",
    );
    assert_still_revoked(&b, &key, &archive);
    // The other store is untouched and still opens.
    expect(&guild().run(b.path(), &["--store", other_arg, "list"]), 0);
}

#[test]
fn trust_a_store_from_before_binding_is_bound_on_open_and_refuses_a_missing_file() {
    // A store as today's code wrote it: no trust record in the registry, no binding in the trust
    // file. The rewrite below produces exactly those files.
    fn unbind(b: &Bench) {
        guild_test_support::adapters::fs::store::testing::as_format_1(b.store()).unwrap();
        let registry = b.store().join("registry.json");
        let mut doc: Value = serde_json::from_slice(&fs::read(&registry).unwrap()).unwrap();
        doc.as_object_mut().unwrap().remove("trust");
        fs::write(&registry, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
        let trust = trust_file(b);
        let mut doc: Value = serde_json::from_slice(&fs::read(&trust).unwrap()).unwrap();
        doc.as_object_mut().unwrap().remove("store_id");
        doc.as_object_mut().unwrap().remove("generation");
        fs::write(&trust, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    }
    let (b, _, _) = installed_bench();
    unbind(&b);
    // A reader leaves the binding to the next writer.
    let listed = b.run(&["list"]);
    expect(&listed, 0);
    let committed = || {
        guild_test_support::adapters::fs::store::read_registry(b.store())
            .unwrap()
            .unwrap()
    };
    assert!(committed().trust_anchor().is_none());
    let listed = b.run(&["recover"]);
    expect(&listed, 0);
    has(&listed.stdout, "the trust file is now bound to this store");
    assert!(committed().trust_anchor().is_some());
    // From now on it is guarded: an older (unbound) copy is refused.
    unbind_trust_only(&b);
    assert_refused_for_trust(&b, "the trust file carries no store binding");

    // Fail closed where the old format allows it: packages were installed through a trust file,
    // so a store that records packages and has none lost it.
    let (b, _, _) = installed_bench();
    unbind(&b);
    fs::remove_file(trust_file(&b)).unwrap();
    assert_refused_for_trust(&b, "the registry records installed packages");
    expect(&b.run(&["trust", "reset"]), 0);
    expect(&b.run(&["list"]), 0);
}

/// Removes the binding from the trust file only, as an old copy of it would look.
fn unbind_trust_only(b: &Bench) {
    let trust = trust_file(b);
    let mut doc: Value = serde_json::from_slice(&fs::read(&trust).unwrap()).unwrap();
    doc.as_object_mut().unwrap().remove("store_id");
    doc.as_object_mut().unwrap().remove("generation");
    fs::write(&trust, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

/// The installed library of `example.scan` 1.0.0.
fn installed_library(b: &Bench) -> PathBuf {
    b.store()
        .join("packages/example.scan/1.0.0")
        .join("libplugin.so")
}

/// Changes the installed library's bytes, as an attacker with write access to the store would
/// (the file is sealed read-only; its owner can still unseal it).
fn tamper(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(path, b"scan v1 with a backdoor").unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o444)).unwrap();
}

/// `list`, `status`, `status ID` and `doctor` all show the taint with its reason and file.
#[track_caller]
fn assert_taint_shown(b: &Bench) {
    let listed = b.run(&["list"]);
    expect(&listed, 0);
    has(&listed.stdout, "disabled (tainted)");
    has(
        &listed.stdout,
        "example.scan@1.0.0 is tainted (file libplugin.so): installed files do not match",
    );
    let json = b.run(&["--json", "list"]);
    expect(&json, 0);
    let q = &json.json()["packages"][0]["versions"][0]["taint"];
    assert_eq!(q["file"], "libplugin.so", "{q}");
    has(
        q["reason"].as_str().unwrap(),
        "do not match the signed manifest",
    );

    let status = b.run(&["status"]);
    expect(&status, 0);
    has(&status.stdout, "tainted: 1 version(s)");
    let one = b.run(&["status", "example.scan"]);
    expect(&one, 0);
    has(&one.stdout, "tainted: installed files do not match");
    has(&one.stdout, "(file libplugin.so)");
    has(&one.stdout, "guild install PACKAGE");

    let doctor = b.run(&["--json", "doctor"]);
    let store = doctor.json()["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "store")
        .cloned()
        .unwrap();
    assert_eq!(store["verdict"], "warn", "{store}");
    has(
        store["detail"].as_str().unwrap(),
        "tainted (file libplugin.so)",
    );
}

/// Reinstalling the genuine archive repairs the package: its file is the signed one again, the
/// taint is gone and it is enabled.
#[track_caller]
fn assert_repaired_by_reinstall(b: &Bench, archive: &str) {
    let again = b.run(&["--json", "install", archive]);
    expect(&again, 0);
    let a = again.json();
    assert_eq!(a["repaired"], true, "{a}");
    assert_eq!(a["enabled"], true, "{a}");
    has(
        &expect(&b.run(&["install", archive]), 0).stdout,
        "already installed with this exact content",
    );
    assert_eq!(fs::read(installed_library(b)).unwrap(), library(b"scan v1"));
    let listed = b.run(&["--json", "list"]);
    let p = &listed.json()["packages"][0];
    assert_eq!(p["enabled"], "1.0.0", "{p}");
    assert_eq!(p["versions"][0]["taint"], Value::Null, "{p}");
    let doctor = b.run(&["doctor"]);
    has(&doctor.stdout, "ok    store");
    let status = b.run(&["--json", "status"]);
    assert_eq!(status.json()["counts"]["tainted"], 0);
    // The repaired package passes re-verification: nothing is disabled on the next opening.
    let recovered = b.run(&["--json", "recover"]);
    expect(&recovered, 0);
    assert_eq!(recovered.json()["open"]["disabled"], serde_json::json!([]));
}

#[test]
fn taint_found_by_verify_all_survives_a_failing_enable_and_reinstall_repairs_it() {
    let (b, archive, _) = installed_bench();
    tamper(&installed_library(&b));
    // Opening hashes nothing: the full check finds the change and taints the version.
    let verify = b.run(&["verify", "--all"]);
    expect(&verify, 1);
    has(
        &verify.stdout,
        "FAILED example.scan 1.0.0 (enabled) file libplugin.so",
    );
    assert_taint_shown(&b);
    // Enabling stays refused while the taint stands, and says how to repair.
    let enable = b.run(&["enable", "example.scan"]);
    expect(&enable, 4);
    has(&enable.stderr, "example.scan@1.0.0 is tainted");
    has(&enable.stderr, "hint: it failed re-verification");
    assert_repaired_by_reinstall(&b, &archive);
}

#[test]
fn taint_survives_a_failing_resolve_and_reinstall_repairs_it() {
    let (b, archive, _) = installed_bench();
    tamper(&installed_library(&b));
    let resolve = || {
        let run = b.run(&[
            "resolve",
            "example.scan.op",
            "--input",
            "f32:4",
            "--output",
            "f32:4",
        ]);
        assert_ne!(run.code, 0, "{}", run.stdout);
    };
    resolve();
    // `resolve` loads like a runner: the library is hashed right before it would open, and the
    // mismatch is recorded as a taint then.
    assert_taint_shown(&b);
    // A failing resolve does not clear it.
    resolve();
    assert_taint_shown(&b);
    // A command that succeeds does not clear it either.
    expect(&b.run(&["trust", "list"]), 0);
    assert_taint_shown(&b);
    assert_repaired_by_reinstall(&b, &archive);
}
