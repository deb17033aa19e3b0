//! The artifact registry port: pushing a package archive to an OCI registry and pulling one
//! back into a local file.
//!
//! The registry is an untrusted transport. An adapter checks what the transport can check (the
//! layer's digest and size against the manifest, media types, size limits on what it buffers)
//! and nothing more: the file it writes is then authenticated like any other package file.

use std::error::Error;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use guild_domain::distribution::{ArtifactConfig, OciReference, OciRepository};
use guild_domain::ids::Sha256Digest;
use thiserror::Error;

use crate::source::Progress;

/// A package to push: the archive file and what its artifact says about it.
#[derive(Debug, Clone, Copy)]
pub struct PushRequest<'a> {
    /// The `.gkernel` / `.gkmodule` archive.
    pub archive: &'a Path,
    /// The config blob's contents (and the layer's media type, from its kind).
    pub config: &'a ArtifactConfig,
    /// Manifest annotations, `org.opencontainers.image.*` and the like.
    pub annotations: &'a [(String, String)],
}

/// What a push stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The manifest's digest: `REPOSITORY@sha256:…` names this artifact for good.
    pub manifest_digest: Sha256Digest,
    /// The layer (archive) digest and size.
    pub layer_digest: Sha256Digest,
    pub layer_size: u64,
}

/// What a pull wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The digest of the manifest the reference resolved to.
    pub manifest_digest: Sha256Digest,
    /// The layer's digest and size, checked against the manifest.
    pub layer_digest: Sha256Digest,
    pub layer_size: u64,
    /// The artifact's config (unauthenticated: the package itself is the authority).
    pub config: ArtifactConfig,
}

/// Pushes and pulls package artifacts.
pub trait ArtifactRegistry: Send + Sync + fmt::Debug {
    /// Uploads the archive and its config, then the manifest under `reference`'s tag (or
    /// checks that it has `reference`'s digest).
    fn push(
        &self,
        reference: &OciReference,
        request: PushRequest<'_>,
        progress: Option<&dyn Progress>,
    ) -> Result<Pushed, DistributionError>;

    /// Resolves `reference` to one manifest and writes its package layer to `out` (created;
    /// removed again on failure), checking its size and digest against the manifest. The file
    /// is not synced to disk: a caller that keeps it does that.
    fn pull(
        &self,
        reference: &OciReference,
        out: &Path,
        progress: Option<&dyn Progress>,
    ) -> Result<Pulled, DistributionError>;

    /// Every tag of `repository`, as the registry lists them (page after page), each a valid
    /// tag and none twice. What a tag points at is not looked at; the caller pulls the one it
    /// picks, by the digest that pull answers.
    fn list_tags(&self, repository: &OciRepository) -> Result<Vec<String>, DistributionError>;
}

/// What a document pull read: the document's bytes, whole, and where they came from. Nothing
/// about them is checked beyond the manifest's word (media type, size, digest): the caller
/// parses and verifies the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledDocument {
    /// The layer's media type: which of the accepted ones the artifact has.
    pub media_type: String,
    /// The digest of the manifest the reference resolved to.
    pub manifest_digest: Sha256Digest,
    /// The layer's digest, checked against the manifest.
    pub layer_digest: Sha256Digest,
    /// The document (the layer), at most the adapter's document limit long.
    pub bytes: Vec<u8>,
}

/// Pushes and pulls one small document (a fleet root or policy) as an OCI artifact: an image
/// manifest with `artifactType` the document's media type, the empty config, and one layer of
/// that media type holding the document.
pub trait DocumentRegistry: Send + Sync + fmt::Debug {
    /// Uploads `document` as the layer of an artifact of `media_type`, then its manifest under
    /// `reference`'s tag (or checks that it has `reference`'s digest).
    fn push_document(
        &self,
        reference: &OciReference,
        media_type: &str,
        document: &[u8],
    ) -> Result<Pushed, DistributionError>;

    /// Resolves `reference` to one manifest that has one layer of one of the `accepted` media
    /// types, within the document size limit (both checked before the layer is fetched), and
    /// reads that layer, checking its size and digest against the manifest.
    fn pull_document(
        &self,
        reference: &OciReference,
        accepted: &[&str],
    ) -> Result<PulledDocument, DistributionError>;

    /// The digest of the manifest `reference` resolves to, checked as [`Self::pull_document`]
    /// checks it, without fetching the layer: one request where nothing changed since a pull
    /// that answered that digest. The default pulls the whole document.
    fn resolve_document(
        &self,
        reference: &OciReference,
        accepted: &[&str],
    ) -> Result<Sha256Digest, DistributionError> {
        self.pull_document(reference, accepted)
            .map(|d| d.manifest_digest)
    }
}

