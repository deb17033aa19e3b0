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
//! loads the library with the dlopen loader, compares, shuts the plugin down, and writes one
//! JSON line on a result channel of its own (a pipe on an inherited descriptor, each line
//! carrying a nonce the parent drew for it; see `guild_adapters_posix::supervise`). What the
//! library prints on stdout or anywhere else is never read as a verdict. The parent waits at most
//! a timeout (default [`DEFAULT_TIMEOUT`]) on its own clock, kills the child's process group
//! when the child is done, and reports a signal, a timeout, a missing result or a refusal as a
//! refused package; nothing is committed then.
//!
//! The child is a defence against mistakes and crashes in authenticated code, not against a
//! hostile publisher: whoever holds a trusted key can run code in any host that loads the package.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The child's end of its result channel.
pub use guild_adapters_posix::supervise::ResultChannel;
use guild_adapters_posix::supervise::{self, Event, Supervised};

use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::manifest::{Manifest, Metadata, SignatureAlgorithm, SignatureEntry};
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

/// The key under which the child's result line carries its nonce.
pub const RESULT_TAG: &str = "guild_library_check";

/// How often the parent looks whether the child has ended while it waits for its result.
const POLL: Duration = Duration::from_millis(20);

/// How long the parent reads on after the child has ended, when the channel stays open.
const DRAIN: Duration = Duration::from_secs(2);

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
///
/// `signatures` are the ones the parent holds for the version beyond its tree's (those the
/// registry recorded when a re-signed copy was installed during a key rotation): they join the
/// tree's before authentication, so that a version whose old key is revoked checks as the
/// parent authenticated it. They cover the same payload, so they can add a valid signature but
/// never change what was signed.
pub fn check_tree(
    dir: &Path,
    payload: &Sha256Digest,
    trust: &[u8],
    signatures: &[SignatureEntry],
) -> Result<CheckedLibrary, HostError> {
    let trust = TrustStore::from_json(trust)?;
    let read = read_tree_metadata(dir)?;
    let read = with_signatures(read, signatures, dir)?;
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

/// `metadata` with those of `extra` whose keys it has no signature of appended.
fn with_signatures(
    metadata: Metadata,
    extra: &[SignatureEntry],
    dir: &Path,
) -> Result<Metadata, HostError> {
    let mut signatures = metadata.signatures().to_vec();
    for s in extra {
        if !signatures.iter().any(|t| t.key_id == s.key_id) {
            signatures.push(s.clone());
        }
    }
    if signatures.len() == metadata.signatures().len() {
        return Ok(metadata);
    }
    metadata
        .with_signatures(signatures)
        .map_err(|errors| HostError::Manifest {
            location: dir.join(guild_domain::path::RESERVED_METADATA_NAME),
            errors,
        })
}

/// The command-line form of a signature the check child is given beside its tree's:
/// `KEY_ID:SIGNATURE`, both lowercase hex ([`parse_signature_arg`] reads it back).
pub fn signature_arg(s: &SignatureEntry) -> String {
    let hex: String = s.signature.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}:{hex}", s.key_id.to_hex())
}

