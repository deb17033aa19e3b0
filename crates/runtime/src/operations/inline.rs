//! A small vector of plain values: up to `N` in place, more in one allocation.
//!
//! A resolution copies its query's tensors into the handle's contract, and the C face reads the
//! caller's tensors before that; nearly every operation has a handful of tensors, so keeping
//! them in place spares a resolution an allocation per array (each showed in its cost).

use std::ops::{Deref, DerefMut};

/// A value an [`InlineVec`] fills its unused places with.
pub(crate) trait Blank: Copy {
    /// The filler; never read as an element.
    const BLANK: Self;
}

/// Up to `N` values in place, more on the heap; derefs to the slice of its values.
#[derive(Debug, Clone)]
pub(crate) enum InlineVec<T: Blank, const N: usize> {
    /// The first `len` of `items` are the values.
    Inline { len: usize, items: [T; N] },
    /// More than `N` values were held at some point.
    Heap(Vec<T>),
}

impl<T: Blank, const N: usize> InlineVec<T, N> {
    /// None, without an allocation.
    pub(crate) const fn new() -> Self {
        InlineVec::Inline {
            len: 0,
            items: [T::BLANK; N],
        }
    }

    /// Removes every value, keeping the room it has.
    pub(crate) fn clear(&mut self) {
        match self {
            InlineVec::Inline { len, .. } => *len = 0,
            InlineVec::Heap(all) => all.clear(),
        }
    }

    /// Appends `value`, moving the values to the heap when there is no room in place.
    pub(crate) fn push(&mut self, value: T) {
        match self {
            InlineVec::Inline { len, items } if *len < N => {
                items[*len] = value;
                *len += 1;
            }
            InlineVec::Inline { .. } => {
                let mut all = Vec::with_capacity(2 * N + 1);
                all.extend_from_slice(self);
                all.push(value);
                *self = InlineVec::Heap(all);
            }
            InlineVec::Heap(all) => all.push(value),
        }
    }

    /// Appends a copy of `values`.
    pub(crate) fn extend_from_slice(&mut self, values: &[T]) {
        match self {
            InlineVec::Inline { len, items } if values.len() <= N - *len => {
                items[*len..*len + values.len()].copy_from_slice(values);
                *len += values.len();
            }
            InlineVec::Inline { .. } => {
                let mut all = Vec::with_capacity(self.len() + values.len());
                all.extend_from_slice(self);
                all.extend_from_slice(values);
                *self = InlineVec::Heap(all);
            }
            InlineVec::Heap(all) => all.extend_from_slice(values),
        }
    }

    /// Makes the length `new_len`, dropping values past it or appending copies of `value`.
    pub(crate) fn resize(&mut self, new_len: usize, value: T) {
        match self {
            InlineVec::Inline { len, items } if new_len <= N => {
                if new_len > *len {
                    items[*len..new_len].fill(value);
                }
                *len = new_len;
            }
            InlineVec::Inline { .. } => {
                let mut all = Vec::with_capacity(new_len);
                all.extend_from_slice(self);
                all.resize(new_len, value);
                *self = InlineVec::Heap(all);
            }
            InlineVec::Heap(all) => all.resize(new_len, value),
        }
    }
}

impl<T: Blank, const N: usize> Default for InlineVec<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Blank, const N: usize> Extend<T> for InlineVec<T, N> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, values: I) {
        for v in values {
            self.push(v);
        }
    }
}

impl<T: Blank, const N: usize> Deref for InlineVec<T, N> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        match self {
            InlineVec::Inline { len, items } => &items[..*len],
            InlineVec::Heap(all) => all,
        }
    }
}

impl<T: Blank, const N: usize> DerefMut for InlineVec<T, N> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            InlineVec::Inline { len, items } => &mut items[..*len],
            InlineVec::Heap(all) => all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Blank for u32 {
        const BLANK: u32 = 0;
    }

    #[test]
    fn values_stay_in_place_up_to_n_and_move_to_the_heap_beyond() {
        let mut v = InlineVec::<u32, 2>::new();
        v.push(1);
        v.extend_from_slice(&[2]);
        assert!(matches!(v, InlineVec::Inline { len: 2, .. }));
        assert_eq!(&*v, &[1, 2]);
        v.push(3);
        assert!(matches!(v, InlineVec::Heap(_)));
        assert_eq!(&*v, &[1, 2, 3]);
        v.clear();
        v.extend_from_slice(&[4, 5, 6, 7]);
        assert_eq!(&*v, &[4, 5, 6, 7]);

        let mut w = InlineVec::<u32, 3>::new();
        w.push(9);
        w.resize(3, 8);
        assert_eq!(&*w, &[9, 8, 8]);
        w.resize(1, 0);
        assert_eq!(&*w, &[9]);
        w.resize(5, 7);
        assert!(matches!(w, InlineVec::Heap(_)));
        assert_eq!(&*w, &[9, 7, 7, 7, 7]);
        w.extend([1, 2]);
        assert_eq!(&*w, &[9, 7, 7, 7, 7, 1, 2]);

        let mut x = InlineVec::<u32, 2>::default();
        x.extend_from_slice(&[1, 2, 3]);
        assert_eq!(&*x, &[1, 2, 3]);
        x[0] = 4;
        assert_eq!(&*x, &[4, 2, 3]);
    }
}
