//! Several serving runner processes on one store converge on what the operator commits, whatever
//! fails on the way.
//!
//! A driver (this test) commits a seeded random sequence of installs, rollbacks, disables,
//! enables and revocations of the example scan while faults make the runners' steps fail for a
//! while: their loader refuses every library, the pin directory cannot take a pin, the crash
//! record directory cannot be listed or written. Each runner is this test binary started again
//! ([`a_serving_runner_process`]): a host with a watcher, executing the scan every few
//! milliseconds and printing what it serves. After the last fault and the last commit, every
//! runner must serve what a freshly opened host loads from the store, within [`PATIENCE`]; and
//! no runner may ever execute a version after one of its refreshes reported that version
//! revoked. The test prints its seed; `GUILD_CONVERGE_SEED=N` runs the same sequence again,
//! `GUILD_CONVERGE_STEPS` and `GUILD_CONVERGE_RUNNERS` make the run longer or wider.

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use guild_adapters_posix::DlopenLoader;
use guild_host::ports::loader::{
    LoadError, LoadErrorKind, LoadRequest, LoadedPlugin, PluginLoader,
};
use guild_host::{
    DType, Host, HostError, InstallOptions, MemorySpace, OpHandle, OperationRequest,
    OperationService, RefreshReport, TensorArg, TensorArgMut, TensorDesc,
};
use guild_test_support::{id, key, open_dir, trust, Workshop, PUBLISHER};

use crate::examples::{pack_example_at, SCAN};

const STORE_ENV: &str = "GUILD_IT_CONVERGE_STORE";
const FAULTS_ENV: &str = "GUILD_IT_CONVERGE_FAULTS";
use guild_test_support::plugins::INCLUSIVE_OP as OP;
use guild_test_support::plugins::SCAN_PACKAGE as PACKAGE;
/// Every line a runner prints for the driver starts with this (libtest prints its own lines).
const TAG: &str = "converge:";

/// How long a runner may take to reach the committed state once nothing fails any more: only a
/// runner that never gets there exceeds it (a deadlock guard, not a timing assertion; the
/// times are printed).
const PATIENCE: Duration = Duration::from_secs(30);

/// SplitMix64: a small seeded generator, so that a printed seed replays the run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The dlopen loader, failing every load while the driver's `loader` fault file exists.
struct FaultyLoader {
    faults: PathBuf,
}

impl PluginLoader for FaultyLoader {
    fn load(&self, request: &LoadRequest) -> Result<LoadedPlugin, LoadError> {
        if self.faults.join("loader").exists() {
            return Err(LoadError::new(
                LoadErrorKind::InitFailed {
                    status: -1,
                    status_name: "GUILD_STATUS_ERR_INTERNAL",
                    component: "convergence".into(),
                    message: "an injected loader fault".into(),
                },
                request,
            ));
        }
        DlopenLoader::new().load(request)
    }
}

fn scan_desc() -> TensorDesc {
    TensorDesc::new(DType::I64, &[4, 2], MemorySpace::Host)
}

fn resolve<'r>(service: &OperationService<'r>) -> Option<OpHandle<'r>> {
    let d = scan_desc();
    service
        .resolve(&OperationRequest::cpu(
            guild_host::OpName::new(OP).unwrap(),
            vec![d],
            vec![d],
        ))
        .ok()
}

/// Adds to `revoked` every version `outcome` reports taken out as no longer authenticated.
fn note_revocations(outcome: &Result<RefreshReport, HostError>, revoked: &Mutex<BTreeSet<String>>) {
    let Ok(report) = outcome else { return };
    let mut revoked = revoked.lock().unwrap();
    for q in &report.taken_out {
        if q.id.as_str() == PACKAGE && q.reason.starts_with("no longer authenticated") {
            revoked.insert(q.version.to_string());
        }
    }
    for live in &report.revoked_live {
        if live.id.as_str() == PACKAGE {
            revoked.insert(live.version.to_string());
        }
    }
}

