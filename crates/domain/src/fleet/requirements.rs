//! A fleet's requirements: the small declarative file from which an operator authors a policy's
//! desired set, and the rule that resolves one requirement against a repository's tags.
//!
//! ```json
//! {"requirements": [
//!   {"id": "org.example.scan", "version": "^1.2", "repository": "oci://127.0.0.1:5000/guild/scan"}
//! ]}
//! ```
//!
//! `version` is a semantic-version requirement as Cargo writes them (`^1.2`, `~1.2.3`,
//! `>=1.0, <2.0`, `=1.2.3`, `*`), with semver's pre-release rule: a pre-release version is a
//! candidate only for a requirement that names a pre-release of the same `MAJOR.MINOR.PATCH`,
//! so `^1` never picks `1.3.0-rc.1`. `repository` names no tag and no digest: the resolution
//! picks the tag ([`resolve_tag`]) and the caller pins the manifest digest it fetched. Reading
//! is strict: unknown members, a package required twice and a tag or digest in a repository
//! are refused, naming the entry.

use std::cmp::Ordering;
use std::fmt;

use crate::distribution::OciRepository;
use crate::ids::PackageId;
use crate::json::{self, JsonError, Value};
use crate::version::{Version, VersionReq};

use super::MAX_PACKAGES;

/// Most versions a refusal lists (the highest ones).
pub const MAX_VERSIONS_SHOWN: usize = 10;

const TOP_FIELDS: &[&str] = &["requirements"];
const ENTRY_FIELDS: &[&str] = &["id", "version", "repository"];

/// One package the fleet requires: which, which versions, and where its versions are tagged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The package id; the package resolved must carry it.
    pub id: PackageId,
    /// The versions accepted.
    pub version: VersionReq,
    /// The repository whose tags are its versions.
    pub repository: OciRepository,
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} from {}", self.id, self.version, self.repository)
    }
}

/// A requirements file, read strictly.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requirements {
    entries: Vec<Requirement>,
}

/// Why a requirements file is refused. Nothing of it is used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementsError {
    /// Not JSON as the strict reader accepts it.
    #[error("not valid JSON: {0}")]
    Json(JsonError),
    /// A member is missing, unknown or malformed; `path` names the entry
    /// (`requirements[1] (org.example.scan).repository`).
    #[error("{path}: {problem}")]
    Field {
        /// Where.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// More entries than a policy may desire.
    #[error("requirements holds {count} entries; a policy desires at most {limit} packages")]
    TooMany {
        /// How many.
        count: usize,
        /// The most accepted.
        limit: usize,
    },
    /// One package id required twice.
    #[error("requirements[{second}]: package {id} is already required by requirements[{first}]")]
    Duplicate {
        /// The package.
        id: PackageId,
        /// The first entry's index.
        first: usize,
        /// The second entry's index.
        second: usize,
    },
}

fn field(path: impl Into<String>, problem: impl Into<String>) -> RequirementsError {
    RequirementsError::Field {
        path: path.into(),
        problem: problem.into(),
    }
}

/// The members of an object, unknown ones refused.
fn members<'v>(
    v: &'v Value,
    path: &str,
    allowed: &[&str],
) -> Result<&'v [(String, Value)], RequirementsError> {
    let members = v
        .as_object()
        .ok_or_else(|| field(path, format!("expected an object, found {}", v.type_name())))?;
    if let Some((k, _)) = members.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        let k: String = k.chars().take(80).collect();
        let at = if path.is_empty() {
            k
        } else {
            format!("{path}.{k}")
        };
        return Err(field(
            at,
            format!("unknown member: an entry has only {}", allowed.join(", ")),
        ));
    }
    Ok(members)
}

fn string<'v>(
    members: &'v [(String, Value)],
    path: &str,
    key: &str,
) -> Result<&'v str, RequirementsError> {
    let at = format!("{path}.{key}");
    let v = members
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .ok_or_else(|| field(&at, "missing"))?;
    v.as_str()
        .ok_or_else(|| field(&at, format!("expected a string, found {}", v.type_name())))
}

