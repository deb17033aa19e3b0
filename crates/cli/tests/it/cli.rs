//! The `guild` binary, run as an operator would: the whole publish-and-install flow, every
//! documented exit code, the `--json` documents, hints, and `verify` leaving nothing behind.

use std::fs;
use std::path::{Path, PathBuf};

use guild_test_support::guild::{library, tamper, Bench, Run};
use guild_test_support::{make_writable, Scratch};
use serde_json::Value;

use crate::guild;

/// Each line with its runs of spaces collapsed, for tables whose column widths vary.
fn words(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn key_id(bench: &Bench) -> String {
    let out = bench.run(&["--json", "trust", "list"]);
    out.expect(0);
    out.json()["publishers"][0]["keys"][0]["key_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn cli_publish_trust_install_and_manage_a_package() {
    let b = Bench::new(guild());
    let key = b.path().join("k.key");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&key).unwrap().permissions()) & 0o777,
        0o600
    );
    let pem = fs::read_to_string(&key).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
    assert!(fs::read_to_string(b.path().join("k.pub"))
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----"));

    // pack (unsigned), then sign in place.
    let (src, template) = b.source("example.scan", "1.0.0", b"scan v1", "");
    b.run(&[
        "pack",
        src.to_str().unwrap(),
        "--manifest",
        template.to_str().unwrap(),
        "--out",
        "scan.gkmodule",
    ])
    .expect(0)
    .stdout_has("packed example.scan 1.0.0 (gkmodule) into scan.gkmodule: 1 artifact")
    .stdout_has("unsigned");
    let signed = b.run(&["--json", "sign", "scan.gkmodule", "--key", "k.key"]);
    signed.expect(0);
    let sign_json = signed.json();
    let kid = sign_json["key_id"].as_str().unwrap().to_owned();
    assert_eq!(sign_json["signatures"][0]["key_id"], kid.as_str());
    let digest = sign_json["payload_sha256"].as_str().unwrap().to_owned();

    // inspect: the manifest, labelled unverified.
    b.run(&["inspect", "scan.gkmodule"])
        .expect(0)
        .stdout_has("UNVERIFIED")
        .stdout_has("example.scan 1.0.0 (gkmodule)")
        .stdout_has(&format!("key {kid} ecdsa-p256-sha256 (not checked)"))
        .stdout_has(&format!(
            "libplugin.so  {} bytes",
            library(b"scan v1").len()
        ));
    let inspected = b.run(&["--json", "inspect", "scan.gkmodule"]);
    let inspected = inspected.json();
    assert_eq!(inspected["verified"], false);
    assert_eq!(inspected["manifest"]["package_id"], "example.scan");
    assert_eq!(
        inspected["manifest"]["artifacts"][0]["size"],
        library(b"scan v1").len()
    );
    assert_eq!(inspected["payload_sha256"], digest.as_str());

    // Before trust: verify and install are both refused, with the hint; the store stays empty.
    for args in [
        &["verify", "scan.gkmodule"][..],
        &["install", "scan.gkmodule"],
    ] {
        b.run(args)
            .expect(3)
            .stderr_has("error: package example.scan@1.0.0 (scan.gkmodule) is not authenticated")
            .stderr_has("hint: if you trust this publisher, add its public key: guild trust add org.example PUBKEY.pem");
    }
    b.run(&["list"])
        .expect(0)
        .stdout_has("no packages installed");

    b.run(&["trust", "add", "org.example", "k.pub"])
        .expect(0)
        .stdout_has(&format!("trusted key {kid} for publisher org.example"));
    b.run(&["trust", "add", "org.example", "k.pub"])
        .expect(0)
        .stdout_has("already trusted");
    b.run(&["verify", "scan.gkmodule"])
        .expect(0)
        .stdout_has(&format!(
            "verified example.scan 1.0.0 (gkmodule): signed by org.example key {kid}"
        ))
        .stdout_has(&format!("payload sha256 {digest}"))
        .stdout_has(&format!(
            "1 artifact ({} bytes) match the signed manifest",
            library(b"scan v1").len()
        ));

    b.run(&["install", "scan.gkmodule"])
        .expect(0)
        .stdout_has(&format!(
            "installed example.scan 1.0.0 (gkmodule) signed by org.example key {}…; enabled",
            &kid[..12]
        ));
    b.run(&["install", "scan.gkmodule"])
        .expect(0)
        .stdout_has("already installed with this exact content");

    // A second version supersedes the first.
    let v2 = b.package("example.scan", "1.1.0", b"scan v2", "");
    b.run(&["install", &v2])
        .expect(0)
        .stdout_has("installed example.scan 1.1.0")
        .stdout_has("superseded example.scan 1.0.0; `guild rollback example.scan` returns to it");
    let list = b.run(&["list"]);
    list.expect(0);
    assert_eq!(
        words(&list.stdout),
        [
            "ID CURRENT STATE KIND PUBLISHER SIGNED BY KEY".to_owned(),
            format!(
                "example.scan 1.1.0 (previous 1.0.0) enabled gkmodule org.example {}",
                key_id(&b)
            )
        ]
    );
    b.run(&["status", "example.scan"])
        .expect(0)
        .stdout_has("example.scan (gkmodule, publisher org.example)")
        .stdout_has("1.0.0        superseded")
        .stdout_has("1.1.0        enabled")
        .stdout_has("previous version: 1.0.0");
    b.run(&["status"])
        .expect(0)
        .stdout_has("packages: 1 (1 enabled, 0 disabled), 2 installed versions")
        .stdout_has("trust: 1 publisher(s), 1 key(s)");

    b.run(&["disable", "example.scan"])
        .expect(0)
        .stdout_has("disabled example.scan 1.1.0");
    b.run(&["enable", "example.scan"])
        .expect(0)
        .stdout_has("enabled example.scan 1.1.0");
    b.run(&["rollback", "example.scan"])
        .expect(0)
        .stdout_has("rolled example.scan back from 1.1.0 to 1.0.0; enabled");
    b.run(&["remove", "example.scan", "--version", "1.1.0"])
        .expect(0)
        .stdout_has("removed example.scan 1.1.0");
    b.run(&["rollback", "example.scan"])
        .expect(4)
        .stderr_has("example.scan has no previous version to roll back to");

    let list = b.run(&["--json", "list"]);
    list.expect(0);
    let list = list.json();
    assert_eq!(list["command"], "list");
    let p = &list["packages"][0];
    assert_eq!(p["id"], "example.scan");
    assert_eq!(p["enabled"], "1.0.0");
    assert_eq!(p["previous"], Value::Null);
    let states: Vec<(&str, &str)> = p["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["version"].as_str().unwrap(), v["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("1.0.0", "enabled"), ("1.1.0", "removed")]);
    assert_eq!(p["versions"][0]["payload_sha256"], digest.as_str());
}

