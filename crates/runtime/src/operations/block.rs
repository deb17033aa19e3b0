//! A contract's tensors in one allocation: the negotiated descriptors (inputs then outputs),
//! for a Rust handle the C descriptors its calls lend the provider, and the tensors' shapes.
//!
//! Three arrays of three types, made and freed together and never resized (a reshape keeps the
//! number of tensors), so one allocation holds them: a resolution pays for one allocation
//! besides its handle's, whichever face it came through and however many tensors it has. The
//! call tensors, the only part calls write, lie between the descriptors and the shapes, each at
//! least a pair of cache lines: every line a call writes is the block's own, wherever the
//! allocator puts another handle's beside it, without unused guards (which would take a
//! one-input, one-output Rust handle's block past the 1,032 bytes glibc serves from its
//! per-thread cache).

use std::alloc::Layout;
use std::ptr::NonNull;

use guild_abi::guild_tensor_desc_v1_t;
use guild_domain::operation::{TensorDesc, MAX_TENSOR_RANK};

use super::inline::Blank;

/// The bytes of the block's own the call tensors have on each side: a pair of cache lines.
pub(crate) const LINE_PAIR: usize = 128;

const _: () = assert!(
    size_of::<TensorDesc>() >= LINE_PAIR,
    "one descriptor before the call tensors keeps a line pair"
);

/// A blank C descriptor: the guards, and the call tensors before a call writes them.
pub(crate) const BLANK_C: guild_tensor_desc_v1_t = guild_tensor_desc_v1_t {
    dtype: 0,
    rank: 0,
    dims: [0; MAX_TENSOR_RANK],
    strides: [0; MAX_TENSOR_RANK],
    memory_space: 0,
    device_id: 0,
    data: std::ptr::null_mut(),
};

/// `n` descriptors, (with call tensors) `n` C descriptors and `n` shapes (of type `S`, the
/// contract's, at least a line pair each: see [`LINE_PAIR`]), laid out as
/// [`TensorBlock::layout`] says, every element always initialised.
pub(crate) struct TensorBlock<S> {
    /// The allocation, where the descriptors begin; dangling (aligned as a `u64`) when the
    /// layout is empty.
    descs: NonNull<TensorDesc>,
    /// Where the call tensors and the shapes begin, inside the allocation (kept as pointers,
    /// not offsets, so that an execute finds them with the loads a `Vec` would take).
    calls_at: NonNull<guild_tensor_desc_v1_t>,
    shapes: NonNull<S>,
    /// How many tensors: inputs, then outputs.
    n: usize,
    /// How many of them are inputs.
    split: usize,
    /// Whether the block holds call tensors.
    calls: bool,
    layout: Layout,
}

// SAFETY: the block owns its elements, plain values (the C descriptors' data pointers are the
// last call's addresses, never dereferenced by the host), as a `Vec` of them would.
unsafe impl<S: Send> Send for TensorBlock<S> {}
// SAFETY: as above. Through `&TensorBlock` the safe methods give out shared slices only; the
// call tensors are written only through `call_role_mut` (an `unsafe fn` whose caller holds the
// handle's execute exclusivity) and the raw `call_tensors_ptr`, whose writes are the caller's to
// serialise. `call_split`, which reads them, runs only at resolution, before the handle exists.
unsafe impl<S: Sync> Sync for TensorBlock<S> {}

impl<S: Blank> TensorBlock<S> {
    /// Every shape type's alignment is at most a `u64`'s, so that the dangling pointer of an
    /// empty block is aligned for it.
    const ALIGNED: () = assert!(align_of::<S>() <= align_of::<u64>());

    /// None at all, without an allocation.
    pub(crate) const fn none() -> Self {
        let () = Self::ALIGNED;
        TensorBlock {
            // Aligned for every element type (checked below), so that empty slices of each
            // may be made at it.
            descs: NonNull::<u64>::dangling().cast(),
            calls_at: NonNull::<u64>::dangling().cast(),
            shapes: NonNull::<u64>::dangling().cast(),
            n: 0,
            split: 0,
            calls: false,
            layout: Layout::new::<()>(),
        }
    }