impl Requirements {
    /// Reads a requirements file strictly (see the module's documentation).
    pub fn parse(bytes: &[u8]) -> Result<Self, RequirementsError> {
        let value = json::parse(bytes).map_err(RequirementsError::Json)?;
        let top = members(&value, "", TOP_FIELDS)?;
        let list = top
            .iter()
            .find(|(k, _)| k == "requirements")
            .map(|(_, v)| v)
            .ok_or_else(|| field("requirements", "missing"))?;
        let list = list.as_array().ok_or_else(|| {
            field(
                "requirements",
                format!("expected an array, found {}", list.type_name()),
            )
        })?;
        if list.len() > MAX_PACKAGES {
            return Err(RequirementsError::TooMany {
                count: list.len(),
                limit: MAX_PACKAGES,
            });
        }
        let mut entries: Vec<Requirement> = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let mut at = format!("requirements[{i}]");
            // The entry's id, when it has a readable one, names it in every later error.
            if let Some(id) = item.get("id").and_then(Value::as_str) {
                at.push_str(&format!(" ({})", id.chars().take(80).collect::<String>()));
            }
            let m = members(item, &at, ENTRY_FIELDS)?;
            let id = string(m, &at, "id")?;
            let id = PackageId::new(id).map_err(|e| field(format!("{at}.id"), e.to_string()))?;
            let version = string(m, &at, "version")?;
            let version = parse_requirement(version)
                .map_err(|problem| field(format!("{at}.version"), problem))?;
            let repository = string(m, &at, "repository")?;
            let repository = OciRepository::parse(repository)
                .map_err(|e| field(format!("{at}.repository"), e.to_string()))?;
            if let Some(first) = entries.iter().position(|r| r.id == id) {
                return Err(RequirementsError::Duplicate {
                    id,
                    first,
                    second: i,
                });
            }
            entries.push(Requirement {
                id,
                version,
                repository,
            });
        }
        Ok(Requirements { entries })
    }

    /// The requirements, in file order.
    pub fn entries(&self) -> &[Requirement] {
        &self.entries
    }
}

/// A version requirement: semver's syntax, never empty.
fn parse_requirement(text: &str) -> Result<VersionReq, String> {
    if text.trim().is_empty() {
        return Err("empty; write a requirement such as ^1.2, ~1.2.3 or =1.2.3 (* for any)".into());
    }
    VersionReq::parse(text).map_err(|e| {
        format!(
            "{:?} is not a version requirement (^1.2, ~1.2.3, >=1.0, <2.0, =1.2.3): {e}",
            text.chars().take(80).collect::<String>()
        )
    })
}

/// The version a tag names: a semantic version, optionally after one leading `v` (`v1.2.0`).
/// Any other tag (`latest`, `1.2`) names none.
pub fn tag_version(tag: &str) -> Option<Version> {
    let text = tag.strip_prefix('v').unwrap_or(tag);
    Version::parse(text).ok()
}

/// The tag a requirement resolves to, and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedTag {
    /// The tag, as the registry lists it.
    pub tag: String,
    /// The version it names.
    pub version: Version,
}

/// No tag of the repository satisfies the requirement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct NoMatchingTag {
    /// The versions the tags name, highest first, at most [`MAX_VERSIONS_SHOWN`].
    pub seen: Vec<Version>,
    /// How many distinct versions the tags name in all.
    pub versions: usize,
    /// How many tags name no version (`latest`, ...).
    pub other_tags: usize,
}

