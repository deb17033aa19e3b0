//! `guild sync LOCK --from DIR` without a registry, as an operator runs it: a sync that fails
//! part way exits with its code and leaves the store as it was, and a sync removes its staging
//! area and those of syncs that died. guild-host's tests/it/lock_sync.rs fails each step of the
//! library's sync in turn.

use std::fs;

use guild_test_support::guild::{Bench, Run};
use guild_test_support::store_files;

use crate::guild;

#[test]
fn sync_that_fails_at_an_install_leaves_the_store_as_it_was() {
    let bench = Bench::new(guild());
    let base = bench.package("example.base", "1.0.0", b"base", "");
    let dep = r#", "dependencies": [{"package_id": "example.base", "min_version": "1.0.0"}]"#;
    let user = bench.package("example.user", "1.0.0", b"user", dep);
    let alpha = bench.package("example.alpha", "1.0.0", b"alpha", "");
    // The lock names alpha and user but not base, which user needs: installing user fails
    // after alpha could have been installed and the unlocked package disabled.
    let lock = bench.lock_of(&[&base, &user, &alpha], &["example.base"]);
    let fresh = bench.trusting_store("fresh");
    let extra = bench.package("example.extra", "1.0.0", b"extra", "");
    bench.run_on(&fresh, &["install", &extra]).expect(0);
    let before = store_files(&fresh);
    let listed_before = bench.listed(&fresh);
    let r = bench.run_on(
        &fresh,
        &[
            "sync",
            lock.to_str().unwrap(),
            "--from",
            bench.path().to_str().unwrap(),
            // The unlocked package is meant to be disabled.
            "--allow-shrink",
        ],
    );
    assert_eq!(r.code, 4, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("example.user"), "{}", r.stderr);
    assert_eq!(bench.listed(&fresh), listed_before, "the registry changed");
    assert_eq!(store_files(&fresh), before, "the store's files changed");
}

#[test]
fn sync_removes_its_staging_area_and_those_of_syncs_that_died() {
    let bench = Bench::new(guild());
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let lock = bench.lock_of(&[&scan], &[]);
    let fresh = bench.trusting_store("fresh");
    // What a sync killed while it downloaded leaves: a staging area whose lock nobody holds.
    let base = fresh.join(guild_host::lock_sync::STAGING_DIR);
    fs::create_dir_all(base.join("4242-0")).unwrap();
    fs::write(base.join("4242-0/example.scan-1.0.0.gkmodule"), b"half").unwrap();
    fs::write(base.join("4242-0.lock"), b"").unwrap();
    // A live sync's area stays: its lock is held.
    let live = base.join("4343-0.lock");
    fs::write(&live, b"").unwrap();
    fs::create_dir(base.join("4343-0")).unwrap();
    let held = fs::File::open(&live).unwrap();
    held.lock().unwrap();
    bench
        .run_on(
            &fresh,
            &[
                "sync",
                lock.to_str().unwrap(),
                "--from",
                bench.path().to_str().unwrap(),
            ],
        )
        .expect(0);
    let mut left: Vec<String> = fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["4343-0", "4343-0.lock"]);
    // Once the live one is gone too, nothing of the staging areas is left after a sync.
    drop(held);
    bench
        .run_on(
            &fresh,
            &[
                "sync",
                lock.to_str().unwrap(),
                "--from",
                bench.path().to_str().unwrap(),
            ],
        )
        .expect(0);
    assert!(!base.exists(), "{} is still there", base.display());
}

/// The processes whose command line holds every one of `words`, by pid.
fn processes_with(words: &[&str]) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if words.iter().all(|w| args.iter().any(|a| a == w)) {
            found.push(pid);
        }
    }
    found
}