    /// Where each array lies: the descriptors, then the call tensors (when there are any),
    /// then the shapes. `None` when the sizes overflow.
    fn layout(n: usize, calls: bool) -> Option<(Layout, usize, usize)> {
        let descs = Layout::array::<TensorDesc>(n).ok()?;
        let c = Layout::array::<guild_tensor_desc_v1_t>(if calls { n } else { 0 }).ok()?;
        let (with_calls, calls_at) = descs.extend(c).ok()?;
        let (all, shapes_at) = with_calls.extend(Layout::array::<S>(n).ok()?).ok()?;
        Some((all.pad_to_align(), calls_at, shapes_at))
    }

    /// A block of `n_in + n_out` blank tensors, with call tensors when `calls`.
    pub(crate) fn new(n_in: usize, n_out: usize, calls: bool) -> Self {
        // SAFETY: every element is written below before the block is returned.
        let block = unsafe { Self::allocated(n_in, n_out, calls) };
        for i in 0..block.n {
            // SAFETY: as in `filled`.
            unsafe { block.write(i, &TensorDesc::BLANK, S::BLANK, || BLANK_C) };
        }
        block
    }

    /// The block of the tensors `inputs` then `outputs` (whose facts are `facts`, in the same
    /// order), with call tensors when `calls`, each element written once: descriptor and shape
    /// `i` are `shape`'s descriptor and shape of tensor `i`, and its call tensor (with call
    /// tensors) `call` of it. Elements without facts are blank.
    #[inline(always)]
    pub(crate) fn filled<F>(
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        facts: &[F],
        calls: bool,
        shape: impl Fn(&TensorDesc, &F) -> S,
        call: impl Fn(&TensorDesc) -> guild_tensor_desc_v1_t,
    ) -> Self {
        let n_in = inputs.len();
        // SAFETY: every element is written below before the block is returned: `n` is
        // `n_in + outputs.len()` (`allocated`), and each index below `n` is written once.
        let block = unsafe { Self::allocated(n_in, outputs.len(), calls) };
        for (i, d) in inputs.iter().chain(outputs).enumerate() {
            // SAFETY: `i < n`, as above.
            unsafe {
                match facts.get(i) {
                    Some(f) => block.write(i, d, shape(d, f), || call(d)),
                    None => block.write(i, &TensorDesc::BLANK, S::BLANK, || BLANK_C),
                }
            }
        }
        block
    }

    /// Writes element `i`: its descriptor `desc`, its shape and (with call tensors) `call()`.
    ///
    /// # Safety
    /// `i < n`.
    #[inline(always)]
    unsafe fn write(
        &self,
        i: usize,
        desc: &TensorDesc,
        shape: S,
        call: impl FnOnce() -> guild_tensor_desc_v1_t,
    ) {
        // SAFETY: `i < n` (the caller's contract), and each array lies inside the allocation at
        // its offset, aligned for its type (`Layout::extend`), with room for `n` elements (the
        // call tensors only when `calls`); nothing else refers to the element while it is
        // written.
        unsafe {
            self.descs.as_ptr().add(i).copy_from_nonoverlapping(desc, 1);
            self.shapes.as_ptr().add(i).write(shape);
            if self.calls {
                self.calls_at.as_ptr().add(i).write(call());
            }
        }
    }

