//! Distribution through OCI registries and lock files: `push`, `pull`, `install oci://…`,
//! `lock` and `sync`.
//!
//! The registry is an untrusted transport. A pulled package lands in a private scratch
//! directory and is installed from there by the ordinary installation, which authenticates it
//! before anything reaches the store. A lock pins payload digests: a package whose payload
//! differs from its lock entry is refused before it is installed, whatever a tag says.
//!
//! Where a package came from (its reference and manifest digest) is remembered in the store's
//! `origins/` directory, one small file per payload digest written atomically, so that `guild
//! lock` can record it; a missing or unreadable origin only leaves the lock entry without a
//! reference.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use guild_domain::ids::Sha256Digest;
use guild_domain::manifest::Metadata;
use guild_domain::trust::authenticate;
use guild_host::distribution::{
    ArtifactConfig, ArtifactRegistry, DistributionError, DistributionErrorKind, LockFile,
    LockedPackage, LockedSource, OciReference, OciRegistry, Pulled, PushRequest, SyncStep,
};
use guild_host::lock_sync::{self, SyncChange, SyncError, SyncOptions, SyncStaging};
use guild_host::packaging::{GkpkSource, P256Verifier};
use guild_host::{durable_file, HostError, PackageManager};
use guild_ports::source::{PackageSource, Progress};
use serde_json::json;

use super::failure::{CliError, Exit};
use super::output::Report;
use super::publisher::{parse_metadata, Check, ScratchDir};
use super::store;

/// The exit code and hint for a failed push or pull.
pub(crate) fn registry_failure(e: DistributionError) -> anyhow::Error {
    use DistributionErrorKind as K;
    let (exit, hint) = match &e.kind {
        K::NotFound => (Exit::NotFound, None),
        K::Unauthorized { registry, .. } => (
            Exit::Refused,
            Some(format!(
                "log in with `docker login {registry}` or `podman login {registry}`, or set \
                 REGISTRY_AUTH_FILE to a config.json that has credentials for it"
            )),
        ),
        K::Insecure { .. } => (
            Exit::Refused,
            Some(
                "plain HTTP is used only for loopback hosts and those listed in \
                 GUILD_INSECURE_REGISTRIES"
                    .to_owned(),
            ),
        ),
        K::Unreachable { .. } => (
            Exit::Unreachable,
            Some(format!(
                "check the network, the registry's host name and port, and that the registry \
                 is up; downloads (pull, install, sync) are tried {DEFAULT_ATTEMPTS} times \
                 unless {ATTEMPTS_VARIABLE} says otherwise, {RETRY_DELAY_VARIABLE} seconds \
                 apart (default 1), doubling"
            )),
        ),
        K::Transport { .. } | K::Registry { .. } | K::Io { .. } => (Exit::Failure, None),
        K::DeadlineExceeded { .. } | K::Stalled { .. } => (
            Exit::Failure,
            Some(
                "for a slow registry, raise GUILD_REGISTRY_DEADLINE_SECONDS or lower \
                 GUILD_REGISTRY_STALL (BYTES/SECONDS)"
                    .to_owned(),
            ),
        ),
        K::BadSetting { .. } => (Exit::Usage, None),
        _ => (
            Exit::Rejected,
            Some("the registry's answer was refused; nothing was installed".to_owned()),
        ),
    };
    // The exit code is read from the first `CliError` in the chain, so the error is one; the
    // underlying cause (HTTP, TLS) is kept in its message.
    let mut message = e.to_string();
    if let Some(source) = &e.source {
        let text = source.to_string();
        if !message.contains(&text) {
            message.push_str(&format!(" ({text})"));
        }
    }
    let mut cli = CliError::new(exit, message);
    if let Some(h) = hint {
        cli = cli.with_hint(h);
    }
    cli.into()
}

/// What the archive says about itself, read without verifying it: the artifact config.
fn artifact_config(package: &Path) -> anyhow::Result<ArtifactConfig> {
    let opened = GkpkSource::default()
        .open(package)
        .map_err(HostError::from)?;
    let metadata = parse_metadata(package, opened.metadata_bytes())?;
    let m = metadata.manifest();
    Ok(ArtifactConfig {
        id: m.package_id.clone(),
        version: m.version.clone(),
        kind: m.kind,
        publisher: m.publisher_id.clone(),
        payload_sha256: metadata.payload_digest(),
    })
}

