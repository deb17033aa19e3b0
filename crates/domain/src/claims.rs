//! Implementation ids belong to one package: which recorded versions hold their `provided_ops`,
//! whether a version that is about to be installed, enabled or rolled back to may take its ids,
//! and which claims a store recorded before this rule holds twice.
//!
//! Without the rule, two packages that register the same impl id are both accepted, and the one
//! that happens to load first (package-id order) serves the id while the other fails to load: a
//! later package could take over an id another package provides. Deciding at install time, before
//! anything is opened, means load order never decides who owns an id.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::graph::NodeRef;
use crate::ids::{ImplId, PackageId};
use crate::store_state::{PackageRecord, StoreState};

/// The impl ids one package version provides (its manifest's `provided_ops`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The version that provides them.
    pub node: NodeRef,
    /// The ids it provides.
    pub impl_ids: BTreeSet<ImplId>,
}

impl Claim {
    /// The claim of `node` on `impl_ids`.
    pub fn new(node: NodeRef, impl_ids: impl IntoIterator<Item = ImplId>) -> Self {
        Claim {
            node,
            impl_ids: impl_ids.into_iter().collect(),
        }
    }

    /// The ids both claims name, in order.
    fn shared_with(&self, other: &Claim) -> Vec<ImplId> {
        self.impl_ids
            .intersection(&other.impl_ids)
            .cloned()
            .collect()
    }
}

/// A package version that provides impl ids another package already provides.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{claimant} provides {}, which {owner} already provides: an implementation id belongs to \
     one package",
    list(.impl_ids)
)]
pub struct ImplIdConflict {
    /// The version that asks for the ids (the one being installed, enabled or rolled back to;
    /// for a conflict already in a store, the one with the larger package id).
    pub claimant: NodeRef,
    /// The version of the other package that holds them.
    pub owner: NodeRef,
    /// The ids both provide, in order.
    pub impl_ids: Vec<ImplId>,
}

impl ImplIdConflict {
    /// Whether package `id` is one of the two sides.
    pub fn involves(&self, id: &PackageId) -> bool {
        &self.claimant.id == id || &self.owner.id == id
    }

    /// The other side of the conflict, seen from package `id`.
    pub fn other_side(&self, id: &PackageId) -> &NodeRef {
        if &self.claimant.id == id {
            &self.owner
        } else {
            &self.claimant
        }
    }
}

