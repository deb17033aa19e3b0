//! The `guild` binary, run as an operator would: a command with a predictable environment, what
//! one run did, and a [`Bench`] (a scratch directory with a store, a key pair and packages packed
//! through the command itself).
//!
//! Which binary runs is the test binary's to say: the tests of the package that builds `guild`
//! (guild-cli) run the one cargo builds for them (`Guild::new(env!("CARGO_BIN_EXE_guild"))`);
//! other packages' tests build it once per run with cargo ([`Guild::built`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

use crate::plugins::plugin_library;
use crate::Scratch;

/// The `guild` binary that a test runs.
#[derive(Debug, Clone, Copy)]
pub struct Guild(&'static Path);

impl Guild {
    /// The binary at `path`.
    pub fn new(path: &'static str) -> Self {
        Guild(Path::new(path))
    }

    /// The binary built from the current source with `cargo build -p guild-cli` (once per test
    /// run), for tests outside guild-cli.
    pub fn built() -> Self {
        static BUILT: OnceLock<PathBuf> = OnceLock::new();
        Guild(BUILT.get_or_init(|| crate::cargo_binary("guild-cli", "guild")))
    }

    /// The binary's path.
    pub fn path(self) -> &'static Path {
        self.0
    }

    /// A command for the binary with a predictable environment: no inherited store, no colour.
    pub fn command(self, cwd: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.0);
        cmd.args(args)
            .current_dir(cwd)
            .env_remove("GUILD_STORE")
            .env_remove("XDG_DATA_HOME")
            .env("NO_COLOR", "1")
            // A registry that cannot be reached is tried again after 1 s and 2 s by default;
            // tests of that set their own delays, and no other test should wait that long.
            .env("GUILD_REGISTRY_RETRY_DELAY", "0.01");
        cmd
    }

    /// Runs `guild ARGS` in `cwd`.
    pub fn run(self, cwd: &Path, args: &[&str]) -> Run {
        Run::from(self.command(cwd, args).output().unwrap())
    }
}

