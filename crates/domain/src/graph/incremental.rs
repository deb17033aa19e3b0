//! The committed graph kept between changes, and the queries that judge one change by looking
//! only around the package it changes.
//!
//! A change to package `p` (a new version, another version enabled, none enabled) alters only
//! the edges that leave `p`'s versions and the edges that its dependents point at `p`. So the
//! edge problems that can differ are those of `p`'s versions and of its dependents, and a cycle
//! can appear or change only in the strongly connected component of `p`'s enabled version, before
//! or after the change: every other component keeps its edges. [`GraphIndex`] keeps the nodes by
//! package and the reverse edges by target, so that each query reads those parts only; each
//! answers exactly as the same query on a [`DependencyGraph`] of every installed version.

use std::collections::{BTreeSet, HashMap};

use super::{
    check_requirements, cycle_path, dependents_among, disable_answer, find_cycles, remove_answer,
    reverse, rollback_answer, DependencyGraph, Dependent, DisableRefusal, GraphBuildError,
    GraphProblem, NodeRef, PackageNode, RemoveRefusal, Resolved, RollbackRefusal, Targets,
};
use crate::ids::PackageId;
use crate::version::Version;

/// The installed package versions, by package, with the reverse edges: for each package id, the
/// installed versions whose manifest names it. Built once from every installed version and kept
/// current one package at a time ([`GraphIndex::set_package`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphIndex {
    /// Each package's installed versions, oldest first.
    packages: HashMap<PackageId, Vec<PackageNode>>,
    /// For each package id, the installed versions with a requirement (of any kind) naming it.
    dependents: HashMap<PackageId, BTreeSet<NodeRef>>,
}

impl GraphIndex {
    /// The index of the installed versions `nodes`, in any order; refused as
    /// [`DependencyGraph::new`] refuses them.
    pub fn new(nodes: Vec<PackageNode>) -> Result<Self, GraphBuildError> {
        let mut index = GraphIndex::default();
        let mut nodes = DependencyGraph::new(nodes)?
            .into_nodes()
            .into_iter()
            .peekable();
        while let Some(first) = nodes.next() {
            let id = first.id.clone();
            let mut versions = vec![first];
            while let Some(node) = nodes.next_if(|n| n.id == id) {
                versions.push(node);
            }
            index.insert(id, versions);
        }
        Ok(index)
    }

    /// Every installed version of `id`, oldest first.
    pub fn versions(&self, id: &PackageId) -> &[PackageNode] {
        self.packages.get(id).map_or(&[], Vec::as_slice)
    }

