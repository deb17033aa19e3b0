//! The `.gkmetadata` v1 manifest: its typed model, strict reading, semantic checks, and writing.
//!
//! A `.gkmetadata` file is an envelope `{"gkmetadata": 1, "payload": {...}, "signatures": [...]}`.
//! Signatures cover the canonical bytes of the payload exactly as received, and the [`Manifest`]
//! is built from that same payload, so nothing the host acts on escapes the signature. That only
//! holds if nothing is dropped on the way, hence the policy here: unknown fields are refused at
//! every level (a host that cannot honour a signed field must not ignore it), `null` is refused,
//! and so are duplicate keys. Reading reports every problem it finds, each with its JSON path, so
//! that a publisher can fix a manifest in one pass; past [`MAX_REPORTED_PROBLEMS`] it only counts
//! them, so that a hostile manifest cannot make the report (built before any signature is
//! checked) large.
//!
//! Writing goes the other way for the packer: [`Manifest::to_payload_value`] leaves out opt-in
//! fields that are absent or empty, so a manifest that uses none of the newer fields has the same
//! canonical bytes, and so the same signature and digest pin, as it had before they existed.

use std::collections::BTreeMap;
use std::fmt;

use crate::canonical::canonicalize;
use crate::dependency::{Dependency, ModuleDependency, MODULE_ABI_TAG_V1};
use crate::ids::{
    DigestParseError, IdError, ImplId, OpName, PackageId, PackageKind, PublisherId, RunnerId,
    Sha256Digest,
};
use crate::json::{self, Integer, JsonErrorKind, JsonPath, PathSegment, Value};
use crate::params::{ParamSpec, ParamsError};
use crate::path::{ArtifactPath, PathRule};
use crate::version::{AbiRange, PackedVersion, Version, VersionError, VersionRange};

/// Largest `.gkmetadata` file (or bare payload) accepted, in bytes.
pub const MAX_METADATA_BYTES: usize = 1 << 20;

/// The envelope format version this host reads and writes (`"gkmetadata": 1`).
pub const METADATA_FORMAT_V1: u32 = 1;

/// How many problems a [`ManifestErrors`] keeps; the rest are only counted. A hostile manifest
/// can hold about a million (1 MiB of empty objects, three missing fields each), and listing
/// them all would cost hundreds of megabytes before any signature is looked at; the first ones
/// already say what is wrong.
pub const MAX_REPORTED_PROBLEMS: usize = 50;

/// How many characters of a rejected string an error keeps, so that a hostile manifest cannot
/// make its own error report huge.
const ERROR_TEXT_CHARS: usize = 80;

const ENVELOPE_FIELDS: &[&str] = &["gkmetadata", "payload", "signatures"];
const PAYLOAD_FIELDS: &[&str] = &[
    "package_id",
    "kind",
    "version",
    "publisher_id",
    "kernel_abi",
    "module_abi",
    "os",
    "arch",
    "backends",
    "entry",
    "artifacts",
    "provided_ops",
    "provided_runners",
    "dependencies",
    "module_dependencies",
    "check_params",
];
const ABI_RANGE_FIELDS: &[&str] = &["min", "max"];
const ARTIFACT_FIELDS: &[&str] = &["path", "size", "sha256"];
const DEPENDENCY_FIELDS: &[&str] = &["package_id", "min_version", "max_version"];
const MODULE_DEPENDENCY_FIELDS: &[&str] = &[
    "module_id",
    "min_version",
    "max_version",
    "abi_tag",
    "publisher_id",
    "sha256",
];
const SIGNATURE_FIELDS: &[&str] = &["key_id", "algorithm", "signature"];
const KIND_SPELLINGS: &[&str] = &["gkernel", "gkmodule"];

/// Declares an enum whose variants have one fixed manifest spelling each.
macro_rules! spelled_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every manifest spelling, in declaration order.
            pub const SPELLINGS: &'static [&'static str] = &[$($text),+];

            /// The manifest spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// Parses the manifest spelling; any other text, including other cases, is `None`.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

spelled_enum!(
    /// The operating system a package is built for.
    Os {
        /// `linux`
        Linux = "linux",
        /// `windows`
        Windows = "windows",
        /// `macos`
        Macos = "macos",
    }
);

spelled_enum!(
    /// The CPU architecture a package is built for.
    Arch {
        /// `x86_64`
        X86_64 = "x86_64",
        /// `aarch64`
        Aarch64 = "aarch64",
    }
);

spelled_enum!(
    /// A compute backend a package provides implementations for.
    Backend {
        /// `cpu`, `GUILD_BACKEND_CPU`
        Cpu = "cpu",
        /// `cuda`, `GUILD_BACKEND_CUDA`
        Cuda = "cuda",
        /// `hip`, `GUILD_BACKEND_HIP`
        Hip = "hip",
    }
);

impl Backend {
    /// The backend's bit as the C headers define it (`GUILD_BACKEND_*`).
    pub fn bit(self) -> u32 {
        match self {
            Backend::Cpu => 1 << 0,
            Backend::Cuda => 1 << 1,
            Backend::Hip => 1 << 2,
        }
    }
}

spelled_enum!(
    /// A signature algorithm. Only one exists in format version 1.
    SignatureAlgorithm {
        /// `ecdsa-p256-sha256`: ECDSA over P-256 with SHA-256, DER-encoded signature.
        EcdsaP256Sha256 = "ecdsa-p256-sha256",
    }
);

/// One file of a package, as the manifest pins it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Artifact {
    /// Where the file lives, relative to the package root.
    pub path: ArtifactPath,
    /// Its exact size in bytes.
    pub size: u64,
    /// SHA-256 of its contents.
    pub sha256: Sha256Digest,
}

