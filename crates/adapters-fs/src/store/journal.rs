//! Journal records: the intent a commit writes (durably) before it moves any tree, so that
//! recovery knows which transaction was in flight and can cross-check the registry's generation.
//!
//! A record is strict JSON, read with the domain's strict reader, in one of two formats:
//!
//! - `"guild_journal": 1`, a transaction with at most one staged tree: an optional `install`
//!   object (`id`, `version`, `staged`, and `replace` only when true). Every record of a
//!   transaction with one install or none is still written this way, byte for byte as before, so
//!   that a build that reads only format 1 can recover a store this build left a record in.
//! - `"guild_journal": 2`, a transaction with several staged trees (a `guild sync`): an
//!   `installs` array of such objects, at least two, no version and no staged name twice. Written
//!   only when needed, so that an older build meets format 2 only where it would otherwise have
//!   had to guess, and refuses it as an unsupported format.
//!
//! Both carry `from_generation`, `to_generation` and the `delete` array. A record is written
//! through a temporary file and renamed into place after an fsync, so a record that is present
//! but unreadable was damaged after it was written; recovery refuses to guess and fails with the
//! file's name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use guild_domain::graph::NodeRef;
use guild_domain::ids::PackageId;
use guild_domain::json::{self, JsonError, Value};
use guild_domain::version::Version;

/// The journal record format of a transaction with at most one staged tree.
pub const JOURNAL_FORMAT_V1: u64 = 1;
/// The journal record format of a transaction with several staged trees.
pub const JOURNAL_FORMAT_V2: u64 = 2;

/// File name suffix of a journal record.
pub(crate) const RECORD_SUFFIX: &str = ".intent";
/// File name suffix of a journal record being written.
pub(crate) const TMP_SUFFIX: &str = ".intent.tmp";

const TOP_FIELDS_V1: &[&str] = &[
    "guild_journal",
    "from_generation",
    "to_generation",
    "install",
    "delete",
];
const TOP_FIELDS_V2: &[&str] = &[
    "guild_journal",
    "from_generation",
    "to_generation",
    "installs",
    "delete",
];
const INSTALL_FIELDS: &[&str] = &["id", "version", "staged", "replace"];
const REF_FIELDS: &[&str] = &["id", "version"];

/// One staged tree a transaction moves into place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IntentInstall {
    /// The version whose tree it becomes.
    pub(crate) node: NodeRef,
    /// The name of its directory in the staging area.
    pub(crate) staged: String,
    /// Whether it replaces the version's installed tree (moved aside to
    /// [`StoreLayout::replaced_dir`](super::StoreLayout::replaced_dir) until the commit point).
    pub(crate) replace: bool,
}

/// A transaction about to change the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Intent {
    pub(crate) from_generation: u64,
    pub(crate) to_generation: u64,
    /// The staged trees the transaction moves into place, in the order it moves them.
    pub(crate) installs: Vec<IntentInstall>,
    /// The versions whose trees will be deleted after the commit point.
    pub(crate) delete: Vec<NodeRef>,
}