pub(crate) fn progress_ref(progress: &Option<Arc<dyn Progress>>) -> Option<&dyn Progress> {
    progress.as_deref()
}

/// `guild push FILE REFERENCE`.
pub fn push(
    package: &Path,
    reference: &OciReference,
    annotations: &[(String, String)],
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    let config = artifact_config(package)?;
    let mut all = vec![
        (
            "org.opencontainers.image.title".to_owned(),
            config.id.to_string(),
        ),
        (
            "org.opencontainers.image.version".to_owned(),
            config.version.to_string(),
        ),
        (
            "org.opencontainers.image.vendor".to_owned(),
            config.publisher.to_string(),
        ),
        (
            "dev.guild.payload.sha256".to_owned(),
            config.payload_sha256.to_hex(),
        ),
    ];
    for (k, v) in annotations {
        all.retain(|(key, _)| key != k);
        all.push((k.clone(), v.clone()));
    }
    let pushed = OciRegistry::from_environment()
        .push(
            reference,
            PushRequest {
                archive: package,
                config: &config,
                annotations: &all,
            },
            progress_ref(&progress),
        )
        .map_err(registry_failure)?;
    let digest = format!("sha256:{}", pushed.manifest_digest.to_hex());
    let mut report = Report::new("push");
    report
        .field("reference", reference.to_string())
        .field("manifest_digest", digest.clone())
        .field(
            "pinned",
            reference.at_digest(pushed.manifest_digest).to_string(),
        )
        .field("layer_sha256", pushed.layer_digest.to_hex())
        .field("size", pushed.layer_size)
        .field("package_id", config.id.as_str())
        .field("version", config.version.to_string())
        .field("payload_sha256", config.payload_sha256.to_hex())
        .line(format!(
            "pushed {} {} ({} bytes) to {reference}",
            config.id, config.version, pushed.layer_size
        ))
        .line(digest);
    Ok(report)
}

/// How many times a download is tried when the registry cannot be reached.
const ATTEMPTS_VARIABLE: &str = "GUILD_REGISTRY_ATTEMPTS";
/// The wait before the second try, in seconds; each later wait is twice the one before.
const RETRY_DELAY_VARIABLE: &str = "GUILD_REGISTRY_RETRY_DELAY";
const DEFAULT_ATTEMPTS: u32 = 3;
const MAX_ATTEMPTS: u32 = 10;
const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(1);

/// How a download that cannot reach its registry is tried again: `GUILD_REGISTRY_ATTEMPTS`
/// tries in all (1 to 10, default 3), the first wait `GUILD_REGISTRY_RETRY_DELAY` seconds
/// (0 to 60, default 1), doubled after each try. Only an unreachable registry is tried again:
/// a refusal, a wrong digest or a stalled download would fail the same way again.
#[derive(Debug, Clone, Copy)]
struct Retry {
    attempts: u32,
    first_delay: Duration,
}

fn retry_policy() -> anyhow::Result<Retry> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let bad = |name: &str, text: &str, what: &str| {
        anyhow::Error::from(CliError::new(
            Exit::Usage,
            format!("{name} is {text:?}, not {what}"),
        ))
    };
    let attempts = match var(ATTEMPTS_VARIABLE) {
        None => DEFAULT_ATTEMPTS,
        Some(text) => text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_ATTEMPTS).contains(n))
            .ok_or_else(|| {
                bad(
                    ATTEMPTS_VARIABLE,
                    &text,
                    &format!("a number of tries from 1 to {MAX_ATTEMPTS}"),
                )
            })?,
    };
    let first_delay = match var(RETRY_DELAY_VARIABLE) {
        None => DEFAULT_RETRY_DELAY,
        Some(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && (0.0..=60.0).contains(s))
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                bad(
                    RETRY_DELAY_VARIABLE,
                    &text,
                    "a number of seconds from 0 to 60",
                )
            })?,
    };
    Ok(Retry {
        attempts,
        first_delay,
    })
}

