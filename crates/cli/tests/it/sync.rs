//! `guild sync LOCK --from DIR` without a registry, as an operator runs it: a sync that fails
//! part way exits with its code and leaves the store as it was, and a sync removes its staging
//! area and those of syncs that died. guild-host's tests/it/lock_sync.rs fails each step of the
//! library's sync in turn.

use std::fs;

use guild_test_support::guild::Bench;
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
