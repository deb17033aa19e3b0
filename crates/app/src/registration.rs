//! The registration check: what a package's library must pass before its version becomes
//! loadable, made by the same code whether the library is opened in this process
//! ([`Host`](crate::Host)) or in a child process that the `guild` command line spawns for the
//! purpose ([`ChildCheck`]).
//!
//! `load_checked` (crate-private) opens a verified tree's entry library through a loader and
//! holds what the plugin registered against its signed manifest with [`check_registration`]:
//! exactly the declared impl ids and runner ids, each once, and kernels only for declared
//! backends. That ids belong to no other package is decided before anything is opened, by the
//! package manager (`guild_domain::claims`); the kernel registry refuses a duplicate again when
//! it publishes.
//!
//! A command-line process has no registry to keep the library in, and a plugin that crashes or
//! hangs in `init` must not take the command down with it. [`ChildCheck`] therefore runs the check
//! in a child (`guild` itself, with a hidden subcommand that calls [`check_tree`]): the child
//! authenticates the tree against the trust store its parent passes on stdin, verifies its files,
//! loads the library with the dlopen loader, compares, shuts the plugin down, and prints one
//! tagged JSON line. The parent waits at most a timeout (default [`DEFAULT_TIMEOUT`]) and
//! reports a signal, a timeout or a refusal as a refused package; nothing is committed then.
//!
//! The child is a defence against mistakes and crashes in authenticated code, not against a
//! hostile publisher: whoever holds a trusted key can run code in any host that loads the package.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::manifest::{Manifest, Metadata};
use guild_domain::trust::{authenticate, TrustStore};
use guild_domain::version::{PackedVersion, Version};
use guild_ports::loader::{LoadRequest, LoadedPlugin, PluginLoader, ServiceTable};
use guild_ports::source::PackageSource;

use crate::error::HostError;
use crate::package_manager::{Change, LifecycleHook, PortCheck};

// The failure is part of `HostError`, so it lives with it.
pub use crate::error::seconds;
pub use crate::error::{LibraryCheckFailure, TIMEOUT_VARIABLE};

/// How long [`ChildCheck`] waits for the child by default: loading and `init` of a package's
/// library, plus the re-verification of its files.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The hidden `guild` subcommand that runs [`check_tree`] in a child process.
pub const CHECK_SUBCOMMAND: &str = "__check-library";

/// The key that marks the child's result line on its stdout (a plugin may print there too).
pub const RESULT_TAG: &str = "guild_library_check";

/// The most of the child's stdout and stderr the parent keeps.
const KEEP_OUTPUT: usize = 64 << 10;

/// The most trust-store bytes the child reads from its stdin.
pub const MAX_TRUST_BYTES: u64 = 16 << 20;

