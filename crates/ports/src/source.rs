//! The package source port: where a package's bytes come from, read in two steps so that the
//! manifest can be authenticated before a single artifact reaches the disk.
//!
//! [`PackageSource::open`] reads only the `.gkmetadata` member and returns an [`OpenedPackage`].
//! The app parses and authenticates those bytes; only then does it call
//! [`OpenedPackage::extract_to`] with the manifest it trusts, and the source writes the artifacts
//! into a fresh staging directory, checking every one against that manifest as it goes. A source
//! never writes anything outside the staging directory, and leaves nothing behind when it fails.

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use guild_domain::ids::Sha256Digest;
use guild_domain::manifest::{Artifact, Manifest, MAX_METADATA_BYTES};
use guild_domain::path::PathRule;

/// Opens packages (archives or directories) and reads their manifest bytes.
#[cfg_attr(feature = "mocks", mockall::automock)]
pub trait PackageSource: Send + Sync {
    /// Opens the package at `location` and reads its `.gkmetadata` bytes, which must be the first
    /// member of an archive or sit at the root of a directory. Nothing is written.
    fn open(&self, location: &Path) -> Result<Box<dyn OpenedPackage>, SourceError>;
}

/// A package whose metadata has been read and whose artifacts have not been touched yet.
pub trait OpenedPackage: Send + fmt::Debug {
    /// The exact `.gkmetadata` bytes, for the app to parse and authenticate.
    fn metadata_bytes(&self) -> &[u8];

    /// Writes the package into `staging`, which must not exist yet and is created exclusively.
    ///
    /// Every file must be an artifact of `manifest` with the size and SHA-256 it declares, hashed
    /// from the bytes actually written, and every artifact must be present. The staging root also
    /// receives `.gkmetadata` (the bytes of [`OpenedPackage::metadata_bytes`]), so that it is a
    /// complete package directory. Files end read-only (`0o444`) and directories `0o755`.
    ///
    /// On any error, `staging` and everything under it are removed, except that a `staging`
    /// that already existed is refused ([`SourceErrorKind::StagingExists`]) and left as it was.
    /// Nothing is ever written outside it.
    fn extract_to(
        self: Box<Self>,
        manifest: &Manifest,
        staging: &Path,
    ) -> Result<ExtractedPackage, SourceError>;

    /// Checks the package against `manifest` under exactly the rules of
    /// [`OpenedPackage::extract_to`], writing nothing, and returns the artifacts found (sorted by
    /// path). This is how an installed tree, which holds its own `.gkmetadata`, is verified
    /// again later.
    fn verify_in_place(self: Box<Self>, manifest: &Manifest) -> Result<Vec<Artifact>, SourceError>;

    /// Reports the artifact bytes that the following [`OpenedPackage::extract_to`] or
    /// [`OpenedPackage::verify_in_place`] reads to `progress`. A source that cannot report
    /// ignores it; nothing else changes.
    fn watch(&mut self, progress: Arc<dyn Progress>) {
        drop(progress);
    }
}

/// Receives how far a long package operation has come, for a progress display. Calls come from
/// the thread doing the work and must return quickly.
pub trait Progress: Send + Sync + fmt::Debug {
    /// Work on `label` begins; `total_bytes` of artifact data are to be read.
    fn begin(&self, label: &str, total_bytes: u64);
    /// Another `bytes` of artifact data were read and hashed.
    fn advance(&self, bytes: u64);
    /// The work ended (finished or failed).
    fn finish(&self);
}

/// What [`OpenedPackage::extract_to`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractedPackage {
    /// The staging directory, now holding the package tree.
    pub root: PathBuf,
    /// Every artifact written, sorted by path, with the size and digest of the bytes written
    /// (equal to the manifest's, or extraction would have failed).
    pub files: Vec<Artifact>,
}

/// Caps on what one package may make a source read and write. The defaults suit kernel packages
/// and stop an archive from filling the disk or exhausting memory before it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Most entries a package may have: every path of its tree counts once (`.gkmetadata`,
    /// each file, each directory, whether an archive member names it or a file's path only
    /// implies it), in an archive and in a directory alike.
    pub max_entries: u64,
    /// Largest single file, in bytes.
    pub max_file_bytes: u64,
    /// Largest sum of all file sizes, in bytes.
    pub max_total_bytes: u64,
    /// Largest `.gkmetadata`, in bytes.
    pub max_metadata_bytes: u64,
}

impl ExtractLimits {
    /// 4096 entries.
    pub const DEFAULT_MAX_ENTRIES: u64 = 4096;
    /// 1 GiB per file.
    pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;
    /// 4 GiB in all.
    pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 4 << 30;
}

