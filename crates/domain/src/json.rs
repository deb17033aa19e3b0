//! A strict JSON reader for signed manifests: RFC 8259 grammar with the ambiguities removed.
//!
//! A signature covers bytes, but the host acts on values, so any input that two readers could
//! understand differently is refused here: duplicate object keys, `null`, numbers that are not
//! exact integers, lone UTF-16 surrogates, a byte order mark, trailing data and invalid UTF-8.
//! Nesting is capped at [`MAX_DEPTH`] so that hostile input cannot exhaust the stack. Every error
//! names the JSON path and byte offset where reading stopped. `serde_json` is not used because it
//! silently keeps the last of two duplicate keys.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

/// Deepest nesting of arrays and objects accepted; the outermost container is depth 1.
pub const MAX_DEPTH: usize = 64;

/// An object with more members than this switches duplicate detection from a linear scan to a
/// set, so that a hostile object with many keys stays linear-logarithmic instead of quadratic.
const LINEAR_DUPLICATE_SCAN: usize = 16;

/// A JSON value as this reader accepts it. There is no `null` and no floating-point number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `true` or `false`.
    Bool(bool),
    /// An integer within [`Integer::MIN`]`..=`[`Integer::MAX`].
    Integer(Integer),
    /// A string, with escapes resolved.
    String(String),
    /// An array, in document order.
    Array(Vec<Value>),
    /// An object's members in document order. The parser guarantees unique keys; the canonical
    /// writer sorts them.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// A short name of the value's type, for error messages (`"object"`, `"integer"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Bool(_) => "boolean",
            Value::Integer(_) => "integer",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The members, if this is an object.
    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_integer(&self) -> Option<Integer> {
        match self {
            Value::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The value of member `key`, if this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Writes the value as indented JSON (two spaces, members in stored order, a final newline),
    /// for files that people read. Strings are escaped as in the canonical form.
    pub fn to_pretty_string(&self) -> String {
        let mut out = String::new();
        write_pretty(&mut out, self, 0);
        out.push('\n');
        out
    }

    /// Writes the value as compact JSON: no whitespace between tokens, members in stored order,
    /// strings escaped as in the canonical form. For the large documents that only programs
    /// read (the registry's checkpoint and log frames): every reader accepts any whitespace, and
    /// indentation is a third of a pretty-printed registry's bytes.
    pub fn to_compact_string(&self) -> String {
        let mut out = String::new();
        write_compact(&mut out, self);
        out
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<u64> for Value {
    fn from(i: u64) -> Self {
        Value::Integer(i.into())
    }
}

/// A JSON value read by [`parse_borrowed`], whose strings and keys borrow from the input where
/// they hold no escape. It is the same document [`parse`] answers, read as strictly, for readers
/// of large documents (the registry's checkpoint) that only look at the values once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BorrowedValue<'a> {
    /// `true` or `false`.
    Bool(bool),
    /// An integer within [`Integer::MIN`]`..=`[`Integer::MAX`].
    Integer(Integer),
    /// A string, with escapes resolved (borrowed when it has none).
    String(Cow<'a, str>),
    /// An array, in document order.
    Array(Vec<BorrowedValue<'a>>),
    /// An object's members in document order, keys unique.
    Object(Vec<(Cow<'a, str>, BorrowedValue<'a>)>),
}

impl<'a> BorrowedValue<'a> {
    /// A short name of the value's type, as [`Value::type_name`] answers it.
    pub fn type_name(&self) -> &'static str {
        match self {
            BorrowedValue::Bool(_) => "boolean",
            BorrowedValue::Integer(_) => "integer",
            BorrowedValue::String(_) => "string",
            BorrowedValue::Array(_) => "array",
            BorrowedValue::Object(_) => "object",
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            BorrowedValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The members, if this is an object.
    pub fn as_object(&self) -> Option<&[(Cow<'a, str>, BorrowedValue<'a>)]> {
        match self {
            BorrowedValue::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[BorrowedValue<'a>]> {
        match self {
            BorrowedValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_integer(&self) -> Option<Integer> {
        match self {
            BorrowedValue::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The value of member `key`, if this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&BorrowedValue<'a>> {
        self.as_object()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The same value owning its strings.
    pub fn into_owned(self) -> Value {
        match self {
            BorrowedValue::Bool(b) => Value::Bool(b),
            BorrowedValue::Integer(i) => Value::Integer(i),
            BorrowedValue::String(s) => Value::String(s.into_owned()),
            BorrowedValue::Array(a) => {
                Value::Array(a.into_iter().map(BorrowedValue::into_owned).collect())
            }
            BorrowedValue::Object(m) => Value::Object(
                m.into_iter()
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect(),
            ),
        }
    }
}

/// A JSON integer in the range that both `i64` and `u64` readers can hold between them:
/// `i64::MIN..=u64::MAX`. Construction outside that range is refused, so every `Integer` can be
/// written and read back unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Integer(i128);

impl Integer {
    /// The smallest accepted integer, `i64::MIN`.
    pub const MIN: i128 = i64::MIN as i128;
    /// The largest accepted integer, `u64::MAX`.
    pub const MAX: i128 = u64::MAX as i128;

    /// Wraps `value` if it lies within [`Integer::MIN`]`..=`[`Integer::MAX`].
    pub fn new(value: i128) -> Option<Self> {
        (Self::MIN..=Self::MAX)
            .contains(&value)
            .then_some(Integer(value))
    }

    /// The value.
    pub fn get(self) -> i128 {
        self.0
    }

    /// The value as `u64`, if it is not negative.
    pub fn as_u64(self) -> Option<u64> {
        u64::try_from(self.0).ok()
    }
}

impl From<u64> for Integer {
    fn from(v: u64) -> Self {
        Integer(v.into())
    }
}

impl From<i64> for Integer {
    fn from(v: i64) -> Self {
        Integer(v.into())
    }
}

impl From<u32> for Integer {
    fn from(v: u32) -> Self {
        Integer(v.into())
    }
}

impl fmt::Display for Integer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One step of a [`JsonPath`]: an object member or an array element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathSegment {
    /// An object member, by key.
    Key(String),
    /// An array element, by zero-based index.
    Index(usize),
}

/// The location of a value inside a document, displayed as `$.payload.artifacts[2].sha256`.
/// Keys that are not plain identifiers are written in brackets as JSON strings (`$["a b"]`), so
/// that the display is unambiguous.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct JsonPath {
    segments: Vec<PathSegment>,
}

impl JsonPath {
    /// The document root, `$`.
    pub fn root() -> Self {
        JsonPath::default()
    }

    /// This path extended by member `key`.
    pub fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.segments.push(PathSegment::Key(key.to_owned()));
        p
    }

    /// This path extended by element `index`.
    pub fn index(&self, index: usize) -> Self {
        let mut p = self.clone();
        p.segments.push(PathSegment::Index(index));
        p
    }

    /// The steps from the root.
    pub fn segments(&self) -> &[PathSegment] {
        &self.segments
    }
}

impl FromIterator<PathSegment> for JsonPath {
    fn from_iter<I: IntoIterator<Item = PathSegment>>(steps: I) -> Self {
        JsonPath {
            segments: steps.into_iter().collect(),
        }
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("$")?;
        for seg in &self.segments {
            match seg {
                PathSegment::Index(i) => write!(f, "[{i}]")?,
                PathSegment::Key(k) if is_plain_key(k) => write!(f, ".{k}")?,
                PathSegment::Key(k) => {
                    let mut quoted = String::new();
                    write_escaped(&mut quoted, k);
                    write!(f, "[{quoted}]")?;
                }
            }
        }
        Ok(())
    }
}

fn is_plain_key(k: &str) -> bool {
    let mut bytes = k.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Why the input is not acceptable JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonErrorKind {
    /// The input is not UTF-8; the offset is where the first bad sequence starts.
    #[error("input is not valid UTF-8")]
    InvalidUtf8,
    /// The input starts with a UTF-8 byte order mark.
    #[error("input starts with a byte order mark")]
    ByteOrderMark,
    /// The input ends inside a value.
    #[error("input ends before the value is complete")]
    UnexpectedEnd,
    /// A character that the grammar does not allow at this point.
    #[error("found {found:?} where {expected} was expected")]
    UnexpectedCharacter {
        /// The character found.
        found: char,
        /// What the grammar expects there.
        expected: &'static str,
    },
    /// Something that starts like `true`, `false` or `null` but is not.
    #[error("misspelt literal; expected true or false")]
    InvalidLiteral,
    /// A `null`, which no field of a manifest may hold.
    #[error("null is not allowed; omit the field instead")]
    Null,
    /// A number with a fractional part.
    #[error("numbers must be integers; a fraction is not allowed")]
    Fraction,
    /// A number with an exponent.
    #[error("numbers must be integers; an exponent is not allowed")]
    Exponent,
    /// The number `-0`.
    #[error("-0 is not allowed; write 0")]
    NegativeZero,
    /// A number with a redundant leading zero, such as `01`.
    #[error("integer has a leading zero")]
    LeadingZero,
    /// An integer outside `i64::MIN..=u64::MAX`.
    #[error("integer is outside {min}..={max}", min = Integer::MIN, max = Integer::MAX)]
    IntegerOutOfRange,
    /// A raw control character inside a string.
    #[error("string contains unescaped control character {found:#04x}")]
    ControlCharacter {
        /// The byte found.
        found: u8,
    },
    /// A backslash escape that JSON does not define.
    #[error("unknown escape sequence \\{found}")]
    InvalidEscape {
        /// The character after the backslash.
        found: char,
    },
    /// A `\\u` escape without four hex digits.
    #[error("\\u must be followed by four hex digits")]
    InvalidUnicodeEscape,
    /// A `\\u` escape naming half of a UTF-16 surrogate pair without the other half.
    #[error("escape \\u{code:04x} is a lone UTF-16 surrogate")]
    LoneSurrogate {
        /// The surrogate's code unit.
        code: u16,
    },
    /// An object key that appeared before in the same object.
    #[error("duplicate object key {key:?}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// Arrays and objects nested deeper than [`MAX_DEPTH`].
    #[error("nesting is deeper than {limit} levels")]
    TooDeep {
        /// The deepest nesting allowed.
        limit: usize,
    },
    /// Non-whitespace after the document.
    #[error("unexpected data after the end of the value")]
    TrailingData,
}

/// A parse failure: what went wrong, where in the document and at which byte offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at {path} (byte {offset})")]
pub struct JsonError {
    /// The path of the value being read when the error occurred.
    pub path: JsonPath,
    /// Offset of the offending byte from the start of the input.
    pub offset: usize,
    /// What went wrong.
    pub kind: JsonErrorKind,
}

/// An error on its way out of the recursion. The path is collected in reverse while unwinding, so
/// that the successful path pays nothing for path tracking.
struct Failure {
    offset: usize,
    kind: JsonErrorKind,
    reversed_path: Vec<PathSegment>,
}

impl Failure {
    fn at(offset: usize, kind: JsonErrorKind) -> Self {
        Failure {
            offset,
            kind,
            reversed_path: Vec::new(),
        }
    }

    fn within(mut self, segment: PathSegment) -> Self {
        self.reversed_path.push(segment);
        self
    }
}

/// Parses `input` as one strict JSON document.
pub fn parse(input: &[u8]) -> Result<Value, JsonError> {
    parse_borrowed(input).map(BorrowedValue::into_owned)
}

/// Parses `input` as one strict JSON document, as [`parse`] does (the same grammar, refusals,
/// paths and offsets), leaving every string that holds no escape in the input: a large document
/// costs one allocation per array and object instead of one per string as well.
pub fn parse_borrowed(input: &[u8]) -> Result<BorrowedValue<'_>, JsonError> {
    let finish = |f: Failure| {
        let mut segments = f.reversed_path;
        segments.reverse();
        JsonError {
            path: JsonPath { segments },
            offset: f.offset,
            kind: f.kind,
        }
    };
    if input.starts_with(&[0xef, 0xbb, 0xbf]) {
        return Err(finish(Failure::at(0, JsonErrorKind::ByteOrderMark)));
    }
    let text = std::str::from_utf8(input)
        .map_err(|e| finish(Failure::at(e.valid_up_to(), JsonErrorKind::InvalidUtf8)))?;
    let mut parser = Parser {
        text,
        bytes: input,
        pos: 0,
    };
    let value = parser.value(0).map_err(finish)?;
    parser.skip_whitespace();
    if parser.pos != input.len() {
        return Err(finish(Failure::at(parser.pos, JsonErrorKind::TrailingData)));
    }
    Ok(value)
}

/// A forward-only reader of one strict JSON document for decoders that build their values
/// straight from the text, without the tree [`parse_borrowed`] makes: the large registry
/// documents (`store_state`, `store_log`). It accepts exactly what [`parse_borrowed`] accepts
/// (the same `Parser` reads every token), but it names no error: any refusal answers `None`,
/// and the caller reads the document again with [`parse_borrowed`] to say what is wrong and
/// where. The caller refuses, the same way, every key it does not know and every key it has
/// seen before in the same object, so that duplicate keys cannot pass.
pub(crate) struct Cursor<'a> {
    parser: Parser<'a>,
    depth: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `input`, or `None` when `input` is not UTF-8 or starts with a
    /// byte order mark.
    pub(crate) fn new(input: &'a [u8]) -> Option<Self> {
        if input.starts_with(&[0xef, 0xbb, 0xbf]) {
            return None;
        }
        let text = std::str::from_utf8(input).ok()?;
        Some(Cursor {
            parser: Parser {
                text,
                bytes: input,
                pos: 0,
            },
            depth: 0,
        })
    }

    /// A cursor at the start of `text`, which is UTF-8 already.
    pub(crate) fn of_str(text: &'a str) -> Self {
        Cursor {
            parser: Parser {
                text,
                bytes: text.as_bytes(),
                pos: 0,
            },
            depth: 0,
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.parser.skip_whitespace();
        (self.parser.peek() == Some(byte)).then(|| self.parser.pos += 1)
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// Reads an object, calling `member` with each key; `member` reads the key's value.
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &str) -> Option<()>,
    ) -> Option<()> {
        self.expect(b'{')?;
        self.enter()?;
        self.parser.skip_whitespace();
        if self.parser.peek() == Some(b'}') {
            self.parser.pos += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            let key = self.str()?;
            self.expect(b':')?;
            member(self, &key)?;
            self.parser.skip_whitespace();
            match self.parser.peek() {
                Some(b',') => self.parser.pos += 1,
                Some(b'}') => {
                    self.parser.pos += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Reads an array, calling `element` to read each element.
    pub(crate) fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.expect(b'[')?;
        self.enter()?;
        self.parser.skip_whitespace();
        if self.parser.peek() == Some(b']') {
            self.parser.pos += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            element(self)?;
            self.parser.skip_whitespace();
            match self.parser.peek() {
                Some(b',') => self.parser.pos += 1,
                Some(b']') => {
                    self.parser.pos += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Reads a string (borrowed from the input when it holds no escape).
    pub(crate) fn str(&mut self) -> Option<Cow<'a, str>> {
        self.parser.skip_whitespace();
        if self.parser.peek() != Some(b'"') {
            return None;
        }
        self.parser.string().ok()
    }

    /// Reads an integer that fits a `u64`.
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.parser.skip_whitespace();
        if !matches!(self.parser.peek(), Some(b'-' | b'0'..=b'9')) {
            return None;
        }
        self.parser.number().ok()?.as_u64()
    }

    /// Reads any value as the tree [`parse_borrowed`] makes of it, for the small parts of a
    /// document that a decoder reads from a tree.
    pub(crate) fn value(&mut self) -> Option<BorrowedValue<'a>> {
        self.parser.value(self.depth).ok()
    }

    /// Reads past any value without building it: no allocation, no unescaping. It refuses
    /// everything [`parse_borrowed`] refuses (the same grammar, escapes, control characters,
    /// integers, `null` and depth limit) except a duplicate key, which only a set of the keys
    /// could find; a reader that skips a value says what that leaves unchecked.
    pub(crate) fn skip(&mut self) -> Option<()> {
        self.parser.skip(self.depth).ok()
    }

    /// The byte offset at which the next token starts (whitespace before it passed over).
    pub(crate) fn offset(&mut self) -> usize {
        self.parser.skip_whitespace();
        self.parser.pos
    }

    /// Moves the cursor forward to byte `to` of its input, past a value that its caller has
    /// read from [`Cursor::text`] itself, holding it to this reader's grammar (the index rows
    /// that `store_state::listing` reads byte by byte). `None`, the cursor unmoved, when `to`
    /// lies behind it, past the end or inside a character.
    pub(crate) fn pass_to(&mut self, to: usize) -> Option<()> {
        (to >= self.parser.pos && self.parser.text.is_char_boundary(to)).then(|| {
            self.parser.pos = to;
        })
    }

    /// The text the cursor reads.
    pub(crate) fn text(&self) -> &'a str {
        self.parser.text
    }

    /// The byte offset the cursor stands at: just after the last token read.
    pub(crate) fn position(&self) -> usize {
        self.parser.pos
    }

    /// Whether only whitespace is left.
    pub(crate) fn at_end(&mut self) -> bool {
        self.parser.skip_whitespace();
        self.parser.pos == self.parser.bytes.len()
    }
}

struct Parser<'a> {
    /// The input as text; it has been checked to be UTF-8 before parsing starts.
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        // The registry's files are indented: a scan over the slice, not a peek per byte.
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        self.pos += rest
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .unwrap_or(rest.len());
    }

    /// An error for the byte at the current position: the end of input or an unexpected
    /// character, decoded whole so that the message shows it as written.
    fn unexpected(&self, expected: &'static str) -> Failure {
        match self
            .text
            .get(self.pos..)
            .and_then(|rest| rest.chars().next())
        {
            Some(found) => Failure::at(
                self.pos,
                JsonErrorKind::UnexpectedCharacter { found, expected },
            ),
            None => Failure::at(self.pos, JsonErrorKind::UnexpectedEnd),
        }
    }

    fn value(&mut self, depth: usize) -> Result<BorrowedValue<'a>, Failure> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(BorrowedValue::String),
            Some(b'-' | b'0'..=b'9') => self.number().map(BorrowedValue::Integer),
            Some(b't') => self.literal(b"true").map(|()| BorrowedValue::Bool(true)),
            Some(b'f') => self.literal(b"false").map(|()| BorrowedValue::Bool(false)),
            Some(b'n') => {
                let at = self.pos;
                self.literal(b"null")?;
                Err(Failure::at(at, JsonErrorKind::Null))
            }
            _ => Err(self.unexpected("a value")),
        }
    }

    /// [`Self::value`] without the value: reads past it, checking the same grammar except
    /// duplicate keys ([`Cursor::skip`]).
    fn skip(&mut self, depth: usize) -> Result<(), Failure> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.skip_object(depth + 1),
            Some(b'[') => self.skip_array(depth + 1),
            Some(b'"') => self.skip_string(),
            Some(b'-' | b'0'..=b'9') => self.number().map(drop),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => {
                let at = self.pos;
                self.literal(b"null")?;
                Err(Failure::at(at, JsonErrorKind::Null))
            }
            _ => Err(self.unexpected("a value")),
        }
    }

    fn skip_object(&mut self, depth: usize) -> Result<(), Failure> {
        self.enter(depth)?;
        self.pos += 1;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("a string key"));
            }
            self.skip_string()?;
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.unexpected("':'"));
            }
            self.pos += 1;
            self.skip(depth)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.unexpected("',' or '}'")),
            }
        }
    }

    fn skip_array(&mut self, depth: usize) -> Result<(), Failure> {
        self.enter(depth)?;
        self.pos += 1;
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip(depth)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.unexpected("',' or ']'")),
            }
        }
    }

    /// [`Self::string`] without the string: each escape is checked as it would be decoded, and
    /// nothing is copied.
    fn skip_string(&mut self) -> Result<(), Failure> {
        self.pos += 1;
        loop {
            let rest = self.bytes.get(self.pos..).unwrap_or_default();
            self.pos += plain_run(rest);
            match self.peek() {
                None => return Err(Failure::at(self.pos, JsonErrorKind::UnexpectedEnd)),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.escape()?;
                }
                Some(found) => {
                    return Err(Failure::at(
                        self.pos,
                        JsonErrorKind::ControlCharacter { found },
                    ))
                }
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Failure> {
        let end = self.pos + word.len();
        if self.bytes.get(self.pos..end) == Some(word) {
            self.pos = end;
            Ok(())
        } else {
            Err(Failure::at(self.pos, JsonErrorKind::InvalidLiteral))
        }
    }

    fn enter(&self, depth: usize) -> Result<(), Failure> {
        if depth > MAX_DEPTH {
            return Err(Failure::at(
                self.pos,
                JsonErrorKind::TooDeep { limit: MAX_DEPTH },
            ));
        }
        Ok(())
    }

    fn object(&mut self, depth: usize) -> Result<BorrowedValue<'a>, Failure> {
        self.enter(depth)?;
        self.pos += 1;
        let mut members: Vec<(Cow<'a, str>, BorrowedValue<'a>)> = Vec::new();
        // Filled only once the object grows past the linear-scan limit.
        let mut seen: Option<BTreeSet<Cow<'a, str>>> = None;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(BorrowedValue::Object(members));
        }
        loop {
            self.skip_whitespace();
            let key_at = self.pos;
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("a string key"));
            }
            let key = self.string()?;
            if is_duplicate(&members, &mut seen, &key) {
                let kind = JsonErrorKind::DuplicateKey {
                    key: key.clone().into_owned(),
                };
                return Err(Failure::at(key_at, kind).within(PathSegment::Key(key.into_owned())));
            }
            self.skip_whitespace();
            if self.peek() != Some(b':') {
                return Err(self.unexpected("':'"));
            }
            self.pos += 1;
            let value = match self.value(depth) {
                Ok(v) => v,
                Err(f) => return Err(f.within(PathSegment::Key(key.into_owned()))),
            };
            members.push((key, value));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(BorrowedValue::Object(members));
                }
                _ => return Err(self.unexpected("',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<BorrowedValue<'a>, Failure> {
        self.enter(depth)?;
        self.pos += 1;
        let mut elements = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(BorrowedValue::Array(elements));
        }
        loop {
            match self.value(depth) {
                Ok(v) => elements.push(v),
                Err(f) => return Err(f.within(PathSegment::Index(elements.len()))),
            }
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(BorrowedValue::Array(elements));
                }
                _ => return Err(self.unexpected("',' or ']'")),
            }
        }
    }

    /// Reads a string starting at its opening quote. A string without escapes is answered as a
    /// slice of the input; the first escape switches to building a copy.
    fn string(&mut self) -> Result<Cow<'a, str>, Failure> {
        self.pos += 1;
        let start = self.pos;
        let mut out: Option<String> = None;
        loop {
            let run_start = self.pos;
            // One scan over the slice rather than a bounds-checked peek per byte: strings are
            // most of a registry's bytes.
            let rest = self.bytes.get(self.pos..).unwrap_or_default();
            self.pos += plain_run(rest);
            // The run stops only at ASCII bytes or the end, both of which are char boundaries.
            let run = self.text.get(run_start..self.pos).unwrap_or_default();
            if let Some(out) = out.as_mut() {
                out.push_str(run);
            }
            match self.peek() {
                None => return Err(Failure::at(self.pos, JsonErrorKind::UnexpectedEnd)),
                Some(b'"') => {
                    let end = self.pos;
                    self.pos += 1;
                    return Ok(match out {
                        Some(out) => Cow::Owned(out),
                        None => Cow::Borrowed(self.text.get(start..end).unwrap_or_default()),
                    });
                }
                Some(b'\\') => {
                    let escape_at = self.pos;
                    let c = self.escape()?;
                    // At the first escape, everything before it was one plain run.
                    let text = self.text;
                    out.get_or_insert_with(|| {
                        text.get(start..escape_at).unwrap_or_default().to_owned()
                    })
                    .push(c);
                }
                Some(found) => {
                    return Err(Failure::at(
                        self.pos,
                        JsonErrorKind::ControlCharacter { found },
                    ))
                }
            }
        }
    }

    /// Reads one escape sequence starting at the backslash.
    fn escape(&mut self) -> Result<char, Failure> {
        let at = self.pos;
        self.pos += 1;
        let c = match self.peek() {
            None => return Err(Failure::at(self.pos, JsonErrorKind::UnexpectedEnd)),
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                return self.unicode_escape(at);
            }
            Some(_) => {
                let found = self
                    .text
                    .get(self.pos..)
                    .and_then(|r| r.chars().next())
                    .unwrap_or('?');
                return Err(Failure::at(at, JsonErrorKind::InvalidEscape { found }));
            }
        };
        self.pos += 1;
        Ok(c)
    }

    /// Reads the hex digits of `\uXXXX` (the `\u` already consumed), joining a surrogate pair.
    fn unicode_escape(&mut self, at: usize) -> Result<char, Failure> {
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                    return Err(Failure::at(
                        at,
                        JsonErrorKind::LoneSurrogate { code: first },
                    ));
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(Failure::at(
                        at,
                        JsonErrorKind::LoneSurrogate { code: first },
                    ));
                }
                0x10000 + ((u32::from(first) - 0xd800) << 10) + (u32::from(second) - 0xdc00)
            }
            0xdc00..=0xdfff => {
                return Err(Failure::at(
                    at,
                    JsonErrorKind::LoneSurrogate { code: first },
                ))
            }
            other => u32::from(other),
        };
        char::from_u32(code).ok_or(Failure::at(at, JsonErrorKind::InvalidUnicodeEscape))
    }

    fn hex4(&mut self) -> Result<u16, Failure> {
        let mut v: u16 = 0;
        for _ in 0..4 {
            let digit = self
                .peek()
                .and_then(|b| char::from(b).to_digit(16))
                .ok_or(Failure::at(self.pos, JsonErrorKind::InvalidUnicodeEscape))?;
            // Four hex digits fill exactly 16 bits, so the shift never loses a set bit.
            v = (v << 4) | digit as u16;
            self.pos += 1;
        }
        Ok(v)
    }

    fn number(&mut self) -> Result<Integer, Failure> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let limit: u128 = if negative { 1 << 63 } else { u64::MAX.into() };
        let mut magnitude: u128 = 0;
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(Failure::at(start, JsonErrorKind::LeadingZero));
                }
            }
            Some(b'1'..=b'9') => {
                while let Some(d @ b'0'..=b'9') = self.peek() {
                    magnitude = magnitude * 10 + u128::from(d - b'0');
                    if magnitude > limit {
                        return Err(Failure::at(start, JsonErrorKind::IntegerOutOfRange));
                    }
                    self.pos += 1;
                }
            }
            _ => return Err(self.unexpected("a digit")),
        }
        match self.peek() {
            Some(b'.') => return Err(Failure::at(self.pos, JsonErrorKind::Fraction)),
            Some(b'e' | b'E') => return Err(Failure::at(self.pos, JsonErrorKind::Exponent)),
            _ => {}
        }
        if negative && magnitude == 0 {
            return Err(Failure::at(start, JsonErrorKind::NegativeZero));
        }
        // The magnitude is at most 2^64 - 1 (or 2^63 when negative), so it fits an i128.
        let magnitude = i128::try_from(magnitude)
            .map_err(|_| Failure::at(start, JsonErrorKind::IntegerOutOfRange))?;
        let value = if negative { -magnitude } else { magnitude };
        Integer::new(value).ok_or(Failure::at(start, JsonErrorKind::IntegerOutOfRange))
    }
}

