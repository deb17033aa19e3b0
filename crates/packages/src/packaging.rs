//! The publisher's side: packing a built plugin into a GKPK archive and signing it.
//!
//! A package is made from a directory of built files and a manifest template (every payload field
//! except `artifacts`, which is computed from the directory: each file's path, size and SHA-256).
//! Signing adds an ECDSA P-256 signature over the canonical payload; the archive is rewritten
//! with the new `.gkmetadata` and the same artifacts.

use std::path::{Path, PathBuf};

use guild_adapters_fs::archive::{scan_artifacts, write_gkpk};
use guild_domain::ids::Sha256Digest;
use guild_domain::json::{self, Value};
use guild_domain::manifest::{
    Manifest, ManifestErrors, Metadata, SignatureAlgorithm, SignatureEntry,
};
use guild_ports::source::{Durability, ExtractOptions, PackageSource, SourceError};

/// The publisher's key material and archives, re-exported so that tools built on the host (the
/// `guild` command line) reach them without naming an adapter: P-256 keys and their PEM files,
/// the verifier, and the GKPK reader.
pub use guild_adapters_crypto::files as key_files;
pub use guild_adapters_crypto::{
    sign_document, KeyError, KeyFileError, P256Verifier, PublicKey, SigningKey,
};
pub use guild_adapters_fs::archive::{GkpkSource, PackError};

