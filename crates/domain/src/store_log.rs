//! The change one commit makes to the store state, as the store's log records it.
//!
//! A store keeps the store state as a checkpoint (the whole [`StoreState`] at some generation)
//! followed by a log with one frame per later commit. A frame holds a [`StoreStateDelta`]: the new
//! generation, the whole [`PackageRecord`] of every package whose record changed (or its
//! deletion), and the trust anchor when it changed. Writing only that keeps the cost of a commit
//! proportional to what it changes, not to the size of the store.
//!
//! One change touches every package and says little: after a trust change, the next writer checks
//! every version's signatures again and records the new trust file in each
//! ([`VersionRecord::trusted_under`]). Such a delta says so in one member ([`Retrust`]) instead
//! of re-recording every package, so that its frame does not grow with the store (at 10,000
//! packages it was 4.3 MB, and made the same commit rewrite the checkpoint).
//!
//! Every store state invariant concerns one package, so a state that was valid stays valid after a
//! delta when the packages the delta names are valid: [`StoreState::apply`] checks exactly
//! those ([`StoreState::validate_packages`]); a retrust changes no invariant.
//!
//! The encoding is strict JSON in the style of the registry file (`"guild_registry_delta": 1`,
//! or 2 for a delta with a retrust, so that a build that does not know one refuses it; unknown
//! fields, duplicates and `null` refused). The framing around it (length, checksum) is the
//! store's business.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::chunk_map::Difference;
use crate::fleet::FleetMembership;
use crate::ids::{PackageId, Sha256Digest};
use crate::json::{self, BorrowedValue, Cursor, JsonPath, Value};
use crate::lifecycle::State;
use crate::store_state::listing::{Listing, ListingRow};
use crate::store_state::{
    decode_fleet, decode_package, decode_trust, encode_fleet, encode_package, encode_trust, field,
    format_of, once, read_package_of, wrong_type, ApplyError, At, FieldProblem, Fields,
    PackageRecord, StoreState, StoreStateDecodeError, VersionRecord,
};
use crate::trust::TrustAnchor;

pub use crate::store_state::{REGISTRY_DELTA_FORMAT_V1, REGISTRY_DELTA_FORMAT_V2};

const TOP_FIELDS: &[&str] = &[
    "guild_registry_delta",
    "generation",
    "trust",
    "fleet",
    "retrust",
    "packages",
    "deleted",
];

const RETRUST_FIELDS: &[&str] = &["sha256", "versions"];

/// Which versions a [`Retrust`] re-records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetrustScope {
    /// Enabled versions (`"enabled"`): what opening a store checks again.
    Enabled,
    /// Installed versions, enabled, disabled or superseded (`"installed"`): what the full check
    /// checks again.
    Installed,
}

impl RetrustScope {
    fn covers(self, state: State) -> bool {
        match self {
            RetrustScope::Enabled => state.is_enabled(),
            RetrustScope::Installed => state.is_installed(),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            RetrustScope::Enabled => "enabled",
            RetrustScope::Installed => "installed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "enabled" => Some(RetrustScope::Enabled),
            "installed" => Some(RetrustScope::Installed),
            _ => None,
        }
    }
}

/// The part of a delta that re-records trust (the `retrust` member): every version of
/// [`Self::versions`] of every package the state before the delta records, except the packages
/// the delta names (changed or deleted), is recorded as trusted under the trust file with digest
/// [`Self::trusted_under`] ([`VersionRecord::trusted_under`]); nothing else of those packages
/// changes. It applies only to a state whose trust anchor, after the delta, records that very
/// file ([`ApplyError::Retrust`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retrust {
    /// The trust file's digest ([`TrustAnchor::file_digest`]).
    pub trusted_under: Sha256Digest,
    /// Which versions it re-records.
    pub versions: RetrustScope,
}