/// The typed content of a manifest payload.
///
/// The fields are plain data so that the packer can fill them in; [`Manifest::check`] applies the
/// rules that span fields (the entry is an artifact, lists hold no duplicates, `module_abi`
/// matches the kind, ...), and every manifest that reading returns has passed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The package's id, shared by all its versions.
    pub package_id: PackageId,
    /// Kernel plugin or runtime module.
    pub kind: PackageKind,
    /// The package version.
    pub version: Version,
    /// Who publishes (and signs) the package.
    pub publisher_id: PublisherId,
    /// Kernel ABI versions the package works with, inclusive.
    pub kernel_abi: AbiRange,
    /// The module ABI a `gkmodule` implements; always `None` for a `gkernel`.
    pub module_abi: Option<u32>,
    /// Target operating system.
    pub os: Os,
    /// Target CPU architecture.
    pub arch: Arch,
    /// Non-empty, without duplicates, in manifest order.
    pub backends: Vec<Backend>,
    /// The library the host loads; one of the artifact paths.
    pub entry: ArtifactPath,
    /// Non-empty; paths unique, also ignoring ASCII case.
    pub artifacts: Vec<Artifact>,
    /// Implementation ids the package registers, unique; may be empty.
    pub provided_ops: Vec<ImplId>,
    /// Runner ids the package registers, unique; opt-in (omitted from the payload when empty).
    pub provided_runners: Vec<RunnerId>,
    /// Ordinary dependencies; opt-in.
    pub dependencies: Vec<Dependency>,
    /// Module dependency records; opt-in.
    pub module_dependencies: Vec<ModuleDependency>,
    /// The parameter record `guild check` passes an operation (by operation name) when the
    /// command line gives none, in the `--params` typed notation; opt-in. Signed like every
    /// field, but only the check reads it: a host never passes it to a provider.
    pub check_params: BTreeMap<OpName, ParamSpec>,
}

/// A signature over the canonical payload bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SignatureEntry {
    /// SHA-256 of the signer's public key in SPKI DER form.
    pub key_id: Sha256Digest,
    /// How the signature was made.
    pub algorithm: SignatureAlgorithm,
    /// The signature itself (DER-encoded ECDSA), decoded from hex.
    pub signature: Vec<u8>,
}

/// What is wrong with one field of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldErrorKind {
    /// The input exceeds [`MAX_METADATA_BYTES`].
    #[error("input is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// The input's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The input is not strict JSON (see [`JsonErrorKind`]).
    #[error("{kind} (byte {offset})")]
    Json {
        /// What is wrong.
        kind: JsonErrorKind,
        /// The byte offset where reading stopped.
        offset: usize,
    },
    /// A required field is absent.
    #[error("required field is missing")]
    Missing,
    /// A field the format does not define.
    #[error("unknown field; it cannot be honoured, so it is refused rather than ignored")]
    UnknownField,
    /// A value of the wrong JSON type.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The JSON type the field needs.
        expected: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
    /// A `gkmetadata` format version other than [`METADATA_FORMAT_V1`].
    #[error(
        "format version {found} is not supported; this host reads version {METADATA_FORMAT_V1}"
    )]
    UnsupportedFormatVersion {
        /// The version found.
        found: Integer,
    },
    /// A package, publisher, implementation or runner id that breaks the id grammar.
    #[error(transparent)]
    InvalidId(IdError),
    /// A string outside a fixed set of spellings (kind, OS, arch, backend, algorithm).
    #[error("{found:?} is not one of {expected:?}")]
    UnknownValue {
        /// The text found.
        found: String,
        /// The spellings allowed.
        expected: &'static [&'static str],
    },
    /// A semantic version that does not parse, or is not in the form it is written back in.
    #[error("{text:?} is not a semantic version: {reason}")]
    InvalidVersion {
        /// The text found.
        text: String,
        /// Why it is not a version.
        reason: String,
    },
    /// A Kernel ABI version that is not `MAJOR.MINOR.PATCH` within the 8/12/12 packing.
    #[error(transparent)]
    InvalidAbiVersion(VersionError),
    /// A version range whose lower bound is above its upper bound.
    #[error("range {min}..={max} is empty: its lower bound is above its upper bound")]
    EmptyRange {
        /// The lower bound.
        min: String,
        /// The upper bound.
        max: String,
    },
    /// An integer outside the range its field allows.
    #[error("integer {found} is outside {min}..={max}")]
    IntegerOutOfRange {
        /// The integer found.
        found: Integer,
        /// The smallest allowed.
        min: u64,
        /// The largest allowed.
        max: u64,
    },
    /// An artifact or entry path that is not a valid [`ArtifactPath`].
    #[error("artifact path {0}")]
    InvalidPath(PathRule),
    /// A SHA-256 digest that is not 64 lowercase hex digits.
    #[error(transparent)]
    InvalidDigest(DigestParseError),
    /// A signature that is not non-empty, even-length lowercase hex.
    #[error("expected non-empty lowercase hex of even length")]
    InvalidHex,
    /// A list that must have at least one element is empty.
    #[error("array must not be empty")]
    EmptyArray,
    /// A string that must not be empty is.
    #[error("string must not be empty")]
    EmptyString,
    /// An element equal to an earlier one in a list that must be unique.
    #[error("duplicates element {first_index}")]
    Duplicate {
        /// The index of the earlier, equal element.
        first_index: usize,
    },
    /// An artifact path equal to an earlier one once ASCII case is folded.
    #[error("collides with {other:?} (element {first_index}) on a case-insensitive file system")]
    PathCollision {
        /// The index of the earlier path.
        first_index: usize,
        /// The earlier path.
        other: String,
    },
    /// The entry library is not one of the artifacts.
    #[error("entry {entry:?} is not one of the artifacts")]
    EntryNotAnArtifact {
        /// The entry path.
        entry: String,
    },
    /// A `gkmodule` without `module_abi`.
    #[error("module_abi is required for a gkmodule")]
    ModuleAbiRequired,
    /// A `gkernel` with `module_abi`.
    #[error("module_abi is not allowed for a gkernel")]
    ModuleAbiForbidden,
    /// A `check_params` record that is not in the typed notation (`TYPE:VALUE,...`).
    #[error("not a parameter record: {0}")]
    InvalidCheckParams(ParamsError),
    /// A `gkmodule` module dependency whose `abi_tag` is not `guild.module.v1`.
    #[error(
        "a gkmodule's module dependencies must use abi_tag {MODULE_ABI_TAG_V1:?}, found {found:?}"
    )]
    NonRuntimeModuleDependency {
        /// The tag found.
        found: String,
    },
}

