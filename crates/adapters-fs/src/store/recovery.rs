//! Recovery: brings the disk back in line with the registry after whatever happened before.
//!
//! A transaction's frame in the registry log is its commit point, so recovery never needs to redo
//! work: a transaction whose frame is complete is done apart from deleting trees the new
//! registry no longer references, and one whose frame is missing or torn left only trees and
//! files that the old registry does not reference. A torn frame at the end of the log (only ever
//! one that the journal record of the commit appending it accounts for, as the `log` module
//! says; any other bad frame stops recovery before it changes anything) is cut off (and the log
//! fsynced) before anything else is decided, and a log left beside a format-1
//! registry by a migration that stopped early is deleted. Both are finished the same way: delete every
//! package tree the registry does not reference, clear the staging area and the temporary files,
//! and drop the journal records. The journal records add a consistency check (a record that
//! expects a generation newer than the registry's means the registry went backwards) and say in
//! the report which transactions were finished and which were undone.
//!
//! A transaction may move several staged trees into place (a `guild sync`; its record is
//! journal format 2 and names them all). They share the one commit point, so recovery treats
//! them alike: before it, every tree the record names that the registry does not install is
//! deleted (each is accounted for by the record) and every replacement it names is undone as
//! below; after it, they are all installed and kept. A tree in `packages/` that neither the
//! registry nor a record names is never deleted, whatever a record of several trees says.
//!
//! Two kinds of change finish or undo by more than deleting. New trust bytes wait in
//! `trust.next` until after the commit point; the registry records their digest, so a
//! `trust.next` whose digest the registry records is renamed over `trust` and any other is
//! deleted. A replacement keeps the installed tree at `<version>~replaced-<staged>` until the
//! commit point, named by the staged name its journal record holds; when the registry did not
//! move on, that tree, and only that one (per replacement the record names), is put back in place of the new one (whose deletion
//! goes under the version's pin, like every deletion of a version tree: while another process
//! pins the version, both trees stay and the replaced one is reported as pinned). A tree set
//! aside by any other transaction is never put back: the sweep finds it unreferenced.
//!
//! Listing `packages/` costs a directory read per installed package, so recovery at opening does
//! it only when something says a tree may need deleting ([`Sweep::WhenNeeded`]): a journal
//! record (a transaction was in flight, or a commit could not delete what it no longer installs
//! and kept its record for recovery to finish), a log it had to cut or delete, or the
//! `sweep.pending` marker, which a sweep leaves behind whenever it keeps a tree it would delete
//! or cannot account for (pinned, unchecked, unaccounted) and removes once it keeps none. An
//! explicit recovery (`guild recover`) always sweeps ([`Sweep::Always`]) and is what reports a
//! tree that went missing by hand; opening finds such a version when it is next checked or
//! loaded.
//!
//! Everything that could make recovery guess is read and checked before anything is cut or
//! deleted: an unreadable registry, log, journal record or trust file (a link or a FIFO in its
//! place, or one over its size cap, included) fails with the file's name and leaves the disk as
//! it was. None of the deletions needs an fsync: if a power loss undoes one, the next recovery
//! deletes the same thing again.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use guild_domain::graph::NodeRef;
use guild_domain::ids::Sha256Digest;
use guild_domain::store_state::{StoreState, REGISTRY_FORMAT_V3};
use guild_ports::store::{
    InterruptedCommit, RecoveryReport, StoreError, StoreErrorKind, UncheckedTree,
};

use super::durable::{io_error, read_store_file, remove_file_if_present, remove_tree, Run};
use super::journal::{Intent, JournalDecodeError, RECORD_SUFFIX, TMP_SUFFIX};
use super::log::{self, DiskInfo};
use super::pins::Refusal;
use super::{StoreLayout, MAX_RECORD_BYTES, MAX_TRUST_BYTES};

/// The registry recovery settled on, its bytes on disk, and what recovery did.
pub(crate) struct Recovered {
    pub(crate) registry: StoreState,
    pub(crate) info: DiskInfo,
    /// The trust bytes after recovery, if there is a trust file.
    pub(crate) trust: Option<Vec<u8>>,
    pub(crate) report: RecoveryReport,
}