impl Retrust {
    /// Whether `package` is left as it is.
    fn settles(&self, package: &PackageRecord) -> bool {
        package.versions().all(|(_, r)| {
            !self.versions.covers(r.state) || r.trusted_under == Some(self.trusted_under)
        })
    }

    /// Whether `after` is `before` re-recorded.
    fn makes(&self, before: &PackageRecord, after: &PackageRecord) -> bool {
        before.previous() == after.previous()
            && before.versions().count() == after.versions().count()
            && before
                .versions()
                .zip(after.versions())
                .all(|((vb, b), (va, a))| {
                    vb == va
                        && if self.versions.covers(b.state) {
                            a.trusted_under == Some(self.trusted_under) && same_but_trust(b, a)
                        } else {
                            b == a
                        }
                })
    }

    /// Re-records `package` in place.
    fn apply_to(&self, package: &mut PackageRecord) {
        for (_, r) in package.versions_mut() {
            if self.versions.covers(r.state) {
                r.trusted_under = Some(self.trusted_under);
            }
        }
    }

    fn encode(&self) -> Value {
        Value::Object(vec![
            (
                "sha256".to_owned(),
                Value::from(self.trusted_under.to_hex()),
            ),
            ("versions".to_owned(), Value::from(self.versions.as_str())),
        ])
    }

    fn decode(value: &BorrowedValue<'_>, at: At<'_>) -> Result<Self, StoreStateDecodeError> {
        let f = Fields::of(value, at, RETRUST_FIELDS)?;
        let trusted_under = f.parsed("sha256", |s| {
            Sha256Digest::parse_hex(s).map_err(|e| e.to_string())
        })?;
        let versions = f.parsed("versions", |s| {
            RetrustScope::parse(s).ok_or_else(|| {
                format!("{s:?} is not a set of versions (\"enabled\" or \"installed\")")
            })
        })?;
        Ok(Retrust {
            trusted_under,
            versions,
        })
    }
}

/// Whether two records of one version are equal but for the trust file they record.
fn same_but_trust(a: &VersionRecord, b: &VersionRecord) -> bool {
    // Every field named, so that a new one is not forgotten here.
    let VersionRecord {
        payload_digest,
        kind,
        publisher,
        state,
        taint,
        trusted_under: _,
        signatures,
        signed_by,
        facts,
    } = a;
    *payload_digest == b.payload_digest
        && *kind == b.kind
        && *publisher == b.publisher
        && *state == b.state
        && *taint == b.taint
        && *signatures == b.signatures
        && *signed_by == b.signed_by
        && *facts == b.facts
}

/// What one commit changed in the store state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreStateDelta {
    /// The generation the commit made; the state it applies to is one below.
    pub generation: u64,
    /// The new trust anchor, when the commit changed it.
    pub trust: Option<TrustAnchor>,
    /// The new fleet membership, when the commit changed it.
    pub fleet: Option<FleetMembership>,
    /// The trust file recorded for the versions of every package the delta does not name, when
    /// the commit re-recorded them all ([`Retrust`]).
    pub retrust: Option<Retrust>,
    /// Each package whose record changed: its whole new record (shared with the state it came
    /// from), or `None` if it was deleted.
    pub packages: BTreeMap<PackageId, Option<Arc<PackageRecord>>>,
}

/// Why two states cannot be told apart by a delta.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    /// The newer state has no trust anchor where the older one had one; a delta only sets an
    /// anchor (and the store refuses to lose one anyway).
    #[error("the new store state drops the record of the trust file")]
    DropsTrust,
    /// The newer state has no fleet membership where the older one had one; a store does not
    /// leave its fleet through a commit.
    #[error("the new store state drops the record of the store's fleet")]
    DropsFleet,
}