/// One problem, located by JSON path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {kind}")]
pub struct FieldError {
    /// Where the problem is, such as `$.payload.artifacts[2].sha256`.
    pub path: JsonPath,
    /// What the problem is.
    pub kind: FieldErrorKind,
}

/// The problems found in a manifest, in a stable order (envelope, then payload fields in schema
/// order): the first [`MAX_REPORTED_PROBLEMS`] of them, and how many more there were. Never
/// empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestErrors {
    /// The first problems found: at least one, at most [`MAX_REPORTED_PROBLEMS`].
    pub errors: Vec<FieldError>,
    /// How many problems were found beyond those in `errors`.
    pub omitted: usize,
}

impl ManifestErrors {
    /// Every problem found, kept or not.
    pub fn total(&self) -> usize {
        self.errors.len().saturating_add(self.omitted)
    }
}

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.total();
        write!(
            f,
            "invalid manifest ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        if self.omitted > 0 {
            write!(f, "\n  and {} more", self.omitted)?;
        }
        Ok(())
    }
}

impl std::error::Error for ManifestErrors {}

impl ManifestErrors {
    fn single(path: JsonPath, kind: FieldErrorKind) -> Self {
        ManifestErrors {
            errors: vec![FieldError { path, kind }],
            omitted: 0,
        }
    }
}

/// A parsed or assembled `.gkmetadata` document.
///
/// It keeps the payload [`Value`] that the manifest was read from, and the canonical bytes and
/// digest are computed from that value, so signature checks and digest pins see exactly what the
/// manifest was built from. The parts are reachable only through accessors so that they cannot
/// drift apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    manifest: Manifest,
    payload: Value,
    canonical_payload: Vec<u8>,
    payload_digest: Sha256Digest,
    signatures: Vec<SignatureEntry>,
}

impl Metadata {
    /// Reads a `.gkmetadata` file: size cap, strict JSON, the envelope, the payload and the
    /// signatures, reporting every problem found. An empty signature list is accepted here; the
    /// trust decision refuses it later.
    ///
    /// A payload may spell an opt-in list as `[]`; it is accepted, and the canonical bytes keep it
    /// (they are of the payload as received), while [`Manifest::canonical_payload`] would omit it.
    /// Use [`Metadata::canonical_payload`] and [`Metadata::payload_digest`] for verification.
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestErrors> {
        let root = parse_json(bytes)?;
        let at = At::ROOT;
        let mut p = Problems::default();
        let Some(members) = object(&root, &at, ENVELOPE_FIELDS, &mut p) else {
            return Err(p.into_errors());
        };
        let format = required(members, &at, "gkmetadata", &mut p, format_version);
        let manifest = required(members, &at, "payload", &mut p, read_payload);
        let signatures = required(members, &at, "signatures", &mut p, signature_list);
        let (Some(()), Some(manifest), Some(signatures), true) =
            (format, manifest, signatures, p.is_empty())
        else {
            return Err(p.into_errors());
        };
        let payload = match root {
            Value::Object(members) => members
                .into_iter()
                .find(|(k, _)| k == "payload")
                .map(|(_, v)| v),
            _ => None,
        };
        let Some(payload) = payload else {
            return Err(ManifestErrors::single(
                at.key("payload").path(),
                FieldErrorKind::Missing,
            ));
        };
        Ok(Metadata::assemble(manifest, payload, signatures))
    }

    /// Builds the metadata for `manifest`, as the packer does: the manifest is checked, and the
    /// payload is the one [`Manifest::to_payload_value`] writes.
    pub fn new(
        manifest: Manifest,
        signatures: Vec<SignatureEntry>,
    ) -> Result<Self, ManifestErrors> {
        let mut p = Problems::default();
        manifest.check_into(&At::ROOT.key("payload"), &mut p);
        check_signatures(&signatures, &mut p);
        p.into_result()?;
        let payload = manifest.to_payload_value();
        Ok(Metadata::assemble(manifest, payload, signatures))
    }

    /// Replaces the signatures, keeping the payload. The packer signs
    /// [`Metadata::canonical_payload`] of an unsigned metadata and attaches the result here.
    pub fn with_signatures(self, signatures: Vec<SignatureEntry>) -> Result<Self, ManifestErrors> {
        let mut p = Problems::default();
        check_signatures(&signatures, &mut p);
        p.into_result()?;
        Ok(Metadata { signatures, ..self })
    }

    fn assemble(manifest: Manifest, payload: Value, signatures: Vec<SignatureEntry>) -> Self {
        let canonical_payload = canonicalize(&payload);
        let payload_digest = Sha256Digest::of(&canonical_payload);
        Metadata {
            manifest,
            payload,
            canonical_payload,
            payload_digest,
            signatures,
        }
    }

    /// The typed manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Consumes the metadata, keeping the manifest.
    pub fn into_manifest(self) -> Manifest {
        self.manifest
    }

    /// The payload value the manifest was built from.
    pub fn payload(&self) -> &Value {
        &self.payload
    }

    /// The canonical bytes of the payload: what signatures cover.
    pub fn canonical_payload(&self) -> &[u8] {
        &self.canonical_payload
    }

