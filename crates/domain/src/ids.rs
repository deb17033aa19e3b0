//! Validated identifiers: package, publisher, implementation, runner and operation names, and digests.
//!
//! Every identifier that reaches the host from a manifest or a plugin becomes one of these types
//! first, so that later code never has to ask whether a name is empty, too long or contains a byte
//! that would be dangerous in a path or a log line.

use std::fmt;

/// Longest identifier accepted anywhere, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The text is empty.
    #[error("{what} is empty")]
    Empty {
        /// What kind of identifier (package id, impl id, ...).
        what: &'static str,
    },
    /// The text is longer than the limit.
    #[error("{what} {value:?} is longer than {MAX_ID_LEN} bytes")]
    TooLong {
        /// What kind of identifier (package id, impl id, ...).
        what: &'static str,
        /// The text that was offered.
        value: String,
    },
    /// A byte outside the grammar.
    #[error("{what} {value:?} contains {found:?} at byte {at}; allowed are a-z, 0-9, '_', '-' and '.' between segments")]
    BadChar {
        /// What kind of identifier (package id, impl id, ...).
        what: &'static str,
        /// The text that was offered.
        value: String,
        /// The offending character.
        found: char,
        /// Its byte offset.
        at: usize,
    },
    /// Two dots in a row, or a dot at either end.
    #[error("{what} {value:?} has an empty dot-separated segment")]
    EmptySegment {
        /// What kind of identifier (package id, impl id, ...).
        what: &'static str,
        /// The text that was offered.
        value: String,
    },
    /// The first character is not a lowercase letter.
    #[error("{what} {value:?} must start with a lowercase letter")]
    BadStart {
        /// What kind of identifier (package id, impl id, ...).
        what: &'static str,
        /// The text that was offered.
        value: String,
    },
}

/// Whether `value` is a valid identifier of any of the id types (they share one grammar).
pub(crate) fn is_valid_id(value: &str) -> bool {
    check_id("identifier", value).is_ok()
}

/// Checks the shared identifier grammar: dot-separated segments of `[a-z0-9_-]`, starting with a
/// lowercase letter, at most [`MAX_ID_LEN`] bytes. Namespaced names such as
/// `example.sequence.prefix_sum` and reverse-DNS publisher ids such as `org.example` both fit.
fn check_id(what: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { what });
    }
    if value.len() > MAX_ID_LEN {
        return Err(IdError::TooLong {
            what,
            value: value.to_owned(),
        });
    }
    if !value.as_bytes()[0].is_ascii_lowercase() {
        return Err(IdError::BadStart {
            what,
            value: value.to_owned(),
        });
    }
    // One pass over the bytes (ids are checked on every query that names one); the slower
    // scan for the offending character runs only when there is one.
    let mut doubled_dot = false;
    let mut after_dot = false;
    for &b in value.as_bytes() {
        // A byte of a multi-byte character is never allowed, so this finds those too.
        if !ALLOWED[usize::from(b)] {
            return Err(bad_char(what, value));
        }
        doubled_dot |= after_dot && b == b'.';
        after_dot = b == b'.';
    }
    // The first byte is a letter, so a segment is empty only after a dot.
    if doubled_dot || after_dot {
        return Err(IdError::EmptySegment {
            what,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// Whether `c` may appear in an identifier.
fn allowed(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.')
}

/// [`allowed`] for each byte value, so that the scan of an id tests one table entry per byte
/// (every query names its operation, and the chained comparisons cost a resolution more than
/// its allocations did).
static ALLOWED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'.');
        b += 1;
    }
    table
};

/// The error for the first character outside the grammar, which `value` has.
fn bad_char(what: &'static str, value: &str) -> IdError {
    let (at, found) = value
        .char_indices()
        .find(|&(_, c)| !allowed(c))
        .unwrap_or((0, '\0'));
    IdError::BadChar {
        what,
        value: value.to_owned(),
        found,
        at,
    }
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Validates `value` and wraps it.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                check_id($what, &value)?;
                Ok(Self(value))
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        // Hash, Eq and Ord are the text's, so a map keyed by the id can be asked with a `&str`.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// A package id, such as `example.scan`. Shared by kernels (`.gkernel`) and modules (`.gkmodule`).
    PackageId,
    "package id"
);
id_type!(
    /// A publisher id, such as `org.example`. Trust is granted per publisher.
    PublisherId,
    "publisher id"
);
id_type!(
    /// A fleet's name, such as `org.example.prod`: fleet roots and policies name the fleet they
    /// belong to, so that one fleet's documents never pass for another's.
    FleetId,
    "fleet id"
);
id_type!(
    /// A globally unique implementation id, such as `example.scan.inclusive.cpu`.
    ImplId,
    "implementation id"
);
id_type!(
    /// A runner id, as registered by a runner descriptor.
    RunnerId,
    "runner id"
);
id_type!(
    /// A namespaced operation name, such as `example.sequence.prefix_sum`.
    OpName,
    "operation name"
);