impl StoreState {
    /// Applies `delta`, the change of one commit, in place. Refuses, leaving the state as it
    /// was, a delta that is not for the next generation, that leaves a changed package breaking
    /// an invariant (only the packages it changes are checked), or whose retrust records a trust
    /// file other than the one the state records after it.
    pub fn apply(&mut self, delta: &StoreStateDelta) -> Result<(), ApplyError> {
        if let Some(retrust) = &delta.retrust {
            let anchor = delta
                .trust
                .as_ref()
                .or(self.trust_anchor())
                .map(|a| a.file_digest);
            if anchor != Some(retrust.trusted_under) {
                return Err(ApplyError::Retrust {
                    retrust: retrust.trusted_under,
                    anchor,
                });
            }
        }
        self.apply_change(
            delta.generation,
            delta.trust.as_ref(),
            delta.fleet.as_ref(),
            &delta.packages,
        )?;
        if let Some(retrust) = &delta.retrust {
            // Only the records it changes are copied (and only their chunks of the map).
            self.shared_packages_mut().update_where(
                |id, p| !delta.packages.contains_key(id) && !retrust.settles(p),
                |_, p| retrust.apply_to(Arc::make_mut(p)),
            );
        }
        Ok(())
    }
}

impl Listing {
    /// Applies `delta`, the change of one commit: the rows of the packages it changes are made
    /// again from their new records, those it deletes go. Refuses, changing nothing, a delta
    /// that is not for the next generation or whose changed packages break an invariant, as
    /// [`StoreState::apply`] does.
    pub fn apply(&mut self, delta: &StoreStateDelta) -> Result<(), ApplyError> {
        // The same checks as the state's own apply, on the facts with the changed packages.
        let mut facts = self.facts().clone();
        facts.apply(delta)?;
        let changes = delta.packages.iter().map(|(id, record)| {
            let made = record.as_deref().and_then(|r| ListingRow::of(id, r));
            (id.clone(), made)
        });
        self.replace(changes, facts);
        Ok(())
    }
}

impl StoreStateDelta {
    /// The change from `old` to `new`, package by package. A record that `new` shares with `old`
    /// (a draft made by [`StoreState::successor`] shares every record it did not write to) is
    /// unchanged without being compared; others are compared with `==`.
    ///
    /// When some changed packages differ from `old` only in recording `new`'s trust file for
    /// their enabled (or installed) versions, and every package the delta would not name
    /// already records it for those, the delta says so with a [`Retrust`] and names the others
    /// only: the same new state in fewer bytes (a retrust member is shorter than the smallest
    /// record it replaces). Only then is every package of `old` looked at.
    pub fn between(old: &StoreState, new: &StoreState) -> Result<Self, DeltaError> {
        let trust = match (old.trust_anchor(), new.trust_anchor()) {
            (Some(_), None) => return Err(DeltaError::DropsTrust),
            (a, b) if a == b => None,
            (_, b) => b.cloned(),
        };
        let fleet = match (old.fleet(), new.fleet()) {
            (Some(_), None) => return Err(DeltaError::DropsFleet),
            (a, b) if a == b => None,
            (_, b) => b.cloned(),
        };
        let mut packages = BTreeMap::new();
        // Chunks of the package map that both states share hold the same records: only the
        // others are walked, so a draft is compared at the cost of what it changed.
        for difference in old.shared_packages().differences(new.shared_packages()) {
            match difference {
                Difference::Removed(id, _) => {
                    packages.insert(id.clone(), None);
                }
                Difference::Added(id, record) => {
                    packages.insert(id.clone(), Some(Arc::clone(record)));
                }
                Difference::Both(id, before, after) => {
                    if !Arc::ptr_eq(before, after) && before != after {
                        packages.insert(id.clone(), Some(Arc::clone(after)));
                    }
                }
            }
        }
        let retrust = new
            .trust_anchor()
            .and_then(|a| retrust_of(old, &mut packages, a.file_digest));
        Ok(StoreStateDelta {
            generation: new.generation(),
            trust,
            fleet,
            retrust,
            packages,
        })
    }