    /// SHA-256 of [`Metadata::canonical_payload`]: what a dependency's `sha256` pin names.
    pub fn payload_digest(&self) -> Sha256Digest {
        self.payload_digest
    }

    /// The signatures, in file order.
    pub fn signatures(&self) -> &[SignatureEntry] {
        &self.signatures
    }

    /// The whole document as a value: envelope, payload, signatures.
    pub fn to_value(&self) -> Value {
        let signatures = self
            .signatures
            .iter()
            .map(|s| {
                obj(vec![
                    ("key_id", s.key_id.to_hex().into()),
                    ("algorithm", s.algorithm.as_str().into()),
                    ("signature", crate::hex::encode(&s.signature).into()),
                ])
            })
            .collect();
        obj(vec![
            ("gkmetadata", Value::Integer(METADATA_FORMAT_V1.into())),
            ("payload", self.payload.clone()),
            ("signatures", Value::Array(signatures)),
        ])
    }

    /// The `.gkmetadata` file text, indented for people. Reading it back gives the same payload
    /// and so the same canonical bytes.
    pub fn to_pretty_json(&self) -> String {
        self.to_value().to_pretty_string()
    }
}

impl Manifest {
    /// Reads a bare payload document (the canonical bytes, for instance). Paths in errors start
    /// at the payload, `$.version` rather than `$.payload.version`.
    pub fn parse_payload(bytes: &[u8]) -> Result<Self, ManifestErrors> {
        Self::from_payload_value(&parse_json(bytes)?)
    }

    /// Reads a payload that is already a JSON value; paths in errors start at the payload.
    pub fn from_payload_value(value: &Value) -> Result<Self, ManifestErrors> {
        let mut p = Problems::default();
        match read_payload(value, &At::ROOT, &mut p) {
            Some(m) if p.is_empty() => Ok(m),
            _ => Err(p.into_errors()),
        }
    }

    /// Applies the rules that span fields, as reading does. Paths in errors are where the fields
    /// sit in a `.gkmetadata` file (`$.payload.entry`).
    pub fn check(&self) -> Result<(), ManifestErrors> {
        let mut p = Problems::default();
        self.check_into(&At::ROOT.key("payload"), &mut p);
        p.into_result()
    }

    fn check_into(&self, base: &At<'_>, p: &mut Problems) {
        check_module_abi(
            self.kind,
            self.module_abi.is_some(),
            &base.key("module_abi"),
            p,
        );
        let at = base.key("backends");
        check_non_empty(self.backends.len(), &at, p);
        check_unique(self.backends.iter().enumerate(), &at, None, p);
        let at = base.key("artifacts");
        check_non_empty(self.artifacts.len(), &at, p);
        check_artifact_paths(self.artifacts.iter().map(|a| &a.path).enumerate(), &at, p);
        check_entry(
            &self.entry,
            self.artifacts.iter().map(|a| &a.path),
            &base.key("entry"),
            p,
        );
        let at = base.key("provided_ops");
        check_unique(self.provided_ops.iter().enumerate(), &at, None, p);
        let at = base.key("provided_runners");
        check_unique(self.provided_runners.iter().enumerate(), &at, None, p);
        let at = base.key("module_dependencies");
        for (i, d) in self.module_dependencies.iter().enumerate() {
            check_abi_tag(Some(self.kind), &d.abi_tag, &at.index(i).key("abi_tag"), p);
        }
    }

    /// The payload as a JSON value, for the packer. Opt-in fields are left out when absent or
    /// empty, so that a manifest using none of them canonicalises as it did before they existed.
    pub fn to_payload_value(&self) -> Value {
        let strings =
            |items: &mut dyn Iterator<Item = &str>| Value::Array(items.map(Value::from).collect());
        let mut m: Vec<(&str, Value)> = vec![
            ("package_id", self.package_id.as_str().into()),
            ("kind", self.kind.as_str().into()),
            ("version", self.version.to_string().into()),
            ("publisher_id", self.publisher_id.as_str().into()),
            (
                "kernel_abi",
                obj(vec![
                    ("min", self.kernel_abi.min().to_string().into()),
                    ("max", self.kernel_abi.max().to_string().into()),
                ]),
            ),
        ];
        if let Some(abi) = self.module_abi {
            m.push(("module_abi", Value::Integer(abi.into())));
        }
        m.push(("os", self.os.as_str().into()));
        m.push(("arch", self.arch.as_str().into()));
        m.push((
            "backends",
            strings(&mut self.backends.iter().map(|b| b.as_str())),
        ));
        m.push(("entry", self.entry.as_str().into()));
        let artifacts = self
            .artifacts
            .iter()
            .map(|a| {
                obj(vec![
                    ("path", a.path.as_str().into()),
                    ("size", a.size.into()),
                    ("sha256", a.sha256.to_hex().into()),
                ])
            })
            .collect();
        m.push(("artifacts", Value::Array(artifacts)));
        m.push((
            "provided_ops",
            strings(&mut self.provided_ops.iter().map(ImplId::as_str)),
        ));
        if !self.provided_runners.is_empty() {
            let runners = strings(&mut self.provided_runners.iter().map(RunnerId::as_str));
            m.push(("provided_runners", runners));
        }
        if !self.dependencies.is_empty() {
            let deps = self.dependencies.iter().map(|d| {
                let mut o = vec![("package_id", d.package_id.as_str().into())];
                push_range(&mut o, &d.range);
                obj(o)
            });
            m.push(("dependencies", Value::Array(deps.collect())));
        }
        if !self.module_dependencies.is_empty() {
            let deps = self.module_dependencies.iter().map(|d| {
                let mut o = vec![("module_id", d.module_id.as_str().into())];
                push_range(&mut o, &d.range);
                o.push(("abi_tag", d.abi_tag.as_str().into()));
                if let Some(publisher) = &d.publisher_id {
                    o.push(("publisher_id", publisher.as_str().into()));
                }
                if let Some(digest) = &d.sha256 {
                    o.push(("sha256", digest.to_hex().into()));
                }
                obj(o)
            });
            m.push(("module_dependencies", Value::Array(deps.collect())));
        }
        if !self.check_params.is_empty() {
            let records = self
                .check_params
                .iter()
                .map(|(op, spec)| (op.as_str(), spec.as_str().into()))
                .collect();
            m.push(("check_params", obj(records)));
        }
        obj(m)
    }

