//! Crash quarantine with real processes: a runner process (`guild resolve`, which loads every
//! enabled package as a runner does) dies of SIGSEGV in a plugin's `init`; the next one
//! quarantines that build, serves the other packages and reports it; `list`, `status` and
//! `doctor` show it with the process and the time; `guild quarantine clear` lifts it, and so does
//! a new version.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use guild_host::crash_quarantine::{CrashLedger, LOADING_DIR};
use guild_host::domain::ids::Sha256Digest;
use guild_host::InstallOptions;
use guild_test_support::plugins::{plugin_library, scan_spec};
use guild_test_support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

use crate::guild;

const CRASHY: &str = "example.crashy";

fn crashy(version: &str, library: &str) -> Spec {
    let mut spec = Spec::module(CRASHY, version).library(&plugin_library(library));
    spec.provided_ops = vec![format!("example.faulty.{}", &library["faulty_".len()..])];
    spec
}

fn install(root: &Path, shop: &Workshop, specs: &[Spec]) {
    let k = key();
    let (pm, _) = open_dir(root).unwrap();
    trust(&pm, PUBLISHER, &k);
    for spec in specs {
        let built = shop.build(spec, &k);
        // Installed without loading (no hook), as a store filled by another host would be.
        pm.install(&built.archive, InstallOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", spec.id));
    }
}

/// Runs a runner process: resolve the scan, which loads every enabled package first.
fn runner(root: &Path) -> (std::process::ExitStatus, u32, String, String) {
    let store = root.to_str().unwrap();
    let child = guild()
        .command(
            root.parent().unwrap(),
            &[
                "--store",
                store,
                "resolve",
                "example.sequence.inclusive_scan",
                "--input",
                "f32:4",
                "--output",
                "f32:4",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        pid,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_crash_in_init_quarantines_that_build_and_the_next_runner_serves_the_rest() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    install(
        &root,
        &shop,
        &[scan_spec("1.0.0"), crashy("1.0.0", "faulty_crash_init")],
    );

    // The first runner dies in the plugin's init, leaving its load record behind.
    let (status, pid, _, stderr) = runner(&root);
    assert_eq!(
        status.signal(),
        Some(11),
        "SIGSEGV expected: {status:?}\n{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(root.join(LOADING_DIR))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        left,
        vec![format!("{pid}-0.json")],
        "one record, named by the dead pid"
    );

    // The next runner quarantines the build, loads the scan and resolves it.
    let (status, _, stdout, stderr) = runner(&root);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("example.scan.inclusive.cpu"), "{stdout}");
    assert!(
        stderr.contains("quarantined") && stderr.contains(&format!("process {pid}")),
        "the runner reports the quarantine:\n{stderr}"
    );

    // list, status and doctor show it with the process and the time.
    let dir = shop.path();
    let s = root.to_str().unwrap();
    let q = listed_crash_quarantine(dir, s);
    assert_eq!(q.as_array().unwrap().len(), 1, "{q}");
    assert_eq!(q[0]["package_id"], CRASHY);
    assert_eq!(q[0]["pid"], pid);
    assert!(q[0]["started"].as_str().unwrap().ends_with('Z'), "{q}");
    let status_run = guild().run(dir, &["--store", s, "status", CRASHY]);
    assert!(
        status_run
            .stderr
            .contains(&format!("process {pid} died while loading it")),
        "{}",
        status_run.stderr
    );
    let doctor = guild().run(dir, &["--store", s, "--json", "doctor"]);
    let check = doctor.json()["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "quarantine")
        .cloned()
        .unwrap();
    assert_eq!(check["verdict"], "warn", "{check}");

    // Clearing it lets the same build load again, and it crashes again: the quarantine was what
    // kept the second runner alive.
    let clear = guild().run(dir, &["--store", s, "quarantine", "clear", CRASHY]);
    assert_eq!(clear.code, 0, "{}", clear.stderr);
    let (status, again, _, _) = runner(&root);
    assert_eq!(status.signal(), Some(11));
    let (status, _, stdout, stderr) = runner(&root);
    assert!(
        status.success() && stderr.contains(&format!("process {again}")),
        "{stdout}\n{stderr}"
    );

    // A new version (another digest) loads at once and lifts the quarantine.
    install(&root, &shop, &[crashy("1.0.1", "faulty_none")]);
    let (status, _, stdout, stderr) = runner(&root);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("quarantined"), "{stderr}");
    assert_eq!(listed_crash_quarantine(dir, s), serde_json::json!([]));
    let nothing = guild().run(dir, &["--store", s, "quarantine", "clear", CRASHY]);
    assert_eq!(nothing.code, 6, "{}", nothing.stderr);
}

/// The `crash_quarantine` entries of `guild --json list` on the store `store`, run in `dir`.
fn listed_crash_quarantine(dir: &Path, store: &str) -> serde_json::Value {
    let list = guild().run(dir, &["--store", store, "--json", "list"]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    list.json()["crash_quarantine"].clone()
}

/// The payload digest of the crashy package's first installed version.
fn crashy_digest(root: &Path) -> Sha256Digest {
    let (pm, _) = open_dir(root).unwrap();
    let package = pm
        .list()
        .unwrap()
        .into_iter()
        .find(|p| p.id.as_str() == CRASHY);
    package.unwrap().versions[0].payload_digest
}

/// A loading record as a host writes it, by hand (the tests decide its pid).
fn loading_record(root: &Path, name: &str, pid: u32, digest: &Sha256Digest) -> std::path::PathBuf {
    std::fs::create_dir_all(root.join(LOADING_DIR)).unwrap();
    let path = root.join(LOADING_DIR).join(name);
    let record = serde_json::json!({
        "package_id": CRASHY,
        "version": "1.0.0",
        "payload_sha256": digest.to_hex(),
        "pid": pid,
        "started_unix": 0,
    });
    std::fs::write(&path, record.to_string()).unwrap();
    path
}

/// A process that holds an exclusive lock on `path` until the test kills it.
fn lock_holder(path: &Path) -> std::process::Child {
    let mut child = std::process::Command::new("flock")
        .args(["--exclusive", "--nonblock", "--close"])
        .arg(path)
        .args(["sh", "-c", "echo locked; read _"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the flock utility runs");
    let mut line = String::new();
    use std::io::BufRead as _;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    child
}

/// A record whose writer is still running is another runner loading at the same time, not a
/// crash, whatever its pid says: here the pid is one no process has (as after a reuse race, or
/// on a system without `/proc`), and the writer is alive because it holds the record's lock.
#[test]
fn a_load_record_whose_writer_holds_it_is_not_a_crash_whatever_its_pid() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    let digest = Sha256Digest::parse_hex(&"ab".repeat(32)).unwrap();
    let path = loading_record(&root, "4999999-0.json", 4_999_999, &digest);
    let mut writer = lock_holder(&path);
    let ledger = CrashLedger::new(&root);
    let swept = ledger.sweep().unwrap().crashed;
    let live = path.exists();
    if !live || !swept.is_empty() {
        writer.kill().unwrap();
        writer.wait().unwrap();
    }
    assert!(swept.is_empty(), "a live writer's record was quarantined");
    assert!(live);
    assert!(ledger.quarantined().unwrap().is_empty());
    writer.kill().unwrap();
    writer.wait().unwrap();
    // Its writer is gone: the record is a crash now.
    let swept = ledger.sweep().unwrap().crashed;
    assert_eq!(swept.len(), 1);
    assert_eq!(swept[0].digest, digest);
    assert!(!path.exists());
    assert_eq!(ledger.quarantined().unwrap().len(), 1);
}

/// A quarantine entry that cannot be read fails closed: its digest stays refused with an error
/// naming the file and what is wrong, and `guild quarantine clear` removes it.
#[test]
fn a_torn_quarantine_entry_keeps_its_build_refused_until_cleared() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    let spec = crashy("1.0.0", "faulty_none");
    install(&root, &shop, &[scan_spec("1.0.0"), spec]);
    let digest = crashy_digest(&root);
    let quarantine = root.join("quarantine");
    std::fs::create_dir_all(&quarantine).unwrap();
    let entry = quarantine.join(format!("{}.json", digest.to_hex()));
    std::fs::write(&entry, b"{\"package_id\": \"example.cra").unwrap();

    let (status, _, stdout, stderr) = runner(&root);
    assert!(
        status.success(),
        "the rest still serves: {stdout}\n{stderr}"
    );
    assert!(
        stderr.contains(CRASHY) && stderr.contains(&entry.display().to_string()),
        "the refusal names the entry's file:\n{stderr}"
    );
    assert!(stderr.contains("not JSON"), "and what is wrong:\n{stderr}");
    let dir = shop.path();
    let s = root.to_str().unwrap();
    let q = listed_crash_quarantine(dir, s);
    assert_eq!(q.as_array().unwrap().len(), 1, "{q}");
    assert_eq!(q[0]["payload_sha256"], digest.to_hex(), "{q}");

    let clear = guild().run(dir, &["--store", s, "quarantine", "clear", CRASHY]);
    assert_eq!(clear.code, 0, "{}", clear.stderr);
    assert!(!entry.exists());
    let (status, _, stdout, stderr) = runner(&root);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("quarantine"), "{stderr}");
}

/// An error of the ledger names the file it was about, not the store.
#[test]
fn a_crash_record_error_names_its_file() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    install(&root, &shop, &[scan_spec("1.0.0")]);
    let digest = Sha256Digest::parse_hex(&"cd".repeat(32)).unwrap();
    loading_record(&root, "4999999-0.json", 4_999_999, &digest);
    // The quarantine entry cannot be written: something else has its directory's name.
    std::fs::write(root.join("quarantine"), b"not a directory").unwrap();
    let err = guild_host::Host::builder(&root)
        .devices(guild_host::DeviceSupport::host())
        .open()
        .map(|_| ())
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&root.join("quarantine").display().to_string()),
        "{text}"
    );
    assert!(
        root.join(LOADING_DIR).join("4999999-0.json").exists(),
        "the record stays"
    );
}