    /// A block laid out for `n_in + n_out` tensors, with call tensors when `calls`, whose
    /// elements are not yet written (dropping it so only frees the allocation, as its elements
    /// have nothing to drop).
    ///
    /// # Safety
    /// Every element must be written before any method but `drop` is called on the block.
    unsafe fn allocated(n_in: usize, n_out: usize, calls: bool) -> Self {
        let n = n_in.saturating_add(n_out);
        let Some((layout, calls_at, shapes_at)) = Self::layout(n, calls) else {
            // Counts this large were refused long before (a query holds at most a few dozen
            // tensors); the allocator's own report is the honest one.
            std::alloc::handle_alloc_error(Layout::new::<u8>())
        };
        if layout.size() == 0 {
            return TensorBlock {
                split: n_in,
                n,
                calls,
                ..Self::none()
            };
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        if raw.is_null() {
            std::alloc::handle_alloc_error(layout)
        }
        // SAFETY: the allocation is not NULL, and both offsets lie inside it
        // (`Layout::extend`).
        let (descs, calls_ptr, shapes) = unsafe {
            (
                NonNull::new_unchecked(raw.cast::<TensorDesc>()),
                NonNull::new_unchecked(raw.add(calls_at).cast::<guild_tensor_desc_v1_t>()),
                NonNull::new_unchecked(raw.add(shapes_at).cast::<S>()),
            )
        };
        TensorBlock {
            descs,
            calls_at: calls_ptr,
            shapes,
            n,
            split: n_in,
            calls,
            layout,
        }
    }

    /// How many C descriptors the block holds.
    #[inline(always)]
    fn n_calls(&self) -> usize {
        if self.calls {
            self.n
        } else {
            0
        }
    }

    /// Whether the block is laid out for `n_in` inputs and `n_out` outputs, with call tensors
    /// when `calls`.
    pub(crate) fn fits(&self, n_in: usize, n_out: usize, calls: bool) -> bool {
        self.split == n_in && self.n == n_in + n_out && self.calls == calls
    }

    /// How many of the tensors are inputs.
    #[inline(always)]
    pub(crate) fn split(&self) -> usize {
        self.split
    }

    /// The descriptors, inputs then outputs.
    #[inline(always)]
    pub(crate) fn descs(&self) -> &[TensorDesc] {
        // SAFETY: `n` initialised descriptors at `descs` (dangling and empty, or in the
        // allocation), borrowed with `self`.
        unsafe { std::slice::from_raw_parts(self.descs.as_ptr(), self.n) }
    }

    /// The shapes, inputs then outputs.
    #[cfg(test)]
    pub(crate) fn shapes(&self) -> &[S] {
        // SAFETY: as in `descs`, for the `n` shapes at `shapes`.
        unsafe { std::slice::from_raw_parts(self.shapes.as_ptr(), self.n) }
    }

    /// The shapes of the inputs (`input`) or of the outputs, without a bounds check (an
    /// execute finds them with the loads and arithmetic a pair of `Vec`s would take).
    #[inline(always)]
    pub(crate) fn shapes_of(&self, input: bool) -> &[S] {
        let (start, len) = if input {
            (0, self.split)
        } else {
            (self.split, self.n - self.split)
        };
        // SAFETY: `split <= n` (`new`), so the range lies inside the `n` initialised shapes.
        unsafe { std::slice::from_raw_parts(self.shapes.as_ptr().add(start), len) }
    }

    /// The call tensors (empty without call tensors).
    #[cfg(test)]
    pub(crate) fn call_tensors(&self) -> &[guild_tensor_desc_v1_t] {
        // SAFETY: as in `descs`, for the `n_calls` C descriptors at `calls_at`.
        unsafe { std::slice::from_raw_parts(self.calls_at.as_ptr(), self.n_calls()) }
    }

    /// The three arrays, to be written: descriptors, shapes and call tensors.
    #[inline(always)]
    pub(crate) fn parts_mut(
        &mut self,
    ) -> (&mut [TensorDesc], &mut [S], &mut [guild_tensor_desc_v1_t]) {
        // SAFETY: three disjoint arrays of initialised elements inside the allocation (see
        // `layout`), borrowed mutably with `self`.
        unsafe {
            (
                std::slice::from_raw_parts_mut(self.descs.as_ptr(), self.n),
                std::slice::from_raw_parts_mut(self.shapes.as_ptr(), self.n),
                std::slice::from_raw_parts_mut(self.calls_at.as_ptr(), self.n_calls()),
            )
        }
    }

    /// The call tensors of the inputs and of the outputs (empty without call tensors).
    #[inline(always)]
    pub(crate) fn call_split(&self) -> [&[guild_tensor_desc_v1_t]; 2] {
        // SAFETY: as in `descs`, for the `n_calls` C descriptors at `calls_at`.
        let all = unsafe { std::slice::from_raw_parts(self.calls_at.as_ptr(), self.n_calls()) };
        let (inputs, outputs) = all.split_at(self.split.min(all.len()));
        [inputs, outputs]
    }

    /// The descriptors, inputs then outputs, to be written.
    #[inline(always)]
    pub(crate) fn descs_mut(&mut self) -> &mut [TensorDesc] {
        // SAFETY: as in `descs`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.descs.as_ptr(), self.n) }
    }

    /// The call tensors of the inputs (`input`) or the outputs, for a call to write their data
    /// pointers (empty without call tensors). Made from the block's own pointer while the
    /// contract is shared: the descriptors and shapes a call reads lie elsewhere.
    ///
    /// # Safety
    /// No other reference to the call tensors may live while the returned slice does: the
    /// caller holds the handle's execute exclusivity (or `&mut`).
    #[allow(clippy::mut_from_ref)] // The exclusivity is the caller's, as documented.
    #[inline(always)]
    pub(crate) unsafe fn call_role_mut(&self, input: bool) -> &mut [guild_tensor_desc_v1_t] {
        let (start, len) = match (self.calls, input) {
            (false, _) => (0, 0),
            (true, true) => (0, self.split),
            (true, false) => (self.split, self.n - self.split),
        };
        // SAFETY: `start + len` is at most `n`, inside the call tensors (or an empty slice at
        // their pointer); the caller excludes every other reference to them.
        unsafe { std::slice::from_raw_parts_mut(self.calls_at.as_ptr().add(start), len) }
    }

    /// The first call tensor, as a raw pointer made without a reference: a call writes the
    /// data pointers through it while the contract is shared. Valid for `n` descriptors when
    /// the block has call tensors.
    #[inline(always)]
    pub(crate) fn call_tensors_ptr(&self) -> *mut guild_tensor_desc_v1_t {
        self.calls_at.as_ptr()
    }
}

impl<S> Drop for TensorBlock<S> {
    fn drop(&mut self) {
        if self.layout.size() != 0 {
            // SAFETY: allocated in `new` with this layout, at `descs`; the elements are plain
            // values with nothing to drop.
            unsafe { std::alloc::dealloc(self.descs.as_ptr().cast(), self.layout) };
        }
    }
}

impl<S: Blank> Default for TensorBlock<S> {
    fn default() -> Self {
        Self::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use guild_domain::operation::{DType, MemorySpace};

    /// A shape as large as the contract's, for the block alone.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Shape([u64; 21]);

    impl Blank for Shape {
        const BLANK: Shape = Shape([0; 21]);
    }

    /// Every count, with and without call tensors: the arrays are blank, disjoint, inside the
    /// allocation, and what is written to one is read back from it alone.
    #[test]
    fn a_blocks_three_arrays_are_disjoint_and_keep_what_is_written() {
        for (n_in, n_out) in [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1), (3, 2), (9, 7)] {
            for calls in [false, true] {
                let mut b = TensorBlock::<Shape>::new(n_in, n_out, calls);
                let n = n_in + n_out;
                assert!(b.fits(n_in, n_out, calls) && !b.fits(n_in + 1, n_out, calls));
                assert_eq!(b.split(), n_in);
                assert_eq!(b.descs(), &vec![TensorDesc::BLANK; n][..]);
                assert_eq!(b.shapes(), &vec![Shape::BLANK; n][..]);
                let n_calls = if calls { n } else { 0 };
                assert_eq!(b.call_tensors().len(), n_calls);
                assert!(b
                    .call_tensors()
                    .iter()
                    .all(|t| t.rank == 0 && t.data.is_null()));
                let (descs, shapes, c) = b.parts_mut();
                for (i, d) in descs.iter_mut().enumerate() {
                    *d = TensorDesc::new(DType::F32, &[i as u64 + 1], MemorySpace::Host);
                }
                for (i, t) in c.iter_mut().enumerate() {
                    t.rank = i as u32 + 100;
                }
                assert!(shapes.iter().all(|s| *s == Shape::BLANK));
                let dims: Vec<u64> = b.descs().iter().map(|d| d.dims[0]).collect();
                assert_eq!(dims, (1..n as u64 + 1).collect::<Vec<_>>());
                let ranks: Vec<u32> = b.call_tensors().iter().map(|t| t.rank).collect();
                assert_eq!(ranks, (100..100 + n_calls as u32).collect::<Vec<_>>());
                if n > 0 {
                    // The call tensors have a line pair of the block's own on each side.
                    let start = b.descs().as_ptr() as usize;
                    let end = start + b.layout.size();
                    let calls = b.call_tensors_ptr() as usize;
                    let calls_end = calls + n_calls * size_of::<guild_tensor_desc_v1_t>();
                    assert!(calls >= start + LINE_PAIR);
                    assert!(b.shapes().as_ptr() as usize >= calls_end);
                    assert!(calls_end + LINE_PAIR <= end);
                    assert!(b.shapes().as_ptr() as usize + n * size_of::<Shape>() <= end);
                }
            }
        }
        let none = TensorBlock::<Shape>::none();
        assert!(none.descs().is_empty() && none.shapes().is_empty());
        assert!(none.call_tensors().is_empty());
    }
}