    /// Every installed version, by package (in no particular order of packages).
    pub fn nodes(&self) -> impl Iterator<Item = &PackageNode> + '_ {
        self.packages.values().flatten()
    }

    /// Replaces the installed versions of package `id` with `versions` (none: it has no
    /// installed version any more). Refused, changing nothing, when a version repeats, when two
    /// are enabled, or when one belongs to another package.
    pub fn set_package(
        &mut self,
        id: &PackageId,
        versions: Vec<PackageNode>,
    ) -> Result<(), GraphBuildError> {
        let versions = package_versions(id, versions)?;
        if let Some(old) = self.packages.remove(id) {
            for node in &old {
                let key = node.node_ref();
                for target in targets(node) {
                    if let Some(set) = self.dependents.get_mut(target) {
                        set.remove(&key);
                        if set.is_empty() {
                            self.dependents.remove(target);
                        }
                    }
                }
            }
        }
        if !versions.is_empty() {
            self.insert(id.clone(), versions);
        }
        Ok(())
    }

    fn insert(&mut self, id: PackageId, versions: Vec<PackageNode>) {
        for node in &versions {
            for target in targets(node) {
                self.dependents
                    .entry(target.clone())
                    .or_default()
                    .insert(node.node_ref());
            }
        }
        self.packages.insert(id, versions);
    }

    /// The problems that replacing the installed versions of `id` with `versions` would bring:
    /// the problems of the graph with the change in place that the graph without it does not
    /// have, in the order [`DependencyGraph::validate`] lists them. The same answer as comparing
    /// the validation of the two whole graphs; reads only `id`'s versions, its dependents and the
    /// strongly connected components of `id`'s enabled version before and after.
    pub fn problems_added(
        &self,
        id: &PackageId,
        versions: Vec<PackageNode>,
    ) -> Result<Vec<GraphProblem>, GraphBuildError> {
        let versions = package_versions(id, versions)?;
        let before = View::new(self, None);
        let after = View::new(self, Some((id, &versions)));
        let affected = self.affected(id, &versions);
        let mut region = BTreeSet::new();
        for view in [&before, &after] {
            if let Some(enabled) = view.enabled(id) {
                region.extend(view.component(enabled));
            }
        }
        let old: Vec<GraphProblem> = before
            .edge_problems(&affected)
            .into_iter()
            .chain(before.cycles(&region))
            .collect();
        let new = after
            .edge_problems(&affected)
            .into_iter()
            .chain(after.cycles(&region));
        Ok(new.filter(|p| !old.contains(p)).collect())
    }

    /// [`DependencyGraph::check_disable`], reading only `id` and its dependents.
    pub fn check_disable(&self, id: &PackageId) -> Result<(), DisableRefusal> {
        disable_answer(id, self.versions(id), || self.dependents_of(id))
    }

    /// [`DependencyGraph::check_remove`], reading only `id` and its dependents.
    pub fn check_remove(&self, id: &PackageId, version: &Version) -> Result<(), RemoveRefusal> {
        remove_answer(id, version, self.versions(id), || self.dependents_of(id))
    }

    /// [`DependencyGraph::check_rollback`], reading only `id`, its dependents and what the
    /// restored version reaches.
    pub fn check_rollback(&self, id: &PackageId, version: &Version) -> Result<(), RollbackRefusal> {
        let versions = self.versions(id);
        if !versions.iter().any(|n| &n.version == version) {
            return Err(RollbackRefusal::NotInstalled {
                id: id.clone(),
                version: version.clone(),
            });
        }
        let rolled: Vec<PackageNode> = versions
            .iter()
            .map(|n| PackageNode {
                enabled: &n.version == version,
                ..n.clone()
            })
            .collect();
        let view = View::new(self, Some((id, &rolled)));
        let affected = self.affected(id, &rolled);
        let mut problems: Vec<GraphProblem> = view
            .edge_problems(&affected)
            .into_iter()
            .filter(|p| p.involves(id))
            .collect();
        if let Some(target) = view.enabled(id) {
            let reach = view.reachable(target);
            let local = view.local(&reach);
            let start = local
                .nodes
                .iter()
                .position(|n| n.node_ref() == target.node_ref());
            if let Some(path) = start.and_then(|s| cycle_path(s, &local.resolved, |_| true)) {
                problems.push(GraphProblem::Cycle {
                    path: path.iter().map(|&u| local.nodes[u].node_ref()).collect(),
                });
            }
        }
        rollback_answer(id, version, problems)
    }

    /// The versions whose edge problems a change to `id` (leaving `versions`) can alter: `id`'s
    /// versions before and after, and every installed version naming `id`, in node order.
    fn affected(&self, id: &PackageId, versions: &[PackageNode]) -> BTreeSet<NodeRef> {
        let mut out: BTreeSet<NodeRef> = self
            .versions(id)
            .iter()
            .chain(versions)
            .map(PackageNode::node_ref)
            .collect();
        if let Some(set) = self.dependents.get(id) {
            out.extend(set.iter().cloned());
        }
        out
    }

    /// [`DependencyGraph::dependents`] from the reverse edges.
    fn dependents_of(&self, id: &PackageId) -> Vec<Dependent> {
        let view = View::new(self, None);
        let named = self.dependents.get(id).into_iter().flatten();
        dependents_among(named.filter_map(|r| view.node(r)), id)
    }
}

/// `versions`, checked to be versions of `id` with no version twice and at most one enabled,
/// oldest first.
fn package_versions(
    id: &PackageId,
    versions: Vec<PackageNode>,
) -> Result<Vec<PackageNode>, GraphBuildError> {
    if let Some(other) = versions.iter().find(|n| &n.id != id) {
        return Err(GraphBuildError::OtherPackage {
            id: id.clone(),
            found: other.node_ref(),
        });
    }
    Ok(DependencyGraph::new(versions)?.into_nodes())
}

/// Every package id a node's requirements name.
fn targets(node: &PackageNode) -> impl Iterator<Item = &PackageId> + '_ {
    node.dependencies
        .iter()
        .map(|d| &d.package_id)
        .chain(node.module_dependencies.iter().map(|d| &d.module_id))
}

/// The index as it would be with one package's versions replaced.
struct View<'a> {
    index: &'a GraphIndex,
    over: Option<(&'a PackageId, &'a [PackageNode])>,
}

/// Some nodes of a view, sorted, with the runtime edges among them in compressed rows, ready for
/// the graph's cycle search.
struct Local<'a> {
    nodes: Vec<&'a PackageNode>,
    resolved: Resolved,
}

impl<'a> Targets for View<'a> {
    type Handle = &'a PackageNode;

    fn node(&self, h: &'a PackageNode) -> &PackageNode {
        h
    }

