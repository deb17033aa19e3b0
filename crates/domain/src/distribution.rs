//! Distribution through OCI registries, as plain data: `oci://` references, the media types a
//! package artifact carries, the small config that describes it, and lock files (what a store
//! must hold, and the check of a store against one).
//!
//! A registry is an untrusted transport. Nothing here trusts what it says: the artifact config
//! is a hint for people and tools, and every package pulled is authenticated like a file on disk.
//! A lock pins payload digests, so that a registry that moves a tag cannot change what a locked
//! store installs.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

use crate::ids::{PackageId, PackageKind, PublisherId, Sha256Digest};
use crate::json::{self, Value};
use crate::version::Version;

/// The `artifactType` of a package's manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.guild.package.v1";
/// The media type of the artifact config blob.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.guild.package.config.v1+json";
/// The media type of an OCI image manifest, the only manifest a package is pulled from.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The media type of an OCI image index, which is refused where a manifest is expected.
pub const OCI_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// The layer media type of a package of this kind: the archive itself, uncompressed.
pub fn layer_media_type(kind: PackageKind) -> &'static str {
    match kind {
        PackageKind::Kernel => "application/vnd.guild.gkernel.v1.tar",
        PackageKind::Module => "application/vnd.guild.gkmodule.v1.tar",
    }
}

/// The package kind whose layer has this media type.
pub fn kind_of_layer(media_type: &str) -> Option<PackageKind> {
    [PackageKind::Kernel, PackageKind::Module]
        .into_iter()
        .find(|k| layer_media_type(*k) == media_type)
}

/// What a tag or digest names in a repository.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OciTarget {
    /// A tag, which the registry may move.
    Tag(String),
    /// A manifest digest (`sha256:`), which names one manifest for good.
    Digest(Sha256Digest),
}

/// `oci://HOST[:PORT]/REPOSITORY(:TAG|@sha256:DIGEST)`, validated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OciReference {
    registry: String,
    repository: String,
    target: OciTarget,
}

/// Why a text is not an `oci://` reference.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{text:?} is not an oci:// reference: {reason}")]
pub struct ReferenceError {
    /// The text given (possibly shortened).
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl OciReference {
    /// Parses `oci://HOST[:PORT]/REPOSITORY(:TAG|@sha256:DIGEST)`. A reference names a tag or a
    /// digest, never both, and there is no default tag: a fleet's references say what they mean.
    pub fn parse(text: &str) -> Result<Self, ReferenceError> {
        let fail = |reason| reference_error(text, reason);
        let (registry, path) =
            split_oci(text, "it names no repository (oci://HOST/REPOSITORY:TAG)")?;
        let (repository, target) = if let Some((repo, digest)) = path.split_once('@') {
            let hex = digest
                .strip_prefix("sha256:")
                .ok_or_else(|| fail("a digest must be sha256:<64 hex digits>"))?;
            let digest = Sha256Digest::parse_hex(hex)
                .map_err(|_| fail("a digest must be sha256:<64 hex digits>"))?;
            (repo, OciTarget::Digest(digest))
        } else {
            // The tag follows the last ':' after the last '/', so that HOST:PORT is never a tag.
            let last = path.rsplit('/').next().unwrap_or(path);
            let Some(colon) = last.rfind(':') else {
                return Err(fail("it names neither a :TAG nor an @sha256:DIGEST"));
            };
            let split = path.len() - last.len() + colon;
            let tag = &path[split + 1..];
            if !is_valid_tag(tag) {
                return Err(fail(
                    "a tag is 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'",
                ));
            }
            (&path[..split], OciTarget::Tag(tag.to_owned()))
        };
        if !valid_repository(repository) {
            return Err(fail(REPOSITORY_RULE));
        }
        Ok(OciReference {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            target,
        })
    }

    /// `HOST[:PORT]`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The host without its port (and without brackets for IPv6).
    pub fn host(&self) -> &str {
        let r = self.registry.as_str();
        if let Some(inner) = r.strip_prefix('[') {
            return inner.split(']').next().unwrap_or(inner);
        }
        r.split(':').next().unwrap_or(r)
    }

    /// The repository path.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag or digest.
    pub fn target(&self) -> &OciTarget {
        &self.target
    }

    /// The same repository at a manifest digest.
    pub fn at_digest(&self, digest: Sha256Digest) -> Self {
        OciReference {
            target: OciTarget::Digest(digest),
            ..self.clone()
        }
    }

    /// Whether the host is a loopback name or address, the only hosts reached over plain HTTP
    /// without being listed as insecure.
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        host == "localhost"
            || host == "::1"
            || host.strip_prefix("127.").is_some_and(|rest| {
                let parts: Vec<&str> = rest.split('.').collect();
                parts.len() == 3 && parts.iter().all(|p| p.parse::<u8>().is_ok())
            })
    }

