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

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use guild_domain::ids::Sha256Digest;
use guild_domain::lifecycle::State;
use guild_domain::trust::authenticate;
use guild_host::distribution::{
    plan_sync, ArtifactConfig, ArtifactRegistry, DistributionError, DistributionErrorKind,
    HeldVersion, LockFile, LockedPackage, LockedSource, OciReference, OciRegistry, Pulled,
    PushRequest, SyncStep,
};
use guild_host::publish::{GkpkSource, P256Verifier};
use guild_host::{durable_file, HostError, InstallOptions, PackageManager};
use guild_ports::source::{PackageSource, Progress};
use serde_json::json;

use super::failure::{CliError, Exit};
use super::output::Report;
use super::publisher::{parse_metadata, Check, ScratchDir};
use super::store;

/// The exit code and hint for a failed push or pull.
fn registry_failure(e: DistributionError) -> anyhow::Error {
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

fn progress_ref(progress: &Option<Arc<dyn Progress>>) -> Option<&dyn Progress> {
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

/// Pulls `reference` into `out` (which must not exist), or fails leaving nothing there.
fn pull_to(
    reference: &OciReference,
    out: &Path,
    progress: Option<&dyn Progress>,
) -> anyhow::Result<Pulled> {
    OciRegistry::from_environment()
        .pull(reference, out, progress)
        .map_err(registry_failure)
}

/// `guild pull REFERENCE --out FILE`.
pub fn pull(
    reference: &OciReference,
    out: &Path,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    // Download beside the destination, then rename: a failed pull leaves no file at `out`.
    let tmp = sibling_tmp(out);
    let pulled = pull_to(reference, &tmp, progress_ref(&progress))?;
    durable_file::move_into_place(&tmp, out)
        .with_context(|| format!("cannot move the pulled package to {}", out.display()))?;
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

fn sibling_tmp(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "package".into());
    out.with_file_name(format!(".{name}.{}.part", std::process::id()))
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

/// `guild lock [--out FILE]`.
pub fn lock(store_dir: &Path, out: &Path) -> anyhow::Result<Report> {
    // Writing a lock only reads the store.
    let (pm, mut report) = store::open_reader(store_dir, "lock")?;
    let lock = lock_of(store_dir, &pm)?;
    let text = lock.to_json();
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

fn read_lock(path: &Path) -> anyhow::Result<LockFile> {
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
fn mirror_name(p: &LockedPackage) -> String {
    format!("{}-{}.{}", p.id, p.version, p.kind.as_str())
}

/// Refuses a package file whose payload is not the one locked, before it is installed.
fn check_locked_payload(file: &Path, locked: &LockedPackage) -> anyhow::Result<()> {
    let config = artifact_config(file)?;
    if config.payload_sha256 != locked.payload_sha256 || config.id != locked.id {
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
        .with_hint("nothing was installed; fetch the locked package or update the lock")
        .into());
    }
    Ok(())
}

/// Gets the locked package into `scratch`: from `from` (a mirror directory) when given, else
/// from its pinned reference.
fn fetch_locked(
    locked: &LockedPackage,
    from: Option<&Path>,
    scratch: &Path,
    progress: Option<&dyn Progress>,
) -> anyhow::Result<PathBuf> {
    let file = match from {
        Some(dir) => {
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
            file
        }
        None => {
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
            let file = scratch.join(mirror_name(locked));
            let pulled = pull_to(&source.pinned(), &file, progress)?;
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
            file
        }
    };
    check_locked_payload(&file, locked)?;
    Ok(file)
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
        if dest.is_file() && check_locked_payload(&dest, locked).is_ok() {
            report.line(format!("{} is already in the mirror", dest.display()));
            files.push(dest.display().to_string());
            continue;
        }
        let scratch = ScratchDir::create_named("mirror")?;
        let file = fetch_locked(locked, None, scratch.path(), progress_ref(&progress))?;
        let tmp = sibling_tmp(&dest);
        fs::copy(&file, &tmp)
            .and_then(|_| durable_file::move_into_place(&tmp, &dest))
            .with_context(|| format!("cannot write {}", dest.display()))?;
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

/// `guild sync LOCK [--from DIR]`: make the store's enabled set equal the lock.
pub fn sync(
    store_dir: &Path,
    lock_path: &Path,
    from: Option<&Path>,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    let lock = read_lock(lock_path)?;
    let timeout = store::check_timeout()?;
    let (pm, mut report) = store::open(store_dir, "sync")?;
    let held = held_versions(&pm)?;
    let steps = plan_sync(&lock, &held).map_err(|e| {
        anyhow::Error::from(CliError::new(Exit::Refused, e.to_string()).with_hint(
            "versions are immutable: the lock and this store disagree about what that version is",
        ))
    })?;
    let scratch = ScratchDir::create_named("sync")?;
    // Every package to install is fetched and checked against the lock first, so that a
    // missing or altered one is refused before the store changes at all.
    let mut pending = Vec::new();
    for step in &steps {
        let locked = match step {
            SyncStep::Install(l) | SyncStep::Reactivate(l) => l,
            SyncStep::Disable(_) => continue,
        };
        let file = fetch_locked(locked, from, scratch.path(), progress_ref(&progress))?;
        pending.push((locked.clone(), file));
    }
    let mut done = Vec::new();
    // Disables first; one that an enabled dependent still needs is retried after the others.
    let mut disables: Vec<_> = steps
        .iter()
        .filter_map(|s| match s {
            SyncStep::Disable(id) => Some(id.clone()),
            _ => None,
        })
        .collect();
    while !disables.is_empty() {
        let before = disables.len();
        let mut last = None;
        disables.retain(|id| match pm.disable(id) {
            Ok(v) => {
                done.push(json!({"action": "disable", "package_id": id.as_str(), "version": v.to_string()}));
                false
            }
            Err(e) => {
                last = Some(e);
                true
            }
        });
        if disables.len() == before {
            if let Some(e) = last {
                return Err(anyhow::Error::from(e).context(format!(
                    "cannot disable {}, which the lock does not name",
                    disables[0]
                )));
            }
        }
    }
    // Then installs, in rounds, so that a dependency is installed before what depends on it.
    let mut check = store::library_check(&pm, timeout)?;
    while !pending.is_empty() {
        let before = pending.len();
        let mut last = None;
        let mut rest = Vec::new();
        for (locked, file) in pending {
            match pm.install_with(
                &file,
                InstallOptions {
                    enable: true,
                    allow_downgrade: true,
                },
                &mut check,
            ) {
                Ok(installed) => {
                    if installed.payload_digest != locked.payload_sha256 {
                        return Err(CliError::new(
                            Exit::Rejected,
                            format!(
                                "{}: installed payload {} differs from the locked {}",
                                locked.id,
                                installed.payload_digest.to_hex(),
                                locked.payload_sha256.to_hex()
                            ),
                        )
                        .into());
                    }
                    if !installed.enabled {
                        pm.enable_with(&locked.id, &mut check)?;
                    }
                    if let Some(source) = &locked.source {
                        record_origin(
                            store_dir,
                            &locked.payload_sha256,
                            &source.reference,
                            &source.manifest_digest,
                        );
                    }
                    done.push(json!({"action": "install", "package_id": locked.id.as_str(), "version": locked.version.to_string()}));
                }
                Err(e) => {
                    last = Some((locked.id.clone(), e));
                    rest.push((locked, file));
                }
            }
        }
        if rest.len() == before {
            if let Some((id, e)) = last {
                return Err(anyhow::Error::from(e).context(format!("cannot install locked {id}")));
            }
        }
        pending = rest;
    }
    // The result, checked: the enabled set equals the lock.
    let now = lock_of(store_dir, &pm)?;
    let mismatched: BTreeSet<String> = lock
        .packages()
        .filter(|l| {
            now.get(&l.id)
                .is_none_or(|n| n.payload_sha256 != l.payload_sha256)
        })
        .map(|l| l.id.to_string())
        .chain(
            now.packages()
                .filter(|n| lock.get(&n.id).is_none())
                .map(|n| n.id.to_string()),
        )
        .collect();
    if !mismatched.is_empty() {
        return Err(CliError::new(
            Exit::Failure,
            format!(
                "after sync the store still differs from the lock for {}",
                mismatched.into_iter().collect::<Vec<_>>().join(", ")
            ),
        )
        .into());
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

fn held_versions(pm: &PackageManager) -> anyhow::Result<Vec<HeldVersion>> {
    let mut held = Vec::new();
    for p in pm.list()? {
        for v in &p.versions {
            held.push(HeldVersion {
                id: p.id.clone(),
                version: v.version.clone(),
                payload_sha256: v.payload_digest,
                installed: !matches!(v.state, State::Removed | State::Discarded | State::Staged),
                enabled: p.enabled.as_ref() == Some(&v.version) && v.quarantine.is_none(),
            });
        }
    }
    Ok(held)
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
