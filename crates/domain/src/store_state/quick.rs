//! A package record laid out as every writer lays it out (`encode_package`, compact), read byte
//! by byte: the members in the writer's order, matched as literal text, instead of each key read
//! as a JSON string and looked up. What it does not recognise (whitespace, an escape, a
//! quarantine, added signatures, dependencies, another order) it leaves to the JSON cursor
//! ([`super::read_package`]), which reads or refuses it, so that what is accepted and refused
//! does not depend on the way a record was read: each value goes through the same parsing
//! functions, and a unit test holds the two readers to each other on written and damaged
//! records.

use std::sync::Arc;

use super::bytes::Bytes;
use super::{parse_kind, parse_state, PackageRecord, VersionRecord};
use crate::ids::{ImplId, PackageId, PublisherId, Sha256Digest};
use crate::manifest_facts::ManifestFacts;
use crate::vec_map::VecMap;
use crate::version::Version;

/// What [`package`] reads beyond [`Bytes`]' own.
impl<'t> Bytes<'t> {
    /// A digest: a string of exactly 64 lowercase hex digits, read without first looking for
    /// the string's end (the digits leave no room for a quote, an escape or a control byte).
    fn digest(&mut self) -> Option<Sha256Digest> {
        self.eat(b'"')?;
        let digits = self.text.get(self.at..self.at + 64)?;
        let digest = Sha256Digest::parse_hex(digits).ok()?;
        self.at += 64;
        self.eat(b'"')?;
        Some(digest)
    }

    /// A list of strings, each read by `item`.
    fn strings<T>(&mut self, mut item: impl FnMut(&'t str) -> Option<T>) -> Option<Vec<T>> {
        self.list(|b| item(b.string()?))
    }

    /// A list, each item read by `item`.
    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        self.literal("[")?;
        if self.literal("]").is_some() {
            return Some(Vec::new());
        }
        // Most lists a record holds (its signing keys, its impl ids) have one item: room for
        // exactly one, where a first push would make room for four (96 bytes more per key, for
        // each of a large store's records).
        let mut items = Vec::with_capacity(1);
        loop {
            items.push(item(self)?);
            if self.literal("]").is_some() {
                return Some(items);
            }
            self.literal(",")?;
        }
    }
}

/// The package record at byte `at` of `text`, with where it ends, when it is laid out as the
/// writer lays it out; `None` for any other record, which the caller reads with the cursor.
pub(super) fn package(text: &str, at: usize) -> Option<((PackageId, PackageRecord), usize)> {
    let mut b = Bytes::new(text, at);
    b.literal("{\"id\":")?;
    let id = PackageId::new(b.string()?).ok()?;
    let previous = match b.literal(",\"previous\":") {
        Some(()) => Some(Version::parse(b.string()?).ok()?),
        None => None,
    };
    b.literal(",\"versions\":[")?;
    let mut versions = VecMap::with_capacity(1);
    loop {
        let (version, record) = version(&mut b)?;
        versions.insert(version, record).is_none().then_some(())?;
        if b.literal("]}").is_some() {
            break;
        }
        b.literal(",")?;
    }
    Some(((id, PackageRecord { versions, previous }), b.at))
}

/// One version record ([`package`]).
fn version(b: &mut Bytes<'_>) -> Option<(Version, VersionRecord)> {
    b.literal("{\"version\":")?;
    let version = Version::parse(b.string()?).ok()?;
    b.literal(",\"state\":")?;
    let state = parse_state(b.string()?).ok()?;
    b.literal(",\"kind\":")?;
    let kind = parse_kind(b.string()?).ok()?;
    b.literal(",\"publisher\":")?;
    let publisher = PublisherId::new(b.string()?).ok()?;
    b.literal(",\"payload_sha256\":")?;
    let payload_digest = b.digest()?;
    let trusted_under = match b.literal(",\"trusted_under\":") {
        Some(()) => Some(b.digest()?),
        None => None,
    };
    let signed_by = match b.literal(",\"signed_by\":") {
        Some(()) => b.list(Bytes::digest)?,
        None => Vec::new(),
    };
    let facts = match b.literal(",\"manifest\":") {
        Some(()) => Some(Arc::new(facts(b)?)),
        None => None,
    };
    b.literal("}")?;
    Some((
        version,
        VersionRecord {
            payload_digest,
            kind,
            publisher,
            state,
            taint: None,
            trusted_under,
            signatures: Vec::new(),
            signed_by,
            facts,
        },
    ))
}