    /// The reference as the distribution client spells it: `HOST/REPO:TAG` or
    /// `HOST/REPO@sha256:HEX`.
    pub fn to_distribution_string(&self) -> String {
        match &self.target {
            OciTarget::Tag(t) => format!("{}/{}:{t}", self.registry, self.repository),
            OciTarget::Digest(d) => {
                format!(
                    "{}/{}@sha256:{}",
                    self.registry,
                    self.repository,
                    d.to_hex()
                )
            }
        }
    }
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}", self.to_distribution_string())
    }
}

/// `oci://HOST[:PORT]/REPOSITORY`: a repository, without a tag or a digest, validated as
/// [`OciReference`]'s parts are. A fleet's requirements name one, and a resolution picks one of
/// its tags.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OciRepository {
    registry: String,
    repository: String,
}

impl OciRepository {
    /// Parses `oci://HOST[:PORT]/REPOSITORY`; a `:TAG` or an `@sha256:DIGEST` is refused.
    pub fn parse(text: &str) -> Result<Self, ReferenceError> {
        let fail = |reason| reference_error(text, reason);
        let (registry, repository) =
            split_oci(text, "it names no repository (oci://HOST/REPOSITORY)")?;
        if repository.contains('@') {
            return Err(fail(
                "a repository names no @sha256:DIGEST; the resolution pins the digest",
            ));
        }
        if repository.contains(':') {
            return Err(fail(
                "a repository names no :TAG; the resolution picks the tag",
            ));
        }
        if !valid_repository(repository) {
            return Err(fail(REPOSITORY_RULE));
        }
        Ok(OciRepository {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
        })
    }

    /// `HOST[:PORT]`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository path.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The reference to `tag` in this repository; `None` when `tag` is not a valid tag.
    pub fn at_tag(&self, tag: &str) -> Option<OciReference> {
        is_valid_tag(tag).then(|| OciReference {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            target: OciTarget::Tag(tag.to_owned()),
        })
    }

    /// The reference to the manifest `digest` in this repository.
    pub fn at_digest(&self, digest: Sha256Digest) -> OciReference {
        OciReference {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            target: OciTarget::Digest(digest),
        }
    }
}

impl fmt::Display for OciRepository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)
    }
}

impl OciReference {
    /// The repository this reference is in.
    pub fn repository_ref(&self) -> OciRepository {
        OciRepository {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
        }
    }
}

/// Why a repository path is refused.
const REPOSITORY_RULE: &str =
    "a repository is lowercase path components of [a-z0-9] joined by '.', '_', '__' or '-'";

fn reference_error(text: &str, reason: &'static str) -> ReferenceError {
    ReferenceError {
        text: text.chars().take(200).collect(),
        reason,
    }
}

/// `oci://HOST[:PORT]/PATH` split into a valid `HOST[:PORT]` and the path after it;
/// `no_path` is the reason given when there is no path.
fn split_oci<'t>(
    text: &'t str,
    no_path: &'static str,
) -> Result<(&'t str, &'t str), ReferenceError> {
    let rest = text
        .strip_prefix("oci://")
        .ok_or_else(|| reference_error(text, "it must start with oci://"))?;
    let (registry, path) = rest
        .split_once('/')
        .ok_or_else(|| reference_error(text, no_path))?;
    if !valid_registry(registry) {
        return Err(reference_error(
            text,
            "the host must be a DNS name or IP address, with an optional :PORT",
        ));
    }
    Ok((registry, path))
}

