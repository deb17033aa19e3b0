//! The publisher's commands: `keygen`, `pack`, `sign`, and the two ways of looking at a package,
//! `verify` (a trust decision against a store's trust store) and `inspect` (none).

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use guild_domain::dependency::ModuleDependency;
use guild_domain::manifest::{Manifest, Metadata};
use guild_domain::trust::{authenticate, Authenticated, SignatureCheck, TrustStore};
use guild_host::package_manager::StoreLayout;
use guild_host::packaging::key_files::{self as files, KeyFileOptions};
use guild_host::packaging::{self, GkpkSource, P256Verifier, SigningKey};
use guild_host::{HostError, HostPlatform};
use guild_ports::signature::SignatureVerifier;
use guild_ports::source::{
    Durability, ExtractOptions, ExtractedPackage, OpenedPackage, PackageSource, Progress,
};
use guild_ports::store::{StoreError, StoreErrorKind};
use serde_json::json;

use super::failure::{CliError, Exit};
use super::output::Report;
use super::render::{payload_json, short, signatures_json};

/// `guild keygen --out PREFIX [--force]`.
pub fn keygen(prefix: &Path, force: bool) -> anyhow::Result<Report> {
    let private = with_suffix(prefix, ".key");
    let public = with_suffix(prefix, ".pub");
    // Refuse before writing either file, so that a refusal never leaves half a pair behind.
    if !force {
        for path in [&private, &public] {
            if fs::symlink_metadata(path).is_ok() {
                return Err(packaging::KeyFileError::AlreadyExists { path: path.clone() }.into());
            }
        }
    }
    // A fresh key directory is made here, readable by its owner only, rather than refused.
    if let Some(dir) = private.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("cannot create the key directory {}", dir.display()))?;
        }
    }
    let key = SigningKey::generate()?;
    let options = KeyFileOptions {
        replace_existing: force,
    };
    files::write_private_key(&private, &key, &options)?;
    files::write_public_key(&public, key.public_key(), &options)?;
    let key_id = key.key_id();
    let mut report = Report::new("keygen");
    report
        .field("private_key", private.display().to_string())
        .field("public_key", public.display().to_string())
        .field("key_id", key_id.to_hex())
        .line(format!(
            "wrote private key {} (keep it secret) and public key {}",
            private.display(),
            public.display()
        ))
        .line(format!("key id {key_id}"));
    Ok(report)
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(prefix.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// `guild pack SOURCE_DIR --manifest TEMPLATE --out FILE [--key KEY]`.
pub fn pack(
    source: &Path,
    template: &Path,
    out: &Path,
    key: Option<&Path>,
) -> anyhow::Result<Report> {
    let key = key.map(files::read_private_key).transpose()?;
    let packed = packaging::pack(source, template, out, key.as_ref())?;
    let m = packed.metadata.manifest();
    let mut report = Report::new("pack");
    report
        .field("archive", out.display().to_string())
        .field("package_id", m.package_id.as_str())
        .field("version", m.version.to_string())
        .field("kind", m.kind.as_str())
        .field("payload_sha256", packed.metadata.payload_digest().to_hex())
        .field("artifacts", m.artifacts.len())
        .field("signatures", signatures_json(&packed.metadata))
        .line(format!(
            "packed {} {} ({}) into {}: {} artifact{}, payload sha256 {}",
            m.package_id,
            m.version,
            m.kind,
            out.display(),
            m.artifacts.len(),
            plural(m.artifacts.len()),
            packed.metadata.payload_digest()
        ));
    match &key {
        Some(k) => report.line(format!("signed with key {}", k.key_id())),
        None => report.line(format!(
            "unsigned: sign it with `guild sign {} --key KEY.pem`",
            out.display()
        )),
    };
    Ok(report)
}

/// `guild sign PACKAGE --key KEY [--out FILE]`.
pub fn sign(package: &Path, key: &Path, out: Option<&Path>) -> anyhow::Result<Report> {
    let key = files::read_private_key(key)?;
    let out = out.unwrap_or(package);
    let signed = packaging::sign(package, &key, out)?;
    let m = signed.metadata.manifest();
    let mut report = Report::new("sign");
    report
        .field("archive", out.display().to_string())
        .field("package_id", m.package_id.as_str())
        .field("version", m.version.to_string())
        .field("payload_sha256", signed.metadata.payload_digest().to_hex())
        .field("key_id", key.key_id().to_hex())
        .field("signatures", signatures_json(&signed.metadata))
        .line(format!(
            "signed {} {} with key {} into {} ({} signature{})",
            m.package_id,
            m.version,
            key.key_id(),
            out.display(),
            signed.metadata.signatures().len(),
            plural(signed.metadata.signatures().len())
        ));
    Ok(report)
}

/// Bridges the crypto adapter to the domain's trust decision.
pub(crate) struct Check(pub(crate) P256Verifier);

impl SignatureCheck for Check {
    fn verify(&self, spki_der: &[u8], message: &[u8], signature: &[u8]) -> Result<(), String> {
        self.0
            .verify(spki_der, message, signature)
            .map_err(|e| e.to_string())
    }
}

/// Reads the store's trust file without opening the store: `verify` must not change the store
/// (opening would take its lock, recover it, or create it). The file is replaced atomically, so
/// a read sees a whole version of it. An absent file trusts nothing; one that cannot be read or
/// decoded is an error, never an empty trust store.
pub(crate) fn read_store_trust(store: &Path) -> Result<TrustStore, HostError> {
    let path = StoreLayout::new(store).trust;
    match fs::read(&path) {
        Ok(bytes) => Ok(TrustStore::from_json(&bytes)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(TrustStore::new()),
        Err(e) => Err(StoreError::new(StoreErrorKind::Io, "read trust file")
            .at(path)
            .caused_by(e)
            .into()),
    }
}

/// `guild verify PACKAGE`: the checks of an installation, in its order, without the store.
pub fn verify(
    store: &Path,
    package: &Path,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<Report> {
    let trust = read_store_trust(store)?;
    let source = GkpkSource::new(ExtractOptions {
        durability: Durability::NoFsync,
        ..ExtractOptions::default()
    });
    let opened = source.open(package).map_err(HostError::from)?;
    let metadata = parse_metadata(package, opened.metadata_bytes())?;
    let manifest = metadata.manifest();
    let auth = authenticate(&metadata, &trust, &Check(P256Verifier::new())).map_err(|source| {
        HostError::Unauthenticated {
            location: package.to_path_buf(),
            package: format!("{}@{}", manifest.package_id, manifest.version),
            source,
        }
    })?;
    // Only an authenticated manifest decides what may be written, as in an installation.
    let extracted = extract_to_scratch(opened, manifest, progress)?;
    let platform_problem = platform_problem(manifest);
    Ok(verify_report(
        package,
        manifest,
        &auth,
        &extracted,
        platform_problem,
    ))
}

/// Extracts the package into a scratch directory, every file checked against `manifest` as it
/// is written, and removes it again. Returns what was written.
fn extract_to_scratch(
    mut opened: Box<dyn OpenedPackage>,
    manifest: &Manifest,
    progress: Option<Arc<dyn Progress>>,
) -> anyhow::Result<ExtractedPackage> {
    let scratch = ScratchDir::create()?;
    if let Some(p) = &progress {
        p.begin(
            &format!("{}@{}", manifest.package_id, manifest.version),
            manifest.artifacts.iter().map(|a| a.size).sum(),
        );
        opened.watch(Arc::clone(p));
    }
    let extracted = opened.extract_to(manifest, &scratch.path().join("package"));
    if let Some(p) = &progress {
        p.finish();
    }
    let extracted = extracted.map_err(HostError::from)?;
    drop(scratch);
    Ok(extracted)
}

/// Why this host could not install the package, if it could not.
fn platform_problem(manifest: &Manifest) -> Option<String> {
    match HostPlatform::current().map(|p| p.check(manifest)) {
        Some(Ok(())) => None,
        Some(Err(e)) => Some(e.to_string()),
        None => Some("this host's platform cannot be named in a manifest".to_owned()),
    }
}

/// What `verify` found: who signed it, the payload, the artifacts and whether this host can
/// install it (a warning when not).
fn verify_report(
    package: &Path,
    manifest: &Manifest,
    auth: &Authenticated,
    extracted: &ExtractedPackage,
    platform_problem: Option<String>,
) -> Report {
    let total: u64 = extracted.files.iter().map(|a| a.size).sum();
    let mut report = Report::new("verify");
    report
        .field("package", package.display().to_string())
        .field("package_id", manifest.package_id.as_str())
        .field("version", manifest.version.to_string())
        .field("kind", manifest.kind.as_str())
        .field("publisher", auth.publisher.as_str())
        .field("key_id", auth.key_id.to_hex())
        .field(
            "signed_by",
            auth.signed_by.iter().map(|k| k.to_hex()).collect::<Vec<_>>(),
        )
        .field("payload_sha256", auth.payload_digest.to_hex())
        .field(
            "artifacts",
            extracted
                .files
                .iter()
                .map(|a| json!({"path": a.path.as_str(), "size": a.size, "sha256": a.sha256.to_hex()}))
                .collect::<Vec<_>>(),
        )
        .field(
            "platform",
            json!({"installable": platform_problem.is_none(), "problem": platform_problem}),
        )
        .line(format!(
            "verified {} {} ({}): signed by {} key{} {}",
            manifest.package_id,
            manifest.version,
            manifest.kind,
            auth.publisher,
            plural(auth.signed_by.len()),
            auth.signed_by
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .line(format!("payload sha256 {}", auth.payload_digest))
        .line(format!(
            "{} artifact{} ({} bytes) match the signed manifest",
            extracted.files.len(),
            plural(extracted.files.len()),
            total
        ));
    if let Some(problem) = &platform_problem {
        report
            .warnings
            .push(format!("this host cannot install it: {problem}"));
    }
    report
}

/// `guild inspect PACKAGE`: the manifest as written, with no trust decision at all.
pub fn inspect(package: &Path) -> anyhow::Result<Report> {
    let opened = GkpkSource::default()
        .open(package)
        .map_err(HostError::from)?;
    let metadata = parse_metadata(package, opened.metadata_bytes())?;
    let m = metadata.manifest();
    let mut report = Report::new("inspect");
    report
        .field("package", package.display().to_string())
        .field("verified", false)
        .field("payload_sha256", metadata.payload_digest().to_hex())
        .field("manifest", payload_json(&metadata))
        .field("signatures", signatures_json(&metadata));
    report.lines = inspect_lines(package, &metadata, m);
    Ok(report)
}

/// The manifest as `inspect` prints it, labelled unverified: what the package is, its
/// artifacts, what it provides and needs, and the key ids of its signatures.
fn inspect_lines(package: &Path, metadata: &Metadata, m: &Manifest) -> Vec<String> {
    let mut lines = vec![
        format!(
            "UNVERIFIED manifest of {} (no signature checked, no trust decision; use `guild verify`)",
            package.display()
        ),
        format!("  package       {} {} ({})", m.package_id, m.version, m.kind),
        format!("  publisher     {}", m.publisher_id),
        format!("  payload       sha256 {}", metadata.payload_digest()),
        format!(
            "  platform      {}/{}, kernel ABI {}{}",
            m.os,
            m.arch,
            m.kernel_abi,
            m.module_abi
                .map(|v| format!(", module ABI {v}"))
                .unwrap_or_default()
        ),
        format!(
            "  backends      {}",
            list_or_none(m.backends.iter().map(ToString::to_string).collect())
        ),
        format!("  entry         {}", m.entry.as_str()),
        format!("  artifacts     {}", m.artifacts.len()),
    ];
    for a in &m.artifacts {
        lines.push(format!(
            "    {}  {} bytes  sha256 {}",
            a.path.as_str(),
            a.size,
            a.sha256
        ));
    }
    lines.extend(provides_and_needs_lines(m));
    lines.push(format!("  signatures    {}", metadata.signatures().len()));
    for s in metadata.signatures() {
        lines.push(format!(
            "    key {} {} (not checked)",
            s.key_id, s.algorithm
        ));
    }
    lines
}

/// `inspect`'s lines for what the package provides (operations, runners), what it needs
/// (package and, when there are any, module dependencies), and the records `guild check` uses
/// when it names any.
fn provides_and_needs_lines(m: &Manifest) -> Vec<String> {
    let mut lines = vec![
        format!(
            "  provided ops  {}",
            list_or_none(m.provided_ops.iter().map(ToString::to_string).collect())
        ),
        format!(
            "  runners       {}",
            list_or_none(m.provided_runners.iter().map(ToString::to_string).collect())
        ),
        format!(
            "  dependencies  {}",
            list_or_none(
                m.dependencies
                    .iter()
                    .map(|d| format!("{} {}", d.package_id, d.range))
                    .collect()
            )
        ),
    ];
    if !m.module_dependencies.is_empty() {
        lines.push(format!(
            "  module deps   {}",
            list_or_none(
                m.module_dependencies
                    .iter()
                    .map(module_dependency)
                    .collect()
            )
        ));
    }
    if !m.check_params.is_empty() {
        lines.push(format!(
            "  check params  {}",
            list_or_none(
                m.check_params
                    .iter()
                    .map(|(op, record)| format!("{op}={record}"))
                    .collect()
            )
        ));
    }
    lines
}

/// A module dependency as `inspect` shows it: id, range and ABI tag, then the publisher and
/// the pinned digest when it names them.
fn module_dependency(d: &ModuleDependency) -> String {
    let mut s = format!("{} {} ({})", d.module_id, d.range, d.abi_tag);
    if let Some(p) = &d.publisher_id {
        s.push_str(&format!(" publisher {p}"));
    }
    if let Some(pin) = &d.sha256 {
        s.push_str(&format!(" pinned {}", short(pin)));
    }
    s
}

/// The items joined with commas, or `(none)`.
fn list_or_none(items: Vec<String>) -> String {
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items.join(", ")
    }
}

pub(crate) fn parse_metadata(package: &Path, bytes: &[u8]) -> Result<Metadata, HostError> {
    Metadata::parse(bytes).map_err(|errors| HostError::Manifest {
        location: package.to_path_buf(),
        errors,
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A private scratch directory under the system temporary directory (`$TMPDIR`), removed with
/// everything in it when dropped, whether the command succeeded or not.
pub(crate) struct ScratchDir(PathBuf);

impl ScratchDir {
    fn create() -> anyhow::Result<Self> {
        Self::create_named("verify")
    }

    /// A scratch directory whose name says which command made it (`guild-NAME-PID-N`).
    pub(crate) fn create_named(name: &str) -> anyhow::Result<Self> {
        let base = std::env::temp_dir();
        for attempt in 0..100u32 {
            let dir = base.join(format!("guild-{name}-{}-{attempt}", std::process::id()));
            let mut builder = fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            match builder.create(&dir) {
                Ok(()) => return Ok(ScratchDir(dir)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!(
                        "cannot create a scratch directory in {}",
                        base.display()
                    )))
                }
            }
        }
        Err(CliError::new(
            Exit::Failure,
            format!(
                "cannot create a scratch directory in {}: every name is taken",
                base.display()
            ),
        )
        .into())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Extracted files are read-only but their directories are writable by their owner, so
        // they can be removed; a failure here is reported rather than silently leaving files.
        if let Err(e) = fs::remove_dir_all(&self.0) {
            if e.kind() != io::ErrorKind::NotFound {
                eprintln!(
                    "warning: could not remove scratch directory {}: {e}",
                    self.0.display()
                );
            }
        }
    }
}
