//! Reading and writing the members that fleet documents share: strict objects, integers,
//! digests, hex and key lists. Every failure names the document and the member's path.

use crate::ids::Sha256Digest;
use crate::json::{JsonError, Value};
use crate::trust::TrustedKey;

use super::{DocumentKind, MAX_SPKI_BYTES};

/// Why a fleet document (or its envelope) could not be read or built. Every variant fails
/// closed: a document that cannot be read completely is refused, never read in part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetDocumentError {
    /// The input is larger than the format allows.
    #[error("{document}: the document is {size} bytes; the limit is {limit}")]
    TooLarge {
        /// Which document.
        document: DocumentKind,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// Not JSON as the strict reader accepts it.
    #[error("{document}: not valid JSON: {error}")]
    Json {
        /// Which document.
        document: DocumentKind,
        /// What the reader said.
        error: JsonError,
    },
    /// The format marker is missing or names a format this host does not read.
    #[error("{document}: format {found}; this host reads format 1 (member {marker:?})")]
    UnknownFormat {
        /// Which document.
        document: DocumentKind,
        /// The member that carries the marker.
        marker: &'static str,
        /// What was found there.
        found: String,
    },
    /// A list or map holds more entries than the format allows.
    #[error("{document}: {path} holds {count} entries; at most {limit} are accepted")]
    TooMany {
        /// Which document.
        document: DocumentKind,
        /// The member's path.
        path: String,
        /// How many it holds.
        count: usize,
        /// The most accepted.
        limit: usize,
    },
    /// A member is missing, unknown or malformed.
    #[error("{document}: {path}: {problem}")]
    Field {
        /// Which document.
        document: DocumentKind,
        /// The member's path (`signed.packages[2].key_ids[0]`).
        path: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// A shortened copy of untrusted text for an error message.
pub(crate) fn clip(text: &str) -> String {
    text.chars().take(80).collect()
}

/// One JSON object being read: its members, each looked up by name, unknown ones refused.
pub(crate) struct Obj<'v> {
    pub(crate) doc: DocumentKind,
    pub(crate) path: String,
    members: &'v [(String, Value)],
}

impl<'v> Obj<'v> {
    /// The object `v` at `path`, refusing any member not in `allowed`.
    pub(crate) fn of(
        doc: DocumentKind,
        v: &'v Value,
        path: &str,
        allowed: &[&str],
    ) -> Result<Self, FleetDocumentError> {
        let members = v.as_object().ok_or_else(|| {
            field(
                doc,
                path,
                format!("expected an object, found {}", v.type_name()),
            )
        })?;
        if let Some((k, _)) = members.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            return Err(field(
                doc,
                join(path, k),
                "unknown member: this format has no such field",
            ));
        }
        Ok(Obj {
            doc,
            path: path.to_owned(),
            members,
        })
    }

    pub(crate) fn at(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub(crate) fn err(&self, key: &str, problem: impl Into<String>) -> FleetDocumentError {
        field(self.doc, self.at(key), problem)
    }

    pub(crate) fn opt(&self, key: &str) -> Option<&'v Value> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(crate) fn req(&self, key: &str) -> Result<&'v Value, FleetDocumentError> {
        self.opt(key).ok_or_else(|| self.err(key, "missing"))
    }

    pub(crate) fn string(&self, key: &str) -> Result<&'v str, FleetDocumentError> {
        let v = self.req(key)?;
        v.as_str()
            .ok_or_else(|| self.err(key, format!("expected a string, found {}", v.type_name())))
    }

    /// A string parsed by `parse`, whose error becomes the member's problem.
    pub(crate) fn parsed<T, E: std::fmt::Display>(
        &self,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<T, FleetDocumentError> {
        let text = self.string(key)?;
        parse(text).map_err(|e| self.err(key, e.to_string()))
    }

    pub(crate) fn u64(&self, key: &str) -> Result<u64, FleetDocumentError> {
        let v = self.req(key)?;
        v.as_integer()
            .and_then(|i| i.as_u64())
            .ok_or_else(|| self.err(key, "expected a non-negative integer"))
    }

    pub(crate) fn digest(&self, key: &str) -> Result<Sha256Digest, FleetDocumentError> {
        self.parsed(key, Sha256Digest::parse_hex)
    }

    /// The array member `key`, with at most `limit` elements.
    pub(crate) fn array(&self, key: &str, limit: usize) -> Result<&'v [Value], FleetDocumentError> {
        let v = self.req(key)?;
        let items = v
            .as_array()
            .ok_or_else(|| self.err(key, format!("expected an array, found {}", v.type_name())))?;
        bounded(self.doc, self.at(key), items.len(), limit)?;
        Ok(items)
    }

    /// The object member `key` (a map), with at most `limit` members.
    pub(crate) fn map(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<&'v [(String, Value)], FleetDocumentError> {
        let v = self.req(key)?;
        let members = v
            .as_object()
            .ok_or_else(|| self.err(key, format!("expected an object, found {}", v.type_name())))?;
        bounded(self.doc, self.at(key), members.len(), limit)?;
        Ok(members)
    }
}