#[test]
fn cli_every_documented_exit_code() {
    let b = Bench::new(guild());
    b.trust();
    let a = b.package("example.base", "1.0.0", b"base", "");
    let dep = r#", "dependencies": [{"package_id": "example.base", "min_version": "1.0.0"}]"#;
    let user = b.package("example.user", "1.0.0", b"user", dep);
    let newer = b.package("example.base", "2.0.0", b"base 2", "");
    // 4 first: a dependency that is not installed.
    b.run(&["install", &user])
        .expect(4)
        .stderr_has("example.user@1.0.0 requires example.base 1.0.0.., but example.base is not installed")
        .stderr_has("hint: install and enable a version of example.base that example.user@1.0.0 accepts first");
    // 0: success.
    b.run(&["install", &a]).expect(0);
    b.run(&["install", &user]).expect(0);
    // 1: an unexpected failure (the key prefix's directory is a regular file).
    fs::write(b.path().join("plain"), b"").unwrap();
    b.run(&["keygen", "--out", "plain/k"])
        .expect(1)
        .stderr_has("error: cannot create");
    // 2: usage errors, from clap and from the id grammar.
    b.run(&["install"]).expect(2);
    b.run(&["enable", "Not..An.Id"]).expect(2);
    b.run(&["trust", "revoke-key", "abc"]).expect(2);
    // 3: a tampered package.
    let tampered = tamper(&b, &newer, b"base 2", b"BASE 2");
    b.run(&["install", &tampered])
        .expect(3)
        .stderr_has("SHA-256 is")
        .stderr_has("hint: the package's files do not match its signed manifest");
    // 4: refused by policy: a dependency, a downgrade, an existing key file.
    b.run(&["disable", "example.base"])
        .expect(4)
        .stderr_has(
            "error: cannot disable example.base: enabled packages depend on it: example.user@1.0.0",
        )
        .stderr_has("hint: disable the dependents first: guild disable example.user");
    b.run(&["install", &newer]).expect(0);
    let older = b.package("example.base", "0.9.0", b"base 0", "");
    b.run(&["install", &older])
        .expect(4)
        .stderr_has("older than the current version 2.0.0")
        .stderr_has("hint: to return to the previous version run `guild rollback example.base`");
    b.run(&["keygen", "--out", "k"])
        .expect(4)
        .stderr_has("hint: pass --force");
    // 5: the store is unusable (a corrupt registry).
    let registry = b.store().join("registry.json");
    let good = fs::read(&registry).unwrap();
    // `status ID` reads one package's record and passes over the others', but not over
    // damage to the file (the log's case below damages the others' records).
    let cut = good[..good.len() / 2].to_vec();
    for bad in [&b"{not json"[..], &cut] {
        fs::write(&registry, bad).unwrap();
        for args in [&["list"][..], &["status", "example.base"], &["status"]] {
            b.run(args)
                .expect(5)
                .stderr_has("error: store file is corrupt")
                .stderr_has("registry.json")
                .stderr_has("hint: the store refuses to guess: restore the damaged file");
        }
    }
    fs::write(&registry, good).unwrap();
    // ... and so is one whose registry log has a damaged frame length in the middle (G27): no
    // command takes the frames before it for the whole store, and none cuts the log or deletes
    // an installed tree.
    let log = b.store().join("registry.log");
    let good = fs::read(&log).unwrap();
    let mut starts = vec![48];
    while let Some(len) = good
        .get(starts[starts.len() - 1]..)
        .and_then(|f| f.get(..4))
    {
        let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
        starts.push(starts[starts.len() - 1] + 36 + len);
    }
    assert!(starts.len() >= 4, "at least three frames: {starts:?}");
    let middle = starts[starts.len() / 2 - 1];
    let mut bad = good.clone();
    bad[middle + 2] ^= 0x10;
    fs::write(&log, &bad).unwrap();
    let trees = b.store().join("packages").join("example.user");
    assert!(trees.is_dir());
    for args in [
        &["list"][..],
        &["status", "example.base"],
        &["status", "example.user"],
        &["recover"],
    ] {
        b.run(args)
            .expect(5)
            .stderr_has("error: store file is corrupt: read registry log")
            .stderr_has(&format!("registry.log): at byte offset {middle}: "))
            .stderr_has("hint: the store refuses to guess: restore the damaged file");
    }
    assert_eq!(fs::read(&log).unwrap(), bad, "nothing cut the log");
    assert!(trees.is_dir(), "nothing deleted a tree");
    fs::write(&log, good).unwrap();
    b.run(&["list"]).expect(0).stdout_has("example.user");
    // 6: not found: a package id, a package file, a key file.
    b.run(&["enable", "example.nothing"])
        .expect(6)
        .stderr_has("hint: see what is installed with `guild list`");
    b.run(&["install", "missing.gkmodule"]).expect(6);
    b.run(&["sign", &a, "--key", "missing.key"]).expect(6);
    b.run(&["status", "example.nothing"]).expect(6);

    // The codes are documented in the help.
    let help = b.run(&["--help"]);
    help.expect(0).stdout_has("Exit codes:");
    for code in 0..=6 {
        help.stdout_has(&format!("\n  {code}  "));
    }
}

