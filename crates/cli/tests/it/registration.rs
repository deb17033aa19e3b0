//! One publication path (G11): `guild install`, `enable` and `rollback` check a package's
//! library as `Host::install` does, in a child process, so that a crash or a hang in `init` is a
//! refused package and never takes `guild` down; and an implementation id belongs to one package,
//! whatever order packages are installed or loaded in.
//!
//! Every test runs real `guild` processes over real C plugins (`cargo xtask plugins`):
//! `scan_module` is the genuine provider of `example.scan.inclusive.cpu`, and `manifest_echo`
//! registers whatever its manifest declares, which makes it the squatter and the stock library of
//! packages that only need to load.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guild_domain::manifest::Metadata;
use guild_domain::store_state::{NewVersion, PublishOptions};
use guild_host::Host;
use guild_ports::source::PackageSource;
use guild_ports::store::{PackageStore, Transaction};
use guild_test_support::adapters::fs::archive::GkpkSource;
use guild_test_support::adapters::fs::store::FsStore;
use guild_test_support::disk;
use guild_test_support::guild::{Bench, Run};
use guild_test_support::plugins::plugin_library;

use crate::guild;

use guild_test_support::plugins::EXCLUSIVE;
use guild_test_support::plugins::INCLUSIVE;
use guild_test_support::plugins::INCLUSIVE_OP as SCAN_OP;

/// A module template for this platform, naming its publisher and provided ops.
fn template(id: &str, version: &str, publisher: &str, ops: &[&str]) -> String {
    let ops: Vec<String> = ops.iter().map(|o| format!("\"{o}\"")).collect();
    format!(
        r#"{{"package_id": "{id}", "kind": "gkmodule", "version": "{version}",
            "publisher_id": "{publisher}", "kernel_abi": {{"min": "1.0.0", "max": "1.0.0"}},
            "module_abi": 1, "os": "{os}", "arch": "{arch}", "backends": ["cpu"],
            "entry": "libplugin.so", "provided_ops": [{ops}]}}"#,
        os = std::env::consts::OS,
        arch = std::env::consts::ARCH,
        ops = ops.join(", "),
    )
}

/// What to pack: a package id and version, the test plugin that is its library, the publisher
/// it names, the ids it declares and the key (path prefix in the bench) that signs it.
struct Pkg<'a> {
    id: &'a str,
    version: &'a str,
    plugin: &'a str,
    publisher: &'a str,
    ops: &'a [&'a str],
    key: &'a str,
}

impl<'a> Pkg<'a> {
    fn new(id: &'a str, plugin: &'a str, ops: &'a [&'a str]) -> Self {
        Pkg {
            id,
            version: "1.0.0",
            plugin,
            publisher: "org.example",
            ops,
            key: "k",
        }
    }

    fn version(mut self, version: &'a str) -> Self {
        self.version = version;
        self
    }

    fn signed_by(mut self, publisher: &'a str, key: &'a str) -> Self {
        self.publisher = publisher;
        self.key = key;
        self
    }

    /// Packs and signs the package through `guild pack`; answers the archive's path.
    fn pack(&self, b: &Bench) -> String {
        let name = format!("{}-{}", self.id, self.version);
        let src = b.path().join("pub-src").join(&name);
        fs::create_dir_all(&src).unwrap();
        // The manifest template's bytes make each payload distinct; the library is the plugin.
        fs::write(src.join("libplugin.so"), plugin_library(self.plugin)).unwrap();
        let manifest = b.path().join(format!("{name}.pub.json"));
        fs::write(
            &manifest,
            template(self.id, self.version, self.publisher, self.ops),
        )
        .unwrap();
        let archive = format!("{name}.gkmodule");
        let key = format!("{}.key", self.key);
        let run = b.run(&[
            "pack",
            src.to_str().unwrap(),
            "--manifest",
            manifest.to_str().unwrap(),
            "--out",
            &archive,
            "--key",
            &key,
        ]);
        assert_eq!(run.code, 0, "pack {name}: {}", run.stderr);
        archive
    }
}

