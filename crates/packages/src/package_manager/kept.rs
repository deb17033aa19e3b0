//! The dependency graph and the impl-id claims of the committed registry, kept between changes,
//! and the checks a change must pass against them.

use guild_domain::claims::{
    claiming_versions, claiming_versions_of, conflicts, Claim, ClaimIndex, ImplIdConflict,
};
use guild_domain::graph::{
    requirement_part, DependencyGraph, GraphIndex, GraphProblem, NodeRef, PackageNode,
};
use std::collections::BTreeSet;

use guild_domain::ids::{ImplId, PackageId};
use guild_domain::manifest::Metadata;
use guild_domain::store_state::{StoreState, VersionRecord};
use guild_domain::version::Version;

use super::{Lifecycle, PackageManager};
use crate::error::HostError;

/// What the package manager keeps of the committed registry between changes, so that checking
/// one reads only around the package it changes: every installed version's dependency records
/// with the reverse edges ([`GraphIndex`]), and the impl ids each package's current version and
/// rollback target hold ([`ClaimIndex`]). Built from the registry at `generation` and the
/// metadata the lifecycle holds; each change this handle commits replaces the changed package's
/// part, and any other commit (another process's, a taint, a trust change) leaves it
/// behind, to be built again by the next change that needs it.
#[derive(Clone)]
pub(super) struct Kept {
    /// The registry generation it describes.
    pub(super) generation: u64,
    /// The installed versions and their edges.
    pub(super) graph: GraphIndex,
    /// The claims on impl ids.
    pub(super) claims: ClaimIndex,
}

/// A change's part of [`Kept`]: the changed package's installed versions and claims as the draft
/// records them, put in place once the change is committed ([`PackageManager::advance`]).
pub(super) struct KeptChange {
    /// The generation the change was checked against.
    from: u64,
    /// The generation it commits.
    to: u64,
    /// The package.
    id: PackageId,
    /// Its installed versions afterwards.
    nodes: Vec<PackageNode>,
    /// Its claims afterwards.
    claims: Vec<Claim>,
}

impl PackageManager {
    /// The graph of installed versions as `registry` records them.
    pub(super) fn graph(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
    ) -> Result<DependencyGraph, HostError> {
        Ok(DependencyGraph::new(self.installed_nodes(life, registry)?)?)
    }

    /// The graph of the part of `registry` in which an enabled version can fail to load
    /// ([`requirement_part`]), whose plan blocks exactly what the whole graph's does: a store of
    /// 10,000 packages of which few depend on others is checked at opening in a pass over its
    /// records, not a graph of every version. When an enabled version's record does not carry
    /// its requirements (a store written before they were recorded), the whole graph.
    pub(super) fn requirements_graph(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
    ) -> Result<DependencyGraph, HostError> {
        let enabled = || {
            registry
                .installed()
                .filter(|(_, _, record)| record.state.is_enabled())
        };
        if enabled().any(|(_, _, record)| record.facts.is_none()) {
            return self.graph(life, registry);
        }
        let part = requirement_part(enabled().filter_map(|(id, _, record)| {
            let facts = record.facts.as_deref()?;
            Some((
                id,
                facts.dependencies.as_slice(),
                facts.module_dependencies.as_slice(),
            ))
        }));
        let mut nodes = Vec::new();
        for id in part {
            let Some(package) = registry.package(id) else {
                continue;
            };
            for (version, record) in package.installed() {
                nodes.push(self.node_of(life, id, version, record, None)?);
            }
        }
        Ok(DependencyGraph::new(nodes)?)
    }

    /// The graph's node of every installed version `registry` records.
    fn installed_nodes(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
    ) -> Result<Vec<PackageNode>, HostError> {
        registry
            .installed()
            .map(|(id, version, record)| self.node_of(life, id, version, record, None))
            .collect()
    }

    /// The graph's node of installed version `id@version` (its record `record`): from `extra`
    /// when it describes that version (a version being installed), else from the facts the
    /// record carries, else from its metadata (a record written before they were recorded).
    fn node_of(
        &self,
        life: &Lifecycle,
        id: &PackageId,
        version: &Version,
        record: &VersionRecord,
        extra: Option<&Metadata>,
    ) -> Result<PackageNode, HostError> {
        let enabled = record.state.is_enabled();
        if let Some(m) = describing(extra, id, version) {
            return Ok(PackageNode::from_metadata(m, enabled));
        }
        if let Some(node) = record.graph_node(id, version) {
            return Ok(node);
        }
        let metadata = self.metadata_for(life, id, version, record)?;
        Ok(PackageNode::from_metadata(&metadata, enabled))
    }