    /// The ids the delta changes or deletes; a retrust changes the others.
    pub fn changed_ids(&self) -> impl Iterator<Item = &PackageId> + '_ {
        self.packages.keys()
    }

    /// The delta as compact JSON (no whitespace: a log frame is read by programs only, and
    /// indentation was a third of its bytes); equal deltas give equal bytes.
    pub fn to_json(&self) -> Vec<u8> {
        // Written a package at a time, as a checkpoint is (a commit that records a new trust
        // file for every version changes every package): the bytes are those of the delta's
        // tree's compact form (checked in `store_state_delta_fast_reader_agrees_with_the_tree_reader`).
        let mut out = String::new();
        out.push('{');
        json::write_compact_members(&mut out, &self.head());
        out.push_str(",\"packages\":");
        let changed = self
            .packages
            .iter()
            .filter_map(|(id, p)| p.as_ref().map(|p| encode_package(id, p)));
        json::write_compact_array(&mut out, changed);
        out.push_str(",\"deleted\":");
        json::write_compact_array(&mut out, self.deleted());
        out.push('}');
        out.into_bytes()
    }

    /// The ids of the packages the delta deletes, as JSON strings.
    fn deleted(&self) -> impl Iterator<Item = Value> + '_ {
        self.packages
            .iter()
            .filter(|(_, p)| p.is_none())
            .map(|(id, _)| Value::from(id.as_str()))
    }

    /// The members of the delta's JSON object before its packages.
    fn head(&self) -> Vec<(String, Value)> {
        let format = match self.retrust {
            None => REGISTRY_DELTA_FORMAT_V1,
            Some(_) => REGISTRY_DELTA_FORMAT_V2,
        };
        let mut top = vec![
            ("guild_registry_delta".to_owned(), Value::from(format)),
            ("generation".to_owned(), Value::from(self.generation)),
        ];
        if let Some(t) = &self.trust {
            top.push(("trust".to_owned(), encode_trust(t)));
        }
        if let Some(f) = &self.fleet {
            top.push(("fleet".to_owned(), encode_fleet(f)));
        }
        if let Some(r) = &self.retrust {
            top.push(("retrust".to_owned(), r.encode()));
        }
        top
    }

    /// The delta's JSON document as one tree.
    #[cfg(test)]
    fn to_tree(&self) -> Value {
        let mut top = self.head();
        let changed = self
            .packages
            .iter()
            .filter_map(|(id, p)| p.as_ref().map(|p| encode_package(id, p)))
            .collect();
        top.push(("packages".to_owned(), Value::Array(changed)));
        top.push(("deleted".to_owned(), Value::Array(self.deleted().collect())));
        Value::Object(top)
    }

    /// Reads a delta written by [`Self::to_json`], strictly. Each changed package must be
    /// well formed; whether it keeps the invariants is for [`StoreState::apply`] to say.
    pub fn from_json(bytes: &[u8]) -> Result<Self, StoreStateDecodeError> {
        // Straight from the text; a delta that this refuses is read again as a tree, to name
        // what is wrong (see `StoreState::from_json_of`).
        match Self::read_json(bytes, None) {
            Some(delta) => Ok(delta),
            None => Self::from_tree(bytes),
        }
    }

    /// [`Self::from_json`] through the tree [`json::parse_borrowed`] makes, naming the error.
    fn from_tree(bytes: &[u8]) -> Result<Self, StoreStateDecodeError> {
        let value = json::parse_borrowed(bytes)?;
        let (members, format) = format_of(
            &value,
            "guild_registry_delta",
            &[REGISTRY_DELTA_FORMAT_V1, REGISTRY_DELTA_FORMAT_V2],
        )
        .map_err(|e| match e {
            StoreStateDecodeError::NotARegistry => StoreStateDecodeError::NotADelta,
            StoreStateDecodeError::UnsupportedFormat { found } => {
                StoreStateDecodeError::UnsupportedDeltaFormat { found }
            }
            e => e,
        })?;
        let root = At::Root;
        let fields = Fields::new(members, root, TOP_FIELDS)?;
        let generation = fields.u64("generation")?;
        let trust = match fields.get("trust") {
            None => None,
            Some(t) => Some(decode_trust(t, root.key("trust"))?),
        };
        let fleet = match fields.get("fleet") {
            None => None,
            Some(f) => Some(decode_fleet(f, root.key("fleet"))?),
        };
        let retrust = match fields.get("retrust") {
            None => None,
            Some(_) if format == REGISTRY_DELTA_FORMAT_V1 => {
                return Err(field(
                    root.key("retrust").path(),
                    FieldProblem::Invalid {
                        detail: format!(
                            "a retrust needs \"guild_registry_delta\": {REGISTRY_DELTA_FORMAT_V2}, \
                             not {REGISTRY_DELTA_FORMAT_V1}"
                        ),
                    },
                ))
            }
            Some(r) => Some(Retrust::decode(r, root.key("retrust"))?),
        };
        let mut packages = BTreeMap::new();
        let duplicate = |path: JsonPath, id: &PackageId| {
            field(
                path,
                FieldProblem::Duplicate {
                    what: "package",
                    value: id.to_string(),
                },
            )
        };
        let packages_at = root.key("packages");
        for (i, item) in fields.array("packages")?.iter().enumerate() {
            let at = packages_at.index(i);
            let (id, record) = decode_package(item, at)?;
            if packages.contains_key(&id) {
                return Err(duplicate(at.path().key("id"), &id));
            }
            packages.insert(id, Some(Arc::new(record)));
        }
        let deleted_at = root.key("deleted");
        for (i, item) in fields.array("deleted")?.iter().enumerate() {
            let path = deleted_at.index(i).path();
            let s = item
                .as_str()
                .ok_or_else(|| wrong_type(path.clone(), "string", item))?;
            let id = PackageId::new(s).map_err(|e| {
                field(
                    path.clone(),
                    FieldProblem::Invalid {
                        detail: e.to_string(),
                    },
                )
            })?;
            if packages.contains_key(&id) {
                return Err(duplicate(path, &id));
            }
            packages.insert(id, None);
        }
        Ok(StoreStateDelta {
            generation,
            trust,
            fleet,
            retrust,
            packages,
        })
    }
}