fn valid_registry(r: &str) -> bool {
    let (host, port) = if let Some(inner) = r.strip_prefix('[') {
        let Some((addr, after)) = inner.split_once(']') else {
            return false;
        };
        if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return false;
        }
        match after {
            "" => return true,
            p => (addr, p.strip_prefix(':').unwrap_or("x")),
        }
    } else {
        match r.split_once(':') {
            Some((h, p)) => (h, p),
            None => (r, "1"),
        }
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.chars().all(|c| c.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    (host_ok || r.starts_with('[')) && port_ok
}

/// Whether `tag` is an OCI tag: 1 to 128 of `[A-Za-z0-9_.-]`, not starting with `.` or `-`.
pub fn is_valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn valid_repository(repo: &str) -> bool {
    !repo.is_empty()
        && repo.len() <= 255
        && repo.split('/').all(|component| {
            let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
            let bytes = component.as_bytes();
            if component.is_empty()
                || !alnum(bytes[0] as char)
                || !alnum(bytes[bytes.len() - 1] as char)
            {
                return false;
            }
            // Separators: one '.', one or two '_', or any run of '-'.
            let mut run = String::new();
            for c in component.chars() {
                if alnum(c) {
                    if !matches!(run.as_str(), "" | "." | "_" | "__")
                        && !run.chars().all(|r| r == '-')
                    {
                        return false;
                    }
                    run.clear();
                } else if matches!(c, '.' | '_' | '-') {
                    run.push(c);
                } else {
                    return false;
                }
            }
            true
        })
}

/// The artifact config: what a package artifact says about itself. Informative only; the
/// package inside is authenticated on its own, and a pull refuses an artifact whose config
/// disagrees with the layer it describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactConfig {
    pub id: PackageId,
    pub version: Version,
    pub kind: PackageKind,
    pub publisher: PublisherId,
    /// The SHA-256 of the package's canonical payload (as `guild verify` prints it).
    pub payload_sha256: Sha256Digest,
}

/// The config's format marker.
pub const ARTIFACT_CONFIG_FORMAT_V1: &str = "guild-artifact-config-v1";

/// Why a config blob, or a lock file, is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DocumentError {
    /// Not JSON as this host reads it.
    #[error("malformed JSON: {0}")]
    Json(String),
    /// A member is missing or malformed.
    #[error("member {member:?}: {reason}")]
    Member {
        /// The member's path (`packages[2].payload_sha256`).
        member: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The format marker is not one this host reads.
    #[error("format {found:?} is not one this host reads (expected {expected:?})")]
    Format {
        /// The marker found.
        found: String,
        /// The marker this host writes.
        expected: &'static str,
    },
}

fn member_error(member: impl Into<String>, reason: impl Into<String>) -> DocumentError {
    DocumentError::Member {
        member: member.into(),
        reason: reason.into(),
    }
}

/// Reads the members of one object, by name, each exactly once, refusing unknown ones.
struct Members<'a> {
    at: String,
    members: &'a [(String, Value)],
}

impl<'a> Members<'a> {
    fn of(value: &'a Value, at: &str, known: &[&str]) -> Result<Self, DocumentError> {
        let members = value.as_object().ok_or_else(|| {
            member_error(at, format!("is a {}, not an object", value.type_name()))
        })?;
        if let Some((k, _)) = members.iter().find(|(k, _)| !known.contains(&k.as_str())) {
            return Err(member_error(join(at, k), "is not a member this format has"));
        }
        Ok(Members {
            at: at.to_owned(),
            members,
        })
    }