/// Whether recovery lists `packages/` (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// Always: an explicit recovery.
    Always,
    /// Only when a journal record, a log repair or the marker says a tree may need deleting:
    /// opening the store.
    WhenNeeded,
}

/// Recovers the store at `layout`. Staging entries named in `keep_staging` were handed out by the
/// running store and are left alone.
pub(crate) fn recover(
    layout: &StoreLayout,
    keep_staging: &BTreeSet<OsString>,
    sweep: Sweep,
    run: &mut Run,
) -> Result<Recovered, StoreError> {
    let mut report = RecoveryReport::default();
    ensure_dirs(layout, run)?;

    // Read everything recovery decides on, or answers, before changing anything.
    let records = read_journal(layout)?;
    let found = log::read(layout)?;
    let trust = read_store_file("read trust file", &layout.trust, MAX_TRUST_BYTES)?;
    let trust_next = read_store_file("read new trust file", &layout.trust_next, MAX_TRUST_BYTES)?;
    let marked = exists(&layout.sweep_marker)?;
    let mut repaired_log = false;
    let (registry, info) = match found {
        Some(found) => {
            repaired_log = found.torn_len.is_some() || found.stray_log;
            settle_log(layout, found, run, &mut report)?
        }
        None => create_registry(layout, &records, run, &mut report)?,
    };
    let generation = registry.generation();
    let undo_replacements = classify_records(&records, generation, &mut report)?;

    // Now make the disk match the registry.
    let settled = settle_trust(layout, &registry, trust_next, run, &mut report)?;
    for (node, staged) in &undo_replacements {
        put_back_replaced_tree(layout, node, staged, run)?;
    }
    remove_temp_files(layout, &mut report)?;
    if sweep == Sweep::Always || marked || repaired_log || !records.is_empty() {
        let accounted = accounted_trees(&records, &registry);
        sweep_packages(layout, &registry, &accounted, &mut report)?;
        report.swept = true;
        let kept = !report.pinned_trees.is_empty()
            || !report.unchecked_trees.is_empty()
            || !report.unaccounted_trees.is_empty();
        mark_sweep_pending(layout, kept, marked, run)?;
    }
    clear_staging(layout, keep_staging, &mut report)?;
    // The records go last: until the trees are dealt with, they are the evidence of what was in
    // flight.
    for (path, _) in &records {
        remove_file_if_present(path).map_err(|e| io_error("remove journal record", path, e))?;
    }
    report.generation = generation;
    let trust = settled.or(trust);
    Ok(Recovered {
        registry,
        info,
        trust,
        report,
    })
}

/// Leaves the `sweep.pending` marker when the sweep kept trees (durably: without it the next
/// opening would not look at them again), and removes it when it kept none.
fn mark_sweep_pending(
    layout: &StoreLayout,
    kept: bool,
    marked: bool,
    run: &mut Run,
) -> Result<(), StoreError> {
    let marker = &layout.sweep_marker;
    if kept && !marked {
        run.write_file("write sweep marker", marker, b"")?;
        run.fsync("fsync sweep marker", marker)?;
        run.sync_path("fsync store directory", &layout.root)?;
    } else if !kept && marked {
        remove_file_if_present(marker).map_err(|e| io_error("remove sweep marker", marker, e))?;
    }
    Ok(())
}

/// Whether `path` exists (a link counts, and is not followed).
fn exists(path: &Path) -> Result<bool, StoreError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("inspect", path, e)),
    }
}

/// Cuts a torn frame off the end of the log, or deletes a log a migration left beside a
/// format-1 registry, and answers the registry the files hold.
fn settle_log(
    layout: &StoreLayout,
    found: log::OnDisk,
    run: &mut Run,
    report: &mut RecoveryReport,
) -> Result<(StoreState, DiskInfo), StoreError> {
    if found.torn_len.is_some() {
        // A frame whose append did not finish: its commit point was not reached.
        cut_log(layout, found.info.log_len, run)?;
        report.removed_temp_files.push(layout.log.clone());
    }
    if found.stray_log {
        // A migration stopped before its checkpoint: the format-1 registry is the store.
        remove_file_if_present(&layout.log)
            .map_err(|e| io_error("remove stray registry log", &layout.log, e))?;
        report.removed_temp_files.push(layout.log.clone());
    }
    Ok((found.registry, found.info))
}