/// Pulls `reference` into `out` (which must not exist), or fails leaving nothing there. A
/// registry that cannot be reached is tried again as [`retry_policy`] says.
pub(crate) fn pull_to(
    reference: &OciReference,
    out: &Path,
    progress: Option<&dyn Progress>,
) -> anyhow::Result<Pulled> {
    let registry = OciRegistry::from_environment();
    retrying(&format!("cannot download {reference}"), || {
        registry.pull(reference, out, progress)
    })
}

/// Runs `request` (one registry exchange), trying it again while the registry is unreachable,
/// as [`retry_policy`] says; `what` says what failed when it stays unreachable.
pub(crate) fn retrying<T>(
    what: &str,
    mut request: impl FnMut() -> Result<T, DistributionError>,
) -> anyhow::Result<T> {
    let retry = retry_policy()?;
    let mut delay = retry.first_delay;
    let mut attempt = 1;
    loop {
        match request() {
            Ok(answer) => return Ok(answer),
            Err(e)
                if matches!(e.kind, DistributionErrorKind::Unreachable { .. })
                    && attempt < retry.attempts =>
            {
                std::thread::sleep(delay);
                delay = delay.saturating_mul(2);
                attempt += 1;
            }
            Err(e) if matches!(e.kind, DistributionErrorKind::Unreachable { .. }) => {
                let tries = if attempt == 1 {
                    "1 try".to_owned()
                } else {
                    format!("{attempt} tries")
                };
                return Err(registry_failure(e).context(format!(
                    "{what}: the registry was unreachable after {tries}"
                )));
            }
            Err(e) => return Err(registry_failure(e)),
        }
    }
}

/// `guild pull REFERENCE --out FILE`.
pub fn pull(
    reference: &OciReference,
    out: &Path,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    // Download into a private scratch directory, then copy beside the destination and rename:
    // a failed pull leaves no file at `out`, and one that was killed leaves a temporary that
    // the next pull to the same name removes.
    let scratch = ScratchDir::create_named("pull")?;
    let file = scratch.path().join(file_name_for(reference));
    let pulled = pull_to(reference, &file, progress_ref(&progress))?;
    put_in_place(&file, out)?;
    let mut report = Report::new("pull");
    pulled_fields(&mut report, reference, &pulled);
    // Not yet authenticated: the artifact's own word for what it holds.
    report
        .field("package_id", pulled.config.id.as_str())
        .field("version", pulled.config.version.to_string());
    report.field("out", out.display().to_string()).line(format!(
        "pulled {} {} ({} bytes, layer digest checked) to {}; it is not yet verified \
         (`guild verify` or `guild install` does that)",
        pulled.config.id,
        pulled.config.version,
        pulled.layer_size,
        out.display()
    ));
    Ok(report)
}

/// Copies the downloaded `file` to `out` atomically and durably ([`durable_file::write_from`]:
/// a temporary created exclusively beside `out`, so a link planted at its name is never
/// written through), after removing the temporaries that killed pulls left there.
fn put_in_place(file: &Path, out: &Path) -> anyhow::Result<()> {
    durable_file::remove_stale_temporaries_of(out).with_context(|| {
        format!(
            "cannot remove the temporaries of interrupted pulls beside {}",
            out.display()
        )
    })?;
    let mut downloaded = fs::File::open(file)
        .with_context(|| format!("cannot read the downloaded {}", file.display()))?;
    durable_file::write_from(out, &mut downloaded)
        .map(drop)
        .with_context(|| format!("cannot write {}", out.display()))
}

fn pulled_fields(report: &mut Report, reference: &OciReference, pulled: &Pulled) {
    report
        .field("reference", reference.to_string())
        .field(
            "manifest_digest",
            format!("sha256:{}", pulled.manifest_digest.to_hex()),
        )
        .field("layer_sha256", pulled.layer_digest.to_hex())
        .field("size", pulled.layer_size);
}