    /// The claim of `node` (recorded in `registry`) on the impl ids its manifest provides.
    fn claim_of(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
        node: NodeRef,
        extra: Option<&Metadata>,
    ) -> Result<Claim, HostError> {
        if let Some(m) = describing(extra, &node.id, &node.version) {
            let ids = m.manifest().provided_ops.iter().cloned();
            return Ok(Claim::new(node, ids));
        }
        let record =
            registry
                .record(&node.id, &node.version)
                .ok_or_else(|| HostError::InstalledTree {
                    package: format!("{}@{}", node.id, node.version),
                    path: self.store.package_dir(&node.id, &node.version),
                    problem: "the registry does not record it".into(),
                })?;
        if let Some(facts) = &record.facts {
            return Ok(Claim::new(node, facts.provided_ops.iter().cloned()));
        }
        let metadata = self.metadata_for(life, &node.id, &node.version, record)?;
        let ids = metadata.manifest().provided_ops.iter().cloned();
        Ok(Claim::new(node, ids))
    }

    /// The claims on impl ids that `registry` records: the provided ops of every version that
    /// holds them (see [`guild_domain::claims::claiming_versions`]).
    pub(super) fn claims(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
    ) -> Result<Vec<Claim>, HostError> {
        claiming_versions(registry)
            .into_iter()
            .map(|node| self.claim_of(life, registry, node, None))
            .collect()
    }

    /// What [`Kept`] will hold of package `id` once the draft `next` is committed: its installed
    /// versions and its claims (`extra` is the metadata of a version being installed).
    pub(super) fn kept_change(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
        next: &StoreState,
        id: &PackageId,
        extra: Option<&Metadata>,
    ) -> Result<KeptChange, HostError> {
        let mut nodes = Vec::new();
        let mut claims = Vec::new();
        if let Some(record) = next.package(id) {
            for (version, r) in record.installed() {
                nodes.push(self.node_of(life, id, version, r, extra)?);
            }
            for node in claiming_versions_of(id, record) {
                claims.push(self.claim_of(life, next, node, extra)?);
            }
        }
        Ok(KeptChange {
            from: registry.generation(),
            to: next.generation(),
            id: id.clone(),
            nodes,
            claims,
        })
    }