/// A failed push or pull: what failed, and the reference it was for.
#[derive(Debug, Error)]
#[error("{reference}: {kind}")]
pub struct DistributionError {
    /// What went wrong.
    pub kind: DistributionErrorKind,
    /// The reference being pushed or pulled (`oci://…`).
    pub reference: String,
    /// The underlying error (HTTP, TLS, IO), when there is one.
    #[source]
    pub source: Option<Box<dyn Error + Send + Sync>>,
}

impl DistributionError {
    /// An error of `kind` about `reference`.
    pub fn new(kind: DistributionErrorKind, reference: &OciReference) -> Self {
        DistributionError {
            kind,
            reference: reference.to_string(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }
}

/// What was being fetched when a limit or a check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Manifest,
    Config,
    Layer,
    /// The layer of a document artifact (a fleet root or policy).
    Document,
    /// A repository's tag list.
    Tags,
}

impl Part {
    /// What names the digest this part must have: the reference for a manifest pulled by
    /// digest, the manifest for its config and layer.
    fn named_by(self) -> &'static str {
        match self {
            Part::Manifest => "the reference names",
            Part::Config | Part::Layer | Part::Document => "the manifest names",
            Part::Tags => "the request names",
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Manifest => "manifest",
            Part::Config => "config",
            Part::Layer => "package layer",
            Part::Document => "document",
            Part::Tags => "tag list",
        })
    }
}

/// The kinds of [`DistributionError`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DistributionErrorKind {
    /// The registry is not loopback and not listed as insecure, and plain HTTP was asked for
    /// (or TLS could not be set up).
    #[error("{reason}")]
    Insecure { reason: String },
    /// The credentials were refused, or none were found and the registry wants some.
    #[error("the registry refused the credentials for {registry} (HTTP {status})")]
    Unauthorized { registry: String, status: u16 },
    /// The repository, tag, digest or blob does not exist.
    #[error("not found in the registry")]
    NotFound,
    /// The registry redirected too many times (a loop).
    #[error("the registry redirected too many times (a redirect loop)")]
    RedirectLoop,
    /// The reference resolved to an image index, not a manifest.
    #[error("the reference names an image index, not a package manifest")]
    IndexNotManifest,
    /// A media type is not the one a package artifact has.
    #[error("the {part} has media type {found:?}, expected {expected}")]
    WrongMediaType {
        part: Part,
        found: String,
        expected: String,
    },
    /// A part is larger than this host accepts.
    #[error("the {part} is {size} bytes, over the limit of {limit}")]
    TooLarge { part: Part, size: u64, limit: u64 },
    /// The bytes received do not have the digest the manifest (or reference) names.
    #[error("the {part}'s digest is sha256:{actual}, {} sha256:{expected}", part.named_by())]
    DigestMismatch {
        part: Part,
        expected: String,
        actual: String,
    },
    /// The stream ended before the size the manifest names.
    #[error("the {part} stream ended after {received} of {expected} bytes")]
    Truncated {
        part: Part,
        received: u64,
        expected: u64,
    },
    /// The manifest or config is not what a package artifact has.
    #[error("malformed {part}: {reason}")]
    Malformed { part: Part, reason: String },
    /// The registry answered with an error status.
    #[error("the registry answered HTTP {status}: {message}")]
    Registry { status: u16, message: String },
    /// The connection or the HTTP exchange failed.
    #[error("cannot reach the registry: {reason}")]
    Transport { reason: String },
    /// No connection could be made: refused, the name did not resolve, or connecting timed
    /// out. Nothing was exchanged, so trying again later may succeed.
    #[error("the registry is unreachable: {reason}")]
    Unreachable { reason: String },
    /// An answer is larger than this host reads of it; reading stopped at the limit.
    #[error("the {what} at {url} is larger than {limit} bytes")]
    ResponseTooLarge {
        what: &'static str,
        url: String,
        limit: u64,
    },
    /// A download did not finish within its overall deadline.
    #[error("the {what} at {url} did not arrive within the deadline of {} s", limit.as_secs_f64())]
    DeadlineExceeded {
        what: &'static str,
        url: String,
        limit: Duration,
    },
    /// A download stalled: fewer bytes than the minimum arrived in a window of time.
    #[error(
        "the {what} at {url} stalled: fewer than {min_bytes} bytes arrived in {} s",
        window.as_secs_f64()
    )]
    Stalled {
        what: &'static str,
        url: String,
        min_bytes: u64,
        window: Duration,
    },
    /// A setting (an environment variable) has a value this adapter cannot use.
    #[error("{variable} is {value:?}: {reason}")]
    BadSetting {
        variable: &'static str,
        value: String,
        reason: &'static str,
    },
    /// Reading the archive or writing the output failed.
    #[error("could not {action} {path}")]
    Io { action: &'static str, path: String },
}