pub(crate) fn bounded(
    doc: DocumentKind,
    path: String,
    count: usize,
    limit: usize,
) -> Result<(), FleetDocumentError> {
    if count > limit {
        return Err(FleetDocumentError::TooMany {
            document: doc,
            path,
            count,
            limit,
        });
    }
    Ok(())
}

pub(crate) fn field(
    doc: DocumentKind,
    path: impl Into<String>,
    problem: impl Into<String>,
) -> FleetDocumentError {
    FleetDocumentError::Field {
        document: doc,
        path: path.into(),
        problem: problem.into(),
    }
}

pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Checks the format marker member: it must be the integer 1.
pub(crate) fn check_marker(obj: &Obj<'_>, marker: &'static str) -> Result<(), FleetDocumentError> {
    let found = match obj.opt(marker) {
        None => "(none)".to_owned(),
        Some(Value::Integer(i)) if i.get() == 1 => return Ok(()),
        Some(Value::Integer(i)) => i.get().to_string(),
        Some(other) => other.type_name().to_owned(),
    };
    Err(FleetDocumentError::UnknownFormat {
        document: obj.doc,
        marker,
        found,
    })
}

/// Reads a list of keys `[{"key_id": HEX, "public_key_der": HEX}]` with at most `limit`
/// entries: each key id must be the SHA-256 of its key, and no key may appear twice.
pub(crate) fn read_keys(
    doc: DocumentKind,
    v: &Value,
    path: &str,
    limit: usize,
) -> Result<Vec<TrustedKey>, FleetDocumentError> {
    let items = v.as_array().ok_or_else(|| {
        field(
            doc,
            path,
            format!("expected an array, found {}", v.type_name()),
        )
    })?;
    bounded(doc, path.to_owned(), items.len(), limit)?;
    let mut keys: Vec<TrustedKey> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let o = Obj::of(doc, item, &at, &["key_id", "public_key_der"])?;
        let key_id = o.digest("key_id")?;
        let der = o.parsed("public_key_der", |s| {
            crate::hex::decode(s).ok_or("expected non-empty lowercase hex")
        })?;
        if der.len() > MAX_SPKI_BYTES {
            return Err(o.err(
                "public_key_der",
                format!("{} bytes; a key is at most {MAX_SPKI_BYTES}", der.len()),
            ));
        }
        if Sha256Digest::of(&der) != key_id {
            return Err(o.err("key_id", "is not the SHA-256 of public_key_der"));
        }
        if keys.iter().any(|k| k.key_id == key_id) {
            return Err(o.err("key_id", format!("key {key_id} is listed twice")));
        }
        keys.push(TrustedKey {
            key_id,
            spki_der: der,
        });
    }
    Ok(keys)
}

/// The value [`read_keys`] reads.
pub(crate) fn keys_value(keys: &[TrustedKey]) -> Value {
    Value::Array(
        keys.iter()
            .map(|k| {
                Value::Object(vec![
                    ("key_id".into(), k.key_id.to_hex().into()),
                    (
                        "public_key_der".into(),
                        crate::hex::encode(&k.spki_der).into(),
                    ),
                ])
            })
            .collect(),
    )
}