#[test]
fn cli_a_key_of_the_wrong_kind_gets_a_hint_for_the_kind_the_command_takes() {
    let b = Bench::new(guild());
    // A private key where a publisher's public key belongs: the hint must not say that a
    // private key would do.
    let run = b.run(&["trust", "add", "org.example", "k.key"]);
    run.expect(3)
        .stderr_has("expected PUBLIC KEY")
        .stderr_has("hint: `trust add` takes the publisher's public key");
    assert!(!run.stderr.contains("private key, or"), "{}", run.stderr);
    // And a public key where signing needs the private one.
    let archive = b.package("example.keys", "1.0.0", b"keys v1", "");
    b.run(&["sign", &archive, "--key", "k.pub"])
        .expect(3)
        .stderr_has("expected PRIVATE KEY")
        .stderr_has("hint: signing takes the publisher's private key");
}

/// A trusted bench with `example.scan` 1.0.0 installed and then superseded by 1.1.0; the
/// archive of 1.0.0.
fn two_versions_installed() -> (Bench, String) {
    let b = Bench::new(guild());
    b.trust();
    let v1 = b.package("example.scan", "1.0.0", b"scan v1", "");
    let v2 = b.package("example.scan", "1.1.0", b"scan v2", "");
    b.run(&["install", &v1]).expect(0);
    b.run(&["install", &v2]).expect(0);
    (b, v1)
}

