//! Many processes on one store, measured in one run with real processes (the `guild` binary and
//! `guild-example-runner`, built by cargo):
//!
//! 1. **Follow latency**: the time from `guild install` (or `rollback`) returning to the first
//!    line a serving runner prints from the new version, with the runner's watcher (inotify) and,
//!    as the baseline, with a runner that checks for a new generation before every round
//!    (`--poll`). Both runners execute every 5 ms, so the round is not what is measured. A line
//!    that arrived before the command returned counts as 0 (the runner had switched while the
//!    command was still exiting); so that the figure says something then too, the time from the
//!    commit itself (its frame in `registry.log`, seen by the benchmark's own inotify
//!    watch) to that line is reported beside it.
//! 2. **Concurrent opens**: the wall time of one reader process (`guild-example-runner STORE
//!    OP`: open the store without its lock, verify, load, execute once, exit) alone, against 8
//!    started at once on the same store, and against 8 started at once on 8 private copies of
//!    it (the same work with nothing shared: what the machine's cores allow). Sharing the store
//!    serialises nothing when "8 on one store" matches "8 on private copies"; "8 at once / one
//!    alone" is bounded below by the work per core on a machine with fewer than 8 cores. So
//!    that such a machine still says what sharing costs when every reader has a core, as many
//!    readers as there are cores (at most 8) are also started at once on the one store. "At
//!    once" means released together from a barrier (each reader is a waiting shell that execs
//!    the runner), timed from the release. Where a CUDA device is found, the same readers with
//!    `--cpu-only` show what the driver's initialisation costs them apart from the store.
//!
//! The second part ends with a verdict on the goal (8 at once under 1.5x one alone), given at
//! least 8 cores. `GUILD_BENCH_ONLY=open` runs the second part alone; `GUILD_BENCH_BIN_DIR`
//! names a directory holding the two executables (nothing is built then) and
//! `GUILD_BENCH_WORKSPACE` a directory holding `examples/modules/scan/manifest.json` (how the
//! GPU bundle runs it far from a checkout).
//!
//! `cargo bench --bench live` takes 20 samples of each; without `--bench` (as under `cargo test
//! --benches`) one of each. Build the C plugins first: `cargo xtask plugins`.

#[path = "common/mod.rs"]
mod common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use guild_adapters_crypto::SigningKey;
use guild_domain::json::{self, Value};
use guild_host::packaging::pack;
use guild_host::InstallOptions;
use guild_test_support::plugins::plugin_library;
use guild_test_support::{key, open_dir, platform, trust, Workshop, PUBLISHER};

const OP: &str = "example.sequence.inclusive_scan";

/// The checkout, or what `GUILD_BENCH_WORKSPACE` names (the GPU bundle carries the one file
/// read from it, the scan module's manifest template).
fn workspace() -> PathBuf {
    std::env::var_os("GUILD_BENCH_WORKSPACE").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
        PathBuf::from,
    )
}

/// Builds `guild` and the example runner and answers their executables: optimised for a
/// measurement (`full`), the dev build when the benchmark only runs once as a test.
fn binaries(full: bool) -> (PathBuf, PathBuf) {
    (
        guild_test_support::cargo_binary_with("guild-cli", "guild", full),
        guild_test_support::cargo_binary_with("guild-example-runner", "guild-example-runner", full),
    )
}

