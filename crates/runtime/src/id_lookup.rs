//! The impl-id table behind [`KernelRegistry::find_by_id`](crate::registry::KernelRegistry::find_by_id),
//! read without a shared write.
//!
//! Reading the registry's snapshot through arc-swap costs two locked instructions (its guard
//! is recorded and paid back); a binding costs two more (counted and uncounted) and the stored
//! kernel's reference two more. A lookup by impl id is frequent and answers a single kernel, so
//! it skips the guard: every snapshot carries an [`IdTable`] of its enabled kernels, each
//! thread keeps, per registry, the last table it took from a snapshot, and a lookup only
//! compares that table's generation with the registry's (an acquiring load of a word that
//! changes only when the registry publishes, alone on its cache line). A thread whose copy is
//! older reads the current snapshot's table through arc-swap once.
//!
//! The writer numbers the snapshot's table, stores the new generation and only then swaps the
//! snapshot in. So a table is never accepted while the registry's generation is newer than it,
//! and a table can only be had from a snapshot that was swapped in: a lookup that follows
//! (happens after) another lookup, or a publication, answers from the same snapshot or a newer
//! one, and between the generation's store and the swap a lookup answers from the snapshot the
//! other lookups still read.
//!
//! The table holds weak references to the stored kernels, so a thread's copy keeps no package
//! loaded, whatever its age: a kernel whose package was replaced or unloaded either no longer
//! upgrades (its last strong reference is gone) or upgrades to a package that is marked
//! draining for good, which the binding refuses (see the [registry](crate::registry#draining)).
//! The strong reference an upgrade takes may then be the kernel's last, so the library can
//! close in the lookup that drops it; that happens after the thread's cache is released, so a
//! plugin's shutdown that looks up again finds the cache free.
//!
//! A thread keeps the tables of at most [`SLOTS`] registries, the most recently used first;
//! beyond that the least recently used goes. What a kept table holds on to is memory only:
//! its ids and the allocations of kernels already dropped, until the slot is reused or the
//! thread ends (so at most `SLOTS` tables per thread).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use guild_domain::ids::ImplId;

use crate::snapshot::{IdTable, StoredOp};

/// How many registries' tables a thread keeps.
const SLOTS: usize = 4;

/// A registry's name in the threads' caches and its current generation.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct IdLookup {
    /// Names the registry in the threads' caches; never reused within a process.
    registry: u64,
    /// The generation of the newest snapshot, stored before that snapshot is swapped in. On a
    /// line of its own (128 bytes: the pair adjacent-line prefetching moves together), since
    /// every lookup reads it and the registry's locks beside it are written.
    generation: AtomicU64,
}

/// A thread's tables, by registry, most recently used first.
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
    /// The lookup of a new registry, whose empty snapshot is generation 0.
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        IdLookup {
            registry: NEXT.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
        }
    }

    /// Numbers the next snapshot: the generation its table is built with. Only the registry's
    /// writer calls this, one publication at a time, and then [`IdLookup::publish`].
    pub(crate) fn next_generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed) + 1
    }

    /// Makes `generation` the current one. Called before the snapshot of that generation is
    /// swapped in (see the module documentation).
    pub(crate) fn publish(&self, generation: u64) {
        // Release: whoever reads this generation and then takes a table from a later snapshot
        // is ordered after everything the writer did before.
        self.generation.store(generation, Ordering::Release);
    }

    /// The stored kernel with this impl id, with a strong reference: from this thread's table
    /// when it is as new as the registry's generation, otherwise from `current()`'s.
    #[inline]
    pub(crate) fn find(
        &self,
        impl_id: &ImplId,
        current: impl FnOnce() -> Arc<IdTable>,
    ) -> Option<Arc<StoredOp>> {
        let generation = self.generation.load(Ordering::Acquire);
        let mut current = Some(current);
        CACHE
            .try_with(|cache| {
                let mut cache = cache.borrow_mut();
                if let Some(table) = cache.hit(self.registry, generation) {
                    return table.find(impl_id);
                }
                let table = (current.take().expect("called once"))();
                let found = table.find(impl_id);
                let old = cache.refresh(self.registry, table);
                // The replaced table is dropped after the borrow ends.
                drop(cache);
                drop(old);
                found
            })
            // While the thread's locals are torn down: no cache, the table read directly.
            .unwrap_or_else(|_| current.take().and_then(|c| c().find(impl_id)))
    }
}

impl Cache {
    /// `registry`'s table when it is at least `generation`, moved first.
    #[inline]
    fn hit(&mut self, registry: u64, generation: u64) -> Option<&IdTable> {
        let at = self.slots.iter().position(|s| {
            s.as_ref()
                .is_some_and(|(r, t)| *r == registry && t.generation >= generation)
        })?;
        if at != 0 {
            self.slots[..=at].rotate_right(1);
        }
        self.slots[0].as_ref().map(|(_, t)| &**t)
    }

    /// Puts `table` first as `registry`'s, answering the table it replaces (the registry's
    /// older one, or the least recently used slot's when the registry had none).
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
        Arc::new(IdTable::new(generation, &rustc_hash::FxHashMap::default()))
    }

    fn registries(cache: &Cache) -> Vec<Option<u64>> {
        cache
            .slots
            .iter()
            .map(|s| s.as_ref().map(|(r, _)| *r))
            .collect()
    }

    #[test]
    fn a_used_registry_moves_first_and_the_least_recently_used_leaves_when_full() {
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
        // A hit moves its registry first; a table older than asked for is no hit.
        assert!(cache.hit(3, 2).is_none());
        assert_eq!(cache.hit(3, 1).map(|t| t.generation), Some(1));
        assert_eq!(registries(&cache), [Some(3), Some(2), Some(4), Some(1)]);
        // A fifth registry pushes out the one used longest ago.
        let old = cache.refresh(5, table(1)).unwrap();
        assert_eq!(old.0, 1);
        assert_eq!(registries(&cache), [Some(5), Some(3), Some(2), Some(4)]);
    }
}