impl NoMatchingTag {
    fn describe(&self) -> String {
        if self.versions == 0 {
            return format!(
                "no tag names a semantic version ({} other tag(s))",
                self.other_tags
            );
        }
        let mut text = format!(
            "no tag matches; versions seen: {}",
            self.seen
                .iter()
                .map(Version::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if self.versions > self.seen.len() {
            text.push_str(&format!(" and {} lower", self.versions - self.seen.len()));
        }
        if self.other_tags > 0 {
            text.push_str(&format!(" ({} other tag(s))", self.other_tags));
        }
        text
    }
}

/// Resolves `requirement` against a repository's `tags`: of the tags that name a version
/// ([`tag_version`]) that the requirement matches, the highest by semantic-version precedence.
/// Where two tags name the same version (`1.2.0` and `v1.2.0`), the one without the `v` wins;
/// build metadata cannot appear in a tag, so no two versions tie otherwise.
pub fn resolve_tag(
    requirement: &VersionReq,
    tags: &[String],
) -> Result<ResolvedTag, NoMatchingTag> {
    let mut best: Option<ResolvedTag> = None;
    let mut seen: Vec<Version> = Vec::new();
    let mut other_tags = 0;
    for tag in tags {
        let Some(version) = tag_version(tag) else {
            other_tags += 1;
            continue;
        };
        if !seen.contains(&version) {
            seen.push(version.clone());
        }
        if !requirement.matches(&version) {
            continue;
        }
        let better = match &best {
            None => true,
            Some(b) => match version.cmp_precedence(&b.version) {
                Ordering::Greater => true,
                Ordering::Equal => b.tag.starts_with('v') && !tag.starts_with('v'),
                Ordering::Less => false,
            },
        };
        if better {
            best = Some(ResolvedTag {
                tag: tag.clone(),
                version,
            });
        }
    }
    best.ok_or_else(|| {
        seen.sort_by(|a, b| b.cmp_precedence(a));
        let versions = seen.len();
        seen.truncate(MAX_VERSIONS_SHOWN);
        NoMatchingTag {
            seen,
            versions,
            other_tags,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| (*t).to_owned()).collect()
    }

    fn req(text: &str) -> VersionReq {
        VersionReq::parse(text).unwrap()
    }

    #[test]
    fn the_highest_matching_release_wins_and_pre_releases_only_when_named() {
        let t = tags(&["1.0.0", "1.2.0", "1.3.0-rc.1", "2.0.0", "latest"]);
        let pick = |r: &str| resolve_tag(&req(r), &t).map(|x| x.tag);
        assert_eq!(pick("^1").unwrap(), "1.2.0");
        assert_eq!(pick("^1.2").unwrap(), "1.2.0");
        assert_eq!(pick("~1.0").unwrap(), "1.0.0");
        assert_eq!(pick("*").unwrap(), "2.0.0");
        assert_eq!(pick(">=1.3.0-rc.1, <2").unwrap(), "1.3.0-rc.1");
        let none = resolve_tag(&req("^3"), &t).unwrap_err();
        assert_eq!(none.versions, 4);
        assert_eq!(none.other_tags, 1);
        assert_eq!(
            none.to_string(),
            "no tag matches; versions seen: 2.0.0, 1.3.0-rc.1, 1.2.0, 1.0.0 (1 other tag(s))"
        );
    }

    #[test]
    fn a_leading_v_names_the_same_version_and_the_plain_tag_wins_a_tie() {
        let t = tags(&["v1.4.0", "1.4.0", "v1.5.0", "1.x"]);
        let r = resolve_tag(&req("^1"), &t).unwrap();
        assert_eq!(
            (r.tag.as_str(), r.version.to_string()),
            ("v1.5.0", "1.5.0".into())
        );
        let r = resolve_tag(&req("=1.4.0"), &t).unwrap();
        assert_eq!(r.tag, "1.4.0");
        assert_eq!(tag_version("1.2"), None);
        assert_eq!(tag_version("vv1.2.0"), None);
    }

    #[test]
    fn a_refusal_lists_at_most_ten_versions_highest_first() {
        let t: Vec<String> = (0..25).map(|i| format!("0.{i}.0")).collect();
        let none = resolve_tag(&req("^1"), &t).unwrap_err();
        assert_eq!(none.seen.len(), MAX_VERSIONS_SHOWN);
        assert_eq!(none.seen[0].to_string(), "0.24.0");
        assert!(none.to_string().ends_with("and 15 lower"), "{none}");
        let none = resolve_tag(&req("^1"), &tags(&["latest"])).unwrap_err();
        assert_eq!(
            none.to_string(),
            "no tag names a semantic version (1 other tag(s))"
        );
    }

    #[test]
    fn requirements_are_read_strictly_naming_the_entry() {
        let ok = br#"{"requirements": [
            {"id": "org.example.scan", "version": "^1.2", "repository": "oci://127.0.0.1:5000/guild/scan"},
            {"id": "org.example.norm", "version": "=2.0.0", "repository": "oci://reg.example/norm"}
        ]}"#;
        let r = Requirements::parse(ok).unwrap();
        assert_eq!(r.entries().len(), 2);
        assert_eq!(r.entries()[0].repository.repository(), "guild/scan");
        assert_eq!(
            r.entries()[0].to_string(),
            "org.example.scan ^1.2 from oci://127.0.0.1:5000/guild/scan"
        );
        assert!(Requirements::parse(br#"{"requirements": []}"#)
            .unwrap()
            .entries()
            .is_empty());
        let entry = |id: &str, version: &str, repository: &str, more: &str| {
            format!(
                r#"{{"requirements": [{{"id": "{id}", "version": "{version}", "repository": "{repository}"{more}}}]}}"#
            )
        };
        let repo = "oci://127.0.0.1:5000/guild/scan";
        for (text, says) in [
            (
                entry("a.b", "^1", repo, r#", "tag": "x""#),
                "requirements[0] (a.b).tag: unknown member",
            ),
            (
                entry("a.b", "^1", "oci://127.0.0.1:5000/guild/scan:1.0.0", ""),
                "requirements[0] (a.b).repository",
            ),
            (
                entry("a.b", "^1", "oci://127.0.0.1:5000/guild/scan@sha256:00", ""),
                "no @sha256:DIGEST",
            ),
            (entry("a.b", "^1", "https://reg/x", ""), "oci://"),
            (
                entry("a.b", "", repo, ""),
                "requirements[0] (a.b).version: empty",
            ),
            (entry("a.b", "one", repo, ""), "not a version requirement"),
            (entry("A B", "^1", repo, ""), "requirements[0] (A B).id"),
            (
                r#"{"requirements": [], "x": 1}"#.to_owned(),
                "x: unknown member",
            ),
            (r#"{"requirements": {}}"#.to_owned(), "expected an array"),
            (r#"{}"#.to_owned(), "requirements: missing"),
            (
                r#"{"requirements": [{"id": "a.b"}]}"#.to_owned(),
                "(a.b).version: missing",
            ),
            ("[".to_owned(), "not valid JSON"),
        ] {
            let err = Requirements::parse(text.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
        let twice = format!(
            r#"{{"requirements": [{{"id": "a.b", "version": "^1", "repository": "{repo}"}}, {{"id": "a.b", "version": "^2", "repository": "{repo}"}}]}}"#
        );
        assert_eq!(
            Requirements::parse(twice.as_bytes())
                .unwrap_err()
                .to_string(),
            "requirements[1]: package a.b is already required by requirements[0]"
        );
    }
}
