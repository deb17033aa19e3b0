//! Notice of new committed generations: an inotify watch (through the `notify` crate) on the
//! store's root directory, which fires when a commit's frame is written to `registry.log` (and
//! when the writer closes it, after the fdatasync that is the commit point), and when a
//! compaction or a migration replaces `registry.json` or `registry.log`.

use std::path::Path;

use guild_ports::store::{StoreError, StoreErrorKind};
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher as _};

use super::StoreLayout;

/// Calls its callback (on the watcher's own thread) after each change to the registry files:
/// each commit of a new generation, by any process. Several commits may be reported as
/// one call, and a call may come for a commit already seen; the callback re-reads the store to
/// learn what changed. Dropping the watcher stops it.
pub struct StoreWatcher {
    _watcher: notify::RecommendedWatcher,
}

impl std::fmt::Debug for StoreWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWatcher").finish_non_exhaustive()
    }
}

impl StoreWatcher {
    /// Watches the store at `root`.
    pub fn new(
        root: &Path,
        on_commit: impl Fn() + Send + 'static,
    ) -> Result<StoreWatcher, StoreError> {
        let layout = StoreLayout::new(root);
        let names: Vec<_> = [&layout.registry, &layout.log]
            .into_iter()
            .filter_map(|p| p.file_name().map(ToOwned::to_owned))
            .collect();
        let failed = |e: notify::Error| {
            StoreError::new(StoreErrorKind::Io, "watch store directory")
                .at(layout.root.clone())
                .caused_by(e)
        };
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else {
                    // A lost event (an overflowed queue) may hide a commit: say so anyway.
                    on_commit();
                    return;
                };
                let lands = matches!(
                    event.kind,
                    EventKind::Create(_)
                        | EventKind::Modify(_)
                        | EventKind::Access(AccessKind::Close(AccessMode::Write))
                        | EventKind::Any
                );
                let on_registry = event
                    .paths
                    .iter()
                    .any(|p| p.file_name().is_some_and(|n| names.iter().any(|m| m == n)));
                if lands && on_registry {
                    on_commit();
                }
            })
            .map_err(failed)?;
        watcher
            .watch(&layout.root, RecursiveMode::NonRecursive)
            .map_err(failed)?;
        Ok(StoreWatcher { _watcher: watcher })
    }
}