impl StoreStateDelta {
    /// [`Self::from_json`] for a reader of one package ([`StoreState::from_any_json_only`]): the
    /// delta keeps the change to package `only` (if it makes one) and the store-wide facts (a
    /// retrust among them, which applies to `only` when the delta does not name it), and
    /// passes over every other package's record without building it. Inside those it checks
    /// the JSON grammar but not the fields, as [`StoreState::from_any_json_only`] says; the
    /// store checks each frame's SHA-256 before decoding it, so damage to a frame is refused
    /// before this reads it.
    pub fn from_json_only(bytes: &[u8], only: &PackageId) -> Result<Self, StoreStateDecodeError> {
        match Self::read_json(bytes, Some(only)) {
            Some(delta) => Ok(delta),
            None => {
                let mut delta = Self::from_json(bytes)?;
                delta.packages.retain(|id, _| id == only);
                Ok(delta)
            }
        }
    }

    /// [`Self::from_json`] without the tree: `None` for whatever it would refuse. With `only`,
    /// the delta keeps that package's change alone and the other records are passed over
    /// ([`Self::from_json_only`] says what that leaves unchecked); every deleted id is still
    /// read as an id.
    fn read_json(bytes: &[u8], only: Option<&PackageId>) -> Option<Self> {
        let mut c = Cursor::new(bytes)?;
        let mut format = None;
        let mut generation = None;
        let mut trust = None;
        let mut fleet = None;
        let mut retrust = None;
        let mut changed = None;
        let mut deleted = None;
        c.object(|c, key| match key {
            "guild_registry_delta" => once(
                &mut format,
                c.u64()
                    .filter(|f| [REGISTRY_DELTA_FORMAT_V1, REGISTRY_DELTA_FORMAT_V2].contains(f))?,
            ),
            "generation" => once(&mut generation, c.u64()?),
            "trust" => once(&mut trust, decode_trust(&c.value()?, At::Root).ok()?),
            "fleet" => once(&mut fleet, decode_fleet(&c.value()?, At::Root).ok()?),
            "retrust" => once(&mut retrust, Retrust::decode(&c.value()?, At::Root).ok()?),
            "packages" => {
                let mut list = Vec::new();
                c.array(|c| {
                    list.extend(read_package_of(c, only)?);
                    Some(())
                })?;
                once(&mut changed, list)
            }
            "deleted" => {
                let mut list = Vec::new();
                c.array(|c| {
                    let id = PackageId::new(c.str()?.into_owned()).ok()?;
                    if only.is_none_or(|only| *only == id) {
                        list.push(id);
                    }
                    Some(())
                })?;
                once(&mut deleted, list)
            }
            _ => None,
        })?;
        if !c.at_end() {
            return None;
        }
        if format? == REGISTRY_DELTA_FORMAT_V1 && retrust.is_some() {
            return None;
        }
        let mut packages = BTreeMap::new();
        for (id, record) in changed? {
            if packages.insert(id, Some(Arc::new(record))).is_some() {
                return None;
            }
        }
        for id in deleted? {
            if packages.insert(id, None).is_some() {
                return None;
            }
        }
        Some(StoreStateDelta {
            generation: generation?,
            trust,
            fleet,
            retrust,
            packages,
        })
    }
}