/// Creates an empty registry (a log, then a checkpoint) where there is none, after checking
/// that the store holds no journal record and no package tree that a lost registry would have
/// accounted for.
fn create_registry(
    layout: &StoreLayout,
    records: &[(PathBuf, Intent)],
    run: &mut Run,
    report: &mut RecoveryReport,
) -> Result<(StoreState, DiskInfo), StoreError> {
    if let Some(first) = records.first() {
        return Err(StoreError::new(
            StoreErrorKind::Corrupt,
            "registry file is missing but the journal holds records",
        )
        .at(first.0.clone()));
    }
    if dir_has_entries(&layout.packages)? {
        return Err(StoreError::new(
            StoreErrorKind::Corrupt,
            "registry file is missing but the store holds package trees",
        )
        .at(layout.registry.clone()));
    }
    let fresh = StoreState::new();
    // The log first: a checkpoint is never without one.
    log::create(layout, run, fresh.generation())?;
    let checkpoint = fresh.to_checkpoint_json();
    run.atomic_write(
        [
            "write new registry",
            "fsync new registry",
            "rename new registry",
            "fsync store directory",
        ],
        &layout.registry_tmp,
        &layout.registry,
        &checkpoint,
    )?;
    report.created = true;
    let info = DiskInfo {
        format: REGISTRY_FORMAT_V3,
        checkpoint_len: checkpoint.len() as u64,
        log_len: log::HEADER_LEN,
        dir_unsynced: false,
    };
    Ok((fresh, info))
}

/// Reports each journal record as finished (the registry reached its generation) or undone (the
/// registry is still where it started), and refuses one that fits neither: the registry went
/// backwards. Answers the replacements to undo (every one an undone record names), each as its
/// version and staged name.
fn classify_records(
    records: &[(PathBuf, Intent)],
    generation: u64,
    report: &mut RecoveryReport,
) -> Result<Vec<(NodeRef, String)>, StoreError> {
    let mut undo_replacements = Vec::new();
    for (path, intent) in records {
        let summary = InterruptedCommit {
            from_generation: intent.from_generation,
            to_generation: intent.to_generation,
            installs: intent.installs.iter().map(|i| i.node.clone()).collect(),
            delete: intent.delete.clone(),
        };
        if intent.to_generation <= generation {
            report.rolled_forward.push(summary);
        } else if intent.from_generation == generation {
            undo_replacements.extend(
                intent
                    .installs
                    .iter()
                    .filter(|i| i.replace)
                    .map(|i| (i.node.clone(), i.staged.clone())),
            );
            report.rolled_back.push(summary);
        } else {
            return Err(StoreError::new(
                StoreErrorKind::Corrupt,
                format!(
                    "journal record moves generation {} to {}, but the store state is at {generation}",
                    intent.from_generation, intent.to_generation
                ),
            )
            .at(path.clone()));
        }
    }
    Ok(undo_replacements)
}