    /// The canonical bytes of [`Manifest::to_payload_value`].
    pub fn canonical_payload(&self) -> Vec<u8> {
        canonicalize(&self.to_payload_value())
    }

    /// SHA-256 of [`Manifest::canonical_payload`].
    pub fn payload_digest(&self) -> Sha256Digest {
        Sha256Digest::of(&self.canonical_payload())
    }

    /// The `GUILD_BACKEND_*` bits of all declared backends.
    pub fn backend_mask(&self) -> u32 {
        self.backends.iter().fold(0, |mask, b| mask | b.bit())
    }

    /// The artifact that [`Manifest::entry`] names.
    pub fn entry_artifact(&self) -> Option<&Artifact> {
        self.artifacts.iter().find(|a| a.path == self.entry)
    }
}

fn obj(members: Vec<(&str, Value)>) -> Value {
    Value::Object(
        members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

fn push_range(o: &mut Vec<(&str, Value)>, range: &VersionRange) {
    o.push(("min_version", range.min().to_string().into()));
    if let Some(max) = range.max() {
        o.push(("max_version", max.to_string().into()));
    }
}

fn clip(text: &str) -> String {
    text.chars().take(ERROR_TEXT_CHARS).collect()
}

fn parse_json(bytes: &[u8]) -> Result<Value, ManifestErrors> {
    if bytes.len() > MAX_METADATA_BYTES {
        let kind = FieldErrorKind::TooLarge {
            size: bytes.len(),
            limit: MAX_METADATA_BYTES,
        };
        return Err(ManifestErrors::single(JsonPath::root(), kind));
    }
    json::parse(bytes).map_err(|e| {
        ManifestErrors::single(
            e.path,
            FieldErrorKind::Json {
                kind: e.kind,
                offset: e.offset,
            },
        )
    })
}

/// Where a reader is in the document: a chain of borrowed steps back to the root. Readers pass
/// these down for free and turn one into a [`JsonPath`] only when they record a problem, which
/// keeps a valid manifest's reading free of path allocations.
#[derive(Clone, Copy)]
struct At<'a> {
    parent: Option<&'a At<'a>>,
    step: Step<'a>,
}

#[derive(Clone, Copy)]
enum Step<'a> {
    Root,
    Key(&'a str),
    Index(usize),
}

impl<'a> At<'a> {
    const ROOT: At<'static> = At {
        parent: None,
        step: Step::Root,
    };

    fn key<'b>(&'b self, key: &'b str) -> At<'b> {
        At {
            parent: Some(self),
            step: Step::Key(key),
        }
    }

    fn index(&self, index: usize) -> At<'_> {
        At {
            parent: Some(self),
            step: Step::Index(index),
        }
    }

    fn path(&self) -> JsonPath {
        let mut steps = Vec::new();
        let mut here = Some(self);
        while let Some(at) = here {
            match at.step {
                Step::Root => {}
                Step::Key(k) => steps.push(PathSegment::Key(k.to_owned())),
                Step::Index(i) => steps.push(PathSegment::Index(i)),
            }
            here = at.parent;
        }
        steps.into_iter().rev().collect()
    }
}

/// Problems found so far: the first [`MAX_REPORTED_PROBLEMS`], with their paths, and a count of
/// the rest, whose paths are never built. A reader that returns `None` has always recorded at
/// least one, which is what keeps [`ManifestErrors`] non-empty.
#[derive(Default)]
struct Problems {
    kept: Vec<FieldError>,
    omitted: usize,
}

impl Problems {
    fn push(&mut self, at: &At<'_>, kind: FieldErrorKind) {
        if self.kept.len() < MAX_REPORTED_PROBLEMS {
            self.kept.push(FieldError {
                path: at.path(),
                kind,
            });
        } else {
            self.omitted = self.omitted.saturating_add(1);
        }
    }

    fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Every problem recorded, kept or only counted.
    fn count(&self) -> usize {
        self.kept.len().saturating_add(self.omitted)
    }

    fn into_errors(self) -> ManifestErrors {
        ManifestErrors {
            errors: self.kept,
            omitted: self.omitted,
        }
    }

    fn into_result(self) -> Result<(), ManifestErrors> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(self.into_errors())
        }
    }
}

/// Reads one value found at a path; `None` means a problem has been recorded.
type Reader<T> = fn(&Value, &At<'_>, &mut Problems) -> Option<T>;

fn wrong_type(expected: &'static str, found: &Value) -> FieldErrorKind {
    FieldErrorKind::WrongType {
        expected,
        found: found.type_name(),
    }
}

/// The members of an object, after recording every member not in `allowed` as unknown.
fn object<'v>(
    v: &'v Value,
    at: &At<'_>,
    allowed: &[&str],
    p: &mut Problems,
) -> Option<&'v [(String, Value)]> {
    let Some(members) = v.as_object() else {
        p.push(at, wrong_type("object", v));
        return None;
    };
    for (k, _) in members {
        if !allowed.contains(&k.as_str()) {
            p.push(&at.key(k), FieldErrorKind::UnknownField);
        }
    }
    Some(members)
}

