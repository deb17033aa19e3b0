//! A small vector of plain values: up to `N` in place, more in one allocation.
//!
//! The C face reads a query's tensors into two of these on its own frame: nearly every
//! operation has a handful of tensors, so keeping them in place spares a resolution an
//! allocation per array (each showed in its cost).

use std::mem::MaybeUninit;
use std::ops::Deref;

/// A value that stands for "none yet": what a new contract's block
/// ([`TensorBlock::new`](super::block::TensorBlock::new)) is filled with until a reshape writes
/// it.
pub(crate) trait Blank: Copy {
    /// The filler.
    const BLANK: Self;
}

/// Up to `N` values in place, more on the heap; derefs to the slice of its values.
///
/// The places are not written until a value is pushed into them: a new vector costs nothing
/// however large `N` is (the C face's two cleared arrays of descriptors, 1,280 bytes, were
/// a resolution's largest `memset`).
#[derive(Debug, Clone)]
pub(crate) enum InlineVec<T: Copy, const N: usize> {
    /// The first `len` of `items` are the values, initialised; the rest were never written.
    Inline {
        len: usize,
        items: [MaybeUninit<T>; N],
    },
    /// More than `N` values were pushed.
    Heap(Vec<T>),
}

impl<T: Copy, const N: usize> InlineVec<T, N> {
    /// None, without an allocation.
    pub(crate) const fn new() -> Self {
        InlineVec::Inline {
            len: 0,
            items: [MaybeUninit::uninit(); N],
        }
    }

    /// Appends `value`, moving the values to the heap when there is no room in place.
    /// Inlined, so that a value made for it is made in its place rather than copied there.
    #[inline(always)]
    pub(crate) fn push(&mut self, value: T) {
        match self {
            InlineVec::Inline { len, items } if *len < N => {
                items[*len] = MaybeUninit::new(value);
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

impl<T: Copy, const N: usize> Default for InlineVec<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy, const N: usize> Deref for InlineVec<T, N> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        match self {
            InlineVec::Inline { len, items } => {
                let len = (*len).min(N);
                // SAFETY: the first `len` places (at most `N`) were written by `push`, and
                // `MaybeUninit<T>` has the layout of `T`; the slice borrows `self`.
                unsafe { std::slice::from_raw_parts(items.as_ptr().cast::<T>(), len) }
            }
            InlineVec::Heap(all) => all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
