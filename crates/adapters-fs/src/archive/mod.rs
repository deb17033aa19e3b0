//! GKPK v1 packages: `.gkernel` / `.gkmodule` tar archives and plain directories, read through
//! one hardened extraction path, and the archive writer the `pack` command uses.
//!
//! [`GkpkSource`] implements the [`PackageSource`] port for both kinds of location, told apart by
//! file type. Each kind only produces a stream of members (name, kind, declared size, data); the
//! single `extract` module decides what is admitted and writes it. In short:
//!
//! - Only regular files and directories. Symbolic and hard links, devices, FIFOs, sockets, GNU
//!   sparse files and unknown tar types are refused, as are GNU long names and PAX global headers.
//!   A per-member PAX header is honoured for its `path` record only (timestamps and owners in it
//!   are ignored like their ustar fields; any other record is refused), and that path goes
//!   through the same validation as any other name.
//! - Every name becomes an [`ArtifactPath`](guild_domain::path::ArtifactPath) before anything
//!   else, and a name that is not one is refused, never skipped or re-rooted.
//! - `.gkmetadata` is the first member of an archive, and [`PackageSource::open`] reads nothing
//!   past it: before authentication, every byte read is bounded by that member's header (at
//!   most one PAX header, then at most `max_metadata_bytes`), whatever other members declare.
//! - No duplicate or case-colliding entries, and no file where a directory is needed or the
//!   reverse.
//! - Directory members only where a listed artifact's path implies them; any other is refused,
//!   so nothing unsigned, not even an empty directory, lands in an installed tree.
//! - Caps on entries, per-file and total sizes, counted from declared sizes before any data is
//!   read; reads are bounded by the declared size as well. Archives and directories count
//!   entries by one rule (every path of the tree, implied directories included), so a tree
//!   extracted from an accepted archive is accepted again when it is verified in place.
//! - Files are created with `create_new` under directories this code created inside a staging
//!   directory it created; modes from the package are ignored: files end `0o444`, directories
//!   `0o755` (so setuid, setgid and sticky bits are normalised away, not refused; the store then
//!   seals an installed tree's directories `0o555`).
//! - Each artifact is hashed from the bytes written and checked against the manifest's size and
//!   SHA-256; every listed artifact must be present, and an unlisted file is refused.
//! - The staging root also receives `.gkmetadata`, so an extracted tree is itself a directory
//!   package; `verify_in_place` checks one (or an archive) under the same rules, writing nothing.
//!
//! The top-level location is the caller's choice and is followed if it is a symbolic link;
//! nothing inside a directory source ever is. A directory source is assumed not to be modified
//! by others while it is read: a file swapped or resized meanwhile is detected and refused, but
//! a file swapped for a FIFO between examination and opening could block the read.

mod dir;
mod entry;
mod extract;
mod ustar;
mod write;

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use guild_domain::manifest::{Artifact, Manifest};
use guild_ports::source::{
    ExtractOptions, ExtractedPackage, OpenedPackage, PackageSource, Progress, SourceError,
    SourceErrorKind,
};

pub use write::{scan_artifacts, write_gkpk, PackError, MAX_MEMBER_BYTES};

use entry::{Ctx, MemberStream};

/// Reads GKPK v1 packages from tar archives and directories.
#[derive(Debug, Clone, Default)]
pub struct GkpkSource {
    options: ExtractOptions,
}

impl GkpkSource {
    /// A source with the given limits and durability.
    pub fn new(options: ExtractOptions) -> Self {
        GkpkSource { options }
    }

    /// The options this source applies.
    pub fn options(&self) -> &ExtractOptions {
        &self.options
    }
}

impl PackageSource for GkpkSource {
    fn open(&self, location: &Path) -> Result<Box<dyn OpenedPackage>, SourceError> {
        let ctx = Ctx::new(location);
        let limits = self.options.limits;
        let metadata = fs::metadata(location).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ctx.err(SourceErrorKind::NotFound).with_source(e),
            _ => ctx.io("examine the package", e),
        })?;
        if metadata.is_dir() {
            let bytes = dir::read_metadata(location, &ctx, limits.max_metadata_bytes)?;
            let stream = dir::DirStream::new(location, location, limits.max_entries);
            return Ok(Box::new(Opened {
                metadata: bytes,
                stream: Box::new(stream),
                options: self.options,
                source_dir: Some(location.to_path_buf()),
                progress: None,
            }));
        }
        if !metadata.is_file() {
            return Err(ctx.err(SourceErrorKind::NotAPackage));
        }
        let file = File::open(location).map_err(|e| ctx.io("open the archive", e))?;
        let mut stream = ustar::TarStream::new(file, location);
        let bytes = ustar::read_metadata(&mut stream, limits.max_metadata_bytes)?;
        Ok(Box::new(Opened {
            metadata: bytes,
            stream: Box::new(stream),
            options: self.options,
            source_dir: None,
            progress: None,
        }))
    }
}

/// A package whose `.gkmetadata` has been read.
struct Opened {
    metadata: Vec<u8>,
    stream: Box<dyn MemberStream>,
    options: ExtractOptions,
    /// The directory being read, for a directory source.
    source_dir: Option<PathBuf>,
    /// Where the artifact bytes read are reported, when someone watches.
    progress: Option<Arc<dyn Progress>>,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("location", &self.stream.location())
            .field("metadata_len", &self.metadata.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl OpenedPackage for Opened {
    fn metadata_bytes(&self) -> &[u8] {
        &self.metadata
    }

    fn extract_to(
        mut self: Box<Self>,
        manifest: &Manifest,
        staging: &Path,
    ) -> Result<ExtractedPackage, SourceError> {
        if let Some(source) = &self.source_dir {
            refuse_staging_inside(source, staging)?;
        }
        extract::extract(
            &mut *self.stream,
            &self.metadata,
            manifest,
            staging,
            &self.options,
            self.progress.as_deref(),
        )
    }

    fn verify_in_place(
        mut self: Box<Self>,
        manifest: &Manifest,
    ) -> Result<Vec<Artifact>, SourceError> {
        extract::verify(
            &mut *self.stream,
            manifest,
            self.options.limits,
            self.progress.as_deref(),
        )
    }

    fn watch(&mut self, progress: Arc<dyn Progress>) {
        self.progress = Some(progress);
    }
}

/// A staging directory inside a directory source would be walked while it is being filled.
fn refuse_staging_inside(source: &Path, staging: &Path) -> Result<(), SourceError> {
    let ctx = Ctx::new(source);
    let canonical = |p: &Path| {
        fs::canonicalize(p).map_err(|e| {
            ctx.io("resolve a path", e)
                .with_member(p.display().to_string())
        })
    };
    let source = canonical(source)?;
    let parent = match staging.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let parent = canonical(parent)?;
    if parent.starts_with(&source) {
        return Err(ctx.err(SourceErrorKind::StagingInsideSource {
            path: staging.to_path_buf(),
        }));
    }
    Ok(())
}
