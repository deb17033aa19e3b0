//! Buffers with a `PROT_NONE` page on each side, for the execute checks: a read or write one byte
//! outside the mapped pages stops the check process with `SIGSEGV`, which the parent reports as
//! a finding of the check that was running. The tensor is placed flush against one of the two
//! guard pages (chosen by [`Flush`]); the bytes between it and the other guard (the rest of the
//! last page, or the alignment gap) hold a canary pattern that [`Guarded::intact`] checks.

use std::io;
use std::ptr::NonNull;

/// The byte that fills every byte of a buffer that is not an input's data.
pub(crate) const CANARY: u8 = 0xA5;

/// Which guard page the data touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    /// The first byte of data follows the leading guard page: a read before it faults.
    Front,
    /// The last byte of data (rounded down to the alignment) precedes the trailing guard page:
    /// a write or read past it faults.
    Back,
}

/// One mapping: guard page, data pages, guard page.
pub(crate) struct Guarded {
    base: NonNull<u8>,
    map_len: usize,
    /// Offset of the data from `base`.
    start: usize,
    /// Bytes of data.
    len: usize,
    /// Bytes of the readable and writable pages between the guards.
    inner: usize,
    page: usize,
}

// SAFETY: the mapping is owned by this value alone; nothing in it is tied to a thread.
unsafe impl Send for Guarded {}
// SAFETY: shared access only reads (`bytes`, `intact`); writes need `&mut self`.
unsafe impl Sync for Guarded {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

impl Guarded {
    /// Maps `len` bytes of data aligned to `align` (a power of two; 0 and 1 mean none), flush
    /// against the guard `flush` names, every byte set to [`CANARY`].
    pub(crate) fn new(len: usize, align: usize, flush: Flush) -> io::Result<Self> {
        let page = page_size();
        let align = align.max(1);
        if !align.is_power_of_two() || align > page {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("alignment {align} is not a power of two up to the page size {page}"),
            ));
        }
        let inner = len.max(1).div_ceil(page) * page;
        let map_len = inner + 2 * page;
        // SAFETY: an anonymous private mapping at an address the kernel chooses; the result is
        // checked against MAP_FAILED before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(addr.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        let start = match flush {
            Flush::Front => page,
            Flush::Back => (page + inner - len) & !(align - 1),
        };
        let mut buffer = Guarded {
            base,
            map_len,
            start,
            len,
            inner,
            page,
        };
        buffer.protect(libc::PROT_READ | libc::PROT_WRITE)?;
        buffer.inner_mut().fill(CANARY);
        Ok(buffer)
    }

    fn protect(&self, prot: libc::c_int) -> io::Result<()> {
        // SAFETY: the range is the inner pages of this value's own mapping, page aligned.
        let rc =
            unsafe { libc::mprotect(self.base.as_ptr().add(self.page).cast(), self.inner, prot) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Makes the pages read-only (an input during an execute) or writable again.
    pub(crate) fn set_read_only(&self, read_only: bool) -> io::Result<()> {
        self.protect(if read_only {
            libc::PROT_READ
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        })
    }

    fn inner_mut(&mut self) -> &mut [u8] {
        // SAFETY: the inner pages are mapped readable and writable while `&mut self` is held
        // (set_read_only(true) is only used by callers that hold no slice meanwhile).
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(self.page), self.inner) }
    }

    fn inner(&self) -> &[u8] {
        // SAFETY: the inner pages are mapped readable for the life of the mapping.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.page), self.inner) }
    }

    /// The data's address.
    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: start is within the mapping (at most page + inner).
        unsafe { self.base.as_ptr().add(self.start) }
    }

    /// The data bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        let off = self.start - self.page;
        &self.inner()[off..off + self.len]
    }

    /// The data bytes, for filling.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let (off, len) = (self.start - self.page, self.len);
        &mut self.inner_mut()[off..off + len]
    }

    /// The offset of the first byte outside the data (before or after it, inside the guards)
    /// that is no longer [`CANARY`], relative to the data's start, or `None`.
    pub(crate) fn intact(&self) -> Option<i64> {
        let off = self.start - self.page;
        let inner = self.inner();
        if let Some(i) = inner[..off].iter().position(|&b| b != CANARY) {
            return Some(i as i64 - off as i64);
        }
        inner[off + self.len..]
            .iter()
            .position(|&b| b != CANARY)
            .map(|i| (self.len + i) as i64)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; nothing refers to it afterwards.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_sits_against_the_chosen_guard_and_the_rest_is_canary() {
        for flush in [Flush::Front, Flush::Back] {
            let mut b = Guarded::new(10, 8, flush).unwrap();
            assert_eq!(b.ptr() as usize % 8, 0);
            assert!(b.bytes().iter().all(|&x| x == CANARY));
            b.bytes_mut().fill(1);
            assert_eq!(b.intact(), None);
        }
        let b = Guarded::new(4096, 4, Flush::Back).unwrap();
        assert_eq!(
            b.ptr() as usize % page_size(),
            0,
            "a full page fills the inner pages"
        );
    }
}
