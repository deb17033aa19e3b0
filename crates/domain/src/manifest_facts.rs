//! What the dependency graph and the impl-id claims read of a version's signed manifest, recorded
//! with the version in the store state when it is published, so that checking a change against
//! the whole store reads the registry alone and not every installed version's `.gkmetadata`.
//!
//! A version's payload never changes, so neither do these facts; a full check compares them with
//! the installed metadata. Records written before they were recorded have none, and their
//! metadata is read instead.

use crate::dependency::{Dependency, ModuleDependency};
use crate::graph::PackageNode;
use crate::ids::{ImplId, PackageId, PublisherId, Sha256Digest};
use crate::json::{BorrowedValue, Value};
use crate::manifest::Manifest;
use crate::store_state::{field, At, FieldProblem, Fields, StoreStateDecodeError, VersionRecord};
use crate::version::{Version, VersionRange};

/// The manifest fields that the graph ([`PackageNode`]) and the claims read, beyond what a
/// [`VersionRecord`] holds anyway (kind, publisher, payload digest).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ManifestFacts {
    /// The module ABI a `gkmodule` declares.
    pub module_abi: Option<u32>,
    /// The implementation ids it registers, in manifest order.
    pub provided_ops: Vec<ImplId>,
    /// Its `dependencies`, in manifest order.
    pub dependencies: Vec<Dependency>,
    /// Its `module_dependencies`, in manifest order, provenance records included.
    pub module_dependencies: Vec<ModuleDependency>,
}

impl ManifestFacts {
    /// The facts of `manifest`.
    pub fn of(manifest: &Manifest) -> Self {
        ManifestFacts {
            module_abi: manifest.module_abi,
            provided_ops: manifest.provided_ops.clone(),
            dependencies: manifest.dependencies.clone(),
            module_dependencies: manifest.module_dependencies.clone(),
        }
    }

    /// The graph's node of `id@version` as `record` describes it, when the record carries its
    /// facts.
    pub fn node(id: &PackageId, version: &Version, record: &VersionRecord) -> Option<PackageNode> {
        let facts = record.facts.as_deref()?;
        Some(PackageNode {
            id: id.clone(),
            version: version.clone(),
            kind: record.kind,
            module_abi: facts.module_abi,
            publisher: record.publisher.clone(),
            payload_digest: record.payload_digest,
            enabled: record.state.is_enabled(),
            dependencies: facts.dependencies.clone(),
            module_dependencies: facts.module_dependencies.clone(),
        })
    }
}

const FACT_FIELDS: &[&str] = &[
    "module_abi",
    "provided_ops",
    "dependencies",
    "module_dependencies",
];
const DEPENDENCY_FIELDS: &[&str] = &["package_id", "min_version", "max_version"];
const MODULE_DEPENDENCY_FIELDS: &[&str] = &[
    "module_id",
    "min_version",
    "max_version",
    "abi_tag",
    "publisher_id",
    "sha256",
];

fn push_range(o: &mut Vec<(String, Value)>, range: &VersionRange) {
    o.push(("min_version".into(), range.min().to_string().into()));
    if let Some(max) = range.max() {
        o.push(("max_version".into(), max.to_string().into()));
    }
}

/// The facts as a version record writes them (`"manifest"`): empty lists are left out.
pub(crate) fn encode(facts: &ManifestFacts) -> Value {
    let mut m: Vec<(String, Value)> = Vec::new();
    if let Some(abi) = facts.module_abi {
        m.push(("module_abi".into(), Value::from(u64::from(abi))));
    }
    let ops = facts.provided_ops.iter().map(|o| o.as_str().into());
    m.push(("provided_ops".into(), Value::Array(ops.collect())));
    if !facts.dependencies.is_empty() {
        let deps = facts.dependencies.iter().map(|d| {
            let mut o = vec![("package_id".into(), d.package_id.as_str().into())];
            push_range(&mut o, &d.range);
            Value::Object(o)
        });
        m.push(("dependencies".into(), Value::Array(deps.collect())));
    }
    if !facts.module_dependencies.is_empty() {
        let deps = facts.module_dependencies.iter().map(|d| {
            let mut o = vec![("module_id".into(), d.module_id.as_str().into())];
            push_range(&mut o, &d.range);
            o.push(("abi_tag".into(), d.abi_tag.as_str().into()));
            if let Some(p) = &d.publisher_id {
                o.push(("publisher_id".into(), p.as_str().into()));
            }
            if let Some(s) = &d.sha256 {
                o.push(("sha256".into(), s.to_hex().into()));
            }
            Value::Object(o)
        });
        m.push(("module_dependencies".into(), Value::Array(deps.collect())));
    }
    Value::Object(m)
}