impl Default for ExtractLimits {
    fn default() -> Self {
        ExtractLimits {
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_file_bytes: Self::DEFAULT_MAX_FILE_BYTES,
            max_total_bytes: Self::DEFAULT_MAX_TOTAL_BYTES,
            // The manifest parser refuses anything larger, so reading more would be wasted.
            max_metadata_bytes: MAX_METADATA_BYTES as u64,
        }
    }
}

/// Whether extraction flushes what it writes to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every file is fsynced after it is written, and every directory created (the staging
    /// directory and its parent included) once its entries exist. The store relies on this so
    /// that a rename of the staging tree after a crash never exposes missing contents.
    #[default]
    Fsync,
    /// Nothing is fsynced; for tests and benchmarks, never for an install.
    NoFsync,
}

/// How a source reads and writes packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtractOptions {
    /// Size and count caps.
    pub limits: ExtractLimits,
    /// Whether writes are fsynced.
    pub durability: Durability,
}

/// Why a package could not be opened or extracted.
#[derive(Debug)]
pub struct SourceError {
    /// What went wrong.
    pub kind: SourceErrorKind,
    /// The package (archive file or directory) being read.
    pub location: PathBuf,
    /// The member concerned, as named in the package (possibly shortened), when there is one.
    pub member: Option<String>,
    /// The underlying error, such as an IO error.
    pub source: Option<Box<dyn Error + Send + Sync>>,
}

impl SourceError {
    /// An error of `kind` about the package at `location`.
    pub fn new(kind: SourceErrorKind, location: impl Into<PathBuf>) -> Self {
        SourceError {
            kind,
            location: location.into(),
            member: None,
            source: None,
        }
    }

    /// Names the member concerned.
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "package {}", self.location.display())?;
        if let Some(member) = &self.member {
            write!(f, ", member {member:?}")?;
        }
        // The source is reachable through `Error::source`, not repeated here, so that error
        // chains print each cause once.
        write!(f, ": {}", self.kind)
    }
}