/// `guild install oci://…`: pull into a scratch directory, then the ordinary installation.
pub fn install(
    store_dir: &Path,
    reference: &OciReference,
    enable: bool,
    allow_downgrade: bool,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    let scratch = ScratchDir::create_named("pull")?;
    let file = scratch.path().join(file_name_for(reference));
    let pulled = pull_to(reference, &file, progress_ref(&progress))?;
    let mut report = store::install(store_dir, &file, enable, allow_downgrade, progress)?;
    let payload = report
        .json
        .get("payload_sha256")
        .and_then(|v| v.as_str())
        .and_then(|h| Sha256Digest::parse_hex(h).ok());
    if let Some(payload) = payload {
        if payload != pulled.config.payload_sha256 {
            report.warnings.push(format!(
                "the artifact's config names payload {} but the package's payload is {}; the \
                 package itself was authenticated and installed",
                pulled.config.payload_sha256.to_hex(),
                payload.to_hex()
            ));
        }
        record_origin(store_dir, &payload, reference, &pulled.manifest_digest);
    }
    // The package's own id and version came from the installation, which authenticated them;
    // the artifact's config only adds where it came from.
    pulled_fields(&mut report, reference, &pulled);
    report.line(format!(
        "from {reference} (manifest sha256:{})",
        pulled.manifest_digest.to_hex()
    ));
    Ok(report)
}

fn file_name_for(reference: &OciReference) -> String {
    let last = reference
        .repository()
        .rsplit('/')
        .next()
        .unwrap_or("package");
    format!("{last}.package")
}

fn origins_dir(store: &Path) -> PathBuf {
    store.join("origins")
}

/// Remembers where the package with this payload came from, for `guild lock`. Written
/// atomically and durably ([`durable_file::write`]); a failure is a warning on stderr, never a
/// failed install, since the package itself is installed.
fn record_origin(
    store: &Path,
    payload: &Sha256Digest,
    reference: &OciReference,
    manifest: &Sha256Digest,
) {
    let dir = origins_dir(store);
    let result = (|| -> std::io::Result<()> {
        fs::create_dir_all(&dir)?;
        let body = json!({
            "reference": reference.to_string(),
            "manifest_digest": format!("sha256:{}", manifest.to_hex()),
        });
        let path = dir.join(format!("{}.json", payload.to_hex()));
        durable_file::write(&path, body.to_string().as_bytes())
    })();
    if let Err(e) = result {
        eprintln!(
            "warning: could not record where {} came from in {}: {e}",
            payload.to_hex(),
            dir.display()
        );
    }
}

fn read_origin(store: &Path, payload: &Sha256Digest) -> Option<LockedSource> {
    let bytes = fs::read(origins_dir(store).join(format!("{}.json", payload.to_hex()))).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let reference = OciReference::parse(value.get("reference")?.as_str()?).ok()?;
    let digest = value
        .get("manifest_digest")?
        .as_str()?
        .strip_prefix("sha256:")?;
    Some(LockedSource {
        reference,
        manifest_digest: Sha256Digest::parse_hex(digest).ok()?,
    })
}

/// The lock of a store's enabled packages.
fn lock_of(store_dir: &Path, pm: &PackageManager) -> anyhow::Result<LockFile> {
    let trust = pm.trust()?;
    let mut entries = Vec::new();
    for p in pm.list()? {
        let Some(version) = &p.enabled else { continue };
        let Some(v) = p.versions.iter().find(|v| &v.version == version) else {
            continue;
        };
        let metadata = pm.metadata(&p.id, version).ok_or_else(|| {
            CliError::new(
                Exit::Store,
                format!("the store has no manifest for enabled {} {version}", p.id),
            )
        })?;
        let auth =
            authenticate(&metadata, &trust, &Check(P256Verifier::new())).map_err(|source| {
                HostError::Unauthenticated {
                    location: store_dir.to_path_buf(),
                    package: format!("{}@{version}", p.id),
                    source,
                }
            })?;
        entries.push(LockedPackage {
            id: p.id.clone(),
            version: version.clone(),
            kind: p.kind,
            payload_sha256: v.payload_digest,
            publisher: p.publisher.clone(),
            key_id: auth.key_id,
            source: read_origin(store_dir, &v.payload_digest),
        });
    }
    Ok(LockFile::new(entries)?)
}