fn invalid(at: At<'_>, detail: impl Into<String>) -> StoreStateDecodeError {
    field(
        at.path(),
        FieldProblem::Invalid {
            detail: detail.into(),
        },
    )
}

fn range(f: &Fields<'_>, at: At<'_>) -> Result<VersionRange, StoreStateDecodeError> {
    let version = |key: &str| {
        f.parsed(key, |s| {
            Version::parse(s).map_err(|e| format!("not a semantic version: {e}"))
        })
    };
    let min = version("min_version")?;
    let max = match f.get("max_version") {
        None => None,
        Some(_) => Some(version("max_version")?),
    };
    VersionRange::new(min, max).map_err(|e| invalid(at, e.to_string()))
}

/// Reads the facts a version record carries (`"manifest"`), naming the field that is wrong.
pub(crate) fn decode(
    value: &BorrowedValue<'_>,
    at: At<'_>,
) -> Result<ManifestFacts, StoreStateDecodeError> {
    let f = Fields::of(value, at, FACT_FIELDS)?;
    let module_abi = match f.get("module_abi") {
        None => None,
        Some(_) => {
            let n = f.u64("module_abi")?;
            Some(u32::try_from(n).map_err(|_| invalid(at.key("module_abi"), "too large"))?)
        }
    };
    let mut provided_ops = Vec::new();
    let ops_at = at.key("provided_ops");
    for (i, op) in f.array("provided_ops")?.iter().enumerate() {
        let s = op
            .as_str()
            .ok_or_else(|| invalid(ops_at.index(i), "expected an implementation id, a string"))?;
        provided_ops.push(ImplId::new(s).map_err(|e| invalid(ops_at.index(i), e.to_string()))?);
    }
    let mut dependencies = Vec::new();
    if f.get("dependencies").is_some() {
        let deps_at = at.key("dependencies");
        for (i, d) in f.array("dependencies")?.iter().enumerate() {
            let dat = deps_at.index(i);
            let df = Fields::of(d, dat, DEPENDENCY_FIELDS)?;
            dependencies.push(Dependency {
                package_id: df.parsed("package_id", |s| {
                    PackageId::new(s).map_err(|e| e.to_string())
                })?,
                range: range(&df, dat)?,
            });
        }
    }
    let mut module_dependencies = Vec::new();
    if f.get("module_dependencies").is_some() {
        let deps_at = at.key("module_dependencies");
        for (i, d) in f.array("module_dependencies")?.iter().enumerate() {
            let dat = deps_at.index(i);
            let df = Fields::of(d, dat, MODULE_DEPENDENCY_FIELDS)?;
            module_dependencies.push(ModuleDependency {
                module_id: df.parsed("module_id", |s| {
                    PackageId::new(s).map_err(|e| e.to_string())
                })?,
                range: range(&df, dat)?,
                abi_tag: df.str("abi_tag")?.to_owned(),
                publisher_id: match df.get("publisher_id") {
                    None => None,
                    Some(_) => Some(df.parsed("publisher_id", |s| {
                        PublisherId::new(s).map_err(|e| e.to_string())
                    })?),
                },
                sha256: match df.get("sha256") {
                    None => None,
                    Some(_) => Some(df.parsed("sha256", |s| {
                        Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
                    })?),
                },
            });
        }
    }
    Ok(ManifestFacts {
        module_abi,
        provided_ops,
        dependencies,
        module_dependencies,
    })
}
