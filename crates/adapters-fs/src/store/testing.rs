//! Instrumentation for tests that must act at an exact moment inside a writer: a function the
//! store calls just before it deletes a version tree, so that a test can, say, have another
//! process pin that version right then. Nothing is called unless a test registered a hook for
//! the store's root; the cost otherwise is one atomic load per deleted tree.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

type Hook = Arc<dyn Fn(&Path) + Send + Sync>;

static HOOKS: Mutex<Vec<(u64, PathBuf, Hook)>> = Mutex::new(Vec::new());
static COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Removes its hook when dropped.
#[must_use = "the hook is removed when this is dropped"]
#[derive(Debug)]
pub struct HookGuard(u64);

impl Drop for HookGuard {
    fn drop(&mut self) {
        let mut hooks = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
        hooks.retain(|(n, _, _)| *n != self.0);
        COUNT.store(hooks.len(), Ordering::SeqCst);
    }
}

/// Calls `hook` with the path of each version tree that a writer of the store at `root` is
/// about to delete, after it decided to delete it and before the first file goes.
pub fn before_tree_delete(
    root: impl Into<PathBuf>,
    hook: impl Fn(&Path) + Send + Sync + 'static,
) -> HookGuard {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut hooks = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    hooks.push((n, root.into(), Arc::new(hook)));
    COUNT.store(hooks.len(), Ordering::SeqCst);
    HookGuard(n)
}

/// Runs the hooks registered for `root` on `tree`.
pub(crate) fn fire(root: &Path, tree: &Path) {
    if COUNT.load(Ordering::SeqCst) == 0 {
        return;
    }
    let found: Vec<Hook> = HOOKS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, r, _)| r == root)
        .map(|(_, _, h)| Arc::clone(h))
        .collect();
    for hook in found {
        hook(tree);
    }
}

/// Rewrites the closed store at `root` as the code before the registry log wrote it: the whole
/// committed registry in format 1 in `registry.json`, and no `registry.log`. For tests of
/// migration, and of stores edited by hand or by older tools.
pub fn as_format_1(root: impl Into<PathBuf>) -> Result<(), guild_ports::store::StoreError> {
    use guild_ports::store::{StoreError, StoreErrorKind};
    let layout = super::StoreLayout::new(root);
    let state = super::read_registry(layout.root.clone())?.ok_or_else(|| {
        StoreError::new(StoreErrorKind::Corrupt, "registry file is missing")
            .at(layout.registry.clone())
    })?;
    std::fs::write(&layout.registry, state.to_json())
        .map_err(|e| super::io_error("write format-1 registry", &layout.registry, e))?;
    super::durable::remove_file_if_present(&layout.log)
        .map_err(|e| super::io_error("remove registry log", &layout.log, e))?;
    Ok(())
}