#[test]
fn cli_superseded_versions_say_where_they_stand_and_how_to_go_forward() {
    let (b, v1) = two_versions_installed();
    // Offering the superseded 1.0.0 again changes nothing, and says it is superseded (not
    // merely "disabled") and what would bring it back.
    let again = b.run(&["install", &v1]);
    again
        .expect(0)
        .stdout_has("superseded by 1.1.0")
        .stdout_has("guild rollback example.scan");
    assert!(!again.stdout.contains("(disabled)"), "{}", again.stdout);
    // After a rollback, 1.1.0 is superseded; another rollback has nowhere to go back to, and
    // says how to go forward again.
    b.run(&["rollback", "example.scan"]).expect(0);
    b.run(&["rollback", "example.scan"])
        .expect(4)
        .stderr_has("hint:")
        .stderr_has("install its package again");
}

#[test]
fn cli_enable_after_removing_the_current_version_says_what_works() {
    let (b, _) = two_versions_installed();
    b.run(&["remove", "example.scan"]).expect(0);
    let enable = b.run(&["enable", "example.scan"]);
    assert_ne!(enable.code, 0, "{}", enable.stdout);
    enable
        .stderr_has("hint:")
        .stderr_has("guild rollback example.scan");
}

#[test]
fn cli_purge_forgets_removed_versions_and_with_them_the_immutability_promise() {
    let (b, _) = two_versions_installed();
    let other = b.package("example.scan", "1.0.0", b"other content", "");
    b.run(&["remove", "example.scan", "--version", "1.0.0"])
        .expect(0);
    // The removed record keeps 1.0.0 from returning with other content.
    b.run(&["install", "--allow-downgrade", &other])
        .expect(4)
        .stderr_has("immutable");

    // An installed version is refused with the command that comes first, an unknown one is
    // not found, and neither changes anything.
    let before = b.run(&["--json", "list"]).stdout;
    b.run(&["purge", "example.scan", "--version", "1.1.0"])
        .expect(4)
        .stderr_has("is enabled, not removed")
        .stderr_has("guild remove example.scan --version 1.1.0");
    b.run(&["purge", "example.scan", "--version", "9.9.9"])
        .expect(6);
    assert_eq!(b.run(&["--json", "list"]).stdout, before);

    // Purged, 1.0.0 leaves status, and the version is free for other content.
    let purged = b.run(&["--json", "purge", "example.scan"]);
    purged.expect(0);
    assert_eq!(purged.json()["purged"], serde_json::json!(["1.0.0"]));
    // Nothing removed is left to purge: not found, with where to look.
    b.run(&["purge", "example.scan"])
        .expect(6)
        .stderr_has("example.scan has no removed version to purge")
        .stderr_has("guild status example.scan");
    let status = b.run(&["--json", "status", "example.scan"]);
    status.expect(0);
    assert!(!status.stdout.contains("\"1.0.0\""), "{}", status.stdout);
    b.run(&["install", "--allow-downgrade", "--disabled", &other])
        .expect(0);

    // With every version removed and purged, the package is gone from the store.
    b.run(&["remove", "example.scan", "--version", "1.0.0"])
        .expect(0);
    b.run(&["remove", "example.scan", "--version", "1.1.0"])
        .expect(0);
    b.run(&["purge", "example.scan"])
        .expect(0)
        .stdout_has("purged example.scan 1.0.0, 1.1.0");
    b.run(&["list"])
        .expect(0)
        .stdout_has("no packages installed");
    b.run(&["status", "example.scan"]).expect(6);
    b.run(&["verify", "--all"]).expect(0);
}

#[test]
fn cli_locked_store_exits_5_with_a_hint() {
    let b = Bench::new(guild());
    b.trust();
    let pkg = b.package("example.scan", "1.0.0", b"scan", "");
    b.run(&["list"]).expect(0);
    // A writer's package manager holds the store's lock for its life, as a `guild` command
    // that changes the store does: another writer waits, then gives up.
    let (pm, _) = guild_host::PackageManager::open_dir(&b.store()).unwrap();
    b.run(&["install", &pkg])
        .expect(5)
        .stderr_has("store is locked")
        .stderr_has("hint: another guild command");
    // Reading needs no lock.
    b.run(&["list"]).expect(0);
    drop(pm);
    b.run(&["install", &pkg]).expect(0);
}

