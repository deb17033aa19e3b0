//! Many runner processes on one store, following every change live: serving example runners
//! (`guild-example-runner --serve`) beside the `guild` command line, pins that die with their
//! process, and writers killed at random moments while readers go on.
//!
//! Every wait here waits for a line the runner prints, bounded by [`PATIENCE`] (a deadlock
//! guard, not a timing assertion); the times are printed for the record only.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guild_adapters_crypto::SigningKey;
use guild_domain::ids::Sha256Digest;
use guild_host::InstallOptions;
use guild_test_support::guild::Run;
use guild_test_support::{key, open_dir, trust, Workshop, PUBLISHER};

use crate::examples::{pack_example_at, runner_binary, DEPENDENT, SCAN};
use crate::guild;

use guild_test_support::plugins::INCLUSIVE as IMPL;
use guild_test_support::plugins::INCLUSIVE_OP as OP;

/// How long a runner may take to show a change before the test gives up: only a hang or a
/// runner that never follows exceeds it.
const PATIENCE: Duration = Duration::from_secs(30);

fn ok_line(version: &str) -> String {
    format!("{OP} {IMPL} example.scan@{version} ok")
}

/// A serving runner: its process and the lines it printed.
struct Serving {
    child: Child,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    name: String,
}

impl Serving {
    fn start(store: &Path, name: &str) -> Serving {
        let mut child = Command::new(runner_binary())
            .args(["--serve", "--interval-ms", "20"])
            .arg(store)
            .arg(OP)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the runner starts");
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Serving {
            child,
            lines,
            stderr,
            name: name.to_owned(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a line that satisfies `want`, checking every line before it with `each`;
    /// answers the line and how long it took.
    fn wait_for(
        &self,
        what: &str,
        want: impl Fn(&str) -> bool,
        each: impl Fn(&str),
    ) -> (String, Duration) {
        let start = Instant::now();
        let mut last = Vec::new();
        loop {
            let left = PATIENCE.saturating_sub(start.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    each(&line);
                    if want(&line) {
                        return (line, start.elapsed());
                    }
                    last.push(line);
                    if last.len() > 8 {
                        last.remove(0);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => panic!(
                    "{}: no line {what} within {PATIENCE:?}; last lines: {last:#?}\nstderr:\n{}",
                    self.name,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Waits for an `ok` line of `version`.
    fn wait_ok(&self, version: &str) -> Duration {
        let want = ok_line(version);
        self.wait_for(&format!("{want:?}"), |l| l == want, |_| {}).1
    }

    /// Lines printed so far, without waiting.
    fn drain(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A store with the publisher trusted and `scan` 1.0.0 (and the dependent module) installed
/// through a writer's package manager, closed again; and the key.
fn store_with_scan(shop: &Workshop, with_dependent: bool) -> (PathBuf, SigningKey) {
    let k = key();
    let store = shop.fresh("store");
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k);
    let mut examples = vec![&SCAN];
    if with_dependent {
        examples.push(&DEPENDENT);
    }
    for example in examples {
        pm.install(
            &pack_example_at(shop, &k, example, None),
            InstallOptions::default(),
        )
        .unwrap();
    }
    (store, k)
}

fn cli(shop: &Workshop, store: &Path, args: &[&str]) -> Run {
    let mut all = vec!["--store", store.to_str().unwrap()];
    all.extend_from_slice(args);
    let run = guild().run(shop.path(), &all);
    assert!(
        !run.stderr.contains("locked"),
        "guild {args:?} met a lock: {}",
        run.stderr
    );
    run
}

/// Revokes `key` in the store's trust file with `guild trust revoke-key`, as an operator does.
fn revoke_with_cli(shop: &Workshop, store: &Path, key: &SigningKey) {
    let key_id = Sha256Digest::of(key.public_key().spki_der()).to_hex();
    expect_ok(
        &cli(
            shop,
            store,
            &["trust", "revoke-key", &key_id, "--reason", "leaked"],
        ),
        "revoke-key",
    );
}

fn expect_ok(run: &Run, what: &str) {
    assert_eq!(
        run.code, 0,
        "{what} failed:\n{}\n{}",
        run.stdout, run.stderr
    );
}

#[test]
fn live_three_serving_runners_follow_every_change_from_the_cli() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop, true);
    let scan_11 = pack_example_at(&shop, &k, &SCAN, Some("1.1.0"));
    let mut runners: Vec<Serving> = (0..3)
        .map(|i| Serving::start(&store, &format!("runner {i}")))
        .collect();
    for r in &runners {
        r.wait_ok("1.0.0");
    }

    let listed = cli(&shop, &store, &["list"]);
    expect_ok(&listed, "guild list");
    let status = cli(&shop, &store, &["status", "example.scan"]);
    expect_ok(&status, "guild status");
    for r in &runners {
        assert!(
            status.stdout.contains(&format!("pid {}", r.pid())),
            "status names {} (pid {}): {}",
            r.name,
            r.pid(),
            status.stdout
        );
    }

    expect_ok(
        &cli(&shop, &store, &["install", scan_11.to_str().unwrap()]),
        "install 1.1.0",
    );
    for r in &runners {
        let took = r.wait_ok("1.1.0");
        println!("{} follows the install in {took:?}", r.name);
    }
    expect_ok(
        &cli(&shop, &store, &["rollback", "example.scan"]),
        "rollback",
    );
    for r in &runners {
        let took = r.wait_ok("1.0.0");
        println!("{} follows the rollback in {took:?}", r.name);
    }
    expect_ok(
        &cli(&shop, &store, &["disable", "example.dependent"]),
        "disable of an unused package",
    );

    // One runner dies mid-way: its pins go with it, the others go on.
    let mut dead = runners.pop().unwrap();
    let dead_pid = dead.pid();
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let status = cli(&shop, &store, &["--json", "status", "example.scan"]);
    expect_ok(&status, "guild status after the kill");
    let pins = status.json()["pins"].clone();
    let pids: Vec<u64> = pins
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(!pids.contains(&u64::from(dead_pid)), "stale pin: {pins}");
    for r in &runners {
        assert!(pids.contains(&u64::from(r.pid())), "{}: {pins}", r.name);
        r.drain();
        r.wait_ok("1.0.0");
    }

    // Revoking the publisher's key: no runner executes its code on a new resolution.
    revoke_with_cli(&shop, &store, &k);
    for r in &runners {
        let error = format!("{OP} error:");
        let (_, took) = r.wait_for(&format!("{error:?}"), |l| l.starts_with(&error), |_| {});
        println!("{} stops running revoked code in {took:?}", r.name);
        // From then on, only refusals: count a few rounds.
        for _ in 0..5 {
            r.wait_for(
                "after the revocation",
                |_| true,
                |l| assert!(l.starts_with(&error), "{}: revoked code ran: {l}", r.name),
            );
        }
    }
    drop(dead);
}

#[test]
fn live_removal_of_a_version_a_runner_uses_is_refused_naming_it_until_it_dies() {
    let shop = Workshop::new();
    let (store, _) = store_with_scan(&shop, false);
    let mut runner = Serving::start(&store, "runner");
    runner.wait_ok("1.0.0");
    let refused = cli(&shop, &store, &["remove", "example.scan"]);
    assert_eq!(refused.code, 4, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains(&format!("pid {}", runner.pid())),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("guild-example-r"),
        "names the command: {}",
        refused.stderr
    );
    assert!(store.join("packages/example.scan/1.0.0").is_dir());
    runner.child.kill().unwrap();
    runner.child.wait().unwrap();
    expect_ok(
        &cli(&shop, &store, &["remove", "example.scan"]),
        "remove after the runner died",
    );
    assert!(!store.join("packages/example.scan/1.0.0").exists());
}

/// A small deterministic generator for the kill delays (the seed is printed to replay a run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

#[test]
fn live_writers_killed_at_random_points_leave_readers_a_complete_generation() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop, false);
    let scan_11 = pack_example_at(&shop, &k, &SCAN, Some("1.1.0"));
    let seed = std::env::var("GUILD_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("live kill test: seed {seed} (GUILD_KILL_SEED={seed} replays it)");
    let mut rng = Lcg(seed);
    let runners: Vec<Serving> = (0..2)
        .map(|i| Serving::start(&store, &format!("runner {i}")))
        .collect();
    for r in &runners {
        r.wait_ok("1.0.0");
    }
    let complete = |r: &Serving, lines: &[String]| {
        for l in lines {
            assert!(
                l == &ok_line("1.0.0") || l == &ok_line("1.1.0"),
                "{} saw an incomplete generation: {l}\nstderr:\n{}",
                r.name,
                r.stderr.lock().unwrap()
            );
        }
    };
    let store_arg = store.to_str().unwrap().to_owned();
    for round in 0..10 {
        let change: Vec<&str> = if round % 2 == 0 {
            vec!["install", scan_11.to_str().unwrap()]
        } else {
            vec!["rollback", "example.scan"]
        };
        let mut args = vec!["--store", &store_arg];
        args.extend(&change);
        let mut writer = guild()
            .command(shop.path(), &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.below(400)));
        let _ = writer.kill();
        let status = writer.wait().unwrap();
        // Readers open and execute meanwhile: a fresh runner process and `guild list`.
        let once = Command::new(runner_binary())
            .arg(&store)
            .arg(OP)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&once.stdout);
        assert_eq!(
            once.status.code(),
            Some(0),
            "round {round} (seed {seed}, writer {status:?}): a reader failed:\n{out}{}",
            String::from_utf8_lossy(&once.stderr)
        );
        assert!(
            out.contains(&format!("{OP} -> {IMPL} from example.scan 1."))
                && out.contains("output    [[1, 3, 6, 10], [10, 30, 60, 100]]"),
            "round {round} (seed {seed}): {out}"
        );
        expect_ok(&cli(&shop, &store, &["list"]), "guild list");
        for r in &runners {
            complete(r, &r.drain());
        }
    }
    // The next writer recovers whatever the last kill left; a second finds nothing.
    expect_ok(&cli(&shop, &store, &["recover"]), "recover");
    let again = cli(&shop, &store, &["--json", "recover"]);
    expect_ok(&again, "second recover");
    assert_eq!(
        again.json()["open"]["recovery"]["rolled_forward"],
        serde_json::json!([])
    );
    // And the runners serve what the store now enables.
    let listed = cli(&shop, &store, &["--json", "status", "example.scan"]);
    let enabled = listed.json()["package"]["enabled"]
        .as_str()
        .unwrap()
        .to_owned();
    for r in &runners {
        r.wait_for(
            "of the enabled version",
            |l| l == ok_line(&enabled),
            |l| complete(r, &[l.to_owned()]),
        );
    }
}

/// The scan's handle on the example input (I64, two rows of four).
fn scan_handle<'r>(
    service: &guild_host::OperationService<'r>,
) -> Result<guild_host::OpHandle<'r>, guild_host::ResolveError> {
    use guild_host::{DType, MemorySpace, OperationRequest, TensorDesc};
    let d = TensorDesc::new(DType::I64, &[4, 2], MemorySpace::Host);
    service.resolve(&OperationRequest::cpu(
        guild_host::OpName::new(OP).unwrap(),
        vec![d],
        vec![d],
    ))
}

#[test]
fn live_refresh_reports_loads_deferred_switches_and_revoked_live_handles() {
    use guild_domain::ids::PackageId;
    use guild_host::{DeviceSupport, Host, OperationService};
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop, false);
    let scan_11 = pack_example_at(&shop, &k, &SCAN, Some("1.1.0"));
    let id = PackageId::new("example.scan").unwrap();
    let opened = Host::builder(&store)
        .devices(DeviceSupport::host())
        .open()
        .unwrap();
    let host = opened.host;
    let service = OperationService::new(host.kernels());
    let quiet = host.refresh().unwrap();
    assert!(quiet.is_quiet(), "{quiet:?}");
    assert_eq!(quiet.from_generation, quiet.generation);

    let held = scan_handle(&service).unwrap();
    assert!(held.is_current());
    assert_eq!(held.describe().package_version.to_string(), "1.0.0");
    // Another writer (in this process: the host holds no lock) installs 1.1.0.
    let (pm, _) = open_dir(&store).unwrap();
    pm.install(&scan_11, InstallOptions::default()).unwrap();
    drop(pm);

    let deferred = host.refresh().unwrap();
    assert_eq!(deferred.generation, quiet.generation + 1, "{deferred:?}");
    assert!(deferred.loaded.is_empty(), "{deferred:?}");
    assert_eq!(deferred.deferred.len(), 1, "{deferred:?}");
    let d = &deferred.deferred[0];
    assert_eq!((&d.id, d.from.to_string()), (&id, "1.0.0".to_owned()));
    assert_eq!(
        d.to.as_ref().map(ToString::to_string).as_deref(),
        Some("1.1.0")
    );
    assert_eq!(d.bindings, 1);
    // The handle still runs 1.0.0, and says it is no longer current.
    assert!(!held.is_current());
    drop(held);

    let switched = host.refresh().unwrap();
    assert_eq!(switched.loaded.len(), 1, "{switched:?}");
    assert_eq!(switched.loaded[0].version.to_string(), "1.1.0");
    assert!(switched.deferred.is_empty(), "{switched:?}");
    let held = scan_handle(&service).unwrap();
    assert_eq!(held.describe().package_version.to_string(), "1.1.0");
    assert!(held.is_current());
    // This process pins the version it loaded, and no longer the one it switched away from.
    let (pm, _) = open_dir(&store).unwrap();
    let pins = pm.pins(Some(&id)).unwrap();
    assert_eq!(pins.len(), 1, "{pins:?}");
    assert_eq!(pins[0].node.version.to_string(), "1.1.0");
    assert_eq!(pins[0].holders[0].pid, std::process::id());

    // Revoking the key takes the package out at once, whatever holds it.
    let key_id = Sha256Digest::of(k.public_key().spki_der());
    pm.update_trust(|t| {
        t.revoke_key(key_id, "leaked");
        Ok(())
    })
    .unwrap();
    drop(pm);
    let revoked = host.refresh().unwrap();
    assert_eq!(revoked.revoked_live.len(), 1, "{revoked:?}");
    assert_eq!(revoked.revoked_live[0].id, id);
    assert_eq!(revoked.revoked_live[0].bindings, 1);
    assert!(!held.is_current());
    assert!(
        scan_handle(&service).is_err(),
        "a new resolution reached revoked code"
    );
    drop(held);
}

#[test]
fn a_host_under_a_lock_does_not_follow_the_store_past_it() {
    use guild_domain::distribution::{LockFile, LockRefusal};
    use guild_host::{DeviceSupport, Host, OperationService};
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop, false);
    let lock_path = shop.path().join("guild.lock");
    cli(
        &shop,
        &store,
        &["lock", "--out", lock_path.to_str().unwrap()],
    );
    let lock = LockFile::parse(&std::fs::read(&lock_path).unwrap()).unwrap();
    let host = Host::builder(&store)
        .devices(DeviceSupport::host())
        .lock(lock)
        .open()
        .unwrap()
        .host;
    let service = OperationService::new(host.kernels());
    assert_eq!(
        scan_handle(&service)
            .unwrap()
            .describe()
            .package_version
            .to_string(),
        "1.0.0"
    );
    // Another writer makes 1.1.0 current, signed with a second key of the same publisher; the
    // lock names 1.0.0.
    let k2 = key();
    let (pm, _) = open_dir(&store).unwrap();
    trust(&pm, PUBLISHER, &k2);
    pm.install(
        &pack_example_at(&shop, &k2, &SCAN, Some("1.1.0")),
        InstallOptions::default(),
    )
    .unwrap();
    drop(pm);
    let report = host.refresh().unwrap();
    assert!(!report.is_quiet(), "{report:?}");
    assert!(report.loaded.is_empty(), "{report:?}");
    assert!(report.taken_out.is_empty(), "{report:?}");
    assert_eq!(report.refused_by_lock.len(), 1, "{report:?}");
    let refused = &report.refused_by_lock[0];
    assert_eq!(
        (refused.id.as_str(), refused.version.to_string()),
        ("example.scan", "1.1.0".to_owned())
    );
    assert!(
        !matches!(refused.reason, LockRefusal::NotLocked),
        "{:?}",
        refused.reason
    );
    // The locked version keeps serving.
    assert_eq!(
        scan_handle(&service)
            .unwrap()
            .describe()
            .package_version
            .to_string(),
        "1.0.0"
    );
    // A lock holds back a switch, never a revocation: once 1.0.0's key is revoked it is taken
    // out, although the lock still refuses 1.1.0.
    revoke_with_cli(&shop, &store, &k);
    let report = host.refresh().unwrap();
    let taken: Vec<String> = report
        .taken_out
        .iter()
        .map(|q| format!("{} {}", q.id, q.version))
        .collect();
    assert_eq!(taken, ["example.scan 1.0.0"], "{report:?}");
    assert!(
        scan_handle(&service).is_err(),
        "revoked code was resolved under a lock"
    );
}

#[test]
fn the_example_runner_under_a_lock_loads_only_what_it_names() {
    let shop = Workshop::new();
    let (store, k) = store_with_scan(&shop, false);
    let lock = shop.path().join("guild.lock");
    cli(&shop, &store, &["lock", "--out", lock.to_str().unwrap()]);
    // Installed after the lock was written, so the lock does not name it.
    let (pm, _) = open_dir(&store).unwrap();
    pm.install(
        &pack_example_at(&shop, &k, &DEPENDENT, None),
        InstallOptions::default(),
    )
    .unwrap();
    drop(pm);
    let out = Command::new(runner_binary())
        .arg("--lock")
        .arg(&lock)
        .arg(&store)
        .arg("example.sequence.inclusive_scan")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("not loaded: the lock does not name this package"),
        "{stderr}"
    );
    assert!(
        stdout.contains("example.sequence.inclusive_scan -> example.scan.inclusive.cpu"),
        "{stdout}"
    );
    assert!(!stdout.contains("loaded example.dependent"), "{stdout}");
    // A file that is not a lock is refused before the store is opened.
    let out = Command::new(runner_binary())
        .arg("--lock")
        .arg(shop.path().join("missing.lock"))
        .arg(&store)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read the lock file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