#[track_caller]
fn expect(run: &Run, code: i32, what: &str) {
    assert_eq!(
        run.code, code,
        "{what}: exit code\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
}

#[track_caller]
fn says(text: &str, needles: &[&str], what: &str) {
    for n in needles {
        assert!(text.contains(n), "{what}: {n:?} missing from:\n{text}");
    }
}

/// `guild install archive` exits 3 saying each of `needles`, and leaves the store's disk as it
/// was, with nothing listed.
#[track_caller]
fn install_refused(b: &Bench, archive: &str, needles: &[&str]) {
    expect(&b.run(&["list"]), 0, "list");
    let before = disk(&b.store());
    let run = b.run(&["install", archive]);
    expect(&run, 3, "install");
    says(&run.stderr, needles, "install");
    assert_eq!(disk(&b.store()), before);
    assert_eq!(listed(b), vec![]);
}

/// The package ids `guild list` shows, with the state of each current version.
fn listed(b: &Bench) -> Vec<(String, String)> {
    let run = b.run(&["--json", "list"]);
    expect(&run, 0, "list");
    run.json()["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let current = p["versions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["state"] == "enabled" || v["state"] == "disabled")
                .map_or("none".to_owned(), |v| {
                    format!(
                        "{} {}",
                        v["version"].as_str().unwrap(),
                        v["state"].as_str().unwrap()
                    )
                });
            (p["id"].as_str().unwrap().to_owned(), current)
        })
        .collect()
}

/// Which impl id and package `guild resolve` chooses for the inclusive scan, or its stderr.
fn resolved(b: &Bench) -> Result<(String, String), String> {
    let run = b.run(&[
        "--json", "resolve", SCAN_OP, "--input", "i64:4", "--output", "i64:4",
    ]);
    if run.code != 0 {
        return Err(run.stderr);
    }
    let doc = run.json();
    Ok((
        doc["impl_id"].as_str().unwrap().to_owned(),
        doc["package_id"].as_str().unwrap().to_owned(),
    ))
}

/// The squatter `aaa.hijack` registers `example.scan.inclusive.cpu`, signed by a trusted key that
/// is not the one that signed `example.scan`: another publisher's, or a second key of the same
/// publisher. Whichever package is installed second is refused (exit 4), naming both packages and
/// the id, before anything of it is opened or written; the first keeps its id, and `resolve`
/// finds it there (ids sort `aaa.hijack` first, so load order would have chosen the squatter).
#[test]
fn registration_squatter_is_refused_in_either_order() {
    for (publisher, same_publisher) in [("org.evil", false), ("org.example", true)] {
        for scan_first in [true, false] {
            let case = format!(
                "squatter signed by {} ({}), {} installed first",
                publisher,
                if same_publisher {
                    "second key"
                } else {
                    "another publisher"
                },
                if scan_first {
                    "example.scan"
                } else {
                    "aaa.hijack"
                },
            );
            let b = Bench::new(guild());
            b.trust();
            expect(&b.run(&["keygen", "--out", "k2"]), 0, &case);
            expect(&b.run(&["trust", "add", publisher, "k2.pub"]), 0, &case);
            let scan = Pkg::new("example.scan", "scan_module", &[INCLUSIVE, EXCLUSIVE]).pack(&b);
            let hijack = Pkg::new("aaa.hijack", "manifest_echo", &[INCLUSIVE])
                .signed_by(publisher, "k2")
                .pack(&b);
            let (first, second) = if scan_first {
                (&scan, &hijack)
            } else {
                (&hijack, &scan)
            };
            expect(&b.run(&["install", first]), 0, &case);
            let before = disk(&b.store());
            let refused = b.run(&["install", second]);
            expect(&refused, 4, &case);
            says(
                &refused.stderr,
                &["aaa.hijack@1.0.0", "example.scan@1.0.0", INCLUSIVE],
                &case,
            );
            assert_eq!(
                disk(&b.store()),
                before,
                "{case}: the refusal changed the store"
            );
            let owner = if scan_first {
                "example.scan"
            } else {
                "aaa.hijack"
            };
            assert_eq!(
                listed(&b),
                vec![(owner.to_owned(), "1.0.0 enabled".to_owned())],
                "{case}"
            );
            if scan_first {
                assert_eq!(
                    resolved(&b),
                    Ok((INCLUSIVE.to_owned(), "example.scan".to_owned())),
                    "{case}"
                );
            }
        }
    }
}