fn field<'v>(members: &'v [(String, Value)], key: &str) -> Option<&'v Value> {
    members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn required<'v, T>(
    members: &'v [(String, Value)],
    at: &At<'_>,
    key: &str,
    p: &mut Problems,
    read: impl FnOnce(&'v Value, &At<'_>, &mut Problems) -> Option<T>,
) -> Option<T> {
    match field(members, key) {
        Some(v) => read(v, &at.key(key), p),
        None => {
            p.push(&at.key(key), FieldErrorKind::Missing);
            None
        }
    }
}

/// Marks an optional field that is present but invalid; its problems are already recorded.
struct Invalid;

fn optional<'v, T>(
    members: &'v [(String, Value)],
    at: &At<'_>,
    key: &str,
    p: &mut Problems,
    read: impl FnOnce(&'v Value, &At<'_>, &mut Problems) -> Option<T>,
) -> Result<Option<T>, Invalid> {
    match field(members, key) {
        Some(v) => read(v, &at.key(key), p).map(Some).ok_or(Invalid),
        None => Ok(None),
    }
}

fn string<'v>(v: &'v Value, at: &At<'_>, p: &mut Problems) -> Option<&'v str> {
    let s = v.as_str();
    if s.is_none() {
        p.push(at, wrong_type("string", v));
    }
    s
}

fn id<T>(
    v: &Value,
    at: &At<'_>,
    p: &mut Problems,
    make: fn(&str) -> Result<T, IdError>,
) -> Option<T> {
    make(string(v, at, p)?)
        .map_err(|e| p.push(at, FieldErrorKind::InvalidId(e)))
        .ok()
}