/// A validated operation name borrowed from text that someone else owns, such as the name a C
/// caller passes with its query: checked as [`OpName::new`] checks, without copying the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpNameRef<'a>(&'a str);

impl<'a> OpNameRef<'a> {
    /// Validates `value` as an operation name, borrowing it.
    pub fn new(value: &'a str) -> Result<Self, IdError> {
        check_id("operation name", value)?;
        Ok(OpNameRef(value))
    }

    /// The name as text.
    pub fn as_str(self) -> &'a str {
        self.0
    }

    /// An owned copy (the text is valid already, so it is not checked again).
    pub fn to_owned(self) -> OpName {
        OpName(self.0.to_owned())
    }
}

impl OpName {
    /// The name, borrowed.
    pub fn as_name_ref(&self) -> OpNameRef<'_> {
        OpNameRef(&self.0)
    }
}

impl PartialEq<OpName> for OpNameRef<'_> {
    fn eq(&self, other: &OpName) -> bool {
        self.0 == other.0
    }
}

impl PartialEq<OpNameRef<'_>> for OpName {
    fn eq(&self, other: &OpNameRef<'_>) -> bool {
        self.0 == other.0
    }
}

impl fmt::Display for OpNameRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The two kinds of package, which share one archive format and one registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PackageKind {
    /// A kernel plugin (`.gkernel`).
    Kernel,
    /// A runtime operation module (`.gkmodule`).
    Module,
}

impl PackageKind {
    /// The manifest spelling: `gkernel` or `gkmodule`.
    pub fn as_str(self) -> &'static str {
        match self {
            PackageKind::Kernel => "gkernel",
            PackageKind::Module => "gkmodule",
        }
    }

    /// Parses the manifest spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gkernel" => Some(PackageKind::Kernel),
            "gkmodule" => Some(PackageKind::Module),
            _ => None,
        }
    }
}

impl fmt::Display for PackageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A SHA-256 digest. Displayed and parsed as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256Digest(pub [u8; 32]);

/// Why a string is not a SHA-256 hex digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a SHA-256 digest: expected 64 lowercase hex digits")]
pub struct DigestParseError {
    /// The text that was offered.
    pub value: String,
}

impl Sha256Digest {
    /// Hashes `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        use sha2::Digest;
        Sha256Digest(sha2::Sha256::digest(bytes).into())
    }

    /// Parses 64 lowercase hex digits. Uppercase is refused so that a digest has one spelling.
    pub fn parse_hex(value: &str) -> Result<Self, DigestParseError> {
        let err = || DigestParseError {
            value: value.chars().take(80).collect(),
        };
        let bytes = value.as_bytes();
        if bytes.len() != 64 {
            return Err(err());
        }
        let mut out = [0u8; 32];
        // Eight digits at a time, each checked and turned into its value by arithmetic on the
        // whole word: a registry holds two or three digests per version, and parsing them one
        // digit at a time showed in every open of a large store.
        for (o, chunk) in out.chunks_exact_mut(4).zip(bytes.chunks_exact(8)) {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            let packed = hex_word(u64::from_le_bytes(word)).ok_or_else(err)?;
            o.copy_from_slice(&packed.to_le_bytes());
        }
        Ok(Sha256Digest(out))
    }

    /// The 64-digit lowercase hex form.
    pub fn to_hex(&self) -> String {
        String::from_utf8_lossy(&self.hex_bytes()).into_owned()
    }

    /// The 64 lowercase hex digits as bytes: written by table, because a registry encodes two
    /// digests per version and formatting each byte through `fmt` showed in its profile.
    fn hex_bytes(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (pair, b) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
        out
    }
}