/// Holds what a plugin registered against its signed manifest: the registered impl ids are
/// exactly `provided_ops` and the runner ids exactly `provided_runners`, none twice, and every
/// kernel is for a backend the manifest declares. `package` is `id@version`, for the errors.
pub fn check_registration(
    package: &str,
    manifest: &Manifest,
    plugin: &LoadedPlugin,
) -> Result<(), HostError> {
    let kernels: Vec<&str> = plugin.kernels.iter().map(|k| k.impl_id.as_str()).collect();
    let runners: Vec<&str> = plugin
        .runners
        .iter()
        .map(|r| r.runner_id.as_str())
        .collect();
    let ops: Vec<&str> = manifest.provided_ops.iter().map(|i| i.as_str()).collect();
    let declared_runners: Vec<&str> = manifest
        .provided_runners
        .iter()
        .map(|r| r.as_str())
        .collect();
    for (what, registered, declared) in [
        ("impl ids", &kernels, &ops),
        ("runner ids", &runners, &declared_runners),
    ] {
        let set: BTreeSet<&str> = registered.iter().copied().collect();
        let want: BTreeSet<&str> = declared.iter().copied().collect();
        if set.len() != registered.len() || set != want {
            return Err(HostError::RegistrationMismatch {
                package: package.to_owned(),
                what,
                registered: registered.iter().map(|s| (*s).to_owned()).collect(),
                declared: want.into_iter().map(str::to_owned).collect(),
            });
        }
    }
    // The manifest's backends are what operators read to know what hardware a package needs; a
    // kernel for another backend is refused (dropping the plugin shuts it down).
    let declared = |bit: u32| manifest.backends.iter().any(|b| b.bit() == bit);
    if let Some(k) = plugin.kernels.iter().find(|k| !declared(k.backend.bit())) {
        return Err(HostError::UndeclaredBackend {
            package: package.to_owned(),
            impl_id: k.impl_id.clone(),
            backend: k.backend,
            declared: manifest
                .backends
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(())
}

/// Opens the entry library of the verified tree `dir` of `id@version` through `loader` and
/// checks what it registered ([`check_registration`]). Only call it for a tree the package
/// manager (or [`check_tree`]) has authenticated and verified.
pub(crate) fn load_checked(
    loader: &dyn PluginLoader,
    id: &PackageId,
    version: &Version,
    dir: &Path,
    metadata: &Metadata,
    host_abi: PackedVersion,
    operations: Option<ServiceTable>,
) -> Result<LoadedPlugin, HostError> {
    let m = metadata.manifest();
    let request = LoadRequest {
        package: id.clone(),
        version: version.clone(),
        library: dir.join(m.entry.as_str()),
        provided_ops: m.provided_ops.clone(),
        provided_runners: m.provided_runners.clone(),
        host_abi,
        operations,
    };
    let plugin = loader.load(&request)?;
    check_registration(&format!("{id}@{version}"), m, &plugin)?;
    Ok(plugin)
}

/// What [`check_tree`] found in a library that passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedLibrary {
    /// Kernels registered.
    pub kernels: usize,
    /// Runners registered.
    pub runners: usize,
}

/// The child's side of [`ChildCheck`]: authenticates the tree `dir` (its `.gkmetadata` must
/// have payload digest `payload`) against `trust` (a trust file's bytes), checks the platform
/// and every file against the signed manifest, and only then opens its library with the dlopen
/// loader and checks what it registered. The plugin is shut down before this returns.
pub fn check_tree(
    dir: &Path,
    payload: &Sha256Digest,
    trust: &[u8],
) -> Result<CheckedLibrary, HostError> {
    let trust = TrustStore::from_json(trust)?;
    let read = read_tree_metadata(dir)?;
    let m = read.manifest();
    let (id, version) = (&m.package_id, &m.version);
    let package = format!("{id}@{version}");
    if read.payload_digest() != *payload {
        return Err(HostError::InstalledTree {
            package,
            path: dir.to_path_buf(),
            problem: format!(
                "its .gkmetadata has payload digest {}, the check was asked for {payload}",
                read.payload_digest()
            ),
        });
    }
    let verifier = guild_adapters_crypto::P256Verifier::new();
    authenticate(&read, &trust, &PortCheck(&verifier)).map_err(|source| {
        HostError::Unauthenticated {
            location: dir.to_path_buf(),
            package: package.clone(),
            source,
        }
    })?;
    let platform =
        crate::platform::HostPlatform::current().ok_or(HostError::UnsupportedPlatform {
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
        })?;
    platform.check(m).map_err(|source| HostError::Platform {
        package: package.clone(),
        source,
    })?;
    guild_adapters_fs::archive::GkpkSource::default()
        .open(dir)?
        .verify_in_place(m)?;

    // A registry of its own gives the plugin a valid operation service for `init`; nothing is
    // published into it, and it outlives the plugin.
    let registry = crate::registry::OwnedRegistry::new();
    let loader = guild_adapters_posix::DlopenLoader::new();
    let plugin = load_checked(
        &loader,
        id,
        version,
        dir,
        &read,
        platform.kernel_abi,
        Some(registry.plugin_service()),
    )?;
    let checked = CheckedLibrary {
        kernels: plugin.kernels.len(),
        runners: plugin.runners.len(),
    };
    // Dropping the plugin runs its shutdown and closes the library, inside the check.
    drop(plugin);
    drop(registry);
    Ok(checked)
}

/// Reads and parses the `.gkmetadata` at the root of the tree `dir`.
pub fn read_tree_metadata(dir: &Path) -> Result<Metadata, HostError> {
    let path = dir.join(guild_domain::path::RESERVED_METADATA_NAME);
    let bytes = std::fs::read(&path).map_err(|e| HostError::InstalledTree {
        package: format!("the tree {}", dir.display()),
        path: path.clone(),
        problem: format!("cannot read its .gkmetadata: {e}"),
    })?;
    Metadata::parse(&bytes).map_err(|errors| HostError::Manifest {
        location: path,
        errors,
    })
}

/// The child's result line for `outcome`: one JSON object tagged with [`RESULT_TAG`].
pub fn result_line(outcome: &Result<CheckedLibrary, HostError>) -> String {
    let doc = match outcome {
        Ok(c) => serde_json::json!({
            RESULT_TAG: 1,
            "ok": true,
            "kernels": c.kernels,
            "runners": c.runners,
        }),
        Err(e) => serde_json::json!({ RESULT_TAG: 1, "ok": false, "error": e.to_string() }),
    };
    doc.to_string()
}

/// The registration check in a child process, as a [`LifecycleHook`]: every change that makes a
/// version loadable (an enabled install, enable, reactivation, rollback) runs the version's
/// verified tree through [`check_tree`] in a fresh child, and is refused unless the child says it
/// passed. Changes that load nothing pass.
#[derive(Debug, Clone)]
pub struct ChildCheck {
    program: PathBuf,
    args: Vec<OsString>,
    trust: Vec<u8>,
    timeout: Duration,
}

impl ChildCheck {
    /// Checks by running `program` (a `guild` binary) with [`CHECK_SUBCOMMAND`], giving it
    /// `trust` (the store's trust file, as `TrustStore::to_json` writes it) on stdin.
    pub fn new(program: PathBuf, trust: Vec<u8>) -> Self {
        ChildCheck {
            program,
            args: vec![OsString::from(CHECK_SUBCOMMAND)],
            trust,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Waits at most `timeout` for each child.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs the check of `id@version`, whose verified tree is `dir`.
    pub fn check(
        &self,
        id: &PackageId,
        version: &Version,
        dir: &Path,
        metadata: &Metadata,
    ) -> Result<(), HostError> {
        self.run(dir, &metadata.payload_digest())
            .map_err(|failure| HostError::LibraryCheck {
                package: format!("{id}@{version}"),
                failure,
            })
    }

    fn run(&self, dir: &Path, payload: &Sha256Digest) -> Result<(), LibraryCheckFailure> {
        let spawn_error = |e: std::io::Error| LibraryCheckFailure::Spawn {
            program: self.program.clone(),
            reason: e.to_string(),
        };
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .arg(dir)
            .arg("--payload-sha256")
            .arg(payload.to_hex())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        // Each pipe is served by its own thread, so that neither side blocks on a full pipe.
        if let Some(mut stdin) = child.stdin.take() {
            let trust = self.trust.clone();
            std::thread::spawn(move || {
                // A child that dies before reading closes the pipe; its status says why.
                let _ = stdin.write_all(&trust);
            });
        }
        let stdout = collect(child.stdout.take());
        let stderr = collect(child.stderr.take());

        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(2);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    // Killing a child that exited meanwhile is not an error.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(LibraryCheckFailure::TimedOut {
                        timeout: self.timeout,
                    });
                }
                Ok(None) => {
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(spawn_error(e));
                }
            }
        };
        if let Some((signal, name)) = signal_of(status) {
            return Err(LibraryCheckFailure::Crashed { signal, name });
        }
        // A grandchild the plugin left behind could hold the pipes open; do not wait for it.
        let grace = Duration::from_secs(2);
        let out = stdout.recv_timeout(grace).unwrap_or_default();
        let result = out
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v.get(RESULT_TAG).is_some());
        match result {
            Some(v) if status.success() && v["ok"] == true => Ok(()),
            Some(v) if v["ok"] == false => Err(LibraryCheckFailure::Refused {
                reason: v["error"]
                    .as_str()
                    .unwrap_or("the check process gave no reason")
                    .to_owned(),
            }),
            _ => Err(LibraryCheckFailure::NoResult {
                status: status.to_string(),
                stderr: stderr.recv_timeout(grace).unwrap_or_default(),
            }),
        }
    }
}