/// The length of the run of plain string bytes at the start of `bytes`: up to the first `"`,
/// `\\` or control character. Eight bytes at a time: skipped strings (digests, signatures,
/// manifest facts) are most of what a reader of one package passes over.
pub(crate) fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Whether any byte of `word` is zero (the classic test; it has no false positives when
    // only asked whether there is one).
    let has_zero = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS != 0;
    let mut chunks = bytes.chunks_exact(8);
    let mut done = 0;
    for chunk in chunks.by_ref() {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        // A byte below 0x20 has its top three bits clear: `word & 0xe0..` has a zero byte there.
        let special = has_zero(word ^ (ONES * u64::from(b'"')))
            || has_zero(word ^ (ONES * u64::from(b'\\')))
            || has_zero(word & (ONES * 0xe0));
        if special {
            break;
        }
        done += 8;
    }
    done + bytes[done..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(bytes.len() - done)
}

// The key is taken as the parser holds it, so that a set of keys shares borrowed ones.
#[allow(clippy::ptr_arg)]
fn is_duplicate<'a>(
    members: &[(Cow<'a, str>, BorrowedValue<'a>)],
    seen: &mut Option<BTreeSet<Cow<'a, str>>>,
    key: &Cow<'a, str>,
) -> bool {
    if let Some(set) = seen {
        return !set.insert(key.clone());
    }
    if members.iter().any(|(k, _)| k == key) {
        return true;
    }
    if members.len() + 1 >= LINEAR_DUPLICATE_SCAN {
        let mut set: BTreeSet<Cow<'a, str>> = members.iter().map(|(k, _)| k.clone()).collect();
        set.insert(key.clone());
        *seen = Some(set);
    }
    false
}