fn package_id(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<PackageId> {
    id(v, at, p, |s| PackageId::new(s))
}

fn publisher_id(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<PublisherId> {
    id(v, at, p, |s| PublisherId::new(s))
}

fn spelled<T>(
    v: &Value,
    at: &At<'_>,
    p: &mut Problems,
    parse: fn(&str) -> Option<T>,
    expected: &'static [&'static str],
) -> Option<T> {
    let s = string(v, at, p)?;
    let parsed = parse(s);
    if parsed.is_none() {
        p.push(
            at,
            FieldErrorKind::UnknownValue {
                found: clip(s),
                expected,
            },
        );
    }
    parsed
}

fn semver(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<Version> {
    let text = string(v, at, p)?;
    let reason = match Version::parse(text) {
        // Written back with `to_string`, so only the one spelling that survives that is accepted;
        // otherwise the packer's bytes could differ from what was signed.
        Ok(version) if version.to_string() == text => return Some(version),
        Ok(_) => "it is not written in its canonical form".to_owned(),
        Err(e) => e.to_string(),
    };
    p.push(
        at,
        FieldErrorKind::InvalidVersion {
            text: clip(text),
            reason,
        },
    );
    None
}

fn packed_version(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<PackedVersion> {
    PackedVersion::parse(string(v, at, p)?)
        .map_err(|e| p.push(at, FieldErrorKind::InvalidAbiVersion(e)))
        .ok()
}

fn unsigned(v: &Value, at: &At<'_>, p: &mut Problems, max: u64) -> Option<u64> {
    let Some(found) = v.as_integer() else {
        p.push(at, wrong_type("integer", v));
        return None;
    };
    let value = found.as_u64().filter(|&n| n <= max);
    if value.is_none() {
        p.push(at, FieldErrorKind::IntegerOutOfRange { found, min: 0, max });
    }
    value
}

fn digest(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<Sha256Digest> {
    Sha256Digest::parse_hex(string(v, at, p)?)
        .map_err(|e| p.push(at, FieldErrorKind::InvalidDigest(e)))
        .ok()
}

fn artifact_path(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<ArtifactPath> {
    ArtifactPath::new(string(v, at, p)?)
        .map_err(|e| p.push(at, FieldErrorKind::InvalidPath(e.rule)))
        .ok()
}

/// Reads every element of an array, keeping the failures as `None` so that checks across
/// elements can still run over the valid ones.
fn elements<'v, T>(
    v: &'v Value,
    at: &At<'_>,
    p: &mut Problems,
    read: impl Fn(&'v Value, &At<'_>, &mut Problems) -> Option<T>,
) -> Option<Vec<Option<T>>> {
    let Some(items) = v.as_array() else {
        p.push(at, wrong_type("array", v));
        return None;
    };
    Some(
        items
            .iter()
            .enumerate()
            .map(|(i, item)| read(item, &at.index(i), p))
            .collect(),
    )
}

fn valid<T>(items: &[Option<T>]) -> impl Iterator<Item = (usize, &T)> {
    items
        .iter()
        .enumerate()
        .filter_map(|(i, x)| x.as_ref().map(|x| (i, x)))
}

/// An array of unique elements; with `non_empty`, also at least one.
fn unique_list<T: Ord>(
    v: &Value,
    at: &At<'_>,
    p: &mut Problems,
    non_empty: bool,
    read: Reader<T>,
) -> Option<Vec<T>> {
    let items = elements(v, at, p, read)?;
    if non_empty {
        check_non_empty(items.len(), at, p);
    }
    check_unique(valid(&items), at, None, p);
    items.into_iter().collect()
}

fn check_non_empty(len: usize, at: &At<'_>, p: &mut Problems) {
    if len == 0 {
        p.push(at, FieldErrorKind::EmptyArray);
    }
}

fn check_unique<'a, T: Ord + 'a>(
    items: impl IntoIterator<Item = (usize, &'a T)>,
    at: &At<'_>,
    member: Option<&str>,
    p: &mut Problems,
) {
    let mut first: BTreeMap<&T, usize> = BTreeMap::new();
    for (i, item) in items {
        match first.get(item) {
            Some(&first_index) => {
                let element = at.index(i);
                let kind = FieldErrorKind::Duplicate { first_index };
                match member {
                    Some(m) => p.push(&element.key(m), kind),
                    None => p.push(&element, kind),
                }
            }
            None => {
                first.insert(item, i);
            }
        }
    }
}

/// Artifact paths must be unique, and also unique once case is folded, so that a package
/// unpacks to the same files on every file system.
fn check_artifact_paths<'a>(
    paths: impl IntoIterator<Item = (usize, &'a ArtifactPath)>,
    at: &At<'_>,
    p: &mut Problems,
) {
    let mut exact: BTreeMap<&str, usize> = BTreeMap::new();
    let mut folded: BTreeMap<String, (usize, &str)> = BTreeMap::new();
    for (i, path) in paths {
        let element = at.index(i);
        let here = element.key("path");
        if let Some(&first_index) = exact.get(path.as_str()) {
            p.push(&here, FieldErrorKind::Duplicate { first_index });
        } else if let Some(&(first_index, other)) = folded.get(&path.collision_key()) {
            p.push(
                &here,
                FieldErrorKind::PathCollision {
                    first_index,
                    other: other.to_owned(),
                },
            );
        } else {
            exact.insert(path.as_str(), i);
            folded.insert(path.collision_key(), (i, path.as_str()));
        }
    }
}

fn check_entry<'a>(
    entry: &ArtifactPath,
    mut artifacts: impl Iterator<Item = &'a ArtifactPath>,
    at: &At<'_>,
    p: &mut Problems,
) {
    if !artifacts.any(|a| a == entry) {
        p.push(
            at,
            FieldErrorKind::EntryNotAnArtifact {
                entry: entry.to_string(),
            },
        );
    }
}

fn check_module_abi(kind: PackageKind, present: bool, at: &At<'_>, p: &mut Problems) {
    match (kind, present) {
        (PackageKind::Module, false) => p.push(at, FieldErrorKind::ModuleAbiRequired),
        (PackageKind::Kernel, true) => p.push(at, FieldErrorKind::ModuleAbiForbidden),
        _ => {}
    }
}

/// A module dependency's tag is free-form provenance in a `gkernel`, but must name the runtime
/// module ABI in a `gkmodule`. `kind` is `None` when the manifest's kind itself was invalid.
fn check_abi_tag(kind: Option<PackageKind>, tag: &str, at: &At<'_>, p: &mut Problems) {
    if tag.is_empty() {
        p.push(at, FieldErrorKind::EmptyString);
    } else if kind == Some(PackageKind::Module) && tag != MODULE_ABI_TAG_V1 {
        p.push(
            at,
            FieldErrorKind::NonRuntimeModuleDependency { found: clip(tag) },
        );
    }
}

fn format_version(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<()> {
    let Some(found) = v.as_integer() else {
        p.push(at, wrong_type("integer", v));
        return None;
    };
    if found.get() != i128::from(METADATA_FORMAT_V1) {
        p.push(at, FieldErrorKind::UnsupportedFormatVersion { found });
        return None;
    }
    Some(())
}

fn read_payload(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<Manifest> {
    let m = object(v, at, PAYLOAD_FIELDS, p)?;
    let package_id = required(m, at, "package_id", p, package_id);
    let kind = required(m, at, "kind", p, |v, at, p| {
        spelled(v, at, p, PackageKind::parse, KIND_SPELLINGS)
    });
    let version = required(m, at, "version", p, semver);
    let publisher_id = required(m, at, "publisher_id", p, publisher_id);
    let kernel_abi = required(m, at, "kernel_abi", p, abi_range);
    let module_abi = optional(m, at, "module_abi", p, |v, at, p| {
        unsigned(v, at, p, u32::MAX.into()).and_then(|n| u32::try_from(n).ok())
    });
    if let Some(kind) = kind {
        let present = field(m, "module_abi").is_some();
        check_module_abi(kind, present, &at.key("module_abi"), p);
    }
    let os = required(m, at, "os", p, |v, at, p| {
        spelled(v, at, p, Os::parse, Os::SPELLINGS)
    });
    let arch = required(m, at, "arch", p, |v, at, p| {
        spelled(v, at, p, Arch::parse, Arch::SPELLINGS)
    });
    let backends = required(m, at, "backends", p, |v, at, p| {
        unique_list(v, at, p, true, |v, at, p| {
            spelled(v, at, p, Backend::parse, Backend::SPELLINGS)
        })
    });
    let entry = required(m, at, "entry", p, artifact_path);
    let artifacts = required(m, at, "artifacts", p, artifact_list);
    if let (Some(entry), Some(artifacts)) = (&entry, &artifacts) {
        check_entry(
            entry,
            artifacts.iter().map(|a| &a.path),
            &at.key("entry"),
            p,
        );
    }
    let provided_ops = required(m, at, "provided_ops", p, |v, at, p| {
        unique_list(v, at, p, false, |v, at, p| id(v, at, p, |s| ImplId::new(s)))
    });
    let provided_runners = optional(m, at, "provided_runners", p, |v, at, p| {
        unique_list(v, at, p, false, |v, at, p| {
            id(v, at, p, |s| RunnerId::new(s))
        })
    });
    let dependencies = optional(m, at, "dependencies", p, |v, at, p| {
        elements(v, at, p, dependency)?.into_iter().collect()
    });
    let module_dependencies = optional(m, at, "module_dependencies", p, |v, at, p| {
        elements(v, at, p, |v, at, p| module_dependency(v, at, p, kind))?
            .into_iter()
            .collect()
    });
    let check_params = optional(m, at, "check_params", p, check_params);
    Some(Manifest {
        package_id: package_id?,
        kind: kind?,
        version: version?,
        publisher_id: publisher_id?,
        kernel_abi: kernel_abi?,
        module_abi: module_abi.ok()?,
        os: os?,
        arch: arch?,
        backends: backends?,
        entry: entry?,
        artifacts: artifacts?,
        provided_ops: provided_ops?,
        provided_runners: provided_runners.ok()?.unwrap_or_default(),
        dependencies: dependencies.ok()?.unwrap_or_default(),
        module_dependencies: module_dependencies.ok()?.unwrap_or_default(),
        check_params: check_params.ok()?.unwrap_or_default(),
    })
}

/// `check_params`: an object from operation names to records in the typed notation. Keys are
/// unique already (the JSON reader refuses duplicates).
fn check_params(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<BTreeMap<OpName, ParamSpec>> {
    let Some(members) = v.as_object() else {
        p.push(at, wrong_type("object", v));
        return None;
    };
    let before = p.count();
    let mut out = BTreeMap::new();
    for (op, spec) in members {
        let here = at.key(op);
        let op = OpName::new(op.as_str()).map_err(|e| p.push(&here, FieldErrorKind::InvalidId(e)));
        let spec = string(spec, &here, p).and_then(|text| {
            ParamSpec::parse(text)
                .map_err(|e| p.push(&here, FieldErrorKind::InvalidCheckParams(e)))
                .ok()
        });
        if let (Ok(op), Some(spec)) = (op, spec) {
            out.insert(op, spec);
        }
    }
    (p.count() == before).then_some(out)
}

fn abi_range(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<AbiRange> {
    let m = object(v, at, ABI_RANGE_FIELDS, p)?;
    let min = required(m, at, "min", p, packed_version);
    let max = required(m, at, "max", p, packed_version);
    let (min, max) = (min?, max?);
    AbiRange::new(min, max)
        .map_err(|_| {
            let kind = FieldErrorKind::EmptyRange {
                min: min.to_string(),
                max: max.to_string(),
            };
            p.push(at, kind);
        })
        .ok()
}

fn artifact_list(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<Vec<Artifact>> {
    let items = elements(v, at, p, artifact)?;
    check_non_empty(items.len(), at, p);
    check_artifact_paths(valid(&items).map(|(i, a)| (i, &a.path)), at, p);
    items.into_iter().collect()
}

fn artifact(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<Artifact> {
    let m = object(v, at, ARTIFACT_FIELDS, p)?;
    let path = required(m, at, "path", p, artifact_path);
    let size = required(m, at, "size", p, |v, at, p| unsigned(v, at, p, u64::MAX));
    let sha256 = required(m, at, "sha256", p, digest);
    Some(Artifact {
        path: path?,
        size: size?,
        sha256: sha256?,
    })
}

/// Reads `min_version` and the optional `max_version` of a dependency record into a range,
/// refusing an empty one.
fn version_range(m: &[(String, Value)], at: &At<'_>, p: &mut Problems) -> Option<VersionRange> {
    let min = required(m, at, "min_version", p, semver);
    let max = optional(m, at, "max_version", p, semver);
    let (min, max) = (min?, max.ok()?);
    let shown = (min.to_string(), max.as_ref().map(Version::to_string));
    VersionRange::new(min, max)
        .map_err(|_| {
            let (min, max) = (shown.0, shown.1.unwrap_or_default());
            p.push(
                &at.key("max_version"),
                FieldErrorKind::EmptyRange { min, max },
            );
        })
        .ok()
}

fn dependency(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<Dependency> {
    let m = object(v, at, DEPENDENCY_FIELDS, p)?;
    let package_id = required(m, at, "package_id", p, package_id);
    let range = version_range(m, at, p);
    Some(Dependency {
        package_id: package_id?,
        range: range?,
    })
}

fn module_dependency(
    v: &Value,
    at: &At<'_>,
    p: &mut Problems,
    kind: Option<PackageKind>,
) -> Option<ModuleDependency> {
    let m = object(v, at, MODULE_DEPENDENCY_FIELDS, p)?;
    let module_id = required(m, at, "module_id", p, package_id);
    let range = version_range(m, at, p);
    let abi_tag = required(m, at, "abi_tag", p, |v, at, p| {
        let tag = string(v, at, p)?;
        let before = p.count();
        check_abi_tag(kind, tag, at, p);
        (p.count() == before).then(|| tag.to_owned())
    });
    let publisher_id = optional(m, at, "publisher_id", p, publisher_id);
    let sha256 = optional(m, at, "sha256", p, digest);
    Some(ModuleDependency {
        module_id: module_id?,
        range: range?,
        abi_tag: abi_tag?,
        publisher_id: publisher_id.ok()?,
        sha256: sha256.ok()?,
    })
}

fn signature_list(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<Vec<SignatureEntry>> {
    let items = elements(v, at, p, signature)?;
    check_unique(
        valid(&items).map(|(i, s)| (i, &s.key_id)),
        at,
        Some("key_id"),
        p,
    );
    items.into_iter().collect()
}

fn check_signatures(signatures: &[SignatureEntry], p: &mut Problems) {
    let at = At::ROOT.key("signatures");
    check_unique(
        signatures.iter().map(|s| &s.key_id).enumerate(),
        &at,
        Some("key_id"),
        p,
    );
    for (i, s) in signatures.iter().enumerate() {
        if s.signature.is_empty() {
            p.push(&at.index(i).key("signature"), FieldErrorKind::InvalidHex);
        }
    }
}

fn signature(v: &Value, at: &At<'_>, p: &mut Problems) -> Option<SignatureEntry> {
    let m = object(v, at, SIGNATURE_FIELDS, p)?;
    let key_id = required(m, at, "key_id", p, digest);
    let algorithm = required(m, at, "algorithm", p, |v, at, p| {
        spelled(
            v,
            at,
            p,
            SignatureAlgorithm::parse,
            SignatureAlgorithm::SPELLINGS,
        )
    });
    let signature = required(m, at, "signature", p, |v, at, p| {
        let bytes = crate::hex::decode(string(v, at, p)?);
        if bytes.is_none() {
            p.push(at, FieldErrorKind::InvalidHex);
        }
        bytes
    });
    Some(SignatureEntry {
        key_id: key_id?,
        algorithm: algorithm?,
        signature: signature?,
    })
}