/// `guild lock [--out FILE|-] [--allow-empty]`.
pub fn lock(store_dir: &Path, out: &Path, allow_empty: bool) -> anyhow::Result<Report> {
    // Writing a lock only reads the store.
    let (pm, mut report) = store::open_reader(store_dir, "lock")?;
    let lock = lock_of(store_dir, &pm)?;
    if lock.packages().len() == 0 && !allow_empty {
        // A sync of an empty lock disables every package; a store that has none enabled (a
        // repair or a revocation disabled them, the wrong store was named) is far likelier than
        // a fleet meant to run nothing.
        return Err(CliError::new(
            Exit::Refused,
            format!(
                "{} has no enabled package: the lock would be empty, and nothing was written",
                store_dir.display()
            ),
        )
        .with_hint(
            "`guild list` shows what the store holds (enable or repair packages first); pass \
             --allow-empty to write an empty lock anyway",
        )
        .into());
    }
    let text = lock.to_json();
    if out == Path::new("-") {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|e| {
                CliError::new(Exit::Failure, format!("cannot write standard output: {e}"))
            })?;
        // The lock is the whole of standard output; warnings still go to stderr.
        for w in &report.warnings {
            eprintln!("warning: {w}");
        }
        return Ok(report.silent());
    }
    durable_file::write(out, text.as_bytes())
        .with_context(|| format!("cannot write the lock file {}", out.display()))?;
    let without: Vec<String> = lock
        .packages()
        .filter(|p| p.source.is_none())
        .map(|p| p.id.to_string())
        .collect();
    report
        .field("out", out.display().to_string())
        .field("packages", lock.packages().len())
        .line(format!(
            "locked {} enabled package{} in {}",
            lock.packages().len(),
            if lock.packages().len() == 1 { "" } else { "s" },
            out.display()
        ));
    if !without.is_empty() {
        report.warnings.push(format!(
            "no registry reference is known for {}: `guild sync` can install them only with \
             --from DIR",
            without.join(", ")
        ));
    }
    Ok(report)
}

pub(crate) fn read_lock(path: &Path) -> anyhow::Result<LockFile> {
    let bytes = fs::read(path).map_err(|e| {
        let exit = if e.kind() == std::io::ErrorKind::NotFound {
            Exit::NotFound
        } else {
            Exit::Failure
        };
        anyhow::Error::from(CliError::new(
            exit,
            format!("cannot read the lock file {}: {e}", path.display()),
        ))
    })?;
    LockFile::parse(&bytes).map_err(|e| {
        CliError::new(
            Exit::Rejected,
            format!("the lock file {} is malformed: {e}", path.display()),
        )
        .into()
    })
}

/// The mirror's file name of a locked package.
pub(crate) fn mirror_name(p: &LockedPackage) -> String {
    format!("{}-{}.{}", p.id, p.version, p.kind.as_str())
}

/// Whether `file` is, whole, the package `locked` pins: its manifest names the locked id and
/// version, its payload digest (over the signed manifest) is the locked one, and every artifact
/// hashes to what that manifest says. Its signature is the installation's to check.
fn check_whole(file: &Path, locked: &LockedPackage) -> anyhow::Result<()> {
    let config = artifact_config(file)?;
    if config.payload_sha256 != locked.payload_sha256
        || config.id != locked.id
        || config.version != locked.version
    {
        return Err(CliError::new(
            Exit::Rejected,
            format!(
                "{} {}: {} has payload {} ({} {}), but the lock pins payload {}",
                locked.id,
                locked.version,
                file.display(),
                config.payload_sha256.to_hex(),
                config.id,
                config.version,
                locked.payload_sha256.to_hex()
            ),
        )
        .with_hint("fetch the locked package or update the lock")
        .into());
    }
    open_whole(file).with_context(|| format!("{} {}", locked.id, locked.version))?;
    Ok(())
}

/// The package `file`'s metadata, read without verifying its signatures, after checking that
/// every artifact hashes to what its manifest says. Its signature is the caller's to check.
pub(crate) fn open_whole(file: &Path) -> anyhow::Result<Metadata> {
    let opened = GkpkSource::default().open(file).map_err(HostError::from)?;
    let metadata = parse_metadata(file, opened.metadata_bytes())?;
    opened
        .verify_in_place(metadata.manifest())
        .map_err(HostError::from)
        .with_context(|| format!("{} does not hold what its manifest says", file.display()))?;
    Ok(metadata)
}