/// Undoes a replacement of `node` that did not reach its commit point: the tree its transaction
/// set aside under `staged` goes back in place of the new one. The new tree is deleted under the
/// version's pin; while another process pins the version, both trees stay (the sweep reports the
/// replaced one).
fn put_back_replaced_tree(
    layout: &StoreLayout,
    node: &NodeRef,
    staged: &str,
    run: &mut Run,
) -> Result<(), StoreError> {
    // The name the record's own transaction gave the tree it moved aside.
    let aside = layout.replaced_dir(&node.id, &node.version, staged);
    if fs::symlink_metadata(&aside).is_err() {
        return Ok(());
    }
    // The replacement did not reach its commit point: its old tree goes back.
    let dest = layout.package_dir(&node.id, &node.version);
    let _hold = match fs::symlink_metadata(&dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("inspect replacing tree", &dest, e)),
        Ok(_) => {
            let version = node.version.to_string();
            match super::pins::hold_for_delete(layout, node.id.as_str(), &version) {
                Ok(hold) => {
                    hold.delete_tree(&dest)
                        .map_err(|e| io_error("remove replacing tree", &dest, e))?;
                    Some(hold)
                }
                // A process pinned the version and may be using the new tree: both stay, and the
                // sweep reports the replaced one.
                Err(_) => return Ok(()),
            }
        }
    };
    fs::rename(&aside, &dest).map_err(|e| io_error("restore replaced tree", &aside, e))?;
    run.sync_path("fsync package directory", super::durable::parent(&dest)?)
}

/// Deletes the temporary registry, log and trust files and the temporary journal records.
fn remove_temp_files(layout: &StoreLayout, report: &mut RecoveryReport) -> Result<(), StoreError> {
    for tmp in [&layout.registry_tmp, &layout.log_tmp, &layout.trust_tmp] {
        if remove_file_if_present(tmp).map_err(|e| io_error("remove temporary file", tmp, e))? {
            report.removed_temp_files.push(tmp.clone());
        }
    }
    for entry in list(&layout.journal)? {
        let name = entry.to_string_lossy();
        if name.ends_with(TMP_SUFFIX) {
            let path = layout.journal.join(&entry);
            remove_file_if_present(&path)
                .map_err(|e| io_error("remove temporary journal record", &path, e))?;
            report.removed_temp_files.push(path);
        }
    }
    Ok(())
}

/// The trees a record accounts for, beside the installed ones: those a journal record names (the
/// trees an interrupted change brought in, the trees a finished change deletes) and those of
/// removed versions the registry still records. Each is an id and a version, as text.
fn accounted_trees(
    records: &[(PathBuf, Intent)],
    registry: &StoreState,
) -> BTreeSet<(String, String)> {
    let mut accounted: BTreeSet<(String, String)> = BTreeSet::new();
    for (_, intent) in records {
        let named = intent
            .installs
            .iter()
            .map(|i| &i.node)
            .chain(&intent.delete);
        accounted.extend(named.map(|n| (n.id.to_string(), n.version.to_string())));
    }
    accounted.extend(
        registry
            .removed()
            .map(|(id, v)| (id.to_string(), v.to_string())),
    );
    accounted
}

/// Deletes every staging entry but those named in `keep_staging`.
fn clear_staging(
    layout: &StoreLayout,
    keep_staging: &BTreeSet<OsString>,
    report: &mut RecoveryReport,
) -> Result<(), StoreError> {
    for entry in list(&layout.staging)? {
        if keep_staging.contains(&entry) {
            continue;
        }
        let path = layout.staging.join(&entry);
        remove_tree(&path).map_err(|e| io_error("clear staging", &path, e))?;
        report.removed_staging.push(path);
    }
    Ok(())
}

/// Cuts the uncommitted tail off the log, down to `valid` bytes, durably.
fn cut_log(layout: &StoreLayout, valid: u64, run: &mut Run) -> Result<(), StoreError> {
    fs::OpenOptions::new()
        .write(true)
        .open(&layout.log)
        .and_then(|f| f.set_len(valid))
        .map_err(|e| io_error("cut the torn end of the registry log", &layout.log, e))?;
    run.sync_path("fsync registry log", &layout.log)
}

/// Finishes or drops the new trust bytes `next_bytes` left in `trust.next`: the registry's trust
/// anchor says whether their commit point was reached. Answers them when they are now the trust
/// file.
fn settle_trust(
    layout: &StoreLayout,
    registry: &StoreState,
    next_bytes: Option<Vec<u8>>,
    run: &mut Run,
    report: &mut RecoveryReport,
) -> Result<Option<Vec<u8>>, StoreError> {
    let next = &layout.trust_next;
    let Some(bytes) = next_bytes else {
        return Ok(None);
    };
    let committed = registry
        .trust_anchor()
        .is_some_and(|a| a.file_digest == Sha256Digest::of(&bytes));
    if committed {
        fs::rename(next, &layout.trust).map_err(|e| io_error("finish trust file", next, e))?;
        run.sync_path("fsync store directory", &layout.root)?;
        Ok(Some(bytes))
    } else {
        remove_file_if_present(next).map_err(|e| io_error("remove new trust file", next, e))?;
        report.removed_temp_files.push(next.clone());
        Ok(None)
    }
}

