//! Notice of new committed generations: an inotify watch (through the `notify` crate) on the
//! store's root directory, which fires when `registry.json`, the commit point of every
//! transaction, is replaced.

use std::path::Path;

use guild_ports::store::{StoreError, StoreErrorKind};
use notify::{EventKind, RecursiveMode, Watcher as _};

use super::StoreLayout;

/// Calls its callback (on the watcher's own thread) after each replacement of the registry
/// file: each commit of a new generation, by any process. Several commits may be reported as
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
        let registry_name = layout.registry.file_name().map(ToOwned::to_owned);
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
                    EventKind::Create(_) | EventKind::Modify(_) | EventKind::Any
                );
                let on_registry = event
                    .paths
                    .iter()
                    .any(|p| p.file_name().map(ToOwned::to_owned) == registry_name);
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
