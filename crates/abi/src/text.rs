//! Text crossing the C boundary, shared by every crate that stands at it (the dlopen loader and
//! the host's C faces): bounded reads of a plugin's NUL-terminated strings, reads of the fixed
//! buffers in a `guild_error_info_t`, writes into a caller's error record, and the C names of
//! statuses and tags.
//!
//! Every string a plugin hands the host is read with an upper bound, so that a missing terminator
//! costs a refusal instead of a walk through the plugin's memory, and is checked as UTF-8 before
//! anything else looks at it.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::ffi::{c_char, CStr};
use core::fmt;

use crate::{guild_error_info_t, guild_status_t};

/// The longest string, in bytes without its terminator, that the host reads from a descriptor.
/// Ids are at most 128 bytes by the domain's grammar; names and versions for logs get the same
/// generous bound.
pub const MAX_DESCRIPTOR_STRING: usize = 256;

/// Why a plugin's string was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringError {
    /// The pointer is NULL.
    Null,
    /// No terminator within the bound.
    TooLong { max: usize },
    /// The bytes are not UTF-8.
    NotUtf8,
}

impl fmt::Display for StringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StringError::Null => f.write_str("is NULL"),
            StringError::TooLong { max } => {
                write!(f, "is not NUL-terminated within {max} bytes")
            }
            StringError::NotUtf8 => f.write_str("is not UTF-8"),
        }
    }
}

/// Reads a NUL-terminated string of at most `max` bytes (not counting the terminator).
///
/// # Safety
/// `ptr` must be NULL or point at readable memory that holds a NUL-terminated string, or at
/// least `max + 1` readable bytes, and that memory must not change while the borrow lives.
/// Bytes are read one at a time up to the first NUL, so a shorter string is never read past.
pub unsafe fn bounded_cstr<'a>(ptr: *const c_char, max: usize) -> Result<&'a CStr, StringError> {
    if ptr.is_null() {
        return Err(StringError::Null);
    }
    for len in 0..=max {
        // SAFETY: bytes 0..len were all non-NUL, so by this function's contract byte `len` is
        // still part of the string (or of the `max + 1` readable bytes) and may be read.
        let byte = unsafe { ptr.add(len).read() };
        if byte == 0 {
            // SAFETY: `len + 1` bytes starting at `ptr` were just read and the last one is the
            // only NUL among them; the caller keeps them unchanged for 'a.
            let bytes = unsafe { core::slice::from_raw_parts(ptr.cast::<u8>(), len + 1) };
            // SAFETY: as just said, `bytes` ends with its only NUL (so the scan that
            // `from_bytes_with_nul` would make again is spared: a query's name is read on
            // every resolution).
            return Ok(unsafe { CStr::from_bytes_with_nul_unchecked(bytes) });
        }
    }
    Err(StringError::TooLong { max })
}

/// Reads a bounded NUL-terminated UTF-8 string.
///
/// # Safety
/// As for `bounded_cstr`: `ptr` must be NULL or point at readable memory that holds a
/// NUL-terminated string, or at least `max + 1` readable bytes, and that memory must not change
/// while the borrow lives.
pub unsafe fn bounded_str<'a>(ptr: *const c_char, max: usize) -> Result<&'a str, StringError> {
    // SAFETY: the caller upholds bounded_cstr's contract.
    let text = unsafe { bounded_cstr(ptr, max) }?;
    let bytes = text.to_bytes();
    if bytes.is_ascii() {
        // SAFETY: ASCII is UTF-8. Names and ids are ASCII, and this test is cheaper than the
        // general validation that `to_str` makes.
        return Ok(unsafe { core::str::from_utf8_unchecked(bytes) });
    }
    text.to_str().map_err(|_| StringError::NotUtf8)
}