/// Creates the journal, staging and packages directories if absent, durably.
fn ensure_dirs(layout: &StoreLayout, run: &mut Run) -> Result<(), StoreError> {
    let mut created = false;
    for dir in [&layout.journal, &layout.staging, &layout.packages] {
        match fs::create_dir(dir) {
            Ok(()) => created = true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let is_dir = fs::symlink_metadata(dir)
                    .map_err(|e| io_error("inspect store directory", dir, e))?
                    .is_dir();
                if !is_dir {
                    return Err(StoreError::new(
                        StoreErrorKind::Corrupt,
                        "store path is not a directory",
                    )
                    .at(dir.clone()));
                }
            }
            Err(e) => return Err(io_error("create store directory", dir, e)),
        }
    }
    if created {
        run.sync_path("fsync store directory", &layout.root)?;
    }
    Ok(())
}

/// Every journal record, decoded, in generation order. Temporary records are skipped (recovery
/// deletes them later); anything else in the journal is an error, since only the store writes
/// there.
fn read_journal(layout: &StoreLayout) -> Result<Vec<(PathBuf, Intent)>, StoreError> {
    let mut records = Vec::new();
    for entry in list(&layout.journal)? {
        let path = layout.journal.join(&entry);
        let name = entry.to_string_lossy();
        if name.ends_with(TMP_SUFFIX) {
            continue;
        }
        if !name.ends_with(RECORD_SUFFIX) {
            return Err(
                StoreError::new(StoreErrorKind::Corrupt, "unexpected file in the journal").at(path),
            );
        }
        let bytes =
            read_store_file("read journal record", &path, MAX_RECORD_BYTES)?.ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::Io,
                    "read journal record: it went while recovery read the journal",
                )
                .at(path.clone())
            })?;
        match Intent::from_json(&bytes) {
            Ok(intent) => records.push((path, intent)),
            Err(e) => {
                let kind = match e {
                    JournalDecodeError::UnsupportedFormat { .. } => {
                        StoreErrorKind::UnsupportedFormat
                    }
                    _ => StoreErrorKind::Corrupt,
                };
                return Err(StoreError::new(kind, "decode journal record")
                    .at(path)
                    .caused_by(e));
            }
        }
    }
    records.sort_by_key(|(_, i)| i.to_generation);
    Ok(records)
}

