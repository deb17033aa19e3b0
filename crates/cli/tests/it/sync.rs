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