    /// The kept graph and claims of `registry`, built now unless they describe its generation.
    pub(super) fn kept<'l>(
        &self,
        life: &'l mut Lifecycle,
        registry: &StoreState,
    ) -> Result<&'l Kept, HostError> {
        let kept = match life.kept.take() {
            Some(k) if k.generation == registry.generation() => k,
            _ => Kept {
                generation: registry.generation(),
                graph: GraphIndex::new(self.installed_nodes(life, registry)?)?,
                claims: ClaimIndex::new(self.claims(life, registry)?),
            },
        };
        Ok(life.kept.insert(kept))
    }

    /// What `change` (to be checked against `registry`) is judged on: the kept graph and claims
    /// when they describe `registry`'s generation; else, for the first change this handle
    /// judges, an index built around that change alone ([`PackageManager::built_around`]) and
    /// not kept; else the kept ones, built now. A process that makes one change (a `guild
    /// install`) so reads what the change touches instead of indexing every version of the
    /// store first, and one that goes on making changes (a runner's host) indexes the store
    /// once, at its second change, and keeps the index current from then on. Either way the
    /// answers are the same.
    pub(super) fn judged_on<'l>(
        &self,
        life: &'l mut Lifecycle,
        registry: &StoreState,
        change: &KeptChange,
        candidate: Option<&Metadata>,
    ) -> Result<Judged<'l>, HostError> {
        let current = life
            .kept
            .as_ref()
            .is_some_and(|k| k.generation == registry.generation());
        if current || life.judged_around {
            return Ok(Judged::Kept(self.kept(life, registry)?));
        }
        life.judged_around = true;
        Ok(Judged::Built(
            self.built_around(life, registry, change, candidate)?,
        ))
    }

    /// The graph and claims index of the part of `registry` that checking `change` reads, which
    /// answer [`GraphIndex::problems_added`] and [`ClaimIndex::check`] for the change exactly
    /// as the index of every version would. The graph holds every installed version of: the
    /// changed package, each package with a version that names it (its dependents, whose
    /// requirements the change can break or mend), and everything those reach along
    /// requirements, transitively (the targets the dependents' requirements are checked
    /// against, and every node a strongly connected component of the changed package can hold).
    /// The claims are those of every package holding one of the impl ids the change's claims
    /// or `candidate` (the version whose ids are checked) name: a conflict with any package in
    /// the store is found. One pass over the registry's
    /// records finds the dependents and the holders, comparing names without copying them;
    /// only what is found is copied.
    pub(super) fn built_around(
        &self,
        life: &Lifecycle,
        registry: &StoreState,
        change: &KeptChange,
        candidate: Option<&Metadata>,
    ) -> Result<Kept, HostError> {
        let id = &change.id;
        let names_id = |node: &PackageNode| targets_of(node).any(|t| t == id);
        // The packages whose versions the graph holds, found from the changed package and its
        // dependents outwards along requirements.
        let mut frontier: Vec<PackageId> = Vec::new();
        for node in &change.nodes {
            frontier.extend(targets_of(node).cloned());
        }
        for (pid, version, record) in registry.installed() {
            let names = match record.facts.as_deref() {
                Some(facts) => {
                    facts.dependencies.iter().any(|d| &d.package_id == id)
                        || facts.module_dependencies.iter().any(|d| &d.module_id == id)
                }
                None => names_id(&self.node_of(life, pid, version, record, None)?),
            };
            if names {
                frontier.push(pid.clone());
            }
        }
        frontier.push(id.clone());
        let mut nodes = Vec::new();
        let mut read: BTreeSet<PackageId> = BTreeSet::new();
        while let Some(pid) = frontier.pop() {
            if !read.insert(pid.clone()) {
                continue;
            }
            let Some(record) = registry.package(&pid) else {
                continue;
            };
            for (version, r) in record.installed() {
                let node = self.node_of(life, &pid, version, r, None)?;
                frontier.extend(targets_of(&node).filter(|t| !read.contains(*t)).cloned());
                nodes.push(node);
            }
        }
        // The claims of every package holding one of the change's impl ids. A record without
        // the facts is read as the whole index reads it.
        let offered = candidate.map(|m| &m.manifest().provided_ops);
        let wanted: BTreeSet<&ImplId> = change
            .claims
            .iter()
            .flat_map(|c| &c.impl_ids)
            .chain(offered.into_iter().flatten())
            .collect();
        let mut claims = Vec::new();
        if !wanted.is_empty() {
            for (pid, record) in registry.packages() {
                let current = record.current().map(|(v, _)| v);
                let holds = current.into_iter().chain(record.previous()).any(|v| {
                    record
                        .get(v)
                        .and_then(|r| r.facts.as_deref())
                        .is_none_or(|f| f.provided_ops.iter().any(|o| wanted.contains(o)))
                });
                if !holds {
                    continue;
                }
                for node in claiming_versions_of(pid, record) {
                    claims.push(self.claim_of(life, registry, node, None)?);
                }
            }
        }
        Ok(Kept {
            generation: registry.generation(),
            graph: GraphIndex::new(nodes)?,
            claims: ClaimIndex::new(claims),
        })
    }

    /// Puts a committed change's part in place in [`Kept`], or drops what is kept when it does
    /// not describe the generation the change was checked against.
    pub(super) fn advance(life: &mut Lifecycle, change: KeptChange) {
        let KeptChange {
            from,
            to,
            id,
            nodes,
            claims,
        } = change;
        let Some(mut kept) = life.kept.take().filter(|k| k.generation == from) else {
            return;
        };
        if kept.graph.set_package(&id, nodes).is_ok() {
            kept.claims.set_package(&id, claims);
            kept.generation = to;
            life.kept = Some(kept);
        }
    }

    /// What is kept once every change of a plan is committed: `kept` (at the generation the plan
    /// was checked against) with each changed package's part (`changes`, one per package) in
    /// place, at the generation the plan commits.
    pub(super) fn kept_after(kept: &Kept, changes: &[KeptChange]) -> Result<Kept, HostError> {
        let mut after = kept.clone();
        for change in changes {
            after.graph.set_package(&change.id, change.nodes.clone())?;
            after.claims.set_package(&change.id, change.claims.clone());
            after.generation = change.to;
        }
        Ok(after)
    }

    /// Refuses a plan for the problems its final state `after` brings that the state `before` it
    /// does not have, whatever order its changes would have taken one by one: a plan is refused
    /// for what it breaks as a whole, not for what a step in between would have broken nor for
    /// problems that were already there. Validates both whole graphs, so this grows with the
    /// store; a plan (a `guild sync`) reads every package anyway. `action` names the plan in
    /// the refusal.
    pub(super) fn refuse_plan_breakage(
        before: &Kept,
        after: &Kept,
        action: impl FnOnce() -> String,
    ) -> Result<(), HostError> {
        let problems_of = |kept: &Kept| -> Result<Vec<GraphProblem>, HostError> {
            Ok(DependencyGraph::new(kept.graph.nodes().cloned().collect())?.validate())
        };
        let had = problems_of(before)?;
        let problems: Vec<GraphProblem> = problems_of(after)?
            .into_iter()
            .filter(|p| !had.contains(p))
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        Err(HostError::Dependencies {
            action: action(),
            problems,
        })
    }

    /// Refuses to make the version `metadata` describes installed, current or loadable while
    /// another package holds one of its impl ids: an id belongs to one package, and load order
    /// must never decide which.
    pub(super) fn refuse_taken_ids(kept: &Kept, metadata: &Metadata) -> Result<(), HostError> {
        let m = metadata.manifest();
        let candidate = Claim::new(
            NodeRef {
                id: m.package_id.clone(),
                version: m.version.clone(),
            },
            m.provided_ops.iter().cloned(),
        );
        Ok(kept.claims.check(&candidate)?)
    }

    /// The impl ids that two recorded packages both hold: a store written before installation
    /// checked them. Neither side of a conflict is loaded ([`PackageManager::load_plan`]) until
    /// one of them is removed.
    pub fn impl_id_conflicts(&self) -> Result<Vec<ImplIdConflict>, HostError> {
        let mut life = self.lock();
        self.ensure_caught_up(&mut life)?;
        // A reader's own view: a version whose tree it found damaged has no metadata to claim.
        let registry = match &life.local_view {
            Some(view) => view.clone(),
            None => self.store.registry()?,
        };
        Ok(conflicts(&self.claims(&life, &registry)?))
    }

    /// Refuses a change for the problems it brings ([`GraphIndex::problems_added`]): a change is
    /// refused for what it breaks, not for problems that were already there. `action` names the
    /// change in the refusal.
    pub(super) fn refuse_breakage(
        kept: &Kept,
        change: &KeptChange,
        action: impl FnOnce() -> String,
    ) -> Result<(), HostError> {
        let problems = kept
            .graph
            .problems_added(&change.id, change.nodes.clone())?;
        if problems.is_empty() {
            return Ok(());
        }
        Err(HostError::Dependencies {
            action: action(),
            problems,
        })
    }
}

/// Every package id `node`'s requirements name, provenance records included (as the graph's
/// reverse edges count them).
fn targets_of(node: &PackageNode) -> impl Iterator<Item = &PackageId> + '_ {
    node.dependencies
        .iter()
        .map(|d| &d.package_id)
        .chain(node.module_dependencies.iter().map(|d| &d.module_id))
}

/// What a change is judged on ([`PackageManager::judged_on`]).
pub(super) enum Judged<'l> {
    /// The kept index of the committed registry.
    Kept(&'l Kept),
    /// An index built around the change.
    Built(Kept),
}

impl std::ops::Deref for Judged<'_> {
    type Target = Kept;

    fn deref(&self) -> &Kept {
        match self {
            Judged::Kept(k) => k,
            Judged::Built(k) => k,
        }
    }
}

/// `extra` when it is the metadata of `id@version`.
fn describing<'m>(
    extra: Option<&'m Metadata>,
    id: &PackageId,
    version: &Version,
) -> Option<&'m Metadata> {
    extra.filter(|m| {
        let m = m.manifest();
        &m.package_id == id && &m.version == version
    })
}
