//! Journal records: the intent a commit writes (durably) before it moves any tree, so that
//! recovery knows which transaction was in flight and can cross-check the registry's generation.
//!
//! A record is strict JSON (`"guild_journal": 1`), read with the domain's strict reader. It is
//! written through a temporary file and renamed into place after an fsync, so a record that is
//! present but unreadable was damaged after it was written; recovery refuses to guess and fails
//! with the file's name.

use std::path::{Path, PathBuf};

use guild_domain::graph::NodeRef;
use guild_domain::ids::PackageId;
use guild_domain::json::{self, JsonError, Value};
use guild_domain::version::Version;

/// The journal record format this build reads and writes.
pub const JOURNAL_FORMAT_V1: u64 = 1;

/// File name suffix of a journal record.
pub(crate) const RECORD_SUFFIX: &str = ".intent";
/// File name suffix of a journal record being written.
pub(crate) const TMP_SUFFIX: &str = ".intent.tmp";

const TOP_FIELDS: &[&str] = &[
    "guild_journal",
    "from_generation",
    "to_generation",
    "install",
    "delete",
];
const INSTALL_FIELDS: &[&str] = &["id", "version", "staged", "replace"];
const REF_FIELDS: &[&str] = &["id", "version"];

/// A transaction about to change the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Intent {
    pub(crate) from_generation: u64,
    pub(crate) to_generation: u64,
    /// The version being installed and the name of its directory in the staging area.
    pub(crate) install: Option<(NodeRef, String)>,
    /// Whether the install replaces the version's installed tree (moved aside to
    /// [`StoreLayout::replaced_dir`](super::StoreLayout::replaced_dir) until the commit point).
    /// Written only when true, so records of plain installs read as before.
    pub(crate) replace: bool,
    /// The versions whose trees will be deleted after the commit point.
    pub(crate) delete: Vec<NodeRef>,
}

/// Why a journal record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalDecodeError {
    #[error("not strict JSON: {0}")]
    Json(#[from] JsonError),
    #[error(
        "journal format {found} is not supported; this build reads format {JOURNAL_FORMAT_V1}"
    )]
    UnsupportedFormat { found: String },
    #[error("not a journal record: {detail}")]
    Malformed { detail: String },
}

/// Where the record of the transaction to generation `to_generation` lives in `journal`: named
/// by that generation, zero-padded so that names sort in order.
pub(crate) fn record_path(journal: &Path, to_generation: u64) -> PathBuf {
    journal.join(format!("{to_generation:020}{RECORD_SUFFIX}"))
}

impl Intent {
    pub(crate) fn path_in(&self, journal: &Path) -> PathBuf {
        record_path(journal, self.to_generation)
    }

    pub(crate) fn tmp_path_in(&self, journal: &Path) -> PathBuf {
        journal.join(format!("{:020}{TMP_SUFFIX}", self.to_generation))
    }

    pub(crate) fn to_json(&self) -> Vec<u8> {
        let node = |n: &NodeRef| {
            vec![
                ("id".to_owned(), Value::from(n.id.as_str())),
                ("version".to_owned(), Value::from(n.version.to_string())),
            ]
        };
        let mut members = vec![
            ("guild_journal".to_owned(), Value::from(JOURNAL_FORMAT_V1)),
            (
                "from_generation".to_owned(),
                Value::from(self.from_generation),
            ),
            ("to_generation".to_owned(), Value::from(self.to_generation)),
        ];
        if let Some((n, staged)) = &self.install {
            let mut m = node(n);
            m.push(("staged".to_owned(), Value::from(staged.as_str())));
            if self.replace {
                m.push(("replace".to_owned(), Value::Bool(true)));
            }
            members.push(("install".to_owned(), Value::Object(m)));
        }
        members.push((
            "delete".to_owned(),
            Value::Array(self.delete.iter().map(|n| Value::Object(node(n))).collect()),
        ));
        Value::Object(members).to_pretty_string().into_bytes()
    }