/// Why packing or signing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The manifest template is not strict JSON.
    #[error("manifest template {}: {source}", .path.display())]
    TemplateJson {
        /// The template file.
        path: PathBuf,
        /// Where and how the JSON is malformed.
        #[source]
        source: json::JsonError,
    },
    /// The template is JSON but not a payload template (not an object, or it lists
    /// `artifacts`, which packing computes).
    #[error("manifest template {}: {problem}", .path.display())]
    Template {
        /// The template file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The manifest made from the template and the files breaks the manifest rules.
    #[error("manifest template {}: {errors}", .path.display())]
    Manifest {
        /// The template file.
        path: PathBuf,
        /// Every problem, each with its JSON path.
        errors: ManifestErrors,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The source directory or the package to sign could not be read as a package.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Writing the archive failed.
    #[error(transparent)]
    Pack(#[from] PackError),
    /// The key could not sign.
    #[error("signing failed: {0}")]
    Sign(#[from] guild_adapters_crypto::KeyError),
    /// The package already carries a signature by this key; nothing was written.
    #[error("{}: already signed by key {key_id}", .path.display())]
    AlreadySigned {
        /// The package.
        path: PathBuf,
        /// The signing key's id.
        key_id: Sha256Digest,
    },
}

/// What `pack` or `sign` wrote.
#[derive(Debug, Clone)]
pub struct Packed {
    /// The archive written.
    pub archive: PathBuf,
    /// Its `.gkmetadata`: the manifest and every signature it now carries.
    pub metadata: Metadata,
}

/// Builds the manifest from `template` (a JSON payload without `artifacts`) and the files under
/// `source_dir`, and writes the archive to `out`, signed by `key` when one is given.
pub fn pack(
    source_dir: &Path,
    template_path: &Path,
    out: &Path,
    key: Option<&SigningKey>,
) -> Result<Packed, PublishError> {
    let bytes = std::fs::read(template_path).map_err(|source| PublishError::Read {
        path: template_path.to_path_buf(),
        source,
    })?;
    let template = json::parse(&bytes).map_err(|source| PublishError::TemplateJson {
        path: template_path.to_path_buf(),
        source,
    })?;
    let Value::Object(mut members) = template else {
        return Err(PublishError::Template {
            path: template_path.to_path_buf(),
            problem: "expected a JSON object with the payload fields".into(),
        });
    };
    if members.iter().any(|(k, _)| k == "artifacts") {
        return Err(PublishError::Template {
            path: template_path.to_path_buf(),
            problem:
                "\"artifacts\" is computed from the source directory; remove it from the template"
                    .into(),
        });
    }
    let artifacts = scan_artifacts(source_dir)?;
    let listed = artifacts
        .iter()
        .map(|a| {
            Value::Object(vec![
                ("path".into(), a.path.as_str().into()),
                ("size".into(), a.size.into()),
                ("sha256".into(), a.sha256.to_hex().into()),
            ])
        })
        .collect();
    members.push(("artifacts".into(), Value::Array(listed)));
    let manifest = Manifest::from_payload_value(&Value::Object(members)).map_err(|errors| {
        PublishError::Manifest {
            path: template_path.to_path_buf(),
            errors,
        }
    })?;
    let metadata =
        Metadata::new(manifest, Vec::new()).map_err(|errors| PublishError::Manifest {
            path: template_path.to_path_buf(),
            errors,
        })?;
    let metadata = match key {
        Some(key) => add_signature(metadata, key, out)?,
        None => metadata,
    };
    let files: Vec<_> = metadata
        .manifest()
        .artifacts
        .iter()
        .map(|a| (a.path.clone(), source_dir.join(a.path.as_str())))
        .collect();
    write_gkpk(out, metadata.to_pretty_json().as_bytes(), &files)?;
    Ok(Packed {
        archive: out.to_path_buf(),
        metadata,
    })
}

/// Adds a signature by `key` to the package at `archive` and writes the result to `out` (which
/// may be the same path: the archive is replaced atomically). The payload is unchanged, so its
/// digest and every dependent's pin stay valid.
pub fn sign(archive: &Path, key: &SigningKey, out: &Path) -> Result<Packed, PublishError> {
    let source = GkpkSource::new(ExtractOptions {
        durability: Durability::NoFsync,
        ..Default::default()
    });
    let opened = source.open(archive)?;
    let metadata =
        Metadata::parse(opened.metadata_bytes()).map_err(|errors| PublishError::Manifest {
            path: archive.to_path_buf(),
            errors,
        })?;
    // Refused before anything is extracted; the signature itself is made after the check of
    // every artifact.
    check_not_signed_by(&metadata, key, archive)?;
    // Removed on every path out, failures included.
    let scratch = Scratch::new(out)?;
    let tree = scratch.path().join("tree");
    opened.extract_to(metadata.manifest(), &tree)?;
    let metadata = add_signature(metadata, key, archive)?;
    let files: Vec<_> = metadata
        .manifest()
        .artifacts
        .iter()
        .map(|a| (a.path.clone(), tree.join(a.path.as_str())))
        .collect();
    write_gkpk(out, metadata.to_pretty_json().as_bytes(), &files)?;
    drop(scratch);
    Ok(Packed {
        archive: out.to_path_buf(),
        metadata,
    })
}

/// A scratch directory that is removed when it goes out of scope (with the read-only files that
/// extraction leaves in it).
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory beside `near`.
    pub(crate) fn new(near: &Path) -> Result<Self, PublishError> {
        Ok(Scratch(tempfile_dir(near)?))
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        remove_scratch(&self.0);
    }
}

/// Refuses a package that `key` has already signed.
fn check_not_signed_by(
    metadata: &Metadata,
    key: &SigningKey,
    path: &Path,
) -> Result<(), PublishError> {
    let key_id = key.key_id();
    if metadata.signatures().iter().any(|s| s.key_id == key_id) {
        return Err(PublishError::AlreadySigned {
            path: path.to_path_buf(),
            key_id,
        });
    }
    Ok(())
}

fn add_signature(
    metadata: Metadata,
    key: &SigningKey,
    path: &Path,
) -> Result<Metadata, PublishError> {
    check_not_signed_by(&metadata, key, path)?;
    let key_id = key.key_id();
    let signature = key.sign(metadata.canonical_payload())?;
    let mut signatures = metadata.signatures().to_vec();
    signatures.push(SignatureEntry {
        key_id,
        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
        signature,
    });
    metadata
        .with_signatures(signatures)
        .map_err(|errors| PublishError::Manifest {
            path: path.to_path_buf(),
            errors,
        })
}

/// A fresh scratch directory beside `near`, so that extraction and the final rename stay on one
/// file system.
fn tempfile_dir(near: &Path) -> Result<PathBuf, PublishError> {
    let parent = near
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    for attempt in 0..100u32 {
        let dir = parent.join(format!(".guild-sign-{}-{attempt}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(PublishError::Read { path: dir, source }),
        }
    }
    Err(PublishError::Template {
        path: near.to_path_buf(),
        problem: "cannot create a scratch directory beside the output".into(),
    })
}

/// Removes a scratch tree, including the read-only files extraction leaves.
pub fn remove_scratch(dir: &Path) {
    fn make_writable(path: &Path) {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.is_dir() {
                let mut perms = meta.permissions();
                #[allow(clippy::permissions_set_readonly_false)]
                perms.set_readonly(false);
                let _ = std::fs::set_permissions(path, perms);
                if let Ok(entries) = std::fs::read_dir(path) {
                    for entry in entries.flatten() {
                        make_writable(&entry.path());
                    }
                }
            }
        }
    }
    make_writable(dir);
    let _ = std::fs::remove_dir_all(dir);
}