/// A library that registers one id fewer than its `provided_ops` declares is refused by
/// `guild install` (exit 3, the mismatch named) with nothing written, by `guild enable` after a
/// disabled install, and by `guild rollback` when it is the rollback target.
#[test]
fn registration_mismatch_is_refused_by_install_enable_and_rollback() {
    let b = Bench::new(guild());
    b.trust();
    let short = Pkg::new(
        "example.short",
        "manifest_echo_short",
        &["example.short.a", "example.short.b"],
    );
    let archive = short.pack(&b);
    expect(&b.run(&["list"]), 0, "list");
    let before = disk(&b.store());
    let run = b.run(&["install", &archive]);
    expect(&run, 3, "install");
    says(
        &run.stderr,
        &["example.short@1.0.0", "example.short.a", "example.short.b"],
        "install",
    );
    assert_eq!(
        disk(&b.store()),
        before,
        "the refused install changed the store"
    );
    assert_eq!(listed(&b), vec![]);

    // Installed disabled nothing is loaded, so nothing is checked; enabling checks.
    expect(
        &b.run(&["install", &archive, "--disabled"]),
        0,
        "install --disabled",
    );
    let before = disk(&b.store());
    let run = b.run(&["enable", "example.short"]);
    expect(&run, 3, "enable");
    says(
        &run.stderr,
        &["example.short@1.0.0", "example.short.b"],
        "enable",
    );
    assert_eq!(
        disk(&b.store()),
        before,
        "the refused enable changed the store"
    );
    assert_eq!(
        listed(&b),
        vec![("example.short".to_owned(), "1.0.0 disabled".to_owned())]
    );

    // A good 2.0.0 supersedes the broken 1.0.0, which becomes the rollback target.
    let good = Pkg::new(
        "example.short",
        "manifest_echo",
        &["example.short.a", "example.short.b"],
    )
    .version("2.0.0")
    .pack(&b);
    expect(&b.run(&["install", &good]), 0, "install 2.0.0");
    let before = disk(&b.store());
    let run = b.run(&["rollback", "example.short"]);
    expect(&run, 3, "rollback");
    says(
        &run.stderr,
        &["example.short@1.0.0", "example.short.b"],
        "rollback",
    );
    assert_eq!(
        disk(&b.store()),
        before,
        "the refused rollback changed the store"
    );
    assert_eq!(
        listed(&b),
        vec![("example.short".to_owned(), "2.0.0 enabled".to_owned())]
    );
}

/// A plugin that aborts in `init` is refused by `guild install` with the signal named; `guild`
/// itself exits with the documented code, and nothing is installed.
#[test]
fn registration_crash_in_init_is_refused_with_the_signal() {
    let b = Bench::new(guild());
    b.trust();
    let archive = Pkg::new("example.crash", "init_crashes", &["example.crash.op"]).pack(&b);
    install_refused(&b, &archive, &["example.crash@1.0.0", "SIGABRT"]);
    let doc = b.run(&["--json", "install", &archive]);
    expect(&doc, 3, "install --json");
    assert_eq!(doc.error_json()["category"], "rejected", "{}", doc.stderr);
}