/// Why a journal record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalDecodeError {
    #[error("not strict JSON: {0}")]
    Json(#[from] JsonError),
    #[error(
        "journal format {found} is not supported; this build reads formats {JOURNAL_FORMAT_V1} \
         and {JOURNAL_FORMAT_V2}"
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

    /// The record's bytes: format 1 for a transaction with at most one staged tree (exactly the
    /// bytes earlier builds wrote), format 2 for one with several.
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let node = |n: &NodeRef| {
            vec![
                ("id".to_owned(), Value::from(n.id.as_str())),
                ("version".to_owned(), Value::from(n.version.to_string())),
            ]
        };
        let install = |i: &IntentInstall| {
            let mut m = node(&i.node);
            m.push(("staged".to_owned(), Value::from(i.staged.as_str())));
            if i.replace {
                m.push(("replace".to_owned(), Value::Bool(true)));
            }
            Value::Object(m)
        };
        let several = self.installs.len() > 1;
        let format = if several {
            JOURNAL_FORMAT_V2
        } else {
            JOURNAL_FORMAT_V1
        };
        let mut members = vec![
            ("guild_journal".to_owned(), Value::from(format)),
            (
                "from_generation".to_owned(),
                Value::from(self.from_generation),
            ),
            ("to_generation".to_owned(), Value::from(self.to_generation)),
        ];
        if several {
            members.push((
                "installs".to_owned(),
                Value::Array(self.installs.iter().map(install).collect()),
            ));
        } else if let Some(i) = self.installs.first() {
            members.push(("install".to_owned(), install(i)));
        }
        members.push((
            "delete".to_owned(),
            Value::Array(self.delete.iter().map(|n| Value::Object(node(n))).collect()),
        ));
        Value::Object(members).to_pretty_string().into_bytes()
    }

    /// Reads a record of either format.
    pub(crate) fn from_json(bytes: &[u8]) -> Result<Self, JournalDecodeError> {
        let value = json::parse(bytes)?;
        let format = match value.get("guild_journal") {
            Some(Value::Integer(i)) => match i.as_u64() {
                Some(f @ (JOURNAL_FORMAT_V1 | JOURNAL_FORMAT_V2)) => f,
                _ => {
                    return Err(JournalDecodeError::UnsupportedFormat {
                        found: i.to_string(),
                    })
                }
            },
            _ => return Err(malformed("the \"guild_journal\" format marker is missing")),
        };
        let fields = if format == JOURNAL_FORMAT_V1 {
            TOP_FIELDS_V1
        } else {
            TOP_FIELDS_V2
        };
        let top = object(&value, "the record", fields)?;
        let from_generation = integer(top, "from_generation")?;
        let to_generation = integer(top, "to_generation")?;
        if from_generation.checked_add(1) != Some(to_generation) {
            return Err(malformed(format!(
                "generation {from_generation} is not followed by {to_generation}"
            )));
        }
        let installs = if format == JOURNAL_FORMAT_V1 {
            match get(top, "install") {
                None => Vec::new(),
                Some(v) => vec![intent_install(v, "install")?],
            }
        } else {
            several_installs(top)?
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
            installs,
            delete,
        })
    }
}

/// The `installs` array of a format-2 record: at least two, no version and no staged name twice.
fn several_installs(top: Members<'_>) -> Result<Vec<IntentInstall>, JournalDecodeError> {
    let Some(Value::Array(items)) = get(top, "installs") else {
        return Err(malformed("\"installs\" must be an array"));
    };
    if items.len() < 2 {
        return Err(malformed(format!(
            "a format-2 record names at least two installs, this one names {}",
            items.len()
        )));
    }
    let (mut nodes, mut names) = (BTreeSet::new(), BTreeSet::new());
    let mut installs = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let install = intent_install(item, &format!("installs[{n}]"))?;
        if !nodes.insert(install.node.clone()) {
            return Err(malformed(format!(
                "installs[{n}] names {} a second time",
                install.node
            )));
        }
        if !names.insert(install.staged.clone()) {
            return Err(malformed(format!(
                "installs[{n}] names staged tree {:?} a second time",
                install.staged
            )));
        }
        installs.push(install);
    }
    Ok(installs)
}