/// The retrust under `digest` that the change `packages` from `old` makes, if there is one: the
/// packages it re-records are taken out of `packages`. Of the two scopes, the one that leaves
/// fewer packages named; none when neither re-records a package, or when some package left
/// unnamed would change under it.
fn retrust_of(
    old: &StoreState,
    packages: &mut BTreeMap<PackageId, Option<Arc<PackageRecord>>>,
    digest: Sha256Digest,
) -> Option<Retrust> {
    let mut best: Option<(Retrust, Vec<PackageId>)> = None;
    for versions in [RetrustScope::Enabled, RetrustScope::Installed] {
        let retrust = Retrust {
            trusted_under: digest,
            versions,
        };
        let made: Vec<PackageId> = packages
            .iter()
            .filter_map(|(id, after)| {
                let before = old.package(id)?;
                retrust.makes(before, after.as_ref()?).then(|| id.clone())
            })
            .collect();
        if made.is_empty() || best.as_ref().is_some_and(|(_, b)| b.len() >= made.len()) {
            continue;
        }
        // The rule covers every package it does not name: those the change leaves as they are
        // must be as it would leave them.
        let settled = old
            .packages()
            .all(|(id, p)| packages.contains_key(id) || retrust.settles(p));
        if settled {
            best = Some((retrust, made));
        }
    }
    let (retrust, made) = best?;
    for id in &made {
        packages.remove(id);
    }
    Some(retrust)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{PackageKind, PublisherId, Sha256Digest};
    use crate::store_state::{NewVersion, PublishOptions};
    use crate::trust::TrustBinding;
    use crate::version::Version;

    fn publish(state: &mut StoreState, name: &str) {
        let new = NewVersion {
            payload_digest: Sha256Digest::of(name.as_bytes()),
            kind: PackageKind::Module,
            publisher: PublisherId::new("org.example").unwrap(),
            signed_by: vec![Sha256Digest::of(b"key")],
            facts: None,
        };
        let options = PublishOptions {
            enable: true,
            allow_downgrade: false,
        };
        let id = PackageId::new(name).unwrap();
        state
            .publish(&id, &Version::new(1, 0, 0), new, options)
            .unwrap();
    }

    /// The reader that decodes straight from the text answers what the tree reader answers for
    /// every delta the tree reader accepts, and refuses every delta it refuses.
    #[test]
    fn store_state_delta_fast_reader_agrees_with_the_tree_reader() {
        let mut old = StoreState::new();
        publish(&mut old, "a");
        publish(&mut old, "b");
        let mut new = old.successor();
        publish(&mut new, "c");
        new.disable(&PackageId::new("a").unwrap()).unwrap();
        let b = PackageId::new("b").unwrap();
        new.remove(&b, &Version::new(1, 0, 0)).unwrap();
        new.purge(&b, None).unwrap();
        new.set_trust_anchor(TrustAnchor {
            binding: TrustBinding {
                store_id: "0123456789abcdef0123456789abcdef".to_owned(),
                generation: 2,
            },
            file_digest: Sha256Digest::of(b"trust"),
            revoked_keys: BTreeMap::new(),
            revoked_digests: BTreeMap::new(),
        });
        let delta = StoreStateDelta::between(&old, &new).unwrap();
        // Written a package at a time, each is its tree's compact form (a changed package, a
        // deleted one, a trust record; and none).
        for d in [
            &delta,
            &StoreStateDelta::between(&old, &old.successor()).unwrap(),
        ] {
            assert_eq!(
                String::from_utf8(d.to_json()).unwrap(),
                d.to_tree().to_compact_string()
            );
        }
        // Indented, so that the cases below can name members with their spacing.
        let pretty = |bytes: &[u8]| json::parse(bytes).unwrap().to_pretty_string();
        let good = pretty(&delta.to_json());
        let compact = String::from_utf8(delta.to_json()).unwrap();
        let empty = pretty(
            &StoreStateDelta::between(&old, &old.successor())
                .unwrap()
                .to_json(),
        );
        for text in [
            &good,
            &compact,
            &empty,
            &good.replace("\"generation\"", "\"gener\\u0061tion\""),
        ] {
            let tree = StoreStateDelta::from_tree(text.as_bytes());
            assert!(tree.is_ok(), "{text}: {tree:?}");
            assert_eq!(
                StoreStateDelta::read_json(text.as_bytes(), None),
                tree.ok(),
                "{text}"
            );
        }
        assert_eq!(
            StoreStateDelta::read_json(good.as_bytes(), None),
            Some(delta)
        );
        let refused = [
            good.replace("\"deleted\": [", "\"extra\": 1, \"deleted\": ["),
            good.replace("\"guild_registry_delta\": 1", "\"guild_registry_delta\": 9"),
            good.replace("\"deleted\": [", "\"deleted\": [\"c\", "),
            good.replace("\"deleted\": [", "\"deleted\": [7, "),
            good.replacen("\"generation\": ", "\"generation\": 1, \"generation\": ", 1),
            format!("{good} {{}}"),
            good[..good.len() / 2].to_owned(),
        ];
        refused_by_both_readers(&refused);
    }

    /// A frame of a format this build does not read, or with no format marker, is refused in
    /// the words of a log frame, not of a checkpoint's format.
    #[test]
    fn a_frame_of_another_format_is_refused_as_a_log_frame() {
        let err = StoreStateDelta::from_json(
            br#"{"guild_registry_delta":9,"generation":2,"packages":[],"deleted":[]}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "log frame format 9 is not supported; this build reads formats 1 (changes) and 2 \
             (changes with a retrust)"
        );
        let err = StoreStateDelta::from_json(br#"{"generation":2,"packages":[],"deleted":[]}"#)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a log frame: the top level is not an object with a \"guild_registry_delta\" \
             format marker"
        );
    }

    /// Asserts that both readers refuse each of `refused`.
    fn refused_by_both_readers(refused: &[String]) {
        for text in refused {
            assert!(
                StoreStateDelta::from_tree(text.as_bytes()).is_err(),
                "{text}"
            );
            assert_eq!(
                StoreStateDelta::read_json(text.as_bytes(), None),
                None,
                "{text}"
            );
        }
    }

    /// The same for a delta with a retrust: written as its tree's compact form, read alike by
    /// both readers, refused alike.
    #[test]
    fn store_state_delta_fast_reader_agrees_with_the_tree_reader_on_a_retrust() {
        let mut old = StoreState::new();
        publish(&mut old, "a");
        publish(&mut old, "b");
        let trust = TrustAnchor {
            binding: TrustBinding {
                store_id: "0123456789abcdef0123456789abcdef".to_owned(),
                generation: 2,
            },
            file_digest: Sha256Digest::of(b"trust"),
            revoked_keys: BTreeMap::new(),
            revoked_digests: BTreeMap::new(),
        };
        old.set_trust_anchor(trust.clone());
        let mut new = old.successor();
        for name in ["a", "b"] {
            let id = PackageId::new(name).unwrap();
            new.set_trusted_under(&id, &Version::new(1, 0, 0), trust.file_digest);
        }
        publish(&mut new, "c");
        let delta = StoreStateDelta::between(&old, &new).unwrap();
        assert!(delta.retrust.is_some());
        assert_eq!(
            String::from_utf8(delta.to_json()).unwrap(),
            delta.to_tree().to_compact_string()
        );
        let good = json::parse(&delta.to_json()).unwrap().to_pretty_string();
        let tree = StoreStateDelta::from_tree(good.as_bytes());
        assert_eq!(tree.as_ref(), Ok(&delta));
        assert_eq!(StoreStateDelta::read_json(good.as_bytes(), None), tree.ok());
        let refused = [
            good.replace("\"guild_registry_delta\": 2", "\"guild_registry_delta\": 1"),
            good.replace("\"enabled\"", "\"every\""),
            good.replace("\"versions\"", "\"sha256\": \"00\", \"versions\""),
            good.replace("\"retrust\": {", "\"retrust\": 1, \"r\": {"),
            good.replacen("\"retrust\": {", "\"retrust\": null, \"retrust\": {", 1),
        ];
        for text in &refused {
            assert_ne!(text, &good);
        }
        refused_by_both_readers(&refused);
    }
    proptest::proptest! {
        /// The operation sequences of the store state's property test, as commits of a few
        /// operations each (trust changes and trust re-records among them): each commit's delta
        /// round-trips through its encoding and replays to the new state, in full and for a
        /// reader of each package.
        #[test]
        fn store_state_delta_of_any_operation_sequence_replays_to_the_new_state(
            steps in crate::store_state::tests::steps()
        ) {
            use crate::store_state::tests::{apply_op, pkg};
            use proptest::prop_assert_eq;
            let mut r = StoreState::new();
            for step in steps {
                let committed = r.clone();
                for op in step {
                    // A refused operation changes nothing (the store state's test checks it).
                    let _ = apply_op(&mut r, op);
                }
                r = r.successor();
                let delta = StoreStateDelta::between(&committed, &r).unwrap();
                let bytes = delta.to_json();
                prop_assert_eq!(StoreStateDelta::from_json(&bytes), Ok(delta.clone()));
                prop_assert_eq!(StoreStateDelta::read_json(&bytes, None), Some(delta.clone()));
                let mut replayed = committed.clone();
                prop_assert_eq!(replayed.apply(&delta), Ok(()));
                prop_assert_eq!(&replayed, &r);
                let checkpoint = committed.to_checkpoint_json();
                for p in 0..3 {
                    let one = StoreStateDelta::from_json_only(&bytes, &pkg(p)).unwrap();
                    let (mut kept, _) = StoreState::from_any_json_only(&checkpoint, &pkg(p)).unwrap();
                    prop_assert_eq!(kept.apply(&one), Ok(()));
                    prop_assert_eq!(kept.package(&pkg(p)), r.package(&pkg(p)));
                }
            }
        }
    }
}