    pub(crate) fn from_json(bytes: &[u8]) -> Result<Self, JournalDecodeError> {
        let value = json::parse(bytes)?;
        match value.get("guild_journal") {
            Some(Value::Integer(i)) if i.as_u64() == Some(JOURNAL_FORMAT_V1) => {}
            Some(Value::Integer(i)) => {
                return Err(JournalDecodeError::UnsupportedFormat {
                    found: i.to_string(),
                })
            }
            _ => return Err(malformed("the \"guild_journal\" format marker is missing")),
        }
        let top = object(&value, "the record", TOP_FIELDS)?;
        let from_generation = integer(top, "from_generation")?;
        let to_generation = integer(top, "to_generation")?;
        if from_generation.checked_add(1) != Some(to_generation) {
            return Err(malformed(format!(
                "generation {from_generation} is not followed by {to_generation}"
            )));
        }
        let mut replace = false;
        let install = match get(top, "install") {
            None => None,
            Some(v) => {
                let m = object(v, "install", INSTALL_FIELDS)?;
                let staged = string(m, "staged")?;
                // The name is joined to the staging directory only for reporting, but it must
                // still be a single plain component.
                if staged.is_empty() || staged.contains(['/', '\\', '\0']) || staged == ".." {
                    return Err(malformed(format!(
                        "staged name {staged:?} is not a plain name"
                    )));
                }
                replace = match get(m, "replace") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err(malformed("\"replace\" must be a boolean")),
                };
                Some((node_ref(m)?, staged.to_owned()))
            }
        };
        let delete = match get(top, "delete") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| node_ref(object(item, "delete entry", REF_FIELDS)?))
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(malformed("\"delete\" must be an array")),
        };
        Ok(Intent {
            from_generation,
            to_generation,
            install,
            replace,
            delete,
        })
    }
}

type Members<'a> = &'a [(String, Value)];

fn object<'a>(
    value: &'a Value,
    what: &str,
    allowed: &[&str],
) -> Result<Members<'a>, JournalDecodeError> {
    let members = value
        .as_object()
        .ok_or_else(|| malformed(format!("{what} is not an object")))?;
    if let Some((k, _)) = members.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(malformed(format!("{what} has unknown field {k:?}")));
    }
    Ok(members)
}

fn get<'a>(members: Members<'a>, key: &str) -> Option<&'a Value> {
    members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn integer(members: Members<'_>, key: &str) -> Result<u64, JournalDecodeError> {
    get(members, key)
        .and_then(Value::as_integer)
        .and_then(|i| i.as_u64())
        .ok_or_else(|| malformed(format!("{key:?} must be a non-negative integer")))
}

fn string<'a>(members: Members<'a>, key: &str) -> Result<&'a str, JournalDecodeError> {
    get(members, key)
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(format!("{key:?} must be a string")))
}

fn node_ref(members: Members<'_>) -> Result<NodeRef, JournalDecodeError> {
    let id = PackageId::new(string(members, "id")?).map_err(|e| malformed(e.to_string()))?;
    let version = Version::parse(string(members, "version")?)
        .map_err(|e| malformed(format!("bad version: {e}")))?;
    Ok(NodeRef { id, version })
}

fn malformed(detail: impl Into<String>) -> JournalDecodeError {
    JournalDecodeError::Malformed {
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Intent {
        Intent {
            from_generation: 6,
            to_generation: 7,
            install: Some((
                NodeRef {
                    id: PackageId::new("a.b").unwrap(),
                    version: Version::parse("1.2.3-rc.1").unwrap(),
                },
                "0000000000000003".to_owned(),
            )),
            replace: false,
            delete: vec![NodeRef {
                id: PackageId::new("c").unwrap(),
                version: Version::new(0, 1, 0),
            }],
        }
    }

    #[test]
    fn journal_record_round_trips() {
        let i = sample();
        assert_eq!(Intent::from_json(&i.to_json()), Ok(i.clone()));
        assert_eq!(
            i.path_in(Path::new("j")),
            Path::new("j/00000000000000000007.intent")
        );
        let state_only = Intent {
            install: None,
            delete: Vec::new(),
            ..i
        };
        assert_eq!(Intent::from_json(&state_only.to_json()), Ok(state_only));
        let replacing = Intent {
            replace: true,
            ..sample()
        };
        assert!(String::from_utf8(replacing.to_json())
            .unwrap()
            .contains("\"replace\": true"));
        assert_eq!(Intent::from_json(&replacing.to_json()), Ok(replacing));
    }

    #[test]
    fn journal_record_refuses_damage() {
        let bytes = sample().to_json();
        assert!(matches!(
            Intent::from_json(&bytes[..bytes.len() / 2]),
            Err(JournalDecodeError::Json(_))
        ));
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(
            Intent::from_json(
                text.replace("\"guild_journal\": 1", "\"guild_journal\": 9")
                    .as_bytes()
            ),
            Err(JournalDecodeError::UnsupportedFormat {
                found: "9".to_owned()
            })
        );
        assert_eq!(
            Intent::from_json(
                text.replace("\"to_generation\": 7", "\"to_generation\": 9")
                    .as_bytes()
            ),
            Err(malformed("generation 6 is not followed by 9"))
        );
        assert_eq!(
            Intent::from_json(text.replace("\"staged\"", "\"extra\"").as_bytes()),
            Err(malformed("install has unknown field \"extra\""))
        );
        assert_eq!(
            Intent::from_json(text.replace("0000000000000003", "../x").as_bytes()),
            Err(malformed("staged name \"../x\" is not a plain name"))
        );
    }
}