/// One install object (`what` names it in errors): a version, its staged name, and whether it
/// replaces the installed tree.
fn intent_install(value: &Value, what: &str) -> Result<IntentInstall, JournalDecodeError> {
    let m = object(value, what, INSTALL_FIELDS)?;
    let staged = string(m, "staged")?;
    // The name is joined to the staging directory and to the name of a set-aside tree, so it
    // must be a single plain component.
    if staged.is_empty() || staged.contains(['/', '\\', '\0']) || staged == ".." || staged == "." {
        return Err(malformed(format!(
            "staged name {staged:?} is not a plain name"
        )));
    }
    let replace = match get(m, "replace") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(malformed(format!("{what}: \"replace\" must be a boolean"))),
    };
    Ok(IntentInstall {
        node: node_ref(m)?,
        staged: staged.to_owned(),
        replace,
    })
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

    fn node(id: &str, version: &str) -> NodeRef {
        NodeRef {
            id: PackageId::new(id).unwrap(),
            version: Version::parse(version).unwrap(),
        }
    }

    fn sample() -> Intent {
        Intent {
            from_generation: 6,
            to_generation: 7,
            installs: vec![IntentInstall {
                node: node("a.b", "1.2.3-rc.1"),
                staged: "0000000000000003".to_owned(),
                replace: false,
            }],
            delete: vec![node("c", "0.1.0")],
        }
    }

    /// A transaction of a sync: two new trees and a replacement.
    fn several() -> Intent {
        let mut i = sample();
        i.installs.push(IntentInstall {
            node: node("d", "2.0.0"),
            staged: "0000000000000004".to_owned(),
            replace: false,
        });
        i.installs.push(IntentInstall {
            node: node("e", "1.0.0"),
            staged: "0000000000000005".to_owned(),
            replace: true,
        });
        i
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
            installs: Vec::new(),
            delete: Vec::new(),
            ..i
        };
        assert_eq!(Intent::from_json(&state_only.to_json()), Ok(state_only));
        let mut replacing = sample();
        replacing.installs[0].replace = true;
        assert!(String::from_utf8(replacing.to_json())
            .unwrap()
            .contains("\"replace\": true"));
        assert_eq!(Intent::from_json(&replacing.to_json()), Ok(replacing));
    }

    /// A record with one install or none is format 1, the very bytes earlier builds wrote and
    /// read; several installs make format 2, which round-trips.
    #[test]
    fn journal_record_is_format_1_unless_it_names_several_installs() {
        // What the build before several installs wrote for `sample()`.
        let written_before = r#"{
  "guild_journal": 1,
  "from_generation": 6,
  "to_generation": 7,
  "install": {
    "id": "a.b",
    "version": "1.2.3-rc.1",
    "staged": "0000000000000003"
  },
  "delete": [
    {
      "id": "c",
      "version": "0.1.0"
    }
  ]
}"#;
        assert_eq!(
            String::from_utf8(sample().to_json()).unwrap().trim_end(),
            written_before
        );
        assert_eq!(Intent::from_json(written_before.as_bytes()), Ok(sample()));

        let many = several();
        let text = String::from_utf8(many.to_json()).unwrap();
        assert!(text.contains("\"guild_journal\": 2"), "{text}");
        assert!(text.contains("\"installs\""), "{text}");
        assert!(!text.contains("\"install\":"), "{text}");
        assert_eq!(Intent::from_json(text.as_bytes()), Ok(many));
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
        // A format-1 record does not carry the format-2 array, nor the reverse.
        assert_eq!(
            Intent::from_json(text.replace("\"install\":", "\"installs\":").as_bytes()),
            Err(malformed("the record has unknown field \"installs\""))
        );
        let many = String::from_utf8(several().to_json()).unwrap();
        assert_eq!(
            Intent::from_json(
                many.replace("\"guild_journal\": 2", "\"guild_journal\": 1")
                    .as_bytes()
            ),
            Err(malformed("the record has unknown field \"installs\""))
        );
    }

    #[test]
    fn journal_record_of_several_installs_refuses_repeats_and_a_single_entry() {
        let mut repeated = several();
        repeated.installs[2].node = repeated.installs[0].node.clone();
        assert_eq!(
            Intent::from_json(&repeated.to_json()),
            Err(malformed("installs[2] names a.b@1.2.3-rc.1 a second time"))
        );
        let mut same_tree = several();
        same_tree.installs[1].staged = same_tree.installs[0].staged.clone();
        assert_eq!(
            Intent::from_json(&same_tree.to_json()),
            Err(malformed(
                "installs[1] names staged tree \"0000000000000003\" a second time"
            ))
        );
        // Format 2 with fewer than two installs is not what this build writes: refused, not
        // guessed at.
        let single = r#"{"guild_journal": 2, "from_generation": 6, "to_generation": 7,
            "installs": [{"id": "a", "version": "1.0.0", "staged": "s1"}], "delete": []}"#;
        assert_eq!(
            Intent::from_json(single.as_bytes()),
            Err(malformed(
                "a format-2 record names at least two installs, this one names 1"
            ))
        );
    }
}
