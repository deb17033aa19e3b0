//! An ordered map whose copies share their storage, for the registry's map of packages: every
//! change copies that map (the draft of the next commit, the committed state a store hands out)
//! and then writes to one or two entries of it, so a copy must not cost the size of the store.
//!
//! The entries are kept in key order in chunks of at most `MAX_CHUNK` (64) entries, each chunk
//! behind an [`Arc`]. Cloning the map copies one pointer per chunk (a store of 10,000 packages
//! has about 160 of them); writing to an entry copies only its chunk, and only when another map
//! still shares it. Two maps of one lineage can then be compared chunk by chunk, skipping every
//! chunk they still share ([`ChunkMap::differences`]).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// The most entries a chunk holds; a chunk that grows past it is split in two halves.
const MAX_CHUNK: usize = 64;

/// A chunk that shrinks below this is merged into a neighbour when the two fit in one chunk,
/// so that removals cannot leave the map as many tiny chunks.
const MIN_CHUNK: usize = MAX_CHUNK / 4;

/// An ordered map from `K` to `V` whose clones share every chunk of entries neither writes to.
#[derive(Clone)]
pub struct ChunkMap<K, V> {
    /// Non-empty chunks, each sorted, each key below every key of the next chunk.
    chunks: Vec<Arc<Vec<(K, V)>>>,
    len: usize,
}

impl<K, V> Default for ChunkMap<K, V> {
    fn default() -> Self {
        ChunkMap {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for ChunkMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for ChunkMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<K: Eq, V: Eq> Eq for ChunkMap<K, V> {}

/// One entry that differs between two maps ([`ChunkMap::differences`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Difference<'a, K, V> {
    /// Only the first map has the key.
    Removed(&'a K, &'a V),
    /// Only the second map has the key.
    Added(&'a K, &'a V),
    /// Both have the key, with values that may differ (the first map's, then the second's).
    Both(&'a K, &'a V, &'a V),
}

impl<K, V> ChunkMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.chunks
            .iter()
            .flat_map(|c| c.iter().map(|(k, v)| (k, v)))
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }
}

impl<K: Ord + Clone, V: Clone> ChunkMap<K, V> {
    /// The index of the chunk where `key` is or would go: the first chunk whose last key is not
    /// below it, or the last chunk when every key is. `None` only for an empty map.
    fn chunk_of<Q>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        if self.chunks.is_empty() {
            return None;
        }
        let i = self.chunks.partition_point(|c| match c.last() {
            Some((last, _)) => last.borrow() < key,
            None => true,
        });
        Some(i.min(self.chunks.len() - 1))
    }