    fn installed(&self, id: &PackageId) -> Vec<Version> {
        self.versions(id)
            .iter()
            .map(|n| n.version.clone())
            .collect()
    }
}

impl<'a> View<'a> {
    fn new(index: &'a GraphIndex, over: Option<(&'a PackageId, &'a [PackageNode])>) -> Self {
        View { index, over }
    }

    fn versions(&self, id: &PackageId) -> &'a [PackageNode] {
        match self.over {
            Some((o, versions)) if o == id => versions,
            _ => self.index.versions(id),
        }
    }

    fn enabled(&self, id: &PackageId) -> Option<&'a PackageNode> {
        self.versions(id).iter().find(|n| n.enabled)
    }

    fn node(&self, r: &NodeRef) -> Option<&'a PackageNode> {
        self.versions(&r.id).iter().find(|n| n.version == r.version)
    }

    /// Where a requirement's target stands (see [`check_requirements`]).
    fn slot(&self, id: &PackageId) -> Option<Option<&'a PackageNode>> {
        let versions = self.versions(id);
        if versions.is_empty() {
            None
        } else {
            Some(versions.iter().find(|n| n.enabled))
        }
    }

    /// The edge problems of `nodes` that are enabled, in node order.
    fn edge_problems(&self, nodes: &BTreeSet<NodeRef>) -> Vec<GraphProblem> {
        let mut problems = Vec::new();
        for node in nodes.iter().filter_map(|r| self.node(r)) {
            if node.enabled {
                check_requirements(self, node, |t| self.slot(t), |_| {}, &mut problems);
            }
        }
        problems
    }

    /// The runtime edges of `node` (none when it is not enabled), in requirement order.
    fn successors(&self, node: &'a PackageNode) -> Vec<&'a PackageNode> {
        let mut out = Vec::new();
        if node.enabled {
            let mut ignored = Vec::new();
            check_requirements(self, node, |t| self.slot(t), |t| out.push(t), &mut ignored);
        }
        out
    }

    /// Every node reachable from `start` along runtime edges, `start` included.
    fn reachable(&self, start: &'a PackageNode) -> BTreeSet<NodeRef> {
        let mut seen = BTreeSet::from([start.node_ref()]);
        let mut stack = vec![start];
        while let Some(x) = stack.pop() {
            for w in self.successors(x) {
                if seen.insert(w.node_ref()) {
                    stack.push(w);
                }
            }
        }
        seen
    }

    /// The nodes `members` names, sorted as they are, with the edges among them.
    fn local(&self, members: &BTreeSet<NodeRef>) -> Local<'a> {
        let nodes: Vec<&'a PackageNode> = members.iter().filter_map(|r| self.node(r)).collect();
        let position: HashMap<NodeRef, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.node_ref(), i))
            .collect();
        let mut start = Vec::with_capacity(nodes.len() + 1);
        let mut succ = Vec::new();
        for node in &nodes {
            start.push(succ.len());
            succ.extend(
                self.successors(node)
                    .into_iter()
                    .filter_map(|w| position.get(&w.node_ref()).copied()),
            );
        }
        start.push(succ.len());
        Local {
            nodes,
            resolved: Resolved {
                start,
                succ,
                problems: Vec::new(),
                problem_start: Vec::new(),
            },
        }
    }

    /// The strongly connected component of `node`: what it reaches that reaches it back.
    fn component(&self, node: &'a PackageNode) -> BTreeSet<NodeRef> {
        let reach = self.reachable(node);
        let local = self.local(&reach);
        let n = local.nodes.len();
        let (pred_start, pred) = reverse(n, &local.resolved.start, &local.resolved.succ);
        let Some(s) = local
            .nodes
            .iter()
            .position(|n| n.node_ref() == node.node_ref())
        else {
            return BTreeSet::new();
        };
        let mut back = vec![false; n];
        back[s] = true;
        let mut stack = vec![s];
        while let Some(v) = stack.pop() {
            for &w in &pred[pred_start[v]..pred_start[v + 1]] {
                if !back[w] {
                    back[w] = true;
                    stack.push(w);
                }
            }
        }
        (0..n)
            .filter(|&u| back[u])
            .map(|u| local.nodes[u].node_ref())
            .collect()
    }

    /// The cycle problems of the strongly connected components that lie within `region` (a
    /// union of whole components), as [`DependencyGraph::validate`] reports them.
    fn cycles(&self, region: &BTreeSet<NodeRef>) -> Vec<GraphProblem> {
        let local = self.local(region);
        find_cycles(local.nodes.len(), &local.resolved)
            .into_iter()
            .map(|path| GraphProblem::Cycle {
                path: path.iter().map(|&u| local.nodes[u].node_ref()).collect(),
            })
            .collect()
    }
}