/// The serving runner the convergence test starts, one process each: not a test on its own.
///
/// It executes the scan every few milliseconds, dropping its handle once it is no longer
/// current (and refreshing then, as a serving runner does), while a watcher follows the store.
/// Before each execution it takes the versions its refreshes have reported revoked so far; it
/// prints a violation when the handle it then executes is of one of them. It prints the
/// version it serves whenever that changes.
#[test]
#[ignore = "the runner process of convergence::runners_reach_the_committed_state_after_faults"]
fn a_serving_runner_process() {
    let store = PathBuf::from(
        std::env::var_os(STORE_ENV)
            .expect("started by the convergence test, which names the store"),
    );
    let faults = PathBuf::from(std::env::var_os(FAULTS_ENV).unwrap());
    let host = Host::builder(&store)
        .devices(guild_host::operations::DeviceSupport::host())
        .loader(Box::new(FaultyLoader { faults }))
        .open()
        .expect("the runner's host opens")
        .host;
    let host = Arc::new(host);
    let revoked = Arc::new(Mutex::new(BTreeSet::new()));
    let watcher_revoked = Arc::clone(&revoked);
    let _watcher = host
        .watch(Duration::from_millis(200), move |outcome| {
            note_revocations(outcome, &watcher_revoked);
        })
        .expect("the runner watches the store");
    let service = OperationService::new(host.kernels());
    let package = id(PACKAGE);
    let input: Vec<i64> = (1..=8).collect();
    let mut output = vec![0_i64; 8];
    let mut handle: Option<OpHandle<'_>> = None;
    let mut last = String::new();
    println!("{TAG} started");
    loop {
        // What the refreshes have reported revoked before this execution begins.
        let reported = revoked.lock().unwrap().clone();
        if handle.as_ref().is_some_and(|h| !h.is_current()) {
            handle = None;
            note_revocations(&host.refresh(), &revoked);
        }
        if handle.is_none() {
            handle = resolve(&service);
        }
        if let Some(h) = &handle {
            let version = h.describe().package_version.to_string();
            let d = scan_desc();
            let ran = h.execute(
                &[TensorArg::new(&d, &input)],
                &mut [TensorArgMut::new(&d, &mut output)],
                None,
            );
            if ran.is_ok() && reported.contains(&version) {
                println!("{TAG} violation: executed {PACKAGE}@{version} after a refresh reported it revoked");
            }
        }
        let serving = host
            .kernels()
            .loaded_version(&package)
            .map_or_else(|| "none".to_owned(), |v| v.to_string());
        if serving != last {
            println!("{TAG} serving {serving} {}", unix_ms());
            last = serving;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Milliseconds since the Unix epoch: a clock the driver and its runner processes share.
fn unix_ms() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(now.as_millis()).unwrap()
}

/// One runner process and what it printed for the driver.
struct Runner {
    child: Child,
    lines: Receiver<String>,
    /// The version it serves, and since when ([`unix_ms`]).
    serving: String,
    since_ms: u64,
    violations: Vec<String>,
}

impl Runner {
    fn start(store: &Path, faults: &Path) -> Runner {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "convergence::a_serving_runner_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(STORE_ENV, store)
            .env(FAULTS_ENV, faults)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the runner process starts");
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // libtest's "test ... " may precede the first line on the same line.
                if let Some(at) = line.find(TAG) {
                    if tx.send(line[at + TAG.len()..].trim().to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        let mut runner = Runner {
            child,
            lines,
            serving: String::new(),
            since_ms: 0,
            violations: Vec::new(),
        };
        runner.wait_for(|line| line == "started", "start");
        runner
    }

    fn take(&mut self, line: String) {
        if let Some(rest) = line.strip_prefix("serving ") {
            let (version, at) = rest.split_once(' ').unwrap_or((rest, "0"));
            self.serving = version.to_owned();
            self.since_ms = at.parse().unwrap_or(0);
        } else if line.starts_with("violation") {
            self.violations.push(line);
        }
    }

    /// Reads lines until one satisfies `done`, for at most [`PATIENCE`].
    fn wait_for(&mut self, done: impl Fn(&str) -> bool, what: &str) {
        let start = Instant::now();
        loop {
            let left = PATIENCE.saturating_sub(start.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let finished = done(&line);
                    self.take(line);
                    if finished {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("a runner did not {what} within {PATIENCE:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "a runner exited before it could {what}: {:?}",
                        self.child.try_wait()
                    )
                }
            }
        }
    }

    /// Takes every line printed so far.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.take(line);
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The faults the driver injects, each on for a while: the runners' loader fails, the pin
/// directory is a plain file (no pin can be taken), the crash-record directory is a plain file
/// (it can be neither listed nor written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Loader,
    Pins,
    CrashRecords,
}

impl Fault {
    const ALL: [Fault; 3] = [Fault::Loader, Fault::Pins, Fault::CrashRecords];

    fn set(self, store: &Path, faults: &Path, on: bool) {
        let swap = |name: &str| {
            let dir = store.join(name);
            let aside = store.join(format!("{name}.aside"));
            if on {
                if dir.exists() {
                    std::fs::rename(&dir, &aside).unwrap();
                }
                std::fs::write(&dir, b"an injected fault").unwrap();
            } else {
                std::fs::remove_file(&dir).unwrap();
                if aside.exists() {
                    std::fs::rename(&aside, &dir).unwrap();
                }
            }
        };
        match self {
            Fault::Loader if on => std::fs::write(faults.join("loader"), b"").unwrap(),
            Fault::Loader => std::fs::remove_file(faults.join("loader")).unwrap(),
            Fault::Pins => swap("pins"),
            Fault::CrashRecords => swap("quarantine"),
        }
    }
}

/// What the operator does at one step.
#[derive(Debug, Clone, Copy)]
enum Commit {
    Install,
    Rollback,
    Disable,
    Enable,
    Revoke,
}

/// The version a host freshly opened on `store` loads of the scan ("none" when it loads none):
/// the committed state every runner must reach.
fn committed(store: &Path) -> String {
    let host = Host::builder(store)
        .devices(guild_host::operations::DeviceSupport::host())
        .open()
        .expect("a fresh host opens on the store")
        .host;
    host.kernels()
        .loaded_version(&id(PACKAGE))
        .map_or_else(|| "none".to_owned(), |v| v.to_string())
}

#[test]
fn runners_reach_the_committed_state_after_faults() {
    let seed = env_number("GUILD_CONVERGE_SEED", unix_ms());
    let steps = env_number("GUILD_CONVERGE_STEPS", 24) as usize;
    let runners = env_number("GUILD_CONVERGE_RUNNERS", 3) as usize;
    eprintln!(
        "convergence: seed {seed} ({steps} steps, {runners} runners); replay with \
         GUILD_CONVERGE_SEED={seed}"
    );
    let mut rng = Rng(seed);
    let shop = Workshop::new();
    let k = key();
    let store = shop.fresh("store");
    let faults = shop.fresh("faults");
    std::fs::create_dir_all(&faults).unwrap();
    // Enough versions that installs go on all run long.
    let versions: Vec<String> = (0..(steps / 3).max(8))
        .map(|i| format!("1.{i}.0"))
        .collect();
    let archives: Vec<PathBuf> = versions
        .iter()
        .map(|v| pack_example_at(&shop, &k, &SCAN, Some(v)))
        .collect();
    {
        let (pm, _) = open_dir(&store).unwrap();
        trust(&pm, PUBLISHER, &k);
        pm.install(&archives[0], InstallOptions::default()).unwrap();
    }
    let mut procs: Vec<Runner> = (0..runners)
        .map(|_| Runner::start(&store, &faults))
        .collect();

    let package = id(PACKAGE);
    let mut installed = 1;
    let mut on: BTreeSet<Fault> = BTreeSet::new();
    let (mut commits, mut refused, mut injected) = (0, 0, 0);
    let (mut last_fault_off, mut last_commit) = (unix_ms(), unix_ms());
    // Faults come and go all along, and at least one is on at the last commit, so that the
    // runners catch up after the faults end with no new commit to prompt them.
    for step in 0..steps {
        let last = step + 1 == steps;
        if rng.below(2) == 0 || (last && on.is_empty()) {
            let fault = Fault::ALL[rng.below(Fault::ALL.len())];
            let now_on = !on.contains(&fault) || (last && on.len() == 1);
            if now_on && !on.contains(&fault) {
                fault.set(&store, &faults, true);
                on.insert(fault);
                injected += 1;
            } else if !now_on {
                fault.set(&store, &faults, false);
                on.remove(&fault);
                last_fault_off = unix_ms();
            }
        }
        // Mostly changes that leave something enabled; a revocation now and then. The last
        // commit moves to a new version while a fault is on.
        let commit = if last {
            Commit::Install
        } else {
            [
                Commit::Install,
                Commit::Install,
                Commit::Install,
                Commit::Rollback,
                Commit::Rollback,
                Commit::Disable,
                Commit::Enable,
                Commit::Enable,
                Commit::Revoke,
            ][rng.below(9)]
        };
        let outcome: Result<(), HostError> = open_dir(&store).and_then(|(pm, _)| match commit {
            Commit::Install if installed < versions.len() => {
                let r = pm.install(&archives[installed], InstallOptions::default());
                if r.is_ok() {
                    installed += 1;
                }
                r.map(drop)
            }
            Commit::Install => Ok(()),
            Commit::Rollback => pm.rollback(&package).map(drop),
            Commit::Disable => pm.disable(&package).map(drop),
            Commit::Enable => pm.enable(&package).map(drop),
            Commit::Revoke => {
                let version = versions[rng.below(installed)].parse().unwrap();
                let digest = pm.metadata(&package, &version).map(|m| m.payload_digest());
                match digest {
                    Some(digest) => pm.update_trust(|t| {
                        t.revoke_digest(digest, "convergence test");
                        Ok(())
                    }),
                    None => Ok(()),
                }
            }
        });
        match outcome {
            Ok(()) => {
                commits += 1;
                last_commit = unix_ms();
            }
            // Refused by the rules (nothing to roll back to, already disabled, ...) or by a
            // fault in the store: nothing committed.
            Err(_) => refused += 1,
        }
        for p in &mut procs {
            p.drain();
        }
        std::thread::sleep(Duration::from_millis(20 + rng.below(60) as u64));
    }
    for fault in std::mem::take(&mut on) {
        fault.set(&store, &faults, false);
        last_fault_off = unix_ms();
    }
    let settled = last_fault_off.max(last_commit);
    let want = committed(&store);

    let (mut after_fault, mut after_settled) = (0, 0);
    for p in &mut procs {
        p.drain();
        if p.serving != want {
            let w = format!("serving {want} ");
            p.wait_for(
                move |line| line.starts_with(&w),
                "reach the committed state",
            );
        }
        after_fault = after_fault.max(p.since_ms.saturating_sub(last_fault_off));
        after_settled = after_settled.max(p.since_ms.saturating_sub(settled));
    }
    // A last look, for violations printed and states left while the others caught up.
    std::thread::sleep(Duration::from_millis(100));
    for (n, p) in procs.iter_mut().enumerate() {
        p.drain();
        assert!(
            p.violations.is_empty(),
            "runner {n} executed revoked code {} times (seed {seed}); the first: {:?}",
            p.violations.len(),
            p.violations.first()
        );
        assert_eq!(
            p.serving, want,
            "runner {n} left the committed state (seed {seed})"
        );
    }
    eprintln!(
        "convergence: seed {seed}: {commits} commits ({refused} refused), {injected} faults \
         injected, committed state {PACKAGE}@{want}; the last runner got there {after_fault} ms \
         after the last fault ended, {after_settled} ms after the last fault or commit"
    );
}