    fn opt(&self, key: &str) -> Option<&'a Value> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn string(&self, key: &str) -> Result<&'a str, DocumentError> {
        self.opt_string(key)?
            .ok_or_else(|| member_error(join(&self.at, key), "is missing"))
    }

    fn opt_string(&self, key: &str) -> Result<Option<&'a str>, DocumentError> {
        match self.opt(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                member_error(
                    join(&self.at, key),
                    format!("is a {}, not a string", v.type_name()),
                )
            }),
        }
    }

    fn parsed<T, E: fmt::Display>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<T, DocumentError> {
        let text = self.string(key)?;
        parse(text).map_err(|e| member_error(join(&self.at, key), e.to_string()))
    }
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

fn parse_kind(s: &str) -> Result<PackageKind, String> {
    PackageKind::parse(s).ok_or_else(|| format!("{s:?} is neither gkernel nor gkmodule"))
}

fn parse_version(s: &str) -> Result<Version, String> {
    Version::parse(s).map_err(|e| format!("{s:?} is not a semantic version: {e}"))
}

fn parse_digest(s: &str) -> Result<Sha256Digest, String> {
    Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
}

fn parse_manifest_digest(s: &str) -> Result<Sha256Digest, String> {
    let hex = s
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("{s:?} is not sha256:<64 hex digits>"))?;
    parse_digest(hex)
}

fn check_format(m: &Members<'_>, key: &str, expected: &'static str) -> Result<(), DocumentError> {
    let found = m.string(key)?;
    if found != expected {
        return Err(DocumentError::Format {
            found: found.chars().take(80).collect(),
            expected,
        });
    }
    Ok(())
}

impl ArtifactConfig {
    /// The config blob: compact JSON, members in a fixed order.
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        let value = Value::Object(vec![
            ("format".into(), ARTIFACT_CONFIG_FORMAT_V1.into()),
            ("id".into(), self.id.as_str().into()),
            ("version".into(), self.version.to_string().into()),
            ("kind".into(), self.kind.as_str().into()),
            ("publisher".into(), self.publisher.as_str().into()),
            ("payload_sha256".into(), self.payload_sha256.to_hex().into()),
        ]);
        // One line; the pretty writer's indentation would only add bytes to the blob.
        for line in value.to_pretty_string().lines() {
            out.push_str(line.trim_start());
        }
        out
    }

    /// Parses a config blob strictly (unknown members are refused).
    pub fn parse(bytes: &[u8]) -> Result<Self, DocumentError> {
        let value = json::parse(bytes).map_err(|e| DocumentError::Json(e.to_string()))?;
        let m = Members::of(
            &value,
            "",
            &[
                "format",
                "id",
                "version",
                "kind",
                "publisher",
                "payload_sha256",
            ],
        )?;
        check_format(&m, "format", ARTIFACT_CONFIG_FORMAT_V1)?;
        Ok(ArtifactConfig {
            id: m.parsed("id", |s| PackageId::new(s))?,
            version: m.parsed("version", parse_version)?,
            kind: m.parsed("kind", parse_kind)?,
            publisher: m.parsed("publisher", |s| PublisherId::new(s))?,
            payload_sha256: m.parsed("payload_sha256", parse_digest)?,
        })
    }
}

/// The lock file format marker this host writes and reads.
pub const LOCK_FORMAT_V1: &str = "guild-lock-v1";

/// Where a locked package came from: the reference it was pulled from (kept as given, tag or
/// digest) and the manifest digest it resolved to. Sync pulls by the digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockedSource {
    pub reference: OciReference,
    pub manifest_digest: Sha256Digest,
}

impl LockedSource {
    /// The reference pinned to the manifest digest.
    pub fn pinned(&self) -> OciReference {
        self.reference.at_digest(self.manifest_digest)
    }
}

/// One enabled package, as a lock records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockedPackage {
    pub id: PackageId,
    pub version: Version,
    pub kind: PackageKind,
    pub payload_sha256: Sha256Digest,
    pub publisher: PublisherId,
    pub key_id: Sha256Digest,
    pub source: Option<LockedSource>,
}

