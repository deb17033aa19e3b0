//! A fleet of eight stores against the real registry (the one the `oci` tests start; skipped as
//! they are when it is not installed): each store joined to one root, followed by its own
//! `guild fleet sync --follow --interval 1` and served by its own `guild-example-runner
//! --serve`. Each scenario publishes a policy (or an attacker's document) at the fleet's tag and
//! asserts every store's state (`status`, `list`) and every runner's answers.
//!
//! Every wait is bounded by [`PATIENCE`] (a hang guard, not a timing assertion); the time from
//! pushing a revocation to the last runner refusing the revoked package is printed, never
//! asserted. Scenarios, in order: rollout, upgrade, rollback, three refusals (a re-tagged older
//! policy, k-1 signatures, an expired policy), a key revocation that a store which was down
//! converges on through the next policy, a registry outage mid-rollout, what an unchanged poll
//! costs (the registry's access log), kill -9 of syncs at random points, a root rotation, a
//! store restored from an old backup, and a zero-outage key rotation: a policy that trusts the
//! publisher's new key and pins the copy re-signed by it, then one that revokes the old key,
//! while every runner keeps answering with the same build.

use std::fs;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use guild_test_support::guild::Bench;
use guild_test_support::plugins::plugin_library;
use guild_test_support::plugins::{INCLUSIVE as IMPL, INCLUSIVE_OP as OP};

use crate::fleet::{requests, signed_root};
use crate::guild;
use crate::oci::{fails, ok, run, Registry};

const NODES: usize = 8;
// A hang guard for a loaded 2-core CI machine, where 17 processes share the cores with other
// tests; a passing run waits a second or two at each step.
const PATIENCE: Duration = Duration::from_secs(90);

fn ok_line(version: &str) -> String {
    format!("{OP} {IMPL} example.scan@{version} ok")
}

/// A serving runner on one store: the lines it printed, each with when it arrived.
struct Runner {
    child: Child,
    lines: Receiver<(Instant, String)>,
    name: String,
}

impl Runner {
    fn start(binary: &Path, store: &Path, name: String) -> Runner {
        let mut child = Command::new(binary)
            .args(["--serve", "--interval-ms", "100"])
            .arg(store)
            .arg(OP)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the runner starts");
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Runner { child, lines, name }
    }

    /// Forgets the lines printed so far.
    fn drain(&self) {
        while self.lines.try_recv().is_ok() {}
    }

