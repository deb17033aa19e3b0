//! The impl-id table behind [`KernelRegistry::find_by_id`](crate::registry::KernelRegistry::find_by_id),
//! read without a shared write.
//!
//! Reading the registry's snapshot through arc-swap costs two locked instructions (its guard
//! is recorded and paid back); a binding costs two more (counted and uncounted) and the stored
//! kernel's reference two more. A lookup by impl id is frequent and answers a single kernel, so
//! it skips the guard: each thread keeps, per registry, the last [`IdTable`] it read, and a
//! lookup only compares that table's generation with the registry's (a plain load of a word
//! that changes only when the registry publishes). A thread that finds its copy out of date
//! reads the new table through arc-swap once.
//!
//! The table holds weak references to the stored kernels, so a thread's copy keeps no package
//! loaded, whatever its age: a kernel whose package was replaced or unloaded either no longer
//! upgrades (its last strong reference is gone) or upgrades to a package that is marked
//! draining for good, which the binding refuses (see the [registry](crate::registry#draining)).
//! A thread keeps the tables of at most [`SLOTS`] registries; beyond that the oldest goes. A
//! registry that is dropped leaves its table in a thread's slot until the slot is reused or the
//! thread ends: the weak references keep the kernels' memory, not their code.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::ArcSwap;
use guild_domain::ids::ImplId;
use rustc_hash::FxHashMap;

use crate::snapshot::{Snapshot, StoredOp};

/// How many registries' tables a thread keeps.
const SLOTS: usize = 4;

/// The enabled kernels of one registry generation, by impl id, held weakly.
#[derive(Debug, Default)]
struct IdTable {
    generation: u64,
    ids: FxHashMap<ImplId, Weak<StoredOp>>,
}

impl IdTable {
    fn find(&self, impl_id: &ImplId) -> Option<Arc<StoredOp>> {
        self.ids.get(impl_id).and_then(Weak::upgrade)
    }
}

/// One registry's published impl-id table and its generation.
#[derive(Debug)]
pub(crate) struct IdLookup {
    /// Names this registry in the threads' caches; never reused within a process.
    registry: u64,
    /// The generation of the newest published table. Written after the table, by the registry's
    /// writer (under its lock), so a reader that sees a generation finds that table or a newer
    /// one.
    generation: AtomicU64,
    table: ArcSwap<IdTable>,
}

/// A thread's tables, by registry, newest first.
struct Cache {
    slots: [Option<(u64, Arc<IdTable>)>; SLOTS],
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            slots: [None, None, None, None],
        })
    };
}

impl IdLookup {
    /// An empty table for a new registry.
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        IdLookup {
            registry: NEXT.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            table: ArcSwap::from_pointee(IdTable::default()),
        }
    }

    /// Publishes the impl ids of `snapshot`, which the registry has just swapped in. Only the
    /// registry's writer calls this, one publication at a time.
    pub(crate) fn publish(&self, snapshot: &Snapshot) {
        let generation = self.generation.load(Ordering::Relaxed) + 1;
        let ids = snapshot
            .by_id
            .iter()
            .map(|(id, op)| (id.clone(), Arc::downgrade(op)))
            .collect();
        self.table.store(Arc::new(IdTable { generation, ids }));
        // Release: a reader that acquires this generation finds the table stored above.
        self.generation.store(generation, Ordering::Release);
    }

    /// The stored kernel with this impl id in the newest table, with a strong reference.
    #[inline]
    pub(crate) fn find(&self, impl_id: &ImplId) -> Option<Arc<StoredOp>> {
        let current = self.generation.load(Ordering::Acquire);
        CACHE
            .try_with(|cache| {
                let mut cache = cache.borrow_mut();
                if let Some((_, table)) = cache.slots.iter().flatten().find(|(registry, table)| {
                    *registry == self.registry && table.generation >= current
                }) {
                    return table.find(impl_id);
                }
                let table = self.table.load_full();
                let found = table.find(impl_id);
                let old = cache.refresh(self.registry, table);
                // The replaced table is dropped after the borrow ends.
                drop(cache);
                drop(old);
                found
            })
            // While the thread's locals are torn down: no cache, the table read directly.
            .unwrap_or_else(|_| self.table.load().find(impl_id))
    }
}

impl Cache {
    /// Puts `table` first as `registry`'s, answering the table it replaces (the registry's
    /// older one, or the oldest slot's when the registry had none).
    fn refresh(&mut self, registry: u64, table: Arc<IdTable>) -> Option<(u64, Arc<IdTable>)> {
        let at = self
            .slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|(r, _)| *r == registry))
            .unwrap_or(SLOTS - 1);
        let old = self.slots[at].take();
        self.slots[..=at].rotate_right(1);
        self.slots[0] = Some((registry, table));
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(generation: u64) -> Arc<IdTable> {
        Arc::new(IdTable {
            generation,
            ids: FxHashMap::default(),
        })
    }

    fn registries(cache: &Cache) -> Vec<Option<u64>> {
        cache
            .slots
            .iter()
            .map(|s| s.as_ref().map(|(r, _)| *r))
            .collect()
    }

    #[test]
    fn a_refreshed_registry_moves_first_and_the_oldest_leaves_when_full() {
        let mut cache = Cache {
            slots: [None, None, None, None],
        };
        for r in 1..=4 {
            assert!(cache.refresh(r, table(1)).is_none());
        }
        assert_eq!(registries(&cache), [Some(4), Some(3), Some(2), Some(1)]);
        // A newer table of a registry already cached replaces its own slot, nothing else.
        let old = cache.refresh(2, table(2)).unwrap();
        assert_eq!((old.0, old.1.generation), (2, 1));
        assert_eq!(registries(&cache), [Some(2), Some(4), Some(3), Some(1)]);
        // A fifth registry pushes out the one used longest ago.
        let old = cache.refresh(5, table(1)).unwrap();
        assert_eq!(old.0, 1);
        assert_eq!(registries(&cache), [Some(5), Some(2), Some(4), Some(3)]);
    }
}