/// What one run of `guild` did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }

    pub fn error_json(&self) -> Value {
        serde_json::from_str(&self.stderr)
            .unwrap_or_else(|e| panic!("stderr is not JSON ({e}):\n{}", self.stderr))
    }

    #[track_caller]
    pub fn expect(&self, code: i32) -> &Self {
        assert_eq!(
            self.code, code,
            "exit code\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    #[track_caller]
    pub fn stdout_has(&self, text: &str) -> &Self {
        assert!(
            self.stdout.contains(text),
            "stdout lacks {text:?}:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    #[track_caller]
    pub fn stderr_has(&self, text: &str) -> &Self {
        assert!(
            self.stderr.contains(text),
            "stderr lacks {text:?}:\n{}",
            self.stderr
        );
        self
    }
}

/// A workspace: a temporary directory with a store, a key pair `k.key`/`k.pub`, and packages.
#[derive(Debug)]
pub struct Bench {
    pub dir: Scratch,
    guild: Guild,
}

impl Bench {
    /// A fresh bench whose commands run `guild`; it starts with `guild keygen --out k`.
    pub fn new(guild: Guild) -> Self {
        let bench = Bench {
            dir: Scratch::new(),
            guild,
        };
        bench.run(&["keygen", "--out", "k"]).expect(0);
        bench
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn store(&self) -> PathBuf {
        self.path().join("store")
    }

    /// The binary this bench runs.
    pub fn guild(&self) -> Guild {
        self.guild
    }

    /// Runs `guild --store STORE ARGS` on the bench's store.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_on(&self.store(), args)
    }

    /// Runs `guild --store STORE ARGS` on `store`, in the bench.
    pub fn run_on(&self, store: &Path, args: &[&str]) -> Run {
        let mut all = vec!["--store", store.to_str().unwrap()];
        all.extend_from_slice(args);
        self.guild.run(self.path(), &all)
    }

    /// A store named `name` in the bench that trusts the bench's key.
    pub fn trusting_store(&self, name: &str) -> PathBuf {
        let store = self.path().join(name);
        self.run_on(&store, &["trust", "add", "org.example", "k.pub"])
            .expect(0);
        store
    }

    /// `guild --json list` of `store`, leases aside.
    pub fn listed(&self, store: &Path) -> Value {
        let mut out = self.run_on(store, &["--json", "list"]).expect(0).json();
        for p in out["packages"].as_array_mut().unwrap() {
            p.as_object_mut().unwrap().remove("leases");
        }
        out
    }

    /// A lock file (`guild lock`, written as `guild.lock` in the bench) of `packages`: archives
    /// in the bench, installed into a store of their own (`origin`). The entries of `drop` are
    /// taken out of the lock afterwards.
    pub fn lock_of(&self, packages: &[&str], drop: &[&str]) -> PathBuf {
        let origin = self.trusting_store("origin");
        for p in packages {
            self.run_on(&origin, &["install", p]).expect(0);
        }
        let lock = self.path().join("guild.lock");
        self.run_on(&origin, &["lock", "--out", lock.to_str().unwrap()])
            .expect(0);
        let mut value: Value = serde_json::from_slice(&fs::read(&lock).unwrap()).unwrap();
        value["packages"]
            .as_array_mut()
            .unwrap()
            .retain(|p| !drop.contains(&p["id"].as_str().unwrap()));
        fs::write(&lock, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
        lock
    }

    /// Writes a source directory and template for `id@version` (its library holds `content`;
    /// `extra` is spliced into the template, e.g. a dependencies field) and returns the source
    /// directory and the template.
    pub fn source(
        &self,
        id: &str,
        version: &str,
        content: &[u8],
        extra: &str,
    ) -> (PathBuf, PathBuf) {
        let name = format!("{id}-{version}");
        let src = self.path().join("src").join(&name);
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("libplugin.so"), library(content)).unwrap();
        let template = self.path().join(format!("{name}.json"));
        fs::write(&template, template_json(id, version, extra)).unwrap();
        (src, template)
    }

    /// Packs and signs `id@version` with `k.key` through the CLI; returns the archive's name.
    pub fn package(&self, id: &str, version: &str, content: &[u8], extra: &str) -> String {
        let (src, template) = self.source(id, version, content, extra);
        let archive = format!("{id}-{version}.gkmodule");
        self.run(&[
            "pack",
            src.to_str().unwrap(),
            "--manifest",
            template.to_str().unwrap(),
            "--out",
            &archive,
            "--key",
            "k.key",
        ])
        .expect(0);
        archive
    }

    /// Trusts the bench's key `k.pub` for `org.example` in its store.
    pub fn trust(&self) {
        self.run(&["trust", "add", "org.example", "k.pub"])
            .expect(0);
    }
}

/// The library of a test package whose library holds `content`: `content` itself when it is a
/// shared object, else the `manifest_echo` test plugin (which registers whatever its manifest
/// declares, so that `guild install` can load it) with `content` appended. The dynamic loader
/// ignores bytes after the ELF image, and `content` still makes each payload distinct and gives
/// [`tamper`] something to change.
pub fn library(content: &[u8]) -> Vec<u8> {
    if content.starts_with(b"\x7fELF") {
        return content.to_vec();
    }
    let mut bytes = plugin_library("manifest_echo");
    bytes.extend_from_slice(content);
    bytes
}

/// A module template for this platform, without `artifacts`.
pub fn template_json(id: &str, version: &str, extra: &str) -> String {
    format!(
        r#"{{"package_id": "{id}", "kind": "gkmodule", "version": "{version}",
            "publisher_id": "org.example", "kernel_abi": {{"min": "1.0.0", "max": "1.0.0"}},
            "module_abi": 1, "os": "{os}", "arch": "{arch}", "backends": ["cpu"],
            "entry": "libplugin.so", "provided_ops": ["{id}.op.cpu"]{extra}}}"#,
        os = std::env::consts::OS,
        arch = std::env::consts::ARCH,
    )
}

/// Copies `archive` with `from` replaced by `to` (same length) in its bytes.
pub fn tamper(b: &Bench, archive: &str, from: &[u8], to: &[u8]) -> String {
    assert_eq!(from.len(), to.len());
    let mut bytes = fs::read(b.path().join(archive)).unwrap();
    let at = bytes
        .windows(from.len())
        .rposition(|w| w == from)
        .expect("content in the archive");
    bytes[at..at + to.len()].copy_from_slice(to);
    let out = format!("tampered-{archive}");
    fs::write(b.path().join(&out), bytes).unwrap();
    out
}

/// Whether process `pid` still runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

/// The processes listed (one pid a line) in the file at `pids` that still run, each killed
/// before this returns so that a failing test leaves nothing behind.
pub fn survivors(pids: &Path) -> (Vec<u32>, Vec<u32>) {
    let listed: Vec<u32> = fs::read_to_string(pids)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let alive: Vec<u32> = listed.iter().copied().filter(|p| alive(*p)).collect();
    for pid in &alive {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    (listed, alive)
}