/// A plugin that never returns from `init` is refused once the check's timeout
/// (`GUILD_LIBRARY_CHECK_TIMEOUT`, in seconds) has passed, and the child it ran in is gone.
#[test]
fn registration_hang_in_init_is_refused_after_the_timeout() {
    let b = Bench::new(guild());
    b.trust();
    let archive = Pkg::new("example.hang", "init_hangs", &["example.hang.op"]).pack(&b);
    expect(&b.run(&["list"]), 0, "list");
    let before = disk(&b.store());
    let store = b.store();
    let started = Instant::now();
    let out = guild()
        .command(
            b.path(),
            &["--store", store.to_str().unwrap(), "install", &archive],
        )
        .env("GUILD_LIBRARY_CHECK_TIMEOUT", "1")
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    says(
        &stderr,
        &["example.hang@1.0.0", "did not finish within 1 s"],
        "install",
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(disk(&b.store()), before);
    assert_eq!(listed(&b), vec![]);
    // A malformed timeout is a usage error, not a silent default.
    let out = guild()
        .command(
            b.path(),
            &["--store", store.to_str().unwrap(), "install", &archive],
        )
        .env("GUILD_LIBRARY_CHECK_TIMEOUT", "soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The registration check's verdict comes from its own channel, not from what the library
/// prints: a build whose `init` writes a passing result line (the check's old stdout protocol)
/// to every descriptor, the result channel's included, and exits 0 is refused, and nothing is
/// installed.
#[test]
fn registration_verdict_cannot_be_forged_by_the_library() {
    let b = Bench::new(guild());
    b.trust();
    let archive = Pkg::new("example.forge", "faulty_forge", &["example.faulty.forge"]).pack(&b);
    install_refused(
        &b,
        &archive,
        &[
            "example.forge@1.0.0",
            "failed the registration check",
            "result channel carried a line that is not its own",
        ],
    );
}

/// Processes a library starts in `init` do not outlive the registration check: one left in the
/// check child's process group, and one double-forked into a session of its own.
#[test]
fn registration_check_ends_the_processes_the_library_starts() {
    let b = Bench::new(guild());
    b.trust();
    let archive = Pkg::new(
        "example.daemon",
        "faulty_daemon",
        &["example.faulty.daemon"],
    )
    .pack(&b);
    let pids = b.path().join("daemon.pids");
    let store = b.store();
    let out = guild()
        .command(
            b.path(),
            &["--store", store.to_str().unwrap(), "install", &archive],
        )
        .env("GUILD_TEST_DAEMON_PIDS", &pids)
        .output()
        .unwrap();
    let (listed_pids, survivors) = guild_test_support::guild::survivors(&pids);
    assert_eq!(listed_pids.len(), 2, "the library started its two sleepers");
    assert!(
        survivors.is_empty(),
        "{survivors:?} of {listed_pids:?} outlived the registration check"
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        listed(&b),
        vec![("example.daemon".to_owned(), "1.0.0 enabled".to_owned())]
    );
}

/// Installs `archive` into the store at `root` the way the package manager did before impl ids
/// were checked: extract into staging, record the version as enabled, commit. No check of any
/// other package runs, which is how stores with two owners of one id came to exist.
fn install_unchecked(root: &Path, archive: &Path) {
    let (store, _) = FsStore::open(root).unwrap();
    let opened = GkpkSource::default().open(archive).unwrap();
    let metadata = Metadata::parse(opened.metadata_bytes()).unwrap();
    let m = metadata.manifest();
    let staging = store.new_staging_dir().unwrap();
    opened.extract_to(m, &staging).unwrap();
    let registry = store.registry().unwrap();
    let mut next = registry.successor();
    next.publish(
        &m.package_id,
        &m.version,
        NewVersion {
            payload_digest: metadata.payload_digest(),
            kind: m.kind,
            publisher: m.publisher_id.clone(),
            signed_by: Vec::new(),
            facts: None,
        },
        PublishOptions {
            enable: true,
            allow_downgrade: false,
        },
    )
    .unwrap();
    store
        .commit(Transaction::new(registry.generation(), next).with_install(
            m.package_id.clone(),
            m.version.clone(),
            staging,
        ))
        .unwrap();
}

/// A store that already holds two owners of one impl id (made by the code before this rule)
/// opens; neither contender is loaded, and `status`, `doctor` and the host's load report say why.
/// Removing one of them repairs it.
#[test]
fn registration_store_with_a_conflict_loads_neither_and_says_why() {
    let b = Bench::new(guild());
    b.trust();
    let scan = Pkg::new("example.scan", "scan_module", &[INCLUSIVE, EXCLUSIVE]).pack(&b);
    let hijack = Pkg::new("aaa.hijack", "manifest_echo", &[INCLUSIVE]).pack(&b);
    let root: PathBuf = b.store();
    install_unchecked(&root, &b.path().join(&scan));
    install_unchecked(&root, &b.path().join(&hijack));
    let why = [
        "aaa.hijack@1.0.0",
        "example.scan@1.0.0",
        INCLUSIVE,
        "neither",
    ];

    let status = b.run(&["status"]);
    expect(&status, 0, "status");
    says(
        &format!("{}{}", status.stdout, status.stderr),
        &why,
        "status",
    );
    let doc = b.run(&["--json", "status"]);
    expect(&doc, 0, "status --json");
    let conflicts = &doc.json()["conflicts"];
    assert_eq!(
        conflicts.as_array().map(Vec::len),
        Some(1),
        "{}",
        doc.stdout
    );
    assert_eq!(conflicts[0]["impl_ids"][0], INCLUSIVE);

    let doctor = b.run(&["doctor"]);
    says(&doctor.stdout, &why, "doctor");

    let (host, _, loaded) = Host::open_dir(&root).unwrap();
    assert!(loaded.loaded.is_empty(), "{:?}", loaded.loaded);
    let skipped: Vec<String> = loaded.skipped.iter().map(|q| q.id.to_string()).collect();
    assert_eq!(skipped, vec!["aaa.hijack", "example.scan"]);
    for q in &loaded.skipped {
        says(&q.reason, &[INCLUSIVE, "neither"], "load report");
    }
    drop(host);
    assert!(resolved(&b).is_err());

    // Enabling or rolling back cannot pick a winner either: removal is the repair.
    let run = b.run(&["remove", "aaa.hijack"]);
    expect(&run, 0, "remove");
    let status = b.run(&["--json", "status"]);
    assert_eq!(status.json()["conflicts"], serde_json::json!([]));
    assert_eq!(
        resolved(&b),
        Ok((INCLUSIVE.to_owned(), "example.scan".to_owned()))
    );
}