impl Error for SourceError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// The class of a [`SourceError`]. Each refusal has its own kind so that callers and tests can
/// tell them apart without reading messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceErrorKind {
    /// The location does not exist.
    #[error("not found")]
    NotFound,
    /// The location is neither a regular file (an archive) nor a directory.
    #[error("is neither an archive file nor a directory")]
    NotAPackage,
    /// Reading or writing failed; `action` says what was being done.
    #[error("could not {action}")]
    Io {
        /// What was being done ("read", "create", ...).
        action: &'static str,
    },
    /// The archive ends in the middle of a header, a member's data, or before its end marker.
    #[error("archive is truncated")]
    Truncated,
    /// A header that is not a well-formed ustar header, or bytes where none may be.
    #[error("malformed archive header: {reason}")]
    MalformedHeader {
        /// What is wrong with it.
        reason: String,
    },
    /// A header whose checksum does not match its bytes.
    #[error("header checksum is {stored} but the header sums to {computed}")]
    HeaderChecksum {
        /// The checksum the header records.
        stored: u64,
        /// The sum of its bytes.
        computed: u64,
    },
    /// A tar extension this reader does not honour (GNU long names, PAX global headers, PAX
    /// records other than the path and ignored timestamps and owners).
    #[error("unsupported archive extension: {what}")]
    UnsupportedExtension {
        /// Which extension.
        what: String,
    },
    /// No `.gkmetadata` in the package: a directory without one at its root, or an archive
    /// with no member at all.
    #[error("has no .gkmetadata")]
    MetadataMissing,
    /// The first member of the archive (the one the error names) is not `.gkmetadata`. The
    /// reader looks no further, so whether a `.gkmetadata` follows is not known: nothing past
    /// the first member is read before the package is authenticated.
    #[error("the first member must be .gkmetadata")]
    MetadataNotFirst,
    /// A second member named `.gkmetadata` (in any case) at the package root.
    #[error("a second .gkmetadata")]
    MetadataDuplicated,
    /// `.gkmetadata` is a directory or some other non-file.
    #[error(".gkmetadata is not a regular file")]
    MetadataNotAFile,
    /// `.gkmetadata` is larger than the limit.
    #[error(".gkmetadata is {size} bytes; the limit is {limit}")]
    MetadataTooLarge {
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// A member name that is not a valid artifact path.
    #[error("unsafe path: {rule}")]
    UnsafePath {
        /// The path rule it breaks.
        rule: PathRule,
    },
    /// A symbolic link.
    #[error("symbolic links are not allowed")]
    Symlink,
    /// A hard link.
    #[error("hard links are not allowed")]
    HardLink,
    /// A character or block device.
    #[error("device files are not allowed")]
    Device,
    /// A named pipe.
    #[error("FIFOs are not allowed")]
    Fifo,
    /// A socket (directory sources only).
    #[error("sockets are not allowed")]
    Socket,
    /// A GNU sparse file.
    #[error("sparse files are not allowed")]
    Sparse,
    /// A tar entry type other than a regular file or directory, not covered above.
    #[error("entry type {type_flag:?} is not allowed")]
    UnsupportedEntryType {
        /// The tar header's type flag.
        type_flag: char,
    },
    /// The same path twice.
    #[error("duplicate entry")]
    DuplicateEntry,
    /// A path equal to an earlier one once ASCII case is folded.
    #[error("collides with {other:?} on a case-insensitive file system")]
    CaseCollision {
        /// The earlier path it collides with.
        other: String,
    },
    /// A path that needs a directory where a file is, or a file where a directory is.
    #[error("conflicts with {other:?}: one is a file and the other a directory")]
    PathConflict {
        /// The path it conflicts with.
        other: String,
    },
    /// More members than the limit.
    #[error("more than {limit} entries")]
    TooManyEntries {
        /// The most entries allowed.
        limit: u64,
    },
    /// A file larger than the per-file limit, as declared before any byte is read.
    #[error("file is {size} bytes; the limit is {limit}")]
    FileTooLarge {
        /// Its declared size in bytes.
        size: u64,
        /// The per-file limit in bytes.
        limit: u64,
    },
    /// The declared sizes add up to more than the total limit.
    #[error("files add up to at least {total} bytes; the limit is {limit}")]
    TotalTooLarge {
        /// The declared bytes so far.
        total: u64,
        /// The total limit in bytes.
        limit: u64,
    },
    /// A file the manifest does not list.
    #[error("file is not listed in the manifest")]
    UnlistedFile,
    /// A directory that no listed artifact's path goes through. Only signed paths may land in
    /// an installed tree, so a directory member is admitted only where an artifact implies it.
    #[error("directory is not on the path of any artifact listed in the manifest")]
    UnlistedDirectory,
    /// An artifact the manifest lists that the package lacks.
    #[error("artifact listed in the manifest is missing")]
    MissingArtifact,
    /// A file whose size differs from the manifest's.
    #[error("size is {actual} bytes but the manifest says {expected}")]
    SizeMismatch {
        /// The manifest's size.
        expected: u64,
        /// The size found.
        actual: u64,
    },
    /// A file whose SHA-256 differs from the manifest's. The digests are boxed to keep every
    /// `Result<_, SourceError>` small.
    #[error("SHA-256 is {actual} but the manifest says {expected}")]
    DigestMismatch {
        /// The manifest's digest.
        expected: Box<Sha256Digest>,
        /// The digest of the bytes found.
        actual: Box<Sha256Digest>,
    },
    /// A file of a directory source changed while it was being read.
    #[error("changed while it was being read")]
    ChangedWhileReading,
    /// The staging directory already exists.
    #[error("staging directory {} already exists", path.display())]
    StagingExists {
        /// The staging directory.
        path: PathBuf,
    },
    /// The staging directory would be inside the directory being read.
    #[error("staging directory {} is inside the package directory", path.display())]
    StagingInsideSource {
        /// The staging directory.
        path: PathBuf,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_says_what_and_where() {
        let e = SourceError::new(
            SourceErrorKind::UnsafePath {
                rule: PathRule::DotDotComponent,
            },
            "/tmp/p.gkernel",
        )
        .with_member("../x");
        assert_eq!(
            e.to_string(),
            r#"package /tmp/p.gkernel, member "../x": unsafe path: has a '..' component"#
        );
        let io = SourceError::new(SourceErrorKind::Io { action: "read" }, "/p")
            .with_source(std::io::Error::other("disk on fire"));
        assert_eq!(io.to_string(), "package /p: could not read");
        assert_eq!(Error::source(&io).unwrap().to_string(), "disk on fire");
    }

    #[test]
    fn default_limits_are_the_documented_ones() {
        let l = ExtractLimits::default();
        assert_eq!(l.max_entries, 4096);
        assert_eq!(l.max_file_bytes, 1 << 30);
        assert_eq!(l.max_total_bytes, 4 << 30);
        assert_eq!(l.max_metadata_bytes, 1 << 20);
        assert_eq!(ExtractOptions::default().durability, Durability::Fsync);
    }

    #[test]
    fn ports_are_object_safe() {
        fn takes(_: Option<&dyn PackageSource>, _: Option<Box<dyn OpenedPackage>>) {}
        takes(None, None);
    }
}