#[test]
fn cli_reads_and_changes_a_store_that_a_runner_has_open() {
    let b = Bench::new(guild());
    b.trust();
    let pkg = b.package("example.scan", "1.0.0", b"scan", "");
    b.run(&["list"]).expect(0);
    // A runner's host, open for as long as the runner serves.
    let opened = guild_host::Host::builder(b.store())
        .devices(guild_host::DeviceSupport::host())
        .open()
        .unwrap();
    b.run(&["list"]).expect(0);
    b.run(&["status"]).expect(0);
    b.run(&["install", &pkg]).expect(0);
    b.run(&["disable", "example.scan"]).expect(0);
    b.run(&["list"]).expect(0).stdout_has("example.scan");
    drop(opened);
}

#[test]
fn cli_json_documents_and_json_errors() {
    let b = Bench::new(guild());
    let pkg = b.package("example.scan", "1.0.0", b"scan", "");

    // Errors on stderr as JSON, stdout empty.
    let refused = b.run(&["--json", "install", &pkg]);
    refused.expect(3);
    assert!(refused.stdout.is_empty());
    let e = refused.error_json();
    assert_eq!(e["category"], "rejected");
    assert_eq!(e["exit_code"], 3);
    assert!(e["message"]
        .as_str()
        .unwrap()
        .contains("is not authenticated"));
    assert!(e["causes"].is_array());
    assert!(e["hint"]
        .as_str()
        .unwrap()
        .contains("guild trust add org.example"));
    let usage = b.run(&["--json", "enable", "Bad"]);
    usage.expect(2);
    assert_eq!(usage.error_json()["category"], "usage");
    let missing = b.run(&["--json", "enable", "example.none"]);
    missing.expect(6);
    assert_eq!(missing.error_json()["category"], "not_found");
    assert_eq!(
        missing.error_json()["hint"],
        "see what is installed with `guild list`"
    );

    let trusted = b.run(&["--json", "trust", "add", "org.example", "k.pub"]);
    trusted.expect(0);
    let t = trusted.json();
    assert_eq!(t["command"], "trust add");
    assert_eq!(t["added"], true);
    assert_eq!(t["warnings"], serde_json::json!([]));
    let kid = key_id(&b);
    assert_eq!(t["key_id"], kid.as_str());

    let verified = b.run(&["--json", "verify", &pkg]);
    verified.expect(0);
    let v = verified.json();
    for field in [
        "package_id",
        "version",
        "kind",
        "publisher",
        "key_id",
        "payload_sha256",
        "artifacts",
        "platform",
    ] {
        assert!(!v[field].is_null(), "verify lacks {field}: {v}");
    }
    assert_eq!(v["platform"]["installable"], true);
    assert_eq!(v["artifacts"][0]["path"], "libplugin.so");
    assert_eq!(v["artifacts"][0]["size"], library(b"scan").len());

    let installed = b.run(&["--json", "install", &pkg]);
    installed.expect(0);
    let i = installed.json();
    assert_eq!(i["package_id"], "example.scan");
    assert_eq!(i["version"], "1.0.0");
    assert_eq!(i["changed"], true);
    assert_eq!(i["enabled"], true);
    assert_eq!(i["key_id"], kid.as_str());
    assert_eq!(i["payload_sha256"], v["payload_sha256"]);
    assert_eq!(i["superseded"], Value::Null);

    let status = b.run(&["--json", "status"]);
    status.expect(0);
    let s = status.json();
    // Two commits: the trust file (recorded in the registry) and the install.
    assert_eq!(s["generation"], 2);
    assert_eq!(s["counts"]["packages"], 1);
    assert_eq!(s["counts"]["enabled"], 1);
    assert_eq!(s["counts"]["trusted_keys"], 1);
    assert_eq!(s["open"]["recovery"]["clean"], true);
    // `status` reads the committed state: it checks no signature.
    assert_eq!(s["open"]["committed_only"], true);
    assert_eq!(s["open"]["reauthenticated"], 0);

    let one = b.run(&["--json", "status", "example.scan"]);
    one.expect(0);
    let path = one.json()["package"]["versions"][0]["path"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(Path::new(&path).join(".gkmetadata").is_file(), "{path}");

    let recovered = b.run(&["--json", "recover"]);
    recovered.expect(0);
    assert_eq!(
        recovered.json()["open"]["recovery"]["rolled_back"],
        serde_json::json!([])
    );

    for args in [
        &["--json", "disable", "example.scan"][..],
        &["--json", "enable", "example.scan"],
        &["--json", "trust", "list"],
        &["--json", "list"],
    ] {
        let r = b.run(args);
        r.expect(0);
        let doc = r.json();
        assert!(doc["command"].is_string(), "{doc}");
        assert!(doc["warnings"].is_array(), "{doc}");
    }

    // --quiet prints nothing on success.
    let quiet = b.run(&["--quiet", "list"]);
    quiet.expect(0);
    assert!(quiet.stdout.is_empty() && quiet.stderr.is_empty());
}

#[test]
fn cli_verify_leaves_no_temporary_files() {
    let b = Bench::new(guild());
    b.trust();
    let pkg = b.package("example.scan", "1.0.0", b"genuine bytes", "");
    let bad = tamper(&b, &pkg, b"genuine", b"forged!");
    let tmp = b.path().join("tmp");
    fs::create_dir(&tmp).unwrap();
    let store_before = tree(&b.store());

    let verify = |archive: &str| {
        let store = b.store();
        let mut cmd = guild().command(
            b.path(),
            &["--store", store.to_str().unwrap(), "verify", archive],
        );
        cmd.env("TMPDIR", &tmp);
        Run::from(cmd.output().unwrap())
    };
    verify(&bad)
        .expect(3)
        .stderr_has("member \"libplugin.so\": SHA-256 is");
    assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0, "verify left files");
    verify(&pkg).expect(0);
    assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0, "verify left files");
    // Nothing in the store changed.
    assert_eq!(tree(&b.store()), store_before);
}