/// The scan example module packed at `version` and signed with `key`.
fn scan(shop: &Workshop, key: &SigningKey, version: &str) -> PathBuf {
    let base = shop.fresh("scan");
    std::fs::create_dir_all(base.join("src/lib")).unwrap();
    std::fs::write(
        base.join("src/lib/libscan_module.so"),
        plugin_library("scan_module"),
    )
    .unwrap();
    let text = std::fs::read(workspace().join("examples/modules/scan/manifest.json")).unwrap();
    let Value::Object(mut members) = json::parse(&text).unwrap() else {
        panic!("the scan template is not an object")
    };
    let here = platform();
    for (name, value) in &mut members {
        match name.as_str() {
            "os" => *value = here.os.as_str().into(),
            "arch" => *value = here.arch.as_str().into(),
            "version" => *value = version.into(),
            _ => {}
        }
    }
    let template = base.join("manifest.json");
    std::fs::write(&template, Value::Object(members).to_pretty_string()).unwrap();
    let archive = base.join(format!("scan-{version}.gkmodule"));
    pack(&base.join("src"), &template, &archive, Some(key)).unwrap();
    archive
}

/// A store with the publisher trusted and scan 1.0.0 installed; the key.
fn store(shop: &Workshop) -> (PathBuf, SigningKey) {
    let k = key();
    let root = shop.fresh("store");
    let (pm, _) = open_dir(&root).unwrap();
    trust(&pm, PUBLISHER, &k);
    pm.install(&scan(shop, &k, "1.0.0"), InstallOptions::default())
        .unwrap();
    (root, k)
}

/// A serving runner whose lines arrive with the instant they were read.
struct Serving {
    child: Child,
    lines: Receiver<(Instant, String)>,
}

impl Serving {
    fn start(runner: &Path, store: &Path, poll: bool) -> Serving {
        let mut cmd = Command::new(runner);
        cmd.args(["--serve", "--interval-ms", "5"]);
        if poll {
            cmd.arg("--poll");
        }
        let mut child = cmd
            .arg(store)
            .arg(OP)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Serving { child, lines }
    }

