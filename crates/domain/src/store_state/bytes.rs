//! A forward reader of text as the store's own writer lays it out, byte by byte: what the quick
//! readers of index rows (`listing`) and of package records (`quick`) are built on. Each method
//! answers `None`, the reader unmoved or left where it stopped, for anything but what a writer
//! writes there; the caller then reads the text with the JSON cursor, which reads or refuses it.

use crate::json;

/// Text read forward from byte `at`.
pub(super) struct Bytes<'t> {
    pub(super) text: &'t str,
    pub(super) at: usize,
}

impl<'t> Bytes<'t> {
    pub(super) fn new(text: &'t str, at: usize) -> Self {
        Bytes { text, at }
    }

    /// The one byte `byte`.
    pub(super) fn eat(&mut self, byte: u8) -> Option<()> {
        (self.text.as_bytes().get(self.at) == Some(&byte)).then(|| self.at += 1)
    }

    /// `literal`, exactly.
    pub(super) fn literal(&mut self, literal: &str) -> Option<()> {
        let rest = self.text.as_bytes().get(self.at..)?;
        rest.starts_with(literal.as_bytes())
            .then(|| self.at += literal.len())
    }

    /// A string without escapes (no `\`, no byte below 0x20), as the cursor reads it: its text.
    pub(super) fn string(&mut self) -> Option<&'t str> {
        self.eat(b'"')?;
        let start = self.at;
        let rest = self.text.as_bytes().get(start..)?;
        let len = json::plain_run(rest);
        (rest.get(len) == Some(&b'"')).then_some(())?;
        self.at = start + len + 1;
        // Ends at an ASCII byte: a char boundary.
        self.text.get(start..start + len)
    }

    /// A non-negative integer as JSON writes one (`0`, or digits without a leading zero) of at
    /// most `most` digits (at most 19, which a `u64` holds); what follows it is the caller's
    /// to read (a fraction or an exponent is not what it expects).
    pub(super) fn digits(&mut self, most: usize) -> Option<u64> {
        debug_assert!(most <= 19);
        let rest = self.text.as_bytes().get(self.at..)?;
        let len = rest.iter().position(|b| !b.is_ascii_digit())?;
        if len == 0 || len > most || (len > 1 && rest[0] == b'0') {
            return None;
        }
        self.at += len;
        Some(
            rest[..len]
                .iter()
                .fold(0, |n, &d| n * 10 + u64::from(d - b'0')),
        )
    }
}