/// Every path under `dir` with its size, to compare a directory before and after.
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), meta.len()));
        }
    }
    out.sort();
    out
}

#[test]
fn cli_revoking_a_key_disables_what_it_signed() {
    let b = Bench::new(guild());
    b.trust();
    let pkg = b.package("example.scan", "1.0.0", b"scan", "");
    b.run(&["install", &pkg]).expect(0);
    let extra = b.package("example.extra", "1.0.0", b"extra", "");
    let extra_digest = b.run(&["--json", "install", &extra]).json()["payload_sha256"]
        .as_str()
        .unwrap()
        .to_owned();

    // Revoking one payload disables exactly that package.
    let revoked = b.run(&["--json", "trust", "revoke-package", &extra_digest]);
    revoked.expect(0);
    let r = revoked.json();
    assert_eq!(r["sha256"], extra_digest.as_str());
    assert_eq!(r["reason"], "revoked by the operator");
    assert_eq!(r["disabled"].as_array().unwrap().len(), 1);
    assert_eq!(r["disabled"][0]["id"], "example.extra");
    assert_eq!(r["warnings"], serde_json::json!([]));
    b.run(&["install", &extra])
        .expect(3)
        .stderr_has("is revoked (revoked by the operator)")
        .stderr_has("hint: this exact package was revoked");
    let unknown = "ab".repeat(32);
    let ahead = b.run(&["--json", "trust", "revoke-package", &unknown]);
    ahead.expect(0);
    assert!(ahead.json()["warnings"][0]
        .as_str()
        .unwrap()
        .starts_with("no recorded package has payload abababababab"));

    let kid = key_id(&b);
    let revoked = b.run(&["--json", "trust", "revoke-key", &kid, "--reason", "leaked"]);
    revoked.expect(0);
    let r = revoked.json();
    assert_eq!(r["newly_revoked"], true);
    assert_eq!(r["disabled"][0]["id"], "example.scan");
    b.run(&["trust", "list"])
        .expect(0)
        .stdout_has(&format!("key {kid} (revoked)"))
        .stdout_has(&format!("revoked key {kid} (leaked)"));
    b.run(&["list"]).expect(0).stdout_has("disabled");
    // It cannot come back while its key is revoked.
    b.run(&["enable", "example.scan"])
        .expect(3)
        .stderr_has("the key is revoked (leaked)");
    let other = b.package("example.other", "1.0.0", b"other", "");
    b.run(&["install", &other])
        .expect(3)
        .stderr_has("the key is revoked (leaked)")
        .stderr_has("hint: its keys are revoked");
    b.run(&["trust", "add", "org.example", "k.pub"])
        .expect(4)
        .stderr_has("hint: a revoked key is never trusted again");
}