/// Downloads the locked package from its pinned reference to `file` (which must not exist),
/// refusing an artifact whose config names another payload.
fn pull_locked(
    locked: &LockedPackage,
    file: &Path,
    progress: Option<&dyn Progress>,
) -> anyhow::Result<()> {
    let Some(source) = &locked.source else {
        return Err(CliError::new(
            Exit::NotFound,
            format!(
                "{} {}: the lock names no registry reference for it",
                locked.id, locked.version
            ),
        )
        .with_hint("sync with --from DIR holding its archive")
        .into());
    };
    let pulled = pull_to(&source.pinned(), file, progress)?;
    if pulled.config.payload_sha256 != locked.payload_sha256 {
        return Err(CliError::new(
            Exit::Rejected,
            format!(
                "{} {}: {} holds payload {}, but the lock pins payload {}",
                locked.id,
                locked.version,
                source.pinned(),
                pulled.config.payload_sha256.to_hex(),
                locked.payload_sha256.to_hex()
            ),
        )
        .into());
    }
    Ok(())
}

/// Brings the locked package into the sync's staging area: copied once from `from` (a mirror
/// directory) when given, else downloaded from its pinned reference. Answers the staged file.
pub(crate) fn fetch_locked(
    locked: &LockedPackage,
    from: Option<&Path>,
    staging: &SyncStaging,
    progress: Option<&dyn Progress>,
) -> anyhow::Result<PathBuf> {
    let Some(dir) = from else {
        let file = staging.file_for(locked);
        pull_locked(locked, &file, progress)?;
        return Ok(file);
    };
    let file = dir.join(mirror_name(locked));
    if !file.is_file() {
        return Err(CliError::new(
            Exit::NotFound,
            format!(
                "{} {}: {} is not in the mirror directory",
                locked.id,
                locked.version,
                file.display()
            ),
        )
        .with_hint("make the mirror with `guild pull --lock LOCK --to DIR`")
        .into());
    }
    staging.copy_in(locked, &file).map_err(sync_failure)
}

/// A failed sync as the command line reports it: where the failure came from the store (a
/// refused dependency, an unauthenticated package), the store's error decides the exit code.
pub(crate) fn sync_failure(e: SyncError) -> anyhow::Error {
    let message = e.to_string();
    let exit = match e {
        SyncError::Conflict(_) => {
            return CliError::new(Exit::Refused, message)
                .with_hint(
                    "versions are immutable: the lock and this store disagree about what that \
                     version is",
                )
                .into()
        }
        SyncError::Store(source)
        | SyncError::Check { source, .. }
        | SyncError::Step { source, .. } => return anyhow::Error::from(*source).context(message),
        SyncError::NotLocked { .. } => Exit::Rejected,
        SyncError::StagedKeyDiffers { .. } => {
            return CliError::new(Exit::Rejected, message)
                .with_hint(
                    "the package authenticates, but not by the key the lock requires: fetch the \
                     build signed by that key, or make a new lock if the key changed on purpose",
                )
                .into()
        }
        SyncError::InstalledKeyDiffers { .. } => {
            return CliError::new(Exit::Refused, message)
                .with_hint(
                    "this store kept a build the lock no longer accepts; `guild trust \
                     revoke-key KEY` (the key the store's build is signed by) if that key is \
                     retired, then remove that version (`guild remove ID --version V`) so the \
                     sync installs the locked build, or make a new lock if the store is right",
                )
                .into()
        }
        SyncError::Shrinks { .. } => {
            return CliError::new(Exit::Refused, message)
                .with_hint(
                    "check the lock; pass --allow-shrink if those packages are meant to be \
                     disabled",
                )
                .into()
        }
        SyncError::Copy { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Exit::NotFound
        }
        _ => Exit::Failure,
    };
    CliError::new(exit, message).into()
}

