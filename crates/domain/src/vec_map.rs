//! A small ordered map kept as one sorted vector, for the versions of one registry package.
//!
//! A package records one to a few versions, and a registry of 10,000 packages holds one such map
//! per package. A `BTreeMap` allocates a whole node of eleven slots for the first entry (about
//! 2 KiB with a version record in each), which made most of the memory, and of the page faults,
//! of reading a large registry; a vector holds what it has. Lookups and inserts search the
//! sorted vector, which at these sizes is as fast as a tree. The methods are those of `BTreeMap`
//! that the registry uses, with the same meaning.

use std::borrow::Borrow;
use std::fmt;

/// An ordered map from `K` to `V` in one sorted vector.
#[derive(Clone, PartialEq, Eq)]
pub struct VecMap<K, V> {
    /// Sorted by key, each key once.
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        VecMap {
            entries: Vec::new(),
        }
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for VecMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K, V> VecMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty map with room for `capacity` entries. A decoder that knows how many versions a
    /// package records asks for exactly that many: a vector's first growth makes room for four
    /// entries, which for a version record is most of a kilobyte per package, nearly all of it
    /// unused in a registry where each package records one version.
    pub fn with_capacity(capacity: usize) -> Self {
        VecMap {
            entries: Vec::with_capacity(capacity),
        }
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + '_ {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// Every entry in key order, its value to write to.
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = (&K, &mut V)> + '_ {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + '_ {
        self.entries.iter().map(|(k, _)| k)
    }

    /// Every value, in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + '_ {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Keeps the entries for which `keep` answers true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.entries.retain_mut(|(k, v)| keep(k, v));
    }
}

impl<K: Ord, V> VecMap<K, V> {
    fn find<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// The value of `key`, if any.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let at = self.find(key).ok()?;
        Some(&self.entries[at].1)
    }

    /// The value of `key` to write to, if any.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let at = self.find(key).ok()?;
        Some(&mut self.entries[at].1)
    }

    /// Whether the map has `key`.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.find(key).is_ok()
    }

    /// Inserts `value` under `key`, answering the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.entries.insert(at, (key, value));
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
        let at = self.find(key).ok()?;
        Some(self.entries.remove(at).1)
    }
}

impl<'a, K, V> IntoIterator for &'a VecMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for VecMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut map = VecMap::new();
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

    proptest! {
        #[test]
        fn vec_map_answers_as_a_btree_map(
            ops in prop::collection::vec((0u8..3, 0u8..20, any::<u16>()), 0..200)
        ) {
            let mut map = VecMap::new();
            let mut model = BTreeMap::new();
            for (op, k, v) in ops {
                match op {
                    0 => prop_assert_eq!(map.insert(k, v), model.insert(k, v)),
                    1 => prop_assert_eq!(map.remove(&k), model.remove(&k)),
                    _ => {
                        if let (Some(a), Some(b)) = (map.get_mut(&k), model.get_mut(&k)) {
                            *a = v;
                            *b = v;
                        }
                    }
                }
                prop_assert!(map.iter().eq(model.iter()));
                prop_assert_eq!(map.len(), model.len());
                prop_assert_eq!(map.get(&k), model.get(&k));
                prop_assert_eq!(format!("{map:?}"), format!("{model:?}"));
            }
        }
    }
}