    /// Waits for a line that satisfies `want`, checking each line before it with `each`;
    /// answers when the line arrived.
    fn wait_for(&self, what: &str, want: impl Fn(&str) -> bool, each: impl Fn(&str)) -> Instant {
        let start = Instant::now();
        let mut last = Vec::new();
        loop {
            match self
                .lines
                .recv_timeout(PATIENCE.saturating_sub(start.elapsed()))
            {
                Ok((at, line)) => {
                    if want(&line) {
                        return at;
                    }
                    each(&line);
                    last.push(line);
                    if last.len() > 4 {
                        last.remove(0);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    panic!(
                        "{}: no line {what} in {PATIENCE:?}; last: {last:#?}",
                        self.name
                    )
                }
            }
        }
    }

    fn wait_ok(&self, version: &str) {
        let want = ok_line(version);
        self.wait_for(&want, |l| l == want, |_| {});
    }

    /// The next `n` lines are all `ok` lines of `version`: the runner kept its provider.
    fn keeps(&self, version: &str, n: usize) {
        let want = ok_line(version);
        for _ in 0..n {
            let (_, line) = self
                .lines
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("{}: no line", self.name));
            assert_eq!(line, want, "{}", self.name);
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One store of the fleet: its directory, its follower (when running) and the follower's log.
struct Node {
    store: PathBuf,
    follower: Option<Child>,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Node {
    fn stop(&mut self) {
        if let Some(mut c) = self.follower.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts `guild fleet sync --policy TAG --follow --interval 1`, appending its output to
    /// the node's log.
    fn follow(&mut self, bench: &Bench, tag: &str) {
        assert!(self.follower.is_none());
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = command(
            bench,
            &self.store,
            &[
                "fleet",
                "sync",
                "--policy",
                tag,
                "--follow",
                "--interval",
                "1",
            ],
        );
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        self.follower = Some(cmd.spawn().unwrap());
    }

    fn log_len(&self) -> usize {
        fs::read(&self.log).map_or(0, |b| b.len())
    }

    /// Waits until the follower's log, after `from`, says `text`.
    fn wait_log(&self, from: usize, text: &str) {
        let start = Instant::now();
        loop {
            let log = fs::read(&self.log).unwrap_or_default();
            if String::from_utf8_lossy(&log[from.min(log.len())..]).contains(text) {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "{}: the follower never said {text:?}; its log:\n{}",
                self.store.display(),
                String::from_utf8_lossy(&log)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `guild --store STORE ARGS` as [`run`] runs it, to be spawned.
fn command(bench: &Bench, store: &Path, args: &[&str]) -> Command {
    let mut all = vec!["--store", store.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut cmd = guild().command(bench.path(), &all);
    cmd.env("HOME", bench.path())
        .env_remove("DOCKER_CONFIG")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("GUILD_INSECURE_REGISTRIES")
        .env_remove("REGISTRY_AUTH_FILE");
    cmd
}

/// The store's applied policy version and its enabled packages.
fn state(bench: &Bench, store: &Path) -> (u64, Vec<(String, String)>) {
    let status = ok(run(bench, store, None, &["--json", "status"])).json();
    let version = status["fleet"]["policy"]["version"].as_u64().unwrap_or(0);
    let list = ok(run(bench, store, None, &["--json", "list"])).json();
    let enabled = list["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            Some((
                p["id"].as_str()?.to_owned(),
                p["enabled"].as_str()?.to_owned(),
            ))
        })
        .collect();
    (version, enabled)
}

fn scan(version: &str) -> Vec<(String, String)> {
    vec![("example.scan".to_owned(), version.to_owned())]
}

/// Waits until every store in `nodes` applied policy `version`, then asserts that it enables
/// `scan` `at` alone and that its runner answers with it.
fn converge(bench: &Bench, nodes: &[Node], runners: &[Runner], version: u64, at: &str) {
    for node in nodes {
        let start = Instant::now();
        loop {
            let (v, enabled) = state(bench, &node.store);
            if v == version {
                assert_eq!(enabled, scan(at), "{}", node.store.display());
                break;
            }
            assert!(
                v < version && start.elapsed() < PATIENCE,
                "{}: policy version {v}, not {version}; follower log:\n{}",
                node.store.display(),
                fs::read_to_string(&node.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for r in runners {
        r.wait_ok(at);
    }
}

/// Packs `example.scan` `version` (the scan module and its template in examples/) signed by
/// `key`; answers the archive's name.
fn scan_package(bench: &Bench, version: &str, key: &str) -> String {
    let src = bench.path().join(format!("scan-src-{version}"));
    fs::create_dir_all(src.join("lib")).unwrap();
    fs::write(
        src.join("lib/libscan_module.so"),
        plugin_library("scan_module"),
    )
    .unwrap();
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/modules/scan/manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(template).unwrap()).unwrap();
    manifest["os"] = std::env::consts::OS.into();
    manifest["arch"] = std::env::consts::ARCH.into();
    manifest["version"] = version.into();
    let template = bench.path().join(format!("scan-{version}.json"));
    fs::write(&template, manifest.to_string()).unwrap();
    let archive = format!("scan-{version}.gkmodule");
    bench
        .run(&[
            "pack",
            src.to_str().unwrap(),
            "--manifest",
            template.to_str().unwrap(),
            "--out",
            &archive,
            "--key",
            key,
        ])
        .expect(0);
    archive
}

/// A lock of the package at tag `guild/scan:VERSION` alone, from a store of its own that trusts
/// `keys` (public key files) for the publisher.
fn lock_of(bench: &Bench, registry: &Registry, version: &str, keys: &[&str]) -> String {
    let origin = bench.path().join(format!("origin-{version}"));
    for k in keys {
        ok(run(
            bench,
            &origin,
            None,
            &["trust", "add", "org.example", k],
        ));
    }
    let reference = registry.reference(&format!("guild/scan:{version}"));
    ok(run(bench, &origin, None, &["install", &reference]));
    let lock = format!("lock-{version}.json");
    ok(run(
        bench,
        &origin,
        None,
        &["lock", "--out", bench.path().join(&lock).to_str().unwrap()],
    ));
    lock
}

/// A policy document `out`: version `version` under root version `root` (`root.json` for 1,
/// `rootN.json` after), expiring at `expires`, desiring the packages of `lock`, trusting
/// `publisher` for `org.example`, revoking `revoked` (key ids), with the options `more`, and
/// signed by each of `signers` (root keys).
#[allow(clippy::too_many_arguments)]
fn policy(
    bench: &Bench,
    out: &str,
    (root, version): (u64, u64),
    expires: &str,
    lock: &str,
    publisher: &str,
    revoked: &[&str],
    more: &[&str],
    signers: &[&str],
) -> String {
    let (version_text, root_text) = (version.to_string(), root.to_string());
    let publisher = format!("org.example={publisher}");
    let revocations: Vec<String> = revoked.iter().map(|k| format!("{k}=leaked")).collect();
    let mut args = vec![
        "fleet",
        "policy",
        "new",
        "--fleet",
        "example.prod",
        "--version",
        &version_text,
        "--root-version",
        &root_text,
        "--expires",
        expires,
        "--from-lock",
        lock,
        "--publisher",
        &publisher,
        "--out",
        out,
    ];
    for r in &revocations {
        args.extend(["--revoke-key", r]);
    }
    args.extend(more);
    bench.run(&args).expect(0);
    let root = match root {
        1 => "root.json".to_owned(),
        n => format!("root{n}.json"),
    };
    for k in signers {
        bench
            .run(&["fleet", "sign", out, "--key", k, "--root", &root])
            .expect(0);
    }
    out.to_owned()
}

#[test]
fn fleet_eight_stores_with_serving_runners_follow_one_root_through_a_registry() {
    let started = Instant::now();
    let Some(mut registry) = Registry::start_logged("fleet_eight") else {
        return;
    };
    let bench = Bench::new(guild());
    let runner_binary =
        guild_test_support::cargo_binary("guild-example-runner", "guild-example-runner");
    signed_root(&bench);
    bench.run(&["keygen", "--out", "k2"]).expect(0);
    // Root version 2 drops a and adds d: signed by two keys of root 1 (b, c) and of its own.
    bench.run(&["keygen", "--out", "d"]).expect(0);
    bench
        .run(&[
            "fleet",
            "root",
            "new",
            "--fleet",
            "example.prod",
            "--threshold",
            "2",
            "--key",
            "b.pub",
            "--key",
            "c.pub",
            "--key",
            "d.pub",
            "--expires",
            "365d",
            "--version",
            "2",
            "--out",
            "root2.json",
        ])
        .expect(0);
    for k in ["b.key", "c.key", "d.key"] {
        bench
            .run(&["fleet", "sign", "root2.json", "--key", k])
            .expect(0);
    }

    // Packages: scan 1.0.0 and 1.1.0 signed by k, 1.2.0 and 1.3.0 by k2, all in the registry.
    let store = bench.store();
    for (version, key) in [
        ("1.0.0", "k.key"),
        ("1.1.0", "k.key"),
        ("1.2.0", "k2.key"),
        ("1.3.0", "k2.key"),
    ] {
        let archive = scan_package(&bench, version, key);
        ok(run(
            &bench,
            &store,
            None,
            &[
                "push",
                &archive,
                &registry.reference(&format!("guild/scan:{version}")),
            ],
        ));
    }
    // The publisher's next key, k3: 1.3.0 re-signed by it (the same payload, signed by k2 and
    // k3), at a tag of its own, and locked by a store that trusts both.
    let k3_id = bench
        .run(&["--json", "keygen", "--out", "k3"])
        .expect(0)
        .json()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    bench
        .run(&[
            "sign",
            "scan-1.3.0.gkmodule",
            "--key",
            "k3.key",
            "--out",
            "scan-1.3.0-k3.gkmodule",
        ])
        .expect(0);
    ok(run(
        &bench,
        &store,
        None,
        &[
            "push",
            "scan-1.3.0-k3.gkmodule",
            &registry.reference("guild/scan:1.3.0-k3"),
        ],
    ));
    let lock_k3 = lock_of(&bench, &registry, "1.3.0-k3", &["k2.pub", "k3.pub"]);
    let locks: Vec<String> = ["1.0.0", "1.1.0", "1.2.0", "1.3.0"]
        .iter()
        .map(|v| lock_of(&bench, &registry, v, &["k.pub", "k2.pub"]))
        .collect();
    // The id of k, which signed 1.0.0 and 1.1.0, as the lock records it.
    let k_id = {
        let lock: serde_json::Value =
            serde_json::from_slice(&fs::read(bench.path().join(&locks[0])).unwrap()).unwrap();
        lock["packages"][0]["key_id"].as_str().unwrap().to_owned()
    };
    let both = "k.pub,k2.pub";
    let ab = ["a.key", "b.key"];
    let p = |out: &str, version, lock: &str, publisher, revoked: &[&str], signers: &[&str]| {
        policy(
            &bench,
            out,
            version,
            "30d",
            lock,
            publisher,
            revoked,
            &[],
            signers,
        )
    };
    let p1 = p("p1.json", (1, 1), &locks[0], both, &[], &ab);
    let p2 = p("p2.json", (1, 2), &locks[1], both, &[], &ab);
    let p3 = p("p3.json", (1, 3), &locks[0], both, &[], &["b.key", "c.key"]);
    // Written now, expired by the time it is pushed.
    let expired = policy(
        &bench,
        "expired.json",
        (1, 4),
        "2s",
        &locks[0],
        both,
        &[],
        &[],
        &ab,
    );
    let short = p("short.json", (1, 4), &locks[0], both, &[], &["c.key"]);
    let revoking = [k_id.as_str()];
    let p4 = p("p4.json", (1, 4), &locks[2], "k2.pub", &revoking, &ab);
    let p5 = p("p5.json", (1, 5), &locks[2], "k2.pub", &revoking, &ab);
    let p6 = p("p6.json", (1, 6), &locks[3], "k2.pub", &revoking, &ab);
    let p7 = p("p7.json", (1, 7), &locks[2], "k2.pub", &revoking, &ab);
    let p8 = p(
        "p8.json",
        (2, 8),
        &locks[3],
        "k2.pub",
        &revoking,
        &["c.key", "d.key"],
    );
    // An older policy under root 2, for the restored store to refuse.
    let p7_root2 = p(
        "p7-root2.json",
        (2, 7),
        &locks[2],
        "k2.pub",
        &revoking,
        &["c.key", "d.key"],
    );
    // The rotation, from the lock of the copy signed by k2 and k3 with `--entry-keys
    // publisher` (each entry allows every key trusted for the publisher, whichever one the lock
    // names): k2 and k3 both trusted, then k3 alone with k2 revoked.
    let k2_id = {
        let lock: serde_json::Value =
            serde_json::from_slice(&fs::read(bench.path().join(&locks[3])).unwrap()).unwrap();
        lock["packages"][0]["key_id"].as_str().unwrap().to_owned()
    };
    let cd = ["c.key", "d.key"];
    let rotation = |out: &str, version, publisher, revoked: &[&str]| {
        let more = ["--entry-keys", "publisher"];
        policy(
            &bench, out, version, "30d", &lock_k3, publisher, revoked, &more, &cd,
        )
    };
    let p9 = rotation("p9.json", (2, 9), "k2.pub,k3.pub", &revoking);
    let both_revoked = [k_id.as_str(), k2_id.as_str()];
    let p10 = rotation("p10.json", (2, 10), "k3.pub", &both_revoked);
    // Under root 2, a is no root key any more: one valid signature of the two needed.
    let p8_ab = p("p8-ab.json", (2, 8), &locks[3], "k2.pub", &revoking, &ab);

    let root_tag = registry.reference("fleet/root:prod");
    let tag = registry.reference("fleet/policy:prod");
    let push = |file: &str| {
        ok(run(&bench, &store, None, &["fleet", "push", file, &tag]));
    };
    ok(run(
        &bench,
        &store,
        None,
        &["fleet", "push", "root.json", &root_tag],
    ));

    let mut nodes: Vec<Node> = (0..NODES)
        .map(|i| {
            let store = bench.path().join(format!("node-{i}"));
            ok(run(&bench, &store, None, &["fleet", "join", &root_tag]));
            Node {
                store,
                follower: None,
                log: bench.path().join(format!("follow-{i}.log")),
            }
        })
        .collect();
    let runners: Vec<Runner> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Runner::start(&runner_binary, &n.store, format!("runner {i}")))
        .collect();
    let drain = || runners.iter().for_each(Runner::drain);
    eprintln!("fleet_eight: set up in {:?}", started.elapsed());

    // Rollout: policy 1 reaches every store, and every runner serves scan 1.0.0.
    push(&p1);
    drain();
    for n in &mut nodes {
        n.follow(&bench, &tag);
    }
    converge(&bench, &nodes, &runners, 1, "1.0.0");
    eprintln!("fleet_eight: rollout at {:?}", started.elapsed());

    // Upgrade: policy 2 desires 1.1.0.
    drain();
    push(&p2);
    converge(&bench, &nodes, &runners, 2, "1.1.0");

    // Rollback of the package by a newer policy: policy 3 desires 1.0.0 again.
    drain();
    push(&p3);
    converge(&bench, &nodes, &runners, 3, "1.0.0");
    eprintln!(
        "fleet_eight: upgrade and rollback at {:?}",
        started.elapsed()
    );

    // Refusals: each leaves every store at policy 3 and every runner on 1.0.0.
    let refused = |file: &str, says: &str| {
        let from: Vec<usize> = nodes.iter().map(Node::log_len).collect();
        push(file);
        for (n, from) in nodes.iter().zip(from) {
            n.wait_log(from, says);
        }
        for n in &nodes {
            assert_eq!(state(&bench, &n.store), (3, scan("1.0.0")), "{file}");
        }
        drain();
        for r in &runners {
            r.keeps("1.0.0", 3);
        }
    };
    // An attacker re-tags the older signed policy 1.
    refused(&p1, "older than version 3");
    // Version 4 signed by one root key of the two needed.
    refused(&short, "1 valid signatures");
    // An expired version 4: refused, the last state kept, and said.
    refused(&expired, "keeping the last state");
    eprintln!("fleet_eight: refusals at {:?}", started.elapsed());
    // A backup of node 0 at policy 3, restored at the end.
    let backup = bench.path().join("backup-0");
    guild_test_support::copy_tree(&nodes[0].store, &backup);

    // A key revocation: policy 4 revokes k (which signed 1.0.0) and desires 1.2.0, signed by
    // k2. Node 7 is down meanwhile and misses it.
    nodes[NODES - 1].stop();
    drain();
    let pushed = Instant::now();
    push(&p4);
    let mut last_refusal = pushed;
    let old = ok_line("1.0.0");
    for r in &runners[..NODES - 1] {
        let at = r.wait_for("other than 1.0.0", |l| l != old, |_| {});
        last_refusal = last_refusal.max(at);
        // From then on it never answers with the revoked package again.
        r.wait_for(
            &ok_line("1.2.0"),
            |l| l == ok_line("1.2.0"),
            |l| assert_ne!(l, old, "{} went back to the revoked package", r.name),
        );
    }
    eprintln!(
        "fleet_eight: FIGURE revocation: {:?} from pushing policy 4 to the last of {} runners \
         refusing the revoked package (--follow --interval 1)",
        last_refusal - pushed,
        NODES - 1
    );
    converge(
        &bench,
        &nodes[..NODES - 1],
        &runners[..NODES - 1],
        4,
        "1.2.0",
    );
    assert_eq!(state(&bench, &nodes[NODES - 1].store), (3, scan("1.0.0")));
    // Policy 5 carries the revocation too: node 7, back, converges on the same revocations
    // without ever having seen policy 4.
    drain();
    push(&p5);
    nodes[NODES - 1].follow(&bench, &tag);
    converge(&bench, &nodes, &runners, 5, "1.2.0");
    let trust: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| ok(run(&bench, &n.store, None, &["--json", "trust", "list"])).json())
        .collect();
    assert!(trust[0].to_string().contains(&k_id), "{}", trust[0]);
    for (i, t) in trust.iter().enumerate() {
        assert_eq!(t, &trust[0], "node {i}'s trust");
    }
    eprintln!("fleet_eight: revocation at {:?}", started.elapsed());

    // The registry stops mid-rollout of policy 6: every store stays at 5 or 6 whole, says it
    // cannot fetch, and all converge on 6 once the registry is back.
    drain();
    let from: Vec<usize> = nodes.iter().map(Node::log_len).collect();
    push(&p6);
    registry.stop();
    for (n, from) in nodes.iter().zip(&from) {
        n.wait_log(*from, "cannot fetch the fleet policy");
        let s = state(&bench, &n.store);
        assert!(
            s == (5, scan("1.2.0")) || s == (6, scan("1.3.0")),
            "{}: {s:?}",
            n.store.display()
        );
    }
    registry.resume();
    converge(&bench, &nodes, &runners, 6, "1.3.0");
    eprintln!("fleet_eight: registry outage at {:?}", started.elapsed());

    // What an unchanged poll costs: requests in the registry's access log over a window in
    // which every follower polls and finds its policy unchanged.
    let from: Vec<usize> = nodes.iter().map(Node::log_len).collect();
    for (n, from) in nodes.iter().zip(&from) {
        n.wait_log(*from, "unchanged");
    }
    let unchanged = |nodes: &[Node]| -> usize {
        nodes
            .iter()
            .map(|n| {
                fs::read_to_string(&n.log)
                    .unwrap_or_default()
                    .matches("unchanged")
                    .count()
            })
            .sum()
    };
    let before = requests(&registry).len();
    let polls_before = unchanged(&nodes);
    std::thread::sleep(Duration::from_secs(3));
    let window = requests(&registry)[before..].to_vec();
    let polls = unchanged(&nodes) - polls_before;
    let mut kinds = window.clone();
    kinds.sort();
    kinds.dedup();
    eprintln!(
        "fleet_eight: FIGURE unchanged polls: {} request(s) for {polls} unchanged poll(s) of \
         {NODES} followers, of these kinds: {kinds:?}",
        window.len()
    );
    // One request per unchanged poll: the policy tag's manifest, on the session the
    // follower's first poll opened (no API check, no token, no blob). Polls and requests are
    // counted over the same window, so a poll at either edge may fall on one side only.
    assert!(
        window
            .iter()
            .all(|r| r == "GET /v2/fleet/policy/manifests/prod"),
        "an unchanged poll made a request other than its manifest: {window:?}"
    );
    assert!(
        window.len().abs_diff(polls) <= NODES,
        "{} request(s) for {polls} unchanged poll(s)",
        window.len()
    );

    // kill -9 of syncing processes at random points: policy 7 (1.2.0 again) is applied by
    // one-shot syncs, each killed after 0 to 300 ms; every store is wholly at 6 or at 7, and a
    // sync to the end brings each to 7.
    for n in &mut nodes {
        n.stop();
    }
    push(&p7);
    drain();
    let mut seed = u64::from(started.elapsed().subsec_nanos()) | 1;
    let mut outcomes = Vec::new();
    for n in &nodes {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_millis(seed % 300);
        let mut child = command(&bench, &n.store, &["fleet", "sync", "--policy", &tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        let s = state(&bench, &n.store);
        assert!(
            s == (6, scan("1.3.0")) || s == (7, scan("1.2.0")),
            "{} after kill -9 at {delay:?}: {s:?}",
            n.store.display()
        );
        outcomes.push((delay.as_millis(), s.0));
    }
    eprintln!("fleet_eight: kill -9 (ms after start, policy version left): {outcomes:?}");
    for n in &nodes {
        ok(run(
            &bench,
            &n.store,
            None,
            &["fleet", "sync", "--policy", &tag],
        ));
    }
    converge(&bench, &nodes, &runners, 7, "1.2.0");

    // A root rotation: root 2 (b, c, d) signed by b, c and d. A policy under it is refused
    // without the new root, and, signed by a (no longer a root key) and b, with it; signed by c
    // and d, it applies with the new root, on every store.
    let root2_tag = registry.reference("fleet/root:v2");
    ok(run(
        &bench,
        &store,
        None,
        &["fleet", "push", "root2.json", &root2_tag],
    ));
    let at7 = (7, scan("1.2.0"));
    push(&p8);
    for n in &nodes {
        let r = run(&bench, &n.store, None, &["fleet", "sync", "--policy", &tag]);
        assert_ne!(r.code, 0, "{}", r.stdout);
        assert_eq!(state(&bench, &n.store), at7);
    }
    push(&p8_ab);
    let with_root2 = ["fleet", "sync", "--policy", &tag, "--root", &root2_tag];
    for n in &nodes {
        fails(
            run(&bench, &n.store, None, &with_root2),
            3,
            "1 valid signatures",
        );
        assert_eq!(state(&bench, &n.store), at7);
    }
    push(&p8);
    drain();
    for n in &nodes {
        ok(run(&bench, &n.store, None, &with_root2));
    }
    converge(&bench, &nodes, &runners, 8, "1.3.0");
    for n in &nodes {
        let status = ok(run(&bench, &n.store, None, &["--json", "status"])).json();
        assert_eq!(status["fleet"]["root_version"], 2, "{}", n.store.display());
    }
    eprintln!("fleet_eight: root rotation at {:?}", started.elapsed());

    // node 0 restored from its backup at policy 3 (still trusting k): its first sync takes it
    // forward to policy 8 with the fleet's revocations, and it then refuses to go back to an
    // older policy (version 7, re-signed under root 2; the old policy 7 fails on root 2's
    // signatures already).
    let restored = bench.path().join("restored-0");
    guild_test_support::copy_tree(&backup, &restored);
    assert_eq!(state(&bench, &restored), (3, scan("1.0.0")));
    ok(run(&bench, &restored, None, &with_root2));
    assert_eq!(state(&bench, &restored), (8, scan("1.3.0")));
    let trust_of = |store: &Path| ok(run(&bench, store, None, &["--json", "trust", "list"])).json();
    assert_eq!(trust_of(&restored), trust_of(&nodes[1].store));
    push(&p7_root2);
    fails(
        run(&bench, &restored, None, &with_root2),
        4,
        "older than version 8",
    );
    assert_eq!(state(&bench, &restored), (8, scan("1.3.0")));

    // A zero-outage key rotation, k2 to k3: policy 9 trusts both and names the copy of 1.3.0
    // re-signed by k3, either key allowed; policy 10 allows k3 alone and revokes k2. Every
    // runner answers with 1.3.0 throughout.
    drain();
    for version in [&p9, &p10] {
        push(version);
        for n in &nodes {
            ok(run(&bench, &n.store, None, &with_root2));
        }
    }
    for n in &nodes {
        assert_eq!(state(&bench, &n.store), (10, scan("1.3.0")));
        let trust = trust_of(&n.store).to_string();
        assert!(trust.contains(&k2_id), "{trust}");
        // The build it kept now carries k3's signature, recorded from the re-signed copy.
        let listed = ok(run(&bench, &n.store, None, &["--json", "list"])).json();
        let version = listed["packages"][0]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["version"] == "1.3.0")
            .cloned()
            .unwrap();
        assert!(
            version["key_ids"].to_string().contains(&k3_id),
            "{}: {version}",
            n.store.display()
        );
    }
    let want = ok_line("1.3.0");
    for r in &runners {
        let lines: Vec<String> = r.lines.try_iter().map(|(_, l)| l).collect();
        assert!(lines.len() > 3, "{}: {lines:?}", r.name);
        assert!(lines.iter().all(|l| *l == want), "{}: {lines:?}", r.name);
        r.keeps("1.3.0", 3);
    }
    eprintln!("fleet_eight: key rotation at {:?}", started.elapsed());
    eprintln!("fleet_eight: done in {:?}", started.elapsed());
}
