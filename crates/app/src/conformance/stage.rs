//! Staging a build for the check: a temporary package tree with its `.gkmetadata`, made from a
//! package archive, an unpacked package directory, or a directory of built files and a manifest
//! template (packed unsigned first, exactly as `guild pack` would). Nothing is authenticated.

use std::path::{Path, PathBuf};

use guild_domain::manifest::{ManifestErrors, Metadata};
use guild_ports::source::{Durability, ExtractOptions, PackageSource, SourceError};

use crate::publish::{self, GkpkSource, PublishError, Scratch};

/// Why a build could not be checked at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// Packing the directory with its template failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The package could not be read or extracted.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Its `.gkmetadata` is malformed.
    #[error("{}: {errors}", .path.display())]
    Manifest {
        /// The package.
        path: PathBuf,
        /// Every problem.
        errors: ManifestErrors,
    },
    /// The arguments do not describe a build (a template with an archive, say).
    #[error("{0}")]
    Usage(String),
    /// The check process could not be started.
    #[error("cannot run the check process {}: {reason}", .program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// A staged tree, removed when dropped.
pub(crate) struct Staged {
    _scratch: Scratch,
    /// The package tree: `.gkmetadata` and the artifacts.
    pub dir: PathBuf,
}

pub(crate) fn stage(target: &Path, template: Option<&Path>) -> Result<Staged, StageError> {
    let scratch = Scratch::new(&std::env::temp_dir().join("guild-check"))?;
    let package = match template {
        Some(t) => {
            if !target.is_dir() {
                return Err(StageError::Usage(format!(
                    "{} is not a directory; --manifest goes with a directory of built files \
                     (an archive carries its own manifest)",
                    target.display()
                )));
            }
            let archive = scratch.path().join("unsigned.gkpk");
            publish::pack(target, t, &archive, None)?;
            archive
        }
        None => target.to_path_buf(),
    };
    let source = GkpkSource::new(ExtractOptions {
        durability: Durability::NoFsync,
        ..Default::default()
    });
    let opened = source.open(&package)?;
    let metadata =
        Metadata::parse(opened.metadata_bytes()).map_err(|errors| StageError::Manifest {
            path: package.clone(),
            errors,
        })?;
    let dir = scratch.path().join("tree");
    opened.extract_to(metadata.manifest(), &dir)?;
    Ok(Staged {
        _scratch: scratch,
        dir,
    })
}