/// Writes `s` as a JSON string with the minimal escaping of the canonical form: `"` and `\`, the
/// five short control escapes, `\u00xx` (lowercase hex) for other control characters, and every
/// other character literally.
pub(crate) fn write_escaped(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    let mut rest = s;
    while let Some(i) = rest.find(|c: char| c == '"' || c == '\\' || c < ' ') {
        // `find` returns the index of a matching char, so the split is on a char boundary.
        let (literal, tail) = rest.split_at(i);
        out.push_str(literal);
        let mut chars = tail.chars();
        match chars.next() {
            Some('"') => out.push_str("\\\""),
            Some('\\') => out.push_str("\\\\"),
            Some('\u{8}') => out.push_str("\\b"),
            Some('\u{c}') => out.push_str("\\f"),
            Some('\n') => out.push_str("\\n"),
            Some('\r') => out.push_str("\\r"),
            Some('\t') => out.push_str("\\t"),
            Some(c) => {
                let b = c as u32;
                out.push_str("\\u00");
                out.push(char::from(HEX[((b >> 4) & 0xf) as usize]));
                out.push(char::from(HEX[(b & 0xf) as usize]));
            }
            None => {}
        }
        rest = chars.as_str();
    }
    out.push_str(rest);
    out.push('"');
}

/// Writes `members` as compact JSON object members (`"key":value`, comma-separated, no
/// braces), for a document written a part at a time.
pub(crate) fn write_compact_members(out: &mut String, members: &[(String, Value)]) {
    for (i, (key, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_escaped(out, key);
        out.push(':');
        write_compact(out, value);
    }
}

/// Writes `values` as the compact JSON array of them, each made only when it is written, so
/// that a large array is never held as a tree.
pub(crate) fn write_compact_array(out: &mut String, values: impl Iterator<Item = Value>) {
    out.push('[');
    for (i, value) in values.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_compact(out, &value);
    }
    out.push(']');
}