/// The four bytes that eight lowercase hex digits (`word`'s bytes, first digit lowest) spell,
/// the first byte lowest; `None` when any byte is not a lowercase hex digit.
fn hex_word(word: u64) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Every byte below 0x80 first: then adding at most 0x7f to a byte cannot carry into the
    // next, and a byte's top bit after `+ (0x80 - lo)` says whether it is at least `lo`.
    if word & HIGHS != 0 {
        return None;
    }
    let at_least = |lo: u64| word.wrapping_add(ONES * (0x80 - lo)) & HIGHS;
    let at_most = |hi: u64| !word.wrapping_add(ONES * (0x7f - hi)) & HIGHS;
    let digit = at_least(0x30) & at_most(0x39);
    let letter = at_least(0x61) & at_most(0x66);
    if digit | letter != HIGHS {
        return None;
    }
    // '0'..'9' are 0x30..0x39 and 'a'..'f' 0x61..0x66: the low four bits, plus 9 for a letter
    // (whose bit 6 is set).
    let nibbles = (word & (ONES * 0x0f)) + ((word >> 6) & ONES) * 9;
    // Each pair of nibbles into one byte, then the four bytes side by side.
    let pairs = ((nibbles & 0x00ff_00ff_00ff_00ff) << 4) | ((nibbles >> 8) & 0x00ff_00ff_00ff_00ff);
    let pairs = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
    Some(((pairs | (pairs >> 16)) & 0xffff_ffff) as u32)
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.hex_bytes();
        // Hex digits are ASCII, so this is always the whole text. Written as it is, ignoring
        // width and precision, as the digit-by-digit form did.
        f.write_str(std::str::from_utf8(&digits).unwrap_or_default())
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Digest({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_accept_namespaced_names() {
        for ok in [
            "example.sequence.prefix_sum",
            "org.example",
            "a",
            "a1_b-c.d",
        ] {
            OpName::new(ok).unwrap();
        }
    }

    #[test]
    fn ids_reject_each_bad_shape() {
        assert_eq!(
            PackageId::new(""),
            Err(IdError::Empty { what: "package id" })
        );
        assert!(matches!(
            PackageId::new("a".repeat(129)),
            Err(IdError::TooLong { .. })
        ));
        assert!(matches!(
            PackageId::new("Example"),
            Err(IdError::BadStart { .. })
        ));
        assert!(matches!(
            PackageId::new("1abc"),
            Err(IdError::BadStart { .. })
        ));
        assert!(matches!(
            PackageId::new("a/b"),
            Err(IdError::BadChar {
                found: '/',
                at: 1,
                ..
            })
        ));
        assert!(matches!(
            PackageId::new("a..b"),
            Err(IdError::EmptySegment { .. })
        ));
        assert!(matches!(
            PackageId::new("a."),
            Err(IdError::EmptySegment { .. })
        ));
        assert!(matches!(
            PackageId::new("a\0b"),
            Err(IdError::BadChar { found: '\0', .. })
        ));
        // A character outside ASCII is named whole, at its byte offset, even after a doubled
        // dot (characters are checked before segments).
        assert!(matches!(
            PackageId::new("ab..\u{e9}t"),
            Err(IdError::BadChar {
                found: '\u{e9}',
                at: 4,
                ..
            })
        ));
    }

    /// A borrowed operation name is checked exactly as an owned one, for every byte value, and
    /// compares equal to the owned name of the same text.
    #[test]
    fn a_borrowed_operation_name_is_checked_as_an_owned_one() {
        let mut texts: Vec<String> = (0u8..=127)
            .map(|b| format!("op.a{}z", char::from(b)))
            .collect();
        texts.extend(
            [
                "",
                "op.",
                ".op",
                "Op.x",
                "9op",
                "op.\u{e9}",
                "ex.fake.double",
            ]
            .map(String::from),
        );
        texts.push("a".repeat(MAX_ID_LEN + 1));
        for text in &texts {
            let owned = OpName::new(text.as_str());
            let borrowed = OpNameRef::new(text);
            assert_eq!(borrowed.map(OpNameRef::to_owned), owned, "{text:?}");
            if let Ok(owned) = owned {
                let borrowed = OpNameRef::new(text).unwrap();
                assert_eq!(borrowed, owned);
                assert_eq!(owned, borrowed);
                assert_eq!(owned.as_name_ref(), borrowed);
                assert_eq!(borrowed.to_string(), *text);
            }
        }
        assert!(OpNameRef::new("ex.fake.double").unwrap() != OpName::new("ex.fake.other").unwrap());
    }

    #[test]
    fn digest_round_trips_and_refuses_uppercase() {
        let d = Sha256Digest::of(b"abc");
        assert_eq!(
            d.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Sha256Digest::parse_hex(&d.to_hex()), Ok(d));
        assert!(Sha256Digest::parse_hex(&d.to_hex().to_uppercase()).is_err());
        assert!(Sha256Digest::parse_hex("abc").is_err());
        // Every byte that is not a lowercase hex digit is refused, wherever it stands.
        for b in 0..=255u8 {
            let digit = b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
            for at in 0..64 {
                let mut text = [b'0'; 64];
                text[at] = b;
                let parsed = std::str::from_utf8(&text).map(Sha256Digest::parse_hex);
                assert_eq!(matches!(parsed, Ok(Ok(_))), digit, "{b:#04x} at {at}");
            }
        }
    }

    /// Every byte value at each of a word's eight places, between digits and letters at the
    /// edges of their ranges: the word parser answers as the digit-by-digit one. A `&str` of 64
    /// bytes cannot hold a lone byte of 0x80 or more, so this asks `hex_word` itself.
    #[test]
    fn a_word_of_digits_is_read_as_digit_by_digit_for_every_byte_at_every_place() {
        let mut checked = 0;
        for around in [b'0', b'9', b'a', b'f'] {
            for at in 0..8 {
                for b in 0..=255u8 {
                    let mut word = [around; 8];
                    word[at] = b;
                    let expected = (0..4).map(|i| {
                        let digit = |b: u8| match b {
                            b'0'..=b'9' => Some(b - b'0'),
                            b'a'..=b'f' => Some(b - b'a' + 10),
                            _ => None,
                        };
                        Some((digit(word[2 * i])? << 4) | digit(word[2 * i + 1])?)
                    });
                    let expected: Option<Vec<u8>> = expected.collect();
                    let read = hex_word(u64::from_le_bytes(word)).map(|w| w.to_le_bytes().to_vec());
                    assert_eq!(
                        read, expected,
                        "{b:#04x} at {at} among {:?}",
                        around as char
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 4 * 8 * 256);
        // And through `parse_hex`: a three-byte character at every place of a 64-byte text.
        for at in 0..=61 {
            let text = format!("{}\u{1c30}{}", "0".repeat(at), "0".repeat(61 - at));
            assert_eq!(text.len(), 64);
            assert!(Sha256Digest::parse_hex(&text).is_err(), "{text:?}");
        }
    }

    /// Digit by digit, the plain way: what the word-at-a-time parser must answer.
    fn parse_hex_by_digit(text: &str) -> Option<[u8; 32]> {
        let digit = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        let bytes = text.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0; 32];
        for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = (digit(pair[0])? << 4) | digit(pair[1])?;
        }
        Some(out)
    }

    mod digest_parse {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]

            /// 64 digits with up to two of them replaced, each by a character on either side
            /// of a range the parser tests (`/`, `:`, `` ` ``, `g`, uppercase, `@`, DEL, NUL,
            /// a two-byte character), and sometimes one digit too many or too few: read by both
            /// parsers. About a third of the texts are digests.
            #[test]
            fn digest_parse_agrees_with_a_digit_by_digit_parse(
                digits in proptest::collection::vec(
                    proptest::sample::select("0123456789abcdef".chars().collect::<Vec<_>>()),
                    64,
                ),
                edits in proptest::collection::vec(
                    (
                        0usize..64,
                        proptest::sample::select(vec![
                            '/', ':', '`', 'g', 'A', 'F', '@', '\u{7f}', '\u{0}', '\u{e9}',
                        ]),
                    ),
                    0..=2,
                ),
                length in prop_oneof![8 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)],
            ) {
                let mut chars = digits;
                for (at, c) in edits {
                    chars[at] = c;
                }
                match length {
                    -1 => {
                        chars.pop();
                    }
                    1 => chars.push('0'),
                    _ => {}
                }
                let text: String = chars.into_iter().collect();
                let parsed = Sha256Digest::parse_hex(&text).ok().map(|d| d.0);
                prop_assert_eq!(parsed, parse_hex_by_digit(&text), "{:?}", text);
            }
        }
    }
}