/// Reads a pipe to its end on a thread, keeping the first [`KEEP_OUTPUT`] bytes (the rest is
/// drained, so that the writer never blocks); the text arrives on the returned channel.
pub(crate) fn collect(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = KEEP_OUTPUT.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
            let _ = tx.send(String::from_utf8_lossy(&kept).into_owned());
        });
    }
    rx
}

/// The signal that ended the child, with its name.
pub fn signal_of(status: ExitStatus) -> Option<(i32, &'static str)> {
    use std::os::unix::process::ExitStatusExt;
    let signal = status.signal()?;
    Some((signal, signal_name(signal)))
}

/// The name of a signal number as Linux numbers them (the platforms packages can name).
fn signal_name(signal: i32) -> &'static str {
    match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 if cfg!(target_os = "linux") => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 if !cfg!(target_os = "linux") => "SIGBUS",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        31 if cfg!(target_os = "linux") => "SIGSYS",
        _ => "an unnamed signal",
    }
}

impl LifecycleHook for ChildCheck {
    fn prepare(&mut self, change: &Change<'_>) -> Result<(), HostError> {
        match change {
            Change::Install {
                id,
                version,
                dir,
                metadata,
                enabled: true,
            } => self.check(id, version, dir, metadata),
            Change::Enable {
                id,
                version,
                dir,
                metadata,
            } => self.check(id, version, dir, metadata),
            Change::Reactivate {
                id,
                to,
                dir,
                metadata,
                ..
            }
            | Change::Rollback {
                id,
                to,
                dir,
                metadata,
                ..
            } => self.check(id, to, dir, metadata),
            Change::Install { enabled: false, .. }
            | Change::Disable { .. }
            | Change::Remove { .. } => Ok(()),
        }
    }

    fn committed(&mut self) {}

    fn aborted(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_one_line() {
        assert_eq!(
            LibraryCheckFailure::TimedOut {
                timeout: Duration::from_secs(1)
            }
            .to_string(),
            "loading its library did not finish within 1 s; the check process was killed (set \
             GUILD_LIBRARY_CHECK_TIMEOUT to allow longer)"
        );
        assert_eq!(seconds(&Duration::from_millis(1500)), "1500 ms");
        assert_eq!(signal_name(6), "SIGABRT");
        assert_eq!(signal_name(11), "SIGSEGV");
        let no_result = |stderr: &str| {
            LibraryCheckFailure::NoResult {
                status: "exit status: 1".into(),
                stderr: stderr.into(),
            }
            .to_string()
        };
        assert_eq!(
            no_result("  \n"),
            "the check process exited with exit status: 1 without a result"
        );
        assert_eq!(
            no_result("boom\n"),
            "the check process exited with exit status: 1 without a result: boom"
        );
    }
}