    /// The arrival of the first line from `version` (bounded by a deadlock guard).
    fn first_of(&self, version: &str) -> Instant {
        let want = format!("example.scan@{version} ok");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, line) = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the runner never served {version}"));
            if line.ends_with(&want) {
                return at;
            }
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn guild(bin: &Path, store: &Path, args: &[&str]) {
    let out = Command::new(bin)
        .arg("--store")
        .arg(store)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "guild {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Follow latencies of a runner (watching, or polling) over `samples` install/rollback pairs:
/// from the command's return, and from its commit.
fn follow(
    shop: &Workshop,
    bins: &(PathBuf, PathBuf),
    poll: bool,
    samples: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let (root, k) = store(shop);
    let v11 = scan(shop, &k, "1.1.0");
    let (tx, commits) = channel();
    let _watch = guild_adapters_fs::store::StoreWatcher::new(&root, move || {
        let _ = tx.send(Instant::now());
    })
    .unwrap();
    let serving = Serving::start(&bins.1, &root, poll);
    serving.first_of("1.0.0");
    let (mut from_return, mut from_commit) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        for (args, version) in [
            (vec!["install", v11.to_str().unwrap()], "1.1.0"),
            (vec!["rollback", "example.scan"], "1.0.0"),
        ] {
            let _: Vec<Instant> = commits.try_iter().collect();
            guild(&bins.0, &root, &args);
            let returned = Instant::now();
            let served = serving.first_of(version);
            from_return.push(served.saturating_duration_since(returned));
            let committed = commits
                .try_iter()
                .filter(|at| *at <= served)
                .last()
                .unwrap_or(returned);
            from_commit.push(served.saturating_duration_since(committed));
        }
    }
    (from_return, from_commit)
}

/// Wall time until `n` one-shot readers started at once (on `stores[i % len]`) have all exited.
fn readers(runner: &Path, stores: &[PathBuf], n: usize) -> Duration {
    readers_with(runner, stores, n, &[])
}

/// [`readers`], each started with `flags` before its arguments.
///
/// The readers start together: each is a shell waiting on its stdin that then `exec`s the
/// runner, and every shell is released at once, 50 ms after the last was started. Spawning
/// them one after another from here would otherwise stagger their starts by the parent's
/// fork and exec of each, which is as long as a whole reader's run when it loads no GPU driver.
/// The time runs from the release.
fn readers_with(runner: &Path, stores: &[PathBuf], n: usize, flags: &[&str]) -> Duration {
    use std::io::Write as _;
    let mut children: Vec<Child> = (0..n)
        .map(|i| {
            Command::new("sh")
                .args(["-c", "read -r go && exec \"$0\" \"$@\""])
                .arg(runner)
                .args(flags)
                .arg(&stores[i % stores.len()])
                .arg(OP)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    for c in &mut children {
        let mut stdin = c.stdin.take().expect("piped");
        stdin.write_all(b"go\n").unwrap();
    }
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a reader failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    start.elapsed()
}

/// The CPU time (user + system) of this process's children that have been waited for, from
/// `/proc/self/stat` (fields `cutime` and `cstime`, in Linux's fixed `USER_HZ` of 100 per second).
fn children_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces; the first
    // of them is field 3 (`state`), so `cutime` (16) and `cstime` (17) are the 14th and 15th.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(Vec::new(), |(_, rest)| rest.split(' ').collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(13) + ticks(14)) * 10)
}

/// A copy of the store at `from` (its files only; pins and locks are per copy).
fn copy_store(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let samples: usize = if full { 20 } else { 1 };
    let bins = binaries(full);
    let shop = Workshop::new();
    // `GUILD_BENCH_ONLY=open` measures the concurrent opens alone.
    if std::env::var("GUILD_BENCH_ONLY").as_deref() != Ok("open") {
        follow_figures(&shop, &bins, samples);
    }
    open_figures(&shop, &bins, samples);
}

/// The follow latency of a watching runner against a polling one.
fn follow_figures(shop: &Workshop, bins: &(PathBuf, PathBuf), samples: usize) {
    let (watched, watched_commit) = follow(shop, bins, false, samples.div_ceil(2));
    let (polled, polled_commit) = follow(shop, bins, true, samples.div_ceil(2));
    let early = |v: &[Duration]| v.iter().filter(|d| d.is_zero()).count();
    println!(
        "live/follow: first execute on the new version after install or rollback (median of {} \
         changes, runner round 5 ms); from the command's return / from its commit",
        watched.len()
    );
    println!(
        "  watcher (inotify)      {} / {}  (max {} / {}; {} of {} served before the command \
         returned); goal < 100 ms",
        ms(median(watched.clone())),
        ms(median(watched_commit.clone())),
        ms(*watched.iter().max().unwrap()),
        ms(*watched_commit.iter().max().unwrap()),
        early(&watched),
        watched.len()
    );
    println!(
        "  baseline: poll a round {} / {}  (max {} / {}; {} of {} before the return)",
        ms(median(polled.clone())),
        ms(median(polled_commit.clone())),
        ms(*polled.iter().max().unwrap()),
        ms(*polled_commit.iter().max().unwrap()),
        early(&polled),
        polled.len()
    );
}

/// One reader process alone against 8 at once on one store, on private copies, and one per
/// core, with the verdict on the goal (8 at once under 1.5x one alone, given 8 cores).
fn open_figures(shop: &Workshop, bins: &(PathBuf, PathBuf), samples: usize) {
    let (root, _) = store(shop);
    let copies: Vec<PathBuf> = (0..8)
        .map(|i| {
            let to = shop.fresh(&format!("copy{i}"));
            copy_store(&root, &to);
            to
        })
        .collect();
    // One warm-up of each, so that the first sample does not pay for cold caches.
    readers(&bins.1, std::slice::from_ref(&root), 1);
    readers(&bins.1, &copies, 8);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // As many at once as there are cores (at most 8): what 8 at once would show on a machine
    // with 8 cores, as far as the store is concerned.
    let per_core = cores.min(8);
    let (mut one, mut shared, mut private) = (Vec::new(), Vec::new(), Vec::new());
    let mut core_each = Vec::new();
    let mut one_cpu = Duration::ZERO;
    for _ in 0..samples {
        let before = children_cpu();
        one.push(readers(&bins.1, std::slice::from_ref(&root), 1));
        one_cpu += children_cpu().saturating_sub(before);
        shared.push(readers(&bins.1, std::slice::from_ref(&root), 8));
        private.push(readers(&bins.1, &copies, 8));
        core_each.push(readers(&bins.1, std::slice::from_ref(&root), per_core));
    }
    let (one, shared, private) = (median(one), median(shared), median(private));
    let core_each = median(core_each);
    println!(
        "live/open: reader processes (open without the lock, verify, load, execute once), \
         median of {samples}, {cores} core(s)"
    );
    // What the cores allow: 8 readers' CPU time spread over every core, or one reader's wall
    // time, whichever is longer. Under 8 cores this bound, not sharing, sets the 8-reader figure.
    let cpu = one_cpu / samples as u32;
    let bound = (cpu * 8 / cores as u32).max(one);
    println!(
        "  1 alone                  {}  (CPU {} per reader, user + system)",
        ms(one),
        ms(cpu)
    );
    println!(
        "  8 at once, one store     {}  ({:.2}x one alone; goal < 1.5x; {:.2}x what {cores} \
         core(s) allow, {})",
        ms(shared),
        shared.as_secs_f64() / one.as_secs_f64(),
        shared.as_secs_f64() / bound.as_secs_f64(),
        ms(bound)
    );
    println!(
        "  8 at once, private copies {} ({:.2}x one alone): sharing the store costs {:.2}x",
        ms(private),
        private.as_secs_f64() / one.as_secs_f64(),
        shared.as_secs_f64() / private.as_secs_f64()
    );
    println!(
        "  {per_core} at once (one per core), one store {}  ({:.2}x one alone)",
        ms(core_each),
        core_each.as_secs_f64() / one.as_secs_f64()
    );
    // A reader detects the CUDA devices when it opens; on a machine with a GPU that initialises
    // the driver, which all readers do at once. The same readers with `--cpu-only` show what
    // opening the store alone costs them.
    let (devices, _) = guild_host::DeviceSupport::detect();
    if devices.cuda_sm.is_some() {
        let cpu_only = ["--cpu-only"];
        let (mut one_cpu_only, mut shared_cpu_only) = (Vec::new(), Vec::new());
        let mut cpu_only_cpu = Duration::ZERO;
        readers_with(&bins.1, std::slice::from_ref(&root), 1, &cpu_only);
        for _ in 0..samples {
            let before = children_cpu();
            one_cpu_only.push(readers_with(
                &bins.1,
                std::slice::from_ref(&root),
                1,
                &cpu_only,
            ));
            cpu_only_cpu += children_cpu().saturating_sub(before);
            shared_cpu_only.push(readers_with(
                &bins.1,
                std::slice::from_ref(&root),
                8,
                &cpu_only,
            ));
        }
        let (a, b) = (median(one_cpu_only), median(shared_cpu_only));
        println!(
            "  --cpu-only (no CUDA driver initialisation): 1 alone {} (CPU {}), 8 at once on \
             one store {} ({:.2}x one alone); detecting the GPU costs each reader {} of wall time",
            ms(a),
            ms(cpu_only_cpu / samples as u32),
            ms(b),
            b.as_secs_f64() / a.as_secs_f64(),
            ms(one.saturating_sub(a))
        );
    }
    let ratio = shared.as_secs_f64() / one.as_secs_f64();
    let verdict = if cores < 8 {
        format!(
            "no verdict: {cores} core(s) cannot run 8 readers at once (see the one-per-core row)"
        )
    } else if ratio < 1.5 {
        format!("met ({ratio:.2}x < 1.5x)")
    } else {
        format!("NOT met ({ratio:.2}x >= 1.5x)")
    };
    println!(
        "  verdict: 8 reader processes at once on one store, goal under 1.5x one alone: {verdict}"
    );
}
