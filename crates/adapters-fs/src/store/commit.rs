//! The commit: one transaction, made durable in a fixed order of numbered steps.
//!
//! 0. Only in a format-1 store (no log yet): the migration. An empty log based at the current
//!    generation is written to `registry.log.tmp`, fsynced, renamed into place and the store
//!    directory fsynced; then the current state as a checkpoint (format 3) the same way over
//!    `registry.json`. Until that rename the format-1 file is the store (readers ignore a log
//!    beside it, recovery deletes it); after it, the checkpoint and the empty log are.
//! 1. The journal record: written to a temporary file, fsynced, renamed into `journal/`, and the
//!    journal directory fsynced. It names every staged tree the commit moves (journal format 1
//!    for one tree or none, format 2 for several; the `journal` module says why).
//! 2. With new trust bytes: they are written to `trust.next` and fsynced, and the store
//!    directory fsynced so that the name is durable. The frame about to be committed records
//!    their digest, which is how recovery tells a `trust.next` to finish from one to throw away.
//! 3. With installs, for each staged tree in the record's order: it is sealed read-only (all but
//!    its top directory) and fsynced bottom-up; `packages/<id>/` is created if needed (and
//!    `packages/` fsynced); a replacement first renames the installed tree aside to
//!    `packages/<id>/<version>~replaced-<staged>` (named by the journal record's staged name, so
//!    that recovery puts back only this transaction's tree); the tree is renamed to
//!    `packages/<id>/<version>/`; its top directory is sealed and fsynced; then `packages/<id>/`
//!    is fsynced. Once every tree is in place, `staging/` is fsynced, once, so that every move is
//!    durable. All of this comes before the commit point, so a transaction of several trees has
//!    them all in place or, undone, none.
//! 4. The frame: the delta (the changed package records, the new trust anchor) is appended to
//!    `registry.log` and the log fdatasynced. That fdatasync is the commit point.
//! 5. After the commit point: `trust.next` is renamed over `trust`, the trees the new store state no
//!    longer installs (and a replaced tree) are deleted, then the journal record. None needs an
//!    fsync, because recovery finishes the rename and deletes unreferenced trees and stale
//!    records anyway. A tree that could not be deleted keeps the record in place: the record is
//!    what makes the next opening sweep `packages/`.
//! 6. When the log's frames have outgrown a sixteenth of the checkpoint: the compaction. The new
//!    state is written as the checkpoint (tmp, fsync, rename, directory fsync), then an empty log
//!    based at its generation (the same four steps). Between the two renames the old log's frames are all
//!    at or below the checkpoint's generation and are skipped. A failure here leaves the commit
//!    standing and the log long, listed in the leftovers.
//!
//! So an install of a new package id makes 11 fsyncs: the journal record 2, the staged tree one
//! per file and directory (4 for a manifest and a library in `lib/`), the packages directory,
//! the installed tree, the id directory and staging 1 each, the frame 1; a change of state only,
//! 3. A transaction of N such installs of new ids makes 4 + 7N: per tree its files and
//! directories (4), the packages directory, the installed tree and the id directory; once the
//! journal record (2), staging and the frame (so 18 for two, 25 for three). An id directory that
//! exists already saves its packages-directory fsync. New trust bytes add 2, a migration 4, a
//! compaction 4.
//!
//! Planning looks only at the packages whose records differ from the committed state
//! ([`StoreStateDelta::between`]): their invariants, that none drops a record (but the removed
//! ones the transaction purges by name) or changes a payload, and which trees come and go. The
//! others are equal to what is committed, which already keeps every invariant, except for the
//! trust file a retrust records for their versions (after a trust change), which no invariant
//! and no tree concerns.
//!
//! A failure before the commit point undoes steps 1 to 3 (every tree moved, the last moved
//! first, and every staged tree not reached deleted) and answers the error with the store
//! unchanged. If the frame's append or fdatasync fails, the log is cut back to its old length
//! and fsynced first (the frame may be durable), so the answer is still "unchanged"; if that
//! fails too, the store is poisoned. A failure after the commit point leaves the commit standing
//! and lists what could not be cleaned up.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Component, Path, PathBuf};

use guild_domain::graph::NodeRef;
use guild_domain::ids::{PackageId, Sha256Digest};
use guild_domain::lifecycle::State;
use guild_domain::store_log::StoreStateDelta;
use guild_domain::store_state::{StoreState, REGISTRY_FORMAT_V1, REGISTRY_FORMAT_V3};
use guild_domain::trust::anchor_succession_problem;
use guild_domain::version::Version;
use guild_ports::store::{Committed, StagedInstall, StoreError, StoreErrorKind, Transaction};