#[test]
fn cli_keygen_force_replaces_the_pair() {
    let b = Bench::new(guild());
    let before = fs::read(b.path().join("k.pub")).unwrap();
    b.run(&["keygen", "--out", "k"]).expect(4);
    assert_eq!(fs::read(b.path().join("k.pub")).unwrap(), before);
    let out = b.run(&["--json", "keygen", "--out", "k", "--force"]);
    out.expect(0);
    assert_ne!(fs::read(b.path().join("k.pub")).unwrap(), before);
    let id = out.json()["key_id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 64);
}

#[test]
fn cli_only_the_full_check_finds_a_changed_library_and_a_stripped_signature() {
    let b = Bench::new(guild());
    b.trust();
    let pkg = b.package("example.scan", "1.0.0", b"scan", "");
    b.run(&["install", &pkg]).expect(0);
    let other = b.package("example.other", "1.0.0", b"other", "");
    b.run(&["install", &other]).expect(0);
    // Damage the installed library of one behind the store's back, and strip the other's
    // signatures (its payload, and so the digest the registry records, stays the same).
    make_writable(&b.store());
    fs::write(
        b.store().join("packages/example.scan/1.0.0/libplugin.so"),
        b"SCAN",
    )
    .unwrap();
    let meta = b.store().join("packages/example.other/1.0.0/.gkmetadata");
    let mut doc: Value = serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
    doc["signatures"] = Value::Array(Vec::new());
    fs::write(&meta, serde_json::to_vec(&doc).unwrap()).unwrap();

    // `list`, `status` and `status ID` read the committed state: they check neither.
    for args in [&["list"][..], &["status"], &["status", "example.scan"]] {
        let run = b.run(args);
        run.expect(0);
        assert!(
            !run.stderr.contains("not usable"),
            "{args:?}: {}",
            run.stderr
        );
    }
    let listed = b.run(&["list"]);
    assert_eq!(
        words(&listed.stdout)[2],
        format!(
            "example.scan 1.0.0 enabled gkmodule org.example {}",
            key_id(&b)
        )
    );
    // The stripped one shows the key the store recorded when it verified the version at
    // installation: `list` reads the store's record, not the files (the full check below is
    // what finds the stripped signature).
    assert_eq!(
        words(&listed.stdout)[1],
        format!(
            "example.other 1.0.0 enabled gkmodule org.example {}",
            key_id(&b)
        )
    );
    // Nor does a writer's open, while the trust file is unchanged.
    let recovered = b.run(&["--json", "recover"]);
    recovered.expect(0);
    assert_eq!(recovered.json()["open"]["disabled"], serde_json::json!([]));
    assert_eq!(recovered.json()["open"]["reauthenticated"], 0);

    // `doctor --deep` finds both and names the files, and records nothing.
    let doctor = b.run(&["doctor", "--deep", "--jobs", "2"]);
    doctor
        .expect(1)
        .stdout_has("fail  verify")
        .stdout_has("example.scan 1.0.0 (enabled) file libplugin.so: installed files do not match")
        .stdout_has("example.other 1.0.0 (enabled) file .gkmetadata: no longer authenticated");
    let listed = b.run(&["list"]);
    assert_eq!(
        words(&listed.stdout)[2],
        format!(
            "example.scan 1.0.0 enabled gkmodule org.example {}",
            key_id(&b)
        )
    );

    // `verify --all` finds both and disables them, tainted with the file.
    let verified = b.run(&["--json", "verify", "--all"]);
    verified.expect(1);
    let v = verified.json();
    let found: Vec<(String, String)> = v["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["package_id"].as_str().unwrap().to_owned(),
                f["file"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("example.other".to_owned(), ".gkmetadata".to_owned()),
            ("example.scan".to_owned(), "libplugin.so".to_owned())
        ],
        "{v}"
    );
    assert_eq!(v["checked"], 2);
    assert_eq!(v["recorded"], true);
    let listed = b.run(&["list"]);
    assert_eq!(
        words(&listed.stdout)[2],
        format!(
            "example.scan 1.0.0 disabled (tainted) gkmodule org.example {}",
            key_id(&b)
        )
    );
    // A package cannot be both named and --all.
    b.run(&["verify", "--all", &pkg]).expect(2);
    b.run(&["verify"]).expect(2);
}

#[test]
fn cli_store_location_from_the_environment() {
    let dir = Scratch::new();
    let status = |envs: &[(&str, &Path)]| {
        let mut cmd = guild().command(dir.path(), &["--json", "status"]);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let run = Run::from(cmd.output().unwrap());
        run.expect(0);
        PathBuf::from(run.json()["store"].as_str().unwrap())
    };
    let home = dir.path().join("home");
    fs::create_dir(&home).unwrap();
    let explicit = dir.path().join("explicit");
    let xdg = dir.path().join("xdg");
    assert_eq!(
        status(&[("GUILD_STORE", &explicit), ("HOME", &home)]),
        explicit
    );
    assert_eq!(
        status(&[("XDG_DATA_HOME", &xdg), ("HOME", &home)]),
        xdg.join("guild")
    );
    // A fresh account has no ~/.local/share yet; it is created for the default store.
    let default = home.join(".local/share/guild");
    assert_eq!(status(&[("HOME", &home)]), default);
    assert!(default.is_dir());
    // --store wins over everything.
    let run = guild().run(
        dir.path(),
        &["--store", explicit.to_str().unwrap(), "--json", "status"],
    );
    assert_eq!(run.json()["store"], explicit.to_str().unwrap());
}

/// `list` and `status ID` show the key each installed version is signed by, in text and JSON:
/// the key a lock records and `guild sync` holds the store to.
#[test]
fn cli_list_and_status_show_the_signing_key_of_each_installed_version() {
    let b = Bench::new(guild());
    b.trust();
    let key = key_id(&b);
    let scan = b.package("example.scan", "1.0.0", b"scan", "");
    b.run(&["install", &scan]).expect(0);
    let newer = b.package("example.scan", "1.1.0", b"scan 1.1", "");
    b.run(&["install", &newer]).expect(0);
    let listed = b.run(&["list"]);
    listed
        .expect(0)
        .stdout_has("SIGNED BY KEY")
        .stdout_has(&key);
    let json = b.run(&["--json", "list"]).expect(0).json();
    let versions = json["packages"][0]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{json}");
    for v in versions {
        assert_eq!(v["key_ids"], serde_json::json!([key]), "{json}");
    }
    b.run(&["status", "example.scan"])
        .expect(0)
        .stdout_has(&format!("signed by key {key}"));
    // A removed version has no files, so no key to show.
    b.run(&["remove", "example.scan", "--version", "1.0.0"])
        .expect(0);
    let status = b
        .run(&["--json", "status", "example.scan"])
        .expect(0)
        .json();
    let versions = status["package"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{status}");
    for v in versions {
        let want = if v["version"] == "1.0.0" {
            serde_json::Value::Null
        } else {
            serde_json::json!([key])
        };
        assert_eq!(v["key_ids"], want, "{status}");
    }
}

/// `--store DIR` whose parent directory does not exist: not found (6), naming the missing
/// parent, with a hint about the path, not about recovering a store.
#[test]
fn cli_a_store_whose_parent_is_missing_is_named_not_recovered() {
    let b = Bench::new(guild());
    let store = b.path().join("no-such-dir/store");
    let args = [
        "--store",
        store.to_str().unwrap(),
        "trust",
        "add",
        "org.example",
        "k.pub",
    ];
    let r = b.guild().run(b.path(), &args);
    assert_eq!(r.code, 6, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "its parent directory {} does not exist",
            b.path().join("no-such-dir").display()
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("recover"), "{}", r.stderr);
    assert!(r.stderr.contains("--store"), "{}", r.stderr);
    assert!(!b.path().join("no-such-dir").exists());
    // The same through GUILD_STORE, for a command that only reads.
    let r = Run::from(
        b.guild()
            .command(b.path(), &["list"])
            .env("GUILD_STORE", &store)
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, 6, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("GUILD_STORE"), "{}", r.stderr);
}

/// Output that cannot be written is a failure the exit code says (a full disk: `/dev/full`),
/// for the streamed table and the `--json` document alike; a reader that closed the pipe once
/// it had what it wanted (`guild list | head -1`) is not.
#[test]
fn output_that_cannot_be_written_fails_but_a_closed_pipe_does_not() {
    let b = Bench::new(guild());
    b.run(&["trust", "add", "org.example", "k.pub"]).expect(0);
    let scan = b.package("example.scan", "1.0.0", b"scan v1", "");
    b.run(&["install", &scan]).expect(0);
    let store = b.store();
    let run = |args: &[&str], stdout: std::process::Stdio| {
        let mut all = vec!["--store", store.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = guild()
            .command(b.path(), &all)
            .stdout(stdout)
            .output()
            .unwrap();
        Run::from(out)
    };
    let full = || {
        std::process::Stdio::from(
            fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
    };
    for args in [
        &["list"][..],
        &["--json", "list"],
        &["status", "example.scan"],
    ] {
        let written = run(args, full());
        assert_eq!(written.code, 1, "{args:?}: {}", written.stderr);
        assert!(
            written
                .stderr
                .contains("its output could not be written to standard output"),
            "{args:?}: {}",
            written.stderr
        );
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let closed = run(args, writer.into());
        assert_eq!(closed.code, 0, "{args:?}: {}", closed.stderr);
        assert_eq!(closed.stderr, "", "{args:?}");
    }
}