/// `guild pull --lock LOCK --to DIR`: every locked package into a mirror directory.
pub fn mirror(
    lock_path: &Path,
    to: &Path,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    let lock = read_lock(lock_path)?;
    fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    let mut report = Report::new("pull");
    let mut files = Vec::new();
    for locked in lock.packages() {
        let dest = to.join(mirror_name(locked));
        // Only a file that is, whole, the locked package is kept; anything else is replaced.
        let kept = dest.is_file() && check_whole(&dest, locked).is_ok();
        if kept {
            report.line(format!("{} is already in the mirror", dest.display()));
            files.push(dest.display().to_string());
            continue;
        }
        let scratch = ScratchDir::create_named("mirror")?;
        let file = scratch.path().join(mirror_name(locked));
        pull_locked(locked, &file, progress_ref(&progress))?;
        check_whole(&file, locked)?;
        put_in_place(&file, &dest)?;
        report.line(format!(
            "pulled {} {} to {}",
            locked.id,
            locked.version,
            dest.display()
        ));
        files.push(dest.display().to_string());
    }
    report
        .field("to", to.display().to_string())
        .field("files", files);
    Ok(report)
}

/// What `guild sync` is asked to do with the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Make the store match the lock.
    Apply,
    /// `--dry-run`: print the plan, change nothing.
    DryRun,
    /// `--check`: change nothing; exit 0 when the store matches, [`Exit::Differs`] when not.
    Check,
}

/// The options of `guild sync`.
#[derive(Debug, Clone, Copy)]
pub struct SyncRequest<'a> {
    /// `--from DIR`: the mirror to take archives from.
    pub from: Option<&'a Path>,
    /// `--allow-shrink`.
    pub allow_shrink: bool,
    pub mode: SyncMode,
}

/// One planned step as `--dry-run`, `--check` and the sync's report show it.
fn step_json(step: &SyncStep) -> serde_json::Value {
    match step {
        SyncStep::Disable(id) => json!({"action": "disable", "package_id": id.as_str()}),
        SyncStep::Install(l) => json!({
            "action": "install", "package_id": l.id.as_str(), "version": l.version.to_string(),
            "key_id": l.key_id.to_hex(),
        }),
        SyncStep::Reactivate(l) => json!({
            "action": "reactivate", "package_id": l.id.as_str(),
            "version": l.version.to_string(), "key_id": l.key_id.to_hex(),
        }),
    }
}

fn step_line(step: &SyncStep) -> String {
    match step {
        SyncStep::Disable(id) => format!("disable {id} (the lock does not name it)"),
        SyncStep::Install(l) => format!(
            "install {} {} (signed by key {})",
            l.id, l.version, l.key_id
        ),
        SyncStep::Reactivate(l) => format!(
            "make {} {} current and enabled again (signed by key {})",
            l.id, l.version, l.key_id
        ),
    }
}

/// `guild sync LOCK [--from DIR] [--allow-shrink] [--dry-run | --check]`: make the store's
/// enabled set equal the lock, or say what that would do.
///
/// The packages are fetched and checked into a staging area under the store without its lock,
/// so that other writers are not kept waiting by a download; then the lock is taken and the
/// whole change is made from the staged files, or none of it ([`lock_sync`]). `--dry-run` and
/// `--check` only read the committed state: they fetch nothing, take no lock and create nothing.
pub fn sync(
    store_dir: &Path,
    lock_path: &Path,
    request: &SyncRequest<'_>,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    let lock = read_lock(lock_path)?;
    let options = SyncOptions::allowing_shrink(request.allow_shrink);
    if request.mode != SyncMode::Apply {
        return sync_plan_only(store_dir, lock_path, &lock, request.mode, options);
    }
    let from = request.from;
    let timeout = store::check_timeout()?;
    let staging = SyncStaging::create(store_dir).map_err(sync_failure)?;
    let staged = {
        // The committed state, read without the store's lock.
        let (reader, _) = store::open_committed(store_dir, "sync")?;
        reader.set_progress(progress.clone());
        let steps = lock_sync::plan(&reader, &lock).map_err(sync_failure)?;
        // Refused before anything is downloaded; checked again on the plan made under the lock.
        lock_sync::check_shrink(&lock, &steps, options).map_err(sync_failure)?;
        let mut staged = Vec::new();
        for step in &steps {
            let (SyncStep::Install(locked) | SyncStep::Reactivate(locked)) = step else {
                continue;
            };
            let file = fetch_locked(locked, from, &staging, progress_ref(&progress))?;
            staged.push(lock_sync::stage(&reader, locked, file).map_err(sync_failure)?);
        }
        staged
    };
    let (pm, mut report) = store::open(store_dir, "sync")?;
    let mut check = store::library_check(&pm, timeout)?;
    let changes =
        lock_sync::apply_with(&pm, &lock, &staged, &mut check, options).map_err(sync_failure)?;
    drop(staging);
    let mut done = Vec::new();
    for change in &changes {
        let (action, id, version) = match change {
            SyncChange::Disabled { id, version } => ("disable", id, version),
            SyncChange::Installed { id, version } => ("install", id, version),
        };
        let locked = lock.get(id).filter(|_| action == "install");
        if let Some((locked, source)) = locked.and_then(|l| l.source.as_ref().map(|s| (l, s))) {
            record_origin(
                store_dir,
                &locked.payload_sha256,
                &source.reference,
                &source.manifest_digest,
            );
        }
        done.push(
            json!({"action": action, "package_id": id.as_str(), "version": version.to_string()}),
        );
    }
    report
        .field("lock", lock_path.display().to_string())
        .field("packages", lock.packages().len())
        .field("changes", done.clone());
    if done.is_empty() {
        report.line(format!(
            "the store already matches {} ({} packages)",
            lock_path.display(),
            lock.packages().len()
        ));
    }
    for d in &done {
        let done = match d["action"].as_str() {
            Some("disable") => "disabled",
            _ => "installed",
        };
        report.line(format!(
            "{done} {} {}",
            d["package_id"].as_str().unwrap_or_default(),
            d["version"].as_str().unwrap_or_default()
        ));
    }
    if !done.is_empty() {
        report.line(format!(
            "the store matches {} ({} enabled packages)",
            lock_path.display(),
            lock.packages().len()
        ));
    }
    Ok(report)
}