use super::durable::{
    io_error, remove_file_if_present, remove_tree, seal_tree, set_dir_read_only, Run,
};
use super::journal::{Intent, IntentInstall};
use super::log::{self, DiskInfo, HEADER_LEN};
use super::pins::DeleteHold;
use super::StoreLayout;

/// A validated transaction, with every path and byte string it needs.
pub(crate) struct Plan {
    pub(crate) intent: Intent,
    pub(crate) new_state: StoreState,
    /// The log frame of the commit.
    pub(crate) frame: Vec<u8>,
    /// The registry files as they are before the commit.
    pub(crate) info: DiskInfo,
    /// The current state as a checkpoint, when the store is still format 1 and the
    /// commit migrates it first.
    pub(crate) migrate: Option<Vec<u8>>,
    /// Every staged tree, in the order the commit moves them into place (the journal record's).
    pub(crate) installs: Vec<InstallPlan>,
    pub(crate) delete: Vec<(NodeRef, PathBuf)>,
    /// The new trust bytes, when the trust file changes.
    pub(crate) trust: Option<Vec<u8>>,
}

pub(crate) struct InstallPlan {
    /// The version whose tree the staged one becomes.
    pub(crate) node: NodeRef,
    pub(crate) staged: PathBuf,
    pub(crate) id_dir: PathBuf,
    pub(crate) dest: PathBuf,
    /// Where the installed tree waits while a replacement is in flight; `None` for a new install.
    pub(crate) aside: Option<PathBuf>,
}

