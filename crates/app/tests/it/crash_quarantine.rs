//! Crash quarantine with real processes: a runner process (`guild resolve`, which loads every
//! enabled package as a runner does) dies of SIGSEGV in a plugin's `init`; the next one
//! quarantines that build, serves the other packages and reports it; `list`, `status` and
//! `doctor` show it with the process and the time; `guild quarantine clear` lifts it, and so does
//! a new version.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use guild_host::crash_quarantine::{CrashLedger, CrashRecord, LOADING_DIR};
use guild_host::InstallOptions;

use crate::cli::{guild, guild_command};
use crate::operations::{plugin_library, scan_spec};
use crate::support::{key, open_dir, trust, Spec, Workshop, PUBLISHER};

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
    let child = guild_command(
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
    let list = guild(dir, &["--store", s, "--json", "list"]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    let q = &list.json()["crash_quarantine"];
    assert_eq!(q.as_array().unwrap().len(), 1, "{q}");
    assert_eq!(q[0]["package_id"], CRASHY);
    assert_eq!(q[0]["pid"], pid);
    assert!(q[0]["started"].as_str().unwrap().ends_with('Z'), "{q}");
    let status_run = guild(dir, &["--store", s, "status", CRASHY]);
    assert!(
        status_run
            .stderr
            .contains(&format!("process {pid} died while loading it")),
        "{}",
        status_run.stderr
    );
    let doctor = guild(dir, &["--store", s, "--json", "doctor"]);
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
    let clear = guild(dir, &["--store", s, "quarantine", "clear", CRASHY]);
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
    let list = guild(dir, &["--store", s, "--json", "list"]);
    assert_eq!(list.json()["crash_quarantine"], serde_json::json!([]));
    let nothing = guild(dir, &["--store", s, "quarantine", "clear", CRASHY]);
    assert_eq!(nothing.code, 6, "{}", nothing.stderr);
}

/// A record whose process is still running is another runner loading at the same time, not a
/// crash.
#[test]
fn a_load_record_of_a_live_process_is_not_a_crash() {
    let shop = Workshop::new();
    let root = shop.fresh("store");
    std::fs::create_dir_all(root.join(LOADING_DIR)).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let digest = guild_host::domain::ids::Sha256Digest::parse_hex(&"ab".repeat(32)).unwrap();
    let record = CrashRecord {
        package: CRASHY.into(),
        version: "1.0.0".into(),
        digest,
        pid: sleeper.id(),
        started: 0,
        process_start: 0,
    };
    let path = root
        .join(LOADING_DIR)
        .join(format!("{}-0.json", sleeper.id()));
    std::fs::write(&path, record.to_json().to_string()).unwrap();
    let ledger = CrashLedger::new(&root);
    assert!(ledger.sweep().unwrap().is_empty());
    assert!(path.exists());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert_eq!(ledger.sweep().unwrap(), vec![record]);
    assert!(ledger.entry(&digest).is_some());
}