/// A lock: the exact set of enabled packages a store must hold, by payload digest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockFile {
    packages: BTreeMap<PackageId, LockedPackage>,
}

impl LockFile {
    /// A lock of these packages. Two entries for one package id are refused: a store enables
    /// one version of each package.
    pub fn new(packages: impl IntoIterator<Item = LockedPackage>) -> Result<Self, DocumentError> {
        let mut map = BTreeMap::new();
        for (i, p) in packages.into_iter().enumerate() {
            let id = p.id.clone();
            if map.insert(id.clone(), p).is_some() {
                return Err(member_error(
                    format!("packages[{i}].id"),
                    format!("{id} is locked twice"),
                ));
            }
        }
        Ok(LockFile { packages: map })
    }

    /// The locked packages, by id.
    pub fn packages(&self) -> impl ExactSizeIterator<Item = &LockedPackage> {
        self.packages.values()
    }

    /// The entry for `id`.
    pub fn get(&self, id: &PackageId) -> Option<&LockedPackage> {
        self.packages.get(id)
    }

    /// The lock file's text: indented JSON, packages sorted by id, a final newline, so that
    /// the same store always writes the same bytes and a diff shows what changed.
    pub fn to_json(&self) -> String {
        let packages = self
            .packages
            .values()
            .map(|p| {
                let mut members = vec![
                    ("id".into(), p.id.as_str().into()),
                    ("version".into(), p.version.to_string().into()),
                    ("kind".into(), p.kind.as_str().into()),
                    ("payload_sha256".into(), p.payload_sha256.to_hex().into()),
                    ("publisher".into(), p.publisher.as_str().into()),
                    ("key_id".into(), p.key_id.to_hex().into()),
                ];
                if let Some(s) = &p.source {
                    members.push(("reference".into(), s.reference.to_string().into()));
                    members.push((
                        "manifest_digest".into(),
                        format!("sha256:{}", s.manifest_digest.to_hex()).into(),
                    ));
                }
                Value::Object(members)
            })
            .collect();
        Value::Object(vec![
            ("lock_format".into(), LOCK_FORMAT_V1.into()),
            ("packages".into(), Value::Array(packages)),
        ])
        .to_pretty_string()
    }

    /// Parses a lock file strictly: unknown members, duplicate ids and a reference without its
    /// manifest digest (or the reverse) are refused.
    pub fn parse(bytes: &[u8]) -> Result<Self, DocumentError> {
        let value = json::parse(bytes).map_err(|e| DocumentError::Json(e.to_string()))?;
        let top = Members::of(&value, "", &["lock_format", "packages"])?;
        check_format(&top, "lock_format", LOCK_FORMAT_V1)?;
        let list = top
            .opt("packages")
            .ok_or_else(|| member_error("packages", "is missing"))?;
        let list = list.as_array().ok_or_else(|| {
            member_error(
                "packages",
                format!("is a {}, not an array", list.type_name()),
            )
        })?;
        let mut packages = Vec::with_capacity(list.len());
        for (i, entry) in list.iter().enumerate() {
            let at = format!("packages[{i}]");
            let m = Members::of(
                entry,
                &at,
                &[
                    "id",
                    "version",
                    "kind",
                    "payload_sha256",
                    "publisher",
                    "key_id",
                    "reference",
                    "manifest_digest",
                ],
            )?;
            let source = match (m.opt_string("reference")?, m.opt_string("manifest_digest")?) {
                (None, None) => None,
                (Some(_), Some(_)) => Some(LockedSource {
                    reference: m.parsed("reference", OciReference::parse)?,
                    manifest_digest: m.parsed("manifest_digest", parse_manifest_digest)?,
                }),
                (Some(_), None) => {
                    return Err(member_error(join(&at, "manifest_digest"), "is missing"))
                }
                (None, Some(_)) => return Err(member_error(join(&at, "reference"), "is missing")),
            };
            packages.push(LockedPackage {
                id: m.parsed("id", |s| PackageId::new(s))?,
                version: m.parsed("version", parse_version)?,
                kind: m.parsed("kind", parse_kind)?,
                payload_sha256: m.parsed("payload_sha256", parse_digest)?,
                publisher: m.parsed("publisher", |s| PublisherId::new(s))?,
                key_id: m.parsed("key_id", parse_digest)?,
                source,
            });
        }
        LockFile::new(packages)
    }