impl InstallPlan {
    /// Whether the commit deletes a tree of the installed version: the replaced one, or garbage
    /// an earlier failure left at the destination. Then the writer holds the version's pin from
    /// before the commit to after the deletion.
    pub(crate) fn deletes_a_tree(&self) -> io::Result<bool> {
        if self.aside.is_some() {
            return Ok(true);
        }
        match fs::symlink_metadata(&self.dest) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// How a commit ended, when it did not succeed.
pub(crate) enum Failure {
    /// The store is unchanged on disk.
    Failed(StoreError),
    /// The store may be in an intermediate state; only reopening (recovery) settles it.
    Poisoned(StoreError),
    /// An injected crash stopped the commit.
    Crashed(StoreError),
}

/// Whether `path` is a plain entry directly inside `staging`.
pub(crate) fn is_staging_entry(staging: &Path, path: &Path) -> bool {
    path.parent() == Some(staging)
        && matches!(path.components().next_back(), Some(Component::Normal(_)))
}

/// Checks `tx` against the current registry and works out what the commit must do.
///
/// The checks run in a fixed order, which decides the error a transaction with several faults
/// reports: the generations and the trust anchor's succession, the invariants of the changed
/// packages, the purges, the records kept, the trust bytes, and last the staged trees.
pub(crate) fn plan(
    layout: &StoreLayout,
    current: &StoreState,
    info: DiskInfo,
    tx: Transaction,
) -> Result<Plan, StoreError> {
    check_succession(layout, current, &tx)?;
    let new = tx.new_state;
    let delta = changed_packages(current, &new)?;
    check_purges(current, &new, &tx.purge)?;
    check_records_kept(current, &delta, &tx.purge)?;
    let trust_changes = check_trust_bytes(current, &new, &tx.trust)?;
    let (added, delete) = trees_coming_and_going(layout, current, &new, &delta);
    let installs = staged_installs(layout, current, &new, &added, tx.installs)?;
    let intent = Intent {
        from_generation: current.generation(),
        to_generation: new.generation(),
        installs: installs
            .iter()
            .map(|i| IntentInstall {
                node: NodeRef {
                    id: i.id.clone(),
                    version: i.version.clone(),
                },
                staged: staged_name(&i.staged),
                replace: i.replace,
            })
            .collect(),
        delete: delete.iter().map(|(n, _)| n.clone()).collect(),
    };
    let installs = installs
        .into_iter()
        .zip(&intent.installs)
        .map(|(staged, named)| install_plan(layout, named, staged.staged))
        .collect();
    Ok(Plan {
        intent,
        frame: log::frame(&delta),
        new_state: new,
        info,
        migrate: (info.format == REGISTRY_FORMAT_V1).then(|| current.to_checkpoint_json()),
        installs,
        delete,
        trust: if trust_changes { tx.trust } else { None },
    })
}

/// An invalid transaction, for `what` reason.
fn invalid(what: String) -> StoreError {
    StoreError::new(StoreErrorKind::InvalidTransaction, what)
}

/// Refuses a transaction computed from another generation than the registry's, one whose new
/// registry is not the next generation, and one whose trust anchor does not succeed the current
/// one.
fn check_succession(
    layout: &StoreLayout,
    current: &StoreState,
    tx: &Transaction,
) -> Result<(), StoreError> {
    let from = current.generation();
    if tx.expected_generation != from {
        return Err(StoreError::new(
            StoreErrorKind::GenerationConflict,
            format!(
                "the transaction was computed from generation {} but the store state is at {from}",
                tx.expected_generation
            ),
        )
        .at(layout.registry.clone()));
    }
    let new = &tx.new_state;
    if from.checked_add(1) != Some(new.generation()) {
        return Err(invalid(format!(
            "the new store state has generation {}, not {from} + 1",
            new.generation()
        )));
    }
    if let Some(problem) = anchor_succession_problem(current.trust_anchor(), new.trust_anchor()) {
        return Err(invalid(problem).at(layout.registry.clone()));
    }
    Ok(())
}

/// The packages whose records differ from the committed state, once the new store state is known
/// to keep every invariant for them. Only these are looked at from here: the others are equal
/// to what is committed (but for the trust file a retrust records), which already keeps every
/// invariant.
fn changed_packages(current: &StoreState, new: &StoreState) -> Result<StoreStateDelta, StoreError> {
    let delta = StoreStateDelta::between(current, new)
        .map_err(|e| invalid("the new store state cannot be recorded".to_owned()).caused_by(e))?;
    new.validate_packages(delta.changed_ids())
        .map_err(|e| invalid("the new store state breaks an invariant".to_owned()).caused_by(e))?;
    Ok(delta)
}

/// Refuses a purge of a record that is not a removed version of the current registry, or that
/// the new store state keeps.
fn check_purges(
    current: &StoreState,
    new: &StoreState,
    purge: &[(PackageId, Version)],
) -> Result<(), StoreError> {
    for (id, version) in purge {
        match current.record(id, version) {
            Some(r) if r.state == State::Removed => {}
            Some(r) => {
                return Err(invalid(format!(
                    "the transaction purges {id}@{version}, which is {}, not removed",
                    r.state
                )))
            }
            None => {
                return Err(invalid(format!(
                    "the transaction purges {id}@{version}, which is not recorded"
                )))
            }
        }
        if new.record(id, version).is_some() {
            return Err(invalid(format!(
                "the transaction purges {id}@{version}, but the new store state keeps its record"
            )));
        }
    }
    Ok(())
}

/// Refuses a changed package that drops a record (but those `purge` names) or changes a
/// record's payload: versions are immutable.
fn check_records_kept(
    current: &StoreState,
    delta: &StoreStateDelta,
    purge: &[(PackageId, Version)],
) -> Result<(), StoreError> {
    for (id, changed) in &delta.packages {
        let Some(package) = current.package(id) else {
            continue;
        };
        for (version, old) in package.versions() {
            match changed.as_ref().and_then(|p| p.get(version)) {
                None if purge.iter().any(|(i, v)| i == id && v == version) => {}
                None => {
                    return Err(invalid(format!(
                        "the new store state drops the record of {id}@{version}"
                    )))
                }
                Some(r)
                    if r.payload_digest != old.payload_digest
                        || r.kind != old.kind
                        || r.publisher != old.publisher =>
                {
                    return Err(invalid(format!(
                        "the new store state changes the recorded payload of {id}@{version}"
                    )))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Checks that the transaction carries trust bytes exactly when the new store state records a new
/// trust file, and that they are the bytes it records. Answers whether the trust file changes.
fn check_trust_bytes(
    current: &StoreState,
    new: &StoreState,
    trust: &Option<Vec<u8>>,
) -> Result<bool, StoreError> {
    let trust_changes = current.trust_anchor() != new.trust_anchor();
    match (trust, new.trust_anchor()) {
        (Some(bytes), Some(anchor)) if trust_changes => {
            if Sha256Digest::of(bytes) != anchor.file_digest {
                return Err(invalid(
                    "the trust bytes are not those the new store state records".to_owned(),
                ));
            }
        }
        (None, _) if !trust_changes => {}
        (Some(_), _) => {
            return Err(invalid(
                "the transaction writes trust bytes but the store state records no new trust file"
                    .to_owned(),
            ))
        }
        (None, _) => {
            return Err(invalid(
                "the new store state records a new trust file but the transaction carries no bytes"
                    .to_owned(),
            ))
        }
    }
    Ok(trust_changes)
}

/// The versions that `state` installs of package `id`.
fn installed_versions(state: &StoreState, id: &PackageId) -> Vec<Version> {
    state
        .package(id)
        .map(|p| p.installed().map(|(v, _)| v.clone()).collect())
        .unwrap_or_default()
}

/// The versions the new store state installs and the current one does not, and the trees (with
/// their paths) of those the current registry installs and the new one does not. Trees come and
/// go only with the packages the delta changes.
fn trees_coming_and_going(
    layout: &StoreLayout,
    current: &StoreState,
    new: &StoreState,
    delta: &StoreStateDelta,
) -> (Vec<NodeRef>, Vec<(NodeRef, PathBuf)>) {
    let (mut added, mut delete) = (Vec::new(), Vec::new());
    for id in delta.changed_ids() {
        for version in installed_versions(new, id) {
            if !current.is_installed(id, &version) {
                added.push(NodeRef {
                    id: id.clone(),
                    version,
                });
            }
        }
        for version in installed_versions(current, id) {
            if !new.is_installed(id, &version) {
                let path = layout.package_dir(id, &version);
                let node = NodeRef {
                    id: id.clone(),
                    version,
                };
                delete.push((node, path));
            }
        }
    }
    (added, delete)
}

/// Matches the staged trees against the versions the new store state `added`: each added
/// version has exactly one tree staged for it, and every other staged tree replaces the tree of a
/// version installed before and after. No version and no staged tree may appear twice, and each
/// staged tree must be a directory directly in the staging area. Answers the staged trees in the
/// order given.
fn staged_installs(
    layout: &StoreLayout,
    current: &StoreState,
    new: &StoreState,
    added: &[NodeRef],
    installs: Vec<StagedInstall>,
) -> Result<Vec<StagedInstall>, StoreError> {
    let node_of = |i: &StagedInstall| NodeRef {
        id: i.id.clone(),
        version: i.version.clone(),
    };
    let fresh: Vec<NodeRef> = installs
        .iter()
        .filter(|i| !i.replace)
        .map(node_of)
        .collect();
    let fresh_set: BTreeSet<&NodeRef> = fresh.iter().collect();
    let added_set: BTreeSet<&NodeRef> = added.iter().collect();
    if fresh_set != added_set {
        let added: Vec<String> = added.iter().map(ToString::to_string).collect();
        let staged: Vec<String> = fresh.iter().map(ToString::to_string).collect();
        return Err(invalid(format!(
            "the new store state installs [{}] but the transaction stages {}",
            added.join(", "),
            if staged.is_empty() {
                "nothing".to_owned()
            } else {
                staged.join(", ")
            }
        )));
    }
    let (mut nodes, mut trees) = (BTreeSet::new(), BTreeSet::new());
    for ins in &installs {
        let node = node_of(ins);
        if ins.replace
            && (!current.is_installed(&ins.id, &ins.version)
                || !new.is_installed(&ins.id, &ins.version))
        {
            return Err(invalid(format!(
                "the transaction replaces the tree of {node}, which is not installed before \
                 and after it"
            )));
        }
        if !nodes.insert(node.clone()) {
            return Err(invalid(format!(
                "the transaction stages two trees for {node}"
            )));
        }
        staged_dir(layout, &node, &ins.staged)?;
        if !trees.insert(ins.staged.clone()) {
            return Err(invalid(format!(
                "the transaction stages the tree of {node} where it stages another version's"
            ))
            .at(ins.staged.clone()));
        }
    }
    Ok(installs)
}

/// The staged tree's name in the staging area, as the journal record keeps it.
fn staged_name(staged: &Path) -> String {
    staged
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The paths the install `named` (as the journal record names it) uses for its tree `staged`; a
/// replacement sets the installed tree aside under the staged name the record holds.
fn install_plan(layout: &StoreLayout, named: &IntentInstall, staged: PathBuf) -> InstallPlan {
    let node = &named.node;
    InstallPlan {
        staged,
        id_dir: layout.packages.join(node.id.as_str()),
        dest: layout.package_dir(&node.id, &node.version),
        aside: named
            .replace
            .then(|| layout.replaced_dir(&node.id, &node.version, &named.staged)),
        node: node.clone(),
    }
}

/// Checks that `staged`, the tree of `node`, is a directory directly in the staging area.
fn staged_dir(layout: &StoreLayout, node: &NodeRef, staged: &Path) -> Result<(), StoreError> {
    let invalid = |what: String| {
        StoreError::new(StoreErrorKind::InvalidTransaction, what).at(staged.to_path_buf())
    };
    if !is_staging_entry(&layout.staging, staged) {
        return Err(invalid(format!(
            "the staged tree of {node} is not an entry of the staging area"
        )));
    }
    let is_dir = fs::symlink_metadata(staged)
        .map_err(|e| io_error("inspect staged tree", staged, e))?
        .is_dir();
    if !is_dir {
        return Err(invalid(format!(
            "the staged tree of {node} is not a directory"
        )));
    }
    Ok(())
}

/// What has been done so far, for undoing it.
#[derive(Default)]
struct Progress {
    /// Per staged tree, in the plan's order; as long as the plan's installs once the commit
    /// reaches them.
    installs: Vec<InstallProgress>,
    /// A migration renamed the checkpoint into place: from here the log stays.
    migrated: bool,
    /// The frame's append started: the log must be cut back to its old length.
    appending: bool,
}

/// What has been done so far for one staged tree.
#[derive(Default, Clone, Copy)]
struct InstallProgress {
    tree_moved: bool,
    id_dir_created: bool,
    /// A replacement moved the installed tree aside.
    moved_aside: bool,
}

/// Carries out `plan`, then compacts the log if it has grown past a sixteenth of the checkpoint
/// (or past `compact_over` bytes, when given). Answers the registry files as they are after it.
///
/// `holds` are the writer's holds on the pins of `plan.delete`'s versions, in the same order:
/// each tree is deleted under its hold, and a hold goes with its tree (or with the commit, when
/// it stops earlier). `install_holds`, in the order of `plan.installs`, hold the installed
/// version's pin where its install deletes a tree of it ([`InstallPlan::deletes_a_tree`]); each
/// lasts until that tree is gone.
pub(crate) fn apply(
    layout: &StoreLayout,
    run: &mut Run,
    plan: &Plan,
    holds: Vec<DeleteHold>,
    install_holds: Vec<Option<DeleteHold>>,
    compact_over: Option<u64>,
) -> Result<(Committed, DiskInfo), Failure> {
    let mut progress = Progress::default();
    let mut info = plan.info;
    let before_commit_point = migrate(layout, run, plan, &mut progress, &mut info)
        .and_then(|()| prepare(layout, run, plan, &install_holds, &mut progress))
        .and_then(|()| append_frame(layout, run, plan, &mut progress, &mut info));
    if let Err(e) = before_commit_point {
        let log_len = info.log_len;
        return Err(fail_before_commit_point(
            layout,
            run,
            plan,
            &install_holds,
            &progress,
            log_len,
            e,
        ));
    }
    info.log_len += plan.frame.len() as u64;

    let mut committed = Committed {
        generation: plan.new_state.generation(),
        ..Committed::default()
    };
    finish_trust_file(layout, run, plan, &mut committed)?;
    delete_replaced_trees(run, plan, &install_holds, &mut committed)?;
    drop(install_holds);
    delete_old_trees(run, plan, holds, &mut committed)?;
    if committed.leftovers.is_empty() {
        remove_journal_record(layout, run, plan, &mut committed)?;
    } else {
        // A tree it could not delete stays accounted for by the record, so that the next
        // opening sweeps `packages/` and finishes the deletion (it does not list it otherwise).
        committed
            .leftovers
            .push(plan.intent.path_in(&layout.journal));
    }
    if info.wants_compaction(compact_over) {
        compact_after_commit(layout, run, &plan.new_state, &mut info, &mut committed)?;
    }
    Ok((committed, info))
}

/// Appends the frame to the log and fdatasyncs it: the commit point. A compaction's rename
/// whose directory fsync failed is made durable first.
fn append_frame(
    layout: &StoreLayout,
    run: &mut Run,
    plan: &Plan,
    progress: &mut Progress,
    info: &mut DiskInfo,
) -> Result<(), StoreError> {
    if info.dir_unsynced {
        // A compaction's rename whose directory fsync failed: make it durable before a
        // frame lands in the file it named.
        run.sync_path("fsync store directory", &layout.root)?;
        info.dir_unsynced = false;
    }
    progress.appending = true;
    run.append(
        "append registry frame",
        &layout.log,
        info.log_len,
        &plan.frame,
    )?;
    run.fdatasync("fdatasync registry log (commit point)", &layout.log)
}

/// How a commit that failed before its commit point ends. A crash stops it as it is. Otherwise
/// a frame whose append started is cut off the log (back to `log_len` bytes) and everything
/// else the commit wrote is undone, so that the store is unchanged; if either fails, it is
/// poisoned.
fn fail_before_commit_point(
    layout: &StoreLayout,
    run: &mut Run,
    plan: &Plan,
    holds: &[Option<DeleteHold>],
    progress: &Progress,
    log_len: u64,
    error: StoreError,
) -> Failure {
    if is_crash(&error) {
        return Failure::Crashed(error);
    }
    // The frame may be in the file, even durably: cut it off, durably, so that the answer
    // "failed" is true; if that fails too, only recovery can tell.
    if progress.appending && restore_log(layout, run, log_len).is_err() {
        return Failure::Poisoned(error);
    }
    undo_or_poison(layout, plan, holds, progress, error)
}

/// After the commit point: renames `trust.next` over `trust` when the commit changes it.
fn finish_trust_file(
    layout: &StoreLayout,
    run: &mut Run,
    plan: &Plan,
    committed: &mut Committed,
) -> Result<(), Failure> {
    if plan.trust.is_some() {
        match run.rename("rename trust file", &layout.trust_next, &layout.trust) {
            Ok(()) => {}
            Err(e) if is_crash(&e) => return Err(Failure::Crashed(e)),
            // The registry records the new bytes and `trust.next` holds them durably: the next
            // recovery finishes the rename, and this handle answers the committed bytes.
            Err(_) => committed.leftovers.push(layout.trust_next.clone()),
        }
    }
    Ok(())
}

/// After the commit point: deletes the trees the replacements set aside, each under its
/// version's pin.
fn delete_replaced_trees(
    run: &mut Run,
    plan: &Plan,
    holds: &[Option<DeleteHold>],
    committed: &mut Committed,
) -> Result<(), Failure> {
    for (ins, hold) in plan.installs.iter().zip(holds) {
        let (Some(aside), Some(hold)) = (&ins.aside, hold) else {
            continue;
        };
        let removed = run.step("delete replaced tree").and_then(|()| {
            hold.delete_tree(aside)
                .map_err(|e| io_error("delete replaced tree", aside, e))
        });
        match removed {
            Ok(_) => {}
            Err(e) if is_crash(&e) => return Err(Failure::Crashed(e)),
            Err(_) => committed.leftovers.push(aside.clone()),
        }
    }
    Ok(())
}

/// After the commit point: deletes the trees the new store state no longer installs, each under
/// its hold, and an id's directory once its last version is gone.
fn delete_old_trees(
    run: &mut Run,
    plan: &Plan,
    holds: Vec<DeleteHold>,
    committed: &mut Committed,
) -> Result<(), Failure> {
    for ((node, path), hold) in plan.delete.iter().zip(holds) {
        let removed = run.step("delete old tree").and_then(|()| {
            hold.delete_tree(path)
                .map_err(|e| io_error("delete old tree", path, e))
        });
        match removed {
            Ok(_) => {
                committed.deleted.push(node.clone());
                // Drop the id's directory once its last version is gone; failing is harmless.
                if let Some(id_dir) = path.parent() {
                    let _ = fs::remove_dir(id_dir);
                }
            }
            Err(e) if is_crash(&e) => return Err(Failure::Crashed(e)),
            Err(_) => committed.leftovers.push(path.clone()),
        }
    }
    Ok(())
}

/// After the commit point: removes the transaction's journal record.
fn remove_journal_record(
    layout: &StoreLayout,
    run: &mut Run,
    plan: &Plan,
    committed: &mut Committed,
) -> Result<(), Failure> {
    let record = plan.intent.path_in(&layout.journal);
    let removed = run.step("remove journal record").and_then(|()| {
        remove_file_if_present(&record)
            .map(|_| ())
            .map_err(|e| io_error("remove journal record", &record, e))
    });
    match removed {
        Ok(()) => {}
        Err(e) if is_crash(&e) => return Err(Failure::Crashed(e)),
        Err(_) => committed.leftovers.push(record),
    }
    Ok(())
}

/// After the commit: compacts the log to `state`. A failure leaves the commit standing and the
/// log long (listed in the leftovers, its length read back); only a log whose length cannot be
/// read poisons the store.
fn compact_after_commit(
    layout: &StoreLayout,
    run: &mut Run,
    state: &StoreState,
    info: &mut DiskInfo,
    committed: &mut Committed,
) -> Result<(), Failure> {
    match compact(layout, run, state, info) {
        Ok(()) => {}
        Err(e) if is_crash(&e) => return Err(Failure::Crashed(e)),
        Err(_) => {
            // The commit stands and the store reads the same either way; the log just stays
            // long until a later commit compacts it.
            for tmp in [&layout.registry_tmp, &layout.log_tmp] {
                let _ = remove_file_if_present(tmp);
            }
            committed.leftovers.push(layout.log.clone());
            match fs::metadata(&layout.log) {
                Ok(m) => info.log_len = m.len(),
                Err(e) => {
                    return Err(Failure::Poisoned(io_error(
                        "inspect registry log",
                        &layout.log,
                        e,
                    )))
                }
            }
        }
    }
    Ok(())
}

/// Moves a format-1 store to a checkpoint and a log, before anything else of the commit: an
/// empty log based at the current generation first (a format-1 reader ignores it), then the
/// current state as a checkpoint, whose rename is the migration's point of no return.
fn migrate(
    layout: &StoreLayout,
    run: &mut Run,
    plan: &Plan,
    progress: &mut Progress,
    info: &mut DiskInfo,
) -> Result<(), StoreError> {
    let Some(checkpoint) = &plan.migrate else {
        return Ok(());
    };
    log::create(layout, run, plan.intent.from_generation)?;
    write_checkpoint(layout, run, checkpoint, || progress.migrated = true)?;
    *info = DiskInfo {
        format: REGISTRY_FORMAT_V3,
        checkpoint_len: checkpoint.len() as u64,
        log_len: HEADER_LEN,
        dir_unsynced: false,
    };
    Ok(())
}

/// Writes `bytes` as the new checkpoint (write, fsync, rename, fsync the directory), calling
/// `renamed` once the rename is done.
fn write_checkpoint(
    layout: &StoreLayout,
    run: &mut Run,
    bytes: &[u8],
    renamed: impl FnOnce(),
) -> Result<(), StoreError> {
    run.write_file("write checkpoint", &layout.registry_tmp, bytes)?;
    run.fsync("fsync checkpoint", &layout.registry_tmp)?;
    run.rename("rename checkpoint", &layout.registry_tmp, &layout.registry)?;
    renamed();
    run.fsync("fsync store directory", &layout.root)
}

/// Replaces the checkpoint with `state` and then the log with an empty one based at its
/// generation. Between the two renames the old log's frames are all at or below the new
/// checkpoint's generation, so they are skipped: every step leaves a readable store.
fn compact(
    layout: &StoreLayout,
    run: &mut Run,
    state: &StoreState,
    info: &mut DiskInfo,
) -> Result<(), StoreError> {
    let checkpoint = state.to_checkpoint_json();
    let mut renamed = false;
    let written = write_checkpoint(layout, run, &checkpoint, || renamed = true);
    if renamed {
        info.checkpoint_len = checkpoint.len() as u64;
        // A format-2 checkpoint is replaced by one of this build's format.
        info.format = REGISTRY_FORMAT_V3;
    }
    if let Err(e) = written {
        info.dir_unsynced |= renamed;
        return Err(e);
    }
    let created = log::create(layout, run, state.generation());
    match fs::metadata(&layout.log) {
        // The rename happened whether or not the directory fsync after it did.
        Ok(m) if m.len() == HEADER_LEN => {
            info.log_len = HEADER_LEN;
            info.dir_unsynced |= created.is_err();
        }
        _ => {}
    }
    created
}

/// Cuts the log back to `len` bytes, durably. Not a numbered step: this only runs after a fault.
fn restore_log(layout: &StoreLayout, run: &mut Run, len: u64) -> Result<(), StoreError> {
    OpenOptions::new()
        .write(true)
        .open(&layout.log)
        .and_then(|f| f.set_len(len))
        .map_err(|e| io_error("restore registry log", &layout.log, e))?;
    run.sync_path("restore registry log", &layout.log)
}

/// Every step before the commit point.
fn prepare(
    layout: &StoreLayout,
    run: &mut Run,
    plan: &Plan,
    holds: &[Option<DeleteHold>],
    progress: &mut Progress,
) -> Result<(), StoreError> {
    run.atomic_write(
        [
            "write journal record",
            "fsync journal record",
            "rename journal record",
            "fsync journal directory",
        ],
        &plan.intent.tmp_path_in(&layout.journal),
        &plan.intent.path_in(&layout.journal),
        &plan.intent.to_json(),
    )?;
    if let Some(bytes) = &plan.trust {
        run.write_file("write trust file", &layout.trust_next, bytes)?;
        run.fsync("fsync trust file", &layout.trust_next)?;
        // Its name must be durable before the frame that records its digest.
        run.fsync("fsync store directory", &layout.root)?;
    }
    for (ins, hold) in plan.installs.iter().zip(holds) {
        let mut done = InstallProgress::default();
        let moved = move_into_place(layout, run, ins, hold.as_ref(), &mut done);
        progress.installs.push(done);
        moved?;
    }
    if !plan.installs.is_empty() {
        // One fsync makes every move out of the staging area durable.
        run.fsync("fsync staging directory", &layout.staging)?;
    }
    Ok(())
}

/// Step 3 for one staged tree: sealed and fsynced, its id directory made if needed, the
/// installed tree of a replacement set aside (or garbage at the destination cleared, under the
/// version's pin `hold`), the tree renamed into place, its top sealed and fsynced, and its id
/// directory fsynced. `done` records each step that needs undoing.
fn move_into_place(
    layout: &StoreLayout,
    run: &mut Run,
    ins: &InstallPlan,
    hold: Option<&DeleteHold>,
    done: &mut InstallProgress,
) -> Result<(), StoreError> {
    run.step("seal staged tree")?;
    seal_tree(&ins.staged)?;
    run.fsync_tree("fsync staged tree", &ins.staged)?;
    if !exists(&ins.id_dir)? {
        run.step("create package directory")?;
        fs::create_dir(&ins.id_dir)
            .map_err(|e| io_error("create package directory", &ins.id_dir, e))?;
        done.id_dir_created = true;
        run.fsync("fsync packages directory", &layout.packages)?;
    }
    if let Some(aside) = &ins.aside {
        // The installed tree is kept until the commit point, so that an interruption before
        // it can put it back. Its name is this transaction's own.
        run.rename("move installed tree aside", &ins.dest, aside)?;
        done.moved_aside = true;
    } else if let Some(hold) = hold {
        // A tree left at the destination is garbage from an earlier failure (the current
        // registry does not install this version, as planning checked); clear it, under the
        // version's pin, so the rename can land.
        hold.delete_tree(&ins.dest)
            .map_err(|e| io_error("clear stale tree", &ins.dest, e))?;
    }
    run.rename("move tree into place", &ins.staged, &ins.dest)?;
    done.tree_moved = true;
    run.step("seal installed tree")?;
    set_dir_read_only(&ins.dest).map_err(|e| io_error("seal installed tree", &ins.dest, e))?;
    run.fsync("fsync installed tree", &ins.dest)?;
    run.fsync("fsync package directory", &ins.id_dir)
}

fn undo_or_poison(
    layout: &StoreLayout,
    plan: &Plan,
    holds: &[Option<DeleteHold>],
    progress: &Progress,
    error: StoreError,
) -> Failure {
    if is_crash(&error) {
        return Failure::Crashed(error);
    }
    match undo(layout, plan, holds, progress) {
        Ok(()) => Failure::Failed(error),
        Err(_) => Failure::Poisoned(error),
    }
}

/// Removes everything the commit wrote before the commit point, the staged trees last moved
/// first. No fsync is needed: if a power loss brings something back, recovery finds it
/// unreferenced and removes it again. A tree the commit moved into place goes under the
/// version's pin when it replaced one (`holds`); a new version's tree needs none, since nobody
/// can pin a version that no commit installed. A staged tree the commit did not reach is deleted
/// too: the commit consumes every one.
fn undo(
    layout: &StoreLayout,
    plan: &Plan,
    holds: &[Option<DeleteHold>],
    progress: &Progress,
) -> io::Result<()> {
    for (k, (ins, hold)) in plan.installs.iter().zip(holds).enumerate().rev() {
        let done = progress.installs.get(k).copied().unwrap_or_default();
        if done.tree_moved {
            match hold {
                Some(hold) => hold.delete_tree(&ins.dest)?,
                None => remove_tree(&ins.dest)?,
            };
        } else {
            remove_tree(&ins.staged)?;
        }
        if let (Some(aside), true) = (&ins.aside, done.moved_aside) {
            fs::rename(aside, &ins.dest)?;
        }
        if done.id_dir_created {
            match fs::remove_dir(&ins.id_dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    remove_file_if_present(&layout.registry_tmp)?;
    remove_file_if_present(&layout.log_tmp)?;
    if plan.migrate.is_some() && !progress.migrated {
        // The format-1 registry is still the store; the new log beside it would be ignored, but
        // it goes, so that the disk is as it was.
        remove_file_if_present(&layout.log)?;
    }
    if plan.trust.is_some() {
        remove_file_if_present(&layout.trust_next)?;
    }
    remove_file_if_present(&plan.intent.tmp_path_in(&layout.journal))?;
    remove_file_if_present(&plan.intent.path_in(&layout.journal))?;
    Ok(())
}

fn exists(path: &Path) -> Result<bool, StoreError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("inspect package directory", path, e)),
    }
}

pub(crate) fn is_crash(e: &StoreError) -> bool {
    e.kind == StoreErrorKind::SimulatedCrash
}