/// Reads [`signature_arg`]'s form back (an `ecdsa-p256-sha256` signature, the one algorithm).
pub fn parse_signature_arg(arg: &str) -> Result<SignatureEntry, String> {
    let (key, sig) = arg
        .split_once(':')
        .ok_or_else(|| format!("{arg:?} is not KEY_ID:SIGNATURE"))?;
    let key_id = Sha256Digest::parse_hex(key).map_err(|e| e.to_string())?;
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = sig.as_bytes();
    let signature = (bytes.len() % 2 == 0 && !bytes.is_empty())
        .then(|| {
            bytes
                .chunks(2)
                .map(|p| Some((nibble(p[0])? << 4) | nibble(p[1])?))
                .collect::<Option<Vec<u8>>>()
        })
        .flatten()
        .ok_or_else(|| "the signature is not non-empty, even-length lowercase hex".to_owned())?;
    Ok(SignatureEntry {
        key_id,
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature,
    })
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

/// The child's result line for `outcome`: one JSON object carrying `nonce` under
/// [`RESULT_TAG`], and a newline.
pub fn result_line(outcome: &Result<CheckedLibrary, HostError>, nonce: &str) -> String {
    let doc = match outcome {
        Ok(c) => serde_json::json!({
            RESULT_TAG: nonce,
            "ok": true,
            "kernels": c.kernels,
            "runners": c.runners,
        }),
        Err(e) => serde_json::json!({ RESULT_TAG: nonce, "ok": false, "error": e.to_string() }),
    };
    format!("{doc}\n")
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
    contain_descendants: bool,
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
            contain_descendants: false,
        }
    }

    /// Waits at most `timeout` for each child.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Also ends the processes a library starts that leave the child's process group (a
    /// double-forked daemon): this process becomes the subreaper of its descendants, and once
    /// each check child is gone, every child this process has left is killed and reaped. Only
    /// for a process whose every child is a check child (the `guild` command); a runner that
    /// starts processes of its own must not ask for it.
    pub fn containing_descendants(mut self) -> Self {
        self.contain_descendants = true;
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
        self.run(dir, &metadata.payload_digest(), metadata.signatures())
            .map_err(|failure| HostError::LibraryCheck {
                package: format!("{id}@{version}"),
                failure,
            })
    }

    fn run(
        &self,
        dir: &Path,
        payload: &Sha256Digest,
        signatures: &[SignatureEntry],
    ) -> Result<(), LibraryCheckFailure> {
        let spawn_error = |e: std::io::Error| LibraryCheckFailure::Spawn {
            program: self.program.clone(),
            reason: e.to_string(),
        };
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .arg(dir)
            .arg("--payload-sha256")
            .arg(payload.to_hex());
        // Every signature the parent authenticated the version with; the child adds those its
        // tree lacks (recorded in the registry during a key rotation).
        for s in signatures {
            command.arg("--signature").arg(signature_arg(s));
        }
        if self.contain_descendants {
            supervise::adopt_orphans();
        }
        let nonce = supervise::nonce().map_err(spawn_error)?;
        let mut child =
            supervise::spawn(command, &nonce, self.trust.clone()).map_err(spawn_error)?;
        let mut reading = Verdict::new(&nonce);
        let exited = reading.until_exit(&child, Instant::now() + self.timeout);
        let status = supervise::end(&mut child.child, self.contain_descendants);
        if !exited {
            return Err(LibraryCheckFailure::TimedOut {
                timeout: self.timeout,
            });
        }
        reading.drain(&child);
        let status = status.ok_or_else(|| LibraryCheckFailure::Spawn {
            program: self.program.clone(),
            reason: "its exit status could not be read".to_owned(),
        })?;
        if let Some((signal, name)) = supervise::signal_of(status) {
            return Err(LibraryCheckFailure::Crashed { signal, name });
        }
        if let Some(what) = reading.garbage {
            return Err(LibraryCheckFailure::Refused {
                reason: format!(
                    "the check's result channel carried {what}, which the check never writes"
                ),
            });
        }
        match reading.result {
            Some(v) if status.success() && v["ok"] == true => Ok(()),
            Some(v) if v["ok"] == false => Err(LibraryCheckFailure::Refused {
                reason: v["error"]
                    .as_str()
                    .unwrap_or("the check process gave no reason")
                    .to_owned(),
            }),
            _ => Err(LibraryCheckFailure::NoResult {
                status: status.to_string(),
                stderr: child.stderr.last_lines(8),
            }),
        }
    }
}

/// The parent's reading of one check child's result channel: its one result line, or the first
/// thing the channel carried that the check never writes.
struct Verdict<'n> {
    nonce: &'n str,
    result: Option<serde_json::Value>,
    garbage: Option<String>,
}

impl<'n> Verdict<'n> {
    fn new(nonce: &'n str) -> Self {
        Verdict {
            nonce,
            result: None,
            garbage: None,
        }
    }

    /// Reads the channel until the child has exited (true) or `deadline` passes (false), on
    /// this process's clock: nothing the child writes moves the deadline.
    fn until_exit(&mut self, child: &Supervised, deadline: Instant) -> bool {
        loop {
            if supervise::has_exited(&child.child) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if let Some(event) = child.next_event(deadline.saturating_duration_since(now).min(POLL))
            {
                self.take(event);
            }
        }
    }

    /// Reads what the child wrote before it ended, still in the pipe, for at most [`DRAIN`].
    fn drain(&mut self, child: &Supervised) {
        child.drain(DRAIN, |event| {
            self.take(event);
            self.garbage.is_none()
        });
    }

    fn take(&mut self, event: Event) {
        let line = match event {
            Event::Frame(line) => line,
            Event::Garbage(what) => return self.refuse(what),
            Event::Closed => return,
        };
        let tagged = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .filter(|v| v.get(RESULT_TAG).and_then(|t| t.as_str()) == Some(self.nonce));
        match tagged {
            Some(_) if self.result.is_some() => self.refuse("a second result".to_owned()),
            Some(v) => self.result = Some(v),
            None => {
                let shown: String = line.chars().take(80).collect();
                self.refuse(format!("a line that is not its own ({shown:?})"));
            }
        }
    }

    /// The first thing the check never writes decides.
    fn refuse(&mut self, what: String) {
        self.garbage.get_or_insert(what);
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