    /// Whether an enabled package may load under this lock: the lock must name it, at this
    /// version, with this payload digest.
    pub fn admits(
        &self,
        id: &PackageId,
        version: &Version,
        payload: &Sha256Digest,
    ) -> Result<(), LockRefusal> {
        let Some(locked) = self.packages.get(id) else {
            return Err(LockRefusal::NotLocked);
        };
        if &locked.payload_sha256 != payload {
            return Err(LockRefusal::DigestDiffers {
                locked: locked.payload_sha256,
                found: *payload,
            });
        }
        if &locked.version != version {
            return Err(LockRefusal::VersionDiffers {
                locked: locked.version.clone(),
            });
        }
        Ok(())
    }
}

/// Why a lock does not admit an enabled package.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LockRefusal {
    /// The lock does not name the package.
    #[error("the lock does not name this package")]
    NotLocked,
    /// The lock names the package with another payload digest.
    #[error("the lock pins payload {} but this version's payload is {}", locked.to_hex(), found.to_hex())]
    DigestDiffers {
        locked: Sha256Digest,
        found: Sha256Digest,
    },
    /// The lock names another version.
    #[error("the lock pins version {locked}")]
    VersionDiffers { locked: Version },
}

/// What a store holds of one package, for [`plan_sync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldVersion {
    pub id: PackageId,
    pub version: Version,
    pub payload_sha256: Sha256Digest,
    /// Whether its files are present (not removed).
    pub installed: bool,
    /// Whether it is the enabled version.
    pub enabled: bool,
}

/// One step of making a store match a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncStep {
    /// Fetch (when missing) and install this locked package, enabled.
    Install(LockedPackage),
    /// The locked version is installed but not current or not enabled: install it again from
    /// its package, which makes it current and enabled (its files are checked).
    Reactivate(LockedPackage),
    /// Disable this package: the lock does not name it.
    Disable(PackageId),
}

/// Why a store cannot be made to match a lock.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SyncConflict {
    /// The store recorded this version with another payload, and versions are immutable.
    #[error(
        "{id} {version}: the lock pins payload {} but the store recorded this version with \
         payload {}", locked.to_hex(), recorded.to_hex()
    )]
    RecordedWithOtherPayload {
        id: PackageId,
        version: Version,
        locked: Sha256Digest,
        recorded: Sha256Digest,
    },
}

