//! A small vector of plain values: up to `N` in place, more in one allocation.
//!
//! The C face reads a query's tensors into two of these on its own frame: nearly every
//! operation has a handful of tensors, so keeping them in place spares a resolution an
//! allocation per array (each showed in its cost).

use std::ops::Deref;

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
    /// More than `N` values were pushed.
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
}

impl<T: Blank, const N: usize> Default for InlineVec<T, N> {
    fn default() -> Self {
        Self::new()
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

#[cfg(test)]
mod tests {
    use super::*;

    impl Blank for u32 {
        const BLANK: u32 = 0;
    }

    #[test]
    fn values_stay_in_place_up_to_n_and_move_to_the_heap_beyond() {
        let mut v = InlineVec::<u32, 2>::default();
        assert!(v.is_empty());
        v.push(1);
        v.push(2);
        assert!(matches!(v, InlineVec::Inline { len: 2, .. }));
        assert_eq!(&*v, &[1, 2]);
        v.push(3);
        assert!(matches!(v, InlineVec::Heap(_)));
        assert_eq!(&*v, &[1, 2, 3]);
        v.push(4);
        assert_eq!(&*v, &[1, 2, 3, 4]);
    }
}