    /// The value of `key`, if any.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let chunk = &self.chunks[self.chunk_of(key)?];
        let at = chunk.binary_search_by(|(k, _)| k.borrow().cmp(key)).ok()?;
        Some(&chunk[at].1)
    }

    /// Whether the map has `key`.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get(key).is_some()
    }

    /// The value of `key` to write to, if any. Its chunk is copied first if another map shares
    /// it.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let c = self.chunk_of(key)?;
        let at = self.chunks[c]
            .binary_search_by(|(k, _)| k.borrow().cmp(key))
            .ok()?;
        Some(&mut Arc::make_mut(&mut self.chunks[c])[at].1)
    }

    /// Calls `change` on every value for which `wants` answers true, copying only the chunks
    /// that hold one (and only those another map shares).
    pub fn update_where(
        &mut self,
        mut wants: impl FnMut(&K, &V) -> bool,
        mut change: impl FnMut(&K, &mut V),
    ) {
        for chunk in &mut self.chunks {
            if !chunk.iter().any(|(k, v)| wants(k, v)) {
                continue;
            }
            for (k, v) in Arc::make_mut(chunk).iter_mut() {
                if wants(k, v) {
                    change(k, v);
                }
            }
        }
    }

    /// The value of `key` to write to, inserted from `make` first when the map lacks it.
    pub fn get_or_insert_with(&mut self, key: &K, make: impl FnOnce() -> V) -> &mut V {
        let (c, at) = match self.find(key) {
            Ok(found) => found,
            Err((c, at)) => self.insert_at(c, at, key.clone(), make()),
        };
        &mut Arc::make_mut(&mut self.chunks[c])[at].1
    }

    /// Inserts `value` under `key`, answering the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        // A map filled in key order (a checkpoint of 10,000 packages read back) gets each key
        // past its last one: one comparison finds the place, where a search made nine.
        if let Some(last) = self.chunks.last_mut() {
            if last.last().is_some_and(|(k, _)| *k < key) {
                self.len += 1;
                if last.len() < MAX_CHUNK {
                    Arc::make_mut(last).push((key, value));
                } else {
                    // The full chunk is left full: entries that come in order are not inserted
                    // among, and half-full chunks would take twice as many.
                    let mut next = Vec::with_capacity(MAX_CHUNK);
                    next.push((key, value));
                    self.chunks.push(Arc::new(next));
                }
                return None;
            }
        }
        match self.find(&key) {
            Ok((c, at)) => Some(std::mem::replace(
                &mut Arc::make_mut(&mut self.chunks[c])[at].1,
                value,
            )),
            Err((c, at)) => {
                self.insert_at(c, at, key, value);
                None
            }
        }
    }

    /// Removes `key`, answering its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let (c, at) = self.find(key).ok()?;
        let chunk = Arc::make_mut(&mut self.chunks[c]);
        let (_, value) = chunk.remove(at);
        self.len -= 1;
        if chunk.is_empty() {
            self.chunks.remove(c);
        } else if chunk.len() < MIN_CHUNK {
            self.merge_around(c);
        }
        Some(value)
    }

    /// Where `key` is (`Ok`: chunk and index), or where it would be inserted (`Err`).
    fn find<Q>(&self, key: &Q) -> Result<(usize, usize), (usize, usize)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let Some(c) = self.chunk_of(key) else {
            return Err((0, 0));
        };
        match self.chunks[c].binary_search_by(|(k, _)| k.borrow().cmp(key)) {
            Ok(at) => Ok((c, at)),
            Err(at) => Err((c, at)),
        }
    }

    /// Inserts at a place [`Self::find`] answered, splitting a chunk that grows too big, and
    /// answers where the entry ended up.
    fn insert_at(&mut self, c: usize, at: usize, key: K, value: V) -> (usize, usize) {
        self.len += 1;
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(vec![(key, value)]));
            return (0, 0);
        }
        let chunk = Arc::make_mut(&mut self.chunks[c]);
        chunk.insert(at, (key, value));
        if chunk.len() <= MAX_CHUNK {
            return (c, at);
        }
        let half = chunk.len() / 2;
        // Room for the chunk to fill up without growing step by step (reallocations of
        // kilobytes).
        let mut upper = Vec::with_capacity(MAX_CHUNK + 1);
        upper.extend(chunk.drain(half..));
        self.chunks.insert(c + 1, Arc::new(upper));
        if at < half {
            (c, at)
        } else {
            (c + 1, at - half)
        }
    }

    /// Merges the small chunk `c` into a neighbour when the two fit in one chunk.
    fn merge_around(&mut self, c: usize) {
        let fits = |a: usize, b: usize| self.chunks[a].len() + self.chunks[b].len() <= MAX_CHUNK;
        let pair = if c > 0 && fits(c - 1, c) {
            c - 1
        } else if c + 1 < self.chunks.len() && fits(c, c + 1) {
            c
        } else {
            return;
        };
        let upper = self.chunks.remove(pair + 1);
        let lower = Arc::make_mut(&mut self.chunks[pair]);
        lower.extend(upper.iter().cloned());
    }

    /// The entries in which `self` and `other` differ, in key order, skipping every chunk the two
    /// maps share: an entry of a shared chunk is in both with the same value. Entries of chunks
    /// that are not shared are answered as [`Difference::Both`] even when their values are equal;
    /// the caller compares them as it sees fit. Two copies of one map that differ in a few
    /// entries are compared at the cost of those entries' chunks, not of the map.
    pub fn differences<'a>(&'a self, other: &'a Self) -> Vec<Difference<'a, K, V>> {
        let mut out = Vec::new();
        let (a, b) = (&self.chunks, &other.chunks);
        // A cursor in each map: chunk index and entry index within it.
        let (mut ac, mut ae, mut bc, mut be) = (0, 0, 0, 0);
        loop {
            // Whole chunks at the same place in both maps that are the same allocation.
            while ae == 0 && be == 0 && ac < a.len() && bc < b.len() && Arc::ptr_eq(&a[ac], &b[bc])
            {
                ac += 1;
                bc += 1;
            }
            let left = a.get(ac).map(|chunk| &chunk[ae]);
            let right = b.get(bc).map(|chunk| &chunk[be]);
            let step_a = |ac: &mut usize, ae: &mut usize| {
                *ae += 1;
                if *ae == a[*ac].len() {
                    *ac += 1;
                    *ae = 0;
                }
            };
            let step_b = |bc: &mut usize, be: &mut usize| {
                *be += 1;
                if *be == b[*bc].len() {
                    *bc += 1;
                    *be = 0;
                }
            };
            match (left, right) {
                (None, None) => return out,
                (Some((k, v)), None) => {
                    out.push(Difference::Removed(k, v));
                    step_a(&mut ac, &mut ae);
                }
                (None, Some((k, v))) => {
                    out.push(Difference::Added(k, v));
                    step_b(&mut bc, &mut be);
                }
                (Some((ka, va)), Some((kb, vb))) => match ka.cmp(kb) {
                    Ordering::Less => {
                        out.push(Difference::Removed(ka, va));
                        step_a(&mut ac, &mut ae);
                    }
                    Ordering::Greater => {
                        out.push(Difference::Added(kb, vb));
                        step_b(&mut bc, &mut be);
                    }
                    Ordering::Equal => {
                        out.push(Difference::Both(ka, va, vb));
                        step_a(&mut ac, &mut ae);
                        step_b(&mut bc, &mut be);
                    }
                },
            }
        }
    }
}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for ChunkMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut map = ChunkMap::new();
        for (k, v) in entries {
            map.insert(k, v);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Checks the map's own invariants and that it holds exactly what `model` holds.
    fn check(map: &ChunkMap<u16, u32>, model: &BTreeMap<u16, u32>) {
        assert_eq!(map.len(), model.len());
        assert!(map
            .chunks
            .iter()
            .all(|c| !c.is_empty() && c.len() <= MAX_CHUNK));
        let keys: Vec<u16> = map.keys().copied().collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        assert!(map
            .iter()
            .map(|(k, v)| (*k, *v))
            .eq(model.iter().map(|(k, v)| (*k, *v))));
        for (k, v) in model {
            assert_eq!(map.get(k), Some(v));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        /// An insertion this far past the largest key (a map filled in key order).
        Append(u16, u32),
        Remove(u16),
        Write(u16, u32),
        Fork,
    }

    fn op() -> impl Strategy<Value = Op> {
        // A narrow key range, so that removals and rewrites find what was inserted.
        prop_oneof![
            4 => (0u16..400, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => (1u16..4, any::<u32>()).prop_map(|(k, v)| Op::Append(k, v)),
            2 => (0u16..400).prop_map(Op::Remove),
            1 => (0u16..400, any::<u32>()).prop_map(|(k, v)| Op::Write(k, v)),
            1 => Just(Op::Fork),
        ]
    }

    proptest! {
        #[test]
        fn chunk_map_behaves_as_an_ordered_map_and_copies_stay_apart(
            ops in prop::collection::vec(op(), 0..600)
        ) {
            let mut map = ChunkMap::new();
            let mut model = BTreeMap::new();
            // Earlier copies with what they held then: writing to the map must not reach them.
            let mut forks: Vec<(ChunkMap<u16, u32>, BTreeMap<u16, u32>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(map.insert(k, v), model.insert(k, v)),
                    Op::Append(past, v) => {
                        let k = model.keys().next_back().map_or(0, |last| last.saturating_add(past));
                        prop_assert_eq!(map.insert(k, v), model.insert(k, v));
                    }
                    Op::Remove(k) => prop_assert_eq!(map.remove(&k), model.remove(&k)),
                    Op::Write(k, v) => {
                        *map.get_or_insert_with(&k, || 0) = v;
                        model.insert(k, v);
                    }
                    Op::Fork => forks.push((map.clone(), model.clone())),
                }
                check(&map, &model);
            }
            for (fork, then) in &forks {
                check(fork, then);
                // The differences, with equal values taken out, are the model's.
                let found: Vec<(u16, Option<u32>, Option<u32>)> = fork
                    .differences(&map)
                    .into_iter()
                    .filter_map(|d| match d {
                        Difference::Removed(k, v) => Some((*k, Some(*v), None)),
                        Difference::Added(k, v) => Some((*k, None, Some(*v))),
                        Difference::Both(_, a, b) if a == b => None,
                        Difference::Both(k, a, b) => Some((*k, Some(*a), Some(*b))),
                    })
                    .collect();
                let keys: std::collections::BTreeSet<u16> =
                    then.keys().chain(model.keys()).copied().collect();
                let expected: Vec<(u16, Option<u32>, Option<u32>)> = keys
                    .into_iter()
                    .map(|k| (k, then.get(&k).copied(), model.get(&k).copied()))
                    .filter(|(_, a, b)| a != b)
                    .collect();
                prop_assert_eq!(found, expected);
                prop_assert_eq!(fork == &map, then == &model);
            }
        }
    }

    #[test]
    fn a_copy_changed_in_one_entry_differs_in_one_chunk_only() {
        let map: ChunkMap<u32, u32> = (0..10_000).map(|k| (k, k)).collect();
        let mut next = map.clone();
        *next.get_mut(&5_000).unwrap() = 1;
        let shared = map
            .chunks
            .iter()
            .zip(&next.chunks)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert_eq!(shared, map.chunks.len() - 1);
        let found = map.differences(&next);
        assert!(found.len() <= MAX_CHUNK, "{}", found.len());
        assert!(found.contains(&Difference::Both(&5_000, &5_000, &1)));
    }
}