/// The steps that make a store's enabled set equal a lock's, given every version the store
/// records. Disables come first, so that an unlocked package never loads beside a locked one.
pub fn plan_sync(
    lock: &LockFile,
    held: &[HeldVersion],
) -> Result<Vec<SyncStep>, Box<SyncConflict>> {
    let mut disables = Vec::new();
    let mut installs = Vec::new();
    for h in held.iter().filter(|h| h.enabled) {
        // A package locked at another version is replaced by installing the locked one.
        if lock.get(&h.id).is_none() {
            disables.push(SyncStep::Disable(h.id.clone()));
        }
    }
    for locked in lock.packages() {
        let same = held
            .iter()
            .find(|h| h.id == locked.id && h.version == locked.version);
        match same {
            Some(h) if h.payload_sha256 != locked.payload_sha256 => {
                return Err(Box::new(SyncConflict::RecordedWithOtherPayload {
                    id: locked.id.clone(),
                    version: locked.version.clone(),
                    locked: locked.payload_sha256,
                    recorded: h.payload_sha256,
                }));
            }
            Some(h) if h.enabled && h.installed => {}
            Some(h) if h.installed => installs.push(SyncStep::Reactivate(locked.clone())),
            _ => installs.push(SyncStep::Install(locked.clone())),
        }
    }
    disables.extend(installs);
    Ok(disables)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(b: u8) -> Sha256Digest {
        Sha256Digest([b; 32])
    }

    fn locked(id: &str, v: &str, d: u8) -> LockedPackage {
        LockedPackage {
            id: PackageId::new(id).unwrap(),
            version: Version::parse(v).unwrap(),
            kind: PackageKind::Module,
            payload_sha256: digest(d),
            publisher: PublisherId::new("org.example").unwrap(),
            key_id: digest(9),
            source: None,
        }
    }

    #[test]
    fn references_parse_tags_digests_and_ports() {
        let r = OciReference::parse("oci://127.0.0.1:5000/guild/scan:1.0.0").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.host(), "127.0.0.1");
        assert_eq!(r.repository(), "guild/scan");
        assert_eq!(r.target(), &OciTarget::Tag("1.0.0".into()));
        assert!(r.is_loopback());
        assert_eq!(r.to_string(), "oci://127.0.0.1:5000/guild/scan:1.0.0");
        let hex = "ab".repeat(32);
        let d =
            OciReference::parse(&format!("oci://registry.example.com/a/b-c@sha256:{hex}")).unwrap();
        assert_eq!(d.target(), &OciTarget::Digest(digest(0xab)));
        assert!(!d.is_loopback());
        for name in ["127.evil.example.com", "127.0.0.1.example", "127.0.0.256"] {
            let r = OciReference::parse(&format!("oci://{name}/r:t")).unwrap();
            assert!(!r.is_loopback(), "{name}");
        }
        assert!(OciReference::parse("oci://127.1.2.3/r:t")
            .unwrap()
            .is_loopback());
        assert_eq!(
            d.to_distribution_string(),
            format!("registry.example.com/a/b-c@sha256:{hex}")
        );
        assert_eq!(
            OciReference::parse("oci://[::1]:5000/x:y").unwrap().host(),
            "::1"
        );
    }

    #[test]
    fn malformed_references_are_refused_with_the_reason() {
        for (bad, says) in [
            ("docker://h/r:t", "oci://"),
            ("oci://h", "no repository"),
            ("oci://h:99999/r:t", "host"),
            ("oci://h/r", "neither"),
            ("oci://h/R:t", "lowercase"),
            ("oci://h/r:", "tag"),
            ("oci://h/r:-t", "tag"),
            ("oci://h/r@sha256:12", "digest"),
            ("oci://h/r@md5:12", "digest"),
            ("oci://h/a//b:t", "lowercase"),
            ("oci://h/a..b:t", "lowercase"),
            ("oci://bad_host/r:t", "host"),
        ] {
            let err = OciReference::parse(bad).unwrap_err();
            assert!(err.reason.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn configs_round_trip_and_refuse_unknown_members() {
        let c = ArtifactConfig {
            id: PackageId::new("example.scan").unwrap(),
            version: Version::parse("1.2.3").unwrap(),
            kind: PackageKind::Kernel,
            publisher: PublisherId::new("org.example").unwrap(),
            payload_sha256: digest(3),
        };
        let text = c.to_json();
        assert!(!text.contains('\n'));
        assert_eq!(ArtifactConfig::parse(text.as_bytes()).unwrap(), c);
        let extra = text.replacen('{', "{\"x\":\"y\",", 1);
        assert!(matches!(
            ArtifactConfig::parse(extra.as_bytes()),
            Err(DocumentError::Member { .. })
        ));
        assert_eq!(
            kind_of_layer(layer_media_type(PackageKind::Kernel)),
            Some(PackageKind::Kernel)
        );
        assert_eq!(kind_of_layer("application/octet-stream"), None);
    }

    #[test]
    fn locks_round_trip_byte_for_byte() {
        let mut a = locked("example.scan", "1.0.0", 1);
        a.source = Some(LockedSource {
            reference: OciReference::parse("oci://localhost:5000/scan:1.0.0").unwrap(),
            manifest_digest: digest(7),
        });
        let lock = LockFile::new([locked("example.b", "2.0.0", 2), a]).unwrap();
        let text = lock.to_json();
        let back = LockFile::parse(text.as_bytes()).unwrap();
        assert_eq!(back, lock);
        assert_eq!(back.to_json(), text);
        // Sorted by id whatever the order given.
        assert!(text.find("example.b").unwrap() < text.find("example.scan").unwrap());
    }

    #[test]
    fn malformed_locks_name_the_member() {
        let good = LockFile::new([locked("example.a", "1.0.0", 1)])
            .unwrap()
            .to_json();
        for (edit, says) in [
            (good.replace("guild-lock-v1", "guild-lock-v9"), "format"),
            (good.replace("\"1.0.0\"", "\"one\""), "packages[0].version"),
            (
                good.replace(&digest(1).to_hex(), "zz"),
                "packages[0].payload_sha256",
            ),
            (
                good.replace("\"kind\"", "\"reference\": \"oci://h/r:t\", \"kind\""),
                "packages[0].manifest_digest",
            ),
            (
                good.replace("\"kind\"", "\"colour\": \"red\", \"kind\""),
                "packages[0].colour",
            ),
        ] {
            let err = LockFile::parse(edit.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(says), "{says}: {err}");
        }
        let twice = LockFile::new([
            locked("example.a", "1.0.0", 1),
            locked("example.a", "2.0.0", 2),
        ]);
        assert!(twice.unwrap_err().to_string().contains("locked twice"));
    }

    #[test]
    fn a_lock_admits_only_what_it_names_with_its_digest() {
        let lock = LockFile::new([locked("example.a", "1.0.0", 1)]).unwrap();
        let id = PackageId::new("example.a").unwrap();
        let v1 = Version::parse("1.0.0").unwrap();
        assert_eq!(lock.admits(&id, &v1, &digest(1)), Ok(()));
        assert!(matches!(
            lock.admits(&id, &v1, &digest(2)),
            Err(LockRefusal::DigestDiffers { .. })
        ));
        assert!(matches!(
            lock.admits(&id, &Version::parse("1.0.1").unwrap(), &digest(1)),
            Err(LockRefusal::VersionDiffers { .. })
        ));
        assert_eq!(
            lock.admits(&PackageId::new("example.b").unwrap(), &v1, &digest(1)),
            Err(LockRefusal::NotLocked)
        );
    }

    fn held(id: &str, v: &str, d: u8, installed: bool, enabled: bool) -> HeldVersion {
        HeldVersion {
            id: PackageId::new(id).unwrap(),
            version: Version::parse(v).unwrap(),
            payload_sha256: digest(d),
            installed,
            enabled,
        }
    }

    #[test]
    fn sync_disables_first_then_installs_what_is_missing() {
        let lock = LockFile::new([
            locked("example.a", "1.0.0", 1),
            locked("example.b", "2.0.0", 2),
            locked("example.c", "1.0.0", 3),
        ])
        .unwrap();
        let store = [
            held("example.a", "1.0.0", 1, true, true), // matches: nothing to do
            held("example.b", "1.0.0", 8, true, true), // older version enabled
            held("example.c", "1.0.0", 3, true, false), // installed, disabled
            held("example.x", "1.0.0", 5, true, true), // not locked
        ];
        let steps = plan_sync(&lock, &store).unwrap();
        assert_eq!(
            steps,
            vec![
                SyncStep::Disable(PackageId::new("example.x").unwrap()),
                SyncStep::Install(locked("example.b", "2.0.0", 2)),
                SyncStep::Reactivate(locked("example.c", "1.0.0", 3)),
            ]
        );
        assert_eq!(plan_sync(&lock, &store[..1]).unwrap().len(), 2);
        let clash = [held("example.a", "1.0.0", 4, true, false)];
        assert!(matches!(
            plan_sync(&lock, &clash).map_err(|e| *e),
            Err(SyncConflict::RecordedWithOtherPayload { .. })
        ));
    }
}