fn list(ids: &[ImplId]) -> String {
    ids.iter()
        .map(ImplId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The recorded versions whose ids are taken: every package's current version (enabled, or
/// disabled and one `enable` away from loading) and its rollback target. A superseded version
/// that is not the rollback target holds nothing; it can only become current again by being
/// installed again, which checks its claim then. Removed versions hold nothing.
pub fn claiming_versions(registry: &StoreState) -> Vec<NodeRef> {
    registry
        .packages()
        .flat_map(|(id, record)| claiming_versions_of(id, record))
        .collect()
}

/// The versions of package `id` whose ids are taken, as [`claiming_versions`] lists them: its
/// current version, then its rollback target.
pub fn claiming_versions_of(id: &PackageId, record: &PackageRecord) -> Vec<NodeRef> {
    let current = record.current().map(|(v, _)| v);
    current
        .into_iter()
        .chain(record.previous())
        .map(|version| NodeRef {
            id: id.clone(),
            version: version.clone(),
        })
        .collect()
}

/// Refuses `candidate` when a claim of another package in `held` shares an id with it; the
/// refusal names the first such claim (in the order given) and every id the two share. Claims
/// of the candidate's own package do not count: the versions of one package provide the same
/// ids as a matter of course. (The refusal is boxed because it carries two names and a list.)
pub fn check_claim(candidate: &Claim, held: &[Claim]) -> Result<(), Box<ImplIdConflict>> {
    for other in held.iter().filter(|c| c.node.id != candidate.node.id) {
        let shared = candidate.shared_with(other);
        if !shared.is_empty() {
            return Err(Box::new(ImplIdConflict {
                claimant: candidate.node.clone(),
                owner: other.node.clone(),
                impl_ids: shared,
            }));
        }
    }
    Ok(())
}

/// Every pair of claims of different packages in `held` that share ids: conflicts a store
/// recorded before [`check_claim`] guarded installation. Each pair appears once, with the
/// smaller package id as the owner, sorted by (owner, claimant).
pub fn conflicts(held: &[Claim]) -> Vec<ImplIdConflict> {
    // Only claims that share an id can conflict: find those pairs through the ids, so that a
    // store of thousands of packages with no conflict costs one pass over its ids rather than
    // a comparison of every pair of claims.
    let mut holders: HashMap<&ImplId, Vec<usize>> = HashMap::new();
    for (i, claim) in held.iter().enumerate() {
        for id in &claim.impl_ids {
            holders.entry(id).or_default().push(i);
        }
    }
    let mut pairs = BTreeSet::new();
    for claims in holders.values().filter(|c| c.len() > 1) {
        for (k, &i) in claims.iter().enumerate() {
            for &j in &claims[k + 1..] {
                if held[i].node.id != held[j].node.id {
                    pairs.insert((i.min(j), i.max(j)));
                }
            }
        }
    }
    let mut out = Vec::with_capacity(pairs.len());
    for (i, j) in pairs {
        let (a, b) = (&held[i], &held[j]);
        let (owner, claimant) = if a.node <= b.node { (a, b) } else { (b, a) };
        out.push(ImplIdConflict {
            claimant: claimant.node.clone(),
            owner: owner.node.clone(),
            impl_ids: a.shared_with(b),
        });
    }
    out.sort_by(|x, y| {
        (&x.owner, &x.claimant)
            .cmp(&(&y.owner, &y.claimant))
            .then_with(|| x.impl_ids.cmp(&y.impl_ids))
    });
    out
}

/// The claims a registry records, kept by package and looked up by impl id, so that checking a
/// candidate ([`ClaimIndex::check`]) reads only the claims that share one of its ids instead of
/// every claim in the store. A package manager builds it once and replaces one package's claims
/// after each change ([`ClaimIndex::set_package`]). It answers exactly as [`check_claim`] over
/// the same claims in [`claiming_versions`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimIndex {
    /// Each package's claims, in the order [`check_claim`] would meet them (its current version,
    /// then its rollback target).
    packages: BTreeMap<PackageId, Vec<Claim>>,
    /// For each impl id, the packages with a claim on it.
    holders: HashMap<ImplId, BTreeSet<PackageId>>,
}

impl ClaimIndex {
    /// The index of `held`: claims listed by package id, and within one package in the order
    /// they should be tried (as [`claiming_versions`] lists them).
    pub fn new(held: impl IntoIterator<Item = Claim>) -> Self {
        let mut by_package: BTreeMap<PackageId, Vec<Claim>> = BTreeMap::new();
        for claim in held {
            by_package
                .entry(claim.node.id.clone())
                .or_default()
                .push(claim);
        }
        let mut index = ClaimIndex::default();
        for (id, claims) in by_package {
            index.set_package(&id, claims);
        }
        index
    }

    /// Replaces the claims of package `id` with `claims` (none: it holds no id any more).
    pub fn set_package(&mut self, id: &PackageId, claims: Vec<Claim>) {
        if let Some(old) = self.packages.remove(id) {
            for impl_id in old.iter().flat_map(|c| &c.impl_ids) {
                if let Some(set) = self.holders.get_mut(impl_id) {
                    set.remove(id);
                    if set.is_empty() {
                        self.holders.remove(impl_id);
                    }
                }
            }
        }
        if claims.is_empty() {
            return;
        }
        for impl_id in claims.iter().flat_map(|c| &c.impl_ids) {
            self.holders
                .entry(impl_id.clone())
                .or_default()
                .insert(id.clone());
        }
        self.packages.insert(id.clone(), claims);
    }

    /// [`check_claim`] of `candidate` against the indexed claims: refused when another package
    /// holds one of its ids, naming that package's first claim that does (packages in id order)
    /// and every id the two share.
    pub fn check(&self, candidate: &Claim) -> Result<(), Box<ImplIdConflict>> {
        let first = candidate
            .impl_ids
            .iter()
            .filter_map(|i| self.holders.get(i))
            .filter_map(|set| set.iter().find(|p| **p != candidate.node.id))
            .min();
        let Some(owner) = first else {
            return Ok(());
        };
        check_claim(
            candidate,
            self.packages.get(owner).map_or(&[], Vec::as_slice),
        )
    }

    /// Every indexed claim, by package id, each package's in order.
    pub fn claims(&self) -> impl Iterator<Item = &Claim> + '_ {
        self.packages.values().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ids::{PackageKind, PublisherId, Sha256Digest};
    use crate::store_state::{NewVersion, PublishOptions};
    use crate::version::Version;
    use proptest::prelude::*;

    fn node(id: &str, version: &str) -> NodeRef {
        NodeRef {
            id: PackageId::new(id).unwrap(),
            version: Version::parse(version).unwrap(),
        }
    }

    fn claim(id: &str, version: &str, ids: &[&str]) -> Claim {
        Claim::new(
            node(id, version),
            ids.iter().map(|s| ImplId::new(*s).unwrap()),
        )
    }

    fn publish(registry: &mut StoreState, id: &str, version: &str, enable: bool) {
        let n = node(id, version);
        registry
            .publish(
                &n.id,
                &n.version,
                NewVersion {
                    payload_digest: Sha256Digest::of(format!("{id}@{version}").as_bytes()),
                    kind: PackageKind::Module,
                    publisher: PublisherId::new("org.example").unwrap(),
                    signed_by: Vec::new(),
                    facts: None,
                },
                PublishOptions {
                    enable,
                    allow_downgrade: false,
                },
            )
            .unwrap();
    }

    #[test]
    fn current_and_rollback_target_hold_claims_older_and_removed_do_not() {
        let mut r = StoreState::new();
        for v in ["1.0.0", "2.0.0", "3.0.0"] {
            publish(&mut r, "ex.a", v, true);
        }
        publish(&mut r, "ex.b", "1.0.0", false);
        publish(&mut r, "ex.c", "1.0.0", true);
        r.remove(&node("ex.c", "1.0.0").id, &node("ex.c", "1.0.0").version)
            .unwrap();
        assert_eq!(
            claiming_versions(&r),
            vec![
                node("ex.a", "3.0.0"),
                node("ex.a", "2.0.0"),
                node("ex.b", "1.0.0")
            ]
        );
    }

    #[test]
    fn a_claim_is_refused_for_ids_of_another_package_only() {
        let held = [
            claim(
                "ex.scan",
                "1.0.0",
                &["ex.scan.inclusive.cpu", "ex.scan.exclusive.cpu"],
            ),
            claim("ex.other", "1.0.0", &["ex.other.op"]),
        ];
        // Another version of the same package provides the same ids freely.
        assert_eq!(
            check_claim(
                &claim("ex.scan", "2.0.0", &["ex.scan.inclusive.cpu"]),
                &held
            ),
            Ok(())
        );
        assert_eq!(
            check_claim(&claim("aaa.hijack", "1.0.0", &["ex.new"]), &held),
            Ok(())
        );
        let err = check_claim(
            &claim(
                "aaa.hijack",
                "1.0.0",
                &["ex.scan.inclusive.cpu", "ex.scan.exclusive.cpu", "ex.new"],
            ),
            &held,
        )
        .unwrap_err();
        assert_eq!(err.owner, node("ex.scan", "1.0.0"));
        assert_eq!(
            err.to_string(),
            "aaa.hijack@1.0.0 provides ex.scan.exclusive.cpu, ex.scan.inclusive.cpu, which \
             ex.scan@1.0.0 already provides: an implementation id belongs to one package"
        );
        assert!(err.involves(&node("ex.scan", "1.0.0").id));
        assert_eq!(
            err.other_side(&node("ex.scan", "1.0.0").id),
            &node("aaa.hijack", "1.0.0")
        );
    }

    #[test]
    fn conflicts_already_held_are_listed_once_per_pair() {
        let held = [
            claim("ex.scan", "2.0.0", &["ex.scan.inclusive.cpu"]),
            claim("ex.scan", "1.0.0", &["ex.scan.inclusive.cpu"]),
            claim("aaa.hijack", "1.0.0", &["ex.scan.inclusive.cpu", "x"]),
            claim("ex.free", "1.0.0", &["x.free"]),
        ];
        let found = conflicts(&held);
        let pairs: Vec<(String, String)> = found
            .iter()
            .map(|c| (c.owner.to_string(), c.claimant.to_string()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("aaa.hijack@1.0.0".to_owned(), "ex.scan@1.0.0".to_owned()),
                ("aaa.hijack@1.0.0".to_owned(), "ex.scan@2.0.0".to_owned()),
            ]
        );
        assert!(conflicts(&held[..2]).is_empty());
    }

    /// Claims of up to six packages (one or two versions each) on ids from a pool of eight,
    /// listed by package id as [`claiming_versions`] lists them, and a candidate.
    fn claims_and_candidate() -> impl Strategy<Value = (Vec<Claim>, Claim)> {
        let ids = || proptest::collection::btree_set(0u8..8, 0..4);
        let package = (0u8..6, proptest::collection::vec(ids(), 1..3));
        (
            proptest::collection::btree_map(0u8..6, package.prop_map(|(_, v)| v), 0..6),
            0u8..7,
            ids(),
        )
            .prop_map(|(packages, cand_pkg, cand_ids)| {
                let name = |i: &u8| format!("ex.i{i}");
                let mut held = Vec::new();
                for (p, versions) in &packages {
                    for (k, ids) in versions.iter().enumerate() {
                        let ids: Vec<String> = ids.iter().map(name).collect();
                        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                        held.push(claim(&format!("ex.p{p}"), &format!("{}.0.0", 9 - k), &ids));
                    }
                }
                let ids: Vec<String> = cand_ids.iter().map(name).collect();
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                (held, claim(&format!("ex.p{cand_pkg}"), "5.0.0", &ids))
            })
    }

    /// The definition `conflicts` must keep: every pair of claims of two packages that share an
    /// id, compared pair by pair.
    fn conflicts_of_every_pair(held: &[Claim]) -> Vec<ImplIdConflict> {
        let mut out = Vec::new();
        for (i, a) in held.iter().enumerate() {
            for b in held.iter().skip(i + 1).filter(|b| b.node.id != a.node.id) {
                let shared = a.shared_with(b);
                if !shared.is_empty() {
                    let (owner, claimant) = if a.node <= b.node { (a, b) } else { (b, a) };
                    out.push(ImplIdConflict {
                        claimant: claimant.node.clone(),
                        owner: owner.node.clone(),
                        impl_ids: shared,
                    });
                }
            }
        }
        out.sort_by(|x, y| {
            (&x.owner, &x.claimant)
                .cmp(&(&y.owner, &y.claimant))
                .then_with(|| x.impl_ids.cmp(&y.impl_ids))
        });
        out
    }

    proptest! {
        #[test]
        fn conflicts_found_through_the_ids_are_those_of_every_pair(
            (mut held, candidate) in claims_and_candidate()
        ) {
            held.push(candidate);
            prop_assert_eq!(conflicts(&held), conflicts_of_every_pair(&held));
        }

        #[test]
        fn claim_index_answers_as_check_claim((held, candidate) in claims_and_candidate()) {
            let index = ClaimIndex::new(held.clone());
            prop_assert_eq!(index.check(&candidate), check_claim(&candidate, &held));
            prop_assert_eq!(index.claims().cloned().collect::<Vec<_>>(), held.clone());

            // Replacing one package's claims gives the index of the changed list.
            let pkg = candidate.node.id.clone();
            let mut changed: Vec<Claim> = held.iter().filter(|c| c.node.id != pkg).cloned().collect();
            let mut updated = index.clone();
            updated.set_package(&pkg, vec![candidate.clone()]);
            changed.push(candidate.clone());
            changed.sort_by(|a, b| a.node.id.cmp(&b.node.id));
            prop_assert_eq!(&updated, &ClaimIndex::new(changed));
            updated.set_package(&pkg, Vec::new());
            let without: Vec<Claim> = held.iter().filter(|c| c.node.id != pkg).cloned().collect();
            prop_assert_eq!(updated, ClaimIndex::new(without));
        }
    }
}