/// `guild sync --dry-run` and `--check`: the plan from the committed state, nothing changed.
/// A dry run is refused as the sync would be (a shrink without `--allow-shrink`, a key or
/// payload the store cannot match); a check answers whether the store matches, and is refused
/// only where the store cannot be made to match at all.
fn sync_plan_only(
    store_dir: &Path,
    lock_path: &Path,
    lock: &LockFile,
    mode: SyncMode,
    options: SyncOptions,
) -> anyhow::Result<Report> {
    let command = "sync";
    let (steps, mut report) = if store_dir.is_dir() {
        let (reader, report) = store::open_committed(store_dir, command)?;
        (
            lock_sync::plan(&reader, lock).map_err(sync_failure)?,
            report,
        )
    } else {
        // No store yet: a sync would make one and install every locked package. Nothing is
        // created here.
        let steps = lock.packages().cloned().map(SyncStep::Install).collect();
        (steps, Report::new(command))
    };
    if mode == SyncMode::DryRun {
        lock_sync::check_shrink(lock, &steps, options).map_err(sync_failure)?;
    }
    let planned: Vec<serde_json::Value> = steps.iter().map(step_json).collect();
    report
        .field("lock", lock_path.display().to_string())
        .field("packages", lock.packages().len())
        .field(
            "mode",
            if mode == SyncMode::Check {
                "check"
            } else {
                "dry_run"
            },
        )
        .field("matches", steps.is_empty())
        .field("plan", planned);
    if steps.is_empty() {
        report.line(format!(
            "the store matches {} ({} packages); nothing to do",
            lock_path.display(),
            lock.packages().len()
        ));
        return Ok(report);
    }
    report.line(format!(
        "the store differs from {}; a sync would:",
        lock_path.display()
    ));
    for step in &steps {
        report.line(format!("  {}", step_line(step)));
    }
    if mode == SyncMode::Check {
        report.exit = Some(Exit::Differs);
    } else {
        report.line("nothing was changed (--dry-run)");
    }
    Ok(report)
}

/// Whether a command-line package argument is a registry reference.
pub fn is_reference(arg: &Path) -> bool {
    arg.to_str().is_some_and(|s| s.starts_with("oci://"))
}

/// Parses `--annotation KEY=VALUE`.
pub fn parse_annotation(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("{s:?} has an empty key"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Parses an `oci://` reference for clap.
pub fn parse_reference(s: &str) -> Result<OciReference, String> {
    OciReference::parse(s).map_err(|e| e.to_string())
}