/// A version's manifest facts without dependencies ([`package`]).
fn facts(b: &mut Bytes<'_>) -> Option<ManifestFacts> {
    b.literal("{")?;
    let module_abi = match b.literal("\"module_abi\":") {
        Some(()) => {
            let abi = u32::try_from(b.digits(19)?).ok()?;
            b.literal(",")?;
            Some(abi)
        }
        None => None,
    };
    b.literal("\"provided_ops\":")?;
    let provided_ops = b.strings(|s| ImplId::new(s).ok())?;
    b.literal("}")?;
    Some(ManifestFacts {
        module_abi,
        provided_ops,
        dependencies: Vec::new(),
        module_dependencies: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dependency::Dependency;
    use crate::ids::PackageKind;
    use crate::json::Cursor;
    use crate::manifest::{SignatureAlgorithm, SignatureEntry};
    use crate::store_state::{
        encode_package, read_package, read_package_generic, NewVersion, PublishOptions, StoreState,
        Taint,
    };
    use crate::version::VersionRange;

    /// Records of every shape a writer writes: with and without facts, signing keys, a trust
    /// file, a rollback target, a pre-release version, added signatures, dependencies and a
    /// quarantine (the last three only the cursor reads), each written as the writer does.
    fn written_records() -> Vec<String> {
        let key = |n: &str| Sha256Digest::of(n.as_bytes());
        let id = |s: &str| PackageId::new(s).unwrap();
        let v = |s: &str| Version::parse(s).unwrap();
        let mut state = StoreState::new();
        let mut publish = |pkg: &str, version: &str, signed_by: Vec<Sha256Digest>, facts| {
            let new = NewVersion {
                payload_digest: Sha256Digest::of(format!("{pkg} {version}").as_bytes()),
                kind: PackageKind::Module,
                publisher: PublisherId::new("org.example").unwrap(),
                signed_by,
                facts,
            };
            let options = PublishOptions {
                enable: true,
                allow_downgrade: false,
            };
            state.publish(&id(pkg), &v(version), new, options).unwrap();
        };
        let facts = |abi: Option<u32>, ops: &[&str], deps: Vec<Dependency>| ManifestFacts {
            module_abi: abi,
            provided_ops: ops.iter().map(|o| ImplId::new(*o).unwrap()).collect(),
            dependencies: deps,
            module_dependencies: Vec::new(),
        };
        publish("a.plain", "1.0.0", Vec::new(), None);
        publish(
            "b.signed",
            "1.0.0",
            vec![key("k1")],
            Some(facts(Some(u32::MAX), &["b.op.cpu"], Vec::new())),
        );
        publish(
            "b.signed",
            "2.0.0",
            vec![key("k1"), key("k2")],
            Some(facts(None, &[], Vec::new())),
        );
        publish(
            "c.pre",
            "1.0.0-rc.1+build.5",
            vec![key("k2")],
            Some(facts(Some(0), &["c.a", "c.b"], Vec::new())),
        );
        let dep = Dependency {
            package_id: id("a.plain"),
            range: VersionRange::new(v("1.0.0"), Some(v("2.0.0"))).unwrap(),
        };
        publish(
            "d.deps",
            "1.0.0",
            vec![key("k1")],
            Some(facts(Some(1), &["d.op"], vec![dep])),
        );
        publish("e.signatures", "1.0.0", vec![key("k1")], None);
        publish("f.tainted", "1.0.0", vec![key("k1")], None);
        state.set_trusted_under(&id("b.signed"), &v("2.0.0"), key("trust"));
        state.set_trusted_under(&id("c.pre"), &v("1.0.0-rc.1+build.5"), key("trust"));
        let signature = SignatureEntry {
            key_id: key("k3"),
            algorithm: SignatureAlgorithm::EcdsaP256Sha256,
            signature: vec![1, 2, 3],
        };
        let added =
            state.add_signatures(&id("e.signatures"), &v("1.0.0"), &[key("k1")], &[signature]);
        assert_eq!(added, 1);
        let taint = Taint {
            reason: "a \"quoted\" reason".to_owned(),
            file: Some("lib/x.so".to_owned()),
        };
        state.taint(&id("f.tainted"), &v("1.0.0"), taint).unwrap();
        state
            .packages()
            .map(|(id, record)| encode_package(id, record).to_compact_string())
            .collect()
    }

    /// What each reader makes of the record at the start of `text`: the record and where it
    /// ends, or `None`.
    fn both(text: &str) -> [Option<((PackageId, PackageRecord), usize)>; 2] {
        let quick = package(text, 0);
        let mut c = Cursor::of_str(text);
        let generic = read_package_generic(&mut c).map(|read| (read, c.position()));
        [quick, generic]
    }

    /// Whatever the quick reader reads, the cursor reads the same, ending at the same byte;
    /// whatever the cursor refuses, the quick reader does not read. On every record a writer
    /// writes and on every one-byte change, deletion and insertion of a space in each.
    #[test]
    fn the_quick_record_reader_answers_as_the_cursor_on_written_and_damaged_records() {
        let records = written_records();
        assert_eq!(records.len(), 6);
        let mut quick_read = 0;
        let mut cases_read = 0;
        for record in &records {
            let [quick, generic] = both(record);
            assert!(generic.is_some(), "{record}");
            if quick.is_some() {
                assert_eq!(quick, generic, "{record}");
                quick_read += 1;
            }
            let mut cases = Vec::new();
            for (i, _) in record.char_indices() {
                for with in [
                    "\"", "\\", " ", "0", "9", "a", "A", ".", "e", "-", "[", "]", "{", "}", ",",
                    ":", "\u{1}", "é", "",
                ] {
                    cases.push(format!("{}{with}{}", &record[..i], &record[i + 1..]));
                }
                cases.push(format!("{} {}", &record[..i], &record[i..]));
            }
            for case in &cases {
                // The record followed by what follows one in a checkpoint.
                let text = format!("{case},{{}}");
                let [quick, generic] = both(&text);
                if quick.is_some() {
                    assert_eq!(quick, generic, "{case}");
                    cases_read += 1;
                }
                // `read_package`, the two together, after whitespace as in an indented array.
                let spaced = format!(" {text}");
                let mut c = Cursor::of_str(&spaced);
                let read = read_package(&mut c).map(|read| (read, c.position() - 1));
                assert_eq!(read, generic, "{case}");
            }
        }
        // Every record but those with dependencies, added signatures or a quarantine, and of
        // their changes those that are still records in the writer's layout (a changed digit of
        // a digest, a letter of an id).
        assert_eq!(quick_read, 3);
        assert!(cases_read > 100, "{cases_read}");
    }
}