/// `guild sync` killed with SIGKILL between its changes (here: while the registration check of
/// the second package it installs runs, after the unlocked package's disable and the first
/// install were decided) leaves, once the store is opened again, the state before the sync:
/// none of its changes, whatever had been decided before the kill.
#[test]
fn sync_killed_between_its_changes_leaves_the_old_state() {
    use std::time::{Duration, Instant};

    let bench = Bench::new(guild());
    let base = bench.package("example.base", "1.0.0", b"base", "");
    // Its init sleeps three seconds: long enough to be found and killed during its check.
    let slow_library = guild_test_support::plugins::plugin_library("init_slow");
    let slow = bench.package("example.zslow", "1.0.0", &slow_library, "");
    let lock = bench.lock_of(&[&base, &slow], &[]);
    let locked: serde_json::Value = serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
    let slow_payload = locked["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "example.zslow")
        .and_then(|p| p["payload_sha256"].as_str())
        .unwrap()
        .to_owned();
    let store = bench.trusting_store("fresh");
    let extra = bench.package("example.extra", "1.0.0", b"extra", "");
    bench.run_on(&store, &["install", &extra]).expect(0);
    let listed_before = bench.listed(&store);

    let mut sync = bench
        .guild()
        .command(
            bench.path(),
            &[
                "--store",
                store.to_str().unwrap(),
                "sync",
                lock.to_str().unwrap(),
                "--from",
                bench.path().to_str().unwrap(),
                "--allow-shrink",
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let checking = loop {
        let found = processes_with(&["__check-library", &slow_payload]);
        if !found.is_empty() {
            break found;
        }
        if let Some(status) = sync.try_wait().unwrap() {
            panic!("the sync ended ({status}) before the slow package's check was seen");
        }
        assert!(
            Instant::now() < deadline,
            "the slow package's check never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    sync.kill().unwrap();
    sync.wait().unwrap();
    for pid in checking {
        // The check child of the killed sync; it would sleep out its init otherwise.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    // `guild list` reads what is committed; a writer's open recovers first.
    assert_eq!(
        bench.listed(&store),
        listed_before,
        "the killed sync left part of its changes"
    );
    bench.run_on(&store, &["verify", "--all"]).expect(0);
    assert_eq!(bench.listed(&store), listed_before, "after recovery");
}

/// `guild sync LOCK --from BENCH` on `store`, with `extra` arguments.
fn sync_from(
    bench: &Bench,
    store: &std::path::Path,
    lock: &std::path::Path,
    extra: &[&str],
) -> Run {
    let mut args = vec![
        "sync",
        lock.to_str().unwrap(),
        "--from",
        bench.path().to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    bench.run_on(store, &args)
}

/// A second key pair `k2` in the bench, trusted for `org.example` in `stores`; its key id.
fn second_key(bench: &Bench, stores: &[&std::path::Path]) -> String {
    let id = bench
        .run(&["--json", "keygen", "--out", "k2"])
        .expect(0)
        .json()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for store in stores {
        bench
            .run_on(store, &["trust", "add", "org.example", "k2.pub"])
            .expect(0);
    }
    id
}

/// Packs `id@version` (the same files and template as `bench.package`, so the same payload)
/// signed by `k2` only, as `NAME`.
fn package_signed_by_k2(bench: &Bench, id: &str, version: &str, content: &[u8], name: &str) {
    let (src, template) = bench.source(id, version, content, "");
    bench
        .run(&[
            "pack",
            src.to_str().unwrap(),
            "--manifest",
            template.to_str().unwrap(),
            "--out",
            name,
            "--key",
            "k2.key",
        ])
        .expect(0);
}

/// The key id the lock at `path` records for `id`.
fn locked_key(path: &std::path::Path, id: &str) -> String {
    let lock: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    lock["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A server that missed a key rotation keeps the build signed by the old key: the lock, made
/// where the package is signed by the new key, names the new key, and a sync refuses the store's
/// build instead of saying it already matches.
#[test]
fn sync_refuses_an_installed_version_signed_by_another_key_than_the_lock_names() {
    let bench = Bench::new(guild());
    let server = bench.trusting_store("server");
    let origin = bench.trusting_store("origin");
    let k2 = second_key(&bench, &[&server, &origin]);
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    bench.run_on(&server, &["install", &scan]).expect(0);
    package_signed_by_k2(
        &bench,
        "example.scan",
        "1.0.0",
        b"scan",
        "scan-by-k2.gkmodule",
    );
    bench
        .run_on(&origin, &["install", "scan-by-k2.gkmodule"])
        .expect(0);
    let lock = bench.path().join("rotated.lock");
    bench
        .run_on(&origin, &["lock", "--out", lock.to_str().unwrap()])
        .expect(0);
    assert_eq!(locked_key(&lock, "example.scan"), k2);
    let old_lock = bench.path().join("old.lock");
    bench
        .run_on(&server, &["lock", "--out", old_lock.to_str().unwrap()])
        .expect(0);
    let k1 = locked_key(&old_lock, "example.scan");
    assert_ne!(k1, k2);
    let before = store_files(&server);
    let r = sync_from(&bench, &server, &lock, &[]);
    assert_eq!(r.code, 4, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    for says in ["example.scan 1.0.0", &k1, &k2] {
        assert!(
            r.stderr.contains(says),
            "stderr lacks {says}:\n{}",
            r.stderr
        );
    }
    assert!(!r.stdout.contains("already matches"), "{}", r.stdout);
    assert_eq!(store_files(&server), before, "the store's files changed");
    // `--check` does not call it a match either.
    let r = bench.run_on(&server, &["sync", lock.to_str().unwrap(), "--check"]);
    assert_eq!(r.code, 4, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
}

/// A package to be installed that authenticates, but by another key than the lock names, is
/// refused before anything is installed.
#[test]
fn sync_refuses_a_package_to_install_signed_by_another_key_than_the_lock_names() {
    let bench = Bench::new(guild());
    let fresh = bench.trusting_store("fresh");
    let origin = bench.trusting_store("origin");
    let k2 = second_key(&bench, &[&fresh, &origin]);
    // The mirror's file (the name `--from` looks for) is signed by k; the lock names k2.
    bench.package("example.scan", "1.0.0", b"scan", "");
    package_signed_by_k2(
        &bench,
        "example.scan",
        "1.0.0",
        b"scan",
        "scan-by-k2.gkmodule",
    );
    bench
        .run_on(&origin, &["install", "scan-by-k2.gkmodule"])
        .expect(0);
    let lock = bench.path().join("k2.lock");
    bench
        .run_on(&origin, &["lock", "--out", lock.to_str().unwrap()])
        .expect(0);
    let check = bench.trusting_store("k-only");
    bench
        .run_on(&check, &["install", "example.scan-1.0.0.gkmodule"])
        .expect(0);
    let k_lock = bench.path().join("k.lock");
    bench
        .run_on(&check, &["lock", "--out", k_lock.to_str().unwrap()])
        .expect(0);
    let k1 = locked_key(&k_lock, "example.scan");
    let before = store_files(&fresh);
    let r = sync_from(&bench, &fresh, &lock, &[]);
    assert_eq!(r.code, 3, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    for says in ["example.scan 1.0.0", &k1, &k2] {
        assert!(
            r.stderr.contains(says),
            "stderr lacks {says}:\n{}",
            r.stderr
        );
    }
    assert_eq!(store_files(&fresh), before, "the store's files changed");
}

/// A lock that does not name an enabled package would disable it: refused unless
/// `--allow-shrink`, and an empty lock always so.
#[test]
fn sync_that_would_disable_packages_needs_allow_shrink() {
    let bench = Bench::new(guild());
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let extra = bench.package("example.extra", "1.0.0", b"extra", "");
    let lock = bench.lock_of(&[&scan], &[]);
    let store = bench.trusting_store("server");
    bench.run_on(&store, &["install", &scan]).expect(0);
    bench.run_on(&store, &["install", &extra]).expect(0);
    let listed = bench.listed(&store);
    let before = store_files(&store);
    let r = sync_from(&bench, &store, &lock, &[]);
    assert_eq!(r.code, 4, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("example.extra"), "{}", r.stderr);
    assert!(r.stderr.contains("--allow-shrink"), "{}", r.stderr);
    assert_eq!(bench.listed(&store), listed);
    assert_eq!(store_files(&store), before, "the store's files changed");

    // An empty lock (written on purpose) is refused too, naming what it would do.
    let empty = bench.path().join("empty.lock");
    let mut value: serde_json::Value = serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
    value["packages"] = serde_json::json!([]);
    fs::write(&empty, serde_json::to_vec(&value).unwrap()).unwrap();
    let r = sync_from(&bench, &store, &empty, &[]);
    assert_eq!(r.code, 4, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("names no package"), "{}", r.stderr);
    assert_eq!(bench.listed(&store), listed);

    sync_from(&bench, &store, &lock, &["--allow-shrink"])
        .expect(0)
        .stdout_has("disabled example.extra 1.0.0");
    sync_from(&bench, &store, &empty, &["--allow-shrink"])
        .expect(0)
        .stdout_has("disabled example.scan 1.0.0");
}

/// `--dry-run` prints the plan and changes nothing; `--check` exits 8 while the store differs
/// and 0 once it matches, changing nothing.
#[test]
fn sync_dry_run_and_check_change_nothing() {
    let bench = Bench::new(guild());
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let extra = bench.package("example.extra", "1.0.0", b"extra", "");
    let lock = bench.lock_of(&[&scan], &[]);
    let store = bench.trusting_store("server");
    bench.run_on(&store, &["install", &extra]).expect(0);
    let before = store_files(&store);
    let lock_arg = lock.to_str().unwrap();

    let r = bench.run_on(&store, &["sync", lock_arg, "--dry-run", "--allow-shrink"]);
    r.expect(0)
        .stdout_has("disable example.extra")
        .stdout_has("install example.scan 1.0.0")
        .stdout_has("nothing was changed");
    // Without --allow-shrink the dry run is refused as the sync would be.
    bench
        .run_on(&store, &["sync", lock_arg, "--dry-run"])
        .expect(4);
    let r = bench.run_on(&store, &["sync", lock_arg, "--check"]);
    assert_eq!(r.code, 8, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("install example.scan 1.0.0"),
        "{}",
        r.stdout
    );
    let json = bench.run_on(&store, &["--json", "sync", lock_arg, "--check"]);
    assert_eq!(json.code, 8, "{}", json.stderr);
    let json = json.json();
    assert_eq!(json["matches"], false);
    assert_eq!(json["plan"].as_array().unwrap().len(), 2, "{json}");
    assert_eq!(
        store_files(&store),
        before,
        "--dry-run or --check changed the store"
    );
    // A store that does not exist yet is not created by either.
    let none = bench.path().join("none");
    bench
        .run_on(&none, &["sync", lock_arg, "--check"])
        .expect(8);
    assert!(!none.exists());

    sync_from(&bench, &store, &lock, &["--allow-shrink"]).expect(0);
    bench
        .run_on(&store, &["sync", lock_arg, "--check"])
        .expect(0)
        .stdout_has("matches");
}

/// `guild lock` of a store with nothing enabled refuses to write an empty lock unless
/// `--allow-empty`; `--out -` writes the lock to standard output, not to a file named `-`.
#[test]
fn lock_refuses_an_empty_lock_and_writes_to_standard_output() {
    let bench = Bench::new(guild());
    let scan = bench.package("example.scan", "1.0.0", b"scan", "");
    let store = bench.trusting_store("server");
    bench
        .run_on(&store, &["install", &scan, "--disabled"])
        .expect(0);
    let out = bench.path().join("empty.lock");
    let r = bench.run_on(&store, &["lock", "--out", out.to_str().unwrap()]);
    assert_eq!(r.code, 4, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("--allow-empty"), "{}", r.stderr);
    assert!(!out.exists(), "an empty lock was written");
    bench
        .run_on(
            &store,
            &["lock", "--out", out.to_str().unwrap(), "--allow-empty"],
        )
        .expect(0);
    assert!(out.is_file());

    bench.run_on(&store, &["enable", "example.scan"]).expect(0);
    let r = bench.run_on(&store, &["lock", "--out", "-"]);
    r.expect(0);
    assert!(
        !bench.path().join("-").exists(),
        "a file named - was written"
    );
    let lock: serde_json::Value = serde_json::from_str(&r.stdout).expect("the lock on stdout");
    assert_eq!(lock["packages"][0]["id"], "example.scan");
}