/// Deletes every entry of `packages/` that is not the tree of an installed version and that a
/// record accounts for, and notes installed versions whose tree is missing. Accounted for are
/// the trees of `accounted` (named by a journal record, or removed versions the registry still
/// records) and those a finished replacement set aside (`<version>~replaced-...`) of a version
/// installed now; any other tree is kept and reported as unaccounted, since it may be all that
/// is left of versions a registry that went back no longer names. A tree to delete goes only
/// under the writer's hold on its pin ([`DeleteHold`](super::pins::DeleteHold)), taken once, so
/// that a process that pins it meanwhile is refused rather than left without files; a tree that
/// a live process pins stays, and so does one whose pin cannot be checked (the report says why).
fn sweep_packages(
    layout: &StoreLayout,
    registry: &StoreState,
    accounted: &BTreeSet<(String, String)>,
    report: &mut RecoveryReport,
) -> Result<(), StoreError> {
    let installed: BTreeSet<(String, String)> = registry
        .installed()
        .map(|(id, v, _)| (id.to_string(), v.to_string()))
        .collect();
    let mut expected = installed_trees(registry);
    let mut removed = Vec::new();
    for (id_name, id_is_dir) in list_typed(&layout.packages)? {
        let id_dir = layout.packages.join(&id_name);
        if !id_is_dir {
            // Not a package directory: no version lives there, so nothing can pin it.
            remove_tree(&id_dir).map_err(|e| io_error("remove unreferenced tree", &id_dir, e))?;
            removed.push(id_dir);
            continue;
        }
        let mut none_expected = BTreeMap::new();
        let versions = expected.get_mut(&id_name).unwrap_or(&mut none_expected);
        let mut kept = 0;
        for (version_name, is_dir) in list_typed(&id_dir)? {
            if is_dir && versions.remove(&version_name).is_some() {
                kept += 1;
                continue;
            }
            let tree = id_dir.join(&version_name);
            // A tree set aside by a replacement (`<version>~replaced-...`) holds files of
            // `<version>`, whose pin guards it.
            let version_name = version_name.to_string_lossy();
            let pinned_as = version_name.split('~').next().unwrap_or_default();
            let key = (id_name.to_string_lossy().into_owned(), pinned_as.to_owned());
            let set_aside = version_name.contains('~');
            let accounted_for = accounted.contains(&key) || (set_aside && installed.contains(&key));
            if !accounted_for {
                kept += 1;
                report.unaccounted_trees.push(tree);
                continue;
            }
            let hold = super::pins::hold_for_delete(layout, &id_name.to_string_lossy(), pinned_as);
            match hold {
                Ok(hold) => {
                    hold.delete_tree(&tree)
                        .map_err(|e| io_error("remove unreferenced tree", &tree, e))?;
                    removed.push(tree);
                }
                Err(Refusal::Pinned(_)) => {
                    // A live process that read an older generation has this version loaded:
                    // its files stay until it lets go, and a later recovery deletes them.
                    kept += 1;
                    report.pinned_trees.push(tree);
                }
                Err(Refusal::Unknown(e)) => {
                    kept += 1;
                    report.unchecked_trees.push(UncheckedTree {
                        path: tree,
                        reason: e.to_string(),
                    });
                }
            }
        }
        if kept == 0 {
            fs::remove_dir(&id_dir)
                .map_err(|e| io_error("remove empty package directory", &id_dir, e))?;
        }
    }
    removed.sort();
    report.removed_trees = removed;
    // Whatever is still expected was not found on disk.
    report.missing_trees = expected
        .into_values()
        .flat_map(BTreeMap::into_values)
        .collect();
    Ok(())
}

/// The trees `registry` installs: for each id's directory name, each version's directory name
/// with the version.
fn installed_trees(registry: &StoreState) -> BTreeMap<OsString, BTreeMap<OsString, NodeRef>> {
    let mut expected: BTreeMap<OsString, BTreeMap<OsString, NodeRef>> = BTreeMap::new();
    for (id, version, _) in registry.installed() {
        expected
            .entry(OsString::from(id.as_str()))
            .or_default()
            .insert(
                OsString::from(version.to_string()),
                NodeRef {
                    id: id.clone(),
                    version: version.clone(),
                },
            );
    }
    expected
}

/// The names in directory `dir`, each with whether it is a directory (not a link to one).
/// The type comes from the directory listing itself, which saves a system call per entry.
fn list_typed(dir: &Path) -> Result<Vec<(OsString, bool)>, StoreError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_error("list directory", dir, e))? {
        let entry = entry.map_err(|e| io_error("list directory", dir, e))?;
        let is_dir = entry
            .file_type()
            .map_err(|e| io_error("inspect directory entry", &entry.path(), e))?
            .is_dir();
        names.push((entry.file_name(), is_dir));
    }
    Ok(names)
}

/// The names in directory `dir`, sorted.
fn list(dir: &Path) -> Result<Vec<OsString>, StoreError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_error("list directory", dir, e))? {
        names.push(
            entry
                .map_err(|e| io_error("list directory", dir, e))?
                .file_name(),
        );
    }
    names.sort();
    Ok(names)
}

fn dir_has_entries(dir: &Path) -> Result<bool, StoreError> {
    Ok(!list(dir)?.is_empty())
}