/// The text in a fixed `c_char` buffer up to its first NUL (or the whole buffer when a careless
/// writer left no NUL), with invalid UTF-8 replaced.
pub fn fixed_buffer_text(buffer: &[c_char]) -> String {
    let bytes: Vec<u8> = buffer
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Fills a caller's error record, as `guild_error_info_set` does: only when the record is there
/// and at least as large as this host's `guild_error_info_t`, truncating both strings so that
/// each keeps its terminator.
///
/// # Safety
/// `record` must be NULL or point at a writable `guild_error_info_t` whose `struct_size` field
/// the caller initialised, valid for this call.
pub unsafe fn write_error_record(
    record: *mut guild_error_info_t,
    status: guild_status_t,
    component: &str,
    message: &str,
) {
    // A misaligned record cannot be borrowed as a Rust reference; such a caller gets no text
    // rather than undefined behaviour.
    if record.is_null() || !record.is_aligned() {
        return;
    }
    // SAFETY: `record` is non-NULL and, per the contract, points at a record whose first field
    // is initialised; reading that field alone is valid before its size is known.
    let size = unsafe { core::ptr::addr_of!((*record).struct_size).read_unaligned() };
    if usize::try_from(size).map_or(true, |s| s < size_of::<guild_error_info_t>()) {
        return;
    }
    // SAFETY: the record is non-NULL, aligned, writable, and at least as large as the struct
    // this host knows, so the whole struct may be borrowed mutably for the rest of this call.
    set_error(unsafe { &mut *record }, status, component, message);
}

/// Fills an error record the caller holds as a Rust value (one a provider written in Rust was
/// lent, say): the status, and both strings truncated on a character boundary so that each
/// keeps its terminator. Unlike [`write_error_record`] it trusts the record's type, not its
/// `struct_size`.
pub fn set_error(
    record: &mut guild_error_info_t,
    status: guild_status_t,
    component: &str,
    message: &str,
) {
    record.status = status;
    copy_truncated(&mut record.component, component);
    copy_truncated(&mut record.message, message);
}

fn copy_truncated(buffer: &mut [c_char], text: &str) {
    let Some(room) = buffer.len().checked_sub(1) else {
        return;
    };
    let bytes = text.as_bytes();
    let len = floor_char_boundary(text, room.min(bytes.len()));
    for (slot, &byte) in buffer.iter_mut().zip(&bytes[..len]) {
        *slot = byte as c_char;
    }
    if let Some(terminator) = buffer.get_mut(len) {
        *terminator = 0;
    }
}

/// The largest index `<= at` that falls on a character boundary of `text`, so that truncation
/// never leaves half a character behind.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    (0..=at.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// The C name of a `guild_status_t`, for messages; `"unknown status"` for a code the headers do
/// not define.
pub fn status_name(status: guild_status_t) -> &'static str {
    match status {
        0 => "GUILD_STATUS_OK",
        -1 => "GUILD_STATUS_ERR_INVALID_ARGUMENT",
        -2 => "GUILD_STATUS_ERR_UNSUPPORTED",
        -3 => "GUILD_STATUS_ERR_ABI_MISMATCH",
        -4 => "GUILD_STATUS_ERR_OUT_OF_MEMORY",
        -5 => "GUILD_STATUS_ERR_NOT_FOUND",
        -6 => "GUILD_STATUS_ERR_ALREADY_EXISTS",
        -7 => "GUILD_STATUS_ERR_BUSY",
        -8 => "GUILD_STATUS_ERR_INTERNAL",
        -9 => "GUILD_STATUS_ERR_DEVICE",
        -10 => "GUILD_STATUS_ERR_BUFFER_TOO_SMALL",
        -11 => "GUILD_STATUS_ERR_STATE",
        -12 => "GUILD_STATUS_ERR_PERMISSION",
        -13 => "GUILD_STATUS_ERR_TIMEOUT",
        _ => "unknown status",
    }
}

/// A tag as its four ASCII characters when they are printable (`GOP1`), else in hex.
pub fn tag_text(tag: u32) -> String {
    let bytes = tag.to_be_bytes();
    if bytes.iter().all(|b| b.is_ascii_graphic()) {
        bytes.iter().map(|&b| char::from(b)).collect()
    } else {
        format!("{tag:#010x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_strings_stop_at_the_terminator_or_the_bound() {
        let ok = c"test.good";
        // SAFETY: a static NUL-terminated string.
        let whole = unsafe { bounded_str(ok.as_ptr(), 9) };
        assert_eq!(whole, Ok("test.good"));
        // SAFETY: as above; the bound is one byte short of the text.
        let short = unsafe { bounded_str(ok.as_ptr(), 8) };
        assert_eq!(short, Err(StringError::TooLong { max: 8 }));
        // SAFETY: NULL is allowed.
        let null = unsafe { bounded_str(core::ptr::null(), 8) };
        assert_eq!(null, Err(StringError::Null));
        let latin1 = [0x74u8, 0xe9, 0];
        // SAFETY: a NUL-terminated local array.
        let not_utf8 = unsafe { bounded_str(latin1.as_ptr().cast(), 8) };
        assert_eq!(not_utf8, Err(StringError::NotUtf8));
        let unterminated = [b'a' as c_char; 4];
        // SAFETY: the bound (3) keeps the read within the 4 readable bytes.
        let endless = unsafe { bounded_str(unterminated.as_ptr(), 3) };
        assert_eq!(endless, Err(StringError::TooLong { max: 3 }));
    }

    #[test]
    fn error_records_are_truncated_on_character_boundaries() {
        let mut record = guild_error_info_t::new();
        let long = "é".repeat(400);
        // SAFETY: a live, sized record.
        unsafe { write_error_record(&mut record, -8, "guild.host", &long) };
        assert_eq!(record.status, -8);
        assert_eq!(fixed_buffer_text(&record.component), "guild.host");
        let message = fixed_buffer_text(&record.message);
        assert_eq!(
            message,
            "é".repeat(255),
            "511 bytes of room hold 255 two-byte chars"
        );

        let mut small = guild_error_info_t::new();
        small.struct_size = 8;
        // SAFETY: a live record that claims to be too small; nothing is written.
        unsafe { write_error_record(&mut small, -8, "x", "y") };
        assert_eq!(small.status, 0);
        // SAFETY: NULL is allowed.
        unsafe { write_error_record(core::ptr::null_mut(), -8, "x", "y") };
    }

    #[test]
    fn tags_print_as_text_when_they_are_text() {
        assert_eq!(tag_text(crate::GUILD_GOP1_TAG), "GOP1");
        assert_eq!(tag_text(0x0102_0304), "0x01020304");
        assert_eq!(status_name(-11), "GUILD_STATUS_ERR_STATE");
        assert_eq!(status_name(-99), "unknown status");
    }
}