pub(crate) fn write_compact(out: &mut String, value: &Value) {
    match value {
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Integer(i) => out.push_str(&i.to_string()),
        Value::String(s) => write_escaped(out, s),
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_compact(out, v);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            write_compact_members(out, m);
            out.push('}');
        }
    }
}

fn write_pretty(out: &mut String, value: &Value, indent: usize) {
    fn newline(out: &mut String, indent: usize) {
        out.push('\n');
        for _ in 0..indent {
            out.push_str("  ");
        }
    }
    match value {
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Integer(i) => out.push_str(&i.to_string()),
        Value::String(s) => write_escaped(out, s),
        Value::Array(a) if a.is_empty() => out.push_str("[]"),
        Value::Object(m) if m.is_empty() => out.push_str("{}"),
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent + 1);
                write_pretty(out, v, indent + 1);
            }
            newline(out, indent);
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, indent + 1);
                write_escaped(out, k);
                out.push_str(": ");
                write_pretty(out, v, indent + 1);
            }
            newline(out, indent);
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(input: &str) -> JsonErrorKind {
        parse(input.as_bytes()).unwrap_err().kind
    }

    #[test]
    fn reads_nested_values() {
        let v = parse(br#" {"a": [1, -2, true, "x\u00e9\ud83d\ude00"], "b": {}} "#).unwrap();
        let expected = Value::Object(vec![
            (
                "a".into(),
                Value::Array(vec![
                    Value::Integer(1u64.into()),
                    Value::Integer((-2i64).into()),
                    Value::Bool(true),
                    Value::String("x\u{e9}\u{1f600}".into()),
                ]),
            ),
            ("b".into(), Value::Object(vec![])),
        ]);
        assert_eq!(v, expected);
    }

    #[test]
    fn borrowed_values_borrow_plain_strings_and_read_as_parse_does() {
        let text = br#"{"plain": "abc", "esc\u0061ped": "x\ny", "list": [true, -3, {}]}"#;
        let v = parse_borrowed(text).unwrap();
        let members = v.as_object().unwrap();
        assert!(matches!(members[0].0, Cow::Borrowed("plain")));
        assert!(matches!(
            members[0].1,
            BorrowedValue::String(Cow::Borrowed("abc"))
        ));
        assert_eq!(members[1].0, "escaped");
        assert_eq!(
            v.get("escaped").and_then(BorrowedValue::as_str),
            Some("x\ny")
        );
        assert_eq!(v.clone().into_owned(), parse(text).unwrap());
        // Every refusal and its place are the same as well.
        for bad in [
            &br#"{"a": 1, "\u0061": 2}"#[..],
            br#"{"a": ["x", "\ud800"]}"#,
            br#"{"a": "b" "#,
            b"[1, 2.5]",
        ] {
            assert_eq!(parse_borrowed(bad).unwrap_err(), parse(bad).unwrap_err());
        }
    }

    #[test]
    fn integer_limits_are_inclusive() {
        assert_eq!(
            parse(b"18446744073709551615").unwrap(),
            Value::Integer(u64::MAX.into())
        );
        assert_eq!(
            parse(b"-9223372036854775808").unwrap(),
            Value::Integer(i64::MIN.into())
        );
        assert_eq!(
            kind("18446744073709551616"),
            JsonErrorKind::IntegerOutOfRange
        );
        assert_eq!(
            kind("-9223372036854775809"),
            JsonErrorKind::IntegerOutOfRange
        );
        assert_eq!(
            kind("123456789012345678901234567890123456789012"),
            JsonErrorKind::IntegerOutOfRange
        );
    }

    #[test]
    fn refuses_each_ambiguity() {
        assert_eq!(kind("1.0"), JsonErrorKind::Fraction);
        assert_eq!(kind("1e3"), JsonErrorKind::Exponent);
        assert_eq!(kind("1E3"), JsonErrorKind::Exponent);
        assert_eq!(kind("-0"), JsonErrorKind::NegativeZero);
        assert_eq!(kind("01"), JsonErrorKind::LeadingZero);
        assert_eq!(kind("-"), JsonErrorKind::UnexpectedEnd);
        assert_eq!(kind("null"), JsonErrorKind::Null);
        assert_eq!(kind("nul"), JsonErrorKind::InvalidLiteral);
        assert_eq!(kind("tru"), JsonErrorKind::InvalidLiteral);
        assert_eq!(
            kind(r#""\ud800""#),
            JsonErrorKind::LoneSurrogate { code: 0xd800 }
        );
        assert_eq!(
            kind(r#""\udc00""#),
            JsonErrorKind::LoneSurrogate { code: 0xdc00 }
        );
        assert_eq!(
            kind(r#""\ud800\u0041""#),
            JsonErrorKind::LoneSurrogate { code: 0xd800 }
        );
        assert_eq!(kind(r#""\x""#), JsonErrorKind::InvalidEscape { found: 'x' });
        assert_eq!(kind(r#""\u12g4""#), JsonErrorKind::InvalidUnicodeEscape);
        assert_eq!(
            kind("\"a\tb\""),
            JsonErrorKind::ControlCharacter { found: b'\t' }
        );
        assert_eq!(kind("1 2"), JsonErrorKind::TrailingData);
        assert_eq!(kind(""), JsonErrorKind::UnexpectedEnd);
        assert_eq!(
            kind("[1,]"),
            JsonErrorKind::UnexpectedCharacter {
                found: ']',
                expected: "a value"
            }
        );
        assert_eq!(
            kind(r#"{"a":1,}"#),
            JsonErrorKind::UnexpectedCharacter {
                found: '}',
                expected: "a string key"
            }
        );
        assert_eq!(
            parse(b"\xef\xbb\xbf{}").unwrap_err().kind,
            JsonErrorKind::ByteOrderMark
        );
        let e = parse(b"[\"ok\", \"\xff\"]").unwrap_err();
        assert_eq!((e.kind, e.offset), (JsonErrorKind::InvalidUtf8, 8));
    }

    #[test]
    fn errors_carry_path_and_offset() {
        let e = parse(br#"{"payload": {"artifacts": [{}, {}, {"sha256": 1.5}]}}"#).unwrap_err();
        assert_eq!(e.kind, JsonErrorKind::Fraction);
        assert_eq!(e.path.to_string(), "$.payload.artifacts[2].sha256");
        assert_eq!(e.offset, 47);
        let e = parse(br#"{"a": {"b": 1, "b": 2}}"#).unwrap_err();
        assert_eq!(e.kind, JsonErrorKind::DuplicateKey { key: "b".into() });
        assert_eq!(e.path.to_string(), "$.a.b");
        assert_eq!(e.offset, 15);
        let e = parse(br#"{"a b": null}"#).unwrap_err();
        assert_eq!(e.path.to_string(), r#"$["a b"]"#);
    }

    #[test]
    fn keys_are_compared_after_unescaping() {
        // Otherwise a second "version" spelt with an escape would slip past the check.
        let e = parse(br#"{"version": "1.0.0", "\u0076ersion": "9.9.9"}"#).unwrap_err();
        assert_eq!(
            e.kind,
            JsonErrorKind::DuplicateKey {
                key: "version".into()
            }
        );
        assert_eq!(e.offset, 21);
    }

    #[test]
    fn depth_is_capped() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(ok.as_bytes()).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let e = parse(deep.as_bytes()).unwrap_err();
        assert_eq!(
            (e.kind, e.offset),
            (JsonErrorKind::TooDeep { limit: MAX_DEPTH }, MAX_DEPTH)
        );
    }

    #[test]
    fn duplicate_detection_covers_large_objects() {
        let mut text = String::from("{");
        for i in 0..100 {
            text.push_str(&format!("\"k{i}\": {i},"));
        }
        text.push_str("\"k7\": 0}");
        let e = parse(text.as_bytes()).unwrap_err();
        assert_eq!(e.kind, JsonErrorKind::DuplicateKey { key: "k7".into() });
    }

    #[test]
    fn pretty_output_reads_back() {
        let v = parse(br#"{"a":[1,{"b":"\n"}],"c":[],"d":{}}"#).unwrap();
        let pretty = v.to_pretty_string();
        assert_eq!(
            pretty,
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": \"\\n\"\n    }\n  ],\n  \"c\": [],\n  \"d\": {}\n}\n"
        );
        assert_eq!(parse(pretty.as_bytes()).unwrap(), v);
    }

    /// Whether [`Cursor::skip`] reads `input` as one whole document.
    fn skips(input: &[u8]) -> bool {
        Cursor::new(input).is_some_and(|mut c| c.skip().is_some() && c.at_end())
    }

    #[test]
    fn skip_refuses_what_parse_refuses_but_duplicate_keys() {
        let mut cases: Vec<Vec<u8>> = [
            "{}",
            "[]",
            r#"{"a":[1,{"b":"\n"}],"c":[],"d":{},"e":true,"f":false,"g":-12}"#,
            " { \"a\" : [ 1 , 2 ] } ",
            r#""\ud83d\ude00 \u0041 \/ \" \\ \b\f\n\r\t""#,
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "1.5",
            "1e3",
            "-0",
            "01",
            "-",
            "null",
            "[null]",
            "nul",
            "tru",
            "fals",
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            r#""\x""#,
            r#""\u12g4""#,
            "\"a\tb\"",
            "\"a\u{1}b\"",
            "1 2",
            "",
            "[1,]",
            "[1 2]",
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            r#"{"a":1"#,
            r#""abc"#,
            "[{}]",
            r#"{"a":[]}"#,
            "[[],[[]],{}]",
            r#"{"a":{"b":{}},"c":[{"d":[1,{"e":"f"}]}]}"#,
            "[1}",
            r#"{"a":1]"#,
            r#"[{"a":1},{"b":[2,3]}]"#,
            r#"[{"a":1},{"b":[2,3}]"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":1,"b"}"#,
            r#"{"a":[1,2],}"#,
            "[[1,2],]",
            "[,1]",
            "{,}",
            "[",
            "]",
        ]
        .iter()
        .map(|c| c.as_bytes().to_vec())
        .collect();
        cases.push(b"\xef\xbb\xbf{}".to_vec());
        cases.push(b"[\"ok\", \"\xff\"]".to_vec());
        cases.push(format!("{}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH)).into_bytes());
        cases.push(
            format!(
                "{}1{}",
                "[".repeat(MAX_DEPTH + 1),
                "]".repeat(MAX_DEPTH + 1)
            )
            .into_bytes(),
        );
        // Every position of a quote, a backslash and a control character in strings longer than
        // the eight bytes the scan takes at a time.
        for len in 0..24 {
            for at in 0..len {
                for special in ["\"", "\\", "\u{1f}", "\\n", "\u{7f}", "é"] {
                    let mut text = "a".repeat(len);
                    text.replace_range(at..=at, special);
                    cases.push(format!("[\"{text}\",\"{text}\"]").into_bytes());
                }
            }
        }
        for case in &cases {
            assert_eq!(
                skips(case),
                parse(case).is_ok(),
                "{}",
                String::from_utf8_lossy(case)
            );
        }
        // The one thing it does not check.
        let duplicate = br#"{"a":{"b":1,"b":2}}"#;
        assert!(skips(duplicate));
        assert!(parse(duplicate).is_err());
    }

    #[test]
    fn compact_output_reads_back() {
        let v = parse(br#"{"a":[1,{"b":"\n"}],"c":[],"d":{},"e":true}"#).unwrap();
        let compact = v.to_compact_string();
        assert_eq!(compact, r#"{"a":[1,{"b":"\n"}],"c":[],"d":{},"e":true}"#);
        assert_eq!(parse(compact.as_bytes()).unwrap(), v);
    }
}