/// The host reads the quarantine when it opens and when it refreshes, and a quarantine that
/// another process wrote meanwhile is refused at the next refresh.
#[test]
fn a_quarantine_written_by_another_process_is_refused_at_the_next_refresh() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    install(&root, &shop, &[scan_spec("1.0.0")]);
    let opened = guild_host::Host::builder(&root)
        .devices(guild_host::DeviceSupport::host())
        .open()
        .unwrap();
    let host = opened.host;
    // Another host died loading 1.0.1 of the crashy package, which is now installed.
    install(&root, &shop, &[crashy("1.0.1", "faulty_none")]);
    let digest = crashy_digest(&root);
    loading_record(&root, "4999999-0.json", 4_999_999, &digest);
    let report = host.refresh().unwrap();
    let failed = format!("{report:?}");
    assert!(
        failed.contains("CrashQuarantined") && failed.contains(CRASHY),
        "the build another process crashed in is refused: {failed}"
    );
}

/// Waits, at most [`PATIENCE`](std::time::Duration), for a load record to appear under `root`.
fn wait_for_load_record(root: &Path) {
    let start = std::time::Instant::now();
    let loading = root.join(LOADING_DIR);
    loop {
        let found = std::fs::read_dir(&loading).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "json"))
        });
        if found {
            return;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "no load record appeared in {}",
            loading.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A routine stop is not a crash: the example runner, stopped with SIGTERM (what `systemctl
/// stop` sends) while a sound library sleeps in its `init`, ends by that signal as before, and
/// the build it was loading is not quarantined; the next runner loads it.
#[test]
fn a_runner_stopped_by_sigterm_during_a_slow_init_quarantines_nothing() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    let mut slow = Spec::module("example.slow", "1.0.0").library(&plugin_library("init_slow"));
    slow.provided_ops = vec!["example.slow.op".to_owned()];
    install(&root, &shop, &[slow]);

    let child = std::process::Command::new(crate::examples::runner_binary())
        .arg("--serve")
        .arg(&root)
        .arg("example.slow.op")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_load_record(&root);
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.signal(),
        Some(15),
        "the runner ends by SIGTERM: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    let ledger = CrashLedger::new(&root);
    let swept = ledger.sweep().unwrap();
    assert!(
        swept.crashed.is_empty(),
        "a routine stop was taken for a crash: {swept:?}"
    );
    assert_eq!(
        swept
            .interrupted
            .iter()
            .map(|i| (i.record.package.as_str(), i.signal))
            .collect::<Vec<_>>(),
        [("example.slow", 15)],
        "the ledger says how the load ended"
    );
    assert!(ledger.quarantined().unwrap().is_empty());
    // The next runner loads the build.
    let (_, report) = guild_host::Host::builder(&root)
        .devices(guild_host::operations::DeviceSupport::host())
        .open()
        .map(|o| (o.host, o.report))
        .unwrap();
    assert!(
        report.loaded.failed.is_empty() && report.quarantined.is_empty(),
        "{report:#?}"
    );
}

/// A runner started with SIGHUP ignored (`nohup`, a shell's background job) keeps ignoring it
/// after installing its termination handlers: SIGHUP leaves it running, and SIGTERM then ends
/// it.
#[test]
fn a_runner_started_with_sighup_ignored_keeps_ignoring_it() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    install(&root, &shop, &[]);
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' HUP; exec \"$0\" --serve --interval-ms 20 \"$1\" example.none.op")
        .arg(crate::examples::runner_binary())
        .arg(&root)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its first round of executions shows it serving (with its handlers installed).
    let mut line = String::new();
    use std::io::BufRead as _;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    assert!(line.contains("example.none.op"), "{line}");
    let pid = child.id().to_string();
    for signal in ["-HUP", "-TERM"] {
        let sent = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(sent.success());
    }
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(15),
        "SIGHUP, ignored when the runner started, must not end it: {status:?}"
    );
}
